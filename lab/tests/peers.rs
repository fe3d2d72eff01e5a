//! The kernel peers: kube-proxy's iptables and nftables rules as text (no root needed), the
//! same rules loaded into throwaway namespaces and really DNATing a client's connection
//! through a two-arm testbed, and a smoke run of `strait-lab bench rule-update`.
//!
//! The privileged tests need root, iproute2, procps, iptables, nftables, ethtool and curl.
//! Without them they fail with a message saying what is missing, unless
//! `STRAIT_SKIP_PRIVILEGED=1`, when they print a loud SKIPPED line instead. Each works in
//! namespaces named after this process (`sp{pid}...`), removed by guards on drop, also
//! when an assertion fails.

mod support;

use std::collections::{BTreeSet, HashSet};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::Command;

use strait_config::model::Protocol;
use strait_lab::peers::{self, KernelGateway, Netns, PeerKind, SvcSpec};
use support::bed::{backend_of, Bed, CLIENT};
use support::harness::{sh, LAB};
use support::privileged as gate;

fn ep(a: [u8; 4], port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::from(a), port)
}

fn svc(name: &str, port_name: &str, vip: [u8; 4], port: u16, eps: &[SocketAddrV4]) -> SvcSpec {
    SvcSpec {
        namespace: "ns1".to_owned(),
        name: name.to_owned(),
        port_name: port_name.to_owned(),
        protocol: Protocol::Tcp,
        vip: Ipv4Addr::from(vip),
        port,
        endpoints: eps.to_vec(),
    }
}

/// Two services of three endpoints each, on documentation addresses: `web` (`http`,
/// 203.0.113.1:80 to 198.51.100.11-13:8080) and `api` (unnamed port, 203.0.113.2:443 to
/// 198.51.100.21-23:8443).
fn two_services() -> Vec<SvcSpec> {
    let three = |first: u8, port: u16| -> Vec<SocketAddrV4> {
        (first..first + 3)
            .map(|i| ep([198, 51, 100, i], port))
            .collect()
    };
    vec![
        svc("web", "http", [203, 0, 113, 1], 80, &three(11, 8080)),
        svc("api", "", [203, 0, 113, 2], 443, &three(21, 8443)),
    ]
}

fn lines_starting<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[test]
fn chain_names_are_kube_proxys() {
    // Vectors from kube-proxy's own tests (pkg/proxy/iptables/proxier_test.go,
    // pkg/proxy/nftables/proxier_test.go): the service is compared by name only, never
    // loaded, so its cluster addresses need not be documentation ones.
    let s = svc("svc1", "", [172, 30, 1, 1], 80, &[]);
    assert_eq!(s.port_name_string(), "ns1/svc1");
    assert_eq!(s.iptables_chain(), "KUBE-SVC-AQI2S6QIMU7PVVRP");
    let seps: Vec<String> = [1, 2, 3]
        .iter()
        .map(|&i| s.iptables_endpoint_chain(ep([10, 0, 1, i], 80)))
        .collect();
    assert_eq!(
        seps,
        [
            "KUBE-SEP-3JOIVZTXZZRGORX4",
            "KUBE-SEP-IO5XOSKPAXIFQXAJ",
            "KUBE-SEP-XGJFVO3L2O5SRFNT"
        ]
    );
    let s = svc("svc1", "p80", [172, 30, 0, 41], 80, &[]);
    assert_eq!(s.port_name_string(), "ns1/svc1:p80");
    assert_eq!(s.nft_chain(), "service-ULMVA6XW-ns1/svc1/tcp/p80");
    assert_eq!(
        s.nft_endpoint_chain(ep([10, 180, 0, 1], 80)),
        "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
    );
}

