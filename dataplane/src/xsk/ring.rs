//! The four AF_XDP rings: single-producer single-consumer queues shared with the kernel
//! through a mapping of the socket.
//!
//! Protocol (Documentation/networking/af_xdp.rst, and libxdp's `xsk.h` which implements the
//! same): a ring is `size` (a power of two) descriptors plus a producer and a consumer index
//! that only ever grow (wrapping at 2^32). The producer writes descriptors at
//! `producer & mask`, then publishes them with a release store of the producer index; the
//! consumer acquires the producer index, reads descriptors, then hands the slots back with a
//! release store of the consumer index. Each side keeps cached copies of both indices and
//! re-reads the other side's only when the cache says the ring looks full (producer) or empty
//! (consumer), so the common case touches no shared cache line. The `flags` word carries
//! `XDP_RING_NEED_WAKEUP`.
//!
//! [`Producer`] is our side of the fill and TX rings, [`Consumer`] of the RX and completion
//! rings. Descriptors are reached only through two borrows that cannot go past what the
//! protocol gives us (s2n-quic-xdp's ring cursors hand out slices bounded the same way):
//!
//! - [`Producer::reserve`] returns a [`Reservation`] of at most the free slots; its
//!   [`Reservation::push`] writes the next one and panics past the reservation, and
//!   [`Reservation::submit`] (or [`Producer::submit`]) publishes what was written, in order.
//!   A descriptor is never published without having been written.
//! - [`Consumer::peek`] returns a [`Peek`] of at most the published slots; [`Peek::iter`]
//!   reads exactly those, and [`Peek::release`] hands them back.
//!
//! A window wider than the ring (indices from a kernel that broke the protocol) counts as
//! empty, so such a kernel stalls the ring instead of sharing a slot with us. The only
//! pointer arithmetic is in [`RawRing`], over indices these two types produce.
//!
//! The kernel's layout of a ring (`getsockopt(XDP_MMAP_OFFSETS)`) is checked by [`Layout`]
//! before the ring is mapped: the producer, consumer and flags words and the descriptor
//! array lie inside the mapping, aligned for their types and pairwise disjoint, and the size is
//! a power of two. Every pointer into the mapping relies on that check.

use std::io;
use std::marker::PhantomData;
use std::mem::{align_of, size_of};
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::net::xdp::{XdpDesc, XdpRingFlags, XdpRingOffset};

use super::mmap::Mmap;

/// The type of a ring's descriptors: `u64` frame addresses (fill and completion rings) or
/// [`XdpDesc`] (RX and TX rings).
///
/// # Safety
/// Every bit pattern of `size_of::<Self>()` bytes is a valid value of the type, and the type
/// has no padding: the other side of a ring (the kernel) writes the bytes we read as `Self`.
pub(crate) unsafe trait Descriptor: Copy {}

// SAFETY: a plain integer: every bit pattern is valid, no padding.
unsafe impl Descriptor for u64 {}

// `struct xdp_desc`: u64 addr, u32 len, u32 options, no padding.
const _: () = assert!(size_of::<XdpDesc>() == 16 && align_of::<XdpDesc>() == 8);

// SAFETY: `repr(C)` of a u64, a u32 and a `repr(transparent)` u32 bit set that keeps unknown
// bits (bitflags), 16 bytes without padding (asserted above), so every bit pattern is valid.
unsafe impl Descriptor for XdpDesc {}

/// Why the ring layout the kernel reported is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The ring size is not a power of two (the index mask would skip or repeat slots).
    #[error("ring size {0} is not a power of two")]
    Size(u32),
    /// The kernel reports no flags word: Linux before 5.4, without `XDP_RING_NEED_WAKEUP`.
    #[error("no flags word (kernel before 5.4, without need_wakeup)")]
    NoFlags,
    /// The descriptor array ends beyond the address space.
    #[error("descriptors at offset {desc} do not fit in the address space")]
    TooLarge {
        /// Offset of the descriptor array.
        desc: u64,
    },
    /// A part of the ring leaves the mapping.
    #[error("{part} at offset {offset} ({bytes} bytes) leaves the {mapping}-byte mapping")]
    OutOfBounds {
        /// `producer`, `consumer`, `flags` or `descriptors`.
        part: &'static str,
        /// Its offset in the mapping.
        offset: u64,
        /// Its length.
        bytes: usize,
        /// The mapping's length.
        mapping: usize,
    },
    /// A part of the ring is not aligned for its type.
    #[error("{part} at offset {offset} is not aligned to {align} bytes")]
    Misaligned {
        /// `producer`, `consumer`, `flags` or `descriptors`.
        part: &'static str,
        /// Its offset in the mapping.
        offset: u64,
        /// The alignment its type needs.
        align: usize,
    },
    /// Two parts of the ring share bytes.
    #[error("{0} and {1} overlap")]
    Overlap(&'static str, &'static str),
}

