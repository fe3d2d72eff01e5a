//! Starting the workers: one per queue index across the configured interfaces, each on
//! its own thread, pinned to its configured core, owning its queue group (the sockets of that
//! queue on every interface, sharing one UMEM), its pipeline (flow table and counters) and its
//! ends of the handoff mesh.
//!
//! ```text
//!   interfaces veth-c queues [0, 1], veth-b queues [0, 1]
//!     worker "veth-c+veth-b/0": veth-c/0 + veth-b/0, pipeline core 0 of 2
//!     worker "veth-c+veth-b/1": veth-c/1 + veth-b/1, pipeline core 1 of 2
//!     handoff rings 0 -> 1 and 1 -> 0
//! ```
//!
//! A frame whose egress is another interface of the group (two-arm nat: in on the client
//! interface, out on the backend one) leaves on that interface's socket without a copy. A nat
//! frame whose flow another worker owns is copied to it through a bounded ring.
//!
//! Order: attach the steering program to every interface (replacing a stale one), open each
//! queue group and register each of its sockets in its interface's program at that queue,
//! then fill the programs' maps from the current table, so no packet is redirected to a
//! queue without a socket.
//!
//! The same loop ([`run_worker`]) drives either port driver, chosen by the interfaces'
//! `driver`: AF_XDP queue groups with their steering programs, or DPDK queue groups (one
//! mempool per worker, ports opened by [`crate::dpdk::open`] before the table's ports are
//! read; no XDP program: the DPDK group gives the kernel its traffic through each port's
//! TAP). DPDK ports start once every group has set up its queues, before any worker polls.
//!
//! A queue listed on some interfaces only makes a group without the others: a frame that
//! group's worker must send on a missing interface is dropped and counted (`other_port`), so
//! two-arm configurations should list the same queues on both arms (logged at start). A
//! worker is pinned to the core configured for its queue on the first interface that lists
//! the queue with a core.
//!
//! The workers take the few handles they use ([`Handles`]: the table's swap, their
//! statistics slots, the capture hub) and give back what they show ([`Views`]: the steering
//! counters, the flow sync's and the DPDK ports' readers); `run` builds the one from its
//! shared state and puts the other into it, so this module does not know the admin API's
//! whole view.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use anyhow::Context;
use arc_swap::ArcSwap;
use strait_config::model::{Config, Driver, Mode};
use strait_dataplane::capture::Hub;
use strait_dataplane::pipeline::Pipeline;
use strait_dataplane::table::ServiceTable;
use strait_dataplane::xsk::{
    run_worker, AttachPolicy, GroupConfig, Handoff, HandoffConfig, MonotonicClock, PortConfig,
    PortDriver, QueueGroup, SteerProgram, SteerStats, WorkerStats,
};
use tracing::{info, warn};

use crate::cores::CoreStats;
use crate::sync::{SyncStats, SyncThread};
use strait_dataplane::sync::SYNC_SLOTS;

/// What the workers read of the gateway's state, and nothing more.
#[derive(Debug, Clone)]
pub struct Handles {
    /// The table the workers forward with; the control loop swaps it, each worker loads it
    /// once a batch.
    pub table: Arc<ArcSwap<ServiceTable>>,
    /// One statistics slot per worker, from [`slots`], in start order.
    pub cores: Vec<Arc<CoreStats>>,
    /// The capture hub: each worker takes its tap, and its clock counts from the hub's
    /// origin so that capture records and the workers' times agree.
    pub capture: Arc<Hub>,
}

/// What the started workers show, for the admin API to read on each scrape.
#[derive(Debug, Default)]
pub struct Views {
    /// A reader of each interface's XDP steering counters, in configuration order (AF_XDP
    /// only).
    pub xdp: Vec<SteerStats>,
    /// The flow sync thread's counters, when `[gateway.sync]` is configured.
    pub sync: Option<Arc<SyncStats>>,
    /// A reader of the DPDK ports' counters, when DPDK ports run.
    pub dpdk: Option<crate::dpdk::StatsReader>,
}

/// The running workers and the steering programs they depend on.
pub struct Workers {
    stop: Arc<AtomicBool>,
    threads: Vec<(String, JoinHandle<anyhow::Result<WorkerStats>>)>,
    /// One steering program per interface; their maps must follow every table.
    pub progs: Vec<SteerProgram>,
    /// Flow sync with the peer gateways, if configured.
    sync: Option<SyncThread>,
    /// The DPDK ports, closed after the workers stopped.
    dpdk: Option<crate::dpdk::Ports>,
}

