//! The service table: one immutable snapshot of everything the workers decide on.
//!
//! The control thread builds a complete [`ServiceTable`] off the packet path (services,
//! backends, Maglev tables, next-hop MACs, ACLs) and publishes it with an atomic pointer swap;
//! workers load it once per RX batch and only read it. Nothing in here is ever mutated after
//! [`Builder::build`] or [`Builder::update`] returns, so a half-built table can never be seen.
//!
//! [`Builder::build`] makes a table from a whole configuration (start, reload, health
//! changes); [`Builder::update`] makes the next one from the live table and the services
//! that changed (the Kubernetes source's path): unchanged services are shared between the
//! two snapshots (`Arc<Service>`), so a one-endpoint change among 10,000 services costs the
//! copy of the flat parts (backend vector, indexes: about 0.5 ms) plus the changed
//! service, not a walk over every service and endpoint (about 40 ms).
//!
//! Backends are stored by [`BackendId`] in a dense vector. [`Builder`] keeps ids stable across
//! rebuilds for as long as a (service, address, port) exists, so a flow entry's stored id still
//! names the same backend after a reload, and finding it is one index.

use core::net::IpAddr;
use std::sync::Arc;

use hashbrown::{HashMap, HashSet};
use strait_config::model::{self, BackendState, Config, Mode, Role};

use crate::flow::Timeouts;
use crate::key::{addr_bytes, BackendId};
use crate::maglev;

/// A frontend: what a client addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frontend {
    /// VIP in key form.
    pub vip: [u8; 16],
    /// Frontend port.
    pub port: u16,
    /// IP protocol number.
    pub proto: u8,
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
            addr: u128::from_be_bytes(addr_bytes(addr)) & mask,
            mask,
        }
    }

    /// Whether `a` (key form) lies inside the prefix.
    #[inline(always)]
    pub fn contains(&self, a: &[u8; 16]) -> bool {
        u128::from_be_bytes(*a) & self.mask == self.addr
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
    /// Backend address (key form): the nat rewrite target.
    pub addr: [u8; 16],
    /// Backend port.
    pub port: u16,
    /// Encapsulation target for dsr-ipip / dsr-gue (key form).
    pub tunnel: [u8; 16],
    /// Next-hop MAC; `None` until the control plane resolves it.
    pub mac: Option<[u8; 6]>,
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
}

/// A service as the workers see it.
#[derive(Debug)]
pub struct Service {
    /// Name, for logs and the admin API.
    pub name: String,
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
    pub fn allows(&self, src: &[u8; 16]) -> bool {
        self.acl.is_empty() || self.acl.iter().any(|p| p.contains(src))
    }
}

/// A data port (interface) of the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Port {
    /// The interface's own MAC: the source MAC of frames it sends.
    pub mac: [u8; 6],
    /// MTU of the interface.
    pub mtu: u16,
}

/// The immutable snapshot.
#[derive(Debug)]
pub struct ServiceTable {
    /// Increases by one with every build; shown in /metrics.
    pub generation: u64,
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
    /// The gateway's own addresses (key form). Traffic to them is the kernel's even when it
    /// comes from a nat backend's service port (the gateway's health checks). Filled by the
    /// control plane, which knows the interfaces; empty in tests.
    pub locals: Vec<[u8; 16]>,
    frontends: HashMap<Frontend, u32>,
    by_vip_proto: HashMap<([u8; 16], u8), VipProto>,
    /// nat backends (address, port, protocol), each with the number of services that have it.
    nat_backends: HashMap<([u8; 16], u16, u8), u32>,
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

impl ServiceTable {
    /// An empty table (no services): everything is passed to the kernel.
    pub fn empty(ports: Vec<Port>) -> Self {
        Self {
            generation: 0,
            services: Vec::new(),
            backends: Vec::new(),
            ports,
            client_port: 0,
            tunnel_src_v4: [192, 0, 2, 1],
            tunnel_src_v6: [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            gue_port: 6080,
            timeouts: Timeouts::default(),
            locals: Vec::new(),
            frontends: HashMap::new(),
            by_vip_proto: HashMap::new(),
            nat_backends: HashMap::new(),
        }
    }

    /// The service index for a frontend.
    #[inline(always)]
    pub fn service_for(&self, f: &Frontend) -> Option<u32> {
        self.frontends.get(f).copied()
    }

    /// The service for a non-first fragment (which has no ports) to `vip` with `proto`.
    #[inline]
    pub fn fragment_service(&self, vip: &[u8; 16], proto: u8) -> Option<FragmentService> {
        self.by_vip_proto.get(&(*vip, proto)).map(|v| match v {
            VipProto::One(i) => FragmentService::One(*i),
            VipProto::Several => FragmentService::Ambiguous,
        })
    }

    /// Whether a packet from `addr:port` over `proto` may be a nat reply.
    #[inline(always)]
    pub fn is_nat_backend(&self, addr: &[u8; 16], port: u16, proto: u8) -> bool {
        !self.nat_backends.is_empty() && self.nat_backends.contains_key(&(*addr, port, proto))
    }

    /// A backend by id.
    #[inline(always)]
    pub fn backend(&self, id: BackendId) -> Option<&Backend> {
        self.backends.get(id.0 as usize).and_then(Option::as_ref)
    }

    /// Whether any service has the VIP `vip` (any port or protocol).
    pub fn has_vip(&self, vip: &[u8; 16]) -> bool {
        self.services.iter().any(|s| &s.frontend.vip == vip)
    }
}

/// Why a table could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// A service's Maglev table could not be built.
    #[error("service {service}: maglev table: {source}")]
    Maglev {
        /// The service's name.
        service: String,
        /// What Maglev said.
        source: maglev::BuildError,
    },
    /// More data ports than the one-byte port index holds.
    #[error("{0} data interfaces; at most 255 are supported")]
    TooManyPorts(usize),
    /// The port list does not match the configured interfaces.
    #[error("{ports} port MACs given for {interfaces} configured interfaces")]
    PortCount {
        /// Ports given.
        ports: usize,
        /// Interfaces configured.
        interfaces: usize,
    },
    /// [`Builder::update`] was given a table it did not make last, or an earlier update
    /// failed; a full build is needed.
    #[error(
        "table generation {table} is not the builder's last ({builder}); a full build is needed"
    )]
    Stale {
        /// The generation of the table given.
        table: u64,
        /// The generation of the builder's last table.
        builder: u64,
    },
    /// [`Builder::update`] was asked to give a frontend that another service has.
    #[error("service {service}: its frontend belongs to service {other}")]
    FrontendTaken {
        /// The service set.
        service: String,
        /// The service that has the frontend.
        other: String,
    },
}

