//! Passive health as the core decides it: failed connection attempts the workers saw
//! ([`super::Event::Passive`]), counted per backend over its service's window, and the
//! backends taken out of new flows for them.
//!
//! Decisions:
//!
//! - **Out means no new flows.** A backend taken out is built into the table as draining
//!   (its existing flows stay, it takes no new ones): a closed listener refuses new
//!   connections while the established ones finish, and cutting those would turn a refused
//!   connection into a broken one.
//! - **The active check brings it back**, with its first pass of a check that began after
//!   the backend was taken out ([`super::Effect::PassiveOut`] tells the checker so): a pass
//!   that began earlier says nothing of the backend as it is now. A backend whose check
//!   falls meanwhile is down as well, and comes back when the check rises. Without an
//!   active check nothing would bring it back, so passive health needs one (the
//!   configuration says so).
//! - **At most half of a service's backends** (rounded down) are out at once for passive
//!   health: a client can make a backend's failures (a flood that fills its accept queue),
//!   and passive health must not turn overload on one backend into a cascade over all of
//!   them. A verdict beyond it is logged and dropped.
//! - **The window is the last `failures` attempts**: each backend keeps the times of its
//!   last `failures` failed attempts (allocated only for a backend that fails), and is out
//!   when the oldest is within `window` of now.

use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;
use std::time::Instant;

use strait_config::model::{BackendState, PassiveHealth, Service};
use strait_dataplane::passive::Failure;

use super::BackendKey;

/// A backend taken out by passive health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Out {
    /// The failure that tipped it.
    pub cause: Failure,
    /// When.
    pub at: Instant,
}

/// The backends' recent failed attempts and those taken out.
#[derive(Debug, Default)]
pub struct Passive {
    /// Per backend, the times of its last failed attempts (at most its service's
    /// `failures`).
    recent: BTreeMap<BackendKey, VecDeque<Instant>>,
    out: BTreeMap<BackendKey, Out>,
}

impl Passive {
    /// Takes `n` failed attempts of `backend` for `cause` at `now`, under its service's
    /// settings `ph`: whether that takes it out (it was not out before). `out_of(service)`
    /// says how many of the service's backends are out now and how many it has, for the
    /// half-of-them bound.
    pub fn failed(
        &mut self,
        backend: &BackendKey,
        cause: Failure,
        n: u64,
        now: Instant,
        ph: PassiveHealth,
        backends: usize,
    ) -> bool {
        if n == 0 || self.out.contains_key(backend) {
            return false;
        }
        let k = ph.failures as usize;
        let recent = self.recent.entry(backend.clone()).or_default();
        for _ in 0..n.min(k as u64) {
            if recent.len() == k {
                recent.pop_front();
            }
            recent.push_back(now);
        }
        let tipped = recent.len() == k
            && recent
                .front()
                .is_some_and(|&first| now.saturating_duration_since(first) <= ph.window);
        if !tipped {
            return false;
        }
        let already = self
            .out
            .keys()
            .filter(|k| k.service == backend.service)
            .count();
        if already + 1 > backends / 2 {
            tracing::warn!(
                service = %backend.service,
                backend = %std::net::SocketAddr::new(backend.address, backend.port),
                out = already,
                backends,
                "passive health: {} failed connection attempts, but at most half of the service's backends are taken out; it stays in",
                ph.failures
            );
            recent.clear();
            return false;
        }
        self.recent.remove(backend);
        self.out.insert(backend.clone(), Out { cause, at: now });
        true
    }

    /// Brings `backend` back (its active check passed): whether it was out.
    pub fn back(&mut self, backend: &BackendKey) -> bool {
        self.recent.remove(backend);
        self.out.remove(backend).is_some()
    }

    /// Whether `backend` is out, and why.
    pub fn out(&self, backend: &BackendKey) -> Option<&Out> {
        self.out.get(backend)
    }

    /// Forgets every backend of `service` for which `keep(address, port)` is false (its
    /// check stopped, or it left): nothing would report the pass that brings such a backend
    /// back.
    pub fn retain(&mut self, service: &str, keep: impl Fn(IpAddr, u16) -> bool) {
        self.out
            .retain(|k, _| k.service != service || keep(k.address, k.port));
        self.recent
            .retain(|k, _| k.service != service || keep(k.address, k.port));
    }

    /// Makes the backends out for which `keep(backend)` holds draining in `services` (copies
    /// about to be built into a table): they keep their flows and take no new ones.
    pub fn apply(&self, services: &mut [Service], keep: impl Fn(&BackendKey) -> bool) {
        for s in services {
            if !self.out.keys().any(|k| k.service == s.name) {
                continue;
            }
            for b in &mut s.backends {
                let key = BackendKey::new(s.name.clone(), b.address, b.port);
                if self.out.contains_key(&key) && keep(&key) {
                    b.state = BackendState::Draining;
                }
            }
        }
    }
}
