//! Watching the cluster and publishing complete service lists.
//!
//! ```text
//! watcher(Services) ───────┐   Init / InitApply / InitDone: a fresh set built aside,
//! watcher(EndpointSlices) ─┼─► swapped in whole at InitDone (relists after 410 too);
//! watcher(Nodes) ──────────┤   Apply / Delete: applied to the live set
//! watcher(StraitAddressPools, Namespaces) ┘ (--kube-pool-objects: pools made again)
//!        (kube-rs, back-off on errors)
//!                               │ every kind listed once?  no ─► publish nothing yet
//!                               │ a Service changed? collect events 50 ms more
//!                               ▼
//!        Controller::reconcile: address plan (when Services changed)
//!                               ─► translate + validate the Services the events touched
//!                               │  (translate::Incremental keeps the rest)
//!                               ├─► publish(Publication: list + changes) when it changed
//!                               ├─► the status writer (task): the wanted status per Service,
//!                               │   latest wins, one PATCH services/{name}/status in
//!                               │   flight per Service, failures retried with exponential
//!                               │   back-off; successes come back to the loop
//!                               ├─► the pool status writer (task): PATCH
//!                               │   straitaddresspools/{name}/status when counts changed
//!                               └─► the Event task (new notices only)
//! ```
//!
//! Writes run beside the loop, never in it: a slow or refusing API server delays the
//! status, not the next table.
//!
//! [`Controller`] is the pure part (no IO, testable with hand-made watcher events);
//! [`run_source`] drives it from the API server. A lost connection changes nothing that
//! was published: the stores keep the last complete view, the gateway keeps forwarding on
//! it, and kube-rs' watchers reconnect with back-off, resuming from the last resource
//! version or relisting on 410 Gone. Each relist is built aside and swapped in only when
//! complete, so objects deleted meanwhile disappear then, and never before.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::utils::Backoff as KubeBackoff;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use strait_config::model;
use tracing::{debug, info, warn};

use super::crd::{self, PoolCondition, StraitAddressPool, StraitAddressPoolStatus};
use super::events::{Deduper, Emitter, Notice, NoticeType};
use super::pool::{self, Allocator, Pool, StatusUpdate};
use super::settings::Settings;
use super::stats::{Kind, Stats};
use super::translate::{self, Change, Cluster, Incremental, Translation, Warning, WarningKind};
use super::{object_key, KubeError};

/// How long one status write or Event may take before it counts as failed (and is
/// retried on a later round). Short, so an unresponsive API server cannot hold up the
/// processing of watch events for long.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the loop looks at the connection and at pending retries. One second keeps a
/// recovered connection visible within a second and costs nothing when all is well.
const TICK: Duration = Duration::from_secs(1);

/// Wait before a follower, which leaves status writes to the leader, makes a round again
/// while some are still wanted.
const RETRY: Duration = Duration::from_secs(2);

/// Most status writes in flight at once. Each holds a connection to the API server; a
/// slow server holds up to this many and no more, and the next Service's write waits for
/// one of them rather than opening connections without end. Eight covers a burst of new
/// Services on a healthy server (a write takes milliseconds) without starving the
/// watches.
const MAX_WRITES_IN_FLIGHT: usize = 8;

/// How long the loop goes on collecting events after a Service changed, before it plans
/// addresses. `kubectl apply -f` of several Services creates them one request after the
/// other, milliseconds apart; taken into one round, a newer Service's requested address
/// is honoured before an older one is given the lowest free address (see [`pool::plan`]),
/// where one round each would have given the older one that address first. 50 ms covers
/// such a burst from a client near the API server and costs 50 ms on a Service change
/// only; EndpointSlice and Node changes do not wait.
const SERVICE_SETTLE: Duration = Duration::from_millis(50);

/// Most warnings logged per round; the rest are counted only.
const MAX_LOGGED_WARNINGS: usize = 20;

/// One kind's objects: the live set, and a set being built during a (re)list.
#[derive(Debug)]
struct Store<T> {
    live: BTreeMap<String, T>,
    bad: BTreeMap<String, String>,
    next: Option<(BTreeMap<String, T>, BTreeMap<String, String>)>,
    listed: bool,
}

impl<T> Default for Store<T> {
    fn default() -> Self {
        Self {
            live: BTreeMap::new(),
            bad: BTreeMap::new(),
            next: None,
            listed: false,
        }
    }
}

impl<T: DeserializeOwned + kube::Resource> Store<T> {
    /// Applies one watcher event; returns whether the live set changed.
    fn apply(&mut self, event: watcher::Event<DynamicObject>) -> bool {
        match event {
            watcher::Event::Init => {
                self.next = Some(Default::default());
                false
            }
            watcher::Event::InitApply(o) => {
                // An InitApply without Init does not happen; start a set if it does.
                let (live, bad) = self.next.get_or_insert_with(Default::default);
                let key = object_key(&o.metadata);
                match o.try_parse::<T>() {
                    Ok(v) => {
                        live.insert(key, v);
                    }
                    Err(e) => {
                        bad.insert(key, e.to_string());
                    }
                }
                false
            }
            watcher::Event::InitDone => {
                let (live, bad) = self.next.take().unwrap_or_default();
                self.live = live;
                self.bad = bad;
                self.listed = true;
                true
            }
            watcher::Event::Apply(o) => {
                let key = object_key(&o.metadata);
                match o.try_parse::<T>() {
                    Ok(v) => {
                        self.bad.remove(&key);
                        self.live.insert(key, v);
                    }
                    Err(e) => {
                        self.live.remove(&key);
                        self.bad.insert(key, e.to_string());
                    }
                }
                true
            }
            watcher::Event::Delete(o) => {
                let key = object_key(&o.metadata);
                let was_bad = self.bad.remove(&key).is_some();
                self.live.remove(&key).is_some() || was_bad
            }
        }
    }
}

/// Drops what translation never reads of a Node before it is parsed and stored: its spec
/// and every status field but `addresses` and `conditions` (images, node info, capacity,
/// volumes: most of a kubelet's Node), its annotations and managed fields. A heartbeat
/// then costs the parse of a few fields, and 1,000 Nodes a fraction of their size.
fn slim_node(o: &mut DynamicObject) {
    o.metadata.managed_fields = None;
    o.metadata.annotations = None;
    if let Some(m) = o.data.as_object_mut() {
        m.remove("spec");
        if let Some(status) = m.get_mut("status").and_then(Value::as_object_mut) {
            status.retain(|k, _| k == "addresses" || k == "conditions");
        }
    }
}

