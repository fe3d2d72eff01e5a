//! The DPDK virtual device a lab port runs on: the gateway's DPDK ports (testbed and
//! line-rate bench) and `strait-lab l2fwd --driver dpdk` sit on a veth through one of these,
//! as a DPDK application sits on a NIC's PCI address.

use serde::{Deserialize, Serialize};

/// A DPDK PMD over a kernel interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Vdev {
    /// `net_af_packet`: a PACKET_MMAP socket; the kernel's stack still sees what arrives
    /// (the lab drops it at nftables ingress), and a burst out is a `sendto` over a copy.
    AfPacket,
    /// `net_af_xdp`: an AF_XDP socket (copy mode on a veth) fed by libxdp's program, which
    /// takes every frame of the queue from the kernel, as a NIC bound to DPDK does; the
    /// mempool is the UMEM.
    #[default]
    AfXdp,
}

impl Vdev {
    /// The PMD's name.
    pub const fn pmd(self) -> &'static str {
        match self {
            Vdev::AfPacket => "net_af_packet",
            Vdev::AfXdp => "net_af_xdp",
        }
    }

    /// The EAL device of port `index` on interface `iface`, as `--vdev` and the gateway's
    /// `device =` take it: `net_af_xdp0,iface=fwd0`.
    pub fn device(self, index: usize, iface: &str) -> String {
        format!("{}{index},iface={iface}", self.pmd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_name_the_pmd_the_index_and_the_interface() {
        assert_eq!(
            Vdev::AfPacket.device(0, "fwd0"),
            "net_af_packet0,iface=fwd0"
        );
        assert_eq!(Vdev::AfXdp.device(1, "fwd1"), "net_af_xdp1,iface=fwd1");
    }
}
