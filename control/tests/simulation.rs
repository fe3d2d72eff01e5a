//! Deterministic simulation of the control core ([`strait_control::core::Control`]).
//!
//! A seeded random walk feeds the core interleavings of everything the world does to it:
//! configuration reloads (valid ones, files that do not validate, and files that change the
//! interfaces), Kubernetes publications (services added, changed and removed, several
//! publications at once, relists), health flaps and their reports (delivered late, in
//! bursts, about checks that were restarted meanwhile), neighbour-table changes (MACs that
//! appear, change and vanish; a route that comes and goes; hosts that answer probes) and
//! the passing of time on a fake clock. The effects are carried out on a model of the world:
//! the published table, the steering maps (followed with the changed services only), the
//! health checks running and what they report, the VIPs claimed, the kernel's neighbour
//! table and the probes it was sent. After every step the invariants are checked:
//!
//! - the published table is a from-scratch build of the current inputs (the accepted file,
//!   the Kubernetes list, the health the core was told), compared as the lab bench compares:
//!   every service's frontend, mode, backends and members (address, port, weight, health),
//!   ACL, affinity and Maglev slots; ids and incarnations are a builder's history and left
//!   out; the core's merged configuration is a merge from scratch;
//! - the steering maps, followed through `Changed`, hold the table's frontends;
//! - the VIPs claimed are exactly those of the published services (once forwarding);
//! - the health checks running are those the configuration asks for;
//! - every backend has a next-hop MAC (the configured one, or after a read the one the read
//!   gives its next hop), or waits for one: its next hop is followed as unresolved, was
//!   probed, and a recheck is due;
//! - a refused reload leaves the table and the configuration as they were;
//! - every published VIP's route is what it should be: not forwarding before the workers
//!   forward, draining once draining (the last tenth of the walk), announced while one of
//!   its services has a Maglev member in a from-scratch build, withdrawn otherwise; and
//!   the routes the effects carried are the core's.
//!
//! The seed is printed; `STRAIT_SIM_SEED=N` replays a run, `STRAIT_SIM_STEPS=N` sets its
//! length (10,000 by default).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use strait_config::model::{Config, HealthCheck, MacAddr, Mode, Service};
use strait_control::core::{
    BackendKey, Changed, Control, Effect, Error, Event, Loaded, Neighbours, Route, RouteMap, Scope,
};
use strait_control::kubemodel::Publication;
use strait_dataplane::table::{Builder, Frontend, Port, ServiceTable};
use strait_testkit::config::{GatewayToml, ServiceToml};

/// File services' names; `ns/k2` is also a Kubernetes name, so the file takes it over.
const FILE_NAMES: [&str; 4] = ["f0", "f1", "f2", "ns/k2"];
/// Kubernetes services.
const KUBE_SERVICES: usize = 10;
/// Backend addresses: on the segment, and behind the router when its route exists.
const ON_LINK: [&str; 8] = [
    "198.51.100.1",
    "198.51.100.2",
    "198.51.100.3",
    "198.51.100.4",
    "198.51.100.5",
    "198.51.100.6",
    "198.51.100.7",
    "198.51.100.8",
];
const ROUTED: [&str; 3] = ["192.0.2.10", "192.0.2.11", "192.0.2.12"];
const ROUTER: &str = "198.51.100.254";
const ROUTED_NET: &str = "192.0.2.0/24";
const IFINDEX: u32 = 7;

