//! SCTP end to end: the testbed, the gateway (`strait run`, AF_XDP) and SCTP peers in the
//! client and backend namespaces, every frame on the wire decoded by tshark with SCTP's
//! CRC32c verified. Needs root, tshark and Debian's python3-scapy; fails with a clear message
//! without them unless `STRAIT_SKIP_PRIVILEGED=1` (CI never sets it).
//!
//! The kernel of the test machines has no SCTP module, so the peers speak SCTP over raw IP
//! sockets (`tests/e2e/sctp.py`, scapy builds and parses every packet and computes its
//! CRC32c): the client opens associations (an INIT, then DATA packets) from many source
//! ports, each backend answers an INIT with an INIT ACK and a DATA chunk with a SACK and a
//! DATA chunk, both naming the backend. The captures decide what crossed the gateway; the
//! gateway's counters must account for each of those frames exactly.
//!
//! ```text
//!  client (scapy, raw socket) ── INIT / DATA ──► gateway ──► backend (scapy, raw socket)
//!     ▲ tcpdump                                              │ tcpdump
//!     └──── INIT ACK / SACK+DATA: dsr-l2 straight from the backend, nat back through it
//! ```
//!
//! IPv4 throughout, and nat over IPv6 too (the peers speak both families).
//!
//! One test at a time, as in `e2e.rs`: each gateway runs a busy-polling worker.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use support::bed::{Bed, Gateway, CLIENT};
use support::e2e::{self, counter_in, start, write_config, Driver, Scenario, VIP};
use support::fake_api::{FakeApi, Res};
use support::harness::{in_ns, tshark_fields, wait_for, while_capturing, Capture, Proc, PYTHON};
use support::objects::{node, CLASS};
use support::privileged as gate;

/// The SCTP service's port on the VIP.
const PORT: u16 = 7777;
/// The port the `nat` service translates it to on the backends.
const NAT_PORT: u16 = 17777;
/// The client's IPv6 address on the testbed.
const CLIENT6: &str = "2001:db8:c::2";
/// The IPv6 VIP.
const VIP6: &str = "2001:db8::10";
/// The gateway's MAC on every interface of the testbed.
const GW_MAC: &str = "02:00:00:00:00:01";
/// The client's MAC.
const CLIENT_MAC: &str = "02:00:00:00:00:c1";

/// What a test reads and writes differently over IPv4 and IPv6.
#[derive(Debug)]
struct Family {
    vip: &'static str,
    client: &'static str,
    /// A backend's address in `testbed up`'s summary.
    backend_key: &'static str,
    /// tshark's fields for the source and destination addresses and the TTL / hop limit.
    src: &'static str,
    dst: &'static str,
    ttl: &'static str,
}

const V4: Family = Family {
    vip: VIP,
    client: CLIENT,
    backend_key: "ipv4",
    src: "ip.src",
    dst: "ip.dst",
    ttl: "ip.ttl",
};

const V6: Family = Family {
    vip: VIP6,
    client: CLIENT6,
    backend_key: "ipv6",
    src: "ipv6.src",
    dst: "ipv6.dst",
    ttl: "ipv6.hlim",
};

impl Family {
    /// The address of backend `name` (`b1`, ...).
    fn backend(&self, bed: &Bed, name: &str) -> String {
        bed.backend(name)[self.backend_key]
            .as_str()
            .expect("backend address")
            .to_owned()
    }
}

/// The serial lock and an AF_XDP testbed of `strait testbed up ARGS..`, if the tests may
/// run: root, the end-to-end tools, and scapy for the SCTP peers.
fn scenario(tag: &str, args: &[&str]) -> Option<Scenario> {
    if !gate::python_module("SCTP end-to-end", "scapy", "python3-scapy") {
        return None;
    }
    e2e::scenario(Driver::AfXdp, tag, args)
}

/// The testbed's configuration plus one SCTP service of `family` per `(name, port, mode,
/// backend port)`, over every backend, health-checked over HTTP on `check` (the backends'
/// own server: they do not end SCTP in the kernel).
fn with_sctp(
    s: &Scenario,
    family: &Family,
    check: u16,
    services: &[(&str, u16, &str, u16)],
) -> PathBuf {
    let mut extra = String::new();
    for (name, port, mode, backend_port) in services {
        let vip = family.vip;
        extra += &format!(
            "\n[[services]]\nname = \"{name}\"\nvip = \"{vip}\"\nport = {port}\n\
             protocol = \"sctp\"\nmode = \"{mode}\"\n\
             health_check = {{ kind = \"http\", path = \"/healthz\", port = {check}, \
             interval = \"500ms\", timeout = \"250ms\" }}\n"
        );
        for b in s.backends() {
            extra += &format!(
                "[[services.backends]]\naddress = \"{}\"\nport = {backend_port}\nmac = \"{}\"\n",
                b[family.backend_key].as_str().expect("backend address"),
                b["mac"].as_str().expect("backend MAC"),
            );
        }
    }
    write_config(s, |t| format!("{t}{extra}"))
}

