//! `strait-lab l2fwd --driver dpdk`: the `limit-dpdk` system of the line-rate benchmark, the
//! DPDK analogue of [`super::L2fwd`]: frames received on the RX port leave on the TX port
//! with their Ethernet addresses rewritten, through the gateway's own DPDK port driver
//! ([`strait_dpdk::DpdkGroup`], the same mbuf bursts, staging and mempool the gateway's
//! workers use) and no pipeline.
//!
//! ```text
//!   EAL (-l CORE --no-huge -m MB --file-prefix l2fwd-PID)
//!   port 0 = net_af_xdp0,iface=RX ─► rx burst ─► dst/src MAC ─► stage ─► tx burst (the
//!            (or net_af_packet0)                                          turn's kick) ─►
//!   port 1 = net_af_xdp1,iface=TX; frames received on port 1 are freed
//! ```
//!
//! Each port also gets the driver's exception TAP (`RX-x`, `TX-x`), which this forwarder
//! never reads or writes. EAL is initialised on the forwarding thread, whose CPU is EAL's
//! main lcore, so the thread has its mempool cache without registering. Turns that found
//! frames are timed as the gateway's workers time theirs, the burst out (the PMD's `sendto`
//! on these vdevs) apart as the kick ([`super::forward`], the loop `limit` runs too);
//! nothing in the loop allocates.

use std::sync::atomic::AtomicBool;

use anyhow::{bail, Context};
use strait_dpdk::{Dpdk, EalOptions, PortSpec};

use super::forward::{forward, Forwarded};
use super::L2fwdStats;
use crate::vdev::Vdev;

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
    /// `vdev` ports on the interfaces `rx` and `tx` (the wires), their TAPs named `rx-x` and
    /// `tx-x` (cut to the kernel's 15 characters), without hugepages.
    pub fn on(vdev: Vdev, rx: &str, tx: &str, dst_mac: [u8; 6], core: usize) -> Self {
        let tap = |i: &str| {
            let mut t = format!("{i}-x");
            t.truncate(15);
            t
        };
        Self {
            rx_device: vdev.device(0, rx),
            tx_device: vdev.device(1, tx),
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
    let st = forward(
        &mut group,
        src_mac,
        cfg.dst_mac,
        Forwarded::Taken,
        stop,
        &mut publish,
    );
    // The group holds mbufs of the ports' mempool: gone before the ports close.
    drop(group);
    drop(dpdk);
    let st = st?;
    publish(&st);
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_on_a_vdev_and_tap_names() {
        let c = DpdkL2fwdConfig::on(Vdev::AfPacket, "fwd0", "a-very-long-ifname", [2; 6], 1);
        assert_eq!(c.rx_device, "net_af_packet0,iface=fwd0");
        assert_eq!(c.tx_device, "net_af_packet1,iface=a-very-long-ifname");
        assert_eq!(c.taps, ["fwd0-x".to_owned(), "a-very-long-ifn".to_owned()]);
        assert!(c.no_huge);
        let c = DpdkL2fwdConfig::on(Vdev::AfXdp, "fwd0", "fwd1", [2; 6], 1);
        assert_eq!(c.rx_device, "net_af_xdp0,iface=fwd0");
    }
}
