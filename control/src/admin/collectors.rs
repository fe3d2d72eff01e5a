//! The Prometheus collectors behind `GET /metrics`, read on each scrape: the workers'
//! counters and the ports' ([`Metrics`]), the Kubernetes source's ([`KubeMetrics`]), the
//! routes and the routing daemons' ([`RouteMetrics`]), and the families other modules own
//! (traffic, capture, heartbeats), all registered by [`registry`]. A scrape copies each
//! driver's view out of [`Shared`] and encodes it; nothing is counted here.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use strait_dataplane::stats::DropReason;

use crate::core::BackendKey;
use crate::cores::CoreSample;
use crate::metrics::{counter, gauge};
use crate::shared::Shared;

use super::views::out_json;

/// Every family `/metrics` encodes, in the order it encodes them.
pub(super) fn registry(shared: &Arc<Shared>) -> Registry {
    let mut registry = Registry::with_prefix("strait");
    registry.register_collector(Box::new(Metrics(Arc::clone(shared))));
    registry.register_collector(Box::new(KubeMetrics(Arc::clone(shared))));
    registry.register_collector(Box::new(RouteMetrics(Arc::clone(shared))));
    registry.register_collector(Box::new(crate::traffic::TrafficMetrics(Arc::clone(shared))));
    registry.register_collector(Box::new(crate::capture::CaptureMetrics(Arc::clone(shared))));
    registry.register_collector(Box::new(crate::cores::Heartbeats::new(
        shared.cores.clone(),
    )));
    registry
}

/// Reads the shared state on each scrape.
#[derive(Debug)]
struct Metrics(Arc<Shared>);

/// The Kubernetes source's numbers (`strait_kube_*`), looked up on each scrape: `run`
/// starts the source after this endpoint, so they cannot be registered at start.
#[derive(Debug)]
struct KubeMetrics(Arc<Shared>);

/// Routes and the BGP speaker (`strait_vip_route`, `strait_bgp_*`), read on each scrape.
#[derive(Debug)]
struct RouteMetrics(Arc<Shared>);

impl Collector for RouteMetrics {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let shared = &self.0;
        let routes = shared.routes();
        let per_vip: Vec<_> = routes
            .iter()
            .map(|(vip, r)| {
                (
                    vec![("vip", vip.to_string()), ("state", r.as_str().to_owned())],
                    1,
                )
            })
            .collect();
        gauge(
            &mut enc,
            "vip_route",
            "Each published VIP's route: 1 for its state (announced, or why not).",
            &per_vip,
        )?;
        let counts: Vec<_> = crate::core::Route::ALL
            .iter()
            .map(|s| {
                let n = routes.values().filter(|r| *r == s).count();
                (
                    vec![("state", s.as_str().to_owned())],
                    crate::metrics::gauge_of(n as u64),
                )
            })
            .collect();
        gauge(&mut enc, "vip_routes", "VIPs by route state.", &counts)?;
        gauge(
            &mut enc,
            "draining",
            "1 while the gateway drains (routes withdrawn, still forwarding).",
            &crate::metrics::one(i64::from(shared.draining.load(Ordering::Relaxed))),
        )?;
        if let Some(l2) = shared.l2() {
            let owned: Vec<_> = routes
                .keys()
                .map(|v| {
                    (
                        vec![("vip", v.to_string())],
                        i64::from(l2.owned.contains(v)),
                    )
                })
                .collect();
            gauge(
                &mut enc,
                "vrrp_owner",
                "1 while this gateway owns the VIP on its segment (VRRP master).",
                &owned,
            )?;
            let changes: Vec<_> = routes
                .keys()
                .map(|v| {
                    let n = l2.owner_changes.get(v).copied().unwrap_or(0);
                    (vec![("vip", v.to_string())], n)
                })
                .collect();
            counter(
                &mut enc,
                "vrrp_owner_changes",
                "Times this gateway took or lost the VIP (VRRP master or not).",
                &changes,
            )?;
            gauge(
                &mut enc,
                "vrrp_running",
                "1 while keepalived runs.",
                &crate::metrics::one(i64::from(l2.running)),
            )?;
        }
        let Some(bgp) = shared.bgp() else {
            return Ok(());
        };
        let sessions: Vec<_> = bgp
            .sessions
            .iter()
            .map(|s| {
                (
                    vec![("peer", s.peer.to_string()), ("state", s.state.clone())],
                    i64::from(s.up),
                )
            })
            .collect();
        gauge(
            &mut enc,
            "bgp_session_up",
            "1 while the BGP session with the peer is established; `state` is BIRD's word for it.",
            &sessions,
        )?;
        gauge(
            &mut enc,
            "bgp_daemon_running",
            "1 while the BIRD speaker runs and answers.",
            &crate::metrics::one(i64::from(bgp.running)),
        )?;
        gauge(
            &mut enc,
            "bgp_announced_routes",
            "VIPs given to the BGP speaker to announce.",
            &crate::metrics::one(crate::metrics::gauge_of(bgp.announced as u64)),
        )?;
        counter(
            &mut enc,
            "bgp_daemon_restarts",
            "Times the BIRD speaker was started again after it died.",
            &crate::metrics::one(bgp.restarts),
        )
    }
}

