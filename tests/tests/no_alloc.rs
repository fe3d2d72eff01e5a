//! The packet path never allocates: 100,000 frames of mixed traffic through every mode, with
//! a counting global allocator armed, make zero allocations, reallocations or frees.
//!
//! The traffic covers every branch a worker takes: new flows and established ones in each
//! mode (IPv4 and IPv6), nat replies, ClientIP affinity, ICMP errors (forwarded and nat
//! translated), fragments (first and later), checksums left to offload by the sender
//! (completed in every mode), SCTP in every mode (its CRC32c verified and recomputed by nat),
//! ICMP "too big" answers to frames that do not fit
//! the tunnel, RSTs without a flow, source-ACL drops, malformed frames, replies without a flow,
//! frames for the kernel, handoffs to another core's nat flows, a flow table small enough to
//! fill (evictions and stateless flows), a clock that runs long enough for entries to expire,
//! and the idle-time sweep. Frames are built (that allocates) before the allocator is armed;
//! the counted loop copies each into one preallocated buffer and calls `Pipeline::process`.

use std::sync::atomic::Ordering;

use etherparse::{icmpv4, Icmpv4Type, PacketBuilder};
use strait_dataplane::pipeline::{Pipeline, Verdict};
use strait_dataplane::rewrite::{Frame, HEADROOM};
use strait_dataplane::stats::{Counters, DropReason};
use strait_dataplane::table::ServiceTable;
use strait_tests::{offload, sctp, sctp_data, sctp_init, tcp, udp, Bed, CLIENT_MAC, GW_MAC, SEC};

#[path = "../../dataplane/tests/support/counting_alloc.rs"]
mod counting;
use counting::{ALLOCS, COUNTING};

use strait_tests::ALL_MODES as CONFIG;

/// A pristine frame and, for frames that should open a new flow each time, the offset of the
/// transport source port that the loop overwrites with a counter (checksums are then stale;
/// the pipeline does not verify them, and their value does not change what it allocates).
struct Shape {
    frame: Vec<u8>,
    new_flow_port_at: Option<usize>,
    /// Run on the 4-core pipeline (nat handoffs) instead of the 1-core one.
    four_cores: bool,
}

/// Source-port offsets: Ethernet 14 + IPv4 20, or + IPv6 40.
const V4_SPORT: usize = 34;
const V6_SPORT: usize = 54;

