//! Cache and memory hints, and the one SIMD compare, of the packet path.
//!
//! One of the unsafe islands listed in docs/architecture.md ("Unsafe islands"), apart from
//! `xsk` because neither has anything to do with AF_XDP. A prefetch is the tool that turns a
//! batch's flow-table cache misses from serial into parallel ones; its wrapper takes a
//! reference, so the address is always that of a live object, although a prefetch would be
//! sound for any address. The flow table's tag compare is written with SSE2 intrinsics
//! because the compiler's own vectorisation of the plain loop took three times the
//! instructions; the intrinsics are `unsafe` to call only because they are
//! `#[target_feature]` functions.
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

/// Bit `i` set where `lanes[i] == value`, for the eight lanes at once.
///
/// On x86-64: one 16-byte load, a compare of eight 16-bit lanes, a pack to bytes and a
/// movemask. Elsewhere the plain loop, which is the definition.
#[inline(always)]
pub fn eq_mask_u16x8(lanes: &[u16; 8], value: u16) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{
            _mm_cmpeq_epi16, _mm_loadu_si128, _mm_movemask_epi8, _mm_packs_epi16, _mm_set1_epi16,
            _mm_setzero_si128,
        };
        // SAFETY: SSE2 is in the x86-64 baseline target features, so every x86-64 CPU runs
        // these instructions (they are `unsafe` only as `#[target_feature]` functions). The
        // load reads 16 bytes at `lanes`, exactly the array a live reference points to;
        // `loadu` needs no alignment. Each equal lane becomes 0xffff, the signed pack turns it
        // into 0xff (-1 stays -1) and every other lane into 0, so the movemask's low 8 bits are
        // the lanes that matched and the upper 8 (the zero half) are 0.
        unsafe {
            let v = _mm_loadu_si128(lanes.as_ptr().cast());
            let eq = _mm_cmpeq_epi16(v, _mm_set1_epi16(value as i16));
            _mm_movemask_epi8(_mm_packs_epi16(eq, _mm_setzero_si128())) as u32
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let mut m = 0u32;
        for (i, &l) in lanes.iter().enumerate() {
            m |= u32::from(l == value) << i;
        }
        m
    }
}

/// Whether any lane of the four eight-lane rows equals `value`: a flow table's whole tag line
/// screened at once.
///
/// On x86-64: four 16-byte loads and compares, three ORs and one movemask, where the
/// compiler's vectorisation of the plain loop took more than fifty instructions. Elsewhere
/// the plain loop, which is the definition.
#[inline(always)]
pub fn any_eq_u16x8x4(rows: [&[u16; 8]; 4], value: u16) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{
            _mm_cmpeq_epi16, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi16,
        };
        // SAFETY: SSE2 is in the x86-64 baseline target features, so every x86-64 CPU runs
        // these instructions (they are `unsafe` only as `#[target_feature]` functions). Each
        // load reads the 16 bytes of one row, an array a live reference points to; `loadu`
        // needs no alignment.
        unsafe {
            let v = _mm_set1_epi16(value as i16);
            let eq = |row: &[u16; 8]| _mm_cmpeq_epi16(_mm_loadu_si128(row.as_ptr().cast()), v);
            let any = _mm_or_si128(
                _mm_or_si128(eq(rows[0]), eq(rows[1])),
                _mm_or_si128(eq(rows[2]), eq(rows[3])),
            );
            _mm_movemask_epi8(any) != 0
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        rows.iter().any(|row| row.contains(&value))
    }
}

/// `n` copies of `value` in memory advised to use huge pages before it is first written
/// ([`advise_huge_pages`]): the flow table's arrays, and any table measured against them.
pub fn huge_filled<T: Copy>(n: usize, value: T) -> Box<[T]> {
    let mut v = Vec::with_capacity(n);
    advise_huge_pages(v.spare_capacity_mut());
    v.resize(n, value);
    v.into_boxed_slice()
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
