//! Truncation and corruption sweeps over every golden fixture's input.
//!
//! Each variant runs through a fresh pipeline (with the fixture's setup frames first), so
//! one variant cannot disturb the next. For every variant: no panic, and the counters stay
//! balanced (every frame has exactly one outcome). Beyond that, what can honestly be
//! asserted:
//!
//! * **Prefixes** (lengths `0..=len`). A prefix that cuts the IP packet is dropped as
//!   `eth_truncated` / `ip_truncated` (for a well-formed input; a malformed one is dropped
//!   for some reason): it is never sent nor given to the kernel. A prefix that keeps the
//!   whole IP packet and only loses link padding gets the input's verdict, and if it is
//!   sent, its output is the input's output without that padding. A frame the port refuses
//!   (or leaves to the kernel) on its link header alone keeps its verdict once that header
//!   is whole.
//! * **Single-byte corruptions** (every offset, xor `0xff`). A corruption may turn the
//!   packet into anything, so the verdict is free; but a frame that is not sent comes back
//!   untouched, and a frame that is sent must be one of the pipeline's rewrites of exactly
//!   that input:
//!   - dsr-l2: only the MACs change; the IP packet is byte-for-byte the input's.
//!   - encapsulation: the input's IP packet, untouched, behind a fresh outer header whose
//!     own fields and checksums (IPv4 header, UDP over IPv6) are right.
//!   - ICMP too-big answer: fully valid (its checksum is computed over what it quotes), and
//!     it quotes the start of the input's IP packet.
//!   - in-place rewrite (nat, nat replies, nat of ICMP errors): bytes change only in the
//!     headers, and every checksum keeps its residual. A checksum the corruption broke
//!     stays broken by exactly as much, one it did not break stays valid: incremental
//!     updates (RFC 1624) neither repair nor damage what they do not own.
//!
//!   And whenever the corrupted input's checksums all hold (`strait_tests::verify`), the
//!   output's must too.
//!
//!   An input whose TCP/UDP checksum field holds its pseudo-header sum (left to offload by
//!   its sender, or made so by the corruption; for SCTP, a zero CRC32c) is judged as the
//!   same input with that checksum completed: the gateway completes it before or while
//!   rewriting. SCTP's CRC32c, which nat recomputes, keeps its residual too: nat drops a
//!   packet whose CRC does not verify, so it never repairs one.
//!
//! The residuals are computed by a walker written here, independent of the dataplane's
//! parser.

// Each test binary uses its own part of the shared module.
#[allow(dead_code)]
mod common;

use common::fixtures_list::{all, Fixture, CONFIG};
use strait_dataplane::flow::Timeouts;
use strait_dataplane::pipeline::{Pipeline, Verdict};
use strait_dataplane::stats::DropReason;
use strait_dataplane::table::ServiceTable;
use strait_tests::{run_with, table, verify, GW_MAC, SEC};

/// Flow-table capacity of the sweep's pipelines: enough for any setup, small so that a
/// fresh pipeline per variant stays cheap.
const SWEEP_FLOWS: usize = 64;

/// A fixture prepared for sweeping.
struct Sweep<'a> {
    f: &'a Fixture,
    table: &'a ServiceTable,
    /// The verdict and output of the unmodified input.
    verdict: Verdict,
    out: Vec<u8>,
}

impl Sweep<'_> {
    /// Runs `frame` on a fresh pipeline after the setup frames.
    fn run(&self, frame: &[u8]) -> (Verdict, Vec<u8>) {
        let mut pipe = Pipeline::new(0, 1, SWEEP_FLOWS, Timeouts::default(), 0);
        for s in &self.f.setup {
            let (v, _) = run_with(&mut pipe, self.table, SEC, s);
            assert!(matches!(v, Verdict::Tx { .. }), "{}: setup", self.f.name);
        }
        let (v, out) = run_with(&mut pipe, self.table, SEC, frame);
        assert!(
            pipe.counters.balanced(),
            "{}: counters unbalanced after {:02x?}: {:?}",
            self.f.name,
            frame,
            pipe.counters
        );
        (v, out)
    }
}

