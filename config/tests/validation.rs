//! Every validation rule, refused with its exact path and message.

use std::net::IpAddr;
use std::time::Duration;

use strait_config::{
    parse, BackendState, Config, DnsType, Gateway, HealthCheck, HealthKind, MacAddr, Mode,
    Protocol, Role, RouteAttrs, Service, Timeouts,
};

const IFACE: &str = "[[gateway.interfaces]]\nname = \"eth0\"\nqueues = [0]\n";

fn problems(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(config) => panic!("accepted:\n{text}\n{config:#?}"),
        Err(e) => e.problems().iter().map(ToString::to_string).collect(),
    }
}

#[track_caller]
fn refused(text: &str, expected: &str) {
    assert_eq!(problems(text), [expected], "\n{text}");
}

#[track_caller]
fn accepted(text: &str) -> Config {
    parse(text).unwrap_or_else(|e| panic!("refused:\n{text}\n{e}"))
}

/// A `[gateway]` table with `fields`, and one interface.
fn gateway(fields: &str) -> String {
    format!("[gateway]\n{fields}\n\n{IFACE}")
}

/// One interface and a service "web" 203.0.113.10:80 with `fields` (plain keys, or
/// sub-tables after them).
fn service(fields: &str) -> String {
    format!("{IFACE}\n[[services]]\nname = \"web\"\nvip = \"203.0.113.10\"\nport = 80\n{fields}\n")
}

/// [`service`] with one backend of `fields`.
fn backend(service_fields: &str, fields: &str) -> String {
    format!(
        "{}\n[[services.backends]]\n{fields}\n",
        service(service_fields)
    )
}

// ---- defaults ------------------------------------------------------------------------

#[test]
fn minimal_config_gets_every_default() {
    let c = accepted(IFACE);
    let g = &c.gateway;
    assert_eq!(g.admin_listen, "127.0.0.1:9900".parse().unwrap());
    assert_eq!(g.default_mode, Mode::DsrL2);
    assert_eq!(g.flow_capacity_per_core, 1_048_576);
    assert_eq!(g.new_flows_per_second_per_core, 125_000);
    assert_eq!(g.gue_port, 6080);
    assert_eq!(g.tunnel_source_v4, None);
    assert_eq!(g.tunnel_source_v6, None);
    assert_eq!(g.mtu, 1500);
    assert_eq!(g.timeouts, Timeouts::default());
    assert_eq!(g.interfaces.len(), 1);
    assert_eq!(g.interfaces[0].name, "eth0");
    assert_eq!(g.interfaces[0].queues, [0]);
    assert_eq!(g.interfaces[0].cores, None);
    assert_eq!(g.interfaces[0].role, Role::Both);
    assert!(g.interfaces[0].vlans.is_empty(), "untagged only");
    assert!(c.services.is_empty());
}

#[test]
fn service_defaults() {
    let c = accepted(&backend("", "address = \"198.51.100.11\""));
    let s = &c.services[0];
    assert_eq!(s.protocol, Protocol::Tcp);
    assert_eq!(s.mode, Mode::DsrL2);
    assert_eq!(s.maglev_table_size, 65_537);
    assert!(s.source_ranges.is_empty());
    assert_eq!(s.session_affinity, None);
    assert_eq!(s.health_check, None);
    assert_eq!(s.slow_start, None, "no slow start unless asked");
    let b = &s.backends[0];
    assert_eq!(b.port, 80, "backend port defaults to the service port");
    assert_eq!(b.weight, 100);
    assert_eq!(b.mac, None);
    assert_eq!(b.tunnel, None);
    assert_eq!(b.state, BackendState::Active);
}

#[test]
fn service_mode_defaults_to_gateway_default_mode() {
    let text = format!(
        "[gateway]\ndefault_mode = \"nat\"\n{}\n[[services.backends]]\naddress = \"198.51.100.11\"\nport = 8080\n",
        service("")
    );
    let c = accepted(&text);
    assert_eq!(c.services[0].mode, Mode::Nat);
    assert_eq!(c.services[0].backends[0].port, 8080);
}

#[test]
fn affinity_table_alone_means_kubernetes_default_timeout() {
    let c = accepted(&service("[services.session_affinity]"));
    assert_eq!(
        c.services[0].session_affinity,
        Some(Duration::from_secs(10_800))
    );
    let c = accepted(&service(
        "[services.session_affinity]\ntimeout = \"86400s\"",
    ));
    assert_eq!(
        c.services[0].session_affinity,
        Some(Duration::from_secs(86_400))
    );
}

#[test]
fn slow_start_whole_seconds_within_an_hour() {
    let c = accepted(&service("slow_start = \"30s\""));
    assert_eq!(c.services[0].slow_start, Some(Duration::from_secs(30)));
    let c = accepted(&service("slow_start = \"1h\""));
    assert_eq!(c.services[0].slow_start, Some(Duration::from_secs(3600)));
    refused(
        &service("slow_start = \"0s\""),
        "services[0].slow_start: 0s is shorter than 1s (omit the field for no slow start)",
    );
    refused(
        &service("slow_start = \"1500ms\""),
        "services[0].slow_start: 1s 500ms is not whole seconds (the ramp steps once a second)",
    );
    refused(
        &service("slow_start = \"3601s\""),
        "services[0].slow_start: 1h 1s is longer than 1h",
    );
    let p = problems(&service("slow_start = \"warm\""));
    assert!(
        p[0].starts_with("services[0].slow_start: \"warm\" is not a duration"),
        "{p:?}"
    );
    let p = problems(&service("slow_start = 30"));
    assert!(p[0].contains("slow_start"), "{p:?}");
}

#[test]
fn health_check_defaults() {
    let c = accepted(&service("[services.health_check]\nkind = \"tcp\""));
    assert_eq!(
        c.services[0].health_check,
        Some(HealthCheck {
            kind: HealthKind::Tcp,
            port: None,
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            rise: 2,
            fall: 3,
        })
    );
    let c = accepted(&service("[services.health_check]\nkind = \"http\""));
    assert_eq!(
        c.services[0].health_check.as_ref().unwrap().kind,
        HealthKind::Http { path: "/".into() }
    );
}

#[test]
fn everything_set_is_read() {
    let text = r#"
[gateway]
admin_listen = "[::1]:9901"
default_mode = "dsr-gue"
flow_capacity_per_core = 4096
new_flows_per_second_per_core = 0
gue_port = 9999
tunnel_source_v4 = "192.0.2.1"
tunnel_source_v6 = "2001:db8::1"
mtu = 9000

[gateway.timeouts]
tcp_syn = "5s"
tcp_established = "1h"
tcp_closing = "2s"
udp = "1m"

[[gateway.interfaces]]
name = "eth0"
queues = [0, 1]
cores = [2, 3]
role = "client"

[[gateway.interfaces]]
name = "eth1"
queues = [0]
cores = [2]
role = "backend"

[[services]]
name = "default/web"
vip = "203.0.113.10"
port = 443
protocol = "tcp"
mode = "dsr-ipip"
maglev_table_size = 655373
source_ranges = ["192.0.2.0/24", "198.51.100.7/32"]

[services.session_affinity]
timeout = "30m"

[services.health_check]
kind = "http"
path = "/ready?full=1"
port = 10256
interval = "2s"
timeout = "1s"
rise = 1
fall = 100

[[services.backends]]
address = "198.51.100.11"
port = 443
weight = 0
mac = "02:00:00:00:01:AB"
tunnel = "2001:db8::11"
state = "draining"
"#;
    let c = accepted(text);
    let g = &c.gateway;
    assert_eq!(g.admin_listen, "[::1]:9901".parse().unwrap());
    assert_eq!(g.default_mode, Mode::DsrGue);
    assert_eq!(g.flow_capacity_per_core, 4096);
    assert_eq!(g.new_flows_per_second_per_core, 0);
    assert_eq!(g.gue_port, 9999);
    assert_eq!(g.tunnel_source_v4, Some("192.0.2.1".parse().unwrap()));
    assert_eq!(g.tunnel_source_v6, Some("2001:db8::1".parse().unwrap()));
    assert_eq!(g.mtu, 9000);
    assert_eq!(
        g.timeouts,
        Timeouts {
            tcp_syn: Duration::from_secs(5),
            tcp_established: Duration::from_secs(3600),
            tcp_closing: Duration::from_secs(2),
            udp: Duration::from_secs(60),
        }
    );
    assert_eq!(g.interfaces[0].cores, Some(vec![2, 3]));
    assert_eq!(g.interfaces[0].role, Role::Client);
    assert_eq!(g.interfaces[1].role, Role::Backend);
    let s = &c.services[0];
    assert_eq!(s.name, "default/web");
    assert_eq!(s.mode, Mode::DsrIpip);
    assert_eq!(s.maglev_table_size, 655_373);
    assert_eq!(s.source_ranges.len(), 2);
    assert_eq!(s.session_affinity, Some(Duration::from_secs(1800)));
    let h = s.health_check.as_ref().unwrap();
    assert_eq!(
        h.kind,
        HealthKind::Http {
            path: "/ready?full=1".into()
        }
    );
    assert_eq!(h.port, Some(10256));
    assert_eq!((h.rise, h.fall), (1, 100));
    let b = &s.backends[0];
    assert_eq!(b.weight, 0);
    assert_eq!(b.mac, Some(MacAddr([2, 0, 0, 0, 1, 0xab])));
    assert_eq!(b.tunnel, Some("2001:db8::11".parse::<IpAddr>().unwrap()));
    assert_eq!(b.tunnel_target(), b.tunnel.unwrap());
    assert_eq!(b.state, BackendState::Draining);
    assert_eq!(h.port_for(b), 10256);
    // and it survives being written back
    assert_eq!(accepted(&strait_config::to_toml(&c)), c);
}

