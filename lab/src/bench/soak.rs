//! `strait-lab bench soak`: the gateway under steady mixed traffic, endpoint churn and health
//! flaps for a long time.
//!
//! ```text
//! testbed up --topology two-arm: strait run (nat) ── `web` (TCP 80 -> 8080), churned as in
//!   `bench churn --via reload`; `echo` (UDP 53 -> 5353) over every backend, health-checked
//!   client: HTTP GET / on a new connection each, UDP datagrams from a new socket each
//!   flaps: every FLAP_EVERY the server of a ready backend is killed (SIGKILL) and started
//!          again FLAP_DOWN later; the gateway's health checks take it out and back
//! ```
//!
//! Every [`SAMPLE_EVERY`] it records the gateway's resident memory and descriptors, its UMEM
//! frames by state (`strait_umem_frames`: free, fill, rx, tx, completion, kernel; their sum
//! must be the UMEM's size, and no frame misplaced), the flow table's entries, the requests
//! and datagrams that failed, and the counters' identity (`rx = tx + pass + handoff + drops`,
//! exact in every sample: the worker publishes its counters whole). After the run, traffic
//! stopped, one more sample at rest: a frame the kernel still holds then (`kernel`) is a
//! frame lost.
//!
//! Failures inside a flap (from the kill until [`FLAP_GRACE`] after the restart) are the
//! flap's: requests hashed to a backend whose server just died, before the health checks
//! took it out. Every other failure counts against the gateway.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use serde::Serialize;

use super::churn::{
    bed_up, metric, utc_now, write_report, Checks, Load, Memory, Sample, Via, World, SAMPLE_EVERY,
};
use super::failover::{cpu_model, interrupted, pause};
use crate::testbed::{self, BackendInfo, VIP4};

/// `strait-lab bench soak` options.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Minutes of soak.
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// Endpoint changes a minute.
    #[arg(long, default_value_t = 1000)]
    pub rate: u32,
    /// Backends, 4 to 64 (see `bench churn --backends`).
    #[arg(long, default_value_t = 40)]
    pub backends: usize,
    /// Seconds between two health flaps.
    #[arg(long, default_value_t = 30.0)]
    pub flap_every: f64,
    /// Seconds before the memory baseline is taken.
    #[arg(long, default_value_t = 60.0)]
    pub warmup: f64,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The testbed's namespace prefix.
    #[arg(long, default_value = "ssk")]
    pub prefix: String,
}

/// How long a flapped backend's server stays down: longer than the health checks' `fall`
/// period on the testbed (500 ms x 2), so the gateway takes it out.
const FLAP_DOWN: Duration = Duration::from_secs(3);
/// After a flapped server is back, the time its failures are still the flap's: requests
/// begun while it was down and timing out (the load's 4 s timeout), plus a margin.
const FLAP_GRACE: Duration = Duration::from_secs(5);
/// Quiet time after the traffic stops, before the sample at rest: the last flows finish
/// and the worker's books (looked at every 100 ms while idle) are fresh.
const REST: Duration = Duration::from_secs(3);
/// Resident-memory growth allowed after the warm-up, in percent: the soak's target.
pub const RSS_GROWTH_MAX_PCT: f64 = 1.0;

/// Where the UMEM's frames are, summed over the workers.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Frames {
    /// User space's free list.
    pub free: i64,
    /// On the fill rings.
    pub fill: i64,
    /// On the RX rings.
    pub rx: i64,
    /// On the TX rings.
    pub tx: i64,
    /// On the completion rings.
    pub completion: i64,
    /// Taken by the kernel, on no ring.
    pub kernel: i64,
    /// The UMEMs' size.
    pub capacity: i64,
    /// Frames whose books disagree.
    pub misplaced: i64,
}

impl Frames {
    fn of(m: &str) -> Frames {
        let state = |s: &str| metric(m, "strait_umem_frames", &[&format!("state=\"{s}\"")]) as i64;
        Frames {
            free: state("free"),
            fill: state("fill"),
            rx: state("rx"),
            tx: state("tx"),
            completion: state("completion"),
            kernel: state("kernel"),
            capacity: metric(m, "strait_umem_capacity_frames", &[]) as i64,
            misplaced: metric(m, "strait_umem_misplaced_frames", &[]) as i64,
        }
    }

