//! Flow sync through the pipeline: a flow learnt from a peer keeps its backend; what is
//! exported, dumped and refused. Apart from `sync`'s own tests, which need no pipeline,
//! because these drive `pipeline::Pipeline` and `sync` knows nothing of it.

use std::sync::atomic::Ordering;

use crate::flow::FlowState;
use crate::key::{proto, v4_mapped, FlowKey};
use crate::pipeline::tests::{
    backend_by_mac, build, config, run, tcp, CLIENT, CLIENT_MAC, SEC, VIP_A,
};
use crate::pipeline::{Pipeline, Verdict};
use crate::stats::DropReason;
use crate::sync::*;
use crate::table::Builder;

const X: (&str, u8) = ("198.51.100.11", 0x11);
const Y: (&str, u8) = ("198.51.100.12", 0x12);
const Z: (&str, u8) = ("198.51.100.13", 0x13);
const W: (&str, u8) = ("198.51.100.14", 0x14);

fn synced(slots: u32) -> (Pipeline, ThreadEnds) {
    let (mut w, mut th) = mesh(1, slots);
    let pipe = Pipeline::new(0, 1, 4096, crate::flow::Timeouts::default(), 0)
        .with_sync(w.pop().expect("one"));
    (pipe, th.pop().expect("one"))
}

fn drain(th: &mut ThreadEnds) -> Vec<SyncRecord> {
    std::iter::from_fn(|| th.from_worker.pop().map(|r| r.expect("decodes"))).collect()
}

/// A client port whose flow gateway A (backends `a`) sends to a backend that gateway B
/// (backends `b`) also has, but that B's Maglev would not pick.
fn moved_flow(mode: &str, a: &[(&str, u8)], b: &[(&str, u8)]) -> u16 {
    let (ta, tb) = (
        build(&mut Builder::new(), &config(mode, a, &[])),
        build(&mut Builder::new(), &config(mode, b, &[])),
    );
    (40000..41000)
        .find(|&port| {
            let mut pa = Pipeline::new(0, 1, 64, Default::default(), 0);
            let mut pb = Pipeline::new(0, 1, 64, Default::default(), 0);
            let (_, oa) = run(&mut pa, &ta, SEC, &tcp((CLIENT.0, port), VIP_A, true));
            let (_, ob) = run(&mut pb, &tb, SEC, &tcp((CLIENT.0, port), VIP_A, true));
            oa[0..6] != ob[0..6]
        })
        .expect("some flow moves when the backend set changes")
}

