//! [`TxGen`]: a traffic generator on the AF_XDP TX path (`strait-lab gen`).
//!
//! One socket on one (interface, queue), bound through a [`QueueGroup`] of one member, whose
//! UMEM frames carry packet templates. A frame is written whole once, the first time it is
//! used (or when it last carried a probe); after that, each time it comes back from the
//! completion ring it is sent again with only the fields that vary rewritten in place: the
//! IPv4 source and destination addresses, the source and destination ports, and for TCP the
//! sequence and acknowledgement numbers. Every checksum they cover (the IPv4 header, the
//! UDP/TCP checksum with its pseudo-header) is updated incrementally (RFC 1624 eqn. 3, the
//! same [`checksum::update_bytes`] the rewrites use), so each packet costs a few dozen bytes
//! of writes and no pass over the payload.
//!
//! ```text
//!   free list ─► take frame ─► (first use: copy template) ─► rewrite flow fields in place
//!       ▲                                                            │
//!       └── completion ring ◄── kernel sends ◄── TX ring ◄── stage, submit, kick if asked
//! ```
//!
//! Flows: a walk over source address × source port, the destination cycling through the
//! targets. [`Flows::New`] takes the next step of the walk for every packet (every packet a
//! new 5-tuple until the walk wraps after `addresses × ports` packets); [`Flows::Cycle`]
//! restarts the walk after N packets, so the same N flows repeat (for TCP, ACK segments whose
//! sequence numbers advance by the payload length each round).
//!
//! Pacing: a token bucket on the monotonic clock, checked once per batch of up to [`BATCH`]
//! frames; the loop spins while the wait is short and sleeps when it is long (low rates), so
//! a slow generator does not burn a core. `rate: None` sends as fast as the TX ring drains.
//!
//! Latency probes ([`ProbeConfig`]): UDP from a fixed source to the targets in turn, payload
//! [`PROBE_MAGIC`], a little-endian u64 sequence number and the little-endian u64
//! `CLOCK_MONOTONIC` time in nanoseconds ([`monotonic_ns`]) at which the frame was put on the
//! TX ring. They go out in the same TX stream as the load, at their own token-bucket rate.
//!
//! Hot path: no allocation (the per-frame state vector and the templates are made at open),
//! no locks, and no syscall but the `sendto` kick when the kernel sets need-wakeup on the TX
//! ring (always, in copy mode) and `nanosleep` when pacing a low rate.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use strait_dataplane::rewrite::Frame;
use strait_dataplane::wire::checksum::{self, update_bytes};
use strait_dataplane::xsk::{
    BindMode, BindPolicy, GroupConfig, Held, PortConfig, QueueGroup, RingSizes, XskError, BATCH,
    MAX_PACKET, RX_OFFSET,
};

/// The first bytes of a latency probe's UDP payload.
pub const PROBE_MAGIC: &[u8; 8] = b"STRAITPR";

/// A probe's UDP payload length: magic, sequence number, timestamp.
pub const PROBE_PAYLOAD: usize = 24;

/// A probe frame's length: Ethernet, IPv4, UDP headers and [`PROBE_PAYLOAD`].
pub const PROBE_FRAME: usize = ETH + IP + UDP + PROBE_PAYLOAD;

/// The shortest frame the generator sends (`size`): the Ethernet minimum without the FCS.
pub const MIN_FRAME: usize = 60;

const B: usize = BATCH as usize;
const ETH: usize = 14;
const IP: usize = 20;
const UDP: usize = 8;
const TCP: usize = 20;
/// Offset of the IPv4 source address; the destination follows, so both are 8 bytes from it.
const ADDRS: usize = ETH + 12;
/// Offset of the IPv4 header checksum.
const IP_CSUM: usize = ETH + 10;
/// Offset of the L4 header (source port).
const L4: usize = ETH + IP;

/// The TX ring (and completion ring) size: [`RingSizes::default`]'s 2048, 137 µs at 14.9 Mpps.
const TX_RING: u32 = 2048;
/// Fill and RX rings: the generator receives nothing on its socket (no XDP program redirects
/// to it), but the kernel requires a fill ring on the socket that registers the UMEM and
/// [`PortConfig`] sizes all four; the smallest useful size keeps frames for TX.
const RX_RING: u32 = 64;
/// UMEM frames: the TX ring twice over, plus the fill ring's frames, so the free list never
/// runs dry while a full TX ring waits for completions.
const FRAMES: u32 = 2 * TX_RING + RX_RING;

/// Token-bucket depth in packets: after a stall (the thread was descheduled) the generator
/// sends at most this many packets back to back, then returns to the asked rate rather than
/// catching up with a burst that would only overflow the receiver's queues. Four batches.
const BURST: f64 = 4.0 * BATCH as f64;