/// Where a ring's parts are in its mapping, checked by [`Layout::check`]: the words and the
/// `size` descriptors of type `T` inside `len` bytes, aligned (relative to a mapping start
/// aligned for all of them) and disjoint.
#[derive(Debug)]
pub(crate) struct Layout<T> {
    producer: usize,
    consumer: usize,
    flags: usize,
    desc: usize,
    size: u32,
    len: usize,
    _desc: PhantomData<T>,
}

impl<T: Descriptor> Layout<T> {
    /// The layout of a ring of `size` descriptors at offsets `off`, in a mapping that ends
    /// with the descriptor array (the length the kernel maps for it).
    pub(crate) fn new(off: &XdpRingOffset, size: u32) -> Result<Self, LayoutError> {
        let len = usize::try_from(off.desc)
            .ok()
            .zip((size as usize).checked_mul(size_of::<T>()))
            .and_then(|(desc, bytes)| desc.checked_add(bytes))
            .ok_or(LayoutError::TooLarge { desc: off.desc })?;
        Self::check(off, size, len)
    }

    /// Checks offsets `off` for a ring of `size` descriptors against a mapping of `len` bytes.
    pub(crate) fn check(off: &XdpRingOffset, size: u32, len: usize) -> Result<Self, LayoutError> {
        if !size.is_power_of_two() {
            return Err(LayoutError::Size(size));
        }
        let flags = off.flags.ok_or(LayoutError::NoFlags)?;
        let desc_bytes = (size as usize)
            .checked_mul(size_of::<T>())
            .ok_or(LayoutError::TooLarge { desc: off.desc })?;
        let word = (size_of::<AtomicU32>(), align_of::<AtomicU32>());
        let parts = [
            ("producer", off.producer, word),
            ("consumer", off.consumer, word),
            ("flags", flags, word),
            ("descriptors", off.desc, (desc_bytes, align_of::<T>())),
        ];
        let mut spans = [(0usize, 0usize); 4];
        for (span, &(part, offset, (bytes, align))) in spans.iter_mut().zip(&parts) {
            let start = usize::try_from(offset).ok();
            let end = start.and_then(|s| s.checked_add(bytes));
            let (Some(start), Some(end)) = (start, end) else {
                return Err(LayoutError::OutOfBounds {
                    part,
                    offset,
                    bytes,
                    mapping: len,
                });
            };
            if end > len {
                return Err(LayoutError::OutOfBounds {
                    part,
                    offset,
                    bytes,
                    mapping: len,
                });
            }
            if !start.is_multiple_of(align) {
                return Err(LayoutError::Misaligned {
                    part,
                    offset,
                    align,
                });
            }
            *span = (start, end);
        }
        for i in 0..spans.len() {
            for j in i + 1..spans.len() {
                if spans[i].0 < spans[j].1 && spans[j].0 < spans[i].1 {
                    return Err(LayoutError::Overlap(parts[i].0, parts[j].0));
                }
            }
        }
        Ok(Self {
            producer: spans[0].0,
            consumer: spans[1].0,
            flags: spans[2].0,
            desc: spans[3].0,
            size,
            len,
            _desc: PhantomData,
        })
    }

