//! Traffic per service and per backend, and the flow tables' occupancy per worker: what each
//! worker counted in its own memory ([`strait_dataplane::traffic`], the flow table's entries
//! per backend), published with its sample and summed here over the workers for the live
//! table's services and backends.
//!
//! Shown three ways: the `strait_service_*` and `strait_backend_*` families of `/metrics`
//! ([`TrafficMetrics`]), `/traffic` as JSON ([`json`]), and from that `strait status --stats`
//! and `--rate`.
//!
//! Labels follow `strait_backend_new_flows_total`: `service` is the service's name, `backend`
//! its `address:port`; `direction` is `in` (client to backend) or `out` (backend to client,
//! nat replies). Series exist for the live table's services and backends only, so their
//! number is the configuration's.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use serde::Serialize;
use strait_dataplane::flow::BackendEntries;
use strait_dataplane::table::ServiceTable;
use strait_dataplane::traffic::{current, Tally};

use crate::cores::CoreSample;
use crate::metrics::{counter, gauge, gauge_of, Rows};
use crate::shared::Shared;

/// Packets and bytes in both directions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Packets sent to backends.
    pub in_packets: u64,
    /// Bytes (IP length) sent to backends.
    pub in_bytes: u64,
    /// Packets from backends translated back to clients (nat).
    pub out_packets: u64,
    /// Bytes (IP length) from backends translated back to clients (nat).
    pub out_bytes: u64,
}

impl Counts {
    fn add(&mut self, t: &Tally) {
        self.in_packets += t.in_packets;
        self.in_bytes += t.in_bytes;
        self.out_packets += t.out_packets;
        self.out_bytes += t.out_bytes;
    }
}

/// One backend's traffic, summed over the workers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BackendTraffic {
    /// `address:port`.
    pub backend: String,
    /// Packets and bytes.
    #[serde(flatten)]
    pub counts: Counts,
    /// New flows sent to it.
    pub new_flows: u64,
    /// Flow-table entries that name it now.
    pub flows: u64,
}

/// One service's traffic, summed over the workers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServiceTraffic {
    /// The service's name.
    pub name: String,
    /// Packets and bytes.
    #[serde(flatten)]
    pub counts: Counts,
    /// New flows (its backends' sum).
    pub new_flows: u64,
    /// Flow-table entries that name one of its backends now.
    pub flows: u64,
    /// Its backends, in the service's order.
    pub backends: Vec<BackendTraffic>,
}

/// One worker's flow table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CoreFlows {
    /// The worker's name (interface and queue).
    pub worker: String,
    /// Entries held.
    pub entries: u64,
    /// Entries it can hold.
    pub capacity: u64,
}

/// Everything `/traffic` answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The generation of the table the services are from.
    pub generation: u64,
    /// Every service of the live table, in table order.
    pub services: Vec<ServiceTraffic>,
    /// Every worker's flow table.
    pub cores: Vec<CoreFlows>,
}

/// Sums the workers' samples for table `t`'s services and backends. A slot counts only when
/// it holds the live holder's incarnation ([`strait_dataplane::traffic`], "Identity across
/// table changes").
pub fn report(t: &ServiceTable, samples: &[(String, CoreSample)]) -> Report {
    let services = t
        .services
        .iter()
        .map(|s| {
            let mut counts = Counts::default();
            for (_, c) in samples {
                counts.add(&current(&c.services, s.id.0, s.incarnation));
            }
            let backends: Vec<BackendTraffic> = s
                .backends
                .iter()
                .filter_map(|&id| t.backend(id))
                .map(|b| {
                    let mut counts = Counts::default();
                    let (mut new_flows, mut flows) = (0, 0);
                    for (_, c) in samples {
                        counts.add(&current(&c.backends, b.id.0, b.incarnation));
                        new_flows += c.new_flows.get(b.id.0 as usize).copied().unwrap_or(0);
                        flows +=
                            u64::from(BackendEntries::of(&c.backend_flows, b.id.0, b.incarnation));
                    }
                    BackendTraffic {
                        backend: b.socket_addr().to_string(),
                        counts,
                        new_flows,
                        flows,
                    }
                })
                .collect();
            ServiceTraffic {
                name: s.name.clone(),
                counts,
                new_flows: backends.iter().map(|b| b.new_flows).sum(),
                flows: backends.iter().map(|b| b.flows).sum(),
                backends,
            }
        })
        .collect();
    let cores = samples
        .iter()
        .map(|(n, c)| CoreFlows {
            worker: n.clone(),
            entries: c.flows.occupancy,
            capacity: c.flow_capacity,
        })
        .collect();
    Report {
        generation: t.generation,
        services,
        cores,
    }
}

/// `/traffic`: [`report`] of the live table, as JSON.
pub fn json(shared: &Shared) -> String {
    let table = shared.table.load();
    let r = report(&table, &shared.samples());
    serde_json::to_string_pretty(&r).unwrap_or_default() + "\n"
}