// ---- gateway -------------------------------------------------------------------------

#[test]
fn admin_listen_must_be_a_socket_address() {
    refused(
        &gateway("admin_listen = \"localhost\""),
        "gateway.admin_listen: \"localhost\" is not an address:port like \"127.0.0.1:9900\"",
    );
}

#[test]
fn default_mode_must_be_known() {
    refused(
        &gateway("default_mode = \"dsr\""),
        "gateway.default_mode: \"dsr\" is not one of dsr-l2, dsr-ipip, dsr-gue, nat",
    );
}

#[test]
fn flow_capacity_range() {
    refused(
        &gateway("flow_capacity_per_core = 0"),
        "gateway.flow_capacity_per_core: 0 is outside 1..=268435456",
    );
    refused(
        &gateway("flow_capacity_per_core = 268435457"),
        "gateway.flow_capacity_per_core: 268435457 is outside 1..=268435456",
    );
    accepted(&gateway("flow_capacity_per_core = 268435456"));
}

#[test]
fn new_flow_rate_range() {
    refused(
        &gateway("new_flows_per_second_per_core = -1"),
        "gateway.new_flows_per_second_per_core: -1 is outside 0..=4294967295",
    );
    refused(
        &gateway("new_flows_per_second_per_core = 4294967296"),
        "gateway.new_flows_per_second_per_core: 4294967296 is outside 0..=4294967295",
    );
}

#[test]
fn gue_port_range() {
    refused(
        &gateway("gue_port = 0"),
        "gateway.gue_port: 0 is not a port number",
    );
    refused(
        &gateway("gue_port = 65536"),
        "gateway.gue_port: 65536 is not a port number",
    );
}

#[test]
fn tunnel_sources_have_their_family() {
    refused(
        &gateway("tunnel_source_v4 = \"2001:db8::1\""),
        "gateway.tunnel_source_v4: 2001:db8::1 is not an IPv4 address",
    );
    refused(
        &gateway("tunnel_source_v4 = \"x\""),
        "gateway.tunnel_source_v4: \"x\" is not an IPv4 address",
    );
    refused(
        &gateway("tunnel_source_v6 = \"192.0.2.1\""),
        "gateway.tunnel_source_v6: 192.0.2.1 is not an IPv6 address",
    );
    refused(
        &gateway("tunnel_source_v4 = \"224.0.0.1\""),
        "gateway.tunnel_source_v4: 224.0.0.1 is a multicast address",
    );
    refused(
        &gateway("tunnel_source_v6 = \"::\""),
        "gateway.tunnel_source_v6: :: is the unspecified address",
    );
}

#[test]
fn mtu_range() {
    refused(
        &gateway("mtu = 575"),
        "gateway.mtu: 575 is outside 576..=9000",
    );
    refused(
        &gateway("mtu = 9001"),
        "gateway.mtu: 9001 is outside 576..=9000",
    );
    accepted(&gateway("mtu = 576"));
}

#[test]
fn mtu_must_carry_ipv6_when_a_vip_is_ipv6() {
    let text = format!(
        "[gateway]\nmtu = 1000\n\n{IFACE}\n[[services]]\nname = \"web6\"\nvip = \"2001:db8::10\"\nport = 80\n"
    );
    refused(
        &text,
        "gateway.mtu: 1000 is below 1280, the IPv6 minimum link MTU (RFC 8200), and services[0] has an IPv6 vip",
    );
}

#[test]
fn an_ipv6_tunnel_endpoint_needs_the_ipv6_minimum_mtu() {
    let text = format!(
        "[gateway]\nmtu = 1279\n\n{IFACE}\n[[services]]\nname = \"web\"\nvip = \"203.0.113.10\"\n\
         port = 80\nmode = \"dsr-ipip\"\n\n[[services.backends]]\naddress = \"198.51.100.11\"\n\
         tunnel = \"2001:db8::11\"\n"
    );
    refused(
        &text,
        "gateway.mtu: 1279 is below 1280, the IPv6 minimum link MTU (RFC 8200), and services[0] has an IPv6 tunnel endpoint",
    );
    accepted(&text.replace("mtu = 1279", "mtu = 1280"));
    accepted(&text.replace("2001:db8::11", "198.51.100.21"));
}

#[test]
fn timeouts_must_be_positive_and_at_most_a_week() {
    refused(
        &gateway("[gateway.timeouts]\nudp = \"0s\""),
        "gateway.timeouts.udp: 0s must be more than zero",
    );
    refused(
        &gateway("[gateway.timeouts]\ntcp_established = \"8days\""),
        "gateway.timeouts.tcp_established: 8days is longer than 7days",
    );
    accepted(&gateway(
        "[gateway.timeouts]\ntcp_established = \"7days\"\ntcp_closing = \"1ms\"",
    ));
}

#[test]
fn tcp_syn_at_most_tcp_established() {
    refused(
        &gateway("[gateway.timeouts]\ntcp_syn = \"3h\"\ntcp_established = \"2h\""),
        "gateway.timeouts.tcp_syn: 3h is longer than tcp_established (2h); a half-open flow would outlive an established one",
    );
    accepted(&gateway(
        "[gateway.timeouts]\ntcp_syn = \"2h\"\ntcp_established = \"2h\"",
    ));
}

#[test]
fn humantime_errors_are_named() {
    let p = problems(&gateway("[gateway.timeouts]\ntcp_syn = \"30 parsecs\""));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with(
            "gateway.timeouts.tcp_syn: \"30 parsecs\" is not a duration like \"30s\", \"500ms\" or \"2h\" (unknown time unit \"parsecs\""
        ),
        "{p:?}"
    );
    let p = problems(&service(
        "[services.health_check]\nkind = \"tcp\"\ninterval = \"soon\"",
    ));
    assert!(
        p[0].starts_with("services[0].health_check.interval: \"soon\" is not a duration"),
        "{p:?}"
    );
    let p = problems(&service("[services.session_affinity]\ntimeout = \"\""));
    assert!(
        p[0].starts_with("services[0].session_affinity.timeout: \"\" is not a duration"),
        "{p:?}"
    );
}

#[test]
fn a_duration_must_be_a_string() {
    let p = problems(&gateway("[gateway.timeouts]\ntcp_syn = 30"));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("gateway.timeouts.tcp_syn: invalid type: integer `30`, expected a string"),
        "{p:?}"
    );
}

// ---- interfaces ----------------------------------------------------------------------

#[test]
fn at_least_one_interface() {
    refused(
        "",
        "gateway.interfaces: at least one interface is required ([[gateway.interfaces]])",
    );
    refused(
        "[gateway]\nmtu = 1500\n",
        "gateway.interfaces: at least one interface is required ([[gateway.interfaces]])",
    );
}

#[test]
fn interface_name_rules() {
    let iface = |name: &str| format!("[[gateway.interfaces]]\nname = {name:?}\nqueues = [0]\n");
    refused(
        "[[gateway.interfaces]]\nqueues = [0]\n",
        "gateway.interfaces[0].name: is required",
    );
    refused(
        &iface(""),
        "gateway.interfaces[0].name: \"\" is 0 bytes long; interface names have 1 to 15",
    );
    refused(
        &iface("abcdefghijklmnop"),
        "gateway.interfaces[0].name: \"abcdefghijklmnop\" is 16 bytes long; interface names have 1 to 15",
    );
    accepted(&iface("abcdefghijklmno"));
    for bad in ["eth/0", "eth 0", "eth0:1", "eth\t0"] {
        refused(
            &iface(bad),
            &format!(
                "gateway.interfaces[0].name: {bad:?} contains '/', ':' or whitespace, which interface names cannot"
            ),
        );
    }
    for bad in [".", ".."] {
        refused(
            &iface(bad),
            &format!("gateway.interfaces[0].name: {bad:?} is not a valid interface name"),
        );
    }
}

#[test]
fn an_interface_name_has_no_control_character() {
    refused(
        "[[gateway.interfaces]]\nname = \"a\\u0001b\"\nqueues = [0]\n",
        "gateway.interfaces[0].name: \"a\\u{1}b\" contains a control character",
    );
}

#[test]
fn interface_names_unique() {
    refused(
        &format!("{IFACE}\n{IFACE}"),
        "gateway.interfaces[1].name: \"eth0\" is already used by gateway.interfaces[0]",
    );
}

