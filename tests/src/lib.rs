//! Shared helpers for Strait's cross-crate tests: a table built from TOML, packet builders
//! (etherparse, an independent implementation), a runner that gives frames the headroom an
//! AF_XDP UMEM frame has, and an independent checksum verifier.

use std::net::IpAddr;

use etherparse::{
    IpHeaders, NetSlice, PacketBuilder, PacketBuilderStep, SlicedPacket, TransportSlice,
};
use strait_config::model::MacAddr;
use strait_dataplane::flow::Timeouts;
use strait_dataplane::pipeline::{Pipeline, Verdict};
use strait_dataplane::rewrite::{Frame, HEADROOM};
use strait_dataplane::table::{Builder, Port, ServiceTable};

/// A configuration with a service for every mode and edge case the pipeline tests need:
/// dsr-l2 (4 backends), dsr-ipip, dsr-gue, nat (TCP and UDP on one VIP), source ranges,
/// ClientIP affinity, IPv6 nat and IPv6-in-IPv6, and SCTP in every mode (dsr-l2 in both
/// families, dsr-ipip, dsr-gue, nat in both families). Shared by the behaviour, fixture and
/// allocation tests.
pub const ALL_MODES: &str = r#"
[gateway]
tunnel_source_v4 = "192.0.2.1"
tunnel_source_v6 = "2001:db8::1"
[[gateway.interfaces]]
name = "veth-gw"
queues = [0]

[[services]]
name = "l2"
vip = "203.0.113.10"
port = 80
mode = "dsr-l2"
maglev_table_size = 251
backends = [
  { address = "198.51.100.11", port = 80, mac = "02:00:00:00:01:11" },
  { address = "198.51.100.12", port = 80, mac = "02:00:00:00:01:12" },
  { address = "198.51.100.13", port = 80, mac = "02:00:00:00:01:13" },
  { address = "198.51.100.14", port = 80, mac = "02:00:00:00:01:14" },
]

[[services]]
name = "ipip"
vip = "203.0.113.11"
port = 80
mode = "dsr-ipip"
maglev_table_size = 251
backends = [{ address = "198.51.100.11", port = 80, mac = "02:00:00:00:01:11" }]

[[services]]
name = "gue"
vip = "203.0.113.12"
port = 80
mode = "dsr-gue"
maglev_table_size = 251
backends = [{ address = "198.51.100.12", port = 80, mac = "02:00:00:00:01:12" }]

[[services]]
name = "nat"
vip = "203.0.113.13"
port = 80
mode = "nat"
maglev_table_size = 251
backends = [
  { address = "198.51.100.21", port = 8080, mac = "02:00:00:00:01:21" },
  { address = "198.51.100.22", port = 8080, mac = "02:00:00:00:01:22" },
]

[[services]]
name = "dns"
vip = "203.0.113.13"
port = 53
protocol = "udp"
mode = "nat"
maglev_table_size = 251
backends = [{ address = "198.51.100.21", port = 5353, mac = "02:00:00:00:01:21" }]

[[services]]
name = "acl"
vip = "203.0.113.14"
port = 443
mode = "dsr-l2"
maglev_table_size = 251
source_ranges = ["192.0.2.0/25"]
backends = [{ address = "198.51.100.11", port = 443, mac = "02:00:00:00:01:11" }]

[[services]]
name = "sticky"
vip = "203.0.113.15"
port = 80
mode = "dsr-l2"
maglev_table_size = 251
session_affinity = { timeout = "60s" }
backends = [
  { address = "198.51.100.11", port = 80, mac = "02:00:00:00:01:11" },
  { address = "198.51.100.12", port = 80, mac = "02:00:00:00:01:12" },
  { address = "198.51.100.13", port = 80, mac = "02:00:00:00:01:13" },
]

[[services]]
name = "v6"
vip = "2001:db8::10"
port = 80
mode = "nat"
maglev_table_size = 251
backends = [{ address = "2001:db8:1::21", port = 8080, mac = "02:00:00:00:01:21" }]

[[services]]
name = "v6-ipip"
vip = "2001:db8::11"
port = 80
mode = "dsr-ipip"
maglev_table_size = 251
backends = [{ address = "2001:db8:1::11", port = 80, mac = "02:00:00:00:01:11" }]

