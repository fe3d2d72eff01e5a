#!/usr/bin/env bash
# The README's first command: the gateway's main job on its built-in default.
#
# Until the AF_XDP workers land (issue 3), this runs the packet pipeline the workers will
# drive: it validates the built-in configuration, then measures the in-memory pipeline on one
# core over 1,000 services in every forwarding mode, and Maglev's build time and balance.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh
cargo build --release -p strait-control
./target/release/strait check
echo
./target/release/strait bench pipeline
echo
./target/release/strait bench maglev
