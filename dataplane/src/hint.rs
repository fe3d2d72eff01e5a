//! Cache and memory hints for the packet path.
//!
//! One of the unsafe islands listed in docs/architecture.md ("Unsafe islands"), apart from
//! `xsk` because a prefetch has nothing to do with AF_XDP: it is the tool that turns a batch's
//! flow-table cache misses from serial into parallel ones, which is most of the packet path's
//! cost once the table outgrows the caches. The wrapper takes a reference, so the address is
//! always that of a live object, although a prefetch would be sound for any address.
#![allow(unsafe_code)]

/// Asks the CPU to bring the cache line holding `r` into all cache levels, without waiting.
/// A hint only: no effect on program state; a no-op on targets without one.
#[inline(always)]
pub fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` needs SSE, which every x86_64 CPU has (it is in the baseline
    // target features). PREFETCHT0 never faults and has no architectural effect; `r` is a
    // valid reference anyway.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
            (r as *const T).cast::<i8>(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}

/// Asks the kernel to back `mem` with transparent huge pages (`madvise(MADV_HUGEPAGE)`),
/// before it is first touched. The flow table is hundreds of megabytes read at random: with
/// 4 KiB pages nearly every lookup is also a TLB miss and a page walk; 2 MiB pages make the
/// TLB cover it. Needed where THP is in `madvise` mode (Debian's default). Best effort: a
/// kernel without THP, or a range under one page, keeps normal pages; nothing else changes.
pub fn advise_huge_pages<T>(mem: &mut [core::mem::MaybeUninit<T>]) {
    const PAGE: usize = 4096;
    let start = mem.as_mut_ptr() as usize;
    let end = start + core::mem::size_of_val(mem);
    let aligned = start.next_multiple_of(PAGE);
    if end <= aligned + PAGE {
        return;
    }
    // rustix and nix declare `madvise` unsafe as well (it takes a raw range), so a wrapper
    // would move this block, not remove it.
    // SAFETY: [aligned, end) lies inside `mem`, memory this process owns and that the caller
    // holds exclusively (`&mut`); `aligned` is page-aligned as madvise requires.
    // MADV_HUGEPAGE only changes how the kernel backs the range, never its contents, so no
    // Rust invariant depends on the call; its result is advisory and ignored.
    unsafe {
        libc::madvise(
            aligned as *mut libc::c_void,
            end - aligned,
            libc::MADV_HUGEPAGE,
        );
    }
}
