//! The gateway configuration matching a testbed [`Layout`]: written as annotated TOML text
//! (a file people read while debugging), then checked with `strait_config::parse` by the
//! caller, so a mismatch with the schema is caught when the testbed comes up.
//!
//! One-arm: `web` (TCP 80) and `echo` (UDP 5353) in `dsr-l2`, plus `web6` with IPv6.
//! Two-arm: `web` (TCP 80 -> 8080) and `echo` (UDP 53 -> 5353) in `nat`, plus `web6`.
//! Health checks are HTTP `GET /healthz`, faster than the defaults (500 ms interval, down
//! after two misses) so failover tests finish in about a second.

use std::fmt::Write as _;
use std::path::Path;

use super::fleet::{GatewaySpec, GATEWAY_ASN, ROUTER_ASN};
use super::plan::{BackendSpec, Layout, HTTP_PORT, NAT_PORT, NAT_UDP_PORT, UDP_PORT, VIP4, VIP6};
use super::Topology;
use strait_config::BackendState;

/// EAL memory of a DPDK testbed gateway, in MiB: the mempools of a worker (a few thousand
/// mbufs, about 20 MiB) and EAL's own, with room to spare, and no more, since without
/// hugepages it is ordinary memory of the test machine.
const DPDK_MEMORY_MB: u32 = 512;

