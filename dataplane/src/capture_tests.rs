//! The capture's side of the pipeline, driven through `Pipeline::process_batch`: frames
//! before and after their rewrite, filters, sampling, the budget, a full ring, sessions.
//! Apart from `capture`'s own tests because they drive the pipeline, which sits above the
//! capture (a test there reaching up would make a circle of the module graph).

use std::net::IpAddr;
use std::sync::Arc;

use strait_config::model::Mode;

use crate::capture::*;
use crate::flow::Timeouts;
use crate::pipeline::tests::{build, config, run_batch, tcp, CLIENT, SEC, VIP_A};
use crate::pipeline::{Pipeline, Verdict};
use crate::stats::DropReason;
use crate::table::{Builder, Prefix, ServiceTable};

const X: (&str, u8) = ("198.51.100.11", 0x11);

/// A one-core pipeline on a dsr-l2 (or nat) table with one backend, tapped into `hub`.
fn bed(mode: &str) -> (Arc<Hub>, Pipeline, ServiceTable) {
    let t = build(&mut Builder::new(), &config(mode, &[X], &[]));
    let hub = Arc::new(Hub::new(1));
    let pipe = Pipeline::new(0, 1, 1024, Timeouts::default(), 0).with_capture(hub.tap(0));
    (hub, pipe, t)
}

/// Runs `frames` through `process_batch` in calls of up to 32; the verdicts and the frames
/// as they leave.
fn batch(
    pipe: &mut Pipeline,
    t: &ServiceTable,
    now: u64,
    frames: &[Vec<u8>],
) -> Vec<(Verdict, Vec<u8>)> {
    run_batch(pipe, t, now, frames, 32)
}

/// What a session drained: (direction, verdict, service, backend, mode, bytes).
type Got = (
    Direction,
    Decision,
    Option<String>,
    Option<(IpAddr, u16)>,
    Option<Mode>,
    Vec<u8>,
);

fn drain(s: &mut Session) -> Vec<Got> {
    let mut got = Vec::new();
    s.drain(|r| {
        got.push((
            r.direction,
            r.verdict,
            r.service.map(str::to_owned),
            r.backend,
            r.mode,
            r.data.to_vec(),
        ))
    });
    got
}

fn from(src: [u8; 4], port: u16) -> Vec<u8> {
    tcp((src, port), VIP_A, true)
}

#[test]
fn a_forwarded_frame_is_captured_before_and_after_its_rewrite() {
    let (hub, mut pipe, t) = bed("dsr-l2");
    let mut s = hub.arm(Filter::default()).unwrap();
    let syn = tcp(CLIENT, VIP_A, true);
    let out = batch(&mut pipe, &t, SEC, std::slice::from_ref(&syn));
    assert_eq!(out[0].0, Verdict::Tx { port: 0 });
    let got = drain(&mut s);
    assert_eq!(got.len(), 2, "{got:?}");
    let (d, v, svc, b, m, bytes) = &got[0];
    assert_eq!(
        (*d, *v, svc.as_deref(), *b, *m),
        (
            Direction::In,
            Decision::Tx { port: 0 },
            Some("a"),
            None,
            Some(Mode::DsrL2)
        )
    );
    assert_eq!(
        bytes, &syn,
        "the copy as received is the frame before its rewrite"
    );
    let (d, _, svc, b, m, bytes) = &got[1];
    assert_eq!(
        (*d, svc.as_deref(), *m),
        (Direction::Out, Some("a"), Some(Mode::DsrL2))
    );
    assert_eq!(*b, Some(("198.51.100.11".parse().unwrap(), 80)));
    assert_eq!(bytes, &out[0].1, "the copy as sent is the frame as it left");
    assert_eq!(
        bytes[..6],
        [2, 0, 0, 0, 1, 0x11],
        "dsr-l2: the backend's MAC"
    );
    assert_eq!(bytes[14..], syn[14..], "dsr-l2: the same IP packet");
    assert_eq!(hub.counters(0).captured, 1);
    assert!(pipe.counters.balanced());
}

#[test]
fn nat_records_name_the_translated_backend() {
    let (hub, mut pipe, t) = bed("nat");
    let mut s = hub.arm(Filter::default()).unwrap();
    let out = batch(&mut pipe, &t, SEC, &[tcp(CLIENT, VIP_A, true)]);
    assert_eq!(out[0].0, Verdict::Tx { port: 0 });
    let got = drain(&mut s);
    assert_eq!(got[1].3, Some(("198.51.100.11".parse().unwrap(), 8080)));
    assert_eq!(
        got[1].5[30..34],
        [198, 51, 100, 11],
        "nat: the destination rewritten"
    );
    assert_eq!(got[0].5[30..34], [203, 0, 113, 10], "as received: the VIP");
}

#[test]
fn a_drop_capture_keeps_only_drops_with_their_reason() {
    let (hub, mut pipe, t) = bed("dsr-l2");
    let mut s = hub
        .arm(Filter {
            outcome: Outcome::Drop,
            ..Filter::default()
        })
        .unwrap();
    let mut bad = tcp(CLIENT, VIP_A, true);
    bad[24] ^= 0xff; // the IPv4 header checksum
    let out = batch(&mut pipe, &t, SEC, &[tcp(CLIENT, VIP_A, true), bad.clone()]);
    assert_eq!(out[1].0, Verdict::Drop(DropReason::Ipv4HeaderChecksum));
    let got = drain(&mut s);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].0, got[0].1),
        (
            Direction::In,
            Decision::Drop(DropReason::Ipv4HeaderChecksum)
        )
    );
    assert_eq!(got[0].5, bad);
    let c = hub.counters(0);
    assert_eq!((c.captured, c.filtered), (1, 1));
}