/// Waits longer than this are slept (`nanosleep`) rather than spun; the sleep ends
/// [`SLEEP_SLACK_NS`] early to absorb the scheduler's wake-up latency.
const SLEEP_MIN_NS: u64 = 200_000;
/// See [`SLEEP_MIN_NS`].
const SLEEP_SLACK_NS: u64 = 80_000;

/// After the last frame is staged, how long [`TxGen::run`] waits for the kernel to complete
/// what is still on the TX ring (a full copy-mode ring drains in about 2 ms).
const DRAIN_NS: u64 = 200_000_000;

/// The traffic a generator sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Traffic {
    /// UDP datagrams.
    Udp,
    /// TCP SYN segments (connection attempts), a fresh sequence number each.
    Syn,
    /// TCP ACK segments of established flows (PSH|ACK when they carry payload).
    Tcp,
}

/// Which 5-tuples the packets carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flows {
    /// Every packet the next step of the source walk: a new 5-tuple each.
    New,
    /// These many flows (steps of the walk), cycled.
    Cycle(u32),
}

/// Latency probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeConfig {
    /// Source address (the generator's own address, where reflections come back).
    pub src: Ipv4Addr,
    /// UDP source port (where the reflections are received).
    pub port: u16,
    /// Probes per second.
    pub rate: u64,
}

/// What [`TxGen`] sends, where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenConfig {
    /// Interface to send on.
    pub iface: String,
    /// Queue index.
    pub queue: u32,
    /// Source MAC of every frame.
    pub src_mac: [u8; 6],
    /// Destination MAC of every frame (the next hop).
    pub dst_mac: [u8; 6],
    /// Destination address and port of each flow, in turn; at least one.
    pub targets: Vec<(Ipv4Addr, u16)>,
    /// UDP, SYN or established TCP.
    pub traffic: Traffic,
    /// New or cycled flows.
    pub flows: Flows,
    /// Source addresses, inclusive.
    pub src_range: (Ipv4Addr, Ipv4Addr),
    /// Source ports, inclusive.
    pub sport_range: (u16, u16),
    /// Frame length without FCS, [`MIN_FRAME`] to [`MAX_PACKET`]; the IPv4 packet fills the
    /// frame (no Ethernet padding), its payload is zeros.
    pub size: usize,
    /// Packets per second, or `None` for as fast as possible.
    pub rate: Option<u64>,
    /// Stop after this many packets (probes not included).
    pub count: Option<u64>,
    /// Latency probes, if any.
    pub probes: Option<ProbeConfig>,
    /// Zero-copy or copy mode.
    pub bind: BindPolicy,
}

impl GenConfig {
    /// Checks the values before any socket is made; the error names the bad one.
    ///
    /// # Errors
    /// [`XskError::Config`] for no targets, an empty or reversed range, a size out of range,
    /// a rate of zero, or more cycled flows than the source walk has steps.
    pub fn check(&self) -> Result<(), XskError> {
        let bad = |m: String| Err(XskError::Config(m));
        if self.targets.is_empty() {
            return bad("no destination (VIP:PORT) given".into());
        }
        let (lo, hi) = self.src_range;
        if u32::from(lo) > u32::from(hi) {
            return bad(format!("source range {lo}-{hi} is reversed"));
        }
        let (plo, phi) = self.sport_range;
        if plo > phi || plo == 0 {
            return bad(format!(
                "source port range {plo}-{phi} is reversed or starts at 0"
            ));
        }
        let min = MIN_FRAME.max(ETH + IP + self.l4_len());
        if self.size < min || self.size > MAX_PACKET {
            return bad(format!(
                "frame size {} outside {min}..={MAX_PACKET} bytes",
                self.size
            ));
        }
        if self.rate == Some(0) {
            return bad("rate 0: give a positive rate or max".into());
        }
        if let Flows::Cycle(n) = self.flows {
            let steps = self.walk_steps();
            if n == 0 || n as u64 > steps {
                return bad(format!(
                    "{n} flows: the source ranges give 1 to {steps} distinct flows"
                ));
            }
        }
        if let Some(p) = self.probes {
            if p.rate == 0 || p.port == 0 {
                return bad("probe rate and port must be positive".into());
            }
        }
        Ok(())
    }

    /// Distinct (source address, source port) pairs of the walk.
    pub fn walk_steps(&self) -> u64 {
        let addrs = (u32::from(self.src_range.1) - u32::from(self.src_range.0)) as u64 + 1;
        let ports = (self.sport_range.1 - self.sport_range.0) as u64 + 1;
        addrs * ports
    }

