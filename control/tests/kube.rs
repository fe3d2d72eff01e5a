//! Tests of the Kubernetes source (`control/src/kube/`): translation and address planning
//! as pure functions, the controller fed with hand-made watcher events, and the whole
//! source against the fake API server of `strait-testkit` (plain HTTP on 127.0.0.1, a
//! kubeconfig in a temporary directory; no cluster, no root, no other network).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ::kube::api::DynamicObject;
use ::kube::runtime::watcher::Event;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{json, Value};
use strait_config::model::{self, BackendState, HealthKind, Mode, Protocol};

use strait_control::kube;
use strait_control::kubemodel;
use strait_control::kubemodel::pool::{self, Allocator};
use strait_control::kubemodel::settings::Settings;
use strait_control::kubemodel::translate::{self, Cluster, Translation, WarningKind};
use strait_control::kubemodel::Controller;
use strait_control::kubemodel::Kind;
use strait_testkit::config::GatewayToml;
use strait_testkit::fake_api::{FakeApi, Res};
use strait_testkit::harness::Scratch;
use strait_testkit::objects::{lb_service, node, with_status, CLASS};

mod common;
use common::{eventually, start, until};

// ---- objects ------------------------------------------------------------------------

fn gateway() -> model::Gateway {
    strait_config::parse("[[gateway.interfaces]]\nname = \"eth0\"\nqueues = [0]\n")
        .unwrap()
        .gateway
}

fn settings(mode: Mode) -> Settings {
    let mut s = Settings::new(gateway());
    s.mode = mode;
    s.pools = vec!["203.0.113.16/29".parse().unwrap()];
    s.backoff = (Duration::from_millis(100), Duration::from_millis(800));
    s
}

fn node_v6(name: &str, ip4: &str, ip6: &str) -> Value {
    let mut n = node(name, ip4);
    n["status"]["addresses"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "type": "InternalIP", "address": ip6 }));
    n
}

