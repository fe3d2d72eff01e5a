//! The shipped example, the summary, loading from disk and writing back.

use std::path::Path;

use strait_config::{
    example, load, parse, summary, to_toml, BackendState, ConfigError, HealthKind, MacAddr, Mode,
    Protocol, EXAMPLE,
};

#[test]
fn example_is_the_testbed_default() {
    let c = example();
    let g = &c.gateway;
    assert_eq!(g.interfaces.len(), 1);
    assert_eq!(g.interfaces[0].name, "veth-gw");
    assert_eq!(g.interfaces[0].queues, [0]);

    let web = &c.services[0];
    assert_eq!(web.name, "web");
    assert_eq!(web.frontend(), "203.0.113.10:80".parse().unwrap());
    assert_eq!(web.protocol, Protocol::Tcp);
    assert_eq!(web.mode, Mode::DsrL2);
    assert_eq!(web.backends.len(), 4);
    for (i, b) in web.backends.iter().enumerate() {
        let n = 11 + i as u8;
        assert_eq!(
            b.address,
            format!("198.51.100.{n}")
                .parse::<std::net::IpAddr>()
                .unwrap()
        );
        assert_eq!(b.port, 80);
        assert_eq!(b.mac, Some(MacAddr([2, 0, 0, 0, 1, 0x11 + i as u8])));
        assert_eq!(b.state, BackendState::Active);
    }
    assert_eq!(
        web.health_check.as_ref().unwrap().kind,
        HealthKind::Http {
            path: "/healthz".into()
        }
    );

    let echo = &c.services[1];
    assert_eq!(echo.name, "echo");
    assert_eq!(echo.frontend(), "203.0.113.10:5353".parse().unwrap());
    assert_eq!(echo.protocol, Protocol::Udp);
    assert_eq!(echo.mode, Mode::DsrL2);
    let backends: Vec<String> = echo
        .backends
        .iter()
        .map(|b| b.socket_addr().to_string())
        .collect();
    assert_eq!(
        backends,
        [
            "198.51.100.11:5353",
            "198.51.100.12:5353",
            "198.51.100.13:5353",
            "198.51.100.14:5353"
        ]
    );
}

#[test]
fn example_file_on_disk_is_the_embedded_one() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("strait.example.toml");
    assert_eq!(load(&path).unwrap(), example());
}

#[test]
fn example_uses_documentation_addresses_only() {
    let c = example();
    let doc: [ipnet::IpNet; 4] = [
        "192.0.2.0/24".parse().unwrap(),
        "198.51.100.0/24".parse().unwrap(),
        "203.0.113.0/24".parse().unwrap(),
        "2001:db8::/32".parse().unwrap(),
    ];
    for s in &c.services {
        assert!(doc.iter().any(|n| n.contains(&s.vip)), "{}", s.vip);
        for b in &s.backends {
            assert!(doc.iter().any(|n| n.contains(&b.address)), "{}", b.address);
        }
    }
}

#[test]
fn commented_ipv6_example_is_valid_when_uncommented() {
    let (head, tail) = EXAMPLE
        .split_once("# An IPv6 service")
        .expect("the example has an IPv6 section");
    let uncommented: String = tail
        .lines()
        .skip(1)
        .map(|l| {
            l.strip_prefix("# ")
                .or_else(|| l.strip_prefix('#'))
                .unwrap_or(l)
        })
        .collect::<Vec<_>>()
        .join("\n");
    let c = parse(&format!("{head}\n{uncommented}\n")).unwrap();
    let web6 = c.services.iter().find(|s| s.name == "web6").unwrap();
    assert_eq!(
        web6.vip,
        "2001:db8::10".parse::<std::net::IpAddr>().unwrap()
    );
    assert_eq!(web6.backends.len(), 2);
}

#[test]
fn example_round_trips() {
    let c = example();
    let text = to_toml(&c);
    assert_eq!(parse(&text).unwrap(), c, "{text}");
    // and the writer is stable
    assert_eq!(to_toml(&parse(&text).unwrap()), text);
}

