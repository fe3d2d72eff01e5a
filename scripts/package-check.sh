#!/usr/bin/env bash
# Builds the Debian package (scripts/package.sh) and checks it as an operator meets it:
# its metadata and contents (dpkg-deb --info / --contents), lintian, then a real dpkg
# install into a throwaway root (its own dpkg database; maintainer scripts run with
# DPKG_ROOT, as dpkg --root does for a chrootless install), the installed binary's
# `--version` and `check` of the installed configuration, the man pages rendered, the unit
# enabled and not started (and read by systemd-analyze), an upgrade that keeps an edited
# conffile, removal and purge.
#
# STRAIT_PACKAGE_PROFILE passes to package.sh (CI: `dev`, the binary the tests built; the
# packaging is the same for every profile).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "package-check: $*" >&2; exit 1; }

deb=$(bash scripts/package.sh)
echo "package-check: $deb"
info=$(dpkg-deb --info "$deb")
contents=$(dpkg-deb --contents "$deb" | awk '{print $NF}' | sed 's|^\./|/|')

# The control archive: the conffiles and the maintainer scripts that enable the unit.
for member in conffiles postinst prerm postrm; do
  grep -Eq "^ +[0-9]+ bytes, +[0-9]+ lines +\*? *$member( |$)" <<<"$info" \
    || fail "no $member in the control archive: $info"
