//! Packet capture inside the workers: the dataplane's half of `strait capture`.
//!
//! An operator asks what the gateway did with some packets. The answer cannot come from a
//! tcpdump on the data interface: AF_XDP frames never reach the kernel's taps, and a tap would
//! not know the verdict. So the workers copy matching frames themselves, as received and as
//! sent, with their verdict, into a bounded ring per worker that the control side drains into
//! pcapng.
//!
//! ```text
//!  control: Hub::arm(filter) ─► armed = session, filter words ─────────────┐
//!  worker, per batch: armed?  no ─► the plain decision loop (one load, one branch)
//!                             yes ─► per frame: address filter (parsed frame)
//!                                      copy as received (before the rewrite)
//!                                      decide (Pipeline::finish, unchanged)
//!                                      verdict filter, --every sampling, per-second budget
//!                                      copy as sent; publish both records ─► ring ─► control
//! ```
//!
//! # Cost
//!
//! Disarmed, a batch pays one relaxed load of [`Hub`]'s `armed` word (a cache line written
//! only when a capture starts or stops, so it stays shared in every core's cache) and one
//! branch that always goes the same way. Armed, each frame pays the filter on its parsed
//! header; each frame taken pays two copies of at most `snaplen` bytes (word stores into the
//! ring, no `unsafe`), bounded by the per-second budget of [`Filter::budget`] frames per
//! worker and thinned by [`Filter::every`]. A frame whose copy as received would be wasted is
//! not copied: a capture of drops or passes copies after the decision (those frames are not
//! rewritten), and the sampling and budget decisions are known before the copy.
//!
//! # What is never traded
//!
//! A full ring loses capture records, never packets: the worker never waits for the
//! consumer. Every frame the filter looks at ends in exactly one [`CaptureCounters`] result
//! (captured, filtered out, sampled out, over budget, ring full), so
//! `captured + filtered + sampled + over_budget + ring_full` counts the frames seen while
//! armed. Nothing here allocates after [`Hub::new`]: the rings are preallocated slots of
//! [`SLOT_WORDS`] words, [`SNAP_MAX`] bytes of frame each.
//!
//! # The ring
//!
//! The flow-sync ring's design ([`crate::sync`]: SPSC, cache-padded indices, each side
//! caching the other's index, full means drop and count), with slots of [`SLOT_WORDS`]
//! `AtomicU64` words: relaxed word stores compile to plain stores, and the release store of
//! `tail` publishes a frame's records (its copy as received and, for a sent frame, its copy
//! as sent) together. Records carry their session: the control side discards those a
//! stopped capture left behind.
//!
//! # Sessions
//!
//! One capture runs at a time ([`Hub::arm`] refuses a second). The filter is written while
//! the hub is disarmed and published by the release store of the session id; a worker that
//! sees a new session id reads the filter and checks the id again (a seqlock's read side), so
//! it never runs a filter of another session under this one's id.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use strait_config::model::Mode;

use crate::key::Addr;
use crate::stats::DropReason;
use crate::table::{Frontend, Prefix, ServiceTable};
use crate::wire::parse::Parsed;

/// Largest frame a record holds, in bytes; longer frames are cut (the record keeps their
/// length). 2048 holds a 1500-byte-MTU frame with a VLAN tag and the largest encapsulation
/// (IPv6 + UDP + GUE) with room to spare; jumbo frames are cut.
pub const SNAP_MAX: usize = 2048;

/// Words of a record's header:
///
/// | word | holds |
/// |---|---|
/// | 0 | the session's id |
/// | 1 | the worker's clock at the batch, ns |
/// | 2 | bits 0-7 direction (0 in, 1 out), 8-15 verdict, 16-23 its port or reason, 24-31 port, 32-47 core, 48-55 mode + 1 (0: none) |
/// | 3 | the frame's length << 32, bytes kept |
/// | 4-5 | the backend's address (key form) |
/// | 6 | bits 0-15 the backend's port, 16 a backend, 17 a service, 24-31 the name's length, 32-47 a handoff's core |
/// | 7-12 | the service's name, [`NAME_MAX`] bytes |
const HEAD_WORDS: usize = 16;

/// Words of one ring slot: the header and [`SNAP_MAX`] bytes of frame.
pub const SLOT_WORDS: usize = HEAD_WORDS + SNAP_MAX / 8;

/// Slots of each worker's ring. The control side drains every [`DRAIN_EVERY`]; at the default
/// budget of 10,000 frames a second a worker fills at most 200 slots (two records a frame)
/// between two drains, so 512 absorbs a late drain; about 1.1 MiB a worker.
pub const RING_SLOTS: usize = 512;

