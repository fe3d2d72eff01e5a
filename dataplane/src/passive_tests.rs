//! Passive health through the pipeline: which backend answers count as failed connection
//! attempts ([`crate::passive`]), in nat mode and not in DSR modes.

use crate::flow::Timeouts;
use crate::passive::Failure;
use crate::pipeline::tests::{
    backend_by_mac, build, config, run, CLIENT, CLIENT_MAC, GW_MAC, SEC, VIP_A,
};
use crate::pipeline::{Pipeline, Verdict};
use crate::table::{Backend, Builder, ServiceTable};

const MS: u64 = 1_000_000;

/// What a TCP segment carries besides its addresses.
#[derive(Clone, Copy)]
enum Seg {
    Syn,
    SynAck,
    Ack,
    Rst,
    RstAck,
}

fn segment(src: ([u8; 4], u16), dst: ([u8; 4], u16), seg: Seg) -> Vec<u8> {
    let b = etherparse::PacketBuilder::ethernet2(CLIENT_MAC, GW_MAC)
        .ipv4(src.0, dst.0, 64)
        .tcp(src.1, dst.1, 1, 65535);
    let b = match seg {
        Seg::Syn => b.syn(),
        Seg::SynAck => b.syn().ack(2),
        Seg::Ack => b.ack(2),
        Seg::Rst => b.rst(),
        Seg::RstAck => b.rst().ack(2),
    };
    let mut out = Vec::new();
    b.write(&mut out, &[]).expect("frame");
    out
}

/// A client's connection to service a in `mode` with two backends, from the client's first
/// SYN at `SEC`: the pipeline, its table and the backend the connection went to.
struct Conn {
    pipe: Pipeline,
    t: ServiceTable,
    b: Backend,
}

impl Conn {
    fn new(mode: &str) -> Self {
        let (x, y) = (("198.51.100.51", 0x51), ("198.51.100.52", 0x52));
        let t = build(&mut Builder::new(), &config(mode, &[x, y], &[]));
        let mut pipe = Pipeline::new(0, 1, 1024, Timeouts::default(), 0);
        let (v, out) = run(&mut pipe, &t, SEC, &segment(CLIENT, VIP_A, Seg::Syn));
        assert_eq!(v, Verdict::Tx { port: 0 });
        let b = backend_by_mac(&t, &out[0..6]);
        Self { pipe, t, b }
    }

    /// The client sends `seg` to the VIP at `now`: the verdict and the frame as it leaves.
    fn client_sends(&mut self, now: u64, seg: Seg) -> (Verdict, Vec<u8>) {
        run(&mut self.pipe, &self.t, now, &segment(CLIENT, VIP_A, seg))
    }

    /// The backend answers the client with `seg` at `now`.
    fn backend_sends(&mut self, now: u64, seg: Seg) -> (Verdict, Vec<u8>) {
        let from = (self.b.addr[12..].try_into().expect("IPv4"), self.b.port);
        run(&mut self.pipe, &self.t, now, &segment(from, CLIENT, seg))
    }
}

#[test]
fn a_rst_answering_a_nat_syn_is_one_refusal_of_that_backend() {
    let mut c = Conn::new("nat");
    let (v, out) = c.backend_sends(SEC + MS, Seg::RstAck);
    assert_eq!(v, Verdict::Tx { port: 0 }, "the refusal reaches the client");
    assert_eq!(&out[26..30], &VIP_A.0, "from the VIP");
    assert_eq!(c.pipe.passive.of(c.b.id), [1, 0]);
    assert_eq!(c.pipe.passive.total(), 1);
    // The connection is over: a second RST is not another attempt's.
    let _ = c.backend_sends(SEC + 2 * MS, Seg::Rst);
    assert_eq!(c.pipe.passive.of(c.b.id), [1, 0]);
    // And the client's next SYN from the same port is a new flow, not one pinned to the
    // backend that refused.
    let _ = c.client_sends(SEC + 3 * MS, Seg::Syn);
    assert_eq!(c.pipe.counters.flows_reopened, 1);
    // The other backend counted nothing.
    let other =
        c.t.backends
            .iter()
            .flatten()
            .find(|o| o.id != c.b.id)
            .expect("two backends");
    assert_eq!(c.pipe.passive.of(other.id), [0, 0]);
    assert!(c.pipe.counters.balanced());
}

