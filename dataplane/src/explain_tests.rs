//! The explanation against what the pipeline then does with the flow's packets. Apart from
//! `explain`'s own tests, which need no pipeline, because these drive
//! `pipeline::Pipeline` and `explain` knows nothing of it.

use core::net::IpAddr;

use crate::explain::*;
use crate::flow::{FlowState, Timeouts};
use crate::hash::owner_core;
use crate::key::{proto, v4_mapped, FlowKey, Proto};
use crate::pipeline::tests::{backend_by_mac, build, config, run, tcp, CLIENT, SEC, VIP_A};
use crate::pipeline::{Pipeline, Verdict as PipeVerdict};
use crate::table::Builder;
use crate::table::ServiceTable;

const X: (&str, u8) = ("198.51.100.11", 0x11);
const Y: (&str, u8) = ("198.51.100.12", 0x12);
const Z: (&str, u8) = ("198.51.100.13", 0x13);

fn key(client: ([u8; 4], u16), vip: ([u8; 4], u16), p: Proto) -> FlowKey {
    FlowKey {
        src: v4_mapped(client.0),
        dst: v4_mapped(vip.0),
        src_port: client.1,
        dst_port: vip.1,
        proto: p,
    }
}

/// `explain` over the probes of `pipes` (one per core), as the admin API runs it.
fn ask(t: &ServiceTable, pipes: &[&Pipeline], k: &FlowKey, now: u64) -> Explanation {
    let cores = pipes.len() as u16;
    let probes: Vec<Probe> = cores_to_ask(t, k, cores)
        .into_iter()
        .map(|c| probe(t, &pipes[c as usize].flows, c, k, now))
        .collect();
    explain(t, cores, k, &probes)
}

fn forward_of_verdict(e: &Explanation) -> &Forward {
    match &e.verdict {
        Outcome::Forward(f) => f,
        v => panic!("not a forward flow: {v:?}"),
    }
}

fn pipe() -> Pipeline {
    Pipeline::new(0, 1, 1024, Timeouts::default(), 0)
}

#[test]
fn a_destination_without_frontend_names_what_the_vip_serves() {
    let t = build(&mut Builder::new(), &config("dsr-l2", &[X, Y], &[Z]));
    let p = pipe();
    let e = ask(
        &t,
        &[&p],
        &key(CLIENT, ([192, 0, 2, 99], 80), proto::TCP),
        SEC,
    );
    assert_eq!(e.verdict, Outcome::NoFrontend { served: vec![] });
    let e = ask(&t, &[&p], &key(CLIENT, (VIP_A.0, 443), proto::TCP), SEC);
    assert_eq!(
        e.verdict,
        Outcome::NoFrontend {
            served: vec![("a".into(), 80, proto::TCP)]
        },
        "the VIP is known, on another port"
    );
    let e = ask(&t, &[&p], &key(CLIENT, VIP_A, proto::UDP), SEC);
    assert!(matches!(e.verdict, Outcome::NoFrontend { ref served } if served.len() == 1));
    assert!(cores_to_ask(&t, &key(CLIENT, (VIP_A.0, 443), proto::TCP), 4).is_empty());
}

#[test]
fn a_source_outside_the_ranges_is_refused_and_the_ranges_named() {
    let mut cfg = config("dsr-l2", &[X, Y], &[]);
    cfg.services[0].source_ranges = vec![
        "198.51.100.0/24".parse().unwrap(),
        "2001:db8::/32".parse().unwrap(),
    ];
    let t = build(&mut Builder::new(), &cfg);
    let mut p = pipe();
    let k = key(CLIENT, VIP_A, proto::TCP);
    let e = ask(&t, &[&p], &k, SEC);
    let f = forward_of_verdict(&e);
    let Source::Refused(ranges) = &f.source else {
        panic!("{:?}", f.source)
    };
    let shown: Vec<String> = ranges.iter().map(|r| r.to_string()).collect();
    assert_eq!(shown, ["198.51.100.0/24", "2001:db8::/32"]);
    assert_eq!((f.backend.as_ref(), f.rewrite.as_ref()), (None, None));
    let (v, _) = run(&mut p, &t, SEC, &tcp(CLIENT, VIP_A, true));
    assert_eq!(
        v,
        PipeVerdict::Drop(crate::stats::DropReason::SourceNotAllowed)
    );
    let inside = key(([198, 51, 100, 7], 1000), VIP_A, proto::TCP);
    let e = ask(&t, &[&p], &inside, SEC);
    let f = forward_of_verdict(&e);
    assert_eq!(f.source.clone(), Source::Allowed(ranges[0]));
    assert!(f.backend.is_some());
}