/// Bytes of one worker's ring, allocated when the hub is made (for the memory footprint).
pub const RING_BYTES: u64 = (RING_SLOTS * SLOT_WORDS * 8) as u64;

/// How often the control side drains the rings.
pub const DRAIN_EVERY: Duration = Duration::from_millis(10);

/// Frames a worker takes per second unless the capture says otherwise: two copies of at most
/// 2 KiB each, about 1-2 ms of one core a second at most, so a capture left running under
/// load costs the worker at most about 0.2 % of its time.
pub const DEFAULT_BUDGET: u32 = 10_000;

/// Longest service name a record carries, in bytes (longer names are cut).
pub const NAME_MAX: usize = 48;

/// What the pipeline decided for a frame, in the capture's own words: the pipeline's
/// `Verdict` (`crate::pipeline::Verdict`, which converts into it), named here so that this
/// module, below the pipeline, does not import it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Sent out of this table port.
    Tx {
        /// The port.
        port: u8,
    },
    /// Left to the kernel.
    Pass,
    /// Dropped for this reason.
    Drop(DropReason),
    /// Handed to the worker that owns its flow.
    Handoff {
        /// That worker's core.
        core: u16,
    },
}

/// Which decisions a capture keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Outcome {
    /// Every frame.
    #[default]
    Any,
    /// Frames sent on (forwarded, translated back, or answered).
    Tx,
    /// Dropped frames.
    Drop,
    /// Frames left to the kernel.
    Pass,
}

impl Outcome {
    /// Every outcome, in code order.
    pub const ALL: [Outcome; 4] = [Outcome::Any, Outcome::Tx, Outcome::Drop, Outcome::Pass];

    /// Its name on the command line and in the admin API.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Any => "any",
            Outcome::Tx => "tx",
            Outcome::Drop => "drop",
            Outcome::Pass => "pass",
        }
    }

    /// The outcome named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == s)
    }

    /// Whether verdict `v` is kept.
    #[inline]
    pub fn keeps(self, v: Decision) -> bool {
        matches!(
            (self, v),
            (Outcome::Any, _)
                | (Outcome::Tx, Decision::Tx { .. })
                | (Outcome::Drop, Decision::Drop(_))
                | (Outcome::Pass, Decision::Pass)
        )
    }

    /// Whether a frame may be kept only after a decision that leaves it as it arrived (a drop
    /// or a pass), so that its copy as received can wait for the decision.
    #[inline]
    fn unchanged_when_kept(self) -> bool {
        matches!(self, Outcome::Drop | Outcome::Pass)
    }
}

/// What a capture takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Filter {
    /// Frames to or from this address (key form), as received.
    pub vip: Option<Addr>,
    /// Frames whose source or destination, as received, lies in this prefix.
    pub client: Option<Prefix>,
    /// Frames whose source or destination port, as received, is this one.
    pub port: Option<u16>,
    /// Which decisions to keep.
    pub outcome: Outcome,
    /// Only drops for this reason (implies [`Outcome::Drop`]).
    pub reason: Option<DropReason>,
    /// Keep one frame in this many of those that match (1: every one).
    pub every: u32,
    /// Frames each worker keeps per second at most; more are counted over budget.
    pub budget: u32,
    /// Bytes of each frame kept (at most [`SNAP_MAX`]).
    pub snaplen: u16,
}

impl Default for Filter {
    fn default() -> Self {
        Self {
            vip: None,
            client: None,
            port: None,
            outcome: Outcome::Any,
            reason: None,
            every: 1,
            budget: DEFAULT_BUDGET,
            snaplen: SNAP_MAX as u16,
        }
    }
}

/// Words of a published filter.
const FILTER_WORDS: usize = 8;

impl Filter {
    /// Whether a frame with these addresses and ports (as received) passes the address part
    /// of the filter. `ports` is `None` for a frame whose transport header was not read.
    #[inline]
    pub fn matches(&self, src: &Addr, dst: &Addr, ports: Option<(u16, u16)>) -> bool {
        self.vip.is_none_or(|v| v == *src || v == *dst)
            && self
                .client
                .is_none_or(|c| c.contains(src) || c.contains(dst))
            && self
                .port
                .is_none_or(|p| ports.is_some_and(|(s, d)| s == p || d == p))
    }

    /// Whether the filter looks at addresses or ports at all.
    fn by_address(&self) -> bool {
        self.vip.is_some() || self.client.is_some() || self.port.is_some()
    }

    /// Whether the decision `v` is kept.
    #[inline]
    pub fn keeps(&self, v: Decision) -> bool {
        match self.reason {
            Some(r) => v == Decision::Drop(r),
            None => self.outcome.keeps(v),
        }
    }

