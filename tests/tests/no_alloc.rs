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
//! and the idle-time sweep; all of it with a capture armed (`strait capture`), whose
//! workers' side copies frames into its ring, filters some out, samples, and finds its ring
//! full. Frames are built (that allocates) before the allocator is armed;
//! the counted loop copies each into one preallocated buffer and calls `Pipeline::process`.

use etherparse::{icmpv4, Icmpv4Type, PacketBuilder};
use std::sync::Arc;

use strait_dataplane::capture::{Filter, Hub};
use strait_dataplane::pipeline::{Pipeline, Verdict};
use strait_dataplane::rewrite::{Frame, HEADROOM};
use strait_dataplane::stats::{Counters, DropReason};
use strait_dataplane::table::{Prefix, ServiceTable};
use strait_tests::{offload, sctp, sctp_data, sctp_init, tcp, udp, Bed, CLIENT_MAC, GW_MAC, SEC};

use strait_testkit::alloc::counted;
#[cfg(feature = "dpdk")]
use strait_testkit::packet_socket;

#[global_allocator]
static ALLOCATOR: strait_testkit::alloc::Counting = strait_testkit::alloc::Counting;

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

/// The traffic every test of this file drives: the shapes, one frame buffer, the source
/// port new flows count up, and the second pipeline (core 0 of 4, for handoffs) beside the
/// bed's own.
struct Traffic {
    shapes: Vec<Shape>,
    buf: Vec<u8>,
    port: u16,
    four: Pipeline,
}

impl Traffic {
    fn new(four: Pipeline) -> Self {
        Self {
            shapes: shapes(),
            buf: vec![0u8; HEADROOM + 2048],
            port: 0,
            four,
        }
    }

    /// Core 0 of 4 over [`CONFIG`].
    fn core_0_of_4() -> Pipeline {
        Bed::with(CONFIG, 1500, 4, 0).pipe
    }

    /// Runs `packets` frames through `bed`'s pipeline and this one ([`run`]).
    fn run(&mut self, bed: &mut Bed, packets: usize) -> Seen {
        run(
            &bed.table,
            &mut bed.pipe,
            &mut self.four,
            &self.shapes,
            &mut self.buf,
            &mut bed.now,
            &mut self.port,
            packets,
        )
    }
}

/// How much a counter grew.
fn grew(before: &Counters, after: &Counters, f: fn(&Counters) -> u64) -> u64 {
    f(after) - f(before)
}

/// The tests of this file share the allocation counter: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// This test's turn of the allocation counter.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn the_packet_path_does_not_allocate() {
    let _serial = serial();
    // A small table (4096 entries) so that new flows fill it: evictions and stateless flows
    // are exercised too. One core (no handoff) and core 0 of 4 (handoffs).
    let mut bed = Bed::new(CONFIG);
    // A capture armed on both pipelines: the client's frames (others filtered out), one in
    // two (the rest sampled out), no budget to speak of, a ring nobody drains while counted.
    let hub = Arc::new(Hub::new(2));
    let one = std::mem::replace(&mut bed.pipe, Pipeline::new(0, 1, 1, Default::default(), 0));
    bed.pipe = one.with_capture(hub.tap(0));
    let mut traffic = Traffic::new(Traffic::core_0_of_4().with_capture(hub.tap(1)));
    let mut capture = hub
        .arm(Filter {
            client: Some(Prefix::new("192.0.2.0".parse().unwrap(), 24)),
            every: 2,
            budget: u32::MAX,
            ..Filter::default()
        })
        .expect("no other capture");

    // Warm-up, not counted: opens the established flows, fills the table, touches every path
    // once (a lazy first-use allocation anywhere would be paid here, and is allowed).
    let warm = traffic.run(&mut bed, 20_000);
    assert!(warm.tx > 0 && warm.pass > 0 && warm.drop > 0, "{warm:?}");

    // The counter counts: one box is one allocation and one free.
    let ((), made) = counted(|| drop(std::hint::black_box(Box::new(7u64))));
    assert_eq!(made, 2, "the allocator does not count");

    // An empty ring to fill while counted (draining allocates: the control side's).
    capture.drain(|_| {});
    let captured_before = hub.counters(0);
    let before = bed.pipe.counters;
    let flows_before = bed.pipe.flows.stats();
    let (seen, events) = counted(|| traffic.run(&mut bed, 100_000));

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
    assert!(bed.pipe.counters.balanced() && traffic.four.counters.balanced());
    // The capture took every path of its own while counted.
    let captured = hub.counters(0);
    for (name, before, after) in [
        ("captured", captured_before.captured, captured.captured),
        ("filtered", captured_before.filtered, captured.filtered),
        ("sampled", captured_before.sampled, captured.sampled),
        ("ring_full", captured_before.ring_full, captured.ring_full),
    ] {
        assert!(after > before, "capture: {name} did not grow: {captured:?}");
    }
    assert!(hub.counters(1).captured > 0, "{:?}", hub.counters(1));
    drop(capture);
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
    let _serial = serial();

    let mut bed = Bed::new(CONFIG);
    let (mut ends, mut thread) = mesh(1, 256);
    bed.pipe =
        Pipeline::new(0, 1, 4096, Default::default(), 0).with_sync(ends.pop().expect("one worker"));
    let mut th = thread.pop().expect("one worker");
    let (mut ends4, _thread4) = mesh(4, 256);
    let mut traffic = Traffic::new(Traffic::core_0_of_4().with_sync(ends4.swap_remove(0)));
    let mut import_port = 1u16;

    let mut round = |bed: &mut Bed,
                     traffic: &mut Traffic,
                     th: &mut strait_dataplane::sync::ThreadEnds,
                     i: u64| {
        let _ = traffic.run(bed, 2_000);
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
            gone.backend.0[15] ^= 0xff;
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
        let _ = traffic.four.sync_turn(&bed.table, bed.now);
    };
    for i in 0..10 {
        round(&mut bed, &mut traffic, &mut th, i);
    }
    let before = bed.pipe.sync.as_ref().expect("sync").counters;
    let ((), events) = counted(|| {
        for i in 10..60 {
            round(&mut bed, &mut traffic, &mut th, i);
        }
    });
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