// ---- the peers ---------------------------------------------------------------------------

/// `tests/e2e/sctp.py ARGS..` in the namespace of `role`.
fn peer(bed: &Bed, role: &str, args: &[&str]) -> std::process::Command {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/sctp.py");
    let mut c = in_ns(&bed.ns(role), [PYTHON]);
    c.arg(script).args(args);
    c
}

/// An SCTP answerer on every backend (`sctp.py serve bN PORT`), each listening once this
/// returns; killed on drop.
fn serve_sctp(bed: &Bed, port: u16) -> Vec<Proc> {
    bed.backends()
        .iter()
        .map(|b| {
            let name = b["name"].as_str().expect("backend name");
            let mut p = Proc::spawn(
                peer(bed, name, &["serve", name, &port.to_string()])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit()),
            );
            let mut line = String::new();
            let out = p.child().stdout.take().expect("piped");
            BufReader::new(out).read_line(&mut line).expect("reading");
            assert_eq!(line.trim(), "ready", "{} did not start", p.what());
            p
        })
        .collect()
}

/// What the client saw of its associations.
#[derive(Debug)]
struct Assocs {
    /// Per source port, the backends that answered (one, if it stuck) and how many
    /// answers came.
    by_port: BTreeMap<u16, (Vec<String>, usize)>,
    /// Associations every packet of which was answered.
    answered: usize,
    /// Packets sent, retries included.
    packets: u64,
}

impl Assocs {
    /// Answers received, over every association.
    fn answers(&self) -> u64 {
        self.by_port.values().map(|(_, k)| *k as u64).sum()
    }

    /// Associations per backend, after asserting that all `n` were answered in full, each
    /// by one backend, and that `backends` backends answered.
    fn per_backend(&self, n: usize, backends: usize) -> BTreeMap<String, usize> {
        assert_eq!(self.answered, n, "{self:#?}");
        let mut per = BTreeMap::new();
        for (sport, (who, _)) in &self.by_port {
            assert_eq!(who.len(), 1, "association {sport} answered by {who:?}");
            *per.entry(who[0].clone()).or_default() += 1;
        }
        assert_eq!(per.len(), backends, "associations per backend: {per:?}");
        per
    }
}

/// What the client asks of `sctp.py`: a command and its `vip`:`port`, source ports
/// `first..first + n`, `data` DATA packets each.
#[derive(Debug, Clone, Copy)]
struct Run<'a> {
    cmd: &'a str,
    vip: &'a str,
    port: u16,
    first: u16,
    n: usize,
    data: usize,
}

impl Run<'_> {
    /// Runs it in the client namespace; its report (stdout), after asserting it succeeded.
    fn report(self, bed: &Bed) -> String {
        let out = peer(
            bed,
            "client",
            &[
                self.cmd,
                if self.vip.contains(':') {
                    CLIENT6
                } else {
                    CLIENT
                },
                self.vip,
                &self.port.to_string(),
                &self.first.to_string(),
                &self.n.to_string(),
                &self.data.to_string(),
            ],
        )
        .output()
        .unwrap_or_else(|e| panic!("running sctp.py {}: {e}", self.cmd));
        let report = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "sctp.py {} failed:\n{report}{}",
            self.cmd,
            String::from_utf8_lossy(&out.stderr)
        );
        report
    }

    /// Runs `assoc` or `data` (associations that wait for their answers); what the client
    /// saw.
    fn assocs(self, bed: &Bed) -> Assocs {
        let report = self.report(bed);
        let mut a = Assocs {
            by_port: BTreeMap::new(),
            answered: 0,
            packets: 0,
        };
        for line in report.lines() {
            let kv: BTreeMap<&str, &str> = line
                .split_whitespace()
                .filter_map(|w| w.split_once('='))
                .collect();
            if let (Some(sport), Some(who), Some(k)) =
                (kv.get("sport"), kv.get("backend"), kv.get("answers"))
            {
                let who = who
                    .split(',')
                    .filter(|w| *w != "-")
                    .map(str::to_owned)
                    .collect();
                a.by_port
                    .insert(sport.parse().unwrap(), (who, k.parse().unwrap()));
            } else if let (Some(ok), Some(p)) = (kv.get("answered"), kv.get("packets")) {
                a.answered = ok.parse().unwrap();
                a.packets = p.parse().unwrap();
            }
        }
        assert_eq!(
            a.by_port.len(),
            self.n,
            "one line per association:\n{report}"
        );
        a
    }

    /// Runs `send` or `corrupt` (packets sent without waiting); how many.
    fn sent(self, bed: &Bed) -> u64 {
        let report = self.report(bed);
        report
            .trim()
            .strip_prefix("sent=")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("sctp.py {}: {report}", self.cmd))
    }
}

