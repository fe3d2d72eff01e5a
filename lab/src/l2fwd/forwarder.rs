//! The `limit` system of the line-rate benchmark (`strait-lab l2fwd`): a plain AF_XDP forwarder
//! that receives on one interface, rewrites the Ethernet addresses and sends on another. No
//! parsing, no table, no flow state: the most any AF_XDP forwarder on this path can do, and so
//! the yardstick the gateway is measured against.
//!
//! ```text
//!   RX iface: strait_redirect (bpf/redirect.bpf.c): IPv4 TCP/UDP ─► xsks[queue], rest XDP_PASS
//!             │
//!   one QueueGroup (shared UMEM): socket 0 on RX iface ─► batch ─► dst/src MAC ─► socket 1 TX
//!                                                                                on TX iface
//! ```
//!
//! The loop is [`super::forward`]'s, over the queue group: the gateway worker's ring
//! discipline, a syscall only when the kernel set `XDP_RING_NEED_WAKEUP` on a ring (always on
//! a TX ring in copy mode, which sends at most 32 frames per `sendto`, so a turn kicks until
//! its TX ring is empty, `QueueGroup::drain_tx`) or to sleep in `poll(2)` when idle.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use libbpf_rs::{MapCore, MapFlags};

use strait_dataplane::xsk::{
    interface_port, Aligned, AttachMode, AttachPolicy, BindMode, BindPolicy, GroupConfig,
    PortConfig, QueueGroup, XdpProgram, XskError,
};

use strait_dataplane::embedded_object;

use super::forward::{forward, Forwarded, L2fwdStats, RX};

/// The compiled program, `bpf/redirect.bpf.c`.
static OBJECT: &Aligned<[u8]> = embedded_object!("redirect");

/// Name of the XDP function in `redirect.bpf.c`.
const PROGRAM: &str = "strait_redirect";

/// Longest the forwarder waits, once stopped, for frames on the TX ring to complete.
const DRAIN: Duration = Duration::from_millis(200);

/// What [`L2fwd::open`] sets up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct L2fwdConfig {
    /// Interface frames arrive on (the redirect program goes here).
    pub rx: String,
    /// Interface frames leave from; its MAC becomes the source MAC.
    pub tx: String,
    /// Queue index, the same on both interfaces.
    pub queue: u32,
    /// Destination MAC written into every frame.
    pub dst_mac: [u8; 6],
    /// Zero-copy or copy (veth has copy only).
    pub bind: BindPolicy,
    /// Attach modes for the redirect program.
    pub attach: AttachPolicy,
}

impl L2fwdConfig {
    /// Queue `queue` from `rx` to `tx`, rewriting the destination to `dst_mac`; zero-copy
    /// falling back to copy, native XDP falling back to generic.
    pub fn new(rx: &str, tx: &str, queue: u32, dst_mac: [u8; 6]) -> Self {
        Self {
            rx: rx.to_owned(),
            tx: tx.to_owned(),
            queue,
            dst_mac,
            bind: BindPolicy::default(),
            attach: AttachPolicy::default(),
        }
    }
}

/// The forwarder: its redirect program on the RX interface and one queue group over both
/// interfaces. Not `Send` (the libbpf object): open it on the thread that runs it.
///
/// Field order is drop order: the program comes off the interface before the sockets close.
#[derive(Debug)]
pub struct L2fwd {
    prog: XdpProgram,
    group: QueueGroup,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
}

impl L2fwd {
    /// Opens the queue group (a socket on each interface, one UMEM), loads the redirect
    /// program, puts the RX socket into its XSKMAP at `cfg.queue` and attaches it to `cfg.rx`
    /// (replacing a program an earlier run left there). Interfaces are looked up in the
    /// calling thread's network namespace.
    ///
    /// # Errors
    /// [`XskError::Config`] when `rx` and `tx` are the same interface; otherwise as
    /// [`QueueGroup::open`], [`interface_port`] and the program's load/attach.
    pub fn open(cfg: &L2fwdConfig) -> Result<Self, XskError> {
        if cfg.rx == cfg.tx {
            return Err(XskError::Config(format!(
                "l2fwd needs two interfaces, got {} for both RX and TX",
                cfg.rx
            )));
        }
        let src_mac = interface_port(&cfg.tx)?.mac_addr().octets();
        let group = QueueGroup::open(&GroupConfig {
            bind: cfg.bind,
            ..GroupConfig::new(
                cfg.queue,
                vec![PortConfig::new(&cfg.rx, 0), PortConfig::new(&cfg.tx, 1)],
            )
        })?;
        let mut prog = XdpProgram::load(&OBJECT.0, PROGRAM, &cfg.rx)?;
        let xsks = prog.map("xsks")?;
        let fd = group.ports()[RX].as_fd().as_raw_fd() as u32;
        xsks.update(&cfg.queue.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
            .map_err(|source| XskError::Bpf {
                iface: cfg.rx.clone(),
                call: "update xsks",
                source,
            })?;
        prog.attach(cfg.attach)?;
        Ok(Self {
            prog,
            group,
            src_mac,
            dst_mac: cfg.dst_mac,
        })
    }

    /// The mode the sockets are bound in.
    pub fn bind_mode(&self) -> BindMode {
        self.group.bind_mode()
    }

    /// The mode the redirect program is attached in.
    pub fn attach_mode(&self) -> AttachMode {
        self.prog.mode().unwrap_or(AttachMode::Native)
    }

    /// The source MAC written into every frame (the TX interface's).
    pub fn src_mac(&self) -> [u8; 6] {
        self.src_mac
    }

    /// The queue group, for its accounting and kernel statistics.
    pub fn group(&self) -> &QueueGroup {
        &self.group
    }

    /// Forwards until `stop` is set, then waits (at most 200 ms) for the frames on the TX ring
    /// to complete, and returns the statistics. `publish` sees them when the loop turns idle
    /// and every [`PUBLISH_EVERY`] batches while busy, to copy them where a reporter reads.
    ///
    /// # Errors
    /// [`XskError::Io`] when a `sendto`, `recvfrom` or `poll` fails in a way retrying cannot
    /// fix.
    pub fn run<P: FnMut(&L2fwdStats)>(
        &mut self,
        stop: &AtomicBool,
        mut publish: P,
    ) -> Result<L2fwdStats, XskError> {
        let group = &mut self.group;
        let mut st = forward(
            group,
            self.src_mac,
            self.dst_mac,
            Forwarded::Completions,
            stop,
            &mut publish,
        )?;
        let deadline = Instant::now() + DRAIN;
        while st.forwarded < st.tx && Instant::now() < deadline {
            st.tx_kicks += group.flush_tx()? as u64;
            st.forwarded += group.reap_completions() as u64;
            std::hint::spin_loop();
        }
        publish(&st);
        Ok(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_is_embedded() {
        crate::assert_embedded(&OBJECT.0);
    }

    #[test]
    fn one_interface_for_both_directions_is_refused() {
        let e = L2fwd::open(&L2fwdConfig::new("strait-nope0", "strait-nope0", 0, [2; 6]))
            .expect_err("same interface");
        assert!(matches!(e, XskError::Config(_)), "{e:?}");
        assert!(e.to_string().contains("strait-nope0"), "{e}");
    }

    #[test]
    fn a_missing_interface_is_named() {
        let e = L2fwd::open(&L2fwdConfig::new("strait-nope0", "strait-nope1", 0, [2; 6]))
            .expect_err("no such interface");
        assert!(e.to_string().contains("strait-nope1"), "{e}");
    }
}
