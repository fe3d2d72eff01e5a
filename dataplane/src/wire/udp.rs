//! UDP headers (RFC 768).

use super::{be16, put16, Error};

/// Length of a UDP header.
pub const HEADER_LEN: usize = 8;
/// Offset of the checksum within the header.
pub const CHECKSUM_OFFSET: usize = 6;

/// A view of a UDP datagram.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buf` after checking that the header fits and the length field is sane.
    ///
    /// # Errors
    /// [`Error::Truncated`] when the header or the stated length does not fit;
    /// [`Error::Malformed`] for a length below 8.
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let len = be16(b, 4) as usize;
        if len < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if b.len() < len {
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

    /// Length field (header and payload).
    pub fn len(&self) -> u16 {
        be16(self.buf.as_ref(), 4)
    }

    /// Whether the datagram has no payload.
    pub fn is_empty(&self) -> bool {
        self.len() as usize == HEADER_LEN
    }

    /// Checksum as on the wire (0 means none, over IPv4).
    pub fn checksum(&self) -> u16 {
        be16(self.buf.as_ref(), CHECKSUM_OFFSET)
    }
}

/// Writes a UDP header into `b[..8]` with a zero checksum (the caller fills it in, or leaves
/// zero where RFC 768 / RFC 6935 allow it).
pub fn emit(b: &mut [u8], src_port: u16, dst_port: u16, len: u16) {
    put16(b, 0, src_port);
    put16(b, 2, dst_port);
    put16(b, 4, len);
    put16(b, CHECKSUM_OFFSET, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        let mut b = [0u8; 12];
        emit(&mut b, 6080, 53, 12);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(
            (p.src_port(), p.dst_port(), p.len(), p.checksum()),
            (6080, 53, 12, 0)
        );
        assert!(!p.is_empty());
        assert_eq!(Packet::new_checked(&b[..11]).unwrap_err(), Error::Truncated);
        b[4..6].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(Packet::new_checked(&b[..]).unwrap_err(), Error::Malformed);
    }
}
