//! Bindings to the system DPDK (22.11 LTS, found with pkg-config) and the safe
//! owned types the dataplane's workers are built from. This is the only crate
//! that links DPDK, and all of the project's DPDK `unsafe` lives here.
//!
//! - [`sys`]: raw bindgen output, plus the C shim's out-of-line copies of
//!   DPDK's `static inline` fast path (`rte_eth_rx_burst`, `rte_pktmbuf_*`,
//!   ring enqueue/dequeue, `rte_errno`).
//! - [`Eal`]: the environment, started once per process; every other DPDK
//!   object keeps it alive.
//! - [`Mempool`], [`Mbuf`] (freed on drop), [`MbufBurst`] (a fixed array of 32
//!   owned mbufs passed to bursts without allocating).
//! - [`Port`] and its per-core [`RxQueue`] / [`TxQueue`], used through
//!   `&mut self` by the one worker that owns them; [`PortCounters`] reads
//!   its device counters ([`PortStats`], [`XStat`]) from any other thread.
//! - [`ExtMem`], [`HugeMap`] and [`ExtBufPool`]: user memory registered with
//!   EAL and DMA-mapped, hugepage-backed memory, and the shared-info slots
//!   through which TX payload is attached to mbufs without a copy, with an
//!   observable release when the driver lets go of it.
//! - [`MbufRing`]: a multi-producer, multi-consumer ring of mbufs, for the
//!   software dispatcher between workers.
//! - [`toeplitz`]: the RSS hash in pure Rust (no EAL needed), to pick source
//!   ports whose replies land on the opener's queue.
//!
//! Lifetimes: DPDK frees nothing while a Rust handle can still reach it. A
//! mempool with mbufs still out is leaked rather than freed (except for
//! mbufs a closed port's driver abandoned, which nothing can reach), a port
//! closes when its last queue handle is gone, and EAL is cleaned up when
//! the last object holding it is dropped.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod eal;
mod error;
mod extmem;
mod mbuf;
mod mempool;
mod port;
mod ring;
pub mod sys;
pub mod toeplitz;

pub use eal::{lcore_id, tsc, Eal, ThreadRegistration};
pub use error::DpdkError;
pub use extmem::{
    iova_of, is_external_memory, phys_addr, port_bus_name, ExtBuf, ExtBufPool, ExtMem, HugeMap,
    HugeMapError,
};
pub use mbuf::{AttachError, CksumStatus, Drain, Mbuf, MbufBurst, Segments, BURST};
pub use mempool::Mempool;
pub use port::{
    offload, DevInfo, Port, PortConfig, PortCounters, PortSetup, PortStats, RssHashConf, RxQueue,
    TxQueue, XStat,
};
pub use ring::MbufRing;

/// The DPDK version the crate was built against, as pkg-config reports it.
pub const DPDK_VERSION: &str = env!("IWARP_DPDK_VERSION");
