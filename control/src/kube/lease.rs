//! One writer among several gateways: a `coordination.k8s.io/v1` Lease, as client-go's
//! `leaderelection` uses it (kube-rs has no elector of its own, and the crates that add one
//! follow older kube majors than the 3.x this crate uses).
//!
//! Every gateway serves traffic; only the Lease's holder writes Service status and Events.
//! The others compute the same plan from the same lists and follow the statuses the leader
//! writes. Each candidate tries every [`LeaseSettings::retry`]:
//!
//! - no Lease: create it, holding it;
//! - held by this gateway: renew it (`renewTime`), with the `resourceVersion` it read, so
//!   of two writers only one wins (409 Conflict for the other);
//! - held by another: take it over only once its record has not changed for a whole
//!   `leaseDurationSeconds` *by this gateway's clock* (client-go's rule: clocks of different
//!   machines are never compared).
//!
//! A leader that cannot renew for two thirds of the duration stops leading on its own,
//! before anyone may take over (client-go's `renewDeadline`). A gateway that stops in order
//! releases the Lease (empty holder), so the next one takes over within one retry period
//! rather than a whole duration.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::kubemodel::settings::LeaseSettings;

/// What a candidate remembers of the Lease between tries.
#[derive(Debug, Default)]
struct Observed {
    /// The record last seen (holder, renew time, transitions), and when it was first
    /// seen so by this gateway's clock.
    record: Option<(String, Option<String>, i32)>,
    since: Option<Instant>,
}

/// Runs the election until the task is dropped, saying on `leading` whether this gateway
/// holds the Lease; on `stop`, releases it if held.
pub async fn elect(
    client: Client,
    s: LeaseSettings,
    leading: watch::Sender<bool>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let api: Api<Lease> = Api::namespaced(client, &s.namespace);
    let mut observed = Observed::default();
    let mut renewed: Option<Instant> = None;
    let mut tick = tokio::time::interval(s.retry());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut stop => {
                if *leading.borrow() {
                    release(&api, &s).await;
                }
                leading.send_replace(false);
                return;
            }
        }
        let now = Instant::now();
        let held = match tokio::time::timeout(s.retry(), try_hold(&api, &s, &mut observed, now))
            .await
        {
            Ok(Ok(held)) => Some(held),
            Ok(Err(e)) => {
                warn!(lease = %s.name, "kubernetes: lease: {e}");
                None
            }
            Err(_) => {
                warn!(lease = %s.name, "kubernetes: lease: the API server did not answer in time");
                None
            }
        };
        if held == Some(true) {
            renewed = Some(now);
        }
        // An error keeps a leader leading until its renew deadline.
        let lead = match held {
            Some(h) => h,
            None => renewed.is_some_and(|at| now.duration_since(at) < s.renew_deadline()),
        };
        if *leading.borrow() != lead {
            info!(
                lease = %format!("{}/{}", s.namespace, s.name),
                identity = %s.identity,
                "kubernetes: {} writing Service status and Events",
                if lead { "leading: now" } else { "following: no longer" }
            );
            leading.send_replace(lead);
        }
    }
}

fn micro_now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// One try: whether this gateway holds the Lease after it.
async fn try_hold(
    api: &Api<Lease>,
    s: &LeaseSettings,
    observed: &mut Observed,
    now: Instant,
) -> Result<bool, kube::Error> {
    let secs = i32::try_from(s.duration.as_secs()).unwrap_or(i32::MAX);
    let current = match api.get_opt(&s.name).await? {
        Some(l) => l,
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(s.name.clone()),
                    namespace: Some(s.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(s.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(micro_now()),
                    renew_time: Some(micro_now()),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return conflict_is_false(api.create(&PostParams::default(), &lease).await);
        }
    };
    let spec = current.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let record = (
        holder.clone(),
        spec.renew_time.as_ref().map(|t| t.0.to_string()),
        spec.lease_transitions.unwrap_or(0),
    );
    if observed.record.as_ref() != Some(&record) {
        observed.record = Some(record);
        observed.since = Some(now);
    }
    let mine = holder == s.identity;
    let expired = holder.is_empty()
        || observed
            .since
            .is_some_and(|at| now.duration_since(at) >= s.duration);
    if !mine && !expired {
        return Ok(false);
    }
    let mut next = current.clone();
    let mut spec = spec;
    if !mine {
        spec.holder_identity = Some(s.identity.clone());
        spec.acquire_time = Some(micro_now());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.lease_duration_seconds = Some(secs);
    spec.renew_time = Some(micro_now());
    next.spec = Some(spec);
    // `replace` sends the resourceVersion read above: a concurrent writer gets 409.
    conflict_is_false(api.replace(&s.name, &PostParams::default(), &next).await)
}

/// Written: true; lost to another writer (409 Conflict, 409 AlreadyExists): false.
fn conflict_is_false(r: Result<Lease, kube::Error>) -> Result<bool, kube::Error> {
    match r {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the Lease up (empty holder, one-second duration), so another takes over at its
/// next try.
async fn release(api: &Api<Lease>, s: &LeaseSettings) {
    let r = async {
        let Some(mut l) = api.get_opt(&s.name).await? else {
            return Ok(());
        };
        let Some(spec) = l.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(s.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = Some(String::new());
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(micro_now());
        api.replace(&s.name, &PostParams::default(), &l)
            .await
            .map(drop)
    };
    match tokio::time::timeout(Duration::from_secs(2), r).await {
        Ok(Ok(())) => info!(lease = %s.name, "kubernetes: lease released"),
        Ok(Err(e)) => warn!(lease = %s.name, "kubernetes: releasing the lease: {e}"),
        Err(_) => warn!(lease = %s.name, "kubernetes: releasing the lease: timed out"),
    }
}