#[test]
fn an_imported_flow_keeps_its_backend_where_maglev_would_move_it() {
    for mode in ["dsr-l2", "nat"] {
        let port = moved_flow(mode, &[X, Y], &[X, Y, Z, W]);
        let client = (CLIENT.0, port);
        let mut builder = Builder::new();
        let ta = build(&mut builder, &config(mode, &[X, Y], &[]));
        let (mut a, mut a_th) = synced(64);
        let (v, out) = run(&mut a, &ta, SEC, &tcp(client, VIP_A, true));
        assert_eq!(v, Verdict::Tx { port: 0 });
        let chosen = backend_by_mac(&ta, &out[0..6]);
        let recs = drain(&mut a_th);
        assert_eq!(recs.len(), 1, "{mode}: one record per new flow");
        let r = recs[0];
        assert_eq!((r.backend, r.backend_port), (chosen.addr, chosen.port));
        assert_eq!(r.state, FlowState::TcpSyn);
        assert_eq!(r.everywhere(), mode != "nat");
        assert_eq!(SyncRecord::from_bytes(&r.to_bytes()), Ok(r));
        // The handshake completes: a state change, exported too.
        let _ = run(&mut a, &ta, SEC, &tcp(client, VIP_A, false));
        let recs = drain(&mut a_th);
        assert_eq!(recs.len(), 1, "{mode}: the state change");
        assert_eq!(recs[0].state, FlowState::TcpEstablished);
        let _ = run(&mut a, &ta, SEC, &tcp(client, VIP_A, false));
        assert!(drain(&mut a_th).is_empty(), "no change, nothing sent");
        assert_eq!(a.sync.as_ref().unwrap().counters.exported, 2);

        // Gateway B has more backends: Maglev alone would move the flow.
        let tb = build(&mut Builder::new(), &config(mode, &[X, Y, Z, W], &[]));
        let (mut b, mut b_th) = synced(64);
        assert!(b_th.to_worker.push(&recs[0]));
        assert_eq!(b.sync_turn(&tb, 2 * SEC), 1);
        assert_eq!(b.sync.as_ref().unwrap().counters.imported, 1);
        let (v, out) = run(&mut b, &tb, 2 * SEC, &tcp(client, VIP_A, false));
        assert_eq!(v, Verdict::Tx { port: 0 });
        assert_eq!(
            out[0..6],
            chosen.mac.unwrap().0,
            "{mode}: the recorded backend, not Maglev's"
        );
        assert_eq!(b.counters.flows_created, 0);
        let key = FlowKey {
            src: v4_mapped(client.0),
            dst: v4_mapped(VIP_A.0),
            src_port: client.1,
            dst_port: VIP_A.1,
            proto: proto::TCP,
        };
        assert!(
            b.flows.peek(&key).unwrap().learnt(),
            "{mode}: marked learnt"
        );
        assert!(!a.flows.peek(&key).unwrap().learnt(), "{mode}: made here");
        assert!(
            drain(&mut b_th).is_empty(),
            "an imported flow is not echoed"
        );
        if mode == "nat" {
            let addr: [u8; 4] = chosen.addr[12..].try_into().unwrap();
            let (v, out) = run(&mut b, &tb, 2 * SEC, &tcp((addr, 8080), client, false));
            assert_eq!(
                v,
                Verdict::Tx { port: 0 },
                "the reply finds the imported entry"
            );
            assert_eq!(&out[26..30], &VIP_A.0);
            assert_eq!(&out[0..6], &CLIENT_MAC, "to the recorded peer MAC");
        }
    }
}

#[test]
fn records_this_table_cannot_follow_are_counted_and_dropped() {
    let t = build(&mut Builder::new(), &config("dsr-l2", &[X, Y], &[]));
    let (mut p, mut th) = synced(128);
    let good = SyncRecord {
        key: FlowKey::new(
            [192, 0, 2, 7].into(),
            [203, 0, 113, 10].into(),
            crate::key::proto::TCP,
            40001,
            80,
        ),
        backend: crate::key::v4_mapped([198, 51, 100, 11]),
        backend_port: 80,
        state: FlowState::TcpEstablished,
        kind: RecordKind::Flow,
        flags: flags::EVERYWHERE,
        peer_mac: [0; 6].into(),
    };
    let unknown_backend = SyncRecord {
        backend: crate::key::v4_mapped([198, 51, 100, 99]),
        ..good
    };
    let unknown_service = SyncRecord {
        key: FlowKey {
            dst_port: 81,
            ..good.key
        },
        ..good
    };
    let other_backend = SyncRecord {
        backend: crate::key::v4_mapped([198, 51, 100, 12]),
        ..good
    };
    let late_syn = SyncRecord {
        state: FlowState::TcpSyn,
        ..good
    };
    for r in [
        good,
        late_syn,
        unknown_backend,
        unknown_service,
        other_backend,
    ] {
        assert!(th.to_worker.push(&r));
    }
    assert_eq!(p.sync_turn(&t, SEC), 5);
    assert_eq!(
        p.flows.lookup(&good.key, SEC).map(|v| v.state),
        Some(FlowState::TcpEstablished),
        "a late record does not demote an established entry"
    );
    let c = p.sync.as_ref().unwrap().counters;
    assert_eq!(
        (
            c.imported,
            c.refreshed,
            c.unknown_backend,
            c.unknown_service,
            c.conflict
        ),
        (1, 1, 1, 1, 1)
    );
    assert_eq!(p.flows.len(), 1);
    // The budget bounds a turn.
    for _ in 0..IMPORT_BUDGET + 5 {
        assert!(th.to_worker.push(&good));
    }
    assert_eq!(p.sync_turn(&t, SEC), IMPORT_BUDGET);
    assert_eq!(p.sync_turn(&t, SEC), 5);
    assert_eq!(p.sync_turn(&t, SEC), 0);
}

