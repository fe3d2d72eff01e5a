//! The validated configuration model.
//!
//! Every value here has already passed validation ([`crate::parse`]): ports are non-zero, table sizes
//! are prime, families match, defaults are filled in. Code that holds a [`Config`] never
//! re-checks it. The types are plain data (`Debug, Clone, PartialEq`) so the control plane
//! can diff two configurations and the dataplane can build its tables from them.
//!
//! Each default is an associated constant with a comment saying where its value comes from;
//! the TOML reference with the same defaults is `strait.example.toml`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;

/// A whole, validated configuration: the gateway itself and the services it balances.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Settings of the box: interfaces, flow table, timeouts, admin endpoint.
    pub gateway: Gateway,
    /// Statically configured services, in file order. May be empty (a Kubernetes source
    /// adds services at run time).
    pub services: Vec<Service>,
}

/// Settings of the gateway box (`[gateway]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Gateway {
    /// Where the admin / metrics HTTP endpoint listens.
    pub admin_listen: SocketAddr,
    /// A Unix socket the admin API also listens on (mode 0600: root only), where the
    /// mutating requests (`POST /reload`, `POST /drain`) are taken, if set.
    pub admin_socket: Option<std::path::PathBuf>,
    /// A file holding a token: mutating requests on a TCP listener that is not loopback
    /// are taken with `Authorization: Bearer TOKEN`, and refused (403) without it.
    pub admin_token_file: Option<std::path::PathBuf>,
    /// Forwarding mode of services that do not name one.
    pub default_mode: Mode,
    /// Number of flow-table entries each worker core owns.
    pub flow_capacity_per_core: u32,
    /// New flows per second and core that are remembered in the flow table; above it new
    /// flows are still forwarded by Maglev but not remembered. 0 means unlimited.
    pub new_flows_per_second_per_core: u32,
    /// Destination UDP port of `dsr-gue` encapsulation.
    pub gue_port: u16,
    /// Outer source address for `dsr-ipip` / `dsr-gue` over IPv4, if set.
    pub tunnel_source_v4: Option<Ipv4Addr>,
    /// Outer source address for `dsr-ipip` / `dsr-gue` over IPv6, if set.
    pub tunnel_source_v6: Option<Ipv6Addr>,
    /// The MTU set on DPDK ports (with AF_XDP the interface's own MTU is the port's, which
    /// encapsulated packets must fit). Read at start.
    pub mtu: u16,
    /// Idle timeouts of flow-table entries.
    pub timeouts: Timeouts,
    /// Data interfaces and the queues / cores that serve them. Never empty.
    pub interfaces: Vec<Interface>,
    /// How long a draining gateway (`strait drain`, SIGTERM) keeps forwarding after it
    /// withdrew its routes, while routers move traffic away. Defaults to
    /// [`Gateway::DEFAULT_DRAIN_GRACE`] with `[gateway.bgp]`, and to zero without it (no
    /// router is told anything, so waiting would only delay the stop).
    pub drain_grace: Duration,
    /// Route announcement of the VIPs over BGP (`[gateway.bgp]`), if configured.
    pub bgp: Option<Bgp>,
    /// VIP failover between gateways on one segment by VRRP (`[gateway.l2]`), if
    /// configured.
    pub l2: Option<L2>,
    /// Flow-state sync with peer gateways (`[gateway.sync]`), if configured.
    pub sync: Option<FlowSync>,
    /// DPDK's EAL options (`[gateway.dpdk]`), when interfaces use `driver = "dpdk"`.
    pub dpdk: Option<Dpdk>,
}

/// EAL options of a gateway whose interfaces use DPDK (`[gateway.dpdk]`). The EAL cores
/// come from the interfaces' `cores`, the devices from their `device`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dpdk {
    /// Memory EAL reserves at start, in MiB (`-m`). `None`: EAL's default (grown from
    /// hugepages as needed; 64 MiB with `no_huge`).
    pub memory_mb: Option<u32>,
    /// Run without hugepages (`--no-huge`): for vdevs on kernel interfaces (tests, VMs);
    /// physical NICs need hugepages.
    pub no_huge: bool,
    /// EAL's runtime directory name (`--file-prefix`); two DPDK processes on one machine need
    /// different ones. `None`: `strait-PID`.
    pub file_prefix: Option<String>,
}

impl Dpdk {
    /// Largest `gateway.mtu` with DPDK ports: a frame is received into one mbuf of 2048
    /// bytes of data (`RTE_MBUF_DEFAULT_BUF_SIZE` less the headroom), which holds the
    /// Ethernet header (14 bytes), an 802.1Q tag (4) and 2030 bytes of IP packet.
    pub const MAX_MTU: u16 = 2030;
    /// Smallest `memory_mb`: EAL alone needs tens of MiB.
    pub const MIN_MEMORY_MB: u32 = 64;
    /// Largest `memory_mb` (1 TiB), beyond any machine: a larger number is a mistake.
    pub const MAX_MEMORY_MB: u32 = 1 << 20;
}

