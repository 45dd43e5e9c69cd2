//! The error every side of the dataplane reports: the application API
//! returns it, and a worker answers a control message with it. It sits
//! in the control layer so that the API and the workers share it without
//! knowing each other.

use crate::config::ConfigError;
use crate::memory::MemoryError;
use rdmap::verbs::VerbsError;
use tcp_offload::tcp::StackError;

/// Why an API call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The configuration was refused.
    Config(ConfigError),
    /// Something this build of the runtime cannot do yet.
    Unsupported(&'static str),
    /// A verbs object rule (limits, STags, protection domains).
    Verbs(VerbsError),
    /// A region or an access outside it.
    Memory(MemoryError),
    /// The TCP stack refused (port in use, no free port, table full).
    Stack(StackError),
    /// An argument out of range.
    InvalidArgument(&'static str),
    /// The connection request is no longer pending.
    NoSuchRequest,
    /// The queue pair is already bound to a connection.
    QpInUse,
    /// A worker thread has stopped.
    WorkerGone,
    /// A control call from a thread that drives the workers itself
    /// ([`BusyPoll`](crate::api::BusyPoll)): no worker thread would answer
    /// it while it waits.
    BusyPolling,
    /// A worker did not answer within [`CONTROL_TIMEOUT`](crate::api::CONTROL_TIMEOUT).
    Timeout,
    /// A worker thread could not be started or pinned.
    Thread(String),
    /// The DPDK device (or EAL) could not be set up.
    Device(String),
    /// A packet capture could not start or finish.
    Capture(crate::capture::CaptureError),
    /// The operating system's random source (for the ISN secret) could
    /// not be read.
    Random(String),
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Config(e) => write!(f, "{e}"),
            Error::Unsupported(what) => write!(f, "not supported yet: {what}"),
            Error::Verbs(e) => write!(f, "the verbs call was refused: {e}"),
            Error::Memory(e) => write!(f, "memory: {e}"),
            Error::Stack(e) => write!(f, "the TCP stack refused: {e}"),
            Error::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            Error::NoSuchRequest => f.write_str("no such pending connection request"),
            Error::QpInUse => f.write_str("queue pair already in use"),
            Error::WorkerGone => f.write_str("a worker has stopped"),
            Error::BusyPolling => f.write_str(
                "this thread drives the workers (busy polling): end that before a control call",
            ),
            Error::Timeout => f.write_str("a worker did not answer in time"),
            Error::Thread(m) => write!(f, "worker thread: {m}"),
            Error::Device(m) => write!(f, "device: {m}"),
            Error::Capture(e) => write!(f, "{e}"),
            Error::Random(m) => write!(f, "the operating system's random source: {m}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Error {
        Error::Config(e)
    }
}

impl From<VerbsError> for Error {
    fn from(e: VerbsError) -> Error {
        Error::Verbs(e)
    }
}

impl From<MemoryError> for Error {
    fn from(e: MemoryError) -> Error {
        Error::Memory(e)
    }
}

impl From<StackError> for Error {
    fn from(e: StackError) -> Error {
        Error::Stack(e)
    }
}
