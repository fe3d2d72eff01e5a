//! The per-packet step: `(snapshot, per-core flow table, now, &mut frame) -> Verdict`.
//!
//! One [`Pipeline`] per worker core owns that core's flow table and counters. It is driven by
//! the AF_XDP worker, by the in-memory test driver and by the benches alike; time is passed
//! in, nothing here makes a syscall, takes a lock or allocates.
//!
//! Decisions, in order: what the ingress port accepts (unicast to another MAC, or tagged
//! with a VLAN the port does not serve: drop with a reason; broadcast and multicast: the
//! kernel's) → parse (malformed, or a bad IPv4 header checksum: drop with a reason) → ICMP error about a VIP flow (to that flow's backend) → frontend lookup (none: a nat
//! reply, or the kernel's) → source ACL → fragments (3-tuple Maglev, stateless) → nat owner
//! core (hand off) → flow table (hit: same backend while it keeps flows; miss: session
//! affinity, then Maglev, then remember) → rewrite for the mode (which completes a TCP/UDP
//! checksum the sender left to offload).
//!
//! Fragment policy: every fragment of a datagram, first or later, is sent by the Maglev
//! choice of its 3-tuple (source, destination, protocol) and creates no flow state, so all
//! fragments of one datagram reach the same backend without reassembly. Later fragments find
//! their service by (VIP, protocol) and are dropped as `fragment_ambiguous` when several
//! services share both. Fragmented nat replies are dropped (`fragmented_reply`): their ports
//! are only in the first fragment and the gateway does not reassemble.
//!
//! SCTP goes the way of TCP: its ports make the flow key (the verification tag does not), and
//! the first chunk of a packet stands for TCP flags in the flow table
//! ([`crate::wire::sctp::flow_flags`]): an INIT opens a flow as a SYN does, an ABORT or a
//! shutdown closes it as a RST or FIN does (an ABORT of an unknown flow makes no state), any
//! other packet of an unknown flow picks the association up as established, and the TCP
//! timeouts apply. In nat mode, whose port rewrite recomputes the CRC32c over the packet, a
//! packet whose CRC32c does not verify is dropped first (`sctp_checksum`), and SCTP fragments
//! are dropped (`sctp_fragment`: the CRC covers the whole packet and the gateway does not
//! reassemble).

use crate::capture::{Decision, Look, Tap};
use crate::flow::{FlowState, FlowTable, FlowValue, InsertError, Timeouts};
use crate::hash::{maglev_hash, SEED_FLOW};
use crate::key::{is_v4, proto, FlowKey};
use crate::maglev::Slot;
use crate::passive::{Failure, Passive, SYN_RETRANSMIT_MIN_MS};
use crate::rewrite::{self, Encap, EncapError, Frame, Macs, Outer};
use crate::stats::{Counters, DropReason};
use crate::sync::{self, RecordKind, SyncRecord, WorkerSync};
use crate::table::{
    current, forward_key, nat_taken, reply_flow, Backend, FragmentService, Frontend, Health,
    NatFrontends, Port, Service, ServiceTable,
};
use crate::traffic::Traffic;
use crate::wire::parse::{parse_into, Embedded, Frag, Parsed};
use crate::wire::tcp::flags;
use strait_config::model::Mode;

/// What to do with a frame after [`Pipeline::process`].
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send the (rewritten) frame out of this port.
    Tx {
        /// Port index in [`ServiceTable::ports`].
        port: u8,
    },
    /// Give the frame, unchanged, to the kernel.
    Pass,
    /// Drop the frame; already counted.
    Drop(DropReason),
    /// The frame belongs to a nat flow owned by another core: hand it over unchanged, and that
    /// core runs [`Pipeline::process`] on it.
    Handoff {
        /// The owner core.
        core: u16,
    },
}

impl From<Verdict> for Decision {
    #[inline(always)]
    fn from(v: Verdict) -> Self {
        match v {
            Verdict::Tx { port } => Decision::Tx { port },
            Verdict::Pass => Decision::Pass,
            Verdict::Drop(r) => Decision::Drop(r),
            Verdict::Handoff { core } => Decision::Handoff { core },
        }
    }
}

/// The core that owns a nat flow ([`crate::hash::owner_core`]), re-exported where the
/// pipeline's users have always found it.
pub use crate::hash::owner_core;

/// Frames [`Pipeline::process_batch`] works on together: half the AF_XDP RX batch. Large
/// enough that the flow-table misses of a chunk overlap (a random read of the entries costs
/// 160-240 ns on the CI machine, and about 14 are in flight at once: docs/performance.md,
/// "What a line costs"), small enough that the chunk's frames and staged parse results stay
/// in L1 (32 x ~170 bytes staged). Measured against 16 and 64 (docs/performance.md, "Where
/// the time goes"): 64 is slower everywhere; 16 is no different beyond the runs' noise.
pub const BATCH: usize = 32;

/// What port `port` does with a frame, before parsing: `Ok(true)` take it, `Ok(false)` leave
/// it to the kernel (broadcast and multicast: ARP, ND, routing protocols), or drop it.
///
/// The XDP steering program makes the same choice before redirecting (it passes what this
/// drops, and the kernel then drops a frame for another host itself); this is the check for
/// drivers without that filter. A frame cut inside its Ethernet header or 802.1Q tag is
/// taken, for the parser to drop as `eth_truncated`; an `ingress` that names no port (a
/// driver's mistake) takes everything.
#[inline(always)]
fn admit(frame: &[u8], port: Option<&Port>) -> Result<bool, DropReason> {
    let (Some(port), Some(eth)) = (port, frame.get(..14)) else {
        return Ok(true);
    };
    if eth[0] & 1 != 0 {
        return Ok(false);
    }
    if eth[..6] != port.mac.0 {
        return Err(DropReason::OtherHost);
    }
    if eth[12..14] == [0x81, 0x00] {
        let Some(&[hi, lo]) = frame.get(14..16) else {
            return Ok(true);
        };
        // VLAN 0 is a priority tag on an untagged frame (802.1Q), taken as untagged.
        let vid = u16::from_be_bytes([hi, lo]) & 0x0fff;
        if vid != 0 && !port.vlans.contains(vid) && frame.len() >= 18 {
            return Err(DropReason::VlanNotServed);
        }
    }
    Ok(true)
}

/// [`admit`], then [`parse_into`] what the port takes.
#[inline(always)]
fn admit_and_parse(frame: &[u8], port: Option<&Port>, p: &mut Parsed) -> Result<bool, DropReason> {
    if admit(frame, port)? {
        parse_into(frame, p)
    } else {
        Ok(false)
    }
}

/// A frame's parse result as the decision takes it: dropped with a reason, not IP (`None`), or
/// the parsed IP packet.
type ParseResult<'a> = Result<Option<&'a Parsed>, DropReason>;

/// A frame's parse result, flow hash and, for frames with a flow hash, the result of looking
/// up their frontend (`None`: not looked up), computed in the first pass over a batch. Parsed
/// in place and read in place: a [`Parsed`] is about 150 bytes, and moving it in and out
/// cost an established packet several nanoseconds.
#[derive(Clone, Copy, Debug)]
struct Staged {
    /// [`parse_into`]'s result: `Ok(true)` when `parsed` holds an IP packet.
    ip: Result<bool, DropReason>,
    parsed: Parsed,
    hash: u64,
    svc: Option<Option<u32>>,
    /// What staging computed for the decision of a frame that opens a connection or whose
    /// flow missed.
    ahead: Ahead,
}

/// What the staging pass computed for a frame's decision, so that the decision does not
/// compute it again.
#[derive(Clone, Copy, Debug, Default)]
struct Ahead {
    /// The Maglev slot of the frame's flow hash in its service's table, computed for a frame
    /// that opens a connection (a SYN, an SCTP INIT) or whose flow missed; `None` for others.
    slot: Option<Slot>,
}

impl Staged {
    /// The result of a batch's first pass as [`Pipeline::step`] takes it.
    #[inline(always)]
    fn parsed(&self) -> ParseResult<'_> {
        self.ip.map(|ip| ip.then_some(&self.parsed))
    }
}

/// One core's packet pipeline.
#[derive(Debug)]
pub struct Pipeline {
    /// This core's flow table.
    pub flows: FlowTable,
    /// This core's counters.
    pub counters: Counters,
    /// New flows per backend, indexed by `BackendId % NEW_FLOW_SLOTS` (ids are dense from 0,
    /// so below that bound each backend has its own slot).
    pub new_flows: Box<[u64]>,
    /// This core's packets and bytes per service and per backend ([`crate::traffic`]).
    pub traffic: Traffic,
    /// This core's failed connection attempts per backend, seen in nat mode
    /// ([`crate::passive`]).
    pub passive: Passive,
    core: u16,
    cores: u16,
    /// A batch's first-pass results, [`BATCH`] of them; boxed so that the decision pass can
    /// take them out of `self` (a pointer swap) and read them in place.
    staged: Box<[Staged]>,
    /// This core's ends of flow sync with the peer gateways ([`crate::sync`]); `None` when
    /// sync is off.
    pub sync: Option<WorkerSync>,
    /// This core's end of the capture hub ([`crate::capture`]); `None` without one.
    capture: Option<Tap>,
    /// This core's explain desk ([`crate::explain`]): queries about a flow, answered between
    /// batches; `None` when nobody asks.
    pub explain: Option<crate::explain::Desk>,
}