    /// The outcome the filter keeps (a reason keeps drops).
    fn outcome(&self) -> Outcome {
        if self.reason.is_some() {
            Outcome::Drop
        } else {
            self.outcome
        }
    }

    fn to_words(self) -> [u64; FILTER_WORDS] {
        let mut w = [0u64; FILTER_WORDS];
        let flags = u64::from(self.vip.is_some())
            | u64::from(self.client.is_some()) << 1
            | u64::from(self.port.is_some()) << 2;
        let outcome = Outcome::ALL
            .iter()
            .position(|&o| o == self.outcome)
            .unwrap_or(0) as u64;
        let reason = self.reason.map_or(0, |r| r as u64 + 1);
        w[0] = flags
            | u64::from(self.port.unwrap_or(0)) << 16
            | outcome << 32
            | reason << 40
            | u64::from(self.snaplen) << 48;
        let vip = u128::from_be_bytes(self.vip.unwrap_or_default().0);
        (w[1], w[2]) = ((vip >> 64) as u64, vip as u64);
        let (addr, mask) = self.client.map_or((0, 0), |c| c.bits());
        (w[3], w[4]) = ((addr >> 64) as u64, addr as u64);
        (w[5], w[6]) = ((mask >> 64) as u64, mask as u64);
        w[7] = u64::from(self.every) | u64::from(self.budget) << 32;
        w
    }

    fn from_words(w: &[u64; FILTER_WORDS]) -> Self {
        let flags = w[0];
        let join = |hi: u64, lo: u64| u128::from(hi) << 64 | u128::from(lo);
        let reason = (w[0] >> 40) as u8;
        Self {
            vip: (flags & 1 != 0).then(|| Addr(join(w[1], w[2]).to_be_bytes())),
            client: (flags & 2 != 0).then(|| Prefix::from_bits(join(w[3], w[4]), join(w[5], w[6]))),
            port: (flags & 4 != 0).then_some((w[0] >> 16) as u16),
            outcome: Outcome::ALL[((w[0] >> 32) as u8 as usize).min(3)],
            reason: reason
                .checked_sub(1)
                .and_then(|r| DropReason::ALL.get(r as usize).copied()),
            every: (w[7] as u32).max(1),
            budget: (w[7] >> 32) as u32,
            snaplen: ((w[0] >> 48) as u16).min(SNAP_MAX as u16),
        }
    }
}

/// The address of `a` in key form (IPv4-mapped for IPv4), as filters and records hold it.
pub fn key_addr(a: IpAddr) -> Addr {
    match a {
        IpAddr::V4(v4) => crate::key::v4_mapped(v4.octets()),
        IpAddr::V6(v6) => Addr(v6.octets()),
    }
}

/// A cache-line-padded word (128 bytes: x86 prefetches lines in adjacent pairs).
#[repr(align(128))]
#[derive(Debug, Default)]
struct Padded(AtomicU64);

/// What became of the frames a worker's filter looked at while armed, per worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureCounters {
    /// Frames copied into the ring (with their copy as sent, if sent).
    pub captured: u64,
    /// Frames the filter did not take (addresses, ports, verdict or reason).
    pub filtered: u64,
    /// Frames that matched but were skipped by `--every`, while within the budget.
    pub sampled: u64,
    /// Frames that matched while the worker's per-second budget was spent.
    pub over_budget: u64,
    /// Frames that matched but found the ring full: capture records lost, never packets.
    pub ring_full: u64,
}

