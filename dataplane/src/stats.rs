//! Per-core counters and the reasons a packet is dropped.
//!
//! Each worker owns one [`Counters`]; nothing is shared or atomic on the packet path. The IO
//! layer publishes copies for the admin API. Every frame ends in exactly one outcome, so
//! `rx == tx + pass + handoff + sum(drops)` holds at every instant between two frames
//! ([`Counters::balanced`]).

/// Why a frame was dropped. `Copy`, one byte, no allocation: the hot path's error type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DropReason {
    /// Shorter than an Ethernet header (or its VLAN tag).
    EthTruncated,
    /// IPv4/IPv6 header or the stated total length does not fit in the frame.
    IpTruncated,
    /// IP version, header length or total length is impossible.
    IpMalformed,
    /// An IPv4 header whose checksum does not verify.
    Ipv4HeaderChecksum,
    /// An IPv6 extension-header chain that is too long, misordered or truncated.
    Ipv6ExtensionHeaders,
    /// A TCP/UDP/SCTP/ICMP header that does not fit (SCTP: shorter than its 12-byte common
    /// header), or has an impossible length.
    L4Truncated,
    /// An ICMP error whose embedded packet is too short to find the flow.
    IcmpEmbeddedTruncated,
    /// An ICMP error about a VIP for which no flow exists.
    IcmpNoFlow,
    /// Source address outside the service's `source_ranges`.
    SourceNotAllowed,
    /// The service has no backend able to take the packet.
    NoBackend,
    /// The backend's next-hop MAC is not known.
    NoNextHop,
    /// TTL / hop limit would reach zero where the gateway routes (nat).
    TtlExceeded,
    /// Encapsulation would exceed the MTU and the packet may not be answered with ICMP
    /// (IPv4 without DF: the gateway does not fragment).
    MtuExceeded,
    /// Not enough headroom in the frame for the encapsulation header.
    NoHeadroom,
    /// A non-first fragment whose service cannot be told (several services share the VIP
    /// and protocol and only the first fragment carries the port).
    FragmentAmbiguous,
    /// A fragment of a nat reply: the reply's ports are only in the first fragment, and the
    /// gateway does not reassemble.
    FragmentedReply,
    /// A nat flow whose reply tuple is already owned by another flow.
    NatCollision,
    /// A nat-mode frame for a port the gateway does not know how to route back.
    NoEgress,
    /// A packet from a nat backend's service port that belongs to no flow (expired, or
    /// never translated): dropped rather than leaking the backend's address to the client.
    ReplyNoFlow,
    /// Unicast to another MAC than the ingress port's: a switch flooding an unknown
    /// destination, or the port in promiscuous mode. The host it is for gets its own copy.
    OtherHost,
    /// Tagged with an 802.1Q VLAN the ingress port does not serve.
    VlanNotServed,
    /// An SCTP packet to be nat-ed (its port rewritten, so its CRC32c recomputed) whose
    /// CRC32c does not verify: damaged on the way; recomputing would hide it.
    SctpChecksum,
    /// An IP fragment of an SCTP packet to be nat-ed: its CRC32c covers the whole SCTP
    /// packet, which the gateway does not reassemble (SCTP avoids IP fragmentation by
    /// path-MTU discovery, RFC 9260 section 7.3).
    SctpFragment,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 23] = [
        DropReason::EthTruncated,
        DropReason::IpTruncated,
        DropReason::IpMalformed,
        DropReason::Ipv4HeaderChecksum,
        DropReason::Ipv6ExtensionHeaders,
        DropReason::L4Truncated,
        DropReason::IcmpEmbeddedTruncated,
        DropReason::IcmpNoFlow,
        DropReason::SourceNotAllowed,
        DropReason::NoBackend,
        DropReason::NoNextHop,
        DropReason::TtlExceeded,
        DropReason::MtuExceeded,
        DropReason::NoHeadroom,
        DropReason::FragmentAmbiguous,
        DropReason::FragmentedReply,
        DropReason::NatCollision,
        DropReason::NoEgress,
        DropReason::ReplyNoFlow,
        DropReason::OtherHost,
        DropReason::VlanNotServed,
        DropReason::SctpChecksum,
        DropReason::SctpFragment,
    ];
    /// Number of reasons.
    pub const COUNT: usize = Self::ALL.len();

    /// A stable snake_case name, used as the Prometheus label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            DropReason::EthTruncated => "eth_truncated",
            DropReason::IpTruncated => "ip_truncated",
            DropReason::IpMalformed => "ip_malformed",
            DropReason::Ipv4HeaderChecksum => "ipv4_header_checksum",
            DropReason::Ipv6ExtensionHeaders => "ipv6_extension_headers",
            DropReason::L4Truncated => "l4_truncated",
            DropReason::IcmpEmbeddedTruncated => "icmp_embedded_truncated",
            DropReason::IcmpNoFlow => "icmp_no_flow",
            DropReason::SourceNotAllowed => "source_not_allowed",
            DropReason::NoBackend => "no_backend",
            DropReason::NoNextHop => "no_next_hop",
            DropReason::TtlExceeded => "ttl_exceeded",
            DropReason::MtuExceeded => "mtu_exceeded",
            DropReason::NoHeadroom => "no_headroom",
            DropReason::FragmentAmbiguous => "fragment_ambiguous",
            DropReason::FragmentedReply => "fragmented_reply",
            DropReason::NatCollision => "nat_collision",
            DropReason::NoEgress => "no_egress",
            DropReason::ReplyNoFlow => "reply_no_flow",
            DropReason::OtherHost => "other_host",
            DropReason::VlanNotServed => "vlan_not_served",
            DropReason::SctpChecksum => "sctp_checksum",
            DropReason::SctpFragment => "sctp_fragment",
        }
    }
}

