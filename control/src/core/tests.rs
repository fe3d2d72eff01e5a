use std::sync::Arc;
use std::time::Instant;

use strait_config::model::{MacAddr, Service};
use strait_dataplane::table::{Health, Port, ServiceTable};
use strait_testkit::config::{GatewayToml, ServiceToml};

use super::*;
use crate::kubemodel::Publication;

/// A core and the little of a world these tests need: the live table (what the driver swaps
/// in), the neighbour table reads answer with, and what was probed, claimed and checked.
struct Driven {
    core: Control,
    now: Instant,
    live: Arc<ServiceTable>,
    neighbours: Neighbours,
    probed: Vec<IpAddr>,
    claimed: BTreeSet<IpAddr>,
    checks: BTreeSet<BackendKey>,
    /// The checks stopped, in order.
    stopped: Vec<BackendKey>,
    routes: Arc<RouteMap>,
    /// The backends passive health took out, in order.
    passive_out: Vec<BackendKey>,
}

impl Driven {
    fn new(toml: &str) -> Self {
        let config = strait_config::parse(toml).unwrap();
        let ports = vec![Port::new(MacAddr([2, 0, 0, 0, 0, 1]), 1500)];
        let now = Instant::now();
        let loaded = Loaded {
            config,
            locals: Vec::new(),
            neighbours: Neighbours::default(),
        };
        let core = Control::new(now, loaded, ports).unwrap();
        let live = Arc::clone(core.table());
        let mut d = Self {
            core,
            now,
            live,
            neighbours: Neighbours::default(),
            probed: Vec::new(),
            claimed: BTreeSet::new(),
            checks: BTreeSet::new(),
            stopped: Vec::new(),
            routes: Arc::default(),
            passive_out: Vec::new(),
        };
        d.run();
        d
    }

    fn handle(&mut self, event: Event) -> Result<(), Error> {
        let r = self.core.handle(self.now, event);
        self.run();
        r
    }

    fn run(&mut self) {
        while let Some(e) = self.core.poll_effect() {
            match e {
                Effect::Publish { table, .. } => {
                    let old = std::mem::replace(&mut self.live, table);
                    self.core.recycle(old);
                }
                Effect::ReadNeighbours(scope) => {
                    let read = match scope {
                        Scope::All => self.neighbours.clone(),
                        Scope::Targets(t) => self.neighbours.part(&t),
                    };
                    self.core.handle(self.now, Event::Neighbours(read)).unwrap();
                }
                Effect::Probe { hops, .. } => self.probed.extend(hops),
                Effect::ClaimVips(v) => self.claimed.extend(v),
                Effect::ReleaseVips(v) => {
                    for vip in v {
                        self.claimed.remove(&vip);
                    }
                }
                Effect::StartCheck { backend, .. } => {
                    self.checks.insert(backend);
                }
                Effect::StopCheck { backend } => {
                    self.checks.remove(&backend);
                    self.stopped.push(backend);
                }
                Effect::PassiveOut { backend, .. } => self.passive_out.push(backend),
                Effect::Routes(r) => self.routes = r,
                Effect::Status { .. } | Effect::RetryMaps => {}
            }
        }
    }
}

/// A TCP health check with the default timings.
const TCP_CHECK: &str = r#"{ kind = "tcp" }"#;

fn ip(a: &str) -> IpAddr {
    a.parse().unwrap()
}

/// A file with one dsr-l2 service on `lo` whose backends (with MACs) are `backends`; the
/// driver's tests share it.
pub(crate) fn config(backends: &[&str]) -> String {
    gateway().service(web(backends)).to_string()
}