    fn l4_len(&self) -> usize {
        match self.traffic {
            Traffic::Udp => UDP,
            Traffic::Syn | Traffic::Tcp => TCP,
        }
    }
}

/// Live counters of a running generator, for a reporter on another thread. Updated once per
/// batch (relaxed stores), so a reader is at most a batch behind.
#[derive(Debug, Default)]
pub struct GenCounters {
    /// Load packets the kernel has completed (sent).
    pub sent: AtomicU64,
    /// Probes put on the TX ring.
    pub probes: AtomicU64,
}

/// What a finished [`TxGen::run`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GenStats {
    /// Load packets the kernel completed (sent), probes not included.
    pub sent: u64,
    /// Probes sent.
    pub probes: u64,
    /// Frames put on the TX ring (load and probes).
    pub staged: u64,
    /// Frames the kernel completed (load and probes).
    pub completed: u64,
    /// Frames not sent: refused by the kernel (invalid TX descriptors), found no room on the
    /// TX ring, or still not completed when the drain timed out.
    pub tx_errors: u64,
    /// `sendto` kicks.
    pub kicks: u64,
    /// Nanoseconds from the first frame to the last completion.
    pub elapsed_ns: u64,
}

/// The current `CLOCK_MONOTONIC` time in nanoseconds: the clock of probe timestamps, which
/// the receiver of reflected probes reads too.
pub fn monotonic_ns() -> u64 {
    // CLOCK_MONOTONIC always exists, so the call cannot fail.
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC exists");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// What a frame holds, so a reused frame is only rewritten where it varies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    /// Never written.
    Blank,
    /// The load template, with some flow's fields.
    Load,
    /// A probe.
    Probe,
}

/// The fields that vary per packet, in wire order: IPv4 source and destination, then the L4
/// bytes from the source port (ports; for TCP also sequence and acknowledgement numbers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct FlowFields {
    addrs: [u8; 8],
    l4: [u8; 12],
}

/// The walk over source address × port and the targets, as counters (no division per
/// packet).
#[derive(Clone, Debug)]
struct Walk {
    src_lo: u32,
    addrs: u32,
    sport_lo: u16,
    ports: u32,
    targets: Vec<([u8; 4], [u8; 2])>,
    traffic: Traffic,
    /// Flows per cycle (`u64::MAX` for new flows).
    cycle: u64,
    /// TCP payload bytes, by which an established flow's sequence number advances.
    payload: u32,
    // State.
    addr_i: u32,
    port_i: u32,
    target_i: usize,
    /// Index of the flow in the cycle.
    k: u64,
    /// Completed cycles (for TCP sequence numbers).
    round: u32,
    /// Packets produced (for SYN sequence numbers).
    n: u64,
}

impl Walk {
    fn new(cfg: &GenConfig) -> Self {
        let l4 = cfg.l4_len();
        Self {
            src_lo: cfg.src_range.0.into(),
            addrs: u32::from(cfg.src_range.1) - u32::from(cfg.src_range.0) + 1,
            sport_lo: cfg.sport_range.0,
            ports: (cfg.sport_range.1 - cfg.sport_range.0) as u32 + 1,
            targets: cfg
                .targets
                .iter()
                .map(|(a, p)| (a.octets(), p.to_be_bytes()))
                .collect(),
            traffic: cfg.traffic,
            cycle: match cfg.flows {
                Flows::New => u64::MAX,
                Flows::Cycle(n) => n as u64,
            },
            payload: (cfg.size - ETH - IP - l4) as u32,
            addr_i: 0,
            port_i: 0,
            target_i: 0,
            k: 0,
            round: 0,
            n: 0,
        }
    }

    /// The fields of the next packet.
    #[inline(always)]
    fn next(&mut self) -> FlowFields {
        let src = (self.src_lo + self.addr_i).to_be_bytes();
        let sport = (self.sport_lo as u32 + self.port_i) as u16;
        let (dst, dport) = self.targets[self.target_i];
        let mut f = FlowFields::default();
        f.addrs[..4].copy_from_slice(&src);
        f.addrs[4..].copy_from_slice(&dst);
        f.l4[..2].copy_from_slice(&sport.to_be_bytes());
        f.l4[2..4].copy_from_slice(&dport);
        match self.traffic {
            Traffic::Udp => {}
            Traffic::Syn => {
                // A different initial sequence number per attempt (golden-ratio multiple).
                let seq = (self.n as u32).wrapping_mul(0x9e37_79b9);
                f.l4[4..8].copy_from_slice(&seq.to_be_bytes());
            }
            Traffic::Tcp => {
                let k = self.k as u32;
                let seq = k
                    .wrapping_mul(0x9e37_79b9)
                    .wrapping_add(self.round.wrapping_mul(self.payload));
                let ack = k.wrapping_mul(0x85eb_ca6b);
                f.l4[4..8].copy_from_slice(&seq.to_be_bytes());
                f.l4[8..12].copy_from_slice(&ack.to_be_bytes());
            }
        }
        self.step();
        f
    }

