//! `strait-lab bench control`: how long an EndpointSlice change takes to become the table the
//! workers forward with, at 10,000 Services of 10 endpoints each.
//!
//! ```text
//! watch event (slice modified) ─► Controller::apply ─► reconcile: re-translate and
//!    validate the Service the slice is labelled for                          (timed)
//! ─► a publication                                                       (not timed)
//! ─► Gateway::handle(Event::Kube), the gateway's own code: the control core edits the
//!    merged configuration for the changed Services and their health checks, asks for a
//!    read of the kernel's neighbour table and routes (next-hop MACs), updates the table
//!    from the live one (Builder::update); the driver reads, swaps (ArcSwap), brings the
//!    XDP steering maps in line and hands the replaced table back to the builder     (timed)
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
use strait_control::kube::stats::Kind;
use strait_control::kube::watch::Controller;
use strait_control::kube::Settings;

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
}

fn service(i: usize) -> Value {
    json!({
        "kind": "Service", "apiVersion": "v1",
        "metadata": { "name": format!("svc{i}"), "namespace": "bench",
                      "creationTimestamp": "2026-01-01T00:00:00Z" },
        "spec": {
            "type": "LoadBalancer", "loadBalancerClass": strait_control::kube::settings::DEFAULT_CLASS,
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
    if opts.target() == Target::ControlOnly {
        return measure(opts);
    }
    let ns = bench_namespace().map_err(|e| {
        anyhow::anyhow!("{e:#}\n(the bench with workers needs root; --no-workers measures the control path alone)")
    })?;
    let path = format!("/run/netns/{}", ns.name());
    // A thread enters the namespace; the worker threads it starts are born in it, and the
    // namespace is deleted once they are stopped.
    std::thread::scope(|s| {
        s.spawn(|| {
            let f = std::fs::File::open(&path).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
            nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| anyhow::anyhow!("entering {path}: {e}"))?;
            measure(opts)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the bench thread panicked"))?
    })
}

fn measure(opts: Run) -> anyhow::Result<()> {
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
    // The gateway itself, as `strait run --kube` has it once the interfaces are known: with
    // its worker and steering program (Target::Workers), no VIPs on an interface.
    let mut control = strait_control::run::Gateway::with_ports(
        strait_control::run::Source::Builtin,
        file.clone(),
        ports.to_vec(),
    )?;
    if workers {
        control.start_workers()?;
    }
    // Next-hop MACs: a `nat` gateway fills them from the kernel's neighbour table. With
    // workers, backends arrive without MACs, as the controller makes them, and every change
    // reads the table (the router's entry resolves them all). Without, every backend has one
    // already, so the table is not read.
    let mut macs = Macs::default();
    let mut publication = |services: &[Arc<Service>], changes: &[strait_control::kube::Change]| {
        if workers {
            strait_control::kube::Publication {
                services: services.to_vec(),
                changes: changes.to_vec(),
            }
        } else {
            macs.publication(services, changes)
        }
    };
    let all: Vec<strait_control::kube::Change> = round
        .services
        .iter()
        .map(|s| (s.name.clone(), Some(Arc::clone(s))))
        .collect();
    control.handle(ControlEvent::Kube(vec![publication(&round.services, &all)]))?;
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
        let p = publication(&round.services, &round.changes);
        let t1 = Instant::now();
        control.handle(ControlEvent::Kube(vec![p]))?;
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
    let live = control.shared.table.load_full();
    check(&ctl, &last, &file, &ports, &live)?;
    anyhow::ensure!(
        live.backends.iter().flatten().all(|b| b.mac.is_some()),
        "backends left without a next-hop MAC: the bench measured probing, not forwarding"
    );
    control.stop_workers();
    times.sort();
    on_cpu.sort();
    let ms = |d: Duration| (d.as_secs_f64() * 1e5).round() / 100.0;
    let at =
        |v: &[Duration], p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1];
    let pct = |p: f64| at(&times, p);
    let r = Report {
        workers,
        services,
        endpoints_per_service: endpoints,
        changes,
        p50_ms: ms(pct(0.50)),
        p99_ms: ms(pct(0.99)),
        max_ms: ms(*times.last().unwrap_or(&Duration::ZERO)),
        on_cpu_p50_ms: ms(at(&on_cpu, 0.50)),
        on_cpu_p99_ms: ms(at(&on_cpu, 0.99)),
        preempted,
    };
    if json_out {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "EndpointSlice change to live table, {} changes: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms\n\
             less CPU waits ({} of the changes waited): p50 {:.2} ms, p99 {:.2} ms",
            r.changes, r.p50_ms, r.p99_ms, r.max_ms, r.preempted, r.on_cpu_p50_ms, r.on_cpu_p99_ms
        );
    }
    Ok(())
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
        changes: &[strait_control::kube::Change],
    ) -> strait_control::kube::Publication {
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
        strait_control::kube::Publication {
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
    let (merged, _) = strait_control::kube::merge(file, list);
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