/// Identity of a backend for id allocation: (service frontend, address, port).
type BackendKey = (Frontend, [u8; 16], u16);

/// What a Maglev table is a function of: its size and the weighted members, in member
/// order (the member order also fixes which index a slot names).
type MaglevInput = (u32, Vec<(u64, u32)>);

/// Tables the Maglev cache may hold beyond two per service before [`Builder::update`] drops
/// those no snapshot uses any more: the old and the new snapshot hold at most two per
/// service, and the slack keeps the sweep (a walk over the cache) rare when few services
/// change.
const MAGLEV_CACHE_SLACK: usize = 64;

/// One service's change, for [`Builder::update`].
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// A service that is new or whose configuration may have changed (found by name).
    Set(&'a model::Service),
    /// The service of this name is gone.
    Remove(&'a str),
}

impl Change<'_> {
    fn name(&self) -> &str {
        match self {
            Change::Set(s) => &s.name,
            Change::Remove(n) => n,
        }
    }
}

/// Builds snapshots and keeps backend ids stable between them.
///
/// It also keeps the Maglev tables of the previous builds: a service whose members, weights
/// and table size did not change gets the same table (an `Arc`), so a change to one service
/// of ten thousand rebuilds one Maglev table, not ten thousand. Building the tables is most of
/// the cost of a cold snapshot.
///
/// Two ways to build:
/// - [`Builder::build`] makes the whole table from a configuration: at start and on
///   reloads. Its cost grows with every service and endpoint (about 40 ms at 10,000
///   services of 10 endpoints, Maglev tables reused).
/// - [`Builder::update`] makes the next table from the previous one and the services that
///   changed: unchanged services are shared (`Arc<Service>`), the flat parts (backend
///   vector, indexes) are copied, and only the changed services' entries are rebuilt.
///   Its cost is the copies plus the changed services (about 0.5 ms for one endpoint change
///   at the same scale).
///
/// Both give the same table up to the order of [`ServiceTable::services`] (a removed
/// service's slot is taken by the last one) and the numbering of fresh backend ids; the
/// tests check this over random change sequences.
#[derive(Debug, Default)]
pub struct Builder {
    ids: HashMap<BackendKey, BackendId>,
    free: Vec<BackendId>,
    next: u32,
    /// Incarnation of each id in use, by id; bumped from `allocations` when an id is handed out.
    incarnations: Vec<u32>,
    allocations: u32,
    generation: u64,
    maglev: HashMap<MaglevInput, Arc<maglev::Table>>,
    /// Each service's index in the last table, by name.
    slots: HashMap<String, u32>,
    /// The services on each (VIP, protocol) of the last table, by index: the source of the
    /// fragment index.
    vips: HashMap<([u8; 16], u8), Vec<u32>>,
    /// Egress port of every backend, from the interface roles of the last full build.
    backend_port: u8,
    /// Whether the builder's state describes the last table it made (false before the first
    /// build and after a failed update): [`Builder::update`] needs it.
    synced: bool,
    /// A replaced table handed back ([`Builder::recycle`]): the next update copies into
    /// its allocations, whose pages are already mapped.
    spare: Option<ServiceTable>,
}

