use strait_config::model::{self, BackendState, Config, Role};

use strait_testkit::config::{GatewayToml, ServiceToml};

use super::*;

fn config(web_backends: &[&str]) -> Config {
    let mac = "02:00:00:00:01:11";
    let web = web_backends.iter().fold(
        ServiceToml::new("web", "203.0.113.10", 80).maglev_table_size(251),
        |s, a| s.backend_mac(a, 80, mac),
    );
    let api = ServiceToml::new("api", "203.0.113.11", 443)
        .maglev_table_size(251)
        .backend_mac("198.51.100.21", 443, mac)
        .backend_mac("198.51.100.22", 443, mac);
    strait_config::parse(&GatewayToml::eth0().service(web).service(api).to_string()).unwrap()
}

#[test]
fn unchanged_services_share_their_maglev_tables_across_builds() {
    let ports = [Port::new(MacAddr([2, 0, 0, 0, 0, 1]), 1500)];
    let mut b = Builder::new();
    let t1 = b
        .build(
            &config(&["198.51.100.11", "198.51.100.12"]),
            &ports,
            |_, _, _| false,
        )
        .unwrap();
    let t2 = b
        .build(
            &config(&["198.51.100.11", "198.51.100.12", "198.51.100.13"]),
            &ports,
            |_, _, _| false,
        )
        .unwrap();
    assert!(
        !Arc::ptr_eq(&t1.services[0].maglev, &t2.services[0].maglev),
        "web changed: new table"
    );
    assert!(
        Arc::ptr_eq(&t1.services[1].maglev, &t2.services[1].maglev),
        "api unchanged: same table"
    );
    // A kept backend keeps its id, and the shared table still names the right members.
    assert_eq!(t1.services[0].backends[..2], t2.services[0].backends[..2]);
    assert_eq!(t1.services[1].members, t2.services[1].members);
    // Health changes are inputs too: a down backend leaves the table.
    let t3 = b
        .build(
            &config(&["198.51.100.11", "198.51.100.12", "198.51.100.13"]),
            &ports,
            |_, a, _| a.to_string() == "198.51.100.21",
        )
        .unwrap();
    assert!(!Arc::ptr_eq(&t2.services[1].maglev, &t3.services[1].maglev));
    assert_eq!(t3.services[1].members.len(), 1);
    assert_eq!(t3.generation, 3);
}

/// The random-sequence test: services drawn from small pools of names, VIPs, ports and
/// backends so that frontends move between services, VIPs are shared (the fragment
/// index) and nat backends are shared between services (the reply index).
mod incremental {
    use std::collections::BTreeMap;
    use std::net::Ipv4Addr;
    use std::time::Duration;

    use proptest::prelude::*;
    use strait_config::model::{Backend as CfgBackend, Gateway, Interface, MacAddr, Protocol};

    use super::*;

    const NAMES: usize = 10;

    /// One service's draw: (vip, port, udp, mode, acl, affinity, backends as (host,
    /// port, weight, draining)).
    type Draw = (u8, u8, bool, u8, bool, bool, Vec<(u8, u8, u8, bool)>);

    fn service(name: usize, d: &Draw) -> model::Service {
        let (vip, port, udp, mode, acl, affinity, backends) = d;
        let mut bs: Vec<CfgBackend> = Vec::new();
        for &(host, bport, weight, draining) in backends {
            let address = IpAddr::V4(Ipv4Addr::new(198, 51, 100, host % 8));
            let port = 8000 + u16::from(bport % 2);
            if bs.iter().any(|b| b.address == address && b.port == port) {
                continue;
            }
            bs.push(CfgBackend {
                address,
                port,
                weight: u32::from(weight % 3),
                mac: Some(MacAddr([2, 0, 0, 0, 1, host])),
                tunnel: None,
                state: if draining {
                    BackendState::Draining
                } else {
                    BackendState::Active
                },
            });
        }
        model::Service {
            name: format!("svc{name}"),
            vip: IpAddr::V4(Ipv4Addr::new(203, 0, 113, vip % 3)),
            port: 80 + u16::from(port % 3),
            protocol: if *udp { Protocol::Udp } else { Protocol::Tcp },
            mode: [Mode::Nat, Mode::DsrL2, Mode::Nat][usize::from(mode % 3)],
            maglev_table_size: 13,
            source_ranges: if *acl {
                vec!["192.0.2.0/24".parse().unwrap()]
            } else {
                Vec::new()
            },
            session_affinity: affinity.then_some(Duration::from_secs(60)),
            health_check: None,
            passive_health: None,
            route: Default::default(),
            slow_start: None,
            backends: bs,
        }
    }

