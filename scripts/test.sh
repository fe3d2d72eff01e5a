#!/usr/bin/env bash
# The test command of the README: installs what the tests need, then runs formatting,
# lints, every test (unit, property, golden fixtures decoded by tshark, truncation sweeps,
# allocation count) and a short fuzz run of the parser and the pipeline.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace
if [ -f fuzz/smoke.sh ]; then
  echo "== fuzz smoke (${FUZZ_SECONDS:-20} s per target)"
  FUZZ_SECONDS="${FUZZ_SECONDS:-20}" bash fuzz/smoke.sh
fi
