//! [`Mmap`]: a memory mapping owned by one value and unmapped when it drops, the backing of
//! the UMEM (anonymous memory) and of each ring (a mapping of the AF_XDP socket).
//!
//! The two `mmap` calls and the one `munmap` of the driver are here, so that the rest of the
//! module holds mappings by value and never frees one twice or too early.

use std::io;
use std::os::fd::BorrowedFd;
use std::ptr::{self, NonNull};

use rustix::mm::{self, MapFlags, ProtFlags};

/// `len` bytes of memory mapped read-write by [`Mmap::socket`] or [`Mmap::anonymous`], unmapped
/// on drop. Holders of pointers into it (a ring, the UMEM's frames) keep the `Mmap` next to
/// them, so the memory outlives every pointer.
#[derive(Debug)]
pub(crate) struct Mmap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping belongs to this value alone (it is unmapped only by its Drop) and is not
// tied to the thread that created it, so the value may move to a worker thread. It hands out
// only a raw pointer; what is done through that pointer is the holder's to justify.
unsafe impl Send for Mmap {}

impl Mmap {
    /// Maps `len` bytes of AF_XDP socket `fd` at `offset` (one of the kernel's
    /// `XDP_*PGOFF_*_RING` offsets), shared with the kernel, with the pages faulted in now.
    pub(crate) fn socket(fd: BorrowedFd<'_>, len: usize, offset: u64) -> io::Result<Self> {
        // SAFETY: a new mapping at an address the kernel chooses (null hint, no MAP_FIXED), so
        // no existing memory is replaced or aliased; the result is checked before use and the
        // mapping is unmapped only by `Drop`.
        let ptr = unsafe {
            mm::mmap(
                ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::POPULATE,
                fd,
                offset,
            )?
        };
        Self::made(ptr, len)
    }

    /// Maps `len` bytes of private anonymous memory, zeroed, with the pages faulted in now
    /// rather than on the first packet (except under Miri, which knows only plain private
    /// anonymous mappings).
    pub(crate) fn anonymous(len: usize) -> io::Result<Self> {
        let populate = if cfg!(miri) {
            MapFlags::empty()
        } else {
            MapFlags::POPULATE
        };
        // SAFETY: as in `socket`: a new mapping where the kernel chooses, checked below and
        // unmapped only by `Drop`.
        let ptr = unsafe {
            mm::mmap_anonymous(
                ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | populate,
            )?
        };
        Self::made(ptr, len)
    }

    fn made(ptr: *mut std::ffi::c_void, len: usize) -> io::Result<Self> {
        // The kernel never places a mapping at 0 without MAP_FIXED; refuse rather than assume.
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
        Ok(Self { ptr, len })
    }

    /// Start of the mapping (page-aligned).
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length of the mapping in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // A failed munmap (only EINVAL, for arguments that are right by construction) leaves
        // the memory mapped: a leak, not unsoundness.
        // SAFETY: `ptr`/`len` are exactly a mapping made in `socket` or `anonymous` and not
        // unmapped since (only here); every pointer into it is held by the owner of this value
        // (a ring, the UMEM) and used only while it holds this value or a borrow of itself, so
        // none is used after this.
        let _ = unsafe { mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
