//! Traffic per service and per backend, as `ipvsadm -L -n --stats` shows it: packets and
//! bytes in (client to backend, every mode) and out (backend to client: the nat replies the
//! gateway translates back; in DSR modes replies bypass the gateway and out stays 0).
//!
//! Each core counts into its own [`Traffic`], two preallocated arrays in the worker's memory:
//! no atomics, no locks, no allocation on the packet path. The control plane sums the cores'
//! published copies when it is asked (a scrape, `strait status`). Cardinality is the
//! configuration's: one slot per service and one per backend, never anything per client.
//!
//! What is counted: a packet is "in" when the pipeline sends it to a backend (a flow's
//! packet, a fragment, an ICMP error about a flow), "out" when it translates a nat reply back
//! to the client; bytes are the IP packet's length as it arrived (header and payload, no
//! link-layer header, no encapsulation), as IPVS counts them. Dropped packets count in the
//! drop reasons ([`crate::stats`]), not here.
//!
//! # Identity across table changes
//!
//! A reload re-indexes services (a removed service's index goes to another) and reuses the
//! ids of backends that left, so neither index nor id alone names the same thing over time.
//! The slots are indexed by the ids the [`crate::table::Builder`] keeps stable across builds,
//! [`crate::key::ServiceId`] (by service name) and [`crate::key::BackendId`] (by service
//! frontend, address and port), and each slot remembers the *incarnation* of the id it counts
//! for. An id handed to a new service or backend gets a new incarnation; the first packet
//! counted for it finds the slot's incarnation different and starts the slot from zero, so the
//! old holder's counts are never attributed to the new one, and a service or backend that
//! stays keeps counting in the same slot whatever index it has. The control plane sums, for
//! each id of the live table, only the slots whose incarnation is the live one: a core that
//! has not yet counted for a new holder still holds its predecessor's counts, and they are
//! left out. A service or backend that leaves the table leaves `/metrics` with its counts.
//!
//! Ids at or above [`SLOTS`] are not counted (the configuration would need more than 65,536
//! services or backends at once); their packets still count in the per-core counters.
//!
//! # Counted a batch at a time
//!
//! With a flow table larger than the caches, a packet's own lines stream through them, and
//! the counting slots of a service and a backend (touched every few thousand packets) are
//! mostly evicted in between: updated where the packet is decided, each would be a cache
//! miss on the packet's critical path (measured: about 10 % on an established packet). So a
//! packet only notes what to count in a small array that stays in L1 ([`PENDING`] notes),
//! and [`Traffic::flush`], at the end of the pipeline's batch, first prefetches every noted
//! slot and then adds: the batch's misses overlap instead of following one another, as the
//! flow-table lookups' do. The counts are complete after each batch (the readers, which see
//! the pipeline between batches, never see a note). The slots are also kept dense (16 bytes
//! per id and direction, incarnations apart), so that a configuration's busy ids share few
//! lines and more of them stay cached.

use crate::table::{Backend, Service};

/// Slots per array: ids below this have their own slot. The six arrays take 4.5 MiB per
/// core, written once at start so that counting never page-faults.
pub const SLOTS: usize = 1 << 16;

/// One service's or backend's counts on one core, as the readers see them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// The incarnation of the id these counts are for (0: never counted).
    pub incarnation: u32,
    /// Packets to backends.
    pub in_packets: u64,
    /// Bytes to backends.
    pub in_bytes: u64,
    /// Packets from backends (nat replies).
    pub out_packets: u64,
    /// Bytes from backends (nat replies).
    pub out_bytes: u64,
}

impl Tally {
    /// No counts, for no incarnation.
    pub const ZERO: Tally = Tally {
        incarnation: 0,
        in_packets: 0,
        in_bytes: 0,
        out_packets: 0,
        out_bytes: 0,
    };

    /// Adds `o`'s counts (not its incarnation).
    pub fn add(&mut self, o: &Tally) {
        self.in_packets += o.in_packets;
        self.in_bytes += o.in_bytes;
        self.out_packets += o.out_packets;
        self.out_bytes += o.out_bytes;
    }
}

/// Packets and bytes, one direction: 16 bytes, four to a cache line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Pair {
    packets: u64,
    bytes: u64,
}

