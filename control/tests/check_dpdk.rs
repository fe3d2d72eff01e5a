//! `strait check` on a configuration with a DPDK interface: refused with the field and the
//! build command by a build without the `dpdk` feature, accepted (and summarised with the
//! device) by one with it; and a start that fails in EAL leaves no runtime directory (root,
//! through the privileged tests' gate). Runs the real binary.

use std::process::Command;

use strait_testkit::privileged::{self as gate, Tool};

/// util-linux's `unshare`, which runs the gateway in a network namespace of its own.
const UNSHARE: Tool = ("unshare", "--version", "util-linux");

#[test]
fn strait_check_answers_for_a_dpdk_interface_as_the_build_allows() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("dpdk.toml");
    std::fs::write(
        &path,
        "[gateway.dpdk]\nno_huge = true\nmemory_mb = 1024\n\n[[gateway.interfaces]]\n\
         name = \"eth1\"\nqueues = [0]\ndriver = \"dpdk\"\ndevice = \"0000:03:00.0\"\n",
    )
    .expect("write the configuration");
    let out = Command::new(env!("CARGO_BIN_EXE_strait"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .expect("run strait check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if cfg!(feature = "dpdk") {
        assert!(out.status.success(), "{stdout}{stderr}");
        assert!(
            stdout.contains("eth1 queues 0 role both driver dpdk device 0000:03:00.0"),
            "{stdout}"
        );
    } else {
        assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
        assert!(
            stderr.contains("gateway.interfaces[0].driver: interface eth1 uses driver = \"dpdk\"")
                && stderr.contains("--features dpdk"),
            "{stderr}"
        );
    }
}

/// A start that fails in EAL (a device it cannot parse) leaves no runtime directory behind:
/// EAL makes `/var/run/dpdk/PREFIX` before it probes devices. Root (EAL's runtime directory,
/// a network namespace of its own to run in); a build with the `dpdk` feature.
#[test]
fn a_start_that_fails_in_eal_removes_its_runtime_directory() {
    if !cfg!(feature = "dpdk") {
        eprintln!("SKIPPED: needs a build with --features dpdk");
        return;
    }
    if !gate::privileged(
        "a_start_that_fails_in_eal_removes_its_runtime_directory",
        &[UNSHARE],
    ) {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let prefix = format!("strait-test-{}", std::process::id());
    let path = dir.path().join("bogus.toml");
    std::fs::write(
        &path,
        format!(
            "[gateway.dpdk]\nno_huge = true\nmemory_mb = 128\nfile_prefix = \"{prefix}\"\n\n\
             [[gateway.interfaces]]\nname = \"dpx0\"\nqueues = [0]\ndriver = \"dpdk\"\n\
             device = \"net_bogus0,iface=nosuch0\"\n"
        ),
    )
    .expect("write the configuration");
    let out = Command::new("unshare")
        .args(["--net", env!("CARGO_BIN_EXE_strait"), "run", "--config"])
        .arg(&path)
        .output()
        .expect("run strait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("DPDK EAL init"), "{stderr}");
    let runtime = std::path::Path::new("/var/run/dpdk").join(&prefix);
    assert!(!runtime.exists(), "{} left behind", runtime.display());
}
