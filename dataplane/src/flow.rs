//! The per-core flow table: 5-tuple to chosen backend.
//!
//! Every worker core owns one [`FlowTable`]. The first packet of a flow picks a backend by
//! Maglev and records the choice here; later packets find it here, so a flow stays on its
//! backend when the backend set changes under it. A nat flow has one entry for both
//! directions: its replies rebuild the forward 5-tuple (the backend's address and port
//! belong to a service, whose frontend is the VIP and port the client used) and find the
//! same entry, as IPVS finds one connection from either side. The table also holds
//! `sessionAffinity: ClientIP` entries; to the table they are all just keys and
//! [`FlowValue`]s.
//!
//! # Why one table per core
//!
//! A shared table needs locks or atomics on every packet, and even an uncontended atomic
//! bounces its cache line between the cores that touch it. One table per core has neither:
//! no locks, no atomics, no `Sync`. Every client-to-VIP packet of a flow reaches the same
//! queue, hence the same core: its owner, a function of the client address and port. NAT
//! replies carry the same pair and may land on another core; the IO layer hands them to the
//! owner through a bounded ring (`DESIGN.md`, "Reply traffic in `nat` mode"), so no table is
//! ever touched by two cores.
//!
//! # Why set-associative and not `hashbrown`
//!
//! The table is organised like a CPU cache: a power-of-two number of buckets of [`WAYS`]
//! (8) ways each, the bucket chosen by the low bits of the flow hash. A key can live only in
//! its own bucket, which buys two bounds that an open-addressing map does not give:
//!
//! - **Bounded work per operation.** A lookup compares at most 8 tags; an insert examines at
//!   most 8 ways to find room. `hashbrown` is fast on average, but after many removals it
//!   accumulates tombstones and eventually rehashes in place, an O(capacity) pause taken by
//!   one unlucky insert: with a million flows that is milliseconds on the packet path, with
//!   the RX ring overflowing behind it. A fixed table must also never grow, and growing is
//!   what a general-purpose map does when it fills.
//! - **Local eviction.** When a bucket is full, the candidates for eviction are its 8 ways,
//!   which an insert already has in hand. In an open-addressing map the "neighbours" of a key
//!   are a probe sequence shared with other keys, and evicting from it is not well defined.
//!
//! The price is that a bucket can fill while the table as a whole has room. A new key whose
//! home bucket is full therefore takes an empty way of another bucket of its *group*, the
//! [`GROUP`] (4) buckets whose tags share its cache line (see "Overflow into the group"
//! below); only when all 32 ways are taken, and the home bucket holds nothing expired or
//! half-open, does an insert fail with [`InsertError::Full`] rather than displace a live
//! established flow.
//!
//! # Overflow into the group
//!
//! A lookup screens the home bucket's 8 tags first, exactly as without overflow, so a hit at
//! home (all but a fraction of a percent of hits) costs nothing more. Only when that finds no
//! key does it screen the whole tag line, 32 tags, already in the cache since it is the same
//! line, branch-free; and only on a tag match there does it read an entry. Eviction stays in
//! the home bucket (8 entries read at most). The trade: a key whose bucket is full is
//! remembered instead of forwarded statelessly on every packet (each of which would read all
//! 8 entries of its full bucket), at the price of screening the line for nothing on new
//! flows; docs/performance.md has the figures.
//!
//! # Layout and memory cost
//!
//! Per bucket, a 16-byte array of eight 16-bit hash tags (four buckets' tags, a group, make
//! one line-aligned 64-byte cache line, so none straddles two), and separately the
//! eight entries, each exactly one 64-byte, line-aligned cache line: a 38-byte key and a
//! 26-byte value. A lookup loads the tag array, compares all 8 tags at once (the compiler
//! turns the loop into one SIMD compare), and reads a full key only where a tag matches: a
//! hit touches one line of tags and the one line of its entry; a miss usually touches only
//! the tags (a false tag match is a 2^-16 event per occupied way, so about one miss in
//! 16,000 in a half-full table reads one entry for nothing). The tag is the upper 16 bits of
//! the flow hash, independent of the bucket index taken from the low bits; tag 0 marks an
//! empty way, so a hash whose tag would be 0 uses 1.
//!
//! Tags are 16 bits rather than 32 so that the tag array is half the size (4 MiB for 2M
//! ways): a smaller array stays in the last-level cache more of the time, and a lookup's tag
//! load is then not a DRAM miss. Measured with 1M established flows (2M ways), 16-bit tags
//! took about 5 ns off a dsr-l2 packet's 70; the cost, an extra entry read per 16,000
//! misses, does not show.
//!
//! The value is kept to 26 bytes so that the entry fits its line: the backend is named by
//! [`BackendId`] and incarnation rather than by its 16-byte address (the snapshot has the
//! address; the incarnation catches reused ids), and the last-seen time is 40 bits of
//! milliseconds, so idle times and timeouts are counted in whole milliseconds. With a table
//! far larger than the caches, the lines a packet touches are most of its memory cost, each
//! priced by the array it comes from (docs/performance.md, "What a line costs"): an entry
//! with the address in it would span two lines.
//!
//! A probe is one line (the tag line) and a hit two (the tag line, then its entry). The
//! other layout, keys in the probed line, makes a hit one line but every probe a line of
//! full keys: a 38-byte key leaves room for one per line, so screening a bucket would read
//! eight lines where it now reads a quarter of one, and a miss, every new flow's case, would
//! no longer be one line. Making most hits one line while keeping the tag line was measured
//! and not kept: a home way per key (three hash bits), taken by an insert when empty and read
//! first by a lookup, with the tag copied into the entry. Three keys in four sat at home, but
//! the line they saved is the cheap one (the tag array, a thirty-second of the entries' size,
//! is mostly cached), the fourth read its home entry for nothing and then took three lines
//! in series, and established packets were no faster at 8M flows and 4-7 % slower at 1M;
//! docs/performance.md ("One line per hit, measured", "What a line costs") has the runs.
//!
//! Memory is 66 bytes per way: a table of 1M ways (131072 buckets) takes 66 MiB per core.
//!
//! # Entries per backend
//!
//! The table keeps, for every backend id below [`BACKEND_SLOTS`], how many entries name it
//! ([`FlowTable::entries_by_backend`]): the flows per service and backend that `/metrics`
//! shows. The count is kept exact where the table changes rather than found by a walk (a
//! walk of a million-flow table would be milliseconds, and the idle-time sweep does not run
//! on a busy core): every way filled goes through one place (an insert, also for entries
//! imported from peer gateways) and every way emptied through another (expiry by lookup,
//! insert or sweep, eviction, removal), and an insert that overwrites a live entry moves its
//! count. Both places already hold the entry's line, so the count costs an increment on a
//! small array, and nothing on a lookup. An entry counts until it is reclaimed, expired or
//! not, as in [`FlowTable::len`].
//!
//! An id is reused for another backend under a new incarnation while entries of its old
//! holder may linger (until their next packet re-hashes them, or they expire). So each slot
//! counts for one incarnation, the latest stored: the first entry of a new incarnation starts
//! the slot afresh, and entries of an older one are no longer counted, stored or reclaimed.
//! This is exact as long as an id's incarnations only grow newer, as they do for a core,
//! which only ever moves to newer tables; the reader takes a slot's count only when its
//! incarnation is the live backend's.
//! All of it is allocated and written in [`FlowTable::new`], so the packet path never
//! allocates and never takes a first-touch page fault.
//!
//! # Sizing
//!
//! Keys fall into buckets like balls into bins of 8, so some buckets fill long before the
//! table does; overflow into the group makes a bin of 32 out of four. The share of new-flow
//! inserts refused `Full` while occupancy (`len / capacity`) is in a given range, from a
//! balls-into-bins simulation of uniformly random keys (the one-bucket row was also measured
//! on the table before overflow existed, and matched):
//!
//! | occupancy | 10-20 % | 20-30 % | 30-40 % | 40-50 % | 50-60 % | 60-70 % | 70-80 % |
//! |---|---|---|---|---|---|---|---|
//! | home bucket only | 0.01 % | 0.1 % | 0.9 % | 3.3 % | 8.7 % | 18 % | 32 % |
//! | group of 4 (this table) | 0 | 0 | 0 | 0.004 % | 0.15 % | 1.5 % | 7.6 % |
//!
//! So configure a capacity of about twice the concurrent flows a core is expected to hold
//! (for 1M flows, 2M ways, 132 MiB per core) to keep refusals near 0.01 %. Refusals are
//! safe (Maglev forwards the flow statelessly) and counted in [`FlowStats::full`].
//!
//! # Expiry
//!
//! Each entry has an idle timeout chosen by its [`FlowState`] (see [`Timeouts`]) or by its own
//! [`FlowValue::timeout_override`]. Expiry is lazy: an expired entry is reclaimed when a
//! lookup or insert meets it, and [`FlowTable::sweep`] walks a bounded number of buckets from
//! a cursor: the IO layer calls it when a core is idle, and a busy core's pipeline calls
//! [`FlowTable::sweep_paced`] with every batch, which steps [`SWEEP_STEP`] buckets at a time
//! at a pace that passes over the whole table once in [`SWEEP_PASS_NS`], whatever its size.
//! So under any load an expired entry is reclaimed within that pass (10 s) of its expiry, and
//! the table's occupancy and its entries per backend tell the live flows, not the flows a
//! core has seen. Until reclaimed, an expired entry still counts in [`FlowTable::len`], but no
//! lookup returns it.
//!
//! # Eviction, and what happens when full
//!
//! A new flow takes, in order: an empty way; an expired way; the way in `TcpSyn` state (an
//! embryonic, half-open connection) idle the longest. It never evicts an established,
//! closing, UDP or other entry. During a SYN flood, spoofed SYNs therefore displace only each
//! other, and established flows keep their entries. A token bucket also caps the rate of new
//! entries per core ([`InsertError::RateLimited`]), so a flood cannot churn the whole table.
//!
//! When an insert fails (full bucket or over the rate), the pipeline still forwards the
//! packet, statelessly by Maglev, and counts it. As long as the backend set does not change,
//! Maglev picks the same backend for every packet of the flow, so nothing breaks; the flow
//! just loses its pinning if the backend set changes while it is not in the table.

use core::fmt;

use crate::hash::SEED_FLOW;
use crate::key::{Addr, BackendId, FlowKey, Proto};
use crate::wire::ethernet::Address as Mac;

/// Ways per bucket. Eight 16-bit tags fill 16 bytes, a quarter of a cache line, so one line
/// load screens a whole bucket (four, in fact); and an insert's worst case stays at 8 entries
/// examined. More ways would fill the table further before buckets overflow, at the price of
/// more tag lines per lookup and more entries examined per insert.
pub const WAYS: usize = 8;

/// The largest capacity [`FlowTable::new`] accepts: 2^28 ways, 16.5 GiB. Anything larger is
/// a configuration mistake, not a table size.
pub const MAX_CAPACITY: usize = 1 << 28;