/// The world the core drives, as the simulation models it.
struct World {
    rng: fastrand::Rng,
    seed: u64,
    step: usize,
    start: Instant,
    now: Instant,
    core: Control,
    ports: Vec<Port>,
    /// The file the core accepted last.
    file: Config,
    /// The interface addresses of the reload the core accepted last.
    locals: Vec<IpAddr>,
    /// The Kubernetes list, by name.
    kube: BTreeMap<String, Arc<Service>>,
    /// The table the workers would use.
    live: Arc<ServiceTable>,
    /// The steering maps: each published service's frontend, followed through `Changed`.
    maps: BTreeMap<String, Frontend>,
    /// The maps lack keys (a failed update), to be retried.
    maps_pending: bool,
    /// Health checks running: their check and whether the backend answers them.
    running: BTreeMap<BackendKey, (HealthCheck, bool)>,
    /// State changes the checker found, not delivered yet.
    reports: Vec<BackendKey>,
    /// What the core was told of each running check, by the last delivered report.
    told: BTreeMap<BackendKey, bool>,
    claiming: bool,
    claimed: BTreeSet<IpAddr>,
    /// The routes the last [`Effect::Routes`] carried.
    routes: Arc<RouteMap>,
    draining: bool,
    /// The kernel's neighbour table on the backend interface.
    neigh: BTreeMap<IpAddr, MacAddr>,
    /// Whether the route to the routed backends (via the router) exists.
    route: bool,
    /// The MAC each host answers with.
    host_mac: BTreeMap<IpAddr, MacAddr>,
    /// Next hops probed since they were last resolved.
    probed: BTreeSet<IpAddr>,
    /// The core asked for a read that the world has not answered yet.
    read_outstanding: bool,
    /// What the last read asked for covers.
    read_scope: Scope,
    /// The read most recently handed to the core, when it left nothing held.
    last_read: Option<Neighbours>,
    counts: BTreeMap<&'static str, usize>,
}

fn ip(a: &str) -> IpAddr {
    a.parse().unwrap()
}

fn addresses() -> Vec<IpAddr> {
    ON_LINK.iter().chain(&ROUTED).map(|a| ip(a)).collect()
}

impl World {
    fn new(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let start = Instant::now();
        let ports = vec![Port::new(MacAddr([2, 0, 0, 0, 0, 1]), 1500)];
        // A first file that validates.
        let file = loop {
            if let Ok(c) = strait_config::parse(&file_toml(&mut rng, true)) {
                break c;
            }
        };
        let host_mac = addresses()
            .into_iter()
            .chain([ip(ROUTER)])
            .enumerate()
            .map(|(i, a)| (a, MacAddr([2, 0, 0, 0, 0x10, i as u8])))
            .collect();
        let loaded = Loaded {
            config: file.clone(),
            locals: vec![ip("198.51.100.100")],
            neighbours: Neighbours::default(),
        };
        let core = Control::new(start, loaded, ports.clone()).expect("the first table builds");
        let live = Arc::clone(core.table());
        let maps = frontends(&live);
        let mut w = Self {
            rng,
            seed,
            step: 0,
            start,
            now: start,
            core,
            ports,
            file,
            locals: vec![ip("198.51.100.100")],
            kube: BTreeMap::new(),
            live,
            maps,
            maps_pending: false,
            running: BTreeMap::new(),
            reports: Vec::new(),
            told: BTreeMap::new(),
            claiming: false,
            claimed: BTreeSet::new(),
            routes: Arc::default(),
            draining: false,
            neigh: BTreeMap::new(),
            route: false,
            host_mac,
            probed: BTreeSet::new(),
            read_outstanding: false,
            read_scope: Scope::All,
            last_read: None,
            counts: BTreeMap::new(),
        };
        w.run_effects();
        w
    }

