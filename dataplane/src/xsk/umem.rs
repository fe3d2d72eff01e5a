//! The UMEM: the memory AF_XDP frames live in, and who owns each frame.
//!
//! A frame (chunk) is owned by exactly one of: user space (on the free list, or being
//! processed by the worker), the kernel through a fill ring (until it comes back on an RX
//! ring), or the kernel through a TX ring (until it comes back on a completion ring). The
//! owner of every frame is recorded in [`Umem::state`] at each hand-over; user space touches
//! frame memory only while it owns the frame, which is what makes the `&mut [u8]` of
//! [`Umem::chunk_mut`] and [`Umem::lend`] sound while the kernel writes other frames.
//!
//! One UMEM serves a whole queue group (every socket of one queue index, one per interface,
//! `XDP_SHARED_UMEM`), so a frame received on one interface can be put on another
//! interface's TX ring as it is. The books do not say *which* socket's ring holds a frame:
//! the identity that matters, `free + fill + rx + tx + comp + in kernel == total`, is per
//! UMEM, summed over the group's rings ([`super::QueueGroup::accounting`]).
//!
//! The transitions that take a frame *from the kernel* (RX: `Fill` to `Worker`; completion:
//! `Tx` to `Free`) are checked in release builds too, and refused when the frame is not where
//! the kernel says: a kernel (or a bug of ours) that reported one frame twice must not make
//! two `&mut` to the same memory, or put a frame on the free list twice.

use std::io;
use std::ptr::NonNull;

use super::mmap::Mmap;
use crate::rewrite::Frame;

/// Bytes per UMEM frame: one 4 KiB page. Aligned mode needs a power of two; a page holds a
/// 1500-byte MTU packet behind the 320 bytes of headroom (64 ours, 256 the kernel's XDP
/// headroom) with room to spare, never straddles a page (which some zero-copy drivers
/// require), and is what the kernel's own AF_XDP samples use.
pub const FRAME_SIZE: u32 = 4096;

/// Frames per socket by default (a queue group's UMEM has this many per member socket):
/// 16 MiB each. Twice the fill ring, so the kernel can hold a full fill ring of empty frames
/// while as many again are in the RX, TX and completion rings or with the worker; more only
/// adds memory, fewer lets a burst of TX starve the fill ring.
pub const FRAME_COUNT: u32 = 4096;

/// The kernel's own headroom in front of every received packet, after the UMEM's user
/// headroom (`XDP_PACKET_HEADROOM`,
/// [include/uapi/linux/bpf.h](https://github.com/torvalds/linux/blob/v6.12/include/uapi/linux/bpf.h), searched for `XDP_PACKET_HEADROOM`)).
pub(crate) const KERNEL_HEADROOM: usize = 256;

/// Where a received packet starts in its frame: our headroom plus the kernel's. Frames the
/// worker fills itself (handed over by another core) start here too, so they have the same
/// room for encapsulation.
pub const RX_OFFSET: usize = crate::rewrite::HEADROOM + KERNEL_HEADROOM;

/// The longest packet a frame holds behind the user and kernel headroom (64 + 256 bytes):
/// 3776 bytes. Longer frames cannot be received, nor handed over between workers.
pub const MAX_PACKET: usize = FRAME_SIZE as usize - RX_OFFSET;

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
    /// Transient, inside [`Umem::lend`] only: marks the frames already lent, so that a frame
    /// listed twice is caught before two `&mut` to it exist.
    Lent,
}

/// A frame the worker holds: its index, where the packet is in it, and the table port it
/// came in on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Frame index.
    pub idx: u32,
    /// Offset of the packet in the frame.
    pub head: u32,
    /// Packet length.
    pub len: u32,
    /// Ingress port (index in the service table's ports).
    pub ingress: u8,
}

/// Frame memory plus the ownership books.
#[derive(Debug)]
pub(crate) struct Umem {
    /// `count` frames of [`FRAME_SIZE`] bytes. Every slice into it borrows `self`, so none
    /// outlives the mapping; the sockets registered on it are closed before it is unmapped (a
    /// QueueGroup drops its ports before its UMEM).
    area: Mmap,
    count: u32,
    /// Frame base addresses (UMEM offsets) owned by user space and not in use.
    free: Vec<u64>,
    /// Owner of each frame, by index.
    state: Vec<Owner>,
}

impl Umem {
    /// Maps `count` frames of anonymous memory, all on the free list.
    pub(crate) fn new(count: u32) -> io::Result<Self> {
        let area = Mmap::anonymous(count as usize * FRAME_SIZE as usize)?;
        let free = (0..count as u64)
            .rev()
            .map(|i| i * FRAME_SIZE as u64)
            .collect();
        Ok(Self {
            area,
            count,
            free,
            state: vec![Owner::Free; count as usize],
        })
    }

    /// Start of the memory, for `XDP_UMEM_REG`.
    pub(crate) fn addr(&self) -> u64 {
        self.base().as_ptr() as u64
    }

