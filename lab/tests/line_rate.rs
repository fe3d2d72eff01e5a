//! `strait bench line-rate` on the real kernel: its three-namespace testbed, every system
//! brought up (Strait healthy, kube-proxy's rules loaded) and forwarding, and a tiny run
//! (one scale, 1 s per point) with the generator, the sink and `l2fwd`. Needs root; fails
//! with a clear message without it unless `STRAIT_SKIP_PRIVILEGED=1` (CI never sets it).
//!
//! The tests run one at a time: each one's forwarders busy-poll, and two runs on a
//! two-core machine would measure each other.

mod support;

use std::collections::BTreeSet;
use std::process::{Command, Output};
use std::sync::MutexGuard;

use serde_json::Value;
use support::harness::{namespaces, serial_if, text, Scratch, LAB};
use support::privileged as gate;

/// The serial lock, if test `test` may run (root and the tools the benchmark drives).
fn privileged(test: &str) -> Option<MutexGuard<'static, ()>> {
    serial_if(|| {
        gate::privileged(
            test,
            &[
                gate::IP,
                gate::ETHTOOL,
                gate::IPTABLES_RESTORE,
                gate::NFT,
                gate::CURL,
                gate::BASH,
            ],
        )
    })
}

/// The AF_XDP and kernel systems: every build has them (a `dpdk` build adds three more,
/// tested by `dpdk_rows_come_up_and_measure`).
const BASE_SYSTEMS: &str = "limit,strait-dsr-l2,strait-nat,iptables,nftables";

fn bench(args: &[&str]) -> Output {
    Command::new(LAB)
        .args(["bench", "line-rate"])
        .args(args)
        .output()
        .expect("running strait bench line-rate")
}

fn explain(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        text(&o.stdout),
        text(&o.stderr)
    )
}

/// Every system at two scales: the topology comes up, Strait answers `/healthz`, the
/// kernel holds one rule set per service, and datagrams to the services reach the sink
/// through each forwarder; afterwards no namespace is left.
#[test]
fn every_system_comes_up_and_forwards() {
    let Some(_serial) = privileged("line-rate set-up") else {
        return;
    };
    let prefix = format!("lrs{}", std::process::id() % 100_000);
    let out = bench(&[
        "--setup-only",
        "--services",
        "10,300",
        "--systems",
        BASE_SYSTEMS,
        "--prefix",
        &prefix,
    ]);
    assert!(out.status.success(), "{}", explain(&out));
    let err = text(&out.stderr);
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
    assert_eq!(namespaces(&prefix), BTreeSet::new());
}

