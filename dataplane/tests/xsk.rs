//! Privileged end-to-end tests of the AF_XDP driver on throwaway veth testbeds.
//!
//! ```text
//!   netns stx{pid}-a                          netns stx{pid}-g
//!   client and backend                        gateway
//!   veth-a 192.0.2.2/24, 2001:db8::2 <─veth─> veth-g 192.0.2.1/24, 2001:db8::1
//!   02:00:00:00:0a:02                         02:00:00:00:0a:01
//!   routes to 203.0.113.0/24 and              XDP strait_steer + AF_XDP socket on queue 0,
//!   2001:db8:10::/64 via the gateway          worker running the pipeline
//! ```
//!
//! Every service's backend is veth-a's own address and MAC, so every forwarded frame comes
//! straight back to namespace a, where an AF_PACKET socket checks what the gateway did: dsr-l2
//! (UDP, TCP SYN, IPv6 UDP, SCTP INITs injected by the packet socket, an ICMP error about a
//! VIP flow) rewrites the MACs only, an SCTP CRC32c staying valid; dsr-ipip
//! encapsulates in front of the received packet, in the UMEM headroom. A nat reply without a
//! flow is redirected and dropped. TCP to the gateway's own address stays with its kernel (a
//! connect to port 9 or 22 is refused). The worker's counters balance, its loop makes no
//! allocation, the UMEM frames are all accounted for at rest, and the steering maps follow a
//! table change. Run with native and with generic XDP; a third test checks that a stale
//! program is replaced and that only our own program is detached on drop.
//! `port_accepts_*` (native and generic): frames to another MAC and tagged with a VLAN
//! veth-g does not serve are passed and counted by the steering program, never reach the
//! worker; a served VLAN (200) and untagged frames are forwarded; the program's counters add
//! up to veth-g's `rx_packets`.
//!
//! Two-arm nat (see [`TwoArm`]):
//!
//! ```text
//!   netns -c            netns -g (gateway)                         netns -b
//!   eth0 <──veth──> veth-c (role client)  veth-b (role backend) <──veth──> eth0
//!   client            one queue group per queue: veth-c/q + veth-b/q      backend
//!   192.0.2.2         sharing a UMEM, one worker each                      198.51.100.11
//! ```
//!
//! `two_arm_nat_round_trip`: packet-socket SYNs from the client to the nat VIP
//! 203.0.113.10:80 leave veth-b translated to 198.51.100.11:8080 (client source kept, TTL
//! decremented, checksums verified by an independent checksum routine here), and the
//! backend's SYN-ACKs leave veth-c translated back to 203.0.113.10:80; frame accounting at rest
//! per UMEM. `nat_handoff_between_two_workers`: the same on two-queue veths with two workers
//! (cores 0 and 1 of 2): client frames written from CPU 0 arrive on queue 0 and backend frames
//! from CPU 1 on queue 1, so each flow crosses the handoff ring once in one direction, and the
//! test also pushes a frame straight into a worker's inbound ring.
//!
//! Needs root, `ip` (iproute2) and a kernel with AF_XDP. Without them the tests FAIL, unless
//! `STRAIT_SKIP_PRIVILEGED=1` is set, in which case they print a loud SKIPPED banner and pass.
//! The namespaces are deleted on drop, also when a test fails.

#![cfg(feature = "xsk")]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use etherparse::{Icmpv4Type, IpNumber, NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use libbpf_rs::query::{ProgInfoIter, ProgInfoQueryOptions};
use libbpf_rs::{MapCore, MapFlags, MapHandle};
use packet_socket::PacketSocket;
use strait_config::model::{self, Mode};
use strait_dataplane::flow::FlowState;
use strait_dataplane::flow::Timeouts;
use strait_dataplane::key::{addr_bytes, is_v4, v4_mapped, v4_unmapped, Addr, Proto};
use strait_dataplane::pipeline::{owner_core, Pipeline};
use strait_dataplane::stats::{Counters, DropReason};
use strait_dataplane::sync::{flags as sync_flags, mesh, RecordKind, SyncCounters, SyncRecord};
use strait_dataplane::table::{Builder, Change, ServiceTable};
use strait_dataplane::xsk::{
    interface_port, run_worker, Accounting, AttachMode, AttachPolicy, BindMode, GroupConfig,
    Handoff, HandoffConfig, KernelStats, MapSync, MonotonicClock, PortConfig, QueueGroup,
    SteerCounters, SteerProgram, WorkerStats, XskError,
};
use strait_testkit::config::{GatewayToml, ServiceToml};
use strait_testkit::harness::{enter_netns, ip, pin_thread, Netns};
use strait_testkit::privileged as gate;

use strait_testkit::alloc::{ALLOCS, COUNTING};
use strait_testkit::packet_socket;

#[global_allocator]
static ALLOCATOR: strait_testkit::alloc::Counting = strait_testkit::alloc::Counting;

const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0x0a, 0x02];
const MAC_G: [u8; 6] = [0x02, 0, 0, 0, 0x0a, 0x01];
const MAC_A_STR: &str = "02:00:00:00:0a:02";
const MAC_G_STR: &str = "02:00:00:00:0a:01";
const VIP: [u8; 4] = [203, 0, 113, 10];
/// VIP of the dsr-ipip service.
const VIP_IPIP: [u8; 4] = [203, 0, 113, 11];
/// VIP of the IPv6 service.
const VIP6: &str = "2001:db8:10::10";
const CLIENT: [u8; 4] = [192, 0, 2, 2];
/// Source of the injected ICMP error: a router on the client's side.
const ROUTER: [u8; 4] = [192, 0, 2, 254];
const UDP_PACKETS: usize = 32;
/// SCTP INITs the client injects to VIP:7777 (this kernel may have no SCTP sockets).
const SCTP_PACKETS: usize = 8;

/// The gateway: veth-g (queue 0, VLAN 200) and its services, every backend the client's
/// own address 192.0.2.2 at MAC_A: dsr-l2 TCP, UDP and SCTP on VIP, dsr-ipip UDP on
/// VIP_IPIP, nat UDP 203.0.113.12:53 to port 5353, dsr-l2 UDP on VIP6.
fn config() -> String {
    let services = [
        (
            "web-tcp",
            "203.0.113.10",
            80,
            "tcp",
            "dsr-l2",
            "192.0.2.2",
            80,
        ),
        (
            "web-udp",
            "203.0.113.10",
            80,
            "udp",
            "dsr-l2",
            "192.0.2.2",
            80,
        ),
        (
            "signalling",
            "203.0.113.10",
            7777,
            "sctp",
            "dsr-l2",
            "192.0.2.2",
            7777,
        ),
        (
            "tunnelled",
            "203.0.113.11",
            80,
            "udp",
            "dsr-ipip",
            "192.0.2.2",
            80,
        ),
        ("dns", "203.0.113.12", 53, "udp", "nat", "192.0.2.2", 5353),
        ("web6", VIP6, 80, "udp", "dsr-l2", "2001:db8::2", 80),
    ];
    let gateway = GatewayToml::new()
        .set("new_flows_per_second_per_core", 0)
        .interface("veth-g", &[0])
        .interface_set("vlans", "[200]");
    services
        .into_iter()
        .fold(
            gateway,
            |g, (name, vip, port, protocol, mode, backend, backend_port)| {
                g.service(
                    ServiceToml::new(name, vip, port)
                        .protocol(protocol)
                        .mode(mode)
                        .backend_mac(backend, backend_port, MAC_A_STR),
                )
            },
        )
        .to_string()
}

/// Keys of the steering maps for [`config`]: frontends (TCP and UDP on VIP:80, SCTP on
/// VIP:7777, VIP_IPIP:80, 203.0.113.12:53, VIP6:80), VIPs, and nat backends
/// (192.0.2.2:5353/udp).
const FRONTENDS: u32 = 6;
const VIPS: u32 = 4;
const NAT_BACKENDS: u32 = 1;

/// The two namespaces and the veth pair between them; deleting the namespaces on drop
/// (their guards) removes everything, also when the test fails.
struct Testbed {
    a: String,
    g: String,
    _ns: [Netns; 2],
}

impl Testbed {
    /// The testbed for `case`, or `None` when the test is not to run: not privileged (the
    /// gate says so) or the testbed cannot be built (fails, or skips loudly under
    /// STRAIT_SKIP_PRIVILEGED=1).
    fn or_skip(what: &str, case: &str) -> Option<Self> {
        if !gate::privileged(what, &[gate::IP]) {
            return None;
        }
        Self::new(case)
            .map_err(|e| skip_or_fail(&format!("cannot build the veth testbed: {e}")))
            .ok()
    }

    /// Namespaces `stx{pid}{case}-a` and `stx{pid}{case}-g`; `case` keeps the tests of one
    /// process apart.
    fn new(case: &str) -> Result<Self, String> {
        let pid = std::process::id();
        let (a, g) = (format!("stx{pid}{case}-a"), format!("stx{pid}{case}-g"));
        let bed = Self {
            _ns: [Netns::try_add(&a)?, Netns::try_add(&g)?],
            a,
            g,
        };
        let (a, g) = (bed.a.as_str(), bed.g.as_str());
        // The pair is made inside a, its peer moved straight into g: the root namespace never
        // holds either end.
        ip(&[
            "-n", a, "link", "add", "veth-a", "address", MAC_A_STR, "type", "veth", "peer", "name",
            "veth-g", "address", MAC_G_STR, "netns", g,
        ])?;
        ip(&["-n", a, "addr", "add", "192.0.2.2/24", "dev", "veth-a"])?;
        ip(&["-n", g, "addr", "add", "192.0.2.1/24", "dev", "veth-g"])?;
        ip(&[
            "-n",
            a,
            "addr",
            "add",
            "2001:db8::2/64",
            "dev",
            "veth-a",
            "nodad",
        ])?;
        ip(&[
            "-n",
            g,
            "addr",
            "add",
            "2001:db8::1/64",
            "dev",
            "veth-g",
            "nodad",
        ])?;
        for (ns, dev) in [(a, "veth-a"), (g, "veth-g"), (a, "lo"), (g, "lo")] {
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        ip(&[
            "-n",
            a,
            "route",
            "add",
            "203.0.113.0/24",
            "via",
            "192.0.2.1",
        ])?;
        ip(&[
            "-n",
            a,
            "route",
            "add",
            "2001:db8:10::/64",
            "via",
            "2001:db8::1",
        ])?;
        ip(&[
            "-n",
            a,
            "neigh",
            "replace",
            "2001:db8::1",
            "lladdr",
            MAC_G_STR,
            "dev",
            "veth-a",
            "nud",
            "permanent",
        ])?;
        ip(&[
            "-n",
            a,
            "neigh",
            "replace",
            "192.0.2.1",
            "lladdr",
            MAC_G_STR,
            "dev",
            "veth-a",
            "nud",
            "permanent",
        ])?;
        ip(&[
            "-n",
            g,
            "neigh",
            "replace",
            "192.0.2.2",
            "lladdr",
            MAC_A_STR,
            "dev",
            "veth-g",
            "nud",
            "permanent",
        ])?;
        Ok(bed)
    }
}

/// Fails the test with `why`, or with STRAIT_SKIP_PRIVILEGED=1 prints SKIPPED and returns.
fn skip_or_fail(why: &str) {
    if std::env::var("STRAIT_SKIP_PRIVILEGED").as_deref() == Ok("1") {
        // Straight to the stderr descriptor: the test harness captures `eprintln!` of passing
        // tests, and a skip must never be silent.
        let _ = std::io::stderr().write_all(
            format!(
                "\n************************************************************\n\
                 *** SKIPPED xsk end-to-end test: {why}\n\
                 *** (STRAIT_SKIP_PRIVILEGED=1: nothing was tested)\n\
                 ************************************************************\n"
            )
            .as_bytes(),
        );
        return;
    }
    panic!(
        "the AF_XDP end-to-end test needs root, iproute2 and a kernel with AF_XDP: {why}. \
         Run it as root, or set STRAIT_SKIP_PRIVILEGED=1 to skip it explicitly."
    );
}

/// What the gateway thread reports once set up.
#[derive(Debug)]
struct Ready {
    bind: BindMode,
    zero_copy_refused: Option<String>,
    attach: AttachMode,
    replaced: Vec<u32>,
    sync: MapSync,
}

/// Commands to the gateway thread.
enum Cmd {
    /// Make the maps follow this table; answer with the change.
    Follow(Arc<ServiceTable>, mpsc::Sender<Result<MapSync, String>>),
    /// The steering program's counters now.
    Counters(mpsc::Sender<Result<SteerCounters, String>>),
    /// Stop the worker and report.
    Stop,
}

/// What the gateway thread reports at the end.
#[derive(Debug)]
struct Report {
    worker: WorkerStats,
    counters: Counters,
    /// The worker's flow-sync counters, and the records its out ring held at the end.
    sync: SyncCounters,
    sync_records: u64,
    accounting: Accounting,
    steer: SteerCounters,
    kernel: KernelStats,
}

/// The gateway: enters namespace `ns`, builds the table, attaches the steering program, opens
/// the port, runs the worker in a thread of its own (which inherits the namespace) and serves
/// commands until told to stop (or until the test drops its end of `cmds`).
fn gateway(
    ns: String,
    policy: AttachPolicy,
    ready: mpsc::Sender<Result<Ready, String>>,
    cmds: mpsc::Receiver<Cmd>,
) -> Result<Report, String> {
    let setup = || -> Result<_, String> {
        enter_netns(&ns);
        let cfg = strait_config::parse(&config()).map_err(|e| e.to_string())?;
        let link = interface_port("veth-g").map_err(|e| e.to_string())?;
        if link.mac.0 != MAC_G {
            return Err(format!("veth-g MAC read as {:02x?}", link.mac));
        }
        let table = Arc::new(
            Builder::new()
                .build(&cfg, &[link], |_, _, _| false)
                .map_err(|e| e.to_string())?,
        );
        let mut prog = SteerProgram::attach("veth-g", policy).map_err(|e| e.to_string())?;
        prog.serve_vlans(&cfg.gateway.interfaces[0].vlans)
            .map_err(|e| e.to_string())?;
        let port =
            QueueGroup::open(&GroupConfig::single("veth-g", 0)).map_err(|e| e.to_string())?;
        let sync = prog.update_maps(&table).map_err(|e| e.to_string())?;
        prog.register(0, &port.ports()[0])
            .map_err(|e| e.to_string())?;
        Ok((table, prog, port, sync))
    };
    let (table, mut prog, mut port, sync) = match setup() {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(e.clone()));
            return Err(e);
        }
    };
    let _ = ready.send(Ok(Ready {
        bind: port.bind_mode(),
        zero_copy_refused: port.zero_copy_refused().map(|e| e.to_string()),
        attach: prog.mode(),
        replaced: prog.replaced_programs().to_vec(),
        sync,
    }));

    // Flow sync on: the worker exports the flows it creates and imports one flow a peer
    // "sent" before it started (client 192.0.2.99:5555 to web-tcp), all under the counting
    // allocator.
    let (mut sync_ends, mut sync_thread) = mesh(1, 1024);
    let mut sync_thread = sync_thread.pop().expect("one worker");
    let learnt = SyncRecord {
        key: strait_dataplane::FlowKey::new(
            [192, 0, 2, 99].into(),
            VIP.into(),
            strait_dataplane::key::proto::TCP,
            5555,
            80,
        ),
        backend: addr_bytes(CLIENT.into()),
        backend_port: 80,
        state: FlowState::TcpEstablished,
        kind: RecordKind::Flow,
        flags: sync_flags::EVERYWHERE,
        peer_mac: [0; 6].into(),
    };
    assert!(sync_thread.to_worker.push(&learnt));
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let stop = stop.clone();
        let sync = sync_ends.pop().expect("one worker");
        thread::spawn(move || {
            let mut pipe = Pipeline::new(0, 1, 4096, Timeouts::default(), 0).with_sync(sync);
            let clock = MonotonicClock::new();
            COUNTING.with(|c| c.set(true));
            let mut handoff = Handoff::none();
            let r = run_worker(
                &mut port,
                &mut pipe,
                &mut handoff,
                || table.clone(),
                &stop,
                clock,
                |_, _| {},
            );
            COUNTING.with(|c| c.set(false));
            (r, pipe, port)
        })
    };
    while let Ok(cmd) = cmds.recv() {
        match cmd {
            Cmd::Follow(t, answer) => {
                let _ = answer.send(prog.update_maps(&t).map_err(|e| e.to_string()));
            }
            Cmd::Counters(answer) => {
                let _ = answer.send(prog.counters().map_err(|e| e.to_string()));
            }
            Cmd::Stop => break,
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (r, pipe, port) = worker.join().map_err(|_| "worker panicked".to_string())?;
    let worker = r.map_err(|e| e.to_string())?;
    // Sends still in the kernel complete within moments; wait for the books to settle.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut accounting = port.accounting();
    while !accounting.at_rest() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
        accounting = port.accounting();
    }
    let steer = prog.counters().map_err(|e| e.to_string())?;
    let kernel = port.kernel_stats().map_err(|e| e.to_string())?;
    let mut sync_records = 0;
    while sync_thread.from_worker.pop().is_some() {
        sync_records += 1;
    }
    Ok(Report {
        worker,
        counters: pipe.counters,
        sync: pipe.sync.as_ref().map(|s| s.counters).unwrap_or_default(),
        sync_records,
        accounting,
        steer,
        kernel,
    })
}

