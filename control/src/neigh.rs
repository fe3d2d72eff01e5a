//! Next-hop MACs from the kernel's neighbour table.
//!
//! A backend configured without a MAC (every node the Kubernetes source produces, and any
//! static backend that leaves it out) is reached at the MAC the kernel's neighbour table holds
//! for its address on the backend-facing interface: the same ARP/ND the kernel does for its
//! own traffic, so nothing new speaks on the wire. An address not resolved yet is probed with
//! one UDP datagram to its discard port, which makes the kernel resolve it; the control loop
//! rebuilds the table when the answer arrives. Until then its frames are dropped and counted
//! (`no_next_hop`); health checks, which the kernel sends, usually resolve it first.
//!
//! A backend behind a router (a pod address routed via its node, `ip route add <podCIDR>
//! via <node>`) is reached at the router's MAC: the next hop is the gateway of the most
//! specific route of the interface that covers the address, as the kernel would choose.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::process::Command;

use ipnet::IpNet;
use strait_config::model::{Config, MacAddr, Mode, Role, Service};

/// What the kernel knows about reaching hosts through one interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Neighbours {
    /// Resolved neighbour entries: address to MAC.
    pub macs: HashMap<IpAddr, [u8; 6]>,
    /// The interface's routes: destination and gateway (`None`: on-link).
    pub routes: Vec<(IpNet, Option<IpAddr>)>,
}

impl Neighbours {
    /// The next hop towards `addr`: the gateway of the most specific route that covers
    /// it, else `addr` itself (on-link, or no route known).
    pub fn next_hop(&self, addr: IpAddr) -> IpAddr {
        self.routes
            .iter()
            .filter(|(net, _)| net.contains(&addr))
            .max_by_key(|(net, _)| net.prefix_len())
            .and_then(|(_, via)| *via)
            .unwrap_or(addr)
    }
}

/// `iface`'s resolved neighbours (`ip -j neigh show dev IFACE`) and routes (`ip -j -4|-6
/// route show dev IFACE`).
pub fn table(iface: &str) -> Neighbours {
    let run = |args: &[&str]| {
        Command::new("ip")
            .args(args)
            .output()
            .map(|out| out.stdout)
            .unwrap_or_default()
    };
    let mut routes = parse_routes(&run(&["-j", "-4", "route", "show", "dev", iface]), false);
    routes.extend(parse_routes(
        &run(&["-j", "-6", "route", "show", "dev", iface]),
        true,
    ));
    Neighbours {
        macs: parse(&run(&["-j", "neigh", "show", "dev", iface])),
        routes,
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

/// The resolved entries of `ip -j neigh` output: those with a link-layer address and not
/// `FAILED` or `INCOMPLETE`.
fn parse(json: &[u8]) -> HashMap<IpAddr, [u8; 6]> {
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
            Some((ip, mac.0))
        })
        .collect()
}

/// The interface facing the backends (role `backend` or `both`).
pub fn backend_iface(cfg: &Config) -> Option<String> {
    cfg.gateway
        .interfaces
        .iter()
        .find(|i| matches!(i.role, Role::Backend | Role::Both))
        .map(|i| i.name.clone())
}

/// Fills the MAC of every backend that has none from `neighbours`; returns the next-hop
/// addresses still unknown. The next hop is the route's gateway towards the tunnel target
/// in the tunnel modes, towards the backend's address in `nat`; on-link, the address
/// itself. `dsr-l2` backends are always their own next hop (the frame keeps the VIP as
/// destination, so a router on the way could not deliver it).
pub fn fill(cfg: &mut Config, neighbours: &Neighbours) -> Vec<IpAddr> {
    fill_services(&mut cfg.services, neighbours)
}

/// As [`fill`] for some services.
pub fn fill_services(services: &mut [Service], neighbours: &Neighbours) -> Vec<IpAddr> {
    let mut missing = Vec::new();
    for s in services {
        let tunnel = s.mode.is_tunnel();
        // dsr-l2 keeps the VIP as destination: only a backend on the segment can take it.
        let routed = s.mode != Mode::DsrL2;
        for b in s.backends.iter_mut().filter(|b| b.mac.is_none()) {
            let target = if tunnel { b.tunnel_target() } else { b.address };
            let hop = if routed {
                neighbours.next_hop(target)
            } else {
                target
            };
            match neighbours.macs.get(&hop) {
                Some(m) => b.mac = Some(MacAddr(*m)),
                None => missing.push(hop),
            }
        }
    }
    missing.sort();
    missing.dedup();
    missing
}

/// Makes the kernel resolve `addr`: one empty datagram to its discard port (9).
pub fn probe(addr: IpAddr) {
    let local: SocketAddr = match addr {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    if let Ok(s) = UdpSocket::bind(local) {
        let _ = s.send_to(&[], SocketAddr::new(addr, 9));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_known_macs_and_lists_the_rest() {
        let mut cfg = strait_config::parse(
            r#"
[[gateway.interfaces]]
name = "eth0"
queues = [0]
[[services]]
name = "web"
vip = "203.0.113.10"
port = 80
backends = [{ address = "198.51.100.11", port = 80 }, { address = "198.51.100.12", port = 80 },
            { address = "198.51.100.13", port = 80, mac = "02:00:00:00:01:13" }]
[[services]]
name = "tun"
vip = "203.0.113.11"
port = 80
mode = "dsr-ipip"
backends = [{ address = "198.51.100.14", port = 80, tunnel = "198.51.100.11" }]
"#,
        )
        .unwrap();
        let known = Neighbours {
            macs: [("198.51.100.11".parse().unwrap(), [2, 0, 0, 0, 1, 0x11])].into(),
            routes: Vec::new(),
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
            [2, 0, 0, 0, 1, 0x12]
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
            macs: [("198.51.100.11".parse().unwrap(), [2, 0, 0, 0, 1, 0x11])].into(),
            routes: parse_routes(json, false),
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
        let mut cfg = strait_config::parse(
            r#"
[[gateway.interfaces]]
name = "eth0"
queues = [0]
[[services]]
name = "pods"
vip = "203.0.113.10"
port = 80
mode = "nat"
backends = [{ address = "203.0.113.65", port = 8080 }, { address = "203.0.113.99", port = 8080 }]
"#,
        )
        .unwrap();
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
}
