//! Per-flow state shared between gateways: the dataplane's half of flow sync.
//!
//! A gateway that restarts, or takes over flows from a dead peer, finds Maglev's choice for
//! every flow it has no entry for. That choice is the flow's own backend only while the
//! backend set is unchanged; after a change (a scale-up, a node drained) some flows would move
//! and break. Flow sync keeps them: every worker tells its peers which backend each new flow
//! got, and a worker that meets a flow it learnt from a peer follows the recorded backend.
//!
//! ```text
//!  worker ──new flow / state change──► out ring ─┐             ┌──► in ring ──► worker
//!  (pipeline, no lock, no syscall)    (SPSC,     ├─ sync thread ┤   (drained a bounded number
//!                                      bounded)  ┘  UDP to peers└    of records per turn)
//! ```
//!
//! # What is sent, and when
//!
//! A [`SyncRecord`] (64 bytes, fixed) names a flow by its 5-tuple, its service by frontend
//! (VIP, port, protocol: the key's destination) and its backend by address and port, because
//! [`BackendId`](crate::BackendId)s and incarnations are local to one gateway's table. A
//! worker emits one when it creates a flow, when a TCP flow changes state (established,
//! closing: the peer's copy then takes the right idle timeout), and when a flow that keeps
//! seeing packets crosses a [`REFRESH_MS`] boundary of its last-seen clock, so that a
//! long-lived flow's copy on the peers does not idle out while the flow is busy here. That
//! check costs a compare of two values already in registers on the established path; the
//! records themselves cost one ring push each (eight word stores and a release store), no
//! lock and no syscall, against the IPVS sync daemon's spinlock-protected shared buffer on
//! every synced packet.
//!
//! A nat flow's record carries the client-side MAC its replies go back to, which the
//! imported entry keeps as the flow's own does. Session-affinity entries are
//! sent as [`RecordKind::Affinity`] and take their service's timeout on import.
//!
//! # Import
//!
//! [`Pipeline::sync_turn`](crate::pipeline::Pipeline::sync_turn) drains at most
//! [`IMPORT_BUDGET`] records per call. A record whose frontend or backend the current table
//! does not have is dropped and counted (the backend left, or the peers' configurations
//! differ); a key this table already holds keeps its own backend (a flow that reaches this
//! gateway directly is authoritative here) and only takes the record's state if it names the
//! same backend. Imports do not take tokens from the new-flow rate limiter: records come only
//! from configured peers and a bulk dump is a burst by nature.
//!
//! # Bulk dump: a chunked walk, not a copy
//!
//! A restarted gateway asks its peers for everything they know. Each peer's workers then walk
//! their own tables, [`DUMP_BUCKETS`] buckets per turn, pushing each live forward or affinity
//! entry to the out ring, and pausing while the ring is short of room, so a dump costs a
//! bounded slice of worker time per turn and nothing in memory. The alternative, the sync
//! thread keeping a copy of every flow it saw go by, would answer a dump without touching the
//! workers, but doubles the memory of every flow (its copy is a hash map of 64-byte records
//! plus overhead) and goes stale, since the copy never learns of expiry and would need its
//! own timeouts, a second table to keep right. The walk sends what the tables hold now.
//!
//! # Steering: which worker imports a record
//!
//! A nat flow's packets always reach [`owner_core`](crate::pipeline::owner_core) of its
//! client address and port (other cores hand them over), so its record goes to that worker
//! only. DSR flows are not handed over: they stay on the core whose queue RSS picked, and the
//! peer's RSS (another NIC, another key, another queue count) may pick another. Their records
//! ([`SyncRecord::everywhere`]) therefore go to every worker, which multiplies the memory of
//! imported DSR flows by the number of workers; a steering program that sends DSR flows to
//! their owner core too would remove that cost.
//!
//! # The ring
//!
//! One SPSC ring per direction per worker ([`crate::spsc`], the handoff ring's design with
//! slots of words), a record being eight words; full means drop and count.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use strait_config::model::Mode;

