//! The XDP steering program (`bpf/steer.bpf.c`): loading, attaching, and keeping its maps equal
//! to the service table.
//!
//! The program is attached through netlink (not a bpf_link), in native (driver) mode when the
//! driver has it and generic (skb) mode otherwise. A netlink-attached program survives a crash
//! of the process, so [`SteerProgram::attach`] first removes whatever program an earlier run
//! left on the interface; such a leftover is harmless meanwhile, because its redirects fall back
//! to `XDP_PASS` once the sockets in its XSKMAP are closed. [`Drop`] detaches the program if it
//! is still the one on the interface.
//!
//! The maps follow the table by its changes, not by a recount. [`SteerProgram::update_maps`]
//! keeps the table it last followed and compares the next one with it by service identity:
//! [`Builder::update`](crate::table::Builder::update) shares every unchanged service's `Arc`
//! between two snapshots, so only the services whose `Arc` came or went are looked at. A change
//! to one service of 10,000 then costs a walk over the service pointers plus that service's
//! keys (microseconds), where recounting every frontend and nat backend cost milliseconds, on
//! every EndpointSlice change. Keys are shared (services on one VIP, a nat backend in several
//! services), so each key has a count of the services that want it and is in its map while
//! the count is above zero. A full [`Builder::build`](crate::table::Builder::build) makes every
//! `Arc` new; when most services differ, the counts are made again from the new table alone,
//! which is then cheaper than counting every service out and in.
//!
//! The counts follow each table in memory before any map call is made, and whether each key
//! is in its kernel map is booked apart: a map call that fails (a full map) leaves its key
//! pending, to be retried by the next call, and nothing diverged that would need a recount.
//!
//! The keys that went into or out of `frontends` and `nat_backends` then go into or out of
//! the program's array copy of the two ([`super::fast`]), which it asks before them.

use std::fmt;
use std::hash::Hash;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

use hashbrown::{HashMap, HashSet};
use libbpf_rs::{MapCore, MapFlags, MapHandle};
use strait_config::model::Mode;

use super::attach::{Aligned, AttachMode, AttachPolicy, XdpProgram};
use super::fast::{self, endpoint_key, EndpointKey, FastCopy};
use super::{QueueSocket, XskError};
use crate::embedded_object;
use crate::table::{Service, ServiceTable};
use crate::wire::ethernet::Address as Mac;

/// The compiled program, `bpf/steer.bpf.c`.
static OBJECT: &Aligned<[u8]> = embedded_object!("steer");

/// Name of the XDP function in `steer.bpf.c`.
const PROGRAM: &str = "strait_steer";

/// What [`SteerProgram::update_maps`] changed, over the lookup maps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapSync {
    /// Keys inserted.
    pub added: u32,
    /// Keys deleted.
    pub removed: u32,
}

/// The program's own counters, summed over CPUs. Each frame the program sees is counted in
/// exactly one field, so [`Self::total`] is every frame the interface received while the
/// program was attached: [`Self::passed_total`] went to the kernel, [`Self::redirected`] to
/// the AF_XDP sockets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SteerCounters {
    /// Passed (`XDP_PASS`): not service traffic, or not IP, or broadcast/multicast.
    pub passed: u64,
    /// Redirected: TCP/UDP to a frontend.
    pub frontend: u64,
    /// Redirected: TCP/UDP from a nat backend.
    pub nat_reply: u64,
    /// Redirected: ICMP errors to a VIP.
    pub icmp_error: u64,
    /// Redirected: non-first fragments to a VIP.
    pub fragment: u64,
    /// Passed: unicast to another host's MAC (the kernel drops it as `PACKET_OTHERHOST`).
    pub other_host: u64,
    /// Passed: tagged with a VLAN the interface does not serve.
    pub vlan: u64,
    /// Passed: a header cut short or invalid where the program reads it.
    pub malformed: u64,
    /// Passed: service traffic on a queue with no socket registered.
    pub no_socket: u64,
}

