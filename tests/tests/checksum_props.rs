//! Property tests of the checksum arithmetic and of every rewrite the pipeline makes.
//!
//! - The incremental updates (RFC 1624 eqn. 3) against a full recomputation over random
//!   buffers, including the corner cases where the data sums to 0xffff or to zero.
//! - Random TCP/UDP packets (IPv4 with random options, IPv6, random payloads and TTLs, some
//!   VLAN-tagged) through the pipeline for every service of `fuzz/all_modes.toml`: every Tx
//!   output passes the independent verifier (etherparse and a plain RFC 1071 sum); nat
//!   round trips restore the client's view; ICMP errors about a flow reach its backend with
//!   valid checksums; an IPv4 UDP checksum of zero stays zero. Client packets and nat
//!   replies come at random valid or with the TCP/UDP checksum their sender left to offload
//!   (the pseudo-header sum alone): the output is the same and valid either way, and
//!   `checksum_completed` counts exactly the partial ones sent.
//!
//! The configuration is the fuzz target's, so the properties and the fuzzer exercise the same
//! services; `gen_fuzz_seeds` (ignored) writes the fuzz seed corpus from the same builders.
//! Failures are not persisted to `proptest-regressions/`: a failure prints its minimal case,
//! which belongs in a named test instead.

use std::net::IpAddr;
use std::sync::OnceLock;

use etherparse::{
    IpHeaders, IpNumber, Ipv4Header, Ipv6Header, NetSlice, PacketBuilder, SlicedPacket, TcpHeader,
    TransportSlice,
};
use proptest::prelude::*;
use strait_config::model::Mode;
use strait_dataplane::pipeline::{Pipeline, Verdict};
use strait_dataplane::stats::DropReason;
use strait_dataplane::table::{Service, ServiceTable};
use strait_dataplane::wire::checksum::{
    apply, change, change16, checksum, fold, pseudo_header, sum, update16, update_bytes,
};
use strait_tests::{offload, run_with, verify, CLIENT_MAC, GW_MAC, SEC};

/// The fuzz targets' configuration: every mode, both families.
const ALL_MODES: &str = include_str!("../../fuzz/all_modes.toml");

/// [`ALL_MODES`] with every interface serving every VLAN, which the cases' tags draw from.
fn table() -> &'static ServiceTable {
    static T: OnceLock<ServiceTable> = OnceLock::new();
    T.get_or_init(|| strait_tests::table(&strait_tests::serving_every_vlan(ALL_MODES), 1500))
}

fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---- (a) checksum arithmetic ----------------------------------------------------------

