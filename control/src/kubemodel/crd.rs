//! Address pools as cluster objects: the `StraitAddressPool` custom resource
//! (`strait.dev/v1alpha1`, cluster-scoped), as MetalLB's `IPAddressPool` and Cilium's
//! `CiliumLoadBalancerIPPool`.
//!
//! ```text
//! StraitAddressPool ── pools_in() ─► pool::Pool (named after the object; CIDRs as given,
//!  spec.addresses      ▲               ranges split into the CIDRs that cover them exactly)
//!  spec.autoAssign     │               ├─ auto_assign: Services that name no pool use it
//!  spec.avoidBuggyIPs  │               ├─ avoid_buggy: no IPv4 address ending in .0 / .255
//!  spec.serviceAllocation              └─ scope: namespaces (by name, or picked by the
//!                      │                  namespaceSelectors), Service labels, priority
//!      Namespace labels┘
//!  status (written by the Lease holder, watch.rs): assigned, available, Ready, Invalid
//! ```
//!
//! The schema is generated from these types ([`StraitAddressPool::crd`]); `deploy/crd.yaml`
//! holds it and a test checks the two agree. A pool object that cannot be used is refused
//! whole with the field and the reason, never half applied.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Subnets, Ipv6Subnets};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::pool::{Allocation, LabelSelector, Pool, SelectorOp};

/// The spec of a `StraitAddressPool`: its addresses and how they are handed out.
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "strait.dev",
    version = "v1alpha1",
    kind = "StraitAddressPool",
    plural = "straitaddresspools",
    shortname = "sap",
    doc = "LoadBalancer addresses Strait hands out (like MetalLB's IPAddressPool)",
    printcolumn = r#"{"name":"Addresses","type":"string","jsonPath":".spec.addresses"}"#,
    printcolumn = r#"{"name":"Auto","type":"boolean","jsonPath":".spec.autoAssign"}"#,
    printcolumn = r#"{"name":"Assigned","type":"integer","jsonPath":".status.assigned"}"#,
    printcolumn = r#"{"name":"Available","type":"integer","jsonPath":".status.available"}"#,
    status = "StraitAddressPoolStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct StraitAddressPoolSpec {
    /// The addresses: CIDRs (`203.0.113.0/28`, `2001:db8:100::/120`) or ranges
    /// (`203.0.113.10-203.0.113.20`, both ends included). Of a CIDR larger than /31
    /// (IPv4) or /127 (IPv6), the network and broadcast (subnet-router) addresses are
    /// never handed out; every address of a range is.
    pub addresses: Vec<String>,
    /// Whether Services that name no pool get addresses from this one (default true);
    /// with false, only Services naming it (`strait.dev/address-pool`) do.
    #[serde(default = "yes")]
    pub auto_assign: bool,
    /// Never hand out IPv4 addresses ending in .0 or .255, which some old client
    /// firmware takes for broadcast addresses and drops (MetalLB's `avoidBuggyIPs`).
    #[serde(default)]
    pub avoid_buggy_ips: bool,
    /// Which Services get addresses from this pool automatically, and before which other
    /// pools (MetalLB's `serviceAllocation`); unset: any Service, after the scoped pools
    /// that admit it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_allocation: Option<ServiceAllocation>,
}

/// Which Services a pool serves automatically.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAllocation {
    /// Pools with a lower priority are tried first; unset comes after every set one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Namespaces whose Services it serves; with `namespaceSelectors` too, a Service in
    /// either is served; both empty: all namespaces.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Label selectors over Namespaces, one of which a Service's Namespace must match
    /// (applied live as Namespace labels change).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespace_selectors: Vec<Selector>,
    /// Label selectors, one of which a Service must match; empty: all Services.
    #[serde(default)]
    pub service_selectors: Vec<Selector>,
}

/// A label selector, as Kubernetes' `LabelSelector`: every `matchLabels` entry and every
/// `matchExpressions` requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Selector {
    /// Labels an object must all carry, with these values.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements on labels, all of which must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<SelectorRequirement>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelectorRequirement {
    /// The label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    /// The values for `In` / `NotIn`; none for `Exists` / `DoesNotExist`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// What the gateway holding the Lease reports about a pool (the status subresource).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StraitAddressPoolStatus {
    /// Addresses of the pool held by Services.
    #[serde(default)]
    pub assigned: u64,
    /// Addresses of the pool that may still be handed out (saturating at 2^63-1).
    #[serde(default)]
    pub available: u64,
    /// `Ready` (True: the pool serves) and `Invalid` (True: refused; the message names the
    /// field and the reason).
    #[serde(default)]
    pub conditions: Vec<PoolCondition>,
}

/// A status condition, in the shape of Kubernetes' `metav1.Condition`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolCondition {
    /// `Ready` or `Invalid`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True` or `False`.
    pub status: String,
    /// A CamelCase word for the cause.
    pub reason: String,
    /// What it means, for people.
    pub message: String,
    /// The `metadata.generation` this condition was worked out for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When `status` last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// Checks `sel` (at `field`) into the selector the allocator matches with.
