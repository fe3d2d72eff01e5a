//! Zero-copy views over packet bytes, and the one-pass parser the pipeline runs.
//!
//! Each protocol module has a `Packet<T: AsRef<[u8]>>` view in the style of smoltcp: field
//! offsets are constants, `new_checked` validates lengths once, after which no accessor
//! panics; setters exist only where `T: AsMut<[u8]>`. Views never cast bytes to structs.
//!
//! [`parse::parse`] walks a frame once (Ethernet, optional 802.1Q, IPv4 or IPv6 with
//! extension headers, then TCP, UDP, SCTP or ICMP) and returns a small `Copy` summary with the
//! offsets and fields the pipeline needs, so no later step parses again. etherparse is used
//! by the tests as an independent parser to check this one against.

pub mod checksum;
pub mod ethernet;
pub mod icmp;
pub mod ipv4;
pub mod ipv6;
pub mod parse;
pub mod sctp;
pub mod tcp;
pub mod udp;

/// Reads a big-endian `u16` at `off`. Callers guarantee `off + 2 <= b.len()`.
#[inline(always)]
pub(crate) fn be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

/// Writes a big-endian `u16` at `off`. Callers guarantee `off + 2 <= b.len()`.
#[inline(always)]
pub(crate) fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_be_bytes());
}

/// Reads a big-endian `u32` at `off`. Callers guarantee `off + 4 <= b.len()`.
#[inline(always)]
pub(crate) fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Why a view could not be made over some bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// Fewer bytes than the header (or its stated length) needs.
    Truncated,
    /// A field holds a value the protocol forbids (bad version, header length too small).
    Malformed,
}
