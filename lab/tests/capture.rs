//! `strait capture` end to end: the testbed, the real gateway, `strait capture` against its
//! admin API, and tshark reading what it wrote. Needs root; fails with a clear message
//! without it unless `STRAIT_SKIP_PRIVILEGED=1` (CI never sets it).
//!
//! What is checked: a forwarded SYN appears as received and as sent with its verdict
//! (dsr-l2: the same IP packet to the backend's MAC; nat: the destination rewritten to the
//! backend), a frame with a broken IPv4 header checksum and a frame from outside a service's
//! source ranges appear with their drop reasons, `-w - | tshark -r -` works, and a capture
//! started, interrupted (Ctrl-C) and abandoned (the client killed) under load loses no
//! packet, keeps every core's books (`rx == tx + pass + handoff + drops`) and leaves the
//! workers disarmed.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::Duration;

use support::bed::{Gateway, CLIENT};
use support::e2e::{self, start, write_config, Driver, Scenario, VIP};
use support::harness::{in_ns, run, strait, text, wait_for, Proc};

/// The serial lock and an AF_XDP testbed of `strait testbed up ARGS..`, if the tests may run.
fn scenario(tag: &str, args: &[&str]) -> Option<Scenario> {
    e2e::scenario(Driver::AfXdp, tag, args)
}

/// `strait capture ARGS.. -w FILE` in the gateway namespace, running.
fn capture(s: &Scenario, args: &[&str], file: &Path) -> Proc {
    let mut c = in_ns(&s.ns("gw"), [strait(), "capture"]);
    c.args(args).arg("-w").arg(file);
    Proc::spawn(c.stdout(Stdio::null()).stderr(Stdio::piped()))
}

/// Whether the gateway says a capture runs.
fn armed(gw: &Gateway) -> bool {
    gw.metric("strait_capture_armed") == Some(1.0)
}

/// Waits until the gateway says a capture runs (or does not).
fn wait_armed(gw: &Gateway, want: bool) {
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
fn fields(file: &Path, fields: &[&str]) -> Vec<Vec<String>> {
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
fn rows(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect()
}

/// A TCP SYN from the client to VIP:`port` in a frame from `src` to `dst`, its IPv4 header
/// checksum broken, as hex.
fn broken_syn(src: [u8; 6], dst: [u8; 6], sport: u16, port: u16) -> String {
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
fn mac_of(s: &Scenario, ns: &str, dev: &str) -> [u8; 6] {
    let t = s.must(ns, &["cat", &format!("/sys/class/net/{dev}/address")]);
    let v: Vec<u8> = t
        .trim()
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).unwrap())
        .collect();
    v.try_into().unwrap()
}

/// The packet-comment rows (comment first) whose comment contains every one of `parts`.
fn with<'a>(rows: &'a [Vec<String>], parts: &[&str]) -> Vec<&'a Vec<String>> {
    rows.iter()
        .filter(|r| parts.iter().all(|p| r[0].contains(p)))
        .collect()
}