/// What one reconcile round decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Round {
    /// The complete service list, sorted by name (services that did not change are the
    /// same `Arc`s as in the previous round).
    pub services: Vec<Arc<model::Service>>,
    /// Whether it differs from the list of the previous round (or is the first).
    pub changed: bool,
    /// What changed since the previous round, by name (everything in the first round).
    pub changes: Vec<Change>,
    /// Status writes to make.
    pub status: Vec<StatusUpdate>,
    /// Notices not given before (to become Events).
    pub notices: Vec<Notice>,
    /// Services with a standing address warning, by reason (of the last address plan).
    pub address_warnings: BTreeMap<String, u64>,
    /// Everything left out, with reasons.
    pub warnings: Vec<Warning>,
    /// Warnings not present in the previous round (to log).
    pub new_warnings: Vec<Warning>,
    /// LoadBalancer addresses held.
    pub addresses: usize,
    /// Services translated again in this round.
    pub translated: usize,
    /// `StraitAddressPool` status writes to make (only pools whose status changed).
    pub pool_status: Vec<PoolStatusWrite>,
}

/// A `StraitAddressPool` status to write through the status subresource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStatusWrite {
    /// The pool object's name.
    pub name: String,
    /// The whole status; conditions whose status changed have no transition time yet
    /// (stamped when written).
    pub status: StraitAddressPoolStatus,
}

impl Round {
    /// Number of warnings of each kind.
    pub fn counts(&self) -> BTreeMap<WarningKind, u64> {
        let mut m = BTreeMap::new();
        for w in &self.warnings {
            *m.entry(w.kind).or_insert(0) += 1;
        }
        m
    }
}

/// The source's state between watch events: the three stores, the allocator, the
/// translation so far and what was last published. Pure: feed it watcher events, ask it
/// for rounds.
///
/// A round re-translates only the Services the events since the last round touched (see
/// [`Incremental`]): a Service event its Service, an EndpointSlice event the Services it
/// was and is labelled for, a Node event that changes what translation reads of the Node
/// the `dsr-*` Services that read it (none for a heartbeat), and a Service event the
/// Services whose LoadBalancer addresses the address plan then changes. A completed
/// (re)list of any kind re-translates everything.
#[derive(Debug)]
pub struct Controller {
    settings: Settings,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    nodes: Store<Node>,
    pool_objects: Store<StraitAddressPool>,
    /// Pool objects changed since the last round: the pools are made again.
    pools_dirty: bool,
    /// Why pool objects were left out (as of the last time the pools were made).
    pool_warnings: Vec<Warning>,
    /// Each pool object's pools, or the refused field and why (as of the last time the
    /// pools were made).
    pool_verdicts: BTreeMap<String, Result<Vec<Pool>, Refused>>,
    /// Pool statuses written whose echo the pool watch has not brought back yet.
    pool_written: BTreeMap<String, StraitAddressPoolStatus>,
    /// The pool status writes wanted; `None` when the plan, the pools or the writes made
    /// changed since they were worked out (rounds that touch none of these, as
    /// EndpointSlice and Node changes, reuse them).
    pool_status_due: Option<Vec<PoolStatusWrite>>,
    /// Namespaces (for pools' `namespaceSelectors`), watched with the pool objects.
    namespaces: Store<Namespace>,
    alloc: Allocator,
    dedup: Deduper,
    /// The Events of what translation left out of Services, given once while they stand.
    translation_dedup: Deduper,
    translation: Incremental,
    /// Service keys to translate again.
    dirty: BTreeSet<String>,
    /// Everything to translate again (no round yet, or a relist completed).
    full: bool,
    /// Services changed since the last round: the address plan is made again.
    plan_dirty: bool,
    /// The last address plan's addresses and status writes.
    lb: BTreeMap<String, Vec<IpAddr>>,
    plan_status: Vec<StatusUpdate>,
    /// The plan's status writes not made yet; `None` when the plan or the writes made
    /// changed since it was worked out.
    status: Option<Vec<StatusUpdate>>,
    /// Services in the last published list; `None` before the first round.
    published: Option<usize>,
    last_warnings: BTreeSet<Warning>,
    /// Status writes made whose echo the Services watch has not brought back yet: not
    /// written again meanwhile.
    written: BTreeMap<String, Vec<IpAddr>>,
}

impl Controller {
    /// A controller that has seen nothing yet.
    pub fn new(settings: Settings) -> Self {
        Self {
            alloc: Allocator::with_names(&settings.pools, &settings.named_pools),
            settings,
            services: Store::default(),
            slices: Store::default(),
            nodes: Store::default(),
            pool_objects: Store::default(),
            pools_dirty: false,
            pool_warnings: Vec::new(),
            pool_verdicts: BTreeMap::new(),
            pool_written: BTreeMap::new(),
            pool_status_due: None,
            namespaces: Store::default(),
            dedup: Deduper::default(),
            translation_dedup: Deduper::default(),
            translation: Incremental::default(),
            dirty: BTreeSet::new(),
            full: true,
            plan_dirty: true,
            lb: BTreeMap::new(),
            plan_status: Vec::new(),
            status: None,
            published: None,
            last_warnings: BTreeSet::new(),
            written: BTreeMap::new(),
        }
    }

    /// Applies a watcher event of `kind`; returns whether the live view changed as
    /// translation sees it (a Node update that changes none of its addresses, readiness
    /// or exclusion label does not), so that a round is worth making.
    pub fn apply(&mut self, kind: Kind, mut event: watcher::Event<DynamicObject>) -> bool {
        if kind == Kind::Nodes {
            if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = &mut event {
                slim_node(o);
            }
        }
        let key = match &event {
            watcher::Event::Apply(o) | watcher::Event::Delete(o) => Some(object_key(&o.metadata)),
            _ => None,
        };
        let listed = matches!(event, watcher::Event::InitDone);
        let was_bad = key
            .as_ref()
            .is_some_and(|k| kind == Kind::Nodes && self.nodes.bad.contains_key(k));
        let changed = match kind {
            Kind::Services => self.services.apply(event),
            Kind::EndpointSlices => self.slices.apply(event),
            Kind::Nodes => self.nodes.apply(event),
            Kind::AddressPools => {
                self.pools_dirty = true;
                self.pool_status_due = None;
                self.pool_objects.apply(event)
            }
            Kind::Namespaces => {
                // Labels may move a namespace in or out of a pool's namespaceSelectors:
                // the pools are made again (and the plan only if a pool's scope changed).
                let changed = self.namespaces.apply(event);
                self.pools_dirty |= changed;
                changed
            }
        };
        self.full |= listed;
        match (kind, key) {
            (Kind::Services, Some(key)) => {
                self.dirty.insert(key);
                self.plan_dirty = true;
            }
            (Kind::EndpointSlices, Some(key)) => {
                let now = self.slices.live.get(&key);
                self.dirty.extend(self.translation.set_slice(&key, now));
            }
            (Kind::Nodes, Some(key)) => {
                // Only what translation reads of a Node counts: a heartbeat changes
                // nothing here and asks for no round.
                let now = self.nodes.live.get(&key);
                let bad = was_bad || self.nodes.bad.contains_key(&key);
                return match self.translation.set_node(&key, now) {
                    Some(users) => {
                        self.dirty.extend(users);
                        true
                    }
                    None => changed && bad,
                };
            }
            _ => {}
        }
        changed
    }