impl SteerCounters {
    /// Slots of the program's `stats` map, in its order.
    const SLOTS: usize = 9;

    /// Frames passed to the kernel.
    pub fn passed_total(&self) -> u64 {
        self.passed + self.other_host + self.vlan + self.malformed + self.no_socket
    }

    /// Frames redirected to the AF_XDP sockets.
    pub fn redirected(&self) -> u64 {
        self.frontend + self.nat_reply + self.icmp_error + self.fragment
    }

    /// Every frame the program saw.
    pub fn total(&self) -> u64 {
        self.passed_total() + self.redirected()
    }

    /// What each counter gained since `before` (an earlier reading of the same counters).
    pub fn since(&self, before: &SteerCounters) -> SteerCounters {
        SteerCounters {
            passed: self.passed.wrapping_sub(before.passed),
            frontend: self.frontend.wrapping_sub(before.frontend),
            nat_reply: self.nat_reply.wrapping_sub(before.nat_reply),
            icmp_error: self.icmp_error.wrapping_sub(before.icmp_error),
            fragment: self.fragment.wrapping_sub(before.fragment),
            other_host: self.other_host.wrapping_sub(before.other_host),
            vlan: self.vlan.wrapping_sub(before.vlan),
            malformed: self.malformed.wrapping_sub(before.malformed),
            no_socket: self.no_socket.wrapping_sub(before.no_socket),
        }
    }

    /// Every counter as (verdict, reason, frames): verdict `"pass"` or `"redirect"`, reason
    /// the field's name (`"kernel"` for [`Self::passed`]).
    pub fn by_reason(&self) -> [(&'static str, &'static str, u64); Self::SLOTS] {
        [
            ("pass", "kernel", self.passed),
            ("pass", "other_host", self.other_host),
            ("pass", "vlan", self.vlan),
            ("pass", "malformed", self.malformed),
            ("pass", "no_socket", self.no_socket),
            ("redirect", "frontend", self.frontend),
            ("redirect", "nat_reply", self.nat_reply),
            ("redirect", "icmp_error", self.icmp_error),
            ("redirect", "fragment", self.fragment),
        ]
    }
}

/// Bytes of the program's `port_conf`: the MAC (6), padding (2), the VLAN bitmap (512).
type PortConf = [u8; 520];

/// The `port_conf` of an interface with MAC `mac` serving VLANs `vlans` (besides untagged).
/// Ids outside 1..=4094 are ignored (the configuration refuses them).
fn port_conf(mac: Mac, vlans: &[u16]) -> PortConf {
    let mut c = [0u8; 520];
    c[..6].copy_from_slice(&mac.0);
    let mut words = [0u64; 64];
    for &v in vlans.iter().filter(|v| (1..=4094).contains(*v)) {
        words[v as usize / 64] |= 1 << (v % 64);
    }
    for (out, w) in c[8..].chunks_exact_mut(8).zip(words) {
        out.copy_from_slice(&w.to_ne_bytes());
    }
    c
}

/// The loaded, attached steering program of one interface, and the table its maps follow.
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
    /// The copy of `frontends` and `nat_backends` the program asks first.
    fast: FastCopy,
    stats: MapHandle,
    /// What the port accepts (`port_conf`).
    port: MapHandle,
    /// The interface's MAC when attached.
    mac: Mac,
    /// The table the counts of the lookup maps describe: the last one given to
    /// [`SteerProgram::update_maps`]. Holding it keeps its services alive, so a service
    /// pointer seen again in the next table is the same service, not a reused address.
    table: Option<Arc<ServiceTable>>,
}

impl fmt::Debug for SteerProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SteerProgram")
            .field("iface", &self.iface)
            .field("mode", &self.mode)
            .field("program_id", &self.prog.id())
            .field("frontends", &self.frontends)
            .field("nat_backends", &self.nat_backends)
            .field("vips", &self.vips)
            .field("locals", &self.locals)
            .field("generation", &self.table.as_ref().map(|t| t.generation))
            .finish_non_exhaustive()
    }
}