/// Backend ids whose entries [`FlowTable::entries_by_backend`] counts: as many as the
/// pipeline's per-backend counters ([`crate::traffic::SLOTS`]); 512 KiB per table.
pub const BACKEND_SLOTS: usize = 1 << 16;

/// The entries of one backend id in a [`FlowTable`], for one incarnation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendEntries {
    /// The incarnation counted (0: none yet).
    pub incarnation: u32,
    /// Entries stored that name the id with that incarnation.
    pub entries: u32,
}

impl BackendEntries {
    /// The entries of incarnation `incarnation` in `slots[id]` (0 when the slot counts
    /// another).
    pub fn of(slots: &[BackendEntries], id: u32, incarnation: u32) -> u32 {
        match slots.get(id as usize) {
            Some(h) if h.incarnation == incarnation => h.entries,
            _ => 0,
        }
    }
}

/// Buckets one step of [`FlowTable::sweep_paced`] visits: 64 buckets, 512 ways, in a few
/// microseconds (the buckets are consecutive, so the reads stream).
pub const SWEEP_STEP: usize = 64;

/// Time in which [`FlowTable::sweep_paced`] passes over the whole table once: the shortest
/// default idle timeout (a closing TCP connection's), so that an expired entry lingers no
/// longer than its own timeout did. At 8M flows per core (2M buckets) that is a step every
/// 305 µs, about 1 % of the core.
pub const SWEEP_PASS_NS: u64 = 10 * NANOS_PER_SEC;

/// The bit of [`FlowValue`]'s last-seen byte 4 that marks an entry learnt from a peer.
const LEARNT: u8 = 0x80;

/// The bit of [`FlowValue`]'s made byte 5 that marks a nat flow its backend has answered.
const ANSWERED: u8 = 0x80;

const NANOS_PER_SEC: u64 = 1_000_000_000;
const NANOS_PER_MS: u64 = 1_000_000;
const MS_PER_SEC: u64 = 1_000;

/// TCP header flag bits (RFC 9293 section 3.1), as [`FlowState::on_tcp_flags`] takes them:
/// the low byte of the TCP header's flags field (byte 13).
pub mod tcp_flags {
    /// No more data from sender.
    pub const FIN: u8 = 0x01;
    /// Synchronise sequence numbers: opens a connection.
    pub const SYN: u8 = 0x02;
    /// Reset the connection.
    pub const RST: u8 = 0x04;
    /// Push function.
    pub const PSH: u8 = 0x08;
    /// The acknowledgment field is significant: every segment after the first SYN has it.
    pub const ACK: u8 = 0x10;
}

/// A flow's connection state, which picks its idle timeout.
///
/// The gateway sees one direction of a flow only (in DSR modes replies bypass it), so this is
/// a coarse tracker of what the client sends, not a TCP state machine: enough to tell a
/// half-open connection (short timeout, first to be evicted) from an established one, and a
/// closing one (short timeout) from both.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum FlowState {
    /// A SYN was seen, nothing acknowledged yet: half-open, possibly spoofed.
    TcpSyn,
    /// The client has acknowledged something: the handshake completed.
    TcpEstablished,
    /// A FIN or RST was seen.
    TcpClosing,
    /// A UDP flow.
    Udp,
    /// Any other protocol, or an entry that is not a connection (for example session
    /// affinity, which usually also sets [`FlowValue::timeout_override`]).
    Other,
}

impl FlowState {
    /// The state after a TCP segment with `flags` (bits from [`tcp_flags`]) from the client.
    ///
    /// | from | FIN or RST | SYN, no ACK | ACK | neither |
    /// |---|---|---|---|---|
    /// | `Udp`/`Other` (a new entry) | `TcpClosing` | `TcpSyn` | `TcpEstablished` | `TcpSyn` |
    /// | `TcpSyn` | `TcpClosing` | `TcpSyn` | `TcpEstablished` | `TcpSyn` |
    /// | `TcpEstablished` | `TcpClosing` | `TcpEstablished` | `TcpEstablished` | `TcpEstablished` |
    /// | `TcpClosing` | `TcpClosing` | `TcpSyn` | `TcpClosing` | `TcpClosing` |
    ///
    /// FIN and RST win over the other bits. A SYN on a closing entry is the client reusing the
    /// port for a new connection (see [`FlowState::reopened_by`]). A SYN on an established entry does not demote it (it is a
    /// retransmission or a probe, and demoting would make the entry evictable by a SYN
    /// flood). A new entry first seen with ACK is a connection picked up mid-stream (the entry
    /// had expired, or the gateway restarted), which is established.
    #[inline]
    #[must_use]
    pub fn on_tcp_flags(self, flags: u8) -> FlowState {
        use tcp_flags::{ACK, FIN, RST, SYN};
        if flags & (FIN | RST) != 0 {
            return FlowState::TcpClosing;
        }
        let ack = flags & ACK != 0;
        let fresh_syn = flags & (SYN | ACK) == SYN;
        match self {
            FlowState::TcpEstablished => FlowState::TcpEstablished,
            FlowState::TcpClosing if fresh_syn => FlowState::TcpSyn,
            FlowState::TcpClosing => FlowState::TcpClosing,
            FlowState::TcpSyn | FlowState::Udp | FlowState::Other if ack => {
                FlowState::TcpEstablished
            }
            FlowState::TcpSyn | FlowState::Udp | FlowState::Other => FlowState::TcpSyn,
        }
    }

    /// The state after a TCP segment with `flags` from the backend (nat mode, where replies
    /// pass the gateway and share the flow's entry): a FIN or RST closes the flow, anything
    /// else leaves it as it is. The backend's SYN-ACK does not establish it: only the client's
    /// acknowledgment tells a completed handshake from a half-open one (a spoofed SYN's
    /// SYN-ACK goes to whoever the source names, and the entry must stay evictable).
    #[inline]
    #[must_use]
    pub fn on_reply_flags(self, flags: u8) -> FlowState {
        use tcp_flags::{FIN, RST};
        if flags & (FIN | RST) != 0 {
            FlowState::TcpClosing
        } else {
            self
        }
    }

    /// Whether a TCP segment with `flags` from the client opens a new connection on this
    /// entry's 5-tuple: a SYN without ACK on a closing entry, the client reusing its port while
    /// the old connection's entry lingers for [`Timeouts::tcp_closing`]. The pipeline gives
    /// such a connection a backend afresh, as any new flow, rather than the old connection's
    /// (which may be draining and take no new flows).
    #[inline]
    #[must_use]
    pub fn reopened_by(self, flags: u8) -> bool {
        use tcp_flags::{ACK, FIN, RST, SYN};
        self == FlowState::TcpClosing && flags & (SYN | ACK | FIN | RST) == SYN
    }
}

/// What the table stores for a key: 26 bytes, so that key and value fill one cache line.
///
/// The value names its backend by [`BackendId`] and [`FlowValue::incarnation`] rather than by
/// address: ids are reused after a backend leaves, and the incarnation (the table's
/// [`Backend::incarnation`](crate::table::Backend::incarnation)) tells a reused id from the
/// backend the flow was sent to, so a stale entry is recognised and never followed. A nat
/// flow's one entry serves both directions: its replies find it by the forward 5-tuple
/// (their own with the backend's address and port put back to the frontend's), and it holds
/// the MAC they go back to ([`FlowValue::peer_mac`]).
///
/// Packed to an alignment of 2 so that it starts right after the 38-byte key and the two
/// fill 64 bytes exactly; fields are read by value, never by reference.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(C, packed(2))]
pub struct FlowValue {
    /// The backend chosen for the flow; checked against the current snapshot on every packet.
    pub backend: BackendId,
    /// The backend's incarnation when the entry was made; an entry is followed only while the
    /// snapshot's backend of that id has the same incarnation.
    pub incarnation: u32,
    /// Six bytes whose meaning is the entry's kind's: in a session-affinity entry (state
    /// [`FlowState::Other`], no other entry has it) the idle timeout in seconds that replaces
    /// the state's, a `u32` little-endian ([`FlowValue::timeout_override`]); in a nat flow's
    /// entry the MAC the client's packets came from, the next hop of its replies
    /// ([`FlowValue::peer_mac`]); zero in a DSR flow's. One field for both because the entry
    /// fills its cache line.
    extra: [u8; 6],
    /// When the entry was made, in milliseconds of the caller's clock: the low 47 bits of
    /// these 48, little-endian ([`FlowValue::made_ms`]); the top bit says a nat flow's backend
    /// has answered ([`FlowValue::answered`]).
    made: [u8; 6],
    /// When the flow last saw a packet: milliseconds of the caller's monotonic clock, the low
    /// 39 bits of these 40 (little-endian; the clock must stay below 2^39 ms, 17 years, as a
    /// clock since boot does), see [`FlowValue::last_seen_ms`]; the top bit says the entry
    /// was learnt from a peer gateway ([`FlowValue::learnt`]). The flag bits live in the
    /// times because the entry fills its cache line: a byte of their own would push it over
    /// 64.
    last_seen: [u8; 5],
    /// Connection state, which picks the idle timeout.
    pub state: FlowState,
}

impl FlowValue {
    /// A value for `backend` of incarnation `incarnation` in `state`, made and last seen at
    /// `now` (nanoseconds), with no timeout override and no peer MAC.
    #[inline]
    pub fn new(backend: BackendId, incarnation: u32, state: FlowState, now: u64) -> Self {
        let mut v = Self {
            backend,
            incarnation,
            extra: [0; 6],
            made: [0; 6],
            last_seen: [0; 5],
            state,
        };
        v.touch(now);
        // The clock is below 2^39 ms (see `last_seen`), so the answered bit starts clear.
        v.made
            .copy_from_slice(&(now / NANOS_PER_MS).to_le_bytes()[..6]);
        v
    }

    /// A nat flow's next hop back to the client: the MAC its client's packets came from
    /// (meaningless in other entries).
    #[inline]
    pub fn peer_mac(&self) -> Mac {
        Mac(self.extra)
    }

    /// The next hop of the replies if this is a nat flow's entry: not a session-affinity
    /// entry (state [`FlowState::Other`], whose key a flow from source port 0 shares), and
    /// made with a peer MAC (an entry made while its service was in a DSR mode has none, and
    /// its replies are no flow's, as before the mode changed).
    #[inline]
    pub fn reply_mac(&self) -> Option<Mac> {
        (self.state != FlowState::Other && self.extra != [0; 6]).then_some(Mac(self.extra))
    }

    /// Makes this a nat flow's entry whose replies go to `mac`.
    #[inline]
    pub fn set_peer_mac(&mut self, mac: Mac) {
        self.extra = mac.0;
    }

    /// The idle timeout in seconds that replaces the state's, 0 for none: a session-affinity
    /// entry's (state [`FlowState::Other`]); every other entry has none.
    #[inline(always)]
    pub fn timeout_override(&self) -> u32 {
        if self.state == FlowState::Other {
            u32::from_le_bytes([self.extra[0], self.extra[1], self.extra[2], self.extra[3]])
        } else {
            0
        }
    }

