//! `strait run`: the gateway's control loop.
//!
//! ```text
//! config ─► checks (root, interfaces) ─► Builder::build ─► ArcSwap<ServiceTable> ◄─ workers
//!              ▲                                ▲
//!   SIGHUP / POST /reload              health-check state changes
//! ```
//!
//! The loop owns the configuration, the table builder (which keeps backend ids stable across
//! rebuilds, so established flows survive a reload) and the health checker. Every change
//! builds a complete new table and publishes it with one atomic swap; a configuration that
//! does not validate is refused and the running table stays.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use anyhow::{bail, Context};
use strait_config::model::{Config, Service};
use strait_dataplane::table::{Builder, Change, Port, ServiceTable};
use tracing::{info, warn};

use crate::admin::{self, Reload};
use crate::health::{self, Checker};
use crate::shared::Shared;
use crate::vip::Vips;
use crate::workers::{self, Workers};

/// Where the configuration comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// A file, re-read on reload.
    File(PathBuf),
    /// The built-in example (the testbed's default).
    Builtin,
}

impl Source {
    fn load(&self) -> anyhow::Result<Config> {
        let mut cfg = match self {
            Source::File(p) => {
                strait_config::load(p).map_err(|e| anyhow::anyhow!("{}:\n{e}", p.display()))?
            }
            Source::Builtin => strait_config::example(),
        };
        Control::default_tunnel_sources(&mut cfg);
        Ok(cfg)
    }
}

