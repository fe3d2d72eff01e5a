//! The parser's fast path against its generic path: on every frame, [`parse_into`] (which
//! tries [`parse_fast`] and falls back) and [`parse_generic`] give the same result and the
//! same [`Parsed`], field for field, starting from a summary left over from another frame.
//! The frames are built with etherparse, an independent writer, in every variation the fast
//! path distinguishes (802.1Q, IPv4 options, fragments, DF, TTL and TOS, TCP options, TCP,
//! UDP, SCTP, ICMP and other protocols, IPv6, checksums valid, left to offload, zero or
//! wrong, header checksums wrong), then cut at every length and mutated at random.

use core::cell::Cell;

use etherparse::{
    EtherType, Ethernet2Header, IpDscp, IpEcn, IpFragOffset, IpNumber, Ipv4Header, Ipv4Options,
    PacketBuilder, SingleVlanHeader, TcpHeader, UdpHeader, VlanId, VlanPcp,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::parse::{parse_fast, parse_generic, parse_into, Embedded, Frag, Parsed};
use crate::key::{Addr, FlowKey, Proto};
use crate::stats::DropReason;

/// A summary with every field away from its default, as a frame of another kind leaves it
/// in the pipeline's reused slots: a path that forgets a field shows here.
fn stale() -> Parsed {
    Parsed {
        l3: 99,
        v6: true,
        ip_len: 9999,
        key: FlowKey {
            src: Addr([0xaa; 16]),
            dst: Addr([0xbb; 16]),
            src_port: 3,
            dst_port: 4,
            proto: Proto(58),
        },
        l4: 77,
        ttl: 1,
        tos: 2,
        df: true,
        frag: Frag::Later,
        tcp_flags: 0xff,
        l4_partial: true,
        icmp_type: 5,
        embedded: Some(Embedded {
            ip: 1,
            l4: 2,
            src: Addr([0xcc; 16]),
            dst: Addr([0xdd; 16]),
            proto: Proto(6),
            src_port: 6,
            dst_port: 7,
            end: 8,
        }),
    }
}

/// Both paths on `frame`, each from a stale summary; whether the fast path took it.
fn same(frame: &[u8]) -> Result<bool, TestCaseError> {
    let (mut fast, mut generic) = (stale(), stale());
    let took = parse_fast(frame, &mut stale());
    let r = parse_into(frame, &mut fast);
    let g = parse_generic(frame, &mut generic);
    prop_assert_eq!(r, g, "result of {:02x?}", frame);
    prop_assert_eq!(fast, generic, "summary of {:02x?}", frame);
    if took {
        prop_assert_eq!(
            g,
            Ok(true),
            "the fast path took a frame the generic one refuses"
        );
    }
    Ok(took)
}

/// What the transport checksum field holds.
#[derive(Clone, Copy, Debug)]
enum Csum {
    Valid,
    /// The pseudo-header sum only, as a sender leaving it to offload writes it.
    Partial,
    Zero,
    Other(u16),
}

/// The upper layer of a generated IPv4 packet.
#[derive(Clone, Debug)]
enum Upper {
    Tcp {
        flags: u8,
        options: usize,
        csum: Csum,
    },
    Udp {
        csum: Csum,
    },
    Sctp {
        chunk: u8,
    },
    IcmpError {
        quote: usize,
    },
    IcmpEcho,
    Other(u8),
}

/// One generated frame, before it is cut or mutated.
#[derive(Clone, Debug)]
struct Spec {
    vlan: Option<u16>,
    options: usize,
    df: bool,
    mf: bool,
    offset: u16,
    ttl: u8,
    dscp: u8,
    ecn: u8,
    bad_header_checksum: Option<u16>,
    upper: Upper,
    payload: Vec<u8>,
    padding: usize,
    ports: (u16, u16),
}

fn csum() -> impl Strategy<Value = Csum> {
    prop_oneof![
        4 => Just(Csum::Valid),
        2 => Just(Csum::Partial),
        1 => Just(Csum::Zero),
        1 => any::<u16>().prop_map(Csum::Other),
    ]
}

fn upper() -> impl Strategy<Value = Upper> {
    prop_oneof![
        6 => (any::<u8>(), prop_oneof![3 => Just(0usize), 1 => 1usize..=10], csum())
            .prop_map(|(flags, options, csum)| Upper::Tcp { flags, options: options * 4, csum }),
        4 => csum().prop_map(|csum| Upper::Udp { csum }),
        1 => any::<u8>().prop_map(|chunk| Upper::Sctp { chunk }),
        1 => (0usize..40).prop_map(|quote| Upper::IcmpError { quote }),
        1 => Just(Upper::IcmpEcho),
        1 => prop_oneof![Just(47u8), Just(4), Just(41), any::<u8>()].prop_map(Upper::Other),
    ]
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        (
            prop_oneof![3 => Just(None), 1 => (0u16..4096).prop_map(Some)],
            prop_oneof![4 => Just(0usize), 1 => 1usize..=10],
            any::<bool>(),
            prop_oneof![6 => Just(false), 1 => Just(true)],
            prop_oneof![6 => Just(0u16), 1 => 0u16..8192],
            any::<u8>(),
            0u8..64,
            0u8..4,
        ),
        (
            prop_oneof![8 => Just(None), 1 => (1u16..).prop_map(Some)],
            upper(),
            proptest::collection::vec(any::<u8>(), 0..48),
            prop_oneof![3 => Just(0usize), 1 => 1usize..12],
            any::<(u16, u16)>(),
        ),
    )
        .prop_map(
            |(
                (vlan, options, df, mf, offset, ttl, dscp, ecn),
                (bad_header_checksum, upper, payload, padding, ports),
            )| Spec {
                vlan,
                options: options * 4,
                df,
                mf,
                offset,
                ttl,
                dscp,
                ecn,
                bad_header_checksum,
                upper,
                payload,
                padding,
                ports,
            },
        )
}

