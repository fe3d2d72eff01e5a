//! The golden packet fixtures: one input frame each (after optional setup frames), the
//! verdict it must get and, through `fixtures.rs`, the exact bytes it must leave as.
//!
//! Inputs are built here, not stored, so each one reads as what it is; `fixtures.rs` also
//! pins them byte for byte in `tests/fixtures/<name>.in.hex`, so a change in a builder (ours
//! or etherparse's) shows up as a diff rather than as a silently different test. Well-formed
//! frames come from the etherparse helpers of `strait_tests`; edge cases and malformed ones
//! are edited or written by hand with the small builders at the end of this file.
//!
//! The table covers every forwarding mode in both families, the ICMP paths (errors about
//! flows, too-big answers), fragments, checksums left to offload by the sender (completed on
//! the way out), SCTP in every mode (its CRC32c kept by DSR, recomputed by nat), and every drop reason that input bytes can reach
//! under [`CONFIG`]. Two reasons cannot be reached from a frame: `no_headroom` (the driver's
//! headroom, fixed by the test runner) and `no_egress` (a port index outside the table,
//! which the table builder never produces).

use strait_dataplane::pipeline::Verdict;
use strait_dataplane::stats::DropReason;
use strait_tests::{
    offload, sctp, sctp_chunk, sctp_data, sctp_init, sctp_init_ack, tcp, udp, Bed, CLIENT_MAC,
    GW_MAC,
};

/// The services of `pipeline.rs`, plus the ones only fixtures need: dsr-l2 over IPv6,
/// IPv4-in-IPv6 tunnels (ipip and GUE), GUE over IPv6, a VIP shared by two TCP services
/// (ambiguous later fragments), two nat services sharing one backend (nat collisions), a
/// service whose only backend drains (no backend) and one whose backend MAC is unresolved.
/// The interface serves VLAN 100 besides untagged frames.
pub static CONFIG: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let all =
        strait_tests::ALL_MODES.replacen("queues = [0]\n", "queues = [0]\nvlans = [100]\n", 1);
    format!("{all}{EXTRA}")
});

/// The services only fixtures need, appended to [`strait_tests::ALL_MODES`].
const EXTRA: &str = r#"
[[services]]
name = "v6-l2"
vip = "2001:db8::12"
port = 80
mode = "dsr-l2"
maglev_table_size = 251
backends = [{ address = "2001:db8:1::11", port = 80, mac = "02:00:00:00:01:11" }]

[[services]]
name = "v6-gue"
vip = "2001:db8::13"
port = 80
mode = "dsr-gue"
maglev_table_size = 251
backends = [{ address = "2001:db8:1::12", port = 80, mac = "02:00:00:00:01:12" }]

[[services]]
name = "ipip-4in6"
vip = "203.0.113.16"
port = 80
mode = "dsr-ipip"
maglev_table_size = 251
backends = [{ address = "198.51.100.11", port = 80, mac = "02:00:00:00:01:11", tunnel = "2001:db8:1::11" }]

[[services]]
name = "gue-4in6"
vip = "203.0.113.17"
port = 80
mode = "dsr-gue"
maglev_table_size = 251
backends = [{ address = "198.51.100.12", port = 80, mac = "02:00:00:00:01:12", tunnel = "2001:db8:1::12" }]

[[services]]
name = "shared-http"
vip = "203.0.113.18"
port = 80
mode = "dsr-l2"
maglev_table_size = 251
backends = [{ address = "198.51.100.11", port = 80, mac = "02:00:00:00:01:11" }]

[[services]]
name = "shared-https"
vip = "203.0.113.18"
port = 443
mode = "dsr-l2"
maglev_table_size = 251
backends = [{ address = "198.51.100.11", port = 443, mac = "02:00:00:00:01:11" }]

[[services]]
name = "twin-a"
vip = "203.0.113.19"
port = 80
mode = "nat"
maglev_table_size = 251
backends = [{ address = "198.51.100.23", port = 8080, mac = "02:00:00:00:01:23" }]

[[services]]
name = "twin-b"
vip = "203.0.113.20"
port = 80
mode = "nat"
maglev_table_size = 251
backends = [{ address = "198.51.100.23", port = 8080, mac = "02:00:00:00:01:23" }]

[[services]]
name = "drained"
vip = "203.0.113.21"
port = 80
mode = "dsr-l2"
maglev_table_size = 251
backends = [{ address = "198.51.100.11", port = 80, mac = "02:00:00:00:01:11", state = "draining" }]

[[services]]
name = "unresolved"
vip = "203.0.113.22"
port = 80
mode = "dsr-l2"
maglev_table_size = 251
backends = [{ address = "198.51.100.11", port = 80 }]
"#;

/// One golden fixture.
#[derive(Debug)]
pub struct Fixture {
    /// File stem under `tests/fixtures/`.
    pub name: &'static str,
    /// What the fixture shows, in one sentence.
    pub description: &'static str,
    /// Frames run first on the same pipeline (each must be sent), e.g. the SYN that makes a
    /// nat flow before its reply.
    pub setup: Vec<Vec<u8>>,
    /// The frame under test.
    pub input: Vec<u8>,
    /// The verdict it must get.
    pub verdict: Verdict,
    /// `Some(what is wrong)` for a fixture that states the correct behaviour the pipeline
    /// does not have yet: it is left out of the golden table and run by an ignored test.
    pub bug: Option<&'static str>,
    /// The input's TCP/UDP checksum holds only the pseudo-header sum, as a sender with
    /// checksum offload leaves it: decoders must find it bad on the way in (and good out).
    pub offloaded: bool,
}

impl Fixture {
    fn new(
        name: &'static str,
        description: &'static str,
        input: Vec<u8>,
        verdict: Verdict,
    ) -> Self {
        Self {
            name,
            description,
            setup: Vec::new(),
            input,
            verdict,
            bug: None,
            offloaded: false,
        }
    }

    /// Replaces the input's TCP/UDP checksum by its pseudo-header sum (an SCTP CRC32c by
    /// zero), as a Linux sender whose device offloads checksums (a veth, a tap) hands the
    /// packet over.
    fn offloaded(mut self) -> Self {
        self.input = offload(&self.input);
        self.offloaded = true;
        self
    }

    fn after(mut self, setup: Vec<u8>) -> Self {
        self.setup.push(setup);
        self
    }

    fn bug(mut self, what: &'static str) -> Self {
        self.bug = Some(what);
        self
    }

    /// Whether the input is a well-formed packet an independent decoder must accept: every
    /// fixture except those whose point is a parse error.
    pub fn input_is_wellformed(&self) -> bool {
        !matches!(
            self.verdict,
            Verdict::Drop(
                DropReason::EthTruncated
                    | DropReason::IpTruncated
                    | DropReason::IpMalformed
                    | DropReason::Ipv4HeaderChecksum
                    | DropReason::Ipv6ExtensionHeaders
                    | DropReason::L4Truncated
                    | DropReason::IcmpEmbeddedTruncated
                    // Well-formed but for its checksum, which is the point.
                    | DropReason::SctpChecksum
            )
        )
    }

    /// A fresh bed (MTU 1500, one core) with the setup frames run.
    ///
    /// # Panics
    /// If a setup frame is not sent.
    pub fn bed(&self) -> Bed {
        let mut bed = Bed::new(&CONFIG);
        for s in &self.setup {
            let (v, _) = bed.run(s);
            assert_eq!(v, TX, "{}: setup frame not sent", self.name);
        }
        bed
    }
}

