//! `strait-lab bench churn`: endpoints coming and going at a steady rate while requests
//! run.
//!
//! ```text
//! testbed up --topology two-arm (nat; backends b1..bN each serve HTTP on 8080)
//!   {prefix}-gw:     strait run --config F           (--via reload: SIGHUP after each write)
//!                    strait run --kube ...           (--via kube: the fake API server in the
//!                                                     gateway's namespace, one EndpointSlice)
//!   {prefix}-client: request threads: GET / on a new connection each, 4 s timeout
//!   the bench:       one endpoint change every 60 / RATE s: an endpoint added (ready), a
//!                    ready one set draining (file: state = "draining"; Kubernetes: serving
//!                    and terminating), or one drained for DRAIN removed
//! ```
//!
//! Every removal drains first, so no request may fail: a request in flight to an endpoint
//! being removed finished long before the removal. Every [`CHECK_EVERY`] the churn stops
//! until the gateway shows the endpoint set the bench last wrote (`GET /services`), its
//! table generation moved on, and the `nat_backends` steering map of every XDP program of
//! the gateway holds exactly those endpoints; then it goes on, catching up on the changes
//! it owes (the rate is kept over the whole run). Every [`SAMPLE_EVERY`] it records the
//! gateway's resident memory (`VmRSS`) and open file descriptors.
//!
//! [`Gateway`], [`Endpoints`], [`Load`] and [`Probe`] serve `bench soak` too.

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use serde::Serialize;
use serde_json::{json, Value};
use strait_testkit::fake_api::FakeApi;
use strait_testkit::objects::{node, CLASS};

use super::failover::{admin, catch_stop, cpu_model, interrupted};
use super::spawn_in_netns;
use crate::testbed::{self, BackendInfo, Testbed, NAT_PORT, VIP4};

/// How the endpoint changes reach the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Via {
    /// The configuration file rewritten, then SIGHUP.
    Reload,
    /// An EndpointSlice on the fake Kubernetes API server, `strait run --kube`.
    Kube,
}

/// `strait-lab bench churn` options.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Minutes of churn.
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// How the changes reach the gateway.
    #[arg(long, value_enum, default_value = "reload")]
    pub via: Via,
    /// Endpoint changes a minute.
    #[arg(long, default_value_t = 1000)]
    pub rate: u32,
    /// Backends (endpoints the churn picks from), 4 to 64. A third of the changes start a
    /// drain of [`DRAIN`]: at 1,000 a minute about 28 endpoints are draining at any time, and
    /// 40 leave enough ready and absent ones for every change to find one.
    #[arg(long, default_value_t = 40)]
    pub backends: usize,
    /// Seconds before the memory baseline is taken (the gateway's first allocations, the
    /// UMEM's pages touched by the first packets).
    #[arg(long, default_value_t = 60.0)]
    pub warmup: f64,
    /// Remove endpoints without draining them first (requests in flight to them fail:
    /// shows what the drain saves, and that the bench sees failures).
    #[arg(long)]
    pub no_drain: bool,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The testbed's namespace prefix.
    #[arg(long, default_value = "sch")]
    pub prefix: String,
}

/// How long the end of a churn may take to make the changes it still owes.
const CATCH_UP_MAX: Duration = Duration::from_secs(5);

/// The changes a churn of one every `every` owes after `elapsed`: one per whole `every`.
fn owed(elapsed: Duration, every: Duration) -> u64 {
    (elapsed.as_secs_f64() / every.as_secs_f64()) as u64
}

/// Time a draining endpoint keeps its flows before it is removed: above a request's longest
/// life ([`REQUEST_TIMEOUT`]: a lost SYN or segment retransmitted once or twice) plus the
/// gateway's lag behind the source on a loaded machine, so a removal never cuts a request.
pub(crate) const DRAIN: Duration = Duration::from_secs(5);
/// Interval between two checks that the gateway follows.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(5);
/// How long the gateway may take to show the endpoint set last written: a reload is read
/// within the run loop's tick, a watch event within a round trip; generous for a loaded CI
/// machine.
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(10);
/// Interval between two samples of memory and file descriptors (every 10 s).
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// Timeout of one request (connect and the whole answer): room for a lost SYN's
/// retransmission (1 s) and a lost segment's, as `curl --max-time 4` in the Kubernetes
/// traffic tests.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(4);
/// Pause between two requests of one thread: two threads make about 100 requests a second
/// on the testbed, steady and light next to the churn's work.
const REQUEST_EVERY: Duration = Duration::from_millis(20);
/// Threads sending requests.
const REQUEST_THREADS: usize = 2;
/// How long `strait run` may take from start to `/healthz` ok.
const GATEWAY_UP: Duration = Duration::from_secs(30);
/// The Kubernetes path's address pool (one Service: the first host, 203.0.113.17).
const KUBE_POOL: &str = "203.0.113.16/28";
/// Reads of a process's descriptors per sample (see [`Gateway::footprint`]).
const FD_READS: usize = 10;
/// Endpoints kept ready at least, so that every request has somewhere to go.
const MIN_READY: usize = 2;
/// Failure messages kept in the report.
const KEEP_FAILURES: usize = 20;

/// One sample of the gateway process.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the churn began.
    pub t: f64,
    /// Resident memory, KiB (`VmRSS`).
    pub rss_kib: u64,
    /// Open file descriptors.
    pub fds: usize,
    /// The live table's generation.
    pub generation: u64,
    /// Endpoint changes made so far.
    pub changes: u64,
    /// Requests so far, and failed.
    pub requests: u64,
    /// Failed requests so far.
    pub failed: u64,
}

