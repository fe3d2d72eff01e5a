//! Cross-core handoff: bounded single-producer single-consumer rings between workers.
//!
//! A `nat` flow is owned by one core ([`crate::pipeline::owner_core`] of the client's address
//! and port), and its replies may arrive on another core's queue. That core's pipeline returns
//! `Verdict::Handoff { core }`; the worker copies the frame into a slot of its ring to the
//! owner, and the owner's worker drains its inbound rings every turn, copies each frame into a
//! free frame of its own UMEM and runs it through its own pipeline.
//!
//! ```text
//!   worker 0 ──ring 0→1──► worker 1        one ring per ordered pair of workers:
//!      ▲                      │            N workers, N·(N-1) rings
//!      └──────ring 1→0────────┘
//! ```
//!
//! Decisions:
//!
//! - **A copy, not a frame reference.** Handing a UMEM frame itself to another core would tie
//!   the UMEMs of two workers together (frames returning to a fill ring they did not come
//!   from, free lists shared between threads). Handoff is the uncommon path (only nat traffic
//!   that lands on a queue other than its owner's), so each frame is copied twice (into the
//!   slot, out of it into the owner's UMEM) and every UMEM stays owned by one thread.
//! - **One SPSC ring per ordered pair**, hand-written rather than `crossbeam`'s MPMC
//!   `ArrayQueue`: the slot is written and read in place (an `ArrayQueue<[u8; N]>` would move
//!   each frame through the stack twice more), each side touches the other's index only when
//!   its cached copy says the ring is full or empty, and the two halves ([`HandoffTx`],
//!   [`HandoffRx`]) are the only handles, neither `Clone`, so "single producer, single
//!   consumer" is a fact of the types rather than a convention.
//! - **Bounded, allocated once.** [`Handoff::mesh`] allocates every slot; the loop never
//!   allocates. A full ring drops the frame and counts it (the sender's
//!   [`super::WorkerStats::handoff_full`]): backpressure would stall the sender's own queue for
//!   a stalled owner.
//!
//! Memory ordering, the classic Lamport queue: the producer writes a slot, then publishes it
//! with a release store of `tail`; the consumer's acquire load of `tail` makes the slot's
//! bytes visible before it reads them. The consumer reads a slot, then frees it with a release
//! store of `head`; the producer's acquire load of `head` orders those reads before its next
//! write of the slot. Indices grow without bound and wrap at 2^32; the ring's size is a power
//! of two, so `index & mask` stays consistent across the wrap.

use std::cell::UnsafeCell;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::umem::MAX_PACKET;

/// Slots per ring. Two RX batches ([`super::BATCH`] frames each): the owner drains its inbound
/// rings every turn, and one turn of the sender hands off at most a batch per socket of its
/// group, so the ring overflows only when the owner is more than a turn behind (descheduled,
/// or stalled). Memory is `slots × slot size` per ordered pair of workers: 128 × 1536 B = 192
/// KiB at MTU 1500, 0.4 MiB for two workers, 45 MiB for sixteen.
pub const HANDOFF_SLOTS: u32 = 128;

/// Bytes of Ethernet framing in front of an MTU-sized IP packet: the Ethernet header (14)
/// and one 802.1Q tag (4), the most the parser accepts.
const L2_OVERHEAD: usize = 18;

/// Slot stride alignment: a cache line, so two slots never share one.
const SLOT_ALIGN: usize = 64;

/// A cache-line-padded index: the producer's and the consumer's indices on lines of their
/// own, so neither side's writes invalidate the line the other side reads. 128 bytes because
/// x86 prefetches cache lines in adjacent pairs (as `crossbeam_utils::CachePadded` does).
#[repr(align(128))]
#[derive(Debug, Default)]
struct Padded(AtomicU32);

/// What a slot carries besides the bytes.
#[derive(Clone, Copy, Debug, Default)]
struct Meta {
    /// Frame length.
    len: u16,
    /// The table port the frame arrived on.
    ingress: u8,
}