/// How an interface's frames reach the workers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum Driver {
    /// AF_XDP sockets and the XDP steering program on a kernel interface (the default).
    #[default]
    AfXdp,
    /// A DPDK port; the kernel sees it through a TAP of the interface's name.
    Dpdk {
        /// The EAL device: a PCI address (`0000:03:00.0`) or a vdev
        /// (`net_af_packet0,iface=eth1`).
        device: String,
    },
}

impl Driver {
    /// `af_xdp` or `dpdk`, as in the file.
    pub fn name(&self) -> &'static str {
        match self {
            Driver::AfXdp => "af_xdp",
            Driver::Dpdk { .. } => "dpdk",
        }
    }
}

/// Flow-state sync with peer gateways (`[gateway.sync]`): every flow this gateway creates is
/// sent to the peers, and theirs are learnt here, so that a flow keeps its backend when a
/// router moves it to another gateway or this one restarts (see `strait_dataplane::sync`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowSync {
    /// The UDP address this gateway sends from and receives on.
    pub listen: SocketAddr,
    /// The peers' `listen` addresses; datagrams from any other address are refused.
    pub peers: Vec<SocketAddr>,
}

impl Gateway {
    /// Default of `admin_listen`: loopback only, so metrics and the admin API are not
    /// exposed on the data network unless asked for.
    pub const DEFAULT_ADMIN_LISTEN: SocketAddr =
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 9900));
    /// Default of `default_mode`: `dsr-l2` keeps the client address and needs nothing on the
    /// nodes but the VIP being accepted, which kube-proxy already does for LoadBalancer IPs.
    pub const DEFAULT_MODE: Mode = Mode::DsrL2;
    /// Default of `flow_capacity_per_core`: 2^20 entries, the order of Katran's
    /// `MAX_CONNECTIONS` (1,000,000 in `lib/bpf/balancer_consts.h`), per core rather than
    /// per box since each worker owns its table.
    pub const DEFAULT_FLOW_CAPACITY_PER_CORE: u32 = 1 << 20;
    /// Upper bound of `flow_capacity_per_core`: 2^28 entries. At a few tens of bytes per
    /// entry that is already gigabytes per core; a larger value is a typo, not a plan.
    pub const MAX_FLOW_CAPACITY_PER_CORE: u32 = 1 << 28;
    /// Default of `new_flows_per_second_per_core`: Katran's `MAX_CONN_RATE` (125000, in
    /// `lib/bpf/balancer_consts.h`), above which Katran bypasses its LRU update, as we do.
    pub const DEFAULT_NEW_FLOWS_PER_SECOND_PER_CORE: u32 = 125_000;
    /// Default of `gue_port`: Katran's `GUE_DPORT` (6080, `lib/bpf/balancer_consts.h`), so
    /// nodes already decapsulating Katran's GUE need no change.
    pub const DEFAULT_GUE_PORT: u16 = 6080;
    /// Default of `mtu`: Ethernet's 1500.
    pub const DEFAULT_MTU: u16 = 1500;
    /// Smallest accepted `mtu`: 576, the datagram size every IPv4 host must accept
    /// (RFC 791).
    pub const MIN_MTU: u16 = 576;
    /// Largest accepted `mtu`: 9000, the common jumbo-frame size.
    pub const MAX_MTU: u16 = 9000;
    /// Smallest `mtu` when any service has an IPv6 VIP: IPv6's minimum link MTU, 1280
    /// (RFC 8200 section 5).
    pub const MIN_MTU_IPV6: u16 = 1280;
    /// Default of `drain_grace`: 5 s, a BGP UPDATE's way through a ToR and a spine with
    /// margin (withdrawals are sent at once, not paced by MRAI), and the order of MetalLB's
    /// and kube-vip's leader-election renew deadlines.
    pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(5);
    /// Upper bound of `drain_grace`: 10 minutes; longer is a typo, not a plan.
    pub const MAX_DRAIN_GRACE: Duration = Duration::from_secs(600);
}

/// Route announcement over BGP (`[gateway.bgp]`), spoken by a BIRD 2 daemon that the
/// gateway runs as its child (see `strait_control::bgp`).
///
/// Each VIP is announced as a /32 or /128 while the workers forward and one of its
/// services has a backend that takes new flows; it is withdrawn when none has, when the
/// gateway drains and on shutdown.
#[derive(Debug, Clone, PartialEq)]
pub struct Bgp {
    /// Local autonomous system number.
    pub asn: u32,
    /// BGP router id (an IPv4 address, unique per speaker).
    pub router_id: Ipv4Addr,
    /// The peers (routers) to announce to. Never empty.
    pub peers: Vec<BgpPeer>,
    /// Standard communities `(asn, value)` added to every announcement.
    pub communities: Vec<(u16, u16)>,
    /// Which VIPs are announced: those inside one of these prefixes; empty means every VIP.
    pub announce: Vec<IpNet>,
    /// The BIRD 2 daemon to run.
    pub daemon: std::path::PathBuf,
}

impl Bgp {
    /// Default of `daemon`: Debian's `bird2` package puts it here.
    pub const DEFAULT_DAEMON: &'static str = "/usr/sbin/bird";

    /// Whether `vip` is to be announced (inside `announce`, or `announce` is empty).
    pub fn announces(&self, vip: IpAddr) -> bool {
        self.announce.is_empty() || self.announce.iter().any(|n| n.contains(&vip))
    }
}