    /// Length of the memory in bytes.
    pub(crate) fn len(&self) -> usize {
        self.area.len()
    }

    #[inline(always)]
    fn base(&self) -> NonNull<u8> {
        self.area.ptr()
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
        unsafe {
            std::slice::from_raw_parts_mut(self.base().as_ptr().add(off), FRAME_SIZE as usize)
        }
    }

    /// Moves frame `idx` from `from` to the worker, if `from` owns it; returns whether it did.
    /// Checked in release builds: this is how a frame reported by the kernel enters user
    /// space, and a frame already in user space must not be handed out twice.
    #[inline(always)]
    pub(crate) fn take(&mut self, idx: u32, from: Owner) -> bool {
        let s = &mut self.state[idx as usize];
        if *s != from {
            return false;
        }
        *s = Owner::Worker;
        true
    }

    /// Takes a free frame's base address.
    #[inline(always)]
    pub(crate) fn pop_free(&mut self) -> Option<u64> {
        self.free.pop()
    }

    /// Returns frame `idx`, owned by `from`, to the free list; returns whether it did. A frame
    /// that `from` does not own is left alone (checked in release builds), so the free list
    /// never holds a frame twice.
    #[inline(always)]
    pub(crate) fn recycle(&mut self, idx: u32, from: Owner) -> bool {
        let s = &mut self.state[idx as usize];
        if *s != from {
            debug_assert!(false, "frame {idx} owned by {s:?}, recycled as {from:?}");
            return false;
        }
        *s = Owner::Free;
        // Never grows past `count`: every frame is on the list at most once.
        self.free.push(idx as u64 * FRAME_SIZE as u64);
        true
    }

    /// The packet bytes of a frame the worker holds.
    ///
    /// # Panics
    /// If the worker does not own the frame, or `head + len` leaves it.
    #[inline(always)]
    pub(crate) fn packet(&self, h: &Held) -> &[u8] {
        assert!(
            self.state[h.idx as usize] == Owner::Worker,
            "frame {} is not the worker's",
            h.idx
        );
        let off = h.idx as usize * FRAME_SIZE as usize;
        // SAFETY: `idx` indexed `state`, so the frame lies inside the mapping; the worker
        // owns it (checked above), so the kernel does not write it, and no `&mut` to it
        // exists while `&self` is borrowed.
        let chunk = unsafe {
            std::slice::from_raw_parts(self.base().as_ptr().add(off), FRAME_SIZE as usize)
        };
        &chunk[h.head as usize..(h.head + h.len) as usize]
    }

    /// Lends the frames of `batch` to the pipeline: `out[i]` becomes a [`Frame`] over the
    /// whole chunk of `batch[i]`, with the packet at `batch[i].head`. The frames borrow the
    /// UMEM, so no frame changes hands until they are gone.
    ///
    /// # Panics
    /// If `out` is shorter than `batch`, if a frame is not the worker's, if a frame is listed
    /// twice, or if a packet leaves its frame: each would be a bug of the worker, and the first
    /// two would otherwise alias memory.
    pub(crate) fn lend<'a>(&'a mut self, batch: &[Held], out: &mut [Frame<'a>]) {
        assert!(out.len() >= batch.len(), "one frame slot per held frame");
        // Mark every frame lent, so a second listing of one finds `Lent` and stops us; then
        // give them back to the worker (nothing else can touch the states while the frames
        // below borrow `self`).
        for h in batch {
            let s = &mut self.state[h.idx as usize];
            assert!(
                *s == Owner::Worker,
                "frame {} is not the worker's ({s:?})",
                h.idx
            );
            *s = Owner::Lent;
        }
        for h in batch {
            self.state[h.idx as usize] = Owner::Worker;
        }
        let base = self.base().as_ptr();
        for (h, f) in batch.iter().zip(out.iter_mut()) {
            let off = h.idx as usize * FRAME_SIZE as usize;
            // SAFETY: `idx` indexed `state` above, so the FRAME_SIZE bytes from `off` lie
            // inside the mapping; the frames of `batch` are pairwise distinct (the marking
            // pass above panics on a repeat), so these slices are disjoint; the worker owns
            // each (checked above), so the kernel neither reads nor writes them until they
            // are put on a ring again, which needs `&mut self` and so waits for the `'a`
            // borrow these slices live in to end.
            let chunk =
                unsafe { std::slice::from_raw_parts_mut(base.add(off), FRAME_SIZE as usize) };
            *f = Frame::new(chunk, h.head as usize, h.len as usize);
        }
    }

