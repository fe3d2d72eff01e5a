//! A one-screen, human summary of a configuration, for `strait check` and the startup log.
//!
//! Four gateway lines (settings, flows, interfaces, routes), then one line per service. Lines can be long (a service lists all
//! its backends) but their number stays small, so the picture fits a terminal.

use std::fmt::Write as _;
use std::time::Duration;

use crate::model::{Config, HealthCheck, HealthKind, Service};

/// Summarizes `config`: gateway settings, then one line per service with its frontend,
/// mode, backends (`addr:port w=N state`), health check, affinity and source ranges.
/// Every line ends with `\n`.
pub fn summary(config: &Config) -> String {
    let g = &config.gateway;
    let t = &g.timeouts;
    let mut out = String::new();
    let source = |a: Option<String>| a.unwrap_or_else(|| "-".to_owned());
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "gateway: admin {}, default mode {}, mtu {}, gue port {}, tunnel source v4 {} v6 {}",
        g.admin_listen,
        g.default_mode,
        g.mtu,
        g.gue_port,
        source(g.tunnel_source_v4.map(|a| a.to_string())),
        source(g.tunnel_source_v6.map(|a| a.to_string())),
    );
    let rate = match g.new_flows_per_second_per_core {
        0 => "unlimited".to_owned(),
        n => n.to_string(),
    };
    let _ = writeln!(
        out,
        "flows: {} per core, {} new/s per core; timeouts tcp syn {}, established {}, closing {}, udp {}",
        g.flow_capacity_per_core,
        rate,
        show(t.tcp_syn),
        show(t.tcp_established),
        show(t.tcp_closing),
        show(t.udp),
    );
    let interfaces: Vec<String> = g
        .interfaces
        .iter()
        .map(|i| {
            let mut s = format!("{} queues {}", i.name, join(&i.queues));
            if let Some(cores) = &i.cores {
                let _ = write!(s, " cores {}", join(cores));
            }
            let _ = write!(s, " role {}", i.role);
            if !i.vlans.is_empty() {
                let _ = write!(s, " vlans {}", join(&i.vlans));
            }
            if let crate::model::Driver::Dpdk { device } = &i.driver {
                let _ = write!(s, " driver dpdk device {device}");
            }
            s
        })
        .collect();
    let _ = writeln!(out, "interfaces: {}", interfaces.join("; "));
    match &g.bgp {
        None => match &g.l2 {
            Some(l) => {
                let _ = writeln!(
                    out,
                    "l2: vrrp as {} of {}, advert every {}; drain grace {}",
                    l.name,
                    l.members.join(","),
                    show(l.advert_interval),
                    show(g.drain_grace)
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "routes: none announced (no [gateway.bgp]); drain grace {}",
                    show(g.drain_grace)
                );
            }
        },
        Some(b) => {
            let peers: Vec<String> = b
                .peers
                .iter()
                .map(|p| {
                    let mut s = format!("{} as {}", p.address, p.asn);
                    if p.port != 179 {
                        let _ = write!(s, " port {}", p.port);
                    }
                    let _ = write!(s, " hold {}", show(p.hold_time));
                    if p.bfd {
                        s.push_str(" bfd");
                    }
                    if p.password.is_some() {
                        s.push_str(" md5");
                    }
                    s
                })
                .collect();
            let announce = if b.announce.is_empty() {
                "every VIP".to_owned()
            } else {
                join(&b.announce)
            };
            let _ = writeln!(
                out,
                "bgp: as {} router id {}, announce {}, peers {}; drain grace {}",
                b.asn,
                b.router_id,
                announce,
                peers.join(", "),
                show(g.drain_grace)
            );
        }
    }
    if let Some(s) = &g.sync {
        let peers: Vec<String> = s.peers.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            out,
            "flow sync: listen {}, peers {}",
            s.listen,
            peers.join(", ")
        );
    }
    if config.services.is_empty() {
        out.push_str("services: none\n");
    }
    for service in &config.services {
        let _ = writeln!(out, "{}", service_line(service));
    }
    out
}

fn service_line(s: &Service) -> String {
    let mut line = format!(
        "service {} {}/{} {} maglev {}: ",
        s.name,
        s.frontend(),
        s.protocol,
        s.mode,
        s.maglev_table_size
    );
    if s.backends.is_empty() {
        line.push_str("no backends");
    } else {
        let backends: Vec<String> = s
            .backends
            .iter()
            .map(|b| {
                let mut text = format!("{} w={} {}", b.socket_addr(), b.weight, b.state);
                if let Some(t) = b.tunnel {
                    let _ = write!(text, " via {t}");
                }
                text
            })
            .collect();
        let noun = if backends.len() == 1 {
            "backend"
        } else {
            "backends"
        };
        let _ = write!(line, "{} {noun} [{}]", backends.len(), backends.join(", "));
    }
    let _ = write!(line, "; health {}", health(s.health_check.as_ref()));
    match s.session_affinity {
        Some(d) => {
            let _ = write!(line, "; affinity client-ip {}", show(d));
        }
        None => line.push_str("; affinity none"),
    }
    if let Some(d) = s.slow_start {
        let _ = write!(line, "; slow start {}", show(d));
    }
    if s.source_ranges.is_empty() {
        line.push_str("; sources all");
    } else {
        let ranges: Vec<String> = s.source_ranges.iter().map(ToString::to_string).collect();
        let _ = write!(line, "; sources {}", ranges.join(","));
    }
    line
}

fn health(h: Option<&HealthCheck>) -> String {
    let Some(h) = h else {
        return "none".to_owned();
    };
    let mut s = match &h.kind {
        HealthKind::Tcp => "tcp".to_owned(),
        HealthKind::Http { path } => format!("http GET {path}"),
        HealthKind::Udp { payload, expect } => match expect {
            None => format!("udp {} bytes, any reply", payload.len()),
            Some(e) => format!(
                "udp {} bytes, reply starting with {} bytes",
                payload.len(),
                e.len()
            ),
        },
        HealthKind::Dns { query, qtype } => format!("dns {query} {qtype}"),
    };
    if let Some(port) = h.port {
        let _ = write!(s, " port {port}");
    }
    let _ = write!(
        s,
        " every {} timeout {} rise {} fall {}",
        show(h.interval),
        show(h.timeout),
        h.rise,
        h.fall
    );
    s
}

fn join<T: ToString>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}
