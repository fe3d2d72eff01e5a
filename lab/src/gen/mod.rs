//! `strait-lab gen`: the AF_XDP traffic generator of the line-rate benchmark, with latency
//! probes.
//!
//! The sending is [`TxGen`] on a thread of its own (pinned with
//! `--core`); this module parses the command line, reports the offered rate once a second on
//! stderr, receives the reflected latency probes on an ordinary UDP socket, and prints the
//! summary (one JSON object on stdout with `--json`). SIGINT and SIGTERM end the run early,
//! with the summary.
//!
//! Frame size: `--size` is the frame as handed to the interface, Ethernet header included
//! and FCS excluded (64 by default, so 68 bytes with the FCS a NIC adds; `--size 60` is the
//! 64-byte minimum frame on the wire). The IPv4 packet fills it: no Ethernet padding.
//!
//! Latency: probes leave in the load's TX stream, timestamped with `CLOCK_MONOTONIC` when put
//! on the TX ring; a reflection's latency is its receive time (read right after `recv`) less
//! that timestamp. Percentiles come from an HdrHistogram (the `hdrhistogram` crate, 3
//! significant digits): constant memory however long the run, constant-time recording, and
//! a relative error below 0.1% at every magnitude, which a fixed-width histogram cannot give
//! at once.

use std::net::{Ipv4Addr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use strait_config::MacAddr;
use strait_dataplane::xsk::BindPolicy;

pub use tx::{
    monotonic_ns, Flows, GenConfig, GenCounters, GenStats, ProbeConfig, Traffic, TxGen, MIN_FRAME,
    PROBE_FRAME, PROBE_MAGIC, PROBE_PAYLOAD,
};

pub mod tx;

/// Most destinations one `--to` may expand to (ranges multiply).
const MAX_TARGETS: usize = 1 << 20;

/// How long the probe receiver keeps listening after the last packet was sent, for
/// reflections still on their way back.
const PROBE_GRACE: Duration = Duration::from_millis(300);

/// The receiver's socket read timeout: how often it looks at its stop flag.
const RECV_TIMEOUT: Duration = Duration::from_millis(50);

/// Traffic kinds of `--traffic`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TrafficArg {
    /// UDP datagrams.
    Udp,
    /// TCP SYN segments.
    Syn,
    /// TCP ACK segments of established flows.
    Tcp,
}

/// `strait-lab gen` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Interface to send on (in this network namespace).
    #[arg(long)]
    pub iface: String,
    /// Destination MAC of every frame (the next hop, e.g. the forwarder's interface).
    #[arg(long)]
    pub dst_mac: MacAddr,
    /// Source MAC (default: the interface's own).
    #[arg(long)]
    pub src_mac: Option<MacAddr>,
    /// Destinations, `VIP:PORT[,VIP:PORT...]`; each may be a range,
    /// `203.0.113.1-203.0.113.250:1000-1039` (every address with every port). Flow k goes to
    /// destination k mod count.
    #[arg(long, required = true, value_delimiter = ',')]
    pub to: Vec<String>,
    /// UDP, TCP SYN, or established TCP (ACK segments).
    #[arg(long, value_enum, default_value = "udp")]
    pub traffic: TrafficArg,
    /// N flows, cycled (established traffic). Default 1 without `--new-flows`.
    #[arg(long, conflicts_with = "new_flows")]
    pub flows: Option<u32>,
    /// Every packet a new 5-tuple (walks source address x source port).
    #[arg(long)]
    pub new_flows: bool,
    /// Source addresses, `A-B` inclusive.
    #[arg(long, default_value = "192.0.2.16-192.0.2.250")]
    pub src_range: String,
    /// Source ports, `A-B` inclusive.
    #[arg(long, default_value = "1024-65535")]
    pub sport_range: String,
    /// Frame length in bytes without FCS, 60 (Ethernet minimum) to 3776.
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Packets per second, or `max`.
    #[arg(long, default_value = "max")]
    pub rate: String,
    /// Seconds to run (fractions allowed); default until SIGINT/SIGTERM or `--count`.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Stop after this many packets (probes not counted).
    #[arg(long)]
    pub count: Option<u64>,
    /// NIC queue to send on.
    #[arg(long, default_value_t = 0)]
    pub queue: u32,
    /// Pin the sending thread to this CPU.
    #[arg(long)]
    pub core: Option<usize>,
    /// Send latency probes from `--probe-src`:PORT and receive their reflections there.
    #[arg(long)]
    pub latency_port: Option<u16>,
    /// Probes per second.
    #[arg(long, default_value_t = 1000)]
    pub probe_rate: u64,
    /// Source address of the probes: an address of this namespace, where the reflections
    /// come back.
    #[arg(long, default_value = "192.0.2.1")]
    pub probe_src: Ipv4Addr,
    /// Copy mode only (default: zero-copy, falling back to copy).
    #[arg(long)]
    pub copy: bool,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// The `--json` summary.