#[test]
fn iptables_rules_have_kube_proxys_shape() {
    let services = two_services();
    let text = peers::iptables_rules(&services);
    let web = &services[0];
    let svc_chain = web.iptables_chain();
    let seps: Vec<String> = web
        .endpoints
        .iter()
        .map(|&e| web.iptables_endpoint_chain(e))
        .collect();
    // The whole of one service, exactly as kube-proxy writes it (comments on: 6 endpoints).
    let expected_web = format!(
        "-A KUBE-SERVICES -m comment --comment \"ns1/web:http cluster IP\" -m tcp -p tcp -d 203.0.113.1 --dport 80 -j {svc_chain}\n\
         -A {svc_chain} -m comment --comment \"ns1/web:http -> 198.51.100.11:8080\" -m statistic --mode random --probability 0.3333333333 -j {s0}\n\
         -A {svc_chain} -m comment --comment \"ns1/web:http -> 198.51.100.12:8080\" -m statistic --mode random --probability 0.5000000000 -j {s1}\n\
         -A {svc_chain} -m comment --comment \"ns1/web:http -> 198.51.100.13:8080\" -j {s2}\n\
         -A {s0} -m comment --comment ns1/web:http -s 198.51.100.11 -j KUBE-MARK-MASQ\n\
         -A {s0} -m comment --comment ns1/web:http -m tcp -p tcp -j DNAT --to-destination 198.51.100.11:8080\n\
         -A {s1} -m comment --comment ns1/web:http -s 198.51.100.12 -j KUBE-MARK-MASQ\n\
         -A {s1} -m comment --comment ns1/web:http -m tcp -p tcp -j DNAT --to-destination 198.51.100.12:8080\n\
         -A {s2} -m comment --comment ns1/web:http -s 198.51.100.13 -j KUBE-MARK-MASQ\n\
         -A {s2} -m comment --comment ns1/web:http -m tcp -p tcp -j DNAT --to-destination 198.51.100.13:8080\n",
        s0 = seps[0],
        s1 = seps[1],
        s2 = seps[2],
    );
    assert!(text.contains(&expected_web), "{text}");

    assert!(text.starts_with("*nat\n:KUBE-SERVICES - [0:0]\n"), "{text}");
    assert!(text.ends_with(
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be \
         the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\nCOMMIT\n"
    ));
    // 4 top-level chains, 2 service chains, 6 endpoint chains, each declared once.
    let declared = lines_starting(&text, ":");
    assert_eq!(declared.len(), 12, "{declared:?}");
    assert_eq!(declared.iter().collect::<HashSet<_>>().len(), 12);
    assert_eq!(lines_starting(&text, ":KUBE-SVC-").len(), 2);
    assert_eq!(lines_starting(&text, ":KUBE-SEP-").len(), 6);
    for jump in [
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING",
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
    ] {
        assert!(text.lines().any(|l| l == jump), "{jump}");
    }
    // The unnamed port of the second service: `ns1/api`, and its own probabilities.
    let api = &services[1];
    let api_rules = lines_starting(&text, &format!("-A {} ", api.iptables_chain()));
    assert_eq!(api_rules.len(), 3);
    assert!(api_rules[0].contains(
        "\"ns1/api -> 198.51.100.21:8443\" -m statistic --mode random --probability 0.3333333333"
    ));
    assert!(api_rules[1].contains("--probability 0.5000000000"));
    assert!(!api_rules[2].contains("statistic"), "{}", api_rules[2]);
}