/// The gateway of [`config`], without its service.
fn gateway() -> GatewayToml {
    GatewayToml::new()
        .set("admin_listen", r#""127.0.0.1:0""#)
        .interface("lo", &[0])
}

/// The service of [`config`].
fn web(backends: &[&str]) -> ServiceToml {
    backends.iter().fold(
        ServiceToml::new("web", "203.0.113.10", 80).maglev_table_size(251),
        |s, a| s.backend_mac(a, 80, "02:00:00:00:01:11"),
    )
}

#[test]
fn kubernetes_changes_update_the_table_in_place() {
    let mut c = Driven::new(&config(&["198.51.100.11"]));
    let web = c.core.config().services[0].clone();
    let kube = |name: &str, vip: &str, backends: &[&str]| {
        let mut s = web.clone();
        s.name = name.to_owned();
        s.vip = vip.parse().unwrap();
        s.backends = backends
            .iter()
            .map(|a| {
                let mut b = web.backends[0].clone();
                b.address = a.parse().unwrap();
                b
            })
            .collect();
        Arc::new(s)
    };
    let set = |s: &Arc<Service>| (s.name.clone(), Some(Arc::clone(s)));
    let a = kube("default/a", "203.0.113.20", &["198.51.100.21"]);
    // Left out by the merge: web's frontend, and web's name.
    let b = kube("default/b", "203.0.113.10", &["198.51.100.31"]);
    let w = kube("web", "203.0.113.30", &["198.51.100.41"]);
    let first = vec![Arc::clone(&a), Arc::clone(&b), Arc::clone(&w)];
    c.handle(Event::Kube(vec![Publication {
        services: first.clone(),
        changes: first.iter().map(set).collect(),
    }]))
    .unwrap();
    let t1 = Arc::clone(&c.live);
    let names = |t: &ServiceTable| {
        let mut v: Vec<String> = t.services.iter().map(|s| s.name.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&t1), ["default/a", "web"]);
    let file = (**c.core.file()).clone();
    assert_eq!(
        c.core.config().clone(),
        crate::kubemodel::merge(&file, &first).0,
        "edited in place, the configuration is what a merge from scratch gives"
    );
    assert_eq!(t1.generation, 2);
    let web_backend = |t: &ServiceTable| {
        let s = t.services.iter().find(|s| s.name == "web").unwrap();
        t.backend(s.backends[0]).unwrap().address()
    };
    assert_eq!(
        web_backend(&t1),
        ip("198.51.100.11"),
        "the file's web stays"
    );
    // Two publications before the loop looks: both apply, in order.
    let a2 = kube("default/a", "203.0.113.20", &["198.51.100.22"]);
    let d = kube("default/d", "203.0.113.21", &["198.51.100.23"]);
    c.handle(Event::Kube(vec![
        Publication {
            services: vec![Arc::clone(&a2)],
            changes: vec![set(&a2)],
        },
        Publication {
            services: vec![Arc::clone(&d)],
            changes: vec![("default/a".into(), None), set(&d)],
        },
    ]))
    .unwrap();
    let t2 = Arc::clone(&c.live);
    assert_eq!(names(&t2), ["default/d", "web"]);
    assert_eq!(t2.generation, 3, "one update for both publications");
    // Updated in place: the unchanged service is shared, not rebuilt.
    let svc =
        |t: &ServiceTable, n: &str| Arc::clone(t.services.iter().find(|s| s.name == n).unwrap());
    assert!(Arc::ptr_eq(&svc(&t1, "web"), &svc(&t2, "web")));
    assert_eq!(
        c.core.config().clone(),
        crate::kubemodel::merge(&file, &[d]).0
    );
    // Nobody else holds the replaced table: the builder keeps it for the next update.
    drop((t1, t2));
    let d2 = kube("default/d", "203.0.113.21", &["198.51.100.24"]);
    c.handle(Event::Kube(vec![Publication {
        services: vec![Arc::clone(&d2)],
        changes: vec![set(&d2)],
    }]))
    .unwrap();
    assert!(c.core.has_spare(), "the replaced table was not recycled");
}

#[test]
fn a_health_flap_updates_its_service_only() {
    let toml = gateway()
        .service(web(&["198.51.100.11", "198.51.100.12"]).set("health_check", TCP_CHECK))
        .service(ServiceToml::new("api", "203.0.113.11", 80).backend_mac(
            "198.51.100.13",
            80,
            "02:00:00:00:01:13",
        ))
        .to_string();
    let mut c = Driven::new(&toml);
    assert_eq!(c.checks.len(), 2, "both web backends checked, api not");
    let t1 = Arc::clone(&c.live);
    let b1 = BackendKey::new("web", ip("198.51.100.11"), 80);
    c.handle(Event::Health(vec![(b1.clone(), false)])).unwrap();
    let t2 = Arc::clone(&c.live);
    assert_eq!(t2.generation, t1.generation + 1);
    let svc =
        |t: &ServiceTable, n: &str| Arc::clone(t.services.iter().find(|s| s.name == n).unwrap());
    assert!(
        Arc::ptr_eq(&svc(&t1, "api"), &svc(&t2, "api")),
        "api untouched"
    );
    let web = svc(&t2, "web");
    let health: Vec<Health> = web
        .backends
        .iter()
        .map(|&id| t2.backend(id).unwrap().health)
        .collect();
    assert_eq!(health.iter().filter(|h| **h == Health::Down).count(), 1);
    assert!(
        web.backends
            .iter()
            .all(|&id| t2.backend(id).unwrap().mac.is_some()),
        "MACs kept"
    );
    // The same report again, or one of a backend nobody checks: nothing.
    let api = BackendKey::new("api", ip("198.51.100.13"), 80);
    c.handle(Event::Health(vec![(b1.clone(), false), (api, false)]))
        .unwrap();
    assert_eq!(c.live.generation, t2.generation);
    c.handle(Event::Health(vec![(b1, true)])).unwrap();
    assert_eq!(c.live.generation, t2.generation + 1);
}

#[test]
fn routes_follow_forwarding_health_and_drain() {
    // web (two checked backends) and api share 203.0.113.10; solo has .11 and one checked
    // backend; .12 is outside `announce`.
    let toml = gateway()
        .table(
            "[gateway.bgp]\nasn = 64512\nrouter_id = \"192.0.2.1\"\nannounce = [\"203.0.113.10/31\"]\n\
             peers = [{ address = \"198.51.100.1\", asn = 64500 }]",
        )
        .service(web(&["198.51.100.11", "198.51.100.12"]).set("health_check", TCP_CHECK))
        .service(
            ServiceToml::new("api", "203.0.113.10", 443)
                .set("health_check", TCP_CHECK)
                .backend_mac("198.51.100.13", 443, "02:00:00:00:01:13"),
        )
        .service(
            ServiceToml::new("solo", "203.0.113.11", 80)
                .set("health_check", TCP_CHECK)
                .backend_mac("198.51.100.14", 80, "02:00:00:00:01:14"),
        )
        .service(ServiceToml::new("other", "203.0.113.12", 80).backend_mac(
            "198.51.100.15",
            80,
            "02:00:00:00:01:15",
        ))
        .to_string();
    let mut c = Driven::new(&toml);
    let (web, solo, other) = (ip("203.0.113.10"), ip("203.0.113.11"), ip("203.0.113.12"));
    let route = |c: &Driven, vip| c.routes.get(&vip).copied();
    assert_eq!(c.core.routes().get(&web), Some(&Route::NotForwarding));
    c.handle(Event::Forwarding).unwrap();
    assert_eq!(route(&c, web), Some(Route::Announced));
    assert_eq!(route(&c, solo), Some(Route::Announced));
    assert_eq!(route(&c, other), Some(Route::NotSelected));
    // The only backend of solo goes down: withdrawn; back up: announced again.
    let b = BackendKey::new("solo", ip("198.51.100.14"), 80);
    c.handle(Event::Health(vec![(b.clone(), false)])).unwrap();
    assert_eq!(route(&c, solo), Some(Route::NoServingBackend));
    c.handle(Event::Health(vec![(b, true)])).unwrap();
    assert_eq!(route(&c, solo), Some(Route::Announced));
    // Every web backend down: the VIP stays, api still serves on it.
    let down = |a: &str| (BackendKey::new("web", ip(a), 80), false);
    c.handle(Event::Health(vec![
        down("198.51.100.11"),
        down("198.51.100.12"),
    ]))
    .unwrap();
    assert_eq!(route(&c, web), Some(Route::Announced));
    c.handle(Event::Health(vec![(
        BackendKey::new("api", ip("198.51.100.13"), 443),
        false,
    )]))
    .unwrap();
    assert_eq!(route(&c, web), Some(Route::NoServingBackend));
    // Draining withdraws all, and health changes no longer bring a route back.
    c.handle(Event::Drain).unwrap();
    assert!(
        c.routes.values().all(|r| *r == Route::Draining),
        "{:?}",
        c.routes
    );
    c.handle(Event::Health(vec![(
        BackendKey::new("api", ip("198.51.100.13"), 443),
        true,
    )]))
    .unwrap();
    assert_eq!(route(&c, web), Some(Route::Draining));
    assert_eq!(c.routes, *c.core.routes());
}

#[test]
fn a_reload_that_changes_what_is_read_at_start_is_refused() {
    let toml = config(&["198.51.100.11"]);
    let mut c = Driven::new(&toml);
    let mut changed = strait_config::parse(&toml).unwrap();
    changed.gateway.bgp = strait_config::parse(&toml.replace(
        "[[gateway.interfaces]]",
        "[gateway.bgp]\nasn = 64512\nrouter_id = \"192.0.2.1\"\n\
         peers = [{ address = \"198.51.100.1\", asn = 64500 }]\n[[gateway.interfaces]]",
    ))
    .unwrap()
    .gateway
    .bgp;
    let loaded = Loaded {
        config: changed,
        locals: Vec::new(),
        neighbours: Neighbours::default(),
    };
    let e = c.handle(Event::Reload(Ok(Box::new(loaded)))).unwrap_err();
    assert!(matches!(e, Error::BgpChanged), "{e}");
    // So is one that changes [gateway.l2] or [gateway.sync].
    for (section, what) in [
        ("[gateway.l2]\nname = \"gw1\"\nmembers = [\"gw1\"]\n", "l2"),
        (
            "[gateway.sync]\nlisten = \"192.0.2.1:7946\"\npeers = [\"192.0.2.2:7946\"]\n",
            "sync",
        ),
    ] {
        let config = strait_config::parse(&toml.replace(
            "[[gateway.interfaces]]",
            &format!("{section}[[gateway.interfaces]]"),
        ))
        .unwrap();
        let loaded = Loaded {
            config,
            locals: Vec::new(),
            neighbours: Neighbours::default(),
        };
        let e = c.handle(Event::Reload(Ok(Box::new(loaded)))).unwrap_err();
        assert!(matches!(e, Error::RestartNeeded(w) if w == what), "{e}");
    }
    // And one that changes a setting of [gateway] read only at start; a refused reload
    // changes nothing, so each is tried against the running file.
    type Change = fn(&mut strait_config::model::Gateway);
    let changes: [(Change, &str); 7] = [
        (
            |g| g.admin_listen = "127.0.0.1:9901".parse().unwrap(),
            "admin_listen",
        ),
        (
            |g| g.admin_socket = Some("/run/strait/other.sock".into()),
            "admin_socket",
        ),
        (
            |g| g.admin_token_file = Some("/etc/strait/token".into()),
            "admin_token_file",
        ),
        (
            |g| g.flow_capacity_per_core = 65536,
            "flow_capacity_per_core",
        ),
        (
            |g| g.new_flows_per_second_per_core = 1000,
            "new_flows_per_second_per_core",
        ),
        (|g| g.mtu = 9000, "mtu"),
        (|g| g.dpdk = Some(Default::default()), "dpdk"),
    ];
    for (change, what) in changes {
        let mut config = strait_config::parse(&toml).unwrap();
        change(&mut config.gateway);
        let loaded = Loaded {
            config,
            locals: Vec::new(),
            neighbours: Neighbours::default(),
        };
        let e = c.handle(Event::Reload(Ok(Box::new(loaded)))).unwrap_err();
        assert!(
            matches!(e, Error::RestartNeeded(w) if w == what),
            "{what}: {e}"
        );
        assert!(
            e.to_string().contains(&format!("gateway.{what} changed")),
            "{e}"
        );
    }
    // What a reload takes: new timeouts reach the table.
    let mut longer = strait_config::parse(&toml).unwrap();
    longer.gateway.timeouts.udp = Duration::from_secs(45);
    let loaded = Loaded {
        config: longer,
        locals: Vec::new(),
        neighbours: Neighbours::default(),
    };
    c.handle(Event::Reload(Ok(Box::new(loaded)))).unwrap();
    assert_eq!(c.core.table().timeouts.udp, 45_000_000_000);
}

#[test]
fn a_kubernetes_change_without_macs_waits_for_a_read_and_is_probed_until_resolved() {
    let mut c = Driven::new(&config(&["198.51.100.11"]));
    c.handle(Event::Forwarding).unwrap();
    assert_eq!(c.claimed, [ip("203.0.113.10")].into());
    let mut s = c.core.config().services[0].clone();
    s.name = "default/a".into();
    s.vip = ip("203.0.113.20");
    s.backends[0].mac = None;
    s.backends[0].address = ip("198.51.100.21");
    let s = Arc::new(s);
    let hop = ip("198.51.100.21");
    let set = Event::Kube(vec![Publication {
        services: vec![Arc::clone(&s)],
        changes: vec![(s.name.clone(), Some(Arc::clone(&s)))],
    }]);
    c.core.handle(c.now, set).unwrap();
    assert!(c.core.holding(), "waits for a read");
    c.run();
    assert!(!c.core.holding());
    assert_eq!(c.live.services.len(), 2);
    assert_eq!(c.probed, vec![hop], "unresolved: probed");
    assert!(c.claimed.contains(&ip("203.0.113.20")));
    let unresolved = |t: &ServiceTable| {
        t.backends
            .iter()
            .flatten()
            .filter(|b| b.mac.is_none())
            .count()
    };
    assert_eq!(unresolved(&c.live), 1);
    // Looked at again every second until it resolves.
    let at = c.core.poll_timeout().unwrap();
    assert!(at <= c.now + NEIGHBOUR_RECHECK);
    c.neighbours.macs.insert(hop, MacAddr([2, 0, 0, 0, 2, 1]));
    c.now = at;
    c.handle(Event::Tick).unwrap();
    assert_eq!(unresolved(&c.live), 0);
    // Gone again: its VIP is released with it, and nothing is followed any more.
    c.handle(Event::Kube(vec![Publication {
        services: vec![],
        changes: vec![(s.name.clone(), None)],
    }]))
    .unwrap();
    assert_eq!(c.claimed, [ip("203.0.113.10")].into());
    assert_eq!(c.core.poll_timeout(), None);
}

#[test]
fn an_invalid_reload_changes_nothing() {
    let mut c = Driven::new(&config(&["198.51.100.11"]));
    let before = Arc::clone(&c.live);
    let e = c
        .handle(Event::Reload(Err(
            "gateway.mtu: 10 is outside 576..=9000".into()
        )))
        .unwrap_err();
    assert!(e.to_string().contains("gateway.mtu"), "{e}");
    let mut other = strait_config::parse(&config(&["198.51.100.12"])).unwrap();
    other.gateway.interfaces[0].name = "eth1".into();
    let e = c
        .handle(Event::Reload(Ok(Box::new(Loaded {
            config: other,
            locals: Vec::new(),
            neighbours: Neighbours::default(),
        }))))
        .unwrap_err();
    assert!(matches!(e, Error::InterfacesChanged), "{e}");
    assert!(Arc::ptr_eq(&before, &c.live));
    assert_eq!(
        c.core.config().services[0].backends[0].address,
        ip("198.51.100.11")
    );
}

#[test]
fn a_kubernetes_change_reads_only_its_backends_next_hops() {
    let mut c = Driven::new(&config(&["198.51.100.11"]));
    let node = |k: u16| IpAddr::from(std::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 1, k));
    // The kernel knows a thousand nodes; the core knows none of them yet.
    c.neighbours = Neighbours {
        macs: (0..1000u16)
            .map(|k| {
                let [hi, lo] = k.to_be_bytes();
                (node(k), MacAddr([2, 0, 0, 1, hi, lo]))
            })
            .collect(),
        ..Neighbours::default()
    };
    let mut s = c.core.config().services[0].clone();
    s.name = "default/a".into();
    s.vip = ip("203.0.113.20");
    s.backends = [7, 3, 7 + 1000]
        .iter()
        .map(|&k| {
            let mut b = s.backends[0].clone();
            b.mac = None;
            b.address = node(k);
            b
        })
        .collect();
    let s = Arc::new(s);
    c.core
        .handle(
            c.now,
            Event::Kube(vec![Publication {
                services: vec![Arc::clone(&s)],
                changes: vec![(s.name.clone(), Some(Arc::clone(&s)))],
            }]),
        )
        .unwrap();
    let mut asked = None;
    let mut rest = Vec::new();
    while let Some(e) = c.core.poll_effect() {
        match e {
            Effect::ReadNeighbours(scope) => asked = Some(scope),
            e => rest.push(e),
        }
    }
    // dsr-l2: each backend is its own next hop; sorted, once each.
    let targets = vec![(node(3), false), (node(7), false), (node(1007), false)];
    assert_eq!(asked, Some(Scope::Targets(targets.clone())));
    let part = c.neighbours.part(&targets);
    assert_eq!(part.macs.len(), 2, "node 1007 is not in the kernel's table");
    c.core.handle(c.now, Event::Neighbours(part)).unwrap();
    c.run();
    let t = &c.live;
    let mac_of = |a: IpAddr| {
        t.backends
            .iter()
            .flatten()
            .find(|b| b.socket_addr().ip() == a)
            .and_then(|b| b.mac_addr())
    };
    assert_eq!(mac_of(node(7)), Some(MacAddr([2, 0, 0, 1, 0, 7])));
    assert_eq!(mac_of(node(3)), Some(MacAddr([2, 0, 0, 1, 0, 3])));
    assert_eq!(mac_of(node(1007)), None);
    assert_eq!(c.probed, vec![node(1007)], "the unresolved one is probed");
    // The timer's read is of the whole table, and the probed node resolves with it.
    c.neighbours
        .macs
        .insert(node(1007), MacAddr([2, 0, 0, 1, 3, 0xef]));
    let at = c.core.poll_timeout().unwrap();
    c.now = at;
    c.core.handle(c.now, Event::Tick).unwrap();
    let mut whole = false;
    while let Some(e) = c.core.poll_effect() {
        if let Effect::ReadNeighbours(scope) = e {
            whole = scope == Scope::All;
            let read = c.neighbours.clone();
            c.core.handle(c.now, Event::Neighbours(read)).unwrap();
            c.run();
            break;
        }
    }
    assert!(whole, "the timer reads the whole table");
    let t = &c.live;
    let resolved = t
        .backends
        .iter()
        .flatten()
        .find(|b| b.socket_addr().ip() == node(1007))
        .and_then(|b| b.mac_addr());
    assert_eq!(resolved, Some(MacAddr([2, 0, 0, 1, 3, 0xef])));
}