const TX: Verdict = Verdict::Tx { port: 0 };

fn drop(r: DropReason) -> Verdict {
    Verdict::Drop(r)
}

const C4: &str = "192.0.2.7";
const C6: &str = "2001:db8:2::7";
const ROUTER4: &str = "192.0.2.254";
const ROUTER6: &str = "2001:db8:2::fe";
/// The nat backend Maglev picks for [`C4`]:40000 to 203.0.113.13:80 (pinned by the
/// `nat_forward_tcp_v4` golden).
const NAT_BACKEND4: &str = "198.51.100.22";
const NAT_BACKEND4_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x22];
/// The dns service's only backend (and the v6 nat service's MAC).
const DNS_BACKEND: &str = "198.51.100.21";
const BACKEND_MAC_21: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x21];

/// A standard DNS query for `example.com A`.
const DNS_QUERY: &[u8] = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\
\x07example\x03com\x00\x00\x01\x00\x01";
/// Its answer: `example.com A 198.51.100.99`, TTL 60.
const DNS_ANSWER: &[u8] = b"\x12\x34\x81\x80\x00\x01\x00\x01\x00\x00\x00\x00\
\x07example\x03com\x00\x00\x01\x00\x01\
\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04\xc6\x33\x64\x63";
/// A complete HTTP request, 96 bytes.
const HTTP_GET: &[u8] =
    b"GET / HTTP/1.1\r\nHost: example.com\r\nUser-Agent: strait-fixture/1.0\r\nAccept: */*\r\n\r\n";

/// Every fixture, in file order.
pub fn all() -> Vec<Fixture> {
    let mut v = Vec::new();
    forwarding(&mut v);
    nat(&mut v);
    offload_checksums(&mut v);
    icmp(&mut v);
    sctp_fixtures(&mut v);
    fragments(&mut v);
    policy(&mut v);
    malformed(&mut v);
    v
}

fn forwarding(v: &mut Vec<Fixture>) {
    let syn4 = |vip: &str| tcp(C4, 40000, vip, 80, "S", &[]);
    let syn6 = |vip: &str| tcp(C6, 40000, vip, 80, "S", &[]);
    v.push(Fixture::new(
        "dsr_l2_v4",
        "A TCP SYN to a dsr-l2 VIP leaves with only its MACs changed, to its Maglev backend; \
         the IP packet and its TTL are untouched.",
        syn4("203.0.113.10"),
        TX,
    ));
    v.push(Fixture::new(
        "dsr_l2_v6",
        "A TCP SYN to an IPv6 dsr-l2 VIP leaves with only its MACs changed; the hop limit is \
         kept.",
        syn6("2001:db8::12"),
        TX,
    ));
    v.push(Fixture::new(
        "dsr_l2_vlan",
        "An 802.1Q-tagged (VLAN 100) SYN through dsr-l2 keeps its tag; only the MACs change.",
        with_vlan(&syn4("203.0.113.10"), 100),
        TX,
    ));
    v.push(Fixture::new(
        "dsr_l2_ttl_1",
        "dsr-l2 bridges rather than routes, so a packet with TTL 1 is forwarded with TTL 1.",
        with_ttl(&syn4("203.0.113.10"), 1),
        TX,
    ));
    v.push(Fixture::new(
        "dsr_l2_affinity",
        "A SYN to a service with ClientIP session affinity goes to the backend Maglev picks for \
         the client address alone.",
        syn4("203.0.113.15"),
        TX,
    ));
    v.push(Fixture::new(
        "dsr_l2_rst_without_flow",
        "A RST for a flow the gateway never saw is forwarded by Maglev (and creates no state).",
        tcp(C4, 40001, "203.0.113.10", 80, "R", &[]),
        TX,
    ));
    v.push(Fixture::new(
        "dsr_ipip_v4_in_v4",
        "A SYN with data to a dsr-ipip VIP is wrapped in an outer IPv4 header (protocol 4, \
         DF copied, TTL 64) from the tunnel source to the backend; the inner packet is \
         untouched.",
        tcp(C4, 40000, "203.0.113.11", 80, "S", b"hello"),
        TX,
    ));
    v.push(Fixture::new(
        "dsr_ipip_v4_in_v4_dscp",
        "The inner TOS (DSCP EF, ECN ECT(0)) is copied to the outer IPv4 header.",
        with_tos(&syn4("203.0.113.11"), 0xba),
        TX,
    ));
    v.push(Fixture::new(
        "dsr_ipip_v4_in_v4_vlan",
        "IP-in-IP of a VLAN-tagged frame keeps the tag in front of the new outer header.",
        with_vlan(&syn4("203.0.113.11"), 100),
        TX,
    ));
    v.push(Fixture::new(
        "dsr_ipip_v4_in_v4_padded",
        "A minimum-size frame (a 54-byte ACK padded to 60) loses its link padding when \
         encapsulated: the outer length covers the IP packet only.",
        padded(&tcp(C4, 40000, "203.0.113.11", 80, "A", &[]), 60),
        TX,
    ));
    v.push(Fixture::new(
        "dsr_ipip_v6_in_v6",
        "A SYN to an IPv6 dsr-ipip VIP is wrapped in an outer IPv6 header (next header 41, \
         flow label from the flow hash) to the backend.",
        tcp(C6, 40000, "2001:db8::11", 80, "S", b"hello"),
        TX,
    ));
    v.push(Fixture::new(
        "dsr_ipip_v4_in_v6",
        "A SYN to an IPv4 VIP whose backend has an IPv6 tunnel target is wrapped in an outer \
         IPv6 header with next header 4.",
        syn4("203.0.113.16"),
        TX,
    ));
    v.push(Fixture::new(
        "dsr_gue_v4",
        "A SYN to a dsr-gue VIP is wrapped in IPv4/UDP to port 6080 (GUE variant 1: the UDP \
         payload is the inner IP packet), with a zero UDP checksum and an ephemeral source \
         port from the flow hash.",
        tcp(C4, 40000, "203.0.113.12", 80, "S", b"hello"),
        TX,
    ));
    v.push(Fixture::new(
        "dsr_gue_v6_in_v6",
        "A SYN to an IPv6 dsr-gue VIP is wrapped in IPv6/UDP to port 6080 with a computed UDP \
         checksum.",
        tcp(C6, 40000, "2001:db8::13", 80, "S", b"hello"),
        TX,
    ));
    v.push(Fixture::new(
        "dsr_gue_v4_in_v6",
        "A SYN to an IPv4 VIP whose GUE backend has an IPv6 tunnel target is wrapped in \
         IPv6/UDP with a computed UDP checksum.",
        syn4("203.0.113.17"),
        TX,
    ));
    v.push(Fixture::new(
        "ipv6_ext_chain_dsr_ipip",
        "An IPv6 packet with Hop-by-Hop and Destination Options headers is encapsulated whole, \
         extension headers included.",
        with_ipv6_ext(&syn6("2001:db8::11"), &[HOP_BY_HOP, DEST_OPTS]),
        TX,
    ));
}

