#!/usr/bin/env bash
# The README's first command: the gateway's main job on its built-in default.
#
# Builds the gateway (`strait`) and the lab (`strait-lab`), brings up the lab's veth testbed
# (a client, the gateway and four backends, each in its own network namespace, documentation
# addresses only), runs the gateway on the built-in configuration
# (config/strait.example.toml), sends real HTTP requests and UDP datagrams from the client
# namespace to the VIP, prints what each backend answered (and the client address it saw),
# and tears everything down, also on Ctrl-C or an error. Needs root (namespaces, XDP,
# AF_XDP).
#
#   REQUESTS=300 ./scripts/demo.sh
#   ./scripts/demo.sh failover      three gateways behind a BGP/ECMP router (BIRD), 100 live
#                                   TCP streams: one gateway killed, one drained, one
#                                   restarted; then two gateways on one segment (VRRP)
set -euo pipefail
cd "$(dirname "$0")/.."

requests="${REQUESTS:-200}"
prefix="${STRAIT_DEMO_PREFIX:-strait}"
if [ "$(id -u)" -ne 0 ]; then
  echo "demo: needs root for network namespaces, XDP and AF_XDP (try: sudo $0)" >&2
  exit 1
fi

bash scripts/deps.sh
cargo build --release -p strait-control -p strait-lab
strait="$PWD/target/release/strait"
lab="$PWD/target/release/strait-lab"

if [ "${1:-}" = "failover" ]; then
  # The bench brings its own testbed up and down (also on Ctrl-C).
  echo "== three gateways behind a router: kill, drain, restart, with 100 streams"
  "$lab" bench failover --gateways 3 --streams 100 --prefix "$prefix-fo"
  echo "== two gateways on one segment (VRRP): the owner killed, then drained"
  "$lab" bench failover --l2 --gateways 2 --streams 100 --prefix "$prefix-l2"
  exit 0
fi
log="$(mktemp -t strait-demo.XXXXXX.log)"

gw=""
cleanup() {
  status=$?
  trap - EXIT INT TERM
  if [ -n "$gw" ] && kill -0 "$gw" 2>/dev/null; then
    kill -TERM "$gw"
    wait "$gw" || true
  fi
  "$lab" testbed down --prefix "$prefix" || true
  echo "gateway log: $log"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== testbed"
"$lab" testbed up --prefix "$prefix" --backends 4

echo "== gateway (built-in configuration), log in $log"
ip netns exec "$prefix-gw" "$strait" run 2>"$log" &
gw=$!
in_gw() { ip netns exec "$prefix-gw" "$@"; }
for _ in $(seq 1 100); do
  if in_gw curl -sf --max-time 1 http://127.0.0.1:9900/healthz >/dev/null 2>&1; then
    break
  fi
  kill -0 "$gw" 2>/dev/null || { echo "demo: the gateway exited:"; tail -20 "$log"; exit 1; }
  sleep 0.1
done
in_gw "$strait" status

echo "== $requests HTTP requests from the client to http://203.0.113.10/"
answers="$(mktemp)"
failed=0
for _ in $(seq 1 "$requests"); do
  ip netns exec "$prefix-client" curl -s --max-time 2 http://203.0.113.10/ >>"$answers" || failed=$((failed + 1))
done
echo "answers per backend (each backend names the client address it saw):"
sed -E 's/client=([^ ]+):[0-9]+/client=\1/' "$answers" | sort | uniq -c
echo "failed requests: $failed"

echo "== UDP echo to 203.0.113.10:5353"
for i in 1 2 3 4; do
  ip netns exec "$prefix-client" timeout 2 bash -c \
    'exec 3<>/dev/udp/203.0.113.10/5353; echo "ping" >&3; head -n 1 <&3' \
    || echo "(no answer)"
done

echo "== gateway counters"
in_gw curl -s http://127.0.0.1:9900/metrics | grep -E '^strait_(rx|tx|pass)_packets_total|^strait_backend_new_flows_total' || true
rm -f "$answers"
[ "$failed" -eq 0 ]
