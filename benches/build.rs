//! Captures `rustc -vV` of the compiler that builds this crate, for the instruction-count
//! baseline: instruction counts belong to a compiler (`strait_benches::instructions`).

use std::process::Command;

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let version = Command::new(&rustc)
        .arg("-vV")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| format!("unknown ({rustc} -vV failed)"));
    // One line: `rustc 1.95.0 (59807616e 2026-04-14); LLVM version: 22.1.2`.
    let release = version.lines().next().unwrap_or("unknown");
    let llvm = version
        .lines()
        .find(|l| l.starts_with("LLVM version"))
        .unwrap_or("LLVM version: unknown");
    println!("cargo:rustc-env=STRAIT_RUSTC_VERSION={release}; {llvm}");
    println!("cargo:rerun-if-env-changed=RUSTC");
}