/// The bench's results.
#[derive(Debug, Serialize)]
pub struct Report {
    /// How the changes reached the gateway.
    pub via: Via,
    /// Minutes of churn asked for, and run.
    pub minutes: f64,
    /// Endpoint changes made.
    pub changes: u64,
    /// Changes a minute, over the whole churn (the final check after it is not part of it).
    pub changes_per_minute: f64,
    /// Whether every removal drained first (not with `--no-drain`).
    pub drained: bool,
    /// Requests sent.
    pub requests: u64,
    /// Requests failed (every removal drained first: none may fail).
    pub requests_failed: u64,
    /// The first failures' times (s) and errors.
    pub failures: Vec<(f64, String)>,
    /// The gateway's drops over the run, by reason (packet path) and cause (worker), the
    /// ones not zero: where a failed request's packets went.
    pub gateway_drops: std::collections::BTreeMap<String, u64>,
    /// New connections on the 5-tuple of a closing flow (the client reused a port within the
    /// entry's closing timeout), which the gateway gave a backend afresh
    /// (`strait_flows_reopened_total`): pinned to the old connection's backend, one that had
    /// begun draining could be removed under them.
    pub flows_reopened: u64,
    /// TCP segments the client namespace retransmitted (`RetransSegs`): packets lost or late.
    pub client_retransmissions: u64,
    /// Checks that the gateway followed (endpoints, generation, steering maps).
    pub checks: u64,
    /// Checks that found the gateway behind or wrong, with what was wrong.
    pub checks_failed: Vec<String>,
    /// The table generation at the start and at the end.
    pub generation_first: u64,
    /// The table generation at the end.
    pub generation_last: u64,
    /// Resident memory at the end of the warm-up (KiB), the most after it, at the end.
    pub rss_kib_baseline: u64,
    /// The most resident memory after the warm-up.
    pub rss_kib_max: u64,
    /// Resident memory at the end.
    pub rss_kib_last: u64,
    /// `(max - baseline) / baseline`, in percent.
    pub rss_growth_pct: f64,
    /// Fewest and most open file descriptors after the warm-up.
    pub fds_min: usize,
    /// Most open file descriptors after the warm-up.
    pub fds_max: usize,
    /// How far the floor of open descriptors rose from the earlier to the later half of the
    /// samples after the warm-up (a leak; 0 or less: none).
    pub fds_floor_rise: i64,
    /// Every sample.
    pub samples: Vec<Sample>,
    /// The machine.
    pub cpu: String,
    /// When the run ended (UTC).
    pub date: String,
}

/// Runs the bench.
///
/// # Errors
/// Not root; the testbed, the gateway or the fake API server did not come up.
pub fn run(o: &Options) -> anyhow::Result<()> {
    let bed = bed_up(o.minutes, o.rate, o.backends, &o.prefix)?;
    let mut world = World::up(&bed, o.via)?;
    world.endpoints.drain = !o.no_drain;
    let load = Load::start(&bed.client_namespace(), world.vip, None)?;
    let report = churn(&mut world, &load, o)?;
    drop(load);
    drop(world);
    drop(bed);
    write_report(&report, o.json.as_deref())?;
    eprintln!(
        "bench churn ({:?}): {} changes in {:.1} min ({:.0}/min); {}/{} requests failed; \
         {} checks, {} failed; generation {} -> {}; RSS {} KiB -> max {} KiB ({:+.2} %); \
         fds {}..{}; gateway drops {:?}; {} connections on a reused port given a backend \
         afresh; client retransmissions {}",
        o.via,
        report.changes,
        report.minutes,
        report.changes_per_minute,
        report.requests_failed,
        report.requests,
        report.checks,
        report.checks_failed.len(),
        report.generation_first,
        report.generation_last,
        report.rss_kib_baseline,
        report.rss_kib_max,
        report.rss_growth_pct,
        report.fds_min,
        report.fds_max,
        report.gateway_drops,
        report.flows_reopened,
        report.client_retransmissions,
    );
    Ok(())
}

/// Checks the options `bench churn` and `bench soak` share and brings up their testbed:
/// two-arm (nat), `backends` backends, namespaces prefixed `prefix`.
///
/// # Errors
/// An option out of range; not root; the testbed did not come up.
pub(crate) fn bed_up(
    minutes: f64,
    rate: u32,
    backends: usize,
    prefix: &str,
) -> anyhow::Result<Testbed> {
    ensure!(minutes > 0.0, "--minutes must be more than 0");
    ensure!(rate > 0, "--rate must be at least 1 change a minute");
    ensure!(
        (4..=64).contains(&backends),
        "--backends must be 4 to 64, not {backends}"
    );
    catch_stop()?;
    Ok(testbed::up(&testbed::Opts {
        backends,
        topology: testbed::Topology::TwoArm,
        prefix: prefix.to_owned(),
        ..testbed::Opts::default()
    })?)
}

