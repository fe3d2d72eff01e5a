//! The layouts with several gateways (`testbed up --gateways N`, `--gateways N --l2`), as
//! data like `plan.rs`: names, addresses, MACs, the `ip` commands and the router's BIRD
//! configuration. Nothing here runs a command.
//!
//! ```text
//! router (--gateways N)                                 l2 (--gateways N --l2)
//!
//! client eth0 ── c0 ┐                                   client eth0 ──┐
//!                   rt g1 ── veth-c gw1 veth-b ──┐      gw1 veth-gw ──┤
//!                      gN ── veth-c gwN veth-b ──┤      gwN veth-gw ──┤ br0 in {prefix}-sw
//!                      b0 ───────────────────────┤ br0  b1 eth0 ──────┤ (client and
//! b1 eth0 ───────────────────────────────────────┤ in   bM eth0 ──────┘  backend subnets)
//! bM eth0 ───────────────────────────────────────┘ {prefix}-sw
//! ```
//!
//! | who | router layout | l2 layout | MAC |
//! |---|---|---|---|
//! | client | 192.0.2.2/28 | 192.0.2.2/24 | 02:00:00:00:00:c1 |
//! | router `c0` (client side) | 192.0.2.1/28 | | 02:00:00:00:0a:00 |
//! | router `g{i}` (link to gateway i) | 192.0.2.(16 i + 1)/28 | | 02:00:00:00:0a:0i |
//! | router `b0` (backend segment) | 198.51.100.254/24 | | 02:00:00:00:0a:ff |
//! | gateway i, client side | 192.0.2.(16 i + 2)/28 `veth-c` | 192.0.2.(10 + i)/24 `veth-gw` | 02:00:00:00:00:0i |
//! | gateway i, backend side | 198.51.100.i/24 `veth-b` | 198.51.100.i/24 `veth-gw` | 02:00:00:00:00:0i |
//! | backend j | 198.51.100.(10 + j)/24, VIP on `lo` | the same | 02:00:00:00:01:(0x10 + j) |
//!
//! With IPv6 (`testbed up --gateways N --ipv6`) every one of them has an IPv6 address too,
//! from 2001:db8::/32 and with the IPv4 address's last digits, as in `plan.rs`:
//!
//! | who | router layout | l2 layout |
//! |---|---|---|
//! | client | 2001:db8:c::2/64 | 2001:db8:c::2/64 |
//! | router `c0` | 2001:db8:c::1/64 | |
//! | router `g{i}` | 2001:db8:c:i::1/64 | |
//! | router `b0` | 2001:db8:b::254/64 | |
//! | gateway i, client side | 2001:db8:c:i::2/64 | 2001:db8:c::1i/64 |
//! | gateway i, backend side | 2001:db8:b::i/64 | 2001:db8:b::i/64 |
//! | backend j | 2001:db8:b::(10 + j)/64, VIP 2001:db8::10 on `lo` | the same |
//!
//! **Router layout.** Each gateway has a link of its own to the router, as each server of
//! a rack has its own port on the top-of-rack switch: the BGP next hops are then distinct
//! interfaces, the kernel's multipath route names each gateway by its link, and one
//! gateway's link or neighbour state never touches another's. The backends share one
//! segment with every gateway (`dsr-l2` rewrites the MAC, so each gateway must be on the
//! backends' L2 segment, as in a cluster's node network) and with the router, their default
//! gateway: a DSR reply goes backend → router → client, never through a gateway. The
//! router runs BIRD 2 (AS 64500) with one eBGP session per gateway (every gateway is AS
//! 64512, so the paths are equal) and `merge paths on` in its kernel protocol: the VIP's
//! /32 becomes one kernel route with a next hop per announcing gateway, hashed on L4
//! headers (`fib_multipath_hash_policy=1`). The router forwards the client's packets
//! after a tc program (`bpf/rehash.bpf.c`) forgot the socket's hash, so it hashes headers
//! as a real router does. With IPv6 each gateway has a second session, over IPv6 on the
//! same link, which carries the IPv6 VIP's /128 (a session per family, as most ToRs are
//! configured, rather than IPv6 routes over the IPv4 session with an IPv4-mapped next hop);
//! the IPv6 route is merged and hashed the same way (`net.ipv6.fib_multipath_hash_policy=1`,
//! the same hash reset: it forgets the hash of either family).
//!
//! **L2 layout.** Client, gateways and backends on one bridge, no router: the client
//! reaches the VIP on-link, and whichever gateway answers ARP for it gets the traffic.
//! Electing that gateway (VRRP) is the gateway's job, not the testbed's: the testbed puts
//! no VIP anywhere but on the backends' `lo`. With IPv6 the client reaches the IPv6 VIP
//! on-link too, and whichever gateway answers neighbour solicitations for it gets the
//! traffic (VRRPv3 elects it separately from the IPv4 VIP's owner).
//!
//! Every namespace but the switch's accepts its IPv6 addresses without duplicate address
//! detection, so they are usable at once (a tentative address cannot be bound, and a BGP
//! session or the flow sync socket would wait a second for it).

