//! Maglev consistent hashing: a lookup table from flow hash to backend.
//!
//! Eisenbud et al., "Maglev: A Fast and Reliable Software Network Load Balancer", NSDI 2016,
//! section 3.4 and Pseudocode 1 (<https://www.usenix.org/conference/nsdi16/technical-sessions/presentation/eisenbud>).
//! A worker picks a new flow's backend as `table[hash(5-tuple) % M]`; this module builds that
//! table once per change, off the hot path, and [`Table::lookup`] reads it.
//!
//! # The algorithm
//!
//! Each backend gets a permutation of the `M` slots from two hashes of its identity `key`:
//! `offset = h1(key) % M` and `skip = h2(key) % (M - 1) + 1`, and its `j`-th preference is
//! `(offset + j * skip) % M`. Because `M` is prime and `1 <= skip < M`, every permutation visits
//! every slot exactly once. Backends then take turns: on its turn a backend walks its
//! permutation to the first slot nobody holds yet and takes it, until all `M` slots are held.
//! A backend's permutation depends only on its own key, which is what makes the table
//! consistent: when one backend leaves, the others still prefer the same slots in the same
//! order, so most slots keep their owner.
//!
//! The permutation is never stored as an `M x N` matrix (that is 262 MB at `M = 65537` and
//! 1,000 backends); each backend keeps only its next position and advances it by `skip` with a
//! conditional subtract instead of `%`. Which slots are taken is a bitmap of `M` bits (8 KiB at
//! `M = 65537`, so it stays in L1 while the walks jump around), separate from the `u16` slots.
//!
//! # Weights
//!
//! Following Katran's `MaglevHashV2` (`lib/MaglevHashV2.cpp`), turns come in rounds. Every
//! round each backend earns `weight` credit and takes a slot only once its credit reaches the
//! largest weight, which it then pays back; so a backend with the largest weight takes a slot
//! every round and one with half of it every other round. With equal weights this is exactly
//! the paper's round robin. The share a backend ends with depends only on the credit
//! schedule, not on where its slots fall, and that schedule gives the bound the tests check:
//! with total weight `W`, backend `i` holds `c_i` slots with
//! `|c_i - M * w_i / W| < 1 + (N / M) * (M * w_i / W)`, so within 1% (plus one slot for
//! rounding to whole slots) once `M >= 100 * N`. Equal weights get `floor(M / N)` or
//! `ceil(M / N)` slots each. The turns follow Katran's order, but the hashes are ours
//! ([`crate::hash`], not MurmurHash3), so the tables are not interchangeable with Katran's.
//!
//! Weight 0 marks a draining backend: it keeps its index in the input but takes no slot. If
//! no backend has weight above 0 the table is empty and [`Table::lookup`] returns `None`.
//!
//! A plain round loop costs `N` visits a round and runs for `M * max_weight / W` rounds: about
//! one visit per slot while weights are comparable, but quadratic when one weight dwarfs the
//! rest (one backend at weight 10^9 among 60,000 at weight 1 costs 4 billion visits at
//! `M = 65537`, and minutes at [`MAX_SIZE`]). When the loop would visit more than 64 backends
//! per slot (`LOOP_STEPS_PER_SLOT`), the build instead pops turns from a heap ordered by
//! (round, position), `O(M log N)`, which produces the same turns in the same order.
//!
//! # Determinism
//!
//! The table is a pure function of the multiset of `(key, weight)` pairs and `M`. Backends
//! are stably sorted by `(key, weight)` before any turn is taken, and nothing here iterates a
//! `HashMap`, so the same backends in any input order give the same slot-to-key map (the `u16`
//! in a slot is an index into the caller's slice, so the indices differ with the order; the
//! keys behind them do not). The hashes are [`crate::hash::hash_words`] under fixed seeds, so
//! every core, process and gateway in an ECMP group builds the same table. A golden vector in
//! the tests pins the output.
//!
//! Two entries with the same key and weight share one permutation and tie in the sort; the
//! slot-to-key map is still order independent, but which of the two indices holds a given
//! slot follows input order. Callers should not list a backend twice.
//!
//! # Limits
//!
//! - At most [`MAX_BACKENDS`] (65,535) entries per table, counting weight-0 ones: a slot holds
//!   a `u16` index and `u16::MAX` is reserved for "no backend" in an empty table. More is
//!   refused with [`BuildError::TooManyBackends`].
//! - `M` must be prime (so every skip yields a full permutation), at least the number of
//!   backends with weight above 0 (otherwise some get no slot), and at most [`MAX_SIZE`].
//!   Balance needs `M >= 100 * N` for the 1% figures above; the paper's sizes are
//!   [`DEFAULT_SIZE`] and [`LARGE_SIZE`].
//! - Maglev trades perfect stability for balance: removing one of `N` backends moves its own
//!   `1/N` of the slots and, in practice, a small further fraction of the others (the tests
//!   measure it), unlike rendezvous hashing, which moves none of the others but is `O(N)` per
//!   lookup.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;

