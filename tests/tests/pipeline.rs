//! Behaviour of the packet pipeline, mode by mode, on packets built by etherparse and checked
//! by an independent checksum verifier.

use std::collections::HashMap;

use etherparse::{NetSlice, SlicedPacket};
use strait_dataplane::pipeline::Verdict;
use strait_dataplane::stats::DropReason;
use strait_tests::{offload, tcp, udp, verify, Bed, CLIENT_MAC, GW_MAC, SEC};

use strait_tests::ALL_MODES as CONFIG;

fn net(frame: &[u8]) -> SlicedPacket<'_> {
    SlicedPacket::from_ethernet(frame).expect("output parses")
}

fn dst_mac(frame: &[u8]) -> [u8; 6] {
    frame[0..6].try_into().unwrap()
}

#[test]
fn dsr_l2_rewrites_macs_only_and_keeps_flows() {
    let mut bed = Bed::new(CONFIG);
    let syn = tcp("192.0.2.7", 40000, "203.0.113.10", 80, "S", &[]);
    let (v, out) = bed.run(&syn);
    assert_eq!(v, Verdict::Tx { port: 0 });
    assert_eq!(&out[6..12], &GW_MAC);
    assert_eq!(&out[12..], &syn[12..], "IP packet untouched, TTL kept");
    let first = dst_mac(&out);
    for _ in 0..5 {
        bed.now += SEC;
        let (_, o) = bed.run(&tcp("192.0.2.7", 40000, "203.0.113.10", 80, "A", b"data"));
        assert_eq!(dst_mac(&o), first, "a flow sticks to its backend");
    }
    assert_eq!(bed.pipe.counters.flows_created, 1);
}

#[test]
fn dsr_l2_spreads_flows_over_all_backends() {
    let mut bed = Bed::new(CONFIG);
    let mut per: HashMap<[u8; 6], u32> = HashMap::new();
    for port in 0..4000u16 {
        let (v, out) = bed.run(&tcp(
            "192.0.2.7",
            10000 + port,
            "203.0.113.10",
            80,
            "S",
            &[],
        ));
        assert_eq!(v, Verdict::Tx { port: 0 });
        *per.entry(dst_mac(&out)).or_default() += 1;
    }
    assert_eq!(per.len(), 4);
    for (mac, n) in per {
        assert!((700..=1300).contains(&n), "{mac:?} got {n} of 4000 flows");
    }
}

#[test]
fn nat_translates_both_ways_with_valid_checksums() {
    let mut bed = Bed::new(CONFIG);
    let syn = tcp("192.0.2.7", 40000, "203.0.113.13", 80, "S", &[]);
    let (v, out) = bed.run(&syn);
    assert_eq!(v, Verdict::Tx { port: 0 });
    verify(&out).unwrap();
    let p = net(&out);
    let Some(NetSlice::Ipv4(ip)) = &p.net else {
        panic!()
    };
    let backend = ip.header().destination();
    assert!(backend == [198, 51, 100, 21] || backend == [198, 51, 100, 22]);
    assert_eq!(ip.header().source(), [192, 0, 2, 7], "client address kept");
    assert_eq!(ip.header().ttl(), 63);
    let Some(etherparse::TransportSlice::Tcp(t)) = &p.transport else {
        panic!()
    };
    assert_eq!(t.destination_port(), 8080);

    // The reply, from the backend, back to the client as the VIP.
    let b = format!(
        "{}.{}.{}.{}",
        backend[0], backend[1], backend[2], backend[3]
    );
    let mut reply = tcp(&b, 8080, "192.0.2.7", 40000, "SA", &[]);
    reply[0..6].copy_from_slice(&GW_MAC);
    let (v, out) = bed.run(&reply);
    assert_eq!(v, Verdict::Tx { port: 0 });
    verify(&out).unwrap();
    let p = net(&out);
    let Some(NetSlice::Ipv4(ip)) = &p.net else {
        panic!()
    };
    assert_eq!(ip.header().source(), [203, 0, 113, 13]);
    assert_eq!(ip.header().destination(), [192, 0, 2, 7]);
    let Some(etherparse::TransportSlice::Tcp(t)) = &p.transport else {
        panic!()
    };
    assert_eq!(t.source_port(), 80);
    assert_eq!(
        dst_mac(&out),
        CLIENT_MAC,
        "reply goes back to the MAC the client came from"
    );
    assert!(bed.pipe.counters.balanced());
}

#[test]
fn nat_udp_and_ipv6() {
    let mut bed = Bed::new(CONFIG);
    let (v, out) = bed.run(&udp("192.0.2.7", 5000, "203.0.113.13", 53, b"query"));
    assert_eq!(v, Verdict::Tx { port: 0 });
    verify(&out).unwrap();
    let (v, out) = bed.run(&tcp("2001:db8:2::7", 40000, "2001:db8::10", 80, "S", b"x"));
    assert_eq!(v, Verdict::Tx { port: 0 });
    verify(&out).unwrap();
    let p = net(&out);
    let Some(NetSlice::Ipv6(ip)) = &p.net else {
        panic!()
    };
    assert_eq!(
        ip.header().destination(),
        "2001:db8:1::21"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets()
    );
    assert_eq!(ip.header().hop_limit(), 63);
    let mut reply = tcp("2001:db8:1::21", 8080, "2001:db8:2::7", 40000, "SA", b"y");
    reply[0..6].copy_from_slice(&GW_MAC);
    let (v, out) = bed.run(&reply);
    assert_eq!(v, Verdict::Tx { port: 0 });
    verify(&out).unwrap();
}

