//! Golden packet fixtures: packet in, verdict and packet out, byte for byte, and an
//! independent decoder's opinion of every frame.
//!
//! The table lives in `common/fixtures_list.rs` (shared with `truncation.rs`); each fixture
//! has a name, a one-sentence description, optional setup frames, an input frame and the
//! verdict it must get. Here the inputs and the frames the pipeline sends are compared with
//! `tests/fixtures/<name>.in.hex` and `<name>.out.hex` (a fixture that is not sent has no
//! `.out.hex`: its frame must come back untouched). The files are `od -Ax -tx1` style hex
//! dumps behind `#` comment lines, so `text2pcap` reads them as they are
//! (`tests/scripts/show-fixture.sh <name>` decodes one with tshark).
//!
//! # Regenerating the goldens
//!
//! A change in the pipeline's output fails the comparison with the first differing byte. If
//! the change is intended, rewrite the files deliberately and review the diff:
//!
//! ```text
//! STRAIT_BLESS=1 cargo test -p strait-tests --test fixtures
//! git diff tests/fixtures/
//! ```
//!
//! With `STRAIT_BLESS=1` the comparisons are skipped and every `.in.hex` / `.out.hex` is
//! written anew (the verdict is still checked, and stale files are still reported).
//!
//! # Independent decoding
//!
//! `tshark_decodes_every_fixture` writes every well-formed input and every output into a
//! pcap and has tshark dissect it with IPv4/TCP/UDP checksum validation on, SCTP's CRC32c
//! validated (ICMP and ICMPv6 checksums are always validated) and GUE's port decoded as IP. It fails on any malformed
//! packet, any expert info of error severity and any bad checksum, and checks decoded fields
//! of the interesting fixtures. The inputs of `offloaded` fixtures carry a TCP/UDP checksum
//! (or an SCTP CRC32c) their sender left to offload: both decoders must find exactly that checksum bad on the way
//! in, and every checksum good on the way out. `scapy_decodes_every_fixture` has scapy recompute every
//! checksum, GUE's inner packet included. Without tshark (or scapy) these tests fail unless
//! `STRAIT_SKIP_TSHARK=1` (or `STRAIT_SKIP_SCAPY=1`) is set, and then say loudly that they
//! skipped.
//!
//! # Known bugs
//!
//! A fixture with `bug: Some(..)` states behaviour the pipeline does not have yet. It has no
//! checks it (`cargo test -p strait-tests --test fixtures -- --ignored`). Fix the bug, drop
//! the `bug`, bless, and remove the ignored test.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::fixtures_list::{all, Fixture};
use strait_dataplane::pipeline::Verdict;
use strait_dataplane::stats::DropReason;

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn blessing() -> bool {
    std::env::var("STRAIT_BLESS").is_ok_and(|v| v == "1")
}

/// Runs a fixture on a fresh bed; returns its verdict and the frame as it is after.
fn run(f: &Fixture) -> (Verdict, Vec<u8>) {
    let mut bed = f.bed();
    let out = bed.run(&f.input);
    assert!(bed.pipe.counters.balanced(), "{}: counters", f.name);
    out
}

/// The fixtures that state current behaviour (not the `bug` ones).
fn golden() -> Vec<Fixture> {
    all().into_iter().filter(|f| f.bug.is_none()).collect()
}

// ---- hex files -------------------------------------------------------------------------

fn to_hex(comments: &[String], bytes: &[u8]) -> String {
    let mut s = String::new();
    for c in comments {
        for line in c.lines() {
            writeln!(s, "# {line}").unwrap();
        }
    }
    for (i, chunk) in bytes.chunks(16).enumerate() {
        write!(s, "{:06x}", i * 16).unwrap();
        for b in chunk {
            write!(s, " {b:02x}").unwrap();
        }
        s.push('\n');
    }
    s
}

/// Parses [`to_hex`] output: comment lines skipped, offsets checked.
fn from_hex(path: &Path, text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let off = words.next().unwrap();
        let off = usize::from_str_radix(off, 16)
            .unwrap_or_else(|_| panic!("{}:{}: bad offset {off:?}", path.display(), n + 1));
        assert_eq!(
            off,
            out.len(),
            "{}:{}: offset out of sequence",
            path.display(),
            n + 1
        );
        for w in words {
            out.push(
                u8::from_str_radix(w, 16)
                    .unwrap_or_else(|_| panic!("{}:{}: bad byte {w:?}", path.display(), n + 1)),
            );
        }
    }
    out
}

fn hex_line(b: &[u8]) -> String {
    b.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Compares `actual` with the golden file, or writes it when blessing. Returns a problem.
fn check_golden(path: &Path, comments: &[String], actual: &[u8]) -> Option<String> {
    if blessing() {
        std::fs::write(path, to_hex(comments, actual)).expect("write golden");
        return None;
    }
    let name = path.file_name().unwrap().to_string_lossy();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            return Some(format!(
                "{name}: cannot read ({e}); run with STRAIT_BLESS=1 to create it"
            ))
        }
    };
    let expected = from_hex(path, &text);
    if expected != actual {
        let at = expected
            .iter()
            .zip(actual)
            .position(|(a, b)| a != b)
            .unwrap_or(expected.len().min(actual.len()));
        let from = at & !15;
        let to = |v: &[u8]| hex_line(&v[from.min(v.len())..(from + 32).min(v.len())]);
        return Some(format!(
            "{name}: differs at byte {at} (expected {} bytes, got {})\n  expected @{from:#06x}: {}\n  actual   @{from:#06x}: {}",
            expected.len(),
            actual.len(),
            to(&expected),
            to(actual),
        ));
    }
    if text != to_hex(comments, actual) {
        return Some(format!(
            "{name}: bytes match but the comment header is stale (description or verdict \
             changed); re-bless"
        ));
    }
    None
}

/// A verdict as the admin API and metrics name it.
fn verdict_name(v: Verdict) -> String {
    match v {
        Verdict::Tx { port } => format!("tx (port {port})"),
        Verdict::Pass => "pass".into(),
        Verdict::Drop(r) => format!("drop ({})", r.as_str()),
        Verdict::Handoff { core } => format!("handoff (core {core})"),
    }
}

fn comments(f: &Fixture, what: &str) -> Vec<String> {
    vec![
        format!("{}.{what}: {}", f.name, f.description),
        format!(
            "setup frames: {}; verdict: {}",
            f.setup.len(),
            verdict_name(f.verdict)
        ),
    ]
}