#[test]
fn a_frame_that_does_not_parse_is_judged_by_its_claimed_addresses() {
    let (hub, mut pipe, t) = bed("dsr-l2");
    let mut s = hub
        .arm(Filter {
            client: Some(Prefix::new("192.0.2.0".parse().unwrap(), 24)),
            ..Filter::default()
        })
        .unwrap();
    let mut bad = from([192, 0, 2, 9], 1000);
    bad[24] ^= 0xff;
    let mut elsewhere = from([198, 51, 100, 99], 1000);
    elsewhere[24] ^= 0xff;
    let _ = batch(
        &mut pipe,
        &t,
        SEC,
        &[bad, elsewhere, from([198, 51, 100, 99], 1001)],
    );
    let got = drain(&mut s);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(hub.counters(0).filtered, 2);
}

#[test]
fn a_full_ring_loses_records_never_packets() {
    let (hub, mut pipe, t) = bed("dsr-l2");
    let mut s = hub.arm(Filter::default()).unwrap();
    // Two records a frame: the ring holds RING_SLOTS / 2 frames.
    let frames: Vec<_> = (0..RING_SLOTS as u16)
        .map(|i| from([192, 0, 2, 7], 1000 + i))
        .collect();
    let out = batch(&mut pipe, &t, SEC, &frames);
    assert!(
        out.iter().all(|(v, _)| *v == Verdict::Tx { port: 0 }),
        "every packet forwarded"
    );
    let c = hub.counters(0);
    assert_eq!(c.captured, RING_SLOTS as u64 / 2);
    assert_eq!(c.ring_full, RING_SLOTS as u64 / 2);
    assert_eq!(pipe.counters.tx, RING_SLOTS as u64);
    assert_eq!(drain(&mut s).len(), RING_SLOTS);
    // Drained: room again.
    let _ = batch(&mut pipe, &t, SEC, &frames[..3]);
    assert_eq!(drain(&mut s).len(), 6);
}

#[test]
fn sampling_and_the_budget_are_counted() {
    let (hub, mut pipe, t) = bed("dsr-l2");
    let mut s = hub
        .arm(Filter {
            every: 3,
            budget: 4,
            ..Filter::default()
        })
        .unwrap();
    let frames: Vec<_> = (0..30).map(|i| from([192, 0, 2, 7], 2000 + i)).collect();
    let _ = batch(&mut pipe, &t, SEC, &frames);
    let c = hub.counters(0);
    // Frames 3, 6, 9, 12 taken, 8 sampled out; then the budget is spent for the 18 left.
    assert_eq!((c.captured, c.over_budget, c.sampled), (4, 18, 8), "{c:?}");
    assert_eq!(drain(&mut s).len(), 8);
    // The next second has a budget again.
    let _ = batch(&mut pipe, &t, 2 * SEC, &frames[..3]);
    assert_eq!(hub.counters(0).captured, 5);
}

#[test]
fn one_session_at_a_time_and_a_dropped_one_disarms() {
    let (hub, mut pipe, t) = bed("dsr-l2");
    let s = hub.arm(Filter::default()).unwrap();
    assert_eq!(hub.arm(Filter::default()).unwrap_err(), ArmError::Busy);
    let _ = batch(&mut pipe, &t, SEC, &[from([192, 0, 2, 7], 1)]);
    drop(s);
    assert!(!hub.is_armed());
    let _ = batch(&mut pipe, &t, SEC, &[from([192, 0, 2, 7], 2)]);
    assert_eq!(hub.counters(0).captured, 1, "nothing taken once disarmed");
    // The next session skips what the first one left in the ring.
    let mut s = hub
        .arm(Filter {
            port: Some(3),
            ..Filter::default()
        })
        .unwrap();
    let _ = batch(
        &mut pipe,
        &t,
        SEC,
        &[from([192, 0, 2, 7], 3), from([192, 0, 2, 7], 4)],
    );
    let got = drain(&mut s);
    assert_eq!(got.len(), 2, "only this session's frame: {got:?}");
    assert_eq!(got[0].5, from([192, 0, 2, 7], 3));
}

#[test]
fn a_handoff_names_the_owner_core() {
    let t = build(&mut Builder::new(), &config("nat", &[X], &[]));
    let hub = Arc::new(Hub::new(2));
    let mut pipe = Pipeline::new(0, 2, 1024, Timeouts::default(), 0).with_capture(hub.tap(0));
    let mut s = hub.arm(Filter::default()).unwrap();
    let frames: Vec<_> = (0..16).map(|i| from([192, 0, 2, 7], 3000 + i)).collect();
    let out = batch(&mut pipe, &t, SEC, &frames);
    let handed = out
        .iter()
        .filter(|(v, _)| *v == Verdict::Handoff { core: 1 })
        .count();
    assert!(handed > 0, "no frame of 16 is core 1's");
    let got = drain(&mut s);
    let records = got
        .iter()
        .filter(|g| g.1 == Decision::Handoff { core: 1 })
        .inspect(|g| assert_eq!(g.0, Direction::In, "a handed-off frame is not sent here"))
        .count();
    assert_eq!(records, handed);
}

#[test]
fn a_snaplen_cuts_the_copy_not_the_length() {
    let (hub, mut pipe, t) = bed("dsr-l2");
    let mut s = hub
        .arm(Filter {
            snaplen: 20,
            ..Filter::default()
        })
        .unwrap();
    let f = from([192, 0, 2, 7], 5);
    let _ = batch(&mut pipe, &t, SEC, std::slice::from_ref(&f));
    let mut lens = Vec::new();
    s.drain(|r| lens.push((r.data.len(), r.len as usize)));
    assert_eq!(lens, [(20, f.len()), (20, f.len())]);
}