    /// Bytes the ring needs mapped.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// Why mapping a ring failed.
#[derive(Debug)]
pub(crate) enum MapError {
    /// The kernel's offsets were refused before mapping.
    Layout(LayoutError),
    /// `mmap` failed.
    Mmap(io::Error),
}

/// Maps the ring at page offset `pgoff` of socket `fd`, after checking its layout.
fn map<T: Descriptor>(
    fd: BorrowedFd<'_>,
    off: &XdpRingOffset,
    size: u32,
    pgoff: u64,
) -> Result<(RawRing<T>, Mmap), MapError> {
    let layout = Layout::<T>::new(off, size).map_err(MapError::Layout)?;
    let area = Mmap::socket(fd, layout.len(), pgoff).map_err(MapError::Mmap)?;
    // SAFETY: `area` is the socket's mapping of this ring, `area.len()` bytes, and the caller
    // keeps it next to the ring for the ring's whole life; its other user, the kernel, reads
    // and writes the index and flags words atomically and the descriptors only in the slots
    // the protocol gives it.
    let ring = unsafe { RawRing::new(area.ptr(), area.len(), &layout) };
    Ok((ring, area))
}

/// Pointers to a ring's words and descriptors, laid out as a checked [`Layout`] says.
#[derive(Debug)]
struct RawRing<T> {
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
    flags: NonNull<AtomicU32>,
    descs: NonNull<T>,
    mask: u32,
}

// SAFETY: the pointers reach memory that lives as long as the ring (`RawRing::new`'s contract)
// and is not tied to the thread that mapped it, and the ring is used by one thread at a time
// (it is not Sync; its owner takes `&mut` for every index move), so it may move to another.
unsafe impl<T: Send> Send for RawRing<T> {}

impl<T: Descriptor> RawRing<T> {
    /// The ring over the `len` bytes at `base`.
    ///
    /// # Safety
    /// `base` is valid for reads and writes of `len` bytes for as long as the ring is used, and
    /// every other user of that memory accesses the three words only atomically and the
    /// descriptors only in the slots the ring protocol gives it.
    ///
    /// # Panics
    /// If `layout` needs more than `len` bytes, or `base` is not aligned for the words and
    /// descriptors (a mapping is page-aligned).
    unsafe fn new(base: NonNull<u8>, len: usize, layout: &Layout<T>) -> Self {
        assert!(layout.len <= len, "ring layout larger than its memory");
        let align = align_of::<T>().max(align_of::<AtomicU32>());
        assert!(
            (base.as_ptr() as usize).is_multiple_of(align),
            "ring memory not aligned"
        );
        // In bounds (`Layout::check` put every part inside `layout.len <= len` bytes), so the
        // pointer keeps `base`'s provenance and is not null.
        let at = |off: usize| {
            NonNull::new(base.as_ptr().wrapping_add(off)).expect("inside a non-null mapping")
        };
        Self {
            producer: at(layout.producer).cast(),
            consumer: at(layout.consumer).cast(),
            flags: at(layout.flags).cast(),
            descs: at(layout.desc).cast(),
            mask: layout.size - 1,
        }
    }

    #[inline(always)]
    fn word(&self, w: NonNull<AtomicU32>) -> &AtomicU32 {
        // SAFETY: `w` is one of the three words: inside memory valid while the ring is
        // (`new`'s contract), aligned for a u32 and sharing no byte with another part
        // (`Layout::check`), and accessed by everyone only atomically (`new`'s contract).
        unsafe { w.as_ref() }
    }

    #[inline(always)]
    fn producer(&self) -> &AtomicU32 {
        self.word(self.producer)
    }

    #[inline(always)]
    fn consumer(&self) -> &AtomicU32 {
        self.word(self.consumer)
    }

    #[inline(always)]
    fn flags(&self) -> &AtomicU32 {
        self.word(self.flags)
    }

    /// Writes `value` to the slot of index `idx`.
    ///
    /// # Safety
    /// The slot is ours to write: the other side has consumed it (it lies below the other
    /// side's consumer index plus the ring size) and does not read it before we publish it.
    #[inline(always)]
    unsafe fn write(&self, idx: u32, value: T) {
        // SAFETY: `idx & mask` is below the ring size, and the descriptor array holds that
        // many aligned `T`s inside memory valid while the ring is (`Layout::check`, `new`'s
        // contract); nobody else accesses the slot now (this function's contract).
        unsafe {
            self.descs
                .as_ptr()
                .add((idx & self.mask) as usize)
                .write_volatile(value)
        }
    }