/// RFC 1071 the slow way: 16-bit words, zero-padded, end-around carry after every add.
fn reference_sum(data: &[u8]) -> u16 {
    let mut acc = 0u32;
    for c in data.chunks(2) {
        acc += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The word at an even offset, the odd trailing byte padded with zero as the sum pads it.
fn word(data: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([data[at], *data.get(at + 1).unwrap_or(&0)])
}

fn set_word(data: &mut [u8], at: usize, w: u16) {
    let [hi, lo] = w.to_be_bytes();
    data[at] = hi;
    if at + 1 < data.len() {
        data[at + 1] = lo;
    }
}

/// What an incremental update must equal: the recomputed checksum, except where RFC 1624
/// section 3 says eqn. 3 differs. When the new data sums to +0 (all zero words), the
/// recomputation gives 0xffff and eqn. 3 gives 0x0000, the other zero of one's complement;
/// no real header (IPv4 has its version, the pseudo-header its protocol) sums to +0.
fn expected_incremental(new_data: &[u8]) -> u16 {
    if new_data.iter().all(|b| *b == 0) {
        0x0000
    } else {
        checksum(new_data)
    }
}

/// Data of `len` bytes (either parity) and a word offset inside it.
fn data_and_offset() -> impl Strategy<Value = (Vec<u8>, usize)> {
    (1usize..200)
        .prop_flat_map(|len| (prop::collection::vec(any::<u8>(), len), 0..len.div_ceil(2)))
        .prop_map(|(d, w)| (d, w * 2))
}

/// Data of `len` bytes (either parity) and the offset of a whole word inside it.
fn whole_word_and_data() -> impl Strategy<Value = (Vec<u8>, usize)> {
    (2usize..200)
        .prop_flat_map(|len| (prop::collection::vec(any::<u8>(), len), 0..len / 2))
        .prop_map(|(d, w)| (d, w * 2))
}

/// Makes the whole of `data` sum to 0xffff (its checksum then 0x0000) by choosing the word
/// at `at`: the RFC 1624 case that eqn. 2 gets wrong.
fn make_sum_ffff(data: &mut [u8], at: usize) {
    fill_to_ffff(data, at);
    debug_assert!(at + 1 >= data.len() || checksum(data) == 0x0000);
}

fn fill_to_ffff(data: &mut [u8], at: usize) {
    set_word(data, at, 0);
    let rest = reference_sum(data);
    // rest + w == 0xffff exactly, no carry.
    let w = 0xffff - rest;
    if at + 1 >= data.len() && w & 0xff != 0 {
        // An odd trailing byte holds only the high half of a word: this case stays random.
        return;
    }
    set_word(data, at, w);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10000, ..config() })]

    #[test]
    fn sum_matches_reference(
        (data, _) in data_and_offset(),
        split in any::<prop::sample::Index>(),
    ) {
        prop_assert_eq!(fold(sum(0, &data)), reference_sum(&data));
        // Summing in two pieces, the first of even length, is the same sum.
        let cut = split.index(data.len() / 2 + 1) * 2;
        prop_assert_eq!(fold(sum(sum(0, &data[..cut]), &data[cut..])), reference_sum(&data));
    }

    #[test]
    fn update16_matches_recompute(
        (mut data, at) in data_and_offset(),
        new in any::<u16>(),
        corner in 0u8..5,
    ) {
        // The corners of RFC 1624 sections 3 and 4, each a fifth of the cases.
        match corner {
            // Before: the data sums to 0xffff, its checksum is 0x0000.
            0 => make_sum_ffff(&mut data, at),
            // Before: all zero, checksum 0xffff.
            1 => data.fill(0),
            // After: all zero (set up here, finished below).
            3 => {
                let w = word(&data, at);
                data.fill(0);
                set_word(&mut data, at, w);
            }
            _ => {}
        }
        let c = checksum(&data);
        let old = word(&data, at);
        let mut after = data.clone();
        set_word(&mut after, at, new);
        match corner {
            // After: the data sums to 0xffff, the new word chosen to make it so.
            2 => make_sum_ffff(&mut after, at),
            3 => after.fill(0),
            _ => {}
        }
        prop_assert_eq!(update16(c, old, word(&after, at)), expected_incremental(&after));
    }

    #[test]
    fn update_bytes_matches_recompute(
        (mut data, at) in whole_word_and_data(),
        run in 1usize..9,
        fill in prop::collection::vec(any::<u8>(), 16),
        corner in 0u8..5,
    ) {
        // A run of whole words changes, as an address or a port pair does.
        let n = (run * 2).min((data.len() - at) / 2 * 2);
        match corner {
            0 => make_sum_ffff(&mut data, at),
            1 => data.fill(0),
            3 => {
                let keep = data[at..at + n].to_vec();
                data.fill(0);
                data[at..at + n].copy_from_slice(&keep);
            }
            _ => {}
        }
        let c = checksum(&data);
        let old = data[at..at + n].to_vec();
        let mut after = data.clone();
        after[at..at + n].copy_from_slice(&fill[..n]);
        match corner {
            2 => make_sum_ffff(&mut after, at),
            3 => after.fill(0),
            _ => {}
        }
        prop_assert_eq!(update_bytes(c, &old, &after[at..at + n]), expected_incremental(&after));
    }

    /// An address and a port changed at once ([`change`] summed, one [`apply`]) give exactly
    /// the checksum of the two changes applied one after the other, for both address sizes
    /// and every checksum, zero and all ones included.
    #[test]
    fn summed_changes_equal_changes_in_turn(
        c in prop_oneof![Just(0u16), Just(0xffff), any::<u16>()],
        v4 in any::<([u8; 4], [u8; 4])>(),
        v6 in any::<([u8; 16], [u8; 16])>(),
        ports in prop_oneof![Just((0u16, 0u16)), Just((0xffff, 0)), any::<(u16, u16)>()],
    ) {
        let (op, np) = ports;
        prop_assert_eq!(
            apply(c, change(&v4.0, &v4.1) + change16(op, np)),
            update16(update_bytes(c, &v4.0, &v4.1), op, np)
        );
        prop_assert_eq!(
            apply(c, change(&v6.0, &v6.1) + change16(op, np)),
            update16(update_bytes(c, &v6.0, &v6.1), op, np)
        );
        prop_assert_eq!(apply(c, change(&v4.0, &v4.1)), update_bytes(c, &v4.0, &v4.1));
    }

    #[test]
    fn pseudo_header_matches_rfc_layout(
        v6 in any::<bool>(),
        src in any::<[u8; 16]>(),
        dst in any::<[u8; 16]>(),
        proto in any::<u8>(),
        len in 0u32..70_000,
    ) {
        let n = if v6 { 16 } else { 4 };
        let mut b = Vec::new();
        b.extend_from_slice(&src[..n]);
        b.extend_from_slice(&dst[..n]);
        if v6 {
            // RFC 8200 section 8.1: 32-bit length, three zero bytes, next header.
            b.extend_from_slice(&len.to_be_bytes());
            b.extend_from_slice(&[0, 0, 0, proto]);
        } else {
            // RFC 9293 section 3.1: zero, protocol, 16-bit length.
            b.extend_from_slice(&[0, proto]);
            b.extend_from_slice(&(len as u16).to_be_bytes());
        }
        let len = if v6 { len } else { len & 0xffff };
        prop_assert_eq!(fold(pseudo_header(&src[..n], &dst[..n], proto, len)), reference_sum(&b));
    }
}

#[test]
fn rfc1624_corners_by_hand() {
    // RFC 1624 section 4: the other header words sum to 0xcd7a and a word 0x5555 becomes
    // 0x3285, so the new data sums to 0xffff. Eqn. 3 gives 0x0000, as recomputation does
    // (eqn. 2 would give 0xffff).
    let mut data = [0xcd, 0x7a, 0x55, 0x55];
    let c = checksum(&data);
    assert_eq!(c, 0xdd2f);
    set_word(&mut data, 2, 0x3285);
    assert_eq!(checksum(&data), 0x0000);
    assert_eq!(update16(c, 0x5555, 0x3285), 0x0000);
    assert_eq!(update_bytes(c, &[0x55, 0x55], &[0x32, 0x85]), 0x0000);
    // Everything zero afterwards: +0 data, where eqn. 3 and recomputation differ by sign.
    let mut d = [0x00, 0x01, 0x00, 0x00];
    let c = checksum(&d);
    d[1] = 0;
    assert_eq!(checksum(&d), 0xffff);
    assert_eq!(update16(c, 1, 0), 0x0000);
}

