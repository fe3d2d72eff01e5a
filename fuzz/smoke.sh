#!/usr/bin/env bash
# CI entry for Strait's fuzz targets: a bounded run of each target from the seed corpus.
#
#   bash fuzz/smoke.sh                 # every target, 30 s each
#   FUZZ_SECONDS=300 bash fuzz/smoke.sh pipeline
#
# Environment:
#   FUZZ_SECONDS    time per target (default 30)
#   FUZZ_SANITIZER  cargo-fuzz sanitizer: address (default) or none. AddressSanitizer works
#                   on the stable toolchain with RUSTC_BOOTSTRAP=1 (only our crates are
#                   instrumented, std is not rebuilt); `none` runs about twice as fast and
#                   is the fallback for a host where ASan will not link.
#   FUZZ_CORPUS     keep the grown corpus here (default: a temporary directory, removed)
#
# cargo-fuzz passes nightly-only flags (-Zsanitizer, -Cpasses=sancov-module) to rustc;
# RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them. Seeds live in fuzz/seeds/<target>
# (fuzz/corpus is git-ignored) and are copied into a scratch corpus, so a run never dirties
# the tree. A crash exits non-zero, leaving the input in fuzz/artifacts/<target>/ (also
# git-ignored) and printing the `cargo fuzz run <target> <file>` line that reproduces it.
#
# Seeds are written by `cargo test -p strait-tests --test checksum_props -- --ignored
# gen_fuzz_seeds`.

set -euo pipefail

cd "$(dirname "$0")/.."
export RUSTC_BOOTSTRAP=1
seconds="${FUZZ_SECONDS:-30}"
sanitizer="${FUZZ_SANITIZER:-address}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(parse pipeline config)
fi
start=$SECONDS

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "smoke: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

echo "smoke: building ${targets[*]} (sanitizer: $sanitizer)" >&2
for t in "${targets[@]}"; do
    cargo fuzz build --sanitizer "$sanitizer" "$t"
done

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

status=0
for t in "${targets[@]}"; do
    corpus="${FUZZ_CORPUS:-$scratch}/$t"
    mkdir -p "$corpus"
    cp fuzz/seeds/"$t"/* "$corpus"/
    echo "smoke: fuzzing $t for ${seconds}s from $(ls "$corpus" | wc -l) inputs" >&2
    if ! cargo fuzz run --sanitizer "$sanitizer" "$t" "$corpus" -- \
        -max_total_time="$seconds" -print_final_stats=1 2>"$scratch/$t.log"; then
        tail -n 60 "$scratch/$t.log" >&2
        echo "smoke: $t FAILED; the input is in fuzz/artifacts/$t/" >&2
        status=1
        continue
    fi
    grep -E '^(Done|stat::number_of_executed_units|stat::new_units_added|stat::peak_rss_mb)' \
        "$scratch/$t.log" >&2 || true
done

echo "smoke: done in $((SECONDS - start))s" >&2
exit "$status"