/// VIP failover on one segment (`[gateway.l2]`), for sites without BGP: the gateways in
/// `members` elect one owner per VIP with VRRP (RFC 5798, spoken by keepalived, the
/// gateway's child); the owner holds the VIP on its client interface, answers ARP/ND for
/// it and announces it with gratuitous ARP / unsolicited NA the moment it takes over.
/// VIPs are spread over the members: each VRRP instance (a hash of the VIP picks one of
/// 255 per family) ranks the members its own way, the same on every gateway.
#[derive(Debug, Clone, PartialEq)]
pub struct L2 {
    /// This gateway's name: one of `members`.
    pub name: String,
    /// Every gateway on the segment, the same list on each.
    pub members: Vec<String>,
    /// VRRP advertisement interval: a dead owner is replaced after three of them (less
    /// when it stops in order: it says so with priority 0).
    pub advert_interval: Duration,
    /// The keepalived daemon to run.
    pub daemon: std::path::PathBuf,
}

impl L2 {
    /// Default of `daemon`: Debian's `keepalived` package puts it here.
    pub const DEFAULT_DAEMON: &'static str = "/usr/sbin/keepalived";
    /// Default of `advert_interval`: 100 ms, so a dead owner is replaced in about 350 ms
    /// (three intervals and the skew), where MetalLB's layer 2 mode takes 10 s and more.
    pub const DEFAULT_ADVERT_INTERVAL: Duration = Duration::from_millis(100);
    /// Smallest `advert_interval`: VRRPv3 counts in centiseconds.
    pub const MIN_ADVERT_INTERVAL: Duration = Duration::from_millis(10);
    /// Largest `advert_interval`: 4095 centiseconds (a 12-bit field).
    pub const MAX_ADVERT_INTERVAL: Duration = Duration::from_millis(40_950);
    /// Most members: each one's priority is 10 apart below 250.
    pub const MAX_MEMBERS: usize = 24;
}

/// A BGP peer (`[[gateway.bgp.peers]]`).
#[derive(Debug, Clone, PartialEq)]
pub struct BgpPeer {
    /// The peer's address; it must be on a directly connected network (no multihop).
    pub address: IpAddr,
    /// The peer's autonomous system number (equal to the local one: iBGP).
    pub asn: u32,
    /// TCP port of the peer's BGP speaker.
    pub port: u16,
    /// TCP MD5 signature password (RFC 2385), if the peer asks for one.
    pub password: Option<String>,
    /// Follow the session with BFD (RFC 5880), which finds a dead peer or a dead gateway
    /// in 300 ms where the hold timer takes seconds.
    pub bfd: bool,
    /// BGP hold time; the keepalive interval is a third of it.
    pub hold_time: Duration,
}

impl BgpPeer {
    /// Default of `port`: BGP's 179.
    pub const DEFAULT_PORT: u16 = 179;
    /// Default of `hold_time`: 9 s, a third of RFC 4271's suggested 90 s, as is usual
    /// between a ToR and its servers; BFD or a closed session finds a dead gateway sooner.
    pub const DEFAULT_HOLD_TIME: Duration = Duration::from_secs(9);
    /// Smallest non-zero hold time: 3 s (RFC 4271 section 4.2).
    pub const MIN_HOLD_TIME: Duration = Duration::from_secs(3);
    /// Largest hold time: 65535 s (a 16-bit field).
    pub const MAX_HOLD_TIME: Duration = Duration::from_secs(65535);
}

/// Idle timeouts of flow-table entries, by protocol and TCP state (`[gateway.timeouts]`).
///
/// An entry that times out is not a broken connection: its next packet is hashed by Maglev
/// again and, as long as the backend set is unchanged, lands on the same backend. Timeouts
/// therefore trade flow-table room against stickiness across backend changes (and, in
/// `nat` mode, against replies that arrive after the entry is gone).
///
/// Reference values: Linux conntrack defaults from
/// [`Documentation/networking/nf_conntrack-sysctl.rst`](https://docs.kernel.org/networking/nf_conntrack-sysctl.html)
/// and kube-proxy's `--conntrack-tcp-timeout-*` flags.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeouts {
    /// TCP flow that has seen a SYN but no established traffic yet.
    pub tcp_syn: Duration,
    /// TCP flow past the handshake.
    pub tcp_established: Duration,
    /// TCP flow that has seen a FIN or RST.
    pub tcp_closing: Duration,
    /// UDP flow.
    pub udp: Duration,
}

