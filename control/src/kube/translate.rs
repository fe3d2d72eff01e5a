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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use strait_config::model::{self, Backend, BackendState, HealthCheck, HealthKind, Mode, Protocol};

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

/// Largest backend count for the default Maglev table (65537): the paper keeps the table
/// at least 100 times the backend count for balance within about 1 %.
pub const MAX_BACKENDS_SMALL_TABLE: usize = 655;

/// Maglev table size for more than [`MAX_BACKENDS_SMALL_TABLE`] backends (the paper's
/// large size).
pub const LARGE_TABLE: u32 = 655_373;

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
/// (from [`super::pool::plan`]).
pub fn translate(
    settings: &Settings,
    cluster: Cluster<'_>,
    lb: &BTreeMap<String, Vec<IpAddr>>,
) -> Translation {
    let mut t = Translator {
        settings,
        warnings: Vec::new(),
        nodes: BTreeMap::new(),
        slices: HashMap::new(),
        frontends: HashMap::new(),
        out: Vec::new(),
    };
    t.index_nodes(cluster.nodes);
    t.index_slices(cluster.slices);
    for (key, svc) in by_age(cluster.services) {
        let vips = lb.get(key).map(Vec::as_slice).unwrap_or(&[]);
        t.service(key, svc, vips);
    }
    let Translator {
        mut warnings,
        mut out,
        ..
    } = t;
    out.sort_by(|a, b| a.name.cmp(&b.name));
    let services = validate(&settings.gateway, out, &mut warnings);
    warnings.sort();
    warnings.dedup();
    Translation { services, warnings }
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

struct Translator<'a> {
    settings: &'a Settings,
    warnings: Vec<Warning>,
    nodes: BTreeMap<&'a str, NodeInfo>,
    /// Usable slices by (namespace, service name).
    slices: HashMap<(&'a str, &'a str), Vec<(&'a str, &'a EndpointSlice)>>,
    /// Frontends given out so far, and to whom.
    frontends: HashMap<(IpAddr, u16, Protocol), String>,
    out: Vec<model::Service>,
}

impl<'a> Translator<'a> {
    fn warn(&mut self, kind: WarningKind, object: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(Warning {
            kind,
            object: object.into(),
            message: message.into(),
        });
    }

    fn index_nodes(&mut self, nodes: &'a BTreeMap<String, Node>) {
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
                    Err(_) => self.warn(
                        WarningKind::BadAddress,
                        format!("node {name}"),
                        format!("InternalIP {:?} is not an IP address", a.address),
                    ),
                }
            }
            if info.v4.is_none() && info.v6.is_none() {
                self.warn(
                    WarningKind::NodeWithoutAddress,
                    format!("node {name}"),
                    "no InternalIP; not a backend",
                );
                continue;
            }
            self.nodes.insert(name.as_str(), info);
        }
    }

    fn index_slices(&mut self, slices: &'a BTreeMap<String, EndpointSlice>) {
        for (key, slice) in slices {
            let Some(svc) = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
            else {
                // Not managed for a Service: nothing here reads it.
                continue;
            };
            let object = format!("endpointslice {key}");
            if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
                self.warn(
                    WarningKind::UnsupportedSlice,
                    object,
                    format!("addressType {:?} is not served", slice.address_type),
                );
                continue;
            }
            if slice.endpoints.len() > MAX_SLICE_ENDPOINTS {
                self.warn(
                    WarningKind::HugeSlice,
                    object,
                    format!(
                        "{} endpoints, more than the API's {MAX_SLICE_ENDPOINTS}; left out",
                        slice.endpoints.len()
                    ),
                );
                continue;
            }
            if slice.ports.as_ref().is_none_or(Vec::is_empty) {
                self.warn(WarningKind::SliceWithoutPorts, object, "no ports; left out");
                continue;
            }
            let ns = slice.metadata.namespace.as_deref().unwrap_or("");
            self.slices
                .entry((ns, svc.as_str()))
                .or_default()
                .push((key.as_str(), slice));
        }
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
                let maglev_table_size = if backends.len() <= MAX_BACKENDS_SMALL_TABLE {
                    model::Service::DEFAULT_MAGLEV_TABLE_SIZE
                } else if backends.len() <= LARGE_TABLE as usize {
                    LARGE_TABLE
                } else {
                    self.warn(
                        WarningKind::TooManyBackends,
                        &object,
                        format!(
                            "{} backends, more than Maglev's {LARGE_TABLE}",
                            backends.len()
                        ),
                    );
                    continue;
                };
                let fkey = (vip, fport, protocol);
                if let Some(other) = self.frontends.get(&fkey) {
                    if other != key {
                        self.warn(
                            WarningKind::FrontendConflict,
                            &object,
                            format!(
                                "{} {protocol} is already served for {other}",
                                std::net::SocketAddr::new(vip, fport)
                            ),
                        );
                    }
                    continue;
                }
                self.frontends.insert(fkey, key.to_owned());
                let suffix = match kind {
                    Kind::NodePort => "node-port".to_owned(),
                    Kind::LoadBalancer | Kind::External => vip.to_string(),
                };
                self.out.push(model::Service {
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

/// Runs `services` through the configuration crate's validation (with `gateway`, whose
/// MTU and tunnel rules apply) and keeps those it accepts; each refusal becomes a
/// [`WarningKind::Invalid`] warning naming the rule.
pub fn validate(
    gateway: &model::Gateway,
    services: Vec<model::Service>,
    warnings: &mut Vec<Warning>,
) -> Vec<model::Service> {
    let check = |services: Vec<model::Service>| {
        let cfg = model::Config {
            gateway: gateway.clone(),
            services,
        };
        strait_config::parse(&strait_config::to_toml(&cfg)).map(|c| c.services)
    };
    let mut services = services;
    // Each round drops the services a problem names; a second round catches problems that
    // only the first round's survivors reveal. Problems that name no service fall back to
    // checking each service alone.
    for _ in 0..3 {
        let problems = match check(services.clone()) {
            Ok(valid) => return valid,
            Err(e) => e.problems().to_vec(),
        };
        let mut bad: HashSet<usize> = HashSet::new();
        let mut unplaced = false;
        for p in &problems {
            match service_index(&p.path) {
                Some(i) if i < services.len() => {
                    bad.insert(i);
                    warnings.push(Warning {
                        kind: WarningKind::Invalid,
                        object: format!("service {}", services[i].name),
                        message: p.to_string(),
                    });
                }
                _ => unplaced = true,
            }
        }
        if unplaced || bad.is_empty() {
            let mut kept = Vec::new();
            for s in services {
                match check(vec![s.clone()]) {
                    Ok(mut v) => kept.append(&mut v),
                    Err(e) => warnings.push(Warning {
                        kind: WarningKind::Invalid,
                        object: format!("service {}", s.name),
                        message: e.to_string().replace('\n', "; "),
                    }),
                }
            }
            return check(kept.clone()).unwrap_or_default();
        }
        services = services
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !bad.contains(i))
            .map(|(_, s)| s)
            .collect();
    }
    check(services).unwrap_or_default()
}

/// `services[12].backends[0].port` -> 12.
fn service_index(path: &str) -> Option<usize> {
    let rest = path.strip_prefix("services[")?;
    rest[..rest.find(']')?].parse().ok()
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
    fn service_index_from_problem_paths() {
        assert_eq!(service_index("services[12].backends[0].port"), Some(12));
        assert_eq!(service_index("services[3]"), Some(3));
        assert_eq!(service_index("gateway.mtu"), None);
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