impl Workers {
    /// With flow sync, waits until every peer gateway's flow dump has ended, at most
    /// `timeout` (see [`SyncThread::wait_dumps`]): `Some((dumps ended, peers))`; `None`
    /// without flow sync.
    pub fn wait_for_peers(&self, timeout: std::time::Duration) -> Option<(usize, usize)> {
        self.sync
            .as_ref()
            .map(|s| (s.wait_dumps(timeout), s.peers()))
    }
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("threads", &self.threads.len())
            .finish_non_exhaustive()
    }
}

/// One worker to start: a queue index and the interfaces that serve it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Plan {
    queue: u32,
    /// Indices into `gateway.interfaces` (which are also the table ports), in config order.
    members: Vec<usize>,
    /// CPU to pin to.
    core: Option<usize>,
    /// `iface+iface/queue`.
    name: String,
}

/// The workers `cfg` asks for: one per distinct queue index, in order of first appearance
/// (interfaces in config order, each one's queues in order).
fn plan(cfg: &Config) -> Vec<Plan> {
    let ifaces = &cfg.gateway.interfaces;
    let mut queues: Vec<u32> = Vec::new();
    for q in ifaces.iter().flat_map(|i| i.queues.iter().copied()) {
        if !queues.contains(&q) {
            queues.push(q);
        }
    }
    queues
        .into_iter()
        .map(|queue| {
            let members: Vec<usize> = (0..ifaces.len())
                .filter(|&i| ifaces[i].queues.contains(&queue))
                .collect();
            let core = members.iter().find_map(|&i| {
                let at = ifaces[i].queues.iter().position(|&q| q == queue)?;
                ifaces[i].cores.as_ref()?.get(at).copied()
            });
            let names: Vec<&str> = members.iter().map(|&i| ifaces[i].name.as_str()).collect();
            Plan {
                queue,
                name: format!("{}/{queue}", names.join("+")),
                members,
                core,
            }
        })
        .collect()
}

/// The statistics slots of the workers `cfg` asks for, in start order, named
/// `iface+iface/queue`.
pub fn slots(cfg: &Config) -> Vec<Arc<CoreStats>> {
    plan(cfg)
        .into_iter()
        .map(|p| {
            Arc::new(CoreStats {
                name: p.name,
                ..Default::default()
            })
        })
        .collect()
}

/// Attaches the programs and starts a worker per queue group of `cfg`; with DPDK
/// interfaces, sets up a queue group per worker on `dpdk` (from [`crate::dpdk::open`]) and
/// starts its ports. The workers, and the views of them the admin API reads.
///
/// # Errors
/// When a program cannot be attached or a socket cannot be opened (no AF_XDP, no such queue,
/// no shared UMEM, not enough privileges), or a DPDK queue or port refuses, with the
/// interface and queue named; DPDK interfaces without their ports. Workers started before
/// the failure are stopped again.
pub fn start(
    cfg: &Config,
    handles: &Handles,
    dpdk: Option<crate::dpdk::Ports>,
) -> anyhow::Result<(Workers, Views)> {
    let g = &cfg.gateway;
    let plans = plan(cfg);
    let total = plans.len();
    anyhow::ensure!(
        handles.cores.len() == total,
        "{} statistics slots for {total} workers (slots() and start() disagree)",
        handles.cores.len()
    );
    for p in plans
        .iter()
        .filter(|p| p.members.len() < g.interfaces.len())
    {
        let missing: Vec<&str> = (0..g.interfaces.len())
            .filter(|i| !p.members.contains(i))
            .map(|i| g.interfaces[i].name.as_str())
            .collect();
        warn!(worker = %p.name, ?missing, "queue {} is not served on every interface: frames this worker must send on the others are dropped (other_port); list the same queues on every interface", p.queue);
    }
    let table = handles.table.load_full();
    let mtu = table.ports.iter().map(|p| p.mtu).max().unwrap_or(1500);
    let handoff_cfg = HandoffConfig::for_mtu(mtu);
    if total > 1 && cfg.services.iter().any(|s| s.mode == Mode::Nat) {
        info!(
            workers = total,
            slots = handoff_cfg.slots,
            slot_bytes = handoff_cfg.slot_bytes,
            "nat flows are owned per worker; frames landing on another worker are handed over"
        );
    }

    let mut workers = Workers {
        stop: Arc::new(AtomicBool::new(false)),
        threads: Vec::new(),
        progs: Vec::new(),
        sync: None,
        dpdk,
    };
    let mut views = Views::default();
    match spawn_all(cfg, handles, &plans, &handoff_cfg, &mut workers, &mut views) {
        Ok(()) => Ok((workers, views)),
        Err(e) => {
            workers.stop();
            Err(e)
        }
    }
}

