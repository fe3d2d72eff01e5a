//! The steering program's fast copy of its `frontends` and `nat_backends` hash maps: `fast`
//! in `bpf/steer.bpf.c`.
//!
//! A hash map's lookup is a call into the kernel; an array's the verifier inlines. So the
//! program asks an open-addressed array of every key of the two maps first, and the hash map
//! when the array does not have the key (see the top of `steer.bpf.c`). A key lives in the
//! first empty slot of [`PROBES`] from its home slot ([`home`]), with its kind in its last
//! byte so that an all-zero slot is empty and a frontend and a nat backend of one address and
//! port are two keys. A probe stops at the key (found), or at an empty slot or after
//! [`PROBES`] slots (not found: ask the map). So the copy can only be behind the maps, never
//! wrong about what they hold in the other direction: a key not copied yet, or one that did
//! not fit its window (the overflow), costs the map's lookup and is found there.
//!
//! [`Shadow`] keeps the array's contents in memory and edits them (linear probing, deletion
//! by backward shift, so no tombstones and no slot left empty between a key's home and its
//! slot, which a probe would stop at).
//!
//! [`FastCopy`] keeps two arrays in the kernel equal to the shadow and one of them in `fast`.
//! A change is written into the array the program does not see, that array is swapped in,
//! and the change is written into the other. Swapping is an update of an array of maps,
//! which returns only after an RCU grace period (the kernel's `maybe_wait_bpf_programs`):
//! no program run still holds the array swapped out, so it can be written at once. A frame
//! therefore sees one whole array, the old one or the new one, and a key taken out of the maps
//! is found in the copy until the swap returns (one grace period; the maps' own updates
//! follow the workers' table the same way, by the time their calls take).

use std::os::fd::{AsFd, AsRawFd};

use hashbrown::{HashMap, HashSet};
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};

use super::XskError;
use crate::key::{Addr, Proto};

/// A key of `frontends` or `nat_backends` (`struct endpoint_key` of `steer.bpf.c`): address
/// (16, key form), port (2, network order), protocol, and the kind byte (0 in the hash maps).
pub(super) type EndpointKey = [u8; 20];

/// Slots of one array: a power of two, `FAST_SLOTS` in `steer.bpf.c`. A gateway of 10,000
/// nat Services of 10 endpoints (110,000 keys) fills 42 % of it. Past about half full, more
/// keys do not fit their window and are found through the hash maps (the hash maps hold up to
/// 65,536 frontends and 262,144 nat backends); the array costs 6 MiB in the kernel.
pub(super) const SLOTS: usize = 1 << 18;

/// Memory one interface's copy takes: its two arrays in the kernel (a slot takes 24 bytes
/// there, the key rounded up to 8) and the shadow in this process (the slots; the keys that
/// did not fit come on top, a few dozen bytes each).
pub const BYTES: u64 = (2 * SLOTS * 24 + SLOTS * 20) as u64;

/// Slots a probe reads from a key's home before the program asks the hash map
/// (`FAST_PROBES` in `steer.bpf.c`).
pub(super) const PROBES: usize = 8;

/// Which hash map a key copies: its last byte (`FAST_FRONTEND`, `FAST_NAT_BACKEND` in
/// `steer.bpf.c`). Never 0, so that an all-zero slot is empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Kind {
    Frontend = 1,
    NatBackend = 2,
}

/// The key `steer.bpf.c` uses for `frontends` and `nat_backends` (kind 0).
pub(super) fn endpoint_key(addr: &Addr, port: u16, proto: Proto) -> EndpointKey {
    let mut k = [0u8; 20];
    k[..16].copy_from_slice(addr.octets());
    k[16..18].copy_from_slice(&port.to_be_bytes());
    k[18] = proto.0;
    k
}

/// `k` as a key of the copy: its kind byte set.
pub(super) fn key(mut k: EndpointKey, kind: Kind) -> EndpointKey {
    k[19] = kind as u8;
    k
}

/// A key's home slot in an array of `slots` slots (a power of two), as `fast_home` of
/// `steer.bpf.c` computes it for [`SLOTS`]: the key's five native-endian 32-bit words folded
/// with a multiply each, the top bits taken.
pub(super) fn home(k: &EndpointKey, slots: usize) -> usize {
    const M: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut words = k
        .chunks_exact(4)
        .map(|w| u64::from(u32::from_ne_bytes([w[0], w[1], w[2], w[3]])));
    let first = words.next().unwrap_or(0);
    let h = words
        .fold(first, |h, w| h.wrapping_mul(M) ^ w)
        .wrapping_mul(M);
    (h >> (64 - slots.trailing_zeros())) as usize
}