#[test]
fn queue_rules() {
    let iface = |queues: &str| format!("[[gateway.interfaces]]\nname = \"eth0\"\n{queues}\n");
    refused(&iface(""), "gateway.interfaces[0].queues: is required");
    refused(
        &iface("queues = []"),
        "gateway.interfaces[0].queues: must list at least one queue",
    );
    refused(
        &iface("queues = [-1]"),
        "gateway.interfaces[0].queues[0]: -1 is outside 0..=4294967295",
    );
    refused(
        &iface("queues = [0, 1, 0]"),
        "gateway.interfaces[0].queues[2]: queue 0 is already listed at gateway.interfaces[0].queues[0]",
    );
}

#[test]
fn vlan_rules() {
    let iface =
        |vlans: &str| format!("[[gateway.interfaces]]\nname = \"eth0\"\nqueues = [0]\n{vlans}\n");
    assert_eq!(
        accepted(&iface("vlans = []")).gateway.interfaces[0].vlans,
        [0u16; 0]
    );
    assert_eq!(
        accepted(&iface("vlans = [4094, 1, 100]"))
            .gateway
            .interfaces[0]
            .vlans,
        [4094, 1, 100]
    );
    refused(
        &iface("vlans = [0]"),
        "gateway.interfaces[0].vlans[0]: 0 is not a VLAN id (1..=4094; 0 is a priority tag, 4095 reserved)",
    );
    refused(
        &iface("vlans = [100, 4095]"),
        "gateway.interfaces[0].vlans[1]: 4095 is not a VLAN id (1..=4094; 0 is a priority tag, 4095 reserved)",
    );
    refused(
        &iface("vlans = [-1]"),
        "gateway.interfaces[0].vlans[0]: -1 is not a VLAN id (1..=4094; 0 is a priority tag, 4095 reserved)",
    );
    refused(
        &iface("vlans = [100, 200, 100]"),
        "gateway.interfaces[0].vlans[2]: VLAN 100 is already listed at gateway.interfaces[0].vlans[0]",
    );
    // Every problem, each with its own path; and on the second interface, its index.
    assert_eq!(
        problems(&format!("{}{}", iface(""), iface("vlans = [5000, 7, 7]")).replace(
            "name = \"eth0\"\nqueues = [0]\nvlans",
            "name = \"eth1\"\nqueues = [0]\nvlans"
        )),
        [
            "gateway.interfaces[1].vlans[0]: 5000 is not a VLAN id (1..=4094; 0 is a priority tag, 4095 reserved)",
            "gateway.interfaces[1].vlans[2]: VLAN 7 is already listed at gateway.interfaces[1].vlans[1]",
        ]
    );
    refused(
        &iface("vlans = 100"),
        "gateway.interfaces[0].vlans: invalid type: integer `100`, expected a sequence (line 4, column 9)",
    );
}

#[test]
fn core_rules() {
    let iface =
        |name: &str, rest: &str| format!("[[gateway.interfaces]]\nname = \"{name}\"\n{rest}\n");
    refused(
        &iface("eth0", "queues = [0, 1]\ncores = [1]"),
        "gateway.interfaces[0].cores: length 1 differs from the length of queues (2); give one core per queue",
    );
    refused(
        &iface("eth0", "queues = [0]\ncores = [-1]"),
        "gateway.interfaces[0].cores[0]: -1 is not a CPU number (0..=1023)",
    );
    // A thousand cores is a typo, refused before any worker is planned.
    refused(
        &iface("eth0", "queues = [0]\ncores = [1000000]"),
        "gateway.interfaces[0].cores[0]: 1000000 is not a CPU number (0..=1023)",
    );
    refused(
        &iface("eth0", "queues = [0, 1]\ncores = [1, 1]"),
        "gateway.interfaces[0].cores[1]: core 1 is already used by gateway.interfaces[0].cores[0]",
    );
    refused(
        &format!(
            "{}{}",
            iface("eth0", "queues = [0, 1]\ncores = [1, 2]"),
            iface("eth1", "queues = [1]\ncores = [1]")
        ),
        "gateway.interfaces[1].cores[0]: core 1 for queue 1, whose worker (it serves queue 1 of every interface) gateway.interfaces[0].cores[1] puts on core 2",
    );
    refused(
        &format!(
            "{}{}",
            iface("eth0", "queues = [0, 1]\ncores = [1, 2]"),
            iface("eth1", "queues = [2]\ncores = [2]")
        ),
        "gateway.interfaces[1].cores[0]: core 2 is already used by gateway.interfaces[0].cores[1]",
    );
    // One worker serves a queue number on every interface that has it: its core, given on
    // each, is the same.
    let c = accepted(&format!(
        "{}{}",
        iface("eth0", "queues = [0]\ncores = [1]"),
        iface("eth1", "queues = [0]\ncores = [1]")
    ));
    assert_eq!(c.gateway.interfaces[1].cores, Some(vec![1]));
}

#[test]
fn role_must_be_known() {
    refused(
        &format!("{IFACE}role = \"server\"\n"),
        "gateway.interfaces[0].role: \"server\" is not one of client, backend, both",
    );
}

// ---- services ------------------------------------------------------------------------

#[test]
fn service_name_rules() {
    let named = |name: &str| {
        format!("{IFACE}\n[[services]]\nname = {name:?}\nvip = \"203.0.113.10\"\nport = 80\n")
    };
    refused(
        &format!("{IFACE}\n[[services]]\nvip = \"203.0.113.10\"\nport = 80\n"),
        "services[0].name: is required",
    );
    refused(&named(""), "services[0].name: must not be empty");
    refused(
        &named("Web"),
        "services[0].name: \"Web\" may only contain a-z, 0-9, '-', '.', '/' and '_'",
    );
    refused(
        &named("web svc"),
        "services[0].name: \"web svc\" may only contain a-z, 0-9, '-', '.', '/' and '_'",
    );
    accepted(&named("kube-system/dns_1.v2"));
}

#[test]
fn service_names_unique() {
    let text = format!(
        "{}\n[[services]]\nname = \"web\"\nvip = \"203.0.113.10\"\nport = 443\n",
        service("")
    );
    refused(
        &text,
        "services[1].name: \"web\" is already used by services[0]",
    );
}

#[test]
fn frontends_unique() {
    let text = format!(
        "{}\n[[services]]\nname = \"web2\"\nvip = \"203.0.113.10\"\nport = 80\n",
        service("")
    );
    refused(
        &text,
        "services[1]: 203.0.113.10:80/tcp is already served by services[0] (\"web\")",
    );
    // same address and port, other protocol: a different frontend
    accepted(&format!(
        "{}\n[[services]]\nname = \"web-udp\"\nvip = \"203.0.113.10\"\nport = 80\nprotocol = \"udp\"\n",
        service("")
    ));
}

#[test]
fn vip_rules() {
    refused(
        &format!("{IFACE}\n[[services]]\nname = \"web\"\nport = 80\n"),
        "services[0].vip: is required",
    );
    let vip = |v: &str| format!("{IFACE}\n[[services]]\nname = \"web\"\nvip = {v:?}\nport = 80\n");
    refused(
        &vip("203.0.113"),
        "services[0].vip: \"203.0.113\" is not an IP address",
    );
    refused(
        &vip("0.0.0.0"),
        "services[0].vip: 0.0.0.0 is the unspecified address",
    );
    refused(
        &vip("255.255.255.255"),
        "services[0].vip: 255.255.255.255 is the broadcast address",
    );
    refused(
        &vip("ff02::1"),
        "services[0].vip: ff02::1 is a multicast address",
    );
}

#[test]
fn addresses_packets_cannot_carry_are_refused() {
    for (vip, why) in [
        ("127.0.0.1", "127.0.0.1 is a loopback address"),
        ("::1", "::1 is a loopback address"),
        ("169.254.1.1", "169.254.1.1 is a link-local address"),
        ("fe80::1", "fe80::1 is a link-local address"),
        (
            "::ffff:203.0.113.10",
            "::ffff:203.0.113.10 is an IPv4-mapped IPv6 address: write the IPv4 address, 203.0.113.10",
        ),
    ] {
        let text = format!(
            "{IFACE}\n[[services]]\nname = \"web\"\nvip = \"{vip}\"\nport = 80\n"
        );
        refused(&text, &format!("services[0].vip: {why}"));
    }
    refused(
        &backend("", "address = \"127.0.0.1\"\nmac = \"02:00:00:00:00:01\""),
        "services[0].backends[0].address: 127.0.0.1 is a loopback address",
    );
}

#[test]
fn service_port_rules() {
    let port =
        |p: &str| format!("{IFACE}\n[[services]]\nname = \"web\"\nvip = \"203.0.113.10\"\n{p}\n");
    refused(&port(""), "services[0].port: is required");
    refused(
        &port("port = 0"),
        "services[0].port: 0 is not a port number",
    );
    refused(
        &port("port = 70000"),
        "services[0].port: 70000 is not a port number",
    );
    refused(
        &port("port = -80"),
        "services[0].port: -80 is not a port number",
    );
    accepted(&port("port = 65535"));
}