/// Answering the explain desk allocates nothing: for every shape of traffic (established
/// flows of every mode, nat replies, affinity, refused sources, frames of no service) the
/// worker's side takes the query, reads its flow table and writes the answer; the asker's
/// side sends and receives without allocating too.
#[test]
fn the_explain_desk_does_not_allocate() {
    use strait_dataplane::explain::desk;
    use strait_dataplane::wire::parse::parse;
    let _serial = serial();
    let mut bed = Bed::new(CONFIG);
    let (d, mut window) = desk();
    bed.pipe = Pipeline::new(0, 1, 4096, Default::default(), 0).with_explain(d);
    let mut traffic = Traffic::new(Traffic::core_0_of_4());
    let _ = traffic.run(&mut bed, 5_000);
    let keys: Vec<strait_dataplane::FlowKey> = traffic
        .shapes
        .iter()
        .filter_map(|s| parse(&s.frame).ok().flatten().map(|p| p.key))
        .collect();
    assert!(keys.len() > 20, "{} keys", keys.len());
    let mut answered = 0;
    let mut entries = 0;
    let ((), events) = counted(|| {
        for _ in 0..100 {
            for k in &keys {
                let id = window.send(k).expect("room");
                assert!(bed.pipe.explain_pending());
                answered += bed.pipe.explain_turn(&bed.table, bed.now);
                let p = window.receive(id).expect("answered");
                entries += usize::from(p.flow.is_some());
            }
        }
    });
    assert_eq!(answered, 100 * keys.len());
    assert!(entries > 0, "no query found a flow entry");
    assert_eq!(
        events, 0,
        "the explain desk allocated, reallocated or freed {events} times"
    );
}

/// The DPDK worker loop allocates nothing either: the gateway's real worker
/// ([`strait_dataplane::xsk::run_worker`]) over a real DPDK port
/// ([`strait_dpdk::DpdkGroup`]: a `net_af_packet` vdev on a veth of a namespace this test
/// makes, EAL with `--no-huge -m 512` and a file prefix of its own), with a counting
/// allocator armed on the worker's thread after a warm-up. See [`dpdk`].
#[cfg(feature = "dpdk")]
#[test]
fn the_dpdk_worker_loop_does_not_allocate() {
    let _serial = serial();
    dpdk::run();
}

