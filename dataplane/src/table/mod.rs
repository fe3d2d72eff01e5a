//! The service table: one immutable snapshot of everything the workers decide on.
//!
//! The control thread builds a complete [`ServiceTable`] off the packet path (services,
//! backends, Maglev tables, next-hop MACs, ACLs) and publishes it with an atomic pointer swap;
//! workers load it once per RX batch and only read it. Nothing in here is ever mutated after
//! [`Builder::build`] or [`Builder::update`] returns, so a half-built table can never be seen.
//!
//! This module is the read side, what a worker sees; [`builder`] makes tables.
//! [`Builder::build`] makes a table from a whole configuration (start, reload);
//! [`Builder::update`] makes the next one from the live table and the services that changed:
//! unchanged services are shared between the two snapshots (`Arc<Service>`), so a change
//! costs the copy of the flat parts (backend vector, indexes) plus the changed services, not
//! a walk over every service and endpoint.
//!
//! Backends are stored by [`BackendId`] in a dense vector. [`Builder`] keeps ids stable across
//! rebuilds for as long as a (service, address, port) exists, so a flow entry's stored id still
//! names the same backend after a reload, and finding it is one index.

use core::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use hashbrown::HashMap;
use strait_config::model::{MacAddr, Mode};

use crate::flow::{FlowTable, FlowValue, Timeouts};
use crate::key::{addr_bytes, bytes_addr, Addr, BackendId, FlowKey, Proto, ServiceId};
use crate::maglev;
use crate::wire::ethernet::Address as Mac;

mod builder;
mod frontends;
#[cfg(test)]
mod tests;

pub use builder::{Builder, Change, TableError};
use frontends::Frontends;

/// A frontend: what a client addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frontend {
    /// VIP in key form ([`Frontend::vip_addr`] gives the address).
    pub vip: Addr,
    /// Frontend port.
    pub port: u16,
    /// IP protocol number.
    pub proto: Proto,
}

impl Frontend {
    /// The frontend `vip:port` over IP protocol `proto`.
    pub fn new(vip: IpAddr, port: u16, proto: Proto) -> Self {
        Self {
            vip: addr_bytes(vip),
            port,
            proto,
        }
    }

    /// The VIP as an address; an IPv4 VIP is [`IpAddr::V4`] (see [`Backend::address`]).
    pub fn vip_addr(&self) -> IpAddr {
        bytes_addr(self.vip)
    }
}

/// A source prefix in key form (IPv4 prefixes are IPv4-mapped, so their length is +96).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefix {
    addr: u128,
    mask: u128,
}

impl Prefix {
    /// Builds a prefix from an address and a prefix length of that address family.
    pub fn new(addr: IpAddr, len: u8) -> Self {
        let len = if addr.is_ipv4() {
            len as u32 + 96
        } else {
            len as u32
        };
        let mask = if len == 0 {
            0
        } else {
            u128::MAX << (128 - len.min(128))
        };
        Self {
            addr: u128::from_be_bytes(addr_bytes(addr).0) & mask,
            mask,
        }
    }

    /// The prefix's address and mask, as [`Prefix::from_bits`] takes them.
    pub(crate) fn bits(&self) -> (u128, u128) {
        (self.addr, self.mask)
    }

    /// A prefix from [`Prefix::bits`].
    pub(crate) fn from_bits(addr: u128, mask: u128) -> Self {
        Self {
            addr: addr & mask,
            mask,
        }
    }

    /// Whether `a` (key form) lies inside the prefix.
    #[inline(always)]
    pub fn contains(&self, a: &Addr) -> bool {
        u128::from_be_bytes(a.0) & self.mask == self.addr
    }
}

/// `address/length` in the address family's own terms (`198.51.100.0/24`, `2001:db8::/32`).
impl core::fmt::Display for Prefix {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let addr = bytes_addr(Addr(self.addr.to_be_bytes()));
        let len = self.mask.leading_ones();
        let len = if addr.is_ipv4() {
            len.saturating_sub(96)
        } else {
            len
        };
        write!(f, "{addr}/{len}")
    }
}

/// Whether a backend takes traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// Takes new flows (if its weight is above zero) and keeps its flows.
    Up,
    /// Keeps its existing flows and takes no new ones (weight 0, draining, or Kubernetes'
    /// serving-and-terminating).
    Draining,
    /// Failed its health check: takes nothing; its flows re-hash on their next packet.
    Down,
}