use strait_config::is_prime;

use crate::hash::hash_words;

/// Seed for a backend's offset hash `h1`. ASCII "STRAITMO".
const SEED_OFFSET: u64 = 0x5354_5241_4954_4d4f;
/// Seed for a backend's skip hash `h2`, independent of [`SEED_OFFSET`] so that offset and skip
/// are uncorrelated. ASCII "STRAITMS".
const SEED_SKIP: u64 = 0x5354_5241_4954_4d53;

/// Marks a slot with no backend; used only when no backend has weight above 0.
const NO_BACKEND: u16 = u16::MAX;

/// Most entries one table accepts: every `u16` index except [`u16::MAX`], which means "no
/// backend".
pub const MAX_BACKENDS: usize = NO_BACKEND as usize;
// The configuration refuses a service with more backends than a table takes.
const _: () = assert!(MAX_BACKENDS == strait_config::model::Service::MAX_BACKENDS);

/// Largest accepted table size: the largest prime below 2^24.
///
/// A table of this size is 32 MiB of `u16`, and it is larger than `100 * MAX_BACKENDS`
/// (6,553,500), the size at which even a full table meets the 1% balance bound, so nothing
/// needs more. The bound also keeps `position + skip` below 2^25, so the walk's `u32`
/// arithmetic cannot overflow.
pub const MAX_SIZE: u32 = 16_777_213;

/// The paper's default table size, a prime just above 2^16: balanced to 1% for up to 655
/// backends, 128 KiB of slots.
pub const DEFAULT_SIZE: u32 = 65_537;

/// The paper's size for large backend sets: balanced to 1% for up to 6,553 backends, 1.25 MiB.
pub const LARGE_SIZE: u32 = 655_373;

/// Table sizes chosen from the backend count ([`size_for`]), smallest first: primes about
/// eight times apart. A small table is cheap to build and to hold (2,039 slots serve up to
/// 20 backends within the paper's balance), and most services have a handful of backends;
/// sizing every table at [`DEFAULT_SIZE`] would make thousands of services cost gigabytes
/// and seconds of building.
pub const SIZES: [u32; 4] = [2_039, 16_381, DEFAULT_SIZE, LARGE_SIZE];

/// Slots per backend a size is chosen for: the Maglev paper keeps the table at least 100
/// times the backend count for balance within about 1 %.
pub const SLOTS_PER_BACKEND: usize = 100;

/// The table size for `backends` backends and at least `min` slots (a prime): the smallest of
/// `min` and the [`SIZES`] above it that holds [`SLOTS_PER_BACKEND`] slots per backend, or
/// [`LARGE_SIZE`] past them (balance then looser than 1 %); `None` with more backends than
/// [`LARGE_SIZE`] slots. A function of the count alone, so every gateway in front of the same
/// backends builds the same table.
pub fn size_for(backends: usize, min: u32) -> Option<u32> {
    if backends > LARGE_SIZE as usize {
        return None;
    }
    let want = backends.saturating_mul(SLOTS_PER_BACKEND);
    let sizes = std::iter::once(min).chain(SIZES.into_iter().filter(|&s| s > min));
    let mut last = min;
    for s in sizes {
        last = s;
        if s as usize >= want {
            return Some(s);
        }
    }
    Some(last.max(LARGE_SIZE))
}

/// Bytes a table of `size` slots holds (one `u16` backend index per slot).
pub const fn bytes_for(size: u32) -> u64 {
    size as u64 * core::mem::size_of::<u16>() as u64
}

/// Largest number of backend visits per slot for which the round loop beats the heap.
///
/// The round loop visits every backend every round: with equal weights exactly once per slot,
/// in general `N * max_weight / W` times, and an idle visit costs about a third of a
/// nanosecond. The heap costs about 20 ns more per slot at 1,000 backends whatever the
/// weights. Measured at `M = 65537` and 1,000 backends (release): equal weights 1.1 ms with
/// the loop, 2.5 ms with the heap; largest weight 60 times the mean, 2.45 and 2.6 ms; 500
/// times, 11.8 and 2.8 ms. So the loop wins up to about 64 visits per slot. Both paths yield
/// the same table; this constant only picks the faster one.
const LOOP_STEPS_PER_SLOT: u64 = 64;

/// One backend as Maglev sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Weighted {
    /// The backend's stable identity hash (the caller hashes address and port). It alone
    /// decides the backend's permutation, so it must not change while the backend lives.
    pub key: u64,
    /// Relative share of the slots; 0 means draining: the backend gets no slot.
    pub weight: u32,
}

