//! Tests of LoadBalancer address management beyond one address per Service
//! (`control/src/kubemodel/pool.rs`): IP sharing, the MetalLB and Cilium annotations, named
//! pools, dual-stack Services gaining their second family, and the Events and metrics that
//! explain what is not served. Planning as a pure function, then the whole source against
//! the fake API server of `strait-testkit` (plain HTTP on 127.0.0.1; no cluster, no root).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use ::kube::api::DynamicObject;
use ::kube::runtime::watcher::Event;
use k8s_openapi::api::core::v1::Service;
use serde_json::{json, Value};
use strait_config::model::{self, Mode, Protocol};

use strait_control::kube;
use strait_control::kubemodel;
use strait_control::kubemodel::events::NoticeType;
use strait_control::kubemodel::pool::{self, Allocator};
use strait_control::kubemodel::settings::Settings;
use strait_control::kubemodel::translate;
use strait_control::kubemodel::Controller;
use strait_control::kubemodel::Kind;
use strait_testkit::fake_api::{FakeApi, Res};
use strait_testkit::harness::Scratch;
use strait_testkit::objects::{lb_service as lb, node, with_status};

mod common;
use common::{eventually, start, until};

// ---- objects ------------------------------------------------------------------------

fn gateway() -> model::Gateway {
    strait_config::parse("[[gateway.interfaces]]\nname = \"eth0\"\nqueues = [0]\n")
        .unwrap()
        .gateway
}