/// A backend as the workers see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    /// Stable id.
    pub id: BackendId,
    /// Changes whenever `id` is given to a new (service, address, port), so that a flow entry
    /// holding (id, incarnation) never follows a reused id to another backend.
    pub incarnation: u32,
    /// Index of its service in [`ServiceTable::services`].
    pub service: u32,
    /// Backend address in key form ([`Backend::address`]): the nat rewrite target.
    pub addr: Addr,
    /// Backend port.
    pub port: u16,
    /// Encapsulation target for dsr-ipip / dsr-gue in key form ([`Backend::tunnel_target`]).
    pub tunnel: Addr,
    /// Next-hop MAC as the rewrite copies it ([`Backend::mac_addr`]); `None` until the
    /// control plane resolves it.
    pub mac: Option<Mac>,
    /// Egress port (index into [`ServiceTable::ports`]).
    pub egress: u8,
    /// Maglev weight.
    pub weight: u32,
    /// Traffic state.
    pub health: Health,
}

impl Backend {
    /// Whether existing flows to this backend may continue.
    #[inline(always)]
    pub fn keeps_flows(&self) -> bool {
        self.health != Health::Down
    }

    /// The backend's address. The key form does not keep an IPv4-mapped IPv6 address
    /// (`::ffff:a.b.c.d`) apart from the IPv4 address, and the packet path treats both
    /// alike, so every IPv4 address comes back as [`IpAddr::V4`]: compare it with
    /// [`IpAddr::to_canonical`] of a configured one.
    pub fn address(&self) -> IpAddr {
        bytes_addr(self.addr)
    }

    /// `address:port`, the backend as health checks and the admin API name it.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.address(), self.port)
    }

    /// Where dsr-ipip and dsr-gue packets go (IPv4 as in [`Backend::address`]).
    pub fn tunnel_target(&self) -> IpAddr {
        bytes_addr(self.tunnel)
    }

    /// The next-hop MAC; `None` until the control plane resolves it.
    pub fn mac_addr(&self) -> Option<MacAddr> {
        self.mac.map(|m| MacAddr(m.0))
    }
}

/// A service as the workers see it.
#[derive(Debug)]
pub struct Service {
    /// Name, for logs and the admin API.
    pub name: String,
    /// Stable id, by name ([`ServiceId`]).
    pub id: ServiceId,
    /// Changes whenever `id` is given to another service, so that counts kept by id are never
    /// attributed to the id's next holder.
    pub incarnation: u32,
    /// The frontend.
    pub frontend: Frontend,
    /// Forwarding mode.
    pub mode: Mode,
    /// Maglev lookup table over `members`; shared with earlier snapshots while the inputs
    /// are the same (see [`Builder`]).
    pub maglev: Arc<maglev::Table>,
    /// Maglev member index to backend id (members are the backends that take new flows).
    pub members: Vec<BackendId>,
    /// Every backend of the service, members or not.
    pub backends: Vec<BackendId>,
    /// Allowed client prefixes; empty means everyone.
    pub acl: Vec<Prefix>,
    /// ClientIP session affinity timeout in seconds; 0 means none.
    pub affinity_secs: u32,
}

impl Service {
    /// Whether the client address `src` may use this service.
    #[inline(always)]
    pub fn allows(&self, src: &Addr) -> bool {
        self.acl.is_empty() || self.acl.iter().any(|p| p.contains(src))
    }

    /// Whether the client address `src` may use this service ([`Service::allows`] for an
    /// address that is not in key form).
    pub fn allows_addr(&self, src: IpAddr) -> bool {
        self.allows(&addr_bytes(src))
    }
}

/// A data port (interface) of the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Port {
    /// The interface's own MAC: the source MAC of frames it sends, and the only unicast
    /// destination it takes frames for ([`Port::mac_addr`]).
    pub mac: Mac,
    /// MTU of the interface.
    pub mtu: u16,
    /// The 802.1Q VLANs whose tagged frames the port takes, besides untagged ones.
    pub vlans: Vlans,
}

impl Port {
    /// A port with MAC `mac` and MTU `mtu`, untagged only. [`Builder::build`] gives each
    /// port the VLANs its interface is configured with.
    pub const fn new(mac: MacAddr, mtu: u16) -> Self {
        Self {
            mac: Mac(mac.0),
            mtu,
            vlans: Vlans::NONE,
        }
    }

    /// The interface's own MAC.
    pub const fn mac_addr(&self) -> MacAddr {
        MacAddr(self.mac.0)
    }
}

/// A set of 802.1Q VLAN ids (1..=4094), one bit each: a constant-time test on the packet
/// path, 512 bytes a port.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Vlans([u64; 64]);