[[services]]
name = "sctp-l2"
vip = "203.0.113.30"
port = 7777
protocol = "sctp"
mode = "dsr-l2"
maglev_table_size = 251
backends = [
  { address = "198.51.100.11", port = 7777, mac = "02:00:00:00:01:11" },
  { address = "198.51.100.12", port = 7777, mac = "02:00:00:00:01:12" },
]

[[services]]
name = "sctp-v6-l2"
vip = "2001:db8::30"
port = 7777
protocol = "sctp"
mode = "dsr-l2"
maglev_table_size = 251
backends = [{ address = "2001:db8:1::11", port = 7777, mac = "02:00:00:00:01:11" }]

[[services]]
name = "sctp-ipip"
vip = "203.0.113.31"
port = 7777
protocol = "sctp"
mode = "dsr-ipip"
maglev_table_size = 251
backends = [{ address = "198.51.100.11", port = 7777, mac = "02:00:00:00:01:11" }]

[[services]]
name = "sctp-gue"
vip = "203.0.113.32"
port = 7777
protocol = "sctp"
mode = "dsr-gue"
maglev_table_size = 251
backends = [{ address = "198.51.100.12", port = 7777, mac = "02:00:00:00:01:12" }]

[[services]]
name = "sctp-nat"
vip = "203.0.113.33"
port = 7777
protocol = "sctp"
mode = "nat"
maglev_table_size = 251
backends = [{ address = "198.51.100.24", port = 17777, mac = "02:00:00:00:01:24" }]

[[services]]
name = "sctp-v6-nat"
vip = "2001:db8::33"
port = 7777
protocol = "sctp"
mode = "nat"
maglev_table_size = 251
backends = [{ address = "2001:db8:1::24", port = 17777, mac = "02:00:00:00:01:24" }]
"#;

/// The gateway's MAC on every port in tests.
pub const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// The client's (or its router's) MAC.
pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xc1];
/// One second in the pipeline's clock unit.
pub const SEC: u64 = 1_000_000_000;

/// `toml` with every interface (each written `queues = [0]`) serving every VLAN, 1..=4094:
/// for inputs whose 802.1Q tags are drawn at random (property cases, fuzz seeds), which the
/// port would otherwise refuse before the rest of the pipeline sees them.
pub fn serving_every_vlan(toml: &str) -> String {
    let all: Vec<String> = (1..=4094).map(|v: u16| v.to_string()).collect();
    toml.replace(
        "queues = [0]\n",
        &format!("queues = [0]\nvlans = [{}]\n", all.join(", ")),
    )
}

/// Builds a snapshot from a configuration text, with `ports` interfaces of MTU `mtu`.
///
/// # Panics
/// If the text is not a valid configuration.
pub fn table(toml: &str, mtu: u16) -> ServiceTable {
    let cfg = strait_config::parse(toml).unwrap_or_else(|e| panic!("test config invalid:\n{e}"));
    let ports: Vec<Port> = cfg
        .gateway
        .interfaces
        .iter()
        .map(|_| Port::new(MacAddr(GW_MAC), mtu))
        .collect();
    Builder::new()
        .build(&cfg, &ports, |_, _, _| false)
        .expect("table builds")
}

/// A pipeline and a table, with a clock.
#[derive(Debug)]
pub struct Bed {
    /// The snapshot.
    pub table: ServiceTable,
    /// Core 0 of 1.
    pub pipe: Pipeline,
    /// The clock, in nanoseconds.
    pub now: u64,
}

impl Bed {
    /// A bed over a configuration text (MTU 1500, flow capacity 4096, no rate cap).
    pub fn new(toml: &str) -> Self {
        Self::with(toml, 1500, 1, 0)
    }

    /// A bed with explicit MTU, core count (this is core 0) and new-flow cap.
    pub fn with(toml: &str, mtu: u16, cores: u16, cap: u32) -> Self {
        let table = table(toml, mtu);
        let pipe = Pipeline::new(0, cores, 4096, Timeouts::default(), cap);
        Self {
            table,
            pipe,
            now: SEC,
        }
    }

    /// Runs a frame through the pipeline; returns the verdict and the frame as it is after.
    pub fn run(&mut self, frame: &[u8]) -> (Verdict, Vec<u8>) {
        run_with(&mut self.pipe, &self.table, self.now, frame)
    }