// ---- packet builders -------------------------------------------------------------------

/// A TCP or UDP packet to build with etherparse.
#[derive(Clone, Debug)]
struct Spec {
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    tcp: bool,
    /// TCP flag byte (FIN SYN RST PSH ACK used).
    flags: u8,
    ttl: u8,
    df: bool,
    /// IPv4 options, a multiple of 4 up to 40 bytes.
    options: Vec<u8>,
    payload: Vec<u8>,
    vlan: Option<u16>,
}

fn build(s: &Spec) -> Vec<u8> {
    let proto = if s.tcp { IpNumber::TCP } else { IpNumber::UDP };
    let ip = match (s.src, s.dst) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mut h = Ipv4Header::new(0, s.ttl, proto, a.octets(), b.octets()).unwrap();
            h.dont_fragment = s.df;
            h.identification = s.sport ^ 0x5a5a;
            h.options = s.options[..]
                .try_into()
                .expect("options are a multiple of 4");
            IpHeaders::Ipv4(h, Default::default())
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => IpHeaders::Ipv6(
            Ipv6Header {
                hop_limit: s.ttl,
                source: a.octets(),
                destination: b.octets(),
                next_header: proto,
                ..Default::default()
            },
            Default::default(),
        ),
        _ => panic!("mixed families"),
    };
    let b = PacketBuilder::ethernet2(s.src_mac, s.dst_mac).ip(ip);
    let mut out = Vec::new();
    if s.tcp {
        let mut h = TcpHeader::new(s.sport, s.dport, 0x0100_0000 ^ s.sport as u32, 64240);
        strait_testkit::frames::set_tcp_flags(&mut h, s.flags);
        h.acknowledgment_number = if h.ack { 7 } else { 0 };
        b.tcp_header(h).write(&mut out, &s.payload).unwrap();
    } else {
        b.udp(s.sport, s.dport).write(&mut out, &s.payload).unwrap();
    }
    if let Some(id) = s.vlan {
        out.splice(12..12, [0x81, 0x00, (id >> 8) as u8 & 0x0f, id as u8]);
    }
    out
}

/// An ICMP error from `router` to `to` quoting `quoted` (an IP packet, cut as routers do):
/// IPv4 "fragmentation needed" or ICMPv6 "packet too big".
fn icmp_error(router: IpAddr, to: IpAddr, quoted: &[u8], mtu: u16) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(CLIENT_MAC, GW_MAC);
    let mut out = Vec::new();
    match (router, to) {
        (IpAddr::V4(r), IpAddr::V4(t)) => b
            .ipv4(r.octets(), t.octets(), 64)
            .icmpv4_raw(3, 4, [0, 0, (mtu >> 8) as u8, mtu as u8])
            .write(&mut out, quoted)
            .unwrap(),
        (IpAddr::V6(r), IpAddr::V6(t)) => b
            .ipv6(r.octets(), t.octets(), 64)
            .icmpv6_raw(2, 0, (mtu as u32).to_be_bytes())
            .write(&mut out, quoted)
            .unwrap(),
        _ => panic!("mixed families"),
    }
    out
}

/// What the independent parser sees in a frame.
#[derive(Debug, PartialEq, Eq)]
struct View {
    src: IpAddr,
    dst: IpAddr,
    ttl: u8,
    proto: u8,
    sport: u16,
    dport: u16,
    payload: Vec<u8>,
}

fn view(frame: &[u8]) -> View {
    let s = SlicedPacket::from_ethernet(frame).expect("output parses");
    let (src, dst, ttl, proto) = match &s.net {
        Some(NetSlice::Ipv4(ip)) => {
            let h = ip.header();
            (
                IpAddr::from(h.source()),
                IpAddr::from(h.destination()),
                h.ttl(),
                ip.payload().ip_number.0,
            )
        }
        Some(NetSlice::Ipv6(ip)) => {
            let h = ip.header();
            (
                IpAddr::from(h.source()),
                IpAddr::from(h.destination()),
                h.hop_limit(),
                ip.payload().ip_number.0,
            )
        }
        _ => panic!("no ip layer"),
    };
    let (sport, dport, payload) = match &s.transport {
        Some(TransportSlice::Tcp(t)) => (t.source_port(), t.destination_port(), t.payload()),
        Some(TransportSlice::Udp(u)) => (u.source_port(), u.destination_port(), u.payload()),
        _ => (0, 0, &[][..]),
    };
    View {
        src,
        dst,
        ttl,
        proto,
        sport,
        dport,
        payload: payload.to_vec(),
    }
}

/// Offset of the IP header: after Ethernet and an 802.1Q tag if any.
fn l3(frame: &[u8]) -> usize {
    if frame[12..14] == [0x81, 0x00] {
        18
    } else {
        14
    }
}

fn service_addr(s: &Service) -> IpAddr {
    s.frontend.vip_addr()
}

fn backends(t: &ServiceTable, s: &Service) -> Vec<(IpAddr, u16)> {
    s.backends
        .iter()
        .map(|id| {
            let b = t.backend(*id).expect("backend exists");
            (b.address(), b.port)
        })
        .collect()
}

// ---- (b) random packets through every mode ---------------------------------------------

/// A random client packet to one of the configured services.
#[derive(Clone, Debug)]
struct Case {
    service: usize,
    /// Client host bits (low 8 used for IPv4, low 64 for IPv6).
    host: u64,
    sport: u16,
    flags: u8,
    ttl: u8,
    df: bool,
    options: Vec<u8>,
    payload: Vec<u8>,
    vlan: Option<u16>,
    /// Bytes of the translated reply an ICMP error quotes, beyond the minimum.
    quote_extra: usize,
    /// The client's checksum is left to offload; and the backend's reply's (nat).
    offload: (bool, bool),
}