impl Timeouts {
    /// Default `tcp_syn`: 30 s. Conntrack uses 120 s (`nf_conntrack_tcp_timeout_syn_sent`)
    /// and 60 s (`..._syn_recv`); a gateway's half-open entries are what a SYN flood fills
    /// the table with, so we keep them shorter. 30 s still covers the first five SYN
    /// retransmissions of a Linux client (1+2+4+8+16 s), and a later one re-hashes to the
    /// same backend anyway.
    pub const DEFAULT_TCP_SYN: Duration = Duration::from_secs(30);
    /// Default `tcp_established`: 7440 s (2 h 4 min), the least a NAT may use (RFC 5382,
    /// REQ-5), which is also Linux's default keepalive time (`tcp_keepalive_time`, 7200 s)
    /// plus margin, so keepalive-only connections survive in `nat` mode. Conntrack keeps
    /// 5 days (`nf_conntrack_tcp_timeout_established` = 432000 s) and kube-proxy sets 24 h
    /// (`--conntrack-tcp-timeout-established`); those tables belong to one node, ours holds
    /// a whole cluster's flows, so we take the standard's floor.
    pub const DEFAULT_TCP_ESTABLISHED: Duration = Duration::from_secs(7440);
    /// Default `tcp_closing`: 10 s, conntrack's `nf_conntrack_tcp_timeout_close`. Conntrack
    /// keeps FIN_WAIT / TIME_WAIT for 120 s to judge stray segments; we need not judge them,
    /// and a late segment re-hashes to the same backend.
    pub const DEFAULT_TCP_CLOSING: Duration = Duration::from_secs(10);
    /// Default `udp`: 30 s, conntrack's `nf_conntrack_udp_timeout` and Katran's
    /// `LRU_UDP_TIMEOUT`.
    pub const DEFAULT_UDP: Duration = Duration::from_secs(30);
    /// Longest accepted timeout: 7 days. Longer ones are typos, and they make a full table
    /// the normal state.
    pub const MAX: Duration = Duration::from_secs(7 * 24 * 3600);
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            tcp_syn: Self::DEFAULT_TCP_SYN,
            tcp_established: Self::DEFAULT_TCP_ESTABLISHED,
            tcp_closing: Self::DEFAULT_TCP_CLOSING,
            udp: Self::DEFAULT_UDP,
        }
    }
}

/// A data interface and the queues the gateway serves on it (`[[gateway.interfaces]]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Interface {
    /// Kernel interface name (1 to 15 bytes).
    pub name: String,
    /// NIC queue ids, one AF_XDP socket and one worker each. Non-empty, no duplicates.
    pub queues: Vec<u32>,
    /// CPU each queue's worker is pinned to, same length as `queues`; `None` leaves the
    /// choice to the control plane.
    pub cores: Option<Vec<usize>>,
    /// Which side of a two-arm topology the interface faces.
    pub role: Role,
    /// 802.1Q VLAN ids (1..=4094, no duplicates, in file order) whose tagged frames the
    /// interface serves, besides untagged ones. Empty (the default): untagged only; a tagged
    /// frame of any other VLAN is left to the kernel by the steering program, or dropped
    /// (`vlan_not_served`) by a worker it reaches.
    pub vlans: Vec<u16>,
    /// AF_XDP (the default) or DPDK; every interface of a gateway uses the same one.
    pub driver: Driver,
}

impl Interface {
    /// The largest VLAN id (4095 is reserved by 802.1Q; 0 marks a priority tag, no VLAN).
    pub const MAX_VLAN: u16 = 4094;

    /// The largest CPU a worker may be pinned to: the last CPU of the kernel's default
    /// affinity mask (`CPU_SETSIZE` = 1024 with glibc), far beyond any machine this runs on,
    /// so a larger number is a mistake in the file.
    pub const MAX_CORE: usize = 1023;
}

/// Which side of the gateway an interface faces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Role {
    /// Faces the clients: VIP traffic arrives here.
    Client,
    /// Faces the backends: forwarded traffic leaves here.
    Backend,
    /// One-arm: both (the default).
    #[default]
    Both,
}

/// Forwarding mode of a service; see DESIGN.md, "Forwarding modes".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Rewrite the destination MAC only; the backend holds the VIP and answers directly.
    DsrL2,
    /// Encapsulate in IPv4-in-IPv4 / IPv6 (IP-in-IP); the backend answers directly.
    DsrIpip,
    /// Encapsulate in UDP (Generic UDP Encapsulation); the backend answers directly.
    DsrGue,
    /// Rewrite destination address and port; replies come back through the gateway.
    Nat,
}

impl Mode {
    /// Every mode, in the order the configuration documents them.
    pub const ALL: [Mode; 4] = [Mode::DsrL2, Mode::DsrIpip, Mode::DsrGue, Mode::Nat];

    /// The configuration spelling: `dsr-l2`, `dsr-ipip`, `dsr-gue`, `nat`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::DsrL2 => "dsr-l2",
            Mode::DsrIpip => "dsr-ipip",
            Mode::DsrGue => "dsr-gue",
            Mode::Nat => "nat",
        }
    }

    /// Whether replies bypass the gateway (and so the backend port must equal the
    /// service port).
    pub const fn is_dsr(self) -> bool {
        !matches!(self, Mode::Nat)
    }

    /// Whether packets are encapsulated towards a tunnel target.
    pub const fn is_tunnel(self) -> bool {
        matches!(self, Mode::DsrIpip | Mode::DsrGue)
    }
}

/// Transport protocol of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP (RFC 9260): ports like TCP and UDP, a CRC32c checksum over the whole packet.
    Sctp,
}

impl Protocol {
    /// Every protocol.
    pub const ALL: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

    /// IP protocol number (IANA): 6 for TCP, 17 for UDP, 132 for SCTP.
    pub const fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    /// The configuration spelling: `tcp`, `udp`, `sctp`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 3] = [Role::Client, Role::Backend, Role::Both];

