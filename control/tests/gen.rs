//! `strait gen` on the real kernel: the generator sends over AF_XDP on one end of a veth pair
//! between two throwaway namespaces, and tcpdump captures what arrives at the other end;
//! tshark decodes the capture with every checksum verified. The latency test reflects the
//! probes with a real UDP echo server (Python) in the peer namespace, where the VIP is a
//! local address.
//!
//! They need root, iproute2, tcpdump, tshark and Debian's python3. Without them they fail
//! naming what is missing, unless `STRAIT_SKIP_PRIVILEGED=1` (see `support/privileged.rs`).
//! Each test uses its own names (`g{pid}{tag}`) and a guard that deletes its namespaces (and
//! with them the veth) on drop, also when an assertion fails.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde_json::Value;

const STRAIT: &str = env!("CARGO_BIN_EXE_strait");
/// Debian's Python (the one on PATH may be another).
const PYTHON: &str = "/usr/bin/python3";
const GEN_MAC: &str = "02:00:00:00:0a:01";
const PEER_MAC: &str = "02:00:00:00:0a:fe";

/// Traffic tests count exact packets and rates: one at a time, so they do not starve each
/// other of the two cores.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[path = "support/privileged.rs"]
mod gate;

fn privileged(test: &str) -> bool {
    gate::privileged(
        test,
        &[
            ("ip", "-V", "iproute2"),
            ("tcpdump", "--version", "tcpdump"),
            ("tshark", "--version", "tshark"),
            (PYTHON, "--version", "python3"),
        ],
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// Two namespaces joined by a veth: `gen` (192.0.2.1, MAC [`GEN_MAC`]) and `peer`
/// (192.0.2.254, MAC [`PEER_MAC`]); IPv6 off so nothing else is on the wire. Deleted on drop.
struct Pair {
    gen_ns: String,
    peer_ns: String,
    gen_if: String,
    peer_if: String,
}

impl Pair {
    fn new(tag: &str) -> Pair {
        let base = format!("g{}{tag}", std::process::id());
        let p = Pair {
            gen_ns: format!("{base}-g"),
            peer_ns: format!("{base}-p"),
            gen_if: format!("{base}g"),
            peer_if: format!("{base}p"),
        };
        assert!(p.gen_if.len() <= 15, "interface name {} too long", p.gen_if);
        // The guard exists before anything is made, so a failure half-way cleans up.
        sh(&["ip", "netns", "add", &p.gen_ns]);
        sh(&["ip", "netns", "add", &p.peer_ns]);
        for ns in [&p.gen_ns, &p.peer_ns] {
            sh(&[
                "ip",
                "netns",
                "exec",
                ns,
                "sysctl",
                "-qw",
                "net.ipv6.conf.all.disable_ipv6=1",
            ]);
            sh(&[
                "ip",
                "netns",
                "exec",
                ns,
                "sysctl",
                "-qw",
                "net.ipv6.conf.default.disable_ipv6=1",
            ]);
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        sh(&[
            "ip", "link", "add", &p.gen_if, "netns", &p.gen_ns, "type", "veth", "peer", "name",
            &p.peer_if, "netns", &p.peer_ns,
        ]);
        for (ns, ifc, mac, addr) in [
            (&p.gen_ns, &p.gen_if, GEN_MAC, "192.0.2.1/24"),
            (&p.peer_ns, &p.peer_if, PEER_MAC, "192.0.2.254/24"),
        ] {
            sh(&["ip", "-n", ns, "link", "set", ifc, "address", mac, "up"]);
            sh(&["ip", "-n", ns, "addr", "add", addr, "dev", ifc]);
        }
        p
    }

    /// `strait gen --iface <gen side> --dst-mac <peer> <args> --json` in the gen namespace.
    fn gen(&self, args: &[&str]) -> (Output, Value) {
        let out = self.gen_cmd(args).output().expect("run strait gen");
        assert!(
            out.status.success(),
            "strait gen {args:?} failed: {}",
            text(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("stdout is not one JSON object ({e}): {}", text(&out.stdout))
        });
        (out, v)
    }

    fn gen_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.gen_ns, STRAIT, "gen", "--iface"])
            .arg(&self.gen_if)
            .args(["--dst-mac", PEER_MAC, "--json"])
            .args(args);
        c
    }

    /// Captures IPv4 to 203.0.113.0/24 on the peer side while `traffic` runs.
    fn capture(&self, traffic: impl FnOnce()) -> Capture {
        let pcap = std::env::temp_dir().join(format!("{}.pcap", self.peer_ns));
        let child = Command::new("ip")
            // A 32 MiB buffer: the default 2 MiB drops packets of a burst at 20 kpps.
            .args(["netns", "exec", &self.peer_ns, "tcpdump", "-B", "32768"])
            .args(["--immediate-mode", "-U", "-n"])
            .args(["-i", &self.peer_if, "-w"])
            .arg(&pcap)
            .args(["ip", "and", "dst", "net", "203.0.113.0/24"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tcpdump");
        let mut cap = Capture { pcap, child };
        sleep(Duration::from_millis(1000));
        traffic();
        sleep(Duration::from_millis(500));
        let _ = Command::new("kill")
            .args(["-INT", &cap.child.id().to_string()])
            .status();
        let _ = cap.child.wait();
        cap
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for ns in [&self.gen_ns, &self.peer_ns] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// A finished capture; its file is removed on drop.
struct Capture {
    pcap: PathBuf,
    child: Child,
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = std::fs::remove_file(&self.pcap);
    }
}

/// One captured packet as tshark decodes it, checksums verified.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pkt {
    src: String,
    sport: u16,
    dst: String,
    dport: u16,
    len: usize,
    proto: String,
    /// ip, l4 checksum status (tshark: 1 good, 0 bad, 2 unverified).
    csum: (String, String),
    tcp_flags: String,
    seq: u64,
}

impl Pkt {
    fn tuple(&self) -> (String, u16, String, u16, String) {
        (
            self.src.clone(),
            self.sport,
            self.dst.clone(),
            self.dport,
            self.proto.clone(),
        )
    }
}

impl Capture {
    fn packets(&self) -> Vec<Pkt> {
        let fields = [
            "ip.src",
            "udp.srcport",
            "tcp.srcport",
            "ip.dst",
            "udp.dstport",
            "tcp.dstport",
            "frame.len",
            "ip.proto",
            "ip.checksum.status",
            "udp.checksum.status",
            "tcp.checksum.status",
            "tcp.flags",
            "tcp.seq_raw",
        ];
        let mut c = Command::new("tshark");
        c.arg("-r").arg(&self.pcap).args([
            "-o",
            "ip.check_checksum:TRUE",
            "-o",
            "udp.check_checksum:TRUE",
            "-o",
            "tcp.check_checksum:TRUE",
            "-T",
            "fields",
            "-E",
            "separator=/t",
        ]);
        for f in fields {
            c.args(["-e", f]);
        }
        let out = c.output().expect("tshark");
        assert!(out.status.success(), "tshark: {}", text(&out.stderr));
        text(&out.stdout)
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                assert_eq!(f.len(), fields.len(), "tshark line {l:?}");
                let tcp = f[7] == "6";
                let num = |s: &str| s.parse::<u64>().unwrap_or(0);
                Pkt {
                    src: f[0].into(),
                    sport: num(if tcp { f[2] } else { f[1] }) as u16,
                    dst: f[3].into(),
                    dport: num(if tcp { f[5] } else { f[4] }) as u16,
                    len: num(f[6]) as usize,
                    proto: f[7].into(),
                    csum: (f[8].into(), if tcp { f[10] } else { f[9] }.into()),
                    tcp_flags: f[11].into(),
                    seq: num(f[12]),
                }
            })
            .collect()
    }
}

