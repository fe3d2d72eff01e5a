//! From Kubernetes objects to Strait services: pure, no IO.
//!
//! ```text
//! Service ──┬─ frontends: LoadBalancer addresses (owned class, from the address plan),
//!           │             spec.externalIPs (owned Services, or all if asked),
//!           │             nodeport address:nodePort (type NodePort)
//!           ├─ × ports (TCP, UDP; SCTP skipped)           one strait Service per
//!           │                                              (frontend, port, protocol)
//! EndpointSlice ─┬─ nat:   ready → active, serving+terminating → draining, others out
//!                └─ dsr-*: the nodes (all, or those holding an endpoint under
//! Node ──────────────────  externalTrafficPolicy: Local, health-checked on
//!                          healthCheckNodePort /healthz)
//!           └─ validated with the configuration crate's own rules
//! ```
//!
//! Whatever cannot be used (an FQDN slice, a missing port, an address that does not
//! parse, an SCTP port, a frontend another Service already serves) is left out with a
//! [`Warning`] of a countable [`WarningKind`]; nothing here panics on what the API server
//! sends. When two Services claim one frontend the older one keeps it, so a newcomer
//! cannot take over a running Service's traffic.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use strait_config::model::{self, Backend, BackendState, HealthCheck, HealthKind, Mode, Protocol};
use strait_dataplane::maglev;

use super::settings::{Settings, MODE_ANNOTATION};

/// The objects translation reads, keyed by `namespace/name` (Nodes by name).
#[derive(Debug, Clone, Copy)]
pub struct Cluster<'a> {
    /// Services.
    pub services: &'a BTreeMap<String, Service>,
    /// EndpointSlices (`discovery.k8s.io/v1`).
    pub slices: &'a BTreeMap<String, EndpointSlice>,
    /// Nodes.
    pub nodes: &'a BTreeMap<String, Node>,
}

/// Why something was left out. Each kind is a metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WarningKind {
    /// A Service port with a protocol other than TCP and UDP (SCTP).
    UnsupportedProtocol,
    /// A port, nodePort or slice port that is missing or out of range.
    BadPort,
    /// An address (external IP, endpoint, node) that does not parse or has the wrong
    /// family.
    BadAddress,
    /// An EndpointSlice of addressType FQDN (or unknown).
    UnsupportedSlice,
    /// An EndpointSlice above the API's 1000 endpoints.
    HugeSlice,
    /// An EndpointSlice without ports.
    SliceWithoutPorts,
    /// A `loadBalancerSourceRanges` entry that does not parse, or a frontend left out
    /// because its family has no allowed range.
    BadSourceRange,
    /// A bad annotation or field value that was replaced by the default.
    BadValue,
    /// A frontend (address, port, protocol) already served by another Service.
    FrontendConflict,
    /// More backends than the largest Maglev table holds.
    TooManyBackends,
    /// A Node without an InternalIP.
    NodeWithoutAddress,
    /// A produced service the configuration rules refused.
    Invalid,
    /// An object that does not parse as its kind.
    Malformed,
}

impl WarningKind {
    /// Every kind.
    pub const ALL: [WarningKind; 13] = [
        WarningKind::UnsupportedProtocol,
        WarningKind::BadPort,
        WarningKind::BadAddress,
        WarningKind::UnsupportedSlice,
        WarningKind::HugeSlice,
        WarningKind::SliceWithoutPorts,
        WarningKind::BadSourceRange,
        WarningKind::BadValue,
        WarningKind::FrontendConflict,
        WarningKind::TooManyBackends,
        WarningKind::NodeWithoutAddress,
        WarningKind::Invalid,
        WarningKind::Malformed,
    ];

    /// The metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            WarningKind::UnsupportedProtocol => "unsupported_protocol",
            WarningKind::BadPort => "bad_port",
            WarningKind::BadAddress => "bad_address",
            WarningKind::UnsupportedSlice => "unsupported_slice",
            WarningKind::HugeSlice => "huge_slice",
            WarningKind::SliceWithoutPorts => "slice_without_ports",
            WarningKind::BadSourceRange => "bad_source_range",
            WarningKind::BadValue => "bad_value",
            WarningKind::FrontendConflict => "frontend_conflict",
            WarningKind::TooManyBackends => "too_many_backends",
            WarningKind::NodeWithoutAddress => "node_without_address",
            WarningKind::Invalid => "invalid",
            WarningKind::Malformed => "malformed",
        }
    }
}

/// Something left out of the translation, and why.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Warning {
    /// The kind, for counting.
    pub kind: WarningKind,
    /// The object (`service default/web`, `endpointslice default/web-abc`, `node n1`).
    pub object: String,
    /// What was wrong.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.message)
    }
}

/// What translation made.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Translation {
    /// The services, sorted by name, each valid by the configuration's rules and together
    /// free of name and frontend clashes.
    pub services: Vec<model::Service>,
    /// What was left out.
    pub warnings: Vec<Warning>,
}

/// Most endpoints one EndpointSlice may hold (the API's validation limit); a larger slice
/// did not come from a conforming API server and is left out whole.
pub const MAX_SLICE_ENDPOINTS: usize = 1000;