    fn draw() -> impl Strategy<Value = Draw> {
        (
            any::<u8>(),
            any::<u8>(),
            any::<bool>(),
            any::<u8>(),
            any::<bool>(),
            any::<bool>(),
            proptest::collection::vec((any::<u8>(), any::<u8>(), any::<u8>(), any::<bool>()), 0..6),
        )
    }

    /// A step: for some names, a new draw (set) or `None` (remove).
    fn step() -> impl Strategy<Value = Vec<(usize, Option<Draw>)>> {
        proptest::collection::vec((0..NAMES, proptest::option::weighted(0.8, draw())), 1..4)
    }

    fn config(state: &BTreeMap<usize, model::Service>) -> Config {
        let mut gateway =
            strait_config::parse("[[gateway.interfaces]]\nname = \"eth0\"\nqueues = [0]\n")
                .unwrap()
                .gateway;
        gateway.interfaces = vec![Interface {
            name: "eth0".into(),
            queues: vec![0],
            cores: None,
            role: Role::Both,
            vlans: Vec::new(),
            driver: Default::default(),
        }];
        Config {
            gateway: Gateway { ..gateway },
            services: state.values().cloned().collect(),
        }
    }

    fn down(_: &str, a: IpAddr, _: u16) -> bool {
        a == IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7))
    }

    type Endpoint = (crate::key::Addr, u16);

    /// A service with every id resolved: what a table says, whatever its numbering.
    #[derive(Debug, PartialEq)]
    struct Canon {
        frontend: Frontend,
        mode: Mode,
        acl: Vec<Prefix>,
        affinity: u32,
        backends: Vec<Backend>,
        members: Vec<Endpoint>,
        maglev_size: u32,
        slots: Vec<Option<Endpoint>>,
    }

    /// The table by service name, ids resolved, after checking that its indexes agree
    /// with its services.
    fn canon(t: &ServiceTable) -> BTreeMap<String, Canon> {
        let mut out = BTreeMap::new();
        type NatKey = (crate::key::Addr, u16, crate::key::Proto);
        let mut nat: HashMap<NatKey, Vec<(crate::key::Addr, u16, u32)>> = HashMap::new();
        let mut vips: HashMap<(crate::key::Addr, crate::key::Proto), Vec<u32>> = HashMap::new();
        let mut ids = 0;
        for (si, s) in t.services.iter().enumerate() {
            let si = si as u32;
            let f = s.frontend;
            assert_eq!(t.service_for(&f), Some(si), "{}: frontend index", s.name);
            vips.entry((f.vip, f.proto)).or_default().push(si);
            let resolve = |id: BackendId| {
                let b = t
                    .backend(id)
                    .unwrap_or_else(|| panic!("{}: id {id:?}", s.name));
                assert_eq!((b.id, b.service), (id, si), "{}: backend entry", s.name);
                b.clone()
            };
            let backends: Vec<Backend> = s.backends.iter().map(|&id| resolve(id)).collect();
            ids += backends.len();
            if s.mode == Mode::Nat {
                for b in &backends {
                    let owners = nat.entry((b.addr, b.port, f.proto)).or_default();
                    match owners.iter_mut().find(|o| (o.0, o.1) == (f.vip, f.port)) {
                        Some(o) => o.2 += 1,
                        None => owners.push((f.vip, f.port, 1)),
                    }
                }
            }
            let members: Vec<Endpoint> = s
                .members
                .iter()
                .map(|&id| {
                    let b = resolve(id);
                    (b.addr, b.port)
                })
                .collect();
            let slots = s
                .maglev
                .slots()
                .iter()
                .map(|&m| members.get(usize::from(m)).copied())
                .collect();
            let backends = backends
                .into_iter()
                .map(|b| Backend {
                    // Ids and incarnations number a builder's own history, which
                    // differs between the incremental and the full builder.
                    id: BackendId(0),
                    incarnation: 0,
                    service: 0,
                    ..b
                })
                .collect();
            let c = Canon {
                frontend: f,
                mode: s.mode,
                acl: s.acl.clone(),
                affinity: s.affinity_secs,
                backends,
                members,
                maglev_size: s.maglev.size(),
                slots,
            };
            assert!(out.insert(s.name.clone(), c).is_none(), "{}: twice", s.name);
        }
        assert_eq!(t.frontends.len(), t.services.len(), "frontend index size");
        assert_eq!(t.backends.iter().flatten().count(), ids, "orphan backends");
        let held: HashMap<_, _> = t
            .nat_backends
            .iter()
            .map(|(k, v)| {
                let mut v = v.0.clone();
                v.sort();
                (*k, v)
            })
            .collect();
        for v in nat.values_mut() {
            v.sort();
        }
        assert_eq!(held, nat, "nat backend index");
        let shared = nat.values().filter(|v| v.len() > 1).count();
        assert_eq!(t.nat_shared as usize, shared, "shared nat backends");
        let vips: HashMap<_, _> = vips.iter().map(|(k, v)| (*k, VipProto::of(v))).collect();
        assert_eq!(t.by_vip_proto, vips, "fragment index");
        out
    }

    /// Backend ids by key (frontend, address, port).
    fn ids(t: &ServiceTable) -> HashMap<(Frontend, Endpoint), BackendId> {
        t.services
            .iter()
            .flat_map(|s| {
                s.backends.iter().map(move |&id| {
                    let b = t.backend(id).unwrap();
                    ((s.frontend, (b.addr, b.port)), id)
                })
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn incremental_updates_equal_full_builds(
            first in proptest::collection::vec(proptest::option::of(draw()), NAMES),
            steps in proptest::collection::vec(step(), 1..12),
        ) {
            let ports = [Port::new(MacAddr([2, 0, 0, 0, 0, 1]), 1500)];
            let fits = |state: &BTreeMap<usize, model::Service>, n: usize, s: &model::Service| {
                !state.iter().any(|(&m, o)| {
                    m != n && (o.vip, o.port, o.protocol) == (s.vip, s.port, s.protocol)
                })
            };
            let mut state = BTreeMap::new();
            for (n, d) in first.iter().enumerate() {
                if let Some(d) = d {
                    let s = service(n, d);
                    if fits(&state, n, &s) {
                        state.insert(n, s);
                    }
                }
            }
            let mut inc = Builder::new();
            let mut table = inc.build(&config(&state), &ports, down).unwrap();
            let mut full = Builder::new();
            for step in steps {
                let mut changes: Vec<(usize, Option<model::Service>)> = Vec::new();
                for (n, d) in step {
                    match d {
                        Some(d) => {
                            let s = service(n, &d);
                            if fits(&state, n, &s) {
                                state.insert(n, s.clone());
                                changes.push((n, Some(s)));
                            }
                        }
                        None => {
                            state.remove(&n);
                            changes.push((n, None));
                        }
                    }
                }
                let names: Vec<String> = changes.iter().map(|(n, _)| format!("svc{n}")).collect();
                let list: Vec<Change<'_>> = changes
                    .iter()
                    .zip(&names)
                    .map(|((_, s), name)| match s {
                        Some(s) => Change::Set(s),
                        None => Change::Remove(name),
                    })
                    .collect();
                let next = inc.update(&table, &list, down).unwrap();
                prop_assert_eq!(next.generation, table.generation + 1);
                let want = full.build(&config(&state), &ports, down).unwrap();
                prop_assert_eq!(canon(&next), canon(&want));
                // A backend that stayed keeps its id; unchanged services are shared.
                let (before, after) = (ids(&table), ids(&next));
                for (k, id) in &after {
                    if let Some(old) = before.get(k) {
                        prop_assert_eq!(old, id, "{:?} changed id", k);
                    }
                }
                for s in &next.services {
                    let changed = names.contains(&s.name);
                    if let (false, Some(old)) = (changed, table.services.iter().find(|o| o.name == s.name)) {
                        prop_assert!(Arc::ptr_eq(old, s), "{} unchanged but rebuilt", s.name);
                    }
                }
                // Every other replaced table goes back to the builder, so updates
                // copy both into fresh allocations and into recycled ones.
                let old = std::mem::replace(&mut table, next);
                if table.generation.is_multiple_of(2) {
                    inc.recycle(Arc::new(old));
                }
            }
        }
    }

    #[test]
    fn updates_need_the_last_table_and_a_free_frontend() {
        let ports = [Port::new(MacAddr([2, 0, 0, 0, 0, 1]), 1500)];
        let d: Draw = (1, 0, false, 0, false, false, vec![(1, 0, 1, false)]);
        let a = service(0, &d);
        let state = BTreeMap::from([(0, a.clone())]);
        let mut b = Builder::new();
        let stale = ServiceTable::empty(ports.to_vec());
        assert!(matches!(
            b.update(&stale, &[], down),
            Err(TableError::Stale { .. })
        ));
        let t1 = b.build(&config(&state), &ports, down).unwrap();
        // Another name on a's frontend is refused, and the builder then wants a full build.
        let mut clash = a.clone();
        clash.name = "other".into();
        let e = b.update(&t1, &[Change::Set(&clash)], down).unwrap_err();
        assert_eq!(
            e.to_string(),
            "service other: its frontend belongs to service svc0"
        );
        assert!(matches!(
            b.update(&t1, &[], down),
            Err(TableError::Stale { .. })
        ));
        let t2 = b.build(&config(&state), &ports, down).unwrap();
        // Moving the frontend in the same update is fine.
        let t3 = b
            .update(&t2, &[Change::Set(&clash), Change::Remove("svc0")], down)
            .unwrap();
        assert_eq!(t3.services.len(), 1);
        assert_eq!(t3.services[0].name, "other");
        // An older table is refused.
        assert!(matches!(
            b.update(&t2, &[], down),
            Err(TableError::Stale { .. })
        ));
    }
}

#[test]
fn the_key_forms_read_back_as_addresses_and_macs() {
    let tunnelled = ServiceToml::new("tunnelled", "203.0.113.10", 80)
        .mode("dsr-ipip")
        .maglev_table_size(251)
        .set("source_ranges", r#"["192.0.2.0/24"]"#)
        .backend_table(
            r#"{ address = "198.51.100.11", port = 80, mac = "02:00:00:00:01:11", tunnel = "2001:db8::11" }"#,
        )
        .backend("198.51.100.12", 80);
    let six = ServiceToml::new("six", "2001:db8::80", 443)
        .protocol("udp")
        .maglev_table_size(251)
        .backend_mac("2001:db8::21", 443, "02:00:00:00:01:21");
    let mut cfg = strait_config::parse(
        &GatewayToml::eth0()
            .service(tunnelled)
            .service(six)
            .to_string(),
    )
    .unwrap();
    // IPv4-mapped, as a source other than a file (which refuses the spelling) may give it.
    cfg.services[0].backends[1].address = "::ffff:198.51.100.12".parse().unwrap();
    let mac = MacAddr([2, 0, 0, 0, 0, 1]);
    let mut b = Builder::new();
    b.set_locals(&[
        "198.51.100.100".parse().unwrap(),
        "2001:db8::1".parse().unwrap(),
    ]);
    let t = b
        .build(&cfg, &[Port::new(mac, 1500)], |_, _, _| false)
        .unwrap();
    assert_eq!(t.ports[0].mac_addr(), mac);
    assert_eq!(
        t.local_addrs().map(|a| a.to_string()).collect::<Vec<_>>(),
        ["198.51.100.100", "2001:db8::1"]
    );
    let backends = |s: &Service| -> Vec<&Backend> {
        s.backends
            .iter()
            .map(|&id| t.backend(id).unwrap())
            .collect()
    };

    let s = &t.services[0];
    assert_eq!(s.frontend.vip_addr().to_string(), "203.0.113.10");
    assert_eq!(
        s.frontend,
        Frontend::new(s.frontend.vip_addr(), 80, crate::key::proto::TCP)
    );
    assert_eq!(
        t.service_for(&Frontend::new(
            s.frontend.vip_addr(),
            80,
            crate::key::proto::TCP
        )),
        Some(0)
    );
    assert!(s.allows_addr("192.0.2.7".parse().unwrap()));
    assert!(!s.allows_addr("198.51.100.7".parse().unwrap()));
    let [tunnelled, mapped] = backends(s)[..] else {
        panic!("two backends")
    };
    assert_eq!(tunnelled.socket_addr().to_string(), "198.51.100.11:80");
    assert_eq!(tunnelled.tunnel_target().to_string(), "2001:db8::11");
    assert_eq!(tunnelled.mac_addr(), Some(MacAddr([2, 0, 0, 0, 1, 0x11])));
    // The key form keeps no IPv4-mapped address apart from its IPv4 address.
    assert_eq!(mapped.address().to_string(), "198.51.100.12");
    assert_eq!(mapped.tunnel_target(), mapped.address());
    assert_eq!(mapped.mac_addr(), None);

    let s = &t.services[1];
    assert_eq!(s.frontend.vip_addr().to_string(), "2001:db8::80");
    assert!(s.allows_addr("2001:db8::99".parse().unwrap()), "no ACL");
    let [six] = backends(s)[..] else {
        panic!("one backend")
    };
    assert_eq!(six.socket_addr().to_string(), "[2001:db8::21]:443");
    assert_eq!(six.mac_addr(), Some(MacAddr([2, 0, 0, 0, 1, 0x21])));
}