fn shapes() -> Vec<Shape> {
    let new4 = |frame| Shape {
        frame,
        new_flow_port_at: Some(V4_SPORT),
        four_cores: false,
    };
    let new6 = |frame| Shape {
        frame,
        new_flow_port_at: Some(V6_SPORT),
        four_cores: false,
    };
    let same = |frame| Shape {
        frame,
        new_flow_port_at: None,
        four_cores: false,
    };

    // Fragments of one UDP datagram to the nat DNS service: the first (MF, offset 0) and a
    // later one (offset 1480).
    let mut first = udp("192.0.2.7", 5000, "203.0.113.13", 53, &[7u8; 64]);
    first[20..22].copy_from_slice(&0x2000u16.to_be_bytes());
    fix_ipv4_checksum(&mut first);
    let mut later = first.clone();
    later[20..22].copy_from_slice(&(1480u16 / 8).to_be_bytes());
    fix_ipv4_checksum(&mut later);

    let mut arp = vec![0xffu8; 6];
    arp.extend_from_slice(&CLIENT_MAC);
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0u8; 28]);

    let syn = tcp("192.0.2.7", 40000, "203.0.113.10", 80, "S", &[]);

    vec![
        // New flows, every mode and family.
        new4(tcp("192.0.2.7", 1, "203.0.113.10", 80, "S", &[])),
        new4(tcp("192.0.2.7", 1, "203.0.113.11", 80, "S", &[])),
        new4(tcp("192.0.2.7", 1, "203.0.113.12", 80, "S", &[])),
        new4(tcp("192.0.2.7", 1, "203.0.113.13", 80, "S", &[])),
        new4(udp("192.0.2.7", 1, "203.0.113.13", 53, b"query")),
        new4(tcp("192.0.2.7", 1, "203.0.113.15", 80, "S", &[])),
        new6(tcp("2001:db8:2::7", 1, "2001:db8::10", 80, "S", &[])),
        new6(tcp("2001:db8:2::7", 1, "2001:db8::11", 80, "S", b"hello")),
        // Established flows (the warm-up opened them) and their nat replies.
        same(tcp("192.0.2.7", 40000, "203.0.113.10", 80, "A", b"data")),
        same(tcp("192.0.2.7", 40000, "203.0.113.11", 80, "A", b"data")),
        same(tcp("192.0.2.7", 40000, "203.0.113.12", 80, "PA", b"data")),
        same(tcp("192.0.2.7", 40000, "203.0.113.13", 80, "A", b"data")),
        same(tcp(
            "198.51.100.21",
            8080,
            "192.0.2.7",
            40000,
            "A",
            b"reply",
        )),
        same(tcp(
            "198.51.100.22",
            8080,
            "192.0.2.7",
            40000,
            "A",
            b"reply",
        )),
        same(udp("192.0.2.7", 40000, "203.0.113.13", 53, b"query")),
        same(udp("198.51.100.21", 5353, "192.0.2.7", 40000, b"answer")),
        same(tcp("2001:db8:2::7", 40000, "2001:db8::10", 80, "A", &[])),
        same(tcp(
            "2001:db8:1::21",
            8080,
            "2001:db8:2::7",
            40000,
            "A",
            &[],
        )),
        same(tcp("192.0.2.7", 40000, "203.0.113.10", 80, "FA", &[])),
        // Checksums left to offload (the source port a new flow's loop writes is not in the
        // pseudo-header, so those stay partial too).
        new4(offload(&tcp("192.0.2.7", 1, "203.0.113.13", 80, "S", &[]))),
        same(offload(&tcp(
            "192.0.2.7",
            40000,
            "203.0.113.10",
            80,
            "A",
            b"data",
        ))),
        same(offload(&tcp(
            "192.0.2.7",
            40000,
            "203.0.113.12",
            80,
            "PA",
            b"data",
        ))),
        same(offload(&udp(
            "192.0.2.7",
            40000,
            "203.0.113.13",
            53,
            b"query",
        ))),
        same(offload(&tcp(
            "198.51.100.22",
            8080,
            "192.0.2.7",
            40000,
            "A",
            b"reply",
        ))),
        same(offload(&tcp(
            "2001:db8:2::7",
            40000,
            "2001:db8::11",
            80,
            "A",
            b"data",
        ))),
        // ICMP errors about VIP flows: dsr (forwarded) and nat (translated).
        same(frag_needed([203, 0, 113, 10], 80)),
        same(frag_needed([203, 0, 113, 13], 80)),
        same(frag_needed([203, 0, 113, 99], 80)),
        // Fragments.
        same(first),
        same(later),
        // Too big for the tunnel, DF set: answered with ICMP.
        same(tcp(
            "192.0.2.7",
            40000,
            "203.0.113.11",
            80,
            "A",
            &[0u8; 1460],
        )),
        // RST without a flow, ACL, reply without a flow, the kernel's, garbage.
        new4(tcp("192.0.2.7", 1, "203.0.113.10", 80, "R", &[])),
        same(tcp("192.0.2.200", 40000, "203.0.113.14", 443, "S", &[])),
        same(tcp("198.51.100.21", 8080, "192.0.2.99", 1, "A", &[])),
        same(tcp("192.0.2.7", 40000, "192.0.2.1", 22, "S", &[])),
        same(arp),
        same(syn[..20].to_vec()),
        same(syn[..40].to_vec()),
        // SCTP: new associations in every mode (nat's with a CRC32c left to offload, which
        // the port the loop writes cannot make wrong), an established nat association both
        // ways (CRC verified, then recomputed), and a damaged one dropped.
        new4(sctp("192.0.2.7", 1, "203.0.113.30", 7777, 0, &sctp_init(1))),
        new4(sctp("192.0.2.7", 1, "203.0.113.31", 7777, 0, &sctp_init(1))),
        new4(sctp("192.0.2.7", 1, "203.0.113.32", 7777, 0, &sctp_init(1))),
        new4(offload(&sctp(
            "192.0.2.7",
            1,
            "203.0.113.33",
            7777,
            0,
            &sctp_init(1),
        ))),
        new6(offload(&sctp(
            "2001:db8:2::7",
            1,
            "2001:db8::33",
            7777,
            0,
            &sctp_init(1),
        ))),
        same(sctp(
            "192.0.2.7",
            40000,
            "203.0.113.33",
            7777,
            2,
            &sctp_data(1, b"data"),
        )),
        same(sctp(
            "198.51.100.24",
            17777,
            "192.0.2.7",
            40000,
            1,
            &sctp_data(1, b"reply"),
        )),
        same({
            let mut f = sctp(
                "192.0.2.7",
                40000,
                "203.0.113.33",
                7777,
                2,
                &sctp_data(2, b"data"),
            );
            let n = f.len();
            f[n - 1] ^= 1;
            f
        }),
        // nat flows owned by other cores: handed off.
        Shape {
            frame: tcp("192.0.2.8", 1, "203.0.113.13", 80, "S", &[]),
            new_flow_port_at: Some(V4_SPORT),
            four_cores: true,
        },
    ]
}

