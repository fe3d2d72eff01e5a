//! Instructions per packet, counted by valgrind's callgrind: a figure that does not depend on
//! what else the machine is doing, so a CI check can hold it to a committed baseline.
//!
//! ```text
//! strait-instructions check ──for each mode x traffic──► valgrind --tool=callgrind
//!     --toggle-collect=*counted_section* strait-instructions workload --mode M --traffic T
//!   ◄── callgrind.out (totals: Ir)  ◄── stdout {"packets": N, "rustc": ...}
//!   Ir / N per case ──► table; compared with docs/instructions.json (fails above +5 %)
//! ```
//!
//! # The workload
//!
//! [`Workload`] is fixed: [`SERVICES`] services, [`FLOWS`] established flows (or none for
//! SYN traffic), calls of [`CALL`] frames (the worker's RX batch), [`COUNTED_BATCHES`] timed
//! batches of [`BATCH`] frames counted after [`WARM_BATCHES`] uncounted ones. The traffic is
//! the pipeline bench's own ([`crate::Bench`]), seeded, so the same binary runs the same
//! instructions on every machine. Small counts suffice: the instructions a packet takes do
//! not depend on whether its flow entry came from L1 or DRAM, only its time does.
//!
//! # What is counted
//!
//! Only the `process_batch` calls: callgrind collects inside one function, the workload's
//! `counted_section` (`--toggle-collect`), which does nothing but hand the batch's frames to
//! the pipeline in calls. Table building, the warm-up, the frames' copy into the RX buffers
//! and the process's start are outside it. The count is valgrind's `Ir` (instructions
//! executed), divided by the packets counted.
//!
//! # Compiler
//!
//! Instruction counts belong to a compiler: a new rustc or LLVM reorders, inlines and
//! vectorises differently, and a few percent either way is common. The baseline records the
//! `rustc -vV` that built the workload (the workload reports it, captured when it was built).
//! On a different rustc the check warns loudly and still compares: failing outright would
//! break every build on a new toolchain until someone re-runs `--update`, and passing silently
//! would hide real regressions; a comparison that fails on another rustc says so beside the
//! table, so whoever bumps the toolchain updates the baseline in the same commit and says why.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use strait_config::model::Mode;

use crate::{Traffic, BATCH};

/// Services in the workload's configuration (4 backends each).
pub const SERVICES: usize = 100;
/// Established flows of the workload's established traffic.
pub const FLOWS: usize = 4_096;
/// Flow-table ways: a quarter full with the established flows (half in nat), so no insert
/// ever finds its bucket and group full and the counted path is the normal one.
pub const CAPACITY: usize = 1 << 15;
/// Frames per `process_batch` call: the AF_XDP worker's RX batch (`xsk::BATCH`).
pub const CALL: usize = 64;
/// Batches run before counting: the SYN traffic's first inserts and any lazily built state
/// are not what a packet usually costs.
pub const WARM_BATCHES: usize = 4;
/// Batches counted: 16,384 packets, enough that per-call and per-batch costs average out.
pub const COUNTED_BATCHES: usize = 16;
/// Allowed rise over the baseline before the check fails, in percent.
pub const TOLERANCE_PCT: f64 = 5.0;

/// The traffics the check counts: the two ends of the pipeline's work (mix is their blend).
pub const TRAFFICS: [Traffic; 2] = [Traffic::Established, Traffic::Syn];

/// The rustc that built this crate (`rustc -vV`, captured by the build script).
pub const RUSTC: &str = env!("STRAIT_RUSTC_VERSION");

/// What a workload run reports on stdout, as one JSON line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkloadReport {
    /// The mode.
    pub mode: String,
    /// The traffic.
    pub traffic: String,
    /// Packets handed to the counted section.
    pub packets: u64,
    /// Packets that were not transmitted (must be 0).
    pub not_tx: u64,
    /// [`RUSTC`].
    pub rustc: String,
}

/// One case's count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Count {
    /// The mode (`dsr-l2`, ...).
    pub mode: String,
    /// The traffic (`established`, `syn`).
    pub traffic: String,
    /// Packets counted.
    pub packets: u64,
    /// Instructions executed in the counted section (callgrind's `Ir`).
    pub instructions: u64,
    /// `instructions / packets`, to one decimal.
    pub instructions_per_packet: f64,
}