    /// Sets the idle timeout of a session-affinity entry, in seconds (0: the state's). Kept
    /// only while the state is [`FlowState::Other`], an affinity entry's; the same bytes hold
    /// a nat flow's peer MAC.
    #[inline]
    pub fn set_timeout_override(&mut self, secs: u32) {
        debug_assert_eq!(
            self.state,
            FlowState::Other,
            "a timeout override is an affinity entry's"
        );
        self.extra = [0; 6];
        self.extra[..4].copy_from_slice(&secs.to_le_bytes());
    }

    /// When the entry was made (learnt, for an entry from a peer gateway), in whole
    /// milliseconds of the caller's clock.
    #[inline]
    pub fn made_ms(&self) -> u64 {
        let mut b = [0u8; 8];
        b[..6].copy_from_slice(&self.made);
        b[5] &= !ANSWERED;
        u64::from_le_bytes(b)
    }

    /// Whether a nat flow's backend has sent anything on it: false until its first reply.
    /// Tells a backend that refuses a connection (its first answer a RST) and one that never
    /// answers (the client's SYN comes again) from the network losing a packet.
    #[inline]
    pub fn answered(&self) -> bool {
        self.made[5] & ANSWERED != 0
    }

    /// Records that a nat flow's backend has answered ([`FlowValue::answered`]).
    #[inline]
    pub fn set_answered(&mut self) {
        self.made[5] |= ANSWERED;
    }

    /// Records a packet at `now` (nanoseconds), which restarts the idle timeout.
    #[inline]
    pub fn touch(&mut self, now: u64) {
        let ms = (now / NANOS_PER_MS).to_le_bytes();
        let learnt = self.last_seen[4] & LEARNT;
        self.last_seen.copy_from_slice(&ms[..5]);
        self.last_seen[4] = (self.last_seen[4] & !LEARNT) | learnt;
    }

    /// Whether the entry was learnt from a peer gateway by flow sync ([`crate::sync`])
    /// rather than made here by a packet. Kept for the entry's life; the admin API's
    /// `explain` shows it.
    #[inline]
    pub fn learnt(&self) -> bool {
        self.last_seen[4] & LEARNT != 0
    }

    /// The value marked as learnt from a peer gateway ([`FlowValue::learnt`]).
    #[inline]
    #[must_use]
    pub fn learnt_from_peer(mut self) -> Self {
        self.last_seen[4] |= LEARNT;
        self
    }

    /// When the flow last saw a packet, in whole milliseconds of the caller's clock (`now /
    /// 1_000_000` of the latest [`FlowValue::touch`]). Idle time is measured in these units.
    #[inline]
    pub fn last_seen_ms(&self) -> u64 {
        let mut b = [0u8; 8];
        b[..5].copy_from_slice(&self.last_seen);
        b[4] &= !LEARNT;
        u64::from_le_bytes(b)
    }
}

/// Idle timeouts per [`FlowState`], in nanoseconds.
///
/// The control plane fills these from `[gateway.timeouts]` (`strait_config`'s `Timeouts`,
/// whose defaults these match; `other` has no setting there). The defaults, against Linux
/// conntrack's (`nf_conntrack_*` sysctls,
/// <https://docs.kernel.org/networking/nf_conntrack-sysctl.html>) for comparison:
///
/// | state | here | conntrack default |
/// |---|---|---|
/// | `tcp_syn` | 30 s | `tcp_timeout_syn_sent` 120 s |
/// | `tcp_established` | 7440 s | `tcp_timeout_established` 432000 s (kube-proxy: 86400 s) |
/// | `tcp_closing` | 10 s | `tcp_timeout_close` 10 s (`tcp_timeout_time_wait` 120 s) |
/// | `udp` | 30 s | `udp_timeout` 30 s |
/// | `other` | 30 s | `generic_timeout` 600 s |
///
/// Ours are shorter because a gateway's table is fixed-size and holds a whole cluster's
/// flows, where a node's conntrack holds that node's. Forgetting an idle flow is cheap: its
/// next packet misses, Maglev hashes the same 5-tuple to the same backend as long as the
/// backend set has not changed, and the entry is re-created. Only a flow that idles past its
/// timeout *and* sees the backend set change in that time is moved. Established flows get
/// 7440 s (2 h 4 min), the least a NAT may use (RFC 5382, REQ-5), which outlasts Linux's
/// default keepalive interval (`tcp_keepalive_time`, 7200 s), so keepalive-only connections
/// keep their entries, and so their replies' translation, in `nat` mode. A half-open connection that has not
/// completed its handshake in 30 s (five SYN retransmissions of a Linux client, 1+2+4+8+16 s)
/// will not; a closing one needs only long enough to carry its last FIN/ACK exchange.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Timeouts {
    /// `TcpSyn`: half-open connections.
    pub tcp_syn: u64,
    /// `TcpEstablished`.
    pub tcp_established: u64,
    /// `TcpClosing`: after FIN or RST.
    pub tcp_closing: u64,
    /// `Udp`.
    pub udp: u64,
    /// `Other`.
    pub other: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            tcp_syn: 30 * NANOS_PER_SEC,
            tcp_established: 7440 * NANOS_PER_SEC,
            tcp_closing: 10 * NANOS_PER_SEC,
            udp: 30 * NANOS_PER_SEC,
            other: 30 * NANOS_PER_SEC,
        }
    }
}

impl Timeouts {
    /// The idle timeout of `state`, in nanoseconds.
    #[inline]
    pub fn of(&self, state: FlowState) -> u64 {
        match state {
            FlowState::TcpSyn => self.tcp_syn,
            FlowState::TcpEstablished => self.tcp_established,
            FlowState::TcpClosing => self.tcp_closing,
            FlowState::Udp => self.udp,
            FlowState::Other => self.other,
        }
    }
}

/// Why [`FlowTable::insert`] did not store a new flow. Either way the pipeline forwards the
/// packet statelessly and counts it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum InsertError {
    /// The key's group has no empty way and its bucket holds 8 live entries, none of them
    /// half-open.
    Full,
    /// The per-core new-flow rate limit is exhausted.
    RateLimited,
}

impl fmt::Display for InsertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InsertError::Full => "flow table bucket full of live entries",
            InsertError::RateLimited => "new-flow rate limit exceeded",
        })
    }
}

impl core::error::Error for InsertError {}

/// Counters of a [`FlowTable`], since it was created.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct FlowStats {
    /// New entries stored (overwrites of a live entry are not counted).
    pub inserts: u64,
    /// Entries reclaimed because their idle timeout had passed (by lookup, insert or sweep).
    pub expired: u64,
    /// Live half-open entries evicted to make room for a new flow.
    pub evicted: u64,
    /// Entries removed by [`FlowTable::remove`].
    pub removed: u64,
    /// Inserts refused with [`InsertError::Full`].
    pub full: u64,
    /// Inserts refused with [`InsertError::RateLimited`].
    pub rate_limited: u64,
    /// Entries held now, live or expired but not yet reclaimed ([`FlowTable::len`]). Always
    /// `inserts - expired - evicted - removed`.
    pub occupancy: u64,
}

/// One bucket's tags, aligned so that a bucket's tags never straddle two cache lines.
#[derive(Clone, Copy)]
#[repr(align(16))]
struct Tags([Tag; WAYS]);

/// Buckets whose tags share one cache line: a group. A key's entry may be in any bucket of its
/// home bucket's group (see the module docs, "Overflow into the group").
pub const GROUP: usize = 4;

/// The tags of one group of [`GROUP`] buckets: exactly one cache line, line-aligned (a
/// `Box<[Tags]>` alone is only 16-aligned, and a large allocation starts 16 bytes into its
/// first page, so four buckets' tags would straddle two lines).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct TagLine([Tags; GROUP]);

/// A way's hash tag; 0 marks an empty way.
type Tag = u16;

/// One way: key (38 bytes) and value (26 bytes, 2-aligned), one cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Entry {
    key: FlowKey,
    value: FlowValue,
}

impl Entry {
    /// Filler for empty ways; never read while its tag is 0.
    const EMPTY: Entry = Entry {
        key: FlowKey {
            src: Addr([0; 16]),
            dst: Addr([0; 16]),
            src_port: 0,
            dst_port: 0,
            proto: Proto(0),
        },
        value: FlowValue {
            backend: BackendId(0),
            incarnation: 0,
            extra: [0; 6],
            made: [0; 6],
            last_seen: [0; 5],
            state: FlowState::Other,
        },
    };
}

/// A token bucket on integer nanoseconds.
///
/// Credit is kept in token-nanoseconds: every elapsed nanosecond adds `rate` units, and one
/// token costs `NANOS_PER_SEC` units, so refill is exact with no division and no floating
/// point. The bucket holds one second's worth (`rate` tokens): a core idle for a second may
/// then take a burst of one second's flows at once, no more.
#[derive(Clone, Copy, Debug)]
struct RateLimiter {
    /// Tokens per second; 0 means unlimited.
    rate: u64,
    /// Token-nanoseconds available, at most `rate * NANOS_PER_SEC` (below 2^63 as `rate`
    /// is a `u32`).
    credit: u64,
    /// The latest `now` seen.
    last: u64,
}

impl RateLimiter {
    fn new(per_sec: u32) -> Self {
        let rate = u64::from(per_sec);
        Self {
            rate,
            credit: rate * NANOS_PER_SEC,
            last: 0,
        }
    }

    #[inline]
    fn admit(&mut self, now: u64) -> bool {
        if self.rate == 0 {
            return true;
        }
        // More than a second refills the bucket anyway; clamping first keeps the product
        // below 2^63. A clock that steps back refills nothing.
        let elapsed = now.saturating_sub(self.last).min(NANOS_PER_SEC);
        self.last = self.last.max(now);
        self.credit = (self.credit + elapsed * self.rate).min(self.rate * NANOS_PER_SEC);
        if self.credit >= NANOS_PER_SEC {
            self.credit -= NANOS_PER_SEC;
            true
        } else {
            false
        }
    }
}

/// A fixed-capacity, set-associative flow table owned by one worker core.
///
/// See the [module documentation](self) for the design. All memory is allocated in
/// [`FlowTable::new`]; no method allocates afterwards, and every method except
/// [`FlowTable::iter`] does bounded work.
pub struct FlowTable {
    /// Bucket `b`'s tags are `tags[b / GROUP].0[b % GROUP]`.
    tags: Box<[TagLine]>,
    entries: Box<[[Entry; WAYS]]>,
    /// Number of buckets minus one; the bucket of a hash is `hash & mask`.
    mask: usize,
    len: usize,
    timeouts: Timeouts,
    /// `timeouts` in milliseconds (rounded up), indexed by `FlowState as usize`.
    timeout_ms: [u64; 5],
    limiter: RateLimiter,
    /// Next bucket [`FlowTable::sweep`] visits.
    cursor: usize,
    /// When [`FlowTable::sweep_paced`] takes its next step, in nanoseconds.
    sweep_at: u64,
    /// Nanoseconds between two steps of [`FlowTable::sweep_paced`].
    sweep_every: u64,
    stats: FlowStats,
    /// Entries per backend id ([`FlowTable::entries_by_backend`]).
    by_backend: Box<[BackendEntries]>,
}

