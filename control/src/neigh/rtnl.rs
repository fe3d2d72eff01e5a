//! Reading a neighbour table and its routes over rtnetlink: dumps of the whole table
//! ([`table`]), or a request per next hop ([`hop_entries`]).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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
use strait_config::model::MacAddr;

use super::ReadError;
use crate::core::Neighbours;

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
pub fn table(iface: &str) -> Result<Neighbours, ReadError> {
    read(iface, true)
}

/// [`table`], with the kernel filtering the dumps by interface and table (`kernel_filter`;
/// routes only where it can) or not (the tests check that both agree, as on a kernel before
/// 4.20).
pub(super) fn read(iface: &str, kernel_filter: bool) -> Result<Neighbours, ReadError> {
    let fail = |call| failed(iface, call);
    let (index, mut rtnl) = open(iface, kernel_filter)?;
    for _ in 0..DUMP_ATTEMPTS {
        let mut n = Neighbours {
            ifindex: index,
            ..Neighbours::default()
        };
        let whole = rtnl
            .dump(neighbours_request(index, kernel_filter), |m| {
                if let RouteNetlinkMessage::NewNeighbour(m) = m {
                    n.macs.extend(resolved(&m, index));
                }
            })
            .map_err(fail("RTM_GETNEIGH dump"))?;
        if let (true, Some(routes)) = (whole, rtnl.routes(index).map_err(|(c, e)| fail(c)(e))?) {
            n.routes = routes;
            return Ok(n);
        }
    }
    Err(interrupted(iface))
}

/// `iface`'s index and a netlink socket (`kernel_filter`: see [`read`]).
fn open(iface: &str, kernel_filter: bool) -> Result<(u32, Rtnl), ReadError> {
    let index = nix::net::if_::if_nametoindex(iface)
        .map_err(|e| failed(iface, "if_nametoindex")(e.into()))?;
    let rtnl = Rtnl::open(kernel_filter).map_err(failed(iface, "socket(NETLINK_ROUTE)"))?;
    Ok((index, rtnl))
}

/// The error of `call` on `iface`, from its cause.
fn failed<'a>(iface: &'a str, call: &'static str) -> impl Fn(io::Error) -> ReadError + 'a {
    move |source| ReadError {
        iface: iface.to_owned(),
        call,
        source,
    }
}

/// The error of a read whose dumps were interrupted [`DUMP_ATTEMPTS`] times in a row.
fn interrupted(iface: &str) -> ReadError {
    ReadError {
        iface: iface.to_owned(),
        call: "dumps",
        source: io::Error::other(format!(
            "interrupted by concurrent changes {DUMP_ATTEMPTS} times in a row (NLM_F_DUMP_INTR)"
        )),
    }
}

/// `iface`'s routes as [`table`] reads them, and the neighbour entries of the next hops of
/// `targets` only (each an address and whether it may be routed: see
/// [`super::Scope::Targets`]), resolved as [`table`] has them: a read with
/// [`Neighbours::only`] set to those next hops.
///
/// One `RTM_GETNEIGH` request per next hop (`ip neigh get ADDR dev IFACE`), sent
/// [`GETS_AT_ONCE`] at a time: the work is that of the targets, however many entries the
/// table holds. A kernel without such requests (before 5.0) answers `EOPNOTSUPP`; the
/// entries are then taken from a dump of the table.
///
/// # Errors
/// As [`table`]; and a request failing otherwise than with `ENOENT` (no such entry).
pub fn hop_entries(iface: &str, targets: &[(IpAddr, bool)]) -> Result<Neighbours, ReadError> {
    let fail = |call| failed(iface, call);
    let (index, mut rtnl) = open(iface, true)?;
    let mut n = Neighbours {
        ifindex: index,
        ..Neighbours::default()
    };
    // Only when a target may be routed do the routes matter; they are read anyway, as a
    // read always carries them (few, and filtered by the kernel to the interface).
    let mut routes = None;
    for _ in 0..DUMP_ATTEMPTS {
        routes = rtnl.routes(index).map_err(|(c, e)| fail(c)(e))?;
        if routes.is_some() {
            break;
        }
    }
    n.routes = routes.ok_or_else(|| interrupted(iface))?;
    let hops = n.hops_of(targets);
    let got = rtnl
        .neighbours(index, &hops)
        .map_err(fail("RTM_GETNEIGH"))?;
    let Some(macs) = got else {
        return Ok(table(iface)?.part(targets));
    };
    n.macs = macs;
    n.only = Some(hops);
    Ok(n)
}

/// How many `RTM_GETNEIGH` requests [`hop_entries`] sends in one datagram before it reads their
/// answers. Each answer is a datagram of its own, queued on the socket with about a
/// kilobyte of accounting (`skb->truesize`), so 64 of them take a third of the default
/// receive buffer (`net.core.rmem_default`, 208 KiB) and none is dropped; a send and a
/// wake-up per 64 next hops is little next to the answers themselves.
pub const GETS_AT_ONCE: usize = 64;

/// How often [`table`] reads again when the kernel flags a dump as interrupted by a change
/// (`NLM_F_DUMP_INTR`: entries may be missing or doubled). A change is a rare event next to
/// a dump of tens of microseconds, so a third interrupted read in a row means something is
/// rewriting the tables continuously, which is worth an error.
pub const DUMP_ATTEMPTS: usize = 3;

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