use crate::flow::{FlowState, FlowTable, FlowValue, WAYS};
use crate::key::{Addr, FlowKey, Proto};
use crate::spsc;
use crate::table::{current, nat_taken, Frontend, ServiceTable};
use crate::wire::ethernet::Address as Mac;

/// Bytes of one record, in the ring and on the wire: one cache line.
pub const RECORD_BYTES: usize = 64;

/// Records per ring. At a million new flows a second on one core, 4096 records are 4 ms of
/// new flows: the sync thread drains every ring at least once a millisecond, so the ring
/// overflows only when that thread is descheduled for several milliseconds. 256 KiB per ring,
/// two rings per worker.
pub const SYNC_SLOTS: u32 = 4096;

/// Records a worker imports per turn at most: a bounded slice of a turn (an import is a flow
/// insert, about the cost of a new flow's packet), so that a dump from the peers does not stall
/// the worker's RX rings. 64 records are a few microseconds.
pub const IMPORT_BUDGET: usize = 64;

/// Buckets of its flow table a worker walks per turn during a dump (8 ways each): 64 buckets
/// read at most 512 entries, a few microseconds. A table of 1M ways is dumped in 2048 turns.
pub const DUMP_BUCKETS: usize = 64;

/// A busy flow is re-sent when its last-seen clock (milliseconds) crosses a multiple of
/// 2^20 ms (17.5 min), so a peer's copy, which idles out by its own clock, is refreshed at
/// least that often while the flow is active. Far below the established timeout (7440 s).
pub const REFRESH_MS: u64 = 1 << 20;

/// What an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RecordKind {
    /// A connection: client address and port to frontend.
    Flow = 1,
    /// A `sessionAffinity: ClientIP` entry (client port 0); takes its service's timeout.
    Affinity = 2,
}

/// Flag bits of a record (byte 57 on the wire).
pub mod flags {
    /// Imported by every worker (a DSR flow), not only the owner core (nat).
    pub const EVERYWHERE: u8 = 0x01;
    /// Sent in answer to a dump request, not as news.
    pub const DUMP: u8 = 0x02;
}

/// One flow's state as gateways exchange it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SyncRecord {
    /// The flow's key: client to frontend (client port 0 for affinity entries).
    pub key: FlowKey,
    /// The backend's address, 16 bytes (IPv4-mapped for IPv4).
    pub backend: Addr,
    /// The backend's port.
    pub backend_port: u16,
    /// The flow's state, which picks its idle timeout.
    pub state: FlowState,
    /// Connection or affinity.
    pub kind: RecordKind,
    /// Bits of [`flags`].
    pub flags: u8,
    /// nat: the MAC the client's packets came from, where replies go; zero otherwise.
    pub peer_mac: Mac,
}

#[cfg(any(test, feature = "testing"))]
impl SyncRecord {
    /// A test's record: an established TCP flow 198.51.100.7:(40000 + `i`) to
    /// 203.0.113.10:80, sent to 192.0.2.21:8080, imported by every worker. Records for
    /// different `i` differ in the client port only.
    pub fn sample(i: u16) -> SyncRecord {
        use crate::key::{proto, v4_mapped};
        SyncRecord {
            key: FlowKey {
                src: v4_mapped([198, 51, 100, 7]),
                dst: v4_mapped([203, 0, 113, 10]),
                src_port: 40000 + i,
                dst_port: 80,
                proto: proto::TCP,
            },
            backend: v4_mapped([192, 0, 2, 21]),
            backend_port: 8080,
            state: FlowState::TcpEstablished,
            kind: RecordKind::Flow,
            flags: flags::EVERYWHERE,
            peer_mac: [2, 0, 0, 0, 0, 0xc1].into(),
        }
    }
}