/// A LoadBalancer Service of our class with one TCP port `http` 80 -> 8080.
fn lb(name: &str) -> Value {
    json!({
        "kind": "Service", "apiVersion": "v1",
        "metadata": { "name": name, "namespace": "default", "uid": format!("uid-{name}") },
        "spec": {
            "type": "LoadBalancer",
            "loadBalancerClass": CLASS,
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "externalTrafficPolicy": "Cluster",
            "ports": [{ "name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080 }]
        }
    })
}

fn ep(
    addr: &str,
    node: &str,
    ready: Option<bool>,
    serving: Option<bool>,
    terminating: Option<bool>,
) -> Value {
    let mut c = serde_json::Map::new();
    if let Some(r) = ready {
        c.insert("ready".into(), json!(r));
    }
    if let Some(s) = serving {
        c.insert("serving".into(), json!(s));
    }
    if let Some(t) = terminating {
        c.insert("terminating".into(), json!(t));
    }
    json!({ "addresses": [addr], "nodeName": node, "conditions": c })
}

fn ready(addr: &str, node: &str) -> Value {
    ep(addr, node, Some(true), Some(true), Some(false))
}

/// An IPv4 EndpointSlice of `svc` with port `http` 8080.
fn slice(name: &str, svc: &str, endpoints: Vec<Value>) -> Value {
    json!({
        "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": name, "namespace": "default", "uid": format!("uid-slice-{name}"),
            "labels": { "kubernetes.io/service-name": svc }
        },
        "addressType": "IPv4",
        "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
        "endpoints": endpoints
    })
}

fn three_nodes() -> Vec<Value> {
    vec![
        node("n1", "198.51.100.1"),
        node("n2", "198.51.100.2"),
        node("n3", "198.51.100.3"),
    ]
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The LoadBalancer address of most translations: 203.0.113.17 for `default/web`.
const WEB_17: &[(&str, &[&str])] = &[("default/web", &["203.0.113.17"])];

/// Translates `objects` with LoadBalancer addresses `lb`.
fn tr(settings: &Settings, objects: &[Value], lb: &[(&str, &[&str])]) -> Translation {
    let mut services = BTreeMap::new();
    let mut slices = BTreeMap::new();
    let mut nodes = BTreeMap::new();
    for (i, o) in objects.iter().enumerate() {
        let mut o = o.clone();
        // Creation order = list order, as the fake API server does it.
        o["metadata"]["creationTimestamp"] = json!(format!("2024-01-01T00:00:{i:02}Z"));
        match o["kind"].as_str().unwrap() {
            "Service" => {
                let s: Service = serde_json::from_value(o).unwrap();
                services.insert(kubemodel::object_key(&s.metadata), s);
            }
            "EndpointSlice" => {
                let s: EndpointSlice = serde_json::from_value(o).unwrap();
                slices.insert(kubemodel::object_key(&s.metadata), s);
            }
            "Node" => {
                let n: Node = serde_json::from_value(o).unwrap();
                nodes.insert(kubemodel::object_key(&n.metadata), n);
            }
            k => panic!("kind {k}"),
        }
    }
    let lb: BTreeMap<String, Vec<IpAddr>> = lb
        .iter()
        .map(|(k, v)| (k.to_string(), v.iter().map(|a| ip(a)).collect()))
        .collect();
    let t = translate::translate(
        settings,
        Cluster {
            services: &services,
            slices: &slices,
            nodes: &nodes,
        },
        &lb,
    );
    // Whatever comes out passes the configuration's own validation as a whole.
    let cfg = model::Config {
        gateway: settings.gateway.clone(),
        services: t.services.clone(),
    };
    let reparsed = strait_config::parse(&strait_config::to_toml(&cfg))
        .unwrap_or_else(|e| panic!("translation output does not validate:\n{e}"));
    assert_eq!(reparsed.services, t.services);
    t
}

fn find<'a>(t: &'a Translation, name: &str) -> &'a model::Service {
    t.services
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no service {name} in {:#?}", names(&t.services)))
}

fn names(s: &[model::Service]) -> Vec<&str> {
    s.iter().map(|s| s.name.as_str()).collect()
}

fn backends(s: &model::Service) -> Vec<(String, BackendState)> {
    s.backends
        .iter()
        .map(|b| (b.socket_addr().to_string(), b.state))
        .collect()
}

fn count(t: &Translation, k: WarningKind) -> usize {
    t.warnings.iter().filter(|w| w.kind == k).count()
}

// ---- translation --------------------------------------------------------------------

#[test]
fn nat_endpoints_by_condition_with_the_slice_port() {
    let mut objs = three_nodes();
    objs.push(lb("web"));
    objs.push(slice(
        "web-a",
        "web",
        vec![
            ready("192.0.2.11", "n1"),
            ep("192.0.2.12", "n2", None, None, None), // nil conditions: ready
            ep("192.0.2.13", "n2", Some(false), Some(true), Some(true)), // terminating, serving
            ep("192.0.2.14", "n3", Some(false), Some(false), Some(true)), // terminating, not serving
            ep("192.0.2.15", "n3", Some(false), Some(false), None),       // not ready
        ],
    ));
    let t = tr(&settings(Mode::Nat), &objs, WEB_17);
    assert_eq!(names(&t.services), ["default/web/http/203.0.113.17"]);
    let s = &t.services[0];
    assert_eq!(
        (s.vip, s.port, s.protocol, s.mode),
        (ip("203.0.113.17"), 80, Protocol::Tcp, Mode::Nat)
    );
    assert_eq!(
        backends(s),
        [
            ("192.0.2.11:8080".to_owned(), BackendState::Active),
            ("192.0.2.12:8080".to_owned(), BackendState::Active),
            ("192.0.2.13:8080".to_owned(), BackendState::Draining),
        ]
    );
    assert!(s.backends.iter().all(|b| b.mac.is_none()));
    assert_eq!(s.maglev_table_size, 2_039, "sized from 3 backends");
    assert_eq!(s.session_affinity, None);
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
}

#[test]
fn an_endpoint_in_two_slices_counts_once_and_not_ready_ones_publish_when_asked() {
    let mut objs = three_nodes();
    let mut svc = lb("web");
    objs.push(slice(
        "web-a",
        "web",
        vec![
            ready("192.0.2.11", "n1"),
            ep("192.0.2.12", "n2", Some(false), Some(true), Some(true)),
        ],
    ));
    objs.push(slice(
        "web-b",
        "web",
        vec![ready("192.0.2.11", "n1"), ready("192.0.2.12", "n2")],
    ));
    objs.push(svc.clone());
    let t = tr(&settings(Mode::Nat), &objs, WEB_17);
    assert_eq!(
        backends(&t.services[0]),
        [
            ("192.0.2.11:8080".to_owned(), BackendState::Active),
            ("192.0.2.12:8080".to_owned(), BackendState::Active),
        ],
        "the active copy wins"
    );

    svc["spec"]["publishNotReadyAddresses"] = json!(true);
    let objs = vec![
        svc,
        slice(
            "web-a",
            "web",
            vec![
                ep("192.0.2.11", "n1", Some(false), Some(false), None),
                ep("192.0.2.12", "n1", Some(false), Some(true), Some(true)),
            ],
        ),
    ];
    let t = tr(&settings(Mode::Nat), &objs, WEB_17);
    assert_eq!(
        backends(&t.services[0]),
        [
            ("192.0.2.11:8080".to_owned(), BackendState::Active),
            ("192.0.2.12:8080".to_owned(), BackendState::Active),
        ]
    );
}

#[test]
fn dsr_cluster_policy_balances_over_ready_nodes() {
    let mut objs = three_nodes();
    objs[1]["status"]["conditions"][0]["status"] = json!("Unknown");
    objs.push(node("n4", "198.51.100.4"));
    objs[3]["metadata"]["labels"] =
        json!({ "node.kubernetes.io/exclude-from-external-load-balancers": "" });
    objs.push(
        json!({ "kind": "Node", "apiVersion": "v1", "metadata": { "name": "n5" }, "status": {} }),
    );
    objs.push(lb("web"));
    objs.push(slice("web-a", "web", vec![ready("192.0.2.11", "n1")]));
    let t = tr(&settings(Mode::DsrL2), &objs, WEB_17);
    let s = find(&t, "default/web/http/203.0.113.17");
    assert_eq!(s.mode, Mode::DsrL2);
    assert_eq!(
        backends(s),
        [
            ("198.51.100.1:80".to_owned(), BackendState::Active),
            ("198.51.100.2:80".to_owned(), BackendState::Draining), // NotReady node
            ("198.51.100.3:80".to_owned(), BackendState::Active),
        ]
    );
    assert_eq!(s.health_check, None);
    assert_eq!(count(&t, WarningKind::NodeWithoutAddress), 1);

    let mut st = settings(Mode::DsrGue);
    st.cluster_node_check = Some((10256, "/healthz".into()));
    let t = tr(&st, &objs, WEB_17);
    let hc = t.services[0].health_check.as_ref().unwrap();
    assert_eq!(
        (hc.port, &hc.kind),
        (
            Some(10256),
            &HealthKind::Http {
                path: "/healthz".into()
            }
        )
    );
}

#[test]
fn dsr_local_policy_uses_nodes_with_endpoints_checked_on_the_health_node_port() {
    let mut objs = three_nodes();
    let mut svc = lb("web");
    svc["spec"]["externalTrafficPolicy"] = json!("Local");
    svc["spec"]["healthCheckNodePort"] = json!(32100);
    objs.push(svc);
    objs.push(slice(
        "web-a",
        "web",
        vec![
            ready("192.0.2.11", "n1"),
            ready("192.0.2.12", "n1"),
            ep("192.0.2.13", "n2", Some(false), Some(true), Some(true)),
            ep("192.0.2.14", "n3", Some(false), Some(false), None),
            ready("192.0.2.15", "gone-node"),
        ],
    ));
    let t = tr(&settings(Mode::DsrIpip), &objs, WEB_17);
    let s = &t.services[0];
    assert_eq!(
        backends(s),
        [
            ("198.51.100.1:80".to_owned(), BackendState::Active),
            ("198.51.100.2:80".to_owned(), BackendState::Draining),
        ]
    );
    let hc = s.health_check.as_ref().unwrap();
    assert_eq!(hc.port, Some(32100));
    assert_eq!(
        hc.kind,
        HealthKind::Http {
            path: "/healthz".into()
        }
    );
}

#[test]
fn only_our_class_unless_classless_is_taken() {
    let mut other = lb("other");
    other["spec"]["loadBalancerClass"] = json!("example.com/lb");
    let mut classless = lb("plain");
    classless["spec"]
        .as_object_mut()
        .unwrap()
        .remove("loadBalancerClass");
    let svcs = [lb("web"), other.clone(), classless.clone()];
    let owned = |st: &Settings| -> Vec<String> {
        svcs.iter()
            .map(|v| serde_json::from_value::<Service>(v.clone()).unwrap())
            .filter(|s| translate::owns(st, s))
            .map(|s| s.metadata.name.unwrap())
            .collect()
    };
    let mut st = settings(Mode::Nat);
    assert_eq!(owned(&st), ["web"]);
    st.classless = true;
    assert_eq!(owned(&st), ["web", "plain"]);
}

#[test]
fn node_ports_external_ips_udp_and_sctp() {
    let mut st = settings(Mode::Nat);
    st.node_port_address = Some(ip("192.0.2.1"));
    st.all_external_ips = true;
    let svc = json!({
        "kind": "Service", "apiVersion": "v1",
        "metadata": { "name": "dns", "namespace": "kube-system" },
        "spec": {
            "type": "NodePort",
            "externalIPs": ["198.51.100.53", "not-an-ip"],
            "ports": [
                { "name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053 },
                { "name": "dns-tcp", "port": 53, "protocol": "TCP", "nodePort": 30054 },
                { "name": "sig", "port": 9, "protocol": "SCTP", "nodePort": 30055 },
                { "name": "odd", "port": 10, "protocol": "DCCP", "nodePort": 30056 }
            ]
        }
    });
    let sl = json!({
        "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
        "metadata": { "name": "dns-1", "namespace": "kube-system", "labels": { "kubernetes.io/service-name": "dns" } },
        "addressType": "IPv4",
        "ports": [
            { "name": "dns", "port": 5353, "protocol": "UDP" },
            { "name": "dns-tcp", "port": 5353, "protocol": "TCP" },
            { "name": "sig", "port": 9999, "protocol": "SCTP" }
        ],
        "endpoints": [ready("192.0.2.21", "n1")]
    });
    let t = tr(&st, &[svc, sl], &[]);
    assert_eq!(
        names(&t.services),
        [
            "kube-system/dns/dns-tcp/198.51.100.53",
            "kube-system/dns/dns-tcp/node-port",
            "kube-system/dns/dns/198.51.100.53",
            "kube-system/dns/dns/node-port",
            "kube-system/dns/sig/198.51.100.53",
            "kube-system/dns/sig/node-port",
        ]
    );
    // SCTP is served like TCP and UDP: one service per frontend, to the slice's port.
    let sig = find(&t, "kube-system/dns/sig/198.51.100.53");
    assert_eq!((sig.port, sig.protocol), (9, Protocol::Sctp));
    assert_eq!(
        backends(sig),
        [("192.0.2.21:9999".to_owned(), BackendState::Active)]
    );
    let sig_np = find(&t, "kube-system/dns/sig/node-port");
    assert_eq!(
        (sig_np.vip, sig_np.port, sig_np.protocol),
        (ip("192.0.2.1"), 30055, Protocol::Sctp)
    );
    let np = find(&t, "kube-system/dns/dns/node-port");
    assert_eq!(
        (np.vip, np.port, np.protocol),
        (ip("192.0.2.1"), 30053, Protocol::Udp)
    );
    assert_eq!(
        backends(np),
        [("192.0.2.21:5353".to_owned(), BackendState::Active)]
    );
    let ext = find(&t, "kube-system/dns/dns-tcp/198.51.100.53");
    assert_eq!((ext.port, ext.protocol), (53, Protocol::Tcp));
    // Only the protocol the API server would never send is left out.
    assert_eq!(
        count(&t, WarningKind::UnsupportedProtocol),
        1,
        "{:?}",
        t.warnings
    );
    assert!(
        t.warnings
            .iter()
            .any(|w| w.kind == WarningKind::UnsupportedProtocol && w.message.contains("DCCP")),
        "{:?}",
        t.warnings
    );
    assert_eq!(count(&t, WarningKind::BadAddress), 1, "{:?}", t.warnings);
}

#[test]
fn affinity_source_ranges_and_mode_annotation() {
    let mut svc = lb("web");
    svc["spec"]["sessionAffinity"] = json!("ClientIP");
    svc["spec"]["loadBalancerSourceRanges"] = json!(["192.0.2.0/24", "198.51.100.7/32", "bogus"]);
    svc["metadata"]["annotations"] = json!({ "strait.dev/mode": "dsr-gue" });
    let mut objs = three_nodes();
    objs.push(svc.clone());
    let t = tr(&settings(Mode::Nat), &objs, WEB_17);
    let s = &t.services[0];
    assert_eq!(s.session_affinity, Some(Duration::from_secs(10_800)));
    assert_eq!(
        s.source_ranges,
        [
            "192.0.2.0/24".parse().unwrap(),
            "198.51.100.7/32".parse().unwrap()
        ] as [ipnet::IpNet; 2]
    );
    assert_eq!(s.mode, Mode::DsrGue);
    assert_eq!(s.backends.len(), 3, "nodes, as dsr-gue");
    assert_eq!(count(&t, WarningKind::BadSourceRange), 1);

    svc["spec"]["sessionAffinityConfig"] = json!({ "clientIP": { "timeoutSeconds": 60 } });
    svc["metadata"]["annotations"] = json!({ "strait.dev/mode": "teleport" });
    // Only IPv6 ranges: the IPv4 frontend would be open to everyone; it is left out.
    svc["spec"]["loadBalancerSourceRanges"] = json!(["2001:db8::/32"]);
    let mut objs = three_nodes();
    objs.push(svc);
    let t = tr(&settings(Mode::Nat), &objs, WEB_17);
    assert!(t.services.is_empty());
    assert_eq!(count(&t, WarningKind::BadSourceRange), 1);
    assert_eq!(count(&t, WarningKind::BadValue), 1, "unknown mode");
}

#[test]
fn route_attribute_annotations() {
    let mut svc = lb("web");
    svc["metadata"]["annotations"] = json!({
        "strait.dev/bgp-communities": "64512:100, large:64512:1:2,65000:7",
        "strait.dev/bgp-large-communities": "4200000000:3:4",
        "strait.dev/bgp-local-pref": "250",
    });
    let mut objs = three_nodes();
    objs.push(svc.clone());
    let t = tr(&settings(Mode::Nat), &objs, WEB_17);
    let r = &t.services[0].route;
    assert_eq!(r.communities, [(64512, 100), (65000, 7)]);
    assert_eq!(r.large_communities, [(64512, 1, 2), (4_200_000_000, 3, 4)]);
    assert_eq!(r.local_pref, Some(250));
    assert_eq!(count(&t, WarningKind::BadValue), 0, "{:?}", t.warnings);

    // Values that do not parse are left out, each with a warning; the rest holds.
    svc["metadata"]["annotations"] = json!({
        "strait.dev/bgp-communities": "64512:100,70000:1,large:1:2",
        "strait.dev/bgp-local-pref": "high",
    });
    let mut objs = three_nodes();
    objs.push(svc);
    let t = tr(&settings(Mode::Nat), &objs, WEB_17);
    let r = &t.services[0].route;
    assert_eq!(r.communities, [(64512, 100)]);
    assert!(r.large_communities.is_empty() && r.local_pref.is_none());
    assert_eq!(count(&t, WarningKind::BadValue), 3, "{:?}", t.warnings);
}

#[test]
fn slow_start_annotation() {
    let mut svc = lb("web");
    let t = tr(
        &settings(Mode::Nat),
        &[three_nodes(), vec![svc.clone()]].concat(),
        WEB_17,
    );
    assert_eq!(t.services[0].slow_start, None, "off by default");

    svc["metadata"]["annotations"] = json!({ "strait.dev/slow-start": "30s" });
    let t = tr(
        &settings(Mode::Nat),
        &[three_nodes(), vec![svc.clone()]].concat(),
        WEB_17,
    );
    assert_eq!(t.services[0].slow_start, Some(Duration::from_secs(30)));
    assert_eq!(count(&t, WarningKind::BadValue), 0, "{:?}", t.warnings);

    // What the file's `slow_start` refuses is left out with a warning; the Service stays.
    for bad in ["soon", "1500ms", "0s", "2h"] {
        svc["metadata"]["annotations"] = json!({ "strait.dev/slow-start": bad });
        let t = tr(
            &settings(Mode::Nat),
            &[three_nodes(), vec![svc.clone()]].concat(),
            WEB_17,
        );
        assert_eq!(t.services[0].slow_start, None, "{bad}");
        assert_eq!(
            count(&t, WarningKind::BadValue),
            1,
            "{bad}: {:?}",
            t.warnings
        );
    }
}

#[test]
fn ipv6_frontends_pick_ipv6_nodes_and_sanitised_names() {
    let objs = vec![
        node_v6("n1", "198.51.100.1", "2001:db8:1::1"),
        node("n2", "198.51.100.2"),
        lb("web"),
    ];
    let t = tr(
        &settings(Mode::DsrL2),
        &objs,
        &[("default/web", &["203.0.113.17", "2001:db8:ff::17"])],
    );
    assert_eq!(
        names(&t.services),
        [
            "default/web/http/2001-db8-ff--17",
            "default/web/http/203.0.113.17"
        ]
    );
    assert_eq!(
        backends(find(&t, "default/web/http/2001-db8-ff--17")),
        [("[2001:db8:1::1]:80".to_owned(), BackendState::Active)]
    );
    assert_eq!(find(&t, "default/web/http/203.0.113.17").backends.len(), 2);
}

#[test]
fn malformed_objects_are_skipped_and_counted_never_a_panic() {
    let mut objs = three_nodes();
    objs.push(lb("web"));
    let mut fqdn = slice("web-fqdn", "web", vec![ready("example.com", "n1")]);
    fqdn["addressType"] = json!("FQDN");
    objs.push(fqdn);
    let mut noports = slice("web-noports", "web", vec![ready("192.0.2.31", "n1")]);
    noports.as_object_mut().unwrap().remove("ports");
    objs.push(noports);
    let huge: Vec<Value> = (0..1001)
        .map(|i| ready(&format!("192.0.{}.{}", 100 + i / 250, i % 250 + 1), "n1"))
        .collect();
    objs.push(slice("web-huge", "web", huge));
    let mut badport = slice("web-badport", "web", vec![ready("192.0.2.32", "n1")]);
    badport["ports"][0].as_object_mut().unwrap().remove("port");
    objs.push(badport);
    objs.push(slice(
        "web-ok",
        "web",
        vec![
            ready("192.0.2.33", "n1"),
            ready("not-an-ip", "n1"),
            ready("2001:db8::1", "n1"), // IPv6 in an IPv4 slice
            json!({ "addresses": [], "conditions": {} }),
        ],
    ));
    let mut zero = lb("zero");
    zero["spec"]["ports"] = json!([{ "name": "a", "port": 0 }, { "name": "b", "port": 70000 }]);
    objs.push(zero);
    objs.push(json!({ "kind": "Service", "apiVersion": "v1", "metadata": { "name": "nospec", "namespace": "default" } }));
    let mut noports_svc = lb("noports");
    noports_svc["spec"].as_object_mut().unwrap().remove("ports");
    objs.push(noports_svc);
    let t = tr(
        &settings(Mode::Nat),
        &objs,
        &[
            ("default/web", &["203.0.113.17"]),
            ("default/zero", &["203.0.113.18"]),
            ("default/noports", &["203.0.113.19"]),
        ],
    );
    assert_eq!(names(&t.services), ["default/web/http/203.0.113.17"]);
    assert_eq!(
        backends(&t.services[0]),
        [("192.0.2.33:8080".to_owned(), BackendState::Active)]
    );
    assert_eq!(count(&t, WarningKind::UnsupportedSlice), 1);
    assert_eq!(count(&t, WarningKind::SliceWithoutPorts), 1);
    assert_eq!(count(&t, WarningKind::HugeSlice), 1);
    assert_eq!(count(&t, WarningKind::BadAddress), 3, "{:#?}", t.warnings);
    assert_eq!(count(&t, WarningKind::BadPort), 3, "{:#?}", t.warnings);
}

#[test]
fn the_older_service_keeps_a_contested_frontend() {
    let mut a = lb("a");
    a["spec"]["type"] = json!("ClusterIP");
    a["spec"]["externalIPs"] = json!(["198.51.100.80"]);
    let mut b = a.clone();
    b["metadata"]["name"] = json!("b");
    let mut st = settings(Mode::Nat);
    assert!(
        tr(&st, &[a.clone(), b.clone()], &[]).services.is_empty(),
        "not ours"
    );
    st.all_external_ips = true;
    let t = tr(&st, &[a, b], &[]);
    assert_eq!(names(&t.services), ["default/a/http/198.51.100.80"]);
    assert_eq!(count(&t, WarningKind::FrontendConflict), 1);
    assert!(
        t.warnings[0].message.contains("default/a"),
        "{}",
        t.warnings[0]
    );
}

#[test]
fn the_maglev_table_is_sized_for_the_endpoints_that_take_new_flows() {
    let size = |taking: usize, terminating: usize| {
        let eps: Vec<Value> = (0..taking + terminating)
            .map(|i| {
                let a = format!("192.0.2.{}", i + 1);
                if i < taking {
                    ready(&a, "n1")
                } else {
                    ep(&a, "n1", Some(false), Some(true), Some(true))
                }
            })
            .collect();
        let t = tr(
            &settings(Mode::Nat),
            &[lb("web"), slice("web-1", "web", eps)],
            &[("default/web", &["203.0.113.17"])],
        );
        assert_eq!(t.services[0].backends.len(), taking + terminating);
        t.services[0].maglev_table_size
    };
    // 100 slots per endpoint taking new flows: a rollout's terminating endpoints do not
    // push a 20-replica Service into the next size.
    assert_eq!(size(20, 0), 2_039);
    assert_eq!(size(20, 5), 2_039);
    assert_eq!(size(21, 0), 16_381);
}

#[test]
fn large_backend_sets_get_the_large_maglev_table() {
    let eps: Vec<Value> = (0..700)
        .map(|i| ready(&format!("192.0.{}.{}", 100 + i / 250, i % 250 + 1), "n1"))
        .collect();
    let t = tr(
        &settings(Mode::Nat),
        &[lb("big"), slice("big-1", "big", eps)],
        &[("default/big", &["203.0.113.17"])],
    );
    assert_eq!(t.services[0].backends.len(), 700);
    assert_eq!(t.services[0].maglev_table_size, 655_373);
}

#[test]
fn a_refused_service_is_dropped_with_the_rule_named() {
    // IPv6 VIPs need an MTU of at least 1280: the gateway's 576 refuses them.
    let mut g = strait_config::parse(&GatewayToml::eth0().set("mtu", 576).to_string())
        .unwrap()
        .gateway;
    g.default_mode = Mode::Nat;
    let mut st = Settings::new(g);
    st.mode = Mode::DsrL2;
    let objs = vec![node_v6("n1", "198.51.100.1", "2001:db8:1::1"), lb("web")];
    let t = tr(
        &st,
        &objs,
        &[("default/web", &["203.0.113.17", "2001:db8:ff::17"])],
    );
    assert_eq!(names(&t.services), ["default/web/http/203.0.113.17"]);
    assert_eq!(count(&t, WarningKind::Invalid), 1, "{:#?}", t.warnings);
}

// ---- address planning ---------------------------------------------------------------

fn svc(name: &str, age: u32, status: &[&str], annotation: Option<&str>) -> Service {
    let annotations = match annotation {
        Some(a) => json!({ "strait.dev/load-balancer-ip": a }),
        None => json!({}),
    };
    let mut v = lb_service(name, age, &[("http", "TCP", 80)], annotations);
    if !status.is_empty() {
        v = with_status(v, status);
    }
    serde_json::from_value(v).unwrap()
}

/// One planning round over `svcs` (oldest first), owning those of our class.
fn plan(a: &mut Allocator, svcs: &[&Service]) -> pool::AddressPlan {
    let st = settings(Mode::Nat);
    pool::plan(a, svcs, |s| translate::owns(&st, s))
}

fn reasons(p: &pool::AddressPlan) -> Vec<(String, String)> {
    p.notices
        .iter()
        .map(|n| (n.key(), n.reason.clone()))
        .collect()
}

fn pools(s: &[&str]) -> Vec<ipnet::IpNet> {
    s.iter().map(|p| p.parse().unwrap()).collect()
}

#[test]
fn allocation_writes_status_and_requests_are_honoured_inside_pools_only() {
    let mut a = Allocator::new(&pools(&["203.0.113.16/29"]));
    let svcs = [
        svc("a", 1, &[], None),
        svc("b", 2, &[], Some("203.0.113.20")),
        svc("c", 3, &[], Some("198.51.100.9")),
        svc("d", 4, &[], Some("bogus")),
    ];
    let refs: Vec<&Service> = svcs.iter().collect();
    let p = plan(&mut a, &refs);
    assert_eq!(p.assigned["default/a"], [ip("203.0.113.17")]);
    assert_eq!(p.assigned["default/b"], [ip("203.0.113.20")]);
    assert!(!p.assigned.contains_key("default/c"));
    assert_eq!(
        p.assigned["default/d"],
        [ip("203.0.113.18")],
        "an unparsable request falls back to allocation"
    );
    let status: Vec<(&str, Vec<IpAddr>)> = p
        .status
        .iter()
        .map(|s| (s.name.as_str(), s.addresses.clone()))
        .collect();
    assert_eq!(
        status,
        [
            ("a", vec![ip("203.0.113.17")]),
            ("b", vec![ip("203.0.113.20")]),
            ("d", vec![ip("203.0.113.18")])
        ]
    );
    let r = reasons(&p);
    assert!(
        r.contains(&("default/c".into(), "AddressNotInPool".into())),
        "{r:?}"
    );
    assert!(
        r.contains(&("default/d".into(), "InvalidAddress".into())),
        "{r:?}"
    );
    let msg = &p
        .notices
        .iter()
        .find(|n| n.reason == "AddressNotInPool")
        .unwrap()
        .message;
    assert!(
        msg.contains("requested address 198.51.100.9 not in any pool"),
        "{msg}"
    );
}

#[test]
fn exhaustion_is_a_warning_and_deletion_releases() {
    let mut a = Allocator::new(&pools(&["203.0.113.16/30"])); // .17 and .18
    let svcs = [
        svc("a", 1, &[], None),
        svc("b", 2, &[], None),
        svc("c", 3, &[], None),
    ];
    let refs: Vec<&Service> = svcs.iter().collect();
    let p = plan(&mut a, &refs);
    assert_eq!(p.assigned.len(), 2);
    let ex = p
        .notices
        .iter()
        .find(|n| n.reason == "PoolExhausted")
        .expect("an exhaustion notice");
    assert_eq!(ex.key(), "default/c");
    assert_eq!(ex.type_, kubemodel::events::NoticeType::Warning);

    // "a" deleted: its address goes to "c".
    let refs: Vec<&Service> = svcs[1..].iter().collect();
    let p = plan(&mut a, &refs);
    assert_eq!(p.assigned["default/c"], [ip("203.0.113.17")]);
    assert!(p.notices.iter().all(|n| n.reason != "PoolExhausted"));
}

#[test]
fn no_double_allocation_across_a_restart() {
    // Before the restart "b" got .17 and its status says so. "a" is older but new to us.
    let svcs = [svc("a", 1, &[], None), svc("b", 2, &["203.0.113.17"], None)];
    let refs: Vec<&Service> = svcs.iter().collect();
    let mut fresh = Allocator::new(&pools(&["203.0.113.16/29"]));
    let p = plan(&mut fresh, &refs);
    assert_eq!(p.assigned["default/b"], [ip("203.0.113.17")]);
    assert_eq!(p.assigned["default/a"], [ip("203.0.113.18")]);
    assert_eq!(p.status.len(), 1, "only the new one is written");
    assert_eq!(fresh.owner(ip("203.0.113.17")), Some("default/b"));

    // Two statuses claiming one address: the older keeps it.
    let svcs = [
        svc("x", 1, &["203.0.113.17"], None),
        svc("y", 2, &["203.0.113.17"], None),
    ];
    let refs: Vec<&Service> = svcs.iter().collect();
    let mut fresh = Allocator::new(&pools(&["203.0.113.16/29"]));
    let p = plan(&mut fresh, &refs);
    assert_eq!(p.assigned["default/x"], [ip("203.0.113.17")]);
    assert_eq!(p.assigned["default/y"], [ip("203.0.113.18")]);
    assert!(reasons(&p).contains(&("default/y".into(), "AddressInUse".into())));
}

#[test]
fn a_changed_request_moves_the_service() {
    let mut a = Allocator::new(&pools(&["203.0.113.16/29"]));
    let s1 = svc("a", 1, &["203.0.113.17"], None);
    plan(&mut a, &[&s1]);
    let s2 = svc("a", 1, &["203.0.113.17"], Some("203.0.113.21"));
    let p = plan(&mut a, &[&s2]);
    assert_eq!(p.assigned["default/a"], [ip("203.0.113.21")]);
    assert_eq!(p.status[0].addresses, [ip("203.0.113.21")]);
    assert_eq!(
        a.owner(ip("203.0.113.17")),
        None,
        "the old address is free again"
    );
}

#[test]
fn dual_stack_services_get_one_address_per_family() {
    let mut a = Allocator::new(&pools(&["203.0.113.16/29", "2001:db8:ff::/120"]));
    let mut v = lb("ds");
    v["spec"]["ipFamilies"] = json!(["IPv6", "IPv4"]);
    v["spec"]["ipFamilyPolicy"] = json!("PreferDualStack");
    let s: Service = serde_json::from_value(v.clone()).unwrap();
    let p = plan(&mut a, &[&s]);
    assert_eq!(
        p.assigned["default/ds"],
        [ip("2001:db8:ff::1"), ip("203.0.113.17")],
        "primary family first"
    );

    let mut only4 = Allocator::new(&pools(&["203.0.113.16/29"]));
    let p = plan(&mut only4, &[&s]);
    assert_eq!(p.assigned["default/ds"], [ip("203.0.113.17")]);
    assert!(
        p.notices
            .iter()
            .all(|n| n.type_ == kubemodel::events::NoticeType::Normal),
        "PreferDualStack is content"
    );

    v["spec"]["ipFamilyPolicy"] = json!("RequireDualStack");
    let s: Service = serde_json::from_value(v).unwrap();
    let mut only4 = Allocator::new(&pools(&["203.0.113.16/29"]));
    let p = plan(&mut only4, &[&s]);
    assert!(reasons(&p).contains(&("default/ds".into(), "NoAddressPool".into())));
    assert!(p.assigned.is_empty(), "RequireDualStack: both or none");
    assert_eq!(only4.count(), 0);
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

/// Panics if two Services' statuses show one address.
fn assert_owned_once(svcs: &[Service]) {
    let mut seen: BTreeMap<IpAddr, &str> = BTreeMap::new();
    for s in svcs {
        let name = s.metadata.name.as_deref().unwrap();
        for a in pool::status_addresses(s) {
            if let Some(other) = seen.insert(a, name) {
                panic!("{a} shows in the statuses of {other} and {name}");
            }
        }
    }
}

fn refs(svcs: &[Service]) -> Vec<&Service> {
    svcs.iter().collect()
}

#[test]
fn requests_are_honoured_before_anything_is_allocated() {
    // One round (one list): the older Service asks for nothing, the newer for .17.
    let mut a = Allocator::new(&pools(&["203.0.113.16/29"]));
    let svcs = [
        svc("old", 1, &[], None),
        svc("new", 2, &[], Some("203.0.113.17")),
    ];
    let p = plan(&mut a, &refs(&svcs));
    assert_eq!(p.assigned["default/new"], [ip("203.0.113.17")]);
    assert_eq!(p.assigned["default/old"], [ip("203.0.113.18")]);
    assert!(
        p.notices
            .iter()
            .all(|n| n.type_ == kubemodel::events::NoticeType::Normal),
        "{:?}",
        reasons(&p)
    );
}

#[test]
fn a_refused_request_clears_the_status_and_its_address_waits_for_that() {
    let mut a = Allocator::new(&pools(&["203.0.113.16/30"])); // .17 and .18
    let mut svcs = vec![
        svc("x", 1, &["203.0.113.17"], None),
        svc("c", 2, &["203.0.113.18"], None),
    ];
    let p = plan(&mut a, &refs(&svcs));
    assert!(p.status.is_empty());
    // c asks for x's address; d arrives.
    svcs[1] = svc("c", 2, &["203.0.113.18"], Some("203.0.113.17"));
    svcs.push(svc("d", 3, &[], None));
    let p = plan(&mut a, &refs(&svcs));
    assert!(!p.assigned.contains_key("default/c"));
    assert!(
        !p.assigned.contains_key("default/d"),
        ".18 is not free while c's status shows it"
    );
    assert_eq!(a.shown_by(ip("203.0.113.18")), Some("default/c"));
    let writes: Vec<(&str, &[IpAddr])> = p
        .status
        .iter()
        .map(|u| (u.name.as_str(), u.addresses.as_slice()))
        .collect();
    assert_eq!(writes, [("c", &[][..])], "c's status cleared");
    let r = reasons(&p);
    for want in [
        ("default/c", "AddressInUse"),
        ("default/c", "AddressReleased"),
        ("default/d", "PoolExhausted"),
    ] {
        assert!(
            r.contains(&(want.0.into(), want.1.into())),
            "{want:?} in {r:?}"
        );
    }
    // The cleared status comes back: now .18 is free, and d gets it.
    echo(&mut svcs, &p);
    assert_owned_once(&svcs);
    let p = plan(&mut a, &refs(&svcs));
    assert_eq!(p.assigned["default/d"], [ip("203.0.113.18")]);
    echo(&mut svcs, &p);
    assert_owned_once(&svcs);
    assert!(plan(&mut a, &refs(&svcs)).status.is_empty(), "settled");
}

#[test]
fn a_request_of_a_family_the_service_lacks_is_refused() {
    let dual_pools = pools(&["203.0.113.16/29", "2001:db8:100::/120"]);
    let mut a = Allocator::new(&dual_pools);
    let s = svc("v4", 1, &[], Some("2001:db8:100::5"));
    let p = plan(&mut a, &[&s]);
    assert!(p.assigned.is_empty(), "no VIP");
    assert!(p.status.is_empty(), "no status");
    assert_eq!(
        reasons(&p),
        [("default/v4".into(), "AddressFamilyMismatch".into())]
    );
    let msg = &p.notices[0].message;
    assert!(
        msg.contains("2001:db8:100::5 is IPv6, but the Service is SingleStack IPv4"),
        "{msg}"
    );
    assert_eq!(a.count(), 0);

    // One that shows an address loses it: its status is cleared.
    let s = svc("v4", 1, &["203.0.113.17"], Some("2001:db8:100::5"));
    let p = plan(&mut Allocator::new(&dual_pools), &[&s]);
    assert!(p.assigned.is_empty());
    assert_eq!(p.status.len(), 1);
    assert!(p.status[0].addresses.is_empty());

    // Dual-stack: one address per family, never two of one.
    let mut v = lb("ds");
    v["spec"]["ipFamilies"] = json!(["IPv4", "IPv6"]);
    v["spec"]["ipFamilyPolicy"] = json!("PreferDualStack");
    v["metadata"]["annotations"] =
        json!({ "strait.dev/load-balancer-ip": "203.0.113.20,2001:db8:100::20" });
    let ok: Service = serde_json::from_value(v.clone()).unwrap();
    let p = plan(&mut Allocator::new(&dual_pools), &[&ok]);
    assert_eq!(
        p.assigned["default/ds"],
        [ip("203.0.113.20"), ip("2001:db8:100::20")]
    );
    v["metadata"]["annotations"] =
        json!({ "strait.dev/load-balancer-ip": "203.0.113.20,203.0.113.21" });
    let two: Service = serde_json::from_value(v).unwrap();
    let p = plan(&mut Allocator::new(&dual_pools), &[&two]);
    assert!(p.assigned.is_empty());
    assert_eq!(
        reasons(&p),
        [("default/ds".into(), "AddressFamilyMismatch".into())]
    );
}

#[test]
fn a_status_address_outside_the_pools_is_replaced() {
    let mut a = Allocator::new(&pools(&["203.0.113.16/29", "2001:db8:100::/120"]));
    let forged = svc("forged", 1, &["203.0.113.200"], None);
    // In a pool, but of a family the (SingleStack IPv4) Service does not have.
    let v6 = svc("v6", 2, &["2001:db8:100::9"], None);
    let p = plan(&mut a, &[&forged, &v6]);
    assert_eq!(p.assigned["default/forged"], [ip("203.0.113.17")]);
    assert_eq!(p.assigned["default/v6"], [ip("203.0.113.18")]);
    assert_eq!(a.owner(ip("203.0.113.200")), None, "never claimed");
    let writes: Vec<(&str, &[IpAddr])> = p
        .status
        .iter()
        .map(|u| (u.name.as_str(), u.addresses.as_slice()))
        .collect();
    assert_eq!(
        writes,
        [
            ("forged", &[ip("203.0.113.17")][..]),
            ("v6", &[ip("203.0.113.18")][..])
        ]
    );
    assert!(reasons(&p).contains(&("default/forged".into(), "AddressNotInPool".into())));

    // Without pools nothing from a status is trusted: only requests are served.
    let p = plan(&mut Allocator::new(&[]), &[&forged]);
    assert!(p.assigned.is_empty());
    assert!(p.status[0].addresses.is_empty());
}

#[test]
fn a_service_no_longer_served_has_its_status_cleared_before_its_address_moves() {
    let mut a = Allocator::new(&pools(&["203.0.113.16/30"])); // .17 and .18
    let mut svcs = vec![
        svc("a", 1, &["203.0.113.17"], None),
        svc("b", 2, &["203.0.113.18"], None),
    ];
    plan(&mut a, &refs(&svcs));
    // a becomes a ClusterIP Service, b goes to another class; c arrives.
    let mut v = serde_json::to_value(&svcs[0]).unwrap();
    v["spec"]["type"] = json!("ClusterIP");
    v["spec"]
        .as_object_mut()
        .unwrap()
        .remove("loadBalancerClass");
    v["metadata"]["resourceVersion"] = json!("7");
    svcs[0] = serde_json::from_value(v).unwrap();
    let mut v = serde_json::to_value(&svcs[1]).unwrap();
    v["spec"]["loadBalancerClass"] = json!("other.example/lb");
    svcs[1] = serde_json::from_value(v).unwrap();
    svcs.push(svc("c", 3, &[], None));
    let p = plan(&mut a, &refs(&svcs));
    assert!(p.assigned.is_empty(), "{:?}", p.assigned);
    let writes: Vec<(&str, usize, Option<&str>)> = p
        .status
        .iter()
        .map(|u| {
            (
                u.name.as_str(),
                u.addresses.len(),
                u.resource_version.as_deref(),
            )
        })
        .collect();
    assert_eq!(writes, [("a", 0, Some("7")), ("b", 0, None)]);
    let released: Vec<&str> = p
        .notices
        .iter()
        .filter(|n| n.reason == "AddressReleased")
        .map(|n| n.message.as_str())
        .collect();
    assert_eq!(
        released,
        [
            "released 203.0.113.17: the Service is of type ClusterIP now",
            "released 203.0.113.18: the Service's loadBalancerClass is now other.example/lb"
        ]
    );
    assert!(reasons(&p).contains(&("default/c".into(), "PoolExhausted".into())));
    // Asked again until the statuses come back cleared; then c gets an address.
    assert_eq!(plan(&mut a, &refs(&svcs)).status.len(), 2);
    echo(&mut svcs, &p);
    let p = plan(&mut a, &refs(&svcs));
    assert_eq!(p.assigned["default/c"], [ip("203.0.113.17")]);
    echo(&mut svcs, &p);
    assert_owned_once(&svcs);

    // After a restart: a ClusterIP Service showing a pool address is cleared; a
    // LoadBalancer of another class is not touched, but its address is never given out.
    let mut fresh = Allocator::new(&pools(&["203.0.113.16/30"]));
    let mut stale = serde_json::to_value(svc("s", 1, &["203.0.113.17"], None)).unwrap();
    stale["spec"]["type"] = json!("NodePort");
    let stale: Service = serde_json::from_value(stale).unwrap();
    let mut other = serde_json::to_value(svc("o", 2, &["203.0.113.18"], None)).unwrap();
    other["spec"]["loadBalancerClass"] = json!("other.example/lb");
    let other: Service = serde_json::from_value(other).unwrap();
    let new = svc("n", 3, &[], None);
    let p = plan(&mut fresh, &[&stale, &other, &new]);
    let writes: Vec<&str> = p.status.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(writes, ["s"]);
    assert!(
        !p.assigned.contains_key("default/n"),
        "both addresses still shown"
    );
}

// ---- the controller, fed by hand ----------------------------------------------------

fn dynamic(v: Value) -> DynamicObject {
    serde_json::from_value(v).unwrap()
}

/// Begins a (re)list of `kind`: `Init`, then every object; not done yet.
fn begin_list(ctl: &mut Controller, kind: Kind, objs: Vec<Value>) {
    ctl.apply(kind, Event::Init);
    for o in objs {
        ctl.apply(kind, Event::InitApply(dynamic(o)));
    }
}

/// A whole list of `kind`.
fn list(ctl: &mut Controller, kind: Kind, objs: Vec<Value>) {
    begin_list(ctl, kind, objs);
    ctl.apply(kind, Event::InitDone);
}

#[test]
fn nothing_is_published_before_every_kind_is_listed() {
    let mut ctl = Controller::new(settings(Mode::Nat));
    list(&mut ctl, Kind::Services, vec![lb("web")]);
    list(&mut ctl, Kind::Nodes, three_nodes());
    assert!(ctl.reconcile().is_none(), "slices not listed yet");
    let web_a = slice("web-a", "web", vec![ready("192.0.2.11", "n1")]);
    begin_list(&mut ctl, Kind::EndpointSlices, vec![web_a]);
    assert!(ctl.reconcile().is_none(), "slice list not complete");
    ctl.apply(Kind::EndpointSlices, Event::InitDone);
    let r = ctl.reconcile().unwrap();
    assert!(r.changed);
    assert_eq!(r.services[0].backends.len(), 1);
    assert_eq!(r.status.len(), 1);
    let again = ctl.reconcile().unwrap();
    assert!(!again.changed);
    assert!(again.notices.is_empty(), "notices are not repeated");
    assert_eq!(again.status, r.status, "not written yet: asked again");
    ctl.status_written(&r.status[0]);
    assert!(
        ctl.reconcile().unwrap().status.is_empty(),
        "written, echo pending"
    );
    // The echo arrives; later someone clears the status: written again.
    let mut echoed = lb("web");
    echoed["status"] = json!({ "loadBalancer": { "ingress": [{ "ip": "203.0.113.17" }] } });
    ctl.apply(Kind::Services, Event::Apply(dynamic(echoed)));
    assert!(ctl.reconcile().unwrap().status.is_empty());
    ctl.apply(Kind::Services, Event::Apply(dynamic(lb("web"))));
    assert_eq!(ctl.reconcile().unwrap().status.len(), 1);
}

#[test]
fn a_relist_replaces_the_view_only_when_complete() {
    let mut ctl = Controller::new(settings(Mode::Nat));
    list(&mut ctl, Kind::Nodes, three_nodes());
    list(&mut ctl, Kind::Services, vec![lb("web"), lb("old")]);
    list(
        &mut ctl,
        Kind::EndpointSlices,
        vec![
            slice(
                "web-a",
                "web",
                vec![ready("192.0.2.11", "n1"), ready("192.0.2.12", "n2")],
            ),
            slice("old-a", "old", vec![ready("192.0.2.21", "n1")]),
        ],
    );
    let first = ctl.reconcile().unwrap().services;
    assert_eq!(first.len(), 2);
    // A relist of slices starts (after a 410): until InitDone nothing changes.
    let web_a = slice("web-a", "web", vec![ready("192.0.2.11", "n1")]);
    begin_list(&mut ctl, Kind::EndpointSlices, vec![web_a]);
    assert_eq!(ctl.reconcile().unwrap().services, first);
    ctl.apply(Kind::EndpointSlices, Event::InitDone);
    let after = ctl.reconcile().unwrap().services;
    let web = after
        .iter()
        .find(|s| s.name.starts_with("default/web/"))
        .unwrap();
    assert_eq!(web.backends.len(), 1);
    let old = after
        .iter()
        .find(|s| s.name.starts_with("default/old/"))
        .unwrap();
    assert!(old.backends.is_empty(), "its slice was deleted meanwhile");
    // And a Service deleted meanwhile disappears with the services relist.
    list(&mut ctl, Kind::Services, vec![lb("web")]);
    assert_eq!(ctl.reconcile().unwrap().services.len(), 1);
}

#[test]
fn malformed_watch_objects_are_counted() {
    let mut ctl = Controller::new(settings(Mode::Nat));
    let mut bad = lb("bad");
    bad["spec"]["ports"] = json!("not a list");
    list(&mut ctl, Kind::Services, vec![lb("web"), bad]);
    list(&mut ctl, Kind::Nodes, three_nodes());
    list(&mut ctl, Kind::EndpointSlices, vec![]);
    let r = ctl.reconcile().unwrap();
    assert_eq!(r.services.len(), 1);
    assert_eq!(r.counts().get(&WarningKind::Malformed), Some(&1));
}

#[test]
fn an_object_that_stops_parsing_keeps_its_last_good_version() {
    let mut ctl = Controller::new(settings(Mode::Nat));
    let mut internal = lb("internal");
    internal["spec"]["type"] = json!("ClusterIP");
    list(
        &mut ctl,
        Kind::Services,
        vec![lb("web"), lb("api"), internal.clone()],
    );
    list(&mut ctl, Kind::Nodes, three_nodes());
    let web_a = slice(
        "web-a",
        "web",
        vec![ready("192.0.2.11", "n1"), ready("192.0.2.12", "n2")],
    );
    list(&mut ctl, Kind::EndpointSlices, vec![web_a]);
    let before = ctl.reconcile().unwrap();
    let seen = |r: &kubemodel::Round| -> Vec<(String, IpAddr, usize)> {
        r.services
            .iter()
            .map(|s| (s.name.clone(), s.vip, s.backends.len()))
            .collect()
    };
    let count = |r: &kubemodel::Round, prefix: &str| {
        r.services
            .iter()
            .find(|s| s.name.starts_with(prefix))
            .map(|s| s.backends.len())
    };
    let web: Vec<_> = seen(&before)
        .into_iter()
        .filter(|s| s.0.starts_with("default/web/"))
        .collect();
    assert!(!web.is_empty());
    let mut bad = lb("web");
    bad["spec"]["ports"] = json!("not a list");
    let mut bad_slice = slice("web-a", "web", vec![ready("192.0.2.11", "n1")]);
    bad_slice["endpoints"] = json!(7);

    // Updates that do not parse: the Service, its address and its endpoints stay. A Service
    // the gateway does not serve gets no Event for it.
    ctl.apply(Kind::Services, Event::Apply(dynamic(bad.clone())));
    ctl.apply(
        Kind::EndpointSlices,
        Event::Apply(dynamic(bad_slice.clone())),
    );
    internal["spec"]["ports"] = json!("not a list");
    ctl.apply(Kind::Services, Event::Apply(dynamic(internal.clone())));
    // A Service that asks for an address now finds web's taken, as before.
    ctl.apply(Kind::Services, Event::Apply(dynamic(lb("new"))));
    let r = ctl.reconcile().unwrap();
    assert_eq!(r.counts().get(&WarningKind::Malformed), Some(&3));
    let malformed: Vec<_> = r
        .notices
        .iter()
        .filter(|n| n.reason == "Malformed")
        .map(|n| n.regarding.name.as_deref())
        .collect();
    assert_eq!(malformed, [Some("web")], "{:?}", r.notices);
    for w in r
        .warnings
        .iter()
        .filter(|w| w.kind == WarningKind::Malformed)
    {
        assert!(
            w.message.ends_with("its last good version stays in effect"),
            "{w:?}"
        );
    }
    let now = seen(&r);
    for s in &web {
        assert!(now.contains(s), "{s:?} kept: {now:?}");
    }
    let new = now
        .iter()
        .find(|s| s.0.starts_with("default/new/"))
        .unwrap();
    assert!(
        web.iter().all(|s| s.1 != new.1),
        "the new Service took no kept address: {now:?}"
    );

    // A relist that still meets them keeps them too; not an object of the same name made
    // anew meanwhile (another uid), which does not parse either.
    let mut api_anew = lb("api");
    api_anew["metadata"]["uid"] = json!("uid-api-2");
    api_anew["spec"]["ports"] = json!("not a list");
    list(
        &mut ctl,
        Kind::Services,
        vec![bad, api_anew, lb("new"), internal],
    );
    list(&mut ctl, Kind::EndpointSlices, vec![bad_slice]);
    let r = ctl.reconcile().unwrap();
    for s in &web {
        assert!(
            seen(&r).contains(s),
            "{s:?} kept across the relist: {:?}",
            seen(&r)
        );
    }
    assert_eq!(count(&r, "default/api/"), None, "{:?}", seen(&r));
    ctl.apply(Kind::Services, Event::Delete(dynamic(lb("api"))));

    // Parsing again takes effect; deleting removes.
    ctl.apply(
        Kind::EndpointSlices,
        Event::Apply(dynamic(slice(
            "web-a",
            "web",
            vec![ready("192.0.2.11", "n1")],
        ))),
    );
    let r = ctl.reconcile().unwrap();
    assert_eq!(count(&r, "default/web/"), Some(1));
    assert_eq!(r.counts().get(&WarningKind::Malformed), Some(&2));
    ctl.apply(Kind::Services, Event::Delete(dynamic(lb("web"))));
    ctl.apply(Kind::Services, Event::Delete(dynamic(lb("internal"))));
    let r = ctl.reconcile().unwrap();
    assert_eq!(count(&r, "default/web/"), None);
    assert_eq!(r.counts().get(&WarningKind::Malformed), None);

    // An object that never parsed is left out, as ever.
    let mut never = lb("never");
    never["spec"]["ports"] = json!("not a list");
    ctl.apply(Kind::Services, Event::Apply(dynamic(never)));
    let r = ctl.reconcile().unwrap();
    assert_eq!(count(&r, "default/never/"), None);
    let w = r
        .warnings
        .iter()
        .find(|w| w.kind == WarningKind::Malformed)
        .unwrap();
    assert!(!w.message.contains("last good"), "{w:?}");
}

// ---- command line -------------------------------------------------------------------

#[derive(Debug, clap::Parser)]
struct Cli {
    #[command(flatten)]
    kube: kube::Args,
}

#[test]
fn flags_give_settings() {
    use clap::Parser;
    let c = Cli::try_parse_from([
        "strait",
        "--kube",
        "--kubeconfig",
        "/tmp/kc",
        "--kube-pool",
        "203.0.113.0/28",
        "--kube-pool",
        "2001:db8::/120",
        "--kube-mode",
        "nat",
        "--kube-node-port-address",
        "192.0.2.1",
        "--kube-classless",
    ])
    .unwrap();
    let s = c.kube.settings(&gateway());
    assert_eq!(s.pools.len(), 2);
    assert_eq!(s.mode, Mode::Nat);
    assert_eq!(s.class, CLASS);
    assert!(s.classless && !s.all_external_ips);
    assert_eq!(c.kube.kubeconfig, Some(PathBuf::from("/tmp/kc")));
    assert!(
        Cli::try_parse_from(["strait", "--kube-pool", "203.0.113.0/28"]).is_err(),
        "needs --kube"
    );
    assert!(Cli::try_parse_from(["strait", "--kube", "--kube-mode", "dsr-foo"]).is_err());
    let plain = Cli::try_parse_from(["strait"]).unwrap();
    assert!(!plain.kube.kube);
    assert_eq!(
        plain.kube.settings(&gateway()).maglev_min_table_size,
        2_039,
        "tables sized from their backends by default"
    );
    let fixed =
        Cli::try_parse_from(["strait", "--kube", "--kube-maglev-min-table-size", "65537"]).unwrap();
    assert_eq!(
        fixed.kube.settings(&gateway()).maglev_min_table_size,
        65_537
    );
    for bad in ["65536", "3", "1310719", "x"] {
        let e = Cli::try_parse_from(["strait", "--kube", "--kube-maglev-min-table-size", bad])
            .expect_err(bad)
            .to_string();
        assert!(e.contains("--kube-maglev-min-table-size"), "{bad}: {e}");
    }
}

// ---- against the fake API server ----------------------------------------------------

/// A fake API server holding nodes n1-n3, and a scratch directory (`strait-kube-{pid}-{tag}`)
/// for kubeconfigs.
fn fake(tag: &str) -> (FakeApi, Scratch) {
    let api = FakeApi::start();
    for n in three_nodes() {
        api.apply(n);
    }
    (api, temp_dir(tag))
}

fn temp_dir(tag: &str) -> Scratch {
    Scratch::new(&format!("strait-kube-{}-{tag}", std::process::id()))
}

/// Whether the stored Service `default/name` shows LoadBalancer address `ip`.
fn has_status(api: &FakeApi, name: &str, ip: &str) -> bool {
    api.get(Res::Services, "default", name)
        .is_some_and(|s| s["status"]["loadBalancer"]["ingress"][0]["ip"] == ip)
}

/// Whether an event with `reason` about `name` was posted.
fn has_event(api: &FakeApi, reason: &str, name: &str) -> bool {
    api.events()
        .iter()
        .any(|e| e["reason"] == reason && e["regarding"]["name"] == name)
}

/// The first Event of `reason` the server holds.
fn event(api: &FakeApi, reason: &str) -> serde_json::Value {
    api.events()
        .into_iter()
        .find(|e| e["reason"] == reason)
        .unwrap_or_else(|| panic!("no {reason} Event"))
}

fn backend_count(l: &[model::Service], prefix: &str) -> Option<usize> {
    l.iter()
        .find(|s| s.name.starts_with(prefix))
        .map(|s| s.backends.len())
}

#[test]
fn a_load_balancer_gets_an_address_status_and_backends_and_follows_scaling() {
    let (api, dir) = fake("lb");
    api.apply(lb("web"));
    api.apply(slice(
        "web-a",
        "web",
        vec![ready("192.0.2.11", "n1"), ready("192.0.2.12", "n2")],
    ));
    let (src, rx) = start(&api, &dir, settings(Mode::Nat));

    let l = until(&rx, 20, "web with two backends", |l| {
        backend_count(l, "default/web/") == Some(2)
    });
    assert_eq!(names(&l), ["default/web/http/203.0.113.17"]);
    eventually(10, "status written", || {
        has_status(&api, "web", "203.0.113.17")
    });
    eventually(10, "an AddressAssigned event", || {
        has_event(&api, "AddressAssigned", "web")
    });

    // Scale up: a second slice with two more endpoints.
    api.apply(slice(
        "web-b",
        "web",
        vec![ready("192.0.2.13", "n3"), ready("192.0.2.14", "n3")],
    ));
    until(&rx, 10, "four backends", |l| {
        backend_count(l, "default/web/") == Some(4)
    });
    // Scale down: one endpoint terminating, the second slice gone.
    api.apply(slice(
        "web-a",
        "web",
        vec![
            ready("192.0.2.11", "n1"),
            ep("192.0.2.12", "n2", Some(false), Some(true), Some(true)),
        ],
    ));
    api.delete(Res::EndpointSlices, "default", "web-b");
    let l = until(&rx, 10, "one active and one draining", |l| {
        l.first().is_some_and(|s| {
            backends(s)
                == [
                    ("192.0.2.11:8080".to_owned(), BackendState::Active),
                    ("192.0.2.12:8080".to_owned(), BackendState::Draining),
                ]
        })
    });
    assert_eq!(l.len(), 1);
    let st = src.stats();
    assert!(st.connected());
    assert_eq!(st.addresses(), 1);
    // Counted once its answer is read, which may follow the watch's echo.
    eventually(10, "the status write counted", || st.status_writes() >= 1);
    // The status write came back through the watch: no second write for it.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(st.status_writes(), 1);
    let watches = api
        .requests()
        .iter()
        .filter(|r| r.contains("watch=true"))
        .count();
    assert!(watches >= 3, "one watch per kind at least");
}

#[test]
fn a_410_after_a_long_outage_relists_at_once() {
    // A back-off whose ceiling, 3.2 s, an outage of a few seconds reaches.
    let (api, dir) = fake("gone-late");
    api.apply(lb("web"));
    api.apply(slice("web-a", "web", vec![ready("192.0.2.11", "n1")]));
    let mut st = settings(Mode::Nat);
    st.backoff = (Duration::from_millis(100), Duration::from_millis(3200));
    let (src, rx) = start(&api, &dir, st);
    until(&rx, 20, "the service", |l| {
        backend_count(l, "default/web/") == Some(1)
    });
    eventually(10, "the watches", || api.watching(Res::EndpointSlices) == 1);

    api.set_down(true);
    eventually(10, "the source notices", || !src.stats().connected());
    // Every attempt fails while the server is down: 0.1 + 0.2 + ... + 3.2 s, and the next
    // step is the ceiling.
    std::thread::sleep(Duration::from_secs(7));
    api.apply(slice(
        "web-a",
        "web",
        vec![ready("192.0.2.11", "n1"), ready("192.0.2.12", "n2")],
    ));
    api.expire();
    let expired = src.stats().expired(Kind::EndpointSlices);
    api.set_down(false);
    // The first watch after the outage meets the compaction: 410 Gone.
    eventually(10, "the slices' 410", || {
        src.stats().expired(Kind::EndpointSlices) > expired
    });
    let gone_at = Instant::now();
    until(&rx, 10, "the relisted slice", |l| {
        backend_count(l, "default/web/") == Some(2)
    });
    let took = gone_at.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "published {took:?} after the 410: the relist waited a back-off step the outage grew"
    );
}

#[test]
fn a_410_relist_converges_and_drops_what_was_deleted_meanwhile() {
    let (api, dir) = fake("gone");
    api.apply(lb("web"));
    api.apply(lb("old"));
    api.apply(slice(
        "web-a",
        "web",
        vec![ready("192.0.2.11", "n1"), ready("192.0.2.12", "n2")],
    ));
    api.apply(slice("old-a", "old", vec![ready("192.0.2.21", "n1")]));
    let (src, rx) = start(&api, &dir, settings(Mode::Nat));
    until(&rx, 20, "both services", |l| {
        l.len() == 2 && backend_count(l, "default/web/") == Some(2)
    });

    // A 410 on live watches: relist, same content, nothing lost on the way.
    eventually(10, "three watches", || {
        [Res::Services, Res::EndpointSlices, Res::Nodes]
            .iter()
            .all(|&r| api.watching(r) == 1)
    });
    api.expire();
    eventually(10, "a relist of every kind", || {
        Kind::ALL.iter().all(|&k| src.stats().lists(k) >= 2)
    });
    assert!(src.stats().expired(Kind::Services) >= 1);
    // The relists completed: the view is current, each kind's last list recent.
    eventually(10, "the view current after the relists", || {
        src.stats().stale_since().is_none()
    });
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for k in Kind::ALL {
        let age = now - src.stats().last_list(k);
        assert!((0.0..30.0).contains(&age), "{k:?} listed {age} s ago");
    }

    // Changes the source cannot see live: the server is down, then has compacted.
    api.set_down(true);
    eventually(10, "the source notices", || !src.stats().connected());
    api.delete(Res::Services, "default", "old");
    api.delete(Res::EndpointSlices, "default", "old-a");
    api.delete(Res::Nodes, "", "n3");
    api.apply(slice(
        "web-a",
        "web",
        vec![
            ready("192.0.2.11", "n1"),
            ready("192.0.2.12", "n2"),
            ready("192.0.2.13", "n1"),
        ],
    ));
    api.expire();
    api.set_down(false);
    let l = until(&rx, 20, "the relisted view", |l| {
        l.len() == 1 && backend_count(l, "default/web/") == Some(3)
    });
    assert_eq!(names(&l), ["default/web/http/203.0.113.17"]);
    // Every list published on the way had web with its backends: no half-built table.
    while let Ok(l) = rx.try_recv() {
        assert!(
            backend_count(&l, "default/web/").is_some_and(|n| n >= 2),
            "{l:#?}"
        );
    }
    eventually(10, "old's address is released", || {
        src.stats().addresses() == 1
    });
}

#[test]
fn an_api_outage_keeps_the_last_list_and_reconnects() {
    let (api, dir) = fake("down");
    api.apply(lb("web"));
    api.apply(slice("web-a", "web", vec![ready("192.0.2.11", "n1")]));
    let (src, rx) = start(&api, &dir, settings(Mode::DsrL2));
    let first = until(&rx, 20, "web on three nodes", |l| {
        backend_count(l, "default/web/") == Some(3)
    });
    let published = src.stats().publishes();
    // Every kind listed and the watches open: the view is current.
    eventually(10, "the view current", || {
        src.stats().stale_since().is_none()
    });

    api.set_down(true);
    eventually(10, "disconnected", || !src.stats().connected());
    let lost = src.stats().stale_since().expect("stale while disconnected");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        matches!(rx.try_recv(), Err(mpsc::TryRecvError::Empty)),
        "nothing published while down"
    );
    assert_eq!(src.stats().publishes(), published);
    assert!(src.stats().disconnects() >= 1);

    assert_eq!(
        src.stats().stale_since(),
        Some(lost),
        "stale since the loss"
    );
    assert!(lost.elapsed() >= Duration::from_secs(3));

    api.set_down(false);
    eventually(15, "reconnected", || src.stats().connected());
    eventually(15, "the view current again", || {
        src.stats().stale_since().is_none()
    });
    // A change after the outage arrives (the watch resumed).
    api.apply(node("n4", "198.51.100.4"));
    let l = until(&rx, 15, "web on four nodes", |l| {
        backend_count(l, "default/web/") == Some(4)
    });
    assert_eq!(l[0].vip, first[0].vip);
}

#[test]
fn an_exhausted_pool_gives_an_event_and_a_freed_address_is_reused() {
    let (api, dir) = fake("exhausted");
    for n in ["a", "b", "c"] {
        api.apply(lb(n));
    }
    let mut st = settings(Mode::DsrL2);
    st.pools = vec!["203.0.113.16/30".parse().unwrap()]; // two addresses
    let (src, rx) = start(&api, &dir, st);
    let l = until(&rx, 20, "two services", |l| l.len() == 2);
    assert_eq!(
        names(&l),
        ["default/a/http/203.0.113.17", "default/b/http/203.0.113.18"]
    );
    eventually(10, "a PoolExhausted event for c", || {
        api.events().iter().any(|e| {
            e["reason"] == "PoolExhausted"
                && e["regarding"]["name"] == "c"
                && e["type"] == "Warning"
        })
    });
    let ev = event(&api, "PoolExhausted");
    assert!(
        ev["note"].as_str().unwrap().contains("203.0.113.16/30"),
        "{ev}"
    );
    assert!(api.get(Res::Services, "default", "c").unwrap()["status"]["loadBalancer"].is_null());

    api.delete(Res::Services, "default", "a");
    let l = until(&rx, 10, "c takes a's address", |l| {
        names(l).contains(&"default/c/http/203.0.113.17")
    });
    assert_eq!(l.len(), 2);
    eventually(10, "c's status", || has_status(&api, "c", "203.0.113.17"));
    assert!(src.stats().events() >= 3);
}

#[test]
fn a_restarted_source_keeps_addresses_and_allocates_around_them() {
    let (api, dir) = fake("restart");
    api.apply(lb("first"));
    {
        let (_src, rx) = start(&api, &dir, settings(Mode::DsrL2));
        until(&rx, 20, "first", |l| l.len() == 1);
        eventually(10, "first's status", || {
            has_status(&api, "first", "203.0.113.17")
        });
    } // stopped
      // While no gateway runs: a Service that asks for nothing, and one that asks for
      // the address "first" holds.
    api.apply(lb("second"));
    let mut third = lb("third");
    third["metadata"]["annotations"] = json!({ "strait.dev/load-balancer-ip": "203.0.113.17" });
    api.apply(third);
    let (_src, rx) = start(&api, &dir, settings(Mode::DsrL2));
    let l = until(&rx, 20, "first and second", |l| l.len() == 2);
    assert_eq!(
        names(&l),
        [
            "default/first/http/203.0.113.17",
            "default/second/http/203.0.113.18"
        ]
    );
    eventually(10, "an AddressInUse event for third", || {
        has_event(&api, "AddressInUse", "third")
    });
}

/// Changes the stored Service `default/name` with `f`, keeping its status, as
/// `kubectl apply` or `edit` do (the fake's `apply` replaces the whole object).
fn edit(api: &FakeApi, name: &str, f: impl FnOnce(&mut Value)) {
    let mut v = api
        .get(Res::Services, "default", name)
        .expect("the Service");
    f(&mut v);
    api.apply(v);
}

/// The addresses the stored Service `default/name` shows in its status.
fn status_ips(api: &FakeApi, name: &str) -> Vec<String> {
    api.get(Res::Services, "default", name)
        .and_then(|s| s["status"]["loadBalancer"]["ingress"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|i| i["ip"].as_str().map(str::to_owned))
        .collect()
}

/// An address two of the Services `names` show in their status, if any.
fn shown_twice(api: &FakeApi, names: &[&str]) -> Option<String> {
    let mut seen = BTreeMap::new();
    for n in names {
        for a in status_ips(api, n) {
            if let Some(other) = seen.insert(a.clone(), *n) {
                return Some(format!("{a}: {other} and {n}"));
            }
        }
    }
    None
}

#[test]
fn no_two_statuses_ever_show_one_address() {
    let (api, dir) = fake("owned-once");
    api.apply(lb("x"));
    api.apply(lb("c"));
    let (_src, rx) = start(&api, &dir, settings(Mode::DsrL2));
    let all = ["x", "c", "d", "e"];
    let stop = std::sync::atomic::AtomicBool::new(false);
    /// Stops the watcher however the test ends (the scope waits for it).
    struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let twice = std::thread::scope(|sc| {
        let _stop = Stop(&stop);
        // Watches every status all along, not only at the end.
        let watcher = sc.spawn(|| {
            let mut twice = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                twice.extend(shown_twice(&api, &all));
                std::thread::sleep(Duration::from_millis(2));
            }
            twice
        });
        eventually(20, "x and c have addresses", || {
            status_ips(&api, "x") == ["203.0.113.17"] && status_ips(&api, "c") == ["203.0.113.18"]
        });

        // 1. c asks for the address x holds: refused, c's status cleared.
        edit(&api, "c", |v| {
            v["metadata"]["annotations"] = json!({ "strait.dev/load-balancer-ip": "203.0.113.17" });
        });
        eventually(10, "c's status cleared", || {
            status_ips(&api, "c").is_empty()
        });
        eventually(10, "AddressInUse and AddressReleased for c", || {
            has_event(&api, "AddressInUse", "c") && has_event(&api, "AddressReleased", "c")
        });
        // d gets c's old address only now that no status shows it.
        api.apply(lb("d"));
        eventually(10, "d's status", || {
            status_ips(&api, "d") == ["203.0.113.18"]
        });

        // 2. x stops being a LoadBalancer: its status is cleared, and then c's request
        //    can be met.
        edit(&api, "x", |v| {
            v["spec"]["type"] = json!("ClusterIP");
            v["spec"]
                .as_object_mut()
                .unwrap()
                .remove("loadBalancerClass");
        });
        eventually(10, "x's status cleared", || {
            status_ips(&api, "x").is_empty()
        });
        eventually(10, "c gets the address it asked for", || {
            status_ips(&api, "c") == ["203.0.113.17"]
        });
        eventually(10, "AddressReleased for x", || {
            has_event(&api, "AddressReleased", "x")
        });

        // 3. d goes to another class: its status is cleared, its address free again.
        edit(&api, "d", |v| {
            v["spec"]["loadBalancerClass"] = json!("other.example/lb");
        });
        eventually(10, "d's status cleared", || {
            status_ips(&api, "d").is_empty()
        });
        eventually(10, "AddressReleased for d", || {
            has_event(&api, "AddressReleased", "d")
        });
        api.apply(lb("e"));
        eventually(10, "e takes d's old address", || {
            status_ips(&api, "e") == ["203.0.113.18"]
        });
        let l = until(&rx, 10, "c and e served", |l| {
            names(l) == ["default/c/http/203.0.113.17", "default/e/http/203.0.113.18"]
        });
        assert_eq!(l.len(), 2);
        drop(_stop);
        watcher.join().unwrap()
    });
    assert!(
        twice.is_empty(),
        "statuses showed one address twice: {twice:?}"
    );
    assert_eq!(shown_twice(&api, &all), None);
}

#[test]
fn requests_go_before_allocation_in_the_first_list() {
    let (api, dir) = fake("requests-first");
    api.apply(lb("old"));
    let mut new = lb("new");
    new["spec"]["loadBalancerIP"] = json!("203.0.113.17");
    api.apply(new);
    let (_src, rx) = start(&api, &dir, settings(Mode::DsrL2));
    let l = until(&rx, 20, "both services", |l| l.len() == 2);
    assert_eq!(
        names(&l),
        [
            "default/new/http/203.0.113.17",
            "default/old/http/203.0.113.18"
        ]
    );
    eventually(10, "both statuses", || {
        has_status(&api, "new", "203.0.113.17") && has_status(&api, "old", "203.0.113.18")
    });
    assert!(
        api.events().iter().all(|e| e["type"] == "Normal"),
        "{:#?}",
        api.events()
    );
}

#[test]
fn requests_go_before_allocation_when_applied_together() {
    // `kubectl apply -f` of two Services: two creations a few milliseconds apart.
    let (api, dir) = fake("applied-together");
    api.apply(lb("web"));
    let (_src, rx) = start(&api, &dir, settings(Mode::DsrL2));
    until(&rx, 20, "web", |l| l.len() == 1);
    api.apply(lb("old"));
    std::thread::sleep(Duration::from_millis(20));
    let mut new = lb("new");
    new["metadata"]["annotations"] = json!({ "strait.dev/load-balancer-ip": "203.0.113.18" });
    api.apply(new);
    let l = until(&rx, 10, "all three", |l| l.len() == 3);
    assert_eq!(
        names(&l),
        [
            "default/new/http/203.0.113.18",
            "default/old/http/203.0.113.19",
            "default/web/http/203.0.113.17"
        ]
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !has_event(&api, "AddressInUse", "new"),
        "{:#?}",
        api.events()
    );
}

#[test]
fn a_request_of_the_wrong_family_is_refused_with_an_event() {
    let (api, dir) = fake("family");
    let mut v4 = lb("v4");
    v4["metadata"]["annotations"] = json!({ "strait.dev/load-balancer-ip": "2001:db8:100::5" });
    api.apply(v4);
    api.apply(lb("web"));
    let mut st = settings(Mode::DsrL2);
    st.pools.push("2001:db8:100::/120".parse().unwrap());
    let (src, rx) = start(&api, &dir, st);
    let l = until(&rx, 20, "web", |l| !l.is_empty());
    assert_eq!(
        names(&l),
        ["default/web/http/203.0.113.17"],
        "no VIP for v4"
    );
    eventually(10, "an AddressFamilyMismatch event", || {
        has_event(&api, "AddressFamilyMismatch", "v4")
    });
    let ev = event(&api, "AddressFamilyMismatch");
    assert_eq!(ev["type"], "Warning");
    assert!(
        ev["note"].as_str().unwrap().contains("SingleStack IPv4"),
        "{ev}"
    );
    eventually(10, "web's status", || {
        has_status(&api, "web", "203.0.113.17")
    });
    assert!(status_ips(&api, "v4").is_empty(), "no status written");
    assert_eq!(src.stats().addresses(), 1);
}

#[test]
fn a_forged_status_address_is_not_claimed_and_is_corrected() {
    let (api, dir) = fake("forged");
    let mut forged = lb("forged");
    forged["status"] = json!({ "loadBalancer": { "ingress": [{ "ip": "203.0.113.200" }] } });
    api.apply(forged);
    let (_src, rx) = start(&api, &dir, settings(Mode::DsrL2));
    let l = until(&rx, 20, "forged, on a pool address", |l| !l.is_empty());
    assert_eq!(names(&l), ["default/forged/http/203.0.113.17"]);
    eventually(10, "the status corrected", || {
        status_ips(&api, "forged") == ["203.0.113.17"]
    });
    eventually(10, "an AddressNotInPool event", || {
        has_event(&api, "AddressNotInPool", "forged")
    });
    while let Ok(l) = rx.try_recv() {
        assert!(
            l.iter().all(|s| !s.name.contains("203.0.113.200")),
            "{l:#?}"
        );
    }
}

#[test]
fn the_cluster_node_check_asks_kube_proxy_for_healthz() {
    use clap::Parser;
    let (api, dir) = fake("healthz");
    api.apply(lb("web"));
    let cli = Cli::try_parse_from([
        "strait",
        "--kube",
        "--kube-mode",
        "dsr-l2",
        "--kube-pool",
        "203.0.113.16/29",
        "--kube-proxy-health-port",
        "10256",
    ])
    .unwrap();
    let mut st = cli.kube.settings(&gateway());
    st.backoff = settings(Mode::DsrL2).backoff;
    let (_src, rx) = start(&api, &dir, st);
    let l = until(&rx, 20, "web on three nodes", |l| {
        backend_count(l, "default/web/") == Some(3)
    });
    let hc = l[0].health_check.as_ref().expect("a node check");
    assert_eq!(
        (hc.port, &hc.kind),
        (
            Some(10256),
            &HealthKind::Http {
                path: "/healthz".into()
            }
        )
    );
}

/// The status code of `GET path` from the admin API at `addr`.
fn admin_get(addr: std::net::SocketAddr, path: &str) -> u16 {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: strait\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = c.read_to_string(&mut answer);
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"))
}

#[test]
fn the_gateway_is_ready_once_the_first_list_is_applied() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let (api, dir) = fake("ready");
    api.apply(lb("web"));
    api.apply(slice("web-a", "web", vec![ready("192.0.2.11", "n1")]));
    api.set_down(true);
    // The gateway as `strait run --kube` has it, without workers or VIPs (no root).
    let file =
        strait_config::parse("[[gateway.interfaces]]\nname = \"eth0\"\nqueues = [0]\n").unwrap();
    let mut gw = strait_control::run::Driver::with_ports(
        strait_control::run::ConfigSource::Builtin,
        file,
        vec![strait_dataplane::table::Port::new(
            strait_config::model::MacAddr([2, 0, 0, 0, 0, 1]),
            1500,
        )],
    )
    .unwrap();
    let shared = Arc::clone(&gw.shared);
    let (reload_tx, reload_rx) = mpsc::channel();
    let admin = strait_control::admin::start(
        "127.0.0.1:0".parse().unwrap(),
        Arc::clone(&shared),
        reload_tx,
    )
    .unwrap();
    let (tx, lists) = mpsc::channel();
    let _src = kube::spawn_feed(
        Some(&api.kubeconfig(dir.path())),
        settings(Mode::Nat),
        move |p| {
            let _ = tx.send(p);
        },
    )
    .unwrap();
    gw.follow_kube(lists);
    let stop = Arc::new(AtomicBool::new(false));
    let serving = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || gw.serve(&stop, &AtomicBool::new(false), &reload_rx))
    };

    // The cluster cannot be listed: not ready, however long it takes.
    let until_ = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until_ {
        assert_eq!(admin_get(admin, "/healthz"), 503);
        std::thread::sleep(Duration::from_millis(100));
    }
    api.set_down(false);
    eventually(20, "/healthz answers 200", || {
        admin_get(admin, "/healthz") == 200
    });
    // Ready means the cluster's Services are in the table.
    let services: Vec<String> = shared
        .config()
        .services
        .iter()
        .map(|s| s.name.clone())
        .collect();
    assert_eq!(services, ["default/web/http/203.0.113.17"]);
    stop.store(true, Ordering::Relaxed);
    serving.join().unwrap();
}

