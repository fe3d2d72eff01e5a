//! Traffic per service and per backend, as `ipvsadm -L -n --stats` shows it: packets and
//! bytes in (client to backend, every mode) and out (backend to client: the nat replies the
//! gateway translates back; in DSR modes replies bypass the gateway and out stays 0).
//!
//! Each core counts into its own [`Traffic`], two preallocated arrays in the worker's memory:
//! no atomics, no locks, no allocation on the packet path. The control plane sums the cores'
//! published copies when it is asked (a scrape, `strait status`). Cardinality is the
//! configuration's: one slot per service and one per backend, never anything per client.
//!
//! What is counted: a packet is "in" when the pipeline sends it to a backend (a flow's
//! packet, a fragment, an ICMP error about a flow), "out" when it translates a nat reply back
//! to the client; bytes are the IP packet's length as it arrived (header and payload, no
//! link-layer header, no encapsulation), as IPVS counts them. Dropped packets count in the
//! drop reasons ([`crate::stats`]), not here.
//!
//! # Identity across table changes
//!
//! A reload re-indexes services (a removed service's index goes to another) and reuses the
//! ids of backends that left, so neither index nor id alone names the same thing over time.
//! The slots are indexed by the ids the [`crate::table::Builder`] keeps stable across builds,
//! [`crate::key::ServiceId`] (by service name) and [`crate::key::BackendId`] (by service
//! frontend, address and port), and each slot remembers the *incarnation* of the id it counts
//! for. An id handed to a new service or backend gets a new incarnation; the first packet
//! counted for it finds the slot's incarnation different and starts the slot from zero, so the
//! old holder's counts are never attributed to the new one, and a service or backend that
//! stays keeps counting in the same slot whatever index it has. The control plane sums, for
//! each id of the live table, only the slots whose incarnation is the live one: a core that
//! has not yet counted for a new holder still holds its predecessor's counts, and they are
//! left out. A service or backend that leaves the table leaves `/metrics` with its counts.
//!
//! Ids at or above [`SLOTS`] are not counted (the configuration would need more than 65,536
//! services or backends at once); their packets still count in the per-core counters.
//!
//! # Cost
//!
//! Two slot updates per packet (the service's and the backend's, each with its incarnation
//! check), in the worker's own memory. Slots are dense (both directions of an id in 32 bytes,
//! incarnations apart) and fixed-size, so an id checked once against [`SLOTS`] indexes them
//! without further bounds checks. The instructions and time this adds per packet are in
//! docs/performance-counters.md.

use crate::table::{Backend, Service};

/// Slots per array: ids below this have their own slot. The four arrays take 4.5 MiB per
/// core, written once at start so that counting never page-faults.
pub const SLOTS: usize = 1 << 16;

/// One service's or backend's counts on one core, as the readers see them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// The incarnation of the id these counts are for (0: never counted).
    pub incarnation: u32,
    /// Packets to backends.
    pub in_packets: u64,
    /// Bytes to backends.
    pub in_bytes: u64,
    /// Packets from backends (nat replies).
    pub out_packets: u64,
    /// Bytes from backends (nat replies).
    pub out_bytes: u64,
}

impl Tally {
    /// No counts, for no incarnation.
    pub const ZERO: Tally = Tally {
        incarnation: 0,
        in_packets: 0,
        in_bytes: 0,
        out_packets: 0,
        out_bytes: 0,
    };

    /// Adds `o`'s counts (not its incarnation).
    pub fn add(&mut self, o: &Tally) {
        self.in_packets += o.in_packets;
        self.in_bytes += o.in_bytes;
        self.out_packets += o.out_packets;
        self.out_bytes += o.out_bytes;
    }
}

/// Packets and bytes, one direction: 16 bytes, four to a cache line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Pair {
    packets: u64,
    bytes: u64,
}

/// Counts by id, kept dense: the incarnations apart (sixteen to a line) and both directions
/// of an id together (two ids to a line), so that the slots of a configuration's busy ids
/// stay in the caches while flow-table lines stream through them. Fixed-size arrays, so that
/// an id checked against [`SLOTS`] once indexes them without further bounds checks.
#[derive(Clone)]
struct Slots {
    incarnation: Box<[u32; SLOTS]>,
    /// `[in, out]` per id.
    pairs: Box<[[Pair; 2]; SLOTS]>,
}

impl Slots {
    fn new() -> Self {
        Self {
            incarnation: vec![0; SLOTS]
                .into_boxed_slice()
                .try_into()
                .expect("SLOTS incarnations"),
            pairs: vec![[Pair::default(); 2]; SLOTS]
                .into_boxed_slice()
                .try_into()
                .expect("SLOTS pairs"),
        }
    }