    /// Runs `frames` through the pipeline as one batch (`Pipeline::process_batch`), each in
    /// a buffer shaped as [`run_with`]'s; returns each frame's verdict and bytes after.
    pub fn run_batch(&mut self, frames: &[Vec<u8>]) -> Vec<(Verdict, Vec<u8>)> {
        let mut bufs: Vec<Vec<u8>> = frames
            .iter()
            .map(|f| {
                let mut b = vec![0u8; HEADROOM + f.len() + 2048];
                b[HEADROOM..HEADROOM + f.len()].copy_from_slice(f);
                b
            })
            .collect();
        let mut views: Vec<Frame<'_>> = bufs
            .iter_mut()
            .zip(frames)
            .map(|(b, f)| Frame::new(b, HEADROOM, f.len()))
            .collect();
        let mut verdicts = vec![Verdict::Pass; views.len()];
        self.pipe
            .process_batch(&self.table, self.now, 0, &mut views, &mut verdicts);
        verdicts
            .into_iter()
            .zip(&views)
            .map(|(v, f)| (v, f.data().to_vec()))
            .collect()
    }
}

/// Runs a frame through a pipeline in a buffer with [`HEADROOM`] in front and 2 KiB behind,
/// as a UMEM frame has.
pub fn run_with(
    pipe: &mut Pipeline,
    table: &ServiceTable,
    now: u64,
    frame: &[u8],
) -> (Verdict, Vec<u8>) {
    let mut buf = vec![0u8; HEADROOM + frame.len() + 2048];
    buf[HEADROOM..HEADROOM + frame.len()].copy_from_slice(frame);
    let mut f = Frame::new(&mut buf, HEADROOM, frame.len());
    let v = pipe.process(table, now, 0, &mut f);
    (v, f.data().to_vec())
}

fn ip(a: &str) -> IpAddr {
    a.parse().expect("test address")
}

/// The Ethernet ([`CLIENT_MAC`] to [`GW_MAC`]) and IP (TTL or hop limit 64) layers of a
/// test frame from `src` to `dst`, the transport left to the caller: every builder below
/// starts here.
///
/// # Panics
/// If the addresses are of different families.
fn ip_layers(src: &str, dst: &str) -> PacketBuilderStep<IpHeaders> {
    let b = PacketBuilder::ethernet2(CLIENT_MAC, GW_MAC);
    match (ip(src), ip(dst)) {
        (IpAddr::V4(s), IpAddr::V4(d)) => b.ipv4(s.octets(), d.octets(), 64),
        (IpAddr::V6(s), IpAddr::V6(d)) => b.ipv6(s.octets(), d.octets(), 64),
        _ => panic!("mixed families"),
    }
}

/// A TCP segment from `src:sport` to `dst:dport` in an Ethernet frame from [`CLIENT_MAC`] to
/// [`GW_MAC`]. `flags`: a string of `S`, `A`, `F`, `R`, `P`.
pub fn tcp(src: &str, sport: u16, dst: &str, dport: u16, flags: &str, payload: &[u8]) -> Vec<u8> {
    let mut t = ip_layers(src, dst).tcp(sport, dport, 1000, 65535);
    for c in flags.chars() {
        t = match c {
            'S' => t.syn(),
            'A' => t.ack(1),
            'F' => t.fin(),
            'R' => t.rst(),
            'P' => t.psh(),
            _ => panic!("flag {c}"),
        };
    }
    let mut out = Vec::new();
    t.write(&mut out, payload).expect("build tcp");
    out
}

/// A UDP datagram from `src:sport` to `dst:dport`, like [`tcp`].
pub fn udp(src: &str, sport: u16, dst: &str, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    ip_layers(src, dst)
        .udp(sport, dport)
        .write(&mut out, payload)
        .expect("build udp");
    out
}

/// An SCTP packet from `src:sport` to `dst:dport` with verification tag `vtag` and the
/// given chunks (see [`sctp_chunk`]), in a frame like [`tcp`]'s; its CRC32c (RFC 9260
/// appendix A, stored least significant byte first) is computed here.
pub fn sctp(src: &str, sport: u16, dst: &str, dport: u16, vtag: u32, chunks: &[u8]) -> Vec<u8> {
    let mut pkt = Vec::with_capacity(12 + chunks.len());
    pkt.extend_from_slice(&sport.to_be_bytes());
    pkt.extend_from_slice(&dport.to_be_bytes());
    pkt.extend_from_slice(&vtag.to_be_bytes());
    pkt.extend_from_slice(&[0; 4]);
    pkt.extend_from_slice(chunks);
    let crc = crc32c::crc32c(&pkt);
    pkt[8..12].copy_from_slice(&crc.to_le_bytes());
    let mut out = Vec::new();
    ip_layers(src, dst)
        .write(&mut out, etherparse::IpNumber::SCTP, &pkt)
        .expect("build sctp");
    out
}