impl Collector for KubeMetrics {
    fn encode(&self, encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let stats = self
            .0
            .kube
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match stats {
            Some(stats) => crate::kube::KubeMetrics(stats).encode(encoder),
            None => Ok(()),
        }
    }
}

impl Collector for Metrics {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let shared = &self.0;
        let samples = shared.samples();
        workers(&mut enc, &samples)?;
        ports(&mut enc, shared)?;
        backends(&mut enc, shared, &samples)?;
        crate::sync::metrics(&mut enc, &samples, &shared.sync)
    }
}

/// The workers' families, per core: packets, drops by reason, the worker's own drops and
/// wake-ups, its UMEM's books, its busy time, its flow table.
fn workers(enc: &mut DescriptorEncoder<'_>, samples: &[(String, CoreSample)]) -> std::fmt::Result {
    let core = |n: &String| vec![("core", n.clone())];
    let per_core = |f: fn(&crate::cores::CoreSample) -> u64| -> Vec<(Vec<(&str, String)>, u64)> {
        samples.iter().map(|(n, s)| (core(n), f(s))).collect()
    };
    counter(
        enc,
        "rx_packets",
        "Frames received by the worker.",
        &per_core(|s| s.counters.rx),
    )?;
    counter(
        enc,
        "tx_packets",
        "Frames sent (forwarded or answered).",
        &per_core(|s| s.counters.tx),
    )?;
    counter(
        enc,
        "pass_packets",
        "Frames given to the kernel.",
        &per_core(|s| s.counters.pass),
    )?;
    counter(
        enc,
        "handoff_packets",
        "Frames handed to another core.",
        &per_core(|s| s.counters.handoff),
    )?;
    let drops: Vec<_> = samples
        .iter()
        .flat_map(|(n, s)| {
            DropReason::ALL.iter().map(move |r| {
                (
                    vec![("core", n.clone()), ("reason", r.as_str().to_string())],
                    s.counters.drops_for(*r),
                )
            })
        })
        .collect();
    counter(enc, "dropped_packets", "Frames dropped, by reason.", &drops)?;
    counter(
        enc,
        "checksum_completed",
        "Frames sent with a TCP/UDP checksum the gateway completed: their local sender left \
             it to checksum offload.",
        &per_core(|s| s.counters.checksum_completed),
    )?;
    counter(
        enc,
        "flows_created",
        "New flows entered in the flow table.",
        &per_core(|s| s.counters.flows_created),
    )?;
    counter(
        enc,
        "flows_reopened",
        "New connections on the 5-tuple of a closing flow (a reused client port), given a \
             backend afresh.",
        &per_core(|s| s.counters.flows_reopened),
    )?;
    counter(
        enc,
        "flows_stateless",
        "New flows forwarded without state (table bucket full or above the rate cap).",
        &per_core(|s| s.counters.stateless_full + s.counters.stateless_rate_limited),
    )?;
    counter(
        enc,
        "flow_evictions",
        "Half-open flows evicted for new ones.",
        &per_core(|s| s.flows.evicted),
    )?;
    counter(
        enc,
        "flow_expirations",
        "Flows reclaimed after their idle timeout.",
        &per_core(|s| s.flows.expired),
    )?;
    let worker_drops: Vec<_> = samples
        .iter()
        .flat_map(|(n, s)| {
            let w = &s.worker;
            [
                ("pass_unsent", w.pass_unsent),
                ("other_port", w.other_port),
                ("tx_ring_full", w.tx_ring_full),
                ("tx_refused", w.tx_refused),
                ("invalid_rx", w.invalid_rx),
                ("handoff_full", w.handoff_full),
                ("handoff_too_big", w.handoff_too_big),
                ("handoff_no_ring", w.handoff_no_ring),
                ("handoff_no_frame", w.handoff_no_frame),
                ("handoff_loop", w.handoff_loop),
            ]
            .map(|(cause, v)| (vec![("core", n.clone()), ("cause", cause.to_string())], v))
        })
        .collect();
    counter(
            enc,
            "worker_dropped_frames",
            "Frames the worker (AF_XDP or DPDK) could not send on after the pipeline's verdict, by cause.",
            &worker_drops,
        )?;
    counter(
        enc,
        "worker_kernel_passed_frames",
        "Frames the pipeline passed that the worker gave to the kernel (DPDK: written to the \
             port's exception TAP; AF_XDP passes in its steering program instead).",
        &per_core(|s| s.worker.passed),
    )?;
    counter(
        enc,
        "worker_kernel_sent_frames",
        "Frames the kernel sent that the worker put on the wire (DPDK: read from the \
             port's exception TAP).",
        &per_core(|s| s.worker.exception_out),
    )?;
    counter(
        enc,
        "worker_handed_in_frames",
        "Frames received from other cores' handoff rings.",
        &per_core(|s| s.worker.handed_in),
    )?;
    counter(
        enc,
        "worker_wakeups",
        "Syscalls made to wake the kernel (TX and fill-ring kicks) and idle polls.",
        &per_core(|s| s.worker.tx_kicks + s.worker.fill_kicks + s.worker.idle_polls),
    )?;
    crate::cores::umem(enc, samples)?;
    let busy: Vec<_> = samples
        .iter()
        .map(|(n, s)| (core(n), s.worker.busy.seconds()))
        .collect();
    crate::metrics::seconds_counter(
        enc,
        "worker_busy_seconds",
        "Time in worker turns that found frames (ring work, pipeline, TX kicks): over the \
             packets, the worker's CPU per packet.",
        &busy,
    )?;
    let kicks: Vec<_> = samples
        .iter()
        .map(|(n, s)| (core(n), s.worker.busy.kick_seconds()))
        .collect();
    crate::metrics::seconds_counter(
        enc,
        "worker_kick_seconds",
        "Of the busy time, the TX kicks (copy-mode AF_XDP: the kernel copies and transmits \
             each frame inside the sendto; 0 on DPDK, whose PMD sends within the batch).",
        &kicks,
    )?;
    let occ: Vec<_> = samples
        .iter()
        .map(|(n, s)| (core(n), s.flows.occupancy as i64))
        .collect();
    gauge(
        enc,
        "flow_table_entries",
        "Entries in the flow table.",
        &occ,
    )?;
    let cap: Vec<_> = samples
        .iter()
        .map(|(n, s)| (core(n), s.flow_capacity as i64))
        .collect();
    gauge(
        enc,
        "flow_table_capacity",
        "Capacity of the flow table.",
        &cap,
    )?;
    Ok(())
}