#[test]
fn reply_without_flow_is_dropped_not_leaked() {
    let mut bed = Bed::new(CONFIG);
    let (v, _) = bed.run(&tcp("198.51.100.21", 8080, "192.0.2.7", 40000, "A", &[]));
    assert_eq!(v, Verdict::Drop(DropReason::ReplyNoFlow));
}

#[test]
fn ipip_and_gue_encapsulate_to_the_backend() {
    let mut bed = Bed::new(CONFIG);
    let inner = tcp("192.0.2.7", 40000, "203.0.113.11", 80, "S", b"hello");
    let (v, out) = bed.run(&inner);
    assert_eq!(v, Verdict::Tx { port: 0 });
    verify(&out).unwrap();
    assert_eq!(out.len(), inner.len() + 20);
    let Some(NetSlice::Ipv4(ip)) = &net(&out).net else {
        panic!()
    };
    assert_eq!(ip.header().protocol().0, 4);
    assert_eq!(ip.header().destination(), [198, 51, 100, 11]);
    assert_eq!(&ip.header().source()[..3], &[192, 0, 2]);
    assert!(
        ip.header().dont_fragment(),
        "DF copied from the inner header"
    );
    assert_eq!(&out[34..], &inner[14..], "inner packet untouched");

    let inner = tcp("192.0.2.7", 40000, "203.0.113.12", 80, "S", b"hello");
    let (v, out) = bed.run(&inner);
    assert_eq!(v, Verdict::Tx { port: 0 });
    verify(&out).unwrap();
    assert_eq!(out.len(), inner.len() + 28);
    let p = net(&out);
    let Some(etherparse::TransportSlice::Udp(u)) = &p.transport else {
        panic!()
    };
    assert_eq!(u.destination_port(), 6080);
    assert!(u.source_port() >= 49152);
    assert_eq!(&out[42..], &inner[14..]);

    let inner = tcp("2001:db8:2::7", 40000, "2001:db8::11", 80, "S", b"hello");
    let (v, out) = bed.run(&inner);
    assert_eq!(v, Verdict::Tx { port: 0 });
    verify(&out).unwrap();
    assert_eq!(out.len(), inner.len() + 40);
}

#[test]
fn too_big_for_encapsulation_gets_icmp_back() {
    let mut bed = Bed::new(CONFIG);
    let big = tcp("192.0.2.7", 40000, "203.0.113.11", 80, "A", &[0u8; 1460]);
    let (v, out) = bed.run(&big);
    assert_eq!(
        v,
        Verdict::Tx { port: 0 },
        "answered out of the ingress port"
    );
    verify(&out).unwrap();
    let Some(NetSlice::Ipv4(ip)) = &net(&out).net else {
        panic!()
    };
    assert_eq!(ip.header().source(), [203, 0, 113, 11]);
    assert_eq!(ip.header().destination(), [192, 0, 2, 7]);
    let icmp = ip.payload().payload;
    assert_eq!((icmp[0], icmp[1]), (3, 4));
    assert_eq!(u16::from_be_bytes([icmp[6], icmp[7]]), 1480);
    assert_eq!(dst_mac(&out), CLIENT_MAC);
    assert_eq!(bed.pipe.counters.icmp_too_big_sent, 1);
}

#[test]
fn source_ranges_are_enforced() {
    let mut bed = Bed::new(CONFIG);
    let (v, _) = bed.run(&tcp("192.0.2.7", 40000, "203.0.113.14", 443, "S", &[]));
    assert_eq!(v, Verdict::Tx { port: 0 });
    let (v, _) = bed.run(&tcp("192.0.2.200", 40000, "203.0.113.14", 443, "S", &[]));
    assert_eq!(v, Verdict::Drop(DropReason::SourceNotAllowed));
}

#[test]
fn session_affinity_pins_a_client_to_one_backend() {
    let mut bed = Bed::new(CONFIG);
    let mut seen = std::collections::HashSet::new();
    for port in 0..200u16 {
        let (_, out) = bed.run(&tcp(
            "192.0.2.9",
            20000 + port,
            "203.0.113.15",
            80,
            "S",
            &[],
        ));
        seen.insert(dst_mac(&out));
    }
    assert_eq!(
        seen.len(),
        1,
        "every connection of one client goes to one backend"
    );
}

#[test]
fn non_service_traffic_goes_to_the_kernel_and_garbage_is_dropped() {
    let mut bed = Bed::new(CONFIG);
    let (v, _) = bed.run(&tcp("192.0.2.7", 40000, "192.0.2.1", 22, "S", &[]));
    assert_eq!(v, Verdict::Pass, "ssh to the box");
    let mut arp = vec![0xffu8; 6];
    arp.extend_from_slice(&CLIENT_MAC);
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0u8; 28]);
    assert_eq!(bed.run(&arp).0, Verdict::Pass);
    let syn = tcp("192.0.2.7", 40000, "203.0.113.10", 80, "S", &[]);
    assert_eq!(
        bed.run(&syn[..20]).0,
        Verdict::Drop(DropReason::IpTruncated)
    );
    assert_eq!(
        bed.run(&syn[..10]).0,
        Verdict::Drop(DropReason::EthTruncated)
    );
    assert_eq!(
        bed.run(&syn[..40]).0,
        Verdict::Drop(DropReason::IpTruncated)
    );
    assert!(bed.pipe.counters.balanced());
}