    /// The configuration spelling: `client`, `backend`, `both`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Backend => "backend",
            Role::Both => "both",
        }
    }
}

/// A load-balanced service: one frontend `(vip, port, protocol)` and its backends
/// (`[[services]]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Service {
    /// Unique name, `[a-z0-9-./_]+` (so `namespace/name` from Kubernetes fits).
    pub name: String,
    /// Virtual IP clients connect to.
    pub vip: IpAddr,
    /// Frontend port, non-zero.
    pub port: u16,
    /// Transport protocol.
    pub protocol: Protocol,
    /// Forwarding mode (the gateway's `default_mode` when the file does not name one).
    pub mode: Mode,
    /// Maglev lookup table size: a prime no smaller than the number of backends.
    pub maglev_table_size: u32,
    /// Allowed client ranges (`loadBalancerSourceRanges`), same family as `vip`.
    /// Empty means every client.
    pub source_ranges: Vec<IpNet>,
    /// ClientIP session affinity timeout; `None` means no affinity.
    pub session_affinity: Option<Duration>,
    /// Active health check of the backends; `None` means backends are taken as healthy.
    pub health_check: Option<HealthCheck>,
    /// Passive health (nat mode): how many failed connection attempts within how long take
    /// a backend out of new flows; `None` means off ([`PassiveHealth::default_for`]).
    pub passive_health: Option<PassiveHealth>,
    /// How long a backend that comes up (added, healthy again, no longer draining) takes
    /// to ramp from a small share of its weight to all of it, in whole seconds; `None`
    /// means at once (`control::core`'s slow start says how the ramp goes).
    pub slow_start: Option<Duration>,
    /// Backends, in file order, unique by `(address, port)`. May be empty.
    pub backends: Vec<Backend>,
    /// BGP attributes the gateway sets on the route of this service's VIP.
    pub route: RouteAttrs,
}

/// BGP attributes of a VIP's route, set by its services (`bgp_communities`,
/// `bgp_large_communities`, `bgp_local_pref`) on top of `[gateway.bgp] communities`.
/// Services that share a VIP share its route: it carries every community any of them
/// names and the highest local preference.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct RouteAttrs {
    /// Standard communities (RFC 1997), `(asn, value)`.
    pub communities: Vec<(u16, u16)>,
    /// Large communities (RFC 8092), `(global admin, local 1, local 2)`.
    pub large_communities: Vec<(u32, u32, u32)>,
    /// LOCAL_PREF (RFC 4271 section 5.1.5); it travels over iBGP sessions only.
    pub local_pref: Option<u32>,
}

impl RouteAttrs {
    /// Whether it sets nothing.
    pub fn is_empty(&self) -> bool {
        self.communities.is_empty()
            && self.large_communities.is_empty()
            && self.local_pref.is_none()
    }

    /// Adds `other`'s attributes: the union of the communities (sorted, once each) and the
    /// higher local preference.
    pub fn merge(&mut self, other: &RouteAttrs) {
        self.communities.extend_from_slice(&other.communities);
        self.communities.sort_unstable();
        self.communities.dedup();
        self.large_communities
            .extend_from_slice(&other.large_communities);
        self.large_communities.sort_unstable();
        self.large_communities.dedup();
        self.local_pref = self.local_pref.max(other.local_pref);
    }
}

impl Service {
    /// Default `maglev_table_size`: 65537, the Maglev paper's and Katran's (`RING_SIZE`)
    /// size for up to a few hundred backends.
    pub const DEFAULT_MAGLEV_TABLE_SIZE: u32 = 65_537;
    /// Smallest accepted table size.
    pub const MIN_MAGLEV_TABLE_SIZE: u32 = 7;
    /// Largest accepted table size: about twice the paper's large size 655373.
    pub const MAX_MAGLEV_TABLE_SIZE: u32 = 1_310_719;
    /// Most backends of one service: 65,535, every 16-bit index a Maglev slot holds but the
    /// one that means "no backend" (the dataplane's `maglev::MAX_BACKENDS`).
    pub const MAX_BACKENDS: usize = 65_535;
    /// Default session affinity timeout: 10800 s (3 h), Kubernetes' default
    /// `sessionAffinityConfig.clientIP.timeoutSeconds`.
    pub const DEFAULT_AFFINITY_TIMEOUT: Duration = Duration::from_secs(10_800);
    /// Longest session affinity timeout: 86400 s (1 day), Kubernetes' maximum.
    pub const MAX_AFFINITY_TIMEOUT: Duration = Duration::from_secs(86_400);
    /// Shortest session affinity timeout: 1 s, Kubernetes' minimum.
    pub const MIN_AFFINITY_TIMEOUT: Duration = Duration::from_secs(1);
    /// Shortest `slow_start`: one step of the ramp (the weight steps at most once a
    /// second).
    pub const MIN_SLOW_START: Duration = Duration::from_secs(1);
    /// Longest `slow_start`: 1 h. A backend warms up in seconds to minutes (Envoy's
    /// examples use 60 s); a longer ramp only delays its full share.
    pub const MAX_SLOW_START: Duration = Duration::from_secs(3600);

