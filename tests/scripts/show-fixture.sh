#!/bin/sh
# Decodes golden fixtures with tshark, checksum validation on.
#
#   tests/scripts/show-fixture.sh NAME...      e.g. nat_forward_tcp_v4 (both .in and .out)
#   tests/scripts/show-fixture.sh -V NAME...   full dissection
#
# The .hex files under tests/fixtures are od-style dumps behind '#' comment lines, which
# text2pcap reads as they are. GUE (UDP port 6080) payloads are decoded as IP.
set -eu
here=$(dirname "$0")
dir="$here/../fixtures"
detail=
if [ "${1:-}" = "-V" ]; then
    detail=-V
    shift
fi
[ $# -gt 0 ] || { sed -n '2,6s/^# \{0,1\}//p' "$0"; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for name in "$@"; do
    for dirn in in out; do
        f="$dir/$name.$dirn.hex"
        [ -f "$f" ] || continue
        echo "== $name.$dirn: $(sed -n '1s/^# [^:]*: //p' "$f")"
        text2pcap -q "$f" "$tmp/$name.$dirn.pcap" 2>/dev/null
        tshark -r "$tmp/$name.$dirn.pcap" -n $detail \
            -o ip.check_checksum:TRUE -o tcp.check_checksum:TRUE -o udp.check_checksum:TRUE \
            -d udp.port==6080,ip 2>/dev/null
    done
done