#[test]
fn golden_fixtures() {
    let mut problems = Vec::new();
    for f in golden() {
        let (v, out) = run(&f);
        if v != f.verdict {
            problems.push(format!(
                "{}: verdict {v:?}, expected {:?}",
                f.name, f.verdict
            ));
            continue;
        }
        let dir = fixtures_dir();
        problems.extend(check_golden(
            &dir.join(format!("{}.in.hex", f.name)),
            &comments(&f, "in"),
            &f.input,
        ));
        match v {
            Verdict::Tx { .. } => problems.extend(check_golden(
                &dir.join(format!("{}.out.hex", f.name)),
                &comments(&f, "out"),
                &out,
            )),
            // A frame that is not sent (dropped, or given to the kernel) is not touched.
            _ if out != f.input => problems.push(format!(
                "{}: {v:?} but the frame was modified:\n  in:  {}\n  out: {}",
                f.name,
                hex_line(&f.input),
                hex_line(&out)
            )),
            _ => {}
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
    if blessing() {
        eprintln!(
            "STRAIT_BLESS=1: golden files in {} rewritten; review `git diff`",
            fixtures_dir().display()
        );
    }
}

#[test]
fn no_stale_golden_files() {
    let mut wanted = BTreeSet::new();
    for f in golden() {
        wanted.insert(format!("{}.in.hex", f.name));
        if matches!(f.verdict, Verdict::Tx { .. }) {
            wanted.insert(format!("{}.out.hex", f.name));
        }
    }
    let mut stale = Vec::new();
    for e in std::fs::read_dir(fixtures_dir()).expect("tests/fixtures exists") {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".hex") && !wanted.contains(&name) {
            stale.push(name);
        }
    }
    assert!(
        stale.is_empty(),
        "golden files of no fixture (renamed or removed?): {stale:?}"
    );
}

#[test]
fn fixture_table_is_well_formed_and_complete() {
    let fixtures = all();
    let mut names = BTreeSet::new();
    for f in &fixtures {
        assert!(names.insert(f.name), "duplicate fixture name {}", f.name);
        assert!(
            f.name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
            "{}: names are file stems",
            f.name
        );
        let d = f.description;
        assert!(
            d.ends_with('.') && d.matches(". ").count() == 0,
            "{}: the description is one sentence",
            f.name
        );
    }
    // Every drop reason a frame can provoke has a fixture.
    let unreachable = [DropReason::NoHeadroom, DropReason::NoEgress];
    for r in DropReason::ALL {
        if unreachable.contains(&r) {
            continue;
        }
        assert!(
            fixtures.iter().any(|f| f.verdict == Verdict::Drop(r)),
            "no fixture for drop reason {}",
            r.as_str()
        );
    }
}

#[test]
fn offloaded_fixtures_are_completed_and_counted_once() {
    let mut seen = 0;
    for f in golden().into_iter().filter(|f| f.offloaded) {
        let mut bed = f.bed();
        let before = bed.pipe.counters.checksum_completed;
        let (v, out) = bed.run(&f.input);
        assert_eq!(v, f.verdict, "{}", f.name);
        assert!(
            strait_tests::verify(&f.input).is_err(),
            "{}: the input's checksum is not partial",
            f.name
        );
        strait_tests::verify(&out).unwrap_or_else(|e| panic!("{}: output {e}", f.name));
        assert_eq!(
            bed.pipe.counters.checksum_completed - before,
            1,
            "{}: completions counted",
            f.name
        );
        seen += 1;
    }
    assert!(seen >= 9, "only {seen} offloaded fixtures");
    // Each leaves exactly as the same packet sent with its checksum computed.
    for (offloaded, twin) in [
        ("offload_dsr_l2_v4", "dsr_l2_v4"),
        ("offload_dsr_l2_v6", "dsr_l2_v6"),
        ("offload_dsr_ipip_v4", "dsr_ipip_v4_in_v4"),
        ("offload_nat_v4", "nat_forward_tcp_v4"),
        ("offload_nat_v6", "nat_forward_tcp_v6"),
        ("offload_nat_udp_v4", "nat_forward_udp_v4"),
        ("offload_nat_reply_v4", "nat_reply_tcp_v4"),
        ("offload_sctp_dsr_l2_v4", "sctp_dsr_l2_v4"),
        ("offload_sctp_nat_v4", "sctp_nat_forward_v4"),
    ] {
        let (a, b) = (fixture(offloaded), fixture(twin));
        assert_ne!(a.input, b.input, "{offloaded}");
        assert_eq!(run(&a), run(&b), "{offloaded} leaves unlike {twin}");
    }
}

// ---- bugs found by the fixtures ---------------------------------------------------------

fn fixture(name: &str) -> Fixture {
    all()
        .into_iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no fixture {name}"))
}

#[test]
fn bug_icmp_error_about_gateway_ping_is_passed() {
    let f = fixture("icmp_error_for_gateway_ping");
    let (v, out) = run(&f);
    assert_eq!(v, f.verdict, "{}", f.bug.unwrap());
    assert_eq!(out, f.input);
}

#[test]
fn bug_nat_icmp_error_fixes_a_complete_quoted_checksum() {
    let f = fixture("icmpv6_packet_too_big_nat_full_quote");
    let (v, out) = run(&f);
    assert_eq!(v, f.verdict);
    strait_tests::verify(&out).expect("outer checksums");
    // Eth 14 + IPv6 40 + ICMPv6 8: the quoted IPv6 packet.
    let q = &out[62..];
    let (src, dst, seg) = (&q[8..24], &q[24..40], &q[40..]);
    let mut acc = 0u32;
    for c in [src, dst].concat().chunks(2).chain(seg.chunks(2)) {
        acc += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
    }
    acc += 6 + seg.len() as u32;
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    assert_eq!(acc, 0xffff, "{}", f.bug.unwrap());
}

#[test]
fn bug_nat_tiny_first_fragment_is_not_corrupted() {
    let f = fixture("fragment_first_tiny_tcp_nat");
    let mut bed = f.bed();
    let (v, first) = bed.run(&f.input);
    if matches!(v, Verdict::Drop(_)) {
        return;
    }
    // Sent: then the datagram the backend reassembles must still be consistent. Send the
    // rest of the segment (offset 16) and check the reassembled TCP checksum.
    let mut later = f.input.clone();
    let full = strait_tests::tcp("192.0.2.7", 40003, "203.0.113.13", 80, "PA", b"tinyfrag");
    let rest = &full[34 + 16..];
    later.truncate(34);
    later.extend_from_slice(rest);
    let total = (20 + rest.len()) as u16;
    later[16..18].copy_from_slice(&total.to_be_bytes());
    later[20..22].copy_from_slice(&2u16.to_be_bytes()); // offset 16 bytes, no MF
    later[24..26].copy_from_slice(&[0, 0]);
    let mut acc = 0u32;
    for c in later[14..34].chunks(2) {
        acc += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    later[24..26].copy_from_slice(&(!(acc as u16)).to_be_bytes());
    let (v2, later_out) = bed.run(&later);
    assert_eq!((v, v2), (Verdict::Tx { port: 0 }, Verdict::Tx { port: 0 }));
    let mut seg = first[34..].to_vec();
    seg.extend_from_slice(&later_out[34..]);
    let (src, dst) = (&first[26..30], &first[30..34]);
    let mut acc = 0u32;
    for c in [src, dst].concat().chunks(2).chain(seg.chunks(2)) {
        acc += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
    }
    acc += 6 + seg.len() as u32;
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    assert_eq!(
        acc,
        0xffff,
        "{}\n  first fragment in:  {}\n  first fragment out: {}",
        f.bug.unwrap(),
        hex_line(&f.input),
        hex_line(&first)
    );
}

// ---- pcap and independent decoders ------------------------------------------------------

/// A frame written to a pcap, and where it came from.
struct Record {
    fixture: &'static str,
    /// `in` or `out`.
    dir: &'static str,
    bytes: Vec<u8>,
    /// Its TCP/UDP checksum was left to offload: the decoders must find it bad.
    partial: bool,
}

/// Every well-formed input and every output, in fixture order (input before output, so
/// the fragments of one datagram come in order and tshark can reassemble them).
fn records() -> Vec<Record> {
    let mut r = Vec::new();
    for f in golden() {
        let (v, out) = run(&f);
        assert_eq!(v, f.verdict, "{}", f.name);
        if f.input_is_wellformed() {
            r.push(Record {
                fixture: f.name,
                dir: "in",
                bytes: f.input.clone(),
                partial: f.offloaded,
            });
        }
        if matches!(v, Verdict::Tx { .. }) {
            r.push(Record {
                fixture: f.name,
                dir: "out",
                bytes: out,
                partial: false,
            });
        }
    }
    r
}

/// The classic libpcap format (not pcapng): a 24-byte global header, then a 16-byte header
/// per record. Little-endian, microsecond timestamps, link type 1 (Ethernet).
fn write_pcap(path: &Path, frames: &[Record]) {
    let mut b = Vec::new();
    b.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes()); // magic
    b.extend_from_slice(&2u16.to_le_bytes()); // version 2.4
    b.extend_from_slice(&4u16.to_le_bytes());
    b.extend_from_slice(&0i32.to_le_bytes()); // thiszone
    b.extend_from_slice(&0u32.to_le_bytes()); // sigfigs
    b.extend_from_slice(&65535u32.to_le_bytes()); // snaplen
    b.extend_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
    for (i, f) in frames.iter().enumerate() {
        b.extend_from_slice(&(1_700_000_000u32 + i as u32).to_le_bytes()); // ts_sec
        b.extend_from_slice(&0u32.to_le_bytes()); // ts_usec
        b.extend_from_slice(&(f.bytes.len() as u32).to_le_bytes()); // incl_len
        b.extend_from_slice(&(f.bytes.len() as u32).to_le_bytes()); // orig_len
        b.extend_from_slice(&f.bytes);
    }
    std::fs::write(path, b).expect("write pcap");
}

/// A scratch directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("strait-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a decoder, or reports it missing: a failure unless `skip_var=1`, then a loud skip.
fn run_tool(mut cmd: Command, tool: &str, skip_var: &str) -> Option<std::process::Output> {
    let skip = std::env::var(skip_var).is_ok_and(|v| v == "1");
    match cmd.output() {
        Ok(o) => Some(o),
        Err(e) if skip => {
            eprintln!(
                "\n!!!!!!!!!! SKIPPED: {tool} could not run ({e}); {skip_var}=1 is set, so the \
                 fixtures were NOT independently decoded !!!!!!!!!!\n"
            );
            None
        }
        Err(e) => panic!(
            "{tool} could not run ({e}). Install it (Debian: apt-get install tshark \
             python3-scapy) or set {skip_var}=1 to skip this check explicitly."
        ),
    }
}

/// Whether a frame is an ICMP or ICMPv6 error whose quoted packet is shorter than the
/// quoted header says (as RFC 792 and RFC 4443 allow).
fn quote_is_truncated(f: &[u8]) -> bool {
    let l3 = if f.get(12..14) == Some(&[0x81, 0x00]) {
        18
    } else {
        14
    };
    let Some(&v) = f.get(l3) else { return false };
    let (msg, error) = match v >> 4 {
        4 if f.len() >= l3 + 20 && f[l3 + 9] == 1 => {
            let m = &f[l3 + (v as usize & 0x0f) * 4..];
            (m, matches!(m.first(), Some(3 | 11 | 12)))
        }
        6 if f.len() >= l3 + 40 && f[l3 + 6] == 58 => {
            let m = &f[l3 + 40..];
            (m, matches!(m.first(), Some(1..=4)))
        }
        _ => return false,
    };
    let Some(q) = msg.get(8..).filter(|q| error && q.len() >= 8) else {
        return false;
    };
    let stated = match q[0] >> 4 {
        4 => u16::from_be_bytes([q[2], q[3]]) as usize,
        6 => 40 + u16::from_be_bytes([q[4], q[5]]) as usize,
        _ => return false,
    };
    q.len() < stated
}

/// tshark fields read for every frame.
const FIELDS: &[&str] = &[
    "frame.number",
    "frame.len",
    "frame.protocols",
    "_ws.malformed",
    "_ws.expert.severity",
    "_ws.expert.message",
    "ip.checksum.status",
    "tcp.checksum.status",
    "udp.checksum.status",
    "icmp.checksum.status",
    "icmpv6.checksum.status",
    "sctp.checksum.status",
    "eth.dst",
    "eth.src",
    "vlan.id",
    "ip.hdr_len",
    "ip.dsfield",
    "ip.flags.df",
    "ip.ttl",
    "ip.proto",
    "ip.src",
    "ip.dst",
    "ipv6.nxt",
    "ipv6.hlim",
    "ipv6.flow",
    "ipv6.src",
    "ipv6.dst",
    "tcp.srcport",
    "tcp.dstport",
    "tcp.flags.str",
    "udp.srcport",
    "udp.dstport",
    "sctp.srcport",
    "sctp.dstport",
    "sctp.verification_tag",
    "sctp.chunk_type",
    "icmp.type",
    "icmp.code",
    "icmp.mtu",
    "icmpv6.type",
    "icmpv6.mtu",
    "dns.qry.name",
    "dns.a",
];

/// PI_ERROR in epan/proto.h.
const SEVERITY_ERROR: &str = "8388608";

/// Decoded values tshark must show, per (fixture, direction): field, then the `,`-joined
/// occurrences (outer first).
const EXPECT: &[(&str, &str, &str, &str)] = &[
    // dsr-l2: new MACs, IP untouched.
    ("dsr_l2_v4", "out", "eth.dst", "02:00:00:00:01:12"),
    ("dsr_l2_v4", "out", "eth.src", "02:00:00:00:00:01"),
    ("dsr_l2_v4", "out", "ip.dst", "203.0.113.10"),
    ("dsr_l2_v4", "out", "ip.ttl", "64"),
    ("dsr_l2_v6", "out", "eth.dst", "02:00:00:00:01:11"),
    ("dsr_l2_v6", "out", "ipv6.hlim", "64"),
    ("dsr_l2_vlan", "out", "vlan.id", "100"),
    (
        "dsr_l2_vlan",
        "out",
        "frame.protocols",
        "eth:ethertype:vlan:ethertype:ip:tcp",
    ),
    ("dsr_l2_ttl_1", "out", "ip.ttl", "1"),
    // IP-in-IP: outer protocol 4 / 41 / IPv6 next header 4, inner untouched.
    (
        "dsr_ipip_v4_in_v4",
        "out",
        "frame.protocols",
        "eth:ethertype:ip:ip:tcp",
    ),
    ("dsr_ipip_v4_in_v4", "out", "ip.proto", "4,6"),
    ("dsr_ipip_v4_in_v4", "out", "ip.src", "192.0.2.9,192.0.2.7"),
    (
        "dsr_ipip_v4_in_v4",
        "out",
        "ip.dst",
        "198.51.100.11,203.0.113.11",
    ),
    ("dsr_ipip_v4_in_v4", "out", "ip.flags.df", "1,1"),
    ("dsr_ipip_v4_in_v4", "out", "ip.ttl", "64,64"),
    ("dsr_ipip_v4_in_v4", "out", "ip.checksum.status", "1,1"),
    ("dsr_ipip_v4_in_v4", "out", "tcp.checksum.status", "1"),
    ("dsr_ipip_v4_in_v4_dscp", "out", "ip.dsfield", "0xba,0xba"),
    (
        "dsr_ipip_v4_in_v4_vlan",
        "out",
        "frame.protocols",
        "eth:ethertype:vlan:ethertype:ip:ip:tcp",
    ),
    ("dsr_ipip_v4_in_v4_vlan", "out", "vlan.id", "100"),
    ("dsr_ipip_v4_in_v4_padded", "out", "frame.len", "74"),
    ("dsr_ipip_v6_in_v6", "out", "ipv6.nxt", "41,6"),
    (
        "dsr_ipip_v6_in_v6",
        "out",
        "ipv6.src",
        "2001:db8::3c36,2001:db8:2::7",
    ),
    (
        "dsr_ipip_v6_in_v6",
        "out",
        "ipv6.dst",
        "2001:db8:1::11,2001:db8::11",
    ),
    (
        "dsr_ipip_v4_in_v6",
        "out",
        "frame.protocols",
        "eth:ethertype:ipv6:ip:tcp",
    ),
    ("dsr_ipip_v4_in_v6", "out", "ipv6.nxt", "4"),
    ("dsr_ipip_v4_in_v6", "out", "ipv6.dst", "2001:db8:1::11"),
    ("dsr_ipip_v4_in_v6", "out", "ip.src", "192.0.2.7"),
    (
        "ipv6_ext_chain_dsr_ipip",
        "out",
        "frame.protocols",
        "eth:ethertype:ipv6:ipv6:ipv6.hopopts:ipv6.dstopts:tcp",
    ),
    // GUE: UDP to 6080 carrying the IP packet; zero checksum over IPv4, computed over IPv6.
    (
        "dsr_gue_v4",
        "out",
        "frame.protocols",
        "eth:ethertype:ip:udp:ip:tcp",
    ),
    ("dsr_gue_v4", "out", "udp.dstport", "6080"),
    ("dsr_gue_v4", "out", "udp.checksum.status", "3"),
    ("dsr_gue_v4", "out", "ip.src", "192.0.2.141,192.0.2.7"),
    ("dsr_gue_v4", "out", "tcp.checksum.status", "1"),
    (
        "dsr_gue_v6_in_v6",
        "out",
        "frame.protocols",
        "eth:ethertype:ipv6:udp:ip:ipv6:tcp",
    ),
    ("dsr_gue_v6_in_v6", "out", "udp.checksum.status", "1"),
    (
        "dsr_gue_v6_in_v6",
        "out",
        "ipv6.src",
        "2001:db8::b110,2001:db8:2::7",
    ),
    (
        "dsr_gue_v4_in_v6",
        "out",
        "frame.protocols",
        "eth:ethertype:ipv6:udp:ip:tcp",
    ),
    ("dsr_gue_v4_in_v6", "out", "udp.checksum.status", "1"),
    ("dsr_gue_v4_in_v6", "out", "tcp.checksum.status", "1"),
    // nat forward: destination is the backend, checksums good.
    ("nat_forward_tcp_v4", "out", "ip.dst", "198.51.100.22"),
    ("nat_forward_tcp_v4", "out", "ip.src", "192.0.2.7"),
    ("nat_forward_tcp_v4", "out", "tcp.dstport", "8080"),
    ("nat_forward_tcp_v4", "out", "ip.ttl", "63"),
    ("nat_forward_tcp_v4", "out", "ip.checksum.status", "1"),
    ("nat_forward_tcp_v4", "out", "tcp.checksum.status", "1"),
    ("nat_forward_udp_v4", "out", "ip.dst", "198.51.100.21"),
    ("nat_forward_udp_v4", "out", "udp.dstport", "5353"),
    ("nat_forward_udp_v4", "out", "udp.checksum.status", "1"),
    ("nat_forward_udp_v4", "out", "dns.qry.name", "example.com"),
    ("nat_forward_tcp_v6", "out", "ipv6.dst", "2001:db8:1::21"),
    ("nat_forward_tcp_v6", "out", "ipv6.hlim", "63"),
    ("nat_forward_tcp_v6", "out", "tcp.dstport", "8080"),
    ("nat_forward_tcp_v6", "out", "tcp.checksum.status", "1"),
    ("nat_forward_ipv4_options", "out", "ip.hdr_len", "24"),
    ("nat_forward_ipv4_options", "out", "ip.dst", "198.51.100.22"),
    ("nat_forward_ipv4_options", "out", "ip.checksum.status", "1"),
    ("nat_forward_ipv4_options", "out", "tcp.dstport", "8080"),
    (
        "nat_forward_ipv4_options",
        "out",
        "tcp.checksum.status",
        "1",
    ),
    ("nat_forward_padded", "out", "frame.len", "60"),
    ("nat_forward_padded", "out", "tcp.checksum.status", "1"),
    (
        "ipv6_ext_chain_nat",
        "out",
        "frame.protocols",
        "eth:ethertype:ipv6:ipv6.hopopts:ipv6.dstopts:tcp",
    ),
    ("ipv6_ext_chain_nat", "out", "ipv6.dst", "2001:db8:1::21"),
    ("ipv6_ext_chain_nat", "out", "tcp.dstport", "8080"),
    ("ipv6_ext_chain_nat", "out", "tcp.checksum.status", "1"),
    // nat replies: source is the VIP again, back to the client's MAC.
    ("nat_reply_tcp_v4", "out", "ip.src", "203.0.113.13"),
    ("nat_reply_tcp_v4", "out", "tcp.srcport", "80"),
    ("nat_reply_tcp_v4", "out", "eth.dst", "02:00:00:00:00:c1"),
    ("nat_reply_tcp_v4", "out", "ip.ttl", "63"),
    ("nat_reply_tcp_v4", "out", "tcp.checksum.status", "1"),
    ("nat_reply_udp_v4", "out", "ip.src", "203.0.113.13"),
    ("nat_reply_udp_v4", "out", "udp.srcport", "53"),
    ("nat_reply_udp_v4", "out", "udp.checksum.status", "1"),
    ("nat_reply_udp_v4", "out", "dns.a", "198.51.100.99"),
    ("nat_reply_tcp_v6", "out", "ipv6.src", "2001:db8::10"),
    ("nat_reply_tcp_v6", "out", "tcp.srcport", "80"),
    ("nat_reply_tcp_v6", "out", "tcp.checksum.status", "1"),
    // Checksums left to offload: bad on the way in, completed on the way out.
    ("offload_dsr_l2_v4", "in", "tcp.checksum.status", "0"),
    ("offload_dsr_l2_v4", "out", "tcp.checksum.status", "1"),
    ("offload_dsr_l2_v4", "out", "ip.dst", "203.0.113.10"),
    ("offload_dsr_l2_v6", "in", "tcp.checksum.status", "0"),
    ("offload_dsr_l2_v6", "out", "tcp.checksum.status", "1"),
    ("offload_dsr_ipip_v4", "in", "tcp.checksum.status", "0"),
    ("offload_dsr_ipip_v4", "out", "ip.checksum.status", "1,1"),
    ("offload_dsr_ipip_v4", "out", "tcp.checksum.status", "1"),
    ("offload_nat_v4", "in", "tcp.checksum.status", "0"),
    ("offload_nat_v4", "out", "ip.dst", "198.51.100.22"),
    ("offload_nat_v4", "out", "tcp.dstport", "8080"),
    ("offload_nat_v4", "out", "tcp.checksum.status", "1"),
    ("offload_nat_v6", "in", "tcp.checksum.status", "0"),
    ("offload_nat_v6", "out", "ipv6.dst", "2001:db8:1::21"),
    ("offload_nat_v6", "out", "tcp.checksum.status", "1"),
    ("offload_nat_udp_v4", "in", "udp.checksum.status", "0"),
    ("offload_nat_udp_v4", "out", "udp.dstport", "5353"),
    ("offload_nat_udp_v4", "out", "udp.checksum.status", "1"),
    ("offload_nat_reply_v4", "in", "tcp.checksum.status", "0"),
    ("offload_nat_reply_v4", "out", "ip.src", "203.0.113.13"),
    ("offload_nat_reply_v4", "out", "tcp.srcport", "80"),
    ("offload_nat_reply_v4", "out", "tcp.checksum.status", "1"),
    // ICMP errors about flows.
    (
        "icmp_frag_needed_dsr_l2",
        "out",
        "eth.dst",
        "02:00:00:00:01:12",
    ),
    (
        "icmp_frag_needed_dsr_l2",
        "out",
        "ip.dst",
        "203.0.113.10,192.0.2.7",
    ),
    (
        "icmp_frag_needed_dsr_ipip",
        "out",
        "frame.protocols",
        "eth:ethertype:ip:ip:icmp:ip:tcp",
    ),
    (
        "icmp_frag_needed_dsr_ipip",
        "out",
        "ip.dst",
        "198.51.100.11,203.0.113.11,192.0.2.7",
    ),
    (
        "icmp_frag_needed_nat",
        "out",
        "eth.dst",
        "02:00:00:00:01:22",
    ),
    (
        "icmp_frag_needed_nat",
        "out",
        "ip.dst",
        "198.51.100.22,192.0.2.7",
    ),
    (
        "icmp_frag_needed_nat",
        "out",
        "ip.src",
        "192.0.2.254,198.51.100.22",
    ),
    ("icmp_frag_needed_nat", "out", "ip.ttl", "63,64"),
    ("icmp_frag_needed_nat", "out", "tcp.srcport", "8080"),
    ("icmp_frag_needed_nat", "out", "icmp.mtu", "1280"),
    ("icmp_frag_needed_nat", "out", "ip.checksum.status", "1,1"),
    ("icmp_frag_needed_nat", "out", "icmp.checksum.status", "1"),
    (
        "icmpv6_packet_too_big_nat",
        "out",
        "ipv6.dst",
        "2001:db8:1::21,2001:db8:2::7",
    ),
    (
        "icmpv6_packet_too_big_nat",
        "out",
        "ipv6.src",
        "2001:db8:2::fe,2001:db8:1::21",
    ),
    ("icmpv6_packet_too_big_nat", "out", "ipv6.hlim", "63,64"),
    ("icmpv6_packet_too_big_nat", "out", "tcp.srcport", "8080"),
    ("icmpv6_packet_too_big_nat", "out", "icmpv6.mtu", "1400"),
    (
        "icmpv6_packet_too_big_nat",
        "out",
        "icmpv6.checksum.status",
        "1",
    ),
    // Too-big answers, from the VIP back to the client.
    ("too_big_icmp_v4", "out", "frame.len", "590"),
    ("too_big_icmp_v4", "out", "eth.dst", "02:00:00:00:00:c1"),
    ("too_big_icmp_v4", "out", "ip.src", "203.0.113.11,192.0.2.7"),
    ("too_big_icmp_v4", "out", "ip.dst", "192.0.2.7,203.0.113.11"),
    ("too_big_icmp_v4", "out", "icmp.type", "3"),
    ("too_big_icmp_v4", "out", "icmp.code", "4"),
    ("too_big_icmp_v4", "out", "icmp.mtu", "1480"),
    ("too_big_icmp_v4", "out", "icmp.checksum.status", "1"),
    ("too_big_icmpv6", "out", "frame.len", "1294"),
    (
        "too_big_icmpv6",
        "out",
        "ipv6.src",
        "2001:db8::11,2001:db8:2::7",
    ),
    ("too_big_icmpv6", "out", "icmpv6.type", "2"),
    ("too_big_icmpv6", "out", "icmpv6.mtu", "1460"),
    ("too_big_icmpv6", "out", "icmpv6.checksum.status", "1"),
    // Fragments: tshark reassembles each pair; the datagram's checksum holds after nat.
    ("fragment_first_v4", "out", "ip.dst", "198.51.100.21"),
    ("fragment_first_v4", "out", "ip.ttl", "63"),
    ("fragment_later_v4", "in", "udp.checksum.status", "1"),
    ("fragment_later_v4", "out", "ip.dst", "198.51.100.21"),
    ("fragment_later_v4", "out", "udp.dstport", "5353"),
    ("fragment_later_v4", "out", "udp.checksum.status", "1"),
    ("fragment_later_v6", "in", "tcp.checksum.status", "1"),
    ("fragment_later_v6", "out", "ipv6.dst", "2001:db8:1::21"),
    ("fragment_later_v6", "out", "tcp.dstport", "8080"),
    ("fragment_later_v6", "out", "tcp.checksum.status", "1"),
    // SCTP: the CRC32c untouched and valid through DSR, recomputed by nat.
    ("sctp_dsr_l2_v4", "in", "sctp.checksum.status", "1"),
    ("sctp_dsr_l2_v4", "in", "sctp.chunk_type", "1"),
    ("sctp_dsr_l2_v4", "out", "eth.dst", "02:00:00:00:01:12"),
    ("sctp_dsr_l2_v4", "out", "ip.dst", "203.0.113.30"),
    ("sctp_dsr_l2_v4", "out", "ip.ttl", "64"),
    ("sctp_dsr_l2_v4", "out", "sctp.dstport", "7777"),
    ("sctp_dsr_l2_v4", "out", "sctp.checksum.status", "1"),
    ("sctp_dsr_l2_v6", "out", "ipv6.dst", "2001:db8::30"),
    ("sctp_dsr_l2_v6", "out", "sctp.checksum.status", "1"),
    (
        "sctp_dsr_l2_abort_without_flow",
        "out",
        "sctp.chunk_type",
        "6",
    ),
    (
        "sctp_dsr_l2_abort_without_flow",
        "out",
        "sctp.checksum.status",
        "1",
    ),
    (
        "sctp_dsr_ipip_v4",
        "out",
        "frame.protocols",
        "eth:ethertype:ip:ip:sctp",
    ),
    ("sctp_dsr_ipip_v4", "out", "ip.proto", "4,132"),
    (
        "sctp_dsr_ipip_v4",
        "out",
        "ip.dst",
        "198.51.100.11,203.0.113.31",
    ),
    (
        "sctp_dsr_ipip_v4",
        "out",
        "sctp.verification_tag",
        "0x0badcafe",
    ),
    ("sctp_dsr_ipip_v4", "out", "sctp.checksum.status", "1"),
    (
        "sctp_dsr_gue_v4",
        "out",
        "frame.protocols",
        "eth:ethertype:ip:udp:ip:sctp",
    ),
    ("sctp_dsr_gue_v4", "out", "udp.dstport", "6080"),
    (
        "sctp_dsr_gue_v4",
        "out",
        "ip.dst",
        "198.51.100.12,203.0.113.32",
    ),
    ("sctp_dsr_gue_v4", "out", "sctp.checksum.status", "1"),
    ("sctp_nat_forward_v4", "out", "eth.dst", "02:00:00:00:01:24"),
    ("sctp_nat_forward_v4", "out", "ip.src", "192.0.2.7"),
    ("sctp_nat_forward_v4", "out", "ip.dst", "198.51.100.24"),
    ("sctp_nat_forward_v4", "out", "ip.ttl", "63"),
    ("sctp_nat_forward_v4", "out", "ip.checksum.status", "1"),
    ("sctp_nat_forward_v4", "out", "sctp.srcport", "5000"),
    ("sctp_nat_forward_v4", "out", "sctp.dstport", "17777"),
    ("sctp_nat_forward_v4", "out", "sctp.checksum.status", "1"),
    ("sctp_nat_forward_v6", "out", "ipv6.dst", "2001:db8:1::24"),
    ("sctp_nat_forward_v6", "out", "ipv6.hlim", "63"),
    ("sctp_nat_forward_v6", "out", "sctp.dstport", "17777"),
    ("sctp_nat_forward_v6", "out", "sctp.checksum.status", "1"),
    ("sctp_nat_forward_data_v4", "out", "ip.dst", "198.51.100.24"),
    ("sctp_nat_forward_data_v4", "out", "sctp.dstport", "17777"),
    (
        "sctp_nat_forward_data_v4",
        "out",
        "sctp.checksum.status",
        "1",
    ),
    ("sctp_nat_reply_v4", "in", "sctp.checksum.status", "1"),
    ("sctp_nat_reply_v4", "out", "ip.src", "203.0.113.33"),
    ("sctp_nat_reply_v4", "out", "ip.dst", "192.0.2.7"),
    ("sctp_nat_reply_v4", "out", "eth.dst", "02:00:00:00:00:c1"),
    ("sctp_nat_reply_v4", "out", "ip.ttl", "63"),
    ("sctp_nat_reply_v4", "out", "sctp.srcport", "7777"),
    ("sctp_nat_reply_v4", "out", "sctp.chunk_type", "2"),
    ("sctp_nat_reply_v4", "out", "sctp.checksum.status", "1"),
    ("offload_sctp_dsr_l2_v4", "in", "sctp.checksum.status", "0"),
    ("offload_sctp_dsr_l2_v4", "out", "sctp.checksum.status", "1"),
    ("offload_sctp_nat_v4", "in", "sctp.checksum.status", "0"),
    ("offload_sctp_nat_v4", "out", "sctp.dstport", "17777"),
    ("offload_sctp_nat_v4", "out", "sctp.checksum.status", "1"),
];

#[test]
fn tshark_decodes_every_fixture() {
    let tshark = std::env::var("STRAIT_TSHARK").unwrap_or_else(|_| "tshark".into());
    let records = records();
    let tmp = TempDir::new("tshark");
    let pcap = tmp.0.join("fixtures.pcap");
    write_pcap(&pcap, &records);
    let mut cmd = Command::new(&tshark);
    cmd.arg("-r").arg(&pcap).args([
        "-n",
        "-o",
        "ip.check_checksum:TRUE",
        "-o",
        "tcp.check_checksum:TRUE",
        "-o",
        "udp.check_checksum:TRUE",
        "-o",
        "sctp.checksum:CRC 32c",
        // Fixtures share 4-tuples; sequence analysis across them would only add notes.
        "-o",
        "tcp.analyze_sequence_numbers:FALSE",
        // GUE variant 1: the UDP payload is an IP packet. tshark's `ip` dissector hands a
        // version-6 header to `ipv6`, so one decode-as covers both inner families.
        "-d",
        "udp.port==6080,ip",
        "-T",
        "fields",
        "-E",
        "separator=/t",
        "-E",
        "occurrence=a",
        "-E",
        "aggregator=,",
    ]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let Some(out) = run_tool(cmd, "tshark", "STRAIT_SKIP_TSHARK") else {
        return;
    };
    assert!(
        out.status.success(),
        "tshark failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut decoded: BTreeMap<(&str, &str), BTreeMap<&str, String>> = BTreeMap::new();
    let mut problems = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        records.len(),
        "tshark decoded {} frames of {}",
        lines.len(),
        records.len()
    );
    for (line, rec) in lines.iter().zip(&records) {
        let cols: Vec<&str> = line.split('\t').collect();
        assert_eq!(cols.len(), FIELDS.len(), "tshark line: {line}");
        let m: BTreeMap<&str, String> = FIELDS
            .iter()
            .copied()
            .zip(cols.iter().map(|c| c.to_string()))
            .collect();
        let who = format!("{}.{} (frame {})", rec.fixture, rec.dir, m["frame.number"]);
        if !m["_ws.malformed"].is_empty() {
            problems.push(format!("{who}: malformed: {}", m["_ws.malformed"]));
        }
        // tshark checks the transport checksum of a packet quoted in an ICMP error over the
        // bytes quoted, even when the quote is cut short (it reports any router's 576-byte
        // quote of a 1500-byte segment as bad). Those checksums cannot be judged: skip them,
        // and the "Bad checksum" expert errors they raise.
        let cut_quote = quote_is_truncated(&rec.bytes);
        let mut excused = 0;
        for k in [
            "ip.checksum.status",
            "tcp.checksum.status",
            "udp.checksum.status",
            "icmp.checksum.status",
            "icmpv6.checksum.status",
            "sctp.checksum.status",
        ] {
            // 0 = bad, 4 = illegal (e.g. a zero UDP checksum over IPv6).
            let bad = m[k].split(',').filter(|s| *s == "0" || *s == "4").count();
            let l4 = matches!(
                k,
                "tcp.checksum.status" | "udp.checksum.status" | "sctp.checksum.status"
            );
            if bad > 0 && (cut_quote || rec.partial) && l4 {
                excused += bad;
            } else if bad > 0 {
                problems.push(format!("{who}: {k} = {}", m[k]));
            }
        }
        if rec.partial && excused == 0 {
            problems.push(format!(
                "{who}: the checksum left to offload was not found bad"
            ));
        }
        let sev: Vec<&str> = m["_ws.expert.severity"].split(',').collect();
        let msg: Vec<&str> = m["_ws.expert.message"].split(',').collect();
        for (i, s) in sev.iter().enumerate() {
            let msg = msg.get(i).copied().unwrap_or("?");
            if *s == SEVERITY_ERROR {
                let bad_sum =
                    msg.starts_with("Bad checksum") || msg.starts_with("Bad SCTP checksum");
                if excused > 0 && bad_sum {
                    excused -= 1;
                } else {
                    problems.push(format!("{who}: expert error: {msg}"));
                }
            }
        }
        decoded.insert((rec.fixture, rec.dir), m);
    }
    for (fx, dir, field, want) in EXPECT {
        match decoded.get(&(*fx, *dir)) {
            None => problems.push(format!("{fx}.{dir}: not in the pcap")),
            Some(m) => {
                let got = m.get(field).map(String::as_str);
                if got != Some(*want) {
                    problems.push(format!("{fx}.{dir}: {field} = {got:?}, expected {want:?}"));
                }
            }
        }
    }
    if std::env::var("STRAIT_TSHARK_DUMP").is_ok() {
        for ((fx, dir), m) in &decoded {
            let mut s = format!("{fx}.{dir}:");
            for (k, v) in m {
                if !v.is_empty() && !k.starts_with("_ws.expert") {
                    write!(s, " {k}={v}").unwrap();
                }
            }
            eprintln!("{s}");
        }
    }
    assert!(
        problems.is_empty(),
        "tshark found problems:\n{}",
        problems.join("\n")
    );
}

#[test]
fn scapy_decodes_every_fixture() {
    let python = std::env::var("STRAIT_PYTHON").unwrap_or_else(|_| "/usr/bin/python3".into());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/scapy_check.py");
    let records = records();
    let tmp = TempDir::new("scapy");
    let pcap = tmp.0.join("fixtures.pcap");
    write_pcap(&pcap, &records);
    let mut cmd = Command::new(&python);
    cmd.arg(&script).arg(&pcap);
    let Some(out) = run_tool(cmd, &format!("scapy (via {python})"), "STRAIT_SKIP_SCAPY") else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(3) {
        // The script's exit code for "scapy is not importable".
        let skip = std::env::var("STRAIT_SKIP_SCAPY").is_ok_and(|v| v == "1");
        assert!(
            skip,
            "scapy is not importable by {python}: {stderr}\nInstall python3-scapy or set \
             STRAIT_SKIP_SCAPY=1 to skip this check explicitly."
        );
        eprintln!("\n!!!!!!!!!! SKIPPED: scapy not importable; STRAIT_SKIP_SCAPY=1 !!!!!!!!!!\n");
        return;
    }
    assert!(out.status.success(), "scapy_check.py failed: {stderr}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), records.len(), "scapy output:\n{text}");
    let mut problems = Vec::new();
    let mut decoded: BTreeMap<(&str, &str), String> = BTreeMap::new();
    for (line, rec) in lines.iter().zip(&records) {
        // "<frame>\t<summary>\t<checksums verified>\t<problems>"
        let cols: Vec<&str> = line.split('\t').collect();
        assert_eq!(cols.len(), 4, "scapy line: {line}");
        if rec.partial {
            // Exactly the transport checksum is wrong, and nothing else.
            let l4_only = cols[3].split("; ").all(|p| {
                p.starts_with("TCP.chksum")
                    || p.starts_with("UDP.chksum")
                    || p.starts_with("SCTP.chksum")
            });
            if cols[3].is_empty() || !l4_only {
                problems.push(format!(
                    "{}.{}: expected only the offloaded checksum bad, got {:?}",
                    rec.fixture, rec.dir, cols[3]
                ));
            }
        } else if !cols[3].is_empty() {
            problems.push(format!("{}.{}: {}", rec.fixture, rec.dir, cols[3]));
        }
        // Every IP frame has at least one checksum scapy could recompute, but an IPv6
        // fragment that does not complete its datagram (no header checksum, and the
        // transport checksum is checked on the reassembled datagram).
        let b = &rec.bytes;
        let ip = b.len() > 14 && matches!(b[12..14], [0x08, 0x00] | [0x86, 0xdd] | [0x81, 0x00]);
        let v6_fragment = b.len() > 20 && b[12..14] == [0x86, 0xdd] && b[20] == 44;
        if ip && !v6_fragment && !rec.partial && cols[2].is_empty() {
            problems.push(format!(
                "{}.{}: no checksum verified ({})",
                rec.fixture, rec.dir, cols[1]
            ));
        }
        decoded.insert(
            (rec.fixture, rec.dir),
            format!("{} [verified: {}]", cols[1], cols[2]),
        );
    }
    for (fx, dir, want) in SCAPY_EXPECT {
        match decoded.get(&(*fx, *dir)) {
            Some(s) if s.contains(want) => {}
            got => problems.push(format!("{fx}.{dir}: {got:?} lacks {want:?}")),
        }
    }
    if std::env::var("STRAIT_SCAPY_DUMP").is_ok() {
        eprintln!("{text}");
    }
    assert!(
        problems.is_empty(),
        "scapy found problems:\n{}",
        problems.join("\n")
    );
}

/// Substrings of scapy's summary (GUE inner packets re-dissected) and of the list of
/// checksums it verified, per (fixture, direction).
const SCAPY_EXPECT: &[(&str, &str, &str)] = &[
    ("dsr_gue_v4", "out", "Ether / IP / UDP 192.0.2.141:54669 > 198.51.100.12:6080"),
    ("dsr_gue_v4", "out", "GUE inner: IP / TCP 192.0.2.7:40000 > 203.0.113.12:http S"),
    ("dsr_gue_v4", "out", "[verified: IP.chksum GUE-inner-IP.chksum GUE-inner-TCP.chksum]"),
    ("dsr_gue_v6_in_v6", "out", "GUE inner: IPv6 / TCP 2001:db8:2::7:40000 > 2001:db8::13:http S"),
    ("dsr_gue_v6_in_v6", "out", "[verified: UDP.chksum GUE-inner-TCP.chksum]"),
    ("dsr_gue_v4_in_v6", "out", "GUE inner: IP / TCP 192.0.2.7:40000 > 203.0.113.17:http S"),
    ("dsr_gue_v4_in_v6", "out", "[verified: UDP.chksum GUE-inner-IP.chksum GUE-inner-TCP.chksum]"),
    ("dsr_ipip_v4_in_v4", "out", "Ether / IP / IP / TCP 192.0.2.7:40000 > 203.0.113.11:http S"),
    ("dsr_ipip_v4_in_v4", "out", "[verified: IP.chksum IP.chksum TCP.chksum]"),
    ("dsr_ipip_v4_in_v6", "out", "Ether / IPv6 / IP / TCP 192.0.2.7:40000 > 203.0.113.16:http S"),
    ("dsr_ipip_v6_in_v6", "out", "Ether / IPv6 / IPv6 / TCP 2001:db8:2::7:40000 > 2001:db8::11:http S"),
    ("nat_forward_tcp_v4", "out", "TCP 192.0.2.7:40000 > 198.51.100.22:http_alt S [verified: IP.chksum TCP.chksum]"),
    ("nat_forward_tcp_v6", "out", "TCP 2001:db8:2::7:40000 > 2001:db8:1::21:http_alt S [verified: TCP.chksum]"),
    ("ipv6_ext_chain_nat", "out", "IPv6ExtHdrHopByHop / IPv6ExtHdrDestOpt / TCP 40000 > http_alt S [verified: TCP.chksum]"),
    ("nat_reply_tcp_v4", "out", "TCP 203.0.113.13:http > 192.0.2.7:40000 SA"),
    ("nat_reply_tcp_v6", "out", "TCP 2001:db8::10:http > 2001:db8:2::7:40000 SA [verified: TCP.chksum]"),
    ("nat_reply_udp_v4", "out", "[verified: IP.chksum UDP.chksum]"),
    ("offload_dsr_l2_v4", "out", "[verified: IP.chksum TCP.chksum]"),
    ("offload_dsr_l2_v6", "out", "[verified: TCP.chksum]"),
    ("offload_dsr_ipip_v4", "out", "[verified: IP.chksum IP.chksum TCP.chksum]"),
    ("offload_nat_v4", "out", "TCP 192.0.2.7:40000 > 198.51.100.22:http_alt S [verified: IP.chksum TCP.chksum]"),
    ("offload_nat_v6", "out", "[verified: TCP.chksum]"),
    ("offload_nat_udp_v4", "out", "[verified: IP.chksum UDP.chksum]"),
    ("offload_nat_reply_v4", "out", "TCP 203.0.113.13:http > 192.0.2.7:40000 SA [verified: IP.chksum TCP.chksum]"),
    ("offload_nat_v4", "in", "[verified: IP.chksum]"),
    ("icmp_frag_needed_nat", "out", "ICMP 192.0.2.254 > 198.51.100.22 dest-unreach fragmentation-needed / IPerror / TCPerror [verified: IP.chksum ICMP.chksum]"),
    ("icmpv6_packet_too_big_nat", "out", "ICMPv6PacketTooBig / IPerror6 / TCPerror [verified: ICMPv6PacketTooBig.cksum]"),
    ("too_big_icmp_v4", "out", "ICMP 203.0.113.11 > 192.0.2.7 dest-unreach fragmentation-needed / IPerror / TCPerror / Raw [verified: IP.chksum ICMP.chksum]"),
    ("too_big_icmpv6", "out", "ICMPv6PacketTooBig / IPerror6 / TCPerror / Raw [verified: ICMPv6PacketTooBig.cksum]"),
    ("fragment_later_v4", "out", "[verified: IP.chksum reassembled-UDP.chksum]"),
    ("fragment_later_v6", "out", "[verified: reassembled-TCP.chksum]"),
    ("sctp_dsr_l2_v4", "out", "192.0.2.7 > 203.0.113.30 sctp / SCTP / SCTPChunkInit [verified: IP.chksum SCTP.chksum]"),
    ("sctp_dsr_l2_v6", "out", "SCTPChunkInit [verified: SCTP.chksum]"),
    ("sctp_dsr_ipip_v4", "out", "Ether / IP / 192.0.2.7 > 203.0.113.31 sctp / SCTP / SCTPChunkData [verified: IP.chksum IP.chksum SCTP.chksum]"),
    ("sctp_dsr_gue_v4", "out", "GUE inner: 192.0.2.7 > 203.0.113.32 sctp / SCTP / SCTPChunkInit [verified: IP.chksum GUE-inner-IP.chksum GUE-inner-SCTP.chksum]"),
    ("sctp_nat_forward_v4", "out", "192.0.2.7 > 198.51.100.24 sctp / SCTP / SCTPChunkInit [verified: IP.chksum SCTP.chksum]"),
    ("sctp_nat_forward_v6", "out", "2001:db8:2::7 > 2001:db8:1::24 (132) / SCTP / SCTPChunkInit [verified: SCTP.chksum]"),
    ("sctp_nat_forward_data_v4", "out", "SCTPChunkData [verified: IP.chksum SCTP.chksum]"),
    ("sctp_nat_reply_v4", "out", "203.0.113.33 > 192.0.2.7 sctp / SCTP / SCTPChunkInitAck [verified: IP.chksum SCTP.chksum]"),
    ("offload_sctp_dsr_l2_v4", "out", "[verified: IP.chksum SCTP.chksum]"),
    ("offload_sctp_nat_v4", "out", "[verified: IP.chksum SCTP.chksum]"),
];
