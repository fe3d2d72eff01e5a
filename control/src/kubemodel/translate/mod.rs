//! From Kubernetes objects to Strait services: pure, no IO.
//!
//! ```text
//! Service ──┬─ frontends: LoadBalancer addresses (owned class, from the address plan),
//!           │             spec.externalIPs (owned Services, or all if asked),
//!           │             nodeport address:nodePort (type NodePort)
//!           ├─ × ports (TCP, UDP, SCTP)                   one strait Service per
//!           │                                              (frontend, port, protocol)
//! EndpointSlice ─┬─ nat:   ready → active, serving+terminating → draining, others out
//!                └─ dsr-*: the nodes (all, or those holding an endpoint under
//! Node ──────────────────  externalTrafficPolicy: Local, health-checked on
//!                          healthCheckNodePort /healthz)
//!           └─ validated with the configuration crate's own rules
//! ```
//!
//! Whatever cannot be used (an FQDN slice, a missing port, an address that does not
//! parse, a protocol other than TCP, UDP and SCTP, a frontend another Service already
//! serves) is left out with a
//! [`Warning`] of a countable [`WarningKind`]; nothing here panics on what the API server
//! sends. When two Services claim one frontend the older one keeps it, so a newcomer
//! cannot take over a running Service's traffic.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use strait_config::model::{self, Protocol};

use super::settings::Settings;

mod incremental;
mod translator;
mod warnings;

pub use incremental::Incremental;
pub use warnings::{Warning, WarningKind};

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

/// One change to the translated list: a service (by name) set or gone.
pub type Change = (String, Option<Arc<model::Service>>);

/// The key of the Service `name` in namespace `ns` (as [`super::object_key`] makes it).
fn owner_key(ns: &str, name: &str) -> String {
    if ns.is_empty() {
        name.to_owned()
    } else {
        format!("{ns}/{name}")
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
}