/// Backend ids with a new-flow counter of their own; larger ids share slots. Allocated once
/// (512 KiB per core), so counting never allocates.
pub const NEW_FLOW_SLOTS: usize = 1 << 16;

/// The flow-table hash of a parsed frame, for the frames that will look up the flow table
/// by their own 5-tuple (TCP, UDP and SCTP, unfragmented, not ICMP errors); 0 otherwise.
#[inline(always)]
fn flow_hash(parsed: ParseResult<'_>) -> u64 {
    match parsed {
        Ok(Some(p))
            if matches!(p.key.proto, proto::TCP | proto::UDP | proto::SCTP)
                && p.frag == Frag::None
                && p.embedded.is_none() =>
        {
            p.key.hash(SEED_FLOW)
        }
        _ => 0,
    }
}

impl Pipeline {
    /// A pipeline for core `core` of `cores`, with a flow table of `capacity` entries.
    pub fn new(
        core: u16,
        cores: u16,
        capacity: usize,
        timeouts: Timeouts,
        new_flows_per_sec: u32,
    ) -> Self {
        Self {
            flows: FlowTable::new(capacity, timeouts, new_flows_per_sec),
            counters: Counters::default(),
            new_flows: vec![0; NEW_FLOW_SLOTS].into_boxed_slice(),
            traffic: Traffic::new(),
            passive: Passive::default(),
            core,
            cores,
            staged: vec![
                Staged {
                    ip: Ok(false),
                    parsed: Parsed::default(),
                    hash: 0,
                    svc: None,
                    ahead: Ahead::default(),
                };
                BATCH
            ]
            .into_boxed_slice(),
            sync: None,
            capture: None,
            explain: None,
        }
    }

    /// Runs a batch of frames, writing each one's verdict to `verdicts` (same length).
    ///
    /// Equivalent to calling [`Pipeline::process`] on each frame in order, but done in passes
    /// so that the cache misses of the whole batch overlap instead of following one another:
    ///
    /// 1. parse every frame (in place, into its staged slot); then, in a second loop, hash
    ///    every frame, prefetch its flow bucket's tags, look up its frontend and prefetch the
    ///    service record (and a SYN's Maglev slot); a frame to no frontend that may be a nat
    ///    reply is hashed by its flow's forward 5-tuple instead ([`reply_hash`]);
    /// 2. prefetch each frame's matching entry; for a frame whose flow misses (a new flow,
    ///    most likely), prefetch the way its insert will take and read its Maglev slot and
    ///    backend;
    /// 3. decide, in order, with each frame's hash, service and Maglev slot from passes 1-2.
    ///
    /// Passes 1-2 only read; every decision is made in pass 3, so the verdicts are those of
    /// [`Pipeline::process`]. While a capture is armed ([`crate::capture`]), an out-of-line
    /// twin of this loop shows each frame to it before its rewrite and after its decision;
    /// otherwise a call pays one load and one branch for that. With a table larger than the
    /// caches, memory latency is most of the per-packet cost, and a batch waits for it about
    /// once per pass, not once per frame. Each call also lets the flow table take a step of
    /// its paced sweep when one is due ([`FlowTable::sweep_paced`]), so that expired flows
    /// are reclaimed on a core that is never idle.
    ///
    /// # Panics
    /// If `verdicts` is shorter than `frames`.
    pub fn process_batch(
        &mut self,
        t: &ServiceTable,
        now: u64,
        ingress: u8,
        frames: &mut [Frame<'_>],
        verdicts: &mut [Verdict],
    ) {
        assert!(verdicts.len() >= frames.len(), "one verdict per frame");
        self.settle(t);
        // A core that is never idle never reaches the worker's idle sweep: expire here, at
        // the table's pace (two comparisons a batch while no step is due).
        self.flows.sweep_paced(now);
        // The one test a call pays for capture while none runs: a load and a branch that
        // always goes the same way; the capturing twin is out of line.
        if self.capture.as_ref().is_some_and(Tap::armed) {
            return self.process_batch_captured(t, now, ingress, frames, verdicts);
        }
        for (frames, verdicts) in frames.chunks_mut(BATCH).zip(verdicts.chunks_mut(BATCH)) {
            self.stage(t, ingress, frames);
            // Taken out of `self` for the pass (an empty boxed slice does not allocate), so
            // that each frame's result is read where it lies.
            let staged = core::mem::take(&mut self.staged);
            for ((f, v), st) in frames.iter_mut().zip(verdicts.iter_mut()).zip(&staged[..]) {
                *v = match st.svc {
                    Some(Some(si)) => {
                        self.finish_flow(t, now, ingress, f, &st.parsed, st.hash, si, st.ahead)
                    }
                    _ => self.finish(t, now, ingress, f, st.parsed(), st.hash, st.svc),
                };
            }
            self.staged = staged;
        }
    }

    /// [`Pipeline::process_batch`] while a capture is armed: the same passes, with each frame
    /// shown to the capture before its rewrite ([`Tap::before`]) and after its decision
    /// ([`Tap::after`]). Out of line, so that the plain path stays as it is.
    #[cold]
    #[inline(never)]
    fn process_batch_captured(
        &mut self,
        t: &ServiceTable,
        now: u64,
        ingress: u8,
        frames: &mut [Frame<'_>],
        verdicts: &mut [Verdict],
    ) {
        let Some(mut tap) = self.capture.take() else {
            return;
        };
        let on = tap.begin(now);
        for (frames, verdicts) in frames.chunks_mut(BATCH).zip(verdicts.chunks_mut(BATCH)) {
            self.stage(t, ingress, frames);
            let staged = core::mem::take(&mut self.staged);
            for ((f, v), st) in frames.iter_mut().zip(verdicts.iter_mut()).zip(&staged[..]) {
                let parsed = st.parsed();
                let look = if on {
                    tap.before(now, ingress, f.data(), parsed)
                } else {
                    Look::No
                };
                *v = self.finish(t, now, ingress, f, parsed, st.hash, st.svc);
                if on {
                    tap.after(look, t, now, ingress, f.data(), parsed, st.svc, (*v).into());
                }
            }
            self.staged = staged;
        }
        self.capture = Some(tap);
    }

    /// Passes 1-3 of [`Pipeline::process_batch`] over one chunk of at most [`BATCH`] frames:
    /// parse, hash and prefetch, into `self.staged`. Out of line, called once a chunk: the
    /// capturing twin calls it too, and one copy keeps the parser's inlining as it is.
    #[inline(never)]
    fn stage(&mut self, t: &ServiceTable, ingress: u8, frames: &[Frame<'_>]) {
        let port = t.ports.get(ingress as usize);
        for (f, st) in frames.iter().zip(self.staged.iter_mut()) {
            st.ip = admit_and_parse(f.data(), port, &mut st.parsed);
        }
        for st in &mut self.staged[..frames.len()] {
            let h = flow_hash(st.parsed());
            st.hash = h;
            st.ahead = Ahead::default();
            st.svc = None;
            let (Ok(Some(p)), true) = (st.parsed(), h != 0) else {
                continue;
            };
            self.flows.prefetch_bucket(h);
            let si = t.service_for(&Frontend {
                vip: p.key.dst,
                port: p.key.dst_port,
                proto: p.key.proto,
            });
            let Some(i) = si else {
                // No frontend: a nat reply finds its flow's entry by the forward 5-tuple,
                // whose bucket is the one to load (0 when there is none to find, or several
                // frontends to try, which the decision does).
                let fh = reply_hash(t, &p.key);
                if fh != 0 {
                    self.flows.prefetch_bucket(fh);
                }
                st.hash = fh;
                st.svc = Some(None);
                continue;
            };
            if let Some(s) = t.services.get(i as usize) {
                crate::hint::prefetch(&s.acl);
                crate::hint::prefetch(&s.mode);
                crate::hint::prefetch(&s.affinity_secs);
                if matches!(p.key.proto, proto::TCP | proto::SCTP)
                    && p.tcp_flags & (flags::SYN | flags::ACK) == flags::SYN
                {
                    // A connection's first segment (or an SCTP INIT): its flow is almost
                    // surely new, and will need its Maglev slot in pass 2 and its decision.
                    let slot = s.maglev.slot(maglev_hash(h));
                    s.maglev.prefetch(slot);
                    st.ahead.slot = Some(slot);
                }
            }
            st.svc = Some(si);
        }
        for st in &mut self.staged[..frames.len()] {
            if st.hash != 0 && !self.flows.prefetch_entry(st.hash) {
                if let Some(Some(si)) = st.svc {
                    warm_new_flow(t, st.hash, si, &mut st.ahead);
                }
            }
        }
    }

    /// Makes the core's per-table state follow table `t`: the traffic slots and the flow
    /// table's idle timeouts (a reload may change `[gateway.timeouts]`). One comparison when
    /// `t` is the table of the last batch.
    #[inline(always)]
    fn settle(&mut self, t: &ServiceTable) {
        if !self.traffic.is_settled(t) {
            self.settle_with(t);
        }
    }

    #[cold]
    #[inline(never)]
    fn settle_with(&mut self, t: &ServiceTable) {
        self.traffic.settle(t);
        self.flows.set_timeouts(t.timeouts);
    }

    /// Gives the pipeline its worker's end of the capture hub: [`Pipeline::process_batch`]
    /// then shows frames to a capture while one is armed.
    pub fn with_capture(mut self, tap: Tap) -> Self {
        self.capture = Some(tap);
        self
    }

    /// Runs one frame through the pipeline, rewriting it in place, and counts its outcome.
    /// `now` is a monotonic clock in nanoseconds; `ingress` the port the frame arrived on.
    #[inline]
    pub fn process(
        &mut self,
        t: &ServiceTable,
        now: u64,
        ingress: u8,
        frame: &mut Frame<'_>,
    ) -> Verdict {
        self.settle(t);
        let mut p = Parsed::default();
        let parsed = admit_and_parse(frame.data(), t.ports.get(ingress as usize), &mut p)
            .map(|ip| ip.then_some(&p));
        let h = flow_hash(parsed);
        self.finish(t, now, ingress, frame, parsed, h, None)
    }

    /// Decides on a parsed frame and counts the outcome. `svc` is the frame's frontend lookup
    /// if already done.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        t: &ServiceTable,
        now: u64,
        ingress: u8,
        frame: &mut Frame<'_>,
        parsed: ParseResult<'_>,
        fh: u64,
        svc: Option<Option<u32>>,
    ) -> Verdict {
        self.counters.rx += 1;
        let v = self.step(t, now, ingress, frame, parsed, fh, svc);
        self.count(v, parsed.ok().flatten());
        v
    }

    /// [`Pipeline::finish`] for a frame the staging pass found to be an unfragmented TCP,
    /// UDP or SCTP packet that is not an ICMP error (it has a flow hash, `fh`) and whose
    /// frontend is service `si`: nearly every frame of a busy gateway, which so skips the
    /// tests whose answer the staging pass already knows.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn finish_flow(
        &mut self,
        t: &ServiceTable,
        now: u64,
        ingress: u8,
        frame: &mut Frame<'_>,
        p: &Parsed,
        fh: u64,
        si: u32,
        ahead: Ahead,
    ) -> Verdict {
        debug_assert!(p.embedded.is_none() && p.frag == Frag::None);
        self.counters.rx += 1;
        let v = self.decide_for_service(t, now, ingress, frame, p, fh, si, ahead);
        self.count(v, Some(p));
        v
    }

    /// Counts a frame's verdict (`p`: the frame's parse, if it was an IP packet).
    #[inline(always)]
    fn count(&mut self, v: Verdict, p: Option<&Parsed>) {
        match v {
            Verdict::Tx { .. } => {
                self.counters.tx += 1;
                // Every rewrite that sends a partial frame's segment on (dsr-l2, nat, the
                // encapsulations, the too-big answer's quote) completed its checksum.
                if let Some(p) = p {
                    self.counters.checksum_completed += p.l4_partial as u64;
                }
            }
            Verdict::Pass => self.counters.pass += 1,
            Verdict::Drop(r) => self.counters.drop(r),
            Verdict::Handoff { .. } => self.counters.handoff += 1,
        }
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        t: &ServiceTable,
        now: u64,
        ingress: u8,
        frame: &mut Frame<'_>,
        parsed: ParseResult<'_>,
        fh: u64,
        svc: Option<Option<u32>>,
    ) -> Verdict {
        let p = match parsed {
            Ok(Some(p)) => p,
            Ok(None) => return Verdict::Pass,
            Err(r) => return Verdict::Drop(r),
        };
        if let Some(e) = &p.embedded {
            return self.icmp_error(t, now, frame, p, e);
        }
        if !matches!(p.key.proto, proto::TCP | proto::UDP | proto::SCTP) {
            return Verdict::Pass;
        }
        let si = if p.frag == Frag::Later {
            match t.fragment_service(&p.key.dst, p.key.proto) {
                Some(FragmentService::One(i)) => Some(i),
                Some(FragmentService::Ambiguous) => {
                    return Verdict::Drop(DropReason::FragmentAmbiguous)
                }
                None => None,
            }
        } else {
            svc.unwrap_or_else(|| {
                t.service_for(&Frontend {
                    vip: p.key.dst,
                    port: p.key.dst_port,
                    proto: p.key.proto,
                })
            })
        };
        let Some(si) = si else {
            // The staging pass hashed a reply's forward 5-tuple; `process` hashed the frame's.
            return self.maybe_reply(t, now, frame, p, if svc.is_some() { fh } else { 0 });
        };
        self.decide_for_service(t, now, ingress, frame, p, fh, si, Ahead::default())
    }

    /// The decision for a TCP, UDP or SCTP packet (or a fragment of one) to service `si`.
    /// `ahead`: what the staging pass computed for the decision, if anything.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn decide_for_service(
        &mut self,
        t: &ServiceTable,
        now: u64,
        ingress: u8,
        frame: &mut Frame<'_>,
        p: &Parsed,
        fh: u64,
        si: u32,
        ahead: Ahead,
    ) -> Verdict {
        let s = &t.services[si as usize];
        if !s.allows(&p.key.src) {
            return Verdict::Drop(DropReason::SourceNotAllowed);
        }
        let sctp_nat = p.key.proto == proto::SCTP && s.mode == Mode::Nat;
        if sctp_nat && p.frag != Frag::None {
            return Verdict::Drop(DropReason::SctpFragment);
        }
        if p.frag != Frag::None {
            self.counters.fragments += 1;
            let h = maglev_hash(p.key.hash3(SEED_FLOW));
            return match pick(t, s, h) {
                Some(b) => forward(
                    t,
                    s,
                    b,
                    p,
                    frame,
                    h,
                    ingress,
                    &mut self.counters,
                    &mut self.traffic,
                ),
                None => Verdict::Drop(DropReason::NoBackend),
            };
        }
        if self.cores > 1 && s.mode == Mode::Nat {
            let owner = owner_core(&p.key.src, p.key.src_port, self.cores);
            if owner != self.core {
                return Verdict::Handoff { core: owner };
            }
        }
        if sctp_nat && !rewrite::sctp_intact(frame.data(), p) {
            return Verdict::Drop(DropReason::SctpChecksum);
        }
        let key = &p.key;
        debug_assert_eq!(fh, key.hash(SEED_FLOW));
        let b = match self.established(t, s, key, fh, ahead, now, p, frame) {
            Ok(b) => b,
            Err(v) => return v,
        };
        forward(
            t,
            s,
            b,
            p,
            frame,
            fh,
            ingress,
            &mut self.counters,
            &mut self.traffic,
        )
    }