#[derive(Debug, Serialize)]
struct Summary {
    sent: u64,
    seconds: f64,
    offered_pps: f64,
    tx_errors: u64,
    probes: Option<ProbeSummary>,
}

/// Latency probe results; percentiles are `null` when no reflection came back.
#[derive(Debug, Serialize)]
struct ProbeSummary {
    sent: u64,
    received: u64,
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    p999_us: Option<f64>,
}

/// Parses `A-B` (or a single `A`) of something parseable, inclusive, `A <= B`.
fn parse_range<T: std::str::FromStr + PartialOrd + Copy>(what: &str, s: &str) -> Result<(T, T)> {
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let p = |x: &str| {
        x.trim()
            .parse::<T>()
            .map_err(|_| anyhow::anyhow!("{what} {s:?}: cannot parse {x:?}"))
    };
    let (a, b) = (p(a)?, p(b)?);
    if a > b {
        bail!("{what} {s:?}: the range is reversed");
    }
    Ok((a, b))
}

/// Expands the `--to` list: `VIP:PORT` or `A-B:P-Q` each.
fn parse_targets(items: &[String]) -> Result<Vec<(Ipv4Addr, u16)>> {
    let mut out = Vec::new();
    for item in items {
        let (addrs, ports) = item
            .rsplit_once(':')
            .with_context(|| format!("--to {item:?}: expected VIP:PORT"))?;
        let (a, b): (Ipv4Addr, Ipv4Addr) = parse_range("--to address", addrs)?;
        let (p, q): (u16, u16) = parse_range("--to port", ports)?;
        if p == 0 {
            bail!("--to {item:?}: port 0");
        }
        let n = (u32::from(b) - u32::from(a)) as usize + 1;
        if out.len() + n * (q - p + 1) as usize > MAX_TARGETS {
            bail!("--to: more than {MAX_TARGETS} destinations");
        }
        for addr in u32::from(a)..=u32::from(b) {
            for port in p..=q {
                out.push((Ipv4Addr::from(addr), port));
            }
        }
    }
    Ok(out)
}

impl Args {
    /// The generator's configuration; errors name the flag.
    fn config(&self) -> Result<GenConfig> {
        let rate = match self.rate.as_str() {
            "max" => None,
            r => Some(
                r.parse::<u64>()
                    .ok()
                    .filter(|&r| r > 0)
                    .with_context(|| format!("--rate {r:?}: a positive number or max"))?,
            ),
        };
        let src_mac = match self.src_mac {
            Some(m) => m.octets(),
            None => strait_dataplane::xsk::interface_port(&self.iface)
                .with_context(|| format!("--iface {}", self.iface))?
                .mac_addr()
                .octets(),
        };
        if let Some(d) = self.duration {
            if !(d.is_finite() && d > 0.0) {
                bail!("--duration {d}: a positive number of seconds");
            }
        }
        let cfg = GenConfig {
            iface: self.iface.clone(),
            queue: self.queue,
            src_mac,
            dst_mac: self.dst_mac.octets(),
            targets: parse_targets(&self.to)?,
            traffic: match self.traffic {
                TrafficArg::Udp => Traffic::Udp,
                TrafficArg::Syn => Traffic::Syn,
                TrafficArg::Tcp => Traffic::Tcp,
            },
            flows: if self.new_flows {
                Flows::New
            } else {
                Flows::Cycle(self.flows.unwrap_or(1))
            },
            src_range: parse_range("--src-range", &self.src_range)?,
            sport_range: parse_range("--sport-range", &self.sport_range)?,
            size: self.size,
            rate,
            count: self.count,
            probes: self.latency_port.map(|port| ProbeConfig {
                src: self.probe_src,
                port,
                rate: self.probe_rate,
            }),
            bind: if self.copy {
                BindPolicy::CopyOnly
            } else {
                BindPolicy::ZeroCopyOrCopy
            },
        };
        cfg.check().context("strait-lab gen")?;
        Ok(cfg)
    }
}

