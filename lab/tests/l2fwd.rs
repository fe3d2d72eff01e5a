//! Privileged test of the `limit` forwarder ([`L2fwd`]) on a throwaway veth path:
//!
//! ```text
//!   netns sl2{pid}-a          netns sl2{pid}-f (forwarder)               netns sl2{pid}-b
//!   a0 <──veth──> f0 (strait_redirect, AF_XDP)   f1 (AF_XDP TX) <──veth──> b0
//! ```
//!
//! Frames written on a0 with an AF_PACKET socket: UDP and TCP are forwarded to b0 with only
//! the Ethernet addresses changed (byte for byte otherwise), ICMP is left to f's kernel. The
//! forwarding loop makes no allocation (a counting allocator watches the forwarding thread),
//! and every UMEM frame is accounted for at rest afterwards.
//!
//! Needs root, `ip` (iproute2) and a kernel with AF_XDP. Without them it FAILS, unless
//! `STRAIT_SKIP_PRIVILEGED=1` is set, in which case it prints a loud SKIPPED banner and
//! passes. The namespaces are deleted on drop, also when the test fails.

use std::io::{ErrorKind, Read, Write};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use etherparse::PacketBuilder;
use packet_socket::PacketSocket;
use strait_dataplane::xsk::Accounting;
use strait_lab::l2fwd::{L2fwd, L2fwdConfig, L2fwdStats};
use strait_testkit::harness::{enter_netns, ip, Netns};
use strait_testkit::privileged as gate;

use strait_testkit::alloc::{ALLOCS, COUNTING};
use strait_testkit::packet_socket;

#[global_allocator]
static ALLOCATOR: strait_testkit::alloc::Counting = strait_testkit::alloc::Counting;

const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0x0a, 0x01];
const MAC_F0: [u8; 6] = [0x02, 0, 0, 0, 0x0a, 0xfe];
const MAC_F1: [u8; 6] = [0x02, 0, 0, 0, 0x0b, 0xfe];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0x0b, 0x01];
/// What the forwarder writes as destination: not b0's own MAC, so the test sees that the
/// given MAC, not a looked-up one, is used (a veth delivers every frame to its peer).
const DST: [u8; 6] = [0x02, 0, 0, 0, 0x0b, 0x77];

fn mac(m: [u8; 6]) -> String {
    m.map(|b| format!("{b:02x}")).join(":")
}

/// The three namespaces; deleting them on drop removes the veths too.
struct Path {
    names: Vec<String>,
    _ns: Vec<Netns>,
}

impl Path {
    fn new() -> Result<Self, String> {
        let p = format!("sl2{}", std::process::id() % 100_000);
        let mut path = Self {
            names: Vec::new(),
            _ns: Vec::new(),
        };
        for role in ["a", "f", "b"] {
            let ns = format!("{p}-{role}");
            path._ns.push(Netns::try_add(&ns)?);
            path.names.push(ns.clone());
            // No IPv6: the kernels send nothing of their own (DAD, MLD) during the count.
            let out = Command::new("ip")
                .args(["netns", "exec", &ns, "sysctl", "-qw"])
                .args([
                    "net.ipv6.conf.all.disable_ipv6=1",
                    "net.ipv6.conf.default.disable_ipv6=1",
                ])
                .output()
                .map_err(|e| format!("sysctl: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "sysctl in {ns}: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        let [a, f, b] = [&path.names[0], &path.names[1], &path.names[2]];
        for (x, ix, mx, y, iy, my) in [
            (a, "a0", MAC_A, f, "f0", MAC_F0),
            (f, "f1", MAC_F1, b, "b0", MAC_B),
        ] {
            ip(&[
                "link",
                "add",
                ix,
                "netns",
                x,
                "address",
                &mac(mx),
                "type",
                "veth",
                "peer",
                "name",
                iy,
                "netns",
                y,
                "address",
                &mac(my),
            ])?;
            ip(&["-n", x, "link", "set", ix, "up"])?;
            ip(&["-n", y, "link", "set", iy, "up"])?;
        }
        ip(&["-n", f, "addr", "add", "192.0.2.254/24", "dev", "f0"])?;
        Ok(path)
    }
}

/// Fails with `why`, or with STRAIT_SKIP_PRIVILEGED=1 prints SKIPPED and returns.
fn skip_or_fail(why: &str) {
    if std::env::var("STRAIT_SKIP_PRIVILEGED").as_deref() == Ok("1") {
        let _ = std::io::stderr().write_all(
            format!("\n*** SKIPPED l2fwd test: {why} (STRAIT_SKIP_PRIVILEGED=1) ***\n").as_bytes(),
        );
        return;
    }
    panic!(
        "the l2fwd test needs root, iproute2 and a kernel with AF_XDP: {why}. Run it as root, \
         or set STRAIT_SKIP_PRIVILEGED=1 to skip it explicitly."
    );
}

/// UDP (`i` even) or TCP frames from a to "beyond f", each with its own source port.
fn frame(i: u16) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(MAC_A, MAC_F0).ipv4([192, 0, 2, 1], [198, 51, 100, 2], 64);
    let mut out = Vec::new();
    if i.is_multiple_of(2) {
        b.udp(10_000 + i, 9)
            .write(&mut out, b"l2fwd-udp")
            .expect("udp frame");
    } else {
        b.tcp(10_000 + i, 80, u32::from(i), 1024)
            .write(&mut out, b"l2fwd-tcp")
            .expect("tcp frame");
    }
    out
}

/// ICMP echo request to f0's address: the kernel's.
fn ping_frame() -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(MAC_A, MAC_F0)
        .ipv4([192, 0, 2, 1], [192, 0, 2, 254], 64)
        .icmpv4_echo_request(7, 1)
        .write(&mut out, b"ping")
        .expect("icmp frame");
    out
}

/// What the forwarding thread reports.
struct Report {
    stats: L2fwdStats,
    accounting: Accounting,
    allocs: usize,
}

#[test]
fn forwards_udp_and_tcp_with_new_macs_without_allocating() {
    if !gate::privileged("limit forwarder", &[gate::IP]) {
        return;
    }
    let path = match Path::new() {
        Ok(p) => p,
        Err(e) => return skip_or_fail(&e),
    };
    let [a, f, b] = [
        path.names[0].clone(),
        path.names[1].clone(),
        path.names[2].clone(),
    ];

    let stop = Arc::new(AtomicBool::new(false));
    let live_rx = Arc::new(AtomicU64::new(0));
    let (ready_tx, ready_rx) = mpsc::channel::<Result<[u8; 6], String>>();
    let fwd = {
        let (stop, live_rx) = (Arc::clone(&stop), Arc::clone(&live_rx));
        thread::spawn(move || -> Result<Report, String> {
            enter_netns(&f);
            let mut l2 = match L2fwd::open(&L2fwdConfig::new("f0", "f1", 0, DST)) {
                Ok(l2) => l2,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return Err(e.to_string());
                }
            };
            let _ = ready_tx.send(Ok(l2.src_mac()));
            let before = ALLOCS.load(Ordering::Relaxed);
            COUNTING.set(true);
            let run = l2.run(&stop, |st| live_rx.store(st.rx, Ordering::Relaxed));
            COUNTING.set(false);
            let allocs = ALLOCS.load(Ordering::Relaxed) - before;
            let stats = run.map_err(|e| e.to_string())?;
            Ok(Report {
                stats,
                accounting: l2.group().accounting(),
                allocs,
            })
        })
    };
    let src = ready_rx
        .recv()
        .expect("forwarder thread answers")
        .expect("forwarder opens");
    assert_eq!(src, MAC_F1, "source MAC is the TX interface's");

