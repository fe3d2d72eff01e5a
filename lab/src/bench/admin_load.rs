//! `strait-lab bench admin`: what an abused admin API costs forwarding.
//!
//! ```text
//! testbed (one gateway, 4 backends) ── strait run ── two phases of --seconds each:
//!   quiet    strait-lab gen: UDP to the VIP at --rate (1,000 flows from the client's
//!            address), 50 long-lived TCP streams and short HTTP requests (bench failover's
//!            client), a GET /healthz every 20 ms from the gateway's namespace;
//!   abused   the same, while in the gateway's namespace 1,000 idle connections are held
//!            open (reopened when the API closes them), 50 slow clients send a request a
//!            byte every 100 ms, and 4 threads send malformed, oversized, GET /metrics and
//!            GET /services requests, --abuse-rate a second in all.
//! ```
//!
//! Per phase: frames offered by the generator; what the gateway did with the frames its
//! steering program sent to the workers (`redirected`; the generator's and the streams'):
//! sent on (`forwarded`) or not (`lost`: dropped in a full ring or by a worker); streams
//! reset, the longest stall, short requests failed, and `/healthz`'s latency and failures;
//! and what the abusers met (answers by status, connections the API closed).
//! `forwarded_ratio` is the abused phase's share forwarded over the quiet one's, in one run.
//! The abusers run on the same two cores as everything else, so they also take CPU from the
//! generator: the rate offered drops, the share forwarded is what tells the gateway's part.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use serde::Serialize;

use super::failover::{admin, catch_stop, cpu_model, interrupted, Client, Fleet};
use super::flood::gen;
use super::spawn_in_netns;
use crate::testbed;

/// `strait-lab bench admin` options.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Seconds each phase lasts.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// UDP frames per second offered to the VIP by the generator.
    #[arg(long, default_value_t = 20_000)]
    pub rate: u64,
    /// Long-lived TCP streams through the gateway.
    #[arg(long, default_value_t = 50)]
    pub streams: usize,
    /// Idle connections held open to the admin API in the abused phase.
    #[arg(long, default_value_t = 1000)]
    pub idle: usize,
    /// Slow clients (a byte every 100 ms) in the abused phase.
    #[arg(long, default_value_t = 50)]
    pub slow: usize,
    /// Malformed, oversized and scrape requests per second in the abused phase, in all.
    #[arg(long, default_value_t = 400)]
    pub abuse_rate: u64,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The testbed's namespace prefix.
    #[arg(long, default_value = "sad")]
    pub prefix: String,
}

/// One phase's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// `quiet` or `abused`.
    pub phase: &'static str,
    /// UDP frames the generator sent, and their rate.
    pub offered: u64,
    /// Frames per second offered.
    pub offered_pps: f64,
    /// Frames the steering program handed to the workers (UDP and the streams' packets).
    pub redirected: u64,
    /// Frames the workers sent on.
    pub forwarded: u64,
    /// `forwarded` per second.
    pub forwarded_pps: f64,
    /// `redirected - forwarded`: frames lost in the gateway (a full ring, a worker's drop).
    pub lost: u64,
    /// `forwarded / redirected`.
    pub forwarded_share: f64,
    /// Streams open when it began.
    pub streams: usize,
    /// Streams that broke.
    pub streams_reset: usize,
    /// The longest time any stream went without an echo (0: none stalled 150 ms).
    pub longest_stall_ms: u64,
    /// Short requests (each a new connection through the gateway), and failed.
    pub requests: usize,
    /// Of those, failed.
    pub requests_failed: usize,
    /// `/healthz` probes sent, and failed (no `200 ok` within 2 s).
    pub healthz: u64,
    /// Of those, failed.
    pub healthz_failed: u64,
    /// Median `/healthz` latency.
    pub healthz_p50_ms: f64,
    /// 99th percentile.
    pub healthz_p99_ms: f64,
    /// Slowest.
    pub healthz_max_ms: f64,
    /// What the abusers did and met (abused phase only).
    pub abuse: Option<AbuseCounts>,
}

/// What the abusers did and met.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AbuseCounts {
    /// Idle connections held at the phase's end.
    pub idle_open: u64,
    /// Idle connections the API closed (after its deadline) and the abuser opened again.
    pub idle_closed: u64,
    /// Slow clients' connections the API cut off.
    pub slow_cut_off: u64,
    /// Requests sent by the request abusers.
    pub requests: u64,
    /// Answered 200 (scrapes).
    pub answered_200: u64,
    /// Answered 400 (malformed).
    pub answered_400: u64,
    /// Answered 431 (oversized).
    pub answered_431: u64,
    /// Answered otherwise, or not at all.
    pub other: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    results: Vec<Phase>,
    /// The abused phase's `forwarded_share` over the quiet phase's.
    forwarded_ratio: f64,
    cpu: String,
}