/// A router's "fragmentation needed" about the VIP's reply from `vip:port` to the client
/// 192.0.2.7:40000, quoting its IPv4 header and 8 bytes of TCP.
fn frag_needed(vip: [u8; 4], port: u16) -> Vec<u8> {
    let mut reply = Vec::new();
    PacketBuilder::ethernet2(GW_MAC, CLIENT_MAC)
        .ipv4(vip, [192, 0, 2, 7], 64)
        .tcp(port, 40000, 1, 65535)
        .ack(1)
        .write(&mut reply, &[])
        .expect("build reply");
    let mut frame = Vec::new();
    PacketBuilder::ethernet2(CLIENT_MAC, GW_MAC)
        .ipv4([192, 0, 2, 254], vip, 64)
        .icmpv4(Icmpv4Type::DestinationUnreachable(
            icmpv4::DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: 1280 },
        ))
        .write(&mut frame, &reply[14..14 + 28])
        .expect("build icmp");
    frame
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

/// What the loop saw.
#[derive(Default, Debug)]
struct Seen {
    tx: u64,
    pass: u64,
    drop: u64,
    handoff: u64,
}

/// Runs `packets` frames, cycling through `shapes`, through the pipelines; 1 ms of clock per
/// frame, a sweep every 256 frames. Allocates nothing itself.
#[allow(clippy::too_many_arguments)]
fn run(
    table: &ServiceTable,
    one: &mut Pipeline,
    four: &mut Pipeline,
    shapes: &[Shape],
    buf: &mut [u8],
    now: &mut u64,
    port: &mut u16,
    packets: usize,
) -> Seen {
    let mut seen = Seen::default();
    for (i, s) in shapes.iter().cycle().take(packets).enumerate() {
        let len = s.frame.len();
        buf[HEADROOM..HEADROOM + len].copy_from_slice(&s.frame);
        if let Some(at) = s.new_flow_port_at {
            *port = port.wrapping_add(1).max(1);
            buf[HEADROOM + at..HEADROOM + at + 2].copy_from_slice(&port.to_be_bytes());
        }
        *now += SEC / 1000;
        let pipe = if s.four_cores { &mut *four } else { &mut *one };
        let mut f = Frame::new(buf, HEADROOM, len);
        // Every other frame through the batch path (a batch of one), so both entry points
        // are counted.
        let verdict = if i % 2 == 0 {
            pipe.process(table, *now, 0, &mut f)
        } else {
            let mut v = [Verdict::Pass];
            pipe.process_batch(table, *now, 0, std::slice::from_mut(&mut f), &mut v);
            v[0]
        };
        match verdict {
            Verdict::Tx { .. } => seen.tx += 1,
            Verdict::Pass => seen.pass += 1,
            Verdict::Drop(_) => seen.drop += 1,
            Verdict::Handoff { .. } => seen.handoff += 1,
        }
        if i % 256 == 255 {
            one.flows.sweep(*now, 64);
            four.flows.sweep(*now, 64);
        }
    }
    seen
}

