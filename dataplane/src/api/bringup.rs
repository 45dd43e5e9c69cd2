//! Bring-up and teardown: opening a dataplane on a configured or given
//! link (the rings between workers, the workers themselves, on threads or
//! inline), and stopping it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_channel::Sender;
use crossbeam_queue::ArrayQueue;
use rdmap::verbs::{Device, DeviceLimits};
use tcp_offload::wire::EthernetAddress;

use crate::config::{Config, IdleConfig};
use crate::ctl::Error;
use crate::ctl::{Ctl, DispatchRings, IdleWake, SmallFrame, FORWARD_RING};
use crate::link::{Link, LinkQueue, MemLink, MemLinkConfig};
use crate::worker::{
    Clock, ManualTime, MrSyncLinks, Worker, WorkerCounters, WorkerSetup, WorkerStats,
};

use super::busy::Handover;
use super::control::{lock, Control};
use super::{Dataplane, DriveMode, CONTROL_TIMEOUT};

/// A worker, whatever its port: what inline mode, a worker thread and a
/// busy-polling application thread call.
pub(super) trait Pollable: Send {
    /// One iteration of its loop.
    fn poll(&mut self) -> bool;
    /// Closes its connections (the end of its life).
    fn shutdown(&mut self);
    /// Its loop on its own thread, until a shutdown (true) or until an
    /// application thread wants it (false; see `busy`).
    fn run_until(&mut self, idle: &IdleConfig, wanted: &AtomicUsize) -> bool;
    /// Prepares the calling thread to poll it (see `busy`).
    fn enter_thread(&self) -> Result<Option<Box<dyn core::any::Any>>, String>;
}

impl<Q: LinkQueue> Pollable for Worker<Q> {
    fn poll(&mut self) -> bool {
        Worker::poll(self)
    }

    fn shutdown(&mut self) {
        Worker::shutdown(self)
    }

    fn run_until(&mut self, idle: &IdleConfig, wanted: &AtomicUsize) -> bool {
        Worker::run_until(self, idle, wanted)
    }

    fn enter_thread(&self) -> Result<Option<Box<dyn core::any::Any>>, String> {
        Worker::enter_thread(self)
    }
}

#[derive(Debug)]
pub(super) struct WorkerHandle {
    pub(super) ctl: Sender<Ctl>,
    pub(super) counters: Arc<WorkerCounters>,
    pub(super) thread: Option<JoinHandle<()>>,
    /// Where its thread lends the worker to busy-polling threads.
    pub(super) handover: Arc<Handover>,
}

/// 16 bytes from the operating system's random source: the secret of
/// ISNs (RFC 6528) and SYN cookies, and where the ephemeral ports start.
pub(super) fn random_key() -> Result<[u8; 16], Error> {
    use std::io::Read;
    let mut key = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .map_err(|e| Error::Random(format!("/dev/urandom: {e}")))?;
    Ok(key)
}

impl Dataplane {
    /// Opens the dataplane `config` describes, with worker threads. Ports
    /// named `mem:NAME` are in-memory links joined by name within the
    /// process (two dataplanes naming the same link are connected); any
    /// other device string is a DPDK device (a vdev such as `net_ring0` or
    /// `net_af_packet0,iface=veth0`, or a PCI address) on the process's EAL,
    /// started from `eal.args` by the first dataplane that needs it (see
    /// [`crate::dpdk_link::eal_args_for`]).
    pub fn open(config: &Config) -> Result<Dataplane, Error> {
        config.validate()?;
        let port = &config.ports[0];
        let Some(name) = port.device.strip_prefix("mem:") else {
            let args = crate::dpdk_link::eal_args_for(&config.eal.args, &port.device);
            let eal =
                crate::dpdk_link::start_eal(&args).map_err(|e| Error::Device(e.to_string()))?;
            let opts = crate::dpdk_link::DpdkLinkOptions {
                queues: config.workers.count as u16,
                mtu: port.mtu,
                mac: port.mac.map(|m| m.0),
                ..Default::default()
            };
            let link = crate::dpdk_link::DpdkLink::open(&eal, &port.device, &opts)
                .map_err(|e| Error::Device(e.to_string()))?;
            let counters = link.counters();
            let mut dp = Dataplane::open_with_link(config, link, DriveMode::Threads)?;
            dp.link_counters = counters;
            return Ok(dp);
        };
        let mac = port
            .mac
            .map_or(EthernetAddress([2, 0, 0, 0, 0, 1]), |m| m.0);
        let link_cfg = MemLinkConfig {
            queues: config.workers.count as u16,
            mtu: port.mtu,
            ..MemLinkConfig::default()
        };
        let link = MemLink::named(name, &link_cfg, mac);
        let counters = link.counters();
        let mut dp = Dataplane::open_with_link(config, link, DriveMode::Threads)?;
        dp.link_counters = counters;
        Ok(dp)
    }