fn sweeps<'a>(fixtures: &'a [Fixture], table: &'a ServiceTable) -> Vec<Sweep<'a>> {
    fixtures
        .iter()
        .map(|f| {
            let mut s = Sweep {
                f,
                table,
                verdict: Verdict::Pass,
                out: Vec::new(),
            };
            (s.verdict, s.out) = s.run(&f.input);
            s
        })
        .collect()
}

/// Whether the port decides on `f`'s input from its Ethernet header and tag alone.
fn refused_by_port(f: &Fixture) -> bool {
    f.input[0] & 1 != 0
        || matches!(
            f.verdict,
            Verdict::Drop(DropReason::OtherHost | DropReason::VlanNotServed)
        )
}

#[test]
fn every_prefix_of_every_fixture() {
    let fixtures = all();
    let table = table(&CONFIG, 1500);
    let mut runs = 0;
    for s in sweeps(&fixtures, &table) {
        let input = &s.f.input;
        let ip_end = ip_end(input);
        for len in 0..=input.len() {
            let (v, out) = s.run(&input[..len]);
            runs += 1;
            let ctx = || format!("{} cut to {len} of {} bytes", s.f.name, input.len());
            match ip_end {
                // Refused by the port, or left to the kernel, on its link header alone
                // (another host's MAC, a VLAN not served, broadcast or multicast): once that
                // header is whole, every cut keeps the verdict.
                _ if refused_by_port(s.f) && len >= l2_len(input) => {
                    assert_eq!(v, s.verdict, "{}", ctx());
                }
                // Less than a malformed frame: still dropped, for whichever reason comes first.
                _ if !s.f.input_is_wellformed() && len < input.len() => {
                    assert!(matches!(v, Verdict::Drop(_)), "{}: {v:?}", ctx());
                }
                Some(end) if len < end => {
                    let want = if len < l2_len(input) {
                        DropReason::EthTruncated
                    } else {
                        DropReason::IpTruncated
                    };
                    assert_eq!(v, Verdict::Drop(want), "{}", ctx());
                }
                _ if len < 14 => {
                    assert_eq!(v, Verdict::Drop(DropReason::EthTruncated), "{}", ctx())
                }
                // The whole IP packet (or a whole non-IP frame) is there: only link padding
                // was cut.
                _ => {
                    assert_eq!(v, s.verdict, "{}", ctx());
                    if matches!(v, Verdict::Tx { .. }) {
                        assert!(
                            s.out.starts_with(&out),
                            "{}: output is not the full input's output less padding",
                            ctx()
                        );
                    }
                }
            }
            if !matches!(v, Verdict::Tx { .. }) {
                assert_eq!(out, &input[..len], "{}: {v:?} but modified", ctx());
            }
        }
    }
    eprintln!("{runs} prefixes swept");
}

#[test]
fn every_single_byte_corruption_of_every_fixture() {
    let fixtures = all();
    let table = table(&CONFIG, 1500);
    let mut runs = 0;
    let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
    let mut problems = Vec::new();
    for s in sweeps(&fixtures, &table) {
        for at in 0..s.f.input.len() {
            let mut c = s.f.input.clone();
            c[at] ^= 0xff;
            let (v, out) = s.run(&c);
            runs += 1;
            let ctx = format!("{} with byte {at} xor 0xff", s.f.name);
            if !matches!(v, Verdict::Tx { .. }) {
                if out != c {
                    problems.push(format!("{ctx}: {v:?} but modified"));
                }
                continue;
            }
            match check_sent(&c, &out) {
                Ok(kind) => *kinds.entry(kind).or_default() += 1,
                Err(e) => problems.push(format!(
                    "{ctx}: {e}\n  in:  {}\n  out: {}",
                    hex(&c),
                    hex(&out)
                )),
            }
            if verify(&c).is_ok() {
                if let Err(e) = verify(&out) {
                    problems.push(format!(
                        "{ctx}: valid input, output fails verify: {e}\n  in:  {}\n  out: {}",
                        hex(&c),
                        hex(&out)
                    ));
                }
            }
        }
    }
    eprintln!("{runs} corruptions swept; sent, by kind of rewrite: {kinds:?}");
    assert!(
        problems.is_empty(),
        "{} problems, first ones:\n{}",
        problems.len(),
        problems[..problems.len().min(10)].join("\n")
    );
    // The sweep exercises every kind of rewrite, or it checks less than it claims.
    for k in ["l2", "encap", "too_big", "in_place"] {
        assert!(kinds.contains_key(k), "no corrupted frame was sent as {k}");
    }
}

