//! `strait-lab bench line-rate`: delivered packets per second through one forwarding core, for
//! Strait, kube-proxy's two kernel modes and a bare AF_XDP forwarder, on a three-namespace
//! veth testbed (see [`topo`]).
//!
//! ```text
//! for each (system, scale):                          a fresh topology (P = lr<pid>)
//!   strait-dsr-l2 | strait-nat   P-fwd: strait run --config <two-arm toml>, /healthz 200
//!   iptables | nftables          P-fwd: KernelGateway::up (kube-proxy's rules, conntrack)
//!   limit                        P-fwd: strait-lab l2fwd --rx fwd0 --tx fwd1 (MAC swap only)
//!   strait-dpdk-dsr-l2 | -nat    P-fwd: strait run, DPDK ports (--dpdk-vdev: net_af_xdp or
//!                                       net_af_packet) on fwd0/fwd1, TAPs tap-fwd0/tap-fwd1
//!                                       for its kernel                          (`dpdk` build)
//!   limit-dpdk                   P-fwd: strait-lab l2fwd --driver dpdk --vdev (the same PMD)
//!   for traffic in [established (10,000 flows), new-flows (every packet a new 5-tuple)]:
//!     P-sink: strait-lab sink --iface sink0 --json --reflect-port 900       (XDP counter)
//!     P-gen:  strait-lab gen --iface gen0 --rate max --duration D --latency-port 900 --json
//!     delivered = sink received / gen seconds; loss = 1 - received / sent;
//!     p99 = the generator's probes, reflected by the sink back through the forwarder
//!     cpu_ns_per_packet = what the forwarding CPU spent from the generator's start to the
//!       drain ([`cpu`]: AF_XDP busy turns + XDP programs, DPDK busy turns, or the kernel's
//!       softirq + irq on the forwarder CPU) / received; then over iptables' and nftables'
//!       at the same point; pct_of_limit over the limit of the same port driver
//!     xdp_ns_per_packet = the forwarder's XDP program alone (Strait: its steering program):
//!       the kernel's BPF statistics, run_time_ns / run_cnt over the point
//! ```
//!
//! `limit` is started for each point, so its summary's busy time is that point's; Strait's
//! comes from `/metrics` before and after. The XDP programs' cost needs the kernel's BPF
//! statistics, on for the run (`kernel.bpf_stats_enabled`, restored after). The systems are
//! [`System::ALL`]; a new one needs its arm in `run_group` and in `set_cpu`'s method, and
//! `chart::BARS` draws it. The DPDK systems are in a build with the `dpdk` feature only (the
//! report names them as not measured otherwise); on this testbed their ports are
//! `net_af_xdp` vdevs on the veths by default, or `net_af_packet` (`--dpdk-vdev`; see
//! `topo` for what the kernel still does for them). A DPDK forwarder's TX kick is its
//! turn's burst out (the PMD's `sendto` on these vdevs), timed apart as on AF_XDP.
//!
//! # What is measured, and where it runs
//!
//! Every frame is a 64-byte UDP packet from 192.0.2.16-250 to one of up to 16 services
//! spread evenly over the service list (for the iptables mode the rules walked per new
//! flow then average half of `KUBE-SERVICES`). The forwarder gets CPU
//! [`FORWARDER_CORE`], the generator CPU [`GENERATOR_CORE`]: Strait through
//! `gateway.interfaces.cores`, `l2fwd` with `--core`, and the kernel through RPS on `fwd0`
//! (the kernel forwards in the receiving softirq, which on a veth is the sender's CPU
//! unless RPS moves it). On veths the XDP program of an AF_XDP forwarder (and its copy into
//! the socket's ring) runs on the sending CPU, the generator's; the AF_XDP forwarders'
//! user-space loops and everything after them run on the forwarder core. The sink's XDP
//! counter runs on the forwarder core for every system (the veth transmit of `fwd1`
//! schedules it there).
//!
//! # Loss, and why the kernel peers show none
//!
//! The generator sends through AF_XDP in copy mode, where a frame's UMEM slot comes back
//! (its TX completion) only when the kernel frees the skb made from it. Towards an AF_XDP
//! forwarder that happens at once (the XDP program on `fwd0` redirects and the frame is
//! copied into the forwarder's ring), so the generator runs open loop and whatever the
//! forwarder cannot take is lost. Towards the kernel the skb waits in `fwd0`'s backlog
//! until the forwarder core has routed it, so the generator's slots fill and it slows to
//! the kernel's rate: loss reads 0 and `offered` equals `delivered`. In both cases the
//! delivered rate is the forwarder's, as long as the generator can offer more; where
//! `offered` is no higher than `delivered` for an AF_XDP system, the generator was the
//! bottleneck, not the forwarder.
//!
//! Each (system, scale) gets its own namespaces, so conntrack starts empty and one system
//! leaves nothing behind for the next. Established traffic runs first, so the new-flow
//! run's conntrack entries (one per packet, up to `nf_conntrack_max`) do not slow it.
//! kube-proxy's rules are loaded once per scale and serve both traffic types; an nftables
//! load at 10,000 services takes about a minute by itself with four endpoints per service
//! (quadratic in the kernel, see `bench::rules`). A full run takes about 7 minutes on a
//! 2-vCPU VM, `--quick` about 90 s.
//!
//! IPVS (kube-proxy's third mode) needs the `ip_vs` module, which this kernel does not
//! have; the report says so rather than leaving it out silently.

mod chart;
pub mod cpu;
mod topo;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use strait_config::model::{Mode, Protocol};

use crate::peers::{self, KernelGateway, PeerKind, SvcSpec};
use crate::vdev::Vdev;
use topo::{Proc, Topology};

/// Services per scale of a full run: 10, 1,000 and 10,000.
pub const FULL_SCALES: [usize; 3] = [10, 1000, 10_000];
/// Scales of `--quick`: 10,000 would cost a minute of nftables load alone.
pub const QUICK_SCALES: [usize; 2] = [10, 1000];
/// Seconds of traffic per point in a full run: long enough that start-up (the first
/// packets of 10,000 established flows, ramp-up of the generator) is under 1% of it.
pub const FULL_SECONDS: f64 = 10.0;
/// Seconds per point with `--quick`: 18 points of 3 s plus set-up fit in three minutes.
pub const QUICK_SECONDS: f64 = 3.0;
/// Endpoints per service. kube-proxy's per-packet cost grows with services (iptables walks
/// `KUBE-SERVICES`), not with the endpoints of the one service matched; four keep the
/// 10,000-service rulesets and Strait configuration (40,000 backends) quick to load.
pub const ENDPOINTS_PER_SERVICE: usize = 4;
/// Flows of established traffic: 10,000.
pub const ESTABLISHED_FLOWS: usize = 10_000;
/// Services the generator sends to: spread evenly over the list.
pub const TARGETS: usize = 16;
/// Ethernet frame length without FCS.
pub const FRAME_BYTES: usize = 64;
/// The CPU of the forwarder (and of everything the kernel does for it).
pub const FORWARDER_CORE: usize = 1;
/// The CPU of the generator.
pub const GENERATOR_CORE: usize = 0;
/// UDP source port of the latency probes: below the generator's source-port range
/// (1024-65535), so no data packet is taken for a probe.
pub const LATENCY_PORT: u16 = 900;
/// Most services a run accepts: VIPs 203.0.113.1-50 with 1,000 ports each.
pub const MAX_SERVICES: usize = 50_000;
/// First service port on each VIP.
const FIRST_SERVICE_PORT: u16 = 1000;
/// Services per VIP (ports 1000 to 1999). Few VIPs rather than one per service because
/// `strait run` announces each new IPv4 VIP with `arping -U -c 2 -w 2` (2 s, 64 at a time)
/// before `/healthz` turns 200, and the kernel peers need an address per VIP too. The rules
/// walked per packet do not depend on it: kube-proxy's iptables rules test address and port
/// in every `KUBE-SERVICES` rule, nftables and Strait look the pair up in one map.
const SERVICES_PER_VIP: usize = 1000;
/// First endpoint port of the nat and kernel systems (dsr-l2 endpoints use the service
/// port, as DSR requires).
const FIRST_ENDPOINT_PORT: u16 = 20_000;
/// Maglev table size of every service in Strait's configuration: a prime far above four
/// backends, small enough that 10,000 services take 40 MB.
const MAGLEV_SIZE: u32 = 1021;
/// Strait's admin API port inside the forwarder namespace.
const ADMIN_PORT: u16 = 9900;
/// How long `strait run` may take to answer `/healthz` with 200: 10,000 services parse,
/// build and reach the XDP maps in a few seconds even in a debug build.
const STRAIT_READY: Duration = Duration::from_secs(120);
/// How long an XDP program may take to appear after its process starts.
const XDP_READY: Duration = Duration::from_secs(10);
/// Time after the generator's last packet before the sink is stopped: frames still in
/// the forwarder's rings arrive within microseconds; 300 ms covers a busy machine.
const DRAIN: Duration = Duration::from_millis(300);
/// How much longer than its `--duration` the generator may take to exit (start-up, UMEM
/// set-up, the summary).
const GEN_GRACE: Duration = Duration::from_secs(30);

/// A system under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum System {
    /// Strait, services in `dsr-l2` mode.
    StraitDsrL2,
    /// Strait, services in `nat` mode.
    StraitNat,
    /// Kernel forwarding with kube-proxy's iptables-mode rules.
    Iptables,
    /// Kernel forwarding with kube-proxy's nftables-mode rules.
    Nftables,
    /// `strait-lab l2fwd`: AF_XDP receive, MAC rewrite, AF_XDP send; the ceiling of the path.
    Limit,
    /// `strait-lab l2fwd --driver dpdk`: the gateway's DPDK port driver on the run's vdev
    /// (`--dpdk-vdev`), MAC rewrite, no pipeline; the ceiling of the DPDK rows (a `dpdk`
    /// build).
    LimitDpdk,
    /// Strait on DPDK ports, services in `dsr-l2` mode (a `dpdk` build).
    StraitDpdkDsrL2,
    /// Strait on DPDK ports, services in `nat` mode (a `dpdk` build).
    StraitDpdkNat,
}

