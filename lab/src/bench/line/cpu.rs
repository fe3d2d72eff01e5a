//! The forwarding CPU's cost per delivered packet, read around each point of the line-rate
//! bench from what the kernel and the forwarders already count.
//!
//! ```text
//! strait-*   worker busy time (strait_worker_busy_seconds_total, /metrics)  + XDP programs' run time
//! limit      l2fwd's busy time (its --json summary)                         + XDP program's run time
//! kernel     the forwarder CPU's softirq + irq time (/proc/stat)
//! ```
//!
//! A busy-polling forwarder's thread uses its whole core however few packets arrive, so its CPU
//! time says nothing about a packet; the time of its turns that found frames does
//! (`strait_dataplane::stats::BusyTime`). That is wall time: on a shared machine another
//! process may hold the core in the middle of a turn. The busy time is therefore scaled by the
//! share of the point the forwarding thread was on the CPU while it wanted to be (its
//! `schedstat` run time over run time plus run-queue wait, [`Sched`]): a time-slice
//! preemption falls on busy and idle turns alike, so the scaled figure is what the forwarder
//! itself spent. On a quiet core the share is 1 and nothing changes. The XDP program that steers frames to the
//! AF_XDP socket is part of the AF_XDP forwarders' work but runs in the receiving softirq,
//! which on a veth is the generator's CPU: its own run time comes from the kernel's BPF
//! statistics (`kernel.bpf_stats_enabled`, on for the run and restored after, [`BpfStats`]),
//! per program in `bpf_prog_info.run_time_ns` / `run_cnt`. The kernel peers forward in the
//! `NET_RX` softirq of the CPU RPS steers `fwd0` to (raised by the RPS interrupt), counted in
//! that CPU's `/proc/stat` line as softirq (and irq) time, also when the softirq runs on the
//! way out of another task's system call: the kernel accounts it by what it is serving, not
//! whom. That CPU's `system` time is other tasks' system calls (on a shared machine, other
//! jobs' builds; for the AF_XDP forwarders, their own kicks, already in their busy time), so
//! it is reported but not counted.
//! The sink's XDP counter runs on the forwarder CPU for every system; its own run time is
//! reported apart ([`Delta::sink_xdp_ns`]) so a reader can see what it adds.

use std::process::Command;

use anyhow::{bail, Context, Result};

/// `USER_HZ`, the unit of `/proc/stat`: `sysconf(_SC_CLK_TCK)`, 100 in Linux's ABI on every
/// architecture this runs on.
const USER_HZ: u64 = 100;

/// Where `kernel.bpf_stats_enabled` lives.
const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Turns the kernel's BPF run-time statistics on for as long as it lives, and puts the
/// sysctl back as it was on drop.
#[derive(Debug)]
pub struct BpfStats {
    before: String,
}

impl BpfStats {
    /// Sets `kernel.bpf_stats_enabled` to 1.
    ///
    /// # Errors
    /// When the sysctl cannot be read or written (not root, or a kernel without it).
    pub fn enable() -> Result<Self> {
        let before = std::fs::read_to_string(BPF_STATS)
            .with_context(|| format!("reading {BPF_STATS} (kernel.bpf_stats_enabled)"))?;
        std::fs::write(BPF_STATS, "1")
            .with_context(|| format!("setting {BPF_STATS} to 1 for the XDP programs' cost"))?;
        Ok(Self {
            before: before.trim().to_owned(),
        })
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(BPF_STATS, &self.before) {
            eprintln!(
                "line-rate: could not restore kernel.bpf_stats_enabled to {}: {e}",
                self.before
            );
        }
    }
}

/// One CPU's kernel time from `/proc/stat`, nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelTime {
    /// `system`: kernel work on behalf of processes.
    pub system: u64,
    /// `irq`: hard interrupts.
    pub irq: u64,
    /// `softirq`: where the kernel forwards (`NET_RX`) and veths deliver.
    pub softirq: u64,
}

impl KernelTime {
    /// CPU `cpu`'s line of `/proc/stat`.
    ///
    /// # Errors
    /// When the file cannot be read or has no such line.
    pub fn read(cpu: usize) -> Result<Self> {
        let text = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        Self::parse(&text, cpu)
    }

    /// CPU `cpu`'s line of a `/proc/stat` text: `cpuN user nice system idle iowait irq
    /// softirq ...` in `USER_HZ` ticks.
    fn parse(text: &str, cpu: usize) -> Result<Self> {
        let tag = format!("cpu{cpu}");
        let Some(line) = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(tag.as_str()))
        else {
            bail!("/proc/stat has no {tag} line");
        };
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .with_context(|| format!("/proc/stat: {line:?}"))?;
        if f.len() < 7 {
            bail!("/proc/stat: {line:?} has fewer than 7 fields");
        }
        let ns = |ticks: u64| ticks * (1_000_000_000 / USER_HZ);
        Ok(Self {
            system: ns(f[2]),
            irq: ns(f[5]),
            softirq: ns(f[6]),
        })
    }
}