/// Path of kube-proxy's health-check node port: 200 while the node has local endpoints,
/// 503 otherwise.
pub const HEALTH_CHECK_NODE_PORT_PATH: &str = "/healthz";

/// Label linking an EndpointSlice to its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Nodes with this label are never load-balancer backends (as for cloud providers).
const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// Annotation cloud providers read when `spec.loadBalancerSourceRanges` is empty.
const SOURCE_RANGES_ANNOTATION: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";

/// Whether this gateway owns a LoadBalancer Service: its class is ours, or it has none and
/// class-less Services are taken.
pub fn owns(settings: &Settings, svc: &Service) -> bool {
    let Some(spec) = &svc.spec else { return false };
    if spec.type_.as_deref() != Some("LoadBalancer") {
        return false;
    }
    match spec.load_balancer_class.as_deref() {
        Some(c) => c == settings.class,
        None => settings.classless,
    }
}

/// Services sorted oldest first (then by key): the order in which contested addresses and
/// frontends are given out.
pub fn by_age(services: &BTreeMap<String, Service>) -> Vec<(&String, &Service)> {
    let mut v: Vec<_> = services.iter().collect();
    v.sort_by(|(ka, a), (kb, b)| {
        let ta = a.metadata.creation_timestamp.as_ref();
        let tb = b.metadata.creation_timestamp.as_ref();
        (ta.is_none(), ta, ka).cmp(&(tb.is_none(), tb, kb))
    });
    v
}

/// Translates the cluster. `lb` holds the LoadBalancer addresses of each owned Service
/// (from [`super::pool::plan`]). The same as an [`Incremental`] fed everything at once.
pub fn translate(
    settings: &Settings,
    cluster: Cluster<'_>,
    lb: &BTreeMap<String, Vec<IpAddr>>,
) -> Translation {
    let mut inc = Incremental::default();
    inc.set_nodes(cluster.nodes);
    inc.reset_slices(cluster.slices);
    inc.update(
        settings,
        cluster,
        lb,
        cluster.services.keys().cloned().collect(),
    );
    Translation {
        services: inc.services().map(|s| (**s).clone()).collect(),
        warnings: inc.warnings(),
    }
}

/// A frontend (address, port, protocol), ordered for the sets below.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Front(IpAddr, u16, Protocol);

impl Ord for Front {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.0, self.1, self.2.number()).cmp(&(o.0, o.1, o.2.number()))
    }
}

impl PartialOrd for Front {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

/// The order in which Services get contested frontends and names: oldest first, then by
/// key (see [`by_age`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Age {
    unknown: bool,
    created: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    key: String,
}

impl Age {
    fn of(key: &str, svc: &Service) -> Self {
        let created = svc.metadata.creation_timestamp.clone();
        Self {
            unknown: created.is_none(),
            created,
            key: key.to_owned(),
        }
    }
}

/// One Strait service a Service asks for, before frontends are given out: valid by the
/// configuration's rules on its own, or the rules it breaks.
#[derive(Debug, Clone)]
struct Candidate {
    front: Front,
    checked: Result<Arc<model::Service>, Vec<Warning>>,
}

/// What one Service translates to on its own.
#[derive(Debug)]
struct Entry {
    age: Age,
    candidates: Vec<Candidate>,
    warnings: Vec<Warning>,
    /// Whether its backends are nodes (a `dsr-*` Service), so Node changes touch it.
    uses_nodes: bool,
}

impl Entry {
    fn candidate(&self, f: Front) -> Option<&Candidate> {
        self.candidates.iter().find(|c| c.front == f)
    }
}

/// Which Service holds a frontend, and the name of its service if that is valid.
#[derive(Debug, Clone)]
struct Won {
    age: Age,
    name: Option<String>,
}

/// One change to the translated list: a service (by name) set or gone.
pub type Change = (String, Option<Arc<model::Service>>);

/// The translation kept between rounds, so that a change re-translates only the Services
/// it touches.
///
/// ```text
/// Service key ─► Entry (candidates, each checked on its own; warnings)   re-made when dirty
/// frontend    ─► contenders by age ─► the oldest wins                     re-decided when a
/// name        ─► valid winners by age ─► the oldest is published          contender changes
/// ```
///
/// The caller says which Services are dirty: a Service that changed, the Services named
/// by a changed EndpointSlice ([`Incremental::set_slice`]), the `dsr-*` Services when
/// Nodes change ([`Incremental::set_nodes`]), those whose addresses changed. Fed every
/// Service at once it gives what [`translate`] gives (which is made that way).
#[derive(Debug, Default)]
pub struct Incremental {
    nodes: BTreeMap<String, NodeInfo>,
    node_warnings: Vec<Warning>,
    /// Usable slice key -> key of the Service it is labelled for.
    slice_owner: HashMap<String, String>,
    /// Service key -> its usable slices.
    slices_of: HashMap<String, BTreeSet<String>>,
    slice_warnings: BTreeMap<String, Warning>,
    entries: HashMap<String, Entry>,
    /// Entries with warnings.
    warned: BTreeSet<String>,
    claims: HashMap<Front, BTreeSet<Age>>,
    /// Frontends with more than one contender.
    contested: BTreeSet<Front>,
    won: HashMap<Front, Won>,
    /// Won frontends whose service is invalid: the rules it breaks.
    invalid: HashMap<Front, Vec<Warning>>,
    names: HashMap<String, BTreeSet<(Age, Front)>>,
    /// Names with more than one valid contender.
    doubled: BTreeSet<String>,
    out: BTreeMap<String, Arc<model::Service>>,
}