/// One SCTP chunk (RFC 9260 section 3.2): type, flags, length, `value`, padded to 4 bytes.
pub fn sctp_chunk(kind: u8, flags: u8, value: &[u8]) -> Vec<u8> {
    let len = 4 + value.len();
    let mut c = vec![kind, flags];
    c.extend_from_slice(&(len as u16).to_be_bytes());
    c.extend_from_slice(value);
    c.resize(len.next_multiple_of(4), 0);
    c
}

/// An INIT chunk (RFC 9260 section 3.3.2) with initiate tag `tag`: a_rwnd 106496, 10
/// outbound and 65535 inbound streams, initial TSN `tag`, no parameters.
pub fn sctp_init(tag: u32) -> Vec<u8> {
    sctp_chunk(1, 0, &sctp_init_fields(tag, 65_535))
}

/// The fixed fields INIT and INIT ACK share (RFC 9260 sections 3.3.2 and 3.3.3): initiate
/// tag `tag`, a_rwnd 106496, 10 outbound and `inbound` inbound streams, initial TSN `tag`.
fn sctp_init_fields(tag: u32, inbound: u16) -> Vec<u8> {
    let mut v = tag.to_be_bytes().to_vec();
    v.extend_from_slice(&106_496u32.to_be_bytes());
    v.extend_from_slice(&10u16.to_be_bytes());
    v.extend_from_slice(&inbound.to_be_bytes());
    v.extend_from_slice(&tag.to_be_bytes());
    v
}

/// An INIT ACK chunk (section 3.3.3) with initiate tag `tag` and a state cookie.
pub fn sctp_init_ack(tag: u32, cookie: &[u8]) -> Vec<u8> {
    let mut v = sctp_init_fields(tag, 10);
    // State Cookie parameter (type 7).
    v.extend_from_slice(&7u16.to_be_bytes());
    v.extend_from_slice(&((4 + cookie.len()) as u16).to_be_bytes());
    v.extend_from_slice(cookie);
    sctp_chunk(2, 0, &v)
}

/// A DATA chunk (section 3.3.1), unfragmented (B and E flags), stream 0, PPID 0.
pub fn sctp_data(tsn: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = tsn.to_be_bytes().to_vec();
    v.extend_from_slice(&[0, 0, 0, 0]); // stream 0, sequence 0
    v.extend_from_slice(&[0, 0, 0, 0]); // payload protocol identifier
    v.extend_from_slice(payload);
    sctp_chunk(0, 0x03, &v)
}

/// The frame as a Linux sender whose device offloads checksums hands it to the gateway
/// (`CHECKSUM_PARTIAL` on a veth or a tap): its TCP/UDP checksum field holds the folded
/// pseudo-header sum, not complemented, of the whole IP payload; an SCTP packet's CRC32c
/// field holds zero (`CHECKSUM_PARTIAL` with `csum_not_inet`). The IP layer is found by
/// etherparse, the sum done here; a frame without an unfragmented TCP/UDP/SCTP segment is
/// returned unchanged.
///
/// # Panics
/// If etherparse cannot slice the frame.
pub fn offload(frame: &[u8]) -> Vec<u8> {
    let s = SlicedPacket::from_ethernet(frame).expect("a frame etherparse reads");
    let (src, dst, proto, seg) = match &s.net {
        Some(NetSlice::Ipv4(v4)) if !v4.payload().fragmented => {
            let h = v4.header();
            (
                h.source().to_vec(),
                h.destination().to_vec(),
                h.protocol().0,
                v4.payload().payload,
            )
        }
        Some(NetSlice::Ipv6(v6)) if !v6.payload().fragmented => {
            let h = v6.header();
            (
                h.source().to_vec(),
                h.destination().to_vec(),
                v6.payload().ip_number.0,
                v6.payload().payload,
            )
        }
        _ => return frame.to_vec(),
    };
    let field = match proto {
        6 => 16,
        17 => 6,
        132 => {
            let at = seg.as_ptr() as usize - frame.as_ptr() as usize + 8;
            let mut out = frame.to_vec();
            out[at..at + 4].copy_from_slice(&[0; 4]);
            return out;
        }
        _ => return frame.to_vec(),
    };
    let at = seg.as_ptr() as usize - frame.as_ptr() as usize + field;
    let pseudo = fold(sum(&src) + sum(&dst) + proto as u32 + seg.len() as u32);
    let mut out = frame.to_vec();
    out[at..at + 2].copy_from_slice(&pseudo.to_be_bytes());
    out
}

