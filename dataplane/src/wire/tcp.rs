//! TCP headers (RFC 9293): the fields a load balancer reads and rewrites.

use super::{checksum, get16, get32, ports, set16, Error, Field};

/// Length of a TCP header without options.
pub const HEADER_LEN: usize = field::URGENT.end;
/// Offset of the checksum within the header.
pub const CHECKSUM_OFFSET: usize = field::CHECKSUM.start;

/// TCP flag bits (RFC 9293 section 3.1).
pub mod flags {
    /// No more data from sender.
    pub const FIN: u8 = 0x01;
    /// Synchronise sequence numbers.
    pub const SYN: u8 = 0x02;
    /// Reset the connection.
    pub const RST: u8 = 0x04;
    /// Push function.
    pub const PSH: u8 = 0x08;
    /// Acknowledgment field is significant.
    pub const ACK: u8 = 0x10;
}

/// Where the fields lie (RFC 9293 section 3.1).
mod field {
    use super::Field;
    // 0..4: the source and destination ports, read and written through `ports::Packet`.
    pub const SEQ_NUM: Field = 4..8;
    pub const ACK_NUM: Field = 8..12;
    /// Data offset (high nibble, in 32-bit words) and reserved bits.
    pub const DATA_OFF: usize = 12;
    pub const FLAGS: usize = 13;
    pub const WINDOW: Field = 14..16;
    pub const CHECKSUM: Field = 16..18;
    pub const URGENT: Field = 18..20;
}

/// A view of a TCP segment.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buf` after checking that the header, options included, fits.
    ///
    /// # Errors
    /// [`Error::Truncated`] when it does not; [`Error::Malformed`] for a data offset below 5.
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let p = Self { buf };
        let doff = p.header_len();
        if doff < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if p.buf.as_ref().len() < doff {
            return Err(Error::Truncated);
        }
        Ok(p)
    }

    /// Wraps bytes the caller vouches for: accessors panic past the end of `buf`. For the
    /// fixed header of a first fragment (whose options may lie in the next fragment), the
    /// quote of an ICMP error, and frames the pipeline parsed before it rewrites them.
    #[inline(always)]
    pub(crate) fn new_unchecked(buf: T) -> Self {
        Self { buf }
    }

    ports::accessors!(read);

    /// Sequence number.
    #[inline(always)]
    pub fn seq(&self) -> u32 {
        get32(self.buf.as_ref(), field::SEQ_NUM)
    }

    /// Acknowledgment number.
    #[inline(always)]
    pub fn ack(&self) -> u32 {
        get32(self.buf.as_ref(), field::ACK_NUM)
    }

    /// Header length in bytes, options included.
    #[inline(always)]
    pub fn header_len(&self) -> usize {
        (self.buf.as_ref()[field::DATA_OFF] >> 4) as usize * 4
    }

    /// The flag byte (CWR ECE URG ACK PSH RST SYN FIN).
    #[inline(always)]
    pub fn flags(&self) -> u8 {
        self.buf.as_ref()[field::FLAGS]
    }

    /// Receive window.
    #[inline(always)]
    pub fn window(&self) -> u16 {
        get16(self.buf.as_ref(), field::WINDOW)
    }

    /// Checksum as on the wire.
    #[inline(always)]
    pub fn checksum(&self) -> u16 {
        get16(self.buf.as_ref(), field::CHECKSUM)
    }

    /// Whether the bytes hold the checksum field (a quote in an ICMP error may stop after
    /// the ports).
    #[inline(always)]
    pub fn has_checksum(&self) -> bool {
        self.buf.as_ref().len() >= field::CHECKSUM.end
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    ports::accessors!(write, "the checksum is the caller's");

    /// Writes the checksum field.
    #[inline(always)]
    pub fn set_checksum(&mut self, c: u16) {
        set16(self.buf.as_mut(), field::CHECKSUM, c);
    }

    /// Computes the checksum over the whole segment (the view's bytes: header, options and
    /// payload, link padding excluded) and `pseudo`, its pseudo-header sum
    /// ([`checksum::pseudo_header`]), and writes it: one pass over the segment.
    #[inline]
    pub fn fill_checksum(&mut self, pseudo: u64) {
        checksum::complete(self.buf.as_mut(), field::CHECKSUM.start, pseudo, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SYN: [u8; 24] = [
        0xc0, 0x01, 0x00, 0x50, 0, 0, 0, 1, 0, 0, 0, 0, 0x60, 0x02, 0xfa, 0xf0, 0x12, 0x34, 0, 0,
        2, 4, 5, 0xb4,
    ];

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&SYN[..]).unwrap();
        assert_eq!(p.src_port(), 49153);
        assert_eq!(p.dst_port(), 80);
        assert_eq!(p.seq(), 1);
        assert_eq!(p.ack(), 0);
        assert_eq!(p.header_len(), 24);
        assert_eq!(p.flags(), flags::SYN);
        assert_eq!(p.checksum(), 0x1234);
    }

    #[test]
    fn construct() {
        let mut b = SYN;
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.set_checksum(0xbeef);
        p.set_src_port(443);
        p.set_dst_port(8080);
        assert_eq!(&b[16..18], &[0xbe, 0xef]);
        assert_eq!(&b[0..4], &[0x01, 0xbb, 0x1f, 0x90]);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.window(), 0xfaf0);
        assert!(p.has_checksum());
        assert!(!Packet::new_unchecked(&b[..8]).has_checksum());
    }

    #[test]
    fn errors() {
        assert_eq!(
            Packet::new_checked(&SYN[..23]).unwrap_err(),
            Error::Truncated
        );
        let mut b = SYN;
        b[12] = 0x40;
        assert_eq!(Packet::new_checked(&b[..]).unwrap_err(), Error::Malformed);
    }
}