const FIELDS: [&str; 11] = [
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
fn syn_pair(rows: &[Vec<String>], port: &str) -> (Vec<String>, Vec<String>) {
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

#[test]
fn a_a_dsr_l2_capture_shows_the_syn_before_and_after_its_rewrite_and_drops_with_their_reasons() {
    let Some(s) = scenario("a", &["--backends", "2"]) else {
        return;
    };
    // A second service, on port 81, open only to 198.51.100.0/24: the client is outside.
    let cfg = write_config(&s, |t| {
        format!(
            "{t}\n[[services]]\nname = \"closed\"\nvip = \"{VIP}\"\nport = 81\nmode = \"dsr-l2\"\n\
             source_ranges = [\"198.51.100.0/24\"]\n\
             backends = [{{ address = \"198.51.100.11\", port = 81, mac = \"02:00:00:00:01:11\" }}]\n"
        )
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

#[test]
fn b_a_nat_capture_to_stdout_shows_the_destination_rewritten() {
    let Some(s) = scenario("b", &["--topology", "two-arm", "--backends", "2"]) else {
        return;
    };
    let gw = start(&s, &s.config());
    // `-w -` into tshark, which prints as the capture ends (after two frames).
    let pipeline = format!(
        "{} capture --port 80 --verdict tx --count 2 -w - | tshark -r - -T fields -E occurrence=f {}",
        strait(),
        FIELDS.map(|f| format!("-e {f}")).join(" ")
    );
    let tshark = Proc::spawn(
        in_ns(&s.ns("gw"), ["sh", "-c", &pipeline])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    wait_armed(&gw, true);
    let answer = s.curl(&format!("http://{VIP}/"));
    assert!(answer.is_ok(), "{answer:?}");
    let out = tshark.wait();
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_armed(&gw, false);
    let rows = rows(&text(&out.stdout));
    let (inn, out) = syn_pair(&rows, "80");
    assert_eq!(inn[3], VIP, "as received: to the VIP: {inn:?}");
    assert!(
        inn[0].starts_with("in core=0 port=veth-c verdict=tx service=web")
            && inn[0].contains("mode=nat"),
        "{inn:?}"
    );
    // nat: the destination rewritten to the backend, whose address the comment names.
    assert!(out[3].starts_with("198.51.100.1"), "{out:?}");
    assert_eq!(out[6], "8080", "{out:?}");
    assert_eq!(out[2], CLIENT, "the client's address kept: {out:?}");
    assert_eq!(
        out[0],
        format!(
            "out verdict=tx service=web backend={}:8080 mode=nat core=0 port=veth-b",
            out[3]
        )
    );
    // --count 2: two frames, each as received and as sent.
    assert_eq!(rows.len(), 4, "{rows:#?}");
}

/// Every core's books in one scrape: (core, rx, tx + pass + handoff + drops).
fn books(gw: &Gateway) -> Vec<(String, u64, u64)> {
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

#[test]
fn c_captures_started_and_stopped_under_load_lose_no_packet_and_keep_the_books() {
    let Some(s) = scenario("c", &["--backends", "2"]) else {
        return;
    };
    let gw = start(&s, &s.config());
    // Traffic: 4,000 UDP exchanges, one after the other, each waiting for its echo.
    let load = Proc::spawn(
        s.python(&["udp", VIP, "5353", "20000", "4000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    sleep(Duration::from_millis(700));
    // One capture interrupted by Ctrl-C (SIGINT) ...
    let file = s.dir.join("c.pcapng");
    let cap = capture(&s, &["--port", "5353"], &file);
    wait_armed(&gw, true);
    sleep(Duration::from_millis(700));
    cap.signal("INT");
    let out = cap.wait();
    assert!(
        out.status.success(),
        "strait capture: {}",
        text(&out.stderr)
    );
    wait_armed(&gw, false);
    // ... and one whose client is killed: the gateway disarms when it goes.
    let abandoned = capture(&s, &["--port", "5353"], &s.dir.join("c2.pcapng"));
    wait_armed(&gw, true);
    sleep(Duration::from_millis(300));
    abandoned.signal("KILL");
    let _ = abandoned.wait();
    wait_armed(&gw, false);

    let report = text(&load.wait().stdout);
    assert!(
        report.contains("sent=4000 answered=4000"),
        "packets lost while capturing: {report}"
    );
    let rows = fields(&file, &FIELDS);
    let taken = with(&rows, &["in core=0 port=veth-gw verdict=tx service=echo"]).len();
    assert!(taken > 0, "nothing captured under load:\n{rows:#?}");
    assert!(
        rows.iter().all(|r| r[0].contains("service=echo")),
        "{rows:#?}"
    );
    // The books balance on every core, captures or not.
    sleep(Duration::from_millis(500));
    for (core, rx, out) in books(&gw) {
        assert_eq!(
            rx, out,
            "core {core}: rx {rx} != tx + pass + handoff + drops {out}"
        );
    }
}
