//! The Internet checksum (RFC 1071) and its incremental update (RFC 1624).
//!
//! Rewrites change a few fields of a packet whose checksum was right; recomputing over the
//! whole payload would cost a pass over every byte, so rewrites use RFC 1624 equation 3,
//! `HC' = ~(~HC + ~m + m')`, word by word. The property tests check every incremental update
//! against a full recomputation over random packets.
//!
//! The exception is a segment whose checksum was never computed. A local Linux sender whose
//! device offloads transmit checksums (a veth or a tap, by default) hands over the packet
//! `CHECKSUM_PARTIAL`: the TCP/UDP checksum field holds only the folded pseudo-header sum,
//! not complemented, for the device to finish (`th->check = ~tcp_v4_check(len, saddr, daddr,
//! 0)` in [`__tcp_v4_send_check`], `uh->check = ~csum_tcpudp_magic(..)` in [`udp4_hwcsum`],
//! `~csum_ipv6_magic(..)` for IPv6 in [`__tcp_v6_send_check`] and [`udp6_hwcsum_outgoing`]).
//! An AF_XDP socket in copy mode receives it as it is. [`is_partial`] recognises such a
//! field and [`complete`] does the device's work: a full sum over the segment. Completing a
//! valid segment whose checksum happens to equal its pseudo-header sum rewrites the value it
//! already has, so the test needs no other evidence.
//!
//! [`__tcp_v4_send_check`]: https://github.com/torvalds/linux/blob/v6.6/net/ipv4/tcp_ipv4.c
//! [`udp4_hwcsum`]: https://github.com/torvalds/linux/blob/v6.6/net/ipv4/udp.c
//! [`__tcp_v6_send_check`]: https://github.com/torvalds/linux/blob/v6.6/include/net/ip6_checksum.h
//! [`udp6_hwcsum_outgoing`]: https://github.com/torvalds/linux/blob/v6.6/net/ipv6/udp.c

/// One's-complement sum of `data` as 16-bit big-endian words, added to `acc`, not folded.
/// An odd trailing byte is padded with zero (RFC 1071 section 4.1).
#[inline]
pub fn sum(mut acc: u64, data: &[u8]) -> u64 {
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        // Two 32-bit halves summed into 64 bits cannot overflow for any packet size we see.
        acc += u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as u64;
        acc += u32::from_be_bytes([c[4], c[5], c[6], c[7]]) as u64;
    }
    let mut rest = chunks.remainder().chunks_exact(2);
    for c in &mut rest {
        acc += u16::from_be_bytes([c[0], c[1]]) as u64;
    }
    if let [b] = rest.remainder() {
        acc += (*b as u64) << 8;
    }
    acc
}

/// Folds a wide sum into 16 bits (end-around carry). Four steps, no loop: after the first
/// the sum is below 2^33, after the second below 2^18, after the third at most 0x10002, and
/// the fourth leaves 16 bits.
#[inline(always)]
pub fn fold(acc: u64) -> u16 {
    let acc = (acc & 0xffff_ffff) + (acc >> 32);
    let acc = (acc & 0xffff) + (acc >> 16);
    let acc = (acc & 0xffff) + (acc >> 16);
    let acc = (acc & 0xffff) + (acc >> 16);
    acc as u16
}

/// The checksum of `data`: the complement of the folded sum.
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum(0, data))
}

/// Sum of an IPv4 or IPv6 pseudo-header (RFC 9293 section 3.1, RFC 8200 section 8.1).
/// Addresses are 4 or 16 bytes; `len` is the upper-layer length.
#[inline(always)]
pub fn pseudo_header(src: &[u8], dst: &[u8], proto: u8, len: u32) -> u64 {
    address(src) + address(dst) + proto as u64 + (len >> 16) as u64 + (len & 0xffff) as u64
}

/// Sum of an address as 32-bit words, without a loop for the two sizes there are (every
/// packet is checked for a partial checksum, so this is on the fast path).
#[inline(always)]
fn address(a: &[u8]) -> u64 {
    let w = |i: usize| u32::from_be_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]) as u64;
    match a.len() {
        4 => w(0),
        16 => w(0) + w(4) + w(8) + w(12),
        _ => sum(0, a),
    }
}

/// RFC 1624 eqn. 3 for one 16-bit word changing from `old` to `new`.
#[inline(always)]
pub fn update16(csum: u16, old: u16, new: u16) -> u16 {
    let acc = (!csum) as u64 + (!old) as u64 + new as u64;
    !fold(acc)
}

