//! VIP reachability: the gateway answers ARP and ND for its VIPs and announces new ones.
//!
//! Done through the kernel, which already speaks ARP and ND correctly (and the XDP program
//! passes ARP and ND to it): every VIP becomes a host address of the gateway.
//!
//! - IPv4 VIPs go on `lo` as /32. With the default `arp_ignore=0` the kernel answers ARP for
//!   any local address on any interface, and a /32 on `lo` is never picked as the source of
//!   the gateway's own connections (health checks keep their interface address). A new VIP
//!   is announced with gratuitous ARP (`arping -U`, iputils), so neighbours update at once.
//! - IPv6 VIPs go on the client-facing data interface as /128, deprecated (`preferred_lft
//!   0`) so source-address selection never picks them. With `ndisc_notify=1` on that
//!   interface the kernel sends an unsolicited neighbour advertisement when duplicate address
//!   detection completes.
//!
//! Service traffic to a VIP never reaches the kernel: the XDP program redirects it to the
//! workers first. Other traffic to a VIP (ping, an unused port) gets the kernel's answer.
//! Only addresses this module added are ever removed; one that already existed is left as it
//! was.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::Command;

use anyhow::{bail, Context};
use strait_config::model::{Config, Role};
use tracing::{info, warn};

/// The label of the IPv4 VIPs this module puts on `lo`: a run of strait adopts the VIPs an
/// earlier, killed run left ([`VipAddresses::claim`]).
const LABEL: &str = "lo:strait";

/// Gratuitous-ARP processes run at the same time when many VIPs appear at once.
const ANNOUNCE_AT_ONCE: usize = 64;

/// The client-facing interface of `cfg` (the first of role `client` or `both`, else the
/// first): where clients resolve the VIPs.
pub fn client_interface(cfg: &Config) -> String {
    cfg.gateway
        .interfaces
        .iter()
        .find(|i| matches!(i.role, Role::Client | Role::Both))
        .or(cfg.gateway.interfaces.first())
        .map(|i| i.name.clone())
        .unwrap_or_default()
}

/// The VIPs the gateway has added, and where.
#[derive(Debug)]
pub struct VipAddresses {
    iface: String,
    netns: Option<String>,
    added: BTreeSet<IpAddr>,
}

impl VipAddresses {
    /// VIP management for the client-facing interface of `cfg`. `netns` runs the commands in
    /// a named namespace (tests); the gateway itself runs inside its namespace and passes
    /// `None`.
    pub fn new(cfg: &Config, netns: Option<String>) -> Self {
        Self {
            iface: client_interface(cfg),
            netns,
            added: BTreeSet::new(),
        }
    }

    /// Makes the gateway own exactly the VIPs of `cfg` (of those it manages).
    ///
    /// # Errors
    /// When `ip` fails for a reason other than the address already existing.
    pub fn sync(&mut self, cfg: &Config) -> anyhow::Result<()> {
        let want: BTreeSet<IpAddr> = cfg.services.iter().map(|s| s.vip).collect();
        let gone: Vec<IpAddr> = self.added.difference(&want).copied().collect();
        self.release(&gone);
        let new: Vec<IpAddr> = want.into_iter().collect();
        self.claim(&new)
    }

    /// Adds the VIPs of `vips` that this module has not added yet, and announces the IPv4
    /// ones (gratuitous ARP; the kernel announces IPv6 ones after DAD). An address that
    /// already existed is left as it is, and never removed.
    ///
    /// # Errors
    /// When `ip` fails for a reason other than the address already existing; the VIPs
    /// added before it are announced all the same.
    pub fn claim(&mut self, vips: &[IpAddr]) -> anyhow::Result<()> {
        let mut announce = Vec::new();
        let mut failed = Ok(());
        for &vip in vips {
            if self.added.contains(&vip) {
                continue;
            }
            match self.add(vip) {
                Ok(true) if vip.is_ipv4() => announce.push(vip),
                Ok(_) => {}
                Err(e) => {
                    failed = Err(e);
                    break;
                }
            }
        }
        self.announce(&announce);
        failed
    }