/// `RTM_GETNEIGH` request for the entry of `addr` on interface `index`: no flags, state or
/// type, and `NDA_DST` as the only attribute, as the kernel's strict check of such requests
/// wants (`neigh_valid_get_req`).
fn neighbour_request(index: u32, addr: IpAddr) -> RouteNetlinkMessage {
    let mut m = NeighbourMessage::default();
    m.header.ifindex = index;
    let dst = match addr {
        IpAddr::V4(a) => {
            m.header.family = AddressFamily::Inet;
            NeighbourAddress::Inet(a)
        }
        IpAddr::V6(a) => {
            m.header.family = AddressFamily::Inet6;
            NeighbourAddress::Inet6(a)
        }
    };
    m.attributes.push(NeighbourAttribute::Destination(dst));
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
fn resolved(m: &NeighbourMessage, index: u32) -> Option<(IpAddr, MacAddr)> {
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
            NeighbourAttribute::LinkLayerAddress(l) => {
                mac = <[u8; 6]>::try_from(&l[..]).ok().map(MacAddr);
            }
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

/// Routes as [`Neighbours::routes`] holds them.
type Routes = Vec<(IpNet, Option<IpAddr>)>;

/// A route netlink socket of the calling thread's network namespace, for dumps and
/// requests.
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
    /// The main table's routes through interface `index`, IPv4 and IPv6 (see [`table`]);
    /// `None` when a dump was interrupted by a change. The error names the failed dump.
    fn routes(&mut self, index: u32) -> Result<Option<Routes>, (&'static str, io::Error)> {
        let mut routes = Vec::new();
        let mut whole = true;
        for (family, call) in [
            (AddressFamily::Inet, "RTM_GETROUTE dump (IPv4)"),
            (AddressFamily::Inet6, "RTM_GETROUTE dump (IPv6)"),
        ] {
            whole &= self
                .dump(routes_request(family, index), |m| {
                    if let RouteNetlinkMessage::NewRoute(m) = m {
                        routes.extend(route(&m, index));
                    }
                })
                .map_err(|e| (call, e))?;
        }
        Ok(whole.then_some(routes))
    }

    /// The resolved neighbour entries (as [`resolved`] has them) of `addrs` on interface
    /// `index`, one `RTM_GETNEIGH` request each, [`GETS_AT_ONCE`] per datagram. `None`
    /// when the kernel does not take such requests (`EOPNOTSUPP`, before Linux 5.0).
    fn neighbours(
        &mut self,
        index: u32,
        addrs: &[IpAddr],
    ) -> io::Result<Option<HashMap<IpAddr, MacAddr>>> {
        let bad = |e: String| io::Error::new(io::ErrorKind::InvalidData, e);
        let mut macs = HashMap::new();
        let mut out = Vec::new();
        for chunk in addrs.chunks(GETS_AT_ONCE) {
            out.clear();
            let first = self.seq.wrapping_add(1);
            for &addr in chunk {
                self.seq = self.seq.wrapping_add(1);
                let mut header = NetlinkHeader::default();
                header.flags = NLM_F_REQUEST;
                header.sequence_number = self.seq;
                let mut req = NetlinkMessage::new(
                    header,
                    NetlinkPayload::from(neighbour_request(index, addr)),
                );
                req.finalize();
                let at = out.len();
                out.resize(at + req.buffer_len(), 0);
                req.serialize(&mut out[at..]);
            }
            self.socket.send(&out, 0)?;
            // Every request has exactly one answer: the entry, or an error.
            let mut pending = chunk.len();
            let mut unsupported = false;
            while pending > 0 {
                let n = self.recv_datagram()?;
                let mut at = 0;
                while at < n {
                    let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&self.buf[at..n])
                        .map_err(|e| bad(format!("malformed reply: {e}")))?;
                    at += (m.header.length as usize).next_multiple_of(4);
                    if m.header.sequence_number.wrapping_sub(first) >= chunk.len() as u32 {
                        continue;
                    }
                    match m.payload {
                        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNeighbour(m)) => {
                            macs.extend(resolved(&m, index));
                        }
                        NetlinkPayload::Error(e) if e.code.is_some() => {
                            let e = e.to_io();
                            match e.raw_os_error() {
                                Some(nix::libc::ENOENT) => {}
                                Some(nix::libc::EOPNOTSUPP) => unsupported = true,
                                _ => return Err(e),
                            }
                        }
                        _ => {}
                    }
                    pending -= 1;
                }
            }
            if unsupported {
                return Ok(None);
            }
        }
        Ok(Some(macs))
    }

    /// Receives one datagram into the buffer (retrying a signal's interruption); its length.
    /// A datagram longer than the buffer is an error, not a silent truncation.
    fn recv_datagram(&mut self) -> io::Result<usize> {
        loop {
            let n = match self
                .socket
                .recv(&mut &mut self.buf[..], nix::libc::MSG_TRUNC)
            {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => r?,
            };
            if n > self.buf.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "a {n}-byte datagram does not fit the {}-byte buffer",
                        self.buf.len()
                    ),
                ));
            }
            return Ok(n);
        }
    }

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
            let n = self.recv_datagram()?;
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
