//! IPv4 headers (RFC 791), options detected and skipped.

use super::{be16, checksum, ip_version, put16, Error};

/// Length of an IPv4 header without options.
pub const HEADER_LEN: usize = 20;
/// "Don't fragment" bit of the flags/fragment-offset word.
pub const FLAG_DF: u16 = 0x4000;
/// "More fragments" bit.
pub const FLAG_MF: u16 = 0x2000;
/// Mask of the fragment offset (in 8-byte units).
pub const FRAG_OFFSET_MASK: u16 = 0x1fff;

mod field {
    use core::ops::Range;
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const TOTAL_LEN: usize = 2;
    pub const IDENT: usize = 4;
    pub const FLAGS_FRAG: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTO: usize = 9;
    pub const CHECKSUM: usize = 10;
    pub const SRC: Range<usize> = 12..16;
    pub const DST: Range<usize> = 16..20;
}

/// A view of an IPv4 header (and whatever follows it in the buffer).
#[derive(Debug, Clone, Copy)]
pub struct Packet<T> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buf` after checking the version, the header length (options included) and that
    /// the total length fits in the buffer. Trailing bytes past the total length (Ethernet
    /// padding) are allowed.
    ///
    /// # Errors
    /// [`Error::Truncated`] when bytes are missing; [`Error::Malformed`] for a version other
    /// than 4, IHL below 5, or a total length shorter than the header.
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if ip_version(b[field::VER_IHL]) != 4 || b[field::VER_IHL] & 0x0f < 5 {
            return Err(Error::Malformed);
        }
        let p = Self { buf };
        let total = p.total_len() as usize;
        if total < p.header_len() {
            return Err(Error::Malformed);
        }
        if p.buf.as_ref().len() < p.header_len() || p.buf.as_ref().len() < total {
            return Err(Error::Truncated);
        }
        Ok(p)
    }

    /// Wraps bytes the caller vouches for: accessors panic past the end of `buf`. For frames
    /// validated by [`Packet::new_checked`] (the pipeline re-wraps a frame it parsed to
    /// rewrite it), the fixed header an ICMP error quotes (whose stated length runs past the
    /// quote), and a header about to be written.
    #[inline(always)]
    pub(crate) fn new_unchecked(buf: T) -> Self {
        Self { buf }
    }

    /// The version field (4 for a header [`Packet::new_checked`] accepted).
    #[inline(always)]
    pub fn version(&self) -> u8 {
        ip_version(self.buf.as_ref()[field::VER_IHL])
    }

    /// Header length in bytes, options included.
    pub fn header_len(&self) -> usize {
        ((self.buf.as_ref()[field::VER_IHL] & 0x0f) as usize) * 4
    }

    /// Whether the header carries options.
    pub fn has_options(&self) -> bool {
        self.header_len() > HEADER_LEN
    }

    /// Type of service / DSCP+ECN byte.
    pub fn tos(&self) -> u8 {
        self.buf.as_ref()[field::TOS]
    }

    /// Total length of the datagram (header and payload).
    pub fn total_len(&self) -> u16 {
        be16(self.buf.as_ref(), field::TOTAL_LEN)
    }

    /// Identification field.
    pub fn ident(&self) -> u16 {
        be16(self.buf.as_ref(), field::IDENT)
    }

    /// The raw flags and fragment offset word.
    pub fn flags_frag(&self) -> u16 {
        be16(self.buf.as_ref(), field::FLAGS_FRAG)
    }

    /// Whether DF is set.
    pub fn dont_fragment(&self) -> bool {
        self.flags_frag() & FLAG_DF != 0
    }

    /// Whether this is a fragment (MF set or a non-zero offset).
    pub fn is_fragment(&self) -> bool {
        self.flags_frag() & (FLAG_MF | FRAG_OFFSET_MASK) != 0
    }

    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> usize {
        ((self.flags_frag() & FRAG_OFFSET_MASK) as usize) * 8
    }

    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.buf.as_ref()[field::TTL]
    }

    /// Protocol of the payload.
    pub fn protocol(&self) -> u8 {
        self.buf.as_ref()[field::PROTO]
    }

    /// Header checksum as on the wire.
    pub fn checksum(&self) -> u16 {
        be16(self.buf.as_ref(), field::CHECKSUM)
    }

    /// Whether the header checksum verifies. Every IPv4 packet is checked, so the header is
    /// summed as 32-bit words in the machine's byte order, each one load, the 20 bytes every
    /// header has without a loop: for a verification the order does not matter, since the
    /// ones' complement sum of byte-swapped words is the byte-swapped sum (RFC 1071 section
    /// 2(B)) and all ones is its own swap. The sum is all ones, folded, exactly when it is a
    /// non-zero multiple of 0xffff; a header's is never zero (its version is 4).
    #[inline(always)]
    pub fn verify_checksum(&self) -> bool {
        let b = self.buf.as_ref();
        // A view that does not hold its header (never one `new_checked` made) fails.
        let Some((fixed, rest)) = b.split_first_chunk::<HEADER_LEN>() else {
            return false;
        };
        let Some(options) = rest.get(..self.header_len().saturating_sub(HEADER_LEN)) else {
            return false;
        };
        let w = |c: &[u8; 4]| u32::from_ne_bytes(*c) as u64;
        let mut acc: u64 = fixed.as_chunks::<4>().0.iter().map(w).sum();
        for c in options.as_chunks::<4>().0 {
            acc += w(c);
        }
        checksum::is_multiple_of_ffff(acc)
    }

    /// Source address.
    pub fn src(&self) -> [u8; 4] {
        let mut a = [0; 4];
        a.copy_from_slice(&self.buf.as_ref()[field::SRC]);
        a
    }

    /// Destination address.
    pub fn dst(&self) -> [u8; 4] {
        let mut a = [0; 4];
        a.copy_from_slice(&self.buf.as_ref()[field::DST]);
        a
    }

    /// The payload within the total length.
    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[self.header_len()..self.total_len() as usize]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the source address, updating the header checksum incrementally.
    #[inline]
    pub fn set_src(&mut self, a: [u8; 4]) {
        let old = self.src();
        let c = checksum::apply(self.checksum(), checksum::change(&old, &a));
        self.buf.as_mut()[field::SRC].copy_from_slice(&a);
        self.set_checksum(c);
    }

    /// Sets the destination address, updating the header checksum incrementally.
    #[inline]
    pub fn set_dst(&mut self, a: [u8; 4]) {
        let old = self.dst();
        let c = checksum::apply(self.checksum(), checksum::change(&old, &a));
        self.buf.as_mut()[field::DST].copy_from_slice(&a);
        self.set_checksum(c);
    }

    /// Decrements the TTL by one, updating the header checksum incrementally. Callers check
    /// that the TTL is above 1 first.
    #[inline]
    pub fn decrement_ttl(&mut self) {
        let b = self.buf.as_ref();
        let old = u16::from_be_bytes([b[field::TTL], b[field::PROTO]]);
        let new = old.wrapping_sub(0x0100);
        let c = checksum::update16(self.checksum(), old, new);
        put16(self.buf.as_mut(), field::TTL, new);
        self.set_checksum(c);
    }

    /// A routed translation: sets the destination address (`dst_side`) or the source address
    /// to `a` and decrements the TTL, updating the header checksum once for both changes,
    /// which gives the checksum of [`Packet::set_dst`] or [`Packet::set_src`] and then
    /// [`Packet::decrement_ttl`]. Callers check that the TTL is above 1 first.
    #[inline]
    pub fn translate(&mut self, dst_side: bool, a: [u8; 4]) {
        let (old, at) = if dst_side {
            (self.dst(), field::DST)
        } else {
            (self.src(), field::SRC)
        };
        let b = self.buf.as_ref();
        let ttl_proto = u16::from_be_bytes([b[field::TTL], b[field::PROTO]]);
        let decremented = ttl_proto.wrapping_sub(0x0100);
        let delta = checksum::change(&old, &a) + checksum::change16(ttl_proto, decremented);
        let c = checksum::apply(self.checksum(), delta);
        self.buf.as_mut()[at].copy_from_slice(&a);
        put16(self.buf.as_mut(), field::TTL, decremented);
        self.set_checksum(c);
    }

    /// Writes the header checksum field.
    pub fn set_checksum(&mut self, c: u16) {
        put16(self.buf.as_mut(), field::CHECKSUM, c);
    }
}

/// An IPv4 header without options, as the gateway writes it (the outer header of an
/// encapsulation, the header of an ICMP error it answers with): [`Repr::emit`] writes it
/// whole, checksum included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    /// Source address.
    pub src: [u8; 4],
    /// Destination address.
    pub dst: [u8; 4],
    /// Protocol of the payload.
    pub protocol: u8,
    /// Length of the payload: the total length less the 20-byte header.
    pub payload_len: u16,
    /// Type of service (DSCP and ECN).
    pub tos: u8,
    /// Identification.
    pub ident: u16,
    /// Don't fragment.
    pub dont_fragment: bool,
    /// Time to live.
    pub ttl: u8,
}

impl Repr {
    /// Writes the header into the first [`HEADER_LEN`] bytes of `packet`, with its checksum.
    ///
    /// # Panics
    /// If `packet` holds fewer than [`HEADER_LEN`] bytes.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        let b = &mut packet.buf.as_mut()[..HEADER_LEN];
        b[field::VER_IHL] = 0x45;
        b[field::TOS] = self.tos;
        put16(b, field::TOTAL_LEN, HEADER_LEN as u16 + self.payload_len);
        put16(b, field::IDENT, self.ident);
        put16(
            b,
            field::FLAGS_FRAG,
            if self.dont_fragment { FLAG_DF } else { 0 },
        );
        b[field::TTL] = self.ttl;
        b[field::PROTO] = self.protocol;
        put16(b, field::CHECKSUM, 0);
        b[field::SRC].copy_from_slice(&self.src);
        b[field::DST].copy_from_slice(&self.dst);
        let c = checksum::checksum(b);
        put16(b, field::CHECKSUM, c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // 192.0.2.1 -> 203.0.113.10, TCP, DF, TTL 64, total length 40, checksum 0x8a8c.
    const HDR: [u8; 20] = [
        0x45, 0x00, 0x00, 0x28, 0x12, 0x34, 0x40, 0x00, 0x40, 0x06, 0x00, 0x00, 192, 0, 2, 1, 203,
        0, 113, 10,
    ];

    fn with_checksum() -> [u8; 40] {
        let mut b = [0u8; 40];
        b[..20].copy_from_slice(&HDR);
        let c = checksum::checksum(&b[..20]);
        b[10..12].copy_from_slice(&c.to_be_bytes());
        b
    }

    #[test]
    fn a_translation_is_an_address_change_and_a_ttl_decrement() {
        let mut x = 0x51_7cc1_b727_220au64;
        for round in 0..20_000u64 {
            x = crate::hash::mix64(x.wrapping_add(round));
            let mut b = with_checksum();
            b[8] = 2 + (x as u8 % 254);
            b[12..20].copy_from_slice(&(x.rotate_left(17)).to_be_bytes());
            // Every checksum value, all ones and zero included, not only the right one.
            b[10..12].copy_from_slice(&((x >> 48) as u16).to_be_bytes());
            let a = (x as u32).to_be_bytes();
            for dst_side in [true, false] {
                let (mut one, mut two) = (b, b);
                Packet::new_unchecked(&mut one[..]).translate(dst_side, a);
                let mut p = Packet::new_unchecked(&mut two[..]);
                if dst_side {
                    p.set_dst(a);
                } else {
                    p.set_src(a);
                }
                p.decrement_ttl();
                assert_eq!(one, two, "round {round}");
            }
        }
    }

    #[test]
    fn deconstruct() {
        let b = with_checksum();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.header_len(), 20);
        assert_eq!(p.total_len(), 40);
        assert_eq!(p.ident(), 0x1234);
        assert!(p.dont_fragment());
        assert!(!p.is_fragment());
        assert_eq!(p.ttl(), 64);
        assert_eq!(p.protocol(), 6);
        assert_eq!(p.src(), [192, 0, 2, 1]);
        assert_eq!(p.dst(), [203, 0, 113, 10]);
        assert!(p.verify_checksum());
        assert_eq!(p.payload().len(), 20);
    }

    #[test]
    fn construct_matches_fixture() {
        let mut b = [0xffu8; 20];
        Repr {
            src: [192, 0, 2, 1],
            dst: [203, 0, 113, 10],
            protocol: 6,
            payload_len: 20,
            tos: 0,
            ident: 0x1234,
            dont_fragment: true,
            ttl: 64,
        }
        .emit(&mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(&b[..], &with_checksum()[..20]);
    }

    #[test]
    fn setters_keep_checksum_valid() {
        let mut b = with_checksum();
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.set_dst([198, 51, 100, 11]);
        p.set_src([198, 51, 100, 1]);
        p.decrement_ttl();
        assert_eq!(p.ttl(), 63);
        assert!(p.verify_checksum());
    }

    #[test]
    fn verify_checksum_covers_every_byte_of_the_header_and_options() {
        // With 0, 4 and 40 bytes of options; every single-bit error of the header is caught
        // and a correct checksum is accepted.
        for opts in [0usize, 4, 40] {
            let hl = 20 + opts;
            let mut b = vec![0u8; hl + 8];
            b[..20].copy_from_slice(&HDR);
            b[0] = 0x40 | (hl / 4) as u8;
            b[2..4].copy_from_slice(&((hl + 8) as u16).to_be_bytes());
            for (i, o) in b[20..hl].iter_mut().enumerate() {
                *o = (i as u8).wrapping_mul(37) ^ 0x5a;
            }
            let c = checksum::checksum(&b[..hl]);
            b[10..12].copy_from_slice(&c.to_be_bytes());
            assert!(
                Packet::new_checked(&b[..]).unwrap().verify_checksum(),
                "{opts}"
            );
            for at in 0..hl {
                for bit in 0..8 {
                    let mut bad = b.clone();
                    bad[at] ^= 1 << bit;
                    if let Ok(p) = Packet::new_checked(&bad[..]) {
                        assert!(!p.verify_checksum(), "options {opts}, byte {at} bit {bit}");
                    }
                }
            }
            // The payload is not covered.
            b[hl] ^= 0xff;
            assert!(Packet::new_checked(&b[..]).unwrap().verify_checksum());
        }
    }

    #[test]
    fn verify_checksum_of_a_view_without_its_header_fails_without_panic() {
        let b = with_checksum();
        assert!(!Packet::new_unchecked(&b[..19]).verify_checksum());
        let mut long = b;
        long[0] = 0x4f; // 40 bytes of options, past the 40-byte buffer
        assert!(!Packet::new_unchecked(&long[..]).verify_checksum());
        let mut short = b;
        short[0] = 0x44; // IHL 4
        let _ = Packet::new_unchecked(&short[..]).verify_checksum();
    }

    #[test]
    fn options_and_errors() {
        let mut b = [0u8; 64];
        b[..20].copy_from_slice(&HDR);
        b[0] = 0x46; // IHL 6: 4 bytes of options
        b[2..4].copy_from_slice(&28u16.to_be_bytes());
        let p = Packet::new_checked(&b[..]).unwrap();
        assert!(p.has_options());
        assert_eq!(p.payload().len(), 4);
        b[0] = 0x44;
        assert_eq!(Packet::new_checked(&b[..]).unwrap_err(), Error::Malformed);
        b[0] = 0x65;
        assert_eq!(Packet::new_checked(&b[..]).unwrap_err(), Error::Malformed);
        b[0] = 0x45;
        b[2..4].copy_from_slice(&100u16.to_be_bytes());
        assert_eq!(Packet::new_checked(&b[..]).unwrap_err(), Error::Truncated);
        b[2..4].copy_from_slice(&10u16.to_be_bytes());
        assert_eq!(Packet::new_checked(&b[..]).unwrap_err(), Error::Malformed);
        assert_eq!(Packet::new_checked(&b[..19]).unwrap_err(), Error::Truncated);
    }
}
