//! Traffic counting through the pipeline, in the in-memory driver: frames in, counts equal to
//! what was sent; and the counts' identity across table rebuilds. Apart from `traffic`,
//! which knows nothing of the pipeline that drives it.

use crate::flow::Timeouts;
use crate::pipeline::tests::{
    backend_by_mac, build, config, run, run_batch, CLIENT_MAC, GW_MAC, SEC,
};
use crate::pipeline::{Pipeline, Verdict};
use crate::table::Service;
use crate::table::{Builder, ServiceTable};
use crate::traffic::Tally;
use std::collections::HashMap;
use strait_testkit::config::{GatewayToml, ServiceToml};

/// An Ethernet/IPv4/TCP frame with `payload` bytes of data; its IP length is 40 + that.
fn segment(src: ([u8; 4], u16), dst: ([u8; 4], u16), syn: bool, payload: usize) -> Vec<u8> {
    let b = etherparse::PacketBuilder::ethernet2(CLIENT_MAC, GW_MAC)
        .ipv4(src.0, dst.0, 64)
        .tcp(src.1, dst.1, 1, 65535);
    let b = if syn { b.syn() } else { b.ack(1) };
    let mut out = Vec::new();
    b.write(&mut out, &vec![0x5a; payload]).expect("frame");
    out
}

fn addr(a: &str) -> [u8; 4] {
    a.parse::<core::net::Ipv4Addr>().expect("IPv4").octets()
}

fn tally(packets: u64, bytes: u64, out_packets: u64, out_bytes: u64) -> (u64, u64, u64, u64) {
    (packets, bytes, out_packets, out_bytes)
}

fn counts(t: &Tally) -> (u64, u64, u64, u64) {
    (t.in_packets, t.in_bytes, t.out_packets, t.out_bytes)
}

/// Sends `flows` connections from distinct client ports to `vip` (a SYN, then `data`
/// segments of growing size) and, in nat mode, `replies` replies per flow from the backend
/// the flow went to. Returns what each backend (by MAC) got: packets and bytes in and out.
#[allow(clippy::too_many_arguments)]
fn traffic(
    pipe: &mut Pipeline,
    t: &ServiceTable,
    vip: [u8; 4],
    first_port: u16,
    flows: u16,
    data: usize,
    replies: usize,
) -> HashMap<[u8; 6], (u64, u64, u64, u64)> {
    let mut got: HashMap<[u8; 6], (u64, u64, u64, u64)> = HashMap::new();
    for f in 0..flows {
        let client = ([192, 0, 2, 7], first_port + f);
        let mut mac = [0u8; 6];
        for i in 0..=data {
            let payload = i * 37 + f as usize;
            let (v, out) = run(pipe, t, SEC, &segment(client, (vip, 80), i == 0, payload));
            assert_eq!(v, Verdict::Tx { port: 0 });
            mac.copy_from_slice(&out[0..6]);
            let e = got.entry(mac).or_default();
            e.0 += 1;
            e.1 += 40 + payload as u64;
        }
        let b = backend_by_mac(t, &mac);
        for r in 0..replies {
            let payload = 100 + r;
            let from = (b.addr[12..].try_into().expect("IPv4"), b.port);
            let (v, out) = run(pipe, t, SEC, &segment(from, client, false, payload));
            assert_eq!(v, Verdict::Tx { port: 0 }, "the reply is translated");
            assert_eq!(&out[26..30], &vip, "from the VIP");
            let e = got.entry(mac).or_default();
            e.2 += 1;
            e.3 += 40 + payload as u64;
        }
    }
    got
}

fn sum<'a>(it: impl Iterator<Item = &'a (u64, u64, u64, u64)>) -> (u64, u64, u64, u64) {
    it.fold((0, 0, 0, 0), |a, b| {
        (a.0 + b.0, a.1 + b.1, a.2 + b.2, a.3 + b.3)
    })
}

