#!/usr/bin/env bash
# The pipeline's instructions per packet, counted by valgrind's callgrind on a fixed
# workload per mode (established and new-flow traffic), against docs/instructions.json:
# fails when any case rose more than 5 % above it, and prints the table either way.
#
#   scripts/check-instructions.sh            compare (CI: from scripts/test.sh)
#   scripts/check-instructions.sh --update   rewrite the baseline with today's counts
#
# A change that is worth more instructions updates the baseline in the same commit and
# says why. The counts belong to the compiler that built the workload (the baseline records
# it; on another rustc the check warns loudly and still compares). Release build, as the
# gateway runs. Design: benches/src/instructions.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

update=()
case "${1:-}" in
  "") ;;
  --update) update=(--update) ;;
  *) echo "usage: $0 [--update]" >&2; exit 2 ;;
esac

command -v valgrind >/dev/null || { echo "check-instructions: valgrind missing (scripts/deps.sh)" >&2; exit 1; }
cargo build --release -q -p strait-benches --bin strait-instructions
target/release/strait-instructions check --baseline docs/instructions.json "${update[@]}"