impl CaptureCounters {
    /// Every result with its label value, for `strait_capture_frames_total{result}`.
    pub fn results(&self) -> [(&'static str, u64); 5] {
        [
            ("captured", self.captured),
            ("filtered", self.filtered),
            ("sampled", self.sampled),
            ("over_budget", self.over_budget),
            ("ring_full", self.ring_full),
        ]
    }
}

/// One worker's ring and counters.
#[derive(Debug)]
struct Lane {
    head: Padded,
    tail: Padded,
    slots: Box<[AtomicU64]>,
    counts: [AtomicU64; 5],
}

impl Lane {
    fn new() -> Self {
        Self {
            head: Padded::default(),
            tail: Padded::default(),
            slots: (0..RING_SLOTS * SLOT_WORDS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            counts: Default::default(),
        }
    }

    #[inline]
    fn slot(&self, i: u64) -> &[AtomicU64] {
        let at = (i as usize % RING_SLOTS) * SLOT_WORDS;
        &self.slots[at..at + SLOT_WORDS]
    }
}

/// The capture state every worker and the control side share: whether a capture runs, its
/// filter, and one ring per worker. Made once, before the workers start.
#[derive(Debug)]
pub struct Hub {
    /// The running session's id, 0 when none.
    armed: Padded,
    filter: [AtomicU64; FILTER_WORDS],
    lanes: Box<[Lane]>,
    /// The consumers' places in the rings; `None` while a [`Session`] holds them.
    heads: Mutex<Option<Vec<u64>>>,
    sessions: AtomicU64,
    origin: Instant,
    wall: SystemTime,
}

/// Why a capture cannot start.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArmError {
    /// Another capture runs.
    #[error("another capture is running (one at a time)")]
    Busy,
}

impl Hub {
    /// A hub for `workers` workers, disarmed, with its rings allocated. Its clock origin is
    /// now: the workers' clocks must count from [`Hub::origin`] for records' times to be
    /// right.
    pub fn new(workers: usize) -> Self {
        Self {
            armed: Padded::default(),
            filter: Default::default(),
            lanes: (0..workers).map(|_| Lane::new()).collect(),
            heads: Mutex::new(Some(vec![0; workers])),
            sessions: AtomicU64::new(0),
            origin: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    /// The instant the workers' clocks count from.
    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// The wall-clock time of a worker clock reading `ns`.
    pub fn wall_time(&self, ns: u64) -> SystemTime {
        self.wall + Duration::from_nanos(ns)
    }

    /// Workers served.
    pub fn workers(&self) -> usize {
        self.lanes.len()
    }

    /// Worker `core`'s counters (all sessions so far).
    pub fn counters(&self, core: usize) -> CaptureCounters {
        let Some(l) = self.lanes.get(core) else {
            return CaptureCounters::default();
        };
        let c = |i: usize| l.counts[i].load(Ordering::Relaxed);
        CaptureCounters {
            captured: c(0),
            filtered: c(1),
            sampled: c(2),
            over_budget: c(3),
            ring_full: c(4),
        }
    }

    /// Whether a capture runs.
    pub fn is_armed(&self) -> bool {
        self.armed.0.load(Ordering::Relaxed) != 0
    }

    /// Starts a capture with `filter`; it runs until the [`Session`] is dropped.
    ///
    /// # Errors
    /// [`ArmError::Busy`] while another session runs.
    pub fn arm(self: &Arc<Self>, filter: Filter) -> Result<Session, ArmError> {
        let heads = self
            .heads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or(ArmError::Busy)?;
        for (w, v) in self.filter.iter().zip(filter.to_words()) {
            w.store(v, Ordering::Relaxed);
        }
        let id = self.sessions.fetch_add(1, Ordering::Relaxed) + 1;
        // Release: the filter's words happen before a worker sees the id.
        self.armed.0.store(id, Ordering::Release);
        Ok(Session {
            hub: Arc::clone(self),
            id,
            heads,
        })
    }

    /// Worker `core`'s end of the hub.
    ///
    /// # Panics
    /// If the hub serves fewer workers than `core + 1`.
    pub fn tap(self: &Arc<Self>, core: u16) -> Tap {
        assert!(
            (core as usize) < self.lanes.len(),
            "no capture ring for core {core}"
        );
        Tap {
            hub: Arc::clone(self),
            core,
            session: 0,
            filter: Filter::default(),
            matched: 0,
            second: 0,
            used: 0,
            tail: 0,
            head: 0,
        }
    }
}

/// A running capture: drains the workers' rings; dropping it stops the capture.
#[derive(Debug)]
pub struct Session {
    hub: Arc<Hub>,
    id: u64,
    heads: Vec<u64>,
}

impl Session {
    /// Takes every record the workers have published, oldest first per worker, and gives
    /// each to `f`; returns how many. Records of earlier sessions are skipped.
    pub fn drain(&mut self, mut f: impl FnMut(&Record<'_>)) -> usize {
        let mut n = 0;
        let mut words = vec![0u64; SLOT_WORDS];
        let mut bytes = vec![0u8; SNAP_MAX];
        let mut name = [0u8; NAME_MAX];
        for (lane, head) in self.hub.lanes.iter().zip(&mut self.heads) {
            // Acquire: the slots' words happen before the tail we read.
            let tail = lane.tail.0.load(Ordering::Acquire);
            while *head != tail {
                for (w, s) in words.iter_mut().zip(lane.slot(*head)) {
                    *w = s.load(Ordering::Relaxed);
                }
                *head = head.wrapping_add(1);
                if let Some(r) = Record::decode(&words, &mut bytes, &mut name) {
                    if r.session == self.id {
                        f(&r);
                        n += 1;
                    }
                }
            }
            // Release: our reads of the slots happen before the worker may overwrite them.
            lane.head.0.store(*head, Ordering::Release);
        }
        n
    }

    /// The hub this session runs on.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.hub.armed.0.store(0, Ordering::Release);
        *self
            .hub
            .heads
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(std::mem::take(&mut self.heads));
    }
}

/// Which copy of a frame a record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// As received, before the pipeline rewrote it.
    In,
    /// As sent, after the rewrite.
    Out,
}

/// One captured copy of a frame, as the control side reads it.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    /// The session that took it.
    pub session: u64,
    /// The worker's clock when its batch started (see [`Hub::wall_time`]).
    pub time_ns: u64,
    /// In or out.
    pub direction: Direction,
    /// The frame's verdict.
    pub verdict: Decision,
    /// The worker (pipeline core) that took it.
    pub core: u16,
    /// The table port it arrived on (in) or leaves by (out).
    pub port: u8,
    /// The frame's service's mode, when it has a service.
    pub mode: Option<Mode>,
    /// The frame's service's name (cut at [`NAME_MAX`] bytes), when it has a service.
    pub service: Option<&'a str>,
    /// The backend a sent frame goes to (address, port), when it has one.
    pub backend: Option<(IpAddr, u16)>,
    /// The frame's length.
    pub len: u32,
    /// The bytes kept (at most the capture's snaplen).
    pub data: &'a [u8],
}

/// Decision codes in a record.
const V_TX: u64 = 0;
const V_PASS: u64 = 1;
const V_DROP: u64 = 2;
const V_HANDOFF: u64 = 3;

impl Record<'_> {
    /// A record from a slot's words, its frame bytes copied into `bytes` and its service name
    /// into `name`; `None` for a slot that does not decode (only a producer bug could write
    /// one).
    fn decode<'b>(
        w: &[u64],
        bytes: &'b mut [u8],
        name: &'b mut [u8; NAME_MAX],
    ) -> Option<Record<'b>> {
        let meta = w[2];
        let (kind, code, arg) = (meta & 0xff, (meta >> 8) & 0xff, (meta >> 16) as u8);
        let verdict = match code {
            V_TX => Decision::Tx { port: arg },
            V_PASS => Decision::Pass,
            V_DROP => Decision::Drop(*DropReason::ALL.get(usize::from(arg))?),
            V_HANDOFF => Decision::Handoff {
                core: (w[6] >> 32) as u16,
            },
            _ => return None,
        };
        let mode = ((meta >> 48) as u8)
            .checked_sub(1)
            .and_then(|m| Mode::ALL.get(m as usize).copied());
        let (len, cap) = ((w[3] >> 32) as u32, (w[3] as u32 as usize).min(SNAP_MAX));
        words_into(&w[HEAD_WORDS..], &mut bytes[..cap]);
        let backend = (w[6] & 1 << 16 != 0).then(|| {
            let a = Addr((u128::from(w[4]) << 64 | u128::from(w[5])).to_be_bytes());
            (unkey(&a), w[6] as u16)
        });
        let name_len = ((w[6] >> 24) as u8 as usize).min(NAME_MAX);
        words_into(&w[7..7 + NAME_MAX / 8], &mut name[..]);
        let service = if w[6] & 1 << 17 != 0 {
            std::str::from_utf8(&name[..name_len]).ok()
        } else {
            None
        };
        Some(Record {
            session: w[0],
            time_ns: w[1],
            direction: if kind == 0 {
                Direction::In
            } else {
                Direction::Out
            },
            verdict,
            core: (meta >> 32) as u16,
            port: (meta >> 24) as u8,
            mode,
            service,
            backend,
            len,
            data: &bytes[..cap],
        })
    }
}

