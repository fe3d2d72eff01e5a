//! Where the configuration comes from, and what only the system can add to it: the
//! interfaces' MACs, MTUs and addresses (`ip -j`), unset tunnel sources, and a first read of
//! the neighbour table. Everything here does I/O; the control core gets the result as a
//! [`Loaded`].

use std::path::PathBuf;

use anyhow::{bail, Context};
use strait_config::model::{Config, Role};
use strait_dataplane::table::Port;

use crate::core::Loaded;

/// Where the configuration comes from.
#[derive(Clone, Debug)]
pub enum ConfigSource {
    /// A file, re-read on reload.
    File(PathBuf),
    /// The built-in example (the testbed's default).
    Builtin,
}

impl ConfigSource {
    /// Loads and validates the configuration, with unset tunnel sources filled from the
    /// backend-facing interface's addresses.
    ///
    /// # Errors
    /// The file cannot be read, or does not validate (every problem, with its path).
    pub fn load(&self) -> anyhow::Result<Config> {
        let mut cfg = match self {
            ConfigSource::File(p) => {
                strait_config::load(p).map_err(|e| anyhow::anyhow!("{}:\n{e}", p.display()))?
            }
            ConfigSource::Builtin => strait_config::example(),
        };
        default_tunnel_sources(&mut cfg);
        Ok(cfg)
    }

    /// [`ConfigSource::load`], with the interfaces' addresses and a read of the backend
    /// interface's neighbours: what the control core takes a configuration with.
    ///
    /// # Errors
    /// As [`ConfigSource::load`].
    pub fn loaded(&self) -> anyhow::Result<Loaded> {
        Ok(loaded(self.load()?))
    }
}

/// `config` with the interfaces' addresses and a read of the backend interface's
/// neighbours.
pub fn loaded(config: Config) -> Loaded {
    Loaded {
        locals: local_addrs(&config),
        neighbours: crate::neigh::backend_table(&config),
        config,
    }
}

/// Refuses a configuration whose tunnel-mode backends have no address of their family to
/// send from.
///
/// # Errors
/// Naming the service, its mode and the tunnel target.
pub fn check_tunnel_sources(cfg: &Config) -> anyhow::Result<()> {
    for svc in cfg.services.iter().filter(|s| s.mode.is_tunnel()) {
        for b in &svc.backends {
            let missing = match b.tunnel_target() {
                std::net::IpAddr::V4(_) => cfg.gateway.tunnel_source_v4.is_none(),
                std::net::IpAddr::V6(_) => cfg.gateway.tunnel_source_v6.is_none(),
            };
            if missing {
                bail!(
                    "service {}: {} encapsulates to {}, but the backend-facing interface has \
                     no address of that family to send from; set gateway.tunnel_source_v4 / \
                     tunnel_source_v6",
                    svc.name,
                    svc.mode,
                    b.tunnel_target()
                );
            }
        }
    }
    Ok(())
}

/// Fills unset tunnel sources from the backend-facing interface's own addresses, as the
/// configuration documents: the outer source of encapsulated packets is an address of the
/// gateway on the segment that carries them.
fn default_tunnel_sources(cfg: &mut Config) {
    let Some(iface) = cfg
        .gateway
        .interfaces
        .iter()
        .find(|i| matches!(i.role, Role::Backend | Role::Both))
        .map(|i| i.name.clone())
    else {
        return;
    };
    let g = &mut cfg.gateway;
    if g.tunnel_source_v4.is_none() {
        g.tunnel_source_v4 = interface_addrs(&iface).into_iter().find_map(|a| match a {
            std::net::IpAddr::V4(v4) => Some(v4),
            _ => None,
        });
    }
    if g.tunnel_source_v6.is_none() {
        g.tunnel_source_v6 = interface_addrs(&iface).into_iter().find_map(|a| match a {
            std::net::IpAddr::V6(v6) if !v6.is_unicast_link_local() => Some(v6),
            _ => None,
        });
    }
}

/// Reads an interface's MAC and MTU (`ip -j link show dev NAME`). Asks the kernel over
/// netlink rather than sysfs, whose view belongs to the mount namespace: a thread that
/// entered a network namespace with `setns` still sees the old namespace's `/sys/class/net`.
///
/// # Errors
/// When the interface does not exist in this network namespace.
pub fn port_of(name: &str) -> anyhow::Result<Port> {
    let out = std::process::Command::new("ip")
        .args(["-j", "link", "show", "dev", name])
        .output()
        .context("running `ip -j link show` (iproute2)")?;
    if !out.status.success() {
        bail!(
            "interface {name} not found in this network namespace (the testbed's gateway runs \
             inside it: `ip netns exec strait-gw strait run ...`): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("interface {name}: `ip -j link` output"))?;
    let link = &v[0];
    let mac_text = link["address"]
        .as_str()
        .with_context(|| format!("interface {name} has no link-layer address"))?;
    let mac: strait_config::model::MacAddr = mac_text
        .parse()
        .map_err(|e| anyhow::anyhow!("interface {name}: MAC {mac_text:?}: {e}"))?;
    let mtu = link["mtu"]
        .as_u64()
        .with_context(|| format!("interface {name}: no MTU"))?;
    // Loopback's 65536 does not fit; no Ethernet frame comes near it anyway.
    Ok(Port::new(mac, mtu.min(u64::from(u16::MAX)) as u16))
}

/// The global unicast addresses of an interface, primary first (`ip -j addr show`). Empty
/// when the interface has none or `ip` fails.
pub fn interface_addrs(iface: &str) -> Vec<std::net::IpAddr> {
    let Ok(out) = std::process::Command::new("ip")
        .args(["-j", "addr", "show", "dev", iface])
        .output()
    else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.as_array()
        .into_iter()
        .flatten()
        .flat_map(|link| link["addr_info"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["scope"] == "global")
        .filter_map(|a| a["local"].as_str()?.parse().ok())
        .collect()
}

/// Every address of the configured interfaces, in key form, for
/// [`strait_dataplane::table::ServiceTable::locals`].
pub fn local_addrs(cfg: &Config) -> Vec<std::net::IpAddr> {
    cfg.gateway
        .interfaces
        .iter()
        .flat_map(|i| interface_addrs(&i.name))
        .collect()
}