#[test]
fn the_sent_frame_checks_catch_broken_rewrites() {
    let fixtures = all();
    let table = table(&CONFIG, 1500);
    let sw = sweeps(&fixtures, &table);
    let get = |name: &str| {
        let s = sw.iter().find(|s| s.f.name == name).expect("fixture");
        (s.f.input.clone(), s.out.clone())
    };
    // Each golden output passes; each damaged one (last byte of the headers the rewrite
    // owns, a payload byte, a checksum) is caught.
    let cases: &[(&str, &str, &[usize])] = &[
        ("dsr_l2_v4", "l2", &[20, 53]),
        ("dsr_ipip_v4_in_v4", "encap", &[25, 24, 40]),
        ("dsr_gue_v6_in_v6", "encap", &[14 + 40 + 6, 70, 120]),
        ("too_big_icmp_v4", "too_big", &[36, 100, 589]),
        ("nat_forward_tcp_v4", "in_place", &[24, 50, 53]),
        ("nat_reply_udp_v4", "in_place", &[40, 60]),
        ("icmp_frag_needed_nat", "in_place", &[36, 44, 55]),
        ("icmpv6_packet_too_big_nat", "in_place", &[56, 70]),
    ];
    for (name, kind, damage) in cases {
        let (inp, out) = get(name);
        assert_eq!(check_sent(&inp, &out), Ok(*kind), "{name}");
        for &at in *damage {
            let mut bad = out.clone();
            bad[at] ^= 0x01;
            assert!(
                check_sent(&inp, &bad).is_err(),
                "{name}: damage at byte {at} not caught"
            );
        }
    }
}

/// Hex of the first 96 bytes, enough to see every header.
fn hex(b: &[u8]) -> String {
    let s: String = b.iter().take(96).map(|b| format!("{b:02x}")).collect();
    if b.len() > 96 {
        format!("{s}... ({} bytes)", b.len())
    } else {
        s
    }
}

// ---- an independent reading of frames ---------------------------------------------------

fn be16(b: &[u8], at: usize) -> usize {
    u16::from_be_bytes([b[at], b[at + 1]]) as usize
}

/// Length of the Ethernet header, an 802.1Q tag included.
fn l2_len(f: &[u8]) -> usize {
    if f.len() >= 14 && be16(f, 12) == 0x8100 {
        18
    } else {
        14
    }
}

/// The ethertype after any tag.
fn ethertype(f: &[u8]) -> Option<usize> {
    let l2 = l2_len(f);
    (f.len() >= l2).then(|| be16(f, l2 - 2))
}

/// Where the IP packet of an IP frame ends, by its own length field.
fn ip_end(f: &[u8]) -> Option<usize> {
    let l2 = l2_len(f);
    match ethertype(f)? {
        0x0800 if f.len() >= l2 + 4 => Some(l2 + be16(f, l2 + 2)),
        0x86dd if f.len() >= l2 + 6 => Some(l2 + 40 + be16(f, l2 + 4)),
        0x0800 | 0x86dd => Some(usize::MAX),
        _ => None,
    }
}

/// RFC 1071 sum, folded.
fn fold(data: &[u8], mut acc: u64) -> u32 {
    for c in data.chunks(2) {
        acc += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u64;
    }
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u32
}

/// How far a sum is from a valid checksum, modulo 0xffff (ones' complement has two zeros).
fn residual(sum: u32) -> u32 {
    sum % 0xffff
}

/// What the walker read from one frame.
#[derive(Debug, PartialEq)]
struct Walk {
    /// Residuals of every checksum present, in order; `u32::MAX` for "no checksum" (a zero
    /// UDP checksum over IPv4).
    residuals: Vec<u32>,
    /// First byte an in-place rewrite may not change: the end of the headers it rewrites.
    limit: usize,
}

