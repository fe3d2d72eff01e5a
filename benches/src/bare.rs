//! The reference a pipeline figure is read against: one bare lookup in a hash table of the
//! same flow count, with nothing around it.
//!
//! A forwarder that keeps per-flow state pays at least one lookup of a table far larger than
//! the caches per packet; with millions of flows that lookup is a DRAM access. Ratios to this
//! reference say how much more than that the whole pipeline costs, on the same machine in the
//! same run, so they hold across machines and loads better than nanoseconds do.
//!
//! # Design: honest, neither crippled nor prefetched
//!
//! - **Table.** Open addressing with linear probing, the layout a hand-written C lookup table
//!   would take: a power-of-two array of [`Slot`]s, a 16-byte key and an 8-byte value padded
//!   to 32 bytes, so a slot never straddles two cache lines and two share one. Sized at twice
//!   the flow count rounded up to a power of two (load at most 1/2, as the flow table is
//!   sized), so a hit probes 1.5 slots on average, almost always within one line. Keys are
//!   inserted once, up front, in the order they are looked up. Its memory is the flow
//!   table's: advised to use transparent huge pages before it is first written
//!   ([`strait_dataplane::hint::huge_filled`]), so that neither side pays a page walk
//!   the other does not (with 4 KiB pages a lookup at 8M flows is also a TLB miss, several
//!   nanoseconds on its own).
//! - **Key and hash.** The key is the TCP 4-tuple and protocol of a [`crate::flow`], 13 bytes
//!   packed into two words; the hash is the dataplane's own flow hash
//!   ([`strait_dataplane::hash::hash_words`] under [`SEED_FLOW`]), so the reference pays the
//!   same hash the pipeline does, and no cheaper one. A compare is two `u64` compares.
//! - **Order.** The keys are those of established traffic, looked up in the same shuffled
//!   order ([`crate::established_order`]), cycling, so each lookup finds its slot wherever
//!   the previous pass left it in the cache hierarchy, as the pipeline's flow table does.
//! - **Serial.** One lookup after another in a plain loop, as a C program looping over its
//!   packets would do it: nothing is prefetched and no batch is staged, but the lookups are
//!   independent, so the core's out-of-order window overlaps the misses of a few consecutive
//!   lookups as it would in any straight-line code. A pipeline that only matches a dependent
//!   chain of DRAM misses is not fast; one that comes close to this loop while it also
//!   parses, picks a backend and rewrites hides its memory latency.
//! - **Timing.** As the pipeline's rows: [`BATCH`] lookups per timed batch, each batch timed
//!   on its own, summarised by [`Measurement`] (median of per-batch ns/lookup).

use std::time::{Duration, Instant};

use strait_dataplane::hash::{hash_words, SEED_FLOW};

use crate::{established_order, flow, Measurement, Tuple, BATCH};

/// A 16-byte key (the 4-tuple and protocol in two words) and an 8-byte value, padded to 32
/// bytes so that no slot straddles a cache line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C, align(32))]
pub struct Slot {
    key: [u64; 2],
    value: u64,
}

/// The key of `t`: client address and VIP in one word, ports and protocol (TCP) in the other.
/// Never all zero (client addresses are in 100.64.0.0/10), which marks an empty slot.
pub fn key(t: &Tuple) -> [u64; 2] {
    [
        u64::from(u32::from(t.client)) << 32 | u64::from(u32::from(t.vip)),
        u64::from(t.client_port) << 24 | u64::from(t.port) << 8 | 6,
    ]
}

/// An open-addressing, linear-probing table of [`Slot`]s.
#[derive(Debug)]
pub struct BareTable {
    slots: Box<[Slot]>,
    mask: usize,
}

impl BareTable {
    /// An empty table of `2 * flows` slots rounded up to a power of two (at least 2).
    pub fn with_flows(flows: usize) -> Self {
        let n = (flows * 2).next_power_of_two().max(2);
        Self {
            // The flow table's memory: huge pages where the kernel gives them.
            slots: strait_dataplane::hint::huge_filled(n, Slot::default()),
            mask: n - 1,
        }
    }

    /// Bytes of the slot array.
    pub fn bytes(&self) -> u64 {
        (self.slots.len() * core::mem::size_of::<Slot>()) as u64
    }

