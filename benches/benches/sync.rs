//! What flow sync costs a worker: `Pipeline::process_batch` with sync off and on, in one
//! run, over the pipeline bench's 1,000 services.
//!
//! - `syn`: every frame a new flow, so with sync on every frame also pushes a 64-byte record
//!   to the worker's out ring. The ring is drained between batches, outside the timed section:
//!   on a gateway the sync thread drains it on another core, so what the worker pays is the
//!   push (and the cache line it writes), which is what this measures.
//! - `established_1k`: ACKs of established flows; with sync on each pays the state-change and
//!   refresh check, and sends nothing.
//!
//! The ratio of the `on` and `off` rows is the cost of sync per new flow (docs/fleet.md,
//! "Flow sync").

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use strait_benches::{Bench, Traffic, BATCH};
use strait_config::model::Mode;
use strait_dataplane::pipeline::Pipeline;
use strait_dataplane::sync::{mesh, ThreadEnds, SYNC_SLOTS};

const SERVICES: usize = 1_000;

fn bench_sync(c: &mut Criterion) {
    let mut group = c.benchmark_group("flow_sync");
    group
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .throughput(Throughput::Elements(BATCH as u64));
    let cases = [
        ("syn", Traffic::Syn, 0),
        ("established_1k", Traffic::Established, 1_000),
    ];
    for mode in [Mode::DsrL2, Mode::Nat] {
        for (name, traffic, flows) in cases {
            let capacity = match traffic {
                Traffic::Established | Traffic::Mix => (flows * 4usize).next_power_of_two(),
                Traffic::Syn => 1 << 20,
            };
            for sync in [false, true] {
                let (mut bench, mut thread) = if sync {
                    let (b, t) = synced(mode, traffic, flows, capacity);
                    (b, Some(t))
                } else {
                    (Bench::new(mode, traffic, SERVICES, flows, capacity), None)
                };
                let id = format!("{name}_sync_{}", if sync { "on" } else { "off" });
                group.bench_function(BenchmarkId::new(mode.as_str(), id), |b| {
                    b.iter_custom(|iters| {
                        (0..iters)
                            .map(|_| {
                                let spent = bench.batch();
                                if let Some(t) = thread.as_mut() {
                                    while t.from_worker.pop().is_some() {}
                                }
                                spent
                            })
                            .sum()
                    })
                });
                assert_eq!(bench.not_tx, 0, "{mode} {name}: frames not sent");
                if let Some(s) = &bench.pipe.sync {
                    assert_eq!(s.counters.export_full, 0, "the ring never fills here");
                    if traffic == Traffic::Syn && bench.pipe.counters.rx > 0 {
                        assert!(s.counters.exported > 0, "new flows are exported");
                    }
                }
            }
        }
    }
    group.finish();
}

/// A pipeline bench with sync on, and the sync thread's end of its out ring.
fn synced(mode: Mode, traffic: Traffic, flows: usize, capacity: usize) -> (Bench, ThreadEnds) {
    let mut bench = Bench::new(mode, traffic, SERVICES, flows, capacity);
    let (mut w, mut t) = mesh(1, SYNC_SLOTS);
    let pipe = std::mem::replace(
        &mut bench.pipe,
        Pipeline::new(0, 1, 8, Default::default(), 0),
    );
    bench.pipe = pipe.with_sync(w.pop().expect("one"));
    (bench, t.pop().expect("one"))
}

/// On a shared machine criterion's rows drift with the load between one row and the next;
/// here the off and on pipelines take turns batch by batch, so both see the same load, and
/// the medians of 4,000 batches each give the ratio (new flows, and established ones,
/// which only pay the state-change and refresh check). Printed to stderr.
fn interleaved(_: &mut Criterion) {
    let cases = [
        ("syn", Traffic::Syn, 0, 1 << 20),
        ("established_1k", Traffic::Established, 1_000, 1 << 14),
    ];
    for mode in [Mode::DsrL2, Mode::Nat] {
        for (name, traffic, flows, capacity) in cases {
            let mut off = Bench::new(mode, traffic, SERVICES, flows, capacity);
            let (mut on, mut ring) = synced(mode, traffic, flows, capacity);
            let (mut t_off, mut t_on) = (Vec::new(), Vec::new());
            for i in 0..8_000 {
                if i % 2 == 0 {
                    t_off.push(off.batch());
                } else {
                    t_on.push(on.batch());
                    while ring.from_worker.pop().is_some() {}
                }
            }
            t_off.sort_unstable();
            t_on.sort_unstable();
            let ns =
                |v: &[Duration], q: usize| v[v.len() * q / 100].as_nanos() as f64 / BATCH as f64;
            eprintln!(
                "flow_sync/{mode}/{name} interleaved, ns per frame: off p50 {:.1} p10 {:.1}, \
                 on p50 {:.1} p10 {:.1}; on/off p50 {:.3}, p10 {:.3}",
                ns(&t_off, 50),
                ns(&t_off, 10),
                ns(&t_on, 50),
                ns(&t_on, 10),
                ns(&t_on, 50) / ns(&t_off, 50),
                ns(&t_on, 10) / ns(&t_off, 10),
            );
            let sync = on.pipe.sync.as_ref().expect("sync on").counters;
            assert_eq!(sync.export_full, 0);
            if traffic == Traffic::Established {
                assert_eq!(sync.exported, 0, "established flows send nothing");
            }
        }
    }
}

criterion_group!(benches, bench_sync, interleaved);
criterion_main!(benches);