/// The DPDK worker loop under the counting allocator.
///
/// ```text
///   netns sna{pid}-a                         netns sna{pid}-g
///   veth-a  02:00:00:00:00:c1  <──veth──>  dp-g  02:00:00:00:00:01   (wire: nftables ingress drop)
///   192.0.2.2/24               AF_PACKET      net_af_packet0 ── worker (run_worker, pipeline)
///   packet socket: injects                    tap-g 192.0.2.1/24: the exception TAP
/// ```
///
/// Traffic from veth-a: UDP to a dsr-l2 VIP and to a nat VIP (new flows and established),
/// whose backends are at veth-a's MAC, so every forwarded frame leaves through `tx_burst`
/// back onto the wire; ARP requests for tap-g's address, passed to the TAP (`write(2)`),
/// whose kernel's replies the worker reads from the TAP and sends on the port (the
/// exception path); frames for the kernel and malformed ones. After 2,000 frames of warm-up
/// (not counted: a lazy first use may allocate once), the worker's clock hook arms the
/// counter on the worker's own thread at the start of a turn; 20,000 more frames go through
/// and the hook disarms it. Zero allocations, reallocations or frees are allowed, and the
/// counted stretch must have forwarded, passed, dropped and sent exception frames. (DPDK's
/// own C code allocates from its mempools, not the Rust allocator; its per-packet path
/// takes mbufs from the pools.)
#[cfg(feature = "dpdk")]
mod dpdk {
    use std::io::Write as _;
    use std::process::Command;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::thread;
    use std::time::{Duration, Instant};

    use strait_dataplane::pipeline::Pipeline;
    use strait_dataplane::table::Builder;
    use strait_dataplane::xsk::{interface_port, run_worker, Handoff, WorkerStats};
    use strait_dpdk::{Dpdk, EalOptions, PortSpec, ThreadRegistration};
    use strait_testkit::harness::{enter_netns, ip, Netns};
    use strait_testkit::privileged as gate;
    use strait_tests::{udp, CLIENT_MAC, GW_MAC};

    use super::packet_socket::PacketSocket;
    use strait_testkit::alloc::{ALLOCS, COUNTING};
    use strait_testkit::config::{GatewayToml, ServiceToml};