/// Renders the configuration; `path` is where it will be written (quoted in the header).
pub fn render(layout: &Layout, path: &Path) -> String {
    let mut s = String::new();
    let (arms, mode) = match layout.topology {
        Topology::OneArm => ("one-arm", "dsr-l2"),
        Topology::TwoArm => ("two-arm", "nat"),
    };
    let _ = write!(
        s,
        "\
# Strait gateway configuration of the testbed \"{prefix}\" ({arms}, {n} backends), written by
# `strait-lab testbed up`; `strait-lab testbed down --prefix {prefix}` removes it with the testbed.
#
# Start the gateway in its namespace:
#   ip netns exec {gw} strait run --config {path}
# and try it from the client:
#   ip netns exec {client} curl -s http://{VIP4}/

[gateway]
admin_listen = \"127.0.0.1:9900\"
",
        prefix = layout.prefix,
        n = layout.backends,
        gw = layout.gateway_ns(),
        client = layout.client_ns(),
        path = path.display(),
    );
    if layout.dpdk.is_some() {
        let _ = write!(
            s,
            "
# DPDK's EAL without hugepages: the ports are vdevs on the testbed's veths.
[gateway.dpdk]
no_huge = true
memory_mb = {DPDK_MEMORY_MB}
"
        );
    }
    for (i, (name, role)) in layout.gateway_interfaces().into_iter().enumerate() {
        let _ = write!(
            s,
            "
[[gateway.interfaces]]
name = \"{name}\"
queues = [{queues}]
role = \"{role}\"
",
            queues = (0..layout.queues.max(1))
                .map(|q| q.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        );
        if let Some(vdev) = layout.dpdk {
            let _ = writeln!(
                s,
                "driver = \"dpdk\"\ndevice = \"{}\"",
                vdev.device(i, &layout.wire(name))
            );
        }
    }

    let (web_port, backend_port, echo_port) = match layout.topology {
        Topology::OneArm => (HTTP_PORT, HTTP_PORT, UDP_PORT),
        Topology::TwoArm => (HTTP_PORT, NAT_PORT, NAT_UDP_PORT),
    };
    let why = match layout.topology {
        Topology::OneArm => "the backends hold the VIP on lo and answer the client directly",
        Topology::TwoArm => "replies come back through the gateway to be translated",
    };
    let backends = layout.backend_specs();
    service(
        &mut s,
        &format!("HTTP in {mode}: {why}."),
        ("web", &VIP4.to_string(), web_port, "tcp", mode),
        None,
        backends.iter().map(|b| {
            (
                b.ipv4.to_string(),
                backend_port,
                b.mac,
                BackendState::Active,
            )
        }),
    );
    service(
        &mut s,
        &format!("UDP echo in {mode}, health-checked over HTTP."),
        ("echo", &VIP4.to_string(), echo_port, "udp", mode),
        Some(backend_port),
        backends
            .iter()
            .map(|b| (b.ipv4.to_string(), UDP_PORT, b.mac, BackendState::Active)),
    );
    if layout.ipv6 {
        service(
            &mut s,
            &format!("HTTP over IPv6 in {mode}."),
            ("web6", &VIP6.to_string(), web_port, "tcp", mode),
            None,
            backends.iter().filter_map(|b| {
                Some((
                    b.ipv6?.to_string(),
                    backend_port,
                    b.mac,
                    BackendState::Active,
                ))
            }),
        );
    }
    s
}

/// The UDP port of the gateways' flow sync on the testbed.
pub const SYNC_PORT: u16 = 7946;

/// The configuration of gateway `gw` of a layout with several gateways (`fleet`): `web`
/// (TCP 80, its backends also serve the failover bench's `GET /echo` streams) and `echo`
/// (UDP 5353) in `dsr-l2` to `backends` (normally every backend; the failover bench marks
/// one `draining` to change the backend set), and in the router layout `[gateway.bgp]` with
/// the router as the peer, in the L2 layout `[gateway.l2]`; and, if `sync`, `[gateway.sync]`
/// with the other gateways.
pub fn render_gateway(
    layout: &Layout,
    gw: &GatewaySpec,
    backends: &[(BackendSpec, BackendState)],
    sync: bool,
    path: &Path,
) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "\
# Strait configuration of gateway {name} of the testbed \"{prefix}\" ({n} gateways, {m} backends),
# written by `strait-lab testbed up`; `strait-lab testbed down --prefix {prefix}` removes it.
#
# Start the gateway in its namespace:
#   ip netns exec {ns} strait run --config {path}
# and try it from the client:
#   ip netns exec {client} curl -s http://{VIP4}/

[gateway]
admin_listen = \"127.0.0.1:9900\"
# Withdraw, then forward this long: the testbed's router moves traffic in milliseconds.
drain_grace = \"2s\"
",
        name = gw.name,
        prefix = layout.prefix,
        n = layout.gateways,
        m = backends.len(),
        ns = gw.namespace,
        client = layout.client_ns(),
        path = path.display(),
    );
    if layout.dpdk.is_some() {
        let _ = write!(
            s,
            "
# DPDK's EAL without hugepages: the ports are vdevs on the testbed's veths.
[gateway.dpdk]
no_huge = true
memory_mb = {DPDK_MEMORY_MB}
"
        );
    }
    for (i, (name, role)) in layout.gateway_interfaces().into_iter().enumerate() {
        let _ = write!(
            s,
            "
[[gateway.interfaces]]
name = \"{name}\"
queues = [0]
role = \"{role}\"
"
        );
        if let Some(vdev) = layout.dpdk {
            let _ = writeln!(
                s,
                "driver = \"dpdk\"\ndevice = \"{}\"",
                vdev.device(i, &layout.wire(name))
            );
        }
    }
    if let Some(peer) = gw.peer {
        let _ = write!(
            s,
            "
# One eBGP session to the testbed's router, which merges the gateways' equal paths into a
# multipath route. hold_time at its floor: a gateway lost without a Cease is gone in 3 s.
[gateway.bgp]
asn = {GATEWAY_ASN}
router_id = \"{id}\"

[[gateway.bgp.peers]]
address = \"{peer}\"
asn = {ROUTER_ASN}
hold_time = \"3s\"
",
            id = gw.client,
        );
    } else if layout.l2 {
        let members: Vec<String> = (1..=layout.gateways)
            .map(|i| format!("\"gw{i}\""))
            .collect();
        let _ = write!(
            s,
            "
# The gateways on the client segment elect one owner per VIP with VRRP (keepalived).
[gateway.l2]
name = \"{name}\"
members = [{members}]
",
            name = gw.name,
            members = members.join(", "),
        );
    }
    if sync && (layout.gateways > 1 || layout.l2) {
        let peers: Vec<String> = layout
            .gateway_specs()
            .into_iter()
            .filter(|g| g.name != gw.name)
            .map(|g| format!("\"{}:{SYNC_PORT}\"", g.backend))
            .collect();
        let _ = write!(
            s,
            "
# Flow sync with the other gateways, over the backend segment: a flow keeps its backend when
# the router moves it to another gateway or this one restarts, even after a backend change.
[gateway.sync]
listen = \"{me}:{SYNC_PORT}\"
peers = [{peers}]
",
            me = gw.backend,
            peers = peers.join(", "),
        );
    }
    service(
        &mut s,
        "HTTP in dsr-l2: the backends hold the VIP on lo and answer the client directly.",
        ("web", &VIP4.to_string(), HTTP_PORT, "tcp", "dsr-l2"),
        None,
        backends
            .iter()
            .map(|(b, state)| (b.ipv4.to_string(), HTTP_PORT, b.mac, *state)),
    );
    service(
        &mut s,
        "UDP echo in dsr-l2, health-checked over HTTP.",
        ("echo", &VIP4.to_string(), UDP_PORT, "udp", "dsr-l2"),
        Some(HTTP_PORT),
        backends
            .iter()
            .map(|(b, state)| (b.ipv4.to_string(), UDP_PORT, b.mac, *state)),
    );
    s
}