    /// Reads the slot of index `idx`.
    ///
    /// # Safety
    /// The slot is ours to read: the other side published it (we acquired a producer index
    /// past it) and does not write it again before we release it.
    #[inline(always)]
    unsafe fn read(&self, idx: u32) -> T {
        // SAFETY: in bounds and aligned as in `write`; nobody writes the slot now (this
        // function's contract), and any bytes there are a valid `T` (`Descriptor`).
        unsafe {
            self.descs
                .as_ptr()
                .add((idx & self.mask) as usize)
                .read_volatile()
        }
    }
}

/// The slots between two indices, `n`, as long as the protocol allows it: at most the ring
/// size. A wider window (an index that ran ahead of the other, or fell behind by more than a
/// lap) means a peer that broke the protocol; no slot in it is provably ours, so it counts as
/// none, and the ring stalls rather than touch a slot the peer may be using.
#[inline(always)]
fn window(n: u32, size: u32) -> u32 {
    if n > size {
        0
    } else {
        n
    }
}

/// Our producer side of a ring (fill: frame addresses; TX: descriptors).
///
/// Slots `[cached_prod, cached_prod + written)` hold descriptors written through a
/// [`Reservation`] and not yet published; `written` never exceeds the free slots.
#[derive(Debug)]
pub(crate) struct Producer<T> {
    ring: RawRing<T>,
    size: u32,
    /// The shared producer index as we last published it.
    cached_prod: u32,
    /// The other side's consumer index plus `size`, as last read.
    cached_cons: u32,
    /// Slots written after `cached_prod`, not yet published.
    written: u32,
    /// The mapping the ring points into (`None` for a test's heap buffer); dropped after
    /// `ring`, and nothing of the ring outlives `self`.
    _area: Option<Mmap>,
}

impl<T: Descriptor> Producer<T> {
    /// Maps the ring of `size` descriptors at page offset `pgoff` of socket `fd`, laid out as
    /// `off` says (checked first).
    pub(crate) fn map(
        fd: BorrowedFd<'_>,
        off: &XdpRingOffset,
        size: u32,
        pgoff: u64,
    ) -> Result<Self, MapError> {
        let (ring, area) = map(fd, off, size, pgoff)?;
        Ok(Self::with(ring, size, Some(area)))
    }

    fn with(ring: RawRing<T>, size: u32, area: Option<Mmap>) -> Self {
        let cached_prod = ring.producer().load(Ordering::Relaxed);
        let cached_cons = ring.consumer().load(Ordering::Acquire).wrapping_add(size);
        Self {
            ring,
            size,
            cached_prod,
            cached_cons,
            written: 0,
            _area: area,
        }
    }

    /// Free slots not yet written, from the cached indices.
    #[inline(always)]
    fn free(&self) -> u32 {
        window(self.cached_cons.wrapping_sub(self.cached_prod), self.size)
            .saturating_sub(self.written)
    }

    /// Reserves up to `want` free slots after those already written: fewer when fewer are
    /// free, none when the ring is full. Re-reads the other side's consumer index only when
    /// fewer than `want` are known to be free.
    #[inline]
    pub(crate) fn reserve(&mut self, want: u32) -> Reservation<'_, T> {
        let mut free = self.free();
        if free < want {
            // Acquire: the other side's reads of the slots happen before we overwrite them.
            self.cached_cons = self
                .ring
                .consumer()
                .load(Ordering::Acquire)
                .wrapping_add(self.size);
            free = self.free();
        }
        Reservation {
            left: free.min(want),
            ring: self,
        }
    }

    /// Publishes every written slot. Returns how many.
    #[inline]
    pub(crate) fn submit(&mut self) -> u32 {
        let n = self.written;
        if n == 0 {
            return 0;
        }
        self.cached_prod = self.cached_prod.wrapping_add(n);
        self.written = 0;
        // Release: the descriptor writes happen before the other side sees the index.
        self.ring
            .producer()
            .store(self.cached_prod, Ordering::Release);
        n
    }

    /// Whether the kernel asked for a syscall to process this ring.
    #[inline(always)]
    pub(crate) fn needs_wakeup(&self) -> bool {
        self.ring.flags().load(Ordering::Relaxed) & XdpRingFlags::XDP_RING_NEED_WAKEUP.bits() != 0
    }

    /// Published descriptors the other side has not consumed yet.
    #[inline]
    pub(crate) fn pending(&self) -> u32 {
        self.cached_prod
            .wrapping_sub(self.ring.consumer().load(Ordering::Acquire))
    }
}

/// Free slots of a [`Producer`], written in order by [`Reservation::push`].
///
/// [`Reservation::submit`] publishes what was written. Dropping the reservation instead keeps
/// the written slots staged: a later reservation writes after them, and [`Producer::submit`]
/// publishes them all (the TX ring is staged a frame at a time and published once a turn).
#[derive(Debug)]
pub(crate) struct Reservation<'a, T: Descriptor> {
    ring: &'a mut Producer<T>,
    /// Reserved slots not written yet.
    left: u32,
}