    /// The frontend as a socket address (`vip:port`).
    pub fn frontend(&self) -> SocketAddr {
        SocketAddr::new(self.vip, self.port)
    }
}

/// Passive health of a nat service's backends (`[services.passive_health]`): the gateway
/// sees each backend's answers to new connections, and a backend that refuses or leaves
/// unanswered `failures` of them within `window` (summed over the worker cores) takes no new
/// flows until its active check passes again; its existing flows stay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassiveHealth {
    /// Failed connection attempts that take a backend out.
    pub failures: u32,
    /// The time they must fall within.
    pub window: Duration,
}

impl PassiveHealth {
    /// Default `failures`: 3. A backend whose listener closed refuses thousands of
    /// connections a second under load, so three come within a millisecond of each other;
    /// one or two in a second from a healthy one (a full accept queue) do not take it out.
    pub const DEFAULT_FAILURES: u32 = 3;
    /// Largest `failures`.
    pub const MAX_FAILURES: u32 = 10_000;
    /// Default `window`: 1 s.
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(1);
    /// Shortest `window`: 10 ms, a few of the control side's looks.
    pub const MIN_WINDOW: Duration = Duration::from_millis(10);
    /// Longest `window`: 1 min.
    pub const MAX_WINDOW: Duration = Duration::from_secs(60);

    /// The defaults.
    pub const DEFAULT: PassiveHealth = PassiveHealth {
        failures: Self::DEFAULT_FAILURES,
        window: Self::DEFAULT_WINDOW,
    };

    /// Passive health of a service that does not set `[services.passive_health]`: on, with
    /// the defaults, where it can work (nat mode, TCP or SCTP, with an active check to bring
    /// a backend back), off elsewhere.
    pub fn default_for(
        mode: Mode,
        protocol: Protocol,
        check: Option<&HealthCheck>,
    ) -> Option<PassiveHealth> {
        Self::applies(mode, protocol, check)
            .is_ok()
            .then_some(Self::DEFAULT)
    }

    /// Whether passive health can work on a service: why not, in words, if not.
    ///
    /// # Errors
    /// DSR modes (the backends' answers do not pass through the gateway), UDP (no
    /// connection to refuse), no active check (nothing would bring a backend back).
    pub fn applies(
        mode: Mode,
        protocol: Protocol,
        check: Option<&HealthCheck>,
    ) -> Result<(), &'static str> {
        if mode != Mode::Nat {
            return Err("needs mode = \"nat\": in DSR modes the backends answer the clients directly and the gateway sees no answer (DSR backends have active checks only)");
        }
        if protocol == Protocol::Udp {
            return Err("needs protocol tcp or sctp: UDP has no connection to refuse");
        }
        if check.is_none() {
            return Err("needs [services.health_check]: a backend taken out comes back when its active check passes");
        }
        Ok(())
    }
}

/// Active health check of a service's backends (`[services.health_check]`).
#[derive(Debug, Clone, PartialEq)]
pub struct HealthCheck {
    /// What is checked.
    pub kind: HealthKind,
    /// Port to check; `None` means each backend's own port.
    pub port: Option<u16>,
    /// Time between two checks of one backend.
    pub interval: Duration,
    /// How long one check may take; shorter than `interval`.
    pub timeout: Duration,
    /// Consecutive successes before a backend is up.
    pub rise: u32,
    /// Consecutive failures before a backend is down.
    pub fall: u32,
}

impl HealthCheck {
    /// Default `interval`: 1 s.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
    /// Shortest `interval`: 10 ms; below it checks become load.
    pub const MIN_INTERVAL: Duration = Duration::from_millis(10);
    /// Longest `interval`: 1 hour. A check that rare says nothing about a backend's health
    /// now; a larger value is a typo (and would overflow the checker's clock arithmetic).
    pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);
    /// Default `timeout`: 500 ms, half the default interval.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);
    /// Default `rise`: 2, HAProxy's default.
    pub const DEFAULT_RISE: u32 = 2;
    /// Default `fall`: 3, HAProxy's default.
    pub const DEFAULT_FALL: u32 = 3;
    /// Largest `rise` / `fall`.
    pub const MAX_RISE_FALL: u32 = 100;
    /// Default HTTP path when `kind = "http"` gives none.
    pub const DEFAULT_HTTP_PATH: &'static str = "/";
    /// Largest `payload` and `expect` of a `udp` check: 1472 bytes, the UDP payload of one
    /// unfragmented datagram on a 1500-byte IPv4 link.
    pub const MAX_PAYLOAD: usize = 1472;
    /// Default `qtype` of a `dns` check.
    pub const DEFAULT_QTYPE: DnsType = DnsType::A;

    /// The port to check `backend` on.
    pub fn port_for(&self, backend: &Backend) -> u16 {
        self.port.unwrap_or(backend.port)
    }
}