/// Runs the bench.
///
/// # Errors
/// Not root; the testbed or the gateway did not come up; the generator failed.
pub fn run(o: &Options) -> anyhow::Result<()> {
    ensure!(o.seconds > 0.0, "--seconds must be more than 0");
    ensure!(o.rate > 0, "--rate must be at least 1");
    ensure!(o.streams > 0, "--streams must be at least 1");
    catch_stop()?;
    let bed = testbed::up(&testbed::Opts {
        backends: 4,
        prefix: o.prefix.clone(),
        ..testbed::Opts::default()
    })?;
    let mut fleet = Fleet::up(&bed)?;
    let gw = bed.gateway_namespace().to_owned();
    let client = Client::start(&bed.client_namespace(), o.streams)?;
    client.wait_all_open(o.streams, Duration::from_secs(30))?;
    let mut results = Vec::new();
    for phase in ["quiet", "abused"] {
        interrupted()?;
        let w = client.window_start(o.streams)?;
        let probe = Probe::start(&gw)?;
        let abusers = if phase == "abused" {
            Some(Abusers::start(&gw, o)?)
        } else {
            None
        };
        let before = Counters::read(&gw);
        let t = Instant::now();
        let (offered, offered_pps) = generate(&bed.client_namespace(), o.seconds, o.rate)?;
        let elapsed = t.elapsed().as_secs_f64();
        let after = Counters::read(&gw);
        let redirected = after.redirected.saturating_sub(before.redirected);
        let forwarded = after.tx.saturating_sub(before.tx);
        let abuse = abusers.map(Abusers::stop);
        let probes = probe.stop();
        let longest = client.longest_stall(&w);
        let r = client.window_end(&w, phase, 1, false);
        let p = Phase {
            phase,
            offered,
            offered_pps,
            redirected,
            forwarded,
            forwarded_pps: forwarded as f64 / elapsed,
            lost: redirected.saturating_sub(forwarded),
            forwarded_share: if redirected == 0 {
                0.0
            } else {
                forwarded as f64 / redirected as f64
            },
            streams: r.streams,
            streams_reset: r.streams_reset,
            longest_stall_ms: longest,
            requests: r.requests,
            requests_failed: r.requests_failed,
            healthz: probes.sent,
            healthz_failed: probes.failed,
            healthz_p50_ms: probes.quantile(0.50),
            healthz_p99_ms: probes.quantile(0.99),
            healthz_max_ms: probes.quantile(1.0),
            abuse,
        };
        eprintln!(
            "bench admin: {phase}: {} frames offered at {:.0} pps, the gateway sent {:.0} pps, \
             {} of {} lost; {}/{} streams reset, longest stall {} ms; {}/{} requests failed; /healthz {}/{} \
             failed, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms{}",
            p.offered,
            p.offered_pps,
            p.forwarded_pps,
            p.lost,
            p.redirected,
            p.streams_reset,
            p.streams,
            p.longest_stall_ms,
            p.requests_failed,
            p.requests,
            p.healthz_failed,
            p.healthz,
            p.healthz_p50_ms,
            p.healthz_p99_ms,
            p.healthz_max_ms,
            p.abuse
                .as_ref()
                .map(|a| format!("; abusers: {a:?}"))
                .unwrap_or_default()
        );
        results.push(p);
    }
    client.stop();
    fleet.stop_all();
    let forwarded_ratio = if results[0].forwarded_share > 0.0 {
        results[1].forwarded_share / results[0].forwarded_share
    } else {
        0.0
    };
    let report = Report {
        results,
        forwarded_ratio,
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

/// Runs `strait-lab gen` in the client namespace: established UDP to the VIP's echo port,
/// 1,000 flows from the client's own address, at `rate` for `seconds`; (frames sent, rate).
fn generate(ns: &str, seconds: f64, rate: u64) -> anyhow::Result<(u64, f64)> {
    let to = format!("{}:5353", testbed::VIP4);
    let (rate, secs) = (rate.to_string(), seconds.to_string());
    gen(
        ns,
        &[
            "--to",
            &to,
            "--traffic",
            "udp",
            "--flows",
            "1000",
            "--src-range",
            "192.0.2.2-192.0.2.2",
            "--sport-range",
            "20000-20999",
            "--rate",
            &rate,
            "--duration",
            &secs,
        ],
    )
}

/// The gateway's frame counters, summed over its cores and interfaces.
#[derive(Debug, Default)]
struct Counters {
    /// Frames the steering program redirected to the workers.
    redirected: u64,
    /// Frames the workers sent.
    tx: u64,
}

impl Counters {
    fn read(ns: &str) -> Counters {
        let metrics = admin(ns, "GET", "/metrics").unwrap_or_default();
        let sum = |family: &str, label: &str| -> u64 {
            metrics
                .lines()
                .filter(|l| l.starts_with(family) && l.contains(label))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64
        };
        Counters {
            redirected: sum("strait_xdp_packets", "verdict=\"redirect\""),
            tx: sum("strait_tx_packets", ""),
        }
    }
}

/// The admin API's address inside the gateway's namespace.
const ADMIN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9900);

type Worker = thread::JoinHandle<()>;

/// A `/healthz` request every 20 ms, its latency recorded.
struct Probe {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<ProbeLog>>,
    handle: Worker,
}

#[derive(Default)]
struct ProbeLog {
    sent: u64,
    failed: u64,
    /// Latencies of the answered ones, ms.
    ms: Vec<f64>,
}

impl ProbeLog {
    fn quantile(&self, q: f64) -> f64 {
        if self.ms.is_empty() {
            return 0.0;
        }
        let mut v = self.ms.clone();
        v.sort_by(f64::total_cmp);
        let i = ((v.len() - 1) as f64 * q).round() as usize;
        v[i.min(v.len() - 1)]
    }
}

impl Probe {
    fn start(ns: &str) -> anyhow::Result<Probe> {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(ProbeLog::default()));
        let (s, l) = (Arc::clone(&stop), Arc::clone(&log));
        let handle = spawn_in_netns(ns, "admin-probe", move || {
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                let ok = request(b"GET /healthz HTTP/1.1\r\nHost: strait\r\n\r\n")
                    .is_some_and(|a| a.starts_with("HTTP/1.1 200"));
                let took = t.elapsed();
                let mut log = l.lock().unwrap_or_else(PoisonError::into_inner);
                log.sent += 1;
                if ok {
                    log.ms.push(took.as_secs_f64() * 1e3);
                } else {
                    log.failed += 1;
                }
                drop(log);
                thread::sleep(Duration::from_millis(20).saturating_sub(took));
            }
        })?;
        Ok(Probe { stop, log, handle })
    }

    fn stop(self) -> ProbeLog {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.handle.join();
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::take(&mut *log)
    }
}

