"""SCTP peers for Strait's end-to-end tests (lab/tests/sctp.rs). The test machine's kernel
has no SCTP module, so both ends speak SCTP over raw IP sockets, with scapy (an
implementation independent of Strait's) building and parsing every packet and computing
its CRC32c.

    sctp.py serve NAME PORT            on a backend: answer every SCTP packet to PORT; an
                                       INIT with an INIT ACK whose state cookie is
                                       `backend=NAME`, a DATA chunk with a SACK and a DATA
                                       chunk `backend=NAME`; print `ready` once listening
    sctp.py assoc SRC VIP PORT FIRST N DATA
                                       from SRC: one association from each source port
                                       FIRST..FIRST+N-1 to VIP:PORT, an INIT, then DATA
                                       packets of one DATA chunk each, every one waiting for
                                       its answer; print a line per association
                                       `sport=P backend=B answers=K` (B the backends that
                                       answered, `,`-joined; `-` for none), then
                                       `sent=N answered=M packets=P` (M associations with
                                       every answer, P packets sent, retries included)
    sctp.py data SRC VIP PORT FIRST N DATA
                                       as assoc, without the INITs: the same associations
                                       carrying on (the same tags and first TSNs)
    sctp.py send SRC VIP PORT FIRST N DATA
                                       as assoc, without waiting for answers (for tunnels
                                       the backends cannot end); print `sent=PACKETS`
    sctp.py corrupt SRC VIP PORT FIRST N DATA
                                       as send, each packet's CRC32c off by one bit

An answer counts only if it comes from VIP:PORT to the association's port, carries the
association's verification tag and a valid CRC32c. A raw socket of protocol 132 also keeps
the kernel from answering SCTP with ICMP protocol-unreachable.
"""
import select
import socket
import sys
import time

from scapy.layers.inet import IP
from scapy.layers.inet6 import IPv6
from scapy.layers.sctp import (
    SCTP,
    SCTPChunkData,
    SCTPChunkInit,
    SCTPChunkInitAck,
    SCTPChunkParamStateCookie,
    SCTPChunkSACK,
    crc32c,
)

IPPROTO_SCTP = 132
# An answer crosses the gateway twice at most, in milliseconds; two seconds leave room for
# a loaded two-core machine, and a lost one is retried once before the association counts
# as unanswered.
TIMEOUT = 2.0
TRIES = 2


def receiver(family):
    s = socket.socket(family, socket.SOCK_RAW, IPPROTO_SCTP)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
    s.settimeout(TIMEOUT)
    return s


def receive(rx):
    """(source, destination, SCTP packet) of the next packet on `rx`: an IPv4 raw socket
    hands over the IP header, an IPv6 one only the payload (the destination comes from
    IPV6_PKTINFO)."""
    if rx.family == socket.AF_INET:
        data = rx.recv(65535)
        ip = IP(data)
        return ip.src, ip.dst, bytes(data[ip.ihl * 4 :])
    data, anc, _, addr = rx.recvmsg(65535, socket.CMSG_SPACE(20))
    dst = next(
        socket.inet_ntop(socket.AF_INET6, d[:16])
        for level, kind, d in anc
        if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_PKTINFO
    )
    return addr[0], dst, data


def family(addr):
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def sender(family):
    # IPPROTO_RAW: the IP header is ours (IP_HDRINCL), so a DSR backend answers from the VIP.
    return socket.socket(family, socket.SOCK_RAW, socket.IPPROTO_RAW)


def ip_header(src, dst):
    return IPv6(src=src, dst=dst) if ":" in dst else IP(src=src, dst=dst)


def send(out, pkt):
    out.sendto(bytes(pkt), (pkt.dst, 0))