impl System {
    /// Every system this build measures, in the order they run and are reported: the DPDK
    /// ones ([`System::DPDK`]) only in a build with the `dpdk` feature.
    #[cfg(feature = "dpdk")]
    pub const ALL: &'static [System] = &[
        System::Limit,
        System::LimitDpdk,
        System::StraitDsrL2,
        System::StraitNat,
        System::StraitDpdkDsrL2,
        System::StraitDpdkNat,
        System::Iptables,
        System::Nftables,
    ];
    /// Every system this build measures, in the order they run and are reported: the DPDK
    /// ones ([`System::DPDK`]) only in a build with the `dpdk` feature.
    #[cfg(not(feature = "dpdk"))]
    pub const ALL: &'static [System] = &[
        System::Limit,
        System::StraitDsrL2,
        System::StraitNat,
        System::Iptables,
        System::Nftables,
    ];

    /// The systems on DPDK ports.
    pub const DPDK: [System; 3] = [
        System::LimitDpdk,
        System::StraitDpdkDsrL2,
        System::StraitDpdkNat,
    ];

    /// The report's spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            System::StraitDsrL2 => "strait-dsr-l2",
            System::StraitNat => "strait-nat",
            System::Iptables => "iptables",
            System::Nftables => "nftables",
            System::Limit => "limit",
            System::LimitDpdk => "limit-dpdk",
            System::StraitDpdkDsrL2 => "strait-dpdk-dsr-l2",
            System::StraitDpdkNat => "strait-dpdk-nat",
        }
    }

    /// Whether the system has services (all but the limits).
    pub const fn has_services(self) -> bool {
        !self.is_limit()
    }

    /// `limit` or `limit-dpdk`.
    pub const fn is_limit(self) -> bool {
        matches!(self, System::Limit | System::LimitDpdk)
    }

    /// Whether the system forwards through DPDK ports.
    pub const fn is_dpdk(self) -> bool {
        matches!(
            self,
            System::LimitDpdk | System::StraitDpdkDsrL2 | System::StraitDpdkNat
        )
    }

    /// The gateway's mode, for the Strait systems.
    pub const fn strait_mode(self) -> Option<Mode> {
        match self {
            System::StraitDsrL2 | System::StraitDpdkDsrL2 => Some(Mode::DsrL2),
            System::StraitNat | System::StraitDpdkNat => Some(Mode::Nat),
            _ => None,
        }
    }

    /// The limit a system is measured against (`pct_of_limit`): the forwarder without the
    /// pipeline on the same port driver.
    pub const fn own_limit(self) -> System {
        if self.is_dpdk() {
            System::LimitDpdk
        } else {
            System::Limit
        }
    }
}

/// Why this build leaves the DPDK rows out (a build without the `dpdk` feature).
pub const NO_DPDK: &str = "not in this build: strait-lab was built without the `dpdk` feature \
     (cargo build --release -p strait-lab -p strait-control --features \
     strait-lab/dpdk,strait-control/dpdk)";

/// Traffic of one point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Traffic {
    /// Every packet a new 5-tuple (source address x source port walked).
    NewFlows,
    /// [`ESTABLISHED_FLOWS`] flows cycled.
    Established,
}

impl Traffic {
    /// Both, in run order (see the module docs for why established first).
    pub const ALL: [Traffic; 2] = [Traffic::Established, Traffic::NewFlows];

    /// The report's spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Traffic::NewFlows => "new-flows",
            Traffic::Established => "established",
        }
    }
}

/// What `strait-lab bench line-rate` was asked for (its command-line flags).
#[derive(Debug, Clone, Default, PartialEq, clap::Args)]
pub struct Options {
    /// Fewer scales (10 and 1,000 services) and 3 s per point: under three minutes.
    #[arg(long)]
    pub quick: bool,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also draw a PNG chart to this file.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Service counts to run instead (comma-separated; default by `--quick`).
    #[arg(long, value_delimiter = ',', value_name = "N,...")]
    pub services: Vec<usize>,
    /// Seconds of traffic per point instead (default by `--quick`).
    #[arg(long, value_name = "SECS")]
    pub seconds: Option<f64>,
    /// Only these systems (comma-separated; default all).
    #[arg(long, value_delimiter = ',', value_name = "SYSTEM,...")]
    pub systems: Vec<System>,
    /// Bring each system up and check it (topology, rules, gateway healthy), then tear
    /// it down; no traffic.
    #[arg(long, hide = true)]
    pub setup_only: bool,
    /// Namespace prefix (default lr<pid>).
    #[arg(long, hide = true)]
    pub prefix: Option<String>,
    /// The PMD of the DPDK rows' ports (`limit-dpdk` and Strait's alike): `af-xdp` takes
    /// every frame from the kernel as a NIC bound to DPDK does; `af-packet` leaves the
    /// kernel a copy and sends through a packet socket.
    #[arg(long, value_enum, value_name = "VDEV", default_value_t = Vdev::AfXdp)]
    pub dpdk_vdev: Vdev,
}

/// One measured point: the six headline fields first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// The system.
    pub system: System,
    /// Services configured (0 for `limit`, which has none).
    pub services: usize,
    /// The traffic.
    pub traffic: Traffic,
    /// Packets the sink received per second of sending, in millions.
    pub delivered_mpps: f64,
    /// `100 * (1 - received / sent)`, at least 0.
    pub loss_pct: f64,
    /// 99th percentile of probe round trips (generator -> forwarder -> sink reflector ->
    /// back), microseconds; null when no probe came back.
    pub p99_us: Option<f64>,
    /// Median probe round trip.
    pub p50_us: Option<f64>,
    /// 99.9th percentile probe round trip.
    pub p999_us: Option<f64>,
    /// What the generator offered, millions of packets per second.
    pub offered_mpps: f64,
    /// Frames the generator sent.
    pub sent: u64,
    /// Frames the sink counted, less the latency probes it reflected.
    pub received: u64,
    /// The generator's sending time.
    pub seconds: f64,
    /// Probes sent and received back.
    pub probes_sent: u64,
    /// Probes received back.
    pub probes_received: u64,
    /// `delivered_mpps` as a percentage of its own limit's for the same traffic ([`System::own_limit`]:
    /// `limit` for the AF_XDP systems, `limit-dpdk` for the DPDK ones).
    pub pct_of_limit: Option<f64>,
    /// `delivered_mpps` over `iptables`' at the same scale and traffic.
    pub ratio_to_iptables: Option<f64>,
    /// The forwarding CPU's cost per delivered packet, nanoseconds ([`cpu`]): an AF_XDP
    /// forwarder's busy time plus its XDP programs' run time, or, for the kernel peers, the
    /// forwarder CPU's softirq and irq time; null where not measured.
    #[serde(default)]
    pub cpu_ns_per_packet: Option<f64>,
    /// `cpu_ns_per_packet` over `iptables`' at the same scale and traffic (under 1: cheaper).
    #[serde(default)]
    pub cpu_ratio_to_iptables: Option<f64>,
    /// `cpu_ns_per_packet` over `nftables`' at the same scale and traffic.
    #[serde(default)]
    pub cpu_ratio_to_nftables: Option<f64>,
    /// An AF_XDP forwarder's own part of `cpu_ns_per_packet`: without its TX kicks, inside
    /// which copy-mode AF_XDP has the kernel copy every frame into an skb and transmit it
    /// (work a zero-copy driver leaves to the NIC): the cycles around the pipeline and
    /// the ring work. Null for the kernel peers, whose figure has no such part.
    #[serde(default)]
    pub own_cpu_ns_per_packet: Option<f64>,
    /// `own_cpu_ns_per_packet` over `iptables`' `cpu_ns_per_packet` at the same point.
    #[serde(default)]
    pub own_cpu_ratio_to_iptables: Option<f64>,
    /// `own_cpu_ns_per_packet` over `nftables`' `cpu_ns_per_packet` at the same point.
    #[serde(default)]
    pub own_cpu_ratio_to_nftables: Option<f64>,
    /// The forwarder's XDP program's own run time per packet it ran on, nanoseconds: for
    /// Strait the gateway's steering program (on both its interfaces), for `limit` l2fwd's
    /// redirect program, for DPDK on `net_af_xdp` the PMD's; the kernel's BPF statistics'
    /// `run_time_ns / run_cnt` over the point. Apart from `cpu_ns_per_packet`, of which its
    /// share per delivered packet is `cpu.xdp_ns_per_packet` (the two differ when frames are
    /// lost after the program ran). Null for the kernel peers, which run none.
    #[serde(default)]
    pub xdp_ns_per_packet: Option<f64>,
    /// Where `cpu_ns_per_packet` comes from, and what else the forwarder CPU did, per
    /// delivered packet.
    #[serde(default)]
    pub cpu: Option<CpuCost>,
}

/// The parts of a point's CPU cost, nanoseconds per delivered packet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuCost {
    /// `worker-busy+xdp` (Strait and `limit` on AF_XDP), `worker-busy` (on DPDK) or
    /// `softirq+irq` (the kernel peers).
    pub method: String,
    /// The AF_XDP forwarder's busy time (Strait's `strait_worker_busy_seconds_total`,
    /// l2fwd's `busy_seconds`) times `on_cpu_share`: its own CPU in those turns.
    pub worker_ns_per_packet: Option<f64>,
    /// The busy time as the forwarder's clock measured it (wall time).
    pub worker_wall_ns_per_packet: Option<f64>,
    /// Of `worker_ns_per_packet`, the TX kicks (`strait_worker_kick_seconds_total`,
    /// l2fwd's `kick_seconds`), scaled the same way.
    #[serde(default)]
    pub kick_ns_per_packet: Option<f64>,
    /// The share of the point the forwarding thread ran while it was runnable (its
    /// `schedstat`): below 1 when other processes took its core.
    pub on_cpu_share: Option<f64>,
    /// The forwarder's XDP programs (steering or redirect), from the kernel's BPF statistics;
    /// on a veth they run on the generator's CPU.
    pub xdp_ns_per_packet: Option<f64>,
    /// The same per program run (a run per frame received, delivered or not).
    pub xdp_ns_per_run: Option<f64>,
    /// The forwarder CPU's softirq time (`/proc/stat`): the kernel peers' forwarding, and
    /// for every system the veth delivery to the sink.
    pub softirq_ns_per_packet: f64,
    /// The forwarder CPU's hard-interrupt time.
    pub irq_ns_per_packet: f64,
    /// The forwarder CPU's system time: other tasks' system calls there, not counted in
    /// `cpu_ns_per_packet` (see [`cpu`]).
    pub system_ns_per_packet: f64,
    /// The sink's XDP counter, which runs on the forwarder CPU for every system.
    pub sink_xdp_ns_per_packet: Option<f64>,
}

