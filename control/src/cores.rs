//! What each worker publishes of itself: its slot ([`CoreStats`]: the latest
//! [`CoreSample`] of its counters and a heartbeat) and the families written from the
//! samples that are the workers' own (where the UMEM frames are).
//!
//! A module of its own, apart from `workers` which fills the slots, because the slots are
//! read by more than the admin API: the flow sync thread sums its counters from them and the
//! systemd watchdog follows the heartbeats, and `workers` starts the flow sync thread, so a
//! slot type in `workers` would make `sync` and `workers` import each other.

use std::sync::Mutex;

use prometheus_client::encoding::DescriptorEncoder;
use strait_dataplane::flow::FlowStats;
use strait_dataplane::stats::Counters;

use crate::metrics::gauge;

/// One worker's published numbers.
#[derive(Clone, Debug, Default)]
pub struct CoreSample {
    /// Packet counters.
    pub counters: Counters,
    /// Flow-table statistics.
    pub flows: FlowStats,
    /// Flow-table capacity.
    pub flow_capacity: u64,
    /// New flows per backend id (index = id), trimmed to the ids in use.
    pub new_flows: Vec<u64>,
    /// The AF_XDP worker's own numbers: frames it could not send on, ring wake-ups.
    pub worker: strait_dataplane::xsk::WorkerStats,
    /// Flow sync with the peer gateways, this worker's side (zero when sync is off).
    pub sync: strait_dataplane::sync::SyncCounters,
}

/// A worker's slot for publishing its numbers.
#[derive(Debug, Default)]
pub struct CoreStats {
    /// Interface and queue the worker serves.
    pub name: String,
    /// The latest sample.
    pub sample: Mutex<CoreSample>,
    /// The worker's clock when its loop last turned (once per turn, busy or idle; a
    /// relaxed store, never per packet): the systemd watchdog is fed only while every
    /// worker's moves ([`crate::supervise::Watchdog`]).
    pub heartbeat: std::sync::atomic::AtomicU64,
}

/// Writes where each worker's UMEM frames are (`strait_umem_frames{core, state}`), the UMEM's
/// size and the frames whose books disagree, from the workers' latest look
/// ([`strait_dataplane::xsk::WorkerStats::umem`]).
///
/// The states add up to `strait_umem_capacity_frames`: `free` (user space's free list),
/// `fill`, `rx`, `tx`, `completion` (on those rings) and `kernel` (taken by the kernel from a
/// fill or TX ring and not yet on an RX or completion ring: a moment in copy mode, the
/// posted buffers of a zero-copy driver). A frame lost would show as `kernel` growing while
/// traffic is stopped, or as a misplaced frame.
pub(crate) fn umem(
    enc: &mut DescriptorEncoder<'_>,
    samples: &[(String, CoreSample)],
) -> std::fmt::Result {
    let core = |n: &String| vec![("core", n.clone())];
    let states: Vec<_> = samples
        .iter()
        .flat_map(|(n, s)| {
            let a = &s.worker.umem;
            [
                ("free", i64::from(a.held)),
                ("fill", i64::from(a.fill)),
                ("rx", i64::from(a.rx)),
                ("tx", i64::from(a.tx)),
                ("completion", i64::from(a.comp)),
                ("kernel", a.in_kernel),
            ]
            .map(|(state, v)| (vec![("core", n.clone()), ("state", state.to_owned())], v))
        })
        .collect();
    gauge(
        enc,
        "umem_frames",
        "UMEM frames by where they are: free (user space), fill, rx, tx, completion (on those \
         rings), kernel (taken from fill or TX, not yet on RX or completion). They add up to \
         strait_umem_capacity_frames.",
        &states,
    )?;
    let total: Vec<_> = samples
        .iter()
        .map(|(n, s)| (core(n), i64::from(s.worker.umem.total)))
        .collect();
    gauge(
        enc,
        "umem_capacity_frames",
        "Frames in the worker's UMEM.",
        &total,
    )?;
    let misplaced: Vec<_> = samples
        .iter()
        .map(|(n, s)| (core(n), i64::from(s.worker.umem.misplaced)))
        .collect();
    gauge(
        enc,
        "umem_misplaced_frames",
        "Frames whose recorded owner disagrees with the free list: 0 unless a frame was lost \
         or counted twice.",
        &misplaced,
    )
}