#[test]
fn rst_for_unknown_flow_creates_no_state() {
    let mut bed = Bed::new(CONFIG);
    let (v, _) = bed.run(&tcp("192.0.2.7", 40000, "203.0.113.10", 80, "R", &[]));
    assert_eq!(v, Verdict::Tx { port: 0 });
    assert_eq!(bed.pipe.flows.len(), 0);
    assert_eq!(bed.pipe.counters.rst_without_flow, 1);
}

#[test]
fn icmp_frag_needed_reaches_the_flows_backend() {
    let mut bed = Bed::new(CONFIG);
    let (_, out) = bed.run(&tcp("192.0.2.7", 40000, "203.0.113.10", 80, "S", &[]));
    let backend_mac = dst_mac(&out);
    // A router on the way back to the client says the VIP's reply was too big. The error
    // quotes only the IP header and the minimum 8 bytes of TCP.
    let reply = tcp("203.0.113.10", 80, "192.0.2.7", 40000, "A", &[]);
    let quoted = &reply[14..14 + 28];
    let mut icmp = vec![3u8, 4, 0, 0, 0, 0, 0x05, 0x00];
    icmp.extend_from_slice(quoted);
    let err = etherparse::PacketBuilder::ethernet2(CLIENT_MAC, GW_MAC)
        .ipv4([192, 0, 2, 254], [203, 0, 113, 10], 64)
        .icmpv4(etherparse::Icmpv4Type::DestinationUnreachable(
            etherparse::icmpv4::DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: 1280 },
        ));
    let mut frame = Vec::new();
    err.write(&mut frame, quoted).unwrap();
    let (v, out) = bed.run(&frame);
    assert_eq!(v, Verdict::Tx { port: 0 });
    assert_eq!(dst_mac(&out), backend_mac);
    assert_eq!(bed.pipe.counters.icmp_errors_forwarded, 1);
}

#[test]
fn icmp_errors_are_forwarded_whatever_their_quoted_header_checksum() {
    // Only the outer IPv4 header is checked: the quoted one is read to find the flow, and a
    // router may quote a header as it altered it.
    let mut bed = Bed::new(CONFIG);
    let (_, out) = bed.run(&tcp("192.0.2.7", 40000, "203.0.113.10", 80, "S", &[]));
    let reply = tcp("203.0.113.10", 80, "192.0.2.7", 40000, "A", &[]);
    let mut quoted = reply[14..14 + 28].to_vec();
    quoted[10] ^= 0xff;
    let mut frame = Vec::new();
    etherparse::PacketBuilder::ethernet2(CLIENT_MAC, GW_MAC)
        .ipv4([192, 0, 2, 254], [203, 0, 113, 10], 64)
        .icmpv4_raw(3, 4, [0, 0, 0x05, 0x00])
        .write(&mut frame, &quoted)
        .unwrap();
    let (v, fwd) = bed.run(&frame);
    assert_eq!(v, Verdict::Tx { port: 0 });
    assert_eq!(dst_mac(&fwd), dst_mac(&out), "to the flow's backend");
}

#[test]
fn a_bad_ipv4_header_checksum_is_dropped_before_it_makes_state() {
    let mut bed = Bed::new(CONFIG);
    let syn = tcp("192.0.2.7", 40000, "203.0.113.13", 80, "S", &[]);
    let mut bad = syn.clone();
    bad[25] ^= 0x01;
    let (v, out) = bed.run(&bad);
    assert_eq!(v, Verdict::Drop(DropReason::Ipv4HeaderChecksum));
    assert_eq!(out, bad, "dropped untouched");
    assert_eq!(bed.pipe.flows.len(), 0, "no flow state");
    // Even for no service: the kernel would drop it too.
    let mut ssh = tcp("192.0.2.7", 40000, "192.0.2.1", 22, "S", &[]);
    ssh[24] ^= 0x80;
    assert_eq!(
        bed.run(&ssh).0,
        Verdict::Drop(DropReason::Ipv4HeaderChecksum)
    );
    assert_eq!(bed.run(&syn).0, Verdict::Tx { port: 0 });
    assert_eq!(
        bed.pipe.counters.drops_for(DropReason::Ipv4HeaderChecksum),
        2
    );
    assert!(bed.pipe.counters.balanced());
}

