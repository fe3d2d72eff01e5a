//! Writing constant Prometheus families: the admin API's collectors (`admin`, `kube::stats`,
//! and [`Heartbeats`] here) read their numbers on each scrape and emit them through these,
//! so every metric of the gateway is encoded one way.

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// A family's samples: each one's labels and value.
pub(crate) type Rows<'a, T> = Vec<(Vec<(&'a str, String)>, T)>;

/// Writes counter family `name` with one sample per row.
pub(crate) fn counter(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Vec<(&str, String)>, u64)],
) -> std::fmt::Result {
    let probe = ConstCounter::new(0u64);
    let mut fam = enc.encode_descriptor(name, help, None, probe.metric_type())?;
    for (labels, v) in rows {
        ConstCounter::new(*v).encode(fam.encode_family(labels)?)?;
    }
    Ok(())
}

/// Writes counter family `name` of seconds (a float) with one sample per row.
pub(crate) fn seconds_counter(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Vec<(&str, String)>, f64)],
) -> std::fmt::Result {
    let probe = ConstCounter::new(0f64);
    let mut fam = enc.encode_descriptor(name, help, None, probe.metric_type())?;
    for (labels, v) in rows {
        ConstCounter::new(*v).encode(fam.encode_family(labels)?)?;
    }
    Ok(())
}

/// Writes gauge family `name` with one sample per row.
pub(crate) fn gauge(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Vec<(&str, String)>, i64)],
) -> std::fmt::Result {
    let probe = ConstGauge::new(0i64);
    let mut fam = enc.encode_descriptor(name, help, None, probe.metric_type())?;
    for (labels, v) in rows {
        ConstGauge::new(*v).encode(fam.encode_family(labels)?)?;
    }
    Ok(())
}

/// One sample without labels.
pub(crate) fn one<T>(v: T) -> Rows<'static, T> {
    vec![(Vec::new(), v)]
}

/// A count as a gauge value, saturating.
pub(crate) fn gauge_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
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
    samples: &[(String, crate::shared::CoreSample)],
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

/// Writes gauge family `name` of seconds (a float) with one sample per row.
pub(crate) fn seconds_gauge(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Vec<(&str, String)>, f64)],
) -> std::fmt::Result {
    let probe = ConstGauge::new(0f64);
    let mut fam = enc.encode_descriptor(name, help, None, probe.metric_type())?;
    for (labels, v) in rows {
        ConstGauge::new(*v).encode(fam.encode_family(labels)?)?;
    }
    Ok(())
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
pub(crate) struct Heartbeats {
    shared: std::sync::Arc<crate::shared::Shared>,
    /// Per worker: the heartbeat the last scrape saw and when a scrape first saw it.
    seen: std::sync::Mutex<Vec<(u64, std::time::Instant)>>,
}

impl Heartbeats {
    /// A collector over `shared`'s workers.
    pub(crate) fn new(shared: std::sync::Arc<crate::shared::Shared>) -> Self {
        Self {
            shared,
            seen: std::sync::Mutex::default(),
        }
    }

    /// Each worker's heartbeat age at `now`, remembering what this look saw.
    fn ages(&self, now: std::time::Instant) -> Vec<(String, f64)> {
        use std::sync::atomic::Ordering;
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let cores = &self.shared.cores;
        seen.resize(cores.len(), (u64::MAX, now));
        cores
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

/// Writes how many backends of each service take new flows (`strait_service_serving_backends`):
/// the members of its Maglev table (healthy, weight above 0, not draining or terminating).
/// 0 means new connections to the service have nowhere to go.
pub(crate) fn serving_backends(
    enc: &mut DescriptorEncoder<'_>,
    table: &strait_dataplane::table::ServiceTable,
) -> std::fmt::Result {
    let rows: Vec<_> = table
        .services
        .iter()
        .map(|s| {
            (
                vec![("service", s.name.clone())],
                gauge_of(s.members.len() as u64),
            )
        })
        .collect();
    gauge(
        enc,
        "service_serving_backends",
        "Backends of the service that take new flows (healthy, weight above 0, not draining).",
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::shared::{CoreStats, Shared};

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
        let cfg = strait_config::parse(strait_config::EXAMPLE).unwrap();
        let table = Arc::new(strait_dataplane::table::ServiceTable::empty(Vec::new()));
        let shared = Arc::new(Shared::new(cfg, table, Arc::default(), cores.clone()));
        let hb = Heartbeats::new(shared);
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