#[test]
fn large_clusters_lose_the_per_rule_comments() {
    // 101 x 10 endpoints: above kube-proxy's threshold of 1,000.
    let services = peers::synthetic(101, 10);
    let text = peers::iptables_rules(&services);
    let sep_or_svc = |l: &&str| l.starts_with("-A KUBE-SVC-") || l.starts_with("-A KUBE-SEP-");
    assert!(text
        .lines()
        .filter(sep_or_svc)
        .all(|l| !l.contains("comment")));
    let cluster_ip =
        |l: &&str| l.starts_with("-A KUBE-SERVICES -m comment") && l.contains("cluster IP");
    assert_eq!(text.lines().filter(cluster_ip).count(), 101);
    // Ten endpoints: 1/10 .. 1/2, then unconditional.
    let first = &services[0];
    let rules = lines_starting(&text, &format!("-A {} ", first.iptables_chain()));
    let p: Vec<&str> = rules
        .iter()
        .filter_map(|l| l.split("--probability ").nth(1))
        .filter_map(|r| r.split(' ').next())
        .collect();
    assert_eq!(
        p,
        [
            "0.1000000000",
            "0.1111111111",
            "0.1250000000",
            "0.1428571429",
            "0.1666666667",
            "0.2000000000",
            "0.2500000000",
            "0.3333333333",
            "0.5000000000"
        ]
    );
    assert_eq!(rules.len(), 10);
    let small = peers::iptables_rules(&peers::synthetic(100, 10));
    assert!(small.contains("-m comment --comment bench/svc-0:http -s"));
}

