//! `strait run`: the control core's driver.
//!
//! ```text
//!  config file, SIGHUP, POST /reload ─┐                     ┌─► ArcSwap<ServiceTable> ◄─ workers
//!  Kubernetes feed (mpsc) ────────────┤   Event             │   + SteerProgram::update_maps
//!  health checker (mpsc) ─────────────┼──────► core::Control ┼─► Checker::start / stop
//!  neighbour reads (rtnetlink) ───────┤   (now passed in)    ├─► VipAddresses::claim / release
//!  SIGTERM, POST /drain ──────────────┤                      ├─► bgp::Speaker::announce
//!  the clock (poll_timeout) ──────────┘          Effect      └─► neigh::probe, neigh reads
//! ```
//!
//! [`Driver`] turns the world into [`Event`]s for the core ([`crate::core`]) and carries
//! out the [`Effect`]s it returns, in order; it decides nothing. Everything it does is I/O:
//! reading the file and the interfaces ([`source`]), the atomic swap, the steering maps,
//! the health-check threads, `ip` for the VIPs, netlink reads and probes.

pub mod source;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use strait_config::model::Config;
use strait_dataplane::table::{Port, ServiceTable};
use tracing::{info, warn};

use crate::admin::{self, Request};
use crate::bgp::Speaker;
use crate::core::{BackendKey, Control, Effect, Event};
use crate::footprint::Footprint;
use crate::health::Checker;
use crate::l2::Vrrp;
use crate::shared::{Shared, Sources};
use crate::vip::VipAddresses;
use crate::workers::{self, Workers};

pub use source::{interface_addrs, port_of, ConfigSource};

/// The longest the loop waits for an input: the stop and SIGHUP flags are looked at this
/// often, which bounds how long a signal waits.
const IDLE: Duration = Duration::from_millis(100);