/// One request on a new connection to the admin API; the whole answer, or `None` when it
/// could not connect or got no answer within 2 s.
fn request(bytes: &[u8]) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&ADMIN, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(bytes).ok()?;
    let mut out = Vec::new();
    // A refused request may be answered before the server read all of it: the answer
    // counts, whatever the end of the connection.
    let _ = s.read_to_end(&mut out);
    (!out.is_empty()).then(|| String::from_utf8_lossy(&out).into_owned())
}

/// The abusers of the abused phase, each a thread in the gateway's namespace.
struct Abusers {
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
    handles: Vec<Worker>,
}

#[derive(Default)]
struct Counts {
    idle_open: AtomicU64,
    idle_closed: AtomicU64,
    slow_cut_off: AtomicU64,
    requests: AtomicU64,
    answered_200: AtomicU64,
    answered_400: AtomicU64,
    answered_431: AtomicU64,
    other: AtomicU64,
}

/// Threads sending the malformed, oversized and scrape requests.
const REQUEST_ABUSERS: u64 = 4;

impl Abusers {
    fn start(ns: &str, o: &Options) -> anyhow::Result<Abusers> {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let mut handles = Vec::new();
        let (s, c, idle) = (Arc::clone(&stop), Arc::clone(&counts), o.idle);
        handles.push(spawn_in_netns(ns, "admin-idle", move || {
            hold_idle(idle, &s, &c)
        })?);
        let (s, c, slow) = (Arc::clone(&stop), Arc::clone(&counts), o.slow);
        handles.push(spawn_in_netns(ns, "admin-slow", move || {
            trickle(slow, &s, &c)
        })?);
        let per_thread = (o.abuse_rate / REQUEST_ABUSERS).max(1);
        for k in 0..REQUEST_ABUSERS {
            let (s, c) = (Arc::clone(&stop), Arc::clone(&counts));
            handles.push(spawn_in_netns(ns, "admin-requests", move || {
                hostile_requests(k, per_thread, &s, &c);
            })?);
        }
        Ok(Abusers {
            stop,
            counts,
            handles,
        })
    }

