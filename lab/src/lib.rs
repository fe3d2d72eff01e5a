//! Strait's lab: what measures and exercises the gateway, apart from the product.
//!
//! ```text
//!   strait-lab testbed ──► namespaces, veths, backend servers (backend_server), a gateway config
//!   strait-lab gen ──────► AF_XDP traffic ──► strait run / l2fwd / kernel peers ──► strait-lab sink
//!   strait-lab bench ────► pipeline, maglev, control, rule-update, line-rate, failover, flood,
//!                          churn, soak
//! ```
//!
//! | module | what it holds |
//! |---|---|
//! | [`testbed`] | the veth testbed (`testbed up/down/serve`; one gateway, or several behind a BGP router) and its gateway configurations |
//! | [`backend_server`] | the testbed's HTTP/TCP/UDP backends that name the client they saw |
//! | [`gen`], [`sink`], [`l2fwd`] | the line-rate instruments: generator, counter/reflector, the `limit` forwarder |
//! | [`peers`] | the kernel's own options: kube-proxy's iptables and nftables rules in namespaces |
//! | [`bench`] | every bench: pipeline, Maglev, control plane, rule updates, line rate, gateway failover, floods, endpoint churn, the soak |
//!
//! This crate depends on the product crates (`strait-config`, `strait-dataplane`,
//! `strait-control`); none of them depends on it. The gateway it drives is the product's
//! own `strait` binary, found by [`strait_binary`].

#![forbid(unsafe_code)]

pub mod backend_server;
pub mod bench;
pub mod gen;
pub mod l2fwd;
pub mod peers;
pub mod sink;
pub mod testbed;
pub mod vdev;

use std::io;
use std::path::PathBuf;

/// Checks an embedded object: an ELF file, 8-byte aligned.
#[cfg(test)]
pub(crate) fn assert_embedded(object: &[u8]) {
    assert_eq!(&object[..4], b"\x7fELF");
    assert_eq!(object.as_ptr() as usize % 8, 0);
}

/// Pins the calling thread to CPU `cpu` (`sched_setaffinity`), as the line-rate instruments
/// do for a steady measurement.
///
/// # Errors
///
/// The CPU does not exist or is not allowed (`EINVAL`).
pub fn pin_thread(cpu: usize) -> nix::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
}

/// The gateway binary the lab runs: `$STRAIT_BIN`, else `strait` beside this executable
/// (both binaries are built into one target directory), else `strait` on `PATH`.
///
/// # Errors
///
/// This executable's path cannot be read (`/proc/self/exe`).
pub fn strait_binary() -> io::Result<PathBuf> {
    if let Some(p) = std::env::var_os("STRAIT_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let beside = exe.with_file_name("strait");
    Ok(if beside.is_file() {
        beside
    } else {
        PathBuf::from("strait")
    })
}