#[test]
fn a_full_out_ring_drops_and_counts_never_blocks() {
    let t = build(&mut Builder::new(), &config("dsr-l2", &[X, Y], &[]));
    let (mut p, mut th) = synced(4);
    for port in 0..10 {
        let (v, _) = run(&mut p, &t, SEC, &tcp((CLIENT.0, 50000 + port), VIP_A, true));
        assert_eq!(v, Verdict::Tx { port: 0 });
    }
    let c = p.sync.as_ref().unwrap().counters;
    assert_eq!((c.exported, c.export_full), (4, 6));
    assert_eq!(drain(&mut th).len(), 4);
    assert_eq!(p.counters.drops_for(DropReason::NoBackend), 0);
}

#[test]
fn a_dump_walks_the_table_in_bounded_steps_and_sends_every_flow_once() {
    for mode in ["dsr-l2", "nat"] {
        let t = build(&mut Builder::new(), &config(mode, &[X, Y], &[]));
        let (mut p, mut th) = synced(SYNC_SLOTS);
        let flows = 300u16;
        for port in 0..flows {
            let (v, _) = run(&mut p, &t, SEC, &tcp((CLIENT.0, 20000 + port), VIP_A, true));
            assert_eq!(v, Verdict::Tx { port: 0 });
        }
        assert_eq!(drain(&mut th).len(), flows as usize);
        assert_eq!(p.sync_turn(&t, SEC), 0, "no dump requested");
        th.dump.requested.store(1, Ordering::Release);
        let mut turns = 0;
        while th.dump.done.load(Ordering::Acquire) != 1 {
            assert!(p.sync_turn(&t, SEC) <= DUMP_BUCKETS);
            turns += 1;
        }
        assert_eq!(turns, p.flows.buckets().div_ceil(DUMP_BUCKETS));
        let dumped = drain(&mut th);
        assert_eq!(dumped.len(), flows as usize, "{mode}: one record a flow");
        assert!(dumped.iter().all(|r| r.flags & flags::DUMP != 0));
        if mode == "nat" {
            assert!(dumped.iter().all(|r| r.peer_mac.0 == CLIENT_MAC));
        }
        assert_eq!(p.sync.as_ref().unwrap().counters.dumps, 1);
        assert_eq!(p.sync_turn(&t, SEC), 0, "done");
        assert!(!p.sync_pending());
    }
}

#[test]
fn a_dump_pauses_while_the_out_ring_is_short_of_room() {
    let t = build(&mut Builder::new(), &config("dsr-l2", &[X, Y], &[]));
    let (mut p, mut th) = synced(16);
    for port in 0..40 {
        let _ = run(&mut p, &t, SEC, &tcp((CLIENT.0, 20000 + port), VIP_A, true));
    }
    drain(&mut th);
    let full_before = p.sync.as_ref().unwrap().counters.export_full;
    th.dump.requested.store(1, Ordering::Release);
    let mut got = 0;
    while th.dump.done.load(Ordering::Acquire) != 1 {
        let _ = p.sync_turn(&t, SEC);
        got += drain(&mut th).len();
    }
    got += drain(&mut th).len();
    assert_eq!(got, 40);
    assert_eq!(
        p.sync.as_ref().unwrap().counters.export_full,
        full_before,
        "the walk waits for room instead of dropping"
    );
}
