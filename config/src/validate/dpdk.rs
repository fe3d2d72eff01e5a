//! `driver` and `device` of an interface, and `[gateway.dpdk]`: the EAL options. Every
//! interface of a gateway uses one driver, because one worker serves queue `q` of every
//! interface and moves frames between them without a copy (a UMEM or a mempool shared by
//! the group).

use super::Checker;
use crate::model::{Dpdk, Driver, Interface};
use crate::raw::{RawDpdk, RawInterface};

/// Longest EAL device string: a vdev's arguments are short; more is a mistake.
const MAX_DEVICE_LEN: usize = 256;
/// Longest `file_prefix`: a directory name under /var/run/dpdk.
const MAX_PREFIX_LEN: usize = 64;

impl Checker {
    /// The driver of interface `path` (`driver`, `device`).
    pub(super) fn driver(&mut self, path: &str, raw: &RawInterface) -> Option<Driver> {
        match raw.driver.as_deref() {
            None | Some("af_xdp") => {
                if raw.device.is_some() {
                    self.problem(
                        format!("{path}.device"),
                        "is only for driver = \"dpdk\" (an AF_XDP interface is named by `name`)",
                    );
                    return None;
                }
                Some(Driver::AfXdp)
            }
            Some("dpdk") => {
                let dpath = format!("{path}.device");
                let device = self.required(&dpath, raw.device.as_deref())?;
                let problem = if device.is_empty() {
                    Some("is empty; give the EAL device: a PCI address (\"0000:03:00.0\") or a vdev (\"net_af_packet0,iface=eth1\")".to_owned())
                } else if device.len() > MAX_DEVICE_LEN {
                    Some(format!(
                        "is {} bytes long; at most {MAX_DEVICE_LEN}",
                        device.len()
                    ))
                } else if device.chars().any(|c| c.is_whitespace() || c == '\0') {
                    Some(format!(
                        "{device:?} contains whitespace; EAL takes it as one argument"
                    ))
                } else if device.starts_with('-') {
                    Some(format!(
                        "{device:?} starts with '-'; it would be read as an EAL option"
                    ))
                } else {
                    None
                };
                if let Some(p) = problem {
                    self.problem(dpath, p);
                    return None;
                }
                Some(Driver::Dpdk {
                    device: device.to_owned(),
                })
            }
            Some(other) => {
                self.problem(
                    format!("{path}.driver"),
                    format!("{other:?} is not a driver (\"af_xdp\" or \"dpdk\")"),
                );
                None
            }
        }
    }

    /// A DPDK port receives a frame into one mbuf of 2048 bytes: its MTU, which is
    /// `gateway.mtu`, leaves room for the Ethernet header and an 802.1Q tag.
    pub(super) fn dpdk_mtu(&mut self, interfaces: &[Interface], mtu: u16) {
        let dpdk = interfaces
            .iter()
            .any(|i| matches!(i.driver, Driver::Dpdk { .. }));
        if dpdk && mtu > Dpdk::MAX_MTU {
            self.problem(
                "gateway.mtu",
                format!(
                    "{mtu} is above {}, the most a DPDK port's frame holds (one mbuf of 2048 bytes, with the Ethernet header and a VLAN tag)",
                    Dpdk::MAX_MTU
                ),
            );
        }
    }

    /// One driver for every interface, distinct DPDK devices, and `[gateway.dpdk]` only
    /// with DPDK interfaces.
    pub(super) fn drivers_agree(&mut self, interfaces: &[Interface], dpdk: Option<&RawDpdk>) {
        if let Some(first) = interfaces.first() {
            for (i, iface) in interfaces.iter().enumerate().skip(1) {
                if iface.driver.name() != first.driver.name() {
                    self.problem(
                        format!("gateway.interfaces[{i}].driver"),
                        format!(
                            "{:?} differs from gateway.interfaces[0]'s {:?}: one worker serves a queue of every interface, so all use one driver",
                            iface.driver.name(),
                            first.driver.name()
                        ),
                    );
                }
            }
        }
        for (i, iface) in interfaces.iter().enumerate() {
            let Driver::Dpdk { device } = &iface.driver else {
                continue;
            };
            let port = device.split(',').next().unwrap_or(device);
            if let Some(j) = interfaces[..i].iter().position(|o| match &o.driver {
                Driver::Dpdk { device: d } => d.split(',').next().unwrap_or(d) == port,
                Driver::AfXdp => false,
            }) {
                self.problem(
                    format!("gateway.interfaces[{i}].device"),
                    format!("{port:?} is already the device of gateway.interfaces[{j}]"),
                );
            }
        }
        let any_dpdk = interfaces
            .iter()
            .any(|i| matches!(i.driver, Driver::Dpdk { .. }));
        if dpdk.is_some() && !any_dpdk && !interfaces.is_empty() {
            self.problem(
                "gateway.dpdk",
                "no interface has driver = \"dpdk\"; remove [gateway.dpdk] or set the driver",
            );
        }
    }

    /// `[gateway.dpdk]`.
    pub(super) fn dpdk(&mut self, raw: &RawDpdk) -> Option<Dpdk> {
        let memory_mb = match raw.memory_mb {
            None => Some(None),
            Some(m) => self
                .int(
                    "gateway.dpdk.memory_mb",
                    m,
                    Dpdk::MIN_MEMORY_MB,
                    Dpdk::MAX_MEMORY_MB,
                )
                .map(Some),
        };
        let file_prefix = match raw.file_prefix.as_deref() {
            None => Some(None),
            Some(p)
                if !p.is_empty()
                    && p.len() <= MAX_PREFIX_LEN
                    && p.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') =>
            {
                Some(Some(p.to_owned()))
            }
            Some(p) => {
                self.problem(
                    "gateway.dpdk.file_prefix",
                    format!("{p:?} is not a directory name of 1 to {MAX_PREFIX_LEN} letters, digits, '-' or '_'"),
                );
                None
            }
        };
        Some(Dpdk {
            memory_mb: memory_mb?,
            no_huge: raw.no_huge.unwrap_or(false),
            file_prefix: file_prefix?,
        })
    }
}