/// Prints `report` as JSON, and writes it to `path` if given.
///
/// # Errors
/// The file cannot be written.
pub(crate) fn write_report(
    report: &impl Serialize,
    path: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    println!("{text}");
    if let Some(path) = path {
        fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The churn loop of `bench churn`: changes at the rate, checks, samples.
fn churn(world: &mut World, load: &Load, o: &Options) -> anyhow::Result<Report> {
    let every = Duration::from_secs_f64(60.0 / f64::from(o.rate));
    let length = Duration::from_secs_f64(o.minutes * 60.0);
    let gen0 = world.generation();
    let t0 = Instant::now();
    let mut checks = Checks::new(gen0);
    let mut samples = vec![world.sample(t0, 0, load)];
    let (mut next_check, mut next_sample) = (t0 + CHECK_EVERY, t0 + SAMPLE_EVERY);
    while t0.elapsed() < length {
        interrupted()?;
        world.churn_until(t0, every, Instant::now())?;
        let now = Instant::now();
        if now >= next_check {
            checks.check(world)?;
            next_check = Instant::now() + CHECK_EVERY;
        }
        if now >= next_sample {
            samples.push(world.sample(t0, world.endpoints.changes, load));
            next_sample += SAMPLE_EVERY;
        }
        thread::sleep(every.min(Duration::from_millis(5)));
    }
    let churned = world.churn_end(t0, every, length)?;
    checks.check(world)?;
    let minutes = churned.as_secs_f64() / 60.0;
    samples.push(world.sample(t0, world.endpoints.changes, load));
    let (requests, failed, failures) = load.totals();
    let mem = Memory::of(&samples, o.warmup);
    let m = world.gw.metrics();
    Ok(Report {
        via: o.via,
        minutes,
        changes: world.endpoints.changes,
        changes_per_minute: world.endpoints.changes as f64 / minutes,
        drained: world.endpoints.drain,
        gateway_drops: drops(&m),
        flows_reopened: metric(&m, "strait_flows_reopened_total", &[]) as u64,
        client_retransmissions: retransmissions(&world.client),
        requests,
        requests_failed: failed,
        failures,
        checks: checks.count,
        checks_failed: checks.failed,
        generation_first: gen0,
        generation_last: world.generation(),
        rss_kib_baseline: mem.baseline,
        rss_kib_max: mem.max,
        rss_kib_last: samples.last().map_or(0, |s| s.rss_kib),
        rss_growth_pct: mem.growth_pct,
        fds_min: mem.fds_min,
        fds_max: mem.fds_max,
        fds_floor_rise: mem.fds_floor_rise,
        samples,
        cpu: cpu_model(),
        date: utc_now(),
    })
}

/// Memory and descriptors after the warm-up.
pub(crate) struct Memory {
    pub baseline: u64,
    pub max: u64,
    pub growth_pct: f64,
    pub fds_min: usize,
    pub fds_max: usize,
    /// The fewest descriptors of the later half of the samples after the warm-up, less the
    /// fewest of the earlier half: a leak raises that floor, while a socket a sample catches
    /// open for a moment (a health check's connection, a neighbour read during a reload)
    /// raises only one sample.
    pub fds_floor_rise: i64,
}

impl Memory {
    /// Baseline: the first sample at or after `warmup` seconds (the last one if the run was
    /// shorter).
    pub(crate) fn of(samples: &[Sample], warmup: f64) -> Memory {
        let start = samples
            .iter()
            .position(|s| s.t >= warmup)
            .unwrap_or(samples.len().saturating_sub(1));
        let after = &samples[start..];
        let baseline = after.first().map_or(0, |s| s.rss_kib);
        let max = after.iter().map(|s| s.rss_kib).max().unwrap_or(0);
        Memory {
            baseline,
            max,
            growth_pct: if baseline == 0 {
                0.0
            } else {
                (max as f64 - baseline as f64) / baseline as f64 * 100.0
            },
            fds_min: after.iter().map(|s| s.fds).min().unwrap_or(0),
            fds_max: after.iter().map(|s| s.fds).max().unwrap_or(0),
            fds_floor_rise: {
                let (early, late) = after.split_at(after.len() / 2);
                let floor = |h: &[Sample]| h.iter().map(|s| s.fds).min();
                match (floor(early), floor(late)) {
                    (Some(e), Some(l)) => l as i64 - e as i64,
                    _ => 0,
                }
            },
        }
    }
}

/// The drop counters of `/metrics` text `m` that are not zero, by reason or cause.
pub(crate) fn drops(m: &str) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for (family, label) in [
        ("strait_dropped_packets_total", "reason=\""),
        ("strait_worker_dropped_frames_total", "cause=\""),
    ] {
        for l in m.lines().filter(|l| l.starts_with(family)) {
            let Some(v) = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
                continue;
            };
            let Some(name) = l.split(label).nth(1).and_then(|r| r.split('"').next()) else {
                continue;
            };
            if v > 0.0 {
                *out.entry(name.to_owned()).or_insert(0) += v as u64;
            }
        }
    }
    out
}

/// `RetransSegs` of namespace `ns` (`/proc/net/snmp` read inside it).
pub(crate) fn retransmissions(ns: &str) -> u64 {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/snmp"])
        .output();
    let snmp = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next().unwrap_or(""), tcp.next().unwrap_or(""));
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RetransSegs")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// `date -u`, ISO 8601.
pub(crate) fn utc_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// The checks.

/// Whether the gateway follows the endpoints written.
pub(crate) struct Checks {
    pub count: u64,
    pub failed: Vec<String>,
    generation: u64,
    changes: u64,
}

impl Checks {
    pub(crate) fn new(generation: u64) -> Checks {
        Checks {
            count: 0,
            failed: Vec::new(),
            generation,
            changes: 0,
        }
    }

    /// Waits until the gateway shows the endpoints last written, then checks that its
    /// generation moved on (if anything changed since the last check) and its steering maps.
    pub(crate) fn check(&mut self, world: &mut World) -> anyhow::Result<()> {
        world.flush()?;
        self.count += 1;
        let want = world.endpoints.expected(&world.backends);
        let t = Instant::now();
        let shown = loop {
            let shown = world.shown();
            if shown.as_ref() == Some(&want) || t.elapsed() > FOLLOW_TIMEOUT {
                break shown;
            }
            interrupted()?;
            thread::sleep(Duration::from_millis(20));
        };
        if shown.as_ref() != Some(&want) {
            self.failed.push(format!(
                "after {} changes the gateway shows {shown:?}, not {want:?}, {FOLLOW_TIMEOUT:?} on",
                world.endpoints.changes
            ));
            return Ok(());
        }
        let generation = world.generation();
        if world.endpoints.changes > self.changes && generation <= self.generation {
            self.failed.push(format!(
                "{} changes since the last check, the generation still {generation}",
                world.endpoints.changes - self.changes
            ));
        }
        self.generation = generation;
        self.changes = world.endpoints.changes;
        let serving: BTreeSet<Ipv4Addr> = want.iter().map(|(a, _)| *a).collect();
        // The steering maps follow the table right after the swap; give them the same time.
        let t = Instant::now();
        loop {
            match steering_backends(&world.gw.namespace, NAT_PORT) {
                Ok(maps) if maps.iter().all(|m| *m == serving) => break,
                Ok(maps) if t.elapsed() > FOLLOW_TIMEOUT => {
                    self.failed.push(format!(
                        "nat_backends maps hold {maps:?}, the table {serving:?}"
                    ));
                    break;
                }
                Err(e) if t.elapsed() > FOLLOW_TIMEOUT => {
                    self.failed
                        .push(format!("reading the steering maps: {e:#}"));
                    break;
                }
                _ => thread::sleep(Duration::from_millis(20)),
            }
        }
        Ok(())
    }
}

