//! Slow start: a backend that comes up ramps its Maglev weight to its configured weight over
//! its service's `slow_start`, so a cold backend (empty caches, a JIT not warm, connection
//! pools not filled) is not handed its full share of new flows at once.
//!
//! Decisions:
//!
//! - **What comes up.** A backend of a service with `slow_start` that takes new flows in the
//!   table about to be built and did not in the live one: added (to the file, or a new ready
//!   endpoint or node from Kubernetes), healthy again, or no longer draining (its `state`
//!   back to `active`, its weight back above 0). It ramps only beside a backend that takes
//!   new flows in both tables: a service's first backends (at start, a new service, every
//!   backend back at once, a single backend replaced) have nobody to share with, and all
//!   the new flows are what they get anyway. A backend that stops taking new flows
//!   (down, draining, removed) ends its ramp; when it comes back, the ramp starts again.
//!   Turning `slow_start` on ramps no backend that is already serving.
//! - **The weight over the ramp.** Linear in the whole seconds `k` since the backend came up:
//!   `max(1, w * (10 % + 90 % * k / n))` for a ramp of `n` seconds and a configured weight
//!   `w`, then `w` from second `n` on. 10 % is Envoy's default `min_weight_percent` for its
//!   slow start: a share small enough for a cold backend and large enough to warm it. With
//!   the default weight 100 every step moves a few percent of the weight; a weight below
//!   ten ramps in coarser steps, and weight 1 does not ramp at all (a weight is whole).
//!   The share of new flows follows the weight: `w_r / (w_r + Σ others)`, so a backend
//!   beside one other of equal weight starts at 1/11 of the new flows, not 1/20.
//! - **Steps at most once a second, and only while something ramps.** A step is an
//!   incremental table update ([`strait_dataplane::table::Builder::update`]) of the
//!   services whose ramping weight changed, nothing else; [`Ramps::next`] is the core's
//!   deadline for the next one and is `None` when no backend ramps, so a gateway with no
//!   ramp running builds nothing and wakes for nothing. A step costs one Maglev build per
//!   service stepped (about a millisecond at 65,537 slots in a release build, by the
//!   figures in [`strait_dataplane::maglev`]; Kubernetes services, sized by their backends,
//!   much less). Each ramping backend steps on the
//!   whole seconds since it came up, so two backends of one service that came up at
//!   different times may each step the service within one second.
//! - **Flows stay where they are.** A step changes weights only: every backend keeps its id
//!   and incarnation, so a flow-table entry still finds its backend taking flows and keeps
//!   it. Only new flows (a flow-table miss) are hashed to the new Maglev table. What has no
//!   flow entry follows the table: fragments (3-tuple Maglev), flows forwarded statelessly
//!   when the flow table is full or its new-flow rate cap is reached, and session-affinity
//!   entries when they are made.
//! - **Every gateway of a fleet ramps alike, up to when each saw the backend come up.** A
//!   ramp runs on the monotonic clock from the moment this core learnt that the backend
//!   came up, so the gateways' tables differ by that moment, and not by their clock skew.
//!   A shared wall-clock start would help only with a start time shared by all the
//!   gateways, and none exists: EndpointSlice conditions carry no time (the slice's optional
//!   `endpoints.kubernetes.io/last-change-trigger-time` annotation is the latest change of
//!   any of its endpoints, not one endpoint's), and each gateway runs its own health checks.
//!   So gateways disagree by how far apart they observed the change: a Kubernetes change
//!   reaches every gateway's watch within the API server's delivery (milliseconds to tens
//!   of milliseconds), a health check turns up within about one `interval` on each gateway
//!   (each checks on its own clock), a file reload when the operator's tooling reloads each
//!   one. Within that window a new flow's first packets may pick another backend on another
//!   gateway, which only matters to a flow the router moves between gateways in that window
//!   (flow sync covers it where it runs).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use strait_config::model::{BackendState, Service};
use strait_dataplane::table::{Health, ServiceTable};
use tracing::info;

/// The time between two steps of a ramp.
pub const STEP: Duration = Duration::from_secs(1);

/// The share of its weight a backend starts its ramp with, in percent (Envoy's default
/// `min_weight_percent`).
pub const START_PERCENT: u64 = 10;

/// One ramping backend: when it came up, and the step its service's table has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ramp {
    since: Instant,
    step: u64,
}

/// The backends ramping, by service name and (canonical address, port).
#[derive(Debug, Clone, Default)]
pub struct Ramps {
    services: BTreeMap<String, BTreeMap<(IpAddr, u16), Ramp>>,
}

/// Where the live table's services are, by name, made once per build that needs it.
pub type LiveIndex<'t> = HashMap<&'t str, usize>;

/// The index of `table`'s services by name.
pub fn live_index(table: &ServiceTable) -> LiveIndex<'_> {
    table
        .services
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), i))
        .collect()
}