/// A nat service "web" with a TCP check and passive health (3 failures within 1 s) over
/// backends `backends` (port 8080).
fn nat_config(backends: &[&str]) -> String {
    config(backends)
        .replace("port = 80, mac", "port = 8080, mac")
        .replace(
            "maglev_table_size = 251",
            "maglev_table_size = 251\nmode = \"nat\"\nhealth_check = { kind = \"tcp\" }\n\
             passive_health = { failures = 3, window = \"1s\" }",
        )
}

/// The health of each backend of service `web` in `t`, by address.
fn healths(t: &ServiceTable) -> std::collections::BTreeMap<IpAddr, Health> {
    let web = t.services.iter().find(|s| s.name == "web").unwrap();
    web.backends
        .iter()
        .map(|&id| {
            let b = t.backend(id).unwrap();
            (b.address(), b.health)
        })
        .collect()
}

#[test]
fn failures_within_the_window_take_a_backend_out_of_new_flows_only() {
    use strait_dataplane::passive::Failure;
    let mut c = Driven::new(&nat_config(&["198.51.100.11", "198.51.100.12"]));
    let b1 = BackendKey::new("web", ip("198.51.100.11"), 8080);
    let gen = c.live.generation;
    // Two refusals, then one more 1.5 s later: never three within a second.
    c.handle(Event::Passive(vec![(b1.clone(), Failure::Refused, 2)]))
        .unwrap();
    c.now += Duration::from_millis(1500);
    c.handle(Event::Passive(vec![(b1.clone(), Failure::Refused, 1)]))
        .unwrap();
    assert_eq!(c.live.generation, gen, "not out");
    assert!(c.passive_out.is_empty());
    // Two more within the second: the last three are.
    c.now += Duration::from_millis(300);
    c.handle(Event::Passive(vec![(b1.clone(), Failure::Unanswered, 2)]))
        .unwrap();
    assert_eq!(c.live.generation, gen + 1);
    assert_eq!(c.passive_out, vec![b1.clone()]);
    let out = c.core.passive_out(&b1).copied().expect("out");
    assert_eq!(out.cause, Failure::Unanswered);
    // No new flows, existing flows stay: draining in the table, out of the Maglev members.
    let h = healths(&c.live);
    assert_eq!(h[&ip("198.51.100.11")], Health::Draining);
    assert_eq!(h[&ip("198.51.100.12")], Health::Up);
    let web = c.live.services.iter().find(|s| s.name == "web").unwrap();
    assert_eq!(web.members.len(), 1);
    let b = c
        .live
        .backends
        .iter()
        .flatten()
        .find(|b| b.address() == ip("198.51.100.11"));
    assert!(b.unwrap().keeps_flows(), "its flows stay");
    // More failures while out change nothing.
    c.handle(Event::Passive(vec![(b1.clone(), Failure::Refused, 50)]))
        .unwrap();
    assert_eq!(c.live.generation, gen + 1);
    assert_eq!(c.passive_out.len(), 1);
}

