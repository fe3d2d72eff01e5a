//! The line-rate testbed: three namespaces joined by two veth pairs, and the processes that
//! run in them.
//!
//! ```text
//! P-gen                     P-fwd (system under test)                      P-sink
//! gen0 192.0.2.1/24 <-veth-> fwd0 192.0.2.254/24  fwd1 198.51.100.254/24 <-veth-> sink0 198.51.100.2/24
//!      02:00:00:00:0a:01     02:00:00:00:0a:fe    02:00:00:00:0b:fe            02:00:00:00:0b:01
//! ```
//!
//! Every veth is created inside its namespaces (`ip -n P-gen link add gen0 ... peer name
//! fwd0 netns P-fwd`), so the namespace this process runs in never sees a link, address or
//! route of the bench. [`Topology`] deletes the three namespaces on drop, which removes the
//! veths with them, also when a step fails half-way or the bench panics; [`Proc`] stops its
//! process (SIGTERM, then SIGKILL) on drop, so no namespace is kept alive by a stray child.
//!
//! What P-fwd is given, for every system:
//! - `ip_forward=1`, `rp_filter=0` and `accept_local=1`: reflected latency probes come back
//!   from the sink with a VIP as source address (Strait puts its VIPs on `lo`, which would
//!   make them martians) and are routed by the kernel to the generator.
//! - permanent neighbour entries: every endpoint address (198.51.100.10 to .249) at the sink's
//!   MAC on `fwd1`, and the probe source 192.0.2.1 at the generator's MAC on `fwd0`.
//! - GRO on `fwd1`: a veth delivers the sink's `XDP_TX` (the reflected probes) only to a peer
//!   that runs NAPI.
//! - RPS on `fwd0` to the forwarder core: kernel forwarding runs in the softirq of the CPU
//!   that receives, which for a veth is the CPU that sent (the generator's); RPS moves the
//!   kernel peers' whole forwarding path (conntrack, nat, routing, the sink's XDP) to the
//!   forwarder core. The AF_XDP systems' XDP programs run before RPS, on the sender's CPU,
//!   as on any veth.
//!
//! With DPDK ([`Wires`]) a veth of P-fwd is the wire of a DPDK port, as a NIC bound to DPDK
//! would be: the kernel's stack is blind to what it receives (`net_af_xdp`: libxdp's program
//! redirects every frame to the port's socket; `net_af_packet`: an nftables ingress drop,
//! which runs after the packet socket took its copy), and no RPS, so that copy (the
//! testbed's stand-in for a NIC's DMA into the port's ring) stays on the sending CPU as the
//! AF_XDP systems' XDP program and copy do. `limit-dpdk` ([`Wires::DpdkIn`]) turns only
//! `fwd0` into a wire: the kernel keeps `fwd1` and routes the reflected probes back, as for
//! `limit` (with `net_af_packet`; a `net_af_xdp` TX port takes them, and `limit-dpdk` then
//! has no latency figure). Strait on DPDK ([`Wires::Dpdk`]) turns both into wires; the gateway's kernel
//! sides are the persistent TAPs [`TAP_IN`] and [`TAP_OUT`], with the ports' MACs, the
//! addresses and the neighbour entries `fwd0` and `fwd1` have otherwise.

use std::fmt::Write as _;
use std::fs::File;
use std::io::Read as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::peers::{self, Netns};

/// The generator's interface (in `P-gen`).
pub const GEN_IF: &str = "gen0";
/// The forwarder's client-side interface (in `P-fwd`).
pub const FWD_IN: &str = "fwd0";
/// The forwarder's backend-side interface (in `P-fwd`).
pub const FWD_OUT: &str = "fwd1";
/// The sink's interface (in `P-sink`).
pub const SINK_IF: &str = "sink0";
/// `gen0`'s MAC.
pub const GEN_MAC: &str = "02:00:00:00:0a:01";
/// The kernel side of the DPDK port on `fwd0` (Strait on DPDK; the interface's name in its
/// configuration).
pub const TAP_IN: &str = "tap-fwd0";
/// The kernel side of the DPDK port on `fwd1`.
pub const TAP_OUT: &str = "tap-fwd1";
/// `fwd0`'s MAC: the destination of every generated frame.
pub const FWD_IN_MAC: &str = "02:00:00:00:0a:fe";
/// `fwd1`'s MAC.
pub const FWD_OUT_MAC: &str = "02:00:00:00:0b:fe";
/// `sink0`'s MAC: the next hop of every endpoint.
pub const SINK_MAC: &str = "02:00:00:00:0b:01";
/// The generator's own address, also the source of its latency probes.
pub const GEN_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// `fwd0`'s address.
pub const FWD_IN_ADDR: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 254);
/// `fwd1`'s address.
pub const FWD_OUT_ADDR: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 254);
/// `sink0`'s address.
pub const SINK_ADDR: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);
/// First endpoint address's last octet (198.51.100.10).
pub const FIRST_ENDPOINT_OCTET: u8 = 10;
/// Endpoint addresses: 198.51.100.10 to .249.
pub const ENDPOINT_ADDRS: usize = 240;
/// The VIP range, routed to the forwarder from the generator's namespace.
pub const VIP_NET: &str = "203.0.113.0/24";
/// The generator's source addresses (not configured on `gen0`: AF_XDP frames need none).
pub const SRC_RANGE: &str = "192.0.2.16-192.0.2.250";

