//! TCP headers (RFC 9293): the fields a load balancer reads and rewrites.

use super::{be16, be32, put16, Error};

/// Length of a TCP header without options.
pub const HEADER_LEN: usize = 20;
/// Offset of the checksum within the header.
pub const CHECKSUM_OFFSET: usize = 16;

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
        let doff = (b[12] >> 4) as usize * 4;
        if doff < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if b.len() < doff {
            return Err(Error::Truncated);
        }
        Ok(Self { buf })
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        be16(self.buf.as_ref(), 0)
    }

    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        be16(self.buf.as_ref(), 2)
    }

    /// Sequence number.
    pub fn seq(&self) -> u32 {
        be32(self.buf.as_ref(), 4)
    }

    /// Acknowledgment number.
    pub fn ack(&self) -> u32 {
        be32(self.buf.as_ref(), 8)
    }

    /// Header length in bytes, options included.
    pub fn header_len(&self) -> usize {
        (self.buf.as_ref()[12] >> 4) as usize * 4
    }

    /// The flag byte (CWR ECE URG ACK PSH RST SYN FIN).
    pub fn flags(&self) -> u8 {
        self.buf.as_ref()[13]
    }

    /// Checksum as on the wire.
    pub fn checksum(&self) -> u16 {
        be16(self.buf.as_ref(), CHECKSUM_OFFSET)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Writes the checksum field.
    pub fn set_checksum(&mut self, c: u16) {
        put16(self.buf.as_mut(), CHECKSUM_OFFSET, c);
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
        Packet::new_checked(&mut b[..])
            .unwrap()
            .set_checksum(0xbeef);
        assert_eq!(&b[16..18], &[0xbe, 0xef]);
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
