//! Where a flow goes, and why: the dataplane's half of `strait explain`.
//!
//! ```text
//!  admin API ──query──► desk ring (SPSC, per worker) ──► worker, between batches:
//!      ▲                                                   probe(snapshot, flow table, now)
//!      └──explain(snapshot, probes)◄── answer ring ◄───────┘ (a fixed-size Probe)
//! ```
//!
//! A flow's story has two parts. Most of it is in the snapshot, which the admin API can read
//! itself: the frontend, the source ranges, the Maglev slot, the backend's weight and
//! health, the rewrite. The rest is in one core's flow table (or, for DSR, in any core's, since
//! RSS picks the core): whether the flow has an entry, which backend it names, its state and
//! idle time, and whether flow sync learnt it from a peer. A flow table belongs to its worker
//! and is never read by another thread, so the admin API asks: it writes the 5-tuple into the
//! worker's query ring, and the worker, between two batches, looks the flow up
//! ([`probe`]) and writes a fixed-size [`Probe`] into the answer ring. Then [`explain`], a pure
//! function of the snapshot and the probes, tells the whole story.
//!
//! # What it costs the packet path
//!
//! Nothing while nobody asks: the worker's turn checks its query ring, which is one relaxed
//! load of the producer's index while the ring stays empty. A query costs the
//! worker three flow-table lookups and 16 word stores, between batches; it neither stops nor
//! locks the worker. Rings are allocated when the worker starts; answering allocates nothing.
//!
//! # Why the worker answers in a fixed-size probe
//!
//! Explaining allocates (service names, lists of source ranges, of the ports a VIP serves),
//! and the worker loop must not. So the worker reports only what only it knows, in 16 words,
//! and the admin API builds the explanation from the snapshot. Both read the same snapshot
//! generation unless a table was published in between; the probe carries the worker's
//! generation, and [`Explanation::generation`] says which the rest was read from.
//!
//! # Which core
//!
//! A nat flow lives on its owner core ([`owner_core`] of the client address and port, which
//! replies carry too); a DSR flow on the core whose queue RSS picked, which only the NIC
//! knows, so every core is asked ([`cores_to_ask`]); with flow sync every core may hold a
//! copy learnt from a peer.
//!
//! # What the answer predicts
//!
//! Without a usable entry, the backend is the one [`crate::pipeline::Pipeline::process`]
//! would pick for the flow's next packet now: the client's session-affinity entry on the
//! core (backend up), else the Maglev slot of the flow's hash (of the client address, for a
//! service with affinity). A flow entry's creation time is not kept (the entry fills its
//! cache line), so an entry shows its idle time and the time it has left, not its age.

use core::net::IpAddr;

use strait_config::model::Mode;

use crate::flow::{FlowState, FlowTable, FlowValue};
use crate::hash::{maglev_hash, owner_core, SEED_FLOW};
use crate::key::{bytes_addr, is_v4, v4_mapped, Addr, BackendId, FlowKey, Proto};
use crate::rewrite::{Encap, Outer};
use crate::spsc;
use crate::sync::{byte_state, state_byte};
use crate::table::{
    current, forward_key, reply_flow, reply_key, Backend, Frontend, Health, Prefix, Service,
    ServiceTable,
};
use crate::wire::ethernet::Address as Mac;

/// Words of a query in the ring: its id, then the 5-tuple.
const QUERY_WORDS: usize = 6;
/// Words of an answer in the ring: id, generation, core and presence bits, three entries of
/// four words.
const ANSWER_WORDS: usize = 16;

/// Queries a worker's ring holds. Queries come one at a time from the admin API (which waits
/// for each answer), so four leave room for a few abandoned ones (a worker that did not
/// answer in time) before the ring says busy.
pub const DESK_SLOTS: u32 = 4;

/// Queries a worker answers per turn at most: the whole ring, a few microseconds.
pub const ANSWERS_PER_TURN: usize = DESK_SLOTS as usize;

