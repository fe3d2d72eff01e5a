//! The soak, the CI form: `strait-lab bench soak --minutes 2`: mixed traffic (HTTP on new
//! connections, UDP from new sockets), 1,000 endpoint changes a minute and a health flap
//! every 30 s, sampled every 10 s. Resident memory grows by at most 1 % after the first
//! minute (the warm-up; what still grows after it is in docs/reliability.md, "Churn and
//! soak"), descriptors stay flat, the UMEM's frames add up in every sample and none is
//! lost at rest, the counters' identity is exact in every sample, and no request
//! fails outside a flap. Needs root; fails with a clear message without it unless
//! `STRAIT_SKIP_PRIVILEGED=1`.

mod support;

use serde_json::Value;
use support::bed::Bed;
use support::harness::{namespaces, run, serial_if, strait, text, LAB};
use support::privileged as gate;

fn privileged() -> bool {
    gate::privileged("soak", &[gate::IP])
}

#[test]
fn two_minutes_of_traffic_churn_and_flaps_leak_nothing() {
    let Some(_serial) = serial_if(privileged) else {
        return;
    };
    let p = format!("sk{}s", std::process::id() % 100_000);
    let guard = Bed::guard(&p);
    let json = guard.dir.join("soak.json");
    let out = run(std::process::Command::new(LAB)
        .env("STRAIT_BIN", strait())
        .args(["bench", "soak", "--minutes", "2", "--warmup", "60"])
        .args(["--prefix", &p, "--json"])
        .arg(&json));
    assert!(
        out.status.success(),
        "bench soak failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    eprintln!("{}", text(&out.stderr));
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON report"))
        .expect("JSON");
    let left = namespaces(&p);
    drop(guard);
    assert!(left.is_empty(), "the bench left namespaces: {left:?}");

    let n = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
    let samples = &r["samples"];
    assert!(
        samples.as_array().is_some_and(|s| s.len() >= 12),
        "a sample every 10 s: {samples}"
    );
    assert!(
        n("rss_growth_pct") <= 1.0,
        "memory grew {} %: {samples}",
        n("rss_growth_pct")
    );
    assert!(
        n("fds_floor_rise") <= 0.0,
        "descriptors leak (their floor rose by {}): {samples}",
        n("fds_floor_rise")
    );
    assert_eq!(n("frames_lost"), 0.0, "frames lost: {}", r["at_rest"]);
    assert_eq!(
        n("frames_unbalanced_samples"),
        0.0,
        "the UMEM's frames did not add up: {samples}"
    );
    assert_eq!(
        n("identity_broken_samples"),
        0.0,
        "rx != tx + pass + handoff + drops: {samples}"
    );
    assert_eq!(
        n("failed_outside_flaps"),
        0.0,
        "failures outside flaps: {}",
        r["failures_outside_flaps"]
    );
    assert!(
        r["checks_failed"].as_array().is_some_and(Vec::is_empty),
        "the gateway did not follow the churn: {}",
        r["checks_failed"]
    );
    assert!(n("flaps") >= 3.0, "{} flaps", n("flaps"));
    assert!(
        n("requests") >= 2000.0 && n("udp") >= 500.0,
        "too little traffic: {r}"
    );
    assert!(
        n("changes_per_minute") >= 950.0,
        "{} changes a minute",
        n("changes_per_minute")
    );
    assert!(r["targets_met"].as_bool() == Some(true), "{r}");
}