#[test]
fn an_established_flows_rst_is_no_failure() {
    let mut c = Conn::new("nat");
    let _ = c.backend_sends(SEC + MS, Seg::SynAck);
    let _ = c.client_sends(SEC + 2 * MS, Seg::Ack);
    let _ = c.backend_sends(SEC + 3 * MS, Seg::Ack);
    let (v, _) = c.backend_sends(SEC + 4 * MS, Seg::RstAck);
    assert_eq!(v, Verdict::Tx { port: 0 });
    assert_eq!(c.pipe.passive.total(), 0);
    // Nor after the backend's SYN-ACK alone, before the client's ACK: it answered.
    let mut c = Conn::new("nat");
    let _ = c.backend_sends(SEC + MS, Seg::SynAck);
    let _ = c.backend_sends(SEC + 2 * MS, Seg::RstAck);
    assert_eq!(c.pipe.passive.total(), 0);
}

#[test]
fn a_rst_to_a_flow_picked_up_mid_stream_is_no_failure() {
    // A connection the table did not know (its entry expired, the gateway restarted, its
    // backend left): its next ACK makes an established entry the backend never answered,
    // and the backend, which has no such connection, resets it. No SYN was refused.
    let (x, y) = (("198.51.100.51", 0x51), ("198.51.100.52", 0x52));
    let t = build(&mut Builder::new(), &config("nat", &[x, y], &[]));
    let mut pipe = Pipeline::new(0, 1, 1024, Timeouts::default(), 0);
    let (v, out) = run(&mut pipe, &t, SEC, &segment(CLIENT, VIP_A, Seg::Ack));
    assert_eq!(v, Verdict::Tx { port: 0 });
    let b = backend_by_mac(&t, &out[0..6]);
    let from = (b.addr[12..].try_into().expect("IPv4"), b.port);
    let (v, _) = run(&mut pipe, &t, SEC + MS, &segment(from, CLIENT, Seg::Rst));
    assert_eq!(v, Verdict::Tx { port: 0 }, "the reset reaches the client");
    assert_eq!(pipe.passive.total(), 0);
}

#[test]
fn a_retransmitted_syn_past_the_deadline_is_one_unanswered_attempt() {
    let mut c = Conn::new("nat");
    // A duplicate within 200 ms is not a retransmission.
    let (v, out) = c.client_sends(SEC + 50 * MS, Seg::Syn);
    assert_eq!(v, Verdict::Tx { port: 0 });
    assert_eq!(backend_by_mac(&c.t, &out[0..6]).id, c.b.id, "same flow");
    assert_eq!(c.pipe.passive.total(), 0);
    // The client's retransmission, 1 s after its last SYN (Linux's initial RTO).
    let _ = c.client_sends(2 * SEC + 50 * MS, Seg::Syn);
    assert_eq!(c.pipe.passive.of(c.b.id), [0, Failure::Unanswered as u64]);
    // And the next one, 2 s later.
    let _ = c.client_sends(4 * SEC + 50 * MS, Seg::Syn);
    assert_eq!(c.pipe.passive.of(c.b.id), [0, 2]);
    assert!(c.pipe.counters.balanced());
}

#[test]
fn a_syn_retransmitted_after_the_backend_answered_is_no_failure() {
    // The backend's SYN-ACK went out, and was lost on the way to the client.
    let mut c = Conn::new("nat");
    let _ = c.backend_sends(SEC + MS, Seg::SynAck);
    let _ = c.client_sends(2 * SEC, Seg::Syn);
    assert_eq!(c.pipe.passive.total(), 0);
}

#[test]
fn dsr_modes_count_nothing() {
    let mut c = Conn::new("dsr-l2");
    let _ = c.client_sends(2 * SEC, Seg::Syn);
    let _ = c.client_sends(4 * SEC, Seg::Syn);
    assert_eq!(c.pipe.passive.total(), 0);
}