/// RFC 1624 for a run of bytes (even length, 16-bit aligned within the checksummed data)
/// changing from `old` to `new`.
#[inline(always)]
pub fn update_bytes(csum: u16, old: &[u8], new: &[u8]) -> u16 {
    debug_assert_eq!(old.len(), new.len());
    debug_assert_eq!(old.len() % 2, 0);
    let mut acc = (!csum) as u64;
    let mut i = 0;
    while i + 1 < old.len() {
        acc += (!u16::from_be_bytes([old[i], old[i + 1]])) as u64;
        acc += u16::from_be_bytes([new[i], new[i + 1]]) as u64;
        i += 2;
    }
    !fold(acc)
}

/// What RFC 1624 eqn. 3 adds to a checksum's complement when a field of `N` bytes (even,
/// 16-bit aligned within the checksummed data) changes from `old` to `new`: the complement of
/// every old 16-bit word plus every new word. Exact, not reduced, so changes can be summed
/// and applied at once with [`apply`], which then gives exactly what [`update_bytes`] and
/// [`update16`] give applied one change after another (each fold keeps a positive sum
/// positive and its value modulo 0xffff). At a size known to the compiler, so no loop.
#[inline(always)]
pub fn change<const N: usize>(old: &[u8; N], new: &[u8; N]) -> u64 {
    let mut acc = 0u64;
    let mut i = 0;
    while i + 1 < N {
        acc += (!u16::from_be_bytes([old[i], old[i + 1]])) as u64;
        acc += u16::from_be_bytes([new[i], new[i + 1]]) as u64;
        i += 2;
    }
    acc
}

/// [`change`] for one 16-bit word.
#[inline(always)]
pub fn change16(old: u16, new: u16) -> u64 {
    (!old) as u64 + new as u64
}

/// Checksum `csum` updated by changes whose [`change`] sums add up to `delta`.
#[inline(always)]
pub fn apply(csum: u16, delta: u64) -> u16 {
    !fold((!csum) as u64 + delta)
}

/// A UDP checksum of zero means "none" over IPv4 (RFC 768); a computed zero is sent as
/// all ones.
#[inline(always)]
pub fn udp_nonzero(c: u16) -> u16 {
    if c == 0 {
        0xffff
    } else {
        c
    }
}

/// Whether a TCP/UDP checksum field holds only the folded sum `pseudo` of its pseudo-header,
/// as a sender that left the checksum to its device wrote it. Never true of a zero field
/// (a pseudo-header sum includes the protocol, so it never folds to zero): an IPv4 UDP
/// checksum of zero ("none") is never taken for one.
#[inline(always)]
pub fn is_partial(field: u16, pseudo: u64) -> bool {
    // `field == fold(pseudo)`, without the fold: both lie in 1..=0xffff (the pseudo-header
    // sum is never zero), where equal and congruent modulo 0xffff are the same.
    field != 0 && (pseudo + 0xffff - field as u64).is_multiple_of(0xffff)
}