/// How a key is counted.
#[derive(Clone, Copy, Debug)]
enum Count {
    /// One more service wants it; pending if that makes it wanted.
    In,
    /// One service fewer wants it; pending if that leaves it unwanted.
    Out,
    /// Counted during a recount ([`Synced::begin_recount`]), which finds the pending keys
    /// at its end.
    Tally,
}

/// One key's books.
#[derive(Clone, Copy, Debug, Default)]
struct KeyState {
    /// Services of the followed table that want the key.
    refs: u32,
    /// Whether the key is in the kernel map (its last insert succeeded, no delete since).
    in_map: bool,
}

/// A hash map of the program and our books on it.
///
/// The counts always describe the followed table: they change in memory, which cannot fail,
/// before any map call is made. Whether each key is in the kernel map is recorded apart, and
/// every key whose two may disagree is `pending`. So a failed map call (a full map) leaves
/// nothing diverged: its key stays pending, and every later [`Synced::apply`] (with the next
/// table, or the same one again) tries it again, at the cost of the pending keys only.
struct Synced<K> {
    map: MapHandle,
    /// Every key the followed table wants or the kernel map still holds.
    keys: HashMap<K, KeyState>,
    /// Keys whose count crossed zero, or whose map call failed, since they last agreed with
    /// the kernel map: the only keys [`Synced::apply`] looks at.
    pending: HashSet<K>,
    /// Keys that went into the kernel map (true) or out of it (false), in order, since the
    /// owner last drained this.
    changed: Vec<(K, bool)>,
    update: &'static str,
    delete: &'static str,
}