impl Count {
    /// A count of `instructions` over `packets`.
    pub fn new(mode: &str, traffic: &str, packets: u64, instructions: u64) -> Self {
        Self {
            mode: mode.to_owned(),
            traffic: traffic.to_owned(),
            packets,
            instructions,
            instructions_per_packet: (instructions as f64 / packets.max(1) as f64 * 10.0).round()
                / 10.0,
        }
    }
}

/// The committed baseline (`docs/instructions.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    /// The command that wrote it.
    pub command: String,
    /// When it was written (UTC, RFC 3339).
    pub date: String,
    /// `rustc -vV` of the compiler that built the workload.
    pub rustc: String,
    /// `valgrind --version`.
    pub valgrind: String,
    /// The workload, in words.
    pub workload: String,
    /// Allowed rise in percent.
    pub tolerance_pct: f64,
    /// One count per mode and traffic.
    pub results: Vec<Count>,
}

/// The workload in words, for the baseline file.
pub fn workload_description() -> String {
    format!(
        "{SERVICES} services x 4 backends; established: {FLOWS} flows warmed, ACKs in shuffled \
         order; syn: every packet a new flow; flow table {CAPACITY} ways; {WARM_BATCHES} \
         batches of {BATCH} frames uncounted, then {COUNTED_BATCHES} counted, handed to \
         process_batch in calls of {CALL}; counted: instructions inside counted_section \
         (callgrind --toggle-collect) / packets"
    )
}

/// The `Ir` total of a callgrind output file (`totals:`, or `summary:` in older files).
pub fn callgrind_total(text: &str) -> Option<u64> {
    let line = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    };
    line("totals:").or_else(|| line("summary:"))
}

/// How one case compares with the baseline.
#[derive(Clone, Debug, PartialEq)]
pub struct Compared {
    /// The count now.
    pub now: Count,
    /// The baseline's instructions per packet, if it has the case.
    pub baseline: Option<f64>,
}

impl Compared {
    /// Percent change from the baseline.
    pub fn change_pct(&self) -> Option<f64> {
        self.baseline
            .map(|b| (self.now.instructions_per_packet / b - 1.0) * 100.0)
    }

    /// Whether this case fails the check: above the baseline by more than the tolerance, or
    /// not in the baseline at all. (Exactly the tolerance passes; the epsilon absorbs the
    /// rounding of the division.)
    pub fn fails(&self) -> bool {
        self.change_pct().is_none_or(|c| c > TOLERANCE_PCT + 1e-9)
    }
}

/// Every count of `now` against `baseline`.
pub fn compare(now: &[Count], baseline: &Baseline) -> Vec<Compared> {
    now.iter()
        .map(|c| Compared {
            now: c.clone(),
            baseline: baseline
                .results
                .iter()
                .find(|b| b.mode == c.mode && b.traffic == c.traffic)
                .map(|b| b.instructions_per_packet),
        })
        .collect()
}

/// The table the check prints.
pub fn table(rows: &[Compared]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<9} {:<12} {:>8} {:>14} {:>12} {:>12} {:>8}  ",
        "mode", "traffic", "packets", "instructions", "per packet", "baseline", "change"
    );
    for r in rows {
        let (base, change) = match (r.baseline, r.change_pct()) {
            (Some(b), Some(c)) => (format!("{b:.1}"), format!("{c:+.1} %")),
            _ => ("-".to_owned(), "new".to_owned()),
        };
        let verdict = if r.fails() {
            if r.baseline.is_some() {
                "  REGRESSION"
            } else {
                "  NOT IN BASELINE"
            }
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "{:<9} {:<12} {:>8} {:>14} {:>12.1} {:>12} {:>8}{verdict}",
            r.now.mode,
            r.now.traffic,
            r.now.packets,
            r.now.instructions,
            r.now.instructions_per_packet,
            base,
            change
        );
    }
    s
}

