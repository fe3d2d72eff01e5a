//! `strait sink` and `strait l2fwd` on the real kernel: namespaces joined by veths, frames sent
//! by scapy from a peer namespace, captures by tshark.
//!
//! - the sink counts exactly the frames sent to it, stops on SIGTERM with its JSON summary and
//!   takes its XDP program off the interface, and replaces the program a killed sink left;
//! - probes (UDP from the reflect port, payload `STRAITPR...`) come back with addresses and
//!   ports swapped and valid checksums (the sender's kernel delivers them to a UDP socket, and
//!   tshark verifies both checksums); frames that only look like probes are dropped;
//! - l2fwd forwards every frame from one namespace to another with the destination MAC it was
//!   given and the TX interface's MAC as source, while ARP and ping to its RX interface are
//!   still answered by the kernel.
//!
//! They need root, iproute2, tshark, ethtool, ping and Debian's python3 with scapy. Without
//! them they fail naming what is missing, unless `STRAIT_SKIP_PRIVILEGED=1`. Each test uses
//! its own namespaces (`sk{pid}{tag}-...`), removed on drop also when it fails. They run one
//! at a time: l2fwd busy-polls a core.

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{ChildStderr, Command, Stdio};
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::harness::{
    in_ns, must, serial_if, text, tshark_fields, veth, End, Netns, Proc, Scratch, LAB, PYTHON,
};
use support::privileged as gate;

/// The serial lock, if test `test` may run: root, the tools, and scapy for the Python that
/// sends the frames.
fn privileged(test: &str) -> Option<MutexGuard<'static, ()>> {
    serial_if(|| {
        gate::privileged(
            test,
            &[
                gate::IP,
                gate::TSHARK,
                gate::ETHTOOL,
                gate::PING,
                gate::PYTHON,
            ],
        ) && gate::python_module(test, "scapy.all", "python3-scapy")
    })
}

/// The namespaces of one test (`sk{pid}{tag}-{role}`) and a scratch directory for its
/// captures; all removed on drop (the veths go with the namespaces).
struct Namespaces {
    prefix: String,
    made: Vec<Netns>,
    scratch: Scratch,
}

impl Namespaces {
    fn new(tag: &str) -> Self {
        let prefix = format!("sk{}{tag}", std::process::id() % 100_000);
        Self {
            scratch: Scratch::new(&format!("strait-sink-{prefix}")),
            prefix,
            made: Vec::new(),
        }
    }

    /// Makes the quiet namespace `{prefix}-{role}` (see [`Netns::quiet`]).
    fn add(&mut self, role: &str) -> String {
        let ns = Netns::quiet(&format!("{}-{role}", self.prefix));
        let name = ns.name().to_owned();
        self.made.push(ns);
        name
    }

    /// A capture file in the scratch directory.
    fn pcap(&self, tag: &str) -> String {
        let p = self.scratch.join(&format!("{tag}.pcap"));
        p.to_str().expect("utf-8 temp path").to_owned()
    }
}

/// Namespaces `a` and `b` joined by a veth, `{prefix}-x` (MAC [`GEN_MAC`], 192.0.2.1) to
/// `{prefix}-y` ([`SINK_MAC`], 192.0.2.2).
struct Link {
    nss: Namespaces,
    a: String,
    b: String,
    ia: String,
    ib: String,
}

fn link(tag: &str) -> Link {
    let mut nss = Namespaces::new(tag);
    let (a, b) = (nss.add("a"), nss.add("b"));
    let (ia, ib) = (format!("{}-x", nss.prefix), format!("{}-y", nss.prefix));
    veth(
        End {
            ns: &a,
            name: &ia,
            mac: GEN_MAC,
            addr: "192.0.2.1/24",
        },
        End {
            ns: &b,
            name: &ib,
            mac: SINK_MAC,
            addr: "192.0.2.2/24",
        },
    );
    Link { nss, a, b, ia, ib }
}

/// A background process with its stderr read line by line, killed (by pid) on drop unless
/// it was waited for.
struct Bg {
    proc: Option<Proc>,
    stderr: Option<BufReader<ChildStderr>>,
    what: String,
}