#[test]
fn a_bad_kubeconfig_is_named() {
    let e = kube::spawn_feed(
        Some(std::path::Path::new("/nonexistent/kubeconfig")),
        settings(Mode::Nat),
        |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("/nonexistent/kubeconfig"), "{e}");
}

/// A self-signed test CA (P-256, `CN=strait-test-ca`, no key anywhere), base64 PEM as
/// kubeconfig's `certificate-authority-data` wants it.
const TEST_CA: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJpRENDQVMrZ0F3SUJBZ0lVZFJ6cGlmb3JjTVZ4MHhOSHlrZkozZ2xVaTJjd0NnWUlLb1pJemowRUF3SXcKR1RFWE1CVUdBMVVFQXd3T2MzUnlZV2wwTFhSbGMzUXRZMkV3SUJjTk1qWXhNVE13TURNeU1EQTBXaGdQTWpFeQpOakV4TURZd016SXdNRFJhTUJreEZ6QVZCZ05WQkFNTURuTjBjbUZwZEMxMFpYTjBMV05oTUZrd0V3WUhLb1pJCnpqMENBUVlJS29aSXpqMERBUWNEUWdBRWY4UlluQkVTU2I3djNoUGNMT2F6QkRkQjE2LzBmaGVQTW9tRy9KRmoKRVFGNVZjamxjaWhOOUduM0ovV3lsNlQ5TUQwS2MvaDZwcUlMcCs0SXlhSkQ0cU5UTUZFd0hRWURWUjBPQkJZRQpGSS80SmlIMjNpVTI0QUdNVUNJalBtdnRVWWZYTUI4R0ExVWRJd1FZTUJhQUZJLzRKaUgyM2lVMjRBR01VQ0lqClBtdnRVWWZYTUE4R0ExVWRFd0VCL3dRRk1BTUJBZjh3Q2dZSUtvWkl6ajBFQXdJRFJ3QXdSQUlnR09yR2Q0b24KRGUzeVArUHM3UG42TXRvdXR4MndwbklsZkRTbE5LZ2JYZkVDSUQ5cjBldUdiaHJkcTROQXRyNDh3SUIyNXA1agp2Zm1xcDQxMUxVSjE4TGxzCi0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K";