/// Every packet: IPv4 and L4 checksums verified good by tshark, `len` bytes, protocol
/// `proto` (tshark's ip.proto), sources in 192.0.2.16-250 and ports in 1024-65535.
fn check_all(pkts: &[Pkt], len: usize, proto: &str) {
    for p in pkts {
        assert_eq!(p.csum, ("1".into(), "1".into()), "checksums of {p:?}");
        assert_eq!(p.len, len, "{p:?}");
        assert_eq!(p.proto, proto, "{p:?}");
        let last: u8 = p.src.rsplit('.').next().unwrap().parse().unwrap();
        assert!(
            p.src.starts_with("192.0.2.") && (16..=250).contains(&last),
            "{p:?}"
        );
        assert!(p.sport >= 1024, "{p:?}");
    }
}

#[test]
fn udp_new_flows_every_packet_a_new_tuple_with_valid_checksums() {
    if !privileged("udp_new_flows_every_packet_a_new_tuple_with_valid_checksums") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pair = Pair::new("u");
    let mut summary = Value::Null;
    let cap = pair.capture(|| {
        summary = pair
            .gen(&[
                "--to",
                "203.0.113.1:1000,203.0.113.2:2000",
                "--new-flows",
                "--rate",
                "20000",
                "--count",
                "3000",
            ])
            .1;
    });
    assert_eq!(summary["sent"], 3000, "{summary}");
    assert_eq!(summary["tx_errors"], 0, "{summary}");
    assert!(summary["probes"].is_null(), "{summary}");
    let pps = summary["offered_pps"].as_f64().unwrap();
    assert!(
        (10_000.0..=21_000.0).contains(&pps),
        "rate 20000 asked: {summary}"
    );
    let pkts = cap.packets();
    assert_eq!(pkts.len(), 3000, "every packet sent arrives on a veth");
    check_all(&pkts, 64, "17");
    let tuples: BTreeSet<_> = pkts.iter().map(Pkt::tuple).collect();
    assert_eq!(tuples.len(), 3000, "every packet a new 5-tuple");
    // The destinations alternate.
    for (i, p) in pkts.iter().enumerate() {
        let want = [("203.0.113.1", 1000), ("203.0.113.2", 2000)][i % 2];
        assert_eq!((p.dst.as_str(), p.dport), want, "packet {i}");
    }
}