impl Incremental {
    /// The translated services, sorted by name.
    pub fn services(&self) -> impl ExactSizeIterator<Item = &Arc<model::Service>> {
        self.out.values()
    }

    /// Everything left out, sorted, each once.
    pub fn warnings(&self) -> Vec<Warning> {
        let mut w: Vec<Warning> = self.node_warnings.clone();
        w.extend(self.slice_warnings.values().cloned());
        for key in &self.warned {
            if let Some(e) = self.entries.get(key) {
                w.extend(e.warnings.iter().cloned());
            }
        }
        for f in &self.contested {
            let Some(set) = self.claims.get(f) else {
                continue;
            };
            let mut it = set.iter();
            let Some(winner) = it.next() else { continue };
            for loser in it {
                w.push(Warning {
                    kind: WarningKind::FrontendConflict,
                    object: format!("service {}", loser.key),
                    message: format!(
                        "{} {} is already served for {}",
                        std::net::SocketAddr::new(f.0, f.1),
                        f.2,
                        winner.key
                    ),
                });
            }
        }
        for v in self.invalid.values() {
            w.extend(v.iter().cloned());
        }
        for name in &self.doubled {
            let Some(set) = self.names.get(name) else {
                continue;
            };
            let mut it = set.iter();
            let Some((first, _)) = it.next() else {
                continue;
            };
            for (age, _) in it {
                w.push(Warning {
                    kind: WarningKind::Invalid,
                    object: format!("service {name}"),
                    message: format!(
                        "name {name:?} of service {} is already used by a service of {}",
                        age.key, first.key
                    ),
                });
            }
        }
        w.sort();
        w.dedup();
        w
    }

    /// Takes the Nodes as they are now; returns the keys of the Services whose backends
    /// are nodes (to mark dirty).
    pub fn set_nodes(&mut self, nodes: &BTreeMap<String, Node>) -> Vec<String> {
        let (index, warnings) = index_nodes(nodes);
        self.nodes = index;
        self.node_warnings = warnings;
        self.entries
            .iter()
            .filter(|(_, e)| e.uses_nodes)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Takes EndpointSlice `key` as it is now (`None`: deleted or unparsable); returns the
    /// keys of the Services it was and is labelled for (to mark dirty).
    pub fn set_slice(&mut self, key: &str, slice: Option<&EndpointSlice>) -> Vec<String> {
        let mut touched = Vec::new();
        if let Some(old) = self.slice_owner.remove(key) {
            if let Some(set) = self.slices_of.get_mut(&old) {
                set.remove(key);
                if set.is_empty() {
                    self.slices_of.remove(&old);
                }
            }
            touched.push(old);
        }
        self.slice_warnings.remove(key);
        if let Some(slice) = slice {
            match slice_use(key, slice) {
                SliceUse::Unlabelled => {}
                SliceUse::Unusable(w) => {
                    self.slice_warnings.insert(key.to_owned(), w);
                }
                SliceUse::For(owner) => {
                    self.slices_of
                        .entry(owner.clone())
                        .or_default()
                        .insert(key.to_owned());
                    self.slice_owner.insert(key.to_owned(), owner.clone());
                    touched.push(owner);
                }
            }
        }
        touched
    }

    /// Takes every EndpointSlice anew (after a relist).
    pub fn reset_slices(&mut self, slices: &BTreeMap<String, EndpointSlice>) {
        self.slice_owner.clear();
        self.slices_of.clear();
        self.slice_warnings.clear();
        for (key, slice) in slices {
            self.set_slice(key, Some(slice));
        }
    }

    /// Keys of every Service translated (those that made a service or a warning).
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.entries.keys()
    }