/// For each XDP program attached in namespace `ns`: the IPv4 addresses of its `nat_backends`
/// keys with TCP port `port`.
///
/// # Errors
/// No program attached; a program's or map's information cannot be read (not root).
pub(crate) fn steering_backends(ns: &str, port: u16) -> anyhow::Result<Vec<BTreeSet<Ipv4Addr>>> {
    use libbpf_rs::query::{ProgInfoIter, ProgInfoQueryOptions};
    use libbpf_rs::{MapCore as _, MapHandle};
    let out = Command::new("ip")
        .args(["-j", "-n", ns, "link", "show"])
        .output()
        .context("ip link show")?;
    let links: Value = serde_json::from_slice(&out.stdout).context("ip -j link show")?;
    let ids: BTreeSet<u32> = links
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| {
            let x = l.get("xdp")?;
            x["prog"]["id"]
                .as_u64()
                .or_else(|| x["attached"][0]["prog"]["id"].as_u64())
        })
        .filter_map(|id| u32::try_from(id).ok())
        .collect();
    ensure!(!ids.is_empty(), "no XDP program attached in {ns}");
    let mut sets = Vec::new();
    let opts = ProgInfoQueryOptions::default().include_map_ids(true);
    for prog in ProgInfoIter::with_query_opts(opts).filter(|p| ids.contains(&p.id)) {
        for &map_id in &prog.map_ids {
            let map = MapHandle::from_map_id(map_id)
                .with_context(|| format!("opening BPF map {map_id}"))?;
            if map.name() != "nat_backends" {
                continue;
            }
            let set = map
                .keys()
                .filter(|k| {
                    k.len() == 20 && u16::from_be_bytes([k[16], k[17]]) == port && k[18] == 6
                })
                .filter_map(|k| {
                    let a: [u8; 16] = k[..16].try_into().ok()?;
                    std::net::Ipv6Addr::from(a).to_ipv4_mapped()
                })
                .collect();
            sets.push(set);
        }
    }
    ensure!(
        sets.len() == ids.len(),
        "{} nat_backends maps for {} programs",
        sets.len(),
        ids.len()
    );
    Ok(sets)
}

// ---------------------------------------------------------------------------------------
// The endpoints.

/// An endpoint's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ep {
    Absent,
    Ready,
    /// Draining since.
    Draining(Instant),
}

/// The churned endpoint set: one endpoint per backend.
pub(crate) struct Endpoints {
    eps: Vec<Ep>,
    rng: u64,
    /// Changes made.
    pub changes: u64,
    /// Changes made and not yet written.
    unwritten: bool,
    /// Whether a removal drains first.
    pub drain: bool,
}

impl Endpoints {
    /// Half of `n` ready, the rest absent.
    pub(crate) fn new(n: usize) -> Endpoints {
        Endpoints {
            eps: (0..n)
                .map(|i| if i % 2 == 0 { Ep::Ready } else { Ep::Absent })
                .collect(),
            rng: 0x5eed_c4a2_17e5_0001,
            changes: 0,
            unwritten: true,
            drain: true,
        }
    }

    fn next(&mut self) -> u64 {
        // xorshift64: a fixed sequence, so two runs make the same changes.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn pick(&mut self, f: impl Fn(Ep) -> bool) -> Option<usize> {
        let idx: Vec<usize> = (0..self.eps.len()).filter(|&i| f(self.eps[i])).collect();
        if idx.is_empty() {
            return None;
        }
        Some(idx[(self.next() % idx.len() as u64) as usize])
    }

    /// Makes one change at `now`: removes an endpoint drained for [`DRAIN`] if there is
    /// one, else adds an absent one or drains a ready one, at random.
    pub(crate) fn step(&mut self, now: Instant) {
        let drained = |e: Ep| matches!(e, Ep::Draining(t) if now.duration_since(t) >= DRAIN);
        let change = if let Some(i) = self.pick(drained) {
            Some((i, Ep::Absent))
        } else {
            let ready = self.eps.iter().filter(|e| **e == Ep::Ready).count();
            let drain = ready > MIN_READY
                && (self.next().is_multiple_of(2) || !self.eps.contains(&Ep::Absent));
            let next = if self.drain {
                Ep::Draining(now)
            } else {
                Ep::Absent
            };
            if drain {
                self.pick(|e| e == Ep::Ready).map(|i| (i, next))
            } else {
                self.pick(|e| e == Ep::Absent).map(|i| (i, Ep::Ready))
            }
        };
        if let Some((i, e)) = change {
            self.eps[i] = e;
            self.changes += 1;
            self.unwritten = true;
        }
    }

    /// The indices of the ready endpoints.
    pub(crate) fn ready(&self) -> Vec<usize> {
        (0..self.eps.len())
            .filter(|&i| self.eps[i] == Ep::Ready)
            .collect()
    }