fn settings() -> Settings {
    let mut s = Settings::new(gateway());
    s.mode = Mode::DsrL2;
    s.pools = vec!["203.0.113.16/29".parse().unwrap()];
    s.backoff = (Duration::from_millis(100), Duration::from_millis(800));
    s
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const HTTP: &[(&str, &str, u16)] = &[("http", "TCP", 80)];
const HTTPS: &[(&str, &str, u16)] = &[("https", "TCP", 443)];
const DNS_UDP: &[(&str, &str, u16)] = &[("dns", "UDP", 53)];
const DNS_TCP: &[(&str, &str, u16)] = &[("dns-tcp", "TCP", 53)];

fn shared(key: &str) -> Value {
    json!({ "strait.dev/allow-shared-ip": key })
}

fn svc(v: Value) -> Service {
    serde_json::from_value(v).unwrap()
}

fn pools(s: &[&str]) -> Vec<ipnet::IpNet> {
    s.iter().map(|p| p.parse().unwrap()).collect()
}

/// One planning round over `svcs` (oldest first), owning those of our class.
fn plan(a: &mut Allocator, svcs: &[&Service]) -> pool::AddressPlan {
    let st = settings();
    pool::plan(a, svcs, |s| translate::owns(&st, s))
}

fn reasons(p: &pool::AddressPlan) -> Vec<(String, String)> {
    p.notices
        .iter()
        .map(|n| (n.key(), n.reason.clone()))
        .collect()
}

fn has_reason(p: &pool::AddressPlan, key: &str, reason: &str) -> bool {
    p.notices
        .iter()
        .any(|n| n.key() == key && n.reason == reason)
}

/// The Services as the watch brings them back after the plan's status writes.
fn echo(svcs: &mut [Service], p: &pool::AddressPlan) {
    for up in &p.status {
        let s = svcs
            .iter_mut()
            .find(|s| s.metadata.name.as_deref() == Some(up.name.as_str()))
            .expect("a write for a Service of the list");
        let ing: Vec<Value> = up
            .addresses
            .iter()
            .map(|a| json!({ "ip": a.to_string() }))
            .collect();
        s.status =
            Some(serde_json::from_value(json!({ "loadBalancer": { "ingress": ing } })).unwrap());
    }
}

/// Panics unless every address the statuses show belongs to one group of Services that may
/// share it: all with one sharing key, one namespace, the same backends and no port in
/// common.
fn assert_one_group_per_address(svcs: &[Service]) {
    if let Some(v) = group_violation(svcs) {
        panic!("{v}");
    }
}

/// What breaks the rule of [`assert_one_group_per_address`], if anything.
fn group_violation(svcs: &[Service]) -> Option<String> {
    let mut by_addr: BTreeMap<IpAddr, Vec<&Service>> = BTreeMap::new();
    for s in svcs {
        for a in pool::status_addresses(s) {
            by_addr.entry(a).or_default().push(s);
        }
    }
    for (a, users) in by_addr {
        if users.len() < 2 {
            continue;
        }
        let uses: Vec<pool::Use> = users.iter().map(|s| pool::use_of(s)).collect();
        let names: Vec<&str> = users
            .iter()
            .map(|s| s.metadata.name.as_deref().unwrap_or(""))
            .collect();
        for (i, u) in uses.iter().enumerate() {
            if u.sharing.is_none() {
                return Some(format!("{a}: {names:?}, {} shares nothing", names[i]));
            }
            if u.sharing != uses[0].sharing || u.backends != uses[0].backends {
                return Some(format!("{a}: {names:?}: keys or backends differ"));
            }
            for (j, v) in uses.iter().enumerate().skip(i + 1) {
                if !u.ports.is_disjoint(&v.ports) {
                    return Some(format!(
                        "{a}: {} and {} overlap on {:?}",
                        names[i],
                        names[j],
                        u.ports.intersection(&v.ports).collect::<Vec<_>>()
                    ));
                }
            }
        }
    }
    None
}

fn refs(svcs: &[Service]) -> Vec<&Service> {
    svcs.iter().collect()
}

// ---- sharing, planned -----------------------------------------------------------------

#[test]
fn services_with_one_sharing_key_share_an_address_until_the_last_leaves() {
    let mut a = Allocator::new(&pools(&["203.0.113.16/29"]));
    let mut svcs = vec![
        svc(lb("web", 1, HTTP, shared("front"))),
        svc(lb("tls", 2, HTTPS, shared("front"))),
        svc(lb("plain", 3, HTTP, json!({}))),
    ];
    let p = plan(&mut a, &refs(&svcs));
    assert_eq!(p.assigned["default/web"], [ip("203.0.113.17")]);
    assert_eq!(
        p.assigned["default/tls"],
        [ip("203.0.113.17")],
        "joined web"
    );
    assert_eq!(p.assigned["default/plain"], [ip("203.0.113.18")]);
    assert_eq!(
        a.holders(ip("203.0.113.17")),
        ["default/tls", "default/web"]
    );
    assert_eq!(a.count(), 2, "a shared address counts once");
    let msg = &p
        .notices
        .iter()
        .find(|n| n.key() == "default/tls" && n.reason == "AddressAssigned")
        .unwrap()
        .message;
    assert!(msg.contains("shared with default/web"), "{msg}");
    assert_eq!(p.status.len(), 3, "each sharer's status shows the address");
    echo(&mut svcs, &p);
    assert_one_group_per_address(&svcs);
    assert!(plan(&mut a, &refs(&svcs)).status.is_empty(), "settled");

    // The one that came first goes: the other keeps the address.
    svcs.remove(0);
    let p = plan(&mut a, &refs(&svcs));
    assert_eq!(p.assigned["default/tls"], [ip("203.0.113.17")]);
    assert!(p.status.is_empty(), "{:?}", p.status);
    assert_eq!(a.holders(ip("203.0.113.17")), ["default/tls"]);
    // A Service without the key does not get it while tls holds it.
    svcs.push(svc(lb("late", 4, HTTPS, json!({}))));
    let p = plan(&mut a, &refs(&svcs));
    assert_eq!(p.assigned["default/late"], [ip("203.0.113.19")]);
    echo(&mut svcs, &p);

    // The last sharer goes: released, and the next Service may have it.
    svcs.retain(|s| s.metadata.name.as_deref() != Some("tls"));
    let p = plan(&mut a, &refs(&svcs));
    assert_eq!(
        a.owner(ip("203.0.113.17")),
        None,
        "released with the last sharer"
    );
    assert!(p.assigned.values().all(|v| v != &[ip("203.0.113.17")]));
    svcs.push(svc(lb("next", 5, HTTP, json!({}))));
    let p = plan(&mut a, &refs(&svcs));
    assert_eq!(p.assigned["default/next"], [ip("203.0.113.17")]);
}

#[test]
fn an_overlapping_port_is_refused_with_an_event_and_never_shares() {
    let mut a = Allocator::new(&pools(&["203.0.113.16/29"]));
    let mut svcs = vec![
        svc(lb("dns", 1, DNS_UDP, shared("dns"))),
        // TCP and UDP on one port do not overlap (MetalLB's DNS example).
        svc(lb("dns-tcp", 2, DNS_TCP, shared("dns"))),
    ];
    let p = plan(&mut a, &refs(&svcs));
    echo(&mut svcs, &p);
    svcs.extend([
        // Asks for the shared address with a port dns-tcp serves: refused.
        svc(lb(
            "clash",
            3,
            &[("dns-tcp", "TCP", 53)],
            json!({ "strait.dev/allow-shared-ip": "dns", "strait.dev/load-balancer-ip": "203.0.113.17" }),
        )),
        // The same without a request: an address of its own, and a warning why.
        svc(lb("own", 4, &[("http", "TCP", 80), ("dns", "UDP", 53)], shared("dns"))),
    ]);
    let p = plan(&mut a, &refs(&svcs));
    assert_eq!(p.assigned["default/dns"], [ip("203.0.113.17")]);
    assert_eq!(p.assigned["default/dns-tcp"], [ip("203.0.113.17")]);
    assert!(!p.assigned.contains_key("default/clash"), "no address");
    assert_eq!(p.assigned["default/own"], [ip("203.0.113.18")]);
    assert!(
        has_reason(&p, "default/clash", "AddressNotShared"),
        "{:?}",
        reasons(&p)
    );
    assert!(
        has_reason(&p, "default/own", "AddressNotShared"),
        "{:?}",
        reasons(&p)
    );
    let clash = p
        .notices
        .iter()
        .find(|n| n.key() == "default/clash" && n.reason == "AddressNotShared")
        .unwrap();
    assert_eq!(clash.type_, NoticeType::Warning);
    assert!(
        clash
            .message
            .contains("default/dns-tcp already serves TCP/53"),
        "{}",
        clash.message
    );
    echo(&mut svcs, &p);
    assert_one_group_per_address(&svcs);

    // dns-tcp goes: now clash's request fits, and it joins.
    svcs.retain(|s| s.metadata.name.as_deref() != Some("dns-tcp"));
    let p = plan(&mut a, &refs(&svcs));
    assert_eq!(
        p.assigned["default/clash"],
        [ip("203.0.113.17")],
        "{:?} {:?}",
        p.assigned,
        p.notices
    );
    assert_eq!(
        a.holders(ip("203.0.113.17")),
        ["default/clash", "default/dns"]
    );
    echo(&mut svcs, &p);
    assert_one_group_per_address(&svcs);

    // A sharer changes its ports to overlap: the older one keeps the address, the newer
    // one loses it, its status is cleared with an Event, and it asked for it: nothing.
    let mut v = serde_json::to_value(&svcs[1]).unwrap();
    assert_eq!(v["metadata"]["name"], "clash");
    v["spec"]["ports"] = json!([{ "name": "dns", "protocol": "UDP", "port": 53 }]);
    svcs[1] = svc(v);
    let p = plan(&mut a, &refs(&svcs));
    assert_eq!(a.holders(ip("203.0.113.17")), ["default/dns"]);
    assert!(has_reason(&p, "default/clash", "AddressNotShared"));
    assert!(has_reason(&p, "default/clash", "AddressReleased"));
    let writes: Vec<(&str, usize)> = p
        .status
        .iter()
        .map(|u| (u.name.as_str(), u.addresses.len()))
        .collect();
    assert_eq!(writes, [("clash", 0)]);
    assert!(
        group_violation(&svcs).is_some(),
        "the check sees the overlap until the status write comes back"
    );
    echo(&mut svcs, &p);
    assert_one_group_per_address(&svcs);
}

#[test]
fn sharing_needs_one_key_one_namespace_and_the_same_local_backends() {
    let pools = pools(&["203.0.113.16/29"]);
    let req = |key: Option<&str>| {
        let mut a = json!({ "strait.dev/load-balancer-ip": "203.0.113.20" });
        if let Some(k) = key {
            a["strait.dev/allow-shared-ip"] = json!(k);
        }
        a
    };
    let first = svc(lb("first", 1, HTTP, req(Some("k"))));
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "no key",
            lb("b", 2, HTTPS, req(None)),
            "this Service has no sharing key",
        ),
        (
            "other key",
            lb("b", 2, HTTPS, req(Some("j"))),
            "under the key \"k\", not \"j\"",
        ),
        (
            "other namespace",
            {
                let mut v = lb("b", 2, HTTPS, req(Some("k")));
                v["metadata"]["namespace"] = json!("other");
                v
            },
            "sharing across namespaces",
        ),
        (
            "Local policy, Cluster first",
            {
                let mut v = lb("b", 2, HTTPS, req(Some("k")));
                v["spec"]["externalTrafficPolicy"] = json!("Local");
                v
            },
            "other backends",
        ),
    ];
    for (what, v, why) in cases {
        let mut a = Allocator::new(&pools);
        let b = svc(v);
        let p = plan(&mut a, &[&first, &b]);
        let key = kubemodel::object_key(&b.metadata);
        assert!(!p.assigned.contains_key(&key), "{what}: {:?}", p.assigned);
        let n = p
            .notices
            .iter()
            .find(|n| n.key() == key && n.type_ == NoticeType::Warning)
            .unwrap_or_else(|| panic!("{what}: no warning in {:?}", reasons(&p)));
        assert_eq!(n.reason, "AddressNotShared", "{what}");
        assert!(n.message.contains(why), "{what}: {}", n.message);
    }

    // Under Local, one selector shares; both namespaces allowing each other share.
    let local = |name: &str, age: u32, ports, app: &str| {
        let mut v = lb(name, age, ports, req(Some("k")));
        v["spec"]["externalTrafficPolicy"] = json!("Local");
        v["spec"]["selector"] = json!({ "app": app });
        svc(v)
    };
    let (l1, l2, l3) = (
        local("l1", 1, HTTP, "web"),
        local("l2", 2, HTTPS, "web"),
        local("l3", 3, DNS_UDP, "dns"),
    );
    let mut a = Allocator::new(&pools);
    let p = plan(&mut a, &[&l1, &l2, &l3]);
    assert_eq!(p.assigned["default/l2"], [ip("203.0.113.20")]);
    assert!(!p.assigned.contains_key("default/l3"), "another selector");
    let cross = |name: &str, ns: &str, ports, allow: &str| {
        let mut v = lb(name, 1, ports, req(Some("k")));
        v["metadata"]["namespace"] = json!(ns);
        v["metadata"]["annotations"]["lbipam.cilium.io/sharing-cross-namespace"] = json!(allow);
        svc(v)
    };
    let (x, y) = (cross("x", "a", HTTP, "b"), cross("y", "b", HTTPS, "*"));
    let mut a = Allocator::new(&pools);
    let p = plan(&mut a, &[&x, &y]);
    assert_eq!(p.assigned["a/x"], [ip("203.0.113.20")]);
    assert_eq!(p.assigned["b/y"], [ip("203.0.113.20")], "{:?}", reasons(&p));
    let z = cross("z", "c", DNS_UDP, "*");
    let p = plan(&mut a, &[&x, &y, &z]);
    assert!(
        !p.assigned.contains_key("c/z"),
        "x does not allow namespace c"
    );
}

#[test]
fn a_restarted_gateway_keeps_a_shared_address_for_every_sharer() {
    let svcs = [
        svc(with_status(
            lb("a", 1, HTTP, shared("k")),
            &["203.0.113.20"],
        )),
        svc(with_status(
            lb("b", 2, HTTPS, shared("k")),
            &["203.0.113.20"],
        )),
        // Forged: same key, overlapping port, status showing the address.
        svc(with_status(
            lb("c", 3, HTTP, shared("k")),
            &["203.0.113.20"],
        )),
    ];
    let mut fresh = Allocator::new(&pools(&["203.0.113.16/29"]));
    let p = plan(&mut fresh, &refs(&svcs));
    assert_eq!(p.assigned["default/a"], [ip("203.0.113.20")]);
    assert_eq!(p.assigned["default/b"], [ip("203.0.113.20")]);
    assert_eq!(
        p.assigned["default/c"],
        [ip("203.0.113.17")],
        "its own address"
    );
    let writes: Vec<&str> = p.status.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(writes, ["c"], "only c's status is corrected");
}

// ---- migration annotations and named pools, planned ------------------------------------