const MACS: ([u8; 6], [u8; 6]) = ([2, 0, 0, 0, 0, 0xc1], [2, 0, 0, 0, 0, 1]);
const CLIENT: [u8; 4] = [192, 0, 2, 7];
const VIP: [u8; 4] = [203, 0, 113, 10];

/// The Ethernet header (and tag) for a payload of `ethertype`.
fn link(vlan: Option<u16>, ethertype: u16) -> Vec<u8> {
    let outer = if vlan.is_some() { 0x8100 } else { ethertype };
    let mut f = Ethernet2Header {
        source: MACS.0,
        destination: MACS.1,
        ether_type: EtherType(outer),
    }
    .to_bytes()
    .to_vec();
    if let Some(id) = vlan {
        let tag = SingleVlanHeader {
            pcp: VlanPcp::try_new(3).unwrap(),
            drop_eligible_indicator: false,
            vlan_id: VlanId::try_new(id).unwrap(),
            ether_type: EtherType(ethertype),
        };
        f.extend_from_slice(&tag.to_bytes());
    }
    f
}

/// The folded pseudo-header sum of an IPv4 segment, as an offloading sender writes it,
/// summed here by hand.
fn pseudo(ip: &Ipv4Header, proto: u8, len: usize) -> u16 {
    let mut acc = proto as u32 + len as u32;
    for c in ip.source.chunks(2).chain(ip.destination.chunks(2)) {
        acc += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

fn build(s: &Spec) -> Vec<u8> {
    let (proto, l4): (u8, Vec<u8>) = match &s.upper {
        Upper::Tcp { flags, options, .. } => {
            let mut t = TcpHeader::new(s.ports.0, s.ports.1, 0x0102_0304, 64240);
            strait_testkit::frames::set_tcp_flags(&mut t, *flags);
            // NOPs, then an end of options.
            let mut o = vec![1u8; *options];
            if let Some(last) = o.last_mut() {
                *last = 0;
            }
            t.set_options_raw(&o).unwrap();
            let mut b = t.to_bytes().to_vec();
            b.extend_from_slice(&s.payload);
            (6, b)
        }
        Upper::Udp { .. } => {
            let u = UdpHeader {
                source_port: s.ports.0,
                destination_port: s.ports.1,
                length: (8 + s.payload.len()) as u16,
                checksum: 0,
            };
            let mut b = u.to_bytes().to_vec();
            b.extend_from_slice(&s.payload);
            (17, b)
        }
        Upper::Sctp { chunk } => {
            let mut b = Vec::new();
            b.extend_from_slice(&s.ports.0.to_be_bytes());
            b.extend_from_slice(&s.ports.1.to_be_bytes());
            b.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, *chunk, 0, 0, 4]);
            b.extend_from_slice(&s.payload);
            (132, b)
        }
        Upper::IcmpError { quote } => {
            let mut inner = Vec::new();
            PacketBuilder::ipv4(VIP, CLIENT, 64)
                .tcp(s.ports.1, s.ports.0, 7, 1000)
                .write(&mut inner, &s.payload)
                .unwrap();
            let mut b = vec![3, 4, 0, 0, 0, 0, 5, 0xdc];
            b.extend_from_slice(&inner[..(*quote).min(inner.len())]);
            (1, b)
        }
        Upper::IcmpEcho => {
            let mut b = vec![8, 0, 0, 0, 0, 1, 0, 2];
            b.extend_from_slice(&s.payload);
            (1, b)
        }
        Upper::Other(p) => (*p, s.payload.clone()),
    };
    let mut ip = Ipv4Header::new(l4.len() as u16, s.ttl, IpNumber(proto), CLIENT, VIP).unwrap();
    ip.dscp = IpDscp::try_new(s.dscp).unwrap();
    ip.ecn = IpEcn::try_new(s.ecn).unwrap();
    ip.identification = 0x1234;
    ip.dont_fragment = s.df;
    ip.more_fragments = s.mf;
    ip.fragment_offset = IpFragOffset::try_new(s.offset).unwrap();
    let options: Vec<u8> = (0..s.options).map(|i| [1, 1, 1, 0][i % 4]).collect();
    ip.options = Ipv4Options::try_from(&options[..]).unwrap();
    ip.set_payload_len(l4.len()).unwrap();
    ip.header_checksum = ip.calc_header_checksum();
    if let Some(x) = s.bad_header_checksum {
        ip.header_checksum ^= x;
    }
    let mut l4 = l4;
    let field = match (&s.upper, proto) {
        (Upper::Tcp { csum, .. }, _) => Some((16, *csum)),
        (Upper::Udp { csum }, _) => Some((6, *csum)),
        _ => None,
    };
    if let Some((at, c)) = field {
        let value = match c {
            Csum::Valid if proto == 6 => {
                let (t, payload) = TcpHeader::from_slice(&l4).unwrap();
                t.calc_checksum_ipv4(&ip, payload).unwrap()
            }
            Csum::Valid => {
                let (u, payload) = UdpHeader::from_slice(&l4).unwrap();
                u.calc_checksum_ipv4(&ip, payload).unwrap()
            }
            Csum::Partial => pseudo(&ip, proto, l4.len()),
            Csum::Zero => 0,
            Csum::Other(v) => v,
        };
        l4[at..at + 2].copy_from_slice(&value.to_be_bytes());
    }
    let mut f = link(s.vlan, 0x0800);
    f.extend_from_slice(&ip.to_bytes());
    f.extend_from_slice(&l4);
    f.resize(f.len() + s.padding, 0);
    f
}