impl Builder {
    /// A builder with no history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a snapshot from a validated configuration.
    ///
    /// `ports` gives the MAC and MTU of each configured interface, in configuration order
    /// (the IO layer reads them from the kernel). `down(service, address, port)` says whether
    /// a backend failed its health check.
    ///
    /// # Errors
    /// [`TableError`] when a Maglev table cannot be built or the ports do not match.
    pub fn build(
        &mut self,
        cfg: &Config,
        ports: &[Port],
        down: impl Fn(&str, IpAddr, u16) -> bool,
    ) -> Result<ServiceTable, TableError> {
        let gw = &cfg.gateway;
        if ports.len() != gw.interfaces.len() {
            return Err(TableError::PortCount {
                ports: ports.len(),
                interfaces: gw.interfaces.len(),
            });
        }
        if ports.len() > u8::MAX as usize {
            return Err(TableError::TooManyPorts(ports.len()));
        }
        self.synced = false;
        let role_port = |want: Role| {
            gw.interfaces
                .iter()
                .position(|i| i.role == want || i.role == Role::Both)
                .unwrap_or(0) as u8
        };
        self.backend_port = role_port(Role::Backend);
        let mut t = ServiceTable::empty(ports.to_vec());
        t.client_port = role_port(Role::Client);
        if let Some(a) = gw.tunnel_source_v4 {
            t.tunnel_src_v4 = a.octets();
        }
        if let Some(a) = gw.tunnel_source_v6 {
            t.tunnel_src_v6 = a.octets();
        }
        t.gue_port = gw.gue_port;
        t.timeouts = Timeouts {
            tcp_syn: gw.timeouts.tcp_syn.as_nanos() as u64,
            tcp_established: gw.timeouts.tcp_established.as_nanos() as u64,
            tcp_closing: gw.timeouts.tcp_closing.as_nanos() as u64,
            udp: gw.timeouts.udp.as_nanos() as u64,
            ..Timeouts::default()
        };

        self.slots.clear();
        self.vips.clear();
        let mut live: HashSet<BackendKey> = HashSet::new();
        let mut used: HashMap<MaglevInput, Arc<maglev::Table>> = HashMap::new();
        t.services.reserve(cfg.services.len());
        for (si, s) in cfg.services.iter().enumerate() {
            let svc = self.make_service(&mut t, si as u32, s, &down, &mut live, &mut used)?;
            self.slots.insert(s.name.clone(), si as u32);
            t.services.push(Arc::new(svc));
        }
        for (k, v) in &self.vips {
            t.by_vip_proto.insert(*k, VipProto::of(v));
        }
        // Free the ids of backends that left, for reuse by later builds.
        let gone: Vec<BackendKey> = self
            .ids
            .keys()
            .filter(|k| !live.contains(*k))
            .copied()
            .collect();
        for k in gone {
            if let Some(id) = self.ids.remove(&k) {
                self.free.push(id);
            }
        }
        // Keep only the tables this build uses, so the cache never outgrows the table.
        self.maglev = used;
        self.generation += 1;
        t.generation = self.generation;
        self.synced = true;
        // The first update after a full build copies into this rather than into fresh
        // allocations: their page faults are paid here, off the change path.
        if self.spare.is_none() {
            self.spare = Some(copy(&t));
        }
        Ok(t)
    }