/// One `[[services]]` table with its health check and backends.
fn service(
    s: &mut String,
    comment: &str,
    (name, vip, port, protocol, mode): (&str, &str, u16, &str, &str),
    check_port: Option<u16>,
    backends: impl Iterator<Item = (String, u16, strait_config::MacAddr, BackendState)>,
) {
    let _ = write!(
        s,
        "
# {comment}
[[services]]
name = \"{name}\"
vip = \"{vip}\"
port = {port}
protocol = \"{protocol}\"
mode = \"{mode}\"

[services.health_check]
kind = \"http\"
path = \"/healthz\"
"
    );
    if let Some(p) = check_port {
        let _ = writeln!(s, "port = {p}");
    }
    s.push_str("interval = \"500ms\"\ntimeout = \"250ms\"\nrise = 2\nfall = 2\n");
    for (address, port, mac, state) in backends {
        let _ = write!(
            s,
            "
[[services.backends]]
address = \"{address}\"
port = {port}
mac = \"{mac}\"
"
        );
        if state != BackendState::Active {
            let _ = writeln!(s, "state = \"{}\"", state.as_str());
        }
    }
}

#[cfg(test)]
mod tests {
    /// `--queues`: the gateway gets a worker per queue on every interface.
    #[test]
    fn a_worker_per_queue() {
        for topology in [Topology::OneArm, Topology::TwoArm] {
            let layout = Layout {
                prefix: "st9".to_owned(),
                topology,
                backends: 2,
                ipv6: false,
                gateways: 1,
                l2: false,
                dpdk: None,
                queues: 2,
            };
            let c = strait_config::parse(&render(&layout, Path::new("/x.toml")))
                .expect("the configuration parses");
            assert!(!c.gateway.interfaces.is_empty());
            for i in &c.gateway.interfaces {
                assert_eq!(i.queues, [0, 1], "{}", i.name);
            }
        }
    }

    use super::*;
    use strait_config::{HealthKind, Mode, Protocol, Role};

    fn render_parse(topology: Topology, ipv6: bool) -> strait_config::Config {
        let layout = Layout {
            dpdk: None,
            queues: 1,
            prefix: "st9".to_owned(),
            topology,
            backends: 3,
            ipv6,
            gateways: 1,
            l2: false,
        };
        let text = render(&layout, Path::new("/run/strait/st9/strait.toml"));
        strait_config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    #[test]
    fn one_arm_is_dsr_l2_with_backend_macs() {
        let c = render_parse(Topology::OneArm, true);
        assert_eq!(c.gateway.interfaces.len(), 1);
        assert_eq!(c.gateway.interfaces[0].name, "veth-gw");
        assert_eq!(c.gateway.interfaces[0].role, Role::Both);
        let names: Vec<&str> = c.services.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["web", "echo", "web6"]);
        let web = &c.services[0];
        assert_eq!(web.mode, Mode::DsrL2);
        assert_eq!(web.frontend().to_string(), "203.0.113.10:80");
        assert_eq!(
            web.health_check.as_ref().unwrap().kind,
            HealthKind::Http {
                path: "/healthz".into()
            }
        );
        let b: Vec<String> = web
            .backends
            .iter()
            .map(|b| format!("{} {}", b.socket_addr(), b.mac.unwrap()))
            .collect();
        assert_eq!(
            b,
            [
                "198.51.100.11:80 02:00:00:00:01:11",
                "198.51.100.12:80 02:00:00:00:01:12",
                "198.51.100.13:80 02:00:00:00:01:13"
            ]
        );
        let echo = &c.services[1];
        assert_eq!(echo.protocol, Protocol::Udp);
        assert_eq!(echo.backends[0].port, 5353);
        assert_eq!(echo.health_check.as_ref().unwrap().port, Some(80));
        assert_eq!(
            c.services[2].backends[2].address.to_string(),
            "2001:db8:b::13"
        );
    }