///
/// # Errors
/// An unknown operator, `In` / `NotIn` without values, `Exists` / `DoesNotExist` with
/// values, an empty key.
pub fn selector(sel: &Selector, field: &str) -> Result<LabelSelector, (String, String)> {
    let mut exprs = Vec::new();
    for (i, e) in sel.match_expressions.iter().enumerate() {
        let f = format!("{field}.matchExpressions[{i}]");
        let op = match e.operator.as_str() {
            "In" => SelectorOp::In,
            "NotIn" => SelectorOp::NotIn,
            "Exists" => SelectorOp::Exists,
            "DoesNotExist" => SelectorOp::DoesNotExist,
            o => {
                return Err((
                    format!("{f}.operator"),
                    format!("{o:?} is not In, NotIn, Exists or DoesNotExist"),
                ))
            }
        };
        if e.key.is_empty() {
            return Err((format!("{f}.key"), "the key is empty".into()));
        }
        let values: BTreeSet<String> = e.values.iter().cloned().collect();
        match op {
            SelectorOp::In | SelectorOp::NotIn if values.is_empty() => {
                return Err((
                    format!("{f}.values"),
                    format!("operator {} needs values", e.operator),
                ))
            }
            SelectorOp::Exists | SelectorOp::DoesNotExist if !values.is_empty() => {
                return Err((
                    format!("{f}.values"),
                    format!("operator {} takes no values", e.operator),
                ))
            }
            _ => {}
        }
        exprs.push((e.key.clone(), op, values));
    }
    Ok(LabelSelector {
        labels: sel.match_labels.clone(),
        exprs,
    })
}

fn yes() -> bool {
    true
}

/// Why a pool object cannot be used: the field and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("StraitAddressPool {pool}: {field}: {reason}")]
pub struct PoolError {
    /// The object's name.
    pub pool: String,
    /// The field (`spec.addresses[2]`).
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

/// The pools `obj` stands for, named after it, with no Namespace known (a pool with
/// `namespaceSelectors` then serves its listed `namespaces` only).
///
/// # Errors
/// As [`pools_in`].
pub fn pools_of(obj: &StraitAddressPool) -> Result<Vec<Pool>, PoolError> {
    pools_in(obj, &BTreeMap::new())
}

/// The pools `obj` stands for, named after it; its `namespaceSelectors` pick from
/// `namespaces` (name to labels).
///
/// # Errors
/// An empty or unnamed object, an entry that is neither a CIDR nor a range, a range whose
/// ends differ in family or run backwards, a selector that is not valid.
pub fn pools_in(
    obj: &StraitAddressPool,
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
) -> Result<Vec<Pool>, PoolError> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    let err = |field: String, reason: String| PoolError {
        pool: name.clone(),
        field,
        reason,
    };
    if name.is_empty() {
        return Err(err("metadata.name".into(), "the pool has no name".into()));
    }
    if obj.spec.addresses.is_empty() {
        return Err(err(
            "spec.addresses".into(),
            "no addresses: give CIDRs or ranges".into(),
        ));
    }
    let scope = match &obj.spec.service_allocation {
        None => None,
        Some(a) => {
            let sels = |list: &[Selector], at: &str| -> Result<Vec<LabelSelector>, PoolError> {
                list.iter()
                    .enumerate()
                    .map(|(i, s)| {
                        selector(s, &format!("spec.serviceAllocation.{at}[{i}]"))
                            .map_err(|(f, r)| err(f, r))
                    })
                    .collect()
            };
            let ns_sels = sels(&a.namespace_selectors, "namespaceSelectors")?;
            let selected_namespaces = (!ns_sels.is_empty()).then(|| {
                namespaces
                    .iter()
                    .filter(|(_, labels)| ns_sels.iter().any(|s| s.matches(labels)))
                    .map(|(n, _)| n.clone())
                    .collect()
            });
            Some(Allocation {
                namespaces: a.namespaces.clone(),
                selected_namespaces,
                service_labels: sels(&a.service_selectors, "serviceSelectors")?,
                priority: a.priority,
            })
        }
    };
    let mut out = Vec::new();
    for (i, entry) in obj.spec.addresses.iter().enumerate() {
        let field = format!("spec.addresses[{i}]");
        let e = entry.trim();
        let pool = |net: IpNet, whole: bool| Pool {
            name: Some(name.clone()),
            net,
            auto_assign: obj.spec.auto_assign,
            avoid_buggy: obj.spec.avoid_buggy_ips,
            whole,
            scope: scope.clone(),
        };
        if let Some((a, b)) = e.split_once('-') {
            let parse = |s: &str| {
                s.trim().parse::<IpAddr>().map_err(|_| {
                    err(
                        field.clone(),
                        format!("{:?} in range {e:?} is not an IP address", s.trim()),
                    )
                })
            };
            let (lo, hi) = (parse(a)?, parse(b)?);
            let nets: Vec<IpNet> = match (lo, hi) {
                (IpAddr::V4(l), IpAddr::V4(h)) if l <= h => {
                    Ipv4Subnets::new(l, h, 0).map(IpNet::V4).collect()
                }
                (IpAddr::V6(l), IpAddr::V6(h)) if l <= h => {
                    Ipv6Subnets::new(l, h, 0).map(IpNet::V6).collect()
                }
                (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => {
                    return Err(err(
                        field,
                        format!("range {e:?} runs backwards: its first address is above its last"),
                    ))
                }
                _ => return Err(err(field, format!("range {e:?} mixes IPv4 and IPv6"))),
            };
            out.extend(nets.into_iter().map(|n| pool(n, true)));
        } else {
            let net: IpNet = e.parse().map_err(|_| {
                err(
                    field.clone(),
                    format!("{e:?} is neither a CIDR (203.0.113.0/28) nor a range (203.0.113.10-203.0.113.20)"),
                )
            })?;
            out.push(pool(net.trunc(), false));
        }
    }
    Ok(out)
}

/// The CustomResourceDefinition as YAML, as `deploy/crd.yaml` holds it.
///
/// # Errors
/// Only if serialisation fails, which it does not for this definition.
pub fn crd_yaml() -> Result<String, serde_json::Error> {
    use kube::CustomResourceExt;
    // JSON is YAML; one document, pretty-printed, applies with kubectl as it is.
    serde_json::to_string_pretty(&StraitAddressPool::crd())
}
