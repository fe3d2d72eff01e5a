//! The frontend index: (VIP, port, protocol) to service index, probed by every packet.
//!
//! The index is written only by the table builder, off the packet path, and read by every
//! packet, so it is laid out for the read: one flat array of slots, each holding the whole
//! key and its service (24 bytes), sized to a power of two at a load of at most one half,
//! and probed linearly from the slot the hash names. A general map pays per lookup for what
//! it must be able to do (a keyed hasher fed field by field, control bytes, groups, a second
//! load for the entry); here a lookup is one multiply and, almost always, one slot whose key
//! (two 64-bit words and a 32-bit one) is compared with one branch. The hash is
//! multiplicative (Knuth's Fibonacci hashing: the product's top bits index the array): it
//! needs no seed because the keys are the operator's configuration, not a client's choice,
//! and the top bits of a product depend on every bit of the factor. The factor folds the
//! address's two halves into one word (an IPv4-mapped address's first half is zero, so IPv4
//! frontends hash by address, port and protocol alone, without collisions before the
//! multiply; IPv6 VIPs that differ in either half still spread). At a load of at most one
//! half a hit probes about 1.5 slots on average (1.0 to 1.4 for the evenly spaced VIPs and
//! ports operators configure) and a miss ends at the first empty slot; a thousand services take
//! 48 KB, which stays in the cache. The builder updates tables in place
//! ([`super::Builder::update`]), so the index takes insertions and removals too (removal
//! shifts the following entries back, as linear probing needs, leaving no tombstones).
//!
//! The nat backend index keeps a hashbrown map: it holds every nat backend (100,000 at
//! 10,000 services of 10), and [`super::Builder::update`] copies it for every change; at
//! half load this layout would be twice the map's size, and the copy with it.

use core::fmt;

use crate::key::{Addr, Proto};

/// Slots an empty index starts with (a power of two).
const MIN_SLOTS: usize = 8;

/// Knuth's multiplier: 2^64 divided by the golden ratio, made odd.
const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// The tag of an empty slot: no key's tag (port and protocol take its low 24 bits only).
const EMPTY: u32 = u32::MAX;

/// A key as slots store it: the VIP's 16 bytes as two words, and a tag of port and
/// protocol.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Key {
    addr: [u64; 2],
    tag: u32,
}

impl Key {
    #[inline(always)]
    fn of(addr: &Addr, port: u16, proto: Proto) -> Self {
        let w = u128::from_ne_bytes(addr.0);
        Self {
            addr: [w as u64, (w >> 64) as u64],
            tag: u32::from(port) << 8 | u32::from(proto.0),
        }
    }

    fn parts(&self) -> (Addr, u16, Proto) {
        let w = u128::from(self.addr[0]) | u128::from(self.addr[1]) << 64;
        (
            Addr(w.to_ne_bytes()),
            (self.tag >> 8) as u16,
            Proto(self.tag as u8),
        )
    }

    /// The multiplicative hash; the array index is its top bits.
    #[inline(always)]
    fn hash(&self) -> u64 {
        (self.addr[0] ^ self.addr[1] ^ u64::from(self.tag)).wrapping_mul(K)
    }
}

#[derive(Clone, Copy)]
struct Slot {
    addr: [u64; 2],
    /// [`EMPTY`] when the slot is empty.
    tag: u32,
    value: u32,
}

impl Slot {
    const EMPTY: Self = Self {
        addr: [0; 2],
        tag: EMPTY,
        value: 0,
    };

    #[inline(always)]
    fn is_empty(&self) -> bool {
        self.tag == EMPTY
    }

    /// Zero when the slot holds `k`: the three words compared at once, with one branch.
    #[inline(always)]
    fn differs(&self, k: &Key) -> u64 {
        (self.addr[0] ^ k.addr[0]) | (self.addr[1] ^ k.addr[1]) | u64::from(self.tag ^ k.tag)
    }