/// Counts by id, kept dense: the incarnations apart (sixteen to a line) and each direction
/// apart (the in direction, which every packet touches, four ids to a line), so that the
/// slots of a configuration's busy ids stay in the caches while flow-table lines stream
/// through them.
#[derive(Clone)]
struct Slots {
    incarnation: Box<[u32]>,
    inward: Box<[Pair]>,
    outward: Box<[Pair]>,
}

impl Slots {
    fn new() -> Self {
        Self {
            incarnation: vec![0; SLOTS].into_boxed_slice(),
            inward: vec![Pair::default(); SLOTS].into_boxed_slice(),
            outward: vec![Pair::default(); SLOTS].into_boxed_slice(),
        }
    }

    /// Loads the lines a count of `id` will touch.
    #[inline(always)]
    fn prefetch(&self, id: u32, out: bool) {
        let i = id as usize;
        if let (Some(inc), Some(p)) = (
            self.incarnation.get(i),
            if out {
                self.outward.get(i)
            } else {
                self.inward.get(i)
            },
        ) {
            crate::hint::prefetch(inc);
            crate::hint::prefetch(p);
        }
    }

    /// Counts a packet of `bytes` for `id` of `incarnation`, restarting the id's counts when
    /// they were another incarnation's.
    #[inline(always)]
    fn count(&mut self, id: u32, incarnation: u32, bytes: u32, out: bool) {
        let i = id as usize;
        let Some(inc) = self.incarnation.get_mut(i) else {
            return;
        };
        if *inc != incarnation {
            *inc = incarnation;
            self.inward[i] = Pair::default();
            self.outward[i] = Pair::default();
        }
        let p = if out {
            &mut self.outward[i]
        } else {
            &mut self.inward[i]
        };
        p.packets += 1;
        p.bytes += u64::from(bytes);
    }

    /// The counts of `id`, whatever their incarnation; zero past the slots.
    fn tally(&self, id: usize) -> Tally {
        match (
            self.incarnation.get(id),
            self.inward.get(id),
            self.outward.get(id),
        ) {
            (Some(&incarnation), Some(i), Some(o)) => Tally {
                incarnation,
                in_packets: i.packets,
                in_bytes: i.bytes,
                out_packets: o.packets,
                out_bytes: o.bytes,
            },
            _ => Tally::ZERO,
        }
    }

    /// Replaces `out` with the counts of ids `0..n`; allocates only when `out` must grow.
    fn export(&self, n: usize, out: &mut Vec<Tally>) {
        out.clear();
        out.extend((0..n.min(SLOTS)).map(|id| self.tally(id)));
    }
}

/// Notes kept before a [`Traffic::flush`]: the pipeline's batch (every frame counts at most
/// once); more notes flush early.
pub const PENDING: usize = 32;

/// A packet to count: its service's and backend's slots and incarnations, its size and
/// direction.
#[derive(Clone, Copy, Debug, Default)]
struct Note {
    service: u32,
    service_incarnation: u32,
    backend: u32,
    backend_incarnation: u32,
    bytes: u32,
    out: bool,
}

/// One core's traffic counts, by service id and by backend id.
#[derive(Clone)]
pub struct Traffic {
    services: Slots,
    backends: Slots,
    notes: [Note; PENDING],
    noted: usize,
}

impl core::fmt::Debug for Traffic {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Traffic")
            .field("slots", &SLOTS)
            .finish_non_exhaustive()
    }
}

impl Default for Traffic {
    fn default() -> Self {
        Self::new()
    }
}

impl Traffic {
    /// Zeroed slots, [`SLOTS`] of each kind, written now.
    pub fn new() -> Self {
        Self {
            services: Slots::new(),
            backends: Slots::new(),
            notes: [Note::default(); PENDING],
            noted: 0,
        }
    }

    /// Bytes [`Traffic::new`] allocates.
    pub const fn bytes() -> u64 {
        (2 * SLOTS * (4 + 2 * core::mem::size_of::<Pair>())) as u64
    }

