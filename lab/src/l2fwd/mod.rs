//! `strait-lab l2fwd`: the `limit` system of the line-rate benchmark, a plain AF_XDP forwarder
//! ([`L2fwd`]): IPv4 TCP/UDP arriving on `--rx` leaves on `--tx` with
//! destination MAC `--dst-mac` and the TX interface's own MAC as source; nothing else is done
//! to it. ARP and everything else on `--rx` stays with the kernel.
//!
//! One thread forwards (pinned to `--core` if given); the main thread prints forwarded pps to
//! stderr once a second and, at the end (`--duration` or SIGINT/SIGTERM), the summary on
//! stdout, one JSON object with `--json`:
//! `{"forwarded":u64,"seconds":f64,"pps":f64,"busy_seconds":f64,"kick_seconds":f64}`.
//! `forwarded` counts frames the kernel reported sent on `--tx`; `seconds` runs from the
//! forwarder being ready to the stop.
//!
//! `--driver dpdk` (a build with the `dpdk` feature) is the `limit-dpdk` system: the same
//! forwarding over the gateway's DPDK port driver, `--vdev` ports (`net_af_packet` or
//! `net_af_xdp`) on `--rx` and `--tx` ([`dpdk`]); `forwarded` then counts frames the PMD
//! took for sending. Both drivers run one loop ([`forward`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{anyhow, Context};
pub use forward::L2fwdStats;
pub use forwarder::{L2fwd, L2fwdConfig};
use serde::Serialize;
use strait_config::MacAddr;

use crate::pin_thread;
use crate::vdev::Vdev;

#[cfg(feature = "dpdk")]
pub mod dpdk;
mod forward;
pub mod forwarder;

use crate::sink::{every_second, parse_seconds, stop_on_signals};

/// `strait-lab l2fwd` arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Interface frames arrive on.
    #[arg(long)]
    pub rx: String,
    /// Interface frames leave from.
    #[arg(long)]
    pub tx: String,
    /// Destination MAC written into every forwarded frame.
    #[arg(long, value_name = "MAC")]
    pub dst_mac: MacAddr,
    /// Queue index on both interfaces.
    #[arg(long, default_value_t = 0)]
    pub queue: u32,
    /// Pin the forwarding thread to this CPU.
    #[arg(long, value_name = "N")]
    pub core: Option<usize>,
    /// Stop after SECS seconds (fractions allowed); default: run until SIGINT/SIGTERM.
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub duration: Option<Duration>,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// The port driver: AF_XDP sockets with a redirect program, or DPDK ports on the two
    /// interfaces (a build with the `dpdk` feature).
    #[arg(long, value_enum, default_value_t = Driver::AfXdp)]
    pub driver: Driver,
    /// With `--driver dpdk`: the PMD the ports run on.
    #[arg(long, value_enum, default_value_t = Vdev::AfPacket)]
    pub vdev: Vdev,
}

/// `--driver`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Driver {
    /// AF_XDP (`limit`).
    AfXdp,
    /// DPDK (`limit-dpdk`).
    Dpdk,
}

/// The summary, in the field order of the benchmark contract; `busy_seconds` (the time in
/// turns that found frames) over `forwarded` is the forwarder's CPU per packet, and
/// `kick_seconds` the TX kicks' part of it (the kernel's copy-mode transmit).
#[derive(Debug, Serialize)]
struct Summary {
    forwarded: u64,
    seconds: f64,
    pps: f64,
    busy_seconds: f64,
    kick_seconds: f64,
}

/// The forwarding thread's counters as the reporter reads them.
#[derive(Debug, Default)]
struct Published {
    rx: AtomicU64,
    forwarded: AtomicU64,
}

/// Runs `strait-lab l2fwd`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let stop = stop_on_signals()?;
    if args.driver == Driver::Dpdk {
        return run_dpdk(args, stop);
    }
    let cfg = L2fwdConfig::new(&args.rx, &args.tx, args.queue, args.dst_mac.octets());
    let published = Arc::new(Published::default());
    let (ready_tx, ready_rx) = mpsc::channel::<anyhow::Result<String>>();
    let worker = {
        let stop = Arc::clone(&stop);
        let published = Arc::clone(&published);
        let core = args.core;
        std::thread::Builder::new()
            .name("l2fwd".to_owned())
            .spawn(move || -> anyhow::Result<L2fwdStats> {
                let opened = (|| {
                    if let Some(c) = core {
                        pin_thread(c).with_context(|| format!("pinning to CPU {c}"))?;
                    }
                    L2fwd::open(&cfg)
                        .with_context(|| format!("opening the forwarder {} -> {}", cfg.rx, cfg.tx))
                })();
                let mut fwd = match opened {
                    Ok(f) => f,
                    Err(e) => {
                        let msg = format!("{e:#}");
                        let _ = ready_tx.send(Err(e));
                        return Err(anyhow!(msg));
                    }
                };
                let m = fwd.src_mac();
                let _ = ready_tx.send(Ok(format!(
                    "l2fwd {} -> {} queue {}: {} mode, {:?} XDP, src {}, dst {}{}",
                    cfg.rx,
                    cfg.tx,
                    cfg.queue,
                    fwd.bind_mode(),
                    fwd.attach_mode(),
                    MacAddr(m),
                    MacAddr(cfg.dst_mac),
                    core.map(|c| format!(", pinned to CPU {c}"))
                        .unwrap_or_default()
                )));
                let st = fwd.run(&stop, |st| {
                    published.rx.store(st.rx, Ordering::Relaxed);
                    published.forwarded.store(st.forwarded, Ordering::Relaxed);
                })?;
                Ok(st)
            })
            .context("starting the forwarding thread")?
    };
    let worker = when_ready(&ready_rx, worker)?;
    report(args, &stop, &published, worker)
}

