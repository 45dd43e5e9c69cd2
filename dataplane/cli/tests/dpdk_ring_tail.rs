//! Duration-mode bandwidth rounds between two dataplanes over a `net_ring`
//! pair, worker threads with the idle back-off on, as `iwarp demo` runs
//! them: once the client stops posting, every signalled work request it
//! posted must still complete (the tail of the flight has to get out and
//! be acknowledged while both workers go idle). Round after round, with
//! the links' and workers' counters printed when one stalls.

#[path = "../../tests/dpdk_common/mod.rs"]
mod dpdk_common;
#[path = "../../tests/runtime_common/mod.rs"]
mod runtime_common;

use std::net::SocketAddrV4;
use std::time::Duration;

use dataplane::api::Dataplane;
use dpdk_common::*;
use iwarp::runner::{connect_direct, RemoteBuf, Resources, Role, RunSpec, TestKind};
use runtime_common::*;

fn round(a: &Dataplane, b: &Dataplane, test: TestKind, port: u16) -> Result<u64, String> {
    let rx_depth = if test.is_send() { 512 } else { 1 };
    let client = RunSpec {
        test,
        role: Role::Client,
        size: 65536,
        iterations: 0,
        duration: Some(Duration::from_millis(300)),
        qps: 1,
        tx_depth: 128,
        rx_depth,
        outstanding_reads: 16,
        verify: true,
        all_sizes: false,
        busy_poll: false,
    };
    let server = RunSpec {
        role: Role::Server,
        ..client.clone()
    };
    let rc = Resources::new(a, &client).map_err(|e| e.to_string())?;
    let rs = Resources::new(b, &server).map_err(|e| e.to_string())?;
    let ord = if test.is_read() || test == TestKind::WriteBw {
        16
    } else {
        0
    };
    let r = (|| {
        connect_direct(a, &rc, b, &rs, SocketAddrV4::new(IP_B, port), ord)
            .map_err(|e| e.to_string())?;
        let to_server: Vec<RemoteBuf> = (0..client.qps).map(|i| rs.local_buf(i)).collect();
        let to_client: Vec<RemoteBuf> = (0..client.qps).map(|i| rc.local_buf(i)).collect();
        std::thread::scope(|scope| {
            let srv = scope.spawn(|| rs.run(b, &server, &to_client, &mut |_| {}));
            let c = rc.run(a, &client, &to_server, &mut |_| {});
            let s = srv.join().expect("server loop");
            let c = c.map_err(|e| format!("client: {e}"))?;
            s.map_err(|e| format!("server: {e}"))?;
            Ok(c.bytes)
        })
    })();
    if r.is_err() {
        // Before the queue pairs close: the stalled connection's figures.
        println!("a qps: {:?}", a.qp_snapshots());
        println!("b qps: {:?}", b.qp_snapshots());
    }
    rc.close(a);
    rs.close(b);
    r
}

#[test]
fn duration_rounds_complete_their_tail_over_a_ring_pair() {
    let (guard, eal) = start("dpdk-ring-tail", 256);
    {
        let (p, sa, sb) = ring_pair(&eal, 1500, 1);
        let mut port = 7000;
        for rep in 0..2 {
            for test in [TestKind::WriteBw, TestKind::ReadBw, TestKind::SendBw] {
                // IWARP_TAIL_PCAP=dir: a's frames of each round in a pcap
                // file there, to look at a stall on the wire.
                let pcap = std::env::var_os("IWARP_TAIL_PCAP")
                    .map(|d| std::path::PathBuf::from(d).join(format!("{rep}-{test:?}.pcap")));
                if let Some(f) = &pcap {
                    let opts = dataplane::capture::CaptureOptions {
                        snaplen: 128,
                        ..Default::default()
                    };
                    p.a.capture_start(f, &opts).expect("capture");
                }
                let r = round(&p.a, &p.b, test, port);
                if pcap.is_some() {
                    let _ = p.a.capture_stop();
                }
                port += 1;
                match r {
                    Ok(bytes) => {
                        println!("round {rep} {test:?}: {bytes} bytes");
                        assert!(bytes > 0, "{test:?} moved nothing");
                    }
                    Err(e) => {
                        println!("a workers: {:?}", p.a.stats());
                        println!("b workers: {:?}", p.b.stats());
                        println!("a link: {sa:?}");
                        println!("b link: {sb:?}");
                        panic!("round {rep} {test:?}: {e}");
                    }
                }
            }
        }
        drop(p);
    }
    drop(eal);
    assert_clean(&guard);
}
