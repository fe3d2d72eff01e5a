//! The routing daemons the gateway runs as its children (BIRD for BGP, keepalived for
//! VRRP): started with a parent-death signal, so that they never outlive `strait`.

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command};

use anyhow::Context;
use nix::sys::signal::Signal;

/// Starts `cmd` as the calling thread's child; the kernel sends it `on_parent_death` when
/// that thread ends (with the process, or when it returns). The thread must live as long
/// as the child should.
///
/// # Errors
/// When the program cannot be started.
#[allow(unsafe_code)]
pub fn spawn(cmd: &mut Command, on_parent_death: Signal) -> anyhow::Result<Child> {
    // systemd's notification socket is the gateway's own: a daemon that also speaks sd_notify
    // (keepalived does) must not report for it.
    cmd.env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID");
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and calls only prctl(2) and
    // getppid(2), both async-signal-safe; it touches no memory of the parent's.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(on_parent_death)?;
            // The parent may have died between fork and prctl: then nobody signals us.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::other(
                    "strait exited before the daemon started",
                ));
            }
            Ok(())
        });
    }
    cmd.spawn()
        .with_context(|| format!("starting {}", cmd.get_program().to_string_lossy()))
}

/// What a daemon's thread is told: the VIPs it is to announce or own now, that the
/// gateway drains, or to stop.
#[derive(Debug)]
enum Msg {
    Vips(Vec<std::net::IpAddr>),
    Drain,
    Stop,
}

/// The side of a daemon's thread the gateway holds: the VIPs go in, the daemon's state
/// comes out, and `stop` (or drop) ends the thread, which stops the daemon in order.
#[derive(Debug)]
pub struct Supervised<S> {
    tx: std::sync::mpsc::Sender<Msg>,
    thread: Option<std::thread::JoinHandle<()>>,
    status: std::sync::Arc<std::sync::Mutex<S>>,
}

/// The thread side: what a daemon's owner implements.
pub trait Owner: Send + 'static {
    /// Runs first, on the thread: where a daemon is started, since the parent-death signal
    /// is bound to the thread that forks ([`spawn`]).
    fn begin(&mut self) {}
    /// Takes the VIPs of the latest message.
    fn vips(&mut self, vips: Vec<std::net::IpAddr>);
    /// The gateway drains: from now on a daemon that exits is not started again. Its
    /// routes are withdrawn (or its VIPs handed on) by the drain itself; a daemon started
    /// again would only open sessions or elections the stop then closes, and under
    /// systemd's default `KillMode=control-group` it would be the daemon the stop's
    /// SIGTERM just ended.
    fn drain(&mut self);
    /// Runs between messages, at least every poll interval (a dead daemon, its state).
    fn watch(&mut self);
    /// Stops the daemon in order.
    fn shutdown(&mut self);
}

impl<S: Clone + Send + 'static> Supervised<S> {
    /// Starts thread `name` running `owner`, waking at least every `poll`; `status` is the
    /// state it shares.
    ///
    /// # Errors
    /// When the thread cannot be started.
    pub fn spawn(
        name: &str,
        mut owner: impl Owner,
        status: std::sync::Arc<std::sync::Mutex<S>>,
        poll: std::time::Duration,
    ) -> anyhow::Result<Self> {
        use std::sync::mpsc::RecvTimeoutError;
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                owner.begin();
                loop {
                    match rx.recv_timeout(poll) {
                        Ok(Msg::Vips(mut vips)) => {
                            // Only the last of a burst matters.
                            for m in rx.try_iter() {
                                match m {
                                    Msg::Vips(v) => vips = v,
                                    Msg::Drain => owner.drain(),
                                    Msg::Stop => return owner.shutdown(),
                                }
                            }
                            owner.vips(vips);
                        }
                        Ok(Msg::Drain) => owner.drain(),
                        Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => {
                            return owner.shutdown()
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                    }
                    owner.watch();
                }
            })?;
        Ok(Self {
            tx,
            thread: Some(thread),
            status,
        })
    }

    /// Hands the thread the VIPs to announce or own now.
    pub fn set(&self, vips: Vec<std::net::IpAddr>) {
        let _ = self.tx.send(Msg::Vips(vips));
    }

    /// Tells the thread the gateway drains ([`Owner::drain`]).
    pub fn drain(&self) {
        let _ = self.tx.send(Msg::Drain);
    }

    /// A handle on the state, for the admin API.
    pub fn status_handle(&self) -> std::sync::Arc<std::sync::Mutex<S>> {
        std::sync::Arc::clone(&self.status)
    }

    /// Stops the daemon in order and ends the thread.
    pub fn stop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl<S> Drop for Supervised<S> {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
