//! The parser alone: one pass over a frame into the `Parsed` summary the pipeline decides on,
//! for the shapes a gateway sees most (a minimum-size IPv4 TCP SYN, IPv6 TCP, an 802.1Q-tagged
//! frame) and the rarest expensive one (an ICMP error, whose embedded header is parsed too).
//! One element is one frame; the frame stays in L1, so this is the parser's instruction cost.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use etherparse::{icmpv4, Icmpv4Type, PacketBuilder, VlanId};
use strait_benches::{flags, flow, write_tcp_v4, CLIENT_MAC, FRAME_LEN, GW_MAC};
use strait_dataplane::wire::parse::parse;

fn frames() -> Vec<(&'static str, Vec<u8>)> {
    let mut syn_v4 = vec![0u8; FRAME_LEN];
    write_tcp_v4(&mut syn_v4, &flow(7, 1000), flags::SYN);

    let mut tcp_v6 = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, GW_MAC)
        .ipv6(
            [
                0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0x07,
            ],
            [
                0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
            ],
            64,
        )
        .tcp(40000, 80, 1, 65535)
        .ack(1)
        .write(&mut tcp_v6, &[])
        .expect("build v6");

    let mut vlan = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, GW_MAC)
        .single_vlan(VlanId::try_new(100).expect("vlan id"))
        .ipv4([100, 64, 0, 7], [10, 96, 0, 7], 64)
        .tcp(40000, 80, 1, 65535)
        .syn()
        .write(&mut vlan, &[])
        .expect("build vlan");
    vlan.resize(vlan.len().max(64), 0);

    // A router's "fragmentation needed" about a reply the VIP sent, quoting the IPv4 header
    // and the first 8 bytes of TCP (RFC 792's minimum).
    let mut reply = Vec::new();
    PacketBuilder::ethernet2(GW_MAC, CLIENT_MAC)
        .ipv4([10, 96, 0, 7], [100, 64, 0, 7], 64)
        .tcp(80, 40000, 1, 65535)
        .ack(1)
        .write(&mut reply, &[])
        .expect("build reply");
    let quoted = &reply[14..14 + 28];
    let mut icmp_error = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, GW_MAC)
        .ipv4([192, 0, 2, 254], [10, 96, 0, 7], 64)
        .icmpv4(Icmpv4Type::DestinationUnreachable(
            icmpv4::DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: 1280 },
        ))
        .write(&mut icmp_error, quoted)
        .expect("build icmp");

    vec![
        ("tcp_syn_v4_64B", syn_v4),
        ("tcp_v6", tcp_v6),
        ("tcp_v4_vlan", vlan),
        ("icmp_error_v4", icmp_error),
    ]
}

fn bench_parse(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse");
    group
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .throughput(Throughput::Elements(1));
    for (name, frame) in frames() {
        let p = parse(&frame)
            .unwrap_or_else(|r| panic!("{name}: dropped as {r}"))
            .unwrap_or_else(|| panic!("{name}: not IP"));
        assert_eq!(p.embedded.is_some(), name.starts_with("icmp"), "{name}");
        group.bench_function(name, |b| b.iter(|| parse(black_box(&frame))));
    }
    group.finish();
}

criterion_group!(benches, bench_parse);
criterion_main!(benches);
