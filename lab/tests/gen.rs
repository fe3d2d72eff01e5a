//! `strait gen` on the real kernel: the generator sends over AF_XDP on one end of a veth pair
//! between two throwaway namespaces, and tcpdump captures what arrives at the other end;
//! tshark decodes the capture with every checksum verified. The latency test reflects the
//! probes with a real UDP echo server (Python) in the peer namespace, where the VIP is a
//! local address.
//!
//! They need root, iproute2, tcpdump, tshark and Debian's python3. Without them they fail
//! naming what is missing, unless `STRAIT_SKIP_PRIVILEGED=1` (see `strait_testkit::privileged`).
//! Each test uses its own names (`g{pid}{tag}`) and a guard that deletes its namespaces (and
//! with them the veth) on drop, also when an assertion fails.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::process::{Command, Output, Stdio};
use std::sync::MutexGuard;
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::harness::{
    in_ns, serial_if, sh, text, veth, while_capturing, Capture, End, Netns, Proc, LAB, PYTHON,
};
use support::privileged as gate;

const GEN_MAC: &str = "02:00:00:00:0a:01";
const PEER_MAC: &str = "02:00:00:00:0a:fe";

/// The serial lock (traffic tests count exact packets and rates: one at a time, so they do
/// not starve each other of the two cores) and a fresh [`Pair`], if test `test` may run.
fn new_pair(test: &str, tag: &str) -> Option<(MutexGuard<'static, ()>, Pair)> {
    let serial = serial_if(|| {
        gate::privileged(test, &[gate::IP, gate::TCPDUMP, gate::TSHARK, gate::PYTHON])
    })?;
    Some((serial, Pair::new(tag)))
}

/// Two quiet namespaces joined by a veth: `gen` (192.0.2.1, MAC [`GEN_MAC`]) and `peer`
/// (192.0.2.254, MAC [`PEER_MAC`]). Deleted on drop.
struct Pair {
    gen_ns: Netns,
    peer_ns: Netns,
    gen_if: String,
    peer_if: String,
}

impl Pair {
    fn new(tag: &str) -> Pair {
        let base = format!("g{}{tag}", std::process::id());
        let p = Pair {
            gen_ns: Netns::quiet(&format!("{base}-g")),
            peer_ns: Netns::quiet(&format!("{base}-p")),
            gen_if: format!("{base}g"),
            peer_if: format!("{base}p"),
        };
        veth(
            End {
                ns: p.gen_ns.name(),
                name: &p.gen_if,
                mac: GEN_MAC,
                addr: "192.0.2.1/24",
            },
            End {
                ns: p.peer_ns.name(),
                name: &p.peer_if,
                mac: PEER_MAC,
                addr: "192.0.2.254/24",
            },
        );
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
        let mut c = in_ns(self.gen_ns.name(), [LAB, "gen", "--iface", &self.gen_if]);
        c.args(["--dst-mac", PEER_MAC, "--json"]).args(args);
        c
    }

    /// [`Pair::gen`] while capturing IPv4 to 203.0.113.0/24 on the peer side: its summary
    /// and the packets that arrived.
    fn gen_captured(&self, args: &[&str]) -> (Value, Vec<Pkt>) {
        let pcap = std::env::temp_dir().join(format!("{}.pcap", self.peer_ns.name()));
        let mut cap = [Capture::start(
            self.peer_ns.name(),
            &self.peer_if,
            pcap,
            // A 32 MiB buffer: the default 2 MiB drops packets of a burst at 20 kpps.
            &["-B", "32768"],
            &["ip", "and", "dst", "net", "203.0.113.0/24"],
        )];
        let (_, summary) = while_capturing(&mut cap, || self.gen(args));
        (summary, packets(&cap[0]))
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

/// The packets of `cap`, decoded by tshark.
fn packets(cap: &Capture) -> Vec<Pkt> {
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
    cap.fields(&fields, None)
        .iter()
        .map(|f| {
            assert_eq!(f.len(), fields.len(), "tshark line {f:?}");
            let tcp = f[7] == "6";
            let num = |s: &str| s.parse::<u64>().unwrap_or(0);
            Pkt {
                src: f[0].clone(),
                sport: num(if tcp { &f[2] } else { &f[1] }) as u16,
                dst: f[3].clone(),
                dport: num(if tcp { &f[5] } else { &f[4] }) as u16,
                len: num(&f[6]) as usize,
                proto: f[7].clone(),
                csum: (f[8].clone(), if tcp { &f[10] } else { &f[9] }.clone()),
                tcp_flags: f[11].clone(),
                seq: num(&f[12]),
            }
        })
        .collect()
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
    let Some((_serial, pair)) = new_pair(
        "udp_new_flows_every_packet_a_new_tuple_with_valid_checksums",
        "u",
    ) else {
        return;
    };
    let (summary, pkts) = pair.gen_captured(&[
        "--to",
        "203.0.113.1:1000,203.0.113.2:2000",
        "--new-flows",
        "--rate",
        "20000",
        "--count",
        "3000",
    ]);
    assert_eq!(summary["sent"], 3000, "{summary}");
    assert_eq!(summary["tx_errors"], 0, "{summary}");
    assert!(summary["probes"].is_null(), "{summary}");
    let pps = summary["offered_pps"].as_f64().unwrap();
    assert!(
        (10_000.0..=21_000.0).contains(&pps),
        "rate 20000 asked: {summary}"
    );
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
    let Some((_serial, pair)) = new_pair(
        "established_tcp_flows_cycle_exactly_n_with_advancing_sequence_numbers",
        "t",
    ) else {
        return;
    };
    let (summary, pkts) = pair.gen_captured(&[
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
    ]);
    assert_eq!(summary["sent"], 2000, "{summary}");
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
    let Some((_serial, pair)) = new_pair("syn_traffic_minimum_frames", "s") else {
        return;
    };
    let (v, pkts) = pair.gen_captured(&[
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
fn echo(pair: &Pair, addr: &str, port: u16) -> Proc {
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
    let mut p =
        Proc::spawn(in_ns(pair.peer_ns.name(), [PYTHON, "-c", &script]).stdout(Stdio::piped()));
    let mut line = String::new();
    std::io::BufReader::new(p.child().stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("echo ready");
    assert_eq!(line.trim(), "ready");
    p
}

#[test]
fn latency_probes_are_reflected_and_measured_under_load() {
    let Some((_serial, pair)) =
        new_pair("latency_probes_are_reflected_and_measured_under_load", "l")
    else {
        return;
    };
    // The VIP is local in the peer namespace; replies go back over the veth to 192.0.2.1.
    sh(&[
        "ip",
        "-n",
        pair.peer_ns.name(),
        "addr",
        "add",
        "203.0.113.5/32",
        "dev",
        "lo",
    ]);
    let _echo = echo(&pair, "203.0.113.5", 7000);
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
    let Some((_serial, pair)) = new_pair("sigterm_ends_the_run_with_the_summary", "k") else {
        return;
    };
    let gen = Proc::spawn(
        pair.gen_cmd(&["--to", "203.0.113.1:1000", "--rate", "1000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let t0 = Instant::now();
    sleep(Duration::from_millis(2500));
    // `ip netns exec` execs strait, so the child's pid is strait's.
    gen.signal("TERM");
    let out = gen.wait();
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
        let out = Command::new(LAB)
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
