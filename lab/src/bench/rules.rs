//! `strait-lab bench rule-update`: how long one endpoint change takes to take effect with
//! 10,000 services of 10 endpoints each, in Strait and in kube-proxy's two kernel modes.
//!
//! ```text
//! change k: service (k * 7919) % N, endpoint k % 10 -> a fresh address:port
//!
//! Strait     changed Service ──Builder::update(live table)──► ServiceTable
//!                                   ──ArcSwap::swap──► visible                        (timed)
//!                                   old table back to the builder (Builder::recycle) (timed apart)
//!            for comparison: new Config ──Builder::build──► ServiceTable (full build)   (timed)
//! iptables   throwaway netns: iptables-restore of the full ruleset (empty nat table)  (timed)
//!            then per change: kube-proxy's partial sync, --noflush                    (timed)
//! nftables   throwaway netns: nft -f of kube-proxy's full transaction                 (timed)
//!            then per change: the service's chains rewritten, the old endpoint deleted (timed)
//! ```
//!
//! Each change is applied on top of the previous ones, as churn in a cluster is. Strait's
//! clock starts when the changed service exists (what the Kubernetes controller hands the
//! control loop, see `strait-lab bench control`) and stops when the workers can load the new
//! table; freeing the replaced table happens after that, on the control thread, and is
//! reported on its own. The kernel numbers are
//! the wall time of the `iptables-restore` / `nft` process, as kube-proxy pays it, plus
//! `ip netns exec` (its own cost, `netns_exec_ms`, is measured and printed so it can be
//! taken off). Both tools read the whole loaded ruleset before changing it, so even a
//! one-endpoint update grows with the number of services.
//!
//! # Run time
//!
//! Two to three minutes at 10,000 services on a 2-core VM, most of it in one number.
//! kube-proxy's nftables transaction gives every service an anonymous verdict map
//! (`numgen random mod n vmap { ... }`), and the kernel binds each anonymous set by walking
//! the whole transaction so far (`__nft_set_trans_bind`, 59% of a perf profile at 2,000
//! services), so the full load is quadratic in services: 0.7 s at 1,000, 2.1 s at 2,000 and
//! 100 to 150 s at 10,000 (kernel 6.18, nftables 1.0.6). That is kube-proxy's real cost, so
//! it is measured as it is; `--services` makes a quicker run (the smoke test uses 300, about
//! a second).
//!
//! # Strait's build: incremental
//!
//! `Builder::update` makes the new table from the live one and the changed service: the
//! unchanged services are shared (`Arc<Service>`), the flat parts (the backend vector, one
//! entry per endpoint, and the frontend, fragment and nat-backend indexes) are copied, and
//! only the changed service's backends, index entries and Maglev table (12 µs at 1021
//! slots) are made again, into the allocations of the table it replaced
//! (`Builder::recycle`). Measured at 10,000 services (release, 2-core VM shared with
//! other builds, load average about 5, 50 changes): update + swap p50 0.45 ms, p99 4.5 ms
//! wall clock, of which 3 changes waited for a CPU; with those waits taken off p99
//! 1.66 ms, against the 1.65 ms target. The full `Builder::build` it replaces on this path
//! took 38.8 ms p50 (62 ms in the same run: a walk over every service and endpoint, even
//! with every unchanged Maglev table reused), and still serves starts and reloads. Nearly
//! all of what is left is the copies (`backends_copy_ms + indexes_copy_ms` in the
//! report); going below them needs the backend vector and indexes split into shared
//! chunks or persistent maps, which would add a step to the packet path's lookups. When
//! other work evicts the previous table from the caches between changes (a full build
//! run between every two updates), the copies cost more: p50 2.1 ms.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use arc_swap::ArcSwap;
use serde::Serialize;
use strait_config::model::{
    Backend, BackendState, Config, Gateway, Interface, MacAddr, Mode, Role, Service, Timeouts,
};
use strait_dataplane::hash::hash_words;
use strait_dataplane::maglev;
use strait_dataplane::table::{Builder, Change, Frontend, Port, ServiceTable};

use crate::peers::{self, KernelGateway, Netns, PeerKind, SvcSpec};