#[test]
fn checksums_left_to_offload_are_completed_in_every_mode_and_counted() {
    // Each frame twice, on fresh beds: as its sender computed it, and as a sender with
    // checksum offload hands it over. The gateway must send the same bytes, which verify,
    // and count one completion for the second only.
    let cases = [
        (
            "dsr-l2",
            tcp("192.0.2.7", 40000, "203.0.113.10", 80, "S", b"hello"),
        ),
        (
            "dsr-ipip",
            tcp("192.0.2.7", 40000, "203.0.113.11", 80, "S", b"hello"),
        ),
        (
            "dsr-gue",
            tcp("192.0.2.7", 40000, "203.0.113.12", 80, "PA", b"hello"),
        ),
        (
            "nat tcp",
            tcp("192.0.2.7", 40000, "203.0.113.13", 80, "S", b"hello"),
        ),
        (
            "nat udp",
            udp("192.0.2.7", 5000, "203.0.113.13", 53, b"query"),
        ),
        (
            "nat v6",
            tcp("2001:db8:2::7", 40000, "2001:db8::10", 80, "S", b"x"),
        ),
        (
            "dsr-ipip v6",
            tcp("2001:db8:2::7", 40000, "2001:db8::11", 80, "S", b"hello"),
        ),
        (
            "too big for the tunnel",
            tcp("192.0.2.7", 40000, "203.0.113.11", 80, "A", &[9; 1460]),
        ),
    ];
    for (name, valid) in cases {
        let partial = offload(&valid);
        assert_ne!(partial, valid, "{name}: the input is partial");
        let mut a = Bed::new(CONFIG);
        let mut b = Bed::new(CONFIG);
        let (va, want) = a.run(&valid);
        let (vb, got) = b.run(&partial);
        assert_eq!((va, vb), (Verdict::Tx { port: 0 }, Verdict::Tx { port: 0 }));
        verify(&want).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            got, want,
            "{name}: completed as the sender's device would have"
        );
        assert_eq!(a.pipe.counters.checksum_completed, 0, "{name}");
        assert_eq!(b.pipe.counters.checksum_completed, 1, "{name}");

        // In nat, the backend's answer may be partial too (a backend on a veth): the reverse
        // translation completes it over the VIP's address and port.
        if name.starts_with("nat") {
            let seen = net(&want);
            let (src, dst) = match &seen.net {
                Some(NetSlice::Ipv4(ip)) => (
                    ip.header().destination_addr().to_string(),
                    ip.header().source_addr().to_string(),
                ),
                Some(NetSlice::Ipv6(ip)) => (
                    ip.header().destination_addr().to_string(),
                    ip.header().source_addr().to_string(),
                ),
                _ => panic!("{name}: not IP"),
            };
            let (sport, dport) = match &seen.transport {
                Some(etherparse::TransportSlice::Tcp(t)) => (t.destination_port(), t.source_port()),
                Some(etherparse::TransportSlice::Udp(u)) => (u.destination_port(), u.source_port()),
                _ => panic!("{name}: no ports"),
            };
            let mut reply = if name == "nat udp" {
                udp(&src, sport, &dst, dport, b"reply")
            } else {
                tcp(&src, sport, &dst, dport, "SA", b"welcome")
            };
            reply[6..12].copy_from_slice(&want[0..6]);
            let (va, want) = a.run(&reply);
            let (vb, got) = b.run(&offload(&reply));
            assert_eq!((va, vb), (Verdict::Tx { port: 0 }, Verdict::Tx { port: 0 }));
            verify(&want).unwrap_or_else(|e| panic!("{name} reply: {e}"));
            assert_eq!(got, want, "{name}: reply completed");
            assert_eq!(b.pipe.counters.checksum_completed, 2, "{name} reply");
        }
    }
}

#[test]
fn fragments_of_one_datagram_reach_one_backend() {
    let mut bed = Bed::new(CONFIG);
    for id in 0..50u16 {
        // First fragment (MF, offset 0) and a later one (offset 1480) of one UDP datagram.
        let mut first = udp("192.0.2.7", 5000 + id, "203.0.113.13", 53, &[7u8; 64]);
        first[18..20].copy_from_slice(&id.to_be_bytes());
        first[20..22].copy_from_slice(&0x2000u16.to_be_bytes());
        fix_ipv4_checksum(&mut first);
        let mut later = first.clone();
        later[20..22].copy_from_slice(&(1480u16 / 8).to_be_bytes());
        fix_ipv4_checksum(&mut later);
        let (v1, o1) = bed.run(&first);
        let (v2, o2) = bed.run(&later);
        assert_eq!((v1, v2), (Verdict::Tx { port: 0 }, Verdict::Tx { port: 0 }));
        assert_eq!(&o1[30..34], &o2[30..34], "same backend address");
    }
    assert_eq!(bed.pipe.counters.fragments, 100);
    assert_eq!(bed.pipe.flows.len(), 0, "fragments create no state");
}