    const N: u16 = 500;
    let (listening_tx, listening) = mpsc::channel();
    let capture = thread::spawn(move || -> Result<Vec<Vec<u8>>, String> {
        enter_netns(&b);
        let mut cap =
            PacketSocket::open("b0", Duration::from_millis(100)).map_err(|e| e.to_string())?;
        let _ = listening_tx.send(());
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = [0u8; 2048];
        while got.len() < N as usize && Instant::now() < deadline {
            match cap.read(&mut buf) {
                Ok(n) => got.push(buf[..n].to_vec()),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        // Anything more (the ICMP must not come) arrives within this grace period.
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            if let Ok(n) = cap.read(&mut buf) {
                got.push(buf[..n].to_vec());
            }
        }
        Ok(got)
    });
    // Nothing is sent before the capture socket is open (or the capture failed, which its
    // join reports).
    let _ = listening.recv();
    let sender = thread::spawn(move || -> Result<(), String> {
        enter_netns(&a);
        let mut s =
            PacketSocket::open("a0", Duration::from_millis(100)).map_err(|e| e.to_string())?;
        s.write_all(&ping_frame()).map_err(|e| e.to_string())?;
        for i in 0..N {
            s.write_all(&frame(i)).map_err(|e| e.to_string())?;
            // Stay under the veth's backlog: a burst of 500 at once could overflow it.
            if i % 64 == 63 {
                thread::sleep(Duration::from_millis(2));
            }
        }
        Ok(())
    });
    sender.join().expect("sender thread").expect("frames sent");
    let got = capture.join().expect("capture thread").expect("capture");
    let deadline = Instant::now() + Duration::from_secs(5);
    while live_rx.load(Ordering::Relaxed) < u64::from(N) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let r = fwd
        .join()
        .expect("forwarder thread")
        .expect("forwarder runs");

    assert_eq!(
        got.len(),
        N as usize,
        "every UDP/TCP frame and nothing else arrived"
    );
    for (i, g) in got.iter().enumerate() {
        let want = frame(i as u16);
        assert_eq!(&g[..6], &DST, "frame {i}: destination MAC rewritten");
        assert_eq!(&g[6..12], &MAC_F1, "frame {i}: source MAC is f1's");
        assert_eq!(
            &g[12..],
            &want[12..],
            "frame {i}: nothing past the MACs touched"
        );
    }
    assert_eq!(r.stats.rx, u64::from(N), "{:?}", r.stats);
    assert_eq!(r.stats.forwarded, u64::from(N), "{:?}", r.stats);
    assert_eq!(
        r.stats.tx_ring_full + r.stats.runts + r.stats.invalid_rx,
        0,
        "{:?}",
        r.stats
    );
    assert_eq!(r.allocs, 0, "the forwarding loop allocated");
    assert!(r.accounting.at_rest(), "{:?}", r.accounting);
    // Every batch was in a timed turn, and a turn takes time.
    let busy = r.stats.busy;
    assert!(
        busy.turns >= 1 && busy.turns <= r.stats.batches,
        "{:?}",
        r.stats
    );
    assert!(busy.ns > 0, "{:?}", r.stats);
}