#[test]
fn the_active_check_brings_a_backend_back() {
    use strait_dataplane::passive::Failure;
    let mut c = Driven::new(&nat_config(&["198.51.100.11", "198.51.100.12"]));
    let b1 = BackendKey::new("web", ip("198.51.100.11"), 8080);
    c.handle(Event::Passive(vec![(b1.clone(), Failure::Refused, 3)]))
        .unwrap();
    assert_eq!(healths(&c.live)[&ip("198.51.100.11")], Health::Draining);
    // Its check falls meanwhile: down (its flows re-hash), and still out.
    c.handle(Event::Health(vec![(b1.clone(), false)])).unwrap();
    assert_eq!(healths(&c.live)[&ip("198.51.100.11")], Health::Down);
    assert!(c.core.passive_out(&b1).is_some());
    // The check passes again: back in full.
    c.handle(Event::Health(vec![(b1.clone(), true)])).unwrap();
    assert_eq!(healths(&c.live)[&ip("198.51.100.11")], Health::Up);
    assert!(c.core.passive_out(&b1).is_none());
    // Out again; this time the check never fell: its pass (reported by the checker for a
    // check begun after the verdict) brings it back.
    c.handle(Event::Passive(vec![(b1.clone(), Failure::Refused, 3)]))
        .unwrap();
    assert_eq!(healths(&c.live)[&ip("198.51.100.11")], Health::Draining);
    let gen = c.live.generation;
    c.handle(Event::Health(vec![(b1.clone(), true)])).unwrap();
    assert_eq!(c.live.generation, gen + 1);
    assert_eq!(healths(&c.live)[&ip("198.51.100.11")], Health::Up);
    // A reload that keeps the check keeps a backend out, and so does one that changes it:
    // the changed check's first pass brings it back.
    c.handle(Event::Passive(vec![(b1.clone(), Failure::Refused, 3)]))
        .unwrap();
    let toml = nat_config(&["198.51.100.11", "198.51.100.12"]);
    let reload = |toml: &str| {
        Event::Reload(Ok(Box::new(Loaded {
            config: strait_config::parse(toml).unwrap(),
            locals: Vec::new(),
            neighbours: Neighbours::default(),
        })))
    };
    c.handle(reload(&toml)).unwrap();
    assert_eq!(healths(&c.live)[&ip("198.51.100.11")], Health::Draining);
    c.handle(reload(
        &toml.replace("kind = \"tcp\"", "kind = \"tcp\", rise = 3"),
    ))
    .unwrap();
    assert_eq!(healths(&c.live)[&ip("198.51.100.11")], Health::Draining);
    assert!(c.core.passive_out(&b1).is_some());
    c.handle(Event::Health(vec![(b1.clone(), true)])).unwrap();
    assert_eq!(healths(&c.live)[&ip("198.51.100.11")], Health::Up);
    assert!(c.core.passive_out(&b1).is_none());
}

