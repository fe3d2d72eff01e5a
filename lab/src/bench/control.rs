//! `strait-lab bench control`: how long an EndpointSlice change takes to become the table the
//! workers forward with, at 10,000 Services of 10 endpoints each.
//!
//! ```text
//! watch event (slice modified) ─► Controller::apply ─► reconcile: re-translate and
//!    validate the Service the slice is labelled for                          (timed)
//! ─► a publication                                                       (not timed)
//! ─► Gateway::handle(Event::Kube), the gateway's own code: the control core edits the
//!    merged configuration for the changed Services and their health checks, asks for a
//!    read of the routes and of the changed backends' next hops in the kernel's neighbour
//!    table (their MACs), updates the table from the live one (Builder::update); the
//!    driver reads, swaps (ArcSwap), brings the XDP steering maps in line and hands the
//!    replaced table back to the builder                                              (timed)
//! ```
//!
//! Everything `strait run --kube` runs for a change, except the network and the VIPs on an
//! interface: the events are made here as the API server would send them. By default (root)
//! the gateway runs with its AF_XDP worker and steering program on a veth in a network
//! namespace of the bench's own, and the backends (pod addresses) are routed via a router
//! whose MAC is in the neighbour table, so every change reads the table and the routes as in
//! a cluster. `--no-workers` measures the control path alone: no worker, no steering maps,
//! and backends that arrive with MACs.
//!
//! Services are LoadBalancer Services in `nat` mode on IPv6 documentation addresses (10,000
//! VIPs do not fit in the IPv4 documentation ranges), already listed; each measured change
//! replaces one endpoint of one Service's slice. After the changes, the run checks that the
//! incremental path ended where a full one would: the controller's list against a
//! translation from scratch, and the live table against a full build of that list; and that
//! every backend got its next-hop MAC.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ::kube::api::DynamicObject;
use ::kube::runtime::watcher::Event;
use serde::Serialize;
use serde_json::{json, Value};
use strait_config::model::{MacAddr, Mode, Service};
use strait_dataplane::table::{Builder, Port, ServiceTable};

use strait_control::core::Event as ControlEvent;
use strait_control::kubemodel::Controller;
use strait_control::kubemodel::Kind;
use strait_control::kubemodel::Settings;

#[derive(Debug, Serialize)]
struct Report {
    /// Whether the changes went through an AF_XDP worker's steering maps and the kernel's
    /// neighbour table ([`Target::Workers`]).
    workers: bool,
    services: usize,
    endpoints_per_service: usize,
    changes: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// Less the time the thread waited for a CPU during each change (see
    /// `bench::rules::run_queue_wait`): what a machine with a core to spare would see.
    on_cpu_p50_ms: f64,
    on_cpu_p99_ms: f64,
    /// Changes that waited for a CPU.
    preempted: usize,
    /// The dsr-l2 rows, when `--nodes` is above 0.
    dsr: Option<DsrReport>,
}

/// The dsr-l2 rows: Services under `externalTrafficPolicy: Local` whose pods run on
/// [`POD_NODES`] Nodes, and [`CLUSTER_SERVICES`] under `Cluster` (every Node a backend).
#[derive(Debug, Serialize)]
struct DsrReport {
    services: usize,
    cluster_services: usize,
    nodes: usize,
    /// EndpointSlice changes with only the Nodes the pods run on.
    slice_few_nodes: Timings,
    /// The same kind of change once every Node is listed, in the same run.
    slice_all_nodes: Timings,
    /// Node heartbeats: a Node watch event with new condition heartbeat times and
    /// resource version, through `Controller::apply` and, when it asks for one, a round
    /// and the gateway's update (as the source's loop does).
    heartbeat: Timings,
    /// Heartbeats that asked for a round.
    heartbeat_rounds: usize,
    /// With the worker, once every Node joined: one netlink read of the whole neighbour
    /// table and routes, and one of the routes and a changed Service's next hops (what a
    /// slice change reads), in milliseconds, each the mean of [`READS`].
    read_whole_ms: Option<f64>,
    read_hops_ms: Option<f64>,
}

/// Reads timed for [`DsrReport::read_whole_ms`] and [`DsrReport::read_hops_ms`].
const READS: u32 = 50;

#[derive(Debug, Serialize)]
struct Timings {
    count: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    on_cpu_p50_ms: f64,
    on_cpu_p99_ms: f64,
    preempted: usize,
}

impl Timings {
    fn of(mut times: Vec<Duration>, mut on_cpu: Vec<Duration>, preempted: usize) -> Self {
        times.sort();
        on_cpu.sort();
        Self {
            count: times.len(),
            p50_ms: ms(at(&times, 0.50)),
            p99_ms: ms(at(&times, 0.99)),
            max_ms: ms(times.last().copied().unwrap_or_default()),
            on_cpu_p50_ms: ms(at(&on_cpu, 0.50)),
            on_cpu_p99_ms: ms(at(&on_cpu, 0.99)),
            preempted,
        }
    }