#[test]
fn nftables_rules_have_kube_proxys_shape() {
    let services = two_services();
    let text = peers::nftables_rules(&services);
    for line in [
        "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }",
        "flush table ip kube-proxy",
        "add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }",
        "add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }",
        "add rule ip kube-proxy nat-prerouting jump services",
        "add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; \
         comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }",
        "add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips",
        "add rule ip kube-proxy masquerading masquerade fully-random",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    let web = &services[0];
    let chain = web.nft_chain();
    assert_eq!(chain, format!("service-{}-ns1/web/tcp/http", &chain[8..16]));
    let eps: Vec<String> = web
        .endpoints
        .iter()
        .map(|&e| web.nft_endpoint_chain(e))
        .collect();
    assert!(
        eps[0].ends_with("-ns1/web/tcp/http__198.51.100.11/8080"),
        "{}",
        eps[0]
    );
    let vmap = format!(
        "add rule ip kube-proxy {chain} numgen random mod 3 vmap {{ 0 : goto {} , 1 : goto {} , 2 : goto {} }}",
        eps[0], eps[1], eps[2]
    );
    assert!(text.lines().any(|l| l == vmap), "missing {vmap:?}");
    for (e, c) in web.endpoints.iter().zip(&eps) {
        assert!(text.contains(&format!(
            "add rule ip kube-proxy {c} ip saddr {} jump mark-for-masquerade\n\
             add rule ip kube-proxy {c} meta l4proto tcp dnat to {e}\n",
            e.ip()
        )));
    }
    assert!(text.contains(&format!(
        "add element ip kube-proxy service-ips {{ 203.0.113.1 . tcp . 80 : goto {chain} }}"
    )));
    assert!(text.contains("service-ips { 203.0.113.2 . tcp . 443 : goto service-"));
    // The unnamed port keeps kube-proxy's trailing slash.
    assert!(services[1].nft_chain().ends_with("-ns1/api/tcp/"));
    assert_eq!(lines_starting(&text, "add element").len(), 2);
    // Every chain is added and flushed once.
    assert_eq!(
        lines_starting(&text, "add chain ip kube-proxy service-").len(),
        2
    );
    assert_eq!(
        lines_starting(&text, "add chain ip kube-proxy endpoint-").len(),
        6
    );
    assert_eq!(
        lines_starting(&text, "flush chain ip kube-proxy endpoint-").len(),
        6
    );
}

#[test]
fn updates_rewrite_only_what_changed() {
    let before = two_services();
    let mut after = before.clone();
    let gone = after[0].endpoints[1];
    after[0].endpoints[1] = ep([198, 51, 100, 14], 8080);
    let (web, api) = (&after[0], &after[1]);

    let ipt = peers::iptables_update(&before, &after);
    // No jumps into the built-in chains: they are in place since the first load.
    assert!(!ipt.contains("PREROUTING"));
    // Every service's KUBE-SERVICES rule, but only the changed service's chains.
    let cluster_ip = |l: &&str| l.starts_with("-A KUBE-SERVICES") && l.contains("cluster IP");
    assert_eq!(ipt.lines().filter(cluster_ip).count(), 2);
    assert!(ipt.contains(&format!(":{} - [0:0]", web.iptables_chain())));
    assert!(!ipt.contains(&format!(":{} - [0:0]", api.iptables_chain())));
    assert!(!ipt.contains(&format!("-A {} ", api.iptables_chain())));
    let old_sep = before[0].iptables_endpoint_chain(gone);
    assert!(ipt.contains(&format!(":{old_sep} - [0:0]\n")));
    assert!(ipt.contains(&format!("-X {old_sep}\n")));
    assert!(ipt.contains("--to-destination 198.51.100.14:8080"));
    assert_eq!(lines_starting(&ipt, "-X ").len(), 1);

    let nft = peers::nftables_update(&before, &after);
    assert!(nft.contains(&format!("flush chain ip kube-proxy {}\n", web.nft_chain())));
    assert!(nft.contains(&format!(
        "add rule ip kube-proxy {} numgen random mod 3 vmap",
        web.nft_chain()
    )));
    assert!(!nft.contains(&api.nft_chain()));
    let old_ep = before[0].nft_endpoint_chain(gone);
    assert!(nft.ends_with(&format!(
        "flush chain ip kube-proxy {old_ep}\ndelete chain ip kube-proxy {old_ep}\n"
    )));
    assert!(
        !nft.contains("element"),
        "the frontend did not move:\n{nft}"
    );
    assert!(peers::nftables_update(&before, &before).is_empty());

    // A service removed and one added: elements follow, chains go.
    let after = vec![
        before[0].clone(),
        svc(
            "db",
            "pg",
            [203, 0, 113, 3],
            5432,
            &[ep([198, 51, 100, 31], 5432)],
        ),
    ];
    let nft = peers::nftables_update(&before, &after);
    assert!(nft.contains(
        "add element ip kube-proxy service-ips { 203.0.113.3 . tcp . 5432 : goto service-"
    ));
    assert!(nft.contains("delete element ip kube-proxy service-ips { 203.0.113.2 . tcp . 443 }"));
    assert!(nft.contains(&format!(
        "delete chain ip kube-proxy {}\n",
        before[1].nft_chain()
    )));
    let ipt = peers::iptables_update(&before, &after);
    assert!(ipt.contains(&format!("-X {}\n", before[1].iptables_chain())));
    assert_eq!(lines_starting(&ipt, "-X ").len(), 4);

    // A service whose last endpoint left: no nat rule, every chain of it gone.
    let mut after = before.clone();
    after[1].endpoints.clear();
    let ipt = peers::iptables_update(&before, &after);
    assert!(!ipt.contains("ns1/api cluster IP"), "{ipt}");
    assert_eq!(lines_starting(&ipt, "-X ").len(), 4);
    assert!(ipt.contains(&format!("-X {}\n", before[1].iptables_chain())));
    let nft = peers::nftables_update(&before, &after);
    assert!(
        nft.starts_with("delete element ip kube-proxy service-ips { 203.0.113.2 . tcp . 443 }\n")
    );
    assert_eq!(lines_starting(&nft, "delete chain").len(), 4);
    assert!(!nft.contains("add "), "{nft}");
}

#[test]
fn synthetic_services_use_documentation_addresses_only() {
    let services = peers::synthetic(10_000, 10);
    let frontends: HashSet<(Ipv4Addr, u16)> = services.iter().map(|s| (s.vip, s.port)).collect();
    assert_eq!(frontends.len(), 10_000);
    let endpoints: HashSet<SocketAddrV4> = services
        .iter()
        .flat_map(|s| s.endpoints.iter().copied())
        .collect();
    assert_eq!(endpoints.len(), 100_000);
    assert!(services
        .iter()
        .all(|s| s.vip.octets()[..3] == [203, 0, 113]));
    assert!(endpoints
        .iter()
        .all(|e| e.ip().octets()[..3] == [198, 51, 100]));
    let vips: BTreeSet<Ipv4Addr> = services.iter().map(|s| s.vip).collect();
    assert_eq!(vips.len(), 40);
    let fresh: HashSet<SocketAddrV4> = (0..1000).map(peers::replacement_endpoint).collect();
    assert_eq!(fresh.len(), 1000);
    assert!(fresh.is_disjoint(&endpoints));
}

#[test]
fn commands_run_inside_the_namespace_only() {
    assert!(peers::valid_name(&format!("{}-gw", "x".repeat(32))));
    assert_eq!(
        peers::in_namespace("sp1-x", "nft", &["-f", "-"]),
        ["netns", "exec", "sp1-x", "nft", "-f", "-"]
    );
    // Names that could escape (paths, options) are refused before anything runs.
    for bad in [
        "",
        "../x",
        "-n",
        "a b",
        "A",
        &"x".repeat(peers::MAX_NAME + 1),
    ] {
        assert!(!peers::valid_name(bad), "{bad:?}");
        assert!(matches!(Netns::create(bad), Err(peers::Error::Name(_))));
        assert!(matches!(
            KernelGateway::up(bad, PeerKind::Iptables, &[]),
            Err(peers::Error::Name(_))
        ));
    }
}

#[test]
fn failing_commands_are_named() {
    // A namespace that does not exist: `ip` refuses before running anything.
    let e = peers::run_in("sp-no-such-namespace", "true", &[], Some("a\nb\n")).unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with(
            "`ip netns exec sp-no-such-namespace true < (2 lines of input)` failed (exit status: "
        ),
        "{text}"
    );
    assert!(text.contains("): "), "stderr missing: {text}");
}