    /// Notes a packet of `bytes` sent to backend `b` of service `s`, counted at the next
    /// [`Traffic::flush`].
    #[inline(always)]
    pub fn to_backend(&mut self, s: &Service, b: &Backend, bytes: usize) {
        self.note(s, b, bytes, false);
    }

    /// Notes a reply of `bytes` from backend `b` of service `s`, counted at the next
    /// [`Traffic::flush`].
    #[inline(always)]
    pub fn from_backend(&mut self, s: &Service, b: &Backend, bytes: usize) {
        self.note(s, b, bytes, true);
    }

    #[inline(always)]
    fn note(&mut self, s: &Service, b: &Backend, bytes: usize, out: bool) {
        if self.noted == PENDING {
            self.flush();
        }
        self.notes[self.noted] = Note {
            service: s.id.0,
            service_incarnation: s.incarnation,
            backend: b.id.0,
            backend_incarnation: b.incarnation,
            bytes: bytes as u32,
            out,
        };
        self.noted += 1;
    }

    /// Adds the noted packets to their slots: prefetches every slot first, then adds, so
    /// that the slots' cache misses overlap.
    #[inline]
    pub fn flush(&mut self) {
        let notes = &self.notes[..self.noted];
        for n in notes {
            self.services.prefetch(n.service, n.out);
            self.backends.prefetch(n.backend, n.out);
        }
        for n in notes {
            self.services
                .count(n.service, n.service_incarnation, n.bytes, n.out);
            self.backends
                .count(n.backend, n.backend_incarnation, n.bytes, n.out);
        }
        self.noted = 0;
    }

    /// Service `s`'s counts on this core (zero when its slot counts for another holder).
    pub fn service(&self, s: &Service) -> Tally {
        current_of(self.services.tally(s.id.0 as usize), s.incarnation)
    }

    /// Backend `b`'s counts on this core (zero when its slot counts for another holder).
    pub fn backend(&self, b: &Backend) -> Tally {
        current_of(self.backends.tally(b.id.0 as usize), b.incarnation)
    }

    /// Replaces `services` and `backends` with the slots of service ids `0..n_services` and
    /// backend ids `0..n_backends` (each with its incarnation: read them with [`current`]).
    /// Allocates only when a vector must grow.
    pub fn export(
        &self,
        n_services: usize,
        n_backends: usize,
        services: &mut Vec<Tally>,
        backends: &mut Vec<Tally>,
    ) {
        self.services.export(n_services, services);
        self.backends.export(n_backends, backends);
    }
}

/// `t` if it is `incarnation`'s, else zero for `incarnation`.
fn current_of(t: Tally, incarnation: u32) -> Tally {
    if t.incarnation == incarnation {
        t
    } else {
        Tally {
            incarnation,
            ..Tally::ZERO
        }
    }
}

/// The counts in `slots[id]` if they are `incarnation`'s, else zero: the reading rule for
/// published copies too.
pub fn current(slots: &[Tally], id: u32, incarnation: u32) -> Tally {
    match slots.get(id as usize) {
        Some(t) if t.incarnation == incarnation => *t,
        _ => Tally {
            incarnation,
            ..Tally::ZERO
        },
    }
}

#[cfg(test)]
mod tests {
    //! The pipeline's counting, through the in-memory driver: frames in, counts equal to what
    //! was sent; and the counts' identity across table rebuilds.

    use super::*;
    use crate::flow::Timeouts;
    use crate::pipeline::tests::{backend_by_mac, build, config, run, CLIENT_MAC, GW_MAC, SEC};
    use crate::pipeline::{Pipeline, Verdict};
    use crate::table::{Builder, ServiceTable};
    use std::collections::HashMap;

    /// An Ethernet/IPv4/TCP frame with `payload` bytes of data; its IP length is 40 + that.
    fn segment(src: ([u8; 4], u16), dst: ([u8; 4], u16), syn: bool, payload: usize) -> Vec<u8> {
        let b = etherparse::PacketBuilder::ethernet2(CLIENT_MAC, GW_MAC)
            .ipv4(src.0, dst.0, 64)
            .tcp(src.1, dst.1, 1, 65535);
        let b = if syn { b.syn() } else { b.ack(1) };
        let mut out = Vec::new();
        b.write(&mut out, &vec![0x5a; payload]).expect("frame");
        out
    }