    /// Whether every kind has been listed completely at least once: before that, no list
    /// is published and no address allocated.
    pub fn ready(&self) -> bool {
        self.services.listed
            && self.slices.listed
            && self.nodes.listed
            && (!self.settings.pool_objects || (self.pool_objects.listed && self.namespaces.listed))
    }

    /// Replaces the address pools. When they changed, the next round plans addresses
    /// again: Services whose addresses left the pools are given new ones, and dual-stack
    /// Services that lack a family gain it once a pool of that family exists. Returns
    /// whether they changed.
    pub fn set_pools(
        &mut self,
        pools: Vec<ipnet::IpNet>,
        named: Vec<(String, ipnet::IpNet)>,
    ) -> bool {
        self.settings.pools = pools;
        self.settings.named_pools = named;
        self.make_pools()
    }

    /// Makes the allocator's pools from the settings' and the pool objects: the
    /// settings' first, then each object, oldest first. An object that cannot be used, or that
    /// overlaps a pool before it, is left out whole with a warning. Returns whether the
    /// pools changed (and the next round plans again).
    fn make_pools(&mut self) -> bool {
        let mut pools: Vec<Pool> = self
            .settings
            .pools
            .iter()
            .map(|p| Pool::cidr(None, *p))
            .chain(
                self.settings
                    .named_pools
                    .iter()
                    .map(|(n, p)| Pool::cidr(Some(n.clone()), *p)),
            )
            .collect();
        let mut warnings = Vec::new();
        let mut verdicts = BTreeMap::new();
        let ns_labels: BTreeMap<String, BTreeMap<String, String>> = self
            .namespaces
            .live
            .iter()
            .map(|(k, n)| (k.clone(), n.metadata.labels.clone().unwrap_or_default()))
            .collect();
        // Oldest first: a new object overlapping a pool in use never displaces it.
        let mut objects: Vec<(&String, &StraitAddressPool)> =
            self.pool_objects.live.iter().collect();
        objects.sort_by(|(ka, a), (kb, b)| {
            let (ta, tb) = (
                a.metadata.creation_timestamp.as_ref(),
                b.metadata.creation_timestamp.as_ref(),
            );
            (ta.is_none(), ta, ka).cmp(&(tb.is_none(), tb, kb))
        });
        for (name, obj) in objects {
            let warn = |message: String| Warning {
                kind: WarningKind::Invalid,
                object: format!("straitaddresspool {name}"),
                message,
            };
            match crd::pools_in(obj, &ns_labels) {
                Err(e) => {
                    warnings.push(warn(format!("{}: {}", e.field, e.reason)));
                    verdicts.insert(
                        name.clone(),
                        Err(Refused {
                            reason: "InvalidField",
                            field: e.field,
                            message: e.reason,
                        }),
                    );
                }
                Ok(new) => {
                    let clash = new.iter().find_map(|n| {
                        pools
                            .iter()
                            .find(|p| {
                                p.net.contains(&n.net.network()) || n.net.contains(&p.net.network())
                            })
                            .map(|p| (n.net, p.clone()))
                    });
                    match clash {
                        Some((net, p)) => {
                            let message = format!(
                                "{net} overlaps pool {p}: left out (an address belongs to one pool)"
                            );
                            warnings.push(warn(message.clone()));
                            verdicts.insert(
                                name.clone(),
                                Err(Refused {
                                    reason: "Overlap",
                                    field: "spec.addresses".into(),
                                    message,
                                }),
                            );
                        }
                        None => {
                            verdicts.insert(name.clone(), Ok(new.clone()));
                            pools.extend(new);
                        }
                    }
                }
            }
        }
        self.pool_warnings = warnings;
        self.pool_verdicts = verdicts;
        self.pool_status_due = None;
        let changed = self.alloc.replace_pools(pools);
        self.plan_dirty |= changed;
        changed
    }

    /// Objects of `kind` in the live view.
    pub fn len(&self, kind: Kind) -> usize {
        match kind {
            Kind::Services => self.services.live.len(),
            Kind::EndpointSlices => self.slices.live.len(),
            Kind::Nodes => self.nodes.live.len(),
            Kind::AddressPools => self.pool_objects.live.len(),
            Kind::Namespaces => self.namespaces.live.len(),
        }
    }

    /// The number of services in the last list handed out by [`Controller::reconcile`].
    pub fn published(&self) -> Option<usize> {
        self.published
    }

    /// One round: address plan, translation, validation of what changed since the last
    /// round. `None` until [`Self::ready`].
    pub fn reconcile(&mut self) -> Option<Round> {
        if !self.ready() {
            return None;
        }
        if std::mem::take(&mut self.full) {
            self.translation.reset_slices(&self.slices.live);
            let users = self.translation.set_nodes(&self.nodes.live);
            self.dirty.extend(users);
            self.plan_dirty = true;
            let keys: Vec<String> = self
                .services
                .live
                .keys()
                .chain(self.translation.keys())
                .cloned()
                .collect();
            self.dirty.extend(keys);
        }
        if std::mem::take(&mut self.pools_dirty) {
            self.make_pools();
        }
        let mut notices = Vec::new();
        if std::mem::take(&mut self.plan_dirty) {
            let all: Vec<&Service> = translate::by_age(&self.services.live)
                .into_iter()
                .map(|(_, s)| s)
                .collect();
            let settings = &self.settings;
            let plan = pool::plan(&mut self.alloc, &all, |s| translate::owns(settings, s));
            // Services whose addresses changed are translated again.
            for (key, addrs) in &plan.assigned {
                if self.lb.get(key) != Some(addrs) {
                    self.dirty.insert(key.clone());
                }
            }
            for key in self.lb.keys() {
                if !plan.assigned.contains_key(key) {
                    self.dirty.insert(key.clone());
                }
            }
            self.lb = plan.assigned;
            self.plan_status = plan.status;
            notices = self.dedup.fresh(plan.notices);
            // A write is remembered until the watch brings the Service back with it; only
            // Service events do that, and they re-make the plan.
            let live = &self.services.live;
            self.written.retain(|key, addrs| {
                live.get(key)
                    .is_some_and(|s| pool::status_addresses(s) != *addrs)
            });
            self.status = None;
            self.pool_status_due = None;
        }
        let written = &self.written;
        let plan_status = &self.plan_status;
        let status = self
            .status
            .get_or_insert_with(|| {
                plan_status
                    .iter()
                    .filter(|u| written.get(&u.key()) != Some(&u.addresses))
                    .cloned()
                    .collect()
            })
            .clone();
        let changes = self.translation.update(
            &self.settings,
            Cluster {
                services: &self.services.live,
                slices: &self.slices.live,
                nodes: &self.nodes.live,
            },
            &self.lb,
            std::mem::take(&mut self.dirty),
        );
        let mut warnings = self.translation.warnings();
        warnings.extend(self.pool_warnings.iter().cloned());
        for (kind, store) in [
            ("service", &self.services.bad),
            ("endpointslice", &self.slices.bad),
            ("node", &self.nodes.bad),
            ("straitaddresspool", &self.pool_objects.bad),
        ] {
            for (key, err) in store {
                warnings.push(Warning {
                    kind: WarningKind::Malformed,
                    object: format!("{kind} {key}"),
                    message: format!("does not parse: {err}"),
                });
            }
        }
        // What translation left out of a Service is an Event on it too, given once while it
        // stands (its own deduper: this runs every round, the plan's only when it is made).
        let mut left_out = Vec::new();
        for w in &warnings {
            if let Some(svc) = self.warned_service(&w.object) {
                left_out.push(pool::service_notice(
                    svc,
                    NoticeType::Warning,
                    w.kind.reason(),
                    w.message.clone(),
                ));
            }
        }
        notices.extend(self.translation_dedup.fresh(left_out));
        let now: BTreeSet<Warning> = warnings.iter().cloned().collect();
        let new_warnings = now.difference(&self.last_warnings).cloned().collect();
        self.last_warnings = now;
        let services: Vec<Arc<model::Service>> = self.translation.services().cloned().collect();
        let changed = self.published.is_none() || !changes.is_empty();
        self.published = Some(services.len());
        let pool_status = self.pool_status();
        Some(Round {
            pool_status,
            services,
            changed,
            changes,
            status,
            notices,
            address_warnings: self.dedup.standing(),
            warnings,
            new_warnings,
            addresses: self.alloc.count(),
            translated: self.translation.translated(),
        })
    }
}

