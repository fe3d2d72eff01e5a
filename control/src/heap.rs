//! Gives the allocator's free pages back to the kernel after the control thread rebuilt its
//! tables.
//!
//! A reload parses a configuration and builds a table (Maglev rings, backend lists) and then
//! frees the previous one. glibc's malloc keeps freed memory in its arenas for reuse and
//! returns it to the kernel only from the top of a heap, so under a steady stream of reloads
//! (the churn bench: about 7 a second) the process keeps more and more free but resident
//! pages, scattered between live allocations: its resident memory grows though nothing
//! leaks. `malloc_trim(0)` walks the arenas and `madvise(MADV_DONTNEED)`s every whole free
//! page. It costs a walk over the heap, so it runs on the control thread, at most once per
//! [`EVERY`], and only after a rebuild; never on a worker.

use std::time::{Duration, Instant};

/// The least time between two trims.
pub const EVERY: Duration = Duration::from_secs(1);

/// Trims after rebuilds, at most once per [`EVERY`].
#[derive(Debug)]
pub struct Trimmer {
    due: bool,
    last: Option<Instant>,
}

impl Default for Trimmer {
    fn default() -> Self {
        Self::new()
    }
}

impl Trimmer {
    /// Nothing due yet.
    pub fn new() -> Self {
        Self {
            due: false,
            last: None,
        }
    }

    /// A table was rebuilt and the old one freed: a trim is due.
    pub fn rebuilt(&mut self) {
        self.due = true;
    }

    /// Trims if one is due and [`EVERY`] passed since the last; whether it did.
    pub fn tick(&mut self, now: Instant) -> bool {
        if !self.due || self.last.is_some_and(|t| now.duration_since(t) < EVERY) {
            return false;
        }
        self.due = false;
        self.last = Some(now);
        trim();
        true
    }
}

/// `malloc_trim(0)` where the C library is glibc; nothing elsewhere.
#[allow(unsafe_code)]
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers and only walks glibc's own arenas under their
    // locks; any thread may call it at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_only_after_a_rebuild_and_at_most_once_a_second() {
        let mut t = Trimmer::new();
        let t0 = Instant::now();
        assert!(!t.tick(t0), "nothing rebuilt");
        t.rebuilt();
        assert!(t.tick(t0));
        assert!(!t.tick(t0), "done");
        t.rebuilt();
        assert!(!t.tick(t0 + EVERY / 2), "too soon");
        assert!(t.tick(t0 + EVERY), "due and a second passed");
    }
}