    /// Takes a free frame, copies `packet` into it at [`RX_OFFSET`] and hands it to the
    /// worker, as if received on `ingress`. `None` when no frame is free.
    ///
    /// # Panics
    /// If `packet` is longer than [`MAX_PACKET`].
    #[inline]
    pub(crate) fn copy_in(&mut self, ingress: u8, packet: &[u8]) -> Option<Held> {
        assert!(packet.len() <= MAX_PACKET, "packet larger than a frame");
        let addr = self.pop_free()?;
        let idx = (addr / FRAME_SIZE as u64) as u32;
        self.hand_over(idx, Owner::Free, Owner::Worker);
        self.chunk_mut(idx)[RX_OFFSET..RX_OFFSET + packet.len()].copy_from_slice(packet);
        Some(Held {
            idx,
            head: RX_OFFSET as u32,
            len: packet.len() as u32,
            ingress,
        })
    }

    /// Frames on the free list.
    pub(crate) fn free_len(&self) -> usize {
        self.free.len()
    }

    /// Frames per owner: (free, fill, worker, tx, lent).
    pub(crate) fn owners(&self) -> [u32; 5] {
        let mut n = [0u32; 5];
        for s in &self.state {
            n[*s as usize] += 1;
        }
        n
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
        assert_eq!(u.owners(), [3, 0, 0, 0, 0]);
        let a = u.pop_free().expect("free frame");
        let i = u.frame_of(a, 0).expect("in range");
        u.hand_over(i, Owner::Free, Owner::Fill);
        u.hand_over(i, Owner::Fill, Owner::Worker);
        u.chunk_mut(i)[100] = 7;
        assert_eq!(u.chunk_mut(i)[100], 7);
        assert_eq!(u.owners(), [2, 0, 1, 0, 0]);
        assert!(u.recycle(i, Owner::Worker));
        assert_eq!(u.owners(), [3, 0, 0, 0, 0]);
        assert_eq!(u.free_len(), 3);
    }

    /// Takes frame `idx` off the free list and gives it to the kernel's fill ring, as far as
    /// the books go.
    fn to_fill(u: &mut Umem) -> u32 {
        let a = u.pop_free().expect("free frame");
        let i = u.frame_of(a, 0).expect("in range");
        u.hand_over(i, Owner::Free, Owner::Fill);
        i
    }

    #[test]
    fn kernel_reports_are_checked_in_release_builds() {
        let mut u = Umem::new(2).expect("mmap");
        let i = to_fill(&mut u);
        assert!(u.take(i, Owner::Fill));
        assert!(!u.take(i, Owner::Fill), "a frame reported twice is refused");
        let free = u.pop_free().expect("free");
        let j = u.frame_of(free, 0).expect("in range");
        assert!(
            !u.take(j, Owner::Fill),
            "a frame the kernel was never given is refused"
        );
    }

    #[test]
    fn lent_frames_are_disjoint_and_written_through() {
        let mut u = Umem::new(4).expect("mmap");
        let mut held = [Held::default(); 3];
        for (k, h) in held.iter_mut().enumerate() {
            let i = to_fill(&mut u);
            assert!(u.take(i, Owner::Fill));
            *h = Held {
                idx: i,
                head: RX_OFFSET as u32,
                len: 60,
                ingress: k as u8,
            };
        }
        {
            let mut frames: [Frame<'_>; 4] = std::array::from_fn(|_| Frame::new(&mut [], 0, 0));
            u.lend(&held, &mut frames);
            for (k, f) in frames[..3].iter_mut().enumerate() {
                assert_eq!(f.len(), 60);
                assert_eq!(f.headroom(), RX_OFFSET);
                f.data_mut().fill(k as u8 + 1);
            }
        }
        for (k, h) in held.iter().enumerate() {
            assert!(u.packet(h).iter().all(|&b| b == k as u8 + 1));
        }
        assert_eq!(u.owners(), [1, 0, 3, 0, 0]);
    }

    #[test]
    #[should_panic(expected = "is not the worker's (Lent)")]
    fn a_frame_lent_twice_is_refused() {
        let mut u = Umem::new(2).expect("mmap");
        let i = to_fill(&mut u);
        assert!(u.take(i, Owner::Fill));
        let h = Held {
            idx: i,
            head: RX_OFFSET as u32,
            len: 60,
            ingress: 0,
        };
        let mut frames: [Frame<'_>; 2] = std::array::from_fn(|_| Frame::new(&mut [], 0, 0));
        u.lend(&[h, h], &mut frames);
    }

    #[test]
    fn copy_in_fills_a_free_frame() {
        let mut u = Umem::new(1).expect("mmap");
        let h = u.copy_in(3, &[7; 100]).expect("a free frame");
        assert_eq!((h.head as usize, h.len, h.ingress), (RX_OFFSET, 100, 3));
        assert_eq!(u.packet(&h), &[7; 100][..]);
        assert!(u.copy_in(3, &[1]).is_none(), "no frame left");
        assert!(u.recycle(h.idx, Owner::Worker));
        assert_eq!(u.owners(), [1, 0, 0, 0, 0]);
    }

    #[test]
    #[should_panic(expected = "is not the worker's")]
    fn kernel_frames_are_not_handed_out() {
        let mut u = Umem::new(1).expect("mmap");
        let _ = u.chunk_mut(0);
    }
}
