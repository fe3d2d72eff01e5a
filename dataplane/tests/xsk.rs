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
//! (UDP, TCP SYN, IPv6 UDP, an ICMP error about a VIP flow) rewrites the MACs only; dsr-ipip
//! encapsulates in front of the received packet, in the UMEM headroom. A nat reply without a
//! flow is redirected and dropped. TCP to the gateway's own address stays with its kernel (a
//! connect to port 9 or 22 is refused). The worker's counters balance, its loop makes no
//! allocation, the UMEM frames are all accounted for at rest, and the steering maps follow a
//! table change. Run with native and with generic XDP; a third test checks that a stale
//! program is replaced and that only our own program is detached on drop.
//!
//! Needs root, `ip` (iproute2) and a kernel with AF_XDP. Without them the tests FAIL, unless
//! `STRAIT_SKIP_PRIVILEGED=1` is set, in which case they print a loud SKIPPED banner and pass.
//! The namespaces are deleted on drop, also when a test fails.

#![cfg(feature = "xsk")]

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::AtomicUsize;

use etherparse::{Icmpv4Type, IpNumber, NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use strait_dataplane::flow::Timeouts;
use strait_dataplane::pipeline::Pipeline;
use strait_dataplane::stats::{Counters, DropReason};
use strait_dataplane::table::{Builder, ServiceTable};
use strait_dataplane::xsk::testbed::{enter_netns, PacketSocket};
use strait_dataplane::xsk::{
    interface_port, run_worker, Accounting, AttachMode, AttachPolicy, BindMode, KernelStats,
    MapSync, MonotonicClock, Port, PortConfig, SteerCounters, SteerProgram, WorkerStats,
};

/// Allocations, reallocations and frees made by worker threads while they run the loop.
static WORKER_ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread's allocations are counted. Const-initialised and without a
    /// destructor, so reading it from inside the allocator never allocates.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        WORKER_ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

/// `System`, counting the worker threads' allocations: the loop must make none.
struct Counting;

// SAFETY: every method forwards its arguments unchanged to `System`, which implements
// `GlobalAlloc` correctly; the bookkeeping around it neither allocates nor panics.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract (non-zero size), which is
        // `System::alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: the caller guarantees `ptr` came from this allocator (hence from `System`)
        // with `layout`, and that `new_size` is valid for it.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note();
        // SAFETY: the caller guarantees `ptr` came from this allocator (hence from `System`)
        // with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

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

const CONFIG: &str = r#"
[gateway]
new_flows_per_second_per_core = 0

[[gateway.interfaces]]
name = "veth-g"
queues = [0]

[[services]]
name = "web-tcp"
vip = "203.0.113.10"
port = 80
protocol = "tcp"
mode = "dsr-l2"

[[services.backends]]
address = "192.0.2.2"
mac = "02:00:00:00:0a:02"

[[services]]
name = "web-udp"
vip = "203.0.113.10"
port = 80
protocol = "udp"
mode = "dsr-l2"

[[services.backends]]
address = "192.0.2.2"
mac = "02:00:00:00:0a:02"

[[services]]
name = "tunnelled"
vip = "203.0.113.11"
port = 80
protocol = "udp"
mode = "dsr-ipip"

[[services.backends]]
address = "192.0.2.2"
mac = "02:00:00:00:0a:02"

[[services]]
name = "dns"
vip = "203.0.113.12"
port = 53
protocol = "udp"
mode = "nat"

[[services.backends]]
address = "192.0.2.2"
port = 5353
mac = "02:00:00:00:0a:02"

[[services]]
name = "web6"
vip = "2001:db8:10::10"
port = 80
protocol = "udp"
mode = "dsr-l2"

[[services.backends]]
address = "2001:db8::2"
mac = "02:00:00:00:0a:02"
"#;

/// Keys of the steering maps for [`CONFIG`]: frontends (TCP and UDP on VIP:80, VIP_IPIP:80,
/// 203.0.113.12:53, VIP6:80), VIPs, and nat backends (192.0.2.2:5353/udp).
const FRONTENDS: u32 = 5;
const VIPS: u32 = 4;
const NAT_BACKENDS: u32 = 1;

/// Runs `ip` with `args`; the error carries the command and its stderr.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip {}`: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// The two namespaces and the veth pair between them; deleting the namespaces on drop
/// removes everything, also when the test fails.
struct Testbed {
    a: String,
    g: String,
}

impl Testbed {
    /// Namespaces `stx{pid}{case}-a` and `stx{pid}{case}-g`; `case` keeps the tests of one
    /// process apart.
    fn new(case: &str) -> Result<Self, String> {
        let pid = std::process::id();
        let bed = Self {
            a: format!("stx{pid}{case}-a"),
            g: format!("stx{pid}{case}-g"),
        };
        let (a, g) = (bed.a.as_str(), bed.g.as_str());
        ip(&["netns", "add", a])?;
        ip(&["netns", "add", g])?;
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

impl Drop for Testbed {
    fn drop(&mut self) {
        for ns in [&self.g, &self.a] {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("testbed cleanup: {e}");
            }
        }
    }
}

/// Whether this process can run the test: root and `ip` present.
fn missing_privileges() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("?");
    if euid != "0" {
        return Some(format!("not root (euid {euid})"));
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("`ip` (iproute2) not found".into());
    }
    None
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
    Follow(Box<ServiceTable>, mpsc::Sender<Result<MapSync, String>>),
    /// Stop the worker and report.
    Stop,
}

/// What the gateway thread reports at the end.
#[derive(Debug)]
struct Report {
    worker: WorkerStats,
    counters: Counters,
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
        enter_netns(&ns).map_err(|e| e.to_string())?;
        let cfg = strait_config::parse(CONFIG).map_err(|e| e.to_string())?;
        let link = interface_port("veth-g").map_err(|e| e.to_string())?;
        if link.mac != MAC_G {
            return Err(format!("veth-g MAC read as {:02x?}", link.mac));
        }
        let table = Builder::new()
            .build(&cfg, &[link], |_, _, _| false)
            .map_err(|e| e.to_string())?;
        let mut prog = SteerProgram::attach("veth-g", policy).map_err(|e| e.to_string())?;
        let port = Port::open(&PortConfig::new("veth-g", 0)).map_err(|e| e.to_string())?;
        let sync = prog.update_maps(&table).map_err(|e| e.to_string())?;
        prog.register(0, &port).map_err(|e| e.to_string())?;
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

    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut pipe = Pipeline::new(0, 1, 4096, Timeouts::default(), 0);
            let table = Arc::new(table);
            let clock = MonotonicClock::new();
            COUNTING.with(|c| c.set(true));
            let r = run_worker(
                &mut port,
                &mut pipe,
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
    Ok(Report {
        worker,
        counters: pipe.counters,
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
    /// Every frame that came back from veth-g's MAC.
    total: usize,
    /// Frames to a VIP that left veth-a (the client's own packets).
    sent_to_vip: usize,
}

/// Reads frames from `cap` until it is quiet for 300 ms, and classifies them, checking what
/// each rewrite must have done.
fn drain(cap: &mut PacketSocket) -> Returned {
    let vip6: std::net::Ipv6Addr = VIP6.parse().expect("address");
    let mut r = Returned::default();
    let mut buf = [0u8; 2048];
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_millis(300) {
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
    enter_netns(&ns).map_err(|e| e.to_string())?;
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
    enter_netns(&ns).map_err(|e| e.to_string())?;
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
    if let Some(why) = missing_privileges() {
        skip_or_fail(&why);
        return;
    }
    let started = Instant::now();
    let bed = match Testbed::new(case) {
        Ok(b) => b,
        Err(e) => {
            skip_or_fail(&format!("cannot build the veth testbed: {e}"));
            return;
        }
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
    let empty = ServiceTable::empty(vec![strait_dataplane::table::Port {
        mac: MAC_G,
        mtu: 1500,
    }]);
    cmd_tx
        .send(Cmd::Follow(Box::new(empty), answer_tx))
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
    // A packet socket does not capture its own writes: the injected ICMP error is not in
    // `sent_to_vip`.
    assert_eq!(
        first.sent_to_vip + 1,
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
    assert_eq!(
        report.worker.pass_unsent, 0,
        "the XDP program redirects only our traffic"
    );
    assert_eq!(report.worker.invalid_rx, 0);
    assert_eq!(report.worker.completed, report.worker.tx);

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
        WORKER_ALLOCS.load(Ordering::Relaxed),
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
    if let Some(why) = missing_privileges() {
        skip_or_fail(&why);
        return;
    }
    let bed = match Testbed::new("-stale") {
        Ok(b) => b,
        Err(e) => {
            skip_or_fail(&format!("cannot build the veth testbed: {e}"));
            return;
        }
    };
    let g = bed.g.clone();
    thread::spawn(move || {
        enter_netns(&g).expect("enter gateway namespace");
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