    /// Fails the run, naming the seed and the step.
    #[track_caller]
    fn check(&self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            panic!(
                "simulation seed {} step {}: {}\n(replay: STRAIT_SIM_SEED={} cargo test -p strait-control --test simulation)",
                self.seed,
                self.step,
                what(),
                self.seed
            );
        }
    }

    fn read(&self) -> Neighbours {
        Neighbours {
            macs: self.neigh.iter().map(|(&a, &m)| (a, m)).collect(),
            routes: if self.route {
                vec![(ROUTED_NET.parse::<IpNet>().unwrap(), Some(ip(ROUTER)))]
            } else {
                Vec::new()
            },
            ifindex: IFINDEX,
            only: None,
        }
    }

    fn handle(&mut self, event: Event) -> Result<(), Error> {
        let r = self.core.handle(self.now, event);
        self.run_effects();
        r
    }

    /// Carries out every queued effect on the model; a read is answered at once unless the
    /// walk decides to let it wait (a driver that breaks the contract: the core must cope).
    fn run_effects(&mut self) {
        while let Some(e) = self.core.poll_effect() {
            match e {
                Effect::Publish { table, changed } => {
                    self.check(table.generation > self.live.generation, || {
                        format!(
                            "generation {} published after {}",
                            table.generation, self.live.generation
                        )
                    });
                    match &changed {
                        Changed::All => self.maps = frontends(&table),
                        Changed::Services(names) => {
                            for n in names {
                                self.maps.remove(n);
                                if let Some(s) = table.services.iter().find(|s| &s.name == n) {
                                    self.maps.insert(n.clone(), s.frontend);
                                }
                            }
                        }
                    }
                    let old = std::mem::replace(&mut self.live, table);
                    self.core.recycle(old);
                    // A full map, now and then.
                    let complete = self.rng.u8(..) >= 8;
                    self.maps_pending = !complete;
                    self.core
                        .handle(self.now, Event::Maps { complete })
                        .expect("a map result is never refused");
                }
                Effect::RetryMaps => {
                    let complete = self.rng.bool();
                    self.maps_pending = !complete;
                    self.core
                        .handle(self.now, Event::Maps { complete })
                        .expect("a map result is never refused");
                }
                Effect::Status { file, kube } => {
                    let list: Vec<&Arc<Service>> = self.kube.values().collect();
                    self.check(
                        kube.len() == list.len() && kube.iter().zip(&list).all(|(a, b)| a == *b),
                        || "the status's Kubernetes list is not the list".into(),
                    );
                    let _ = file;
                }
                Effect::StartCheck { backend, check } => match self.running.get_mut(&backend) {
                    // A changed check goes on from the health it had (the checker's state).
                    Some(running) => running.0 = check,
                    None => {
                        self.told.remove(&backend);
                        self.running.insert(backend, (check, true));
                    }
                },
                Effect::PassiveOut { backend, .. } => {
                    self.check(self.running.contains_key(&backend), || {
                        format!("passive health took out {backend:?}, which is not checked")
                    });
                }
                Effect::StopCheck { backend } => {
                    self.check(self.running.contains_key(&backend), || {
                        format!("stopping {backend:?}, which is not checked")
                    });
                    self.told.remove(&backend);
                    self.running.remove(&backend);
                }
                Effect::ClaimVips(vips) => {
                    for v in vips {
                        self.check(self.claiming, || format!("{v} claimed before forwarding"));
                        let fresh = self.claimed.insert(v);
                        self.check(fresh, || format!("{v} claimed twice"));
                    }
                }
                Effect::ReleaseVips(vips) => {
                    for v in vips {
                        let was = self.claimed.remove(&v);
                        self.check(was, || format!("{v} released, not claimed"));
                    }
                }
                Effect::Routes(routes) => {
                    self.check(routes != self.routes, || {
                        "routes said again unchanged".into()
                    });
                    self.routes = routes;
                }
                Effect::Probe { hops, ifindex } => {
                    self.check(ifindex == IFINDEX || ifindex == 0, || {
                        format!("probe on interface {ifindex}")
                    });
                    for hop in hops {
                        self.probed.insert(hop);
                        // Most hosts answer a probe; the kernel learns their MAC.
                        if self.rng.u8(..4) != 0 {
                            if let Some(&m) = self.host_mac.get(&hop) {
                                self.neigh.insert(hop, m);
                            }
                        }
                    }
                }
                Effect::ReadNeighbours(scope) => {
                    self.read_scope = scope;
                    if self.rng.u8(..16) == 0 {
                        self.read_outstanding = true;
                        self.count("read left waiting");
                    } else {
                        self.answer_read();
                    }
                }
            }
        }
    }

    fn answer_read(&mut self) {
        self.read_outstanding = false;
        let whole = self.read();
        // As the kernel answers when the read is made: of every entry, or of the asked
        // targets' next hops only.
        let (read, all) = match &self.read_scope {
            Scope::All => (whole.clone(), true),
            Scope::Targets(t) => (whole.part(t), false),
        };
        if !all {
            self.count("read of some next hops");
        }
        // A read that completes a held update fills the changed services only; one of the
        // whole table that finds nothing held checks every next hop.
        let held = self.core.holding();
        let r = self.core.handle(self.now, Event::Neighbours(read));
        self.check(r.is_ok(), || format!("a read was refused: {r:?}"));
        self.last_read = (!held && all).then_some(whole);
    }

    fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }

    /// One random step.
    fn step(&mut self) {
        self.last_read = None;
        let roll = self.rng.u32(..100);
        match roll {
            0..=4 => self.reload_valid(),
            5..=7 => self.reload_invalid(),
            8..=37 => self.kube_change(),
            38..=49 => self.flap(),
            50..=59 => self.deliver_reports(),
            60..=69 => self.neighbour_change(),
            70..=71 => {
                self.route = !self.route;
                self.count("route toggled");
            }
            72..=75 => {
                if self.read_outstanding {
                    self.count("late read answered");
                    self.answer_read();
                    self.run_effects();
                }
            }
            76 => {
                if !self.claiming {
                    self.claiming = true;
                    self.handle(Event::Forwarding).unwrap();
                }
            }
            _ => self.tick(),
        }
    }

    fn reload_valid(&mut self) {
        let text = file_toml(&mut self.rng, true);
        let Ok(config) = strait_config::parse(&text) else {
            // Random frontends may clash within the file: a refused reload too.
            return self.reload_refused(Err(text));
        };
        let read = self.read();
        // The interfaces' addresses change now and then (DHCP, an operator).
        let locals = match self.rng.u8(..4) {
            0 => Vec::new(),
            1 => vec![ip("198.51.100.100"), ip("2001:db8::100")],
            _ => vec![ip("198.51.100.100")],
        };
        let loaded = Loaded {
            config: config.clone(),
            locals: locals.clone(),
            neighbours: read.clone(),
        };
        let r = self.handle(Event::Reload(Ok(Box::new(loaded))));
        self.check(r.is_ok(), || format!("a valid reload was refused: {r:?}"));
        self.file = config;
        self.locals = locals;
        if self.last_read.is_none() {
            self.last_read = (!self.core.holding()).then_some(read);
        }
        self.count("reload");
    }

    fn reload_invalid(&mut self) {
        if self.rng.bool() {
            let text = file_toml(&mut self.rng, false);
            self.reload_refused(Err(text));
        } else {
            let Ok(mut config) = strait_config::parse(&file_toml(&mut self.rng, true)) else {
                return;
            };
            config.gateway.interfaces[0].name = "eth1".into();
            self.reload_refused(Ok(config));
        }
    }

    /// A reload the core must refuse: a file that does not validate (`Err`, its text) or a
    /// configuration with other interfaces.
    fn reload_refused(&mut self, attempt: Result<Config, String>) {
        let event = match attempt {
            Ok(config) => Event::Reload(Ok(Box::new(Loaded {
                config,
                locals: Vec::new(),
                neighbours: self.read(),
            }))),
            Err(text) => match strait_config::parse(&text) {
                Err(e) => Event::Reload(Err(e.to_string())),
                Ok(_) => return,
            },
        };
        let (before, config) = (Arc::clone(&self.live), self.core.config().clone());
        let held = self.core.holding();
        let r = self.handle(event);
        self.check(r.is_err(), || "an invalid reload was accepted".into());
        if !held {
            self.check(Arc::ptr_eq(&before, &self.live), || {
                "a refused reload changed the table".into()
            });
        }
        self.check(&config == self.core.config(), || {
            "a refused reload changed the configuration".into()
        });
        self.count("reload refused");
    }

    fn kube_change(&mut self) {
        let mut publications = Vec::new();
        let n = if self.rng.u8(..8) == 0 { 2 } else { 1 };
        for _ in 0..n {
            let mut changes = Vec::new();
            let relist = self.rng.u8(..20) == 0;
            let count = if relist {
                KUBE_SERVICES
            } else {
                1 + self.rng.usize(..2)
            };
            for _ in 0..count {
                let i = self.rng.usize(..KUBE_SERVICES);
                let name = format!("ns/k{i}");
                if self.kube.contains_key(&name) && self.rng.u8(..3) == 0 {
                    self.kube.remove(&name);
                    changes.push((name, None));
                } else if let Some(s) = kube_service(&mut self.rng, i) {
                    let s = Arc::new(s);
                    self.kube.insert(name.clone(), Arc::clone(&s));
                    changes.push((name, Some(s)));
                }
            }
            if relist {
                // A relist names every service, set or gone.
                changes = (0..KUBE_SERVICES)
                    .map(|i| {
                        let name = format!("ns/k{i}");
                        let s = self.kube.get(&name).cloned();
                        (name, s)
                    })
                    .collect();
                self.count("kube relist");
            }
            publications.push(Publication {
                services: self.kube.values().cloned().collect(),
                changes,
            });
        }
        let r = self.handle(Event::Kube(publications));
        self.check(r.is_ok(), || {
            format!("a Kubernetes change was refused: {r:?}")
        });
        self.count("kube change");
    }

    fn flap(&mut self) {
        let keys: Vec<BackendKey> = self.running.keys().cloned().collect();
        if keys.is_empty() {
            return;
        }
        let k = keys[self.rng.usize(..keys.len())].clone();
        let entry = self.running.get_mut(&k).unwrap();
        entry.1 = !entry.1;
        self.reports.push(k);
        self.count("health flap");
        if self.rng.bool() {
            self.deliver_reports();
        }
    }

    /// Hands the core the pending reports, each with the checker's state now (as the
    /// driver does): a report of a check since restarted or stopped tells its present.
    fn deliver_reports(&mut self) {
        if self.reports.is_empty() {
            return;
        }
        let reports: Vec<(BackendKey, bool)> = std::mem::take(&mut self.reports)
            .into_iter()
            .map(|k| {
                let up = self.running.get(&k).is_none_or(|r| r.1);
                (k, up)
            })
            .collect();
        for (k, up) in &reports {
            if self.running.contains_key(k) {
                self.told.insert(k.clone(), *up);
            }
        }
        let r = self.handle(Event::Health(reports));
        self.check(r.is_ok(), || format!("a health report was refused: {r:?}"));
        self.count("health reports");
    }

    fn neighbour_change(&mut self) {
        let hosts: Vec<IpAddr> = self.host_mac.keys().copied().collect();
        let h = hosts[self.rng.usize(..hosts.len())];
        match self.rng.u8(..3) {
            0 => {
                self.neigh.remove(&h);
                self.count("neighbour vanished");
            }
            1 => {
                // A new NIC: the host answers with another MAC from now on.
                let m = MacAddr([2, 0, 0, 0, 0x20 + self.rng.u8(..4), self.rng.u8(..)]);
                self.host_mac.insert(h, m);
                if self.neigh.contains_key(&h) {
                    self.neigh.insert(h, m);
                }
                self.count("neighbour changed");
            }
            _ => {
                self.neigh.insert(h, self.host_mac[&h]);
                self.count("neighbour appeared");
            }
        }
    }

    fn tick(&mut self) {
        let advance = Duration::from_millis(self.rng.u64(..1500));
        self.now += advance;
        if self.core.poll_timeout().is_some_and(|at| at <= self.now) {
            let r = self.handle(Event::Tick);
            self.check(r.is_ok(), || format!("a tick was refused: {r:?}"));
            self.count("tick");
        }
    }

    /// The invariants, after a step.
    fn check_invariants(&mut self) {
        let holding = self.core.holding();
        self.check(!holding || self.read_outstanding, || {
            "holding an update without an outstanding read".into()
        });
        let list: Vec<Arc<Service>> = self.kube.values().cloned().collect();
        let (merged, _) = strait_control::kubemodel::merge(&self.file, &list);
        self.check(&merged == self.core.config(), || {
            "the core's configuration is not a merge from scratch of the file and the list".into()
        });
        // Health checks running: those the configuration asks for.
        let mut want: BTreeMap<BackendKey, HealthCheck> = BTreeMap::new();
        for s in &merged.services {
            if let Some(hc) = &s.health_check {
                for b in &s.backends {
                    want.insert(BackendKey::new(&s.name, b.address, b.port), hc.clone());
                }
            }
        }
        let running: BTreeMap<BackendKey, HealthCheck> = self
            .running
            .iter()
            .map(|(k, (hc, _))| (k.clone(), hc.clone()))
            .collect();
        self.check(running == want, || {
            format!("checks running {running:?}, wanted {want:?}")
        });
        if holding {
            return;
        }
        // Every table holds the addresses of the last accepted reload, also those made by
        // updates since.
        let locals: Vec<IpAddr> = self.live.local_addrs().collect();
        self.check(locals == self.locals, || {
            format!(
                "the published table's local addresses {:?}, the last reload's {:?}",
                locals, self.locals
            )
        });
        // The table: a from-scratch build of the inputs.
        let told = &self.told;
        let down = |s: &str, a: IpAddr, p: u16| told.get(&BackendKey::new(s, a, p)) == Some(&false);
        let want_table = Builder::new()
            .build(&merged, &self.ports, down)
            .expect("the inputs build");
        let (got, expected) = (view(&self.live), view(&want_table));
        self.check(got == expected, || {
            let diff: Vec<String> = got
                .iter()
                .zip(&expected)
                .filter(|(a, b)| a != b)
                .map(|(a, b)| format!("  published {a:?}\n  expected  {b:?}"))
                .take(3)
                .collect();
            format!(
                "the published table is not a build from scratch ({} vs {} services)\n{}",
                got.len(),
                expected.len(),
                diff.join("\n")
            )
        });
        // The steering maps, followed with the changed services only.
        let maps = frontends(&self.live);
        self.check(self.maps == maps, || {
            format!("steering maps {:?}, table {:?}", self.maps, maps)
        });
        self.check(
            !self.maps_pending || self.core.poll_timeout().is_some(),
            || "steering maps incomplete and no retry due".into(),
        );
        // VIPs: exactly those of the published services, once forwarding.
        let vips: BTreeSet<IpAddr> = if self.claiming {
            merged.services.iter().map(|s| s.vip).collect()
        } else {
            BTreeSet::new()
        };
        self.check(self.claimed == vips, || {
            format!("VIPs claimed {:?}, services' {:?}", self.claimed, vips)
        });
        self.check(self.core.claimed() == vips, || {
            "the core's claimed set differs".into()
        });
        self.check_routes(&merged, &want_table);
        self.check_macs(&merged);
    }

    /// Every published VIP's route, derived from scratch.
    fn check_routes(&self, merged: &Config, table: &ServiceTable) {
        let mut want = RouteMap::new();
        for s in &merged.services {
            let serving = table
                .services
                .iter()
                .any(|t| t.name == s.name && !t.members.is_empty());
            let r = if !self.claiming {
                Route::NotForwarding
            } else if self.draining {
                Route::Draining
            } else if serving {
                Route::Announced
            } else {
                Route::NoServingBackend
            };
            let e = want.entry(s.vip).or_insert(r);
            if r == Route::Announced {
                *e = r;
            }
        }
        self.check(*self.routes == want, || {
            format!("routes {:?}, expected {want:?}", self.routes)
        });
        self.check(**self.core.routes() == want, || {
            "the core's routes differ from what its effects said".into()
        });
    }

    /// Every backend has its next-hop MAC or waits for one.
    fn check_macs(&mut self, merged: &Config) {
        let unresolved = self.core.next_hops().unresolved();
        let due = self
            .core
            .poll_timeout()
            .is_some_and(|at| at <= self.now + Duration::from_secs(1));
        let by_name: HashMap<&str, &Service> = merged
            .services
            .iter()
            .map(|s| (s.name.as_str(), s))
            .collect();
        let read = self.last_read.clone();
        let mut waiting = 0;
        for ts in &self.live.services {
            let s = by_name[ts.name.as_str()];
            for b in &s.backends {
                let tb = ts
                    .backends
                    .iter()
                    .filter_map(|&id| self.live.backend(id))
                    .find(|t| t.socket_addr() == b.socket_addr())
                    .expect("every configured backend is in the table");
                if let Some(m) = b.mac {
                    self.check(tb.mac_addr() == Some(m), || {
                        format!("{} {}: configured MAC not used", s.name, b.address)
                    });
                    continue;
                }
                let routed = s.mode != Mode::DsrL2;
                let hop = |n: &Neighbours| {
                    if routed {
                        n.next_hop(b.address)
                    } else {
                        b.address
                    }
                };
                if tb.mac_addr().is_none() {
                    waiting += 1;
                    // Its next hop: itself, or the router while the route exists (the core
                    // knows the routes of its reads only, so either may be the one).
                    let hops = [b.address, ip(ROUTER)];
                    let hops = if routed { &hops[..] } else { &hops[..1] };
                    // Or another service's fill found its MAC since, and the next recheck
                    // refills the whole table.
                    let split = self.core.next_hops().split();
                    self.check(split || hops.iter().any(|h| unresolved.contains(h)), || {
                        format!(
                            "{} {}: no MAC, and its next hop is not followed",
                            s.name, b.address
                        )
                    });
                    self.check(hops.iter().any(|h| self.probed.contains(h)), || {
                        format!(
                            "{} {}: no MAC, and its next hop was never probed",
                            s.name, b.address
                        )
                    });
                    self.check(due, || {
                        format!("{} {}: no MAC, and no recheck due", s.name, b.address)
                    });
                }
                // Right after a read, a next hop it resolves has the read's MAC.
                if let Some(read) = &read {
                    let h = hop(read);
                    if let Some(m) = read.macs.get(&h) {
                        self.check(tb.mac_addr() == Some(*m), || {
                            format!(
                                "{} {}: next hop {h} is {m} in the read, {:?} in the table",
                                s.name,
                                b.address,
                                tb.mac_addr()
                            )
                        });
                    }
                }
            }
        }
        let count = self
            .live
            .backends
            .iter()
            .flatten()
            .filter(|b| b.mac.is_none())
            .count();
        self.check(count == waiting, || {
            format!("{count} backends without a MAC, {waiting} waiting")
        });
        if waiting > 0 {
            self.count("steps with backends waiting");
        }
    }
}