/// How much a counter grew.
fn grew(before: &Counters, after: &Counters, f: fn(&Counters) -> u64) -> u64 {
    f(after) - f(before)
}

/// The tests of this file share [`ALLOCS`]: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn the_packet_path_does_not_allocate() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // A small table (4096 entries) so that new flows fill it: evictions and stateless flows
    // are exercised too. One core (no handoff) and core 0 of 4 (handoffs).
    let mut bed = Bed::new(CONFIG);
    let mut four = Bed::with(CONFIG, 1500, 4, 0).pipe;
    let shapes = shapes();
    let mut buf = vec![0u8; HEADROOM + 2048];
    let mut port = 0u16;

    // Warm-up, not counted: opens the established flows, fills the table, touches every path
    // once (a lazy first-use allocation anywhere would be paid here, and is allowed).
    let warm = run(
        &bed.table,
        &mut bed.pipe,
        &mut four,
        &shapes,
        &mut buf,
        &mut bed.now,
        &mut port,
        20_000,
    );
    assert!(warm.tx > 0 && warm.pass > 0 && warm.drop > 0, "{warm:?}");

    // The counter counts: one box is one allocation and one free.
    COUNTING.with(|c| c.set(true));
    drop(std::hint::black_box(Box::new(7u64)));
    COUNTING.with(|c| c.set(false));
    assert_eq!(
        ALLOCS.swap(0, Ordering::Relaxed),
        2,
        "the allocator does not count"
    );

    let before = bed.pipe.counters;
    let flows_before = bed.pipe.flows.stats();
    COUNTING.with(|c| c.set(true));
    let seen = run(
        &bed.table,
        &mut bed.pipe,
        &mut four,
        &shapes,
        &mut buf,
        &mut bed.now,
        &mut port,
        100_000,
    );
    COUNTING.with(|c| c.set(false));
    let events = ALLOCS.load(Ordering::Relaxed);

    let after = bed.pipe.counters;
    let flows_after = bed.pipe.flows.stats();
    // The counted run really took the paths it claims to cover.
    assert!(
        seen.tx > 0 && seen.pass > 0 && seen.drop > 0 && seen.handoff > 0,
        "{seen:?}"
    );
    for (name, f) in [
        (
            "flows_created",
            (|c: &Counters| c.flows_created) as fn(&Counters) -> u64,
        ),
        ("fragments", |c| c.fragments),
        ("icmp_errors_forwarded", |c| c.icmp_errors_forwarded),
        ("icmp_too_big_sent", |c| c.icmp_too_big_sent),
        ("rst_without_flow", |c| c.rst_without_flow),
        ("checksum_completed", |c| c.checksum_completed),
        ("dropped", |c| c.dropped()),
        ("sctp_checksum drops", |c| {
            c.drops_for(DropReason::SctpChecksum)
        }),
    ] {
        assert!(
            grew(&before, &after, f) > 0,
            "{name} did not grow: {after:?}"
        );
    }
    assert!(
        flows_after.expired > flows_before.expired,
        "no entry expired: {flows_after:?}"
    );
    assert!(
        flows_after.evicted + flows_after.full > flows_before.evicted + flows_before.full,
        "the table never filled: {flows_after:?}"
    );
    assert!(bed.pipe.counters.balanced() && four.counters.balanced());
    assert_eq!(
        events, 0,
        "the packet path allocated, reallocated or freed {events} times in 100,000 frames"
    );
}

