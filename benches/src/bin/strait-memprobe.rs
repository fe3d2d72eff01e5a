//! `strait-memprobe`: memory as the flow table meets it on this machine.
//!
//! ```text
//! strait-memprobe [--mib 4,32,128,2048] [--json]
//! ```
//!
//! For buffers the sizes of the flow table's arrays (at 1M flows per core: tags 4 MiB,
//! entries 128 MiB; at 8M: 32 MiB and 1 GiB or more), on huge pages like the table, two
//! figures per buffer:
//!
//! - **latency**: one random cache line after another, each address read from the line
//!   before (a single cycle through every line, so no short loop stays cached): what a
//!   lookup waits for when nothing overlaps it;
//! - **batched**: groups of 32 random lines, all 32 prefetched, then all 32 read, as the
//!   pipeline's staging passes do for a chunk: time per line when the reads overlap.
//!
//! Their ratio is about how many reads overlap. Where it is well below 32, a chunk is bounded
//! by that number, and each line a packet reads costs its share of it however well its
//! latency is hidden. Timings are the best of several repetitions on one core; pin it
//! (`taskset -c 1`) and compare within one run.
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::time::Instant;

use clap::Parser;
use serde::Serialize;
use strait_benches::Rng;

#[derive(Debug, Parser)]
#[command(
    name = "strait-memprobe",
    about = "Random cache-line reads in series and 32 at a time, over buffers the sizes of the flow table's arrays"
)]
struct Cli {
    /// Buffer sizes in MiB (comma-separated, each a power of two).
    #[arg(long, value_delimiter = ',', default_value = "4,32,128,2048", value_parser = parse_mib)]
    mib: Vec<usize>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn parse_mib(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("buffer size {s:?}: {e}"))?;
    if n == 0 || !n.is_power_of_two() || n > 65536 {
        return Err(format!(
            "buffer size {n} MiB: must be a power of two from 1 to 65536"
        ));
    }
    Ok(n)
}

/// One cache line; word 0 holds the index of the next line of the latency cycle.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u64; 8]);

/// Lines read together in the batched figure: the pipeline's chunk.
const GROUP: usize = strait_dataplane::pipeline::BATCH;

#[derive(Debug, Serialize)]
struct Row {
    mib: usize,
    latency_ns_per_line: f64,
    batched_ns_per_line: f64,
    /// latency / batched: about how many reads overlap.
    overlap: f64,
}

/// `lines` cache lines on huge pages, each holding in word 0 the index of the next line of
/// one cycle through all of them in a random order, so that the chain never settles into a
/// loop short enough to stay in the cache.
fn chain(lines: usize, rng: &mut Rng) -> Box<[Line]> {
    let mut buf = strait_dataplane::hint::huge_filled(lines, Line([0; 8]));
    let mut order: Vec<u32> = (0..lines as u32).collect();
    rng.shuffle(&mut order);
    for (i, &at) in order.iter().enumerate() {
        buf[at as usize].0[0] = u64::from(order[(i + 1) % lines]);
    }
    buf
}

/// xorshift64, for the timed loop's line indices: a shift-xor step per index where
/// [`Rng::next_u64`] takes two multiplies, which showed as 1-2 ns a line in the batched figure
/// at 128 MiB.
fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn probe(mib: usize) -> Row {
    let lines = (mib << 20) / core::mem::size_of::<Line>();
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let buf = chain(lines, &mut rng);

    let steps = (1 << 20).min(lines * 4);
    let mut latency = f64::MAX;
    for _ in 0..3 {
        let mut at = 0usize;
        let t = Instant::now();
        for _ in 0..steps {
            at = buf[at].0[0] as usize;
        }
        black_box(at);
        latency = latency.min(t.elapsed().as_nanos() as f64 / steps as f64);
    }

    let groups = 1 << 15;
    let mut seed = rng.next_u64() | 1;
    let mask = lines as u64 - 1;
    let mut batched = f64::MAX;
    let mut idx = [0usize; GROUP];
    for _ in 0..5 {
        let mut sum = 0u64;
        let t = Instant::now();
        for _ in 0..groups {
            for i in &mut idx {
                *i = (xorshift(&mut seed) & mask) as usize;
                strait_dataplane::hint::prefetch(&buf[*i]);
            }
            for &i in &idx {
                sum = sum.wrapping_add(buf[i].0[1]);
            }
        }
        black_box(sum);
        batched = batched.min(t.elapsed().as_nanos() as f64 / (groups * GROUP) as f64);
    }
    Row {
        mib,
        latency_ns_per_line: round1(latency),
        batched_ns_per_line: round1(batched),
        overlap: round1(latency / batched),
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn main() {
    let cli = Cli::parse();
    let rows: Vec<Row> = cli.mib.iter().map(|&m| probe(m)).collect();
    if cli.json {
        println!(
            "{}",
            serde_json::json!({ "group": GROUP, "huge_pages": true, "rows": rows })
        );
        return;
    }
    println!("buffer MiB   latency ns/line   {GROUP} at a time ns/line   overlap");
    for r in &rows {
        println!(
            "{:>10}   {:>15.1}   {:>22.1}   {:>7.1}",
            r.mib, r.latency_ns_per_line, r.batched_ns_per_line, r.overlap
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_powers_of_two_mib() {
        assert_eq!(parse_mib("32"), Ok(32));
        for bad in ["0", "3", "65537", "x", "-1"] {
            let e = parse_mib(bad).unwrap_err();
            assert!(e.starts_with("buffer size"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_chain_visits_every_line_once_before_it_returns() {
        let lines = 4096;
        let buf = chain(lines, &mut Rng::new(7));
        let mut seen = vec![false; lines];
        let mut at = 0;
        for step in 0..lines {
            assert!(!seen[at], "line {at} visited twice, at step {step}");
            seen[at] = true;
            at = buf[at].0[0] as usize;
        }
        assert_eq!(at, 0, "the chain is one cycle through every line");
    }

    #[test]
    fn a_small_buffer_gives_both_figures() {
        let r = probe(1);
        assert_eq!(r.mib, 1);
        assert!(
            r.latency_ns_per_line > 0.0 && r.batched_ns_per_line > 0.0,
            "{r:?}"
        );
        assert!(r.overlap > 0.0, "{r:?}");
    }
}
