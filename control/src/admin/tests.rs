//! The endpoint served over real sockets: every path's status and body, the listeners'
//! rules for mutating requests, and the bounds on slow and malformed clients.

use super::http::{DEADLINE, MAX_REQUEST};
use super::*;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};
use strait_config::model::MacAddr;

fn get(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    raw(
        addr,
        format!("{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
    )
}

/// Sends `request` as it is and reads the answer: status and body.
fn raw(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(request).unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// An endpoint over the built-in example's table with worker slots `cores`, on
/// 127.0.0.1, not ready yet, whose reloads answer "reloaded".
fn endpoint(cores: Vec<Arc<crate::cores::CoreStats>>) -> (SocketAddr, Arc<Shared>) {
    let opts = Options {
        listen: "127.0.0.1:0".parse().unwrap(),
        socket: None,
        token: None,
    };
    endpoint_with(cores, &opts)
}

/// [`endpoint`] listening as `opts` says.
fn endpoint_with(
    cores: Vec<Arc<crate::cores::CoreStats>>,
    opts: &Options,
) -> (SocketAddr, Arc<Shared>) {
    let cfg = strait_config::example();
    let ports: Vec<_> = cfg
        .gateway
        .interfaces
        .iter()
        .map(|_| strait_dataplane::table::Port::new(MacAddr([2, 0, 0, 0, 0, 1]), 1500))
        .collect();
    let table = strait_dataplane::table::Builder::new()
        .build(&cfg, &ports, |_, _, _| false)
        .unwrap();
    let shared = Arc::new(Shared::new(cfg, Arc::new(table), Arc::default(), cores));
    let (reload_tx, reload_rx) = mpsc::channel::<Request>();
    thread::spawn(move || {
        for r in reload_rx {
            let _ = match r {
                Request::Reload(a) => a.send(Ok("reloaded".into())),
                Request::Drain(a) => a.send(Ok("draining".into())),
            };
        }
    });
    let addr = start_with(opts, Arc::clone(&shared), reload_tx).unwrap();
    (addr, shared)
}

/// The endpoint over the built-in example (`web` TCP 80 and `echo` UDP 5353 on
/// 203.0.113.10, dsr-l2) with two worker slots: core 0 turns its desk as a worker's
/// loop does, core 1 never does.
#[test]
fn explain_asks_the_workers_and_names_one_that_does_not_answer() {
    use crate::explain::{render, WAIT};
    use serde_json::Value;
    use std::sync::atomic::AtomicBool;
    use strait_dataplane::flow::Timeouts;
    use strait_dataplane::pipeline::Pipeline;
    let cores: Vec<Arc<crate::cores::CoreStats>> = (0..2).map(|_| Arc::default()).collect();
    let (d0, w0) = strait_dataplane::explain::desk();
    let (_d1, w1) = strait_dataplane::explain::desk();
    *cores[0].explain.lock().unwrap() = Some(w0);
    *cores[1].explain.lock().unwrap() = Some(w1);
    let (addr, shared) = endpoint(cores);
    let table = shared.table.load_full();
    let stop = Arc::new(AtomicBool::new(false));
    let (t, stop2) = (Arc::clone(&table), Arc::clone(&stop));
    let worker = thread::spawn(move || {
        let mut p = Pipeline::new(0, 2, 1024, Timeouts::default(), 0).with_explain(d0);
        while !stop2.load(Ordering::Relaxed) {
            if p.explain_pending() {
                p.explain_turn(&t, 1);
            }
            thread::sleep(Duration::from_micros(100));
        }
    });

    let (s, body) = get(addr, "GET", "/explain?client=192.0.2.2&vip=203.0.113.10:80");
    assert_eq!(s, 400, "{body}");
    assert!(body.contains("`client`"), "{body}");
    let (s, body) = get(
        addr,
        "GET",
        "/explain?client=192.0.2.2:1&vip=203.0.113.10:81",
    );
    assert_eq!(s, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (&v["kind"], &v["vip_known"]),
        (&json!("no_frontend"), &json!(true))
    );
    assert!(render(&v).contains("the VIP serves 80/tcp (web), 5353/udp (echo) only"));

    // DSR: both cores asked; core 1 is silent for a second and named.
    let started = std::time::Instant::now();
    let (s, body) = get(
        addr,
        "GET",
        "/explain?client=192.0.2.2:40000&vip=203.0.113.10:80",
    );
    assert_eq!(s, 200, "{body}");
    assert!(started.elapsed() >= WAIT);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["cores_asked"], json!([0, 1]));
    assert_eq!(v["unanswered"][0]["core"], 1, "{v}");
    assert!(v["why"]["by"] == "maglev", "{v}");
    let text = render(&v);
    assert!(text.contains("warning   worker 1"), "{text}");
    assert!(text.contains("did not answer within 1s"), "{text}");

    // Once every asked worker is silent, an error, not a story.
    stop.store(true, Ordering::Relaxed);
    worker.join().unwrap();
    let (s, body) = get(
        addr,
        "GET",
        "/explain?client=192.0.2.2:40000&vip=203.0.113.10:80",
    );
    assert_eq!(s, 503, "{body}");
    assert!(body.starts_with("no worker answered: worker 0"), "{body}");
}

/// On a listener that is not loopback (in a namespace of the test's own), mutating
/// requests need the token; the Unix socket takes them as they are; reads need nothing.
#[test]
fn mutations_need_loopback_the_socket_or_the_token() {
    let gate = strait_testkit::privileged::IP;
    if !strait_testkit::privileged::privileged("admin token", &[gate]) {
        return;
    }
    let ns = strait_testkit::harness::Netns::quiet(&format!("sadm{}", std::process::id()));
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("admin.sock");
    let token = "0123456789abcdef-token";
    let opts = Options {
        listen: "0.0.0.0:0".parse().unwrap(),
        socket: Some(socket.clone()),
        token: Some(token.into()),
    };
    ns.run_in(|| {
        let (addr, _shared) = endpoint_with(Vec::new(), &opts);
        let addr = SocketAddr::from(([127, 0, 0, 1], addr.port()));
        let post = |auth: &str| {
            raw(
                addr,
                format!("POST /reload HTTP/1.1\r\nHost: x\r\n{auth}\r\n").as_bytes(),
            )
            .0
        };
        assert_eq!(post(""), 403);
        assert_eq!(post("Authorization: Bearer wrong-token-0123456\r\n"), 403);
        assert_eq!(post(&format!("authorization: bearer {token}\r\n")), 200);
        assert_eq!(get(addr, "POST", "/drain").0, 403);
        assert_eq!(get(addr, "GET", "/routes").0, 200);
        // The Unix socket: mode 0600, mutations taken.
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let mut c = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        c.write_all(b"POST /drain HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(out.ends_with("draining\n"), "{out}");
    });
}

#[test]
fn idle_slow_oversized_and_malformed_clients_do_not_stop_healthz() {
    let (addr, shared) = endpoint(Vec::new());
    shared.ready.store(true, Ordering::Relaxed);
    // A thousand connections that never send a byte, and one that trickles.
    let idle: Vec<TcpStream> = (0..1000)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let mut slow = TcpStream::connect(addr).unwrap();
    slow.write_all(b"GET /heal").unwrap();
    let asked = Instant::now();
    assert_eq!(get(addr, "GET", "/healthz"), (200, "ok\n".into()));
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "/healthz took {:?} behind idle clients",
        asked.elapsed()
    );
    // Oversized and malformed requests get their status, not a hang.
    let huge = format!(
        "GET /metrics HTTP/1.1\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(3 * MAX_REQUEST)
    );
    assert_eq!(raw(addr, huge.as_bytes()).0, 431);
    assert_eq!(raw(addr, b"hello\r\n\r\n").0, 400);
    assert_eq!(raw(addr, b"GET /healthz SMTP/2\r\n\r\n").0, 400);
    assert_eq!(raw(addr, b"\xff\xfe\x00\x01\r\n\r\n").0, 400);
    // The slow client is answered 408 and closed once its deadline passes.
    let mut out = String::new();
    slow.set_read_timeout(Some(DEADLINE + Duration::from_secs(5)))
        .unwrap();
    slow.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 408"), "{out:?}");
    // The idle ones were closed too, after the same deadline.
    let mut first = &idle[0];
    let mut byte = [0u8; 1];
    first
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert!(
        first.read(&mut byte).is_ok(),
        "an idle connection stays open"
    );
    assert_eq!(get(addr, "GET", "/healthz").0, 200);
}

#[test]
fn tokens_compare_whole() {
    assert!(same(b"abc", b"abc"));
    assert!(!same(b"abc", b"abd"));
    assert!(!same(b"abc", b"abcd"));
}

#[test]
fn reload_is_taken_only_on_loopback() {
    assert!(mutating_allowed("127.0.0.1:9900".parse().unwrap()));
    assert!(mutating_allowed("[::1]:9900".parse().unwrap()));
    assert!(!mutating_allowed("0.0.0.0:9900".parse().unwrap()));
    assert!(!mutating_allowed("198.51.100.2:9900".parse().unwrap()));
}

#[test]
fn serves_health_services_metrics_and_reload() {
    let core = Arc::new(crate::cores::CoreStats {
        name: "veth-gw/0".into(),
        ..Default::default()
    });
    core.sample.lock().unwrap().counters.rx = 42;
    core.sample.lock().unwrap().worker.umem = strait_dataplane::xsk::Accounting {
        total: 4096,
        held: 2040,
        fill: 2047,
        rx: 3,
        tx: 2,
        comp: 3,
        in_kernel: 1,
        misplaced: 0,
    };
    core.sample.lock().unwrap().worker.busy.ns = 1_500_000_000;
    core.sample.lock().unwrap().worker.busy.kick_ns = 500_000_000;
    let (addr, shared) = endpoint(vec![core]);

    assert_eq!(get(addr, "GET", "/healthz"), (503, "starting\n".into()));
    shared
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(get(addr, "GET", "/healthz"), (200, "ok\n".into()));
    let (s, body) = get(addr, "GET", "/services");
    assert_eq!(s, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["services"][0]["name"], "web");
    assert_eq!(v["services"][0]["mode"], "dsr-l2");
    assert_eq!(v["services"][0]["backends"].as_array().unwrap().len(), 4);
    assert_eq!(v["services"][0]["backends"][0]["health"], "unchecked");
    let (s, m) = get(addr, "GET", "/metrics");
    assert_eq!(s, 200);
    assert!(
        m.contains("strait_rx_packets_total{core=\"veth-gw/0\"} 42"),
        "{m}"
    );
    assert!(
        m.contains("strait_dropped_packets_total{core=\"veth-gw/0\",reason=\"ip_truncated\"} 0")
    );
    assert!(m.contains("strait_backend_up{service=\"web\",backend=\"198.51.100.11:80\"} 1"));
    assert!(
        m.contains("strait_backend_weight{service=\"web\",backend=\"198.51.100.11:80\"} 100"),
        "{m}"
    );
    assert!(m.contains("strait_snapshot_generation 1"));
    assert!(
        m.contains("strait_service_serving_backends{service=\"web\"} 4"),
        "{m}"
    );
    assert!(
        m.contains("strait_worker_heartbeat_age_seconds{core=\"veth-gw/0\"} 0"),
        "{m}"
    );
    assert!(m.contains("strait_backends_without_next_hop 0"), "{m}");
    assert!(
        m.contains(
            "strait_worker_dropped_frames_total{core=\"veth-gw/0\",cause=\"tx_ring_full\"} 0"
        ),
        "{m}"
    );
    // The UMEM's books: every state, adding up to the capacity.
    let umem: i64 = ["free", "fill", "rx", "tx", "completion", "kernel"]
        .iter()
        .map(|state| {
            let key = format!("strait_umem_frames{{core=\"veth-gw/0\",state=\"{state}\"}} ");
            let line = m.lines().find(|l| l.starts_with(&key));
            line.and_then(|l| l[key.len()..].parse::<i64>().ok())
                .unwrap_or_else(|| panic!("no {key}in {m}"))
        })
        .sum();
    assert_eq!(umem, 4096);
    assert!(
        m.contains("strait_umem_capacity_frames{core=\"veth-gw/0\"} 4096"),
        "{m}"
    );
    assert!(
        m.contains("strait_umem_misplaced_frames{core=\"veth-gw/0\"} 0"),
        "{m}"
    );
    assert!(
        m.contains("strait_worker_busy_seconds_total{core=\"veth-gw/0\"} 1.5"),
        "{m}"
    );
    assert!(
        m.contains("strait_worker_kick_seconds_total{core=\"veth-gw/0\"} 0.5"),
        "{m}"
    );
    // No steering program attached here: the families are there, without samples.
    assert!(m.contains("# TYPE strait_xdp_packets counter"), "{m}");
    assert!(
        m.contains("# TYPE strait_interface_rx_packets counter"),
        "{m}"
    );
    assert_eq!(get(addr, "POST", "/reload"), (200, "reloaded\n".into()));
    assert_eq!(get(addr, "GET", "/reload").0, 405);
    let (s, body) = get(addr, "GET", "/nope");
    assert_eq!(s, 404);
    assert!(body.contains("POST /capture"), "{body}");
    // A query string does not change the route: the page, or 405 for another method.
    let (s, body) = get(addr, "GET", "/metrics?x=1");
    assert_eq!(s, 200);
    assert!(body.contains("# TYPE strait_xdp_packets counter"), "{body}");
    let explain = "/explain?client=192.0.2.2:1&vip=203.0.113.10:80";
    assert_eq!(get(addr, "POST", explain).0, 405);
    assert_eq!(get(addr, "GET", "/reload?now=1").0, 405);

    // Routes: each VIP's state in JSON and in /metrics; draining turns /healthz 503.
    *shared.routes.lock().unwrap() = Arc::new(
        [
            (
                "203.0.113.10".parse().unwrap(),
                crate::core::Route::Announced,
            ),
            (
                "203.0.113.11".parse().unwrap(),
                crate::core::Route::NoServingBackend,
            ),
        ]
        .into_iter()
        .collect(),
    );
    let (s, body) = get(addr, "GET", "/routes");
    assert_eq!(s, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["vips"][1]["route"], "no-serving-backend", "{v}");
    assert_eq!(v["bgp"], serde_json::Value::Null);
    let m = get(addr, "GET", "/metrics").1;
    assert!(
        m.contains("strait_vip_route{vip=\"203.0.113.10\",state=\"announced\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("strait_vip_routes{state=\"no-serving-backend\"} 1"),
        "{m}"
    );
    // VRRP: each published VIP's ownership changes, 0 for a VIP never taken.
    let mut l2 = crate::l2::VrrpStatus::default();
    l2.owner_changes.insert("203.0.113.10".parse().unwrap(), 3);
    *shared.l2.lock().unwrap() = Some(Arc::new(std::sync::Mutex::new(l2)));
    let m = get(addr, "GET", "/metrics").1;
    assert!(
        m.contains("strait_vrrp_owner_changes_total{vip=\"203.0.113.10\"} 3"),
        "{m}"
    );
    assert!(
        m.contains("strait_vrrp_owner_changes_total{vip=\"203.0.113.11\"} 0"),
        "{m}"
    );
    assert_eq!(get(addr, "POST", "/drain"), (200, "draining\n".into()));
    shared.draining.store(true, Ordering::Relaxed);
    assert_eq!(get(addr, "GET", "/healthz"), (503, "draining\n".into()));
}