impl Controller {
    /// The Service a translation warning's object names (`service NAMESPACE/NAME`, or a
    /// model name beginning with it), if it is live.
    fn warned_service(&self, object: &str) -> Option<&Service> {
        let name = object.strip_prefix("service ")?;
        let live = &self.services.live;
        live.get(name).or_else(|| {
            let mut parts = name.splitn(3, '/');
            let key = format!("{}/{}", parts.next()?, parts.next()?);
            live.get(&key)
        })
    }

    /// Translates the whole live view from scratch, with the last address plan's
    /// addresses: what [`Controller::reconcile`]'s incremental translation must equal
    /// (benchmarks and tests check it).
    pub fn translate_all(&self) -> Translation {
        translate::translate(
            &self.settings,
            Cluster {
                services: &self.services.live,
                slices: &self.slices.live,
                nodes: &self.nodes.live,
            },
            &self.lb,
        )
    }

    /// Records a successful status write, so it is not repeated before the watch brings
    /// the updated Service back.
    pub fn status_written(&mut self, update: &StatusUpdate) {
        self.written.insert(update.key(), update.addresses.clone());
        self.status = None;
    }
}

/// Why a pool object is refused: an Event-style reason, the field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refused {
    reason: &'static str,
    field: String,
    message: String,
}

impl Controller {
    /// The pool objects whose status differs from what it should be (addresses held and
    /// free as of the last address plan, Ready / Invalid), except those written and not
    /// seen back yet. Nothing when no count, condition or generation changed, so rounds
    /// that change no pool write nothing.
    fn pool_status(&mut self) -> Vec<PoolStatusWrite> {
        if !self.settings.pool_objects {
            return Vec::new();
        }
        if let Some(due) = &self.pool_status_due {
            return due.clone();
        }
        let held: BTreeSet<IpAddr> = self.lb.values().flatten().copied().collect();
        let mut out = Vec::new();
        for (name, obj) in &self.pool_objects.live {
            let Some(verdict) = self.pool_verdicts.get(name) else {
                continue;
            };
            let want = desired_pool_status(obj, verdict, &held);
            let shown = obj.status.as_ref();
            // A write handed to the writer and not seen back yet is what the pool will
            // show: compare with it, not with the (older) status the watch shows now.
            if let Some(w) = self.pool_written.get(name) {
                if shown.is_some_and(|s| same_status(s, w)) {
                    self.pool_written.remove(name);
                } else if same_status(w, &want) {
                    continue;
                } else {
                    out.push(PoolStatusWrite {
                        name: name.clone(),
                        status: want,
                    });
                    continue;
                }
            }
            if shown.is_some_and(|s| same_status(s, &want)) {
                continue;
            }
            out.push(PoolStatusWrite {
                name: name.clone(),
                status: want,
            });
        }
        // Pools deleted meanwhile need no memory.
        let live = &self.pool_objects.live;
        self.pool_written.retain(|k, _| live.contains_key(k));
        self.pool_status_due = Some(out.clone());
        out
    }

    /// Records a successful pool status write, so it is not repeated before the pool
    /// watch brings the object back with it.
    pub fn pool_status_written(&mut self, w: &PoolStatusWrite) {
        self.pool_written.insert(w.name.clone(), w.status.clone());
        self.pool_status_due = None;
    }

    /// Forgets a pool status write that failed, so the next round works it out again.
    pub fn pool_status_failed(&mut self, w: &PoolStatusWrite) {
        if self
            .pool_written
            .get(&w.name)
            .is_some_and(|s| same_status(s, &w.status))
        {
            self.pool_written.remove(&w.name);
        }
        self.pool_status_due = None;
    }
}

/// The status pool `obj` should show, given its verdict and the addresses held.
fn desired_pool_status(
    obj: &StraitAddressPool,
    verdict: &Result<Vec<Pool>, Refused>,
    held: &BTreeSet<IpAddr>,
) -> StraitAddressPoolStatus {
    let old = obj.status.as_ref();
    let generation = obj.metadata.generation;
    let condition = |type_: &str, ok: bool, reason: &str, message: String| {
        let status = if ok { "True" } else { "False" };
        // The transition time moves only when the status does.
        let since = old
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
            .filter(|c| c.status == status)
            .and_then(|c| c.last_transition_time.clone());
        PoolCondition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: generation,
            last_transition_time: since,
        }
    };
    let clamp = |n: u128| u64::try_from(n).unwrap_or(u64::MAX).min(i64::MAX as u64);
    match verdict {
        Ok(pools) => {
            let assigned = held
                .iter()
                .filter(|a| pools.iter().any(|p| p.net.contains(*a)))
                .count() as u128;
            let size: u128 = pools.iter().map(Pool::size).fold(0, u128::saturating_add);
            let free = size.saturating_sub(assigned);
            StraitAddressPoolStatus {
                assigned: clamp(assigned),
                available: clamp(free),
                conditions: vec![
                    condition(
                        "Ready",
                        true,
                        if free == 0 { "Exhausted" } else { "Serving" },
                        format!("{assigned} addresses in use, {free} free"),
                    ),
                    condition("Invalid", false, "Valid", "the spec is accepted".into()),
                ],
            }
        }
        Err(r) => StraitAddressPoolStatus {
            assigned: 0,
            available: 0,
            conditions: vec![
                condition(
                    "Ready",
                    false,
                    r.reason,
                    "the pool serves no address: see the Invalid condition".into(),
                ),
                condition(
                    "Invalid",
                    true,
                    r.reason,
                    format!("{}: {}", r.field, r.message),
                ),
            ],
        },
    }
}

