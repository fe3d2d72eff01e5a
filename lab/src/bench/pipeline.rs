//! `strait-lab bench pipeline`: a quick, in-memory measurement of the packet path on this
//! machine, beside the reference it is judged against.
//!
//! ```text
//! synthetic config (1,000 services x 4 backends) ──► ServiceTable ──┐
//! 60-byte TCP frames ──copy (untimed)──► RX buffers ──► Pipeline::process_batch ──► Tx (timed)
//! the same flows' keys ──► one bare lookup after another in a plain hash table   (timed)
//! ```
//!
//! For each flow count (1M and 8M per core by default), each forwarding mode and each call
//! size, one pipeline (core 0 of 1, so nat never hands off) is measured on three kinds of
//! traffic for about [`Options::seconds`] each:
//!
//! - `established`: ACKs of that many established flows (warmed first: one packet each),
//!   visited in one shuffled order over and over, so each packet's flow entry is wherever the
//!   previous pass left it in the cache hierarchy (with a million flows, mostly in DRAM), as on
//!   a busy gateway;
//! - `syn`: SYNs, every one a new 5-tuple: a Maglev choice and a flow-table insert (in nat the
//!   entry also keeps the client's MAC, for the replies), into an empty table of the same size. The table is
//!   emptied (the clock jumps a day and a sweep reclaims everything, untimed) whenever it is a
//!   quarter full, so every SYN finds a free way and is remembered, as on a gateway whose table
//!   is sized for its load. A SYN flood against a full table would instead evict half-open
//!   entries; that is not measured.
//! - `mix`: nine established ACKs and one SYN in every ten packets, over the established
//!   flows' table; the SYNs' entries are reclaimed between batches (untimed) so the table stays
//!   near its warmed size ([`strait_benches::Bench::new`]).
//!
//! # The reference: one bare lookup
//!
//! Before each mode's rows the bench times a bare serial lookup in an open-addressing table of
//! the same flow count, keys looked up in the same shuffled order as the established traffic,
//! one independent lookup after another in a plain loop ([`strait_benches::bare`] has the
//! design, and why it is neither crippled nor prefetched). Each row's `ratio_to_bare` is its
//! ns/packet over that figure: the whole pipeline's cost in units of one bare lookup, measured minutes apart
//! on the same machine, so comparable across machines and loads where nanoseconds are not.
//! The per-core budget sets `target_ratio` where it has one: established dsr-l2 1.2, nat 1.5;
//! new flows (syn) 1.8 in every mode.
//!
//! # Batch sizes: which knob each one turns
//!
//! A timed batch is always [`BATCH`] frames (1,024); `--batch N` hands it to
//! `Pipeline::process_batch` in calls of N frames, as the AF_XDP worker hands it each RX batch
//! it reads (`xsk::BATCH`, 64 frames today). Inside a call the pipeline works in chunks of
//! `pipeline::BATCH` (32, a const), prefetching a chunk's flow entries before deciding any of
//! its frames. So:
//!
//! - 16: a worker RX batch of 16; one chunk of 16, half the misses in flight of a full chunk;
//! - 32: a worker RX batch equal to the pipeline's chunk: one chunk per call;
//! - 64: the worker's RX batch as configured: two chunks of 32 per call.
//!
//! A size above 32 therefore measures the per-call overhead spread over more frames, not
//! deeper prefetching; changing the chunk itself means changing `pipeline::BATCH`.
//!
//! # Memory
//!
//! The flow table gets twice the entries the flows take (one entry a flow, in every mode),
//! rounded up to a power of two, at least 2^21: 66 bytes a way ([`FlowTable::bytes_for`]). At
//! 8M flows that is 1.03 GiB, plus 480 MiB of frame templates and 640 MiB for the reference's
//! table and keys: about 2.2 GiB at the peak, reported as `peak_rss_bytes`. One pipeline
//! lives at a time.
//!
//! The `stateless` column counts the flows that found their bucket and its group (32 ways)
//! full anyway and are forwarded by Maglev alone, paying a failed insert on every packet.
//!
//! # How the figures are computed
//!
//! Each packet is a 60-byte frame (54 bytes of Ethernet, IPv4 and TCP headers, padded to the
//! Ethernet minimum). Because the pipeline rewrites frames in place and encapsulation grows
//! them at the front, frames are copied into the RX buffers before each timed batch, outside
//! the clock: that copy stands for the NIC's DMA, and like DDIO it leaves the headers in cache.
//! Only `Pipeline::process_batch` calls are inside the clock.
//!
//! Every timed batch is timed on its own, at least [`Options::seconds`] of them per row (tens of
//! thousands). The headline `Mpps` and `ns/packet` are the **median** of the per-batch
//! nanoseconds per packet; `p10`/`p90` give their spread, and `mean` is total time over total
//! packets. The median is the headline because this measures the pipeline, not the machine's
//! scheduler: on a shared core a batch the thread spent preempted takes milliseconds instead
//! of about 100 us, and a few of those decide a sum (runs of one binary differed by 2x in the
//! mean on a busy 2-core VM). The median is not a best case: half the batches were slower, and
//! slowdowns that hit most batches (cache or memory-bandwidth contention from neighbours) show
//! in it. On an idle, pinned core median and mean agree within a few percent; a larger gap is
//! time the core spent elsewhere. See [`strait_benches::Measurement`].
//!
//! The numbers are for one core, the calling thread, which is not pinned (run under
//! `taskset -c N` to pin). The traffic and the pipeline harness are the criterion benches'
//! ([`strait_benches::Bench`]), so both measure the same thing.
//!
//! The default run (2 flow counts x 4 modes x 3 traffics x 3 call sizes, 1 s each, plus
//! warm-ups and the references; filling and warming the 8M tables takes about 20 s a mode)
//! needs about 2.5 minutes of CPU, longer on a busy machine; `--flows 1M --batch 64 --mode
//! dsr-l2 --traffic established --seconds 0.5` takes seconds.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::bail;
use serde::Serialize;
use strait_benches::bare::Bare;
use strait_benches::{Bench, Measurement, Traffic, BATCH};
use strait_config::model::Mode;
use strait_dataplane::flow::FlowTable;

