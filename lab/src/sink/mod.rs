//! `strait-lab sink`: the line-rate benchmark's receiver. An XDP program on the interface counts
//! every arriving frame (per-CPU counters) and drops it; with `--reflect-port` it sends latency
//! probes back (`XDP_TX`, addresses and ports swapped). Received pps goes to stderr once a
//! second; the summary to stdout at the end, one JSON object with `--json`:
//! `{"received":u64,"seconds":f64,"pps":f64,"reflected":u64}`.
//!
//! `received` counts every frame, reflected probes included; `seconds` runs from attaching to
//! stopping (the `--duration`, or SIGINT/SIGTERM), and `pps` is `received / seconds`. The
//! program comes off the interface on exit, also on error; one left by a killed sink is
//! replaced by the next.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use strait_dataplane::xsk::AttachPolicy;

pub use program::{SinkCounters, SinkProgram};

pub mod program;

/// `strait-lab sink` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The interface to count on (in this network namespace).
    #[arg(long)]
    pub iface: String,
    /// Stop after SECS seconds (fractions allowed); default: run until SIGINT/SIGTERM.
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub duration: Option<Duration>,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Reflect latency probes: UDP packets from source port PORT whose payload starts with
    /// `STRAITPR` go back where they came from.
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub reflect_port: Option<u16>,
}

/// The summary, in the field order of the benchmark contract.
#[derive(Debug, Serialize)]
struct Summary {
    received: u64,
    seconds: f64,
    pps: f64,
    reflected: u64,
}

/// Runs `strait-lab sink`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let stop = stop_on_signals()?;
    let prog = SinkProgram::attach(&args.iface, args.reflect_port, AttachPolicy::NativeOnly)
        .with_context(|| format!("attaching the sink to {}", args.iface))?;
    let mut note = format!(
        "sink on {}: native XDP program {}",
        args.iface,
        prog.program_id()
    );
    if !prog.replaced_programs().is_empty() {
        note += &format!(" (replaced {:?})", prog.replaced_programs());
    }
    if let Some(p) = args.reflect_port {
        note += &format!(", reflecting probes from UDP port {p}");
    }
    eprintln!("{note}");

    let mut last = prog.counters()?;
    let seconds = every_second(&stop, args.duration, |dt| {
        let now = prog.counters()?;
        eprintln!(
            "{}: {:>10.0} pps   received {}   reflected {}",
            args.iface,
            (now.received - last.received) as f64 / dt,
            now.received,
            now.reflected
        );
        last = now;
        Ok(true)
    })?;
    let end = prog.counters()?;
    drop(prog);
    let s = Summary {
        received: end.received,
        seconds,
        pps: end.received as f64 / seconds,
        reflected: end.reflected,
    };
    if args.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        println!(
            "received {} frames in {:.3} s: {:.0} pps; reflected {} probes",
            s.received, s.seconds, s.pps, s.reflected
        );
    }
    Ok(())
}

/// A flag that SIGINT and SIGTERM set (instead of ending the process), so the caller can stop,
/// clean up and print its summary.
pub(crate) fn stop_on_signals() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing signal handlers")?;
    }
    Ok(stop)
}

/// Calls `tick` with the seconds since its last call, about once a second, until `stop` is
/// set, `duration` has passed, or `tick` returns false; then returns the seconds elapsed.
/// Checks `stop` every 10 ms.
pub(crate) fn every_second(
    stop: &AtomicBool,
    duration: Option<Duration>,
    mut tick: impl FnMut(f64) -> anyhow::Result<bool>,
) -> anyhow::Result<f64> {
    const STEP: Duration = Duration::from_millis(10);
    let start = Instant::now();
    let mut last = start;
    loop {
        let now = Instant::now();
        if stop.load(Ordering::Relaxed) || duration.is_some_and(|d| now - start >= d) {
            return Ok((now - start).as_secs_f64());
        }
        if now - last >= Duration::from_secs(1) {
            let dt = (now - last).as_secs_f64();
            last = now;
            if !tick(dt)? {
                return Ok((Instant::now() - start).as_secs_f64());
            }
        }
        let mut nap = STEP;
        if let Some(d) = duration {
            nap = nap.min((start + d).saturating_duration_since(now));
        }
        std::thread::sleep(nap);
    }
}

/// A positive, finite number of seconds.
pub(crate) fn parse_seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !v.is_finite() || v <= 0.0 || v > 1e9 {
        return Err(format!("{s:?}: a duration is a positive number of seconds"));
    }
    Ok(Duration::from_secs_f64(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_parse() {
        assert_eq!(parse_seconds("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_seconds("0.25"), Ok(Duration::from_millis(250)));
        for bad in ["0", "-1", "nan", "inf", "x", ""] {
            assert!(parse_seconds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_second_stops_at_the_duration() {
        let stop = AtomicBool::new(false);
        let mut ticks = 0;
        let t = every_second(&stop, Some(Duration::from_millis(1100)), |dt| {
            assert!(dt >= 1.0);
            ticks += 1;
            Ok(true)
        })
        .expect("no tick fails");
        assert!((1.1..1.5).contains(&t), "{t}");
        assert_eq!(ticks, 1);
    }

    #[test]
    fn every_second_stops_on_the_flag() {
        let stop = AtomicBool::new(true);
        let t = every_second(&stop, None, |_| panic!("no tick")).expect("stops");
        assert!(t < 0.5);
    }

    #[test]
    fn summary_has_the_contract_shape() {
        let s = Summary {
            received: 10,
            seconds: 2.0,
            pps: 5.0,
            reflected: 1,
        };
        assert_eq!(
            serde_json::to_string(&s).expect("serialize"),
            r#"{"received":10,"seconds":2.0,"pps":5.0,"reflected":1}"#
        );
    }
}