/// The shared part of one ring.
struct Ring {
    /// The consumer's index: slots before it are free for the producer.
    head: Padded,
    /// The producer's index: slots before it (and from `head`) hold frames.
    tail: Padded,
    mask: u32,
    /// Bytes between two slots' starts.
    stride: usize,
    /// Largest frame a slot holds.
    max_len: usize,
    meta: Box<[UnsafeCell<Meta>]>,
    data: Box<[UnsafeCell<u8>]>,
}

// SAFETY: the ring is shared by exactly one producer (HandoffTx) and one consumer
// (HandoffRx), which may run on different threads. The cells are partitioned by the indices:
// the producer writes only slots in [tail, head + size), the consumer reads only slots in
// [head, tail), and each side moves its index with a release store after its access and reads
// the other's with an acquire load before it (module docs), so no slot is accessed by both at
// once and every access is ordered after the other side's last one. Everything else is
// immutable after construction.
unsafe impl Sync for Ring {}

impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring")
            .field("head", &self.head.0.load(Ordering::Relaxed))
            .field("tail", &self.tail.0.load(Ordering::Relaxed))
            .field("slots", &(self.mask + 1))
            .field("max_len", &self.max_len)
            .finish_non_exhaustive()
    }
}

impl Ring {
    fn new(cfg: &HandoffConfig) -> Self {
        let slots = cfg.slots.max(1).next_power_of_two();
        let max_len = cfg.slot_bytes.clamp(1, MAX_PACKET);
        let stride = max_len.div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
        Self {
            head: Padded::default(),
            tail: Padded::default(),
            mask: slots - 1,
            stride,
            max_len,
            meta: (0..slots)
                .map(|_| UnsafeCell::new(Meta::default()))
                .collect(),
            data: (0..slots as usize * stride)
                .map(|_| UnsafeCell::new(0))
                .collect(),
        }
    }

    /// Start of slot `i`'s bytes. The pointer is derived from the whole `data` slice, so it
    /// may be used for the slot's `stride` bytes.
    #[inline(always)]
    fn slot(&self, i: usize) -> *mut u8 {
        debug_assert!(i <= self.mask as usize);
        // SAFETY: `i <= mask`, so `i * stride` is below `data.len()` (`(mask + 1) * stride`).
        UnsafeCell::raw_get(unsafe { self.data.as_ptr().add(i * self.stride) })
    }
}

/// Why a frame could not be handed off. Each is counted by the sending worker and the frame
/// dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandoffError {
    /// The ring to the owner is full: the owner is more than a turn behind.
    Full,
    /// The frame is longer than a slot ([`HandoffConfig::slot_bytes`]).
    TooBig,
    /// No ring to that core: the core is this worker itself or beyond the mesh (a pipeline
    /// configured with more cores than there are workers).
    NoRing,
}

/// Sizes of the handoff rings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandoffConfig {
    /// Slots per ring, rounded up to a power of two.
    pub slots: u32,
    /// Largest frame a slot holds (clamped to what a UMEM frame holds, 3776 bytes); longer
    /// frames are dropped as [`HandoffError::TooBig`].
    pub slot_bytes: usize,
}

impl HandoffConfig {
    /// [`HANDOFF_SLOTS`] slots, each large enough for a frame of an interface with MTU `mtu`
    /// (plus Ethernet header and one VLAN tag).
    pub fn for_mtu(mtu: u16) -> Self {
        Self {
            slots: HANDOFF_SLOTS,
            slot_bytes: (mtu as usize + L2_OVERHEAD).min(MAX_PACKET),
        }
    }
}

impl Default for HandoffConfig {
    /// For MTU 1500.
    fn default() -> Self {
        Self::for_mtu(1500)
    }
}

/// The producer half of a ring.
#[derive(Debug)]
pub struct HandoffTx {
    ring: Arc<Ring>,
    /// Next slot to write; equal to the shared `tail` between calls.
    tail: u32,
    /// `head` as last read: slots in [tail, head + size) are known to be free.
    head: u32,
}