/// Why bytes are not a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// The state byte names no [`FlowState`].
    State(u8),
    /// The kind byte names no [`RecordKind`].
    Kind(u8),
    /// A connection record for a protocol other than TCP, UDP or SCTP.
    Proto(u8),
}

/// A flow state as one byte (on the wire and in the explain desk's answers).
pub(crate) fn state_byte(s: FlowState) -> u8 {
    match s {
        FlowState::TcpSyn => 1,
        FlowState::TcpEstablished => 2,
        FlowState::TcpClosing => 3,
        FlowState::Udp => 4,
        FlowState::Other => 5,
    }
}

/// The state a [`state_byte`] names.
pub(crate) fn byte_state(b: u8) -> Option<FlowState> {
    Some(match b {
        1 => FlowState::TcpSyn,
        2 => FlowState::TcpEstablished,
        3 => FlowState::TcpClosing,
        4 => FlowState::Udp,
        5 => FlowState::Other,
        _ => return None,
    })
}

impl SyncRecord {
    /// Whether every worker imports this record (see the module docs, "Steering").
    #[inline]
    pub fn everywhere(&self) -> bool {
        self.flags & flags::EVERYWHERE != 0
    }

    /// The record in its wire form: addresses as 16 bytes, numbers big-endian.
    ///
    /// | bytes | field |
    /// |---|---|
    /// | 0..16 | client address |
    /// | 16..32 | VIP |
    /// | 32..48 | backend address |
    /// | 48..50, 50..52, 52..54 | client port, frontend port, backend port |
    /// | 54, 55, 56, 57 | protocol, state, kind, flags |
    /// | 58..64 | peer MAC |
    #[inline]
    pub fn to_bytes(&self) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        b[0..16].copy_from_slice(self.key.src.octets());
        b[16..32].copy_from_slice(self.key.dst.octets());
        b[32..48].copy_from_slice(self.backend.octets());
        b[48..50].copy_from_slice(&self.key.src_port.to_be_bytes());
        b[50..52].copy_from_slice(&self.key.dst_port.to_be_bytes());
        b[52..54].copy_from_slice(&self.backend_port.to_be_bytes());
        b[54] = self.key.proto.0;
        b[55] = state_byte(self.state);
        b[56] = self.kind as u8;
        b[57] = self.flags;
        b[58..64].copy_from_slice(&self.peer_mac.0);
        b
    }

    /// Reads a record's wire form.
    ///
    /// # Errors
    /// [`RecordError`] for a state, kind or protocol byte this version does not know.
    pub fn from_bytes(b: &[u8; RECORD_BYTES]) -> Result<Self, RecordError> {
        let a16 = |at: usize| -> Addr {
            let mut a = [0u8; 16];
            a.copy_from_slice(&b[at..at + 16]);
            Addr(a)
        };
        let u16_at = |at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
        let state = byte_state(b[55]).ok_or(RecordError::State(b[55]))?;
        let kind = match b[56] {
            1 => RecordKind::Flow,
            2 => RecordKind::Affinity,
            k => return Err(RecordError::Kind(k)),
        };
        let proto = Proto(b[54]);
        use crate::key::proto::{SCTP, TCP, UDP};
        if !matches!(proto, TCP | UDP | SCTP) {
            return Err(RecordError::Proto(proto.0));
        }
        let mut peer_mac = [0u8; 6];
        peer_mac.copy_from_slice(&b[58..64]);
        Ok(Self {
            key: FlowKey {
                src: a16(0),
                dst: a16(16),
                src_port: u16_at(48),
                dst_port: u16_at(50),
                proto,
            },
            backend: a16(32),
            backend_port: u16_at(52),
            state,
            kind,
            flags: b[57],
            peer_mac: peer_mac.into(),
        })
    }

    #[inline(always)]
    fn to_words(self) -> [u64; 8] {
        let b = self.to_bytes();
        let mut w = [0u64; 8];
        for (w, c) in w.iter_mut().zip(b.chunks_exact(8)) {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            *w = u64::from_ne_bytes(a);
        }
        w
    }

    #[inline(always)]
    fn from_words(w: &[u64; 8]) -> Result<Self, RecordError> {
        let mut b = [0u8; RECORD_BYTES];
        for (c, w) in b.chunks_exact_mut(8).zip(w) {
            c.copy_from_slice(&w.to_ne_bytes());
        }
        Self::from_bytes(&b)
    }
}