#[test]
fn protocol_must_be_known() {
    refused(
        &service("protocol = \"icmp\""),
        "services[0].protocol: \"icmp\" is not one of tcp, udp, sctp",
    );
    refused(
        &service("protocol = \"SCTP\""),
        "services[0].protocol: \"SCTP\" is not one of tcp, udp, sctp",
    );
    assert_eq!(
        accepted(&service("protocol = \"sctp\"")).services[0].protocol,
        Protocol::Sctp
    );
}

#[test]
fn mode_must_be_known() {
    refused(
        &service("mode = \"dsr-foo\""),
        "services[0].mode: \"dsr-foo\" is not one of dsr-l2, dsr-ipip, dsr-gue, nat",
    );
}

#[test]
fn maglev_table_size_rules() {
    refused(
        &service("maglev_table_size = 65536"),
        "services[0].maglev_table_size: 65536 is not a prime number (Maglev needs a prime table size, such as 65537 or 655373)",
    );
    refused(
        &service("maglev_table_size = 5"),
        "services[0].maglev_table_size: 5 is outside 7..=1310719",
    );
    refused(
        &service("maglev_table_size = 1310720"),
        "services[0].maglev_table_size: 1310720 is outside 7..=1310719",
    );
    accepted(&service("maglev_table_size = 7"));
    accepted(&service("maglev_table_size = 655373"));

    let mut text = service("maglev_table_size = 7");
    for i in 0..8 {
        text.push_str(&format!(
            "\n[[services.backends]]\naddress = \"198.51.100.{}\"\n",
            10 + i
        ));
    }
    refused(
        &text,
        "services[0].maglev_table_size: 7 is smaller than the number of backends (8)",
    );
}

#[test]
fn source_range_rules() {
    refused(
        &service("source_ranges = [\"198.51.100.0/24\", \"x\"]"),
        "services[0].source_ranges[1]: \"x\" is not a CIDR like \"198.51.100.0/24\"",
    );
    refused(
        &service("source_ranges = [\"198.51.100.0/33\"]"),
        "services[0].source_ranges[0]: \"198.51.100.0/33\" is not a CIDR like \"198.51.100.0/24\"",
    );
    refused(
        &service("source_ranges = [\"198.51.100.0/24\", \"2001:db8::/32\"]"),
        "services[0].source_ranges[1]: 2001:db8::/32 is IPv6 but the vip 203.0.113.10 is IPv4",
    );
    let c = accepted(&service("source_ranges = []"));
    assert!(c.services[0].source_ranges.is_empty());
}

#[test]
fn session_affinity_range() {
    refused(
        &service("[services.session_affinity]\ntimeout = \"0s\""),
        "services[0].session_affinity.timeout: 0s is shorter than 1s",
    );
    refused(
        &service("[services.session_affinity]\ntimeout = \"2days\""),
        "services[0].session_affinity.timeout: 2days is longer than 1day",
    );
}

#[test]
fn udp_and_dns_health_checks_are_read() {
    let udp = |fields: &str| {
        service(&format!(
            "protocol = \"udp\"\n[services.health_check]\n{fields}"
        ))
    };
    let c = accepted(&udp("kind = \"udp\"\npayload = \"ping\"\nexpect = \"po\""));
    assert_eq!(
        c.services[0].health_check.as_ref().unwrap().kind,
        HealthKind::Udp {
            payload: b"ping".to_vec(),
            expect: Some(b"po".to_vec())
        }
    );
    let c = accepted(&udp("kind = \"dns\"\nquery = \"health.example.org.\""));
    assert_eq!(
        c.services[0].health_check.as_ref().unwrap().kind,
        HealthKind::Dns {
            query: "health.example.org".into(),
            qtype: DnsType::A
        }
    );
    let c = accepted(&udp(
        "kind = \"dns\"\nquery = \"_dns._udp.example.org\"\nqtype = \"SRV\"",
    ));
    assert_eq!(
        c.services[0].health_check.as_ref().unwrap().kind,
        HealthKind::Dns {
            query: "_dns._udp.example.org".into(),
            qtype: DnsType::Srv
        }
    );
    // The written form reads back the same.
    let again = accepted(&strait_config::to_toml(&c));
    assert_eq!(again.services[0].health_check, c.services[0].health_check);
}

#[test]
fn udp_and_dns_health_check_rules() {
    let on = |protocol: &str, fields: &str| {
        service(&format!(
            "protocol = \"{protocol}\"\n[services.health_check]\n{fields}"
        ))
    };
    let udp = |fields: &str| on("udp", fields);
    refused(
        &on("tcp", "kind = \"udp\"\npayload = \"ping\""),
        "services[0].health_check.kind: \"udp\" needs a UDP service (protocol = \"udp\"); this one is tcp",
    );
    refused(
        &service("[services.health_check]\nkind = \"dns\"\nquery = \"a.example.org\""),
        "services[0].health_check.kind: \"dns\" needs a UDP service (protocol = \"udp\"); this one is tcp",
    );
    refused(
        &udp("kind = \"udp\""),
        "services[0].health_check.payload: is required for a udp health check (the datagram sent)",
    );
    refused(
        &udp("kind = \"udp\"\npayload = \"\""),
        "services[0].health_check.payload: must not be empty",
    );
    refused(
        &udp(&format!(
            "kind = \"udp\"\npayload = \"{}\"",
            "x".repeat(1473)
        )),
        "services[0].health_check.payload: 1473 bytes is longer than 1472 (one datagram)",
    );
    refused(
        &udp("kind = \"udp\"\npayload = \"a\"\nexpect = \"\""),
        "services[0].health_check.expect: must not be empty",
    );
    refused(
        &udp("kind = \"tcp\"\npayload = \"a\""),
        "services[0].health_check.payload: only udp health checks have a payload",
    );
    refused(
        &udp("kind = \"udp\"\npayload = \"a\"\nquery = \"example.org\""),
        "services[0].health_check.query: only dns health checks have a query",
    );
    refused(
        &udp("kind = \"udp\"\npayload = \"a\"\nqtype = \"A\""),
        "services[0].health_check.qtype: only dns health checks have a qtype",
    );
    refused(
        &udp("kind = \"dns\""),
        "services[0].health_check.query: is required for a dns health check (the name asked for, e.g. \"health.example.org\")",
    );
    refused(
        &udp("kind = \"dns\"\nquery = \"a..example.org\""),
        "services[0].health_check.query: \"a..example.org\" is not a DNS name: it has an empty label",
    );
    refused(
        &udp("kind = \"dns\"\nquery = \"a b.org\""),
        "services[0].health_check.query: \"a b.org\" is not a DNS name: a label holds a character other than a-z, 0-9, '-' and '_'",
    );
    refused(
        &udp(&format!("kind = \"dns\"\nquery = \"{}.org\"", "a".repeat(64))),
        "services[0].health_check.query: \"{}.org\" is not a DNS name: a label is longer than 63 characters"
            .replace("{}", &"a".repeat(64))
            .as_str(),
    );
    refused(
        &udp("kind = \"dns\"\nquery = \"example.org\"\nqtype = \"ANY\""),
        "services[0].health_check.qtype: \"ANY\" is not one of A, AAAA, CNAME, MX, NS, PTR, SOA, SRV, TXT",
    );
}

#[test]
fn route_attributes_are_read_and_refused_by_path() {
    let c = accepted(&service(
        "bgp_communities = [\"64512:200\", \"64512:100\", \"64512:100\"]\nbgp_large_communities = [\"4200000000:1:2\"]\nbgp_local_pref = 300",
    ));
    assert_eq!(
        c.services[0].route,
        RouteAttrs {
            communities: vec![(64512, 100), (64512, 200)],
            large_communities: vec![(4_200_000_000, 1, 2)],
            local_pref: Some(300),
        }
    );
    let again = accepted(&strait_config::to_toml(&c));
    assert_eq!(again.services[0].route, c.services[0].route);
    assert!(accepted(&service("")).services[0].route.is_empty());
    refused(
        &service("bgp_communities = [\"64512:100\", \"70000:1\"]"),
        "services[0].bgp_communities[1]: \"70000:1\" is not a community like \"64512:100\" (two numbers of 0..=65535)",
    );
    refused(
        &service("bgp_large_communities = [\"1:2\"]"),
        "services[0].bgp_large_communities[0]: \"1:2\" is not a large community like \"64512:1:2\" (three numbers of 0..=4294967295)",
    );
    refused(
        &service("bgp_large_communities = [\"1:2:3:4\"]"),
        "services[0].bgp_large_communities[0]: \"1:2:3:4\" is not a large community like \"64512:1:2\" (three numbers of 0..=4294967295)",
    );
    refused(
        &service("bgp_local_pref = -1"),
        "services[0].bgp_local_pref: -1 is outside 0..=4294967295",
    );
}

