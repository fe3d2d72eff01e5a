//! The gate of the privileged tests: root plus the tools a test drives.
//!
//! A test file lists its tools from the constants here, `(tool, probe flag, Debian
//! package)`, and asks [`privileged`] first thing:
//!
//! ```ignore
//! if !gate::privileged("my test", &[gate::IP, gate::CURL]) {
//!     return;
//! }
//! ```

use std::io::Write;
use std::process::Command;

/// A tool a test drives: `(program, a flag it answers successfully, Debian package)`.
pub type Tool = (&'static str, &'static str, &'static str);

/// iproute2's `ip`.
pub const IP: Tool = ("ip", "-V", "iproute2");
/// curl.
pub const CURL: Tool = ("curl", "--version", "curl");
/// ping.
pub const PING: Tool = ("ping", "-V", "iputils-ping");
/// arping.
pub const ARPING: Tool = ("arping", "-V", "iputils-arping");
/// tcpdump.
pub const TCPDUMP: Tool = ("tcpdump", "--version", "tcpdump");
/// tshark (it also verifies checksums).
pub const TSHARK: Tool = ("tshark", "--version", "tshark");
/// ethtool.
pub const ETHTOOL: Tool = ("ethtool", "--version", "ethtool");
/// procps' sysctl.
pub const SYSCTL: Tool = ("sysctl", "--version", "procps");
/// bash.
pub const BASH: Tool = ("bash", "--version", "bash");
/// iptables-restore.
pub const IPTABLES_RESTORE: Tool = ("iptables-restore", "--version", "iptables");
/// iptables-save.
pub const IPTABLES_SAVE: Tool = ("iptables-save", "--version", "iptables");
/// nftables' nft.
pub const NFT: Tool = ("nft", "--version", "nftables");
/// openssl.
pub const OPENSSL: Tool = ("openssl", "version", "openssl");
/// BIRD 2 (the BGP speaker the gateway runs, and the tests' router).
pub const BIRD: Tool = ("bird", "--version", "bird2");
/// keepalived (the VRRP speaker of `[gateway.l2]`).
pub const KEEPALIVED: Tool = ("keepalived", "--version", "keepalived");
/// Prometheus (the monitoring kit's end-to-end test scrapes a gateway with it).
pub const PROMETHEUS: Tool = ("prometheus", "--version", "prometheus");
/// promtool (checks and unit-tests alert rules; Debian's `prometheus` package brings it).
pub const PROMTOOL: Tool = ("promtool", "--version", "prometheus");
/// Debian's Python (the `python3` on PATH may be another, without scapy).
pub const PYTHON: Tool = ("/usr/bin/python3", "--version", "python3");

/// Whether privileged test `test` can run: effective uid 0 and every `(tool, probe flag,
/// Debian package)` answering. Otherwise panics naming what is missing, or, with
/// `STRAIT_SKIP_PRIVILEGED=1`, prints a SKIPPED banner past the harness's capture and
/// returns false. CI never sets the variable.
pub fn privileged(test: &str, tools: &[(&str, &str, &str)]) -> bool {
    let root = nix::unistd::Uid::effective().is_root();
    let mut missing = Vec::new();
    if !root {
        missing.push("root (effective uid 0)".to_owned());
    }
    for (tool, probe, package) in tools {
        if !Command::new(tool)
            .arg(probe)
            .output()
            .is_ok_and(|o| o.status.success())
        {
            missing.push(format!("`{tool}` (apt-get install -y {package})"));
        }
    }
    verdict(test, &missing)
}

/// Whether [`PYTHON`] imports `module` (`python3 --version` answers without it); the same
/// verdict as [`privileged`] otherwise.
pub fn python_module(test: &str, module: &str, package: &str) -> bool {
    let ok = Command::new(PYTHON.0)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    let missing = if ok {
        Vec::new()
    } else {
        vec![format!(
            "`import {module}` in {} (apt-get install -y {package})",
            PYTHON.0
        )]
    };
    verdict(test, &missing)
}

/// True when nothing is missing; else the SKIPPED banner and false, or the panic.
fn verdict(test: &str, missing: &[String]) -> bool {
    if missing.is_empty() {
        return true;
    }
    let what = missing.join(", ");
    if std::env::var("STRAIT_SKIP_PRIVILEGED").as_deref() == Ok("1") {
        let _ = writeln!(
            std::io::stderr(),
            "\n**** SKIPPED {test}: needs {what} (STRAIT_SKIP_PRIVILEGED=1) ****\n"
        );
        return false;
    }
    panic!(
        "{test} is a privileged test and needs {what}; run the tests as root with those \
         installed (scripts/deps.sh), or set STRAIT_SKIP_PRIVILEGED=1 to skip it"
    );
}
