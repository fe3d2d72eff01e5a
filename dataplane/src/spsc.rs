//! A bounded single-producer single-consumer ring of fixed-size messages of `W` machine
//! words, between a worker and another thread, with no lock and no `unsafe`.
//!
//! The handoff ring's design (`xsk::handoff`: Lamport queue, cache-padded indices, each side
//! caching the other's index, allocated once, full means the producer is told and the ring
//! is unchanged) with slots of `W` `AtomicU64` words instead of raw bytes. Relaxed word
//! stores compile to plain stores, and the slot needs no `unsafe`, so the ring lives in the
//! sans-IO core and is testable without AF_XDP. Words are written relaxed and published by
//! the release store of `tail`; the consumer's acquire load of `tail` makes them visible.
//!
//! Flow sync's record rings ([`crate::sync`], 8 words a record) and the explain desk's
//! query and answer rings ([`crate::explain`]) are rings of this kind.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A cache-line-padded index (128 bytes: x86 prefetches lines in adjacent pairs).
#[repr(align(128))]
#[derive(Debug, Default)]
struct Padded(AtomicU64);

#[derive(Debug)]
struct Ring<const W: usize> {
    head: Padded,
    tail: Padded,
    mask: u64,
    slots: Box<[[AtomicU64; W]]>,
}

/// The producer half of a ring. Not `Clone`: one producer.
#[derive(Debug)]
pub struct Tx<const W: usize> {
    ring: Arc<Ring<W>>,
    tail: u64,
    head: u64,
}

/// The consumer half of a ring. Not `Clone`: one consumer.
#[derive(Debug)]
pub struct Rx<const W: usize> {
    ring: Arc<Ring<W>>,
    head: u64,
    tail: u64,
}

/// A ring of `slots` messages (rounded up to a power of two), allocated now.
pub fn ring<const W: usize>(slots: u32) -> (Tx<W>, Rx<W>) {
    let n = u64::from(slots.max(1).next_power_of_two());
    let ring = Arc::new(Ring {
        head: Padded::default(),
        tail: Padded::default(),
        mask: n - 1,
        slots: (0..n)
            .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
            .collect(),
    });
    (
        Tx {
            ring: Arc::clone(&ring),
            tail: 0,
            head: 0,
        },
        Rx {
            ring,
            head: 0,
            tail: 0,
        },
    )
}

impl<const W: usize> Tx<W> {
    /// Free slots, re-reading the consumer's index only when the cached one says fewer than
    /// `want` are free.
    #[inline]
    pub fn room(&mut self, want: u64) -> u64 {
        let size = self.ring.mask + 1;
        let mut free = size - self.tail.wrapping_sub(self.head);
        if free < want {
            // Acquire: the consumer's reads of freed slots happen before our writes.
            self.head = self.ring.head.0.load(Ordering::Acquire);
            free = size - self.tail.wrapping_sub(self.head);
        }
        free
    }

    /// Whether the consumer has taken every message published so far.
    pub fn is_drained(&mut self) -> bool {
        let size = self.ring.mask + 1;
        self.room(size) == size
    }

    /// Publishes `words`; `false` (ring unchanged) when full.
    #[inline]
    pub fn push(&mut self, words: &[u64; W]) -> bool {
        if self.room(1) == 0 {
            return false;
        }
        let slot = &self.ring.slots[(self.tail & self.ring.mask) as usize];
        for (s, &w) in slot.iter().zip(words) {
            s.store(w, Ordering::Relaxed);
        }
        self.tail = self.tail.wrapping_add(1);
        // Release: the slot's words happen before the consumer sees the new tail.
        self.ring.tail.0.store(self.tail, Ordering::Release);
        true
    }
}

impl<const W: usize> Rx<W> {
    /// Whether a message is waiting. While none is, this is one load of the producer's
    /// index.
    #[inline]
    pub fn is_ready(&mut self) -> bool {
        if self.head == self.tail {
            self.tail = self.ring.tail.0.load(Ordering::Acquire);
        }
        self.head != self.tail
    }

    /// Whether a message may be waiting: one relaxed load of the producer's index, for a
    /// loop that asks on every turn. A `true` is confirmed (with the ordering the slot
    /// needs) by [`Rx::pop`].
    #[inline(always)]
    pub fn peek(&self) -> bool {
        self.head != self.ring.tail.0.load(Ordering::Relaxed)
    }

    /// The oldest message, or `None` when empty.
    #[inline]
    pub fn pop(&mut self) -> Option<[u64; W]> {
        if !self.is_ready() {
            return None;
        }
        let slot = &self.ring.slots[(self.head & self.ring.mask) as usize];
        let mut w = [0u64; W];
        for (w, s) in w.iter_mut().zip(slot.iter()) {
            *w = s.load(Ordering::Relaxed);
        }
        self.head = self.head.wrapping_add(1);
        // Release: our reads of the slot happen before the producer may overwrite it.
        self.ring.head.0.store(self.head, Ordering::Release);
        Some(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_refuses_when_full_and_recovers() {
        let (mut tx, mut rx) = ring::<3>(3);
        assert!(rx.pop().is_none());
        for i in 0..4u64 {
            assert!(tx.push(&[i, i + 1, i + 2]));
        }
        assert!(!tx.push(&[9, 9, 9]), "full at 4 (3 rounded up)");
        assert_eq!(rx.pop(), Some([0, 1, 2]));
        assert!(tx.push(&[4, 5, 6]));
        for i in 1..5u64 {
            assert_eq!(rx.pop(), Some([i, i + 1, i + 2]));
        }
        assert!(tx.is_drained());
    }
}
