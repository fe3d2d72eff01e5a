//! `strait-lab bench failover`: what losing, draining and restarting a gateway costs the
//! connections going through a fleet of gateways behind a BGP/ECMP router.
//!
//! ```text
//! testbed up --gateways N ── strait run in gw1..gwN ── router: VIP/32 with N next hops
//!    │
//!    ├── client thread (setns into {prefix}-client) ──► S stream threads: GET /echo, then a
//!    │     32-byte line every 50 ms, each echo compared; a stream that errs is counted and
//!    │     replaced by a new one; 2 request threads: GET / on a new connection, 1 s timeout
//!    │
//!    └── events, one after the other, each until the fleet is whole again:
//!          kill       SIGKILL gw1; it is started again once the router dropped it
//!          drain      POST /drain to gw2 (withdraw, forward through drain_grace, exit 0);
//!                     started again
//!          restart    a backend change and a restart: gw3 stopped (SIGTERM); b4 set
//!                     `draining` in every gateway's configuration (it keeps its flows, takes
//!                     no new ones: Maglev moves its slots), the others reload; gw3 started
//!          backend-change-during-kill
//!                     SIGKILL gw1 while the others reload with b4 active again (Maglev
//!                     moves slots back to it); gw1 started again with it
//! ```
//!
//! Per event, over the window from the event to the fleet whole again plus a settle time:
//!
//! - `streams`: streams open when it began; `streams_reset`: streams that ended with an
//!   error (RST, timeout of [`READ_TIMEOUT`], a wrong echo) in the window;
//! - `requests_failed`: short requests that failed in the window;
//! - `recovery_ms`: from the event to the end of the last stall (no echo for [`STALL`] or
//!   more) of any stream that began in the window; 0 when no stream stalled;
//! - `packets_lost`: the client's TCP retransmissions in the window (`RetransSegs` of the
//!   client namespace): each is a segment (or SYN) that did not arrive, or was not answered
//!   in time;
//! - `flows_moved_backend` (restart and backend-change-during-kill): streams reset by a RST
//!   in the window: a DSR stream whose packets reach a backend other than its own meets a
//!   RST from it. In kill and drain every gateway has the same backends, so nothing moves;
//!   their RSTs (`streams_reset_by_rst`) come from a killed gateway's kernel.
//!
//! The client is threads of this process that entered the client namespace (`setns`, as
//! `bench control` does for its worker): they share their log with the bench directly, so
//! there is no second process to start, watch and talk to over a pipe, and they stop with
//! it. The gateways are `strait run` processes (the product binary), one per namespace,
//! recorded in the testbed's pid file so `testbed down` ends them after a hard stop.
//!
//! The L2 layout (`--l2`): the gateways elect the VIP's owner with VRRP (`[gateway.l2]`);
//! `l2-kill` kills the owner with SIGKILL, `l2-drain` drains the next one, and "withdrawn"
//! is the time until another gateway owns the VIP.
//!
//! `--ipv6`: the testbed is dual stack and every stream and request goes to the IPv6 VIP,
//! announced over the gateways' IPv6 BGP sessions (or elected with VRRPv3 on the L2
//! layout), hashed by the router on L4 ports, its flows synced over IPv6; "withdrawn" is the
//! router's IPv6 route (or the IPv6 VIP's owner).

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use serde::Serialize;

use super::{in_netns, spawn_in_netns};
use crate::testbed::{self, GatewayInfo, Testbed, VIP4, VIP6};

/// Interval between two writes of a stream: 20 writes a second show a stall of a tenth of
/// a second, and 200 streams stay at 4,000 small packets a second, nothing for the gateways.
const PERIOD: Duration = Duration::from_millis(50);
/// A gap between two echoes this long is a stall: three periods, well above the testbed's
/// round trip (< 1 ms) and the scheduler's noise on two shared cores, below TCP's smallest
/// retransmission timeout (200 ms), so one lost segment shows.
const STALL: Duration = Duration::from_millis(150);
/// How long a stream waits for its echo before it counts as broken: TCP retransmits a lost
/// segment for much longer, but a stream silent for 10 s is broken for its user.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Timeout of each short request (connect, and the whole answer).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause between two short requests of one request thread.
const REQUEST_EVERY: Duration = Duration::from_millis(20);
/// Threads sending short requests.
const REQUEST_THREADS: usize = 2;
/// Bytes of one stream write (and of its echo).
const LINE: usize = 32;
/// Quiet time after the fleet is whole again, before an event's window closes: late
/// retransmissions and resets land in it.
const SETTLE: Duration = Duration::from_millis(1500);
/// How long a gateway may take from start to announced (BGP session, first health checks).
const GATEWAY_UP: Duration = Duration::from_secs(30);
/// How long the router may take to follow a gateway's announcement or withdrawal.
const ROUTE_CHANGE: Duration = Duration::from_secs(15);
/// The gateways' drain grace (testbed configuration) plus the margin an exit may take.
const DRAIN_EXIT: Duration = Duration::from_secs(10);

