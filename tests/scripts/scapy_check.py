#!/usr/bin/python3
"""Decode a pcap of Strait fixture frames with scapy and recompute every checksum.

Usage: scapy_check.py FILE.pcap

Prints one line per frame, in order: "<n>\t<summary>\t<verified>\t<problems>": the
checksums verified ("IP.chksum TCP.chksum ...") and the problems found, joined by "; "
and empty when there are none. Exits 3 when scapy cannot be imported, so the caller can
tell "no scapy" from "bad packets".

A checksum is verified by clearing the field and letting scapy rebuild the packet: the
value it computes must equal the one on the wire. That covers the IPv4 header, TCP, UDP
(pseudo-headers, IPv6 extension headers included), ICMP and ICMPv6. Fragments are
collected in file order and, once a datagram is complete, its transport checksum is
checked over the reassembled payload (reported on the frame that completed it, as
"reassembled-TCP" / "reassembled-UDP"). Not checked: the packets quoted inside ICMP errors
(cut short by design) and a zero UDP checksum over IPv4 ("none", RFC 768). GUE variant 1 payloads (UDP port 6080) are decoded
again as IPv4 or IPv6 by their version nibble and checked the same way.
"""

import sys

try:
    from scapy.all import IP, UDP, IPv6, Raw, rdpcap
    from scapy.layers.inet import in4_chksum
    from scapy.layers.inet6 import IPv6ExtHdrFragment, in6_chksum
except ImportError as e:  # pragma: no cover
    print(f"cannot import scapy: {e}", file=sys.stderr)
    sys.exit(3)

GUE_PORT = 6080
# Layers that hold a quoted, possibly truncated packet: stop checking there.
QUOTE_MARKERS = ("error", "Error")


def layers(p):
    out = []
    layer = p
    while layer is not None and not isinstance(layer, Raw) and layer.name != "NoPayload":
        out.append(layer)
        if not layer.payload:
            break
        layer = layer.payload
    return out


def checksum_field(layer):
    for f in ("chksum", "cksum"):
        if f in layer.fields:
            return f
    return None


def fragmented(layer_list):
    for layer in layer_list:
        if isinstance(layer, IP) and (layer.flags.MF or layer.frag):
            return True
        if isinstance(layer, IPv6ExtHdrFragment):
            return True
    return False


def check(p, where):
    """Returns (checksums verified, problems)."""
    verified = []
    problems = []
    ls = layers(p)
    in_fragment = False
    for i, layer in enumerate(ls):
        name = type(layer).__name__
        if any(m in name for m in QUOTE_MARKERS):
            break
        if isinstance(layer, (IP, IPv6)):
            in_fragment = fragmented(ls[i:])
        field = checksum_field(layer)
        if field is None:
            continue
        is_l4 = not isinstance(layer, IP)
        if is_l4 and in_fragment:
            continue
        value = getattr(layer, field)
        if isinstance(layer, UDP) and value == 0 and isinstance(layer.underlayer, IP):
            continue
        q = p.copy()
        ql = layers(q)[i]
        setattr(ql, field, None)
        rebuilt = type(p)(bytes(q))
        want = getattr(layers(rebuilt)[i], field)
        if want != value:
            problems.append(f"{where}{name}.{field} {value:#06x}, should be {want:#06x}")
        else:
            verified.append(f"{where}{name}.{field}")
    return verified, problems


class Reassembler:
    """Collects IPv4 and IPv6 fragments; checks a datagram's transport checksum once whole."""

    NAMES = {6: "TCP", 17: "UDP"}

    def __init__(self):
        self.pending = {}

    def add(self, p):
        """Returns (verified, problems) for a datagram this fragment completes."""
        if IP in p and (p[IP].flags.MF or p[IP].frag):
            ip = p[IP]
            key = (4, ip.src, ip.dst, ip.id, ip.proto)
            part = (ip.frag * 8, bytes(ip.payload)[: ip.len - ip.ihl * 4], bool(ip.flags.MF))
        elif IPv6ExtHdrFragment in p:
            ip, fh = p[IPv6], p[IPv6ExtHdrFragment]
            key = (6, ip.src, ip.dst, fh.id, fh.nh)
            part = (fh.offset * 8, bytes(fh.payload), bool(fh.m))
        else:
            return [], []
        parts = self.pending.setdefault(key, [])
        parts.append(part)
        parts.sort()
        data, last = b"", False
        for off, chunk, more in parts:
            if off != len(data):
                return [], []
            data += chunk
            last = not more
        if not last:
            return [], []
        del self.pending[key]
        family, src, dst, _, proto = key
        name = self.NAMES.get(proto)
        if name is None:
            return [], []
        if proto == 17 and family == 4 and data[6:8] == b"\0\0":
            return [], []
        if family == 4:
            residue = in4_chksum(proto, IP(src=src, dst=dst), data)
        else:
            residue = in6_chksum(proto, IPv6(src=src, dst=dst), data)
        if residue != 0:
            return [], [f"reassembled-{name}.chksum off by {residue:#06x}"]
        return [f"reassembled-{name}.chksum"], []


def main():
    reassembler = Reassembler()
    for n, p in enumerate(rdpcap(sys.argv[1]), start=1):
        verified, problems = check(p, "")
        v, pr = reassembler.add(p)
        verified += v
        problems += pr
        summary = p.summary()
        if UDP in p and p[UDP].dport == GUE_PORT:
            payload = bytes(p[UDP].payload)
            version = payload[0] >> 4 if payload else 0
            inner = {4: IP, 6: IPv6}.get(version)
            if inner is None:
                problems.append(f"GUE payload is not IP (version {version})")
            else:
                q = inner(payload)
                summary += " || GUE inner: " + q.summary()
                v, pr = check(q, "GUE-inner-")
                verified += v
                problems += pr
        print(f"{n}\t{summary}\t{' '.join(verified)}\t{'; '.join(problems)}")


if __name__ == "__main__":
    main()
