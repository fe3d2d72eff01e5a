//! Several gateways behind a router: `testbed up --gateways 3`
//! builds a router namespace running BIRD with a session per gateway; three `strait run`s
//! announce the VIP and the router installs one route with three next hops; traffic flows
//! through more than one gateway; `testbed down` leaves nothing. `bench failover` with 20
//! streams resets none of them when a gateway is killed. The L2 layout: two gateways on the
//! client segment elect the VIP's owner with VRRP; SIGKILL of the owner hands the VIP to
//! the other within a second and resets no stream, and so does a drain. The same with an
//! IPv6 VIP: IPv6 BGP sessions and ECMP, flow sync over IPv6, VRRPv3 for IPv6. The one-gateway
//! benches run here too: floods, and an abused admin API. Needs root,
//! bird2, keepalived, iproute2 (tc), ethtool and curl; fails with a clear message without
//! them unless `STRAIT_SKIP_PRIVILEGED=1`.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::bed::Bed;
use support::harness::{in_ns, namespaces, run, serial_if, strait, text, wait_for, Proc, LAB};
use support::privileged as gate;

const VIP: &str = "203.0.113.10";
const TC: gate::Tool = ("tc", "-V", "iproute2");

fn privileged() -> bool {
    gate::privileged(
        "failover",
        &[
            gate::IP,
            gate::CURL,
            gate::PING,
            gate::BIRD,
            gate::KEEPALIVED,
            gate::ETHTOOL,
            TC,
        ],
    )
}

fn prefix(tag: &str) -> String {
    format!("fo{}{tag}", std::process::id() % 100_000)
}

const VIP6: &str = "2001:db8::10";

/// Next hops of the router's route to the VIP.
fn paths(bed: &Bed) -> usize {
    paths_to(bed, &format!("{VIP}/32"))
}

/// Next hops of the router's route to `prefix` (of either family).
fn paths_to(bed: &Bed, prefix: &str) -> usize {
    let family = if prefix.contains(':') { "-6" } else { "-4" };
    let out = bed.exec("rt", &["ip", family, "route", "show", prefix]);
    let t = text(&out.stdout);
    match t.matches("nexthop via").count() {
        0 => usize::from(t.contains(" via ")),
        n => n,
    }
}

/// `GET path` on the admin API of the gateway in `ns`.
fn admin(ns: &str, path: &str) -> String {
    let url = format!("http://127.0.0.1:9900{path}");
    text(&run(&mut in_ns(ns, ["curl", "-s", "--max-time", "3", &url])).stdout)
}

