//! Builds the C shim (shim/shim.c) against the system's DPDK, found with pkg-config
//! (`libdpdk`; Debian's `dpdk-dev`), and links DPDK's shared libraries. DPDK's poll-mode
//! drivers are plugins that EAL loads from its driver directory at start, so no driver is
//! named here.

fn main() {
    println!("cargo:rerun-if-changed=shim/shim.c");
    let dpdk = match pkg_config::Config::new()
        .atleast_version("21.11")
        .probe("libdpdk")
    {
        Ok(lib) => lib,
        Err(e) => panic!(
            "strait-dpdk needs DPDK's development files (Debian: `apt-get install dpdk-dev`, \
             pkg-config module libdpdk >= 21.11); build without `--features dpdk` for an \
             AF_XDP-only gateway: {e}"
        ),
    };
    let mut cc = cc::Build::new();
    cc.file("shim/shim.c")
        .warnings(true)
        .flag_if_supported("-Wno-unused-parameter");
    for p in &dpdk.include_paths {
        cc.include(p);
    }
    // pkg-config's cflags beyond the include paths: `-include rte_config.h` and the
    // `-march` DPDK was built for (its headers' inline code assumes it).
    let cflags = std::process::Command::new("pkg-config")
        .args(["--cflags-only-other", "libdpdk"])
        .output()
        .expect("running pkg-config");
    let cflags = String::from_utf8_lossy(&cflags.stdout);
    let mut words = cflags.split_whitespace();
    while let Some(w) = words.next() {
        if w == "-include" {
            if let Some(file) = words.next() {
                cc.flag("-include").flag(file);
            }
        } else {
            cc.flag(w);
        }
    }
    cc.compile("strait_dpdk_shim");
}
