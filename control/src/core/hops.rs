//! Next hops, pure: what a read of the kernel's neighbour table and routes finds
//! ([`Neighbours`]), what a read covers ([`Scope`]), and which next hops the table takes
//! from the kernel ([`NextHops`]): filled from a read, followed, and checked against later
//! reads. It reads and sends nothing: `crate::neigh` makes the reads the core asks for
//! ([`super::Effect::ReadNeighbours`]), and the next hops to probe are returned for the
//! core to turn into probe effects.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use ipnet::IpNet;
use strait_config::model::{MacAddr, Mode, Service};

/// What the kernel knows about reaching hosts through one interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Neighbours {
    /// Resolved neighbour entries: address to MAC.
    pub macs: HashMap<IpAddr, MacAddr>,
    /// The interface's routes: destination and gateway (`None`: on-link).
    pub routes: Vec<(IpNet, Option<IpAddr>)>,
    /// The interface's index (0: unknown).
    pub ifindex: u32,
    /// `None` for a read of the whole table. `Some(hops)` (sorted) for a read of these next
    /// hops only ([`Scope::Targets`]): `macs` holds those of them that are resolved, and
    /// says nothing of the table's other entries.
    pub only: Option<Vec<IpAddr>>,
}

impl Neighbours {
    /// The next hop towards `addr`: the gateway of the most specific route that covers
    /// it, else `addr` itself (on-link, or no route known).
    pub fn next_hop(&self, addr: IpAddr) -> IpAddr {
        self.routes
            .iter()
            .filter(|(net, _)| net.contains(&addr))
            .max_by_key(|(net, _)| net.prefix_len())
            .and_then(|(_, via)| *via)
            .unwrap_or(addr)
    }

    /// The next hop of backend target `target` (see [`Scope::Targets`]): [`Neighbours::next_hop`]
    /// when it may be routed, itself when not.
    pub fn hop_of(&self, (target, routed): (IpAddr, bool)) -> IpAddr {
        if routed {
            self.next_hop(target)
        } else {
            target
        }
    }

    /// The next hops of `targets`, sorted, once each.
    pub fn hops_of(&self, targets: &[(IpAddr, bool)]) -> Vec<IpAddr> {
        let mut hops: Vec<IpAddr> = targets.iter().map(|&t| self.hop_of(t)).collect();
        hops.sort();
        hops.dedup();
        hops
    }

    /// What a read of `targets` only ([`Scope::Targets`]) finds in this read of the whole
    /// table: its routes, and the entries of the targets' next hops.
    pub fn part(&self, targets: &[(IpAddr, bool)]) -> Self {
        let hops = self.hops_of(targets);
        Self {
            macs: hops
                .iter()
                .filter_map(|h| Some((*h, *self.macs.get(h)?)))
                .collect(),
            routes: self.routes.clone(),
            ifindex: self.ifindex,
            only: Some(hops),
        }
    }

    /// Takes newer read `read` in: one of the whole table replaces this; one of some next
    /// hops ([`Neighbours::only`]) sets or removes their entries and replaces the routes
    /// and the interface index, and leaves the other entries as they were. The work is that
    /// of the read's size, not of the table's.
    pub fn update(&mut self, read: Neighbours) {
        let Some(hops) = read.only else {
            *self = read;
            return;
        };
        for h in hops {
            match read.macs.get(&h) {
                Some(&m) => {
                    self.macs.insert(h, m);
                }
                None => {
                    self.macs.remove(&h);
                }
            }
        }
        self.routes = read.routes;
        if read.ifindex != 0 {
            self.ifindex = read.ifindex;
        }
    }
}

/// What a read of the kernel's tables ([`crate::core::Effect::ReadNeighbours`]) covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// The whole neighbour table of the backend interface, and its routes.
    All,
    /// The routes, and the neighbour entries of these backend targets' next hops only:
    /// each target is an address (the tunnel target in the tunnel modes) and whether it may
    /// be routed (`false` in `dsr-l2`, where a backend is its own next hop). Sorted, once
    /// each. The answer has [`Neighbours::only`] set.
    Targets(Vec<(IpAddr, bool)>),
}

