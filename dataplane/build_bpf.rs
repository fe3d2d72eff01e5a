// Compiling an XDP program written in C into a BPF object with clang: shared by the build
// scripts of strait-dataplane (the steering program) and strait-lab (the sink and the `limit`
// forwarder), each of which `include!`s this file.
//
// Needs clang (any version that targets BPF, 11 or newer) and the libbpf and kernel UAPI
// headers (`apt-get install clang llvm libbpf-dev linux-libc-dev`). `CLANG` names another
// compiler; `STRAIT_BPF_CFLAGS` adds flags (e.g. `-I/some/include`).

/// Compiles the BPF C file `source` into the object `out`, or panics saying what is missing.
fn compile(source: &str, out: &std::path::Path) {
    let pkg = env::var("CARGO_PKG_NAME").unwrap_or_default();
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
            "\n\n{pkg}: cannot run `{clang}` ({e}).\n\
             clang compiles the XDP program {source}.\n\
             Install it (Debian: `apt-get install clang llvm libbpf-dev`), set CLANG to a \
             clang that targets BPF (strait-dataplane builds without BPF when its `xsk` feature is off).\n"
        ),
    };
    if !status.success() {
        panic!(
            "\n\n{pkg}: `{clang}` failed ({status}) compiling {source}; see its \
             messages above.\nMissing <bpf/bpf_helpers.h> means libbpf-dev is not installed; \
             missing <asm/types.h> means the kernel UAPI headers (linux-libc-dev) are not.\n"
        );
    }
}