/// Run time and runs of BPF programs (summed when several).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgRun {
    /// `run_time_ns`.
    pub ns: u64,
    /// `run_cnt`.
    pub runs: u64,
}

/// Time a process's forwarding threads ran and waited to run (`/proc/PID/task/TID/schedstat`:
/// `se.sum_exec_runtime`, `sched_info.run_delay`), nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sched {
    /// On a CPU.
    pub run_ns: u64,
    /// Runnable, waiting for a CPU (another task had it).
    pub wait_ns: u64,
}

impl Sched {
    /// The threads of `pid` whose name (`comm`) starts with one of `names`, summed; `None`
    /// when there are none.
    pub fn of_threads(pid: u32, names: &[&str]) -> Option<Self> {
        let mut sum: Option<Self> = None;
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .flatten()
        {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if !names.iter().any(|n| comm.starts_with(n)) {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
                continue;
            };
            let Some(s) = Self::parse(&text) else {
                continue;
            };
            let t = sum.get_or_insert_with(Self::default);
            t.run_ns += s.run_ns;
            t.wait_ns += s.wait_ns;
        }
        sum
    }

    /// `run_ns wait_ns timeslices`.
    fn parse(text: &str) -> Option<Self> {
        let mut f = text.split_whitespace().map(str::parse::<u64>);
        Some(Self {
            run_ns: f.next()?.ok()?,
            wait_ns: f.next()?.ok()?,
        })
    }
}

/// The id of the XDP program attached to `iface` in namespace `ns`, from `ip link`'s
/// `prog/xdp id N` (or `prog/xdpgeneric`, `prog/xdpdrv`).
pub fn xdp_prog_id(ns: &str, iface: &str) -> Option<u32> {
    let out = Command::new("ip")
        .args(["-n", ns, "-d", "link", "show", "dev", iface])
        .output()
        .ok()?;
    parse_prog_id(&String::from_utf8_lossy(&out.stdout))
}

fn parse_prog_id(text: &str) -> Option<u32> {
    let mut words = text.split_whitespace();
    while let Some(w) = words.next() {
        if w.starts_with("prog/xdp") && words.next() == Some("id") {
            return words.next()?.parse().ok();
        }
    }
    None
}

/// The BPF statistics of the programs `ids` (programs not found count nothing).
pub fn prog_runs(ids: &[u32]) -> ProgRun {
    let mut sum = ProgRun::default();
    if ids.is_empty() {
        return sum;
    }
    for p in libbpf_rs::query::ProgInfoIter::default().filter(|p| ids.contains(&p.id)) {
        sum.ns += p.run_time_ns;
        sum.runs += p.run_cnt;
    }
    sum
}

/// The sum of a counter family's samples in a Prometheus text exposition (`name{...} v` and
/// `name v` lines); `None` when it has none.
pub fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        let v: f64 = rest.rsplit(' ').next()?.parse().ok()?;
        *found.get_or_insert(0.0) += v;
    }
    found
}

/// What was read at one instant of a point.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reading {
    /// The forwarder CPU's kernel time.
    pub kernel: KernelTime,
    /// The forwarder's XDP programs (Strait's steering programs, l2fwd's redirect program).
    pub xdp: ProgRun,
    /// The sink's XDP counter.
    pub sink_xdp: ProgRun,
    /// The gateway's worker busy time, seconds (Strait only).
    pub worker_busy_s: Option<f64>,
    /// Of it, the TX kicks (`strait_worker_kick_seconds_total`), seconds.
    pub worker_kick_s: Option<f64>,
    /// The AF_XDP forwarder's threads' scheduling times.
    pub sched: Option<Sched>,
}

