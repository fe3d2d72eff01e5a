//! Numbers of the Kubernetes source, for `/metrics` and for tests: connection state,
//! lists and watch errors per kind, publishes, status writes, Events, skipped objects.
//!
//! Written by the source's thread, read by the admin API's: plain atomics, and one mutex
//! around the small map of skipped-object counts.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::kubemodel::events::{NoticeType, WARNING_REASONS};
use crate::kubemodel::translate::WarningKind;
use crate::kubemodel::Kind;
use crate::metrics::{counter, gauge, gauge_of, one, seconds_gauge, Rows};

#[derive(Debug, Default)]
struct PerKind {
    lists: AtomicU64,
    errors: AtomicU64,
    expired: AtomicU64,
    objects: AtomicU64,
    /// A list of the kind is under way or still to come: its view is not complete.
    listing: AtomicBool,
    /// Unix time in milliseconds when its last list completed; 0 before the first.
    last_list_ms: AtomicU64,
}

/// Since when the source's view has not been known complete and current: set at
/// creation, since nothing is listed yet.
#[derive(Debug)]
struct StaleSince(Mutex<Option<Instant>>);

impl Default for StaleSince {
    fn default() -> Self {
        Self(Mutex::new(Some(Instant::now())))
    }
}

/// The source's numbers.
#[derive(Debug, Default)]
pub struct Stats {
    connected: AtomicBool,
    disconnects: AtomicU64,
    kinds: [PerKind; 5],
    publishes: AtomicU64,
    published_services: AtomicU64,
    status_writes: AtomicU64,
    status_write_errors: AtomicU64,
    events: AtomicU64,
    event_errors: AtomicU64,
    addresses: AtomicU64,
    skipped: Mutex<BTreeMap<WarningKind, u64>>,
    notices: Mutex<BTreeMap<(NoticeType, String), u64>>,
    address_warnings: Mutex<BTreeMap<String, u64>>,
    stale: StaleSince,
}

impl Stats {
    /// Whether the last exchange with the API server succeeded.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Records the outcome of an exchange; returns the previous state.
    pub(crate) fn set_connected(&self, up: bool) -> bool {
        let was = self.connected.swap(up, Ordering::Relaxed);
        if was && !up {
            self.disconnects.fetch_add(1, Ordering::Relaxed);
        }
        self.refresh();
        was
    }

