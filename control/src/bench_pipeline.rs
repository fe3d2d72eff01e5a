//! `strait bench pipeline`: a quick, in-memory measurement of the packet path on this machine.
//!
//! ```text
//! synthetic config (1,000 services x 4 backends) ──► ServiceTable ──┐
//! 60-byte TCP frames ──copy (untimed)──► RX buffers ──► Pipeline::process ──► Tx (timed)
//! ```
//!
//! For each forwarding mode, one pipeline (core 0 of 1, so nat never hands off) first warms
//! 1,000,000 established flows, then is measured on two kinds of traffic for about
//! [`Params::time`] each:
//!
//! - `established`: ACKs of those flows, visited in one shuffled order over and over, so each
//!   packet's flow entry is wherever the previous pass left it in the cache hierarchy (with a
//!   million flows, mostly in DRAM), as on a busy gateway;
//! - `syn`: SYNs, every one a new 5-tuple: a Maglev choice and a flow-table insert (in nat also
//!   a reply entry and a reply-tuple lookup). The table is emptied (the clock jumps a day and a
//!   sweep reclaims everything, untimed) whenever it is a quarter full, so every SYN finds a
//!   free way and is remembered, as on a gateway whose table is sized for its load. A SYN
//!   flood against a full table would instead evict half-open entries; that is not measured.
//!
//! Each packet is a 60-byte frame (54 bytes of Ethernet, IPv4 and TCP headers, padded to the
//! Ethernet minimum). Because the pipeline rewrites frames in place and encapsulation grows
//! them at the front, frames are copied into the RX buffers before each batch of
//! [`BATCH`], outside the timed section: that copy stands for the NIC's DMA, and like DDIO it
//! leaves the headers in cache. Only `Pipeline::process` is inside the clock.
//!
//! The flow table gets 2^21 entries (2^22 in nat, two entries a flow), so the million flows
//! fill half of it; the `stateless` column counts the flows that found their 8-way bucket full
//! anyway and are forwarded by Maglev alone, paying a failed insert on every packet.
//!
//! The numbers are for one core, the calling thread, which is not pinned (the control crate
//! has no `libc` to call `sched_setaffinity`; run under `taskset -c N` to pin). The flow table
//! is allocated with the global allocator, so it gets transparent huge pages only if the
//! system's THP mode is `always`.
//!
//! The traffic generator duplicates `strait_benches` (the criterion benches), which control
//! cannot depend on; both could move to a shared crate.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;
use strait_config::model::{
    Backend, BackendState, Config, Gateway, Interface, MacAddr, Mode, Protocol, Role, Service,
    Timeouts,
};
use strait_dataplane::pipeline::{Pipeline, Verdict};
use strait_dataplane::rewrite::{Frame, HEADROOM};
use strait_dataplane::table::{Builder, Port, ServiceTable};

const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xc1];
const SEC: u64 = 1_000_000_000;
/// 54 bytes of headers padded to the 60-byte Ethernet minimum: a 64-byte packet on the wire.
const FRAME_LEN: usize = 60;
/// Distance between RX buffers: the 2 KiB UMEM frame size AF_XDP setups commonly use.
const BUF_SIZE: usize = 2048;
/// Frames per timed batch: the two clock reads around a batch cost under 0.1 % of it.
const BATCH: usize = 1024;
const BACKENDS_PER_SERVICE: usize = 4;
/// Maglev size of every service but the first (which keeps the default 65537): small, so
/// 1,000 services build in milliseconds.
const SMALL_MAGLEV: u32 = 1021;
/// SYN flow numbers start here, far above the established flows'.
const SYN_BASE: u64 = 1 << 27;

/// What to measure.
#[derive(Clone, Copy, Debug)]
struct Params {
    services: usize,
    flows: usize,
    /// Pipeline time to measure per mode and traffic.
    time: Duration,
}

impl Params {
    const DEFAULT: Params = Params {
        services: 1_000,
        flows: 1_000_000,
        time: Duration::from_secs(2),
    };
}

/// One measured case.
#[derive(Clone, Debug, Serialize)]
struct Row {
    mode: &'static str,
    traffic: &'static str,
    services: usize,
    /// Established flows, or for SYN traffic the new flows (packets) measured.
    flows: u64,
    mpps: f64,
    ns_per_packet: f64,
    /// Flows the table could not store (a full 8-way bucket); their packets are forwarded
    /// by Maglev alone.
    stateless_flows: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    results: Vec<Row>,
}