impl Reading {
    /// Reads everything: `cpu`'s `/proc/stat` line, the XDP programs on `fwd_ifaces` in
    /// `fwd_ns` and on `sink_if` in `sink_ns`, with `metrics` the gateway's worker busy time
    /// from that `/metrics` URL (fetched with curl inside `fwd_ns`), and with `threads` the
    /// scheduling times of the forwarder process's threads so named.
    ///
    /// # Errors
    /// When `/proc/stat` cannot be read, or the gateway's `/metrics` has no
    /// `strait_worker_busy_seconds_total`.
    pub fn take(
        cpu: usize,
        (fwd_ns, fwd_ifaces): (&str, &[&str]),
        (sink_ns, sink_if): (&str, &str),
        metrics: Option<&str>,
        threads: Option<(u32, &[&str])>,
    ) -> Result<Self> {
        let kernel = KernelTime::read(cpu)?;
        let ids: Vec<u32> = fwd_ifaces
            .iter()
            .filter_map(|i| xdp_prog_id(fwd_ns, i))
            .collect();
        let xdp = prog_runs(&ids);
        let sink_xdp = prog_runs(
            &xdp_prog_id(sink_ns, sink_if)
                .into_iter()
                .collect::<Vec<_>>(),
        );
        let (worker_busy_s, worker_kick_s) = match metrics {
            None => (None, None),
            Some(url) => {
                let out = Command::new("ip")
                    .args([
                        "netns",
                        "exec",
                        fwd_ns,
                        "curl",
                        "-s",
                        "--max-time",
                        "5",
                        url,
                    ])
                    .output()
                    .context("fetching the gateway's /metrics")?;
                let text = String::from_utf8_lossy(&out.stdout);
                let read = |name: &str| {
                    metric_sum(&text, name)
                        .with_context(|| format!("{url} has no {name} (status {})", out.status))
                };
                (
                    Some(read("strait_worker_busy_seconds_total")?),
                    Some(read("strait_worker_kick_seconds_total")?),
                )
            }
        };
        let sched = threads.and_then(|(pid, names)| Sched::of_threads(pid, names));
        Ok(Self {
            kernel,
            xdp,
            sink_xdp,
            worker_busy_s,
            worker_kick_s,
            sched,
        })
    }

    /// What happened from `self` to `later`.
    pub fn until(&self, later: &Reading) -> Delta {
        let d = |a: u64, b: u64| b.saturating_sub(a);
        Delta {
            system_ns: d(self.kernel.system, later.kernel.system),
            irq_ns: d(self.kernel.irq, later.kernel.irq),
            softirq_ns: d(self.kernel.softirq, later.kernel.softirq),
            xdp_ns: d(self.xdp.ns, later.xdp.ns),
            xdp_runs: d(self.xdp.runs, later.xdp.runs),
            sink_xdp_ns: d(self.sink_xdp.ns, later.sink_xdp.ns),
            worker_ns: seconds_between(self.worker_busy_s, later.worker_busy_s),
            kick_ns: seconds_between(self.worker_kick_s, later.worker_kick_s),
            on_cpu: match (self.sched, later.sched) {
                (Some(a), Some(b)) => {
                    let run = b.run_ns.saturating_sub(a.run_ns);
                    let wait = b.wait_ns.saturating_sub(a.wait_ns);
                    (run > 0).then(|| run as f64 / (run + wait) as f64)
                }
                _ => None,
            },
        }
    }
}

/// Nanoseconds spent during a point, by where.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Delta {
    /// Forwarder CPU, `system`.
    pub system_ns: u64,
    /// Forwarder CPU, `irq`.
    pub irq_ns: u64,
    /// Forwarder CPU, `softirq`.
    pub softirq_ns: u64,
    /// The forwarder's XDP programs.
    pub xdp_ns: u64,
    /// Their runs.
    pub xdp_runs: u64,
    /// The sink's XDP counter.
    pub sink_xdp_ns: u64,
    /// The AF_XDP forwarder's busy time, wall clock (the gateway's workers, or l2fwd's loop).
    pub worker_ns: Option<u64>,
    /// Of `worker_ns`, the TX kicks (`sendto`; on copy-mode AF_XDP the kernel's copy and
    /// transmit of every frame).
    pub kick_ns: Option<u64>,
    /// The share of its runnable time the forwarding thread was on the CPU.
    pub on_cpu: Option<f64>,
}

impl Delta {
    /// The forwarder's busy time with the time other tasks held its core taken out
    /// (`worker_ns` scaled by `on_cpu`; unscaled when the share is unknown).
    pub fn worker_cpu_ns(&self) -> Option<f64> {
        let w = self.worker_ns? as f64;
        Some(w * self.on_cpu.unwrap_or(1.0).clamp(0.0, 1.0))
    }

    /// The TX kicks' part of [`Self::worker_cpu_ns`], scaled the same way.
    pub fn kick_cpu_ns(&self) -> Option<f64> {
        let k = self.kick_ns? as f64;
        Some(k * self.on_cpu.unwrap_or(1.0).clamp(0.0, 1.0))
    }
}

