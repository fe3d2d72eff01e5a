//! SCTP common headers (RFC 9260 section 3.1) and the CRC32c checksum.
//!
//! A load balancer needs the ports (the flow key, as for TCP and UDP; the verification tag is
//! per association, not part of the 5-tuple), the type of the first chunk (to tell an
//! association's start and end, [`flow_flags`]) and the checksum.
//!
//! The checksum is CRC32c (Castagnoli, RFC 9260 appendix A) over the whole SCTP packet with
//! the checksum field taken as zero; unlike TCP's and UDP's it covers no pseudo-header, so
//! an address rewrite leaves it alone, but a port rewrite means one pass over the packet. The
//! value is stored least significant byte first (the reflected CRC's natural order, as
//! Linux's `sctp_compute_cksum` and the RFC's sample code write it). CRC32c itself comes from
//! the `crc32c` crate (SSE 4.2 / ARMv8 CRC instructions where the CPU has them).

use super::{get32, ports, Error, Field};
use crate::wire::tcp::flags;

/// Length of the SCTP common header.
pub const HEADER_LEN: usize = field::CHECKSUM.end;
/// Offset of the checksum within the header.
pub const CHECKSUM_OFFSET: usize = field::CHECKSUM.start;

/// Where the fields of the common header lie (RFC 9260 section 3.1).
mod field {
    use super::Field;
    // 0..4: the source and destination ports, read and written through `ports::Packet`.
    pub const VERIFICATION_TAG: Field = 4..8;
    /// CRC32c, least significant byte first.
    pub const CHECKSUM: Field = 8..12;
    /// Type of the first chunk, right after the common header.
    pub const FIRST_CHUNK_TYPE: usize = CHECKSUM.end;
}

/// Chunk types (RFC 9260 section 3.2) the load balancer tells apart.
pub mod chunk {
    /// Payload data.
    pub const DATA: u8 = 0;
    /// Initiation: the first packet of an association, alone in its packet.
    pub const INIT: u8 = 1;
    /// Initiation acknowledgement.
    pub const INIT_ACK: u8 = 2;
    /// Abort: the association ends at once.
    pub const ABORT: u8 = 6;
    /// Shutdown: no more data from the sender.
    pub const SHUTDOWN: u8 = 7;
    /// Shutdown acknowledgement.
    pub const SHUTDOWN_ACK: u8 = 8;
    /// State cookie echo: the client's second packet.
    pub const COOKIE_ECHO: u8 = 10;
    /// Shutdown complete: the association's last packet.
    pub const SHUTDOWN_COMPLETE: u8 = 14;
}

/// A view of an SCTP packet.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buf` (the whole SCTP packet) after checking that the common header fits.
    ///
    /// # Errors
    /// [`Error::Truncated`] when fewer than 12 bytes are there.
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        if buf.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(Self { buf })
    }

    ports::accessors!(read);

    /// Verification tag.
    #[inline(always)]
    pub fn verification_tag(&self) -> u32 {
        get32(self.buf.as_ref(), field::VERIFICATION_TAG)
    }

    /// The checksum field as the CRC value it holds (stored least significant byte first).
    #[inline(always)]
    pub fn checksum(&self) -> u32 {
        checksum_field(self.buf.as_ref())
    }

    /// Type of the first chunk, if the packet has one.
    #[inline(always)]
    pub fn first_chunk(&self) -> Option<u8> {
        self.buf.as_ref().get(field::FIRST_CHUNK_TYPE).copied()
    }

    /// Whether the checksum field holds the CRC32c of the packet.
    pub fn verify_checksum(&self) -> bool {
        self.checksum() == crc(self.buf.as_ref())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    ports::accessors!(
        write,
        "the CRC32c is the caller's: [`Packet::fill_checksum`]"
    );

    /// Writes the CRC32c of the packet into its checksum field.
    pub fn fill_checksum(&mut self) {
        fill_checksum(self.buf.as_mut());
    }
}

/// The checksum field of the SCTP packet `b` (at least [`HEADER_LEN`] bytes).
#[inline(always)]
fn checksum_field(b: &[u8]) -> u32 {
    let c = field::CHECKSUM.start;
    u32::from_le_bytes([b[c], b[c + 1], b[c + 2], b[c + 3]])
}

/// CRC32c of the SCTP packet `b` (at least [`HEADER_LEN`] bytes) with its checksum field
/// taken as zero: one pass over the packet, which is not modified.
#[inline]
pub fn crc(b: &[u8]) -> u32 {
    let c = crc32c::crc32c(&b[..field::CHECKSUM.start]);
    let c = crc32c::crc32c_append(c, &[0; 4]);
    crc32c::crc32c_append(c, &b[field::CHECKSUM.end..])
}

/// Whether the checksum of the SCTP packet `b` (at least [`HEADER_LEN`] bytes) verifies.
#[inline]
pub fn verify(b: &[u8]) -> bool {
    checksum_field(b) == crc(b)
}

/// Writes the CRC32c of the SCTP packet `b` (at least [`HEADER_LEN`] bytes) into its
/// checksum field.
#[inline]
pub fn fill_checksum(b: &mut [u8]) {
    let c = crc(b);
    b[field::CHECKSUM].copy_from_slice(&c.to_le_bytes());
}