    #[test]
    fn every_gateway_of_a_router_layout_peers_with_its_link() {
        let layout = Layout {
            dpdk: None,
            queues: 1,
            prefix: "st9".to_owned(),
            topology: Topology::OneArm,
            backends: 3,
            ipv6: false,
            gateways: 3,
            l2: false,
        };
        let gw = layout.gateway(2);
        let all = layout.backend_specs();
        let text = render_gateway(&layout, &gw, &active(&all[..2]), true, Path::new("/x.toml"));
        let c = strait_config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let bgp = c.gateway.bgp.as_ref().expect("[gateway.bgp]");
        assert_eq!(bgp.asn, 64512);
        assert_eq!(bgp.router_id.to_string(), "192.0.2.34");
        assert_eq!(bgp.peers[0].address.to_string(), "192.0.2.33");
        assert_eq!(bgp.peers[0].asn, 64500);
        assert_eq!(c.services[0].mode, Mode::DsrL2);
        assert_eq!(c.services[0].backends.len(), 2);
        let ifs: Vec<(&str, Role)> = c
            .gateway
            .interfaces
            .iter()
            .map(|i| (i.name.as_str(), i.role))
            .collect();
        assert_eq!(ifs, [("veth-c", Role::Client), ("veth-b", Role::Backend)]);

        let l2 = Layout { l2: true, ..layout };
        let text = render_gateway(
            &l2,
            &l2.gateway(1),
            &active(&all),
            true,
            Path::new("/x.toml"),
        );
        let c = strait_config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert!(c.gateway.bgp.is_none());
        let l2 = c.gateway.l2.as_ref().expect("[gateway.l2]");
        assert_eq!(
            l2.members.len(),
            l2.members.iter().filter(|m| m.starts_with("gw")).count()
        );
        assert!(l2.members.contains(&l2.name));
        assert_eq!(c.gateway.interfaces[0].name, "veth-gw");
        assert!(c.gateway.sync.is_some());
    }

    /// The failover bench's backend change: the last backend draining in both services, and
    /// its runs without flow sync.
    #[test]
    fn a_fleet_gateway_can_have_a_draining_backend_and_no_sync() {
        let layout = Layout {
            prefix: "st9".to_owned(),
            topology: Topology::OneArm,
            backends: 3,
            ipv6: false,
            gateways: 2,
            l2: false,
            dpdk: None,
            queues: 1,
        };
        let mut backends = active(&layout.backend_specs());
        backends[2].1 = BackendState::Draining;
        let text = render_gateway(
            &layout,
            &layout.gateway(1),
            &backends,
            false,
            Path::new("/x"),
        );
        let c = strait_config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert!(c.gateway.sync.is_none());
        for service in &c.services {
            let states: Vec<BackendState> = service.backends.iter().map(|b| b.state).collect();
            let want = [
                BackendState::Active,
                BackendState::Active,
                BackendState::Draining,
            ];
            assert_eq!(states, want, "{}", service.name);
        }
    }

    fn active(specs: &[BackendSpec]) -> Vec<(BackendSpec, BackendState)> {
        specs
            .iter()
            .map(|b| (b.clone(), BackendState::Active))
            .collect()
    }

    #[test]
    fn two_arm_is_nat_to_8080() {
        let c = render_parse(Topology::TwoArm, false);
        let ifs: Vec<(&str, Role)> = c
            .gateway
            .interfaces
            .iter()
            .map(|i| (i.name.as_str(), i.role))
            .collect();
        assert_eq!(ifs, [("veth-c", Role::Client), ("veth-b", Role::Backend)]);
        assert_eq!(c.services.len(), 2, "no web6 without IPv6");
        assert!(c.services.iter().all(|s| s.mode == Mode::Nat));
        assert_eq!(
            c.services[0].backends[0].socket_addr().to_string(),
            "198.51.100.11:8080"
        );
        assert_eq!(c.services[1].frontend().to_string(), "203.0.113.10:53");
        assert_eq!(
            c.services[1].backends[1].socket_addr().to_string(),
            "198.51.100.12:5353"
        );
    }
}
