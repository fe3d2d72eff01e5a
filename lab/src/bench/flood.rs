//! `strait-lab bench flood`: the gateway under a spoofed-source flood.
//!
//! ```text
//! testbed (one gateway, 4 backends) ── strait run ── client namespace:
//!    200 long-lived TCP streams (a 32-byte write every 50 ms, each echo checked) and short
//!    HTTP requests (bench failover's client), opened before the flood;
//!    strait-lab gen: SYNs (or UDP datagrams) to the VIP, every packet a new source
//!    address and port from 192.0.2.16-250 x 1024-65535, at the generator's full rate.
//! ```
//!
//! Per flood it reports the streams reset and the longest stall of any stream, the share of
//! short requests (new legitimate connections) that succeeded, the rate offered, and the
//! gateway's flow-table numbers over the flood: entries created, inserts refused because
//! the table or the rate limit was full (those flows are forwarded by Maglev without an
//! entry), half-open entries evicted, and the table's occupancy after. The flow table
//! never evicts an established entry for a new one (`dataplane::flow`): the streams'
//! entries survive by construction, and the streams' own fate shows it. `--flow-capacity`
//! shrinks the table far below the flood's flow count.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context};
use serde::Serialize;

use super::failover::{admin, catch_stop, cpu_model, interrupted, Client, Fleet};
use crate::testbed;

/// The floods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Flood {
    /// TCP SYNs from spoofed sources.
    Syn,
    /// UDP datagrams from spoofed sources.
    Udp,
    /// Both, one after the other.
    Both,
}

/// `strait-lab bench flood` options.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Long-lived TCP streams opened before the flood.
    #[arg(long, default_value_t = 200)]
    pub streams: usize,
    /// Seconds each flood lasts.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Which flood.
    #[arg(long, value_enum, default_value = "both")]
    pub flood: Flood,
    /// The gateway's `flow_capacity_per_core` (default: the configuration's, 2^20).
    #[arg(long)]
    pub flow_capacity: Option<u32>,
    /// The gateway's `new_flows_per_second_per_core` (default: the configuration's,
    /// 125,000): above it new flows are forwarded by Maglev without an entry.
    #[arg(long)]
    pub new_flows_per_second: Option<u32>,
    /// The flood's rate in frames per second, or `max` (the generator's full rate).
    #[arg(long, default_value = "max")]
    pub rate: String,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The testbed's namespace prefix.
    #[arg(long, default_value = "sfl")]
    pub prefix: String,
}

/// One flood's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct FloodResult {
    /// `syn-flood` or `udp-flood`.
    pub flood: &'static str,
    /// Frames the generator sent, and its rate.
    pub sent: u64,
    /// Frames per second offered.
    pub offered_pps: f64,
    /// Streams open when it began.
    pub streams: usize,
    /// Streams that broke.
    pub streams_reset: usize,
    /// The longest time any stream went without an echo (0: none stalled 150 ms).
    pub longest_stall_ms: u64,
    /// Short requests (each a new connection) sent, and failed.
    pub requests: usize,
    /// Of those, failed.
    pub requests_failed: usize,
    /// `1 - failed / requests`.
    pub requests_ok_ratio: f64,
    /// Flow-table entries created during the flood.
    pub flows_created: u64,
    /// New flows forwarded without an entry (table or rate limit full).
    pub flows_stateless: u64,
    /// Half-open entries evicted for new ones.
    pub evictions: u64,
    /// Entries in the table after the flood, and its capacity.
    pub entries_after: u64,
    /// The table's capacity.
    pub capacity: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    results: Vec<FloodResult>,
    cpu: String,
}