    fn line(&self, what: &str) -> String {
        format!(
            "{what}, {} samples: p50 {:.4} ms, p99 {:.4} ms, max {:.3} ms; less CPU waits ({} waited): p50 {:.4} ms, p99 {:.4} ms",
            self.count, self.p50_ms, self.p99_ms, self.max_ms, self.preempted, self.on_cpu_p50_ms, self.on_cpu_p99_ms
        )
    }
}

/// Milliseconds, rounded to 0.1 µs.
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e7).round() / 1e4
}

/// The `p` quantile of sorted `v` (zero when empty).
fn at(v: &[Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]
}

fn service(i: usize) -> Value {
    json!({
        "kind": "Service", "apiVersion": "v1",
        "metadata": { "name": format!("svc{i}"), "namespace": "bench",
                      "creationTimestamp": "2026-01-01T00:00:00Z" },
        "spec": {
            "type": "LoadBalancer", "loadBalancerClass": strait_control::kubemodel::settings::DEFAULT_CLASS,
            "ipFamilies": ["IPv6"], "ipFamilyPolicy": "SingleStack",
            "ports": [{ "name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080 }]
        }
    })
}

fn endpoint(i: usize, e: usize, gen: usize) -> String {
    format!(
        "2001:db8:2:{:x}:{:x}::{:x}",
        i >> 16,
        i & 0xffff,
        e + 1 + gen * 100
    )
}

fn slice(i: usize, endpoints: usize, gen: usize) -> Value {
    let eps: Vec<Value> = (0..endpoints)
        .map(|e| {
            let g = if e == 0 { gen } else { 0 };
            json!({ "addresses": [endpoint(i, e, g)], "conditions": { "ready": true } })
        })
        .collect();
    json!({
        "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
        "metadata": { "name": format!("svc{i}-abc"), "namespace": "bench",
                      "labels": { "kubernetes.io/service-name": format!("svc{i}") } },
        "addressType": "IPv6",
        "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
        "endpoints": eps
    })
}

fn dynamic(v: Value) -> DynamicObject {
    serde_json::from_value(v).expect("a well-formed object")
}

fn list(ctl: &mut Controller, kind: Kind, objs: impl Iterator<Item = Value>) {
    ctl.apply(kind, Event::Init);
    for o in objs {
        ctl.apply(kind, Event::InitApply(dynamic(o)));
    }
    ctl.apply(kind, Event::InitDone);
}

/// Where the measured changes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A gateway with its AF_XDP worker and XDP steering program on a veth in a network
    /// namespace of its own (root): each change also updates the steering maps and reads
    /// the kernel's neighbour table for next-hop MACs, as in a cluster.
    Workers,
    /// The control path only (no root needed): no workers, no steering maps, and backends
    /// that arrive with MACs, so the neighbour table is not read.
    ControlOnly,
}

/// Prefix of the bench's namespace; the pid follows.
const NETNS_PREFIX: &str = "strait-bc-";

/// The bench's namespace (deleted on drop): `bench0` (the gateway's interface, worker on
/// queue 0) and its veth peer `bench1`; the backends' prefix 2001:db8:2::/48 is routed via
/// a router 2001:db8:1::1 whose MAC is a permanent neighbour entry, as pod addresses are
/// routed via their node. Namespaces of earlier runs that were killed (their pid is gone)
/// are removed first.
fn bench_namespace() -> anyhow::Result<crate::peers::Netns> {
    for e in std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(NETNS_PREFIX) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new("/proc").join(pid).exists() {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &name])
                .status();
        }
    }
    let ns = crate::peers::Netns::create(&format!("{NETNS_PREFIX}{}", std::process::id()))?;
    for cmd in [
        "link add bench0 type veth peer name bench1",
        "link set bench0 up",
        "link set bench1 up",
        "addr add 2001:db8:1::2/64 dev bench0 nodad",
        "neigh add 2001:db8:1::1 lladdr 02:00:00:00:01:01 dev bench0 nud permanent",
        "route add 2001:db8:2::/48 via 2001:db8:1::1 dev bench0",
    ] {
        let args: Vec<&str> = cmd.split(' ').collect();
        crate::peers::run_in(ns.name(), "ip", &args, None)?;
    }
    Ok(ns)
}