/// For many unseen flows, the Maglev answer is the backend the flow's SYN then reaches, and
/// after it the flow's entry names that backend.
#[test]
fn the_maglev_answer_is_where_the_syn_goes_and_then_the_entry_says_so() {
    for mode in ["dsr-l2", "nat"] {
        let t = build(&mut Builder::new(), &config(mode, &[X, Y, Z], &[]));
        let mut p = pipe();
        let mut seen = std::collections::HashSet::new();
        for port in 40000..40200u16 {
            let client = (CLIENT.0, port);
            let k = key(client, VIP_A, proto::TCP);
            let e = ask(&t, &[&p], &k, SEC);
            let f = forward_of_verdict(&e);
            assert_eq!(f.source, Source::Open);
            assert!(f.entries.is_empty());
            let (b, why) = f.backend.clone().expect("a backend");
            let Why::Maglev {
                slot,
                size,
                by_client,
            } = why
            else {
                panic!("{why:?}")
            };
            assert_eq!((size, by_client), (251, false));
            let member = t.services[0].maglev.slots()[slot as usize];
            assert_eq!(t.services[0].members[member as usize], b.id);
            let (v, out) = run(&mut p, &t, SEC, &tcp(client, VIP_A, true));
            assert_eq!(v, PipeVerdict::Tx { port: 0 });
            assert_eq!(backend_by_mac(&t, &out[0..6]).id, b.id, "{mode} {port}");
            seen.insert(b.id);

            let e = ask(&t, &[&p], &k, SEC + 1_500_000);
            let f = forward_of_verdict(&e);
            let [(0, entry)] = f.entries[..] else {
                panic!("{:?}", f.entries)
            };
            assert_eq!(entry.backend, b.id);
            assert_eq!(entry.state, FlowState::TcpSyn);
            assert_eq!(entry.idle_ms, 1);
            assert_eq!(entry.age_ms, Some(1), "made by the SYN at 1 s");
            assert_eq!(entry.timeout_ms, Timeouts::default().tcp_syn / 1_000_000);
            assert!(!entry.learnt);
            assert!(
                matches!(f.backend, Some((ref got, Why::Entry { core: 0, .. })) if got.id == b.id)
            );
        }
        assert_eq!(seen.len(), 3, "{mode}: every backend chosen for some flow");
    }
}

#[test]
fn an_entry_whose_backend_left_is_stale_and_the_new_choice_is_shown() {
    let mut builder = Builder::new();
    let t1 = build(&mut builder, &config("dsr-l2", &[X, Y], &[]));
    let mut p = pipe();
    let (_, out) = run(&mut p, &t1, SEC, &tcp(CLIENT, VIP_A, true));
    let first = backend_by_mac(&t1, &out[0..6]);
    let kept = if first.mac.map(|m| m.0) == Some([2, 0, 0, 0, 1, X.1]) {
        Y
    } else {
        X
    };
    let t2 = build(&mut builder, &config("dsr-l2", &[kept], &[]));
    let k = key(CLIENT, VIP_A, proto::TCP);
    let e = ask(&t2, &[&p], &k, SEC);
    let f = forward_of_verdict(&e);
    assert!(f.entries.is_empty());
    assert_eq!(f.stale.len(), 1);
    let (b, why) = f.backend.clone().unwrap();
    assert!(matches!(why, Why::Maglev { .. }));
    let (_, out) = run(&mut p, &t2, 2 * SEC, &tcp(CLIENT, VIP_A, false));
    assert_eq!(backend_by_mac(&t2, &out[0..6]).id, b.id);
}