/// The sum of the samples of `strait_rx_packets_total` of the gateway in `ns`.
fn rx_packets(ns: &str) -> f64 {
    admin(ns, "/metrics")
        .lines()
        .filter(|l| l.starts_with("strait_rx_packets_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Runs `strait-lab bench ARGS --prefix P --json F` under a guard that takes the testbed
/// down should the bench die half-way; its JSON report. Panics with the bench's output when
/// it fails, and when it left a namespace behind.
fn bench(p: &str, args: &[&str]) -> Value {
    let guard = Bed::guard(p);
    let json = guard.dir.join("report.json");
    let out = run(std::process::Command::new(LAB)
        .env("STRAIT_BIN", strait())
        .arg("bench")
        .args(args)
        .args(["--prefix", p, "--json"])
        .arg(&json));
    assert!(
        out.status.success(),
        "bench {args:?} failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    eprintln!("{}{}", text(&out.stdout), text(&out.stderr));
    let report = serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON report"))
        .expect("JSON");
    // Before the guard takes down whatever is left: the bench itself must leave nothing.
    let left = namespaces(p);
    drop(guard);
    assert!(left.is_empty(), "the bench left namespaces: {left:?}");
    report
}

/// Dual stack: both VIPs, each over the sessions of its family, each route with three next
/// hops hashed on L4 ports.
#[test]
fn three_gateways_behind_a_router_share_the_vip_and_down_leaves_nothing() {
    let Some(_serial) = serial_if(privileged) else {
        return;
    };
    let p = prefix("a");
    let bed = Bed::up(&p, &["--gateways", "3", "--backends", "3", "--ipv6"]);
    let gateways = bed.info["gateways"].as_array().expect("gateways").clone();
    assert_eq!(gateways.len(), 3, "{}", bed.info);
    assert_eq!(bed.info["router"]["namespace"], format!("{p}-rt"));
    assert_eq!(paths(&bed), 0, "no route before a gateway announces");
    let tc = bed.must("rt", &["tc", "filter", "show", "dev", "c0", "ingress"]);
    assert!(
        tc.contains("strait_rehash"),
        "no hash reset on the router:\n{tc}"
    );
    for family in ["ipv4", "ipv6"] {
        let key = format!("net.{family}.fib_multipath_hash_policy");
        let policy = bed.must("rt", &["sysctl", "-n", &key]);
        assert_eq!(policy.trim(), "1", "{key}");
    }

    let mut procs = Vec::new();
    for g in &gateways {
        let ns = g["namespace"].as_str().expect("namespace").to_owned();
        let config = g["config"].as_str().expect("config");
        let log = std::fs::File::create(bed.dir.join(&format!("{ns}.log"))).expect("log");
        procs.push(Proc::spawn(
            in_ns(&ns, [strait(), "run", "--config", config])
                .stdout(std::process::Stdio::null())
                .stderr(log),
        ));
        wait_for(&format!("{ns} ready"), Duration::from_secs(20), || {
            (admin(&ns, "/healthz") == "ok\n").then_some(())
        });
    }
    wait_for(
        "a route with 3 next hops on the router",
        Duration::from_secs(20),
        || (paths(&bed) == 3).then_some(()),
    );
    wait_for(
        "an IPv6 route with 3 next hops on the router",
        Duration::from_secs(20),
        || (paths_to(&bed, &format!("{VIP6}/128")) == 3).then_some(()),
    );
    let route = bed.must("rt", &["ip", "route", "show", &format!("{VIP}/32")]);
    let route6 = bed.must("rt", &["ip", "-6", "route", "show", &format!("{VIP6}/128")]);
    eprintln!("the router's routes:\n{route}{route6}");
    for g in &gateways {
        let via = format!("nexthop via {}", g["client_address"].as_str().unwrap());
        assert!(route.contains(&via), "{via} missing:\n{route}");
        let via6 = format!("nexthop via {}", g["client_address6"].as_str().unwrap());
        assert!(route6.contains(&via6), "{via6} missing:\n{route6}");
    }

    // Thirty connections per family, each on a new source port: the L4 hash spreads them.
    for url in [format!("http://{VIP}/"), format!("http://[{VIP6}]/")] {
        let before: Vec<f64> = gateways
            .iter()
            .map(|g| rx_packets(g["namespace"].as_str().unwrap()))
            .collect();
        for i in 0..30 {
            let answer = bed
                .curl(&url)
                .unwrap_or_else(|e| panic!("request {i} to {url} through the router failed: {e}"));
            assert!(answer.starts_with("backend=b"), "{answer}");
        }
        let used = gateways
            .iter()
            .zip(&before)
            .filter(|(g, b)| rx_packets(g["namespace"].as_str().unwrap()) > **b)
            .count();
        assert!(
            used >= 2,
            "only {used} of 3 gateways forwarded 30 connections to {url}"
        );
    }

    // SIGTERM to all at once (each withdraws, forwards through its 2 s drain grace and
    // exits 0, its BIRD directory removed), then collect them.
    for proc in &procs {
        proc.signal("TERM");
    }
    for mut proc in procs {
        let status = proc.stop(Duration::from_secs(10));
        assert!(status.success(), "a gateway exited with {status}");
    }
    let out = run(std::process::Command::new(LAB).args(["testbed", "down", "--prefix", &p]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(namespaces(&p), Default::default(), "namespaces left");
    assert!(
        !std::path::Path::new(&format!("/run/strait/{p}")).exists(),
        "/run/strait/{p} left"
    );
}

/// The layout `bench failover` tests: gateways behind a BGP router, or on the client
/// segment electing the VIP's owner with VRRP.
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    Bgp,
    L2,
}

/// Runs `bench failover` on `layout` with `gateways` gateways and `streams` streams, to the
/// IPv6 VIP if `ipv6`; its results, after checking what every run promises: the VIP of the
/// family asked for, the layout's events in order, no stream reset, no namespace left.
fn failover(tag: &str, layout: Layout, ipv6: bool, gateways: u32, streams: u32) -> Vec<Value> {
    let p = prefix(tag);
    let (gateways, streams) = (gateways.to_string(), streams.to_string());
    let mut args = vec!["failover"];
    if layout == Layout::L2 {
        args.push("--l2");
    }
    if ipv6 {
        args.push("--ipv6");
    }
    args.extend(["--gateways", &gateways, "--streams", &streams]);
    let report = bench(&p, &args);
    if ipv6 {
        assert_eq!(report["vip"], VIP6, "{report}");
    }
    let results = report["results"].as_array().expect("results").clone();
    let events: Vec<&str> = results.iter().filter_map(|r| r["event"].as_str()).collect();
    match layout {
        Layout::Bgp => assert_eq!(
            events,
            ["kill", "drain", "restart", "backend-change-during-kill"]
        ),
        Layout::L2 => assert_eq!(events, ["l2-kill", "l2-drain"]),
    }
    for r in &results {
        assert_eq!(r["streams_reset"], 0, "streams reset: {r}");
    }
    assert_eq!(
        namespaces(&p),
        Default::default(),
        "the bench left namespaces"
    );
    results
}

#[test]
fn no_event_of_three_gateways_resets_a_stream() {
    let Some(_serial) = serial_if(privileged) else {
        return;
    };
    // With flow sync (the testbed's default) no event resets a stream: not the SIGKILL, not
    // the drain, and not the restart after a backend change, nor the kill during one.
    for r in failover("b", Layout::Bgp, false, 3, 20) {
        assert_eq!(r["gateways"], 3, "{r}");
        assert_eq!(r["streams"], 20, "{r}");
        assert!(r["recovery_ms"].is_u64(), "{r}");
        assert_eq!(r["flows_moved_backend"], 0, "flows moved: {r}");
    }
}

/// `bench failover --ipv6`: the streams go to the IPv6 VIP, which the router learns over
/// the gateways' IPv6 sessions and spreads by ECMP on L4 ports; the gateways sync flows over
/// IPv6. Kill, drain, restart after a backend change and a kill during one reset no stream.
#[test]
fn no_event_of_three_gateways_resets_an_ipv6_stream() {
    let Some(_serial) = serial_if(privileged) else {
        return;
    };
    for r in failover("h", Layout::Bgp, true, 3, 10) {
        assert_eq!(r["streams"], 10, "{r}");
        assert_eq!(r["flows_moved_backend"], 0, "flows moved: {r}");
        // The event hit a gateway that carried some of the streams: ECMP spread them.
        assert!(
            r["gateway_share"].as_f64().is_some_and(|s| s > 0.0),
            "the gateway had no traffic: {r}"
        );
    }
}

/// `bench failover --l2 --ipv6`: VRRPv3 elects the IPv6 VIP's owner; its SIGKILL and its
/// drain move the IPv6 VIP (the new owner's unsolicited neighbour advertisement) and reset
/// no stream.
#[test]
fn killing_or_draining_the_ipv6_vips_vrrp_owner_resets_no_stream() {
    let Some(_serial) = serial_if(privileged) else {
        return;
    };
    for r in failover("i", Layout::L2, true, 2, 10) {
        assert!(
            r["withdrawn_ms"].as_u64().is_some_and(|ms| ms < 3000),
            "the IPv6 VIP took 3 s or more to move: {r}"
        );
    }
}

#[test]
fn the_l2_layout_puts_gateways_on_the_client_segment_without_vips() {
    let Some(_serial) = serial_if(privileged) else {
        return;
    };
    let p = prefix("c");
    let bed = Bed::up(&p, &["--gateways", "2", "--l2", "--backends", "2"]);
    assert!(bed.info["router"].is_null(), "{}", bed.info);
    let names = namespaces(&p);
    assert!(!names.contains(&format!("{p}-rt")), "{names:?}");
    for (i, g) in bed.info["gateways"]
        .as_array()
        .expect("gateways")
        .iter()
        .enumerate()
    {
        let ns = g["namespace"].as_str().unwrap();
        assert_eq!(ns, format!("{p}-gw{}", i + 1));
        // Only strait claims VIPs; the testbed puts none on a gateway.
        let lo = text(&run(&mut in_ns(ns, ["ip", "addr", "show", "dev", "lo"])).stdout);
        assert!(!lo.contains(VIP), "{ns} holds the VIP:\n{lo}");
        // On the client's segment: reachable from the client without a router.
        let addr = g["client_address"].as_str().unwrap();
        let ping = bed.exec("client", &["ping", "-c", "1", "-W", "2", addr]);
        assert!(ping.status.success(), "{addr}: {}", text(&ping.stdout));
        let config = std::fs::read_to_string(g["config"].as_str().unwrap()).unwrap();
        assert!(!config.contains("[gateway.bgp]"), "{config}");
        assert!(config.contains("[gateway.l2]"), "{config}");
    }
    drop(bed);
    assert_eq!(namespaces(&p), Default::default(), "namespaces left");
}

#[test]
fn killing_or_draining_the_vrrp_owner_moves_the_vip_in_a_second_and_resets_no_stream() {
    let Some(_serial) = serial_if(privileged) else {
        return;
    };
    for r in failover("d", Layout::L2, false, 2, 20) {
        assert!(
            r["withdrawn_ms"].as_u64().is_some_and(|ms| ms < 1000),
            "the VIP took a second or more to move: {r}"
        );
    }
}

/// `bench flood`: spoofed-source SYN and UDP floods far above the
/// gateway's new-flow rate limit (20,000 frames/s against 1,000 new flows/s: every flood
/// flow past the limit is forwarded without an entry), with 50 streams and new connections
/// running; then the same with a flow table of 4,096 entries, far below the flood's flows.
/// The debug build's gateway takes this rate; the full-rate figures of a release build are
/// in docs/reliability.md.
#[test]
fn floods_reset_no_stream_and_fail_no_new_connection() {
    let Some(_serial) = serial_if(privileged) else {
        return;
    };
    for (tag, extra) in [("e", None), ("f", Some("4096"))] {
        let p = prefix(tag);
        let mut args = vec!["flood", "--streams", "50", "--seconds", "4"];
        args.extend(["--rate", "20000", "--new-flows-per-second", "1000"]);
        if let Some(cap) = extra {
            args.extend(["--flow-capacity", cap]);
        }
        let report = bench(&p, &args);
        let results = report["results"].as_array().expect("results");
        assert_eq!(results.len(), 2, "{report}");
        for r in results {
            assert_eq!(r["streams_reset"], 0, "{r}");
            assert!(
                r["longest_stall_ms"].as_u64().is_some_and(|ms| ms < 1000),
                "{r}"
            );
            assert!(r["requests"].as_u64().is_some_and(|n| n > 0), "{r}");
            assert!(
                r["requests_ok_ratio"].as_f64().is_some_and(|x| x >= 0.99),
                "{r}"
            );
            assert!(
                r["sent"].as_u64().is_some_and(|n| n > 40_000),
                "the flood did not run: {r}"
            );
            // Far above the rate limit: most flood flows forwarded without an entry.
            assert!(r["flows_stateless"].as_u64().is_some_and(|n| n > 0), "{r}");
            if extra.is_some() {
                assert!(r["entries_after"].as_u64() <= r["capacity"].as_u64(), "{r}");
            }
        }
        assert_eq!(
            namespaces(&p),
            Default::default(),
            "the bench left namespaces"
        );
    }
}

/// `bench admin`: the admin API held by 1,000 idle connections and 50
/// slow clients and sent malformed, oversized and scrape requests, while UDP and 20 TCP
/// streams go through the gateway: what the gateway was handed is forwarded, no stream breaks,
/// every new connection is served, `/healthz` answers every probe, and the abusers met the
/// API's limits (idle and slow clients cut off at the deadline, 400s and 431s).
#[test]
fn an_abused_admin_api_costs_forwarding_nothing_and_healthz_answers() {
    let Some(_serial) = serial_if(privileged) else {
        return;
    };
    let p = prefix("g");
    let args = [
        "admin",
        "--seconds",
        "8",
        "--rate",
        "5000",
        "--streams",
        "20",
        "--abuse-rate",
        "200",
    ];
    let report = bench(&p, &args);
    let results = report["results"].as_array().expect("results");
    let phases: Vec<&str> = results.iter().filter_map(|r| r["phase"].as_str()).collect();
    assert_eq!(phases, ["quiet", "abused"], "{report}");
    for r in results {
        assert!(
            r["redirected"].as_u64().is_some_and(|n| n > 20_000),
            "the traffic did not run: {r}"
        );
        // A shared CI machine may preempt the worker for a moment in either phase: allow
        // 0.1 % of the frames, far below what a worker starved by the abusers would lose.
        let (lost, redirected) = (r["lost"].as_u64(), r["redirected"].as_u64());
        assert!(
            lost.zip(redirected).is_some_and(|(l, n)| l * 1000 <= n),
            "frames lost in the gateway: {r}"
        );
        assert_eq!(r["streams_reset"], 0, "{r}");
        assert_eq!(r["requests_failed"], 0, "{r}");
        assert!(r["healthz"].as_u64().is_some_and(|n| n > 50), "{r}");
        assert_eq!(r["healthz_failed"], 0, "{r}");
    }
    let abuse = &results[1]["abuse"];
    assert_eq!(abuse["idle_open"], 1000, "{abuse}");
    assert!(
        abuse["slow_cut_off"].as_u64().is_some_and(|n| n >= 50),
        "slow clients not cut off at the deadline: {abuse}"
    );
    for status in ["answered_200", "answered_400", "answered_431"] {
        assert!(abuse[status].as_u64().is_some_and(|n| n > 0), "{abuse}");
    }
    assert_eq!(abuse["other"], 0, "requests unanswered: {abuse}");
}
