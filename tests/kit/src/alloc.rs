//! A global allocator that counts the allocations of threads that ask for it: the proof that
//! a loop allocates nothing. A test binary has one global allocator, so each test file that
//! counts installs it itself:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOCATOR: strait_testkit::alloc::Counting = strait_testkit::alloc::Counting;
//! ```
//!
//! A thread sets [`COUNTING`] around the code under test and reads [`ALLOCS`] before and
//! after ([`counted`] does both). One of the unsafe islands (docs/architecture.md, "Unsafe
//! islands"): `GlobalAlloc` is an unsafe trait.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Allocations, reallocations and frees made by threads while their [`COUNTING`] flag is on.
pub static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread's allocations are counted. Const-initialised and without a
    /// destructor, so reading it from inside the allocator never allocates.
    pub static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

/// `System`, counting the allocations of threads whose [`COUNTING`] is on.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counting;

// SAFETY: every method forwards its arguments unchanged to `System`, which implements
// `GlobalAlloc` correctly; the bookkeeping around it neither allocates nor panics.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract (non-zero size), which is
        // `System::alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: the caller guarantees `ptr` came from this allocator (hence from `System`)
        // with `layout`, and that `new_size` is valid for it.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note();
        // SAFETY: the caller guarantees `ptr` came from this allocator (hence from `System`)
        // with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Runs `f` with this thread's allocations counted; what it returned and how many it made.
/// Counts only where [`Counting`] is the global allocator.
pub fn counted<T>(f: impl FnOnce() -> T) -> (T, usize) {
    COUNTING.with(|c| c.set(true));
    let before = ALLOCS.load(Ordering::Relaxed);
    let out = f();
    let made = ALLOCS.load(Ordering::Relaxed) - before;
    COUNTING.with(|c| c.set(false));
    (out, made)
}