#[test]
fn health_check_rules() {
    let hc = |fields: &str| service(&format!("[services.health_check]\n{fields}"));
    refused(
        &hc("interval = \"1s\""),
        "services[0].health_check.kind: is required (one of tcp, http, udp, dns)",
    );
    refused(
        &hc("kind = \"icmp\""),
        "services[0].health_check.kind: \"icmp\" is not one of tcp, http, udp, dns",
    );
    refused(
        &hc("kind = \"tcp\"\npath = \"/healthz\""),
        "services[0].health_check.path: only http health checks have a path",
    );
    refused(
        &hc("kind = \"http\"\npath = \"healthz\""),
        "services[0].health_check.path: \"healthz\" must start with '/'",
    );
    refused(
        &hc("kind = \"http\"\npath = \"/a b\""),
        "services[0].health_check.path: \"/a b\" contains whitespace or control characters",
    );
    refused(
        &hc("kind = \"tcp\"\nport = 0"),
        "services[0].health_check.port: 0 is not a port number",
    );
    refused(
        &hc("kind = \"tcp\"\ninterval = \"5ms\"\ntimeout = \"1ms\""),
        "services[0].health_check.interval: 5ms is shorter than 10ms",
    );
    refused(
        &hc("kind = \"tcp\"\ninterval = \"580000000000y\"\ntimeout = \"1s\""),
        "services[0].health_check.interval: 580000000000years is longer than 1h",
    );
    refused(
        &hc("kind = \"tcp\"\ninterval = \"1s\"\ntimeout = \"1s\""),
        "services[0].health_check.timeout: 1s is not shorter than the interval (1s)",
    );
    refused(
        &hc("kind = \"tcp\"\ntimeout = \"2s\""),
        "services[0].health_check.timeout: 2s is not shorter than the interval (1s)",
    );
    refused(
        &hc("kind = \"tcp\"\ntimeout = \"0s\""),
        "services[0].health_check.timeout: 0s must be more than zero",
    );
    refused(
        &hc("kind = \"tcp\"\nrise = 0"),
        "services[0].health_check.rise: 0 is outside 1..=100",
    );
    refused(
        &hc("kind = \"tcp\"\nfall = 101"),
        "services[0].health_check.fall: 101 is outside 1..=100",
    );
    accepted(&hc(
        "kind = \"tcp\"\ninterval = \"10ms\"\ntimeout = \"9ms\"",
    ));
}

// ---- backends ------------------------------------------------------------------------

#[test]
fn a_service_may_have_no_backends() {
    let c = accepted(&service(""));
    assert!(c.services[0].backends.is_empty());
}

#[test]
fn backend_address_rules() {
    refused(
        &backend("", "port = 80"),
        "services[0].backends[0].address: is required",
    );
    refused(
        &backend("", "address = \"backend-1\""),
        "services[0].backends[0].address: \"backend-1\" is not an IP address",
    );
    refused(
        &backend("", "address = \"0.0.0.0\""),
        "services[0].backends[0].address: 0.0.0.0 is the unspecified address",
    );
}

#[test]
fn a_service_has_at_most_65535_backends() {
    let mut text = service("maglev_table_size = 131071");
    for i in 0..=65_535u32 {
        let (a, b) = (i / 256, i % 256);
        text += &format!("[[services.backends]]\naddress = \"2001:db8::{a:x}:{b:x}\"\n");
    }
    let text = text.replace("203.0.113.10", "2001:db8::10");
    refused(
        &text,
        "services[0].backends: 65536 backends; a service has at most 65535 (a Maglev slot names its backend in 16 bits)",
    );
}

#[test]
fn a_backend_mac_is_a_station() {
    for (mac, why) in [
        (
            "ff:ff:ff:ff:ff:ff",
            "is a group (multicast or broadcast) address, not a station's",
        ),
        (
            "01:00:5e:00:00:01",
            "is a group (multicast or broadcast) address, not a station's",
        ),
        ("00:00:00:00:00:00", "is the all-zero address"),
    ] {
        refused(
            &backend("", &format!("address = \"198.51.100.11\"\nmac = \"{mac}\"")),
            &format!("services[0].backends[0].mac: {mac} {why}"),
        );
    }
}

#[test]
fn backend_port_range() {
    refused(
        &backend(
            "mode = \"nat\"",
            "address = \"198.51.100.11\"\nport = 70000",
        ),
        "services[0].backends[0].port: 70000 is not a port number",
    );
    refused(
        &backend("mode = \"nat\"", "address = \"198.51.100.11\"\nport = 0"),
        "services[0].backends[0].port: 0 is not a port number",
    );
}

#[test]
fn dsr_cannot_change_ports() {
    for mode in ["dsr-l2", "dsr-ipip", "dsr-gue"] {
        refused(
            &backend(
                &format!("mode = \"{mode}\""),
                "address = \"198.51.100.11\"\nport = 8080",
            ),
            &format!(
                "services[0].backends[0].port: 8080 differs from the service port 80; {mode} cannot change ports"
            ),
        );
    }
    accepted(&backend(
        "mode = \"nat\"",
        "address = \"198.51.100.11\"\nport = 8080",
    ));
}

#[test]
fn weight_range() {
    refused(
        &backend("", "address = \"198.51.100.11\"\nweight = 65536"),
        "services[0].backends[0].weight: 65536 is outside 0..=65535",
    );
    refused(
        &backend("", "address = \"198.51.100.11\"\nweight = -1"),
        "services[0].backends[0].weight: -1 is outside 0..=65535",
    );
    let c = accepted(&backend("", "address = \"198.51.100.11\"\nweight = 0"));
    assert_eq!(c.services[0].backends[0].weight, 0);
}

#[test]
fn mac_must_parse() {
    refused(
        &backend("", "address = \"198.51.100.11\"\nmac = \"02:00:00:00:00\""),
        "services[0].backends[0].mac: \"02:00:00:00:00\" is not a MAC address (like 02:00:00:00:00:11)",
    );
}

#[test]
fn tunnel_only_for_encapsulating_modes() {
    for mode in ["dsr-l2", "nat"] {
        refused(
            &backend(
                &format!("mode = \"{mode}\""),
                "address = \"198.51.100.11\"\ntunnel = \"198.51.100.99\"",
            ),
            &format!(
                "services[0].backends[0].tunnel: only dsr-ipip and dsr-gue backends have a tunnel target; this service is {mode}"
            ),
        );
    }
    for mode in ["dsr-ipip", "dsr-gue"] {
        accepted(&backend(
            &format!("mode = \"{mode}\""),
            "address = \"198.51.100.11\"\ntunnel = \"198.51.100.99\"",
        ));
    }
}

#[test]
fn tunnel_must_parse() {
    refused(
        &backend(
            "mode = \"dsr-ipip\"",
            "address = \"198.51.100.11\"\ntunnel = \"node-1\"",
        ),
        "services[0].backends[0].tunnel: \"node-1\" is not an IP address",
    );
}

fn v6_service(mode: &str, backend_fields: &str) -> String {
    format!(
        "{IFACE}\n[[services]]\nname = \"web6\"\nvip = \"2001:db8::10\"\nport = 80\nmode = \"{mode}\"\n\n[[services.backends]]\n{backend_fields}\n"
    )
}

#[test]
fn ipv6_in_ipv4_is_refused() {
    refused(
        &v6_service(
            "dsr-ipip",
            "address = \"2001:db8::11\"\ntunnel = \"198.51.100.11\"",
        ),
        "services[0].backends[0].tunnel: 198.51.100.11 is IPv4 but the vip 2001:db8::10 is IPv6: IPv6 in IPv4 is not supported",
    );
    refused(
        &v6_service("dsr-gue", "address = \"198.51.100.11\""),
        "services[0].backends[0].address: 198.51.100.11 is IPv4 but the vip 2001:db8::10 is IPv6: IPv6 in IPv4 is not supported",
    );
    accepted(&v6_service(
        "dsr-ipip",
        "address = \"2001:db8::11\"\ntunnel = \"2001:db8::99\"",
    ));
}

#[test]
fn ipv4_in_ipv6_is_fine() {
    let c = accepted(&backend(
        "mode = \"dsr-ipip\"",
        "address = \"198.51.100.11\"\ntunnel = \"2001:db8::11\"",
    ));
    assert!(c.services[0].backends[0].tunnel_target().is_ipv6());
    accepted(&backend("mode = \"dsr-gue\"", "address = \"2001:db8::11\""));
}

#[test]
fn l2_and_nat_keep_the_family() {
    for mode in ["dsr-l2", "nat"] {
        refused(
            &backend(&format!("mode = \"{mode}\""), "address = \"2001:db8::11\""),
            &format!(
                "services[0].backends[0].address: 2001:db8::11 is IPv6 but the vip 203.0.113.10 is IPv4; {mode} cannot change the address family"
            ),
        );
        refused(
            &v6_service(mode, "address = \"198.51.100.11\""),
            &format!(
                "services[0].backends[0].address: 198.51.100.11 is IPv4 but the vip 2001:db8::10 is IPv6; {mode} cannot change the address family"
            ),
        );
    }
}

#[test]
fn backend_state_must_be_known() {
    refused(
        &backend("", "address = \"198.51.100.11\"\nstate = \"up\""),
        "services[0].backends[0].state: \"up\" is not one of active, draining",
    );
}