/// Runs the bench.
///
/// # Errors
/// Not root; the testbed or the gateway did not come up; the generator failed.
pub fn run(o: &Options) -> anyhow::Result<()> {
    ensure!(o.streams > 0, "--streams must be at least 1");
    ensure!(o.seconds > 0.0, "--seconds must be more than 0");
    catch_stop()?;
    let bed = testbed::up(&testbed::Opts {
        backends: 4,
        prefix: o.prefix.clone(),
        ..testbed::Opts::default()
    })?;
    let mut keys = String::new();
    if let Some(cap) = o.flow_capacity {
        keys += &format!("flow_capacity_per_core = {cap}\n");
    }
    if let Some(rate) = o.new_flows_per_second {
        keys += &format!("new_flows_per_second_per_core = {rate}\n");
    }
    if !keys.is_empty() {
        let path = bed.config_path().to_path_buf();
        let text = std::fs::read_to_string(&path)?;
        let text = text.replacen("[gateway]\n", &format!("[gateway]\n{keys}"), 1);
        std::fs::write(&path, text)?;
    }
    let mut fleet = Fleet::up(&bed)?;
    let gw = bed.gateway_namespace().to_owned();
    let client = Client::start(&bed.client_namespace(), o.streams)?;
    client.wait_all_open(o.streams, Duration::from_secs(30))?;
    let floods: &[(&'static str, &str, &str)] = match o.flood {
        Flood::Syn => &[("syn-flood", "syn", "203.0.113.10:80")],
        Flood::Udp => &[("udp-flood", "udp", "203.0.113.10:5353")],
        Flood::Both => &[
            ("syn-flood", "syn", "203.0.113.10:80"),
            ("udp-flood", "udp", "203.0.113.10:5353"),
        ],
    };
    let mut results = Vec::new();
    for &(name, traffic, to) in floods {
        interrupted()?;
        let before = flow_numbers(&gw);
        let w = client.window_start(o.streams)?;
        let (sent, offered_pps) =
            generate(&bed.client_namespace(), traffic, to, o.seconds, &o.rate)?;
        let longest = client.longest_stall(&w);
        let r = client.window_end(&w, name, 1, false);
        let after = flow_numbers(&gw);
        let res = FloodResult {
            flood: name,
            sent,
            offered_pps,
            streams: r.streams,
            streams_reset: r.streams_reset,
            longest_stall_ms: longest,
            requests: r.requests,
            requests_failed: r.requests_failed,
            requests_ok_ratio: if r.requests == 0 {
                0.0
            } else {
                1.0 - r.requests_failed as f64 / r.requests as f64
            },
            flows_created: after.created.saturating_sub(before.created),
            flows_stateless: after.stateless.saturating_sub(before.stateless),
            evictions: after.evictions.saturating_sub(before.evictions),
            entries_after: after.entries,
            capacity: after.capacity,
        };
        eprintln!(
            "bench flood: {name}: {} frames at {:.0} pps; {}/{} streams reset, longest stall {} ms; \
             {}/{} requests failed; flows created {}, stateless {}, half-open evicted {}, \
             entries {} of {}",
            res.sent,
            res.offered_pps,
            res.streams_reset,
            res.streams,
            res.longest_stall_ms,
            res.requests_failed,
            res.requests,
            res.flows_created,
            res.flows_stateless,
            res.evictions,
            res.entries_after,
            res.capacity
        );
        results.push(res);
    }
    client.stop();
    fleet.stop_all();
    let report = Report {
        results,
        cpu: cpu_model(),
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    if let Some(path) = &o.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    drop(bed);
    Ok(())
}

/// Runs `strait-lab gen` in the client namespace: `traffic` to `to`, every packet a new
/// spoofed source, at `rate` for `seconds`; (frames sent, rate).
fn generate(
    ns: &str,
    traffic: &str,
    to: &str,
    seconds: f64,
    rate: &str,
) -> anyhow::Result<(u64, f64)> {
    let secs = seconds.to_string();
    gen(
        ns,
        &[
            "--to",
            to,
            "--traffic",
            traffic,
            "--new-flows",
            "--src-range",
            "192.0.2.16-192.0.2.250",
            "--rate",
            rate,
            "--duration",
            &secs,
        ],
    )
}

/// Runs `strait-lab gen --iface eth0 --dst-mac <the gateway's> ARGS --json` in namespace
/// `ns` (the testbed's client) until it ends; (frames sent, rate offered).
pub(crate) fn gen(ns: &str, args: &[&str]) -> anyhow::Result<(u64, f64)> {
    let exe = std::env::current_exe().context("finding the strait-lab binary")?;
    let mac = testbed::GW_MAC.to_string();
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(&exe)
        .args(["gen", "--iface", "eth0", "--dst-mac", &mac])
        .args(args)
        .arg("--json")
        .stdin(Stdio::null())
        .output()
        .context("running strait-lab gen")?;
    ensure!(
        out.status.success(),
        "strait-lab gen failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("strait-lab gen --json")?;
    Ok((
        v["sent"].as_u64().unwrap_or(0),
        v["offered_pps"].as_f64().unwrap_or(0.0),
    ))
}

/// The gateway's flow-table counters, summed over its workers.
#[derive(Debug, Default)]
struct FlowNumbers {
    created: u64,
    stateless: u64,
    evictions: u64,
    entries: u64,
    capacity: u64,
}

fn flow_numbers(ns: &str) -> FlowNumbers {
    let metrics = admin(ns, "GET", "/metrics").unwrap_or_default();
    let sum = |family: &str| -> u64 {
        metrics
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| {
                let f = l.split(['{', ' ']).next().unwrap_or("");
                f == family || f.strip_suffix("_total") == Some(family)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    FlowNumbers {
        created: sum("strait_flows_created"),
        stateless: sum("strait_flows_stateless"),
        evictions: sum("strait_flow_evictions"),
        entries: sum("strait_flow_table_entries"),
        capacity: sum("strait_flow_table_capacity"),
    }
}