/// Frames seen on veth-a that came back through the gateway, by kind.
#[derive(Debug, Default)]
struct Returned {
    /// UDP to VIP:80, MACs rewritten.
    udp: usize,
    /// TCP SYNs to VIP:80, MACs rewritten.
    tcp_syn: usize,
    /// ICMP errors to the VIP, MACs rewritten.
    icmp_error: usize,
    /// UDP to VIP_IPIP:80 encapsulated in IPv4 to the backend.
    ipip: usize,
    /// UDP to VIP6:80, MACs rewritten.
    udp6: usize,
    /// SCTP to VIP:7777, MACs rewritten, CRC32c still valid.
    sctp: usize,
    /// Every frame that came back from veth-g's MAC.
    total: usize,
    /// Frames to a VIP that left veth-a (the client's own packets).
    sent_to_vip: usize,
}

/// Reads frames from `cap` until it is quiet for a second, and classifies them, checking what
/// each rewrite must have done.
fn drain(cap: &mut PacketSocket) -> Returned {
    let vip6: std::net::Ipv6Addr = VIP6.parse().expect("address");
    let mut r = Returned::default();
    let mut buf = [0u8; 2048];
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(1) {
        let n = match cap.read(&mut buf) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) => panic!("capture read: {e}"),
        };
        quiet_since = Instant::now();
        let f = &buf[..n];
        let Ok(p) = SlicedPacket::from_ethernet(f) else {
            continue;
        };
        let from_client = f[6..12] == MAC_A;
        let udp80 =
            matches!(&p.transport, Some(TransportSlice::Udp(u)) if u.destination_port() == 80);
        match &p.net {
            Some(NetSlice::Ipv4(v4)) => {
                let h = v4.header();
                if from_client {
                    r.sent_to_vip += usize::from([VIP, VIP_IPIP].contains(&h.destination()));
                    continue;
                }
                if h.destination() == CLIENT && h.protocol() == IpNumber::IPV4 {
                    // dsr-ipip: the outer header was written in front of the received packet
                    // (in the UMEM headroom), and the inner packet is the client's, untouched.
                    assert_eq!(f[0..6], MAC_A, "encapsulated to the backend's MAC");
                    assert_eq!(f[6..12], MAC_G, "from the gateway's MAC");
                    let inner = SlicedPacket::from_ip(v4.payload().payload).expect("inner packet");
                    let Some(NetSlice::Ipv4(i)) = &inner.net else {
                        panic!("inner packet is not IPv4");
                    };
                    assert_eq!(i.header().destination(), VIP_IPIP);
                    assert_eq!(i.header().source(), CLIENT);
                    assert_eq!(h.total_len() as usize, 20 + i.header().total_len() as usize);
                    r.ipip += 1;
                    r.total += 1;
                    continue;
                }
                if h.destination() != VIP {
                    continue;
                }
                assert_eq!(f[6..12], MAC_G, "a frame to the VIP from an unknown MAC");
                assert_eq!(f[0..6], MAC_A, "forwarded to the wrong MAC");
                assert_eq!(h.ttl(), 64, "dsr-l2 keeps the TTL");
                r.total += 1;
                if let Some(TransportSlice::Icmpv4(_)) = &p.transport {
                    assert_eq!(h.source(), ROUTER, "dsr-l2 keeps the source");
                    r.icmp_error += 1;
                    continue;
                }
                assert_eq!(h.source(), CLIENT, "dsr-l2 keeps the client address");
                if h.protocol() == IpNumber::SCTP {
                    let mut sctp = v4.payload().payload.to_vec();
                    let field: [u8; 4] = sctp[8..12].try_into().expect("SCTP header");
                    sctp[8..12].copy_from_slice(&[0; 4]);
                    assert_eq!(
                        crc32c::crc32c(&sctp).to_le_bytes(),
                        field,
                        "dsr-l2 keeps a valid SCTP CRC32c"
                    );
                    assert_eq!(sctp[2..4], 7777u16.to_be_bytes());
                    r.sctp += 1;
                    continue;
                }
                match &p.transport {
                    Some(TransportSlice::Tcp(t)) if t.destination_port() == 80 && t.syn() => {
                        r.tcp_syn += 1
                    }
                    _ if udp80 => r.udp += 1,
                    _ => {}
                }
            }
            Some(NetSlice::Ipv6(v6)) if v6.header().destination_addr() == vip6 => {
                if from_client {
                    r.sent_to_vip += 1;
                    continue;
                }
                assert_eq!(f[6..12], MAC_G, "a frame to the VIP from an unknown MAC");
                assert_eq!(f[0..6], MAC_A, "forwarded to the wrong MAC");
                r.total += 1;
                r.udp6 += usize::from(udp80);
            }
            _ => {}
        }
    }
    r
}

/// An ICMP "fragmentation needed" to the VIP quoting a segment the VIP sent to the client:
/// what a router on the return path sends when a backend's DSR reply is too big.
fn icmp_frag_needed() -> Vec<u8> {
    let mut quoted = Vec::new();
    PacketBuilder::ipv4(VIP, CLIENT, 64)
        .tcp(80, 40000, 1, 65535)
        .ack(1)
        .write(&mut quoted, &[])
        .expect("quoted segment");
    let mut out = Vec::new();
    PacketBuilder::ethernet2(MAC_A, MAC_G)
        .ipv4(ROUTER, VIP, 64)
        .icmpv4(Icmpv4Type::DestinationUnreachable(
            etherparse::icmpv4::DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: 1400 },
        ))
        .write(&mut out, &quoted)
        .expect("icmp");
    out
}

/// An SCTP INIT from the client's port `sport` to VIP:7777, its CRC32c computed here.
fn sctp_init(sport: u16) -> Vec<u8> {
    let mut pkt = Vec::new();
    pkt.extend_from_slice(&sport.to_be_bytes());
    pkt.extend_from_slice(&7777u16.to_be_bytes());
    pkt.extend_from_slice(&[0; 8]); // verification tag 0 (an INIT's), checksum
                                    // INIT, length 20: initiate tag, a_rwnd, streams out/in, initial TSN.
    pkt.extend_from_slice(&[1, 0, 0, 20, 0, 0, 0x12, 0x34, 0, 1, 0xa0, 0, 0, 10, 0, 10]);
    pkt.extend_from_slice(&[0, 0, 0x12, 0x34]);
    let crc = crc32c::crc32c(&pkt);
    pkt[8..12].copy_from_slice(&crc.to_le_bytes());
    let mut out = Vec::new();
    PacketBuilder::ethernet2(MAC_A, MAC_G)
        .ipv4(CLIENT, VIP, 64)
        .write(&mut out, IpNumber::SCTP, &pkt)
        .expect("sctp");
    out
}

/// A reply from the nat backend (192.0.2.2:5353) to a client the gateway has no flow for: the
/// steering program must redirect it (nat_backends map) and the pipeline drop it.
fn nat_reply_without_flow() -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(MAC_A, MAC_G)
        .ipv4(CLIENT, [198, 51, 100, 77], 64)
        .udp(5353, 40000)
        .write(&mut out, b"answer")
        .expect("udp");
    out
}

/// What the client namespace saw.
#[derive(Debug)]
struct ClientReport {
    first: Returned,
    refused_9: bool,
    refused_22: bool,
}

/// The client: sends UDP (to the dsr-l2, the dsr-ipip and the IPv6 service), TCP SYNs and an
/// ICMP error to the VIPs, captures what comes back, and checks that the gateway's own
/// ports stay with its kernel.
fn client(ns: String) -> Result<ClientReport, String> {
    enter_netns(&ns);
    let mut cap =
        PacketSocket::open("veth-a", Duration::from_millis(50)).map_err(|e| e.to_string())?;
    let vip = SocketAddr::from((VIP, 80));
    let udp = UdpSocket::bind("192.0.2.2:0").map_err(|e| format!("udp bind: {e}"))?;
    let udp6 = UdpSocket::bind("[2001:db8::2]:0").map_err(|e| format!("udp6 bind: {e}"))?;
    for i in 0..UDP_PACKETS {
        let msg = format!("strait {i}");
        udp.send_to(msg.as_bytes(), vip)
            .map_err(|e| format!("udp send: {e}"))?;
        udp.send_to(msg.as_bytes(), SocketAddr::from((VIP_IPIP, 80)))
            .map_err(|e| format!("udp send: {e}"))?;
        udp6.send_to(msg.as_bytes(), format!("[{VIP6}]:80"))
            .map_err(|e| format!("udp6 send: {e}"))?;
    }
    // The SYN comes back to this namespace, which does not forward, so the connect times out.
    match TcpStream::connect_timeout(&vip, Duration::from_millis(300)) {
        Err(e) if e.kind() == ErrorKind::TimedOut => {}
        other => {
            return Err(format!(
                "connect to the VIP: expected a timeout, got {other:?}"
            ))
        }
    }
    cap.write_all(&icmp_frag_needed())
        .map_err(|e| format!("inject icmp: {e}"))?;
    cap.write_all(&nat_reply_without_flow())
        .map_err(|e| format!("inject nat reply: {e}"))?;
    for i in 0..SCTP_PACKETS {
        cap.write_all(&sctp_init(5000 + i as u16))
            .map_err(|e| format!("inject sctp: {e}"))?;
    }
    let first = drain(&mut cap);

    let refused = |port: u16| {
        let addr = SocketAddr::from(([192, 0, 2, 1], port));
        matches!(
            TcpStream::connect_timeout(&addr, Duration::from_secs(2)),
            Err(e) if e.kind() == ErrorKind::ConnectionRefused
        )
    };
    Ok(ClientReport {
        first,
        refused_9: refused(9),
        refused_22: refused(22),
    })
}

