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

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

const STRAIT: &str = env!("CARGO_BIN_EXE_strait");
const PY: &str = "/usr/bin/python3";
static SERIAL: Mutex<()> = Mutex::new(());

#[path = "support/privileged.rs"]
mod gate;

fn privileged(test: &str) -> bool {
    gate::privileged(
        test,
        &[
            ("ip", "-V", "iproute2"),
            ("tshark", "--version", "tshark"),
            ("ethtool", "--version", "ethtool"),
            ("ping", "-V", "iputils-ping"),
            (PY, "--version", "python3"),
        ],
    ) && scapy_present(test)
}

/// `python3 -c` with no script succeeds without scapy; ask for it.
fn scapy_present(test: &str) -> bool {
    let ok = Command::new(PY)
        .args(["-c", "import scapy.all"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        if std::env::var("STRAIT_SKIP_PRIVILEGED").as_deref() == Ok("1") {
            eprintln!("\n**** SKIPPED {test}: needs scapy (apt-get install python3-scapy) ****\n");
            return false;
        }
        panic!("{test} needs scapy for {PY} (apt-get install -y python3-scapy)");
    }
    true
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

fn must(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Network namespaces made for one test; deleted on drop (their veths go with them).
struct Namespaces {
    prefix: String,
    made: Vec<String>,
}

impl Namespaces {
    fn new(tag: &str) -> Self {
        Self {
            prefix: format!("sk{}{tag}", std::process::id() % 100_000),
            made: Vec::new(),
        }
    }

    /// Makes namespace `{prefix}-{role}` with lo up, IPv6 off (so the kernel sends nothing
    /// on its own: no DAD, MLD or router solicitations) and reverse-path filtering off.
    fn add(&mut self, role: &str) -> String {
        let ns = format!("{}-{role}", self.prefix);
        must(Command::new("ip").args(["netns", "add", &ns]));
        self.made.push(ns.clone());
        for (k, v) in [
            ("net.ipv6.conf.all.disable_ipv6", "1"),
            ("net.ipv6.conf.default.disable_ipv6", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
        ] {
            must(Command::new("ip").args([
                "netns",
                "exec",
                &ns,
                "sysctl",
                "-qw",
                &format!("{k}={v}"),
            ]));
        }
        must(Command::new("ip").args(["-n", &ns, "link", "set", "lo", "up"]));
        ns
    }

    /// A veth from `a` (interface `ia`, MAC `ma`, address `addr_a`) to `b` (`ib`, `mb`,
    /// `addr_b`), both up.
    #[allow(clippy::too_many_arguments)]
    fn veth(
        &self,
        a: &str,
        ia: &str,
        ma: &str,
        addr_a: &str,
        b: &str,
        ib: &str,
        mb: &str,
        addr_b: &str,
    ) {
        must(Command::new("ip").args([
            "link", "add", ia, "netns", a, "address", ma, "type", "veth", "peer", "name", ib,
            "netns", b, "address", mb,
        ]));
        for (ns, i, addr) in [(a, ia, addr_a), (b, ib, addr_b)] {
            must(Command::new("ip").args(["-n", ns, "addr", "add", addr, "dev", i]));
            must(Command::new("ip").args(["-n", ns, "link", "set", i, "up"]));
        }
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.made {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// A background process, killed (by pid) on drop unless it was waited for.
struct Bg {
    child: Option<Child>,
    stderr: Option<BufReader<ChildStderr>>,
    what: String,
}

impl Bg {
    /// Starts `args` in namespace `ns` with stdout and stderr piped.
    fn start(ns: &str, args: &[&str]) -> Self {
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {args:?}: {e}"));
        let stderr = child.stderr.take().map(BufReader::new);
        Self {
            child: Some(child),
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

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Sends SIGTERM (by pid) and waits; returns (exit success, stdout, rest of stderr).
    fn terminate(&mut self) -> (bool, String, String) {
        must(Command::new("kill").args(["-TERM", &self.pid().to_string()]));
        self.wait()
    }

    /// Waits for the process to end; returns (exit success, stdout, rest of stderr).
    fn wait(&mut self) -> (bool, String, String) {
        let child = self.child.take().expect("running");
        let mut rest = String::new();
        if let Some(mut r) = self.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut r, &mut rest);
        }
        let out = child.wait_with_output().expect("wait");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            rest,
        )
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
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
    must(Command::new("ip").args([
        "netns",
        "exec",
        ns,
        PY,
        "-c",
        script,
        iface,
        src_mac,
        dst_mac,
        dst_ip,
        &n.to_string(),
    ]));
}

/// A temporary file path, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("strait-sink-{}-{tag}.pcap", std::process::id()));
        let _ = std::fs::remove_file(&p);
        Self(p)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Starts tshark on `iface` in `ns` writing frames matching `filter` to `file`, until `count`
/// frames or 20 s; returns once it captures.
fn capture(ns: &str, iface: &str, filter: &str, count: usize, file: &TempFile) -> Bg {
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
            file.path(),
        ],
    );
    t.wait_for("Capturing on", Duration::from_secs(20));
    t
}

/// The captured frames of `file` as rows of the tshark `fields`, with IPv4 and UDP checksum
/// validation on.
fn read_capture(file: &TempFile, fields: &[&str]) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    cmd.args([
        "-r",
        file.path(),
        "-o",
        "ip.check_checksum:TRUE",
        "-o",
        "udp.check_checksum:TRUE",
        "-T",
        "fields",
        "-E",
        "separator=/t",
    ]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    must(&mut cmd)
        .lines()
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

const GEN_MAC: &str = "02:00:00:00:0a:01";
const FWD0_MAC: &str = "02:00:00:00:0a:fe";
const FWD1_MAC: &str = "02:00:00:00:0b:fe";
const SINK_MAC: &str = "02:00:00:00:0b:01";

#[test]
fn sink_counts_exactly_the_frames_sent_and_detaches_on_sigterm() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !privileged("sink counts") {
        return;
    }
    let mut nss = Namespaces::new("c");
    let (a, b) = (nss.add("a"), nss.add("b"));
    let (ia, ib) = (format!("{}-x", nss.prefix), format!("{}-y", nss.prefix));
    nss.veth(
        &a,
        &ia,
        GEN_MAC,
        "192.0.2.1/24",
        &b,
        &ib,
        SINK_MAC,
        "192.0.2.2/24",
    );
    // Let the links settle before counting starts: nothing else may arrive during the count.
    std::thread::sleep(Duration::from_millis(300));

    // A sink killed outright leaves its program on the interface; the next one replaces it.
    {
        let mut killed = Bg::start(&b, &[STRAIT, "sink", "--iface", &ib]);
        killed.wait_for("native XDP program", Duration::from_secs(10));
    }
    assert!(
        has_xdp(&b, &ib),
        "a SIGKILLed sink leaves its program on {ib}"
    );
    let mut sink = Bg::start(&b, &[STRAIT, "sink", "--iface", &ib, "--json"]);
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
    let s: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
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
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !privileged("sink reflects probes") {
        return;
    }
    let mut nss = Namespaces::new("r");
    let (a, b) = (nss.add("a"), nss.add("b"));
    let (ia, ib) = (format!("{}-x", nss.prefix), format!("{}-y", nss.prefix));
    nss.veth(
        &a,
        &ia,
        GEN_MAC,
        "192.0.2.1/24",
        &b,
        &ib,
        SINK_MAC,
        "192.0.2.2/24",
    );
    // The sink's reflection (a redirect to its own veth) reaches the peer only if the peer
    // has NAPI: GRO on (or an XDP program), as the benchmark's forwarder interface must.
    must(Command::new("ip").args(["netns", "exec", &a, "ethtool", "-K", &ia, "gro", "on"]));
    std::thread::sleep(Duration::from_millis(300));

    const PORT: &str = "7777";
    let mut sink = Bg::start(
        &b,
        &[
            STRAIT,
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
    let pcap = TempFile::new("reflect");
    // Only what comes back from the sink's side.
    let mut tshark = capture(&a, &ia, &format!("ether src {SINK_MAC}"), 3, &pcap);

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
    frame(UDP(sport=port, dport=9000), b"STRAIT"),
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
    let out = must(Command::new("ip").args([
        "netns", "exec", &a, PY, "-c", script, &ia, GEN_MAC, SINK_MAC, PORT,
    ]));
    let r: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let sent = r["sent"].as_array().expect("sent");
    let got = r["received"].as_array().expect("received");
    // The sender's kernel drops a UDP datagram whose IPv4 or UDP checksum is wrong, so each
    // one received is a valid one.
    assert_eq!(got.len(), 3, "every probe and nothing else came back: {r}");
    for (g, p) in got.iter().zip(sent) {
        assert_eq!(g["from"], serde_json::json!(["203.0.113.10", 9000]), "{r}");
        assert_eq!(g["payload"], *p, "payload untouched: {r}");
    }

    let (ok, stdout, stderr) = tshark.wait();
    assert!(ok, "tshark: {stderr}");
    let rows = read_capture(
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
    let s: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(s["reflected"], 3, "{s}");
    assert_eq!(s["received"], 7, "three probes and four look-alikes: {s}");
    assert!(!has_xdp(&b, &ib), "the sink took its program off {ib}");
}

#[test]
fn l2fwd_forwards_with_the_new_macs_and_leaves_arp_to_the_kernel() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !privileged("l2fwd") {
        return;
    }
    let mut nss = Namespaces::new("l");
    let (g, f, s) = (nss.add("gen"), nss.add("fwd"), nss.add("sink"));
    let p = nss.prefix.clone();
    let (gen0, fwd0, fwd1, sink0) = (
        format!("{p}-g0"),
        format!("{p}-f0"),
        format!("{p}-f1"),
        format!("{p}-s0"),
    );
    nss.veth(
        &g,
        &gen0,
        GEN_MAC,
        "192.0.2.1/24",
        &f,
        &fwd0,
        FWD0_MAC,
        "192.0.2.254/24",
    );
    nss.veth(
        &f,
        &fwd1,
        FWD1_MAC,
        "198.51.100.254/24",
        &s,
        &sink0,
        SINK_MAC,
        "198.51.100.2/24",
    );
    std::thread::sleep(Duration::from_millis(300));

    // Count with the sink in one run, check the MACs with tshark in another (the sink's XDP
    // program drops frames before tshark could see them).
    const N: usize = 1000;
    for check_macs in [false, true] {
        let pcap = TempFile::new(if check_macs { "l2fwd-macs" } else { "l2fwd" });
        let mut sink = None;
        let mut tshark = None;
        if check_macs {
            tshark = Some(capture(&s, &sink0, "udp", N, &pcap));
        } else {
            let mut k = Bg::start(&s, &[STRAIT, "sink", "--iface", &sink0, "--json"]);
            k.wait_for("native XDP program", Duration::from_secs(10));
            sink = Some(k);
        }
        let mut fwd = Bg::start(
            &f,
            &[
                STRAIT,
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
        let j: Value =
            serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
        assert_eq!(j["forwarded"], N as u64, "{j}\n{stderr}");
        assert!(j["seconds"].as_f64().is_some_and(|x| x > 0.0), "{j}");
        assert!(j["pps"].as_f64().is_some(), "{j}");
        assert_eq!(j.as_object().expect("object").len(), 3, "{j}");
        assert!(!has_xdp(&f, &fwd0), "l2fwd took its program off {fwd0}");

        if let Some(mut k) = sink {
            let (ok, stdout, stderr) = k.terminate();
            assert!(ok, "sink: {stderr}");
            let c: Value =
                serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
            assert_eq!(
                c["received"], N as u64,
                "the sink saw every forwarded frame: {c}"
            );
        }
        if let Some(mut t) = tshark {
            let (ok, _, stderr) = t.wait();
            assert!(ok, "tshark: {stderr}");
            let rows = read_capture(
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
