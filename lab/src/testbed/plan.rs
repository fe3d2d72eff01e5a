//! The testbed as data: namespace names, addresses, MACs, and the `ip` commands that build
//! it. Nothing here runs a command, so the safety rule, "every command acts inside one of
//! the testbed's own namespaces", is a unit test that needs no root.
//!
//! ```text
//! one-arm                                    two-arm
//!
//! client eth0 ─┐                             client eth0 ── veth-c gw veth-b ─┐
//! gw veth-gw ──┤ br0 in {prefix}-sw                                            │ br0 in
//! b1 eth0 ─────┤ (one L2 segment,            b1 eth0 ─────────────────────────┤ {prefix}-sw
//! bN eth0 ─────┘  both subnets)              bN eth0 ─────────────────────────┘
//! ```
//!
//! Addresses (RFC 5737 / RFC 3849 documentation ranges only):
//!
//! | who | IPv4 | IPv6 | MAC |
//! |---|---|---|---|
//! | client | 192.0.2.2/24 | 2001:db8:c::2/64 | 02:00:00:00:00:c1 |
//! | gateway, client side | 192.0.2.1/24 | 2001:db8:c::1/64 | 02:00:00:00:00:01 |
//! | gateway, backend side | 198.51.100.1/24 | 2001:db8:b::1/64 | 02:00:00:00:00:01 |
//! | backend i (1-based) | 198.51.100.(10 + i)/24 | 2001:db8:b::(10 + i)/64 | 02:00:00:00:01:(0x10 + i) |
//! | VIP | 203.0.113.10 | 2001:db8::10 | |
//!
//! The gateway has one MAC on both sides (two-arm: two interfaces on two segments), as the
//! pipeline tests assume. Backend i's addresses and MAC end in the same digits ("b3" is
//! 198.51.100.13, 2001:db8:b::13, 02:00:00:00:01:13), so a capture reads at a glance. The
//! bridge-side end of each veth has its peer's MAC with 0xfe in the fourth octet.
//!
//! One-arm runs `dsr-l2`: the backends hold the VIP on `lo` with `arp_ignore=1` and
//! `arp_announce=2` (so they neither answer ARP for it nor use it as an ARP source) and
//! reach the client on-link, straight through the bridge. Two-arm runs `nat`: backends
//! route everything through the gateway, whose kernel forwards (ip_forward on), so the
//! kernel path is there for comparison when no `strait` runs.
//!
//! DPDK (`--driver dpdk`): the gateway's veths are renamed `dp-gw` (`dp-c`, `dp-b`) and
//! become the wires of DPDK ports (`--vdev`: `net_af_packet`, or `net_af_xdp`), without
//! addresses and with the kernel's stack blind to them (an nftables ingress drop, and with
//! `net_af_xdp` libxdp's program takes every frame first); the gateway's addresses go on persistent TAPs named as the
//! AF_XDP layout's interfaces (`veth-gw`, ...), which the gateway attaches to as its ports'
//! exception interfaces. Clients and backends see the same addresses and MAC.
//!
//! Every endpoint keeps the kernel's default offloads, as a container or a VM's tap does:
//! its veth hands the gateway `CHECKSUM_PARTIAL` frames whose TCP/UDP checksum field holds
//! only the pseudo-header sum, which the gateway must complete (`checksum_completed` in its
//! metrics), so every end-to-end test over the testbed covers it. The peers of the
//! gateway's interfaces have GRO on: a veth delivers `XDP_TX` / `XDP_REDIRECT` frames only to a peer that runs NAPI,
//! which GRO (or an XDP program of its own) turns on (kernel 5.13+).

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use strait_config::MacAddr;

use super::Topology;
use crate::vdev::Vdev;