/// Set by SIGINT and SIGTERM.
static STOP: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();

/// Ctrl-C or SIGTERM ends the bench at its next step, and everything it made is removed on
/// the way out (the client, the gateways, the testbed).
pub(crate) fn catch_stop() -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing the SIGINT/SIGTERM handler")?;
    }
    let _ = STOP.set(stop);
    Ok(())
}

/// An error once SIGINT or SIGTERM arrived.
pub(crate) fn interrupted() -> anyhow::Result<()> {
    if STOP.get().is_some_and(|s| s.load(Ordering::Relaxed)) {
        bail!("interrupted");
    }
    Ok(())
}

/// Sleeps `d`, waking for a signal.
pub(crate) fn pause(d: Duration) -> anyhow::Result<()> {
    let t = Instant::now();
    while t.elapsed() < d {
        interrupted()?;
        thread::sleep(Duration::from_millis(50).min(d.saturating_sub(t.elapsed())));
    }
    Ok(())
}

/// `strait-lab bench failover` options.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Gateways behind the router, 2 to 4 (the events need two at least; three to kill,
    /// drain and restart different ones).
    #[arg(long, default_value_t = 3)]
    pub gateways: usize,
    /// Long-lived TCP streams.
    #[arg(long, default_value_t = 200)]
    pub streams: usize,
    /// Backends (the restart sets the last one draining).
    #[arg(long, default_value_t = 4)]
    pub backends: usize,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The testbed's namespace prefix.
    #[arg(long, default_value = "sfo")]
    pub prefix: String,
    /// The L2 layout (no router, VRRP between the gateways): the events are l2-kill and
    /// l2-drain.
    #[arg(long)]
    pub l2: bool,
    /// Run the gateways without flow sync (`[gateway.sync]` taken out of their
    /// configurations): what a restart after a backend change costs without it.
    #[arg(long)]
    pub no_sync: bool,
    /// Streams and requests to the IPv6 VIP of a dual-stack testbed (IPv6 BGP sessions,
    /// VRRPv3 for IPv6 with `--l2`, flow sync over IPv6).
    #[arg(long)]
    pub ipv6: bool,
}

/// One event's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct EventResult {
    /// `kill`, `drain`, `restart` or `backend-change-during-kill`.
    pub event: &'static str,
    /// Gateways in the fleet.
    pub gateways: usize,
    /// Streams open when the event began.
    pub streams: usize,
    /// Streams that broke in the window.
    pub streams_reset: usize,
    /// Of those, broken by a RST.
    pub streams_reset_by_rst: usize,
    /// Short requests that failed in the window.
    pub requests_failed: usize,
    /// Short requests sent in the window.
    pub requests: usize,
    /// Failed requests later than `recovery_ms` after the event.
    pub requests_failed_after_recovery: usize,
    /// From the event to the end of the last stall; 0 without a stall.
    pub recovery_ms: u64,
    /// The client's TCP retransmissions in the window.
    pub packets_lost: u64,
    /// Streams whose backend changed (see the module docs).
    pub flows_moved_backend: usize,
    /// Length of the window.
    pub window_ms: u64,
    /// The streams reset, by the backend they were on.
    pub reset_by_backend: BTreeMap<String, usize>,
    /// The event's gateway's share of the packets all gateways received in the second
    /// before it (about 1/N when the router spreads the flows): the event hit live traffic.
    pub gateway_share: f64,
    /// From the event to the router's route losing the gateway (`ip route`, polled every
    /// 10 ms): the withdrawal's way from the gateway to the router's kernel.
    pub withdrawn_ms: u64,
}

/// What `--json` writes.
#[derive(Debug, Serialize)]
struct Report {
    results: Vec<EventResult>,
    cpu: String,
    notes: Vec<String>,
    /// Whether the gateways shared flow state (`[gateway.sync]`).
    flow_sync: bool,
    /// The VIP the streams went to.
    vip: IpAddr,
}