    /// The states add up to the size, none is negative, nothing misplaced.
    pub fn balanced(&self) -> bool {
        let parts = [
            self.free,
            self.fill,
            self.rx,
            self.tx,
            self.completion,
            self.kernel,
        ];
        self.capacity > 0
            && parts.iter().sum::<i64>() == self.capacity
            && parts.iter().all(|p| *p >= 0)
            && self.misplaced == 0
    }
}

/// The per-core counters summed: `rx = tx + pass + handoff + drops`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Identity {
    /// Frames received by the workers.
    pub rx: u64,
    /// Sent.
    pub tx: u64,
    /// Given to the kernel.
    pub pass: u64,
    /// Handed to another core.
    pub handoff: u64,
    /// Dropped, every reason.
    pub drops: u64,
}

impl Identity {
    fn of(m: &str) -> Identity {
        let c = |f: &str| metric(m, f, &[]) as u64;
        Identity {
            rx: c("strait_rx_packets_total"),
            tx: c("strait_tx_packets_total"),
            pass: c("strait_pass_packets_total"),
            handoff: c("strait_handoff_packets_total"),
            drops: c("strait_dropped_packets_total"),
        }
    }

    /// Whether it holds exactly.
    pub fn exact(&self) -> bool {
        self.rx == self.tx + self.pass + self.handoff + self.drops
    }
}

/// One sample of the soak.
#[derive(Debug, Clone, Serialize)]
pub struct SoakSample {
    /// Memory, descriptors, generation, changes, HTTP requests.
    #[serde(flatten)]
    pub base: Sample,
    /// UDP datagrams sent so far, and unanswered.
    pub udp: u64,
    /// Unanswered datagrams so far.
    pub udp_failed: u64,
    /// UMEM frames by state.
    pub frames: Frames,
    /// Flow-table entries.
    pub flow_entries: u64,
    /// The counters.
    pub identity: Identity,
    /// Whether the identity held exactly.
    pub identity_exact: bool,
}

/// The soak's results and whether the targets are met.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Minutes run.
    pub minutes: f64,
    /// Endpoint changes made, and a minute.
    pub changes: u64,
    /// Changes a minute.
    pub changes_per_minute: f64,
    /// Health flaps (a backend's server killed and started again).
    pub flaps: usize,
    /// HTTP requests, and failed.
    pub requests: u64,
    /// Failed HTTP requests.
    pub requests_failed: u64,
    /// UDP datagrams, and unanswered.
    pub udp: u64,
    /// Unanswered UDP datagrams.
    pub udp_failed: u64,
    /// Failures (HTTP and UDP) inside flaps.
    pub failed_in_flaps: u64,
    /// Failures outside flaps: the gateway's.
    pub failed_outside_flaps: u64,
    /// The first failures outside flaps (s, error).
    pub failures_outside_flaps: Vec<(f64, String)>,
    /// The gateway's drops over the run, by reason and cause, the ones not zero.
    pub gateway_drops: std::collections::BTreeMap<String, u64>,
    /// TCP segments the client namespace retransmitted.
    pub client_retransmissions: u64,
    /// Checks that the gateway followed the churn, and those that failed.
    pub checks: u64,
    /// Failed checks.
    pub checks_failed: Vec<String>,
    /// Resident memory at the end of the warm-up, KiB.
    pub rss_kib_baseline: u64,
    /// The most after the warm-up.
    pub rss_kib_max: u64,
    /// `(max - baseline) / baseline`, percent.
    pub rss_growth_pct: f64,
    /// Fewest and most descriptors after the warm-up.
    pub fds_min: usize,
    /// Most descriptors after the warm-up.
    pub fds_max: usize,
    /// How far the floor of open descriptors rose from the earlier to the later half of the
    /// samples after the warm-up (a leak; 0 or less: none).
    pub fds_floor_rise: i64,
    /// Samples whose UMEM frames did not add up (or were misplaced).
    pub frames_unbalanced_samples: usize,
    /// Frames the kernel still held at rest, plus misplaced ones: frames lost.
    pub frames_lost: i64,
    /// Samples whose identity did not hold exactly.
    pub identity_broken_samples: usize,
    /// The most flow-table entries seen.
    pub flow_entries_max: u64,
    /// Every target met: growth within [`RSS_GROWTH_MAX_PCT`], descriptors flat, no frame
    /// lost or unbalanced, the identity exact, no failure outside flaps, every check passed.
    pub targets_met: bool,
    /// Every sample, the last one at rest.
    pub samples: Vec<SoakSample>,
    /// The sample at rest.
    pub at_rest: Option<SoakSample>,
    /// The machine.
    pub cpu: String,
    /// When the run ended (UTC).
    pub date: String,
}