    /// Re-translates the Services `dirty` (keys; those not in `cluster` are dropped) and
    /// re-decides the frontends and names they contend for. Returns the changes to the
    /// list of [`Incremental::services`], by name.
    pub fn update(
        &mut self,
        settings: &Settings,
        cluster: Cluster<'_>,
        lb: &BTreeMap<String, Vec<IpAddr>>,
        dirty: BTreeSet<String>,
    ) -> Vec<Change> {
        let mut fronts: BTreeSet<Front> = BTreeSet::new();
        for key in dirty {
            if let Some(old) = self.entries.remove(&key) {
                for c in &old.candidates {
                    if let Some(set) = self.claims.get_mut(&c.front) {
                        set.remove(&old.age);
                        if set.is_empty() {
                            self.claims.remove(&c.front);
                        }
                    }
                    fronts.insert(c.front);
                }
                self.warned.remove(&key);
            }
            let Some(svc) = cluster.services.get(&key) else {
                continue;
            };
            let vips = lb.get(&key).map(Vec::as_slice).unwrap_or(&[]);
            let entry = self.translate_one(settings, cluster.slices, &key, svc, vips);
            if entry.candidates.is_empty() && entry.warnings.is_empty() && !entry.uses_nodes {
                continue;
            }
            for c in &entry.candidates {
                self.claims
                    .entry(c.front)
                    .or_default()
                    .insert(entry.age.clone());
                fronts.insert(c.front);
            }
            if !entry.warnings.is_empty() {
                self.warned.insert(key.clone());
            }
            self.entries.insert(key, entry);
        }
        // Who holds each touched frontend now.
        let mut names: BTreeSet<String> = BTreeSet::new();
        for f in fronts {
            let contenders = self.claims.get(&f).map_or(0, BTreeSet::len);
            if contenders > 1 {
                self.contested.insert(f);
            } else {
                self.contested.remove(&f);
            }
            if let Some(Won {
                age,
                name: Some(name),
            }) = self.won.remove(&f)
            {
                if let Some(set) = self.names.get_mut(&name) {
                    set.remove(&(age, f));
                }
                names.insert(name);
            }
            self.invalid.remove(&f);
            let winner = self.claims.get(&f).and_then(|s| s.first()).and_then(|age| {
                let c = self.entries.get(&age.key)?.candidate(f)?;
                Some((age.clone(), c.checked.clone()))
            });
            let Some((age, checked)) = winner else {
                continue;
            };
            match checked {
                Ok(s) => {
                    self.names
                        .entry(s.name.clone())
                        .or_default()
                        .insert((age.clone(), f));
                    names.insert(s.name.clone());
                    self.won.insert(
                        f,
                        Won {
                            age,
                            name: Some(s.name.clone()),
                        },
                    );
                }
                Err(w) => {
                    self.invalid.insert(f, w);
                    self.won.insert(f, Won { age, name: None });
                }
            }
        }
        // Which service each touched name publishes now.
        let mut changes = Vec::new();
        for name in names {
            let first = self.names.get(&name).and_then(|s| {
                if s.len() > 1 {
                    self.doubled.insert(name.clone());
                } else {
                    self.doubled.remove(&name);
                }
                s.first().cloned()
            });
            if first.is_none() {
                self.names.remove(&name);
            }
            let new = first.and_then(|(age, f)| {
                let c = self.entries.get(&age.key)?.candidate(f)?;
                c.checked.as_ref().ok().cloned()
            });
            match (self.out.get(&name), new) {
                (Some(o), Some(n)) if **o == *n => {}
                (None, None) => {}
                (_, Some(n)) => {
                    self.out.insert(name.clone(), Arc::clone(&n));
                    changes.push((name, Some(n)));
                }
                (Some(_), None) => {
                    self.out.remove(&name);
                    changes.push((name, None));
                }
            }
        }
        changes
    }

    fn translate_one(
        &self,
        settings: &Settings,
        slices: &BTreeMap<String, EndpointSlice>,
        key: &str,
        svc: &Service,
        vips: &[IpAddr],
    ) -> Entry {
        let ns = svc.metadata.namespace.as_deref().unwrap_or("");
        let name = svc.metadata.name.as_deref().unwrap_or("");
        let mut t = Translator {
            settings,
            warnings: Vec::new(),
            nodes: &self.nodes,
            slices: HashMap::new(),
            seen: HashSet::new(),
            out: Vec::new(),
            uses_nodes: false,
        };
        let list: Vec<(&str, &EndpointSlice)> = self
            .slices_of
            .get(&owner_key(ns, name))
            .into_iter()
            .flatten()
            .filter_map(|k| slices.get_key_value(k).map(|(k, s)| (k.as_str(), s)))
            .collect();
        if !list.is_empty() {
            t.slices.insert((ns, name), list);
        }
        t.service(key, svc, vips);
        let Translator {
            warnings,
            out,
            uses_nodes,
            ..
        } = t;
        Entry {
            age: Age::of(key, svc),
            candidates: out,
            warnings,
            uses_nodes,
        }
    }
}

/// The key of the Service `name` in namespace `ns` (as [`super::object_key`] makes it).
fn owner_key(ns: &str, name: &str) -> String {
    if ns.is_empty() {
        name.to_owned()
    } else {
        format!("{ns}/{name}")
    }
}

/// What translation needs of a Node.
#[derive(Debug)]
struct NodeInfo {
    v4: Option<IpAddr>,
    v6: Option<IpAddr>,
    ready: bool,
}

/// One endpoint of one Service port.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Ep<'a> {
    addr: IpAddr,
    port: u16,
    state: BackendState,
    node: Option<&'a str>,
}

/// Where a frontend's address comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    LoadBalancer,
    External,
    NodePort,
}

/// Translates one Service.
struct Translator<'a> {
    settings: &'a Settings,
    warnings: Vec<Warning>,
    nodes: &'a BTreeMap<String, NodeInfo>,
    /// Usable slices by (namespace, service name).
    slices: HashMap<(&'a str, &'a str), Vec<(&'a str, &'a EndpointSlice)>>,
    /// Frontends this Service asked for so far (a second ask is left out silently).
    seen: HashSet<Front>,
    out: Vec<Candidate>,
    uses_nodes: bool,
}