#[test]
fn metallb_and_cilium_requests_are_honoured() {
    let mut a = Allocator::new(&pools(&["203.0.113.16/28"]));
    let svcs = [
        svc(lb(
            "m",
            1,
            HTTP,
            json!({ "metallb.io/loadBalancerIPs": "203.0.113.20" }),
        )),
        svc(lb(
            "u",
            2,
            HTTP,
            json!({ "metallb.universe.tf/loadBalancerIPs": "203.0.113.21" }),
        )),
        svc(lb(
            "c",
            3,
            HTTP,
            json!({ "lbipam.cilium.io/ips": "203.0.113.22" }),
        )),
        // Strait's own annotation wins over the others.
        svc(lb(
            "s",
            4,
            HTTP,
            json!({ "strait.dev/load-balancer-ip": "203.0.113.23", "metallb.io/loadBalancerIPs": "203.0.113.24" }),
        )),
        // Cilium's sharing key shares with MetalLB's, given the same value.
        svc(lb(
            "ck",
            5,
            HTTPS,
            json!({ "lbipam.cilium.io/sharing-key": "front", "lbipam.cilium.io/ips": "203.0.113.25" }),
        )),
        svc(lb(
            "mk",
            6,
            HTTP,
            json!({ "metallb.io/allow-shared-ip": "front" }),
        )),
    ];
    let p = plan(&mut a, &refs(&svcs));
    for (k, want) in [
        ("m", "203.0.113.20"),
        ("u", "203.0.113.21"),
        ("c", "203.0.113.22"),
        ("s", "203.0.113.23"),
        ("ck", "203.0.113.25"),
        ("mk", "203.0.113.25"),
    ] {
        assert_eq!(p.assigned[&format!("default/{k}")], [ip(want)], "{k}");
    }
    assert!(
        p.notices.iter().all(|n| n.type_ == NoticeType::Normal),
        "{:?}",
        reasons(&p)
    );
    // A request outside the pools is refused as with the strait annotation.
    let far = svc(lb(
        "far",
        7,
        HTTP,
        json!({ "lbipam.cilium.io/ips": "198.51.100.7" }),
    ));
    let p = plan(&mut a, &[&far]);
    assert!(p.assigned.is_empty());
    assert!(has_reason(&p, "default/far", "AddressNotInPool"));
}

#[test]
fn address_pool_annotations_select_a_named_pool() {
    let named = vec![
        ("public".to_owned(), "198.51.100.0/30".parse().unwrap()),
        ("public".to_owned(), "2001:db8:100::/126".parse().unwrap()),
        ("internal".to_owned(), "192.0.2.0/30".parse().unwrap()),
    ];
    let mut a = Allocator::with_names(&pools(&["203.0.113.16/30"]), &named);
    let mut ds = lb(
        "ds",
        4,
        HTTP,
        json!({ "metallb.io/address-pool": "public" }),
    );
    ds["spec"]["ipFamilies"] = json!(["IPv4", "IPv6"]);
    ds["spec"]["ipFamilyPolicy"] = json!("RequireDualStack");
    let svcs = [
        svc(lb("plain", 1, HTTP, json!({}))),
        svc(lb(
            "pub",
            2,
            HTTP,
            json!({ "strait.dev/address-pool": "public" }),
        )),
        svc(lb(
            "int",
            3,
            HTTP,
            json!({ "metallb.universe.tf/address-pool": "internal" }),
        )),
        svc(ds),
        svc(lb(
            "nope",
            5,
            HTTP,
            json!({ "metallb.io/address-pool": "missing" }),
        )),
        svc(lb(
            "wrong",
            6,
            HTTP,
            json!({ "metallb.io/address-pool": "internal", "metallb.io/loadBalancerIPs": "198.51.100.2" }),
        )),
    ];
    let p = plan(&mut a, &refs(&svcs));
    assert_eq!(
        p.assigned["default/plain"],
        [ip("203.0.113.17")],
        "unnamed first"
    );
    assert_eq!(p.assigned["default/pub"], [ip("198.51.100.1")]);
    assert_eq!(p.assigned["default/int"], [ip("192.0.2.1")]);
    assert_eq!(
        p.assigned["default/ds"],
        [ip("198.51.100.2"), ip("2001:db8:100::1")],
        "both families from the one named pool"
    );
    assert!(!p.assigned.contains_key("default/nope"));
    assert!(!p.assigned.contains_key("default/wrong"));
    let r = reasons(&p);
    assert!(
        r.contains(&("default/nope".into(), "UnknownAddressPool".into())),
        "{r:?}"
    );
    assert!(
        r.contains(&("default/wrong".into(), "AddressNotInPool".into())),
        "{r:?}"
    );
    let wrong = p
        .notices
        .iter()
        .find(|n| n.key() == "default/wrong")
        .unwrap();
    assert!(
        wrong
            .message
            .contains("not in pool internal (192.0.2.0/30)"),
        "{}",
        wrong.message
    );

    // A status address outside the named pool is not trusted: moved into it.
    let moved = svc(with_status(
        lb(
            "moved",
            1,
            HTTP,
            json!({ "strait.dev/address-pool": "internal" }),
        ),
        &["203.0.113.18"],
    ));
    let mut a = Allocator::with_names(&pools(&["203.0.113.16/30"]), &named);
    let p = plan(&mut a, &[&moved]);
    assert_eq!(p.assigned["default/moved"], [ip("192.0.2.1")]);
    // A named pool exhausted says so, naming the pool.
    let mut a = Allocator::with_names(&[], &named);
    let two: Vec<Service> = (0..3)
        .map(|i| {
            svc(lb(
                &format!("i{i}"),
                i,
                HTTP,
                json!({ "strait.dev/address-pool": "internal" }),
            ))
        })
        .collect();
    let p = plan(&mut a, &refs(&two));
    let ex = p
        .notices
        .iter()
        .find(|n| n.reason == "PoolExhausted")
        .expect("exhausted");
    assert!(
        ex.message.contains("pool internal (192.0.2.0/30)"),
        "{}",
        ex.message
    );
}

#[derive(Debug, clap::Parser)]
struct Cli {
    #[command(flatten)]
    kube: kube::Args,
}

#[test]
fn pool_flags_take_an_optional_name() {
    use clap::Parser;
    let c = Cli::try_parse_from([
        "strait",
        "--kube",
        "--kube-pool",
        "203.0.113.0/28",
        "--kube-pool",
        "public=198.51.100.0/28",
        "--kube-pool",
        "public=2001:db8::/120",
    ])
    .unwrap();
    let s = c.kube.settings(&gateway());
    assert_eq!(s.pools, pools(&["203.0.113.0/28"]));
    assert_eq!(
        s.named_pools,
        [
            ("public".to_owned(), "198.51.100.0/28".parse().unwrap()),
            ("public".to_owned(), "2001:db8::/120".parse().unwrap())
        ]
    );
    for (bad, says) in [
        ("Public=198.51.100.0/28", "pool name \"Public\""),
        ("=198.51.100.0/28", "pool name \"\""),
        ("public=198.51.100.0", "is not a CIDR"),
    ] {
        let e = Cli::try_parse_from(["strait", "--kube", "--kube-pool", bad])
            .expect_err(bad)
            .to_string();
        assert!(e.contains(says) && e.contains("--kube-pool"), "{bad}: {e}");
    }
}

// ---- dual-stack later, planned ---------------------------------------------------------