/// Whether the checksum field of `b` (at least [`HEADER_LEN`] bytes) was left to the
/// sender's device: Linux writes zero there and marks the packet for CRC offload
/// (`CHECKSUM_PARTIAL` with `csum_not_inet`), which veth and tap never compute. A real CRC32c
/// is zero once in 2^32 packets; completing it then writes the same zero.
#[inline(always)]
pub fn is_partial(b: &[u8]) -> bool {
    checksum_field(b) == 0
}

/// The TCP flags ([`flags`]) an SCTP packet stands for in the flow table, from the type of
/// its first chunk, so that associations go through the states TCP connections do:
///
/// | first chunk | as TCP | so that |
/// |---|---|---|
/// | INIT | SYN | a new association is a new, half-open flow |
/// | ABORT | RST | an association's abort closes its flow, and an ABORT for an unknown flow makes no state |
/// | SHUTDOWN, SHUTDOWN ACK, SHUTDOWN COMPLETE | FIN | the flow closes with the association |
/// | any other, or none | ACK | a packet of an unknown flow picks the association up mid-stream |
///
/// INIT is always alone in its packet (RFC 9260 section 6.10). An ABORT bundled behind data
/// chunks is not looked for: its association's flow then expires by its idle timeout.
#[inline(always)]
pub fn flow_flags(first_chunk: Option<u8>) -> u8 {
    match first_chunk {
        Some(chunk::INIT) => flags::SYN,
        Some(chunk::ABORT) => flags::RST,
        Some(chunk::SHUTDOWN | chunk::SHUTDOWN_ACK | chunk::SHUTDOWN_COMPLETE) => flags::FIN,
        _ => flags::ACK,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An INIT from port 5000 to 38412 (the NGAP port), verification tag 0 (as RFC 9260
    /// requires of INIT), checksum filled in: INIT, flags 0, length 20, initiate tag
    /// 0x0102_0304, a_rwnd 65536, 10 outbound and 65535 inbound streams, initial TSN 1.
    /// Whether the checksum is the one the wire wants is checked by tshark in the fixture
    /// tests (`tests/tests/fixtures.rs`).
    fn init() -> Vec<u8> {
        let mut b = vec![
            0x13, 0x88, 0x96, 0x0c, 0, 0, 0, 0, 0, 0, 0, 0, // common header
            1, 0, 0, 20, 1, 2, 3, 4, 0, 1, 0, 0, 0, 10, 0xff, 0xff, 0, 0, 0, 1,
        ];
        fill_checksum(&mut b);
        b
    }

    #[test]
    fn deconstruct() {
        let b = init();
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port()), (5000, 38412));
        assert_eq!(p.verification_tag(), 0);
        assert_eq!(p.first_chunk(), Some(chunk::INIT));
        assert!(p.verify_checksum());
        assert_eq!(Packet::new_checked(&b[..11]).unwrap_err(), Error::Truncated);
        assert_eq!(Packet::new_checked(&b[..12]).unwrap().first_chunk(), None);
    }

    #[test]
    fn construct() {
        let mut b = init();
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.set_src_port(5001);
        p.set_dst_port(36412);
        assert!(!p.verify_checksum(), "the ports are covered");
        p.fill_checksum();
        assert!(p.verify_checksum());
        assert_eq!(&b[..4], &[0x13, 0x89, 0x8e, 0x3c]);
    }

    /// RFC 3720 appendix B.4's CRC32c test vectors (the same polynomial), through `crc`:
    /// 32 bytes of zeros give 0x8a9136aa. The field position is skipped as zero, which for
    /// an all-zero buffer changes nothing.
    #[test]
    fn crc32c_is_castagnoli() {
        assert_eq!(crc(&[0u8; 32]), 0x8a91_36aa);
        let ones = [0xffu8; 32];
        let mut with_zero_field = ones;
        with_zero_field[8..12].copy_from_slice(&[0; 4]);
        assert_eq!(crc(&ones), crc32c::crc32c(&with_zero_field));
        assert_eq!(crc32c::crc32c(&ones), 0x62a8_ab43);
    }

    #[test]
    fn checksum_round_trip_and_corruption() {
        let mut b = init();
        assert!(verify(&b));
        let good = Packet::new_checked(&b[..]).unwrap().checksum();
        b[20] ^= 0x01;
        assert!(!verify(&b), "a flipped bit in a chunk is caught");
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.fill_checksum();
        assert!(p.verify_checksum());
        assert_ne!(p.checksum(), good);
        b[8..12].copy_from_slice(&[0; 4]);
        assert!(is_partial(&b));
        fill_checksum(&mut b);
        assert!(!is_partial(&b) && verify(&b));
    }

    #[test]
    fn chunks_as_tcp_flags() {
        assert_eq!(flow_flags(Some(chunk::INIT)), flags::SYN);
        assert_eq!(flow_flags(Some(chunk::ABORT)), flags::RST);
        for c in [
            chunk::SHUTDOWN,
            chunk::SHUTDOWN_ACK,
            chunk::SHUTDOWN_COMPLETE,
        ] {
            assert_eq!(flow_flags(Some(c)), flags::FIN);
        }
        for c in [chunk::DATA, chunk::INIT_ACK, chunk::COOKIE_ECHO, 3, 0x80] {
            assert_eq!(flow_flags(Some(c)), flags::ACK);
        }
        assert_eq!(flow_flags(None), flags::ACK);
    }
}