/// A file configuration: 0 to 4 services, valid as far as its parts go (`valid`), or with
/// a mistake the validation names.
fn file_toml(rng: &mut fastrand::Rng, valid: bool) -> String {
    let mut g = GatewayToml::eth0();
    if !valid {
        let t = g.to_string();
        return match rng.u8(..3) {
            0 => format!("[gateway]\nmtu = {}\n{t}", rng.u32(1..500)),
            1 => t + "[[services]]\nname = \"bad\"\nvip = \"203.0.113.1\"\nport = 70000\n",
            _ => t + "this is not toml [",
        };
    }
    let mut names: Vec<&str> = FILE_NAMES.to_vec();
    rng.shuffle(&mut names);
    for name in names.into_iter().take(rng.usize(..=4)) {
        let vip = format!("203.0.113.{}", 1 + rng.u8(..6));
        let port = [80, 443][rng.usize(..2)];
        g = g.service(service_toml(rng, name, &vip, port));
    }
    g.to_string()
}

/// A `[[services]]` entry with random protocol, mode, health check and backends.
fn service_toml(rng: &mut fastrand::Rng, name: &str, vip: &str, port: u32) -> ServiceToml {
    let protocol = if rng.u8(..4) == 0 { "udp" } else { "tcp" };
    let mode = if rng.bool() { "dsr-l2" } else { "nat" };
    let mut s = ServiceToml::new(name, vip, port)
        .protocol(protocol)
        .mode(mode)
        .maglev_table_size(31);
    if rng.u8(..3) == 0 {
        let interval = [1, 2][rng.usize(..2)];
        s = s.set(
            "health_check",
            format!("{{ kind = \"tcp\", interval = \"{interval}s\" }}"),
        );
    }
    let mut addrs = addresses();
    rng.shuffle(&mut addrs);
    for a in addrs.into_iter().take(rng.usize(..=4)) {
        let mac = if rng.u8(..3) == 0 {
            format!(", mac = \"02:00:00:00:01:{:02x}\"", rng.u8(..))
        } else {
            String::new()
        };
        let weight = if rng.u8(..6) == 0 { ", weight = 0" } else { "" };
        s = s.backend_table(format!("{{ address = \"{a}\", port = 8080{mac}{weight} }}"));
    }
    s
}