/// Sends UDP to the VIP from namespace `ns` (after the maps dropped the service).
fn send_udp_again(ns: String) -> Result<Returned, String> {
    enter_netns(&ns);
    let mut cap =
        PacketSocket::open("veth-a", Duration::from_millis(50)).map_err(|e| e.to_string())?;
    let udp = UdpSocket::bind("192.0.2.2:0").map_err(|e| format!("udp bind: {e}"))?;
    for i in 0..8 {
        udp.send_to(format!("late {i}").as_bytes(), SocketAddr::from((VIP, 80)))
            .map_err(|e| format!("udp send: {e}"))?;
    }
    Ok(drain(&mut cap))
}

/// The whole round trip with the program attached as `policy` says, in namespaces tagged
/// `case`.
fn round_trip(case: &str, policy: AttachPolicy, want: AttachMode) {
    let started = Instant::now();
    let Some(bed) = Testbed::or_skip("AF_XDP end-to-end", case) else {
        return;
    };

    let (ready_tx, ready_rx) = mpsc::channel();
    let (cmd_tx, cmd_rx) = mpsc::channel();
    let g = bed.g.clone();
    let gw = thread::spawn(move || gateway(g, policy, ready_tx, cmd_rx));
    let ready = match ready_rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            let _ = gw.join();
            skip_or_fail(&format!("gateway setup failed (no AF_XDP / XDP?): {e}"));
            return;
        }
        Err(e) => panic!("gateway thread did not report: {e}"),
    };
    eprintln!(
        "xsk[{case}]: socket bound in {} mode{}; XDP program attached in {:?} mode; stale \
         programs replaced: {:?}; maps: {:?}",
        ready.bind,
        ready
            .zero_copy_refused
            .as_deref()
            .map(|e| format!(" (zero-copy refused: {e})"))
            .unwrap_or_default(),
        ready.attach,
        ready.replaced,
        ready.sync
    );
    assert_eq!(ready.attach, want);
    assert_eq!(
        ready.sync,
        MapSync {
            added: FRONTENDS + VIPS + NAT_BACKENDS,
            removed: 0
        },
        "frontends, VIPs and nat backends"
    );

    let a = bed.a.clone();
    let seen = thread::spawn(move || client(a))
        .join()
        .expect("client thread")
        .expect("client");
    eprintln!("xsk[{case}]: client saw {seen:?}");

    // The maps follow a table without services: nothing is redirected any more.
    let (answer_tx, answer_rx) = mpsc::channel();
    let empty = ServiceTable::empty(vec![strait_dataplane::table::Port::new(
        model::MacAddr(MAC_G),
        1500,
    )]);
    cmd_tx
        .send(Cmd::Follow(Arc::new(empty), answer_tx))
        .expect("gateway alive");
    let sync = answer_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("gateway answers")
        .expect("map update");
    assert_eq!(
        sync,
        MapSync {
            added: 0,
            removed: FRONTENDS + VIPS + NAT_BACKENDS
        }
    );
    let a = bed.a.clone();
    let late = thread::spawn(move || send_udp_again(a))
        .join()
        .expect("client thread")
        .expect("client");

    cmd_tx.send(Cmd::Stop).expect("gateway alive");
    let report = gw.join().expect("gateway thread").expect("gateway");
    eprintln!("xsk[{case}]: gateway {report:#?}");

    let first = &seen.first;
    assert_eq!(
        first.udp, UDP_PACKETS,
        "every UDP datagram comes back rewritten"
    );
    assert_eq!(
        first.ipip, UDP_PACKETS,
        "every datagram comes back encapsulated"
    );
    assert_eq!(
        first.udp6, UDP_PACKETS,
        "every IPv6 datagram comes back rewritten"
    );
    assert!(first.tcp_syn >= 1, "the TCP SYN comes back rewritten");
    assert_eq!(first.icmp_error, 1, "the ICMP error goes to the backend");
    assert_eq!(
        first.sctp, SCTP_PACKETS,
        "every SCTP INIT comes back rewritten"
    );
    // A packet socket does not capture its own writes: the injected ICMP error and SCTP
    // INITs are not in `sent_to_vip`.
    assert_eq!(
        first.sent_to_vip + 1 + SCTP_PACKETS,
        first.total,
        "everything sent came back"
    );
    assert!(
        seen.refused_9,
        "TCP to 192.0.2.1:9 must be refused by the gateway's kernel"
    );
    assert!(
        seen.refused_22,
        "TCP to 192.0.2.1:22 must be refused by the gateway's kernel"
    );
    assert_eq!(late.total, 0, "no service, no redirect: {late:?}");
    assert!(late.sent_to_vip >= 8);

    let c = &report.counters;
    assert!(c.balanced(), "rx == tx + pass + handoff + drops: {c:?}");
    assert_eq!(
        c.drops_for(DropReason::ReplyNoFlow),
        1,
        "the nat reply without a flow"
    );
    assert_eq!(c.dropped(), 1);
    assert_eq!(c.rx, c.tx + c.pass + c.dropped(), "no handoff on one core");
    assert_eq!(c.tx as usize, first.total, "every frame sent came back");
    assert_eq!(c.rx, report.worker.rx);
    assert_eq!(c.tx, report.worker.tx);
    // Flow sync in the real worker loop: the peer's flow was imported, and every flow the
    // worker created went out as a record.
    let y = &report.sync;
    assert_eq!(
        (y.imported, y.unknown_backend, y.unknown_service),
        (1, 0, 0),
        "{y:?}"
    );
    assert!(y.exported > 0, "{y:?}");
    assert_eq!(y.export_full, 0, "{y:?}");
    assert_eq!(report.sync_records, y.exported, "{y:?}");
    assert_eq!(
        report.worker.pass_unsent, 0,
        "the XDP program redirects only our traffic"
    );
    assert_eq!(report.worker.invalid_rx, 0);
    assert_eq!(report.worker.completed, report.worker.tx);
    // Every batch ran in a timed turn (a turn may hold an RX and a handed-in batch).
    let busy = report.worker.busy;
    assert!(busy.ns > 0, "{busy:?}");
    assert!(
        (1..=report.worker.batches).contains(&busy.turns),
        "{busy:?}, {} batches",
        report.worker.batches
    );

    let s = &report.steer;
    assert_eq!(s.frontend + s.icmp_error + s.nat_reply, report.worker.rx);
    assert_eq!(s.icmp_error, 1);
    assert_eq!(s.nat_reply, 1);
    assert_eq!(s.fragment, 0);
    assert!(
        s.passed >= 2,
        "the connects to the gateway were passed: {s:?}"
    );

    let k = &report.kernel;
    assert_eq!(
        k.tx_invalid_descs, 0,
        "every TX descriptor (moved heads included) valid"
    );
    assert_eq!(
        k.rx_dropped + k.rx_ring_full + k.rx_invalid_descs,
        0,
        "{k:?}"
    );

    assert_eq!(
        ALLOCS.load(Ordering::Relaxed),
        0,
        "the worker loop allocated"
    );

    let acc = &report.accounting;
    assert!(
        acc.at_rest(),
        "fill + rx + tx + comp + held == total at rest: {acc:?}"
    );
    assert_eq!(acc.held + acc.fill + acc.rx + acc.tx + acc.comp, acc.total);

    drop(bed);
    assert_namespaces_gone(case);
    eprintln!("xsk[{case}]: end-to-end test took {:?}", started.elapsed());
}

fn assert_namespaces_gone(case: &str) {
    let list = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let pid = std::process::id();
    let ours = [format!("stx{pid}{case}-a"), format!("stx{pid}{case}-g")];
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(
        !list
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .any(|name| ours.iter().any(|o| o == name)),
        "the testbed's namespaces are gone: {list}"
    );
}

/// `frame` with an 802.1Q tag of VLAN `vid` after its MACs.
fn tagged(frame: &[u8], vid: u16) -> Vec<u8> {
    let mut out = frame[..12].to_vec();
    out.extend_from_slice(&[0x81, 0x00]);
    out.extend_from_slice(&vid.to_be_bytes());
    out.extend_from_slice(&frame[12..]);
    out
}

/// UDP from the client to VIP:80 in a frame to `dst`, with source port `sport`.
fn udp_to_vip(dst: [u8; 6], sport: u16) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(MAC_A, dst)
        .ipv4(CLIENT, VIP, 64)
        .udp(sport, 80)
        .write(&mut out, b"port accepts")
        .expect("udp");
    out
}

/// `rx_packets` of `dev` in namespace `ns` (`ip netns exec` mounts the namespace's sysfs).
fn rx_packets(ns: &str, dev: &str) -> u64 {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "cat"])
        .arg(format!("/sys/class/net/{dev}/statistics/rx_packets"))
        .output()
        .expect("ip netns exec cat");
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("rx_packets {text:?}: {e}"))
}

/// The steering counters and veth-g's `rx_packets`, read when no frame arrives between the
/// two reads (the same counts twice around the interface's).
fn settled(cmds: &mpsc::Sender<Cmd>, g: &str) -> (SteerCounters, u64) {
    let counters = || {
        let (tx, rx) = mpsc::channel();
        cmds.send(Cmd::Counters(tx)).expect("gateway alive");
        rx.recv_timeout(Duration::from_secs(5))
            .expect("gateway answers")
            .expect("counters")
    };
    for _ in 0..50 {
        let before = counters();
        let rx = rx_packets(g, "veth-g");
        if counters() == before {
            return (before, rx);
        }
        thread::sleep(Duration::from_millis(100));
    }
    panic!("veth-g never quiet");
}

/// What the port accepts, in the kernel: frames to another MAC and tagged with a VLAN the
/// interface does not serve are passed to the kernel and counted by the steering program;
/// a served VLAN and untagged frames reach the worker. The program's counters add up to
/// the interface's received frames.
fn port_accepts(case: &str, policy: AttachPolicy) {
    const EACH: usize = 5;
    let Some(bed) = Testbed::or_skip("AF_XDP port acceptance", case) else {
        return;
    };
    let (ready_tx, ready_rx) = mpsc::channel();
    let (cmd_tx, cmd_rx) = mpsc::channel();
    let g = bed.g.clone();
    let gw = thread::spawn(move || gateway(g, policy, ready_tx, cmd_rx));
    match ready_rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            let _ = gw.join();
            skip_or_fail(&format!("gateway setup failed (no AF_XDP / XDP?): {e}"));
            return;
        }
        Err(e) => panic!("gateway thread did not report: {e}"),
    }
    let (c0, rx0) = settled(&cmd_tx, &bed.g);

    let a = bed.a.clone();
    let (seen, tagged_back) = thread::spawn(move || {
        enter_netns(&a);
        let mut cap = PacketSocket::open("veth-a", Duration::from_millis(50)).expect("capture");
        let other = [0x02, 0, 0, 0, 0x0a, 0x99];
        for i in 0..EACH as u16 {
            for f in [
                udp_to_vip(other, 41000 + i),
                tagged(&udp_to_vip(MAC_G, 42000 + i), 100),
                tagged(&udp_to_vip(MAC_G, 43000 + i), 200),
                udp_to_vip(MAC_G, 44000 + i),
                udp_to_vip([0xff; 6], 45000 + i),
            ] {
                cap.write_all(&f).expect("inject");
            }
        }
        // What came back from the gateway, by the client source port's thousand.
        let mut seen = BTreeMap::<u16, usize>::new();
        let mut tagged_back = 0;
        let mut buf = [0u8; 2048];
        let mut quiet = Instant::now();
        while quiet.elapsed() < Duration::from_millis(500) {
            let n = match cap.read(&mut buf) {
                Ok(n) => n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    continue
                }
                Err(e) => panic!("capture read: {e}"),
            };
            quiet = Instant::now();
            let f = &buf[..n];
            if f[6..12] != MAC_G {
                continue;
            }
            let Ok(p) = SlicedPacket::from_ethernet(f) else {
                continue;
            };
            if let Some(TransportSlice::Udp(u)) = &p.transport {
                if u.destination_port() == 80 {
                    assert_eq!(f[0..6], MAC_A, "forwarded to the backend");
                    *seen.entry(u.source_port() / 1000 * 1000).or_default() += 1;
                    tagged_back += usize::from(f[12..16] == [0x81, 0x00, 0, 200]);
                }
            }
        }
        (seen, tagged_back)
    })
    .join()
    .expect("client thread");
    let (c1, rx1) = settled(&cmd_tx, &bed.g);
    cmd_tx.send(Cmd::Stop).expect("gateway alive");
    let report = gw.join().expect("gateway thread").expect("gateway");
    eprintln!("xsk[{case}]: forwarded by source port {seen:?}; steering {c0:?} -> {c1:?}; rx_packets {rx0} -> {rx1}; worker {:?}", report.counters);

    assert_eq!(
        seen,
        BTreeMap::from([(43000, EACH), (44000, EACH)]),
        "only the served VLAN and the untagged frames to the gateway's MAC are forwarded"
    );
    // veth-a's receive path moves the tag into the skb's metadata, where a packet socket
    // without PACKET_AUXDATA does not see it; the pipeline tests check that the tag stays.
    eprintln!("xsk[{case}]: {tagged_back} frames captured with their tag inline");
    let d = |f: fn(&SteerCounters) -> u64| f(&c1) - f(&c0);
    assert_eq!(d(|c| c.other_host), EACH as u64, "another host's MAC");
    assert_eq!(d(|c| c.vlan), EACH as u64, "VLAN 100 is not served");
    assert_eq!(d(|c| c.frontend), 2 * EACH as u64, "VLAN 200 and untagged");
    assert!(d(|c| c.passed) >= EACH as u64, "broadcast is the kernel's");
    assert_eq!((d(|c| c.malformed), d(|c| c.no_socket)), (0, 0));
    assert_eq!(
        c1.total() - c0.total(),
        rx1 - rx0,
        "every frame veth-g received is in exactly one steering counter"
    );
    // The worker took exactly what was redirected, and forwarded all of it.
    let w = &report.counters;
    assert_eq!(w.rx, c1.redirected());
    assert_eq!(w.tx, w.rx);
    assert!(w.balanced());
    assert_eq!(
        w.drops_for(DropReason::OtherHost) + w.drops_for(DropReason::VlanNotServed),
        0,
        "the program filtered them before the worker"
    );
    drop(bed);
    assert_namespaces_gone(case);
}