/// `sctp.py CMD` from the client to `vip`:`port`, source ports `first..first + n`, `data`
/// DATA packets each: `assoc` opens associations (an INIT first), `data` carries on those of
/// the same ports, both waiting for every answer ([`Run::assocs`]); `send` sends the
/// packets of `assoc` without waiting, `corrupt` each with its CRC32c off by one bit
/// ([`Run::sent`]).
fn run<'a>(cmd: &'a str, vip: &'a str, port: u16, first: u16, n: usize, data: usize) -> Run<'a> {
    Run {
        cmd,
        vip,
        port,
        first,
        n,
        data,
    }
}

// ---- captures ----------------------------------------------------------------------------

/// A tcpdump of `filter` on `eth0` of `role`, its file in the testbed's scratch directory.
fn capture(bed: &Bed, role: &str, tag: &str, filter: &str) -> (Capture, PathBuf) {
    let pcap = bed.dir.join(&format!("{role}-{tag}.pcap"));
    let c = Capture::start(&bed.ns(role), "eth0", pcap.clone(), &[], &[filter]);
    (c, pcap)
}

/// The frames of a pcap file as tcpdump writes it (the classic format, either byte order).
fn frames(pcap: &Path) -> Vec<Vec<u8>> {
    let b = std::fs::read(pcap).unwrap_or_else(|e| panic!("{}: {e}", pcap.display()));
    assert!(b.len() >= 24, "{}: no pcap header", pcap.display());
    let le = match b[..4] {
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => true,
        [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => false,
        _ => panic!("{}: not a pcap file", pcap.display()),
    };
    let word = |at: usize| {
        let w: [u8; 4] = b[at..at + 4].try_into().unwrap();
        if le {
            u32::from_le_bytes(w)
        } else {
            u32::from_be_bytes(w)
        }
    };
    let (mut at, mut out) = (24, Vec::new());
    // A record tcpdump is still writing is left out.
    while at + 16 <= b.len() && at + 16 + word(at + 8) as usize <= b.len() {
        let len = word(at + 8) as usize;
        at += 16;
        out.push(b[at..at + len].to_vec());
        at += len;
    }
    out
}

/// Waits up to 10 s for `pcaps` to hold `want` frames between them: tcpdump writes each
/// frame as it takes it (`-U`), but on a loaded machine it may take them from the kernel
/// well after they crossed the wire, and stopping it drops what it has not taken yet.
fn await_frames(pcaps: &[PathBuf], want: u64) {
    let count = || -> u64 {
        pcaps
            .iter()
            .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() >= 24))
            .map(|p| frames(p).len() as u64)
            .sum()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while count() < want && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// tshark's decoding of every frame of `pcap`: per frame, field name to value (`,`-joined
/// occurrences, outer first), with every checksum tshark knows verified, SCTP's CRC32c
/// among them.
fn decode(pcap: &Path, fields: &[&str], decode_as: Option<&str>) -> Vec<BTreeMap<String, String>> {
    tshark_fields(pcap, fields, decode_as)
        .into_iter()
        .map(|row| {
            fields
                .iter()
                .map(|f| (*f).to_owned())
                .zip(row.into_iter().chain(std::iter::repeat(String::new())))
                .collect()
        })
        .collect()
}

/// What tshark reads of each SCTP frame.
const FIELDS: &[&str] = &[
    "eth.src",
    "eth.dst",
    "ip.src",
    "ip.dst",
    "ip.ttl",
    "ip.checksum.status",
    "ipv6.src",
    "ipv6.dst",
    "ipv6.hlim",
    "udp.dstport",
    "udp.checksum.status",
    "sctp.srcport",
    "sctp.dstport",
    "sctp.verification_tag",
    "sctp.chunk_type",
    "sctp.checksum.status",
    "_ws.malformed",
    "_ws.expert.severity",
];

/// Asserts tshark found nothing wrong in a frame: not malformed, no error, every IPv4 and
/// UDP checksum good (or absent), and every SCTP CRC32c good.
fn assert_clean(f: &BTreeMap<String, String>, at: &str) {
    assert!(f["_ws.malformed"].is_empty(), "malformed at {at}: {f:?}");
    assert!(
        !f["_ws.expert.severity"].split(',').any(|s| s == "8388608"),
        "tshark error at {at}: {f:?}"
    );
    for k in ["ip.checksum.status", "udp.checksum.status"] {
        assert!(!f[k].split(',').any(|s| s == "0"), "bad {k} at {at}: {f:?}");
    }
    assert_eq!(f["sctp.checksum.status"], "1", "CRC32c at {at}: {f:?}");
}

// ---- counters ----------------------------------------------------------------------------

/// The workers' counters in one scrape, after asserting the pipeline's identity
/// `rx == tx + pass + handoff + drops` on it.
#[derive(Debug, Clone, Copy)]
struct Books {
    rx: u64,
    tx: u64,
    drops: u64,
}

/// [`Books`] of the gateway now; waits for the workers to publish (they do when idle).
fn books(gw: &Gateway) -> Books {
    std::thread::sleep(Duration::from_millis(500));
    let m = gw.get("/metrics");
    let b = Books {
        rx: counter_in(&m, "strait_rx_packets_total"),
        tx: counter_in(&m, "strait_tx_packets_total"),
        drops: counter_in(&m, "strait_dropped_packets_total"),
    };
    let pass = counter_in(&m, "strait_pass_packets_total");
    let handoff = counter_in(&m, "strait_handoff_packets_total");
    assert_eq!(
        b.rx,
        b.tx + pass + handoff + b.drops,
        "rx != tx + pass + handoff + drops:\n{m}"
    );
    b
}

/// `strait_dropped_packets_total` of `reason`, over the workers.
fn dropped(gw: &Gateway, reason: &str) -> u64 {
    let label = format!("reason=\"{reason}\"");
    gw.get("/metrics")
        .lines()
        .filter(|l| l.starts_with("strait_dropped_packets_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// `strait_backend_new_flows_total` of `service` per backend address (port dropped), those
/// with any.
fn new_flows(gw: &Gateway, service: &str) -> BTreeMap<String, u64> {
    let want = format!("strait_backend_new_flows_total{{service=\"{service}\",backend=\"");
    gw.get("/metrics")
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&want)?;
            let (backend, value) = rest.split_once("\"} ")?;
            let addr = backend.rsplit_once(':').map_or(backend, |(a, _)| a);
            let addr = addr.trim_start_matches('[').trim_end_matches(']');
            Some((addr.to_owned(), value.parse().ok()?))
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Asserts that `service` made as many flows per backend as `per_backend` (by name) says.
fn assert_new_flows(
    bed: &Bed,
    gw: &Gateway,
    family: &Family,
    service: &str,
    per_backend: &BTreeMap<String, usize>,
) {
    let flows = new_flows(gw, service);
    let want: BTreeMap<String, u64> = per_backend
        .iter()
        .map(|(name, n)| (family.backend(bed, name), *n as u64))
        .collect();
    assert_eq!(flows, want, "new flows per backend of {service}");
}

/// The client's frames to the VIP, by their IP packet (the bytes after the Ethernet header).
fn sent_packets(pcap: &Path) -> BTreeMap<Vec<u8>, usize> {
    let mut m = BTreeMap::new();
    for f in frames(pcap) {
        *m.entry(f[14..].to_vec()).or_default() += 1;
    }
    m
}

// ---- the tests ---------------------------------------------------------------------------

#[test]
fn a_dsr_l2_delivers_sctp_unchanged_but_for_l2_spread_and_sticky_per_association() {
    let Some(s) = scenario("sa", &["--backends", "4"]) else {
        return;
    };
    let cfg = with_sctp(&s, &V4, 80, &[("sctp", PORT, "dsr-l2", PORT)]);
    let gw = start(&s, &cfg);
    let _servers = serve_sctp(&s, PORT);
    let before = books(&gw);
    let to_vip = format!("sctp and dst host {VIP}");
    // The client's packets on its own wire and on each backend's, and the answers.
    let (mut caps, pcaps): (Vec<Capture>, Vec<PathBuf>) = ["client", "b1", "b2", "b3", "b4"]
        .iter()
        .map(|r| capture(&s, r, "l2", &to_vip))
        .chain([capture(
            &s,
            "client",
            "answers",
            &format!("sctp and src host {VIP}"),
        )])
        .unzip();
    const ASSOCS: usize = 40;
    const DATA: usize = 3;
    let a = while_capturing(&mut caps, || {
        let a = run("assoc", VIP, PORT, 40_000, ASSOCS, DATA).assocs(&s);
        await_frames(&pcaps[..1], a.packets);
        await_frames(&pcaps[1..5], a.packets);
        await_frames(&pcaps[5..], a.answers());
        a
    });
    let after = books(&gw);

    // Every association answered, by one backend, every backend used.
    let per_backend = a.per_backend(ASSOCS, 4);

    // What the client sent arrives on the backends byte for byte from the IP header on,
    // each frame once, from the gateway's MAC to the backend's; every packet of an
    // association on the backend that answered it.
    let mut sent = sent_packets(&pcaps[0]);
    let sent_total: usize = sent.values().sum();
    assert_eq!(sent_total as u64, a.packets, "the client's capture");
    let mut delivered = 0;
    for (i, pcap) in pcaps[1..5].iter().enumerate() {
        let role = format!("b{}", i + 1);
        let mac = s.backend(&role)["mac"].as_str().unwrap().to_owned();
        let decoded = decode(pcap, FIELDS, None);
        let raw = frames(pcap);
        assert_eq!(decoded.len(), raw.len());
        for (f, bytes) in decoded.iter().zip(&raw) {
            let at = format!("{role}: {f:?}");
            assert_clean(f, &at);
            assert_eq!(
                (f["eth.src"].as_str(), f["eth.dst"].as_str()),
                (GW_MAC, mac.as_str()),
                "{at}"
            );
            assert_eq!(
                (f["ip.src"].as_str(), f["ip.dst"].as_str()),
                (CLIENT, VIP),
                "{at}"
            );
            assert_eq!(f["sctp.dstport"], PORT.to_string(), "{at}");
            let sport: u16 = f["sctp.srcport"].parse().unwrap();
            assert_eq!(
                a.by_port[&sport].0,
                [role.as_str()],
                "{at}: not where it was answered"
            );
            let left = sent.get_mut(&bytes[14..]).unwrap_or_else(|| {
                panic!("{at}: the gateway changed the packet beyond L2 (or it was not sent)")
            });
            assert!(*left > 0, "{at}: delivered more often than sent");
            *left -= 1;
            delivered += 1;
        }
    }
    let left: Vec<_> = sent
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(p, _)| p[20..24].to_vec())
        .collect();
    assert_eq!(
        delivered, sent_total,
        "frames sent and delivered; not delivered (ports): {left:?}"
    );
    eprintln!(
        "{delivered} SCTP frames delivered unchanged; associations per backend {per_backend:?}"
    );

    // The answers, straight from the backends, valid too.
    let answers = decode(&pcaps[5], FIELDS, None);
    // A backend answers every packet it receives, so as many as were delivered.
    assert_eq!(answers.len(), delivered, "answers captured on the client");
    for f in &answers {
        assert_clean(f, &format!("client: {f:?}"));
        assert_eq!(f["eth.dst"], CLIENT_MAC);
        assert_ne!(
            f["eth.src"], GW_MAC,
            "a DSR answer came through the gateway: {f:?}"
        );
    }

    // The books: every frame the gateway took in went out, none dropped, and the flows it
    // made per backend are the associations each one answered.
    assert_eq!(after.rx - before.rx, a.packets, "rx");
    assert_eq!(after.tx - before.tx, a.packets, "tx");
    assert_eq!(after.drops, before.drops, "drops");
    assert_new_flows(&s, &gw, &V4, "sctp", &per_backend);
}

#[test]
fn b_nat_translates_sctp_both_ways_with_a_fresh_crc32c() {
    nat("sb", &V4);
}

#[test]
fn f_nat_translates_sctp_over_ipv6_too() {
    nat("sf", &V6);
}

/// nat of `family` on a two-arm testbed: VIP:7777 to backend:17777 and back, the CRC32c
/// valid both ways, corrupt packets dropped.
fn nat(tag: &str, family: &Family) {
    let Some(s) = scenario(tag, &["--topology", "two-arm", "--backends", "3"]) else {
        return;
    };
    let Family {
        vip,
        client,
        src,
        dst,
        ttl,
        ..
    } = *family;
    // VIP:7777 to backend:17777; health-checked on the backends' HTTP port.
    let cfg = with_sctp(&s, family, 8080, &[("sctp", PORT, "nat", NAT_PORT)]);
    let gw = start(&s, &cfg);
    let _servers = serve_sctp(&s, NAT_PORT);
    let before = books(&gw);
    let (mut caps, pcaps): (Vec<Capture>, Vec<PathBuf>) = ["client", "b1", "b2", "b3"]
        .iter()
        .map(|r| capture(&s, r, "nat", "sctp"))
        .unzip();
    const ASSOCS: usize = 24;
    const DATA: usize = 2;
    let a = while_capturing(&mut caps, || {
        let a = run("assoc", vip, PORT, 41_000, ASSOCS, DATA).assocs(&s);
        await_frames(&pcaps[..1], a.packets + a.answers());
        await_frames(&pcaps[1..], a.packets + a.answers());
        a
    });
    let after = books(&gw);

    // Every association answered from VIP:7777 (sctp.py counts only those, with its tag and
    // a valid CRC32c), by one backend, every backend used.
    let per_backend = a.per_backend(ASSOCS, 3);

    // The client's side: its packets to VIP:7777 out, the answers in from VIP:7777 through
    // the gateway, each with a valid CRC32c after the gateway rewrote its source port.
    let on_client = decode(&pcaps[0], FIELDS, None);
    let client_raw = frames(&pcaps[0]);
    let mut sent: BTreeMap<(u32, Vec<u8>), usize> = BTreeMap::new();
    let (mut out, mut back) = (0u64, 0u64);
    for (f, bytes) in on_client.iter().zip(&client_raw) {
        let at = format!("client: {f:?}");
        assert_clean(f, &at);
        if f[src] == client {
            assert_eq!(
                (f[dst].as_str(), f["sctp.dstport"].as_str()),
                (vip, "7777"),
                "{at}"
            );
            *sent.entry(chunks(bytes)).or_default() += 1;
            out += 1;
        } else {
            assert_eq!(f[src], vip, "{at}");
            assert_eq!(f["sctp.srcport"], PORT.to_string(), "{at}");
            assert_eq!(
                (f["eth.src"].as_str(), f[dst].as_str()),
                (GW_MAC, client),
                "{at}"
            );
            // The gateway routes: one hop less than the backend's 64.
            assert_eq!(f[ttl], "63", "{at}");
            back += 1;
        }
    }
    assert_eq!(out, a.packets, "the client's packets captured");

    // The backends' side: the destination translated to the backend and 17777, the client's
    // address and port kept, the chunks untouched, the CRC32c valid; each association on the
    // backend that answered it.
    let mut delivered = 0u64;
    let mut answered = 0u64;
    for (i, pcap) in pcaps[1..].iter().enumerate() {
        let role = format!("b{}", i + 1);
        let ip = family.backend(&s, &role);
        for (f, bytes) in decode(pcap, FIELDS, None).iter().zip(frames(pcap)) {
            let at = format!("{role}: {f:?}");
            assert_clean(f, &at);
            if f[src] == ip {
                answered += 1;
                continue;
            }
            assert_eq!(
                (f[src].as_str(), f[dst].as_str()),
                (client, ip.as_str()),
                "{at}"
            );
            assert_eq!(f["sctp.dstport"], NAT_PORT.to_string(), "{at}");
            assert_eq!(
                (f["eth.src"].as_str(), f[ttl].as_str()),
                (GW_MAC, "63"),
                "{at}"
            );
            let sport: u16 = f["sctp.srcport"].parse().unwrap();
            assert_eq!(
                a.by_port[&sport].0,
                [role.as_str()],
                "{at}: not where it was answered"
            );
            let left = sent
                .get_mut(&chunks(&bytes))
                .filter(|n| **n > 0)
                .unwrap_or_else(|| panic!("{at}: chunks or tag changed, or delivered twice"));
            *left -= 1;
            delivered += 1;
        }
    }
    assert_eq!(delivered, out, "frames sent and delivered");
    assert_eq!(
        answered, back,
        "answers sent by the backends and received by the client"
    );
    eprintln!("{delivered} SCTP frames translated, {back} answers back; associations per backend {per_backend:?}");

    // The books: the gateway took in and sent exactly what the captures saw arrive (its
    // health checks' replies are the kernel's, not steered to the workers), dropped
    // nothing, and made a flow per association on the backend that answered it.
    assert_eq!(after.rx - before.rx, delivered + back, "rx");
    assert_eq!(after.tx - before.tx, delivered + back, "tx");
    assert_eq!(after.drops, before.drops, "drops");
    assert_new_flows(&s, &gw, family, "sctp", &per_backend);

    // Packets whose CRC32c fails are not given a valid one: dropped before any rewrite and
    // counted (`sctp_checksum`), no flow made.
    let bad = run("corrupt", vip, PORT, 45_000, 4, 1).sent(&s);
    let dropped = wait_for(
        "the corrupt packets counted",
        Duration::from_secs(5),
        || {
            let n = dropped(&gw, "sctp_checksum");
            (n >= bad).then_some(n)
        },
    );
    assert_eq!(dropped, bad, "sctp_checksum drops");
    let last = books(&gw);
    assert_eq!(
        (last.rx - after.rx, last.tx, last.drops - after.drops),
        (bad, after.tx, bad),
        "rx, tx and drops after the corrupt packets"
    );
    assert_new_flows(&s, &gw, family, "sctp", &per_backend);
}

/// An SCTP packet's verification tag and chunks (what nat leaves alone), from its frame.
fn chunks(frame: &[u8]) -> (u32, Vec<u8>) {
    // IPv6 without extension headers, as the peers send it.
    let ihl = match frame[14] >> 4 {
        6 => 40,
        _ => usize::from(frame[14] & 0x0f) * 4,
    };
    let sctp = &frame[14 + ihl..];
    (
        u32::from_be_bytes(sctp[4..8].try_into().unwrap()),
        sctp[12..].to_vec(),
    )
}

#[test]
fn c_sctp_leaves_in_ipip_and_gue_with_the_inner_packet_and_its_crc32c_intact() {
    let Some(s) = scenario("sc", &["--backends", "2"]) else {
        return;
    };
    // This kernel cannot decapsulate either tunnel: only the packets on the backends' wire
    // are checked. No tunnel source is configured: the gateway takes its own address on
    // the backend-facing interface.
    let cfg = with_sctp(
        &s,
        &V4,
        80,
        &[
            ("ipip", PORT, "dsr-ipip", PORT),
            ("gue", PORT + 1, "dsr-gue", PORT + 1),
        ],
    );
    let gw = start(&s, &cfg);
    let before = books(&gw);
    let (mut caps, pcaps): (Vec<Capture>, Vec<PathBuf>) = [
        ("client", format!("sctp and dst host {VIP}")),
        ("b1", "ip proto 4 or udp port 6080".to_owned()),
        ("b2", "ip proto 4 or udp port 6080".to_owned()),
    ]
    .iter()
    .map(|(r, filter)| capture(&s, r, "tunnel", filter))
    .unzip();
    const ASSOCS: usize = 12;
    const DATA: usize = 2;
    let sent_n = while_capturing(&mut caps, || {
        let n = run("send", VIP, PORT, 42_000, ASSOCS, DATA).sent(&s)
            + run("send", VIP, PORT + 1, 43_000, ASSOCS, DATA).sent(&s);
        await_frames(&pcaps[..1], n);
        await_frames(&pcaps[1..], n);
        n
    });
    let after = books(&gw);
    let mut sent = sent_packets(&pcaps[0]);
    assert_eq!(
        sent.values().sum::<usize>() as u64,
        sent_n,
        "the client's capture"
    );

    let fields = [FIELDS, &["ip.proto"]].concat();
    let (mut ipip, mut gue) = (0u64, 0u64);
    let mut backends = BTreeSet::new();
    let mut outer: BTreeMap<String, String> = BTreeMap::new();
    for (i, pcap) in pcaps[1..].iter().enumerate() {
        let role = format!("b{}", i + 1);
        let ip = s.backend_ip(&role);
        let mac = s.backend(&role)["mac"].as_str().unwrap().to_owned();
        for (f, bytes) in decode(pcap, &fields, Some("udp.port==6080,ip"))
            .iter()
            .zip(frames(pcap))
        {
            let at = format!("{role}: {f:?}");
            assert_clean(f, &at);
            // Outer and inner headers come `,`-joined, outer first.
            let src: Vec<&str> = f["ip.src"].split(',').collect();
            let dst: Vec<&str> = f["ip.dst"].split(',').collect();
            assert_eq!(
                (f["eth.src"].as_str(), f["eth.dst"].as_str()),
                (GW_MAC, mac.as_str()),
                "{at}"
            );
            assert_eq!(
                dst,
                [ip.as_str(), VIP],
                "outer to the backend, inner to the VIP: {at}"
            );
            // The outer source is the tunnel source (192.0.2.1, the gateway's first address on
            // the backend-facing interface) with its low byte from the flow's hash: the same
            // for every packet of an association.
            assert!(
                src[0].starts_with("192.0.2.") && src[1] == CLIENT,
                "outer from the gateway, inner from the client: {at}"
            );
            let sport = f["sctp.srcport"].clone();
            let first = outer.entry(sport).or_insert_with(|| src[0].to_owned());
            assert_eq!(first, src[0], "outer source within an association: {at}");
            // The inner packet is the client's, byte for byte, at the end of the frame.
            let inner = sent
                .iter_mut()
                .find(|(p, n)| **n > 0 && bytes.ends_with(p))
                .unwrap_or_else(|| panic!("{at}: the inner packet is not one the client sent"));
            *inner.1 -= 1;
            match (f["ip.proto"].as_str(), f["sctp.dstport"].as_str()) {
                ("4,132", "7777") => ipip += 1,
                ("17,132", "7778") => {
                    assert_eq!(f["udp.dstport"], "6080", "{at}");
                    gue += 1;
                }
                other => panic!("unexpected {other:?}: {at}"),
            }
            backends.insert(role.clone());
        }
    }
    let n = (ASSOCS * (1 + DATA)) as u64;
    assert_eq!((ipip, gue), (n, n), "frames per tunnel");
    eprintln!("{ipip} SCTP frames in IPIP and {gue} in GUE, on {backends:?}");
    assert_eq!(backends.len(), 2, "both backends reached: {backends:?}");
    assert_eq!(after.tx - before.tx, ipip + gue, "tx");
    assert_eq!(after.rx - before.rx, sent_n, "rx");
    assert_eq!(after.drops, before.drops, "drops");
}

/// A Service of protocol SCTP from Kubernetes (the fake API server), in `nat`: the gateway
/// gives it a pool address and writes its status, and associations to that address reach
/// the pods (the backends' SCTP answerers on 17777) and are answered through the gateway.
#[test]
fn d_an_sctp_service_from_kubernetes_is_served_in_nat() {
    let pool = "203.0.113.40/29";
    let Some(s) = scenario("sd", &["--topology", "two-arm", "--backends", "2"]) else {
        return;
    };
    let fake = FakeApi::start_in_netns(&s.ns("gw"));
    for (i, b) in ["b1", "b2"].iter().enumerate() {
        fake.apply(node(&format!("n{}", i + 1), &s.backend_ip(b)));
    }
    // The testbed's gateway settings without its services: they come from Kubernetes.
    let gateway = s.gateway_config();
    let mut cmd = Gateway::command(&s, &gateway);
    cmd.args(["--kube", "--kubeconfig"])
        .arg(fake.kubeconfig(s.dir.path()))
        .args(["--kube-mode", "nat", "--kube-pool", pool]);
    let gw = Gateway::spawn(&s, cmd, Gateway::healthy);
    let pods: Vec<Value> = ["b1", "b2"]
        .iter()
        .enumerate()
        .map(|(i, b)| {
            json!({
                "addresses": [s.backend_ip(b)], "nodeName": format!("n{}", i + 1),
                "conditions": { "ready": true, "serving": true, "terminating": false }
            })
        })
        .collect();
    fake.apply(json!({
        "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": "assoc-1", "namespace": "default",
            "labels": { "kubernetes.io/service-name": "assoc" }
        },
        "addressType": "IPv4",
        "ports": [{ "name": "sctp", "port": NAT_PORT, "protocol": "SCTP" }],
        "endpoints": pods
    }));
    fake.create(json!({
        "kind": "Service", "apiVersion": "v1",
        "metadata": { "name": "assoc", "namespace": "default" },
        "spec": {
            "type": "LoadBalancer",
            "loadBalancerClass": CLASS,
            "selector": { "app": "assoc" },
            "ports": [{ "name": "sctp", "port": PORT, "targetPort": NAT_PORT, "protocol": "SCTP" }]
        }
    }));
    let vip = wait_for(
        "the Service's status.loadBalancer.ingress",
        Duration::from_secs(10),
        || {
            let svc = fake.get(Res::Services, "default", "assoc")?;
            svc["status"]["loadBalancer"]["ingress"][0]["ip"]
                .as_str()
                .map(str::to_owned)
        },
    );
    // /services shows it: SCTP, nat, the two pods at 17777.
    let service = wait_for("the Service in /services", Duration::from_secs(5), || {
        let v = gw.services()?;
        v["services"]
            .as_array()?
            .iter()
            .find(|x| {
                x["vip"] == vip.as_str()
                    && x["port"] == PORT
                    && x["backends"].as_array().is_some_and(|b| b.len() == 2)
            })
            .cloned()
    });
    assert_eq!(
        (service["protocol"].as_str(), service["mode"].as_str()),
        (Some("sctp"), Some("nat")),
        "{service:#}"
    );
    let _servers = serve_sctp(&s, NAT_PORT);
    let a = run("assoc", &vip, PORT, 44_000, 16, 1).assocs(&s);
    let per_backend = a.per_backend(16, 2);
    let name = service["name"].as_str().expect("service name");
    assert_new_flows(&s, &gw, &V4, name, &per_backend);
}

/// Associations stay on their backend when the backend set changes under them (the flow
/// table, not Maglev alone, decides for SCTP as for TCP), and the new backend takes new
/// associations.
#[test]
fn e_associations_keep_their_backend_across_a_reload_adding_one() {
    let Some(s) = scenario("se", &["--backends", "4"]) else {
        return;
    };
    // Start with b4 out of the SCTP service; the full configuration waits in the wings.
    let full = s.dir.join("full.toml");
    std::fs::copy(
        with_sctp(&s, &V4, 80, &[("sctp", PORT, "dsr-l2", PORT)]),
        &full,
    )
    .unwrap();
    let b4 = s.backend("b4");
    let b4_entry = format!(
        "[[services.backends]]\naddress = \"{}\"\nport = {PORT}\nmac = \"{}\"\n",
        b4["ipv4"].as_str().unwrap(),
        b4["mac"].as_str().unwrap()
    );
    let text = std::fs::read_to_string(&full).unwrap();
    let (web, sctp) = text.split_at(text.rfind("\n[[services]]").unwrap());
    assert!(sctp.contains(&b4_entry), "b4 in the SCTP service:\n{sctp}");
    std::fs::write(s.config(), format!("{web}{}", sctp.replace(&b4_entry, ""))).unwrap();
    let gw = start(&s, &s.config());
    let _servers = serve_sctp(&s, PORT);
    const ASSOCS: usize = 30;
    let first = run("assoc", VIP, PORT, 46_000, ASSOCS, 1).assocs(&s);
    first.per_backend(ASSOCS, 3);

    // Adding b4 hands it about a quarter of Maglev's slots: without the flow table, some
    // of the 30 associations would now hash to it.
    e2e::reload(&gw, &s, &full);
    let again = run("data", VIP, PORT, 46_000, ASSOCS, 2).assocs(&s);
    again.per_backend(ASSOCS, 3);
    let moved: Vec<_> = first
        .by_port
        .iter()
        .filter(|(p, (who, _))| again.by_port[p].0 != *who)
        .map(|(p, (who, _))| format!("{p}: {who:?} -> {:?}", again.by_port[p].0))
        .collect();
    assert!(moved.is_empty(), "associations moved on reload: {moved:?}");

    // New associations use b4 too, and the flows made match who answered.
    let fresh = run("assoc", VIP, PORT, 47_000, ASSOCS, 1).assocs(&s);
    let per = fresh.per_backend(ASSOCS, 4);
    let mut all = first.per_backend(ASSOCS, 3);
    for (b, n) in per {
        *all.entry(b).or_default() += n;
    }
    eprintln!("associations per backend, before and after adding b4: {all:?}");
    assert_new_flows(&s, &gw, &V4, "sctp", &all);
}