/// The producer half of a record ring. Not `Clone`: one producer.
#[derive(Debug)]
pub struct RecordTx(spsc::Tx<8>);

/// The consumer half of a record ring. Not `Clone`: one consumer.
#[derive(Debug)]
pub struct RecordRx(spsc::Rx<8>);

/// A ring of `slots` records (rounded up to a power of two), allocated now.
pub fn ring(slots: u32) -> (RecordTx, RecordRx) {
    let (tx, rx) = spsc::ring(slots);
    (RecordTx(tx), RecordRx(rx))
}

impl RecordTx {
    /// Free slots, re-reading the consumer's index only when the cached one says fewer than
    /// `want` are free.
    #[inline]
    pub fn room(&mut self, want: u64) -> u64 {
        self.0.room(want)
    }

    /// Whether the consumer has taken every record published so far.
    pub fn is_drained(&mut self) -> bool {
        self.0.is_drained()
    }

    /// Publishes `r`; `false` (ring unchanged) when full.
    #[inline]
    pub fn push(&mut self, r: &SyncRecord) -> bool {
        self.0.push(&r.to_words())
    }
}

impl RecordRx {
    /// Whether a record is waiting.
    #[inline]
    pub fn is_ready(&mut self) -> bool {
        self.0.is_ready()
    }

    /// The oldest record, or `None` when empty. A slot that does not decode (which only a
    /// producer bug could write) yields `Some(Err(..))` and is consumed.
    #[inline]
    pub fn pop(&mut self) -> Option<Result<SyncRecord, RecordError>> {
        self.0.pop().map(|w| SyncRecord::from_words(&w))
    }
}

/// A worker's counters of flow sync.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncCounters {
    /// Records pushed to the out ring (new flows, state changes, refreshes).
    pub exported: u64,
    /// Records pushed during a dump.
    pub dumped: u64,
    /// Records dropped because the out ring was full.
    pub export_full: u64,
    /// Records imported as new entries.
    pub imported: u64,
    /// Records for a key held here with the same backend: state and idle clock updated.
    pub refreshed: u64,
    /// Records for a key held here with another backend: ignored (this gateway's wins).
    pub conflict: u64,
    /// Records whose frontend this table does not have.
    pub unknown_service: u64,
    /// Records whose backend this table does not have, or that takes no flows.
    pub unknown_backend: u64,
    /// Records not stored because the flow table had no room.
    pub table_full: u64,
    /// Ring slots that did not decode, or flow records in the state only a session-affinity
    /// entry has (never expected).
    pub malformed: u64,
    /// Dumps completed.
    pub dumps: u64,
}

impl SyncCounters {
    /// Adds `o` to `self`.
    pub fn add(&mut self, o: &SyncCounters) {
        self.exported += o.exported;
        self.dumped += o.dumped;
        self.export_full += o.export_full;
        self.imported += o.imported;
        self.refreshed += o.refreshed;
        self.conflict += o.conflict;
        self.unknown_service += o.unknown_service;
        self.unknown_backend += o.unknown_backend;
        self.table_full += o.table_full;
        self.malformed += o.malformed;
        self.dumps += o.dumps;
    }
}

/// Dump requests for one worker: the sync thread raises `requested`, the worker sets `done`
/// to it when its walk is over.
#[derive(Debug, Default)]
pub struct DumpSignal {
    /// Generation of the latest dump request.
    pub requested: AtomicU64,
    /// Generation of the latest dump this worker finished.
    pub done: AtomicU64,
}