#[test]
fn a_dual_stack_service_gains_its_second_family_when_a_pool_for_it_appears() {
    for policy in ["PreferDualStack", "RequireDualStack"] {
        let mut v = lb("ds", 1, HTTP, json!({}));
        v["spec"]["ipFamilies"] = json!(["IPv4", "IPv6"]);
        v["spec"]["ipFamilyPolicy"] = json!(policy);
        let mut svcs = vec![svc(v)];
        let mut a = Allocator::new(&pools(&["203.0.113.16/29"]));
        let p = plan(&mut a, &refs(&svcs));
        if policy == "RequireDualStack" {
            // Both or none, while only one family has a pool.
            assert!(p.assigned.is_empty(), "{policy}");
            assert!(has_reason(&p, "default/ds", "NoAddressPool"));
            // As if another implementation (or an older Strait) gave it one family.
            svcs = vec![svc(with_status(
                serde_json::to_value(&svcs[0]).unwrap(),
                &["203.0.113.17"],
            ))];
            let p = plan(&mut a, &refs(&svcs));
            assert_eq!(p.assigned["default/ds"], [ip("203.0.113.17")], "{policy}");
        } else {
            assert_eq!(p.assigned["default/ds"], [ip("203.0.113.17")], "{policy}");
            echo(&mut svcs, &p);
        }
        assert!(
            plan(&mut a, &refs(&svcs)).status.is_empty(),
            "{policy}: settled"
        );
        assert!(!a.set_pools(&pools(&["203.0.113.16/29"]), &[]), "unchanged");
        assert!(a.set_pools(&pools(&["203.0.113.16/29", "2001:db8:100::/120"]), &[]));
        let p = plan(&mut a, &refs(&svcs));
        assert_eq!(
            p.assigned["default/ds"],
            [ip("203.0.113.17"), ip("2001:db8:100::1")],
            "{policy}: kept its IPv4 address, gained IPv6"
        );
        let writes: Vec<&[IpAddr]> = p.status.iter().map(|u| u.addresses.as_slice()).collect();
        assert_eq!(
            writes,
            [&[ip("203.0.113.17"), ip("2001:db8:100::1")][..]],
            "{policy}"
        );
        assert!(has_reason(&p, "default/ds", "AddressAssigned"));
    }
    // A SingleStack Service gains nothing.
    let single = svc(with_status(
        lb("one", 1, HTTP, json!({})),
        &["203.0.113.17"],
    ));
    let mut a = Allocator::new(&pools(&["203.0.113.16/29", "2001:db8:100::/120"]));
    let p = plan(&mut a, &[&single]);
    assert_eq!(p.assigned["default/one"], [ip("203.0.113.17")]);
    assert!(p.status.is_empty());
}

fn dynamic(v: Value) -> DynamicObject {
    serde_json::from_value(v).unwrap()
}

fn list(ctl: &mut Controller, kind: Kind, objs: Vec<Value>) {
    ctl.apply(kind, Event::Init);
    for o in objs {
        ctl.apply(kind, Event::InitApply(dynamic(o)));
    }
    ctl.apply(kind, Event::InitDone);
}

#[test]
fn the_controller_plans_again_when_its_pools_change() {
    let mut ctl = Controller::new(settings());
    let mut ds = lb("ds", 1, HTTP, json!({}));
    ds["spec"]["ipFamilies"] = json!(["IPv4", "IPv6"]);
    ds["spec"]["ipFamilyPolicy"] = json!("PreferDualStack");
    list(
        &mut ctl,
        Kind::Services,
        vec![with_status(ds, &["203.0.113.17"])],
    );
    list(&mut ctl, Kind::EndpointSlices, vec![]);
    list(&mut ctl, Kind::Nodes, vec![node("n1", "198.51.100.1")]);
    let r = ctl.reconcile().unwrap();
    assert!(r.status.is_empty());
    let vips: Vec<IpAddr> = r.services.iter().map(|s| s.vip).collect();
    assert_eq!(vips, [ip("203.0.113.17")]);
    assert!(ctl.reconcile().unwrap().status.is_empty(), "nothing to do");

    assert!(ctl.set_pools(
        pools(&["203.0.113.16/29"]),
        vec![("v6".to_owned(), "2001:db8:100::/120".parse().unwrap())]
    ));
    let r = ctl.reconcile().unwrap();
    assert_eq!(
        r.status
            .iter()
            .map(|u| u.addresses.clone())
            .collect::<Vec<_>>(),
        [vec![ip("203.0.113.17"), ip("2001:db8:100::1")]]
    );
    let mut vips: Vec<IpAddr> = r.services.iter().map(|s| s.vip).collect();
    vips.sort();
    assert_eq!(
        vips,
        [ip("203.0.113.17"), ip("2001:db8:100::1")],
        "served on both"
    );
}

// ---- against the fake API server ----------------------------------------------------

fn fake(tag: &str) -> (FakeApi, Scratch) {
    let api = FakeApi::start();
    for (n, a) in [("n1", "198.51.100.1"), ("n2", "198.51.100.2")] {
        api.apply(node(n, a));
    }
    (
        api,
        Scratch::new(&format!("strait-ipam-{}-{tag}", std::process::id())),
    )
}

