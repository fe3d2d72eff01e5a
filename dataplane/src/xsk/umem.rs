//! The UMEM: the memory AF_XDP frames live in, and who owns each frame.
//!
//! A frame (chunk) is owned by exactly one of: user space (on the free list, or being
//! processed by the worker), the kernel through the fill ring (until it comes back on the RX
//! ring), or the kernel through the TX ring (until it comes back on the completion ring). The
//! owner of every frame is recorded in [`Umem::state`] at each hand-over; user space touches
//! frame memory only while it owns the frame, which is what makes the `&mut [u8]` of
//! [`Umem::chunk_mut`] sound while the kernel writes other frames.

use std::io;
use std::ptr::NonNull;

/// Bytes per UMEM frame: one 4 KiB page. Aligned mode needs a power of two; a page holds a
/// 1500-byte MTU packet behind the 320 bytes of headroom (64 ours, 256 the kernel's XDP
/// headroom) with room to spare, never straddles a page (which some zero-copy drivers
/// require), and is what the kernel's own AF_XDP samples use.
pub const FRAME_SIZE: u32 = 4096;

/// Frames per port by default: 16 MiB of UMEM. Twice the fill ring, so the kernel can hold a
/// full fill ring of empty frames while as many again are in the RX, TX and completion rings or
/// with the worker; more only adds memory, fewer lets a burst of TX starve the fill ring.
pub const FRAME_COUNT: u32 = 4096;

/// Who owns a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Owner {
    /// On the free list.
    Free,
    /// Given to the kernel on the fill ring; comes back on the RX ring.
    Fill,
    /// Read from the RX ring, in the worker's hands.
    Worker,
    /// Given to the kernel on the TX ring; comes back on the completion ring.
    Tx,
}

/// Frame memory plus the ownership books.
#[derive(Debug)]
pub(crate) struct Umem {
    base: NonNull<u8>,
    len: usize,
    count: u32,
    /// Frame base addresses (UMEM offsets) owned by user space and not in use.
    free: Vec<u64>,
    /// Owner of each frame, by index.
    state: Vec<Owner>,
}

// SAFETY: the mapping is owned by this value alone (no other pointer to it escapes except
// through `&mut self` borrows) and is not tied to the creating thread, so it may move to the
// worker thread.
unsafe impl Send for Umem {}

impl Umem {
    /// Maps `count` frames of anonymous memory, all on the free list.
    pub(crate) fn new(count: u32) -> io::Result<Self> {
        let len = count as usize * FRAME_SIZE as usize;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected, and the
        // result is checked below. MAP_POPULATE faults the pages in now rather than on the
        // first packet.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let free = (0..count as u64)
            .rev()
            .map(|i| i * FRAME_SIZE as u64)
            .collect();
        Ok(Self {
            // SAFETY: mmap succeeded, so `base` is not null.
            base: unsafe { NonNull::new_unchecked(base.cast()) },
            len,
            count,
            free,
            state: vec![Owner::Free; count as usize],
        })
    }

    /// Start of the memory, for `XDP_UMEM_REG`.
    pub(crate) fn addr(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    /// Length of the memory in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Number of frames.
    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    /// The frame index of a UMEM offset the kernel gave us, if it is inside the UMEM and
    /// `len` bytes from it stay inside that frame.
    #[inline(always)]
    pub(crate) fn frame_of(&self, addr: u64, len: u32) -> Option<u32> {
        let idx = addr / FRAME_SIZE as u64;
        let off = addr % FRAME_SIZE as u64;
        (idx < self.count as u64 && off + len as u64 <= FRAME_SIZE as u64).then_some(idx as u32)
    }

    /// Moves frame `idx` from owner `from` to `to`. A wrong `from` is a bug in the worker or a
    /// kernel that broke the ring protocol.
    #[inline(always)]
    pub(crate) fn hand_over(&mut self, idx: u32, from: Owner, to: Owner) {
        let s = &mut self.state[idx as usize];
        debug_assert_eq!(*s, from, "frame {idx} owned by {s:?}, expected {from:?}");
        *s = to;
    }

    /// The whole frame `idx` (all [`FRAME_SIZE`] bytes, headroom included), writable.
    ///
    /// # Panics
    /// If user space does not own the frame (state `Worker`): handing out its memory while
    /// the kernel may write it would be undefined behaviour.
    #[inline(always)]
    pub(crate) fn chunk_mut(&mut self, idx: u32) -> &mut [u8] {
        assert!(
            self.state[idx as usize] == Owner::Worker,
            "frame {idx} is not the worker's"
        );
        let off = idx as usize * FRAME_SIZE as usize;
        // SAFETY: `idx` indexed `state`, so it is below `count` and the FRAME_SIZE bytes
        // from `off` lie inside the mapping; the worker owns the frame (checked above), so
        // the kernel neither reads nor writes it until it is put on a ring again, which needs
        // `&mut self` and so ends this borrow; no other reference to the frame exists.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(off), FRAME_SIZE as usize) }
    }

    /// Takes a free frame's base address.
    #[inline(always)]
    pub(crate) fn pop_free(&mut self) -> Option<u64> {
        self.free.pop()
    }

    /// Returns frame `idx`, owned by `from`, to the free list.
    #[inline(always)]
    pub(crate) fn recycle(&mut self, idx: u32, from: Owner) {
        self.hand_over(idx, from, Owner::Free);
        // Never grows past `count`: every frame is on the list at most once.
        self.free.push(idx as u64 * FRAME_SIZE as u64);
    }

    /// Frames on the free list.
    pub(crate) fn free_len(&self) -> usize {
        self.free.len()
    }

    /// Frames per owner: (free, fill, worker, tx).
    pub(crate) fn owners(&self) -> [u32; 4] {
        let mut n = [0u32; 4];
        for s in &self.state {
            n[*s as usize] += 1;
        }
        n
    }
}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are what mmap returned; the sockets that used this memory are
        // closed first (Port drops its socket before its UMEM), and no slice handed out by
        // `chunk_mut` outlives the `&mut self` borrow that made it.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_bounds_checked() {
        let u = Umem::new(4).expect("mmap");
        assert_eq!(u.frame_of(0, 4096), Some(0));
        assert_eq!(u.frame_of(4096 + 320, 1500), Some(1));
        assert_eq!(u.frame_of(4096 + 320, 4096 - 319), None);
        assert_eq!(u.frame_of(4 * 4096, 1), None);
        assert_eq!(u.frame_of(u64::MAX, 0), None);
    }

    #[test]
    fn ownership_is_tracked() {
        let mut u = Umem::new(3).expect("mmap");
        assert_eq!(u.owners(), [3, 0, 0, 0]);
        let a = u.pop_free().expect("free frame");
        let i = u.frame_of(a, 0).expect("in range");
        u.hand_over(i, Owner::Free, Owner::Fill);
        u.hand_over(i, Owner::Fill, Owner::Worker);
        u.chunk_mut(i)[100] = 7;
        assert_eq!(u.chunk_mut(i)[100], 7);
        assert_eq!(u.owners(), [2, 0, 1, 0]);
        u.recycle(i, Owner::Worker);
        assert_eq!(u.owners(), [3, 0, 0, 0]);
        assert_eq!(u.free_len(), 3);
    }

    #[test]
    #[should_panic(expected = "is not the worker's")]
    fn kernel_frames_are_not_handed_out() {
        let mut u = Umem::new(1).expect("mmap");
        let _ = u.chunk_mut(0);
    }
}