fn nat(v: &mut Vec<Fixture>) {
    let syn4 = tcp(C4, 40000, "203.0.113.13", 80, "S", &[]);
    let syn6 = tcp(C6, 40000, "2001:db8::10", 80, "S", &[]);
    let query = udp(C4, 5000, "203.0.113.13", 53, DNS_QUERY);
    v.push(Fixture::new(
        "nat_forward_tcp_v4",
        "A SYN to a nat VIP gets the backend's address and port (8080) as destination, TTL \
         decremented, and incrementally updated IPv4 and TCP checksums; the client address is \
         kept.",
        syn4.clone(),
        TX,
    ));
    v.push(Fixture::new(
        "nat_forward_udp_v4",
        "A DNS query to a UDP nat VIP gets the backend's address and port 5353 and a correct \
         UDP checksum.",
        query.clone(),
        TX,
    ));
    v.push(Fixture::new(
        "nat_forward_tcp_v6",
        "A SYN to an IPv6 nat VIP gets the backend's address and port, hop limit decremented, \
         and a TCP checksum updated for the pseudo-header change.",
        syn6.clone(),
        TX,
    ));
    v.push(Fixture::new(
        "nat_forward_ipv4_options",
        "A SYN whose IPv4 header carries a Router Alert option (IHL 6) is translated with the \
         option kept and the TCP header found after it.",
        with_ipv4_options(&syn4, &[0x94, 0x04, 0x00, 0x00]),
        TX,
    ));
    v.push(Fixture::new(
        "nat_forward_padded",
        "nat rewrites a padded minimum-size frame in place; the link padding stays and is not \
         covered by the checksums.",
        padded(&tcp(C4, 40002, "203.0.113.13", 80, "A", &[]), 60),
        TX,
    ));
    v.push(Fixture::new(
        "ipv6_ext_chain_nat",
        "An IPv6 SYN with Hop-by-Hop and Destination Options headers to a nat VIP is \
         translated past the chain, the headers kept.",
        with_ipv6_ext(&syn6, &[HOP_BY_HOP, DEST_OPTS]),
        TX,
    ));
    let mut reply4 = tcp(NAT_BACKEND4, 8080, C4, 40000, "SA", &[]);
    set_src_mac(&mut reply4, NAT_BACKEND4_MAC);
    v.push(
        Fixture::new(
            "nat_reply_tcp_v4",
            "The backend's SYN-ACK is translated back: source becomes VIP:80, TTL decremented, \
             sent to the MAC the client's SYN came from.",
            reply4.clone(),
            TX,
        )
        .after(syn4.clone()),
    );
    let mut answer = udp(DNS_BACKEND, 5353, C4, 5000, DNS_ANSWER);
    set_src_mac(&mut answer, BACKEND_MAC_21);
    v.push(
        Fixture::new(
            "nat_reply_udp_v4",
            "The backend's DNS answer is translated back to VIP:53 with a correct UDP checksum.",
            answer,
            TX,
        )
        .after(query),
    );
    let mut reply6 = tcp("2001:db8:1::21", 8080, C6, 40000, "SA", &[]);
    set_src_mac(&mut reply6, BACKEND_MAC_21);
    v.push(
        Fixture::new(
            "nat_reply_tcp_v6",
            "The IPv6 backend's SYN-ACK is translated back to [VIP]:80 with the TCP checksum \
             updated.",
            reply6,
            TX,
        )
        .after(syn6),
    );
    v.push(Fixture::new(
        "nat_reply_without_flow",
        "A packet from a nat backend's service port that matches no flow is dropped \
         (reply_no_flow) rather than leaking the backend address.",
        reply4.clone(),
        drop(DropReason::ReplyNoFlow),
    ));
    v.push(
        Fixture::new(
            "nat_reply_ttl_1",
            "A nat reply arriving with TTL 1 is dropped (ttl_exceeded): the gateway routes it.",
            with_ttl(&reply4, 1),
            drop(DropReason::TtlExceeded),
        )
        .after(syn4.clone()),
    );
    v.push(Fixture::new(
        "nat_ttl_1",
        "A SYN with TTL 1 to a nat VIP is dropped (ttl_exceeded) instead of being routed with \
         TTL 0.",
        with_ttl(&syn4, 1),
        drop(DropReason::TtlExceeded),
    ));
    v.push(
        Fixture::new(
            "nat_collision",
            "A client port already translated to a backend for one VIP cannot open a flow to \
             another VIP on the same backend: the reply tuple would be ambiguous \
             (nat_collision).",
            tcp(C4, 40000, "203.0.113.20", 80, "S", &[]),
            drop(DropReason::NatCollision),
        )
        .after(tcp(C4, 40000, "203.0.113.19", 80, "S", &[])),
    );
}

fn offload_checksums(v: &mut Vec<Fixture>) {
    let syn4 = tcp(C4, 40000, "203.0.113.13", 80, "S", &[]);
    v.push(
        Fixture::new(
            "offload_dsr_l2_v4",
            "A TCP SYN whose sender left the checksum to offload (the field holds the \
             pseudo-header sum) leaves dsr-l2 with the checksum completed, the IP packet \
             otherwise untouched.",
            tcp(C4, 40000, "203.0.113.10", 80, "S", &[]),
            TX,
        )
        .offloaded(),
    );
    v.push(
        Fixture::new(
            "offload_dsr_l2_v6",
            "An IPv6 SYN with a checksum left to offload leaves dsr-l2 with it completed over \
             the IPv6 pseudo-header.",
            tcp(C6, 40000, "2001:db8::12", 80, "S", &[]),
            TX,
        )
        .offloaded(),
    );
    v.push(
        Fixture::new(
            "offload_dsr_ipip_v4",
            "A SYN with data and a checksum left to offload is encapsulated with the inner \
             TCP checksum completed, so the backend's decapsulated packet verifies.",
            tcp(C4, 40000, "203.0.113.11", 80, "S", b"hello"),
            TX,
        )
        .offloaded(),
    );
    v.push(
        Fixture::new(
            "offload_nat_v4",
            "A nat SYN with a checksum left to offload gets a full TCP checksum over the \
             backend's address and port, not an incremental update of the pseudo-header sum.",
            syn4.clone(),
            TX,
        )
        .offloaded(),
    );
    v.push(
        Fixture::new(
            "offload_nat_v6",
            "An IPv6 nat SYN with a checksum left to offload gets a full TCP checksum over the \
             translated pseudo-header.",
            tcp(C6, 40000, "2001:db8::10", 80, "S", &[]),
            TX,
        )
        .offloaded(),
    );
    v.push(
        Fixture::new(
            "offload_nat_udp_v4",
            "A DNS query with a UDP checksum left to offload gets a full UDP checksum over the \
             backend's address and port 5353.",
            udp(C4, 5000, "203.0.113.13", 53, DNS_QUERY),
            TX,
        )
        .offloaded(),
    );
    let mut reply4 = tcp(NAT_BACKEND4, 8080, C4, 40000, "SA", &[]);
    set_src_mac(&mut reply4, NAT_BACKEND4_MAC);
    v.push(
        Fixture::new(
            "offload_nat_reply_v4",
            "A backend's SYN-ACK with a checksum left to offload is translated back to VIP:80 \
             with the TCP checksum completed over the VIP's address and port.",
            reply4,
            TX,
        )
        .after(syn4)
        .offloaded(),
    );
}

