//! `strait-lab l2fwd --driver dpdk`: the `limit-dpdk` system of the line-rate benchmark, the
//! DPDK analogue of [`super::L2fwd`]: frames received on the RX port leave on the TX port
//! with their Ethernet addresses rewritten, through the gateway's own DPDK port driver
//! ([`strait_dpdk::DpdkGroup`], the same mbuf bursts, staging and mempool the gateway's
//! workers use) and no pipeline.
//!
//! ```text
//!   EAL (-l CORE --no-huge -m MB --file-prefix l2fwd-PID)
//!   port 0 = net_af_packet0,iface=RX ─► rx burst ─► dst/src MAC ─► tx burst ─► port 1 =
//!                                                                  net_af_packet1,iface=TX
//!   frames received on port 1 are freed (the kernel, which still sees that wire, routes
//!   them as it does for the AF_XDP `limit`)
//! ```
//!
//! Each port also gets the driver's exception TAP (`RX-x`, `TX-x`), which this forwarder
//! never reads or writes. EAL is initialised on the forwarding thread, whose CPU is EAL's
//! main lcore, so the thread has its mempool cache without registering. Turns that found
//! frames are timed as the gateway's workers time theirs ([`BusyTime`]); nothing in the
//! loop allocates.

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Context};
use strait_dataplane::rewrite::Frame;
use strait_dataplane::xsk::worker::{IDLE_POLL_MS, IDLE_SPINS, PUBLISH_EVERY};
use strait_dataplane::xsk::{Clock, MonotonicClock, PortDriver};
use strait_dpdk::{Dpdk, DpdkGroup, EalOptions, Mbuf, PortSpec, RX_BURST};

use super::L2fwdStats;

/// Frames read per turn: one burst, as the gateway's DPDK workers read.
const B: usize = RX_BURST as usize;
/// The RX port's index in the group.
const RX: usize = 0;
/// The TX port's index in the group.
const TX: usize = 1;
/// Shortest frame forwarded: an Ethernet header.
const ETH_HLEN: usize = 14;
/// EAL memory, MiB: two ports' descriptors and one mempool need well under it.
pub const MEMORY_MB: u32 = 512;

/// What the DPDK forwarder is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DpdkL2fwdConfig {
    /// The RX port's EAL device (`net_af_packet0,iface=fwd0` or a PCI address).
    pub rx_device: String,
    /// The TX port's EAL device.
    pub tx_device: String,
    /// Names of the two exception TAPs (the driver opens one per port).
    pub taps: [String; 2],
    /// Destination MAC written into every frame; the source is the TX port's MAC.
    pub dst_mac: [u8; 6],
    /// EAL's main lcore: the CPU the forwarding thread runs on.
    pub core: usize,
    /// Run EAL without hugepages.
    pub no_huge: bool,
}

impl DpdkL2fwdConfig {
    /// `net_af_packet` ports on the interfaces `rx` and `tx` (the wires), their TAPs named
    /// `rx-x` and `tx-x` (cut to the kernel's 15 characters), without hugepages.
    pub fn af_packet(rx: &str, tx: &str, dst_mac: [u8; 6], core: usize) -> Self {
        let tap = |i: &str| {
            let mut t = format!("{i}-x");
            t.truncate(15);
            t
        };
        Self {
            rx_device: format!("net_af_packet0,iface={rx}"),
            tx_device: format!("net_af_packet1,iface={tx}"),
            taps: [tap(rx), tap(tx)],
            dst_mac,
            core,
            no_huge: true,
        }
    }
}

/// Opens EAL and both ports on the calling thread, calls `ready` with a line describing them,
/// forwards until `stop` is set and returns the statistics; `publish` sees them when the loop
/// turns idle and every [`PUBLISH_EVERY`] batches while busy.
///
/// # Errors
/// EAL or a port refused ([`strait_dpdk::DpdkError`], naming the device and call), or the
/// TAP's `poll(2)` failed.
pub fn run<R: FnOnce(String), P: FnMut(&L2fwdStats)>(
    cfg: &DpdkL2fwdConfig,
    stop: &AtomicBool,
    ready: R,
    mut publish: P,
) -> anyhow::Result<L2fwdStats> {
    if cfg.rx_device == cfg.tx_device {
        bail!(
            "l2fwd needs two ports, got {} for both RX and TX",
            cfg.rx_device
        );
    }
    let opts = EalOptions {
        cores: vec![cfg.core],
        memory_mb: Some(MEMORY_MB),
        no_huge: cfg.no_huge,
        file_prefix: format!("l2fwd-{}", std::process::id()),
    };
    let specs = [
        (&cfg.taps[0], &cfg.rx_device, 0u8),
        (&cfg.taps[1], &cfg.tx_device, 1u8),
    ]
    .map(|(name, device, table_port)| PortSpec {
        name: name.clone(),
        device: device.clone(),
        table_port,
        queues: vec![0],
        mtu: 1500,
    });
    let mut dpdk = Dpdk::open(&opts, &specs).context("opening the DPDK ports")?;
    let src_mac = dpdk.mac(&cfg.taps[1]).context("the TX port has no MAC")?;
    let mut group = dpdk.group(0, &[0, 1]).context("setting up queue 0")?;
    dpdk.start().context("starting the DPDK ports")?;
    ready(format!(
        "l2fwd (DPDK {}) {} -> {}, src {}, dst {}, EAL lcore {}",
        strait_dpdk::version(),
        cfg.rx_device,
        cfg.tx_device,
        strait_config::MacAddr(src_mac),
        strait_config::MacAddr(cfg.dst_mac),
        cfg.core
    ));
    let st = forward(&mut group, src_mac, cfg.dst_mac, stop, &mut publish);
    let dropped = group.stats().tx_dropped;
    // The group holds mbufs of the ports' mempool: gone before the ports close.
    drop(group);
    drop(dpdk);
    let mut st = st?;
    st.tx_ring_full += dropped;
    publish(&st);
    Ok(st)
}