impl Bg {
    /// Starts `args` in namespace `ns` with stdout and stderr piped.
    fn start(ns: &str, args: &[&str]) -> Self {
        let mut proc = Proc::spawn(
            in_ns(ns, args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        );
        let stderr = proc.child().stderr.take().map(BufReader::new);
        Self {
            proc: Some(proc),
            stderr,
            what: args.join(" "),
        }
    }

    /// Reads stderr lines until one contains `needle` (panics after `timeout` or at EOF);
    /// returns the lines read.
    fn wait_for(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        let mut seen = String::new();
        let r = self.stderr.as_mut().expect("stderr piped");
        loop {
            assert!(
                Instant::now() < deadline,
                "{}: no {needle:?} on stderr within {timeout:?}; got:\n{seen}",
                self.what
            );
            let mut line = String::new();
            let n = r.read_line(&mut line).expect("read stderr");
            assert!(
                n > 0,
                "{}: exited before {needle:?}; stderr:\n{seen}",
                self.what
            );
            seen += &line;
            if line.contains(needle) {
                return seen;
            }
        }
    }

    /// Sends SIGTERM (by pid) and waits; returns (exit success, stdout, rest of stderr).
    fn terminate(&mut self) -> (bool, String, String) {
        self.proc.as_ref().expect("running").signal("TERM");
        self.wait()
    }

    /// Waits for the process to end; returns (exit success, stdout, rest of stderr).
    fn wait(&mut self) -> (bool, String, String) {
        let proc = self.proc.take().expect("running");
        let mut rest = String::new();
        if let Some(mut r) = self.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut r, &mut rest);
        }
        let out = proc.wait();
        (out.status.success(), text(&out.stdout), rest)
    }
}

/// Whether `iface` in `ns` has an XDP program attached.
fn has_xdp(ns: &str, iface: &str) -> bool {
    let out = must(Command::new("ip").args(["-n", ns, "-d", "link", "show", "dev", iface]));
    out.contains("prog/xdp")
}

/// Sends `n` distinct UDP frames (source ports vary) from `iface` in `ns` with scapy.
fn send_udp(ns: &str, iface: &str, src_mac: &str, dst_mac: &str, dst_ip: &str, n: usize) {
    let script = r#"
import sys
from scapy.all import Ether, IP, UDP, Raw, sendp
iface, smac, dmac, dst, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
pkts = [Ether(src=smac, dst=dmac) / IP(src="192.0.2.1", dst=dst) /
        UDP(sport=1024 + i % 60000, dport=9) / Raw(b"strait-test-frame")
        for i in range(n)]
sendp(pkts, iface=iface, verbose=0)
"#;
    let n = n.to_string();
    must(&mut in_ns(
        ns,
        [PYTHON, "-c", script, iface, src_mac, dst_mac, dst_ip, &n],
    ));
}

/// Starts tshark on `iface` in `ns` writing frames matching `filter` to `file`, until `count`
/// frames or 20 s; returns once it captures.
fn capture(ns: &str, iface: &str, filter: &str, count: usize, file: &str) -> Bg {
    let mut t = Bg::start(
        ns,
        &[
            "tshark",
            "-q",
            "-i",
            iface,
            "-f",
            filter,
            "-c",
            &count.to_string(),
            "-a",
            "duration:20",
            "-w",
            file,
        ],
    );
    t.wait_for("Capturing on", Duration::from_secs(20));
    t
}

/// Waits for the capture `tshark` (of [`capture`]) to end; the frames of `file` as rows of
/// the tshark `fields`, checksums verified, and what tshark printed.
fn captured(mut tshark: Bg, file: &str, fields: &[&str]) -> (Vec<Vec<String>>, String) {
    let (ok, stdout, stderr) = tshark.wait();
    assert!(ok, "tshark: {stderr}");
    (tshark_fields(Path::new(file), fields, None), stdout)
}