/// Frames the generic path alone reads: IPv6, ARP, QinQ, a tag on a tag.
fn others(payload: &[u8], vlan: Option<u16>) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let c6 = [0x20, 0x01, 0x0d, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];
    let v6 = [
        0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
    ];
    let mut f = link(vlan, 0x86dd);
    PacketBuilder::ipv6(c6, v6, 64)
        .tcp(40000, 443, 1, 1000)
        .write(&mut f, payload)
        .unwrap();
    out.push(f);
    let mut f = link(vlan, 0x86dd);
    PacketBuilder::ipv6(c6, v6, 64)
        .udp(40000, 53)
        .write(&mut f, payload)
        .unwrap();
    out.push(f);
    let mut f = link(vlan, 0x0806);
    f.extend_from_slice(payload);
    out.push(f);
    // A service tag, and a tag on a tag, around an IPv4 TCP packet.
    for outer in [0x88a8u16, 0x8100] {
        let mut f = link(None, outer);
        f.extend_from_slice(&[0, 5, 0x81, 0x00, 0, 6, 0x08, 0x00]);
        PacketBuilder::ipv4(CLIENT, VIP, 64)
            .tcp(40000, 80, 1, 1000)
            .write(&mut f, payload)
            .unwrap();
        out.push(f);
    }
    out
}

/// Every cut of `f`, `f` itself included.
fn every_cut(f: &[u8]) -> Result<usize, TestCaseError> {
    let mut took = 0;
    for len in 0..=f.len() {
        took += same(&f[..len])? as usize;
    }
    Ok(took)
}

/// The whole frame, every cut of it, and mutations of it: `flips` XOR a byte each.
fn check(f: &[u8], flips: &[(usize, u8)]) -> Result<usize, TestCaseError> {
    let mut took = every_cut(f)?;
    let mut m = f.to_vec();
    for &(at, x) in flips {
        if m.is_empty() {
            break;
        }
        let at = at % m.len();
        m[at] ^= x;
        took += same(&m)? as usize;
    }
    // The same flips within the headers the fast path reads, where they matter most.
    let mut m = f.to_vec();
    for &(at, x) in flips {
        let at = at % m.len().min(60);
        m[at] ^= x;
        took += same(&m)? as usize;
    }
    Ok(took)
}

fn flips() -> impl Strategy<Value = Vec<(usize, u8)>> {
    proptest::collection::vec((any::<usize>(), 1u8..), 0..8)
}