fn case() -> impl Strategy<Value = Case> {
    let n = table().services.len();
    (
        0..n,
        any::<u64>(),
        1024u16..,
        prop::sample::select(vec![0x02u8, 0x10, 0x18, 0x11, 0x12, 0x04, 0x14]),
        2u8..,
        prop::bool::weighted(0.8),
        prop_oneof![
            3 => Just(Vec::new()),
            1 => (1usize..=10).prop_flat_map(|w| prop::collection::vec(any::<u8>(), w * 4)),
        ],
        prop_oneof![
            4 => prop::collection::vec(any::<u8>(), 0..64),
            2 => prop::collection::vec(any::<u8>(), 0..=1400),
            // Near the MTU, where encapsulation turns into ICMP "too big".
            1 => prop::collection::vec(any::<u8>(), 1300..=1400),
        ],
        prop::option::weighted(0.2, 1u16..=4094),
        0usize..600,
        any::<(bool, bool)>(),
    )
        .prop_map(
            |(
                service,
                host,
                sport,
                flags,
                ttl,
                df,
                options,
                payload,
                vlan,
                quote_extra,
                offload,
            )| Case {
                service,
                host,
                sport,
                flags,
                ttl,
                df,
                options,
                payload: not_ip_like(payload),
                vlan,
                quote_extra,
                offload,
            },
        )
}

/// The verifier reads a UDP payload that starts with an IP version nibble as GUE and checks
/// it as an inner packet; random payloads must not look like one by accident.
fn not_ip_like(mut payload: Vec<u8>) -> Vec<u8> {
    if let Some(b) = payload.first_mut() {
        if matches!(*b >> 4, 4 | 6) {
            *b ^= 0x80;
        }
    }
    payload
}

fn client(v6: bool, host: u64) -> IpAddr {
    if v6 {
        let mut a = [0u8; 16];
        a[..6].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 2]);
        a[6..8].copy_from_slice(&((host >> 48) as u16).to_be_bytes());
        a[8..].copy_from_slice(&(host | 2).to_be_bytes());
        IpAddr::from(a)
    } else {
        IpAddr::from([192, 0, 2, 2 + (host % 252) as u8])
    }
}

fn router(v6: bool) -> IpAddr {
    if v6 {
        "2001:db8:2::fe".parse().unwrap()
    } else {
        "192.0.2.254".parse().unwrap()
    }
}

fn spec_for(t: &ServiceTable, c: &Case) -> Spec {
    let s = &t.services[c.service];
    let vip = service_addr(s);
    let tcp = s.frontend.proto == strait_dataplane::key::proto::TCP;
    Spec {
        src_mac: CLIENT_MAC,
        dst_mac: GW_MAC,
        src: client(vip.is_ipv6(), c.host),
        dst: vip,
        sport: c.sport,
        dport: s.frontend.port,
        tcp,
        flags: if tcp { c.flags } else { 0 },
        ttl: c.ttl,
        df: c.df,
        options: if vip.is_ipv4() {
            c.options.clone()
        } else {
            Vec::new()
        },
        payload: c.payload.clone(),
        vlan: c.vlan,
    }
}