/// One worker's ends of flow sync, held by its pipeline (`crate::pipeline::Pipeline`), which
/// calls [`WorkerSync::turn`] with its flow table.
#[derive(Debug)]
pub struct WorkerSync {
    pub(crate) out: RecordTx,
    pub(crate) inbound: RecordRx,
    pub(crate) dump: Arc<DumpSignal>,
    /// Generation of the dump being walked, and the next bucket; `None` when not walking.
    pub(crate) walking: Option<(u64, usize)>,
    /// This worker's counters.
    pub counters: SyncCounters,
}

/// The sync thread's ends for one worker.
#[derive(Debug)]
pub struct ThreadEnds {
    /// Records the worker emits.
    pub from_worker: RecordRx,
    /// Records for the worker to import.
    pub to_worker: RecordTx,
    /// The worker's dump signal.
    pub dump: Arc<DumpSignal>,
}

impl WorkerSync {
    /// Pushes `r` to the out ring, counting it or its drop.
    #[inline]
    pub(crate) fn export(&mut self, r: &SyncRecord) {
        if self.out.push(r) {
            self.counters.exported += 1;
        } else {
            self.counters.export_full += 1;
        }
    }

    /// Whether this worker has sync work: records to import or a dump to walk.
    #[inline]
    pub fn pending(&mut self) -> bool {
        self.inbound.is_ready()
            || self.walking.is_some()
            || self.dump.requested.load(Ordering::Relaxed) != self.dump.done.load(Ordering::Relaxed)
    }

    /// One turn of flow sync on the worker's flow table `flows`: imports up to
    /// [`IMPORT_BUDGET`] records from the in ring, then walks up to [`DUMP_BUCKETS`]
    /// buckets of a requested dump. Returns the records imported plus the buckets walked
    /// (0: nothing to do). Never allocates, never blocks.
    pub fn turn(&mut self, flows: &mut FlowTable, t: &ServiceTable, now: u64) -> usize {
        let mut work = 0;
        while work < IMPORT_BUDGET {
            match self.inbound.pop() {
                None => break,
                Some(Ok(r)) => import(flows, &mut self.counters, t, &r, now),
                Some(Err(_)) => self.counters.malformed += 1,
            }
            work += 1;
        }
        work + dump_step(flows, self, t, now)
    }
}

/// Both sides of flow sync for `workers` workers: element `c` of the first vector goes to the
/// pipeline of core `c`, the second to the sync thread. Allocates every ring now.
pub fn mesh(workers: usize, slots: u32) -> (Vec<WorkerSync>, Vec<ThreadEnds>) {
    (0..workers)
        .map(|_| {
            let (out, from_worker) = ring(slots);
            let (to_worker, inbound) = ring(slots);
            let dump = Arc::new(DumpSignal::default());
            (
                WorkerSync {
                    out,
                    inbound,
                    dump: Arc::clone(&dump),
                    walking: None,
                    counters: SyncCounters::default(),
                },
                ThreadEnds {
                    from_worker,
                    to_worker,
                    dump,
                },
            )
        })
        .unzip()
}