fn icmp(v: &mut Vec<Fixture>) {
    // What a router on the way back to the client quotes: the VIP's packet, IP header and
    // the 8 bytes of TCP RFC 792 guarantees.
    let quote8 = |from: &str, sport: u16, to: &str, dport: u16| {
        let p = tcp(from, sport, to, dport, "A", &[]);
        let l3 = 14;
        let hl = if p[l3] >> 4 == 4 { 20 } else { 40 };
        p[l3..l3 + hl + 8].to_vec()
    };
    let frag_needed = |vip: &str| {
        icmp4(
            ROUTER4,
            vip,
            3,
            4,
            [0, 0, 0x05, 0x00],
            &quote8(vip, 80, C4, 40000),
        )
    };
    v.push(
        Fixture::new(
            "icmp_frag_needed_dsr_l2",
            "An ICMP fragmentation-needed about a dsr-l2 VIP's packet (quoting 8 bytes of TCP) \
             is bridged, unchanged but for the MACs, to the backend of that flow.",
            frag_needed("203.0.113.10"),
            TX,
        )
        .after(tcp(C4, 40000, "203.0.113.10", 80, "S", &[])),
    );
    v.push(
        Fixture::new(
            "icmp_frag_needed_dsr_ipip",
            "An ICMP fragmentation-needed about a dsr-ipip VIP's packet is encapsulated to the \
             flow's backend like the flow's own packets.",
            frag_needed("203.0.113.11"),
            TX,
        )
        .after(tcp(C4, 40000, "203.0.113.11", 80, "S", &[])),
    );
    v.push(
        Fixture::new(
            "icmp_frag_needed_nat",
            "An ICMP fragmentation-needed about a nat flow goes to its backend with the outer \
             destination, the quoted source address and port translated back to the backend's, \
             and the ICMP and quoted IPv4 checksums fixed.",
            frag_needed("203.0.113.13"),
            TX,
        )
        .after(tcp(C4, 40000, "203.0.113.13", 80, "S", &[])),
    );
    v.push(Fixture::new(
        "icmp_frag_needed_nat_no_flow",
        "An ICMP error about a nat VIP's packet with no flow behind it is dropped \
         (icmp_no_flow).",
        frag_needed("203.0.113.13"),
        drop(DropReason::IcmpNoFlow),
    ));
    let syn6 = tcp(C6, 40000, "2001:db8::10", 80, "S", &[]);
    v.push(
        Fixture::new(
            "icmpv6_packet_too_big_nat",
            "An ICMPv6 packet-too-big about a v6 nat flow goes to its backend with the outer \
             destination and the quoted source translated and the ICMPv6 checksum (pseudo-header \
             included) fixed.",
            icmp6(
                ROUTER6,
                "2001:db8::10",
                2,
                0,
                1400u32.to_be_bytes(),
                &quote8("2001:db8::10", 80, C6, 40000),
            ),
            TX,
        )
        .after(syn6.clone()),
    );
    // A router quotes as much as fits (RFC 4443 2.4(c)): the whole TCP segment here.
    let full = {
        let p = tcp("2001:db8::10", 80, C6, 40000, "PA", b"0123456789abcdef");
        p[14..].to_vec()
    };
    v.push(
        Fixture::new(
            "icmpv6_packet_too_big_nat_full_quote",
            "An ICMPv6 packet-too-big quoting a whole TCP segment of a v6 nat flow is \
             translated, and the quoted TCP checksum is updated along with the quoted address \
             and port, as Linux's nf_nat does, so the quote stays a consistent packet.",
            icmp6(ROUTER6, "2001:db8::10", 2, 0, 1400u32.to_be_bytes(), &full),
            TX,
        )
        .after(syn6)
        .bug(
            "nat_icmp_error leaves the quoted TCP checksum as quoted; with a full quote it no \
             longer matches the translated address and port (tshark: Bad checksum)",
        ),
    );
    v.push(Fixture::new(
        "too_big_icmp_v4",
        "A full-size (1500-byte) DF packet to a dsr-ipip VIP cannot take the 20-byte outer \
         header: the client gets ICMP fragmentation-needed from the VIP with MTU 1480, quoting \
         548 bytes, out of the port it came in on.",
        tcp(C4, 40000, "203.0.113.11", 80, "A", &[0u8; 1460]),
        TX,
    ));
    v.push(Fixture::new(
        "too_big_icmpv6",
        "A full-size IPv6 packet to a v6 dsr-ipip VIP gets ICMPv6 packet-too-big from the VIP \
         with MTU 1460, quoting as much as fits in 1280 bytes.",
        tcp(C6, 40000, "2001:db8::11", 80, "A", &[0u8; 1440]),
        TX,
    ));
    let mut f = tcp(C4, 40000, "203.0.113.11", 80, "A", &[0u8; 1460]);
    f[0..6].copy_from_slice(&[0xff; 6]);
    v.push(Fixture::new(
        "broadcast_mac_to_vip",
        "A packet to a VIP addressed to the broadcast MAC is the kernel's (as ARP and ND are): \
         passed unchanged, never forwarded nor answered.",
        f,
        Verdict::Pass,
    ));
    v.push(Fixture::new(
        "too_big_no_df_v4",
        "A full-size IPv4 packet without DF cannot be encapsulated and may not be answered \
         with ICMP; the gateway does not fragment, so it is dropped (mtu_exceeded).",
        without_df(&tcp(C4, 40000, "203.0.113.11", 80, "A", &[0u8; 1460])),
        drop(DropReason::MtuExceeded),
    ));
    v.push(Fixture::new(
        "icmp_error_for_gateway_tcp",
        "An ICMP error about the gateway's own TCP connection (no VIP in the quote) is the \
         kernel's: passed unchanged.",
        icmp4(
            ROUTER4,
            "192.0.2.1",
            3,
            1,
            [0; 4],
            &quote8("192.0.2.1", 45000, "192.0.2.99", 22),
        ),
        Verdict::Pass,
    ));
    // The gateway's own ping, host unreachable: the quote is IP + 8 bytes of ICMP echo.
    let ping_quote = {
        let mut echo = vec![8u8, 0, 0, 0, 0x12, 0x34, 0, 1];
        let c = checksum(&echo);
        echo[2..4].copy_from_slice(&c.to_be_bytes());
        ipv4(
            ip4("192.0.2.1"),
            ip4("192.0.2.99"),
            1,
            64,
            0x4000,
            7,
            &[],
            &echo,
        )
    };
    v.push(
        Fixture::new(
            "icmp_error_for_gateway_ping",
            "An ICMP host-unreachable about the gateway's own ping (quoting an ICMP echo, not \
             TCP/UDP) is the kernel's: passed unchanged.",
            icmp4(ROUTER4, "192.0.2.1", 3, 1, [0; 4], &ping_quote),
            Verdict::Pass,
        )
        .bug(
            "wire::parse::embedded rejects every quoted protocol other than TCP/UDP as \
             icmp_embedded_truncated, so ICMP errors about the host's own ping (or GRE, ESP) \
             are dropped instead of passed",
        ),
    );
    let mut echo = vec![8u8, 0, 0, 0, 0x12, 0x34, 0, 1];
    echo.extend_from_slice(b"ping");
    let c = checksum(&echo);
    echo[2..4].copy_from_slice(&c.to_be_bytes());
    v.push(Fixture::new(
        "icmp_echo_to_vip",
        "An ICMP echo request to a VIP is not TCP/UDP: passed to the kernel unchanged.",
        eth(
            0x0800,
            &ipv4(ip4(C4), ip4("203.0.113.10"), 1, 64, 0x4000, 1, &[], &echo),
        ),
        Verdict::Pass,
    ));
}

/// SCTP's nat backend (the `sctp-nat` service's only one) and its MAC.
const SCTP_BACKEND4: &str = "198.51.100.24";
const SCTP_BACKEND_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x24];
/// The client's initiate tag in its INIT, hence the verification tag of the backend's packets.
const SCTP_CLIENT_TAG: u32 = 0x5eed_c0de;
/// The backend's initiate tag, hence the verification tag of the client's later packets.
const SCTP_BACKEND_TAG: u32 = 0x0bad_cafe;

