//! Next-hop MACs from the kernel's neighbour table.
//!
//! A backend configured without a MAC (every node the Kubernetes source produces, and any
//! static backend that leaves it out) is reached at the MAC the kernel's neighbour table holds
//! for its address on the backend-facing interface: the same ARP/ND the kernel does for its
//! own traffic, so nothing new speaks on the wire. An address not resolved yet is probed with
//! one UDP datagram to its discard port, which makes the kernel resolve it; the control loop
//! rebuilds the table when the answer arrives. Until then its frames are dropped and counted
//! (`no_next_hop`); health checks, which the kernel sends, usually resolve it first.
//!
//! A backend behind a router (a pod address routed via its node, `ip route add <podCIDR>
//! via <node>`) is reached at the router's MAC: the next hop is the gateway of the most
//! specific route of the interface that covers the address, as the kernel would choose.
//!
//! The MACs are followed afterwards ([`NextHops`]): the control loop reads the table again
//! every second and rebuilds when a probed next hop resolved or a used one changed its MAC.
//!
//! Both are read with rtnetlink dumps (`RTM_GETNEIGH`, `RTM_GETROUTE` for IPv4 and IPv6) on
//! a socket opened in the calling thread's network namespace: tens of microseconds, where
//! the three `ip -j` processes this replaced took milliseconds on every Kubernetes change.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::sync::{Mutex, PoisonError};

use ipnet::IpNet;
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteNextHopFlags,
    RouteVia,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket};
use strait_config::model::{Config, MacAddr, Mode, Role, Service};
use tracing::warn;

/// What the kernel knows about reaching hosts through one interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Neighbours {
    /// Resolved neighbour entries: address to MAC.
    pub macs: HashMap<IpAddr, [u8; 6]>,
    /// The interface's routes: destination and gateway (`None`: on-link).
    pub routes: Vec<(IpNet, Option<IpAddr>)>,
    /// The interface's index (0: unknown).
    pub ifindex: u32,
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

/// `iface`'s resolved neighbours and its routes in the main table, IPv4 and IPv6, as the
/// calling thread's network namespace has them.
///
/// - Neighbours: the entries `ip neigh show dev IFACE` lists (`NOARP` ones, the multicast
///   mappings, are not) that have a 6-byte link-layer address and are not `FAILED` or
///   `INCOMPLETE`.
/// - Routes: those `ip -4|-6 route show dev IFACE` lists (table main, cached clones left
///   out; a route without destination is the default one, `0.0.0.0/0` or `::/0`), with
///   their gateway: `RTA_GATEWAY`, or an `RTA_VIA` of the other family (`via inet6
///   fe80::1`, which iproute2's JSON shows as `via`, not `gateway`).
/// - Multipath routes, which iproute2 6.1 leaves out of `show dev` altogether (its own
///   filter wants an `RTA_OIF`, which they lack): one with a live (not `dead`) next hop on
///   `iface` is listed with the gateway of the first such next hop. Any of them forwards
///   (the kernel spreads flows over all); listing none would make the route's addresses
///   look on-link and be resolved on the segment, where they are not. One without a next
///   hop on `iface` is left out. Routes that only name a nexthop object (`nhid`, with
///   `net.ipv4.nexthop_compat_mode=0`) are left out too.
///
/// # Errors
/// No such interface (`if_nametoindex`), no netlink socket, or a dump failing or
/// unreadable, or interrupted by changes [`DUMP_ATTEMPTS`] times in a row.
pub fn table(iface: &str) -> Result<Neighbours, Error> {
    read(iface, true)
}

/// [`table`], with the kernel filtering the dumps by interface and table (`kernel_filter`;
/// routes only where it can) or not (the tests check that both agree, as on a kernel before
/// 4.20).
fn read(iface: &str, kernel_filter: bool) -> Result<Neighbours, Error> {
    let fail = |call: &'static str| {
        move |source: io::Error| Error {
            iface: iface.to_owned(),
            call,
            source,
        }
    };
    let index =
        nix::net::if_::if_nametoindex(iface).map_err(|e| fail("if_nametoindex")(e.into()))?;
    let mut rtnl = Rtnl::open(kernel_filter).map_err(fail("socket(NETLINK_ROUTE)"))?;
    for _ in 0..DUMP_ATTEMPTS {
        let mut n = Neighbours {
            ifindex: index,
            ..Neighbours::default()
        };
        let mut whole = rtnl
            .dump(neighbours_request(index, kernel_filter), |m| {
                if let RouteNetlinkMessage::NewNeighbour(m) = m {
                    n.macs.extend(resolved(&m, index));
                }
            })
            .map_err(fail("RTM_GETNEIGH dump"))?;
        for (family, call) in [
            (AddressFamily::Inet, "RTM_GETROUTE dump (IPv4)"),
            (AddressFamily::Inet6, "RTM_GETROUTE dump (IPv6)"),
        ] {
            whole &= rtnl
                .dump(routes_request(family, index), |m| {
                    if let RouteNetlinkMessage::NewRoute(m) = m {
                        n.routes.extend(route(&m, index));
                    }
                })
                .map_err(fail(call))?;
        }
        if whole {
            return Ok(n);
        }
    }
    Err(fail("dumps")(io::Error::other(format!(
        "interrupted by concurrent changes {DUMP_ATTEMPTS} times in a row (NLM_F_DUMP_INTR)"
    ))))
}

/// How often [`table`] reads again when the kernel flags a dump as interrupted by a change
/// (`NLM_F_DUMP_INTR`: entries may be missing or doubled). A change is a rare event next to
/// a dump of tens of microseconds, so a third interrupted read in a row means something is
/// rewriting the tables continuously, which is worth an error.
pub const DUMP_ATTEMPTS: usize = 3;

