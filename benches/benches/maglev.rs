//! Maglev: building a table at the paper's two sizes, and looking up a batch of flows.
//!
//! The paper (Eisenbud et al., NSDI 2016) reports 1.8 ms to build a 65537-slot
//! table for 1,000 backends and 22.9 ms for 655373 slots; `maglev_build` is that experiment.
//! `maglev_lookup` is the per-packet cost on a flow-table miss, in a batch of 1,024 as a worker
//! sees them, at both sizes (128 KiB of slots fits in L2, 1.25 MiB may not).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use strait_dataplane::hash::{hash_words, mix64};
use strait_dataplane::maglev::{build, Table, Weighted, DEFAULT_SIZE, LARGE_SIZE};

/// Backends per table, as in the paper.
const BACKENDS: u64 = 1_000;
/// Flow hashes looked up per iteration: one RX batch's worth.
const BATCH: usize = 1_024;

fn backends() -> Vec<Weighted> {
    (0..BACKENDS)
        .map(|i| Weighted {
            key: hash_words(0, &[0x0a00_0000 + i, 8080]),
            weight: 1,
        })
        .collect()
}

fn table(size: u32) -> Table {
    match build(&backends(), size) {
        Ok(t) => t,
        Err(e) => panic!("building M={size}: {e}"),
    }
}

fn bench_build(c: &mut Criterion) {
    let input = backends();
    let mut group = c.benchmark_group("maglev_build");
    // 65537 slots build in about a millisecond, 655373 in about 15: ten samples of the large
    // one are enough for a stable median and keep the run short.
    for (size, samples, time) in [(DEFAULT_SIZE, 50, 3), (LARGE_SIZE, 10, 5)] {
        group.sample_size(samples);
        group.measurement_time(Duration::from_secs(time));
        group.throughput(Throughput::Elements(u64::from(size)));
        group.bench_with_input(
            BenchmarkId::new("1000_backends", size),
            &size,
            |b, &size| {
                b.iter(|| build(black_box(&input), size));
            },
        );
    }
    group.finish();
}

fn bench_lookup(c: &mut Criterion) {
    let hashes: Vec<u64> = (0..BATCH as u64).map(|i| mix64(i + 1)).collect();
    let mut group = c.benchmark_group("maglev_lookup");
    group.throughput(Throughput::Elements(BATCH as u64));
    for size in [DEFAULT_SIZE, LARGE_SIZE] {
        let table = table(size);
        group.bench_with_input(BenchmarkId::new("batch_1024", size), &table, |b, table| {
            b.iter(|| {
                let mut acc = 0usize;
                for &h in black_box(&hashes) {
                    acc = acc.wrapping_add(table.lookup(h).unwrap_or(usize::MAX));
                }
                acc
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench_build, bench_lookup);
criterion_main!(benches);