/// The usable Nodes by name, and warnings for the others.
fn index_nodes(nodes: &BTreeMap<String, Node>) -> (BTreeMap<String, NodeInfo>, Vec<Warning>) {
    let mut index = BTreeMap::new();
    let mut warnings = Vec::new();
    for (name, node) in nodes {
        let excluded = node
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(EXCLUDE_LABEL));
        if excluded {
            continue;
        }
        let status = node.status.as_ref();
        let mut info = NodeInfo {
            v4: None,
            v6: None,
            ready: status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .is_none_or(|c| c.status == "True"),
        };
        let internal = status
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter(|a| a.type_ == "InternalIP");
        for a in internal {
            match a.address.trim().parse::<IpAddr>() {
                Ok(ip @ IpAddr::V4(_)) => {
                    info.v4.get_or_insert(ip);
                }
                Ok(ip @ IpAddr::V6(_)) => {
                    info.v6.get_or_insert(ip);
                }
                Err(_) => warnings.push(Warning {
                    kind: WarningKind::BadAddress,
                    object: format!("node {name}"),
                    message: format!("InternalIP {:?} is not an IP address", a.address),
                }),
            }
        }
        if info.v4.is_none() && info.v6.is_none() {
            warnings.push(Warning {
                kind: WarningKind::NodeWithoutAddress,
                object: format!("node {name}"),
                message: "no InternalIP; not a backend".to_owned(),
            });
            continue;
        }
        index.insert(name.clone(), info);
    }
    (index, warnings)
}

/// What an EndpointSlice is to translation.
enum SliceUse {
    /// Not managed for a Service: nothing reads it.
    Unlabelled,
    /// Left out whole, for this reason.
    Unusable(Warning),
    /// Usable, for the Service of this key.
    For(String),
}

fn slice_use(key: &str, slice: &EndpointSlice) -> SliceUse {
    let Some(svc) = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL))
    else {
        return SliceUse::Unlabelled;
    };
    let object = format!("endpointslice {key}");
    let warn = |kind, message: String| {
        SliceUse::Unusable(Warning {
            kind,
            object: object.clone(),
            message,
        })
    };
    if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
        return warn(
            WarningKind::UnsupportedSlice,
            format!("addressType {:?} is not served", slice.address_type),
        );
    }
    if slice.endpoints.len() > MAX_SLICE_ENDPOINTS {
        return warn(
            WarningKind::HugeSlice,
            format!(
                "{} endpoints, more than the API's {MAX_SLICE_ENDPOINTS}; left out",
                slice.endpoints.len()
            ),
        );
    }
    if slice.ports.as_ref().is_none_or(Vec::is_empty) {
        return warn(
            WarningKind::SliceWithoutPorts,
            "no ports; left out".to_owned(),
        );
    }
    let ns = slice.metadata.namespace.as_deref().unwrap_or("");
    SliceUse::For(owner_key(ns, svc))
}

impl<'a> Translator<'a> {
    fn warn(&mut self, kind: WarningKind, object: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(Warning {
            kind,
            object: object.into(),
            message: message.into(),
        });
    }