    fn addr(a: &str) -> [u8; 4] {
        a.parse::<core::net::Ipv4Addr>().expect("IPv4").octets()
    }

    fn tally(packets: u64, bytes: u64, out_packets: u64, out_bytes: u64) -> (u64, u64, u64, u64) {
        (packets, bytes, out_packets, out_bytes)
    }

    fn counts(t: &Tally) -> (u64, u64, u64, u64) {
        (t.in_packets, t.in_bytes, t.out_packets, t.out_bytes)
    }

    /// Sends `flows` connections from distinct client ports to `vip` (a SYN, then `data`
    /// segments of growing size) and, in nat mode, `replies` replies per flow from the backend
    /// the flow went to. Returns what each backend (by MAC) got: packets and bytes in and out.
    #[allow(clippy::too_many_arguments)]
    fn traffic(
        pipe: &mut Pipeline,
        t: &ServiceTable,
        vip: [u8; 4],
        first_port: u16,
        flows: u16,
        data: usize,
        replies: usize,
    ) -> HashMap<[u8; 6], (u64, u64, u64, u64)> {
        let mut got: HashMap<[u8; 6], (u64, u64, u64, u64)> = HashMap::new();
        for f in 0..flows {
            let client = ([192, 0, 2, 7], first_port + f);
            let mut mac = [0u8; 6];
            for i in 0..=data {
                let payload = i * 37 + f as usize;
                let (v, out) = run(pipe, t, SEC, &segment(client, (vip, 80), i == 0, payload));
                assert_eq!(v, Verdict::Tx { port: 0 });
                mac.copy_from_slice(&out[0..6]);
                let e = got.entry(mac).or_default();
                e.0 += 1;
                e.1 += 40 + payload as u64;
            }
            let b = backend_by_mac(t, &mac);
            for r in 0..replies {
                let payload = 100 + r;
                let from = (b.addr[12..].try_into().expect("IPv4"), b.port);
                let (v, out) = run(pipe, t, SEC, &segment(from, client, false, payload));
                assert_eq!(v, Verdict::Tx { port: 0 }, "the reply is translated");
                assert_eq!(&out[26..30], &vip, "from the VIP");
                let e = got.entry(mac).or_default();
                e.2 += 1;
                e.3 += 40 + payload as u64;
            }
        }
        got
    }