/// The traffic families of `/metrics`, read from the workers' samples on each scrape.
#[derive(Debug)]
pub struct TrafficMetrics(pub Arc<Shared>);

impl Collector for TrafficMetrics {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let table = self.0.table.load();
        let r = report(&table, &self.0.samples());
        let mut svc_packets: Rows<'_, u64> = Vec::new();
        let mut svc_bytes: Rows<'_, u64> = Vec::new();
        let mut svc_flows: Rows<'_, i64> = Vec::new();
        let mut be_packets: Rows<'_, u64> = Vec::new();
        let mut be_bytes: Rows<'_, u64> = Vec::new();
        for s in &r.services {
            for (dir, p, b) in directions(&s.counts) {
                let l = vec![("service", s.name.clone()), ("direction", dir.into())];
                svc_packets.push((l.clone(), p));
                svc_bytes.push((l, b));
            }
            svc_flows.push((vec![("service", s.name.clone())], gauge_of(s.flows)));
            for be in &s.backends {
                for (dir, p, b) in directions(&be.counts) {
                    let l = vec![
                        ("service", s.name.clone()),
                        ("backend", be.backend.clone()),
                        ("direction", dir.into()),
                    ];
                    be_packets.push((l.clone(), p));
                    be_bytes.push((l, b));
                }
            }
        }
        counter(
            &mut enc,
            "service_packets",
            "Packets per service: in, client to backend (every mode); out, backend to client \
             (nat replies translated back).",
            &svc_packets,
        )?;
        counter(
            &mut enc,
            "service_bytes",
            "Bytes (IP length as received) per service and direction, as \
             strait_service_packets_total.",
            &svc_bytes,
        )?;
        counter(
            &mut enc,
            "backend_packets",
            "Packets per backend: in, sent to it; out, its nat replies translated back.",
            &be_packets,
        )?;
        counter(
            &mut enc,
            "backend_bytes",
            "Bytes (IP length as received) per backend and direction, as \
             strait_backend_packets_total.",
            &be_bytes,
        )?;
        gauge(
            &mut enc,
            "service_flows",
            "Flow-table entries that name one of the service's backends, summed over the \
             workers (one a flow, a nat flow's serving its replies too; a session-affinity \
             client one more).",
            &svc_flows,
        )
    }
}