/// The ports' families: the steering program's verdicts, the DPDK ports' counters, and each
/// interface's received frames.
fn ports(enc: &mut DescriptorEncoder<'_>, shared: &Shared) -> std::fmt::Result {
    // The steering program's verdicts: with the workers' counters after them, every frame
    // an interface received is counted once.
    let steering: Vec<_> = shared
        .xdp
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter_map(|r| Some((r.iface().to_owned(), r.counters().ok()?)))
        .collect();
    let port_rx: Vec<_> = steering
        .iter()
        .filter_map(|(iface, _)| {
            let path = format!("/sys/class/net/{iface}/statistics/rx_packets");
            let n = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
            Some((vec![("interface", iface.clone())], n))
        })
        .collect();
    let xdp: Vec<_> = steering
        .into_iter()
        .flat_map(|(iface, c)| {
            c.by_reason().map(|(verdict, reason, v)| {
                (
                    vec![
                        ("interface", iface.clone()),
                        ("verdict", verdict.to_string()),
                        ("reason", reason.to_string()),
                    ],
                    v,
                )
            })
        })
        .collect();
    counter(
        enc,
        "xdp_packets",
        "Frames the XDP steering program saw, by verdict (pass: to the kernel; redirect: to \
             the workers) and reason. Their sum is every frame the interface received.",
        &xdp,
    )?;
    let dpdk = shared
        .dpdk
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    if let Some(reader) = dpdk {
        let ports = crate::dpdk::port_counters(&reader);
        let per_port = |f: fn(&crate::dpdk::PortCounters) -> u64| -> Vec<_> {
            ports
                .iter()
                .map(|(n, c)| (vec![("interface", n.clone())], f(c)))
                .collect()
        };
        for (name, help, f) in [
            (
                "dpdk_port_rx_packets",
                "Frames the DPDK port received (ethdev ipackets); every one goes to a worker.",
                (|c| c.rx_packets) as fn(&crate::dpdk::PortCounters) -> u64,
            ),
            (
                "dpdk_port_tx_packets",
                "Frames the DPDK port sent (opackets).",
                |c| c.tx_packets,
            ),
            (
                "dpdk_port_rx_missed",
                "Frames the DPDK port dropped for lack of RX descriptors (imissed).",
                |c| c.rx_missed,
            ),
            (
                "dpdk_port_rx_errors",
                "Receive errors of the DPDK port.",
                |c| c.rx_errors,
            ),
            (
                "dpdk_port_tx_errors",
                "Send errors of the DPDK port.",
                |c| c.tx_errors,
            ),
            (
                "dpdk_port_rx_nombuf",
                "Receive failures of the DPDK port for lack of mbufs.",
                |c| c.rx_nombuf,
            ),
        ] {
            counter(enc, name, help, &per_port(f))?;
        }
        let link: Vec<_> = ports
            .iter()
            .map(|(n, c)| (vec![("interface", n.clone())], i64::from(c.link_up)))
            .collect();
        gauge(
            enc,
            "dpdk_port_link_up",
            "1 when the DPDK port's link is up.",
            &link,
        )?;
    }
    counter(
        enc,
        "interface_rx_packets",
        "Frames the interface received (its rx_packets, from sysfs). While the steering \
             program is attached, strait_xdp_packets_total grows by as much.",
        &port_rx,
    )?;
    Ok(())
}