/// A built Maglev table: `M` slots, each the index of a backend in the slice given to
/// [`build`].
///
/// Immutable once built; control builds a new one and swaps it in.
#[derive(Clone, PartialEq, Eq)]
pub struct Table {
    /// Index into the caller's backend slice per slot, or [`NO_BACKEND`] everywhere when no
    /// backend had weight above 0. Never empty: its length is the prime `M >= 2`.
    slots: Box<[u16]>,
    /// `hash % M` without a division ([`Remainder`]).
    remainder: Remainder,
}

/// `a % d` for any 64-bit `a` by multiplications instead of a `div`: Lemire, Kaser and Kurz,
/// "Faster Remainder by Direct Computation" (Software: Practice and Experience, 2019),
/// `fastmod_u64` with its 128-bit constant `c = ceil(2^128 / d)`, exact for every 64-bit `a`
/// and `d`. A 64-bit `div` takes 35 to 90 cycles on the x86 cores gateways run on, and every
/// new flow's Maglev slot (and its prefetch) needs one; this is four multiplies.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Remainder {
    d: u64,
    c: u128,
}

impl Remainder {
    fn new(d: u64) -> Self {
        assert!(d > 0, "a remainder by zero");
        Self {
            d,
            c: (u128::MAX / u128::from(d)).wrapping_add(1),
        }
    }

    /// `a % d`.
    #[inline(always)]
    fn of(self, a: u64) -> u64 {
        // The fraction a / d in 128 bits; its top 64 bits after a multiply by d are the
        // remainder. (For d = 1, c wraps to 0 and so does the result.)
        let low = self.c.wrapping_mul(u128::from(a));
        let bottom = ((low as u64 as u128) * u128::from(self.d)) >> 64;
        let top = (low >> 64) * u128::from(self.d);
        ((bottom + top) >> 64) as u64
    }
}

/// A slot of a [`Table`], from [`Table::slot`]: meaningful for that table only.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Slot(u32);

/// Why [`build`] refused its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The table size is not a prime; a backend's permutation would then skip slots.
    #[error("Maglev table size {size} is not prime")]
    SizeNotPrime {
        /// The requested size.
        size: u32,
    },
    /// The table size is above [`MAX_SIZE`].
    #[error("Maglev table size {size} is larger than the maximum {max}")]
    SizeTooLarge {
        /// The requested size.
        size: u32,
        /// [`MAX_SIZE`].
        max: u32,
    },
    /// More backends than a `u16` slot can index.
    #[error("{count} backends is more than the {max} a Maglev table can hold")]
    TooManyBackends {
        /// Number of entries given, including weight-0 ones.
        count: usize,
        /// [`MAX_BACKENDS`].
        max: usize,
    },
    /// Fewer slots than backends with weight above 0, so some would get no slot.
    #[error(
        "Maglev table size {size} is smaller than the {weighted} backends with weight above 0"
    )]
    SizeTooSmall {
        /// The requested size.
        size: u32,
        /// Number of backends with weight above 0.
        weighted: usize,
    },
}

/// Builds the Maglev table of `size` slots for `backends`.
///
/// Slot values are indices into `backends`. The result depends only on the multiset of
/// `(key, weight)` pairs and `size`, not on their order (see the [module docs](self)).
/// Every slot holds a backend of weight above 0 if there is one; if there is none the table
/// is empty and [`Table::lookup`] returns `None`.
///
/// # Errors
///
/// - [`BuildError::TooManyBackends`] if `backends.len() > MAX_BACKENDS`;
/// - [`BuildError::SizeTooLarge`] if `size > MAX_SIZE`;
/// - [`BuildError::SizeNotPrime`] if `size` is not prime (this includes 0 and 1);
/// - [`BuildError::SizeTooSmall`] if `size` is smaller than the number of backends with
///   weight above 0.
pub fn build(backends: &[Weighted], size: u32) -> Result<Table, BuildError> {
    let plan = Plan::new(backends, size)?;
    let fill = if plan.loop_is_cheap() {
        Fill::Rounds
    } else {
        Fill::Heap
    };
    Ok(plan.fill(fill))
}

impl Table {
    /// Builds the table; the same as the free function [`build`].
    ///
    /// # Errors
    ///
    /// As [`build`].
    pub fn build(backends: &[Weighted], size: u32) -> Result<Self, BuildError> {
        build(backends, size)
    }

    /// The backend (index into the slice given to [`build`]) for a flow hash: slot
    /// `hash % size`.
    ///
    /// Returns `None` only when the table is empty (no backend had weight above 0).
    #[must_use]
    #[inline]
    pub fn lookup(&self, hash: u64) -> Option<usize> {
        self.at(self.slot(hash))
    }

    /// The slot of a flow hash, `hash % size`: what [`lookup`](Self::lookup) reads, for a
    /// packet path that computes it once for a prefetch and the lookup after it.
    #[must_use]
    #[inline(always)]
    pub fn slot(&self, hash: u64) -> Slot {
        Slot(self.remainder.of(hash) as u32)
    }