/// Runs the benchmark and prints a table, or JSON (`{"results": [...]}`) if `json`.
///
/// Takes about 20 s and 0.5 GB of memory (the nat flow table holds two entries per flow).
///
/// # Errors
/// If a frame is not transmitted (a bench of drops would measure the wrong thing), or a
/// table does not build.
pub fn run(json: bool) -> anyhow::Result<()> {
    let rows = measure(&Params::DEFAULT)?;
    if json {
        println!("{}", serde_json::to_string(&Report { results: rows })?);
    } else {
        print!("{}", human(&rows));
    }
    Ok(())
}

fn human(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "one unpinned core; 60-byte TCP frames in batches of {BATCH}; frame copy not timed"
    );
    let _ = writeln!(
        s,
        "{:<9} {:<12} {:>8} {:>9} {:>7} {:>10} {:>9}",
        "mode", "traffic", "services", "flows", "Mpps", "ns/packet", "stateless"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<9} {:<12} {:>8} {:>9} {:>7.2} {:>10.1} {:>9}",
            r.mode, r.traffic, r.services, r.flows, r.mpps, r.ns_per_packet, r.stateless_flows
        );
    }
    s
}

fn measure(p: &Params) -> anyhow::Result<Vec<Row>> {
    let templates = established_frames(p.flows, p.services);
    let mut rows = Vec::new();
    for mode in Mode::ALL {
        let table = Builder::new().build(
            &config(mode, p.services),
            &[Port {
                mac: GW_MAC,
                mtu: 1500,
            }],
            |_, _, _| false,
        )?;
        // 2^21 entries per entry a flow takes: half full with the established flows. Even
        // so about 0.7 % of them find their 8-way bucket full (1.3 % in nat, which needs
        // room for two entries) and are forwarded statelessly; the report counts them.
        let per_flow = if mode == Mode::Nat { 2 } else { 1 };
        let capacity = ((p.flows * per_flow).max(1) * 2)
            .next_power_of_two()
            .max(1 << 21);
        let mut run = Run {
            pipe: Pipeline::new(0, 1, capacity, table.timeouts, 0),
            table,
            rx: vec![0; BATCH * BUF_SIZE],
            now: SEC,
            not_tx: 0,
            verdicts: vec![Verdict::Pass; BATCH],
        };

        // Established: warm every flow with one packet, then measure.
        let mut cursor = 0;
        let mut next = |rx: &mut [u8]| {
            for buf in rx.chunks_exact_mut(BUF_SIZE) {
                buf[HEADROOM..HEADROOM + FRAME_LEN]
                    .copy_from_slice(&templates[cursor * FRAME_LEN..][..FRAME_LEN]);
                cursor = (cursor + 1) % p.flows;
            }
        };
        for _ in 0..p.flows.div_ceil(BATCH) {
            run.batch(&mut next);
        }
        let stateless = run.pipe.counters.stateless_full;
        run.check(mode, "warm-up")?;
        let (packets, spent) = run.measure(p.time, &mut next);
        run.check(mode, "established")?;
        rows.push(row(
            mode,
            "established",
            p,
            p.flows as u64,
            packets,
            spent,
            stateless,
        ));

        // SYN: every packet a new flow, into a table emptied whenever it is a quarter full.
        run.clear();
        let before = run.pipe.counters.stateless_full;
        let mut flow_no = SYN_BASE;
        let quarter = capacity / 4;
        let (mut packets, mut spent) = (0u64, Duration::ZERO);
        while spent < p.time {
            if run.pipe.flows.len() + BATCH * per_flow > quarter {
                run.clear();
            }
            spent += run.batch(|rx| {
                for buf in rx.chunks_exact_mut(BUF_SIZE) {
                    write_tcp_v4(&mut buf[HEADROOM..], &flow(flow_no, p.services), SYN);
                    flow_no += 1;
                }
            });
            packets += BATCH as u64;
        }
        run.check(mode, "syn")?;
        let stateless = run.pipe.counters.stateless_full - before;
        rows.push(row(mode, "syn", p, packets, packets, spent, stateless));
    }
    Ok(rows)
}