/// Stores record `r` in `flows` if its key is new here (see the module docs, "Import").
fn import(flows: &mut FlowTable, c: &mut SyncCounters, t: &ServiceTable, r: &SyncRecord, now: u64) {
    let f = Frontend {
        vip: r.key.dst,
        port: r.key.dst_port,
        proto: r.key.proto,
    };
    let Some(s) = t.service_for(&f).and_then(|si| t.services.get(si as usize)) else {
        c.unknown_service += 1;
        return;
    };
    let Some(b) = t
        .backend_at(&f, &r.backend, r.backend_port)
        .filter(|b| b.keeps_flows())
    else {
        c.unknown_backend += 1;
        return;
    };
    let (key, state) = match r.kind {
        RecordKind::Flow if r.state == FlowState::Other => {
            c.malformed += 1;
            return;
        }
        RecordKind::Flow => (r.key, r.state),
        RecordKind::Affinity => (
            FlowKey {
                src_port: 0,
                ..r.key
            },
            FlowState::Other,
        ),
    };
    if let Some(v) = flows.lookup(&key, now) {
        // A flow from source port 0 shares its key with its client's affinity entry: one
        // kind never takes the other's place (their six extra bytes mean different things).
        if (v.state == FlowState::Other) != (state == FlowState::Other) {
            c.conflict += 1;
            return;
        }
        if (v.backend, v.incarnation) == (b.id, b.incarnation) {
            v.touch(now);
            // A late record (reordered, or from a gateway that saw less of the flow) does
            // not take an established entry back to half-open and evictable.
            if !(v.state == FlowState::TcpEstablished && state == FlowState::TcpSyn) {
                v.state = state;
            }
            c.refreshed += 1;
            return;
        }
        if current(t, v).is_some_and(|held| held.keeps_flows()) {
            c.conflict += 1;
            return;
        }
        // The entry names a backend that left: the record's is better, overwrite it.
    }
    let mut value = FlowValue::new(b.id, b.incarnation, state, now).learnt_from_peer();
    match r.kind {
        RecordKind::Affinity => value.set_timeout_override(s.affinity_secs.max(1)),
        RecordKind::Flow if s.mode == Mode::Nat => {
            // Its replies must be told from those of a flow here to another frontend with a
            // backend at the same address and port.
            if nat_taken(t, flows, s, b, &key, now) {
                c.conflict += 1;
                return;
            }
            value.set_peer_mac(r.peer_mac);
        }
        RecordKind::Flow => {}
    }
    if flows.insert_unlimited(key, value, now).is_err() {
        c.table_full += 1;
        return;
    }
    c.imported += 1;
}