fn pseudo(src: &[u8], dst: &[u8], proto: u8, len: usize) -> u64 {
    let mut b = src.to_vec();
    b.extend_from_slice(dst);
    b.extend_from_slice(&[0, proto]);
    b.extend_from_slice(&(len as u32).to_be_bytes());
    fold(&b, 0) as u64
}

/// Reads the checksums of an IP frame. `None` when the frame cannot be read that far.
fn walk(f: &[u8]) -> Option<Walk> {
    let l3 = l2_len(f);
    let end = ip_end(f)?;
    let ip = f.get(l3..end)?;
    let mut residuals = Vec::new();
    // `later`: a non-first fragment, whose payload is opaque.
    let (src, dst, mut proto, mut l4, mut later);
    match ip[0] >> 4 {
        4 => {
            let hl = (ip[0] & 0x0f) as usize * 4;
            if hl < 20 || ip.len() < hl {
                return None;
            }
            residuals.push(residual(fold(&ip[..hl], 0)));
            (src, dst, proto, l4) = (&ip[12..16], &ip[16..20], ip[9], hl);
            let frag = be16(ip, 6);
            later = frag & 0x1fff != 0;
        }
        6 => {
            (src, dst, proto, l4) = (&ip[8..24], &ip[24..40], ip[6], 40);
            later = false;
            for _ in 0..=8 {
                match proto {
                    0 | 43 | 60 | 51 => {
                        let h = ip.get(l4..l4 + 2)?;
                        let len = if proto == 51 {
                            (h[1] as usize + 2) * 4
                        } else {
                            (h[1] as usize + 1) * 8
                        };
                        proto = h[0];
                        l4 += len;
                    }
                    44 => {
                        let h = ip.get(l4..l4 + 8)?;
                        let off = be16(h, 2);
                        later = off & 0xfff8 != 0;
                        proto = h[0];
                        l4 += 8;
                    }
                    _ => break,
                }
            }
        }
        _ => return None,
    }
    let seg = ip.get(l4..)?;
    let v6 = ip[0] >> 4 == 6;
    let at = l3 + l4;
    if later {
        // Opaque data: no transport header, and only the IP header is rewritten.
        return Some(Walk {
            residuals,
            limit: at,
        });
    }
    let limit = match proto {
        6 => {
            // The checksum may lie beyond a short first fragment; then there is none here.
            if seg.len() >= 18 {
                let s = pseudo(src, dst, 6, seg.len());
                residuals.push(residual(fold(seg, s)));
            }
            at + 18
        }
        17 => {
            if seg.len() >= 8 {
                if !v6 && be16(seg, 6) == 0 {
                    residuals.push(u32::MAX);
                } else {
                    residuals.push(residual(fold(seg, pseudo(src, dst, 17, seg.len()))));
                }
            }
            at + 8
        }
        132 => {
            // SCTP's CRC32c covers the packet, no pseudo-header: its residual is the
            // difference between the field and the CRC of the packet as it stands.
            if seg.len() >= 12 {
                residuals
                    .push(sctp_crc(seg) ^ u32::from_le_bytes([seg[8], seg[9], seg[10], seg[11]]));
            }
            // Ports, verification tag and checksum.
            at + 12
        }
        1 | 58 if seg.len() >= 8 => {
            let s = if proto == 58 {
                pseudo(src, dst, 58, seg.len())
            } else {
                0
            };
            residuals.push(residual(fold(seg, s)));
            let error = if proto == 1 {
                matches!(seg[0], 3 | 11 | 12)
            } else {
                matches!(seg[0], 1..=4)
            };
            let q = &seg[8..];
            match q.first().map(|v| v >> 4) {
                Some(4) if error && q.len() >= 20 => {
                    let qhl = (q[0] & 0x0f) as usize * 4;
                    if qhl >= 20 && q.len() >= qhl {
                        residuals.push(residual(fold(&q[..qhl], 0)));
                    }
                    // Quoted ports and, when quoted, the quoted TCP/UDP checksum.
                    at + 8 + qhl + 18
                }
                Some(6) if error => at + 8 + 40 + 18,
                _ => at + 8,
            }
        }
        _ => at,
    };
    Some(Walk { residuals, limit })
}