/// Services in the default run: 10,000, a large cluster's count.
pub const DEFAULT_SERVICES: usize = 10_000;
/// Endpoints per service.
pub const ENDPOINTS_PER_SERVICE: usize = 10;
/// Strait changes timed: 50 gives a p99 that is the worst of 50, enough to see a stall.
const STRAIT_CHANGES: usize = 50;
/// Kernel changes timed per mode: each costs a process that reads the whole loaded ruleset
/// and one kernel transaction (0.1 s at 1,000 services, 0.5 to 0.9 s at 10,000); the
/// median of 7 is stable.
const KERNEL_CHANGES: usize = 7;
/// Maglev size of every service but the first: a small prime fit for 10 endpoints (100
/// slots each keep the balance within about 1%), as a gateway with 10,000 small services
/// would configure it.
const SMALL_MAGLEV: u32 = 1021;
/// Stride between changed services: a prime, so successive changes touch services spread
/// over the table rather than neighbours.
const SERVICE_STRIDE: usize = 7919;
/// Seed for the Maglev identity keys of the profile's stand-alone builds.
const SEED_PROFILE: u64 = 0x5255_4c45_5550_4454; // "RULEUPDT"
/// The gateway's MAC in the synthetic configuration.
const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];

/// Median and 99th percentile of a set of timings, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Quantiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile (nearest rank: with 50 samples, the largest).
    pub p99: f64,
}

impl Quantiles {
    /// Nearest-rank quantiles of `samples`; zeros when there are none.
    pub fn of(samples: &[Duration]) -> Self {
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| {
            if ms.is_empty() {
                return 0.0;
            }
            let rank = (q * ms.len() as f64).ceil() as usize;
            ms[rank.clamp(1, ms.len()) - 1]
        };
        Self {
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}

/// How long this thread has waited for a CPU while runnable (the second field of
/// `/proc/thread-self/schedstat`, nanoseconds); `None` where the kernel does not say.
pub(crate) fn run_queue_wait() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// Where Strait's build spends its time, and what a build that touched only the changed
/// service would cost.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StraitProfile {
    /// A build by a fresh `Builder`, which has no Maglev table to reuse (the first build
    /// after a start), median of three.
    pub cold_build_ms: f64,
    /// A full `Builder::build` of each changed configuration by a warm builder (every
    /// unchanged Maglev table reused): what each change cost before `Builder::update`.
    pub full_build_ms: Quantiles,
    /// Every service's Maglev table built on its own, summed (median of three passes): most
    /// of `cold_build_ms`.
    pub maglev_all_ms: f64,
    /// One service's Maglev table (10 endpoints, 1021 slots; median over up to 1,000
    /// different services, each built once): all a warm build spends on Maglev for a
    /// one-endpoint change, since `Builder` reuses every unchanged table.
    pub one_maglev_ms: f64,
    /// The warm full build minus `one_maglev_ms`: the walk over every service and endpoint
    /// that `Builder::build` does (ids, per-service vectors, indexes, Maglev cache keys).
    pub walk_ms: f64,
    /// Copying the table's backend vector (one entry per endpoint): part of every
    /// `Builder::update` while `ServiceTable::backends` is one flat `Vec`.
    pub backends_copy_ms: f64,
    /// Copying two hash maps shaped like the table's private frontend and nat-backend
    /// indexes (one entry per service, one per endpoint), likewise.
    pub indexes_copy_ms: f64,
    /// `one_maglev_ms + backends_copy_ms + indexes_copy_ms`: what `Builder::update` should
    /// cost for one changed service; compare `strait_build_ms`.
    pub copy_on_write_estimate_ms: f64,
}

/// What `--json` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Services.
    pub services: usize,
    /// Endpoints per service.
    pub endpoints_per_service: usize,
    /// Strait: changed service to new table visible (`Builder::update` + swap), over 50
    /// changes.
    pub strait_swap_ms: Quantiles,
    /// Strait: `Builder::update` alone.
    pub strait_build_ms: Quantiles,
    /// Strait: update + swap less the time the thread waited for a CPU meanwhile (read
    /// from `/proc/thread-self/schedstat` around each change): the latency on a machine
    /// with a core to spare. On a shared 2-core VM the wall-clock p99 is mostly such
    /// waits.
    pub strait_swap_on_cpu_ms: Quantiles,
    /// Of the Strait changes, how many waited for a CPU.
    pub strait_changes_preempted: usize,
    /// Strait: handing the replaced table back to the builder after the swap
    /// (`Builder::recycle`, off the latency path).
    pub strait_drop_old_ms: Quantiles,
    /// Strait: where the build time goes.
    pub strait_profile: StraitProfile,
    /// `iptables-restore` of the full ruleset into a namespace's empty nat table (see
    /// [`KernelGateway`] for why not `--noflush`).
    pub iptables_restore_ms: f64,
    /// Median of the one-endpoint partial syncs (`--noflush`, kube-proxy 1.27+).
    pub iptables_update_ms: f64,
    /// `nft -f` of the full transaction into an empty namespace.
    pub nft_load_ms: f64,
    /// Median of the one-endpoint partial syncs.
    pub nft_update_ms: f64,
    /// One `add element` to the `service-ips` map (a new frontend for an existing chain).
    pub nft_add_element_ms: f64,
    /// Median cost of `ip netns exec NS true`, included in every kernel number above.
    pub netns_exec_ms: f64,
    /// `iptables --version` (the nf_tables and legacy back ends differ a lot).
    pub iptables_version: String,
    /// `nft --version`.
    pub nft_version: String,
}

