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