fn status_ips(api: &FakeApi, name: &str) -> Vec<String> {
    api.get(Res::Services, "default", name)
        .and_then(|s| s["status"]["loadBalancer"]["ingress"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|i| i["ip"].as_str().map(str::to_owned))
        .collect()
}

fn event_note(api: &FakeApi, reason: &str, name: &str) -> Option<String> {
    api.events()
        .iter()
        .find(|e| e["reason"] == reason && e["regarding"]["name"] == name)
        .map(|e| e["note"].as_str().unwrap_or("").to_owned())
}

/// The frontends of a published list, sorted.
fn frontends(l: &[model::Service]) -> Vec<(String, IpAddr, u16, Protocol)> {
    let mut v: Vec<_> = l
        .iter()
        .map(|s| (s.name.clone(), s.vip, s.port, s.protocol))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The fake API server's stored Services as typed objects.
fn stored(api: &FakeApi, names: &[&str]) -> Vec<Service> {
    names
        .iter()
        .filter_map(|n| api.get(Res::Services, "default", n))
        .map(svc)
        .collect()
}

#[test]
fn shared_address_end_to_end_both_frontends_served_and_released_with_the_last() {
    let (api, dir) = fake("share");
    api.apply(lb("dns", 1, DNS_UDP, shared("dns")));
    api.apply(lb("dns-tcp", 2, DNS_TCP, shared("dns")));
    let (src, rx) = start(&api, &dir, settings());
    let all = ["dns", "dns-tcp", "clash", "solo"];
    let stop = std::sync::atomic::AtomicBool::new(false);
    /// Stops the watcher however the test ends (the scope waits for it).
    struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let broken = std::thread::scope(|sc| {
        let _stop = Stop(&stop);
        // Every stored status, all along: each address one sharing group's.
        let watcher = sc.spawn(|| {
            let mut broken = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                broken.extend(group_violation(&stored(&api, &all)));
                std::thread::sleep(Duration::from_millis(2));
            }
            broken
        });
        let l = until(&rx, 20, "both on one address", |l| l.len() == 2);
        assert_eq!(
            frontends(&l),
            [
                (
                    "default/dns-tcp/dns-tcp/203.0.113.17".to_owned(),
                    ip("203.0.113.17"),
                    53,
                    Protocol::Tcp
                ),
                (
                    "default/dns/dns/203.0.113.17".to_owned(),
                    ip("203.0.113.17"),
                    53,
                    Protocol::Udp
                ),
            ],
            "the dataplane gets a frontend for each Service on the one VIP"
        );
        for n in ["dns", "dns-tcp"] {
            eventually(10, &format!("{n}'s status"), || {
                status_ips(&api, n) == ["203.0.113.17"]
            });
        }

        // A third with the key, a port dns-tcp serves, asking for the address (MetalLB's
        // annotation): refused with an Event, no address, and nothing served for it.
        api.apply(lb(
            "clash",
            3,
            &[("dns-tcp", "TCP", 53)],
            json!({ "metallb.io/allow-shared-ip": "dns", "metallb.io/loadBalancerIPs": "203.0.113.17" }),
        ));
        eventually(10, "AddressNotShared for clash", || {
            event_note(&api, "AddressNotShared", "clash").is_some()
        });
        let note = event_note(&api, "AddressNotShared", "clash").unwrap();
        assert!(
            note.contains("default/dns-tcp already serves TCP/53"),
            "{note}"
        );
        assert!(status_ips(&api, "clash").is_empty());
        eventually(10, "the standing warning counted", || {
            src.stats().address_warnings().get("AddressNotShared") == Some(&1)
        });
        assert!(src
            .stats()
            .notices()
            .get(&(NoticeType::Warning, "AddressNotShared".to_owned()))
            .is_some_and(|n| *n >= 1));
        assert_one_group_per_address(&stored(&api, &["dns", "dns-tcp", "clash"]));

        // dns-tcp goes: dns keeps the address; clash's request now fits and it joins.
        api.delete(Res::Services, "default", "dns-tcp");
        eventually(10, "clash joins", || {
            status_ips(&api, "clash") == ["203.0.113.17"]
        });
        assert_eq!(status_ips(&api, "dns"), ["203.0.113.17"], "dns kept it");
        let l = until(&rx, 10, "dns and clash served", |l| {
            frontends(l)
                .iter()
                .map(|f| f.0.as_str())
                .collect::<Vec<_>>()
                == [
                    "default/clash/dns-tcp/203.0.113.17",
                    "default/dns/dns/203.0.113.17",
                ]
        });
        assert!(l.iter().all(|s| s.vip == ip("203.0.113.17")));
        eventually(10, "the warning no longer stands", || {
            !src.stats()
                .address_warnings()
                .contains_key("AddressNotShared")
        });
        assert_eq!(src.stats().addresses(), 1, "one address, shared");

        // dns goes: clash keeps it. clash goes: released, and a Service without a key gets it.
        api.delete(Res::Services, "default", "dns");
        until(&rx, 10, "clash alone", |l| l.len() == 1);
        assert_eq!(status_ips(&api, "clash"), ["203.0.113.17"]);
        assert_eq!(src.stats().addresses(), 1);
        api.delete(Res::Services, "default", "clash");
        eventually(10, "released with the last sharer", || {
            src.stats().addresses() == 0
        });
        api.apply(lb("solo", 4, HTTP, json!({})));
        eventually(10, "solo takes the freed address", || {
            status_ips(&api, "solo") == ["203.0.113.17"]
        });
        drop(_stop);
        watcher.join().unwrap()
    });
    assert!(broken.is_empty(), "{broken:?}");
}

#[test]
fn migration_annotations_and_named_pools_against_the_api() {
    let (api, dir) = fake("migrate");
    api.apply(lb(
        "m",
        1,
        HTTP,
        json!({ "metallb.io/loadBalancerIPs": "203.0.113.20" }),
    ));
    api.apply(lb(
        "c",
        2,
        HTTP,
        json!({ "lbipam.cilium.io/ips": "203.0.113.21" }),
    ));
    api.apply(lb(
        "ck",
        3,
        HTTPS,
        json!({ "lbipam.cilium.io/sharing-key": "k", "lbipam.cilium.io/ips": "203.0.113.21" }),
    ));
    api.apply(lb(
        "p",
        4,
        HTTP,
        json!({ "metallb.io/address-pool": "public" }),
    ));
    api.apply(lb(
        "x",
        5,
        HTTP,
        json!({ "metallb.io/address-pool": "nowhere" }),
    ));
    let mut st = settings();
    st.named_pools = vec![("public".to_owned(), "198.51.100.64/30".parse().unwrap())];
    let (_src, rx) = start(&api, &dir, st);
    let l = until(&rx, 20, "m, c and p", |l| l.len() == 3);
    let vips: BTreeMap<String, IpAddr> = l
        .iter()
        .map(|s| (s.name.split('/').nth(1).unwrap().to_owned(), s.vip))
        .collect();
    assert_eq!(vips["m"], ip("203.0.113.20"));
    assert_eq!(vips["c"], ip("203.0.113.21"));
    assert_eq!(vips["p"], ip("198.51.100.65"));
    for (n, want) in [
        ("m", "203.0.113.20"),
        ("c", "203.0.113.21"),
        ("p", "198.51.100.65"),
    ] {
        eventually(10, &format!("{n}'s status"), || {
            status_ips(&api, n) == [want]
        });
    }
    // c has no sharing key: ck's request for its address is refused.
    eventually(10, "AddressNotShared for ck", || {
        event_note(&api, "AddressNotShared", "ck").is_some()
    });
    eventually(10, "UnknownAddressPool for x", || {
        event_note(&api, "UnknownAddressPool", "x").is_some_and(|n| n.contains("public"))
    });
    assert!(status_ips(&api, "x").is_empty() && status_ips(&api, "ck").is_empty());
}

#[test]
fn a_restart_with_an_ipv6_pool_gives_a_dual_stack_service_its_second_family() {
    let (api, dir) = fake("dual-later");
    let mut ds = lb("ds", 1, HTTP, json!({}));
    ds["spec"]["ipFamilies"] = json!(["IPv4", "IPv6"]);
    ds["spec"]["ipFamilyPolicy"] = json!("PreferDualStack");
    api.apply(ds);
    {
        let (_src, rx) = start(&api, &dir, settings());
        until(&rx, 20, "ds on IPv4", |l| l.len() == 1);
        eventually(10, "ds's IPv4 status", || {
            status_ips(&api, "ds") == ["203.0.113.17"]
        });
    }
    // The operator adds an IPv6 pool (`--kube-pool`) and restarts the gateway.
    let mut st = settings();
    st.pools.push("2001:db8:100::/120".parse().unwrap());
    let (_src, rx) = start(&api, &dir, st);
    let l = until(&rx, 20, "ds on both families", |l| l.len() == 2);
    let mut vips: Vec<IpAddr> = l.iter().map(|s| s.vip).collect();
    vips.sort();
    assert_eq!(vips, [ip("203.0.113.17"), ip("2001:db8:100::1")]);
    eventually(10, "both in the status, IPv4 (primary) first", || {
        status_ips(&api, "ds") == ["203.0.113.17", "2001:db8:100::1"]
    });
}

#[test]
fn address_metrics_are_exported() {
    let stats = std::sync::Arc::new(kube::Stats::default());
    let mut registry = prometheus_client::registry::Registry::with_prefix("strait");
    registry.register_collector(Box::new(kube::KubeMetrics(std::sync::Arc::clone(&stats))));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    for reason in kubemodel::events::WARNING_REASONS {
        for line in [
            format!("strait_kube_address_notices_total{{type=\"Warning\",reason=\"{reason}\"}} 0"),
            format!("strait_kube_address_warnings{{reason=\"{reason}\"}} 0"),
        ] {
            assert!(out.lines().any(|l| l == line), "no {line:?} in\n{out}");
        }
    }
    assert!(out
        .lines()
        .any(|l| l
            == "strait_kube_address_notices_total{type=\"Normal\",reason=\"AddressAssigned\"} 0"));
}

// ---- pools as cluster objects (StraitAddressPool) ------------------------------------

use strait_control::kubemodel::crd::{self, StraitAddressPool};

fn pool_object(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "strait.dev/v1alpha1", "kind": "StraitAddressPool",
        "metadata": { "name": name },
        "spec": spec
    })
}