#[test]
fn an_https_kubeconfig_builds_a_tls_client_without_connecting() {
    // rustls needs exactly one crypto provider compiled in (ring here); this would panic
    // at client construction if the feature set were wrong.
    let dir = temp_dir("https");
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    certificate-authority-data: {TEST_CA}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: not-a-real-token\n"
        ),
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(kube::connect(Some(&path)));
    assert!(client.is_ok(), "{:?}", client.err());
}

// ---- deploy/ ------------------------------------------------------------------------

/// `strait run`'s flags, as main.rs declares them.
#[derive(Debug, clap::Parser)]
struct RunCli {
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    kube: kube::Args,
}

#[test]
fn the_deploy_files_agree_with_the_code() {
    use clap::Parser;
    let cfg = strait_config::parse(include_str!("../../deploy/strait-3node.toml"))
        .unwrap_or_else(|e| panic!("deploy/strait-3node.toml:\n{e}"));
    assert_eq!(cfg.gateway.interfaces[0].name, "eth1");

    // The unit runs the packaged binary on the packaged configuration, with the arguments
    // of /etc/default/strait; the stop is strait's (KillMode=mixed: SIGTERM to it alone).
    let unit = include_str!("../../deploy/strait.service");
    let key = |k: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("deploy/strait.service has no {k}"))
    };
    assert_eq!(
        key("ExecStart"),
        "/usr/sbin/strait run --config /etc/strait/strait.toml $STRAIT_ARGS"
    );
    assert_eq!(key("EnvironmentFile"), "-/etc/default/strait");
    assert_eq!(key("KillMode"), "mixed");
    assert_eq!(key("Type"), "notify");
    // The 3-node example's Kubernetes flags, as deploy/strait.default shows them.
    let default = include_str!("../../deploy/strait.default");
    let exec = default
        .lines()
        .find_map(|l| l.strip_prefix("#STRAIT_ARGS=\""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("an example STRAIT_ARGS line");
    let words = ["strait"].into_iter().chain(exec.split_whitespace());
    let run = RunCli::try_parse_from(words).unwrap_or_else(|e| panic!("{exec}\n{e}"));
    let s = run.kube.settings(&cfg.gateway);
    assert!(run.kube.kube && s.pools.len() == 2);
    for p in &s.pools {
        assert!(
            ["203.0.113.0/24", "2001:db8::/32"]
                .iter()
                .any(|d| d.parse::<ipnet::IpNet>().unwrap().contains(p)),
            "{p} is not a documentation range"
        );
    }

    let rbac = include_str!("../../deploy/rbac.yaml");
    for needed in [
        "\"services\", \"nodes\"",
        "\"services/status\"",
        "\"endpointslices\"",
        "\"events.k8s.io\"",
        "[\"get\", \"list\", \"watch\"]",
        "[\"update\", \"patch\"]",
        "[\"create\", \"patch\"]",
        "\"coordination.k8s.io\"",
        "[\"leases\"]",
        "[\"get\", \"update\"]",
        "[\"strait.dev\"]",
        "[\"straitaddresspools\"]",
    ] {
        assert!(rbac.contains(needed), "deploy/rbac.yaml lacks {needed}");
    }
}

/// How long one round takes on a larger cluster (`cargo test --release --test kube --
/// --ignored --nocapture scale`): 1,000 LoadBalancer Services with 20 endpoints each on
/// 50 nodes.
#[test]
#[ignore = "a measurement, not a check"]
fn scale_round_time() {
    let mut st = settings(Mode::Nat);
    st.pools = vec!["203.0.112.0/22".parse().unwrap()];
    let mut ctl = Controller::new(st);
    let nodes: Vec<Value> = (0..50)
        .map(|i| node(&format!("n{i}"), &format!("198.51.100.{}", i + 1)))
        .collect();
    let mut services = Vec::new();
    let mut slices = Vec::new();
    for s in 0..1000 {
        let name = format!("svc{s}");
        services.push(lb(&name));
        let eps = (0..20)
            .map(|e| {
                // 198.18.0.0/15 (RFC 2544, benchmarking): room for 20,000 endpoints.
                let i = s * 20 + e;
                let a = format!("198.{}.{}.{}", 18 + i / 65536, (i / 256) % 256, i % 256);
                ready(&a, &format!("n{}", e % 50))
            })
            .collect();
        slices.push(slice(&format!("{name}-a"), &name, eps));
    }
    list(&mut ctl, Kind::Nodes, nodes);
    list(&mut ctl, Kind::Services, services);
    let t = Instant::now();
    list(&mut ctl, Kind::EndpointSlices, slices);
    let applied = t.elapsed();
    let t = Instant::now();
    let r = ctl.reconcile().unwrap();
    let first = t.elapsed();
    let t = Instant::now();
    ctl.apply(
        Kind::EndpointSlices,
        Event::Apply(dynamic(slice(
            "svc0-a",
            "svc0",
            vec![ready("198.18.0.1", "n0")],
        ))),
    );
    ctl.reconcile().unwrap();
    let again = t.elapsed();
    println!(
        "{} services, {} backends: 1,000 slices parsed in {applied:?}, first round {first:?}, \
         a round after one slice change {again:?}",
        r.services.len(),
        r.services.iter().map(|s| s.backends.len()).sum::<usize>()
    );
}

#[test]
fn metrics_encode() {
    let stats = std::sync::Arc::new(kube::Stats::default());
    let mut registry = prometheus_client::registry::Registry::with_prefix("strait");
    registry.register_collector(Box::new(kube::KubeMetrics(std::sync::Arc::clone(&stats))));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    for line in [
        "strait_kube_connected 0",
        "strait_kube_lists_total{kind=\"endpointslices\"} 0",
        "strait_kube_watch_expired_total{kind=\"services\"} 0",
        "strait_kube_status_writes_total{result=\"error\"} 0",
        "strait_kube_skipped{reason=\"unsupported_protocol\"} 0",
        "strait_kube_addresses 0",
    ] {
        assert!(out.lines().any(|l| l == line), "no {line:?} in\n{out}");
    }
}

#[test]
fn the_fake_api_speaks_the_wire_format_kube_rs_expects() {
    use ::kube::api::{Api, ListParams, WatchEvent, WatchParams};
    use futures::StreamExt;
    let (api, dir) = fake("fake");
    api.apply(lb("web"));
    let mut other = lb("db");
    other["metadata"]["namespace"] = json!("prod");
    api.apply(other);
    let kc = api.kubeconfig(dir.path());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = kube::connect(Some(&kc)).await.unwrap();
        // Lists, cluster-wide and namespaced, paged.
        let all: Api<Service> = Api::all(client.clone());
        let l = all.list(&ListParams::default()).await.unwrap();
        assert_eq!(l.items.len(), 2);
        let first = all.list(&ListParams::default().limit(1)).await.unwrap();
        assert_eq!(first.items.len(), 1);
        let token = first.metadata.continue_.clone().expect("a continue token");
        let second = all
            .list(&ListParams::default().limit(1).continue_token(&token))
            .await
            .unwrap();
        assert_eq!(second.items.len(), 1);
        assert_ne!(first.items[0].metadata.name, second.items[0].metadata.name);
        let prod: Api<Service> = Api::namespaced(client.clone(), "prod");
        let l = prod.list(&ListParams::default()).await.unwrap();
        assert_eq!(l.items.len(), 1);
        assert_eq!(
            prod.get("db").await.unwrap().metadata.uid.as_deref(),
            Some("uid-5")
        );
        let e = prod.get("nope").await.unwrap_err();
        assert!(
            matches!(e, ::kube::Error::Api(ref s) if s.code == 404),
            "{e}"
        );
        let nodes: Api<Node> = Api::all(client.clone());
        assert_eq!(
            nodes
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len(),
            3
        );

        // A watch from the list's version sees a change, then a 410 once compacted.
        let rv = l.metadata.resource_version.unwrap();
        let mut w = prod
            .watch(&WatchParams::default().timeout(5), &rv)
            .await
            .unwrap()
            .boxed();
        let mut db = lb("db");
        db["metadata"]["namespace"] = json!("prod");
        db["spec"]["ports"][0]["port"] = json!(5432);
        api.apply(db);
        match w.next().await {
            Some(Ok(WatchEvent::Modified(s))) => {
                assert_eq!(s.spec.unwrap().ports.unwrap()[0].port, 5432);
            }
            other => panic!("{other:?}"),
        }
        api.expire();
        match w.next().await {
            Some(Ok(WatchEvent::Error(s))) => {
                assert_eq!((s.code, s.reason.as_str()), (410, "Expired"))
            }
            other => panic!("{other:?}"),
        }
        let mut w = prod
            .watch(&WatchParams::default(), &rv)
            .await
            .unwrap()
            .boxed();
        assert!(matches!(w.next().await, Some(Ok(WatchEvent::Error(s))) if s.code == 410));
    });
}