    /// The gateway: the DPDK port on dp-g (its exception TAP tap-g), a dsr-l2 UDP service
    /// and a nat one (53 to 5353), both to veth-a's address and MAC.
    fn config() -> String {
        let service = |name, vip, port, mode, backend_port| {
            ServiceToml::new(name, vip, port)
                .protocol("udp")
                .mode(mode)
                .backend_mac("192.0.2.2", backend_port, "02:00:00:00:00:c1")
        };
        GatewayToml::new()
            .set("new_flows_per_second_per_core", 0)
            .table("[gateway.dpdk]\nno_huge = true\nmemory_mb = 512")
            .interface("tap-g", &[0])
            .interface_set("driver", r#""dpdk""#)
            .interface_set("device", r#""net_af_packet0,iface=dp-g""#)
            .service(service("dsr", "203.0.113.10", 80, "dsr-l2", 80))
            .service(service("nat", "203.0.113.12", 53, "nat", 5353))
            .to_string()
    }

    /// Frames of warm-up, and frames counted.
    const WARM: u64 = 2_000;
    const COUNTED: u64 = 20_000;
    /// Frames written before waiting for the worker to take them: well under the PMD's
    /// receive ring, so none is lost for want of room.
    const CHUNK: u64 = 128;

    fn must(args: &[&str]) {
        ip(args).unwrap_or_else(|e| panic!("{e}"));
    }

    fn nft(ns: &str, rule: &str) {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "nft", rule])
            .output()
            .expect("running nft");
        assert!(
            out.status.success(),
            "nft {rule}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// What the worker published last (its hook runs on the worker's thread and only stores).
    #[derive(Default)]
    struct Seen {
        rx: AtomicU64,
        tx: AtomicU64,
        passed: AtomicU64,
        exception_out: AtomicU64,
        dropped: AtomicU64,
    }

    impl Seen {
        fn store(&self, pipe: &Pipeline, st: &WorkerStats) {
            self.rx.store(st.rx, Ordering::Relaxed);
            self.tx.store(st.tx, Ordering::Relaxed);
            self.passed.store(st.passed, Ordering::Relaxed);
            self.exception_out
                .store(st.exception_out, Ordering::Relaxed);
            self.dropped
                .store(pipe.counters.dropped(), Ordering::Relaxed);
        }

        fn now(&self) -> [u64; 5] {
            [
                &self.rx,
                &self.tx,
                &self.passed,
                &self.exception_out,
                &self.dropped,
            ]
            .map(|a| a.load(Ordering::Relaxed))
        }
    }

    /// Frame `i` of the traffic: new dsr-l2 and nat flows, established ones, an ARP request
    /// for tap-g's address, a frame for the kernel (UDP to the gateway's own address), a
    /// truncated IPv4 header.
    fn frame(i: u64) -> Vec<u8> {
        let port = 1024 + (i % 60_000) as u16;
        match i % 8 {
            0 | 1 => udp("192.0.2.2", port, "203.0.113.10", 80, b"dsr"),
            2 | 3 => udp("192.0.2.2", port, "203.0.113.12", 53, b"nat"),
            4 => udp("192.0.2.2", 40000, "203.0.113.10", 80, b"established"),
            5 => {
                let mut f = vec![0xff; 6];
                f.extend_from_slice(&CLIENT_MAC);
                f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
                f.extend_from_slice(&CLIENT_MAC);
                f.extend_from_slice(&[192, 0, 2, 2]);
                f.extend_from_slice(&[0; 6]);
                f.extend_from_slice(&[192, 0, 2, 1]);
                f
            }
            6 => udp("192.0.2.2", 40001, "192.0.2.1", 9, b"kernel"),
            _ => udp("192.0.2.2", port, "203.0.113.10", 80, b"x")[..24].to_vec(),
        }
    }

    /// Writes frames `range` from veth-a in namespace `ns`, [`CHUNK`] at a time, each chunk
    /// once the worker has read the one before.
    fn inject(ns: &str, seen: &Arc<Seen>, range: std::ops::Range<u64>) -> Result<(), String> {
        let (ns, seen) = (ns.to_owned(), Arc::clone(seen));
        thread::spawn(move || -> Result<(), String> {
            enter_netns(&ns);
            let mut sock = PacketSocket::open("veth-a", Duration::from_millis(50))
                .map_err(|e| e.to_string())?;
            let mut i = range.start;
            while i < range.end {
                let chunk = CHUNK.min(range.end - i);
                let target = seen.now()[0] + chunk;
                for _ in 0..chunk {
                    sock.write_all(&frame(i))
                        .map_err(|e| format!("send: {e}"))?;
                    i += 1;
                }
                let t = Instant::now();
                while seen.now()[0] < target {
                    if t.elapsed() > Duration::from_secs(20) {
                        return Err(format!(
                            "the worker read {} of {target} frames",
                            seen.now()[0]
                        ));
                    }
                    thread::sleep(Duration::from_micros(200));
                }
            }
            Ok(())
        })
        .join()
        .map_err(|_| "the sender panicked".to_owned())?
    }

    pub(super) fn run() {
        if !gate::privileged("DPDK no-allocation", &[gate::IP, gate::NFT]) {
            return;
        }
        let pid = std::process::id();
        // The two namespaces (and with them the veth and the TAP), deleted on drop.
        let (guard_a, guard_g) = (
            Netns::add(&format!("sna{pid}-a")),
            Netns::add(&format!("sna{pid}-g")),
        );
        let (ns_a, ns_g) = (guard_a.name(), guard_g.name());
        let mac = |m: [u8; 6]| {
            m.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":")
        };
        let (mac_a, mac_g) = (mac(CLIENT_MAC), mac(GW_MAC));
        must(&[
            "-n", ns_a, "link", "add", "veth-a", "address", &mac_a, "type", "veth", "peer", "name",
            "dp-g", "address", &mac_g, "netns", ns_g,
        ]);
        must(&["-n", ns_a, "addr", "add", "192.0.2.2/24", "dev", "veth-a"]);
        must(&["-n", ns_a, "link", "set", "veth-a", "up"]);
        must(&["-n", ns_g, "link", "set", "dp-g", "up"]);
        // The wire of a DPDK port: the kernel of -g ignores what arrives on it (after the
        // PMD's packet socket has its copy).
        nft(ns_g, "add table netdev wire");
        nft(
            ns_g,
            "add chain netdev wire dp-g { type filter hook ingress device dp-g priority 0 ; policy drop ; }",
        );

        // This thread (and the worker it spawns) in -g: EAL's packet socket and the TAP are
        // made here.
        enter_netns(ns_g);
        let cfg = strait_config::parse(&config()).unwrap_or_else(|e| panic!("{e}"));
        let d = cfg.gateway.dpdk.clone().expect("[gateway.dpdk]");
        let opts = EalOptions {
            cores: vec![0],
            memory_mb: d.memory_mb,
            no_huge: d.no_huge,
            file_prefix: format!("strait-noalloc-{pid}"),
        };
        let spec = PortSpec {
            name: "tap-g".into(),
            device: "net_af_packet0,iface=dp-g".into(),
            table_port: 0,
            queues: vec![0],
            mtu: 1500,
        };
        let mut ports = Dpdk::open(&opts, &[spec]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ports.mac("tap-g"), Some(GW_MAC), "the port's MAC is dp-g's");
        must(&["-n", ns_g, "addr", "add", "192.0.2.1/24", "dev", "tap-g"]);
        let link = interface_port("tap-g").unwrap_or_else(|e| panic!("{e}"));
        let table = Arc::new(
            Builder::new()
                .build(&cfg, &[link], |_, _, _| false)
                .unwrap_or_else(|e| panic!("{e}")),
        );
        let mut group = ports.group(0, &[0]).unwrap_or_else(|e| panic!("{e}"));
        ports.start().unwrap_or_else(|e| panic!("{e}"));

        let stop = Arc::new(AtomicBool::new(false));
        let arm = Arc::new(AtomicBool::new(false));
        let armed = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Seen::default());
        let worker = {
            let (stop, arm, armed, seen) = (stop.clone(), arm.clone(), armed.clone(), seen.clone());
            thread::spawn(move || {
                let _reg = ThreadRegistration::new();
                let mut pipe = Pipeline::new(0, 1, 4096, Default::default(), 0);
                let origin = Instant::now();
                // The clock runs at the start of every turn: there it arms or disarms the
                // counter of this thread, between turns.
                let clock = || {
                    let want = arm.load(Ordering::Relaxed);
                    if armed.load(Ordering::Relaxed) != want {
                        COUNTING.with(|c| c.set(want));
                        armed.store(want, Ordering::Relaxed);
                    }
                    origin.elapsed().as_nanos() as u64
                };
                let r = run_worker(
                    &mut group,
                    &mut pipe,
                    &mut Handoff::none(),
                    || table.clone(),
                    &stop,
                    clock,
                    |p: &Pipeline, st: &WorkerStats| seen.store(p, st),
                );
                COUNTING.with(|c| c.set(false));
                (r.map_err(|e| e.to_string()), pipe.counters, group)
            })
        };

        let warm = inject(ns_a, &seen, 0..WARM);
        // Arm, and wait for the worker to take it at a turn's start.
        let wait = |what: &str, f: &dyn Fn() -> bool| {
            let t = Instant::now();
            while !f() {
                assert!(t.elapsed() < Duration::from_secs(20), "{what}");
                thread::sleep(Duration::from_millis(1));
            }
        };
        let before = seen.now();
        ALLOCS.store(0, Ordering::Relaxed);
        arm.store(true, Ordering::Relaxed);
        wait("the worker did not arm", &|| armed.load(Ordering::Relaxed));
        let counted = match &warm {
            Ok(()) => inject(ns_a, &seen, WARM..WARM + COUNTED),
            Err(_) => Ok(()),
        };
        // The kernel's last ARP replies through the TAP, then a worker gone idle.
        thread::sleep(Duration::from_millis(200));
        arm.store(false, Ordering::Relaxed);
        wait("the worker did not disarm", &|| {
            !armed.load(Ordering::Relaxed)
        });
        let events = ALLOCS.load(Ordering::Relaxed);
        let after = seen.now();
        stop.store(true, Ordering::Relaxed);
        let (r, counters, group) = worker.join().expect("worker");
        drop(group);
        drop(ports);
        warm.unwrap_or_else(|e| panic!("warm-up: {e}"));
        counted.unwrap_or_else(|e| panic!("counted run: {e}"));
        let st = r.unwrap_or_else(|e| panic!("worker: {e}"));
        assert!(counters.balanced(), "{counters:?}");
        let grew = |k: usize| after[k] - before[k];
        let names = ["rx", "tx", "passed", "exception_out", "dropped"];
        for (k, name) in names.iter().enumerate() {
            assert!(
                grew(k) > 0,
                "{name} did not grow while counted: {before:?} -> {after:?} ({st:?})"
            );
        }
        assert!(grew(0) >= COUNTED, "{before:?} -> {after:?}");
        assert_eq!(
            events,
            0,
            "the DPDK worker loop allocated, reallocated or freed {events} times in {} frames",
            grew(0)
        );
        drop((guard_g, guard_a));
    }
}