/// What a health check does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthKind {
    /// A TCP connect succeeds.
    Tcp,
    /// `GET path` answers with a 2xx status.
    Http {
        /// Absolute request path, starting with `/`.
        path: String,
    },
    /// A datagram `payload` sent to the backend's UDP port gets a reply within the
    /// timeout (one that starts with `expect`, when given). An ICMP port unreachable is a
    /// failure at once.
    Udp {
        /// The datagram sent, 1 to [`HealthCheck::MAX_PAYLOAD`] bytes.
        payload: Vec<u8>,
        /// What the reply must start with; `None` takes any reply.
        expect: Option<Vec<u8>>,
    },
    /// A DNS query over UDP for `query` / `qtype` gets a well-formed answer with the
    /// query's id and an rcode of NOERROR or NXDOMAIN.
    Dns {
        /// The name asked for, without a trailing dot.
        query: String,
        /// The record type asked for.
        qtype: DnsType,
    },
}

impl HealthKind {
    /// The configuration spelling of the kind: `tcp`, `http`.
    pub fn as_str(&self) -> &'static str {
        match self {
            HealthKind::Tcp => "tcp",
            HealthKind::Http { .. } => "http",
            HealthKind::Udp { .. } => "udp",
            HealthKind::Dns { .. } => "dns",
        }
    }

    /// Whether the check speaks UDP (and so needs a UDP service).
    pub fn is_udp(&self) -> bool {
        matches!(self, HealthKind::Udp { .. } | HealthKind::Dns { .. })
    }
}

/// A DNS record type a `dns` health check asks for (`qtype`), by its mnemonic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DnsType {
    /// `A`: an IPv4 address.
    A,
    /// `NS`: a name server.
    Ns,
    /// `CNAME`: a canonical name.
    Cname,
    /// `SOA`: the start of a zone of authority.
    Soa,
    /// `PTR`: a domain name pointer.
    Ptr,
    /// `MX`: a mail exchange.
    Mx,
    /// `TXT`: text.
    Txt,
    /// `AAAA`: an IPv6 address.
    Aaaa,
    /// `SRV`: a service location.
    Srv,
}

impl DnsType {
    /// Every type, in the order the configuration documents them.
    pub const ALL: [DnsType; 9] = [
        DnsType::A,
        DnsType::Aaaa,
        DnsType::Cname,
        DnsType::Mx,
        DnsType::Ns,
        DnsType::Ptr,
        DnsType::Soa,
        DnsType::Srv,
        DnsType::Txt,
    ];

    /// The type's number on the wire (IANA DNS parameters, RFC 1035 section 3.2.2, RFC
    /// 3596, RFC 2782).
    pub const fn code(self) -> u16 {
        match self {
            DnsType::A => 1,
            DnsType::Ns => 2,
            DnsType::Cname => 5,
            DnsType::Soa => 6,
            DnsType::Ptr => 12,
            DnsType::Mx => 15,
            DnsType::Txt => 16,
            DnsType::Aaaa => 28,
            DnsType::Srv => 33,
        }
    }

    /// The configuration spelling: `A`, `AAAA`, `CNAME`...
    pub const fn as_str(self) -> &'static str {
        match self {
            DnsType::A => "A",
            DnsType::Ns => "NS",
            DnsType::Cname => "CNAME",
            DnsType::Soa => "SOA",
            DnsType::Ptr => "PTR",
            DnsType::Mx => "MX",
            DnsType::Txt => "TXT",
            DnsType::Aaaa => "AAAA",
            DnsType::Srv => "SRV",
        }
    }
}

/// A backend of a service (`[[services.backends]]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Backend {
    /// Address of the backend (a node in DSR modes, an endpoint in `nat`).
    pub address: IpAddr,
    /// Port; equal to the service port in DSR modes.
    pub port: u16,
    /// Maglev weight, 0..=65535; 0 takes no new flows.
    pub weight: u32,
    /// Next-hop MAC, if known statically (otherwise resolved by the control plane).
    pub mac: Option<MacAddr>,
    /// Encapsulation target for `dsr-ipip` / `dsr-gue`; `None` means `address`.
    pub tunnel: Option<IpAddr>,
    /// Whether the backend takes new flows.
    pub state: BackendState,
}

impl Backend {
    /// Default `weight`: 100, so weights can be lowered in percent steps.
    pub const DEFAULT_WEIGHT: u32 = 100;
    /// Largest `weight`.
    pub const MAX_WEIGHT: u32 = 65_535;

    /// The backend as a socket address (`address:port`).
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.address, self.port)
    }

    /// Where encapsulated packets go: `tunnel` if set, else `address`.
    pub fn tunnel_target(&self) -> IpAddr {
        self.tunnel.unwrap_or(self.address)
    }
}

/// Whether a backend takes new flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BackendState {
    /// Takes new flows (the default).
    #[default]
    Active,
    /// Keeps its existing flows, takes no new ones.
    Draining,
}

impl BackendState {
    /// Every state.
    pub const ALL: [BackendState; 2] = [BackendState::Active, BackendState::Draining];

    /// The configuration spelling: `active`, `draining`.
    pub const fn as_str(self) -> &'static str {
        match self {
            BackendState::Active => "active",
            BackendState::Draining => "draining",
        }
    }
}