/// The forwarding thread once it says it is ready (its note printed), or its error.
fn when_ready(
    ready: &mpsc::Receiver<anyhow::Result<String>>,
    worker: std::thread::JoinHandle<anyhow::Result<L2fwdStats>>,
) -> anyhow::Result<std::thread::JoinHandle<anyhow::Result<L2fwdStats>>> {
    match ready.recv() {
        Ok(Ok(note)) => {
            eprintln!("{note}");
            Ok(worker)
        }
        Ok(Err(e)) => {
            let _ = worker.join();
            Err(e)
        }
        Err(_) => Err(match worker.join() {
            Ok(Err(e)) => e,
            _ => anyhow!("the forwarding thread ended before it was ready"),
        }),
    }
}

/// Prints the rate once a second until the end, then the summary.
fn report(
    args: &Args,
    stop: &AtomicBool,
    published: &Published,
    worker: std::thread::JoinHandle<anyhow::Result<L2fwdStats>>,
) -> anyhow::Result<()> {
    let mut last = (0u64, 0u64);
    let seconds = every_second(stop, args.duration, |dt| {
        if worker.is_finished() {
            return Ok(false);
        }
        let now = (
            published.rx.load(Ordering::Relaxed),
            published.forwarded.load(Ordering::Relaxed),
        );
        eprintln!(
            "{} -> {}: {:>10.0} pps forwarded   ({:.0} pps received, {} forwarded)",
            args.rx,
            args.tx,
            (now.1 - last.1) as f64 / dt,
            (now.0 - last.0) as f64 / dt,
            now.1
        );
        last = now;
        Ok(true)
    })?;
    stop.store(true, Ordering::Relaxed);
    let st = worker
        .join()
        .map_err(|_| anyhow!("the forwarding thread panicked"))??;
    eprintln!(
        "l2fwd: rx {} tx {} forwarded {}; dropped: tx ring full {}, runts {}, invalid rx {}; \
         kicks: tx {} fill {}; idle polls {}",
        st.rx,
        st.tx,
        st.forwarded,
        st.tx_ring_full,
        st.runts,
        st.invalid_rx,
        st.tx_kicks,
        st.fill_kicks,
        st.idle_polls
    );
    let s = Summary {
        forwarded: st.forwarded,
        seconds,
        pps: st.forwarded as f64 / seconds,
        busy_seconds: st.busy.seconds(),
        kick_seconds: st.busy.kick_seconds(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        println!(
            "forwarded {} frames in {:.3} s: {:.0} pps, busy {:.3} s",
            s.forwarded, s.seconds, s.pps, s.busy_seconds
        );
    }
    Ok(())
}

/// `--driver dpdk`: the forwarding thread opens EAL and the ports itself (pinned first, so
/// its CPU is EAL's main lcore).
#[cfg(feature = "dpdk")]
fn run_dpdk(args: &Args, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let core = args.core.unwrap_or(0);
    let cfg = dpdk::DpdkL2fwdConfig::on(args.vdev, &args.rx, &args.tx, args.dst_mac.octets(), core);
    if args.rx == args.tx {
        anyhow::bail!(
            "l2fwd needs two interfaces, got {} for both RX and TX",
            args.rx
        );
    }
    let published = Arc::new(Published::default());
    let (ready_tx, ready_rx) = mpsc::channel::<anyhow::Result<String>>();
    let worker = {
        let stop = Arc::clone(&stop);
        let published = Arc::clone(&published);
        std::thread::Builder::new()
            .name("l2fwd".to_owned())
            .spawn(move || -> anyhow::Result<L2fwdStats> {
                if let Err(e) = pin_thread(core).with_context(|| format!("pinning to CPU {core}")) {
                    let msg = format!("{e:#}");
                    let _ = ready_tx.send(Err(e));
                    return Err(anyhow!(msg));
                }
                let failed = ready_tx.clone();
                let r = dpdk::run(
                    &cfg,
                    &stop,
                    |note| {
                        let _ = ready_tx.send(Ok(note));
                    },
                    |st| {
                        published.rx.store(st.rx, Ordering::Relaxed);
                        published.forwarded.store(st.forwarded, Ordering::Relaxed);
                    },
                );
                if let Err(e) = &r {
                    let _ = failed.send(Err(anyhow!("{e:#}")));
                }
                r
            })
            .context("starting the forwarding thread")?
    };
    let worker = when_ready(&ready_rx, worker)?;
    report(args, &stop, &published, worker)
}

#[cfg(not(feature = "dpdk"))]
fn run_dpdk(_args: &Args, _stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    anyhow::bail!(
        "`--driver dpdk` needs a strait-lab built with the `dpdk` feature \
         (cargo build -p strait-lab --features dpdk)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_has_the_contract_shape() {
        let s = Summary {
            forwarded: 4,
            seconds: 2.0,
            pps: 2.0,
            busy_seconds: 0.5,
            kick_seconds: 0.25,
        };
        assert_eq!(
            serde_json::to_string(&s).expect("serialize"),
            r#"{"forwarded":4,"seconds":2.0,"pps":2.0,"busy_seconds":0.5,"kick_seconds":0.25}"#
        );
    }
}
