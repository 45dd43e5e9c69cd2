//! An AF_PACKET `SOCK_RAW` socket bound to one interface: whole Ethernet
//! frames in and out, as a DPDK port would hand them to the engine, but
//! through the kernel and without DPDK.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// `sll_pkttype` of a frame this host sent: AF_PACKET taps both
/// directions, and our own transmissions must not be fed back in.
const PACKET_OUTGOING: u8 = 4;

/// Receive buffer asked for: a few milliseconds of a veth's line rate, so
/// that a burst from the kernel is not dropped while the driver is busy
/// building segments.
const RCVBUF_BYTES: libc::c_int = 8 << 20;

/// A raw socket on one interface.
#[derive(Debug)]
pub struct RawSocket {
    fd: OwnedFd,
}

fn eth_p_all_be() -> u16 {
    u16::try_from(libc::ETH_P_ALL).unwrap_or(3).to_be()
}

fn sockaddr_ll_len() -> libc::socklen_t {
    libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_ll>()).unwrap_or(20)
}

impl RawSocket {
    /// Opens a non-blocking socket that sees every frame on `ifname`.
    pub fn open(ifname: &str) -> io::Result<RawSocket> {
        let cname = std::ffi::CString::new(ifname)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in interface name"))?;
        // SAFETY: `cname` is a valid NUL-terminated string that outlives
        // the call.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::last_os_error());
        }
        // Protocol 0 at creation: the socket receives nothing until it is
        // bound, so no frame of another interface slips in before `bind`.
        // SAFETY: plain syscall with constant arguments.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a freshly created descriptor owned by no one
        // else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = u16::try_from(libc::AF_PACKET).unwrap_or(17);
        addr.sll_protocol = eth_p_all_be();
        addr.sll_ifindex = i32::try_from(ifindex)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "ifindex out of range"))?;
        // SAFETY: `addr` is a properly initialised sockaddr_ll and the
        // length passed is its size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                std::ptr::addr_of!(addr).cast::<libc::sockaddr>(),
                sockaddr_ll_len(),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let size = RCVBUF_BYTES;
        // SAFETY: the option value points at a live c_int of the given
        // size. SO_RCVBUFFORCE (root) lifts the rmem_max cap; failure just
        // leaves the default buffer.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                std::ptr::addr_of!(size).cast::<libc::c_void>(),
                libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).unwrap_or(4),
            )
        };
        Ok(RawSocket { fd })
    }

    /// Receives one frame that arrived on the interface into `buf`,
    /// skipping the frames this host sent. `Ok(None)` when nothing waits.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut from_len = sockaddr_ll_len();
            // SAFETY: `buf` is writable for `buf.len()` bytes, `from` and
            // `from_len` are live and describe a sockaddr_ll.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast::<libc::c_void>(),
                    buf.len(),
                    libc::MSG_TRUNC,
                    std::ptr::addr_of_mut!(from).cast::<libc::sockaddr>(),
                    &mut from_len,
                )
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                return match err.kind() {
                    io::ErrorKind::WouldBlock => Ok(None),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(err),
                };
            }
            if from.sll_pkttype == PACKET_OUTGOING {
                continue;
            }
            let n = usize::try_from(n).unwrap_or(0);
            if n > buf.len() {
                // MSG_TRUNC reports the real length: a frame larger than
                // the buffer (offloads left on?) would be half a frame.
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "received a {n}-byte frame, larger than the {}-byte buffer",
                        buf.len()
                    ),
                ));
            }
            return Ok(Some(n));
        }
    }

    /// Transmits one whole frame. `Ok(false)` when the kernel had no room
    /// for it (the frame is lost, as on a congested link).
    pub fn send(&self, frame: &[u8]) -> io::Result<bool> {
        loop {
            // SAFETY: `frame` is readable for `frame.len()` bytes; the
            // socket is bound, so no destination address is needed.
            let n = unsafe {
                libc::send(
                    self.fd.as_raw_fd(),
                    frame.as_ptr().cast::<libc::c_void>(),
                    frame.len(),
                    0,
                )
            };
            if n >= 0 {
                return Ok(true);
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(false),
                _ if err.raw_os_error() == Some(libc::ENOBUFS) => return Ok(false),
                _ => return Err(err),
            }
        }
    }

    /// Waits until a frame may be read or `timeout` passes.
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<()> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // Round up so that a sub-millisecond wait still sleeps rather than
        // spinning; poll's granularity is a millisecond.
        let ms = libc::c_int::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(1000);
        // SAFETY: `pfd` is one live pollfd and the count passed is 1.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
        Ok(())
    }
}

impl RawSocket {
    /// Frames dropped because the receive queue was full, since the last
    /// call (the kernel resets the counter when it is read).
    pub fn take_drops(&self) -> io::Result<u64> {
        let mut st = libc::tpacket_stats {
            tp_packets: 0,
            tp_drops: 0,
        };
        let mut len =
            libc::socklen_t::try_from(std::mem::size_of::<libc::tpacket_stats>()).unwrap_or(8);
        // SAFETY: `st` is a live tpacket_stats and `len` its size, as
        // PACKET_STATISTICS expects.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                std::ptr::addr_of_mut!(st).cast::<libc::c_void>(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(u64::from(st.tp_drops))
    }
}
