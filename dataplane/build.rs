//! Compiles the XDP steering program `bpf/steer.bpf.c` with clang into `$OUT_DIR/steer.bpf.o`,
//! which `xsk::prog` embeds with `include_bytes!`.
//!
//! Needs clang (any version that targets BPF, 11 or newer) and the libbpf and kernel UAPI
//! headers (`apt-get install clang llvm libbpf-dev linux-libc-dev`). `CLANG` names another
//! compiler; `STRAIT_BPF_CFLAGS` adds flags (e.g. `-I/some/include`).

use std::env;
use std::path::PathBuf;
use std::process::Command;

const SOURCE: &str = "bpf/steer.bpf.c";

fn main() {
    println!("cargo:rerun-if-changed={SOURCE}");
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rerun-if-env-changed=STRAIT_BPF_CFLAGS");
    if env::var_os("CARGO_FEATURE_XSK").is_none() {
        return;
    }
    let out =
        PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("steer.bpf.o");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    // The UAPI headers include <asm/types.h>, which Debian keeps under the multiarch triple.
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = match arch.as_str() {
        "x86_64" => "x86_64-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        "riscv64" => "riscv64-linux-gnu",
        other => other,
    };
    let mut cmd = Command::new(&clang);
    cmd.args(["-O2", "-g", "-Wall", "-target", "bpf"])
        .arg(format!("-I/usr/include/{multiarch}"));
    if let Ok(extra) = env::var("STRAIT_BPF_CFLAGS") {
        cmd.args(extra.split_whitespace());
    }
    cmd.arg("-c").arg(SOURCE).arg("-o").arg(&out);
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) => panic!(
            "\n\nstrait-dataplane: cannot run `{clang}` ({e}).\n\
             clang compiles the XDP steering program {SOURCE}.\n\
             Install it (Debian: `apt-get install clang llvm libbpf-dev`), set CLANG to a \
             clang that targets BPF, or build without the `xsk` feature.\n"
        ),
    };
    if !status.success() {
        panic!(
            "\n\nstrait-dataplane: `{clang}` failed ({status}) compiling {SOURCE}; see its \
             messages above.\nMissing <bpf/bpf_helpers.h> means libbpf-dev is not installed; \
             missing <asm/types.h> means the kernel UAPI headers (linux-libc-dev) are not.\n"
        );
    }
}