#[test]
fn port_accepts_its_mac_and_vlans_native_xdp() {
    port_accepts("-acc", AttachPolicy::NativeOrGeneric);
}

#[test]
fn port_accepts_its_mac_and_vlans_generic_xdp() {
    port_accepts("-acc-skb", AttachPolicy::GenericOnly);
}

#[test]
fn round_trip_native_xdp() {
    round_trip("", AttachPolicy::NativeOrGeneric, AttachMode::Native);
}

#[test]
fn round_trip_generic_xdp() {
    round_trip("-skb", AttachPolicy::GenericOnly, AttachMode::Generic);
}

/// The XDP program currently on `dev` in namespace `ns`, from `ip -d link`.
fn attached_id(ns: &str, dev: &str) -> Option<u32> {
    let out = Command::new("ip")
        .args(["-n", ns, "-d", "link", "show", "dev", dev])
        .output()
        .expect("ip link");
    let text = String::from_utf8_lossy(&out.stdout);
    let at = text.find("prog/xdp id ")?;
    text[at + 12..]
        .split_whitespace()
        .next()
        .and_then(|id| id.parse().ok())
}

#[test]
fn stale_program_is_replaced_and_only_ours_detached() {
    let Some(bed) = Testbed::or_skip("AF_XDP end-to-end", "-stale") else {
        return;
    };
    let g = bed.g.clone();
    thread::spawn(move || {
        enter_netns(&g);
        let old = SteerProgram::attach("veth-g", AttachPolicy::NativeOrGeneric)
            .expect("first program attaches");
        assert!(old.replaced_programs().is_empty());
        assert_eq!(attached_id(&g, "veth-g"), Some(old.program_id()));
        // A second instance (a restart while the old one's program is still there) takes the
        // interface over.
        let new = SteerProgram::attach("veth-g", AttachPolicy::NativeOrGeneric)
            .expect("second program attaches");
        assert_eq!(new.replaced_programs(), &[old.program_id()]);
        assert_eq!(attached_id(&g, "veth-g"), Some(new.program_id()));
        // Dropping the old one must not remove the new one.
        drop(old);
        assert_eq!(attached_id(&g, "veth-g"), Some(new.program_id()));
        drop(new);
        assert_eq!(attached_id(&g, "veth-g"), None, "detached on drop");
    })
    .join()
    .expect("stale-program checks");
    drop(bed);
    assert_namespaces_gone("-stale");
}

/// A queue is bound again straight after its socket is closed (a restart, a worker reopened):
/// the kernel frees a closed socket's queue tens of milliseconds late and the bind waits for
/// it. A queue held by a live socket is still refused, with `EBUSY`, once the wait is over.
#[test]
fn queue_is_bound_again_straight_after_close() {
    let Some(bed) = Testbed::or_skip("AF_XDP end-to-end", "-rebind") else {
        return;
    };
    let g = bed.g.clone();
    thread::spawn(move || {
        enter_netns(&g);
        let cfg = GroupConfig::single("veth-g", 0);
        // Without the wait nearly every reopen fails: the queue is freed 40-90 ms after close.
        for round in 0..5 {
            let group = QueueGroup::open(&cfg)
                .unwrap_or_else(|e| panic!("bind {round} straight after a close: {e}"));
            drop(group);
        }
        let held = QueueGroup::open(&cfg).expect("bind");
        match QueueGroup::open(&cfg) {
            Err(XskError::Bind { source, .. }) => {
                assert_eq!(source.raw_os_error(), Some(16), "EBUSY: {source}")
            }
            Ok(_) => panic!("a queue held by a live socket was bound twice"),
            Err(e) => panic!("not a bind error: {e}"),
        }
        drop(held);
    })
    .join()
    .expect("rebind checks");
    drop(bed);
    assert_namespaces_gone("-rebind");
}

// ---------------------------------------------------------------------------------------------
// Two-arm nat: the client and the backend on different interfaces of the gateway.
// ---------------------------------------------------------------------------------------------

/// The client's interface (in its own namespace).
const MAC_C: [u8; 6] = [0x02, 0, 0, 0, 0x0c, 0x02];
/// The gateway's client-facing interface, veth-c.
const MAC_GC: [u8; 6] = [0x02, 0, 0, 0, 0x0c, 0x01];
/// The gateway's backend-facing interface, veth-b.
const MAC_GB: [u8; 6] = [0x02, 0, 0, 0, 0x0b, 0x01];
/// The backend's interface.
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0x0b, 0x11];
const BACKEND: [u8; 4] = [198, 51, 100, 11];
const BACKEND_PORT: u16 = 8080;
/// TTL of the injected packets; the gateway routes in nat mode, so they arrive with one less.
const TTL: u8 = 64;

/// The gateway of the two-arm testbed: veth-c faces the clients, veth-b the backends, and the
/// nat service VIP:80 goes to BACKEND:8080. `queues` are served on both interfaces.
fn two_arm_config(queues: &[u32]) -> String {
    GatewayToml::new()
        .set("new_flows_per_second_per_core", 0)
        .interface("veth-c", queues)
        .interface_set("role", r#""client""#)
        .interface("veth-b", queues)
        .interface_set("role", r#""backend""#)
        .service(
            ServiceToml::new("web", "203.0.113.10", 80)
                .protocol("tcp")
                .mode("nat")
                .backend_mac("198.51.100.11", 8080, "02:00:00:00:0b:11"),
        )
        .to_string()
}

fn mac_str(m: [u8; 6]) -> String {
    m.map(|b| format!("{b:02x}")).join(":")
}

/// Three namespaces, `stx{pid}{case}-c` (client), `-g` (gateway), `-b` (backend), and two veth
/// pairs: c's eth0 to g's veth-c, g's veth-b to b's eth0, each end with `queues` RX and TX
/// queues. The client's and the backend's eth0 have no IPv4 address, so neither kernel answers
/// the test's packets (a stray RST would be translated too and spoil the counts); the test's
/// packet sockets speak for them.
struct TwoArm {
    c: String,
    g: String,
    b: String,
    _ns: Vec<Netns>,
}

impl TwoArm {
    fn new(case: &str, queues: u32) -> Result<Self, String> {
        let pid = std::process::id();
        let mut bed = Self {
            c: format!("stx{pid}{case}-c"),
            g: format!("stx{pid}{case}-g"),
            b: format!("stx{pid}{case}-b"),
            _ns: Vec::new(),
        };
        // From here on, the guards remove whatever was made.
        for ns in [bed.c.clone(), bed.g.clone(), bed.b.clone()] {
            bed._ns.push(Netns::try_add(&ns)?);
        }
        let q = queues.to_string();
        for (ns, mac, peer, peer_mac) in [
            (&bed.c, MAC_C, "veth-c", MAC_GC),
            (&bed.b, MAC_B, "veth-b", MAC_GB),
        ] {
            // Made inside the end namespace, the peer moved straight into the gateway's: the
            // root namespace never holds either end.
            ip(&[
                "-n",
                ns,
                "link",
                "add",
                "eth0",
                "numtxqueues",
                &q,
                "numrxqueues",
                &q,
                "address",
                &mac_str(mac),
                "type",
                "veth",
                "peer",
                "name",
                peer,
                "numtxqueues",
                &q,
                "numrxqueues",
                &q,
                "address",
                &mac_str(peer_mac),
                "netns",
                &bed.g,
            ])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        }
        ip(&["-n", &bed.g, "addr", "add", "192.0.2.1/24", "dev", "veth-c"])?;
        ip(&[
            "-n",
            &bed.g,
            "addr",
            "add",
            "198.51.100.1/24",
            "dev",
            "veth-b",
        ])?;
        for dev in ["veth-c", "veth-b", "lo"] {
            ip(&["-n", &bed.g, "link", "set", dev, "up"])?;
        }
        Ok(bed)
    }

    fn names(&self) -> [&str; 3] {
        [&self.c, &self.g, &self.b]
    }
}

/// Asserts that none of `names` is still a namespace.
fn assert_gone(names: &[String]) {
    let list = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(
        !list
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .any(|name| names.iter().any(|o| o == name)),
        "the testbed's namespaces are gone: {list}"
    );
}

/// One worker's numbers at the end of a two-arm run.
#[derive(Debug)]
struct ArmWorker {
    name: String,
    stats: WorkerStats,
    counters: Counters,
    accounting: Accounting,
    kernel: KernelStats,
}

/// What the two-arm gateway reports at the end.
#[derive(Debug)]
struct ArmReport {
    workers: Vec<ArmWorker>,
    /// Steering counters of veth-c's and veth-b's programs.
    steer: [SteerCounters; 2],
}

/// The two-arm gateway: enters `ns`, attaches the steering program to veth-c and veth-b,
/// opens one queue group per queue of `queues` (veth-c and veth-b sockets sharing a UMEM),
/// and runs a worker per group, core `i` of `queues.len()`, joined by a handoff mesh. With
/// `extra_end`, the mesh has one more end (core `queues.len()`), sent to the test so it can
/// hand frames to the workers itself. Reports the group names once running; stops when `stop`
/// fires (or is dropped).
fn two_arm_gateway(
    ns: String,
    queues: Vec<u32>,
    extra_end: Option<mpsc::Sender<Handoff>>,
    ready: mpsc::Sender<Result<Vec<String>, String>>,
    stop: mpsc::Receiver<()>,
) -> Result<ArmReport, String> {
    let setup = || -> Result<_, String> {
        enter_netns(&ns);
        let cfg = strait_config::parse(&two_arm_config(&queues)).map_err(|e| e.to_string())?;
        let links = ["veth-c", "veth-b"]
            .map(|i| interface_port(i).map_err(|e| e.to_string()))
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        if links[0].mac.0 != MAC_GC || links[1].mac.0 != MAC_GB {
            return Err(format!("gateway MACs read as {links:02x?}"));
        }
        let table = Arc::new(
            Builder::new()
                .build(&cfg, &links, |_, _, _| false)
                .map_err(|e| e.to_string())?,
        );
        let mut progs = Vec::new();
        for iface in ["veth-c", "veth-b"] {
            progs.push(
                SteerProgram::attach(iface, AttachPolicy::NativeOrGeneric)
                    .map_err(|e| e.to_string())?,
            );
        }
        let mut groups = Vec::new();
        for &q in &queues {
            let members = vec![PortConfig::new("veth-c", 0), PortConfig::new("veth-b", 1)];
            let g = QueueGroup::open(&GroupConfig::new(q, members)).map_err(|e| e.to_string())?;
            for (prog, port) in progs.iter().zip(g.ports()) {
                prog.register(q, port).map_err(|e| e.to_string())?;
            }
            groups.push(g);
        }
        for prog in &mut progs {
            prog.update_maps(&table).map_err(|e| e.to_string())?;
        }
        Ok((table, progs, groups))
    };
    let (table, progs, groups) = match setup() {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(e.clone()));
            return Err(e);
        }
    };
    let names: Vec<String> = groups.iter().map(QueueGroup::name).collect();
    let cores = groups.len();
    let mut ends = Handoff::mesh(
        cores + usize::from(extra_end.is_some()),
        &HandoffConfig::default(),
    );
    if let Some(tx) = extra_end {
        let _ = tx.send(ends.pop().expect("the extra end"));
    }
    let halt = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for (core, (mut group, mut handoff)) in groups.into_iter().zip(ends).enumerate() {
        let (table, halt) = (table.clone(), halt.clone());
        workers.push(thread::spawn(move || {
            let mut pipe = Pipeline::new(core as u16, cores as u16, 4096, Timeouts::default(), 0);
            COUNTING.with(|c| c.set(true));
            let r = run_worker(
                &mut group,
                &mut pipe,
                &mut handoff,
                || table.clone(),
                &halt,
                MonotonicClock::new(),
                |_, _| {},
            );
            COUNTING.with(|c| c.set(false));
            (r, pipe, group)
        }));
    }
    let _ = ready.send(Ok(names));
    let _ = stop.recv();
    halt.store(true, Ordering::Relaxed);
    let mut out = Vec::new();
    for w in workers {
        let (r, pipe, group) = w.join().map_err(|_| "worker panicked".to_string())?;
        let stats = r.map_err(|e| e.to_string())?;
        // Sends still in the kernel complete within moments; wait for the books to settle.
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut accounting = group.accounting();
        while !accounting.at_rest() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
            accounting = group.accounting();
        }
        out.push(ArmWorker {
            name: group.name(),
            stats,
            counters: pipe.counters,
            accounting,
            kernel: group.kernel_stats().map_err(|e| e.to_string())?,
        });
    }
    let steer = [
        progs[0].counters().map_err(|e| e.to_string())?,
        progs[1].counters().map_err(|e| e.to_string())?,
    ];
    Ok(ArmReport {
        workers: out,
        steer,
    })
}