/// The JSON a tool printed on stdout.
fn summary(stdout: &str) -> Value {
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

const GEN_MAC: &str = "02:00:00:00:0a:01";
const FWD0_MAC: &str = "02:00:00:00:0a:fe";
const FWD1_MAC: &str = "02:00:00:00:0b:fe";
const SINK_MAC: &str = "02:00:00:00:0b:01";

#[test]
fn sink_counts_exactly_the_frames_sent_and_detaches_on_sigterm() {
    let Some(_serial) = privileged("sink counts") else {
        return;
    };
    let Link {
        nss: _nss,
        a,
        b,
        ia,
        ib,
    } = link("c");
    // Let the links settle before counting starts: nothing else may arrive during the count.
    std::thread::sleep(Duration::from_millis(300));

    // A sink killed outright leaves its program on the interface; the next one replaces it.
    {
        let mut killed = Bg::start(&b, &[LAB, "sink", "--iface", &ib]);
        killed.wait_for("native XDP program", Duration::from_secs(10));
    }
    assert!(
        has_xdp(&b, &ib),
        "a SIGKILLed sink leaves its program on {ib}"
    );
    let mut sink = Bg::start(&b, &[LAB, "sink", "--iface", &ib, "--json"]);
    let note = sink.wait_for("native XDP program", Duration::from_secs(10));
    assert!(
        note.contains("replaced"),
        "the stale program is replaced: {note}"
    );
    assert!(has_xdp(&b, &ib), "the sink's program is on {ib}");
    const N: usize = 2000;
    send_udp(&a, &ia, GEN_MAC, SINK_MAC, "192.0.2.2", N);
    // At least one per-second report, then stop it the way the benchmark does.
    sink.wait_for(" pps ", Duration::from_secs(5));
    let (ok, stdout, stderr) = sink.terminate();
    assert!(ok, "sink exits 0 on SIGTERM; stderr:\n{stderr}");
    let s = summary(&stdout);
    assert_eq!(s["received"], N as u64, "{s}");
    assert_eq!(s["reflected"], 0, "{s}");
    let secs = s["seconds"].as_f64().expect("seconds");
    assert!(secs > 1.0 && secs < 30.0, "{s}");
    let pps = s["pps"].as_f64().expect("pps");
    assert!((pps - N as f64 / secs).abs() < 1e-6 * pps.max(1.0), "{s}");
    let keys: Vec<&str> = s
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys.len(), 4, "exactly the contract's fields: {s}");
    assert!(!has_xdp(&b, &ib), "the sink took its program off {ib}");
}

#[test]
fn sink_reflects_probes_with_swapped_addresses_and_valid_checksums() {
    let Some(_serial) = privileged("sink reflects probes") else {
        return;
    };
    let Link { nss, a, b, ia, ib } = link("r");
    // The sink's reflection (a redirect to its own veth) reaches the peer only if the peer
    // has NAPI: GRO on (or an XDP program), as the benchmark's forwarder interface must.
    must(&mut in_ns(&a, ["ethtool", "-K", &ia, "gro", "on"]));
    std::thread::sleep(Duration::from_millis(300));

    const PORT: &str = "7777";
    let mut sink = Bg::start(
        &b,
        &[
            LAB,
            "sink",
            "--iface",
            &ib,
            "--json",
            "--reflect-port",
            PORT,
            "--duration",
            "4",
        ],
    );
    sink.wait_for(
        "reflecting probes from UDP port 7777",
        Duration::from_secs(10),
    );
    let pcap = nss.pcap("reflect");
    // Only what comes back from the sink's side.
    let tshark = capture(&a, &ia, &format!("ether src {SINK_MAC}"), 3, &pcap);

    // Three probes, and four frames that only look like one: wrong magic, the reflect port as
    // destination instead of source, a payload shorter than the magic, and TCP.
    let script = r#"
import json, socket, struct, sys, time
from scapy.all import Ether, IP, UDP, TCP, Raw, sendp
iface, smac, dmac, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("192.0.2.1", port))
s.settimeout(3)
def frame(l4, payload):
    return Ether(src=smac, dst=dmac) / IP(src="192.0.2.1", dst="203.0.113.10") / l4 / Raw(payload)