impl Vlans {
    /// No VLAN: untagged frames only.
    pub const NONE: Self = Self([0; 64]);

    /// The set of `ids`; ids outside 1..=4094 are left out (the configuration refuses them).
    pub fn of(ids: &[u16]) -> Self {
        let mut w = [0u64; 64];
        for &v in ids.iter().filter(|v| (1..=4094).contains(*v)) {
            w[v as usize / 64] |= 1 << (v % 64);
        }
        Self(w)
    }

    /// Whether VLAN `vid` (the tag's low 12 bits) is in the set.
    #[inline(always)]
    pub fn contains(&self, vid: u16) -> bool {
        let vid = vid & 0x0fff;
        (self.0[vid as usize / 64] >> (vid % 64)) & 1 == 1
    }

    /// The ids in the set, ascending.
    pub fn ids(&self) -> impl Iterator<Item = u16> + '_ {
        (1..=4094).filter(|&v| self.contains(v))
    }
}

impl core::fmt::Debug for Vlans {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_set().entries(self.ids()).finish()
    }
}

/// The immutable snapshot.
#[derive(Debug)]
pub struct ServiceTable {
    /// Increases by one with every build; shown in /metrics.
    pub generation: u64,
    /// Names this snapshot among every table of the process ([`ServiceTable::serial`]).
    serial: u64,
    /// Services: in configuration order after [`Builder::build`]; [`Builder::update`]
    /// keeps each service's index and moves the last service into a removed one's.
    pub services: Vec<Arc<Service>>,
    /// Backends by id; `None` for ids not in use.
    pub backends: Vec<Option<Backend>>,
    /// Data ports by index.
    pub ports: Vec<Port>,
    /// Port index facing the clients (where nat replies and ICMP answers leave when the
    /// ingress port is not known).
    pub client_port: u8,
    /// Outer IPv4 source of encapsulated packets (the low byte is varied per flow).
    pub tunnel_src_v4: [u8; 4],
    /// Outer IPv6 source of encapsulated packets (the low 16 bits are varied per flow).
    pub tunnel_src_v6: [u8; 16],
    /// UDP destination port of dsr-gue.
    pub gue_port: u16,
    /// Flow timeouts for the per-core tables.
    pub timeouts: Timeouts,
    /// The gateway's own addresses in key form ([`ServiceTable::local_addrs`]). Traffic to them is the kernel's even when it
    /// comes from a nat backend's service port (the gateway's health checks). Given to the
    /// builder by the control plane, which knows the interfaces ([`Builder::set_locals`]);
    /// empty in tests.
    pub locals: Vec<Addr>,
    /// One past the highest [`Service::id`] the builder has handed out: the length of an
    /// array indexed by service id that covers every service of this table.
    pub service_ids: u32,
    /// Frontend (VIP, port, protocol) to service index, probed by every packet
    /// ([`frontends`]).
    frontends: Frontends,
    by_vip_proto: HashMap<(Addr, Proto), VipProto>,
    /// nat backends (address, port, protocol), each with the frontends of the services that
    /// have it: where a reply from there goes back from.
    nat_backends: HashMap<(Addr, u16, Proto), NatFrontends>,
    /// How many of those have more than one frontend ([`ServiceTable::nat_shared`]).
    nat_shared: u32,
}

/// The frontends of the nat services with a backend at one address, port and protocol
/// (almost always one), each with how many of its service's backends are there. A reply
/// from that address and port belongs to a flow to one of them.
#[derive(Clone, Debug, Default)]
pub(crate) struct NatFrontends(Vec<(Addr, u16, u32)>);

impl NatFrontends {
    /// The (VIP, port) pairs.
    #[inline(always)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Addr, u16)> + '_ {
        self.0.iter().map(|&(vip, port, _)| (vip, port))
    }

    /// The one (VIP, port), if there is exactly one.
    #[inline(always)]
    pub(crate) fn only(&self) -> Option<(Addr, u16)> {
        match self.0.as_slice() {
            [(vip, port, _)] => Some((*vip, *port)),
            _ => None,
        }
    }

    /// Whether more than one frontend has a backend there.
    #[inline(always)]
    pub(crate) fn shared(&self) -> bool {
        self.0.len() > 1
    }

    fn add(&mut self, vip: Addr, port: u16) {
        match self.0.iter_mut().find(|(v, p, _)| *v == vip && *p == port) {
            Some((_, _, n)) => *n += 1,
            None => self.0.push((vip, port, 1)),
        }
    }

    /// Takes one backend of frontend `vip:port` away; true when none is left at all.
    fn remove(&mut self, vip: Addr, port: u16) -> bool {
        if let Some(i) = self.0.iter().position(|(v, p, _)| *v == vip && *p == port) {
            self.0[i].2 -= 1;
            if self.0[i].2 == 0 {
                self.0.swap_remove(i);
            }
        }
        self.0.is_empty()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum VipProto {
    One(u32),
    Several,
}

impl VipProto {
    /// The entry for the services at `slots` (not empty).
    fn of(slots: &[u32]) -> Self {
        match slots {
            [one] => VipProto::One(*one),
            _ => VipProto::Several,
        }
    }
}

/// Where a non-first fragment goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FragmentService {
    /// The only service on this VIP and protocol.
    One(u32),
    /// Several services share VIP and protocol; the port is needed to choose.
    Ambiguous,
}