fn row(
    mode: Mode,
    traffic: &'static str,
    p: &Params,
    flows: u64,
    packets: u64,
    spent: Duration,
    stateless_flows: u64,
) -> Row {
    let ns = spent.as_nanos() as f64 / packets as f64;
    Row {
        mode: mode.as_str(),
        traffic,
        services: p.services,
        flows,
        mpps: (1e3 / ns * 100.0).round() / 100.0,
        ns_per_packet: (ns * 10.0).round() / 10.0,
        stateless_flows,
    }
}

/// A pipeline, its table and RX buffers.
struct Run {
    table: ServiceTable,
    pipe: Pipeline,
    rx: Vec<u8>,
    verdicts: Vec<Verdict>,
    now: u64,
    not_tx: u64,
}

impl Run {
    /// Fills the RX buffers with `fill` (untimed), runs them through the pipeline, and returns
    /// how long that took.
    fn batch(&mut self, mut fill: impl FnMut(&mut [u8])) -> Duration {
        fill(&mut self.rx);
        self.now += 1_000;
        let now = self.now;
        let mut frames: Vec<Frame<'_>> = self
            .rx
            .chunks_exact_mut(BUF_SIZE)
            .map(|buf| Frame::new(buf, HEADROOM, FRAME_LEN))
            .collect();
        let start = Instant::now();
        // The AF_XDP worker's path: RX batches through `process_batch`.
        self.pipe
            .process_batch(&self.table, now, 0, &mut frames, &mut self.verdicts);
        let spent = start.elapsed();
        self.not_tx += self
            .verdicts
            .iter()
            .filter(|v| !matches!(v, Verdict::Tx { .. }))
            .count() as u64;
        spent
    }

    fn measure(&mut self, time: Duration, mut fill: impl FnMut(&mut [u8])) -> (u64, Duration) {
        let (mut packets, mut spent) = (0, Duration::ZERO);
        while spent < time {
            spent += self.batch(&mut fill);
            packets += BATCH as u64;
        }
        (packets, spent)
    }

    /// Expires and reclaims every flow: the clock jumps a day, past every timeout.
    fn clear(&mut self) {
        self.now += 86_400 * SEC;
        self.pipe.flows.sweep(self.now, usize::MAX);
    }

    fn check(&self, mode: Mode, phase: &str) -> anyhow::Result<()> {
        if self.not_tx > 0 {
            let c = &self.pipe.counters;
            bail!(
                "{mode} {phase}: {} of {} frames were not transmitted (pass {}, handoff {}, \
                 dropped {}); the measurement would not be of forwarding",
                self.not_tx,
                c.rx,
                c.pass,
                c.handoff,
                c.dropped()
            );
        }
        Ok(())
    }
}

fn vip(s: usize) -> Ipv4Addr {
    Ipv4Addr::from(0x0a60_0000 | (s as u32 & 0xffff)) // 10.96.0.0/16
}

