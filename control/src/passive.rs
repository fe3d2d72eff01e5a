//! The passive-health watcher: turns the failed connection attempts the workers counted
//! ([`strait_dataplane::passive`], published in their samples) into
//! [`crate::core::Event::Passive`] for the core, which decides ([`crate::core::passive`]).
//!
//! The control loop calls [`Watcher::poll`] every [`POLL`] while some service has passive
//! health. A poll reads one relaxed atomic per worker ([`CoreStats::passive_total`], stored
//! with each sample) and compares it with the total it last saw: while no backend fails
//! that is all it does, with no lock and no allocation (a few nanoseconds per worker). Only
//! a worker whose total moved has its sample locked and its per-backend counts compared
//! with the last ones seen; the differences, summed over the workers and named by the live
//! table, are the event.
//!
//! End to end a failing backend is seen within: the worker's publish (at most
//! [`strait_dataplane::xsk::PASSIVE_PUBLISH_NS`] after the failure), this poll ([`POLL`]),
//! then the core's table update for one service (a Maglev table, about a millisecond for
//! 65537 slots) and the workers' next batch.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use strait_dataplane::passive::Failure;
use strait_dataplane::table::ServiceTable;

use crate::core::BackendKey;
use crate::cores::CoreStats;

/// Time between two polls of the workers' samples: 5 ms, a tenth of the 50 ms within which
/// a backend that closed its listener under load should be out; 200 polls a second of a
/// relaxed load per worker cost nothing measurable.
pub const POLL: Duration = Duration::from_millis(5);

/// What the watcher has seen of each worker.
#[derive(Debug, Default)]
pub struct Watcher {
    /// Per worker: the total last seen and the per-backend-id counts last seen.
    seen: Vec<(u64, Vec<[u64; 2]>)>,
}

impl Watcher {
    /// A watcher that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The failed connection attempts the workers `cores` published since the last poll, by
    /// backend of `table` and cause, summed over the workers; empty when there were none.
    pub fn poll(
        &mut self,
        cores: &[Arc<CoreStats>],
        table: &ServiceTable,
    ) -> Vec<(BackendKey, Failure, u64)> {
        if self.seen.len() < cores.len() {
            self.seen.resize_with(cores.len(), Default::default);
        }
        let mut out: Vec<(BackendKey, Failure, u64)> = Vec::new();
        for (core, (total, last)) in cores.iter().zip(self.seen.iter_mut()) {
            let now = core.passive_total.load(Ordering::Relaxed);
            if now == *total {
                continue;
            }
            *total = now;
            let sample = core.sample.lock().unwrap_or_else(PoisonError::into_inner);
            let counts = &sample.passive;
            if last.len() < counts.len() {
                last.resize(counts.len(), [0; 2]);
            }
            for (id, (c, l)) in counts.iter().zip(last.iter_mut()).enumerate() {
                if c == l {
                    continue;
                }
                for why in Failure::ALL {
                    let n = c[why as usize].wrapping_sub(l[why as usize]);
                    if n == 0 {
                        continue;
                    }
                    let Some(b) = table.backends.get(id).and_then(Option::as_ref) else {
                        continue;
                    };
                    let Some(s) = table.services.get(b.service as usize) else {
                        continue;
                    };
                    let key = BackendKey::new(s.name.clone(), b.address(), b.port);
                    match out.iter_mut().find(|(k, w, _)| *k == key && *w == why) {
                        Some((_, _, sum)) => *sum += n,
                        None => out.push((key, why, n)),
                    }
                }
                *l = *c;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strait_dataplane::table::Builder;
    use strait_testkit::config::{GatewayToml, ServiceToml};

    #[test]
    fn failures_are_summed_over_the_cores_once_each() {
        let web = ServiceToml::new("web", "203.0.113.10", 80)
            .mode("nat")
            .maglev_table_size(251)
            .backend_mac("198.51.100.11", 8080, "02:00:00:00:01:11");
        let cfg = strait_config::parse(&GatewayToml::eth0().service(web).to_string()).unwrap();
        let ports = [strait_dataplane::table::Port::new(
            strait_config::model::MacAddr([2, 0, 0, 0, 0, 1]),
            1500,
        )];
        let table = Builder::new().build(&cfg, &ports, |_, _, _| false).unwrap();
        let id = table.backends.iter().flatten().next().unwrap().id.0 as usize;
        let cores: Vec<Arc<CoreStats>> = (0..2).map(|_| Arc::default()).collect();
        let publish = |c: &CoreStats, refused: u64, unanswered: u64| {
            let mut s = c.sample.lock().unwrap();
            s.passive.resize(id + 1, [0; 2]);
            s.passive[id] = [refused, unanswered];
            c.passive_total
                .store(refused + unanswered, Ordering::Relaxed);
        };
        let mut w = Watcher::new();
        assert!(w.poll(&cores, &table).is_empty());
        publish(&cores[0], 2, 0);
        publish(&cores[1], 3, 1);
        let key = BackendKey::new("web", "198.51.100.11".parse().unwrap(), 8080);
        let mut got = w.poll(&cores, &table);
        got.sort_by_key(|(_, why, _)| *why as u8);
        assert_eq!(
            got,
            vec![
                (key.clone(), Failure::Refused, 5),
                (key.clone(), Failure::Unanswered, 1)
            ]
        );
        // Seen once: nothing new until the counts move again.
        assert!(w.poll(&cores, &table).is_empty());
        publish(&cores[1], 4, 1);
        assert_eq!(w.poll(&cores, &table), vec![(key, Failure::Refused, 1)]);
    }
}
