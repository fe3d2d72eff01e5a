//! `strait check` on a configuration with a DPDK interface: refused with the field and the
//! build command by a build without the `dpdk` feature, accepted (and summarised with the
//! device) by one with it. Runs the real binary; no root.

use std::process::Command;

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