/// A mode by its configuration spelling.
///
/// # Errors
/// When `s` names no mode.
pub fn parse_mode(s: &str) -> Result<Mode, String> {
    Mode::ALL
        .into_iter()
        .find(|m| m.as_str() == s)
        .ok_or_else(|| format!("{s:?} is not a mode (dsr-l2, dsr-ipip, dsr-gue, nat)"))
}

/// A traffic the check counts, by its report name.
///
/// # Errors
/// When `s` names no counted traffic.
pub fn parse_traffic(s: &str) -> Result<Traffic, String> {
    TRAFFICS
        .into_iter()
        .find(|t| t.as_str() == s)
        .ok_or_else(|| format!("{s:?} is not a counted traffic (established, syn)"))
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339(secs: u64) -> String {
    // Days to civil date: Howard Hinnant's algorithm ("chrono-Compatible Low-Level Date
    // Algorithms", days_from_civil's inverse).
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn baseline(results: Vec<Count>) -> Baseline {
        Baseline {
            command: "scripts/check-instructions.sh --update".into(),
            date: "2026-12-04T23:00:00Z".into(),
            rustc: RUSTC.into(),
            valgrind: "valgrind-3.19.0".into(),
            workload: workload_description(),
            tolerance_pct: TOLERANCE_PCT,
            results,
        }
    }

    #[test]
    fn totals_from_a_callgrind_file() {
        let text = "# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\nevents: Ir\n\
                    fn=(1) x\n3 7\nsummary: 1234\n\ntotals: 1234\n";
        assert_eq!(callgrind_total(text), Some(1234));
        assert_eq!(callgrind_total("events: Ir\nsummary: 99\n"), Some(99));
        assert_eq!(callgrind_total("events: Ir\n"), None);
    }

    #[test]
    fn per_packet_rounds_to_a_tenth() {
        let c = Count::new("nat", "syn", 16_384, 16_384 * 1000 + 1_640);
        assert_eq!(c.instructions_per_packet, 1000.1);
    }

    #[test]
    fn a_rise_above_five_percent_fails_and_below_passes() {
        let b = baseline(vec![
            Count::new("dsr-l2", "established", 100, 100_000),
            Count::new("nat", "syn", 100, 200_000),
        ]);
        let now = [
            Count::new("dsr-l2", "established", 100, 105_000), // +5.0 %: passes
            Count::new("nat", "syn", 100, 210_100),            // +5.05 %: fails
            Count::new("dsr-gue", "syn", 100, 1_000),          // not in the baseline
        ];
        let rows = compare(&now, &b);
        assert!(!rows[0].fails(), "{rows:?}");
        assert!(rows[1].fails(), "{rows:?}");
        assert!(rows[2].fails(), "{rows:?}");
        let fewer = compare(&[Count::new("nat", "syn", 100, 100_000)], &b);
        assert!(!fewer[0].fails(), "fewer instructions never fail");
        assert!((fewer[0].change_pct().unwrap() + 50.0).abs() < 1e-9);
        let t = table(&rows);
        assert!(t.contains("+5.0 %") && t.contains("REGRESSION"), "{t}");
        assert!(t.contains("NOT IN BASELINE"), "{t}");
        assert_eq!(t.matches("REGRESSION").count(), 1, "{t}");
    }

    #[test]
    fn the_baseline_round_trips_through_json() {
        let b = baseline(vec![Count::new("dsr-l2", "syn", 10, 12_345)]);
        let text = serde_json::to_string_pretty(&b).expect("json");
        let back: Baseline = serde_json::from_str(&text).expect("parses");
        assert_eq!(back, b);
        assert!(
            b.rustc.contains("rustc") && b.rustc.contains("LLVM"),
            "{}",
            b.rustc
        );
    }

    #[test]
    fn names_parse_and_dates_print() {
        assert_eq!(parse_mode("dsr-gue"), Ok(Mode::DsrGue));
        assert!(parse_mode("gue").is_err());
        assert_eq!(parse_traffic("syn"), Ok(Traffic::Syn));
        assert!(parse_traffic("mix")
            .unwrap_err()
            .contains("not a counted traffic"));
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_800_000_000), "2027-01-15T08:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }
}
