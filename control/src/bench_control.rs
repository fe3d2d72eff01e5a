//! `strait bench control`: how long an EndpointSlice change takes to become the table the
//! workers forward with, at 10,000 Services of 10 endpoints each.
//!
//! ```text
//! watch event (slice modified) ─► Controller::apply ─► reconcile: re-translate and
//!    validate the Service the slice is labelled for                          (timed)
//! ─► a publication, the changed Service given backend MACs               (not timed)
//! ─► Control::apply_kube, the gateway's own code: the merged configuration edited for
//!    the changed Services, their health checks, next-hop MACs (the neighbour table is
//!    read only when a changed backend lacks one), Builder::update from the live table,
//!    ArcSwap::swap, the replaced table back to the builder                   (timed)
//! ```
//!
//! Everything `strait run --kube` runs for a change, except the network, the VIPs on an
//! interface and the steering maps (no workers here): the events are made here as the API
//! server would send them. Services are LoadBalancer Services in `nat` mode on IPv6
//! documentation addresses (10,000 VIPs do not fit in the IPv4 documentation ranges),
//! already listed; each measured change replaces one endpoint of one Service's slice. Their
//! backends carry MACs, so the neighbour table is not read per change; what one read of it
//! costs (`ip -j neigh`, a process) is printed separately. After the changes, the run
//! checks that the incremental path ended where a full one would: the controller's list
//! against a translation from scratch, and the live table against a full build of that
//! list.
//!
//! Measured (release, 2-core VM shared with a CI run; 10,000 x 10, 20 changes): p50
//! 2.41 ms, p99 6.82 ms. Before `apply_kube` was made proportional to the change it was
//! p50 12.24 ms, p99 21.58 ms: every change deep-copied the merged configuration twice,
//! synced health checks and VIPs over all Services, and read the neighbour table (about
//! 7 ms under that load). The controller and `Builder::update` alone measured p50
//! 1.7 ms, p99 2.4 ms: the changed Service's Maglev table (65,537 slots, about 0.9 ms),
//! copying the table's flat parts (about 0.5 ms, see `strait bench rule-update`), and
//! the round itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ::kube::api::DynamicObject;
use ::kube::runtime::watcher::Event;
use serde::Serialize;
use serde_json::{json, Value};
use strait_config::model::{MacAddr, Mode, Service};
use strait_dataplane::table::{Builder, Port, ServiceTable};

use crate::kube::stats::Kind;
use crate::kube::watch::Controller;
use crate::kube::Settings;

#[derive(Debug, Serialize)]
struct Report {
    services: usize,
    endpoints_per_service: usize,
    changes: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// Less the time the thread waited for a CPU during each change (see
    /// `bench_rules::run_queue_wait`): what a machine with a core to spare would see.
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
            "type": "LoadBalancer", "loadBalancerClass": crate::kube::settings::DEFAULT_CLASS,
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

/// Runs the benchmark with `services` Services of `endpoints` endpoints and `changes`
/// measured changes; prints a summary or JSON.
///
/// # Errors
/// When a table does not build.
pub fn run(
    json_out: bool,
    services: usize,
    endpoints: usize,
    changes: usize,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        services > 0 && changes > 0,
        "--services and --changes must be at least 1"
    );
    let file = strait_config::parse("[[gateway.interfaces]]\nname = \"bench0\"\nqueues = [0]\n")?;
    let mut settings = Settings::new(file.gateway.clone());
    settings.mode = Mode::Nat;
    settings.pools = vec!["2001:db8:100::/104".parse()?];
    let ports = [Port {
        mac: [2, 0, 0, 0, 0, 1],
        mtu: 1500,
    }];

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
    // The gateway itself, as `strait run --kube` has it once the interfaces are known: no
    // workers (so no steering maps to write) and no VIPs on an interface.
    let mut control =
        crate::run::Control::with_ports(crate::run::Source::Builtin, file.clone(), ports.to_vec())?;
    let (_feed, lists) = std::sync::mpsc::channel();
    control.follow_kube(lists);
    // Next-hop MACs: a `nat` gateway fills them from the kernel's neighbour table; here
    // every backend has one already, so the fill finds nothing missing and probes nothing
    // (the table is still read, as the gateway reads it).
    let mut macs = Macs::default();
    let all: Vec<crate::kube::Change> = round
        .services
        .iter()
        .map(|s| (s.name.clone(), Some(Arc::clone(s))))
        .collect();
    control.apply_kube(vec![macs.publication(&round.services, &all)])?;
    if !json_out {
        println!(
            "{services} services x {endpoints} endpoints listed and built in {:.1?}",
            setup.elapsed()
        );
        let t = Instant::now();
        let n = 20;
        for _ in 0..n {
            let _ = crate::neigh::table("lo");
        }
        println!(
            "reading the neighbour table (`ip -j neigh`, lo): {:.2} ms each",
            t.elapsed().as_secs_f64() * 1e3 / f64::from(n)
        );
    }

    let mut times = Vec::with_capacity(changes);
    let (mut on_cpu, mut preempted) = (Vec::with_capacity(changes), 0);
    let mut last = round.services;
    for c in 0..changes {
        let i = (c * 7919) % services;
        let obj = dynamic(slice(i, endpoints, c + 1));
        let waited = crate::bench_rules::run_queue_wait();
        let t0 = Instant::now();
        ctl.apply(Kind::EndpointSlices, Event::Apply(obj));
        let round = ctl
            .reconcile()
            .ok_or_else(|| anyhow::anyhow!("controller not ready"))?;
        let controller = t0.elapsed();
        // Not timed: giving the changed services MACs.
        let publication = macs.publication(&round.services, &round.changes);
        let t1 = Instant::now();
        control.apply_kube(vec![publication])?;
        let took = controller + t1.elapsed();
        let wait = crate::bench_rules::run_queue_wait()
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
    times.sort();
    on_cpu.sort();
    let ms = |d: Duration| (d.as_secs_f64() * 1e5).round() / 100.0;
    let at =
        |v: &[Duration], p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1];
    let pct = |p: f64| at(&times, p);
    let r = Report {
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
        changes: &[crate::kube::Change],
    ) -> crate::kube::Publication {
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
        crate::kube::Publication {
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
    let (merged, _) = crate::kube::merge(file, list);
    let want = Builder::new().build(&merged, ports, |_, _, _| false)?;
    let view = |t: &ServiceTable| {
        let mut v: Vec<_> = t
            .services
            .iter()
            .map(|s| {
                let resolve = |ids: &[strait_dataplane::key::BackendId]| {
                    ids.iter()
                        .map(|&id| t.backend(id).map(|b| (b.addr, b.port, b.health)))
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
    #[test]
    fn small_run_completes() {
        super::run(true, 50, 3, 3).expect("bench runs");
    }
}