    fn stop(self) -> AbuseCounts {
        let c = &self.counts;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        // Read before stopping: the idle connections still held.
        let idle_open = get(&c.idle_open);
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles {
            let _ = h.join();
        }
        AbuseCounts {
            idle_open,
            idle_closed: get(&c.idle_closed),
            slow_cut_off: get(&c.slow_cut_off),
            requests: get(&c.requests),
            answered_200: get(&c.answered_200),
            answered_400: get(&c.answered_400),
            answered_431: get(&c.answered_431),
            other: get(&c.other),
        }
    }
}

/// Holds `n` connections that send nothing; one the API closes is opened again.
fn hold_idle(n: usize, stop: &AtomicBool, c: &Counts) {
    let open = || {
        let s = TcpStream::connect_timeout(&ADMIN, Duration::from_secs(2)).ok()?;
        s.set_nonblocking(true).ok()?;
        Some(s)
    };
    let mut conns: Vec<Option<TcpStream>> = (0..n).map(|_| open()).collect();
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::Relaxed) {
        for slot in &mut conns {
            let closed = match slot {
                None => true,
                Some(s) => match s.read(&mut buf) {
                    Err(e) if e.kind() == ErrorKind::WouldBlock => false,
                    // An answer (408) or the end: the API gave up on it.
                    _ => true,
                },
            };
            if closed {
                if slot.is_some() {
                    c.idle_closed.fetch_add(1, Ordering::Relaxed);
                }
                *slot = open();
            }
        }
        let held = conns.iter().filter(|s| s.is_some()).count();
        c.idle_open.store(held as u64, Ordering::Relaxed);
        thread::sleep(Duration::from_millis(100));
    }
}

/// `n` clients sending `GET /healthz` a byte every 100 ms (longer than the API's deadline
/// for a whole request); one the API cuts off starts over.
fn trickle(n: usize, stop: &AtomicBool, c: &Counts) {
    const REQUEST: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: strait\r\nX-Slow: yes\r\n\r\n";
    let open = || {
        let s = TcpStream::connect_timeout(&ADMIN, Duration::from_secs(2)).ok()?;
        s.set_nonblocking(true).ok()?;
        Some((s, 0usize))
    };
    let mut conns: Vec<Option<(TcpStream, usize)>> = (0..n).map(|_| open()).collect();
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::Relaxed) {
        for slot in &mut conns {
            let alive = slot.as_mut().is_some_and(|(s, sent)| {
                // An answer (408) or the end: the API cut it off.
                if !matches!(s.read(&mut buf), Err(e) if e.kind() == ErrorKind::WouldBlock) {
                    return false;
                }
                if *sent < REQUEST.len() {
                    if s.write_all(&REQUEST[*sent..=*sent]).is_err() {
                        return false;
                    }
                    *sent += 1;
                }
                true
            });
            if !alive {
                if slot.is_some() {
                    c.slow_cut_off.fetch_add(1, Ordering::Relaxed);
                }
                *slot = open();
            }
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Sends `per_second` requests a second, in turn: malformed bytes, a request with 16 KiB of
/// headers, `GET /metrics`, `GET /services`; counts the answers by status.
fn hostile_requests(k: u64, per_second: u64, stop: &AtomicBool, c: &Counts) {
    let oversized = {
        let mut r = b"GET /services HTTP/1.1\r\nHost: strait\r\n".to_vec();
        for i in 0..256 {
            r.extend_from_slice(format!("X-Pad-{i}: {}\r\n", "a".repeat(60)).as_bytes());
        }
        r.extend_from_slice(b"\r\n");
        r
    };
    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ k;
    let gap = Duration::from_secs_f64(1.0 / per_second as f64);
    let mut next = Instant::now();
    let mut turn = k;
    while !stop.load(Ordering::Relaxed) {
        let malformed: Vec<u8> = (0..200)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // Printable garbage with no valid request line, then an end of headers.
                b'!' + (seed % 90) as u8
            })
            .chain(*b"\r\n\r\n")
            .collect();
        let bytes: &[u8] = match turn % 4 {
            0 => &malformed,
            1 => &oversized,
            2 => b"GET /metrics HTTP/1.1\r\nHost: strait\r\n\r\n",
            _ => b"GET /services HTTP/1.1\r\nHost: strait\r\n\r\n",
        };
        turn += 1;
        c.requests.fetch_add(1, Ordering::Relaxed);
        let status = request(bytes).and_then(|a| a.get(9..12).map(str::to_owned));
        let counter = match status.as_deref() {
            Some("200") => &c.answered_200,
            Some("400") => &c.answered_400,
            Some("431") => &c.answered_431,
            _ => &c.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        next += gap;
        let now = Instant::now();
        if next > now {
            thread::sleep(next - now);
        } else {
            next = now;
        }
    }
}