/// The fast path and the generic path agree on IPv4 frames of every kind, cut and mutated,
/// and the fast path takes a good share of them (else the agreement would prove nothing).
#[test]
fn fast_and_generic_paths_agree_on_ipv4_frames() {
    let whole = Cell::new(0usize);
    let taken = Cell::new(0usize);
    let mut runner = TestRunner::new(Config {
        cases: 2048,
        ..Config::default()
    });
    runner
        .run(&(spec(), flips()), |(s, flips)| {
            let f = build(&s);
            whole.set(whole.get() + 1);
            taken.set(taken.get() + same(&f)? as usize);
            check(&f, &flips)?;
            Ok(())
        })
        .unwrap();
    // About half the frames are plain TCP or UDP that the fast path must take.
    assert!(
        taken.get() * 5 > whole.get(),
        "the fast path took {} of {} whole frames",
        taken.get(),
        whole.get()
    );
}

proptest! {
    #![proptest_config(Config { cases: 512, ..Config::default() })]

    /// Frames the fast path leaves to the generic one, and random bytes, agree too.
    #[test]
    fn fast_and_generic_paths_agree_on_other_frames(
        payload in proptest::collection::vec(any::<u8>(), 0..40),
        vlan in proptest::option::of(0u16..4096),
        flips in flips(),
        noise in proptest::collection::vec(any::<u8>(), 0..80),
    ) {
        for f in others(&payload, vlan) {
            check(&f, &flips)?;
        }
        every_cut(&noise)?;
        // Noise behind a plausible untagged IPv4 start.
        let mut f = link(None, 0x0800);
        f.push(0x45);
        f.extend_from_slice(&noise);
        every_cut(&f)?;
    }
}

/// The fast path takes the frames it is for, and leaves the others to the generic path
/// (which then decides as it always did).
#[test]
fn the_fast_path_takes_plain_tcp_and_udp_only() {
    let base = Spec {
        vlan: None,
        options: 0,
        df: true,
        mf: false,
        offset: 0,
        ttl: 64,
        dscp: 0,
        ecn: 0,
        bad_header_checksum: None,
        upper: Upper::Tcp {
            flags: 0x10,
            options: 0,
            csum: Csum::Valid,
        },
        payload: vec![7; 20],
        padding: 0,
        ports: (40000, 80),
    };
    let with = |f: &dyn Fn(&mut Spec)| {
        let mut s = base.clone();
        f(&mut s);
        build(&s)
    };
    let fast = |f: &[u8]| parse_fast(f, &mut stale());
    let taken = [
        with(&|_| {}),
        with(&|s| s.vlan = Some(100)),
        with(&|s| s.vlan = Some(0)),
        with(&|s| s.df = false),
        with(&|s| s.padding = 6),
        with(&|s| {
            s.upper = Upper::Tcp {
                flags: 0x02,
                options: 20,
                csum: Csum::Partial,
            }
        }),
        with(&|s| s.upper = Upper::Udp { csum: Csum::Valid }),
        with(&|s| s.upper = Upper::Udp { csum: Csum::Zero }),
        with(&|s| {
            s.upper = Upper::Udp {
                csum: Csum::Partial,
            };
            s.vlan = Some(7);
        }),
    ];
    for f in &taken {
        assert!(fast(f), "not taken: {f:02x?}");
        let mut p = stale();
        assert_eq!(parse_into(f, &mut p), Ok(true));
    }
    let left = [
        with(&|s| s.options = 4),
        with(&|s| s.mf = true),
        with(&|s| s.offset = 1),
        with(&|s| s.bad_header_checksum = Some(1)),
        with(&|s| s.upper = Upper::Sctp { chunk: 1 }),
        with(&|s| s.upper = Upper::IcmpEcho),
        with(&|s| s.upper = Upper::Other(47)),
        // A UDP payload too short for the bytes the fast path reads at once.
        with(&|s| {
            s.upper = Upper::Udp { csum: Csum::Valid };
            s.payload.clear();
        }),
    ];
    for f in &left {
        assert!(!fast(f), "taken: {f:02x?}");
    }
    // A tag on a tag, where the bytes after the inner tag's TPID read as an IPv4 header
    // whose total length (the bytes 0x0800, read as the next EtherType by a parser that
    // skipped two tags) fits: not IP for the generic path, nor for the fast one.
    let mut f = link(None, 0x8100);
    f.extend_from_slice(&[0, 5, 0x81, 0x00]);
    PacketBuilder::ipv4(CLIENT, VIP, 64)
        .tcp(40000, 80, 1, 1000)
        .write(&mut f, &[0; 2048 - 40])
        .unwrap();
    assert_eq!(&f[20..22], &[0x08, 0x00]);
    assert!(!fast(&f));
    assert_eq!(parse_into(&f, &mut stale()), Ok(false));
    // The generic path still drops what it always dropped.
    let mut p = stale();
    assert_eq!(
        parse_into(&left[3], &mut p),
        Err(DropReason::Ipv4HeaderChecksum)
    );
}