/// How long a stopped process may take to exit after SIGTERM before it is killed. The
/// sink and generator print their summary and detach their XDP program in milliseconds;
/// `strait run` drains its workers and removes its VIPs in well under a second on a quiet
/// machine, but took more than 5 s twice on the shared 2-vCPU VM at a load average near 10
/// (10,000 VIPs to remove, DPDK ports to close), which failed the run: 20 s leaves room for
/// that and still ends a hung process.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// Poll interval while waiting for a process or an interface.
const POLL: Duration = Duration::from_millis(20);

/// What the forwarder's veths are to the kernel of P-fwd (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wires {
    /// Kernel interfaces (the AF_XDP systems and the kernel peers).
    Kernel,
    /// `fwd0` the wire of a DPDK port, `fwd1` the kernel's (`limit-dpdk`).
    DpdkIn,
    /// Both wires of DPDK ports, the kernel's side on [`TAP_IN`] and [`TAP_OUT`].
    Dpdk,
}

/// The three namespaces and two veth pairs; all removed on drop.
#[derive(Debug)]
pub struct Topology {
    /// Where the processes' logs and the generated configuration go (the caller's; kept).
    dir: PathBuf,
    // Dropped in order: the namespaces (and with them the veths).
    gen: Netns,
    fwd: Netns,
    sink: Netns,
}

impl Topology {
    /// Builds the topology under `prefix` (namespaces `{prefix}-gen`, `-fwd`, `-sink`), with
    /// kernel forwarding steered to CPU `fwd_core` (see the module docs); logs and
    /// configuration go to `dir` (created; the caller removes it).
    ///
    /// # Errors
    ///
    /// The failing `ip` / `sysctl` / `ethtool` command; what was made before is removed.
    pub fn up(prefix: &str, fwd_core: usize, dir: &Path, wires: Wires) -> Result<Self> {
        let make = |role: &str| {
            Netns::create(&format!("{prefix}-{role}"))
                .with_context(|| format!("creating namespace {prefix}-{role}"))
        };
        let (gen, fwd, sink) = (make("gen")?, make("fwd")?, make("sink")?);
        let t = Topology {
            dir: dir.to_owned(),
            gen,
            fwd,
            sink,
        };
        std::fs::create_dir_all(&t.dir).with_context(|| format!("creating {}", t.dir.display()))?;
        t.wire(fwd_core, wires)?;
        Ok(t)
    }