#[test]
fn nat_counts_every_packet_and_byte_in_and_every_reply_out() {
    let x = ("198.51.100.11", 0x11);
    let y = ("198.51.100.12", 0x12);
    let z = ("198.51.100.13", 0x13);
    let t = build(&mut Builder::new(), &config("nat", &[x, y], &[z]));
    let mut pipe = Pipeline::new(0, 1, 1024, Timeouts::default(), 0);
    let a = traffic(&mut pipe, &t, [203, 0, 113, 10], 40000, 20, 3, 2);
    let b = traffic(&mut pipe, &t, [203, 0, 113, 20], 41000, 5, 1, 4);
    assert_eq!(a.len(), 2, "both of a's backends got flows: {a:?}");
    for (mac, want) in a.iter().chain(&b) {
        let be = backend_by_mac(&t, mac);
        assert_eq!(
            counts(&pipe.traffic.backend(&be)),
            *want,
            "backend {mac:02x?}"
        );
    }
    let (sa, sb) = (&t.services[0], &t.services[1]);
    assert_eq!(counts(&pipe.traffic.service(&t, sa)), sum(a.values()));
    assert_eq!(counts(&pipe.traffic.service(&t, sb)), sum(b.values()));
    // 20 flows of 4 segments (payloads 0, 37, 74, 111 plus the flow's number) and 2
    // replies each (100 and 101 bytes of payload).
    assert_eq!(
        counts(&pipe.traffic.service(&t, sa)),
        tally(80, 80 * 40 + 20 * 222 + 4 * 190, 40, 40 * 40 + 20 * 201)
    );
    // A reply without a flow is dropped and counts nowhere.
    let stray = segment((addr(z.0), 8080), ([192, 0, 2, 99], 9), false, 10);
    assert_eq!(
        run(&mut pipe, &t, SEC, &stray).0,
        Verdict::Drop(crate::stats::DropReason::ReplyNoFlow)
    );
    assert_eq!(counts(&pipe.traffic.service(&t, sb)), sum(b.values()));
}

#[test]
fn a_batch_counts_as_its_frames_one_by_one() {
    let x = ("198.51.100.11", 0x11);
    let y = ("198.51.100.12", 0x12);
    let t = build(&mut Builder::new(), &config("nat", &[x, y], &[]));
    // 70 frames (more than a batch and than the notes kept): new flows from 70 ports.
    let frames: Vec<Vec<u8>> = (0..70u16)
        .map(|i| {
            segment(
                ([192, 0, 2, 7], 30000 + i),
                ([203, 0, 113, 10], 80),
                true,
                i as usize,
            )
        })
        .collect();
    let mut one = Pipeline::new(0, 1, 1024, Timeouts::default(), 0);
    for f in &frames {
        let _ = run(&mut one, &t, SEC, f);
    }
    let mut batched = Pipeline::new(0, 1, 1024, Timeouts::default(), 0);
    let out = run_batch(&mut batched, &t, SEC, &frames, frames.len());
    assert!(out.iter().all(|(v, _)| *v == Verdict::Tx { port: 0 }));
    let s = &t.services[0];
    assert_eq!(
        counts(&batched.traffic.service(&t, s)),
        (70, 70 * 40 + 69 * 70 / 2, 0, 0)
    );
    assert_eq!(batched.traffic.service(&t, s), one.traffic.service(&t, s));
    for &id in &s.backends {
        let b = t.backend(id).expect("backend");
        assert_eq!(batched.traffic.backend(b), one.traffic.backend(b));
    }
}