/// Runs the benchmark with `services` services and prints a table, or the JSON of
/// [`Report`] when `json` is set. About a minute at 10,000 services, most of it in
/// `iptables-restore` and `nft`; needs root, iptables and nftables.
///
/// # Errors
///
/// Not root, a missing tool, a bad `services` count, or the failing command.
pub fn run(json: bool, services: usize) -> Result<()> {
    let report = measure(services)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", table(&report));
    }
    Ok(())
}

/// Measures everything; see the module docs.
///
/// # Errors
///
/// As [`run`].
pub fn measure(services: usize) -> Result<Report> {
    if services == 0 || services > peers::MAX_SYNTHETIC_SERVICES {
        bail!(
            "--services {services}: between 1 and {}",
            peers::MAX_SYNTHETIC_SERVICES
        );
    }
    let (iptables_version, nft_version) = prerequisites()?;
    let specs = peers::synthetic(services, ENDPOINTS_PER_SERVICE);

    eprintln!("rule-update: {services} services in Strait ...");
    let strait = measure_strait(&specs, STRAIT_CHANGES)?;
    let tag = std::process::id();
    let exec = netns_exec_cost(&format!("sp{tag}-rules-exec"))?;
    let ipt = measure_kernel(
        &format!("sp{tag}-rules-ipt"),
        PeerKind::Iptables,
        &specs,
        KERNEL_CHANGES,
    )?;
    let nft = measure_kernel(
        &format!("sp{tag}-rules-nft"),
        PeerKind::Nftables,
        &specs,
        KERNEL_CHANGES,
    )?;
    Ok(Report {
        services,
        endpoints_per_service: ENDPOINTS_PER_SERVICE,
        strait_swap_ms: strait.swap,
        strait_build_ms: strait.build,
        strait_swap_on_cpu_ms: strait.on_cpu,
        strait_changes_preempted: strait.preempted,
        strait_drop_old_ms: strait.drop_old,
        strait_profile: strait.profile,
        iptables_restore_ms: ms(ipt.load),
        iptables_update_ms: Quantiles::of(&ipt.updates).p50,
        nft_load_ms: ms(nft.load),
        nft_update_ms: Quantiles::of(&nft.updates).p50,
        nft_add_element_ms: ms(nft.extra),
        netns_exec_ms: ms(exec),
        iptables_version,
        nft_version,
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Root, `ip`, `iptables-restore` and `nft`; returns the two tools' versions.
fn prerequisites() -> Result<(String, String)> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!(
            "strait-lab bench rule-update needs root: it loads iptables and nftables rules into \
             throwaway network namespaces"
        );
    }
    peers_tool("ip", "-V", "iproute2")?;
    peers_tool("iptables-restore", "--version", "iptables")?;
    Ok((
        peers_tool("iptables", "--version", "iptables")?,
        peers_tool("nft", "--version", "nftables")?,
    ))
}

/// Runs `tool probe` (a version query) and returns its first output line.
fn peers_tool(tool: &str, probe: &str, package: &str) -> Result<String> {
    let out = std::process::Command::new(tool)
        .arg(probe)
        .output()
        .with_context(|| format!("cannot run `{tool} {probe}` (apt-get install -y {package})"))?;
    if !out.status.success() {
        bail!(
            "`{tool} {probe}` failed ({}); is {package} installed?",
            out.status
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned())
}

/// Change `k` of every run: endpoint `k % E` of service `(k * 7919) % N` becomes
/// [`peers::replacement_endpoint`]`(k)`. Applied in order `0, 1, ...` on top of each other.
/// Returns the service's index.
fn change(state: &mut [SvcSpec], k: usize) -> usize {
    let n = state.len();
    let at = (k * SERVICE_STRIDE) % n;
    let svc = &mut state[at];
    let i = k % svc.endpoints.len();
    svc.endpoints[i] = peers::replacement_endpoint(k);
    at
}

/// Strait's configuration for `specs`: `nat` services, service 0 with the default Maglev
/// size and the others [`SMALL_MAGLEV`], endpoints as backends with known MACs.
pub fn config(specs: &[SvcSpec]) -> Config {
    Config {
        gateway: Gateway {
            admin_listen: Gateway::DEFAULT_ADMIN_LISTEN,
            admin_socket: None,
            admin_token_file: None,
            default_mode: Mode::Nat,
            flow_capacity_per_core: Gateway::DEFAULT_FLOW_CAPACITY_PER_CORE,
            new_flows_per_second_per_core: Gateway::DEFAULT_NEW_FLOWS_PER_SECOND_PER_CORE,
            gue_port: Gateway::DEFAULT_GUE_PORT,
            tunnel_source_v4: None,
            tunnel_source_v6: None,
            mtu: Gateway::DEFAULT_MTU,
            timeouts: Timeouts::default(),
            interfaces: vec![Interface {
                name: "bench0".into(),
                queues: vec![0],
                cores: None,
                role: Role::Both,
                vlans: Vec::new(),
                driver: Default::default(),
            }],
            drain_grace: std::time::Duration::ZERO,
            bgp: None,
            l2: None,
            sync: None,
            dpdk: None,
        },
        services: specs
            .iter()
            .enumerate()
            .map(|(i, s)| service(i, s))
            .collect(),
    }
}

/// Service `i` of [`config`].
fn service(i: usize, s: &SvcSpec) -> Service {
    Service {
        name: format!("{}/{}", s.namespace, s.name),
        vip: IpAddr::V4(s.vip),
        port: s.port,
        protocol: s.protocol,
        mode: Mode::Nat,
        maglev_table_size: if i == 0 {
            Service::DEFAULT_MAGLEV_TABLE_SIZE
        } else {
            SMALL_MAGLEV
        },
        source_ranges: Vec::new(),
        session_affinity: None,
        health_check: None,
        passive_health: None,
        route: Default::default(),
        slow_start: None,
        backends: s
            .endpoints
            .iter()
            .map(|ep| {
                let o = ep.ip().octets();
                Backend {
                    address: IpAddr::V4(*ep.ip()),
                    port: ep.port(),
                    weight: Backend::DEFAULT_WEIGHT,
                    mac: Some(MacAddr([0x02, 0, 0, 0x01, o[3], 0])),
                    tunnel: None,
                    state: BackendState::Active,
                }
            })
            .collect(),
    }
}

/// Strait's results.
struct StraitResult {
    swap: Quantiles,
    on_cpu: Quantiles,
    preempted: usize,
    build: Quantiles,
    drop_old: Quantiles,
    profile: StraitProfile,
}

fn measure_strait(specs: &[SvcSpec], changes: usize) -> Result<StraitResult> {
    let ports = [Port::new(MacAddr(GW_MAC), 1500)];
    let mut builder = Builder::new();
    let mut cfg = config(specs);
    let first = builder
        .build(&cfg, &ports, |_, _, _| false)
        .context("building the first table")?;
    let live = ArcSwap::from_pointee(first);
    // The path `Builder::update` replaces, for comparison: a warm builder's full builds.
    let mut full = Builder::new();
    full.build(&cfg, &ports, |_, _, _| false)
        .context("building the first table")?;
    // The changed service's backends, as a table has them and as configured.
    let backends = |t: &ServiceTable, name: &str| -> Option<Vec<(IpAddr, u16)>> {
        let s = t.services.iter().find(|s| s.name == name)?;
        let mut v: Vec<(IpAddr, u16)> = s
            .backends
            .iter()
            .filter_map(|&id| t.backend(id))
            .map(|b| (b.address(), b.port))
            .collect();
        v.sort();
        Some(v)
    };
    let want = |svc: &Service| -> Option<Vec<(IpAddr, u16)>> {
        let mut v: Vec<(IpAddr, u16)> = svc.backends.iter().map(|b| (b.address, b.port)).collect();
        v.sort();
        Some(v)
    };
    // The incremental path alone, change after change, as the control loop runs it.
    let mut state = specs.to_vec();
    let (mut swap, mut build, mut drop_old) = (Vec::new(), Vec::new(), Vec::new());
    let (mut on_cpu, mut preempted) = (Vec::new(), 0);
    for k in 0..changes {
        // The changed service is what the controller hands the control loop: made before
        // the clock starts.
        let at = change(&mut state, k);
        let svc = service(at, &state[at]);
        let waited = run_queue_wait();
        let start = Instant::now();
        let table = builder
            .update(&live.load(), &[Change::Set(&svc)], |_, _, _| false)
            .context("updating the table")?;
        let built = start.elapsed();
        let old = live.swap(Arc::new(table));
        let visible = start.elapsed();
        let wait = run_queue_wait()
            .zip(waited)
            .map_or(Duration::ZERO, |(b, a)| b.saturating_sub(a));
        preempted += usize::from(!wait.is_zero());
        on_cpu.push(visible.saturating_sub(wait));
        let start = Instant::now();
        builder.recycle(old);
        drop_old.push(start.elapsed());
        build.push(built);
        swap.push(visible);
        anyhow::ensure!(
            backends(&live.load(), &svc.name) == want(&svc),
            "change {k}: {} has the wrong backends",
            svc.name
        );
    }
    // The same changes through full builds, for comparison.
    let mut state = specs.to_vec();
    let mut full_build = Vec::new();
    let mut last = None;
    for k in 0..changes {
        let at = change(&mut state, k);
        cfg = config(&state);
        let start = Instant::now();
        let t = full
            .build(&cfg, &ports, |_, _, _| false)
            .context("rebuilding the table")?;
        full_build.push(start.elapsed());
        let name = &cfg.services[at].name;
        anyhow::ensure!(
            backends(&t, name) == want(&cfg.services[at]),
            "change {k}: {name} has the wrong backends in the full build"
        );
        last = Some(t);
    }
    if let Some(t) = last {
        anyhow::ensure!(
            t.services.len() == live.load().services.len()
                && t.backends.iter().flatten().count()
                    == live.load().backends.iter().flatten().count(),
            "the incremental and the full table differ in size"
        );
    }
    let full_q = Quantiles::of(&full_build);
    let mut profile = profile(&cfg, &ports, &live.load(), full_q.p50)?;
    profile.full_build_ms = full_q;
    Ok(StraitResult {
        swap: Quantiles::of(&swap),
        on_cpu: Quantiles::of(&on_cpu),
        preempted,
        build: Quantiles::of(&build),
        drop_old: Quantiles::of(&drop_old),
        profile,
    })
}

/// Times a cold build, the Maglev tables on their own, single services' tables, and copies
/// of the flat parts of a table.
fn profile(
    cfg: &Config,
    ports: &[Port],
    table: &ServiceTable,
    build_p50_ms: f64,
) -> Result<StraitProfile> {
    let mut cold = Vec::new();
    for _ in 0..3 {
        let start = Instant::now();
        let t = Builder::new()
            .build(cfg, ports, |_, _, _| false)
            .context("building a table from scratch")?;
        cold.push(start.elapsed());
        drop(t);
    }
    let inputs: Vec<(Vec<maglev::Weighted>, u32)> = cfg
        .services
        .iter()
        .map(|s| {
            let w = s
                .backends
                .iter()
                .map(|b| maglev::Weighted {
                    key: identity(b),
                    weight: b.weight,
                })
                .collect();
            (w, s.maglev_table_size)
        })
        .collect();
    let mut passes = Vec::new();
    for _ in 0..3 {
        let start = Instant::now();
        for (w, size) in &inputs {
            std::hint::black_box(maglev::build(w, *size).context("maglev build")?);
        }
        passes.push(start.elapsed());
    }
    // Small services only (service 0 has the large table), each once: a build repeated on
    // the same input would train the branch predictor and look faster than a real change.
    let mut one = Vec::new();
    for (w, size) in inputs.iter().skip(1).take(1000) {
        let start = Instant::now();
        std::hint::black_box(maglev::build(w, *size).context("maglev build")?);
        one.push(start.elapsed());
    }
    let copy_time = |f: &dyn Fn()| {
        let mut runs = Vec::new();
        for _ in 0..5 {
            let start = Instant::now();
            f();
            runs.push(start.elapsed());
        }
        Quantiles::of(&runs).p50
    };
    let backends_copy_ms = copy_time(&|| {
        std::hint::black_box(table.backends.clone());
    });
    // Stand-ins for the table's frontend and nat-backend indexes, keyed alike by (address,
    // port, protocol) in the table's key form.
    let frontends: HashMap<Frontend, u32> = table
        .services
        .iter()
        .enumerate()
        .map(|(i, s)| (s.frontend, i as u32))
        .collect();
    let nat: HashMap<Frontend, ()> = table
        .backends
        .iter()
        .flatten()
        .map(|b| {
            (
                Frontend::new(b.address(), b.port, strait_dataplane::key::proto::TCP),
                (),
            )
        })
        .collect();
    let indexes_copy_ms = copy_time(&|| {
        std::hint::black_box((frontends.clone(), nat.clone()));
    });
    let one_maglev_ms = Quantiles::of(&one).p50;
    Ok(StraitProfile {
        cold_build_ms: Quantiles::of(&cold).p50,
        full_build_ms: Quantiles { p50: 0.0, p99: 0.0 },
        maglev_all_ms: Quantiles::of(&passes).p50,
        one_maglev_ms,
        walk_ms: (build_p50_ms - one_maglev_ms).max(0.0),
        backends_copy_ms,
        indexes_copy_ms,
        copy_on_write_estimate_ms: one_maglev_ms + backends_copy_ms + indexes_copy_ms,
    })
}

/// A stand-in Maglev identity (the table's own is private): a hash of address and port.
fn identity(b: &Backend) -> u64 {
    let a = match b.address {
        IpAddr::V4(a) => u64::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a) as u64,
    };
    hash_words(SEED_PROFILE, &[a, u64::from(b.port)])
}

/// Median wall time of `ip netns exec NS true` in a fresh namespace.
fn netns_exec_cost(name: &str) -> Result<Duration> {
    let ns = Netns::create(name)?;
    let mut runs = Vec::new();
    for _ in 0..9 {
        runs.push(peers::run_in(ns.name(), "true", &[], None)?.1);
    }
    runs.sort();
    Ok(runs[runs.len() / 2])
}

/// One kernel mode's results.
struct KernelResult {
    load: Duration,
    updates: Vec<Duration>,
    /// nftables: one `add element`.
    extra: Duration,
}

fn measure_kernel(
    name: &str,
    kind: PeerKind,
    specs: &[SvcSpec],
    changes: usize,
) -> Result<KernelResult> {
    let ns = Netns::create(name)?;
    let note = match kind {
        PeerKind::Nftables => {
            " (one transaction, quadratic in the kernel: 1.5 to 2.5 min at 10,000)"
        }
        _ => "",
    };
    eprintln!(
        "rule-update: loading {} services into {} in {name}{note} ...",
        specs.len(),
        kind.as_str()
    );
    let mut gw = KernelGateway::up(ns.name(), kind, specs)
        .with_context(|| format!("loading the {} rules", kind.as_str()))?;
    let load = gw.load_time();
    let mut updates = Vec::new();
    let mut state = specs.to_vec();
    for k in 0..changes {
        change(&mut state, k);
        updates.push(
            gw.update(&state)
                .with_context(|| format!("updating the {} rules", kind.as_str()))?,
        );
    }
    let mut extra = Duration::ZERO;
    if kind == PeerKind::Nftables {
        // A second frontend for the first service's chain: the smallest change nft makes.
        let s = &gw.services()[0];
        let element = format!(
            "add element ip kube-proxy service-ips {{ 203.0.113.255 . tcp . {} : goto {} }}",
            s.port,
            s.nft_chain()
        );
        extra = peers::run_in(ns.name(), "nft", &["-f", "-"], Some(&element))?.1;
    }
    gw.down()
        .with_context(|| format!("removing the {} rules", kind.as_str()))?;
    Ok(KernelResult {
        load,
        updates,
        extra,
    })
}

/// The human-readable report.
pub fn table(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Rule update latency: {} services x {} endpoints, one endpoint changed per update",
        r.services, r.endpoints_per_service
    );
    let _ = writeln!(s, "{:<44} {:>12} {:>12}", "", "p50 ms", "p99 ms");
    let mut row = |name: &str, p50: f64, p99: Option<f64>| {
        let p99 = p99.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
        let _ = writeln!(s, "{name:<44} {p50:>12.3} {p99:>12}");
    };
    row(
        "strait: update + swap (visible)",
        r.strait_swap_ms.p50,
        Some(r.strait_swap_ms.p99),
    );
    row(
        "strait: update alone",
        r.strait_build_ms.p50,
        Some(r.strait_build_ms.p99),
    );
    row(
        &format!(
            "  less CPU waits ({} of the changes waited)",
            r.strait_changes_preempted
        ),
        r.strait_swap_on_cpu_ms.p50,
        Some(r.strait_swap_on_cpu_ms.p99),
    );
    row(
        "strait: recycle the old table (after)",
        r.strait_drop_old_ms.p50,
        Some(r.strait_drop_old_ms.p99),
    );
    let p = &r.strait_profile;
    row("update estimate: one Maglev table", p.one_maglev_ms, None);
    row("  + copy the backend vector", p.backends_copy_ms, None);
    row("  + copy the two indexes", p.indexes_copy_ms, None);
    row("  = estimate", p.copy_on_write_estimate_ms, None);
    row(
        "strait: full build instead (warm Builder)",
        p.full_build_ms.p50,
        Some(p.full_build_ms.p99),
    );
    row("  of it: one Maglev table", p.one_maglev_ms, None);
    row("  of it: the walk over every service", p.walk_ms, None);
    row("strait: cold build (fresh Builder)", p.cold_build_ms, None);
    row("  of it: every Maglev table", p.maglev_all_ms, None);
    row(
        "iptables-restore: full ruleset",
        r.iptables_restore_ms,
        None,
    );
    row(
        "iptables-restore: one-endpoint update",
        r.iptables_update_ms,
        None,
    );
    row("nft -f: full ruleset", r.nft_load_ms, None);
    row("nft -f: one-endpoint update", r.nft_update_ms, None);
    row("nft: add one map element", r.nft_add_element_ms, None);
    row(
        "(ip netns exec overhead, in the above)",
        r.netns_exec_ms,
        None,
    );
    let _ = writeln!(s, "{}; {}", r.iptables_version, r.nft_version);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let d: Vec<Duration> = (1..=50).map(Duration::from_millis).collect();
        let q = Quantiles::of(&d);
        assert_eq!(q.p50, 25.0);
        assert_eq!(q.p99, 50.0);
        assert_eq!(Quantiles::of(&[]).p50, 0.0);
        let q = Quantiles::of(&[Duration::from_millis(3)]);
        assert_eq!((q.p50, q.p99), (3.0, 3.0));
    }

    #[test]
    fn each_change_moves_one_endpoint() {
        let specs = peers::synthetic(20, 10);
        let mut before = specs.clone();
        for k in 0..5 {
            let mut after = before.clone();
            change(&mut after, k);
            let diffs: Vec<(usize, usize)> = before
                .iter()
                .zip(&after)
                .enumerate()
                .flat_map(|(i, (b, a))| {
                    b.endpoints
                        .iter()
                        .zip(&a.endpoints)
                        .enumerate()
                        .filter(|(_, (x, y))| x != y)
                        .map(move |(j, _)| (i, j))
                })
                .collect();
            assert_eq!(
                diffs,
                vec![((k * SERVICE_STRIDE) % 20, k % 10)],
                "change {k}"
            );
            before = after;
        }
    }

    #[test]
    fn the_strait_side_builds_and_swaps() {
        let specs = peers::synthetic(30, ENDPOINTS_PER_SERVICE);
        let cfg = config(&specs);
        assert_eq!(cfg.services.len(), 30);
        assert_eq!(cfg.services[0].maglev_table_size, 65_537);
        assert_eq!(cfg.services[1].maglev_table_size, SMALL_MAGLEV);
        let r = measure_strait(&specs, 4).unwrap();
        assert!(r.swap.p50 >= r.build.p50 && r.swap.p99 >= r.swap.p50);
        let p = r.profile;
        assert!(p.full_build_ms.p50 > 0.0);
        assert!(p.maglev_all_ms > 0.0 && p.one_maglev_ms > 0.0);
        assert!(p.cold_build_ms > p.one_maglev_ms);
    }
}