const EMPTY: EndpointKey = [0; 20];

/// The array's contents in memory, and the slots changed since they were last written out.
pub(super) struct Shadow {
    slots: Vec<EndpointKey>,
    /// Full slots.
    placed: usize,
    /// Keys not placed: their window was full, or the array was at [`Shadow::cap`]. The
    /// program finds them in the hash map. One is placed when a slot of its window frees.
    overflow: HashSet<EndpointKey>,
    /// The overflow by home slot.
    waiting: HashMap<usize, Vec<EndpointKey>>,
    /// Slots changed since [`Shadow::take_dirty`].
    dirty: Vec<usize>,
}

impl Shadow {
    /// An empty array of `slots` slots (a power of two, at least [`PROBES`]).
    pub(super) fn new(slots: usize) -> Self {
        assert!(slots.is_power_of_two() && slots >= PROBES);
        Self {
            slots: vec![EMPTY; slots],
            placed: 0,
            overflow: HashSet::new(),
            waiting: HashMap::new(),
            dirty: Vec::new(),
        }
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The most keys placed: seven eighths of the slots. The maps may hold more keys than
    /// there are slots; keeping an eighth empty keeps runs short, so that a removal's walk to
    /// the end of its run stays short too.
    fn cap(&self) -> usize {
        self.slots.len() - self.slots.len() / 8
    }

    /// The slot holding `k`, if placed: a key sits before any empty slot of its window. The
    /// program's probe, `fast_has` of `steer.bpf.c`, is this walk.
    fn find(&self, k: &EndpointKey) -> Option<usize> {
        let h = home(k, self.slots.len());
        for i in 0..PROBES {
            let s = (h + i) & self.mask();
            if self.slots[s] == *k {
                return Some(s);
            }
            if self.slots[s] == EMPTY {
                return None;
            }
        }
        None
    }

    /// Adds `k` (its kind set): in the first empty slot of its window, else to the overflow.
    pub(super) fn insert(&mut self, k: EndpointKey) {
        if self.overflow.contains(&k) || self.find(&k).is_some() {
            return;
        }
        if !self.place(k) {
            self.overflow.insert(k);
            let h = home(&k, self.slots.len());
            self.waiting.entry(h).or_default().push(k);
        }
    }

    /// Puts `k` in the first empty slot of its window; false if the window is full or the
    /// array at its cap.
    fn place(&mut self, k: EndpointKey) -> bool {
        if self.placed >= self.cap() {
            return false;
        }
        let h = home(&k, self.slots.len());
        let Some(s) = (0..PROBES)
            .map(|i| (h + i) & self.mask())
            .find(|&s| self.slots[s] == EMPTY)
        else {
            return false;
        };
        self.slots[s] = k;
        self.placed += 1;
        self.dirty.push(s);
        true
    }

    /// Takes `k` out. The keys after it in its run move back into the hole where that brings
    /// them no farther from home (backward shift), so no slot between a key's home and its
    /// slot is left empty; then an overflowed key whose window holds the one slot freed is
    /// placed.
    pub(super) fn remove(&mut self, k: &EndpointKey) {
        if self.overflow.remove(k) {
            let h = home(k, self.slots.len());
            if let Some(w) = self.waiting.get_mut(&h) {
                w.retain(|o| o != k);
                if w.is_empty() {
                    self.waiting.remove(&h);
                }
            }
            return;
        }
        let Some(mut hole) = self.find(k) else {
            return;
        };
        let mask = self.mask();
        self.slots[hole] = EMPTY;
        self.placed -= 1;
        self.dirty.push(hole);
        // The run after the hole ends at an empty slot; there is always one, the hole.
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let kj = self.slots[j];
            if kj == EMPTY {
                break;
            }
            let h = home(&kj, self.slots.len());
            // kj may fill the hole if the hole lies between its home and its slot.
            if (hole.wrapping_sub(h) & mask) < (j.wrapping_sub(h) & mask) {
                self.slots[hole] = kj;
                self.slots[j] = EMPTY;
                self.dirty.extend([hole, j]);
                hole = j;
            }
        }
        // The one slot freed: an overflowed key whose window holds it is placed (in it, or in
        // an earlier empty slot of its window if it waited for the cap).
        for d in 0..PROBES {
            let h = hole.wrapping_sub(d) & mask;
            let Some(w) = self.waiting.get_mut(&h) else {
                continue;
            };
            let Some(k) = w.pop() else { continue };
            if w.is_empty() {
                self.waiting.remove(&h);
            }
            self.overflow.remove(&k);
            let placed = self.place(k);
            debug_assert!(placed, "a key fits the freed slot of its window");
            break;
        }
    }