#[test]
fn established_tcp_flows_cycle_exactly_n_with_advancing_sequence_numbers() {
    if !privileged("established_tcp_flows_cycle_exactly_n_with_advancing_sequence_numbers") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pair = Pair::new("t");
    let mut summary = Value::Null;
    let cap = pair.capture(|| {
        summary = pair
            .gen(&[
                "--to",
                "203.0.113.7:80",
                "--traffic",
                "tcp",
                "--flows",
                "100",
                "--size",
                "128",
                "--src-range",
                "192.0.2.16-192.0.2.20",
                "--rate",
                "20000",
                "--count",
                "2000",
            ])
            .1;
    });
    assert_eq!(summary["sent"], 2000, "{summary}");
    let pkts = cap.packets();
    assert_eq!(pkts.len(), 2000);
    check_all(&pkts, 128, "6");
    let mut flows: BTreeMap<_, Vec<u64>> = BTreeMap::new();
    for p in &pkts {
        assert_eq!(p.tcp_flags, "0x0018", "PSH|ACK with payload: {p:?}");
        flows.entry(p.tuple()).or_default().push(p.seq);
    }
    assert_eq!(flows.len(), 100, "exactly --flows distinct 5-tuples");
    let payload = 128 - 14 - 20 - 20;
    for (t, seqs) in &flows {
        assert_eq!(seqs.len(), 20, "{t:?}: each flow 2000/100 times");
        for w in seqs.windows(2) {
            assert_eq!(
                w[1],
                (w[0] + payload) % (1 << 32),
                "{t:?}: seq advances by payload"
            );
        }
    }
}

#[test]
fn syn_traffic_minimum_frames() {
    if !privileged("syn_traffic_minimum_frames") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pair = Pair::new("s");
    let cap = pair.capture(|| {
        let (_, v) = pair.gen(&[
            "--to",
            "203.0.113.9:443",
            "--traffic",
            "syn",
            "--flows",
            "7",
            "--size",
            "60",
            "--rate",
            "10000",
            "--count",
            "700",
        ]);
        assert_eq!(v["sent"], 700, "{v}");
    });
    let pkts = cap.packets();
    assert_eq!(pkts.len(), 700);
    check_all(&pkts, 60, "6");
    assert!(pkts.iter().all(|p| p.tcp_flags == "0x0002"), "all SYN");
    let tuples: BTreeSet<_> = pkts.iter().map(Pkt::tuple).collect();
    assert_eq!(tuples.len(), 7);
    let seqs: BTreeSet<_> = pkts.iter().map(|p| p.seq).collect();
    assert_eq!(seqs.len(), 700, "every SYN a fresh initial sequence number");
}

/// A UDP echo server for probes in the peer namespace: answers datagrams that start with
/// the probe magic, ignores the load. Killed on drop.
struct Echo(Child);