/// Fills `out` with the bytes of `w`, little-endian words in order.
fn words_into(w: &[u64], out: &mut [u8]) {
    for (c, word) in out.chunks_mut(8).zip(w) {
        c.copy_from_slice(&word.to_le_bytes()[..c.len()]);
    }
}

/// An address from key form.
fn unkey(a: &Addr) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(a.0);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// What [`Tap::before`] decided about a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Look {
    /// The address filter does not take it (counted).
    No,
    /// It passes the address filter; `copied` says its copy as received is in the ring
    /// (not yet published).
    Yes {
        /// Whether the copy as received was taken.
        copied: bool,
    },
}

/// A worker's end of the [`Hub`]: owned by its [`crate::pipeline::Pipeline`], used only
/// while a capture is armed.
#[derive(Debug)]
pub struct Tap {
    hub: Arc<Hub>,
    core: u16,
    /// The session whose filter `filter` is.
    session: u64,
    filter: Filter,
    /// Frames that matched the whole filter this session (for `every`).
    matched: u64,
    /// The second (of the worker's clock) the budget counts in, and frames taken in it.
    second: u64,
    used: u32,
    /// Producer index and the consumer's, as last read.
    tail: u64,
    head: u64,
}

impl Tap {
    /// Whether a capture is armed: the one load a disarmed batch pays.
    #[inline(always)]
    pub fn armed(&self) -> bool {
        self.hub.armed.0.load(Ordering::Relaxed) != 0
    }

