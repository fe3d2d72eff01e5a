//! ICMPv4 (RFC 792) and ICMPv6 (RFC 4443) messages: the header, and which types are errors
//! that embed the packet that caused them.

use super::{checksum, get16, get32, set16, set32, Error, Field};

/// Length of the ICMP header (type, code, checksum, 4 bytes of rest).
pub const HEADER_LEN: usize = field::REST.end;
/// Offset of the checksum.
pub const CHECKSUM_OFFSET: usize = field::CHECKSUM.start;

/// Where the fields lie (RFC 792, RFC 4443 section 2.1).
mod field {
    use super::Field;
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: Field = 2..4;
    /// The rest of the header, by type: for "fragmentation needed" (RFC 1191) two unused
    /// bytes and the next-hop MTU, for "packet too big" (RFC 4443) the MTU, as one
    /// big-endian word either way.
    pub const REST: Field = 4..8;
}

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

/// The header of an ICMP error the gateway answers with: [`Repr::emit`] writes it in front
/// of the quote of the packet that caused it, and the checksum over both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    /// Message type.
    pub msg_type: u8,
    /// Message code.
    pub code: u8,
    /// The last four bytes of the header ([`Packet::rest`]).
    pub rest: u32,
}

impl Repr {
    /// ICMPv4 "fragmentation needed and DF set" (RFC 1191 section 4): the next-hop MTU in the
    /// low 16 bits of the rest, behind two unused bytes.
    pub const fn frag_needed(mtu: u16) -> Self {
        Self {
            msg_type: v4::DEST_UNREACHABLE,
            code: v4::CODE_FRAG_NEEDED,
            rest: mtu as u32,
        }
    }

    /// ICMPv6 "packet too big" (RFC 4443 section 3.2): the MTU is the rest.
    pub const fn packet_too_big(mtu: u32) -> Self {
        Self {
            msg_type: v6::PACKET_TOO_BIG,
            code: 0,
            rest: mtu,
        }
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `packet`, which holds the
    /// whole message (the quote already behind the header), and the checksum over the
    /// message and `pseudo`, the pseudo-header sum ICMPv6 covers (zero for ICMPv4).
    ///
    /// # Panics
    /// If `packet` holds fewer than [`HEADER_LEN`] bytes.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>, pseudo: u64) {
        packet.set_msg_type(self.msg_type);
        packet.set_code(self.code);
        packet.set_rest(self.rest);
        packet.fill_checksum(pseudo);
    }
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

    /// Wraps bytes the caller vouches for: accessors panic past the end of `buf`. For frames
    /// the pipeline parsed before it rewrites them, and a message about to be written.
    #[inline(always)]
    pub(crate) fn new_unchecked(buf: T) -> Self {
        Self { buf }
    }

    /// Message type.
    #[inline(always)]
    pub fn msg_type(&self) -> u8 {
        self.buf.as_ref()[field::TYPE]
    }

    /// Message code.
    #[inline(always)]
    pub fn code(&self) -> u8 {
        self.buf.as_ref()[field::CODE]
    }

    /// Checksum as on the wire.
    #[inline(always)]
    pub fn checksum(&self) -> u16 {
        get16(self.buf.as_ref(), field::CHECKSUM)
    }

    /// The last four bytes of the header as one word: the MTU of "fragmentation needed"
    /// and "packet too big", the identifier and sequence number of an echo.
    #[inline(always)]
    pub fn rest(&self) -> u32 {
        get32(self.buf.as_ref(), field::REST)
    }

    /// The bytes after the 8-byte header: for an error, the start of the offending packet.
    #[inline(always)]
    pub fn payload(&self) -> &[u8] {
        &self.buf.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the message type.
    #[inline(always)]
    pub fn set_msg_type(&mut self, t: u8) {
        self.buf.as_mut()[field::TYPE] = t;
    }

    /// Sets the message code.
    #[inline(always)]
    pub fn set_code(&mut self, c: u8) {
        self.buf.as_mut()[field::CODE] = c;
    }

    /// Writes the checksum field.
    #[inline(always)]
    pub fn set_checksum(&mut self, c: u16) {
        set16(self.buf.as_mut(), field::CHECKSUM, c);
    }

    /// Sets the rest of the header ([`Packet::rest`]).
    #[inline(always)]
    pub fn set_rest(&mut self, r: u32) {
        set32(self.buf.as_mut(), field::REST, r);
    }

    /// Computes the checksum over the whole message (the view's bytes) and `pseudo`, the
    /// pseudo-header sum ICMPv6 covers (RFC 4443 section 2.3; zero for ICMPv4), and writes
    /// it.
    pub fn fill_checksum(&mut self, pseudo: u64) {
        self.set_checksum(0);
        let c = !checksum::fold(checksum::sum(pseudo, self.buf.as_ref()));
        self.set_checksum(c);
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
        assert_eq!(p.rest(), 1500);
        assert!(is_error_v4(p.msg_type()));
        assert!(!is_error_v4(v4::ECHO_REQUEST));
        assert!(is_error_v6(v6::PACKET_TOO_BIG));
        assert!(!is_error_v6(v6::ECHO_REQUEST));
        assert_eq!(Packet::new_checked(&b[..7]).unwrap_err(), Error::Truncated);
    }

    #[test]
    fn construct() {
        // A "fragmentation needed" quoting one byte, checksum over the whole message.
        let mut b = [0xffu8; 9];
        b[8] = 0x45;
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        Repr::frag_needed(1480).emit(&mut p, 0);
        assert_eq!(&b[..8], &[3, 4, 0xb2, 0x33, 0, 0, 0x05, 0xc8]);
        assert_eq!(checksum::checksum(&b), 0, "the message verifies");
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.set_msg_type(v6::ECHO_REQUEST);
        p.set_code(0);
        p.set_rest(0x0001_0002);
        p.fill_checksum(0x1234);
        assert_eq!(checksum::fold(checksum::sum(0x1234, &b)), 0xffff);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.msg_type(), p.code(), p.rest()), (128, 0, 0x0001_0002));
        assert_eq!(Repr::packet_too_big(1280).rest, 1280);
    }
}