probes = [b"STRAITPR" + struct.pack("<QQ", seq, time.monotonic_ns()) for seq in range(3)]
frames = [frame(UDP(sport=port, dport=9000), p) for p in probes]
frames += [
    frame(UDP(sport=port, dport=9000), b"STRAITPX" + bytes(16)),
    frame(UDP(sport=9000, dport=port), b"STRAITPR" + bytes(16)),
    frame(UDP(sport=port, dport=9000), b"LAB"),
    frame(TCP(sport=port, dport=9000), b"STRAITPR" + bytes(16)),
]
sendp(frames, iface=iface, verbose=0)
got = []
try:
    while True:
        data, addr = s.recvfrom(2048)
        got.append({"from": [addr[0], addr[1]], "payload": data.hex()})
except socket.timeout:
    pass
print(json.dumps({"sent": [p.hex() for p in probes], "received": got}))
"#;
    let out = must(&mut in_ns(
        &a,
        [PYTHON, "-c", script, &ia, GEN_MAC, SINK_MAC, PORT],
    ));
    let r = summary(&out);
    let sent = r["sent"].as_array().expect("sent");
    let got = r["received"].as_array().expect("received");
    // The sender's kernel drops a UDP datagram whose IPv4 or UDP checksum is wrong, so each
    // one received is a valid one.
    assert_eq!(got.len(), 3, "every probe and nothing else came back: {r}");
    for (g, p) in got.iter().zip(sent) {
        assert_eq!(g["from"], serde_json::json!(["203.0.113.10", 9000]), "{r}");
        assert_eq!(g["payload"], *p, "payload untouched: {r}");
    }

    let (rows, stdout) = captured(
        tshark,
        &pcap,
        &[
            "eth.src",
            "eth.dst",
            "ip.src",
            "ip.dst",
            "udp.srcport",
            "udp.dstport",
            "ip.checksum.status",
            "udp.checksum.status",
        ],
    );
    assert_eq!(
        rows.len(),
        3,
        "three reflections captured: {rows:?} {stdout}"
    );
    for row in &rows {
        assert_eq!(
            row[..6],
            [SINK_MAC, GEN_MAC, "203.0.113.10", "192.0.2.1", "9000", PORT],
            "addresses and ports swapped: {rows:?}"
        );
        // Wireshark's checksum status: 1 = good.
        assert_eq!(
            row[6..],
            ["1", "1"],
            "IPv4 and UDP checksums good: {rows:?}"
        );
    }

    let (ok, stdout, stderr) = sink.wait();
    assert!(ok, "sink: {stderr}");
    let s = summary(&stdout);
    assert_eq!(s["reflected"], 3, "{s}");
    assert_eq!(s["received"], 7, "three probes and four look-alikes: {s}");
    assert!(!has_xdp(&b, &ib), "the sink took its program off {ib}");
}