    #[inline(always)]
    fn step(&mut self) {
        self.n += 1;
        self.k += 1;
        if self.k == self.cycle {
            self.k = 0;
            self.round = self.round.wrapping_add(1);
            self.addr_i = 0;
            self.port_i = 0;
            self.target_i = 0;
            return;
        }
        self.target_i += 1;
        if self.target_i == self.targets.len() {
            self.target_i = 0;
        }
        self.port_i += 1;
        if self.port_i == self.ports {
            self.port_i = 0;
            self.addr_i += 1;
            if self.addr_i == self.addrs {
                self.addr_i = 0;
            }
        }
    }
}

/// Builds the load template: headers with valid checksums for some flow (the first one's
/// fields are written over it before it is sent), zero payload.
fn load_template(cfg: &GenConfig) -> Vec<u8> {
    let mut p = vec![0u8; cfg.size];
    let proto = match cfg.traffic {
        Traffic::Udp => 17,
        Traffic::Syn | Traffic::Tcp => 6,
    };
    ip_header(&mut p, cfg, proto);
    let l4_len = cfg.size - ETH - IP;
    match cfg.traffic {
        Traffic::Udp => {
            p[L4 + 4..L4 + 6].copy_from_slice(&(l4_len as u16).to_be_bytes());
        }
        Traffic::Syn | Traffic::Tcp => {
            p[L4 + 12] = 5 << 4; // data offset: 5 words, no options
            p[L4 + 13] = match cfg.traffic {
                Traffic::Syn => 0x02,
                _ if l4_len > TCP => 0x18, // PSH|ACK
                _ => 0x10,                 // ACK
            };
            p[L4 + 14..L4 + 16].copy_from_slice(&64240u16.to_be_bytes());
        }
    }
    l4_checksum(&mut p, proto);
    p
}

/// Ethernet and IPv4 header (DF, TTL 64) for `cfg` into a zeroed `p`, the IPv4 total length
/// `p`'s length less the Ethernet header; addresses and checksum are left zero.
fn ip_header(p: &mut [u8], cfg: &GenConfig, proto: u8) {
    p[..6].copy_from_slice(&cfg.dst_mac);
    p[6..12].copy_from_slice(&cfg.src_mac);
    p[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut p[ETH..];
    ip[0] = 0x45;
    let total = ip.len() as u16;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = proto;
}

/// Computes the IPv4 header checksum and the L4 checksum of a whole packet from scratch.
fn l4_checksum(p: &mut [u8], proto: u8) {
    p[IP_CSUM..IP_CSUM + 2].fill(0);
    let c = checksum::checksum(&p[ETH..ETH + IP]);
    p[IP_CSUM..IP_CSUM + 2].copy_from_slice(&c.to_be_bytes());
    let off = if proto == 17 { L4 + 6 } else { L4 + 16 };
    p[off..off + 2].fill(0);
    let len = (p.len() - L4) as u32;
    let pseudo = checksum::pseudo_header(&p[ADDRS..ADDRS + 4], &p[ADDRS + 4..L4], proto, len);
    let mut c = !checksum::fold(checksum::sum(pseudo, &p[L4..]));
    if proto == 17 {
        c = checksum::udp_nonzero(c);
    }
    p[off..off + 2].copy_from_slice(&c.to_be_bytes());
}

/// Writes `f` into a load frame and fixes its checksums incrementally. `l4_var` is how many
/// L4 bytes vary (4 for UDP, 12 for TCP), `l4_csum` the L4 checksum's offset.
#[inline(always)]
fn rewrite(p: &mut [u8], f: &FlowFields, l4_var: usize, l4_csum: usize, udp: bool) {
    let mut old = FlowFields::default();
    old.addrs.copy_from_slice(&p[ADDRS..ADDRS + 8]);
    old.l4[..l4_var].copy_from_slice(&p[L4..L4 + l4_var]);
    let ipc = u16::from_be_bytes([p[IP_CSUM], p[IP_CSUM + 1]]);
    let ipc = update_bytes(ipc, &old.addrs, &f.addrs);
    p[IP_CSUM..IP_CSUM + 2].copy_from_slice(&ipc.to_be_bytes());
    let c = u16::from_be_bytes([p[l4_csum], p[l4_csum + 1]]);
    let c = update_bytes(c, &old.addrs, &f.addrs);
    let mut c = update_bytes(c, &old.l4[..l4_var], &f.l4[..l4_var]);
    if udp {
        c = checksum::udp_nonzero(c);
    }
    p[l4_csum..l4_csum + 2].copy_from_slice(&c.to_be_bytes());
    p[ADDRS..ADDRS + 8].copy_from_slice(&f.addrs);
    p[L4..L4 + l4_var].copy_from_slice(&f.l4[..l4_var]);
}

/// Writes a whole probe frame: sequence `seq`, timestamp `ts`, to `dst`.
fn write_probe(
    p: &mut [u8],
    cfg: &GenConfig,
    probe: &ProbeConfig,
    dst: (Ipv4Addr, u16),
    seq: u64,
    ts: u64,
) {
    // The frame may hold a load packet's bytes: every byte is written.
    p.fill(0);
    ip_header(p, cfg, 17);
    p[ADDRS..ADDRS + 4].copy_from_slice(&probe.src.octets());
    p[ADDRS + 4..L4].copy_from_slice(&dst.0.octets());
    p[L4..L4 + 2].copy_from_slice(&probe.port.to_be_bytes());
    p[L4 + 2..L4 + 4].copy_from_slice(&dst.1.to_be_bytes());
    p[L4 + 4..L4 + 6].copy_from_slice(&((UDP + PROBE_PAYLOAD) as u16).to_be_bytes());
    let pl = L4 + UDP;
    p[pl..pl + 8].copy_from_slice(PROBE_MAGIC);
    p[pl + 8..pl + 16].copy_from_slice(&seq.to_le_bytes());
    p[pl + 16..pl + 24].copy_from_slice(&ts.to_le_bytes());
    l4_checksum(p, 17);
}

/// A token bucket in packets.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    /// Packets per nanosecond.
    per_ns: f64,
    tokens: f64,
    last: u64,
}