impl core::fmt::Display for DropReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One core's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Frames given to the pipeline.
    pub rx: u64,
    /// Frames sent out (forwarded, or answered with ICMP).
    pub tx: u64,
    /// Frames handed to the kernel.
    pub pass: u64,
    /// Frames handed to another core (nat flows owned elsewhere).
    pub handoff: u64,
    /// Drops by [`DropReason`] (indexed by `reason as usize`).
    pub drops: [u64; DropReason::COUNT],
    /// New flows entered in the flow table.
    pub flows_created: u64,
    /// New flows forwarded without state: table full for this bucket.
    pub stateless_full: u64,
    /// New flows forwarded without state: above the per-core new-flow rate cap.
    pub stateless_rate_limited: u64,
    /// Flows whose backend left the snapshot or failed, re-hashed on their next packet.
    pub flows_rehashed: u64,
    /// New connections (TCP SYN, SCTP INIT) on the 5-tuple of a closing flow, a reused client
    /// port: given a backend afresh, not the closed connection's.
    pub flows_reopened: u64,
    /// RSTs (and SCTP ABORTs) for unknown flows, forwarded by Maglev without creating state.
    pub rst_without_flow: u64,
    /// IP fragments forwarded by the 3-tuple hash.
    pub fragments: u64,
    /// ICMP errors about VIP flows forwarded to the flow's backend.
    pub icmp_errors_forwarded: u64,
    /// ICMP "fragmentation needed" / "packet too big" answers sent to clients.
    pub icmp_too_big_sent: u64,
    /// Frames sent with a TCP/UDP checksum completed by the gateway: their sender left it to
    /// checksum offload (a local veth or tap), so it held only the pseudo-header sum (an SCTP
    /// CRC32c: zero).
    pub checksum_completed: u64,
}

impl Counters {
    /// Counts a drop.
    #[inline(always)]
    pub fn drop(&mut self, r: DropReason) {
        self.drops[r as usize] += 1;
    }

    /// Total drops over all reasons.
    pub fn dropped(&self) -> u64 {
        self.drops.iter().sum()
    }

    /// Drops for one reason.
    pub fn drops_for(&self, r: DropReason) -> u64 {
        self.drops[r as usize]
    }

    /// The accounting identity: every received frame has exactly one outcome.
    pub fn balanced(&self) -> bool {
        self.rx == self.tx + self.pass + self.handoff + self.dropped()
    }

