//! `strait-lab bench pipeline`: a quick, in-memory measurement of the packet path on this machine.
//!
//! ```text
//! synthetic config (1,000 services x 4 backends) ──► ServiceTable ──┐
//! 60-byte TCP frames ──copy (untimed)──► RX buffers ──► Pipeline::process_batch ──► Tx (timed)
//! ```
//!
//! For each forwarding mode, one pipeline (core 0 of 1, so nat never hands off) first warms
//! 1,000,000 established flows, then is measured on two kinds of traffic for about
//! [`Params::time`] each:
//!
//! - `established`: ACKs of those flows, visited in one shuffled order over and over, so each
//!   packet's flow entry is wherever the previous pass left it in the cache hierarchy (with a
//!   million flows, mostly in DRAM), as on a busy gateway;
//! - `syn`: SYNs, every one a new 5-tuple: a Maglev choice and a flow-table insert (in nat also
//!   a reply entry and a reply-tuple lookup). The table is emptied (the clock jumps a day and a
//!   sweep reclaims everything, untimed) whenever it is a quarter full, so every SYN finds a
//!   free way and is remembered, as on a gateway whose table is sized for its load. A SYN
//!   flood against a full table would instead evict half-open entries; that is not measured.
//!
//! Each packet is a 60-byte frame (54 bytes of Ethernet, IPv4 and TCP headers, padded to the
//! Ethernet minimum). Because the pipeline rewrites frames in place and encapsulation grows
//! them at the front, frames are copied into the RX buffers before each batch of
//! [`BATCH`], outside the timed section: that copy stands for the NIC's DMA, and like DDIO it
//! leaves the headers in cache. Only `Pipeline::process_batch` is inside the clock.
//!
//! The flow table gets 2^21 entries (2^22 in nat, two entries a flow), so the million flows
//! fill half of it; the `stateless` column counts the flows that found their bucket and its
//! group (32 ways) full anyway and are forwarded by Maglev alone, paying a failed insert on
//! every packet.
//!
//! # How the figures are computed
//!
//! Every batch of [`BATCH`] frames is timed on its own, at least 2 s worth of batches per
//! case (tens of thousands). The headline `Mpps` and `ns/packet` are the **median** of the
//! per-batch nanoseconds per packet; `p10`/`p90` give their spread, and `mean` is total time
//! over total packets. The median is the headline because this measures the pipeline, not the
//! machine's scheduler: on a shared core a batch the thread spent preempted takes milliseconds
//! instead of about 100 us, and a few of those decide a sum (runs of one binary differed by 2x
//! in the mean on a busy 2-core VM). The median is not a best case: half the batches were
//! slower, and slowdowns that hit most batches (cache or memory-bandwidth contention from
//! neighbours) show in it. On an idle, pinned core median and mean agree within a few percent;
//! a larger gap is time the core spent elsewhere. See [`strait_benches::Measurement`].
//!
//! The numbers are for one core, the calling thread, which is not pinned (run under
//! `taskset -c N` to pin). The traffic and the pipeline harness are the criterion benches'
//! ([`strait_benches::Bench`]), so both measure the same thing.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::bail;
use serde::Serialize;
use strait_benches::{entries_per_flow, Bench, Traffic, BATCH};
use strait_config::model::Mode;

/// What to measure.
#[derive(Clone, Copy, Debug)]
struct Params {
    services: usize,
    flows: usize,
    /// Pipeline time to measure per mode and traffic.
    time: Duration,
}

impl Params {
    const DEFAULT: Params = Params {
        services: 1_000,
        flows: 1_000_000,
        time: Duration::from_secs(2),
    };
}

/// One measured case.
#[derive(Clone, Debug, Serialize)]
struct Row {
    mode: &'static str,
    traffic: &'static str,
    services: usize,
    /// Established flows, or for SYN traffic the new flows (packets) measured.
    flows: u64,
    /// `1000 / ns_per_packet`.
    mpps: f64,
    /// Median over the batches of each batch's nanoseconds per packet.
    ns_per_packet: f64,
    /// Flows the table could not store (a full bucket and group); their packets are forwarded
    /// by Maglev alone.
    stateless_flows: u64,
    /// 10th percentile of the per-batch nanoseconds per packet.
    p10_ns_per_packet: f64,
    /// 90th percentile of the per-batch nanoseconds per packet.
    p90_ns_per_packet: f64,
    /// Total time over total packets, preempted batches included.
    mean_ns_per_packet: f64,
    /// `1000 / mean_ns_per_packet`.
    mean_mpps: f64,
    /// Batches timed.
    batches: usize,
    /// Packets per batch.
    batch_size: usize,
}

#[derive(Debug, Serialize)]
struct Report {
    results: Vec<Row>,
    /// How `mpps` and `ns_per_packet` were computed.
    method: &'static str,
}

/// [`Report::method`].
const METHOD: &str = "mpps and ns_per_packet: median over the batches of each batch's \
                      ns/packet (p10/p90 alongside); mean_*: total time / total packets, \
                      preempted batches included";

/// Runs the benchmark and prints a table, or JSON (`{"results": [...]}`) if `json`.
///
/// Takes about 20 s and 0.5 GB of memory (the nat flow table holds two entries per flow).
///
/// # Errors
/// If a frame is not transmitted (a bench of drops would measure the wrong thing).
pub fn run(json: bool) -> anyhow::Result<()> {
    let rows = measure(&Params::DEFAULT)?;
    if json {
        let report = Report {
            results: rows,
            method: METHOD,
        };
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", human(&rows));
    }
    Ok(())
}

