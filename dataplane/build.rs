//! Compiles the XDP programs `bpf/*.bpf.c` with clang into `$OUT_DIR/*.bpf.o`, which the `xsk`
//! module embeds with `include_bytes!`: `steer` (the gateway's steering program, `xsk::prog`),
//! `sink` (the benchmark's counter and probe reflector, `xsk::sink`) and `redirect` (the
//! `limit` forwarder's redirect-everything program, `xsk::l2fwd`).
//!
//! Needs clang (any version that targets BPF, 11 or newer) and the libbpf and kernel UAPI
//! headers (`apt-get install clang llvm libbpf-dev linux-libc-dev`). `CLANG` names another
//! compiler; `STRAIT_BPF_CFLAGS` adds flags (e.g. `-I/some/include`).

use std::env;
use std::path::PathBuf;
use std::process::Command;

const PROGRAMS: [&str; 3] = ["steer", "sink", "redirect"];

fn main() {
    for name in PROGRAMS {
        println!("cargo:rerun-if-changed=bpf/{name}.bpf.c");
    }
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rerun-if-env-changed=STRAIT_BPF_CFLAGS");
    if env::var_os("CARGO_FEATURE_XSK").is_none() {
        return;
    }
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for name in PROGRAMS {
        compile(
            &format!("bpf/{name}.bpf.c"),
            &out_dir.join(format!("{name}.bpf.o")),
        );
    }
}

/// Compiles the BPF C file `source` into the object `out`, or panics saying what is missing.
fn compile(source: &str, out: &std::path::Path) {
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
    cmd.arg("-c").arg(source).arg("-o").arg(out);
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) => panic!(
            "\n\nstrait-dataplane: cannot run `{clang}` ({e}).\n\
             clang compiles the XDP program {source}.\n\
             Install it (Debian: `apt-get install clang llvm libbpf-dev`), set CLANG to a \
             clang that targets BPF, or build without the `xsk` feature.\n"
        ),
    };
    if !status.success() {
        panic!(
            "\n\nstrait-dataplane: `{clang}` failed ({status}) compiling {source}; see its \
             messages above.\nMissing <bpf/bpf_helpers.h> means libbpf-dev is not installed; \
             missing <asm/types.h> means the kernel UAPI headers (linux-libc-dev) are not.\n"
        );
    }
}
