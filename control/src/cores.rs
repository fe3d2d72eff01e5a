//! What each worker publishes of itself: its slot ([`CoreStats`]: the latest
//! [`CoreSample`] of its counters and a heartbeat) and the families written from the
//! samples that are the workers' own (where the UMEM frames are, how long each heartbeat
//! has stood still: [`Heartbeats`]).
//!
//! A module of its own, apart from `workers` which fills the slots, because the slots are
//! read by more than the admin API: the flow sync thread sums its counters from them and the
//! systemd watchdog follows the heartbeats, and `workers` starts the flow sync thread, so a
//! slot type in `workers` would make `sync` and `workers` import each other.

use std::sync::Mutex;

use prometheus_client::encoding::DescriptorEncoder;
use strait_dataplane::flow::FlowStats;
use strait_dataplane::stats::Counters;

use crate::metrics::{gauge, seconds_gauge};

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
    /// Packets and bytes per service id, trimmed to the ids the table may use
    /// ([`strait_dataplane::traffic`]).
    pub services: Vec<strait_dataplane::traffic::Tally>,
    /// Packets and bytes per backend id, trimmed to the ids in use.
    pub backends: Vec<strait_dataplane::traffic::Tally>,
    /// Flow-table entries per backend id, trimmed to the ids in use.
    pub backend_flows: Vec<strait_dataplane::flow::BackendEntries>,
    /// Failed connection attempts per backend id, `[refused, unanswered]`
    /// ([`strait_dataplane::passive`]), trimmed to the ids in use.
    pub passive: Vec<[u64; 2]>,
}

/// Copies what the worker counted per service and backend into its sample, for the ids the
/// live table `t` uses: its new flows, service and backend slots and its flow table's
/// entries per backend. Runs on the worker's thread between batches; after the first copies
/// the sample's vectors have their size and nothing allocates unless the table grows.
pub fn publish_traffic(
    s: &mut CoreSample,
    p: &strait_dataplane::pipeline::Pipeline,
    t: &strait_dataplane::table::ServiceTable,
) {
    let backends = t.backends.len();
    s.new_flows.clear();
    s.new_flows
        .extend_from_slice(&p.new_flows[..backends.min(p.new_flows.len())]);
    p.traffic.export(t, &mut s.services, &mut s.backends);
    p.passive.export(backends, &mut s.passive);
    let per_backend = p.flows.entries_by_backend();
    s.backend_flows.clear();
    s.backend_flows
        .extend_from_slice(&per_backend[..backends.min(per_backend.len())]);
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
    /// The admin API's window onto the worker's explain desk
    /// ([`strait_dataplane::explain`]); `None` until the worker starts. Locked by the admin
    /// API only (one query at a time per worker), never by the worker.
    pub explain: Mutex<Option<strait_dataplane::explain::Window>>,
    /// The worker's count of failed connection attempts ([`CoreSample::passive`] summed), as
    /// of its latest sample: a relaxed store per publish, so that the passive-health watcher
    /// ([`crate::passive`]) locks a sample only when it changed.
    pub passive_total: std::sync::atomic::AtomicU64,
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

/// How long each worker's heartbeat has stood still (`strait_worker_heartbeat_age_seconds`),
/// as the scrapes see it.
///
/// A worker stores its own clock's reading once per loop turn, busy or idle (an idle turn
/// sleeps at most a millisecond), so a heartbeat that stands still means a worker stuck in
/// a loop, blocked in the kernel, or gone. The reading is on the worker's own clock, whose
/// origin nobody else knows; so each scrape compares it with the value the last scrape saw
/// and the age is the time since a scrape first saw the current value: 0 while it moves,
/// and behind the truth by at most one scrape interval. The alert's `for:` covers that.
#[derive(Debug)]
pub struct Heartbeats {
    cores: Vec<std::sync::Arc<CoreStats>>,
    /// Per worker: the heartbeat the last scrape saw and when a scrape first saw it.
    seen: Mutex<Vec<(u64, std::time::Instant)>>,
}

impl Heartbeats {
    /// A collector over the workers' slots `cores`.
    pub fn new(cores: Vec<std::sync::Arc<CoreStats>>) -> Self {
        Self {
            cores,
            seen: Mutex::default(),
        }
    }

    /// Each worker's heartbeat age at `now`, remembering what this look saw.
    fn ages(&self, now: std::time::Instant) -> Vec<(String, f64)> {
        use std::sync::atomic::Ordering;
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.resize(self.cores.len(), (u64::MAX, now));
        self.cores
            .iter()
            .zip(seen.iter_mut())
            .map(|(c, (beat, since))| {
                let b = c.heartbeat.load(Ordering::Relaxed);
                if b != *beat {
                    *beat = b;
                    *since = now;
                }
                (c.name.clone(), now.duration_since(*since).as_secs_f64())
            })
            .collect()
    }
}

impl prometheus_client::collector::Collector for Heartbeats {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let rows: Vec<_> = self
            .ages(std::time::Instant::now())
            .into_iter()
            .map(|(core, age)| (vec![("core", core)], age))
            .collect();
        seconds_gauge(
            &mut enc,
            "worker_heartbeat_age_seconds",
            "Seconds since the worker's loop last turned, as the scrapes see it (0 while it \
             moves; late by at most one scrape interval). A worker turns at least every \
             millisecond, busy or idle: a growing age is a stalled worker.",
            &rows,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_heartbeat_that_stands_still_ages_and_one_that_moves_does_not() {
        let cores: Vec<Arc<CoreStats>> = ["eth0/0", "eth0/1"]
            .iter()
            .map(|n| {
                Arc::new(CoreStats {
                    name: (*n).into(),
                    ..Default::default()
                })
            })
            .collect();
        let hb = Heartbeats::new(cores.clone());
        let t0 = Instant::now();
        cores[0].heartbeat.store(10, Ordering::Relaxed);
        cores[1].heartbeat.store(10, Ordering::Relaxed);
        assert_eq!(
            hb.ages(t0),
            vec![("eth0/0".into(), 0.0), ("eth0/1".into(), 0.0)]
        );
        // Worker 0 turns, worker 1 stands still.
        cores[0].heartbeat.store(20, Ordering::Relaxed);
        let ages = hb.ages(t0 + Duration::from_secs(3));
        assert_eq!(ages[0].1, 0.0);
        assert_eq!(ages[1].1, 3.0);
        let ages = hb.ages(t0 + Duration::from_secs(5));
        assert_eq!((ages[0].1, ages[1].1), (2.0, 5.0));
        // Worker 1 moves again: its age falls back to 0.
        cores[1].heartbeat.store(11, Ordering::Relaxed);
        assert_eq!(hb.ages(t0 + Duration::from_secs(6))[1].1, 0.0);
    }
}