    #[inline(always)]
    fn key(&self) -> Key {
        Key {
            addr: self.addr,
            tag: self.tag,
        }
    }
}

/// Frontend to service index: an open-addressing table with linear probing (see the module
/// documentation).
pub(crate) struct Frontends {
    /// A power of two in length, at most half taken.
    slots: Vec<Slot>,
    /// 64 minus log2 of the slot count: a hash shifted right by it is a slot index.
    shift: u32,
    len: usize,
}

impl Frontends {
    /// An empty index.
    pub(crate) fn new() -> Self {
        Self::with_slots(MIN_SLOTS)
    }

    fn with_slots(n: usize) -> Self {
        debug_assert!(n.is_power_of_two() && n >= 2);
        Self {
            slots: vec![Slot::EMPTY; n],
            shift: 64 - n.trailing_zeros(),
            len: 0,
        }
    }

    /// Number of frontends.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The service of frontend (`addr`, `port`, `proto`).
    #[inline(always)]
    pub(crate) fn get(&self, addr: &Addr, port: u16, proto: Proto) -> Option<u32> {
        let k = Key::of(addr, port, proto);
        let mask = self.slots.len() - 1;
        let mut i = self.home(&k);
        loop {
            let s = &self.slots[i];
            if s.differs(&k) == 0 {
                return Some(s.value);
            }
            if s.is_empty() {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// The slot of `k`, or the empty slot where it would go.
    fn find(&self, k: &Key) -> Result<usize, usize> {
        let mask = self.slots.len() - 1;
        let mut i = self.home(k);
        loop {
            let s = &self.slots[i];
            if s.is_empty() {
                return Err(i);
            }
            if s.key() == *k {
                return Ok(i);
            }
            i = (i + 1) & mask;
        }
    }

    #[inline(always)]
    fn home(&self, k: &Key) -> usize {
        (k.hash() >> self.shift) as usize
    }

    /// The service of frontend (`addr`, `port`, `proto`), to change in place.
    pub(crate) fn get_mut(&mut self, addr: &Addr, port: u16, proto: Proto) -> Option<&mut u32> {
        let i = self.find(&Key::of(addr, port, proto)).ok()?;
        Some(&mut self.slots[i].value)
    }

    /// Room for `additional` more keys without growing.
    pub(crate) fn reserve(&mut self, additional: usize) {
        let want = (self.len + additional)
            .saturating_mul(2)
            .next_power_of_two();
        if want > self.slots.len() {
            self.rehash(want);
        }
    }

    fn rehash(&mut self, n: usize) {
        let old = core::mem::replace(self, Self::with_slots(n));
        for s in old.slots.iter().filter(|s| !s.is_empty()) {
            let k = s.key();
            if let Err(i) = self.find(&k) {
                self.slots[i] = *s;
            }
        }
        self.len = old.len;
    }

    /// Sets the service of frontend (`addr`, `port`, `proto`); returns the one it replaces.
    pub(crate) fn insert(
        &mut self,
        addr: Addr,
        port: u16,
        proto: Proto,
        value: u32,
    ) -> Option<u32> {
        self.reserve(1);
        let k = Key::of(&addr, port, proto);
        match self.find(&k) {
            Ok(i) => Some(core::mem::replace(&mut self.slots[i].value, value)),
            Err(i) => {
                self.slots[i] = Slot {
                    addr: k.addr,
                    tag: k.tag,
                    value,
                };
                self.len += 1;
                None
            }
        }
    }

    /// Removes (`addr`, `port`, `proto`); returns its value. The entries after it in its
    /// probe run move back into the hole where their home slot allows, so every lookup still
    /// ends at the first empty slot.
    pub(crate) fn remove(&mut self, addr: &Addr, port: u16, proto: Proto) -> Option<u32> {
        let mut hole = self.find(&Key::of(addr, port, proto)).ok()?;
        let value = self.slots[hole].value;
        let mask = self.slots.len() - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let s = self.slots[j];
            if s.is_empty() {
                break;
            }
            // The entry at j may fill the hole when the hole lies on its probe path, from
            // its home slot to j: its distance from home is at least the hole's from home.
            let home = self.home(&s.key());
            if j.wrapping_sub(home) & mask >= j.wrapping_sub(hole) & mask {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = Slot::EMPTY;
        self.len -= 1;
        Some(value)
    }

    /// Every ((address, port, protocol), value), in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = ((Addr, u16, Proto), u32)> + '_ {
        self.slots
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| (s.key().parts(), s.value))
    }

    /// Slots probed to find each key, summed (1 for a key in its home slot).
    #[cfg(test)]
    fn probes(&self) -> usize {
        let mask = self.slots.len() - 1;
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .map(|(i, s)| (i.wrapping_sub(self.home(&s.key())) & mask) + 1)
            .sum()
    }
}

impl Default for Frontends {
    fn default() -> Self {
        Self::new()
    }
}

impl Clone for Frontends {
    fn clone(&self) -> Self {
        Self {
            slots: self.slots.clone(),
            shift: self.shift,
            len: self.len,
        }
    }

    /// Copies into `self`'s slot array when it is large enough (the builder's spare table).
    fn clone_from(&mut self, source: &Self) {
        self.slots.clone_from(&source.slots);
        self.shift = source.shift;
        self.len = source.len;
    }
}

impl fmt::Debug for Frontends {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use proptest::prelude::*;

    use super::*;
    use crate::key::{addr_bytes, proto};

    type K = (Addr, u16, Proto);

    fn key(a: IpAddr, port: u16, protocol: Proto) -> K {
        (addr_bytes(a), port, protocol)
    }

    /// A key from a draw: addresses from small IPv4 and IPv6 pools (so that addresses
    /// repeat) or anywhere, ports from a small pool (so that they collide) or anywhere, any
    /// protocol.
    fn any_key() -> impl Strategy<Value = K> {
        let addr = prop_oneof![
            (0u8..40).prop_map(|d| IpAddr::V4(Ipv4Addr::new(203, 0, 113, d))),
            any::<u32>().prop_map(|a| IpAddr::V4(Ipv4Addr::from(a))),
            (0u16..40, 0u16..4)
                .prop_map(|(l, n)| IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, n, 0, 0, 0, 0, l))),
            any::<u128>().prop_map(|a| IpAddr::V6(Ipv6Addr::from(a))),
        ];
        let port = prop_oneof![
            prop::sample::select(vec![0u16, 53, 80, 443, 8080]),
            any::<u16>()
        ];
        let protocol = prop_oneof![
            prop::sample::select(vec![proto::TCP, proto::UDP, proto::SCTP]),
            any::<u8>().prop_map(Proto),
        ];
        (addr, port, protocol).prop_map(|(a, p, pr)| key(a, p, pr))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Against a std `HashMap`: after inserts (some of the same key again) and removals,
        /// every key present is found with its value, and the removed and never-inserted
        /// ones are not; a copy and in-place changes agree too.
        #[test]
        fn agrees_with_a_hash_map(
            inserts in prop::collection::vec(any_key(), 0..3000),
            removes in prop::collection::vec(any::<prop::sample::Index>(), 0..500),
            absent in prop::collection::vec(any_key(), 0..200),
        ) {
            let mut model: HashMap<K, u32> = HashMap::new();
            let mut index = Frontends::new();
            for (i, &(a, p, pr)) in inserts.iter().enumerate() {
                let v = i as u32;
                prop_assert_eq!(index.insert(a, p, pr, v), model.insert((a, p, pr), v));
            }
            prop_assert_eq!(index.len(), model.len());
            for k in &inserts {
                prop_assert_eq!(index.get(&k.0, k.1, k.2), model.get(k).copied(), "{:?}", k);
            }
            if !inserts.is_empty() {
                for r in &removes {
                    let k = r.get(&inserts);
                    let removed = index.remove(&k.0, k.1, k.2);
                    prop_assert_eq!(removed, model.remove(k), "remove {:?}", k);
                }
            }
            prop_assert_eq!(index.len(), model.len());
            for k in inserts.iter().chain(&absent) {
                prop_assert_eq!(index.get(&k.0, k.1, k.2), model.get(k).copied(), "{:?}", k);
            }
            let listed: HashMap<K, u32> = index.iter().collect();
            prop_assert_eq!(&listed, &model);
            prop_assert!(index.slots.len() >= 2 * index.len(), "load above one half");
            let mut copy = Frontends::new();
            copy.clone_from(&index);
            for k in inserts.iter().chain(&absent) {
                prop_assert_eq!(copy.get(&k.0, k.1, k.2), model.get(k).copied(), "copy: {:?}", k);
            }
            for (k, v) in &model {
                *index.get_mut(&k.0, k.1, k.2).unwrap() = v + 1;
                prop_assert_eq!(index.get(&k.0, k.1, k.2), Some(v + 1));
            }
        }
    }

