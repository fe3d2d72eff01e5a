//! The control core: the gateway's control side as a state machine without I/O.
//!
//! ```text
//!  Event ──► Control::handle(now, event) ──► Control::poll_effect() ──► Effect
//!   Reload (file read, SIGHUP / POST /reload)     Publish (table; which services changed)
//!   Kube (publications of the Kubernetes source)   Status (what the admin API shows)
//!   Health (backends that went up or down)         StartCheck / StopCheck, PassiveOut
//!   Passive (failed connection attempts, nat)
//!   Neighbours (a read of the kernel's table)      ClaimVips / ReleaseVips
//!   Maps (whether the steering maps took a table)  Probe (next hops to resolve)
//!   Forwarding (the workers run: VIPs may go up)   ReadNeighbours / RetryMaps
//!   Tick (a deadline passed)                      + Control::poll_timeout(): the next deadline
//! ```
//!
//! As the packet pipeline is a step function with `now` passed in, the control side is
//! one too, in the manner of quinn-proto's `Connection` (`handle_event`, `poll_transmit`,
//! `poll_timeout`): the core owns the pure state (the file's configuration, the Kubernetes
//! services, their merge, the table [`Builder`] and the live table, the health states it
//! was told, the next hops taken from the kernel, the VIPs claimed, the timers) and the
//! drivers own the world (threads, sockets, netlink, `ip`, the clock). [`crate::run`]
//! is the gateway's driver; `tests/simulation.rs` is another, which runs ten thousand
//! random steps against a model of the world in a second.
//!
//! Decisions:
//!
//! - **Every change is incremental, health included.** A Kubernetes change and a health
//!   change both update the table for the services they touch ([`Builder::update`]);
//!   a reload, a next-hop refill and an update the builder refuses build it whole. A health
//!   change gives its service the next-hop MACs the live table already has for it, so a
//!   flap reads nothing.
//! - **Next-hop MACs come from reads the driver makes when asked.** A Kubernetes change
//!   bringing backends without a MAC holds its table update and asks for a read of those
//!   backends' next hops only ([`Effect::ReadNeighbours`] with [`Scope::Targets`]: its cost
//!   is the change's, not the neighbour table's, which holds every node of a large
//!   cluster); the [`Event::Neighbours`] answer updates the core's copy of the table for
//!   them ([`Neighbours::update`]) and completes the update. A driver answers at once;
//!   further Kubernetes changes join the held update, and should a reload or a health change
//!   come first, the held update completes with what the core knows (the next read refills
//!   what differs). Every second, while some backend takes its next hop from the kernel,
//!   the timer asks for a read of the whole table ([`Scope::All`]), and that one is checked
//!   against every followed next hop ([`NextHops::recheck`], a walk over all of them that a
//!   Kubernetes change does not pay for). A reload comes
//!   with its own read ([`Loaded`]): its answer (the admin API waits for it) is immediate.
//! - **VIPs follow the published table**, after the table is published: the kernel must not
//!   own a VIP whose traffic the steering program does not take yet, or it answers it with
//!   resets. Claiming starts with [`Event::Forwarding`]. Probes go out before both, so that
//!   the kernel resolves new next hops while the VIPs are announced; the admin API's view
//!   ([`Effect::Status`]) changes after both, so that it never shows a service before it
//!   forwards.
//! - **Health checks are the core's decision.** The core says which backend is checked how
//!   ([`Effect::StartCheck`], [`Effect::StopCheck`]); a stopped check is forgotten, a
//!   changed one keeps the health it had. Reports of backends it does not check are
//!   ignored.
//! - **Slow start ramps by incremental updates.** A backend that comes up in a service with
//!   `slow_start` takes a growing share of its weight, stepped once a second by an update
//!   of its service alone ([`ramps`] says what comes up and how the weight grows); the
//!   timer wakes the core for a step only while some backend ramps.
//! - **Logs are `tracing` events**, as in quinn-proto: observations, not effects on the
//!   world; the driver's subscriber writes them.
//! - **Deterministic.** Effects come in a fixed order and every list in them is sorted, so
//!   a simulation seed replays the same run.
//!
//! The core's vocabulary lives here, not in the drivers that speak it: a driver imports
//! [`BackendKey`] (health checks), [`Neighbours`] and [`Scope`] (the neighbour reads),
//! [`Route`] (BGP, VRRP) from the core, and the core imports no driver. What it knows of
//! Kubernetes is `crate::kubemodel`'s data ([`Publication`], the merge), never the source
//! that watches the API server. So the compiler holds "no I/O here": the core cannot name
//! a socket-owning module.
//!
//! | file | part |
//! |---|---|
//! | `event.rs` | what goes in and out: [`Event`], [`Effect`], [`Loaded`], [`Changed`], [`BackendKey`], [`Route`] |
//! | `mod.rs` | [`Control`]: the state machine, building and publishing tables, next hops, timers |
//! | `hops.rs` | next hops: a read of the kernel's table ([`Neighbours`]), what it covers ([`Scope`]), those followed ([`NextHops`]) |
//! | `merge.rs` | the merged configuration kept in step with Kubernetes changes |
//! | `checks.rs` | the health checks wanted and the health told |
//! | `passive.rs` | passive health: failed connection attempts over a window, the backends taken out of new flows |
//! | `ramps.rs` | slow start: the backends ramping to their weight, and their weight now |
//! | `routes.rs` | which VIPs are announced, followed per changed service |
//! | `vips.rs` | the VIPs claimed, followed per changed service |

