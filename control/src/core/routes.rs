//! Which VIPs the gateway announces to its routers, and why not the others.
//!
//! A VIP is announced while the gateway claims it (its services are published and the
//! workers forward), one of its services has a backend that takes new flows (a Maglev
//! member: up, weight above zero, its next hop known), the gateway is not draining, and the
//! VIP is one `[gateway.bgp] announce` selects. A router then sends its traffic here only
//! while this gateway can serve it: a service whose backends are all down is withdrawn as
//! soon as its last backend's health check reaches `fall`, and is announced again when one
//! recovers.
//!
//! Followed per changed service, as [`super::vips`] is: a change of one service of ten
//! thousand looks at that one and its VIP.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use strait_config::model::{Bgp, Config, RouteAttrs};
use strait_dataplane::table::{Frontend, ServiceTable};

use super::event::{Changed, Route, RouteAttrMap, RouteMap};
use super::merge;
use super::vips::Vips;

/// The routes, and what they follow.
#[derive(Debug, Default)]
pub struct Routes {
    /// Each published service's VIP.
    of: HashMap<String, IpAddr>,
    /// The published services that have a backend taking new flows.
    serving: HashSet<String>,
    /// How many such services each VIP has.
    live: BTreeMap<IpAddr, u32>,
    draining: bool,
    /// The routes of the VIPs known to [`Vips`], shared with the driver.
    view: Arc<RouteMap>,
    /// The route attributes each VIP's services set, by service name (only services
    /// that set some).
    attrs_of: BTreeMap<IpAddr, BTreeMap<String, RouteAttrs>>,
    /// Those merged per VIP, for the VIPs that have a route; shared with the driver.
    attrs: Arc<RouteAttrMap>,
}

impl Routes {
    /// The routes now.
    pub fn view(&self) -> &Arc<RouteMap> {
        &self.view
    }

    /// The route attributes now.
    pub fn attrs(&self) -> &Arc<RouteAttrMap> {
        &self.attrs
    }

    /// Whether the gateway drains.
    pub fn draining(&self) -> bool {
        self.draining
    }

    /// Follows a table published for `changed` services of `config`, with `vips` already
    /// following it. Whether a route changed.
    pub fn follow(
        &mut self,
        changed: &Changed,
        config: &Config,
        file_len: usize,
        table: &ServiceTable,
        vips: &Vips,
    ) -> bool {
        let mut touched = BTreeSet::new();
        match changed {
            Changed::All => {
                self.of.clear();
                self.attrs_of.clear();
                self.serving.clear();
                self.live.clear();
                touched.extend(self.view.keys().copied());
                for s in &config.services {
                    self.set(&s.name, Some(s), table, &mut touched);
                }
            }
            Changed::Services(names) => {
                for n in names {
                    let s = merge::find(config, file_len, n);
                    self.set(n, s, table, &mut touched);
                }
            }
        }
        self.refresh(touched, vips, config.gateway.bgp.as_ref())
    }

    /// Re-derives every VIP's route (claiming started, draining started): whether one
    /// changed.
    pub fn refresh_all(&mut self, vips: &Vips, config: &Config) -> bool {
        let touched: BTreeSet<IpAddr> = self.view.keys().copied().chain(vips.known()).collect();
        self.refresh(touched, vips, config.gateway.bgp.as_ref())
    }

    /// Starts draining: every route goes.
    pub fn drain(&mut self) {
        self.draining = true;
    }

    /// Follows service `name` (`service` is its configuration, `None` when removed).
    fn set(
        &mut self,
        name: &str,
        service: Option<&strait_config::model::Service>,
        table: &ServiceTable,
        touched: &mut BTreeSet<IpAddr>,
    ) {
        if let Some(old) = self.of.remove(name) {
            touched.insert(old);
            if let Some(by_name) = self.attrs_of.get_mut(&old) {
                by_name.remove(name);
                if by_name.is_empty() {
                    self.attrs_of.remove(&old);
                }
            }
            if self.serving.remove(name) {
                if let Some(c) = self.live.get_mut(&old) {
                    *c -= 1;
                    if *c == 0 {
                        self.live.remove(&old);
                    }
                }
            }
        }
        let Some(s) = service else {
            return;
        };
        touched.insert(s.vip);
        self.of.insert(name.to_owned(), s.vip);
        if !s.route.is_empty() {
            self.attrs_of
                .entry(s.vip)
                .or_default()
                .insert(name.to_owned(), s.route.clone());
        }
        if serves(table, s) {
            self.serving.insert(name.to_owned());
            *self.live.entry(s.vip).or_default() += 1;
        }
    }

    fn refresh(&mut self, touched: BTreeSet<IpAddr>, vips: &Vips, bgp: Option<&Bgp>) -> bool {
        let mut changed = false;
        for vip in touched {
            let want = self.route(vip, vips, bgp);
            if self.view.get(&vip).copied() != want {
                let view = Arc::make_mut(&mut self.view);
                match want {
                    Some(r) => view.insert(vip, r),
                    None => view.remove(&vip),
                };
                changed = true;
            }
            let attrs = self
                .attrs_of
                .get(&vip)
                .filter(|_| want.is_some())
                .map(|by_name| {
                    let mut merged = RouteAttrs::default();
                    for a in by_name.values() {
                        merged.merge(a);
                    }
                    merged
                });
            if self.attrs.get(&vip) != attrs.as_ref() {
                let map = Arc::make_mut(&mut self.attrs);
                match attrs {
                    Some(a) => map.insert(vip, a),
                    None => map.remove(&vip),
                };
                changed = true;
            }
        }
        changed
    }

    /// The route `vip` should have: `None` for a VIP no published service has.
    fn route(&self, vip: IpAddr, vips: &Vips, bgp: Option<&Bgp>) -> Option<Route> {
        if !vips.has(vip) {
            return None;
        }
        Some(if !vips.claiming() {
            Route::NotForwarding
        } else if self.draining {
            Route::Draining
        } else if bgp.is_some_and(|b| !b.announces(vip)) {
            Route::NotSelected
        } else if self.live.contains_key(&vip) {
            Route::Announced
        } else {
            Route::NoServingBackend
        })
    }
}

/// Whether the table's service for `s` has a backend that takes new flows.
pub fn serves(table: &ServiceTable, s: &strait_config::model::Service) -> bool {
    let frontend = Frontend::new(
        s.vip,
        s.port,
        strait_dataplane::key::Proto(s.protocol.number()),
    );
    table
        .service_for(&frontend)
        .and_then(|i| table.services.get(i as usize))
        .is_some_and(|t| t.name == s.name && !t.members.is_empty())
}