fn fix_ipv4_checksum(f: &mut [u8]) {
    f[24..26].copy_from_slice(&[0, 0]);
    let mut acc = 0u32;
    for c in f[14..34].chunks(2) {
        acc += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    f[24..26].copy_from_slice(&(!(acc as u16)).to_be_bytes());
}

#[test]
fn nat_flows_owned_by_another_core_are_handed_off() {
    let mut bed = Bed::with(CONFIG, 1500, 4, 0);
    let mut handed = 0;
    for port in 0..400u16 {
        match bed
            .run(&tcp(
                "192.0.2.7",
                30000 + port,
                "203.0.113.13",
                80,
                "S",
                &[],
            ))
            .0
        {
            Verdict::Handoff { core } => {
                assert!((1..4).contains(&core));
                handed += 1;
            }
            Verdict::Tx { .. } => {}
            v => panic!("{v:?}"),
        }
    }
    assert!(
        (200..=400).contains(&handed),
        "about 3/4 of flows belong to other cores: {handed}"
    );
    assert!(bed.pipe.counters.balanced());
}

#[test]
fn batches_decide_exactly_like_single_frames() {
    // A mix of every path: new flows, repeats, nat replies, drops, passes, fragments,
    // checksums left to offload, and session affinity (SYNs and strays).
    let mut frames = Vec::new();
    for i in 0..300u16 {
        let port = 20000 + i % 97;
        frames.push(match i % 9 {
            0 => offload(&tcp("192.0.2.7", port, "203.0.113.10", 80, "S", &[])),
            1 => tcp("192.0.2.7", port, "203.0.113.13", 80, "A", b"x"),
            2 => offload(&udp("192.0.2.8", port, "203.0.113.13", 53, b"q")),
            3 => tcp("192.0.2.7", port, "203.0.113.11", 80, "A", &[0; 1460]),
            4 => tcp("198.51.100.21", 8080, "192.0.2.7", port, "SA", &[]),
            5 => tcp("192.0.2.200", port, "203.0.113.14", 443, "S", &[]),
            6 => tcp("192.0.2.9", port, "203.0.113.15", 80, "S", &[]),
            7 => tcp("192.0.2.9", port, "203.0.113.15", 80, "A", b"y"),
            _ => tcp("192.0.2.7", port, "192.0.2.1", 22, "S", &[]),
        });
        if i % 11 == 0 {
            frames.push(frames.last().unwrap()[..30].to_vec());
        }
    }
    let mut single = Bed::new(CONFIG);
    let expected: Vec<_> = frames.iter().map(|f| single.run(f)).collect();

    let mut batched = Bed::new(CONFIG);
    let got = batched.run_batch(&frames);
    for (i, ((v, out), (got, bytes))) in expected.iter().zip(&got).enumerate() {
        assert_eq!(v, got, "frame {i}");
        assert_eq!(out, bytes, "frame {i} bytes");
    }
    assert_eq!(single.pipe.counters, batched.pipe.counters);
    assert!(batched.pipe.counters.balanced());
}

/// `frame` with an 802.1Q tag of VLAN `vid` after its MACs.
fn tagged(frame: &[u8], vid: u16) -> Vec<u8> {
    let mut out = frame[..12].to_vec();
    out.extend_from_slice(&[0x81, 0x00]);
    out.extend_from_slice(&vid.to_be_bytes());
    out.extend_from_slice(&frame[12..]);
    out
}

/// `frame` sent to `mac` instead of the gateway.
fn to_mac(frame: &[u8], mac: [u8; 6]) -> Vec<u8> {
    let mut out = frame.to_vec();
    out[..6].copy_from_slice(&mac);
    out
}

#[test]
fn a_port_takes_only_unicast_to_its_mac_and_the_vlans_it_serves() {
    let syn = tcp("192.0.2.7", 40000, "203.0.113.10", 80, "S", &[]);
    let served = CONFIG.replacen("queues = [0]\n", "queues = [0]\nvlans = [100, 4094]\n", 1);
    for (config, vlans) in [(CONFIG.to_string(), &[][..]), (served, &[100u16, 4094][..])] {
        let mut bed = Bed::new(&config);
        assert_eq!(bed.table.ports[0].vlans.ids().collect::<Vec<_>>(), vlans);
        // Flooded by a switch, or seen in promiscuous mode: another host's frame.
        let (v, _) = bed.run(&to_mac(&syn, [0x02, 0, 0, 0, 0, 0x99]));
        assert_eq!(v, Verdict::Drop(DropReason::OtherHost));
        let (v, _) = bed.run(&tagged(&to_mac(&syn, [0x02, 0, 0, 0, 0, 0x99]), 100));
        assert_eq!(v, Verdict::Drop(DropReason::OtherHost), "MAC first");
        assert_eq!(
            bed.pipe.counters.flows_created, 0,
            "no state for another host's flow"
        );
        // Broadcast and multicast are the kernel's, whatever they carry.
        for group in [
            [0xff; 6],
            [0x01, 0x00, 0x5e, 0, 0, 1],
            [0x33, 0x33, 0, 0, 0, 1],
        ] {
            assert_eq!(
                bed.run(&to_mac(&syn, group)).0,
                Verdict::Pass,
                "{group:02x?}"
            );
        }
        // A VLAN the port does not serve.
        for vid in [1, 200, 4095] {
            assert_eq!(
                bed.run(&tagged(&syn, vid)).0,
                Verdict::Drop(DropReason::VlanNotServed),
                "VLAN {vid}"
            );
        }
        // A priority tag (VLAN 0) is an untagged frame; served VLANs forward, tag and all.
        for vid in [0].iter().chain(vlans) {
            let (v, out) = bed.run(&tagged(&syn, *vid));
            assert_eq!(v, Verdict::Tx { port: 0 }, "VLAN {vid}");
            assert_eq!(&out[12..16], &[0x81, 0x00, (vid >> 8) as u8, *vid as u8]);
            assert_ne!(dst_mac(&out), GW_MAC, "to a backend");
            verify(&out).expect("checksums");
        }
        for vid in [100, 4094] {
            if !vlans.contains(&vid) {
                assert_eq!(
                    bed.run(&tagged(&syn, vid)).0,
                    Verdict::Drop(DropReason::VlanNotServed),
                    "VLAN {vid} untagged-only"
                );
            }
        }
        let c = &bed.pipe.counters;
        assert_eq!(c.drops_for(DropReason::OtherHost), 2);
        assert_eq!(
            c.drops_for(DropReason::VlanNotServed),
            5 - vlans.len() as u64
        );
        assert!(c.balanced());
    }
}

#[test]
fn batches_take_and_refuse_frames_as_single_frames_do() {
    let config = CONFIG.replacen("queues = [0]\n", "queues = [0]\nvlans = [100]\n", 1);
    let syn = |p: u16| tcp("192.0.2.7", p, "203.0.113.10", 80, "S", &[]);
    let frames: Vec<Vec<u8>> = (0..40u16)
        .map(|i| match i % 5 {
            0 => syn(i),
            1 => to_mac(&syn(i), [0x02, 0, 0, 0, 0, 0x99]),
            2 => tagged(&syn(i), 100),
            3 => tagged(&syn(i), 200),
            _ => to_mac(&syn(i), [0xff; 6]),
        })
        .collect();
    let mut single = Bed::new(&config);
    let expected: Vec<_> = frames.iter().map(|f| single.run(f).0).collect();
    let mut batched = Bed::new(&config);
    let verdicts: Vec<Verdict> = batched
        .run_batch(&frames)
        .into_iter()
        .map(|(v, _)| v)
        .collect();
    assert_eq!(expected, verdicts);
    assert_eq!(single.pipe.counters, batched.pipe.counters);
    let c = &batched.pipe.counters;
    assert_eq!(
        (
            c.tx,
            c.pass,
            c.drops_for(DropReason::OtherHost),
            c.drops_for(DropReason::VlanNotServed)
        ),
        (16, 8, 8, 8)
    );
}

/// Two gateways with one configuration choose the same backend for 10,000 flows:
/// Maglev is a function of the configuration, not of a gateway's history. The second
/// gateway's builder made a table of another service order first, so its backend ids
/// differ; every frame leaves both gateways the same, and their flow tables name the same
/// backend (by address and port) for every flow.
#[test]
fn two_gateways_with_one_configuration_choose_the_same_backend_for_10000_flows() {
    use std::sync::Arc;
    use strait_config::model::{MacAddr, Protocol};
    use strait_dataplane::flow::Timeouts;
    use strait_dataplane::pipeline::Pipeline;
    use strait_dataplane::table::{Builder, Port};

    let cfg = strait_config::parse(CONFIG).unwrap();
    let ports: Vec<Port> = cfg
        .gateway
        .interfaces
        .iter()
        .map(|_| Port::new(MacAddr(GW_MAC), 1500))
        .collect();
    let ta = Builder::new().build(&cfg, &ports, |_, _, _| false).unwrap();
    let tb = {
        let mut b = Builder::new();
        let mut other = cfg.clone();
        other.services.reverse();
        let first = b.build(&other, &ports, |_, _, _| false).unwrap();
        b.recycle(Arc::new(first));
        b.build(&cfg, &ports, |_, _, _| false).unwrap()
    };
    let frontends: Vec<_> = cfg
        .services
        .iter()
        .filter(|s| s.vip.is_ipv4() && s.protocol == Protocol::Tcp)
        .filter(|s| s.source_ranges.is_empty() && s.session_affinity.is_none())
        .map(|s| (s.vip.to_string(), s.port))
        .collect();
    assert!(frontends.len() >= 3, "{frontends:?}");
    let (mut a, mut b) = (
        Pipeline::new(0, 1, 1 << 15, Timeouts::default(), 0),
        Pipeline::new(0, 1, 1 << 15, Timeouts::default(), 0),
    );
    let mut differ = 0;
    for i in 0..10_000u32 {
        let (vip, port) = &frontends[i as usize % frontends.len()];
        let client = format!("192.0.2.{}", 16 + i % 200);
        let syn = tcp(&client, 10_000 + (i / 200) as u16, vip, *port, "S", &[]);
        let (va, oa) = strait_tests::run_with(&mut a, &ta, SEC, &syn);
        let (vb, ob) = strait_tests::run_with(&mut b, &tb, SEC, &syn);
        assert!(
            matches!(va, Verdict::Tx { .. }),
            "{va:?} for {client} -> {vip}:{port}"
        );
        if (va, &oa) != (vb, &ob) {
            differ += 1;
        }
    }
    assert_eq!(differ, 0, "frames that left the two gateways differently");
    // The flow tables: every flow, the same backend by address and port.
    let backend_of = |t: &strait_dataplane::table::ServiceTable,
                      v: &strait_dataplane::flow::FlowValue| {
        t.backend(v.backend).map(|x| x.socket_addr())
    };
    // A nat flow has one entry, for both directions.
    assert!(a.flows.len() >= 10_000, "{}", a.flows.len());
    assert_eq!(a.flows.len(), b.flows.len());
    let mut ids_differ = 0;
    for (key, va) in a.flows.iter() {
        let va = *va;
        let vb = *b
            .flows
            .lookup(key, SEC)
            .expect("the other gateway has the flow");
        ids_differ += usize::from({ va.backend } != { vb.backend });
        assert_eq!(backend_of(&ta, &va), backend_of(&tb, &vb), "{key:?}");
    }
    // The histories did differ: the check is not of two identical tables.
    assert!(
        ids_differ > 0,
        "the two gateways' backend ids happen to be the same"
    );
}

/// SCTP associations through the flow table: INIT opens a half-open flow as a SYN does, the
/// next client packet (COOKIE ECHO, DATA) makes it established, ABORT and SHUTDOWN COMPLETE
/// close it, an ABORT of an unknown association makes no state; the verification tag is not
/// part of the key (every packet of the association stays on its backend, whatever its tag).
#[test]
fn sctp_associations_go_through_the_flow_states() {
    use strait_dataplane::flow::FlowState;
    use strait_dataplane::key::{proto, FlowKey};
    use strait_tests::{sctp, sctp_chunk, sctp_data, sctp_init};

    let mut bed = Bed::new(CONFIG);
    let c = "192.0.2.7";
    let vip = "203.0.113.30";
    let key = |sport: u16| {
        FlowKey::new(
            c.parse().unwrap(),
            vip.parse().unwrap(),
            proto::SCTP,
            sport,
            7777,
        )
    };
    let state = |bed: &Bed, sport| bed.pipe.flows.peek(&key(sport)).map(|v| v.state);

    let (v, first) = bed.run(&sctp(c, 5000, vip, 7777, 0, &sctp_init(1)));
    assert_eq!(v, Verdict::Tx { port: 0 });
    assert_eq!(
        state(&bed, 5000),
        Some(FlowState::TcpSyn),
        "INIT: half-open"
    );
    bed.now += SEC;
    let cookie_echo = sctp_chunk(10, 0, b"cookie!!");
    let (_, o) = bed.run(&sctp(c, 5000, vip, 7777, 0xabcd, &cookie_echo));
    assert_eq!(dst_mac(&o), dst_mac(&first), "same backend, another tag");
    assert_eq!(state(&bed, 5000), Some(FlowState::TcpEstablished));
    for tsn in 1..5 {
        bed.now += SEC;
        let (_, o) = bed.run(&sctp(c, 5000, vip, 7777, 0xabcd, &sctp_data(tsn, b"x")));
        assert_eq!(dst_mac(&o), dst_mac(&first));
    }
    assert_eq!(state(&bed, 5000), Some(FlowState::TcpEstablished));
    let (_, o) = bed.run(&sctp(c, 5000, vip, 7777, 0xabcd, &sctp_chunk(14, 0, &[])));
    assert_eq!(dst_mac(&o), dst_mac(&first));
    assert_eq!(
        state(&bed, 5000),
        Some(FlowState::TcpClosing),
        "SHUTDOWN COMPLETE"
    );
    // A new association from another port, aborted.
    let _ = bed.run(&sctp(c, 5001, vip, 7777, 0, &sctp_init(2)));
    let _ = bed.run(&sctp(c, 5001, vip, 7777, 2, &sctp_chunk(6, 0, &[])));
    assert_eq!(state(&bed, 5001), Some(FlowState::TcpClosing), "ABORT");
    assert_eq!(bed.pipe.counters.flows_created, 2);
    // An ABORT for an association never seen: forwarded, no state.
    let (v, _) = bed.run(&sctp(c, 5002, vip, 7777, 9, &sctp_chunk(6, 0, &[])));
    assert_eq!(v, Verdict::Tx { port: 0 });
    assert_eq!(state(&bed, 5002), None);
    assert_eq!(bed.pipe.counters.rst_without_flow, 1);
    // A DATA packet of an unknown association picks it up, established.
    let _ = bed.run(&sctp(c, 5003, vip, 7777, 9, &sctp_data(7, b"y")));
    assert_eq!(state(&bed, 5003), Some(FlowState::TcpEstablished));
    assert!(bed.pipe.counters.balanced());
}

/// nat of SCTP both ways, with the CRC32c recomputed and verified by the independent
/// checker; a damaged packet is dropped in either direction rather than re-checksummed.
#[test]
fn sctp_nat_recomputes_the_crc_both_ways_and_drops_damaged_packets() {
    use strait_tests::{sctp, sctp_data, sctp_init, sctp_init_ack};

    let mut bed = Bed::new(CONFIG);
    let init = sctp("192.0.2.7", 5000, "203.0.113.33", 7777, 0, &sctp_init(0x11));
    let (v, out) = bed.run(&init);
    assert_eq!(v, Verdict::Tx { port: 0 });
    verify(&out).expect("forwarded INIT's CRC32c");
    assert_eq!(&out[30..34], &[198, 51, 100, 24], "to the backend");
    assert_eq!(&out[36..38], &17777u16.to_be_bytes(), "its port");
    let mut reply = sctp(
        "198.51.100.24",
        17777,
        "192.0.2.7",
        5000,
        0x11,
        &sctp_init_ack(0x22, b"cook"),
    );
    reply[6..12].copy_from_slice(&[2, 0, 0, 0, 1, 0x24]);
    let (v, back) = bed.run(&reply);
    assert_eq!(v, Verdict::Tx { port: 0 });
    verify(&back).expect("translated INIT ACK's CRC32c");
    assert_eq!(&back[26..30], &[203, 0, 113, 33], "from the VIP");
    assert_eq!(&back[34..36], &7777u16.to_be_bytes(), "and its port");
    assert_eq!(dst_mac(&back), CLIENT_MAC);

    let mut bad = sctp(
        "192.0.2.7",
        5000,
        "203.0.113.33",
        7777,
        0x22,
        &sctp_data(1, b"z"),
    );
    let n = bad.len();
    bad[n - 1] ^= 0x40; // a payload bit flipped on the way
    let (v, o) = bed.run(&bad);
    assert_eq!(v, Verdict::Drop(DropReason::SctpChecksum));
    assert_eq!(o, bad, "dropped untouched");
    let mut bad_reply = reply.clone();
    let n = bad_reply.len();
    bad_reply[n - 2] ^= 0x01;
    let (v, _) = bed.run(&bad_reply);
    assert_eq!(v, Verdict::Drop(DropReason::SctpChecksum));
    assert_eq!(bed.pipe.counters.drops_for(DropReason::SctpChecksum), 2);
    assert!(bed.pipe.counters.balanced());
}

/// ICMP errors about SCTP flows reach the flow's backend: in dsr-l2 forwarded as they are,
/// in nat with the quoted packet translated back to the backend's address and port (the
/// quoted CRC32c, over a packet the quote holds only part of, is left alone) and the ICMP
/// checksum kept valid.
#[test]
fn icmp_errors_about_sctp_flows_reach_their_backend() {
    use strait_tests::{sctp, sctp_data, sctp_init};

    let frag_needed = |vip: [u8; 4], quoted: &[u8]| {
        let mut frame = Vec::new();
        etherparse::PacketBuilder::ethernet2(CLIENT_MAC, GW_MAC)
            .ipv4([192, 0, 2, 254], vip, 64)
            .icmpv4_raw(3, 4, [0, 0, 0x05, 0x00])
            .write(&mut frame, quoted)
            .unwrap();
        frame
    };
    let mut bed = Bed::new(CONFIG);
    // dsr-l2: the VIP's (the backend's) reply quoted with its first 8 SCTP bytes.
    let (_, out) = bed.run(&sctp(
        "192.0.2.7",
        5000,
        "203.0.113.30",
        7777,
        0,
        &sctp_init(1),
    ));
    let reply = sctp(
        "203.0.113.30",
        7777,
        "192.0.2.7",
        5000,
        1,
        &sctp_data(1, b"big"),
    );
    let (v, fwd) = bed.run(&frag_needed([203, 0, 113, 30], &reply[14..14 + 28]));
    assert_eq!(v, Verdict::Tx { port: 0 });
    assert_eq!(dst_mac(&fwd), dst_mac(&out), "to the association's backend");

    // nat: the whole reply quoted.
    let _ = bed.run(&sctp(
        "192.0.2.7",
        5000,
        "203.0.113.33",
        7777,
        0,
        &sctp_init(1),
    ));
    let reply = sctp(
        "203.0.113.33",
        7777,
        "192.0.2.7",
        5000,
        1,
        &sctp_data(1, b"big"),
    );
    let (v, fwd) = bed.run(&frag_needed([203, 0, 113, 33], &reply[14..]));
    assert_eq!(v, Verdict::Tx { port: 0 });
    verify(&fwd).expect("outer IPv4 and ICMP checksums");
    assert_eq!(dst_mac(&fwd), [2, 0, 0, 0, 1, 0x24]);
    assert_eq!(
        &fwd[30..34],
        &[198, 51, 100, 24],
        "outer destination: the backend"
    );
    let q = 14 + 20 + 8;
    assert_eq!(&fwd[q + 12..q + 16], &[198, 51, 100, 24], "quoted source");
    assert_eq!(&fwd[q + 20..q + 22], &17777u16.to_be_bytes(), "quoted port");
    assert_eq!(
        &fwd[q + 28..],
        &reply[14 + 28..],
        "the rest of the quote, CRC32c included, as it was"
    );
    assert_eq!(bed.pipe.counters.icmp_errors_forwarded, 2);
    assert!(bed.pipe.counters.balanced());
}

/// What slow start relies on: a table update that only changes a backend's weight (as each
/// step of a ramp does) keeps every established flow on its backend, while new flows are
/// hashed by the new weights.
#[test]
fn a_weight_change_moves_new_flows_only() {
    use strait_config::model::MacAddr;
    use strait_dataplane::table::{Builder, Change, Port};

    let mut cfg = strait_config::parse(CONFIG).unwrap();
    let ports = vec![Port::new(MacAddr(GW_MAC), 1500)];
    let mut builder = Builder::new();
    let mut bed = Bed::new(CONFIG);
    bed.table = builder.build(&cfg, &ports, |_, _, _| false).unwrap();
    let open = |bed: &mut Bed, port: u16, flags: &str| {
        let (v, out) = bed.run(&tcp("192.0.2.7", port, "203.0.113.10", 80, flags, b""));
        assert_eq!(v, Verdict::Tx { port: 0 });
        dst_mac(&out)
    };
    let ports_used = 20000..20400u16;
    let before: Vec<[u8; 6]> = ports_used.clone().map(|p| open(&mut bed, p, "S")).collect();

    // Backend 198.51.100.14 down to a tenth of its weight, by an update of `l2` alone.
    let l2 = cfg.services.iter_mut().find(|s| s.name == "l2").unwrap();
    let light = l2
        .backends
        .iter_mut()
        .find(|b| b.address.to_string() == "198.51.100.14")
        .unwrap();
    light.weight = 10;
    let light_mac = light.mac.unwrap().0;
    let next = builder
        .update(&bed.table, &[Change::Set(l2)], |_, _, _| false)
        .unwrap();
    // A gateway with no flow state sends some of these flows elsewhere under the new table
    // (a copy of it, by an empty update): only their entries keep them.
    let mut fresh = Bed::new(CONFIG);
    fresh.table = builder.update(&next, &[], |_, _, _| false).unwrap();
    let moved = ports_used
        .clone()
        .zip(&before)
        .filter(|(p, mac)| open(&mut fresh, *p, "S") != **mac)
        .count();
    assert!(moved > 0, "the weight change moved no slot of these flows");
    bed.table = next;
    bed.now += SEC;
    for (p, mac) in ports_used.zip(&before) {
        assert_eq!(open(&mut bed, p, "A"), *mac, "flow from port {p} moved");
    }
    // New flows: the light backend gets about 10 / 310 of them, not a quarter.
    let new: Vec<[u8; 6]> = (30000..34000u16).map(|p| open(&mut bed, p, "S")).collect();
    let light_n = new.iter().filter(|m| **m == light_mac).count();
    assert!(
        (40..=220).contains(&light_n),
        "{light_n} of 4000 new flows to the backend at weight 10 of 310"
    );
}