    /// The endpoints the gateway should show: (address, draining).
    pub(crate) fn expected(&self, backends: &[BackendInfo]) -> BTreeSet<(Ipv4Addr, bool)> {
        self.eps
            .iter()
            .zip(backends)
            .filter_map(|(e, b)| match e {
                Ep::Absent => None,
                Ep::Ready => Some((b.ipv4, false)),
                Ep::Draining(_) => Some((b.ipv4, true)),
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------
// The gateway and its source.

/// A `strait run` in the testbed's gateway namespace; killed on drop.
pub(crate) struct Gateway {
    child: Child,
    pub namespace: String,
    pub log: PathBuf,
}

impl Gateway {
    /// Starts `strait run ARGS` in `bed`'s gateway namespace and waits for `/healthz` ok.
    pub(crate) fn start(bed: &Testbed, args: &[&str]) -> anyhow::Result<Gateway> {
        let strait = crate::strait_binary()?;
        let namespace = bed.gateway_namespace();
        let log = testbed::run_dir(bed.prefix()).join("gw.log");
        let file = fs::File::create(&log).with_context(|| log.display().to_string())?;
        let child = Command::new("ip")
            .args(["netns", "exec", &namespace])
            .arg(&strait)
            .arg("run")
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {} in {namespace}", strait.display()))?;
        testbed::record_pid(bed.prefix(), child.id(), "gw")?;
        let mut gw = Gateway {
            child,
            namespace,
            log,
        };
        let t = Instant::now();
        loop {
            if admin(&gw.namespace, "GET", "/healthz").is_ok_and(|b| b.trim() == "ok") {
                return Ok(gw);
            }
            if let Ok(Some(status)) = gw.child.try_wait() {
                bail!("strait exited ({status}); its log:\n{}", gw.log_tail());
            }
            interrupted()?;
            ensure!(
                t.elapsed() < GATEWAY_UP,
                "strait not ready after {GATEWAY_UP:?}; its log:\n{}",
                gw.log_tail()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The gateway's pid (`ip netns exec` execs it).
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of its log.
    pub(crate) fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// `VmRSS` in KiB and the number of open descriptors: the fewest of [`FD_READS`] reads
    /// 10 ms apart, so that a socket open for a moment (a health check, a scrape of the
    /// admin API) is not taken for a leak, while one that stays is counted.
    pub(crate) fn footprint(&self) -> (u64, usize) {
        let pid = self.pid();
        let rss = fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        let fds = (0..FD_READS)
            .map(|k| {
                if k > 0 {
                    thread::sleep(Duration::from_millis(10));
                }
                fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
            })
            .min()
            .unwrap_or(0);
        (rss, fds)
    }

    /// `GET /metrics`.
    pub(crate) fn metrics(&self) -> String {
        admin(&self.namespace, "GET", "/metrics").unwrap_or_default()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the endpoint changes go.
enum Source {
    /// The configuration file: the gateway section and the testbed's services, `web` with
    /// the current endpoints.
    File {
        path: PathBuf,
        head: String,
        web: String,
        rest: String,
    },
    /// The fake API server's EndpointSlice `web-1`.
    Kube(Box<FakeApi>),
}

/// The gateway, its source and the endpoints.
pub(crate) struct World {
    pub gw: Gateway,
    source: Source,
    pub endpoints: Endpoints,
    pub backends: Vec<BackendInfo>,
    /// `web`'s address and port.
    pub vip: SocketAddr,
    /// The client namespace.
    pub client: String,
}

impl World {
    /// Starts the gateway on `bed` (two-arm), fed as `via` says, with the first endpoints.
    pub(crate) fn up(bed: &Testbed, via: Via) -> anyhow::Result<World> {
        let backends = bed.backends().to_vec();
        let endpoints = Endpoints::new(backends.len());
        let text = fs::read_to_string(bed.config_path())?;
        let (head, services) = text
            .split_once("\n[[services]]")
            .context("the testbed's configuration has no service")?;
        match via {
            Via::Reload => {
                let services = format!("[[services]]{services}");
                let (web, rest) = match services[1..].find("\n[[services]]") {
                    Some(i) => services.split_at(i + 1),
                    None => (services.as_str(), ""),
                };
                let web = web
                    .split("\n[[services.backends]]")
                    .next()
                    .unwrap_or_default();
                ensure!(
                    web.contains("name = \"web\""),
                    "the first service is not web"
                );
                let path = testbed::run_dir(bed.prefix()).join("churn.toml");
                let source = Source::File {
                    path: path.clone(),
                    head: head.to_owned() + "\n",
                    web: web.trim_end().to_owned() + "\n",
                    rest: rest.to_owned(),
                };
                write(&source, &endpoints, &backends, None)?;
                let gw = Gateway::start(bed, &["--config", &path.to_string_lossy()])?;
                Ok(World {
                    gw,
                    source,
                    endpoints,
                    backends,
                    vip: SocketAddr::from((VIP4, testbed::HTTP_PORT)),
                    client: bed.client_namespace(),
                })
            }
            Via::Kube => {
                let gw_ns = bed.gateway_namespace();
                let fake = FakeApi::start_in_netns(&gw_ns);
                for (i, b) in backends.iter().enumerate() {
                    fake.apply(node(&format!("n{}", i + 1), &b.ipv4.to_string()));
                }
                let dir = testbed::run_dir(bed.prefix());
                let config = dir.join("churn-gateway.toml");
                fs::write(&config, format!("{head}\n"))?;
                let kubeconfig = fake.kubeconfig(&dir);
                let source = Source::Kube(Box::new(fake));
                write(&source, &endpoints, &backends, None)?;
                if let Source::Kube(fake) = &source {
                    fake.create(web_service());
                }
                let gw = Gateway::start(
                    bed,
                    &[
                        "--config",
                        &config.to_string_lossy(),
                        "--kube",
                        "--kubeconfig",
                        &kubeconfig.to_string_lossy(),
                        "--kube-mode",
                        "nat",
                        "--kube-pool",
                        KUBE_POOL,
                    ],
                )?;
                let mut world = World {
                    gw,
                    source,
                    endpoints,
                    backends,
                    vip: SocketAddr::from((VIP4, testbed::HTTP_PORT)),
                    client: bed.client_namespace(),
                };
                let vip = world.kube_address()?;
                world.vip = SocketAddr::new(vip, testbed::HTTP_PORT);
                Ok(world)
            }
        }
    }

    /// The address the gateway wrote into the Service's status.
    fn kube_address(&self) -> anyhow::Result<std::net::IpAddr> {
        let Source::Kube(fake) = &self.source else {
            bail!("not the Kubernetes path");
        };
        let t = Instant::now();
        loop {
            let svc = fake.get(strait_testkit::fake_api::Res::Services, "default", "web");
            if let Some(ip) = svc
                .as_ref()
                .and_then(|s| s["status"]["loadBalancer"]["ingress"][0]["ip"].as_str())
            {
                return ip.parse().context("the Service's address");
            }
            interrupted()?;
            ensure!(
                t.elapsed() < GATEWAY_UP,
                "the gateway wrote no address into the Service's status; its log:\n{}",
                self.gw.log_tail()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Makes the changes owed at `now` (one every `every` since `t0`) and writes them.
    pub(crate) fn churn_until(
        &mut self,
        t0: Instant,
        every: Duration,
        now: Instant,
    ) -> anyhow::Result<()> {
        self.churn_to(owed(now.duration_since(t0), every), now)
    }

    /// Makes changes at `now` until `owed` are made, 16 at most: a catch-up after a check is
    /// spread over a few turns (and written once per turn) rather than written as one burst.
    fn churn_to(&mut self, owed: u64, now: Instant) -> anyhow::Result<()> {
        let mut n = 0;
        while self.endpoints.changes < owed && n < 16 {
            self.endpoints.step(now);
            n += 1;
        }
        self.flush()
    }

    /// Ends a churn of `length` begun at `t0`: makes the changes still owed at its end (a
    /// check that ran late in the last turn leaves some), for at most [`CATCH_UP_MAX`], and
    /// returns how long the churn took. The final check that follows is not part of it, so a
    /// slow check does not lower the rate a report gives.
    ///
    /// # Errors
    /// As [`World::flush`], or an interrupt.
    pub(crate) fn churn_end(
        &mut self,
        t0: Instant,
        every: Duration,
        length: Duration,
    ) -> anyhow::Result<Duration> {
        let owed = owed(length, every);
        let give_up = Instant::now() + CATCH_UP_MAX;
        // A turn may make no change (every endpoint draining, none drained long enough yet):
        // the clock moves on between turns, as in the churn itself.
        while self.endpoints.changes < owed && Instant::now() < give_up {
            interrupted()?;
            self.churn_to(owed, Instant::now())?;
            thread::sleep(Duration::from_millis(5));
        }
        Ok(t0.elapsed())
    }

    /// Writes the endpoints if they changed since the last write.
    pub(crate) fn flush(&mut self) -> anyhow::Result<()> {
        if self.endpoints.unwritten {
            self.write()?;
        }
        Ok(())
    }

    fn write(&mut self) -> anyhow::Result<()> {
        self.endpoints.unwritten = false;
        write(
            &self.source,
            &self.endpoints,
            &self.backends,
            Some(self.gw.pid()),
        )
    }

    /// `web`'s endpoints as the gateway shows them (`GET /services`): (address, draining).
    pub(crate) fn shown(&self) -> Option<BTreeSet<(Ipv4Addr, bool)>> {
        let body = admin(&self.gw.namespace, "GET", "/services").ok()?;
        let v: Value = serde_json::from_str(&body).ok()?;
        let vip = self.vip.ip().to_string();
        let svc = v["services"].as_array()?.iter().find(|s| {
            s["vip"] == vip.as_str() && s["port"] == self.vip.port() && s["protocol"] == "tcp"
        })?;
        svc["backends"]
            .as_array()?
            .iter()
            .map(|b| {
                let addr = b["address"].as_str()?.parse().ok()?;
                Some((addr, b["state"] == "draining"))
            })
            .collect()
    }

    /// The live table's generation (`strait_snapshot_generation`).
    pub(crate) fn generation(&self) -> u64 {
        metric(&self.gw.metrics(), "strait_snapshot_generation", &[]) as u64
    }

    pub(crate) fn sample(&self, t0: Instant, changes: u64, load: &Load) -> Sample {
        let (rss_kib, fds) = self.gw.footprint();
        let (requests, failed, _) = load.totals();
        Sample {
            t: t0.elapsed().as_secs_f64(),
            rss_kib,
            fds,
            generation: self.generation(),
            changes,
            requests,
            failed,
        }
    }
}

/// Writes `endpoints` where `source` says, and tells the gateway `pid` (a reload).
fn write(
    source: &Source,
    endpoints: &Endpoints,
    backends: &[BackendInfo],
    pid: Option<u32>,
) -> anyhow::Result<()> {
    let eps: Vec<(usize, bool)> = endpoints
        .eps
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            Ep::Absent => None,
            Ep::Ready => Some((i, false)),
            Ep::Draining(_) => Some((i, true)),
        })
        .collect();
    match source {
        Source::File {
            path,
            head,
            web,
            rest,
        } => {
            let mut text = format!("{head}{web}");
            for &(i, draining) in &eps {
                let (addr, mac) = (backends[i].ipv4, &backends[i].mac);
                let state = if draining { "draining" } else { "active" };
                text += &format!(
                    "\n[[services.backends]]\naddress = \"{addr}\"\nport = {NAT_PORT}\n\
                     mac = \"{mac}\"\nstate = \"{state}\"\n"
                );
            }
            text += "\n";
            text += rest;
            // Written whole, then renamed: a reload never reads half a file.
            let tmp = path.with_extension("toml.tmp");
            fs::write(&tmp, text).with_context(|| tmp.display().to_string())?;
            fs::rename(&tmp, path).with_context(|| path.display().to_string())?;
            if let Some(pid) = pid {
                let pid = nix::unistd::Pid::from_raw(i32::try_from(pid)?);
                nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP)
                    .context("SIGHUP to the gateway")?;
            }
        }
        Source::Kube(fake) => {
            let endpoints: Vec<Value> = eps
                .iter()
                .map(|&(i, draining)| {
                    json!({
                        "addresses": [backends[i].ipv4.to_string()],
                        "nodeName": format!("n{}", i + 1),
                        "conditions": {
                            "ready": !draining, "serving": true, "terminating": draining
                        }
                    })
                })
                .collect();
            fake.apply(json!({
                "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
                "metadata": {
                    "name": "web-1", "namespace": "default",
                    "labels": { "kubernetes.io/service-name": "web" }
                },
                "addressType": "IPv4",
                "ports": [{ "name": "http", "port": NAT_PORT, "protocol": "TCP" }],
                "endpoints": endpoints
            }));
        }
    }
    Ok(())
}

/// The `web` Service: LoadBalancer, our class, `http` 80 -> 8080, an address from the pool.
fn web_service() -> Value {
    json!({
        "kind": "Service", "apiVersion": "v1",
        "metadata": { "name": "web", "namespace": "default" },
        "spec": {
            "type": "LoadBalancer",
            "loadBalancerClass": CLASS,
            "externalTrafficPolicy": "Cluster",
            "selector": { "app": "web" },
            "ports": [{ "name": "http", "port": 80, "targetPort": NAT_PORT }]
        }
    })
}

/// The sum of the samples of `family` in Prometheus text `m` whose labels contain every one
/// of `labels` (`key="value"`).
pub(crate) fn metric(m: &str, family: &str, labels: &[&str]) -> f64 {
    m.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            let name = l.split(['{', ' ']).next().unwrap_or("");
            name == family
        })
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// ---------------------------------------------------------------------------------------
// The load.

#[derive(Default)]
struct Tally {
    requests: u64,
    failed: u64,
    /// (ms since start, error) of every failure.
    failures: Vec<(u64, String)>,
}

/// Request threads in the client namespace: HTTP `GET /` on a new connection each (and, if
/// asked, UDP datagrams from a new socket each: a new flow each), until dropped.
pub(crate) struct Load {
    tcp: Arc<Mutex<Tally>>,
    udp: Arc<Mutex<Tally>>,
    stop: Arc<AtomicBool>,
    start: Instant,
    handle: Option<thread::JoinHandle<()>>,
}

impl Load {
    /// Starts the threads in namespace `ns`: HTTP to `vip`, UDP to `udp` if given.
    pub(crate) fn start(
        ns: &str,
        vip: SocketAddr,
        udp: Option<SocketAddr>,
    ) -> anyhow::Result<Load> {
        let (tcp, udp_tally) = (Arc::default(), Arc::default());
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let (t, u, s) = (Arc::clone(&tcp), Arc::clone(&udp_tally), Arc::clone(&stop));
        let handle = spawn_in_netns(ns, "churn-load", move || {
            let mut threads = Vec::new();
            for _ in 0..REQUEST_THREADS {
                let (t, s) = (Arc::clone(&t), Arc::clone(&s));
                threads.push(thread::spawn(move || {
                    while !s.load(Ordering::Relaxed) {
                        let r = http_get(vip);
                        record(&t, start, r);
                        thread::sleep(REQUEST_EVERY);
                    }
                }));
            }
            if let Some(to) = udp {
                let (u, s) = (Arc::clone(&u), Arc::clone(&s));
                threads.push(thread::spawn(move || {
                    while !s.load(Ordering::Relaxed) {
                        let r = udp_echo(to);
                        record(&u, start, r);
                        thread::sleep(REQUEST_EVERY);
                    }
                }));
            }
            for t in threads {
                let _ = t.join();
            }
        })?;
        Ok(Load {
            tcp,
            udp: udp_tally,
            stop,
            start,
            handle: Some(handle),
        })
    }

    /// HTTP requests, failed, and the first failures (s, error).
    pub(crate) fn totals(&self) -> (u64, u64, Vec<(f64, String)>) {
        let t = self.tcp.lock().unwrap_or_else(PoisonError::into_inner);
        let first = t
            .failures
            .iter()
            .take(KEEP_FAILURES)
            .map(|(ms, e)| (*ms as f64 / 1000.0, e.clone()))
            .collect();
        (t.requests, t.failed, first)
    }

    /// UDP datagrams, unanswered.
    pub(crate) fn udp_totals(&self) -> (u64, u64) {
        let u = self.udp.lock().unwrap_or_else(PoisonError::into_inner);
        (u.requests, u.failed)
    }

    /// Every failure's time (ms since [`Load::start`]), HTTP and UDP.
    pub(crate) fn failure_times(&self) -> Vec<(u64, String)> {
        let mut v = Vec::new();
        for t in [&self.tcp, &self.udp] {
            v.extend(
                t.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .failures
                    .iter()
                    .cloned(),
            );
        }
        v.sort();
        v
    }

    /// When the load began.
    pub(crate) fn started(&self) -> Instant {
        self.start
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn record(t: &Mutex<Tally>, start: Instant, r: Result<(), String>) {
    let mut t = t.lock().unwrap_or_else(PoisonError::into_inner);
    t.requests += 1;
    if let Err(e) = r {
        t.failed += 1;
        let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        t.failures.push((ms, e));
    }
}

/// `GET /` on a new connection; Ok if a backend answered 200 with its name. A failure names
/// the step that failed, the client's port (a capture's filter) and the time it took.
fn http_get(to: SocketAddr) -> Result<(), String> {
    let t = Instant::now();
    let mut port = None;
    let mut go = || -> std::io::Result<String> {
        let mut s = TcpStream::connect_timeout(&to, REQUEST_TIMEOUT)
            .map_err(|e| std::io::Error::new(e.kind(), format!("connect: {e}")))?;
        port = s.local_addr().ok().map(|a| a.port());
        s.set_read_timeout(Some(REQUEST_TIMEOUT))?;
        s.write_all(b"GET / HTTP/1.0\r\nHost: vip\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text)
    };
    let r = go();
    let at = || {
        let ms = t.elapsed().as_millis();
        match port {
            Some(p) => format!(" (client port {p}, after {ms} ms)"),
            None => format!(" (after {ms} ms)"),
        }
    };
    match r {
        Ok(t) if t.starts_with("HTTP/1.1 200") && t.contains("backend=") => Ok(()),
        Ok(t) => Err(format!(
            "answer: {:?}{}",
            t.lines().next().unwrap_or_default(),
            at()
        )),
        Err(e) => Err(format!("{e}{}", at())),
    }
}

/// One datagram from a new socket (a new flow), and its echo.
fn udp_echo(to: SocketAddr) -> Result<(), String> {
    let go = || -> std::io::Result<bool> {
        let s = UdpSocket::bind("0.0.0.0:0")?;
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        s.send_to(b"soak\n", to)?;
        let mut buf = [0u8; 512];
        let n = s.recv(&mut buf)?;
        Ok(buf[..n].starts_with(b"backend="))
    };
    match go() {
        Ok(true) => Ok(()),
        Ok(false) => Err("udp: not an echo".into()),
        Err(e) => Err(format!("udp: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backends(n: usize) -> Vec<BackendInfo> {
        (1..=n)
            .map(|i| BackendInfo {
                name: format!("b{i}"),
                namespace: format!("x-b{i}"),
                ipv4: Ipv4Addr::new(198, 51, 100, 100 + i as u8),
                ipv6: None,
                mac: format!("02:00:00:00:01:{:02x}", 0x10 + i),
                pid: 0,
                tcp: Vec::new(),
                udp: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn churn_drains_before_it_removes_and_keeps_endpoints_ready() {
        // As many as the bench's default: at 1,000 changes a minute every step finds one.
        let mut e = Endpoints::new(40);
        let b = backends(40);
        let t0 = Instant::now();
        let mut draining_since = std::collections::HashMap::new();
        for k in 0..2000u64 {
            let now = t0 + Duration::from_millis(60 * k);
            let before = e.expected(&b);
            e.step(now);
            let after = e.expected(&b);
            for (a, d) in &before {
                let still = after.iter().find(|(x, _)| x == a);
                match still {
                    None => {
                        assert!(d, "{a} removed without draining first");
                        let since: Instant = draining_since[a];
                        assert!(
                            now.duration_since(since) >= DRAIN,
                            "{a} drained too briefly"
                        );
                    }
                    Some((_, true)) if !d => {
                        draining_since.insert(*a, now);
                    }
                    Some((_, false)) => assert!(!d, "{a} back from draining to ready"),
                    Some(_) => {}
                }
            }
            let ready = after.iter().filter(|(_, d)| !d).count();
            assert!(ready >= MIN_READY, "only {ready} ready");
        }
        // Only in the first DRAIN, before any endpoint can be removed, may a step find every
        // endpoint busy (the bench makes up for those later: it keeps the rate over the run).
        assert!(e.changes >= 1900, "{} changes in 2,000 steps", e.changes);
    }

    #[test]
    fn memory_baseline_is_taken_after_the_warmup() {
        let s = |t: f64, rss: u64, fds: usize| Sample {
            t,
            rss_kib: rss,
            fds,
            generation: 0,
            changes: 0,
            requests: 0,
            failed: 0,
        };
        let m = Memory::of(
            &[
                s(0.0, 100, 9),
                s(10.0, 1000, 10),
                s(20.0, 1005, 10),
                s(30.0, 1010, 11),
            ],
            10.0,
        );
        assert_eq!((m.baseline, m.max), (1000, 1010));
        assert!((m.growth_pct - 1.0).abs() < 1e-9);
        assert_eq!((m.fds_min, m.fds_max), (10, 11));
        assert_eq!(m.fds_floor_rise, 0, "one sample above the floor is no leak");

        let fds = |list: &[usize]| {
            let samples: Vec<Sample> = list
                .iter()
                .enumerate()
                .map(|(i, &f)| s(10.0 * i as f64, 1000, f))
                .collect();
            Memory::of(&samples, 0.0).fds_floor_rise
        };
        assert_eq!(fds(&[48, 61, 48, 52, 48, 48]), 0, "transient sockets");
        assert_eq!(
            fds(&[48, 49, 50, 51, 52, 53]),
            3,
            "one more every sample: a leak"
        );
    }

    #[test]
    fn metric_sums_a_family_by_labels() {
        let m = "# TYPE x gauge\nx{core=\"a\",state=\"free\"} 3\nx{core=\"b\",state=\"free\"} 4\n\
                 x{core=\"a\",state=\"rx\"} 1\nxy 100\n";
        assert_eq!(metric(m, "x", &["state=\"free\""]), 7.0);
        assert_eq!(metric(m, "x", &[]), 8.0);
        assert_eq!(metric(m, "xy", &[]), 100.0);
    }
}