#[test]
fn session_affinity_answers_with_the_clients_entry_then_maglev_of_the_client() {
    let mut cfg = config("dsr-l2", &[X, Y, Z], &[]);
    cfg.services[0].session_affinity = Some(std::time::Duration::from_secs(600));
    let t = build(&mut Builder::new(), &cfg);
    let mut p = pipe();
    let k1 = key(CLIENT, VIP_A, proto::TCP);
    let e = ask(&t, &[&p], &k1, SEC);
    let (b, why) = forward_of_verdict(&e).backend.clone().unwrap();
    assert!(
        matches!(
            why,
            Why::Maglev {
                by_client: true,
                ..
            }
        ),
        "{why:?}"
    );
    let (_, out) = run(&mut p, &t, SEC, &tcp(CLIENT, VIP_A, true));
    assert_eq!(backend_by_mac(&t, &out[0..6]).id, b.id);
    // Another connection of the same client: its affinity entry decides.
    for port in [1, 2, 3, 60000] {
        let k = key((CLIENT.0, port), VIP_A, proto::TCP);
        let e = ask(&t, &[&p], &k, 2 * SEC);
        let (got, why) = forward_of_verdict(&e).backend.clone().unwrap();
        let Why::Affinity { core: 0, entry } = why else {
            panic!("{why:?}")
        };
        assert_eq!(
            (got.id, entry.backend, entry.timeout_ms),
            (b.id, b.id, 600_000)
        );
        let (_, out) = run(&mut p, &t, 2 * SEC, &tcp((CLIENT.0, port), VIP_A, true));
        assert_eq!(backend_by_mac(&t, &out[0..6]).id, b.id);
    }
}

#[test]
fn a_nat_flow_shows_its_translation_and_its_reply_is_explained_as_that_flows() {
    let t = build(&mut Builder::new(), &config("nat", &[X, Y], &[]));
    // Two cores: the flow lives on its owner, which is the only one asked.
    let owner = owner_core(&v4_mapped(CLIENT.0), CLIENT.1, 2);
    let mut pipes = [
        Pipeline::new(0, 2, 1024, Timeouts::default(), 0),
        Pipeline::new(1, 2, 1024, Timeouts::default(), 0),
    ];
    let (v, out) = run(
        &mut pipes[owner as usize],
        &t,
        SEC,
        &tcp(CLIENT, VIP_A, true),
    );
    assert_eq!(v, PipeVerdict::Tx { port: 0 });
    let b = backend_by_mac(&t, &out[0..6]);
    let k = key(CLIENT, VIP_A, proto::TCP);
    assert_eq!(cores_to_ask(&t, &k, 2), vec![owner]);
    let e = ask(&t, &[&pipes[0], &pipes[1]], &k, SEC);
    let f = forward_of_verdict(&e);
    assert_eq!(f.entries.len(), 1);
    let Some(Rewrite::Nat {
        to,
        reply,
        reply_entry,
        macs,
        ..
    }) = &f.rewrite
    else {
        panic!("{:?}", f.rewrite)
    };
    assert_eq!(*to, (b.address(), 8080));
    assert_eq!(&out[30..34], &b.addr[12..], "the frame's destination");
    assert_eq!(macs.1, b.mac.unwrap());
    assert_eq!(reply.src, b.addr);
    assert_eq!((reply.dst, reply.dst_port), (k.src, k.src_port));
    assert_eq!(
        reply_entry.unwrap().peer_mac.0,
        crate::pipeline::tests::CLIENT_MAC
    );
    assert_eq!(
        reply_entry.unwrap().age_ms,
        None,
        "the forward entry's age is the flow's"
    );
    assert_eq!(f.entries[0].1.age_ms, Some(0));

    // The reply's 5-tuple.
    let e = ask(&t, &[&pipes[0], &pipes[1]], reply, SEC);
    let Outcome::Reply(r) = &e.verdict else {
        panic!("{:?}", e.verdict)
    };
    assert_eq!(r.core, owner);
    assert!(r.entry.is_some());
    let (rb, fwd, svc) = r.flow.clone().unwrap();
    assert_eq!((rb.id, fwd, svc.name.as_str()), (b.id, k, "a"));
    assert!(r.forward_entry.is_some());
    assert_eq!(r.macs.1 .0, crate::pipeline::tests::CLIENT_MAC);
    let addr: [u8; 4] = b.addr[12..].try_into().unwrap();
    let (v, out) = run(
        &mut pipes[owner as usize],
        &t,
        SEC,
        &tcp((addr, 8080), CLIENT, false),
    );
    assert_eq!(v, PipeVerdict::Tx { port: 0 });
    assert_eq!(&out[26..30], &VIP_A.0, "translated back as explained");

    // A reply of no flow: a nat backend's port to a client the gateway has no flow of.
    let stray = key((addr, 8080), (CLIENT.0, 1), proto::TCP);
    let e = ask(&t, &[&pipes[0], &pipes[1]], &stray, SEC);
    let Outcome::Reply(r) = &e.verdict else {
        panic!("{:?}", e.verdict)
    };
    assert_eq!((r.entry, r.flow.as_ref()), (None, None));
}

