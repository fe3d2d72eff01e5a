#!/usr/bin/env bash
# Builds the gateway's Debian package, strait_VERSION_amd64.deb, and prints its path (the
# only line on stdout): the release `strait` as /usr/sbin/strait, its man pages (strait(8),
# one per subcommand) and bash/zsh/fish completions generated from the binary's own command
# line (`strait generate-docs`), the example configuration as the conffile
# /etc/strait/strait.toml, /etc/default/strait, the systemd unit, and deploy/'s manifests and
# monitoring kit under /usr/share/strait. What goes where: control/Cargo.toml
# ([package.metadata.deb]) and docs/install.md.
#
# cargo-deb (crates.io) is installed when missing. STRAIT_PACKAGE_PROFILE names another cargo
# profile than `release` (the CI's package check uses `dev`, whose binary the tests built;
# cargo-deb warns that it is meant for release profiles, and is pinned to a version that
# still takes others).
set -euo pipefail
cd "$(dirname "$0")/.."

profile="${STRAIT_PACKAGE_PROFILE:-release}"
case "$profile" in
  dev) profile_dir=debug ;;
  *) profile_dir="$profile" ;;
esac
target="${CARGO_TARGET_DIR:-target}"

if ! cargo deb --version >/dev/null 2>&1; then
  echo "package: installing cargo-deb" >&2
  cargo install cargo-deb --locked --version 3.8.0 >&2
fi

cargo build --profile "$profile" -p strait-control --bin strait >&2

# The generated and gathered assets, where control/Cargo.toml's asset list takes them from.
assets=build/deb
rm -rf "$assets"
mkdir -p "$assets/share"
"$target/$profile_dir/strait" generate-docs "$assets" >/dev/null
cp deploy/*.yaml deploy/strait-3node.toml "$assets/share/"
# The monitoring kit ships whole once it exists (cargo-deb refuses a glob that matches
# nothing, so it is gathered here rather than named in the asset list).
if [ -d deploy/monitoring ]; then
  cp -r deploy/monitoring "$assets/share/"
else
  echo "package: no deploy/monitoring/: the package has no monitoring kit" >&2
fi

out="$target/debian"
mkdir -p "$out"
# The release binary ships stripped; its debug symbols (the release profile keeps them) go
# into strait-dbgsym_VERSION_amd64.ddeb beside it, for backtraces and profiles on a gateway.
# A package of another profile is for checking, not shipping: stripped, no symbols package,
# fast compression (xz at its best takes minutes over a 30 MB binary on a busy machine).
if [ "$profile" = release ]; then
  how=(--dbgsym)
else
  how=(--fast --strip)
fi
cargo deb -p strait-control --no-build --profile "$profile" "${how[@]}" --output "$out" >&2
version=$(cargo metadata --format-version 1 --no-deps |
  grep -o '"name":"strait-control","version":"[^"]*"' | sed 's/.*"version":"\([^"]*\)"/\1/')
deb="$out/strait_${version}-1_amd64.deb"
[ -f "$deb" ] || { echo "package: $deb was not made" >&2; exit 1; }
echo "$deb"
