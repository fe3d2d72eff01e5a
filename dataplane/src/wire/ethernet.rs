//! Ethernet II frames (IEEE 802.3) with an optional single 802.1Q tag.

use core::fmt;

use super::{be16, put16, Error};

/// Length of an untagged Ethernet header.
pub const HEADER_LEN: usize = 14;
/// Length of one 802.1Q tag.
pub const VLAN_TAG_LEN: usize = 4;
/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// EtherType of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// TPID of an 802.1Q tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// TPID of an 802.1ad (QinQ) service tag.
pub const ETHERTYPE_QINQ: u16 = 0x88a8;

/// A MAC address (IEEE 802), its six bytes in wire order. A newtype rather than `[u8; 6]`
/// so that a MAC is never taken for other bytes where it crosses a function boundary;
/// `#[repr(transparent)]`, so it is passed, stored and copied as the array is.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Address(pub [u8; 6]);

impl Address {
    /// The broadcast address, ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: Self = Self([0xff; 6]);

    /// The six bytes, in wire order.
    #[inline(always)]
    pub const fn octets(self) -> [u8; 6] {
        self.0
    }

    /// Whether this is a group (multicast or broadcast) address: the I/G bit, the least
    /// significant bit of the first byte.
    #[inline(always)]
    pub const fn is_multicast(self) -> bool {
        self.0[0] & 1 != 0
    }
}

impl From<[u8; 6]> for Address {
    #[inline(always)]
    fn from(b: [u8; 6]) -> Self {
        Self(b)
    }
}

impl From<Address> for [u8; 6] {
    #[inline(always)]
    fn from(a: Address) -> Self {
        a.0
    }
}

impl fmt::Display for Address {
    /// Six lower-case hex bytes joined by colons, as `ip link` shows them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

mod field {
    use core::ops::Range;
    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: usize = 12;
    pub const VLAN_TCI: usize = 14;
    pub const INNER_ETHERTYPE: usize = 16;
}

/// A view of an Ethernet frame.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T> {
    buf: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buf` after checking that it holds an Ethernet header, and the 802.1Q tag if the
    /// EtherType announces one. No accessor panics afterwards.
    ///
    /// # Errors
    /// [`Error::Truncated`] when the header or tag does not fit.
    pub fn new_checked(buf: T) -> Result<Self, Error> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if be16(b, field::ETHERTYPE) == ETHERTYPE_VLAN && b.len() < HEADER_LEN + VLAN_TAG_LEN {
            return Err(Error::Truncated);
        }
        Ok(Self { buf })
    }

    /// Wraps bytes the caller vouches for: accessors panic past the end of `buf`. For frames
    /// the pipeline parsed before it rewrites them.
    #[inline(always)]
    pub(crate) fn new_unchecked(buf: T) -> Self {
        Self { buf }
    }

    /// Destination MAC address.
    #[inline(always)]
    pub fn dst(&self) -> Address {
        let mut m = [0; 6];
        m.copy_from_slice(&self.buf.as_ref()[field::DST]);
        Address(m)
    }

    /// Source MAC address.
    #[inline(always)]
    pub fn src(&self) -> Address {
        let mut m = [0; 6];
        m.copy_from_slice(&self.buf.as_ref()[field::SRC]);
        Address(m)
    }

    /// The outer EtherType (0x8100 for a tagged frame).
    #[inline(always)]
    pub fn ethertype(&self) -> u16 {
        be16(self.buf.as_ref(), field::ETHERTYPE)
    }

    /// Whether the outer EtherType is `t`: [`Packet::ethertype`]` == t`, comparing the
    /// bytes as they lie, which saves a byte swap where a frame is tested for one or two.
    #[inline(always)]
    pub fn ethertype_is(&self, t: u16) -> bool {
        self.buf.as_ref()[field::ETHERTYPE..field::ETHERTYPE + 2] == t.to_be_bytes()
    }

    /// The VLAN id of an 802.1Q-tagged frame.
    pub fn vlan(&self) -> Option<u16> {
        (self.ethertype() == ETHERTYPE_VLAN)
            .then(|| be16(self.buf.as_ref(), field::VLAN_TCI) & 0x0fff)
    }

    /// The EtherType of the payload, after a VLAN tag if there is one.
    pub fn payload_ethertype(&self) -> u16 {
        match self.ethertype() {
            ETHERTYPE_VLAN => be16(self.buf.as_ref(), field::INNER_ETHERTYPE),
            t => t,
        }
    }

    /// Length of the header including a VLAN tag.
    pub fn header_len(&self) -> usize {
        match self.ethertype() {
            ETHERTYPE_VLAN => HEADER_LEN + VLAN_TAG_LEN,
            _ => HEADER_LEN,
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the destination MAC address.
    #[inline(always)]
    pub fn set_dst(&mut self, mac: Address) {
        self.buf.as_mut()[field::DST].copy_from_slice(&mac.0);
    }

    /// Sets the source MAC address.
    #[inline(always)]
    pub fn set_src(&mut self, mac: Address) {
        self.buf.as_mut()[field::SRC].copy_from_slice(&mac.0);
    }

    /// Sets the EtherType of the payload (after the VLAN tag if there is one) in a view over
    /// exactly the header, tag included ([`Packet::header_len`] bytes): its last two bytes.
    /// The rewrite knows the header's length from the parse, so the tag is not read again.
    #[inline(always)]
    pub fn set_payload_ethertype(&mut self, t: u16) {
        debug_assert_eq!(self.buf.as_ref().len(), self.header_len());
        let b = self.buf.as_mut();
        let at = b.len() - 2;
        put16(b, at, t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAGGED: [u8; 18] = [
        0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02, 0x81, 0x00, 0x20, 0x64, 0x08, 0x00,
    ];

    #[test]
    fn deconstruct_tagged() {
        let p = Packet::new_checked(&TAGGED[..]).unwrap();
        assert_eq!(p.dst(), Address([2, 0, 0, 0, 0, 1]));
        assert_eq!(p.src(), Address([2, 0, 0, 0, 0, 2]));
        assert_eq!(p.dst().to_string(), "02:00:00:00:00:01");
        assert!(!p.dst().is_multicast() && Address::BROADCAST.is_multicast());
        assert_eq!(p.ethertype(), ETHERTYPE_VLAN);
        assert_eq!(p.vlan(), Some(100));
        assert_eq!(p.payload_ethertype(), ETHERTYPE_IPV4);
        assert_eq!(p.header_len(), 18);
    }

    #[test]
    fn construct() {
        let mut b = TAGGED;
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.set_dst(Address([1, 2, 3, 4, 5, 6]));
        p.set_src([7, 8, 9, 10, 11, 12].into());
        assert_eq!(&b[..12], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        Packet::new_checked(&mut b[..])
            .unwrap()
            .set_payload_ethertype(ETHERTYPE_IPV6);
        assert_eq!(&b[12..], &[0x81, 0x00, 0x20, 0x64, 0x86, 0xdd]);
        let mut untagged = [0u8; 14];
        let mut p = Packet::new_checked(&mut untagged[..]).unwrap();
        p.set_payload_ethertype(ETHERTYPE_IPV4);
        assert_eq!(p.ethertype(), ETHERTYPE_IPV4);
    }

    #[test]
    fn truncated() {
        assert_eq!(
            Packet::new_checked(&TAGGED[..13]).unwrap_err(),
            Error::Truncated
        );
        assert_eq!(
            Packet::new_checked(&TAGGED[..17]).unwrap_err(),
            Error::Truncated
        );
        assert!(Packet::new_checked(&TAGGED[..14]).is_err());
    }
}