/// One live flow-table entry, as a worker reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The backend it names (checked against the snapshot with `incarnation`).
    pub backend: BackendId,
    /// The backend's incarnation when the entry was made.
    pub incarnation: u32,
    /// Its connection state, which picks its idle timeout.
    pub state: FlowState,
    /// Milliseconds since its last packet, by the worker's clock.
    pub idle_ms: u64,
    /// Its idle timeout in milliseconds.
    pub timeout_ms: u64,
    /// Learnt from a peer gateway by flow sync, not made here by a packet.
    pub learnt: bool,
    /// A nat flow's entry as its replies see it: the MAC they are sent to. Zero elsewhere.
    pub peer_mac: Mac,
    /// Milliseconds since it was made (or learnt from a peer), by the worker's clock
    /// ([`FlowValue::made_ms`]); `None` in the reply's view, which shows the peer MAC in
    /// its place (the other view of the same entry has it).
    pub age_ms: Option<u64>,
}

impl Entry {
    /// `v` as of `now`, if it is live; `reverse`: as a nat reply sees it.
    fn of(flows: &FlowTable, v: &FlowValue, now: u64, reverse: bool) -> Option<Entry> {
        if !flows.is_live(v, now) {
            return None;
        }
        let now_ms = now / 1_000_000;
        Some(Entry {
            backend: v.backend,
            incarnation: v.incarnation,
            state: v.state,
            idle_ms: (now / 1_000_000).saturating_sub(v.last_seen_ms()),
            timeout_ms: flows.timeout_of(v) / 1_000_000,
            learnt: v.learnt(),
            peer_mac: if reverse {
                v.peer_mac()
            } else {
                Mac::default()
            },
            age_ms: (!reverse).then(|| now_ms.saturating_sub(v.made_ms())),
        })
    }

    /// Milliseconds it has left unless a packet comes.
    pub fn left_ms(&self) -> u64 {
        self.timeout_ms.saturating_sub(self.idle_ms)
    }

    /// Four words: the last holds the peer MAC (the reply's view) or the age in milliseconds
    /// (48 bits, any other), the state, and flags (learnt; the reply's view).
    fn to_words(self) -> [u64; 4] {
        let mut last = [0u8; 8];
        match self.age_ms {
            Some(age) => last[..6].copy_from_slice(&age.min((1 << 48) - 1).to_le_bytes()[..6]),
            None => last[..6].copy_from_slice(&self.peer_mac.0),
        }
        last[6] = state_byte(self.state);
        last[7] = u8::from(self.learnt) | u8::from(self.age_ms.is_none()) << 1;
        [
            u64::from(self.backend.0) | u64::from(self.incarnation) << 32,
            self.idle_ms,
            self.timeout_ms,
            u64::from_le_bytes(last),
        ]
    }

    fn from_words(w: &[u64]) -> Option<Entry> {
        let last = w[3].to_le_bytes();
        let mut six = [0u8; 8];
        six[..6].copy_from_slice(&last[..6]);
        let reverse = last[7] & 2 != 0;
        let mut peer_mac = [0u8; 6];
        if reverse {
            peer_mac.copy_from_slice(&last[..6]);
        }
        Some(Entry {
            backend: BackendId(w[0] as u32),
            incarnation: (w[0] >> 32) as u32,
            state: byte_state(last[6])?,
            idle_ms: w[1],
            timeout_ms: w[2],
            learnt: last[7] & 1 != 0,
            peer_mac: Mac(peer_mac),
            age_ms: (!reverse).then(|| u64::from_le_bytes(six)),
        })
    }
}

/// What one core's flow table holds about a 5-tuple: a worker's answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Probe {
    /// The core that answered.
    pub core: u16,
    /// The generation of the snapshot the worker read.
    pub generation: u64,
    /// The flow's entry: of the 5-tuple itself (a forward flow's), or for a nat reply the
    /// entry of the flow it answers, as the reply sees it (with the next hop back to the
    /// client).
    pub flow: Option<Entry>,
    /// The client's session-affinity entry (services with `sessionAffinity: ClientIP`).
    pub affinity: Option<Entry>,
    /// nat: the same entry seen from the other direction: as the flow's replies see it
    /// (for a forward 5-tuple) or as the flow's own packets do (for a reply's).
    pub partner: Option<Entry>,
}

impl Probe {
    fn to_words(self, id: u64) -> [u64; ANSWER_WORDS] {
        let mut w = [0u64; ANSWER_WORDS];
        w[0] = id;
        w[1] = self.generation;
        let mut present = 0u64;
        for (i, e) in [self.flow, self.affinity, self.partner].iter().enumerate() {
            if let Some(e) = e {
                present |= 1 << i;
                w[3 + 4 * i..7 + 4 * i].copy_from_slice(&e.to_words());
            }
        }
        w[2] = u64::from(self.core) | present << 16;
        w
    }