impl<T: Descriptor> Reservation<'_, T> {
    /// Reserved slots not written yet.
    #[inline(always)]
    pub(crate) fn remaining(&self) -> u32 {
        self.left
    }

    /// Writes `value` to the next reserved slot.
    ///
    /// # Panics
    /// If every reserved slot is written.
    #[inline(always)]
    pub(crate) fn push(&mut self, value: T) {
        assert!(self.left > 0, "ring reservation exceeded");
        let p = &mut *self.ring;
        let idx = p.cached_prod.wrapping_add(p.written);
        // SAFETY: the slot is free: `left` counted down from at most `free()`, the slots after
        // the written ones and below the other side's consumer index plus the ring size, so
        // the other side has consumed this one and does not read it before `submit` moves the
        // producer index past it.
        unsafe { p.ring.write(idx, value) };
        p.written += 1;
        self.left -= 1;
    }

    /// Publishes the written slots (this reservation's and any staged before it). Returns how
    /// many.
    #[inline]
    pub(crate) fn submit(self) -> u32 {
        self.ring.submit()
    }
}

/// Our consumer side of a ring (RX: descriptors; completion: frame addresses).
#[derive(Debug)]
pub(crate) struct Consumer<T> {
    ring: RawRing<T>,
    size: u32,
    /// The other side's producer index as last read.
    cached_prod: u32,
    /// Next index we will consume (equal to the shared consumer index between calls).
    cached_cons: u32,
    /// As for [`Producer`].
    _area: Option<Mmap>,
}

impl<T: Descriptor> Consumer<T> {
    /// Maps the ring (see [`Producer::map`]).
    pub(crate) fn map(
        fd: BorrowedFd<'_>,
        off: &XdpRingOffset,
        size: u32,
        pgoff: u64,
    ) -> Result<Self, MapError> {
        let (ring, area) = map(fd, off, size, pgoff)?;
        Ok(Self::with(ring, size, Some(area)))
    }

    fn with(ring: RawRing<T>, size: u32, area: Option<Mmap>) -> Self {
        let cached_prod = ring.producer().load(Ordering::Acquire);
        let cached_cons = ring.consumer().load(Ordering::Relaxed);
        Self {
            ring,
            size,
            cached_prod,
            cached_cons,
            _area: area,
        }
    }

    /// Published slots not yet released, from the cached indices.
    #[inline(always)]
    fn ready(&self) -> u32 {
        window(self.cached_prod.wrapping_sub(self.cached_cons), self.size)
    }

    /// Up to `max` published descriptors; re-reads the other side's producer index only when
    /// none are known.
    #[inline]
    pub(crate) fn peek(&mut self, max: u32) -> Peek<'_, T> {
        let mut n = self.ready();
        if n == 0 {
            // Acquire: the other side's descriptor writes happen before we read them.
            self.cached_prod = self.ring.producer().load(Ordering::Acquire);
            n = self.ready();
        }
        Peek {
            len: n.min(max),
            ring: self,
        }
    }

    /// Descriptors the other side has published and we have not released.
    #[inline]
    pub(crate) fn pending(&self) -> u32 {
        self.ring
            .producer()
            .load(Ordering::Acquire)
            .wrapping_sub(self.cached_cons)
    }
}

/// Published slots of a [`Consumer`], read by [`Peek::get`] or [`Peek::iter`] and handed
/// back by [`Peek::release`]. Dropping it releases nothing: the next peek sees the same slots.
#[derive(Debug)]
pub(crate) struct Peek<'a, T: Descriptor> {
    ring: &'a mut Consumer<T>,
    len: u32,
}

