//! Route announcement: a BIRD 2 daemon, the gateway's child, speaks BGP for it.
//!
//! ```text
//!  core ── Effect::Routes ──► Speaker::announce ──► speaker thread ──► bird.conf + `configure`
//!                                                        │  every 500 ms: `show protocols`
//!  admin API, /metrics ◄── Speaker::status ◄─────────────┘
//! ```
//!
//! Why BIRD 2: Debian ships it (`bird2`), one small daemon speaks BGP and BFD for both
//! families, its configuration is plain text we can write whole and re-read without
//! touching established sessions (`configure`), and its control socket tells each
//! session's state; no home-made BGP. FRR needs several daemons and a shell; GoBGP a gRPC
//! client.
//!
//! **The announcement never outlives the gateway.** BIRD runs as the speaker thread's child
//! with a parent-death signal (`PR_SET_PDEATHSIG` = SIGKILL): when `strait` dies, even by
//! SIGKILL or the OOM killer, the kernel kills BIRD, closes its TCP sessions, and the
//! routers drop the routes at once (graceful restart is off, so they keep no stale copy).
//! A dead machine is found by BFD (`bfd = true`) or the hold timer. On an orderly stop the
//! speaker sends `down`: BIRD closes every session with a Cease notification.
//!
//! BIRD's configuration, socket and nothing else live in a directory of this process's
//! own (`$TMPDIR/strait-bgp-<pid>`), removed on stop. BIRD has no `kernel` protocol: it
//! never changes the gateway's routing table.

pub mod bird;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use strait_config::model::Bgp;
use tracing::{info, warn};

use crate::core::{Route, RouteAttrMap, RouteMap};
use crate::daemon::{Owner, Supervised};

/// How often the sessions' states are read from BIRD.
const POLL: Duration = Duration::from_millis(500);

/// How long BIRD may take to open its control socket after it starts.
const STARTUP: Duration = Duration::from_secs(5);

/// How long a stopping BIRD may take to close its sessions before it is killed.
const SHUTDOWN: Duration = Duration::from_secs(3);

/// How long after BIRD died it is started again.
const RESTART: Duration = Duration::from_secs(1);

/// One BGP session, as `strait status` and `/metrics` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The peer's address.
    pub peer: IpAddr,
    /// The peer's AS number.
    pub asn: u32,
    /// Whether the session is established.
    pub up: bool,
    /// BIRD's word for the session's state (`Established`, `Active`, `Connect`...) and the
    /// last error, if any.
    pub state: String,
}

/// What the speaker knows of itself.
#[derive(Debug, Clone, Default)]
pub struct Status {
    /// Whether BIRD runs and answers on its control socket.
    pub running: bool,
    /// Why it does not, or the last error from it.
    pub error: Option<String>,
    /// The sessions, in configuration order.
    pub sessions: Vec<Session>,
    /// The VIPs given to BIRD to announce.
    pub announced: usize,
    /// How often BIRD was started again after it died.
    pub restarts: u64,
}

/// The BGP speaker: a thread that owns the BIRD child.
#[derive(Debug)]
pub struct Speaker(Supervised<Status>, SharedAttrs);

impl Speaker {
    /// Starts BIRD for `bgp`, announcing nothing yet.
    ///
    /// # Errors
    /// When the daemon is not installed or its directory cannot be made; a daemon that
    /// starts but cannot reach its peers is no error (see [`Speaker::status_handle`]).
    pub fn start(bgp: Bgp) -> anyhow::Result<Self> {
        if !bgp.daemon.exists() {
            bail!(
                "gateway.bgp.daemon: {} does not exist (install BIRD 2: apt-get install bird2)",
                bgp.daemon.display()
            );
        }
        let dir = std::env::temp_dir().join(format!("strait-bgp-{}", std::process::id()));
        // A directory left by an earlier process with this pid holds nothing of ours.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let status = Arc::new(Mutex::new(Status {
            sessions: sessions(&bgp, &[]),
            ..Status::default()
        }));
        let attrs = SharedAttrs::default();
        let bird = Bird {
            attrs: Arc::clone(&attrs),
            written: Arc::default(),
            bgp,
            conf: dir.join("bird.conf"),
            socket: dir.join("bird.ctl"),
            dir,
            child: None,
            control: None,
            announced: Vec::new(),
            status: Arc::clone(&status),
            restart_at: None,
            draining: false,
        };
        bird.write_config()?;
        Ok(Self(Supervised::spawn("bgp", bird, status, POLL)?, attrs))
    }

    /// Announces exactly the VIPs `routes` marks announced, each with the attributes
    /// `attrs` gives it.
    pub fn announce(&self, routes: &RouteMap, attrs: &Arc<RouteAttrMap>) {
        *self.1.lock().unwrap_or_else(PoisonError::into_inner) = Arc::clone(attrs);
        self.0.set(
            routes
                .iter()
                .filter(|(_, r)| **r == Route::Announced)
                .map(|(v, _)| *v)
                .collect(),
        );
    }

    /// The gateway drains: BIRD keeps its sessions to carry the withdrawals and is not
    /// started again if it exits.
    pub fn drain(&self) {
        self.0.drain();
    }

    /// A handle on the state, for the admin API.
    pub fn status_handle(&self) -> Arc<Mutex<Status>> {
        self.0.status_handle()
    }

    /// Closes every session (the routers drop the routes) and stops BIRD.
    pub fn stop(&mut self) {
        self.0.stop();
    }
}