    fn from_words(w: &[u64; ANSWER_WORDS]) -> Probe {
        let present = w[2] >> 16;
        let entry = |i: usize| {
            (present & (1 << i) != 0)
                .then(|| Entry::from_words(&w[3 + 4 * i..7 + 4 * i]))
                .flatten()
        };
        Probe {
            core: w[2] as u16,
            generation: w[1],
            flow: entry(0),
            affinity: entry(1),
            partner: entry(2),
        }
    }
}

fn key_words(k: &FlowKey, id: u64) -> [u64; QUERY_WORDS] {
    let mut b = [0u8; 40];
    b[..16].copy_from_slice(k.src.octets());
    b[16..32].copy_from_slice(k.dst.octets());
    b[32..34].copy_from_slice(&k.src_port.to_le_bytes());
    b[34..36].copy_from_slice(&k.dst_port.to_le_bytes());
    b[36] = k.proto.0;
    let mut w = [0u64; QUERY_WORDS];
    w[0] = id;
    for (w, c) in w[1..].iter_mut().zip(b.chunks_exact(8)) {
        *w = u64::from_le_bytes(c.try_into().unwrap_or_default());
    }
    w
}

fn words_key(w: &[u64; QUERY_WORDS]) -> FlowKey {
    let mut b = [0u8; 40];
    for (c, w) in b.chunks_exact_mut(8).zip(&w[1..]) {
        c.copy_from_slice(&w.to_le_bytes());
    }
    let mut k = FlowKey::default();
    k.src.0.copy_from_slice(&b[..16]);
    k.dst.0.copy_from_slice(&b[16..32]);
    k.src_port = u16::from_le_bytes([b[32], b[33]]);
    k.dst_port = u16::from_le_bytes([b[34], b[35]]);
    k.proto = Proto(b[36]);
    k
}

/// The client's session-affinity key for a flow: client address, no client port.
fn affinity_key(k: &FlowKey) -> FlowKey {
    FlowKey { src_port: 0, ..*k }
}

/// The service of a frontend, by the flow's destination.
fn service_of<'t>(t: &'t ServiceTable, k: &FlowKey) -> Option<(u32, &'t Service)> {
    let si = t.service_for(&Frontend {
        vip: k.dst,
        port: k.dst_port,
        proto: k.proto,
    })?;
    Some((si, t.services.get(si as usize)?))
}

/// Whether a 5-tuple to no frontend may be a nat reply, as the pipeline decides it.
fn maybe_reply(t: &ServiceTable, k: &FlowKey) -> bool {
    t.is_nat_backend(&k.src, k.src_port, k.proto) && !t.locals.contains(&k.dst)
}

/// What core `core`'s flow table `flows` holds about `k` at `now` (nanoseconds, the worker's
/// clock). Read-only: it reclaims nothing and touches no entry.
pub fn probe(t: &ServiceTable, flows: &FlowTable, core: u16, k: &FlowKey, now: u64) -> Probe {
    // `reverse`: the entry as a reply sees it (the next hop back to the client).
    let live = |key: &FlowKey, reverse: bool| {
        flows
            .peek(key)
            .and_then(|v| Entry::of(flows, v, now, reverse))
    };
    let service = service_of(t, k);
    let mut p = Probe {
        core,
        generation: t.generation,
        ..Probe::default()
    };
    if let Some((_, s)) = service {
        p.flow = live(k, false);
        if s.affinity_secs != 0 {
            p.affinity = live(&affinity_key(k), false);
        }
        if s.mode == Mode::Nat
            && flows
                .peek(k)
                .is_some_and(|v| v.reply_mac().is_some() && current(t, v).is_some())
        {
            // A nat flow's one entry serves its replies too, while it names a backend the
            // table still has and knows where they go.
            p.partner = live(k, true);
        }
    } else if maybe_reply(t, k) {
        let forward = t
            .nat_frontends(&k.src, k.src_port, k.proto)
            .and_then(|owners| reply_flow(t, flows, owners, k, now));
        p.flow = forward.and_then(|f| live(&f, true));
        p.partner = forward.and_then(|f| live(&f, false));
    }
    p
}