/// Whether two pool statuses say the same, transition times aside.
fn same_status(a: &StraitAddressPoolStatus, b: &StraitAddressPoolStatus) -> bool {
    let strip = |s: &StraitAddressPoolStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = None;
        }
        s
    };
    strip(a) == strip(b)
}

/// `PATCH straitaddresspools/{name}/status` (a merge patch of the whole status, through
/// the status subresource), with new transitions stamped now.
async fn write_pool_status(client: &Client, w: &PoolStatusWrite) -> bool {
    let api: Api<StraitAddressPool> = Api::all(client.clone());
    let mut status = w.status.clone();
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let now = serde_json::to_value(now)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned));
    for c in &mut status.conditions {
        if c.last_transition_time.is_none() {
            c.last_transition_time.clone_from(&now);
        }
    }
    let patch = json!({ "status": status });
    match tokio::time::timeout(
        WRITE_TIMEOUT,
        api.patch_status(&w.name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await
    {
        Ok(Ok(_)) => {
            info!(
                pool = %w.name,
                assigned = w.status.assigned,
                available = w.status.available,
                "kubernetes: wrote the address pool's status"
            );
            true
        }
        Ok(Err(e)) => {
            warn!(
                "kubernetes: writing the status of address pool {}: {e}",
                w.name
            );
            false
        }
        Err(_) => {
            warn!(
                "kubernetes: writing the status of address pool {}: timed out",
                w.name
            );
            false
        }
    }
}

/// What the source hands the control loop each time the service list changes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Publication {
    /// The complete list, sorted by name.
    pub services: Vec<Arc<model::Service>>,
    /// What changed since the previous publication, by name (the first publication lists
    /// every service). A consumer that skips publications applies the changes of each, in
    /// order (a later change of a name replaces an earlier one).
    pub changes: Vec<Change>,
}

/// Exponential back-off with jitter between reconnection attempts (kube-rs' watcher
/// `Backoff` trait: reset once a stream yields again).
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starting at `min`, doubling up to `max`.
    pub fn new((min, max): (Duration, Duration)) -> Self {
        Self {
            min,
            max: max.max(min),
            next: min,
        }
    }
}

impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        // Up to 25 % less, so many gateways do not reconnect in step.
        let jitter = d.mul_f64(fastrand::f64() * 0.25);
        Some(d - jitter)
    }
}

impl KubeBackoff for Backoff {
    fn reset(&mut self) {
        self.next = self.min;
    }
}

/// Watches Services, EndpointSlices and Nodes through `client` and calls `publish` with
/// the complete service list and its changes each time it changes, never before all three kinds are
/// listed. Writes LoadBalancer status and Events on the way. Runs until the future is
/// dropped.
///
/// # Errors
/// Only if the watch streams end, which kube-rs' watchers never do.
pub async fn run_source<F>(
    client: Client,
    settings: Settings,
    stats: Arc<Stats>,
    mut publish: F,
    mut leading: tokio::sync::watch::Receiver<bool>,
) -> Result<(), KubeError>
where
    F: FnMut(Publication) + Send,
{
    let stream = |kind: Kind, ar: ApiResource| {
        stats.watch(kind);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        watcher(api, watcher::Config::default())
            .backoff(Backoff::new(settings.backoff))
            .map(move |r| (kind, r))
            .boxed()
    };
    let mut streams = vec![
        stream(Kind::Services, ApiResource::erase::<Service>(&())),
        stream(
            Kind::EndpointSlices,
            ApiResource::erase::<EndpointSlice>(&()),
        ),
        stream(Kind::Nodes, ApiResource::erase::<Node>(&())),
    ];
    if settings.pool_objects {
        streams.push(stream(
            Kind::AddressPools,
            ApiResource::erase::<StraitAddressPool>(&()),
        ));
        // Always with pool objects, whether or not a pool has namespaceSelectors yet: a
        // pool gaining one then needs no new watch (nor a wait for its first list).
        streams.push(stream(
            Kind::Namespaces,
            ApiResource::erase::<Namespace>(&()),
        ));
    }
    let mut events = futures::stream::select_all(streams);
    let (writes, wanted) = tokio::sync::watch::channel(Vec::new());
    let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel();
    let _writer = AbortOnDrop(tokio::spawn(write_statuses(
        client.clone(),
        Arc::clone(&stats),
        settings.backoff,
        wanted,
        done_tx,
    )));
    let (pool_writes, pool_wanted) = tokio::sync::mpsc::unbounded_channel();
    let (pool_done_tx, mut pool_done) = tokio::sync::mpsc::unbounded_channel();
    let _pool_writer = AbortOnDrop(tokio::spawn(write_pool_statuses(
        client.clone(),
        Arc::clone(&stats),
        pool_wanted,
        pool_done_tx,
    )));
    let (notices, notices_rx) = tokio::sync::mpsc::unbounded_channel();
    let _events = AbortOnDrop(tokio::spawn(post_events(
        Emitter::new(client.clone(), &settings.reporter),
        Arc::clone(&stats),
        notices_rx,
    )));
    let mut ctl = Controller::new(settings);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut retry: Option<tokio::time::Instant> = None;
    let mut electing = true;
    info!("kubernetes: watching services, endpointslices and nodes");
    loop {
        tokio::select! {
            next = events.next() => {
                let Some((kind, r)) = next else { return Err(KubeError::StreamsEnded) };
                let mut settle = service_change(kind, &r);
                let mut dirty = handle(&mut ctl, &stats, kind, r);
                // Take whatever else is already there, so a burst becomes one round.
                while let Some(Some((kind, r))) = events.next().now_or_never() {
                    settle |= service_change(kind, &r);
                    dirty |= handle(&mut ctl, &stats, kind, r);
                }
                if settle && ctl.ready() {
                    let until = tokio::time::Instant::now() + SERVICE_SETTLE;
                    while let Ok(next) = tokio::time::timeout_at(until, events.next()).await {
                        let Some((kind, r)) = next else { return Err(KubeError::StreamsEnded) };
                        dirty |= handle(&mut ctl, &stats, kind, r);
                    }
                }
                let lead = *leading.borrow();
                if dirty && round(&mut ctl, &writes, &pool_writes, &notices, &stats, &mut publish, lead) {
                    retry.get_or_insert_with(|| tokio::time::Instant::now() + RETRY);
                }
            }
            Some(up) = done.recv() => {
                ctl.status_written(&up);
            }
            Some((w, ok)) = pool_done.recv() => {
                if !ok {
                    ctl.pool_status_failed(&w);
                    retry.get_or_insert_with(|| tokio::time::Instant::now() + RETRY);
                }
            }
            changed = leading.changed(), if electing => {
                if changed.is_err() {
                    // No election (a lone gateway), or it ended: the last word stands.
                    electing = false;
                } else if *leading.borrow_and_update() {
                    // A new leader writes what the plan wants at once.
                    retry = Some(tokio::time::Instant::now());
                }
            }
            _ = tick.tick() => {
                if !stats.connected() {
                    probe(&client, &stats).await;
                }
                if retry.is_some_and(|at| tokio::time::Instant::now() >= at) {
                    retry = None;
                    let lead = *leading.borrow();
                    if round(&mut ctl, &writes, &pool_writes, &notices, &stats, &mut publish, lead) {
                        retry = Some(tokio::time::Instant::now() + RETRY);
                    }
                }
            }
        }
    }
}