/// What `strait-lab bench pipeline` measures (its command-line flags).
#[derive(Clone, Debug, PartialEq, clap::Args)]
pub struct Options {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Flows per core (comma-separated; a `k` or `M` suffix multiplies by 10^3 or 10^6):
    /// the established flows, the flow table's size and the reference's table.
    #[arg(long, value_delimiter = ',', value_parser = parse_count, default_value = "1M,8M")]
    pub flows: Vec<usize>,
    /// Frames per `Pipeline::process_batch` call (comma-separated): the worker's RX batch.
    #[arg(long, value_delimiter = ',', value_parser = parse_batch, default_value = "16,32,64")]
    pub batch: Vec<usize>,
    /// Forwarding modes (comma-separated; default all).
    #[arg(long, value_delimiter = ',', value_parser = parse_mode)]
    pub mode: Vec<Mode>,
    /// Traffics (comma-separated: established, syn, mix; default all).
    #[arg(long, value_delimiter = ',', value_parser = parse_traffic)]
    pub traffic: Vec<Traffic>,
    /// Seconds of pipeline time per row (and per reference measurement).
    #[arg(long, default_value_t = 1.0, value_parser = parse_seconds)]
    pub seconds: f64,
    /// Services in the synthetic configuration (4 backends each).
    #[arg(long, default_value_t = 1_000)]
    pub services: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            json: false,
            flows: vec![1_000_000, 8_000_000],
            batch: vec![16, 32, 64],
            mode: Vec::new(),
            traffic: Vec::new(),
            seconds: 1.0,
            services: 1_000,
        }
    }
}

/// A count, with an optional `k` (10^3) or `M` (10^6) suffix, at least 1.
fn parse_count(s: &str) -> Result<usize, String> {
    let (digits, unit) = match s.strip_suffix(['k', 'K']) {
        Some(d) => (d, 1_000),
        None => match s.strip_suffix('M') {
            Some(d) => (d, 1_000_000),
            None => (s, 1),
        },
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a count (e.g. 1000, 500k, 8M)"))?;
    match n.checked_mul(unit) {
        Some(n) if n > 0 => Ok(n),
        _ => Err(format!("{s:?}: a flow count must be at least 1")),
    }
}

/// A call size, 1..=[`BATCH`].
fn parse_batch(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=BATCH).contains(&n) => Ok(n),
        _ => Err(format!("{s:?}: frames per call must be 1 to {BATCH}")),
    }
}