    /// Adds another core's counters into these (for totals).
    pub fn add(&mut self, o: &Counters) {
        self.rx += o.rx;
        self.tx += o.tx;
        self.pass += o.pass;
        self.handoff += o.handoff;
        for (a, b) in self.drops.iter_mut().zip(o.drops.iter()) {
            *a += b;
        }
        self.flows_created += o.flows_created;
        self.stateless_full += o.stateless_full;
        self.stateless_rate_limited += o.stateless_rate_limited;
        self.flows_rehashed += o.flows_rehashed;
        self.flows_reopened += o.flows_reopened;
        self.rst_without_flow += o.rst_without_flow;
        self.fragments += o.fragments;
        self.icmp_errors_forwarded += o.icmp_errors_forwarded;
        self.icmp_too_big_sent += o.icmp_too_big_sent;
        self.checksum_completed += o.checksum_completed;
    }
}

/// Time a worker spends on turns that found work: the forwarding CPU's cost of its packets.
///
/// A busy-polling worker's thread uses its whole core whether frames arrive or not, so its
/// CPU time says nothing about what a packet costs; the time of the turns that moved frames
/// (ring work, the pipeline, the TX kicks) does: `ns / packets` is the worker's CPU per
/// packet, whatever the offered rate. The loop reads its monotonic clock at the start and the
/// end of such a turn (vDSO, no syscall) and hands both readings to [`BusyTime::turn`].
/// Wall time, so what interrupts a turn on the same core (an interrupt, softirq work the TX
/// kick triggers, another thread preempting) is in it too.
///
/// The turn's last part, the TX kick (the port driver's `drain_tx`), is also counted on its
/// own in `kick_ns`, read once more from the clock before it: on copy-mode AF_XDP the kernel
/// copies every frame into an skb and transmits it inside that `sendto` (on a veth, the
/// peer's receive with it), work a zero-copy driver leaves to the NIC; a DPDK port sends in
/// its batch (the PMD's TX burst), so its kick is empty. `ns - kick_ns` is the worker's own
/// part: ring work and the pipeline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BusyTime {
    /// Nanoseconds in turns that found work.
    pub ns: u64,
    /// Of `ns`, the nanoseconds in those turns' TX kicks.
    pub kick_ns: u64,
    /// Turns that found work.
    pub turns: u64,
}

impl BusyTime {
    /// Counts one busy turn from `start_ns` to `end_ns` whose TX kick began at `kick_ns`
    /// (a clock that went back counts 0; the kick is clamped into the turn).
    #[inline(always)]
    pub fn turn(&mut self, start_ns: u64, kick_ns: u64, end_ns: u64) {
        let total = end_ns.saturating_sub(start_ns);
        self.ns += total;
        self.kick_ns += end_ns.saturating_sub(kick_ns).min(total);
        self.turns += 1;
    }

    /// The busy time in seconds.
    pub fn seconds(&self) -> f64 {
        self.ns as f64 / 1e9
    }

    /// The TX kicks' part of the busy time, in seconds.
    pub fn kick_seconds(&self) -> f64 {
        self.kick_ns as f64 / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_indexed_in_order_and_named_uniquely() {
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
        let mut names: Vec<_> = DropReason::ALL.iter().map(|r| r.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DropReason::COUNT);
    }

    #[test]
    fn identity() {
        let mut c = Counters {
            rx: 3,
            tx: 1,
            pass: 1,
            ..Default::default()
        };
        assert!(!c.balanced());
        c.drop(DropReason::NoBackend);
        assert!(c.balanced());
        let mut t = Counters::default();
        t.add(&c);
        t.add(&c);
        assert_eq!(t.rx, 6);
        assert_eq!(t.drops_for(DropReason::NoBackend), 2);
        assert!(t.balanced());
    }

    #[test]
    fn busy_time_adds_turns_and_ignores_a_clock_going_back() {
        let mut b = BusyTime::default();
        b.turn(1_000, 1_400, 1_500);
        b.turn(2_000, 2_000, 2_000);
        b.turn(3_000, 2_950, 2_900);
        assert_eq!(
            b,
            BusyTime {
                ns: 500,
                kick_ns: 100,
                turns: 3
            }
        );
        // A kick read before the turn's start (a clock going back) is clamped into the turn.
        b.turn(10_000, 9_000, 10_200);
        assert_eq!((b.ns, b.kick_ns), (700, 300));
        b.turn(0, 500_000_000, 1_000_000_000);
        assert!((b.seconds() - 1.0000007).abs() < 1e-12);
        assert!((b.kick_seconds() - 0.5000003).abs() < 1e-12);
    }
}