fn check_tx(v: Verdict, input: &[u8], out: &[u8]) -> Result<(), TestCaseError> {
    prop_assert!(matches!(v, Verdict::Tx { .. }), "{:?}", v);
    if let Err(e) = verify(out) {
        return Err(TestCaseError::fail(format!(
            "{e} after {v:?}\n  in:  {}\n  out: {}",
            hex(input),
            hex(out)
        )));
    }
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `valid` as sent by a sender with checksum offload when `offloaded`, and whether the
/// result's checksum field holds the pseudo-header sum (`offload` leaves such a frame as it
/// is; a valid checksum may happen to equal it).
fn maybe_offloaded(valid: &[u8], offloaded: bool) -> (Vec<u8>, bool) {
    let input = if offloaded {
        offload(valid)
    } else {
        valid.to_vec()
    };
    let partial = offload(&input) == input;
    (input, partial)
}

/// One case: the client's packet, then for nat the backend's reply, then an ICMP error about
/// the flow from a router on the client's side.
fn run_case(c: &Case) -> Result<(), TestCaseError> {
    let t = table();
    let s = &t.services[c.service];
    let spec = spec_for(t, c);
    // What the client's device would send; the gateway gets it with or without offload.
    let valid = build(&spec);
    verify(&valid).map_err(TestCaseError::fail)?;
    let (input, partial) = maybe_offloaded(&valid, c.offload.0);
    let mut pipe = Pipeline::new(0, 1, 4096, t.timeouts, 0);
    let mut now = SEC;
    let (v, out) = run_with(&mut pipe, t, now, &input);
    prop_assert!(pipe.counters.balanced());
    let sent = matches!(v, Verdict::Tx { .. });
    prop_assert_eq!(
        pipe.counters.checksum_completed,
        (partial && sent) as u64,
        "completions counted"
    );

    let members: Vec<_> = s.members.iter().map(|id| t.backend(*id).unwrap()).collect();
    let encap = matches!(s.mode, Mode::DsrIpip | Mode::DsrGue);
    let ip_len = input.len() - l3(&input);
    // Encapsulation overhead toward each member (tunnel targets may be of either family).
    let overheads: Vec<usize> = members
        .iter()
        .map(|b| match (s.mode, b.tunnel_target().is_ipv6()) {
            (Mode::DsrIpip, false) => 20,
            (Mode::DsrIpip, true) => 40,
            (Mode::DsrGue, false) => 28,
            (Mode::DsrGue, true) => 48,
            _ => 0,
        })
        .collect();
    let fits_some = overheads.iter().any(|o| ip_len + o <= 1500);
    let fits_all = overheads.iter().all(|o| ip_len + o <= 1500);
    if members.is_empty() {
        prop_assert_eq!(v, Verdict::Drop(DropReason::NoBackend));
        return Ok(());
    }
    if !s.allows_addr(spec.src) {
        prop_assert_eq!(v, Verdict::Drop(DropReason::SourceNotAllowed));
        return Ok(());
    }
    if members.iter().all(|b| b.mac.is_none()) {
        prop_assert_eq!(v, Verdict::Drop(DropReason::NoNextHop));
        return Ok(());
    }
    let v4_no_df = spec.src.is_ipv4() && !spec.df;
    if encap && v4_no_df && v == Verdict::Drop(DropReason::MtuExceeded) {
        // Too big to encapsulate and may not be answered: only possible near the MTU.
        prop_assert!(!fits_all);
        return Ok(());
    }
    check_tx(v, &input, &out)?;
    let seen = view(&out);
    let sent = view(&input);
    match s.mode {
        Mode::DsrL2 => {
            prop_assert_eq!(
                &out[12..],
                &valid[12..],
                "dsr-l2 leaves the IP packet alone (its checksum completed)"
            );
        }
        Mode::DsrIpip | Mode::DsrGue if !(matches!(seen.proto, 1 | 58) && seen.dst == spec.src) => {
            prop_assert!(fits_some, "encapsulated {ip_len} bytes past the MTU");
            let inner = &valid[l3(&valid)..];
            prop_assert_eq!(
                &out[out.len() - inner.len()..],
                inner,
                "inner packet untouched"
            );
        }
        Mode::DsrIpip | Mode::DsrGue => {
            // Answered with "too big", back out of the port it came in on.
            prop_assert!(!fits_all, "{ip_len} bytes fit but were refused");
            prop_assert_eq!(v, Verdict::Tx { port: 0 });
            prop_assert_eq!(seen.src, spec.dst);
            prop_assert_eq!(seen.dst, spec.src);
            prop_assert!(seen.proto == 1 || seen.proto == 58);
        }
        Mode::Nat => {
            let bs = backends(t, s);
            prop_assert!(
                bs.iter().any(|&(a, p)| a == seen.dst && p == seen.dport),
                "nat to a backend of the service: {:?}",
                seen
            );
            prop_assert_eq!((seen.src, seen.sport), (sent.src, sent.sport));
            prop_assert_eq!(seen.ttl, sent.ttl - 1);
            prop_assert_eq!(&seen.payload, &sent.payload);
            if spec.tcp && spec.flags & 0x04 != 0 {
                // A RST for an unknown flow creates no state: no reply to translate.
                return Ok(());
            }
            // The backend answers.
            now += SEC / 1000;
            let reply_spec = Spec {
                src_mac: out[0..6].try_into().unwrap(),
                dst_mac: GW_MAC,
                src: seen.dst,
                dst: seen.src,
                sport: seen.dport,
                dport: seen.sport,
                flags: 0x12,
                ttl: 64,
                options: Vec::new(),
                payload: not_ip_like(c.payload.iter().rev().copied().collect()),
                ..spec.clone()
            };
            let reply_valid = build(&reply_spec);
            let (reply, reply_partial) = maybe_offloaded(&reply_valid, c.offload.1);
            let (v, back) = run_with(&mut pipe, t, now, &reply);
            check_tx(v, &reply, &back)?;
            prop_assert_eq!(
                pipe.counters.checksum_completed,
                partial as u64 + reply_partial as u64,
                "completions counted"
            );
            let r = view(&back);
            prop_assert_eq!(
                (r.src, r.sport),
                (spec.dst, spec.dport),
                "reply from the VIP"
            );
            prop_assert_eq!((r.dst, r.dport), (spec.src, spec.sport), "to the client");
            prop_assert_eq!(r.ttl, 63);
            prop_assert_eq!(&back[0..6], &CLIENT_MAC[..]);
            prop_assert_eq!(&r.payload, &reply_spec.payload);

            // A router between gateway and client finds that reply too big and says so,
            // quoting it; the error must reach the backend, translated, checksums valid.
            let ip = &back[l3(&back)..];
            let min = if spec.src.is_ipv6() {
                48
            } else {
                ip[0] as usize % 16 * 4 + 8
            };
            let quoted = &ip[..(min + c.quote_extra).min(ip.len())];
            let err = icmp_error(router(spec.src.is_ipv6()), spec.dst, quoted, 1280);
            verify(&err).map_err(TestCaseError::fail)?;
            now += SEC / 1000;
            let (v, fwd) = run_with(&mut pipe, t, now, &err);
            check_tx(v, &err, &fwd)?;
            let f = view(&fwd);
            prop_assert_eq!(f.dst, seen.dst, "error goes to the flow's backend");
            let e = &fwd[l3(&fwd) + if spec.src.is_ipv6() { 48 } else { 28 }..];
            let (esrc, eport) = if spec.src.is_ipv6() {
                (
                    IpAddr::from(<[u8; 16]>::try_from(&e[8..24]).unwrap()),
                    &e[40..42],
                )
            } else {
                let hl = (e[0] & 0x0f) as usize * 4;
                (
                    IpAddr::from(<[u8; 4]>::try_from(&e[12..16]).unwrap()),
                    &e[hl..hl + 2],
                )
            };
            prop_assert_eq!(esrc, seen.dst, "embedded source is the backend again");
            prop_assert_eq!(u16::from_be_bytes([eport[0], eport[1]]), seen.dport);
            if spec.src.is_ipv4() {
                let hl = (e[0] & 0x0f) as usize * 4;
                prop_assert_eq!(
                    fold(sum(0, &e[..hl])),
                    0xffff,
                    "embedded ipv4 header checksum"
                );
            }
            // More: the quote is the backend's own reply again, byte for byte as far as it
            // goes (transport checksum included, when quoted), but for the TTL the gateway
            // took and the IPv4 header checksum that covers it.
            prop_assert_eq!(e.len(), quoted.len());
            let mut got = e.to_vec();
            let mut want = reply_valid[l3(&reply_valid)..][..quoted.len()].to_vec();
            let mut skip = if spec.src.is_ipv6() {
                vec![7]
            } else {
                vec![8, 10, 11]
            };
            // A quote that stops half-way through the transport checksum cannot be fixed
            // (nor checked by anyone); that one byte stays as it left the gateway.
            let hl = if spec.src.is_ipv6() {
                40
            } else {
                (e[0] & 0x0f) as usize * 4
            };
            let csum = hl + if spec.tcp { 16 } else { 6 };
            if quoted.len() == csum + 1 {
                skip.push(csum);
            }
            for i in &skip {
                got[*i] = 0;
                want[*i] = 0;
            }
            prop_assert_eq!(
                hex(&got),
                hex(&want),
                "embedded packet restored to the backend's reply"
            );
        }
    }
    if s.mode != Mode::Nat {
        // An ICMP error about the VIP's direct reply to the client (DSR: the backend sent it
        // from the VIP) goes to the flow's backend the way the flow's packets do.
        let direct = build(&Spec {
            src_mac: GW_MAC,
            dst_mac: CLIENT_MAC,
            src: spec.dst,
            dst: spec.src,
            sport: spec.dport,
            dport: spec.sport,
            flags: 0x12,
            ttl: 64,
            vlan: None,
            ..spec.clone()
        });
        let ip = &direct[14..];
        let min = if spec.src.is_ipv6() {
            48
        } else {
            ip[0] as usize % 16 * 4 + 8
        };
        let quoted = &ip[..(min + c.quote_extra).min(ip.len())];
        let err = icmp_error(router(spec.src.is_ipv6()), spec.dst, quoted, 1280);
        now += SEC / 1000;
        let (v, fwd) = run_with(&mut pipe, t, now, &err);
        if encap && v4_no_df && v == Verdict::Drop(DropReason::MtuExceeded) {
            return Ok(());
        }
        check_tx(v, &err, &fwd)?;
    }
    prop_assert!(pipe.counters.balanced());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6000, ..config() })]

    #[test]
    fn every_tx_has_valid_checksums_and_nat_round_trips(c in case()) {
        run_case(&c)?;
    }

    /// RFC 768: an IPv4 UDP checksum of zero means "none"; nat must not turn it into a
    /// checksum (that would be a wrong one: the incremental update starts from nothing).
    #[test]
    fn ipv4_udp_without_checksum_stays_without(
        host in any::<u64>(),
        sport in 1024u16..,
        payload in prop::collection::vec(any::<u8>(), 0..1400),
        ttl in 2u8..,
    ) {
        let t = table();
        let dns = t.services.iter().position(|s| s.name == "nat-v4-dns").unwrap();
        let c = Case {
            service: dns,
            host,
            sport,
            flags: 0,
            ttl,
            df: true,
            options: Vec::new(),
            payload: not_ip_like(payload),
            vlan: None,
            quote_extra: 0,
            offload: (false, false),
        };
        let mut input = build(&spec_for(t, &c));
        input[40..42].copy_from_slice(&[0, 0]);
        verify(&input).map_err(TestCaseError::fail)?;
        let mut pipe = Pipeline::new(0, 1, 4096, t.timeouts, 0);
        let (v, out) = run_with(&mut pipe, t, SEC, &input);
        check_tx(v, &input, &out)?;
        prop_assert_eq!(&out[40..42], &[0u8, 0][..], "forward keeps 'no checksum'");
        let seen = view(&out);
        let mut reply = build(&Spec {
            src_mac: out[0..6].try_into().unwrap(),
            dst_mac: GW_MAC,
            src: seen.dst,
            dst: seen.src,
            sport: seen.dport,
            dport: seen.sport,
            tcp: false,
            flags: 0,
            ttl: 64,
            df: true,
            options: Vec::new(),
            payload: seen.payload.clone(),
            vlan: None,
        });
        reply[40..42].copy_from_slice(&[0, 0]);
        let (v, back) = run_with(&mut pipe, t, SEC + 1, &reply);
        check_tx(v, &reply, &back)?;
        prop_assert_eq!(&back[40..42], &[0u8, 0][..], "reply keeps 'no checksum'");
    }
}

