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
//! The control core follows next hops without a socket: what a read finds ([`Neighbours`]),
//! what it covers ([`Scope`]) and which next hops the table takes from the kernel
//! (`NextHops`) are the core's (`crate::core::hops`); this module makes the reads and
//! probes it asks for:
//!
//! | file | part |
//! |---|---|
//! | [`rtnl`] | the read: the neighbour table and routes over rtnetlink, whole or per next hop |
//! | this file | the backend interface, and the probe that makes the kernel resolve an address |
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

pub mod rtnl;

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::sync::{Mutex, PoisonError};

use strait_config::model::{Config, Role};
use tracing::warn;

use crate::core::{Neighbours, Scope};
pub use rtnl::{hop_entries, table, DUMP_ATTEMPTS};

/// Why the neighbours or routes of an interface could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading the neighbours and routes of interface {iface:?}: {call}: {source}")]
pub struct ReadError {
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
