//! Feeds arbitrary bytes to the MPA request/reply parser and to both roles
//! of the negotiator (RFC 5044 §7.1, RFC 6581).
//!
//! Whatever parses and fits the send limit re-emits to a frame that parses
//! back to the same meaning. The negotiators get the bytes cut at a point
//! the input chooses; they must never consume more than the frame, and a
//! responder that receives a request must be able to accept it.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use rdmap::mpa::frame::{frame_len, Frame, FrameRepr};
use rdmap::mpa::negotiate::{Config, Event, Negotiator};

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    if let Ok(frame) = Frame::new_checked(rest) {
        if let Ok(repr) = FrameRepr::parse(&frame) {
            assert_eq!(frame_len(rest), Ok(Some(frame.total_len())));
            if let Ok(again) = repr.to_vec() {
                let back = FrameRepr::parse(&Frame::new_checked(&again[..]).unwrap()).unwrap();
                assert_eq!(back, repr);
            }
        }
    }
    let limit = frame_len(rest).ok().flatten();
    for responder in [false, true] {
        let mut n = if responder {
            Negotiator::responder(Config::default(), Duration::ZERO).unwrap()
        } else {
            Negotiator::initiator(Config::default(), &[], Duration::ZERO).unwrap()
        };
        let c = usize::from(cut).min(rest.len());
        let used =
            n.handle_input(&rest[..c], Duration::ZERO) + n.handle_input(&rest[c..], Duration::ZERO);
        if let Some(len) = limit {
            assert!(used <= len);
        } else {
            assert!(used <= 20);
        }
        while let Some(ev) = n.poll_event() {
            if ev == Event::RequestReceived {
                assert!(n.peer_request().is_some());
                n.accept(&[]).unwrap();
                assert!(n.poll_transmit().is_some());
            }
        }
    }
});