    /// Finds or makes the flow's backend. `Err` carries a final verdict (no backend, nat
    /// collision). `ahead`: as in [`Pipeline::decide_for_service`].
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn established<'t>(
        &mut self,
        t: &'t ServiceTable,
        s: &Service,
        key: &FlowKey,
        fh: u64,
        ahead: Ahead,
        now: u64,
        p: &Parsed,
        frame: &Frame<'_>,
    ) -> Result<&'t Backend, Verdict> {
        // SCTP too: its first chunk stands for TCP flags (see the module docs).
        let tcp = matches!(p.key.proto, proto::TCP | proto::SCTP);
        let mut stale = None;
        // An entry in state `Other` is the client's session-affinity entry, whose key is the
        // flow's when the client's source port is 0: never the flow's own.
        if let Some(v) = self
            .flows
            .lookup_hashed(key, fh, now)
            .filter(|v| v.state != FlowState::Other)
        {
            let reopened = tcp && v.state.reopened_by(p.tcp_flags);
            match t.backend(v.backend) {
                Some(b) if b.keeps_flows() && b.incarnation == v.incarnation && !reopened => {
                    let (seen, state) = (v.last_seen_ms(), v.state);
                    v.touch(now);
                    if tcp {
                        v.state = v.state.on_tcp_flags(p.tcp_flags);
                    }
                    if let Some(sy) = &mut self.sync {
                        // A state change, or a busy flow crossing a refresh boundary: the
                        // peers' copy takes the new timeout or restarts its idle clock.
                        if v.state != state || (seen ^ v.last_seen_ms()) >= sync::REFRESH_MS {
                            sy.export(&record(key, s, b, v.state, RecordKind::Flow, frame));
                        }
                    }
                    if state == FlowState::TcpSyn
                        && p.tcp_flags & (flags::SYN | flags::ACK) == flags::SYN
                        && !v.answered()
                    {
                        // The client's SYN again: its first went unanswered, or was lost.
                        self.syn_again(s, b, seen, now);
                    }
                    return Ok(b);
                }
                Some(b) if b.keeps_flows() && b.incarnation == v.incarnation => {
                    // A new connection on the 5-tuple of a closed one (a reused client port):
                    // a new flow, which a draining backend must not take. Pinned to the old
                    // backend, it would outlive that backend's drain and be cut by its removal.
                    self.counters.flows_reopened += 1;
                    stale = Some(*v);
                }
                _ => {
                    self.counters.flows_rehashed += 1;
                    stale = Some(*v);
                }
            }
        }
        // A new flow, or one whose backend is gone.
        let b = match self.affinity(t, s, p, now) {
            Some(b) => b,
            None => {
                let slot = ahead.slot.unwrap_or_else(|| s.maglev.slot(maglev_hash(fh)));
                pick_at(t, s, slot).ok_or(Verdict::Drop(DropReason::NoBackend))?
            }
        };
        if tcp && p.tcp_flags & flags::RST != 0 && stale.is_none() {
            // A RST for an unknown flow never creates state: forward it by Maglev only.
            self.counters.rst_without_flow += 1;
            return Ok(b);
        }
        let state = if tcp {
            FlowState::TcpSyn.on_tcp_flags(p.tcp_flags)
        } else {
            FlowState::Udp
        };
        let mut value = FlowValue::new(b.id, b.incarnation, state, now);
        if s.mode == Mode::Nat {
            if nat_taken(t, &self.flows, s, b, key, now) {
                return Err(Verdict::Drop(DropReason::NatCollision));
            }
            // Replies go back to where the client's packets came from.
            let mut client = [0u8; 6];
            client.copy_from_slice(&frame.data()[6..12]);
            value.set_peer_mac(client.into());
        }
        self.new_flows[b.id.0 as usize % NEW_FLOW_SLOTS] += 1;
        // The lookup above found no live entry for the key, and it reclaimed an expired one,
        // so nothing needs overwriting; unless the client's source port is 0, whose key is
        // its session-affinity entry's (which the lookup passed over, or `affinity` has just
        // stored): the flow's entry takes its place.
        let inserted = if stale.is_none() && key.src_port != 0 {
            self.flows.insert_absent_hashed(*key, fh, value, now)
        } else {
            self.flows.insert_hashed(*key, fh, value, now)
        };
        match inserted {
            Ok(_) => {
                self.counters.flows_created += 1;
                if let Some(sy) = &mut self.sync {
                    sy.export(&record(key, s, b, state, RecordKind::Flow, frame));
                }
            }
            Err(InsertError::Full) => self.counters.stateless_full += 1,
            Err(InsertError::RateLimited) => self.counters.stateless_rate_limited += 1,
        }
        Ok(b)
    }

    /// A client's SYN again on a nat flow whose backend `b` has sent nothing on it
    /// ([`FlowValue::answered`]; a SYN-ACK lost on the way to the client is not the backend's
    /// failure), the previous SYN last seen at `seen` (ms): a failure of `b`
    /// ([`Failure::Unanswered`]) when the previous SYN is at least [`SYN_RETRANSMIT_MIN_MS`]
    /// old (a retransmission, not a duplicate). DSR modes do not see the backend's answers
    /// and count nothing.
    #[cold]
    #[inline(never)]
    fn syn_again(&mut self, s: &Service, b: &Backend, seen: u64, now: u64) {
        if s.mode == Mode::Nat && (now / 1_000_000).saturating_sub(seen) >= SYN_RETRANSMIT_MIN_MS {
            self.passive.count(b.id, Failure::Unanswered);
        }
    }

    /// ClientIP session affinity: the backend a client's earlier flows went to, while it is
    /// up, else a Maglev choice by client address that is then remembered for the service's
    /// timeout.
    #[inline(always)]
    fn affinity<'t>(
        &mut self,
        t: &'t ServiceTable,
        s: &Service,
        p: &Parsed,
        now: u64,
    ) -> Option<&'t Backend> {
        if s.affinity_secs == 0 {
            return None;
        }
        let akey = FlowKey {
            src: p.key.src,
            dst: p.key.dst,
            src_port: 0,
            dst_port: p.key.dst_port,
            proto: p.key.proto,
        };
        let ah = akey.hash(SEED_FLOW);
        if let Some(v) = self.flows.lookup_hashed(&akey, ah, now) {
            if let Some(b) = current(t, v) {
                if b.health == Health::Up {
                    v.touch(now);
                    return Some(b);
                }
            }
        }
        let b = pick(t, s, maglev_hash(ah))?;
        let mut value = FlowValue::new(b.id, b.incarnation, FlowState::Other, now);
        value.set_timeout_override(s.affinity_secs);
        if self.flows.insert_hashed(akey, ah, value, now).is_ok() {
            if let Some(sy) = &mut self.sync {
                let peer_mac = crate::wire::ethernet::Address::default();
                sy.export(&SyncRecord {
                    key: akey,
                    backend: b.addr,
                    backend_port: b.port,
                    state: FlowState::Other,
                    kind: RecordKind::Affinity,
                    flags: steering(s),
                    peer_mac,
                });
            }
        }
        Some(b)
    }

    /// A packet to no frontend: a nat reply from a backend (translated back to the VIP), or
    /// the kernel's.
    #[inline(always)]
    fn maybe_reply(
        &mut self,
        t: &ServiceTable,
        now: u64,
        frame: &mut Frame<'_>,
        p: &Parsed,
        fh: u64,
    ) -> Verdict {
        let Some(owners) = t.nat_frontends(&p.key.src, p.key.src_port, p.key.proto) else {
            return Verdict::Pass;
        };
        if t.locals.contains(&p.key.dst) {
            return Verdict::Pass;
        }
        if p.frag != Frag::None {
            return Verdict::Drop(DropReason::FragmentedReply);
        }
        if self.cores > 1 {
            let owner = owner_core(&p.key.dst, p.key.dst_port, self.cores);
            if owner != self.core {
                return Verdict::Handoff { core: owner };
            }
        }
        if p.key.proto == proto::SCTP && !rewrite::sctp_intact(frame.data(), p) {
            return Verdict::Drop(DropReason::SctpChecksum);
        }
        // The flow's one entry, under its forward 5-tuple: the reply's own with the backend
        // put back to the frontend (`fh`: its hash, if the staging pass computed it).
        let (key, fh) = match owners.only() {
            Some((vip, port)) => {
                let key = forward_key(&p.key, vip, port);
                let fh = if fh != 0 { fh } else { key.hash(SEED_FLOW) };
                (key, fh)
            }
            // Several frontends with a backend there: the one whose flow names it.
            None => match reply_flow(t, &self.flows, owners, &p.key, now) {
                Some(key) => (key, key.hash(SEED_FLOW)),
                None => return Verdict::Drop(DropReason::ReplyNoFlow),
            },
        };
        debug_assert_eq!(fh, key.hash(SEED_FLOW));
        let Some(v) = self.flows.lookup_hashed(&key, fh, now) else {
            return Verdict::Drop(DropReason::ReplyNoFlow);
        };
        // The reply goes back as from the frontend of the flow's backend, which must be the
        // backend it came from: the flow of another backend, or of one that has left the
        // snapshot (or whose id now names another backend), is not this reply's. Nor is a
        // session-affinity entry (a client's source port 0 makes its key), or an entry with
        // no next hop back (made while the service was in a DSR mode).
        let Some((b, s, peer_mac)) = current(t, v)
            .filter(|b| b.addr == p.key.src && b.port == p.key.src_port)
            .zip(v.reply_mac())
            .and_then(|(b, mac)| Some((b, t.services.get(b.service as usize)?, mac)))
        else {
            return Verdict::Drop(DropReason::ReplyNoFlow);
        };
        v.touch(now);
        let mut refused = false;
        if matches!(p.key.proto, proto::TCP | proto::SCTP) {
            // The backend's first answer to the client's SYN is a RST (an SCTP INIT's, an
            // ABORT): it refused the connection. A flow picked up mid-stream (established
            // when made) was never offered to this backend by a SYN.
            refused =
                p.tcp_flags & flags::RST != 0 && !v.answered() && v.state == FlowState::TcpSyn;
            v.state = v.state.on_reply_flags(p.tcp_flags);
        }
        v.set_answered();
        if refused {
            self.passive.count(b.id, Failure::Refused);
        }
        if p.ttl <= 1 {
            return Verdict::Drop(DropReason::TtlExceeded);
        }
        let Some(port) = t.ports.get(t.client_port as usize) else {
            return Verdict::Drop(DropReason::NoEgress);
        };
        rewrite::nat_reply(
            frame,
            p,
            &s.frontend.vip,
            s.frontend.port,
            Macs {
                src: port.mac,
                dst: peer_mac,
            },
        );
        self.traffic.from_backend(s, b, p.ip_len);
        Verdict::Tx {
            port: t.client_port,
        }
    }

    /// An ICMP error about a packet a VIP sent (its embedded source is the VIP): forwarded to
    /// the backend that owns the flow, so path-MTU discovery works through the gateway.
    #[cold]
    fn icmp_error(
        &mut self,
        t: &ServiceTable,
        now: u64,
        frame: &mut Frame<'_>,
        p: &Parsed,
        e: &Embedded,
    ) -> Verdict {
        let k = e.reversed_key();
        let Some(si) = t.service_for(&Frontend {
            vip: k.dst,
            port: k.dst_port,
            proto: k.proto,
        }) else {
            return Verdict::Pass;
        };
        let s = &t.services[si as usize];
        if self.cores > 1 && s.mode == Mode::Nat {
            let owner = owner_core(&k.src, k.src_port, self.cores);
            if owner != self.core {
                return Verdict::Handoff { core: owner };
            }
        }
        let fh = k.hash(SEED_FLOW);
        let from_flow = self.flows.lookup_hashed(&k, fh, now).map(|v| *v);
        let b = match from_flow.and_then(|v| current(t, &v).filter(|b| b.keeps_flows())) {
            Some(b) => b,
            // No state (DSR flows may live on another gateway or have been stateless): the
            // Maglev choice the flow itself would get.
            None if s.mode != Mode::Nat => match pick(t, s, maglev_hash(fh)) {
                Some(b) => b,
                None => return Verdict::Drop(DropReason::NoBackend),
            },
            None => return Verdict::Drop(DropReason::IcmpNoFlow),
        };
        self.counters.icmp_errors_forwarded += 1;
        if s.mode != Mode::Nat {
            // The ICMP packet is forwarded like the flow's own packets; the ingress port does
            // not matter for DSR.
            return forward(
                t,
                s,
                b,
                p,
                frame,
                fh,
                t.client_port,
                &mut self.counters,
                &mut self.traffic,
            );
        }
        if p.ttl <= 1 {
            return Verdict::Drop(DropReason::TtlExceeded);
        }
        let Some(mac) = b.mac else {
            return Verdict::Drop(DropReason::NoNextHop);
        };
        let src = t.ports.get(b.egress as usize).map_or([0; 6], |p| p.mac.0);
        rewrite::nat_icmp_error(
            frame,
            p,
            &b.addr,
            b.port,
            Macs {
                src: src.into(),
                dst: mac,
            },
        );
        self.traffic.to_backend(s, b, p.ip_len);
        Verdict::Tx { port: b.egress }
    }
}

