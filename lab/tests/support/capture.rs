//! What `strait capture`'s end-to-end tests share (`lab/tests/capture.rs` on AF_XDP,
//! `lab/tests/dpdk.rs` on DPDK ports): running the client against the testbed's gateway and
//! reading what it wrote with tshark.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::bed::{Gateway, CLIENT};
use super::config::ServiceToml;
use super::e2e::{scenario, start, write_config, Driver, Scenario, VIP};
use super::harness::{in_ns, run, strait, text, wait_for, Proc};

/// `strait capture ARGS.. -w FILE` in the gateway namespace, running.
pub fn capture(s: &Scenario, args: &[&str], file: &Path) -> Proc {
    let mut c = in_ns(&s.ns("gw"), [strait(), "capture"]);
    c.args(args).arg("-w").arg(file);
    Proc::spawn(c.stdout(Stdio::null()).stderr(Stdio::piped()))
}

/// Whether the gateway says a capture runs.
pub fn armed(gw: &Gateway) -> bool {
    gw.metric("strait_capture_armed") == Some(1.0)
}

/// Waits until the gateway says a capture runs (or does not).
pub fn wait_armed(gw: &Gateway, want: bool) {
    wait_for(
        if want {
            "the capture armed"
        } else {
            "the capture disarmed"
        },
        Duration::from_secs(5),
        || (armed(gw) == want).then_some(()),
    );
}

/// `fields` of every packet of a pcapng file, as tshark decodes them.
pub fn fields(file: &Path, fields: &[&str]) -> Vec<Vec<String>> {
    let mut c = Command::new("tshark");
    c.arg("-r")
        .arg(file)
        .args(["-T", "fields", "-E", "occurrence=f"]);
    for f in fields {
        c.args(["-e", f]);
    }
    let out = run(&mut c);
    assert!(
        out.status.success(),
        "tshark could not read {}: {}",
        file.display(),
        text(&out.stderr)
    );
    rows(&text(&out.stdout))
}

/// tshark's tab-separated lines, split.
pub fn rows(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

/// A TCP SYN from the client to VIP:`port` in a frame from `src` to `dst`, its IPv4 header
/// checksum broken, as hex.
pub fn broken_syn(src: [u8; 6], dst: [u8; 6], sport: u16, port: u16) -> String {
    let client: std::net::Ipv4Addr = CLIENT.parse().unwrap();
    let vip: std::net::Ipv4Addr = VIP.parse().unwrap();
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2(src, dst)
        .ipv4(client.octets(), vip.octets(), 64)
        .tcp(sport, port, 1, 65535)
        .syn()
        .write(&mut f, &[])
        .unwrap();
    f[14 + 10] ^= 0x5a;
    f.iter().map(|b| format!("{b:02x}")).collect()
}

/// A MAC as `ip` prints it, as bytes.
pub fn mac_of(s: &Scenario, ns: &str, dev: &str) -> [u8; 6] {
    let t = s.must(ns, &["cat", &format!("/sys/class/net/{dev}/address")]);
    let v: Vec<u8> = t
        .trim()
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).unwrap())
        .collect();
    v.try_into().unwrap()
}

/// The packet-comment rows (comment first) whose comment contains every one of `parts`.
pub fn with<'a>(rows: &'a [Vec<String>], parts: &[&str]) -> Vec<&'a Vec<String>> {
    rows.iter()
        .filter(|r| parts.iter().all(|p| r[0].contains(p)))
        .collect()
}

pub const FIELDS: [&str; 11] = [
    "frame.comment",
    "eth.dst",
    "ip.src",
    "ip.dst",
    "ip.id",
    "tcp.srcport",
    "tcp.dstport",
    "tcp.flags.syn",
    "tcp.flags.ack",
    "tcp.seq_raw",
    "frame.packet_flags_direction",
];

/// The SYN of the client's connection from `sport` as received (`in`) and as sent (`out`):
/// the rows of the first SYN (no ACK) to `port` whose copy as sent follows it.
pub fn syn_pair(rows: &[Vec<String>], port: &str) -> (Vec<String>, Vec<String>) {
    let i = rows
        .iter()
        .position(|r| {
            r[0].starts_with("in ") && r[6] == port && r[7] == "1" && r[8] == "0" && r[2] == CLIENT
        })
        .unwrap_or_else(|| panic!("no SYN to port {port} captured as received:\n{rows:#?}"));
    let out = rows
        .get(i + 1)
        .filter(|r| r[0].starts_with("out ") && r[5] == rows[i][5] && r[9] == rows[i][9])
        .unwrap_or_else(|| panic!("the SYN's copy as sent does not follow it:\n{rows:#?}"));
    (rows[i].clone(), out.clone())
}