#[test]
fn an_empty_nat_table_is_recognised() {
    let empty = "# Generated by iptables-save v1.8.9 (nf_tables)\n*nat\n:PREROUTING ACCEPT [0:0]\n\
                 :INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n\
                 # Completed\n";
    assert!(peers::nat_table_is_empty(empty));
    assert!(peers::nat_table_is_empty(""));
    let with_rule = empty.replace("COMMIT", "-A PREROUTING -j ACCEPT\nCOMMIT");
    assert!(!peers::nat_table_is_empty(&with_rule));
    let with_chain = empty.replace("COMMIT", ":DOCKER - [0:0]\nCOMMIT");
    assert!(!peers::nat_table_is_empty(&with_chain));
}

/// Root and the tools these tests drive (see `strait_testkit::privileged`).
fn privileged(test: &str) -> bool {
    gate::privileged(
        test,
        &[
            gate::IP,
            gate::SYSCTL,
            gate::IPTABLES_RESTORE,
            gate::IPTABLES_SAVE,
            gate::NFT,
            gate::ETHTOOL,
            gate::CURL,
        ],
    )
}

/// `program args` inside `ns`; panics with the failing command when it fails.
fn exec(ns: &str, program: &str, args: &[&str]) -> String {
    peers::run_in(ns, program, args, None)
        .unwrap_or_else(|e| panic!("{e}"))
        .0
}