    fn sum<'a>(it: impl Iterator<Item = &'a (u64, u64, u64, u64)>) -> (u64, u64, u64, u64) {
        it.fold((0, 0, 0, 0), |a, b| {
            (a.0 + b.0, a.1 + b.1, a.2 + b.2, a.3 + b.3)
        })
    }

    #[test]
    fn nat_counts_every_packet_and_byte_in_and_every_reply_out() {
        let x = ("198.51.100.11", 0x11);
        let y = ("198.51.100.12", 0x12);
        let z = ("198.51.100.13", 0x13);
        let t = build(&mut Builder::new(), &config("nat", &[x, y], &[z]));
        let mut pipe = Pipeline::new(0, 1, 1024, Timeouts::default(), 0);
        let a = traffic(&mut pipe, &t, [203, 0, 113, 10], 40000, 20, 3, 2);
        let b = traffic(&mut pipe, &t, [203, 0, 113, 20], 41000, 5, 1, 4);
        assert_eq!(a.len(), 2, "both of a's backends got flows: {a:?}");
        for (mac, want) in a.iter().chain(&b) {
            let be = backend_by_mac(&t, mac);
            assert_eq!(
                counts(&pipe.traffic.backend(&be)),
                *want,
                "backend {mac:02x?}"
            );
        }
        let (sa, sb) = (&t.services[0], &t.services[1]);
        assert_eq!(counts(&pipe.traffic.service(sa)), sum(a.values()));
        assert_eq!(counts(&pipe.traffic.service(sb)), sum(b.values()));
        // 20 flows of 4 segments (payloads 0, 37, 74, 111 plus the flow's number) and 2
        // replies each (100 and 101 bytes of payload).
        assert_eq!(
            counts(&pipe.traffic.service(sa)),
            tally(80, 80 * 40 + 20 * 222 + 4 * 190, 40, 40 * 40 + 20 * 201)
        );
        // A reply without a flow is dropped and counts nowhere.
        let stray = segment((addr(z.0), 8080), ([192, 0, 2, 99], 9), false, 10);
        assert_eq!(
            run(&mut pipe, &t, SEC, &stray).0,
            Verdict::Drop(crate::stats::DropReason::ReplyNoFlow)
        );
        assert_eq!(counts(&pipe.traffic.service(sb)), sum(b.values()));
    }

    #[test]
    fn a_batch_counts_as_its_frames_one_by_one() {
        use crate::rewrite::{Frame, HEADROOM};
        let x = ("198.51.100.11", 0x11);
        let y = ("198.51.100.12", 0x12);
        let t = build(&mut Builder::new(), &config("nat", &[x, y], &[]));
        // 70 frames (more than a batch and than the notes kept): new flows from 70 ports.
        let frames: Vec<Vec<u8>> = (0..70u16)
            .map(|i| {
                segment(
                    ([192, 0, 2, 7], 30000 + i),
                    ([203, 0, 113, 10], 80),
                    true,
                    i as usize,
                )
            })
            .collect();
        let mut one = Pipeline::new(0, 1, 1024, Timeouts::default(), 0);
        for f in &frames {
            let _ = run(&mut one, &t, SEC, f);
        }
        let mut batched = Pipeline::new(0, 1, 1024, Timeouts::default(), 0);
        let mut bufs: Vec<Vec<u8>> = frames
            .iter()
            .map(|f| {
                let mut b = vec![0u8; HEADROOM + f.len() + 64];
                b[HEADROOM..HEADROOM + f.len()].copy_from_slice(f);
                b
            })
            .collect();
        let mut fs: Vec<Frame<'_>> = bufs
            .iter_mut()
            .zip(&frames)
            .map(|(b, f)| Frame::new(b, HEADROOM, f.len()))
            .collect();
        let mut verdicts = vec![Verdict::Pass; fs.len()];
        batched.process_batch(&t, SEC, 0, &mut fs, &mut verdicts);
        assert!(verdicts.iter().all(|v| *v == Verdict::Tx { port: 0 }));
        let s = &t.services[0];
        assert_eq!(
            counts(&batched.traffic.service(s)),
            (70, 70 * 40 + 69 * 70 / 2, 0, 0)
        );
        assert_eq!(batched.traffic.service(s), one.traffic.service(s));
        for &id in &s.backends {
            let b = t.backend(id).expect("backend");
            assert_eq!(batched.traffic.backend(b), one.traffic.backend(b));
        }
    }

    #[test]
    fn dsr_counts_in_only() {
        let x = ("198.51.100.21", 0x21);
        let t = build(&mut Builder::new(), &config("dsr-l2", &[x], &[]));
        let mut pipe = Pipeline::new(0, 1, 1024, Timeouts::default(), 0);
        let a = traffic(&mut pipe, &t, [203, 0, 113, 10], 40000, 3, 2, 0);
        assert_eq!(
            counts(&pipe.traffic.service(&t.services[0])),
            sum(a.values())
        );
        assert_eq!(sum(a.values()).0, 9);
        // The backend's replies go straight to the client; one that reaches the gateway is
        // the kernel's, not the service's.
        let reply = segment((addr(x.0), 80), ([192, 0, 2, 7], 40000), false, 10);
        assert_eq!(run(&mut pipe, &t, SEC, &reply).0, Verdict::Pass);
        assert_eq!(pipe.traffic.service(&t.services[0]).out_packets, 0);
    }

    /// A configuration of dsr-l2 services, each `(name, VIP's last byte, backend address,
    /// its MAC's last byte)`.
    fn services(list: &[(&str, u8, &str, u8)]) -> strait_config::model::Config {
        let mut s = String::from("[[gateway.interfaces]]\nname = \"eth0\"\nqueues = [0]\n");
        for (name, vip, backend, mac) in list {
            s += &format!(
                "[[services]]\nname = \"{name}\"\nvip = \"203.0.113.{vip}\"\nport = 80\n\
                 mode = \"dsr-l2\"\nmaglev_table_size = 251\nbackends = [{{ address = \
                 \"{backend}\", port = 80, mac = \"02:00:00:00:01:{mac:02x}\" }}]\n"
            );
        }
        strait_config::parse(&s).expect("test config")
    }

    fn service<'t>(t: &'t ServiceTable, name: &str) -> &'t Service {
        t.services
            .iter()
            .find(|s| s.name == name)
            .expect("the service")
    }

    fn send(pipe: &mut Pipeline, t: &ServiceTable, vip: u8, n: u16) {
        for i in 0..n {
            let f = segment(
                ([192, 0, 2, 8], 50000 + i),
                ([203, 0, 113, vip], 80),
                true,
                0,
            );
            assert_eq!(run(pipe, t, SEC, &f).0, Verdict::Tx { port: 0 });
        }
    }

    /// Rebuilds move services to other indexes and hand freed ids to newcomers: a service's
    /// and a backend's counts follow them, and a newcomer never inherits its predecessor's.
    fn counts_keep_their_identity(full: bool) {
        let mut builder = Builder::new();
        let t1 = build(
            &mut builder,
            &services(&[
                ("a", 10, "198.51.100.31", 0x31),
                ("b", 20, "198.51.100.32", 0x32),
            ]),
        );
        let mut pipe = Pipeline::new(0, 1, 1024, Timeouts::default(), 0);
        send(&mut pipe, &t1, 10, 3);
        send(&mut pipe, &t1, 20, 2);
        let (a1, b1) = (service(&t1, "a"), service(&t1, "b"));
        assert_eq!(pipe.traffic.service(a1).in_packets, 3);
        // a leaves: b takes index 0; then c arrives, which takes a's freed ids (service and
        // backend: a backend is new to its service's frontend).
        let only_b = services(&[("b", 20, "198.51.100.32", 0x32)]);
        let with_c = services(&[
            ("b", 20, "198.51.100.32", 0x32),
            ("c", 30, "198.51.100.33", 0x33),
        ]);
        let (t2, t3) = if full {
            let t2 = build(&mut builder, &only_b);
            let t3 = build(&mut builder, &with_c);
            (t2, t3)
        } else {
            use crate::table::Change;
            let t2 = builder
                .update(&t1, &[Change::Remove("a")], |_, _, _| false)
                .expect("update");
            let t3 = builder
                .update(&t2, &[Change::Set(&with_c.services[1])], |_, _, _| false)
                .expect("update");
            (t2, t3)
        };
        assert_eq!(t2.services[0].name, "b", "b moved to a's index");
        let b2 = service(&t2, "b");
        assert_eq!((b2.id, b2.incarnation), (b1.id, b1.incarnation));
        assert_eq!(
            pipe.traffic.service(b2).in_packets,
            2,
            "b's counts follow it"
        );
        send(&mut pipe, &t2, 20, 1);
        assert_eq!(pipe.traffic.service(b2).in_packets, 3);

        let c = service(&t3, "c");
        assert_eq!(c.id, a1.id, "c has a's freed id");
        assert_ne!(c.incarnation, a1.incarnation);
        let cb = t3.backend(c.backends[0]).expect("c's backend").clone();
        let ab = t1.backend(a1.backends[0]).expect("a's backend");
        assert_eq!(cb.id, ab.id, "c's backend has a's backend's freed id");
        assert_eq!(
            pipe.traffic.service(c),
            Tally {
                incarnation: c.incarnation,
                ..Tally::ZERO
            }
        );
        assert_eq!(pipe.traffic.backend(&cb).in_packets, 0, "nothing inherited");
        send(&mut pipe, &t3, 30, 1);
        assert_eq!(pipe.traffic.service(c).in_packets, 1, "a's 3 are not c's");
        assert_eq!(pipe.traffic.backend(&cb).in_packets, 1);
        assert_eq!(pipe.traffic.service(service(&t3, "b")).in_packets, 3);
        assert_eq!(t3.service_ids, 2, "ids stay dense");
    }

    #[test]
    fn counts_keep_their_identity_across_full_builds() {
        counts_keep_their_identity(true);
    }

    #[test]
    fn counts_keep_their_identity_across_updates() {
        counts_keep_their_identity(false);
    }
}