use std::fmt::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr};

use strait_config::MacAddr;

use super::plan::{
    port_mac, Commands, Front, Layout, BACKEND4_NET, BACKEND6_NET, BRIDGE, CLIENT4, CLIENT4_NET,
    CLIENT6, CLIENT6_NET, CLIENT_MAC, GW_BACKEND4, GW_BACKEND6, GW_CLIENT4, GW_CLIENT6, GW_MAC,
    VIP4, VIP4_NET, VIP6, VIP6_NET,
};

/// The router's AS number.
pub const ROUTER_ASN: u32 = 64500;
/// Every gateway's AS number: one AS for the balancers, so the router sees equal paths.
pub const GATEWAY_ASN: u32 = 64512;
/// The router's address on the client link, the client's next hop to the VIPs.
pub const ROUTER_CLIENT4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// The router's address on the backend segment, the backends' default gateway.
pub const ROUTER_BACKEND4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 254);
/// The router's IPv6 address on the client link.
pub const ROUTER_CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xc, 0, 0, 0, 0, 1);
/// The router's IPv6 address on the backend segment, the backends' IPv6 default gateway.
pub const ROUTER_BACKEND6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xb, 0, 0, 0, 0, 0x254);
/// The router's client-facing interface, where the hash reset runs.
pub const ROUTER_CLIENT_IF: &str = "c0";

/// A gateway namespace and its addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewaySpec {
    /// `gw` (the single gateway) or `gw1` ..= `gw4`.
    pub name: String,
    /// `{prefix}-{name}`.
    pub namespace: String,
    /// The MAC of each of its interfaces.
    pub mac: MacAddr,
    /// Its address on the client side.
    pub client: Ipv4Addr,
    /// Its address on the backend segment.
    pub backend: Ipv4Addr,
    /// The router's address on its link: its BGP peer (router layout only).
    pub peer: Option<Ipv4Addr>,
    /// Its IPv6 address on the client side (IPv6 layouts).
    pub client6: Option<Ipv6Addr>,
    /// Its IPv6 address on the backend segment (IPv6 layouts).
    pub backend6: Option<Ipv6Addr>,
    /// The router's IPv6 address on its link: its IPv6 BGP peer (router layout with IPv6).
    pub peer6: Option<Ipv6Addr>,
}

fn octet(n: usize) -> u8 {
    u8::try_from(n).unwrap_or(u8::MAX)
}