/// Serials of tables: one counter for the process, so that no two snapshots share one, whatever
/// builder made them.
static SERIALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A serial no table has had (never 0).
pub(crate) fn next_serial() -> u64 {
    SERIALS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
}

impl ServiceTable {
    /// A number no other table of the process has: given to the snapshot when it is made
    /// (built, updated or made empty), so that state a core keeps per table (the traffic
    /// slots, [`crate::traffic::Traffic::settle`]) knows when the table it works under changed
    /// at the cost of one comparison. Unlike [`ServiceTable::generation`] it differs between
    /// tables of different builders.
    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// An empty table (no services): everything is passed to the kernel.
    pub fn empty(ports: Vec<Port>) -> Self {
        Self {
            generation: 0,
            serial: next_serial(),
            services: Vec::new(),
            backends: Vec::new(),
            ports,
            client_port: 0,
            tunnel_src_v4: [192, 0, 2, 1],
            tunnel_src_v6: [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            gue_port: 6080,
            timeouts: Timeouts::default(),
            locals: Vec::new(),
            service_ids: 0,
            frontends: Frontends::new(),
            by_vip_proto: HashMap::new(),
            nat_backends: HashMap::new(),
            nat_shared: 0,
        }
    }

    /// The service index for a frontend.
    #[inline(always)]
    pub fn service_for(&self, f: &Frontend) -> Option<u32> {
        self.frontends.get(&f.vip, f.port, f.proto)
    }

    /// The service for a non-first fragment (which has no ports) to `vip` with `proto`.
    #[inline]
    pub fn fragment_service(&self, vip: &Addr, proto: Proto) -> Option<FragmentService> {
        self.by_vip_proto.get(&(*vip, proto)).map(|v| match v {
            VipProto::One(i) => FragmentService::One(*i),
            VipProto::Several => FragmentService::Ambiguous,
        })
    }

    /// Whether a packet from `addr:port` over `proto` may be a nat reply.
    #[inline(always)]
    pub fn is_nat_backend(&self, addr: &Addr, port: u16, proto: Proto) -> bool {
        self.nat_frontends(addr, port, proto).is_some()
    }

    /// The frontends a nat reply from `addr:port` over `proto` may go back from: those of
    /// the nat services with a backend there.
    #[inline(always)]
    pub(crate) fn nat_frontends(
        &self,
        addr: &Addr,
        port: u16,
        proto: Proto,
    ) -> Option<&NatFrontends> {
        if self.nat_backends.is_empty() {
            return None;
        }
        self.nat_backends.get(&(*addr, port, proto))
    }

    /// Whether some nat backend address and port belongs to the services of more than one
    /// frontend: then a new nat flow must not take a reply tuple that a flow to another of
    /// them holds (`DropReason::NatCollision`), which the pipeline checks only while this
    /// is so.
    #[inline(always)]
    pub fn nat_shared(&self) -> bool {
        self.nat_shared != 0
    }

    /// The backend of frontend `f` at `addr:port`, if this table has it: how a flow learnt
    /// from a peer gateway, which names its backend by address (`crate::sync`), finds this
    /// table's. A walk over the service's backends (tens, at most a few thousand), paid per
    /// imported record, not per packet; a map by address kept beside the table cost every
    /// table update a copy of it (0.5 ms at 100,000 backends, `bench control`).
    #[inline]
    pub fn backend_at(&self, f: &Frontend, addr: &Addr, port: u16) -> Option<&Backend> {
        let s = self.services.get(self.service_for(f)? as usize)?;
        s.backends
            .iter()
            .filter_map(|&id| self.backend(id))
            .find(|b| b.addr == *addr && b.port == port)
    }

    /// A backend by id.
    #[inline(always)]
    pub fn backend(&self, id: BackendId) -> Option<&Backend> {
        self.backends.get(id.0 as usize).and_then(Option::as_ref)
    }

    /// The gateway's own addresses ([`ServiceTable::locals`]), IPv4 as in
    /// [`Backend::address`].
    pub fn local_addrs(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.locals.iter().map(|&a| bytes_addr(a))
    }

    /// Whether any service has the VIP `vip` (any port or protocol).
    pub fn has_vip(&self, vip: &Addr) -> bool {
        self.services.iter().any(|s| &s.frontend.vip == vip)
    }
}

// The two below follow flow entries to backends in a snapshot: the pipeline does so for
// every packet and flow sync for every record it imports or dumps. They live here, below
// both, so that `sync` needs nothing of `pipeline`.

/// The forward 5-tuple (client to frontend `vip:port`) of a nat reply `r` (backend to
/// client): the key of the flow's entry, which serves both directions.
#[inline(always)]
pub(crate) fn forward_key(r: &FlowKey, vip: Addr, port: u16) -> FlowKey {
    FlowKey {
        src: r.dst,
        dst: vip,
        src_port: r.dst_port,
        dst_port: port,
        proto: r.proto,
    }
}

/// The reply tuple of a nat flow to backend `b`: backend:port to client:port.
#[inline(always)]
pub(crate) fn reply_key(k: &FlowKey, b: &Backend) -> FlowKey {
    FlowKey {
        src: b.addr,
        dst: k.src,
        src_port: b.port,
        dst_port: k.src_port,
        proto: k.proto,
    }
}

/// Whether a nat flow from `key`'s client address and port to backend `b` of service `s`
/// would share its reply tuple with a live flow in `flows` from the same address and port to
/// another frontend whose service has a backend at `b`'s address and port: the replies of
/// the two could not be told apart. One comparison while no backend address and port is
/// shared by frontends ([`ServiceTable::nat_shared`]), the case of nearly every table.
#[inline(always)]
pub(crate) fn nat_taken(
    t: &ServiceTable,
    flows: &FlowTable,
    s: &Service,
    b: &Backend,
    key: &FlowKey,
    now: u64,
) -> bool {
    t.nat_shared() && nat_taken_among(t, flows, s, b, key, now)
}

#[cold]
#[inline(never)]
fn nat_taken_among(
    t: &ServiceTable,
    flows: &FlowTable,
    s: &Service,
    b: &Backend,
    key: &FlowKey,
    now: u64,
) -> bool {
    let Some(owners) = t.nat_frontends(&b.addr, b.port, key.proto) else {
        return false;
    };
    owners
        .iter()
        .filter(|&(vip, port)| (vip, port) != (s.frontend.vip, s.frontend.port))
        .any(|(vip, port)| {
            let other = FlowKey {
                dst: vip,
                dst_port: port,
                ..*key
            };
            nat_flow_at(t, flows, &other, &b.addr, b.port, now)
        })
}

/// The key of the entry of nat reply `r`'s flow in `flows` at `now`, among the frontends
/// with a backend at its source (`owners`): the forward 5-tuple whose live entry names a
/// backend at the reply's source address and port. One lookup per frontend, read-only.
pub(crate) fn reply_flow(
    t: &ServiceTable,
    flows: &FlowTable,
    owners: &NatFrontends,
    r: &FlowKey,
    now: u64,
) -> Option<FlowKey> {
    owners
        .iter()
        .map(|(vip, port)| forward_key(r, vip, port))
        .find(|k| nat_flow_at(t, flows, k, &r.src, r.src_port, now))
}

/// Whether `flows` holds at `k` a live nat flow's entry ([`FlowValue::reply_mac`]: no
/// session-affinity entry, whose key a flow from source port 0 shares) naming a backend the
/// table has at `addr:port`.
fn nat_flow_at(
    t: &ServiceTable,
    flows: &FlowTable,
    k: &FlowKey,
    addr: &Addr,
    port: u16,
    now: u64,
) -> bool {
    flows.peek(k).is_some_and(|v| {
        flows.is_live(v, now)
            && v.reply_mac().is_some()
            && current(t, v).is_some_and(|b| b.addr == *addr && b.port == port)
    })
}

/// The backend a flow entry names, if the snapshot still has it: same id and incarnation (an
/// id reused for another backend has another incarnation).
#[inline(always)]
pub(crate) fn current<'t>(t: &'t ServiceTable, v: &FlowValue) -> Option<&'t Backend> {
    t.backend(v.backend)
        .filter(|b| b.incarnation == v.incarnation)
}
