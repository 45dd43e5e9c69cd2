//! The kernel's side of a transfer: a thread that moves itself into the
//! test's network namespace with `setns(2)` (a network namespace belongs to
//! a thread, not to the process) and runs std's blocking `TcpListener` /
//! `TcpStream` there. It sends a deterministic byte pattern and verifies
//! the one it receives, concurrently, then closes; its report comes back
//! through the join handle.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The byte at `offset` of the stream seeded by `seed`. A multiplicative
/// hash rather than a counter, so that bytes landing at the wrong offset
/// (a misplaced segment, a record resent with other boundaries) differ from
/// the expected ones whatever the offset.
pub fn pattern_byte(seed: u64, offset: u64) -> u8 {
    let x = (offset ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x.to_be_bytes()[0]
}

/// Fills `dst` with the pattern from `offset` on.
pub fn fill_pattern(seed: u64, offset: u64, dst: &mut [u8]) {
    for (i, b) in dst.iter_mut().enumerate() {
        *b = pattern_byte(seed, offset + i as u64);
    }
}

/// Checks `got` against the pattern from `offset` on; on mismatch, the
/// stream offset of the first wrong byte.
pub fn check_pattern(seed: u64, offset: u64, got: &[u8]) -> Result<(), String> {
    for (i, &b) in got.iter().enumerate() {
        let want = pattern_byte(seed, offset + i as u64);
        if b != want {
            return Err(format!(
                "byte {} of the stream is {b:#04x}, expected {want:#04x}",
                offset + i as u64
            ));
        }
    }
    Ok(())
}

/// What the kernel side does.
#[derive(Debug, Clone, Copy)]
pub enum Role {
    /// Listen on this address and accept one connection.
    Listen(SocketAddrV4),
    /// Connect to this address.
    Connect(SocketAddrV4),
}

/// One transfer, as seen from the kernel side.
#[derive(Debug, Clone)]
pub struct PeerSpec {
    pub ns_path: String,
    pub role: Role,
    /// Bytes sent, and bytes expected before EOF.
    pub bytes: u64,
    pub send_seed: u64,
    pub recv_seed: u64,
    /// Socket read and write timeout: a stalled transfer fails rather
    /// than hanging the test.
    pub timeout: Duration,
}

/// What the kernel side saw.
#[derive(Debug, Clone)]
pub struct PeerReport {
    pub sent: u64,
    pub received: u64,
    pub elapsed: Duration,
}

fn enter_netns(path: &str) -> Result<(), String> {
    let file = File::open(path).map_err(|e| format!("opening {path}: {e}"))?;
    // SAFETY: the descriptor is valid for the call (`file` lives past it);
    // setns with CLONE_NEWNET changes only the calling thread's network
    // namespace, which is what this thread is for.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(format!(
            "setns({path}): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Starts the kernel side. For [`Role::Listen`], returns once the socket
/// listens, so that our engine may connect right away.
pub fn spawn(spec: PeerSpec) -> Result<JoinHandle<Result<PeerReport, String>>, String> {
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    let handle = std::thread::Builder::new()
        .name("kernel-peer".into())
        .spawn(move || {
            let stream = match setup(&spec, &ready_tx) {
                Ok(s) => s,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.clone()));
                    return Err(e);
                }
            };
            transfer(&spec, stream)
        })
        .map_err(|e| format!("spawning the peer thread: {e}"))?;
    match ready_rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(e)) => Err(e),
        Err(e) => Err(format!("peer thread did not get ready: {e}")),
    }
}

fn setup(spec: &PeerSpec, ready: &mpsc::Sender<Result<(), String>>) -> Result<TcpStream, String> {
    enter_netns(&spec.ns_path)?;
    match spec.role {
        Role::Listen(addr) => {
            let listener = TcpListener::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
            let _ = ready.send(Ok(()));
            // accept() has no timeout in std: poll the non-blocking
            // listener instead, so that a connection that never comes
            // fails the peer rather than hanging it.
            listener
                .set_nonblocking(true)
                .map_err(|e| format!("set_nonblocking: {e}"))?;
            let deadline = Instant::now() + spec.timeout;
            loop {
                match listener.accept() {
                    Ok((s, _)) => {
                        s.set_nonblocking(false)
                            .map_err(|e| format!("set_nonblocking: {e}"))?;
                        return Ok(s);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() > deadline {
                            return Err(format!(
                                "no connection to {addr} within {:?}",
                                spec.timeout
                            ));
                        }
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => return Err(format!("accept on {addr}: {e}")),
                }
            }
        }
        Role::Connect(addr) => {
            let _ = ready.send(Ok(()));
            TcpStream::connect_timeout(&addr.into(), spec.timeout)
                .map_err(|e| format!("connect to {addr}: {e}"))
        }
    }
}

fn transfer(spec: &PeerSpec, stream: TcpStream) -> Result<PeerReport, String> {
    let start = Instant::now();
    stream
        .set_read_timeout(Some(spec.timeout))
        .and_then(|()| stream.set_write_timeout(Some(spec.timeout)))
        .map_err(|e| format!("socket timeouts: {e}"))?;
    let mut writer = stream.try_clone().map_err(|e| format!("try_clone: {e}"))?;
    let (bytes, send_seed) = (spec.bytes, spec.send_seed);
    let send = std::thread::Builder::new()
        .name("kernel-peer-tx".into())
        .spawn(move || -> Result<u64, String> {
            let mut chunk = vec![0u8; 64 * 1024];
            let mut sent = 0u64;
            while sent < bytes {
                let n = usize::try_from((bytes - sent).min(chunk.len() as u64)).unwrap_or(0);
                fill_pattern(send_seed, sent, &mut chunk[..n]);
                writer
                    .write_all(&chunk[..n])
                    .map_err(|e| format!("kernel write after {sent} bytes: {e}"))?;
                sent += n as u64;
            }
            writer
                .shutdown(Shutdown::Write)
                .map_err(|e| format!("kernel shutdown(SHUT_WR): {e}"))?;
            Ok(sent)
        })
        .map_err(|e| format!("spawning the sender: {e}"))?;

    let mut reader = stream;
    let mut buf = vec![0u8; 64 * 1024];
    let mut received = 0u64;
    let rx_result = loop {
        match reader.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => {
                if let Err(e) = check_pattern(spec.recv_seed, received, &buf[..n]) {
                    break Err(format!("kernel received corrupt data: {e}"));
                }
                received += n as u64;
                if received > spec.bytes {
                    break Err(format!(
                        "kernel received {received} bytes, more than {}",
                        spec.bytes
                    ));
                }
            }
            Err(e) => break Err(format!("kernel read after {received} bytes: {e}")),
        }
    };
    let sent = send
        .join()
        .map_err(|_| "kernel sender panicked".to_string())?;
    rx_result?;
    let sent = sent?;
    if received != spec.bytes {
        return Err(format!(
            "kernel saw EOF after {received} of {} bytes",
            spec.bytes
        ));
    }
    Ok(PeerReport {
        sent,
        received,
        elapsed: start.elapsed(),
    })
}

/// Runs `f` on a thread of its own inside the namespace at `ns_path`.
pub fn spawn_in_netns<T, F>(ns_path: &str, f: F) -> JoinHandle<Result<T, String>>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, String> + Send + 'static,
{
    let path = ns_path.to_string();
    std::thread::spawn(move || {
        enter_netns(&path)?;
        f()
    })
}