// ---- several gateways: one writer, elected by a Lease ------------------------------------

fn with_lease(identity: &str) -> Settings {
    let mut s = settings(Mode::DsrL2);
    s.lease = Some(kubemodel::settings::LeaseSettings {
        namespace: "strait-system".into(),
        name: "strait-gateway".into(),
        identity: identity.into(),
        duration: Duration::from_secs(2),
    });
    s
}

fn holder(api: &FakeApi) -> Option<String> {
    api.get(Res::Leases, "strait-system", "strait-gateway")
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
}

/// Status writes of Service `name` so far.
fn status_writes(api: &FakeApi, name: &str) -> usize {
    let path = format!("/services/{name}/status");
    api.requests()
        .iter()
        .filter(|r| r.starts_with("PATCH") && r.contains(&path))
        .count()
}

#[test]
fn one_gateway_writes_status_and_hands_over_when_it_stops() {
    let (api, dir) = fake("lease");
    api.apply(node("n1", "198.51.100.21"));
    let (a, rx_a) = start(&api, &dir, with_lease("gw-a"));
    eventually(5, "gw-a holds the lease", || {
        holder(&api).as_deref() == Some("gw-a")
    });
    let (b, rx_b) = start(&api, &dir, with_lease("gw-b"));
    api.apply(lb("web"));
    // Both serve it; only the leader writes its status, once.
    for rx in [&rx_a, &rx_b] {
        until(rx, 10, "web served", |l| {
            l.iter().any(|s| s.name.contains("web"))
        });
    }
    let ip = |name: &str| {
        api.get(Res::Services, "default", name).and_then(|s| {
            s["status"]["loadBalancer"]["ingress"][0]["ip"]
                .as_str()
                .map(str::to_owned)
        })
    };
    eventually(5, "web's status", || ip("web").is_some());
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(status_writes(&api, "web"), 1, "{:#?}", api.requests());
    assert_eq!(holder(&api).as_deref(), Some("gw-a"));
    // The leader stops (it releases the lease): gw-b takes over within the duration and
    // writes what is new.
    drop(a);
    let stopped = Instant::now();
    eventually(3, "gw-b holds the lease", || {
        holder(&api).as_deref() == Some("gw-b")
    });
    eprintln!("handed over in {:?}", stopped.elapsed());
    api.apply(lb("api"));
    eventually(5, "api's status, written by gw-b", || ip("api").is_some());
    assert_ne!(ip("api"), ip("web"));
    drop(b);
}