/// A mode by its configuration spelling.
fn parse_mode(s: &str) -> Result<Mode, String> {
    Mode::ALL
        .into_iter()
        .find(|m| m.as_str() == s)
        .ok_or_else(|| format!("{s:?} is not a mode (dsr-l2, dsr-ipip, dsr-gue, nat)"))
}

/// A traffic by its report name.
fn parse_traffic(s: &str) -> Result<Traffic, String> {
    Traffic::ALL
        .into_iter()
        .find(|t| t.as_str() == s)
        .ok_or_else(|| format!("{s:?} is not a traffic (established, syn, mix)"))
}

/// Seconds, positive and finite.
fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!("{s:?}: seconds must be a positive number")),
    }
}

/// What to measure, resolved from [`Options`].
#[derive(Clone, Debug)]
struct Params {
    services: usize,
    flows: Vec<usize>,
    calls: Vec<usize>,
    modes: Vec<Mode>,
    traffics: Vec<Traffic>,
    /// Pipeline time to measure per row.
    time: Duration,
}

impl Params {
    fn of(o: &Options) -> Self {
        Self {
            services: o.services.max(1),
            flows: o.flows.clone(),
            calls: o.batch.clone(),
            modes: if o.mode.is_empty() {
                Mode::ALL.to_vec()
            } else {
                o.mode.clone()
            },
            traffics: if o.traffic.is_empty() {
                Traffic::ALL.to_vec()
            } else {
                o.traffic.clone()
            },
            time: Duration::from_secs_f64(o.seconds),
        }
    }
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
    /// Frames per `Pipeline::process_batch` call (the worker's RX batch).
    batch_size: usize,
    /// Frames per timed batch ([`BATCH`]), handed over in calls of `batch_size`.
    timed_batch: usize,
    /// The flow count of the run: established flows (established, mix) and the size the flow
    /// table and the reference are built for (all traffics).
    flows_per_core: usize,
    /// Flow-table ways.
    flow_capacity: usize,
    /// Bytes the flow table allocated.
    flow_table_bytes: u64,
    /// The reference measured just before this mode's rows: median ns of one bare
    /// lookup in a table of `flows_per_core` flows.
    bare_lookup_ns: f64,
    /// `ns_per_packet / bare_lookup_ns`.
    ratio_to_bare: f64,
    /// The per-core budget's ceiling on `ratio_to_bare`, where it sets one.
    target_ratio: Option<f64>,
}

/// One measurement of the reference.
#[derive(Clone, Debug, Serialize)]
struct BareRow {
    /// The mode whose rows follow it.
    before_mode: &'static str,
    flows_per_core: usize,
    /// Median over the batches of each batch's nanoseconds per lookup.
    ns_per_lookup: f64,
    p10_ns_per_lookup: f64,
    p90_ns_per_lookup: f64,
    mean_ns_per_lookup: f64,
    batches: usize,
    /// Bytes of the reference's table and keys.
    table_bytes: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    results: Vec<Row>,
    /// Every measurement of the reference.
    bare: Vec<BareRow>,
    /// How `mpps` and `ns_per_packet` were computed.
    method: &'static str,
    /// How the reference was computed.
    bare_method: &'static str,
    /// The process's peak resident memory (`VmHWM`), if readable.
    peak_rss_bytes: Option<u64>,
}

/// [`Report::method`].
const METHOD: &str = "mpps and ns_per_packet: median over the batches of each batch's \
                      ns/packet (p10/p90 alongside); mean_*: total time / total packets, \
                      preempted batches included; a timed batch is timed_batch frames handed \
                      to process_batch in calls of batch_size";

/// [`Report::bare_method`].
const BARE_METHOD: &str = "independent lookups one after another in a plain loop (no \
                           prefetch, no staging) in a linear-probing table of 32-byte slots \
                           (16-byte key, 8-byte value), load <= 1/2, on transparent huge \
                           pages as the flow table, the dataplane's flow hash, keys in the \
                           established traffic's order; not prefetched; median of per-batch \
                           ns/lookup over batches of timed_batch lookups";

/// Runs the benchmark and prints a table, or JSON (`{"results": [...], "bare": [...]}`).
///
/// # Errors
/// If a frame is not transmitted (a bench of drops would measure the wrong thing).
pub fn run(o: &Options) -> anyhow::Result<()> {
    let (rows, bare) = measure(&Params::of(o))?;
    let report = Report {
        results: rows,
        bare,
        method: METHOD,
        bare_method: BARE_METHOD,
        peak_rss_bytes: peak_rss(),
    };
    if o.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", human(&report));
    }
    Ok(())
}