/// The Internet checksum of `data` folded into `sum` (RFC 1071).
fn ones_complement_sum(mut sum: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

/// Whether an Ethernet frame carrying IPv4/TCP has a valid IPv4 header checksum and a valid
/// TCP checksum (over the pseudo-header), computed here from scratch, independently of the
/// gateway's incremental updates and of etherparse.
fn tcp4_checksums_valid(frame: &[u8]) -> Result<(), String> {
    let ip = frame.get(14..).ok_or("no IPv4 header")?;
    if frame[12..14] != [0x08, 0x00] || ip.len() < 20 || ip[0] >> 4 != 4 {
        return Err("not IPv4".into());
    }
    let ihl = usize::from(ip[0] & 0xf) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if ihl < 20 || total < ihl || total > ip.len() || ip[9] != 6 {
        return Err(format!(
            "bad IPv4 lengths or not TCP: ihl {ihl}, total {total}"
        ));
    }
    if ones_complement_sum(0, &ip[..ihl]) != 0xffff {
        return Err("IPv4 header checksum".into());
    }
    let tcp = &ip[ihl..total];
    let mut pseudo = [0u8; 12];
    pseudo[..8].copy_from_slice(&ip[12..20]);
    pseudo[9] = 6;
    pseudo[10..].copy_from_slice(&(tcp.len() as u16).to_be_bytes());
    if ones_complement_sum(ones_complement_sum(0, &pseudo), tcp) != 0xffff {
        return Err("TCP checksum".into());
    }
    Ok(())
}

/// The fields of a captured IPv4/TCP frame the tests check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Segment {
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: [u8; 4],
    dst: [u8; 4],
    ttl: u8,
    sport: u16,
    dport: u16,
    syn: bool,
    ack: bool,
    seq: u32,
    ack_num: u32,
}

/// Parses an IPv4/TCP frame with etherparse; `None` for anything else.
fn segment(frame: &[u8]) -> Option<Segment> {
    let p = SlicedPacket::from_ethernet(frame).ok()?;
    let (Some(NetSlice::Ipv4(v4)), Some(TransportSlice::Tcp(t))) = (&p.net, &p.transport) else {
        return None;
    };
    let h = v4.header();
    Some(Segment {
        dst_mac: frame[0..6].try_into().ok()?,
        src_mac: frame[6..12].try_into().ok()?,
        src: h.source(),
        dst: h.destination(),
        ttl: h.ttl(),
        sport: t.source_port(),
        dport: t.destination_port(),
        syn: t.syn(),
        ack: t.ack(),
        seq: t.sequence_number(),
        ack_num: t.acknowledgment_number(),
    })
}

/// The client's SYN to VIP:80 from `port`.
fn client_syn(port: u16) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(MAC_C, MAC_GC)
        .ipv4(CLIENT, VIP, TTL)
        .tcp(port, 80, 1000 + u32::from(port), 64240)
        .syn()
        .write(&mut out, &[])
        .expect("syn");
    out
}

/// The backend's SYN-ACK to the client's `port`, answering sequence number `seq`.
fn backend_syn_ack(port: u16, seq: u32) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(MAC_B, MAC_GB)
        .ipv4(BACKEND, CLIENT, TTL)
        .tcp(BACKEND_PORT, port, 7000 + u32::from(port), 65160)
        .syn()
        .ack(seq.wrapping_add(1))
        .write(&mut out, &[])
        .expect("syn-ack");
    out
}

/// Reads frames from `cap` until `want` of them pass `keep` or `within` has passed.
fn capture(
    cap: &mut PacketSocket,
    want: usize,
    within: Duration,
    keep: impl Fn(&Segment) -> bool,
) -> Vec<(Segment, Vec<u8>)> {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    while got.len() < want && Instant::now() < deadline {
        let n = match cap.read(&mut buf) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) => panic!("capture read: {e}"),
        };
        if let Some(s) = segment(&buf[..n]).filter(&keep) {
            got.push((s, buf[..n].to_vec()));
        }
    }
    got
}

/// How the test sends into the gateway.
struct Exchange<'a> {
    bed: &'a TwoArm,
    /// Client ports whose SYNs go over the wire.
    ports: Vec<u16>,
    /// CPUs the client and the backend write from (with the qdisc bypassed), which picks the
    /// queue their frames arrive on; `None` leaves it to the kernel.
    cpus: Option<(usize, usize)>,
    /// A mesh end and (core, client port): one more SYN handed straight to that worker's
    /// inbound ring, as if another worker had received it on veth-c.
    direct: Option<(Handoff, u16, u16)>,
}

/// What crossed the gateway: SYNs as the backend saw them, SYN-ACKs as the client saw them.
struct Crossed {
    at_backend: Vec<(Segment, Vec<u8>)>,
    at_client: Vec<(Segment, Vec<u8>)>,
}

/// Sends a SYN from every client port (and the direct one), answers each SYN that reaches
/// the backend with a SYN-ACK, and collects what arrives on both sides.
fn exchange(x: Exchange<'_>) -> Result<Crossed, String> {
    let want = x.ports.len() + usize::from(x.direct.is_some());
    let (ready_tx, ready_rx) = mpsc::channel();
    let b = x.bed.b.clone();
    let backend_cpu = x.cpus.map(|c| c.1);
    let backend = thread::spawn(move || -> Result<_, String> {
        enter_netns(&b);
        let mut cap =
            PacketSocket::open("eth0", Duration::from_millis(20)).map_err(|e| e.to_string())?;
        if let Some(cpu) = backend_cpu {
            pin_thread(cpu);
            cap.bypass_qdisc().map_err(|e| e.to_string())?;
        }
        let _ = ready_tx.send(());
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(3);
        while seen.len() < want && Instant::now() < deadline {
            for (s, f) in capture(&mut cap, 1, Duration::from_millis(100), |s| {
                s.dst == BACKEND && s.syn && !s.ack
            }) {
                cap.write_all(&backend_syn_ack(s.sport, s.seq))
                    .map_err(|e| format!("inject syn-ack: {e}"))?;
                seen.push((s, f));
            }
        }
        Ok(seen)
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .map_err(|_| "backend did not start".to_string())?;

    let c = x.bed.c.clone();
    let client_cpu = x.cpus.map(|c| c.0);
    let (ports, direct) = (x.ports, x.direct);
    let client = thread::spawn(move || -> Result<_, String> {
        enter_netns(&c);
        let mut cap =
            PacketSocket::open("eth0", Duration::from_millis(20)).map_err(|e| e.to_string())?;
        if let Some(cpu) = client_cpu {
            pin_thread(cpu);
            cap.bypass_qdisc().map_err(|e| e.to_string())?;
        }
        for &p in &ports {
            cap.write_all(&client_syn(p))
                .map_err(|e| format!("inject syn: {e}"))?;
        }
        if let Some((mut end, core, port)) = direct {
            end.send(core, 0, &client_syn(port))
                .map_err(|e| format!("direct handoff: {e:?}"))?;
        }
        Ok(capture(&mut cap, want, Duration::from_secs(3), |s| {
            s.src == VIP && s.syn && s.ack
        }))
    });
    let at_client = client.join().map_err(|_| "client panicked")??;
    let at_backend = backend.join().map_err(|_| "backend panicked")??;
    Ok(Crossed {
        at_backend,
        at_client,
    })
}

/// Checks that every SYN reached the backend translated (destination BACKEND:8080, client
/// source kept, TTL decremented, gateway veth-b MAC to the backend's, checksums valid) and
/// every SYN-ACK reached the client translated back (source VIP:80, veth-c MAC to the
/// client's, checksums valid), for exactly the client ports `ports`.
fn check_crossed(c: &Crossed, ports: &[u16]) {
    let mut want: Vec<u16> = ports.to_vec();
    want.sort_unstable();
    let mut syn_ports: Vec<u16> = c.at_backend.iter().map(|(s, _)| s.sport).collect();
    syn_ports.sort_unstable();
    assert_eq!(syn_ports, want, "every SYN reaches the backend once");
    for (s, f) in &c.at_backend {
        assert_eq!(s.dst_mac, MAC_B, "to the backend's MAC: {s:?}");
        assert_eq!(s.src_mac, MAC_GB, "from veth-b: {s:?}");
        assert_eq!((s.src, s.dst), (CLIENT, BACKEND), "{s:?}");
        assert_eq!(s.dport, BACKEND_PORT, "{s:?}");
        assert_eq!(
            s.seq,
            1000 + u32::from(s.sport),
            "the payload is the client's"
        );
        assert_eq!(s.ttl, TTL - 1, "nat routes: TTL decremented");
        tcp4_checksums_valid(f).unwrap_or_else(|e| panic!("SYN at the backend: {e}: {f:02x?}"));
    }
    let mut ack_ports: Vec<u16> = c.at_client.iter().map(|(s, _)| s.dport).collect();
    ack_ports.sort_unstable();
    assert_eq!(ack_ports, want, "every SYN-ACK reaches the client once");
    for (s, f) in &c.at_client {
        assert_eq!(s.dst_mac, MAC_C, "to the client's MAC: {s:?}");
        assert_eq!(s.src_mac, MAC_GC, "from veth-c: {s:?}");
        assert_eq!((s.src, s.dst), (VIP, CLIENT), "{s:?}");
        assert_eq!(s.sport, 80, "{s:?}");
        assert_eq!(
            s.ack_num,
            1000 + u32::from(s.dport) + 1,
            "answers the client's SYN"
        );
        assert_eq!(s.ttl, TTL - 1, "{s:?}");
        tcp4_checksums_valid(f).unwrap_or_else(|e| panic!("SYN-ACK at the client: {e}: {f:02x?}"));
    }
}

/// Checks the books every run must balance: per core, the pipeline's identity; per UMEM,
/// every frame at rest; no invalid descriptor, no frame sent to a port the group lacks.
fn check_books(r: &ArmReport) {
    for w in &r.workers {
        let (c, s, a) = (&w.counters, &w.stats, &w.accounting);
        assert!(
            c.balanced(),
            "{}: rx == tx + pass + handoff + drops: {c:?}",
            w.name
        );
        assert_eq!(c.dropped(), 0, "{}: {c:?}", w.name);
        assert_eq!(c.rx, s.rx + s.handed_in - s.handoff_no_frame, "{}", w.name);
        assert_eq!(c.tx, s.tx, "{}: every Tx verdict sent", w.name);
        assert_eq!(
            c.handoff, s.handed_out,
            "{}: every handoff delivered",
            w.name
        );
        assert_eq!(s.completed, s.tx, "{}: every send completed", w.name);
        assert_eq!(
            s.other_port + s.tx_ring_full + s.invalid_rx + s.pass_unsent,
            0,
            "{}: {s:?}",
            w.name
        );
        assert_eq!(
            s.handoff_full + s.handoff_too_big + s.handoff_no_ring + s.handoff_no_frame,
            0,
            "{}: {s:?}",
            w.name
        );
        assert_eq!(s.handoff_loop, 0, "{}", w.name);
        assert!(
            a.at_rest(),
            "{}: fill + rx + tx + comp + held == total: {a:?}",
            w.name
        );
        assert_eq!(
            a.held + a.fill + a.rx + a.tx + a.comp,
            a.total,
            "{}",
            w.name
        );
        let k = &w.kernel;
        assert_eq!(
            k.tx_invalid_descs + k.rx_invalid_descs,
            0,
            "{}: {k:?}",
            w.name
        );
        assert_eq!(k.rx_dropped + k.rx_ring_full, 0, "{}: {k:?}", w.name);
    }
    let handed_out: u64 = r.workers.iter().map(|w| w.stats.handed_out).sum();
    let handed_in: u64 = r.workers.iter().map(|w| w.stats.handed_in).sum();
    assert!(handed_in >= handed_out, "every frame handed out arrives");
    assert_eq!(
        ALLOCS.load(Ordering::Relaxed),
        0,
        "the worker loop allocated"
    );
}

/// Starts the two-arm gateway in `bed` serving `queues`; returns its thread, its stop switch,
/// the group names and (with `extra_end`) the test's mesh end. `None` after a loud skip.
#[allow(clippy::type_complexity)]
fn start_two_arm(
    bed: &TwoArm,
    queues: Vec<u32>,
    extra_end: bool,
) -> Option<(
    thread::JoinHandle<Result<ArmReport, String>>,
    mpsc::Sender<()>,
    Vec<String>,
    Option<Handoff>,
)> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel();
    let (end_tx, end_rx) = mpsc::channel();
    let g = bed.g.clone();
    let end_tx = extra_end.then_some(end_tx);
    let gw = thread::spawn(move || two_arm_gateway(g, queues, end_tx, ready_tx, stop_rx));
    match ready_rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Ok(names)) => {
            let end = extra_end.then(|| end_rx.recv().expect("the extra end"));
            Some((gw, stop_tx, names, end))
        }
        Ok(Err(e)) => {
            let _ = gw.join();
            skip_or_fail(&format!(
                "two-arm gateway setup failed (no AF_XDP, XDP or shared UMEM?): {e}"
            ));
            None
        }
        Err(e) => panic!("gateway thread did not report: {e}"),
    }
}