#[test]
fn summary_fits_a_screen_and_names_every_service() {
    let c = example();
    let s = summary(&c);
    assert!(s.lines().count() <= 24, "{s}");
    for service in &c.services {
        let line = s
            .lines()
            .find(|l| l.starts_with(&format!("service {} ", service.name)))
            .unwrap_or_else(|| panic!("{} missing:\n{s}", service.name));
        assert!(line.contains(&format!("{}/{}", service.frontend(), service.protocol)));
        assert!(line.contains(service.mode.as_str()));
        assert!(line.contains(&format!("{} backends", service.backends.len())));
    }
    assert!(s.contains("198.51.100.11:80 w=100 active"), "{s}");
    assert!(
        s.contains("health http GET /healthz every 1s timeout 500ms rise 2 fall 3"),
        "{s}"
    );
    assert!(s.contains("affinity none"), "{s}");
    assert!(s.contains("sources all"), "{s}");
    assert!(s.contains("veth-gw"), "{s}");
    assert!(s.contains("127.0.0.1:9900"), "{s}");
}

#[test]
fn summary_of_edge_cases() {
    let c = parse(
        r#"
[gateway]
new_flows_per_second_per_core = 0

[[gateway.interfaces]]
name = "eth0"
queues = [0, 1]
cores = [2, 3]
vlans = [100, 200]

[[services]]
name = "empty"
vip = "2001:db8::10"
port = 443
source_ranges = ["2001:db8:1::/48"]

[services.session_affinity]

[[services]]
name = "one"
vip = "203.0.113.10"
port = 80
mode = "dsr-gue"

[services.health_check]
kind = "tcp"
port = 10256

[[services.backends]]
address = "198.51.100.11"
tunnel = "2001:db8::11"
state = "draining"
weight = 0
"#,
    )
    .unwrap();
    let s = summary(&c);
    assert!(s.contains("unlimited"), "{s}");
    assert!(
        s.contains("eth0 queues 0,1 cores 2,3 role both vlans 100,200"),
        "{s}"
    );
    assert!(
        s.contains("service empty [2001:db8::10]:443/tcp dsr-l2 maglev 65537: no backends"),
        "{s}"
    );
    assert!(s.contains("affinity client-ip 3h"), "{s}");
    assert!(s.contains("sources 2001:db8:1::/48"), "{s}");
    assert!(
        s.contains("1 backend [198.51.100.11:80 w=0 draining via 2001:db8::11]"),
        "{s}"
    );
    assert!(s.contains("health tcp port 10256 every 1s"), "{s}");

    let none = parse("[[gateway.interfaces]]\nname = \"eth0\"\nqueues = [0]\n").unwrap();
    assert!(summary(&none).contains("services: none"));
}

#[test]
fn load_reports_a_missing_file() {
    let err = load("/nonexistent/strait.toml").unwrap_err();
    assert!(matches!(err, ConfigError::Io { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "cannot read configuration file /nonexistent/strait.toml: No such file or directory (os error 2)"
    );
}

#[test]
fn load_reports_problems_of_a_file() {
    let dir = std::env::temp_dir().join(format!("strait-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(&path, "[gateway]\nmtu = 1\n").unwrap();
    let err = load(&path).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        err.to_string(),
        "gateway.mtu: 1 is outside 576..=9000\n\
         gateway.interfaces: at least one interface is required ([[gateway.interfaces]])"
    );
}

/// The commented `[gateway.bgp]` and `[gateway.l2]` sections, each uncommented on its own,
/// are valid.
#[test]
fn commented_bgp_and_l2_examples_are_valid_when_uncommented() {
    let section = |from: &str, to: &str| -> String {
        let start = EXAMPLE.find(from).expect("section start");
        let end = start + EXAMPLE[start..].find(to).expect("section end");
        EXAMPLE[start..end]
            .lines()
            .map(|l| l.strip_prefix("# ").unwrap_or(l))
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let bgp = section("# [gateway.bgp]\n", "# ... or,");
    let c = parse(&format!("{EXAMPLE}\n{bgp}\n")).unwrap_or_else(|e| panic!("{e}\n{bgp}"));
    let b = c.gateway.bgp.expect("bgp");
    assert_eq!((b.asn, b.peers.len()), (64512, 1));
    assert_eq!(b.peers[0].password.as_deref(), Some("secret"));
    assert_eq!(c.gateway.drain_grace, std::time::Duration::from_secs(5));
    let l2 = section("# [gateway.l2]\n", "# ------");
    let c = parse(&format!("{EXAMPLE}\n{l2}\n")).unwrap_or_else(|e| panic!("{e}\n{l2}"));
    assert_eq!(c.gateway.l2.expect("l2").members.len(), 3);
}