/// Walks up to [`DUMP_BUCKETS`] buckets of a requested dump, pushing each live forward and
/// affinity entry whose backend the table still has; pauses while the out ring has less room
/// than a bucket can fill. Returns the buckets walked.
fn dump_step(flows: &FlowTable, sy: &mut WorkerSync, t: &ServiceTable, now: u64) -> usize {
    let requested = sy.dump.requested.load(Ordering::Acquire);
    let (gen, mut at) = match sy.walking {
        // A newer request restarts the walk, so its requester gets everything.
        Some((gen, at)) if gen == requested => (gen, at),
        _ if requested != sy.dump.done.load(Ordering::Relaxed) => (requested, 0),
        _ => return 0,
    };
    let mut walked = 0;
    while walked < DUMP_BUCKETS && at < flows.buckets() {
        if sy.out.room(WAYS as u64) < WAYS as u64 {
            break;
        }
        flows.for_each_in_bucket(at, |k, v| {
            if !flows.is_live(v, now) {
                return;
            }
            let f = Frontend {
                vip: k.dst,
                port: k.dst_port,
                proto: k.proto,
            };
            let Some(s) = t.service_for(&f).and_then(|si| t.services.get(si as usize)) else {
                return;
            };
            let Some(b) = current(t, v) else { return };
            let affinity = v.state == FlowState::Other && v.timeout_override() != 0;
            let peer_mac = if s.mode == Mode::Nat && !affinity {
                v.peer_mac()
            } else {
                Mac::default()
            };
            let r = SyncRecord {
                key: *k,
                backend: b.addr,
                backend_port: b.port,
                state: v.state,
                kind: if affinity {
                    RecordKind::Affinity
                } else {
                    RecordKind::Flow
                },
                flags: flags::DUMP
                    | if s.mode == Mode::Nat {
                        0
                    } else {
                        flags::EVERYWHERE
                    },
                peer_mac,
            };
            if sy.out.push(&r) {
                sy.counters.dumped += 1;
            } else {
                sy.counters.export_full += 1;
            }
        });
        at += 1;
        walked += 1;
    }
    if at >= flows.buckets() {
        sy.walking = None;
        sy.counters.dumps += 1;
        sy.dump.done.store(gen, Ordering::Release);
    } else {
        sy.walking = Some((gen, at));
    }
    walked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_through_bytes_and_words() {
        let r = SyncRecord::sample(1);
        assert_eq!(SyncRecord::from_bytes(&r.to_bytes()), Ok(r));
        assert_eq!(SyncRecord::from_words(&r.to_words()), Ok(r));
        let mut bad = r.to_bytes();
        bad[55] = 9;
        assert_eq!(SyncRecord::from_bytes(&bad), Err(RecordError::State(9)));
        let mut bad = r.to_bytes();
        bad[56] = 0;
        assert_eq!(SyncRecord::from_bytes(&bad), Err(RecordError::Kind(0)));
        let mut bad = r.to_bytes();
        bad[54] = 1;
        assert_eq!(SyncRecord::from_bytes(&bad), Err(RecordError::Proto(1)));
        // SCTP associations are flows like TCP connections, and sync as such.
        let mut sctp = SyncRecord::sample(2);
        sctp.key.proto = crate::key::proto::SCTP;
        assert_eq!(SyncRecord::from_bytes(&sctp.to_bytes()), Ok(sctp));
    }

    proptest::proptest! {
        /// Any 64 bytes either are refused or are a record whose encoding is those bytes:
        /// decoding never panics and the wire form is canonical.
        #[test]
        fn any_bytes_decode_canonically_or_not_at_all(
            b in proptest::collection::vec(proptest::prelude::any::<u8>(), RECORD_BYTES),
            state in 0u8..8,
            kind in 0u8..4,
            proto in proptest::prelude::prop_oneof![proptest::prelude::Just(6u8), proptest::prelude::Just(17u8), proptest::prelude::any::<u8>()],
        ) {
            let mut a = [0u8; RECORD_BYTES];
            a.copy_from_slice(&b);
            // Bias the checked bytes toward valid values, so both outcomes are common.
            a[54] = proto;
            a[55] = state;
            a[56] = kind;
            if let Ok(r) = SyncRecord::from_bytes(&a) {
                proptest::prop_assert_eq!(r.to_bytes(), a);
                proptest::prop_assert_eq!(SyncRecord::from_words(&r.to_words()), Ok(r));
            }
        }
    }

    #[test]
    fn the_ring_keeps_order_refuses_when_full_and_recovers() {
        let (mut tx, mut rx) = ring(4);
        assert!(rx.pop().is_none());
        for i in 0..4 {
            assert!(tx.push(&SyncRecord::sample(i)));
        }
        assert!(!tx.push(&SyncRecord::sample(9)), "full");
        for round in 0..10u16 {
            assert_eq!(rx.pop(), Some(Ok(SyncRecord::sample(round))));
            assert!(tx.push(&SyncRecord::sample(round + 4)));
        }
        assert_eq!(tx.room(4), 0);
    }

    #[test]
    fn records_cross_threads_intact() {
        let (mut tx, mut rx) = ring(64);
        let n = 20_000u32;
        // Both sides yield when they cannot go on: on a loaded machine with one free core,
        // two spinners would otherwise hand over once per scheduler slice.
        let h = std::thread::spawn(move || {
            let mut i = 0u32;
            while i < n {
                if tx.push(&SyncRecord::sample(i as u16)) {
                    i += 1;
                } else {
                    std::thread::yield_now();
                }
            }
        });
        let mut i = 0u32;
        while i < n {
            match rx.pop() {
                Some(r) => {
                    assert_eq!(r, Ok(SyncRecord::sample(i as u16)));
                    i += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        h.join().expect("producer");
    }
}
