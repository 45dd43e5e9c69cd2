//! The connection table: connections keyed by 4-tuple with a flow hash,
//! listeners with a bounded backlog, SYN cookies when it overflows, and
//! RSTs for segments that match nothing (RFC 9293 §3.10.7.1).

use core::net::SocketAddrV4;

/// A connection's 4-tuple, from our side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FourTuple {
    pub local: SocketAddrV4,
    pub remote: SocketAddrV4,
}

/// Handle to a connection in a [`Stack`]. Stale handles (of a connection
/// since removed) are detected by a generation count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnId {
    pub index: u32,
    pub generation: u32,
}

/// Errors of table operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackError {
    /// A listener already exists on the port.
    PortInUse,
    /// No free local port for an active open.
    NoFreePort,
    /// The table holds its configured maximum of connections.
    TableFull,
    /// The handle names no live connection.
    NoSuchConnection,
}

/// The TCP stack of one endpoint (one worker, in the dataplane).
#[derive(Debug)]
pub struct Stack<B, R> {
    _marker: core::marker::PhantomData<(B, R)>,
}
