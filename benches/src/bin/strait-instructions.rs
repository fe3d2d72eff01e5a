//! `strait-instructions`: the pipeline's instructions per packet, counted by callgrind and
//! held to a committed baseline (`strait_benches::instructions` has the design).
//!
//! ```text
//! strait-instructions check [--baseline docs/instructions.json] [--update] [--mode M,..]
//!                           [--traffic T,..]      every case under valgrind; table; verdict
//! strait-instructions workload --mode M --traffic T   one fixed run (what valgrind runs)
//! ```
//!
//! `check` exits 1 when a case's count rose more than 5 % above the baseline's, or the
//! baseline lacks it; `--update` writes the counts as the new baseline instead.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use strait_benches::instructions::{
    self, callgrind_total, compare, parse_mode, parse_traffic, table, workload_description,
    Baseline, Count, WorkloadReport, CALL, CAPACITY, COUNTED_BATCHES, FLOWS, RUSTC, SERVICES,
    TOLERANCE_PCT, TRAFFICS, WARM_BATCHES,
};
use strait_benches::{run_calls, Bench, Traffic, BATCH};
use strait_config::model::Mode;
use strait_dataplane::pipeline::{Pipeline, Verdict};
use strait_dataplane::rewrite::Frame;
use strait_dataplane::table::ServiceTable;

