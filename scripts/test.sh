#!/usr/bin/env bash
# The test command of the README: installs what the tests need, then checks the docs' links
# (scripts/check-docs.py), formatting, lints, every test (unit, property, golden fixtures
# decoded by tshark, truncation sweeps, allocation count), the Debian package's check, the
# DPDK port driver's build and tests (`--features dpdk`, with Debian's dpdk-dev), the
# pipeline's instructions per packet against their baseline, and a short fuzz run of the
# parser and the pipeline.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh

echo "== docs: every relative link and anchor of README.md and docs/*.md resolves"
/usr/bin/python3 scripts/check-docs.py --self-test
/usr/bin/python3 scripts/check-docs.py

echo "== import circles (scripts/check-imports.py)"
/usr/bin/python3 scripts/check-imports.py --self-test
/usr/bin/python3 scripts/check-imports.py

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace
# The Debian package, from the `strait` the tests built (the packaging is the same for the
# release build, which takes far longer): contents, metadata, a dpkg install into a
# throwaway root, the installed binary, man pages, upgrade, removal.
echo "== Debian package"
STRAIT_PACKAGE_PROFILE=dev bash scripts/package-check.sh
# The DPDK driver is a cargo feature (the default build needs no DPDK): lint and test the
# gateway with it, then the end-to-end tests on DPDK ports with a `strait` built with it.
echo "== DPDK: cargo clippy / test --features dpdk"
cargo clippy -p strait-control -p strait-lab -p strait-tests \
  --features strait-control/dpdk,strait-lab/dpdk,strait-tests/dpdk --all-targets -- -D warnings
cargo test -p strait-control --features dpdk --lib --test check_dpdk
# The DPDK worker loop under the counting allocator (a net_af_packet port on a veth).
cargo test -p strait-tests --features dpdk --test no_alloc
cargo build -p strait-control --features dpdk --bin strait
cargo test -p strait-lab --features dpdk --test dpdk
# The line-rate bench's DPDK rows (limit-dpdk, strait-dpdk-*): unit tests and a short run.
cargo test -p strait-lab --features dpdk --lib bench::line
cargo test -p strait-lab --features dpdk --test line_rate dpdk
# Instructions per packet (callgrind, release build) against docs/instructions.json.
echo "== instructions per packet"
bash scripts/check-instructions.sh
if [ -f fuzz/smoke.sh ]; then
  echo "== fuzz smoke (${FUZZ_SECONDS:-20} s per target)"
  FUZZ_SECONDS="${FUZZ_SECONDS:-20}" bash fuzz/smoke.sh
fi