    /// The backend in slot `slot` of this table ([`lookup`](Self::lookup) by its slot).
    #[must_use]
    #[inline(always)]
    pub fn at(&self, slot: Slot) -> Option<usize> {
        // A slot of this table is below its prime size: the `get` never misses. It is `get`
        // rather than `[]` so that no input (a slot of another table) can make the hot path
        // panic.
        match self.slots.get(slot.0 as usize) {
            Some(&backend) if backend != NO_BACKEND => Some(usize::from(backend)),
            _ => None,
        }
    }

    /// Starts loading slot `slot` into the cache, without waiting for it. A hint only, for a
    /// packet path that will look it up a little later: the slot array (2 bytes a slot, 128
    /// KiB at the default size) is read at random and is often not in L1 or L2 when a new
    /// flow's packet needs it.
    #[inline(always)]
    pub fn prefetch(&self, slot: Slot) {
        if let Some(s) = self.slots.get(slot.0 as usize) {
            crate::hint::prefetch(s);
        }
    }

    /// The number of slots, `M`.
    #[must_use]
    pub fn size(&self) -> u32 {
        // Built only by `build`, which caps the length at `MAX_SIZE`.
        u32::try_from(self.slots.len()).unwrap_or(u32::MAX)
    }

    /// The slots in order: each an index into the slice given to [`build`], or [`u16::MAX`]
    /// in every slot of an empty table.
    #[must_use]
    pub fn slots(&self) -> &[u16] {
        &self.slots
    }

    /// Whether no backend had weight above 0, so that [`lookup`](Self::lookup) always
    /// returns `None`.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        // A table with any weighted backend has every slot filled, so one slot tells.
        self.slots.first().is_none_or(|&s| s == NO_BACKEND)
    }

    /// Slots held by each of the first `n` backend indices (`result[i]` for index `i`).
    ///
    /// Indices at or beyond `n` are not counted. Meant for tests, benches and metrics, not for
    /// the packet path: it walks the whole table and allocates.
    #[must_use]
    pub fn count_per_backend(&self, n: usize) -> Vec<u32> {
        let mut counts = vec![0u32; n];
        for &backend in &*self.slots {
            if backend == NO_BACKEND {
                continue;
            }
            if let Some(count) = counts.get_mut(usize::from(backend)) {
                *count += 1;
            }
        }
        counts
    }
}

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The slots themselves are up to 16 million lines of noise.
        f.debug_struct("Table")
            .field("size", &self.slots.len())
            .field("empty", &self.is_empty())
            .finish_non_exhaustive()
    }
}

/// How [`Plan::fill`] schedules turns. Both give the same table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    /// Katran's loop: every round, visit every backend in order.
    Rounds,
    /// A min-heap of each backend's next (round, position).
    Heap,
}

/// One weighted backend, in sorted position, ready to walk its permutation.
#[derive(Debug, Clone, Copy)]
struct Walker {
    /// The next slot of its permutation to try.
    next: u32,
    /// Its permutation's stride, in `1..M`.
    skip: u32,
    /// Index into the caller's slice, written into the slots it takes.
    index: u16,
}

/// Validated input, sorted, with each backend's permutation start and stride.
#[derive(Debug)]
struct Plan {
    size: u32,
    /// Weighted backends in `(key, weight)` order.
    walkers: Vec<Walker>,
    /// Weights, parallel to `walkers`; all above 0.
    weights: Vec<u32>,
    /// The largest weight: the credit a backend must earn per slot.
    max_weight: u64,
    /// The sum of `weights`; at most `MAX_BACKENDS * u32::MAX`, below 2^48.
    total_weight: u64,
}

impl Plan {
    fn new(backends: &[Weighted], size: u32) -> Result<Self, BuildError> {
        if backends.len() > MAX_BACKENDS {
            return Err(BuildError::TooManyBackends {
                count: backends.len(),
                max: MAX_BACKENDS,
            });
        }
        if size > MAX_SIZE {
            return Err(BuildError::SizeTooLarge {
                size,
                max: MAX_SIZE,
            });
        }
        if !is_prime(size) {
            return Err(BuildError::SizeNotPrime { size });
        }

        // `0..NO_BACKEND` has exactly MAX_BACKENDS indices, so the zip covers every backend
        // (checked above) without a fallible conversion.
        let mut order: Vec<(u16, Weighted)> = (0..NO_BACKEND)
            .zip(backends.iter().copied())
            .filter(|(_, b)| b.weight > 0)
            .collect();
        if order.len() > size as usize {
            return Err(BuildError::SizeTooSmall {
                size,
                weighted: order.len(),
            });
        }
        // Stable, and on the pair alone: equal pairs stay in input order, and nothing that
        // differs between two equal pairs reaches the table except the index it writes.
        order.sort_by_key(|&(_, b)| (b.key, b.weight));

        let m = u64::from(size);
        let walkers = order
            .iter()
            .map(|&(index, b)| Walker {
                // `h % m < m <= MAX_SIZE` and `h % (m - 1) + 1 < m`: both fit in u32. `size`
                // is prime, so at least 2 and `m - 1 >= 1`.
                next: (hash_words(SEED_OFFSET, &[b.key]) % m) as u32,
                skip: (hash_words(SEED_SKIP, &[b.key]) % (m - 1) + 1) as u32,
                index,
            })
            .collect();
        let weights: Vec<u32> = order.iter().map(|&(_, b)| b.weight).collect();
        let max_weight = weights.iter().copied().max().map_or(0, u64::from);
        let total_weight = weights.iter().copied().map(u64::from).sum();
        Ok(Self {
            size,
            walkers,
            weights,
            max_weight,
            total_weight,
        })
    }