/// Reads an interface's MAC and MTU (`ip -j link show dev NAME`). Asks the kernel over
/// netlink rather than sysfs, whose view belongs to the mount namespace: a thread that
/// entered a network namespace with `setns` still sees the old namespace's `/sys/class/net`.
///
/// # Errors
/// When the interface does not exist in this network namespace.
pub fn port_of(name: &str) -> anyhow::Result<Port> {
    let out = std::process::Command::new("ip")
        .args(["-j", "link", "show", "dev", name])
        .output()
        .context("running `ip -j link show` (iproute2)")?;
    if !out.status.success() {
        bail!(
            "interface {name} not found in this network namespace (the testbed's gateway runs \
             inside it: `ip netns exec strait-gw strait run ...`): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("interface {name}: `ip -j link` output"))?;
    let link = &v[0];
    let mac_text = link["address"]
        .as_str()
        .with_context(|| format!("interface {name} has no link-layer address"))?;
    let mac: strait_config::model::MacAddr = mac_text
        .parse()
        .map_err(|e| anyhow::anyhow!("interface {name}: MAC {mac_text:?}: {e}"))?;
    let mtu = link["mtu"]
        .as_u64()
        .with_context(|| format!("interface {name}: no MTU"))?;
    // Loopback's 65536 does not fit; no Ethernet frame comes near it anyway.
    Ok(Port::new(mac.0, mtu.min(u64::from(u16::MAX)) as u16))
}

/// The global unicast addresses of an interface, primary first (`ip -j addr show`). Empty
/// when the interface has none or `ip` fails.
pub fn interface_addrs(iface: &str) -> Vec<std::net::IpAddr> {
    let Ok(out) = std::process::Command::new("ip")
        .args(["-j", "addr", "show", "dev", iface])
        .output()
    else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.as_array()
        .into_iter()
        .flatten()
        .flat_map(|link| link["addr_info"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["scope"] == "global")
        .filter_map(|a| a["local"].as_str()?.parse().ok())
        .collect()
}

/// Every address of the configured interfaces, in key form, for [`ServiceTable::locals`].
fn local_addrs(cfg: &Config) -> Vec<[u8; 16]> {
    cfg.gateway
        .interfaces
        .iter()
        .flat_map(|i| interface_addrs(&i.name))
        .map(strait_dataplane::key::addr_bytes)
        .collect()
}

/// The control loop's state.
pub struct Control {
    source: Source,
    builder: Builder,
    checker: Checker,
    ports: Vec<Port>,
    /// State the admin API and the workers read.
    pub shared: Arc<Shared>,
    changes: Receiver<health::Key>,
    vips: Option<Vips>,
    workers: Option<Workers>,
    /// Next hops taken from the kernel's neighbour table: unresolved ones, and the MACs
    /// the table holds for the others.
    hops: crate::neigh::NextHops,
    /// When the kernel's neighbour table was last looked at again.
    rechecked: std::time::Instant,
    /// When the next hops in use were last probed ([`crate::neigh::NextHops::refresh`]).
    refreshed: std::time::Instant,
    /// A steering-map update failed; its keys are retried every [`MAPS_RETRY`].
    maps_incomplete: bool,
    /// When pending steering-map keys were last tried again.
    maps_retried: std::time::Instant,
    /// The Kubernetes source's feed, when `--kube` is given.
    kube: Option<KubeFeed>,
}

/// Service lists from the Kubernetes source, the last one received, and the file's own
/// configuration they are merged into.
struct KubeFeed {
    lists: Receiver<crate::kube::Publication>,
    services: Vec<Arc<Service>>,
    file: Config,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Control {
    /// Fills unset tunnel sources from the backend-facing interface's own addresses, as the
    /// configuration documents: the outer source of encapsulated packets is an address of the
    /// gateway on the segment that carries them.
    fn default_tunnel_sources(cfg: &mut Config) {
        let Some(iface) = cfg
            .gateway
            .interfaces
            .iter()
            .find(|i| {
                matches!(
                    i.role,
                    strait_config::model::Role::Backend | strait_config::model::Role::Both
                )
            })
            .map(|i| i.name.clone())
        else {
            return;
        };
        let g = &mut cfg.gateway;
        if g.tunnel_source_v4.is_none() {
            g.tunnel_source_v4 = interface_addrs(&iface).into_iter().find_map(|a| match a {
                std::net::IpAddr::V4(v4) => Some(v4),
                _ => None,
            });
        }
        if g.tunnel_source_v6.is_none() {
            g.tunnel_source_v6 = interface_addrs(&iface).into_iter().find_map(|a| match a {
                std::net::IpAddr::V6(v6) if !v6.is_unicast_link_local() => Some(v6),
                _ => None,
            });
        }
    }

    /// Loads the configuration, checks the interfaces, builds the first table and starts the
    /// health checks. Workers start separately ([`Control::start_workers`]).
    ///
    /// # Errors
    /// A configuration that does not validate, or an interface that does not exist.
    pub fn start(source: Source) -> anyhow::Result<Self> {
        let cfg = source.load()?;
        for svc in cfg.services.iter().filter(|s| s.mode.is_tunnel()) {
            for b in &svc.backends {
                let missing = match b.tunnel_target() {
                    std::net::IpAddr::V4(_) => cfg.gateway.tunnel_source_v4.is_none(),
                    std::net::IpAddr::V6(_) => cfg.gateway.tunnel_source_v6.is_none(),
                };
                if missing {
                    bail!(
                        "service {}: {} encapsulates to {}, but the backend-facing interface has \
                         no address of that family to send from; set gateway.tunnel_source_v4 / \
                         tunnel_source_v6",
                        svc.name,
                        svc.mode,
                        b.tunnel_target()
                    );
                }
            }
        }
        let ports = cfg
            .gateway
            .interfaces
            .iter()
            .map(|i| port_of(&i.name))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Self::with_ports(source, cfg, ports)
    }

    /// The state [`Control::start`] makes once the interfaces are known: the checker, the
    /// builder, the first table and the shared state, with no workers and no VIPs. Also what
    /// `strait-lab bench control` drives, so that it measures the gateway's own per-change path.
    ///
    /// # Errors
    /// When the first table does not build.
    pub fn with_ports(source: Source, cfg: Config, ports: Vec<Port>) -> anyhow::Result<Self> {
        let (tx, changes) = mpsc::channel();
        let mut checker = Checker::new(tx);
        checker.sync(&cfg);
        let mut builder = Builder::new();
        let mut table_cfg = cfg.clone();
        let mut hops = crate::neigh::NextHops::default();
        hops.fill(&mut table_cfg.services, &crate::neigh::backend_table(&cfg));
        let mut table = builder.build(&table_cfg, &ports, |s, a, p| checker.is_down(s, a, p))?;
        table.locals = local_addrs(&cfg);
        log_table(&cfg, &table);
        let cores = workers::slots(&cfg);
        let shared = Arc::new(Shared::new(cfg, table, checker.states(), cores));
        Ok(Self {
            source,
            builder,
            checker,
            ports,
            shared,
            changes,
            vips: None,
            workers: None,
            hops,
            rechecked: std::time::Instant::now(),
            refreshed: std::time::Instant::now(),
            maps_incomplete: false,
            maps_retried: std::time::Instant::now(),
            kube: None,
        })
    }

    /// Makes the gateway answer ARP/ND for its VIPs from now on (see [`crate::vip`]), and
    /// follow them across reloads.
    ///
    /// # Errors
    /// When a VIP cannot be added.
    pub fn own_vips(&mut self) -> anyhow::Result<()> {
        let cfg = self.shared.config();
        let mut vips = Vips::new(&cfg, None);
        vips.sync(&cfg)?;
        self.vips = Some(vips);
        Ok(())
    }

    /// Attaches the XDP programs and starts the AF_XDP workers.
    ///
    /// # Errors
    /// As [`workers::start`].
    pub fn start_workers(&mut self) -> anyhow::Result<()> {
        self.workers = Some(workers::start(&self.shared.config(), &self.shared)?);
        Ok(())
    }

    /// Stops the workers and detaches the XDP programs.
    pub fn stop_workers(&mut self) {
        if let Some(w) = self.workers.take() {
            w.stop();
        }
    }

    /// Takes Kubernetes service lists from `lists` from now on (see [`crate::kube`]).
    pub fn follow_kube(&mut self, lists: Receiver<crate::kube::Publication>) {
        self.kube = Some(KubeFeed {
            lists,
            services: Vec::new(),
            file: self.shared.config(),
        });
    }

    /// `file` with the last Kubernetes services added.
    fn with_kube(&self, file: &Config) -> Config {
        let Some(k) = &self.kube else {
            return file.clone();
        };
        let (merged, dropped) = crate::kube::merge(file, &k.services);
        for d in dropped {
            warn!("{d}");
        }
        merged
    }

    /// Swaps in a new Kubernetes service list: the file's services plus these. The work is
    /// proportional to the change, not to the number of services: the merged configuration
    /// is edited in place, health checks and VIPs are brought in line for the changed
    /// services, and the table is updated for them only (see `Builder::update`).
    ///
    /// The merged configuration is the file's services, then the Kubernetes ones in the
    /// list's order (by name), less those [`crate::kube::merge`] leaves out: what a merge
    /// from scratch gives. A large change (the first list, a relist) is merged from scratch.
    pub fn apply_kube(
        &mut self,
        publications: Vec<crate::kube::Publication>,
    ) -> anyhow::Result<()> {
        let Some(k) = &mut self.kube else {
            return Ok(());
        };
        let Some(last) = publications.last() else {
            return Ok(());
        };
        k.services = last.services.clone();
        let changes: Vec<crate::kube::Change> =
            publications.into_iter().flat_map(|p| p.changes).collect();
        let merged: Vec<(&str, Option<&Service>)> =
            crate::kube::merge_changes(&k.file, &changes).collect();
        let changed: Vec<String> = merged.iter().map(|(n, _)| (*n).to_owned()).collect();
        let names: std::collections::HashSet<&str> = changed.iter().map(String::as_str).collect();
        let sorted = k.services.windows(2).all(|w| w[0].name < w[1].name);
        let file_len = k.file.services.len();
        let (mut before, mut after) = (BTreeSet::new(), BTreeSet::new());
        {
            let mut cfg = self
                .shared
                .config
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let bulk = !sorted || changes.len() > BULK.max(k.services.len() / 8);
            if bulk {
                let (whole, dropped) = crate::kube::merge(&k.file, &k.services);
                for d in dropped {
                    warn!("{d}");
                }
                *cfg = whole;
            } else {
                // The warnings a merge from scratch gives for the changed services.
                let set: Vec<&Service> = changes.iter().filter_map(|(_, s)| s.as_deref()).collect();
                let (_, dropped) = crate::kube::merge(&k.file, &set);
                for d in dropped {
                    warn!("{d}");
                }
                for name in &names {
                    if let Some(s) = find(&cfg, file_len, name) {
                        before.insert(s.vip);
                    }
                }
                for (name, s) in &merged {
                    let at = cfg.services[file_len..]
                        .binary_search_by(|x| x.name.as_str().cmp(name))
                        .map(|i| i + file_len)
                        .map_err(|i| i + file_len);
                    match (at, s) {
                        (Ok(i), Some(s)) => cfg.services[i] = (*s).clone(),
                        (Err(i), Some(s)) => cfg.services.insert(i, (*s).clone()),
                        (Ok(i), None) => {
                            cfg.services.remove(i);
                        }
                        (Err(_), None) => {}
                    }
                }
                for name in &names {
                    if let Some(s) = find(&cfg, file_len, name) {
                        after.insert(s.vip);
                    }
                }
            }
            if bulk {
                self.checker.sync(&cfg);
                if let Some(v) = &mut self.vips {
                    v.sync(&cfg)?;
                }
            } else {
                let current = names.iter().filter_map(|n| find(&cfg, file_len, n));
                self.checker.sync_named(current, &names);
                if let Some(v) = &mut self.vips {
                    v.sync_changed(&cfg, &before, &after)?;
                }
            }
        }
        self.republish_changed("kubernetes services changed", &changed)
    }

    /// As [`Control::republish`] after only the services named in `changed` were set or
    /// removed: the new table is made from the live one ([`Builder::update`]), or fully
    /// when that is refused. Next-hop MACs are filled for the changed services only, and
    /// the neighbour table read only when one of them lacks some.
    fn republish_changed(&mut self, why: &str, changed: &[String]) -> anyhow::Result<()> {
        let file_len = self.kube.as_ref().map_or(0, |k| k.file.services.len());
        let mut set: Vec<Service> = {
            let cfg = self
                .shared
                .config
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut names: Vec<&str> = changed.iter().map(String::as_str).collect();
            names.sort_unstable();
            names.dedup();
            names
                .into_iter()
                .filter_map(|n| find(&cfg, file_len, n).cloned())
                .collect()
        };
        let lacks = set
            .iter()
            .any(|s| s.backends.iter().any(|b| b.mac.is_none()));
        for n in changed {
            self.hops.forget(n);
        }
        let neighbours = if lacks {
            crate::neigh::backend_table(
                &self
                    .shared
                    .config
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            )
        } else {
            crate::neigh::Neighbours::default()
        };
        self.hops.fill(&mut set, &neighbours);
        let by_name: std::collections::HashMap<&str, &Service> =
            set.iter().map(|s| (s.name.as_str(), s)).collect();
        let changes: Vec<Change<'_>> = changed
            .iter()
            .map(|n| match by_name.get(n.as_str()) {
                Some(s) => Change::Set(s),
                None => Change::Remove(n),
            })
            .collect();
        let checker = &self.checker;
        let live = self.shared.table.load_full();
        let updated = self
            .builder
            .update(&live, &changes, |s, a, p| checker.is_down(s, a, p));
        // Let go of the live table before it is replaced: the builder reuses a replaced
        // table's memory only when nobody holds it (`Builder::recycle`).
        drop(live);
        match updated {
            Ok(table) => {
                info!(
                    generation = table.generation,
                    services = changes.len(),
                    "table updated: {why}"
                );
                self.publish(table)
            }
            Err(e) => {
                info!("table update refused ({e}); rebuilding it whole");
                self.republish(why)
            }
        }
    }

    /// Rebuilds the table from the current configuration and health, and publishes it.
    fn republish(&mut self, why: &str) -> anyhow::Result<()> {
        let cfg = self.table_config();
        let checker = &self.checker;
        let mut table = self
            .builder
            .build(&cfg, &self.ports, |s, a, p| checker.is_down(s, a, p))?;
        table.locals = local_addrs(&cfg);
        info!(generation = table.generation, "table rebuilt: {why}");
        self.publish(table)
    }

    /// Makes `table` the one the workers use, and brings the steering maps in line.
    ///
    /// Every program's maps are updated even when one fails. A failed map call (a full map)
    /// does not undo the swap: the table is live, the keys that failed stay pending in the
    /// program, and [`Control::serve`] retries them every second until they go in
    /// ([`Control::retry_maps`]). The old table goes back to the builder last: each program
    /// holds the table it follows until given the new one, and [`Builder::recycle`] keeps
    /// only a table nobody holds.
    fn publish(&mut self, table: ServiceTable) -> anyhow::Result<()> {
        let table = Arc::new(table);
        let old = self.shared.table.swap(Arc::clone(&table));
        self.sync_maps(&table);
        self.builder.recycle(old);
        Ok(())
    }

    /// Brings every program's steering maps in line with `table`; remembers whether some
    /// keys are still pending.
    fn sync_maps(&mut self, table: &Arc<ServiceTable>) {
        let Some(w) = &mut self.workers else {
            return;
        };
        let mut incomplete = false;
        for prog in &mut w.progs {
            match prog.update_maps(table) {
                Ok(sync) if sync.added + sync.removed > 0 => info!(
                    added = sync.added,
                    removed = sync.removed,
                    "steering maps updated"
                ),
                Ok(_) => {}
                Err(e) => {
                    // Said once, not at every retry.
                    if !self.maps_incomplete {
                        warn!(
                            generation = table.generation,
                            "table live, but its steering maps are incomplete (retried \
                             every second): {e}"
                        );
                    }
                    incomplete = true;
                }
            }
        }
        if self.maps_incomplete && !incomplete {
            info!(generation = table.generation, "steering maps complete");
        }
        self.maps_incomplete = incomplete;
    }

    /// Tries the steering-map keys a failed update left pending again, against the live
    /// table (for a table the programs already follow, only those keys are looked at).
    fn retry_maps(&mut self) {
        let table = self.shared.table.load_full();
        self.sync_maps(&table);
    }

    /// The configuration a table is built from: the current one, with next-hop MACs the
    /// configuration leaves out filled from the kernel's neighbour table (see [`crate::neigh`]).
    /// Unresolved next hops are probed and remembered, so [`Control::serve`] retries.
    fn table_config(&mut self) -> Config {
        let mut cfg = self.shared.config();
        let neighbours = crate::neigh::backend_table(&cfg);
        self.hops.clear();
        self.hops.fill(&mut cfg.services, &neighbours);
        cfg
    }

    /// Re-reads the configuration; on success swaps in the new table atomically. A bad file
    /// leaves everything as it was.
    ///
    /// # Errors
    /// The problems of the new configuration.
    pub fn reload(&mut self) -> anyhow::Result<String> {
        let file = self.source.load()?;
        let cfg = self.with_kube(&file);
        if cfg.gateway.interfaces != self.shared.config().gateway.interfaces {
            bail!("reload: interfaces changed; restart strait to change interfaces or queues");
        }
        self.checker.sync(&cfg);
        if let Some(v) = &mut self.vips {
            v.sync(&cfg)?;
        }
        *self
            .shared
            .config
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = cfg;
        if let Some(k) = &mut self.kube {
            k.file = file;
        }
        self.republish("configuration reloaded")?;
        let cfg = self.shared.config();
        Ok(format!(
            "reloaded: {} services, generation {}",
            cfg.services.len(),
            self.shared.table.load().generation
        ))
    }

    /// Runs until `stop` is set: applies health changes and reload requests as they come.
    pub fn serve(&mut self, stop: &AtomicBool, hup: &AtomicBool, reloads: &Receiver<Reload>) {
        while !stop.load(Ordering::Relaxed) {
            match self.changes.recv_timeout(Duration::from_millis(100)) {
                Ok(k) => {
                    let up = !self.checker.is_down(&k.0, k.1, k.2);
                    info!(service = %k.0, backend = %std::net::SocketAddr::new(k.1, k.2), up, "health changed");
                    // Coalesce a burst of changes into one rebuild.
                    while self.changes.try_recv().is_ok() {}
                    if let Err(e) = self.republish("health changed") {
                        warn!("rebuild failed, keeping the previous table: {e:#}");
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    if self.maps_incomplete && self.maps_retried.elapsed() >= MAPS_RETRY {
                        self.maps_retried = std::time::Instant::now();
                        self.retry_maps();
                    }
                    // Next hops from the kernel: look again every second (one netlink read),
                    // rebuild when a probed one resolved or a used one changed its MAC.
                    if self.hops.watching() && self.rechecked.elapsed() >= NEIGHBOUR_RECHECK {
                        self.rechecked = std::time::Instant::now();
                        let neighbours = crate::neigh::backend_table(
                            &self
                                .shared
                                .config
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner),
                        );
                        if self.refreshed.elapsed() >= NEIGHBOUR_REFRESH {
                            self.refreshed = std::time::Instant::now();
                            self.hops.refresh();
                        }
                        if let Some(why) = self.hops.recheck(&neighbours) {
                            info!("{why}");
                            if let Err(e) = self.republish(&why) {
                                warn!("rebuild failed, keeping the previous table: {e:#}");
                            }
                        }
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
            if hup.swap(false, Ordering::Relaxed) {
                match self.reload() {
                    Ok(m) => info!("SIGHUP: {m}"),
                    Err(e) => warn!("SIGHUP: reload refused, keeping the running table:\n{e:#}"),
                }
            }
            let lists: Vec<crate::kube::Publication> = self
                .kube
                .as_ref()
                .map(|k| k.lists.try_iter().collect())
                .unwrap_or_default();
            if !lists.is_empty() {
                if let Err(e) = self.apply_kube(lists) {
                    warn!("kubernetes: rebuild refused, keeping the running table:\n{e:#}");
                }
            }
            while let Ok(answer) = reloads.try_recv() {
                let r = self.reload().map_err(|e| format!("{e:#}"));
                match &r {
                    Ok(m) => info!("admin API: {m}"),
                    Err(e) => warn!("admin API: reload refused, keeping the running table:\n{e}"),
                }
                let _ = answer.send(r);
            }
        }
    }
}

/// How often the kernel's neighbour table is read again for next hops that resolved or
/// changed their MAC.
const NEIGHBOUR_RECHECK: Duration = Duration::from_secs(1);

/// How often steering-map keys a failed update left pending are tried again.
const MAPS_RETRY: Duration = Duration::from_secs(1);

/// How often the next hops in use are probed, so that the kernel keeps their entries true.
const NEIGHBOUR_REFRESH: Duration = Duration::from_secs(30);

/// Kubernetes changes up to this many (or an eighth of the services, when more) edit the
/// merged configuration in place; larger ones merge it from scratch.
const BULK: usize = 64;

/// The service named `name` in a merged configuration whose first `file_len` services are
/// the file's and the rest Kubernetes services sorted by name.
fn find<'a>(cfg: &'a Config, file_len: usize, name: &str) -> Option<&'a Service> {
    let (file, kube) = cfg.services.split_at(file_len.min(cfg.services.len()));
    file.iter().find(|s| s.name == name).or_else(|| {
        kube.binary_search_by(|s| s.name.as_str().cmp(name))
            .map(|i| &kube[i])
            .ok()
            // A list out of order (merged from scratch, see `apply_kube`).
            .or_else(|| kube.iter().find(|s| s.name == name))
    })
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

/// `strait run`.
///
/// # Errors
/// Missing privileges, a bad configuration, a missing interface, an admin address in use.
pub fn run(source: Source, kube: &crate::kube::Args) -> anyhow::Result<()> {
    // SAFETY-free check of the effective uid through /proc, to give a clear error before any
    // socket or BPF call fails with EPERM.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2));
    if euid != Some("0") {
        bail!("strait run needs root (CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF for AF_XDP and XDP)");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let hup = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing signal handlers")?;
    }
    signal_hook::flag::register(signal_hook::consts::SIGHUP, Arc::clone(&hup))
        .context("installing SIGHUP")?;

    let mut control = Control::start(source)?;
    let (reload_tx, reload_rx) = mpsc::channel::<Reload>();
    let admin_addr = control.shared.config().gateway.admin_listen;
    let bound = admin::start(admin_addr, Arc::clone(&control.shared), reload_tx)?;
    info!("admin API on http://{bound}");
    // Steering first, then the VIPs: once the kernel owns a VIP it would answer service
    // traffic itself (with resets) if the XDP program were not there yet to redirect it.
    control.start_workers()?;
    control.own_vips()?;
    // Kept alive until `run` returns; dropping it stops the source's thread.
    let _kube_source = if kube.kube {
        let (tx, rx) = mpsc::channel();
        let settings = kube.settings(&control.shared.config().gateway);
        let src = crate::kube::spawn_feed(kube.kubeconfig.as_deref(), settings, move |p| {
            let _ = tx.send(p);
        })?;
        control.follow_kube(rx);
        *control
            .shared
            .kube
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(src.stats());
        Some(src)
    } else {
        None
    };
    control.shared.ready.store(true, Ordering::Relaxed);
    info!("forwarding");
    control.serve(&stop, &hup, &reload_rx);
    info!("stopping: draining workers, detaching XDP");
    control.stop_workers();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(backends: &[&str]) -> String {
        let b: Vec<String> = backends
            .iter()
            .map(|a| format!("{{ address = \"{a}\", port = 80, mac = \"02:00:00:00:01:11\" }}"))
            .collect();
        format!(
            r#"
[gateway]
admin_listen = "127.0.0.1:0"
[[gateway.interfaces]]
name = "lo"
queues = [0]
[[services]]
name = "web"
vip = "203.0.113.10"
port = 80
maglev_table_size = 251
backends = [{}]
"#,
            b.join(", ")
        )
    }

    #[test]
    fn reload_swaps_good_configs_and_refuses_bad_ones() {
        let dir = std::env::temp_dir().join(format!("strait-run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("strait.toml");
        std::fs::write(&path, config(&["198.51.100.11"])).unwrap();
        let mut c = Control::start(Source::File(path.clone())).unwrap();
        assert_eq!(c.shared.table.load().generation, 1);
        let first_id = c.shared.table.load().services[0].backends[0];

        std::fs::write(&path, config(&["198.51.100.11", "198.51.100.12"])).unwrap();
        let m = c.reload().unwrap();
        assert!(m.contains("generation 2"), "{m}");
        let t = c.shared.table.load();
        assert_eq!(t.services[0].backends.len(), 2);
        assert_eq!(
            t.services[0].backends[0], first_id,
            "a kept backend keeps its id"
        );

        std::fs::write(&path, "[gateway]\nmtu = 1\n").unwrap();
        let e = c.reload().unwrap_err().to_string();
        assert!(e.contains("gateway.mtu"), "{e}");
        assert_eq!(
            c.shared.table.load().generation,
            2,
            "a refused reload keeps the table"
        );
        assert_eq!(c.shared.config().services[0].backends.len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn kubernetes_changes_update_the_table_in_place() {
        use crate::kube::Publication;
        let dir = std::env::temp_dir().join(format!("strait-run-kube-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("strait.toml");
        std::fs::write(&path, config(&["198.51.100.11"])).unwrap();
        let mut c = Control::start(Source::File(path)).unwrap();
        let (_tx, rx) = mpsc::channel();
        c.follow_kube(rx);
        let web = c.shared.config().services[0].clone();
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
        c.apply_kube(vec![Publication {
            services: first.clone(),
            changes: first.iter().map(set).collect(),
        }])
        .unwrap();
        let t1 = c.shared.table.load_full();
        let names = |t: &ServiceTable| {
            let mut v: Vec<String> = t.services.iter().map(|s| s.name.clone()).collect();
            v.sort();
            v
        };
        assert_eq!(names(&t1), ["default/a", "web"]);
        let file = c.kube.as_ref().unwrap().file.clone();
        assert_eq!(
            c.shared.config(),
            crate::kube::merge(&file, &first).0,
            "edited in place, the configuration is what a merge from scratch gives"
        );
        assert_eq!(t1.generation, 2);
        let web_backend = |t: &ServiceTable| {
            let s = t.services.iter().find(|s| s.name == "web").unwrap();
            t.backend(s.backends[0]).unwrap().addr
        };
        assert_eq!(
            web_backend(&t1),
            strait_dataplane::key::addr_bytes("198.51.100.11".parse().unwrap()),
            "the file's web stays"
        );
        // Two publications before the loop looks: both apply, in order.
        let a2 = kube("default/a", "203.0.113.20", &["198.51.100.22"]);
        let d = kube("default/d", "203.0.113.21", &["198.51.100.23"]);
        c.apply_kube(vec![
            Publication {
                services: vec![Arc::clone(&a2)],
                changes: vec![set(&a2)],
            },
            Publication {
                services: vec![Arc::clone(&d)],
                changes: vec![("default/a".into(), None), set(&d)],
            },
        ])
        .unwrap();
        let t2 = c.shared.table.load_full();
        assert_eq!(names(&t2), ["default/d", "web"]);
        assert_eq!(t2.generation, 3, "one update for both publications");
        // Updated in place: the unchanged service is shared, not rebuilt.
        let svc = |t: &ServiceTable, n: &str| {
            Arc::clone(t.services.iter().find(|s| s.name == n).unwrap())
        };
        assert!(Arc::ptr_eq(&svc(&t1, "web"), &svc(&t2, "web")));
        assert_eq!(c.shared.config(), crate::kube::merge(&file, &[d]).0);
        // Nobody else holds the replaced table: the builder keeps it for the next update.
        drop((t1, t2));
        let d2 = kube("default/d", "203.0.113.21", &["198.51.100.24"]);
        c.apply_kube(vec![Publication {
            services: vec![Arc::clone(&d2)],
            changes: vec![set(&d2)],
        }])
        .unwrap();
        assert!(c.builder.has_spare(), "the replaced table was not recycled");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_interface_is_named() {
        let dir = std::env::temp_dir().join(format!("strait-run-if-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("strait.toml");
        std::fs::write(
            &path,
            config(&["198.51.100.11"]).replace("\"lo\"", "\"nosuch0\""),
        )
        .unwrap();
        let e = Control::start(Source::File(path)).unwrap_err().to_string();
        assert!(e.contains("interface nosuch0 not found"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