#[test]
fn the_crd_in_deploy_is_the_generated_one() {
    use ::kube::CustomResourceExt;
    let generated = serde_json::to_value(StraitAddressPool::crd()).unwrap();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crd.yaml");
    if std::env::var_os("STRAIT_BLESS").is_some() {
        std::fs::write(path, crd::crd_yaml().unwrap() + "\n").unwrap();
    }
    let file = std::fs::read_to_string(path).expect("deploy/crd.yaml");
    let in_deploy: Value = serde_json::from_str(&file)
        .unwrap_or_else(|e| panic!("deploy/crd.yaml is not the JSON form the code writes: {e}"));
    assert_eq!(
        in_deploy, generated,
        "deploy/crd.yaml differs from StraitAddressPool::crd(); regenerate with \
         STRAIT_BLESS=1 cargo test -p strait-control --test ipam crd_in_deploy"
    );
    assert_eq!(generated["spec"]["scope"], "Cluster");
    assert_eq!(generated["spec"]["group"], "strait.dev");
    let props = &generated["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        ["spec"]["properties"];
    for field in ["addresses", "autoAssign", "avoidBuggyIps"] {
        assert!(
            props.get(field).is_some(),
            "schema lacks spec.{field}: {props}"
        );
    }
}

#[test]
fn pool_objects_give_pools_or_name_the_bad_field() {
    let obj = |spec: Value| -> StraitAddressPool {
        serde_json::from_value(pool_object("p", spec)).unwrap()
    };
    let ps = crd::pools_of(&obj(json!({
        "addresses": ["203.0.113.10-203.0.113.20", "2001:db8:100::/120"],
        "avoidBuggyIps": true
    })))
    .unwrap();
    let nets: Vec<String> = ps.iter().map(|p| p.net.to_string()).collect();
    assert_eq!(
        nets,
        [
            "203.0.113.10/31",
            "203.0.113.12/30",
            "203.0.113.16/30",
            "203.0.113.20/32",
            "2001:db8:100::/120"
        ],
        "a range is cut into the CIDRs that cover it exactly"
    );
    assert!(ps
        .iter()
        .all(|p| p.name.as_deref() == Some("p") && p.auto_assign));
    assert!(ps.iter().all(|p| p.avoid_buggy));
    assert_eq!(
        ps.iter().map(|p| p.whole).collect::<Vec<_>>(),
        [true, true, true, true, false]
    );
    for (spec, field, says) in [
        (json!({ "addresses": [] }), "spec.addresses", "no addresses"),
        (
            json!({ "addresses": ["203.0.113.0/28", "bogus"] }),
            "spec.addresses[1]",
            "neither a CIDR",
        ),
        (
            json!({ "addresses": ["203.0.113.20-203.0.113.10"] }),
            "spec.addresses[0]",
            "runs backwards",
        ),
        (
            json!({ "addresses": ["203.0.113.1-2001:db8::1"] }),
            "spec.addresses[0]",
            "mixes IPv4 and IPv6",
        ),
    ] {
        let e = crd::pools_of(&obj(spec)).unwrap_err();
        assert_eq!(e.field, field);
        assert!(e.reason.contains(says), "{e}");
        assert!(e.to_string().starts_with("StraitAddressPool p: "), "{e}");
    }
}

#[test]
fn a_range_hands_out_every_address_and_buggy_ones_are_avoided() {
    let obj = |name: &str, spec: Value| -> StraitAddressPool {
        serde_json::from_value(pool_object(name, spec)).unwrap()
    };
    let mut pools = crd::pools_of(&obj(
        "range",
        json!({ "addresses": ["198.51.100.254-198.51.101.1"], "avoidBuggyIps": true }),
    ))
    .unwrap();
    pools.extend(
        crd::pools_of(&obj(
            "manual",
            json!({ "addresses": ["192.0.2.0/30"], "autoAssign": false }),
        ))
        .unwrap(),
    );
    let mut a = Allocator::default();
    assert!(a.replace_pools(pools));
    let svcs: Vec<Service> = (0..3)
        .map(|i| svc(lb(&format!("s{i}"), i, HTTP, json!({}))))
        .collect();
    let p = plan(&mut a, &refs(&svcs));
    // .254, .1 of the next /24; .255 and .0 skipped; the manual pool never auto-assigned.
    assert_eq!(p.assigned["default/s0"], [ip("198.51.100.254")]);
    assert_eq!(p.assigned["default/s1"], [ip("198.51.101.1")]);
    assert!(!p.assigned.contains_key("default/s2"));
    assert!(has_reason(&p, "default/s2", "PoolExhausted"));
    // A request for a buggy address of such a pool is refused; the manual pool serves
    // Services that name it.
    let asks = svc(lb(
        "asks",
        5,
        HTTP,
        json!({ "strait.dev/load-balancer-ip": "198.51.100.255" }),
    ));
    let names = svc(lb(
        "names",
        6,
        HTTP,
        json!({ "strait.dev/address-pool": "manual" }),
    ));
    let p = plan(&mut a, &[&svcs[0], &svcs[1], &asks, &names]);
    assert!(has_reason(&p, "default/asks", "AddressNotInPool"));
    assert_eq!(p.assigned["default/names"], [ip("192.0.2.1")]);
}

#[test]
fn pool_objects_apply_live_against_the_api() {
    let (api, dir) = fake("pool-objects");
    api.apply(pool_object(
        "v4",
        json!({ "addresses": ["203.0.113.32-203.0.113.33"] }),
    ));
    let mut ds = lb("ds", 1, HTTP, json!({}));
    ds["spec"]["ipFamilies"] = json!(["IPv4", "IPv6"]);
    ds["spec"]["ipFamilyPolicy"] = json!("PreferDualStack");
    api.apply(ds);
    let mut st = settings();
    st.pools.clear();
    st.pool_objects = true;
    let (src, rx) = start(&api, &dir, st);
    until(&rx, 20, "ds on IPv4 from the v4 object", |l| {
        l.iter().map(|s| s.vip).collect::<Vec<_>>() == [ip("203.0.113.32")]
    });
    eventually(10, "ds's status", || {
        status_ips(&api, "ds") == ["203.0.113.32"]
    });
    assert_eq!(src.stats().lists(Kind::AddressPools), 1);

    // An IPv6 pool appears while the gateway runs: ds gains its second family.
    api.apply(pool_object(
        "v6",
        json!({ "addresses": ["2001:db8:100::/126"] }),
    ));
    let l = until(&rx, 10, "ds on both families", |l| l.len() == 2);
    let mut vips: Vec<IpAddr> = l.iter().map(|s| s.vip).collect();
    vips.sort();
    assert_eq!(vips, [ip("203.0.113.32"), ip("2001:db8:100::1")]);
    eventually(10, "both in ds's status", || {
        status_ips(&api, "ds") == ["203.0.113.32", "2001:db8:100::1"]
    });

    // A bad object and one overlapping v6 are left out whole and counted.
    api.apply(pool_object("bad", json!({ "addresses": ["nonsense"] })));
    api.apply(pool_object(
        "twin",
        json!({ "addresses": ["2001:db8:100::2/128"] }),
    ));
    eventually(10, "two pool objects left out", || {
        src.stats()
            .skipped()
            .get(&translate::WarningKind::Invalid)
            .copied()
            == Some(2)
    });
    // The v4 pool is deleted: ds's IPv4 address is no longer trusted and nothing else
    // gives one, so it keeps IPv6 only.
    assert!(api.delete(Res::AddressPools, "", "v4"));
    eventually(10, "ds on IPv6 only", || {
        status_ips(&api, "ds") == ["2001:db8:100::1"]
    });
    let l = until(&rx, 10, "ds served on IPv6 only", |l| l.len() == 1);
    assert_eq!(l[0].vip, ip("2001:db8:100::1"));
}

#[test]
fn service_allocation_scopes_pools_by_namespace_labels_and_priority() {
    let obj = |name: &str, spec: Value| -> Vec<pool::Pool> {
        crd::pools_of(&serde_json::from_value(pool_object(name, spec)).unwrap()).unwrap()
    };
    let mut pools = obj("general", json!({ "addresses": ["203.0.113.16/30"] }));
    pools.extend(obj(
        "team-a",
        json!({ "addresses": ["198.51.100.0/30"],
                "serviceAllocation": { "namespaces": ["a"], "priority": 20 } }),
    ));
    pools.extend(obj(
        "gold",
        json!({ "addresses": ["192.0.2.0/30"],
                "serviceAllocation": { "priority": 10,
                    "serviceSelectors": [{ "matchLabels": { "tier": "gold" } }] } }),
    ));
    let mut a = Allocator::default();
    a.replace_pools(pools);
    let in_ns = |name: &str, ns: &str, labels: Value| {
        let mut v = lb(name, 1, HTTP, json!({}));
        v["metadata"]["namespace"] = json!(ns);
        v["metadata"]["labels"] = labels;
        svc(v)
    };
    let plain = in_ns("plain", "b", json!({}));
    let team = in_ns("team", "a", json!({}));
    let gold_a = in_ns("gold", "a", json!({ "tier": "gold" }));
    let gold_b = in_ns("gold", "b", json!({ "tier": "gold", "x": "y" }));
    let p = plan(&mut a, &[&plain, &team, &gold_a, &gold_b]);
    assert_eq!(
        p.assigned["b/plain"],
        [ip("203.0.113.17")],
        "unscoped pool only"
    );
    assert_eq!(
        p.assigned["a/team"],
        [ip("198.51.100.1")],
        "its namespace's pool first"
    );
    assert_eq!(
        p.assigned["a/gold"],
        [ip("192.0.2.1")],
        "priority 10 before 20"
    );
    assert_eq!(p.assigned["b/gold"], [ip("192.0.2.2")]);
    // The scoped pools full: the next gold Service falls back to what admits it.
    let more = in_ns("more", "b", json!({ "tier": "gold" }));
    let p = plan(&mut a, &[&plain, &team, &gold_a, &gold_b, &more]);
    assert_eq!(p.assigned["b/more"], [ip("203.0.113.18")]);
}

// ---- namespaceSelector and pool status ----------------------------------------------

fn namespace(name: &str, labels: Value) -> Value {
    json!({
        "kind": "Namespace", "apiVersion": "v1",
        "metadata": { "name": name, "labels": labels }
    })
}

/// A LoadBalancer Service of our class in namespace `ns`.
fn lb_in(ns: &str, name: &str, age: u32) -> Value {
    let mut v = lb(name, age, HTTP, json!({}));
    v["metadata"]["namespace"] = json!(ns);
    v
}

fn status_ips_in(api: &FakeApi, ns: &str, name: &str) -> Vec<String> {
    api.get(Res::Services, ns, name)
        .and_then(|s| s["status"]["loadBalancer"]["ingress"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|i| i["ip"].as_str().map(str::to_owned))
        .collect()
}

/// The ClusterRole of `deploy/rbac.yaml`.
fn deployed_cluster_role() -> Value {
    let rbac = include_str!("../../deploy/rbac.yaml");
    serde_yaml::Deserializer::from_str(rbac)
        .map(|d| -> Value { serde::Deserialize::deserialize(d).expect("deploy/rbac.yaml") })
        .find(|v| v["kind"] == "ClusterRole")
        .expect("a ClusterRole")
}

/// As [`start`], with a bearer token in the kubeconfig (for [`FakeApi::authorize`]).
fn start_with_token(
    api: &FakeApi,
    dir: &Scratch,
    st: Settings,
    token: &str,
) -> (kube::Source, Receiver<Vec<model::Service>>) {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_max_level(tracing::Level::INFO)
        .try_init();
    let kc = dir.path().join("kubeconfig-token");
    std::fs::write(
        &kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
             current-context: fake\nusers:\n- name: fake\n  user:\n    token: {token}\n",
            api.url()
        ),
    )
    .unwrap();
    let (tx, rx) = mpsc::channel();
    let src = kube::spawn_feed(Some(&kc), st, move |p: kubemodel::Publication| {
        let _ = tx.send(p.services.iter().map(|s| (**s).clone()).collect());
    })
    .unwrap();
    (src, rx)
}

/// A list the API server keeps refusing (here: RBAC without `list` on EndpointSlices) is
/// asked again after a back-off that grows, not at its shortest step every time.
#[test]
fn a_refused_list_is_retried_with_a_growing_back_off() {
    let (api, dir) = fake("refused-list");
    let mut role = deployed_cluster_role();
    for rule in role["rules"].as_array_mut().unwrap() {
        let slices = rule["resources"]
            .as_array()
            .is_some_and(|r| r.iter().any(|x| x == "endpointslices"));
        if slices {
            rule["verbs"] = json!(["get"]);
        }
    }
    let token = format!("strait-refused-{}", std::process::id());
    api.authorize(&token, &role);
    // Back-off from 100 ms doubling to 800 ms.
    let (_src, _rx) = start_with_token(&api, &dir, settings(), &token);
    let lists = || {
        api.denied()
            .iter()
            .filter(|r| r.contains("endpointslices") && !r.contains("watch="))
            .count()
    };
    eventually(10, "the first refused list", || lists() >= 1);
    std::thread::sleep(Duration::from_secs(5));
    // 0.1 + 0.2 + 0.4 + 0.8 + 0.8 ... s: about 9 in 5 s (jitter shortens a step by up to a
    // quarter); at the shortest step every time it would be about 60.
    let n = lists();
    assert!(
        (3..=20).contains(&n),
        "{n} refused lists in 5 s: {:#?}",
        api.denied()
    );
}

#[test]
fn namespace_selectors_pick_namespaces_by_label_with_match_expressions() {
    let obj = |spec: Value| -> StraitAddressPool {
        serde_json::from_value(pool_object("p", spec)).unwrap()
    };
    let labels = |v: Value| -> BTreeMap<String, String> { serde_json::from_value(v).unwrap() };
    let namespaces: BTreeMap<String, BTreeMap<String, String>> = [
        ("a", labels(json!({ "team": "a", "env": "prod" }))),
        ("b", labels(json!({ "team": "b", "env": "prod" }))),
        ("c", labels(json!({ "team": "c" }))),
        ("d", labels(json!({}))),
    ]
    .into_iter()
    .map(|(n, l)| (n.to_owned(), l))
    .collect();
    let ps = crd::pools_in(
        &obj(
            json!({ "addresses": ["192.0.2.0/30"], "serviceAllocation": {
            "namespaces": ["d"],
            "namespaceSelectors": [{
                "matchLabels": { "env": "prod" },
                "matchExpressions": [
                    { "key": "team", "operator": "NotIn", "values": ["b"] },
                    { "key": "env", "operator": "Exists" }
                ]
            }, {
                "matchExpressions": [{ "key": "team", "operator": "In", "values": ["c"] }]
            }]
        } }),
        ),
        &namespaces,
    )
    .unwrap();
    let scope = ps[0].scope.as_ref().unwrap();
    let none = BTreeMap::new();
    let admitted: Vec<&str> = ["a", "b", "c", "d", "e"]
        .into_iter()
        .filter(|n| scope.admits(n, &none))
        .collect();
    // a by the first selector, c by the second, d by name; b excluded by NotIn, e unknown.
    assert_eq!(admitted, ["a", "c", "d"]);
    // Without Namespaces known, only the named one.
    let ps = crd::pools_of(&obj(
        json!({ "addresses": ["192.0.2.0/30"], "serviceAllocation": {
        "namespaces": ["d"], "namespaceSelectors": [{ "matchLabels": { "env": "prod" } }] } }),
    ))
    .unwrap();
    let scope = ps[0].scope.as_ref().unwrap();
    assert!(scope.admits("d", &none) && !scope.admits("a", &none));

    for (sel, field, says) in [
        (
            json!({ "matchExpressions": [{ "key": "team", "operator": "Like", "values": ["a"] }] }),
            "spec.serviceAllocation.namespaceSelectors[0].matchExpressions[0].operator",
            "is not In, NotIn, Exists or DoesNotExist",
        ),
        (
            json!({ "matchExpressions": [{ "key": "team", "operator": "In" }] }),
            "spec.serviceAllocation.namespaceSelectors[0].matchExpressions[0].values",
            "needs values",
        ),
        (
            json!({ "matchExpressions": [{ "key": "team", "operator": "Exists", "values": ["x"] }] }),
            "spec.serviceAllocation.namespaceSelectors[0].matchExpressions[0].values",
            "takes no values",
        ),
    ] {
        let e = crd::pools_in(
            &obj(json!({ "addresses": ["192.0.2.0/30"],
                          "serviceAllocation": { "namespaceSelectors": [sel] } })),
            &namespaces,
        )
        .unwrap_err();
        assert_eq!(e.field, field, "{e}");
        assert!(e.reason.contains(says), "{e}");
    }
}

#[test]
fn a_namespace_selector_scopes_a_pool_and_follows_namespace_labels_live() {
    let (api, dir) = fake("ns-selector");
    api.apply(namespace("team-a", json!({ "team": "a" })));
    api.apply(namespace("team-b", json!({ "team": "b" })));
    api.apply(pool_object(
        "general",
        json!({ "addresses": ["203.0.113.16/29"] }),
    ));
    api.apply(pool_object(
        "team",
        json!({ "addresses": ["198.51.100.0/29"], "serviceAllocation": {
            "priority": 10,
            "namespaceSelectors": [{ "matchLabels": { "team": "a" } }]
        } }),
    ));
    api.apply(lb_in("team-a", "s1", 1));
    api.apply(lb_in("team-b", "s2", 2));
    // The gateway runs with exactly the permissions of deploy/rbac.yaml: a request it
    // does not grant (the Namespace watch, a pool status write) is refused with 403.
    let token = format!("strait-ns-{}", std::process::id());
    api.authorize(&token, &deployed_cluster_role());
    let mut st = settings();
    st.pools.clear();
    st.pool_objects = true;
    let (src, _rx) = start_with_token(&api, &dir, st, &token);
    eventually(20, "s1 from the team pool, s2 from the general one", || {
        status_ips_in(&api, "team-a", "s1") == ["198.51.100.1"]
            && status_ips_in(&api, "team-b", "s2") == ["203.0.113.17"]
    });
    assert_eq!(src.stats().lists(Kind::Namespaces), 1);
    // The pools' status writes and their echoes are over before the labels change, so
    // only the Namespace events can carry the change.
    eventually(10, "both pools show one address used", || {
        pool_status(&api, "team")["assigned"] == 1 && pool_status(&api, "general")["assigned"] == 1
    });
    std::thread::sleep(Duration::from_millis(500));

    // team-b joins the team: s2 keeps what it holds (as MetalLB: a scope change moves no
    // address); its next Service gets the team pool.
    api.apply(namespace("team-b", json!({ "team": "a" })));
    // And team-a leaves it: s1 keeps its address too.
    api.apply(namespace("team-a", json!({ "team": "x" })));
    // Wait until the gateway has seen both relabels: a new Service in each namespace.
    api.apply(lb_in("team-b", "s3", 3));
    eventually(10, "s3 from the team pool", || {
        status_ips_in(&api, "team-b", "s3") == ["198.51.100.2"]
    });
    api.apply(lb_in("team-a", "s4", 4));
    eventually(10, "s4 from the general pool", || {
        status_ips_in(&api, "team-a", "s4") == ["203.0.113.18"]
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(status_ips_in(&api, "team-a", "s1"), ["198.51.100.1"]);
    assert_eq!(status_ips_in(&api, "team-b", "s2"), ["203.0.113.17"]);
    assert!(api.denied().is_empty(), "refused: {:#?}", api.denied());
}

/// The pool's status, as stored.
fn pool_status(api: &FakeApi, name: &str) -> Value {
    api.get(Res::AddressPools, "", name)
        .map(|p| p["status"].clone())
        .unwrap_or(Value::Null)
}

fn condition(status: &Value, type_: &str) -> Value {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or(Value::Null)
}

/// Pool status writes of `name` so far.
fn pool_status_writes(api: &FakeApi, name: &str) -> usize {
    let path = format!("/straitaddresspools/{name}/status");
    api.requests()
        .iter()
        .filter(|r| r.starts_with("PATCH") && r.contains(&path))
        .count()
}

#[test]
fn pool_status_counts_used_and_free_addresses_and_names_a_bad_field() {
    let (api, dir) = fake("pool-status");
    // Two usable hosts: .33 and .34.
    api.apply(pool_object(
        "p",
        json!({ "addresses": ["203.0.113.32/30"] }),
    ));
    api.apply(lb("a", 1, HTTP, json!({})));
    let token = format!("strait-status-{}", std::process::id());
    api.authorize(&token, &deployed_cluster_role());
    let mut st = settings();
    st.pools.clear();
    st.pool_objects = true;
    let (_src, _rx) = start_with_token(&api, &dir, st, &token);
    let counts = |s: &Value| (s["assigned"].clone(), s["available"].clone());
    eventually(20, "p shows 1 used, 1 free", || {
        counts(&pool_status(&api, "p")) == (json!(1), json!(1))
    });
    let s = pool_status(&api, "p");
    let ready = condition(&s, "Ready");
    assert_eq!(ready["status"], "True", "{s:#}");
    assert_eq!(ready["reason"], "Serving");
    assert_eq!(ready["observedGeneration"], 1);
    assert!(ready["lastTransitionTime"].as_str().is_some(), "{s:#}");
    assert_eq!(condition(&s, "Invalid")["status"], "False");

    // Allocation: the pool is full.
    api.apply(lb("b", 2, HTTP, json!({})));
    eventually(10, "p shows 2 used, 0 free", || {
        counts(&pool_status(&api, "p")) == (json!(2), json!(0))
    });
    assert_eq!(
        condition(&pool_status(&api, "p"), "Ready")["reason"],
        "Exhausted"
    );
    let since = condition(&pool_status(&api, "p"), "Ready")["lastTransitionTime"].clone();
    assert_eq!(
        since, ready["lastTransitionTime"],
        "Ready stayed True: its transition time stands"
    );

    // Release.
    assert!(api.delete(Res::Services, "default", "a"));
    eventually(10, "p shows 1 used, 1 free again", || {
        counts(&pool_status(&api, "p")) == (json!(1), json!(1))
    });

    // Changes that move no count write nothing: a Node and a Service annotation.
    std::thread::sleep(Duration::from_millis(500));
    let writes = pool_status_writes(&api, "p");
    assert_eq!(
        writes,
        3,
        "one write per change of counts: {:#?}",
        api.requests()
    );
    api.apply(node("n3", "198.51.100.3"));
    api.apply(lb("b", 2, HTTP, json!({ "note": "touched" })));
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(pool_status_writes(&api, "p"), writes);

    // A refused pool: Invalid names the field, Ready is False.
    api.apply(pool_object(
        "bad",
        json!({ "addresses": ["203.0.113.64/30", "nonsense"] }),
    ));
    eventually(10, "bad is Invalid", || {
        condition(&pool_status(&api, "bad"), "Invalid")["status"] == "True"
    });
    let s = pool_status(&api, "bad");
    let invalid = condition(&s, "Invalid");
    assert_eq!(invalid["reason"], "InvalidField");
    let msg = invalid["message"].as_str().unwrap();
    assert!(
        msg.starts_with("spec.addresses[1]: ") && msg.contains("neither a CIDR"),
        "{msg}"
    );
    assert_eq!(condition(&s, "Ready")["status"], "False");
    assert_eq!(counts(&s), (json!(0), json!(0)));
    // One overlapping a pool before it: Invalid too, with the reason.
    api.apply(pool_object(
        "twin",
        json!({ "addresses": ["203.0.113.34/32"] }),
    ));
    eventually(10, "twin is Invalid (Overlap)", || {
        condition(&pool_status(&api, "twin"), "Invalid")["reason"] == "Overlap"
    });
    // Fixed: bad serves, with its four addresses (hosts of a /30: two).
    api.apply(pool_object(
        "bad",
        json!({ "addresses": ["203.0.113.64/30"] }),
    ));
    eventually(10, "bad is Ready", || {
        let s = pool_status(&api, "bad");
        condition(&s, "Ready")["status"] == "True"
            && condition(&s, "Invalid")["status"] == "False"
            && counts(&s) == (json!(0), json!(2))
            && condition(&s, "Ready")["observedGeneration"] == 2
    });
    assert!(api.denied().is_empty(), "refused: {:#?}", api.denied());
}

#[test]
fn only_the_lease_holder_writes_pool_status() {
    let (api, dir) = fake("pool-status-lease");
    // Another gateway leads, and keeps leading for the whole test.
    api.apply(json!({
        "kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
        "metadata": { "name": "strait-gateway", "namespace": "strait-system" },
        "spec": {
            "holderIdentity": "gw-other", "leaseDurationSeconds": 3600,
            "renewTime": "2026-01-01T00:00:00.000000Z", "leaseTransitions": 1
        }
    }));
    api.apply(pool_object(
        "p",
        json!({ "addresses": ["203.0.113.32/30"] }),
    ));
    api.apply(lb("a", 1, HTTP, json!({})));
    let mut st = settings();
    st.pools.clear();
    st.pool_objects = true;
    st.lease = Some(kubemodel::settings::LeaseSettings {
        namespace: "strait-system".into(),
        name: "strait-gateway".into(),
        identity: "gw-follower".into(),
        duration: Duration::from_secs(2),
    });
    let (_src, rx) = start(&api, &dir, st);
    until(&rx, 20, "a served from p", |l| {
        l.iter().any(|s| s.vip == ip("203.0.113.33"))
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        pool_status_writes(&api, "p"),
        0,
        "a follower writes no pool status"
    );
    assert_eq!(pool_status(&api, "p"), Value::Null);
    // The leader goes away (its Lease deleted): this gateway takes over and writes.
    assert!(api.delete(Res::Leases, "strait-system", "strait-gateway"));
    eventually(20, "the new leader writes p's status", || {
        pool_status(&api, "p")["assigned"] == 1
    });
}

#[test]
fn a_pool_counts_the_addresses_it_may_hand_out() {
    let size = |spec: Value| -> u128 {
        crd::pools_of(&serde_json::from_value(pool_object("p", spec)).unwrap())
            .unwrap()
            .iter()
            .map(pool::Pool::size)
            .sum()
    };
    // Hosts of a CIDR; every address of a range; .0 and .255 left out with avoidBuggyIps.
    assert_eq!(size(json!({ "addresses": ["203.0.113.32/30"] })), 2);
    assert_eq!(size(json!({ "addresses": ["203.0.113.32/32"] })), 1);
    assert_eq!(
        size(json!({ "addresses": ["198.51.100.250-198.51.101.5"] })),
        12
    );
    assert_eq!(
        size(json!({ "addresses": ["198.51.100.250-198.51.101.5"], "avoidBuggyIps": true })),
        10
    );
    assert_eq!(
        size(json!({ "addresses": ["192.0.2.0/24"], "avoidBuggyIps": true })),
        254
    );
    assert_eq!(size(json!({ "addresses": ["2001:db8:100::/120"] })), 255);
}