impl Bucket {
    fn new(rate: u64, now: u64) -> Self {
        Self {
            per_ns: rate as f64 / 1e9,
            tokens: 1.0,
            last: now,
        }
    }

    /// Adds the tokens earned since the last call, capped at [`BURST`].
    #[inline(always)]
    fn refill(&mut self, now: u64) {
        let dt = now.saturating_sub(self.last);
        self.last = now;
        self.tokens = (self.tokens + dt as f64 * self.per_ns).min(BURST.max(1.0));
    }

    /// Whole tokens available.
    #[inline(always)]
    fn whole(&self) -> u64 {
        self.tokens as u64
    }

    #[inline(always)]
    fn take(&mut self, n: u64) {
        self.tokens -= n as f64;
    }

    /// Nanoseconds until one whole token is available.
    fn wait_ns(&self) -> u64 {
        ((1.0 - self.tokens).max(0.0) / self.per_ns) as u64
    }
}

/// An AF_XDP traffic generator on one (interface, queue). See the module docs.
#[derive(Debug)]
pub struct TxGen {
    group: QueueGroup,
    cfg: GenConfig,
    template: Vec<u8>,
    /// What each UMEM frame holds, by frame index.
    kinds: Vec<Kind>,
    walk: Walk,
}

impl TxGen {
    /// Checks `cfg`, opens the socket (zero-copy first if `cfg.bind` allows) and builds the
    /// template. Must run in the interface's network namespace.
    ///
    /// # Errors
    /// [`XskError::Config`] for a bad configuration, otherwise the socket's setup errors
    /// ([`QueueGroup::open`]).
    pub fn open(cfg: GenConfig) -> Result<Self, XskError> {
        cfg.check()?;
        let mut port = PortConfig::new(&cfg.iface, 0);
        port.rings = RingSizes {
            fill: RX_RING,
            comp: TX_RING,
            rx: RX_RING,
            tx: TX_RING,
        };
        let mut gc = GroupConfig::new(cfg.queue, vec![port]);
        gc.frames = FRAMES;
        gc.bind = cfg.bind;
        let group = QueueGroup::open(&gc)?;
        let kinds = vec![Kind::Blank; group.accounting().total as usize];
        Ok(Self {
            group,
            template: load_template(&cfg),
            walk: Walk::new(&cfg),
            kinds,
            cfg,
        })
    }

    /// The mode the socket is bound in.
    pub fn bind_mode(&self) -> BindMode {
        self.group.bind_mode()
    }

