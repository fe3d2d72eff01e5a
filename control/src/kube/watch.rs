//! Watching the cluster and publishing complete service lists.
//!
//! ```text
//! watcher(Services) ───────┐   Init / InitApply / InitDone: a fresh set built aside,
//! watcher(EndpointSlices) ─┼─► swapped in whole at InitDone (relists after 410 too);
//! watcher(Nodes) ──────────┤   Apply / Delete: applied to the live set
//! watcher(StraitAddressPools, Namespaces) ┘ (--kube-pool-objects: pools made again)
//!        (kube-rs; Paced: back-off on errors, none to speak of after a 410)
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
//! [`Controller`] (`crate::kubemodel::controller`) is the pure part (no IO, testable with
//! hand-made watcher events); [`run_source`] drives it from the API server.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::utils::Backoff as KubeBackoff;
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::{json, Value};
use tracing::{debug, info, warn};

use crate::kubemodel::crd::{StraitAddressPool, StraitAddressPoolStatus};
use crate::kubemodel::events::Notice;
use crate::kubemodel::pool::StatusUpdate;
use crate::kubemodel::settings::Settings;
use crate::kubemodel::{Controller, Kind, PoolStatusWrite, Publication};

use super::events::Emitter;
use super::stats::Stats;
use super::KubeError;

/// How long one status write or Event may take before it counts as failed (and is
/// retried on a later round). Short, so an unresponsive API server cannot hold up the
/// processing of watch events for long.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the loop looks at the connection and at pending retries. One second keeps a
/// recovered connection visible within a second and costs nothing when all is well.
const TICK: Duration = Duration::from_secs(1);

/// Longest wait between two probes of an API server that does not answer: the probe
/// starts at [`TICK`] and doubles, so that an outage of hours is not a failed request (and
/// the client's error line) every second.
const PROBE_MAX: Duration = Duration::from_secs(30);

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
/// is honoured before an older one is given the lowest free address (see
/// [`crate::kubemodel::pool::plan`]), where one round each would have given the older one
/// that address first. 50 ms covers such a burst from a client near the API server and
/// costs 50 ms on a Service change only; EndpointSlice and Node changes do not wait.
const SERVICE_SETTLE: Duration = Duration::from_millis(50);

/// Most warnings logged per round; the rest are counted only.
const MAX_LOGGED_WARNINGS: usize = 20;

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

/// One kind's watch events with a back-off between failed attempts, as kube-rs'
/// `StreamBackoff` paces them, but for 410 Gone: that is the API server answering (the
/// watch's resource version was compacted away while it could not be reached), so the
/// back-off starts again from its shortest step and the relist follows at once, instead of
/// after the longest step an outage has grown it to (30 s by default) while the gateway
/// forwards on a list it knows to be stale. A relist still waits that shortest step, so a
/// server that answered every watch with 410 would not be asked in a loop.
struct Paced {
    stream: BoxStream<'static, WatchItem>,
    backoff: Backoff,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// What a kind's watcher yields.
type WatchItem = Result<watcher::Event<DynamicObject>, watcher::Error>;

impl Paced {
    fn new(stream: BoxStream<'static, WatchItem>, backoff: Backoff) -> Self {
        Self {
            stream,
            backoff,
            sleep: None,
        }
    }
}

impl Stream for Paced {
    type Item = WatchItem;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<WatchItem>> {
        let this = &mut *self;
        if let Some(sleep) = &mut this.sleep {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.sleep = None;
        }
        let item = futures::ready!(this.stream.poll_next_unpin(cx));
        match &item {
            // Not on `Init`: kube-rs says it before it sends the list request, so a list that
            // keeps failing would otherwise wait the shortest step every time.
            Some(Ok(watcher::Event::Init)) => {}
            Some(Ok(_)) => this.backoff.reset(),
            Some(Err(e)) => {
                if gone(e) {
                    this.backoff.reset();
                }
                let wait = this.backoff.next().unwrap_or(this.backoff.max);
                this.sleep = Some(Box::pin(tokio::time::sleep(wait)));
            }
            None => {}
        }
        Poll::Ready(item)
    }
}

/// Whether a watcher error is 410 Gone: the watch's resource version is too old, and the
/// watcher relists.
fn gone(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchError(s) if s.code == 410)
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
        Paced::new(
            watcher(api, watcher::Config::default()).boxed(),
            Backoff::new(settings.backoff),
        )
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
    // The next probe of a lost API server, and the gap after it.
    let (mut probe_at, mut probe_gap) = (tokio::time::Instant::now(), TICK);
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
                let now = tokio::time::Instant::now();
                if stats.connected() {
                    probe_gap = TICK;
                } else if now >= probe_at {
                    probe(&client, &stats).await;
                    probe_at = now + probe_gap;
                    probe_gap = (probe_gap * 2).min(PROBE_MAX);
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
            // kube-rs says Init before it sends the list request: only what the server
            // answered (an object, the list's end, a watch event) shows it connected.
            if !matches!(ev, watcher::Event::Init) && !stats.set_connected(true) {
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
            let expired = gone(&e);
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
    use super::*;

    /// kube-rs's watcher says `Init` before its list request goes out: an API server that is
    /// down fails that request, and the connection must not have looked up meanwhile.
    #[test]
    fn a_list_that_starts_is_not_a_connection() {
        let gateway =
            strait_config::parse("[[gateway.interfaces]]\nname = \"eth0\"\nqueues = [0]\n")
                .unwrap()
                .gateway;
        let mut ctl = Controller::new(Settings::new(gateway));
        let stats = Stats::default();
        handle(&mut ctl, &stats, Kind::Services, Ok(watcher::Event::Init));
        assert!(!stats.connected(), "Init is not an answer");
        handle(
            &mut ctl,
            &stats,
            Kind::Services,
            Ok(watcher::Event::InitDone),
        );
        assert!(stats.connected(), "the list's end is");
    }
}