/// The receiver of reflected probes: counts them and records their latency.
struct ProbeReceiver {
    stop: Arc<AtomicBool>,
    received: Arc<AtomicU64>,
    thread: thread::JoinHandle<Result<Histogram>>,
}

impl ProbeReceiver {
    /// Binds `src:port` (before any probe leaves) and starts the receiving thread.
    fn start(src: Ipv4Addr, port: u16) -> Result<Self> {
        let sock = UdpSocket::bind((src, port)).with_context(|| {
            format!("binding the probe socket {src}:{port} (is {src} an address of this namespace? see --probe-src)")
        })?;
        sock.set_read_timeout(Some(RECV_TIMEOUT))
            .context("probe socket timeout")?;
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let (s, r) = (Arc::clone(&stop), Arc::clone(&received));
        let thread = thread::Builder::new()
            .name("gen-probes".into())
            .spawn(move || receive(&sock, &s, &r))
            .context("spawning the probe receiver")?;
        Ok(Self {
            stop,
            received,
            thread,
        })
    }

    /// Stops the thread and returns the histogram of latencies in nanoseconds.
    fn finish(self) -> Result<Histogram> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("probe receiver panicked"))?
    }
}

/// Receives reflections until `stop`: a datagram whose payload starts with the probe magic
/// and holds a sequence number and a timestamp; anything else is ignored.
fn receive(sock: &UdpSocket, stop: &AtomicBool, received: &AtomicU64) -> Result<Histogram> {
    let mut h = histogram();
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) => return Err(e).context("receiving probes"),
        };
        let now = monotonic_ns();
        if n < PROBE_PAYLOAD || &buf[..8] != PROBE_MAGIC {
            continue;
        }
        let ts = u64::from_le_bytes(buf[16..24].try_into().expect("8 bytes"));
        if ts == 0 || ts > now {
            continue;
        }
        h.saturating_record(now - ts);
        received.fetch_add(1, Ordering::Relaxed);
    }
    Ok(h)
}

/// `strait-lab gen`.
pub fn run(args: &Args) -> Result<()> {
    let cfg = args.config()?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing signal handlers")?;
    }
    let probes = cfg.probes;
    let receiver = match probes {
        Some(p) => Some(ProbeReceiver::start(p.src, p.port)?),
        None => None,
    };
    let mut gen = TxGen::open(cfg.clone()).context("strait-lab gen: opening the AF_XDP socket")?;
    let mode = gen.bind_mode();
    let counters = Arc::new(GenCounters::default());
    let until = args.duration.map(|d| monotonic_ns() + (d * 1e9) as u64);
    let sender = {
        let (stop, counters) = (Arc::clone(&stop), Arc::clone(&counters));
        let core = args.core;
        thread::Builder::new()
            .name("gen-tx".into())
            .spawn(move || -> Result<GenStats> {
                if let Some(c) = core {
                    crate::pin_thread(c).with_context(|| format!("--core {c}"))?;
                }
                Ok(gen.run(&stop, until, &counters)?)
            })
            .context("spawning the sender")?
    };
    eprintln!(
        "strait-lab gen: {} queue {} ({mode} mode), {} destination(s), {} {}-byte frames, {}, rate {}",
        cfg.iface,
        cfg.queue,
        cfg.targets.len(),
        match cfg.traffic {
            Traffic::Udp => "udp",
            Traffic::Syn => "tcp syn",
            Traffic::Tcp => "tcp established",
        },
        cfg.size,
        match cfg.flows {
            Flows::New => "new flows".to_string(),
            Flows::Cycle(n) => format!("{n} flows"),
        },
        args.rate
    );
    // Once a second: the rate offered in that second.
    let start = monotonic_ns();
    let (mut last_t, mut last_sent, mut next) = (start, 0u64, start + 1_000_000_000);
    while !sender.is_finished() {
        thread::sleep(Duration::from_millis(20));
        let now = monotonic_ns();
        if now >= next {
            let sent = counters.sent.load(Ordering::Relaxed);
            let pps = sent.saturating_sub(last_sent) as f64 * 1e9 / (now - last_t) as f64;
            let rx = receiver
                .as_ref()
                .map(|r| {
                    format!(
                        ", probes {} sent {} back",
                        counters.probes.load(Ordering::Relaxed),
                        r.received.load(Ordering::Relaxed)
                    )
                })
                .unwrap_or_default();
            eprintln!(
                "{:>6.1} s  offered {:>12} pps  total {:>12}{rx}",
                (now - start) as f64 / 1e9,
                thousands(pps.round() as u64),
                thousands(sent)
            );
            (last_t, last_sent) = (now, sent);
            next += 1_000_000_000;
        }
    }
    let stats = sender
        .join()
        .map_err(|_| anyhow::anyhow!("the sender panicked"))??;
    let probe_summary = match receiver {
        Some(r) => {
            thread::sleep(PROBE_GRACE);
            let h = r.finish()?;
            let received = h.len();
            let q = |q: f64| quantile(&h, q).map(|ns| ns as f64 / 1e3);
            Some(ProbeSummary {
                sent: stats.probes,
                received,
                p50_us: q(0.5),
                p99_us: q(0.99),
                p999_us: q(0.999),
            })
        }
        None => None,
    };
    let seconds = stats.elapsed_ns as f64 / 1e9;
    let summary = Summary {
        sent: stats.sent,
        seconds,
        offered_pps: if seconds > 0.0 {
            stats.sent as f64 / seconds
        } else {
            0.0
        },
        tx_errors: stats.tx_errors,
        probes: probe_summary,
    };
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print_human(&summary);
    }
    Ok(())
}

