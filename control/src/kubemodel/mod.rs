//! The Kubernetes model: what the cluster's objects mean for the gateway, without I/O.
//! Services, EndpointSlices, Nodes and address pools in (as kube-rs watcher events or
//! objects), complete service lists, status wanted and Event texts out; the control core
//! takes its [`Publication`]s and merges them into the configuration file's services
//! ([`merge`], [`merge_changes`]).
//!
//! It opens no connection and starts no task: `crate::kube` watches the API server, feeds
//! the [`Controller`] and writes what a round asks for. The core depends on this module and
//! never on `kube`, so what the core reads of the cluster is data, and the compiler keeps it
//! so.
//!
//! | file | part |
//! |---|---|
//! | [`settings`] | what the source is told (class, pools, mode, NodePort address) and its flags |
//! | [`translate`] | Service + EndpointSlice + Node → `model::Service` |
//! | [`pool`] | LoadBalancer address allocation |
//! | [`crd`] | the `StraitAddressPool` custom resource: pools as cluster objects |
//! | [`controller`] | the stores, the reconcile round: address plan, translation, status wanted |
//! | [`events`] | the notices that become Kubernetes Events, de-duplicated |

pub mod controller;
pub mod crd;
pub mod events;
pub mod pool;
pub mod settings;
pub mod translate;

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use strait_config::model;

pub use controller::{Controller, Kind, PoolStatusWrite, Round};
pub use settings::{Args, Settings};
pub use translate::Change;

/// `namespace/name` of an object (`name` for cluster-scoped ones): the key of every map
/// in this module.
pub fn object_key(meta: &ObjectMeta) -> String {
    let name = meta.name.as_deref().unwrap_or("");
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

/// A reference to a Service, for Events.
pub fn service_reference(svc: &Service) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Service".to_owned()),
        name: svc.metadata.name.clone(),
        namespace: svc.metadata.namespace.clone(),
        uid: svc.metadata.uid.clone(),
        resource_version: svc.metadata.resource_version.clone(),
        field_path: None,
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

/// The configuration file's `config` with the Kubernetes services added. A Kubernetes
/// service whose name or frontend (address, port, protocol) a file service already has is
/// left out: the file is the operator's word. Returns the merged configuration and one
/// message per service left out.
pub fn merge<S: std::borrow::Borrow<model::Service>>(
    config: &model::Config,
    kube: &[S],
) -> (model::Config, Vec<String>) {
    let mut merged = config.clone();
    let mut dropped = Vec::new();
    for s in kube.iter().map(std::borrow::Borrow::borrow) {
        match left_out(config, s) {
            Some(why) => dropped.push(why),
            None => merged.services.push(s.clone()),
        }
    }
    (merged, dropped)
}

/// The messages [`merge`] gives for `kube`, without making the merged configuration.
pub fn dropped<S: std::borrow::Borrow<model::Service>>(
    config: &model::Config,
    kube: &[S],
) -> Vec<String> {
    kube.iter()
        .filter_map(|s| left_out(config, s.borrow()))
        .collect()
}

/// Why [`merge`] leaves Kubernetes service `s` out, if it does.
fn left_out(config: &model::Config, s: &model::Service) -> Option<String> {
    let f = config
        .services
        .iter()
        .find(|f| f.name == s.name || (f.vip, f.port, f.protocol) == (s.vip, s.port, s.protocol))?;
    Some(format!(
        "kubernetes service {} ({} {}) left out: the configuration file's service {} has its name or frontend",
        s.name,
        s.frontend(),
        s.protocol,
        f.name
    ))
}

/// `changes` as they apply to [`merge`]'s result with `config`: the change of a name a
/// file service has is left out (that service is the file's), and a service whose
/// frontend a file service has becomes a removal (merge leaves it out). Each item is a
/// name and its service, `None` for a removal.
pub fn merge_changes<'a>(
    config: &'a model::Config,
    changes: &'a [Change],
) -> impl Iterator<Item = (&'a str, Option<&'a model::Service>)> + 'a {
    changes.iter().filter_map(move |(name, s)| {
        if config.services.iter().any(|f| &f.name == name) {
            return None;
        }
        let s = s.as_deref().filter(|s| {
            !config
                .services
                .iter()
                .any(|f| (f.vip, f.port, f.protocol) == (s.vip, s.port, s.protocol))
        });
        Some((name.as_str(), s))
    })
}