fn human(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "one unpinned core; 60-byte TCP frames in batches of {BATCH}; frame copy not timed"
    );
    let _ = writeln!(
        s,
        "Mpps, ns/packet: median of per-batch ns/packet (p10, p90 beside it); \
         mean: total time / packets, preemptions included"
    );
    let _ = writeln!(
        s,
        "{:<9} {:<12} {:>8} {:>9} {:>7} {:>10} {:>6} {:>6} {:>7} {:>7} {:>9}",
        "mode",
        "traffic",
        "services",
        "flows",
        "Mpps",
        "ns/packet",
        "p10",
        "p90",
        "mean",
        "batches",
        "stateless"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<9} {:<12} {:>8} {:>9} {:>7.2} {:>10.1} {:>6.1} {:>6.1} {:>7.1} {:>7} {:>9}",
            r.mode,
            r.traffic,
            r.services,
            r.flows,
            r.mpps,
            r.ns_per_packet,
            r.p10_ns_per_packet,
            r.p90_ns_per_packet,
            r.mean_ns_per_packet,
            r.batches,
            r.stateless_flows
        );
    }
    s
}

fn measure(p: &Params) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for mode in Mode::ALL {
        // 2^21 entries per entry a flow takes: half full with the established flows. Even so
        // a few (about 1 in 100,000) find their bucket and its group full and are forwarded
        // statelessly; the report counts them.
        let capacity = ((p.flows * entries_per_flow(mode)).max(1) * 2)
            .next_power_of_two()
            .max(1 << 21);
        for traffic in [Traffic::Established, Traffic::Syn] {
            let flows = if traffic == Traffic::Established {
                p.flows
            } else {
                0
            };
            let mut b = Bench::new(mode, traffic, p.services, flows, capacity);
            let warm_stateless = b.pipe.counters.stateless_full;
            check(&b, mode, "warm-up")?;
            let m = b.measure(p.time);
            check(&b, mode, traffic.as_str())?;
            let (flows, stateless) = match traffic {
                Traffic::Established => (p.flows as u64, warm_stateless),
                Traffic::Syn => (m.packets, b.pipe.counters.stateless_full - warm_stateless),
            };
            let (median, mean) = (m.median_ns(), m.mean_ns());
            rows.push(Row {
                mode: mode.as_str(),
                traffic: traffic.as_str(),
                services: p.services,
                flows,
                mpps: round(1e3 / median, 2),
                ns_per_packet: round(median, 1),
                stateless_flows: stateless,
                p10_ns_per_packet: round(m.quantile_ns(0.1), 1),
                p90_ns_per_packet: round(m.quantile_ns(0.9), 1),
                mean_ns_per_packet: round(mean, 1),
                mean_mpps: round(1e3 / mean, 2),
                batches: m.batches(),
                batch_size: BATCH,
            });
        }
    }
    Ok(rows)
}

/// `x` rounded to `digits` decimal places.
fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

fn check(b: &Bench, mode: Mode, phase: &str) -> anyhow::Result<()> {
    if b.not_tx > 0 {
        let c = &b.pipe.counters;
        bail!(
            "{mode} {phase}: {} of {} frames were not transmitted (pass {}, handoff {}, \
             dropped {}); the measurement would not be of forwarding",
            b.not_tx,
            c.rx,
            c.pass,
            c.handoff,
            c.dropped()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_and_traffic_forwards_everything() {
        let p = Params {
            services: 20,
            flows: 5_000,
            time: Duration::from_millis(5),
        };
        let rows = measure(&p).expect("all frames transmitted");
        assert_eq!(rows.len(), 8);
        for r in &rows {
            assert!(r.mpps > 0.0 && r.mean_mpps > 0.0, "{r:?}");
            assert_eq!(r.stateless_flows, 0, "{r:?}");
            assert!(
                r.p10_ns_per_packet <= r.ns_per_packet && r.ns_per_packet <= r.p90_ns_per_packet,
                "{r:?}"
            );
            assert!(r.batches >= strait_benches::MIN_BATCHES, "{r:?}");
            assert_eq!(r.batch_size, BATCH);
        }
        let text = human(&rows);
        assert!(text.contains("dsr-gue   syn"), "{text}");
        assert!(text.contains("median of per-batch ns/packet"), "{text}");
        let json = serde_json::to_string(&Report {
            results: rows,
            method: METHOD,
        })
        .expect("json");
        assert!(json.starts_with(
            r#"{"results":[{"mode":"dsr-l2","traffic":"established","services":20,"flows":5000,"#
        ));
        let v: serde_json::Value = serde_json::from_str(&json).expect("parses");
        let first = &v["results"][0];
        for field in [
            "mpps",
            "ns_per_packet",
            "stateless_flows",
            "p10_ns_per_packet",
            "p90_ns_per_packet",
            "mean_ns_per_packet",
            "mean_mpps",
            "batches",
        ] {
            assert!(first.get(field).is_some(), "{field} missing: {json}");
        }
        assert!(v["method"].as_str().is_some_and(|m| m.contains("median")));
    }

    /// The full benchmark, as `strait-lab bench pipeline` runs it. In release:
    /// `cargo test -p strait-lab --release bench::pipeline -- --ignored --nocapture`.
    #[test]
    #[ignore = "takes about 20 s; run in release"]
    fn full() {
        run(false).expect("benchmark runs");
    }
}