/// An Ethernet MAC address. Parsed from and displayed as six colon-separated hex octets
/// (`02:00:00:00:00:11`); parsing ignores case, display is lower case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The octets.
    pub const fn octets(self) -> [u8; 6] {
        self.0
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

/// Why a string is not a [`MacAddr`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a MAC address (like 02:00:00:00:00:11)")]
pub struct ParseMacError(pub String);

impl FromStr for MacAddr {
    type Err = ParseMacError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseMacError(s.to_owned());
        let mut octets = [0u8; 6];
        let mut parts = s.split(':');
        for octet in &mut octets {
            let part = parts.next().ok_or_else(err)?;
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err());
            }
            *octet = u8::from_str_radix(part, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(MacAddr(octets))
    }
}

/// Why a string is not one of an enum's configuration spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not one of {}", expected.join(", "))]
pub struct ParseEnumError {
    /// The string that was given.
    pub value: String,
    /// The accepted spellings.
    pub expected: Vec<&'static str>,
}

macro_rules! spelled_enum {
    ($ty:ident) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = ParseEnumError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $ty::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| ParseEnumError {
                        value: s.to_owned(),
                        expected: $ty::ALL.iter().map(|v| v.as_str()).collect(),
                    })
            }
        }
    };
}

spelled_enum!(Mode);
spelled_enum!(Protocol);
spelled_enum!(Role);
spelled_enum!(BackendState);
spelled_enum!(DnsType);

/// Whether `n` is prime (deterministic trial division by 6k +- 1; at most ~600 divisions
/// for any `u32`).
pub fn is_prime(n: u32) -> bool {
    if n < 4 {
        return n >= 2;
    }
    if n.is_multiple_of(2) || n.is_multiple_of(3) {
        return false;
    }
    let n = u64::from(n);
    let mut d: u64 = 5;
    while d * d <= n {
        if n % d == 0 || n % (d + 2) == 0 {
            return false;
        }
        d += 6;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primes() {
        let small: Vec<u32> = (0..50).filter(|&n| is_prime(n)).collect();
        assert_eq!(
            small,
            [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47]
        );
        assert!(is_prime(65_537));
        assert!(is_prime(655_373));
        assert!(!is_prime(65_536));
        assert!(!is_prime(65_539 * 3));
        assert!(!is_prime(25));
        assert!(!is_prime(49));
        assert!(is_prime(4_294_967_291)); // largest u32 prime
        assert!(!is_prime(u32::MAX));
        assert!(!is_prime(65_521 * 65_519)); // both factors near sqrt(u32::MAX)
    }

    #[test]
    fn mac_parse_and_display() {
        let mac: MacAddr = "02:AB:cd:00:00:11".parse().unwrap();
        assert_eq!(mac, MacAddr([0x02, 0xab, 0xcd, 0, 0, 0x11]));
        assert_eq!(mac.to_string(), "02:ab:cd:00:00:11");
        for bad in [
            "",
            "02:00:00:00:00",
            "02:00:00:00:00:11:22",
            "02-00-00-00-00-11",
            "2:00:00:00:00:11",
            "02:00:00:00:00:1g",
            "+2:00:00:00:00:11",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad} accepted");
        }
        assert_eq!(
            "x".parse::<MacAddr>().unwrap_err().to_string(),
            "\"x\" is not a MAC address (like 02:00:00:00:00:11)"
        );
    }

    #[test]
    fn enum_spellings_round_trip() {
        for m in Mode::ALL {
            assert_eq!(m.to_string().parse::<Mode>().unwrap(), m);
        }
        for p in Protocol::ALL {
            assert_eq!(p.as_str().parse::<Protocol>().unwrap(), p);
        }
        for r in Role::ALL {
            assert_eq!(r.as_str().parse::<Role>().unwrap(), r);
        }
        for s in BackendState::ALL {
            assert_eq!(s.as_str().parse::<BackendState>().unwrap(), s);
        }
        assert_eq!(
            "dsr-foo".parse::<Mode>().unwrap_err().to_string(),
            "\"dsr-foo\" is not one of dsr-l2, dsr-ipip, dsr-gue, nat"
        );
    }

    #[test]
    fn protocol_numbers() {
        assert_eq!(Protocol::Tcp.number(), 6);
        assert_eq!(Protocol::Udp.number(), 17);
        assert_eq!(Protocol::Sctp.number(), 132);
        assert_eq!("sctp".parse::<Protocol>().unwrap(), Protocol::Sctp);
        assert_eq!(
            "icmp".parse::<Protocol>().unwrap_err().to_string(),
            "\"icmp\" is not one of tcp, udp, sctp"
        );
    }

    #[test]
    fn mode_properties() {
        assert!(Mode::DsrL2.is_dsr() && !Mode::DsrL2.is_tunnel());
        assert!(Mode::DsrIpip.is_dsr() && Mode::DsrIpip.is_tunnel());
        assert!(Mode::DsrGue.is_dsr() && Mode::DsrGue.is_tunnel());
        assert!(!Mode::Nat.is_dsr() && !Mode::Nat.is_tunnel());
    }

    #[test]
    fn timeouts_default_is_documented_constants() {
        let t = Timeouts::default();
        assert_eq!(t.tcp_syn, Duration::from_secs(30));
        assert_eq!(t.tcp_established, Duration::from_secs(7440));
        assert_eq!(t.tcp_closing, Duration::from_secs(10));
        assert_eq!(t.udp, Duration::from_secs(30));
        assert!(t.tcp_syn <= t.tcp_established);
    }
}
