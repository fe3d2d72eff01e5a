//! Compiles the lab's XDP programs `bpf/*.bpf.c` with clang into `$OUT_DIR/*.bpf.o`, which
//! the lab embeds with `include_bytes!` (`embedded_object!`): `sink` (the line-rate bench's
//! counter and probe reflector, `sink::program`), `redirect` (the `limit` forwarder's
//! redirect-everything program, `l2fwd::forwarder`) and `rehash` (the tc program that makes
//! the testbed's router hash headers, `testbed::router`). The compiler invocation is the
//! dataplane's, shared through `include!`.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const PROGRAMS: [&str; 3] = ["sink", "redirect", "rehash"];

fn main() {
    for name in PROGRAMS {
        println!("cargo:rerun-if-changed=bpf/{name}.bpf.c");
    }
    println!("cargo:rerun-if-changed=../dataplane/build_bpf.rs");
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rerun-if-env-changed=STRAIT_BPF_CFLAGS");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for name in PROGRAMS {
        compile(
            &format!("bpf/{name}.bpf.c"),
            &out_dir.join(format!("{name}.bpf.o")),
        );
    }
}

include!("../dataplane/build_bpf.rs");