    fn wire(&self, fwd_core: usize, wires: Wires) -> Result<()> {
        let (gen, fwd, sink) = (self.gen(), self.fwd(), self.sink());
        ip(
            gen,
            &format!(
                "link add {GEN_IF} address {GEN_MAC} type veth peer name {FWD_IN} \
                 address {FWD_IN_MAC} netns {fwd}"
            ),
        )?;
        ip(
            sink,
            &format!(
                "link add {SINK_IF} address {SINK_MAC} type veth peer name {FWD_OUT} \
                 address {FWD_OUT_MAC} netns {fwd}"
            ),
        )?;
        sysctl(
            gen,
            &[
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ],
        )?;
        sysctl(
            sink,
            &[
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ],
        )?;
        sysctl(
            fwd,
            &[
                "net.ipv4.ip_forward=1",
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
                "net.ipv4.conf.all.accept_local=1",
                "net.ipv4.conf.default.accept_local=1",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ],
        )?;
        // Interfaces were created before the defaults above: set theirs too.
        sysctl(
            fwd,
            &[
                &format!("net.ipv4.conf.{FWD_IN}.rp_filter=0"),
                &format!("net.ipv4.conf.{FWD_OUT}.rp_filter=0"),
                &format!("net.ipv4.conf.{FWD_IN}.accept_local=1"),
                &format!("net.ipv4.conf.{FWD_OUT}.accept_local=1"),
            ],
        )?;
        sysctl(gen, &[&format!("net.ipv4.conf.{GEN_IF}.rp_filter=0")])?;
        exec(fwd, "ethtool", &["-K", FWD_OUT, "gro", "on"])?;

        ip(gen, &format!("addr add {GEN_ADDR}/24 dev {GEN_IF}"))?;
        ip(gen, &format!("link set {GEN_IF} up"))?;
        ip(gen, &format!("route add {VIP_NET} via {FWD_IN_ADDR}"))?;
        ip(sink, &format!("addr add {SINK_ADDR}/24 dev {SINK_IF}"))?;
        ip(sink, &format!("link set {SINK_IF} up"))?;
        // The kernel's interfaces on the client and the backend side.
        let (k_in, k_out) = if wires == Wires::Dpdk {
            for (tap, mac) in [(TAP_IN, FWD_IN_MAC), (TAP_OUT, FWD_OUT_MAC)] {
                ip(fwd, &format!("tuntap add dev {tap} mode tap"))?;
                ip(fwd, &format!("link set {tap} address {mac}"))?;
                sysctl(
                    fwd,
                    &[
                        &format!("net.ipv4.conf.{tap}.rp_filter=0"),
                        &format!("net.ipv4.conf.{tap}.accept_local=1"),
                    ],
                )?;
                ip(fwd, &format!("link set {tap} up"))?;
            }
            (TAP_IN, TAP_OUT)
        } else {
            (FWD_IN, FWD_OUT)
        };
        ip(fwd, &format!("addr add {FWD_IN_ADDR}/24 dev {k_in}"))?;
        ip(fwd, &format!("addr add {FWD_OUT_ADDR}/24 dev {k_out}"))?;
        ip(fwd, &format!("link set {FWD_IN} up"))?;
        ip(fwd, &format!("link set {FWD_OUT} up"))?;
        let dpdk_wires: &[&str] = match wires {
            Wires::Kernel => &[],
            Wires::DpdkIn => &[FWD_IN],
            Wires::Dpdk => &[FWD_IN, FWD_OUT],
        };
        if !dpdk_wires.is_empty() {
            exec(fwd, "nft", &["add", "table", "netdev", "strait-wire"])?;
        }
        for w in dpdk_wires {
            exec(
                fwd,
                "nft",
                &[&format!(
                    "add chain netdev strait-wire {w} {{ type filter hook ingress device {w} \
                     priority 0 ; policy drop ; }}"
                )],
            )
            .with_context(|| format!("making {w} the wire of a DPDK port"))?;
        }

        let mut batch = String::new();
        let _ = writeln!(
            batch,
            "neigh replace {GEN_ADDR} lladdr {GEN_MAC} nud permanent dev {k_in}"
        );
        for k in 0..ENDPOINT_ADDRS {
            let _ = writeln!(
                batch,
                "neigh replace {} lladdr {SINK_MAC} nud permanent dev {k_out}",
                endpoint_addr(k)
            );
        }
        peers::run_in(fwd, "ip", &["-batch", "-"], Some(&batch))
            .context("adding the endpoints' neighbour entries")?;

        if wires != Wires::Kernel {
            return Ok(());
        }
        let mask = format!("{:x}", 1u128 << fwd_core.min(127));
        let rps = format!("/sys/class/net/{FWD_IN}/queues/rx-0/rps_cpus");
        exec(fwd, "sh", &["-c", &format!("echo {mask} > {rps}")])
            .context("steering fwd0's kernel receive path (RPS) to the forwarder core")?;
        Ok(())
    }

    /// The generator's namespace.
    pub fn gen(&self) -> &str {
        self.gen.name()
    }

    /// The forwarder's namespace.
    pub fn fwd(&self) -> &str {
        self.fwd.name()
    }

    /// The sink's namespace.
    pub fn sink(&self) -> &str {
        self.sink.name()
    }

    /// The directory of logs and configuration files of this topology.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether `iface` in `ns` has an XDP program attached (`ip link` shows `xdp`).
    pub fn has_xdp(ns: &str, iface: &str) -> bool {
        Command::new("ip")
            .args(["-n", ns, "-d", "link", "show", "dev", iface])
            .output()
            .is_ok_and(|o| {
                let s = String::from_utf8_lossy(&o.stdout);
                s.contains("prog/xdp") || s.contains(" xdp")
            })
    }
}

/// Endpoint address `k` (0-based): 198.51.100.(10 + k % 240).
pub fn endpoint_addr(k: usize) -> Ipv4Addr {
    let o = FIRST_ENDPOINT_OCTET as usize + k % ENDPOINT_ADDRS;
    Ipv4Addr::new(198, 51, 100, u8::try_from(o).unwrap_or(u8::MAX))
}