/// What every worker gets whatever its driver: its handoff ends, its pipeline, its
/// statistics slot.
struct Parts {
    handoff: Handoff,
    pipe: Pipeline,
    slot: Arc<CoreStats>,
}

/// The body of [`start`]: fills `w` and `views` as it goes, so the caller can stop what was
/// started.
fn spawn_all(
    cfg: &Config,
    handles: &Handles,
    plans: &[Plan],
    handoff_cfg: &HandoffConfig,
    w: &mut Workers,
    views: &mut Views,
) -> anyhow::Result<()> {
    let g = &cfg.gateway;
    let dpdk = g
        .interfaces
        .iter()
        .any(|i| matches!(i.driver, Driver::Dpdk { .. }));
    if !dpdk {
        attach_programs(cfg, w, views)?;
    }
    let total = plans.len();
    let mut ends = Handoff::mesh(total, handoff_cfg).into_iter();
    let mut sync_ends = match &g.sync {
        Some(s) => {
            let (workers, thread) = strait_dataplane::sync::mesh(total, SYNC_SLOTS);
            let stats = Arc::new(SyncStats::default());
            let t = SyncThread::spawn(s, thread, Arc::clone(&stats))
                .with_context(|| format!("starting flow sync on {}", s.listen))?;
            views.sync = Some(stats);
            w.sync = Some(t);
            Some(workers.into_iter())
        }
        None => None,
    };
    let mut parts = Vec::with_capacity(total);
    for index in 0..total {
        let handoff = ends
            .next()
            .context("the handoff mesh has an end per worker")?;
        let slot = Arc::clone(&handles.cores[index]);
        let pipe = Pipeline::new(
            index as u16,
            total as u16,
            g.flow_capacity_per_core as usize,
            handles.table.load().timeouts,
            g.new_flows_per_second_per_core,
        );
        let pipe = pipe.with_capture(handles.capture.tap(index as u16));
        let pipe = match sync_ends.as_mut().and_then(Iterator::next) {
            Some(ends) => pipe.with_sync(ends),
            None => pipe,
        };
        let (desk, window) = strait_dataplane::explain::desk();
        let pipe = pipe.with_explain(desk);
        *slot.explain.lock().unwrap_or_else(PoisonError::into_inner) = Some(window);
        parts.push(Parts {
            handoff,
            pipe,
            slot,
        });
    }
    if dpdk {
        return spawn_dpdk(handles, plans, parts, w, views);
    }
    for (p, parts) in plans.iter().zip(parts) {
        let members = p
            .members
            .iter()
            .map(|&i| PortConfig::new(&g.interfaces[i].name, i as u8))
            .collect();
        let group = QueueGroup::open(&GroupConfig::new(p.queue, members))
            .with_context(|| format!("opening the AF_XDP sockets of {}", p.name))?;
        match group.zero_copy_refused() {
            Some(e) => {
                info!(worker = %p.name, "AF_XDP bound in {} mode (zero-copy refused: {e})", group.bind_mode())
            }
            None => info!(worker = %p.name, "AF_XDP bound in {} mode", group.bind_mode()),
        }
        for (port, &i) in group.ports().iter().zip(&p.members) {
            w.progs[i]
                .register(p.queue, port)
                .with_context(|| format!("registering {} queue {}", port.iface(), p.queue))?;
        }
        spawn(w, handles, p, parts, "xsk", move || group)?;
    }
    let table = handles.table.load();
    for (prog, iface) in w.progs.iter_mut().zip(&g.interfaces) {
        let sync = prog.update_maps(&table)?;
        info!(iface = %iface.name, added = sync.added, "steering maps filled");
    }
    Ok(())
}

/// Attaches the steering program to every interface, and keeps a reader of its counters
/// for the admin API.
fn attach_programs(cfg: &Config, w: &mut Workers, views: &mut Views) -> anyhow::Result<()> {
    for iface in &cfg.gateway.interfaces {
        let prog = SteerProgram::attach(&iface.name, AttachPolicy::default())
            .with_context(|| format!("attaching the XDP steering program to {}", iface.name))?;
        prog.serve_vlans(&iface.vlans)
            .with_context(|| format!("setting the VLANs {} serves", iface.name))?;
        let reader = prog
            .counters_reader()
            .with_context(|| format!("reading the steering counters of {}", iface.name))?;
        views.xdp.push(reader);
        info!(iface = %iface.name, mode = ?prog.mode(), replaced = ?prog.replaced_programs(), "XDP program attached");
        w.progs.push(prog);
    }
    Ok(())
}