    /// Slots changed since the last call, each once, in order.
    pub(super) fn take_dirty(&mut self) -> Vec<usize> {
        let mut d = std::mem::take(&mut self.dirty);
        d.sort_unstable();
        d.dedup();
        d
    }

    /// Every full slot and its key.
    pub(super) fn full(&self) -> impl Iterator<Item = (usize, &EndpointKey)> + '_ {
        self.slots.iter().enumerate().filter(|(_, k)| **k != EMPTY)
    }

    /// The key in slot `s` (all zero when empty).
    pub(super) fn slot(&self, s: usize) -> &EndpointKey {
        &self.slots[s]
    }

    /// Keys that did not fit within their window.
    pub(super) fn overflowed(&self) -> usize {
        self.overflow.len()
    }
}

/// The copy in the kernel: two arrays equal to a [`Shadow`], one of them in `fast`.
pub(super) struct FastCopy {
    /// The program's `fast`: an array of maps with one slot.
    outer: MapHandle,
    shadow: Shadow,
    /// The two arrays and which one `fast` holds; `None` until the first sync, and after a
    /// sync failed (then `fast` is emptied, unless that fails too, and the next sync starts
    /// over with new arrays).
    arrays: Option<([MapHandle; 2], usize)>,
}

impl FastCopy {
    pub(super) fn new(outer: MapHandle) -> Self {
        Self {
            outer,
            shadow: Shadow::new(SLOTS),
            arrays: None,
        }
    }

    /// The contents the arrays are to hold.
    pub(super) fn shadow_mut(&mut self) -> &mut Shadow {
        &mut self.shadow
    }

    /// Keys that did not fit within their window (the program asks the hash maps for them).
    pub(super) fn overflowed(&self) -> usize {
        self.shadow.overflowed()
    }

    /// Brings the kernel's arrays in line with the shadow: the changed slots into the array
    /// the program does not see, a swap, then the same slots into the other. The first time
    /// (and after a failure) two new arrays are made and filled whole.
    ///
    /// # Errors
    /// [`XskError::Bpf`] when a map call fails. `fast` is then emptied, so the program asks
    /// the hash maps rather than a stale copy, and the next sync starts over.
    pub(super) fn sync(&mut self, iface: &str) -> Result<(), XskError> {
        let dirty = self.shadow.take_dirty();
        if self.arrays.is_some() && dirty.is_empty() {
            return Ok(());
        }
        let bpf = |call: &'static str| {
            move |source| XskError::Bpf {
                iface: iface.to_owned(),
                call,
                source,
            }
        };
        let result = match self.arrays.take() {
            Some((arrays, active)) => {
                let spare = 1 - active;
                self.write(&arrays[spare], &dirty)
                    .map_err(bpf("fill fast array"))
                    .and_then(|()| swap_in(&self.outer, &arrays[spare]).map_err(bpf("update fast")))
                    .and_then(|()| {
                        self.write(&arrays[active], &dirty)
                            .map_err(bpf("fill fast array"))
                    })
                    .map(|()| (arrays, spare))
            }
            None => self
                .fresh()
                .map_err(bpf("create fast array"))
                .and_then(|arrays| {
                    swap_in(&self.outer, &arrays[0])
                        .map_err(bpf("update fast"))
                        .map(|()| (arrays, 0))
                }),
        };
        match result {
            Ok(arrays) => {
                self.arrays = Some(arrays);
                Ok(())
            }
            Err(e) => match self.outer.delete(&0u32.to_ne_bytes()) {
                Ok(()) => Err(e),
                Err(d) if d.kind() == libbpf_rs::ErrorKind::NotFound => Err(e),
                // A stale copy stays in: the program may steer by it until a later sync
                // succeeds. Say so over the first error.
                Err(d) => Err(bpf("delete fast")(d)),
            },
        }
    }

    /// Writes slots `dirty` of the shadow into `array`.
    fn write(&self, array: &MapHandle, dirty: &[usize]) -> Result<(), libbpf_rs::Error> {
        for &s in dirty {
            array.update(
                &(s as u32).to_ne_bytes(),
                self.shadow.slot(s),
                MapFlags::ANY,
            )?;
        }
        Ok(())
    }

    /// Two new arrays, each holding the whole shadow.
    fn fresh(&self) -> Result<[MapHandle; 2], libbpf_rs::Error> {
        let make = || -> Result<MapHandle, libbpf_rs::Error> {
            let opts = libbpf_rs::libbpf_sys::bpf_map_create_opts {
                sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_create_opts>() as _,
                ..Default::default()
            };
            let a = MapHandle::create(
                MapType::Array,
                Some("strait_fast"),
                4,
                20,
                SLOTS as u32,
                &opts,
            )?;
            for (s, k) in self.shadow.full() {
                a.update(&(s as u32).to_ne_bytes(), k, MapFlags::ANY)?;
            }
            Ok(a)
        };
        Ok([make()?, make()?])
    }
}