#[test]
fn backends_unique_by_address_and_port() {
    let text = format!(
        "{}\n[[services.backends]]\naddress = \"198.51.100.11\"\nport = 80\n",
        backend("", "address = \"198.51.100.11\"")
    );
    refused(
        &text,
        "services[0].backends[1]: 198.51.100.11:80 is already listed at services[0].backends[0]",
    );
    // same address, other port (nat): distinct backends
    let text = format!(
        "{}\n[[services.backends]]\naddress = \"198.51.100.11\"\nport = 8081\n",
        backend("mode = \"nat\"", "address = \"198.51.100.11\"\nport = 8080")
    );
    assert_eq!(accepted(&text).services[0].backends.len(), 2);
}

// ---- many problems at once, no cascades ----------------------------------------------

#[test]
fn three_errors_three_problems() {
    let text = r#"
[gateway]
mtu = 100

[[gateway.interfaces]]
name = "eth0"
queues = [0]

[[services]]
name = "web"
vip = "203.0.113.10"
port = 80

[[services.backends]]
address = "198.51.100.11"

[[services.backends]]
address = "198.51.100.12"
port = 70000
mac = "nope"
"#;
    assert_eq!(
        problems(text),
        [
            "gateway.mtu: 100 is outside 576..=9000",
            "services[0].backends[1].port: 70000 is not a port number",
            "services[0].backends[1].mac: \"nope\" is not a MAC address (like 02:00:00:00:00:11)",
        ]
    );
}

#[test]
fn problems_across_every_section_in_one_go() {
    let text = r#"
[gateway]
admin_listen = "nowhere"
gue_port = 0

[gateway.timeouts]
udp = "0s"

[[gateway.interfaces]]
name = "eth0"
queues = []

[[services]]
name = "Web"
vip = "203.0.113.10"
port = 80
mode = "dsr-foo"

[services.health_check]
kind = "tcp"
rise = 0

[[services]]
name = "dns"
vip = "203.0.113.999"
port = 53
protocol = "udp"
"#;
    let p = problems(text);
    let paths: Vec<&str> = p.iter().map(|p| p.split(": ").next().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "gateway.admin_listen",
            "gateway.gue_port",
            "gateway.timeouts.udp",
            "gateway.interfaces[0].queues",
            "services[0].name",
            "services[0].mode",
            "services[0].health_check.rise",
            "services[1].vip",
        ],
        "{p:#?}"
    );
}

#[test]
fn a_bad_value_is_reported_once_not_cascaded() {
    // An unknown default_mode is one problem; the service using it does not add more
    // (its DSR port rule cannot be judged without a mode).
    let text = format!(
        "[gateway]\ndefault_mode = \"fast\"\n\n{}",
        backend("", "address = \"198.51.100.11\"\nport = 8080")
    );
    refused(
        &text,
        "gateway.default_mode: \"fast\" is not one of dsr-l2, dsr-ipip, dsr-gue, nat",
    );
    // A bad vip is one problem, not also a family mismatch per backend.
    refused(
        &backend("", "address = \"2001:db8::11\"").replace("203.0.113.10", "bad"),
        "services[0].vip: \"bad\" is not an IP address",
    );
}

// ---- unknown fields and types ----------------------------------------------------------

#[test]
fn unknown_service_field_is_refused_by_name() {
    let p = problems(&service("colour = 1"));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("services[0].colour: unknown field `colour`, expected one of"),
        "{p:?}"
    );
    assert!(p[0].ends_with("(line 9, column 1)"), "{p:?}");
}

#[test]
fn unknown_fields_everywhere_are_refused() {
    for (text, path) in [
        (format!("verbose = true\n{IFACE}"), "verbose"),
        (gateway("workers = 4"), "gateway.workers"),
        (
            gateway("[gateway.timeouts]\nicmp = \"1s\""),
            "gateway.timeouts.icmp",
        ),
        (format!("{IFACE}numa = 0\n"), "gateway.interfaces[0].numa"),
        (gateway("[gateway.dpdk]\nhuge = false"), "gateway.dpdk.huge"),
        (
            service("[services.session_affinity]\nkind = \"ClientIP\""),
            "services[0].session_affinity.kind",
        ),
        (
            service("[services.health_check]\nkind = \"tcp\"\nretries = 3"),
            "services[0].health_check.retries",
        ),
        (
            backend("", "address = \"198.51.100.11\"\nzone = \"a\""),
            "services[0].backends[0].zone",
        ),
    ] {
        let p = problems(&text);
        let key = path.rsplit('.').next().unwrap();
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with(&format!("{path}: unknown field `{key}`")),
            "{p:?}"
        );
    }
}

#[test]
fn type_errors_name_the_field() {
    let p = problems(&service("maglev_table_size = \"big\""));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with(
            "services[0].maglev_table_size: invalid type: string \"big\", expected i64"
        ),
        "{p:?}"
    );
    let p = problems(&backend("", "address = \"198.51.100.11\"\nweight = 1.5"));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("services[0].backends[0].weight: invalid type: floating point `1.5`"),
        "{p:?}"
    );
}

#[test]
fn service_fields_are_public_model() {
    // The model is plain data other crates can build directly.
    let s = Service {
        name: "x".into(),
        vip: "203.0.113.1".parse().unwrap(),
        port: 1,
        protocol: Protocol::Udp,
        mode: Mode::Nat,
        maglev_table_size: Service::DEFAULT_MAGLEV_TABLE_SIZE,
        source_ranges: vec![],
        session_affinity: None,
        health_check: None,
        passive_health: None,
        route: Default::default(),
        slow_start: None,
        backends: vec![],
    };
    assert_eq!(s.frontend().to_string(), "203.0.113.1:1");
    assert_eq!(Gateway::DEFAULT_GUE_PORT, 6080);
}

// ---- [gateway.bgp] ---------------------------------------------------------------------

/// A `[gateway.bgp]` section with `fields` and one peer with `peer` fields.
fn bgp(fields: &str, peer: &str) -> String {
    format!("{IFACE}\n[gateway.bgp]\n{fields}\n\n[[gateway.bgp.peers]]\n{peer}\n")
}

const BGP_OK: &str = "asn = 64512\nrouter_id = \"192.0.2.1\"";
const PEER_OK: &str = "address = \"198.51.100.1\"\nasn = 64500";

#[test]
fn bgp_gets_its_defaults() {
    let c = accepted(&bgp(BGP_OK, PEER_OK));
    let b = c.gateway.bgp.expect("bgp");
    assert_eq!(b.asn, 64512);
    assert_eq!(
        b.router_id,
        "192.0.2.1".parse::<std::net::Ipv4Addr>().unwrap()
    );
    assert!(b.announce.is_empty() && b.communities.is_empty());
    assert_eq!(b.daemon, std::path::Path::new("/usr/sbin/bird"));
    let p = &b.peers[0];
    assert_eq!((p.port, p.bfd, p.password.as_deref()), (179, false, None));
    assert_eq!(p.hold_time, Duration::from_secs(9));
    assert_eq!(c.gateway.drain_grace, Duration::from_secs(5));
    // Without BGP no router is told to move away: no grace unless asked for.
    let plain = accepted(IFACE).gateway;
    assert!(plain.bgp.is_none());
    assert_eq!(plain.drain_grace, Duration::ZERO);
    assert_eq!(
        accepted(&gateway("drain_grace = \"2s\""))
            .gateway
            .drain_grace,
        Duration::from_secs(2)
    );
}

#[test]
fn bgp_takes_every_field() {
    let c = accepted(&bgp(
        "asn = 4200000000\nrouter_id = \"192.0.2.7\"\ncommunities = [\"64512:100\", \"0:65535\"]\nannounce = [\"203.0.113.0/24\", \"2001:db8::/32\"]\ndaemon = \"/opt/bird/sbin/bird\"",
        "address = \"2001:db8::1\"\nasn = 65001\nport = 1179\npassword = \"s3cret pass\"\nbfd = true\nhold_time = \"3s\"",
    ));
    let b = c.gateway.bgp.clone().expect("bgp");
    assert_eq!(b.communities, [(64512, 100), (0, 65535)]);
    assert!(b.announces("203.0.113.9".parse().unwrap()));
    assert!(!b.announces("198.51.100.9".parse().unwrap()));
    let p = &b.peers[0];
    assert_eq!(
        (p.port, p.bfd, p.password.as_deref()),
        (1179, true, Some("s3cret pass"))
    );
    assert_eq!(p.hold_time, Duration::from_secs(3));
    // Round trip through the file form.
    let again = accepted(&strait_config::to_toml(&c));
    assert_eq!(again, c);
}

