//! Making service tables: [`Builder::build`] from a whole configuration, [`Builder::update`]
//! from the live table and the services that changed. The builder keeps what makes
//! successive tables agree (backend ids and incarnations, Maglev tables by their input) and
//! the memory of replaced tables to build the next one into.

use std::sync::Arc;

use hashbrown::{HashMap, HashSet};
use strait_config::model::{self, BackendState, Config, Mode, Role};

use super::*;
use crate::flow::Timeouts;
use crate::key::{addr_bytes, Addr, BackendId, Proto, ServiceId};
use crate::maglev;

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
type BackendKey = (Frontend, Addr, u16);

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
    /// Service ids by name, as backend ids by key: stable while the name exists, freed ids
    /// reused later under a new incarnation (drawn from `allocations` too).
    service_ids: HashMap<String, ServiceId>,
    service_free: Vec<ServiceId>,
    service_next: u32,
    service_incarnations: Vec<u32>,
    generation: u64,
    maglev: HashMap<MaglevInput, Arc<maglev::Table>>,
    /// Each service's index in the last table, by name.
    slots: HashMap<String, u32>,
    /// The services on each (VIP, protocol) of the last table, by index: the source of the
    /// fragment index.
    vips: HashMap<(Addr, Proto), Vec<u32>>,
    /// Egress port of every backend, from the interface roles of the last full build.
    backend_port: u8,
    /// Whether the builder's state describes the last table it made (false before the first
    /// build and after a failed update): [`Builder::update`] needs it.
    synced: bool,
    /// A replaced table handed back ([`Builder::recycle`]): the next update copies into
    /// its allocations, whose pages are already mapped.
    spare: Option<ServiceTable>,
    /// The gateway's own addresses in key form, put into every table made
    /// ([`Builder::set_locals`]).
    locals: Vec<Addr>,
}

impl Builder {
    /// A builder with no history.
    pub fn new() -> Self {
        Self::default()
    }

    /// The gateway's own addresses ([`ServiceTable::locals`]): every table made from now on
    /// holds them, so a table is complete when the builder returns it.
    pub fn set_locals(&mut self, addrs: &[IpAddr]) {
        self.locals = addrs.iter().map(|&a| addr_bytes(a)).collect();
    }