/// The IPv4 VIP of every generated service.
pub const VIP4: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
/// The IPv6 VIP.
pub const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x10);
/// The VIP range the client routes through the gateway.
pub const VIP4_NET: &str = "203.0.113.0/24";
/// The IPv6 VIP range the client routes through the gateway.
pub const VIP6_NET: &str = "2001:db8::/64";
/// The client's address.
pub const CLIENT4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
/// The client's IPv6 address.
pub const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xc, 0, 0, 0, 0, 2);
/// The gateway's address on the client segment.
pub const GW_CLIENT4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// The gateway's IPv6 address on the client segment.
pub const GW_CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xc, 0, 0, 0, 0, 1);
/// The gateway's address on the backend segment.
pub const GW_BACKEND4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
/// The gateway's IPv6 address on the backend segment.
pub const GW_BACKEND6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xb, 0, 0, 0, 0, 1);
/// The client segment.
pub const CLIENT4_NET: &str = "192.0.2.0/24";
/// The IPv6 client segment.
pub const CLIENT6_NET: &str = "2001:db8:c::/64";
/// The backend segment.
pub const BACKEND4_NET: &str = "198.51.100.0/24";
/// The IPv6 backend segment.
pub const BACKEND6_NET: &str = "2001:db8:b::/64";
/// The gateway's MAC, on every gateway interface.
pub const GW_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x01]);
/// The client's MAC.
pub const CLIENT_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0xc1]);
/// Most backends: 198.51.100.11 ..= 198.51.100.210, MAC last octets 0x11 ..= 0xd8.
pub const MAX_BACKENDS: usize = 200;
/// TCP port of the `dsr-l2` service, served by every backend.
pub const HTTP_PORT: u16 = 80;
/// TCP port the `nat` service translates to, also served by every backend.
pub const NAT_PORT: u16 = 8080;
/// UDP echo port of every backend (the `dsr-l2` UDP service's port, and the `nat` UDP
/// service's target).
pub const UDP_PORT: u16 = 5353;
/// Frontend port of the `nat` UDP service.
pub const NAT_UDP_PORT: u16 = 53;
/// Longest accepted prefix; the names stay readable in `ip netns list`.
pub const MAX_PREFIX: usize = 32;

/// Most gateways of one testbed (`testbed up --gateways N`).
pub const MAX_GATEWAYS: usize = 4;

/// How the client reaches the gateways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    /// One gateway, the client's next hop (the layout drawn above).
    Direct,
    /// A router namespace between the client and the gateways, BGP and ECMP
    /// (`--gateways N`, see `fleet`).
    Router,
    /// The gateways on the client's segment, no router (`--gateways N --l2`).
    L2,
}

/// Name of the bridge in the switch namespace.
pub(super) const BRIDGE: &str = "br0";

/// Whether `prefix` may name a testbed: 1 to [`MAX_PREFIX`] bytes of `[a-z0-9-]`,
/// starting with a letter or digit. Keeps names safe in paths and in `ip` arguments.
pub fn valid_prefix(prefix: &str) -> bool {
    !prefix.is_empty()
        && prefix.len() <= MAX_PREFIX
        && !prefix.starts_with('-')
        && prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Whether namespace `name` belongs to the testbed `prefix`: `{prefix}-client`, `-gw`,
/// `-sw`, `-rt`, `-gw{digits}` or `-b{digits}`, nothing else. A prefix that is a prefix of another one
/// (`strait` and `strait-x`) does not claim the other's namespaces.
pub fn owns(prefix: &str, name: &str) -> bool {
    let Some(role) = name
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('-'))
    else {
        return false;
    };
    let numbered = |letter: &str| {
        role.strip_prefix(letter)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    matches!(role, "client" | "gw" | "sw" | "rt") || numbered("b") || numbered("gw")
}

/// A backend namespace and what is in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSpec {
    /// `b1`, `b2`, ...
    pub name: String,
    /// `{prefix}-b1`, ...
    pub namespace: String,
    /// Address on the backend segment.
    pub ipv4: Ipv4Addr,
    /// IPv6 address on the backend segment, if the kernel has IPv6.
    pub ipv6: Option<Ipv6Addr>,
    /// MAC of its `eth0`.
    pub mac: MacAddr,
}

/// Backend `i`'s (1-based) IPv4 address.
pub fn backend_ipv4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 51, 100, octet(10 + i))
}

/// Backend `i`'s IPv6 address: the same digits as the IPv4 one, read as hex
/// (b1 = 2001:db8:b::11).
pub fn backend_ipv6(i: usize) -> Ipv6Addr {
    let last = u16::from_str_radix(&(10 + i).to_string(), 16).unwrap_or(0);
    Ipv6Addr::new(0x2001, 0xdb8, 0xb, 0, 0, 0, 0, last)
}