/// `services` TCP services on port 80 in `mode`, 4 backends each (10.200.0.0/13, none shared,
/// so nat reply tuples never collide), MACs known, no rate cap.
fn config(mode: Mode, services: usize) -> Config {
    let backend_port = if mode == Mode::Nat { 8080 } else { 80 };
    Config {
        gateway: Gateway {
            admin_listen: Gateway::DEFAULT_ADMIN_LISTEN,
            default_mode: mode,
            flow_capacity_per_core: Gateway::DEFAULT_FLOW_CAPACITY_PER_CORE,
            new_flows_per_second_per_core: 0,
            gue_port: Gateway::DEFAULT_GUE_PORT,
            tunnel_source_v4: Some(Ipv4Addr::new(192, 0, 2, 1)),
            tunnel_source_v6: None,
            mtu: Gateway::DEFAULT_MTU,
            timeouts: Timeouts::default(),
            interfaces: vec![Interface {
                name: "bench0".into(),
                queues: vec![0],
                cores: None,
                role: Role::Both,
            }],
        },
        services: (0..services)
            .map(|s| Service {
                name: format!("bench/svc-{s}"),
                vip: IpAddr::V4(vip(s)),
                port: 80,
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
                backends: (0..BACKENDS_PER_SERVICE)
                    .map(|j| {
                        let b = s * BACKENDS_PER_SERVICE + j;
                        Backend {
                            address: IpAddr::V4(Ipv4Addr::from(0x0ac8_0000 | b as u32)),
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

/// Flow `i`: client `100.64.0.0 + i / 64` port `10000 + i % 64` to service `i % services`;
/// distinct for every `i < 2^28`.
fn flow(i: u64, services: usize) -> (Ipv4Addr, u16, Ipv4Addr) {
    (
        Ipv4Addr::from(0x6440_0000 | ((i >> 6) as u32 & 0x3f_ffff)),
        10_000 + (i & 63) as u16,
        vip((i % services as u64) as usize),
    )
}

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;

/// One ACK frame per established flow, in a shuffled order.
fn established_frames(flows: usize, services: usize) -> Vec<u8> {
    let mut order: Vec<u64> = (0..flows as u64).collect();
    // Fisher-Yates with SplitMix64, seeded: the same order every run.
    let mut state = 0x5354_5241_4954u64;
    for i in (1..order.len()).rev() {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let j = ((u128::from(z ^ (z >> 31)) * (i as u128 + 1)) >> 64) as usize;
        order.swap(i, j);
    }
    let mut out = vec![0; flows * FRAME_LEN];
    for (f, i) in out.chunks_exact_mut(FRAME_LEN).zip(order) {
        write_tcp_v4(f, &flow(i, services), ACK);
    }
    out
}

/// RFC 1071 sum, not folded.
fn sum(mut acc: u32, data: &[u8]) -> u32 {
    for w in data.chunks_exact(2) {
        acc += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    acc
}

fn checksum(acc: u32) -> [u8; 2] {
    let mut a = acc;
    while a >> 16 != 0 {
        a = (a & 0xffff) + (a >> 16);
    }
    (!(a as u16)).to_be_bytes()
}

/// A 60-byte Ethernet/IPv4/TCP frame from the client to the VIP with `flags`, checksums
/// correct.
fn write_tcp_v4(out: &mut [u8], &(client, port, vip): &(Ipv4Addr, u16, Ipv4Addr), flags: u8) {
    let f = &mut out[..FRAME_LEN];
    f.fill(0);
    f[0..6].copy_from_slice(&GW_MAC);
    f[6..12].copy_from_slice(&CLIENT_MAC);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut f[14..34];
    ip[..10].copy_from_slice(&[0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6]); // DF, TTL 64, TCP
    ip[12..16].copy_from_slice(&client.octets());
    ip[16..20].copy_from_slice(&vip.octets());
    let c = checksum(sum(0, ip));
    ip[10..12].copy_from_slice(&c);
    let tcp = &mut f[34..54];
    tcp[0..2].copy_from_slice(&port.to_be_bytes());
    tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
    tcp[7] = 1; // seq 1
    tcp[11] = u8::from(flags & ACK != 0); // ack 1 when ACK is set
    tcp[12] = 5 << 4;
    tcp[13] = flags;
    tcp[14..16].copy_from_slice(&[0xff, 0xff]);
    let pseudo = sum(sum(6 + 20, &client.octets()), &vip.octets());
    let c = checksum(sum(pseudo, tcp));
    tcp[16..18].copy_from_slice(&c);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_and_traffic_forwards_everything() {
        let p = Params {
            services: 20,
            flows: 5_000,
            time: Duration::from_millis(5),
        };
        let rows = measure(&p).expect("all frames transmitted");
        assert_eq!(rows.len(), 8);
        for r in &rows {
            assert!(r.mpps > 0.0, "{r:?}");
            assert_eq!(r.stateless_flows, 0, "{r:?}");
        }
        let text = human(&rows);
        assert!(text.contains("dsr-gue   syn"), "{text}");
        let json = serde_json::to_string(&Report { results: rows }).expect("json");
        assert!(json.starts_with(
            r#"{"results":[{"mode":"dsr-l2","traffic":"established","services":20,"flows":5000,"#
        ));
    }

    /// The full benchmark, as `strait bench pipeline` runs it. In release:
    /// `cargo test -p strait-control --release bench_pipeline -- --ignored --nocapture`.
    #[test]
    #[ignore = "takes about 20 s; run in release"]
    fn full() {
        run(false).expect("benchmark runs");
    }
}