    /// The endpoints of one Service port across its slices, each `(address, port)` once
    /// (the best state wins when slices disagree, as during a slice's replacement).
    fn endpoints(
        &mut self,
        ns: &str,
        name: &str,
        port: &ServicePort,
        protocol: Protocol,
        publish_not_ready: bool,
    ) -> Vec<Ep<'a>> {
        let want_name = port.name.as_deref().unwrap_or("");
        let slices = self.slices.get(&(ns, name)).cloned().unwrap_or_default();
        let mut out: Vec<Ep<'a>> = Vec::new();
        let mut index: HashMap<(IpAddr, u16), usize> = HashMap::new();
        for (key, slice) in slices {
            let object = format!("endpointslice {key}");
            let Some(sp) = slice.ports.iter().flatten().find(|p| {
                p.name.as_deref().unwrap_or("") == want_name
                    && protocol_of(p.protocol.as_deref()) == Some(protocol)
            }) else {
                continue;
            };
            let Some(number) = sp
                .port
                .and_then(|p| u16::try_from(p).ok())
                .filter(|&p| p != 0)
            else {
                self.warn(
                    WarningKind::BadPort,
                    object,
                    format!("port {want_name:?} has no usable number ({:?})", sp.port),
                );
                continue;
            };
            let v6 = slice.address_type == "IPv6";
            for ep in &slice.endpoints {
                let Some(state) = state(ep, publish_not_ready) else {
                    continue;
                };
                let Some(first) = ep.addresses.first() else {
                    self.warn(
                        WarningKind::BadAddress,
                        &object,
                        "endpoint without addresses",
                    );
                    continue;
                };
                let addr = match first.trim().parse::<IpAddr>() {
                    Ok(a) if a.is_ipv6() == v6 => a,
                    _ => {
                        self.warn(
                            WarningKind::BadAddress,
                            &object,
                            format!(
                                "endpoint {first:?} is not an {} address",
                                slice.address_type
                            ),
                        );
                        continue;
                    }
                };
                let e = Ep {
                    addr,
                    port: number,
                    state,
                    node: ep.node_name.as_deref(),
                };
                match index.get(&(addr, number)) {
                    Some(&i) => {
                        if state == BackendState::Active {
                            out[i].state = BackendState::Active;
                        }
                    }
                    None => {
                        index.insert((addr, number), out.len());
                        out.push(e);
                    }
                }
            }
        }
        out
    }

    fn service(&mut self, key: &str, svc: &'a Service, lb_vips: &[IpAddr]) {
        let object = format!("service {key}");
        let Some(spec) = &svc.spec else { return };
        let ty = spec.type_.as_deref().unwrap_or("ClusterIP");
        if ty == "ExternalName" {
            return;
        }
        let ns = svc.metadata.namespace.as_deref().unwrap_or("");
        let name = svc.metadata.name.as_deref().unwrap_or("");

        let mut frontends: Vec<(IpAddr, Kind)> =
            lb_vips.iter().map(|&a| (a, Kind::LoadBalancer)).collect();
        if self.settings.all_external_ips || owns(self.settings, svc) {
            for e in spec.external_ips.iter().flatten() {
                match e.trim().parse::<IpAddr>() {
                    Ok(a) if !frontends.iter().any(|(f, _)| *f == a) => {
                        frontends.push((a, Kind::External));
                    }
                    Ok(_) => {}
                    Err(_) => self.warn(
                        WarningKind::BadAddress,
                        &object,
                        format!("externalIP {e:?} is not an IP address"),
                    ),
                }
            }
        }
        if ty == "NodePort" {
            if let Some(a) = self.settings.node_port_address {
                frontends.push((a, Kind::NodePort));
            }
        }
        if frontends.is_empty() {
            return;
        }

        let mode = match svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MODE_ANNOTATION))
        {
            None => self.settings.mode,
            Some(m) => m.trim().parse::<Mode>().unwrap_or_else(|e| {
                self.warn(
                    WarningKind::BadValue,
                    &object,
                    format!(
                        "annotation {MODE_ANNOTATION}: {e}; using {}",
                        self.settings.mode
                    ),
                );
                self.settings.mode
            }),
        };
        self.uses_nodes = mode.is_dsr();
        let local = spec.external_traffic_policy.as_deref() == Some("Local");
        let publish_not_ready = spec.publish_not_ready_addresses == Some(true);
        let affinity = self.affinity(&object, spec);
        let ranges = self.source_ranges(&object, svc);
        let hc_port = spec
            .health_check_node_port
            .and_then(|p| u16::try_from(p).ok())
            .filter(|&p| p != 0);

        for port in spec.ports.iter().flatten() {
            let Some(protocol) = protocol_of(port.protocol.as_deref()) else {
                self.warn(
                    WarningKind::UnsupportedProtocol,
                    &object,
                    format!(
                        "port {} protocol {}: only TCP and UDP are served",
                        port.port,
                        port.protocol.as_deref().unwrap_or("")
                    ),
                );
                continue;
            };
            let Some(number) = u16::try_from(port.port).ok().filter(|&p| p != 0) else {
                self.warn(
                    WarningKind::BadPort,
                    &object,
                    format!("port {} is not a port number", port.port),
                );
                continue;
            };
            let pname = port
                .name
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| number.to_string());
            let eps = self.endpoints(ns, name, port, protocol, publish_not_ready);
            for &(vip, kind) in &frontends {
                let fport = match kind {
                    Kind::NodePort => {
                        match port
                            .node_port
                            .and_then(|p| u16::try_from(p).ok())
                            .filter(|&p| p != 0)
                        {
                            Some(p) => p,
                            None => {
                                self.warn(
                                    WarningKind::BadPort,
                                    &object,
                                    format!("port {pname} has no nodePort"),
                                );
                                continue;
                            }
                        }
                    }
                    Kind::LoadBalancer | Kind::External => number,
                };
                let source_ranges = if kind == Kind::LoadBalancer {
                    match ranges.for_family(vip) {
                        Some(r) => r,
                        None => {
                            self.warn(
                                WarningKind::BadSourceRange,
                                &object,
                                format!(
                                    "loadBalancerSourceRanges allow no {} client; frontend {vip} left out",
                                    if vip.is_ipv4() { "IPv4" } else { "IPv6" }
                                ),
                            );
                            continue;
                        }
                    }
                } else {
                    Vec::new()
                };
                let (backends, health_check) = if mode.is_dsr() {
                    let hc = if local {
                        hc_port.map(|p| http_check(p, HEALTH_CHECK_NODE_PORT_PATH))
                    } else {
                        self.settings
                            .cluster_node_check
                            .as_ref()
                            .map(|(p, path)| http_check(*p, path))
                    };
                    (
                        self.node_backends(vip, fport, mode, local.then_some(&eps[..])),
                        hc,
                    )
                } else {
                    (nat_backends(vip, &eps), None)
                };
                // Sized for the backends that take new flows (those the table is filled
                // with): terminating endpoints and NotReady nodes leaving during a rollout
                // do not push it across a size. The table still holds a slot per backend.
                let taking = backends
                    .iter()
                    .filter(|b| b.state == model::BackendState::Active && b.weight > 0)
                    .count();
                let Some(maglev_table_size) =
                    maglev::size_for(taking, self.settings.maglev_min_table_size)
                        .filter(|&size| size as usize >= backends.len())
                        .or_else(|| {
                            maglev::size_for(backends.len(), self.settings.maglev_min_table_size)
                        })
                else {
                    self.warn(
                        WarningKind::TooManyBackends,
                        &object,
                        format!(
                            "{} backends, more than Maglev's {}",
                            backends.len(),
                            maglev::LARGE_SIZE
                        ),
                    );
                    continue;
                };
                // Frontends other Services also ask for are given out later, by age.
                let front = Front(vip, fport, protocol);
                if !self.seen.insert(front) {
                    continue;
                }
                let suffix = match kind {
                    Kind::NodePort => "node-port".to_owned(),
                    Kind::LoadBalancer | Kind::External => vip.to_string(),
                };
                let service = model::Service {
                    name: sanitise(&format!("{ns}/{name}/{pname}/{suffix}")),
                    vip,
                    port: fport,
                    protocol,
                    mode,
                    maglev_table_size,
                    source_ranges,
                    session_affinity: affinity,
                    health_check,
                    backends,
                };
                self.out.push(Candidate {
                    front,
                    checked: check(&self.settings.gateway, service),
                });
            }
        }
    }

    /// DSR backends: nodes, at the frontend port. `local` holds the Service port's
    /// endpoints under `externalTrafficPolicy: Local`.
    fn node_backends(
        &self,
        vip: IpAddr,
        port: u16,
        mode: Mode,
        local: Option<&[Ep<'a>]>,
    ) -> Vec<Backend> {
        let address = |n: &NodeInfo| -> Option<IpAddr> {
            match (vip, mode.is_tunnel()) {
                (IpAddr::V4(_), false) => n.v4,
                (IpAddr::V6(_), _) => n.v6,
                // IPv4 in IPv6 is fine for the tunnels; IPv6 in IPv4 is not.
                (IpAddr::V4(_), true) => n.v4.or(n.v6),
            }
        };
        let mut out = Vec::new();
        match local {
            None => {
                for n in self.nodes.values() {
                    if let Some(a) = address(n) {
                        let state = if n.ready {
                            BackendState::Active
                        } else {
                            BackendState::Draining
                        };
                        out.push(backend(a, port, state));
                    }
                }
            }
            Some(eps) => {
                let mut best: BTreeMap<&str, BackendState> = BTreeMap::new();
                for e in eps {
                    let Some(node) = e.node else { continue };
                    let s = best.entry(node).or_insert(e.state);
                    if e.state == BackendState::Active {
                        *s = BackendState::Active;
                    }
                }
                for (node, state) in best {
                    if let Some(a) = self.nodes.get(node).and_then(address) {
                        out.push(backend(a, port, state));
                    }
                }
            }
        }
        dedup_backends(out)
    }

    fn affinity(
        &mut self,
        object: &str,
        spec: &k8s_openapi::api::core::v1::ServiceSpec,
    ) -> Option<Duration> {
        if spec.session_affinity.as_deref() != Some("ClientIP") {
            return None;
        }
        let secs = spec
            .session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds);
        let d = match secs {
            None => model::Service::DEFAULT_AFFINITY_TIMEOUT,
            Some(s) => {
                let d = Duration::from_secs(u64::try_from(s).unwrap_or(0));
                let clamped = d.clamp(
                    model::Service::MIN_AFFINITY_TIMEOUT,
                    model::Service::MAX_AFFINITY_TIMEOUT,
                );
                if clamped != d {
                    self.warn(
                        WarningKind::BadValue,
                        object,
                        format!(
                            "sessionAffinity timeoutSeconds {s} outside 1..=86400; using {}",
                            clamped.as_secs()
                        ),
                    );
                }
                clamped
            }
        };
        Some(d)
    }

    fn source_ranges(&mut self, object: &str, svc: &Service) -> Ranges {
        let field: Vec<String> = svc
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_source_ranges.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|s| !s.trim().is_empty())
            .collect();
        let raw: Vec<String> = if field.is_empty() {
            svc.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(SOURCE_RANGES_ANNOTATION))
                .map(|s| {
                    s.split(',')
                        .map(|p| p.trim().to_owned())
                        .filter(|p| !p.is_empty())
                        .collect()
                })
                .unwrap_or_default()
        } else {
            field
        };
        let mut nets = Vec::new();
        for r in &raw {
            match r.trim().parse::<IpNet>() {
                Ok(n) => nets.push(n.trunc()),
                Err(_) => self.warn(
                    WarningKind::BadSourceRange,
                    object,
                    format!("loadBalancerSourceRanges entry {r:?} is not a CIDR; ignored"),
                ),
            }
        }
        nets.sort();
        nets.dedup();
        Ranges {
            any_given: !raw.is_empty(),
            nets,
        }
    }
}