/// Runs the soak.
///
/// # Errors
/// Not root; the testbed or the gateway did not come up; a backend could not be started
/// again.
pub fn run(o: &Options) -> anyhow::Result<()> {
    ensure!(o.flap_every > 0.0, "--flap-every must be more than 0");
    let bed = bed_up(o.minutes, o.rate, o.backends, &o.prefix)?;
    let mut world = World::up(&bed, Via::Reload)?;
    let udp = SocketAddr::from((VIP4, testbed::NAT_UDP_PORT));
    let load = Load::start(&bed.client_namespace(), world.vip, Some(udp))?;
    let mut flapper = Flapper::new(&bed)?;
    let report = soak(&mut world, load, &mut flapper, o)?;
    drop(flapper);
    drop(world);
    drop(bed);
    write_report(&report, o.json.as_deref())?;
    eprintln!(
        "bench soak: {:.1} min, {} changes, {} flaps; HTTP {}/{} failed, UDP {}/{} failed \
         ({} in flaps, {} outside); RSS {} KiB -> max {} KiB ({:+.2} %); fds {}..{}; frames \
         lost {}, unbalanced samples {}; identity broken in {} samples; flow entries max {}; \
         targets met: {}",
        report.minutes,
        report.changes,
        report.flaps,
        report.requests_failed,
        report.requests,
        report.udp_failed,
        report.udp,
        report.failed_in_flaps,
        report.failed_outside_flaps,
        report.rss_kib_baseline,
        report.rss_kib_max,
        report.rss_growth_pct,
        report.fds_min,
        report.fds_max,
        report.frames_lost,
        report.frames_unbalanced_samples,
        report.identity_broken_samples,
        report.flow_entries_max,
        report.targets_met,
    );
    Ok(())
}