/// The neighbours and routes of the backend interface of `cfg` ([`backend_iface`]), none
/// when it has none. When they cannot be read, the error is logged, once until it changes or
/// a read succeeds, and the table is empty: every backend without a MAC stays unresolved
/// (probed, its frames dropped and counted) until a later read succeeds.
pub fn backend_table(cfg: &Config) -> Neighbours {
    /// The error logged last, so that a lasting failure is not logged on every change.
    static LOGGED: Mutex<Option<String>> = Mutex::new(None);
    let Some(iface) = backend_iface(cfg) else {
        return Neighbours::default();
    };
    let read = table(&iface);
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

/// The main routing table's id (`RT_TABLE_MAIN`).
const MAIN: u32 = RouteHeader::RT_TABLE_MAIN as u32;

/// `RTM_GETNEIGH` dump, of interface `index` only if `filter` (`NDA_IFINDEX`, which the
/// kernel honours; [`resolved`] filters again).
fn neighbours_request(index: u32, filter: bool) -> RouteNetlinkMessage {
    let mut m = NeighbourMessage::default();
    if filter {
        m.attributes.push(NeighbourAttribute::IfIndex(index));
    }
    RouteNetlinkMessage::GetNeighbour(m)
}

/// `RTM_GETROUTE` dump of `family`'s main table, routes through interface `index`. With
/// strict checking the kernel filters on both (Linux 4.20+); [`route`] filters again.
fn routes_request(family: AddressFamily, index: u32) -> RouteNetlinkMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = family;
    m.header.table = RouteHeader::RT_TABLE_MAIN;
    m.attributes.push(RouteAttribute::Oif(index));
    RouteNetlinkMessage::GetRoute(m)
}

/// The address and MAC of neighbour entry `m` if it is on interface `index` and resolved:
/// listed by `ip neigh show` (a state other than `NOARP` and `NONE`, or learned externally)
/// with a 6-byte link-layer address and not `FAILED` or `INCOMPLETE`.
fn resolved(m: &NeighbourMessage, index: u32) -> Option<(IpAddr, [u8; 6])> {
    /// `NUD_INCOMPLETE | NUD_FAILED`: no usable link-layer address.
    const UNRESOLVED: u16 = 0x01 | 0x20;
    /// `NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_PERMANENT`: the states
    /// `ip neigh show` lists besides the unresolved ones.
    const LISTED: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x80;
    let state = u16::from(m.header.state);
    let listed = state & LISTED != 0 || m.header.flags.contains(NeighbourFlags::ExtLearned);
    if m.header.ifindex != index || state & UNRESOLVED != 0 || !listed {
        return None;
    }
    let mut addr = None;
    let mut mac = None;
    for a in &m.attributes {
        match a {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => {
                addr = Some(IpAddr::V4(*ip));
            }
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(ip)) => {
                addr = Some(IpAddr::V6(*ip));
            }
            NeighbourAttribute::LinkLayerAddress(l) => mac = <[u8; 6]>::try_from(&l[..]).ok(),
            _ => {}
        }
    }
    Some((addr?, mac?))
}

/// Route `m` as destination and gateway if it is in the main table and leaves through
/// interface `index`: its own output interface, or, for a multipath route, the first live
/// next hop on that interface (see [`table`]).
fn route(m: &RouteMessage, index: u32) -> Option<(IpNet, Option<IpAddr>)> {
    if m.header.flags.contains(RouteFlags::Cloned) {
        return None;
    }
    let mut table = u32::from(m.header.table);
    let mut dst = None;
    let mut oif = None;
    let mut hops = None;
    for a in &m.attributes {
        match a {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(d) => dst = Some(ip_of(d)?),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::MultiPath(h) => hops = Some(h),
            _ => {}
        }
    }
    if table != MAIN {
        return None;
    }
    let via = if oif == Some(index) {
        gateway(&m.attributes)
    } else {
        let hop = hops?
            .iter()
            .find(|h| h.interface_index == index && !h.flags.contains(RouteNextHopFlags::Dead))?;
        gateway(&hop.attributes)
    };
    let dst = match (dst, &m.header.address_family) {
        (Some(d), _) => d,
        (None, AddressFamily::Inet) => Ipv4Addr::UNSPECIFIED.into(),
        (None, AddressFamily::Inet6) => Ipv6Addr::UNSPECIFIED.into(),
        (None, _) => return None,
    };
    let net = IpNet::new(dst, m.header.destination_prefix_length).ok()?;
    Some((net, via))
}

/// The gateway among route or next-hop attributes `attrs`: `RTA_GATEWAY`, or `RTA_VIA` (a
/// gateway of the other family).
fn gateway(attrs: &[RouteAttribute]) -> Option<IpAddr> {
    attrs.iter().find_map(|a| match a {
        RouteAttribute::Gateway(g) => ip_of(g),
        RouteAttribute::Via(RouteVia::Inet(ip)) => Some(IpAddr::V4(*ip)),
        RouteAttribute::Via(RouteVia::Inet6(ip)) => Some(IpAddr::V6(*ip)),
        _ => None,
    })
}

/// An IPv4 or IPv6 route address as an [`IpAddr`] (not MPLS labels or other families).
fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(ip) => Some(IpAddr::V4(*ip)),
        RouteAddress::Inet6(ip) => Some(IpAddr::V6(*ip)),
        _ => None,
    }
}

/// A route netlink socket of the calling thread's network namespace, for dumps.
struct Rtnl {
    socket: Socket,
    /// The sequence number of the last request.
    seq: u32,
    /// Receive buffer. The kernel sizes a dump's datagrams after the reader's buffer, capped
    /// at 32 KiB (`netlink_recvmsg`'s `max_recvmsg_len`), so this size is never truncated and
    /// takes a dump of a few hundred routes in a datagram or two.
    buf: Vec<u8>,
}