impl Ramps {
    /// Follows service `s` as it is about to be built at `now` (`down(service, address,
    /// port)` says which backends failed their health check), against the live `table`
    /// (`index` from [`live_index`], made on first use): starts the ramps of backends that
    /// came up, ends those of backends that no longer take new flows, and sets each ramping
    /// backend's weight in `s` to its ramp's.
    pub fn apply<'t>(
        &mut self,
        s: &mut Service,
        table: &'t ServiceTable,
        index: &mut Option<LiveIndex<'t>>,
        down: impl Fn(&str, IpAddr, u16) -> bool,
        now: Instant,
    ) {
        let Some(window) = s.slow_start else {
            self.services.remove(&s.name);
            return;
        };
        let serving = |b: &strait_config::model::Backend| {
            b.state == BackendState::Active && b.weight > 0 && !down(&s.name, b.address, b.port)
        };
        let index = index.get_or_insert_with(|| live_index(table));
        let was: HashSet<(IpAddr, u16)> = index
            .get(s.name.as_str())
            .map(|&i| {
                table.services[i]
                    .backends
                    .iter()
                    .filter_map(|&id| table.backend(id))
                    .filter(|b| b.health == Health::Up)
                    .map(|b| (b.address(), b.port))
                    .collect()
            })
            .unwrap_or_default();
        let ramps = self.services.entry(s.name.clone()).or_default();
        let now_serving: HashSet<(IpAddr, u16)> = s
            .backends
            .iter()
            .filter(|b| serving(b))
            .map(|b| (b.address.to_canonical(), b.port))
            .collect();
        ramps.retain(|k, _| now_serving.contains(k));
        let n = window.as_secs().max(1);
        // Beside a backend that takes new flows before and after: else there is nobody to
        // share with.
        if now_serving.iter().any(|k| was.contains(k)) {
            for b in &s.backends {
                let k = (b.address.to_canonical(), b.port);
                // Weight 1 has no smaller step to start from.
                let can = weight(b.weight, 0, n) < b.weight;
                if can && now_serving.contains(&k) && !was.contains(&k) && !ramps.contains_key(&k) {
                    info!(service = %s.name, backend = %SocketAddr::from(k), slow_start = ?window, "backend came up: ramping its weight");
                    ramps.insert(
                        k,
                        Ramp {
                            since: now,
                            step: 0,
                        },
                    );
                }
            }
        }
        for b in s.backends.iter_mut() {
            let k = (b.address.to_canonical(), b.port);
            let Some(r) = ramps.get_mut(&k) else { continue };
            let step = steps(now, r.since);
            if step >= n {
                ramps.remove(&k);
                info!(service = %s.name, backend = %SocketAddr::from(k), weight = b.weight, "slow start over: full weight");
                continue;
            }
            r.step = step;
            b.weight = weight(b.weight, step, n);
        }
        if ramps.is_empty() {
            self.services.remove(&s.name);
        }
    }

    /// Forgets the ramps of service `name` (removed).
    pub fn forget(&mut self, name: &str) {
        self.services.remove(name);
    }

    /// Keeps the ramps of `services` only (a whole build: the others are gone).
    pub fn retain_services(&mut self, services: &[Service]) {
        if self.services.is_empty() {
            return;
        }
        let names: HashSet<&str> = services.iter().map(|s| s.name.as_str()).collect();
        self.services.retain(|n, _| names.contains(n.as_str()));
    }

    /// The services with a backend whose ramp is at another step at `now` than their table
    /// has (or is over), sorted.
    pub fn due(&self, now: Instant) -> Vec<String> {
        self.services
            .iter()
            .filter(|(_, m)| m.values().any(|r| steps(now, r.since) != r.step))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// When the next step of some ramp is due; `None` while no backend ramps.
    pub fn next(&self) -> Option<Instant> {
        self.services
            .values()
            .flat_map(|m| m.values())
            .map(|r| r.since + STEP * u32::try_from(r.step + 1).unwrap_or(u32::MAX))
            .min()
    }
}

/// The whole steps of [`STEP`] from `since` to `now`.
fn steps(now: Instant, since: Instant) -> u64 {
    (now.saturating_duration_since(since).as_millis() / STEP.as_millis()) as u64
}

/// The weight of a backend of configured weight `w` at step `k` of a ramp of `n` steps
/// (`k < n`): from [`START_PERCENT`] of `w` at step 0, linear, never below 1 (a weight of 0
/// would take the backend's flows away as a drain does).
pub fn weight(w: u32, k: u64, n: u64) -> u32 {
    let percent_n = START_PERCENT * n + (100 - START_PERCENT) * k;
    let scaled = u64::from(w) * percent_n / (100 * n);
    u32::try_from(scaled).unwrap_or(w).clamp(1, w.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_is_linear_from_a_tenth() {
        let w: Vec<u32> = (0..6).map(|k| weight(100, k, 6)).collect();
        assert_eq!(w, [10, 25, 40, 55, 70, 85]);
        assert_eq!(weight(1, 0, 30), 1, "never 0: that would drain it");
        assert_eq!(weight(65_535, 29, 30), 63_568, "65535 * 97 % rounded down");
        assert!((0..3600).all(|k| weight(100, k, 3600) <= 100));
    }
}