fn soak(
    world: &mut World,
    load: Load,
    flapper: &mut Flapper,
    o: &Options,
) -> anyhow::Result<Report> {
    let every = Duration::from_secs_f64(60.0 / f64::from(o.rate));
    let length = Duration::from_secs_f64(o.minutes * 60.0);
    let flap_every = Duration::from_secs_f64(o.flap_every);
    let t0 = Instant::now();
    let mut checks = Checks::new(world.generation());
    let mut samples = vec![sample(world, t0, &load)];
    let (mut next_check, mut next_sample, mut next_flap) = (
        t0 + super::churn::CHECK_EVERY,
        t0 + SAMPLE_EVERY,
        t0 + flap_every,
    );
    while t0.elapsed() < length {
        interrupted()?;
        world.churn_until(t0, every, Instant::now())?;
        let now = Instant::now();
        if now >= next_flap && flapper.down.is_none() {
            let ready = world.endpoints.ready();
            flapper.kill(&ready, &load);
            next_flap = now + flap_every;
        }
        if flapper
            .down
            .is_some_and(|(_, t)| now.duration_since(t) >= FLAP_DOWN)
        {
            flapper.restart(&load)?;
        }
        if now >= next_check {
            checks.check(world)?;
            next_check = Instant::now() + super::churn::CHECK_EVERY;
        }
        if now >= next_sample {
            samples.push(sample(world, t0, &load));
            next_sample += SAMPLE_EVERY;
        }
        thread::sleep(every.min(Duration::from_millis(5)));
    }
    let churned = world.churn_end(t0, every, length)?;
    if flapper.down.is_some() {
        flapper.restart(&load)?;
    }
    checks.check(world)?;
    let minutes = churned.as_secs_f64() / 60.0;
    samples.push(sample(world, t0, &load));
    // Failures, split by flap windows (times since the load began).
    let windows: Vec<(u64, u64)> = flapper
        .windows
        .iter()
        .map(|&(a, b)| (a, b + ms(FLAP_GRACE)))
        .collect();
    let failures = load.failure_times();
    let (inside, outside): (Vec<_>, Vec<_>) = failures
        .iter()
        .partition(|(t, _)| windows.iter().any(|&(a, b)| *t >= a && *t <= b));
    let (requests, requests_failed, _) = load.totals();
    let (udp, udp_failed) = load.udp_totals();
    // Traffic stops; one sample at rest.
    drop(load);
    pause(REST)?;
    let rest = {
        let m = world.gw.metrics();
        let (rss_kib, fds) = world.gw.footprint();
        let identity = Identity::of(&m);
        SoakSample {
            base: Sample {
                t: t0.elapsed().as_secs_f64(),
                rss_kib,
                fds,
                generation: world.generation(),
                changes: world.endpoints.changes,
                requests,
                failed: requests_failed,
            },
            udp,
            udp_failed,
            frames: Frames::of(&m),
            flow_entries: metric(&m, "strait_flow_table_entries", &[]) as u64,
            identity,
            identity_exact: identity.exact(),
        }
    };
    let base: Vec<Sample> = samples.iter().map(|s| s.base.clone()).collect();
    let mem = Memory::of(&base, o.warmup);
    let all = samples.iter().chain(std::iter::once(&rest));
    let frames_unbalanced_samples = all.clone().filter(|s| !s.frames.balanced()).count();
    let identity_broken_samples = all.clone().filter(|s| !s.identity_exact).count();
    let flow_entries_max = all.clone().map(|s| s.flow_entries).max().unwrap_or(0);
    let frames_lost = rest.frames.kernel + rest.frames.misplaced;
    let failed_outside_flaps = outside.len() as u64;
    let targets_met = mem.growth_pct <= RSS_GROWTH_MAX_PCT
        && mem.fds_floor_rise <= 0
        && frames_lost == 0
        && frames_unbalanced_samples == 0
        && identity_broken_samples == 0
        && failed_outside_flaps == 0
        && checks.failed.is_empty();
    Ok(Report {
        minutes,
        changes: world.endpoints.changes,
        changes_per_minute: world.endpoints.changes as f64 / minutes,
        flaps: flapper.windows.len(),
        requests,
        requests_failed,
        udp,
        udp_failed,
        failed_in_flaps: inside.len() as u64,
        failed_outside_flaps,
        failures_outside_flaps: outside
            .iter()
            .take(20)
            .map(|(t, e)| (*t as f64 / 1000.0, e.clone()))
            .collect(),
        gateway_drops: super::churn::drops(&world.gw.metrics()),
        client_retransmissions: super::churn::retransmissions(&world.client),
        checks: checks.count,
        checks_failed: checks.failed,
        rss_kib_baseline: mem.baseline,
        rss_kib_max: mem.max,
        rss_growth_pct: mem.growth_pct,
        fds_min: mem.fds_min,
        fds_max: mem.fds_max,
        fds_floor_rise: mem.fds_floor_rise,
        frames_unbalanced_samples,
        frames_lost,
        identity_broken_samples,
        flow_entries_max,
        targets_met,
        samples,
        at_rest: Some(rest),
        cpu: cpu_model(),
        date: utc_now(),
    })
}

