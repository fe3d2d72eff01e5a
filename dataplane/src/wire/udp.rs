//! UDP headers (RFC 768).

use super::{checksum, get16, ports, set16, Error, Field};

/// Length of a UDP header.
pub const HEADER_LEN: usize = field::CHECKSUM.end;
/// Offset of the checksum within the header.
pub const CHECKSUM_OFFSET: usize = field::CHECKSUM.start;

/// Where the fields lie (RFC 768).
mod field {
    use super::Field;
    // 0..4: the source and destination ports, read and written through `ports::Packet`.
    pub const LENGTH: Field = 4..6;
    pub const CHECKSUM: Field = 6..8;
}

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
        let p = Self { buf };
        let len = p.len() as usize;
        if len < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if p.buf.as_ref().len() < len {
            return Err(Error::Truncated);
        }
        Ok(p)
    }

    /// Wraps bytes the caller vouches for: accessors panic past the end of `buf`. For the
    /// header of a first fragment, the quote of an ICMP error, frames the pipeline parsed
    /// before it rewrites them, and a header about to be written ([`Repr::emit`]).
    #[inline(always)]
    pub(crate) fn new_unchecked(buf: T) -> Self {
        Self { buf }
    }

    ports::accessors!(read);

    /// Length field (header and payload).
    #[inline(always)]
    pub fn len(&self) -> u16 {
        get16(self.buf.as_ref(), field::LENGTH)
    }

    /// Whether the datagram has no payload.
    pub fn is_empty(&self) -> bool {
        self.len() as usize == HEADER_LEN
    }

    /// Checksum as on the wire (0 means none, over IPv4).
    #[inline(always)]
    pub fn checksum(&self) -> u16 {
        get16(self.buf.as_ref(), field::CHECKSUM)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    ports::accessors!(write, "the checksum is the caller's");

    /// Sets the length field.
    #[inline(always)]
    pub fn set_len(&mut self, len: u16) {
        set16(self.buf.as_mut(), field::LENGTH, len);
    }

    /// Writes the checksum field.
    #[inline(always)]
    pub fn set_checksum(&mut self, c: u16) {
        set16(self.buf.as_mut(), field::CHECKSUM, c);
    }

    /// Computes the checksum over the whole segment (the view's bytes: header, options and
    /// payload, link padding excluded) and `pseudo`, its pseudo-header sum
    /// ([`checksum::pseudo_header`]), and writes it: one pass over the segment. A zero result is written as all ones (RFC 768).
    #[inline]
    pub fn fill_checksum(&mut self, pseudo: u64) {
        checksum::complete(self.buf.as_mut(), field::CHECKSUM.start, pseudo, true);
    }
}

/// A UDP header as the gateway writes it (the outer header of GUE): [`Repr::emit`] writes
/// it with a zero checksum, which the caller fills in ([`Packet::fill_checksum`]) or leaves
/// zero where RFC 768 and RFC 6935 allow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Length of the payload (the length field less the 8-byte header).
    pub payload_len: u16,
}

impl Repr {
    /// Writes the header into the first [`HEADER_LEN`] bytes of `packet`, checksum zero.
    ///
    /// # Panics
    /// If `packet` holds fewer than [`HEADER_LEN`] bytes.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_src_port(self.src_port);
        packet.set_dst_port(self.dst_port);
        packet.set_len(HEADER_LEN as u16 + self.payload_len);
        packet.set_checksum(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_construct() {
        let mut b = [0xffu8; 12];
        Repr {
            src_port: 6080,
            dst_port: 53,
            payload_len: 4,
        }
        .emit(&mut Packet::new_unchecked(&mut b[..]));
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