impl Rtnl {
    /// Opens, binds and connects the socket; with `strict` checking of dump requests, so
    /// the kernel filters routes by table and interface. A kernel without it (before 4.20)
    /// dumps everything; the callers filter again.
    fn open(strict: bool) -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&netlink_sys::SocketAddr::new(0, 0))?;
        if strict {
            // Not fatal: the filtering is repeated on our side.
            let _ = socket.set_netlink_get_strict_chk(true);
        }
        Ok(Self {
            socket,
            seq: 0,
            buf: vec![0; 32 * 1024],
        })
    }

    /// Sends dump request `req` and passes each message of the answer to `each`. Whether
    /// the dump is whole: false when the kernel flagged it as interrupted by a change
    /// (`NLM_F_DUMP_INTR`).
    fn dump(
        &mut self,
        req: RouteNetlinkMessage,
        mut each: impl FnMut(RouteNetlinkMessage),
    ) -> io::Result<bool> {
        let bad = |e: String| io::Error::new(io::ErrorKind::InvalidData, e);
        self.seq += 1;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        header.sequence_number = self.seq;
        let mut req = NetlinkMessage::new(header, NetlinkPayload::from(req));
        req.finalize();
        let mut out = vec![0; req.buffer_len()];
        req.serialize(&mut out);
        self.socket.send(&out, 0)?;
        let mut whole = true;
        loop {
            let n = match self
                .socket
                .recv(&mut &mut self.buf[..], nix::libc::MSG_TRUNC)
            {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => r?,
            };
            if n > self.buf.len() {
                return Err(bad(format!(
                    "a {n}-byte datagram does not fit the {}-byte buffer",
                    self.buf.len()
                )));
            }
            let mut at = 0;
            while at < n {
                let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&self.buf[at..n])
                    .map_err(|e| bad(format!("malformed reply: {e}")))?;
                // At least a header long (`deserialize` checks), so this advances.
                // NLMSG_ALIGN: messages start at multiples of 4.
                at += (m.header.length as usize).next_multiple_of(4);
                if m.header.sequence_number != self.seq {
                    continue;
                }
                whole &= m.header.flags & NLM_F_DUMP_INTR == 0;
                match m.payload {
                    NetlinkPayload::InnerMessage(m) => each(m),
                    NetlinkPayload::Done(d) if d.code < 0 => {
                        return Err(io::Error::from_raw_os_error(-d.code))
                    }
                    NetlinkPayload::Done(_) => return Ok(whole),
                    NetlinkPayload::Error(e) if e.code.is_some() => return Err(e.to_io()),
                    NetlinkPayload::Error(_) => return Ok(whole),
                    _ => {}
                }
            }
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

/// Fills the MAC of every backend of `s` that has none from `neighbours`; returns the
/// next-hop addresses still unknown, and tells `seen` every such backend's target, whether it
/// is routed, its next hop and the MAC found (if any). The target is the tunnel target in the
/// tunnel modes and the backend's address otherwise; its next hop is the gateway of the route
/// that covers it, or the target itself on-link. `dsr-l2` backends are always their own next
/// hop (the frame keeps the VIP as destination, so a router on the way could not deliver it).
fn fill_one(
    s: &mut Service,
    neighbours: &Neighbours,
    mut seen: impl FnMut(IpAddr, bool, IpAddr, Option<[u8; 6]>),
) -> Vec<IpAddr> {
    let mut missing = Vec::new();
    let tunnel = s.mode.is_tunnel();
    // dsr-l2 keeps the VIP as destination: only a backend on the segment can take it.
    let routed = s.mode != Mode::DsrL2;
    for b in s.backends.iter_mut().filter(|b| b.mac.is_none()) {
        let target = if tunnel { b.tunnel_target() } else { b.address };
        let hop = if routed {
            neighbours.next_hop(target)
        } else {
            target
        };
        let mac = neighbours.macs.get(&hop).copied();
        seen(target, routed, hop, mac);
        match mac {
            Some(m) => b.mac = Some(MacAddr(m)),
            None => missing.push(hop),
        }
    }
    missing.sort();
    missing.dedup();
    missing
}

/// A backend address (the tunnel target in the tunnel modes) whose next hop the table takes
/// from the kernel.
#[derive(Debug, Clone, Copy)]
struct Target {
    /// Its next hop when last filled in.
    hop: IpAddr,
    /// The MAC it was given; `None` while unresolved.
    mac: Option<[u8; 6]>,
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
#[derive(Debug)]
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
    /// A target was given two MACs by fills at different times: the services filled
    /// first hold the old one until a full refill.
    split: bool,
    /// The interface of the last read (0: unknown), for probes of link-local next hops.
    ifindex: u32,
    /// Makes the kernel resolve an address ([`probe`]; the unit tests record instead).
    probe: fn(IpAddr, u32),
}

impl Default for NextHops {
    fn default() -> Self {
        Self {
            by_service: HashMap::new(),
            targets: HashMap::new(),
            checked: None,
            routes: None,
            split: false,
            ifindex: 0,
            probe,
        }
    }
}

impl NextHops {
    /// Fills the missing MACs of `services` from `neighbours` (by the rules of `fill_one`),
    /// probes the next hops still unknown, and follows these services' targets from now on
    /// in place of what was followed for them before.
    pub fn fill(&mut self, services: &mut [Service], neighbours: &Neighbours) {
        if neighbours.ifindex != 0 {
            self.ifindex = neighbours.ifindex;
        }
        // Next hops still unknown, over all these services: probed and said once each.
        let mut unresolved = std::collections::BTreeSet::new();
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
                *split |= t.users > 0 && t.mac.is_some() && t.mac != mac;
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
        for &a in &unresolved {
            (self.probe)(a, self.ifindex);
        }
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

    /// Whether a fresh read of the kernel's table can call for a rebuild: some backend takes
    /// its next hop from it.
    pub fn watching(&self) -> bool {
        !self.targets.is_empty() || self.split
    }

    /// Probes every resolved next hop in use, so that the kernel re-validates the entries
    /// only the workers use: its own traffic never touches them, so they go `STALE` and may
    /// be garbage-collected, and a changed MAC would go unnoticed. A probe of a `STALE` entry
    /// makes the kernel confirm it (unicast ARP/ND), or resolve it anew when the host answers
    /// no more at the old MAC; [`NextHops::recheck`] then sees the change. Cilium refreshes
    /// its nodes' entries the same way, every 30 s by default.
    pub fn refresh(&self) {
        let hops: std::collections::HashSet<IpAddr> = self
            .targets
            .values()
            .filter(|t| t.mac.is_some())
            .map(|t| t.hop)
            .collect();
        for hop in hops {
            (self.probe)(hop, self.ifindex);
        }
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
        let mut resolved = std::collections::BTreeSet::new();
        let mut moved = std::collections::BTreeSet::new();
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
                    moved.insert(format!("{hop} {} -> {}", MacAddr(old), MacAddr(new)));
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
mod tests {
    use super::*;

    thread_local! {
        static PROBED: std::cell::RefCell<Vec<IpAddr>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// A [`NextHops`] that records its probes instead of sending them.
    fn recording() -> NextHops {
        NextHops {
            probe: |a, _| PROBED.with(|p| p.borrow_mut().push(a)),
            ..NextHops::default()
        }
    }

    fn web(backends: &[(&str, Option<&str>)]) -> Service {
        let list: Vec<String> = backends
            .iter()
            .map(|(a, mac)| match mac {
                Some(m) => format!("{{ address = \"{a}\", port = 80, mac = \"{m}\" }}"),
                None => format!("{{ address = \"{a}\", port = 80 }}"),
            })
            .collect();
        let cfg = strait_config::parse(&format!(
            "[[gateway.interfaces]]\nname = \"eth0\"\nqueues = [0]\n[[services]]\nname = \"web\"\n\
             vip = \"203.0.113.10\"\nport = 80\nbackends = [{}]\n",
            list.join(", ")
        ))
        .unwrap();
        cfg.services.into_iter().next().unwrap()
    }

    fn macs(entries: &[(&str, u8)]) -> Neighbours {
        Neighbours {
            macs: entries
                .iter()
                .map(|(a, m)| (a.parse().unwrap(), [2, 0, 0, 0, 1, *m]))
                .collect(),
            ..Neighbours::default()
        }
    }

    /// `macs`, and the routes `(prefix, gateway)`.
    fn routed(entries: &[(&str, u8)], routes: &[(&str, &str)]) -> Neighbours {
        Neighbours {
            routes: routes
                .iter()
                .map(|(net, via)| (net.parse().unwrap(), Some(addr(via))))
                .collect(),
            ..macs(entries)
        }
    }

    /// `web` in `nat` mode: its backends may sit behind a router.
    fn nat(backends: &[&str]) -> Service {
        let mut s = web(&backends.iter().map(|a| (*a, None)).collect::<Vec<_>>());
        s.mode = Mode::Nat;
        s
    }

    fn addr(a: &str) -> IpAddr {
        a.parse().unwrap()
    }

    #[test]
    fn next_hops_ask_for_a_rebuild_when_a_mac_changes_or_a_probe_resolves() {
        let b = "198.51.100.11";
        let c = "198.51.100.12";
        let mut hops = recording();
        assert!(!hops.watching(), "nothing taken from the kernel yet");
        let mut svc = [web(&[(b, None), (c, None)])];
        hops.fill(&mut svc, &macs(&[(b, 0x11)]));
        assert_eq!(svc[0].backends[0].mac, Some(MacAddr([2, 0, 0, 0, 1, 0x11])));
        assert_eq!(svc[0].backends[1].mac, None);
        assert_eq!(
            PROBED.with(|p| p.take()),
            vec![addr(c)],
            "the unknown one is probed"
        );
        assert!(hops.watching());
        // Nothing new: no rebuild.
        assert_eq!(hops.recheck(&macs(&[(b, 0x11)])), None);
        // The probe answered.
        let why = hops.recheck(&macs(&[(b, 0x11), (c, 0x12)])).unwrap();
        assert!(why.contains("resolved") && why.contains(c), "{why}");
        let mut svc = [web(&[(b, None), (c, None)])];
        hops.forget("web");
        hops.fill(&mut svc, &macs(&[(b, 0x11), (c, 0x12)]));
        assert!(PROBED.with(|p| p.take()).is_empty());
        assert_eq!(hops.recheck(&macs(&[(b, 0x11), (c, 0x12)])), None);
        // A backend's MAC changed (a new NIC; its gratuitous ARP updated the kernel's entry).
        let why = hops.recheck(&macs(&[(b, 0x11), (c, 0x99)])).unwrap();
        assert!(
            why.contains("changed") && why.contains("02:00:00:00:01:12 -> 02:00:00:00:01:99"),
            "{why}"
        );
        // An entry the kernel dropped keeps its MAC: no rebuild.
        assert_eq!(hops.recheck(&macs(&[(b, 0x11)])), None);
        // The refresh probes every next hop in use, so that the kernel re-validates them.
        hops.refresh();
        let mut probed = PROBED.with(|p| p.take());
        probed.sort();
        assert_eq!(probed, vec![addr(b), addr(c)]);
        // Once the service is gone, its next hops are not followed or probed any more.
        hops.forget("web");
        assert!(!hops.watching());
        hops.refresh();
        assert!(PROBED.with(|p| p.take()).is_empty());
        // A configured MAC is never the kernel's business.
        let mut fixed = recording();
        let mut svc = [web(&[(b, Some("02:00:00:00:02:11"))])];
        fixed.fill(&mut svc, &macs(&[(b, 0x11)]));
        assert_eq!(svc[0].backends[0].mac, Some(MacAddr([2, 0, 0, 0, 2, 0x11])));
        assert!(!fixed.watching());
    }

    #[test]
    fn a_next_hop_several_services_lack_is_probed_once() {
        let c = "198.51.100.12";
        let mut hops = recording();
        let mut svcs = [web(&[(c, None)]), web(&[(c, None)])];
        svcs[1].name = "api".to_owned();
        hops.fill(&mut svcs, &macs(&[]));
        assert_eq!(PROBED.with(|p| p.take()), vec![addr(c)]);
    }

    #[test]
    fn next_hops_follow_route_changes() {
        let pod = "198.51.100.50";
        let mut hops = recording();
        // The pod's address arrives before the route to its node: it looks on-link, is
        // probed and stays unresolved.
        let mut svc = [nat(&[pod])];
        hops.fill(&mut svc, &macs(&[]));
        assert_eq!(PROBED.with(|p| p.take()), vec![addr(pod)]);
        assert_eq!(hops.recheck(&macs(&[])), None);
        // The route via node 192.0.2.7 appears, the node being resolved: refill.
        let via7 = routed(&[("192.0.2.7", 7)], &[("198.51.100.0/24", "192.0.2.7")]);
        let why = hops.recheck(&via7).unwrap();
        assert!(
            why.contains("resolved") && why.contains("192.0.2.7"),
            "{why}"
        );
        hops.clear();
        let mut svc = [nat(&[pod])];
        hops.fill(&mut svc, &via7);
        assert_eq!(svc[0].backends[0].mac, Some(MacAddr([2, 0, 0, 0, 1, 7])));
        assert_eq!(hops.recheck(&via7), None);
        assert_eq!(hops.recheck(&via7), None, "the same read again");
        // The route moves to node 192.0.2.8 (another MAC): refill.
        let via8 = routed(
            &[("192.0.2.7", 7), ("192.0.2.8", 8)],
            &[("198.51.100.0/24", "192.0.2.8")],
        );
        let why = hops.recheck(&via8).unwrap();
        assert!(
            why.contains("changed")
                && why.contains("192.0.2.8 02:00:00:00:01:07 -> 02:00:00:00:01:08"),
            "{why}"
        );
        // A route change that keeps the MAC (another address of the same router) is none.
        let same = routed(
            &[("192.0.2.7", 7), ("192.0.2.9", 7)],
            &[("198.51.100.0/24", "192.0.2.9")],
        );
        assert_eq!(hops.recheck(&same), None);
        // ... and the new router is followed from then on, with no route change.
        let why = hops
            .recheck(&routed(
                &[("192.0.2.7", 7), ("192.0.2.9", 9)],
                &[("198.51.100.0/24", "192.0.2.9")],
            ))
            .unwrap();
        assert!(
            why.contains("192.0.2.9 02:00:00:00:01:07 -> 02:00:00:00:01:09"),
            "{why}"
        );
    }

    #[test]
    fn a_next_hop_filled_with_two_macs_asks_for_a_full_refill() {
        let b = "198.51.100.11";
        let mut hops = recording();
        let mut first = [web(&[(b, None)])];
        hops.fill(&mut first, &macs(&[(b, 0x11)]));
        // Another service filled later, after the kernel learnt a new MAC: the first still
        // holds the old one, though the recorded MAC is the kernel's.
        let mut second = [web(&[(b, None)])];
        second[0].name = "api".to_owned();
        hops.fill(&mut second, &macs(&[(b, 0x22)]));
        assert!(hops.recheck(&macs(&[(b, 0x22)])).is_some());
        hops.clear();
        hops.fill(&mut first, &macs(&[(b, 0x22)]));
        assert_eq!(hops.recheck(&macs(&[(b, 0x22)])), None);
    }

    /// Fills every service of `cfg`; the next hops still unknown, sorted.
    fn fill(cfg: &mut Config, neighbours: &Neighbours) -> Vec<IpAddr> {
        let mut missing: Vec<IpAddr> = cfg
            .services
            .iter_mut()
            .flat_map(|s| fill_one(s, neighbours, |_, _, _, _| {}))
            .collect();
        missing.sort();
        missing.dedup();
        missing
    }
    use std::process::Command;
    use std::time::Instant;

    use strait_testkit::harness::Netns;
    use strait_testkit::privileged as gate;

    /// Root and iproute2 (see `strait_testkit::privileged`).
    fn privileged(test: &str) -> bool {
        gate::privileged(test, &[gate::IP])
    }

    /// What this module read before netlink, kept as the oracle the netlink read is checked
    /// against: iproute2's `ip -j neigh show dev IFACE` and `ip -j -4|-6 route show dev
    /// IFACE`, run in the calling thread's network namespace.
    fn ip_table(iface: &str) -> Neighbours {
        let run = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().expect("run ip");
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            out.stdout
        };
        let mut routes = parse_routes(&run(&["-j", "-4", "route", "show", "dev", iface]), false);
        routes.extend(parse_routes(
            &run(&["-j", "-6", "route", "show", "dev", iface]),
            true,
        ));
        Neighbours {
            macs: parse(&run(&["-j", "neigh", "show", "dev", iface])),
            routes,
            ifindex: nix::net::if_::if_nametoindex(iface).unwrap_or(0),
        }
    }

    /// Routes of `ip -j route show` output: `dst` (`default`, a prefix, or a host) and the
    /// `gateway` if any.
    fn parse_routes(json: &[u8], v6: bool) -> Vec<(IpNet, Option<IpAddr>)> {
        let v: serde_json::Value = serde_json::from_slice(json).unwrap_or_default();
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| {
                let dst = r["dst"].as_str()?;
                let net: IpNet = match dst {
                    "default" if v6 => "::/0".parse().ok()?,
                    "default" => "0.0.0.0/0".parse().ok()?,
                    d if d.contains('/') => d.parse().ok()?,
                    d => IpNet::from(d.parse::<IpAddr>().ok()?),
                };
                let via = r["gateway"].as_str().and_then(|g| g.parse().ok());
                Some((net, via))
            })
            .collect()
    }

    /// The resolved entries of `ip -j neigh` output: those with a link-layer address and
    /// not `FAILED` or `INCOMPLETE`.
    fn parse(json: &[u8]) -> HashMap<IpAddr, [u8; 6]> {
        let v: serde_json::Value = serde_json::from_slice(json).unwrap_or_default();
        v.as_array()
            .into_iter()
            .flatten()
            .filter(|n| {
                let states = n["state"].as_array().cloned().unwrap_or_default();
                !states.iter().any(|s| s == "FAILED" || s == "INCOMPLETE")
            })
            .filter_map(|n| {
                let ip: IpAddr = n["dst"].as_str()?.parse().ok()?;
                let mac: MacAddr = n["lladdr"].as_str()?.parse().ok()?;
                Some((ip, mac.0))
            })
            .collect()
    }

    /// A namespace of its own (deleted on drop, also when the test fails) with veth pair
    /// `v0`/`v1`, both ends up: `v0` with 198.51.100.1/24 and 2001:db8:1::1/64, `v1` with
    /// 192.0.2.1/25 and 2001:db8:9::1/64.
    fn bed(tag: &str) -> Netns {
        let ns = Netns::add(&format!("strait-{tag}-{}", std::process::id()));
        for cmd in [
            "link set lo up",
            "link add v0 type veth peer name v1",
            "link set v0 up",
            "link set v1 up",
            "addr add 198.51.100.1/24 dev v0",
            "addr add 2001:db8:1::1/64 dev v0 nodad",
            "addr add 192.0.2.1/25 dev v1",
            "addr add 2001:db8:9::1/64 dev v1 nodad",
        ] {
            ip(&ns, cmd);
        }
        ns
    }

    /// `ip -n NS CMD`, which must succeed.
    fn ip(ns: &Netns, cmd: &str) {
        let out = Command::new("ip")
            .args(["-n", ns.name()])
            .args(cmd.split_whitespace())
            .output()
            .expect("run ip");
        assert!(
            out.status.success(),
            "ip -n {} {cmd}: {}",
            ns.name(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn sorted(mut routes: Vec<(IpNet, Option<IpAddr>)>) -> Vec<(IpNet, Option<IpAddr>)> {
        routes.sort();
        routes
    }

    #[test]
    fn a_link_local_probe_leaves_by_the_backend_interface() {
        if !privileged("neigh::a_link_local_probe_leaves_by_the_backend_interface") {
            return;
        }
        let ns = bed("ll");
        // fe80::/64 is on every interface: only the scope says which link is meant.
        Netns::run_in(&ns, || {
            let index = |dev| nix::net::if_::if_nametoindex(dev).unwrap();
            probe("fe80::99".parse().unwrap(), index("v1"));
            probe("fe80::98".parse().unwrap(), index("v0"));
        });
        let entries = |dev: &str| {
            let out = Command::new("ip")
                .args(["-n", ns.name(), "-6", "neigh", "show", "dev", dev])
                .output()
                .expect("run ip");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let deadline = Instant::now() + std::time::Duration::from_secs(3);
        while !(entries("v1").contains("fe80::99") && entries("v0").contains("fe80::98"))
            && Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let (v0, v1) = (entries("v0"), entries("v1"));
        assert!(
            v1.contains("fe80::99") && !v0.contains("fe80::99"),
            "v0:\n{v0}\nv1:\n{v1}"
        );
        assert!(
            v0.contains("fe80::98") && !v1.contains("fe80::98"),
            "v0:\n{v0}\nv1:\n{v1}"
        );
    }

    #[test]
    fn reads_neighbours_and_routes_as_iproute2_lists_them() {
        if !privileged("neigh::reads_neighbours_and_routes_as_iproute2_lists_them") {
            return;
        }
        let ns = bed("nb");
        for cmd in [
            // Resolved on v0: listed.
            "neigh add 198.51.100.11 lladdr 02:00:00:00:01:11 dev v0 nud permanent",
            "neigh add 198.51.100.12 lladdr 02:00:00:00:01:12 dev v0 nud reachable",
            "neigh add 198.51.100.13 lladdr 02:00:00:00:01:13 dev v0 nud stale",
            "neigh add 2001:db8:1::11 lladdr 02:00:00:00:01:21 dev v0 nud permanent",
            "neigh add 2001:db8:1::12 lladdr 02:00:00:00:01:22 dev v0 router nud reachable",
            "neigh add fe80::1 lladdr 02:00:00:00:01:fe dev v0 nud permanent",
            // Unresolved, or not listed by ip (NOARP), or on v1: left out.
            "neigh add 198.51.100.14 dev v0 nud failed",
            "neigh add 198.51.100.15 dev v0 nud incomplete",
            "neigh add 198.51.100.16 lladdr 02:00:00:00:01:16 dev v0 nud noarp",
            "neigh add 2001:db8:1::14 dev v0 nud failed",
            "neigh add 192.0.2.11 lladdr 02:00:00:00:02:11 dev v1 nud permanent",
            "neigh add 2001:db8:9::11 lladdr 02:00:00:00:02:21 dev v1 nud permanent",
            // Routes of v0 in the main table: listed.
            "route add default via 198.51.100.254 dev v0",
            "route add 203.0.113.64/28 via 198.51.100.11",
            "route add 203.0.113.99/32 via 198.51.100.12",
            "route add 203.0.113.100/32 dev v0",
            "-6 route add default via 2001:db8:1::fe dev v0",
            "-6 route add 2001:db8:2::/48 via 2001:db8:1::11",
            "-6 route add 2001:db8:3::1/128 via fe80::1 dev v0",
            "-6 route add 2001:db8:4::/48 dev v0",
            // Listed too, unlike ip's JSON: an IPv4 route via an IPv6 gateway, multipath
            // routes with a next hop on v0.
            "route add 203.0.113.200/32 via inet6 fe80::1 dev v0",
            "route add 203.0.113.0/27 nexthop via 192.0.2.12 dev v1 nexthop via 198.51.100.13 dev v0",
            "-6 route add 2001:db8:5::/48 nexthop via 2001:db8:9::12 dev v1 nexthop via 2001:db8:1::13 dev v0",
            // Another table, another interface, multipath without v0: left out.
            "route add 203.0.113.128/26 via 198.51.100.11 table 100",
            "-6 route add 2001:db8:6::/48 via 2001:db8:1::11 table 100",
            "route add 203.0.113.192/26 via 192.0.2.11",
            "-6 route add 2001:db8:8::/48 via 2001:db8:9::11",
            "route add 203.0.113.32/27 nexthop via 192.0.2.12 dev v1 nexthop via 192.0.2.13 dev v1",
        ] {
            ip(&ns, cmd);
        }
        let (read, unfiltered, oracle, on_v1) = Netns::run_in(&ns, || {
            (
                table("v0"),
                super::read("v0", false),
                ip_table("v0"),
                table("v1"),
            )
        });
        let read = read.unwrap();
        let unfiltered = unfiltered.unwrap();

        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        let mac = |last: u8| [2, 0, 0, 0, 1, last];
        let macs: HashMap<IpAddr, [u8; 6]> = [
            (ip("198.51.100.11"), mac(0x11)),
            (ip("198.51.100.12"), mac(0x12)),
            (ip("198.51.100.13"), mac(0x13)),
            (ip("2001:db8:1::11"), mac(0x21)),
            (ip("2001:db8:1::12"), mac(0x22)),
            (ip("fe80::1"), mac(0xfe)),
        ]
        .into();
        let listed_by_ip = vec![
            (net("0.0.0.0/0"), Some(ip("198.51.100.254"))),
            (net("198.51.100.0/24"), None),
            (net("203.0.113.64/28"), Some(ip("198.51.100.11"))),
            (net("203.0.113.99/32"), Some(ip("198.51.100.12"))),
            (net("203.0.113.100/32"), None),
            (net("::/0"), Some(ip("2001:db8:1::fe"))),
            (net("2001:db8:1::/64"), None),
            (net("fe80::/64"), None),
            (net("2001:db8:2::/48"), Some(ip("2001:db8:1::11"))),
            (net("2001:db8:3::1/128"), Some(ip("fe80::1"))),
            (net("2001:db8:4::/48"), None),
        ];
        let mut routes = listed_by_ip.clone();
        routes.extend([
            (net("203.0.113.200/32"), Some(ip("fe80::1"))),
            (net("203.0.113.0/27"), Some(ip("198.51.100.13"))),
            (net("2001:db8:5::/48"), Some(ip("2001:db8:1::13"))),
        ]);
        assert_eq!(read.macs, macs);
        assert_eq!(sorted(read.routes.clone()), sorted(routes));
        assert_eq!(unfiltered.macs, read.macs, "without the kernel's filtering");
        assert_eq!(
            sorted(unfiltered.routes),
            sorted(read.routes.clone()),
            "without the kernel's filtering"
        );

        // iproute2 agrees, but for the differences `table` documents: it drops the multipath
        // routes and its JSON has no `gateway` for a `via inet6` route.
        assert_eq!(oracle.macs, read.macs, "neighbours as iproute2 lists them");
        let mut ip_view = listed_by_ip;
        ip_view.push((net("203.0.113.200/32"), None));
        assert_eq!(
            sorted(oracle.routes),
            sorted(ip_view),
            "routes as iproute2 lists them"
        );

        // The other interface has its own.
        let on_v1 = on_v1.unwrap();
        assert_eq!(
            on_v1.macs,
            [
                (ip("192.0.2.11"), [2, 0, 0, 0, 2, 0x11]),
                (ip("2001:db8:9::11"), [2, 0, 0, 0, 2, 0x21])
            ]
            .into()
        );
        assert!(on_v1
            .routes
            .contains(&(net("203.0.113.32/27"), Some(ip("192.0.2.12")))));
        assert!(on_v1
            .routes
            .contains(&(net("203.0.113.0/27"), Some(ip("192.0.2.12")))));
        assert!(!on_v1
            .routes
            .iter()
            .any(|(n, _)| *n == net("203.0.113.64/28")));

        // And the next hops follow: through the multipath route's v0 router, the IPv6 one.
        assert_eq!(read.next_hop(ip("203.0.113.5")), ip("198.51.100.13"));
        assert_eq!(read.next_hop(ip("203.0.113.200")), ip("fe80::1"));
        assert_eq!(read.next_hop(ip("2001:db8:2::7")), ip("2001:db8:1::11"));
        assert_eq!(read.next_hop(ip("2001:db8:1::7")), ip("2001:db8:1::7"));
    }

    #[test]
    fn fills_known_macs_and_lists_the_rest() {
        let mut cfg = strait_config::parse(
            r#"
[[gateway.interfaces]]
name = "eth0"
queues = [0]
[[services]]
name = "web"
vip = "203.0.113.10"
port = 80
backends = [{ address = "198.51.100.11", port = 80 }, { address = "198.51.100.12", port = 80 },
            { address = "198.51.100.13", port = 80, mac = "02:00:00:00:01:13" }]
[[services]]
name = "tun"
vip = "203.0.113.11"
port = 80
mode = "dsr-ipip"
backends = [{ address = "198.51.100.14", port = 80, tunnel = "198.51.100.11" }]
"#,
        )
        .unwrap();
        let known = Neighbours {
            macs: [("198.51.100.11".parse().unwrap(), [2, 0, 0, 0, 1, 0x11])].into(),
            ..Neighbours::default()
        };
        let missing = fill(&mut cfg, &known);
        assert_eq!(missing, vec!["198.51.100.12".parse::<IpAddr>().unwrap()]);
        assert_eq!(
            cfg.services[0].backends[0].mac,
            Some(MacAddr([2, 0, 0, 0, 1, 0x11]))
        );
        assert_eq!(
            cfg.services[0].backends[2].mac,
            Some(MacAddr([2, 0, 0, 0, 1, 0x13])),
            "configured MAC kept"
        );
        assert_eq!(
            cfg.services[1].backends[0].mac,
            Some(MacAddr([2, 0, 0, 0, 1, 0x11])),
            "tunnel target's MAC"
        );
        assert_eq!(backend_iface(&cfg).as_deref(), Some("eth0"));
    }

    #[test]
    fn parses_ip_neigh_json_keeping_resolved_entries_only() {
        // `ip -j neigh show dev eth0` as iproute2 6.1 prints it.
        let json = br#"[{"dst":"198.51.100.11","lladdr":"02:00:00:00:01:11","state":["REACHABLE"]},
            {"dst":"198.51.100.12","lladdr":"02:00:00:00:01:12","state":["STALE"]},
            {"dst":"198.51.100.13","state":["FAILED"]},
            {"dst":"198.51.100.14","state":["INCOMPLETE"]},
            {"dst":"2001:db8:b::11","lladdr":"02:00:00:00:01:11","router":null,"state":["DELAY"]}]"#;
        let t = parse(json);
        assert_eq!(t.len(), 3, "{t:?}");
        assert_eq!(
            t[&"198.51.100.12".parse::<IpAddr>().unwrap()],
            [2, 0, 0, 0, 1, 0x12]
        );
        assert!(t.contains_key(&"2001:db8:b::11".parse::<IpAddr>().unwrap()));
        assert!(parse(b"not json").is_empty());
    }

    #[test]
    fn routed_backends_are_reached_through_their_gateway() {
        // `ip -j -4 route show dev eth0` as iproute2 6.1 prints it, with a pod CIDR routed
        // via its node.
        let json = br#"[{"dst":"default","gateway":"198.51.100.254","flags":[]},
            {"dst":"198.51.100.0/24","protocol":"kernel","scope":"link","prefsrc":"198.51.100.1","flags":[]},
            {"dst":"203.0.113.64/28","gateway":"198.51.100.11","flags":[]},
            {"dst":"203.0.113.99","gateway":"198.51.100.12","flags":[]}]"#;
        let n = Neighbours {
            macs: [("198.51.100.11".parse().unwrap(), [2, 0, 0, 0, 1, 0x11])].into(),
            routes: parse_routes(json, false),
            ..Neighbours::default()
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(n.routes.len(), 4);
        assert_eq!(n.next_hop(ip("203.0.113.65")), ip("198.51.100.11"));
        assert_eq!(n.next_hop(ip("203.0.113.99")), ip("198.51.100.12"));
        assert_eq!(
            n.next_hop(ip("198.51.100.13")),
            ip("198.51.100.13"),
            "on-link"
        );
        assert_eq!(n.next_hop(ip("192.0.2.7")), ip("198.51.100.254"), "default");
        assert_eq!(n.next_hop(ip("2001:db8::1")), ip("2001:db8::1"), "no route");
        let mut cfg = strait_config::parse(
            r#"
[[gateway.interfaces]]
name = "eth0"
queues = [0]
[[services]]
name = "pods"
vip = "203.0.113.10"
port = 80
mode = "nat"
backends = [{ address = "203.0.113.65", port = 8080 }, { address = "203.0.113.99", port = 8080 }]
"#,
        )
        .unwrap();
        assert_eq!(fill(&mut cfg, &n), vec![ip("198.51.100.12")]);
        assert_eq!(
            cfg.services[0].backends[0].mac,
            Some(MacAddr([2, 0, 0, 0, 1, 0x11])),
            "the pod behind n1 is reached at n1's MAC"
        );
        // dsr-l2 frames keep the VIP: a routed backend is not reached through the router.
        cfg.services[0].mode = Mode::DsrL2;
        cfg.services[0].backends[0].mac = None;
        assert_eq!(
            fill(&mut cfg, &n),
            vec![ip("203.0.113.65"), ip("203.0.113.99")]
        );
        assert!(parse_routes(b"not json", false).is_empty());
    }

    #[test]
    fn netlink_read_of_a_hundred_neighbours_agrees_with_ip_and_is_timed() {
        if !privileged("neigh::netlink_read_of_a_hundred_neighbours_agrees_with_ip_and_is_timed") {
            return;
        }
        let ns = bed("nm");
        let mut batch: Vec<String> = (0..90)
            .map(|i| {
                format!(
                    "neigh add 198.51.100.{} lladdr 02:00:00:00:02:{i:02x} dev v0 nud permanent",
                    10 + i
                )
            })
            .collect();
        batch.extend((0..10).map(|i| {
            format!(
                "neigh add 2001:db8:1::{:x} lladdr 02:00:00:00:03:{i:02x} dev v0 nud permanent",
                0x10 + i
            )
        }));
        batch.extend((0..10).map(|i| {
            format!(
                "route add 203.0.113.{}/32 via 198.51.100.{} dev v0",
                i,
                10 + i
            )
        }));
        let mut child = Command::new("ip")
            .args(["-n", ns.name(), "-batch", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), batch.join("\n").as_bytes())
            .unwrap();
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success(), "ip -batch");

        let reads = 100;
        let (read, oracle, netlink, iproute2) = Netns::run_in(&ns, || {
            let read = table("v0").unwrap();
            let oracle = ip_table("v0");
            let t = Instant::now();
            for _ in 0..reads {
                assert_eq!(table("v0").unwrap().macs.len(), read.macs.len());
            }
            let netlink = t.elapsed();
            let t = Instant::now();
            for _ in 0..reads {
                assert_eq!(ip_table("v0").macs.len(), read.macs.len());
            }
            (read, oracle, netlink, t.elapsed())
        });
        assert_eq!(read.macs.len(), 100);
        assert_eq!(read.macs, oracle.macs);
        assert_eq!(sorted(read.routes.clone()), sorted(oracle.routes));
        assert_eq!(
            read.routes.len(),
            10 + 1 + 2,
            "the 10 host routes, the subnet, fe80::/64, 2001:db8:1::/64"
        );
        eprintln!(
            "neighbour table of 100 entries and {} routes, {reads} reads each: netlink {:.1} us, \
             ip -j {:.2} ms per read",
            read.routes.len(),
            netlink.as_secs_f64() * 1e6 / f64::from(reads),
            iproute2.as_secs_f64() * 1e3 / f64::from(reads),
        );
    }

    #[test]
    fn an_unknown_interface_is_an_error_naming_it_and_reads_as_empty() {
        let e = table("strait-nope0").unwrap_err();
        assert_eq!(
            (e.iface.as_str(), e.call),
            ("strait-nope0", "if_nametoindex")
        );
        let shown = e.to_string();
        assert!(
            shown.contains("\"strait-nope0\"") && shown.contains("if_nametoindex"),
            "{shown}"
        );
        let cfg = strait_config::parse(
            r#"
[[gateway.interfaces]]
name = "strait-nope0"
queues = [0]
"#,
        )
        .unwrap();
        assert_eq!(backend_table(&cfg), Neighbours::default());
    }
}