fn sctp_fixtures(v: &mut Vec<Fixture>) {
    let init4 = |vip: &str| sctp(C4, 5000, vip, 7777, 0, &sctp_init(SCTP_CLIENT_TAG));
    let init6 = |vip: &str| sctp(C6, 5000, vip, 7777, 0, &sctp_init(SCTP_CLIENT_TAG));
    let data4 = |vip: &str| {
        sctp(
            C4,
            5000,
            vip,
            7777,
            SCTP_BACKEND_TAG,
            &sctp_data(SCTP_CLIENT_TAG, b"hello"),
        )
    };
    v.push(Fixture::new(
        "sctp_dsr_l2_v4",
        "An SCTP INIT to a dsr-l2 VIP leaves with only its MACs changed, its CRC32c untouched          and still valid.",
        init4("203.0.113.30"),
        TX,
    ));
    v.push(Fixture::new(
        "sctp_dsr_l2_v6",
        "An SCTP INIT to an IPv6 dsr-l2 VIP leaves with only its MACs changed.",
        init6("2001:db8::30"),
        TX,
    ));
    v.push(Fixture::new(
        "sctp_dsr_l2_abort_without_flow",
        "An SCTP ABORT for an association the gateway never saw is forwarded by Maglev, as a          TCP RST is (and creates no state).",
        sctp(
            C4,
            5001,
            "203.0.113.30",
            7777,
            SCTP_BACKEND_TAG,
            &sctp_chunk(6, 0, &[]),
        ),
        TX,
    ));
    v.push(Fixture::new(
        "sctp_dsr_ipip_v4",
        "An SCTP DATA packet (an association picked up mid-stream) to a dsr-ipip VIP is          wrapped in an outer IPv4 header, the inner SCTP packet unchanged.",
        data4("203.0.113.31"),
        TX,
    ));
    v.push(Fixture::new(
        "sctp_dsr_gue_v4",
        "An SCTP INIT to a dsr-gue VIP is wrapped in UDP to port 6080, the inner SCTP packet          unchanged.",
        init4("203.0.113.32"),
        TX,
    ));
    v.push(Fixture::new(
        "sctp_nat_forward_v4",
        "An SCTP INIT to a nat VIP gets the backend's address and port (17777) as destination,          TTL decremented, and its CRC32c recomputed over the rewritten packet.",
        init4("203.0.113.33"),
        TX,
    ));
    v.push(Fixture::new(
        "sctp_nat_forward_v6",
        "An SCTP INIT to an IPv6 nat VIP gets the backend's address and port and a recomputed          CRC32c.",
        init6("2001:db8::33"),
        TX,
    ));
    v.push(
        Fixture::new(
            "sctp_nat_forward_data_v4",
            "A DATA packet of an association a nat flow holds goes to the same backend, port              rewritten, CRC32c recomputed.",
            data4("203.0.113.33"),
            TX,
        )
        .after(init4("203.0.113.33")),
    );
    let mut init_ack = sctp(
        SCTP_BACKEND4,
        17777,
        C4,
        5000,
        SCTP_CLIENT_TAG,
        &sctp_init_ack(SCTP_BACKEND_TAG, b"a cookie of the backend!"),
    );
    set_src_mac(&mut init_ack, SCTP_BACKEND_MAC);
    v.push(
        Fixture::new(
            "sctp_nat_reply_v4",
            "The backend's INIT ACK is translated back: source becomes VIP:7777, TTL              decremented, CRC32c recomputed, sent to the MAC the client's INIT came from.",
            init_ack,
            TX,
        )
        .after(init4("203.0.113.33")),
    );
    let mut bad = init4("203.0.113.33");
    let at = bad.len() - 20 - 12 + 8; // the CRC32c: 20 bytes of INIT after the common header
    bad[at] ^= 0x01;
    v.push(Fixture::new(
        "sctp_nat_bad_checksum",
        "An SCTP INIT to a nat VIP whose CRC32c does not verify is dropped (sctp_checksum)          rather than given a valid one by the port rewrite.",
        bad,
        drop(DropReason::SctpChecksum),
    ));
    // An INIT cut after 16 bytes of its 32 (a multiple of 8, as fragment offsets are).
    let whole = l4_of(&init4("203.0.113.33"));
    v.push(Fixture::new(
        "sctp_nat_fragment",
        "The first IP fragment of an SCTP packet to a nat VIP is dropped (sctp_fragment): its          CRC32c covers the whole packet, which the gateway does not reassemble.",
        eth(
            0x0800,
            &ipv4(
                ip4(C4),
                ip4("203.0.113.33"),
                132,
                64,
                0x2000,
                0x4321,
                &[],
                &whole[..16],
            ),
        ),
        drop(DropReason::SctpFragment),
    ));
    v.push(Fixture::new(
        "l4_truncated_sctp",
        "An IPv4 packet of protocol SCTP holding 8 bytes, shorter than SCTP's 12-byte common          header, is dropped (l4_truncated).",
        eth(
            0x0800,
            &ipv4(
                ip4(C4),
                ip4("203.0.113.30"),
                132,
                64,
                0x4000,
                0,
                &[],
                &whole[..8],
            ),
        ),
        drop(DropReason::L4Truncated),
    ));
    v.push(
        Fixture::new(
            "offload_sctp_dsr_l2_v4",
            "An SCTP INIT whose CRC32c was left to offload (a zero field) leaves dsr-l2 with              the CRC32c computed.",
            init4("203.0.113.30"),
            TX,
        )
        .offloaded(),
    );
    v.push(
        Fixture::new(
            "offload_sctp_nat_v4",
            "An SCTP INIT to a nat VIP whose CRC32c was left to offload is translated and              leaves with the CRC32c computed.",
            init4("203.0.113.33"),
            TX,
        )
        .offloaded(),
    );
}