/// `n` (at most [`super::plan::MAX_GATEWAYS`] or a little more) as a 16-bit group.
fn group(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

/// `n`'s decimal digits read as hex, so an IPv6 address ends in the digits of the IPv4
/// one (10 + 1 = 11 -> `::11`).
fn digits(n: usize) -> u16 {
    u16::from_str_radix(&n.to_string(), 16).unwrap_or(0)
}

impl Layout {
    /// `{prefix}-rt`, the router of the router layout.
    pub fn router_ns(&self) -> String {
        format!("{}-rt", self.prefix)
    }

    /// Gateway `i` (1-based; the single gateway of the direct layout is `1`).
    pub fn gateway(&self, i: usize) -> GatewaySpec {
        match self.front() {
            Front::Direct => GatewaySpec {
                name: "gw".to_owned(),
                namespace: self.gateway_ns(),
                mac: GW_MAC,
                client: GW_CLIENT4,
                backend: GW_BACKEND4,
                peer: None,
                client6: self.ipv6.then_some(GW_CLIENT6),
                backend6: self.ipv6.then_some(GW_BACKEND6),
                peer6: None,
            },
            front => {
                let mac = MacAddr([0x02, 0, 0, 0, 0, octet(i)]);
                let v6 = |a: Ipv6Addr| self.ipv6.then_some(a);
                let (client, peer, client6, peer6) = if front == Front::Router {
                    let link = |last| Ipv6Addr::new(0x2001, 0xdb8, 0xc, group(i), 0, 0, 0, last);
                    (
                        Ipv4Addr::new(192, 0, 2, octet(16 * i + 2)),
                        Some(Ipv4Addr::new(192, 0, 2, octet(16 * i + 1))),
                        v6(link(2)),
                        v6(link(1)),
                    )
                } else {
                    (
                        Ipv4Addr::new(192, 0, 2, octet(10 + i)),
                        None,
                        v6(Ipv6Addr::new(
                            0x2001,
                            0xdb8,
                            0xc,
                            0,
                            0,
                            0,
                            0,
                            digits(10 + i),
                        )),
                        None,
                    )
                };
                GatewaySpec {
                    name: format!("gw{i}"),
                    namespace: format!("{}-gw{i}", self.prefix),
                    mac,
                    client,
                    backend: Ipv4Addr::new(198, 51, 100, octet(i)),
                    peer,
                    client6,
                    backend6: v6(Ipv6Addr::new(0x2001, 0xdb8, 0xb, 0, 0, 0, 0, digits(i))),
                    peer6,
                }
            }
        }
    }

    /// Every gateway, in order.
    pub fn gateway_specs(&self) -> Vec<GatewaySpec> {
        (1..=self.gateways.max(1))
            .map(|i| self.gateway(i))
            .collect()
    }

    pub(super) fn fleet_namespaces(&self) -> Vec<String> {
        let mut all = vec![self.switch_ns(), self.client_ns()];
        if self.front() == Front::Router {
            all.push(self.router_ns());
        }
        all.extend(self.gateway_specs().into_iter().map(|g| g.namespace));
        all.extend(self.backend_specs().into_iter().map(|b| b.namespace));
        all
    }

    pub(super) fn fleet_commands(&self) -> Vec<Vec<String>> {
        let mut c = Commands::default();
        let router = self.front() == Front::Router;
        let (client, sw, rt) = (self.client_ns(), self.switch_ns(), self.router_ns());
        let gateways = self.gateway_specs();
        let backends = self.backend_specs();
        // An IPv6 address of the layout, when it has IPv6.
        let v6 = |a: Option<Ipv6Addr>| a.filter(|_| self.ipv6).map(|a| format!("{a}/64"));

        for ns in self.namespaces() {
            c.add_ns(&ns);
        }
        for ns in self.namespaces() {
            c.ip(&ns, "link set lo up");
        }
        if self.ipv6 {
            for ns in self.namespaces() {
                if ns == sw {
                    // The bridge only switches; no link-local chatter in captures.
                    c.exec(
                        &ns,
                        "sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 \
                         net.ipv6.conf.default.disable_ipv6=1",
                    );
                } else {
                    c.exec(
                        &ns,
                        "sysctl -q -w net.ipv6.conf.all.accept_dad=0 \
                         net.ipv6.conf.default.accept_dad=0",
                    );
                }
            }
        }
        if router {
            c.exec(
                &rt,
                "sysctl -q -w net.ipv4.ip_forward=1 net.ipv4.fib_multipath_hash_policy=1 \
                 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0",
            );
            if self.ipv6 {
                c.exec(
                    &rt,
                    "sysctl -q -w net.ipv6.conf.all.forwarding=1 \
                     net.ipv6.fib_multipath_hash_policy=1",
                );
            }
        }
        for b in &backends {
            c.exec(
                &b.namespace,
                "sysctl -q -w net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2",
            );
        }
        c.ip(
            &sw,
            &format!(
                "link add name {BRIDGE} address {} type bridge mcast_snooping 0",
                port_mac(MacAddr([0x02, 0, 0, 0, 0, 0]))
            ),
        );
        c.ip(&sw, &format!("link set {BRIDGE} up"));

        // Links and addresses.
        let addr = |c: &mut Commands, ns: &str, ifname: &str, addrs: &[Option<String>]| {
            for a in addrs.iter().flatten() {
                let nodad = if a.contains(':') { " nodad" } else { "" };
                c.ip(ns, &format!("addr add {a} dev {ifname}{nodad}"));
            }
            c.ip(ns, &format!("link set {ifname} up"));
        };
        if router {
            let rmac = |last: u8| MacAddr([0x02, 0, 0, 0, 0x0a, last]);
            c.ip(
                &client,
                &format!(
                    "link add name eth0 address {CLIENT_MAC} type veth \
                     peer name {ROUTER_CLIENT_IF} address {} netns {rt}",
                    rmac(0)
                ),
            );
            addr(
                &mut c,
                &client,
                "eth0",
                &[Some(format!("{CLIENT4}/28")), v6(Some(CLIENT6))],
            );
            addr(
                &mut c,
                &rt,
                ROUTER_CLIENT_IF,
                &[
                    Some(format!("{ROUTER_CLIENT4}/28")),
                    v6(Some(ROUTER_CLIENT6)),
                ],
            );
            c.port(&sw, "p-rt", &rt, "b0", rmac(0xff));
            addr(
                &mut c,
                &rt,
                "b0",
                &[
                    Some(format!("{ROUTER_BACKEND4}/24")),
                    v6(Some(ROUTER_BACKEND6)),
                ],
            );
            for (i, g) in gateways.iter().enumerate() {
                let link = format!("g{}", i + 1);
                c.ip(
                    &rt,
                    &format!(
                        "link add name {link} address {} type veth \
                         peer name veth-c address {} netns {}",
                        rmac(octet(i + 1)),
                        g.mac,
                        g.namespace
                    ),
                );
                let peer = g.peer.unwrap_or(ROUTER_CLIENT4);
                addr(
                    &mut c,
                    &rt,
                    &link,
                    &[Some(format!("{peer}/28")), v6(g.peer6)],
                );
                addr(
                    &mut c,
                    &g.namespace,
                    "veth-c",
                    &[Some(format!("{}/28", g.client)), v6(g.client6)],
                );
                c.port(&sw, &format!("p-{}", g.name), &g.namespace, "veth-b", g.mac);
                addr(
                    &mut c,
                    &g.namespace,
                    "veth-b",
                    &[Some(format!("{}/24", g.backend)), v6(g.backend6)],
                );
                // NAPI on the peers of the gateway's interfaces (see plan.rs).
                c.exec(&rt, &format!("ethtool -K {link} gro on"));
            }
        } else {
            c.port(&sw, "p-client", &client, "eth0", CLIENT_MAC);
            addr(
                &mut c,
                &client,
                "eth0",
                &[Some(format!("{CLIENT4}/24")), v6(Some(CLIENT6))],
            );
            for g in &gateways {
                c.port(
                    &sw,
                    &format!("p-{}", g.name),
                    &g.namespace,
                    "veth-gw",
                    g.mac,
                );
                addr(
                    &mut c,
                    &g.namespace,
                    "veth-gw",
                    &[
                        Some(format!("{}/24", g.client)),
                        Some(format!("{}/24", g.backend)),
                        v6(g.client6),
                        v6(g.backend6),
                    ],
                );
            }
        }
        for g in &gateways {
            let port = format!("p-{}", g.name);
            c.exec(&sw, &format!("ethtool -K {port} gro on"));
            c.exec(&sw, &format!("ethtool -K {port} txvlan off"));
        }
        for b in &backends {
            c.port(&sw, &format!("p-{}", b.name), &b.namespace, "eth0", b.mac);
            addr(
                &mut c,
                &b.namespace,
                "eth0",
                &[Some(format!("{}/24", b.ipv4)), v6(b.ipv6)],
            );
        }

        // Routes and VIPs.
        if router {
            c.ip(
                &client,
                &format!("route add {VIP4_NET} via {ROUTER_CLIENT4}"),
            );
            c.ip(
                &client,
                &format!("route add {BACKEND4_NET} via {ROUTER_CLIENT4}"),
            );
            if self.ipv6 {
                c.ip(
                    &client,
                    &format!("route add {VIP6_NET} via {ROUTER_CLIENT6}"),
                );
                c.ip(
                    &client,
                    &format!("route add {BACKEND6_NET} via {ROUTER_CLIENT6}"),
                );
            }
            for g in &gateways {
                let peer = g.peer.unwrap_or(ROUTER_CLIENT4);
                c.ip(&g.namespace, &format!("route add default via {peer}"));
                if let Some(peer6) = g.peer6.filter(|_| self.ipv6) {
                    c.ip(&g.namespace, &format!("-6 route add default via {peer6}"));
                }
            }
            for b in &backends {
                c.ip(
                    &b.namespace,
                    &format!("route add default via {ROUTER_BACKEND4}"),
                );
                if self.ipv6 {
                    c.ip(
                        &b.namespace,
                        &format!("-6 route add default via {ROUTER_BACKEND6}"),
                    );
                }
            }
        } else {
            c.ip(&client, &format!("route add {VIP4_NET} dev eth0"));
            c.ip(&client, &format!("route add {BACKEND4_NET} dev eth0"));
            if self.ipv6 {
                c.ip(&client, &format!("route add {VIP6_NET} dev eth0"));
                c.ip(&client, &format!("route add {BACKEND6_NET} dev eth0"));
            }
            for b in &backends {
                c.ip(&b.namespace, &format!("route add {CLIENT4_NET} dev eth0"));
                if self.ipv6 {
                    c.ip(&b.namespace, &format!("route add {CLIENT6_NET} dev eth0"));
                }
            }
        }
        for b in &backends {
            c.ip(&b.namespace, &format!("addr add {VIP4}/32 dev lo"));
            if self.ipv6 {
                c.ip(&b.namespace, &format!("addr add {VIP6}/128 dev lo nodad"));
            }
        }
        c.0
    }

    /// The router's BIRD configuration: one eBGP session per gateway and family, what they
    /// announce merged into one multipath kernel route per VIP.
    pub fn router_config(&self) -> String {
        let mut s = format!(
            "# The router of testbed \"{prefix}\", written by `strait-lab testbed up`.\n\
             router id {ROUTER_CLIENT4};\n\
             log stderr {{ info, remote, warning, error, auth, fatal, bug }};\n\
             protocol device {{ scan time 10; }}\n\
             # Equal BGP paths become one kernel route with a next hop per gateway.\n\
             protocol kernel kernel4 {{\n  ipv4 {{ import none; export all; }};\n  merge paths on;\n}}\n",
            prefix = self.prefix
        );
        if self.ipv6 {
            s.push_str(
                "protocol kernel kernel6 {\n  ipv6 { import none; export all; };\n  merge paths on;\n}\n",
            );
        }
        for (i, g) in self.gateway_specs().iter().enumerate() {
            let local = g.peer.unwrap_or(ROUTER_CLIENT4);
            let mut sessions = vec![("", local.to_string(), g.client.to_string(), "ipv4")];
            if let (Some(local), Some(gw), true) = (g.peer6, g.client6, self.ipv6) {
                sessions.push(("v6", local.to_string(), gw.to_string(), "ipv6"));
            }
            for (suffix, local, gw, channel) in sessions {
                // Not `gw1`: `gw` is a BIRD keyword.
                let _ = write!(
                    s,
                    "protocol bgp strait{n}{suffix} {{\n  local {local} as {ROUTER_ASN};\n  \
                     neighbor {gw} as {GATEWAY_ASN};\n  hold time 3;\n  keepalive time 1;\n  \
                     connect retry time 1;\n  error wait time 1, 5;\n  \
                     {channel} {{ import all; export none; }};\n}}\n",
                    n = i + 1,
                );
            }
        }
        s
    }

    pub(super) fn fleet_describe(&self) -> String {
        let six = |a: Option<Ipv6Addr>| {
            a.filter(|_| self.ipv6)
                .map(|a| format!(", {a}"))
                .unwrap_or_default()
        };
        let mut s = String::new();
        let _ = writeln!(
            s,
            "  client   {}  {CLIENT4}{}",
            self.client_ns(),
            six(Some(CLIENT6))
        );
        if self.front() == Front::Router {
            let _ = writeln!(
                s,
                "  router   {}  {ROUTER_CLIENT4}{} (client), {ROUTER_BACKEND4}{} (backends), BIRD AS {ROUTER_ASN}",
                self.router_ns(),
                six(Some(ROUTER_CLIENT6)),
                six(Some(ROUTER_BACKEND6)),
            );
        }
        for g in self.gateway_specs() {
            let _ = writeln!(
                s,
                "  gateway  {}  {}{} / {}{} ({})",
                g.namespace,
                g.client,
                six(g.client6),
                g.backend,
                six(g.backend6),
                g.mac
            );
        }
        for b in self.backend_specs() {
            let _ = writeln!(
                s,
                "  backend  {}  {}{}  {}",
                b.namespace,
                b.ipv4,
                six(b.ipv6),
                b.mac
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testbed::Topology;

    fn layout(gateways: usize, l2: bool) -> Layout {
        Layout {
            dpdk: None,
            queues: 1,
            prefix: "st9".to_owned(),
            topology: Topology::OneArm,
            backends: 3,
            ipv6: false,
            gateways,
            l2,
        }
    }

    /// The layout's commands, each as one line.
    fn command_lines(l: &Layout) -> Vec<String> {
        l.commands().iter().map(|c| c.join(" ")).collect()
    }

    fn layout6(gateways: usize, l2: bool) -> Layout {
        Layout {
            ipv6: true,
            ..layout(gateways, l2)
        }
    }

    /// With IPv6 every gateway has a second session to the router, over IPv6 on its own link,
    /// and the router merges the IPv6 VIP's paths and hashes them on L4 ports too.
    #[test]
    fn an_ipv6_router_layout_has_a_session_per_gateway_and_family() {
        let l = layout6(3, false);
        let all = command_lines(&l);
        for want in [
            "-n st9-gw2 addr add 2001:db8:c:2::2/64 dev veth-c nodad",
            "-n st9-rt addr add 2001:db8:c:2::1/64 dev g2 nodad",
            "-n st9-gw3 addr add 2001:db8:b::3/64 dev veth-b nodad",
            "-n st9-rt addr add 2001:db8:b::254/64 dev b0 nodad",
            "-n st9-client addr add 2001:db8:c::2/64 dev eth0 nodad",
            "-n st9-client route add 2001:db8::/64 via 2001:db8:c::1",
            "-n st9-b1 -6 route add default via 2001:db8:b::254",
            "-n st9-b2 addr add 2001:db8::10/128 dev lo nodad",
        ] {
            assert!(all.iter().any(|c| c == want), "{want} missing: {all:#?}");
        }
        assert!(all.iter().any(|c| c.starts_with("netns exec st9-rt sysctl")
            && c.contains("net.ipv6.fib_multipath_hash_policy=1")
            && c.contains("net.ipv6.conf.all.forwarding=1")));
        let bird = l.router_config();
        assert_eq!(bird.matches("protocol bgp strait").count(), 6, "{bird}");
        assert!(
            bird.contains("local 2001:db8:c:3::1 as 64500;\n  neighbor 2001:db8:c:3::2 as 64512;"),
            "{bird}"
        );
        assert!(
            bird.contains("ipv6 { import none; export all; };"),
            "{bird}"
        );
        assert_eq!(bird.matches("merge paths on;").count(), 2, "{bird}");
        let g = l.gateway(2);
        assert_eq!(g.peer6, Some("2001:db8:c:2::1".parse().unwrap()));
        assert_eq!(g.backend6, Some("2001:db8:b::2".parse().unwrap()));
        // Without IPv6 nothing of it.
        let l = layout(3, false);
        assert!(!l.router_config().contains("ipv6"));
        assert!(!l.commands().iter().flatten().any(|a| a.contains("2001:")));
    }

    #[test]
    fn an_ipv6_l2_layout_reaches_the_vip_on_link() {
        let l = layout6(2, true);
        let all = command_lines(&l);
        for want in [
            "-n st9-gw2 addr add 2001:db8:c::12/64 dev veth-gw nodad",
            "-n st9-gw2 addr add 2001:db8:b::2/64 dev veth-gw nodad",
            "-n st9-client route add 2001:db8::/64 dev eth0",
            "-n st9-b2 route add 2001:db8:c::/64 dev eth0",
        ] {
            assert!(all.iter().any(|c| c == want), "{want} missing: {all:#?}");
        }
        assert!(all
            .iter()
            .any(|c| c.starts_with("netns exec st9-sw sysctl") && c.contains("disable_ipv6=1")));
        assert!(all
            .iter()
            .any(|c| c.starts_with("netns exec st9-gw1 sysctl") && c.contains("accept_dad=0")));
        assert!(!all
            .iter()
            .any(|c| c.contains("st9-gw") && c.contains("dev lo")));
    }

    /// BIRD itself parses the router's configuration (`bird -p`), when it is installed.
    #[test]
    fn bird_accepts_the_routers_configuration() {
        let bird = std::path::Path::new(strait_config::model::Bgp::DEFAULT_DAEMON);
        for l in [layout(2, false), layout6(4, false)] {
            let text = l.router_config();
            if let Some(Err(e)) = strait_testkit::bird::parses(bird, &text) {
                panic!("bird -p refused:\n{e}\n{text}");
            }
        }
    }

    #[test]
    fn router_layout_has_a_link_per_gateway_and_a_session_each() {
        let l = layout(3, false);
        assert_eq!(
            l.namespaces(),
            [
                "st9-sw",
                "st9-client",
                "st9-rt",
                "st9-gw1",
                "st9-gw2",
                "st9-gw3",
                "st9-b1",
                "st9-b2",
                "st9-b3"
            ]
        );
        let all: Vec<String> = l.commands().iter().map(|c| c.join(" ")).collect();
        assert!(all.contains(&"-n st9-gw2 addr add 192.0.2.34/28 dev veth-c".to_owned()));
        assert!(all.contains(&"-n st9-rt addr add 192.0.2.33/28 dev g2".to_owned()));
        assert!(all.contains(&"-n st9-gw3 addr add 198.51.100.3/24 dev veth-b".to_owned()));
        assert!(all.contains(&"-n st9-b1 route add default via 198.51.100.254".to_owned()));
        assert!(all.iter().any(|c| c.starts_with("netns exec st9-rt sysctl")
            && c.contains("fib_multipath_hash_policy=1")));
        assert!(!all
            .iter()
            .any(|c| c.contains("st9-gw") && c.contains("dev lo")));
        let bird = l.router_config();
        assert_eq!(bird.matches("protocol bgp strait").count(), 3);
        assert!(bird.contains("neighbor 192.0.2.50 as 64512;"), "{bird}");
        assert!(bird.contains("merge paths on;"));
    }

    #[test]
    fn l2_layout_puts_every_gateway_on_the_client_segment() {
        let l = layout(2, true);
        assert!(!l.namespaces().contains(&"st9-rt".to_owned()));
        let all: Vec<String> = l.commands().iter().map(|c| c.join(" ")).collect();
        assert!(all.contains(&"-n st9-gw2 addr add 192.0.2.12/24 dev veth-gw".to_owned()));
        assert!(all.contains(&"-n st9-client route add 203.0.113.0/24 dev eth0".to_owned()));
        assert!(!all
            .iter()
            .any(|c| c.contains("st9-gw") && c.contains("dev lo")));
    }

    #[test]
    fn direct_layout_has_one_gateway_as_before() {
        let l = layout(1, false);
        let g = l.gateway_specs();
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].namespace, "st9-gw");
        assert_eq!(g[0].client, GW_CLIENT4);
    }
}