    /// Counts a packet of `bytes` for `id` of `incarnation`, restarting the id's counts when
    /// they were another incarnation's.
    #[inline(always)]
    fn count(&mut self, id: u32, incarnation: u32, bytes: u32, out: bool) {
        let i = id as usize;
        if i >= SLOTS {
            return;
        }
        if self.incarnation[i] != incarnation {
            self.incarnation[i] = incarnation;
            self.pairs[i] = [Pair::default(); 2];
        }
        let p = &mut self.pairs[i][out as usize];
        p.packets += 1;
        p.bytes += u64::from(bytes);
    }

    /// The counts of `id`, whatever their incarnation; zero past the slots.
    fn tally(&self, id: usize) -> Tally {
        if id >= SLOTS {
            return Tally::ZERO;
        }
        let [i, o] = self.pairs[id];
        Tally {
            incarnation: self.incarnation[id],
            in_packets: i.packets,
            in_bytes: i.bytes,
            out_packets: o.packets,
            out_bytes: o.bytes,
        }
    }

    /// Replaces `out` with the counts of ids `0..n`; allocates only when `out` must grow.
    fn export(&self, n: usize, out: &mut Vec<Tally>) {
        out.clear();
        out.extend((0..n.min(SLOTS)).map(|id| self.tally(id)));
    }
}

/// One core's traffic counts, by service id and by backend id.
#[derive(Clone)]
pub struct Traffic {
    services: Slots,
    backends: Slots,
}

impl core::fmt::Debug for Traffic {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Traffic")
            .field("slots", &SLOTS)
            .finish_non_exhaustive()
    }
}

impl Default for Traffic {
    fn default() -> Self {
        Self::new()
    }
}

impl Traffic {
    /// Zeroed slots, [`SLOTS`] of each kind, written now.
    pub fn new() -> Self {
        Self {
            services: Slots::new(),
            backends: Slots::new(),
        }
    }

    /// Bytes [`Traffic::new`] allocates.
    pub const fn bytes() -> u64 {
        (2 * SLOTS * (4 + 2 * core::mem::size_of::<Pair>())) as u64
    }

    /// Counts a packet of `bytes` sent to backend `b` of service `s`.
    #[inline(always)]
    pub fn to_backend(&mut self, s: &Service, b: &Backend, bytes: usize) {
        self.count(s, b, bytes, false);
    }

    /// Counts a reply of `bytes` from backend `b` of service `s`.
    #[inline(always)]
    pub fn from_backend(&mut self, s: &Service, b: &Backend, bytes: usize) {
        self.count(s, b, bytes, true);
    }

    #[inline(always)]
    fn count(&mut self, s: &Service, b: &Backend, bytes: usize, out: bool) {
        self.services
            .count(s.id.0, s.incarnation, bytes as u32, out);
        self.backends
            .count(b.id.0, b.incarnation, bytes as u32, out);
    }

    /// Service `s`'s counts on this core (zero when its slot counts for another holder).
    pub fn service(&self, s: &Service) -> Tally {
        current_of(self.services.tally(s.id.0 as usize), s.incarnation)
    }

    /// Backend `b`'s counts on this core (zero when its slot counts for another holder).
    pub fn backend(&self, b: &Backend) -> Tally {
        current_of(self.backends.tally(b.id.0 as usize), b.incarnation)
    }

    /// Replaces `services` and `backends` with the slots of service ids `0..n_services` and
    /// backend ids `0..n_backends` (each with its incarnation: read them with [`current`]).
    /// Allocates only when a vector must grow.
    pub fn export(
        &self,
        n_services: usize,
        n_backends: usize,
        services: &mut Vec<Tally>,
        backends: &mut Vec<Tally>,
    ) {
        self.services.export(n_services, services);
        self.backends.export(n_backends, backends);
    }
}

/// `t` if it is `incarnation`'s, else zero for `incarnation`.
fn current_of(t: Tally, incarnation: u32) -> Tally {
    if t.incarnation == incarnation {
        t
    } else {
        Tally {
            incarnation,
            ..Tally::ZERO
        }
    }
}

/// The counts in `slots[id]` if they are `incarnation`'s, else zero: the reading rule for
/// published copies too.
pub fn current(slots: &[Tally], id: u32, incarnation: u32) -> Tally {
    match slots.get(id as usize) {
        Some(t) if t.incarnation == incarnation => *t,
        _ => Tally {
            incarnation,
            ..Tally::ZERO
        },
    }
}