/// `(direction, packets, bytes)` of `c`, in then out.
fn directions(c: &Counts) -> [(&'static str, u64, u64); 2] {
    [
        ("in", c.in_packets, c.in_bytes),
        ("out", c.out_packets, c.out_bytes),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cores::{publish_traffic as publish, CoreStats};
    use prometheus_client::registry::Registry;
    use strait_config::model::{Config, MacAddr};
    use strait_dataplane::flow::Timeouts;
    use strait_dataplane::pipeline::Pipeline;
    use strait_dataplane::pipeline::Verdict;
    use strait_dataplane::rewrite::{Frame, HEADROOM};
    use strait_dataplane::table::{Builder, Port};
    use strait_testkit::config::{GatewayToml, ServiceToml};

    const GW_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];

    /// nat services `(name, VIP's last byte, backend's last byte)`, backends on port 8080.
    fn config(list: &[(&str, u8, u8)]) -> Config {
        let mut g = GatewayToml::new().interface("eth0", &[0, 1]);
        for (name, vip, b) in list {
            g = g.service(
                ServiceToml::new(name, &format!("203.0.113.{vip}"), 80)
                    .mode("nat")
                    .maglev_table_size(251)
                    .backend_mac(
                        &format!("198.51.100.{b}"),
                        8080,
                        &format!("02:00:00:00:01:{b:02x}"),
                    ),
            );
        }
        strait_config::parse(&g.to_string()).expect("test config")
    }

    fn build(b: &mut Builder, cfg: &Config) -> ServiceTable {
        let ports = [Port::new(MacAddr(GW_MAC), 1500)];
        b.build(cfg, &ports, |_, _, _| false).expect("table")
    }

    /// A TCP segment of `payload` bytes from `src` to `dst`.
    fn segment(src: ([u8; 4], u16), dst: ([u8; 4], u16), payload: usize) -> Vec<u8> {
        let mut out = Vec::new();
        etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 0xc1], GW_MAC)
            .ipv4(src.0, dst.0, 64)
            .tcp(src.1, dst.1, 1, 65535)
            .syn()
            .write(&mut out, &vec![0; payload])
            .expect("frame");
        out
    }

    fn send(p: &mut Pipeline, t: &ServiceTable, frame: &[u8]) {
        let mut buf = vec![0u8; HEADROOM + frame.len() + 64];
        buf[HEADROOM..HEADROOM + frame.len()].copy_from_slice(frame);
        let mut f = Frame::new(&mut buf, HEADROOM, frame.len());
        assert_eq!(p.process(t, 1, 0, &mut f), Verdict::Tx { port: 0 });
    }

    fn sample(p: &Pipeline, t: &ServiceTable) -> CoreSample {
        let mut s = CoreSample {
            flows: p.flows.stats(),
            flow_capacity: p.flows.capacity() as u64,
            ..CoreSample::default()
        };
        publish(&mut s, p, t);
        s
    }

    #[test]
    fn sums_the_cores_for_the_live_holders_and_exports_the_families() {
        let mut builder = Builder::new();
        let t1 = build(&mut builder, &config(&[("a", 10, 11), ("b", 20, 12)]));
        // Two cores: each counts the flows it is given (process() runs them as if owned).
        let mut cores = [
            Pipeline::new(0, 1, 1024, Timeouts::default(), 0),
            Pipeline::new(0, 1, 1024, Timeouts::default(), 0),
        ];
        for (i, p) in cores.iter_mut().enumerate() {
            for port in 0..3u16 {
                let client = ([192, 0, 2, 7], 40000 + 10 * i as u16 + port);
                send(p, &t1, &segment(client, ([203, 0, 113, 10], 80), 10));
                send(p, &t1, &segment(client, ([203, 0, 113, 20], 80), 0));
            }
        }
        // One nat reply on core 1, from b's backend.
        send(
            &mut cores[1],
            &t1,
            &segment(([198, 51, 100, 12], 8080), ([192, 0, 2, 7], 40010), 5),
        );
        let samples: Vec<(String, CoreSample)> = cores
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("eth0/{i}"), sample(p, &t1)))
            .collect();
        let r = report(&t1, &samples);
        let a = &r.services[0];
        assert_eq!(a.name, "a");
        let want_a = Counts {
            in_packets: 6,
            in_bytes: 6 * 50,
            out_packets: 0,
            out_bytes: 0,
        };
        assert_eq!(a.counts, want_a);
        assert_eq!(a.backends[0].counts, want_a);
        assert_eq!(a.backends[0].backend, "198.51.100.11:8080");
        assert_eq!(
            (a.new_flows, a.flows),
            (6, 6),
            "6 nat flows, one entry each"
        );
        let b = &r.services[1];
        assert_eq!(
            (
                b.counts.in_packets,
                b.counts.out_packets,
                b.counts.out_bytes
            ),
            (6, 1, 45)
        );
        assert_eq!(r.cores.len(), 2);
        assert_eq!(
            r.cores[0].entries, 6,
            "3 flows of a and 3 of b, one entry each"
        );

        // Reloads: a leaves, then c arrives with a's freed ids. Core 0 has counted nothing
        // since: its sample still holds a's counts in the slots c now has, and they are not c's.
        let _ = build(&mut builder, &config(&[("b", 20, 12)]));
        let t2 = build(&mut builder, &config(&[("b", 20, 12), ("c", 30, 13)]));
        let c2 = t2.services.iter().find(|s| s.name == "c").expect("c");
        assert_eq!(c2.id, t1.services[0].id, "c has a's id");
        send(
            &mut cores[1],
            &t2,
            &segment(([192, 0, 2, 9], 5), ([203, 0, 113, 30], 80), 0),
        );
        let samples: Vec<(String, CoreSample)> = cores
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("eth0/{i}"), sample(p, &t2)))
            .collect();
        let r = report(&t2, &samples);
        assert_eq!(r.services[0].name, "b", "b moved to a's index");
        assert_eq!(r.services[0].counts.in_packets, 6, "b's counts followed it");
        let c = &r.services[1];
        assert_eq!(c.counts.in_packets, 1, "only c's own packet: {c:?}");
        assert_eq!(c.backends[0].counts.in_packets, 1);

        // The families, as a scrape shows them.
        let stats: Vec<Arc<CoreStats>> = samples
            .into_iter()
            .map(|(name, s)| {
                Arc::new(CoreStats {
                    name,
                    sample: std::sync::Mutex::new(s),
                    ..CoreStats::default()
                })
            })
            .collect();
        let shared = Arc::new(Shared::new(
            config(&[("b", 20, 12), ("c", 30, 13)]),
            Arc::new(t2),
            Arc::default(),
            stats,
        ));
        let mut reg = Registry::with_prefix("strait");
        reg.register_collector(Box::new(TrafficMetrics(Arc::clone(&shared))));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).expect("encodes");
        for line in [
            "strait_service_packets_total{service=\"b\",direction=\"in\"} 6",
            "strait_service_packets_total{service=\"b\",direction=\"out\"} 1",
            "strait_service_bytes_total{service=\"b\",direction=\"out\"} 45",
            "strait_backend_packets_total{service=\"c\",backend=\"198.51.100.13:8080\",direction=\"in\"} 1",
            "strait_backend_bytes_total{service=\"c\",backend=\"198.51.100.13:8080\",direction=\"in\"} 40",
            "strait_service_flows{service=\"c\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line}:\n{text}");
        }
        let v: serde_json::Value = serde_json::from_str(&json(&shared)).expect("JSON");
        assert_eq!(v["services"][1]["backends"][0]["in_packets"], 1);
        assert_eq!(v["cores"][1]["worker"], "eth0/1");
    }
}
