//! Synthetic traffic for Strait's criterion benches.
//!
//! ```text
//! config(mode, services) ──Builder──► ServiceTable ─┐
//! flow(i) ──write_tcp_v4──► 60-byte frames ──copy──► RX buffers ──Pipeline::process_batch──► Tx
//!                       (templates, untimed)   (untimed, like the NIC's DMA)   (timed)
//! ```
//!
//! The benches in `benches/` are drivers of the same sans-IO step the AF_XDP worker drives:
//! [`Pipeline::process_batch`] over frames in buffers with [`HEADROOM`] in front. Everything a NIC
//! and the RX ring would have done (putting the frame bytes into a UMEM frame) happens before
//! the clock starts, so a measurement is the pipeline's own cost: parse, table lookups, flow
//! table, rewrite.
//!
//! # Why the frames are restored before every batch
//!
//! The pipeline rewrites in place and encapsulation grows a frame at the front, so a buffer
//! cannot be run twice. Before each batch [`Bench::batch`] copies each frame's pristine
//! 60 bytes (all of it: Ethernet, IPv4 and TCP headers are 54 bytes, padded to the 60-byte
//! Ethernet minimum) into its RX buffer, outside the timed section. That is the work a NIC's
//! DMA does, and it leaves the headers cache-warm, as DDIO (DMA into the last-level cache)
//! would. The per-flow state the pipeline reads (flow table, Maglev slots) is not warmed: for
//! established traffic the frames visit the flows in a shuffled order, so each packet finds
//! its flow entry wherever an earlier pass left it in the cache hierarchy.
//!
//! # Per-batch timing
//!
//! Each batch is timed on its own. [`Bench::measure`] keeps every batch's time and
//! [`Measurement`] reports the median (and 10th and 90th percentiles) of the per-batch
//! nanoseconds per packet next to the plain mean: on a shared machine a batch during which the
//! thread was preempted takes milliseconds instead of tens of microseconds, and a handful of
//! those dominate a sum, so runs of the same binary differ by 2x in the mean while the median
//! stays put. Both are reported; see [`Measurement`] for what each one means.
//!
//! `strait-lab bench pipeline` (`lab/src/bench/pipeline.rs`) drives this same harness and
//! prints both summaries; the criterion benches in `benches/` time the same batches and leave
//! the statistics to criterion.

#![forbid(unsafe_code)]

pub mod bare;
pub mod instructions;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use strait_config::model::{
    Backend, BackendState, Config, Gateway, Interface, MacAddr, Mode, Protocol, Role, Service,
    Timeouts as ConfigTimeouts,
};
use strait_dataplane::pipeline::{Pipeline, Verdict};
use strait_dataplane::rewrite::{Frame, HEADROOM};
use strait_dataplane::table::{Builder, Port, ServiceTable};

/// The gateway's MAC (its only port).
pub const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// The client's (or its router's) MAC.
pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xc1];
/// One second in the pipeline's clock unit.
pub const SEC: u64 = 1_000_000_000;

/// Length of a generated frame: Ethernet (14) + IPv4 (20) + TCP (20) = 54 bytes, padded to
/// the 60-byte Ethernet minimum, a "64-byte packet" on the wire once the NIC adds the FCS.
pub const FRAME_LEN: usize = 60;
/// Distance between two RX buffers: 2048 bytes, the UMEM frame size AF_XDP drivers most
/// often use, so buffer addresses map to cache sets as they do in a UMEM.
pub const BUF_SIZE: usize = 2048;
/// Frames per timed batch: large enough that the two `Instant::now` calls around it (about
/// 20-50 ns each) are below 0.1 % of the batch. A timed batch is handed to the pipeline in
/// [`Bench::call_size`] frames per [`Pipeline::process_batch`] call, by default all at once.
pub const BATCH: usize = 1024;

/// Nanoseconds the pipeline's clock advances per frame: about the pipeline's own pace on
/// this kind of machine, so that what it does by the clock (its flow table's paced sweep)
/// comes as often per packet as on a busy core.
pub const FRAME_NS: u64 = 50;