#[test]
fn both_rulesets_load_update_and_unload_in_a_throwaway_namespace() {
    if !privileged("both_rulesets_load_update_and_unload_in_a_throwaway_namespace") {
        return;
    }
    let services = peers::synthetic(300, 10);
    let mut after = services.clone();
    after[7].endpoints[2] = peers::replacement_endpoint(0);
    let fresh = peers::replacement_endpoint(0);
    let mut emptied = after.clone();
    emptied[8].endpoints.clear();
    let pid = std::process::id();

    let ns = Netns::create(&format!("sp{pid}-ipt")).unwrap();
    let forward = || exec(ns.name(), "sysctl", &["-n", "net.ipv4.ip_forward"]);
    assert_eq!(forward().trim(), "0");
    let mut gw = KernelGateway::up(ns.name(), PeerKind::Iptables, &services).unwrap();
    assert_eq!(forward().trim(), "1");
    let save = exec(ns.name(), "iptables-save", &["-t", "nat"]);
    assert_eq!(lines_starting(&save, ":KUBE-SVC-").len(), 300);
    assert_eq!(lines_starting(&save, ":KUBE-SEP-").len(), 3000);
    assert_eq!(lines_starting(&save, "-A PREROUTING").len(), 1);
    assert!(save.contains("-m statistic --mode random --probability 0.10000000009 -j KUBE-SEP-"));
    gw.update(&after).unwrap();
    let save = exec(ns.name(), "iptables-save", &["-t", "nat"]);
    assert_eq!(lines_starting(&save, ":KUBE-SEP-").len(), 3000);
    assert!(save.contains(&format!("--to-destination {fresh}\n")));
    let old = services[7].endpoints[2];
    assert!(!save.contains(&format!("--to-destination {old}\n")));
    // A service losing its last endpoint loses its chains.
    gw.update(&emptied).unwrap();
    let save = exec(ns.name(), "iptables-save", &["-t", "nat"]);
    assert_eq!(lines_starting(&save, ":KUBE-SVC-").len(), 299);
    assert_eq!(lines_starting(&save, ":KUBE-SEP-").len(), 2990);
    gw.down().unwrap();
    let save = exec(ns.name(), "iptables-save", &["-t", "nat"]);
    assert!(peers::nat_table_is_empty(&save), "{save}");
    assert_eq!(forward().trim(), "0");

    // Into a nat table that holds someone else's rule: --noflush, and that rule survives.
    let theirs = ["-t", "nat", "-A", "POSTROUTING", "-o", "lo", "-j", "RETURN"];
    exec(ns.name(), "iptables", &theirs);
    let gw = KernelGateway::up(ns.name(), PeerKind::Iptables, &services[..3]).unwrap();
    gw.down().unwrap();
    let save = exec(ns.name(), "iptables-save", &["-t", "nat"]);
    assert!(save.contains("-A POSTROUTING -o lo -j RETURN"), "{save}");
    assert!(!save.contains("KUBE-"), "{save}");
    drop(ns);

    let ns = Netns::create(&format!("sp{pid}-nft")).unwrap();
    let mut gw = KernelGateway::up(ns.name(), PeerKind::Nftables, &services).unwrap();
    let map = exec(
        ns.name(),
        "nft",
        &["list", "map", "ip", "kube-proxy", "service-ips"],
    );
    assert_eq!(map.matches(" : goto service-").count(), 300, "{map}");
    gw.update(&after).unwrap();
    let chain = exec(
        ns.name(),
        "nft",
        &["list", "chain", "ip", "kube-proxy", &after[7].nft_chain()],
    );
    assert!(
        chain.contains(&after[7].nft_endpoint_chain(fresh)),
        "{chain}"
    );
    let chains = exec(ns.name(), "nft", &["list", "chains", "ip"]);
    assert!(!chains.contains(&services[7].nft_endpoint_chain(old)));
    assert_eq!(chains.matches("chain endpoint-").count(), 3000);
    gw.update(&emptied).unwrap();
    let chains = exec(ns.name(), "nft", &["list", "chains", "ip"]);
    assert_eq!(chains.matches("chain endpoint-").count(), 2990);
    assert_eq!(chains.matches("chain service-").count(), 299);
    let map = exec(
        ns.name(),
        "nft",
        &["list", "map", "ip", "kube-proxy", "service-ips"],
    );
    assert_eq!(map.matches(" : goto service-").count(), 299, "{map}");
    gw.down().unwrap();
    assert_eq!(exec(ns.name(), "nft", &["list", "tables"]).trim(), "");
}

/// The backend named in an answer `backend=b2 client=192.0.2.2:40000`, after checking that
/// the client's address reached the backend unchanged.
fn backend_name(answer: &str) -> String {
    assert!(
        answer.contains(&format!(" client={CLIENT}:")),
        "the client address did not survive: {answer:?}"
    );
    backend_of(answer)
        .unwrap_or_else(|| panic!("not a backend answer: {answer:?}"))
        .to_owned()
}