/// A system the report names without numbers, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NotMeasured {
    /// The system.
    pub system: String,
    /// Why.
    pub reason: String,
}

/// Time to load kube-proxy's rules for one scale.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleLoad {
    /// `iptables` or `nftables`.
    pub system: System,
    /// Services.
    pub services: usize,
    /// Wall time of `iptables-restore` / `nft -f` (with `ip netns exec`), seconds.
    pub seconds: f64,
}

/// The JSON report: `machine`, `date` and `results`, and how they were made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// CPU model, CPU count, kernel and distribution.
    pub machine: String,
    /// UTC, RFC 3339.
    pub date: String,
    /// The command line that made it.
    pub command: String,
    /// Seconds of traffic per point.
    pub seconds_per_point: f64,
    /// The PMD of the DPDK rows' ports.
    #[serde(default)]
    pub dpdk_vdev: Vdev,
    /// Frame length without FCS.
    pub frame_bytes: usize,
    /// Endpoints per service.
    pub endpoints_per_service: usize,
    /// Flows of established traffic.
    pub established_flows: usize,
    /// The forwarder's CPU.
    pub forwarder_core: usize,
    /// The generator's CPU.
    pub generator_core: usize,
    /// Systems not measured, and why (IPVS).
    pub not_measured: Vec<NotMeasured>,
    /// Rule load times of the kernel systems.
    pub rule_loads: Vec<RuleLoad>,
    /// Set when the run stopped early: what failed (the results so far are kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    /// The points, in run order.
    pub results: Vec<Point>,
}

/// Runs the benchmark as `opts` says: prints the table, writes JSON and PNG.
///
/// # Errors
///
/// Not root, a missing tool, a bad option, or a step that failed (the JSON, when asked
/// for, is still written with what was measured and `incomplete` set).
pub fn run(opts: &Options) -> Result<()> {
    let plan = Plan::from_options(opts)?;
    prerequisites(&plan)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing the SIGINT/SIGTERM handler")?;
    }
    let _ = STOP.set(stop);
    // On for the run (the XDP programs' cost per packet), back as it was when this drops.
    let _bpf_stats = if opts.setup_only {
        None
    } else {
        Some(cpu::BpfStats::enable()?)
    };
    let exe = std::env::current_exe().context("finding the strait-lab binary")?;
    let prefix = opts
        .prefix
        .clone()
        .unwrap_or_else(|| format!("lr{}", std::process::id()));
    if !peers::valid_name(&format!("{prefix}-sink")) || prefix.len() > 40 {
        bail!("--prefix {prefix:?}: up to 40 characters of a-z, 0-9 and '-'");
    }
    let mut report = Report {
        machine: machine(),
        date: utc_now(),
        command: command_line(),
        seconds_per_point: plan.seconds,
        dpdk_vdev: plan.vdev,
        frame_bytes: FRAME_BYTES,
        endpoints_per_service: ENDPOINTS_PER_SERVICE,
        established_flows: ESTABLISHED_FLOWS,
        forwarder_core: FORWARDER_CORE,
        generator_core: GENERATOR_CORE,
        not_measured: not_measured(),
        rule_loads: Vec::new(),
        incomplete: None,
        results: Vec::new(),
    };
    // The processes' logs: removed after a run that went through, kept after a failure.
    let logs = std::env::temp_dir().join(format!("strait-line-rate-{prefix}"));
    let progress = Progress::new(&plan, opts.setup_only);
    let outcome = plan.groups.iter().try_for_each(|&(system, services)| {
        let dir = logs.join(format!("{}-{services}", system.as_str()));
        run_group(
            &exe,
            &prefix,
            (system, services),
            &dir,
            &plan,
            opts.setup_only,
            &progress,
            &mut report,
        )
        .with_context(|| format!("{} at {services} services", system.as_str()))
    });
    progress.finish();
    let outcome = match outcome {
        Ok(()) => {
            let _ = std::fs::remove_dir_all(&logs);
            Ok(())
        }
        Err(e) => {
            let e = anyhow::anyhow!("{e:#}\n(the logs are kept in {})", logs.display());
            report.incomplete = Some(format!("{e}"));
            Err(e)
        }
    };
    if opts.setup_only {
        return outcome;
    }
    derive(&mut report.results);
    print!("{}", table(&report));
    if let Some(path) = &opts.json {
        let text = serde_json::to_string_pretty(&report)? + "\n";
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &opts.plot {
        if outcome.is_ok() {
            chart::render(&report, path)
                .with_context(|| format!("drawing the chart {}", path.display()))?;
        }
    }
    outcome
}

/// Set by SIGINT / SIGTERM: the run stops at the next check, and the namespaces, rules and
/// processes are removed on the way out (the default action would kill the bench before
/// its guards run and leave them behind).
static STOP: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Fails once SIGINT or SIGTERM has arrived.
pub(crate) fn interrupted() -> Result<()> {
    if STOP.get().is_some_and(|s| s.load(Ordering::Relaxed)) {
        bail!("interrupted");
    }
    Ok(())
}

/// The (system, services) groups and per-point settings of a run.
#[derive(Debug, Clone, PartialEq)]
struct Plan {
    groups: Vec<(System, usize)>,
    seconds: f64,
    vdev: Vdev,
}

impl Plan {
    fn from_options(opts: &Options) -> Result<Self> {
        let scales: Vec<usize> = if !opts.services.is_empty() {
            opts.services.clone()
        } else if opts.quick {
            QUICK_SCALES.to_vec()
        } else {
            FULL_SCALES.to_vec()
        };
        if let Some(bad) = scales.iter().find(|&&n| n == 0 || n > MAX_SERVICES) {
            bail!("--services {bad}: between 1 and {MAX_SERVICES}");
        }
        let seconds = opts.seconds.unwrap_or(if opts.quick {
            QUICK_SECONDS
        } else {
            FULL_SECONDS
        });
        if !(0.5..=3600.0).contains(&seconds) {
            bail!("--seconds {seconds}: between 0.5 and 3600");
        }
        if let Some(s) = opts.systems.iter().find(|s| !System::ALL.contains(s)) {
            bail!("--systems {}: {NO_DPDK}", s.as_str());
        }
        let systems: Vec<System> = System::ALL
            .iter()
            .copied()
            .filter(|s| opts.systems.is_empty() || opts.systems.contains(s))
            .collect();
        let mut groups = Vec::new();
        for &l in systems.iter().filter(|s| s.is_limit()) {
            groups.push((l, 0));
        }
        for &n in &scales {
            for &s in systems.iter().filter(|s| s.has_services()) {
                groups.push((s, n));
            }
        }
        Ok(Self {
            groups,
            seconds,
            vdev: opts.dpdk_vdev,
        })
    }

    fn points(&self) -> usize {
        self.groups.len() * Traffic::ALL.len()
    }
}

/// Root and the tools every system of `plan` needs.
fn prerequisites(plan: &Plan) -> Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!(
            "strait-lab bench line-rate needs root: it creates network namespaces, attaches XDP \
             programs and loads iptables and nftables rules"
        );
    }
    let mut tools = vec![
        ("ip", "-V", "iproute2"),
        ("ethtool", "--version", "ethtool"),
        ("sysctl", "--version", "procps"),
    ];
    let has = |s: System| plan.groups.iter().any(|g| g.0 == s);
    let any = |f: fn(System) -> bool| plan.groups.iter().any(|g| f(g.0));
    if any(|s| s.strait_mode().is_some()) {
        tools.push(("curl", "--version", "curl"));
    }
    if has(System::Iptables) {
        tools.push(("iptables-restore", "--version", "iptables"));
    }
    // The DPDK systems' wires drop what the kernel would see with an nftables ingress hook.
    if has(System::Nftables) || any(System::is_dpdk) {
        tools.push(("nft", "--version", "nftables"));
    }
    for (tool, probe, package) in tools {
        let ok = Command::new(tool)
            .arg(probe)
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            bail!("`{tool}` is missing (apt-get install -y {package})");
        }
    }
    let cpus = thread::available_parallelism().map_or(1, usize::from);
    // The generator's CPU is 0; the forwarder's is the higher one.
    if cpus <= FORWARDER_CORE {
        bail!(
            "{cpus} CPU(s): the forwarder (CPU {FORWARDER_CORE}) and the generator \
             (CPU {GENERATOR_CORE}) need one each"
        );
    }
    Ok(())
}