/// Sets up a DPDK queue group per plan, starts the ports, then a worker per group.
#[cfg(feature = "dpdk")]
fn spawn_dpdk(
    handles: &Handles,
    plans: &[Plan],
    parts: Vec<Parts>,
    w: &mut Workers,
    views: &mut Views,
) -> anyhow::Result<()> {
    let dpdk = w
        .dpdk
        .as_mut()
        .context("DPDK interfaces, but no DPDK ports were opened")?;
    let mut groups = Vec::with_capacity(plans.len());
    for p in plans {
        let members: Vec<u8> = p.members.iter().map(|&i| i as u8).collect();
        let group = dpdk
            .group(p.queue, &members)
            .with_context(|| format!("setting up the DPDK queues of {}", p.name))?;
        groups.push(group);
    }
    dpdk.start().context("starting the DPDK ports")?;
    views.dpdk = Some(dpdk.stats_reader());
    for ((p, parts), group) in plans.iter().zip(parts).zip(groups) {
        info!(worker = %p.name, "DPDK queue group ready");
        spawn(w, handles, p, parts, "dpdk", move || {
            let reg = strait_dpdk::ThreadRegistration::new();
            if !reg.registered() {
                warn!("worker not registered with EAL (no free lcore id): no mempool cache");
            }
            (group, reg)
        })?;
    }
    Ok(())
}

#[cfg(not(feature = "dpdk"))]
fn spawn_dpdk(
    _handles: &Handles,
    _plans: &[Plan],
    _parts: Vec<Parts>,
    _w: &mut Workers,
    _views: &mut Views,
) -> anyhow::Result<()> {
    anyhow::bail!("DPDK interfaces in a build without the `dpdk` feature")
}

/// What a worker thread runs on: a port driver, and whatever must live as long as it on
/// that thread (a DPDK worker's EAL registration).
trait OnThread {
    type Driver: PortDriver;
    fn driver(&mut self) -> &mut Self::Driver;
}

impl OnThread for QueueGroup {
    type Driver = QueueGroup;
    fn driver(&mut self) -> &mut QueueGroup {
        self
    }
}

#[cfg(feature = "dpdk")]
impl OnThread for (strait_dpdk::DpdkGroup, strait_dpdk::ThreadRegistration) {
    type Driver = strait_dpdk::DpdkGroup;
    fn driver(&mut self) -> &mut strait_dpdk::DpdkGroup {
        &mut self.0
    }
}

/// Spawns the worker of plan `p` on a thread named `{kind} {name}`; `make` runs first on
/// that thread and gives the driver.
fn spawn<T, M>(
    w: &mut Workers,
    handles: &Handles,
    p: &Plan,
    parts: Parts,
    kind: &str,
    make: M,
) -> anyhow::Result<()>
where
    T: OnThread,
    <T::Driver as PortDriver>::Error: std::error::Error + Send + Sync + 'static,
    M: FnOnce() -> T + Send + 'static,
{
    let name = parts.slot.name.clone();
    let core = p.core;
    let (table, stop) = (Arc::clone(&handles.table), Arc::clone(&w.stop));
    let origin = handles.capture.origin();
    let handle = thread::Builder::new()
        .name(format!("{kind} {name}"))
        .spawn(move || {
            let mut on = make();
            worker(on.driver(), parts, core, &table, origin, &stop)
        })
        .context("spawning a worker thread")?;
    w.threads.push((name, handle));
    Ok(())
}

/// The worker's clock, which also beats its heartbeat: the loop reads it once a turn.
struct Beating<'a> {
    clock: MonotonicClock,
    beat: &'a std::sync::atomic::AtomicU64,
}

impl strait_dataplane::xsk::Clock for Beating<'_> {
    fn now_ns(&mut self) -> u64 {
        let t = self.clock.now_ns();
        // The time is a value that only grows: a change means a turn.
        self.beat.store(t, std::sync::atomic::Ordering::Relaxed);
        t
    }
}