#[test]
fn config_covers_every_mode_in_both_families() {
    let t = table();
    for mode in Mode::ALL {
        for v6 in [false, true] {
            assert!(
                t.services
                    .iter()
                    .any(|s| s.mode == mode && service_addr(s).is_ipv6() == v6),
                "{mode:?} v6={v6} missing from all_modes.toml"
            );
        }
    }
}

// ---- fuzz seeds ------------------------------------------------------------------------

/// Encodes a `pipeline` fuzz input (format in `fuzz/src/lib.rs`).
fn fuzz_input(knobs: u8, clock: u8, frames: &[&[u8]]) -> Vec<u8> {
    let mut b = vec![knobs, clock];
    for f in frames {
        b.extend_from_slice(&(f.len() as u16).to_be_bytes());
        b.extend_from_slice(f);
    }
    b
}

/// Sets the IPv4 fragment word of an untagged frame and fixes the header checksum.
fn ipv4_fragment(frame: &mut [u8], word: u16) {
    frame[20..22].copy_from_slice(&word.to_be_bytes());
    frame[24..26].copy_from_slice(&[0, 0]);
    let hl = (frame[14] & 0x0f) as usize * 4;
    let c = checksum(&frame[14..14 + hl]);
    frame[24..26].copy_from_slice(&c.to_be_bytes());
}

