//! Starting the AF_XDP workers: one per configured (interface, queue), each on its own
//! thread, pinned to its configured core, owning its socket, UMEM, pipeline (flow table and
//! counters).
//!
//! Order, per interface: attach the steering program (replacing a stale one), open each
//! queue's socket and register it in the program's socket map, then fill the program's maps
//! from the current table, so no packet is redirected to a queue without a socket.
//!
//! Limits of this version, logged at start: `nat` flows are owned per core, and the cross-core
//! handoff ring is not built yet, so `nat` needs a single worker; a frame whose egress is
//! another interface (two-arm topologies) is dropped and counted, since sockets do not share a
//! UMEM yet.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::thread::{self, JoinHandle};

use anyhow::Context;
use strait_config::model::{Config, Mode};
use strait_dataplane::pipeline::Pipeline;
use strait_dataplane::xsk::{
    run_worker, AttachPolicy, MonotonicClock, Port, PortConfig, SteerProgram, WorkerStats,
};
use tracing::{info, warn};

use crate::shared::{CoreStats, Shared};

/// The running workers and the steering programs they depend on.
pub struct Workers {
    stop: Arc<AtomicBool>,
    threads: Vec<(String, JoinHandle<anyhow::Result<WorkerStats>>)>,
    /// One steering program per interface; their maps must follow every table.
    pub progs: Vec<SteerProgram>,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("threads", &self.threads.len())
            .finish_non_exhaustive()
    }
}

/// The statistics slots of the workers `cfg` asks for, in start order (`iface/queue`).
pub fn slots(cfg: &Config) -> Vec<Arc<CoreStats>> {
    cfg.gateway
        .interfaces
        .iter()
        .flat_map(|i| i.queues.iter().map(move |q| format!("{}/{q}", i.name)))
        .map(|name| {
            Arc::new(CoreStats {
                name,
                ..Default::default()
            })
        })
        .collect()
}

/// Attaches the programs and starts a worker per (interface, queue) of `cfg`.
///
/// # Errors
/// When a program cannot be attached or a socket cannot be opened (no AF_XDP, no such queue,
/// not enough privileges), with the interface and queue named.
pub fn start(cfg: &Config, shared: &Arc<Shared>) -> anyhow::Result<Workers> {
    let g = &cfg.gateway;
    let total: usize = g.interfaces.iter().map(|i| i.queues.len()).sum();
    if total > 1 && cfg.services.iter().any(|s| s.mode == Mode::Nat) {
        warn!("nat with {total} workers: replies that land on another core are dropped until the handoff ring exists; use one queue for nat");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut progs = Vec::new();
    let mut threads = Vec::new();
    let mut index = 0usize;
    for (pi, iface) in g.interfaces.iter().enumerate() {
        let mut prog = SteerProgram::attach(&iface.name, AttachPolicy::default())
            .with_context(|| format!("attaching the XDP steering program to {}", iface.name))?;
        info!(iface = %iface.name, mode = ?prog.mode(), replaced = ?prog.replaced_programs(), "XDP program attached");
        for (qi, &queue) in iface.queues.iter().enumerate() {
            let mut pc = PortConfig::new(&iface.name, queue);
            pc.table_port = pi as u8;
            let port = Port::open(&pc).with_context(|| {
                format!("opening the AF_XDP socket on {} queue {queue}", iface.name)
            })?;
            match port.zero_copy_refused() {
                Some(e) => {
                    info!(iface = %iface.name, queue, "AF_XDP bound in {} mode (zero-copy refused: {e})", port.bind_mode())
                }
                None => {
                    info!(iface = %iface.name, queue, "AF_XDP bound in {} mode", port.bind_mode())
                }
            }
            prog.register(queue, &port)
                .with_context(|| format!("registering {} queue {queue}", iface.name))?;
            let core = iface.cores.as_ref().and_then(|c| c.get(qi)).copied();
            let slot = Arc::clone(&shared.cores[index]);
            let pipe = Pipeline::new(
                index as u16,
                total as u16,
                g.flow_capacity_per_core as usize,
                shared.table.load().timeouts,
                g.new_flows_per_second_per_core,
            );
            let name = slot.name.clone();
            let (shared, stop) = (Arc::clone(shared), Arc::clone(&stop));
            let handle = thread::Builder::new()
                .name(format!("xsk {name}"))
                .spawn(move || worker(port, pipe, core, &shared, &stop, &slot))
                .context("spawning a worker thread")?;
            threads.push((name, handle));
            index += 1;
        }
        let sync = prog.update_maps(&shared.table.load())?;
        info!(iface = %iface.name, added = sync.added, "steering maps filled");
        progs.push(prog);
    }
    Ok(Workers {
        stop,
        threads,
        progs,
    })
}

fn worker(
    mut port: Port,
    mut pipe: Pipeline,
    core: Option<usize>,
    shared: &Shared,
    stop: &AtomicBool,
    slot: &CoreStats,
) -> anyhow::Result<WorkerStats> {
    match core {
        Some(c) if core_affinity::set_for_current(core_affinity::CoreId { id: c }) => {
            info!(worker = %slot.name, core = c, "worker pinned")
        }
        Some(c) => warn!(worker = %slot.name, core = c, "could not pin the worker to its core"),
        None => info!(worker = %slot.name, "worker not pinned (no `cores` configured)"),
    }
    let capacity = pipe.flows.capacity() as u64;
    let publish = |p: &Pipeline, _: &WorkerStats| {
        // Never wait for the admin API: skip this round if it is reading.
        if let Ok(mut s) = slot.sample.try_lock() {
            s.counters = p.counters;
            s.flows = p.flows.stats();
            s.flow_capacity = capacity;
            let used = shared.table.load().backends.len().min(p.new_flows.len());
            s.new_flows.clear();
            s.new_flows.extend_from_slice(&p.new_flows[..used]);
        }
    };
    let stats = run_worker(
        &mut port,
        &mut pipe,
        || shared.table.load_full(),
        stop,
        MonotonicClock::new(),
        publish,
    )?;
    let c = slot
        .sample
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .counters;
    info!(worker = %slot.name, rx = c.rx, tx = c.tx, pass_unsent = stats.pass_unsent, other_port = stats.other_port, "worker stopped");
    Ok(stats)
}

impl Workers {
    /// Stops every worker and waits for it.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for (name, t) in self.threads.drain(..) {
            match t.join() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => warn!(worker = %name, "worker failed: {e:#}"),
                Err(_) => warn!(worker = %name, "worker panicked"),
            }
        }
        // Dropping the programs detaches them.
        self.progs.clear();
    }
}
