//! `strait bench line-rate` on the real kernel: its three-namespace testbed, every system
//! brought up (Strait healthy, kube-proxy's rules loaded) and forwarding, and a tiny run
//! (one scale, 1 s per point) with the generator, the sink and `l2fwd`. Needs root; fails
//! with a clear message without it unless `STRAIT_SKIP_PRIVILEGED=1` (CI never sets it).
//!
//! The tests run one at a time: each one's forwarders busy-poll, and two runs on a
//! two-core machine would measure each other.

use std::process::{Command, Output};
use std::sync::Mutex;

use serde_json::Value;

const STRAIT: &str = env!("CARGO_BIN_EXE_strait");
static SERIAL: Mutex<()> = Mutex::new(());

#[path = "support/privileged.rs"]
mod gate;

fn privileged(test: &str) -> bool {
    gate::privileged(
        test,
        &[
            ("ip", "-V", "iproute2"),
            ("ethtool", "--version", "ethtool"),
            ("iptables-restore", "--version", "iptables"),
            ("nft", "--version", "nftables"),
            ("curl", "--version", "curl"),
            ("bash", "--version", "bash"),
        ],
    )
}

fn bench(args: &[&str]) -> Output {
    Command::new(STRAIT)
        .args(["bench", "line-rate"])
        .args(args)
        .output()
        .expect("running strait bench line-rate")
}

/// Namespaces whose name starts with `prefix-`.
fn namespaces(prefix: &str) -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .map(str::to_owned)
        .collect()
}

fn explain(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Every system at two scales: the topology comes up, Strait answers `/healthz`, the
/// kernel holds one rule set per service, and datagrams to the services reach the sink
/// through each forwarder; afterwards no namespace is left.
#[test]
fn every_system_comes_up_and_forwards() {
    if !privileged("line-rate set-up") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let prefix = format!("lrs{}", std::process::id() % 100_000);
    let out = bench(&["--setup-only", "--services", "10,300", "--prefix", &prefix]);
    assert!(out.status.success(), "{}", explain(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let checked = err.matches("set up and checked").count();
    assert_eq!(checked, 1 + 4 * 2, "{}", explain(&out));
    // 10 services: each once, 5 datagrams each; 300: 16 targets.
    for system in ["strait-dsr-l2", "strait-nat", "iptables", "nftables"] {
        for (n, datagrams) in [(10, 50), (300, 80)] {
            let line =
                format!("{system} {n}: set up and checked, {datagrams} kernel datagrams forwarded");
            assert!(err.contains(&line), "no {line:?} in\n{}", explain(&out));
        }
    }
    assert_eq!(namespaces(&prefix), Vec::<String>::new());
}

/// A tiny run: one scale, 1 s per point, every system and both traffic types; the JSON
/// has the shape, every point delivered packets, and the chart is a PNG.
#[test]
fn a_tiny_run_measures_every_system() {
    if !privileged("line-rate smoke run") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let prefix = format!("lrq{}", std::process::id() % 100_000);
    let dir = std::env::temp_dir().join(format!("strait-line-rate-test-{prefix}"));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("line-rate.json");
    let png = dir.join("line-rate.png");
    let out = bench(&[
        "--services",
        "10",
        "--seconds",
        "1",
        "--prefix",
        &prefix,
        "--json",
        json.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
    ]);
    assert_eq!(namespaces(&prefix), Vec::<String>::new());
    assert!(out.status.success(), "{}", explain(&out));
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    check_report(&report, &out);
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("ipvs: kube-proxy's ipvs mode"), "{table}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn check_report(r: &Value, out: &Output) {
    assert!(r["machine"].as_str().is_some_and(|m| !m.is_empty()), "{r}");
    assert!(r["date"].as_str().is_some_and(|d| d.ends_with('Z')), "{r}");
    assert!(r.get("incomplete").is_none(), "{r}");
    let results = r["results"].as_array().expect("results");
    let mut seen = Vec::new();
    for p in results {
        let system = p["system"].as_str().expect("system");
        let traffic = p["traffic"].as_str().expect("traffic");
        let services = p["services"].as_u64().expect("services");
        assert!(
            [
                "strait-dsr-l2",
                "strait-nat",
                "iptables",
                "nftables",
                "limit"
            ]
            .contains(&system),
            "{p}"
        );
        assert!(["new-flows", "established"].contains(&traffic), "{p}");
        assert_eq!(services, if system == "limit" { 0 } else { 10 }, "{p}");
        let mpps = p["delivered_mpps"].as_f64().expect("delivered_mpps");
        assert!(mpps > 0.0, "nothing delivered: {p}\n{}", explain(out));
        let loss = p["loss_pct"].as_f64().expect("loss_pct");
        assert!((0.0..=100.0).contains(&loss), "{p}");
        assert!(p["p99_us"].is_f64() || p["p99_us"].is_null(), "{p}");
        // Probes are taken off; a few stray frames (none expected) would not matter.
        assert!(
            p["received"].as_u64().unwrap() <= p["sent"].as_u64().unwrap() + 10,
            "{p}"
        );
        seen.push((system.to_owned(), traffic.to_owned()));
    }
    seen.sort();
    let mut want: Vec<(String, String)> = [
        "iptables",
        "limit",
        "nftables",
        "strait-dsr-l2",
        "strait-nat",
    ]
    .iter()
    .flat_map(|s| {
        ["established", "new-flows"]
            .iter()
            .map(move |t| ((*s).to_owned(), (*t).to_owned()))
    })
    .collect();
    want.sort();
    assert_eq!(seen, want);
    let limit = results
        .iter()
        .find(|p| p["system"] == "limit")
        .expect("a limit point");
    let pct = limit["pct_of_limit"].as_f64().expect("pct_of_limit");
    assert!((pct - 100.0).abs() < 1e-9, "{limit}");
}