/// What one run measures (the command-line flags of `strait-lab bench control`).
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Run {
    /// Print JSON instead of a summary.
    #[arg(long)]
    pub json: bool,
    /// Services listed.
    #[arg(long, default_value_t = 10_000)]
    pub services: usize,
    /// Endpoints per Service.
    #[arg(long, default_value_t = 10)]
    pub endpoints: usize,
    /// Changes measured.
    #[arg(long, default_value_t = 20)]
    pub changes: usize,
    /// Measure the control path alone: no AF_XDP worker, steering program or neighbour
    /// reads (runs without root).
    #[arg(long)]
    pub no_workers: bool,
    /// Nodes of the dsr-l2 rows (0 leaves them out): slice changes first with the few
    /// Nodes the pods run on, then with this many, and a heartbeat stream over them.
    #[arg(long, default_value_t = 1_000)]
    pub nodes: usize,
    /// Node heartbeats measured (kubelet status updates that change no address,
    /// readiness or label).
    #[arg(long, default_value_t = 2_000)]
    pub heartbeats: usize,
}

impl Run {
    /// Where the measured changes go.
    pub fn target(&self) -> Target {
        if self.no_workers {
            Target::ControlOnly
        } else {
            Target::Workers
        }
    }
}

/// Runs the benchmark; prints a summary or JSON.
///
/// # Errors
/// When a table does not build, or (for [`Target::Workers`]) the namespace, the worker or
/// the steering program cannot be set up (not root).
pub fn run(opts: Run) -> anyhow::Result<()> {
    anyhow::ensure!(
        opts.services > 0 && opts.changes > 0,
        "--services and --changes must be at least 1"
    );
    if opts.nodes > 0 {
        anyhow::ensure!(
            opts.services >= 2 * opts.changes,
            "--services must be at least twice --changes (each dsr-l2 change is to a Service of its own)"
        );
        anyhow::ensure!(
            opts.nodes >= POD_NODES,
            "--nodes must be 0 or at least {POD_NODES}"
        );
    }
    if opts.target() == Target::ControlOnly {
        return measure(opts, None);
    }
    let ns = bench_namespace().map_err(|e| {
        anyhow::anyhow!("{e:#}\n(the bench with workers needs root; --no-workers measures the control path alone)")
    })?;
    let name = ns.name().to_owned();
    // A thread enters the namespace; the worker threads it starts are born in it, and the
    // namespace is deleted once they are stopped.
    super::in_netns(&name, || measure(opts, Some(&name)))?
}