/// The [`sync::flags`] steering bit of a service's records: DSR flows are imported by every
/// worker, nat flows by their owner core (see [`crate::sync`], "Steering").
#[inline(always)]
fn steering(s: &Service) -> u8 {
    if s.mode == Mode::Nat {
        0
    } else {
        sync::flags::EVERYWHERE
    }
}

/// The sync record of flow `key` of service `s` to backend `b`. In nat mode it carries the
/// MAC the frame came from, where the importer's copy of the entry sends replies.
#[inline(always)]
fn record(
    key: &FlowKey,
    s: &Service,
    b: &Backend,
    state: FlowState,
    kind: RecordKind,
    frame: &Frame<'_>,
) -> SyncRecord {
    let mut peer_mac = [0; 6];
    if s.mode == Mode::Nat {
        if let Some(m) = frame.data().get(6..12) {
            peer_mac.copy_from_slice(m);
        }
    }
    SyncRecord {
        key: *key,
        backend: b.addr,
        backend_port: b.port,
        state,
        kind,
        flags: steering(s),
        peer_mac: peer_mac.into(),
    }
}

/// The flow-table hash of the flow whose nat reply `r` may be (a frame to no frontend): of
/// its forward 5-tuple, when exactly one frontend has a backend at the reply's source; 0
/// otherwise (not a nat reply, or several frontends to try, which the decision does). Out of
/// line: the staging loop stays as tight for frames to a frontend as without nat replies.
#[inline(never)]
fn reply_hash(t: &ServiceTable, r: &FlowKey) -> u64 {
    t.nat_frontends(&r.src, r.src_port, r.proto)
        .and_then(NatFrontends::only)
        .map_or(0, |(vip, port)| forward_key(r, vip, port).hash(SEED_FLOW))
}