#[test]
fn a_silent_leader_is_replaced_after_the_lease_duration() {
    let (api, dir) = fake("lease-expiry");
    // A leader that died without releasing: its record never changes again.
    api.apply(json!({
        "kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
        "metadata": { "name": "strait-gateway", "namespace": "strait-system" },
        "spec": {
            "holderIdentity": "gw-dead", "leaseDurationSeconds": 2,
            "renewTime": "2026-01-01T00:00:00.000000Z", "leaseTransitions": 3
        }
    }));
    let t = Instant::now();
    let (b, _rx) = start(&api, &dir, with_lease("gw-b"));
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(
        holder(&api).as_deref(),
        Some("gw-dead"),
        "taken before the duration"
    );
    eventually(5, "gw-b takes over", || {
        holder(&api).as_deref() == Some("gw-b")
    });
    let took = t.elapsed();
    assert!(took >= Duration::from_secs(2), "took over after {took:?}");
    let l = api
        .get(Res::Leases, "strait-system", "strait-gateway")
        .unwrap();
    assert_eq!(l["spec"]["leaseTransitions"], 4);
    drop(b);
}

// ---- Node updates that change nothing relevant ---------------------------------------

/// Node `name` as a kubelet reports it at heartbeat `beat`: the four conditions with their
/// heartbeat times, capacity, images, labels and annotations that change nothing Strait
/// reads.
fn kubelet_node(name: &str, ip: &str, ready: bool, beat: u32) -> Value {
    let t = format!("2026-01-01T00:{:02}:{:02}Z", beat / 60 % 60, beat % 60);
    let cond = |ty: &str, status: &str| {
        json!({ "type": ty, "status": status, "reason": "Kubelet", "lastHeartbeatTime": t,
                "lastTransitionTime": "2026-01-01T00:00:00Z" })
    };
    let mut n = node(name, ip);
    n["metadata"]["labels"] = json!({ "kubernetes.io/hostname": name, "beat": beat.to_string() });
    n["metadata"]["annotations"] = json!({ "node.alpha.kubernetes.io/ttl": beat.to_string() });
    n["status"]["conditions"] = json!([
        cond("MemoryPressure", "False"),
        cond("DiskPressure", "False"),
        cond("PIDPressure", "False"),
        cond("Ready", if ready { "True" } else { "False" }),
    ]);
    n["status"]["images"] =
        json!([{ "names": [format!("app:v{beat}")], "sizeBytes": 1000 + beat }]);
    n["status"]["allocatable"] = json!({ "cpu": "8", "memory": format!("{}Mi", 32000 + beat) });
    n
}

