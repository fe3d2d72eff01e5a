//! Flow sync end to end, in one process: two gateways, each a set of pipelines (two cores)
//! and a sync thread on a loopback UDP socket. Gateway B starts after A has flows (a
//! restart) and with more backends, so Maglev alone would move some of A's flows; B asks A
//! for a dump, learns every flow, and then sends each flow's next packet to A's backend. New
//! flows of A reach B as news.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strait_config::model::{FlowSync, MacAddr};
use strait_control::sync::SyncThread;
use strait_dataplane::flow::Timeouts;
use strait_dataplane::key::v4_mapped;
use strait_dataplane::pipeline::{owner_core, Pipeline, Verdict};
use strait_dataplane::rewrite::{Frame, HEADROOM};
use strait_dataplane::sync::{mesh, SyncCounters, SYNC_SLOTS};
use strait_dataplane::table::{Builder, Port, ServiceTable};
use strait_testkit::config::{GatewayToml, ServiceToml};
use strait_testkit::harness::{free_addr, Transport};

const GW_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0xc1];
const CLIENT: [u8; 4] = [192, 0, 2, 7];
const VIP: [u8; 4] = [203, 0, 113, 10];
const CORES: u16 = 2;
const SEC: u64 = 1_000_000_000;

fn table(mode: &str, backends: &[u8]) -> ServiceTable {
    let port = if mode == "nat" { 8080 } else { 80 };
    let a = backends.iter().fold(
        ServiceToml::new("a", "203.0.113.10", 80)
            .mode(mode)
            .maglev_table_size(251),
        |s, b| {
            s.backend_mac(
                &format!("198.51.100.{b}"),
                port,
                &format!("02:00:00:00:01:{b:02x}"),
            )
        },
    );
    let cfg = strait_config::parse(&GatewayToml::eth0().service(a).to_string()).expect("config");
    Builder::new()
        .build(&cfg, &[Port::new(MacAddr(GW_MAC), 1500)], |_, _, _| false)
        .expect("table")
}

fn tcp(port: u16, syn: bool) -> Vec<u8> {
    let t = etherparse::PacketBuilder::ethernet2(CLIENT_MAC, GW_MAC)
        .ipv4(CLIENT, VIP, 64)
        .tcp(port, 80, 1, 65535);
    let t = if syn { t.syn() } else { t.ack(1) };
    let mut out = Vec::new();
    t.write(&mut out, &[]).expect("frame");
    out
}

/// The destination MAC the frame left with (names the backend), or `None` if not sent.
fn send(p: &mut Pipeline, t: &ServiceTable, now: u64, frame: &[u8]) -> Option<[u8; 6]> {
    let mut buf = vec![0u8; HEADROOM + frame.len() + 64];
    buf[HEADROOM..HEADROOM + frame.len()].copy_from_slice(frame);
    let mut f = Frame::new(&mut buf, HEADROOM, frame.len());
    match p.process(t, now, 0, &mut f) {
        Verdict::Tx { .. } => Some(f.data()[..6].try_into().expect("6 bytes")),
        _ => None,
    }
}

struct Gateway {
    pipes: Vec<Pipeline>,
    sync: SyncThread,
}

impl Gateway {
    fn start(listen: SocketAddr, peer: SocketAddr) -> Gateway {
        let (workers, thread) = mesh(CORES as usize, SYNC_SLOTS);
        let pipes = workers
            .into_iter()
            .enumerate()
            .map(|(c, w)| {
                Pipeline::new(c as u16, CORES, 1 << 14, Timeouts::default(), 0).with_sync(w)
            })
            .collect();
        let sync = SyncThread::spawn(
            &FlowSync {
                listen,
                peers: vec![peer],
            },
            thread,
            Arc::default(),
        )
        .expect("sync thread");
        Gateway { pipes, sync }
    }

    /// One sync turn on every worker, as the AF_XDP worker loop does.
    fn turn(&mut self, t: &ServiceTable, now: u64) {
        for p in &mut self.pipes {
            let _ = p.sync_turn(t, now);
        }
    }