/// A tiny run: one scale, 1 s per point, every system and both traffic types; the JSON
/// has the report's shape, every point delivered packets and has its CPU cost per packet
/// (positive and finite, with its parts; the ratios between systems are too noisy at 1 s to
/// assert on) and the AF_XDP systems' XDP program's own run time per packet
/// (`xdp_ns_per_packet`, the steering program's for Strait), the chart is a PNG, and
/// `kernel.bpf_stats_enabled` is back as it was.
#[test]
fn a_tiny_run_measures_every_system() {
    let Some(_serial) = privileged("line-rate smoke run") else {
        return;
    };
    let prefix = format!("lrq{}", std::process::id() % 100_000);
    let dir = Scratch::new(&format!("strait-line-rate-test-{prefix}"));
    let json = dir.join("line-rate.json");
    let png = dir.join("line-rate.png");
    let bpf_stats = || std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").unwrap();
    let stats_before = bpf_stats();
    let out = bench(&[
        "--services",
        "10",
        "--seconds",
        "1",
        "--systems",
        BASE_SYSTEMS,
        "--prefix",
        &prefix,
        "--json",
        json.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
    ]);
    assert_eq!(namespaces(&prefix), BTreeSet::new());
    assert_eq!(
        bpf_stats(),
        stats_before,
        "kernel.bpf_stats_enabled not restored"
    );
    assert!(out.status.success(), "{}", explain(&out));
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    check_report(&report, &out);
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let table = text(&out.stdout);
    assert!(table.contains("ipvs: kube-proxy's ipvs mode"), "{table}");
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
        check_cpu(p, out);
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

/// A positive, finite number.
fn positive(p: &Value, v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {p}"));
    assert!(x.is_finite() && x > 0.0, "{what} = {x}: {p}");
    x
}

/// A point's CPU cost per packet: the total and its parts by the system's method, and the
/// ratios to the kernel peers where they compare (every system with services).
fn check_cpu(p: &Value, out: &Output) {
    let system = p["system"].as_str().unwrap();
    let total = positive(p, &p["cpu_ns_per_packet"], "cpu_ns_per_packet");
    // Above a nanosecond and below the 1 s of the point: a unit slip would leave this range.
    assert!(total > 1.0 && total < 1e9, "{p}\n{}", explain(out));
    let c = &p["cpu"];
    for k in [
        "softirq_ns_per_packet",
        "irq_ns_per_packet",
        "system_ns_per_packet",
    ] {
        let v = c[k].as_f64().unwrap_or_else(|| panic!("cpu.{k}: {p}"));
        assert!(v.is_finite() && v >= 0.0, "cpu.{k}: {p}");
    }
    if system == "iptables" || system == "nftables" {
        assert!(p["xdp_ns_per_packet"].is_null(), "no XDP program: {p}");
        assert_eq!(c["method"], "softirq+irq", "{p}");
        // The kernel forwards in the forwarder CPU's softirq (RPS sends it there).
        positive(p, &c["softirq_ns_per_packet"], "cpu.softirq_ns_per_packet");
    } else {
        assert_eq!(c["method"], "worker-busy+xdp", "{p}");
        let worker = positive(p, &c["worker_ns_per_packet"], "cpu.worker_ns_per_packet");
        let xdp = positive(p, &c["xdp_ns_per_packet"], "cpu.xdp_ns_per_packet");
        let per_run = positive(p, &c["xdp_ns_per_run"], "cpu.xdp_ns_per_run");
        // The program's own cost per packet it ran on (Strait: the steering program), shown
        // apart; one program run is far below a microsecond.
        let own_xdp = positive(p, &p["xdp_ns_per_packet"], "xdp_ns_per_packet");
        assert_eq!(own_xdp, per_run, "{p}");
        assert!(own_xdp < 10_000.0, "{p}");
        assert!((worker + xdp - total).abs() <= 1e-6 * total, "{p}");
        // The TX kicks are part of the busy time (copy mode: the kernel's transmit), and
        // what is left is the forwarder's own part.
        let kick = positive(p, &c["kick_ns_per_packet"], "cpu.kick_ns_per_packet");
        assert!(kick < worker, "{p}");
        let own = positive(p, &p["own_cpu_ns_per_packet"], "own_cpu_ns_per_packet");
        assert!((own + kick - total).abs() <= 1e-6 * total, "{p}");
    }
    if system == "limit" {
        assert!(p["cpu_ratio_to_iptables"].is_null(), "{p}");
        assert!(p["cpu_ratio_to_nftables"].is_null(), "{p}");
    } else {
        positive(p, &p["cpu_ratio_to_iptables"], "cpu_ratio_to_iptables");
        positive(p, &p["cpu_ratio_to_nftables"], "cpu_ratio_to_nftables");
        if system.starts_with("strait") {
            positive(
                p,
                &p["own_cpu_ratio_to_nftables"],
                "own_cpu_ratio_to_nftables",
            );
        }
    }
}

/// The DPDK rows (a `dpdk` build, and a `strait` built with DPDK beside `strait-lab`): set up
/// and checked at 10 services on `net_af_packet` ports (datagrams from the generator's
/// kernel reach the sink through the gateway's DPDK ports, its kernel answering ARP through
/// the exception TAP), then a tiny run on the default `net_af_xdp` ports: every point
/// delivered packets, its CPU per packet is the busy worker turns plus the PMD's XDP
/// program, the turn's burst out is timed apart as the kick, and `pct_of_limit` is over
/// `limit-dpdk`'s.
#[cfg(feature = "dpdk")]
#[test]
fn dpdk_rows_come_up_and_measure() {
    let Some(_serial) = privileged("line-rate DPDK rows") else {
        return;
    };
    let systems = "limit-dpdk,strait-dpdk-dsr-l2,strait-dpdk-nat";
    let prefix = format!("lrd{}", std::process::id() % 100_000);
    let out = bench(&[
        "--setup-only",
        "--dpdk-vdev",
        "af-packet",
        "--services",
        "10",
        "--systems",
        systems,
        "--prefix",
        &prefix,
    ]);
    assert!(out.status.success(), "{}", explain(&out));
    let err = text(&out.stderr);
    for system in ["strait-dpdk-dsr-l2", "strait-dpdk-nat"] {
        let line = format!("{system} 10: set up and checked, 50 kernel datagrams forwarded");
        assert!(err.contains(&line), "no {line:?} in\n{}", explain(&out));
    }
    assert_eq!(namespaces(&prefix), BTreeSet::new());

    let dir = Scratch::new(&format!("strait-line-rate-test-{prefix}"));
    let json = dir.join("line-rate.json");
    let out = bench(&[
        "--services",
        "10",
        "--seconds",
        "1",
        "--systems",
        systems,
        "--prefix",
        &prefix,
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(namespaces(&prefix), BTreeSet::new());
    assert!(out.status.success(), "{}", explain(&out));
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(r.get("incomplete").is_none(), "{r}");
    let results = r["results"].as_array().expect("results");
    let mut seen: Vec<String> = Vec::new();
    for p in results {
        let system = p["system"].as_str().expect("system");
        positive(p, &p["delivered_mpps"], "delivered_mpps");
        let total = positive(p, &p["cpu_ns_per_packet"], "cpu_ns_per_packet");
        assert!(total > 1.0 && total < 1e9, "{p}\n{}", explain(&out));
        // The default vdev, net_af_xdp: the worker's busy turns plus the PMD's XDP program,
        // as for the AF_XDP rows.
        let c = &p["cpu"];
        assert_eq!(c["method"], "worker-busy+xdp", "{p}");
        let worker = positive(p, &c["worker_ns_per_packet"], "cpu.worker_ns_per_packet");
        let xdp = positive(p, &c["xdp_ns_per_packet"], "cpu.xdp_ns_per_packet");
        assert!((worker + xdp - total).abs() <= 1e-6 * total, "{p}");
        // The turn's burst out (the PMD's sendto) is the kick, timed apart.
        let kick = positive(p, &c["kick_ns_per_packet"], "cpu.kick_ns_per_packet");
        let own = positive(p, &p["own_cpu_ns_per_packet"], "own_cpu_ns_per_packet");
        assert!(kick < worker, "{p}");
        assert!((own - (total - kick)).abs() <= 1e-6 * total, "{p}");
        let pct = positive(p, &p["pct_of_limit"], "pct_of_limit");
        if system == "limit-dpdk" {
            assert!((pct - 100.0).abs() < 1e-9, "{p}");
            assert_eq!(p["services"], 0, "{p}");
        }
        seen.push(format!("{system} {}", p["traffic"].as_str().unwrap()));
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "limit-dpdk established",
            "limit-dpdk new-flows",
            "strait-dpdk-dsr-l2 established",
            "strait-dpdk-dsr-l2 new-flows",
            "strait-dpdk-nat established",
            "strait-dpdk-nat new-flows"
        ]
    );
}