/// The process's peak resident set (`VmHWM` of `/proc/self/status`), in bytes.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
}

fn human(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "one unpinned core; 60-byte TCP frames, timed in batches of {BATCH} handed to \
         process_batch in calls of `batch`; frame copy not timed"
    );
    let _ = writeln!(
        s,
        "ns/packet: median of per-batch ns/packet (p10, p90 beside it); mean: total time / \
         packets, preemptions included; ratio: ns/packet over the bare lookup measured just \
         before the mode's rows"
    );
    let _ = writeln!(
        s,
        "{:<9} {:<12} {:>9} {:>5} {:>7} {:>9} {:>6} {:>6} {:>7} {:>6} {:>6} {:>7} {:>9}",
        "mode",
        "traffic",
        "flows",
        "batch",
        "Mpps",
        "ns/packet",
        "p10",
        "p90",
        "mean",
        "ratio",
        "target",
        "batches",
        "stateless"
    );
    let mut bare = r.bare.iter();
    let mut last = None;
    for row in &r.results {
        if last != Some((row.mode, row.flows_per_core)) {
            last = Some((row.mode, row.flows_per_core));
            if let Some(b) = bare.next() {
                let _ = writeln!(
                    s,
                    "{:<9} {:<12} {:>9} {:>5} {:>7.2} {:>9.1} {:>6.1} {:>6.1} {:>7.1} {:>6} \
                     {:>6} {:>7}  table {} MiB, flow table {} MiB",
                    "bare",
                    "lookup",
                    b.flows_per_core,
                    "-",
                    1e3 / b.ns_per_lookup,
                    b.ns_per_lookup,
                    b.p10_ns_per_lookup,
                    b.p90_ns_per_lookup,
                    b.mean_ns_per_lookup,
                    "1.00",
                    "",
                    b.batches,
                    b.table_bytes >> 20,
                    row.flow_table_bytes >> 20,
                );
            }
        }
        let target = row
            .target_ratio
            .map_or(String::new(), |t| format!("{t:.1}"));
        let _ = writeln!(
            s,
            "{:<9} {:<12} {:>9} {:>5} {:>7.2} {:>9.1} {:>6.1} {:>6.1} {:>7.1} {:>6.2} {:>6} \
             {:>7} {:>9}",
            row.mode,
            row.traffic,
            row.flows,
            row.batch_size,
            row.mpps,
            row.ns_per_packet,
            row.p10_ns_per_packet,
            row.p90_ns_per_packet,
            row.mean_ns_per_packet,
            row.ratio_to_bare,
            target,
            row.batches,
            row.stateless_flows
        );
    }
    if let Some(b) = r.peak_rss_bytes {
        let _ = writeln!(s, "peak resident memory: {} MiB", b >> 20);
    }
    s
}

/// The per-core budget's ceiling on the ratio to a bare lookup, where it sets one.
fn target_ratio(mode: Mode, traffic: Traffic) -> Option<f64> {
    match (mode, traffic) {
        (Mode::DsrL2, Traffic::Established) => Some(1.2),
        (Mode::Nat, Traffic::Established) => Some(1.5),
        (_, Traffic::Syn) => Some(1.8),
        _ => None,
    }
}