/// Fills the MAC of every backend of `s` that has none from `neighbours`; returns the
/// next-hop addresses still unknown, and tells `seen` every such backend's target, whether it
/// is routed, its next hop and the MAC found (if any). The target is the tunnel target in the
/// tunnel modes and the backend's address otherwise; its next hop is the gateway of the route
/// that covers it, or the target itself on-link. `dsr-l2` backends are always their own next
/// hop (the frame keeps the VIP as destination, so a router on the way could not deliver it).
pub(crate) fn fill_one(
    s: &mut Service,
    neighbours: &Neighbours,
    mut seen: impl FnMut(IpAddr, bool, IpAddr, Option<MacAddr>),
) -> Vec<IpAddr> {
    let mut missing = Vec::new();
    let tunnel = s.mode.is_tunnel();
    // dsr-l2 keeps the VIP as destination: only a backend on the segment can take it.
    let routed = s.mode != Mode::DsrL2;
    for b in s.backends.iter_mut().filter(|b| b.mac.is_none()) {
        let target = if tunnel { b.tunnel_target() } else { b.address };
        let hop = neighbours.hop_of((target, routed));
        let mac = neighbours.macs.get(&hop).copied();
        seen(target, routed, hop, mac);
        match mac {
            Some(m) => b.mac = Some(m),
            None => missing.push(hop),
        }
    }
    missing.sort();
    missing.dedup();
    missing
}

/// The targets of the backends of `s` without a MAC, as [`fill_one`] looks them up: each
/// backend's address (the tunnel target in the tunnel modes) and whether it may be routed.
/// What a read of [`Scope::Targets`] is to cover for `s`.
pub fn targets(s: &Service) -> impl Iterator<Item = (IpAddr, bool)> + '_ {
    let tunnel = s.mode.is_tunnel();
    let routed = s.mode != Mode::DsrL2;
    s.backends.iter().filter(|b| b.mac.is_none()).map(move |b| {
        let target = if tunnel { b.tunnel_target() } else { b.address };
        (target, routed)
    })
}

/// A backend address (the tunnel target in the tunnel modes) whose next hop the table takes
/// from the kernel.
#[derive(Debug, Clone, Copy)]
struct Target {
    /// Its next hop when last filled in.
    hop: IpAddr,
    /// The MAC it was given; `None` while unresolved.
    mac: Option<MacAddr>,
    /// Backends of the followed services that use it.
    users: u32,
}

/// The next hops the table takes from the kernel, for backends without a configured MAC,
/// kept per backend target and service: the ones not resolved yet (probed, and looked at
/// again), and the MAC each resolved one was given. The kernel keeps its entries true
/// (ARP/ND, gratuitous ARP from a host whose MAC changed or a router that failed over, its
/// own traffic such as the health checks), so [`NextHops::recheck`] against a fresh read
/// tells when the table needs a refill: a target resolved, or its next hop (after a route
/// change too) now has another MAC.
#[derive(Debug, Default)]
pub struct NextHops {
    /// Per service, its backends' targets: (address, routed), once per backend.
    by_service: HashMap<String, Vec<(IpAddr, bool)>>,
    /// Every target of the followed services.
    targets: HashMap<(IpAddr, bool), Target>,
    /// The last read every target was checked against and found up to date; `None` when
    /// a fill happened since. The same read again changes nothing.
    checked: Option<Neighbours>,
    /// The routes every target's next hop was computed with; `None` when fills used
    /// different ones. While the routes stay these, a check needs no route lookups.
    routes: Option<Vec<(IpNet, Option<IpAddr>)>>,
    /// A target was given two MACs (or a MAC and none) by fills at different times: the
    /// services filled first hold the old one until a full refill.
    split: bool,
    /// The interface of the last read (0: unknown), for probes of link-local next hops.
    ifindex: u32,
}

impl NextHops {
    /// Fills the missing MACs of `services` from `neighbours` (by the rules of `fill_one`),
    /// and follows these services' targets from now on in place of what was followed for
    /// them before. Returns the next hops still unknown, sorted, once each over all these
    /// services: the caller probes them (`crate::neigh::probe`, on interface
    /// [`NextHops::ifindex`]).
    #[must_use = "the unresolved next hops are to be probed"]
    pub fn fill(&mut self, services: &mut [Service], neighbours: &Neighbours) -> Vec<IpAddr> {
        if neighbours.ifindex != 0 {
            self.ifindex = neighbours.ifindex;
        }
        // Next hops still unknown, over all these services: probed and said once each.
        let mut unresolved = BTreeSet::new();
        for s in services {
            self.forget(&s.name);
            let first = self.targets.is_empty();
            let mut keys = Vec::new();
            let (targets, split) = (&mut self.targets, &mut self.split);
            let missing = fill_one(s, neighbours, |target, routed, hop, mac| {
                keys.push((target, routed));
                let t = targets
                    .entry((target, routed))
                    .or_insert(Target { hop, mac, users: 0 });
                // Also when the earlier fill found none: its services lack the MAC this
                // fill found, and a recheck would see the target as resolved.
                *split |= t.users > 0 && t.mac != mac;
                t.hop = hop;
                t.mac = mac;
                t.users += 1;
            });
            unresolved.extend(missing);
            if !keys.is_empty() {
                // Every target's next hop was computed with these routes, or not all with
                // the same ones. (A service with every MAC configured read nothing.)
                if first {
                    self.routes = Some(neighbours.routes.clone());
                } else if self.routes.as_ref() != Some(&neighbours.routes) {
                    self.routes = None;
                }
                self.by_service.insert(s.name.clone(), keys);
                self.checked = None;
            }
        }
        if !unresolved.is_empty() {
            tracing::info!(missing = ?unresolved, "next-hop MACs not resolved yet; probing");
        }
        unresolved.into_iter().collect()
    }