    /// Builds the next snapshot from `prev`, the last table this builder made, with the
    /// services in `changes` set or removed; every other service is shared with `prev`.
    /// The gateway-level parts (ports, timeouts, tunnel sources, locals) are `prev`'s.
    /// When a name appears more than once in `changes`, its last change counts.
    ///
    /// The caller validates the services as for [`Builder::build`] (the configuration's
    /// rules for each service, and names and frontends unique across the table).
    ///
    /// # Errors
    /// - [`TableError::Stale`] when `prev` is not the last table this builder made, or an
    ///   earlier update failed: make a full [`Builder::build`] instead;
    /// - [`TableError::FrontendTaken`] when a set service's frontend belongs to another
    ///   service;
    /// - [`TableError::Maglev`] as for [`Builder::build`].
    ///
    /// After an error the builder refuses updates until the next full build.
    pub fn update(
        &mut self,
        prev: &ServiceTable,
        changes: &[Change<'_>],
        down: impl Fn(&str, IpAddr, u16) -> bool,
    ) -> Result<ServiceTable, TableError> {
        if !self.synced || prev.generation != self.generation {
            return Err(TableError::Stale {
                table: prev.generation,
                builder: self.generation,
            });
        }
        self.synced = false;
        // The last change of each name, in the order the names first appear.
        let mut last: HashMap<&str, Change<'_>> = HashMap::with_capacity(changes.len());
        let mut order: Vec<&str> = Vec::with_capacity(changes.len());
        for c in changes {
            if last.insert(c.name(), *c).is_none() {
                order.push(c.name());
            }
        }
        let mut t = match self.spare.take() {
            Some(mut t) => {
                t.services.clone_from(&prev.services);
                t.backends.clone_from(&prev.backends);
                t.ports.clone_from(&prev.ports);
                t.locals.clone_from(&prev.locals);
                t.frontends.clone_from(&prev.frontends);
                t.by_vip_proto.clone_from(&prev.by_vip_proto);
                t.nat_backends.clone_from(&prev.nat_backends);
                t.client_port = prev.client_port;
                t.tunnel_src_v4 = prev.tunnel_src_v4;
                t.tunnel_src_v6 = prev.tunnel_src_v6;
                t.gue_port = prev.gue_port;
                t.timeouts = prev.timeouts;
                t
            }
            None => copy(prev),
        };
        let mut touched: Vec<([u8; 16], u8)> = Vec::new();
        let mut left: Vec<BackendKey> = Vec::new();
        // 1. Take every changed service that exists out of the indexes.
        for name in &order {
            if let Some(&si) = self.slots.get(*name) {
                let old = &prev.services[si as usize];
                self.unindex(&mut t, prev, si, old, &mut touched, &mut left);
            }
        }
        // 2. Drop the removed services; the last service moves into each hole.
        for name in &order {
            if matches!(last[name], Change::Set(_)) {
                continue;
            }
            let Some(si) = self.slots.remove(*name) else {
                continue;
            };
            t.services.swap_remove(si as usize);
            let Some(moved) = t.services.get(si as usize).map(Arc::clone) else {
                continue;
            };
            let from = t.services.len() as u32;
            if let Some(slot) = self.slots.get_mut(moved.name.as_str()) {
                *slot = si;
            }
            if !last.contains_key(moved.name.as_str()) {
                self.relocate(&mut t, &moved, from, si, &mut touched);
            }
        }
        // 3. Build the new and changed services.
        let mut live: HashSet<BackendKey> = HashSet::new();
        let mut made: HashMap<MaglevInput, Arc<maglev::Table>> = HashMap::new();
        for name in &order {
            let Change::Set(s) = last[name] else {
                continue;
            };
            let f = frontend_of(s);
            if let Some(&other) = t.frontends.get(&f) {
                return Err(TableError::FrontendTaken {
                    service: s.name.clone(),
                    other: t.services[other as usize].name.clone(),
                });
            }
            let si = self
                .slots
                .get(s.name.as_str())
                .copied()
                .unwrap_or(t.services.len() as u32);
            let svc = Arc::new(self.make_service(&mut t, si, s, &down, &mut live, &mut made)?);
            touched.push((f.vip, f.proto));
            if si as usize == t.services.len() {
                self.slots.insert(s.name.clone(), si);
                t.services.push(svc);
            } else {
                t.services[si as usize] = svc;
            }
        }
        // 4. Free the ids of backends that left (after allocating, as a full build does,
        // so an id is never reused within the build that freed it).
        for k in left {
            if !live.contains(&k) {
                if let Some(id) = self.ids.remove(&k) {
                    self.free.push(id);
                }
            }
        }
        // 5. The fragment index of the touched (VIP, protocol) pairs.
        for k in touched {
            match self.vips.get(&k) {
                Some(v) if !v.is_empty() => {
                    t.by_vip_proto.insert(k, VipProto::of(v));
                }
                _ => {
                    self.vips.remove(&k);
                    t.by_vip_proto.remove(&k);
                }
            }
        }
        // 6. Keep the new Maglev tables for later builds; drop the unused ones when the
        // cache grows well past the table.
        self.maglev.extend(made);
        if self.maglev.len() > 2 * t.services.len() + MAGLEV_CACHE_SLACK {
            self.maglev.retain(|_, m| Arc::strong_count(m) > 1);
        }
        self.generation += 1;
        t.generation = self.generation;
        self.synced = true;
        Ok(t)
    }

    /// Hands back a table that was replaced, for the next [`Builder::update`] to copy into
    /// (its backend vector and indexes are the size of the next table's, and their pages
    /// are mapped: a copy into them costs no page faults). Kept only when nobody else holds
    /// it any more; otherwise it is just dropped. Call it after the swap, off the latency
    /// path: it may free the table's replaced parts.
    pub fn recycle(&mut self, old: Arc<ServiceTable>) {
        if let Ok(t) = Arc::try_unwrap(old) {
            self.spare = Some(t);
        }
    }

    /// Whether a replaced table is kept for the next [`Builder::update`] to copy into (see
    /// [`Builder::recycle`]): a diagnostic, for tests that check the caller lets go of
    /// replaced tables.
    pub fn has_spare(&self) -> bool {
        self.spare.is_some()
    }

    /// Makes service `s` as index `si` of `t`: allocates its backend ids and fills its
    /// backends and index entries (the fragment index is made from `self.vips` later).
    fn make_service(
        &mut self,
        t: &mut ServiceTable,
        si: u32,
        s: &model::Service,
        down: &impl Fn(&str, IpAddr, u16) -> bool,
        live: &mut HashSet<BackendKey>,
        made: &mut HashMap<MaglevInput, Arc<maglev::Table>>,
    ) -> Result<Service, TableError> {
        let frontend = frontend_of(s);
        let mut backends = Vec::with_capacity(s.backends.len());
        let mut members = Vec::new();
        let mut weighted = Vec::new();
        for b in &s.backends {
            let key = (frontend, addr_bytes(b.address), b.port);
            live.insert(key);
            let id = self.id_for(key);
            let health = if down(&s.name, b.address, b.port) {
                Health::Down
            } else if b.state == BackendState::Draining || b.weight == 0 {
                Health::Draining
            } else {
                Health::Up
            };
            if health == Health::Up {
                members.push(id);
                weighted.push(maglev::Weighted {
                    key: backend_identity(&key),
                    weight: b.weight,
                });
            }
            backends.push(id);
            let entry = Backend {
                id,
                incarnation: self.incarnations[id.0 as usize],
                service: si,
                addr: key.1,
                port: b.port,
                tunnel: addr_bytes(b.tunnel_target()),
                mac: b.mac.map(|m| m.0),
                egress: self.backend_port,
                weight: b.weight,
                health,
            };
            let slot = id.0 as usize;
            if t.backends.len() <= slot {
                t.backends.resize(slot + 1, None);
            }
            if s.mode == Mode::Nat {
                *t.nat_backends
                    .entry((entry.addr, entry.port, frontend.proto))
                    .or_insert(0) += 1;
            }
            t.backends[slot] = Some(entry);
        }
        let input: MaglevInput = (
            s.maglev_table_size,
            weighted.iter().map(|w| (w.key, w.weight)).collect(),
        );
        let maglev =
            match made.get(&input).or_else(|| self.maglev.get(&input)) {
                Some(t) => Arc::clone(t),
                None => Arc::new(maglev::build(&weighted, s.maglev_table_size).map_err(
                    |source| TableError::Maglev {
                        service: s.name.clone(),
                        source,
                    },
                )?),
            };
        made.insert(input, Arc::clone(&maglev));
        let acl = s
            .source_ranges
            .iter()
            .map(|n| Prefix::new(n.addr(), n.prefix_len()))
            .collect();
        t.frontends.insert(frontend, si);
        self.vips
            .entry((frontend.vip, frontend.proto))
            .or_default()
            .push(si);
        Ok(Service {
            name: s.name.clone(),
            frontend,
            mode: s.mode,
            maglev,
            members,
            backends,
            acl,
            affinity_secs: s
                .session_affinity
                .map_or(0, |d| d.as_secs().clamp(1, u32::MAX as u64) as u32),
        })
    }

    /// Takes service `old` (index `si` of `prev`) out of `t`'s indexes and backends; the
    /// keys of its backends go to `left` and its (VIP, protocol) to `touched`.
    fn unindex(
        &mut self,
        t: &mut ServiceTable,
        prev: &ServiceTable,
        si: u32,
        old: &Service,
        touched: &mut Vec<([u8; 16], u8)>,
        left: &mut Vec<BackendKey>,
    ) {
        let f = old.frontend;
        if t.frontends.get(&f) == Some(&si) {
            t.frontends.remove(&f);
        }
        let vk = (f.vip, f.proto);
        if let Some(v) = self.vips.get_mut(&vk) {
            v.retain(|&x| x != si);
        }
        touched.push(vk);
        for &id in &old.backends {
            let Some(b) = prev.backend(id) else { continue };
            if old.mode == Mode::Nat {
                let k = (b.addr, b.port, f.proto);
                if let Some(n) = t.nat_backends.get_mut(&k) {
                    *n -= 1;
                    if *n == 0 {
                        t.nat_backends.remove(&k);
                    }
                }
            }
            if let Some(slot) = t.backends.get_mut(id.0 as usize) {
                *slot = None;
            }
            left.push((f, b.addr, b.port));
        }
    }

    /// Service `s`, unchanged, moved from index `from` to `to`: points its indexes and
    /// backends at the new index.
    fn relocate(
        &mut self,
        t: &mut ServiceTable,
        s: &Service,
        from: u32,
        to: u32,
        touched: &mut Vec<([u8; 16], u8)>,
    ) {
        if let Some(v) = t.frontends.get_mut(&s.frontend) {
            *v = to;
        }
        let vk = (s.frontend.vip, s.frontend.proto);
        if let Some(v) = self.vips.get_mut(&vk) {
            for x in v.iter_mut().filter(|x| **x == from) {
                *x = to;
            }
        }
        touched.push(vk);
        for &id in &s.backends {
            if let Some(Some(b)) = t.backends.get_mut(id.0 as usize) {
                b.service = to;
            }
        }
    }

    fn id_for(&mut self, key: BackendKey) -> BackendId {
        if let Some(id) = self.ids.get(&key) {
            return *id;
        }
        let id = self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            BackendId(self.next - 1)
        });
        self.ids.insert(key, id);
        self.allocations = self.allocations.wrapping_add(1);
        if self.incarnations.len() <= id.0 as usize {
            self.incarnations.resize(id.0 as usize + 1, 0);
        }
        self.incarnations[id.0 as usize] = self.allocations;
        id
    }
}

