//! One Service to its Strait services: frontends (LoadBalancer addresses, external IPs, the
//! NodePort address) × ports, each with its backends (the endpoints under `nat`, the nodes
//! under `dsr-*`), mode, affinity, source ranges, health check and Maglev table size.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use strait_config::model::{self, Backend, BackendState, HealthCheck, HealthKind, Mode, Protocol};
use strait_dataplane::maglev;

use super::super::settings::{
    COMMUNITIES_ANNOTATION, LARGE_COMMUNITIES_ANNOTATION, LOCAL_PREF_ANNOTATION, MODE_ANNOTATION,
    SLOW_START_ANNOTATION,
};
use super::{
    check, owner_key, owns, sanitise, Candidate, Front, Settings, Warning, WarningKind,
    EXCLUDE_LABEL, HEALTH_CHECK_NODE_PORT_PATH, MAX_SLICE_ENDPOINTS, SERVICE_NAME_LABEL,
    SOURCE_RANGES_ANNOTATION,
};

/// What translation needs of a Node: its projection. A Node update that leaves it (and
/// the Node's warnings) as they were changes nothing Strait serves, and costs nothing.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct NodeInfo {
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

/// What a Service's ports share once its frontends are known.
struct Shape<'a> {
    namespace: &'a str,
    name: &'a str,
    mode: Mode,
    local: bool,
    publish_not_ready: bool,
    affinity: Option<Duration>,
    ranges: Ranges,
    health_check_node_port: Option<u16>,
    route: model::RouteAttrs,
    slow_start: Option<Duration>,
}

/// Which Nodes a Service's translation read.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) enum NodeUse {
    /// None: its backends are endpoints (`nat`), or it has no frontend.
    #[default]
    None,
    /// Every Node (`dsr-*` under `externalTrafficPolicy: Cluster`).
    All,
    /// The Nodes its endpoints name (`dsr-*` under `externalTrafficPolicy: Local`),
    /// whether or not such a Node exists yet.
    Named(BTreeSet<String>),
}

/// Translates one Service.
pub(super) struct Translator<'a> {
    settings: &'a Settings,
    warnings: Vec<Warning>,
    nodes: &'a BTreeMap<String, NodeInfo>,
    /// Usable slices by (namespace, service name).
    slices: HashMap<(&'a str, &'a str), Vec<(&'a str, &'a EndpointSlice)>>,
    /// Frontends this Service asked for so far (a second ask is left out silently).
    seen: HashSet<Front>,
    out: Vec<Candidate>,
    node_use: NodeUse,
}

/// The usable Nodes by name, and the warnings of each Node that has some.
pub(super) fn index_nodes(
    nodes: &BTreeMap<String, Node>,
) -> (BTreeMap<String, NodeInfo>, BTreeMap<String, Vec<Warning>>) {
    let mut index = BTreeMap::new();
    let mut warnings = BTreeMap::new();
    for (name, node) in nodes {
        let (info, w) = project_node(name, node);
        if let Some(info) = info {
            index.insert(name.clone(), info);
        }
        if !w.is_empty() {
            warnings.insert(name.clone(), w);
        }
    }
    (index, warnings)
}

/// What translation reads of Node `name`: `None` when it is no backend (excluded by
/// label, or without an InternalIP), and its warnings. Everything else of a Node (heartbeat
/// times, other conditions, capacity, images, other labels and annotations) is not read.
pub(super) fn project_node(name: &str, node: &Node) -> (Option<NodeInfo>, Vec<Warning>) {
    let mut warnings = Vec::new();
    let excluded = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(EXCLUDE_LABEL));
    if excluded {
        return (None, warnings);
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
        return (None, warnings);
    }
    (Some(info), warnings)
}

/// What an EndpointSlice is to translation.
pub(super) enum SliceUse {
    /// Not managed for a Service: nothing reads it.
    Unlabelled,
    /// Left out whole, for this reason.
    Unusable(Warning),
    /// Usable, for the Service of this key.
    For(String),
}