/// The outer addresses and ports the explanation gives are those of the encapsulated frame.
#[test]
fn ipip_and_gue_outer_headers_are_those_the_frame_gets() {
    for mode in ["dsr-ipip", "dsr-gue"] {
        let t = build(&mut Builder::new(), &config(mode, &[X, Y, Z], &[]));
        let mut p = pipe();
        for port in [40000u16, 40001, 50000] {
            let client = (CLIENT.0, port);
            let e = ask(&t, &[&p], &key(client, VIP_A, proto::TCP), SEC);
            let f = forward_of_verdict(&e);
            let Some(Rewrite::Encap {
                outer, udp, macs, ..
            }) = f.rewrite.clone()
            else {
                panic!("{:?}", f.rewrite)
            };
            let (v, out) = run(&mut p, &t, SEC, &tcp(client, VIP_A, true));
            assert_eq!(v, PipeVerdict::Tx { port: 0 });
            assert_eq!(out[0..6], macs.1 .0);
            let ip = etherparse::Ipv4HeaderSlice::from_slice(&out[14..]).expect("outer ipv4");
            assert_eq!(IpAddr::from(ip.source_addr()), outer.0, "{mode}");
            assert_eq!(IpAddr::from(ip.destination_addr()), outer.1, "{mode}");
            match mode {
                "dsr-gue" => {
                    assert_eq!(ip.protocol(), etherparse::IpNumber::UDP);
                    let u = etherparse::UdpHeaderSlice::from_slice(&out[34..]).unwrap();
                    assert_eq!(Some((u.source_port(), u.destination_port())), udp, "{mode}");
                }
                _ => {
                    assert_eq!(ip.protocol(), etherparse::IpNumber::IPV4);
                    assert_eq!(udp, None);
                }
            }
        }
    }
}

