//! VIP failover on one segment (`[gateway.l2]`): keepalived, the gateway's child, speaks
//! VRRP for it.
//!
//! ```text
//!  core ── Effect::Routes ──► Vrrp::own ──► l2 thread ──► keepalived.conf + SIGHUP
//!                                                │  every 500 ms: the VIPs on the interface
//!  admin API, /metrics ◄── Vrrp::status ◄────────┘
//! ```
//!
//! Why keepalived: Debian ships it, it is the VRRP implementation operators already run
//! (kube-vip and MetalLB users fall back to it), it sends gratuitous ARP and unsolicited NA
//! on taking over, and VRRPv3 advertises in centiseconds, so a dead owner is replaced in
//! three intervals (300 ms by default) where MetalLB's layer 2 mode takes 10 s and more.
//!
//! In this mode the VIPs are not put on `lo` ([`crate::vip`]): keepalived puts each on the
//! client interface of the gateway that owns it, so only that gateway's kernel answers ARP
//! and ND for it. The other gateways forward whatever still reaches them (their workers do
//! not need the address), which is what lets a stream survive the move: Maglev picks the
//! same backend on every gateway.
//!
//! **Ownership never outlives the gateway.** keepalived runs with a parent-death signal of
//! SIGTERM ([`crate::daemon::spawn`]): when `strait` dies, even by SIGKILL, keepalived
//! stops in order, removes the VIPs and advertises priority 0, and the next gateway takes
//! over at once rather than after the master-down interval. Draining stops keepalived the
//! same way.

pub mod keepalived;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::Signal;
use strait_config::model::L2;
use tracing::{info, warn};

use crate::core::{Route, RouteMap};
use crate::daemon::{Owner, Supervised};

/// How often the VIPs on the interface are read.
const POLL: Duration = Duration::from_millis(500);

/// How long keepalived may take to stop in order before it is killed.
const SHUTDOWN: Duration = Duration::from_secs(3);

/// How long after keepalived died it is started again.
const RESTART: Duration = Duration::from_secs(1);

/// What the VRRP side knows of itself.
#[derive(Debug, Clone, Default)]
pub struct VrrpStatus {
    /// Whether keepalived runs.
    pub running: bool,
    /// The last error, if any.
    pub error: Option<String>,
    /// The VIPs given to keepalived.
    pub vips: usize,
    /// The VIPs this gateway owns now (on its client interface).
    pub owned: BTreeSet<IpAddr>,
    /// How often keepalived was started again after it died.
    pub restarts: u64,
    /// Per VIP, how often this gateway took or lost it: a VIP that keeps moving is a
    /// segment where VRRP advertisements get lost, or two gateways that disagree.
    pub owner_changes: BTreeMap<IpAddr, u64>,
}

impl VrrpStatus {
    /// Records that this gateway owns `owned` now, counting each VIP taken or lost.
    fn set_owned(&mut self, owned: BTreeSet<IpAddr>) {
        for v in owned.symmetric_difference(&self.owned) {
            info!(vip = %v, owner = owned.contains(v), "vrrp: ownership changed");
            *self.owner_changes.entry(*v).or_default() += 1;
        }
        self.owned = owned;
    }
}

/// The VRRP side: a thread that owns the keepalived child.
#[derive(Debug)]
pub struct Vrrp(Supervised<VrrpStatus>);