fn sample(world: &World, t0: Instant, load: &Load) -> SoakSample {
    let m = world.gw.metrics();
    let base = world.sample(t0, world.endpoints.changes, load);
    let (udp, udp_failed) = load.udp_totals();
    let identity = Identity::of(&m);
    SoakSample {
        base,
        udp,
        udp_failed,
        frames: Frames::of(&m),
        flow_entries: metric(&m, "strait_flow_table_entries", &[]) as u64,
        identity,
        identity_exact: identity.exact(),
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Kills and restarts backend servers; the servers it started are killed on drop.
struct Flapper {
    backends: Vec<BackendInfo>,
    /// Each backend's server now.
    pids: Vec<u32>,
    /// Servers this bench started (`testbed down` ends them too: their pids are recorded).
    started: Vec<Child>,
    prefix: String,
    exe: PathBuf,
    /// The backend down now, and since when.
    down: Option<(usize, Instant)>,
    /// (kill, restart) in ms since the load began.
    windows: Vec<(u64, u64)>,
    flaps: usize,
}

impl Flapper {
    fn new(bed: &testbed::Testbed) -> anyhow::Result<Flapper> {
        Ok(Flapper {
            backends: bed.backends().to_vec(),
            pids: bed.backends().iter().map(|b| b.pid).collect(),
            started: Vec::new(),
            prefix: bed.prefix().to_owned(),
            exe: std::env::current_exe().context("finding the strait-lab binary")?,
            down: None,
            windows: Vec::new(),
            flaps: 0,
        })
    }

    /// Kills the server of one of the `ready` backends (in turn).
    fn kill(&mut self, ready: &[usize], load: &Load) {
        let Some(&i) = ready.get(self.flaps % ready.len().max(1)) else {
            return;
        };
        self.flaps += 1;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pids[i]).unwrap_or(0));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        if let Some(c) = self.started.iter_mut().find(|c| c.id() == self.pids[i]) {
            let _ = c.wait();
        }
        let t = ms(load.started().elapsed());
        self.windows.push((t, t));
        self.down = Some((i, Instant::now()));
    }

    /// Starts the killed server again.
    fn restart(&mut self, load: &Load) -> anyhow::Result<()> {
        let Some((i, _)) = self.down.take() else {
            return Ok(());
        };
        let b = &self.backends[i];
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &b.namespace])
            .arg(&self.exe)
            .args(["testbed", "serve", "--name", &b.name]);
        for a in &b.tcp {
            cmd.args(["--tcp", &a.to_string()]);
        }
        for a in &b.udp {
            cmd.args(["--udp", &a.to_string()]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {}'s server again", b.name))?;
        testbed::record_pid(&self.prefix, child.id(), &b.name)?;
        self.pids[i] = child.id();
        self.started.push(child);
        if let Some(w) = self.windows.last_mut() {
            w.1 = ms(load.started().elapsed());
        }
        Ok(())
    }
}

impl Drop for Flapper {
    fn drop(&mut self) {
        for c in &mut self.started {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_balance_only_when_the_states_add_up() {
        let mut f = Frames {
            free: 2040,
            fill: 2048,
            rx: 0,
            tx: 3,
            completion: 5,
            kernel: 0,
            capacity: 4096,
            misplaced: 0,
        };
        assert!(f.balanced());
        f.kernel = 1;
        assert!(!f.balanced(), "one frame too many");
        f.kernel = 0;
        f.misplaced = 1;
        assert!(!f.balanced());
        assert!(!Frames::default().balanced(), "no UMEM is not balanced");
    }

    #[test]
    fn identity_reads_the_families() {
        let m = "strait_rx_packets_total{core=\"a\"} 10\nstrait_tx_packets_total{core=\"a\"} 6\n\
                 strait_pass_packets_total{core=\"a\"} 1\nstrait_handoff_packets_total{core=\"a\"} 0\n\
                 strait_dropped_packets_total{core=\"a\",reason=\"x\"} 2\n\
                 strait_dropped_packets_total{core=\"a\",reason=\"y\"} 1\n";
        let i = Identity::of(m);
        assert_eq!((i.rx, i.tx, i.pass, i.drops), (10, 6, 1, 3));
        assert!(i.exact());
    }
}