/// Backend `i`'s MAC: 02:00:00:00:01:(0x10 + i).
pub fn backend_mac(i: usize) -> MacAddr {
    MacAddr([0x02, 0, 0, 0, 0x01, octet(0x10 + i)])
}

/// MAC of the bridge-side port whose peer has `peer`: the same address with 0xfe in the
/// fourth octet, unique because the peers are.
pub(super) fn port_mac(peer: MacAddr) -> MacAddr {
    let mut m = peer.0;
    m[3] = 0xfe;
    MacAddr(m)
}

/// `n` as an octet; the callers keep `i <= MAX_BACKENDS`, so it always fits.
fn octet(n: usize) -> u8 {
    u8::try_from(n).unwrap_or(u8::MAX)
}

/// One interface of an endpoint (client, gateway or backend).
struct Endpoint<'a> {
    namespace: &'a str,
    ifname: &'a str,
    addrs: Vec<String>,
}

/// The whole testbed, before it exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Namespace name prefix.
    pub prefix: String,
    /// One or two arms.
    pub topology: Topology,
    /// Number of backend namespaces.
    pub backends: usize,
    /// Whether to configure IPv6 (the kernel may have it off; the layouts with several
    /// gateways are IPv4 only).
    pub ipv6: bool,
    /// Gateway namespaces, 1 ..= [`MAX_GATEWAYS`]; 1 without `l2` is the layout above.
    pub gateways: usize,
    /// The gateways share the client segment (no router): the L2 failover layout.
    pub l2: bool,
    /// The gateway's ports are DPDK ports on this vdev (one gateway only); see the module
    /// docs.
    pub dpdk: Option<Vdev>,
    /// Queues of each of the gateway's veths (and of their peers), 1 ..= [`MAX_QUEUES`]; one
    /// gateway, AF_XDP only. The peer picks a queue per packet by the flow's hash, so the
    /// gateway's workers each get a share of the flows, as behind a NIC's RSS.
    pub queues: u16,
}

/// Most queues a gateway veth gets.
pub const MAX_QUEUES: u16 = 4;

impl Layout {
    /// How the client reaches the gateways.
    pub fn front(&self) -> Front {
        if self.l2 {
            Front::L2
        } else if self.gateways > 1 {
            Front::Router
        } else {
            Front::Direct
        }
    }

    /// `{prefix}-client`.
    pub fn client_ns(&self) -> String {
        format!("{}-client", self.prefix)
    }

    /// `{prefix}-gw`.
    pub fn gateway_ns(&self) -> String {
        format!("{}-gw", self.prefix)
    }

    /// `{prefix}-sw`, the namespace holding the bridge.
    pub fn switch_ns(&self) -> String {
        format!("{}-sw", self.prefix)
    }

    /// Backend `i`, 1-based.
    pub fn backend(&self, i: usize) -> BackendSpec {
        BackendSpec {
            name: format!("b{i}"),
            namespace: format!("{}-b{i}", self.prefix),
            ipv4: backend_ipv4(i),
            ipv6: self.ipv6.then(|| backend_ipv6(i)),
            mac: backend_mac(i),
        }
    }

    /// Every backend, in order.
    pub fn backend_specs(&self) -> Vec<BackendSpec> {
        (1..=self.backends).map(|i| self.backend(i)).collect()
    }

    /// Every namespace, in creation order.
    pub fn namespaces(&self) -> Vec<String> {
        if self.front() != Front::Direct {
            return self.fleet_namespaces();
        }
        let mut all = vec![self.switch_ns(), self.client_ns(), self.gateway_ns()];
        all.extend(self.backend_specs().into_iter().map(|b| b.namespace));
        all
    }

    /// The veth in the gateway namespace behind gateway interface `ifname`: `ifname` itself
    /// with AF_XDP; with DPDK the port's wire (`veth-gw` -> `dp-gw`), while `ifname` is the
    /// port's exception TAP.
    pub fn wire(&self, ifname: &str) -> String {
        if self.dpdk.is_some() {
            format!("dp-{}", ifname.trim_start_matches("veth-"))
        } else {
            ifname.to_owned()
        }
    }