#[test]
fn a_reload_that_changes_a_check_keeps_a_down_backend_down() {
    let toml = nat_config(&["198.51.100.11", "198.51.100.12"]);
    let mut c = Driven::new(&toml);
    let b1 = BackendKey::new("web", ip("198.51.100.11"), 8080);
    c.handle(Event::Health(vec![(b1.clone(), false)])).unwrap();
    assert_eq!(healths(&c.live)[&ip("198.51.100.11")], Health::Down);
    let changed = toml.replace(
        "kind = \"tcp\"",
        "kind = \"tcp\", interval = \"400ms\", timeout = \"200ms\"",
    );
    assert_ne!(changed, toml);
    c.handle(Event::Reload(Ok(Box::new(Loaded {
        config: strait_config::parse(&changed).unwrap(),
        locals: Vec::new(),
        neighbours: Neighbours::default(),
    }))))
    .unwrap();
    // Still down, its check replaced in place (not stopped), until the new check passes.
    assert_eq!(healths(&c.live)[&ip("198.51.100.11")], Health::Down);
    assert!(c.stopped.is_empty(), "{:?}", c.stopped);
    assert!(c.checks.contains(&b1));
    c.handle(Event::Health(vec![(b1.clone(), true)])).unwrap();
    assert_eq!(healths(&c.live)[&ip("198.51.100.11")], Health::Up);
    // A reload without the check stops it and forgets the backend's health.
    c.handle(Event::Health(vec![(b1.clone(), false)])).unwrap();
    let unchecked = toml.replace("health_check = { kind = \"tcp\" }\n", "");
    assert_ne!(unchecked, toml);
    c.handle(Event::Reload(Ok(Box::new(Loaded {
        config: strait_config::parse(
            &unchecked.replace("passive_health = { failures = 3, window = \"1s\" }", ""),
        )
        .unwrap(),
        locals: Vec::new(),
        neighbours: Neighbours::default(),
    }))))
    .unwrap();
    assert!(c.stopped.contains(&b1));
    assert_eq!(healths(&c.live)[&ip("198.51.100.11")], Health::Up);
}