#[test]
fn bgp_section_is_refused_with_its_field() {
    refused(
        &bgp("router_id = \"192.0.2.1\"", PEER_OK),
        "gateway.bgp.asn: is required",
    );
    refused(
        &bgp("asn = 0\nrouter_id = \"192.0.2.1\"", PEER_OK),
        "gateway.bgp.asn: 0 is outside 1..=4294967294",
    );
    refused(
        &bgp("asn = 23456\nrouter_id = \"192.0.2.1\"", PEER_OK),
        "gateway.bgp.asn: 23456 is AS_TRANS (RFC 6793), reserved, not an AS number",
    );
    refused(
        &bgp("asn = 64512\nrouter_id = \"2001:db8::1\"", PEER_OK),
        "gateway.bgp.router_id: \"2001:db8::1\" is not a router id (written as an IPv4 address, e.g. \"192.0.2.1\")",
    );
    refused(
        &bgp(&format!("{BGP_OK}\ncommunities = [\"64512\"]"), PEER_OK),
        "gateway.bgp.communities[0]: \"64512\" is not a community like \"64512:100\" (two numbers of 0..=65535)",
    );
    refused(
        &bgp(
            &format!("{BGP_OK}\nannounce = [\"203.0.113.0/33\"]"),
            PEER_OK,
        ),
        "gateway.bgp.announce[0]: \"203.0.113.0/33\" is not a prefix like \"203.0.113.0/24\"",
    );
    refused(
        &bgp(
            BGP_OK,
            "address = \"198.51.100.1\"\nasn = 64500\nhold_time = \"2s\"",
        ),
        "gateway.bgp.peers[0].hold_time: 2s is shorter than 3s",
    );
    refused(
        &bgp(
            BGP_OK,
            "address = \"198.51.100.1\"\nasn = 64500\nhold_time = \"3500ms\"",
        ),
        "gateway.bgp.peers[0].hold_time: 3s 500ms is not a whole number of seconds",
    );
    refused(
        &bgp(BGP_OK, "address = \"198.51.100.1\"\nasn = 64500\npassword = \"a\\\"b\""),
        "gateway.bgp.peers[0].password: may hold printable ASCII and spaces only, without '\"' or '\\'",
    );
    refused(
        &bgp(BGP_OK, "address = \"fe80::1\"\nasn = 64500"),
        "gateway.bgp.peers[0].address: fe80::1 is link-local; give the peer's global address (a link-local session needs an interface, which Strait does not configure)",
    );
    refused(
        &bgp(BGP_OK, "address = \"198.51.100.1\"\nasn = 64500\ncolour = 1"),
        "gateway.bgp.peers[0].colour: unknown field `colour`, expected one of `address`, `asn`, `port`, `password`, `bfd`, `hold_time` (line 12, column 1)",
    );
    refused(
        &format!("{IFACE}\n[gateway.bgp]\n{BGP_OK}\n"),
        "gateway.bgp.peers: at least one peer is required ([[gateway.bgp.peers]])",
    );
    refused(
        &format!(
            "{}\n[[gateway.bgp.peers]]\n{PEER_OK}\n",
            bgp(BGP_OK, PEER_OK)
        ),
        "gateway.bgp.peers[1].address: 198.51.100.1 is already the peer gateway.bgp.peers[0]",
    );
    refused(
        &gateway("drain_grace = \"11m\""),
        "gateway.drain_grace: 11m is longer than 10m",
    );
}

// ---- [gateway.l2] ------------------------------------------------------------------------

fn l2(fields: &str) -> String {
    format!("{IFACE}\n[gateway.l2]\n{fields}\n")
}

#[test]
fn l2_gets_its_defaults_and_refuses_with_the_field() {
    let c = accepted(&l2("name = \"gw1\"\nmembers = [\"gw1\", \"gw2\"]"));
    let l = c.gateway.l2.clone().expect("l2");
    assert_eq!(l.advert_interval, Duration::from_millis(100));
    assert_eq!(l.daemon, std::path::Path::new("/usr/sbin/keepalived"));
    assert_eq!(c.gateway.drain_grace, Duration::from_secs(5));
    assert_eq!(accepted(&strait_config::to_toml(&c)), c);
    refused(
        &l2("name = \"gw3\"\nmembers = [\"gw1\", \"gw2\"]"),
        "gateway.l2.members: does not name this gateway (\"gw3\", gateway.l2.name)",
    );
    refused(
        &l2("name = \"gw1\"\nmembers = [\"gw1\", \"gw1\"]"),
        "gateway.l2.members[1]: \"gw1\" is named twice",
    );
    refused(
        &l2("name = \"g w\"\nmembers = [\"gw1\"]"),
        "gateway.l2.name: \"g w\" is not a gateway name (1 to 32 of A-Z a-z 0-9 . _ -)",
    );
    refused(
        &l2("name = \"gw1\"\nmembers = [\"gw1\"]\nadvert_interval = \"105ms\""),
        "gateway.l2.advert_interval: 105ms is not a whole number of centiseconds (VRRPv3's unit)",
    );
    refused(
        &l2("name = \"gw1\"\nmembers = [\"gw1\"]\nadvert_interval = \"1m\""),
        "gateway.l2.advert_interval: 1m is longer than 40s 950ms",
    );
    refused(
        &format!(
            "{}\n[gateway.bgp]\nasn = 64512\nrouter_id = \"192.0.2.1\"\n[[gateway.bgp.peers]]\naddress = \"198.51.100.1\"\nasn = 64500\n",
            l2("name = \"gw1\"\nmembers = [\"gw1\"]")
        ),
        "gateway.l2: [gateway.bgp] is configured too: with routes, routers move traffic between gateways; VRRP is for segments without them (choose one)",
    );
}

#[test]
fn admin_socket_and_token_file_are_absolute_paths() {
    let c = accepted(&gateway(
        "admin_socket = \"/run/strait/admin.sock\"\nadmin_token_file = \"/etc/strait/admin.token\"",
    ));
    assert_eq!(
        c.gateway.admin_socket.as_deref(),
        Some(std::path::Path::new("/run/strait/admin.sock"))
    );
    assert_eq!(accepted(&strait_config::to_toml(&c)), c);
    refused(
        &gateway("admin_token_file = \"admin.token\""),
        "gateway.admin_token_file: \"admin.token\" is not an absolute path",
    );
}

#[test]
fn the_admin_socket_path_fits_a_unix_socket() {
    let long = format!("/run/{}", "s".repeat(103));
    assert_eq!(long.len(), 108);
    refused(
        &gateway(&format!("admin_socket = \"{long}\"")),
        &format!(
            "gateway.admin_socket: {long} is 108 bytes long; a Unix socket's path has at most 107"
        ),
    );
    let fits = &long[..107];
    let c = accepted(&gateway(&format!("admin_socket = \"{fits}\"")));
    assert_eq!(c.gateway.admin_socket.unwrap().as_os_str().len(), 107);
}

// ---- [gateway.sync] ------------------------------------------------------------------

fn sync(fields: &str) -> String {
    format!("{IFACE}\n[gateway.sync]\n{fields}\n")
}

#[test]
fn sync_is_read() {
    let c = accepted(&sync(
        "listen = \"192.0.2.1:7946\"\npeers = [\"192.0.2.2:7946\", \"192.0.2.3:7000\"]",
    ));
    let s = c.gateway.sync.clone().expect("sync configured");
    assert_eq!(s.listen, "192.0.2.1:7946".parse().unwrap());
    assert_eq!(
        s.peers,
        [
            "192.0.2.2:7946".parse().unwrap(),
            "192.0.2.3:7000".parse().unwrap()
        ]
    );
    assert!(accepted(IFACE).gateway.sync.is_none(), "off by default");
    let summary = strait_config::summary(&c);
    assert!(
        summary.contains("flow sync: listen 192.0.2.1:7946, peers 192.0.2.2:7946, 192.0.2.3:7000"),
        "{summary}"
    );
}

#[test]
fn sync_rules() {
    refused(
        &sync("peers = [\"192.0.2.2:7946\"]"),
        "gateway.sync.listen: is required",
    );
    refused(
        &sync("listen = \"192.0.2.1:7946\""),
        "gateway.sync.peers: is required",
    );
    refused(
        &sync("listen = \"192.0.2.1\"\npeers = [\"192.0.2.2:7946\"]"),
        "gateway.sync.listen: \"192.0.2.1\" is not an address:port like \"192.0.2.1:7946\"",
    );
    refused(
        &sync("listen = \"192.0.2.1:0\"\npeers = [\"192.0.2.2:7946\"]"),
        "gateway.sync.listen: port 0 is not a port to exchange flows on",
    );
    refused(
        &sync("listen = \"192.0.2.1:7946\"\npeers = []"),
        "gateway.sync.peers: is empty; name at least one peer gateway's sync.listen",
    );
    refused(
        &sync("listen = \"192.0.2.1:7946\"\npeers = [\"192.0.2.2:7946\", \"192.0.2.2:7946\"]"),
        "gateway.sync.peers[1]: 192.0.2.2:7946 is listed twice",
    );
    refused(
        &sync("listen = \"192.0.2.1:7946\"\npeers = [\"192.0.2.1:7946\"]"),
        "gateway.sync.peers[0]: 192.0.2.1:7946 is this gateway's own sync.listen",
    );
    refused(
        &sync("listen = \"192.0.2.1:7946\"\npeers = [\"[2001:db8::2]:7946\"]"),
        "gateway.sync.peers[0]: [2001:db8::2]:7946 is not of sync.listen's address family (records go out from it)",
    );
    refused(
        &sync("listen = \"192.0.2.1:7946\"\npeers = [\"0.0.0.0:7946\"]"),
        "gateway.sync.peers[0]: 0.0.0.0 is not a peer's address",
    );
    refused(
        &sync("listen = \"192.0.2.1:7946\"\npeers = [\"224.0.0.1:7946\"]"),
        "gateway.sync.peers[0]: 224.0.0.1 is a multicast address",
    );
    let p = problems(&sync(
        "listen = \"192.0.2.1:7946\"\npeers = [\"192.0.2.2:7946\"]\nport = 3",
    ));
    assert!(
        p.len() == 1
            && p[0].starts_with(
                "gateway.sync.port: unknown field `port`, expected `listen` or `peers`"
            ),
        "{p:?}"
    );
}