/// Puts `array` into slot 0 of `outer`; returns after no program run holds the array it
/// replaced.
fn swap_in(outer: &MapHandle, array: &MapHandle) -> Result<(), libbpf_rs::Error> {
    let fd = array.as_fd().as_raw_fd() as u32;
    outer.update(&0u32.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::v4_mapped;
    use proptest::prelude::*;

    /// The invariant the program's probe relies on, and the books' agreement with the slots.
    fn check(s: &Shadow) {
        let n = s.slots.len();
        for (slot, k) in s.full() {
            let h = home(k, n);
            let d = slot.wrapping_sub(h) & s.mask();
            assert!(d < PROBES, "slot {slot} is {d} from home {h}");
            for i in 0..d {
                assert_ne!(
                    s.slots[(h + i) & s.mask()],
                    EMPTY,
                    "hole before slot {slot}"
                );
            }
            assert_eq!(s.find(k), Some(slot));
        }
        assert_eq!(s.placed, s.full().count());
        assert!(s.placed <= s.cap());
        assert_eq!(
            s.waiting.values().map(Vec::len).sum::<usize>(),
            s.overflow.len()
        );
        for k in &s.overflow {
            assert!(s.waiting.get(&home(k, n)).is_some_and(|w| w.contains(k)));
            assert_eq!(s.find(k), None, "an overflowed key is also placed");
        }
    }

    fn k(n: u16) -> EndpointKey {
        let addr = v4_mapped([203, 0, 113, (n >> 8) as u8]);
        key(endpoint_key(&addr, n, Proto(6)), Kind::Frontend)
    }

    proptest! {
        /// Random inserts and removes in a small array (64 slots, so windows collide and keys
        /// overflow): after every step the invariant holds, the program's probe finds every
        /// key held but the overflowed ones, and finds no key not held.
        #[test]
        fn probes_answer_right_after_any_edits(ops in proptest::collection::vec((any::<bool>(), 0u16..96), 1..400)) {
            let mut s = Shadow::new(64);
            let mut held = std::collections::BTreeSet::new();
            for (add, n) in ops {
                if add {
                    s.insert(k(n));
                    held.insert(n);
                } else {
                    s.remove(&k(n));
                    held.remove(&n);
                }
                check(&s);
                for n in 0..96 {
                    let at = s.find(&k(n));
                    if held.contains(&n) {
                        prop_assert!(at.is_some() || s.overflow.contains(&k(n)), "key {n} lost");
                    } else {
                        prop_assert!(at.is_none(), "key {n} found though removed");
                    }
                }
            }
        }
    }

    #[test]
    fn dirty_slots_are_the_changed_ones() {
        let mut s = Shadow::new(64);
        s.insert(k(1));
        s.insert(k(2));
        let first = s.take_dirty();
        assert_eq!(first.len(), 2);
        assert!(s.take_dirty().is_empty());
        s.remove(&k(1));
        let d = s.take_dirty();
        assert!(d.contains(&first[0]) || d.contains(&first[1]));
        assert_eq!(s.full().count(), 1);
    }

    #[test]
    fn home_is_the_programs() {
        // Pinned: a change here needs the same change to fast_home of steer.bpf.c, or every
        // probe misses (dataplane/tests/xsk.rs runs the program on every key to check that
        // the two agree). IPv4 198.51.100.10, port 80, TCP, a frontend.
        let k = endpoint_key(&v4_mapped([198, 51, 100, 10]), 80, Proto(6));
        assert_eq!(home(&key(k, Kind::Frontend), 1 << 17), 122_482);
        assert!(home(&key(k, Kind::NatBackend), SLOTS) < SLOTS);
    }
}