/// Backends per synthetic service.
pub const BACKENDS_PER_SERVICE: usize = 4;
/// Maglev table size of every service but the first: a small prime, so building 1,000
/// services takes milliseconds rather than seconds.
pub const SMALL_MAGLEV: u32 = 1021;

/// VIP of synthetic service `s`: `10.96.0.0/16` in order.
pub fn vip(s: usize) -> Ipv4Addr {
    Ipv4Addr::from(0x0a60_0000 | (s as u32 & 0xffff))
}

/// Address of backend `b` (service `s` has backends `4s..4s+4`): `10.200.0.0/13` in order, so
/// no two services share a backend and nat reply tuples never collide.
pub fn backend_addr(b: usize) -> Ipv4Addr {
    Ipv4Addr::from(0x0ac8_0000 | (b as u32 & 0x7_ffff))
}

/// The service port (all services listen on 80/tcp; the VIPs differ).
pub const SERVICE_PORT: u16 = 80;
/// The backend port of nat services (DSR backends use the service port).
pub const NAT_BACKEND_PORT: u16 = 8080;

/// A validated configuration of `services` TCP services in `mode`, each with
/// [`BACKENDS_PER_SERVICE`] backends with known MACs. Service 0 has the default Maglev table
/// size (65537), the others [`SMALL_MAGLEV`]. One interface; no new-flow rate cap.
pub fn config(mode: Mode, services: usize) -> Config {
    let backend_port = if mode == Mode::Nat {
        NAT_BACKEND_PORT
    } else {
        SERVICE_PORT
    };
    Config {
        gateway: Gateway {
            admin_listen: Gateway::DEFAULT_ADMIN_LISTEN,
            admin_socket: None,
            admin_token_file: None,
            default_mode: mode,
            flow_capacity_per_core: Gateway::DEFAULT_FLOW_CAPACITY_PER_CORE,
            new_flows_per_second_per_core: 0,
            gue_port: Gateway::DEFAULT_GUE_PORT,
            tunnel_source_v4: Some(Ipv4Addr::new(192, 0, 2, 1)),
            tunnel_source_v6: Some("2001:db8::1".parse().expect("literal")),
            mtu: Gateway::DEFAULT_MTU,
            timeouts: ConfigTimeouts::default(),
            interfaces: vec![Interface {
                name: "bench0".into(),
                queues: vec![0],
                cores: None,
                role: Role::Both,
                vlans: Vec::new(),
                driver: Default::default(),
            }],
            drain_grace: std::time::Duration::ZERO,
            bgp: None,
            l2: None,
            sync: None,
            dpdk: None,
        },
        services: (0..services)
            .map(|s| Service {
                name: format!("bench/svc-{s}"),
                vip: IpAddr::V4(vip(s)),
                port: SERVICE_PORT,
                protocol: Protocol::Tcp,
                mode,
                maglev_table_size: if s == 0 {
                    Service::DEFAULT_MAGLEV_TABLE_SIZE
                } else {
                    SMALL_MAGLEV
                },
                source_ranges: Vec::new(),
                session_affinity: None,
                health_check: None,
                passive_health: None,
                route: Default::default(),
                slow_start: None,
                backends: (0..BACKENDS_PER_SERVICE)
                    .map(|j| {
                        let b = s * BACKENDS_PER_SERVICE + j;
                        Backend {
                            address: IpAddr::V4(backend_addr(b)),
                            port: backend_port,
                            weight: Backend::DEFAULT_WEIGHT,
                            mac: Some(MacAddr([0x02, 0, 0, 0x01, (b >> 8) as u8, b as u8])),
                            tunnel: None,
                            state: BackendState::Active,
                        }
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// The snapshot of [`config`]`(mode, services)` with one 1500-byte-MTU port.
///
/// # Panics
/// If the table does not build (it always does for these configurations).
pub fn table(mode: Mode, services: usize) -> ServiceTable {
    Builder::new()
        .build(
            &config(mode, services),
            &[Port::new(MacAddr(GW_MAC), 1500)],
            |_, _, _| false,
        )
        .expect("synthetic table builds")
}

/// A client-to-VIP TCP 4-tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tuple {
    /// Client address.
    pub client: Ipv4Addr,
    /// Client port.
    pub client_port: u16,
    /// The VIP.
    pub vip: Ipv4Addr,
    /// The service port.
    pub port: u16,
}

/// Flow number `i` of traffic spread over `services` services: client
/// `100.64.0.0 + i / 64` (inside 100.64.0.0/10), client port `10000 + i % 64`, service
/// `i % services`. Distinct for every `i < 2^28`.
pub fn flow(i: u64, services: usize) -> Tuple {
    Tuple {
        client: Ipv4Addr::from(0x6440_0000 | ((i >> 6) as u32 & 0x3f_ffff)),
        client_port: 10_000 + (i & 63) as u16,
        vip: vip((i % services as u64) as usize),
        port: SERVICE_PORT,
    }
}

/// TCP flag bits (RFC 9293 section 3.1).
pub mod flags {
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// ACK.
    pub const ACK: u8 = 0x10;
}

/// The RFC 1071 sum of `data` added to `acc`, not folded.
fn sum(mut acc: u32, data: &[u8]) -> u32 {
    let mut c = data.chunks_exact(2);
    for w in &mut c {
        acc += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [b] = c.remainder() {
        acc += u32::from(*b) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Writes a TCP segment without payload from `t.client` to `t.vip` into `out[..FRAME_LEN]`:
/// Ethernet from [`CLIENT_MAC`] to [`GW_MAC`], IPv4 (DF, TTL 64), TCP with `flags`, both
/// checksums correct, zero padding.
///
/// # Panics
/// If `out` is shorter than [`FRAME_LEN`].
pub fn write_tcp_v4(out: &mut [u8], t: &Tuple, flags: u8) {
    let f = &mut out[..FRAME_LEN];
    f.fill(0);
    f[0..6].copy_from_slice(&GW_MAC);
    f[6..12].copy_from_slice(&CLIENT_MAC);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&40u16.to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&t.client.octets());
    ip[16..20].copy_from_slice(&t.vip.octets());
    let c = !fold(sum(0, ip));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let tcp = &mut f[34..54];
    tcp[0..2].copy_from_slice(&t.client_port.to_be_bytes());
    tcp[2..4].copy_from_slice(&t.port.to_be_bytes());
    tcp[4..8].copy_from_slice(&1u32.to_be_bytes());
    if flags & self::flags::ACK != 0 {
        tcp[8..12].copy_from_slice(&1u32.to_be_bytes());
    }
    tcp[12] = 5 << 4;
    tcp[13] = flags;
    tcp[14..16].copy_from_slice(&65535u16.to_be_bytes());
    let pseudo = sum(sum(6 + 20, &t.client.octets()), &t.vip.octets());
    let c = !fold(sum(pseudo, tcp));
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
}

/// A small, seeded pseudo-random generator (SplitMix64): deterministic traffic without a
/// dependency.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n > 0`), by multiply-shift.
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Shuffles `v` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// What a [`Bench`] sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Traffic {
    /// ACKs of flows already in the flow table, visited in a shuffled order.
    Established,
    /// SYNs, each a new 5-tuple.
    Syn,
    /// Nine established ACKs (as [`Traffic::Established`]) then one SYN of a new flow (as
    /// [`Traffic::Syn`]), over and over: a gateway whose flows mostly last, with one packet
    /// in ten opening a connection.
    Mix,
}

impl Traffic {
    /// Every kind of traffic, in report order.
    pub const ALL: [Traffic; 3] = [Traffic::Established, Traffic::Syn, Traffic::Mix];

    /// The name in reports: `established`, `syn`, `mix`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Traffic::Established => "established",
            Traffic::Syn => "syn",
            Traffic::Mix => "mix",
        }
    }

    /// Whether the traffic carries packets of established flows (which [`Bench::new`] then
    /// creates and warms).
    pub const fn has_established(self) -> bool {
        !matches!(self, Traffic::Syn)
    }
}

/// Of every [`MIX_PERIOD`] frames of [`Traffic::Mix`], the last is a SYN.
pub const MIX_PERIOD: u64 = 10;

/// The order in which established traffic over `flows` flows visits them: flow numbers
/// `0..flows`, shuffled by a fixed seed, so every run (and the bare-lookup reference of
/// `strait-lab bench pipeline`) visits them in the same order.
pub fn established_order(flows: usize) -> Vec<u64> {
    let mut order: Vec<u64> = (0..flows as u64).collect();
    Rng::new(0x5354_5241_4954).shuffle(&mut order);
    order
}

/// First flow number of SYN traffic: far above any established flow's, so a SYN never
/// reuses an established 5-tuple.
const SYN_BASE: u64 = 1 << 27;

/// One pipeline (core 0 of 1, so nat never hands off), its table and a traffic source,
/// run batch by batch.
#[derive(Debug)]
pub struct Bench {
    /// The snapshot.
    pub table: ServiceTable,
    /// The pipeline under test.
    pub pipe: Pipeline,
    /// The clock passed to the pipeline, in nanoseconds.
    pub now: u64,
    /// Frames that did not end in `Tx` (a bench of drops would measure the wrong thing).
    pub not_tx: u64,
    verdicts: Vec<Verdict>,
    traffic: Traffic,
    services: usize,
    /// Established traffic: `FRAME_LEN`-byte frames, one per flow, in shuffled order.
    templates: Vec<u8>,
    cursor: usize,
    /// SYN traffic: the next flow number.
    next_syn: u64,
    /// SYN traffic: flow-table occupancy above which the table is emptied between batches.
    clear_at: usize,
    /// Mix traffic: occupancy after the warm-up (the established flows).
    warm_len: usize,
    /// Mix traffic: frames sent, to place the SYNs.
    mix_at: u64,
    /// Frames per `process_batch` call.
    call: usize,
    rx: Vec<u8>,
}

impl Bench {
    /// A bench of `traffic` over `services` services in `mode`, with a flow table of
    /// `capacity` entries and no new-flow rate cap. For established traffic, `flows` flows
    /// are created and the table warmed by sending each one packet.
    ///
    /// SYN traffic keeps the table at most a quarter full: between batches, once it is, the
    /// clock jumps a day and [`strait_dataplane::flow::FlowTable::sweep`] empties it (untimed).
    /// Every SYN then lands in a table with free ways, as new flows do on a gateway whose
    /// table is sized for its load, and none is forwarded statelessly.
    ///
    /// Mix traffic warms `flows` established flows as established traffic does. Its SYNs'
    /// entries are reclaimed between batches (untimed) once they take a sixteenth of the
    /// table: the clock jumps past the half-open timeout (30 s, far below the established
    /// one, so the established flows, each touched once a pass, stay) and a sweep frees
    /// what expired. The table thus stays near its warmed occupancy.
    pub fn new(
        mode: Mode,
        traffic: Traffic,
        services: usize,
        flows: usize,
        capacity: usize,
    ) -> Self {
        let table = table(mode, services);
        // With its end of a capture hub, disarmed, as a gateway's pipelines run while no
        // capture does: the bench then measures the test a batch pays for capture.
        let hub = std::sync::Arc::new(strait_dataplane::capture::Hub::new(1));
        let pipe = Pipeline::new(0, 1, capacity, table.timeouts, 0).with_capture(hub.tap(0));
        let mut b = Self {
            table,
            pipe,
            now: SEC,
            not_tx: 0,
            verdicts: vec![Verdict::Pass; BATCH],
            traffic,
            services,
            templates: Vec::new(),
            cursor: 0,
            next_syn: SYN_BASE,
            clear_at: capacity / 4,
            warm_len: 0,
            mix_at: 0,
            call: BATCH,
            rx: vec![0; BATCH * BUF_SIZE],
        };
        if traffic.has_established() {
            let order = established_order(flows);
            b.templates = vec![0; flows * FRAME_LEN];
            for (i, f) in order.iter().enumerate() {
                let t = flow(*f, services);
                write_tcp_v4(&mut b.templates[i * FRAME_LEN..], &t, flags::ACK);
            }
            // Warm up: one packet per flow creates its entry (a first ACK makes an
            // established entry, as for a connection picked up mid-stream).
            b.traffic = Traffic::Established;
            for _ in 0..flows.div_ceil(BATCH) {
                let _ = b.batch();
            }
            b.traffic = traffic;
            b.cursor = 0;
            b.warm_len = b.pipe.flows.len();
        }
        b
    }

    /// Switches the traffic the next batches send, keeping the flow table.
    ///
    /// # Panics
    /// If `traffic` carries established flows and this bench has none (it was made for SYN
    /// traffic).
    pub fn set_traffic(&mut self, traffic: Traffic) {
        assert!(
            !traffic.has_established() || self.flows() > 0,
            "{traffic:?} traffic needs a bench made with established flows"
        );
        self.traffic = traffic;
    }

    /// Frames per [`Pipeline::process_batch`] call: each timed batch of [`BATCH`] frames is
    /// handed to the pipeline in calls of this many frames, as a worker hands it each RX
    /// batch it reads. Changes nothing else: frames, traffic and timing are the same.
    ///
    /// # Panics
    /// If `frames` is 0.
    pub fn set_call_size(&mut self, frames: usize) {
        assert!(frames > 0, "a call needs a frame");
        self.call = frames;
    }

    /// Frames per [`Pipeline::process_batch`] call ([`Bench::set_call_size`]).
    pub fn call_size(&self) -> usize {
        self.call
    }

    /// Flows of established traffic (0 for SYN traffic).
    pub fn flows(&self) -> usize {
        self.templates.len() / FRAME_LEN
    }

    /// Fills the RX buffers with the next [`BATCH`] frames (untimed), runs them through the
    /// pipeline in calls of [`Bench::call_size`] frames, and returns how long that took.
    pub fn batch(&mut self) -> Duration {
        let mut spent = Duration::ZERO;
        self.batch_with(|pipe, table, now, frames, verdicts, call| {
            let start = Instant::now();
            run_calls(pipe, table, now, frames, verdicts, call);
            spent = start.elapsed();
        });
        spent
    }

    /// [`Bench::batch`] with the pipeline run by `run` (given the pipeline, the snapshot, the
    /// clock, the frames, their verdicts and the call size; [`run_calls`] is the usual body):
    /// for a driver that measures the run otherwise than by the clock, such as an instruction
    /// counter that counts inside one function.
    pub fn batch_with(
        &mut self,
        run: impl FnOnce(&mut Pipeline, &ServiceTable, u64, &mut [Frame<'_>], &mut [Verdict], usize),
    ) {
        self.fill();
        self.now += FRAME_NS * BATCH as u64;
        let now = self.now;
        let mut frames: Vec<Frame<'_>> = self
            .rx
            .chunks_exact_mut(BUF_SIZE)
            .map(|buf| Frame::new(buf, HEADROOM, FRAME_LEN))
            .collect();
        run(
            &mut self.pipe,
            &self.table,
            now,
            &mut frames,
            &mut self.verdicts,
            self.call,
        );
        self.not_tx += self
            .verdicts
            .iter()
            .filter(|v| !matches!(v, Verdict::Tx { .. }))
            .count() as u64;
    }

    /// Runs batches until `time` of pipeline time (the sum of the batches' times) has been
    /// measured, and at least [`MIN_BATCHES`]; returns every batch's time.
    pub fn measure(&mut self, time: Duration) -> Measurement {
        measure_batches(time, || self.batch())
    }

    fn fill(&mut self) {
        match self.traffic {
            Traffic::Established => {
                for i in 0..BATCH {
                    self.fill_established(i);
                }
            }
            Traffic::Syn => {
                if self.pipe.flows.len() + BATCH * 2 > self.clear_at {
                    self.now += 86_400 * SEC;
                    self.pipe.flows.sweep(self.now, usize::MAX);
                }
                for i in 0..BATCH {
                    self.fill_syn(i);
                }
            }
            Traffic::Mix => {
                if self.pipe.flows.len() > self.warm_len + self.pipe.flows.capacity() / 16 {
                    self.now += self.table.timeouts.tcp_syn + SEC;
                    self.pipe.flows.sweep(self.now, usize::MAX);
                }
                for i in 0..BATCH {
                    self.mix_at += 1;
                    if self.mix_at.is_multiple_of(MIX_PERIOD) {
                        self.fill_syn(i);
                    } else {
                        self.fill_established(i);
                    }
                }
            }
        }
    }

    /// RX buffer `i` gets the next established flow's ACK.
    fn fill_established(&mut self, i: usize) {
        let t = &self.templates[self.cursor * FRAME_LEN..][..FRAME_LEN];
        self.rx[i * BUF_SIZE + HEADROOM..][..FRAME_LEN].copy_from_slice(t);
        self.cursor = if self.cursor + 1 == self.flows() {
            0
        } else {
            self.cursor + 1
        };
    }

    /// RX buffer `i` gets a new flow's SYN.
    fn fill_syn(&mut self, i: usize) {
        let t = flow(self.next_syn, self.services);
        write_tcp_v4(&mut self.rx[i * BUF_SIZE + HEADROOM..], &t, flags::SYN);
        self.next_syn += 1;
    }
}

/// Runs `frames` through `pipe` in [`Pipeline::process_batch`] calls of `call` frames each
/// (the last one shorter if `call` does not divide the frames), as a worker runs each RX
/// batch it reads.
#[inline]
pub fn run_calls(
    pipe: &mut Pipeline,
    table: &ServiceTable,
    now: u64,
    frames: &mut [Frame<'_>],
    verdicts: &mut [Verdict],
    call: usize,
) {
    for (f, v) in frames.chunks_mut(call).zip(verdicts.chunks_mut(call)) {
        pipe.process_batch(table, now, 0, f, v);
    }
}

/// Batches [`Bench::measure`] runs at least, whatever the time: enough that the 10th and
/// 90th percentiles each have 10 batches beyond them.
pub const MIN_BATCHES: usize = 100;

/// The timings of a run of batches and what they say, in nanoseconds per packet.
///
/// Two summaries, because a batch's wall time includes whatever else the core did meanwhile:
///
/// - the **median** of the per-batch figures (with the 10th and 90th percentiles for the
///   spread) is the cost of a batch that ran undisturbed, or disturbed as much as a typical
///   batch. A batch during which the thread was preempted, or the core took a long interrupt,
///   is an outlier and does not move it. On a shared machine this is the figure that repeats.
///   It is not a best case: half of the batches took longer, and a disturbance that slows
///   most batches (a neighbour sharing the last-level cache or memory bandwidth) shows in it.
/// - the **mean**, total time over total packets, is what the thread achieved, preemptions
///   included. On an idle, pinned core the two agree within a few percent; when they do not,
///   the gap is time the core spent elsewhere.
#[derive(Clone, Debug)]
pub struct Measurement {
    /// Packets in all batches.
    pub packets: u64,
    /// Sum of the batches' times.
    pub total: Duration,
    /// Each batch's time divided by its packets, in nanoseconds, sorted ascending.
    per_packet_ns: Vec<f64>,
}

impl Measurement {
    /// The measurement of `batches`, each of `per_batch` packets.
    ///
    /// # Panics
    /// If `batches` is empty or `per_batch` is 0.
    pub fn new(batches: &[Duration], per_batch: usize) -> Self {
        assert!(
            !batches.is_empty() && per_batch > 0,
            "at least one non-empty batch"
        );
        let mut per_packet_ns: Vec<f64> = batches
            .iter()
            .map(|d| d.as_nanos() as f64 / per_batch as f64)
            .collect();
        per_packet_ns.sort_by(f64::total_cmp);
        Self {
            packets: (batches.len() * per_batch) as u64,
            total: batches.iter().sum(),
            per_packet_ns,
        }
    }

    /// Batches measured.
    pub fn batches(&self) -> usize {
        self.per_packet_ns.len()
    }

    /// Total time over total packets, in nanoseconds per packet.
    pub fn mean_ns(&self) -> f64 {
        self.total.as_nanos() as f64 / self.packets as f64
    }

    /// The `q`-quantile (`0.0..=1.0`, clamped) of the per-batch nanoseconds per packet,
    /// interpolated linearly between the two nearest batches (the usual "type 7" definition:
    /// position `q * (n - 1)` in the sorted figures).
    pub fn quantile_ns(&self, q: f64) -> f64 {
        let v = &self.per_packet_ns;
        let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
        let (lo, frac) = (pos.floor() as usize, pos.fract());
        match v.get(lo + 1) {
            Some(hi) => v[lo] + (hi - v[lo]) * frac,
            None => v[lo],
        }
    }

    /// The median of the per-batch nanoseconds per packet.
    pub fn median_ns(&self) -> f64 {
        self.quantile_ns(0.5)
    }
}

/// Times `batch` (one batch of [`BATCH`] packets, returning its own timed part) until `time`
/// has been measured and at least [`MIN_BATCHES`] batches ran: the one measuring loop of the
/// pipeline's rows and of the bare-lookup reference.
pub fn measure_batches(time: Duration, mut batch: impl FnMut() -> Duration) -> Measurement {
    let mut spent = Duration::ZERO;
    let mut batches = Vec::with_capacity(MIN_BATCHES);
    while spent < time || batches.len() < MIN_BATCHES {
        let t = batch();
        spent += t;
        batches.push(t);
    }
    Measurement::new(&batches, BATCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{NetSlice, SlicedPacket, TransportSlice};

    #[test]
    fn generated_frames_are_valid_tcp_with_correct_checksums() {
        let mut buf = [0u8; FRAME_LEN];
        for i in [0u64, 1, 63, 64, 999, 1_000_000, SYN_BASE + 5] {
            let t = flow(i, 1000);
            write_tcp_v4(&mut buf, &t, flags::SYN);
            let p = SlicedPacket::from_ethernet(&buf).expect("parses");
            let Some(NetSlice::Ipv4(ip)) = &p.net else {
                panic!("not ipv4")
            };
            let h = ip.header().to_header();
            assert_eq!(h.header_checksum, h.calc_header_checksum());
            assert_eq!(h.source, t.client.octets());
            assert_eq!(h.destination, t.vip.octets());
            let Some(TransportSlice::Tcp(tcp)) = &p.transport else {
                panic!("not tcp")
            };
            assert!(tcp.syn() && !tcp.ack());
            assert_eq!(
                tcp.checksum(),
                tcp.to_header()
                    .calc_checksum_ipv4(&h, tcp.payload())
                    .unwrap()
            );
            assert_eq!(
                (tcp.source_port(), tcp.destination_port()),
                (t.client_port, 80)
            );
        }
    }

    #[test]
    fn flows_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..200_000 {
            assert!(seen.insert(flow(i, 1000)));
        }
    }

    #[test]
    fn measurement_summaries() {
        let us = Duration::from_micros;
        // Batches of 1,000 packets: 100..=199 us, shuffled; then one preempted for 50 ms.
        let mut batches: Vec<Duration> = (100..200).map(us).collect();
        Rng::new(7).shuffle(&mut batches);
        let m = Measurement::new(&batches, 1000);
        assert_eq!((m.batches(), m.packets), (100, 100_000));
        assert_eq!(m.quantile_ns(0.0), 100.0);
        assert_eq!(m.quantile_ns(1.0), 199.0);
        assert!((m.median_ns() - 149.5).abs() < 1e-9, "{}", m.median_ns());
        assert!((m.quantile_ns(0.1) - 109.9).abs() < 1e-9);
        assert!((m.quantile_ns(0.9) - 189.1).abs() < 1e-9);
        assert!((m.mean_ns() - 149.5).abs() < 1e-9);
        batches.push(Duration::from_millis(50));
        let m = Measurement::new(&batches, 1000);
        assert!((m.median_ns() - 150.0).abs() < 1e-9, "{}", m.median_ns());
        assert!(
            m.mean_ns() > 640.0,
            "the mean counts the preemption: {}",
            m.mean_ns()
        );
        assert_eq!(m.quantile_ns(1.0), 50_000.0);
    }

    #[test]
    fn measure_runs_at_least_min_batches() {
        let mut b = Bench::new(Mode::DsrL2, Traffic::Syn, 10, 0, 1 << 16);
        let m = b.measure(Duration::ZERO);
        assert_eq!(m.batches(), MIN_BATCHES);
        assert_eq!(m.packets, (MIN_BATCHES * BATCH) as u64);
        assert!(m.quantile_ns(0.1) <= m.median_ns() && m.median_ns() <= m.quantile_ns(0.9));
        assert_eq!(b.not_tx, 0);
    }

    #[test]
    fn every_mode_forwards_every_traffic() {
        for mode in Mode::ALL {
            for traffic in Traffic::ALL {
                let mut b = Bench::new(mode, traffic, 50, 5_000, 1 << 16);
                for _ in 0..20 {
                    let _ = b.batch();
                }
                assert_eq!(b.not_tx, 0, "{mode} {traffic:?}: {:?}", b.pipe.counters);
                assert_eq!(b.pipe.counters.stateless_full, 0, "{mode} {traffic:?}");
            }
        }
    }

    #[test]
    fn mix_sends_one_syn_in_ten_and_keeps_the_table_near_its_warm_size() {
        let (flows, capacity) = (5_000, 1 << 15);
        let mut b = Bench::new(Mode::Nat, Traffic::Mix, 50, flows, capacity);
        assert_eq!(
            b.pipe.flows.len(),
            flows,
            "warmed: one entry a flow, replies included"
        );
        let before = b.pipe.flows.stats().inserts;
        for _ in 0..10 {
            let _ = b.batch();
        }
        // 10,240 frames: 1,024 SYNs, each a flow.
        assert_eq!(b.pipe.flows.stats().inserts - before, 1024);
        for _ in 0..200 {
            let _ = b.batch();
            assert!(
                b.pipe.flows.len() <= flows + capacity / 16 + BATCH,
                "{}",
                b.pipe.flows.len()
            );
        }
        assert_eq!(b.not_tx, 0);
        assert_eq!(b.pipe.counters.stateless_full, 0);
        // The established flows survived the sweeps of the SYNs' entries: a pass over them
        // creates no entry.
        b.set_traffic(Traffic::Established);
        let before = b.pipe.flows.stats().inserts;
        for _ in 0..flows.div_ceil(BATCH) {
            let _ = b.batch();
        }
        assert_eq!(b.pipe.flows.stats().inserts, before);
    }

    #[test]
    fn call_size_splits_the_batch_without_changing_the_outcome() {
        let mut whole = Bench::new(Mode::DsrGue, Traffic::Mix, 50, 3_000, 1 << 14);
        let mut split = Bench::new(Mode::DsrGue, Traffic::Mix, 50, 3_000, 1 << 14);
        split.set_call_size(16);
        assert_eq!((whole.call_size(), split.call_size()), (BATCH, 16));
        for _ in 0..5 {
            let _ = whole.batch();
            let _ = split.batch();
            assert_eq!(whole.verdicts, split.verdicts);
            assert_eq!(whole.rx, split.rx, "the same rewritten frames");
        }
        let mut calls = 0;
        split.batch_with(|pipe, table, now, frames, verdicts, call| {
            for (f, v) in frames.chunks_mut(call).zip(verdicts.chunks_mut(call)) {
                pipe.process_batch(table, now, 0, f, v);
                calls += 1;
            }
        });
        assert_eq!(calls, BATCH / 16);
        assert_eq!(split.not_tx, 0);
    }
}
