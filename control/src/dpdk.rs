//! DPDK ports for interfaces with `driver = "dpdk"`, when the gateway is built with the
//! cargo feature `dpdk` (`strait-dpdk`, which needs DPDK's development files); a build
//! without it refuses such a configuration, in `strait check` and `strait run`, with the
//! interface named.
//!
//! EAL is initialised and the ports opened before anything reads the interfaces: each
//! port's exception TAP carries the interface's name and the port's MAC, and the rest of
//! the gateway (the table's port MACs, neighbours, VIPs, health checks) sees the TAP as it
//! would see an AF_XDP interface.

use strait_config::model::{Config, Driver};

/// Whether this build has the DPDK driver.
pub const BUILT: bool = cfg!(feature = "dpdk");

/// The interfaces of `cfg` that use DPDK.
pub fn interfaces(cfg: &Config) -> impl Iterator<Item = (&str, &str)> {
    cfg.gateway
        .interfaces
        .iter()
        .filter_map(|i| match &i.driver {
            Driver::Dpdk { device } => Some((i.name.as_str(), device.as_str())),
            Driver::AfXdp => None,
        })
}

/// Why this build cannot run `cfg`: a DPDK interface without the `dpdk` feature.
pub fn unsupported(cfg: &Config) -> Option<String> {
    if BUILT {
        return None;
    }
    let (name, _) = interfaces(cfg).next()?;
    let index = cfg
        .gateway
        .interfaces
        .iter()
        .position(|x| x.name == name)
        .unwrap_or(0);
    Some(format!(
        "gateway.interfaces[{index}].driver: interface {name} uses driver = \"dpdk\", but this strait was built without DPDK support; build it with `cargo build --release -p strait-control --features dpdk` (needs DPDK's development files, Debian: dpdk-dev), or use driver = \"af_xdp\""
    ))
}

/// The gateway's DPDK ports (EAL with them); dropped after the workers.
#[cfg(feature = "dpdk")]
pub type Ports = strait_dpdk::Dpdk;

/// Without the `dpdk` feature there are never ports.
#[cfg(not(feature = "dpdk"))]
#[derive(Debug)]
pub enum Ports {}

/// EAL and the DPDK ports of `cfg`, or `None` when it has no DPDK interface.
///
/// # Errors
/// A DPDK interface in a build without the feature; EAL or a port refusing (named).
pub fn open(cfg: &Config) -> anyhow::Result<Option<Ports>> {
    if let Some(why) = unsupported(cfg) {
        anyhow::bail!("{why}");
    }
    if interfaces(cfg).next().is_none() {
        return Ok(None);
    }
    #[cfg(feature = "dpdk")]
    {
        open_ports(cfg).map(Some)
    }
    #[cfg(not(feature = "dpdk"))]
    unreachable!("unsupported() refused DPDK interfaces")
}

#[cfg(feature = "dpdk")]
fn open_ports(cfg: &Config) -> anyhow::Result<Ports> {
    use anyhow::Context;
    let g = &cfg.gateway;
    let d = g.dpdk.clone().unwrap_or_default();
    let mut cores: Vec<usize> = g
        .interfaces
        .iter()
        .flat_map(|i| i.cores.iter().flatten().copied())
        .collect();
    cores.dedup();
    let opts = strait_dpdk::EalOptions {
        cores,
        memory_mb: d.memory_mb,
        no_huge: d.no_huge,
        file_prefix: d
            .file_prefix
            .unwrap_or_else(|| format!("strait-{}", std::process::id())),
    };
    let specs: Vec<strait_dpdk::PortSpec> = g
        .interfaces
        .iter()
        .enumerate()
        .filter_map(|(i, iface)| match &iface.driver {
            Driver::Dpdk { device } => Some(strait_dpdk::PortSpec {
                name: iface.name.clone(),
                device: device.clone(),
                table_port: i as u8,
                queues: iface.queues.clone(),
                mtu: g.mtu,
            }),
            Driver::AfXdp => None,
        })
        .collect();
    let devices: Vec<&str> = specs.iter().map(|s| s.device.as_str()).collect();
    tracing::info!(
        version = %strait_dpdk::version(),
        eal = %strait_dpdk::eal_args(&opts, &devices).join(" "),
        "starting DPDK"
    );
    let ports = strait_dpdk::Dpdk::open(&opts, &specs).context("opening the DPDK ports")?;
    for s in &specs {
        tracing::info!(iface = %s.name, device = %s.device, "DPDK port open, exception TAP {} up", s.name);
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dpdk_interface_is_refused_without_the_feature_and_named() {
        let cfg = strait_config::parse(
            "[[gateway.interfaces]]\nname = \"eth1\"\nqueues = [0]\ndriver = \"dpdk\"\n\
             device = \"net_af_packet0,iface=dp1\"\n",
        )
        .expect("valid");
        assert_eq!(interfaces(&cfg).count(), 1);
        let why = unsupported(&cfg);
        assert_eq!(why.is_none(), BUILT, "{why:?}");
        if let Some(why) = why {
            assert!(why.contains("gateway.interfaces[0].driver"), "{why}");
            assert!(
                why.contains("eth1") && why.contains("--features dpdk"),
                "{why}"
            );
        }
        let plain = strait_config::parse("[[gateway.interfaces]]\nname = \"eth0\"\nqueues = [0]\n")
            .expect("valid");
        assert_eq!(unsupported(&plain), None);
    }
}

/// A DPDK port's counters for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// Frames received.
    pub rx_packets: u64,
    /// Frames sent.
    pub tx_packets: u64,
    /// Frames the port dropped for lack of RX descriptors.
    pub rx_missed: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Send errors.
    pub tx_errors: u64,
    /// Receive failures for lack of mbufs.
    pub rx_nombuf: u64,
    /// Link up.
    pub link_up: bool,
}

/// Reads the DPDK ports' counters from the admin API's thread.
#[cfg(feature = "dpdk")]
pub type StatsReader = strait_dpdk::StatsReader;

/// Without the `dpdk` feature there is nothing to read.
#[cfg(not(feature = "dpdk"))]
#[derive(Clone, Debug)]
pub enum StatsReader {}

/// The counters of every DPDK port, by interface name.
pub fn port_counters(reader: &StatsReader) -> Vec<(String, PortCounters)> {
    #[cfg(feature = "dpdk")]
    {
        reader
            .read()
            .into_iter()
            .map(|(name, s)| {
                (
                    name,
                    PortCounters {
                        rx_packets: s.rx_packets,
                        tx_packets: s.tx_packets,
                        rx_missed: s.rx_missed,
                        rx_errors: s.rx_errors,
                        tx_errors: s.tx_errors,
                        rx_nombuf: s.rx_nombuf,
                        link_up: s.link_up,
                    },
                )
            })
            .collect()
    }
    #[cfg(not(feature = "dpdk"))]
    match *reader {}
}
