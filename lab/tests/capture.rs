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
use std::process::Stdio;
use std::thread::sleep;
use std::time::Duration;

use support::bed::CLIENT;
use support::capture::{books, capture, fields, rows, syn_pair, wait_armed, with, FIELDS};
use support::e2e::{self, start, Driver, Scenario, VIP};
use support::harness::{in_ns, strait, text, wait_for, Proc, PYTHON};

/// The serial lock and an AF_XDP testbed of `strait testbed up ARGS..`, if the tests may run.
fn scenario(tag: &str, args: &[&str]) -> Option<Scenario> {
    e2e::scenario(Driver::AfXdp, tag, args)
}

#[test]
fn a_a_dsr_l2_capture_shows_the_syn_before_and_after_its_rewrite_and_drops_with_their_reasons() {
    support::capture::dsr_l2_verdicts(Driver::AfXdp);
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

#[test]
fn c_captures_started_and_stopped_under_load_lose_no_packet_and_keep_the_books() {
    let Some(s) = scenario("c", &["--backends", "2"]) else {
        return;
    };
    let gw = start(&s, &s.config());
    // Traffic until the test says stop: rounds of 2,000 UDP exchanges, one after the other,
    // each waiting for its echo (a lost one shows as a round not all answered).
    let stop = s.dir.join("stop");
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/client.py");
    let rounds = format!(
        "while [ ! -e {} ]; do {PYTHON} {} udp {VIP} 5353 20000 2000; done",
        stop.display(),
        client.display()
    );
    let mut load = Proc::spawn(
        in_ns(&s.ns("client"), ["sh", "-c", &rounds])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let captured = || {
        gw.get("/metrics")
            .lines()
            .filter(|l| l.starts_with("strait_capture_frames_total{") && l.contains("captured"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>()
    };
    // One capture interrupted by Ctrl-C (SIGINT) once it has taken frames ...
    let file = s.dir.join("c.pcapng");
    let cap = capture(&s, &["--port", "5353"], &file);
    wait_armed(&gw, true);
    wait_for("frames captured", Duration::from_secs(10), || {
        (captured() > 0).then_some(())
    });
    sleep(Duration::from_millis(300));
    cap.signal("INT");
    let out = cap.wait();
    assert!(
        out.status.success(),
        "strait capture: {}",
        text(&out.stderr)
    );
    wait_armed(&gw, false);
    // ... and one whose client is killed: the gateway disarms when it goes.
    let before = captured();
    let abandoned = capture(&s, &["--port", "5353"], &s.dir.join("c2.pcapng"));
    wait_armed(&gw, true);
    wait_for("frames captured", Duration::from_secs(10), || {
        (captured() > before).then_some(())
    });
    abandoned.signal("KILL");
    let _ = abandoned.wait();
    wait_armed(&gw, false);
    assert!(
        load.child().try_wait().unwrap().is_none(),
        "the traffic stopped before the captures did: not under load"
    );
    std::fs::write(&stop, b"").unwrap();
    let report = text(&load.wait().stdout);
    let lines: Vec<&str> = report.lines().collect();
    assert!(
        !lines.is_empty() && lines.iter().all(|l| *l == "sent=2000 answered=2000"),
        "packets lost while capturing:\n{report}"
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
