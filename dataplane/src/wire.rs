//! Zero-copy views over packet bytes, and the one-pass parser the pipeline runs.
//!
//! Each protocol module has a `Packet<T: AsRef<[u8]>>` view in the style of smoltcp: field
//! offsets are the constants of the module's `field` module and appear nowhere else,
//! `new_checked` validates lengths once, after which no accessor panics; setters exist only
//! where `T: AsMut<[u8]>`. Views never cast bytes to structs. The rewrites
//! ([`crate::rewrite`]) touch a frame only through these views, and headers written whole
//! are described by each module's `Repr` and written by its `emit`.
//!
//! The accessors are `#[inline(always)]`: a view is a slice and constant offsets, so after
//! inlining an accessor is the load or store the raw offset would be, with the same bounds
//! check.
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
#[cfg(test)]
mod parse_tests;
pub mod ports;
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

/// The IP version a packet states in the high nibble of its first byte, where IPv4 and IPv6
/// both keep it: for telling them apart before either view is made.
#[inline(always)]
pub const fn ip_version(first: u8) -> u8 {
    first >> 4
}

/// Where a field of more than one byte lies in its header.
pub(crate) type Field = core::ops::Range<usize>;

/// Reads the big-endian `u16` field `f` (two bytes). Callers guarantee `f.end <= b.len()`.
#[inline(always)]
pub(crate) fn get16(b: &[u8], f: Field) -> u16 {
    debug_assert_eq!(f.len(), 2);
    be16(b, f.start)
}

/// Writes the big-endian `u16` field `f` (two bytes). Callers guarantee `f.end <= b.len()`.
#[inline(always)]
pub(crate) fn set16(b: &mut [u8], f: Field, v: u16) {
    debug_assert_eq!(f.len(), 2);
    put16(b, f.start, v);
}

/// Reads the big-endian `u32` field `f` (four bytes). Callers guarantee `f.end <= b.len()`.
#[inline(always)]
pub(crate) fn get32(b: &[u8], f: Field) -> u32 {
    debug_assert_eq!(f.len(), 4);
    be32(b, f.start)
}

/// Writes the big-endian `u32` field `f` (four bytes). Callers guarantee `f.end <= b.len()`.
#[inline(always)]
pub(crate) fn set32(b: &mut [u8], f: Field, v: u32) {
    debug_assert_eq!(f.len(), 4);
    b[f.start..f.start + 4].copy_from_slice(&v.to_be_bytes());
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