/// Loads, ahead of deciding, what a new flow's packet will read: its service, its Maglev slot
/// and backend. Pure reads: the decision itself is made later, in order, by
/// [`Pipeline::step`]. `ahead.slot` is the frame's Maglev slot if already computed; computed
/// here otherwise, and kept in `ahead` for the decision.
#[inline(always)]
fn warm_new_flow(t: &ServiceTable, fh: u64, si: u32, ahead: &mut Ahead) {
    let Some(s) = t.services.get(si as usize) else {
        return;
    };
    if s.affinity_secs != 0 {
        return;
    }
    let slot = *ahead
        .slot
        .get_or_insert_with(|| s.maglev.slot(maglev_hash(fh)));
    if let Some(b) = pick_at(t, s, slot) {
        core::hint::black_box(b);
    }
}

impl Pipeline {
    /// Installs this core's ends of flow sync ([`sync::mesh`]); from now on new flows are
    /// exported.
    pub fn with_sync(mut self, ends: WorkerSync) -> Self {
        self.sync = Some(ends);
        self
    }

    /// Whether flow sync has work for this core: records to import or a dump to walk. The
    /// worker asks before loading a snapshot on an idle turn.
    #[inline]
    pub fn sync_pending(&mut self) -> bool {
        self.sync.as_mut().is_some_and(WorkerSync::pending)
    }

    /// Installs this core's explain desk ([`crate::explain::desk`]); from now on the worker
    /// answers queries about its flows.
    pub fn with_explain(mut self, desk: crate::explain::Desk) -> Self {
        self.explain = Some(desk);
        self
    }

    /// Whether a query waits at this core's explain desk: one relaxed load of the query
    /// ring's producer index.
    #[inline(always)]
    pub fn explain_pending(&self) -> bool {
        self.explain
            .as_ref()
            .is_some_and(crate::explain::Desk::pending)
    }

    /// Answers the queries waiting at this core's explain desk from its flow table
    /// ([`crate::explain::Desk::turn`]), at `now` by the worker's clock; returns how many.
    /// Never allocates, never blocks.
    pub fn explain_turn(&mut self, t: &ServiceTable, now: u64) -> usize {
        self.settle(t);
        match &mut self.explain {
            Some(d) => d.turn(&self.flows, t, self.core, now),
            None => 0,
        }
    }

    /// One turn of flow sync on this core ([`WorkerSync::turn`] on this core's flow table).
    /// Returns the records imported plus the buckets walked (0: nothing to do). Never
    /// allocates, never blocks.
    pub fn sync_turn(&mut self, t: &ServiceTable, now: u64) -> usize {
        self.settle(t);
        match &mut self.sync {
            Some(sy) => sy.turn(&mut self.flows, t, now),
            None => 0,
        }
    }

    /// Reclaims expired entries of up to `buckets` buckets of this core's flow table
    /// ([`FlowTable::sweep`]), under table `t`'s timeouts: an idle core's sweep measures idle
    /// time as its packets would. Returns the entries reclaimed.
    pub fn sweep(&mut self, t: &ServiceTable, now: u64, buckets: usize) -> usize {
        self.settle(t);
        self.flows.sweep(now, buckets)
    }
}

/// The Maglev choice for hash `h` among the service's members.
#[inline(always)]
fn pick<'t>(t: &'t ServiceTable, s: &Service, h: u64) -> Option<&'t Backend> {
    pick_at(t, s, s.maglev.slot(h))
}

/// The Maglev choice in slot `slot` of the service's table.
#[inline(always)]
fn pick_at<'t>(t: &'t ServiceTable, s: &Service, slot: Slot) -> Option<&'t Backend> {
    let i = s.maglev.at(slot)?;
    t.backend(*s.members.get(i)?)
}