    /// Removes the VIPs of `vips` that this module added.
    pub fn release(&mut self, vips: &[IpAddr]) {
        for &vip in vips {
            if self.added.contains(&vip) {
                self.remove(vip);
            }
        }
    }

    /// Sends gratuitous ARP for `vips`, [`ANNOUNCE_AT_ONCE`] `arping`s at a time: each takes
    /// about 2 s (two announcements a second apart), so one after another a gateway with 250
    /// VIPs would need 8 minutes to become ready.
    fn announce(&self, vips: &[IpAddr]) {
        for chunk in vips.chunks(ANNOUNCE_AT_ONCE) {
            let running: Vec<_> = chunk
                .iter()
                .map(|vip| {
                    let args = [
                        "-U",
                        "-c",
                        "2",
                        "-w",
                        "2",
                        "-I",
                        &self.iface,
                        &vip.to_string(),
                    ]
                    .map(String::from);
                    (vip, spawn_captured(self.command("arping", &args)))
                })
                .collect();
            for (vip, child) in running {
                match child.and_then(|c| c.wait_with_output().context("waiting for arping")) {
                    Ok(o) if o.status.success() || o.status.code() == Some(1) => {
                        info!(%vip, iface = %self.iface, "VIP added, gratuitous ARP sent")
                    }
                    Ok(o) => warn!(
                        %vip,
                        "gratuitous ARP failed: {}",
                        String::from_utf8_lossy(&o.stderr).trim()
                    ),
                    Err(e) => {
                        warn!(%vip, "gratuitous ARP not sent: {e:#} (install iputils-arping)")
                    }
                }
            }
        }
    }

    /// Adds `vip` to the gateway; true when this call added it (and it should be announced).
    fn add(&mut self, vip: IpAddr) -> anyhow::Result<bool> {
        let out = match vip {
            // The label marks it as this module's, for a successor to adopt (below).
            IpAddr::V4(_) => self.ip(&[
                "addr",
                "add",
                &format!("{vip}/32"),
                "dev",
                "lo",
                "label",
                LABEL,
            ])?,
            IpAddr::V6(_) => {
                let knob = format!("net.ipv6.conf.{}.ndisc_notify=1", self.iface);
                let _ = self.exec("sysctl", &["-qw", &knob]);
                let iface = self.iface.clone();
                self.ip(&[
                    "addr",
                    "add",
                    &format!("{vip}/128"),
                    "dev",
                    &iface,
                    "preferred_lft",
                    "0",
                ])?
            }
        };
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("File exists") || err.contains("already assigned") {
                if self.left_by_us(vip) {
                    // A gateway killed before it could remove it (SIGKILL, OOM, a crash):
                    // this run owns it now, removes it when done, and announces it again.
                    info!(%vip, "VIP left by an earlier run of strait: adopted");
                    self.added.insert(vip);
                    return Ok(true);
                }
                info!(%vip, "VIP already configured on the gateway; left as it is");
                return Ok(false);
            }
            bail!("adding VIP {vip}: ip: {}", err.trim());
        }
        self.added.insert(vip);
        if vip.is_ipv6() {
            info!(%vip, iface = %self.iface, "VIP added; the kernel announces it after DAD");
        }
        Ok(true)
    }

    /// Whether the existing address `vip` is one this module adds: IPv4 on `lo` with
    /// [`LABEL`], IPv6 on the client interface deprecated (`preferred_lft 0`), which an
    /// operator's own address would not be.
    fn left_by_us(&self, vip: IpAddr) -> bool {
        let (dev, prefix, mark) = match vip {
            IpAddr::V4(_) => ("lo".to_owned(), format!("{vip}/32"), LABEL),
            IpAddr::V6(_) => (self.iface.clone(), format!("{vip}/128"), "deprecated"),
        };
        self.ip(&["-o", "addr", "show", "dev", &dev, "to", &prefix])
            .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(mark))
    }

    fn remove(&mut self, vip: IpAddr) {
        let (len, dev) = if vip.is_ipv4() {
            (32, "lo".to_string())
        } else {
            (128, self.iface.clone())
        };
        match self.ip(&["addr", "del", &format!("{vip}/{len}"), "dev", &dev]) {
            Ok(o) if o.status.success() => info!(%vip, "VIP removed"),
            Ok(o) => warn!(%vip, "removing VIP: {}", String::from_utf8_lossy(&o.stderr).trim()),
            Err(e) => warn!(%vip, "removing VIP: {e:#}"),
        }
        self.added.remove(&vip);
    }

    fn ip(&self, args: &[&str]) -> anyhow::Result<std::process::Output> {
        let mut full: Vec<&str> = Vec::new();
        if let Some(ns) = &self.netns {
            full.extend(["-n", ns.as_str()]);
        }
        full.extend_from_slice(args);
        Command::new("ip")
            .args(&full)
            .output()
            .with_context(|| format!("running ip {}", full.join(" ")))
    }

    fn exec(&self, prog: &str, args: &[&str]) -> anyhow::Result<std::process::Output> {
        self.command(prog, args)
            .output()
            .with_context(|| format!("running {prog}"))
    }

    /// `prog args`, inside `self.netns` when one is set.
    fn command<S: AsRef<std::ffi::OsStr>>(&self, prog: &str, args: &[S]) -> Command {
        let mut c = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, prog]);
                c
            }
            None => Command::new(prog),
        };
        c.args(args);
        c
    }
}