/// One worker's thread: pins it to `core`, runs the loop over `group` until `stop`, with
/// the table loaded from `table` once a batch and time counted from `origin`.
fn worker<D>(
    group: &mut D,
    parts: Parts,
    core: Option<usize>,
    table: &ArcSwap<ServiceTable>,
    origin: Instant,
    stop: &AtomicBool,
) -> anyhow::Result<WorkerStats>
where
    D: PortDriver,
    D::Error: std::error::Error + Send + Sync + 'static,
{
    let Parts {
        mut handoff,
        mut pipe,
        slot,
    } = parts;
    let slot = &*slot;
    match core {
        Some(c) if core_affinity::set_for_current(core_affinity::CoreId { id: c }) => {
            info!(worker = %slot.name, core = c, "worker pinned")
        }
        Some(c) => warn!(worker = %slot.name, core = c, "could not pin the worker to its core"),
        None => info!(worker = %slot.name, "worker not pinned (no `cores` configured)"),
    }
    let capacity = pipe.flows.capacity() as u64;
    let publish = |p: &Pipeline, w: &WorkerStats| {
        // Never wait for the admin API: skip this round if it is reading.
        if let Ok(mut s) = slot.sample.try_lock() {
            s.counters = p.counters;
            s.flows = p.flows.stats();
            s.flow_capacity = capacity;
            s.worker = *w;
            s.sync = p.sync.as_ref().map(|y| y.counters).unwrap_or_default();
            crate::cores::publish_traffic(&mut s, p, &table.load());
            slot.passive_total
                .store(p.passive.total(), std::sync::atomic::Ordering::Relaxed);
        }
    };
    let clock = Beating {
        clock: MonotonicClock::since(origin),
        beat: &slot.heartbeat,
    };
    let stats = run_worker(
        group,
        &mut pipe,
        &mut handoff,
        || table.load_full(),
        stop,
        clock,
        publish,
    )?;
    let c = slot
        .sample
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .counters;
    let handoff_dropped = stats.handoff_full
        + stats.handoff_too_big
        + stats.handoff_no_ring
        + stats.handoff_no_frame
        + stats.handoff_loop;
    info!(
        worker = %slot.name,
        rx = c.rx,
        tx = c.tx,
        pass_unsent = stats.pass_unsent,
        passed = stats.passed,
        exception_out = stats.exception_out,
        other_port = stats.other_port,
        handed_out = stats.handed_out,
        handed_in = stats.handed_in,
        handoff_dropped,
        "worker stopped"
    );
    Ok(stats)
}

impl Drop for Workers {
    /// Workers dropped without [`Workers::stop`] (an error on the way out) are stopped and
    /// waited for too, so that no thread keeps polling sockets whose owner is gone.
    fn drop(&mut self) {
        self.stop_in_place();
    }
}

impl Workers {
    /// Stops every worker and waits for it.
    pub fn stop(mut self) {
        self.stop_in_place();
    }

    fn stop_in_place(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for (name, t) in self.threads.drain(..) {
            match t.join() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => warn!(worker = %name, "worker failed: {e:#}"),
                Err(_) => warn!(worker = %name, "worker panicked"),
            }
        }
        if let Some(s) = self.sync.take() {
            s.stop();
        }
        // Dropping the programs detaches them.
        self.progs.clear();
        // The DPDK ports close (and EAL cleans up) once no worker uses them.
        self.dpdk = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(interfaces: &str) -> Config {
        strait_config::parse(&format!(
            "[gateway]\n{interfaces}\n[[services]]\nname = \"web\"\nvip = \"203.0.113.10\"\n\
             port = 80\nprotocol = \"tcp\"\nmode = \"nat\"\n\n[[services.backends]]\n\
             address = \"198.51.100.11\"\nport = 8080\nmac = \"02:00:00:00:0b:11\"\n"
        ))
        .expect("a valid configuration")
    }

    #[test]
    fn one_worker_per_queue_across_interfaces() {
        let cfg = config(
            "[[gateway.interfaces]]\nname = \"veth-c\"\nqueues = [0, 1]\ncores = [2, 3]\n\
             role = \"client\"\n\
             [[gateway.interfaces]]\nname = \"veth-b\"\nqueues = [1, 0, 2]\ncores = [3, 2, 6]\n\
             role = \"backend\"\n",
        );
        let p = plan(&cfg);
        let names: Vec<&str> = p.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["veth-c+veth-b/0", "veth-c+veth-b/1", "veth-b/2"],
            "{p:?}"
        );
        assert_eq!(p[0].members, [0, 1]);
        assert_eq!(p[2].members, [1]);
        assert_eq!(
            p.iter().map(|p| p.core).collect::<Vec<_>>(),
            [Some(2), Some(3), Some(6)],
            "a shared queue's core, the same on each interface that gives it"
        );
        let s = slots(&cfg);
        assert_eq!(s.len(), 3);
        assert_eq!(s[1].name, "veth-c+veth-b/1");
    }

    #[test]
    fn one_arm_keeps_its_names() {
        let cfg = config("[[gateway.interfaces]]\nname = \"eth0\"\nqueues = [3, 1]\n");
        let p = plan(&cfg);
        assert_eq!(
            p.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["eth0/3", "eth0/1"]
        );
        assert!(p.iter().all(|p| p.core.is_none() && p.members == [0]));
    }
}