    /// Builds a snapshot from a validated configuration.
    ///
    /// `ports` gives the MAC and MTU of each configured interface, in configuration order
    /// (the IO layer reads them from the kernel); each port's VLANs are set from its
    /// interface's `vlans`. `down(service, address, port)` says whether
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
        t.locals.clone_from(&self.locals);
        for (p, i) in t.ports.iter_mut().zip(&gw.interfaces) {
            p.vlans = Vlans::of(&i.vlans);
        }
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
        t.frontends.reserve(cfg.services.len());
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
        // And the ids of services that left.
        let names: HashSet<&str> = cfg.services.iter().map(|s| s.name.as_str()).collect();
        let free = &mut self.service_free;
        self.service_ids.retain(|name, id| {
            let keep = names.contains(name.as_str());
            if !keep {
                free.push(*id);
            }
            keep
        });
        t.service_ids = self.service_next;
        // Keep only the tables this build uses, so the cache never outgrows the table.
        self.maglev = used;
        self.generation += 1;
        t.generation = self.generation;
        t.serial = super::next_serial();
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
    /// The gateway-level parts (ports, timeouts, tunnel sources) are `prev`'s; the local
    /// addresses are the builder's ([`Builder::set_locals`]).
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
                t.frontends.clone_from(&prev.frontends);
                t.by_vip_proto.clone_from(&prev.by_vip_proto);
                t.nat_backends.clone_from(&prev.nat_backends);
                t.nat_shared = prev.nat_shared;
                t.client_port = prev.client_port;
                t.tunnel_src_v4 = prev.tunnel_src_v4;
                t.tunnel_src_v6 = prev.tunnel_src_v6;
                t.gue_port = prev.gue_port;
                t.timeouts = prev.timeouts;
                t
            }
            None => copy(prev),
        };
        t.locals.clone_from(&self.locals);
        let mut touched: Vec<(Addr, Proto)> = Vec::new();
        let mut left: Vec<BackendKey> = Vec::new();
        // 1. Take every changed service that exists out of the indexes.
        for name in &order {
            if let Some(&si) = self.slots.get(*name) {
                let old = &prev.services[si as usize];
                self.unindex(&mut t, prev, si, old, &mut touched, &mut left);
            }
        }
        // 2. Drop the removed services; the last service moves into each hole.
        let mut gone_services: Vec<&str> = Vec::new();
        for name in &order {
            if matches!(last[name], Change::Set(_)) {
                continue;
            }
            let Some(si) = self.slots.remove(*name) else {
                continue;
            };
            gone_services.push(*name);
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
            if let Some(other) = t.frontends.get(&f.vip, f.port, f.proto) {
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
        // 4. Free the ids of backends and services that left (after allocating, as a full
        // build does, so an id is never reused within the build that freed it).
        for k in left {
            if !live.contains(&k) {
                if let Some(id) = self.ids.remove(&k) {
                    self.free.push(id);
                }
            }
        }
        for name in gone_services {
            if let Some(id) = self.service_ids.remove(name) {
                self.service_free.push(id);
            }
        }
        t.service_ids = self.service_next;
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
        t.serial = super::next_serial();
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
                mac: b.mac.map(|m| Mac(m.0)),
                egress: self.backend_port,
                weight: b.weight,
                health,
            };
            let slot = id.0 as usize;
            if t.backends.len() <= slot {
                t.backends.resize(slot + 1, None);
            }
            if s.mode == Mode::Nat {
                let owners = t
                    .nat_backends
                    .entry((entry.addr, entry.port, frontend.proto))
                    .or_default();
                let was = owners.shared();
                owners.add(frontend.vip, frontend.port);
                t.nat_shared += u32::from(!was && owners.shared());
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
        t.frontends
            .insert(frontend.vip, frontend.port, frontend.proto, si);
        self.vips
            .entry((frontend.vip, frontend.proto))
            .or_default()
            .push(si);
        let id = self.service_id_for(&s.name);
        Ok(Service {
            name: s.name.clone(),
            id,
            incarnation: self.service_incarnations[id.0 as usize],
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
        touched: &mut Vec<(Addr, Proto)>,
        left: &mut Vec<BackendKey>,
    ) {
        let f = old.frontend;
        if t.frontends.get(&f.vip, f.port, f.proto) == Some(si) {
            t.frontends.remove(&f.vip, f.port, f.proto);
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
                if let Some(owners) = t.nat_backends.get_mut(&k) {
                    let was = owners.shared();
                    let empty = owners.remove(f.vip, f.port);
                    t.nat_shared -= u32::from(was && !owners.shared());
                    if empty {
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
        touched: &mut Vec<(Addr, Proto)>,
    ) {
        let f = s.frontend;
        if let Some(v) = t.frontends.get_mut(&f.vip, f.port, f.proto) {
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

    /// The id of the service named `name`: its own while it exists, else a free or fresh one
    /// with a new incarnation.
    fn service_id_for(&mut self, name: &str) -> ServiceId {
        if let Some(id) = self.service_ids.get(name) {
            return *id;
        }
        let id = self.service_free.pop().unwrap_or_else(|| {
            self.service_next += 1;
            ServiceId(self.service_next - 1)
        });
        self.service_ids.insert(name.to_owned(), id);
        self.allocations = self.allocations.wrapping_add(1);
        if self.service_incarnations.len() <= id.0 as usize {
            self.service_incarnations.resize(id.0 as usize + 1, 0);
        }
        self.service_incarnations[id.0 as usize] = self.allocations;
        id
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
        serial: super::next_serial(),
        services: t.services.clone(),
        backends: t.backends.clone(),
        ports: t.ports.clone(),
        client_port: t.client_port,
        tunnel_src_v4: t.tunnel_src_v4,
        tunnel_src_v6: t.tunnel_src_v6,
        gue_port: t.gue_port,
        timeouts: t.timeouts,
        locals: t.locals.clone(),
        service_ids: t.service_ids,
        frontends: t.frontends.clone(),
        by_vip_proto: t.by_vip_proto.clone(),
        nat_backends: t.nat_backends.clone(),
        nat_shared: t.nat_shared,
    }
}

/// A configured service's frontend in key form.
fn frontend_of(s: &model::Service) -> Frontend {
    Frontend {
        vip: addr_bytes(s.vip),
        port: s.port,
        proto: Proto(s.protocol.number()),
    }
}

/// A backend's identity hash for Maglev: depends only on (address, port), so the same
/// backend keeps its permutation in every build and on every gateway.
fn backend_identity(key: &BackendKey) -> u64 {
    let mut b = [0u8; 18];
    b[..16].copy_from_slice(key.1.octets());
    b[16..].copy_from_slice(&key.2.to_be_bytes());
    crate::hash::hash_bytes(crate::hash::SEED_MAGLEV, &b)
}