/// The CRC32c of an SCTP packet (at least 12 bytes) with its checksum field taken as zero.
fn sctp_crc(seg: &[u8]) -> u32 {
    let mut z = seg.to_vec();
    z[8..12].copy_from_slice(&[0; 4]);
    crc32c::crc32c(&z)
}

/// `f` with its TCP/UDP checksum completed if the field holds only the pseudo-header sum
/// (an unfragmented segment, summed to the end of the IP packet), or its SCTP CRC32c if the
/// field is zero; otherwise `f` as it is.
fn completed(f: &[u8]) -> Vec<u8> {
    let mut o = f.to_vec();
    let l3 = l2_len(f);
    let Some(ip) = ip_end(f).and_then(|end| f.get(l3..end)) else {
        return o;
    };
    let (src, dst, mut proto, mut l4) = match ip.first().map(|v| v >> 4) {
        Some(4) if ip.len() >= 20 => {
            let hl = (ip[0] & 0x0f) as usize * 4;
            if be16(ip, 6) & 0x3fff != 0 {
                return o; // a fragment
            }
            (&ip[12..16], &ip[16..20], ip[9], hl)
        }
        Some(6) if ip.len() >= 40 => (&ip[8..24], &ip[24..40], ip[6], 40),
        _ => return o,
    };
    if ip[0] >> 4 == 6 {
        for _ in 0..=8 {
            match proto {
                0 | 43 | 60 | 51 => {
                    let Some(h) = ip.get(l4..l4 + 2) else {
                        return o;
                    };
                    l4 += if proto == 51 {
                        (h[1] as usize + 2) * 4
                    } else {
                        (h[1] as usize + 1) * 8
                    };
                    proto = h[0];
                }
                _ => break,
            }
        }
    }
    let field = match proto {
        6 => 16,
        17 => 6,
        132 => {
            // An SCTP CRC32c left to offload is a zero field.
            if let Some(seg) = ip.get(l4..).filter(|s| s.len() >= 12 && s[8..12] == [0; 4]) {
                let at = l3 + l4 + 8;
                o[at..at + 4].copy_from_slice(&sctp_crc(seg).to_le_bytes());
            }
            return o;
        }
        _ => return o,
    };
    let Some(seg) = ip.get(l4..).filter(|s| s.len() >= field + 2) else {
        return o;
    };
    let ps = pseudo(src, dst, proto, seg.len());
    if be16(seg, field) as u64 != ps {
        return o;
    }
    let at = l3 + l4 + field;
    o[at..at + 2].copy_from_slice(&[0, 0]);
    let mut c = !(fold(&o[l3 + l4..l3 + ip.len()], ps) as u16);
    if proto == 17 && c == 0 {
        c = 0xffff;
    }
    o[at..at + 2].copy_from_slice(&c.to_be_bytes());
    o
}

// ---- what a sent frame may be -----------------------------------------------------------