    /// Called at the start of an armed batch: takes up a new session's filter. `false` if
    /// the capture stopped meanwhile (the batch then runs as disarmed).
    #[inline]
    pub fn begin(&mut self, now: u64) -> bool {
        // Acquire: pairs with the release store in `Hub::arm`.
        let id = self.hub.armed.0.load(Ordering::Acquire);
        if id == 0 {
            return false;
        }
        if id != self.session {
            let mut w = [0u64; FILTER_WORDS];
            for (w, s) in w.iter_mut().zip(&self.hub.filter) {
                *w = s.load(Ordering::Relaxed);
            }
            std::sync::atomic::fence(Ordering::Acquire);
            if self.hub.armed.0.load(Ordering::Relaxed) != id {
                return false;
            }
            self.filter = Filter::from_words(&w);
            self.session = id;
            self.matched = 0;
            self.used = 0;
            self.second = now / 1_000_000_000;
        }
        true
    }

    /// Adds one to counter `i` of this worker's lane (the worker is its only writer).
    #[inline]
    fn count(&self, i: usize) {
        let c = &self.hub.lanes[self.core as usize].counts[i];
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Free slots, re-reading the consumer's index when the cached one says fewer than
    /// `want`.
    #[inline]
    fn room(&mut self, want: u64) -> u64 {
        let lane = &self.hub.lanes[self.core as usize];
        let mut free = RING_SLOTS as u64 - self.tail.wrapping_sub(self.head);
        if free < want {
            self.head = lane.head.0.load(Ordering::Acquire);
            free = RING_SLOTS as u64 - self.tail.wrapping_sub(self.head);
        }
        free
    }

    /// Whether the next frame that matches the whole filter would be taken (sampling and
    /// budget), counting the budget's second from `now`.
    #[inline]
    fn would_take(&mut self, now: u64) -> bool {
        let s = now / 1_000_000_000;
        if s != self.second {
            self.second = s;
            self.used = 0;
        }
        (self.matched + 1).is_multiple_of(u64::from(self.filter.every))
            && self.used < self.filter.budget
    }

    /// Looks at a frame before the pipeline decides on it: the address filter on its parsed
    /// header and, if the frame would be kept and may be rewritten, its copy as received
    /// into the ring (not published until [`Tap::after`]).
    #[inline]
    pub fn before(
        &mut self,
        now: u64,
        ingress: u8,
        frame: &[u8],
        parsed: Result<Option<&Parsed>, DropReason>,
    ) -> Look {
        if !self.addresses_match(frame, parsed) {
            self.count(1);
            return Look::No;
        }
        if self.filter.outcome().unchanged_when_kept() || !self.would_take(now) {
            return Look::Yes { copied: false };
        }
        // Two slots: the copy as received and, if it is sent, the copy as sent.
        if self.room(2) < 2 {
            return Look::Yes { copied: false };
        }
        let at = self.tail;
        self.write(at, now, Direction::In, ingress, frame);
        Look::Yes { copied: true }
    }

    /// Whether the frame passes the address part of the filter. A frame that did not parse
    /// is judged by the addresses its IP header claims, if it has a readable one; without
    /// one it matches only a filter that names no address or port.
    #[inline]
    fn addresses_match(&self, frame: &[u8], parsed: Result<Option<&Parsed>, DropReason>) -> bool {
        if !self.filter.by_address() {
            return true;
        }
        match parsed {
            Ok(Some(p)) => {
                let ports = (p.key.src_port != 0 || p.key.dst_port != 0)
                    .then_some((p.key.src_port, p.key.dst_port));
                self.filter.matches(&p.key.src, &p.key.dst, ports)
            }
            _ => crate::wire::parse::claimed(frame)
                .is_some_and(|c| self.filter.matches(&c.src, &c.dst, None)),
        }
    }

    /// Finishes with a frame [`Tap::before`] took up, once the pipeline decided `v` and
    /// rewrote it (`frame` is the frame as it leaves): the verdict filter, sampling, budget,
    /// and the records. `parsed` and `svc` are the frame's parse and frontend lookup as the
    /// pipeline made them.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn after(
        &mut self,
        look: Look,
        t: &ServiceTable,
        now: u64,
        ingress: u8,
        frame: &[u8],
        parsed: Result<Option<&Parsed>, DropReason>,
        svc: Option<Option<u32>>,
        v: Decision,
    ) {
        let Look::Yes { copied } = look else {
            return;
        };
        if !self.filter.keeps(v) {
            self.count(1);
            return;
        }
        if !self.would_take(now) {
            self.matched += 1;
            if self.used >= self.filter.budget {
                self.count(3);
            } else {
                self.count(2);
            }
            return;
        }
        self.matched += 1;
        let sent = matches!(v, Decision::Tx { .. });
        let need = if sent { 2 } else { 1 };
        let fresh = !copied;
        if (fresh && sent) || self.room(need) < need {
            // A sent frame whose copy as received could not be taken before its rewrite.
            self.count(4);
            return;
        }
        let at = self.tail;
        if fresh {
            // A drop or a pass: the frame is as it arrived.
            self.write(at, now, Direction::In, ingress, frame);
        }
        let (si, backend) = describe(t, frame, parsed, svc, v);
        let s = si.and_then(|si| t.services.get(si as usize));
        self.stamp(at, v, s.map(|s| (&*s.name, s.mode)), None);
        if let Decision::Tx { port } = v {
            self.write(at + 1, now, Direction::Out, port, frame);
            self.stamp(at + 1, v, s.map(|s| (&*s.name, s.mode)), backend);
        }
        self.tail = at.wrapping_add(need);
        // Release: the records' words happen before the consumer sees the new tail.
        self.hub.lanes[self.core as usize]
            .tail
            .0
            .store(self.tail, Ordering::Release);
        self.used += 1;
        self.count(0);
    }