#[test]
fn passive_health_takes_out_at_most_half_of_a_service() {
    use strait_dataplane::passive::Failure;
    let mut c = Driven::new(&nat_config(&[
        "198.51.100.11",
        "198.51.100.12",
        "198.51.100.13",
    ]));
    let key = |a: &str| BackendKey::new("web", ip(a), 8080);
    c.handle(Event::Passive(vec![
        (key("198.51.100.11"), Failure::Refused, 3),
        (key("198.51.100.12"), Failure::Refused, 3),
    ]))
    .unwrap();
    assert_eq!(c.passive_out, vec![key("198.51.100.11")]);
    let h = healths(&c.live);
    assert_eq!(h.values().filter(|h| **h == Health::Up).count(), 2);
    // A lone backend is never taken out; nor is a service without passive health touched.
    let mut lone = Driven::new(&nat_config(&["198.51.100.11"]));
    lone.handle(Event::Passive(vec![(
        key("198.51.100.11"),
        Failure::Refused,
        10,
    )]))
    .unwrap();
    assert!(lone.passive_out.is_empty());
    let off = nat_config(&["198.51.100.11", "198.51.100.12"]).replace(
        "passive_health = { failures = 3, window = \"1s\" }",
        "passive_health = { enabled = false }",
    );
    let mut off = Driven::new(&off);
    off.handle(Event::Passive(vec![(
        key("198.51.100.11"),
        Failure::Refused,
        10,
    )]))
    .unwrap();
    assert!(off.passive_out.is_empty());
}