    #[test]
    fn empty_index_finds_nothing() {
        let index = Frontends::new();
        let (a, p, pr) = key(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0, Proto(0));
        assert_eq!(index.get(&a, p, pr), None);
        assert_eq!(index.len(), 0);
    }

    /// Configurations as operators write them (consecutive VIPs on one port, one VIP with
    /// many ports, an IPv6 prefix, TCP and UDP twins) keep the mean probe short: the hash
    /// spreads structured keys, not only random ones.
    #[test]
    fn structured_frontends_probe_little() {
        let shapes: [(&str, Vec<K>); 4] = [
            (
                "consecutive IPv4 VIPs",
                (0..2000u32)
                    .map(|i| {
                        let a = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + i);
                        key(IpAddr::V4(a), 443, proto::TCP)
                    })
                    .collect(),
            ),
            (
                "one VIP, many ports",
                (0..2000u16)
                    .map(|p| key("203.0.113.7".parse().unwrap(), 30000 + p, proto::TCP))
                    .collect(),
            ),
            (
                "IPv6 VIPs in a /64 and across /48s",
                (0..2000u16)
                    .map(|i| {
                        let a = Ipv6Addr::new(0x2001, 0xdb8, i % 16, i / 16, 0, 0, 0, 1);
                        key(IpAddr::V6(a), 80, proto::TCP)
                    })
                    .collect(),
            ),
            (
                "TCP and UDP on ten VIPs",
                (0..2000u16)
                    .map(|i| {
                        let p = if i % 2 == 0 { proto::TCP } else { proto::UDP };
                        let a = Ipv4Addr::new(192, 0, 2, (i / 2 % 10) as u8);
                        key(IpAddr::V4(a), 1000 + i / 20, p)
                    })
                    .collect(),
            ),
        ];
        for (name, keys) in shapes {
            let mut index = Frontends::new();
            for (i, &(a, p, pr)) in keys.iter().enumerate() {
                assert_eq!(
                    index.insert(a, p, pr, i as u32),
                    None,
                    "{name}: {a:?} {p} twice"
                );
            }
            let mean = index.probes() as f64 / index.len() as f64;
            assert!(mean < 2.0, "{name}: mean probe {mean:.2} slots");
        }
    }

    #[test]
    fn a_thousand_frontends_take_tens_of_kilobytes() {
        let mut index = Frontends::new();
        for i in 0..1000u16 {
            let (a, p, pr) = key("203.0.113.1".parse().unwrap(), i, proto::TCP);
            index.insert(a, p, pr, 0);
        }
        let bytes = index.slots.len() * core::mem::size_of::<Slot>();
        assert_eq!(core::mem::size_of::<Slot>(), 24);
        assert!(bytes <= 48 * 1024, "{bytes} bytes");
    }
}