/// The cores whose flow tables may hold `k`, of `cores` workers: a nat flow's (or reply's)
/// owner core, every core for DSR, none for a 5-tuple the gateway does not forward.
pub fn cores_to_ask(t: &ServiceTable, k: &FlowKey, cores: u16) -> Vec<u16> {
    match service_of(t, k) {
        Some((_, s)) if s.mode == Mode::Nat => vec![owner_core(&k.src, k.src_port, cores)],
        Some(_) => (0..cores.max(1)).collect(),
        None if maybe_reply(t, k) => vec![owner_core(&k.dst, k.dst_port, cores)],
        None => Vec::new(),
    }
}

/// A worker's end of its explain desk, held by its pipeline
/// (`Pipeline::with_explain`, which answers through [`Desk::turn`]).
#[derive(Debug)]
pub struct Desk {
    queries: spsc::Rx<QUERY_WORDS>,
    answers: spsc::Tx<ANSWER_WORDS>,
    /// Answers dropped because the answer ring was full (the asker gave up on earlier ones
    /// and has not read them).
    pub answers_lost: u64,
}

/// The admin API's end of one worker's explain desk.
#[derive(Debug)]
pub struct Window {
    queries: spsc::Tx<QUERY_WORDS>,
    answers: spsc::Rx<ANSWER_WORDS>,
    next: u64,
}

/// Why a worker gave no answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    /// Earlier queries still wait in the worker's ring: it has not turned since.
    #[error("the worker has {0} unanswered queries waiting: it is not turning its loop")]
    Busy(u32),
    /// No answer within the wait.
    #[error("the worker did not answer within {0:?}: it is not turning its loop")]
    Timeout(std::time::Duration),
}

/// A worker's desk and the admin API's window onto it; rings allocated now.
pub fn desk() -> (Desk, Window) {
    let (qtx, qrx) = spsc::ring(DESK_SLOTS);
    let (atx, arx) = spsc::ring(DESK_SLOTS);
    (
        Desk {
            queries: qrx,
            answers: atx,
            answers_lost: 0,
        },
        Window {
            queries: qtx,
            answers: arx,
            next: 1,
        },
    )
}

impl Window {
    /// Asks the worker what its flow table holds about `k`, waiting at most `wait`. Sleeps
    /// between looks (the worker answers within a turn, microseconds when busy, at most its
    /// idle poll when idle), so it must not run on an async runtime's own thread.
    ///
    /// # Errors
    /// [`AskError`] when the worker does not answer.
    pub fn ask(&mut self, k: &FlowKey, wait: std::time::Duration) -> Result<Probe, AskError> {
        let id = self.send(k)?;
        let until = std::time::Instant::now() + wait;
        loop {
            if let Some(p) = self.receive(id) {
                return Ok(p);
            }
            if std::time::Instant::now() >= until {
                return Err(AskError::Timeout(wait));
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }

    /// Puts a query about `k` on the worker's ring without waiting; its id, for
    /// [`Window::receive`].
    ///
    /// # Errors
    /// [`AskError::Busy`] when the ring is full of queries the worker has not taken.
    pub fn send(&mut self, k: &FlowKey) -> Result<u64, AskError> {
        let id = self.next;
        self.next += 1;
        if self.queries.push(&key_words(k, id)) {
            Ok(id)
        } else {
            Err(AskError::Busy(DESK_SLOTS))
        }
    }

    /// The answer to query `id` if it has come; answers to earlier queries (given up on)
    /// are taken and dropped on the way.
    pub fn receive(&mut self, id: u64) -> Option<Probe> {
        while let Some(w) = self.answers.pop() {
            if w[0] == id {
                return Some(Probe::from_words(&w));
            }
        }
        None
    }
}

impl Desk {
    /// Whether a query waits: one relaxed load of the query ring's producer index.
    #[inline(always)]
    pub fn pending(&self) -> bool {
        self.queries.peek()
    }

    /// Answers up to [`ANSWERS_PER_TURN`] waiting queries from core `core`'s flow table
    /// `flows`, at `now` by the worker's clock; returns how many. Never allocates, never
    /// blocks.
    pub fn turn(&mut self, flows: &FlowTable, t: &ServiceTable, core: u16, now: u64) -> usize {
        let mut n = 0;
        while n < ANSWERS_PER_TURN {
            let Some(q) = self.queries.pop() else { break };
            let p = probe(t, flows, core, &words_key(&q), now);
            if !self.answers.push(&p.to_words(q[0])) {
                self.answers_lost += 1;
            }
            n += 1;
        }
        n
    }
}

/// A service as an explanation names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRef {
    /// Its name.
    pub name: String,
    /// Its frontend.
    pub frontend: Frontend,
    /// Its forwarding mode.
    pub mode: Mode,
}

impl ServiceRef {
    fn of(s: &Service) -> Self {
        Self {
            name: s.name.clone(),
            frontend: s.frontend,
            mode: s.mode,
        }
    }
}

/// The source-range verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The service has no `source_ranges`: everyone.
    Open,
    /// Inside this range of the service's.
    Allowed(Prefix),
    /// Outside every one of these: dropped (`source_not_allowed`).
    Refused(Vec<Prefix>),
}