#[derive(Debug, Parser)]
#[command(
    name = "strait-instructions",
    about = "The pipeline's instructions per packet under callgrind, against a baseline"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Count every mode and traffic under valgrind, print the table, compare with the
    /// baseline (exit 1 on a rise above 5 %), or rewrite it with `--update`.
    Check {
        /// The baseline file.
        #[arg(long, default_value = "docs/instructions.json")]
        baseline: PathBuf,
        /// Write the counts as the new baseline instead of comparing.
        #[arg(long)]
        update: bool,
        /// Modes (comma-separated; default all). `--update` needs all.
        #[arg(long, value_delimiter = ',', value_parser = parse_mode)]
        mode: Vec<Mode>,
        /// Traffics (comma-separated: established, syn; default both). `--update` needs both.
        #[arg(long, value_delimiter = ',', value_parser = parse_traffic)]
        traffic: Vec<Traffic>,
    },
    /// One fixed run of the pipeline, its counted section marked for callgrind; prints a
    /// JSON line with the packets counted.
    Workload {
        /// The mode.
        #[arg(long, value_parser = parse_mode)]
        mode: Mode,
        /// The traffic.
        #[arg(long, value_parser = parse_traffic)]
        traffic: Traffic,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Cmd::Workload { mode, traffic } => {
            let r = workload(mode, traffic);
            println!(
                "{}",
                serde_json::to_string(&r).expect("a report serialises")
            );
            if r.not_tx == 0 {
                ExitCode::SUCCESS
            } else {
                eprintln!("strait-instructions: {} frames not transmitted", r.not_tx);
                ExitCode::FAILURE
            }
        }
        Cmd::Check {
            baseline,
            update,
            mode,
            traffic,
        } => match check(&baseline, update, &mode, &traffic) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("strait-instructions: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// The part of the run callgrind counts (`--toggle-collect=*counted_section*`): the batch's
/// frames handed to the pipeline, nothing else. Never inlined, so it exists as a symbol.
#[inline(never)]
fn counted_section(
    pipe: &mut Pipeline,
    table: &ServiceTable,
    now: u64,
    frames: &mut [Frame<'_>],
    verdicts: &mut [Verdict],
    call: usize,
) {
    run_calls(pipe, table, now, frames, verdicts, call);
}

/// The fixed workload of `mode` and `traffic`.
fn workload(mode: Mode, traffic: Traffic) -> WorkloadReport {
    let flows = if traffic.has_established() { FLOWS } else { 0 };
    let mut b = Bench::new(mode, traffic, SERVICES, flows, CAPACITY);
    b.set_call_size(CALL);
    for _ in 0..WARM_BATCHES {
        let _ = b.batch();
    }
    for _ in 0..COUNTED_BATCHES {
        b.batch_with(counted_section);
    }
    WorkloadReport {
        mode: mode.as_str().to_owned(),
        traffic: traffic.as_str().to_owned(),
        packets: (COUNTED_BATCHES * BATCH) as u64,
        not_tx: b.not_tx,
        rustc: RUSTC.to_owned(),
    }
}

/// Runs the cases, prints the table; compares (`Ok(false)`: a case failed) or updates.
fn check(path: &Path, update: bool, modes: &[Mode], traffics: &[Traffic]) -> Result<bool, String> {
    let modes = if modes.is_empty() {
        &Mode::ALL[..]
    } else {
        modes
    };
    let traffics = if traffics.is_empty() {
        &TRAFFICS[..]
    } else {
        traffics
    };
    if update && (modes.len() < Mode::ALL.len() || traffics.len() < TRAFFICS.len()) {
        return Err("--update writes every case: leave out --mode and --traffic".into());
    }
    let valgrind = valgrind_version()?;
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let dir = scratch_dir()?;
    let mut counts = Vec::new();
    for &mode in modes {
        for &traffic in traffics {
            let c = count(&exe, &dir, mode, traffic);
            let c = c.map_err(|e| format!("{mode} {}: {e}", traffic.as_str()))?;
            counts.push(c);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "instructions per packet (callgrind Ir inside counted_section / packets); {RUSTC}; \
         {valgrind}"
    );
    if update {
        let b = Baseline {
            command: "scripts/check-instructions.sh --update".into(),
            date: instructions::rfc3339(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            ),
            rustc: RUSTC.into(),
            valgrind,
            workload: workload_description(),
            tolerance_pct: TOLERANCE_PCT,
            results: counts,
        };
        let text = serde_json::to_string_pretty(&b).map_err(|e| e.to_string())? + "\n";
        std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        print!("{}", table(&compare(&b.results, &b)));
        println!("baseline written to {}", path.display());
        return Ok(true);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the baseline {}: {e}", path.display()))?;
    let base: Baseline = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a baseline: {e}", path.display()))?;
    if base.rustc != RUSTC {
        eprintln!(
            "\n!!! WARNING: the baseline was counted with another compiler:\n!!!   baseline: \
             {}\n!!!   this build: {RUSTC}\n!!! Instruction counts move with the compiler; a \
             difference below may be the compiler's.\n!!! After a toolchain change, run \
             scripts/check-instructions.sh --update in the same commit.\n",
            base.rustc
        );
    }
    let rows = compare(&counts, &base);
    print!("{}", table(&rows));
    let failed: Vec<&instructions::Compared> = rows.iter().filter(|r| r.fails()).collect();
    if failed.is_empty() {
        println!(
            "ok: no case above the baseline ({}) by more than {TOLERANCE_PCT} %",
            base.date
        );
        Ok(true)
    } else {
        println!(
            "FAILED: {} case(s) above the baseline by more than {TOLERANCE_PCT} % (or not in \
             it). If the rise is worth it, run scripts/check-instructions.sh --update and say \
             why in the commit.",
            failed.len()
        );
        Ok(false)
    }
}

/// `valgrind --version`.
fn valgrind_version() -> Result<String, String> {
    let out = Command::new("valgrind")
        .arg("--version")
        .output()
        .map_err(|e| format!("running valgrind (Debian package valgrind): {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A fresh directory for callgrind's output files.
fn scratch_dir() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("strait-instructions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    Ok(dir)
}

/// One case under callgrind.
fn count(exe: &Path, dir: &Path, mode: Mode, traffic: Traffic) -> Result<Count, String> {
    let out_file = dir.join(format!("callgrind.{}.{}", mode.as_str(), traffic.as_str()));
    let out = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg("--toggle-collect=*counted_section*")
        .arg("--collect-atstart=no")
        .args([exe.as_os_str(), "workload".as_ref()])
        .args(["--mode", mode.as_str(), "--traffic", traffic.as_str()])
        .output()
        .map_err(|e| format!("running valgrind: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "valgrind or the workload failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let report: WorkloadReport = stdout
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| format!("the workload printed no report: {stdout:?}"))?;
    let text = std::fs::read_to_string(&out_file)
        .map_err(|e| format!("reading {}: {e}", out_file.display()))?;
    let total = callgrind_total(&text)
        .ok_or_else(|| format!("{} has no totals line", out_file.display()))?;
    if total == 0 {
        return Err(
            "callgrind counted nothing: counted_section was not found (inlined, or renamed?)"
                .into(),
        );
    }
    Ok(Count::new(
        &report.mode,
        &report.traffic,
        report.packets,
        total,
    ))
}