    /// The gateway's data interfaces and the side each faces.
    pub fn gateway_interfaces(&self) -> Vec<(&'static str, strait_config::Role)> {
        use strait_config::Role;
        match self.front() {
            Front::Router => return vec![("veth-c", Role::Client), ("veth-b", Role::Backend)],
            Front::L2 => return vec![("veth-gw", Role::Both)],
            Front::Direct => {}
        }
        match self.topology {
            Topology::OneArm => vec![("veth-gw", Role::Both)],
            Topology::TwoArm => vec![("veth-c", Role::Client), ("veth-b", Role::Backend)],
        }
    }

    /// The addresses the backend server of `b` binds: TCP on the wildcard (an accepted
    /// connection answers from its own address), UDP on each address a client may send
    /// to (see `backend_server`'s module docs).
    pub fn server_addrs(&self, b: &BackendSpec) -> (Vec<SocketAddr>, Vec<SocketAddr>) {
        let any = if self.ipv6 {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        } else {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        };
        let tcp = [HTTP_PORT, NAT_PORT]
            .into_iter()
            .map(|p| SocketAddr::new(any, p))
            .collect();
        let mut udp: Vec<IpAddr> = vec![b.ipv4.into()];
        udp.extend(b.ipv6.map(IpAddr::V6));
        if self.topology == Topology::OneArm {
            udp.push(VIP4.into());
            if self.ipv6 {
                udp.push(VIP6.into());
            }
        }
        let udp = udp
            .into_iter()
            .map(|a| SocketAddr::new(a, UDP_PORT))
            .collect();
        (tcp, udp)
    }

    /// Arguments of `strait` that run `b`'s server: `testbed serve --name b1 --tcp ..`.
    pub fn server_args(&self, b: &BackendSpec) -> Vec<String> {
        let (tcp, udp) = self.server_addrs(b);
        let mut args = vec![
            "testbed".to_owned(),
            "serve".to_owned(),
            "--name".to_owned(),
            b.name.clone(),
        ];
        for a in tcp {
            args.extend(["--tcp".to_owned(), a.to_string()]);
        }
        for a in udp {
            args.extend(["--udp".to_owned(), a.to_string()]);
        }
        args
    }