mod checks;
mod event;
pub mod hops;
mod merge;
pub mod passive;
pub mod ramps;
mod routes;
mod vips;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strait_config::model::{Config, HealthCheck, MacAddr, Service};
use strait_dataplane::table::{Builder, Change, Port, ServiceTable, TableError};
use tracing::{info, warn};

use crate::kubemodel::Publication;

pub use event::{BackendKey, Changed, Effect, Event, Loaded, Route, RouteAttrMap, RouteMap};
pub use hops::{Neighbours, NextHops, Scope};
pub use merge::BULK;

/// How often the kernel's neighbour table is read again while some backend takes its next
/// hop from it: a next hop that resolved or changed its MAC is in the table within a second,
/// for one netlink read (tens of microseconds) a second.
pub const NEIGHBOUR_RECHECK: Duration = Duration::from_secs(1);

/// How often the next hops in use are probed, so that the kernel keeps their entries true
/// (as Cilium refreshes its nodes' entries, every 30 s by default).
pub const NEIGHBOUR_REFRESH: Duration = Duration::from_secs(30);

/// How often steering-map keys a failed update left pending are tried again: a full map
/// frees up as slowly as services leave, so a second is soon enough and costs nothing.
pub const MAPS_RETRY: Duration = Duration::from_secs(1);

/// How soon after probing next hops that a fill left unresolved the kernel's table is read
/// again (then every [`NEIGHBOUR_RECHECK`]): ARP and ND on a segment answer well within it,
/// so a new backend gets its MAC about this long after it appeared, not a second later.
pub const PROBE_ANSWER: Duration = Duration::from_millis(100);

/// Why the core refused an event; the running table stays.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration file does not load or validate.
    #[error("{problems}")]
    Invalid {
        /// Every problem, with its path.
        problems: String,
    },
    /// A reload changed the interfaces, which only a restart can do.
    #[error("reload: interfaces changed; restart strait to change interfaces or queues")]
    InterfacesChanged,
    /// A reload changed `[gateway.bgp]`, which only a restart can do (the speaker would
    /// close every session to take it).
    #[error("reload: gateway.bgp changed; restart strait (after `strait drain`) to change the BGP speaker")]
    BgpChanged,
    /// A reload changed a setting of `[gateway]` read only at start (`start_only_change`).
    #[error("reload: gateway.{0} changed, which is read only at start; restart strait (after `strait drain`) to change it")]
    RestartNeeded(&'static str),
    /// The table does not build.
    #[error("{why}: the table does not build: {source}")]
    Table {
        /// What asked for it.
        why: &'static str,
        /// What the builder said.
        source: TableError,
    },
}