/// The services of one scale, on the bench's addresses: service `i` is
/// `203.0.113.(1 + i / 1000):(1000 + i % 1000)`, UDP; its endpoint `j` is number
/// `g = i * E + j` overall, at `198.51.100.(10 + g % 240)`, port `20000 + g / 240` (so no
/// two endpoints share address and port) or, for `dsr`, the service port.
pub fn services(n: usize, dsr: bool) -> Vec<SvcSpec> {
    (0..n)
        .map(|i| {
            let port = FIRST_SERVICE_PORT + u16::try_from(i % SERVICES_PER_VIP).unwrap_or(u16::MAX);
            SvcSpec {
                namespace: "bench".to_owned(),
                name: format!("lr-{i}"),
                port_name: String::new(),
                protocol: Protocol::Udp,
                vip: Ipv4Addr::new(
                    203,
                    0,
                    113,
                    1 + u8::try_from(i / SERVICES_PER_VIP).unwrap_or(0),
                ),
                port,
                endpoints: (0..ENDPOINTS_PER_SERVICE)
                    .map(|j| {
                        let g = i * ENDPOINTS_PER_SERVICE + j;
                        let ep_port = if dsr {
                            port
                        } else {
                            FIRST_ENDPOINT_PORT
                                + u16::try_from(g / topo::ENDPOINT_ADDRS).unwrap_or(u16::MAX)
                        };
                        SocketAddrV4::new(topo::endpoint_addr(g), ep_port)
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The frontends the generator sends to: up to [`TARGETS`], spread evenly from the first
/// service to the last.
pub fn targets(specs: &[SvcSpec]) -> Vec<SocketAddrV4> {
    let n = specs.len();
    let m = n.min(TARGETS);
    let mut idx: Vec<usize> = (0..m)
        .map(|k| if m == 1 { 0 } else { k * (n - 1) / (m - 1) })
        .collect();
    idx.dedup();
    idx.into_iter()
        .map(|i| SocketAddrV4::new(specs[i].vip, specs[i].port))
        .collect()
}

/// Strait's two-arm configuration for `specs`: `fwd0` faces the clients, `fwd1` the
/// backends, one queue served by one worker on `core`; every backend at the sink's MAC.
pub fn strait_config(specs: &[SvcSpec], mode: Mode, core: usize) -> String {
    config_on(specs, mode, core, None)
}

/// [`strait_config`] on DPDK ports: `vdev` ports on the wires `fwd0` and `fwd1`, whose kernel
/// sides are the topology's TAPs (the interface names), EAL without hugepages.
pub fn strait_dpdk_config(specs: &[SvcSpec], mode: Mode, core: usize, vdev: Vdev) -> String {
    config_on(specs, mode, core, Some(vdev))
}

/// EAL memory of the DPDK gateway, MiB: one worker's mempool and two ports' descriptors.
const DPDK_MEMORY_MB: u32 = 512;

fn config_on(specs: &[SvcSpec], mode: Mode, core: usize, dpdk: Option<Vdev>) -> String {
    let (name_in, name_out) = if dpdk.is_some() {
        (topo::TAP_IN, topo::TAP_OUT)
    } else {
        (topo::FWD_IN, topo::FWD_OUT)
    };
    let port = |i: usize, wire: &str| {
        if let Some(vdev) = dpdk {
            format!("driver = \"dpdk\"\ndevice = \"{}\"\n", vdev.device(i, wire))
        } else {
            String::new()
        }
    };
    let eal = if dpdk.is_some() {
        format!("\n[gateway.dpdk]\nno_huge = true\nmemory_mb = {DPDK_MEMORY_MB}\n")
    } else {
        String::new()
    };
    let mut s = format!(
        "# strait-lab bench line-rate: {n} services in {mode}, written for one run.\n\
         [gateway]\n\
         admin_listen = \"127.0.0.1:{ADMIN_PORT}\"\n\
         default_mode = \"{mode}\"\n\
         {eal}\
         \n\
         [[gateway.interfaces]]\n\
         name = \"{name_in}\"\n\
         queues = [0]\n\
         cores = [{core}]\n\
         role = \"client\"\n\
         {port_in}\
         \n\
         [[gateway.interfaces]]\n\
         name = \"{name_out}\"\n\
         queues = [0]\n\
         role = \"backend\"\n\
         {port_out}",
        n = specs.len(),
        mode = mode.as_str(),
        port_in = port(0, topo::FWD_IN),
        port_out = port(1, topo::FWD_OUT),
    );
    for spec in specs {
        let _ = write!(
            s,
            "\n[[services]]\nname = \"{}\"\nvip = \"{}\"\nport = {}\nprotocol = \"udp\"\n\
             mode = \"{}\"\nmaglev_table_size = {MAGLEV_SIZE}\n",
            spec.name,
            spec.vip,
            spec.port,
            mode.as_str()
        );
        for ep in &spec.endpoints {
            let _ = write!(
                s,
                "[[services.backends]]\naddress = \"{}\"\nport = {}\nmac = \"{}\"\n",
                ep.ip(),
                ep.port(),
                topo::SINK_MAC
            );
        }
    }
    s
}

/// What runs in P-fwd for one group; stopped / removed on drop.
#[derive(Debug)]
enum Forwarder {
    /// `strait run` or `strait-lab l2fwd`.
    Process(Proc),
    /// kube-proxy's rules.
    Kernel(#[allow(dead_code, reason = "held for its Drop")] KernelGateway),
}

impl Forwarder {
    /// Fails when a forwarding process has died.
    fn check(&mut self) -> Result<()> {
        if let Forwarder::Process(p) = self {
            if let Some(status) = p.exited() {
                bail!("the forwarder exited ({status}){}", p.log_tail());
            }
        }
        Ok(())
    }
}

#[allow(clippy::too_many_arguments, reason = "one call site, all distinct")]
fn run_group(
    exe: &Path,
    prefix: &str,
    (system, n): (System, usize),
    dir: &Path,
    plan: &Plan,
    setup_only: bool,
    progress: &Progress,
    report: &mut Report,
) -> Result<()> {
    let label = if system.has_services() {
        format!("{} {n}", system.as_str())
    } else {
        system.as_str().to_owned()
    };
    interrupted()?;
    progress.message(&format!("{label}: topology"));
    let wires = match system {
        System::LimitDpdk => topo::Wires::DpdkIn,
        System::StraitDpdkDsrL2 | System::StraitDpdkNat => topo::Wires::Dpdk,
        _ => topo::Wires::Kernel,
    };
    let topo = Topology::up(prefix, FORWARDER_CORE, dir, wires)?;
    let dsr = system.strait_mode() == Some(Mode::DsrL2);
    let specs = if system.has_services() {
        services(n, dsr)
    } else {
        // limit forwards whatever arrives; the generator still needs destinations.
        services(TARGETS, false)
    };
    let mut fwd = match system {
        // Started for each point: its summary's busy time is then that point's.
        System::Limit | System::LimitDpdk => None,
        System::StraitDsrL2
        | System::StraitNat
        | System::StraitDpdkDsrL2
        | System::StraitDpdkNat => {
            let mode = if dsr { Mode::DsrL2 } else { Mode::Nat };
            let path = topo.dir().join("strait.toml");
            let text = if system.is_dpdk() {
                strait_dpdk_config(&specs, mode, FORWARDER_CORE, plan.vdev)
            } else {
                strait_config(&specs, mode, FORWARDER_CORE)
            };
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            progress.message(&format!("{label}: starting strait run"));
            let args = ["run".to_owned(), "--config".to_owned(), path_str(&path)];
            let strait = crate::strait_binary().context("finding the gateway binary")?;
            let mut p = Proc::spawn("strait-run", topo.dir(), topo.fwd(), &strait, &args)?;
            wait_healthy(&mut p, topo.fwd())?;
            Some(Forwarder::Process(p))
        }
        System::Iptables | System::Nftables => {
            let kind = if system == System::Iptables {
                PeerKind::Iptables
            } else {
                PeerKind::Nftables
            };
            let note = if system == System::Nftables && n >= 5000 {
                " (quadratic in the kernel: minutes at 10,000)"
            } else {
                ""
            };
            progress.message(&format!("{label}: loading the rules{note}"));
            let gw = KernelGateway::up(topo.fwd(), kind, &specs)
                .with_context(|| format!("loading the {} rules", kind.as_str()))?;
            interrupted()?;
            report.rule_loads.push(RuleLoad {
                system,
                services: n,
                seconds: gw.load_time().as_secs_f64(),
            });
            check_rules(topo.fwd(), system, n)?;
            Some(Forwarder::Kernel(gw))
        }
    };
    let to = targets(&specs);
    if setup_only {
        // limit's forwarder is a separate program; without it P-fwd only routes, and it has
        // no route to the VIPs.
        let note = if system.is_limit() {
            String::new()
        } else {
            let n = check_path(&topo, &to)?;
            format!(", {n} kernel datagrams forwarded to the sink")
        };
        progress.done(&format!("{label}: set up and checked{note}"));
        return Ok(());
    }
    for traffic in Traffic::ALL {
        progress.message(&format!(
            "{label} {}: {:.0} s of traffic",
            traffic.as_str(),
            plan.seconds
        ));
        interrupted()?;
        if system.is_limit() {
            progress.message(&format!("{label} {}: starting l2fwd", traffic.as_str()));
            let dpdk = system.is_dpdk().then_some(plan.vdev);
            fwd = Some(Forwarder::Process(l2fwd(exe, &topo, traffic, dpdk)?));
        }
        let pid = match &fwd {
            Some(Forwarder::Process(p)) => p.pid(),
            _ => None,
        };
        let (mut point, mut spent) =
            measure(exe, &topo, system, n, traffic, &to, plan.seconds, pid)?;
        interrupted()?;
        if let Some(f) = fwd.as_mut() {
            f.check()?;
        }
        if system.is_limit() {
            if let Some(Forwarder::Process(p)) = fwd.take() {
                let out = p.terminate().context("stopping l2fwd after its point")?;
                let s: L2fwdSummary = serde_json::from_str(out.trim()).with_context(|| {
                    format!("l2fwd's summary is not what `strait-lab l2fwd --json` prints: {out:?}")
                })?;
                spent.worker_ns = Some((s.busy_seconds * 1e9) as u64);
                spent.kick_ns = Some((s.kick_seconds * 1e9) as u64);
            }
        }
        set_cpu(&mut point, &spent);
        progress.done(&format!(
            "{label:<26} {:<12} {:>8.3} Mpps  loss {:>5.1}%  p99 {}  cpu {}",
            traffic.as_str(),
            point.delivered_mpps,
            point.loss_pct,
            point
                .p99_us
                .map_or_else(|| "-".to_owned(), |v| format!("{v:.0} us")),
            point
                .cpu_ns_per_packet
                .map_or_else(|| "-".to_owned(), |v| format!("{v:.0} ns/packet"))
        ));
        report.results.push(point);
    }
    if let Some(Forwarder::Process(p)) = fwd.take() {
        p.terminate()
            .context("stopping the forwarder after its points")?;
    }
    drop(topo);
    Ok(())
}

/// Starts `strait-lab l2fwd` (the `limit` system, or `limit-dpdk` on the `dpdk` vdev) in the
/// forwarder namespace for one point.
fn l2fwd(exe: &Path, topo: &Topology, traffic: Traffic, dpdk: Option<Vdev>) -> Result<Proc> {
    let mut args = [
        "l2fwd",
        "--rx",
        topo::FWD_IN,
        "--tx",
        topo::FWD_OUT,
        "--dst-mac",
        topo::SINK_MAC,
        "--core",
        &FORWARDER_CORE.to_string(),
        "--json",
    ]
    .map(String::from)
    .to_vec();
    if let Some(vdev) = dpdk {
        let vdev = clap::ValueEnum::to_possible_value(&vdev).expect("every vdev has a name");
        args.extend(["--driver", "dpdk", "--vdev", vdev.get_name()].map(String::from));
        let name = format!("l2fwd-dpdk-{}", traffic.as_str());
        let mut p = Proc::spawn(&name, topo.dir(), topo.fwd(), exe, &args)?;
        wait_log(&mut p, "l2fwd (DPDK")?;
        return Ok(p);
    }
    let name = format!("l2fwd-{}", traffic.as_str());
    let mut p = Proc::spawn(&name, topo.dir(), topo.fwd(), exe, &args)?;
    wait_xdp(&mut p, topo.fwd(), topo::FWD_IN)?;
    Ok(p)
}

/// Waits until `p`'s log says `ready` (a forwarder without an XDP program to look for), or
/// `p` has died.
fn wait_log(p: &mut Proc, ready: &str) -> Result<()> {
    let start = Instant::now();
    loop {
        interrupted()?;
        if let Some(status) = p.exited() {
            bail!("the forwarder exited ({status}){}", p.log_tail());
        }
        if p.log_contains(ready) {
            return Ok(());
        }
        if start.elapsed() > XDP_READY {
            bail!(
                "the forwarder did not say {ready:?} within {} s{}",
                XDP_READY.as_secs(),
                p.log_tail()
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// The names (`comm` prefixes) of the busy-polling forwarders' threads: the gateway's
/// workers (`xsk IFACE+IFACE/QUEUE`, `dpdk IFACE+IFACE/QUEUE`) and l2fwd's.
const FORWARDING_THREADS: &[&str] = &["xsk ", "dpdk ", "l2fwd"];

/// l2fwd's `--json` summary (the field used here).
#[derive(Debug, Clone, Deserialize)]
struct L2fwdSummary {
    busy_seconds: f64,
    kick_seconds: f64,
}

/// The generator's `--json` summary (the fields used here).
#[derive(Debug, Clone, Deserialize)]
struct GenSummary {
    sent: u64,
    seconds: f64,
    offered_pps: f64,
    probes: Option<Probes>,
}

#[derive(Debug, Clone, Deserialize)]
struct Probes {
    sent: u64,
    received: u64,
    p50_us: Option<f64>,
    p99_us: Option<f64>,
    p999_us: Option<f64>,
}

/// The sink's `--json` summary.
#[derive(Debug, Clone, Deserialize)]
struct SinkSummary {
    /// Every frame counted, probes included.
    received: u64,
    /// Probes reflected (counted in `received` too).
    reflected: u64,
}

/// One point: sink up, generator for `seconds`, sink stopped; the numbers, and the CPU spent
/// from just before the generator started until it stopped and the forwarder drained
/// (`limit`'s busy time is its summary's, read by the caller).
#[allow(clippy::too_many_arguments, reason = "one call site, all distinct")]
fn measure(
    exe: &Path,
    topo: &Topology,
    system: System,
    services: usize,
    traffic: Traffic,
    to: &[SocketAddrV4],
    seconds: f64,
    fwd_pid: Option<u32>,
) -> Result<(Point, cpu::Delta)> {
    let tag = format!("{}-{services}-{}", system.as_str(), traffic.as_str());
    let lport = LATENCY_PORT.to_string();
    let sink_args = [
        "sink",
        "--iface",
        topo::SINK_IF,
        "--json",
        "--reflect-port",
        &lport,
    ]
    .map(String::from);
    let mut sink = Proc::spawn(
        &format!("sink-{tag}"),
        topo.dir(),
        topo.sink(),
        exe,
        &sink_args,
    )?;
    wait_xdp(&mut sink, topo.sink(), topo::SINK_IF)?;
    let to_arg = to
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut gen_args: Vec<String> = [
        "gen",
        "--iface",
        topo::GEN_IF,
        "--dst-mac",
        topo::FWD_IN_MAC,
        "--src-mac",
        topo::GEN_MAC,
        "--to",
        &to_arg,
        "--traffic",
        "udp",
        "--src-range",
        topo::SRC_RANGE,
        "--size",
        &FRAME_BYTES.to_string(),
        "--rate",
        "max",
        "--duration",
        &seconds.to_string(),
        "--core",
        &GENERATOR_CORE.to_string(),
        "--latency-port",
        &lport,
        "--json",
    ]
    .map(String::from)
    .to_vec();
    match traffic {
        Traffic::NewFlows => gen_args.push("--new-flows".to_owned()),
        Traffic::Established => {
            gen_args.extend(["--flows".to_owned(), ESTABLISHED_FLOWS.to_string()]);
        }
    }
    let metrics = format!("http://127.0.0.1:{ADMIN_PORT}/metrics");
    let metrics = system.strait_mode().is_some().then_some(&*metrics);
    let read = || {
        cpu::Reading::take(
            FORWARDER_CORE,
            (topo.fwd(), &[topo::FWD_IN, topo::FWD_OUT]),
            (topo.sink(), topo::SINK_IF),
            metrics,
            fwd_pid.map(|pid| (pid, FORWARDING_THREADS)),
        )
    };
    let before = read()?;
    let gen = Proc::spawn(
        &format!("gen-{tag}"),
        topo.dir(),
        topo.gen(),
        exe,
        &gen_args,
    )?;
    let gen_out = gen.finish(Duration::from_secs_f64(seconds) + GEN_GRACE)?;
    thread::sleep(DRAIN);
    let spent = before.until(&read()?);
    let sink_out = sink.terminate()?;
    let g: GenSummary = serde_json::from_str(gen_out.trim()).with_context(|| {
        format!("the generator's summary is not what `strait-lab gen --json` prints: {gen_out:?}")
    })?;
    let s: SinkSummary = serde_json::from_str(sink_out.trim()).with_context(|| {
        format!("the sink's summary is not what `strait-lab sink --json` prints: {sink_out:?}")
    })?;
    Ok((point(system, services, traffic, &g, &s), spent))
}

/// The numbers of one point from the two summaries.
fn point(
    system: System,
    services: usize,
    traffic: Traffic,
    g: &GenSummary,
    s: &SinkSummary,
) -> Point {
    let secs = if g.seconds > 0.0 { g.seconds } else { f64::NAN };
    // Probes are not in the generator's `sent`; at 1,000/s they would be a seventh of
    // iptables' rate at 10,000 services.
    let received = s.received.saturating_sub(s.reflected);
    let delivered = received as f64 / secs / 1e6;
    let loss = if g.sent == 0 {
        100.0
    } else {
        (100.0 * (1.0 - received as f64 / g.sent as f64)).max(0.0)
    };
    let probes = g.probes.as_ref();
    let got = probes.is_some_and(|p| p.received > 0);
    let q = |f: fn(&Probes) -> Option<f64>| probes.filter(|_| got).and_then(f);
    Point {
        system,
        services,
        traffic,
        delivered_mpps: if delivered.is_finite() {
            delivered
        } else {
            0.0
        },
        loss_pct: loss,
        p99_us: q(|p| p.p99_us),
        p50_us: q(|p| p.p50_us),
        p999_us: q(|p| p.p999_us),
        offered_mpps: g.offered_pps / 1e6,
        sent: g.sent,
        received,
        seconds: g.seconds,
        probes_sent: probes.map_or(0, |p| p.sent),
        probes_received: probes.map_or(0, |p| p.received),
        pct_of_limit: None,
        ratio_to_iptables: None,
        cpu_ns_per_packet: None,
        cpu_ratio_to_iptables: None,
        cpu_ratio_to_nftables: None,
        own_cpu_ns_per_packet: None,
        own_cpu_ratio_to_iptables: None,
        own_cpu_ratio_to_nftables: None,
        xdp_ns_per_packet: None,
        cpu: None,
    }
}

/// Fills `p`'s CPU cost from what was spent during it (`d`): see [`cpu`] for the methods.
fn set_cpu(p: &mut Point, d: &cpu::Delta) {
    if p.received == 0 {
        return;
    }
    let per = |ns: u64| ns as f64 / p.received as f64;
    let kernel = d.softirq_ns + d.irq_ns;
    let xdp = (d.xdp_runs > 0).then(|| per(d.xdp_ns));
    let (method, total) = match p.system {
        System::Iptables | System::Nftables => ("softirq+irq", Some(per(kernel))),
        System::StraitDsrL2 | System::StraitNat | System::Limit => (
            "worker-busy+xdp",
            d.worker_cpu_ns()
                .map(|w| w / p.received as f64 + xdp.unwrap_or(0.0)),
        ),
        // On `net_af_xdp` the PMD's XDP program (libxdp's, redirecting every frame to the
        // port's socket) counts as the AF_XDP systems' programs do; `net_af_packet` has
        // none: its receive work is the kernel's packet-socket copy on the sending CPU (see
        // `topo`), which a NIC does by DMA.
        System::LimitDpdk | System::StraitDpdkDsrL2 | System::StraitDpdkNat => (
            if xdp.is_some() {
                "worker-busy+xdp"
            } else {
                "worker-busy"
            },
            d.worker_cpu_ns()
                .map(|w| w / p.received as f64 + xdp.unwrap_or(0.0)),
        ),
    };
    p.cpu_ns_per_packet = total.filter(|v| v.is_finite() && *v > 0.0);
    let xdp_per_run = (d.xdp_runs > 0).then(|| d.xdp_ns as f64 / d.xdp_runs as f64);
    p.xdp_ns_per_packet = xdp_per_run;
    let kick = d.kick_cpu_ns().map(|k| k / p.received as f64);
    p.own_cpu_ns_per_packet = match (p.cpu_ns_per_packet, kick) {
        (Some(t), Some(k)) if method != "softirq+irq" => Some((t - k).max(0.0)),
        _ => None,
    };
    p.cpu = Some(CpuCost {
        method: method.to_owned(),
        worker_ns_per_packet: d.worker_cpu_ns().map(|w| w / p.received as f64),
        worker_wall_ns_per_packet: d.worker_ns.map(per),
        kick_ns_per_packet: kick,
        on_cpu_share: d.on_cpu,
        xdp_ns_per_packet: xdp,
        xdp_ns_per_run: xdp_per_run,
        softirq_ns_per_packet: per(d.softirq_ns),
        irq_ns_per_packet: per(d.irq_ns),
        system_ns_per_packet: per(d.system_ns),
        sink_xdp_ns_per_packet: (d.sink_xdp_ns > 0).then(|| per(d.sink_xdp_ns)),
    });
}

/// Fills `pct_of_limit`, `ratio_to_iptables` and the CPU ratios from the other points.
pub fn derive(results: &mut [Point]) {
    let limit: HashMap<(System, Traffic), f64> = results
        .iter()
        .filter(|p| p.system.is_limit())
        .map(|p| ((p.system, p.traffic), p.delivered_mpps))
        .collect();
    let ipt: HashMap<(usize, Traffic), f64> = results
        .iter()
        .filter(|p| p.system == System::Iptables)
        .map(|p| ((p.services, p.traffic), p.delivered_mpps))
        .collect();
    for p in results.iter_mut() {
        p.pct_of_limit = limit
            .get(&(p.system.own_limit(), p.traffic))
            .filter(|&&l| l > 0.0)
            .map(|l| 100.0 * p.delivered_mpps / l);
        p.ratio_to_iptables = ipt
            .get(&(p.services, p.traffic))
            .filter(|&&i| i > 0.0 && p.system.has_services())
            .map(|i| p.delivered_mpps / i);
    }
    let cpu_of = |system: System| -> HashMap<(usize, Traffic), f64> {
        results
            .iter()
            .filter(|p| p.system == system)
            .filter_map(|p| Some(((p.services, p.traffic), p.cpu_ns_per_packet?)))
            .collect()
    };
    let (ipt, nft) = (cpu_of(System::Iptables), cpu_of(System::Nftables));
    for p in results.iter_mut() {
        let ratio = |mine: Option<f64>, peer: &HashMap<(usize, Traffic), f64>| {
            let (mine, theirs) = (mine?, *peer.get(&(p.services, p.traffic))?);
            (theirs > 0.0 && p.system.has_services()).then(|| mine / theirs)
        };
        p.cpu_ratio_to_iptables = ratio(p.cpu_ns_per_packet, &ipt);
        p.cpu_ratio_to_nftables = ratio(p.cpu_ns_per_packet, &nft);
        p.own_cpu_ratio_to_iptables = ratio(p.own_cpu_ns_per_packet, &ipt);
        p.own_cpu_ratio_to_nftables = ratio(p.own_cpu_ns_per_packet, &nft);
    }
}

/// The table printed on stdout.
pub fn table(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Line rate: UDP {}-byte frames, forwarder on CPU {}, generator on CPU {}, {} s per \
         point, {} endpoints per service",
        r.frame_bytes,
        r.forwarder_core,
        r.generator_core,
        r.seconds_per_point,
        r.endpoints_per_service
    );
    let _ = writeln!(s, "{} ({})", r.machine, r.date);
    let _ = writeln!(
        s,
        "offered: what the generator sent (Mpps). The kernel peers slow the generator to their \
         own rate (no loss, offered = delivered); an AF_XDP system with no loss was limited by \
         the generator"
    );
    let _ = writeln!(
        s,
        "cpu ns: the forwarding CPU's time per delivered packet (AF_XDP: busy worker turns + \
         XDP programs; DPDK: busy worker turns, + the PMD's XDP program on net_af_xdp; \
         kernel: the forwarder CPU's softirq + irq); cpu/ipt, cpu/nft: over iptables' and \
         nftables' (under 1: cheaper); own ns: an AF_XDP or DPDK forwarder's time without its \
         TX kicks (copy mode: the kernel's transmit; DPDK: the turn's burst out), \
         own/ipt, own/nft over the peers' cpu ns; % limit: of the same driver's limit (limit \
         for AF_XDP, limit-dpdk for DPDK); xdp ns: the forwarder's XDP program alone (the \
         steering program for Strait), kernel BPF statistics' run time per run"
    );
    let _ = writeln!(
        s,
        "{:<18} {:>8} {:<12} {:>8} {:>8} {:>8} {:>9} {:>8} {:>10} {:>9} {:>8} {:>8} {:>7} {:>8} {:>8} {:>7}",
        "system",
        "services",
        "traffic",
        "offered",
        "Mpps",
        "loss %",
        "p99 us",
        "% limit",
        "x iptables",
        "cpu ns",
        "cpu/ipt",
        "cpu/nft",
        "own ns",
        "own/ipt",
        "own/nft",
        "xdp ns"
    );
    for p in &r.results {
        let opt = |v: Option<f64>, prec: usize| {
            v.map_or_else(|| "-".to_owned(), |v| format!("{v:.prec$}"))
        };
        let services = if p.system.has_services() {
            p.services.to_string()
        } else {
            "-".to_owned()
        };
        let ratio = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), significant);
        let _ = writeln!(
            s,
            "{:<18} {:>8} {:<12} {:>8.3} {:>8.3} {:>8.1} {:>9} {:>8} {:>10} {:>9} {:>8} {:>8} {:>7} {:>8} {:>8} {:>7}",
            p.system.as_str(),
            services,
            p.traffic.as_str(),
            p.offered_mpps,
            p.delivered_mpps,
            p.loss_pct,
            opt(p.p99_us, 0),
            opt(p.pct_of_limit, 1),
            opt(p.ratio_to_iptables, 1),
            opt(p.cpu_ns_per_packet, 0),
            ratio(p.cpu_ratio_to_iptables),
            ratio(p.cpu_ratio_to_nftables),
            opt(p.own_cpu_ns_per_packet, 0),
            ratio(p.own_cpu_ratio_to_iptables),
            ratio(p.own_cpu_ratio_to_nftables),
            opt(p.xdp_ns_per_packet, 1),
        );
    }
    for l in &r.rule_loads {
        let _ = writeln!(
            s,
            "{} rules for {} services loaded in {:.2} s",
            l.system.as_str(),
            l.services,
            l.seconds
        );
    }
    for m in &r.not_measured {
        let _ = writeln!(s, "{}: {}", m.system, m.reason);
    }
    if let Some(e) = &r.incomplete {
        let _ = writeln!(s, "INCOMPLETE: {e}");
    }
    s
}

/// `v` with three significant digits (`0.00832`, `0.214`, `1.00`, `12.3`).
fn significant(v: f64) -> String {
    if !v.is_finite() || v <= 0.0 {
        return format!("{v}");
    }
    let decimals = (2 - v.log10().floor() as i32).clamp(0, 9) as usize;
    format!("{v:.decimals$}")
}

/// Waits until `iface` in `ns` has an XDP program, or `p` has died.
fn wait_xdp(p: &mut Proc, ns: &str, iface: &str) -> Result<()> {
    let start = Instant::now();
    loop {
        interrupted()?;
        if let Some(status) = p.exited() {
            bail!(
                "{ns}: the process meant to attach XDP to {iface} exited ({status}){}",
                p.log_tail()
            );
        }
        if Topology::has_xdp(ns, iface) {
            return Ok(());
        }
        if start.elapsed() > XDP_READY {
            bail!(
                "{ns}: no XDP program on {iface} after {} s{}",
                XDP_READY.as_secs(),
                p.log_tail()
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until `strait run` in `ns` answers `GET /healthz` with 200.
fn wait_healthy(p: &mut Proc, ns: &str) -> Result<()> {
    let url = format!("http://127.0.0.1:{ADMIN_PORT}/healthz");
    let start = Instant::now();
    loop {
        interrupted()?;
        if let Some(status) = p.exited() {
            bail!("strait run exited ({status}){}", p.log_tail());
        }
        let code = Command::new("ip")
            .args(["netns", "exec", ns, "curl", "-s", "-o", "/dev/null"])
            .args(["-w", "%{http_code}", "--max-time", "1", &url])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default();
        if code == "200" {
            return Ok(());
        }
        if start.elapsed() > STRAIT_READY {
            bail!(
                "strait run did not answer {url} with 200 within {} s (last: {code:?}){}",
                STRAIT_READY.as_secs(),
                p.log_tail()
            );
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// Checks that the kernel holds one service's worth of rules per service: `KUBE-SVC-`
/// chains for iptables, `service-ips` map elements for nftables.
fn check_rules(ns: &str, system: System, n: usize) -> Result<()> {
    let (found, what) = match system {
        System::Iptables => {
            let (save, _) = peers::run_in(ns, "iptables-save", &["-t", "nat"], None)?;
            let chains = save.lines().filter(|l| l.starts_with(":KUBE-SVC-")).count();
            (chains, "KUBE-SVC- chains")
        }
        System::Nftables => {
            let (map, _) = peers::run_in(
                ns,
                "nft",
                &["list", "map", "ip", "kube-proxy", "service-ips"],
                None,
            )?;
            (
                map.matches(": goto service-").count(),
                "service-ips elements",
            )
        }
        _ => return Ok(()),
    };
    if found != n {
        bail!("{ns}: {found} {what} loaded, expected {n}");
    }
    Ok(())
}

/// Datagrams [`check_path`] sends to each target.
const CHECK_DATAGRAMS: usize = 5;

/// Sends [`CHECK_DATAGRAMS`] UDP datagrams to each target from the generator namespace's
/// kernel (bash's `/dev/udp`, a new socket and so a new flow each) and checks that all of
/// them reached `sink0` (its receive counter; no XDP program is attached there yet, so
/// the frames reach the interface and its kernel drops them). Returns how many arrived.
fn check_path(topo: &Topology, to: &[SocketAddrV4]) -> Result<u64> {
    let rx = || -> Result<u64> {
        let path = format!("/sys/class/net/{}/statistics/rx_packets", topo::SINK_IF);
        let (out, _) = peers::run_in(topo.sink(), "cat", &[&path], None)?;
        out.trim()
            .parse()
            .with_context(|| format!("{path}: {out:?} is not a counter"))
    };
    let before = rx()?;
    let mut script = String::new();
    for t in to {
        let _ = write!(
            script,
            "for i in $(seq {CHECK_DATAGRAMS}); do echo probe > /dev/udp/{}/{}; done; ",
            t.ip(),
            t.port()
        );
    }
    peers::run_in(topo.gen(), "bash", &["-c", &script], None)
        .context("sending check datagrams from the generator namespace")?;
    let want = (to.len() * CHECK_DATAGRAMS) as u64;
    let start = Instant::now();
    loop {
        let got = rx()?.saturating_sub(before);
        if got >= want {
            return Ok(got);
        }
        if start.elapsed() > Duration::from_secs(2) {
            bail!("{got} of {want} datagrams sent to the services reached the sink");
        }
        thread::sleep(Duration::from_millis(50));
    }
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// What the report names without numbers: IPVS, and the DPDK rows in a build without them.
fn not_measured() -> Vec<NotMeasured> {
    let mut v = vec![ipvs()];
    if !System::ALL.contains(&System::LimitDpdk) {
        v.extend(System::DPDK.iter().map(|s| NotMeasured {
            system: s.as_str().to_owned(),
            reason: NO_DPDK.to_owned(),
        }));
    }
    v
}

/// IPVS: present in this kernel (then only not measured) or not.
fn ipvs() -> NotMeasured {
    let loaded = Path::new("/proc/net/ip_vs").exists();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let module = Path::new("/lib/modules")
        .join(release.trim())
        .join("kernel/net/netfilter/ipvs")
        .exists();
    let reason = if loaded || module {
        "kube-proxy's ipvs mode: not measured (the ip_vs module is there, the rules are not written)"
    } else {
        "kube-proxy's ipvs mode: not in this kernel (no ip_vs module, no /proc/net/ip_vs)"
    };
    NotMeasured {
        system: "ipvs".to_owned(),
        reason: reason.to_owned(),
    }
}

/// CPU model and count, kernel, distribution.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU", |(_, m)| m.trim())
        .to_owned();
    let cpus = thread::available_parallelism().map_or(1, usize::from);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let os = os
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map_or("unknown OS", |v| v.trim_matches('"'))
        .to_owned();
    format!("{cpus} x {model}, Linux {}, {os}", kernel.trim())
}

/// The command line, as run.
fn command_line() -> String {
    let mut args = std::env::args();
    let first = args.next().map(|a| {
        Path::new(&a)
            .file_name()
            .map_or(a.clone(), |f| f.to_string_lossy().into_owned())
    });
    first.into_iter().chain(args).collect::<Vec<_>>().join(" ")
}

/// Now, UTC, `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// `secs` since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (Howard Hinnant's `civil_from_days`).
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The progress bar on stderr; when stderr is not a terminal (CI, a log file), the same
/// steps as plain lines.
struct Progress {
    bar: ProgressBar,
}

impl Progress {
    fn new(plan: &Plan, setup_only: bool) -> Self {
        let steps = if setup_only {
            plan.groups.len()
        } else {
            plan.points()
        };
        let bar = ProgressBar::with_draw_target(Some(steps as u64), ProgressDrawTarget::stderr());
        if let Ok(style) =
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.enable_steady_tick(Duration::from_millis(200));
        Self { bar }
    }

    /// The current step.
    fn message(&self, m: &str) {
        if self.bar.is_hidden() {
            eprintln!("line-rate: {m} ...");
        }
        self.bar.set_message(m.to_owned());
    }

    /// A finished step, printed above the bar.
    fn done(&self, line: &str) {
        if self.bar.is_hidden() {
            eprintln!("line-rate: {line}");
        } else {
            self.bar.println(line);
        }
        self.bar.inc(1);
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_are_unique_and_on_documentation_addresses() {
        for dsr in [false, true] {
            let specs = services(10_000, dsr);
            let mut frontends = std::collections::HashSet::new();
            let mut endpoints = std::collections::HashSet::new();
            for s in &specs {
                assert!(frontends.insert((s.vip, s.port)), "{s:?}");
                assert_eq!(s.vip.octets()[..3], [203, 0, 113]);
                assert_eq!(s.endpoints.len(), ENDPOINTS_PER_SERVICE);
                for e in &s.endpoints {
                    let o = e.ip().octets();
                    assert_eq!(o[..3], [198, 51, 100]);
                    assert!((10..=249).contains(&o[3]));
                    if dsr {
                        assert_eq!(e.port(), s.port);
                    } else {
                        assert!(endpoints.insert(*e), "{e} twice");
                    }
                }
            }
            assert_eq!(specs[0].vip, Ipv4Addr::new(203, 0, 113, 1));
            assert_eq!(specs[0].port, 1000);
            assert_eq!(specs[9999].vip, Ipv4Addr::new(203, 0, 113, 10));
            assert_eq!(specs[9999].port, 1999);
            let last = services(MAX_SERVICES, dsr).pop().unwrap();
            assert_eq!(
                (last.vip, last.port),
                (Ipv4Addr::new(203, 0, 113, 50), 1999)
            );
        }
    }

    #[test]
    fn targets_spread_from_first_to_last() {
        let specs = services(10_000, false);
        let t = targets(&specs);
        assert_eq!(t.len(), TARGETS);
        assert_eq!(t[0], SocketAddrV4::new(specs[0].vip, specs[0].port));
        assert_eq!(
            t[TARGETS - 1],
            SocketAddrV4::new(specs[9999].vip, specs[9999].port)
        );
        let small = services(10, false);
        let t = targets(&small);
        assert_eq!(t.len(), 10, "every service once: {t:?}");
        assert_eq!(targets(&small[..1]).len(), 1);
    }

    #[test]
    fn strait_config_parses_with_the_right_shape() {
        for (mode, dsr) in [(Mode::DsrL2, true), (Mode::Nat, false)] {
            let specs = services(300, dsr);
            let text = strait_config(&specs, mode, 1);
            let cfg = strait_config::parse(&text).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(cfg.services.len(), 300);
            assert!(cfg.services.iter().all(|s| s.mode == mode));
            assert!(cfg
                .services
                .iter()
                .all(|s| s.protocol == Protocol::Udp && s.maglev_table_size == MAGLEV_SIZE));
            let ifs = &cfg.gateway.interfaces;
            assert_eq!(ifs.len(), 2);
            assert_eq!(ifs[0].name, "fwd0");
            assert_eq!(ifs[0].cores.as_deref(), Some(&[1][..]));
            assert_eq!(ifs[1].name, "fwd1");
            let b = &cfg.services[299].backends[3];
            assert_eq!(b.mac.unwrap().to_string(), topo::SINK_MAC);
            assert_eq!(
                b.address.to_string(),
                specs[299].endpoints[3].ip().to_string()
            );
        }
    }

    #[test]
    fn strait_dpdk_config_names_the_taps_and_the_wires() {
        for (mode, dsr, vdev) in [
            (Mode::DsrL2, true, Vdev::AfXdp),
            (Mode::Nat, false, Vdev::AfPacket),
        ] {
            let specs = services(30, dsr);
            let text = strait_dpdk_config(&specs, mode, 1, vdev);
            let cfg = strait_config::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            let ifs = &cfg.gateway.interfaces;
            assert_eq!(
                (ifs[0].name.as_str(), ifs[1].name.as_str()),
                (topo::TAP_IN, topo::TAP_OUT)
            );
            assert_eq!(ifs[0].cores.as_deref(), Some(&[1][..]));
            for (i, wire) in [(0, "fwd0"), (1, "fwd1")] {
                assert_eq!(ifs[i].driver.name(), "dpdk", "{text}");
                assert!(
                    text.contains(&format!("device = \"{}{i},iface={wire}\"", vdev.pmd())),
                    "{text}"
                );
            }
            let d = cfg.gateway.dpdk.as_ref().expect("[gateway.dpdk]");
            assert!(d.no_huge && d.memory_mb == Some(DPDK_MEMORY_MB), "{d:?}");
            assert_eq!(cfg.services.len(), 30);
        }
        assert_eq!(System::StraitDpdkNat.own_limit(), System::LimitDpdk);
        assert_eq!(System::StraitNat.own_limit(), System::Limit);
        assert!(!System::LimitDpdk.has_services() && System::LimitDpdk.is_dpdk());
    }

    #[test]
    fn plans_follow_the_options() {
        let full = Plan::from_options(&Options::default()).unwrap();
        assert_eq!(full.seconds, FULL_SECONDS);
        // A build with the `dpdk` feature has the two limits and six systems with services.
        let limits = if cfg!(feature = "dpdk") { 2 } else { 1 };
        let with_services = if cfg!(feature = "dpdk") { 6 } else { 4 };
        assert_eq!(full.groups.len(), limits + with_services * 3);
        assert_eq!(full.groups[0], (System::Limit, 0));
        assert_eq!(full.points(), 2 * (limits + with_services * 3));
        let quick = Plan::from_options(&Options {
            quick: true,
            ..Options::default()
        })
        .unwrap();
        assert_eq!(quick.groups.len(), limits + with_services * 2);
        // The points alone, without set-up, leave a minute of the three for it (the AF_XDP
        // and kernel systems).
        let base = Plan::from_options(&Options {
            quick: true,
            systems: vec![
                System::Limit,
                System::StraitDsrL2,
                System::StraitNat,
                System::Iptables,
                System::Nftables,
            ],
            ..Options::default()
        })
        .unwrap();
        assert!(base.points() as f64 * QUICK_SECONDS < 120.0);
        let dpdk = Plan::from_options(&Options {
            services: vec![10],
            systems: System::DPDK.to_vec(),
            ..Options::default()
        });
        if cfg!(feature = "dpdk") {
            assert_eq!(
                dpdk.unwrap().groups,
                vec![
                    (System::LimitDpdk, 0),
                    (System::StraitDpdkDsrL2, 10),
                    (System::StraitDpdkNat, 10)
                ]
            );
            assert!(not_measured().iter().all(|m| m.system == "ipvs"));
        } else {
            let e = dpdk.unwrap_err().to_string();
            assert!(
                e.contains("limit-dpdk") && e.contains("`dpdk` feature"),
                "{e}"
            );
            let names: Vec<String> = not_measured().into_iter().map(|m| m.system).collect();
            assert_eq!(
                names,
                [
                    "ipvs",
                    "limit-dpdk",
                    "strait-dpdk-dsr-l2",
                    "strait-dpdk-nat"
                ]
            );
        }
        let one = Plan::from_options(&Options {
            services: vec![10],
            seconds: Some(1.0),
            systems: vec![System::Iptables, System::Limit],
            ..Options::default()
        })
        .unwrap();
        assert_eq!(one.groups, vec![(System::Limit, 0), (System::Iptables, 10)]);
        for bad in [
            Options {
                services: vec![0],
                ..Options::default()
            },
            Options {
                seconds: Some(0.1),
                ..Options::default()
            },
        ] {
            assert!(Plan::from_options(&bad).is_err(), "{bad:?}");
        }
    }

    fn sample() -> Report {
        let mut results = Vec::new();
        let mut add = |system, services, traffic, mpps: f64, cpu_ns: f64| {
            let g = GenSummary {
                sent: 10_000_000,
                seconds: 10.0,
                offered_pps: 1e6,
                probes: Some(Probes {
                    sent: 10_000,
                    received: 9_990,
                    p50_us: Some(20.0),
                    p99_us: Some(80.0),
                    p999_us: Some(200.0),
                }),
            };
            let s = SinkSummary {
                received: (mpps * 1e6 * 10.0) as u64 + 9_990,
                reflected: 9_990,
            };
            let mut p = point(system, services, traffic, &g, &s);
            // The cost as the system's method sees it: a quarter of it in the XDP program
            // for the AF_XDP systems, all of it softirq for the kernel.
            let total = (cpu_ns * p.received as f64) as u64;
            let spent = if matches!(system, System::Iptables | System::Nftables) {
                cpu::Delta {
                    softirq_ns: total,
                    ..Default::default()
                }
            } else if system.is_dpdk() {
                cpu::Delta {
                    worker_ns: Some(total),
                    softirq_ns: total / 10,
                    ..Default::default()
                }
            } else {
                cpu::Delta {
                    worker_ns: Some(total - total / 4),
                    kick_ns: Some(total / 2),
                    xdp_ns: total / 4,
                    xdp_runs: p.received,
                    softirq_ns: total / 10,
                    ..Default::default()
                }
            };
            set_cpu(&mut p, &spent);
            results.push(p);
        };
        add(System::Limit, 0, Traffic::Established, 1.0, 100.0);
        add(System::Limit, 0, Traffic::NewFlows, 0.8, 120.0);
        add(System::LimitDpdk, 0, Traffic::Established, 0.5, 150.0);
        add(System::LimitDpdk, 0, Traffic::NewFlows, 0.5, 150.0);
        for n in [10, 1000] {
            add(System::StraitDsrL2, n, Traffic::Established, 0.9, 200.0);
            add(System::StraitDsrL2, n, Traffic::NewFlows, 0.6, 400.0);
            add(System::StraitDpdkNat, n, Traffic::Established, 0.45, 250.0);
            add(System::StraitDpdkNat, n, Traffic::NewFlows, 0.4, 500.0);
            add(System::Iptables, n, Traffic::Established, 0.3, 1000.0);
            add(
                System::Iptables,
                n,
                Traffic::NewFlows,
                0.2 * 10.0 / n as f64,
                5000.0 * n as f64 / 10.0,
            );
            add(System::Nftables, n, Traffic::Established, 0.5, 800.0);
            add(System::Nftables, n, Traffic::NewFlows, 0.3, 2000.0);
        }
        derive(&mut results);
        Report {
            machine: "2 x test CPU".into(),
            date: rfc3339(0),
            command: "strait-lab bench line-rate".into(),
            seconds_per_point: 10.0,
            dpdk_vdev: Vdev::AfXdp,
            frame_bytes: FRAME_BYTES,
            endpoints_per_service: ENDPOINTS_PER_SERVICE,
            established_flows: ESTABLISHED_FLOWS,
            forwarder_core: 1,
            generator_core: 0,
            not_measured: vec![ipvs()],
            rule_loads: vec![],
            incomplete: None,
            results,
        }
    }

    #[test]
    fn points_and_derived_columns() {
        let r = sample();
        let find = |sys, n, t| {
            r.results
                .iter()
                .find(|p| p.system == sys && p.services == n && p.traffic == t)
                .unwrap()
        };
        let p = find(System::StraitDsrL2, 1000, Traffic::NewFlows);
        assert!((p.delivered_mpps - 0.6).abs() < 1e-9);
        assert!((p.loss_pct - 40.0).abs() < 1e-9);
        assert!((p.pct_of_limit.unwrap() - 75.0).abs() < 1e-9);
        assert!((p.ratio_to_iptables.unwrap() - 300.0).abs() < 1e-6);
        assert_eq!(p.p99_us, Some(80.0));
        let l = find(System::Limit, 0, Traffic::Established);
        assert_eq!(l.pct_of_limit, Some(100.0));
        assert_eq!(l.ratio_to_iptables, None);
        // CPU per packet: the parts add up, the ratios are over the peers' at the same scale.
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-6 * b.max(1.0));
        assert!(close(p.cpu_ns_per_packet, 400.0), "{p:?}");
        let c = p.cpu.as_ref().unwrap();
        assert_eq!(c.method, "worker-busy+xdp");
        assert!(close(c.worker_ns_per_packet, 300.0) && close(c.xdp_ns_per_packet, 100.0));
        assert!(close(c.xdp_ns_per_run, 100.0), "{c:?}");
        assert!(
            close(p.xdp_ns_per_packet, 100.0),
            "the program's own, per run: {p:?}"
        );
        assert!((c.softirq_ns_per_packet - 40.0).abs() < 1e-6, "{c:?}");
        assert!(close(p.cpu_ratio_to_iptables, 400.0 / 500_000.0), "{p:?}");
        assert!(close(p.cpu_ratio_to_nftables, 400.0 / 2000.0), "{p:?}");
        // Without the TX kicks (half of the total here): the forwarder's own part.
        assert!(close(c.kick_ns_per_packet, 200.0), "{c:?}");
        assert!(close(p.own_cpu_ns_per_packet, 200.0), "{p:?}");
        assert!(close(p.own_cpu_ratio_to_nftables, 200.0 / 2000.0), "{p:?}");
        let k = find(System::Nftables, 10, Traffic::Established);
        assert_eq!(k.cpu.as_ref().unwrap().method, "softirq+irq");
        assert!(close(k.cpu_ns_per_packet, 800.0), "{k:?}");
        assert!(close(k.cpu_ratio_to_iptables, 0.8) && close(k.cpu_ratio_to_nftables, 1.0));
        assert_eq!(
            k.own_cpu_ns_per_packet, None,
            "the kernel has no kick to leave out"
        );
        assert_eq!(
            k.xdp_ns_per_packet, None,
            "the kernel peers run no XDP program"
        );
        assert_eq!(
            l.cpu_ratio_to_nftables, None,
            "limit has no services to compare at"
        );
        assert!(close(l.cpu_ns_per_packet, 100.0), "{l:?}");
        // DPDK rows: over their own limit, CPU from the busy turns alone.
        let d = find(System::StraitDpdkNat, 1000, Traffic::NewFlows);
        assert!((d.pct_of_limit.unwrap() - 80.0).abs() < 1e-9, "{d:?}");
        assert_eq!(d.cpu.as_ref().unwrap().method, "worker-busy");
        assert!(close(d.cpu_ns_per_packet, 500.0), "{d:?}");
        assert!(close(d.cpu_ratio_to_nftables, 500.0 / 2000.0), "{d:?}");
        let ld = find(System::LimitDpdk, 0, Traffic::Established);
        assert_eq!(ld.pct_of_limit, Some(100.0));
        // An AF_XDP point without its busy time has no total rather than the XDP part alone.
        let mut q = p.clone();
        set_cpu(
            &mut q,
            &cpu::Delta {
                xdp_ns: 5,
                xdp_runs: 5,
                ..Default::default()
            },
        );
        assert_eq!(q.cpu_ns_per_packet, None);
        // No probe back: no latency rather than a zero.
        let g = GenSummary {
            sent: 5,
            seconds: 1.0,
            offered_pps: 5.0,
            probes: Some(Probes {
                sent: 3,
                received: 0,
                p50_us: Some(0.0),
                p99_us: Some(0.0),
                p999_us: Some(0.0),
            }),
        };
        let p = point(
            System::Iptables,
            10,
            Traffic::NewFlows,
            &g,
            &SinkSummary {
                received: 7,
                reflected: 0,
            },
        );
        assert_eq!(p.p99_us, None);
        assert_eq!(
            p.loss_pct, 0.0,
            "more received than sent is not negative loss"
        );
    }

    #[test]
    fn json_has_the_issue_shape() {
        let r = sample();
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert!(v["machine"].is_string() && v["date"].is_string());
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), r.results.len());
        for p in results {
            let sys = p["system"].as_str().unwrap();
            assert!([
                "strait-dsr-l2",
                "strait-nat",
                "iptables",
                "nftables",
                "limit",
                "limit-dpdk",
                "strait-dpdk-dsr-l2",
                "strait-dpdk-nat"
            ]
            .contains(&sys));
            assert!(p["services"].is_u64());
            assert!(["new-flows", "established"].contains(&p["traffic"].as_str().unwrap()));
            for k in ["delivered_mpps", "loss_pct", "p99_us", "cpu_ns_per_packet"] {
                assert!(p[k].is_f64(), "{k} in {p}");
            }
            assert!(p["cpu"]["softirq_ns_per_packet"].is_f64(), "{p}");
        }
        assert_eq!(v["not_measured"][0]["system"], "ipvs");
        assert!(v.get("incomplete").is_none());
        let back: Report = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn the_table_has_a_row_per_point() {
        let r = sample();
        let t = table(&r);
        let rows: Vec<&str> = t
            .lines()
            .filter(|l| {
                ["strait-", "iptables ", "nftables ", "limit"]
                    .iter()
                    .any(|s| l.starts_with(s))
            })
            .collect();
        assert_eq!(rows.len(), r.results.len(), "{t}");
        assert!(t.contains("ipvs: kube-proxy's ipvs mode"), "{t}");
        let row = rows
            .iter()
            .find(|l| {
                l.starts_with("strait-dsr-l2") && l.contains("1000") && l.contains("new-flows")
            })
            .unwrap();
        assert!(
            row.contains("0.600") && row.contains("75.0") && row.contains("300.0"),
            "{row}"
        );
        assert!(
            row.trim_end().ends_with(" 100.0"),
            "the last column is the XDP program's own ns: {row}"
        );
        assert!(t.contains("xdp ns"), "{t}");
        assert!(
            row.contains(" 400 ") && row.contains("0.000800") && row.contains(" 0.200 "),
            "{row}"
        );
        assert!(
            row.contains(" 200 ") && row.contains("0.000400") && row.contains(" 0.100 "),
            "{row}"
        );
        assert_eq!(significant(0.0083219), "0.00832");
        assert_eq!(significant(12.34), "12.3");
        assert_eq!(significant(1.0), "1.00");
    }

    #[test]
    fn dates_are_utc_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_000_000 + 3_661), "2026-11-18T12:07:41Z");
    }

    #[test]
    fn the_chart_is_a_png() {
        let r = sample();
        let path = std::env::temp_dir().join(format!("lr-chart-{}.png", std::process::id()));
        chart::render(&r, &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(bytes.len() > 10_000, "{} bytes", bytes.len());
    }
}