/// Starts `c` with its output captured, to be collected with `wait_with_output`.
fn spawn_captured(mut c: Command) -> anyhow::Result<std::process::Child> {
    use std::process::Stdio;
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running arping")
}

impl Drop for VipAddresses {
    fn drop(&mut self) {
        let all: Vec<IpAddr> = self.added.iter().copied().collect();
        for vip in all {
            self.remove(vip);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;
    use strait_testkit::config::{GatewayToml, ServiceToml};
    use strait_testkit::harness::tcpdump_listening;
    use strait_testkit::privileged as gate;

    /// Two namespaces joined by a veth pair, deleted on drop.
    struct Pair(String, String);

    impl Pair {
        fn new(tag: &str) -> Self {
            let (a, b) = (
                format!("stv{}{tag}a", std::process::id()),
                format!("stv{}{tag}b", std::process::id()),
            );
            let p = Pair(a.clone(), b.clone());
            let run = |args: &[&str]| {
                let o = Command::new("ip").args(args).output().unwrap();
                assert!(
                    o.status.success(),
                    "ip {args:?}: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
            };
            run(&["netns", "add", &a]);
            run(&["netns", "add", &b]);
            run(&[
                "-n", &a, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", &b,
            ]);
            run(&["-n", &a, "link", "set", "va", "up"]);
            run(&["-n", &a, "link", "set", "lo", "up"]);
            run(&["-n", &b, "link", "set", "vb", "up"]);
            run(&["-n", &a, "addr", "add", "192.0.2.1/24", "dev", "va"]);
            run(&["-n", &b, "addr", "add", "192.0.2.2/24", "dev", "vb"]);
            p
        }
    }

    impl Drop for Pair {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
            let _ = Command::new("ip").args(["netns", "del", &self.1]).status();
        }
    }

    fn privileged() -> bool {
        strait_testkit::privileged::privileged(
            "VIP announcements",
            &[gate::IP, gate::TCPDUMP, gate::ARPING],
        )
    }

    #[test]
    fn vips_are_answered_announced_and_removed() {
        if !privileged() {
            return;
        }
        let pair = Pair::new("v");
        let cfg = strait_config::parse(
            &GatewayToml::new()
                .interface("va", &[0])
                .service(ServiceToml::new("web", "203.0.113.10", 80))
                .service(ServiceToml::new("web6", "2001:db8::10", 80))
                .to_string(),
        )
        .unwrap();
        // Capture on the neighbour while the VIPs are added.
        let mut cap = Command::new("ip")
            .args([
                "netns",
                "exec",
                &pair.1,
                "timeout",
                "5",
                "tcpdump",
                "-l",
                "-n",
                "-i",
                "vb",
                "arp or icmp6",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Nothing is sent until tcpdump listens, however late a busy machine starts it.
        tcpdump_listening(
            cap.stderr.take().unwrap(),
            &format!("tcpdump in {}", pair.1),
        );
        let mut vips = VipAddresses::new(&cfg, Some(pair.0.clone()));
        vips.sync(&cfg).unwrap();
        // The neighbour resolves the VIP by ARP: the kernel answers for it.
        let arp = Command::new("ip")
            .args([
                "netns",
                "exec",
                &pair.1,
                "arping",
                "-c",
                "1",
                "-w",
                "2",
                "-I",
                "vb",
                "203.0.113.10",
            ])
            .output()
            .unwrap();
        assert!(
            arp.status.success(),
            "ARP for the VIP unanswered: {}",
            String::from_utf8_lossy(&arp.stdout)
        );
        let out = cap.wait_with_output().unwrap();
        let seen = String::from_utf8_lossy(&out.stdout);
        assert!(
            seen.contains("Request who-has 203.0.113.10") && seen.contains("tell 203.0.113.10"),
            "no gratuitous ARP:\n{seen}"
        );
        assert!(
            seen.contains("neighbor advertisement, tgt is 2001:db8::10"),
            "no unsolicited NA:\n{seen}"
        );

        let addrs = |dev: &str| {
            String::from_utf8_lossy(
                &Command::new("ip")
                    .args(["-n", &pair.0, "addr", "show", "dev", dev])
                    .output()
                    .unwrap()
                    .stdout,
            )
            .to_string()
        };
        assert!(addrs("lo").contains("203.0.113.10/32"));
        assert!(addrs("va").contains("2001:db8::10/128"));
        // A VIP leaving the configuration is removed; the rest stays.
        let mut less = cfg.clone();
        less.services.pop();
        vips.sync(&less).unwrap();
        assert!(!addrs("va").contains("2001:db8::10/128"));
        assert!(addrs("lo").contains("203.0.113.10/32"));
        drop(vips);
        assert!(
            !addrs("lo").contains("203.0.113.10"),
            "dropped: every added VIP removed"
        );

        // A killed run's VIPs (never removed: forgotten, as SIGKILL would) are adopted by
        // the next run, which removes them when done; an operator's own address is not.
        let mut killed = VipAddresses::new(&cfg, Some(pair.0.clone()));
        killed.sync(&cfg).unwrap();
        std::mem::forget(killed);
        let operators = "203.0.113.99";
        let own = Command::new("ip")
            .args([
                "-n",
                &pair.0,
                "addr",
                "add",
                &format!("{operators}/32"),
                "dev",
                "lo",
            ])
            .status()
            .unwrap();
        assert!(own.success());
        let mut with_own = cfg.clone();
        let mut extra = cfg.services[0].clone();
        extra.name = "ops".into();
        extra.vip = operators.parse().unwrap();
        with_own.services.push(extra);
        let mut next = VipAddresses::new(&with_own, Some(pair.0.clone()));
        next.sync(&with_own).unwrap();
        drop(next);
        assert!(!addrs("lo").contains("203.0.113.10"), "adopted and removed");
        assert!(
            !addrs("va").contains("2001:db8::10/128"),
            "adopted and removed"
        );
        assert!(
            addrs("lo").contains(operators),
            "the operator's address stays"
        );
    }
}
