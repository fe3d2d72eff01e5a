//! Compiles the gateway's XDP steering program `bpf/steer.bpf.c` with clang into
//! `$OUT_DIR/steer.bpf.o`, which `xsk::prog` embeds with `include_bytes!` (see
//! `build_bpf.rs` for what it needs).

use std::env;
use std::path::PathBuf;
use std::process::Command;

const PROGRAMS: [&str; 1] = ["steer"];

fn main() {
    for name in PROGRAMS {
        println!("cargo:rerun-if-changed=bpf/{name}.bpf.c");
    }
    println!("cargo:rerun-if-changed=build_bpf.rs");
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

include!("build_bpf.rs");