/// A copy of `t` (its services shared).
fn copy(t: &ServiceTable) -> ServiceTable {
    ServiceTable {
        generation: t.generation,
        services: t.services.clone(),
        backends: t.backends.clone(),
        ports: t.ports.clone(),
        client_port: t.client_port,
        tunnel_src_v4: t.tunnel_src_v4,
        tunnel_src_v6: t.tunnel_src_v6,
        gue_port: t.gue_port,
        timeouts: t.timeouts,
        locals: t.locals.clone(),
        frontends: t.frontends.clone(),
        by_vip_proto: t.by_vip_proto.clone(),
        nat_backends: t.nat_backends.clone(),
    }
}

/// A configured service's frontend in key form.
fn frontend_of(s: &model::Service) -> Frontend {
    Frontend {
        vip: addr_bytes(s.vip),
        port: s.port,
        proto: s.protocol.number(),
    }
}

/// A backend's identity hash for Maglev: depends only on (address, port), so the same
/// backend keeps its permutation in every build and on every gateway.
fn backend_identity(key: &BackendKey) -> u64 {
    let mut b = [0u8; 18];
    b[..16].copy_from_slice(&key.1);
    b[16..].copy_from_slice(&key.2.to_be_bytes());
    crate::hash::hash_bytes(crate::hash::SEED_MAGLEV, &b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(web_backends: &[&str]) -> Config {
        let b = |addrs: &[&str], port| {
            addrs
                .iter()
                .map(|a| {
                    format!("{{ address = \"{a}\", port = {port}, mac = \"02:00:00:00:01:11\" }}")
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        strait_config::parse(&format!(
            r#"
[[gateway.interfaces]]
name = "eth0"
queues = [0]
[[services]]
name = "web"
vip = "203.0.113.10"
port = 80
maglev_table_size = 251
backends = [{}]
[[services]]
name = "api"
vip = "203.0.113.11"
port = 443
maglev_table_size = 251
backends = [{}]
"#,
            b(web_backends, 80),
            b(&["198.51.100.21", "198.51.100.22"], 443)
        ))
        .unwrap()
    }

    #[test]
    fn unchanged_services_share_their_maglev_tables_across_builds() {
        let ports = [Port {
            mac: [2, 0, 0, 0, 0, 1],
            mtu: 1500,
        }];
        let mut b = Builder::new();
        let t1 = b
            .build(
                &config(&["198.51.100.11", "198.51.100.12"]),
                &ports,
                |_, _, _| false,
            )
            .unwrap();
        let t2 = b
            .build(
                &config(&["198.51.100.11", "198.51.100.12", "198.51.100.13"]),
                &ports,
                |_, _, _| false,
            )
            .unwrap();
        assert!(
            !Arc::ptr_eq(&t1.services[0].maglev, &t2.services[0].maglev),
            "web changed: new table"
        );
        assert!(
            Arc::ptr_eq(&t1.services[1].maglev, &t2.services[1].maglev),
            "api unchanged: same table"
        );
        // A kept backend keeps its id, and the shared table still names the right members.
        assert_eq!(t1.services[0].backends[..2], t2.services[0].backends[..2]);
        assert_eq!(t1.services[1].members, t2.services[1].members);
        // Health changes are inputs too: a down backend leaves the table.
        let t3 = b
            .build(
                &config(&["198.51.100.11", "198.51.100.12", "198.51.100.13"]),
                &ports,
                |_, a, _| a.to_string() == "198.51.100.21",
            )
            .unwrap();
        assert!(!Arc::ptr_eq(&t2.services[1].maglev, &t3.services[1].maglev));
        assert_eq!(t3.services[1].members.len(), 1);
        assert_eq!(t3.generation, 3);
    }

    /// The random-sequence test: services drawn from small pools of names, VIPs, ports and
    /// backends so that frontends move between services, VIPs are shared (the fragment
    /// index) and nat backends are shared between services (the reply index).
    mod incremental {
        use std::collections::BTreeMap;
        use std::net::Ipv4Addr;
        use std::time::Duration;

        use proptest::prelude::*;
        use strait_config::model::{Backend as CfgBackend, Gateway, Interface, MacAddr, Protocol};

        use super::*;

        const NAMES: usize = 10;

        /// One service's draw: (vip, port, udp, mode, acl, affinity, backends as (host,
        /// port, weight, draining)).
        type Draw = (u8, u8, bool, u8, bool, bool, Vec<(u8, u8, u8, bool)>);

        fn service(name: usize, d: &Draw) -> model::Service {
            let (vip, port, udp, mode, acl, affinity, backends) = d;
            let mut bs: Vec<CfgBackend> = Vec::new();
            for &(host, bport, weight, draining) in backends {
                let address = IpAddr::V4(Ipv4Addr::new(198, 51, 100, host % 8));
                let port = 8000 + u16::from(bport % 2);
                if bs.iter().any(|b| b.address == address && b.port == port) {
                    continue;
                }
                bs.push(CfgBackend {
                    address,
                    port,
                    weight: u32::from(weight % 3),
                    mac: Some(MacAddr([2, 0, 0, 0, 1, host])),
                    tunnel: None,
                    state: if draining {
                        BackendState::Draining
                    } else {
                        BackendState::Active
                    },
                });
            }
            model::Service {
                name: format!("svc{name}"),
                vip: IpAddr::V4(Ipv4Addr::new(203, 0, 113, vip % 3)),
                port: 80 + u16::from(port % 3),
                protocol: if *udp { Protocol::Udp } else { Protocol::Tcp },
                mode: [Mode::Nat, Mode::DsrL2, Mode::Nat][usize::from(mode % 3)],
                maglev_table_size: 13,
                source_ranges: if *acl {
                    vec!["192.0.2.0/24".parse().unwrap()]
                } else {
                    Vec::new()
                },
                session_affinity: affinity.then_some(Duration::from_secs(60)),
                health_check: None,
                backends: bs,
            }
        }

        fn draw() -> impl Strategy<Value = Draw> {
            (
                any::<u8>(),
                any::<u8>(),
                any::<bool>(),
                any::<u8>(),
                any::<bool>(),
                any::<bool>(),
                proptest::collection::vec(
                    (any::<u8>(), any::<u8>(), any::<u8>(), any::<bool>()),
                    0..6,
                ),
            )
        }

        /// A step: for some names, a new draw (set) or `None` (remove).
        fn step() -> impl Strategy<Value = Vec<(usize, Option<Draw>)>> {
            proptest::collection::vec((0..NAMES, proptest::option::weighted(0.8, draw())), 1..4)
        }

        fn config(state: &BTreeMap<usize, model::Service>) -> Config {
            let mut gateway =
                strait_config::parse("[[gateway.interfaces]]\nname = \"eth0\"\nqueues = [0]\n")
                    .unwrap()
                    .gateway;
            gateway.interfaces = vec![Interface {
                name: "eth0".into(),
                queues: vec![0],
                cores: None,
                role: Role::Both,
            }];
            Config {
                gateway: Gateway { ..gateway },
                services: state.values().cloned().collect(),
            }
        }

        fn down(_: &str, a: IpAddr, _: u16) -> bool {
            a == IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7))
        }

        type Addr = ([u8; 16], u16);

        /// A service with every id resolved: what a table says, whatever its numbering.
        #[derive(Debug, PartialEq)]
        struct Canon {
            frontend: Frontend,
            mode: Mode,
            acl: Vec<Prefix>,
            affinity: u32,
            backends: Vec<Backend>,
            members: Vec<Addr>,
            maglev_size: u32,
            slots: Vec<Option<Addr>>,
        }

        /// The table by service name, ids resolved, after checking that its indexes agree
        /// with its services.
        fn canon(t: &ServiceTable) -> BTreeMap<String, Canon> {
            let mut out = BTreeMap::new();
            let mut nat: HashMap<([u8; 16], u16, u8), u32> = HashMap::new();
            let mut vips: HashMap<([u8; 16], u8), Vec<u32>> = HashMap::new();
            let mut ids = 0;
            for (si, s) in t.services.iter().enumerate() {
                let si = si as u32;
                let f = s.frontend;
                assert_eq!(t.service_for(&f), Some(si), "{}: frontend index", s.name);
                vips.entry((f.vip, f.proto)).or_default().push(si);
                let resolve = |id: BackendId| {
                    let b = t
                        .backend(id)
                        .unwrap_or_else(|| panic!("{}: id {id:?}", s.name));
                    assert_eq!((b.id, b.service), (id, si), "{}: backend entry", s.name);
                    b.clone()
                };
                let backends: Vec<Backend> = s.backends.iter().map(|&id| resolve(id)).collect();
                ids += backends.len();
                if s.mode == Mode::Nat {
                    for b in &backends {
                        *nat.entry((b.addr, b.port, f.proto)).or_insert(0) += 1;
                    }
                }
                let members: Vec<Addr> = s
                    .members
                    .iter()
                    .map(|&id| {
                        let b = resolve(id);
                        (b.addr, b.port)
                    })
                    .collect();
                let slots = s
                    .maglev
                    .slots()
                    .iter()
                    .map(|&m| members.get(usize::from(m)).copied())
                    .collect();
                let backends = backends
                    .into_iter()
                    .map(|b| Backend {
                        // Ids and incarnations number a builder's own history, which
                        // differs between the incremental and the full builder.
                        id: BackendId(0),
                        incarnation: 0,
                        service: 0,
                        ..b
                    })
                    .collect();
                let c = Canon {
                    frontend: f,
                    mode: s.mode,
                    acl: s.acl.clone(),
                    affinity: s.affinity_secs,
                    backends,
                    members,
                    maglev_size: s.maglev.size(),
                    slots,
                };
                assert!(out.insert(s.name.clone(), c).is_none(), "{}: twice", s.name);
            }
            assert_eq!(t.frontends.len(), t.services.len(), "frontend index size");
            assert_eq!(t.backends.iter().flatten().count(), ids, "orphan backends");
            assert_eq!(t.nat_backends, nat, "nat backend index");
            let vips: HashMap<_, _> = vips.iter().map(|(k, v)| (*k, VipProto::of(v))).collect();
            assert_eq!(t.by_vip_proto, vips, "fragment index");
            out
        }

        /// Backend ids by key (frontend, address, port).
        fn ids(t: &ServiceTable) -> HashMap<(Frontend, Addr), BackendId> {
            t.services
                .iter()
                .flat_map(|s| {
                    s.backends.iter().map(move |&id| {
                        let b = t.backend(id).unwrap();
                        ((s.frontend, (b.addr, b.port)), id)
                    })
                })
                .collect()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(200))]

            #[test]
            fn incremental_updates_equal_full_builds(
                first in proptest::collection::vec(proptest::option::of(draw()), NAMES),
                steps in proptest::collection::vec(step(), 1..12),
            ) {
                let ports = [Port { mac: [2, 0, 0, 0, 0, 1], mtu: 1500 }];
                let fits = |state: &BTreeMap<usize, model::Service>, n: usize, s: &model::Service| {
                    !state.iter().any(|(&m, o)| {
                        m != n && (o.vip, o.port, o.protocol) == (s.vip, s.port, s.protocol)
                    })
                };
                let mut state = BTreeMap::new();
                for (n, d) in first.iter().enumerate() {
                    if let Some(d) = d {
                        let s = service(n, d);
                        if fits(&state, n, &s) {
                            state.insert(n, s);
                        }
                    }
                }
                let mut inc = Builder::new();
                let mut table = inc.build(&config(&state), &ports, down).unwrap();
                let mut full = Builder::new();
                for step in steps {
                    let mut changes: Vec<(usize, Option<model::Service>)> = Vec::new();
                    for (n, d) in step {
                        match d {
                            Some(d) => {
                                let s = service(n, &d);
                                if fits(&state, n, &s) {
                                    state.insert(n, s.clone());
                                    changes.push((n, Some(s)));
                                }
                            }
                            None => {
                                state.remove(&n);
                                changes.push((n, None));
                            }
                        }
                    }
                    let names: Vec<String> = changes.iter().map(|(n, _)| format!("svc{n}")).collect();
                    let list: Vec<Change<'_>> = changes
                        .iter()
                        .zip(&names)
                        .map(|((_, s), name)| match s {
                            Some(s) => Change::Set(s),
                            None => Change::Remove(name),
                        })
                        .collect();
                    let next = inc.update(&table, &list, down).unwrap();
                    prop_assert_eq!(next.generation, table.generation + 1);
                    let want = full.build(&config(&state), &ports, down).unwrap();
                    prop_assert_eq!(canon(&next), canon(&want));
                    // A backend that stayed keeps its id; unchanged services are shared.
                    let (before, after) = (ids(&table), ids(&next));
                    for (k, id) in &after {
                        if let Some(old) = before.get(k) {
                            prop_assert_eq!(old, id, "{:?} changed id", k);
                        }
                    }
                    for s in &next.services {
                        let changed = names.contains(&s.name);
                        if let (false, Some(old)) = (changed, table.services.iter().find(|o| o.name == s.name)) {
                            prop_assert!(Arc::ptr_eq(old, s), "{} unchanged but rebuilt", s.name);
                        }
                    }
                    // Every other replaced table goes back to the builder, so updates
                    // copy both into fresh allocations and into recycled ones.
                    let old = std::mem::replace(&mut table, next);
                    if table.generation.is_multiple_of(2) {
                        inc.recycle(Arc::new(old));
                    }
                }
            }
        }

        #[test]
        fn updates_need_the_last_table_and_a_free_frontend() {
            let ports = [Port {
                mac: [2, 0, 0, 0, 0, 1],
                mtu: 1500,
            }];
            let d: Draw = (1, 0, false, 0, false, false, vec![(1, 0, 1, false)]);
            let a = service(0, &d);
            let state = BTreeMap::from([(0, a.clone())]);
            let mut b = Builder::new();
            let stale = ServiceTable::empty(ports.to_vec());
            assert!(matches!(
                b.update(&stale, &[], down),
                Err(TableError::Stale { .. })
            ));
            let t1 = b.build(&config(&state), &ports, down).unwrap();
            // Another name on a's frontend is refused, and the builder then wants a full build.
            let mut clash = a.clone();
            clash.name = "other".into();
            let e = b.update(&t1, &[Change::Set(&clash)], down).unwrap_err();
            assert_eq!(
                e.to_string(),
                "service other: its frontend belongs to service svc0"
            );
            assert!(matches!(
                b.update(&t1, &[], down),
                Err(TableError::Stale { .. })
            ));
            let t2 = b.build(&config(&state), &ports, down).unwrap();
            // Moving the frontend in the same update is fine.
            let t3 = b
                .update(&t2, &[Change::Set(&clash), Change::Remove("svc0")], down)
                .unwrap();
            assert_eq!(t3.services.len(), 1);
            assert_eq!(t3.services[0].name, "other");
            // An older table is refused.
            assert!(matches!(
                b.update(&t2, &[], down),
                Err(TableError::Stale { .. })
            ));
        }
    }
}
