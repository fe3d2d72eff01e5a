//! The pure part of the Kubernetes source: the stores of watched objects, the address
//! plan, the translation and the status wanted, one reconcile round at a time. Feed it
//! kube-rs watcher events (hand-made ones in tests and benches), ask it for a [`Round`];
//! it opens no connection and writes nothing: `crate::kube::watch` drives it from the API
//! server and makes the writes a round asks for.
//!
//! A lost connection changes nothing that was published: the stores keep the last
//! complete view, the gateway keeps forwarding on it, and kube-rs' watchers reconnect with
//! back-off, resuming from the last resource version or relisting on 410 Gone. Each
//! relist is built aside and swapped in only when complete, so objects deleted meanwhile
//! disappear then, and never before.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::DynamicObject;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use serde_json::Value;
use strait_config::model;

use super::crd::{self, PoolCondition, StraitAddressPool, StraitAddressPoolStatus};
use super::events::{Deduper, Notice, NoticeType};
use super::object_key;
use super::pool::{self, Allocator, Pool, StatusUpdate};
use super::settings::Settings;
use super::translate::{self, Change, Cluster, Incremental, Translation, Warning, WarningKind};

/// The kinds of object the source watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `v1` Services.
    Services,
    /// `discovery.k8s.io/v1` EndpointSlices.
    EndpointSlices,
    /// `v1` Nodes.
    Nodes,
    /// `strait.dev/v1alpha1` StraitAddressPools (watched with `--kube-pool-objects`).
    AddressPools,
    /// `v1` Namespaces (their labels, for pools' `namespaceSelectors`; watched with
    /// `--kube-pool-objects`).
    Namespaces,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 3] = [Kind::Services, Kind::EndpointSlices, Kind::Nodes];

    /// Every kind, the optional address pools too.
    pub const EVERY: [Kind; 5] = [
        Kind::Services,
        Kind::EndpointSlices,
        Kind::Nodes,
        Kind::AddressPools,
        Kind::Namespaces,
    ];

    /// The metrics label and log spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Services => "services",
            Kind::EndpointSlices => "endpointslices",
            Kind::Nodes => "nodes",
            Kind::AddressPools => "straitaddresspools",
            Kind::Namespaces => "namespaces",
        }
    }

    /// The kind's place in [`Kind::EVERY`] (an index into per-kind arrays).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One kind's objects: the live set, and a set being built during a (re)list.
///
/// An object that does not parse as its kind is left out and named in `bad` (a warning
/// each round). One that parsed before keeps its last good version in the live set: an
/// update the gateway cannot read (a field of a newer API version, say) does not take a
/// Service off the air or give its address to another, nor an EndpointSlice's endpoints
/// or a Node's address away; the object takes effect again once it parses, and goes when
/// it is deleted.
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

impl<T> Store<T> {
    /// A warning per object that does not parse, saying when its last good version stays
    /// in effect.
    fn malformed<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = Warning> + 'a {
        self.bad.iter().map(move |(key, err)| Warning {
            kind: WarningKind::Malformed,
            object: format!("{kind} {key}"),
            message: if self.live.contains_key(key) {
                format!("does not parse: {err}; its last good version stays in effect")
            } else {
                format!("does not parse: {err}")
            },
        })
    }
}

impl<T: DeserializeOwned + kube::Resource + Clone> Store<T> {
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
                let uid = o.metadata.uid.clone();
                match o.try_parse::<T>() {
                    Ok(v) => {
                        live.insert(key, v);
                    }
                    Err(e) => {
                        // The relist replaces the live set: carry its last good version, if
                        // it is this object's (not one deleted and made again under its name
                        // while the watch was away).
                        let same = |v: &&T| uid.is_some() && v.meta().uid == uid;
                        if let Some(v) = self.live.get(&key).filter(same) {
                            live.insert(key.clone(), v.clone());
                        }
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
                        // The live set keeps the last good version, if any.
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
        warnings.extend(
            self.services
                .malformed("service")
                .chain(self.slices.malformed("endpointslice"))
                .chain(self.nodes.malformed("node"))
                .chain(self.pool_objects.malformed("straitaddresspool")),
        );
        // What translation left out of a Service is an Event on it too, given once while it
        // stands (its own deduper: this runs every round, the plan's only when it is made).
        let mut left_out = Vec::new();
        for w in &warnings {
            if let Some(svc) = self.warned_service(&w.object) {
                // An update the gateway cannot read of a Service it does not serve (a
                // ClusterIP Service, another controller's load balancer) is not its to report.
                let served = || {
                    w.object
                        .strip_prefix("service ")
                        .is_some_and(|k| self.translation.publishes(k))
                };
                if w.kind == WarningKind::Malformed && !served() {
                    continue;
                }
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