/// Why the flow's next packet goes to its backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// The flow's own entry on `core`.
    Entry {
        /// The core holding it.
        core: u16,
        /// The entry.
        entry: Entry,
    },
    /// No usable flow entry; the client's session-affinity entry on `core`.
    Affinity {
        /// The core holding it.
        core: u16,
        /// The entry.
        entry: Entry,
    },
    /// No usable entry: Maglev slot `slot` of `size` (of the flow's hash, or of the client
    /// address's when `by_client` for a service with session affinity).
    Maglev {
        /// The slot.
        slot: u32,
        /// `M`, the table's size.
        size: u32,
        /// Hashed by client address (session affinity), not by 5-tuple.
        by_client: bool,
    },
}

/// What the flow's packets become.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rewrite {
    /// The backend has no resolved next-hop MAC: dropped (`no_next_hop`).
    NoNextHop,
    /// dsr-l2: new MACs, VIP kept.
    DsrL2 {
        /// Source MAC (the egress port's) and next-hop MAC.
        macs: (Mac, Mac),
        /// Egress port.
        port: u8,
    },
    /// dsr-ipip / dsr-gue: an outer header to the backend node.
    Encap {
        /// Source MAC and next-hop MAC.
        macs: (Mac, Mac),
        /// Egress port.
        port: u8,
        /// Outer source and destination.
        outer: (IpAddr, IpAddr),
        /// dsr-gue: the outer UDP source and destination ports.
        udp: Option<(u16, u16)>,
    },
    /// nat: destination rewritten to the backend; replies translated back.
    Nat {
        /// Source MAC and next-hop MAC.
        macs: (Mac, Mac),
        /// Egress port.
        port: u8,
        /// The new destination.
        to: (IpAddr, u16),
        /// The reply 5-tuple the gateway translates back to the VIP.
        reply: FlowKey,
        /// The flow's entry as its replies see it, when the owner core holds it.
        reply_entry: Option<Entry>,
    },
}

/// A forward 5-tuple's story (client to a frontend).
#[derive(Clone, Debug, PartialEq)]
pub struct Forward {
    /// The service.
    pub service: ServiceRef,
    /// The source-range verdict.
    pub source: Source,
    /// The cores asked: the nat owner, or every core (DSR).
    pub cores: Vec<u16>,
    /// Live entries of the flow found, by core (several for DSR flows learnt from a peer).
    pub entries: Vec<(u16, Entry)>,
    /// Entries whose backend left the snapshot or is down: the next packet re-hashes.
    pub stale: Vec<(u16, Entry)>,
    /// The backend the next packet goes to, and why; `None` when refused or the service has
    /// no backend taking new flows (dropped, `no_backend`).
    pub backend: Option<(Backend, Why)>,
    /// The rewrite it gets.
    pub rewrite: Option<Rewrite>,
}

/// A nat reply's story (backend to client).
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// The owner core asked.
    pub core: u16,
    /// The entry of the flow it answers, as the reply sees it; `None`: dropped
    /// (`reply_no_flow`).
    pub entry: Option<Entry>,
    /// The backend it names, the flow it belongs to and that flow's service.
    pub flow: Option<(Backend, FlowKey, ServiceRef)>,
    /// The same entry as the flow's own packets see it (with its age).
    pub forward_entry: Option<Entry>,
    /// Source MAC and destination MAC (the client's next hop) of the translated reply.
    pub macs: (Mac, Mac),
    /// The port it leaves on.
    pub port: u8,
}