    fn counters(&self) -> SyncCounters {
        let mut c = SyncCounters::default();
        for p in &self.pipes {
            c.add(&p.sync.as_ref().expect("sync on").counters);
        }
        c
    }

    fn core(port: u16) -> usize {
        owner_core(&v4_mapped(CLIENT), port, CORES) as usize
    }
}

fn until(
    what: &str,
    a: &mut Gateway,
    ta: &ServiceTable,
    b: &mut Gateway,
    tb: &ServiceTable,
    done: impl Fn(&Gateway) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(b) {
        assert!(
            Instant::now() < deadline,
            "timed out: {what}; B has {:?}",
            b.counters()
        );
        a.turn(ta, 2 * SEC);
        b.turn(tb, 2 * SEC);
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[test]
fn a_restarted_gateway_learns_its_peers_flows_and_keeps_their_backends() {
    for mode in ["dsr-l2", "nat"] {
        // Records of DSR flows go to every worker; nat ones to the owner core only.
        let copies = if mode == "nat" { 1 } else { CORES as u64 };
        let (a_addr, b_addr) = (free_addr(Transport::Udp), free_addr(Transport::Udp));
        let ta = table(mode, &[11, 12]);
        let tb = table(mode, &[11, 12, 13, 14]);
        let mut a = Gateway::start(a_addr, b_addr);
        let flows = 300u16;
        let mut chosen = Vec::new();
        for i in 0..flows {
            let port = 20000 + i;
            let c = Gateway::core(port);
            let mac = send(&mut a.pipes[c], &ta, SEC, &tcp(port, true)).expect("A forwards");
            let _ = send(&mut a.pipes[c], &ta, SEC, &tcp(port, false));
            chosen.push((port, mac));
        }
        // How many of these flows Maglev alone would move on B's table.
        let mut fresh = Pipeline::new(0, 1, 1 << 14, Timeouts::default(), 0);
        let moved = chosen
            .iter()
            .filter(|(port, mac)| send(&mut fresh, &tb, SEC, &tcp(*port, false)) != Some(*mac))
            .count();
        assert!(moved > 0, "{mode}: the test needs flows Maglev would move");

        // B starts (a restart), asks A for a dump and learns every flow. Its dump complete
        // (what a starting gateway waits for before it announces routes: the end came and
        // the workers took every record) means every flow is imported.
        let mut b = Gateway::start(b_addr, a_addr);
        until("the dump's end", &mut a, &ta, &mut b, &tb, |b| {
            b.sync.wait_dumps(Duration::ZERO) == 1
        });
        assert_eq!(b.counters().imported, u64::from(flows) * copies, "{mode}");
        assert!(a.counters().dumps >= CORES as u64);
        for &(port, mac) in &chosen {
            let c = Gateway::core(port);
            assert_eq!(
                send(&mut b.pipes[c], &tb, 3 * SEC, &tcp(port, false)),
                Some(mac),
                "{mode}: flow from port {port} keeps A's backend on B"
            );
        }
        assert_eq!(
            b.pipes
                .iter()
                .map(|p| p.counters.flows_created)
                .sum::<u64>(),
            0
        );

        // News: flows A creates now reach B within milliseconds.
        let before = b.counters().imported;
        for i in 0..50u16 {
            let port = 30000 + i;
            let c = Gateway::core(port);
            let _ = send(&mut a.pipes[c], &ta, 4 * SEC, &tcp(port, true));
        }
        until("the news", &mut a, &ta, &mut b, &tb, |b| {
            b.counters().imported == before + 50 * copies
        });
        let stats = &b.sync.stats;
        assert_eq!(
            stats
                .dropped_malformed
                .load(std::sync::atomic::Ordering::Relaxed)
                + stats
                    .dropped_unknown_peer
                    .load(std::sync::atomic::Ordering::Relaxed)
                + stats
                    .dropped_inbound_full
                    .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
        eprintln!(
            "{mode}: {flows} flows, {moved} of which Maglev alone would have moved on B; all kept"
        );
    }
}
