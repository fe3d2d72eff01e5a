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
//! for. An id handed to a new service or backend gets a new incarnation. Before a core counts
//! under a table it has not counted under yet, it settles its slots with it
//! ([`Traffic::settle`], once per table change: a walk over the table's backends): a backend
//! slot whose incarnation is not the table's holder's is taken over by the new holder and
//! starts from zero, so the old holder's counts are never attributed to the new one, and a
//! backend that stays keeps counting in the same slot whatever index its service has. The
//! packet path then counts without checking anything but the id's range. The control plane
//! sums, for each id of the live table, only the slots whose incarnation is the live one: a
//! core that has not yet counted under the live table still holds predecessors' counts, and
//! they are left out. A service or backend that leaves the table leaves `/metrics` with its
//! counts.
//!
//! # Service totals
//!
//! The packet path counts per backend only: a service's counts are its backends' counts,
//! added up when the core publishes ([`Traffic::export`]), plus those of its backends that
//! have left. Each backend slot remembers the service (id and incarnation) it first counted
//! for; when the slot is taken over by the id's next holder, its counts are folded into that
//! service's *retired* slot before it restarts from zero. A service's total therefore never
//! falls when a backend leaves or its id is reused: it is the retired slot plus every backend
//! slot that counts for it, whether that backend is still in the table or not. Backends
//! still in the table count for the service the table gives them now; a backend that left
//! counts for the service it last counted for.
//!
//! Ids at or above [`SLOTS`] are not counted (the configuration would need more than 65,536
//! services or backends at once); their packets still count in the per-core counters.
//!
//! # Cost
//!
//! One slot update per packet (the backend's: two additions), in the worker's own memory; the
//! incarnations are settled once per table change and the services' sums taken when the core
//! publishes, each a walk over the slots in use. Slots are dense (both directions of an id in 32 bytes, incarnations apart) and
//! fixed-size, so an id checked once against [`SLOTS`] indexes them without further bounds
//! checks. The instructions and time this adds per packet are in
//! docs/performance.md ("Cost of the traffic counters").

use crate::table::{Backend, Service, ServiceTable};

/// Slots per array: ids below this have their own slot. The arrays take 5 MiB per
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

impl Pair {
    fn add(&mut self, packets: u64, bytes: u64) {
        self.packets += packets;
        self.bytes += bytes;
    }
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

    /// Adds `t`'s counts to `id`'s slot if `t` is for the slot's incarnation or a later one
    /// (incarnations grow: the table builder draws them from one counter); a later one
    /// restarts the slot. Counts of an earlier incarnation are of a holder that is gone.
    fn fold(&mut self, id: usize, t: &Tally) {
        if id >= SLOTS || t.incarnation < self.incarnation[id] {
            return;
        }
        if t.incarnation > self.incarnation[id] {
            self.incarnation[id] = t.incarnation;
            self.pairs[id] = [Pair::default(); 2];
        }
        let [i, o] = &mut self.pairs[id];
        i.add(t.in_packets, t.in_bytes);
        o.add(t.out_packets, t.out_bytes);
    }
}

/// The service a backend slot counts for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Owner {
    service: u32,
    incarnation: u32,
}

/// One core's traffic counts, by backend id, and by service id for the backends that left.
#[derive(Clone)]
pub struct Traffic {
    backends: Slots,
    /// The service each backend slot counts for, set when the slot takes a new incarnation.
    owners: Box<[Owner; SLOTS]>,
    /// Per service id, the counts of its backends whose slots were taken over.
    retired: Slots,
    /// Backend ids below this have counted.
    high: usize,
    /// The serial of the table the slots are settled with ([`ServiceTable::serial`]; 0: none).
    table: u64,
}