    /// Every `ip` invocation that builds the testbed, in order (arguments after `ip`).
    ///
    /// Each one is `netns add NS`, `-n NS ...` or `netns exec NS sysctl|ethtool ...` with
    /// NS one of [`Layout::namespaces`]: nothing touches the namespace `strait` runs in.
    pub fn commands(&self) -> Vec<Vec<String>> {
        if self.front() != Front::Direct {
            return self.fleet_commands();
        }
        let mut c = Commands::default();
        let (client, gw, sw) = (self.client_ns(), self.gateway_ns(), self.switch_ns());
        let backends = self.backend_specs();

        for ns in self.namespaces() {
            c.add_ns(&ns);
        }
        for ns in self.namespaces() {
            c.ip(&ns, "link set lo up");
            let mut keys = Vec::new();
            if ns == sw {
                if self.ipv6 {
                    // The bridge only switches; no link-local chatter in captures.
                    keys.push("net.ipv6.conf.all.disable_ipv6=1");
                    keys.push("net.ipv6.conf.default.disable_ipv6=1");
                }
            } else if self.ipv6 {
                // Addresses are usable at once, not after a second of DAD.
                keys.push("net.ipv6.conf.all.accept_dad=0");
                keys.push("net.ipv6.conf.default.accept_dad=0");
            }
            if backends.iter().any(|b| b.namespace == ns) {
                keys.push("net.ipv4.conf.all.arp_ignore=1");
                keys.push("net.ipv4.conf.all.arp_announce=2");
            }
            if ns == gw && self.topology == Topology::TwoArm {
                keys.push("net.ipv4.ip_forward=1");
                if self.ipv6 {
                    keys.push("net.ipv6.conf.all.forwarding=1");
                }
            }
            if !keys.is_empty() {
                c.exec(&ns, &format!("sysctl -q -w {}", keys.join(" ")));
            }
        }

        c.ip(
            &sw,
            &format!(
                "link add name {BRIDGE} address {} type bridge mcast_snooping 0",
                port_mac(MacAddr([0x02, 0, 0, 0, 0, 0]))
            ),
        );
        c.ip(&sw, &format!("link set {BRIDGE} up"));

        // Links.
        match self.topology {
            Topology::OneArm => {
                c.port(&sw, "p-client", &client, "eth0", CLIENT_MAC);
            }
            Topology::TwoArm => c.ip(
                &client,
                &format!(
                    "link add name eth0 address {CLIENT_MAC}{q} type veth \
                     peer name {} address {GW_MAC}{q} netns {gw}",
                    self.wire("veth-c"),
                    q = queues(self.queues),
                ),
            ),
        }
        let gw_backend_if = match self.topology {
            Topology::OneArm => "veth-gw",
            Topology::TwoArm => "veth-b",
        };
        c.port_queues(
            &sw,
            "p-gw",
            &gw,
            &self.wire(gw_backend_if),
            GW_MAC,
            self.queues,
        );
        if self.dpdk.is_some() {
            // Each veth is the wire of a DPDK port, as a NIC bound to DPDK would be: no
            // address, no IPv6, and the kernel's stack blind to what it receives (an
            // nftables ingress drop, which runs after the packet sockets of `net_af_packet`
            // took their copy). The kernel's side of the port is the persistent TAP of the interface's
            // name that the gateway attaches to, with the addresses below.
            for (ifname, _) in self.gateway_interfaces() {
                let wire = self.wire(ifname);
                if self.ipv6 {
                    c.exec(
                        &gw,
                        &format!("sysctl -q -w net.ipv6.conf.{wire}.disable_ipv6=1"),
                    );
                }
                c.ip(&gw, &format!("link set {wire} up"));
                c.exec(&gw, "nft add table netdev strait-wire");
                c.exec(
                    &gw,
                    &format!(
                        "nft add chain netdev strait-wire {wire} {{ type filter hook ingress \
                         device {wire} priority 0 ; policy drop ; }}"
                    ),
                );
                c.ip(&gw, &format!("tuntap add dev {ifname} mode tap"));
                c.ip(&gw, &format!("link set {ifname} address {GW_MAC}"));
            }
        }
        for b in &backends {
            c.port(&sw, &format!("p-{}", b.name), &b.namespace, "eth0", b.mac);
        }

        // Endpoint addresses.
        let v6 = |a: Ipv6Addr| {
            if self.ipv6 {
                Some(format!("{a}/64"))
            } else {
                None
            }
        };
        let mut endpoints = vec![Endpoint {
            namespace: &client,
            ifname: "eth0",
            addrs: [Some(format!("{CLIENT4}/24")), v6(CLIENT6)]
                .into_iter()
                .flatten()
                .collect(),
        }];
        match self.topology {
            Topology::OneArm => endpoints.push(Endpoint {
                namespace: &gw,
                ifname: "veth-gw",
                addrs: [
                    Some(format!("{GW_CLIENT4}/24")),
                    Some(format!("{GW_BACKEND4}/24")),
                    v6(GW_CLIENT6),
                    v6(GW_BACKEND6),
                ]
                .into_iter()
                .flatten()
                .collect(),
            }),
            Topology::TwoArm => {
                endpoints.push(Endpoint {
                    namespace: &gw,
                    ifname: "veth-c",
                    addrs: [Some(format!("{GW_CLIENT4}/24")), v6(GW_CLIENT6)]
                        .into_iter()
                        .flatten()
                        .collect(),
                });
                endpoints.push(Endpoint {
                    namespace: &gw,
                    ifname: "veth-b",
                    addrs: [Some(format!("{GW_BACKEND4}/24")), v6(GW_BACKEND6)]
                        .into_iter()
                        .flatten()
                        .collect(),
                });
            }
        }
        for b in &backends {
            endpoints.push(Endpoint {
                namespace: &b.namespace,
                ifname: "eth0",
                addrs: [Some(format!("{}/24", b.ipv4)), b.ipv6.and_then(v6)]
                    .into_iter()
                    .flatten()
                    .collect(),
            });
        }
        for e in &endpoints {
            for a in &e.addrs {
                let nodad = if a.contains(':') { " nodad" } else { "" };
                c.ip(
                    e.namespace,
                    &format!("addr add {a} dev {}{nodad}", e.ifname),
                );
            }
            c.ip(e.namespace, &format!("link set {} up", e.ifname));
        }
        c.exec(&sw, "ethtool -K p-gw gro on");
        // The bridge keeps a received frame's 802.1Q tag in the skb's metadata, and a veth
        // with VLAN TX offload hands it over there: the gateway's XDP program would see the
        // frame untagged. Off, the tag is written back into the frame, as on a wire (and as
        // a NIC with `rxvlan off` shows it).
        c.exec(&sw, "ethtool -K p-gw txvlan off");
        if self.topology == Topology::TwoArm {
            c.exec(&client, "ethtool -K eth0 gro on");
        }

        // VIPs and routes.
        let mut route = |ns: &str, to: &str, via: Option<IpAddr>| match via {
            Some(via) => c.ip(ns, &format!("route add {to} via {via}")),
            None => c.ip(ns, &format!("route add {to} dev eth0")),
        };
        match self.topology {
            Topology::OneArm => {
                route(&client, VIP4_NET, Some(GW_CLIENT4.into()));
                route(&client, BACKEND4_NET, None);
                if self.ipv6 {
                    route(&client, VIP6_NET, Some(GW_CLIENT6.into()));
                    route(&client, BACKEND6_NET, None);
                }
                for b in &backends {
                    route(&b.namespace, CLIENT4_NET, None);
                    if self.ipv6 {
                        route(&b.namespace, CLIENT6_NET, None);
                    }
                }
            }
            Topology::TwoArm => {
                route(&client, VIP4_NET, Some(GW_CLIENT4.into()));
                route(&client, BACKEND4_NET, Some(GW_CLIENT4.into()));
                if self.ipv6 {
                    route(&client, VIP6_NET, Some(GW_CLIENT6.into()));
                    route(&client, BACKEND6_NET, Some(GW_CLIENT6.into()));
                }
                for b in &backends {
                    route(&b.namespace, "default", Some(GW_BACKEND4.into()));
                    if self.ipv6 {
                        route(&b.namespace, "default", Some(GW_BACKEND6.into()));
                    }
                }
            }
        }
        if self.topology == Topology::OneArm {
            for b in &backends {
                c.ip(&b.namespace, &format!("addr add {VIP4}/32 dev lo"));
                if self.ipv6 {
                    c.ip(&b.namespace, &format!("addr add {VIP6}/128 dev lo nodad"));
                }
            }
        }
        c.0
    }