/// The loop: burst in on [`RX`], rewrite, stage and burst out on [`TX`]; whatever arrives on
/// [`TX`] is freed.
fn forward<P: FnMut(&L2fwdStats)>(
    group: &mut DpdkGroup,
    src: [u8; 6],
    dst: [u8; 6],
    stop: &AtomicBool,
    publish: &mut P,
) -> anyhow::Result<L2fwdStats> {
    let mut st = L2fwdStats::default();
    let mut held: [Mbuf; B] = std::array::from_fn(|_| Mbuf::default());
    let mut idle = 0u32;
    let mut clock = MonotonicClock::new();
    while !stop.load(Ordering::Relaxed) {
        let turn = clock.now_ns();
        if !group.rx_ready() {
            idle += 1;
            if idle == 1 {
                publish(&st);
            }
            if idle >= IDLE_SPINS {
                idle = 0;
                st.idle_polls += 1;
                group.wait_rx(IDLE_POLL_MS)?;
            }
            continue;
        }
        idle = 0;
        let (n, invalid) = group.read_rx(RX, &mut held);
        st.invalid_rx += invalid as u64;
        if n > 0 {
            st.rx += n as u64;
            st.batches += 1;
            forward_batch(group, &mut held[..n], dst, src, &mut st);
            if st.batches % PUBLISH_EVERY == 0 {
                publish(&st);
            }
        }
        let (m, _) = group.read_rx(TX, &mut held);
        for h in &mut held[..m] {
            group.recycle(std::mem::take(h));
        }
        // The PMD sends inside the batch (no kick of its own to time apart).
        let end = clock.now_ns();
        st.busy.turn(turn, end, end);
    }
    Ok(st)
}

/// Rewrites the Ethernet addresses of `batch` in place and sends it on [`TX`]; runts and
/// frames the TX side has no room for are freed and counted.
#[inline]
fn forward_batch(
    group: &mut DpdkGroup,
    batch: &mut [Mbuf],
    dst: [u8; 6],
    src: [u8; 6],
    st: &mut L2fwdStats,
) {
    let n = batch.len();
    let mut ok = [false; B];
    {
        // Placeholders over an empty buffer (no allocation); `lend` replaces the first `n`.
        let mut frames: [Frame<'_>; B] = std::array::from_fn(|_| Frame::new(&mut [], 0, 0));
        group.lend(batch, &mut frames[..n]);
        for (f, ok) in frames[..n].iter_mut().zip(&mut ok) {
            let d = f.data_mut();
            if d.len() >= ETH_HLEN {
                d[..6].copy_from_slice(&dst);
                d[6..12].copy_from_slice(&src);
                *ok = true;
            }
        }
    }
    for (h, ok) in batch.iter_mut().zip(&ok[..n]) {
        let h = std::mem::take(h);
        if !ok {
            st.runts += 1;
            group.recycle(h);
            continue;
        }
        if let Err(h) = group.stage_tx(TX, h) {
            st.tx_ring_full += 1;
            group.recycle(h);
        }
    }
    let sent = group.submit_tx() as u64;
    st.tx += sent;
    st.forwarded += sent;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn af_packet_ports_and_tap_names() {
        let c = DpdkL2fwdConfig::af_packet("fwd0", "a-very-long-ifname", [2; 6], 1);
        assert_eq!(c.rx_device, "net_af_packet0,iface=fwd0");
        assert_eq!(c.tx_device, "net_af_packet1,iface=a-very-long-ifname");
        assert_eq!(c.taps, ["fwd0-x".to_owned(), "a-very-long-ifn".to_owned()]);
        assert!(c.no_huge);
    }
}