/// The desk across threads: a worker thread that turns answers; one that does not is named
/// as such, within the wait, and a full ring says busy at once.
#[test]
fn the_desk_answers_between_turns_and_a_silent_worker_times_out() {
    let t = std::sync::Arc::new(build(&mut Builder::new(), &config("dsr-l2", &[X, Y], &[])));
    let (d, mut w) = desk();
    let mut p = pipe().with_explain(d);
    let (_, out) = run(&mut p, &t, SEC, &tcp(CLIENT, VIP_A, true));
    let chosen = backend_by_mac(&t, &out[0..6]);
    let k = key(CLIENT, VIP_A, proto::TCP);
    assert!(!p.explain_pending());

    // Nobody turns: the query waits, the asker gives up.
    let wait = std::time::Duration::from_millis(20);
    assert_eq!(w.ask(&k, wait), Err(AskError::Timeout(wait)));
    for _ in 1..DESK_SLOTS {
        assert_eq!(w.ask(&k, wait), Err(AskError::Timeout(wait)));
    }
    assert_eq!(w.ask(&k, wait), Err(AskError::Busy(DESK_SLOTS)));
    assert!(p.explain_pending());
    assert_eq!(p.explain_turn(&t, SEC), DESK_SLOTS as usize);
    assert!(!p.explain_pending());

    // A turning worker: the stale answers are skipped, the fresh one taken.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (t2, stop2) = (std::sync::Arc::clone(&t), std::sync::Arc::clone(&stop));
    let worker = std::thread::spawn(move || {
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            if p.explain_pending() {
                p.explain_turn(&t2, 2 * SEC);
            }
            std::thread::yield_now();
        }
        p
    });
    for _ in 0..3 {
        let got = w
            .ask(&k, std::time::Duration::from_secs(5))
            .expect("answered");
        let e = got.flow.expect("the flow's entry");
        assert_eq!((e.backend, e.idle_ms), (chosen.id, 1000));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let p = worker.join().unwrap();
    assert_eq!(p.explain.as_ref().unwrap().answers_lost, 0);
}

/// A flow learnt from a peer gateway by flow sync is explained from its entry, marked as
/// learnt; DSR flows are imported by every core, and every core is asked.
#[test]
fn a_flow_learnt_from_a_peer_says_so_on_every_core() {
    use crate::sync::{mesh, RecordKind, SyncRecord};
    let t = build(&mut Builder::new(), &config("dsr-l2", &[X, Y, Z], &[]));
    let (ends, mut threads) = mesh(2, 16);
    let mut pipes: Vec<Pipeline> = ends
        .into_iter()
        .enumerate()
        .map(|(c, e)| Pipeline::new(c as u16, 2, 1024, Timeouts::default(), 0).with_sync(e))
        .collect();
    let k = key(CLIENT, VIP_A, proto::TCP);
    // The peer chose the backend Maglev would not choose here.
    let maglev = forward_of_verdict(&ask(&t, &[&pipes[0], &pipes[1]], &k, SEC))
        .backend
        .clone()
        .unwrap()
        .0;
    let other = t
        .backends
        .iter()
        .flatten()
        .find(|b| b.id != maglev.id)
        .unwrap();
    let r = SyncRecord {
        key: k,
        backend: other.addr,
        backend_port: other.port,
        state: FlowState::TcpEstablished,
        kind: RecordKind::Flow,
        flags: crate::sync::flags::EVERYWHERE,
        peer_mac: [0; 6].into(),
    };
    for (p, th) in pipes.iter_mut().zip(&mut threads) {
        assert!(th.to_worker.push(&r));
        assert_eq!(p.sync_turn(&t, SEC), 1);
    }
    assert_eq!(cores_to_ask(&t, &k, 2), vec![0, 1]);
    let e = ask(&t, &[&pipes[0], &pipes[1]], &k, 2 * SEC);
    let f = forward_of_verdict(&e);
    assert_eq!(f.entries.len(), 2, "{:?}", f.entries);
    for (core, entry) in &f.entries {
        assert!(entry.learnt, "core {core}");
        assert_eq!(entry.age_ms, Some(1000), "learnt at 1 s, asked at 2 s");
        assert_eq!(entry.backend, other.id);
        assert_eq!(entry.state, FlowState::TcpEstablished);
    }
    assert!(matches!(f.backend, Some((ref b, Why::Entry { core: 0, .. })) if b.id == other.id));
    let (_, out) = run(&mut pipes[1], &t, 2 * SEC, &tcp(CLIENT, VIP_A, false));
    assert_eq!(backend_by_mac(&t, &out[0..6]).id, other.id);
}