    /// Sends until `stop` is set, `until_ns` ([`monotonic_ns`] time) passes or `cfg.count`
    /// packets are sent; then waits briefly for the kernel to complete what is on the TX
    /// ring. `counters` is updated as it goes.
    ///
    /// # Errors
    /// [`XskError::Io`] when a `sendto` kick fails in a way retrying cannot fix.
    pub fn run(
        &mut self,
        stop: &AtomicBool,
        until_ns: Option<u64>,
        counters: &GenCounters,
    ) -> Result<GenStats, XskError> {
        let mut st = GenStats::default();
        let udp = self.cfg.traffic == Traffic::Udp;
        let (l4_var, l4_csum) = if udp { (4, L4 + 6) } else { (12, L4 + 16) };
        let size = self.cfg.size as u32;
        let count = self.cfg.count.unwrap_or(u64::MAX);
        let targets = self.cfg.targets.len();
        let start = monotonic_ns();
        let mut rate = self.cfg.rate.map(|r| Bucket::new(r, start));
        let mut probe_rate = self.cfg.probes.map(|p| Bucket::new(p.rate, start));
        let mut load_staged = 0u64;
        let mut held = [Held::default(); B];
        let mut is_probe = [false; B];
        let mut no_room = 0u64;
        loop {
            if stop.load(Ordering::Relaxed) || load_staged >= count {
                break;
            }
            let now = monotonic_ns();
            if until_ns.is_some_and(|u| now >= u) {
                break;
            }
            st.completed += self.group.reap_completions() as u64;
            let in_flight = st.staged - st.completed;
            let room = (TX_RING as u64).saturating_sub(in_flight);
            let mut want = (B as u64).min(room).min(count - load_staged);
            if let Some(b) = rate.as_mut() {
                b.refill(now);
                want = want.min(b.whole());
            }
            let mut probe = false;
            if let Some(b) = probe_rate.as_mut() {
                b.refill(now);
                // The probe takes the batch's last slot and a TX ring slot of its own.
                probe = b.whole() >= 1 && room > 0;
                if probe {
                    want = want.min(B as u64 - 1).min(room - 1);
                }
            }
            if want == 0 && !probe {
                st.kicks += self.group.flush_tx()? as u64;
                if room > 0 {
                    self.pace(rate.as_ref(), probe_rate.as_ref(), now, until_ns);
                }
                continue;
            }
            // Take the frames: `want` load frames, then the probe last.
            let mut n = 0;
            let total = want as usize + probe as usize;
            while n < total {
                let len = if probe && n == total - 1 {
                    PROBE_FRAME as u32
                } else {
                    size
                };
                match self.group.take_free(RX_OFFSET as u32, len) {
                    Some(h) => {
                        is_probe[n] = probe && n == total - 1;
                        held[n] = h;
                        n += 1;
                    }
                    None => break,
                }
            }
            let mut loads = 0u64;
            let mut probes = 0u64;
            {
                // Placeholders over an empty buffer (no allocation); `lend` replaces the first
                // `n`.
                let mut frames: [Frame<'_>; B] = std::array::from_fn(|_| Frame::new(&mut [], 0, 0));
                self.group.lend(&held[..n], &mut frames[..n]);
                for ((h, f), &is_p) in held[..n].iter().zip(&mut frames).zip(&is_probe) {
                    let idx = h.idx as usize;
                    let p = f.data_mut();
                    if is_p {
                        let pc = self.cfg.probes.expect("probe frames only with probes");
                        let seq = st.probes + probes;
                        let dst = self.cfg.targets[seq as usize % targets];
                        write_probe(p, &self.cfg, &pc, dst, seq, now);
                        self.kinds[idx] = Kind::Probe;
                        probes += 1;
                        continue;
                    }
                    if self.kinds[idx] != Kind::Load {
                        p.copy_from_slice(&self.template);
                        self.kinds[idx] = Kind::Load;
                    }
                    let f = self.walk.next();
                    rewrite(p, &f, l4_var, l4_csum, udp);
                    loads += 1;
                }
            }
            let mut staged = 0u64;
            for h in &held[..n] {
                if self.group.stage_tx(0, h) {
                    staged += 1;
                } else {
                    // Cannot happen while `room` is right; counted, never lost.
                    self.group.recycle(h);
                    no_room += 1;
                }
            }
            self.group.submit_tx();
            st.staged += staged;
            load_staged += loads;
            st.probes += probes;
            if let Some(b) = rate.as_mut() {
                b.take(loads);
            }
            if let Some(b) = probe_rate.as_mut() {
                b.take(probes);
            }
            st.kicks += self.group.flush_tx()? as u64;
            counters
                .sent
                .store(st.completed.saturating_sub(st.probes), Ordering::Relaxed);
            counters.probes.store(st.probes, Ordering::Relaxed);
        }
        // Drain: let the kernel send what is on the ring.
        let drain_until = monotonic_ns() + DRAIN_NS;
        while st.completed < st.staged && monotonic_ns() < drain_until {
            st.kicks += self.group.flush_tx()? as u64;
            st.completed += self.group.reap_completions() as u64;
            if st.completed < st.staged {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        let end = monotonic_ns();
        st.elapsed_ns = end.saturating_sub(start);
        st.sent = st.completed.saturating_sub(st.probes);
        let invalid = self.group.kernel_stats()?.tx_invalid_descs;
        st.tx_errors = no_room + invalid + (st.staged - st.completed.min(st.staged));
        counters.sent.store(st.sent, Ordering::Relaxed);
        counters.probes.store(st.probes, Ordering::Relaxed);
        Ok(st)
    }

    /// Sleeps until the next token of either bucket when that is far enough away (and
    /// before `until_ns`); otherwise returns at once so the caller spins.
    fn pace(&self, load: Option<&Bucket>, probe: Option<&Bucket>, now: u64, until_ns: Option<u64>) {
        let wait = match (load, probe) {
            (Some(l), Some(p)) => l.wait_ns().min(p.wait_ns()),
            (Some(l), None) => l.wait_ns(),
            (None, Some(p)) => p.wait_ns(),
            (None, None) => 0,
        };
        let wait = until_ns.map_or(wait, |u| wait.min(u.saturating_sub(now)));
        if wait >= SLEEP_MIN_NS {
            std::thread::sleep(Duration::from_nanos(wait - SLEEP_SLACK_NS));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(traffic: Traffic, flows: Flows, size: usize) -> GenConfig {
        GenConfig {
            iface: "none".into(),
            queue: 0,
            src_mac: [2, 0, 0, 0, 0xa, 1],
            dst_mac: [2, 0, 0, 0, 0xa, 0xfe],
            targets: vec![
                (Ipv4Addr::new(203, 0, 113, 1), 1000),
                (Ipv4Addr::new(203, 0, 113, 2), 1001),
                (Ipv4Addr::new(203, 0, 113, 3), 53),
            ],
            traffic,
            flows,
            src_range: (Ipv4Addr::new(192, 0, 2, 16), Ipv4Addr::new(192, 0, 2, 20)),
            sport_range: (1024, 1030),
            size,
            rate: None,
            count: None,
            probes: None,
            bind: BindPolicy::CopyOnly,
        }
    }

    /// Whether the IPv4 and L4 checksums of `p` verify (sum over the data, checksum included,
    /// is all ones).
    fn valid(p: &[u8]) -> bool {
        let ip_ok = checksum::checksum(&p[ETH..ETH + IP]) == 0;
        let proto = p[ETH + 9];
        let len = (p.len() - L4) as u32;
        let pseudo = checksum::pseudo_header(&p[ADDRS..ADDRS + 4], &p[ADDRS + 4..L4], proto, len);
        let l4_ok = !checksum::fold(checksum::sum(pseudo, &p[L4..])) == 0;
        let udp_nonzero = proto != 17 || p[L4 + 6..L4 + 8] != [0, 0];
        ip_ok && l4_ok && udp_nonzero
    }

    /// Runs the template and the in-place rewrite over many packets, as the generator does
    /// with a reused frame, and checks every packet against a full recomputation (the
    /// checksum differential test) and against etherparse's reading.
    fn differential(
        traffic: Traffic,
        flows: Flows,
        size: usize,
        packets: usize,
    ) -> Vec<FlowFields> {
        let c = cfg(traffic, flows, size);
        c.check().expect("valid config");
        let mut w = Walk::new(&c);
        let mut frame = load_template(&c);
        let udp = traffic == Traffic::Udp;
        let (l4_var, l4_csum) = if udp { (4, L4 + 6) } else { (12, L4 + 16) };
        let mut seen = Vec::new();
        for i in 0..packets {
            // Every third packet starts from a fresh template, as a first-use frame does.
            if i % 3 == 0 {
                frame.copy_from_slice(&load_template(&c));
            }
            let f = w.next();
            rewrite(&mut frame, &f, l4_var, l4_csum, udp);
            assert!(valid(&frame), "packet {i}: bad checksum {frame:02x?}");
            let mut fresh = frame.clone();
            l4_checksum(&mut fresh, if udp { 17 } else { 6 });
            assert!(valid(&fresh));
            let pkt = etherparse::SlicedPacket::from_ethernet(&frame).expect("etherparse");
            let Some(etherparse::NetSlice::Ipv4(ip)) = pkt.net else {
                panic!("not IPv4")
            };
            assert_eq!(ip.header().total_len() as usize, size - ETH);
            assert_eq!(
                ip.header().source(),
                <[u8; 4]>::try_from(&f.addrs[..4]).unwrap()
            );
            seen.push(f);
        }
        seen
    }

    #[test]
    fn udp_new_flows_are_distinct_and_checksums_valid() {
        let seen = differential(Traffic::Udp, Flows::New, 64, 35);
        let set: std::collections::HashSet<_> = seen.iter().map(|f| (f.addrs, f.l4)).collect();
        assert_eq!(set.len(), 35, "5 addresses x 7 ports: 35 new flows");
        // The 36th packet wraps the walk.
        let mut more = differential(Traffic::Udp, Flows::New, 64, 36);
        let last = more.pop().unwrap();
        assert_eq!(&last.addrs[..4], &seen[0].addrs[..4]);
        assert_eq!(&last.l4[..2], &seen[0].l4[..2]);
    }

    #[test]
    fn cycled_flows_repeat_exactly() {
        for traffic in [Traffic::Udp, Traffic::Tcp, Traffic::Syn] {
            let seen = differential(traffic, Flows::Cycle(10), 128, 40);
            let tuples: std::collections::HashSet<_> = seen
                .iter()
                .map(|f| (f.addrs, [f.l4[0], f.l4[1], f.l4[2], f.l4[3]]))
                .collect();
            assert_eq!(tuples.len(), 10, "{traffic:?}");
            for (i, f) in seen.iter().enumerate() {
                assert_eq!(f.addrs, seen[i % 10].addrs);
                assert_eq!(f.l4[..4], seen[i % 10].l4[..4]);
                // Flow k goes to target k % 3.
                assert_eq!(f.addrs[7], [1, 2, 3][i % 10 % 3]);
            }
            if traffic == Traffic::Tcp {
                let seq = |f: &FlowFields| u32::from_be_bytes(f.l4[4..8].try_into().unwrap());
                let payload = (128 - ETH - IP - TCP) as u32;
                assert_eq!(seq(&seen[13]), seq(&seen[3]).wrapping_add(payload));
                assert_eq!(seen[13].l4[8..12], seen[3].l4[8..12], "ack per flow");
            }
        }
    }

    #[test]
    fn minimum_tcp_frames_and_sizes() {
        differential(Traffic::Syn, Flows::New, MIN_FRAME, 50);
        differential(Traffic::Tcp, Flows::Cycle(7), 1514, 50);
        differential(Traffic::Udp, Flows::New, 1514, 50);
    }

    #[test]
    fn probes_carry_magic_sequence_and_time() {
        let c = cfg(Traffic::Udp, Flows::New, 64);
        let pc = ProbeConfig {
            src: Ipv4Addr::new(192, 0, 2, 1),
            port: 40000,
            rate: 1000,
        };
        let mut p = vec![0xaau8; PROBE_FRAME];
        write_probe(&mut p, &c, &pc, c.targets[1], 7, 123_456_789);
        assert!(valid(&p));
        let pkt = etherparse::SlicedPacket::from_ethernet(&p).expect("etherparse");
        let Some(etherparse::TransportSlice::Udp(u)) = pkt.transport else {
            panic!("not UDP")
        };
        assert_eq!((u.source_port(), u.destination_port()), (40000, 1001));
        let pl = u.payload();
        assert_eq!(&pl[..8], PROBE_MAGIC);
        assert_eq!(u64::from_le_bytes(pl[8..16].try_into().unwrap()), 7);
        assert_eq!(
            u64::from_le_bytes(pl[16..24].try_into().unwrap()),
            123_456_789
        );
    }

    #[test]
    fn bad_configs_are_named() {
        let err = |f: fn(&mut GenConfig)| {
            let mut c = cfg(Traffic::Udp, Flows::New, 64);
            f(&mut c);
            c.check().expect_err("invalid").to_string()
        };
        assert!(err(|c| c.targets.clear()).contains("no destination"));
        assert!(err(|c| c.size = 59).contains("frame size 59"));
        assert!(err(|c| c.flows = Flows::Cycle(36)).contains("36 flows"));
        assert!(err(|c| c.rate = Some(0)).contains("rate 0"));
        assert!(err(|c| c.sport_range = (10, 9)).contains("port range"));
    }

    #[test]
    fn bucket_paces() {
        let mut b = Bucket::new(1_000_000, 0);
        b.take(1);
        b.refill(10_000); // 10 µs at 1 Mpps: 10 packets
        assert_eq!(b.whole(), 10);
        b.refill(10_000_000_000);
        assert_eq!(b.whole(), BURST as u64, "capped");
        b.take(BURST as u64);
        assert_eq!(b.wait_ns(), 1000);
    }
}