/// Flow sync's worker side allocates nothing either: exporting new flows and state changes
/// into the out ring (and dropping on a full one), importing records of every outcome from
/// the in ring, walking a dump; and the sync thread's ends of the rings.
#[test]
fn the_sync_paths_do_not_allocate() {
    use strait_dataplane::sync::{mesh, SyncRecord};
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);

    let mut bed = Bed::new(CONFIG);
    let (mut ends, mut thread) = mesh(1, 256);
    bed.pipe =
        Pipeline::new(0, 1, 4096, Default::default(), 0).with_sync(ends.pop().expect("one worker"));
    let mut th = thread.pop().expect("one worker");
    let mut four = Bed::with(CONFIG, 1500, 4, 0).pipe;
    let (mut ends4, _thread4) = mesh(4, 256);
    four = four.with_sync(ends4.swap_remove(0));
    let shapes = shapes();
    let mut buf = vec![0u8; HEADROOM + 2048];
    let mut port = 0u16;
    let mut import_port = 1u16;

    let mut round = |bed: &mut Bed,
                     four: &mut Pipeline,
                     th: &mut strait_dataplane::sync::ThreadEnds,
                     port: &mut u16,
                     i: u64| {
        let _ = run(
            &bed.table,
            &mut bed.pipe,
            four,
            &shapes,
            &mut buf,
            &mut bed.now,
            port,
            2_000,
        );
        // The sync thread's part, in miniature: every exported record comes back as a peer's
        // copy of it (refreshed), as a flow new here (imported), and with a backend or a
        // frontend this table does not have.
        while let Some(r) = th.from_worker.pop() {
            let r = r.expect("decodes");
            import_port = import_port.wrapping_add(1).max(1);
            let new = SyncRecord {
                key: strait_dataplane::FlowKey {
                    src_port: import_port,
                    ..r.key
                },
                ..r
            };
            let mut gone = r;
            gone.backend[15] ^= 0xff;
            let mut elsewhere = r;
            elsewhere.key.dst_port ^= 0x5a5a;
            for rec in [r, new, gone, elsewhere] {
                let _ = th.to_worker.push(&rec);
            }
            while bed.pipe.sync_turn(&bed.table, bed.now) > 0 {}
        }
        if i.is_multiple_of(8) {
            th.dump
                .requested
                .store(i / 8 + 1, std::sync::atomic::Ordering::Release);
        }
        let _ = four.sync_turn(&bed.table, bed.now);
    };
    for i in 0..10 {
        round(&mut bed, &mut four, &mut th, &mut port, i);
    }
    let before = bed.pipe.sync.as_ref().expect("sync").counters;
    ALLOCS.store(0, Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    for i in 10..60 {
        round(&mut bed, &mut four, &mut th, &mut port, i);
    }
    COUNTING.with(|c| c.set(false));
    let events = ALLOCS.load(Ordering::Relaxed);
    let after = bed.pipe.sync.as_ref().expect("sync").counters;
    for (name, a, b) in [
        ("exported", after.exported, before.exported),
        ("export_full", after.export_full, before.export_full),
        ("imported", after.imported, before.imported),
        ("refreshed", after.refreshed, before.refreshed),
        (
            "unknown_backend",
            after.unknown_backend,
            before.unknown_backend,
        ),
        (
            "unknown_service",
            after.unknown_service,
            before.unknown_service,
        ),
        ("dumped", after.dumped, before.dumped),
    ] {
        assert!(a > b, "{name} did not grow: {after:?}");
    }
    assert_eq!(
        events, 0,
        "the sync paths allocated, reallocated or freed {events} times"
    );
}