    /// The interface of the last read that named one (0: none yet): where probes of
    /// link-local next hops leave.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The next hops of followed targets that are not resolved yet, sorted: their backends
    /// are in the table without a MAC, and [`NextHops::recheck`] refills once one resolves.
    pub fn unresolved(&self) -> BTreeSet<IpAddr> {
        self.targets
            .values()
            .filter(|t| t.mac.is_none())
            .map(|t| t.hop)
            .collect()
    }

    /// Stops following service `name` (removed, or about to be refilled).
    pub fn forget(&mut self, name: &str) {
        for key in self.by_service.remove(name).into_iter().flatten() {
            if let Some(t) = self.targets.get_mut(&key) {
                t.users -= 1;
                if t.users == 0 {
                    self.targets.remove(&key);
                }
            }
        }
    }

    /// Forgets everything, before a fill of every service.
    pub fn clear(&mut self) {
        self.by_service.clear();
        self.targets.clear();
        self.checked = None;
        self.routes = None;
        self.split = false;
    }

    /// Whether a target was given different MACs (or a MAC and none) by fills at different
    /// times: the services filled first hold the old one, and the next
    /// [`NextHops::recheck`] asks for a full refill.
    pub fn split(&self) -> bool {
        self.split
    }

    /// Whether a fresh read of the kernel's table can call for a rebuild: some backend takes
    /// its next hop from it.
    pub fn watching(&self) -> bool {
        !self.targets.is_empty() || self.split
    }

    /// The resolved next hops in use, sorted, to be probed so that the kernel re-validates
    /// the entries only the workers use: its own traffic never touches them, so they go `STALE` and may
    /// be garbage-collected, and a changed MAC would go unnoticed. A probe of a `STALE` entry
    /// makes the kernel confirm it (unicast ARP/ND), or resolve it anew when the host answers
    /// no more at the old MAC; [`NextHops::recheck`] then sees the change. Cilium refreshes
    /// its nodes' entries the same way, every 30 s by default.
    pub fn refresh(&self) -> Vec<IpAddr> {
        let hops: BTreeSet<IpAddr> = self
            .targets
            .values()
            .filter(|t| t.mac.is_some())
            .map(|t| t.hop)
            .collect();
        hops.into_iter().collect()
    }

    /// Why the table should be refilled, given a fresh read of the kernel's table: a target
    /// resolved, or its next hop (recomputed when the routes changed) now has another MAC.
    /// `None` when the table is up to date. An entry the kernel dropped (garbage-collected
    /// while only the workers used it) is no reason: its MAC is kept.
    pub fn recheck(&mut self, neighbours: &Neighbours) -> Option<String> {
        if self.split {
            return Some("a next hop was given two MACs by fills at different times".to_owned());
        }
        if self.checked.as_ref() == Some(neighbours) {
            return None;
        }
        if neighbours.ifindex != 0 {
            self.ifindex = neighbours.ifindex;
        }
        let routes_changed = self.routes.as_ref() != Some(&neighbours.routes);
        let mut resolved = BTreeSet::new();
        let mut moved = BTreeSet::new();
        for (&(target, routed), t) in &mut self.targets {
            if routed && routes_changed {
                t.hop = neighbours.next_hop(target);
            }
            let hop = t.hop;
            match (t.mac, neighbours.macs.get(&hop)) {
                (None, Some(_)) => {
                    resolved.insert(hop);
                }
                (Some(old), Some(&new)) if new != old => {
                    moved.insert(format!("{hop} {old} -> {new}"));
                }
                _ => {}
            }
        }
        if !resolved.is_empty() {
            let list: Vec<String> = resolved.iter().map(IpAddr::to_string).collect();
            return Some(format!("next-hop MACs resolved: {}", list.join(", ")));
        }
        if !moved.is_empty() {
            let list: Vec<String> = moved.into_iter().collect();
            return Some(format!("next-hop MACs changed: {}", list.join(", ")));
        }
        self.routes = Some(neighbours.routes.clone());
        self.checked = Some(neighbours.clone());
        None
    }
}