impl HandoffTx {
    /// Copies `frame`, received on table port `ingress`, into the next slot and publishes it.
    ///
    /// # Errors
    /// [`HandoffError::TooBig`] for a frame longer than a slot, [`HandoffError::Full`] when
    /// every slot holds an unread frame; the ring is unchanged either way.
    #[inline]
    pub fn push(&mut self, ingress: u8, frame: &[u8]) -> Result<(), HandoffError> {
        let r = &*self.ring;
        if frame.len() > r.max_len {
            return Err(HandoffError::TooBig);
        }
        let size = r.mask + 1;
        if self.tail.wrapping_sub(self.head) == size {
            // Acquire: the consumer's reads of the slots it freed happen before our writes.
            self.head = r.head.0.load(Ordering::Acquire);
            if self.tail.wrapping_sub(self.head) == size {
                return Err(HandoffError::Full);
            }
        }
        let i = (self.tail & r.mask) as usize;
        // SAFETY: slot `i` is free: `tail - head < size`, so it lies in [tail, head + size),
        // which the consumer has released (we acquired `head`) and will not read before we
        // publish `tail + 1` below. `frame.len() <= max_len <= stride` bytes fit in the slot,
        // and `frame` (our caller's memory) cannot overlap the ring's own allocation. This
        // handle is the ring's only producer (not Clone, `&mut self`).
        unsafe {
            std::ptr::copy_nonoverlapping(frame.as_ptr(), r.slot(i), frame.len());
            *r.meta[i].get() = Meta {
                len: frame.len() as u16,
                ingress,
            };
        }
        self.tail = self.tail.wrapping_add(1);
        // Release: the slot's writes happen before the consumer sees the new tail.
        r.tail.0.store(self.tail, Ordering::Release);
        Ok(())
    }
}

/// The consumer half of a ring.
#[derive(Debug)]
pub struct HandoffRx {
    ring: Arc<Ring>,
    /// Next slot to read; equal to the shared `head` between calls.
    head: u32,
    /// `tail` as last read: slots in [head, tail) are known to hold frames.
    tail: u32,
}

impl HandoffRx {
    /// Whether a frame is waiting (re-reads the producer's index only if none is known).
    #[inline]
    pub fn is_ready(&mut self) -> bool {
        if self.head == self.tail {
            self.tail = self.ring.tail.0.load(Ordering::Acquire);
        }
        self.head != self.tail
    }

    /// Gives the oldest frame and the table port it arrived on to `f`, in place, then frees
    /// its slot. `None` when the ring is empty.
    #[inline]
    pub fn pop<R>(&mut self, f: impl FnOnce(u8, &[u8]) -> R) -> Option<R> {
        if !self.is_ready() {
            return None;
        }
        let r = &*self.ring;
        let i = (self.head & r.mask) as usize;
        // SAFETY: slot `i` lies in [head, tail), published by the producer (we acquired
        // `tail`), which will not write it again before we release `head + 1` below; the
        // producer wrote `meta.len <= max_len <= stride` bytes of it. This handle is the
        // ring's only consumer (not Clone, `&mut self`), and the slice does not outlive `f`
        // (its lifetime is local to this call).
        let (meta, bytes) = unsafe {
            let meta = *r.meta[i].get();
            let bytes = std::slice::from_raw_parts(r.slot(i).cast_const(), meta.len as usize);
            (meta, bytes)
        };
        let out = f(meta.ingress, bytes);
        self.head = self.head.wrapping_add(1);
        // Release: our reads of the slot happen before the producer may overwrite it.
        r.head.0.store(self.head, Ordering::Release);
        Some(out)
    }
}

/// One worker's ends of the mesh: a ring to every other worker and a ring from each.
#[derive(Debug)]
pub struct Handoff {
    core: usize,
    /// Indexed by destination core; `None` at our own index.
    to: Vec<Option<HandoffTx>>,
    /// One per other worker.
    from: Vec<HandoffRx>,
    /// Inbound ring to drain first next turn, so a busy ring does not starve the others.
    next: usize,
}

impl Handoff {
    /// The ends for `workers` workers, in core order: element `c` belongs to the worker whose
    /// pipeline is core `c` of `workers`. Allocates every ring now.
    pub fn mesh(workers: usize, cfg: &HandoffConfig) -> Vec<Handoff> {
        let mut ends: Vec<Handoff> = (0..workers)
            .map(|core| Handoff {
                core,
                to: (0..workers).map(|_| None).collect(),
                from: Vec::with_capacity(workers.saturating_sub(1)),
                next: 0,
            })
            .collect();
        for src in 0..workers {
            for dst in (0..workers).filter(|&d| d != src) {
                let ring = Arc::new(Ring::new(cfg));
                ends[src].to[dst] = Some(HandoffTx {
                    ring: Arc::clone(&ring),
                    tail: 0,
                    head: 0,
                });
                ends[dst].from.push(HandoffRx {
                    ring,
                    head: 0,
                    tail: 0,
                });
            }
        }
        ends
    }