fn measure(p: &Params) -> anyhow::Result<(Vec<Row>, Vec<BareRow>)> {
    let mut rows = Vec::new();
    let mut bares = Vec::new();
    for &flows in &p.flows {
        let mut bare = Bare::new(flows, p.services);
        for &mode in &p.modes {
            let bm = bare.measure(p.time);
            let bare_ns = bm.median_ns();
            bares.push(BareRow {
                before_mode: mode.as_str(),
                flows_per_core: flows,
                ns_per_lookup: round(bare_ns, 1),
                p10_ns_per_lookup: round(bm.quantile_ns(0.1), 1),
                p90_ns_per_lookup: round(bm.quantile_ns(0.9), 1),
                mean_ns_per_lookup: round(bm.mean_ns(), 1),
                batches: bm.batches(),
                table_bytes: bare.bytes(),
            });
            // Twice the entries the flows take, at least 2^21: half full with the established
            // flows. Even so a few (about 1 in 100,000) find their bucket and its group full
            // and are forwarded statelessly; the report counts them.
            let capacity = (flows * 2).next_power_of_two().max(1 << 21);
            let case = Case {
                mode,
                flows,
                capacity,
                bare_ns,
            };
            let with_flows: Vec<Traffic> = p
                .traffics
                .iter()
                .copied()
                .filter(|t| t.has_established())
                .collect();
            if !with_flows.is_empty() {
                let mut b = Bench::new(mode, Traffic::Established, p.services, flows, capacity);
                check(&b, mode, "warm-up")?;
                let warm_stateless = b.pipe.counters.stateless_full;
                for traffic in with_flows {
                    b.set_traffic(traffic);
                    for &call in &p.calls {
                        rows.push(case.row(p, &mut b, traffic, call, warm_stateless)?);
                    }
                }
            }
            if p.traffics.contains(&Traffic::Syn) {
                let mut b = Bench::new(mode, Traffic::Syn, p.services, 0, capacity);
                for &call in &p.calls {
                    rows.push(case.row(p, &mut b, Traffic::Syn, call, 0)?);
                }
            }
        }
    }
    Ok((rows, bares))
}

/// A mode at a flow count, and its reference.
struct Case {
    mode: Mode,
    flows: usize,
    capacity: usize,
    bare_ns: f64,
}

