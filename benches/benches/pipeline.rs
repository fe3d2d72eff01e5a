//! The whole per-packet step, `Pipeline::process_batch`, per forwarding mode, over 1,000 services of
//! 4 backends (service 0 with a 65537-slot Maglev table, the others 1021).
//!
//! - `established_1k`: ACKs of 1,000 flows already in the flow table, in a shuffled order;
//!   their entries stay in L1/L2, so this is the pipeline's instruction cost without the
//!   flow table's memory latency.
//! - `established_100k`: the same with 100,000 flows, whose entries (about 9 MB) mostly come
//!   from L3 or DRAM.
//! - `syn`: SYNs, every one a new 5-tuple: Maglev choice and flow-table insert (one entry a
//!   flow in every mode), into a table kept under a quarter full.
//!
//! One element is one frame; an iteration is a batch of 1,024. Restoring the frames between
//! batches (a 60-byte copy each, as the NIC's DMA would write them) happens outside the timed
//! section; see `strait_benches` for why. Core 0 of 1, so nat never hands off.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use strait_benches::{Bench, Traffic, BATCH};
use strait_config::model::Mode;

const SERVICES: usize = 1_000;

fn bench_pipeline(c: &mut Criterion) {
    let mut group = c.benchmark_group("pipeline");
    group
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .throughput(Throughput::Elements(BATCH as u64));
    // 100k established flows: a flow table (about 9 MB of entries) well beyond L2, and a
    // warm-up of a fraction of a second. 1k: everything stays in L1/L2.
    let cases = [
        ("established_1k", Traffic::Established, 1_000),
        ("established_100k", Traffic::Established, 100_000),
        ("syn", Traffic::Syn, 0),
    ];
    for mode in Mode::ALL {
        for (name, traffic, flows) in cases {
            // A quarter full at most: 8-way buckets then almost never overflow.
            let capacity = match traffic {
                Traffic::Established | Traffic::Mix => (flows * 4usize).next_power_of_two(),
                Traffic::Syn => 1 << 20,
            };
            let mut bench = Bench::new(mode, traffic, SERVICES, flows, capacity);
            group.bench_function(BenchmarkId::new(mode.as_str(), name), |b| {
                b.iter_custom(|iters| (0..iters).map(|_| bench.batch()).sum())
            });
            let c = &bench.pipe.counters;
            assert_eq!(bench.not_tx, 0, "{mode} {name}: frames not sent: {c:?}");
            if c.stateless_full > 0 {
                // A bucket and its group full of live entries refuse a new flow even in a
                // mostly empty table; that flow's packets are forwarded by Maglev alone (and
                // pay a failed insert each). Reported, not hidden.
                eprintln!(
                    "pipeline/{mode}/{name}: {} packets forwarded statelessly (bucket full)",
                    c.stateless_full
                );
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench_pipeline);
criterion_main!(benches);