/// Nanoseconds from counter reading `a` to `b`, in seconds; `None` unless both were read.
fn seconds_between(a: Option<f64>, b: Option<f64>) -> Option<u64> {
    Some(((b? - a?).max(0.0) * 1e9) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_lines_in_nanoseconds() {
        let text = "cpu  10 0 20 1000 0 3 40 0 0 0\n\
                    cpu0 5 0 10 500 0 1 20 0 0 0\n\
                    cpu1 5 0 10 500 0 2 20 0 0 0\n\
                    cpu10 7 0 99 500 0 9 99 0 0 0\n\
                    intr 1 2 3\n";
        let t = KernelTime::parse(text, 1).unwrap();
        assert_eq!(
            t,
            KernelTime {
                system: 100_000_000,
                irq: 20_000_000,
                softirq: 200_000_000
            }
        );
        assert_eq!(KernelTime::parse(text, 10).unwrap().system, 990_000_000);
        let e = KernelTime::parse(text, 2).unwrap_err();
        assert!(e.to_string().contains("no cpu2 line"), "{e}");
        assert!(KernelTime::parse("cpu1 1 2 3\n", 1).is_err());
        assert!(KernelTime::read(0).unwrap().softirq < u64::MAX);
    }

    #[test]
    fn schedstat_of_named_threads() {
        assert_eq!(
            Sched::parse("255391673 24051085 719\n"),
            Some(Sched {
                run_ns: 255_391_673,
                wait_ns: 24_051_085
            })
        );
        assert_eq!(Sched::parse("12\n"), None);
        let me = std::process::id();
        let comm = std::fs::read_to_string(format!("/proc/{me}/comm")).unwrap();
        let s = Sched::of_threads(me, &[comm.trim()]).expect("this test's own threads");
        assert!(s.run_ns > 0, "{s:?}");
        assert_eq!(Sched::of_threads(me, &["no such thread name"]), None);
    }

    #[test]
    fn xdp_program_ids_from_ip_link() {
        let generic = "4: fwd0@if3: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 xdpgeneric qdisc \
                       noqueue\n    link/ether 02:00:00:00:00:02 brd ff:ff:ff:ff:ff:ff\n    \
                       prog/xdp id 123 name strait_steer tag 0123456789abcdef jited\n";
        assert_eq!(parse_prog_id(generic), Some(123));
        let native = "    prog/xdpdrv id 9 tag 00 jited";
        assert_eq!(parse_prog_id(native), Some(9));
        assert_eq!(parse_prog_id("4: fwd0: <UP> mtu 1500 qdisc noqueue"), None);
    }

    #[test]
    fn metric_sums_over_labels_and_skips_look_alikes() {
        let text = "# HELP strait_worker_busy_seconds Time.\n\
                    # TYPE strait_worker_busy_seconds counter\n\
                    strait_worker_busy_seconds_total{core=\"fwd0+fwd1/0\"} 1.25\n\
                    strait_worker_busy_seconds_total{core=\"fwd0+fwd1/1\"} 0.5\n\
                    strait_worker_busy_seconds_total_other 9\n";
        assert_eq!(
            metric_sum(text, "strait_worker_busy_seconds_total"),
            Some(1.75)
        );
        assert_eq!(
            metric_sum("up 1\n", "strait_worker_busy_seconds_total"),
            None
        );
        assert_eq!(metric_sum("x 3\n", "x"), Some(3.0));
    }

    #[test]
    fn deltas_never_go_negative() {
        let a = Reading {
            kernel: KernelTime {
                system: 10,
                irq: 0,
                softirq: 100,
            },
            xdp: ProgRun { ns: 50, runs: 5 },
            sink_xdp: ProgRun::default(),
            worker_busy_s: Some(1.0),
            worker_kick_s: Some(0.25),
            sched: Some(Sched {
                run_ns: 1_000,
                wait_ns: 0,
            }),
        };
        let b = Reading {
            kernel: KernelTime {
                system: 30,
                irq: 0,
                softirq: 90,
            },
            xdp: ProgRun { ns: 150, runs: 15 },
            sink_xdp: ProgRun { ns: 7, runs: 1 },
            worker_busy_s: Some(1.5),
            worker_kick_s: Some(0.45),
            sched: Some(Sched {
                run_ns: 4_000,
                wait_ns: 1_000,
            }),
        };
        let d = a.until(&b);
        assert_eq!(d.system_ns, 20);
        assert_eq!(d.softirq_ns, 0);
        assert_eq!((d.xdp_ns, d.xdp_runs, d.sink_xdp_ns), (100, 10, 7));
        assert_eq!(d.worker_ns, Some(500_000_000));
        // On the CPU 3,000 of the 4,000 ns it was runnable: three quarters of the busy time.
        assert_eq!(d.on_cpu, Some(0.75));
        assert_eq!(d.worker_cpu_ns(), Some(375_000_000.0));
        assert_eq!(d.kick_ns, Some(200_000_000));
        assert_eq!(d.kick_cpu_ns(), Some(150_000_000.0));
        let cold = Reading::default().until(&b);
        assert_eq!(
            (
                cold.worker_ns,
                cold.kick_ns,
                cold.on_cpu,
                cold.worker_cpu_ns()
            ),
            (None, None, None, None)
        );
    }
}
