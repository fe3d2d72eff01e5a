//! State shared between the control loop, the workers and the admin API: the admin API's
//! whole view, composed of the views each driver owns of its own state (the workers'
//! [`CoreStats`], the health checker's [`States`], the Kubernetes source's, the BGP and
//! VRRP sides' and the flow sync's status). The control loop builds it and the admin API
//! reads it; the drivers below do not import it, each hands its own view over.
//!
//! The workers see only their part of it ([`crate::workers::Handles`]: the table's swap,
//! their [`CoreStats`], the capture hub) and never block on it: each publishes a copy of its
//! counters into its own [`CoreStats`] with `try_lock` every few batches (skipping a round if
//! the admin API happens to be reading), and reads the table through an [`ArcSwap`] load.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use strait_config::model::{Config, Service};
use strait_dataplane::table::ServiceTable;

use crate::core::RouteMap;
use crate::cores::{CoreSample, CoreStats};
use crate::health::States;

/// The running configuration as its two sources give it: the file's, and the Kubernetes
/// services merged into it. Publishing it costs two reference counts, not a copy of ten
/// thousand services; it is merged when the admin API asks ([`Shared::config`]).
#[derive(Debug, Clone)]
pub struct Sources {
    /// The configuration file's.
    pub file: Arc<Config>,
    /// The Kubernetes services, sorted by name.
    pub kube: Arc<Vec<Arc<Service>>>,
}

/// Everything the admin API reads.
#[derive(Debug)]
pub struct Shared {
    /// The table the workers forward with; shared with them ([`crate::workers::Handles`]).
    pub table: Arc<ArcSwap<ServiceTable>>,
    /// The configuration the table was built from.
    pub config: Mutex<Sources>,
    /// Health-check states.
    pub health: States,
    /// One entry per worker.
    pub cores: Vec<Arc<CoreStats>>,
    /// Set once the workers forward and the VIPs are announced and, with `--kube`, the
    /// cluster's first complete list is applied: `/healthz` answers 200 only then, so an
    /// orchestrator (or a test) sends traffic only to a gateway that serves what it should.
    pub ready: AtomicBool,
    /// The Kubernetes source's numbers, when it runs.
    pub kube: Mutex<Option<Arc<crate::kube::Stats>>>,
    /// A reader of each interface's XDP steering counters, in configuration order, filled as
    /// the programs are attached; read on each scrape (a map lookup per counter), so the
    /// workers publish nothing for them.
    pub xdp: Mutex<Vec<strait_dataplane::xsk::SteerStats>>,
    /// Every published VIP's route, as the core last said ([`crate::core::Effect::Routes`]).
    pub routes: Mutex<Arc<RouteMap>>,
    /// The BGP speaker's state, when `[gateway.bgp]` is configured.
    pub bgp: Mutex<Option<Arc<Mutex<crate::bgp::Status>>>>,
    /// The VRRP side's state, when `[gateway.l2]` is configured.
    pub l2: Mutex<Option<Arc<Mutex<crate::l2::VrrpStatus>>>>,
    /// Set once the gateway drains: `/healthz` answers 503 from then on.
    pub draining: AtomicBool,
    /// The flow sync thread's counters, while `[gateway.sync]` is configured.
    pub sync: Mutex<Option<Arc<crate::sync::SyncStats>>>,
    /// A reader of the DPDK ports' counters, while DPDK ports run.
    pub dpdk: Mutex<Option<crate::dpdk::StatsReader>>,
    /// The capture hub: one ring per worker, armed by `POST /capture` ([`crate::capture`]).
    pub capture: Arc<strait_dataplane::capture::Hub>,
}

impl Shared {
    /// Shared state for a table built from `config`.
    pub fn new(
        config: Config,
        table: Arc<ServiceTable>,
        health: States,
        cores: Vec<Arc<CoreStats>>,
    ) -> Self {
        let capture = Arc::new(strait_dataplane::capture::Hub::new(cores.len()));
        Self {
            table: Arc::new(ArcSwap::new(table)),
            config: Mutex::new(Sources {
                file: Arc::new(config),
                kube: Arc::default(),
            }),
            health,
            cores,
            ready: AtomicBool::new(false),
            kube: Mutex::new(None),
            xdp: Mutex::new(Vec::new()),
            routes: Mutex::default(),
            bgp: Mutex::new(None),
            l2: Mutex::new(None),
            draining: AtomicBool::new(false),
            sync: Mutex::new(None),
            dpdk: Mutex::new(None),
            capture,
        }
    }

    /// Every published VIP's route.
    pub fn routes(&self) -> Arc<RouteMap> {
        Arc::clone(&self.routes.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// A copy of the VRRP side's state, when it runs.
    pub fn l2(&self) -> Option<crate::l2::VrrpStatus> {
        copy_of(&self.l2)
    }

    /// A copy of the BGP speaker's state, when it runs.
    pub fn bgp(&self) -> Option<crate::bgp::Status> {
        copy_of(&self.bgp)
    }

    /// The running configuration: the file's with the Kubernetes services merged in.
    pub fn config(&self) -> Config {
        let sources = self
            .config
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        crate::kubemodel::merge(&sources.file, &sources.kube).0
    }

    /// Copies of every core's sample.
    pub fn samples(&self) -> Vec<(String, CoreSample)> {
        self.cores
            .iter()
            .map(|c| {
                (
                    c.name.clone(),
                    c.sample
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clone(),
                )
            })
            .collect()
    }
}

/// A copy of the state behind a daemon's status handle, when there is one.
fn copy_of<S: Clone>(slot: &Mutex<Option<Arc<Mutex<S>>>>) -> Option<S> {
    let handle = slot
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()?;
    let status = handle
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    Some(status)
}