fn fragments(v: &mut Vec<Fixture>) {
    // One UDP datagram (a DNS query zero-padded to 100 bytes) to the dns nat service, cut
    // after 56 bytes of the fragmentable part (a multiple of 8, as fragment offsets are).
    let mut dns = DNS_QUERY.to_vec();
    dns.resize(100, 0);
    let datagram = l4_of(&udp(C4, 5000, "203.0.113.13", 53, &dns));
    let (first, later) = datagram.split_at(56);
    v.push(Fixture::new(
        "fragment_first_v4",
        "The first fragment (MF, offset 0) of a UDP datagram to a nat VIP is translated by the \
         3-tuple hash, ports and the whole-datagram UDP checksum included, without state.",
        eth(
            0x0800,
            &ipv4(
                ip4(C4),
                ip4("203.0.113.13"),
                17,
                64,
                0x2000,
                0x1234,
                &[],
                first,
            ),
        ),
        TX,
    ));
    v.push(Fixture::new(
        "fragment_later_v4",
        "A later fragment (offset 56) of the same datagram reaches the same backend with only \
         the IP header translated; reassembled at the backend, the UDP checksum holds.",
        eth(
            0x0800,
            &ipv4(
                ip4(C4),
                ip4("203.0.113.13"),
                17,
                64,
                56 / 8,
                0x1234,
                &[],
                later,
            ),
        ),
        TX,
    ));
    let seg = l4_of(&tcp(C6, 40000, "2001:db8::10", 80, "PA", HTTP_GET));
    let (first, later) = seg.split_at(64);
    v.push(Fixture::new(
        "fragment_first_v6",
        "The first fragment (fragment header, M set) of a TCP segment to a v6 nat VIP is \
         translated, ports and TCP checksum included.",
        eth(
            0x86dd,
            &ipv6(
                ip6(C6),
                ip6("2001:db8::10"),
                44,
                64,
                &frag_header(6, 0, true, 0xabcd, first),
            ),
        ),
        TX,
    ));
    v.push(Fixture::new(
        "fragment_later_v6",
        "A later IPv6 fragment (offset 64) of the same segment reaches the same backend with \
         only the destination address translated.",
        eth(
            0x86dd,
            &ipv6(
                ip6(C6),
                ip6("2001:db8::10"),
                44,
                64,
                &frag_header(6, 64, false, 0xabcd, later),
            ),
        ),
        TX,
    ));
    // A first fragment that holds the ports but not the TCP checksum (bytes 16..18), which
    // travels in the second fragment: nat cannot translate the ports consistently.
    let seg = l4_of(&tcp(C4, 40003, "203.0.113.13", 80, "PA", b"tinyfrag"));
    v.push(
        Fixture::new(
            "fragment_first_tiny_tcp_nat",
            "A first fragment carrying only 16 bytes of TCP header (the checksum is in the next \
             fragment) to a nat VIP is dropped (l4_truncated), since its ports cannot be \
             rewritten without the checksum that covers them.",
            eth(
                0x0800,
                &ipv4(
                    ip4(C4),
                    ip4("203.0.113.13"),
                    6,
                    64,
                    0x2000,
                    0x2468,
                    &[],
                    &seg[..16],
                ),
            ),
            drop(DropReason::L4Truncated),
        )
        .bug(
            "nat rewrites the ports of a TCP first fragment too short to hold the checksum \
             (parse accepts 14 bytes); the checksum in the next fragment is left as is, so the \
             reassembled segment fails its checksum at the backend",
        ),
    );
    let reply = l4_of(&udp(DNS_BACKEND, 5353, C4, 5000, &[0u8; 64]));
    let mut f = eth(
        0x0800,
        &ipv4(
            ip4(DNS_BACKEND),
            ip4(C4),
            17,
            64,
            0x2000,
            0x4321,
            &[],
            &reply[..48],
        ),
    );
    set_src_mac(&mut f, BACKEND_MAC_21);
    v.push(Fixture::new(
        "fragmented_reply",
        "A fragmented nat reply is dropped (fragmented_reply): only the first fragment carries \
         the ports and the gateway does not reassemble.",
        f,
        drop(DropReason::FragmentedReply),
    ));
    v.push(Fixture::new(
        "fragment_later_ambiguous",
        "A later TCP fragment to a VIP with two TCP services cannot be told apart \
         (fragment_ambiguous).",
        eth(
            0x0800,
            &ipv4(
                ip4(C4),
                ip4("203.0.113.18"),
                6,
                64,
                185,
                0x5555,
                &[],
                &[0x55; 40],
            ),
        ),
        drop(DropReason::FragmentAmbiguous),
    ));
}

fn policy(v: &mut Vec<Fixture>) {
    v.push(Fixture::new(
        "acl_allowed",
        "A client inside the service's source_ranges (192.0.2.0/25) is forwarded.",
        tcp(C4, 40000, "203.0.113.14", 443, "S", &[]),
        TX,
    ));
    v.push(Fixture::new(
        "acl_source_not_allowed",
        "A client outside the service's source_ranges is dropped (source_not_allowed).",
        tcp("192.0.2.200", 40000, "203.0.113.14", 443, "S", &[]),
        drop(DropReason::SourceNotAllowed),
    ));
    v.push(Fixture::new(
        "no_backend",
        "A service whose only backend drains takes no new flow (no_backend).",
        tcp(C4, 40000, "203.0.113.21", 80, "S", &[]),
        drop(DropReason::NoBackend),
    ));
    v.push(Fixture::new(
        "no_next_hop",
        "A backend whose MAC is not resolved yet cannot be sent to (no_next_hop).",
        tcp(C4, 40000, "203.0.113.22", 80, "S", &[]),
        drop(DropReason::NoNextHop),
    ));
    let mut f = tcp(C4, 40000, "203.0.113.10", 80, "S", &[]);
    f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x99]);
    v.push(Fixture::new(
        "other_host",
        "A SYN to a VIP addressed to another host's MAC (flooded by a switch, or seen in \
         promiscuous mode) is dropped (other_host): that host gets its own copy.",
        f,
        drop(DropReason::OtherHost),
    ));
    v.push(Fixture::new(
        "vlan_not_served",
        "A SYN to a VIP tagged with VLAN 200, which the interface does not serve (it serves \
         100), is dropped (vlan_not_served).",
        with_vlan(&tcp(C4, 40000, "203.0.113.10", 80, "S", &[]), 200),
        drop(DropReason::VlanNotServed),
    ));
    v.push(Fixture::new(
        "priority_tagged",
        "A priority-tagged SYN (802.1Q VLAN 0: no VLAN) is taken as untagged and keeps its tag \
         through dsr-l2.",
        with_vlan(&tcp(C4, 40000, "203.0.113.10", 80, "S", &[]), 0),
        TX,
    ));
    v.push(Fixture::new(
        "pass_ssh_to_gateway",
        "SSH to the gateway's own address is no service: passed to the kernel unchanged.",
        tcp(C4, 40000, "192.0.2.1", 22, "S", &[]),
        Verdict::Pass,
    ));
    v.push(Fixture::new(
        "pass_vip_other_port",
        "A VIP on a port no service uses is the kernel's: passed unchanged.",
        tcp(C4, 40000, "203.0.113.10", 8443, "S", &[]),
        Verdict::Pass,
    ));
    let mut arp = vec![0, 1, 8, 0, 6, 4, 0, 1];
    arp.extend_from_slice(&CLIENT_MAC);
    arp.extend_from_slice(&ip4(C4));
    arp.extend_from_slice(&[0; 6]);
    arp.extend_from_slice(&ip4("192.0.2.1"));
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&CLIENT_MAC);
    f.extend_from_slice(&[0x08, 0x06]);
    f.extend_from_slice(&arp);
    f.resize(60, 0);
    v.push(Fixture::new(
        "pass_arp",
        "An ARP request (broadcast) is not IP: passed to the kernel unchanged.",
        f,
        Verdict::Pass,
    ));
    // Neighbor solicitation for the gateway, from the client, with its link-layer option.
    let target = ip6("2001:db8::1");
    let mut ns = vec![135u8, 0, 0, 0, 0, 0, 0, 0];
    ns.extend_from_slice(&target);
    ns.extend_from_slice(&[1, 1]);
    ns.extend_from_slice(&CLIENT_MAC);
    let snm = ip6("ff02::1:ff00:1");
    let c = l4_checksum(&ip6(C6), &snm, 58, &ns);
    ns[2..4].copy_from_slice(&c.to_be_bytes());
    let mut f = eth(0x86dd, &ipv6(ip6(C6), snm, 58, 255, &ns));
    f[0..6].copy_from_slice(&[0x33, 0x33, 0xff, 0, 0, 1]);
    v.push(Fixture::new(
        "pass_ipv6_neighbor_solicitation",
        "An ICMPv6 neighbor solicitation is not TCP/UDP: passed to the kernel unchanged.",
        f,
        Verdict::Pass,
    ));
}