/// Runs the bench.
///
/// # Errors
/// Not root; the testbed, a gateway or the router did not come up; an event's step failed.
pub fn run(o: &Options) -> anyhow::Result<()> {
    ensure!(
        (2..=testbed::MAX_GATEWAYS).contains(&o.gateways),
        "--gateways must be 2 to {}",
        testbed::MAX_GATEWAYS
    );
    ensure!(o.streams > 0, "--streams must be at least 1");
    ensure!(o.backends >= 2, "--backends must be at least 2");
    catch_stop()?;
    let bed = testbed::up(&testbed::Opts {
        backends: o.backends,
        prefix: o.prefix.clone(),
        gateways: o.gateways,
        l2: o.l2,
        ipv6: o.ipv6,
        ..testbed::Opts::default()
    })?;
    let notes = Vec::new();
    let vip = if o.ipv6 {
        IpAddr::V6(VIP6)
    } else {
        IpAddr::V4(VIP4)
    };
    let mut fleet = Fleet::up_with(&bed, !o.no_sync, vip)?;
    let results = if o.l2 {
        l2_events(&bed, &mut fleet, o)?
    } else {
        events(&bed, &mut fleet, o)?
    };
    fleet.stop_all();
    let report = Report {
        results,
        cpu: cpu_model(),
        notes,
        flow_sync: !o.no_sync,
        vip,
    };
    print_table(&report);
    if let Some(path) = &o.json {
        fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    drop(bed);
    Ok(())
}

fn events(bed: &Testbed, fleet: &mut Fleet, o: &Options) -> anyhow::Result<Vec<EventResult>> {
    let n = o.gateways;
    let client = Client::start_to(&bed.client_namespace(), o.streams, fleet.vip)?;
    client.wait_all_open(o.streams, Duration::from_secs(30))?;
    let all: Vec<String> = bed.backends().iter().map(|b| b.name.clone()).collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let last = &all[all.len() - 1..];
    let (first, second, third) = (0, 1 % n, 2 % n);
    let mut results = Vec::new();

    // kill
    let (w, share) = begin(&client, fleet, first, o.streams)?;
    let t = Instant::now();
    fleet.kill(first);
    fleet.wait_paths(n - 1)?;
    let withdrawn = t.elapsed();
    fleet.start(first)?;
    fleet.wait_paths(n)?;
    pause(SETTLE)?;
    results.push(finish(&client, &w, "kill", n, false, share, withdrawn));

    // drain
    let (w, share) = begin(&client, fleet, second, o.streams)?;
    let t = Instant::now();
    fleet.drain(second)?;
    fleet.wait_paths(n - 1)?;
    let withdrawn = t.elapsed();
    fleet.wait_exit(second, DRAIN_EXIT)?;
    fleet.start(second)?;
    fleet.wait_paths(n)?;
    pause(SETTLE)?;
    results.push(finish(&client, &w, "drain", n, false, share, withdrawn));

    // restart after a backend change: the last backend set draining everywhere while the
    // third gateway is down; a fresh Maglev table sends that backend's flows elsewhere.
    let (w, share) = begin(&client, fleet, third, o.streams)?;
    let t = Instant::now();
    fleet.terminate(third);
    fleet.wait_paths(n - 1)?;
    let withdrawn = t.elapsed();
    fleet.wait_exit(third, DRAIN_EXIT)?;
    for i in 0..n {
        fleet.write_config(i, last)?;
    }
    for i in (0..n).filter(|&i| i != third) {
        fleet.reload(i)?;
    }
    fleet.start(third)?;
    fleet.wait_paths(n)?;
    pause(SETTLE)?;
    results.push(finish(&client, &w, "restart", n, true, share, withdrawn));

    // backend change during a kill: every survivor reloads with the last backend active
    // again as the first gateway dies; it comes back with the same configuration.
    let (w, share) = begin(&client, fleet, first, o.streams)?;
    for i in 0..n {
        fleet.write_config(i, &[])?;
    }
    let t = Instant::now();
    fleet.kill(first);
    for i in (0..n).filter(|&i| i != first) {
        fleet.reload(i)?;
    }
    fleet.wait_paths(n - 1)?;
    let withdrawn = t.elapsed();
    fleet.start(first)?;
    fleet.wait_paths(n)?;
    pause(SETTLE)?;
    let event = "backend-change-during-kill";
    results.push(finish(&client, &w, event, n, true, share, withdrawn));

    client.stop();
    Ok(results)
}

/// The L2 layout's events: SIGKILL of the VIP's owner (`l2-kill`), and a drain of the
/// next owner (`l2-drain`); "withdrawn" is the time until another gateway owns the VIP.
fn l2_events(bed: &Testbed, fleet: &mut Fleet, o: &Options) -> anyhow::Result<Vec<EventResult>> {
    let n = o.gateways;
    let client = Client::start_to(&bed.client_namespace(), o.streams, fleet.vip)?;
    client.wait_all_open(o.streams, Duration::from_secs(30))?;
    let mut results = Vec::new();
    for (event, drain) in [("l2-kill", false), ("l2-drain", true)] {
        let k = fleet.wait_owner(None)?;
        let (w, share) = begin(&client, fleet, k, o.streams)?;
        let t = Instant::now();
        if drain {
            fleet.drain(k)?;
        } else {
            fleet.kill(k);
        }
        fleet.wait_owner(Some(k))?;
        let moved = t.elapsed();
        if drain {
            fleet.wait_exit(k, DRAIN_EXIT)?;
        }
        fleet.start(k)?;
        pause(SETTLE)?;
        results.push(finish(&client, &w, event, n, false, share, moved));
    }
    client.stop();
    Ok(results)
}

/// Opens an event's window on gateway `k`: every stream open, a second of traffic, and
/// `k`'s share of that second's packets.
fn begin(
    client: &Client,
    fleet: &Fleet,
    k: usize,
    streams: usize,
) -> anyhow::Result<(Window, f64)> {
    let before = fleet.rx_all();
    let w = client.window_start(streams)?;
    let after = fleet.rx_all();
    let delta: Vec<f64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let total: f64 = delta.iter().sum();
    let share = if total > 0.0 { delta[k] / total } else { 0.0 };
    Ok((w, share))
}

fn finish(
    client: &Client,
    w: &Window,
    event: &'static str,
    gateways: usize,
    moves: bool,
    share: f64,
    withdrawn: Duration,
) -> EventResult {
    let mut r = client.window_end(w, event, gateways, moves);
    r.gateway_share = (share * 1000.0).round() / 1000.0;
    r.withdrawn_ms = ms_of(withdrawn);
    eprintln!(
        "bench failover: {}: {}/{} streams reset, {}/{} requests failed, recovery {} ms, \
         route withdrawn in {} ms, the gateway had {:.0} % of the packets",
        r.event,
        r.streams_reset,
        r.streams,
        r.requests_failed,
        r.requests,
        r.recovery_ms,
        r.withdrawn_ms,
        r.gateway_share * 100.0
    );
    r
}

fn print_table(r: &Report) {
    println!(
        "{:<28} {:>8} {:>7} {:>6} {:>5} {:>8} {:>7} {:>11} {:>7} {:>6} {:>9} {:>6}",
        "event",
        "gateways",
        "streams",
        "reset",
        "rst",
        "req fail",
        "req",
        "recovery ms",
        "retrans",
        "moved",
        "withdrawn",
        "share"
    );
    for e in &r.results {
        println!(
            "{:<28} {:>8} {:>7} {:>6} {:>5} {:>8} {:>7} {:>11} {:>7} {:>6} {:>6} ms {:>5.0}%",
            e.event,
            e.gateways,
            e.streams,
            e.streams_reset,
            e.streams_reset_by_rst,
            e.requests_failed,
            e.requests,
            e.recovery_ms,
            e.packets_lost,
            e.flows_moved_backend,
            e.withdrawn_ms,
            e.gateway_share * 100.0
        );
    }
    for n in &r.notes {
        println!("note: {n}");
    }
    println!("cpu: {}", r.cpu);
}

pub(crate) fn cpu_model() -> String {
    let info = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or("unknown", str::trim)
        .to_owned();
    let cores = thread::available_parallelism().map_or(0, std::num::NonZero::get);
    format!("{model}, {cores} cores")
}

// ---------------------------------------------------------------------------------------
// The gateways.

/// One `strait run` per gateway namespace.
pub(crate) struct Fleet {
    gateways: Vec<GatewayInfo>,
    children: Vec<Option<Child>>,
    strait: PathBuf,
    dir: PathBuf,
    router_ns: String,
    layout: testbed::Layout,
    prefix: String,
    /// Whether the gateways run `[gateway.sync]`.
    sync: bool,
    /// The VIP whose route (or VRRP owner) tells which gateways take traffic.
    vip: IpAddr,
}

impl Fleet {
    pub(crate) fn up(bed: &Testbed) -> anyhow::Result<Fleet> {
        Self::up_with(bed, true, IpAddr::V4(VIP4))
    }

    /// [`Fleet::up`], with flow sync between the gateways or without it, watching the
    /// route (or the owner) of `vip`.
    pub(crate) fn up_with(bed: &Testbed, sync: bool, vip: IpAddr) -> anyhow::Result<Fleet> {
        let router_ns = match bed.router() {
            Some(r) => r.namespace.clone(),
            // The L2 layout, or a lone gateway (`bench flood`): no router to watch.
            None if bed.layout().l2 || bed.gateways().len() == 1 => String::new(),
            None => bail!("the testbed has no router"),
        };
        let strait = crate::strait_binary()?;
        let mut fleet = Fleet {
            gateways: bed.gateways().to_vec(),
            children: (0..bed.gateways().len()).map(|_| None).collect(),
            strait,
            dir: testbed::run_dir(bed.prefix()),
            router_ns,
            layout: bed.layout().clone(),
            prefix: bed.prefix().to_owned(),
            sync,
            vip,
        };
        for i in 0..fleet.gateways.len() {
            if !sync {
                fleet.write_config(i, &[])?;
            }
            fleet.start(i)?;
        }
        if fleet.layout.l2 {
            fleet.wait_owner(None)?;
        } else if !fleet.router_ns.is_empty() {
            fleet.wait_paths(fleet.gateways.len())?;
        }
        Ok(fleet)
    }

    /// The gateway whose `/routes` says it owns the VIP (VRRP master), if one does.
    fn owner(&self) -> Option<usize> {
        let vip = self.vip.to_string();
        self.gateways.iter().position(|g| {
            admin(&g.namespace, "GET", "/routes")
                .ok()
                .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
                .is_some_and(|r| {
                    r["l2"]["owned"]
                        .as_array()
                        .is_some_and(|o| o.iter().any(|v| v == vip.as_str()))
                })
        })
    }

    /// Waits until a gateway other than `not` owns the VIP; which.
    fn wait_owner(&self, not: Option<usize>) -> anyhow::Result<usize> {
        let t = Instant::now();
        loop {
            if let Some(k) = self.owner().filter(|&k| Some(k) != not) {
                return Ok(k);
            }
            interrupted()?;
            ensure!(
                t.elapsed() < ROUTE_CHANGE.max(GATEWAY_UP),
                "no gateway owns {} after {:?}",
                self.vip,
                t.elapsed()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Writes gateway `i`'s configuration: every backend, those in `draining` draining, flow
    /// sync as the bench was asked.
    fn write_config(&self, i: usize, draining: &[&str]) -> anyhow::Result<()> {
        let path = &self.gateways[i].config;
        let text = testbed::gateway_config(&self.layout, i + 1, draining, self.sync, path);
        fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    }

    /// Starts gateway `i` with its configuration file as it is, and waits until it answers
    /// `ok` on `/healthz`.
    fn start(&mut self, i: usize) -> anyhow::Result<()> {
        let g = &self.gateways[i];
        let log_path = self.dir.join(format!("{}.log", g.name));
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &g.namespace])
            .arg(&self.strait)
            .arg("run")
            .arg("--config")
            .arg(&g.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {} in {}", self.strait.display(), g.namespace))?;
        // `down` ends it if this bench cannot (a Ctrl-C: its own process group is spared).
        testbed::record_pid(&self.prefix, child.id(), &g.name)?;
        self.children[i] = Some(child);
        let t = Instant::now();
        loop {
            if admin(&g.namespace, "GET", "/healthz").is_ok_and(|b| b.trim() == "ok") {
                return Ok(());
            }
            if let Some(c) = self.children[i].as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    bail!(
                        "{} exited ({status}); its log, {}:\n{}",
                        g.name,
                        log_path.display(),
                        tail(&log_path)
                    );
                }
            }
            interrupted()?;
            if t.elapsed() > GATEWAY_UP {
                bail!(
                    "{} not ready after {GATEWAY_UP:?}; its log:\n{}",
                    g.name,
                    tail(&log_path)
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// `strait_rx_packets_total` of every gateway (0 for one that does not answer).
    fn rx_all(&self) -> Vec<f64> {
        self.gateways
            .iter()
            .map(|g| {
                admin(&g.namespace, "GET", "/metrics")
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.starts_with("strait_rx_packets_total"))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum()
            })
            .collect()
    }

    fn pid(&self, i: usize) -> Option<u32> {
        self.children[i].as_ref().map(Child::id)
    }

    /// SIGKILL; the speaker's directory (`$TMPDIR/strait-bgp-PID`) a killed gateway leaves.
    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let pid = c.id();
            let _ = c.kill();
            let _ = c.wait();
            for speaker in ["bgp", "vrrp"] {
                let dir = std::env::temp_dir().join(format!("strait-{speaker}-{pid}"));
                let _ = fs::remove_dir_all(dir);
            }
        }
    }

    fn terminate(&mut self, i: usize) {
        if let Some(pid) = self.pid(i) {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
    }

    fn drain(&mut self, i: usize) -> anyhow::Result<()> {
        let answer = admin(&self.gateways[i].namespace, "POST", "/drain")?;
        ensure!(
            answer.starts_with("draining"),
            "POST /drain to {}: {answer}",
            self.gateways[i].name
        );
        Ok(())
    }

    fn reload(&mut self, i: usize) -> anyhow::Result<()> {
        let answer = admin(&self.gateways[i].namespace, "POST", "/reload")?;
        ensure!(
            answer.starts_with("reloaded"),
            "POST /reload to {}: {answer}",
            self.gateways[i].name
        );
        Ok(())
    }

    fn wait_exit(&mut self, i: usize, timeout: Duration) -> anyhow::Result<()> {
        let t = Instant::now();
        let name = self.gateways[i].name.clone();
        let Some(c) = self.children[i].as_mut() else {
            return Ok(());
        };
        loop {
            if let Some(status) = c.try_wait()? {
                ensure!(status.success(), "{name} exited with {status}");
                self.children[i] = None;
                return Ok(());
            }
            interrupted()?;
            ensure!(
                t.elapsed() < timeout,
                "{name} still running after {timeout:?}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the router's route to the VIP has `n` next hops.
    fn wait_paths(&self, n: usize) -> anyhow::Result<()> {
        let t = Instant::now();
        loop {
            let now = paths(&self.router_ns, self.vip);
            if now == n {
                return Ok(());
            }
            interrupted()?;
            ensure!(
                t.elapsed() < ROUTE_CHANGE.max(GATEWAY_UP),
                "the router's route to {} has {now} next hops, not {n}, after {:?}",
                self.vip,
                t.elapsed()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    pub(crate) fn stop_all(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Next hops of the router's route to `vip` (`ip route show`): 0 without a route.
pub fn paths(router_ns: &str, vip: IpAddr) -> usize {
    let (family, len) = if vip.is_ipv6() {
        ("-6", 128)
    } else {
        ("-4", 32)
    };
    let out = Command::new("ip")
        .args([
            "-n",
            router_ns,
            family,
            "route",
            "show",
            &format!("{vip}/{len}"),
        ])
        .output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let multi = text.matches("nexthop via").count();
    if multi > 0 {
        multi
    } else {
        usize::from(text.contains(" via "))
    }
}

fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// One request to a gateway's admin API (loopback, inside its namespace); the body.
pub(crate) fn admin(ns: &str, method: &str, path: &str) -> anyhow::Result<String> {
    in_netns(ns, || -> anyhow::Result<String> {
        let addr = SocketAddr::from(([127, 0, 0, 1], 9900));
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: strait\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text
            .split_once("\r\n\r\n")
            .map_or(text.clone(), |(_, b)| b.to_owned()))
    })?
}

// ---------------------------------------------------------------------------------------
// The client.

/// A stream's life.
#[derive(Debug, Clone, Default)]
struct StreamLife {
    /// The backend that answered `GET /echo`.
    backend: String,
    last_ok_ms: u64,
    /// (start, end) of gaps of [`STALL`] or more between echoes.
    stalls: Vec<(u64, u64)>,
    /// When and how it broke.
    ended: Option<(u64, bool)>,
}

#[derive(Default)]
struct Log {
    streams: Vec<StreamLife>,
    /// (time, ok) of every short request.
    requests: Vec<(u64, bool)>,
}

pub(crate) struct Client {
    log: Arc<Mutex<Log>>,
    stop: Arc<AtomicBool>,
    start: Instant,
    ns: String,
    handle: Option<thread::JoinHandle<()>>,
}

/// Where the client's streams and requests go: the VIP's HTTP port.
fn vip_addr(vip: IpAddr) -> SocketAddr {
    SocketAddr::new(vip, testbed::HTTP_PORT)
}

/// An event's beginning.
pub(crate) struct Window {
    t0: u64,
    open: usize,
    retrans: u64,
}

impl Client {
    /// [`Client::start_to`] the IPv4 VIP.
    pub(crate) fn start(ns: &str, streams: usize) -> anyhow::Result<Client> {
        Self::start_to(ns, streams, IpAddr::V4(VIP4))
    }

    /// Starts `streams` streams and the request threads to `vip`, from namespace `ns`.
    pub(crate) fn start_to(ns: &str, streams: usize, vip: IpAddr) -> anyhow::Result<Client> {
        let log = Arc::new(Mutex::new(Log::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let (l, s) = (log.clone(), stop.clone());
        let to = vip_addr(vip);
        let handle = spawn_in_netns(ns, "failover-client", move || {
            let mut threads = Vec::new();
            for slot in 0..streams {
                let (l, s) = (l.clone(), s.clone());
                threads.push(thread::spawn(move || stream_slot(slot, to, &l, &s, start)));
            }
            for _ in 0..REQUEST_THREADS {
                let (l, s) = (l.clone(), s.clone());
                threads.push(thread::spawn(move || requests(to, &l, &s, start)));
            }
            for t in threads {
                let _ = t.join();
            }
        })?;
        Ok(Client {
            log,
            stop,
            start,
            ns: ns.to_owned(),
            handle: Some(handle),
        })
    }

    fn now(&self) -> u64 {
        ms(self.start)
    }

    fn open(&self) -> usize {
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.streams.iter().filter(|s| s.ended.is_none()).count()
    }

    pub(crate) fn wait_all_open(&self, n: usize, timeout: Duration) -> anyhow::Result<()> {
        let t = Instant::now();
        while self.open() < n {
            interrupted()?;
            ensure!(
                t.elapsed() < timeout,
                "only {} of {n} streams open after {timeout:?}",
                self.open()
            );
            thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    pub(crate) fn window_start(&self, n: usize) -> anyhow::Result<Window> {
        self.wait_all_open(n, Duration::from_secs(30))?;
        // A second of undisturbed traffic before each event.
        pause(Duration::from_secs(1))?;
        Ok(Window {
            t0: self.now(),
            open: self.open(),
            retrans: self.retransmissions(),
        })
    }

    pub(crate) fn window_end(
        &self,
        w: &Window,
        event: &'static str,
        gateways: usize,
        moves: bool,
    ) -> EventResult {
        let t1 = self.now();
        let retrans = self.retransmissions().saturating_sub(w.retrans);
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        let in_window = |t: u64| t >= w.t0 && t <= t1;
        let mut reset_by_backend = BTreeMap::new();
        let ended: Vec<bool> = log
            .streams
            .iter()
            .filter_map(|s| {
                let (_, rst) = s.ended.filter(|(t, _)| in_window(*t))?;
                *reset_by_backend.entry(s.backend.clone()).or_insert(0) += 1;
                Some(rst)
            })
            .collect();
        let mut recovery = 0;
        for s in &log.streams {
            for &(a, b) in &s.stalls {
                if b >= w.t0 && a <= t1 {
                    recovery = recovery.max(b.saturating_sub(w.t0));
                }
            }
            // A stream stalled and still silent at the end of the window.
            if s.ended.is_none() && t1.saturating_sub(s.last_ok_ms) >= ms_of(STALL) {
                recovery = recovery.max(t1 - w.t0);
            }
        }
        let reqs: Vec<(u64, bool)> = log
            .requests
            .iter()
            .copied()
            .filter(|(t, _)| in_window(*t))
            .collect();
        let rst = ended.iter().filter(|r| **r).count();
        EventResult {
            event,
            gateways,
            streams: w.open,
            streams_reset: ended.len(),
            streams_reset_by_rst: rst,
            requests_failed: reqs.iter().filter(|(_, ok)| !ok).count(),
            requests: reqs.len(),
            requests_failed_after_recovery: reqs
                .iter()
                .filter(|(t, ok)| !ok && *t > w.t0 + recovery)
                .count(),
            recovery_ms: recovery,
            packets_lost: retrans,
            flows_moved_backend: if moves { rst } else { 0 },
            window_ms: t1 - w.t0,
            reset_by_backend,
            gateway_share: 0.0,
            withdrawn_ms: 0,
        }
    }

    /// The longest stall (no echo for [`STALL`] or more) of any stream within the window
    /// from `w` to now, in ms; a stream still silent counts up to now.
    pub(crate) fn longest_stall(&self, w: &Window) -> u64 {
        let t1 = self.now();
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        let mut longest = 0;
        for s in &log.streams {
            for &(a, b) in &s.stalls {
                if b >= w.t0 && a <= t1 {
                    longest = longest.max(b - a);
                }
            }
            if s.ended.is_none() && t1.saturating_sub(s.last_ok_ms) >= ms_of(STALL) {
                longest = longest.max(t1 - s.last_ok_ms.max(w.t0));
            }
        }
        longest
    }

    /// `RetransSegs` of the client namespace.
    fn retransmissions(&self) -> u64 {
        in_netns(&self.ns, || {
            let snmp = fs::read_to_string("/proc/thread-self/net/snmp").unwrap_or_default();
            let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
            let (names, values) = (tcp.next().unwrap_or(""), tcp.next().unwrap_or(""));
            names
                .split_whitespace()
                .zip(values.split_whitespace())
                .find(|(n, _)| *n == "RetransSegs")
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0)
        })
        .unwrap_or(0)
    }

    pub(crate) fn stop(self) {
        drop(self);
    }
}

impl Drop for Client {
    /// Stops every stream and request thread (also when an event failed half-way), before
    /// the fleet and the testbed go.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn ms_of(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One stream slot: a stream to `to` open at all times; one that breaks is recorded and
/// replaced.
fn stream_slot(slot: usize, to: SocketAddr, log: &Mutex<Log>, stop: &AtomicBool, start: Instant) {
    while !stop.load(Ordering::Relaxed) {
        let Ok((stream, reader, backend)) = open_echo(to) else {
            thread::sleep(Duration::from_millis(100));
            continue;
        };
        let now = ms(start);
        let index = {
            let mut l = log.lock().unwrap_or_else(PoisonError::into_inner);
            l.streams.push(StreamLife {
                backend,
                last_ok_ms: now,
                ..StreamLife::default()
            });
            l.streams.len() - 1
        };
        let broke = echo_loop(slot, stream, reader, log, index, stop, start);
        if let Some(rst) = broke {
            let mut l = log.lock().unwrap_or_else(PoisonError::into_inner);
            l.streams[index].ended = Some((ms(start), rst));
        } else {
            let mut l = log.lock().unwrap_or_else(PoisonError::into_inner);
            // Closed by the bench at the end: not a reset; outside every window.
            l.streams[index].ended = Some((u64::MAX, false));
        }
    }
}

type Echo = (TcpStream, BufReader<TcpStream>, String);

fn open_echo(to: SocketAddr) -> std::io::Result<Echo> {
    let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(READ_TIMEOUT))?;
    s.write_all(b"GET /echo HTTP/1.1\r\nHost: vip\r\n\r\n")?;
    let mut reader = BufReader::new(s.try_clone()?);
    let mut backend = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some(b) = line.strip_prefix("X-Strait-Backend: ") {
            b.clone_into(&mut backend);
        }
    }
    Ok((s, reader, backend))
}

/// Writes a line every [`PERIOD`] and checks its echo; `None` when stopped, else whether
/// the stream broke by a RST.
fn echo_loop(
    slot: usize,
    mut s: TcpStream,
    mut reader: BufReader<TcpStream>,
    log: &Mutex<Log>,
    index: usize,
    stop: &AtomicBool,
    start: Instant,
) -> Option<bool> {
    let mut last_ok = ms(start);
    let mut back = vec![0u8; LINE];
    for seq in 0u64.. {
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        // 32 bytes as long as slot < 10^6 and seq < 10^16; a longer line is still checked.
        let msg = format!("{slot:06} {seq:016} streams\n");
        back.resize(msg.len(), 0);
        let result = s
            .write_all(msg.as_bytes())
            .and_then(|()| reader.read_exact(&mut back));
        if let Err(e) = result {
            return Some(e.kind() == std::io::ErrorKind::ConnectionReset);
        }
        if back.as_slice() != msg.as_bytes() {
            return Some(false);
        }
        let now = ms(start);
        if now - last_ok >= ms_of(STALL) {
            let mut l = log.lock().unwrap_or_else(PoisonError::into_inner);
            l.streams[index].stalls.push((last_ok, now));
        }
        if now - last_ok > 0 {
            let mut l = log.lock().unwrap_or_else(PoisonError::into_inner);
            l.streams[index].last_ok_ms = now;
        }
        last_ok = now;
        thread::sleep(PERIOD);
    }
    None
}

/// Short requests to `to`, one connection each, until stopped.
fn requests(to: SocketAddr, log: &Mutex<Log>, stop: &AtomicBool, start: Instant) {
    while !stop.load(Ordering::Relaxed) {
        let ok = request(to).is_ok_and(|head| head.starts_with("HTTP/1.1 200"));
        let t = ms(start);
        log.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .requests
            .push((t, ok));
        thread::sleep(REQUEST_EVERY);
    }
}

fn request(to: SocketAddr) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&to, REQUEST_TIMEOUT)?;
    s.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: vip\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    Ok(text)
}