    /// The ends of a lone worker: no rings; every handoff fails with
    /// [`HandoffError::NoRing`].
    pub fn none() -> Self {
        Self {
            core: 0,
            to: Vec::new(),
            from: Vec::new(),
            next: 0,
        }
    }

    /// The core these ends belong to.
    pub fn core(&self) -> usize {
        self.core
    }

    /// Hands `frame`, received on table port `ingress`, to worker `core`.
    ///
    /// # Errors
    /// [`HandoffError`]: no ring to `core`, ring full, frame too big.
    #[inline]
    pub fn send(&mut self, core: u16, ingress: u8, frame: &[u8]) -> Result<(), HandoffError> {
        match self.to.get_mut(core as usize) {
            Some(Some(tx)) => tx.push(ingress, frame),
            _ => Err(HandoffError::NoRing),
        }
    }

    /// Whether any inbound ring holds a frame.
    #[inline]
    pub fn is_ready(&mut self) -> bool {
        self.from.iter_mut().any(HandoffRx::is_ready)
    }

    /// Gives up to `max` inbound frames to `f` (ingress port, bytes), taking the rings in
    /// turn from where the last drain stopped. Returns how many.
    #[inline]
    pub fn drain(&mut self, max: usize, mut f: impl FnMut(u8, &[u8])) -> usize {
        let rings = self.from.len();
        let mut n = 0;
        for k in 0..rings {
            let at = (self.next + k) % rings;
            while n < max {
                if self.from[at].pop(&mut f).is_none() {
                    break;
                }
                n += 1;
            }
            if n == max {
                // Start with the next ring next time.
                self.next = (at + 1) % rings;
                return n;
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(slots: u32, slot_bytes: usize) -> (HandoffTx, HandoffRx) {
        let mut m = Handoff::mesh(2, &HandoffConfig { slots, slot_bytes });
        let mut b = m.pop().expect("two ends");
        let mut a = m.pop().expect("two ends");
        let tx = a.to[1].take().expect("ring 0 -> 1");
        let rx = b.from.pop().expect("ring into 1");
        (tx, rx)
    }

    fn frame(seq: u32, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (seq as usize).wrapping_mul(31).wrapping_add(i) as u8)
            .collect()
    }

    #[test]
    fn frames_come_out_in_order_with_their_ingress() {
        let (mut tx, mut rx) = pair(4, 256);
        assert!(!rx.is_ready());
        assert_eq!(rx.pop(|_, _| ()), None);
        for seq in 0..3 {
            tx.push(seq as u8, &frame(seq, 60 + seq as usize))
                .expect("room");
        }
        for seq in 0..3 {
            let (ingress, bytes) = rx.pop(|i, b| (i, b.to_vec())).expect("a frame");
            assert_eq!(ingress, seq as u8);
            assert_eq!(bytes, frame(seq, 60 + seq as usize));
        }
        assert_eq!(rx.pop(|_, _| ()), None);
    }

    #[test]
    fn a_full_ring_refuses_and_recovers_across_the_index_wrap() {
        let (mut tx, mut rx) = pair(4, 64);
        // Start near the wrap of the u32 indices.
        let start = u32::MAX - 5;
        for (t, h) in [(&mut tx.tail, &mut tx.head), (&mut rx.tail, &mut rx.head)] {
            *t = start;
            *h = start;
        }
        tx.ring.head.0.store(start, Ordering::Relaxed);
        tx.ring.tail.0.store(start, Ordering::Relaxed);
        let mut next_in = 0u32;
        let mut next_out = 0u32;
        for _ in 0..6 {
            for _ in 0..4 {
                tx.push(0, &frame(next_in, 64)).expect("room");
                next_in += 1;
            }
            assert_eq!(tx.push(0, &frame(99, 1)), Err(HandoffError::Full));
            for _ in 0..4 {
                let got = rx.pop(|_, b| b.to_vec()).expect("a frame");
                assert_eq!(got, frame(next_out, 64));
                next_out += 1;
            }
        }
        assert!(tx.tail < start, "the indices wrapped");
    }

    #[test]
    fn a_frame_longer_than_a_slot_is_refused() {
        let (mut tx, mut rx) = pair(2, 100);
        assert_eq!(tx.push(0, &[0; 101]), Err(HandoffError::TooBig));
        assert_eq!(tx.push(0, &[0; 100]), Ok(()));
        assert_eq!(rx.pop(|_, b| b.len()), Some(100));
    }

    #[test]
    fn sizes_are_derived_from_the_mtu() {
        assert_eq!(HandoffConfig::default().slot_bytes, 1518);
        assert_eq!(HandoffConfig::for_mtu(9000).slot_bytes, MAX_PACKET);
        let r = Ring::new(&HandoffConfig {
            slots: 100,
            slot_bytes: 1518,
        });
        assert_eq!(r.mask + 1, 128, "rounded up to a power of two");
        assert_eq!(r.stride, 1536);
    }

    #[test]
    fn the_mesh_connects_every_ordered_pair_once() {
        let mut m = Handoff::mesh(3, &HandoffConfig::default());
        assert_eq!(m.iter().map(Handoff::core).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(
            m[0].send(0, 0, &[1]),
            Err(HandoffError::NoRing),
            "not to itself"
        );
        assert_eq!(
            m[0].send(3, 0, &[1]),
            Err(HandoffError::NoRing),
            "beyond the mesh"
        );
        m[0].send(2, 7, &[0xa]).expect("0 -> 2");
        m[1].send(2, 8, &[0xb]).expect("1 -> 2");
        m[2].send(0, 9, &[0xc]).expect("2 -> 0");
        assert!(!m[1].is_ready());
        let mut got = Vec::new();
        assert_eq!(m[2].drain(8, |i, b| got.push((i, b[0]))), 2);
        got.sort_unstable();
        assert_eq!(got, [(7, 0xa), (8, 0xb)]);
        assert!(m[0].is_ready());
        assert_eq!(m[0].drain(8, |_, _| ()), 1);
        assert!(Handoff::none().send(1, 0, &[1]).is_err());
    }

    #[test]
    fn drain_is_bounded_and_takes_the_rings_in_turn() {
        let mut m = Handoff::mesh(3, &HandoffConfig::default());
        for k in 0..4u8 {
            m[0].send(2, 0, &[k]).expect("room");
            m[1].send(2, 1, &[k]).expect("room");
        }
        let mut order = Vec::new();
        assert_eq!(m[2].drain(3, |i, _| order.push(i)), 3);
        assert_eq!(m[2].drain(3, |i, _| order.push(i)), 3);
        assert_eq!(m[2].drain(3, |i, _| order.push(i)), 2);
        // First drain: three from the first ring; the second starts at the other ring.
        assert_eq!(order[..3], [0, 0, 0]);
        assert_eq!(order[3], 1);
        assert_eq!(order.iter().filter(|&&i| i == 0).count(), 4);
    }

    #[test]
    fn frames_cross_threads_intact_and_in_order() {
        const N: u32 = if cfg!(miri) { 2_000 } else { 200_000 };
        let (mut tx, mut rx) = pair(64, 256);
        let producer = std::thread::spawn(move || {
            let mut full = 0u64;
            for seq in 0..N {
                let f = frame(seq, 1 + (seq % 200) as usize);
                while tx.push((seq % 251) as u8, &f) == Err(HandoffError::Full) {
                    full += 1;
                    std::hint::spin_loop();
                }
            }
            full
        });
        let mut seq = 0;
        while seq < N {
            let ok = rx.pop(|ingress, b| {
                ingress == (seq % 251) as u8 && b == frame(seq, 1 + (seq % 200) as usize)
            });
            match ok {
                Some(true) => seq += 1,
                Some(false) => panic!("frame {seq} corrupted or out of order"),
                None => std::hint::spin_loop(),
            }
        }
        producer.join().expect("producer");
        assert_eq!(rx.pop(|_, _| ()), None);
    }
}