    /// Since when the view of the cluster has not been known complete and current: the
    /// connection to the API server is lost, or a watched kind's list is under way or still
    /// to come (before the first one, and during a relist after 410 Gone, the published
    /// view misses what changed meanwhile). `None` while connected with every list complete.
    pub fn stale_since(&self) -> Option<Instant> {
        *self.stale.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Unix time in seconds when the last list of `kind` completed; 0 before the first.
    pub fn last_list(&self, kind: Kind) -> f64 {
        self.kinds[kind.index()]
            .last_list_ms
            .load(Ordering::Relaxed) as f64
            / 1000.0
    }

    /// Starts or ends the stale time as the connection and the lists say.
    fn refresh(&self) {
        let stale =
            !self.connected() || self.kinds.iter().any(|k| k.listing.load(Ordering::Relaxed));
        let mut since = self.stale.0.lock().unwrap_or_else(PoisonError::into_inner);
        match (stale, *since) {
            (true, None) => *since = Some(Instant::now()),
            (false, Some(_)) => *since = None,
            _ => {}
        }
    }

    /// `kind` is watched: its view is incomplete until its first list is.
    pub(crate) fn watch(&self, kind: Kind) {
        self.list_started(kind);
    }

    /// A list of `kind` starts (the first, or a relist).
    pub(crate) fn list_started(&self, kind: Kind) {
        self.kinds[kind.index()]
            .listing
            .store(true, Ordering::Relaxed);
        self.refresh();
    }

    /// Times the connection was lost.
    pub fn disconnects(&self) -> u64 {
        self.disconnects.load(Ordering::Relaxed)
    }

    /// Complete (initial or re-) lists of `kind` so far.
    pub fn lists(&self, kind: Kind) -> u64 {
        self.kinds[kind.index()].lists.load(Ordering::Relaxed)
    }

    /// Watch or list errors of `kind` so far.
    pub fn errors(&self, kind: Kind) -> u64 {
        self.kinds[kind.index()].errors.load(Ordering::Relaxed)
    }

    /// 410 Gone answers of `kind` (each followed by a relist).
    pub fn expired(&self, kind: Kind) -> u64 {
        self.kinds[kind.index()].expired.load(Ordering::Relaxed)
    }

    /// Objects of `kind` currently known.
    pub fn objects(&self, kind: Kind) -> u64 {
        self.kinds[kind.index()].objects.load(Ordering::Relaxed)
    }

    /// Service lists published so far.
    pub fn publishes(&self) -> u64 {
        self.publishes.load(Ordering::Relaxed)
    }

    /// Services in the last published list.
    pub fn published_services(&self) -> u64 {
        self.published_services.load(Ordering::Relaxed)
    }

    /// Successful status writes.
    pub fn status_writes(&self) -> u64 {
        self.status_writes.load(Ordering::Relaxed)
    }

    /// Failed status writes.
    pub fn status_write_errors(&self) -> u64 {
        self.status_write_errors.load(Ordering::Relaxed)
    }

    /// Events published.
    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    /// Events that could not be published.
    pub fn event_errors(&self) -> u64 {
        self.event_errors.load(Ordering::Relaxed)
    }

    /// LoadBalancer addresses held.
    pub fn addresses(&self) -> u64 {
        self.addresses.load(Ordering::Relaxed)
    }

    /// Objects or parts left out in the last translation, by kind.
    pub fn skipped(&self) -> BTreeMap<WarningKind, u64> {
        self.skipped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Address notices (Events) made so far, by type and reason; a follower counts the
    /// notices it decided on though the leader publishes them.
    pub fn notices(&self) -> BTreeMap<(NoticeType, String), u64> {
        self.notices
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Services with a standing address warning (no address, or not the one asked for),
    /// by reason, as of the last address plan.
    pub fn address_warnings(&self) -> BTreeMap<String, u64> {
        self.address_warnings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn notice(&self, type_: NoticeType, reason: &str) {
        *self
            .notices
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((type_, reason.to_owned()))
            .or_insert(0) += 1;
    }

    pub(crate) fn set_address_warnings(&self, m: BTreeMap<String, u64>) {
        *self
            .address_warnings
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = m;
    }

    pub(crate) fn list_done(&self, kind: Kind, objects: usize) {
        let k = &self.kinds[kind.index()];
        k.lists.fetch_add(1, Ordering::Relaxed);
        k.objects.store(objects as u64, Ordering::Relaxed);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        k.last_list_ms.store(now, Ordering::Relaxed);
        k.listing.store(false, Ordering::Relaxed);
        self.refresh();
    }

    pub(crate) fn set_objects(&self, kind: Kind, objects: usize) {
        self.kinds[kind.index()]
            .objects
            .store(objects as u64, Ordering::Relaxed);
    }

    pub(crate) fn error(&self, kind: Kind, expired: bool) {
        let k = &self.kinds[kind.index()];
        k.errors.fetch_add(1, Ordering::Relaxed);
        if expired {
            k.expired.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn published(&self, services: usize) {
        self.publishes.fetch_add(1, Ordering::Relaxed);
        self.published_services
            .store(services as u64, Ordering::Relaxed);
    }

    pub(crate) fn status_write(&self, ok: bool) {
        if ok {
            &self.status_writes
        } else {
            &self.status_write_errors
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn event(&self, ok: bool) {
        if ok { &self.events } else { &self.event_errors }.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn set_addresses(&self, n: usize) {
        self.addresses.store(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn set_skipped(&self, counts: BTreeMap<WarningKind, u64>) {
        *self.skipped.lock().unwrap_or_else(PoisonError::into_inner) = counts;
    }
}

/// The numbers as Prometheus metrics (`kube_*`; the admin registry adds its `strait_`
/// prefix). Register with `registry.register_collector(Box::new(KubeMetrics(stats)))`.
#[derive(Debug)]
pub struct KubeMetrics(pub Arc<Stats>);

impl Collector for KubeMetrics {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let s = &self.0;
        gauge(
            &mut enc,
            "kube_connected",
            "1 while the last exchange with the Kubernetes API server succeeded.",
            &one(i64::from(s.connected())),
        )?;
        counter(
            &mut enc,
            "kube_disconnects",
            "Times the connection to the Kubernetes API server was lost.",
            &one(s.disconnects()),
        )?;
        let per = |f: &dyn Fn(Kind) -> u64| -> Rows<'static, u64> {
            Kind::EVERY
                .iter()
                .map(|k| (vec![("kind", k.as_str().to_owned())], f(*k)))
                .collect()
        };
        counter(
            &mut enc,
            "kube_lists",
            "Complete lists, by kind.",
            &per(&|k| s.lists(k)),
        )?;
        let last: Vec<_> = Kind::EVERY
            .iter()
            .map(|k| (vec![("kind", k.as_str().to_owned())], s.last_list(*k)))
            .collect();
        seconds_gauge(
            &mut enc,
            "kube_last_list_timestamp_seconds",
            "Unix time when the kind's last complete list ended (0 before the first). A watch \
             that keeps up needs no new list: an old time alone is no fault.",
            &last,
        )?;
        let stale = s.stale_since().map_or(0.0, |t| t.elapsed().as_secs_f64());
        seconds_gauge(
            &mut enc,
            "kube_stale_seconds",
            "Seconds for which the view of the cluster has not been known complete and \
             current (API server lost, or a list under way or still to come); 0 while \
             connected with every list complete. The gateway forwards on the last complete \
             view meanwhile.",
            &one(stale),
        )?;
        counter(
            &mut enc,
            "kube_watch_errors",
            "List and watch errors, by kind.",
            &per(&|k| s.errors(k)),
        )?;
        counter(
            &mut enc,
            "kube_watch_expired",
            "410 Gone answers (each followed by a relist), by kind.",
            &per(&|k| s.expired(k)),
        )?;
        let objects: Rows<'static, i64> = per(&|k| s.objects(k))
            .into_iter()
            .map(|(l, v)| (l, gauge_of(v)))
            .collect();
        gauge(
            &mut enc,
            "kube_objects",
            "Objects known, by kind.",
            &objects,
        )?;
        counter(
            &mut enc,
            "kube_publishes",
            "Service lists published.",
            &one(s.publishes()),
        )?;
        gauge(
            &mut enc,
            "kube_services",
            "Services in the last published list.",
            &one(gauge_of(s.published_services())),
        )?;
        counter(
            &mut enc,
            "kube_status_writes",
            "LoadBalancer status writes, by result.",
            &[
                (vec![("result", "ok".to_owned())], s.status_writes()),
                (
                    vec![("result", "error".to_owned())],
                    s.status_write_errors(),
                ),
            ],
        )?;
        counter(
            &mut enc,
            "kube_events",
            "Kubernetes Events published, by result.",
            &[
                (vec![("result", "ok".to_owned())], s.events()),
                (vec![("result", "error".to_owned())], s.event_errors()),
            ],
        )?;
        gauge(
            &mut enc,
            "kube_addresses",
            "LoadBalancer addresses held from the pools.",
            &one(gauge_of(s.addresses())),
        )?;
        let notices = s.notices();
        let mut rows: Rows<'static, u64> = Vec::new();
        for (t, reasons) in [
            (
                NoticeType::Normal,
                &["AddressAssigned", "AddressReleased"][..],
            ),
            (NoticeType::Warning, &WARNING_REASONS[..]),
        ] {
            for r in reasons {
                rows.push((
                    notice_labels(t, r),
                    notices.get(&(t, (*r).to_owned())).copied().unwrap_or(0),
                ));
            }
        }
        for ((t, r), n) in &notices {
            let known = match t {
                NoticeType::Normal => ["AddressAssigned", "AddressReleased"].contains(&r.as_str()),
                NoticeType::Warning => WARNING_REASONS.contains(&r.as_str()),
            };
            if !known {
                rows.push((notice_labels(*t, r), *n));
            }
        }
        counter(
            &mut enc,
            "kube_address_notices",
            "Address Events decided (assigned, released, refused), by type and reason.",
            &rows,
        )?;
        let standing = s.address_warnings();
        let rows: Rows<'static, i64> = WARNING_REASONS
            .iter()
            .map(|r| {
                (
                    vec![("reason", (*r).to_owned())],
                    gauge_of(standing.get(*r).copied().unwrap_or(0)),
                )
            })
            .collect();
        gauge(
            &mut enc,
            "kube_address_warnings",
            "Services with a standing address warning (refused request, no free address, ...), by reason.",
            &rows,
        )?;
        let skipped = s.skipped();
        let rows: Rows<'static, i64> = WarningKind::ALL
            .iter()
            .map(|k| {
                (
                    vec![("reason", k.as_str().to_owned())],
                    gauge_of(skipped.get(k).copied().unwrap_or(0)),
                )
            })
            .collect();
        gauge(
            &mut enc,
            "kube_skipped",
            "Objects or parts of objects left out of the last translation, by reason.",
            &rows,
        )
    }
}

fn notice_labels(t: NoticeType, reason: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "type",
            match t {
                NoticeType::Normal => "Normal",
                NoticeType::Warning => "Warning",
            }
            .to_owned(),
        ),
        ("reason", reason.to_owned()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_is_stale_until_every_watched_kind_is_listed_and_again_while_lost_or_relisting() {
        let s = Stats::default();
        let born = s.stale_since().expect("stale before anything is listed");
        for k in Kind::ALL {
            s.watch(k);
        }
        s.set_connected(true);
        s.list_done(Kind::Services, 3);
        s.list_done(Kind::EndpointSlices, 3);
        assert_eq!(s.stale_since(), Some(born), "nodes are not listed yet");
        assert_eq!(s.last_list(Kind::Nodes), 0.0);
        s.list_done(Kind::Nodes, 2);
        assert_eq!(s.stale_since(), None);
        assert!(
            s.last_list(Kind::Nodes) > 1.6e9,
            "{}",
            s.last_list(Kind::Nodes)
        );
        // The connection is lost, then back: stale meanwhile only.
        s.set_connected(false);
        let lost = s.stale_since().expect("stale while disconnected");
        assert!(lost >= born);
        s.set_connected(true);
        assert_eq!(s.stale_since(), None);
        // A relist after 410 Gone: stale until it completes.
        s.list_started(Kind::EndpointSlices);
        assert!(s.stale_since().is_some());
        s.list_done(Kind::EndpointSlices, 4);
        assert_eq!(s.stale_since(), None);
    }

    #[test]
    fn metrics_show_the_stale_time_and_each_kinds_last_list() {
        let stats = Arc::new(Stats::default());
        stats.watch(Kind::Services);
        let mut registry = prometheus_client::registry::Registry::with_prefix("strait");
        registry.register_collector(Box::new(KubeMetrics(Arc::clone(&stats))));
        let text = |r: &prometheus_client::registry::Registry| {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, r).unwrap();
            out
        };
        let m = text(&registry);
        let stale = m
            .lines()
            .find_map(|l| l.strip_prefix("strait_kube_stale_seconds "))
            .unwrap_or_else(|| panic!("{m}"));
        assert!(stale.parse::<f64>().unwrap() >= 0.0, "{m}");
        assert!(
            m.contains("strait_kube_last_list_timestamp_seconds{kind=\"services\"} 0.0"),
            "{m}"
        );
        stats.set_connected(true);
        stats.list_done(Kind::Services, 1);
        let m = text(&registry);
        assert!(m.contains("strait_kube_stale_seconds 0.0"), "{m}");
        assert!(
            !m.contains("strait_kube_last_list_timestamp_seconds{kind=\"services\"} 0.0"),
            "{m}"
        );
    }
}