/// The gateway's control side: the core and the world it drives.
pub struct Driver {
    source: ConfigSource,
    core: Control,
    checker: Checker,
    /// Health-state changes from the checker's threads.
    changes: Receiver<BackendKey>,
    /// State the admin API and the workers read.
    pub shared: Arc<Shared>,
    vips: Option<VipAddresses>,
    workers: Option<Workers>,
    /// The Kubernetes source's publications, when `--kube` is given.
    kube: Option<Receiver<crate::kubemodel::Publication>>,
    /// The BGP speaker, when `[gateway.bgp]` is configured.
    speaker: Option<Speaker>,
    /// The VRRP side, when `[gateway.l2]` is configured.
    vrrp: Option<Vrrp>,
    /// The DPDK ports (opened at start: their TAPs are the interfaces the table reads),
    /// until the workers take them.
    dpdk: Option<crate::dpdk::Ports>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Driver {
    /// Loads the configuration, checks the interfaces, builds the first table and starts the
    /// health checks. Workers start separately ([`Driver::start_workers`]).
    ///
    /// # Errors
    /// A configuration that does not validate, or an interface that does not exist.
    pub fn start(source: ConfigSource) -> anyhow::Result<Self> {
        let cfg = source.load()?;
        source::check_tunnel_sources(&cfg)?;
        // Refused before anything is allocated: a configuration beyond the machine would
        // otherwise fail (or be killed) half-way through allocating its flow tables.
        let footprint = Footprint::of(&cfg);
        if let Some(memory) = crate::footprint::machine_memory() {
            footprint.fits(memory)?;
        }
        info!("memory: {footprint}");
        // Before the interfaces are read: a DPDK port's TAP is its interface.
        let dpdk = crate::dpdk::open(&cfg)?;
        let ports = cfg
            .gateway
            .interfaces
            .iter()
            .map(|i| port_of(&i.name))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut g = Self::with_ports(source, cfg, ports)?;
        g.dpdk = dpdk;
        Ok(g)
    }

    /// The state [`Driver::start`] makes once the interfaces are known: the core with its
    /// first table, the health checks and the shared state, with no workers and no VIPs.
    /// Also what `strait-lab bench control` drives, so that it measures the gateway's own
    /// per-change path.
    ///
    /// # Errors
    /// When the first table does not build.
    pub fn with_ports(source: ConfigSource, cfg: Config, ports: Vec<Port>) -> anyhow::Result<Self> {
        let (tx, changes) = mpsc::channel();
        let checker = Checker::new(tx);
        let core = Control::new(Instant::now(), source::loaded(cfg), ports)?;
        let cores = workers::slots(core.file());
        let shared = Arc::new(Shared::new(
            (**core.file()).clone(),
            Arc::clone(core.table()),
            checker.states(),
            cores,
        ));
        let mut g = Self {
            source,
            core,
            checker,
            changes,
            shared,
            vips: None,
            workers: None,
            kube: None,
            speaker: None,
            vrrp: None,
            dpdk: None,
        };
        g.execute();
        Ok(g)
    }

    /// The control core.
    pub fn core(&self) -> &Control {
        &self.core
    }

    /// Makes the gateway answer ARP/ND for its VIPs from now on (see [`crate::vip`]), and
    /// follow them across changes.
    ///
    /// # Errors
    /// When a VIP cannot be added.
    pub fn own_vips(&mut self) -> anyhow::Result<()> {
        // With `[gateway.l2]` keepalived puts each VIP on the gateway that owns it. With
        // `[gateway.bgp]` routers send traffic to the gateway's own address, so the kernel
        // need not own the VIPs; it must not, in fact: after a SIGKILL (XDP program left,
        // workers gone) it would answer the packets still on their way, until the routers
        // withdrew the route, with resets, where a kernel that does not own them drops them
        // and TCP retransmits to the gateway the routers moved to.
        let g = &self.core.file().gateway;
        if g.l2.is_none() && g.bgp.is_none() {
            self.vips = Some(VipAddresses::new(self.core.file(), None));
        }
        self.core.handle(Instant::now(), Event::Forwarding)?;
        while let Some(e) = self.core.poll_effect() {
            match e {
                Effect::ClaimVips(v) => {
                    if let Some(vips) = &mut self.vips {
                        vips.claim(&v)?;
                    }
                }
                e => self.apply(e),
            }
        }
        Ok(())
    }

    /// Starts the BGP speaker when `[gateway.bgp]` is configured (its sessions come up
    /// while the workers start, and it announces the VIPs the core marks announced), or
    /// the VRRP side when `[gateway.l2]` is.
    ///
    /// # Errors
    /// When the daemon is not installed.
    pub fn start_speaker(&mut self) -> anyhow::Result<()> {
        if let Some(l2) = self.core.file().gateway.l2.clone() {
            let iface = crate::vip::client_interface(self.core.file());
            let vrrp = Vrrp::start(l2, iface)?;
            *self
                .shared
                .l2
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(vrrp.status_handle());
            vrrp.own(self.core.routes());
            self.vrrp = Some(vrrp);
        }
        let Some(bgp) = self.core.file().gateway.bgp.clone() else {
            return Ok(());
        };
        let speaker = Speaker::start(bgp)?;
        *self
            .shared
            .bgp
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(speaker.status_handle());
        speaker.announce(self.core.routes(), self.core.route_attrs());
        self.speaker = Some(speaker);
        Ok(())
    }

    /// Closes the BGP sessions (the routers drop every route at once) and stops the
    /// speaker.
    pub fn stop_speaker(&mut self) {
        if let Some(mut s) = self.speaker.take() {
            s.stop();
        }
        if let Some(mut v) = self.vrrp.take() {
            v.stop();
        }
    }

    /// Starts draining: every route is withdrawn, forwarding goes on, `/healthz` answers
    /// 503; a routing daemon that exits from now on is not started again.
    pub fn drain(&mut self) {
        self.shared.draining.store(true, Ordering::Relaxed);
        if let Some(s) = &self.speaker {
            s.drain();
        }
        if let Some(v) = &self.vrrp {
            v.drain();
        }
        if let Err(e) = self.handle(Event::Drain) {
            warn!("drain: {e}");
        }
    }

    /// Attaches the XDP programs and starts the AF_XDP workers, or starts the DPDK ports and
    /// their workers.
    ///
    /// # Errors
    /// As [`workers::start`].
    pub fn start_workers(&mut self) -> anyhow::Result<()> {
        let shared = &self.shared;
        let handles = workers::Handles {
            table: Arc::clone(&shared.table),
            cores: shared.cores.clone(),
            capture: Arc::clone(&shared.capture),
        };
        let (started, views) = workers::start(&shared.config(), &handles, self.dpdk.take())?;
        *shared.xdp.lock().unwrap_or_else(PoisonError::into_inner) = views.xdp;
        *shared.sync.lock().unwrap_or_else(PoisonError::into_inner) = views.sync;
        *shared.dpdk.lock().unwrap_or_else(PoisonError::into_inner) = views.dpdk;
        self.workers = Some(started);
        Ok(())
    }

    /// With flow sync, waits (at most [`crate::sync::DUMP_WAIT`]) until every peer gateway
    /// has sent its flow table, so that no route brings this gateway a flow it has not
    /// imported yet: a restart after a backend change moves no flow.
    pub fn wait_for_peers(&self) {
        let Some(w) = &self.workers else { return };
        let t = Instant::now();
        match w.wait_for_peers(crate::sync::DUMP_WAIT) {
            Some((got, of)) if got == of => {
                info!(peers = of, took = ?t.elapsed(), "flow sync: every peer's flows imported");
            }
            Some((got, of)) => warn!(
                answered = got,
                peers = of,
                "flow sync: not every peer sent its flows within {:?}; announcing anyway \
                 (they are asked again, and their new flows still arrive)",
                crate::sync::DUMP_WAIT
            ),
            None => {}
        }
    }

    /// Stops the workers and detaches the XDP programs.
    pub fn stop_workers(&mut self) {
        if let Some(w) = self.workers.take() {
            w.stop();
        }
    }

    /// Takes Kubernetes publications from `lists` from now on (see [`crate::kube`]).
    pub fn follow_kube(&mut self, lists: Receiver<crate::kubemodel::Publication>) {
        self.kube = Some(lists);
    }

    /// Hands `event` to the core now and carries out what it asks.
    ///
    /// # Errors
    /// The core's refusal; the running table stays.
    pub fn handle(&mut self, event: Event) -> Result<(), crate::core::Error> {
        let r = self.core.handle(Instant::now(), event);
        // A refused event may have asked for something before it was refused.
        self.execute();
        r
    }

    /// Re-reads the configuration; on success swaps in the new table atomically. A bad file
    /// leaves everything as it was.
    ///
    /// # Errors
    /// The problems of the new configuration.
    pub fn reload(&mut self) -> anyhow::Result<String> {
        let loaded = self
            .source
            .loaded()
            .map(Box::new)
            .map_err(|e| format!("{e:#}"));
        self.handle(Event::Reload(loaded))?;
        Ok(format!(
            "reloaded: {} services, generation {}",
            self.core.config().services.len(),
            self.core.table().generation
        ))
    }

    /// Carries out every effect the core has queued, and those their answers bring.
    fn execute(&mut self) {
        while let Some(e) = self.core.poll_effect() {
            self.apply(e);
        }
    }

    /// Carries out one effect; one that answers with an event hands it to the core (its
    /// effects queue behind the rest).
    fn apply(&mut self, effect: Effect) {
        match effect {
            Effect::Publish { table, changed: _ } => {
                let old = self.shared.table.swap(Arc::clone(&table));
                self.sync_maps(&table);
                drop(table);
                // The programs hold the table they follow until given the new one, and the
                // builder keeps only a table nobody holds: recycled last.
                self.core.recycle(old);
            }
            Effect::Status { file, kube } => {
                *self
                    .shared
                    .config
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Sources { file, kube };
            }
            Effect::StartCheck { backend, check } => self.checker.start(backend, check),
            Effect::StopCheck { backend } => self.checker.stop(&backend),
            Effect::PassiveOut {
                backend,
                cause,
                failures,
                window,
            } => self.checker.passive_out(
                &backend,
                cause.as_str(),
                format!(
                    "{failures} connection attempts {} within {}",
                    cause.as_str(),
                    humantime::format_duration(window)
                ),
            ),
            Effect::ClaimVips(v) => {
                if let Some(vips) = &mut self.vips {
                    if let Err(e) = vips.claim(&v) {
                        warn!("claiming VIPs: {e:#}");
                    }
                }
            }
            Effect::ReleaseVips(v) => {
                if let Some(vips) = &mut self.vips {
                    vips.release(&v);
                }
            }
            Effect::Routes(routes) => {
                if let Some(s) = &self.speaker {
                    s.announce(&routes, self.core.route_attrs());
                }
                if let Some(v) = &self.vrrp {
                    v.own(&routes);
                }
                *self
                    .shared
                    .routes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = routes;
            }
            Effect::Probe { hops, ifindex } => {
                for hop in hops {
                    crate::neigh::probe(hop, ifindex);
                }
            }
            Effect::ReadNeighbours(scope) => {
                let read = crate::neigh::backend_read(self.core.file(), &scope);
                self.answer(Event::Neighbours(read));
            }
            Effect::RetryMaps => {
                let table = self.shared.table.load_full();
                self.sync_maps(&table);
            }
        }
    }

    /// Hands the core an event that answers an effect.
    fn answer(&mut self, event: Event) {
        if let Err(e) = self.core.handle(Instant::now(), event) {
            warn!("rebuild failed, keeping the previous table: {e}");
        }
    }

    /// Brings every program's steering maps in line with `table`, and tells the core
    /// whether some keys are still pending. Every program's maps are updated even when one
    /// fails; a failed map call (a full map) does not undo the swap: the keys that failed
    /// stay pending in the program, and the core asks for retries ([`Effect::RetryMaps`]).
    fn sync_maps(&mut self, table: &Arc<ServiceTable>) {
        let Some(w) = &mut self.workers else {
            return;
        };
        let mut complete = true;
        // Each program's copy swap waits an RCU grace period: the interfaces wait together.
        let results: Vec<_> = match w.progs.as_mut_slice() {
            [prog] => vec![prog.update_maps(table)],
            progs => std::thread::scope(|s| {
                let updates: Vec<_> = progs
                    .iter_mut()
                    .map(|prog| s.spawn(move || prog.update_maps(table)))
                    .collect();
                updates
                    .into_iter()
                    .map(|u| u.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                    .collect()
            }),
        };
        for result in results {
            match result {
                Ok(sync) if sync.added + sync.removed > 0 => info!(
                    added = sync.added,
                    removed = sync.removed,
                    "steering maps updated"
                ),
                Ok(_) => {}
                Err(e) => {
                    if complete {
                        info!(
                            generation = table.generation,
                            "steering map update failed: {e}"
                        );
                    }
                    complete = false;
                }
            }
        }
        self.answer(Event::Maps { complete });
    }

    /// Runs until the gateway has drained: hands the core health changes, Kubernetes
    /// publications, requests and the passing of time as they come, and carries out its
    /// effects. `stop` set (SIGTERM, SIGINT) or `POST /drain` starts draining: every route
    /// is withdrawn, forwarding goes on for `drain_grace`, then this returns; `stop` set
    /// again while draining returns at once.
    pub fn serve(&mut self, stop: &AtomicBool, hup: &AtomicBool, requests: &Receiver<Request>) {
        let mut drained_at: Option<Instant> = None;
        let mut watchdog = crate::supervise::Watchdog::from_env();
        let mut trimmer = crate::heap::Trimmer::new();
        let mut generation = self.core.table().generation;
        let mut watcher = crate::passive::Watcher::new();
        let mut passive = self.passive_on();
        loop {
            // A new table freed the previous one: hand the freed pages back (crate::heap).
            if self.core.table().generation != generation {
                generation = self.core.table().generation;
                trimmer.rebuilt();
                passive = self.passive_on();
            }
            trimmer.tick(Instant::now());
            if let Some(w) = &mut watchdog {
                w.tick(&self.shared.cores, Instant::now());
            }
            if stop.swap(false, Ordering::Relaxed) {
                if drained_at.is_some() {
                    info!("stopped again while draining: stopping now");
                    return;
                }
                drained_at = Some(self.start_drain("signal"));
            }
            if drained_at.is_some_and(|at| Instant::now() >= at) {
                info!("drain grace over");
                return;
            }
            let idle = if passive { crate::passive::POLL } else { IDLE };
            let wait = self.core.poll_timeout().map_or(idle, |at| {
                at.saturating_duration_since(Instant::now()).min(idle)
            });
            match self.changes.recv_timeout(wait) {
                Ok(k) => {
                    // A burst of changes is one event (one table update); each backend's
                    // state is the checker's now, so a stale report tells the truth.
                    let keys: Vec<BackendKey> =
                        std::iter::once(k).chain(self.changes.try_iter()).collect();
                    let reports = keys
                        .into_iter()
                        .map(|k| {
                            let up = !self.checker.is_down(&k.service, k.address, k.port);
                            (k, up)
                        })
                        .collect();
                    if let Err(e) = self.handle(Event::Health(reports)) {
                        warn!("rebuild failed, keeping the previous table: {e}");
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            if passive {
                let failed = watcher.poll(&self.shared.cores, &self.shared.table.load());
                if !failed.is_empty() {
                    if let Err(e) = self.handle(Event::Passive(failed)) {
                        warn!("rebuild failed, keeping the previous table: {e}");
                    }
                }
            }
            if self
                .core
                .poll_timeout()
                .is_some_and(|at| at <= Instant::now())
            {
                if let Err(e) = self.handle(Event::Tick) {
                    warn!("rebuild failed, keeping the previous table: {e}");
                }
            }
            if hup.swap(false, Ordering::Relaxed) {
                match self.reload() {
                    Ok(m) => info!("SIGHUP: {m}"),
                    Err(e) => warn!("SIGHUP: reload refused, keeping the running table:\n{e:#}"),
                }
            }
            let lists: Vec<crate::kubemodel::Publication> = self
                .kube
                .as_ref()
                .map(|k| k.try_iter().collect())
                .unwrap_or_default();
            if !lists.is_empty() {
                match self.handle(Event::Kube(lists)) {
                    // The first publication is the cluster's first complete list: only
                    // now does the gateway serve the cluster's Services (`--kube`
                    // readiness; `run` leaves it to this).
                    Ok(()) => {
                        if !self.shared.ready.swap(true, Ordering::Relaxed) {
                            crate::supervise::ready("forwarding the cluster's services");
                        }
                    }
                    Err(e) => {
                        warn!("kubernetes: rebuild refused, keeping the running table:\n{e}");
                    }
                }
            }
            while let Ok(request) = requests.try_recv() {
                match request {
                    Request::Reload(answer) => {
                        let r = self.reload().map_err(|e| format!("{e:#}"));
                        match &r {
                            Ok(m) => info!("admin API: {m}"),
                            Err(e) => {
                                warn!("admin API: reload refused, keeping the running table:\n{e}")
                            }
                        }
                        let _ = answer.send(r);
                    }
                    Request::Drain(answer) => {
                        let at = *drained_at.get_or_insert_with(|| self.start_drain("admin API"));
                        let left = at.saturating_duration_since(Instant::now());
                        let _ = answer.send(Ok(format!(
                            "draining: routes withdrawn, forwarding for {} more, then stopping \
                             (pid {})",
                            humantime::format_duration(Duration::from_millis(
                                u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
                            )),
                            std::process::id()
                        )));
                    }
                }
            }
        }
    }

    /// Whether some service has passive health: then the loop polls the workers' samples
    /// every [`crate::passive::POLL`].
    fn passive_on(&self) -> bool {
        self.workers.is_some()
            && self
                .core
                .config()
                .services
                .iter()
                .any(|s| s.passive_health.is_some())
    }

    /// Starts draining for `why`; returns when the grace ends.
    fn start_drain(&mut self, why: &str) -> Instant {
        let grace = self.core.file().gateway.drain_grace;
        info!(
            "{why}: draining; routes withdrawn, forwarding for {} before stopping (signal again to stop now)",
            humantime::format_duration(grace)
        );
        self.drain();
        crate::supervise::stopping("draining: routes withdrawn");
        Instant::now() + grace
    }
}

/// Where the admin API listens, with the token read from `admin_token_file`.
///
/// # Errors
/// A token file that cannot be read, or holds fewer than 16 characters.
fn admin_options(g: &strait_config::model::Gateway) -> anyhow::Result<admin::Options> {
    let token = match &g.admin_token_file {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("gateway.admin_token_file: reading {}", path.display()))?;
            let token = text.trim().to_owned();
            if token.chars().count() < 16 || token.chars().any(char::is_whitespace) {
                anyhow::bail!(
                    "gateway.admin_token_file: {} holds no token of 16 characters or more without spaces",
                    path.display()
                );
            }
            Some(token)
        }
    };
    Ok(admin::Options {
        listen: g.admin_listen,
        socket: g.admin_socket.clone(),
        token,
    })
}

/// `strait run`.
///
/// # Errors
/// Missing privileges, a bad configuration, a missing interface, an admin address in use.
pub fn run(source: ConfigSource, kube: &crate::kube::Args) -> anyhow::Result<()> {
    // A clear error before any socket or BPF call fails with EPERM.
    if !nix::unistd::Uid::effective().is_root() {
        anyhow::bail!(
            "strait run needs root (CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF for AF_XDP and XDP)"
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let hup = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing signal handlers")?;
    }
    signal_hook::flag::register(signal_hook::consts::SIGHUP, Arc::clone(&hup))
        .context("installing SIGHUP")?;

    let mut gateway = Driver::start(source)?;
    let (request_tx, request_rx) = mpsc::channel::<Request>();
    let opts = admin_options(&gateway.core.file().gateway)?;
    let bound = admin::start_with(&opts, Arc::clone(&gateway.shared), request_tx)?;
    if let Some(p) = &opts.socket {
        info!("admin API on {}", p.display());
    }
    info!("admin API on http://{bound}");
    gateway.start_speaker()?;
    // Steering first, then the VIPs: once the kernel owns a VIP it would answer service
    // traffic itself (with resets) if the XDP program were not there yet to redirect it.
    gateway.start_workers()?;
    // Then the peers' flows, before any route brings this gateway traffic.
    gateway.wait_for_peers();
    gateway.own_vips()?;
    // Kept alive until `run` returns; dropping it stops the source's thread.
    let _kube_source = if kube.kube {
        let (tx, rx) = mpsc::channel();
        let settings = kube.settings(&gateway.core.file().gateway);
        let src = crate::kube::spawn_feed(kube.kubeconfig.as_deref(), settings, move |p| {
            let _ = tx.send(p);
        })?;
        gateway.follow_kube(rx);
        *gateway
            .shared
            .kube
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(src.stats());
        Some(src)
    } else {
        None
    };
    info!("forwarding");
    if !kube.kube {
        gateway.shared.ready.store(true, Ordering::Relaxed);
        crate::supervise::ready("forwarding");
    }
    gateway.serve(&stop, &hup, &request_rx);
    // The routes go first, so that routers stop sending before the workers do.
    gateway.stop_speaker();
    info!("stopping: draining workers, detaching XDP");
    gateway.stop_workers();
    Ok(())
}

#[cfg(test)]
mod tests;