/// A dsr-l2 Service `name` under `policy`, with `nodePort` so that NodePort rules apply.
fn dsr_lb(name: &str, policy: &str) -> Value {
    let mut s = lb(name);
    s["spec"]["externalTrafficPolicy"] = json!(policy);
    s
}

#[test]
fn a_heartbeat_only_node_update_costs_no_round_and_changes_no_table() {
    // Two dsr-l2 Services: `all` under Cluster (every Node a backend), `local` under Local
    // with pods on n1 only.
    let mut ctl = Controller::new(settings(Mode::DsrL2));
    list(
        &mut ctl,
        Kind::Services,
        vec![dsr_lb("all", "Cluster"), dsr_lb("local", "Local")],
    );
    list(
        &mut ctl,
        Kind::EndpointSlices,
        vec![slice("local-a", "local", vec![ready("192.0.2.11", "n1")])],
    );
    let nodes: Vec<Value> = (1..=3)
        .map(|i| kubelet_node(&format!("n{i}"), &format!("198.51.100.{i}"), true, 0))
        .collect();
    list(&mut ctl, Kind::Nodes, nodes);
    let first = ctl.reconcile().unwrap();
    assert_eq!(first.translated, 2);
    let all = first
        .services
        .iter()
        .find(|s| s.name.starts_with("default/all/"))
        .unwrap();
    assert_eq!(all.backends.len(), 3);

    // A hundred heartbeats: new times, images, allocatable, an unrelated label and
    // annotation, a new resource version. None asks for a round; a round made anyway
    // translates nothing and changes nothing.
    for beat in 1..=100u32 {
        let i = beat % 3 + 1;
        let mut n = kubelet_node(&format!("n{i}"), &format!("198.51.100.{i}"), true, beat);
        n["metadata"]["resourceVersion"] = json!(beat.to_string());
        assert!(
            !ctl.apply(Kind::Nodes, Event::Apply(dynamic(n))),
            "heartbeat {beat} of n{i} asked for a round"
        );
    }
    let r = ctl.reconcile().unwrap();
    assert_eq!(r.translated, 0, "a heartbeat re-translated Services");
    assert!(!r.changed && r.changes.is_empty());
    // What the heartbeats left equals a translation from scratch of the stored Nodes.
    let full = ctl.translate_all();
    let got: Vec<model::Service> = r.services.iter().map(|s| (**s).clone()).collect();
    assert_eq!(got, full.services);

    // n3 (no pod of `local`) turns NotReady: `all` only is translated again, and its n3
    // backend drains.
    let n3 = kubelet_node("n3", "198.51.100.3", false, 101);
    assert!(ctl.apply(Kind::Nodes, Event::Apply(dynamic(n3))));
    let r = ctl.reconcile().unwrap();
    assert_eq!(r.translated, 1, "only the Cluster Service reads n3");
    assert_eq!(r.changes.len(), 1);
    let all = r.changes[0].1.as_ref().unwrap();
    assert!(all.name.starts_with("default/all/"));
    assert_eq!(
        backends(all)[2],
        ("198.51.100.3:80".to_owned(), BackendState::Draining)
    );
    // n1 (the pod's) changes its address: both Services.
    let n1 = kubelet_node("n1", "198.51.100.9", true, 102);
    assert!(ctl.apply(Kind::Nodes, Event::Apply(dynamic(n1))));
    let r = ctl.reconcile().unwrap();
    assert_eq!(r.translated, 2);
    assert_eq!(r.changes.len(), 2);
    // A label that excludes n2 from load balancers counts; another label does not.
    let mut n2 = kubelet_node("n2", "198.51.100.2", true, 103);
    n2["metadata"]["labels"]["topology.kubernetes.io/zone"] = json!("b");
    assert!(!ctl.apply(Kind::Nodes, Event::Apply(dynamic(n2.clone()))));
    n2["metadata"]["labels"]["node.kubernetes.io/exclude-from-external-load-balancers"] = json!("");
    assert!(ctl.apply(Kind::Nodes, Event::Apply(dynamic(n2))));
    let r = ctl.reconcile().unwrap();
    assert_eq!(r.translated, 1);
    let all = r.changes[0].1.as_ref().unwrap();
    assert_eq!(all.backends.len(), 2);
    // A new Node whose InternalIP does not parse: no backend, but a warning, and a round
    // for it.
    let mut bad = kubelet_node("n4", "not-an-address", true, 104);
    bad["metadata"]["resourceVersion"] = json!("104");
    assert!(ctl.apply(Kind::Nodes, Event::Apply(dynamic(bad.clone()))));
    let r = ctl.reconcile().unwrap();
    assert_eq!(r.translated, 0, "an unusable Node is no Service's backend");
    assert!(r.warnings.iter().any(|w| w.kind == WarningKind::BadAddress));
    bad["metadata"]["resourceVersion"] = json!("105");
    assert!(
        !ctl.apply(Kind::Nodes, Event::Apply(dynamic(bad))),
        "the same warning again is no change"
    );
    let full = ctl.translate_all();
    let r = ctl.reconcile().unwrap();
    let got: Vec<model::Service> = r.services.iter().map(|s| (**s).clone()).collect();
    assert_eq!(got, full.services);
}

// ---- externalTrafficPolicy: Local by weight ------------------------------------------