/// Whether `r` is a change of one Service (after which the loop waits
/// [`SERVICE_SETTLE`] for more).
fn service_change(kind: Kind, r: &Result<watcher::Event<DynamicObject>, watcher::Error>) -> bool {
    kind == Kind::Services && matches!(r, Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)))
}

/// Applies one watcher outcome; returns whether the view changed.
fn handle(
    ctl: &mut Controller,
    stats: &Stats,
    kind: Kind,
    r: Result<watcher::Event<DynamicObject>, watcher::Error>,
) -> bool {
    match r {
        Ok(ev) => {
            if !stats.set_connected(true) {
                info!(
                    kind = kind.as_str(),
                    "kubernetes: connected to the API server"
                );
            }
            let done = matches!(ev, watcher::Event::InitDone);
            let init = matches!(ev, watcher::Event::Init);
            let changed = ctl.apply(kind, ev);
            if init {
                stats.list_started(kind);
                debug!(kind = kind.as_str(), "kubernetes: listing");
            }
            if done {
                let n = ctl.len(kind);
                stats.list_done(kind, n);
                info!(
                    kind = kind.as_str(),
                    objects = n,
                    "kubernetes: list complete"
                );
            } else {
                stats.set_objects(kind, ctl.len(kind));
            }
            changed
        }
        Err(e) => {
            let expired = matches!(&e, watcher::Error::WatchError(s) if s.code == 410);
            stats.error(kind, expired);
            if expired {
                info!(
                    kind = kind.as_str(),
                    "kubernetes: resource version expired (410 Gone), relisting"
                );
            } else if stats.set_connected(false) {
                let kept = ctl.published().unwrap_or(0);
                warn!(
                    kind = kind.as_str(),
                    "kubernetes: lost the API server, keeping the last published list \
                     ({kept} services) and retrying with back-off: {e}"
                );
            } else {
                debug!(kind = kind.as_str(), "kubernetes: still unreachable: {e}");
            }
            false
        }
    }
}

/// Asks the API server for its version, to notice a recovered connection before a watch
/// has anything to say.
async fn probe(client: &Client, stats: &Stats) {
    if let Ok(Ok(_)) = tokio::time::timeout(WRITE_TIMEOUT, client.apiserver_version()).await {
        if !stats.set_connected(true) {
            info!("kubernetes: the API server answers again");
        }
    }
}

/// One round with its IO: the publication at once; the status writes wanted (when
/// `lead`: this gateway holds the Lease, or there is none) handed to the status writer,
/// which makes them beside the loop, and the Events to the Event task. Returns whether a
/// follower left status writes to the leader, and wants another round.
fn round<F>(
    ctl: &mut Controller,
    writes: &tokio::sync::watch::Sender<Vec<StatusUpdate>>,
    pool_writes: &tokio::sync::mpsc::UnboundedSender<Vec<PoolStatusWrite>>,
    notices: &tokio::sync::mpsc::UnboundedSender<Notice>,
    stats: &Stats,
    publish: &mut F,
    lead: bool,
) -> bool
where
    F: FnMut(Publication) + Send,
{
    let Some(r) = ctl.reconcile() else {
        return false;
    };
    stats.set_skipped(r.counts());
    stats.set_addresses(r.addresses);
    stats.set_address_warnings(r.address_warnings.clone());
    for n in &r.notices {
        stats.notice(n.type_, &n.reason);
    }
    for w in r.new_warnings.iter().take(MAX_LOGGED_WARNINGS) {
        warn!(reason = w.kind.as_str(), "kubernetes: left out: {w}");
    }
    if r.new_warnings.len() > MAX_LOGGED_WARNINGS {
        warn!(
            "kubernetes: {} more left out (see strait_kube_skipped)",
            r.new_warnings.len() - MAX_LOGGED_WARNINGS
        );
    }
    if r.changed {
        info!(
            services = r.services.len(),
            "kubernetes: publishing the service list"
        );
        stats.published(r.services.len());
        publish(Publication {
            services: r.services,
            changes: r.changes,
        });
    }
    if !lead {
        // The leader writes them; this gateway sees them come back through the watch, and
        // tries again (as leader, should it become one) while some are still wanted.
        writes.send_if_modified(|w| !std::mem::take(w).is_empty());
        return !r.status.is_empty() || !r.pool_status.is_empty();
    }
    writes.send_if_modified(|w| {
        let changed = *w != r.status;
        if changed {
            w.clone_from(&r.status);
        }
        changed
    });
    if !r.pool_status.is_empty() {
        // Recorded as written now, so no round asks for them again while they are in
        // flight; a failure is forgotten when the writer reports it.
        for w in &r.pool_status {
            ctl.pool_status_written(w);
        }
        let _ = pool_writes.send(r.pool_status);
    }
    for n in r.notices {
        let _ = notices.send(n);
    }
    false
}

/// Writes `StraitAddressPool` statuses beside the loop as it hands them over, in order (a
/// status equal to the last one written for that pool is not written again), and gives each
/// outcome back to the loop, which recorded the write when it handed it over: a failure is
/// forgotten there and asks for another round.
async fn write_pool_statuses(
    client: Client,
    stats: Arc<Stats>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Vec<PoolStatusWrite>>,
    done: tokio::sync::mpsc::UnboundedSender<(PoolStatusWrite, bool)>,
) {
    let mut written: BTreeMap<String, StraitAddressPoolStatus> = BTreeMap::new();
    while let Some(batch) = rx.recv().await {
        for w in batch {
            if written.get(&w.name) == Some(&w.status) {
                let _ = done.send((w, true));
                continue;
            }
            let ok = write_pool_status(&client, &w).await;
            stats.status_write(ok);
            if ok {
                written.insert(w.name.clone(), w.status.clone());
            }
            let _ = done.send((w, ok));
        }
    }
}

/// Posts Events one after the other as the loop hands them over, each with
/// [`WRITE_TIMEOUT`]; a failed one is counted and dropped (the notice is not repeated,
/// as before the writes moved off the loop).
async fn post_events(
    emitter: Emitter,
    stats: Arc<Stats>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Notice>,
) {
    while let Some(n) = rx.recv().await {
        let ok = match tokio::time::timeout(WRITE_TIMEOUT, emitter.emit(&n)).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                warn!("kubernetes: event {} for {}: {e}", n.reason, n.key());
                false
            }
            Err(_) => {
                warn!("kubernetes: event {} for {}: timed out", n.reason, n.key());
                false
            }
        };
        stats.event(ok);
    }
}