/// `ip -n NS args...` (`args` split on whitespace).
fn ip(ns: &str, args: &str) -> Result<()> {
    let mut argv = vec!["-n", ns];
    argv.extend(args.split_whitespace());
    let out = Command::new("ip")
        .args(&argv)
        .output()
        .context("cannot run `ip` (apt-get install -y iproute2)")?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed: {}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `ip netns exec NS program args...`.
fn exec(ns: &str, program: &str, args: &[&str]) -> Result<()> {
    peers::run_in(ns, program, args, None)?;
    Ok(())
}

fn sysctl(ns: &str, keys: &[&str]) -> Result<()> {
    let mut args = vec!["-q", "-w"];
    args.extend_from_slice(keys);
    exec(ns, "sysctl", &args)
}

/// A process started in a namespace (`ip netns exec NS program args`, which execs, so the
/// child's pid is the program's). Its stdout is collected in a file for [`Proc::finish`],
/// its stderr (human progress) in a log shown when something fails. Stopped on drop.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Option<Child>,
    stdout: PathBuf,
    log: PathBuf,
}

impl Proc {
    /// Starts `program args` in `ns`, naming it `name` (also the log files' stem in `dir`).
    ///
    /// # Errors
    ///
    /// When `ip` cannot be started or the log files cannot be created.
    pub fn spawn(
        name: &str,
        dir: &Path,
        ns: &str,
        program: &Path,
        args: &[String],
    ) -> Result<Self> {
        let stdout = dir.join(format!("{name}.out"));
        let log = dir.join(format!("{name}.log"));
        let out_file =
            File::create(&stdout).with_context(|| format!("creating {}", stdout.display()))?;
        let log_file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out_file)
            .stderr(log_file)
            .spawn()
            .with_context(|| {
                format!("starting {name}: ip netns exec {ns} {}", program.display())
            })?;
        Ok(Self {
            name: name.to_owned(),
            child: Some(child),
            stdout,
            log,
        })
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process has exited (and then with what), without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Waits up to `timeout` for the process to exit on its own, then stops it; returns
    /// its stdout.
    ///
    /// # Errors
    ///
    /// When it exited with a failure (its log's last lines are in the error) or had to be
    /// stopped.
    pub fn finish(mut self, timeout: Duration) -> Result<String> {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.exited() {
                break s;
            }
            if super::interrupted().is_err() {
                self.stop();
                bail!("{}: interrupted", self.name);
            }
            if start.elapsed() >= timeout {
                self.stop();
                bail!(
                    "{} did not finish within {:.1} s{}",
                    self.name,
                    timeout.as_secs_f64(),
                    self.log_tail()
                );
            }
            thread::sleep(POLL);
        };
        self.child = None;
        if !status.success() {
            bail!("{} failed ({status}){}", self.name, self.log_tail());
        }
        self.read_stdout()
    }

    /// Sends SIGTERM (the programs print their summary on it) and returns stdout once the
    /// process has exited.
    ///
    /// # Errors
    ///
    /// As [`Proc::finish`].
    pub fn terminate(mut self) -> Result<String> {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let status = self.wait(STOP_TIMEOUT);
        self.child = None;
        match status {
            Some(s) if s.success() => self.read_stdout(),
            Some(s) => bail!("{} failed ({s}){}", self.name, self.log_tail()),
            None => bail!(
                "{} did not exit within {:.0} s of SIGTERM (killed){}",
                self.name,
                STOP_TIMEOUT.as_secs_f64(),
                self.log_tail()
            ),
        }
    }

    fn read_stdout(&self) -> Result<String> {
        std::fs::read_to_string(&self.stdout)
            .with_context(|| format!("reading {}'s output", self.name))
    }

    /// Waits up to `timeout`; kills the process when it is still there.
    fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            thread::sleep(POLL);
        }
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        None
    }

    fn stop(&mut self) {
        if self.child.is_none() || self.exited().is_some() {
            return;
        }
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let _ = self.wait(STOP_TIMEOUT);
    }

    /// Whether the process's log (its stderr) holds `text`.
    pub fn log_contains(&self, text: &str) -> bool {
        std::fs::read_to_string(&self.log).is_ok_and(|s| s.contains(text))
    }

    /// `": last lines of the log"`, or nothing when the log is empty.
    pub fn log_tail(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        let lines: Vec<&str> = s.trim().lines().collect();
        if lines.is_empty() {
            return String::new();
        }
        let tail = &lines[lines.len().saturating_sub(LOG_LINES)..];
        format!(
            "; last lines of {}:\n  {}",
            self.log.display(),
            tail.join("\n  ")
        )
    }
}

/// Lines of a process's log quoted in an error.
const LOG_LINES: usize = 8;

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_stay_in_their_range() {
        assert_eq!(endpoint_addr(0), Ipv4Addr::new(198, 51, 100, 10));
        assert_eq!(endpoint_addr(239), Ipv4Addr::new(198, 51, 100, 249));
        assert_eq!(endpoint_addr(240), Ipv4Addr::new(198, 51, 100, 10));
        for k in 0..1000 {
            let a = endpoint_addr(k);
            assert!(a != SINK_ADDR && a != FWD_OUT_ADDR, "{a}");
        }
    }
}