    /// Opens a dataplane on `link` (its first port), its workers run as
    /// `mode` says.
    pub fn open_with_link<L: Link>(
        config: &Config,
        link: L,
        mode: DriveMode,
    ) -> Result<Dataplane, Error> {
        let key = random_key()?;
        Dataplane::open_at(config, link, mode, Clock::new(), key)
    }

    /// A dataplane for a simulation: inline workers ([`DriveMode::Inline`])
    /// whose time is `time`, set by the program, and whose ISN and SYN
    /// cookie secret is `secret`, so that a run is a function of its
    /// inputs. Several such dataplanes run on one thread in virtual time:
    /// the program moves `time` and calls [`Dataplane::poll`] on each (the
    /// waits of [`Dataplane::wait_event`] and of the control calls still
    /// count real time, so a simulation polls events instead).
    pub fn open_simulated<L: Link>(
        config: &Config,
        link: L,
        time: &ManualTime,
        secret: [u8; 16],
    ) -> Result<Dataplane, Error> {
        Dataplane::open_at(config, link, DriveMode::Inline, Clock::manual(time), secret)
    }

    fn open_at<L: Link>(
        config: &Config,
        mut link: L,
        mode: DriveMode,
        clock: Clock,
        key: [u8; 16],
    ) -> Result<Dataplane, Error> {
        config.validate()?;
        let caps = link.caps().clone();
        let dev_port = link.device();
        let count = config.workers.count;
        if usize::from(caps.queues) < count {
            return Err(Error::InvalidArgument(
                "the port has fewer queues than workers",
            ));
        }
        let port = &config.ports[0];
        let (out_tx, out_rx) = crossbeam_channel::unbounded();
        let forward: Vec<Arc<ArrayQueue<SmallFrame>>> = (0..count)
            .map(|_| Arc::new(ArrayQueue::new(FORWARD_RING)))
            .collect();
        let dispatch = Arc::new(DispatchRings::new(count));
        let wake = IdleWake::set(count, config.tcp.max_connections);
        let mut mr_sync = MrSyncLinks::mesh(count).into_iter();
        let mut workers = Vec::with_capacity(count);
        let mut inline: Vec<Box<dyn Pollable>> = Vec::new();
        for i in 0..count {
            let queue = link
                .take_queue(i as u16)
                .ok_or(Error::InvalidArgument("port queue unavailable"))?;
            let (ctl_tx, ctl_rx) = crossbeam_channel::unbounded();
            let counters = Arc::new(WorkerCounters::default());
            let handover = Handover::new();
            let setup = WorkerSetup {
                index: i,
                queue,
                caps: caps.clone(),
                config: config.clone(),
                key,
                ctl: ctl_rx,
                out: out_tx.clone(),
                counters: counters.clone(),
                mr_sync: mr_sync
                    .next()
                    .ok_or(Error::InvalidArgument("worker count"))?,
                forward_in: forward[i].clone(),
                forward_out: forward
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != i)
                    .map(|(_, q)| q.clone())
                    .collect(),
                dispatch: dispatch.clone(),
                wake: wake.clone(),
            };
            let thread = match mode {
                DriveMode::Inline => {
                    let mut w = Worker::new(setup);
                    w.set_clock(clock.clone());
                    inline.push(Box::new(w));
                    None
                }
                DriveMode::Threads => {
                    let core = config.workers.cores.get(i).copied();
                    let idle = config.idle;
                    let (ready_tx, ready_rx) = crossbeam_channel::bounded(1);
                    let clock = clock.clone();
                    let lend = handover.clone();
                    let handle = std::thread::Builder::new()
                        .name(format!("iwarp-worker-{i}"))
                        .spawn(move || {
                            if let Some(id) = core {
                                if !core_affinity::set_for_current(core_affinity::CoreId { id }) {
                                    let _ = ready_tx.send(Err(format!("cannot pin to core {id}")));
                                    return;
                                }
                            }
                            let _lcore = match setup.queue.on_worker_thread() {
                                Ok(guard) => guard,
                                Err(m) => {
                                    let _ = ready_tx.send(Err(m));
                                    return;
                                }
                            };
                            setup.counters.set_lcore(dpdk_bindings::lcore_id());
                            setup.counters.set_thread_id(crate::sys::thread_id());
                            let mut w = Worker::new(setup);
                            w.set_clock(clock);
                            let _ = ready_tx.send(Ok(()));
                            // `drive` consumes the worker (and its queue)
                            // before the thread's lcore registration goes.
                            lend.drive(Box::new(w), &idle);
                        })
                        .map_err(|e| Error::Thread(e.to_string()))?;
                    match ready_rx.recv_timeout(CONTROL_TIMEOUT) {
                        Ok(Ok(())) => {}
                        Ok(Err(m)) => return Err(Error::Thread(m)),
                        Err(_) => return Err(Error::Thread("worker did not start".into())),
                    }
                    Some(handle)
                }
            };
            workers.push(WorkerHandle {
                ctl: ctl_tx,
                counters,
                thread,
                handover,
            });
        }
        let l = &config.limits;
        let device = Device::new(DeviceLimits {
            max_mr: l.max_mr,
            max_qp: 1,
            max_cq: 1,
            ..DeviceLimits::default()
        });
        Ok(Dataplane {
            workers,
            wake,
            inline: (mode == DriveMode::Inline).then(|| Mutex::new(inline)),
            events: out_rx,
            control: Mutex::new(Control {
                device,
                pds: Vec::new(),
                pd_release: Vec::new(),
                next_qpn: 1,
                next_cq: 1,
                deregs: HashMap::new(),
                events: VecDeque::new(),
                listening: Vec::new(),
            }),
            ip: port.ip,
            mac: port.mac.map_or(caps.mac, |m| m.0),
            limits: *l,
            max_connections: config.tcp.max_connections,
            next_connect: AtomicUsize::new(0),
            qps: Mutex::new(super::registry::QpRegistry::default()),
            busy_threads: Mutex::new(Vec::new()),
            link_counters: None,
            dev_port,
            capture: crate::capture::Capture::default(),
        })
    }

    /// Stops the dataplane as dropping it does, and returns the workers'
    /// final counters: connections still up are closed with a FIN and
    /// their FIN exchanges run to the end for at most
    /// `tcp.close_linger_ms` before what is still open is reset
    /// ([`WorkerStats::shutdown_resets`] counts those).
    pub fn stop(mut self) -> Vec<WorkerStats> {
        self.stop_workers();
        self.stats()
    }

    /// Asks every worker to stop and waits until each has closed its
    /// connections (see [`Dataplane::stop`]); a second call finds nothing
    /// left to do.
    pub(super) fn stop_workers(&mut self) {
        for (i, w) in self.workers.iter().enumerate() {
            let _ = w.ctl.send(Ctl::Shutdown);
            self.wake_worker(i);
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
        if let Some(inline) = &self.inline {
            for w in lock(inline).iter_mut() {
                w.shutdown();
            }
        }
    }
}

impl Drop for Dataplane {
    fn drop(&mut self) {
        self.stop_workers();
    }
}