    /// Whether the round loop's `N * max_weight / W` visits per slot stay within
    /// [`LOOP_STEPS_PER_SLOT`]. No overflow: `N * max_weight < 2^16 * 2^32`, and the right
    /// side is below `2^6 * 2^48`.
    fn loop_is_cheap(&self) -> bool {
        (self.walkers.len() as u64) * self.max_weight <= LOOP_STEPS_PER_SLOT * self.total_weight
    }

    fn fill(mut self, fill: Fill) -> Table {
        let size = self.size;
        let mut slots = vec![NO_BACKEND; size as usize].into_boxed_slice();
        if !self.walkers.is_empty() {
            let mut taken = Bitmap::new(size);
            let mut place = |walker: &mut Walker| {
                let slot = walker.take(&mut taken, size);
                slots[slot as usize] = walker.index;
            };
            match fill {
                Fill::Rounds => self.fill_rounds(&mut place),
                Fill::Heap => self.fill_heap(&mut place),
            }
        }
        Table {
            remainder: Remainder::new(slots.len() as u64),
            slots,
        }
    }

    /// Katran's loop: round after round, each backend in sorted order adds its weight to its
    /// credit and, if that reaches `max_weight`, pays it and takes a slot.
    fn fill_rounds(&mut self, place: &mut impl FnMut(&mut Walker)) {
        let max_weight = self.max_weight;
        let mut credit = vec![0u64; self.walkers.len()];
        let mut placed = 0u32;
        // Ends: a backend with the largest weight takes a slot every round, and a take always
        // succeeds while a slot is free (see `Walker::take`).
        loop {
            for ((walker, &weight), credit) in
                self.walkers.iter_mut().zip(&self.weights).zip(&mut credit)
            {
                *credit += u64::from(weight);
                if *credit < max_weight {
                    continue;
                }
                *credit -= max_weight;
                place(walker);
                placed += 1;
                if placed == self.size {
                    return;
                }
            }
        }
    }

    /// The same turns as [`fill_rounds`](Self::fill_rounds), popped from a min-heap of
    /// `(round, position)`, so idle visits cost nothing.
    fn fill_heap(&mut self, place: &mut impl FnMut(&mut Walker)) {
        let max_weight = self.max_weight;
        // Rounds after `round` until a backend left with `credit` has earned `max_weight`
        // again: at least 1, since `credit < weight <= max_weight` after a take.
        let next_round =
            |round: u64, credit: u64, weight: u64| round + (max_weight - credit).div_ceil(weight);
        // A backend in the heap at `(round, i)` takes a slot in `round`, and `credit[i]` is
        // what it has left right after that take. Like the loop, all start at round 0 with
        // no credit. No overflow: credits stay below `2 * max_weight < 2^33`.
        let mut credit = Vec::with_capacity(self.walkers.len());
        let mut heap = BinaryHeap::with_capacity(self.walkers.len());
        for (i, &weight) in (0usize..).zip(&self.weights) {
            let weight = u64::from(weight);
            let first = next_round(0, 0, weight);
            credit.push(first * weight - max_weight);
            heap.push(Reverse((first, i)));
        }
        for _ in 0..self.size {
            // Both `else` arms are unreachable: every pop pushes back, and `i` indexes the
            // vectors it was zipped from. They end the fill rather than panic.
            let Some(Reverse((round, i))) = heap.pop() else {
                return;
            };
            let (Some(walker), Some(&weight), Some(credit)) = (
                self.walkers.get_mut(i),
                self.weights.get(i),
                credit.get_mut(i),
            ) else {
                return;
            };
            place(walker);
            let weight = u64::from(weight);
            let next = next_round(round, *credit, weight);
            *credit = *credit + (next - round) * weight - max_weight;
            heap.push(Reverse((next, i)));
        }
    }
}

