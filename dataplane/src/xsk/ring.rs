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
//! rings.

use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// One ring mapping: the kernel's ring header and descriptor array.
#[derive(Debug)]
struct Mapping<T> {
    area: NonNull<libc::c_void>,
    area_len: usize,
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
    flags: NonNull<AtomicU32>,
    descs: NonNull<T>,
    mask: u32,
    size: u32,
    _desc: PhantomData<T>,
}

impl<T: Copy> Mapping<T> {
    /// Maps the ring of `size` descriptors that `fd` exposes at page offset `pgoff`, laid out
    /// as `off` says.
    fn new(
        fd: BorrowedFd<'_>,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: libc::off_t,
    ) -> io::Result<Self> {
        debug_assert!(size.is_power_of_two());
        let area_len = off.desc as usize + size as usize * size_of::<T>();
        // SAFETY: a fresh shared mapping of the socket's ring at the offset the kernel
        // defines for it; no existing memory is affected, the result is checked below.
        let area = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                area_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                pgoff,
            )
        };
        if area == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let at = |o: u64| -> NonNull<u8> {
            // SAFETY: the kernel's offsets lie inside the `area_len` bytes just mapped
            // (producer, consumer and flags are in the ring header before `desc`), so the
            // pointer stays in the mapping and is not null.
            unsafe { NonNull::new_unchecked(area.cast::<u8>().add(o as usize)) }
        };
        let producer = at(off.producer).cast::<AtomicU32>();
        let consumer = at(off.consumer).cast::<AtomicU32>();
        let flags = at(off.flags).cast::<AtomicU32>();
        let descs = at(off.desc).cast::<T>();
        debug_assert!(producer.as_ptr().is_aligned() && consumer.as_ptr().is_aligned());
        debug_assert!(flags.as_ptr().is_aligned() && descs.as_ptr().is_aligned());
        Ok(Self {
            // SAFETY: mmap succeeded, so `area` is not null.
            area: unsafe { NonNull::new_unchecked(area) },
            area_len,
            producer,
            consumer,
            flags,
            descs,
            mask: size - 1,
            size,
            _desc: PhantomData,
        })
    }

    #[inline(always)]
    fn producer(&self) -> &AtomicU32 {
        // SAFETY: `producer` points into the live mapping (it is unmapped only in Drop), is
        // aligned for a u32 (the kernel places it so) and is only accessed atomically, by us
        // and by the kernel.
        unsafe { self.producer.as_ref() }
    }

    #[inline(always)]
    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { self.consumer.as_ref() }
    }

    #[inline(always)]
    fn flags(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { self.flags.as_ref() }
    }

    #[inline(always)]
    fn slot(&self, idx: u32) -> *mut T {
        // SAFETY: `idx & mask` is below `size`, and the mapping holds `size` descriptors from
        // `descs`.
        unsafe { self.descs.as_ptr().add((idx & self.mask) as usize) }
    }
}

impl<T> Drop for Mapping<T> {
    fn drop(&mut self) {
        // SAFETY: `area`/`area_len` are exactly what mmap returned in `new`, and no reference
        // into the mapping outlives `self` (all accessors borrow `self`).
        unsafe {
            libc::munmap(self.area.as_ptr(), self.area_len);
        }
    }
}

/// Our producer side of a ring (fill: frame addresses; TX: descriptors).
#[derive(Debug)]
pub(crate) struct Producer<T> {
    map: Mapping<T>,
    /// Next index we will publish (equal to the shared producer index between calls).
    cached_prod: u32,
    /// The kernel's consumer index plus `size`: `cached_cons - cached_prod` slots are free.
    cached_cons: u32,
}

impl<T: Copy> Producer<T> {
    /// Maps the ring (see [`Mapping::new`]).
    pub(crate) fn map(
        fd: BorrowedFd<'_>,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: libc::off_t,
    ) -> io::Result<Self> {
        let map = Mapping::new(fd, off, size, pgoff)?;
        let cached_prod = map.producer().load(Ordering::Relaxed);
        let cached_cons = map.consumer().load(Ordering::Acquire).wrapping_add(size);
        Ok(Self {
            map,
            cached_prod,
            cached_cons,
        })
    }

