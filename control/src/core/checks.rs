//! The health checks the core wants, and the health it was told.
//!
//! The core decides which backend is checked how (a service's `health_check`, for each of
//! its backends) and says so one check at a time; the checker reports state changes back.
//! A check that stops is forgotten; one whose settings change (a reload) goes on from the
//! health it had, as the checker's state does: a down backend stays down until the new
//! check passes `rise` times, rather than taking new flows again for a reload.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::IpAddr;

use strait_config::model::{HealthCheck, Service};

use super::{BackendKey, Effect};

/// The checks of one service, by backend (address, port).
pub type ServiceChecks = BTreeMap<(IpAddr, u16), HealthCheck>;

/// Checks wanted, and the backends reported down.
#[derive(Debug, Default)]
pub struct Checks {
    wanted: BTreeMap<String, ServiceChecks>,
    down: HashMap<String, HashSet<(IpAddr, u16)>>,
}

impl Checks {
    /// Whether backend (`address`, `port`) of `service` was reported down.
    pub fn is_down(&self, service: &str, address: IpAddr, port: u16) -> bool {
        self.down
            .get(service)
            .is_some_and(|d| d.contains(&(address, port)))
    }

    /// Whether the backend is reported down and `wanted` still checks it (with these
    /// settings or others): down in a table built after [`Checks::sync`] with `wanted`.
    pub fn stays_down(
        &self,
        wanted: &BTreeMap<String, ServiceChecks>,
        service: &str,
        address: IpAddr,
        port: u16,
    ) -> bool {
        let check = |c: &BTreeMap<String, ServiceChecks>| {
            c.get(service)
                .and_then(|m| m.get(&(address, port)))
                .cloned()
        };
        self.is_down(service, address, port) && check(wanted).is_some()
    }

    /// The check of backend (`address`, `port`) of `service`, if it is checked.
    pub fn check_of(&self, service: &str, address: IpAddr, port: u16) -> Option<&HealthCheck> {
        self.wanted.get(service)?.get(&(address, port))
    }

    /// Every check wanted.
    pub fn iter(&self) -> impl Iterator<Item = (BackendKey, &HealthCheck)> + '_ {
        self.wanted.iter().flat_map(|(s, m)| {
            m.iter()
                .map(move |(&(a, p), hc)| (BackendKey::new(s.clone(), a, p), hc))
        })
    }

    /// The names of the services with checks.
    pub fn services(&self) -> impl Iterator<Item = &String> + '_ {
        self.wanted.keys()
    }

    /// Makes service `name`'s checks `want` (none: the service is gone or unchecked): asks
    /// for the checks that stop, change or start, and forgets the health of those that
    /// stop. A changed check is started again with its new settings ([`Effect::StartCheck`]
    /// of a running check, which keeps its health).
    pub fn sync(&mut self, name: &str, want: ServiceChecks, effects: &mut VecDeque<Effect>) {
        let have = self.wanted.remove(name).unwrap_or_default();
        for backend in have.keys() {
            if !want.contains_key(backend) {
                self.forget(name, *backend);
                effects.push_back(Effect::StopCheck {
                    backend: BackendKey::new(name, backend.0, backend.1),
                });
            }
        }
        for (backend, check) in &want {
            if have.get(backend) != Some(check) {
                effects.push_back(Effect::StartCheck {
                    backend: BackendKey::new(name, backend.0, backend.1),
                    check: check.clone(),
                });
            }
        }
        if !want.is_empty() {
            self.wanted.insert(name.to_owned(), want);
        }
    }

    /// Takes a report: `backend` is `up` or not. Whether that changes what the core knows;
    /// a report of a backend not checked changes nothing.
    pub fn report(&mut self, backend: &BackendKey, up: bool) -> bool {
        let BackendKey {
            service,
            address,
            port,
        } = backend;
        let checked = self
            .wanted
            .get(service)
            .is_some_and(|m| m.contains_key(&(*address, *port)));
        if !checked {
            return false;
        }
        if up {
            let changed = self
                .down
                .get_mut(service)
                .is_some_and(|d| d.remove(&(*address, *port)));
            self.down.retain(|_, d| !d.is_empty());
            changed
        } else {
            self.down
                .entry(service.clone())
                .or_default()
                .insert((*address, *port))
        }
    }

    fn forget(&mut self, service: &str, backend: (IpAddr, u16)) {
        if let Some(d) = self.down.get_mut(service) {
            d.remove(&backend);
            if d.is_empty() {
                self.down.remove(service);
            }
        }
    }
}

/// The checks `services` want, per service and backend.
pub fn wanted(services: &[Service]) -> BTreeMap<String, ServiceChecks> {
    let mut want = BTreeMap::new();
    for s in services {
        if let Some(hc) = &s.health_check {
            let m: &mut ServiceChecks = want.entry(s.name.clone()).or_default();
            for b in &s.backends {
                m.insert((b.address, b.port), hc.clone());
            }
        }
    }
    want
}