/// Every core's books in one scrape: (core, rx, tx + pass + handoff + drops).
pub fn books(gw: &Gateway) -> Vec<(String, u64, u64)> {
    let m = gw.get("/metrics");
    let of = |family: &str, core: &str| -> u64 {
        m.lines()
            .filter(|l| l.starts_with(&format!("{family}{{")))
            .filter(|l| l.contains(&format!("core=\"{core}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let cores: Vec<String> = m
        .lines()
        .filter(|l| l.starts_with("strait_rx_packets_total{"))
        .filter_map(|l| Some(l.split("core=\"").nth(1)?.split('"').next()?.to_owned()))
        .collect();
    assert!(!cores.is_empty(), "no per-core rx counters:\n{m}");
    cores
        .into_iter()
        .map(|c| {
            let out = of("strait_tx_packets_total", &c)
                + of("strait_pass_packets_total", &c)
                + of("strait_handoff_packets_total", &c)
                + of("strait_dropped_packets_total", &c);
            let rx = of("strait_rx_packets_total", &c);
            (c, rx, out)
        })
        .collect()
}

/// A dsr-l2 capture on `driver`'s ports: the SYN before and after its rewrite, and drops
/// with their reasons (see `lab/tests/capture.rs`).
pub fn dsr_l2_verdicts(driver: Driver) {
    let Some(s) = scenario(driver, "q", &["--backends", "2"]) else {
        return;
    };
    // A second service, on port 81, open only to 198.51.100.0/24: the client is outside.
    let cfg = write_config(&s, |t| {
        let closed = ServiceToml::new("closed", VIP, 81)
            .mode("dsr-l2")
            .set("source_ranges", r#"["198.51.100.0/24"]"#)
            .backend_mac("198.51.100.11", 81, "02:00:00:00:01:11");
        format!("{t}\n{closed}")
    });
    let gw = start(&s, &cfg);
    let gw_mac = mac_of(&s, "gw", "veth-gw");
    let client_mac = mac_of(&s, "client", "eth0");
    let file = s.dir.join("a.pcapng");
    let cap = capture(&s, &["--client", CLIENT, "--duration", "4s"], &file);
    wait_armed(&gw, true);
    // A connection: its SYN is forwarded.
    let answer = s.curl(&format!("http://{VIP}/"));
    assert!(
        answer.is_ok(),
        "the service does not answer while captured: {answer:?}"
    );
    // A SYN to the closed service: dropped for its source.
    let _ = s.exec(
        "client",
        &[
            "curl",
            "-s",
            "--max-time",
            "1",
            &format!("http://{VIP}:81/"),
        ],
    );
    // A SYN with a broken IPv4 header checksum: dropped for it. The testbed's bridge must
    // not look at IP headers for that (br_netfilter drops such a frame before it reaches
    // the gateway, as no real switch does).
    s.must(
        "sw",
        &["sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=0"],
    );
    let bad = broken_syn(client_mac, gw_mac, 53001, 80);
    let out = s.python(&["raw", "eth0", &bad]).output().unwrap();
    assert_eq!(text(&out.stdout).trim(), "sent 1", "{}", text(&out.stderr));
    let out = cap.wait();
    assert!(
        out.status.success(),
        "strait capture: {}",
        text(&out.stderr)
    );
    wait_armed(&gw, false);

    let rows = fields(&file, &FIELDS);
    let (inn, out) = syn_pair(&rows, "80");
    let gw_text = s.must("gw", &["cat", "/sys/class/net/veth-gw/address"]);
    assert_eq!(inn[1], gw_text.trim(), "as received: to the gateway's MAC");
    assert!(
        inn[0].starts_with("in core=0 port=veth-gw verdict=tx service=web")
            && inn[0].contains("mode=dsr-l2"),
        "{inn:?}"
    );
    assert_eq!(inn[10], "0x00000001", "flagged inbound: {inn:?}");
    assert_eq!(out[10], "0x00000002", "flagged outbound: {out:?}");
    // dsr-l2: the same IP packet (addresses, id, ports, sequence), to the backend's MAC,
    // which the comment names.
    assert_eq!(
        inn[2..10],
        out[2..10],
        "the IP packet changed:\n{inn:?}\n{out:?}"
    );
    let backend = match out[1].as_str() {
        "02:00:00:00:01:11" => "198.51.100.11:80",
        "02:00:00:00:01:12" => "198.51.100.12:80",
        other => panic!("sent to {other}, no backend's MAC: {out:?}"),
    };
    assert_eq!(
        out[0],
        format!("out verdict=tx service=web backend={backend} mode=dsr-l2 core=0 port=veth-gw")
    );

    let checksum = with(&rows, &["verdict=drop reason=ipv4_header_checksum"]);
    assert_eq!(checksum.len(), 1, "{rows:#?}");
    assert_eq!(checksum[0][5], "53001", "{checksum:?}");
    assert!(
        checksum[0][0].starts_with("in core=0 port=veth-gw "),
        "{checksum:?}"
    );

    let closed = with(
        &rows,
        &["verdict=drop reason=source_not_allowed service=closed"],
    );
    assert!(!closed.is_empty(), "{rows:#?}");
    assert!(
        closed.iter().all(|r| r[6] == "81" && r[2] == CLIENT),
        "{closed:?}"
    );
    assert!(
        !rows
            .iter()
            .any(|r| r[0].starts_with("out ") && r[6] == "81"),
        "a dropped frame was sent"
    );

    let m = gw.get("/metrics");
    assert!(
        m.lines()
            .any(|l| l.starts_with("strait_capture_frames_total{")
                && l.contains("result=\"captured\"")
                && !l.ends_with(" 0")),
        "{m}"
    );
}