    /// Free slots, re-reading the kernel's consumer index only when fewer than `want` are
    /// known to be free.
    #[inline]
    pub(crate) fn free(&mut self, want: u32) -> u32 {
        let free = self.cached_cons.wrapping_sub(self.cached_prod);
        if free >= want {
            return free;
        }
        self.cached_cons = self
            .map
            .consumer()
            .load(Ordering::Acquire)
            .wrapping_add(self.map.size);
        self.cached_cons.wrapping_sub(self.cached_prod)
    }

    /// Writes the `i`-th descriptor after the published ones. The caller checked
    /// `i < self.free(..)`.
    #[inline(always)]
    pub(crate) fn write(&mut self, i: u32, value: T) {
        debug_assert!(i < self.cached_cons.wrapping_sub(self.cached_prod));
        let slot = self.map.slot(self.cached_prod.wrapping_add(i));
        // SAFETY: the slot is in the mapping (`slot`), and it is free: the kernel consumed it
        // (it lies below its consumer index plus size) and will not read it before we
        // publish it in `submit`.
        unsafe { slot.write_volatile(value) };
    }

    /// Publishes `n` written descriptors to the kernel.
    #[inline(always)]
    pub(crate) fn submit(&mut self, n: u32) {
        if n == 0 {
            return;
        }
        self.cached_prod = self.cached_prod.wrapping_add(n);
        // Release: the descriptor writes above happen before the kernel sees the index.
        self.map
            .producer()
            .store(self.cached_prod, Ordering::Release);
    }

    /// Whether the kernel asked for a syscall to process this ring.
    #[inline(always)]
    pub(crate) fn needs_wakeup(&self) -> bool {
        self.map.flags().load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    /// Published descriptors the kernel has not consumed yet.
    #[inline]
    pub(crate) fn pending(&self) -> u32 {
        self.cached_prod
            .wrapping_sub(self.map.consumer().load(Ordering::Acquire))
    }

    /// Ring size.
    pub(crate) fn size(&self) -> u32 {
        self.map.size
    }
}

/// Our consumer side of a ring (RX: descriptors; completion: frame addresses).
#[derive(Debug)]
pub(crate) struct Consumer<T> {
    map: Mapping<T>,
    /// The kernel's producer index as last read.
    cached_prod: u32,
    /// Next index we will consume (equal to the shared consumer index between calls).
    cached_cons: u32,
}

impl<T: Copy> Consumer<T> {
    /// Maps the ring (see [`Mapping::new`]).
    pub(crate) fn map(
        fd: BorrowedFd<'_>,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: libc::off_t,
    ) -> io::Result<Self> {
        let map = Mapping::new(fd, off, size, pgoff)?;
        let cached_prod = map.producer().load(Ordering::Acquire);
        let cached_cons = map.consumer().load(Ordering::Relaxed);
        Ok(Self {
            map,
            cached_prod,
            cached_cons,
        })
    }

    /// Descriptors ready to read, at most `max`; re-reads the kernel's producer index only
    /// when none are known.
    #[inline]
    pub(crate) fn peek(&mut self, max: u32) -> u32 {
        let mut n = self.cached_prod.wrapping_sub(self.cached_cons);
        if n == 0 {
            // Acquire: the kernel's descriptor writes happen before we read them.
            self.cached_prod = self.map.producer().load(Ordering::Acquire);
            n = self.cached_prod.wrapping_sub(self.cached_cons);
        }
        n.min(max)
    }

    /// Reads the `i`-th ready descriptor. The caller checked `i < self.peek(..)`.
    #[inline(always)]
    pub(crate) fn read(&self, i: u32) -> T {
        debug_assert!(i < self.cached_prod.wrapping_sub(self.cached_cons));
        let slot = self.map.slot(self.cached_cons.wrapping_add(i));
        // SAFETY: the slot is in the mapping (`slot`) and was published by the kernel (it is
        // below the producer index we acquired), which will not write it again before we
        // release it.
        unsafe { slot.read_volatile() }
    }

    /// Hands `n` read slots back to the kernel.
    #[inline(always)]
    pub(crate) fn release(&mut self, n: u32) {
        if n == 0 {
            return;
        }
        self.cached_cons = self.cached_cons.wrapping_add(n);
        // Release: our reads of the slots happen before the kernel may reuse them.
        self.map
            .consumer()
            .store(self.cached_cons, Ordering::Release);
    }

    /// Descriptors the kernel has published and we have not released.
    #[inline]
    pub(crate) fn pending(&self) -> u32 {
        self.map
            .producer()
            .load(Ordering::Acquire)
            .wrapping_sub(self.cached_cons)
    }
}