done
field() { dpkg-deb --field "$deb" "$1"; }
[ "$(field Package)" = strait ] || fail "Package: $(field Package)"
[ "$(field Architecture)" = amd64 ] || fail "Architecture: $(field Architecture)"
[ "$(field Recommends)" = "bird2, keepalived" ] || fail "Recommends: $(field Recommends)"
# No early-exit reader (`grep -q`, `head`) behind a pipe in this script: under pipefail, a
# writer still writing when its reader has gone fails the pipeline with SIGPIPE (141), as
# chance decides. Outputs are captured whole and then tested.
grep -q libc6 <<<"$(field Depends)" || fail "Depends: $(field Depends)"
# The synopsis (the Description's first line) is whole: the crate's description, under 80
# characters, not a longer one cargo-deb wrapped mid-sentence into the long description.
description=$(field Description)
synopsis=${description%%$'\n'*}
crate=$(sed -n 's/^description = "\(.*\)"$/\1/p' control/Cargo.toml)
[ "$synopsis" = "$crate" ] && [ ${#synopsis} -lt 80 ] \
  || fail "Description's synopsis \"$synopsis\" is not control/Cargo.toml's description under 80 characters"
grep -q "Strait is an edge load balancer" <<<"$(sed -n 2p <<<"$description")" \
  || fail "Description's long part is not the extended description: $description"

# What the binary's own help lists is what the man pages must cover.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dpkg-deb -x "$deb" "$tmp/x"
subcommands=$("$tmp/x/usr/sbin/strait" --help |
  awk '/^Commands:/{on=1; next} /^$/{on=0} on {print $1}' | grep -v '^help$')
[ -n "$subcommands" ] || fail "no subcommands in strait --help"
expected=(/usr/sbin/strait /etc/strait/strait.toml /etc/default/strait
  /usr/lib/systemd/system/strait.service /usr/share/man/man8/strait.8.gz
  /usr/share/bash-completion/completions/strait /usr/share/zsh/vendor-completions/_strait
  /usr/share/fish/vendor_completions.d/strait.fish
  /usr/share/strait/rbac.yaml /usr/share/strait/crd.yaml /usr/share/strait/strait-3node.toml
  /usr/share/doc/strait/copyright /usr/share/doc/strait/install.md)
for s in $subcommands; do expected+=("/usr/share/man/man8/strait-$s.8.gz"); done
if [ -d deploy/monitoring ]; then
  while IFS= read -r f; do expected+=("/usr/share/strait/${f#deploy/}"); done \
    < <(find deploy/monitoring -type f)
fi
for p in "${expected[@]}"; do
  grep -qxF "$p" <<<"$contents" || fail "$p is not in the package"
done
# Debian's policy checks; the overrides, with their reasons, are deploy/strait.lintian-overrides.
lintian_rc=0
lintian --fail-on error,warning "$deb" >"$tmp/lintian.log" 2>&1 || lintian_rc=$?
grep -v "running with root privileges" "$tmp/lintian.log" >&2 || true
[ "$lintian_rc" -eq 0 ] || fail "lintian"
# Through a file: tar may stop at the archive's end blocks before dpkg-deb has written the
# padding after them, which a pipe would turn into SIGPIPE.
dpkg-deb --ctrl-tarfile "$deb" >"$tmp/control.tar"
conffiles=$(tar -xOf "$tmp/control.tar" ./conffiles)
for c in /etc/strait/strait.toml /etc/default/strait; do
  grep -qxF "$c" <<<"$conffiles" || fail "$c is not a conffile"
done

# Install into a throwaway root with its own dpkg database.
root="$tmp/root"
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/triggers"
touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"
# As in any chroot: the maintainer scripts may enable the unit (in the root) but start or
# stop no service (deb-systemd-invoke asks $DPKG_ROOT/usr/sbin/policy-rc.d), so a host
# running systemd, and a strait installed on it, are left alone.
mkdir -p "$root/usr/sbin"
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
dpkg_root() {
  # Depends are not installed in the root (the host's libraries serve the binary).
  dpkg --root="$root" --log=/dev/null --force-script-chrootless --force-depends \
    "$@" >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log" >&2; fail "dpkg $*"; }
}
dpkg_root -i "$deb"
grep -qx "Status: install ok installed" <<<"$(dpkg-query --root="$root" -s strait)" \
  || fail "not installed"

grep -qx "strait $(field Version | sed 's/-[^-]*$//')" <<<"$("$root/usr/sbin/strait" --version)" \
  || fail "strait --version: $("$root/usr/sbin/strait" --version)"
"$root/usr/sbin/strait" check --config "$root/etc/strait/strait.toml" >/dev/null \
  || fail "strait check of the installed configuration"

# Enabled (its wants link), not started (no start in the maintainer scripts).
[ -L "$root/etc/systemd/system/multi-user.target.wants/strait.service" ] \
  || fail "strait.service is not enabled"
if grep -Eq "deb-systemd-invoke (start|restart)|systemctl.*(start|restart)" \
  "$root/var/lib/dpkg/info/strait.postinst"; then
  fail "the postinst starts the service"
fi
grep -qx "KillMode=mixed" "$root/usr/lib/systemd/system/strait.service" \
  || fail "strait.service lacks KillMode=mixed"
# The unit as systemd reads it (a misspelt key or value is reported); the binary is in the
# throwaway root, not in /usr/sbin, hence the one complaint left out.
verify=$(systemd-analyze verify --man=no "$root/usr/lib/systemd/system/strait.service" 2>&1 |
  grep -v "Command /usr/sbin/strait is not executable" || true)
[ -z "$verify" ] || fail "systemd-analyze verify strait.service: $verify"
# What the unit's capabilities allow, tried: root limited to its CapabilityBoundingSet binds
# the BGP port (BIRD, strait's child, listens on TCP 179), in a network namespace of its own.
caps=$(sed -n 's/^CapabilityBoundingSet=//p' "$root/usr/lib/systemd/system/strait.service")
bounding="-all$(for c in $caps; do printf ',+%s' "$(tr '[:upper:]' '[:lower:]' <<<"${c#CAP_}")"; done)"
bound=$(unshare --net setpriv --bounding-set "$bounding" /usr/bin/python3 -c \
  'import socket; socket.socket().bind(("0.0.0.0", 179)); print("bound")' 2>&1) \
  || fail "strait.service's CapabilityBoundingSet ($caps) cannot bind TCP 179 for BGP: $bound"

# Every man page renders.
for page in "$root"/usr/share/man/man8/strait*.8.gz; do
  out=$(MANWIDTH=80 man -l "$page" 2>&1) || fail "man -l $page: $out"
  grep -q "^NAME" <<<"$out" || fail "$page renders without NAME: $out"
done
grep -q "strait-run(8)" <<<"$(MANWIDTH=80 man -l "$root/usr/share/man/man8/strait.8.gz")" \
  || fail "strait(8) does not list strait-run(8)"

# An upgrade (the same files under a later version) keeps an edited conffile.
echo "# edited by the operator" >>"$root/etc/strait/strait.toml"
cp "$root/etc/strait/strait.toml" "$tmp/edited.toml"
dpkg-deb -R "$deb" "$tmp/next"
sed -i "s/^Version: .*/Version: $(field Version).1/" "$tmp/next/DEBIAN/control"
dpkg-deb --root-owner-group -Znone -b "$tmp/next" "$tmp/next.deb" >/dev/null
dpkg_root -i "$tmp/next.deb"
cmp -s "$root/etc/strait/strait.toml" "$tmp/edited.toml" || fail "the upgrade overwrote the edited conffile"
grep -qx "Version: $(field Version).1" <<<"$(dpkg-query --root="$root" -s strait)" \
  || fail "not upgraded"

# Removal keeps the configuration; purge takes it and the unit's enablement.
dpkg_root -r strait
[ ! -e "$root/usr/sbin/strait" ] || fail "remove left /usr/sbin/strait"
[ -f "$root/etc/strait/strait.toml" ] || fail "remove took the configuration"
dpkg_root -P strait
[ ! -e "$root/etc/strait/strait.toml" ] || fail "purge left the configuration"
[ ! -e "$root/etc/systemd/system/multi-user.target.wants/strait.service" ] \
  || fail "purge left the unit enabled"

echo "package-check: $(basename "$deb"): metadata, contents, conffiles, lintian, install, strait --version and check, unit and its capabilities, man pages, upgrade, remove and purge: ok"
