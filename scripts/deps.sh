#!/usr/bin/env bash
# Installs what Strait's build, tests and demo need on a fresh Debian 12 machine (as root,
# or with sudo): clang/llvm and libbpf/libelf for the XDP program and xsk-rs, libpcap,
# iproute2, curl, tcpdump and arping for the testbed and VIP announcements, tshark and scapy
# to decode what the gateway emits, openssl for the cluster walkthrough test's CA, BIRD 2
# (bird2) for route announcement and the tests' router, keepalived for VRRP failover,
# DPDK's development files (dpdk-dev, pkg-config libdpdk) for the DPDK port driver,
# valgrind for the pipeline's instruction counts (scripts/check-instructions.sh), Prometheus
# (prometheus, which brings promtool) to test the monitoring kit's alert rules and to scrape
# a gateway in the monitoring end-to-end test, and for the Debian package and its check
# dpkg-dev (dpkg-shlibdeps: its Depends), man-db (its man pages rendered), systemd
# (systemd-analyze: its unit read) and lintian.
# Idempotent: does nothing when everything is already there.
set -euo pipefail

packages=(clang llvm libelf-dev zlib1g-dev libpcap-dev libbpf-dev pkg-config m4 iproute2 tshark python3-scapy
          tcpdump curl iputils-arping iputils-ping ethtool procps dnsmasq-base
          iptables nftables openssl bird2 keepalived dpdk-dev valgrind prometheus dpkg-dev man-db
          systemd lintian)
missing=()
for p in "${packages[@]}"; do
  grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "deps: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "deps: cargo not found; install Rust with rustup (https://rustup.rs) first" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
