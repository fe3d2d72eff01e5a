use std::collections::HashMap;

use ipnet::IpNet;

use super::rtnl::*;
use super::*;
use crate::core::hops::{self, *};
use crate::core::Neighbours;
use strait_config::model::{MacAddr, Mode, Service};
use strait_testkit::config::{GatewayToml, ServiceToml};

thread_local! {
    static PROBED: std::cell::RefCell<Vec<IpAddr>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A [`NextHops`] whose probes are recorded in `PROBED`.
#[derive(Default)]
struct Recording(NextHops);

impl Recording {
    fn fill(&mut self, services: &mut [Service], neighbours: &Neighbours) {
        let probes = self.0.fill(services, neighbours);
        PROBED.with(|p| p.borrow_mut().extend(probes));
    }

    fn refresh(&self) {
        let probes = self.0.refresh();
        PROBED.with(|p| p.borrow_mut().extend(probes));
    }
}

impl std::ops::Deref for Recording {
    type Target = NextHops;
    fn deref(&self) -> &NextHops {
        &self.0
    }
}

impl std::ops::DerefMut for Recording {
    fn deref_mut(&mut self) -> &mut NextHops {
        &mut self.0
    }
}

fn recording() -> Recording {
    Recording::default()
}

fn web(backends: &[(&str, Option<&str>)]) -> Service {
    let web = backends.iter().fold(
        ServiceToml::new("web", "203.0.113.10", 80),
        |s, (a, mac)| match mac {
            Some(m) => s.backend_mac(a, 80, m),
            None => s.backend(a, 80),
        },
    );
    let cfg = strait_config::parse(&GatewayToml::eth0().service(web).to_string()).unwrap();
    cfg.services.into_iter().next().unwrap()
}

fn macs(entries: &[(&str, u8)]) -> Neighbours {
    Neighbours {
        macs: entries
            .iter()
            .map(|(a, m)| (a.parse().unwrap(), MacAddr([2, 0, 0, 0, 1, *m])))
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
        why.contains("changed") && why.contains("192.0.2.8 02:00:00:00:01:07 -> 02:00:00:00:01:08"),
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
        only: None,
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
fn parse(json: &[u8]) -> HashMap<IpAddr, MacAddr> {
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
            Some((ip, mac))
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
            super::rtnl::read("v0", false),
            ip_table("v0"),
            table("v1"),
        )
    });
    let read = read.unwrap();
    let unfiltered = unfiltered.unwrap();

    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let net = |s: &str| s.parse::<IpNet>().unwrap();
    let mac = |last: u8| MacAddr([2, 0, 0, 0, 1, last]);
    let macs: HashMap<IpAddr, MacAddr> = [
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
            (ip("192.0.2.11"), MacAddr([2, 0, 0, 0, 2, 0x11])),
            (ip("2001:db8:9::11"), MacAddr([2, 0, 0, 0, 2, 0x21]))
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
    let web = ServiceToml::new("web", "203.0.113.10", 80)
        .backend("198.51.100.11", 80)
        .backend("198.51.100.12", 80)
        .backend_mac("198.51.100.13", 80, "02:00:00:00:01:13");
    let tun = ServiceToml::new("tun", "203.0.113.11", 80)
        .mode("dsr-ipip")
        .backend_table(r#"{ address = "198.51.100.14", port = 80, tunnel = "198.51.100.11" }"#);
    let mut cfg =
        strait_config::parse(&GatewayToml::eth0().service(web).service(tun).to_string()).unwrap();
    let known = Neighbours {
        macs: [(
            "198.51.100.11".parse().unwrap(),
            MacAddr([2, 0, 0, 0, 1, 0x11]),
        )]
        .into(),
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
        MacAddr([2, 0, 0, 0, 1, 0x12])
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
        macs: [(
            "198.51.100.11".parse().unwrap(),
            MacAddr([2, 0, 0, 0, 1, 0x11]),
        )]
        .into(),
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
    let pods = ServiceToml::new("pods", "203.0.113.10", 80)
        .mode("nat")
        .backend("203.0.113.65", 8080)
        .backend("203.0.113.99", 8080);
    let mut cfg = strait_config::parse(&GatewayToml::eth0().service(pods).to_string()).unwrap();
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
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), batch.join("\n").as_bytes()).unwrap();
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

#[test]
fn a_read_of_some_next_hops_updates_their_entries_and_keeps_the_others() {
    let (a, b, c) = (
        addr("198.51.100.11"),
        addr("198.51.100.12"),
        addr("198.51.100.13"),
    );
    let mut known = routed(&[("198.51.100.11", 0x11), ("198.51.100.12", 0x12)], &[]);
    known.ifindex = 7;
    // The kernel now: b has another MAC, c resolved, and a pod prefix is routed via c.
    let mut kernel = routed(
        &[
            ("198.51.100.11", 0x11),
            ("198.51.100.12", 0x99),
            ("198.51.100.13", 0x13),
        ],
        &[("203.0.113.64/28", "198.51.100.13")],
    );
    kernel.ifindex = 7;
    // A dsr-l2 backend is its own next hop, also inside the routed prefix; a routed one is
    // reached through the router.
    let targets = [
        (b, false),
        (addr("203.0.113.65"), true),
        (addr("203.0.113.66"), false),
    ];
    let part = kernel.part(&targets);
    let hops = vec![b, c, addr("203.0.113.66")];
    assert_eq!(part.only.as_ref(), Some(&hops), "sorted, once each");
    assert_eq!(
        part.macs,
        [
            (b, MacAddr([2, 0, 0, 0, 1, 0x99])),
            (c, MacAddr([2, 0, 0, 0, 1, 0x13]))
        ]
        .into(),
        "the asked next hops' entries only"
    );
    assert_eq!(part.routes, kernel.routes);
    known.update(part);
    assert_eq!(known.only, None, "what the core knows stays a whole table");
    assert_eq!(known.macs.len(), 3);
    assert_eq!(
        known.macs[&a],
        MacAddr([2, 0, 0, 0, 1, 0x11]),
        "not asked: kept"
    );
    assert_eq!(
        known.macs[&b],
        MacAddr([2, 0, 0, 0, 1, 0x99]),
        "asked: updated"
    );
    assert_eq!(
        known.macs[&c],
        MacAddr([2, 0, 0, 0, 1, 0x13]),
        "asked: added"
    );
    assert_eq!(
        known.routes, kernel.routes,
        "a read always carries the routes"
    );
    // An asked next hop the kernel has no entry for (gone, or FAILED) is gone.
    let gone = macs(&[]).part(&[(a, false)]);
    known.update(gone);
    assert!(!known.macs.contains_key(&a));
    assert_eq!(
        known.ifindex, 7,
        "an unknown interface index keeps the known one"
    );
    // A whole read replaces everything.
    known.update(macs(&[("198.51.100.12", 0x12)]));
    assert_eq!(known, macs(&[("198.51.100.12", 0x12)]));

    // What a change asks for: the targets of the backends without a MAC.
    let mut s = nat(&["198.51.100.11", "203.0.113.65"]);
    s.backends[0].mac = Some(MacAddr([2, 0, 0, 0, 1, 0x11]));
    assert_eq!(targets_of(&s), vec![(addr("203.0.113.65"), true)]);
    s.mode = Mode::DsrL2;
    assert_eq!(targets_of(&s), vec![(addr("203.0.113.65"), false)]);
}

fn targets_of(s: &Service) -> Vec<(IpAddr, bool)> {
    hops::targets(s).collect()
}

#[test]
fn reads_the_entries_of_some_next_hops_among_a_thousand_as_the_whole_table_has_them() {
    if !privileged("neigh::reads_the_entries_of_some_next_hops_among_a_thousand") {
        return;
    }
    let ns = bed("nh");
    // A thousand nodes on the segment, as in a large cluster under dsr-l2.
    let node = |k: usize| format!("2001:db8:1::1:{k:x}");
    let mut batch: Vec<String> = (0..1000)
        .map(|k| {
            format!(
                "neigh add {} lladdr 02:00:00:01:{:02x}:{:02x} dev v0 nud permanent",
                node(k),
                k >> 8,
                k & 0xff
            )
        })
        .collect();
    batch.extend(
        [
            "neigh add 198.51.100.11 lladdr 02:00:00:00:01:11 dev v0 nud reachable",
            "neigh add 198.51.100.14 dev v0 nud failed",
            "neigh add 198.51.100.15 dev v0 nud incomplete",
            "neigh add 198.51.100.16 lladdr 02:00:00:00:01:16 dev v0 nud noarp",
            "neigh add 192.0.2.11 lladdr 02:00:00:00:02:11 dev v1 nud permanent",
            "route add 203.0.113.64/28 via 198.51.100.11 dev v0",
            "route add 2001:db8:2::/48 via 2001:db8:1::1:5 dev v0",
        ]
        .map(String::from),
    );
    let mut child = Command::new("ip")
        .args(["-n", ns.name(), "-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), batch.join("\n").as_bytes()).unwrap();
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success(), "ip -batch");

    let targets = [
        // On the segment: their own entries.
        (addr(&node(7)), false),
        (addr(&node(999)), false),
        // Routed: the routers' entries (IPv4 and IPv6).
        (addr("203.0.113.70"), true),
        (addr("2001:db8:2::9"), true),
        // Absent, unresolved, not listed by ip (NOARP), or on the other interface.
        (addr("2001:db8:1::ffff"), false),
        (addr("198.51.100.14"), false),
        (addr("198.51.100.15"), false),
        (addr("198.51.100.16"), false),
        (addr("192.0.2.11"), false),
        // dsr-l2: its own next hop although a route covers it; absent.
        (addr("203.0.113.71"), false),
    ];
    let every: Vec<(IpAddr, bool)> = (0..1000).map(|k| (addr(&node(k)), false)).collect();
    let reads = 100;
    let (read, whole, all, on_v1, few, dump) = Netns::run_in(&ns, || {
        let read = hop_entries("v0", &targets).unwrap();
        let whole = table("v0").unwrap();
        let all = hop_entries("v0", &every).unwrap();
        let on_v1 = hop_entries("v1", &[(addr("192.0.2.11"), false)]).unwrap();
        let t = Instant::now();
        for _ in 0..reads {
            assert_eq!(hop_entries("v0", &targets).unwrap().macs.len(), 4);
        }
        let few = t.elapsed();
        let t = Instant::now();
        for _ in 0..reads {
            assert_eq!(table("v0").unwrap().macs.len(), 1001);
        }
        (read, whole, all, on_v1, few, t.elapsed())
    });
    let mac = |m: [u8; 6]| MacAddr(m);
    assert_eq!(
        read.macs,
        [
            (addr(&node(7)), mac([2, 0, 0, 1, 0, 7])),
            (addr(&node(999)), mac([2, 0, 0, 1, 3, 0xe7])),
            (addr("198.51.100.11"), mac([2, 0, 0, 0, 1, 0x11])),
            (addr(&node(5)), mac([2, 0, 0, 1, 0, 5])),
        ]
        .into(),
        "the resolved entries of the asked next hops, none else"
    );
    let mut hops = vec![
        addr(&node(7)),
        addr(&node(999)),
        addr("198.51.100.11"),
        addr(&node(5)),
        addr("2001:db8:1::ffff"),
        addr("198.51.100.14"),
        addr("198.51.100.15"),
        addr("198.51.100.16"),
        addr("192.0.2.11"),
        addr("203.0.113.71"),
    ];
    hops.sort();
    assert_eq!(read.only, Some(hops), "every asked next hop, found or not");
    assert_eq!(read.ifindex, whole.ifindex);
    assert_eq!(sorted(read.routes.clone()), sorted(whole.routes.clone()));
    // The same as the whole table's read restricted to them.
    let mut restricted = whole.part(&targets);
    restricted.routes = sorted(restricted.routes);
    let mut sorted_read = read.clone();
    sorted_read.routes = sorted(sorted_read.routes);
    assert_eq!(sorted_read, restricted);
    // More next hops than one datagram of requests: every answer is read, none dropped.
    assert!(every.len() > GETS_AT_ONCE);
    assert_eq!(all.macs.len(), 1000);
    assert!(all.macs.iter().all(|(a, m)| whole.macs.get(a) == Some(m)));
    // The other interface's entry is its own.
    assert_eq!(
        on_v1.macs,
        [(addr("192.0.2.11"), mac([2, 0, 0, 0, 2, 0x11]))].into()
    );
    // An unknown interface is an error naming it.
    let e = hop_entries("strait-nope0", &targets).unwrap_err();
    assert_eq!(
        (e.iface.as_str(), e.call),
        ("strait-nope0", "if_nametoindex")
    );
    eprintln!(
        "{} entries: a read of {} next hops {:.1} us, of the whole table {:.1} us ({reads} reads each)",
        whole.macs.len(),
        targets.len(),
        few.as_secs_f64() * 1e6 / f64::from(reads),
        dump.as_secs_f64() * 1e6 / f64::from(reads),
    );
}