/// One Service's status as the writer holds it.
#[derive(Debug)]
struct Slot {
    /// The status wanted now; `None` when no longer wanted (the slot goes once no write is
    /// in flight).
    want: Option<StatusUpdate>,
    /// The last write that succeeded: not made again while it is what is wanted.
    written: Option<StatusUpdate>,
    in_flight: bool,
    /// When the wanted status may be written next.
    due: tokio::time::Instant,
    backoff: Backoff,
}

/// How a status write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    Ok,
    /// 409: the Service changed since the version the write was meant for; the watch
    /// brings the new version, and the plan a new wanted status.
    Conflict,
    /// Refused, failed or timed out: retried after a back-off.
    Failed,
}

/// The status writer: takes the wanted status writes from `wanted` (each new list replaces
/// the last: the latest wanted status of a Service wins, one no longer listed is dropped)
/// and makes them beside the loop, at most [`MAX_WRITES_IN_FLIGHT`] at once and one per
/// Service at a time, so a newer status is never overtaken by an older one. A failed write
/// is retried after an exponential back-off of its own (`backoff`: doubling from its
/// shortest to its longest wait, with jitter), reset by a success. Each success goes back
/// to the loop through `done`, which records it ([`Controller::status_written`]).
async fn write_statuses(
    client: Client,
    stats: Arc<Stats>,
    backoff: (Duration, Duration),
    mut wanted: tokio::sync::watch::Receiver<Vec<StatusUpdate>>,
    done: tokio::sync::mpsc::UnboundedSender<StatusUpdate>,
) {
    let mut slots: BTreeMap<String, Slot> = BTreeMap::new();
    let mut flying: tokio::task::JoinSet<(String, StatusUpdate, Written)> =
        tokio::task::JoinSet::new();
    loop {
        let now = tokio::time::Instant::now();
        for (key, slot) in &mut slots {
            if flying.len() >= MAX_WRITES_IN_FLIGHT {
                break;
            }
            let Some(want) = &slot.want else { continue };
            if slot.in_flight || slot.due > now || slot.written.as_ref() == Some(want) {
                continue;
            }
            slot.in_flight = true;
            let (client, key, up) = (client.clone(), key.clone(), want.clone());
            flying.spawn(async move {
                let result = write_status(&client, &up).await;
                (key, up, result)
            });
        }
        let next_due = slots
            .values()
            .filter(|s| !s.in_flight && s.want.is_some() && s.want != s.written)
            .map(|s| s.due)
            .min()
            .filter(|_| flying.len() < MAX_WRITES_IN_FLIGHT);
        tokio::select! {
            changed = wanted.changed() => {
                if changed.is_err() {
                    return;
                }
                let list = wanted.borrow_and_update().clone();
                let keys: BTreeSet<String> = list.iter().map(StatusUpdate::key).collect();
                for up in list {
                    let slot = slots.entry(up.key()).or_insert_with(|| Slot {
                        want: None,
                        written: None,
                        in_flight: false,
                        due: now,
                        backoff: Backoff::new(backoff),
                    });
                    slot.want = Some(up);
                }
                slots.retain(|key, slot| {
                    if keys.contains(key) {
                        return true;
                    }
                    slot.want = None;
                    slot.in_flight
                });
            }
            Some(joined) = flying.join_next(), if !flying.is_empty() => {
                let Ok((key, up, result)) = joined else { continue };
                stats.status_write(result == Written::Ok);
                let Some(slot) = slots.get_mut(&key) else { continue };
                slot.in_flight = false;
                match result {
                    Written::Ok => {
                        slot.backoff.reset();
                        slot.due = tokio::time::Instant::now();
                        slot.written = Some(up.clone());
                        let _ = done.send(up);
                    }
                    Written::Conflict => {
                        // Not retried as it is: only a newer wanted status (for the
                        // Service's new version) is written.
                        slot.written = Some(up);
                    }
                    Written::Failed => {
                        let wait = slot.backoff.next().unwrap_or(backoff.1);
                        slot.due = tokio::time::Instant::now() + wait;
                        debug!(service = %key, ?wait, "kubernetes: status write retried after a back-off");
                    }
                }
                if slot.want.is_none() {
                    slots.remove(&key);
                }
            }
            () = sleep_until(next_due), if next_due.is_some() => {}
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Aborts a task when dropped: the writer tasks end with the source.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `PATCH services/{name}/status` with a merge patch setting the ingress addresses.
async fn write_status(client: &Client, up: &StatusUpdate) -> Written {
    let api: Api<Service> = Api::namespaced(client.clone(), &up.namespace);
    let ingress: Vec<_> = up
        .addresses
        .iter()
        .map(|a| json!({ "ip": a.to_string(), "ipMode": "VIP" }))
        .collect();
    // A JSON merge patch removes a field set to null: a cleared status has no ingress.
    let ingress = if ingress.is_empty() {
        Value::Null
    } else {
        Value::Array(ingress)
    };
    let mut patch = json!({ "status": { "loadBalancer": { "ingress": ingress } } });
    if let Some(rv) = &up.resource_version {
        // A precondition: the API server refuses the write (409 Conflict) if the Service
        // changed since, and the next round decides again on what the watch brings.
        patch["metadata"] = json!({ "resourceVersion": rv });
    }
    let pp = PatchParams::default();
    match tokio::time::timeout(
        WRITE_TIMEOUT,
        api.patch_status(&up.name, &pp, &Patch::Merge(&patch)),
    )
    .await
    {
        Ok(Ok(_)) => {
            info!(
                service = %format!("{}/{}", up.namespace, up.name),
                addresses = ?up.addresses,
                "kubernetes: wrote status.loadBalancer.ingress"
            );
            Written::Ok
        }
        Ok(Err(e)) => {
            warn!(
                "kubernetes: writing the status of {}/{}: {e}",
                up.namespace, up.name
            );
            match e {
                kube::Error::Api(s) if s.is_conflict() => Written::Conflict,
                _ => Written::Failed,
            }
        }
        Err(_) => {
            warn!(
                "kubernetes: writing the status of {}/{}: timed out",
                up.namespace, up.name
            );
            Written::Failed
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::{json, Value};
    use strait_config::model::Mode;

    use super::*;

    fn dynamic(v: Value) -> DynamicObject {
        serde_json::from_value(v).expect("a well-formed object")
    }

    /// A random Service among six: LoadBalancer or NodePort, external IPs from a set of
    /// two (so frontends are contested), a mode annotation (valid or not), a policy, one
    /// to three ports, a creation time from a few (so ages tie).
    fn service(rng: &mut fastrand::Rng, i: usize) -> Value {
        let mut ports =
            vec![json!({ "name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080 + i })];
        if rng.bool() {
            ports.push(
                json!({ "name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053 + i }),
            );
        }
        if rng.u8(..4) == 0 {
            ports.push(json!({ "name": "sctp", "port": 99, "protocol": "SCTP" }));
        }
        let ext: Vec<&str> = ["203.0.113.100", "203.0.113.101"]
            .into_iter()
            .filter(|_| rng.bool())
            .collect();
        let mut annotations = serde_json::Map::new();
        match rng.u8(..4) {
            0 => {
                annotations.insert(
                    super::super::settings::MODE_ANNOTATION.into(),
                    json!("dsr-l2"),
                );
            }
            1 => {
                annotations.insert(
                    super::super::settings::MODE_ANNOTATION.into(),
                    json!("bogus"),
                );
            }
            _ => {}
        }
        json!({
            "kind": "Service", "apiVersion": "v1",
            "metadata": {
                "name": format!("s{i}"), "namespace": "default",
                "creationTimestamp": format!("2024-01-01T00:00:0{}Z", rng.u8(..3)),
                "annotations": annotations
            },
            "spec": {
                "type": if rng.u8(..3) == 0 { "NodePort" } else { "LoadBalancer" },
                "loadBalancerClass": super::super::settings::DEFAULT_CLASS,
                "externalIPs": ext,
                "externalTrafficPolicy": if rng.bool() { "Local" } else { "Cluster" },
                "healthCheckNodePort": 32000,
                "ports": ports
            }
        })
    }

    fn slice(rng: &mut fastrand::Rng, i: usize) -> Value {
        let hosts: Vec<u8> = (10..15).filter(|_| rng.bool()).collect();
        let eps: Vec<Value> = hosts
            .into_iter()
            .map(|h| {
                json!({
                    "addresses": [format!("198.51.100.{h}")],
                    "nodeName": format!("n{}", rng.u8(..3)),
                    "conditions": { "ready": rng.u8(..4) != 0, "serving": true, "terminating": rng.bool() }
                })
            })
            .collect();
        let mut labels = serde_json::Map::new();
        if rng.u8(..6) != 0 {
            labels.insert(
                "kubernetes.io/service-name".into(),
                json!(format!("s{}", rng.usize(..6))),
            );
        }
        json!({
            "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
            "metadata": { "name": format!("e{i}"), "namespace": "default", "labels": labels },
            "addressType": if rng.u8(..8) == 0 { "FQDN" } else { "IPv4" },
            "ports": [
                { "name": "http", "port": 8080, "protocol": "TCP" },
                { "name": "dns", "port": 5353, "protocol": "UDP" }
            ],
            "endpoints": eps
        })
    }

    fn node(rng: &mut fastrand::Rng, i: usize) -> Value {
        let mut labels = serde_json::Map::new();
        if rng.u8(..5) == 0 {
            labels.insert(
                "node.kubernetes.io/exclude-from-external-load-balancers".into(),
                json!(""),
            );
        }
        json!({
            "kind": "Node", "apiVersion": "v1",
            "metadata": { "name": format!("n{i}"), "labels": labels },
            "status": {
                "addresses": [{ "type": "InternalIP", "address": format!("198.51.100.{}", i + 1) }],
                "conditions": [{ "type": "Ready", "status": if rng.u8(..4) == 0 { "False" } else { "True" } }]
            }
        })
    }

    fn make(rng: &mut fastrand::Rng, kind: Kind, i: usize) -> Value {
        match kind {
            Kind::Services => service(rng, i),
            Kind::EndpointSlices => slice(rng, i),
            Kind::Nodes => node(rng, i),
            Kind::AddressPools | Kind::Namespaces => unreachable!("no pool objects in this test"),
        }
    }

    const COUNTS: [(Kind, usize); 3] = [
        (Kind::Services, 6),
        (Kind::EndpointSlices, 8),
        (Kind::Nodes, 3),
    ];

    #[test]
    fn incremental_rounds_equal_a_full_translation() {
        for seed in 0..40 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut st = Settings::new(
                strait_config::parse("[[gateway.interfaces]]\nname = \"eth0\"\nqueues = [0]\n")
                    .unwrap()
                    .gateway,
            );
            st.mode = Mode::Nat;
            st.pools = vec!["203.0.113.16/29".parse().unwrap()];
            st.node_port_address = Some("203.0.113.50".parse().unwrap());
            let mut ctl = Controller::new(st);
            // What the API server holds.
            let mut cluster: BTreeMap<(u8, usize), Value> = BTreeMap::new();
            for (k, (kind, n)) in COUNTS.iter().enumerate() {
                ctl.apply(*kind, watcher::Event::Init);
                for i in 0..*n {
                    if rng.bool() {
                        let o = make(&mut rng, *kind, i);
                        cluster.insert((k as u8, i), o.clone());
                        ctl.apply(*kind, watcher::Event::InitApply(dynamic(o)));
                    }
                }
                ctl.apply(*kind, watcher::Event::InitDone);
            }
            let mut list: BTreeMap<String, Arc<model::Service>> = BTreeMap::new();
            for step in 0..60 {
                for _ in 0..rng.usize(1..4) {
                    let k = rng.usize(..3);
                    let (kind, n) = COUNTS[k];
                    let i = rng.usize(..n);
                    if rng.u8(..12) == 0 {
                        // A relist of this kind.
                        ctl.apply(kind, watcher::Event::Init);
                        for ((kk, _), o) in cluster.range((k as u8, 0)..(k as u8 + 1, 0)) {
                            debug_assert_eq!(*kk, k as u8);
                            ctl.apply(kind, watcher::Event::InitApply(dynamic(o.clone())));
                        }
                        ctl.apply(kind, watcher::Event::InitDone);
                    } else if rng.u8(..4) == 0 {
                        if let Some(o) = cluster.remove(&(k as u8, i)) {
                            ctl.apply(kind, watcher::Event::Delete(dynamic(o)));
                        }
                    } else {
                        let o = make(&mut rng, kind, i);
                        cluster.insert((k as u8, i), o.clone());
                        ctl.apply(kind, watcher::Event::Apply(dynamic(o)));
                    }
                }
                let r = ctl.reconcile().expect("listed");
                let full = ctl.translate_all();
                let got: Vec<model::Service> = r.services.iter().map(|s| (**s).clone()).collect();
                assert_eq!(got, full.services, "seed {seed} step {step}: services");
                let warnings: Vec<Warning> = r
                    .warnings
                    .iter()
                    .filter(|w| w.kind != WarningKind::Malformed)
                    .cloned()
                    .collect();
                assert_eq!(warnings, full.warnings, "seed {seed} step {step}: warnings");
                // The changes turn the previous list into this one.
                for (name, s) in &r.changes {
                    match s {
                        Some(s) => {
                            list.insert(name.clone(), Arc::clone(s));
                        }
                        None => {
                            list.remove(name);
                        }
                    }
                }
                let listed: Vec<model::Service> = list.values().map(|s| (**s).clone()).collect();
                assert_eq!(listed, got, "seed {seed} step {step}: changes");
                assert_eq!(r.changed, step == 0 || !r.changes.is_empty());
            }
        }
    }
}