impl Echo {
    fn start(pair: &Pair, addr: &str, port: u16) -> Echo {
        let script = format!(
            "import socket,sys\n\
             s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
             s.setsockopt(socket.SOL_SOCKET,socket.SO_RCVBUF,4<<20)\n\
             s.bind(('{addr}',{port}))\n\
             print('ready',flush=True)\n\
             while True:\n\
             \x20 d,a=s.recvfrom(2048)\n\
             \x20 if d[:8]==b'STRAITPR': s.sendto(d,a)\n"
        );
        let mut c = Command::new("ip")
            .args(["netns", "exec", &pair.peer_ns, PYTHON, "-c", &script])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python echo");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(c.stdout.take().expect("stdout")),
            &mut line,
        )
        .expect("echo ready");
        assert_eq!(line.trim(), "ready");
        Echo(c)
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn latency_probes_are_reflected_and_measured_under_load() {
    if !privileged("latency_probes_are_reflected_and_measured_under_load") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pair = Pair::new("l");
    // The VIP is local in the peer namespace; replies go back over the veth to 192.0.2.1.
    sh(&[
        "ip",
        "-n",
        &pair.peer_ns,
        "addr",
        "add",
        "203.0.113.5/32",
        "dev",
        "lo",
    ]);
    let _echo = Echo::start(&pair, "203.0.113.5", 7000);
    let (out, v) = pair.gen(&[
        "--to",
        "203.0.113.5:7000",
        "--new-flows",
        "--rate",
        "5000",
        "--duration",
        "2",
        "--latency-port",
        "40000",
        "--probe-rate",
        "500",
    ]);
    let p = &v["probes"];
    let sent = p["sent"].as_u64().unwrap();
    let received = p["received"].as_u64().unwrap();
    assert!((900..=1100).contains(&sent), "500/s for 2 s: {v}");
    assert!(received * 10 >= sent * 9, "most probes come back: {v}");
    assert!(received <= sent, "{v}");
    let (p50, p99, p999) = (
        p["p50_us"].as_f64().unwrap(),
        p["p99_us"].as_f64().unwrap(),
        p["p999_us"].as_f64().unwrap(),
    );
    assert!(p50 > 0.0 && p50 <= p99 && p99 <= p999, "{v}");
    assert!(
        p999 < 200_000.0,
        "a veth and a local echo answer within 200 ms: {v}"
    );
    let sent_load = v["sent"].as_u64().unwrap();
    assert!((9000..=10500).contains(&sent_load), "{v}");
    // The per-second lines on stderr.
    let err = text(&out.stderr);
    assert!(
        err.lines().filter(|l| l.contains("offered")).count() >= 1,
        "{err}"
    );
}

#[test]
fn sigterm_ends_the_run_with_the_summary() {
    if !privileged("sigterm_ends_the_run_with_the_summary") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pair = Pair::new("k");
    let child = pair
        .gen_cmd(&["--to", "203.0.113.1:1000", "--rate", "1000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("strait gen");
    let t0 = Instant::now();
    sleep(Duration::from_millis(2500));
    // `ip netns exec` execs strait, so the child's pid is strait's.
    sh(&["kill", "-TERM", &child.id().to_string()]);
    let out = child.wait_with_output().expect("wait");
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let secs = v["seconds"].as_f64().unwrap();
    assert!((1.5..=3.0).contains(&secs), "{v}");
    let pps = v["offered_pps"].as_f64().unwrap();
    assert!((900.0..=1050.0).contains(&pps), "rate 1000: {v}");
    let lines = text(&out.stderr)
        .lines()
        .filter(|l| l.contains("offered"))
        .count();
    assert!(lines >= 2, "a line per second: {}", text(&out.stderr));
}

#[test]
fn bad_arguments_are_named() {
    let run = |args: &[&str]| {
        let out = Command::new(STRAIT)
            .args(["gen", "--iface", "lo", "--src-mac", GEN_MAC])
            .args(args)
            .output()
            .expect("strait");
        assert!(!out.status.success(), "{args:?} accepted");
        text(&out.stderr)
    };
    assert!(run(&["--dst-mac", "zz", "--to", "203.0.113.1:1"]).contains("\"zz\""));
    let ok = ["--dst-mac", PEER_MAC, "--to", "203.0.113.1:80"];
    assert!(run(&[&ok[..], &["--size", "10"]].concat()).contains("frame size 10"));
    assert!(run(&[&ok[..], &["--rate", "fast"]].concat()).contains("--rate"));
    assert!(run(&["--dst-mac", PEER_MAC, "--to", "203.0.113.1"]).contains("VIP:PORT"));
    assert!(run(&[
        &ok[..],
        &[
            "--flows",
            "10",
            "--src-range",
            "192.0.2.16-192.0.2.16",
            "--sport-range",
            "1024-1025"
        ]
    ]
    .concat())
    .contains("10 flows"));
}