/// Slow start: `web` with `backends` and `slow_start = "6s"` (and `extra` service fields).
fn ramped(backends: &[&str], extra: &str) -> String {
    config(backends).replace(
        "maglev_table_size = 251",
        &format!("maglev_table_size = 251\nslow_start = \"6s\"\n{extra}"),
    )
}

/// The weight and (id, incarnation) of web's backend `addr` in the live table, 0 when it
/// takes no new flows.
fn weight_of(c: &Driven, addr: &str) -> (u32, (u32, u32)) {
    weight_in(c, "web", addr)
}

/// [`weight_of`] in service `service`.
fn weight_in(c: &Driven, service: &str, addr: &str) -> (u32, (u32, u32)) {
    let t = &c.live;
    let web = t.services.iter().find(|s| s.name == service).unwrap();
    let b = web
        .backends
        .iter()
        .filter_map(|&id| t.backend(id))
        .find(|b| b.address() == ip(addr))
        .unwrap();
    let w = if b.health == Health::Up { b.weight } else { 0 };
    (w, (b.id.0, b.incarnation))
}

fn reload(c: &mut Driven, toml: &str) {
    let loaded = Loaded {
        config: strait_config::parse(toml).unwrap(),
        locals: Vec::new(),
        neighbours: Neighbours::default(),
    };
    c.handle(Event::Reload(Ok(Box::new(loaded)))).unwrap();
}

/// Ticks when the core asks to, until it asks no more; the weights of `addr` after each
/// tick, with the time since `start` in milliseconds.
fn run_ramp(c: &mut Driven, addr: &str, start: Instant) -> Vec<(u128, u32)> {
    let mut seen = Vec::new();
    while let Some(at) = c.core.poll_timeout() {
        assert!(at > c.now, "a deadline in the past");
        c.now = at;
        let before = c.live.generation;
        c.handle(Event::Tick).unwrap();
        assert_eq!(
            c.live.generation,
            before + 1,
            "a step updates the table once"
        );
        seen.push(((c.now - start).as_millis(), weight_of(c, addr).0));
        assert!(seen.len() < 100, "the ramp does not end");
    }
    seen
}

#[test]
fn an_added_backend_ramps_a_step_a_second_and_keeps_its_id() {
    let two = ["198.51.100.11", "198.51.100.12"];
    let mut c = Driven::new(&ramped(&two, ""));
    // A service's first backends have nobody to share with: no ramp.
    assert_eq!(weight_of(&c, "198.51.100.11").0, 100);
    assert_eq!(
        c.core.poll_timeout(),
        None,
        "nothing ramps, nothing to wake for"
    );

    let start = c.now;
    reload(
        &mut c,
        &ramped(&["198.51.100.11", "198.51.100.12", "198.51.100.13"], ""),
    );
    let (w, id) = weight_of(&c, "198.51.100.13");
    assert_eq!(w, 10, "10 % of weight 100 at first");
    assert_eq!(
        weight_of(&c, "198.51.100.11").0,
        100,
        "the others keep theirs"
    );
    assert_eq!(c.core.poll_timeout(), Some(start + Duration::from_secs(1)));

    // A tick before the step is due changes nothing.
    c.now = start + Duration::from_millis(500);
    let g = c.live.generation;
    c.handle(Event::Tick).unwrap();
    assert_eq!(c.live.generation, g, "no table between steps");

    let steps = run_ramp(&mut c, "198.51.100.13", start);
    assert_eq!(
        steps,
        [
            (1000, 25),
            (2000, 40),
            (3000, 55),
            (4000, 70),
            (5000, 85),
            (6000, 100)
        ]
    );
    assert_eq!(
        weight_of(&c, "198.51.100.13").1,
        id,
        "the same id and incarnation all along: its flows keep it"
    );
    assert_eq!(c.core.poll_timeout(), None, "the ramp is over");
    let t = c.live.generation;
    c.now += Duration::from_secs(5);
    c.handle(Event::Tick).unwrap();
    assert_eq!(c.live.generation, t, "no rebuild once nothing ramps");
}

#[test]
fn without_slow_start_an_added_backend_takes_its_weight_at_once() {
    let mut c = Driven::new(&config(&["198.51.100.11", "198.51.100.12"]));
    reload(
        &mut c,
        &config(&["198.51.100.11", "198.51.100.12", "198.51.100.13"]),
    );
    assert_eq!(weight_of(&c, "198.51.100.13").0, 100);
    assert_eq!(c.core.poll_timeout(), None);
}