fn malformed(v: &mut Vec<Fixture>) {
    let syn4 = tcp(C4, 40000, "203.0.113.10", 80, "S", &[]);
    let syn6 = tcp(C6, 40000, "2001:db8::12", 80, "S", &[]);
    v.push(Fixture::new(
        "eth_truncated",
        "A 13-byte frame has no complete Ethernet header (eth_truncated).",
        syn4[..13].to_vec(),
        drop(DropReason::EthTruncated),
    ));
    v.push(Fixture::new(
        "eth_truncated_vlan",
        "A frame cut inside its 802.1Q tag (eth_truncated).",
        with_vlan(&syn4, 100)[..16].to_vec(),
        drop(DropReason::EthTruncated),
    ));
    v.push(Fixture::new(
        "ip_truncated_v4_header",
        "An IPv4 frame cut inside the 20-byte header (ip_truncated).",
        syn4[..14 + 19].to_vec(),
        drop(DropReason::IpTruncated),
    ));
    let mut f = syn4.clone();
    f[16..18].copy_from_slice(&200u16.to_be_bytes());
    fix_ipv4_checksum(&mut f, 14);
    v.push(Fixture::new(
        "ip_truncated_v4_total_length",
        "An IPv4 header whose total length (200) exceeds the frame (ip_truncated).",
        f,
        drop(DropReason::IpTruncated),
    ));
    v.push(Fixture::new(
        "ip_truncated_v6",
        "An IPv6 frame shorter than its payload length says (ip_truncated).",
        syn6[..syn6.len() - 4].to_vec(),
        drop(DropReason::IpTruncated),
    ));
    let mut f = syn4.clone();
    f[25] ^= 0x01;
    v.push(Fixture::new(
        "ipv4_header_checksum",
        "An IPv4 header whose checksum does not verify is dropped (ipv4_header_checksum) \
         before it can make flow state.",
        f,
        drop(DropReason::Ipv4HeaderChecksum),
    ));
    let mut f = syn4.clone();
    f[14] = 0x65;
    v.push(Fixture::new(
        "ip_malformed_version",
        "An IPv4 ethertype with version 6 in the header (ip_malformed).",
        f,
        drop(DropReason::IpMalformed),
    ));
    let mut f = syn4.clone();
    f[14] = 0x44;
    fix_ipv4_checksum_len(&mut f, 14, 16);
    v.push(Fixture::new(
        "ip_malformed_ihl",
        "An IPv4 header length of 16 bytes, below the 20-byte minimum (ip_malformed).",
        f,
        drop(DropReason::IpMalformed),
    ));
    let mut f = syn4.clone();
    f[16..18].copy_from_slice(&19u16.to_be_bytes());
    fix_ipv4_checksum(&mut f, 14);
    v.push(Fixture::new(
        "ip_malformed_total_length",
        "An IPv4 total length (19) shorter than the header (ip_malformed).",
        f,
        drop(DropReason::IpMalformed),
    ));
    let mut f = syn6.clone();
    f[18..20].copy_from_slice(&[0, 0]);
    v.push(Fixture::new(
        "ip_malformed_v6_jumbo",
        "An IPv6 payload length of 0 with a TCP next header (a jumbogram without its option; \
         ip_malformed).",
        f,
        drop(DropReason::IpMalformed),
    ));
    let mut f = with_ipv6_ext(&syn6, &[HOP_BY_HOP]);
    f[55] = 9; // Hop-by-Hop length: 80 bytes, past the payload.
    v.push(Fixture::new(
        "ipv6_ext_truncated",
        "A Hop-by-Hop header whose length runs past the payload (ipv6_extension_headers).",
        f,
        drop(DropReason::Ipv6ExtensionHeaders),
    ));
    v.push(Fixture::new(
        "ipv6_ext_hop_by_hop_not_first",
        "A Hop-by-Hop header after a Destination Options header, which RFC 8200 forbids \
         (ipv6_extension_headers).",
        with_ipv6_ext(&syn6, &[DEST_OPTS, HOP_BY_HOP]),
        drop(DropReason::Ipv6ExtensionHeaders),
    ));
    v.push(Fixture::new(
        "ipv6_ext_too_long",
        "A chain of nine Destination Options headers, longer than any legal chain \
         (ipv6_extension_headers).",
        with_ipv6_ext(&syn6, &[DEST_OPTS; 9]),
        drop(DropReason::Ipv6ExtensionHeaders),
    ));
    let mut f = syn4.clone();
    f[16..18].copy_from_slice(&(20u16 + 12).to_be_bytes());
    fix_ipv4_checksum(&mut f, 14);
    v.push(Fixture::new(
        "l4_truncated_tcp",
        "An IPv4 total length that leaves 12 bytes for a 20-byte TCP header (l4_truncated).",
        f,
        drop(DropReason::L4Truncated),
    ));
    let mut f = syn4.clone();
    f[34 + 12] = 0x40;
    v.push(Fixture::new(
        "l4_truncated_tcp_data_offset",
        "A TCP data offset of 16 bytes, below the header's 20 (l4_truncated).",
        f,
        drop(DropReason::L4Truncated),
    ));
    let mut f = udp(C4, 5000, "203.0.113.13", 53, DNS_QUERY);
    f[38..40].copy_from_slice(&200u16.to_be_bytes());
    v.push(Fixture::new(
        "l4_truncated_udp",
        "A UDP length (200) beyond the IP payload (l4_truncated).",
        f,
        drop(DropReason::L4Truncated),
    ));
    v.push(Fixture::new(
        "l4_truncated_first_fragment",
        "A first fragment carrying 4 bytes of UDP header, not even the ports and length \
         (l4_truncated).",
        eth(
            0x0800,
            &ipv4(
                ip4(C4),
                ip4("203.0.113.13"),
                17,
                64,
                0x2000,
                0x777,
                &[],
                &[0x13, 0x88, 0, 53],
            ),
        ),
        drop(DropReason::L4Truncated),
    ));
    v.push(Fixture::new(
        "l4_truncated_icmp",
        "An ICMP message of 4 bytes, short of its 8-byte header (l4_truncated).",
        eth(
            0x0800,
            &ipv4(
                ip4(ROUTER4),
                ip4("203.0.113.10"),
                1,
                64,
                0,
                9,
                &[],
                &[3, 4, 0xfc, 0xfb],
            ),
        ),
        drop(DropReason::L4Truncated),
    ));
    let q = tcp("203.0.113.10", 80, C4, 40000, "A", &[]);
    v.push(Fixture::new(
        "icmp_embedded_truncated",
        "An ICMP error quoting the IPv4 header and only 4 bytes of TCP, too little for the \
         ports (icmp_embedded_truncated).",
        icmp4(ROUTER4, "203.0.113.10", 3, 4, [0, 0, 5, 0], &q[14..14 + 24]),
        drop(DropReason::IcmpEmbeddedTruncated),
    ));
}

// ---- builders -------------------------------------------------------------------------

const HOP_BY_HOP: u8 = 0;
const DEST_OPTS: u8 = 60;

fn ip4(a: &str) -> [u8; 4] {
    a.parse::<std::net::Ipv4Addr>().expect("ipv4").octets()
}

fn ip6(a: &str) -> [u8; 16] {
    a.parse::<std::net::Ipv6Addr>().expect("ipv6").octets()
}