/// The whole story of a 5-tuple.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// No frontend at the destination and not a nat reply: the kernel's. `served` lists
    /// the frontends of that VIP (empty: no such VIP).
    NoFrontend {
        /// (service name, port, protocol) of every frontend at the destination VIP.
        served: Vec<(String, u16, Proto)>,
    },
    /// Client to a frontend.
    Forward(Box<Forward>),
    /// A nat reply.
    Reply(Box<Reply>),
}

/// [`explain`]'s answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Explanation {
    /// The 5-tuple explained.
    pub key: FlowKey,
    /// The snapshot generation read.
    pub generation: u64,
    /// Workers whose answers came from another generation (a table was published between).
    pub other_generation: Vec<u16>,
    /// The story.
    pub verdict: Outcome,
}

/// The story of `k` from the snapshot `t` and the workers' probes (see [`cores_to_ask`]; a
/// core that did not answer is simply absent), for a gateway of `cores` workers. Pure.
pub fn explain(t: &ServiceTable, cores: u16, k: &FlowKey, probes: &[Probe]) -> Explanation {
    let other_generation = probes
        .iter()
        .filter(|p| p.generation != t.generation)
        .map(|p| p.core)
        .collect();
    let verdict = match service_of(t, k) {
        Some((_, s)) => Outcome::Forward(Box::new(forward(t, s, cores, k, probes))),
        None if maybe_reply(t, k) => Outcome::Reply(Box::new(reply(t, cores, k, probes))),
        None => Outcome::NoFrontend {
            served: t
                .services
                .iter()
                .filter(|s| s.frontend.vip == k.dst)
                .map(|s| (s.name.clone(), s.frontend.port, s.frontend.proto))
                .collect(),
        },
    };
    Explanation {
        key: *k,
        generation: t.generation,
        other_generation,
        verdict,
    }
}

/// A backend entry `e` names that the flow may follow: still in the snapshot, same
/// incarnation, keeping flows.
fn follows<'t>(t: &'t ServiceTable, e: &Entry) -> Option<&'t Backend> {
    t.backend(e.backend)
        .filter(|b| b.incarnation == e.incarnation && b.keeps_flows())
}

fn forward(t: &ServiceTable, s: &Service, cores: u16, k: &FlowKey, probes: &[Probe]) -> Forward {
    let source = if s.acl.is_empty() {
        Source::Open
    } else {
        match s.acl.iter().find(|p| p.contains(&k.src)) {
            Some(p) => Source::Allowed(*p),
            None => Source::Refused(s.acl.clone()),
        }
    };
    let mut f = Forward {
        service: ServiceRef::of(s),
        source,
        cores: cores_to_ask(t, k, cores),
        entries: Vec::new(),
        stale: Vec::new(),
        backend: None,
        rewrite: None,
    };
    for p in probes {
        if let Some(e) = p.flow {
            if follows(t, &e).is_some() {
                f.entries.push((p.core, e));
            } else {
                f.stale.push((p.core, e));
            }
        }
    }
    if matches!(f.source, Source::Refused(_)) {
        return f;
    }
    let fh = k.hash(SEED_FLOW);
    let chosen = if let Some(&(core, entry)) = f.entries.first() {
        follows(t, &entry).map(|b| (b.clone(), Why::Entry { core, entry }))
    } else {
        new_flow(t, s, k, fh, probes)
    };
    let Some((b, why)) = chosen else { return f };
    let reply_entry = probes.iter().find_map(|p| p.partner);
    f.rewrite = Some(rewrite(t, s, &b, k, fh, reply_entry));
    f.backend = Some((b, why));
    f
}

/// The backend a packet of a flow without a usable entry gets now, as the pipeline picks it.
fn new_flow(
    t: &ServiceTable,
    s: &Service,
    k: &FlowKey,
    fh: u64,
    probes: &[Probe],
) -> Option<(Backend, Why)> {
    let mut h = fh;
    if s.affinity_secs != 0 {
        for p in probes {
            if let Some(e) = p.affinity {
                if let Some(b) = follows(t, &e).filter(|b| b.health == Health::Up) {
                    return Some((
                        b.clone(),
                        Why::Affinity {
                            core: p.core,
                            entry: e,
                        },
                    ));
                }
            }
        }
        h = affinity_key(k).hash(SEED_FLOW);
    }
    let mh = maglev_hash(h);
    let member = s.maglev.lookup(mh)?;
    let b = t.backend(*s.members.get(member)?)?;
    let size = s.maglev.size();
    Some((
        b.clone(),
        Why::Maglev {
            slot: (mh % u64::from(size)) as u32,
            size,
            by_client: s.affinity_secs != 0,
        },
    ))
}