/// The sessions of `bgp` as BIRD's `protocols` tell them (down when not listed).
fn sessions(bgp: &Bgp, protocols: &[bird::Protocol]) -> Vec<Session> {
    bgp.peers
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let name = bird::protocol_name(i);
            let proto = protocols.iter().find(|x| x.name == name);
            Session {
                peer: p.address,
                asn: p.asn,
                up: proto.is_some_and(|x| x.state == "up" && x.info.starts_with("Established")),
                state: proto.map_or_else(|| "not running".to_owned(), |x| x.info.clone()),
            }
        })
        .collect()
}

/// The route attributes the speaker is to write, handed from the control loop to the
/// speaker thread beside the VIPs (which [`Supervised`] carries).
type SharedAttrs = Arc<Mutex<Arc<RouteAttrMap>>>;

/// The speaker thread's state.
struct Bird {
    /// The attributes to write (set by [`Speaker::announce`]).
    attrs: SharedAttrs,
    /// The attributes the configuration file holds.
    written: Arc<RouteAttrMap>,
    bgp: Bgp,
    dir: PathBuf,
    conf: PathBuf,
    socket: PathBuf,
    child: Option<Child>,
    control: Option<bird::BirdSocket>,
    /// The VIPs announced (sorted).
    announced: Vec<IpAddr>,
    status: Arc<Mutex<Status>>,
    /// When BIRD is to be started again after it died.
    restart_at: Option<Instant>,
    /// Whether the gateway drains (BIRD is then never started again).
    draining: bool,
}

impl Owner for Bird {
    fn begin(&mut self) {
        if let Err(e) = self.spawn() {
            self.failed(&e);
        }
    }

    fn vips(&mut self, vips: Vec<IpAddr>) {
        self.set_routes(vips);
    }

    fn drain(&mut self) {
        self.draining = true;
        if self.child.is_none() && self.restart_at.take().is_some() {
            info!(
                "bgp: draining; {} is not started again",
                self.bgp.daemon.display()
            );
        }
    }

    fn watch(&mut self) {
        Bird::watch(self);
    }

    fn shutdown(&mut self) {
        Bird::shutdown(self);
    }
}

impl Bird {
    fn set_routes(&mut self, vips: Vec<IpAddr>) {
        let attrs = Arc::clone(&self.attrs.lock().unwrap_or_else(PoisonError::into_inner));
        if vips == self.announced && attrs == self.written {
            return;
        }
        self.written = attrs;
        let (before, after): (BTreeSet<_>, BTreeSet<_>) = (
            self.announced.iter().copied().collect(),
            vips.iter().copied().collect(),
        );
        let added = after.difference(&before).count();
        let withdrawn = before.difference(&after).count();
        // BIRD sends a VIP to the peers of its family only: a VIP of a family without a peer
        // is announced to nobody.
        for family_v6 in [false, true] {
            let orphans = after
                .difference(&before)
                .filter(|v| v.is_ipv6() == family_v6)
                .count();
            if orphans > 0
                && !self
                    .bgp
                    .peers
                    .iter()
                    .any(|p| p.address.is_ipv6() == family_v6)
            {
                let family = if family_v6 { "IPv6" } else { "IPv4" };
                warn!(
                    vips = orphans,
                    "bgp: {family} VIPs to announce but no {family} peer in [[gateway.bgp.peers]]: no router learns them"
                );
            }
        }
        self.announced = vips;
        let r = self.write_config().and_then(|()| self.reconfigure());
        match r {
            Ok(()) => info!(
                announced = self.announced.len(),
                added, withdrawn, "bgp: routes changed"
            ),
            Err(e) => self.failed(&e),
        }
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .announced = self.announced.len();
    }