impl fmt::Debug for FlowTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlowTable")
            .field("capacity", &self.capacity())
            .field("len", &self.len)
            .field("timeouts", &self.timeouts)
            .field("new_flows_per_sec", &self.limiter.rate)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl FlowTable {
    /// Creates a table for at least `capacity` flows, rounded up to a power-of-two number of
    /// buckets of [`WAYS`] ways, with the given idle timeouts and a cap of
    /// `new_flows_per_sec` new entries per second (0 for no cap).
    ///
    /// Allocates and writes the whole table (66 bytes per way) now, so that nothing later
    /// allocates or page-faults.
    ///
    /// # Panics
    ///
    /// If `capacity` is 0 or larger than [`MAX_CAPACITY`].
    pub fn new(capacity: usize, timeouts: Timeouts, new_flows_per_sec: u32) -> FlowTable {
        let buckets = Self::buckets_for(capacity);
        assert!(capacity > 0, "flow table capacity must be at least 1");
        assert!(
            capacity <= MAX_CAPACITY,
            "flow table capacity {capacity} exceeds the maximum {MAX_CAPACITY}"
        );
        FlowTable {
            tags: crate::hint::huge_filled(
                buckets.div_ceil(GROUP),
                TagLine([Tags([0; WAYS]); GROUP]),
            ),
            entries: crate::hint::huge_filled(buckets, [Entry::EMPTY; WAYS]),
            mask: buckets - 1,
            len: 0,
            timeouts,
            timeout_ms: Self::timeouts_ms(&timeouts),
            limiter: RateLimiter::new(new_flows_per_sec),
            cursor: 0,
            sweep_at: 0,
            sweep_every: SWEEP_PASS_NS / buckets.div_ceil(SWEEP_STEP) as u64,
            stats: FlowStats::default(),
            by_backend: vec![BackendEntries::default(); BACKEND_SLOTS].into_boxed_slice(),
        }
    }

    /// Takes new idle timeouts (a reload changed `[gateway.timeouts]`): every entry's idle
    /// time is measured against them from now on, so an entry idle longer than its state's
    /// new timeout is expired at its next lookup.
    pub fn set_timeouts(&mut self, timeouts: Timeouts) {
        self.timeouts = timeouts;
        self.timeout_ms = Self::timeouts_ms(&timeouts);
    }

    /// `timeouts` in whole milliseconds, rounded up, indexed by `FlowState as usize`.
    fn timeouts_ms(timeouts: &Timeouts) -> [u64; 5] {
        [
            FlowState::TcpSyn,
            FlowState::TcpEstablished,
            FlowState::TcpClosing,
            FlowState::Udp,
            FlowState::Other,
        ]
        .map(|st| timeouts.of(st).div_ceil(NANOS_PER_MS))
    }

    /// Buckets of a table for `capacity` flows: a power of two, [`WAYS`] entries each.
    fn buckets_for(capacity: usize) -> usize {
        capacity.div_ceil(WAYS).next_power_of_two()
    }

    /// Bytes [`FlowTable::new`] allocates for `capacity` flows (entries and tag lines; the
    /// entries per backend, [`BACKEND_SLOTS`] `u32`s, come on top), so
    /// an operator knows a configuration's cost before anything is allocated. Saturates
    /// instead of overflowing for absurd capacities.
    pub fn bytes_for(capacity: usize) -> u64 {
        let buckets = capacity
            .max(1)
            .div_ceil(WAYS)
            .checked_next_power_of_two()
            .map_or(u64::MAX, |b| b as u64);
        let entries = buckets.saturating_mul((WAYS * core::mem::size_of::<Entry>()) as u64);
        let tags = buckets
            .div_ceil(GROUP as u64)
            .saturating_mul(core::mem::size_of::<TagLine>() as u64);
        entries.saturating_add(tags)
    }

    /// The live entry for `key` at `now`, to read or update in place (typically
    /// [`FlowValue::touch`] and a new [`FlowValue::state`]).
    ///
    /// An expired entry found here is reclaimed (counted in [`FlowStats::expired`]) and `None`
    /// returned.
    #[inline]
    pub fn lookup(&mut self, key: &FlowKey, now: u64) -> Option<&mut FlowValue> {
        self.lookup_hashed(key, key.hash(SEED_FLOW), now)
    }

    /// [`FlowTable::lookup`] with `hash = key.hash(SEED_FLOW)` already computed, so the
    /// pipeline hashes a packet's key once for lookup and insert.
    #[inline(always)]
    pub fn lookup_hashed(&mut self, key: &FlowKey, hash: u64, now: u64) -> Option<&mut FlowValue> {
        debug_assert_eq!(
            hash,
            key.hash(SEED_FLOW),
            "hash must be key.hash(SEED_FLOW)"
        );
        let (b, tag) = self.split(hash);
        let (b, w) = self.find(b, tag, key)?;
        if self.is_live(&self.entries[b][w].value, now) {
            Some(&mut self.entries[b][w].value)
        } else {
            self.free(b, w);
            self.stats.expired += 1;
            None
        }
    }

    /// Stores `value` for `key` and returns it for further updates.
    ///
    /// A live entry for `key` is overwritten, without a rate-limit check. Otherwise this is a
    /// new flow: it takes a token from the rate limiter, then an empty way of its bucket, or
    /// of another bucket of its group, or an expired way of its bucket, or evicts its
    /// bucket's half-open (`TcpSyn`) entry idle the longest. At most [`WAYS`] entries are
    /// examined.
    ///
    /// # Errors
    ///
    /// [`InsertError::RateLimited`] if the new-flow rate limit is exhausted;
    /// [`InsertError::Full`] if every way of the group is taken and every way of the bucket
    /// holds a live entry that is not half-open. Nothing is stored then.
    #[inline]
    pub fn insert(
        &mut self,
        key: FlowKey,
        value: FlowValue,
        now: u64,
    ) -> Result<&mut FlowValue, InsertError> {
        let hash = key.hash(SEED_FLOW);
        self.insert_hashed(key, hash, value, now)
    }

    /// [`FlowTable::insert`] with `hash = key.hash(SEED_FLOW)` already computed.
    ///
    /// # Errors
    ///
    /// As [`FlowTable::insert`].
    #[inline]
    pub fn insert_hashed(
        &mut self,
        key: FlowKey,
        hash: u64,
        value: FlowValue,
        now: u64,
    ) -> Result<&mut FlowValue, InsertError> {
        self.insert_inner(key, hash, value, now, true)
    }

    /// [`FlowTable::insert`] without the rate limit: for entries learnt from peer gateways
    /// (`crate::sync`), which come only from configured peers and arrive in bursts (a dump).
    ///
    /// # Errors
    ///
    /// [`InsertError::Full`] as [`FlowTable::insert`].
    #[inline]
    pub fn insert_unlimited(
        &mut self,
        key: FlowKey,
        value: FlowValue,
        now: u64,
    ) -> Result<&mut FlowValue, InsertError> {
        let hash = key.hash(SEED_FLOW);
        self.insert_inner(key, hash, value, now, false)
    }

    #[inline(always)]
    fn insert_inner(
        &mut self,
        key: FlowKey,
        hash: u64,
        value: FlowValue,
        now: u64,
        limited: bool,
    ) -> Result<&mut FlowValue, InsertError> {
        debug_assert_eq!(
            hash,
            key.hash(SEED_FLOW),
            "hash must be key.hash(SEED_FLOW)"
        );
        let (home, tag) = self.split(hash);
        if let Some((b, w)) = self.find(home, tag, &key) {
            if self.is_live(&self.entries[b][w].value, now) {
                let old = self.entries[b][w].value;
                self.uncount(&old);
                self.count(&value);
                let slot = &mut self.entries[b][w].value;
                *slot = value;
                return Ok(slot);
            }
            // The key's old entry expired: reclaim it, and what follows is a new flow. The
            // way is now empty, so the key cannot end up stored twice.
            self.free(b, w);
            self.stats.expired += 1;
        }
        self.insert_new(home, tag, key, value, now, limited)
    }

    /// [`FlowTable::insert_hashed`] for a key with no entry: the caller looked it up at `now`
    /// and found none (a lookup reclaims an expired entry it meets), and has stored nothing
    /// under it since. Skips the search for an entry to overwrite, which would screen the
    /// key's tags a second time; storing a key that has an entry would leave it twice.
    ///
    /// # Errors
    ///
    /// As [`FlowTable::insert`].
    #[inline]
    pub fn insert_absent_hashed(
        &mut self,
        key: FlowKey,
        hash: u64,
        value: FlowValue,
        now: u64,
    ) -> Result<&mut FlowValue, InsertError> {
        let (home, tag) = self.split(hash);
        debug_assert!(
            self.find(home, tag, &key).is_none(),
            "insert_absent_hashed of a key that has an entry"
        );
        self.insert_new(home, tag, key, value, now, true)
    }

    /// Stores a key that has no entry in its home bucket `home` or its group, taking a token
    /// from the rate limiter first when `limited`.
    #[inline(always)]
    fn insert_new(
        &mut self,
        home: usize,
        tag: Tag,
        key: FlowKey,
        value: FlowValue,
        now: u64,
        limited: bool,
    ) -> Result<&mut FlowValue, InsertError> {
        if limited && !self.limiter.admit(now) {
            self.stats.rate_limited += 1;
            return Err(InsertError::RateLimited);
        }
        let (b, w) = match self.empty_way(home) {
            Some(bw) => bw,
            None => (home, self.make_room(home, now)?),
        };
        self.tags_mut(b)[w] = tag;
        self.len += 1;
        self.stats.inserts += 1;
        self.count(&value);
        let entry = &mut self.entries[b][w];
        *entry = Entry { key, value };
        Ok(&mut entry.value)
    }

    /// Frees a way in bucket `b`, whose group is full: reclaims every expired way of `b` (they
    /// are all in hand) and returns the first, or else evicts `b`'s oldest half-open entry.
    /// Only the home bucket's 8 entries are read, so the work stays bounded at 8 lines.
    #[inline]
    fn make_room(&mut self, b: usize, now: u64) -> Result<usize, InsertError> {
        let mut reclaimed = None;
        let mut oldest_syn: Option<(usize, u64)> = None;
        for w in 0..WAYS {
            let v = self.entries[b][w].value;
            if !self.is_live(&v, now) {
                self.free(b, w);
                self.stats.expired += 1;
                reclaimed.get_or_insert(w);
            } else if v.state == FlowState::TcpSyn
                && oldest_syn.is_none_or(|(_, seen)| v.last_seen_ms() < seen)
            {
                oldest_syn = Some((w, v.last_seen_ms()));
            }
        }
        if let Some(w) = reclaimed {
            return Ok(w);
        }
        match oldest_syn {
            Some((w, _)) => {
                self.free(b, w);
                self.stats.evicted += 1;
                Ok(w)
            }
            None => {
                self.stats.full += 1;
                Err(InsertError::Full)
            }
        }
    }

    /// Removes `key`'s entry and returns it, live or expired (check with
    /// [`FlowTable::is_live`] if it matters); `None` if there is none.
    #[inline]
    pub fn remove(&mut self, key: &FlowKey) -> Option<FlowValue> {
        let (b, tag) = self.split(key.hash(SEED_FLOW));
        let (b, w) = self.find(b, tag, key)?;
        self.free(b, w);
        self.stats.removed += 1;
        Some(self.entries[b][w].value)
    }

    /// Reclaims the expired entries of up to `max_buckets` buckets (each of [`WAYS`] ways),
    /// continuing from where the previous call stopped and wrapping around; returns how many
    /// it removed. The IO layer calls this when a poll finds no packets, so that expired
    /// entries do not linger in a quiet table; a few hundred buckets cost a few microseconds.
    pub fn sweep(&mut self, now: u64, max_buckets: usize) -> usize {
        let mut removed = 0;
        for _ in 0..max_buckets.min(self.mask + 1) {
            let b = self.cursor;
            self.cursor = (b + 1) & self.mask;
            for w in 0..WAYS {
                if self.tags(b)[w] != 0 && !self.is_live(&self.entries[b][w].value, now) {
                    self.free(b, w);
                    removed += 1;
                }
            }
        }
        self.stats.expired += removed as u64;
        removed
    }

    /// Sweeps [`SWEEP_STEP`] buckets ([`FlowTable::sweep`]) when the pace allows: one step
    /// every [`SWEEP_PASS_NS`] / (buckets / [`SWEEP_STEP`]), so a pass over the table takes
    /// [`SWEEP_PASS_NS`]. For a core that is never idle, called with every batch: two
    /// comparisons while no step is due. Steps keep their pace when a batch comes a little
    /// after one was due; a clock that jumps ahead takes one step, not the steps it missed,
    /// and one that goes back takes a step and paces from there. Returns how many entries it
    /// reclaimed.
    #[inline(always)]
    pub fn sweep_paced(&mut self, now: u64) -> usize {
        if now < self.sweep_at && self.sweep_at - now <= self.sweep_every {
            return 0;
        }
        self.sweep_step(now)
    }

    #[cold]
    #[inline(never)]
    fn sweep_step(&mut self, now: u64) -> usize {
        self.sweep_at = match now.checked_sub(self.sweep_at) {
            Some(late) if late < self.sweep_every => self.sweep_at + self.sweep_every,
            _ => now.saturating_add(self.sweep_every),
        };
        self.sweep(now, SWEEP_STEP)
    }

    /// `key`'s entry, live or expired (check with [`FlowTable::is_live`]), without reclaiming
    /// anything: a read-only lookup for walks over the table.
    #[inline]
    pub fn peek(&self, key: &FlowKey) -> Option<&FlowValue> {
        let (b, tag) = self.split(key.hash(SEED_FLOW));
        let (b, w) = self.find(b, tag, key)?;
        Some(&self.entries[b][w].value)
    }

    /// Buckets in the table ([`FlowTable::capacity`] / [`WAYS`]).
    #[inline]
    pub fn buckets(&self) -> usize {
        self.mask + 1
    }

    /// Calls `f` on every entry stored in bucket `b` (home or overflow), live or expired but
    /// not yet reclaimed. Bounded work ([`WAYS`] entries): a dump walks the table a few
    /// buckets per turn with it. Nothing for `b >= buckets()`.
    #[inline]
    pub fn for_each_in_bucket(&self, b: usize, mut f: impl FnMut(&FlowKey, &FlowValue)) {
        if b > self.mask {
            return;
        }
        for w in 0..WAYS {
            if self.tags(b)[w] != 0 {
                let e = &self.entries[b][w];
                f(&e.key, &e.value);
            }
        }
    }

    /// Entries held per backend id and incarnation, live or expired but not yet reclaimed
    /// (index = id; ids at or above [`BACKEND_SLOTS`] are not counted). See "Entries per
    /// backend" above.
    #[inline]
    pub fn entries_by_backend(&self) -> &[BackendEntries] {
        &self.by_backend
    }

    /// Entries held, live or expired but not yet reclaimed.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the table holds no entries.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Total ways: the most entries the table can hold.
    #[inline]
    pub fn capacity(&self) -> usize {
        (self.mask + 1) * WAYS
    }

    /// The table's counters.
    #[inline]
    pub fn stats(&self) -> FlowStats {
        FlowStats {
            occupancy: self.len as u64,
            ..self.stats
        }
    }

    /// The idle timeout of `v` in nanoseconds: its override if set, else its state's, rounded
    /// up to whole milliseconds.
    #[inline]
    pub fn timeout_of(&self, v: &FlowValue) -> u64 {
        self.timeout_ms(v) * NANOS_PER_MS
    }

    #[inline(always)]
    fn timeout_ms(&self, v: &FlowValue) -> u64 {
        match v.timeout_override() {
            0 => self.timeout_ms[v.state as usize],
            secs => u64::from(secs) * MS_PER_SEC,
        }
    }

    /// Whether `v` is live at `now` (nanoseconds): idle for less than its timeout, idle time
    /// counted in whole milliseconds (`now / 1_000_000 - v.last_seen_ms()`). An entry touched
    /// at a whole millisecond `t` expires exactly at `t + timeout`; a `now` before the last
    /// touch counts as no idle time.
    #[inline]
    pub fn is_live(&self, v: &FlowValue, now: u64) -> bool {
        (now / NANOS_PER_MS).saturating_sub(v.last_seen_ms()) < self.timeout_ms(v)
    }

    /// Every entry held, live or expired but not yet reclaimed (filter with
    /// [`FlowTable::is_live`]), in bucket order. Walks the whole table: for the admin API and
    /// tests, not the packet path.
    pub fn iter(&self) -> impl Iterator<Item = (&FlowKey, &FlowValue)> + '_ {
        self.tags
            .iter()
            .flat_map(|line| line.0.iter())
            .zip(self.entries.iter())
            .flat_map(|(tags, entries)| {
                tags.0
                    .iter()
                    .zip(entries.iter())
                    .filter(|(&t, _)| t != 0)
                    .map(|(_, e)| (&e.key, &e.value))
            })
    }

    /// Starts loading the tag line of `hash`'s bucket into the cache, so that a lookup a
    /// little later does not wait for memory. Drivers call this for a whole RX batch first,
    /// so the batch's misses overlap instead of following one another.
    #[inline(always)]
    pub fn prefetch_bucket(&self, hash: u64) {
        let (b, _) = self.split(hash);
        crate::hint::prefetch(&self.tags[b / GROUP]);
    }

    /// Starts loading the entry whose tag matches `hash` (the bucket's tags should already be
    /// cached, see [`FlowTable::prefetch_bucket`]): one cache line. When no tag matches (a new
    /// flow, most likely), starts loading the way an insert would take instead, the first
    /// empty one, so that writing the new entry does not wait for memory; and returns false.
    #[inline(always)]
    pub fn prefetch_entry(&self, hash: u64) -> bool {
        let (home, tag) = self.split(hash);
        let hits = tag_mask(self.tags(home), tag);
        let ((b, w), hit) = if hits != 0 {
            ((home, hits.trailing_zeros() as usize), true)
        } else {
            match self.tag_elsewhere(home, tag) {
                Some(bw) => (bw, true),
                None => (self.empty_way(home).unwrap_or((home, 0)), false),
            }
        };
        crate::hint::prefetch(&self.entries[b][w]);
        hit
    }

    /// The first way with tag `tag` in the buckets of `b`'s group other than `b`.
    #[inline(always)]
    fn tag_elsewhere(&self, b: usize, tag: Tag) -> Option<(usize, usize)> {
        let (_, line) = self.group(b);
        if !line_has(line, tag) {
            return None;
        }
        self.tag_elsewhere_slow(b, tag)
    }

    #[cold]
    #[inline(never)]
    fn tag_elsewhere_slow(&self, b: usize, tag: Tag) -> Option<(usize, usize)> {
        let (g, line) = self.group(b);
        (g..g + line.len()).filter(|&o| o != b).find_map(|o| {
            let m = tag_mask(self.tags(o), tag);
            (m != 0).then(|| (o, m.trailing_zeros() as usize))
        })
    }

    /// Bucket `b`'s tags.
    #[inline(always)]
    fn tags(&self, b: usize) -> &[Tag; WAYS] {
        &self.tags[b / GROUP].0[b % GROUP].0
    }

    #[inline(always)]
    fn tags_mut(&mut self, b: usize) -> &mut [Tag; WAYS] {
        &mut self.tags[b / GROUP].0[b % GROUP].0
    }

    /// The group of bucket `b`: its first bucket and the tags of its buckets (all [`GROUP`]
    /// of them, or in a table of fewer buckets, all of the table's).
    #[inline(always)]
    fn group(&self, b: usize) -> (usize, &[Tags]) {
        let n = GROUP.min(self.mask + 1);
        (b & !(GROUP - 1), &self.tags[b / GROUP].0[..n])
    }

    /// An empty way for a new key of home bucket `b`: the first empty way of `b`, else of the
    /// other buckets of its group, in order.
    #[inline(always)]
    fn empty_way(&self, b: usize) -> Option<(usize, usize)> {
        // Branch-free, one compare of the 8 tags with 0: a loop that stops at the first empty
        // way mispredicts whenever the bucket's fill differs from the last one's, which for
        // new flows is most of the time (docs/performance.md, "New flows: branches and
        // chains").
        let empty = tag_mask(self.tags(b), 0);
        if empty != 0 {
            return Some((b, empty.trailing_zeros() as usize));
        }
        self.tag_elsewhere(b, 0)
    }

    /// Bucket index (low bits) and tag (high 16 bits, never 0) of a hash.
    #[inline(always)]
    fn split(&self, hash: u64) -> (usize, Tag) {
        let tag = (hash >> 48) as Tag;
        ((hash as usize) & self.mask, if tag == 0 { 1 } else { tag })
    }

    /// The bucket and way holding `key`, whose home bucket is `b`, if any: a search of the
    /// home bucket's group.
    ///
    /// The home bucket is screened first and on its own, so that the common case, a hit at
    /// home, costs what it did before keys could overflow; the other buckets are screened
    /// only when that finds nothing (a new flow, or one of the few overflowed keys).
    #[inline(always)]
    fn find(&self, b: usize, tag: Tag, key: &FlowKey) -> Option<(usize, usize)> {
        if let Some(w) = self.find_in(b, tag, key) {
            return Some((b, w));
        }
        self.find_elsewhere(b, tag, key)
    }

    /// The way of bucket `b` holding `key`, if any.
    #[inline(always)]
    fn find_in(&self, b: usize, tag: Tag, key: &FlowKey) -> Option<usize> {
        let mut hits = tag_mask(self.tags(b), tag);
        let entries = &self.entries[b];
        while hits != 0 {
            let w = hits.trailing_zeros() as usize;
            if entries[w].key == *key {
                return Some(w);
            }
            hits &= hits - 1;
        }
        None
    }

    /// [`FlowTable::find`] in the buckets of `b`'s group other than `b`.
    #[inline(always)]
    fn find_elsewhere(&self, b: usize, tag: Tag, key: &FlowKey) -> Option<(usize, usize)> {
        let (_, line) = self.group(b);
        if !line_has(line, tag) {
            // The usual outcome for a new flow: one branch-free screen of the whole line.
            return None;
        }
        self.find_elsewhere_slow(b, tag, key)
    }

    #[cold]
    #[inline(never)]
    fn find_elsewhere_slow(&self, b: usize, tag: Tag, key: &FlowKey) -> Option<(usize, usize)> {
        let (g, line) = self.group(b);
        (g..g + line.len())
            .filter(|&o| o != b)
            .find_map(|o| Some((o, self.find_in(o, tag, key)?)))
    }

    /// Marks way `w` of bucket `b` empty. Its entry stays in place (unread) until overwritten.
    #[inline(always)]
    fn free(&mut self, b: usize, w: usize) {
        debug_assert_ne!(self.tags(b)[w], 0);
        self.tags_mut(b)[w] = 0;
        self.len -= 1;
        let v = self.entries[b][w].value;
        self.uncount(&v);
    }

    /// `v` is stored: one more entry for its backend's incarnation (the first of a newer
    /// incarnation starts the slot afresh).
    #[inline(always)]
    fn count(&mut self, v: &FlowValue) {
        if let Some(h) = self.by_backend.get_mut(v.backend.0 as usize) {
            if h.incarnation != v.incarnation {
                *h = BackendEntries {
                    incarnation: v.incarnation,
                    entries: 0,
                };
            }
            h.entries += 1;
        }
    }

    /// `v` is gone: one entry fewer, if its incarnation is the one counted.
    #[inline(always)]
    fn uncount(&mut self, v: &FlowValue) {
        if let Some(h) = self.by_backend.get_mut(v.backend.0 as usize) {
            if h.incarnation == v.incarnation {
                h.entries = h.entries.saturating_sub(1);
            }
        }
    }
}