#[test]
fn l2fwd_forwards_with_the_new_macs_and_leaves_arp_to_the_kernel() {
    let Some(_serial) = privileged("l2fwd") else {
        return;
    };
    let mut nss = Namespaces::new("l");
    let (g, f, s) = (nss.add("gen"), nss.add("fwd"), nss.add("sink"));
    let p = nss.prefix.clone();
    let (gen0, fwd0, fwd1, sink0) = (
        format!("{p}-g0"),
        format!("{p}-f0"),
        format!("{p}-f1"),
        format!("{p}-s0"),
    );
    veth(
        End {
            ns: &g,
            name: &gen0,
            mac: GEN_MAC,
            addr: "192.0.2.1/24",
        },
        End {
            ns: &f,
            name: &fwd0,
            mac: FWD0_MAC,
            addr: "192.0.2.254/24",
        },
    );
    veth(
        End {
            ns: &f,
            name: &fwd1,
            mac: FWD1_MAC,
            addr: "198.51.100.254/24",
        },
        End {
            ns: &s,
            name: &sink0,
            mac: SINK_MAC,
            addr: "198.51.100.2/24",
        },
    );
    std::thread::sleep(Duration::from_millis(300));

    // Count with the sink in one run, check the MACs with tshark in another (the sink's XDP
    // program drops frames before tshark could see them).
    const N: usize = 1000;
    for check_macs in [false, true] {
        let pcap = nss.pcap(if check_macs { "l2fwd-macs" } else { "l2fwd" });
        let mut sink = None;
        let mut tshark = None;
        if check_macs {
            tshark = Some(capture(&s, &sink0, "udp", N, &pcap));
        } else {
            let mut k = Bg::start(&s, &[LAB, "sink", "--iface", &sink0, "--json"]);
            k.wait_for("native XDP program", Duration::from_secs(10));
            sink = Some(k);
        }
        let mut fwd = Bg::start(
            &f,
            &[
                LAB,
                "l2fwd",
                "--rx",
                &fwd0,
                "--tx",
                &fwd1,
                "--dst-mac",
                SINK_MAC,
                "--core",
                "0",
                "--json",
            ],
        );
        let note = fwd.wait_for("l2fwd ", Duration::from_secs(10));
        assert!(note.contains(&format!("src {FWD1_MAC}")), "{note}");
        assert!(has_xdp(&f, &fwd0), "the redirect program is on {fwd0}");

        // ARP and ICMP to the forwarder's RX interface are the kernel's.
        must(Command::new("ip").args(["-n", &g, "neigh", "flush", "dev", &gen0]));
        must(Command::new("ip").args([
            "netns",
            "exec",
            &g,
            "ping",
            "-c",
            "2",
            "-i",
            "0.2",
            "-W",
            "2",
            "192.0.2.254",
        ]));
        let neigh = must(Command::new("ip").args(["-n", &g, "neigh", "show", "192.0.2.254"]));
        assert!(neigh.contains(FWD0_MAC), "ARP answered by {fwd0}: {neigh}");

        send_udp(&g, &gen0, GEN_MAC, FWD0_MAC, "198.51.100.2", N);
        std::thread::sleep(Duration::from_millis(500));
        let (ok, stdout, stderr) = fwd.terminate();
        assert!(ok, "l2fwd exits 0 on SIGTERM: {stderr}");
        let j = summary(&stdout);
        assert_eq!(j["forwarded"], N as u64, "{j}\n{stderr}");
        assert!(j["seconds"].as_f64().is_some_and(|x| x > 0.0), "{j}");
        assert!(j["pps"].as_f64().is_some(), "{j}");
        assert!(
            j["busy_seconds"].as_f64().is_some_and(|x| x > 0.0),
            "the forwarder timed its busy turns: {j}"
        );
        let (busy, kick) = (j["busy_seconds"].as_f64(), j["kick_seconds"].as_f64());
        assert!(
            kick.zip(busy).is_some_and(|(k, b)| k >= 0.0 && k <= b),
            "the TX kicks are part of the busy time: {j}"
        );
        assert_eq!(j.as_object().expect("object").len(), 5, "{j}");
        assert!(!has_xdp(&f, &fwd0), "l2fwd took its program off {fwd0}");

        if let Some(mut k) = sink {
            let (ok, stdout, stderr) = k.terminate();
            assert!(ok, "sink: {stderr}");
            let c = summary(&stdout);
            assert_eq!(
                c["received"], N as u64,
                "the sink saw every forwarded frame: {c}"
            );
        }
        if let Some(t) = tshark {
            let (rows, _) = captured(
                t,
                &pcap,
                &[
                    "eth.src",
                    "eth.dst",
                    "ip.src",
                    "ip.dst",
                    "udp.srcport",
                    "udp.checksum.status",
                ],
            );
            assert_eq!(rows.len(), N, "every frame arrived");
            let mut ports = std::collections::BTreeSet::new();
            for row in &rows {
                assert_eq!(
                    row[..4],
                    [FWD1_MAC, SINK_MAC, "192.0.2.1", "198.51.100.2"],
                    "MACs rewritten, nothing else: {row:?}"
                );
                assert_eq!(row[5], "1", "UDP checksum still good: {row:?}");
                ports.insert(row[4].clone());
            }
            assert_eq!(ports.len(), N, "each frame once");
        }
    }
}
