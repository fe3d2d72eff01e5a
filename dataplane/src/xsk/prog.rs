//! The XDP steering program (`bpf/steer.bpf.c`): loading, attaching, and keeping its maps equal
//! to the service table.
//!
//! The program is attached through netlink (not a bpf_link), in native (driver) mode when the
//! driver has it and generic (skb) mode otherwise. A netlink-attached program survives a crash
//! of the process, so [`SteerProgram::attach`] first removes whatever program an earlier run
//! left on the interface; such a leftover is harmless meanwhile, because its redirects fall back
//! to `XDP_PASS` once the sockets in its XSKMAP are closed. [`Drop`] detaches the program if it
//! is still the one on the interface.

use std::collections::HashSet;
use std::hash::Hash;
use std::os::fd::{AsFd, AsRawFd};

use libbpf_rs::{MapCore, MapFlags, MapHandle};
use strait_config::model::Mode;

use super::attach::{embedded_object, Aligned, XdpProgram};
use super::{Port, XskError};
use crate::table::ServiceTable;

/// The compiled program, `bpf/steer.bpf.c`.
static OBJECT: &Aligned<[u8]> = embedded_object!("steer");

/// Name of the XDP function in `steer.bpf.c`.
const PROGRAM: &str = "strait_steer";

/// Bytes of an `endpoint_key`: address (16, key form), port (2, network order), protocol, pad.
type EndpointKey = [u8; 20];

/// The key `steer.bpf.c` uses for `frontends` and `nat_backends`.
fn endpoint_key(addr: &[u8; 16], port: u16, proto: u8) -> EndpointKey {
    let mut k = [0u8; 20];
    k[..16].copy_from_slice(addr);
    k[16..18].copy_from_slice(&port.to_be_bytes());
    k[18] = proto;
    k
}

/// How the program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// In the driver (`XDP_FLAGS_DRV_MODE`), before an skb exists.
    Native,
    /// Generic XDP (`XDP_FLAGS_SKB_MODE`), after the skb is built; works on every interface,
    /// slower.
    Generic,
}

/// Which attach modes to try.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttachPolicy {
    /// Native, falling back to generic.
    #[default]
    NativeOrGeneric,
    /// Native or fail.
    NativeOnly,
    /// Generic only.
    GenericOnly,
}

/// What [`SteerProgram::update_maps`] changed, over the three lookup maps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapSync {
    /// Keys inserted.
    pub added: u32,
    /// Keys deleted.
    pub removed: u32,
}

/// The program's own counters, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SteerCounters {
    /// Packets left to the kernel (`XDP_PASS`).
    pub passed: u64,
    /// Redirected: TCP/UDP to a frontend.
    pub frontend: u64,
    /// Redirected: TCP/UDP from a nat backend.
    pub nat_reply: u64,
    /// Redirected: ICMP errors to a VIP.
    pub icmp_error: u64,
    /// Redirected: non-first fragments to a VIP.
    pub fragment: u64,
}

/// The loaded, attached steering program of one interface.
#[derive(Debug)]
pub struct SteerProgram {
    /// The loaded and attached program; detaches itself on drop.
    prog: XdpProgram,
    mode: AttachMode,
    iface: String,
    xsks: MapHandle,
    frontends: Synced<EndpointKey>,
    nat_backends: Synced<EndpointKey>,
    vips: Synced<[u8; 16]>,
    locals: Synced<[u8; 16]>,
    stats: MapHandle,
}

/// A hash map and the keys we put in it.
#[derive(Debug)]
struct Synced<K> {
    map: MapHandle,
    keys: HashSet<K>,
    update: &'static str,
    delete: &'static str,
}

impl<K: AsRef<[u8]> + Eq + Hash + Copy> Synced<K> {
    fn new(map: MapHandle, update: &'static str, delete: &'static str) -> Self {
        Self {
            map,
            keys: HashSet::new(),
            update,
            delete,
        }
    }

    /// Makes the map hold exactly `want`: inserts first, then deletes, so a key present in
    /// both the old and the new table never disappears.
    fn sync(&mut self, iface: &str, want: &HashSet<K>, n: &mut MapSync) -> Result<(), XskError> {
        let one = 1u32.to_ne_bytes();
        let new: Vec<K> = want.difference(&self.keys).copied().collect();
        for k in new {
            self.map
                .update(k.as_ref(), &one, MapFlags::ANY)
                .map_err(|source| XskError::Bpf {
                    iface: iface.to_owned(),
                    call: self.update,
                    source,
                })?;
            self.keys.insert(k);
            n.added += 1;
        }
        let gone: Vec<K> = self.keys.difference(want).copied().collect();
        for k in gone {
            self.map
                .delete(k.as_ref())
                .map_err(|source| XskError::Bpf {
                    iface: iface.to_owned(),
                    call: self.delete,
                    source,
                })?;
            self.keys.remove(&k);
            n.removed += 1;
        }
        Ok(())
    }
}