impl Walker {
    /// Takes the first free slot in this backend's permutation from `next` on and returns it.
    ///
    /// Terminates whenever a slot is free: the permutation of a prime `size` with
    /// `1 <= skip < size` visits every slot within `size` steps.
    #[inline]
    fn take(&mut self, taken: &mut Bitmap, size: u32) -> u32 {
        // `slot < size` and `skip < size <= MAX_SIZE < 2^24`: the sums stay far below 2^32.
        let mut slot = self.next;
        while taken.contains(slot) {
            slot += self.skip;
            if slot >= size {
                slot -= size;
            }
        }
        taken.insert(slot);
        let mut next = slot + self.skip;
        if next >= size {
            next -= size;
        }
        self.next = next;
        slot
    }
}

/// One bit per slot: whether some backend holds it.
#[derive(Debug)]
struct Bitmap {
    words: Vec<u64>,
}

impl Bitmap {
    fn new(bits: u32) -> Self {
        Self {
            words: vec![0; (bits as usize).div_ceil(64)],
        }
    }

    #[inline]
    fn contains(&self, bit: u32) -> bool {
        self.words
            .get((bit >> 6) as usize)
            .is_some_and(|w| w & (1 << (bit & 63)) != 0)
    }

    #[inline]
    fn insert(&mut self, bit: u32) {
        if let Some(w) = self.words.get_mut((bit >> 6) as usize) {
            *w |= 1 << (bit & 63);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::hash_bytes;

    fn backends(weights: &[u32]) -> Vec<Weighted> {
        (1u64..)
            .zip(weights)
            .map(|(key, &weight)| Weighted { key, weight })
            .collect()
    }

    fn plan_fill(backends: &[Weighted], size: u32, fill: Fill) -> Table {
        match Plan::new(backends, size) {
            Ok(plan) => plan.fill(fill),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn sizes_follow_the_backend_count() {
        for s in SIZES {
            assert!(strait_config::model::is_prime(s), "{s}");
        }
        let min = SIZES[0];
        // 100 slots per backend, from the smallest size up.
        assert_eq!(size_for(0, min), Some(2_039));
        assert_eq!(size_for(20, min), Some(2_039));
        assert_eq!(size_for(21, min), Some(16_381));
        assert_eq!(size_for(163, min), Some(16_381));
        assert_eq!(size_for(164, min), Some(65_537));
        assert_eq!(size_for(655, min), Some(65_537));
        assert_eq!(size_for(656, min), Some(655_373));
        // Past 6,553 backends the balance loosens, up to one slot each.
        assert_eq!(size_for(100_000, min), Some(655_373));
        assert_eq!(size_for(655_373, min), Some(655_373));
        assert_eq!(size_for(655_374, min), None);
        // A larger minimum is kept; a minimum between the sizes is used while it suffices.
        assert_eq!(size_for(3, 65_537), Some(65_537));
        assert_eq!(size_for(700, 65_537), Some(655_373));
        assert_eq!(size_for(30, 4_093), Some(4_093));
        assert_eq!(size_for(41, 4_093), Some(16_381));
        assert_eq!(size_for(2, 251), Some(251));
        assert_eq!(size_for(3, 251), Some(2_039));
    }

    #[test]
    fn primes() {
        let small: Vec<u32> = (0..50).filter(|&n| is_prime(n)).collect();
        assert_eq!(
            small,
            [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47]
        );
        for p in [DEFAULT_SIZE, LARGE_SIZE, MAX_SIZE, 65_521, 131_071] {
            assert!(is_prime(p), "{p}");
        }
        for c in [
            65_535,
            655_371,
            16_777_215,
            25,
            49,
            121,
            65_537 * 3,
            4_294_967_295,
        ] {
            assert!(!is_prime(c), "{c}");
        }
        // MAX_SIZE is the largest prime below 2^24.
        assert!(((MAX_SIZE + 1)..(1 << 24)).all(|n| !is_prime(n)));
        assert!(100 * MAX_BACKENDS < MAX_SIZE as usize);
    }

    #[test]
    fn golden_vector() {
        // Pinned on purpose: a change here re-maps flows on upgrade and splits an ECMP group
        // running mixed versions. Change only together with a release note.
        let input = backends(&[1, 1, 2, 1, 3]);
        let small = build(&input, 13).unwrap();
        assert_eq!(small.slots(), GOLDEN_13);

        let big = build(&input, DEFAULT_SIZE).unwrap();
        let bytes: Vec<u8> = big.slots().iter().flat_map(|s| s.to_le_bytes()).collect();
        assert_eq!(&big.slots()[..13], GOLDEN_65537_HEAD);
        assert_eq!(hash_bytes(0, &bytes), GOLDEN_65537_CHECKSUM);
        assert_eq!(big.count_per_backend(5), GOLDEN_65537_COUNTS);
    }

    // Computed independently by a literal Python transcription of Katran's loop,
    // `(offset + j * skip) % M` with no bitmap, over the same hashes; the Rust agreed.
    const GOLDEN_13: &[u16] = &[3, 0, 4, 2, 1, 4, 1, 4, 2, 2, 4, 0, 4];
    const GOLDEN_65537_HEAD: &[u16] = &[3, 4, 2, 2, 2, 2, 0, 4, 4, 1, 4, 4, 4];
    const GOLDEN_65537_CHECKSUM: u64 = 0xeb05_4b5b_4056_4205;
    // 65537 * w / 8 is 8192.1 for weight 1, 16384.25 for 2 and 24576.4 for 3.
    const GOLDEN_65537_COUNTS: [u32; 5] = [8192, 8192, 16384, 8192, 24577];

    #[test]
    fn loop_and_heap_agree() {
        let cases: &[(&[u32], u32)] = &[
            (&[1], 13),
            (&[5, 5, 5], 13),
            (&[1, 1, 2, 1, 3], 13),
            (&[1, 1, 2, 1, 3], DEFAULT_SIZE),
            (&[1, 0, 1_000_000, 7, 0, 3], DEFAULT_SIZE),
            (&[u32::MAX, 1, u32::MAX - 1, 2], 1_009),
        ];
        for &(weights, size) in cases {
            let input = backends(weights);
            assert_eq!(
                plan_fill(&input, size, Fill::Rounds),
                plan_fill(&input, size, Fill::Heap),
                "weights {weights:?} size {size}"
            );
        }
    }

    #[test]
    fn the_remainder_is_the_division_s_at_the_edges() {
        let mut ds: Vec<u64> = vec![1, 2, 3, 7, 41, 65_537, u64::MAX - 1, u64::MAX, 1 << 63];
        ds.extend(SIZES.map(u64::from));
        for d in ds {
            let r = Remainder::new(d);
            for a in [
                0,
                1,
                d - 1,
                d,
                d.wrapping_add(1),
                u64::MAX,
                u64::MAX - 1,
                u64::MAX / 2,
            ] {
                assert_eq!(r.of(a), a % d, "{a} % {d}");
            }
            for k in [2u64, 3, 1_000_003, u64::MAX / d] {
                let m = k.wrapping_mul(d);
                for a in [m.wrapping_sub(1), m, m.wrapping_add(1)] {
                    assert_eq!(r.of(a), a % d, "{a} % {d}");
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn the_remainder_is_the_division_s(a in proptest::num::u64::ANY, d in 1u64..) {
            proptest::prop_assert_eq!(Remainder::new(d).of(a), a % d);
        }

        #[test]
        fn the_remainder_by_a_table_size_is_the_division_s(
            a in proptest::num::u64::ANY,
            d in proptest::sample::select(SIZES.to_vec()),
        ) {
            proptest::prop_assert_eq!(Remainder::new(u64::from(d)).of(a), a % u64::from(d));
        }

        #[test]
        fn loop_and_heap_agree_on_random_input(
            weights in proptest::collection::vec(0u32..=1_000, 1..40),
            size in proptest::sample::select(vec![41u32, 101, 1_009, 4_099]),
        ) {
            let input = backends(&weights);
            proptest::prop_assert_eq!(
                plan_fill(&input, size, Fill::Rounds),
                plan_fill(&input, size, Fill::Heap)
            );
        }
    }

    #[test]
    fn skewed_weights_take_the_heap_and_stay_fast() {
        // One backend at u32::MAX among 60,000 at weight 1: the loop would visit ~4e9
        // backends per slot. The heap keeps it at M log N.
        let mut input = vec![Weighted {
            key: 0,
            weight: u32::MAX,
        }];
        input.extend((1..60_000).map(|key| Weighted { key, weight: 1 }));
        let plan = Plan::new(&input, DEFAULT_SIZE).unwrap();
        assert!(!plan.loop_is_cheap());
        let table = build(&input, DEFAULT_SIZE).unwrap();
        let counts = table.count_per_backend(input.len());
        assert!(table.slots().iter().all(|&s| s != NO_BACKEND));
        // Its ideal share is 65537 * (2^32 - 1) / (2^32 - 1 + 59999), 65536.08 slots.
        assert!(counts[0] >= 65_535, "{}", counts[0]);
    }

    #[test]
    fn equal_weights_take_the_loop() {
        let plan = Plan::new(&backends(&[3; 1_000]), DEFAULT_SIZE).unwrap();
        assert!(plan.loop_is_cheap());
        let plan = Plan::new(&backends(&[1, 1, 1, 64]), DEFAULT_SIZE).unwrap();
        assert!(plan.loop_is_cheap()); // 4 * 64 <= 64 * 67
                                       // A weight far above the rest matters only with many backends to visit idly.
        let mut skewed = vec![1; 1_000];
        skewed.push(1_000);
        let plan = Plan::new(&backends(&skewed), DEFAULT_SIZE).unwrap();
        assert!(!plan.loop_is_cheap()); // 1001 * 1000 > 64 * 1999
    }

    #[test]
    fn lookup_reads_slot_hash_mod_size() {
        let input = backends(&[1, 2, 3]);
        let table = build(&input, 101).unwrap();
        for hash in [0, 1, 100, 101, 102, u64::MAX, 0x1234_5678_9abc_def0] {
            let slot = (hash % 101) as usize;
            assert_eq!(table.lookup(hash), Some(usize::from(table.slots()[slot])));
        }
        assert_eq!(table.size(), 101);
        assert!(!table.is_empty());
    }

    #[test]
    fn all_zero_weights_give_an_empty_table() {
        for input in [vec![], backends(&[0, 0, 0])] {
            let table = build(&input, 13).unwrap();
            assert!(table.is_empty());
            assert_eq!(table.size(), 13);
            assert!(table.slots().iter().all(|&s| s == u16::MAX));
            assert_eq!(table.lookup(0), None);
            assert_eq!(table.lookup(u64::MAX), None);
            assert_eq!(table.count_per_backend(70_000).iter().sum::<u32>(), 0);
        }
    }

    #[test]
    fn single_backend_owns_every_slot() {
        let input = [Weighted { key: 42, weight: 7 }];
        let table = build(&input, 2).unwrap();
        assert_eq!(table.slots(), [0, 0]);
        let table = build(&input, DEFAULT_SIZE).unwrap();
        assert_eq!(table.count_per_backend(1), [DEFAULT_SIZE]);
    }

    #[test]
    fn size_equal_to_backend_count_gives_one_slot_each() {
        let table = build(&backends(&[1; 13]), 13).unwrap();
        assert_eq!(table.count_per_backend(13), [1; 13]);
    }

    #[test]
    fn weight_zero_backends_keep_their_index_but_get_no_slot() {
        let input = backends(&[0, 4, 0, 4, 0]);
        let table = build(&input, 1_009).unwrap();
        let counts = table.count_per_backend(5);
        assert_eq!(counts[0] + counts[2] + counts[4], 0);
        assert_eq!(counts[1] + counts[3], 1_009);
        // Draining a backend changes the table exactly as removing it does.
        let without = build(&backends(&[0, 4, 0, 4]), 1_009).unwrap();
        assert_eq!(table, without);
    }

    #[test]
    fn errors() {
        let two = backends(&[1, 1]);
        for size in [0, 1, 4, 9, 65_536, 655_371] {
            assert_eq!(build(&two, size), Err(BuildError::SizeNotPrime { size }));
        }
        for size in [MAX_SIZE + 1, 16_777_259, 4_294_967_291, u32::MAX] {
            assert_eq!(
                build(&two, size),
                Err(BuildError::SizeTooLarge {
                    size,
                    max: MAX_SIZE
                })
            );
        }
        assert_eq!(
            build(&backends(&[1; 14]), 13),
            Err(BuildError::SizeTooSmall {
                size: 13,
                weighted: 14
            })
        );
        // Draining backends do not count towards the size.
        assert!(build(&backends(&[1, 0, 1, 0, 1, 0]), 3).is_ok());

        let many = vec![Weighted { key: 1, weight: 0 }; MAX_BACKENDS + 1];
        assert_eq!(
            build(&many, DEFAULT_SIZE),
            Err(BuildError::TooManyBackends {
                count: MAX_BACKENDS + 1,
                max: MAX_BACKENDS
            })
        );
        let most = vec![Weighted { key: 1, weight: 0 }; MAX_BACKENDS];
        assert!(build(&most, DEFAULT_SIZE).unwrap().is_empty());
    }

    #[test]
    fn the_last_index_is_usable() {
        // Index 65534 is a real backend; only 65535 means "none".
        let mut input = vec![Weighted { key: 1, weight: 0 }; MAX_BACKENDS];
        input[MAX_BACKENDS - 1] = Weighted { key: 9, weight: 1 };
        let table = build(&input, 13).unwrap();
        assert!(table
            .slots()
            .iter()
            .all(|&s| usize::from(s) == MAX_BACKENDS - 1));
        assert_eq!(table.lookup(5), Some(MAX_BACKENDS - 1));
    }

    #[test]
    fn error_messages_name_the_numbers() {
        let e = build(&backends(&[1]), 10).unwrap_err();
        assert_eq!(e.to_string(), "Maglev table size 10 is not prime");
    }

    #[test]
    fn debug_is_short() {
        let table = build(&backends(&[1]), DEFAULT_SIZE).unwrap();
        let s = format!("{table:?}");
        assert!(s.len() < 80, "{s}");
    }
}