/// A SYN from the client enters veth-c and leaves veth-b translated to the backend; the
/// backend's SYN-ACK enters veth-b and leaves veth-c translated back to the VIP. One worker
/// serves queue 0 of both interfaces, whose sockets share one UMEM, so each frame is sent on
/// the other interface's socket without a copy.
#[test]
fn two_arm_nat_round_trip() {
    if !gate::privileged("AF_XDP end-to-end", &[gate::IP]) {
        return;
    }
    let started = Instant::now();
    let bed = match TwoArm::new("-2arm", 1) {
        Ok(b) => b,
        Err(e) => {
            skip_or_fail(&format!("cannot build the two-arm testbed: {e}"));
            return;
        }
    };
    let names: Vec<String> = bed.names().map(str::to_owned).to_vec();
    let Some((gw, stop, groups, _)) = start_two_arm(&bed, vec![0], false) else {
        return;
    };
    assert_eq!(groups, ["veth-c+veth-b/0"]);
    let ports: Vec<u16> = (41000..41008).collect();
    let crossed = exchange(Exchange {
        bed: &bed,
        ports: ports.clone(),
        cpus: None,
        direct: None,
    })
    .expect("exchange");
    drop(stop);
    let report = gw.join().expect("gateway thread").expect("gateway");
    eprintln!("xsk[two-arm]: gateway {report:#?}");
    check_crossed(&crossed, &ports);
    check_books(&report);

    let n = ports.len() as u64;
    let w = &report.workers[0];
    assert_eq!(w.counters.rx, 2 * n, "SYNs and SYN-ACKs");
    assert_eq!(
        w.counters.tx,
        2 * n,
        "all sent, each on the other interface"
    );
    assert_eq!(w.counters.flows_created, n);
    assert_eq!(w.counters.handoff, 0, "one core owns everything");
    let [c, b] = &report.steer;
    assert_eq!(c.frontend, n, "SYNs redirected on veth-c: {c:?}");
    assert_eq!(b.nat_reply, n, "SYN-ACKs redirected on veth-b: {b:?}");
    drop(bed);
    assert_gone(&names);
    eprintln!("xsk[two-arm]: took {:?}", started.elapsed());
}

/// Two workers (cores 0 and 1 of 2) on two-queue veths. Client frames are written from CPU 0
/// and arrive on queue 0, backend frames from CPU 1 and arrive on queue 1, so a flow owned by
/// core 1 has its SYN handed from worker 0 to worker 1, and a flow owned by core 0 has its
/// SYN-ACK handed from worker 1 to worker 0. One more SYN is pushed by the test straight into
/// worker 1's inbound ring. Every frame still crosses translated, and the books balance per
/// core.
#[test]
fn nat_handoff_between_two_workers() {
    if !gate::privileged("AF_XDP end-to-end", &[gate::IP]) {
        return;
    }
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        skip_or_fail(&format!(
            "the handoff test steers frames to queues by CPU and needs 2 CPUs, this has {cpus}"
        ));
        return;
    }
    let started = Instant::now();
    let bed = match TwoArm::new("-ho", 2) {
        Ok(b) => b,
        Err(e) => {
            skip_or_fail(&format!("cannot build the two-queue testbed: {e}"));
            return;
        }
    };
    let names: Vec<String> = bed.names().map(str::to_owned).to_vec();
    let Some((gw, stop, groups, end)) = start_two_arm(&bed, vec![0, 1], true) else {
        return;
    };
    assert_eq!(groups, ["veth-c+veth-b/0", "veth-c+veth-b/1"]);
    let client = addr_bytes(std::net::IpAddr::from(CLIENT));
    let owner = |p: u16| owner_core(&client, p, 2);
    let mut by_owner = [Vec::new(), Vec::new()];
    for p in 42000u16.. {
        let o = usize::from(owner(p));
        if by_owner[o].len() < 3 {
            by_owner[o].push(p);
        }
        if by_owner.iter().all(|v| v.len() == 3) {
            break;
        }
    }
    let direct_port = (43000u16..)
        .find(|&p| owner(p) == 1)
        .expect("a port owned by core 1");
    let ports: Vec<u16> = by_owner.concat();
    let crossed = exchange(Exchange {
        bed: &bed,
        ports: ports.clone(),
        cpus: Some((0, 1)),
        direct: Some((end.expect("the test's mesh end"), 1, direct_port)),
    })
    .expect("exchange");
    drop(stop);
    let report = gw.join().expect("gateway thread").expect("gateway");
    eprintln!("xsk[handoff]: gateway {report:#?}");
    let mut all = ports.clone();
    all.push(direct_port);
    check_crossed(&crossed, &all);
    check_books(&report);

    let [w0, w1] = &report.workers[..] else {
        panic!("two workers");
    };
    // Worker 0 received the wire SYNs (queue 0) and handed over those of core 1's flows;
    // worker 1 received the SYN-ACKs (queue 1) and handed over those of core 0's flows.
    assert_eq!(
        w0.stats.rx,
        ports.len() as u64,
        "client frames arrive on queue 0"
    );
    assert_eq!(
        w1.stats.rx,
        all.len() as u64,
        "backend frames arrive on queue 1"
    );
    assert_eq!(
        w0.stats.handed_out, 3,
        "SYNs of core 1's flows: {:?}",
        w0.stats
    );
    assert_eq!(
        w1.stats.handed_out, 3,
        "SYN-ACKs of core 0's flows: {:?}",
        w1.stats
    );
    assert_eq!(w0.stats.handed_in, 3);
    assert_eq!(
        w1.stats.handed_in, 4,
        "three from worker 0, one from the test"
    );
    // Each core created the flows it owns, and nothing else.
    assert_eq!(w0.counters.flows_created, 3);
    assert_eq!(w1.counters.flows_created, 4);
    // Per core: rx = tx + handoff; summed, rx - handoff is what came from the NICs.
    let wire: u64 = report.workers.iter().map(|w| w.stats.rx).sum();
    let rx: u64 = report.workers.iter().map(|w| w.counters.rx).sum();
    let handoff: u64 = report.workers.iter().map(|w| w.counters.handoff).sum();
    assert_eq!(
        rx - handoff,
        wire + 1,
        "the wire's frames plus the test's direct one"
    );
    drop(bed);
    assert_gone(&names);
    eprintln!("xsk[handoff]: took {:?}", started.elapsed());
}

// ---------------------------------------------------------------------------------------------
// The steering maps follow table changes: every step checked against the kernel's maps.
// ---------------------------------------------------------------------------------------------

/// The keys of the steering program's lookup maps, as bytes.
#[derive(Debug, Default, PartialEq, Eq)]
struct SteerKeys {
    frontends: BTreeSet<Vec<u8>>,
    nat_backends: BTreeSet<Vec<u8>>,
    vips: BTreeSet<Vec<u8>>,
    locals: BTreeSet<Vec<u8>>,
}

impl SteerKeys {
    fn sets(&self) -> [&BTreeSet<Vec<u8>>; 4] {
        [
            &self.frontends,
            &self.nat_backends,
            &self.vips,
            &self.locals,
        ]
    }

    /// Keys in `self` and not in `other`, over the four maps.
    fn count_missing_from(&self, other: &SteerKeys) -> u32 {
        self.sets()
            .iter()
            .zip(other.sets())
            .map(|(a, b)| a.difference(b).count() as u32)
            .sum()
    }
}

/// A key of the maps for people: `addr port/proto` for endpoint keys, the address for VIPs.
fn key_text(k: &[u8]) -> String {
    let addr = |b: &[u8]| -> String {
        let a: [u8; 16] = b.try_into().unwrap_or([0; 16]);
        let v6 = std::net::Ipv6Addr::from(a);
        v6.to_ipv4_mapped()
            .map_or_else(|| v6.to_string(), |v4| v4.to_string())
    };
    match k.len() {
        20 => format!(
            "{} {}/{}",
            addr(&k[..16]),
            u16::from_be_bytes([k[16], k[17]]),
            k[18]
        ),
        16 => addr(k),
        _ => format!("{k:02x?}"),
    }
}

/// What `got` lacks and has too many of, against `want`, map by map; empty when equal.
fn keys_diff(got: &SteerKeys, want: &SteerKeys) -> String {
    let names = ["frontends", "nat_backends", "vips", "locals"];
    let mut out = String::new();
    for ((name, g), w) in names.iter().zip(got.sets()).zip(want.sets()) {
        let missing: Vec<String> = w.difference(g).map(|k| key_text(k)).collect();
        let extra: Vec<String> = g.difference(w).map(|k| key_text(k)).collect();
        if !missing.is_empty() || !extra.is_empty() {
            out += &format!("{name}: missing {missing:?}, extra {extra:?}; ");
        }
    }
    out
}

/// `struct endpoint_key` of steer.bpf.c, written out here from the C struct.
fn endpoint_key_bytes(addr: &Addr, port: u16, proto: Proto) -> Vec<u8> {
    let mut k = addr.to_vec();
    k.extend_from_slice(&port.to_be_bytes());
    k.extend_from_slice(&[proto.0, 0]);
    k
}

/// What the maps must hold for `t`, counted from scratch: a frontend per service, every VIP,
/// every backend entry of the table whose service is nat (draining and down ones too), and
/// the gateway's own addresses.
fn wanted_keys(t: &ServiceTable) -> SteerKeys {
    let mut k = SteerKeys::default();
    for s in &t.services {
        let f = &s.frontend;
        k.frontends
            .insert(endpoint_key_bytes(&f.vip, f.port, f.proto));
        k.vips.insert(f.vip.to_vec());
    }
    for b in t.backends.iter().flatten() {
        let s = &t.services[b.service as usize];
        if s.mode == Mode::Nat {
            k.nat_backends
                .insert(endpoint_key_bytes(&b.addr, b.port, s.frontend.proto));
        }
    }
    k.locals = t.locals.iter().map(|a| a.to_vec()).collect();
    k
}

/// The lookup maps of a loaded program, opened from the kernel by id (not through the
/// program's own handles): what the kernel holds.
struct KernelMaps {
    frontends: MapHandle,
    nat_backends: MapHandle,
    vips: MapHandle,
    locals: MapHandle,
    /// The outer map of the program's open-addressed copy of the first two.
    fast: MapHandle,
}

impl KernelMaps {
    fn of(prog_id: u32) -> Result<Self, String> {
        let info =
            ProgInfoIter::with_query_opts(ProgInfoQueryOptions::default().include_map_ids(true))
                .find(|p| p.id == prog_id)
                .ok_or_else(|| format!("program {prog_id} not found"))?;
        let mut maps: Vec<MapHandle> = Vec::new();
        for id in info.map_ids {
            maps.push(MapHandle::from_map_id(id).map_err(|e| format!("map {id}: {e}"))?);
        }
        let mut take = |name: &str| {
            let i = maps
                .iter()
                .position(|m| m.name() == name)
                .ok_or_else(|| format!("program {prog_id} has no map {name}"))?;
            Ok::<_, String>(maps.swap_remove(i))
        };
        Ok(Self {
            frontends: take("frontends")?,
            nat_backends: take("nat_backends")?,
            vips: take("vips")?,
            locals: take("locals")?,
            fast: take("fast")?,
        })
    }

    /// The array in `fast`, if any.
    fn fast_array(&self) -> Option<MapHandle> {
        let id = self
            .fast
            .lookup(&0u32.to_ne_bytes(), MapFlags::ANY)
            .ok()??;
        let id = u32::from_ne_bytes(id.try_into().expect("an inner map id"));
        Some(MapHandle::from_map_id(id).expect("the fast array"))
    }

    /// The keys of the array in `fast`, each with its kind byte (1 frontend, 2 nat backend);
    /// `None` when `fast` holds no array.
    fn read_fast(&self) -> Option<BTreeSet<Vec<u8>>> {
        let array = self.fast_array()?;
        Some(
            (0..array.max_entries())
                .filter_map(|i| array.lookup(&i.to_ne_bytes(), MapFlags::ANY).ok()?)
                .filter(|k| k.iter().any(|&b| b != 0))
                .collect(),
        )
    }

