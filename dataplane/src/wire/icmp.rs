//! ICMPv4 (RFC 792) and ICMPv6 (RFC 4443) messages: the header, and which types are errors
//! that embed the packet that caused them.

use super::{be16, Error};

/// Length of the ICMP header (type, code, checksum, 4 bytes of rest).
pub const HEADER_LEN: usize = 8;
/// Offset of the checksum.
pub const CHECKSUM_OFFSET: usize = 2;

/// ICMPv4 types used here.
pub mod v4 {
    /// Echo reply.
    pub const ECHO_REPLY: u8 = 0;
    /// Destination unreachable (code 4: fragmentation needed, MTU in bytes 6..8).
    pub const DEST_UNREACHABLE: u8 = 3;
    /// Code of "fragmentation needed and DF set".
    pub const CODE_FRAG_NEEDED: u8 = 4;
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 8;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 11;
    /// Parameter problem.
    pub const PARAM_PROBLEM: u8 = 12;
}

/// ICMPv6 types used here.
pub mod v6 {
    /// Destination unreachable.
    pub const DEST_UNREACHABLE: u8 = 1;
    /// Packet too big (MTU in bytes 4..8).
    pub const PACKET_TOO_BIG: u8 = 2;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 3;
    /// Parameter problem.
    pub const PARAM_PROBLEM: u8 = 4;
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 128;
}

/// Whether an ICMPv4 type is an error message carrying the offending datagram.
pub const fn is_error_v4(t: u8) -> bool {
    matches!(
        t,
        v4::DEST_UNREACHABLE | v4::TIME_EXCEEDED | v4::PARAM_PROBLEM
    )
}

/// Whether an ICMPv6 type is an error message carrying the offending packet.
pub const fn is_error_v6(t: u8) -> bool {
    matches!(
        t,
        v6::DEST_UNREACHABLE | v6::PACKET_TOO_BIG | v6::TIME_EXCEEDED | v6::PARAM_PROBLEM
    )
}

/// A view of an ICMP message.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buf` after checking that the 8-byte header fits.
    ///
    /// # Errors
    /// [`Error::Truncated`] when it does not.
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        if buf.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(Self { buf })
    }

    /// Message type.
    pub fn msg_type(&self) -> u8 {
        self.buf.as_ref()[0]
    }

    /// Message code.
    pub fn code(&self) -> u8 {
        self.buf.as_ref()[1]
    }

    /// Checksum as on the wire.
    pub fn checksum(&self) -> u16 {
        be16(self.buf.as_ref(), CHECKSUM_OFFSET)
    }

    /// The bytes after the 8-byte header: for an error, the start of the offending packet.
    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[HEADER_LEN..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct() {
        let b = [3u8, 4, 0xab, 0xcd, 0, 0, 0x05, 0xdc, 0x45];
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.msg_type(), p.code(), p.checksum()), (3, 4, 0xabcd));
        assert_eq!(p.payload(), &[0x45]);
        assert!(is_error_v4(p.msg_type()));
        assert!(!is_error_v4(v4::ECHO_REQUEST));
        assert!(is_error_v6(v6::PACKET_TOO_BIG));
        assert!(!is_error_v6(v6::ECHO_REQUEST));
        assert_eq!(Packet::new_checked(&b[..7]).unwrap_err(), Error::Truncated);
    }
}