#[test]
fn the_kernel_peers_really_dnat_through_a_two_arm_testbed() {
    if !privileged("the_kernel_peers_really_dnat_through_a_two_arm_testbed") {
        return;
    }
    let tb = Bed::up(
        &format!("sp{}dnat", std::process::id()),
        &["--topology", "two-arm", "--backends", "3"],
    );
    let gw_ns = tb.ns("gw");
    let b = |i: u8, port: u16| ep([198, 51, 100, 10 + i], port);
    let services = vec![
        svc(
            "spread",
            "http",
            [203, 0, 113, 20],
            80,
            &[b(1, 8080), b(2, 8080), b(3, 8080)],
        ),
        svc("one", "http", [203, 0, 113, 21], 80, &[b(1, 80)]),
        svc("other-port", "alt", [203, 0, 113, 20], 81, &[b(2, 8080)]),
    ];

    // Routing alone knows nothing of the VIPs: the connection fails.
    let plain = KernelGateway::up(&gw_ns, PeerKind::PlainForward, &services).unwrap();
    assert!(tb.curl("http://203.0.113.21/").is_err());
    plain.down().unwrap();

    for kind in [PeerKind::Iptables, PeerKind::Nftables] {
        let mut gw = KernelGateway::up(&gw_ns, kind, &services).unwrap();
        let got = |url: &str| {
            let answer = tb
                .curl(url)
                .unwrap_or_else(|e| panic!("{kind:?}: curl {url}: {e}"));
            backend_name(&answer)
        };
        assert_eq!(got("http://203.0.113.21/"), "b1", "{kind:?}");
        assert_eq!(got("http://203.0.113.20:81/"), "b2", "{kind:?}");
        let seen: BTreeSet<String> = (0..12).map(|_| got("http://203.0.113.20/")).collect();
        // Twelve random picks of three all land on one backend with probability 3^-11.
        assert!(
            seen.len() >= 2,
            "{kind:?}: every connection went to {seen:?}"
        );
        assert!(seen
            .iter()
            .all(|b| ["b1", "b2", "b3"].contains(&b.as_str())));

        // An endpoint change through the partial sync takes effect.
        let mut after = services.clone();
        after[1].endpoints = vec![b(3, 8080)];
        gw.update(&after).unwrap();
        assert_eq!(
            got("http://203.0.113.21/"),
            "b3",
            "{kind:?} after the update"
        );
        gw.down().unwrap();
        assert!(
            tb.curl("http://203.0.113.21/").is_err(),
            "{kind:?}: rules left behind"
        );
    }
}

#[test]
fn bench_rule_update_smoke() {
    if !privileged("bench_rule_update_smoke") {
        return;
    }
    let out = Command::new(LAB)
        .args(["bench", "rule-update", "--json", "--services", "300"])
        .output()
        .expect("run strait bench rule-update");
    assert!(
        out.status.success(),
        "strait bench rule-update failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(r["services"], 300);
    assert_eq!(r["endpoints_per_service"], 10);
    let swap = &r["strait_swap_ms"];
    let p50 = swap["p50"].as_f64().unwrap_or_default();
    let p99 = swap["p99"].as_f64().unwrap_or_default();
    assert!(p50 > 0.0 && p99 >= p50, "{swap}");
    for k in [
        "iptables_restore_ms",
        "iptables_update_ms",
        "nft_load_ms",
        "nft_update_ms",
        "nft_add_element_ms",
        "netns_exec_ms",
    ] {
        let v = r[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} missing in {r}"));
        assert!(v > 0.0, "{k} = {v}");
    }
    // Its namespaces (`sp{its pid}-rules-...`) are gone.
    let left: Vec<String> = sh(&["ip", "netns", "list"])
        .lines()
        .filter(|l| l.contains("-rules-"))
        .map(str::to_owned)
        .collect();
    assert!(left.is_empty(), "the benchmark left namespaces: {left:?}");
}
