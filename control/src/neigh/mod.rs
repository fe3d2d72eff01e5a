//! Next-hop MACs from the kernel's neighbour table.
//!
//! A backend configured without a MAC (every node the Kubernetes source produces, and any
//! static backend that leaves it out) is reached at the MAC the kernel's neighbour table holds
//! for its address on the backend-facing interface: the same ARP/ND the kernel does for its
//! own traffic, so nothing new speaks on the wire. An address not resolved yet is probed with
//! one UDP datagram to its discard port, which makes the kernel resolve it; the control core
//! refills the table when the answer arrives. Until then its frames are dropped and counted
//! (`no_next_hop`); health checks, which the kernel sends, usually resolve it first.
//!
//! A backend behind a router (a pod address routed via its node, `ip route add <podCIDR>
//! via <node>`) is reached at the router's MAC: the next hop is the gateway of the most
//! specific route of the interface that covers the address, as the kernel would choose.
//!
//! Three parts, so that the control core can follow next hops without a socket:
//!
//! | file | part |
//! |---|---|
//! | [`rtnl`] | the read: the neighbour table and routes over rtnetlink, whole or per next hop |
//! | [`hops`] | [`NextHops`], pure: which next hops the table takes from the kernel, which are still unresolved, and when a fresh read calls for a refill |
//! | this file | [`Neighbours`] (a read) and its [`Scope`], the backend interface, and the probe that makes the kernel resolve an address |
//!
//! The control core ([`crate::core`]) asks for a read and for probes; the control loop
//! ([`crate::run`]) does both. A read has a [`Scope`]:
//!
//! - [`Scope::All`], every second while some backend takes its next hop from the kernel
//!   (and with a reload): the whole table, which the core checks every followed next hop
//!   against. rtnetlink dumps (`RTM_GETNEIGH`, `RTM_GETROUTE` for IPv4 and IPv6).
//! - [`Scope::Targets`], when a Kubernetes change brings backends without a MAC: the routes
//!   (a dump, filtered by the kernel to the interface), then one `RTM_GETNEIGH` request per
//!   next hop of the changed backends ([`rtnl::hop_entries`]). A change then costs the same with
//!   10 neighbour entries as with the 1,000 of a large cluster's nodes on the segment,
//!   where a dump of the table grows with it. The answer ([`Neighbours::only`] set) updates
//!   the core's copy of the table for those next hops alone ([`Neighbours::update`]).
//!
//! Both are read on a socket opened in the calling thread's network namespace.

pub mod hops;
pub mod rtnl;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::sync::{Mutex, PoisonError};

use ipnet::IpNet;
use strait_config::model::{Config, MacAddr, Role};
use tracing::warn;

pub use hops::NextHops;
pub use rtnl::{hop_entries, table, DUMP_ATTEMPTS};

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

/// Why the neighbours or routes of an interface could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading the neighbours and routes of interface {iface:?}: {call}: {source}")]
pub struct Error {
    /// The interface.
    pub iface: String,
    /// What failed: `if_nametoindex`, opening the netlink socket, or one of the dumps.
    pub call: &'static str,
    /// Why.
    pub source: io::Error,
}

/// The neighbours and routes of the backend interface of `cfg` ([`backend_iface`]), none
/// when it has none: [`backend_read`] of the whole table.
pub fn backend_table(cfg: &Config) -> Neighbours {
    backend_read(cfg, &Scope::All)
}

/// The read `scope` asks for ([`table`], or [`hop_entries`] of its targets) on the backend interface
/// of `cfg` ([`backend_iface`]); an empty read of the whole table when it has none. When
/// the interface cannot be read, the error is logged, once until it changes or a read
/// succeeds, and the read is an empty one of the whole table: every backend without a MAC
/// stays unresolved (probed, its frames dropped and counted) until a later read succeeds.
pub fn backend_read(cfg: &Config, scope: &Scope) -> Neighbours {
    /// The error logged last, so that a lasting failure is not logged on every change.
    static LOGGED: Mutex<Option<String>> = Mutex::new(None);
    let Some(iface) = backend_iface(cfg) else {
        return Neighbours::default();
    };
    let read = match scope {
        Scope::All => table(&iface),
        Scope::Targets(targets) => hop_entries(&iface, targets),
    };
    let mut logged = LOGGED.lock().unwrap_or_else(PoisonError::into_inner);
    match read {
        Ok(n) => {
            *logged = None;
            n
        }
        Err(e) => {
            let e = e.to_string();
            if logged.as_deref() != Some(e.as_str()) {
                warn!("{e}; backends without a MAC stay unresolved until it can be read");
                *logged = Some(e);
            }
            Neighbours::default()
        }
    }
}

/// The interface facing the backends (role `backend` or `both`).
pub fn backend_iface(cfg: &Config) -> Option<String> {
    cfg.gateway
        .interfaces
        .iter()
        .find(|i| matches!(i.role, Role::Backend | Role::Both))
        .map(|i| i.name.clone())
}

/// Makes the kernel resolve `addr`: one empty datagram to its discard port (9). A link-local
/// IPv6 address is scoped to interface `ifindex` (the backend interface), which it is only
/// unique on.
pub fn probe(addr: IpAddr, ifindex: u32) {
    let (local, to): (SocketAddr, SocketAddr) = match addr {
        IpAddr::V4(a) => (
            (Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V4(SocketAddrV4::new(a, 9)),
        ),
        IpAddr::V6(a) => {
            let scope = if a.is_unicast_link_local() {
                ifindex
            } else {
                0
            };
            (
                (Ipv6Addr::UNSPECIFIED, 0).into(),
                SocketAddr::V6(SocketAddrV6::new(a, 9, 0, scope)),
            )
        }
    };
    if let Ok(s) = UdpSocket::bind(local) {
        let _ = s.send_to(&[], to);
    }
}

#[cfg(test)]
mod tests;