impl<K> fmt::Debug for Synced<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Synced")
            .field("map", &self.update.trim_start_matches("update "))
            .field("keys", &self.keys.len())
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl<K: AsRef<[u8]> + Eq + Hash + Copy> Synced<K> {
    fn new(map: MapHandle, update: &'static str, delete: &'static str) -> Self {
        Self {
            map,
            keys: HashMap::new(),
            pending: HashSet::new(),
            changed: Vec::new(),
            update,
            delete,
        }
    }

    /// Counts `k` once more or once less.
    fn count(&mut self, k: K, c: Count) {
        match c {
            Count::In => {
                let st = self.keys.entry(k).or_default();
                st.refs += 1;
                if st.refs == 1 {
                    self.pending.insert(k);
                }
            }
            // A key nobody counted is left alone (a table whose service names a backend id
            // it lacks; `Builder` makes none).
            Count::Out => {
                if let Some(st) = self.keys.get_mut(&k) {
                    if st.refs > 0 {
                        st.refs -= 1;
                        if st.refs == 0 {
                            self.pending.insert(k);
                        }
                    }
                }
            }
            Count::Tally => self.keys.entry(k).or_default().refs += 1,
        }
    }

    /// Starts a recount: every count to zero, then [`Count::Tally`] the wanted keys, then
    /// [`Synced::end_recount`].
    fn begin_recount(&mut self) {
        for st in self.keys.values_mut() {
            st.refs = 0;
        }
    }

    /// Ends a recount: makes pending every key whose count and map disagree, and forgets the
    /// keys neither wanted nor in the map. One pass over the keys.
    fn end_recount(&mut self) {
        let pending = &mut self.pending;
        self.keys.retain(|k, st| {
            if (st.refs > 0) != st.in_map {
                pending.insert(*k);
            }
            st.refs > 0 || st.in_map
        });
    }

    /// Brings the kernel map in line with the counts for the pending keys: inserts first,
    /// then deletes, so the program never steers less than the followed table wants. When an
    /// insert is refused (a full map), the deletes still run, and the refused inserts are
    /// tried once more after them if the deletes made room. Keys whose call failed stay
    /// pending; the first error is returned.
    fn apply(&mut self, iface: &str, n: &mut MapSync) -> Result<(), XskError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let Self {
            map,
            keys,
            pending,
            changed,
            update,
            delete,
        } = self;
        let insert =
            |map: &MapHandle, k: &K| map.update(k.as_ref(), &1u32.to_ne_bytes(), MapFlags::ANY);
        let mut refused: Vec<(K, libbpf_rs::Error)> = Vec::new();
        for k in pending.iter() {
            let Some(st) = keys.get_mut(k) else { continue };
            if st.refs > 0 && !st.in_map {
                match insert(map, k) {
                    Ok(()) => {
                        st.in_map = true;
                        changed.push((*k, true));
                        n.added += 1;
                    }
                    Err(e) => refused.push((*k, e)),
                }
            }
        }
        let mut delete_error = None;
        let mut freed = false;
        for k in pending.iter() {
            let Some(st) = keys.get_mut(k) else { continue };
            if st.refs == 0 && st.in_map {
                match map.delete(k.as_ref()) {
                    Ok(()) => {
                        st.in_map = false;
                        changed.push((*k, false));
                        n.removed += 1;
                        freed = true;
                    }
                    // Someone else took it out: it is gone, as wanted.
                    Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => {
                        st.in_map = false;
                        changed.push((*k, false));
                    }
                    Err(e) => {
                        delete_error.get_or_insert(e);
                    }
                }
            }
        }
        if freed {
            refused.retain_mut(|(k, e)| match insert(map, k) {
                Ok(()) => {
                    if let Some(st) = keys.get_mut(k) {
                        st.in_map = true;
                    }
                    changed.push((*k, true));
                    n.added += 1;
                    false
                }
                Err(again) => {
                    *e = again;
                    true
                }
            });
        }
        pending.retain(|k| match keys.get(k).copied() {
            Some(st) if st.refs == 0 && !st.in_map => {
                keys.remove(k);
                false
            }
            Some(st) => (st.refs > 0) != st.in_map,
            None => false,
        });
        let bpf = |call: &'static str| {
            move |source| XskError::Bpf {
                iface: iface.to_owned(),
                call,
                source,
            }
        };
        match (refused.into_iter().next(), delete_error) {
            (Some((_, e)), _) => Err(bpf(update)(e)),
            (None, Some(e)) => Err(bpf(delete)(e)),
            (None, None) => Ok(()),
        }
    }
}

