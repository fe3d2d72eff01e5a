//! The service table: one immutable snapshot of everything the workers decide on.
//!
//! The control thread builds a complete [`ServiceTable`] off the packet path (services,
//! backends, Maglev tables, next-hop MACs, ACLs) and publishes it with an atomic pointer swap;
//! workers load it once per RX batch and only read it. Nothing in here is ever mutated after
//! [`Builder::build`] returns, so a half-built table can never be seen.
//!
//! Backends are stored by [`BackendId`] in a dense vector. [`Builder`] keeps ids stable across
//! rebuilds for as long as a (service, address, port) exists, so a flow entry's stored id still
//! names the same backend after a reload, and finding it is one index.

use core::net::IpAddr;
use std::sync::Arc;

use hashbrown::HashMap;
use strait_config::model::{BackendState, Config, Mode, Role};

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
    /// Services, in configuration order.
    pub services: Vec<Service>,
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
    nat_backends: HashMap<([u8; 16], u16, u8), ()>,
}

#[derive(Clone, Copy, Debug)]
enum VipProto {
    One(u32),
    Several,
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
}

/// Identity of a backend for id allocation: (service frontend, address, port).
type BackendKey = (Frontend, [u8; 16], u16);

/// What a Maglev table is a function of: its size and the weighted members, in member
/// order (the member order also fixes which index a slot names).
type MaglevInput = (u32, Vec<(u64, u32)>);

/// Builds snapshots and keeps backend ids stable between them.
///
/// It also keeps the Maglev tables of the previous build: a service whose members, weights
/// and table size did not change gets the same table (an `Arc`), so a change to one service
/// of ten thousand rebuilds one Maglev table, not ten thousand. Building the tables is most of
/// the cost of a snapshot.
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
        let role_port = |want: Role| {
            gw.interfaces
                .iter()
                .position(|i| i.role == want || i.role == Role::Both)
                .unwrap_or(0) as u8
        };
        let backend_port = role_port(Role::Backend);
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

        let mut live: HashMap<BackendKey, ()> = HashMap::new();
        let mut used: HashMap<MaglevInput, Arc<maglev::Table>> = HashMap::new();
        for (si, s) in cfg.services.iter().enumerate() {
            let frontend = Frontend {
                vip: addr_bytes(s.vip),
                port: s.port,
                proto: s.protocol.number(),
            };
            let mut backends = Vec::with_capacity(s.backends.len());
            let mut members = Vec::new();
            let mut weighted = Vec::new();
            for b in &s.backends {
                let key = (frontend, addr_bytes(b.address), b.port);
                live.insert(key, ());
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
                    service: si as u32,
                    addr: key.1,
                    port: b.port,
                    tunnel: addr_bytes(b.tunnel_target()),
                    mac: b.mac.map(|m| m.0),
                    egress: backend_port,
                    weight: b.weight,
                    health,
                };
                let slot = id.0 as usize;
                if t.backends.len() <= slot {
                    t.backends.resize(slot + 1, None);
                }
                if s.mode == Mode::Nat {
                    t.nat_backends
                        .insert((entry.addr, entry.port, frontend.proto), ());
                }
                t.backends[slot] = Some(entry);
            }
            let input: MaglevInput = (
                s.maglev_table_size,
                weighted.iter().map(|w| (w.key, w.weight)).collect(),
            );
            let maglev = match self.maglev.get(&input) {
                Some(t) => Arc::clone(t),
                None => Arc::new(maglev::build(&weighted, s.maglev_table_size).map_err(
                    |source| TableError::Maglev {
                        service: s.name.clone(),
                        source,
                    },
                )?),
            };
            used.insert(input, Arc::clone(&maglev));
            let acl = s
                .source_ranges
                .iter()
                .map(|n| Prefix::new(n.addr(), n.prefix_len()))
                .collect();
            t.frontends.insert(frontend, si as u32);
            t.by_vip_proto
                .entry((frontend.vip, frontend.proto))
                .and_modify(|v| *v = VipProto::Several)
                .or_insert(VipProto::One(si as u32));
            t.services.push(Service {
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
            });
        }
        // Free the ids of backends that left, for reuse by later builds.
        let gone: Vec<BackendKey> = self
            .ids
            .keys()
            .filter(|k| !live.contains_key(*k))
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
        Ok(t)
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
}