/// The backends' and services' families, from the live table, the health states and the
/// workers' per-backend counts; and the table's generation.
fn backends(
    enc: &mut DescriptorEncoder<'_>,
    shared: &Shared,
    samples: &[(String, CoreSample)],
) -> std::fmt::Result {
    let table = shared.table.load();
    let mut per_backend = Vec::new();
    let mut up = Vec::new();
    let mut passive_failures = Vec::new();
    let mut out = Vec::new();
    let mut weight = Vec::new();
    let health = shared
        .health
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    for b in table.backends.iter().flatten() {
        let svc = &table.services[b.service as usize];
        let mut label = String::new();
        let _ = write!(label, "{}", b.socket_addr());
        let labels = vec![("service", svc.name.clone()), ("backend", label)];
        let n: u64 = samples
            .iter()
            .map(|(_, s)| s.new_flows.get(b.id.0 as usize).copied().unwrap_or(0))
            .sum();
        per_backend.push((labels.clone(), n));
        let w = if b.health == strait_dataplane::table::Health::Up {
            i64::from(b.weight)
        } else {
            0
        };
        weight.push((labels.clone(), w));
        let h = health.get(&BackendKey::new(svc.name.clone(), b.address(), b.port));
        let is_up = h.is_none_or(|h| h.up);
        for why in strait_dataplane::passive::Failure::ALL {
            let n: u64 = samples
                .iter()
                .map(|(_, s)| {
                    s.passive
                        .get(b.id.0 as usize)
                        .map_or(0, |c| c[why as usize])
                })
                .sum();
            let mut l = labels.clone();
            l.push(("cause", why.as_str().to_owned()));
            passive_failures.push((l, n));
        }
        if let Some(h) = h {
            let by = if !h.up {
                Some("active")
            } else {
                h.passive.as_ref().map(|_| "passive")
            };
            if let Some(by) = by {
                let cause = match &out_json(Some(h))["cause"] {
                    serde_json::Value::String(c) => c.clone(),
                    _ => String::new(),
                };
                let mut l = labels.clone();
                l.push(("by", by.to_owned()));
                l.push(("cause", cause));
                out.push((l, 1));
            }
        }
        up.push((labels, i64::from(is_up)));
    }
    counter(
        enc,
        "backend_passive_failures",
        "New connections the backend refused (RST to the SYN) or left unanswered (the SYN \
             retransmitted while the backend sent nothing), seen by the workers in nat mode \
             (passive health).",
        &passive_failures,
    )?;
    gauge(
        enc,
        "backend_out",
        "1 for each backend its health keeps from new flows, by what took it out (active: \
             its check fell; passive: refused or unanswered connections, nat mode) and the \
             cause; a backend in service has no series.",
        &out,
    )?;
    counter(
        enc,
        "backend_new_flows",
        "New flows sent to each backend.",
        &per_backend,
    )?;
    gauge(
        enc,
        "backend_weight",
        "The Maglev weight each backend takes new flows by now: its configured weight, \
             less while it ramps up (slow_start), 0 while it takes none (down, draining).",
        &weight,
    )?;
    gauge(
        enc,
        "backend_up",
        "1 when the backend passes its health check (or has none).",
        &up,
    )?;
    // The members of each service's Maglev table: 0 means new connections to the
    // service have nowhere to go.
    let serving: Vec<_> = table
        .services
        .iter()
        .map(|s| {
            (
                vec![("service", s.name.clone())],
                crate::metrics::gauge_of(s.members.len() as u64),
            )
        })
        .collect();
    gauge(
        enc,
        "service_serving_backends",
        "Backends of the service that take new flows (healthy, weight above 0, not draining).",
        &serving,
    )?;
    let gen = vec![(Vec::new(), table.generation as i64)];
    gauge(
        enc,
        "snapshot_generation",
        "Generation of the service table the workers use.",
        &gen,
    )?;
    let unresolved = table
        .backends
        .iter()
        .flatten()
        .filter(|b| b.mac.is_none())
        .count();
    gauge(
        enc,
        "backends_without_next_hop",
        "Backends of the live table whose next-hop MAC is not resolved yet (their frames are \
             dropped as no_next_hop).",
        &[(Vec::new(), unresolved as i64)],
    )?;
    Ok(())
}