    /// A short human description: what is where and how to use it.
    pub fn describe(&self) -> String {
        if self.front() != Front::Direct {
            return self.fleet_describe();
        }
        let mut s = String::new();
        let _ = writeln!(
            s,
            "  client   {}  {CLIENT4}{}",
            self.client_ns(),
            if self.ipv6 {
                format!("  {CLIENT6}")
            } else {
                String::new()
            }
        );
        let ifs: Vec<&str> = self.gateway_interfaces().iter().map(|i| i.0).collect();
        let _ = writeln!(
            s,
            "  gateway  {}  {} ({GW_MAC})",
            self.gateway_ns(),
            ifs.join(", ")
        );
        for b in self.backend_specs() {
            let _ = writeln!(
                s,
                "  backend  {}  {}{}  {}",
                b.namespace,
                b.ipv4,
                b.ipv6.map(|a| format!("  {a}")).unwrap_or_default(),
                b.mac
            );
        }
        s
    }
}

/// Accumulates `ip` argument lists.
#[derive(Default)]
pub(super) struct Commands(pub(super) Vec<Vec<String>>);

impl Commands {
    fn push(&mut self, head: &[&str], rest: &str) {
        let mut v: Vec<String> = head.iter().map(|s| (*s).to_owned()).collect();
        v.extend(rest.split_whitespace().map(str::to_owned));
        self.0.push(v);
    }

    pub(super) fn add_ns(&mut self, ns: &str) {
        self.push(&["netns", "add", ns], "");
    }

    /// `ip -n NS ARGS`.
    pub(super) fn ip(&mut self, ns: &str, args: &str) {
        self.push(&["-n", ns], args);
    }

    /// `ip netns exec NS ARGS`.
    pub(super) fn exec(&mut self, ns: &str, args: &str) {
        self.push(&["netns", "exec", ns], args);
    }

    /// A veth from the bridge in `sw` (port `port`) to `ifname` in `ns`, created in place.
    pub(super) fn port(&mut self, sw: &str, port: &str, ns: &str, ifname: &str, mac: MacAddr) {
        self.port_queues(sw, port, ns, ifname, mac, 1);
    }