    fn write_config(&self) -> anyhow::Result<()> {
        let text = bird::config(&self.bgp, &self.announced, &self.written);
        // Written beside and renamed, so BIRD never reads half a file.
        let tmp = self.dir.join("bird.conf.new");
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.conf)
            .with_context(|| format!("renaming to {}", self.conf.display()))
    }

    fn reconfigure(&mut self) -> anyhow::Result<()> {
        match &mut self.control {
            Some(c) => c.configure(),
            // Not running: the file is read when it starts again.
            None => Ok(()),
        }
    }

    /// Starts BIRD as this thread's child, killed when the thread ends (see
    /// [`crate::daemon`]).
    fn spawn(&mut self) -> anyhow::Result<()> {
        let _ = std::fs::remove_file(&self.socket);
        let mut cmd = Command::new(&self.bgp.daemon);
        cmd.arg("-f")
            .arg("-c")
            .arg(&self.conf)
            .arg("-s")
            .arg(&self.socket)
            .arg("-P")
            .arg(self.dir.join("bird.pid"));
        let child = crate::daemon::spawn(&mut cmd, nix::sys::signal::Signal::SIGKILL)?;
        info!(
            pid = child.id(),
            "bgp: started {}",
            self.bgp.daemon.display()
        );
        self.child = Some(child);
        let deadline = Instant::now() + STARTUP;
        loop {
            match bird::BirdSocket::connect(&self.socket) {
                Ok(c) => {
                    self.control = Some(c);
                    break;
                }
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => {
                    if let Some(status) = self
                        .child
                        .as_mut()
                        .and_then(|c| c.try_wait().ok().flatten())
                    {
                        bail!(
                            "{} exited ({status}) before opening its control socket",
                            self.bgp.daemon.display()
                        );
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        let mut s = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        s.running = true;
        s.error = None;
        Ok(())
    }

    /// Notices a dead BIRD (and starts it again), and reads the sessions' states.
    fn watch(&mut self) {
        if let Some(status) = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            self.child = None;
            self.control = None;
            if self.draining {
                info!(
                    "bgp: {} exited ({status}) while draining; not starting it again",
                    self.bgp.daemon.display()
                );
            } else {
                warn!(
                    "bgp: {} exited ({status}); starting it again in {RESTART:?}",
                    self.bgp.daemon.display()
                );
                self.restart_at = Some(Instant::now() + RESTART);
            }
            let mut s = self.status.lock().unwrap_or_else(PoisonError::into_inner);
            s.running = false;
            s.error = Some(format!("bird exited ({status})"));
            s.sessions = sessions(&self.bgp, &[]);
        }
        if self.child.is_none()
            && !self.draining
            && self.restart_at.is_none_or(|at| Instant::now() >= at)
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
        let Some(c) = &mut self.control else {
            return;
        };
        match c.protocols() {
            Ok(p) => {
                let now = sessions(&self.bgp, &p);
                let mut s = self.status.lock().unwrap_or_else(PoisonError::into_inner);
                for (old, new) in s.sessions.iter().zip(&now) {
                    if old.up != new.up {
                        info!(peer = %new.peer, up = new.up, state = %new.state, "bgp: session changed");
                    }
                }
                s.sessions = now;
            }
            Err(e) => {
                self.control = None;
                self.failed(&e);
            }
        }
    }

    fn failed(&mut self, e: &anyhow::Error) {
        warn!("bgp: {e:#}");
        if self.control.is_none() {
            // Not answering: kill it so that `watch` starts it afresh.
            if let Some(mut c) = self.child.take() {
                let _ = c.kill();
                let _ = c.wait();
                self.restart_at = Some(Instant::now() + RESTART);
            }
        }
        let mut s = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        s.running = self.control.is_some();
        s.error = Some(format!("{e:#}"));
    }

    fn shutdown(&mut self) {
        if let Some(c) = &mut self.control {
            if let Err(e) = c.down() {
                warn!("bgp: down: {e:#}");
            }
        }
        self.control = None;
        if let Some(mut child) = self.child.take() {
            let deadline = Instant::now() + SHUTDOWN;
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        remove_dir(&self.dir);
        info!("bgp: sessions closed, speaker stopped");
        let mut s = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        s.running = false;
        s.announced = 0;
        s.sessions = sessions(&self.bgp, &[]);
    }
}

fn remove_dir(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        warn!("bgp: removing {}: {e}", dir.display());
    }
}