/// An IPv6 UDP datagram carried in fragments: the first (with the UDP header) and a later
/// one, each behind a fragment header; and a TCP segment behind Hop-by-Hop and Destination
/// Options headers.
fn ipv6_extension_frames() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    use etherparse::{IpFragOffset, Ipv6Extensions, Ipv6FragmentHeader, Ipv6RawExtHeader};
    let src: std::net::Ipv6Addr = "2001:db8:2::7".parse().unwrap();
    let dst: std::net::Ipv6Addr = "2001:db8::13".parse().unwrap();
    let frag = |offset: u16, more: bool| {
        let exts = Ipv6Extensions {
            fragment: Some(Ipv6FragmentHeader::new(
                IpNumber::UDP,
                IpFragOffset::try_new(offset).unwrap(),
                more,
                0x1234_5678,
            )),
            ..Default::default()
        };
        let h = Ipv6Header {
            hop_limit: 64,
            source: src.octets(),
            destination: dst.octets(),
            ..Default::default()
        };
        let mut out = Vec::new();
        PacketBuilder::ethernet2(CLIENT_MAC, GW_MAC)
            .ip(IpHeaders::Ipv6(h, exts))
            .udp(5000, 53)
            .write(&mut out, &[0x42; 64])
            .unwrap();
        out
    };
    let first = frag(0, true);
    // A later fragment: same headers, no UDP header in its data.
    let mut later = first.clone();
    later[56..58].copy_from_slice(&(185u16 << 3).to_be_bytes());
    let exts = Ipv6Extensions {
        hop_by_hop_options: Some(
            Ipv6RawExtHeader::new_raw(IpNumber(0), &[1, 4, 0, 0, 0, 0]).unwrap(),
        ),
        destination_options: Some(
            Ipv6RawExtHeader::new_raw(IpNumber(0), &[1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
                .unwrap(),
        ),
        ..Default::default()
    };
    let h = Ipv6Header {
        hop_limit: 64,
        source: src.octets(),
        destination: dst.octets(),
        ..Default::default()
    };
    let mut ext = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, GW_MAC)
        .ip(IpHeaders::Ipv6(h, exts))
        .tcp(40000, 80, 1, 64240)
        .syn()
        .write(&mut ext, &[])
        .unwrap();
    (first, later, ext)
}