impl Vrrp {
    /// Starts the VRRP side for `l2` on `interface`; keepalived starts with the first VIP.
    ///
    /// # Errors
    /// When keepalived is not installed or its directory cannot be made.
    pub fn start(l2: L2, interface: String) -> anyhow::Result<Self> {
        if !l2.daemon.exists() {
            bail!(
                "gateway.l2.daemon: {} does not exist (install keepalived: apt-get install keepalived)",
                l2.daemon.display()
            );
        }
        let dir = std::env::temp_dir().join(format!("strait-vrrp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let status = Arc::new(Mutex::new(VrrpStatus::default()));
        let keeper = Keeper {
            l2,
            interface,
            dir,
            child: None,
            vips: Vec::new(),
            status: Arc::clone(&status),
            restart_at: None,
            draining: false,
        };
        Ok(Self(Supervised::spawn("vrrp", keeper, status, POLL)?))
    }

    /// Takes part in the election of every VIP `routes` gives a route to (announced, or
    /// without a serving backend: ownership follows the gateway, not each service); none
    /// while draining.
    pub fn own(&self, routes: &RouteMap) {
        self.0.set(
            routes
                .iter()
                .filter(|(_, r)| matches!(r, Route::Announced | Route::NoServingBackend))
                .map(|(v, _)| *v)
                .collect(),
        );
    }

    /// The gateway drains: keepalived is not started again if it exits (the drain hands
    /// the VIPs on).
    pub fn drain(&self) {
        self.0.drain();
    }

    /// A handle on the state, for the admin API.
    pub fn status_handle(&self) -> Arc<Mutex<VrrpStatus>> {
        self.0.status_handle()
    }

    /// Stops keepalived in order (the VIPs move at once) and the thread.
    pub fn stop(&mut self) {
        self.0.stop();
    }
}

struct Keeper {
    l2: L2,
    interface: String,
    dir: PathBuf,
    child: Option<Child>,
    /// The VIPs given to keepalived (sorted).
    vips: Vec<IpAddr>,
    status: Arc<Mutex<VrrpStatus>>,
    restart_at: Option<Instant>,
    /// Whether the gateway drains (keepalived is then never started again).
    draining: bool,
}

impl Owner for Keeper {
    fn vips(&mut self, vips: Vec<IpAddr>) {
        self.set(vips);
    }

    fn drain(&mut self) {
        self.draining = true;
        if self.child.is_none() && self.restart_at.take().is_some() {
            info!("vrrp: draining; keepalived is not started again");
        }
    }

    fn watch(&mut self) {
        Keeper::watch(self);
    }

    fn shutdown(&mut self) {
        Keeper::shutdown(self);
    }
}

impl Keeper {
    fn conf(&self) -> PathBuf {
        self.dir.join("keepalived.conf")
    }

    fn set(&mut self, vips: Vec<IpAddr>) {
        if vips == self.vips {
            return;
        }
        self.vips = vips;
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .vips = self.vips.len();
        if self.vips.is_empty() {
            info!("vrrp: no VIPs to own; stopping keepalived (the others take over)");
            self.stop_child();
            return;
        }
        let r = self.write_config().and_then(|()| match &self.child {
            Some(c) => {
                let pid = nix::unistd::Pid::from_raw(i32::try_from(c.id()).unwrap_or(i32::MAX));
                nix::sys::signal::kill(pid, Signal::SIGHUP).context("reloading keepalived")
            }
            None if self.draining => Ok(()),
            None => self.spawn(),
        });
        match r {
            Ok(()) => info!(vips = self.vips.len(), "vrrp: VIPs changed"),
            Err(e) => self.failed(&e),
        }
    }

    fn write_config(&self) -> anyhow::Result<()> {
        let text = keepalived::config(&self.l2, &self.interface, &self.vips);
        let tmp = self.dir.join("keepalived.conf.new");
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, self.conf())
            .with_context(|| format!("renaming to {}", self.conf().display()))
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let mut cmd = Command::new(&self.l2.daemon);
        cmd.args([
            "--dont-fork",
            "--log-console",
            "--no-syslog",
            "--vrrp",
            "-f",
        ])
        .arg(self.conf())
        .arg("-p")
        .arg(self.dir.join("keepalived.pid"))
        .arg("-r")
        .arg(self.dir.join("vrrp.pid"))
        .arg("-c")
        .arg(self.dir.join("checkers.pid"))
        .arg("-b")
        .arg(self.dir.join("bfd.pid"));
        // SIGTERM, not SIGKILL: keepalived then gives the VIPs up in order.
        let child = crate::daemon::spawn(&mut cmd, Signal::SIGTERM)?;
        info!(
            pid = child.id(),
            "vrrp: started {}",
            self.l2.daemon.display()
        );
        self.child = Some(child);
        let mut s = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        s.running = true;
        s.error = None;
        Ok(())
    }

    fn watch(&mut self) {
        if let Some(status) = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            self.child = None;
            if self.draining {
                info!("vrrp: keepalived exited ({status}) while draining; not starting it again");
            } else {
                warn!("vrrp: keepalived exited ({status}); starting it again in {RESTART:?}");
                self.restart_at = Some(Instant::now() + RESTART);
            }
            let mut s = self.status.lock().unwrap_or_else(PoisonError::into_inner);
            s.running = false;
            s.error = Some(format!("keepalived exited ({status})"));
        }
        if self.child.is_none()
            && !self.draining
            && !self.vips.is_empty()
            && self.restart_at.is_some_and(|at| Instant::now() >= at)
        {
            self.restart_at = None;
            self.status
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .restarts += 1;
            if let Err(e) = self.write_config().and_then(|()| self.spawn()) {
                self.failed(&e);
            }
        }
        let owned = owned(&self.interface, &self.vips);
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .set_owned(owned);
    }

    fn failed(&mut self, e: &anyhow::Error) {
        warn!("vrrp: {e:#}");
        if self.child.is_none() {
            self.restart_at = Some(Instant::now() + RESTART);
        }
        let mut s = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        s.running = self.child.is_some();
        s.error = Some(format!("{e:#}"));
    }

    fn stop_child(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + SHUTDOWN;
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        let mut s = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        s.running = false;
        s.set_owned(BTreeSet::new());
    }

    fn shutdown(&mut self) {
        self.stop_child();
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            warn!("vrrp: removing {}: {e}", self.dir.display());
        }
        info!("vrrp: keepalived stopped, VIPs given up");
    }
}

/// Which of `vips` are addresses of `interface` now.
fn owned(interface: &str, vips: &[IpAddr]) -> BTreeSet<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return BTreeSet::new();
    };
    addrs
        .filter(|a| a.interface_name == interface)
        .filter_map(|a| {
            let s = a.address?;
            s.as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        })
        .filter(|a| vips.contains(a))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_vip_taken_or_lost_is_counted() {
        let a: IpAddr = "203.0.113.10".parse().unwrap();
        let b: IpAddr = "203.0.113.11".parse().unwrap();
        let mut s = VrrpStatus::default();
        s.set_owned([a, b].into());
        s.set_owned([a, b].into());
        s.set_owned([a].into());
        s.set_owned([a, b].into());
        s.set_owned(BTreeSet::new());
        assert_eq!(s.owner_changes.get(&a), Some(&2));
        assert_eq!(s.owner_changes.get(&b), Some(&4));
        assert!(s.owned.is_empty());
    }
}