    fn read(&self) -> SteerKeys {
        let keys = |m: &MapHandle| m.keys().collect::<BTreeSet<Vec<u8>>>();
        SteerKeys {
            frontends: keys(&self.frontends),
            nat_backends: keys(&self.nat_backends),
            vips: keys(&self.vips),
            locals: keys(&self.locals),
        }
    }
}

/// Runs `f` in a thread inside the gateway namespace of a fresh testbed tagged `case`, with a
/// steering program attached to veth-g. `None` after a loud skip.
fn with_steer_program(case: &str, f: impl FnOnce(&mut SteerProgram, &KernelMaps) + Send) {
    let Some(bed) = Testbed::or_skip("AF_XDP end-to-end", case) else {
        return;
    };
    let g = bed.g.clone();
    thread::scope(|s| {
        s.spawn(|| {
            enter_netns(&g);
            let mut prog = SteerProgram::attach("veth-g", AttachPolicy::NativeOrGeneric)
                .expect("the steering program attaches");
            let maps = KernelMaps::of(prog.program_id()).expect("the program's maps");
            f(&mut prog, &maps);
        })
        .join()
        .expect("map checks");
    });
    drop(bed);
    assert_namespaces_gone(case);
}

/// The gateway part of the map tests' configurations: veth-g, queue 0.
fn map_test_config(services: Vec<model::Service>) -> model::Config {
    let gateway = strait_config::parse(&GatewayToml::new().interface("veth-g", &[0]).to_string())
        .expect("gateway config")
        .gateway;
    model::Config { gateway, services }
}

const MAP_TEST_PORTS: [strait_dataplane::table::Port; 1] = [strait_dataplane::table::Port::new(
    model::MacAddr(MAC_G),
    1500,
)];

/// Services drawn from small pools of VIPs, ports and backends, so that VIPs are shared
/// between services, nat backends too, and frontends move from one name to another.
mod draw {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use proptest::prelude::*;
    use strait_config::model::{self, BackendState, MacAddr, Mode, Protocol};

    /// Service names svc0..svc{NAMES-1}.
    pub const NAMES: usize = 12;

    /// One service: (vip, port, udp, nat, backends as (host, port, draining)).
    pub type Service = (u8, u8, bool, bool, Vec<(u8, u8, bool)>);

    /// One step: services set (`Some`) or removed (`None`) by name, and maybe new locals.
    pub type Step = (Vec<(usize, Option<Service>)>, Option<Vec<u8>>);

    /// VIP `i` of the pool: three IPv4 and one IPv6.
    fn vip(i: u8) -> IpAddr {
        match i % 4 {
            3 => IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0x10, 0, 0, 0, 0, 0x10)),
            n => IpAddr::V4(Ipv4Addr::new(203, 0, 113, 10 + n)),
        }
    }

    /// Backend host `h` of the VIP's family; host 7 is down (see [`down`]).
    fn host(v6: bool, h: u8) -> IpAddr {
        if v6 {
            IpAddr::V6(Ipv6Addr::new(
                0x2001,
                0xdb8,
                0,
                0,
                0,
                0,
                0,
                0x100 + u16::from(h % 8),
            ))
        } else {
            IpAddr::V4(Ipv4Addr::new(198, 51, 100, 10 + h % 8))
        }
    }

    /// Health: host 7 of either family failed its check.
    pub fn down(_: &str, a: IpAddr, _: u16) -> bool {
        a == host(false, 7) || a == host(true, 7)
    }

    pub fn service(name: usize, d: &Service) -> model::Service {
        let (v, port, udp, nat, backends) = d;
        let vip = vip(*v);
        let mut bs: Vec<model::Backend> = Vec::new();
        for &(h, p, draining) in backends {
            let address = host(vip.is_ipv6(), h);
            let port = if *nat { 8000 + u16::from(p % 2) } else { 80 };
            if bs.iter().any(|b| b.address == address && b.port == port) {
                continue;
            }
            bs.push(model::Backend {
                address,
                port,
                weight: 1,
                mac: Some(MacAddr([2, 0, 0, 0, 1, h])),
                tunnel: None,
                state: if draining {
                    BackendState::Draining
                } else {
                    BackendState::Active
                },
            });
        }
        model::Service {
            name: format!("svc{name}"),
            vip,
            port: 80 + u16::from(port % 3),
            protocol: if *udp { Protocol::Udp } else { Protocol::Tcp },
            mode: if *nat { Mode::Nat } else { Mode::DsrL2 },
            maglev_table_size: 13,
            source_ranges: Vec::new(),
            session_affinity: None,
            health_check: None,
            passive_health: None,
            route: Default::default(),
            slow_start: None,
            backends: bs,
        }
    }

    /// The gateway's own addresses: a subset of four.
    pub fn locals(pick: &[u8]) -> Vec<strait_dataplane::key::Addr> {
        let pool = [
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1)),
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
            IpAddr::V4(Ipv4Addr::new(203, 0, 113, 10)),
        ];
        pick.iter()
            .map(|&i| strait_dataplane::key::addr_bytes(pool[usize::from(i % 4)]))
            .collect()
    }

    pub fn one() -> impl Strategy<Value = Service> {
        (
            any::<u8>(),
            any::<u8>(),
            any::<bool>(),
            proptest::bool::weighted(0.7),
            proptest::collection::vec((any::<u8>(), any::<u8>(), any::<bool>()), 0..5),
        )
    }

    pub fn step() -> impl Strategy<Value = Step> {
        (
            proptest::collection::vec((0..NAMES, proptest::option::weighted(0.7, one())), 1..4),
            proptest::option::weighted(0.2, proptest::collection::vec(any::<u8>(), 0..3)),
        )
    }
}

/// Random change sequences: a full build, then [`Builder::update`] steps (services set,
/// changed and removed, so the last service moves into a removed one's index; VIPs and nat
/// backends shared between services; locals changed). After every step the kernel's maps
/// hold exactly what a count from scratch over the table says, [`MapSync`] counts exactly the
/// keys that came and went, the same table again changes nothing, and the program no longer
/// holds the replaced table (so [`Builder::recycle`] can reuse it). Every case starts with a
/// full build on the program the previous case left: all services new, the whole diff.
#[test]
fn steering_maps_follow_random_updates() {
    use proptest::test_runner::{Config, TestCaseError, TestRunner};

    with_steer_program("-mrand", |prog, maps| {
        // The runner wants a `Fn`; the cases run one after the other.
        let prog = std::cell::RefCell::new(prog);
        let seen = std::cell::Cell::new(Exercised::default());
        let mut runner = TestRunner::new(Config {
            cases: 96,
            failure_persistence: None,
            ..Config::default()
        });
        let strategy = (
            proptest::collection::vec(proptest::option::of(draw::one()), draw::NAMES),
            proptest::collection::vec(draw::step(), 1..16),
        );
        let outcome = runner.run(&strategy, |(first, steps)| {
            // Services by name; a service whose frontend another name has is not set.
            let mut state: BTreeMap<usize, model::Service> = BTreeMap::new();
            let fits = |state: &BTreeMap<usize, model::Service>, s: &model::Service| {
                !state.values().any(|o| {
                    o.name != s.name && (o.vip, o.port, o.protocol) == (s.vip, s.port, s.protocol)
                })
            };
            for (n, d) in first.iter().enumerate() {
                if let Some(d) = d {
                    let s = draw::service(n, d);
                    if fits(&state, &s) {
                        state.insert(n, s);
                    }
                }
            }
            let mut builder = Builder::new();
            let mut t = builder
                .build(
                    &map_test_config(state.values().cloned().collect()),
                    &MAP_TEST_PORTS,
                    draw::down,
                )
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            t.locals = draw::locals(&[0, 2]);
            let mut table = Arc::new(t);
            let mut before = maps.read();
            follow(&mut prog.borrow_mut(), maps, &table, &before)?;
            before = maps.read();
            for (i, (changes, locals)) in steps.into_iter().enumerate() {
                let mut set: Vec<model::Service> = Vec::new();
                let mut removed: Vec<String> = Vec::new();
                for (n, d) in changes {
                    match d {
                        Some(d) => {
                            let s = draw::service(n, &d);
                            if fits(&state, &s) {
                                state.insert(n, s.clone());
                                set.push(s);
                            }
                        }
                        None => {
                            state.remove(&n);
                            removed.push(format!("svc{n}"));
                        }
                    }
                }
                let list: Vec<Change<'_>> = set
                    .iter()
                    .map(Change::Set)
                    .chain(removed.iter().map(|n| Change::Remove(n)))
                    .collect();
                let mut next = builder
                    .update(&table, &list, draw::down)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                if let Some(pick) = locals {
                    next.locals = draw::locals(&pick);
                }
                let old = std::mem::replace(&mut table, Arc::new(next));
                seen.set(seen.get().note(&old, &table));
                follow(&mut prog.borrow_mut(), maps, &table, &before)?;
                before = maps.read();
                proptest::prop_assert_eq!(
                    Arc::strong_count(&old),
                    1,
                    "the program let go of the replaced table"
                );
                if i % 2 == 0 {
                    builder.recycle(old);
                }
            }
            Ok(())
        });
        if let Err(e) = outcome {
            panic!("{e}");
        }
        let seen = seen.get();
        eprintln!("steering maps: steps exercised {seen:?}");
        assert!(
            seen.moved > 0 && seen.nat_shared > 0 && seen.vip_shared > 0 && seen.nat_kept > 0,
            "the draws no longer exercise the sharing and moving cases: {seen:?}"
        );
    });
}

/// How many steps of the random test had each case the counting must get right.
#[derive(Clone, Copy, Debug, Default)]
struct Exercised {
    /// A service kept its `Arc` but moved to another index (the last into a removed one's).
    moved: u32,
    /// A nat backend (address, port, protocol) of two or more services.
    nat_shared: u32,
    /// A VIP of two or more services.
    vip_shared: u32,
    /// A nat backend that a changed or removed service had and another service kept.
    nat_kept: u32,
}

impl Exercised {
    fn note(mut self, old: &ServiceTable, new: &ServiceTable) -> Self {
        let at = |t: &ServiceTable, s: &Arc<strait_dataplane::table::Service>| {
            t.services.iter().position(|o| Arc::ptr_eq(o, s))
        };
        let moved = new
            .services
            .iter()
            .enumerate()
            .any(|(i, s)| at(old, s).is_some_and(|j| j != i));
        // nat keys by the services that have them.
        let nat = |t: &ServiceTable| {
            let mut by: BTreeMap<Vec<u8>, Vec<*const strait_dataplane::table::Service>> =
                BTreeMap::new();
            for s in t.services.iter().filter(|s| s.mode == Mode::Nat) {
                for b in s.backends.iter().filter_map(|&id| t.backend(id)) {
                    by.entry(endpoint_key_bytes(&b.addr, b.port, s.frontend.proto))
                        .or_default()
                        .push(Arc::as_ptr(s));
                }
            }
            by
        };
        let (was, is) = (nat(old), nat(new));
        let nat_kept = was.iter().any(|(k, svcs)| {
            is.get(k)
                .is_some_and(|now| svcs.iter().any(|s| !now.contains(s)))
        });
        let mut vips: BTreeMap<Addr, u32> = BTreeMap::new();
        for s in &new.services {
            *vips.entry(s.frontend.vip).or_default() += 1;
        }
        self.moved += u32::from(moved);
        self.nat_shared += u32::from(is.values().any(|v| v.len() > 1));
        self.vip_shared += u32::from(vips.values().any(|&n| n > 1));
        self.nat_kept += u32::from(nat_kept);
        self
    }
}

/// Makes `prog` follow `t` and checks the kernel's maps against a count from scratch;
/// `before` is what they held.
fn follow(
    prog: &mut SteerProgram,
    maps: &KernelMaps,
    t: &Arc<ServiceTable>,
    before: &SteerKeys,
) -> Result<(), proptest::test_runner::TestCaseError> {
    use proptest::prop_assert_eq;
    let sync = prog
        .update_maps(t)
        .map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
    let after = maps.read();
    let want = wanted_keys(t);
    proptest::prop_assert!(
        after == want,
        "kernel maps after generation {}: {}",
        t.generation,
        keys_diff(&after, &want)
    );
    prop_assert_eq!(
        sync,
        MapSync {
            added: after.count_missing_from(before),
            removed: before.count_missing_from(&after),
        },
        "map calls made"
    );
    let again = prog
        .update_maps(t)
        .map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(again, MapSync::default(), "the same table again");
    check_fast(prog, maps, &want)
}

/// The program's open-addressed copy holds the frontends and nat backends of `want` and
/// nothing else, but for the keys that did not fit; and the program steers every key of
/// `want` and nothing next to them ([`steers_every_key`]).
fn check_fast(
    prog: &mut SteerProgram,
    maps: &KernelMaps,
    want: &SteerKeys,
) -> Result<(), proptest::test_runner::TestCaseError> {
    use proptest::{prop_assert, prop_assert_eq};
    let mut wanted = BTreeSet::new();
    for (keys, kind) in [(&want.frontends, 1), (&want.nat_backends, 2)] {
        for k in keys {
            let mut k = k.clone();
            k[19] = kind;
            wanted.insert(k);
        }
    }
    let copy = maps.read_fast();
    prop_assert!(copy.is_some(), "no array in fast");
    let copy = copy.unwrap_or_default();
    let extra: Vec<String> = copy.difference(&wanted).map(|k| key_text(k)).collect();
    prop_assert!(extra.is_empty(), "fast holds keys nobody wants: {extra:?}");
    prop_assert_eq!(
        copy.len() + prog.fast_overflow(),
        wanted.len(),
        "keys in fast, and those that did not fit"
    );
    steers_every_key(prog, want)
}