/// The rewrite toward `b` of a flow with hash `fh`.
fn rewrite(
    t: &ServiceTable,
    s: &Service,
    b: &Backend,
    k: &FlowKey,
    fh: u64,
    reply_entry: Option<Entry>,
) -> Rewrite {
    let (Some(mac), Some(port)) = (b.mac, t.ports.get(b.egress as usize)) else {
        return Rewrite::NoNextHop;
    };
    let macs = (port.mac, mac);
    let how = match s.mode {
        Mode::DsrL2 => {
            return Rewrite::DsrL2 {
                macs,
                port: b.egress,
            }
        }
        Mode::Nat => {
            return Rewrite::Nat {
                macs,
                port: b.egress,
                to: (b.address(), b.port),
                reply: reply_key(k, b),
                reply_entry,
            }
        }
        Mode::DsrIpip => Encap::Ipip,
        Mode::DsrGue => Encap::Gue { port: t.gue_port },
    };
    let src = if is_v4(&b.tunnel) {
        v4_mapped(t.tunnel_src_v4)
    } else {
        Addr(t.tunnel_src_v6)
    };
    let outer = Outer {
        how,
        src,
        dst: b.tunnel,
        entropy: fh,
        mtu: port.mtu,
    };
    Rewrite::Encap {
        macs,
        port: b.egress,
        outer: (bytes_addr(outer.source()), bytes_addr(b.tunnel)),
        udp: match how {
            Encap::Gue { port } => Some((outer.gue_source_port(), port)),
            Encap::Ipip => None,
        },
    }
}

fn reply(t: &ServiceTable, cores: u16, k: &FlowKey, probes: &[Probe]) -> Reply {
    let core = owner_core(&k.dst, k.dst_port, cores);
    let p = probes.iter().find(|p| p.core == core);
    let entry = p.and_then(|p| p.flow);
    let flow = entry
        .as_ref()
        .and_then(|e| {
            t.backend(e.backend)
                .filter(|b| b.incarnation == e.incarnation)
        })
        .and_then(|b| {
            let s = t.services.get(b.service as usize)?;
            let forward = forward_key(k, s.frontend.vip, s.frontend.port);
            Some((b.clone(), forward, ServiceRef::of(s)))
        });
    let port = t.client_port;
    Reply {
        core,
        macs: (
            t.ports.get(port as usize).map_or(Mac::default(), |p| p.mac),
            entry.map_or(Mac::default(), |e| e.peer_mac),
        ),
        entry: entry.filter(|_| flow.is_some()),
        flow,
        forward_entry: p.and_then(|p| p.partner),
        port,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{addr_bytes, proto};

    #[test]
    fn queries_and_answers_survive_their_words() {
        let k = FlowKey {
            src: addr_bytes("2001:db8::2".parse().unwrap()),
            dst: v4_mapped([203, 0, 113, 10]),
            src_port: 40000,
            dst_port: 443,
            proto: proto::SCTP,
        };
        assert_eq!(words_key(&key_words(&k, 7)), k);
        let e = Entry {
            backend: BackendId(12),
            incarnation: 0xdead_beef,
            state: FlowState::TcpClosing,
            idle_ms: 1 << 40,
            timeout_ms: 86_400_000_000,
            learnt: true,
            peer_mac: [2, 0, 0, 0, 0, 0xc1].into(),
            age_ms: None,
        };
        for p in [
            Probe::default(),
            Probe {
                core: 513,
                generation: u64::MAX,
                flow: Some(e),
                affinity: None,
                partner: Some(Entry {
                    learnt: false,
                    state: FlowState::Udp,
                    peer_mac: [0; 6].into(),
                    age_ms: Some(3_600_000 * 24 * 400),
                    ..e
                }),
            },
        ] {
            let w = p.to_words(99);
            assert_eq!(w[0], 99);
            assert_eq!(Probe::from_words(&w), p);
        }
    }
}