#[test]
fn dsr_counts_in_only() {
    let x = ("198.51.100.21", 0x21);
    let t = build(&mut Builder::new(), &config("dsr-l2", &[x], &[]));
    let mut pipe = Pipeline::new(0, 1, 1024, Timeouts::default(), 0);
    let a = traffic(&mut pipe, &t, [203, 0, 113, 10], 40000, 3, 2, 0);
    assert_eq!(
        counts(&pipe.traffic.service(&t, &t.services[0])),
        sum(a.values())
    );
    assert_eq!(sum(a.values()).0, 9);
    // The backend's replies go straight to the client; one that reaches the gateway is
    // the kernel's, not the service's.
    let reply = segment((addr(x.0), 80), ([192, 0, 2, 7], 40000), false, 10);
    assert_eq!(run(&mut pipe, &t, SEC, &reply).0, Verdict::Pass);
    assert_eq!(pipe.traffic.service(&t, &t.services[0]).out_packets, 0);
}

/// A configuration of dsr-l2 services, each `(name, VIP's last byte, backend address,
/// its MAC's last byte)`.
fn services(list: &[(&str, u8, &str, u8)]) -> strait_config::model::Config {
    let mut g = GatewayToml::eth0();
    for (name, vip, backend, mac) in list {
        g = g.service(
            ServiceToml::new(name, &format!("203.0.113.{vip}"), 80)
                .mode("dsr-l2")
                .maglev_table_size(251)
                .backend_mac(backend, 80, &format!("02:00:00:00:01:{mac:02x}")),
        );
    }
    strait_config::parse(&g.to_string()).expect("test config")
}

fn service<'t>(t: &'t ServiceTable, name: &str) -> &'t Service {
    t.services
        .iter()
        .find(|s| s.name == name)
        .expect("the service")
}

fn send(pipe: &mut Pipeline, t: &ServiceTable, vip: u8, n: u16) {
    for i in 0..n {
        let f = segment(
            ([192, 0, 2, 8], 50000 + i),
            ([203, 0, 113, vip], 80),
            true,
            0,
        );
        assert_eq!(run(pipe, t, SEC, &f).0, Verdict::Tx { port: 0 });
    }
}

/// Rebuilds move services to other indexes and hand freed ids to newcomers: a service's
/// and a backend's counts follow them, and a newcomer never inherits its predecessor's.
fn counts_keep_their_identity(full: bool) {
    let mut builder = Builder::new();
    let t1 = build(
        &mut builder,
        &services(&[
            ("a", 10, "198.51.100.31", 0x31),
            ("b", 20, "198.51.100.32", 0x32),
        ]),
    );
    let mut pipe = Pipeline::new(0, 1, 1024, Timeouts::default(), 0);
    send(&mut pipe, &t1, 10, 3);
    send(&mut pipe, &t1, 20, 2);
    let (a1, b1) = (service(&t1, "a"), service(&t1, "b"));
    assert_eq!(pipe.traffic.service(&t1, a1).in_packets, 3);
    // a leaves: b takes index 0; then c arrives, which takes a's freed ids (service and
    // backend: a backend is new to its service's frontend).
    let only_b = services(&[("b", 20, "198.51.100.32", 0x32)]);
    let with_c = services(&[
        ("b", 20, "198.51.100.32", 0x32),
        ("c", 30, "198.51.100.33", 0x33),
    ]);
    let (t2, t3) = if full {
        let t2 = build(&mut builder, &only_b);
        let t3 = build(&mut builder, &with_c);
        (t2, t3)
    } else {
        use crate::table::Change;
        let t2 = builder
            .update(&t1, &[Change::Remove("a")], |_, _, _| false)
            .expect("update");
        let t3 = builder
            .update(&t2, &[Change::Set(&with_c.services[1])], |_, _, _| false)
            .expect("update");
        (t2, t3)
    };
    assert_eq!(t2.services[0].name, "b", "b moved to a's index");
    let b2 = service(&t2, "b");
    assert_eq!((b2.id, b2.incarnation), (b1.id, b1.incarnation));
    assert_eq!(
        pipe.traffic.service(&t2, b2).in_packets,
        2,
        "b's counts follow it"
    );
    send(&mut pipe, &t2, 20, 1);
    assert_eq!(pipe.traffic.service(&t2, b2).in_packets, 3);

    let c = service(&t3, "c");
    assert_eq!(c.id, a1.id, "c has a's freed id");
    assert_ne!(c.incarnation, a1.incarnation);
    let cb = t3.backend(c.backends[0]).expect("c's backend").clone();
    let ab = t1.backend(a1.backends[0]).expect("a's backend");
    assert_eq!(cb.id, ab.id, "c's backend has a's backend's freed id");
    assert_eq!(
        pipe.traffic.service(&t3, c),
        Tally {
            incarnation: c.incarnation,
            ..Tally::ZERO
        }
    );
    assert_eq!(pipe.traffic.backend(&cb).in_packets, 0, "nothing inherited");
    send(&mut pipe, &t3, 30, 1);
    assert_eq!(
        pipe.traffic.service(&t3, c).in_packets,
        1,
        "a's 3 are not c's"
    );
    assert_eq!(pipe.traffic.backend(&cb).in_packets, 1);
    assert_eq!(pipe.traffic.service(&t3, service(&t3, "b")).in_packets, 3);
    assert_eq!(t3.service_ids, 2, "ids stay dense");
}