impl SteerProgram {
    /// Loads the program, removes any XDP program already on `iface` (a stale one from an
    /// earlier run), and attaches ours as `policy` allows. The lookup maps start empty: call
    /// [`Self::update_maps`] and [`Self::register`]. The port accepts frames to the
    /// interface's MAC as it is now, untagged only: [`Self::serve_vlans`] adds VLANs.
    ///
    /// The interface is looked up in the calling thread's network namespace.
    ///
    /// # Errors
    /// [`XskError::NoInterface`]; [`XskError::Link`] when the interface's MAC cannot be read;
    /// [`XskError::Bpf`] when loading (the verifier's log is on stderr), writing the port's
    /// map or detaching the stale program fails; [`XskError::Attach`] when no allowed mode
    /// attaches.
    pub fn attach(iface: &str, policy: AttachPolicy) -> Result<Self, XskError> {
        let mut prog = XdpProgram::load(&OBJECT.0, PROGRAM, iface)?;
        let xsks = prog.map("xsks")?;
        let stats = prog.map("stats")?;
        let port = prog.map("port")?;
        let mac = super::interface_port(iface)?.mac;
        write_port(&port, iface, &port_conf(mac, &[]))?;
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
        let fast = FastCopy::new(prog.map("fast")?);
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
            fast,
            stats,
            port,
            mac,
            table: None,
        })
    }

    /// Serves tagged frames of `vlans` (802.1Q ids, 1..=4094) besides untagged ones; a frame
    /// of any other VLAN is passed to the kernel and counted ([`SteerCounters::vlan`]).
    /// Replaces the set given before.
    ///
    /// # Errors
    /// [`XskError::Bpf`] if the map update fails.
    pub fn serve_vlans(&self, vlans: &[u16]) -> Result<(), XskError> {
        write_port(&self.port, &self.iface, &port_conf(self.mac, vlans))
    }

    /// The MAC the port accepts unicast frames to: the interface's when attached.
    pub fn mac(&self) -> Mac {
        self.mac
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
    pub fn register(&self, queue: u32, port: &QueueSocket) -> Result<(), XskError> {
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
    /// protocol) of every backend of a nat service (draining and down ones too: their flows
    /// still get replies), every VIP, and the gateway's own addresses (`locals`).
    ///
    /// Only what changed since the last call is looked at: the services whose `Arc` is not
    /// at the same index in both tables, found with a walk over the two service lists, then
    /// cancelled out where the same `Arc` only moved (the last service into a removed one's
    /// index). A service that left has its keys resolved in the old table, one that came in
    /// `t`. Every key in goes before any out, and map inserts before deletes, so a key both
    /// tables want never leaves its map. When most services differ (a full build), `t` is
    /// counted from scratch instead. Map calls are made for the keys that came or went
    /// only; the same table again costs nothing but the retries of earlier failures.
    ///
    /// Two tables are assumed to agree on a service they share (the same `Arc`): the same
    /// backend ids, naming the same addresses and ports, as [`crate::table::Builder`]'s
    /// tables do.
    ///
    /// `t` is kept until the next call. [`Builder::recycle`](crate::table::Builder::recycle)
    /// reuses a replaced table only when nobody else holds it, so call this with the new
    /// table before recycling the old one.
    ///
    /// # Errors
    /// [`XskError::Bpf`] on a failed map call (e.g. a full map). The counts then still follow
    /// `t`, the keys whose calls failed stay pending, and every later call (with `t` again or
    /// a newer table) retries them; the maps meanwhile hold the keys whose calls succeeded.
    /// The other maps are brought in line regardless; the first error is returned.
    pub fn update_maps(&mut self, t: &Arc<ServiceTable>) -> Result<MapSync, XskError> {
        let prev = self.table.replace(Arc::clone(t));
        match &prev {
            Some(p) if Arc::ptr_eq(p, t) => {}
            Some(p) => self.count_changes(p, t),
            None => self.recount(t),
        }
        // The old table's services are not needed any more: let go of it before the map
        // calls, so the caller can recycle it right after.
        drop(prev);
        self.locals.begin_recount();
        for &a in &t.locals {
            self.locals.count(a.0, Count::Tally);
        }
        self.locals.end_recount();
        let mut n = MapSync::default();
        let frontends = self.frontends.apply(&self.iface, &mut n);
        let nat_backends = self.nat_backends.apply(&self.iface, &mut n);
        // The copy follows what the two maps hold, calls that failed included.
        let copy = self.fast.shadow_mut();
        for (synced, kind) in [
            (&mut self.frontends, fast::Kind::Frontend),
            (&mut self.nat_backends, fast::Kind::NatBackend),
        ] {
            for (k, held) in synced.changed.drain(..) {
                if held {
                    copy.insert(fast::key(k, kind));
                } else {
                    copy.remove(&fast::key(k, kind));
                }
            }
        }
        // Before the copy's swap, which waits a grace period: these follow the table as
        // soon as the other two maps do.
        let vips = self.vips.apply(&self.iface, &mut n);
        let locals = self.locals.apply(&self.iface, &mut n);
        // Nothing copies these two.
        self.vips.changed.clear();
        self.locals.changed.clear();
        let fast = self.fast.sync(&self.iface);
        let results = [frontends, nat_backends, vips, locals, fast];
        match results.into_iter().find_map(Result::err) {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }

    /// Keys of the copy in `fast` that did not fit within the probe bound of their home slot
    /// (the program finds them in the hash maps, one lookup call more per frame).
    pub fn fast_overflow(&self) -> usize {
        self.fast.overflowed()
    }

    /// Runs the attached program once on `frame`, as if it had arrived on queue 0, without
    /// sending anything (`BPF_PROG_TEST_RUN`), and returns how its counters moved meanwhile:
    /// by one, in the counter of the frame's verdict ([`SteerCounters::no_socket`] for a frame
    /// it would redirect, while no socket is registered for queue 0), plus whatever frames
    /// the interface received in the same moments.
    ///
    /// # Errors
    /// [`XskError::Bpf`] when the kernel refuses the run or the counters cannot be read.
    pub fn classify(&mut self, frame: &[u8]) -> Result<SteerCounters, XskError> {
        let before = self.counters()?;
        self.prog.test_run(frame)?;
        Ok(self.counters()?.since(&before))
    }

    /// Counts the services of `t` that `prev` lacks in, and those of `prev` that `t` lacks
    /// out; or, when most services differ (a full build), recounts `t` from scratch, which
    /// is then cheaper than counting every service out and in again.
    fn count_changes(&mut self, prev: &ServiceTable, t: &ServiceTable) {
        // +1 for `t`'s service and -1 for `prev`'s at every index where the two differ: a
        // service that only moved nets zero. A service has one index per table, so each net
        // is -1, 0 or +1; the counting below does not rely on it.
        let mut net: HashMap<*const Service, (&Service, i32)> = HashMap::new();
        let (old, new) = (&prev.services, &t.services);
        for i in 0..old.len().max(new.len()) {
            let (a, b) = (old.get(i), new.get(i));
            if let (Some(a), Some(b)) = (a, b) {
                if Arc::ptr_eq(a, b) {
                    continue;
                }
            }
            if let Some(a) = a {
                net.entry(Arc::as_ptr(a)).or_insert((a, 0)).1 -= 1;
            }
            if let Some(b) = b {
                net.entry(Arc::as_ptr(b)).or_insert((b, 0)).1 += 1;
            }
        }
        if net.len() > new.len() {
            self.recount(t);
            return;
        }
        for &(s, d) in net.values() {
            for _ in 0..d.max(0) {
                self.count(t, s, Count::In);
            }
        }
        for &(s, d) in net.values() {
            for _ in 0..(-d).max(0) {
                self.count(prev, s, Count::Out);
            }
        }
    }

    /// Sets the counts of the service maps to those of `t` alone.
    fn recount(&mut self, t: &ServiceTable) {
        self.frontends.begin_recount();
        self.nat_backends.begin_recount();
        self.vips.begin_recount();
        for s in &t.services {
            self.count(t, s, Count::Tally);
        }
        self.frontends.end_recount();
        self.nat_backends.end_recount();
        self.vips.end_recount();
    }

    /// Counts the keys of service `s` as `c` says, its backend ids resolved in `t`.
    fn count(&mut self, t: &ServiceTable, s: &Service, c: Count) {
        let f = &s.frontend;
        self.frontends
            .count(endpoint_key(&f.vip, f.port, f.proto), c);
        self.vips.count(f.vip.0, c);
        if s.mode != Mode::Nat {
            return;
        }
        for b in s.backends.iter().filter_map(|&id| t.backend(id)) {
            self.nat_backends
                .count(endpoint_key(&b.addr, b.port, f.proto), c);
        }
    }

    /// The program's counters, summed over CPUs.
    ///
    /// # Errors
    /// [`XskError::Bpf`] if the per-CPU lookup fails.
    pub fn counters(&self) -> Result<SteerCounters, XskError> {
        read_counters(&self.stats, &self.iface)
    }

    /// A handle that reads [`Self::counters`] from another thread (the admin API's, on each
    /// scrape), without the program: the counters stay readable, frozen, after the program is
    /// detached.
    ///
    /// # Errors
    /// [`XskError::Bpf`] if the map's descriptor cannot be duplicated.
    pub fn counters_reader(&self) -> Result<SteerStats, XskError> {
        let stats = MapHandle::try_from(&self.stats).map_err(|source| XskError::Bpf {
            iface: self.iface.clone(),
            call: "dup stats fd",
            source,
        })?;
        Ok(SteerStats {
            stats,
            iface: self.iface.clone(),
        })
    }
}

/// Reads a steering program's counters from another thread: see
/// [`SteerProgram::counters_reader`].
#[derive(Debug)]
pub struct SteerStats {
    stats: MapHandle,
    iface: String,
}

impl SteerStats {
    /// The interface the program is attached to.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// The program's counters, summed over CPUs: one lookup per counter.
    ///
    /// # Errors
    /// [`XskError::Bpf`] if the per-CPU lookup fails.
    pub fn counters(&self) -> Result<SteerCounters, XskError> {
        read_counters(&self.stats, &self.iface)
    }
}

/// The counters in `stats`, summed over CPUs.
fn read_counters(stats: &MapHandle, iface: &str) -> Result<SteerCounters, XskError> {
    let mut v = [0u64; SteerCounters::SLOTS];
    for (slot, out) in v.iter_mut().enumerate() {
        let per_cpu = stats
            .lookup_percpu(&(slot as u32).to_ne_bytes(), MapFlags::ANY)
            .map_err(|source| XskError::Bpf {
                iface: iface.to_owned(),
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
        other_host: v[5],
        vlan: v[6],
        malformed: v[7],
        no_socket: v[8],
    })
}

/// Writes the one entry of the program's `port` map.
fn write_port(map: &MapHandle, iface: &str, conf: &PortConf) -> Result<(), XskError> {
    map.update(&0u32.to_ne_bytes(), conf, MapFlags::ANY)
        .map_err(|source| XskError::Bpf {
            iface: iface.to_owned(),
            call: "update port",
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{Addr, Proto};

    #[test]
    fn endpoint_key_layout_matches_the_c_struct() {
        let mut a = [0u8; 16];
        a[10] = 0xff;
        a[11] = 0xff;
        a[12..].copy_from_slice(&[203, 0, 113, 10]);
        let k = endpoint_key(&Addr(a), 80, Proto(6));
        assert_eq!(&k[..16], &a);
        assert_eq!(&k[16..18], &[0, 80]);
        assert_eq!(k[18], 6);
        assert_eq!(k[19], 0);
    }

    #[test]
    fn port_conf_layout_matches_the_c_struct() {
        let c = port_conf([2, 0, 0, 0, 0, 9].into(), &[1, 64, 100, 4094, 0, 4095]);
        assert_eq!(&c[..8], &[2, 0, 0, 0, 0, 9, 0, 0]);
        let word = |i: usize| u64::from_ne_bytes(c[8 + 8 * i..16 + 8 * i].try_into().unwrap());
        assert_eq!(word(0), 1 << 1, "0 is not a VLAN");
        assert_eq!(word(1), 1 << 0 | 1 << (100 - 64), "64 and 100");
        assert_eq!(word(63), 1 << 62, "4094 in, 4095 out");
        let set: u32 = (0..64).map(|i| word(i).count_ones()).sum();
        assert_eq!(set, 4);
    }

    #[test]
    fn every_frame_is_in_one_counter() {
        let c = SteerCounters {
            passed: 1,
            frontend: 2,
            nat_reply: 4,
            icmp_error: 8,
            fragment: 16,
            other_host: 32,
            vlan: 64,
            malformed: 128,
            no_socket: 256,
        };
        assert_eq!(c.total(), 511);
        assert_eq!(c.passed_total() + c.redirected(), 511);
        assert_eq!(c.by_reason().iter().map(|r| r.2).sum::<u64>(), 511);
    }

    #[test]
    fn object_is_embedded() {
        super::super::attach::assert_embedded(&OBJECT.0);
    }
}