/// The control core. See the module documentation.
#[derive(Debug)]
pub struct Control {
    /// The configuration file's configuration.
    file: Arc<Config>,
    /// The last Kubernetes list, sorted by name (empty without the source).
    kube: Arc<Vec<Arc<Service>>>,
    /// `file` and `kube` merged (see [`merge`]): what the table is built from, less the
    /// next-hop MACs.
    config: Config,
    ports: Vec<Port>,
    /// The interfaces' own addresses, which every table holds (the builder's input).
    locals: Vec<IpAddr>,
    builder: Builder,
    /// The table last published.
    table: Arc<ServiceTable>,
    /// The health checks wanted, and the health the core was told.
    health: checks::Checks,
    /// Passive health: recent failed connection attempts, the backends taken out.
    passive: passive::Passive,
    hops: NextHops,
    /// The kernel's neighbour table as the core knows it: the last read of the whole table,
    /// updated by the reads of some next hops since.
    neighbours: Neighbours,
    /// Services whose table update waits for a neighbour read.
    held: Option<BTreeSet<String>>,
    /// The admin API's view is to be updated ([`Effect::Status`]).
    status_due: bool,
    /// The timer asked for a read, to check the followed next hops against it.
    recheck_asked: bool,
    /// The VIPs of the published services, claimed once forwarding.
    vips: vips::Vips,
    /// Which claimed VIPs are announced to the routers.
    routes: routes::Routes,
    /// The backends ramping to their weight (slow start).
    ramps: ramps::Ramps,
    /// Keys the steering maps still lack.
    maps_incomplete: bool,
    maps_retry_at: Instant,
    recheck_at: Instant,
    /// The time of the event being handled.
    now: Instant,
    refresh_at: Instant,
    effects: VecDeque<Effect>,
}

impl Control {
    /// The core of a gateway with data interfaces `ports` (MAC and MTU, in configuration
    /// order), started at `now` with `loaded`: the first table is built ([`Control::table`];
    /// no [`Effect::Publish`] for it), and the effects ask for its health checks and
    /// probes.
    ///
    /// # Errors
    /// [`Error::Table`] when the first table does not build.
    pub fn new(now: Instant, loaded: Loaded, ports: Vec<Port>) -> Result<Self, Error> {
        let file = Arc::new(loaded.config);
        let mut c = Self {
            config: (*file).clone(),
            file,
            kube: Arc::default(),
            ports,
            locals: loaded.locals,
            builder: Builder::new(),
            table: Arc::new(ServiceTable::empty(Vec::new())),
            health: checks::Checks::default(),
            passive: passive::Passive::default(),
            hops: NextHops::default(),
            neighbours: loaded.neighbours,
            held: None,
            status_due: false,
            recheck_asked: false,
            vips: vips::Vips::default(),
            routes: routes::Routes::default(),
            ramps: ramps::Ramps::default(),
            maps_incomplete: false,
            maps_retry_at: now,
            recheck_at: now,
            refresh_at: now + NEIGHBOUR_REFRESH,
            now,
            effects: VecDeque::new(),
        };
        c.builder.set_locals(&c.locals);
        c.sync_checks(None);
        c.rebuild("start")?;
        // The first table is the caller's to install; only its VIPs are followed.
        c.effects.retain(|e| !matches!(e, Effect::Publish { .. }));
        log_table(&c.config, &c.table);
        Ok(c)
    }

    /// Handles `event` at `now`; the effects wait in [`Control::poll_effect`].
    ///
    /// # Errors
    /// A refused reload, or a table that does not build: the running table stays.
    pub fn handle(&mut self, now: Instant, event: Event) -> Result<(), Error> {
        let r = self.step(now, event);
        if self.held.is_none() {
            self.flush_status();
        }
        r
    }

    fn step(&mut self, now: Instant, event: Event) -> Result<(), Error> {
        self.now = now;
        // The held update first, so that inputs change in the order they came. Should its
        // table not build, the event is still handled (and builds the table whole).
        if matches!(
            event,
            Event::Reload(_) | Event::Health(_) | Event::Passive(_)
        ) {
            if let Err(e) = self.complete_held() {
                warn!("{e}");
            }
        }
        match event {
            Event::Reload(loaded) => self.reload(loaded),
            Event::Kube(publications) => self.kube_changed(publications),
            Event::Health(reports) => self.health(reports),
            Event::Passive(reports) => self.passive_failures(reports),
            Event::Neighbours(read) => self.neighbours(read),
            Event::Maps { complete } => {
                if complete && self.maps_incomplete {
                    info!(generation = self.table.generation, "steering maps complete");
                }
                if !complete && !self.maps_incomplete {
                    warn!(
                        generation = self.table.generation,
                        "table live, but its steering maps are incomplete (retried every second)"
                    );
                    self.maps_retry_at = now + MAPS_RETRY;
                }
                self.maps_incomplete = !complete;
                Ok(())
            }
            Event::Forwarding => {
                let all = self.vips.start();
                if !all.is_empty() {
                    self.effects.push_back(Effect::ClaimVips(all));
                }
                self.refresh_routes();
                Ok(())
            }
            Event::Drain => {
                if !self.routes.draining() {
                    info!("draining: withdrawing every route");
                    self.routes.drain();
                    self.refresh_routes();
                }
                Ok(())
            }
            Event::Tick => self.tick(now),
        }
    }