fn measure(opts: Run, netns: Option<&str>) -> anyhow::Result<()> {
    let Run {
        json: json_out,
        services,
        endpoints,
        changes,
        ..
    } = opts;
    let workers = opts.target() == Target::Workers;
    // Without workers the interface is only where the neighbour table would be read.
    let iface = if workers { "bench0" } else { "lo" };
    let file = strait_config::parse(&format!(
        "[[gateway.interfaces]]\nname = \"{iface}\"\nqueues = [0]\n"
    ))?;
    let mut settings = Settings::new(file.gateway.clone());
    settings.mode = Mode::Nat;
    settings.pools = vec!["2001:db8:100::/104".parse()?];
    let ports = if workers {
        vec![strait_control::run::port_of("bench0")?]
    } else {
        vec![Port::new(MacAddr([2, 0, 0, 0, 0, 1]), 1500)]
    };

    let setup = Instant::now();
    let mut ctl = Controller::new(settings);
    list(&mut ctl, Kind::Services, (0..services).map(service));
    list(
        &mut ctl,
        Kind::EndpointSlices,
        (0..services).map(|i| slice(i, endpoints, 0)),
    );
    list(&mut ctl, Kind::Nodes, std::iter::empty());
    let round = ctl
        .reconcile()
        .ok_or_else(|| anyhow::anyhow!("controller not ready"))?;
    anyhow::ensure!(
        round.services.len() == services,
        "{} of {services} services translated",
        round.services.len()
    );
    // The gateway writes the addresses to the Services' status, and the watch brings each
    // Service back with it, before anything is measured.
    for up in &round.status {
        ctl.status_written(up);
    }
    for up in &round.status {
        let i: usize = up
            .name
            .strip_prefix("svc")
            .and_then(|i| i.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("status for an unknown service {}", up.name))?;
        let mut v = service(i);
        let ingress: Vec<Value> = up
            .addresses
            .iter()
            .map(|a| json!({ "ip": a.to_string() }))
            .collect();
        v["status"] = json!({ "loadBalancer": { "ingress": ingress } });
        ctl.apply(Kind::Services, Event::Apply(dynamic(v)));
    }
    let round = ctl
        .reconcile()
        .ok_or_else(|| anyhow::anyhow!("controller not ready"))?;
    anyhow::ensure!(
        round.status.is_empty() && round.changes.is_empty(),
        "{} status writes and {} changes left after the echoes",
        round.status.len(),
        round.changes.len()
    );
    let mut gw = Gateway::start(&file, &ports, workers)?;
    gw.publish_all(&round.services)?;
    if !json_out {
        println!(
            "{services} services x {endpoints} endpoints listed and built in {:.1?}{}",
            setup.elapsed(),
            if workers {
                ", with an AF_XDP worker and the XDP steering program on a veth"
            } else {
                " (--no-workers: control path only)"
            }
        );
        let t = Instant::now();
        let n = 20;
        for _ in 0..n {
            strait_control::neigh::table(iface)?;
        }
        println!(
            "reading the neighbour table and routes (netlink, {iface}): {:.3} ms each",
            t.elapsed().as_secs_f64() * 1e3 / f64::from(n)
        );
    }

    let mut times = Vec::with_capacity(changes);
    let (mut on_cpu, mut preempted) = (Vec::with_capacity(changes), 0);
    let mut last = round.services;
    for c in 0..changes {
        let i = (c * 7919) % services;
        let obj = dynamic(slice(i, endpoints, c + 1));
        let waited = crate::bench::rules::run_queue_wait();
        let t0 = Instant::now();
        ctl.apply(Kind::EndpointSlices, Event::Apply(obj));
        let round = ctl
            .reconcile()
            .ok_or_else(|| anyhow::anyhow!("controller not ready"))?;
        let controller = t0.elapsed();
        // Not timed: the publication (without workers, giving the changed services MACs).
        let p = gw.publication(&round.services, &round.changes);
        let t1 = Instant::now();
        gw.control.handle(ControlEvent::Kube(vec![p]))?;
        let took = controller + t1.elapsed();
        let wait = crate::bench::rules::run_queue_wait()
            .zip(waited)
            .map_or(Duration::ZERO, |(b, a)| b.saturating_sub(a));
        preempted += usize::from(!wait.is_zero());
        on_cpu.push(took.saturating_sub(wait));
        times.push(took);
        anyhow::ensure!(
            round.changes.len() == 1,
            "change {c}: {} services changed, not 1",
            round.changes.len()
        );
        last = round.services;
    }
    let live = gw.control.shared.table.load_full();
    check(&ctl, &last, &file, &ports, &live)?;
    anyhow::ensure!(
        live.backends.iter().flatten().all(|b| b.mac.is_some()),
        "backends left without a next-hop MAC: the bench measured probing, not forwarding"
    );
    gw.control.stop_workers();
    drop(gw);
    let nat = Timings::of(times, on_cpu, preempted);
    let dsr = if opts.nodes > 0 {
        Some(measure_dsr(&opts, &file, &ports, netns)?)
    } else {
        None
    };
    let r = Report {
        workers,
        services,
        endpoints_per_service: endpoints,
        changes,
        p50_ms: nat.p50_ms,
        p99_ms: nat.p99_ms,
        max_ms: nat.max_ms,
        on_cpu_p50_ms: nat.on_cpu_p50_ms,
        on_cpu_p99_ms: nat.on_cpu_p99_ms,
        preempted: nat.preempted,
        dsr,
    };
    if json_out {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "EndpointSlice change to live table, {} changes: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms\n\
             less CPU waits ({} of the changes waited): p50 {:.2} ms, p99 {:.2} ms",
            r.changes, r.p50_ms, r.p99_ms, r.max_ms, r.preempted, r.on_cpu_p50_ms, r.on_cpu_p99_ms
        );
        if let Some(d) = &r.dsr {
            println!(
                "dsr-l2: {} Services under externalTrafficPolicy: Local (pods on {POD_NODES} Nodes) and {} under Cluster",
                d.services, d.cluster_services
            );
            println!(
                "{}",
                d.slice_few_nodes
                    .line(&format!("  EndpointSlice change with {POD_NODES} Nodes"))
            );
            println!(
                "{}",
                d.slice_all_nodes
                    .line(&format!("  EndpointSlice change with {} Nodes", d.nodes))
            );
            println!(
                "{}",
                d.heartbeat.line(&format!(
                    "  Node heartbeat with {} Nodes ({} asked for a round)",
                    d.nodes, d.heartbeat_rounds
                ))
            );
            if let (Some(whole), Some(hops)) = (d.read_whole_ms, d.read_hops_ms) {
                println!(
                    "  netlink reads with {} Nodes' neighbour entries: the whole table {whole:.3} ms, \
                     the routes and {POD_NODES} next hops {hops:.3} ms",
                    d.nodes
                );
            }
        }
    }
    Ok(())
}

/// Nodes the pods of the dsr-l2 Services run on (each Service has an endpoint on each,
/// with 10 endpoints).
const POD_NODES: usize = 10;