impl SteerProgram {
    /// Loads the program, removes any XDP program already on `iface` (a stale one from an
    /// earlier run), and attaches ours as `policy` allows. The lookup maps start empty: call
    /// [`Self::update_maps`] and [`Self::register`].
    ///
    /// The interface is looked up in the calling thread's network namespace.
    ///
    /// # Errors
    /// [`XskError::NoInterface`]; [`XskError::Bpf`] when loading (the verifier's log is on
    /// stderr) or detaching the stale program fails; [`XskError::Attach`] when no allowed
    /// mode attaches.
    pub fn attach(iface: &str, policy: AttachPolicy) -> Result<Self, XskError> {
        let mut prog = XdpProgram::load(&OBJECT.0, PROGRAM, iface)?;
        let xsks = prog.map("xsks")?;
        let stats = prog.map("stats")?;
        let frontends = Synced::new(
            prog.map("frontends")?,
            "update frontends",
            "delete frontends",
        );
        let nat_backends = Synced::new(
            prog.map("nat_backends")?,
            "update nat_backends",
            "delete nat_backends",
        );
        let vips = Synced::new(prog.map("vips")?, "update vips", "delete vips");
        let locals = Synced::new(prog.map("locals")?, "update locals", "delete locals");
        // A program left by an earlier run (or anyone else) in either mode blocks ours:
        // `attach` removes it first.
        let mode = prog.attach(policy)?;
        Ok(Self {
            prog,
            mode,
            iface: iface.to_owned(),
            xsks,
            frontends,
            nat_backends,
            vips,
            locals,
            stats,
        })
    }

    /// The mode the program is attached in.
    pub fn mode(&self) -> AttachMode {
        self.mode
    }

    /// Ids of the programs found on the interface and removed by [`Self::attach`].
    pub fn replaced_programs(&self) -> &[u32] {
        self.prog.replaced()
    }

    /// The kernel's id of our program.
    pub fn program_id(&self) -> u32 {
        self.prog.id()
    }

    /// Directs the interface's queue `queue` to `port`'s socket.
    ///
    /// # Errors
    /// [`XskError::Bpf`] if the XSKMAP update fails (queue beyond the map's 256 slots).
    pub fn register(&self, queue: u32, port: &Port) -> Result<(), XskError> {
        let fd = port.as_fd().as_raw_fd() as u32;
        self.xsks
            .update(&queue.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
            .map_err(|source| XskError::Bpf {
                iface: self.iface.clone(),
                call: "update xsks",
                source,
            })
    }

    /// Stops directing queue `queue` to a socket (its traffic goes to the kernel).
    ///
    /// # Errors
    /// [`XskError::Bpf`] if the XSKMAP delete fails (e.g. nothing registered).
    pub fn unregister(&self, queue: u32) -> Result<(), XskError> {
        self.xsks
            .delete(&queue.to_ne_bytes())
            .map_err(|source| XskError::Bpf {
                iface: self.iface.clone(),
                call: "delete xsks",
                source,
            })
    }

    /// Makes the lookup maps follow `t`: frontends of every service, (address, port,
    /// protocol) of every backend of a nat service, and every VIP. New keys are inserted
    /// before gone ones are deleted.
    ///
    /// # Errors
    /// [`XskError::Bpf`] on a failed map update (e.g. a map full); the maps then hold the
    /// new keys added so far and all old keys not yet deleted, and a later call completes
    /// the change.
    pub fn update_maps(&mut self, t: &ServiceTable) -> Result<MapSync, XskError> {
        let mut frontends = HashSet::new();
        let mut nat = HashSet::new();
        let mut vips = HashSet::new();
        for s in &t.services {
            let f = &s.frontend;
            frontends.insert(endpoint_key(&f.vip, f.port, f.proto));
            vips.insert(f.vip);
        }
        for b in t.backends.iter().flatten() {
            let Some(s) = t.services.get(b.service as usize) else {
                continue;
            };
            if s.mode == Mode::Nat {
                nat.insert(endpoint_key(&b.addr, b.port, s.frontend.proto));
            }
        }
        let mut n = MapSync::default();
        self.frontends.sync(&self.iface, &frontends, &mut n)?;
        self.nat_backends.sync(&self.iface, &nat, &mut n)?;
        self.vips.sync(&self.iface, &vips, &mut n)?;
        let locals: HashSet<[u8; 16]> = t.locals.iter().copied().collect();
        self.locals.sync(&self.iface, &locals, &mut n)?;
        Ok(n)
    }

    /// The program's counters, summed over CPUs.
    ///
    /// # Errors
    /// [`XskError::Bpf`] if the per-CPU lookup fails.
    pub fn counters(&self) -> Result<SteerCounters, XskError> {
        let mut v = [0u64; 5];
        for (slot, out) in v.iter_mut().enumerate() {
            let per_cpu = self
                .stats
                .lookup_percpu(&(slot as u32).to_ne_bytes(), MapFlags::ANY)
                .map_err(|source| XskError::Bpf {
                    iface: self.iface.clone(),
                    call: "lookup stats",
                    source,
                })?
                .unwrap_or_default();
            *out = per_cpu
                .iter()
                .filter_map(|b| b.get(..8))
                .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])))
                .sum();
        }
        Ok(SteerCounters {
            passed: v[0],
            frontend: v[1],
            nat_reply: v[2],
            icmp_error: v[3],
            fragment: v[4],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_key_layout_matches_the_c_struct() {
        let mut a = [0u8; 16];
        a[10] = 0xff;
        a[11] = 0xff;
        a[12..].copy_from_slice(&[203, 0, 113, 10]);
        let k = endpoint_key(&a, 80, 6);
        assert_eq!(&k[..16], &a);
        assert_eq!(&k[16..18], &[0, 80]);
        assert_eq!(k[18], 6);
        assert_eq!(k[19], 0);
    }

    #[test]
    fn object_is_embedded() {
        super::super::attach::assert_embedded(&OBJECT.0);
    }
}