    /// The next effect, in order.
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// When the core wants an [`Event::Tick`]: `None` while it waits for nothing.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let maps = self.maps_incomplete.then_some(self.maps_retry_at);
        let hops = self.hops.watching().then_some(self.recheck_at);
        maps.into_iter().chain(hops).chain(self.ramps.next()).min()
    }

    /// Takes back a table replaced by an [`Effect::Publish`] once the workers and the
    /// steering maps have let go of it: the next update copies into its memory
    /// ([`Builder::recycle`]).
    pub fn recycle(&mut self, old: Arc<ServiceTable>) {
        self.builder.recycle(old);
    }

    /// The table last published.
    pub fn table(&self) -> &Arc<ServiceTable> {
        &self.table
    }

    /// The running configuration: the file's with the Kubernetes services merged in, less
    /// the next-hop MACs taken from the kernel.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The configuration file's configuration.
    pub fn file(&self) -> &Arc<Config> {
        &self.file
    }

    /// The last Kubernetes list.
    pub fn kube(&self) -> &Arc<Vec<Arc<Service>>> {
        &self.kube
    }

    /// Whether `backend` was reported down (and is still checked the same way).
    pub fn is_down(&self, backend: &BackendKey) -> bool {
        self.health
            .is_down(&backend.service, backend.address, backend.port)
    }

    /// Whether passive health took `backend` out of new flows, and why.
    pub fn passive_out(&self, backend: &BackendKey) -> Option<&passive::Out> {
        self.passive.out(backend)
    }

    /// The health checks wanted, by backend.
    pub fn checks(&self) -> impl Iterator<Item = (BackendKey, &HealthCheck)> + '_ {
        self.health.iter()
    }

    /// The VIPs claimed: those of the published table's services, once forwarding.
    pub fn claimed(&self) -> BTreeSet<IpAddr> {
        self.vips.claimed()
    }

    /// Every published VIP's route: announced, or why not.
    pub fn routes(&self) -> &Arc<RouteMap> {
        self.routes.view()
    }

    /// The BGP attributes of the VIPs' routes.
    pub fn route_attrs(&self) -> &Arc<RouteAttrMap> {
        self.routes.attrs()
    }

    /// Whether the gateway drains.
    pub fn draining(&self) -> bool {
        self.routes.draining()
    }

    /// The backends ramping to their weight (slow start).
    pub fn ramps(&self) -> &ramps::Ramps {
        &self.ramps
    }

    /// The next hops taken from the kernel.
    pub fn next_hops(&self) -> &NextHops {
        &self.hops
    }

    /// Whether a table update waits for a neighbour read.
    pub fn holding(&self) -> bool {
        self.held.is_some()
    }

    /// Whether the builder keeps a replaced table for the next update (a diagnostic, see
    /// [`Builder::has_spare`]).
    pub fn has_spare(&self) -> bool {
        self.builder.has_spare()
    }

    fn reload(&mut self, loaded: Result<Box<Loaded>, String>) -> Result<(), Error> {
        let loaded = *loaded.map_err(|problems| Error::Invalid { problems })?;
        if loaded.config.gateway.interfaces != self.file.gateway.interfaces {
            return Err(Error::InterfacesChanged);
        }
        if loaded.config.gateway.bgp != self.file.gateway.bgp {
            return Err(Error::BgpChanged);
        }
        if let Some(what) = start_only_change(&loaded.config.gateway, &self.file.gateway) {
            return Err(Error::RestartNeeded(what));
        }
        let (merged, dropped) = crate::kubemodel::merge(&loaded.config, &self.kube);
        for d in dropped {
            warn!("{d}");
        }
        // Built before anything is committed, so that a refusal leaves all as it was.
        let wanted = checks::wanted(&merged.services);
        let health = &self.health;
        let down = |s: &str, a: IpAddr, p: u16| health.stays_down(&wanted, s, a, p);
        let mut filled = merged.clone();
        let mut hops = NextHops::default();
        let probes = hops.fill(&mut filled.services, &loaded.neighbours);
        // Backends out by passive health stay out while they are checked (a changed check
        // goes on from their health, and its first pass brings them back).
        self.passive.apply(&mut filled.services, |k| {
            wanted
                .get(&k.service)
                .is_some_and(|m| m.contains_key(&(k.address, k.port)))
        });
        // On a copy, committed with the table.
        let mut ramps = self.ramps.clone();
        ramps.retain_services(&filled.services);
        let mut index = None;
        for s in &mut filled.services {
            ramps.apply(s, &self.table, &mut index, down, self.now);
        }
        self.builder.set_locals(&loaded.locals);
        let table = match self.builder.build(&filled, &self.ports, down) {
            Ok(t) => t,
            Err(source) => {
                // The running table stays, and so do the addresses it was built with.
                self.builder.set_locals(&self.locals);
                return Err(Error::Table {
                    why: "reload",
                    source,
                });
            }
        };
        self.file = Arc::new(loaded.config);
        self.config = merged;
        self.locals = loaded.locals;
        self.neighbours = loaded.neighbours;
        self.hops = hops;
        self.ramps = ramps;
        self.sync_checks(None);
        self.status_due = true;
        info!(
            generation = table.generation,
            "table rebuilt: configuration reloaded"
        );
        self.probe_unresolved(probes);
        self.publish(table, Changed::All);
        log_table(&self.config, &self.table);
        Ok(())
    }

    fn kube_changed(&mut self, mut publications: Vec<Publication>) -> Result<(), Error> {
        let Some(list) = publications
            .last_mut()
            .map(|p| std::mem::take(&mut p.services))
        else {
            return Ok(());
        };
        let changes: Vec<crate::kubemodel::Change> =
            publications.into_iter().flat_map(|p| p.changes).collect();
        let applied = merge::apply(&mut self.config, &self.file, &list, &changes);
        self.kube = Arc::new(list);
        self.status_due = true;
        if applied.bulk {
            self.sync_checks(None);
        } else {
            self.sync_checks(Some(&applied.names));
        }
        let file_len = self.file.services.len();
        let mut targets: Vec<(IpAddr, bool)> = applied
            .names
            .iter()
            .filter_map(|n| merge::find(&self.config, file_len, n))
            .flat_map(hops::targets)
            .collect();
        if !targets.is_empty() || self.held.is_some() {
            // While an update is held, a driver's read is outstanding: the services that join
            // it are filled from what the core knows when its answer comes.
            if self.held.is_none() {
                targets.sort();
                targets.dedup();
                self.effects
                    .push_back(Effect::ReadNeighbours(Scope::Targets(targets)));
            }
            self.held
                .get_or_insert_with(BTreeSet::new)
                .extend(applied.names);
            return Ok(());
        }
        self.update(applied.names, Fill::Read, "kubernetes services changed")
    }

    /// Completes the held update with what the core knows of the neighbour table.
    fn complete_held(&mut self) -> Result<(), Error> {
        let Some(names) = self.held.take() else {
            return Ok(());
        };
        self.update(
            names.into_iter().collect(),
            Fill::Read,
            "kubernetes services changed",
        )
    }

    fn neighbours(&mut self, read: Neighbours) -> Result<(), Error> {
        self.neighbours.update(read);
        // A read asked for only to complete a held update fills the changed services; the
        // check of every followed next hop (a walk over all of them) waits for the timer's.
        let recheck = std::mem::take(&mut self.recheck_asked) || self.held.is_none();
        if let Some(names) = self.held.take() {
            self.update(
                names.into_iter().collect(),
                Fill::Read,
                "kubernetes services changed",
            )?;
        }
        if !recheck || !self.hops.watching() {
            return Ok(());
        }
        match self.hops.recheck(&self.neighbours) {
            Some(why) => {
                info!("{why}");
                self.rebuild("next hops changed")
            }
            None => Ok(()),
        }
    }

    fn health(&mut self, reports: Vec<(BackendKey, bool)>) -> Result<(), Error> {
        let mut names = BTreeSet::new();
        for (backend, up) in reports {
            if up && self.passive.back(&backend) {
                info!(service = %backend.service, backend = %std::net::SocketAddr::new(backend.address, backend.port), "passive health: back, its active check passed");
                names.insert(backend.service.clone());
            }
            if self.health.report(&backend, up) {
                let BackendKey {
                    service,
                    address,
                    port,
                } = backend;
                info!(service = %service, backend = %std::net::SocketAddr::new(address, port), up, "health changed");
                names.insert(service);
            }
        }
        if names.is_empty() {
            return Ok(());
        }
        self.update(names.into_iter().collect(), Fill::Live, "health changed")
    }

    /// Failed connection attempts the workers saw: takes the backends that reach their
    /// service's `passive_health` out of new flows ([`passive`]). Attempts on a backend of a
    /// service without passive health, or without an active check, are not counted.
    fn passive_failures(
        &mut self,
        reports: Vec<(BackendKey, strait_dataplane::passive::Failure, u64)>,
    ) -> Result<(), Error> {
        let file_len = self.file.services.len();
        let mut names = BTreeSet::new();
        for (backend, cause, n) in reports {
            let Some(s) = merge::find(&self.config, file_len, &backend.service) else {
                continue;
            };
            let Some(ph) = s.passive_health else {
                continue;
            };
            let checked = self
                .health
                .check_of(&backend.service, backend.address, backend.port)
                .is_some();
            if checked
                && self
                    .passive
                    .failed(&backend, cause, n, self.now, ph, s.backends.len())
            {
                info!(
                    service = %backend.service,
                    backend = %std::net::SocketAddr::new(backend.address, backend.port),
                    cause = cause.as_str(),
                    "passive health: {} failed connection attempts within {}: no new flows until its active check passes",
                    ph.failures,
                    humantime::format_duration(ph.window)
                );
                self.effects.push_back(Effect::PassiveOut {
                    backend: backend.clone(),
                    cause,
                    failures: ph.failures,
                    window: ph.window,
                });
                names.insert(backend.service);
            }
        }
        if names.is_empty() {
            return Ok(());
        }
        self.update(names.into_iter().collect(), Fill::Live, "passive health")
    }

    fn tick(&mut self, now: Instant) -> Result<(), Error> {
        if self.maps_incomplete && now >= self.maps_retry_at {
            self.maps_retry_at = now + MAPS_RETRY;
            self.effects.push_back(Effect::RetryMaps);
        }
        if self.hops.watching() && now >= self.recheck_at {
            self.recheck_at = now + NEIGHBOUR_RECHECK;
            if now >= self.refresh_at {
                self.refresh_at = now + NEIGHBOUR_REFRESH;
                let hops = self.hops.refresh();
                self.probe(hops);
            }
            self.recheck_asked = true;
            self.effects.push_back(Effect::ReadNeighbours(Scope::All));
        }
        // A held service takes its ramp's weight when its update completes.
        let held = self.held.as_ref();
        let due: Vec<String> = self
            .ramps
            .due(now)
            .into_iter()
            .filter(|n| held.is_none_or(|h| !h.contains(n)))
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        self.update(due, Fill::Live, "slow start")
    }

    /// Updates the table for the services named in `names` (set or removed) from the live
    /// one, or builds it whole when the builder refuses.
    fn update(&mut self, names: Vec<String>, fill: Fill, why: &'static str) -> Result<(), Error> {
        let file_len = self.file.services.len();
        let mut set: Vec<Service> = names
            .iter()
            .filter_map(|n| merge::find(&self.config, file_len, n).cloned())
            .collect();
        for n in &names {
            if !set.iter().any(|s| &s.name == n) {
                self.ramps.forget(n);
            }
        }
        match fill {
            Fill::Read => {
                for n in &names {
                    self.hops.forget(n);
                }
                let probes = self.hops.fill(&mut set, &self.neighbours);
                self.probe_unresolved(probes);
            }
            Fill::Live => {
                for s in &mut set {
                    live_macs(&self.table, s);
                }
            }
        }
        self.passive.apply(&mut set, |_| true);
        let mut index = None;
        let health = &self.health;
        for s in &mut set {
            self.ramps.apply(
                s,
                &self.table,
                &mut index,
                |n, a, p| health.is_down(n, a, p),
                self.now,
            );
        }
        let by_name: HashMap<&str, &Service> = set.iter().map(|s| (s.name.as_str(), s)).collect();
        let changes: Vec<Change<'_>> = names
            .iter()
            .map(|n| match by_name.get(n.as_str()) {
                Some(s) => Change::Set(s),
                None => Change::Remove(n),
            })
            .collect();
        let health = &self.health;
        let updated = self
            .builder
            .update(&self.table, &changes, |s, a, p| health.is_down(s, a, p));
        match updated {
            Ok(table) => {
                info!(
                    generation = table.generation,
                    services = changes.len(),
                    "table updated: {why}"
                );
                drop(changes);
                self.publish(table, Changed::Services(names));
                Ok(())
            }
            Err(e) => {
                info!("table update refused ({e}); rebuilding it whole");
                self.rebuild(why)
            }
        }
    }

    /// Builds the table whole from the running configuration, the health states and the
    /// last neighbour read, and publishes it.
    fn rebuild(&mut self, why: &'static str) -> Result<(), Error> {
        self.held = None;
        let mut cfg = self.config.clone();
        self.hops.clear();
        let probes = self.hops.fill(&mut cfg.services, &self.neighbours);
        self.passive.apply(&mut cfg.services, |_| true);
        self.ramps.retain_services(&cfg.services);
        let mut index = None;
        let health = &self.health;
        for s in &mut cfg.services {
            self.ramps.apply(
                s,
                &self.table,
                &mut index,
                |n, a, p| health.is_down(n, a, p),
                self.now,
            );
        }
        let table = self
            .builder
            .build(&cfg, &self.ports, |s, a, p| health.is_down(s, a, p))
            .map_err(|source| Error::Table { why, source })?;
        info!(generation = table.generation, "table rebuilt: {why}");
        self.probe_unresolved(probes);
        self.publish(table, Changed::All);
        Ok(())
    }

    /// Publishes `table`, then claims and releases the VIPs that came and went with it.
    fn publish(&mut self, table: ServiceTable, changed: Changed) {
        let table = Arc::new(table);
        self.table = Arc::clone(&table);
        let file_len = self.file.services.len();
        let (claim, release) = self.vips.follow(&changed, &self.config, file_len);
        let routed = self
            .routes
            .follow(&changed, &self.config, file_len, &table, &self.vips);
        self.effects.push_back(Effect::Publish { table, changed });
        if !claim.is_empty() {
            self.effects.push_back(Effect::ClaimVips(claim));
        }
        if !release.is_empty() {
            self.effects.push_back(Effect::ReleaseVips(release));
        }
        if routed {
            self.effects
                .push_back(Effect::Routes(Arc::clone(self.routes.view())));
        }
        self.flush_status();
    }

    /// Re-derives every route and says so when one changed.
    fn refresh_routes(&mut self) {
        if self.routes.refresh_all(&self.vips, &self.config) {
            self.effects
                .push_back(Effect::Routes(Arc::clone(self.routes.view())));
        }
    }

    /// Says what the admin API shows, when it changed: after the table and the VIPs, so
    /// that the admin API never shows a service before it forwards.
    fn flush_status(&mut self) {
        if std::mem::take(&mut self.status_due) {
            self.status();
        }
    }

    /// Asks for probes of next hops a fill left unresolved, and a read soon after.
    fn probe_unresolved(&mut self, hops: Vec<IpAddr>) {
        if hops.is_empty() {
            return;
        }
        // Soon, but not later than already due: a stream of changes that each probe must
        // not keep pushing the read away.
        let soon = self.now + PROBE_ANSWER;
        if self.recheck_at < self.now || self.recheck_at > soon {
            self.recheck_at = soon;
        }
        self.probe(hops);
    }

    fn probe(&mut self, hops: Vec<IpAddr>) {
        if !hops.is_empty() {
            self.effects.push_back(Effect::Probe {
                hops,
                ifindex: self.hops.ifindex(),
            });
        }
    }

    fn status(&mut self) {
        self.effects.push_back(Effect::Status {
            file: Arc::clone(&self.file),
            kube: Arc::clone(&self.kube),
        });
    }

    /// Makes the health checks of the services named in `scope` (all when `None`) those
    /// the running configuration wants: stops, changes and starts checks, and forgets the
    /// health of backends whose check stopped.
    fn sync_checks(&mut self, scope: Option<&[String]>) {
        let file_len = self.file.services.len();
        let names: BTreeSet<String> = match scope {
            Some(names) => names.iter().cloned().collect(),
            None => self
                .health
                .services()
                .cloned()
                .chain(self.config.services.iter().map(|s| s.name.clone()))
                .collect(),
        };
        for name in names {
            let want = merge::find(&self.config, file_len, &name)
                .and_then(|s| checks::wanted(std::slice::from_ref(s)).remove(&name))
                .unwrap_or_default();
            // A check that stops forgets what passive health decided: nothing would report
            // the pass that brings the backend back. A changed check keeps it (the checker
            // keeps its hold, and the new check's first pass ends it).
            self.passive
                .retain(&name, |a, p| want.contains_key(&(a, p)));
            self.health.sync(&name, want, &mut self.effects);
        }
    }
}