/// Whether any way of the buckets in `line` has tag `tag`.
///
/// Branch-free: a whole group's 32 tags screened at once, with none of the data-dependent
/// branches (which bucket of the group is home) that made a bucket-by-bucket screen
/// mispredict on every new flow.
#[inline(always)]
fn line_has(line: &[Tags], tag: Tag) -> bool {
    if let Ok([a, b, c, d]) = <&[Tags; GROUP]>::try_from(line) {
        // The usual case, a whole line: one SIMD screen of its 32 tags.
        return crate::hint::any_eq_u16x8x4([&a.0, &b.0, &c.0, &d.0], tag);
    }
    line_has_of(line, tag)
}

#[inline(always)]
fn line_has_of(line: &[Tags], tag: Tag) -> bool {
    // An OR of lane compares, which the compiler vectorises (SIMD compares, ORs and one
    // movemask), with no branch on which bucket matched.
    let mut any = false;
    for t in line {
        for &x in &t.0 {
            any |= x == tag;
        }
    }
    any
}

/// Bit `w` set where way `w` of a bucket has tag `tag`: a branch-free compare of all 8 tags
/// ([`crate::hint::eq_mask_u16x8`]: one SSE2 compare and movemask on x86-64, where the
/// compiler's vectorisation of the plain loop took 14 instructions a call).
#[inline(always)]
fn tag_mask(tags: &[Tag; WAYS], tag: Tag) -> u32 {
    // The mask has a bit per way and no other; saying so lets the compiler see that a set
    // bit's index is a way, with no bounds check where it indexes the bucket.
    crate::hint::eq_mask_u16x8(tags, tag) & ((1 << WAYS) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{proto, v4_mapped};
    use tcp_flags::{ACK, FIN, PSH, RST, SYN};

    const S: u64 = NANOS_PER_SEC;
    const MS: u64 = NANOS_PER_SEC / 1000;

    fn key(i: u32) -> FlowKey {
        let [a, b, c, d] = i.to_be_bytes();
        FlowKey {
            src: v4_mapped([10, b, c, d]),
            dst: v4_mapped([192, 0, 2, 1]),
            src_port: 1024 + u16::from(a),
            dst_port: 443,
            proto: proto::TCP,
        }
    }

    fn key6(i: u32) -> FlowKey {
        let mut src = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        src[12..].copy_from_slice(&i.to_be_bytes());
        let mut dst = [0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        dst[15] = 1;
        FlowKey {
            src: Addr(src),
            dst: Addr(dst),
            src_port: 40000,
            dst_port: 53,
            proto: proto::UDP,
        }
    }

    fn val(backend: u32, state: FlowState, now: u64) -> FlowValue {
        let mut v = FlowValue::new(BackendId(backend), backend * 10, state, now);
        v.set_peer_mac([2, 0, 0, 0, 0, backend as u8].into());
        v
    }

    fn table(capacity: usize) -> FlowTable {
        FlowTable::new(capacity, Timeouts::default(), 0)
    }

    /// `n` distinct keys that all hash to bucket 0 of `t`, found by brute force.
    fn colliding(t: &FlowTable, n: usize) -> Vec<FlowKey> {
        (0..)
            .map(key)
            .filter(|k| t.split(k.hash(SEED_FLOW)).0 == 0)
            .take(n)
            .collect()
    }

    #[test]
    fn tag_mask_sets_the_bit_of_every_way_whose_tag_matches() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..10_000 {
            x = crate::hash::mix64(x.wrapping_add(round));
            // Few distinct tags, so that several ways match at once.
            let tags: [Tag; WAYS] = core::array::from_fn(|w| ((x >> (w * 8)) & 3) as Tag);
            for tag in 0..4 {
                let want = (0..WAYS).fold(0, |m, w| m | u32::from(tags[w] == tag) << w);
                assert_eq!(tag_mask(&tags, tag), want, "{tags:?} {tag}");
            }
        }
        assert_eq!(tag_mask(&[0xffff; WAYS], 0xffff), 0xff);
        assert_eq!(tag_mask(&[0x8000; WAYS], 0x8000), 0xff);
    }

    #[test]
    fn an_absent_key_stored_without_the_search_is_stored_as_by_insert() {
        // Two tables take the same operations, one storing every key its lookup misses with
        // insert_hashed, the other with insert_absent_hashed: a small table, so that buckets
        // fill, overflow into their group, evict half-open entries and refuse (with a rate
        // limit that also refuses), and entries expire and are reclaimed by the lookups.
        let mut a = FlowTable::new(64, Timeouts::default(), 50);
        let mut b = FlowTable::new(64, Timeouts::default(), 50);
        let mut x = 0x1b87_3593_cc9e_2d51u64;
        for i in 0..20_000u64 {
            x = crate::hash::mix64(x.wrapping_add(i));
            let k = key((x % 300) as u32);
            let now = i * 7 * MS;
            let h = k.hash(SEED_FLOW);
            let state = if x & 0x100 == 0 {
                FlowState::TcpSyn
            } else {
                FlowState::TcpEstablished
            };
            let v = val((x >> 20) as u32 % 8, state, now);
            let (ha, hb) = (
                a.lookup_hashed(&k, h, now).is_some(),
                b.lookup_hashed(&k, h, now).is_some(),
            );
            assert_eq!(ha, hb, "step {i}");
            if !ha {
                let ra = a.insert_hashed(k, h, v, now).map(|v| *v);
                let rb = b.insert_absent_hashed(k, h, v, now).map(|v| *v);
                assert_eq!(ra, rb, "step {i}");
            }
            assert_eq!(a.stats(), b.stats(), "step {i}");
        }
        let (ea, eb): (Vec<_>, Vec<_>) = (
            a.iter().map(|(k, v)| (*k, *v)).collect(),
            b.iter().map(|(k, v)| (*k, *v)).collect(),
        );
        assert_eq!(ea, eb);
        assert!(
            a.stats().evicted > 0 && a.stats().full > 0 && a.stats().rate_limited > 0,
            "{:?}",
            a.stats()
        );
    }

    #[test]
    fn line_has_finds_a_tag_in_any_way_of_the_line_and_only_there() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for round in 0..10_000 {
            x = crate::hash::mix64(x.wrapping_add(round));
            let y = crate::hash::mix64(x);
            // Few distinct tags, so that a tag is sometimes in no way of the line.
            let line: [Tags; GROUP] = core::array::from_fn(|b| {
                Tags(core::array::from_fn(|w| {
                    let bits = if b < 2 { x } else { y };
                    ((bits >> ((b % 2) * 32 + w * 4)) & 0xf) as Tag | 0x8000
                }))
            });
            for tag in [0x8000, 0x8003, 0x800f, 0x8010, 0, 0xffff] {
                let want = line.iter().any(|t| t.0.contains(&tag));
                assert_eq!(line_has(&line, tag), want, "tag {tag:#x}");
                assert_eq!(
                    line_has(&line[..2], tag),
                    line[..2].iter().any(|t| t.0.contains(&tag))
                );
            }
        }
        let mut line = [Tags([1; WAYS]); GROUP];
        for b in 0..GROUP {
            for w in 0..WAYS {
                line[b].0[w] = 0xffff;
                assert!(line_has(&line, 0xffff), "bucket {b} way {w}");
                line[b].0[w] = 1;
                assert!(!line_has(&line, 0xffff));
            }
        }
    }

    #[test]
    fn entry_is_one_cache_line_and_a_way_66_bytes() {
        // The module docs quote these numbers for the memory cost.
        assert_eq!(core::mem::size_of::<FlowKey>(), 38);
        assert_eq!(core::mem::size_of::<FlowValue>(), 26);
        assert_eq!(core::mem::align_of::<FlowValue>(), 2);
        assert_eq!(core::mem::size_of::<Entry>(), 64);
        assert_eq!(core::mem::align_of::<Entry>(), 64);
        assert_eq!(core::mem::size_of::<Tags>(), 16);
        assert_eq!(core::mem::align_of::<Tags>(), 16);
    }

    #[test]
    fn keys_sharing_bucket_and_tag_are_told_apart_by_the_key() {
        let mut t = table(64);
        let k1 = key(0);
        let split = t.split(k1.hash(SEED_FLOW));
        let k2 = (1..)
            .map(key)
            .find(|k| t.split(k.hash(SEED_FLOW)) == split)
            .expect("a 16-bit tag collision in the same bucket");
        t.insert(k1, val(1, FlowState::Udp, 0), 0).unwrap();
        assert_eq!(t.lookup(&k2, 0), None, "a tag match alone is not a hit");
        t.insert(k2, val(2, FlowState::Udp, 0), 0).unwrap();
        assert_eq!(t.lookup(&k1, 0).map(|v| v.backend), Some(BackendId(1)));
        assert_eq!(t.lookup(&k2, 0).map(|v| v.backend), Some(BackendId(2)));
        assert_eq!(t.remove(&k1).map(|v| v.backend), Some(BackendId(1)));
        assert_eq!(t.lookup(&k1, 0), None);
        assert_eq!(t.lookup(&k2, 0).map(|v| v.backend), Some(BackendId(2)));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn capacity_rounds_up_to_power_of_two_buckets() {
        assert_eq!(table(1).capacity(), 8);
        assert_eq!(table(8).capacity(), 8);
        assert_eq!(table(9).capacity(), 16);
        assert_eq!(table(1000).capacity(), 1024);
        assert_eq!(table(1024).capacity(), 1024);
        assert_eq!(table(1025).capacity(), 2048);
    }

    #[test]
    #[should_panic(expected = "at least 1")]
    fn zero_capacity_panics() {
        let _ = table(0);
    }

    #[test]
    #[should_panic(expected = "exceeds the maximum")]
    fn absurd_capacity_panics() {
        let _ = table(MAX_CAPACITY + 1);
    }

    #[test]
    fn insert_lookup_remove() {
        let mut t = table(1024);
        assert!(t.is_empty());
        let (k4, k6) = (key(1), key6(1));
        let (v4, v6) = (val(1, FlowState::TcpSyn, 0), val(2, FlowState::Udp, 0));
        assert_eq!(*t.insert(k4, v4, 0).unwrap(), v4);
        assert_eq!(*t.insert(k6, v6, 0).unwrap(), v6);
        assert_eq!(t.len(), 2);
        assert_eq!(t.lookup(&k4, S).copied(), Some(v4));
        assert_eq!(t.lookup(&k6, S).copied(), Some(v6));
        assert_eq!(t.lookup(&key(2), S), None);
        assert_eq!(
            t.lookup_hashed(&k6, k6.hash(SEED_FLOW), S).copied(),
            Some(v6)
        );

        // Updates through the returned reference stick.
        let e = t.lookup(&k4, 2 * S).unwrap();
        e.touch(2 * S);
        e.state = e.state.on_tcp_flags(ACK);
        let got = *t.lookup(&k4, 2 * S).unwrap();
        assert_eq!(
            (got.last_seen_ms(), got.state),
            (2_000, FlowState::TcpEstablished)
        );

        assert_eq!(t.remove(&k4), Some(got));
        assert_eq!(t.remove(&k4), None);
        assert_eq!(t.lookup(&k4, 2 * S), None);
        assert_eq!(t.len(), 1);
        assert_eq!(
            t.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>(),
            vec![(k6, v6)]
        );
    }

    #[test]
    fn overwrite_replaces_value_without_rate_check() {
        let mut t = FlowTable::new(64, Timeouts::default(), 1);
        let k = key(7);
        t.insert(k, val(1, FlowState::TcpSyn, 0), 0).unwrap();
        // The single token is spent; a new key is refused but the existing one is not.
        assert_eq!(
            t.insert(key(8), val(1, FlowState::TcpSyn, 0), 0),
            Err(InsertError::RateLimited)
        );
        let v2 = val(2, FlowState::TcpEstablished, 5);
        assert_eq!(*t.insert(k, v2, 5).unwrap(), v2);
        assert_eq!(t.lookup(&k, 5).copied(), Some(v2));
        assert_eq!(t.len(), 1);
        assert_eq!(t.stats().inserts, 1);
    }

    #[test]
    fn expiry_by_state_and_override() {
        let to = Timeouts::default();
        let cases = [
            (FlowState::TcpSyn, 0, to.tcp_syn),
            (FlowState::TcpEstablished, 0, to.tcp_established),
            (FlowState::TcpClosing, 0, to.tcp_closing),
            (FlowState::Udp, 0, to.udp),
            (FlowState::Other, 0, to.other),
            (FlowState::Other, 10_800, 10_800 * S),
            (FlowState::Other, 86_400, 86_400 * S),
        ];
        for (state, over, timeout) in cases {
            let mut t = table(64);
            let start = 1_000 * S;
            let k = key(3);
            let mut v = val(1, state, start);
            if state == FlowState::Other {
                v.set_timeout_override(over);
            } else {
                // A nat flow's peer MAC shares the override's bytes and is no timeout.
                v.set_peer_mac(Mac([0xff; 6]));
            }
            assert_eq!(v.timeout_override(), over);
            assert_eq!(t.timeout_of(&v), timeout);
            t.insert(k, v, start).unwrap();
            assert!(
                t.lookup(&k, start + timeout - 1).is_some(),
                "{state:?} {over}: live"
            );
            assert_eq!(
                t.lookup(&k, start + timeout),
                None,
                "{state:?} {over}: expired"
            );
            assert_eq!(t.len(), 0, "expired entry reclaimed by lookup");
            assert_eq!(t.stats().expired, 1);
        }
    }

    #[test]
    fn the_learnt_bit_survives_touches_and_leaves_the_clock_alone() {
        let big = ((1u64 << 39) - 1) * 1_000_000;
        let mut v = val(1, FlowState::Udp, big);
        assert!(!v.learnt());
        assert_eq!(v.last_seen_ms(), (1 << 39) - 1, "39 bits of clock");
        v = v.learnt_from_peer();
        assert!(v.learnt());
        assert_eq!(v.last_seen_ms(), (1 << 39) - 1);
        v.touch(5 * S);
        assert!(v.learnt(), "a packet does not change who made the entry");
        assert_eq!(v.last_seen_ms(), 5_000);
        let mut here = val(1, FlowState::Udp, 0);
        here.touch(big);
        assert!(!here.learnt(), "a clock at its limit does not set the bit");
    }

    #[test]
    fn clock_before_last_seen_counts_as_fresh() {
        let t = table(8);
        assert!(t.is_live(&val(1, FlowState::TcpSyn, 100 * S), 0));
    }

    /// Fills the other buckets of bucket 0's group with live established entries (keys far
    /// from those of [`colliding`]), so that a key of bucket 0 has nowhere else to go; returns
    /// how many.
    fn fill_rest_of_group(t: &mut FlowTable) -> usize {
        let mut n = 0;
        for b in 1..GROUP {
            let keys: Vec<FlowKey> = (1 << 24..)
                .map(key)
                .filter(|k| t.split(k.hash(SEED_FLOW)).0 == b)
                .take(WAYS)
                .collect();
            for k in keys {
                t.insert(k, val(7, FlowState::TcpEstablished, 0), 0)
                    .unwrap();
                n += 1;
            }
        }
        n
    }

    #[test]
    fn a_full_bucket_overflows_into_its_group() {
        let mut t = table(64); // 8 buckets: groups 0-3 and 4-7
        let keys = colliding(&t, WAYS + 1);
        for (i, k) in keys.iter().enumerate() {
            t.insert(*k, val(i as u32, FlowState::TcpEstablished, 0), 0)
                .unwrap();
        }
        assert_eq!(t.len(), WAYS + 1);
        // The ninth key of bucket 0 sits in bucket 1, the first empty way of the group.
        let (hb, tag) = t.split(keys[WAYS].hash(SEED_FLOW));
        assert_eq!(t.find(hb, tag, &keys[WAYS]), Some((1, 0)));
        assert_eq!(
            t.lookup(&keys[WAYS], S).map(|v| v.backend),
            Some(BackendId(8))
        );
        assert!(t.prefetch_entry(keys[WAYS].hash(SEED_FLOW)));
        // A way freed at home does not hide it: an overwrite finds it where it is, so the key
        // is never stored twice.
        assert!(t.remove(&keys[0]).is_some());
        t.insert(keys[WAYS], val(50, FlowState::TcpEstablished, S), S)
            .unwrap();
        assert_eq!(t.find(hb, tag, &keys[WAYS]), Some((1, 0)));
        assert_eq!(t.len(), WAYS);
        assert_eq!(t.iter().count(), WAYS);
        assert_eq!(
            t.lookup(&keys[WAYS], S).map(|v| v.backend),
            Some(BackendId(50))
        );
        assert_eq!(
            t.remove(&keys[WAYS]).map(|v| v.backend),
            Some(BackendId(50))
        );
        assert_eq!(t.lookup(&keys[WAYS], S), None);
        assert_eq!(t.stats().full, 0);
    }

    #[test]
    fn groups_are_the_buckets_of_one_tag_line() {
        for capacity in [WAYS, 2 * WAYS, 4 * WAYS, 64 * WAYS] {
            let t = table(capacity);
            let buckets = capacity / WAYS;
            for b in 0..buckets {
                let (g, line) = t.group(b);
                assert_eq!(g, b / GROUP * GROUP);
                assert_eq!(line.len(), GROUP.min(buckets));
                assert!(core::ptr::eq(&line[b - g].0, t.tags(b)));
            }
        }
        assert_eq!(core::mem::size_of::<TagLine>(), 64);
        assert_eq!(core::mem::align_of::<TagLine>(), 64);
    }

    #[test]
    fn expired_way_reclaimed_on_insert() {
        let mut t = table(WAYS); // one bucket, so a group of one
        let keys = colliding(&t, WAYS + 1);
        for (i, k) in keys[..WAYS].iter().enumerate() {
            let state = if i == 3 {
                FlowState::Udp
            } else {
                FlowState::TcpEstablished
            };
            t.insert(*k, val(i as u32, state, 0), 0).unwrap();
        }
        // At 31 s only the UDP entry has expired; the newcomer takes its way.
        let now = 31 * S;
        t.insert(keys[WAYS], val(99, FlowState::TcpEstablished, now), now)
            .unwrap();
        assert_eq!(t.len(), WAYS);
        assert_eq!(t.lookup(&keys[3], now), None);
        assert_eq!(
            t.lookup(&keys[WAYS], now).map(|v| v.backend),
            Some(BackendId(99))
        );
        let s = t.stats();
        assert_eq!((s.expired, s.evicted, s.full), (1, 0, 0));
    }

    #[test]
    fn reinserting_an_expired_key_reuses_its_way() {
        let mut t = table(64);
        let k = key(5);
        t.insert(k, val(1, FlowState::Udp, 0), 0).unwrap();
        t.insert(k, val(2, FlowState::Udp, 40 * S), 40 * S).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t.iter().count(), 1);
        let s = t.stats();
        assert_eq!((s.inserts, s.expired), (2, 1));
    }

    #[test]
    fn oldest_syn_evicted_before_full() {
        let mut t = table(WAYS);
        let keys = colliding(&t, WAYS + 2);
        for (i, k) in keys[..WAYS].iter().enumerate() {
            let (state, seen) = match i {
                2 => (FlowState::TcpSyn, 5 * S),
                6 => (FlowState::TcpSyn, 3 * S), // the older half-open one
                _ => (FlowState::TcpEstablished, 0),
            };
            t.insert(*k, val(i as u32, state, seen), seen).unwrap();
        }
        let now = 6 * S;
        t.insert(keys[WAYS], val(90, FlowState::TcpSyn, now), now)
            .unwrap();
        assert_eq!(t.lookup(&keys[6], now), None);
        assert!(t.lookup(&keys[2], now).is_some());
        // Now the SYN ways are keys[2] (5 s) and keys[WAYS] (6 s): keys[2] goes next.
        t.insert(keys[WAYS + 1], val(91, FlowState::TcpSyn, now), now)
            .unwrap();
        assert_eq!(t.lookup(&keys[2], now), None);
        for k in keys
            .iter()
            .enumerate()
            .filter(|(i, _)| ![2, 6].contains(i))
            .map(|(_, k)| k)
        {
            assert!(t.lookup(k, now).is_some());
        }
        let s = t.stats();
        assert_eq!(
            (s.evicted, s.full, s.expired, s.occupancy),
            (2, 0, 0, WAYS as u64)
        );
    }

    #[test]
    fn full_when_bucket_holds_only_live_non_syn_entries() {
        let mut t = table(64);
        let others = fill_rest_of_group(&mut t) as u64;
        assert_eq!(others, ((GROUP - 1) * WAYS) as u64);
        let keys = colliding(&t, WAYS + 1);
        for (i, k) in keys[..WAYS].iter().enumerate() {
            let state = if i % 2 == 0 {
                FlowState::TcpEstablished
            } else {
                FlowState::Udp
            };
            t.insert(*k, val(i as u32, state, 0), 0).unwrap();
        }
        let v = val(99, FlowState::TcpSyn, S);
        assert_eq!(t.insert(keys[WAYS], v, S), Err(InsertError::Full));
        assert_eq!(t.lookup(&keys[WAYS], S), None);
        // Other groups still take flows.
        let other = (0..)
            .map(key)
            .find(|k| t.split(k.hash(SEED_FLOW)).0 >= GROUP)
            .unwrap();
        t.insert(other, v, S).unwrap();
        let s = t.stats();
        assert_eq!(
            (s.full, s.evicted, s.inserts, s.occupancy),
            (1, 0, WAYS as u64 + 1 + others, WAYS as u64 + 1 + others)
        );
        assert_eq!(
            InsertError::Full.to_string(),
            "flow table bucket full of live entries"
        );
    }

    #[test]
    fn rate_limiter_ten_per_second() {
        let mut t = FlowTable::new(1024, Timeouts::default(), 10);
        let t0 = 5_000 * S;
        let v = val(1, FlowState::TcpSyn, t0);
        for i in 0..10 {
            t.insert(key(i), v, t0).unwrap();
        }
        assert_eq!(t.insert(key(10), v, t0), Err(InsertError::RateLimited));
        assert_eq!(
            t.insert(key(10), v, t0 + 99 * MS),
            Err(InsertError::RateLimited)
        );
        t.insert(key(10), v, t0 + 100 * MS).unwrap();
        assert_eq!(
            t.insert(key(11), v, t0 + 100 * MS),
            Err(InsertError::RateLimited)
        );
        // A long idle period refills one second's worth, not more.
        let t1 = t0 + 3_600 * S;
        for i in 100..110 {
            t.insert(key(i), v, t1).unwrap();
        }
        assert_eq!(t.insert(key(110), v, t1), Err(InsertError::RateLimited));
        let s = t.stats();
        assert_eq!((s.inserts, s.rate_limited), (21, 4));
        assert_eq!(
            InsertError::RateLimited.to_string(),
            "new-flow rate limit exceeded"
        );
    }

    #[test]
    fn rate_limiter_is_exact_over_many_small_steps() {
        // 3 per second in 1 ns steps: integer refill loses nothing to rounding.
        let mut rl = RateLimiter::new(3);
        let mut admitted = 0;
        for _ in 0..3 {
            admitted += u32::from(rl.admit(0));
        }
        assert_eq!(admitted, 3);
        let mut now = 0;
        while now < S {
            now += 1_000;
            admitted += u32::from(rl.admit(now));
        }
        assert_eq!(admitted, 6);
        let mut unlimited = RateLimiter::new(0);
        assert!((0..1_000_000).all(|_| unlimited.admit(0)));
    }

    #[test]
    fn tcp_state_transitions() {
        use FlowState::*;
        let syn_ack = SYN | ACK;
        #[rustfmt::skip]
        let table: &[(FlowState, u8, FlowState)] = &[
            // A new entry starts from Other (or Udp) and takes the state of its first segment.
            (Other, SYN, TcpSyn),
            (Other, ACK, TcpEstablished),
            (Other, ACK | PSH, TcpEstablished),
            (Other, FIN | ACK, TcpClosing),
            (Other, RST, TcpClosing),
            (Other, 0, TcpSyn),
            (Udp, SYN, TcpSyn),
            (TcpSyn, SYN, TcpSyn),
            (TcpSyn, ACK, TcpEstablished),
            (TcpSyn, syn_ack, TcpEstablished),
            (TcpSyn, PSH, TcpSyn),
            (TcpSyn, RST, TcpClosing),
            (TcpSyn, FIN | ACK, TcpClosing),
            (TcpEstablished, ACK, TcpEstablished),
            (TcpEstablished, ACK | PSH, TcpEstablished),
            (TcpEstablished, SYN, TcpEstablished),
            (TcpEstablished, FIN | ACK, TcpClosing),
            (TcpEstablished, RST | ACK, TcpClosing),
            (TcpClosing, ACK, TcpClosing),
            (TcpClosing, FIN | ACK, TcpClosing),
            (TcpClosing, syn_ack, TcpClosing),
            (TcpClosing, SYN, TcpSyn),
            (TcpClosing, SYN | FIN, TcpClosing),
        ];
        for &(from, flags, to) in table {
            assert_eq!(from.on_tcp_flags(flags), to, "{from:?} + {flags:#04x}");
        }
    }

    #[test]
    fn sweep_is_incremental_and_bounded() {
        let mut t = table(64 * WAYS); // 64 buckets
        let n = 200;
        for i in 0..n {
            let state = if i % 2 == 0 {
                FlowState::Udp
            } else {
                FlowState::TcpEstablished
            };
            t.insert(key(i), val(i, state, 0), 0).unwrap();
        }
        assert_eq!(t.len(), n as usize);
        let now = 60 * S; // UDP entries (30 s) expired, established ones (2 h) not
        assert_eq!(t.sweep(now, 0), 0);
        let mut removed = 0;
        for _ in 0..16 {
            let r = t.sweep(now, 4);
            assert!(r <= 4 * WAYS, "at most 4 buckets' worth per call");
            removed += r;
        }
        assert_eq!(
            removed, 100,
            "16 calls of 4 buckets cover all 64 buckets once"
        );
        assert_eq!(t.len(), 100);
        assert_eq!(
            t.sweep(now, usize::MAX),
            0,
            "max_buckets is capped at the table size"
        );
        assert!(t.iter().all(|(_, v)| v.state == FlowState::TcpEstablished));
        assert_eq!(t.stats().expired, 100);
    }

    #[test]
    fn the_paced_sweep_passes_over_the_table_once_in_its_pass_time() {
        let buckets = 1024; // 16 steps of SWEEP_STEP buckets
        let mut t = table(buckets * WAYS);
        let n = 2000;
        for i in 0..n {
            t.insert(key(i), val(i, FlowState::Udp, 0), 0).unwrap();
        }
        let every = SWEEP_PASS_NS / (buckets / SWEEP_STEP) as u64;
        // UDP entries (30 s) are expired from 30 s on; step at the pace from there.
        let start = 31 * S;
        assert!(t.sweep_paced(start) > 0, "the first step is due at once");
        assert_eq!(
            t.sweep_paced(start + every - 1),
            0,
            "no step before its time"
        );
        let mut now = start;
        for _ in 1..16 {
            now += every;
            assert_eq!(t.sweep_paced(now - 1), 0);
            assert!(t.sweep_paced(now) > 0);
        }
        assert!(
            t.is_empty(),
            "16 steps, one pass: every expired entry reclaimed"
        );
        assert!(now - start < SWEEP_PASS_NS);
        // A clock that jumps ahead takes one step, not the steps it missed.
        for i in 0..n {
            t.insert(key(i), val(i, FlowState::Udp, now), now).unwrap();
        }
        let later = now + 3600 * S;
        let one = t.sweep_paced(later);
        assert!(one > 0 && one < n as usize / 8, "one step: {one}");
        assert_eq!(t.sweep_paced(later + 1), 0);
        // A batch that comes late does not push the steps after it back.
        assert!(t.sweep_paced(later + every + every / 2) > 0);
        assert_eq!(t.sweep_paced(later + 2 * every - 1), 0);
        assert!(t.sweep_paced(later + 2 * every) > 0);
        // A clock that goes back takes one step and paces from there.
        let back = later - 1800 * S;
        assert!(
            t.sweep_paced(back) > 0,
            "not stalled until the clock catches up"
        );
        assert_eq!(t.sweep_paced(back + 1), 0);
        assert!(t.sweep_paced(back + every) > 0);
    }

    #[test]
    fn stats_count_every_outcome() {
        let mut t = FlowTable::new(WAYS, Timeouts::default(), 0);
        let keys = colliding(&t, WAYS + 2);
        for (i, k) in keys[..WAYS].iter().enumerate() {
            let state = if i == 0 {
                FlowState::TcpSyn
            } else {
                FlowState::TcpEstablished
            };
            t.insert(*k, val(1, state, 0), 0).unwrap();
        }
        t.insert(keys[1], val(2, FlowState::TcpEstablished, 0), 0)
            .unwrap(); // overwrite
        t.insert(keys[WAYS], val(3, FlowState::TcpEstablished, 0), 0)
            .unwrap(); // evicts keys[0]
        assert_eq!(
            t.insert(keys[WAYS + 1], val(4, FlowState::Udp, 0), 0),
            Err(InsertError::Full)
        );
        assert!(t.remove(&keys[2]).is_some());
        let later = Timeouts::default().tcp_established + S;
        assert_eq!(t.lookup(&keys[3], later), None); // expired
        assert_eq!(t.sweep(later, 1), 6);
        let s = t.stats();
        assert_eq!(
            s,
            FlowStats {
                inserts: 9,
                expired: 7,
                evicted: 1,
                removed: 1,
                full: 1,
                rate_limited: 0,
                occupancy: 0,
            }
        );
        assert_eq!(s.occupancy, s.inserts - s.expired - s.evicted - s.removed);
        assert!(t.is_empty());
        assert!(format!("{t:?}").contains("capacity: 8"));
    }
}