/// The program, run on a frame to every frontend and from every nat backend of `want`, steers
/// it (to no socket: none is registered), and passes the same frame with the port moved.
fn steers_every_key(
    prog: &mut SteerProgram,
    want: &SteerKeys,
) -> Result<(), proptest::test_runner::TestCaseError> {
    use proptest::{prop_assert, prop_assert_eq};
    let mac = prog.mac().0;
    let client = v4_mapped([198, 51, 100, 77]);
    for (keys, to) in [(&want.frontends, true), (&want.nat_backends, false)] {
        for k in keys {
            let addr = Addr(k[..16].try_into().expect("16 bytes"));
            let port = u16::from_be_bytes([k[16], k[17]]);
            let proto = k[18];
            let frame = |port: u16| {
                if to {
                    l4_frame(mac, &client, 40000, &addr, port, proto)
                } else {
                    l4_frame(mac, &addr, port, &client, 40000, proto)
                }
            };
            // Only a frame the program would redirect counts in `no_socket`; stray frames on
            // the interface (neighbour discovery) count elsewhere.
            let got = prog
                .classify(&frame(port))
                .map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(got.no_socket, 1, "frame for {}: {:?}", key_text(k), got);
            let moved = port ^ 0x8000;
            let mut other = k.clone();
            other[16..18].copy_from_slice(&moved.to_be_bytes());
            if !keys.contains(&other) {
                let got = prog
                    .classify(&frame(moved))
                    .map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
                prop_assert!(
                    got.no_socket == 0 && got.passed >= 1,
                    "frame for {} with port {}: {:?}",
                    key_text(k),
                    moved,
                    got
                );
            }
        }
    }
    Ok(())
}

/// An Ethernet frame to `mac` carrying an IPv4 or IPv6 packet (by the addresses' form) of
/// protocol `proto` from `src`:`sport` to `dst`:`dport`, with 8 bytes of transport header:
/// all the steering program reads.
fn l4_frame(mac: [u8; 6], src: &Addr, sport: u16, dst: &Addr, dport: u16, proto: u8) -> Vec<u8> {
    let mut f = mac.to_vec();
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x99]);
    let l4: Vec<u8> = [sport.to_be_bytes(), dport.to_be_bytes(), [0, 8], [0, 0]].concat();
    match (is_v4(src), is_v4(dst)) {
        (true, true) => {
            f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, proto, 0, 0]);
            f.extend_from_slice(&v4_unmapped(src));
            f.extend_from_slice(&v4_unmapped(dst));
        }
        _ => {
            f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0, 0, 8, proto, 64]);
            f.extend_from_slice(&src.0);
            f.extend_from_slice(&dst.0);
        }
    }
    f.extend_from_slice(&l4);
    f
}

/// A full map. The frontends map is filled to its kernel capacity; then (1) a table that
/// replaces one service by another still fits, because the refused insert is tried again
/// after the deletes made room; (2) one service more is refused with an error naming the
/// map, the maps hold everything else the table wants and nothing else, and asking again
/// with the same table changes nothing; (3) the next table that frees room brings the
/// refused key in by itself, with no full recount.
#[test]
fn steering_maps_recover_from_a_full_map() {
    with_steer_program("-mfull", |prog, maps| {
        let cap = maps.frontends.max_entries() as usize;
        // Frontends on two VIPs of ports 1..=cap/2 fill the map; extras go on a third VIP.
        let half = cap.div_ceil(2);
        let service = |name: String, vip: u8, port: usize| model::Service {
            name,
            vip: std::net::IpAddr::V4(std::net::Ipv4Addr::new(203, 0, 113, vip)),
            port: u16::try_from(port).expect("port"),
            protocol: model::Protocol::Tcp,
            mode: Mode::DsrL2,
            maglev_table_size: 7,
            source_ranges: Vec::new(),
            session_affinity: None,
            health_check: None,
            passive_health: None,
            route: Default::default(),
            slow_start: None,
            backends: Vec::new(),
        };
        let all: Vec<model::Service> = (0..cap)
            .map(|i| service(format!("f{i}"), 20 + (i / half) as u8, 1 + i % half))
            .collect();
        let mut builder = Builder::new();
        let full = Arc::new(
            builder
                .build(&map_test_config(all), &MAP_TEST_PORTS, |_, _, _| false)
                .expect("full table"),
        );
        let none = SteerKeys::default();
        follow(prog, maps, &full, &none).expect("a full map takes all it holds");
        assert_eq!(maps.read().frontends.len(), cap);
        // Without its copy the program asks the hash maps, and steers the same.
        maps.fast
            .delete(&0u32.to_ne_bytes())
            .expect("take the copy out of fast");
        assert!(maps.read_fast().is_none());
        steers_every_key(prog, &wanted_keys(&full)).expect("the hash maps alone steer every key");

        // (1) One out, one in: the insert is refused, the delete makes room, the retry fits.
        let x0 = service("x0".into(), 30, 1);
        let before = maps.read();
        let swapped = Arc::new(
            builder
                .update(
                    &full,
                    &[Change::Remove("f0"), Change::Set(&x0)],
                    |_, _, _| false,
                )
                .expect("swap table"),
        );
        follow(prog, maps, &swapped, &before).expect("a replacement fits a full map");
        assert_eq!(maps.read().frontends.len(), cap);

        // (2) One more: refused, reported, nothing else off.
        let x1 = service("x1".into(), 30, 2);
        let before = maps.read();
        let over = Arc::new(
            builder
                .update(&swapped, &[Change::Set(&x1)], |_, _, _| false)
                .expect("over-capacity table"),
        );
        let refused = endpoint_key_bytes(
            &strait_dataplane::key::addr_bytes(x1.vip),
            x1.port,
            strait_dataplane::key::proto::TCP,
        );
        for attempt in ["first", "again"] {
            let e = prog
                .update_maps(&over)
                .expect_err("one frontend more than the map holds");
            assert!(
                e.to_string().contains("update frontends"),
                "{attempt}: the error names the map: {e}"
            );
            let mut want = wanted_keys(&over);
            assert!(want.frontends.remove(&refused));
            let got = maps.read();
            assert!(got == want, "{attempt}: {}", keys_diff(&got, &want));
            // x1's VIP came with x0: the refused frontend is x1's only new key.
            assert!(got == before, "{attempt}: {}", keys_diff(&got, &before));
        }

        // (3) Two out: the pending insert goes in with them.
        let before = maps.read();
        let freed = Arc::new(
            builder
                .update(
                    &over,
                    &[Change::Remove("f1"), Change::Remove("f2")],
                    |_, _, _| false,
                )
                .expect("freeing table"),
        );
        follow(prog, maps, &freed, &before).expect("the refused key goes in once there is room");
        assert_eq!(maps.read().frontends.len(), cap - 1);

        // The program reads the copy: a key only the copy holds, written into every empty
        // slot (so whatever its home, its probe meets it), is steered. Last, as it leaves the
        // copy unlike the maps.
        let array = maps.fast_array().expect("a copy in fast");
        let only = {
            let mut k = endpoint_key_bytes(&v4_mapped([203, 0, 113, 99]), 9, Proto(17));
            k[19] = 1;
            k
        };
        for i in 0..array.max_entries() {
            let slot = array
                .lookup(&i.to_ne_bytes(), MapFlags::ANY)
                .expect("read a slot")
                .expect("an array slot");
            if slot.iter().all(|&b| b == 0) {
                array
                    .update(&i.to_ne_bytes(), &only, MapFlags::ANY)
                    .expect("write a slot");
            }
        }
        let client = v4_mapped([198, 51, 100, 77]);
        let mac = prog.mac().0;
        let got = prog
            .classify(&l4_frame(
                mac,
                &client,
                40000,
                &v4_mapped([203, 0, 113, 99]),
                9,
                17,
            ))
            .expect("run the program");
        assert_eq!(got.no_socket, 1, "a key only the copy holds: {got:?}");
    });
}

/// A measurement, not a check: [`SteerProgram::update_maps`] at 10,000 nat services of 10
/// backends each (100,000 nat keys), first the full sync, then one service changed at a time
/// (one backend replaced), as the Kubernetes source does per EndpointSlice change. Run it
/// release-built:
/// `cargo test --release -p strait-dataplane --test xsk -- --ignored --nocapture steering_map_update_cost`
#[test]
#[ignore = "a measurement; run it release-built (see its doc comment)"]
fn steering_map_update_cost_at_scale() {
    const SERVICES: usize = 10_000;
    const BACKENDS: usize = 10;
    const ROUNDS: usize = 200;
    with_steer_program("-mcost", |prog, maps| {
        // Service i: VIP 203.0.113.(1 + i/100), port 1 + i%100; its backends on
        // 198.51.100.(1 + i%250), ports unique per service; in round r, backend 0 moves to
        // port 30000 + r.
        let service = |i: usize, round: Option<usize>| model::Service {
            name: format!("s{i}"),
            vip: std::net::IpAddr::V4(std::net::Ipv4Addr::new(203, 0, 113, 1 + (i / 100) as u8)),
            port: 1 + (i % 100) as u16,
            protocol: model::Protocol::Tcp,
            mode: Mode::Nat,
            maglev_table_size: 251,
            source_ranges: Vec::new(),
            session_affinity: None,
            health_check: None,
            passive_health: None,
            route: Default::default(),
            slow_start: None,
            backends: (0..BACKENDS)
                .map(|k| model::Backend {
                    address: std::net::IpAddr::V4(std::net::Ipv4Addr::new(
                        198,
                        51,
                        100,
                        1 + (i % 250) as u8,
                    )),
                    port: match (k, round) {
                        (0, Some(r)) => 30_000 + r as u16,
                        _ => 10_000 + ((i / 250) * BACKENDS + k) as u16,
                    },
                    weight: 100,
                    mac: Some(model::MacAddr([2, 0, 0, 0, 1, 1])),
                    tunnel: None,
                    state: model::BackendState::Active,
                })
                .collect(),
        };
        let mut builder = Builder::new();
        let mut table = Arc::new(
            builder
                .build(
                    &map_test_config((0..SERVICES).map(|i| service(i, None)).collect()),
                    &MAP_TEST_PORTS,
                    |_, _, _| false,
                )
                .expect("table"),
        );
        let started = Instant::now();
        let sync = prog.update_maps(&table).expect("full sync");
        let full = started.elapsed();
        let mut build = Vec::with_capacity(ROUNDS);
        let mut sync_times = Vec::with_capacity(ROUNDS);
        for r in 0..ROUNDS {
            let changed = service((r * 7919) % SERVICES, Some(r));
            let started = Instant::now();
            let next = builder
                .update(&table, &[Change::Set(&changed)], |_, _, _| false)
                .expect("update");
            build.push(started.elapsed());
            let old = std::mem::replace(&mut table, Arc::new(next));
            let started = Instant::now();
            let s = prog.update_maps(&table).expect("one change");
            sync_times.push(started.elapsed());
            assert!(
                s.added <= 1 && s.removed <= 1,
                "one backend replaced: {s:?}"
            );
            builder.recycle(old);
        }
        // A full build of the same services (a reload, a health change): every `Arc` new,
        // no key changes.
        let all: Vec<model::Service> = (0..SERVICES)
            .map(|i| {
                let r = (0..ROUNDS).rev().find(|r| (r * 7919) % SERVICES == i);
                service(i, r)
            })
            .collect();
        let rebuilt = Arc::new(
            builder
                .build(&map_test_config(all), &MAP_TEST_PORTS, |_, _, _| false)
                .expect("rebuilt table"),
        );
        let old = std::mem::replace(&mut table, rebuilt);
        let started = Instant::now();
        let s = prog.update_maps(&table).expect("rebuilt");
        let rebuild = started.elapsed();
        assert_eq!(s, MapSync::default(), "the same services rebuilt");
        drop(old);
        let got = maps.read();
        let want = wanted_keys(&table);
        assert!(got == want, "{}", keys_diff(&got, &want));
        let stats = |v: &mut Vec<Duration>| {
            v.sort();
            format!(
                "min {:?}, median {:?}, p90 {:?}, max {:?}",
                v[0],
                v[v.len() / 2],
                v[v.len() * 9 / 10],
                v[v.len() - 1]
            )
        };
        let _ = std::io::stderr().write_all(
            format!(
                "\nsteering maps at {SERVICES} nat services x {BACKENDS} backends \
                 ({} keys):\n  full sync: {full:?}\n  update_maps, one service changed \
                 ({ROUNDS} rounds): {}\n  (Builder::update of that change: {})\n  \
                 full rebuild of the same services (Builder::build, all Arcs new): \
                 {rebuild:?}\n",
                sync.added,
                stats(&mut sync_times),
                stats(&mut build)
            )
            .as_bytes(),
        );
    });
}