/// A Service's `loadBalancerSourceRanges`.
struct Ranges {
    any_given: bool,
    nets: Vec<IpNet>,
}

impl Ranges {
    /// The ranges of `vip`'s family; `None` when ranges were given but none of this
    /// family parsed, which allows no client of the family (never "every client").
    fn for_family(&self, vip: IpAddr) -> Option<Vec<IpNet>> {
        if !self.any_given {
            return Some(Vec::new());
        }
        let v: Vec<IpNet> = self
            .nets
            .iter()
            .filter(|n| n.addr().is_ipv4() == vip.is_ipv4())
            .copied()
            .collect();
        (!v.is_empty()).then_some(v)
    }
}

/// An endpoint's state: `ready` (nil = true) takes new flows; `serving` (nil = true) and
/// `terminating` (nil = false) keeps its flows; anything else is out. With
/// `publishNotReadyAddresses` every endpoint takes new flows.
fn state(ep: &Endpoint, publish_not_ready: bool) -> Option<BackendState> {
    if publish_not_ready {
        return Some(BackendState::Active);
    }
    let c = ep.conditions.as_ref();
    let ready = c.and_then(|c| c.ready).unwrap_or(true);
    let serving = c.and_then(|c| c.serving).unwrap_or(true);
    let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
    if ready {
        Some(BackendState::Active)
    } else if serving && terminating {
        Some(BackendState::Draining)
    } else {
        None
    }
}

