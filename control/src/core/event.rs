//! What goes into the core and what comes out of it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use strait_config::model::{Config, HealthCheck, Service};
use strait_dataplane::table::ServiceTable;

use crate::kubemodel::Publication;

use super::hops::{Neighbours, Scope};

/// What the core is told.
#[derive(Debug)]
pub enum Event {
    /// The configuration file was read again (SIGHUP, `POST /reload`): what it gave, or why
    /// it could not be loaded (its problems, as `strait check` prints them).
    Reload(Result<Box<Loaded>, String>),
    /// Publications of the Kubernetes source since the last event, in order.
    Kube(Vec<Publication>),
    /// Backends whose health check changed state: `true` is up. In nat mode also a pass of
    /// a backend passive health took out, by a check that began after it was
    /// ([`Effect::PassiveOut`]): `true` then brings it back.
    Health(Vec<(BackendKey, bool)>),
    /// Failed connection attempts the workers saw since the last such event
    /// ([`strait_dataplane::passive`]): backend, cause, how many (summed over the cores).
    Passive(Vec<(BackendKey, strait_dataplane::passive::Failure, u64)>),
    /// A read of the kernel's neighbour table and routes on the backend interface, as
    /// [`Effect::ReadNeighbours`] asked for it: of the whole table, or of some next hops
    /// ([`Neighbours::only`]); an empty one of the whole table when it could not be read.
    Neighbours(Neighbours),
    /// Whether the steering maps took the last table published (or retried): `false` when
    /// some keys are still pending (a full map).
    Maps {
        /// Every key is in.
        complete: bool,
    },
    /// The workers forward from now on: the VIPs may be claimed.
    Forwarding,
    /// The gateway drains (`strait drain`, SIGTERM): withdraw every route, keep forwarding.
    Drain,
    /// Time passed ([`super::Control::poll_timeout`]).
    Tick,
}

/// A configuration file as the driver loaded it, with what only the system can tell.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The validated configuration (unset tunnel sources filled from the interfaces).
    pub config: Config,
    /// The addresses of the configured interfaces, for [`ServiceTable::locals`].
    pub locals: Vec<std::net::IpAddr>,
    /// A read of the neighbour table of `config`'s backend interface.
    pub neighbours: Neighbours,
}

/// What the core asks of the world, in the order given.
#[derive(Debug)]
pub enum Effect {
    /// Make `table` the one the workers use (an atomic swap), then bring the steering maps
    /// in line with it and say how that went ([`Event::Maps`]), then hand the replaced
    /// table back ([`super::Control::recycle`]).
    Publish {
        /// The new table.
        table: Arc<ServiceTable>,
        /// The services that differ from the previous table.
        changed: Changed,
    },
    /// The configuration the admin API shows changed: the file's, and the Kubernetes list
    /// merged into it (`kubemodel::merge` of the two is the running configuration).
    Status {
        /// The file's configuration.
        file: Arc<Config>,
        /// The Kubernetes services, sorted by name.
        kube: Arc<Vec<Arc<Service>>>,
    },
    /// Start checking `backend` with `check`: from up, or when it is checked already with
    /// other settings, in place of that check and from the health it has.
    StartCheck {
        /// Service name, address and port.
        backend: BackendKey,
        /// How.
        check: HealthCheck,
    },
    /// Passive health took `backend` out of new flows (the [`Effect::Publish`] that follows
    /// says so to the workers): its checker reports the first pass of a check that begins
    /// from now on ([`Event::Health`] up), which brings it back.
    PassiveOut {
        /// Service name, address and port.
        backend: BackendKey,
        /// The failure that tipped it.
        cause: strait_dataplane::passive::Failure,
        /// The service's `passive_health.failures`...
        failures: u32,
        /// ... within its `passive_health.window`.
        window: std::time::Duration,
    },
    /// Stop checking `backend`.
    StopCheck {
        /// Service name, address and port.
        backend: BackendKey,
    },
    /// Own these VIPs (sorted): answer ARP/ND for them and announce them.
    ClaimVips(Vec<IpAddr>),
    /// Own these VIPs (sorted) no more.
    ReleaseVips(Vec<IpAddr>),
    /// The routes changed: announce exactly the VIPs marked [`super::Route::Announced`]; the
    /// others say why not (`strait status`, `/metrics`).
    Routes(Arc<RouteMap>),
    /// Make the kernel resolve these next hops (sorted), on interface `ifindex` for a
    /// link-local one (0: unknown).
    Probe {
        /// Next-hop addresses.
        hops: Vec<IpAddr>,
        /// The backend interface's index.
        ifindex: u32,
    },
    /// Read the routes of the backend interface and its neighbour entries, all of them or
    /// those of some targets' next hops ([`crate::neigh::backend_read`]), and answer with
    /// [`Event::Neighbours`], before any other event.
    ReadNeighbours(Scope),
    /// Try the steering-map keys still pending again, against the live table, and answer
    /// with [`Event::Maps`].
    RetryMaps,
}

/// Which services a published table changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changed {
    /// The table was built whole: any.
    All,
    /// These, by name, sorted: set or removed; every other service is shared with the
    /// previous table.
    Services(Vec<String>),
}

/// A VIP's route: announced, or why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Route {
    /// Announced to the routers.
    Announced,
    /// The workers do not forward yet.
    NotForwarding,
    /// None of the VIP's services has a backend that takes new flows.
    NoServingBackend,
    /// The gateway drains (`strait drain`, SIGTERM): every route is withdrawn.
    Draining,
    /// Outside `[gateway.bgp] announce`.
    NotSelected,
}

impl Route {
    /// Every state, for metrics that list them all.
    pub const ALL: [Route; 5] = [
        Route::Announced,
        Route::NotForwarding,
        Route::NoServingBackend,
        Route::Draining,
        Route::NotSelected,
    ];

    /// The state's name in `strait status` and `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Announced => "announced",
            Route::NotForwarding => "not-forwarding",
            Route::NoServingBackend => "no-serving-backend",
            Route::Draining => "draining",
            Route::NotSelected => "not-selected",
        }
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every claimed VIP's route, sorted by VIP.
pub type RouteMap = BTreeMap<IpAddr, Route>;

/// The BGP attributes of the VIPs whose services set some, merged over the services of
/// each VIP ([`strait_config::model::RouteAttrs::merge`]).
pub type RouteAttrMap = BTreeMap<IpAddr, strait_config::model::RouteAttrs>;

/// A checked backend: its service and its address and port. The core starts and stops a
/// check per key ([`Effect::StartCheck`]) and is told health by it ([`Event::Health`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendKey {
    /// The service's name.
    pub service: String,
    /// The backend's address.
    pub address: IpAddr,
    /// The backend's port.
    pub port: u16,
}

impl BackendKey {
    /// The key of backend `address`:`port` of service `service`.
    pub fn new(service: impl Into<String>, address: IpAddr, port: u16) -> Self {
        Self {
            service: service.into(),
            address,
            port,
        }
    }
}