fn print_human(s: &Summary) {
    println!(
        "sent {} packets in {:.2} s: {:.3} Mpps offered, {} TX errors",
        thousands(s.sent),
        s.seconds,
        s.offered_pps / 1e6,
        s.tx_errors
    );
    if let Some(p) = &s.probes {
        let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1} µs"));
        println!(
            "probes: {} sent, {} received; latency p50 {}, p99 {}, p99.9 {}",
            p.sent,
            p.received,
            us(p.p50_us),
            us(p.p99_us),
            us(p.p999_us)
        );
    }
}

/// Probe round trips in nanoseconds, to 3 significant digits.
type Histogram = hdrhistogram::Histogram<u64>;

/// Longest round trip told apart: a minute (longer ones count as a minute).
const LONGEST_NS: u64 = 60_000_000_000;

/// An empty [`Histogram`] for 1 ns to [`LONGEST_NS`] (about 500 KiB).
fn histogram() -> Histogram {
    Histogram::new_with_bounds(1, LONGEST_NS, 3).expect("valid HdrHistogram bounds")
}

/// The value at quantile `q` (0..=1); `None` when nothing was recorded.
fn quantile(h: &Histogram, q: f64) -> Option<u64> {
    (!h.is_empty()).then(|| h.value_at_quantile(q))
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_expand_ranges() {
        let t = parse_targets(&[
            "203.0.113.1:80".into(),
            "203.0.113.10-203.0.113.11:1000-1002".into(),
        ])
        .unwrap();
        assert_eq!(t.len(), 7);
        assert_eq!(t[0], (Ipv4Addr::new(203, 0, 113, 1), 80));
        assert_eq!(t[1], (Ipv4Addr::new(203, 0, 113, 10), 1000));
        assert_eq!(t[6], (Ipv4Addr::new(203, 0, 113, 11), 1002));
        assert!(parse_targets(&["203.0.113.1".into()]).is_err());
        assert!(parse_targets(&["203.0.113.2-203.0.113.1:80".into()])
            .unwrap_err()
            .to_string()
            .contains("reversed"));
        assert!(parse_targets(&["203.0.113.1:0".into()]).is_err());
    }

    #[test]
    fn histogram_quantiles_match_sorting() {
        let mut h = histogram();
        assert_eq!(quantile(&h, 0.5), None);
        let mut vals: Vec<u64> = (0..10_007u64)
            .map(|i| (i * 7919) % 10_007 * 997 + 3)
            .collect();
        for &v in &vals {
            h.saturating_record(v);
        }
        vals.sort_unstable();
        for q in [0.5, 0.99, 0.999, 1.0] {
            let exact = vals[((q * vals.len() as f64).ceil() as usize).max(1) - 1];
            let got = quantile(&h, q).unwrap();
            assert!(
                got >= exact && (got - exact) as f64 <= exact as f64 / 128.0,
                "q {q}: {got} vs {exact}"
            );
        }
        let mut small = histogram();
        for v in [5, 1, 3] {
            small.saturating_record(v);
        }
        assert_eq!(quantile(&small, 0.5), Some(3), "exact below 256");
        assert_eq!(small.len(), 3);
    }

    #[test]
    fn thousands_groups() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }
}