#[test]
fn recovered_and_undrained_backends_ramp_again() {
    let two = ["198.51.100.11", "198.51.100.12"];
    let mut c = Driven::new(&ramped(&two, "health_check = { kind = \"tcp\" }"));
    let b1 = BackendKey::new("web", ip("198.51.100.11"), 80);
    c.handle(Event::Health(vec![(b1.clone(), false)])).unwrap();
    assert_eq!(weight_of(&c, "198.51.100.11").0, 0);
    assert_eq!(c.core.poll_timeout(), None, "going down starts nothing");

    c.now += Duration::from_secs(10);
    let start = c.now;
    c.handle(Event::Health(vec![(b1.clone(), true)])).unwrap();
    assert_eq!(weight_of(&c, "198.51.100.11").0, 10, "healthy again: ramps");
    c.now = start + Duration::from_secs(2);
    c.handle(Event::Tick).unwrap();
    assert_eq!(weight_of(&c, "198.51.100.11").0, 40);

    // Down in the middle of the ramp ends it; up again starts it over.
    c.handle(Event::Health(vec![(b1.clone(), false)])).unwrap();
    assert_eq!(c.core.poll_timeout(), None);
    c.now += Duration::from_millis(300);
    let again = c.now;
    c.handle(Event::Health(vec![(b1, true)])).unwrap();
    assert_eq!(weight_of(&c, "198.51.100.11").0, 10);
    let steps = run_ramp(&mut c, "198.51.100.11", again);
    assert_eq!(steps.len(), 6);
    assert_eq!(steps.last(), Some(&(6000, 100)));

    // Drained and back to active: ramps again, from the reload that undrains it.
    let drained = ramped(&two, "health_check = { kind = \"tcp\" }").replacen(
        "port = 80, mac",
        "port = 80, state = \"draining\", mac",
        1,
    );
    reload(&mut c, &drained);
    assert_eq!(weight_of(&c, "198.51.100.11").0, 0);
    c.now += Duration::from_secs(1);
    reload(&mut c, &ramped(&two, "health_check = { kind = \"tcp\" }"));
    assert_eq!(weight_of(&c, "198.51.100.11").0, 10, "undrained: ramps");
    assert_eq!(weight_of(&c, "198.51.100.12").0, 100);

    // Turning slow start off ends the ramp at once.
    reload(
        &mut c,
        &config(&two).replace(
            "maglev_table_size = 251",
            "maglev_table_size = 251\nhealth_check = { kind = \"tcp\" }",
        ),
    );
    assert_eq!(weight_of(&c, "198.51.100.11").0, 100);
    assert_eq!(c.core.poll_timeout(), None);
}

#[test]
fn turning_slow_start_on_ramps_no_serving_backend() {
    let two = ["198.51.100.11", "198.51.100.12"];
    let mut c = Driven::new(&config(&two));
    reload(&mut c, &ramped(&two, ""));
    assert_eq!(weight_of(&c, "198.51.100.11").0, 100);
    assert_eq!(weight_of(&c, "198.51.100.12").0, 100);
    assert_eq!(c.core.poll_timeout(), None);
}

#[test]
fn a_kubernetes_endpoint_that_comes_up_ramps_and_one_that_goes_ends_its_ramp() {
    let mut c = Driven::new(&config(&["198.51.100.11"]));
    let web = c.core.config().services[0].clone();
    let kube = |backends: &[&str]| {
        let mut s = web.clone();
        s.name = "default/k".to_owned();
        s.vip = ip("203.0.113.20");
        s.slow_start = Some(Duration::from_secs(6));
        s.backends = backends
            .iter()
            .map(|a| {
                let mut b = web.backends[0].clone();
                b.address = ip(a);
                b
            })
            .collect();
        Arc::new(s)
    };
    let publish = |c: &mut Driven, s: Option<Arc<Service>>| {
        let services: Vec<Arc<Service>> = s.iter().cloned().collect();
        c.handle(Event::Kube(vec![Publication {
            services,
            changes: vec![("default/k".to_owned(), s)],
        }]))
        .unwrap();
    };
    publish(&mut c, Some(kube(&["198.51.100.21"])));
    assert_eq!(weight_in(&c, "default/k", "198.51.100.21").0, 100);
    assert_eq!(c.core.poll_timeout(), None);

    // A second endpoint becomes ready: it ramps.
    let start = c.now;
    publish(&mut c, Some(kube(&["198.51.100.21", "198.51.100.22"])));
    assert_eq!(weight_in(&c, "default/k", "198.51.100.22").0, 10);
    assert_eq!(c.core.poll_timeout(), Some(start + Duration::from_secs(1)));
    c.now = start + Duration::from_secs(1);
    c.handle(Event::Tick).unwrap();
    assert_eq!(weight_in(&c, "default/k", "198.51.100.22").0, 25);

    // It goes (not ready, or its pod deleted): its ramp ends with it.
    publish(&mut c, Some(kube(&["198.51.100.21"])));
    assert_eq!(c.core.poll_timeout(), None);
    // Back a little later: a ramp from the start again.
    c.now += Duration::from_millis(1500);
    let again = c.now;
    publish(&mut c, Some(kube(&["198.51.100.21", "198.51.100.22"])));
    assert_eq!(weight_in(&c, "default/k", "198.51.100.22").0, 10);
    assert_eq!(c.core.poll_timeout(), Some(again + Duration::from_secs(1)));
    // The Service removed mid-ramp: nothing left to step.
    publish(&mut c, None);
    assert_eq!(c.core.poll_timeout(), None);
    assert_eq!(c.core.ramps().next(), None);
}

#[test]
fn a_backend_with_nobody_to_share_with_or_no_smaller_weight_does_not_ramp() {
    let mut c = Driven::new(&ramped(&["198.51.100.11"], ""));
    // The only backend replaced: the new one takes every new flow at once anyway.
    reload(&mut c, &ramped(&["198.51.100.12"], ""));
    assert_eq!(weight_of(&c, "198.51.100.12").0, 100);
    assert_eq!(c.core.poll_timeout(), None);
    // Weight 1 has no smaller step.
    let two = ramped(&["198.51.100.12", "198.51.100.13"], "");
    let light = two.replacen(
        "{ address = \"198.51.100.13\", port = 80,",
        "{ address = \"198.51.100.13\", port = 80, weight = 1,",
        1,
    );
    assert_ne!(light, two);
    reload(&mut c, &light);
    assert_eq!(weight_of(&c, "198.51.100.13").0, 1);
    assert_eq!(c.core.poll_timeout(), None);
}