impl<T: Descriptor> Peek<'_, T> {
    /// Descriptors peeked.
    #[inline(always)]
    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    /// The `i`-th descriptor peeked, `None` past them. (The driver reads in order, through
    /// [`Peek::iter`].)
    #[cfg(test)]
    pub(crate) fn get(&self, i: u32) -> Option<T> {
        (i < self.len).then(|| self.read(i))
    }

    /// The descriptors peeked, in ring order.
    #[inline]
    pub(crate) fn iter(&self) -> impl Iterator<Item = T> + '_ {
        (0..self.len).map(|i| self.read(i))
    }

    #[inline(always)]
    fn read(&self, i: u32) -> T {
        debug_assert!(i < self.len);
        let c = &*self.ring;
        // SAFETY: `i < len <= ready()`, so the slot lies in `[cached_cons, cached_prod)`:
        // published by the other side (we acquired a producer index past it) and not yet
        // released, so the other side does not write it before `release` moves our index.
        unsafe { c.ring.read(c.cached_cons.wrapping_add(i)) }
    }

    /// Hands the peeked slots back to the other side. Returns how many.
    #[inline]
    pub(crate) fn release(self) -> u32 {
        let n = self.len;
        if n == 0 {
            return 0;
        }
        let c = self.ring;
        c.cached_cons = c.cached_cons.wrapping_add(n);
        // Release: our reads of the slots happen before the other side may reuse them.
        c.ring.consumer().store(c.cached_cons, Ordering::Release);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::net::xdp::XdpDescOptions;

    /// The layout Linux 6.18 reports on x86-64 for every ring: each index on its own pair of
    /// cache lines, the flags word after the consumer's line, the descriptors after the header.
    const OFF: XdpRingOffset = XdpRingOffset {
        producer: 0,
        consumer: 128,
        flags: Some(196),
        desc: 320,
    };

    /// Runs `f` on the two ends of one ring of `size` descriptors whose indices both start at
    /// `start`, over a heap buffer standing in for the socket mapping: the producer is ours (a
    /// fill or TX ring) and the consumer plays the kernel, or the other way round.
    fn with_ring<T: Descriptor + Send, R>(
        size: u32,
        start: u32,
        f: impl FnOnce(&mut Producer<T>, &mut Consumer<T>) -> R,
    ) -> R {
        let layout = Layout::<T>::new(&OFF, size).expect("a valid layout");
        // u64s, so the buffer is aligned for every part; the index words start at `start`.
        let mut buf = vec![0u64; layout.len().div_ceil(8)];
        let word = |v: u32| {
            let mut b = [0u8; 8];
            b[..4].copy_from_slice(&v.to_ne_bytes());
            u64::from_ne_bytes(b)
        };
        buf[OFF.producer as usize / 8] = word(start);
        buf[OFF.consumer as usize / 8] = word(start);
        let len = buf.len() * 8;
        let base = NonNull::new(buf.as_mut_ptr().cast::<u8>()).expect("a Vec is not null");
        // SAFETY: `buf` is valid for `len` bytes and is neither touched nor dropped until both
        // rings are gone (they are dropped at the end of this function, before it); the two
        // rings are each other's only other user and follow the protocol.
        let (p, c) = unsafe {
            (
                RawRing::new(base, len, &layout),
                RawRing::new(base, len, &layout),
            )
        };
        let mut p = Producer::with(p, size, None);
        let mut c = Consumer::with(c, size, None);
        let r = f(&mut p, &mut c);
        drop((p, c));
        drop(buf);
        r
    }

    fn fill(r: &mut Reservation<'_, u64>, from: u64) -> u64 {
        let mut v = from;
        while r.remaining() > 0 {
            r.push(v);
            v += 1;
        }
        v
    }

    #[test]
    fn reserved_slots_are_published_in_order_by_submit() {
        with_ring::<u64, _>(8, 0, |p, c| {
            let mut r = p.reserve(3);
            assert_eq!(r.remaining(), 3);
            assert_eq!(fill(&mut r, 10), 13);
            assert_eq!(
                c.peek(u32::MAX).len(),
                0,
                "nothing is visible before submit"
            );
            assert_eq!(r.submit(), 3);
            assert_eq!(p.pending(), 3);
            let k = c.peek(u32::MAX);
            assert_eq!(k.iter().collect::<Vec<_>>(), [10, 11, 12]);
            assert_eq!(k.release(), 3);
            assert_eq!(p.pending(), 0);
        });
    }

    #[test]
    fn a_dropped_reservation_stays_staged_until_submit() {
        with_ring::<u64, _>(8, 0, |p, c| {
            for v in 0..3 {
                let mut r = p.reserve(1);
                r.push(v);
            }
            assert_eq!(c.peek(u32::MAX).len(), 0);
            assert_eq!(p.reserve(8).remaining(), 5, "staged slots are not free");
            assert_eq!(p.submit(), 3);
            assert_eq!(p.submit(), 0, "published once");
            assert_eq!(c.peek(u32::MAX).iter().collect::<Vec<_>>(), [0, 1, 2]);
        });
    }

    #[test]
    fn a_reservation_cannot_exceed_the_free_slots() {
        with_ring::<u64, _>(8, 0, |p, c| {
            let mut r = p.reserve(100);
            assert_eq!(r.remaining(), 8, "at most the ring size");
            fill(&mut r, 0);
            r.submit();
            assert_eq!(p.reserve(1).remaining(), 0, "full");
            // The other side consumes three: exactly three come free.
            let k = c.peek(3);
            assert_eq!(k.len(), 3);
            assert_eq!(k.get(2), Some(2));
            assert_eq!(k.get(3), None, "peek is bounded by its length");
            k.release();
            assert_eq!(c.peek(u32::MAX).len(), 5);
            assert_eq!(p.reserve(100).remaining(), 3);
        });
    }

    #[test]
    #[should_panic(expected = "ring reservation exceeded")]
    fn pushing_past_a_reservation_panics() {
        with_ring::<u64, _>(8, 0, |p, _| {
            let mut r = p.reserve(2);
            r.push(1);
            r.push(2);
            r.push(3);
        });
    }

    #[test]
    fn an_empty_ring_peeks_nothing_and_releases_nothing() {
        with_ring::<u64, _>(4, 0, |p, c| {
            let k = c.peek(u32::MAX);
            assert_eq!((k.len(), k.get(0)), (0, None));
            assert_eq!(k.release(), 0);
            assert_eq!(c.pending(), 0);
            assert_eq!(p.reserve(0).remaining(), 0);
            assert_eq!(p.reserve(0).submit(), 0);
        });
    }

    #[test]
    fn an_unreleased_peek_is_seen_again() {
        with_ring::<u64, _>(4, 0, |p, c| {
            let mut r = p.reserve(2);
            fill(&mut r, 7);
            r.submit();
            assert_eq!(c.peek(1).iter().collect::<Vec<_>>(), [7]);
            assert_eq!(c.peek(8).iter().collect::<Vec<_>>(), [7, 8]);
            assert_eq!(c.pending(), 2);
        });
    }

    #[test]
    fn indices_wrap_at_u32_max() {
        let start = u32::MAX - 5;
        with_ring::<u64, _>(4, start, |p, c| {
            let mut next = 0u64;
            let mut seen = 0u64;
            for round in 0..50u32 {
                let mut r = p.reserve(1 + round % 4);
                next = fill(&mut r, next);
                r.submit();
                let k = c.peek(1 + round % 3);
                for v in k.iter() {
                    assert_eq!(v, seen);
                    seen += 1;
                }
                k.release();
            }
            // A peek re-reads the producer index only once the cached window is used up.
            loop {
                let k = c.peek(u32::MAX);
                if k.len() == 0 {
                    break;
                }
                for v in k.iter() {
                    assert_eq!(v, seen);
                    seen += 1;
                }
                k.release();
            }
            assert_eq!(seen, next);
            assert!(next > 20, "went round the ring and past u32::MAX");
            let end = p.ring.producer().load(Ordering::Relaxed);
            assert_eq!(end, start.wrapping_add(next as u32));
            assert!(end < start, "the index wrapped");
            assert_eq!(c.ring.consumer().load(Ordering::Relaxed), end);
            assert_eq!(p.reserve(u32::MAX).remaining(), 4, "empty again");
        });
    }

    #[test]
    fn a_peer_that_breaks_the_protocol_gets_no_slot() {
        with_ring::<u64, _>(8, 100, |p, c| {
            let mut r = p.reserve(3);
            fill(&mut r, 0);
            r.submit();
            // A consumer index ahead of anything we published.
            c.ring.consumer().store(100 + 1000, Ordering::Release);
            assert_eq!(p.reserve(u32::MAX).remaining(), 0);
            // One behind ours by more than a lap.
            c.ring.consumer().store(90, Ordering::Release);
            assert_eq!(p.reserve(u32::MAX).remaining(), 0);
            // Back to the truth: the three published slots are still the peer's.
            c.ring.consumer().store(100, Ordering::Release);
            assert_eq!(p.reserve(u32::MAX).remaining(), 5);
            // A producer index more than a lap ahead of the consumer.
            p.ring.producer().store(100 + 5000, Ordering::Release);
            assert_eq!(c.peek(u32::MAX).len(), 0);
            p.ring.producer().store(103, Ordering::Release);
            assert_eq!(c.peek(u32::MAX).iter().collect::<Vec<_>>(), [0, 1, 2]);
        });
    }

    #[test]
    fn need_wakeup_follows_the_flags_word() {
        with_ring::<u64, _>(4, 0, |p, c| {
            assert!(!p.needs_wakeup());
            c.ring
                .flags()
                .store(XdpRingFlags::XDP_RING_NEED_WAKEUP.bits(), Ordering::Relaxed);
            assert!(p.needs_wakeup());
        });
    }

    #[test]
    fn rx_and_tx_descriptors_round_trip() {
        with_ring::<XdpDesc, _>(2, u32::MAX, |p, c| {
            for round in 0..3u64 {
                let mut r = p.reserve(2);
                for k in 0..2 {
                    r.push(XdpDesc {
                        addr: round * 4096 + k,
                        len: 60 + k as u32,
                        options: XdpDescOptions::empty(),
                    });
                }
                r.submit();
                let got: Vec<_> = c.peek(2).iter().map(|d| (d.addr, d.len)).collect();
                assert_eq!(got, [(round * 4096, 60), (round * 4096 + 1, 61)]);
                c.peek(2).release();
            }
        });
    }

    #[test]
    fn producer_and_consumer_threads_agree() {
        const N: u64 = 200_000;
        with_ring::<u64, _>(16, u32::MAX - 1000, |p, c| {
            std::thread::scope(|s| {
                s.spawn(|| {
                    let mut next = 0;
                    while next < N {
                        let mut r = p.reserve(((N - next) as u32).min(7));
                        while r.remaining() > 0 {
                            r.push(next);
                            next += 1;
                        }
                        r.submit();
                        std::hint::spin_loop();
                    }
                });
                s.spawn(|| {
                    let mut seen = 0;
                    while seen < N {
                        let k = c.peek(5);
                        for v in k.iter() {
                            assert_eq!(v, seen, "lost, repeated or reordered");
                            seen += 1;
                        }
                        k.release();
                    }
                });
            });
        });
    }

    fn checked<T: Descriptor>(off: XdpRingOffset, size: u32) -> Result<usize, LayoutError> {
        Layout::<T>::new(&off, size).map(|l| l.len())
    }

    #[test]
    fn the_kernel_layout_is_accepted() {
        assert_eq!(checked::<u64>(OFF, 2048), Ok(320 + 2048 * 8));
        assert_eq!(checked::<XdpDesc>(OFF, 2048), Ok(320 + 2048 * 16));
        assert_eq!(checked::<XdpDesc>(OFF, 1), Ok(336));
        // A tighter header is as good, as long as nothing overlaps.
        let packed = XdpRingOffset {
            producer: 0,
            consumer: 4,
            flags: Some(8),
            desc: 16,
        };
        assert_eq!(checked::<XdpDesc>(packed, 4), Ok(16 + 4 * 16));
    }

    #[test]
    fn bad_layouts_are_refused() {
        use LayoutError::*;
        let with = |f: fn(&mut XdpRingOffset)| {
            let mut o = OFF;
            f(&mut o);
            o
        };
        for size in [0, 3, 1000, u32::MAX] {
            assert_eq!(checked::<u64>(OFF, size), Err(Size(size)));
        }
        assert_eq!(checked::<u64>(with(|o| o.flags = None), 8), Err(NoFlags));
        assert_eq!(
            checked::<u64>(with(|o| o.desc = u64::MAX - 8), 8),
            Err(TooLarge { desc: u64::MAX - 8 })
        );
        assert!(matches!(
            checked::<u64>(with(|o| o.consumer = 2), 8),
            Err(Misaligned {
                part: "consumer",
                align: 4,
                ..
            })
        ));
        assert!(matches!(
            checked::<XdpDesc>(with(|o| o.desc = 324), 8),
            Err(Misaligned {
                part: "descriptors",
                align: 8,
                ..
            })
        ));
        assert_eq!(
            checked::<u64>(with(|o| o.flags = Some(128)), 8),
            Err(Overlap("consumer", "flags"))
        );
        assert_eq!(
            checked::<u64>(with(|o| o.producer = 332), 8),
            Err(Overlap("producer", "descriptors"))
        );
        // Words beyond the descriptor array, where the mapping ends.
        assert!(matches!(
            checked::<u64>(with(|o| o.flags = Some(320 + 64)), 8),
            Err(OutOfBounds {
                part: "flags",
                offset: 384,
                mapping: 384,
                ..
            })
        ));
        assert!(matches!(
            checked::<u64>(with(|o| o.producer = u64::MAX), 8),
            Err(OutOfBounds {
                part: "producer",
                ..
            })
        ));
        // A mapping shorter than the descriptors need.
        assert!(matches!(
            Layout::<u64>::check(&OFF, 8, 320 + 63),
            Err(OutOfBounds {
                part: "descriptors",
                bytes: 64,
                mapping: 383,
                ..
            })
        ));
        assert!(Layout::<u64>::check(&OFF, 8, 320 + 64).is_ok());
    }

    #[test]
    #[should_panic(expected = "ring layout larger than its memory")]
    fn a_ring_is_not_built_over_too_little_memory() {
        let layout = Layout::<u64>::new(&OFF, 8).expect("valid");
        let mut buf = vec![0u64; 8];
        let base = NonNull::new(buf.as_mut_ptr().cast::<u8>()).expect("not null");
        // SAFETY: never reached past the length check, which panics; `buf` outlives the call.
        let _ = unsafe { RawRing::new(base, buf.len() * 8, &layout) };
    }
}