#[test]
fn counts_keep_their_identity_across_full_builds() {
    counts_keep_their_identity(true);
}

#[test]
fn counts_keep_their_identity_across_updates() {
    counts_keep_their_identity(false);
}

/// A backend that leaves takes none of its service's counts with it, also when its id goes
/// to a newcomer of another service: a service's total is its backends' counts plus those of
/// the backends that left, and never falls.
#[test]
fn a_service_keeps_the_counts_of_backends_that_left() {
    let x = ("198.51.100.41", 0x41);
    let y = ("198.51.100.42", 0x42);
    let z = ("198.51.100.43", 0x43);
    let mut builder = Builder::new();
    let t1 = build(&mut builder, &config("dsr-l2", &[x, y], &[]));
    let mut pipe = Pipeline::new(0, 1, 1024, Timeouts::default(), 0);
    let a = traffic(&mut pipe, &t1, [203, 0, 113, 10], 40000, 20, 1, 0);
    assert_eq!(a.len(), 2, "both backends got flows: {a:?}");
    let before = pipe.traffic.service(&t1, &t1.services[0]);
    assert_eq!(counts(&before), sum(a.values()));
    let y_id = t1.services[0]
        .backends
        .iter()
        .filter_map(|&id| t1.backend(id))
        .find(|b| b.mac.map(|m| m.0) == Some([2, 0, 0, 0, 1, 0x42]))
        .expect("y")
        .id;

    // y leaves its service.
    let t2 = build(&mut builder, &config("dsr-l2", &[x], &[]));
    assert_eq!(pipe.traffic.service(&t2, &t2.services[0]), before);

    // Service b's backend takes y's freed id and counts from zero; a keeps y's counts.
    let t3 = build(&mut builder, &config("dsr-l2", &[x], &[z]));
    let zb = t3.backend(t3.services[1].backends[0]).expect("z").clone();
    assert_eq!(zb.id, y_id, "z has y's freed id");
    let b = traffic(&mut pipe, &t3, [203, 0, 113, 20], 41000, 5, 1, 0);
    assert_eq!(counts(&pipe.traffic.backend(&zb)), sum(b.values()));
    assert_eq!(pipe.traffic.service(&t3, &t3.services[0]), before);
    assert_eq!(
        counts(&pipe.traffic.service(&t3, &t3.services[1])),
        sum(b.values())
    );

    // The published copies read the same.
    let (mut services, mut backends) = (Vec::new(), Vec::new());
    pipe.traffic.export(&t3, &mut services, &mut backends);
    for s in &t3.services {
        assert_eq!(
            crate::traffic::current(&services, s.id.0, s.incarnation),
            pipe.traffic.service(&t3, s),
            "service {}",
            s.name
        );
    }
    assert_eq!(
        crate::traffic::current(&backends, zb.id.0, zb.incarnation),
        pipe.traffic.backend(&zb)
    );
}