/// dsr-l2 Services under `externalTrafficPolicy: Cluster`: every Node is their backend.
const CLUSTER_SERVICES: usize = 10;

/// Node `k`'s address, on the bench interface's segment (dsr-l2 reaches nodes by MAC).
fn node_address(k: usize) -> String {
    format!("2001:db8:1::1:{k:x}")
}

/// Node `k` as a kubelet reports it, with its `beat`-th heartbeat: labels, annotations,
/// capacity, four conditions with heartbeat times, addresses, node info and 30 images,
/// the bulk a Node watch event carries.
fn node(k: usize, beat: usize) -> Value {
    let t = format!(
        "2026-01-01T{:02}:{:02}:{:02}Z",
        (beat / 3600) % 24,
        (beat / 60) % 60,
        beat % 60
    );
    let cond = |ty: &str, status: &str, reason: &str, message: &str| {
        json!({ "type": ty, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": t, "lastTransitionTime": "2026-01-01T00:00:00Z" })
    };
    let images: Vec<Value> = (0..30)
        .map(|m| {
            json!({ "names": [format!("registry.example/team/app{m}@sha256:{m:064x}"),
                              format!("registry.example/team/app{m}:v1.{m}")],
                    "sizeBytes": 10_000_000 + m * 1_000 })
        })
        .collect();
    json!({
        "kind": "Node", "apiVersion": "v1",
        "metadata": {
            "name": format!("node{k}"), "uid": format!("00000000-0000-0000-0000-{k:012}"),
            "resourceVersion": (beat * 100_000 + k).to_string(),
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {
                "kubernetes.io/hostname": format!("node{k}"), "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "m5.large",
                "topology.kubernetes.io/zone": format!("zone-{}", k % 3)
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"
            }
        },
        "spec": { "podCIDR": format!("2001:db8:3:{k:x}::/64"),
                  "podCIDRs": [format!("2001:db8:3:{k:x}::/64")] },
        "status": {
            "capacity": { "cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi" },
            "allocatable": { "cpu": "7800m", "memory": "31Gi", "pods": "110", "ephemeral-storage": "92Gi" },
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                cond("Ready", "True", "KubeletReady", "kubelet is posting ready status")
            ],
            "addresses": [
                { "type": "InternalIP", "address": node_address(k) },
                { "type": "Hostname", "address": format!("node{k}") }
            ],
            "daemonEndpoints": { "kubeletEndpoint": { "Port": 10250 } },
            "nodeInfo": {
                "machineID": format!("{k:032x}"), "systemUUID": format!("{k:032x}"),
                "bootID": format!("{k:032x}"), "kernelVersion": "6.1.0-18-amd64",
                "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": "containerd://1.7.13", "kubeletVersion": "v1.35.0",
                "kubeProxyVersion": "v1.35.0", "operatingSystem": "linux", "architecture": "amd64"
            },
            "images": images
        }
    })
}

/// A dsr-l2 Service: `svc{i}` under `externalTrafficPolicy: Local`, `cl{i}` under
/// `Cluster`.
fn dsr_service(name: &str, local: bool) -> Value {
    json!({
        "kind": "Service", "apiVersion": "v1",
        "metadata": { "name": name, "namespace": "bench",
                      "creationTimestamp": "2026-01-01T00:00:00Z" },
        "spec": {
            "type": "LoadBalancer", "loadBalancerClass": strait_control::kubemodel::settings::DEFAULT_CLASS,
            "ipFamilies": ["IPv6"], "ipFamilyPolicy": "SingleStack",
            "externalTrafficPolicy": if local { "Local" } else { "Cluster" },
            "ports": [{ "name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080 }]
        }
    })
}

/// Service `svc{i}`'s slice: endpoint `e` on Node `(i + e) % POD_NODES`; without its
/// first endpoint when `drop_first` (its node then holds one pod fewer, or none).
fn dsr_slice(i: usize, endpoints: usize, drop_first: bool) -> Value {
    let eps: Vec<Value> = (usize::from(drop_first)..endpoints)
        .map(|e| {
            json!({ "addresses": [endpoint(i, e, 0)], "nodeName": format!("node{}", (i + e) % POD_NODES),
                    "conditions": { "ready": true, "serving": true, "terminating": false } })
        })
        .collect();
    json!({
        "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
        "metadata": { "name": format!("svc{i}-abc"), "namespace": "bench",
                      "labels": { "kubernetes.io/service-name": format!("svc{i}") } },
        "addressType": "IPv6",
        "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
        "endpoints": eps
    })
}

/// Permanent neighbour entries for Nodes `range` in the bench's namespace.
fn node_neighbours(netns: &str, range: std::ops::Range<usize>) -> anyhow::Result<()> {
    let batch: String = range
        .map(|k| {
            format!(
                "neigh replace {} lladdr 02:00:00:01:{:02x}:{:02x} dev bench0 nud permanent\n",
                node_address(k),
                k >> 8,
                k & 0xff
            )
        })
        .collect();
    crate::peers::run_in(netns, "ip", &["-batch", "-"], Some(&batch))?;
    Ok(())
}

/// What [`through`] measured: the time, the CPU wait during it, and the round's list and
/// number of changes when the event asked for a round.
type Through = (Duration, Duration, Option<(Vec<Arc<Service>>, usize)>);

/// One watch event through the controller and, when it asks for a round, the round, the
/// publication (not timed) and the gateway's update, as the source's loop and the control
/// loop run them.
fn through(
    ctl: &mut Controller,
    gw: &mut Gateway,
    kind: Kind,
    obj: DynamicObject,
) -> anyhow::Result<Through> {
    let waited = crate::bench::rules::run_queue_wait();
    let t0 = Instant::now();
    if !ctl.apply(kind, Event::Apply(obj)) {
        let took = t0.elapsed();
        let wait = crate::bench::rules::run_queue_wait()
            .zip(waited)
            .map_or(Duration::ZERO, |(b, a)| b.saturating_sub(a));
        return Ok((took, wait, None));
    }
    let round = ctl
        .reconcile()
        .ok_or_else(|| anyhow::anyhow!("controller not ready"))?;
    let controller = t0.elapsed();
    let p = gw.publication(&round.services, &round.changes);
    let t1 = Instant::now();
    gw.control.handle(ControlEvent::Kube(vec![p]))?;
    let took = controller + t1.elapsed();
    let wait = crate::bench::rules::run_queue_wait()
        .zip(waited)
        .map_or(Duration::ZERO, |(b, a)| b.saturating_sub(a));
    Ok((took, wait, Some((round.services, round.changes.len()))))
}

/// The dsr-l2 rows (see [`DsrReport`]).
fn measure_dsr(
    opts: &Run,
    file: &strait_config::model::Config,
    ports: &[Port],
    netns: Option<&str>,
) -> anyhow::Result<DsrReport> {
    let workers = netns.is_some();
    let mut settings = Settings::new(file.gateway.clone());
    settings.mode = Mode::DsrL2;
    settings.pools = vec!["2001:db8:100::/104".parse()?];
    let mut objects: std::collections::BTreeMap<String, Value> = (0..opts.services)
        .map(|i| format!("svc{i}"))
        .chain((0..CLUSTER_SERVICES).map(|i| format!("cl{i}")))
        .map(|n| {
            let v = dsr_service(&n, n.starts_with("svc"));
            (n, v)
        })
        .collect();
    if let Some(ns) = netns {
        node_neighbours(ns, 0..POD_NODES)?;
    }
    let mut ctl = Controller::new(settings);
    list(&mut ctl, Kind::Services, objects.values().cloned());
    list(
        &mut ctl,
        Kind::EndpointSlices,
        (0..opts.services).map(|i| dsr_slice(i, opts.endpoints, false)),
    );
    list(&mut ctl, Kind::Nodes, (0..POD_NODES).map(|k| node(k, 0)));
    let round = ctl
        .reconcile()
        .ok_or_else(|| anyhow::anyhow!("controller not ready"))?;
    for up in &round.status {
        ctl.status_written(up);
    }
    for up in &round.status {
        let v = objects
            .get_mut(&up.name)
            .ok_or_else(|| anyhow::anyhow!("status for an unknown service {}", up.name))?;
        let ingress: Vec<Value> = up
            .addresses
            .iter()
            .map(|a| json!({ "ip": a.to_string() }))
            .collect();
        v["status"] = json!({ "loadBalancer": { "ingress": ingress } });
        ctl.apply(Kind::Services, Event::Apply(dynamic(v.clone())));
    }
    let round = ctl
        .reconcile()
        .ok_or_else(|| anyhow::anyhow!("controller not ready"))?;
    anyhow::ensure!(
        round.services.len() == opts.services + CLUSTER_SERVICES,
        "{} of {} dsr services translated",
        round.services.len(),
        opts.services + CLUSTER_SERVICES
    );
    let mut gw = Gateway::start(file, ports, workers)?;
    gw.publish_all(&round.services)?;
    let mut last = round.services;

    // Slice changes, each removing one pod of a Service no change touched before.
    let slice_changes = |ctl: &mut Controller,
                         gw: &mut Gateway,
                         from: usize,
                         last: &mut Vec<Arc<Service>>|
     -> anyhow::Result<Timings> {
        let (mut times, mut on_cpu, mut preempted) = (Vec::new(), Vec::new(), 0);
        for c in from..from + opts.changes {
            let i = (c * 7919) % opts.services;
            let obj = dynamic(dsr_slice(i, opts.endpoints, true));
            let (took, wait, round) = through(ctl, gw, Kind::EndpointSlices, obj)?;
            let (services, n) =
                round.ok_or_else(|| anyhow::anyhow!("a slice change asked for no round"))?;
            anyhow::ensure!(n == 1, "dsr change {c}: {n} services changed, not 1");
            *last = services;
            preempted += usize::from(!wait.is_zero());
            on_cpu.push(took.saturating_sub(wait));
            times.push(took);
        }
        Ok(Timings::of(times, on_cpu, preempted))
    };
    let slice_few_nodes = slice_changes(&mut ctl, &mut gw, 0, &mut last)?;

    // The other Nodes join (not timed): the Cluster Services' backends grow to all.
    if let Some(ns) = netns {
        node_neighbours(ns, POD_NODES..opts.nodes)?;
    }
    for k in POD_NODES..opts.nodes {
        ctl.apply(Kind::Nodes, Event::Apply(dynamic(node(k, 0))));
    }
    let round = ctl
        .reconcile()
        .ok_or_else(|| anyhow::anyhow!("controller not ready"))?;
    anyhow::ensure!(
        round.changes.len() == CLUSTER_SERVICES,
        "{} services changed when the Nodes joined, not the {CLUSTER_SERVICES} under Cluster",
        round.changes.len()
    );
    let p = gw.publication(&round.services, &round.changes);
    gw.control.handle(ControlEvent::Kube(vec![p]))?;
    last = round.services;
    // What a slice change reads, against the whole table it used to read.
    let (read_whole_ms, read_hops_ms) = if workers {
        let targets: Vec<(std::net::IpAddr, bool)> = (0..POD_NODES)
            .map(|k| Ok((node_address(k).parse()?, false)))
            .collect::<anyhow::Result<_>>()?;
        let mean = |read: &dyn Fn() -> anyhow::Result<()>| -> anyhow::Result<f64> {
            let t = Instant::now();
            for _ in 0..READS {
                read()?;
            }
            Ok(t.elapsed().as_secs_f64() * 1e3 / f64::from(READS))
        };
        let whole = mean(&|| {
            strait_control::neigh::table("bench0")?;
            Ok(())
        })?;
        let hops = mean(&|| {
            strait_control::neigh::hop_entries("bench0", &targets)?;
            Ok(())
        })?;
        (Some(whole), Some(hops))
    } else {
        (None, None)
    };
    let slice_all_nodes = slice_changes(&mut ctl, &mut gw, opts.changes, &mut last)?;

    // Heartbeats: the Node as the kubelet sends it, new times and resource version.
    let (mut times, mut on_cpu, mut preempted, mut rounds) = (Vec::new(), Vec::new(), 0, 0);
    for h in 0..opts.heartbeats {
        let obj = dynamic(node(h % opts.nodes, 1 + h / opts.nodes));
        let (took, wait, round) = through(&mut ctl, &mut gw, Kind::Nodes, obj)?;
        if let Some((services, _)) = round {
            rounds += 1;
            last = services;
        }
        preempted += usize::from(!wait.is_zero());
        on_cpu.push(took.saturating_sub(wait));
        times.push(took);
    }
    let heartbeat = Timings::of(times, on_cpu, preempted);

    let live = gw.control.shared.table.load_full();
    check(&ctl, &last, file, ports, &live)?;
    anyhow::ensure!(
        live.backends.iter().flatten().all(|b| b.mac.is_some()),
        "dsr backends left without a next-hop MAC"
    );
    gw.control.stop_workers();
    Ok(DsrReport {
        services: opts.services,
        cluster_services: CLUSTER_SERVICES,
        nodes: opts.nodes,
        slice_few_nodes,
        slice_all_nodes,
        heartbeat,
        heartbeat_rounds: rounds,
        read_whole_ms,
        read_hops_ms,
    })
}

/// The gateway a row measures, as `strait run --kube` has it once the interfaces are known
/// (no VIPs on an interface), and how the controller's rounds reach it.
struct Gateway {
    control: strait_control::run::Driver,
    /// Whether it runs its worker and steering program ([`Target::Workers`]).
    workers: bool,
    macs: Macs,
}

impl Gateway {
    /// The gateway on `ports`, with its worker and steering program if `workers`.
    fn start(
        file: &strait_config::model::Config,
        ports: &[Port],
        workers: bool,
    ) -> anyhow::Result<Self> {
        let mut control = strait_control::run::Driver::with_ports(
            strait_control::run::ConfigSource::Builtin,
            file.clone(),
            ports.to_vec(),
        )?;
        if workers {
            control.start_workers()?;
        }
        Ok(Self {
            control,
            workers,
            macs: Macs::default(),
        })
    }

    /// The publication of a round's list and changes. Next-hop MACs: a gateway fills them
    /// from the kernel's neighbour table. With workers, backends arrive without MACs, as the
    /// controller makes them, and every change reads the table (the router's entry resolves
    /// them all). Without, every backend has one already ([`Macs`]), so the table is not read.
    fn publication(
        &mut self,
        services: &[Arc<Service>],
        changes: &[strait_control::kubemodel::Change],
    ) -> strait_control::kubemodel::Publication {
        if self.workers {
            strait_control::kubemodel::Publication {
                services: services.to_vec(),
                changes: changes.to_vec(),
            }
        } else {
            self.macs.publication(services, changes)
        }
    }

    /// The gateway's first table: every service of `services` published as changed.
    fn publish_all(&mut self, services: &[Arc<Service>]) -> anyhow::Result<()> {
        let all: Vec<strait_control::kubemodel::Change> = services
            .iter()
            .map(|s| (s.name.clone(), Some(Arc::clone(s))))
            .collect();
        let p = self.publication(services, &all);
        Ok(self.control.handle(ControlEvent::Kube(vec![p]))?)
    }
}

/// The controller's services with a MAC on every backend, kept across changes so that
/// only changed services are copied.
#[derive(Default)]
struct Macs(std::collections::HashMap<String, Arc<Service>>);

impl Macs {
    /// A publication of `services` and `changes` as the controller makes it, each service
    /// with its backends' MACs set.
    fn publication(
        &mut self,
        services: &[Arc<Service>],
        changes: &[strait_control::kubemodel::Change],
    ) -> strait_control::kubemodel::Publication {
        for (name, s) in changes {
            match s {
                Some(s) => {
                    let mut m = (**s).clone();
                    for b in &mut m.backends {
                        b.mac.get_or_insert(MacAddr([2, 0, 0, 0, 0, 2]));
                    }
                    self.0.insert(name.clone(), Arc::new(m));
                }
                None => {
                    self.0.remove(name);
                }
            }
        }
        let get = |s: &Arc<Service>| Arc::clone(self.0.get(&s.name).unwrap_or(s));
        strait_control::kubemodel::Publication {
            services: services.iter().map(get).collect(),
            changes: changes
                .iter()
                .map(|(n, s)| (n.clone(), s.as_ref().map(get)))
                .collect(),
        }
    }
}

/// The incremental path ended where a full one would: `list` (the controller's last) is a
/// translation from scratch, and `table` a full build of it, service by service.
fn check(
    ctl: &Controller,
    list: &[Arc<strait_config::model::Service>],
    file: &strait_config::model::Config,
    ports: &[Port],
    table: &ServiceTable,
) -> anyhow::Result<()> {
    let full = ctl.translate_all();
    anyhow::ensure!(
        full.services.len() == list.len() && full.services.iter().zip(list).all(|(a, b)| a == &**b),
        "the incremental translation differs from a full one"
    );
    let (merged, _) = strait_control::kubemodel::merge(file, list);
    let want = Builder::new().build(&merged, ports, |_, _, _| false)?;
    let view = |t: &ServiceTable| {
        let mut v: Vec<_> = t
            .services
            .iter()
            .map(|s| {
                let resolve = |ids: &[strait_dataplane::key::BackendId]| {
                    ids.iter()
                        .map(|&id| t.backend(id).map(|b| (b.socket_addr(), b.health)))
                        .collect::<Vec<_>>()
                };
                (
                    s.name.clone(),
                    s.frontend,
                    resolve(&s.backends),
                    resolve(&s.members),
                    s.maglev.size(),
                )
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    anyhow::ensure!(
        view(table) == view(&want),
        "the incrementally built table differs from a full build"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    fn small(target: super::Target) -> super::Run {
        super::Run {
            json: true,
            services: 50,
            endpoints: 3,
            changes: 3,
            no_workers: target == super::Target::ControlOnly,
            nodes: 30,
            heartbeats: 60,
        }
    }

    #[test]
    fn small_run_without_workers() {
        super::run(small(super::Target::ControlOnly)).expect("bench runs");
    }

    #[test]
    fn small_run_with_a_worker() {
        let root = nix::unistd::Uid::effective().is_root();
        if !root && std::env::var("STRAIT_SKIP_PRIVILEGED").as_deref() == Ok("1") {
            return;
        }
        super::run(small(super::Target::Workers)).expect("bench runs (needs root)");
    }
}
