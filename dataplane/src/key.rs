//! The flow key: a connection's 5-tuple in one fixed-size, hashable value.

use core::net::{IpAddr, Ipv6Addr};

use crate::hash::hash_words;

/// An IP protocol number (the IPv4 protocol field, the IPv6 next header after extension
/// headers): a type of its own where it crosses a function boundary, so that it is never
/// mistaken for one of the other bytes a packet path passes around (a TTL, a TCP flag byte, a
/// port's half). `#[repr(transparent)]`: free on the packet path.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, PartialOrd, Ord)]
pub struct Proto(pub u8);

/// IP protocol numbers the dataplane distinguishes.
pub mod proto {
    use super::Proto;
    /// ICMP for IPv4 (RFC 792).
    pub const ICMP: Proto = Proto(1);
    /// TCP (RFC 9293).
    pub const TCP: Proto = Proto(6);
    /// UDP (RFC 768).
    pub const UDP: Proto = Proto(17);
    /// SCTP (RFC 9260).
    pub const SCTP: Proto = Proto(132);
    /// ICMPv6 (RFC 4443).
    pub const ICMPV6: Proto = Proto(58);
    /// IPv4 encapsulated in IP (RFC 2003).
    pub const IPIP: Proto = Proto(4);
    /// IPv6 encapsulated in IP (RFC 2473).
    pub const IPV6: Proto = Proto(41);
}

/// An IPv4 or IPv6 address in the flow key's 16-byte form: an IPv6 address as it is, an IPv4
/// address IPv4-mapped (`::ffff:a.b.c.d`, RFC 4291 section 2.5.5.2), so that one key layout
/// and one hash serve both families and a v4 key never equals a v6 one. A type of its own
/// where it crosses a function boundary, apart from the wire's raw 16-byte IPv6 addresses
/// (`wire::ipv6`), which are never mapped. `#[repr(transparent)]`: free on the packet path.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, PartialOrd, Ord)]
pub struct Addr(pub [u8; 16]);

impl Addr {
    /// The 16 bytes.
    #[inline(always)]
    pub const fn octets(&self) -> &[u8; 16] {
        &self.0
    }
}

/// The bytes, read-only: slicing (`&a[12..]` is an IPv4 address's four) and comparing bytes
/// read as they did before the type had a name; changing one goes through `.0`, on purpose.
impl core::ops::Deref for Addr {
    type Target = [u8; 16];

    #[inline(always)]
    fn deref(&self) -> &[u8; 16] {
        &self.0
    }
}

/// A 5-tuple as seen on the wire, in the direction client to VIP.
///
/// Addresses are stored as 16 bytes; an IPv4 address is stored IPv4-mapped
/// (`::ffff:a.b.c.d`, RFC 4291 section 2.5.5.2), so v4 and v6 keys never collide and the key
/// has one layout. The struct is 40 bytes, five machine words, which the hash reads directly.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct FlowKey {
    /// Source (client) address.
    pub src: Addr,
    /// Destination (VIP) address.
    pub dst: Addr,
    /// Source port (0 for protocols without ports).
    pub src_port: u16,
    /// Destination port (0 for protocols without ports).
    pub dst_port: u16,
    /// IP protocol number.
    pub proto: Proto,
}

/// Maps a 4-byte IPv4 address into the 16-byte key form.
#[inline(always)]
pub const fn v4_mapped(a: [u8; 4]) -> Addr {
    Addr([
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a[0], a[1], a[2], a[3],
    ])
}

/// The IPv4 address a key-form address maps ([`v4_mapped`]'s inverse; meaningful where
/// [`is_v4`] holds).
/// A copy of the four bytes, not an array built of them one by one, which the
/// encapsulations pay for in instructions (`scripts/check-instructions.sh` shows it).
#[inline(always)]
pub fn v4_unmapped(a: &Addr) -> [u8; 4] {
    let mut v4 = [0; 4];
    v4.copy_from_slice(&a.0[12..]);
    v4
}

/// Converts an address into the 16-byte key form.
#[inline]
pub fn addr_bytes(ip: IpAddr) -> Addr {
    match ip {
        IpAddr::V4(v4) => v4_mapped(v4.octets()),
        IpAddr::V6(v6) => Addr(v6.octets()),
    }
}

/// Converts the 16-byte key form back into an address.
#[inline]
pub fn bytes_addr(b: Addr) -> IpAddr {
    let v6 = Ipv6Addr::from(b.0);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// Whether a 16-byte key address is an IPv4-mapped one.
#[inline(always)]
pub fn is_v4(b: &Addr) -> bool {
    b.0[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]
}

impl FlowKey {
    /// Builds a key from addresses and ports.
    pub fn new(src: IpAddr, dst: IpAddr, proto: Proto, src_port: u16, dst_port: u16) -> Self {
        Self {
            src: addr_bytes(src),
            dst: addr_bytes(dst),
            src_port,
            dst_port,
            proto,
        }
    }

    /// Hash of the full 5-tuple under `seed`.
    #[inline(always)]
    pub fn hash(&self, seed: u64) -> u64 {
        let ports =
            (self.src_port as u64) << 24 | (self.dst_port as u64) << 8 | self.proto.0 as u64;
        hash_words(
            seed,
            &[
                word(&self.src, 0),
                word(&self.src, 8),
                word(&self.dst, 0),
                word(&self.dst, 8),
                ports,
            ],
        )
    }

    /// Hash of (source address, destination address, protocol) only: the 3-tuple used where
    /// ports are unknown (non-first IP fragments) or deliberately ignored.
    #[inline(always)]
    pub fn hash3(&self, seed: u64) -> u64 {
        hash_words(
            seed,
            &[
                word(&self.src, 0),
                word(&self.src, 8),
                word(&self.dst, 0),
                word(&self.dst, 8),
                self.proto.0 as u64,
            ],
        )
    }

    /// Source address as an [`IpAddr`].
    pub fn src_addr(&self) -> IpAddr {
        bytes_addr(self.src)
    }

    /// Destination address as an [`IpAddr`].
    pub fn dst_addr(&self) -> IpAddr {
        bytes_addr(self.dst)
    }
}

/// Reads 8 bytes of a key address as a little-endian word (fixed endianness keeps hashes equal
/// across architectures).
#[inline(always)]
fn word(b: &Addr, i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b.0[i..i + 8]);
    u64::from_le_bytes(w)
}

/// A backend's stable identity across table snapshots.
///
/// The control plane hands out ids and keeps them for as long as a backend (service, address,
/// port) exists, so a flow entry that stores one still means the same backend after a reload.
/// A freed id may be reused later; flows check the stored rewrite target as well, so a reused
/// id never captures another backend's flows.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, PartialOrd, Ord)]
pub struct BackendId(pub u32);

/// A service's stable identity across table snapshots, kept by name, where
/// [`crate::table::ServiceTable::services`]' index is not (a removed service's index goes to
/// another). Dense from 0, a freed id reused later under a new incarnation
/// ([`crate::table::Service::incarnation`]); it names the service's traffic counters
/// ([`crate::traffic`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, PartialOrd, Ord)]
pub struct ServiceId(pub u32);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_mapped_round_trips() {
        let a = [192, 0, 2, 7];
        let m = v4_mapped(a);
        assert!(is_v4(&m));
        assert_eq!(v4_unmapped(&m), a);
        assert_eq!(bytes_addr(m), IpAddr::V4(a.into()));
        assert_eq!(addr_bytes(IpAddr::V4(a.into())), m);
    }
}