/// Checks every checksum in a frame with etherparse (an independent parser) and a plain
/// RFC 1071 sum: IPv4 header, TCP/UDP (pseudo-header included), ICMP/ICMPv6, SCTP's CRC32c
/// (the `crc32c` crate over the packet with the field zeroed), recursively into IP-in-IP and
/// GUE (UDP) encapsulation. Returns a description of the first problem.
///
/// # Errors
/// A text naming the bad layer.
pub fn verify(frame: &[u8]) -> Result<(), String> {
    let s = SlicedPacket::from_ethernet(frame).map_err(|e| format!("parse: {e}"))?;
    verify_net(&s.net, &s.transport)
}

fn sum(data: &[u8]) -> u32 {
    let mut acc = 0u32;
    for c in data.chunks(2) {
        acc += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
    }
    acc
}

fn fold(mut a: u32) -> u16 {
    while a >> 16 != 0 {
        a = (a & 0xffff) + (a >> 16);
    }
    a as u16
}

fn verify_net(
    net: &Option<NetSlice<'_>>,
    transport: &Option<TransportSlice<'_>>,
) -> Result<(), String> {
    let (src, dst, proto, l4): (Vec<u8>, Vec<u8>, u8, &[u8]) = match net {
        Some(NetSlice::Ipv4(v4)) => {
            let h = v4.header();
            if fold(sum(h.slice())) != 0xffff {
                return Err("ipv4 header checksum".into());
            }
            if v4.payload().fragmented {
                return Ok(());
            }
            (
                h.source().to_vec(),
                h.destination().to_vec(),
                h.protocol().0,
                v4.payload().payload,
            )
        }
        Some(NetSlice::Ipv6(v6)) => {
            let h = v6.header();
            if v6.payload().fragmented {
                return Ok(());
            }
            (
                h.source().to_vec(),
                h.destination().to_vec(),
                v6.payload().ip_number.0,
                v6.payload().payload,
            )
        }
        _ => return Err("no ip layer".into()),
    };
    let pseudo = sum(&src) + sum(&dst) + proto as u32 + l4.len() as u32;
    match proto {
        6 if fold(pseudo + sum(l4)) != 0xffff => return Err("tcp checksum".into()),
        17 => {
            let zero_ok = src.len() == 4 && l4.len() >= 8 && l4[6..8] == [0, 0];
            if !zero_ok && fold(pseudo + sum(l4)) != 0xffff {
                return Err("udp checksum".into());
            }
            // GUE variant 1: the payload is an IP packet.
            if l4.len() > 8 && matches!(l4[8] >> 4, 4 | 6) && transport.is_some() {
                return verify_inner(&l4[8..]);
            }
        }
        1 if fold(sum(l4)) != 0xffff => return Err("icmp checksum".into()),
        58 if fold(pseudo + sum(l4)) != 0xffff => return Err("icmpv6 checksum".into()),
        132 => {
            if l4.len() < 12 {
                return Err("sctp header".into());
            }
            let mut zeroed = l4.to_vec();
            zeroed[8..12].copy_from_slice(&[0; 4]);
            if crc32c::crc32c(&zeroed).to_le_bytes() != l4[8..12] {
                return Err("sctp checksum".into());
            }
        }
        4 | 41 => return verify_inner(l4),
        _ => {}
    }
    Ok(())
}

fn verify_inner(ip: &[u8]) -> Result<(), String> {
    let s = SlicedPacket::from_ip(ip).map_err(|e| format!("inner parse: {e}"))?;
    verify_net(&s.net, &s.transport).map_err(|e| format!("inner {e}"))
}