/// How an update gives the changed services their next-hop MACs.
enum Fill {
    /// From the neighbour table as the core knows it, following the services' next hops
    /// anew.
    Read,
    /// From the live table: the services' backends did not change, only their health.
    Live,
}

/// Gives the backends of `s` without a configured MAC the one `table` has for them.
fn live_macs(table: &ServiceTable, s: &mut Service) {
    let Some(live) = table.services.iter().find(|t| t.name == s.name) else {
        return;
    };
    let macs: HashMap<std::net::SocketAddr, MacAddr> = live
        .backends
        .iter()
        .filter_map(|&id| table.backend(id))
        .filter_map(|b| Some((b.socket_addr(), b.mac_addr()?)))
        .collect();
    for b in s.backends.iter_mut().filter(|b| b.mac.is_none()) {
        // The table's addresses are canonical (an IPv4-mapped one is IPv4).
        let key = std::net::SocketAddr::new(b.address.to_canonical(), b.port);
        b.mac = macs.get(&key).copied();
    }
}

fn log_table(cfg: &Config, table: &ServiceTable) {
    info!(
        generation = table.generation,
        services = table.services.len(),
        "serving"
    );
    for line in strait_config::summary(cfg).lines() {
        info!("{line}");
    }
}

/// The first setting of `[gateway]` (besides the interfaces and BGP, which have errors of
/// their own) that `new` changes from `old` and that is read only at start: the admin API's
/// listeners and token, the flow tables' size and new-flow rate, the ports' MTU, VRRP, flow
/// sync and DPDK's EAL. A reload that changes one is refused rather than taken in part.
/// Every field is named here, so that a new one is sorted into read-at-start or reloadable
/// before the code compiles.
fn start_only_change(
    new: &strait_config::model::Gateway,
    old: &strait_config::model::Gateway,
) -> Option<&'static str> {
    let strait_config::model::Gateway {
        admin_listen,
        admin_socket,
        admin_token_file,
        flow_capacity_per_core,
        new_flows_per_second_per_core,
        mtu,
        l2,
        sync,
        dpdk,
        // Checked by the reload itself, with their own errors.
        interfaces: _,
        bgp: _,
        // Taken by a reload: they reach the table (and its flow tables) or the drain.
        default_mode: _,
        gue_port: _,
        tunnel_source_v4: _,
        tunnel_source_v6: _,
        timeouts: _,
        drain_grace: _,
    } = new;
    [
        (*admin_listen != old.admin_listen, "admin_listen"),
        (*admin_socket != old.admin_socket, "admin_socket"),
        (
            *admin_token_file != old.admin_token_file,
            "admin_token_file",
        ),
        (
            *flow_capacity_per_core != old.flow_capacity_per_core,
            "flow_capacity_per_core",
        ),
        (
            *new_flows_per_second_per_core != old.new_flows_per_second_per_core,
            "new_flows_per_second_per_core",
        ),
        (*mtu != old.mtu, "mtu"),
        (*l2 != old.l2, "l2"),
        (*sync != old.sync, "sync"),
        (*dpdk != old.dpdk, "dpdk"),
    ]
    .into_iter()
    .find_map(|(changed, what)| changed.then_some(what))
}

#[cfg(test)]
pub(crate) mod tests;