impl Case {
    /// Measures `traffic` on `b` in calls of `call` frames.
    fn row(
        &self,
        p: &Params,
        b: &mut Bench,
        traffic: Traffic,
        call: usize,
        warm_stateless: u64,
    ) -> anyhow::Result<Row> {
        b.set_call_size(call);
        let before = b.pipe.counters.stateless_full;
        let m: Measurement = b.measure(p.time);
        check(b, self.mode, traffic.as_str())?;
        let new = b.pipe.counters.stateless_full - before;
        let (flows, stateless) = match traffic {
            Traffic::Established => (self.flows as u64, warm_stateless),
            Traffic::Mix => (self.flows as u64, warm_stateless + new),
            Traffic::Syn => (m.packets, new),
        };
        let (median, mean) = (m.median_ns(), m.mean_ns());
        Ok(Row {
            mode: self.mode.as_str(),
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
            batch_size: call,
            timed_batch: BATCH,
            flows_per_core: self.flows,
            flow_capacity: self.capacity,
            flow_table_bytes: FlowTable::bytes_for(self.capacity),
            bare_lookup_ns: round(self.bare_ns, 1),
            ratio_to_bare: round(median / self.bare_ns, 2),
            target_ratio: target_ratio(self.mode, traffic),
        })
    }
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
    use clap::Parser as _;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        o: Options,
    }

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Cli::try_parse_from(std::iter::once("pipeline").chain(args.iter().copied())).map(|c| c.o)
    }

    #[test]
    fn options_select_subsets_and_default_to_everything() {
        let o = parse(&[]).expect("defaults");
        assert_eq!(o, Options::default());
        let p = Params::of(&o);
        assert_eq!(p.flows, [1_000_000, 8_000_000]);
        assert_eq!(p.calls, [16, 32, 64]);
        assert_eq!(p.modes, Mode::ALL);
        assert_eq!(p.traffics, Traffic::ALL);
        assert_eq!(p.time, Duration::from_secs(1));
        let o = parse(&[
            "--flows",
            "500k,2M",
            "--batch",
            "64",
            "--mode",
            "nat,dsr-l2",
            "--traffic",
            "mix",
            "--seconds",
            "0.5",
            "--json",
        ])
        .expect("subsets");
        let p = Params::of(&o);
        assert_eq!(p.flows, [500_000, 2_000_000]);
        assert_eq!(p.calls, [64]);
        assert_eq!(p.modes, [Mode::Nat, Mode::DsrL2]);
        assert_eq!(p.traffics, [Traffic::Mix]);
        assert_eq!(p.time, Duration::from_millis(500));
        assert!(o.json);
        for (bad, says) in [
            (&["--flows", "0"][..], "at least 1"),
            (&["--flows", "lots"], "not a count"),
            (&["--batch", "0"], "1 to 1024"),
            (&["--batch", "2048"], "1 to 1024"),
            (&["--mode", "dsr"], "not a mode"),
            (&["--traffic", "udp"], "not a traffic"),
            (&["--seconds", "0"], "positive"),
        ] {
            let e = parse(bad).expect_err("refused").to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn every_mode_traffic_and_batch_forwards_everything_beside_the_reference() {
        let p = Params {
            services: 20,
            flows: vec![5_000],
            calls: vec![16, 64],
            modes: Mode::ALL.to_vec(),
            traffics: Traffic::ALL.to_vec(),
            time: Duration::from_millis(5),
        };
        let (rows, bare) = measure(&p).expect("all frames transmitted");
        assert_eq!(rows.len(), 4 * 3 * 2);
        assert_eq!(bare.len(), 4, "one reference per mode");
        for b in &bare {
            assert!(b.ns_per_lookup > 0.0, "{b:?}");
            assert_eq!(b.table_bytes, 16_384 * 32 + 5_000 * 16);
        }
        for (i, r) in rows.iter().enumerate() {
            assert!(r.mpps > 0.0 && r.mean_mpps > 0.0, "{r:?}");
            assert_eq!(r.stateless_flows, 0, "{r:?}");
            assert!(
                r.p10_ns_per_packet <= r.ns_per_packet && r.ns_per_packet <= r.p90_ns_per_packet,
                "{r:?}"
            );
            assert!(r.batches >= strait_benches::MIN_BATCHES, "{r:?}");
            assert_eq!(r.batch_size, [16, 64][i % 2], "{r:?}");
            assert_eq!(r.timed_batch, BATCH);
            assert_eq!(r.flows_per_core, 5_000);
            assert_eq!(r.flow_capacity, 1 << 21);
            assert_eq!(r.flow_table_bytes, FlowTable::bytes_for(1 << 21));
            let b = &bare[i / 6];
            assert_eq!(b.before_mode, r.mode);
            assert_eq!(r.bare_lookup_ns, b.ns_per_lookup);
            let ratio = r.ns_per_packet / r.bare_lookup_ns;
            assert!(
                (r.ratio_to_bare - ratio).abs() <= 0.01 * ratio + 0.01,
                "{r:?}"
            );
        }
        let order: Vec<(&str, &str)> = rows.iter().map(|r| (r.mode, r.traffic)).collect();
        assert_eq!(
            order[..6],
            [
                ("dsr-l2", "established"),
                ("dsr-l2", "established"),
                ("dsr-l2", "mix"),
                ("dsr-l2", "mix"),
                ("dsr-l2", "syn"),
                ("dsr-l2", "syn"),
            ]
        );
        assert_eq!(rows[0].target_ratio, Some(1.2));
        assert_eq!(rows[2].target_ratio, None);
        assert_eq!(rows[4].target_ratio, Some(1.8));
        assert_eq!(rows[18].target_ratio, Some(1.5), "{:?}", rows[18]);
        assert_eq!(
            rows[4].flows,
            rows[4].batches as u64 * BATCH as u64,
            "syn: new flows"
        );
        assert_eq!(rows[2].flows, 5_000, "mix: established flows");
        let report = Report {
            results: rows,
            bare,
            method: METHOD,
            bare_method: BARE_METHOD,
            peak_rss_bytes: peak_rss(),
        };
        assert!(report.peak_rss_bytes.is_some_and(|b| b > 1 << 20));
        let text = human(&report);
        assert!(text.contains("dsr-gue   syn"), "{text}");
        assert!(text.contains("bare      lookup"), "{text}");
        assert!(text.contains("median of per-batch ns/packet"), "{text}");
        let json = serde_json::to_string(&report).expect("json");
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
            "batch_size",
            "timed_batch",
            "flows_per_core",
            "flow_table_bytes",
            "bare_lookup_ns",
            "ratio_to_bare",
            "target_ratio",
        ] {
            assert!(first.get(field).is_some(), "{field} missing: {json}");
        }
        assert!(v["bare"][0]["ns_per_lookup"]
            .as_f64()
            .is_some_and(|x| x > 0.0));
        assert!(v["method"].as_str().is_some_and(|m| m.contains("median")));
        assert!(v["bare_method"]
            .as_str()
            .is_some_and(|m| m.contains("plain loop")));
    }

    /// The full benchmark, as `strait-lab bench pipeline` runs it. In release:
    /// `cargo test -p strait-lab --release bench::pipeline -- --ignored --nocapture`.
    #[test]
    #[ignore = "takes minutes and 3.3 GB; run in release"]
    fn full() {
        run(&Options::default()).expect("benchmark runs");
    }
}