#[test]
fn local_policy_weights_each_node_by_its_ready_endpoints() {
    let st = settings(Mode::DsrL2);
    let mut objs = three_nodes();
    objs.push(dsr_lb("web", "Local"));
    // n1 runs ten ready pods; n2 one ready, one not ready and one terminating; n3 only a
    // terminating one.
    let mut eps: Vec<Value> = (0..10)
        .map(|i| ready(&format!("192.0.2.{}", 10 + i), "n1"))
        .collect();
    eps.push(ready("192.0.2.30", "n2"));
    eps.push(ep(
        "192.0.2.31",
        "n2",
        Some(false),
        Some(false),
        Some(false),
    ));
    eps.push(ep("192.0.2.32", "n2", Some(false), Some(true), Some(true)));
    eps.push(ep("192.0.2.40", "n3", Some(false), Some(true), Some(true)));
    objs.push(slice("web-a", "web", eps));
    let t = tr(&st, &objs, WEB_17);
    let s = find(&t, "default/web/http/203.0.113.17");
    let weights: Vec<(String, BackendState, u32)> = s
        .backends
        .iter()
        .map(|b| (b.socket_addr().to_string(), b.state, b.weight))
        .collect();
    assert_eq!(
        weights,
        [
            ("198.51.100.1:80".to_owned(), BackendState::Active, 10),
            ("198.51.100.2:80".to_owned(), BackendState::Active, 1),
            ("198.51.100.3:80".to_owned(), BackendState::Draining, 1),
        ]
    );

    // The table the gateway builds from it: n1 holds ten times n2's share of the Maglev
    // slots (within 2 %), n3 none.
    let cfg = model::Config {
        gateway: st.gateway.clone(),
        services: t.services.clone(),
    };
    let port = strait_dataplane::table::Port::new(model::MacAddr([2, 0, 0, 0, 0, 1]), 1500);
    let table = strait_dataplane::table::Builder::new()
        .build(&cfg, &[port], |_, _, _| false)
        .unwrap();
    let svc = &table.services[0];
    let counts = svc.maglev.count_per_backend(svc.members.len());
    let share: BTreeMap<IpAddr, u32> = svc
        .members
        .iter()
        .zip(&counts)
        .map(|(&id, &c)| (table.backend(id).unwrap().socket_addr().ip(), c))
        .collect();
    assert_eq!(share.len(), 2, "{share:?}");
    let (n1, n2) = (share[&ip("198.51.100.1")], share[&ip("198.51.100.2")]);
    assert_eq!(n1 + n2, svc.maglev.size());
    let ratio = f64::from(n1) / f64::from(n2);
    assert!(
        (ratio - 10.0).abs() < 0.2,
        "n1 {n1} n2 {n2} slots: {ratio:.3}"
    );

    // Under Cluster every node weighs the same.
    let mut objs = three_nodes();
    objs.push(dsr_lb("web", "Cluster"));
    let t = tr(&st, &objs, WEB_17);
    let s = find(&t, "default/web/http/203.0.113.17");
    assert!(s
        .backends
        .iter()
        .all(|b| b.weight == model::Backend::DEFAULT_WEIGHT));

    // A pod more on n2 is a change of its weight, through the controller.
    let mut ctl = Controller::new(st);
    list(&mut ctl, Kind::Services, vec![dsr_lb("web", "Local")]);
    list(&mut ctl, Kind::Nodes, three_nodes());
    list(
        &mut ctl,
        Kind::EndpointSlices,
        vec![slice("web-a", "web", vec![ready("192.0.2.10", "n2")])],
    );
    let r = ctl.reconcile().unwrap();
    assert_eq!(r.services[0].backends[0].weight, 1);
    ctl.apply(
        Kind::EndpointSlices,
        Event::Apply(dynamic(slice(
            "web-a",
            "web",
            vec![ready("192.0.2.10", "n2"), ready("192.0.2.11", "n2")],
        ))),
    );
    let r = ctl.reconcile().unwrap();
    assert_eq!(r.changes.len(), 1);
    assert_eq!(r.services[0].backends[0].weight, 2);
}

// ---- status writes beside the loop -----------------------------------------------

/// The published list's VIP of Service `name`.
fn vip_of(l: &[model::Service], name: &str) -> Option<IpAddr> {
    l.iter()
        .find(|s| s.name.starts_with(&format!("default/{name}/")))
        .map(|s| s.vip)
}

/// `PATCH` requests for Service `name`'s status so far.
fn status_patches(api: &FakeApi, name: &str) -> usize {
    let path = format!("PATCH /api/v1/namespaces/default/services/{name}/status");
    api.requests()
        .iter()
        .filter(|r| r.starts_with(&path))
        .count()
}

#[test]
fn a_slow_or_refusing_api_server_delays_no_table_update_and_the_latest_status_lands() {
    use strait_testkit::fake_api::StatusFault;
    let (api, dir) = fake("slowstatus");
    // A loaded server: every status write is held 4.5 s, then applied (within the
    // source's 5 s timeout, so each lands). Three Services want one each.
    api.set_status_fault(StatusFault::Delay(Duration::from_millis(4500)));
    for n in ["web", "b", "c"] {
        api.apply(lb(n));
    }
    api.apply(slice("web-a", "web", vec![ready("192.0.2.11", "n1")]));
    let (src, rx) = start(&api, &dir, settings(Mode::Nat));
    until(&rx, 20, "web with one backend", |l| {
        backend_count(l, "default/web/") == Some(1)
    });
    eventually(10, "status writes held by the server", || {
        api.status_writes_held() >= 1
    });
    // EndpointSlice changes while the writes are held: each is published at once, with a
    // write still pending (the loop that waited for them would take 4.5 s per write).
    for n in 2..=3 {
        let eps = (1..=n)
            .map(|h| ready(&format!("192.0.2.{}", 10 + h), "n1"))
            .collect();
        let t = Instant::now();
        api.apply(slice("web-a", "web", eps));
        until(&rx, 10, "the new backend", |l| {
            backend_count(l, "default/web/") == Some(n)
        });
        let took = t.elapsed();
        let held = api.status_writes_held();
        assert!(
            took < Duration::from_secs(3),
            "a table update waited {took:?} behind status writes"
        );
        assert!(held >= 1, "the status writes finished before the update");
    }
    for (n, ip) in [
        ("web", "203.0.113.17"),
        ("b", "203.0.113.18"),
        ("c", "203.0.113.19"),
    ] {
        eventually(15, "the slow writes land", || has_status(&api, n, ip));
    }

    // A forbidding server: every status write refused with 403. web asks for .20, then
    // for .21: each new address is served at once, the status waits.
    api.set_status_fault(StatusFault::Refuse(403));
    let landed = api.status_writes().len();
    let errors = src.stats().status_write_errors();
    for ip in ["203.0.113.20", "203.0.113.21"] {
        edit(&api, "web", |v| {
            v["metadata"]["annotations"] = json!({ "strait.dev/load-balancer-ip": ip });
        });
        let t = Instant::now();
        until(&rx, 10, "web on its requested address", |l| {
            vip_of(l, "web") == Some(ip.parse().unwrap())
        });
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        eventually(10, "a refused write", || {
            src.stats().status_write_errors() > errors
        });
    }
    // Retried with back-off (100 ms doubling to 800 ms here): a handful of attempts in
    // 3 s, not one per event or a tight loop; and a slice change still goes through.
    let before = status_patches(&api, "web");
    let t = Instant::now();
    api.apply(slice("web-a", "web", vec![ready("192.0.2.11", "n1")]));
    until(&rx, 10, "one backend again", |l| {
        backend_count(l, "default/web/") == Some(1)
    });
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    std::thread::sleep(Duration::from_secs(3));
    let attempts = status_patches(&api, "web") - before;
    assert!(
        (2..=15).contains(&attempts),
        "{attempts} status writes for web in 3 s of 403s"
    );
    assert_eq!(api.status_writes().len(), landed, "a refused write landed");

    // The server heals: the latest wanted status lands, and no older one after it (.20
    // was wanted only while every write was refused: it never lands).
    api.set_status_fault(StatusFault::None);
    eventually(10, "web's latest status", || {
        has_status(&api, "web", "203.0.113.21")
    });
    std::thread::sleep(Duration::from_millis(500));
    let web: Vec<Value> = api
        .status_writes()
        .into_iter()
        .skip(landed)
        .filter(|(k, _)| k == "default/web")
        .map(|(_, s)| s["loadBalancer"]["ingress"].clone())
        .collect();
    assert!(!web.is_empty());
    assert!(
        web.iter().all(|i| i[0]["ip"] != "203.0.113.20"),
        "a superseded status landed: {web:?}"
    );
    assert_eq!(web.last().unwrap()[0]["ip"], "203.0.113.21", "{web:?}");
    assert_eq!(status_ips(&api, "web"), ["203.0.113.21"]);
}

/// The ClusterRole's rules in `deploy/rbac.yaml`, as (API group, resource, verbs).
fn cluster_role_rules() -> Vec<(String, String, Vec<String>)> {
    let rbac = include_str!("../../deploy/rbac.yaml");
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(rbac) {
        let v: Value = serde::Deserialize::deserialize(doc).expect("deploy/rbac.yaml parses");
        if v["kind"] != "ClusterRole" {
            continue;
        }
        for rule in v["rules"].as_array().expect("rules") {
            let strings = |k: &str| -> Vec<String> {
                rule[k]
                    .as_array()
                    .unwrap_or_else(|| panic!("a rule without {k}: {rule}"))
                    .iter()
                    .map(|s| s.as_str().expect("a string").to_owned())
                    .collect()
            };
            for g in strings("apiGroups") {
                for r in strings("resources") {
                    out.push((g.clone(), r, strings("verbs")));
                }
            }
        }
    }
    out
}

#[test]
fn the_cluster_role_grants_namespaces_and_pool_status_exactly() {
    let rules = cluster_role_rules();
    let verbs = |group: &str, resource: &str| -> Vec<String> {
        let mut v: Vec<String> = rules
            .iter()
            .filter(|(g, r, _)| g == group && r == resource)
            .flat_map(|(_, _, v)| v.clone())
            .collect();
        v.sort();
        v
    };
    // The Namespace watch (labels for pools' namespaceSelectors): read only.
    assert_eq!(verbs("", "namespaces"), ["get", "list", "watch"]);
    // Pool status goes through the status subresource with a merge patch, nothing else.
    assert_eq!(verbs("strait.dev", "straitaddresspools/status"), ["patch"]);
    assert_eq!(
        verbs("strait.dev", "straitaddresspools"),
        ["get", "list", "watch"]
    );
    assert!(
        rules
            .iter()
            .all(|(_, r, v)| !v.iter().any(|v| v == "*") && r != "*"),
        "no wildcard: {rules:?}"
    );
}

/// What translation leaves out of a Service is an Event on it (so
/// `kubectl describe svc` says why), given once while it stands, counted in the metrics.
#[test]
fn what_translation_leaves_out_of_a_service_is_an_event_on_it_once() {
    let (api, dir) = fake("left-out");
    let mut odd = lb("odd");
    odd["spec"]["ports"] = json!([
        { "name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080 },
        { "name": "x", "port": 9, "protocol": "DCCP", "nodePort": 30081 }
    ]);
    odd["spec"]["loadBalancerSourceRanges"] = json!(["not-a-cidr"]);
    api.apply(odd);
    api.apply(lb("fine"));
    let mut st = settings(Mode::DsrL2);
    st.pools = vec!["203.0.113.16/29".parse().unwrap()];
    let (src, rx) = start(&api, &dir, st);
    // odd's one source range does not parse, so no IPv4 client may reach it: its frontend is
    // left out too (a second BadSourceRange); fine is served.
    until(&rx, 20, "fine", |l| {
        backend_count(l, "default/fine/").is_some()
    });
    for reason in ["UnsupportedProtocol", "BadSourceRange"] {
        eventually(10, reason, || has_event(&api, reason, "odd"));
    }
    let ev = event(&api, "UnsupportedProtocol");
    assert_eq!(ev["type"], "Warning", "{ev}");
    assert!(ev["note"].as_str().unwrap().contains("DCCP"), "{ev}");
    assert!(
        !api.events()
            .iter()
            .any(|e| e["regarding"]["name"] == "fine" && e["type"] == "Warning"),
        "{:?}",
        api.events()
    );
    // More rounds (a Node comes and goes) give no second Event while the problem stands.
    api.apply(node("n9", "198.51.100.9"));
    api.delete(Res::Nodes, "", "n9");
    std::thread::sleep(std::time::Duration::from_secs(2));
    let given: Vec<(String, String)> = api
        .events()
        .iter()
        .filter(|e| e["regarding"]["name"] == "odd" && e["type"] == "Warning")
        .map(|e| (e["reason"].to_string(), e["note"].to_string()))
        .collect();
    let distinct: std::collections::BTreeSet<_> = given.iter().cloned().collect();
    assert_eq!(
        given.len(),
        distinct.len(),
        "an Event given twice: {given:?}"
    );
    // The two BadSourceRange notices say different things: an Event each.
    let reasons: Vec<&str> = given.iter().map(|(r, _)| r.trim_matches('"')).collect();
    assert_eq!(
        reasons.iter().filter(|&&r| r == "BadSourceRange").count(),
        2,
        "{given:?}"
    );
    assert_eq!(
        reasons
            .iter()
            .filter(|&&r| r == "UnsupportedProtocol")
            .count(),
        1,
        "{given:?}"
    );
    assert!(src.stats().events() >= 3);

    // Fixed, then broken again the same way within minutes: the Event's series grows, no
    // new Event.
    let fixed_again = || {
        let mut fixed = lb("odd");
        fixed["spec"]["loadBalancerSourceRanges"] = json!(["198.51.100.0/24"]);
        fixed
    };
    let odd_port = || {
        let mut again = lb("odd");
        again["spec"]["ports"] = json!([
            { "name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080 },
            { "name": "x", "port": 9, "protocol": "DCCP", "nodePort": 30081 }
        ]);
        again
    };
    // The fixed Service served: the bad notices are gone.
    let fixed_served = |l: &[model::Service]| {
        l.iter().any(|s| {
            s.name.starts_with("default/odd/")
                && s.source_ranges == ["198.51.100.0/24".parse::<ipnet::IpNet>().unwrap()]
        })
    };
    api.apply(fixed_again());
    until(&rx, 10, "the fixed Service served", fixed_served);
    api.apply(odd_port());
    eventually(10, "the series", || {
        api.events().iter().any(|e| {
            e["reason"] == "UnsupportedProtocol" && e["series"]["count"].as_i64() == Some(2)
        })
    });
    assert_eq!(
        api.events()
            .iter()
            .filter(|e| e["reason"] == "UnsupportedProtocol")
            .count(),
        1,
        "{:?}",
        api.events()
    );

    // The server dropped its Events meanwhile (its event TTL): the next repeat cannot
    // extend the series, and is an Event again.
    api.expire_events();
    api.apply(fixed_again());
    until(&rx, 10, "fixed again", fixed_served);
    api.apply(odd_port());
    eventually(10, "a new Event", || {
        has_event(&api, "UnsupportedProtocol", "odd")
    });
    let ev = event(&api, "UnsupportedProtocol");
    assert!(ev["series"].is_null(), "{ev}");
}