/// Writes `fuzz/seeds/{parse,pipeline}/*` from realistic frames. Run after changing the
/// configuration or the input format:
/// `cargo test -p strait-tests --test checksum_props -- --ignored gen_fuzz_seeds`.
#[test]
#[ignore = "writes fuzz/seeds; run by hand"]
fn gen_fuzz_seeds() {
    let t = table();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
    let mut parse_seeds: Vec<(String, Vec<u8>)> = Vec::new();
    let mut pipe_seeds: Vec<(String, Vec<u8>)> = Vec::new();
    let base = |service: usize, flags: u8, payload: &[u8]| Case {
        service,
        host: 7,
        sport: 40000,
        flags,
        ttl: 64,
        df: true,
        options: Vec::new(),
        payload: payload.to_vec(),
        vlan: None,
        quote_extra: 0,
        offload: (false, false),
    };
    for (i, s) in t.services.iter().enumerate() {
        let fam = if service_addr(s).is_ipv6() {
            "v6"
        } else {
            "v4"
        };
        let first = build(&spec_for(t, &base(i, 0x02, b"")));
        let data = build(&spec_for(t, &base(i, 0x18, b"GET / HTTP/1.1\r\n\r\n")));
        let fin = build(&spec_for(t, &base(i, 0x11, b"")));
        parse_seeds.push((
            format!(
                "{}-{fam}-{}",
                if s.frontend.proto == strait_dataplane::key::proto::TCP {
                    "syn"
                } else {
                    "udp"
                },
                s.name
            ),
            first.clone(),
        ));
        // Open, use and close the flow; reflect each Tx so nat replies come back.
        pipe_seeds.push((
            format!("flow-{}", s.name),
            fuzz_input(0x20, 1, &[&first, &data, &fin]),
        ));
    }
    let svc = |name: &str| t.services.iter().position(|s| s.name == name).unwrap();

    // A nat flow, the backend's reply by hand, then an ICMP error about the translated
    // reply from a router on the client side.
    let nat = svc("nat-v4");
    let syn = build(&spec_for(t, &base(nat, 0x02, b"")));
    let mut pipe = Pipeline::new(0, 1, 1024, t.timeouts, 0);
    let (_, out) = run_with(&mut pipe, t, SEC, &syn);
    let seen = view(&out);
    let reply = build(&Spec {
        src_mac: out[0..6].try_into().unwrap(),
        dst_mac: GW_MAC,
        src: seen.dst,
        dst: seen.src,
        sport: seen.dport,
        dport: seen.sport,
        flags: 0x12,
        ..spec_for(t, &base(nat, 0x12, b""))
    });
    let (_, back) = run_with(&mut pipe, t, SEC, &reply);
    let err = icmp_error(
        router(false),
        spec_for(t, &base(nat, 0, b"")).dst,
        &back[14..14 + 28],
        1280,
    );
    parse_seeds.push(("nat-reply-v4".into(), reply.clone()));
    parse_seeds.push(("icmp-frag-needed-v4".into(), err.clone()));
    pipe_seeds.push((
        "nat-reply-icmp-v4".into(),
        fuzz_input(0, 1, &[&syn, &reply, &err]),
    ));

    let nat6 = svc("nat-v6");
    let syn6 = build(&spec_for(t, &base(nat6, 0x02, b"")));
    let (_, out6) = run_with(&mut pipe, t, SEC, &syn6);
    let seen6 = view(&out6);
    let reply6 = build(&Spec {
        src_mac: out6[0..6].try_into().unwrap(),
        dst_mac: GW_MAC,
        src: seen6.dst,
        dst: seen6.src,
        sport: seen6.dport,
        dport: seen6.sport,
        ..spec_for(t, &base(nat6, 0x12, b""))
    });
    let (_, back6) = run_with(&mut pipe, t, SEC, &reply6);
    let err6 = icmp_error(
        router(true),
        spec_for(t, &base(nat6, 0, b"")).dst,
        &back6[14..],
        1280,
    );
    parse_seeds.push(("nat-reply-v6".into(), reply6.clone()));
    parse_seeds.push(("icmpv6-too-big".into(), err6.clone()));
    pipe_seeds.push((
        "nat-reply-icmp-v6".into(),
        fuzz_input(0, 1, &[&syn6, &reply6, &err6]),
    ));

    // IPv4 fragments of a nat UDP datagram and of a dsr-gue one.
    for name in ["nat-v4-dns", "gue-v4-udp"] {
        let mut first = build(&spec_for(t, &base(svc(name), 0, &[7; 64])));
        ipv4_fragment(&mut first, 0x2000);
        let mut later = first.clone();
        ipv4_fragment(&mut later, 1480 / 8);
        parse_seeds.push((format!("frag-first-{name}"), first.clone()));
        parse_seeds.push((format!("frag-later-{name}"), later.clone()));
        pipe_seeds.push((format!("frags-{name}"), fuzz_input(0, 1, &[&first, &later])));
    }
    let (f6, l6, ext6) = ipv6_extension_frames();
    parse_seeds.push(("frag-first-v6".into(), f6.clone()));
    parse_seeds.push(("frag-later-v6".into(), l6.clone()));
    parse_seeds.push(("ipv6-hbh-dstopts-syn".into(), ext6.clone()));
    pipe_seeds.push(("frags-v6".into(), fuzz_input(0x20, 1, &[&f6, &l6, &ext6])));

    // VLAN-tagged and IPv4-options SYNs.
    let mut tagged = base(svc("l2-v4"), 0x02, b"");
    tagged.vlan = Some(100);
    let tagged = build(&spec_for(t, &tagged));
    let mut opts = base(svc("ipip-v4"), 0x02, b"");
    opts.options = vec![0x94, 0x04, 0, 0, 1, 1, 1, 0];
    let opts = build(&spec_for(t, &opts));
    parse_seeds.push(("vlan-syn-v4".into(), tagged.clone()));
    parse_seeds.push(("ipv4-options-syn".into(), opts.clone()));
    pipe_seeds.push((
        "vlan-and-options".into(),
        fuzz_input(0x20, 1, &[&tagged, &opts]),
    ));

    // Too big to encapsulate: at MTU 576 (knob 3), an ordinary segment gets ICMP back, with
    // no tailroom behind it.
    let big = build(&spec_for(t, &base(svc("gue-v6"), 0x10, &[0x61; 600])));
    let big4 = build(&spec_for(t, &base(svc("ipip-v4"), 0x10, &[0x61; 600])));
    pipe_seeds.push(("too-big".into(), fuzz_input(0x03 | 0x04, 1, &[&big, &big4])));
    // Four cores (handoff), a one-bucket table, a rate cap, and a clock that expires flows.
    let syns: Vec<Vec<u8>> = (0..6u64)
        .map(|h| {
            let mut c = base(nat, 0x02, b"");
            c.host = h;
            c.sport = 30000 + h as u16;
            build(&spec_for(t, &c))
        })
        .collect();
    let refs: Vec<&[u8]> = syns.iter().map(|v| &v[..]).collect();
    pipe_seeds.push((
        "cores-table-rate".into(),
        fuzz_input(0x10 | 0x40 | 0x80, 0x7f, &refs),
    ));

    // Not for the pipeline: ARP goes to the kernel.
    let mut arp = vec![0xffu8; 6];
    arp.extend_from_slice(&CLIENT_MAC);
    arp.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    arp.extend_from_slice(&[0; 20]);
    parse_seeds.push(("arp".into(), arp));

    for (dir, seeds) in [("parse", &parse_seeds), ("pipeline", &pipe_seeds)] {
        let d = root.join(dir);
        std::fs::create_dir_all(&d).unwrap();
        for e in std::fs::read_dir(&d).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
        for (name, bytes) in seeds {
            std::fs::write(d.join(format!("{name}.bin")), bytes).unwrap();
        }
    }
    // Every parse seed also goes to the pipeline on its own, with default knobs.
    for (name, bytes) in &parse_seeds {
        let b = fuzz_input(0x20, 1, &[bytes]);
        std::fs::write(root.join("pipeline").join(format!("one-{name}.bin")), b).unwrap();
    }
}