    /// [`Commands::port`] with `queues` queues at both ends.
    pub(super) fn port_queues(
        &mut self,
        sw: &str,
        port: &str,
        ns: &str,
        ifname: &str,
        mac: MacAddr,
        queues_n: u16,
    ) {
        let port_mac = port_mac(mac);
        let q = queues(queues_n);
        self.ip(
            sw,
            &format!(
                "link add name {port} address {port_mac}{q} type veth \
                 peer name {ifname} address {mac}{q} netns {ns}"
            ),
        );
        self.ip(sw, &format!("link set {port} master {BRIDGE}"));
        self.ip(sw, &format!("link set {port} up"));
    }
}

/// The `ip link add` words for a veth end's queues: none for one (the kernel's default).
fn queues(n: u16) -> String {
    if n > 1 {
        format!(" numtxqueues {n} numrxqueues {n}")
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(topology: Topology, backends: usize, ipv6: bool) -> Layout {
        Layout {
            dpdk: None,
            queues: 1,
            prefix: "st9".to_owned(),
            topology,
            backends,
            ipv6,
            gateways: 1,
            l2: false,
        }
    }

    /// Every layout: one gateway in each topology, with and without IPv6; several gateways
    /// behind a router and on the client segment.
    fn every_layout() -> Vec<Layout> {
        let mut all = Vec::new();
        for topology in [Topology::OneArm, Topology::TwoArm] {
            for ipv6 in [true, false] {
                all.push(layout(topology, 3, ipv6));
            }
        }
        for (gateways, l2) in [(2, false), (MAX_GATEWAYS, false), (1, true), (3, true)] {
            all.push(Layout {
                dpdk: None,
                queues: 1,
                gateways,
                l2,
                ..layout(Topology::OneArm, 3, false)
            });
        }
        for topology in [Topology::OneArm, Topology::TwoArm] {
            all.push(Layout {
                dpdk: Some(Vdev::AfPacket),
                queues: 1,
                ..layout(topology, 2, true)
            });
            all.push(Layout {
                queues: MAX_QUEUES,
                ..layout(topology, 2, true)
            });
        }
        all
    }

    /// `--queues`: both ends of each of the gateway's veths get the queues, nothing else does.
    #[test]
    fn the_gateways_veths_get_the_queues_asked_for() {
        for topology in [Topology::OneArm, Topology::TwoArm] {
            let l = Layout {
                queues: 2,
                ..layout(topology, 2, false)
            };
            let with: Vec<String> = l
                .commands()
                .into_iter()
                .map(|c| c.join(" "))
                .filter(|c| c.contains("numtxqueues"))
                .collect();
            let gw_ifs: Vec<&str> = l.gateway_interfaces().iter().map(|(n, _)| *n).collect();
            assert_eq!(with.len(), gw_ifs.len(), "{with:?}");
            for (c, ifname) in with.iter().zip(&gw_ifs) {
                assert_eq!(c.matches("numtxqueues 2 numrxqueues 2").count(), 2, "{c}");
                assert!(c.contains(&format!("peer name {ifname} ")), "{c}");
            }
        }
    }

    #[test]
    fn every_command_stays_in_the_testbed_namespaces() {
        for l in every_layout() {
            let ours = l.namespaces();
            for cmd in l.commands() {
                let ns = match cmd.iter().map(String::as_str).collect::<Vec<_>>()[..] {
                    ["netns", "add", ns] => ns,
                    ["-n", ns, ..] => ns,
                    ["netns", "exec", ns, "sysctl" | "ethtool" | "nft", ..] => ns,
                    _ => panic!("unexpected command {cmd:?}"),
                };
                assert!(ours.iter().any(|o| o == ns), "{cmd:?} leaves the testbed");
                assert!(owns("st9", ns));
                // A veth peer is only ever created in one of ours, too.
                if let Some(p) = cmd.iter().position(|a| a == "netns").filter(|&p| p > 0) {
                    assert!(ours.contains(&cmd[p + 1]), "{cmd:?}");
                }
            }
        }
    }

    #[test]
    fn addresses_are_documentation_ranges() {
        let mut layouts = every_layout();
        layouts.push(layout(Topology::OneArm, MAX_BACKENDS, true));
        let doc4 = |a: Ipv4Addr| {
            let [a, b, c, _] = a.octets();
            matches!((a, b, c), (192, 0, 2) | (198, 51, 100) | (203, 0, 113))
        };
        let doc6 = |a: Ipv6Addr| a.segments()[..2] == [0x2001, 0xdb8];
        for cmd in layouts.iter().flat_map(Layout::commands) {
            for arg in &cmd {
                let addr = arg.split('/').next().unwrap_or_default();
                match addr.parse::<IpAddr>() {
                    Ok(IpAddr::V4(a)) => assert!(doc4(a), "{cmd:?}"),
                    Ok(IpAddr::V6(a)) => assert!(doc6(a), "{cmd:?}"),
                    Err(_) => {}
                }
            }
        }
        let last = layout(Topology::OneArm, MAX_BACKENDS, true).backend(MAX_BACKENDS);
        assert_eq!(last.ipv4, Ipv4Addr::new(198, 51, 100, 210));
        assert_eq!(last.ipv6, Some("2001:db8:b::210".parse().unwrap()));
        assert_eq!(last.mac.to_string(), "02:00:00:00:01:d8");
    }

    #[test]
    fn backend_identities_share_digits() {
        let b = layout(Topology::OneArm, 4, true).backend(3);
        assert_eq!(b.name, "b3");
        assert_eq!(b.namespace, "st9-b3");
        assert_eq!(b.ipv4.to_string(), "198.51.100.13");
        assert_eq!(b.ipv6.unwrap().to_string(), "2001:db8:b::13");
        assert_eq!(b.mac.to_string(), "02:00:00:00:01:13");
        assert_eq!(b.name, "b3");
    }

    #[test]
    fn one_arm_backends_hold_the_vip_and_two_arm_ones_do_not() {
        let has_vip = |l: &Layout| {
            l.commands()
                .iter()
                .any(|c| c.join(" ").contains("addr add 203.0.113.10/32 dev lo"))
        };
        assert!(has_vip(&layout(Topology::OneArm, 2, false)));
        assert!(!has_vip(&layout(Topology::TwoArm, 2, false)));
        let l = layout(Topology::TwoArm, 2, true);
        let all: Vec<String> = l.commands().iter().map(|c| c.join(" ")).collect();
        assert!(all.contains(&"-n st9-b2 route add default via 198.51.100.1".to_owned()));
        assert!(all
            .iter()
            .any(|c| c.starts_with("netns exec st9-gw sysctl") && c.contains("ip_forward=1")));
    }

    #[test]
    fn server_binds_udp_on_every_address_a_client_may_use() {
        let l = layout(Topology::OneArm, 1, true);
        let args = l.server_args(&l.backend(1)).join(" ");
        assert_eq!(
            args,
            "testbed serve --name b1 --tcp [::]:80 --tcp [::]:8080 \
             --udp 198.51.100.11:5353 --udp [2001:db8:b::11]:5353 \
             --udp 203.0.113.10:5353 --udp [2001:db8::10]:5353"
        );
        let l = layout(Topology::TwoArm, 1, false);
        let args = l.server_args(&l.backend(1)).join(" ");
        assert_eq!(
            args,
            "testbed serve --name b1 --tcp 0.0.0.0:80 --tcp 0.0.0.0:8080 \
             --udp 198.51.100.11:5353"
        );
    }

    #[test]
    fn prefixes_and_ownership() {
        assert!(valid_prefix("strait"));
        assert!(valid_prefix("st1234a"));
        for bad in ["", "-x", "Strait", "a/b", "a b", "a.b", &"x".repeat(33)] {
            assert!(!valid_prefix(bad), "{bad:?}");
        }
        for yes in [
            "strait-client",
            "strait-gw",
            "strait-sw",
            "strait-b1",
            "strait-b200",
            "strait-rt",
            "strait-gw1",
            "strait-gw4",
        ] {
            assert!(owns("strait", yes), "{yes}");
        }
        for no in [
            "strait",
            "strait-",
            "strait-b",
            "strait-bx",
            "strait-x-client",
            "straitx-client",
            "strait-client2",
            "strait-gwx",
            "strait-rt1",
            "other-client",
        ] {
            assert!(!owns("strait", no), "{no}");
        }
        assert!(!owns("strait", "strait-x-b1"));
        assert!(owns("strait-x", "strait-x-b1"));
    }
}