def serve(name, port):
    rxs = [receiver(f) for f in (socket.AF_INET, socket.AF_INET6)]
    outs = {f: sender(f) for f in (socket.AF_INET, socket.AF_INET6)}
    # A whole number of 4-byte words: scapy leaves the padding of an odd-sized last
    # parameter out of the chunk length, which tshark flags as malformed.
    cookie = f"backend={name}".ljust(16).encode()
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select(rxs, [], [])
        for rx in ready:
            src, dst, raw = receive(rx)
            s = SCTP(raw)
            if s.dport != port:
                continue
            back = ip_header(dst, src) / SCTP(sport=s.dport, dport=s.sport)
            if SCTPChunkInit in s:
                init = s[SCTPChunkInit]
                back[SCTP].tag = init.init_tag
                back = back / SCTPChunkInitAck(
                    init_tag=init.init_tag ^ 0x5A5A5A5A,
                    a_rwnd=106496,
                    n_out_streams=1,
                    n_in_streams=1,
                    init_tsn=1,
                    params=[SCTPChunkParamStateCookie(cookie=cookie)],
                )
            elif SCTPChunkData in s:
                back[SCTP].tag = s.tag ^ 0x5A5A5A5A
                back = (
                    back
                    / SCTPChunkSACK(cumul_tsn_ack=s[SCTPChunkData].tsn, a_rwnd=106496)
                    / SCTPChunkData(
                        tsn=1, beginning=1, ending=1, stream_id=0, proto_id=0, data=cookie
                    )
                )
            else:
                continue
            send(outs[rx.family], back)


def answer(rx, vip, port, sport, tag):
    """The backend named by the next valid answer to `sport`, or None after TIMEOUT."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            src, _, raw = receive(rx)
        except socket.timeout:
            return None
        s = SCTP(raw)
        if src != vip or s.sport != port or s.dport != sport or s.tag != tag:
            continue
        if crc32c(raw[:8] + b"\0\0\0\0" + raw[12:]) != int.from_bytes(raw[8:12], "big"):
            print(f"bad CRC32c from {src}:{s.sport} to {sport}", flush=True)
            continue
        if SCTPChunkInitAck in s:
            for p in s[SCTPChunkInitAck].params:
                if isinstance(p, SCTPChunkParamStateCookie):
                    return p.cookie.decode().strip()
        if SCTPChunkData in s:
            return s[SCTPChunkData].data.decode().strip()
    return None


def packets(src, vip, port, sport, n_data):
    """The association's packets: its INIT, then DATA packets, with its tags."""
    tag = 0x10000 + sport
    init = ip_header(src, vip) / SCTP(sport=sport, dport=port, tag=0) / SCTPChunkInit(
        init_tag=tag, a_rwnd=106496, n_out_streams=1, n_in_streams=1, init_tsn=tag
    )
    peer = tag ^ 0x5A5A5A5A
    data = [
        ip_header(src, vip)
        / SCTP(sport=sport, dport=port, tag=peer)
        / SCTPChunkData(
            tsn=tag + i,
            beginning=1,
            ending=1,
            stream_id=0,
            proto_id=0,
            data=f"data {i} from {sport}".encode(),
        )
        for i in range(1, n_data + 1)
    ]
    return tag, init, data


def assoc(src, vip, port, first, n, n_data, with_init=True):
    rx, out = receiver(family(vip)), sender(family(vip))
    answered = sent = 0
    for sport in range(first, first + n):
        tag, init, data = packets(src, vip, port, sport, n_data)
        seen, answers = [], 0
        # The INIT ACK carries our tag; the SACKs our peer's view of it, the same here.
        for pkt in ([init] if with_init else []) + data:
            for _ in range(TRIES):
                send(out, pkt)
                sent += 1
                who = answer(rx, vip, port, sport, tag)
                if who is not None:
                    answers += 1
                    who = who.removeprefix("backend=")
                    if who not in seen:
                        seen.append(who)
                    break
        if answers == int(with_init) + n_data:
            answered += 1
        print(f"sport={sport} backend={','.join(seen) or '-'} answers={answers}", flush=True)
    print(f"sent={n} answered={answered} packets={sent}", flush=True)


def send_only(src, vip, port, first, n, n_data, corrupt=False):
    out = sender(family(vip))
    sent = 0
    for sport in range(first, first + n):
        _, init, data = packets(src, vip, port, sport, n_data)
        for pkt in [init] + data:
            if corrupt:
                good = SCTP(bytes(pkt[SCTP])).chksum
                pkt[SCTP].chksum = good ^ 1
            send(out, pkt)
            sent += 1
    print(f"sent={sent}", flush=True)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
    elif cmd in ("assoc", "data", "send", "corrupt"):
        src, vip = sys.argv[2], sys.argv[3]
        port, first, n, n_data = map(int, sys.argv[4:8])
        if cmd in ("assoc", "data"):
            assoc(src, vip, port, first, n, n_data, with_init=cmd == "assoc")
        else:
            send_only(src, vip, port, first, n, n_data, corrupt=cmd == "corrupt")
    else:
        sys.exit(f"unknown command {cmd}")