impl core::fmt::Debug for Traffic {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Traffic")
            .field("slots", &SLOTS)
            .field("high", &self.high)
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
            backends: Slots::new(),
            owners: vec![Owner::default(); SLOTS]
                .into_boxed_slice()
                .try_into()
                .expect("SLOTS owners"),
            retired: Slots::new(),
            high: 0,
            table: 0,
        }
    }

    /// Bytes [`Traffic::new`] allocates.
    pub const fn bytes() -> u64 {
        let slots = 4 + 2 * core::mem::size_of::<Pair>();
        (SLOTS * (2 * slots + core::mem::size_of::<Owner>())) as u64
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

    /// Counts in `b`'s slot, settled for the table `b` is from ([`Traffic::settle`]).
    #[inline(always)]
    fn count(&mut self, s: &Service, b: &Backend, bytes: usize, out: bool) {
        let i = b.id.0 as usize;
        if i >= SLOTS {
            return;
        }
        debug_assert_eq!(
            (self.backends.incarnation[i], self.owners[i]),
            (
                b.incarnation,
                Owner {
                    service: s.id.0,
                    incarnation: s.incarnation
                }
            ),
            "traffic slots not settled with the table"
        );
        let p = &mut self.backends.pairs[i][out as usize];
        p.packets += 1;
        p.bytes += bytes as u64;
    }

    /// Whether the slots follow table `t` already ([`Traffic::settle`] was last called with
    /// it).
    #[inline(always)]
    pub fn is_settled(&self, t: &ServiceTable) -> bool {
        t.serial() == self.table
    }

    /// Makes the backend slots table `t`'s before anything is counted under it: each of its
    /// backends' slots holds its incarnation (taken over from the last holder if not) and
    /// names the service `t` gives it. One comparison when `t` is the table of the last call;
    /// else a walk over `t`'s backends, out of line. Runs on the worker's thread, before a
    /// batch; allocates nothing.
    #[inline(always)]
    pub fn settle(&mut self, t: &ServiceTable) {
        if t.serial() != self.table {
            self.settle_with(t);
        }
    }

    #[cold]
    #[inline(never)]
    fn settle_with(&mut self, t: &ServiceTable) {
        for b in t.backends.iter().take(SLOTS).flatten() {
            let Some(s) = t.services.get(b.service as usize) else {
                continue;
            };
            let i = b.id.0 as usize;
            if i >= SLOTS {
                continue;
            }
            if self.backends.incarnation[i] != b.incarnation {
                self.take_over(i, s, b);
            } else {
                // The same backend, counted for the service the table gives it now (its
                // service renamed while it kept its frontend, address and port).
                self.owners[i] = Owner {
                    service: s.id.0,
                    incarnation: s.incarnation,
                };
            }
        }
        self.table = t.serial();
    }

    /// Gives slot `i` to backend `b` of service `s`: what it counted for its last holder goes
    /// to that holder's service's retired slot, and it starts again from zero.
    #[cold]
    #[inline(never)]
    fn take_over(&mut self, i: usize, s: &Service, b: &Backend) {
        let old = self.backends.tally(i);
        if old.incarnation != 0 {
            self.retired.fold(
                self.owners[i].service as usize,
                &Tally {
                    incarnation: self.owners[i].incarnation,
                    ..old
                },
            );
        }
        self.backends.incarnation[i] = b.incarnation;
        self.backends.pairs[i] = [Pair::default(); 2];
        self.owners[i] = Owner {
            service: s.id.0,
            incarnation: s.incarnation,
        };
        self.high = self.high.max(i + 1);
    }

    /// Service `s`'s counts on this core, for table `t` (zero when its id counts for another
    /// holder): what [`Traffic::export`] publishes for it.
    pub fn service(&self, t: &ServiceTable, s: &Service) -> Tally {
        let mut total = current_of(self.retired.tally(s.id.0 as usize), s.incarnation);
        self.each_counted(t, |owner, b| {
            if owner == s.id.0 {
                total.add_if_same(b);
            }
        });
        total
    }

    /// Backend `b`'s counts on this core (zero when its slot counts for another holder).
    pub fn backend(&self, b: &Backend) -> Tally {
        current_of(self.backends.tally(b.id.0 as usize), b.incarnation)
    }

    /// Calls `f` with every counted backend slot and the id of the service it counts for,
    /// the slot's tally carrying that service's incarnation: the service table `t` gives it
    /// for a backend still in it, the slot's owner for one that left.
    fn each_counted(&self, t: &ServiceTable, mut f: impl FnMut(u32, &Tally)) {
        for i in 0..self.high {
            let tally = self.backends.tally(i);
            if tally.incarnation == 0 {
                continue;
            }
            let live = t
                .backends
                .get(i)
                .and_then(Option::as_ref)
                .filter(|b| b.incarnation == tally.incarnation)
                .and_then(|b| t.services.get(b.service as usize));
            let owner = match live {
                Some(s) => Owner {
                    service: s.id.0,
                    incarnation: s.incarnation,
                },
                None => self.owners[i],
            };
            f(
                owner.service,
                &Tally {
                    incarnation: owner.incarnation,
                    ..tally
                },
            );
        }
    }

    /// Replaces `services` and `backends` with this core's counts for service ids
    /// `0..t.service_ids` and backend ids `0..t.backends.len()`, each with its incarnation
    /// (read them with [`current`]). A service's counts are summed here from its backends'
    /// (see "Service totals" above): a walk over the backend slots in use, on the worker's
    /// thread between batches. Allocates only when a vector must grow.
    pub fn export(&self, t: &ServiceTable, services: &mut Vec<Tally>, backends: &mut Vec<Tally>) {
        backends.clear();
        backends.extend((0..t.backends.len().min(SLOTS)).map(|id| self.backends.tally(id)));
        services.clear();
        services.resize((t.service_ids as usize).min(SLOTS), Tally::ZERO);
        for s in &t.services {
            if let Some(slot) = services.get_mut(s.id.0 as usize) {
                *slot = current_of(self.retired.tally(s.id.0 as usize), s.incarnation);
            }
        }
        self.each_counted(t, |owner, b| {
            if let Some(slot) = services.get_mut(owner as usize) {
                slot.add_if_same(b);
            }
        });
    }
}

impl Tally {
    /// Adds `o`'s counts if they are for this tally's incarnation.
    fn add_if_same(&mut self, o: &Tally) {
        if o.incarnation == self.incarnation {
            self.add(o);
        }
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