pub(super) fn slice_use(key: &str, slice: &EndpointSlice) -> SliceUse {
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
    /// A translator for the Service `(namespace, name)`, whose usable slices are `slices`.
    pub(super) fn new(
        settings: &'a Settings,
        nodes: &'a BTreeMap<String, NodeInfo>,
        service: (&'a str, &'a str),
        slices: Vec<(&'a str, &'a EndpointSlice)>,
    ) -> Self {
        let mut by_service = HashMap::new();
        if !slices.is_empty() {
            by_service.insert(service, slices);
        }
        Self {
            settings,
            warnings: Vec::new(),
            nodes,
            slices: by_service,
            seen: HashSet::new(),
            out: Vec::new(),
            node_use: NodeUse::None,
        }
    }

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

    /// Translates the Service `key`: its candidate services (one per frontend and port),
    /// the warnings, and which Nodes it read (a `dsr-*` Service's backends are nodes, so
    /// changes of those Nodes touch it). `lb_vips` are its LoadBalancer addresses from the
    /// address plan.
    pub(super) fn service(
        mut self,
        key: &str,
        svc: &'a Service,
        lb_vips: &[IpAddr],
    ) -> (Vec<Candidate>, Vec<Warning>, NodeUse) {
        self.add_service(key, svc, lb_vips);
        (self.out, self.warnings, self.node_use)
    }

    fn add_service(&mut self, key: &str, svc: &'a Service, lb_vips: &[IpAddr]) {
        let object = format!("service {key}");
        let Some(spec) = &svc.spec else { return };
        let ty = spec.type_.as_deref().unwrap_or("ClusterIP");
        if ty == "ExternalName" {
            return;
        }
        let frontends = self.frontends(&object, svc, ty == "NodePort", lb_vips);
        if frontends.is_empty() {
            return;
        }
        let mode = self.mode(&object, svc);
        let local = spec.external_traffic_policy.as_deref() == Some("Local");
        self.node_use = match (mode.is_dsr(), local) {
            (false, _) => NodeUse::None,
            (true, false) => NodeUse::All,
            (true, true) => NodeUse::Named(BTreeSet::new()),
        };
        let shape = Shape {
            namespace: svc.metadata.namespace.as_deref().unwrap_or(""),
            name: svc.metadata.name.as_deref().unwrap_or(""),
            mode,
            local,
            publish_not_ready: spec.publish_not_ready_addresses == Some(true),
            affinity: self.affinity(&object, spec),
            ranges: self.source_ranges(&object, svc),
            health_check_node_port: spec
                .health_check_node_port
                .and_then(|p| u16::try_from(p).ok())
                .filter(|&p| p != 0),
            route: self.route_attrs(&object, svc),
            slow_start: self.slow_start(&object, svc),
        };
        for port in spec.ports.iter().flatten() {
            self.port(&object, &shape, &frontends, port);
        }
    }

    /// The frontend addresses of a Service: its LoadBalancer addresses, its external IPs
    /// (when the Service is ours, or all are taken), and the NodePort address for a
    /// NodePort Service.
    fn frontends(
        &mut self,
        object: &str,
        svc: &Service,
        node_port: bool,
        lb_vips: &[IpAddr],
    ) -> Vec<(IpAddr, Kind)> {
        let mut frontends: Vec<(IpAddr, Kind)> =
            lb_vips.iter().map(|&a| (a, Kind::LoadBalancer)).collect();
        let external = svc.spec.as_ref().and_then(|s| s.external_ips.as_ref());
        if self.settings.all_external_ips || owns(self.settings, svc) {
            for e in external.into_iter().flatten() {
                match e.trim().parse::<IpAddr>() {
                    Ok(a) if !frontends.iter().any(|(f, _)| *f == a) => {
                        frontends.push((a, Kind::External));
                    }
                    Ok(_) => {}
                    Err(_) => self.warn(
                        WarningKind::BadAddress,
                        object,
                        format!("externalIP {e:?} is not an IP address"),
                    ),
                }
            }
        }
        if node_port {
            if let Some(a) = self.settings.node_port_address {
                frontends.push((a, Kind::NodePort));
            }
        }
        frontends
    }

    /// The BGP attributes of the route of the Service's VIPs, from its annotations
    /// ([`COMMUNITIES_ANNOTATION`], [`LARGE_COMMUNITIES_ANNOTATION`],
    /// [`LOCAL_PREF_ANNOTATION`]). A value that does not parse is left out with a warning.
    fn route_attrs(&mut self, object: &str, svc: &Service) -> model::RouteAttrs {
        let mut attrs = model::RouteAttrs::default();
        let Some(a) = svc.metadata.annotations.as_ref() else {
            return attrs;
        };
        let items = |name: &str| {
            a.get(name)
                .map(|v| {
                    v.split(',')
                        .map(str::trim)
                        .filter(|i| !i.is_empty())
                        .map(str::to_owned)
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        };
        let mut bad = Vec::new();
        for item in items(COMMUNITIES_ANNOTATION) {
            if let Some(large) = item.strip_prefix("large:") {
                match strait_config::parse_large_community(large) {
                    Some(t) => attrs.large_communities.push(t),
                    None => bad.push((COMMUNITIES_ANNOTATION, item)),
                }
            } else {
                match strait_config::parse_community(&item) {
                    Some(c) => attrs.communities.push(c),
                    None => bad.push((COMMUNITIES_ANNOTATION, item)),
                }
            }
        }
        for item in items(LARGE_COMMUNITIES_ANNOTATION) {
            match strait_config::parse_large_community(&item) {
                Some(t) => attrs.large_communities.push(t),
                None => bad.push((LARGE_COMMUNITIES_ANNOTATION, item)),
            }
        }
        if let Some(v) = a.get(LOCAL_PREF_ANNOTATION) {
            match v.trim().parse::<u32>() {
                Ok(p) => attrs.local_pref = Some(p),
                Err(_) => bad.push((LOCAL_PREF_ANNOTATION, v.clone())),
            }
        }
        for (name, item) in bad {
            self.warn(
                WarningKind::BadValue,
                object,
                format!("annotation {name}: {item:?} is not a community, large community or local preference of the expected form; left out"),
            );
        }
        let mut merged = model::RouteAttrs::default();
        merged.merge(&attrs);
        merged
    }

    /// The Service's slow start: its [`SLOW_START_ANNOTATION`], else none. A value the
    /// configuration file's `slow_start` would refuse is left out with a warning.
    fn slow_start(&mut self, object: &str, svc: &Service) -> Option<Duration> {
        let v = svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SLOW_START_ANNOTATION))?;
        match strait_config::parse_slow_start(v.trim()) {
            Ok(d) => Some(d),
            Err(why) => {
                self.warn(
                    WarningKind::BadValue,
                    object,
                    format!("annotation {SLOW_START_ANNOTATION}: {why}; no slow start"),
                );
                None
            }
        }
    }

    /// The Service's forwarding mode: its `strait.dev/mode` annotation, else the default.
    fn mode(&mut self, object: &str, svc: &Service) -> Mode {
        match svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MODE_ANNOTATION))
        {
            None => self.settings.mode,
            Some(m) => m.trim().parse::<Mode>().unwrap_or_else(|e| {
                self.warn(
                    WarningKind::BadValue,
                    object,
                    format!(
                        "annotation {MODE_ANNOTATION}: {e}; using {}",
                        self.settings.mode
                    ),
                );
                self.settings.mode
            }),
        }
    }

    /// The candidates of one Service port, one per frontend.
    fn port(
        &mut self,
        object: &str,
        shape: &Shape<'a>,
        frontends: &[(IpAddr, Kind)],
        port: &ServicePort,
    ) {
        let Some(protocol) = protocol_of(port.protocol.as_deref()) else {
            self.warn(
                WarningKind::UnsupportedProtocol,
                object,
                format!(
                    "port {} protocol {}: only TCP, UDP and SCTP are served",
                    port.port,
                    port.protocol.as_deref().unwrap_or("")
                ),
            );
            return;
        };
        let Some(number) = u16::try_from(port.port).ok().filter(|&p| p != 0) else {
            self.warn(
                WarningKind::BadPort,
                object,
                format!("port {} is not a port number", port.port),
            );
            return;
        };
        let pname = port
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| number.to_string());
        let eps = self.endpoints(
            shape.namespace,
            shape.name,
            port,
            protocol,
            shape.publish_not_ready,
        );
        for &(vip, kind) in frontends {
            let fport = match kind {
                Kind::NodePort => {
                    let node_port = port
                        .node_port
                        .and_then(|p| u16::try_from(p).ok())
                        .filter(|&p| p != 0);
                    let Some(p) = node_port else {
                        self.warn(
                            WarningKind::BadPort,
                            object,
                            format!("port {pname} has no nodePort"),
                        );
                        continue;
                    };
                    p
                }
                Kind::LoadBalancer | Kind::External => number,
            };
            let source_ranges = if kind == Kind::LoadBalancer {
                let Some(r) = shape.ranges.for_family(vip) else {
                    self.warn(
                        WarningKind::BadSourceRange,
                        object,
                        format!(
                            "loadBalancerSourceRanges allow no {} client; frontend {vip} left out",
                            if vip.is_ipv4() { "IPv4" } else { "IPv6" }
                        ),
                    );
                    continue;
                };
                r
            } else {
                Vec::new()
            };
            let (backends, health_check) = self.backends(shape, vip, fport, &eps);
            let Some(maglev_table_size) = self.table_size(object, &backends) else {
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
                name: sanitise(&format!(
                    "{}/{}/{pname}/{suffix}",
                    shape.namespace, shape.name
                )),
                vip,
                port: fport,
                protocol,
                mode: shape.mode,
                maglev_table_size,
                source_ranges,
                session_affinity: shape.affinity,
                passive_health: model::PassiveHealth::default_for(
                    shape.mode,
                    protocol,
                    health_check.as_ref(),
                ),
                health_check,
                route: shape.route.clone(),
                slow_start: shape.slow_start,
                backends,
            };
            self.out.push(Candidate {
                front,
                checked: check(&self.settings.gateway, service),
            });
        }
    }

    /// The backends of one frontend and their health check: the nodes in `dsr-*` modes
    /// (under `externalTrafficPolicy: Local` those holding an endpoint, checked on the
    /// Service's `healthCheckNodePort`), the endpoints themselves in `nat`.
    fn backends(
        &mut self,
        shape: &Shape<'a>,
        vip: IpAddr,
        fport: u16,
        eps: &[Ep<'a>],
    ) -> (Vec<Backend>, Option<HealthCheck>) {
        if !shape.mode.is_dsr() {
            return (nat_backends(vip, eps), None);
        }
        let hc = if shape.local {
            shape
                .health_check_node_port
                .map(|p| http_check(p, HEALTH_CHECK_NODE_PORT_PATH))
        } else {
            self.settings
                .cluster_node_check
                .as_ref()
                .map(|(p, path)| http_check(*p, path))
        };
        if let (true, NodeUse::Named(names)) = (shape.local, &mut self.node_use) {
            for node in eps.iter().filter_map(|e| e.node) {
                if !names.contains(node) {
                    names.insert(node.to_owned());
                }
            }
        }
        let local = shape.local.then_some(eps);
        (self.node_backends(vip, fport, shape.mode, local), hc)
    }

    /// The Maglev table size for `backends` (see [`maglev::size_for`]), or a warning.
    fn table_size(&mut self, object: &str, backends: &[Backend]) -> Option<u32> {
        // Sized for the backends that take new flows (those the table is filled with):
        // terminating endpoints and NotReady nodes leaving during a rollout do not push it
        // across a size. The table still holds a slot per backend.
        let min = self.settings.maglev_min_table_size;
        let taking = backends
            .iter()
            .filter(|b| b.state == model::BackendState::Active && b.weight > 0)
            .count();
        let size = maglev::size_for(taking, min)
            .filter(|&size| size as usize >= backends.len())
            .or_else(|| maglev::size_for(backends.len(), min));
        if size.is_none() {
            self.warn(
                WarningKind::TooManyBackends,
                object,
                format!(
                    "{} backends, more than Maglev's {}",
                    backends.len(),
                    maglev::LARGE_SIZE
                ),
            );
        }
        size
    }

    /// DSR backends: nodes, at the frontend port. `local` holds the Service port's
    /// endpoints under `externalTrafficPolicy: Local`: then the backends are the nodes
    /// holding one, each weighted by its ready endpoints (at least 1, at most
    /// [`Backend::MAX_WEIGHT`]), and a node holding only terminating ones drains.
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
                // Ready local endpoints per node: the node's weight, so that each pod gets
                // an equal share whichever node it runs on (kube-proxy splits a node's
                // share evenly among its local pods). A node with serving but
                // terminating endpoints only keeps its flows.
                let mut ready: BTreeMap<&str, u32> = BTreeMap::new();
                for e in eps {
                    let Some(node) = e.node else { continue };
                    let n = ready.entry(node).or_insert(0);
                    if e.state == BackendState::Active {
                        *n = n.saturating_add(1);
                    }
                }
                for (node, n) in ready {
                    if let Some(a) = self.nodes.get(node).and_then(address) {
                        let mut b = if n > 0 {
                            backend(a, port, BackendState::Active)
                        } else {
                            backend(a, port, BackendState::Draining)
                        };
                        b.weight = n.clamp(1, Backend::MAX_WEIGHT);
                        out.push(b);
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
        "SCTP" => Some(Protocol::Sctp),
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

#[cfg(test)]
mod tests {
    use super::*;

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