/// Rewrites the frame for the service's mode toward backend `b`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn forward(
    t: &ServiceTable,
    s: &Service,
    b: &Backend,
    p: &Parsed,
    frame: &mut Frame<'_>,
    entropy: u64,
    ingress: u8,
    c: &mut Counters,
    traffic: &mut Traffic,
) -> Verdict {
    let Some(mac) = b.mac else {
        return Verdict::Drop(DropReason::NoNextHop);
    };
    let Some(port) = t.ports.get(b.egress as usize) else {
        return Verdict::Drop(DropReason::NoEgress);
    };
    let m = Macs {
        src: port.mac,
        dst: mac,
    };
    let how = match s.mode {
        Mode::DsrL2 => {
            rewrite::dsr_l2(frame, p, m);
            traffic.to_backend(s, b, p.ip_len);
            return Verdict::Tx { port: b.egress };
        }
        Mode::Nat => {
            if p.ttl <= 1 {
                return Verdict::Drop(DropReason::TtlExceeded);
            }
            rewrite::nat_forward(frame, p, &b.addr, b.port, m);
            traffic.to_backend(s, b, p.ip_len);
            return Verdict::Tx { port: b.egress };
        }
        Mode::DsrIpip => Encap::Ipip,
        Mode::DsrGue => Encap::Gue { port: t.gue_port },
    };
    let src = if is_v4(&b.tunnel) {
        crate::key::v4_mapped(t.tunnel_src_v4)
    } else {
        crate::key::Addr(t.tunnel_src_v6)
    };
    let outer = Outer {
        how,
        src,
        dst: b.tunnel,
        entropy,
        mtu: port.mtu,
    };
    match rewrite::encapsulate(frame, p, &outer, m) {
        Ok(()) => {
            traffic.to_backend(s, b, p.ip_len);
            Verdict::Tx { port: b.egress }
        }
        Err(EncapError::TooBig { inner_mtu }) if p.df => {
            let Some(back) = t.ports.get(ingress as usize) else {
                return Verdict::Drop(DropReason::NoEgress);
            };
            rewrite::icmp_too_big(frame, p, inner_mtu, back.mac);
            c.icmp_too_big_sent += 1;
            Verdict::Tx { port: ingress }
        }
        Err(EncapError::TooBig { .. }) => Verdict::Drop(DropReason::MtuExceeded),
        Err(EncapError::NoHeadroom) => Verdict::Drop(DropReason::NoHeadroom),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! Flows across table rebuilds: what a flow entry's backend id and incarnation protect.

    use super::*;
    use crate::rewrite::HEADROOM;
    use crate::table::{Builder, Port};

    pub(crate) const GW_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
    pub(crate) const CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0xc1];
    pub(crate) const SEC: u64 = 1_000_000_000;

    /// Service `a` (dsr-l2 or nat) on 203.0.113.10:80 with backends at `a`, service `b` on
    /// 203.0.113.20:80 with backends at `b`; `(address, last byte of its MAC)`, port 80 (8080
    /// in nat).
    pub(crate) fn config(
        mode: &str,
        a: &[(&str, u8)],
        b: &[(&str, u8)],
    ) -> strait_config::model::Config {
        let port = if mode == "nat" { 8080 } else { 80 };
        let list = |bs: &[(&str, u8)]| {
            bs.iter()
                .map(|(addr, m)| {
                    format!(
                        r#"{{ address = "{addr}", port = {port}, mac = "02:00:00:00:01:{m:02x}" }}"#
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        strait_config::parse(&format!(
            r#"
[[gateway.interfaces]]
name = "eth0"
queues = [0]
[[services]]
name = "a"
vip = "203.0.113.10"
port = 80
mode = "{mode}"
maglev_table_size = 251
backends = [{}]
[[services]]
name = "b"
vip = "203.0.113.20"
port = 80
mode = "{mode}"
maglev_table_size = 251
backends = [{}]
"#,
            list(a),
            list(b)
        ))
        .expect("test config")
    }

    pub(crate) fn build(b: &mut Builder, cfg: &strait_config::model::Config) -> ServiceTable {
        let ports = [Port::new(strait_config::model::MacAddr(GW_MAC), 1500)];
        b.build(cfg, &ports, |_, _, _| false).expect("table builds")
    }

    /// An Ethernet/IPv4/TCP frame from `src` to `dst` with `flags`.
    pub(crate) fn tcp(src: ([u8; 4], u16), dst: ([u8; 4], u16), syn: bool) -> Vec<u8> {
        let t = etherparse::PacketBuilder::ethernet2(CLIENT_MAC, GW_MAC)
            .ipv4(src.0, dst.0, 64)
            .tcp(src.1, dst.1, 1, 65535);
        let t = if syn { t.syn() } else { t.ack(1) };
        let mut out = Vec::new();
        t.write(&mut out, &[]).expect("frame");
        out
    }

    pub(crate) fn run(
        pipe: &mut Pipeline,
        t: &ServiceTable,
        now: u64,
        frame: &[u8],
    ) -> (Verdict, Vec<u8>) {
        let mut buf = vec![0u8; HEADROOM + frame.len() + 64];
        buf[HEADROOM..HEADROOM + frame.len()].copy_from_slice(frame);
        let mut f = Frame::new(&mut buf, HEADROOM, frame.len());
        let v = pipe.process(t, now, 0, &mut f);
        (v, f.data().to_vec())
    }

    /// Runs `frames` through `process_batch` in calls of up to `per_call` frames (each
    /// given the headroom of a UMEM frame); the verdicts and the frames as they leave.
    pub(crate) fn run_batch(
        pipe: &mut Pipeline,
        t: &ServiceTable,
        now: u64,
        frames: &[Vec<u8>],
        per_call: usize,
    ) -> Vec<(Verdict, Vec<u8>)> {
        let mut out = Vec::new();
        for chunk in frames.chunks(per_call) {
            let mut bufs: Vec<Vec<u8>> = chunk
                .iter()
                .map(|f| {
                    let mut b = vec![0u8; HEADROOM + f.len() + 64];
                    b[HEADROOM..HEADROOM + f.len()].copy_from_slice(f);
                    b
                })
                .collect();
            let mut fs: Vec<Frame<'_>> = bufs
                .iter_mut()
                .zip(chunk)
                .map(|(b, f)| Frame::new(b, HEADROOM, f.len()))
                .collect();
            let mut vs = vec![Verdict::Pass; fs.len()];
            pipe.process_batch(t, now, 0, &mut fs, &mut vs);
            out.extend(vs.into_iter().zip(fs.iter().map(|f| f.data().to_vec())));
        }
        out
    }

    pub(crate) const CLIENT: ([u8; 4], u16) = ([192, 0, 2, 7], 40000);
    pub(crate) const VIP_A: ([u8; 4], u16) = ([203, 0, 113, 10], 80);

    pub(crate) fn backend_by_mac(t: &ServiceTable, mac: &[u8]) -> Backend {
        t.backends
            .iter()
            .flatten()
            .find(|b| b.mac.is_some_and(|m| m.0 == mac))
            .cloned()
            .expect("a backend with that MAC")
    }

    #[test]
    fn a_table_with_new_timeouts_brings_them_to_the_flow_table() {
        let x = [("198.51.100.11", 0x11)];
        let mut builder = Builder::new();
        let t1 = build(&mut builder, &config("dsr-l2", &x, &[]));
        let mut pipe = Pipeline::new(0, 1, 1024, t1.timeouts, 0);
        for (now, syn) in [(SEC, true), (2 * SEC, false)] {
            let (v, _) = run(&mut pipe, &t1, now, &tcp(CLIENT, VIP_A, syn));
            assert_eq!(v, Verdict::Tx { port: 0 });
        }
        // A reload shortens tcp_established to 10 s: the flow, idle for 20 s by its next
        // packet, has expired under the table that packet meets.
        let mut short = config("dsr-l2", &x, &[]);
        short.gateway.timeouts.tcp_established = std::time::Duration::from_secs(10);
        let t2 = build(&mut builder, &short);
        assert_ne!(t2.timeouts, t1.timeouts);
        let (v, _) = run(&mut pipe, &t2, 22 * SEC, &tcp(CLIENT, VIP_A, false));
        assert_eq!(v, Verdict::Tx { port: 0 });
        assert_eq!(
            pipe.flows.stats().expired,
            1,
            "expired under the new timeout"
        );
        assert_eq!(
            pipe.counters.flows_created, 2,
            "the next packet made the flow again"
        );
        assert_eq!(
            pipe.flows.timeout_of(pipe.flows.iter().next().unwrap().1),
            10 * SEC
        );
        // Under the old table's 2 h 4 m the same idle time keeps the flow.
        let mut kept = Pipeline::new(0, 1, 1024, t1.timeouts, 0);
        for (now, syn) in [(SEC, true), (2 * SEC, false), (22 * SEC, false)] {
            let _ = run(&mut kept, &t1, now, &tcp(CLIENT, VIP_A, syn));
        }
        assert_eq!(kept.flows.stats().expired, 0);
        // An idle core's sweep measures under the table it is given: the long timeouts
        // keep what the short ones it was made with would have reclaimed, and back.
        let mut idle = Pipeline::new(0, 1, 1024, t2.timeouts, 0);
        for (now, syn) in [(SEC, true), (2 * SEC, false)] {
            let _ = run(&mut idle, &t2, now, &tcp(CLIENT, VIP_A, syn));
        }
        assert_eq!(
            idle.sweep(&t1, 22 * SEC, usize::MAX),
            0,
            "kept under 2 h 4 m"
        );
        assert_eq!(
            idle.sweep(&t2, 22 * SEC, usize::MAX),
            1,
            "reclaimed under 10 s"
        );
    }

    #[test]
    fn a_core_that_is_never_idle_still_reclaims_expired_flows() {
        let x = [("198.51.100.11", 0x11)];
        let t = build(&mut Builder::new(), &config("dsr-l2", &x, &[]));
        let mut pipe = Pipeline::new(0, 1, 1024, t.timeouts, 0);
        let syns: Vec<Vec<u8>> = (0..500)
            .map(|i| tcp(([192, 0, 2, 7], 1024 + i), VIP_A, true))
            .collect();
        run_batch(&mut pipe, &t, SEC, &syns, 64);
        assert_eq!(pipe.flows.len(), 500);
        // 500 half-open flows expire at 31 s (tcp_syn 30 s). One busy client keeps the core
        // from idling, a batch every 10 ms, and nothing calls the idle sweep.
        let busy = [tcp(CLIENT, VIP_A, true), tcp(CLIENT, VIP_A, false)];
        let start = 32 * SEC;
        let mut now = start;
        while now < start + crate::flow::SWEEP_PASS_NS {
            let vs = run_batch(&mut pipe, &t, now, &busy, 64);
            assert!(vs.iter().all(|(v, _)| *v == Verdict::Tx { port: 0 }));
            now += 10_000_000;
        }
        assert_eq!(pipe.flows.stats().expired, 500, "one pass reclaimed them");
        assert_eq!(pipe.flows.len(), 1, "only the busy client's flow is left");
    }

    #[test]
    fn a_reused_backend_id_never_captures_a_flow() {
        let (x, y) = (("198.51.100.11", 0x11), ("198.51.100.12", 0x12));
        let mut builder = Builder::new();
        let t1 = build(&mut builder, &config("dsr-l2", &[x, y], &[]));
        let mut pipe = Pipeline::new(0, 1, 1024, Timeouts::default(), 0);
        let (v, out) = run(&mut pipe, &t1, SEC, &tcp(CLIENT, VIP_A, true));
        assert_eq!(v, Verdict::Tx { port: 0 });
        let first = backend_by_mac(&t1, &out[0..6]);
        let (gone, kept) = if first.mac.map(|m| m.0) == Some([2, 0, 0, 0, 1, 0x11]) {
            (x, y)
        } else {
            (y, x)
        };
        // The flow's backend leaves service a; a build later, service b gets a backend at the
        // same address and port, which takes the freed id (with another MAC).
        let _t2 = build(&mut builder, &config("dsr-l2", &[kept], &[]));
        let t3 = build(&mut builder, &config("dsr-l2", &[kept], &[(gone.0, 0x99)]));
        let usurper = backend_by_mac(&t3, &[2, 0, 0, 0, 1, 0x99]);
        assert_eq!(usurper.id, first.id, "the freed id is reused");
        assert_eq!((usurper.addr, usurper.port), (first.addr, first.port));
        assert_ne!(usurper.incarnation, first.incarnation);

        let (v, out) = run(&mut pipe, &t3, 2 * SEC, &tcp(CLIENT, VIP_A, false));
        assert_eq!(v, Verdict::Tx { port: 0 });
        assert_eq!(
            &out[0..6],
            &[2, 0, 0, 0, 1, kept.1],
            "the flow moves to its service's remaining backend, not to the id's new holder"
        );
        assert_eq!(pipe.counters.flows_rehashed, 1);
        // And stays there.
        let (_, out) = run(&mut pipe, &t3, 3 * SEC, &tcp(CLIENT, VIP_A, false));
        assert_eq!(&out[0..6], &[2, 0, 0, 0, 1, kept.1]);
        assert_eq!(pipe.counters.flows_rehashed, 1);
    }

    /// A client frame from `CLIENT` to service a's VIP with TCP `flags`.
    fn client_segment(flags: u8) -> Vec<u8> {
        let mut f = tcp(CLIENT, VIP_A, false);
        // Ethernet 14 + IPv4 20: the TCP flags byte is the header's 14th.
        f[14 + 20 + 13] = flags;
        let ip = etherparse::Ipv4HeaderSlice::from_slice(&f[14..]).expect("ipv4");
        let tcp_hdr = etherparse::TcpHeader::from_slice(&f[34..]).expect("tcp").0;
        let sum = tcp_hdr
            .calc_checksum_ipv4_raw(ip.source(), ip.destination(), &[])
            .expect("checksum");
        f[34 + 16..34 + 18].copy_from_slice(&sum.to_be_bytes());
        f
    }

    #[test]
    fn a_new_connection_on_a_closed_flows_port_avoids_a_draining_backend() {
        let (x, y) = (("198.51.100.31", 0x31), ("198.51.100.32", 0x32));
        let mut builder = Builder::new();
        let t1 = build(&mut builder, &config("nat", &[x, y], &[]));
        let mut pipe = Pipeline::new(0, 1, 1024, Timeouts::default(), 0);
        let (v, out) = run(&mut pipe, &t1, SEC, &client_segment(flags::SYN));
        assert_eq!(v, Verdict::Tx { port: 0 });
        let first = backend_by_mac(&t1, &out[0..6]);
        let (old, other) = if first.mac.map(|m| m.0) == Some([2, 0, 0, 0, 1, x.1]) {
            (x, y)
        } else {
            (y, x)
        };
        // The connection ends: the client's FIN, then its last ACK. Its entry lingers as
        // closing (10 s).
        for f in [flags::FIN | flags::ACK, flags::ACK] {
            let (v, out) = run(&mut pipe, &t1, 2 * SEC, &client_segment(f));
            assert_eq!(v, Verdict::Tx { port: 0 });
            assert_eq!(&out[0..6], &[2, 0, 0, 0, 1, old.1]);
        }
        // Its backend starts draining; the client reuses the port for a new connection within
        // the closing entry's life. A draining backend takes no new flows, so it is not this
        // one's: pinned to it, the connection would be cut when the drain ends.
        let draining = strait_config::parse(&format!(
            r#"
[[gateway.interfaces]]
name = "eth0"
queues = [0]
[[services]]
name = "a"
vip = "203.0.113.10"
port = 80
mode = "nat"
maglev_table_size = 251
backends = [
  {{ address = "{}", port = 8080, mac = "02:00:00:00:01:{:02x}", state = "draining" }},
  {{ address = "{}", port = 8080, mac = "02:00:00:00:01:{:02x}" }},
]
"#,
            old.0, old.1, other.0, other.1
        ))
        .expect("test config");
        let t2 = build(&mut builder, &draining);
        // A retransmitted segment of the old connection still reaches its backend.
        let (_, out) = run(&mut pipe, &t2, 3 * SEC, &client_segment(flags::ACK));
        assert_eq!(&out[0..6], &[2, 0, 0, 0, 1, old.1]);
        assert_eq!(pipe.counters.flows_reopened, 0);
        let (v, out) = run(&mut pipe, &t2, 4 * SEC, &client_segment(flags::SYN));
        assert_eq!(v, Verdict::Tx { port: 0 });
        assert_eq!(
            &out[0..6],
            &[2, 0, 0, 0, 1, other.1],
            "the new connection goes to the backend that takes new flows"
        );
        assert_eq!(pipe.counters.flows_reopened, 1);
        assert_eq!(pipe.counters.flows_rehashed, 0);
        // It stays there, and its replies come back from the VIP; the old backend's late
        // segments to this client port are no longer a flow's.
        let (_, out) = run(&mut pipe, &t2, 5 * SEC, &client_segment(flags::ACK));
        assert_eq!(&out[0..6], &[2, 0, 0, 0, 1, other.1]);
        let addr = |a: &str| a.parse::<core::net::Ipv4Addr>().unwrap().octets();
        let (v, out) = run(
            &mut pipe,
            &t2,
            5 * SEC,
            &tcp((addr(other.0), 8080), CLIENT, false),
        );
        assert_eq!(v, Verdict::Tx { port: 0 });
        assert_eq!(&out[26..30], &VIP_A.0);
        let (v, _) = run(
            &mut pipe,
            &t2,
            5 * SEC,
            &tcp((addr(old.0), 8080), CLIENT, false),
        );
        assert_eq!(v, Verdict::Drop(DropReason::ReplyNoFlow));
        assert!(pipe.counters.balanced());
    }

    #[test]
    fn a_retransmitted_syn_keeps_a_draining_backend() {
        let (x, y) = (("198.51.100.41", 0x41), ("198.51.100.42", 0x42));
        let mut builder = Builder::new();
        let t1 = build(&mut builder, &config("nat", &[x, y], &[]));
        let mut pipe = Pipeline::new(0, 1, 1024, Timeouts::default(), 0);
        let (_, out) = run(&mut pipe, &t1, SEC, &client_segment(flags::SYN));
        let first = backend_by_mac(&t1, &out[0..6]);
        let old = if first.mac.map(|m| m.0) == Some([2, 0, 0, 0, 1, x.1]) {
            x
        } else {
            y
        };
        let other = if old == x { y } else { x };
        let draining = config("nat", &[other], &[]);
        // `other` alone in a, `old` gone would re-hash; keep `old` draining instead.
        let mut cfg = draining;
        let mut b = cfg.services[0].backends[0].clone();
        b.address = old.0.parse().unwrap();
        b.mac = Some(strait_config::model::MacAddr([2, 0, 0, 0, 1, old.1]));
        b.state = strait_config::model::BackendState::Draining;
        cfg.services[0].backends.push(b);
        let t2 = build(&mut builder, &cfg);
        // The handshake's SYN again (its SYN-ACK was lost): the same connection, which the
        // draining backend keeps.
        let (_, out) = run(&mut pipe, &t2, 2 * SEC, &client_segment(flags::SYN));
        assert_eq!(&out[0..6], &[2, 0, 0, 0, 1, old.1]);
        assert_eq!(pipe.counters.flows_reopened, 0);
    }

    #[test]
    fn nat_replies_follow_the_flows_backend_across_rebuilds() {
        let (x, y) = (("198.51.100.21", 0x21), ("198.51.100.22", 0x22));
        let mut builder = Builder::new();
        let t1 = build(&mut builder, &config("nat", &[x, y], &[]));
        let mut pipe = Pipeline::new(0, 1, 1024, Timeouts::default(), 0);
        let (v, out) = run(&mut pipe, &t1, SEC, &tcp(CLIENT, VIP_A, true));
        assert_eq!(v, Verdict::Tx { port: 0 });
        let first = backend_by_mac(&t1, &out[0..6]);
        let first_addr: [u8; 4] = first.addr[12..].try_into().unwrap();
        let reply = tcp((first_addr, 8080), CLIENT, false);
        let (v, out) = run(&mut pipe, &t1, SEC, &reply);
        assert_eq!(v, Verdict::Tx { port: 0 });
        assert_eq!(&out[26..30], &VIP_A.0, "reply leaves from the VIP");
        assert_eq!(&out[0..6], &CLIENT_MAC, "back to the client's next hop");

        // A rebuild that keeps the backend keeps translating its replies.
        let (gone, kept) = if first.mac.map(|m| m.0) == Some([2, 0, 0, 0, 1, 0x21]) {
            (x, y)
        } else {
            (y, x)
        };
        let t2 = build(&mut builder, &config("nat", &[x, y], &[]));
        let (_, out) = run(&mut pipe, &t2, 2 * SEC, &reply);
        assert_eq!(&out[26..30], &VIP_A.0);

        // The backend leaves service a and reappears, at the same address and port, in
        // service b (with the freed id): its replies to this client are no longer this
        // flow's, and the flow's next packet moves to the remaining backend.
        let _t3 = build(&mut builder, &config("nat", &[kept], &[]));
        let t4 = build(&mut builder, &config("nat", &[kept], &[(gone.0, 0x99)]));
        assert_eq!(backend_by_mac(&t4, &[2, 0, 0, 0, 1, 0x99]).id, first.id);
        let (v, _) = run(&mut pipe, &t4, 3 * SEC, &reply);
        assert_eq!(v, Verdict::Drop(DropReason::ReplyNoFlow));
        let (v, out) = run(&mut pipe, &t4, 3 * SEC, &tcp(CLIENT, VIP_A, false));
        assert_eq!(v, Verdict::Tx { port: 0 });
        assert_eq!(&out[0..6], &[2, 0, 0, 0, 1, kept.1]);
        let kept_addr: [u8; 4] = kept.0.parse::<core::net::Ipv4Addr>().unwrap().octets();
        let (v, out) = run(
            &mut pipe,
            &t4,
            3 * SEC,
            &tcp((kept_addr, 8080), CLIENT, false),
        );
        assert_eq!(v, Verdict::Tx { port: 0 });
        assert_eq!(
            &out[26..30],
            &VIP_A.0,
            "the new backend's replies are translated"
        );
    }

    /// A reply from `backend` (address, port 8080) to the client's `port`.
    fn reply_to(backend: &str, port: u16) -> Vec<u8> {
        let addr: [u8; 4] = backend.parse::<core::net::Ipv4Addr>().unwrap().octets();
        tcp((addr, 8080), (CLIENT.0, port), false)
    }

    #[test]
    fn a_nat_flow_has_one_entry_which_its_replies_find_staged_or_not() {
        let x = ("198.51.100.11", 0x11);
        let mut builder = Builder::new();
        let t = build(&mut builder, &config("nat", &[x], &[]));
        let mut pipe = Pipeline::new(0, 1, 1024, t.timeouts, 0);
        let out = run_batch(&mut pipe, &t, SEC, &[tcp(CLIENT, VIP_A, true)], 64);
        assert_eq!(out[0].0, Verdict::Tx { port: 0 });
        assert_eq!(pipe.flows.len(), 1, "one entry for both directions");
        let key = FlowKey {
            src: crate::key::v4_mapped(CLIENT.0),
            dst: crate::key::v4_mapped(VIP_A.0),
            src_port: CLIENT.1,
            dst_port: VIP_A.1,
            proto: proto::TCP,
        };
        let v = *pipe.flows.peek(&key).expect("the flow's entry");
        assert_eq!(
            v.peer_mac().0,
            CLIENT_MAC,
            "replies go back to the client's next hop"
        );
        assert!(!v.answered());

        // The backend's answer, through the staged batch and through `process`: from the
        // VIP, to the MAC the client's packets came from; the entry is answered, and its
        // state still half-open (only the client's ACK establishes it).
        for (i, now) in [(0, 2 * SEC), (1, 3 * SEC)] {
            let (v, frame) = if i == 0 {
                run_batch(&mut pipe, &t, now, &[reply_to(x.0, CLIENT.1)], 64).remove(0)
            } else {
                run(&mut pipe, &t, now, &reply_to(x.0, CLIENT.1))
            };
            assert_eq!(v, Verdict::Tx { port: 0 }, "reply {i}");
            assert_eq!(&frame[26..30], &VIP_A.0, "reply {i} leaves from the VIP");
            assert_eq!(&frame[34..36], &VIP_A.1.to_be_bytes(), "and its port");
            assert_eq!(&frame[0..6], &CLIENT_MAC);
            let e = *pipe.flows.peek(&key).unwrap();
            assert!(e.answered());
            assert_eq!(e.state, FlowState::TcpSyn);
            assert_eq!(e.last_seen_ms(), now / 1_000_000, "the reply touched it");
        }
        assert_eq!(pipe.flows.len(), 1);

        // No flow from that client port: dropped, staged or not.
        let stray = reply_to(x.0, CLIENT.1 + 1);
        assert_eq!(
            run_batch(&mut pipe, &t, 4 * SEC, std::slice::from_ref(&stray), 64)[0].0,
            Verdict::Drop(DropReason::ReplyNoFlow)
        );
        assert_eq!(
            run(&mut pipe, &t, 4 * SEC, &stray).0,
            Verdict::Drop(DropReason::ReplyNoFlow)
        );

        // The client's ACK establishes the flow; the backend's FIN closes it.
        let (v, _) = run(&mut pipe, &t, 5 * SEC, &tcp(CLIENT, VIP_A, false));
        assert_eq!(v, Verdict::Tx { port: 0 });
        assert_eq!(
            pipe.flows.peek(&key).unwrap().state,
            FlowState::TcpEstablished
        );
        let mut fin = reply_to(x.0, CLIENT.1);
        fin[47] |= crate::flow::tcp_flags::FIN;
        let (v, _) = run(&mut pipe, &t, 6 * SEC, &fin);
        assert_eq!(v, Verdict::Tx { port: 0 });
        assert_eq!(pipe.flows.peek(&key).unwrap().state, FlowState::TcpClosing);
    }

    #[test]
    fn replies_from_a_backend_two_frontends_share_go_back_from_their_flows_vip() {
        let x = ("198.51.100.11", 0x11);
        const VIP_B: ([u8; 4], u16) = ([203, 0, 113, 20], 80);
        let mut builder = Builder::new();
        let t = build(&mut builder, &config("nat", &[x], &[x]));
        assert!(t.nat_shared());
        let mut pipe = Pipeline::new(0, 1, 1024, t.timeouts, 0);
        let a = (CLIENT.0, 40000);
        let b = (CLIENT.0, 40001);
        let out = run_batch(
            &mut pipe,
            &t,
            SEC,
            &[tcp(a, VIP_A, true), tcp(b, VIP_B, true)],
            64,
        );
        assert!(
            out.iter().all(|(v, _)| *v == Verdict::Tx { port: 0 }),
            "{out:?}"
        );
        for (port, vip) in [(a.1, VIP_A), (b.1, VIP_B)] {
            for staged in [true, false] {
                let reply = reply_to(x.0, port);
                let (v, frame) = if staged {
                    run_batch(&mut pipe, &t, 2 * SEC, &[reply], 64).remove(0)
                } else {
                    run(&mut pipe, &t, 2 * SEC, &reply)
                };
                assert_eq!(v, Verdict::Tx { port: 0 }, "to port {port}");
                assert_eq!(
                    &frame[26..30],
                    &vip.0,
                    "to port {port}: from its flow's VIP"
                );
            }
        }
        // The same client port to the other VIP would take the same reply tuple.
        let (v, _) = run(&mut pipe, &t, 2 * SEC, &tcp(a, VIP_B, true));
        assert_eq!(v, Verdict::Drop(DropReason::NatCollision));
        // Once the first flow has expired (half-open: 30 s), it may.
        let (v, _) = run(&mut pipe, &t, 40 * SEC, &tcp(a, VIP_B, true));
        assert_eq!(v, Verdict::Tx { port: 0 });
        let (_, frame) = run(&mut pipe, &t, 41 * SEC, &reply_to(x.0, a.1));
        assert_eq!(&frame[26..30], &VIP_B.0);
    }

    #[test]
    fn a_flow_from_source_port_0_takes_its_affinity_entrys_key_and_keeps_its_own_mac() {
        // The affinity entry's key is the client's flows' with source port 0, and its six
        // extra bytes hold its timeout, which must never be read as a next hop.
        let mut cfg = config("nat", &[("198.51.100.11", 0x11)], &[]);
        cfg.services[0].session_affinity = Some(core::time::Duration::from_secs(60));
        let t = build(&mut Builder::new(), &cfg);
        assert_ne!(t.services[0].affinity_secs, 0, "the service has affinity");
        let mut pipe = Pipeline::new(0, 1, 1024, t.timeouts, 0);
        // The client's first flow makes its affinity entry; then one from port 0 comes.
        let (v, _) = run(&mut pipe, &t, SEC, &tcp((CLIENT.0, 40000), VIP_A, true));
        assert_eq!(v, Verdict::Tx { port: 0 });
        let zero = (CLIENT.0, 0);
        let (v, _) = run(&mut pipe, &t, SEC, &tcp(zero, VIP_A, true));
        assert_eq!(v, Verdict::Tx { port: 0 });
        for staged in [false, true] {
            let reply = reply_to("198.51.100.11", 0);
            let (v, frame) = if staged {
                run_batch(&mut pipe, &t, 2 * SEC, &[reply], 64).remove(0)
            } else {
                run(&mut pipe, &t, 2 * SEC, &reply)
            };
            assert_eq!(v, Verdict::Tx { port: 0 });
            assert_eq!(&frame[0..6], &CLIENT_MAC, "back to the client's next hop");
            assert_eq!(&frame[26..30], &VIP_A.0);
        }
        // Another flow of the client still gets a backend, and the port-0 flow's packets
        // still find their entry.
        let (v, _) = run(&mut pipe, &t, 3 * SEC, &tcp((CLIENT.0, 40001), VIP_A, true));
        assert_eq!(v, Verdict::Tx { port: 0 });
        let (v, _) = run(&mut pipe, &t, 4 * SEC, &tcp(zero, VIP_A, false));
        assert_eq!(v, Verdict::Tx { port: 0 });
    }
}