    /// Writes a frame copy and its fixed fields into slot `at`.
    #[inline]
    fn write(&self, at: u64, now: u64, dir: Direction, port: u8, frame: &[u8]) {
        let slot = self.hub.lanes[self.core as usize].slot(at);
        let cap = frame.len().min(usize::from(self.filter.snaplen));
        slot[0].store(self.session, Ordering::Relaxed);
        slot[1].store(now, Ordering::Relaxed);
        let kind = u64::from(dir == Direction::Out);
        slot[2].store(
            kind | u64::from(port) << 24 | u64::from(self.core) << 32,
            Ordering::Relaxed,
        );
        slot[3].store((frame.len() as u64) << 32 | cap as u64, Ordering::Relaxed);
        let mut chunks = frame[..cap].chunks_exact(8);
        let data = &slot[HEAD_WORDS..];
        let mut i = 0;
        for c in &mut chunks {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            data[i].store(u64::from_le_bytes(b), Ordering::Relaxed);
            i += 1;
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            data[i].store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
    }

    /// Adds the verdict, the service and the backend to slot `at`.
    #[inline]
    fn stamp(
        &self,
        at: u64,
        v: Decision,
        svc: Option<(&str, Mode)>,
        backend: Option<&crate::table::Backend>,
    ) {
        let slot = self.hub.lanes[self.core as usize].slot(at);
        // The verdict's argument in 8 bits (a port, a reason); a handoff's core in word 6.
        let (code, arg, to_core) = match v {
            Decision::Tx { port } => (V_TX, u64::from(port), 0),
            Decision::Pass => (V_PASS, 0, 0),
            Decision::Drop(r) => (V_DROP, r as u64, 0),
            Decision::Handoff { core } => (V_HANDOFF, 0, u64::from(core)),
        };
        let mode = svc.map_or(0, |(_, m)| {
            Mode::ALL
                .iter()
                .position(|&x| x == m)
                .map_or(0, |i| i as u64 + 1)
        });
        let meta = slot[2].load(Ordering::Relaxed) & 0x0000_ffff_ff00_00ff;
        slot[2].store(meta | code << 8 | arg << 16 | mode << 48, Ordering::Relaxed);
        let mut w6 = to_core << 32;
        if let Some(b) = backend {
            let a = u128::from_be_bytes(b.addr.0);
            slot[4].store((a >> 64) as u64, Ordering::Relaxed);
            slot[5].store(a as u64, Ordering::Relaxed);
            w6 |= u64::from(b.port) | 1 << 16;
        }
        if let Some((name, _)) = svc {
            let name = &name.as_bytes()[..name.len().min(NAME_MAX)];
            w6 |= 1 << 17 | (name.len() as u64) << 24;
            for (i, c) in name.chunks(8).enumerate() {
                let mut b = [0u8; 8];
                b[..c.len()].copy_from_slice(c);
                slot[7 + i].store(u64::from_le_bytes(b), Ordering::Relaxed);
            }
        }
        slot[6].store(w6, Ordering::Relaxed);
    }
}

/// The service and backend of a decided frame, for its records: the service from the
/// frame's frontend (as received; for a nat reply, the frontend it is translated back to),
/// the backend from where the sent frame goes (dsr-l2: its destination MAC; nat: its
/// destination address and port; the tunnels: the outer destination; a nat reply: the
/// backend it came from). Only captured frames pay this.
fn describe<'t>(
    t: &'t ServiceTable,
    out: &[u8],
    parsed: Result<Option<&Parsed>, DropReason>,
    svc: Option<Option<u32>>,
    v: Decision,
) -> (Option<u32>, Option<&'t crate::table::Backend>) {
    let Ok(Some(p)) = parsed else {
        return (None, None);
    };
    let mut si = svc.flatten().or_else(|| {
        t.service_for(&Frontend {
            vip: p.key.dst,
            port: p.key.dst_port,
            proto: p.key.proto,
        })
    });
    if !matches!(v, Decision::Tx { .. }) {
        return (si, None);
    }
    // The sent frame's headers as it claims them: not `parse_into`, which must keep the
    // packet path as its only caller to stay inlined there.
    let out_hdr = crate::wire::parse::claimed(out);
    if si.is_none() {
        // A nat reply, sent as from its frontend: the backend is where it came from.
        let Some((o, Some((sport, _)))) = out_hdr.map(|o| (o, o.ports)) else {
            return (None, None);
        };
        let f = Frontend {
            vip: o.src,
            port: sport,
            proto: p.key.proto,
        };
        si = t.service_for(&f);
        return (
            si,
            si.and_then(|_| t.backend_at(&f, &p.key.src, p.key.src_port)),
        );
    }
    let Some(s) = si.and_then(|si| t.services.get(si as usize)) else {
        return (si, None);
    };
    let members = s.backends.iter().filter_map(|&id| t.backend(id));
    let b = match s.mode {
        Mode::DsrL2 => {
            let mac = out.get(..6);
            members
                .into_iter()
                .find(|b| b.mac.as_ref().map(|m| &m.0[..]) == mac)
        }
        Mode::Nat => match out_hdr {
            Some(o) => match o.ports {
                Some((_, dport)) => t.backend_at(&s.frontend, &o.dst, dport),
                None => None,
            },
            None => None,
        },
        Mode::DsrIpip | Mode::DsrGue => match out_hdr {
            Some(o) => members.into_iter().find(|b| b.tunnel == o.dst),
            None => None,
        },
    };
    (si, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_survive_publication() {
        let f = Filter {
            vip: Some(key_addr("203.0.113.10".parse().unwrap())),
            client: Some(Prefix::new("192.0.2.0".parse().unwrap(), 24)),
            port: Some(80),
            outcome: Outcome::Tx,
            reason: Some(DropReason::SourceNotAllowed),
            every: 7,
            budget: 123,
            snaplen: 96,
        };
        assert_eq!(Filter::from_words(&f.to_words()), f);
        assert_eq!(
            Filter::from_words(&Filter::default().to_words()),
            Filter::default()
        );
    }

    #[test]
    fn filters_match_either_direction_and_verdicts() {
        let client = key_addr("192.0.2.7".parse().unwrap());
        let vip = key_addr("203.0.113.10".parse().unwrap());
        let other = key_addr("198.51.100.1".parse().unwrap());
        let f = Filter {
            client: Some(Prefix::new("192.0.2.0".parse().unwrap(), 24)),
            port: Some(80),
            ..Filter::default()
        };
        assert!(f.matches(&client, &vip, Some((40000, 80))));
        assert!(
            f.matches(&vip, &client, Some((80, 40000))),
            "replies match too"
        );
        assert!(
            !f.matches(&other, &vip, Some((40000, 80))),
            "outside the prefix"
        );
        assert!(
            !f.matches(&client, &vip, Some((40000, 443))),
            "another port"
        );
        assert!(
            !f.matches(&client, &vip, None),
            "no ports read: no port match"
        );
        let f = Filter {
            vip: Some(vip),
            ..Filter::default()
        };
        assert!(f.matches(&client, &vip, None) && !f.matches(&client, &other, None));

        let drops = Filter {
            outcome: Outcome::Drop,
            ..Filter::default()
        };
        assert!(drops.keeps(Decision::Drop(DropReason::NoBackend)));
        assert!(!drops.keeps(Decision::Tx { port: 0 }) && !drops.keeps(Decision::Pass));
        let reason = Filter {
            reason: Some(DropReason::SourceNotAllowed),
            ..Filter::default()
        };
        assert!(reason.keeps(Decision::Drop(DropReason::SourceNotAllowed)));
        assert!(!reason.keeps(Decision::Drop(DropReason::NoBackend)));
        assert!(!reason.keeps(Decision::Tx { port: 0 }));
        assert!(Outcome::Any.keeps(Decision::Handoff { core: 1 }));
        assert_eq!(Outcome::parse("pass"), Some(Outcome::Pass));
        assert_eq!(Outcome::parse("bogus"), None);
    }
}