/// Checks that `out` is one of the pipeline's rewrites of `inp` (with a checksum left to
/// offload completed); names the rewrite.
fn check_sent(inp: &[u8], out: &[u8]) -> Result<&'static str, String> {
    let inp = &completed(inp)[..];
    let from_gateway = out.len() >= 14 && out[6..12] == GW_MAC;
    if !from_gateway {
        return Err("source MAC is not the gateway's".into());
    }
    // dsr-l2 (and a dsr ICMP error): the MACs only.
    if out.len() == inp.len() && out[12..] == inp[12..] {
        return Ok("l2");
    }
    let l2 = l2_len(inp);
    let end = ip_end(inp).ok_or("sent a frame that is not IP")?;
    let packet = inp.get(l2..end).ok_or("sent a truncated IP packet")?;
    if out.len() > packet.len() + l2
        && out.ends_with(packet)
        && [20, 28, 40, 48].contains(&(out.len() - packet.len() - l2))
    {
        check_outer(inp, out, l2, packet)?;
        return Ok("encap");
    }
    if let Some(q) = too_big_quote(inp, out, l2) {
        verify(out).map_err(|e| format!("too-big answer: {e}"))?;
        if !packet.starts_with(q) || q.is_empty() {
            return Err("too-big answer does not quote the input".into());
        }
        return Ok("too_big");
    }
    if out.len() == inp.len() {
        let (a, b) = (walk(inp), walk(out));
        let (Some(a), Some(b)) = (a, b) else {
            return Err("in-place rewrite the walker cannot read".into());
        };
        if a.residuals != b.residuals {
            return Err(format!(
                "checksum residuals changed: {:?} -> {:?}",
                a.residuals, b.residuals
            ));
        }
        if let Some(i) = (a.limit..inp.len()).find(|&i| inp[i] != out[i]) {
            return Err(format!(
                "in-place rewrite changed byte {i}, past the headers (limit {})",
                a.limit
            ));
        }
        return Ok("in_place");
    }
    Err("output is none of dsr-l2, encapsulation, too-big answer, in-place rewrite".into())
}

/// The outer header of an encapsulation of `packet`, in `out` after `l2` bytes of Ethernet.
fn check_outer(inp: &[u8], out: &[u8], l2: usize, packet: &[u8]) -> Result<(), String> {
    if out[12..l2 - 2] != inp[12..l2 - 2] {
        return Err("VLAN tag not kept".into());
    }
    let o = &out[l2..out.len() - packet.len()];
    let inner = match packet[0] >> 4 {
        4 => 4,
        6 => 41,
        v => return Err(format!("encapsulated IP version {v}")),
    };
    let (next, udp) = match (be16(out, l2 - 2), o.len()) {
        (0x0800, 20 | 28) => {
            if o[0] != 0x45 || fold(&o[..20], 0) != 0xffff {
                return Err("outer IPv4 header or its checksum".into());
            }
            if be16(o, 2) != out.len() - l2 || o[8] != 64 {
                return Err("outer IPv4 length or TTL".into());
            }
            (o[9], o.get(20..))
        }
        (0x86dd, 40 | 48) => {
            if o[0] >> 4 != 6 || be16(o, 4) != out.len() - l2 - 40 || o[7] != 64 {
                return Err("outer IPv6 version, length or hop limit".into());
            }
            if o.len() == 48 {
                let seg = &out[l2 + 40..];
                if be16(o, 46) == 0
                    || fold(seg, pseudo(&o[8..24], &o[24..40], 17, seg.len())) != 0xffff
                {
                    return Err("outer UDP checksum over IPv6".into());
                }
            }
            (o[6], o.get(40..))
        }
        (t, n) => return Err(format!("outer ethertype {t:#06x} with {n} header bytes")),
    };
    match udp.filter(|u| !u.is_empty()) {
        None if next == inner => Ok(()),
        Some(u) if next == 17 => {
            let ok = be16(u, 2) == 6080
                && be16(u, 4) == 8 + packet.len()
                && (o.len() == 48 || be16(u, 6) == 0);
            ok.then_some(()).ok_or_else(|| "GUE UDP header".into())
        }
        _ => Err(format!("outer protocol {next} for inner {inner}")),
    }
}

/// If `out` is an ICMP too-big answer to `inp` (from its destination, to its source), the
/// quoted bytes.
fn too_big_quote<'o>(inp: &[u8], out: &'o [u8], l2: usize) -> Option<&'o [u8]> {
    let (i, o) = (inp.get(l2..)?, out.get(l2..)?);
    match (i.first()? >> 4, o.first()? >> 4) {
        (4, 4) if i.len() >= 20 && o.len() >= 28 => {
            let answer = o[9] == 1 && o[20] == 3 && o[21] == 4;
            (answer && o[12..16] == i[16..20] && o[16..20] == i[12..16]).then(|| &o[28..])
        }
        (6, 6) if i.len() >= 40 && o.len() >= 48 => {
            let answer = o[6] == 58 && o[40] == 2;
            (answer && o[8..24] == i[24..40] && o[24..40] == i[8..24]).then(|| &o[48..])
        }
        _ => None,
    }
}