    /// Stores `value` under `key` (which is not yet there).
    ///
    /// # Panics
    /// If the table is full.
    pub fn insert(&mut self, key: [u64; 2], value: u64) {
        let mut i = hash_words(SEED_FLOW, &key) as usize & self.mask;
        for _ in 0..self.slots.len() {
            if self.slots[i].key == [0, 0] {
                self.slots[i] = Slot { key, value };
                return;
            }
            i = (i + 1) & self.mask;
        }
        panic!("bare table full");
    }

    /// The value under `key`, if any.
    #[inline(always)]
    pub fn lookup(&self, key: &[u64; 2]) -> Option<u64> {
        let mut i = hash_words(SEED_FLOW, key) as usize & self.mask;
        loop {
            let s = &self.slots[i];
            if s.key == *key {
                return Some(s.value);
            }
            if s.key == [0, 0] {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }
}

/// The reference for `flows` established flows over `services` services: the table with
/// every flow (value: its flow number) and the keys in lookup order.
#[derive(Debug)]
pub struct Bare {
    /// The table.
    pub table: BareTable,
    keys: Vec<[u64; 2]>,
    cursor: usize,
    /// Folds every looked-up value, so no lookup is dead code.
    sink: u64,
}

impl Bare {
    /// The table and keys for `flows` flows (`flows > 0`) of `services` services.
    ///
    /// # Panics
    /// If `flows` is 0.
    pub fn new(flows: usize, services: usize) -> Self {
        assert!(flows > 0, "a lookup needs a flow");
        let keys: Vec<[u64; 2]> = established_order(flows)
            .iter()
            .map(|&f| key(&flow(f, services)))
            .collect();
        let mut table = BareTable::with_flows(flows);
        for (k, f) in keys.iter().zip(established_order(flows)) {
            table.insert(*k, f);
        }
        Self {
            table,
            keys,
            cursor: 0,
            sink: 0,
        }
    }

    /// Bytes of the table and the key array.
    pub fn bytes(&self) -> u64 {
        self.table.bytes() + (self.keys.len() * 16) as u64
    }

    /// [`BATCH`] lookups, one after another, timed.
    ///
    /// # Panics
    /// If a key is missing (the table would not be the reference).
    pub fn batch(&mut self) -> Duration {
        let n = self.keys.len();
        let mut cursor = self.cursor;
        let mut sink = self.sink;
        let start = Instant::now();
        for _ in 0..BATCH {
            let v = self
                .table
                .lookup(&self.keys[cursor])
                .expect("every key is in the table");
            sink = sink.wrapping_add(v);
            cursor += 1;
            if cursor == n {
                cursor = 0;
            }
        }
        let spent = start.elapsed();
        self.cursor = cursor;
        self.sink = std::hint::black_box(sink);
        spent
    }

    /// Runs batches until `time` of lookup time has been measured, and at least
    /// [`MIN_BATCHES`], after one untimed pass over the keys (as the pipeline's warm-up).
    pub fn measure(&mut self, time: Duration) -> Measurement {
        for _ in 0..self.keys.len().div_ceil(BATCH) {
            let _ = self.batch();
        }
        crate::measure_batches(time, || self.batch())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MIN_BATCHES;

    #[test]
    fn every_flow_is_found_and_others_are_not() {
        let b = Bare::new(10_000, 100);
        assert_eq!(b.table.bytes(), 32_768 * 32);
        for (k, f) in b.keys.iter().zip(established_order(10_000)) {
            assert_eq!(b.table.lookup(k), Some(f));
        }
        for f in 10_000..11_000 {
            assert_eq!(b.table.lookup(&key(&flow(f, 100))), None);
        }
        assert_eq!(core::mem::size_of::<Slot>(), 32);
    }

    #[test]
    fn keys_are_distinct_and_never_empty() {
        let mut seen = std::collections::HashSet::new();
        for f in 0..100_000 {
            let k = key(&flow(f, 1000));
            assert_ne!(k, [0, 0]);
            assert!(seen.insert(k));
        }
    }

    #[test]
    fn measure_cycles_through_the_keys() {
        let mut b = Bare::new(3_000, 10);
        let m = b.measure(Duration::ZERO);
        assert_eq!(m.batches(), MIN_BATCHES);
        assert_eq!(
            b.cursor,
            (3_000usize.div_ceil(BATCH) + MIN_BATCHES) * BATCH % 3_000
        );
        let order = established_order(3_000);
        let lookups = (3_000usize.div_ceil(BATCH) + MIN_BATCHES) * BATCH;
        let expected = (0..lookups).fold(0u64, |s, i| s.wrapping_add(order[i % 3_000]));
        assert_eq!(b.sink, expected, "each lookup found its flow, in order");
    }
}