#[test]
fn sync_addresses_are_ones_a_peer_can_name() {
    refused(
        &sync("listen = \"0.0.0.0:7946\"\npeers = [\"192.0.2.2:7946\"]"),
        "gateway.sync.listen: 0.0.0.0 is no address a peer can list; give this gateway's own",
    );
    refused(
        &sync("listen = \"192.0.2.1:7946\"\npeers = [\"255.255.255.255:7946\"]"),
        "gateway.sync.peers[0]: 255.255.255.255 is the broadcast address",
    );
}

const DPDK_IFACE: &str = "[[gateway.interfaces]]\nname = \"eth1\"\nqueues = [0]\ndriver = \"dpdk\"\ndevice = \"net_af_packet0,iface=dp1\"\n";

#[test]
fn a_dpdk_interface_and_its_eal_options_are_read() {
    let cfg = parse(&format!(
        "[gateway.dpdk]\nno_huge = true\nmemory_mb = 1024\nfile_prefix = \"gw-a\"\n\n{DPDK_IFACE}\
         [[gateway.interfaces]]\nname = \"eth2\"\nqueues = [0]\ndriver = \"dpdk\"\ndevice = \"0000:03:00.0\"\n"
    ))
    .expect("valid");
    let g = &cfg.gateway;
    assert_eq!(
        g.interfaces[0].driver,
        strait_config::model::Driver::Dpdk {
            device: "net_af_packet0,iface=dp1".into()
        }
    );
    assert_eq!(g.interfaces[1].driver.name(), "dpdk");
    let d = g.dpdk.as_ref().expect("[gateway.dpdk]");
    assert_eq!(
        (d.no_huge, d.memory_mb, d.file_prefix.as_deref()),
        (true, Some(1024), Some("gw-a"))
    );
    // Written back out, it reads the same.
    assert_eq!(
        parse(&strait_config::to_toml(&cfg)).expect("round trip"),
        cfg
    );
    // AF_XDP stays the default.
    let plain = parse(IFACE).expect("valid");
    assert_eq!(plain.gateway.interfaces[0].driver, Default::default());
    assert_eq!(plain.gateway.dpdk, None);
}

#[test]
fn bad_dpdk_settings_are_refused_with_their_field() {
    let cases = [
        (
            format!("{IFACE}driver = \"ice\"\n"),
            "gateway.interfaces[0].driver: \"ice\" is not a driver",
        ),
        (
            format!("{IFACE}driver = \"dpdk\"\n"),
            "gateway.interfaces[0].device: ",
        ),
        (
            format!("{IFACE}device = \"0000:03:00.0\"\n"),
            "gateway.interfaces[0].device: is only for driver = \"dpdk\"",
        ),
        (
            format!("{IFACE}driver = \"dpdk\"\ndevice = \"net_tap0 iface=x\"\n"),
            "gateway.interfaces[0].device: \"net_tap0 iface=x\" contains whitespace",
        ),
        (
            format!("{IFACE}driver = \"dpdk\"\ndevice = \"--no-pci\"\n"),
            "gateway.interfaces[0].device: \"--no-pci\" starts with '-'",
        ),
        (
            format!("{DPDK_IFACE}[[gateway.interfaces]]\nname = \"eth0\"\nqueues = [0]\n"),
            "gateway.interfaces[1].driver: \"af_xdp\" differs from gateway.interfaces[0]'s \"dpdk\"",
        ),
        (
            format!(
                "{DPDK_IFACE}[[gateway.interfaces]]\nname = \"eth2\"\nqueues = [0]\ndriver = \"dpdk\"\n\
                 device = \"net_af_packet0,iface=dp2\"\n"
            ),
            "gateway.interfaces[1].device: \"net_af_packet0\" is already the device of gateway.interfaces[0]",
        ),
        (
            gateway("[gateway.dpdk]\nno_huge = true"),
            "gateway.dpdk: no interface has driver = \"dpdk\"",
        ),
        (
            format!("[gateway.dpdk]\nmemory_mb = 8\n\n{DPDK_IFACE}"),
            "gateway.dpdk.memory_mb: ",
        ),
        (
            format!("[gateway.dpdk]\nfile_prefix = \"../x\"\n\n{DPDK_IFACE}"),
            "gateway.dpdk.file_prefix: \"../x\" is not a directory name",
        ),
    ];
    for (text, want) in cases {
        let p = problems(&text);
        assert_eq!(p.len(), 1, "{text}\n{p:?}");
        assert!(p[0].starts_with(want), "{text}\nwanted {want}\ngot {p:?}");
    }
}

#[test]
fn a_dpdk_port_s_mtu_fits_one_mbuf() {
    let text = |mtu: u16| format!("[gateway]\nmtu = {mtu}\n\n{DPDK_IFACE}");
    refused(
        &text(2031),
        "gateway.mtu: 2031 is above 2030, the most a DPDK port's frame holds (one mbuf of 2048 bytes, with the Ethernet header and a VLAN tag)",
    );
    accepted(&text(2030));
    // AF_XDP takes the interface's MTU, whatever gateway.mtu says.
    accepted(&gateway("mtu = 9000"));
}

// ---- passive health ------------------------------------------------------------------

const CHECK: &str = "[services.health_check]\nkind = \"tcp\"\n";

#[test]
fn passive_health_is_on_by_default_where_it_can_work() {
    let nat = accepted(&service(&format!("mode = \"nat\"\n{CHECK}")));
    assert_eq!(
        nat.services[0].passive_health,
        Some(strait_config::PassiveHealth {
            failures: 3,
            window: Duration::from_secs(1)
        })
    );
    // DSR (no answers seen), UDP (no connection), no active check (nothing brings a backend
    // back): off.
    let dsr = accepted(&service(CHECK));
    assert_eq!(dsr.services[0].passive_health, None);
    let udp = accepted(&service(&format!(
        "mode = \"nat\"\nprotocol = \"udp\"\n{CHECK}"
    )));
    assert_eq!(udp.services[0].passive_health, None);
    let unchecked = accepted(&service("mode = \"nat\""));
    assert_eq!(unchecked.services[0].passive_health, None);
}

#[test]
fn passive_health_is_read_and_can_be_turned_off() {
    let c = accepted(&service(&format!(
        "mode = \"nat\"\n{CHECK}\n[services.passive_health]\nfailures = 10\nwindow = \"250ms\"\n"
    )));
    assert_eq!(
        c.services[0].passive_health,
        Some(strait_config::PassiveHealth {
            failures: 10,
            window: Duration::from_millis(250)
        })
    );
    let off = accepted(&service(&format!(
        "mode = \"nat\"\n{CHECK}\n[services.passive_health]\nenabled = false\n"
    )));
    assert_eq!(off.services[0].passive_health, None);
    // Off is off anywhere, DSR included.
    let dsr = accepted(&service("[services.passive_health]\nenabled = false\n"));
    assert_eq!(dsr.services[0].passive_health, None);
    // And a round trip keeps it off.
    let again = accepted(&strait_config::to_toml(&off));
    assert_eq!(again.services[0].passive_health, None);
}

#[test]
fn passive_health_is_refused_where_it_cannot_work() {
    refused(
        &service(&format!("{CHECK}\n[services.passive_health]\nfailures = 3\n")),
        "services[0].passive_health: needs mode = \"nat\": in DSR modes the backends answer the clients directly and the gateway sees no answer (DSR backends have active checks only)",
    );
    refused(
        &service("mode = \"nat\"\n[services.passive_health]\n"),
        "services[0].passive_health: needs [services.health_check]: a backend taken out comes back when its active check passes",
    );
    refused(
        &service(&format!(
            "mode = \"nat\"\nprotocol = \"udp\"\n{CHECK}\n[services.passive_health]\n"
        )),
        "services[0].passive_health: needs protocol tcp or sctp: UDP has no connection to refuse",
    );
    refused(
        &service(&format!(
            "mode = \"nat\"\n{CHECK}\n[services.passive_health]\nfailures = 0\n"
        )),
        "services[0].passive_health.failures: 0 is outside 1..=10000",
    );
    refused(
        &service(&format!(
            "mode = \"nat\"\n{CHECK}\n[services.passive_health]\nwindow = \"5ms\"\n"
        )),
        "services[0].passive_health.window: 5ms is shorter than 10ms",
    );
    refused(
        &service(&format!(
            "mode = \"nat\"\n{CHECK}\n[services.passive_health]\nwindow = \"2m\"\n"
        )),
        "services[0].passive_health.window: 2m is longer than 1m",
    );
}