/// Kubernetes service `ns/k{i}`: its own VIP on port 80, so Kubernetes services never share
/// a frontend, but file services on the first VIPs may take theirs.
fn kube_service(rng: &mut fastrand::Rng, i: usize) -> Option<Service> {
    let vip = format!("203.0.113.{}", 1 + i);
    let t = GatewayToml::eth0().service(service_toml(rng, &format!("ns/k{i}"), &vip, 80));
    let mut cfg = strait_config::parse(&t.to_string()).ok()?;
    cfg.services.pop()
}

/// Each service's frontend, by name: what the steering maps hold.
fn frontends(t: &ServiceTable) -> BTreeMap<String, Frontend> {
    t.services
        .iter()
        .map(|s| (s.name.clone(), s.frontend))
        .collect()
}

/// A backend as compared: address, port, weight, health.
type BackendView = (SocketAddr, u32, String);

/// A service as compared: name, frontend, mode, backends, members, ACL, affinity, Maglev
/// slots. Ids and incarnations are the builder's history, and MACs are checked apart.
type ServiceView = (
    String,
    Frontend,
    String,
    Vec<BackendView>,
    Vec<BackendView>,
    String,
    u32,
    Vec<u16>,
);

fn view(t: &ServiceTable) -> Vec<ServiceView> {
    let resolve = |ids: &[strait_dataplane::key::BackendId]| -> Vec<BackendView> {
        ids.iter()
            .map(|&id| {
                let b = t.backend(id).expect("a service's backend is in the table");
                (b.socket_addr(), b.weight, format!("{:?}", b.health))
            })
            .collect()
    };
    let mut v: Vec<ServiceView> = t
        .services
        .iter()
        .map(|s| {
            (
                s.name.clone(),
                s.frontend,
                format!("{:?}", s.mode),
                resolve(&s.backends),
                resolve(&s.members),
                format!("{:?}", s.acl),
                s.affinity_secs,
                s.maglev.slots().to_vec(),
            )
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn random_interleavings_keep_the_invariants() {
    let seed = std::env::var("STRAIT_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let steps: usize = std::env::var("STRAIT_SIM_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    eprintln!("simulation seed {seed} (STRAIT_SIM_SEED={seed} replays it), {steps} steps");
    let t = Instant::now();
    let mut w = World::new(seed);
    w.check_invariants();
    for step in 1..=steps {
        w.step = step;
        if step == steps - steps / 10 {
            // The last tenth drains: every route goes and stays gone.
            w.draining = true;
            w.handle(Event::Drain).expect("a drain is never refused");
        } else {
            w.step();
        }
        w.check_invariants();
    }
    let took = t.elapsed();
    eprintln!(
        "{steps} steps in {:.2?} ({:.0} steps/s), {:.1?} of simulated time, generation {}",
        took,
        steps as f64 / took.as_secs_f64(),
        w.now - w.start,
        w.live.generation
    );
    for (what, n) in &w.counts {
        eprintln!("  {what}: {n}");
    }
    for what in [
        "reload",
        "reload refused",
        "kube change",
        "kube relist",
        "health reports",
        "neighbour vanished",
        "tick",
        "late read answered",
        "read of some next hops",
        "steps with backends waiting",
    ] {
        w.check(w.counts.get(what).copied().unwrap_or(0) > 0, || {
            format!("the walk never did {what:?}: it checks less than it claims")
        });
    }
}