/// RFC 1071 sum, folded, not complemented.
fn fold_sum(data: &[u8], mut acc: u32) -> u16 {
    for c in data.chunks(2) {
        acc += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
    }
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The Internet checksum of `data`.
fn checksum(data: &[u8]) -> u16 {
    !fold_sum(data, 0)
}

/// A TCP/UDP/ICMPv6 checksum with the pseudo-header of `src`, `dst` (4 or 16 bytes each).
fn l4_checksum(src: &[u8], dst: &[u8], proto: u8, l4: &[u8]) -> u16 {
    let mut ps = Vec::new();
    ps.extend_from_slice(src);
    ps.extend_from_slice(dst);
    ps.extend_from_slice(&[0, proto]);
    ps.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    let pre = fold_sum(&ps, 0) as u32;
    !fold_sum(l4, pre)
}

fn fix_ipv4_checksum_len(f: &mut [u8], l3: usize, hl: usize) {
    f[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
    let c = checksum(&f[l3..l3 + hl]);
    f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
}

fn fix_ipv4_checksum(f: &mut [u8], l3: usize) {
    let hl = ((f[l3] & 0x0f) as usize) * 4;
    fix_ipv4_checksum_len(f, l3, hl);
}

/// An Ethernet II frame from the client to the gateway.
fn eth(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = GW_MAC.to_vec();
    f.extend_from_slice(&CLIENT_MAC);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An IPv4 packet; `frag` is the flags/fragment-offset word (DF 0x4000, MF 0x2000).
#[allow(clippy::too_many_arguments)]
fn ipv4(
    src: [u8; 4],
    dst: [u8; 4],
    proto: u8,
    ttl: u8,
    frag: u16,
    ident: u16,
    options: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    assert_eq!(options.len() % 4, 0);
    let hl = 20 + options.len();
    let mut p = vec![(0x40 | (hl / 4)) as u8, 0];
    p.extend_from_slice(&((hl + payload.len()) as u16).to_be_bytes());
    p.extend_from_slice(&ident.to_be_bytes());
    p.extend_from_slice(&frag.to_be_bytes());
    p.extend_from_slice(&[ttl, proto, 0, 0]);
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    p.extend_from_slice(options);
    let c = checksum(&p);
    p[10..12].copy_from_slice(&c.to_be_bytes());
    p.extend_from_slice(payload);
    p
}

/// An IPv6 packet.
fn ipv6(src: [u8; 16], dst: [u8; 16], next: u8, hop: u8, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0x60, 0, 0, 0];
    p.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    p.extend_from_slice(&[next, hop]);
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    p.extend_from_slice(payload);
    p
}

/// An IPv6 fragment header followed by `data`.
fn frag_header(next: u8, offset: u16, more: bool, ident: u32, data: &[u8]) -> Vec<u8> {
    let mut h = vec![next, 0];
    h.extend_from_slice(&(offset | more as u16).to_be_bytes());
    h.extend_from_slice(&ident.to_be_bytes());
    h.extend_from_slice(data);
    h
}

/// The transport segment of an untagged frame (after the IPv4 or IPv6 header).
fn l4_of(f: &[u8]) -> Vec<u8> {
    let hl = if f[14] >> 4 == 4 {
        ((f[14] & 0x0f) as usize) * 4
    } else {
        40
    };
    f[14 + hl..].to_vec()
}

/// An ICMPv4 error from `src` to `dst` quoting `quote`; `rest` is the 4-byte field after
/// the checksum (the next-hop MTU for fragmentation-needed).
fn icmp4(src: &str, dst: &str, typ: u8, code: u8, rest: [u8; 4], quote: &[u8]) -> Vec<u8> {
    let mut m = vec![typ, code, 0, 0];
    m.extend_from_slice(&rest);
    m.extend_from_slice(quote);
    let c = checksum(&m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    eth(0x0800, &ipv4(ip4(src), ip4(dst), 1, 64, 0, 0x0bad, &[], &m))
}

/// An ICMPv6 error, like [`icmp4`].
fn icmp6(src: &str, dst: &str, typ: u8, code: u8, rest: [u8; 4], quote: &[u8]) -> Vec<u8> {
    let mut m = vec![typ, code, 0, 0];
    m.extend_from_slice(&rest);
    m.extend_from_slice(quote);
    let c = l4_checksum(&ip6(src), &ip6(dst), 58, &m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    eth(0x86dd, &ipv6(ip6(src), ip6(dst), 58, 64, &m))
}

fn set_src_mac(f: &mut [u8], mac: [u8; 6]) {
    f[6..12].copy_from_slice(&mac);
}

/// Inserts an 802.1Q tag (`tci`) after the MACs.
fn with_vlan(f: &[u8], tci: u16) -> Vec<u8> {
    let mut o = f[..12].to_vec();
    o.extend_from_slice(&[0x81, 0x00]);
    o.extend_from_slice(&tci.to_be_bytes());
    o.extend_from_slice(&f[12..]);
    o
}

/// Sets the TTL / hop limit of an untagged frame (fixing the IPv4 checksum).
fn with_ttl(f: &[u8], ttl: u8) -> Vec<u8> {
    let mut o = f.to_vec();
    if o[14] >> 4 == 4 {
        o[14 + 8] = ttl;
        fix_ipv4_checksum(&mut o, 14);
    } else {
        o[14 + 7] = ttl;
    }
    o
}

/// Sets the IPv4 TOS of an untagged frame.
fn with_tos(f: &[u8], tos: u8) -> Vec<u8> {
    let mut o = f.to_vec();
    o[15] = tos;
    fix_ipv4_checksum(&mut o, 14);
    o
}

/// Clears the IPv4 DF bit of an untagged frame.
fn without_df(f: &[u8]) -> Vec<u8> {
    let mut o = f.to_vec();
    o[20] &= !0x40;
    fix_ipv4_checksum(&mut o, 14);
    o
}

/// Pads a frame with zeros to `len` bytes, as a NIC pads short frames.
fn padded(f: &[u8], len: usize) -> Vec<u8> {
    let mut o = f.to_vec();
    o.resize(len, 0);
    o
}

/// Inserts IPv4 options into an untagged frame's header. The transport checksum does not
/// cover the header, so it stays valid.
fn with_ipv4_options(f: &[u8], opts: &[u8]) -> Vec<u8> {
    assert_eq!(opts.len() % 4, 0);
    let mut o = f[..34].to_vec();
    o.extend_from_slice(opts);
    o.extend_from_slice(&f[34..]);
    o[14] = 0x40 | ((20 + opts.len()) / 4) as u8;
    let total = u16::from_be_bytes([o[16], o[17]]) + opts.len() as u16;
    o[16..18].copy_from_slice(&total.to_be_bytes());
    fix_ipv4_checksum(&mut o, 14);
    o
}

/// Inserts 8-byte option headers (Hop-by-Hop / Destination Options, each one PadN option)
/// between an untagged IPv6 frame's fixed header and its payload. The upper-layer checksum
/// does not cover them, so it stays valid.
fn with_ipv6_ext(f: &[u8], kinds: &[u8]) -> Vec<u8> {
    let upper = f[14 + 6];
    let mut o = f[..54].to_vec();
    for (i, _) in kinds.iter().enumerate() {
        let next = kinds.get(i + 1).copied().unwrap_or(upper);
        o.extend_from_slice(&[next, 0, 1, 4, 0, 0, 0, 0]);
    }
    o.extend_from_slice(&f[54..]);
    o[14 + 6] = kinds[0];
    let plen = u16::from_be_bytes([o[18], o[19]]) + 8 * kinds.len() as u16;
    o[18..20].copy_from_slice(&plen.to_be_bytes());
    o
}
