//! `strait-lab bench maglev`: how long a Maglev table takes to build at the paper's sizes, how
//! evenly it spreads equal-weight backends, and how many slots move when 1% of them leave.
//!
//! The paper (Eisenbud et al., NSDI 2016) builds a 65537-slot table for 1,000
//! backends in 1.8 ms and a 655373-slot one in 22.9 ms; these rows are the same experiment
//! here. A slot whose owner changes re-hashes every new flow that lands on it, so the
//! disruption row is compared with its floor: the share of slots the leaving backends held.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;
use strait_dataplane::hash::hash_words;
use strait_dataplane::maglev::{build, Table, Weighted, DEFAULT_SIZE, LARGE_SIZE};

/// Backends per table, as in the paper's measurement.
const BACKENDS: usize = 1_000;
/// Builds timed per size; the median of five ignores one cold or preempted run either way.
const BUILDS: usize = 5;
/// Backends removed for the disruption figure: 1% of [`BACKENDS`].
const REMOVED: usize = BACKENDS / 100;
/// Seed for the synthetic backends' identity hashes (ASCII "BENCHMGV").
const SEED_BACKEND: u64 = 0x4245_4e43_484d_4756;

/// One table size's results; also the JSON shape printed by `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Slots in the table, `M`.
    pub table_size: u32,
    /// Equal-weight backends in the table.
    pub backends: usize,
    /// Median wall time of one build, in milliseconds.
    pub build_ms: f64,
    /// The most slots any backend holds, over the mean; 1.0 is perfect balance.
    pub max_over_mean: f64,
    /// Percentage of all slots whose backend changed when 1% of the backends left.
    pub moved_pct_on_1pct_removal: f64,
    /// Percentage of all slots the leaving backends held: the least any scheme must move.
    pub minimum_pct: f64,
}

/// Runs the measurement and prints a table, or a JSON array of [`Row`] when `json` is set.
///
/// Takes well under a second in a release build.
///
/// # Errors
///
/// If a table fails to build (it cannot with these constants) or the JSON fails to encode.
pub fn run(json: bool) -> Result<()> {
    let rows = [DEFAULT_SIZE, LARGE_SIZE]
        .into_iter()
        .map(measure)
        .collect::<Result<Vec<_>>>()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!("Maglev, {BACKENDS} equal-weight backends, median of {BUILDS} builds");
    println!(
        "{:>10} {:>8} {:>10} {:>13} {:>22} {:>10}",
        "table_size",
        "backends",
        "build_ms",
        "max_over_mean",
        "moved_pct_1pct_removal",
        "minimum_pct"
    );
    for r in &rows {
        println!(
            "{:>10} {:>8} {:>10.3} {:>13.4} {:>22.3} {:>10.3}",
            r.table_size,
            r.backends,
            r.build_ms,
            r.max_over_mean,
            r.moved_pct_on_1pct_removal,
            r.minimum_pct
        );
    }
    Ok(())
}

/// Synthetic backends 10.0.x.y:8080, keyed the way a caller keys real ones: a hash of the
/// address and port.
fn backends(n: usize) -> Vec<Weighted> {
    (0..n as u64)
        .map(|i| Weighted {
            key: hash_words(SEED_BACKEND, &[0x0a00_0000 + i, 8080]),
            weight: 1,
        })
        .collect()
}

fn measure(size: u32) -> Result<Row> {
    let all = backends(BACKENDS);
    let mut times = Vec::with_capacity(BUILDS);
    let mut table = None;
    for _ in 0..BUILDS {
        let start = Instant::now();
        let built = build(&all, size).with_context(|| format!("building M={size}"))?;
        times.push(start.elapsed());
        table = Some(built);
    }
    let table = table.context("no build ran")?;
    times.sort();
    let build_ms = times.get(BUILDS / 2).map_or(0.0, Duration::as_secs_f64) * 1e3;

    let counts = table.count_per_backend(all.len());
    let max = counts.iter().copied().max().unwrap_or(0);
    let mean = f64::from(size) / all.len() as f64;

    // Remove every 100th backend. Owners are compared by key: indices shift when the input
    // shrinks, identities do not.
    let step = BACKENDS / REMOVED;
    let kept: Vec<Weighted> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| i % step != 0)
        .map(|(_, b)| *b)
        .collect();
    let after = build(&kept, size).with_context(|| format!("building M={size} after removal"))?;
    let moved = moved_slots(&table, &all, &after, &kept);
    let removed_slots: u64 = counts.iter().step_by(step).map(|&c| u64::from(c)).sum();

    Ok(Row {
        table_size: size,
        backends: all.len(),
        build_ms,
        max_over_mean: f64::from(max) / mean,
        moved_pct_on_1pct_removal: pct(moved, size),
        minimum_pct: pct(removed_slots, size),
    })
}

/// Slots whose owner's key differs between two tables.
fn moved_slots(
    before: &Table,
    before_in: &[Weighted],
    after: &Table,
    after_in: &[Weighted],
) -> u64 {
    let key = |input: &[Weighted], slot: u16| input.get(usize::from(slot)).map(|b| b.key);
    before
        .slots()
        .iter()
        .zip(after.slots())
        .filter(|(&b, &a)| key(before_in, b) != key(after_in, a))
        .count() as u64
}

fn pct(part: u64, size: u32) -> f64 {
    part as f64 * 100.0 / f64::from(size)
}
