//! Endpoint churn under requests, the CI form: `strait-lab bench churn`
//! for one minute at the full rate (1,000 changes a minute), through SIGHUP reloads and
//! through the Kubernetes path (the fake API server), each on its own testbed. No request
//! may fail (every removal drains first); every check that the gateway shows the endpoints
//! written, moved its table generation on and holds them in its steering maps must pass;
//! the gateway's descriptors stay flat and its memory grows by little. And the cause of the
//! one request the 10-minute runs used to lose, made on purpose: a client port reused while
//! the closed connection's flow entry lingers must not pin the new connection to a backend
//! that has begun draining. Needs root; fails with a clear message without it unless
//! `STRAIT_SKIP_PRIVILEGED=1`.

mod support;

use serde_json::Value;
use support::bed::Bed;
use support::e2e::{counter, reload, scenario, start, write_config, Driver};
use support::harness::{in_ns, must, namespaces, run, serial_if, strait, text, LAB, PYTHON};
use support::privileged as gate;

fn privileged() -> bool {
    gate::privileged("churn", &[gate::IP])
}

fn prefix(tag: &str) -> String {
    format!("ch{}{tag}", std::process::id() % 100_000)
}

/// Memory growth allowed over a one-minute churn after 20 s of warm-up, percent. The soak
/// holds the gateway to 1 % over longer runs; one minute of 1,000 reloads on a loaded
/// machine gets some room for the allocator's high-water mark.
const RSS_GROWTH_MAX_PCT: f64 = 5.0;

/// Runs `bench churn ARGS` under a testbed guard; its JSON report. Checks that the bench
/// left no namespace.
fn bench(p: &str, args: &[&str]) -> Value {
    let guard = Bed::guard(p);
    let json = guard.dir.join("report.json");
    let out = run(std::process::Command::new(LAB)
        .env("STRAIT_BIN", strait())
        .args(["bench", "churn"])
        .args(args)
        .args(["--prefix", p, "--json"])
        .arg(&json));
    assert!(
        out.status.success(),
        "bench churn {args:?} failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    eprintln!("{}", text(&out.stderr));
    let report = serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON report"))
        .expect("JSON");
    let left = namespaces(p);
    drop(guard);
    assert!(left.is_empty(), "the bench left namespaces: {left:?}");
    report
}

fn assert_followed(r: &Value) {
    let n = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
    assert_eq!(
        n("requests_failed"),
        0.0,
        "failed requests: {}",
        r["failures"]
    );
    assert!(
        n("requests") >= 1000.0,
        "too few requests to tell: {}",
        n("requests")
    );
    assert!(
        r["checks_failed"].as_array().is_some_and(Vec::is_empty),
        "the gateway did not follow: {}",
        r["checks_failed"]
    );
    assert!(n("checks") >= 10.0, "{} checks", n("checks"));
    assert!(
        n("changes_per_minute") >= 950.0,
        "the rate was not held: {} changes a minute",
        n("changes_per_minute")
    );
    assert!(
        n("generation_last") >= n("generation_first") + n("checks") - 1.0,
        "generation {} -> {} over {} checks",
        n("generation_first"),
        n("generation_last"),
        n("checks")
    );
    assert!(
        n("fds_floor_rise") <= 0.0,
        "descriptors leak (their floor rose by {}): {}",
        n("fds_floor_rise"),
        r["samples"]
    );
    assert!(
        n("rss_growth_pct") <= RSS_GROWTH_MAX_PCT,
        "memory grew {} % after the warm-up: {}",
        n("rss_growth_pct"),
        r["samples"]
    );
}

#[test]
fn a_thousand_reloads_a_minute_fail_no_request_and_the_maps_follow() {
    let Some(_serial) = serial_if(privileged) else {
        return;
    };
    let r = bench(
        &prefix("r"),
        &["--via", "reload", "--minutes", "1", "--warmup", "20"],
    );
    assert_followed(&r);
}

#[test]
fn a_thousand_endpoint_slice_changes_a_minute_fail_no_request_and_the_maps_follow() {
    let Some(_serial) = serial_if(privileged) else {
        return;
    };
    let r = bench(
        &prefix("k"),
        &["--via", "kube", "--minutes", "1", "--warmup", "20"],
    );
    assert_followed(&r);
}

/// One HTTP request from the client namespace to the VIP from source port `port` (bound with
/// `SO_REUSEADDR`, as a client reusing its port does); the answering backend's name.
fn get_from_port(bed: &Bed, port: u16) -> String {
    let script = format!(
        r#"
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {port}))
s.settimeout(4)
s.connect(("{vip}", 80))
s.sendall(b"GET / HTTP/1.0\r\nHost: vip\r\n\r\n")
data = b""
while True:
    c = s.recv(4096)
    if not c:
        break
    data += c
s.close()
body = data.split(b"\r\n\r\n", 1)[1].decode()
print(body.split()[0])
"#,
        vip = strait_lab::testbed::VIP4,
    );
    let out = must(&mut in_ns(&bed.ns("client"), [PYTHON, "-c", &script]));
    out.trim()
        .strip_prefix("backend=")
        .unwrap_or_else(|| panic!("not a backend's answer: {out:?}"))
        .to_owned()
}

/// The churn's lost request, made on purpose: a client reuses its source port for a new
/// connection while the gateway still holds the closed connection's flow entry (closing,
/// 10 s), whose backend has just begun draining. The new connection is a new flow and must
/// not go to the draining backend (which the churn removes 5 s later, cutting it).
#[test]
fn a_reused_client_port_does_not_reach_a_draining_backend() {
    let Some(s) = scenario(
        Driver::AfXdp,
        "p",
        &["--topology", "two-arm", "--backends", "2"],
    ) else {
        return;
    };
    let gw = start(&s, &s.config());
    let port = 47_001;
    let first = get_from_port(&s, port);
    let addr = match first.as_str() {
        "b1" => "198.51.100.11",
        "b2" => "198.51.100.12",
        other => panic!("answered by {other}"),
    };
    let drained = write_config(&s, |t| {
        t.replacen(
            &format!("address = \"{addr}\"\n"),
            &format!("address = \"{addr}\"\nstate = \"draining\"\n"),
            1,
        )
    });
    reload(&gw, &s, &drained);
    let second = get_from_port(&s, port);
    assert_ne!(
        second, first,
        "a new connection from a reused port went to draining {first}"
    );
    assert!(
        counter(&gw, "strait_flows_reopened_total") >= 1,
        "the reused port's connection was not counted as reopened"
    );
}