fn protocol_of(p: Option<&str>) -> Option<Protocol> {
    match p.unwrap_or("TCP") {
        "TCP" => Some(Protocol::Tcp),
        "UDP" => Some(Protocol::Udp),
        _ => None,
    }
}

fn backend(address: IpAddr, port: u16, state: BackendState) -> Backend {
    Backend {
        address,
        port,
        weight: Backend::DEFAULT_WEIGHT,
        mac: None,
        tunnel: None,
        state,
    }
}

fn nat_backends(vip: IpAddr, eps: &[Ep<'_>]) -> Vec<Backend> {
    dedup_backends(
        eps.iter()
            .filter(|e| e.addr.is_ipv4() == vip.is_ipv4())
            .map(|e| backend(e.addr, e.port, e.state))
            .collect(),
    )
}

/// Sorted by address and port, each once (Active wins over Draining).
fn dedup_backends(mut v: Vec<Backend>) -> Vec<Backend> {
    v.sort_by_key(|b| (b.address, b.port, b.state != BackendState::Active));
    v.dedup_by_key(|b| (b.address, b.port));
    v
}

fn http_check(port: u16, path: &str) -> HealthCheck {
    HealthCheck {
        kind: HealthKind::Http {
            path: path.to_owned(),
        },
        port: Some(port),
        interval: HealthCheck::DEFAULT_INTERVAL,
        timeout: HealthCheck::DEFAULT_TIMEOUT,
        rise: HealthCheck::DEFAULT_RISE,
        fall: HealthCheck::DEFAULT_FALL,
    }
}

/// A service name the configuration accepts (`[a-z0-9-./_]+`): lower case, anything else
/// (the `:` of IPv6 addresses) as `-`.
pub fn sanitise(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || "-./_".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    if s.is_empty() {
        "-".to_owned()
    } else {
        s
    }
}

/// Checks one service by the configuration crate's rules for a service (with `gateway`,
/// whose MTU rule applies), without a TOML round trip. Each rule broken becomes a
/// [`WarningKind::Invalid`] warning naming it (paths relative to the service).
pub fn check(
    gateway: &model::Gateway,
    service: model::Service,
) -> Result<Arc<model::Service>, Vec<Warning>> {
    match strait_config::check_service(gateway, &service, 0) {
        Ok(s) => Ok(Arc::new(s)),
        Err(problems) => Err(problems
            .iter()
            .map(|p| {
                let path = p
                    .path
                    .strip_prefix("services[0]")
                    .map(|r| r.trim_start_matches('.'))
                    .unwrap_or(&p.path);
                Warning {
                    kind: WarningKind::Invalid,
                    object: format!("service {}", service.name),
                    message: if path.is_empty() {
                        p.message.clone()
                    } else {
                        format!("{path}: {}", p.message)
                    },
                }
            })
            .collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_sanitised() {
        assert_eq!(
            sanitise("default/web/http/2001:db8::1"),
            "default/web/http/2001-db8--1"
        );
        assert_eq!(sanitise("NS/Web Port"), "ns/web-port");
        assert_eq!(sanitise(""), "-");
    }

    #[test]
    fn endpoint_conditions() {
        use k8s_openapi::api::discovery::v1::EndpointConditions;
        let ep = |r, s, t| Endpoint {
            addresses: vec!["198.51.100.1".into()],
            conditions: Some(EndpointConditions {
                ready: r,
                serving: s,
                terminating: t,
            }),
            ..Default::default()
        };
        assert_eq!(
            state(&ep(None, None, None), false),
            Some(BackendState::Active)
        );
        assert_eq!(
            state(&ep(Some(false), Some(true), Some(true)), false),
            Some(BackendState::Draining)
        );
        assert_eq!(
            state(&ep(Some(false), None, Some(true)), false),
            Some(BackendState::Draining)
        );
        assert_eq!(
            state(&ep(Some(false), Some(false), Some(true)), false),
            None
        );
        assert_eq!(state(&ep(Some(false), None, None), false), None);
        assert_eq!(
            state(&ep(Some(false), None, None), true),
            Some(BackendState::Active)
        );
        let no_conditions = Endpoint {
            addresses: vec!["198.51.100.1".into()],
            ..Default::default()
        };
        assert_eq!(state(&no_conditions, false), Some(BackendState::Active));
    }
}