/// Writes the full TCP/UDP checksum into `segment` (the transport header and payload), at
/// `field`, over the pseudo-header sum `pseudo` and every byte of the segment. The field's
/// old content does not matter. A UDP result of zero is written as all ones (RFC 768).
///
/// # Panics
/// If `field + 2 > segment.len()`.
#[inline]
pub fn complete(segment: &mut [u8], field: usize, pseudo: u64, udp: bool) {
    segment[field..field + 2].copy_from_slice(&[0, 0]);
    let c = !fold(sum(pseudo, segment));
    let c = if udp { udp_nonzero(c) } else { c };
    segment[field..field + 2].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: the words 0001 f203 f4f5 f6f7 sum to ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(0, &data)), 0xddf2);
        assert_eq!(checksum(&data), !0xddf2);
    }

    #[test]
    fn fold_is_the_end_around_carry_of_any_sum() {
        fn slow(mut acc: u64) -> u16 {
            while acc >> 16 != 0 {
                acc = (acc & 0xffff) + (acc >> 16);
            }
            acc as u16
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let edges = [
            0,
            1,
            0xffff,
            0x1_0000,
            0x1_fffe,
            0xffff_ffff,
            u64::MAX,
            u64::MAX - 1,
        ];
        for v in edges.into_iter().chain((0..10_000).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x >> (x % 48)
        })) {
            assert_eq!(fold(v), slow(v), "{v:#x}");
        }
    }

    #[test]
    fn partial_means_equal_to_the_folded_pseudo_header_sum() {
        for pseudo in [0x11u64, 0xffff, 0x1_fffe, 0x2_fffd, 0x3_0000, 0x12_3456] {
            for field in [0u16, 1, 0xfffe, 0xffff, fold(pseudo), fold(pseudo) ^ 1] {
                assert_eq!(
                    is_partial(field, pseudo),
                    field == fold(pseudo),
                    "field {field:#x}, pseudo {pseudo:#x}"
                );
            }
        }
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(fold(sum(0, &[0x12, 0x34, 0x56])), 0x1234 + 0x5600);
    }

    #[test]
    fn update_matches_recompute() {
        let mut data = [
            0x45u8, 0, 0, 40, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 192, 0, 2, 1, 203, 0, 113, 10,
        ];
        let c = checksum(&data);
        data[10..12].copy_from_slice(&c.to_be_bytes());
        assert_eq!(checksum(&data), 0);
        let old = [data[16], data[17], data[18], data[19]];
        let new = [198, 51, 100, 11];
        data[16..20].copy_from_slice(&new);
        let c2 = update_bytes(c, &old, &new);
        data[10..12].copy_from_slice(&[0, 0]);
        assert_eq!(c2, checksum(&data));
    }

    /// A TCP segment (header and 5 bytes of data) from 192.0.2.7:40000 to 203.0.113.10:80
    /// and its pseudo-header sum.
    fn tcp_segment() -> ([u8; 25], u64) {
        let mut seg = [0u8; 25];
        seg[0..4].copy_from_slice(&[0x9c, 0x40, 0x00, 0x50]);
        seg[4..8].copy_from_slice(&1000u32.to_be_bytes());
        seg[12] = 0x50;
        seg[13] = 0x02;
        seg[14..16].copy_from_slice(&64240u16.to_be_bytes());
        seg[20..].copy_from_slice(b"hello");
        let ps = pseudo_header(&[192, 0, 2, 7], &[203, 0, 113, 10], 6, seg.len() as u32);
        (seg, ps)
    }

    #[test]
    fn completing_a_partial_segment_gives_the_full_checksum() {
        let (mut seg, ps) = tcp_segment();
        let full = !fold(sum(ps, &seg));
        // What the sender's stack leaves for its device.
        seg[16..18].copy_from_slice(&fold(ps).to_be_bytes());
        assert!(is_partial(u16::from_be_bytes([seg[16], seg[17]]), ps));
        complete(&mut seg, 16, ps, false);
        assert_eq!(u16::from_be_bytes([seg[16], seg[17]]), full);
        assert_eq!(fold(sum(ps, &seg)), 0xffff, "the segment verifies");
        // Idempotent: completing a valid segment leaves it as it is.
        let valid = seg;
        complete(&mut seg, 16, ps, false);
        assert_eq!(seg, valid);
        assert!(!is_partial(u16::from_be_bytes([seg[16], seg[17]]), ps));
    }

    #[test]
    fn a_zero_udp_checksum_is_never_partial_and_never_completed_to_zero() {
        for ps in [0x11u64, 0x1_0000, 0xffff, 0x2_fffe] {
            assert!(!is_partial(0, ps), "{ps:#x}");
        }
        // A UDP segment whose data makes the sum all ones: its checksum is sent as 0xffff.
        let ps = pseudo_header(&[192, 0, 2, 7], &[203, 0, 113, 10], 17, 10);
        let mut seg = [0x13, 0x88, 0x00, 0x35, 0x00, 0x0a, 0, 0, 0, 0];
        let w = 0xffff - fold(sum(ps, &seg));
        seg[8..10].copy_from_slice(&w.to_be_bytes());
        complete(&mut seg, 6, ps, true);
        assert_eq!(&seg[6..8], &[0xff, 0xff]);
        complete(&mut seg, 6, ps, false);
        assert_eq!(&seg[6..8], &[0, 0], "TCP keeps a computed zero");
    }

    #[test]
    fn rfc1624_minus_zero_case() {
        // RFC 1624 section 3: eqn. 3 never produces 0x0000 from a non-zero result wrongly;
        // changing a word that makes the sum all ones must give 0x0000 only if data sums to
        // 0xffff. Check against recomputation on a tiny buffer.
        let mut data = [0x00u8, 0x00, 0xff, 0xfe];
        let c = checksum(&data);
        let old = [data[0], data[1]];
        data[0..2].copy_from_slice(&[0x00, 0x01]);
        assert_eq!(update_bytes(c, &old, &data[0..2]), checksum(&data));
    }
}
