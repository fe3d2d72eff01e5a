//! The end-to-end scenarios both port drivers run (`lab/tests/e2e.rs` with AF_XDP,
//! `lab/tests/dpdk.rs` with DPDK): a testbed per test, the real gateway, real clients and
//! servers; the helpers they share.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::sync::MutexGuard;
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::bed::{assert_client_seen, tally, Bed, Gateway, CLIENT};
use super::harness::{in_ns, must, serial_if, sh, strait, text, wait_for, Proc, PYTHON};
use super::privileged as gate;

/// `strait check` of a DPDK testbed's configuration must pass: a `strait` built without
/// the `dpdk` feature refuses it, and the DPDK tests would then test nothing.
pub fn assert_has_dpdk(bed: &Bed) {
    let out = super::harness::run(
        Command::new(super::harness::strait())
            .args(["check", "--config"])
            .arg(bed.config()),
    );
    assert!(
        out.status.success(),
        "{} cannot run DPDK interfaces; build it with `cargo build -p strait-control --features dpdk`:\n{}",
        super::harness::strait(),
        text(&out.stderr)
    );
}

/// The gateway's port driver in a scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    /// AF_XDP on the testbed's veths.
    AfXdp,
    /// DPDK `net_af_packet` ports on the veths (`testbed up --driver dpdk`).
    Dpdk,
    /// DPDK `net_af_xdp` ports on the veths (`testbed up --driver dpdk --vdev af-xdp`).
    DpdkAfXdp,
}

impl Driver {
    /// What `strait-lab testbed up` needs for it.
    pub fn testbed_args(self) -> &'static [&'static str] {
        match self {
            Driver::AfXdp => &[],
            Driver::Dpdk => &["--driver", "dpdk"],
            Driver::DpdkAfXdp => &["--driver", "dpdk", "--vdev", "af-xdp"],
        }
    }

    /// The letter in its testbeds' prefixes.
    fn letter(self) -> char {
        match self {
            Driver::AfXdp => 'e',
            Driver::Dpdk => 'd',
            Driver::DpdkAfXdp => 'x',
        }
    }
}

pub const VIP: &str = "203.0.113.10";

/// Root and the tools these tests drive (see `strait_testkit::privileged`).
pub fn privileged() -> bool {
    gate::privileged(
        "end-to-end",
        &[
            gate::IP,
            gate::CURL,
            gate::PING,
            gate::TCPDUMP,
            gate::TSHARK,
            gate::ARPING,
            gate::PYTHON,
        ],
    )
}

/// A test's testbed (`se{pid}{tag}` for AF_XDP, `sd{pid}{tag}` for DPDK) with the serial
/// lock, which goes after the testbed.
pub struct Scenario {
    /// The testbed.
    pub bed: Bed,
    _serial: MutexGuard<'static, ()>,
}

impl Deref for Scenario {
    type Target = Bed;

    fn deref(&self) -> &Bed {
        &self.bed
    }
}

/// The serial lock and a testbed of `strait testbed up ARGS..` with `driver`'s ports, if
/// the tests may run.
pub fn scenario(driver: Driver, tag: &str, args: &[&str]) -> Option<Scenario> {
    let serial = serial_if(privileged)?;
    let mut all: Vec<&str> = args.to_vec();
    all.extend_from_slice(driver.testbed_args());
    let bed = Bed::up(
        &format!("s{}{}{tag}", driver.letter(), std::process::id() % 100_000),
        &all,
    );
    if driver != Driver::AfXdp {
        assert_has_dpdk(&bed);
    }
    Some(Scenario {
        bed,
        _serial: serial,
    })
}

/// `strait run --config CONFIG` in the gateway namespace, ready when its admin API answers
/// and every backend is up.
pub fn start(bed: &Bed, config: &Path) -> Gateway {
    Gateway::spawn(bed, Gateway::command(bed, config), |g| {
        g.healthy() && g.services().is_some_and(|v| all_up(&v))
    })
}

impl Bed {
    /// `n` HTTP requests to the VIP, each a new connection; the answers.
    pub fn vip_requests(&self, n: usize) -> Vec<Option<String>> {
        self.requests(&format!("http://{VIP}/"), n)
    }

    /// `tests/e2e/client.py ARGS..` in the client namespace.
    pub fn python(&self, args: &[&str]) -> Command {
        let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/client.py");
        let mut c = in_ns(&self.ns("client"), [PYTHON]);
        c.arg(client).args(args);
        c
    }
}

/// The sum of the samples of counter family `name` in a `/metrics` text (0 without any).
pub fn counter_in(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// A counter of the gateway's `/metrics` (0 when it has no samples).
pub fn counter(gw: &Gateway, name: &str) -> u64 {
    gw.metric(name).map_or(0, |v| v as u64)
}

/// Every backend up, or without a health check.
pub fn all_up(v: &Value) -> bool {
    v["services"].as_array().is_some_and(|s| {
        s.iter().all(|s| {
            s["backends"]
                .as_array()
                .is_some_and(|b| b.iter().all(|b| b["health"] != "down"))
        })
    })
}

pub fn health_of(v: &Value, service: &str, addr: &str) -> String {
    backend_field(v, service, addr, "health").unwrap_or_default()
}

/// Field `field` of backend `addr` of `service` in a `/services` answer, when it is a string.
pub fn backend_field(v: &Value, service: &str, addr: &str, field: &str) -> Option<String> {
    v["services"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == service)?["backends"]
        .as_array()?
        .iter()
        .find(|b| b["address"] == addr)?[field]
        .as_str()
        .map(str::to_owned)
}

/// Counts answers per backend name (`backend=bN client=...`), and checks the client address.
pub fn per_backend(answers: &[Option<String>]) -> BTreeMap<String, usize> {
    assert_client_seen(answers, "backend");
    tally(answers)
}

/// 300 requests to the VIP: none fails, all `backends` answer, each within half to double
/// its fair share, and every one saw the client's address.
pub fn assert_spread(bed: &Bed, gw: &Gateway, backends: usize) {
    let answers = bed.vip_requests(300);
    let failed = answers.iter().filter(|a| a.is_none()).count();
    assert_eq!(
        failed,
        0,
        "{failed} of 300 requests failed:\n{}",
        gw.log_text()
    );
    let per = per_backend(&answers);
    assert_eq!(per.len(), backends, "{per:?}");
    let fair = 300 / backends;
    for (b, n) in &per {
        assert!(
            (fair.div_ceil(2)..=2 * fair).contains(n),
            "{b} got {n} of 300: outside half to double its fair share ({fair})"
        );
    }
}

/// The testbed's configuration edited by `edit`, in the scratch directory.
pub fn write_config(bed: &Bed, edit: impl Fn(&str) -> String) -> PathBuf {
    let text = std::fs::read_to_string(bed.config()).unwrap();
    let path = bed.dir.join("edited.toml");
    std::fs::write(&path, edit(&text)).unwrap();
    path
}

/// 300 requests over four backends with the client address preserved, and the checksums
/// the client's veth left to offload completed.
pub fn dsr_l2_spread(s: &Scenario, gw: &Gateway) {
    assert_spread(s, gw, 4);
    // The client's veth keeps its default offloads, so its TCP segments reach the gateway
    // with the checksum left to offload; the answers above prove they were completed.
    assert!(
        counter(gw, "strait_checksum_completed_total") > 0,
        "no checksum completed: the testbed's endpoints must keep TX offload on"
    );
}

/// A killed backend is out within 3 s, streams to the others see no reset and no stall,
/// and it comes back.
pub fn dead_backend(driver: Driver) {
    let Some(s) = scenario(driver, "e", &["--backends", "3"]) else {
        return;
    };
    let gw = start(&s, &s.config());
    // Long-lived streams, opened before the failure, on several backends.
    let streams = Proc::spawn(s.python(&["stream", VIP, "12", "6"]).stdout(Stdio::piped()));
    sleep(Duration::from_millis(1500));
    sh(&["kill", "-KILL", &s.backend_pid("b1").to_string()]);
    let killed = Instant::now();
    wait_for(
        "the dead backend marked down",
        Duration::from_secs(3),
        || {
            let v = gw.services().expect("services");
            (health_of(&v, "web", "198.51.100.11") == "down").then_some(())
        },
    );
    let down_after = killed.elapsed();
    let answers = s.vip_requests(60);
    assert!(
        answers.iter().all(Option::is_some),
        "requests failed after the backend was marked down"
    );
    assert!(
        !per_backend(&answers).contains_key("b1"),
        "new flows still went to the dead backend"
    );
    let report = text(&streams.wait().stdout);
    let mut on_others = 0;
    for line in report.lines() {
        if line.starts_with("backend=b1") {
            continue; // its own connections died with it
        }
        on_others += 1;
        assert!(
            line.contains("error=none"),
            "a stream to a live backend broke: {line}\n{report}"
        );
        let gap: f64 = line
            .split("maxgap=")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            gap < 1.0,
            "a stream to a live backend stalled {gap:.2} s: {line}"
        );
    }
    assert!(
        on_others > 0,
        "no stream landed on a live backend:\n{report}"
    );
    // It comes back: a new server on b1; it turns up and takes new flows again.
    let revived = s.serve("b1", "b1", &["--tcp", "[::]:80"]);
    wait_for("the revived backend up", Duration::from_secs(5), || {
        let v = gw.services().expect("services");
        (health_of(&v, "web", "198.51.100.11") == "up").then_some(())
    });
    let again = per_backend(&s.vip_requests(60));
    drop(revived);
    assert!(
        again.get("b1").copied().unwrap_or(0) > 0,
        "the revived backend takes no new flows: {again:?}"
    );
    eprintln!("backend marked down {down_after:?} after its server died");
}

/// Opens keep-alive connections through the gateway; `round()` sends one more request on each.
pub struct KeepAlive {
    client: Proc,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl KeepAlive {
    pub fn open(bed: &Bed, n: usize) -> (KeepAlive, Vec<String>) {
        let mut client = Proc::spawn(
            bed.python(&["keepalive", VIP, &n.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped()),
        );
        let stdin = client.child().stdin.take().unwrap();
        let stdout = BufReader::new(client.child().stdout.take().unwrap());
        let mut k = KeepAlive {
            client,
            stdin,
            stdout,
        };
        let first = k.read_round();
        (k, first)
    }

    fn read_round(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "client exited: {}",
                self.client.what()
            );
            let line = line.trim().to_string();
            if line == "END" {
                return out;
            }
            out.push(line);
        }
    }

    pub fn round(&mut self) -> Vec<String> {
        writeln!(self.stdin, "again").unwrap();
        self.stdin.flush().unwrap();
        self.read_round()
    }
}

pub fn reload(gw: &Gateway, bed: &Bed, config: &Path) {
    std::fs::copy(config, bed.config()).unwrap();
    let answer = gw.admin("POST", "/reload");
    assert!(answer.starts_with("reloaded"), "reload refused: {answer}");
}

/// Draining a backend by reload keeps its connections and gives it no new flows.
pub fn draining(driver: Driver) {
    let Some(s) = scenario(driver, "f", &["--backends", "3"]) else {
        return;
    };
    let gw = start(&s, &s.config());
    let (mut conns, first) = KeepAlive::open(&s, 24);
    assert!(
        first.iter().any(|a| a.starts_with("backend=b2 ")),
        "no connection landed on b2: {first:?}"
    );
    // Drain b2 (its first service `web`): weight 0 via a reload.
    let drained = write_config(&s, |t| {
        t.replacen(
            "address = \"198.51.100.12\"\nport = 80\n",
            "address = \"198.51.100.12\"\nport = 80\nweight = 0\n",
            1,
        )
    });
    reload(&gw, &s, &drained);
    let second = conns.round();
    assert_eq!(
        second, first,
        "existing connections moved or broke after draining"
    );
    let fresh = per_backend(&s.vip_requests(60));
    assert!(
        !fresh.contains_key("b2"),
        "a draining backend took new flows: {fresh:?}"
    );
}

/// A reload adding a backend breaks no established connection, and it takes new flows.
pub fn reload_adding(driver: Driver) {
    let Some(s) = scenario(driver, "g", &["--backends", "3"]) else {
        return;
    };
    // Start with b3 absent from `web`.
    let without = write_config(&s, |t| {
        let start = t
            .find("[[services.backends]]\naddress = \"198.51.100.13\"\nport = 80\n")
            .expect("b3 in web");
        let end = t[start + 10..]
            .find("[[")
            .map_or(t.len(), |e| start + 10 + e);
        format!("{}{}", &t[..start], &t[end..])
    });
    let full = s.dir.join("full.toml");
    std::fs::copy(s.config(), &full).unwrap();
    std::fs::copy(&without, s.config()).unwrap();
    let gw = start(&s, &s.config());
    let (mut conns, first) = KeepAlive::open(&s, 24);
    assert!(
        !first.iter().any(|a| a.starts_with("backend=b3 ")),
        "b3 answered before it was configured"
    );
    reload(&gw, &s, &full);
    assert_eq!(
        conns.round(),
        first,
        "an established connection moved or broke on reload"
    );
    let fresh = per_backend(&s.vip_requests(90));
    assert!(
        fresh.get("b3").copied().unwrap_or(0) > 0,
        "the added backend took no new flows: {fresh:?}"
    );
}

/// 10,000 UDP 5-tuples to the VIP all answered, and the pipeline's identity exact:
/// `rx == tx + pass + handoff + drops`, at least 10,000 flows made.
pub fn udp_ten_thousand(s: &Scenario, gw: &Gateway) {
    let out = s
        .python(&["udp", VIP, "5353", "20000", "10000"])
        .output()
        .unwrap();
    let report = text(&out.stdout);
    assert!(
        report.contains("sent=10000 answered=10000"),
        "{report}{}",
        text(&out.stderr)
    );
    // The workers publish when idle; give them a moment, then the identity must hold exactly,
    // in one scrape (each worker publishes its counters at once; with DPDK the kernel's
    // traffic, health checks included, goes through the workers too, so two scrapes may
    // differ).
    sleep(Duration::from_millis(500));
    let m = gw.get("/metrics");
    let rx = counter_in(&m, "strait_rx_packets_total");
    let tx = counter_in(&m, "strait_tx_packets_total");
    let pass = counter_in(&m, "strait_pass_packets_total");
    let handoff = counter_in(&m, "strait_handoff_packets_total");
    let drops = counter_in(&m, "strait_dropped_packets_total");
    assert!(rx >= 10_000, "rx {rx}");
    assert_eq!(
        rx,
        tx + pass + handoff + drops,
        "rx {rx} != tx {tx} + pass {pass} + handoff {handoff} + drops {drops}"
    );
    let created =
        counter(gw, "strait_flows_created_total") + counter(gw, "strait_flows_stateless_total");
    assert!(
        created >= 10_000,
        "10,000 distinct 5-tuples made {created} flows"
    );
}

/// nat over two arms: 300 requests spread with the client address kept, UDP both ways.
pub fn nat_two_arm(driver: Driver) {
    let Some(s) = scenario(driver, "b", &["--topology", "two-arm", "--backends", "4"]) else {
        return;
    };
    // Ready means every backend passed its health check through the gateway's own kernel
    // path: the replies from backend:8080 to the gateway must not be taken for nat replies.
    let gw = start(&s, &s.config());
    assert_spread(&s, &gw, 4);
    // UDP through nat: 53 on the VIP to 5353 on a backend, and back from the VIP.
    let out = s
        .python(&["udp", VIP, "53", "31000", "200"])
        .output()
        .unwrap();
    let report = text(&out.stdout);
    assert!(report.contains("sent=200 answered=200"), "{report}");
    let handoff = counter(&gw, "strait_handoff_packets_total");
    let rx = counter(&gw, "strait_rx_packets_total");
    let tx = counter(&gw, "strait_tx_packets_total");
    assert!(tx > 0 && rx >= tx, "rx {rx} tx {tx} handoff {handoff}");
}

/// `client.py ARGS..` in the namespace of `role`.
fn python_in(bed: &Bed, role: &str, args: &[&str]) -> Command {
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/client.py");
    let mut c = in_ns(&bed.ns(role), [PYTHON]);
    c.arg(client).args(args);
    c
}

/// One UDP datagram from each client port of `ports` to `VIP:port`; per port, the backend
/// that answered (`b1`, ...). Panics unless every datagram is answered by a backend that saw
/// the client's own address and port.
fn udp_backends(s: &Scenario, port: u16, ports: std::ops::Range<u16>) -> BTreeMap<u16, String> {
    let n = (ports.end - ports.start).to_string();
    let out = must(&mut s.python(&[
        "udpmap",
        VIP,
        &port.to_string(),
        &ports.start.to_string(),
        &n,
    ]));
    out.lines()
        .map(|l| {
            let (p, answer) = l.split_once(' ').expect("PORT ANSWER");
            let p: u16 = p.parse().expect("a port");
            let backend = super::bed::backend_of(answer)
                .unwrap_or_else(|| panic!("port {p}: no answer ({answer})"));
            assert!(
                answer.ends_with(&format!("client={CLIENT}:{p}")),
                "the backend saw another client than {CLIENT}:{p}: {answer}"
            );
            (p, backend.to_owned())
        })
        .collect()
}

/// `GET /explain` for each `proto` 5-tuple (source, destination) of `flows`, through the
/// admin API in the gateway namespace (one connection each); the answers, in order.
fn explain_all(s: &Scenario, proto: &str, flows: &[(String, String)]) -> Vec<Value> {
    let mut p = Proc::spawn(
        python_in(s, "gw", &["explain", "127.0.0.1:9900", proto])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
    );
    {
        let mut stdin = p.child().stdin.take().expect("stdin");
        for (src, dst) in flows {
            writeln!(stdin, "{src} {dst}").expect("the explain client reads");
        }
    }
    let out = p.wait();
    let answers: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(answers.len(), flows.len(), "{}", text(&out.stderr));
    answers
}

/// The replies' 5-tuples (backend address -> client port) of the flows `seen` (client port
/// -> backend name), `addr_of` giving a backend's address.
fn replies(
    seen: &BTreeMap<u16, String>,
    addr_of: impl Fn(&str) -> String,
) -> Vec<(String, String)> {
    seen.iter()
        .map(|(p, backend)| (addr_of(backend), format!("{CLIENT}:{p}")))
        .collect()
}

/// The backend an explanation names (`ADDR:PORT`), and why (`entry`, `maglev`, ...).
fn named(v: &Value) -> (String, String) {
    assert_eq!(v["kind"], "forward", "{v}");
    assert!(v["drop"].is_null(), "{v}");
    let unanswered = v["unanswered"].as_array().map_or(0, Vec::len);
    assert_eq!(unanswered, 0, "every asked worker answers: {v}");
    (
        v["backend"]["address"].as_str().unwrap_or("-").to_owned(),
        v["why"]["by"].as_str().unwrap_or("-").to_owned(),
    )
}

/// `strait explain` names the backend the backend servers saw, flow by flow: 2,000 UDP
/// flows from distinct client ports are sent, then explained (each from its flow entry,
/// made here); in nat (two-arm) their replies' 5-tuples are explained as those flows'
/// replies; 200 flows never sent are explained first (Maglev's choice) and then sent, and
/// reach the backend explained. The `strait explain` command prints the same, for a person and as
/// JSON.
pub fn explain_names_the_backends(driver: Driver, nat: bool) {
    let args: &[&str] = if nat {
        &["--topology", "two-arm", "--backends", "4"]
    } else {
        &["--backends", "4"]
    };
    let Some(s) = scenario(driver, if nat { "xn" } else { "xl" }, args) else {
        return;
    };
    let gw = start(&s, &s.config());
    let (vip_port, backend_port) = if nat { (53, 5353) } else { (5353, 5353) };
    let dst = format!("{VIP}:{vip_port}");
    let addr_of = |name: &str| format!("{}:{backend_port}", s.backend_ip(name));
    let started = Instant::now();

    let seen = udp_backends(&s, vip_port, 20_000..22_000);
    assert_eq!(seen.len(), 2000);
    let to_vip = |p: &u16| (format!("{CLIENT}:{p}"), dst.clone());
    let answers = explain_all(&s, "udp", &seen.keys().map(to_vip).collect::<Vec<_>>());
    for ((p, backend), v) in seen.iter().zip(&answers) {
        let (explained, why) = named(v);
        assert_eq!(
            (explained.as_str(), why.as_str()),
            (addr_of(backend).as_str(), "entry"),
            "port {p}: the servers saw {backend}; explain said {v}"
        );
        let e = &v["entries"][0];
        assert_eq!(
            (&e["state"], &e["origin"]),
            (&"udp".into(), &"here".into()),
            "{v}"
        );
        let (age, idle) = (e["age_ms"].as_u64(), e["idle_ms"].as_u64());
        let (Some(age), Some(idle)) = (age, idle) else {
            panic!("an age and an idle time: {v}")
        };
        assert!(
            idle <= age && age <= started.elapsed().as_millis() as u64,
            "made after the test started, used since: {v}"
        );
        assert_eq!(v["service"]["mode"], if nat { "nat" } else { "dsr-l2" });
    }
    let spread: std::collections::BTreeSet<&String> = seen.values().collect();
    assert_eq!(spread.len(), 4, "every backend took some of 2,000 flows");

    if nat {
        // Every reply's 5-tuple (backend:5353 -> client:port): the reply of its flow.
        for ((p, _), v) in seen
            .iter()
            .zip(explain_all(&s, "udp", &replies(&seen, addr_of)))
        {
            assert_eq!(v["kind"], "reply", "{v}");
            assert_eq!(v["of_flow"]["src"], format!("{CLIENT}:{p}"), "{v}");
            assert_eq!(v["of_flow"]["dst"], dst, "{v}");
            assert_eq!(v["rewrite"]["src"], dst, "{v}");
            assert!(v["drop"].is_null(), "{v}");
        }
    }

    let fresh: Vec<(String, String)> = (30_000..30_200u16).map(|p| to_vip(&p)).collect();
    let predicted = explain_all(&s, "udp", &fresh);
    let reached = udp_backends(&s, vip_port, 30_000..30_200);
    for ((p, backend), v) in reached.iter().zip(&predicted) {
        let (explained, why) = named(v);
        assert_eq!(why, "maglev", "{v}");
        assert_eq!(
            explained,
            addr_of(backend),
            "port {p}: explain predicted {explained}, the flow reached {backend}"
        );
    }

    // The command, for a person and as JSON.
    let (p, backend) = seen.iter().next().expect("a flow");
    let client = format!("{CLIENT}:{p}");
    let human = s.must(
        "gw",
        &[strait(), "explain", &client, &dst, "--proto", "udp"],
    );
    assert!(
        human.contains(&format!("backend   {} ", addr_of(backend))),
        "{human}"
    );
    assert!(human.contains("made here"), "{human}");
    assert!(human.contains(", age "), "{human}");
    let json = s.must(
        "gw",
        &[
            strait(),
            "explain",
            &client,
            &dst,
            "--proto",
            "udp",
            "--json",
        ],
    );
    let v: Value = serde_json::from_str(&json).expect("--json prints JSON");
    assert_eq!(v["backend"]["address"], addr_of(backend));
    // IPv6 and TCP: a connection to web6 (closed by now, its entry closing), explained with
    // bracketed addresses.
    let web6 = "[2001:db8::10]:80";
    let answer = s.curl(&format!("http://{web6}/")).expect("web6 answers");
    let (backend, client6) = answer
        .strip_prefix("backend=")
        .and_then(|a| a.split_once(" client="))
        .unwrap_or_else(|| panic!("{answer}"));
    let json = s.must("gw", &[strait(), "explain", client6, web6, "--json"]);
    let v: Value = serde_json::from_str(&json).expect("--json prints JSON");
    let backend6 = s.backend(backend)["ipv6"]
        .as_str()
        .expect("an IPv6 backend");
    let port6 = if nat { 8080 } else { 80 };
    assert_eq!(v["service"]["name"], "web6", "{v}");
    assert_eq!(
        v["backend"]["address"],
        format!("[{backend6}]:{port6}"),
        "{v}"
    );
    assert_eq!(
        (&v["why"]["by"], &v["entries"][0]["state"]),
        (&"entry".into(), &"closing".into()),
        "{v}"
    );
    let none = s.exec("gw", &[strait(), "explain", &client, "203.0.113.99:1"]);
    assert!(none.status.success());
    assert!(
        text(&none.stdout).contains("no service has this VIP"),
        "{}",
        text(&none.stdout)
    );
    eprintln!(
        "explain, {}: 2,200 flows sent and explained in {:?}",
        if nat { "nat" } else { "dsr-l2" },
        started.elapsed()
    );
    println!("{human}");
    drop(gw);
}

/// With two workers (each of the gateway's veths has two queues, and the veth before it picks
/// one by the flow's hash, as a NIC's RSS does): 1,000 UDP flows are sent and explained. A
/// nat flow is asked of its owner core only (steered by client address and port, frames that
/// arrive on the other queue handed over) and its entry is there, which its reply finds
/// too; a DSR flow is asked of every core and held by the one its queue feeds. Both
/// cores hold flows, and every answer names the backend the servers saw.
pub fn explain_on_two_workers(nat: bool) {
    let args: &[&str] = if nat {
        &["--topology", "two-arm", "--backends", "4", "--queues", "2"]
    } else {
        &["--backends", "4", "--queues", "2"]
    };
    let Some(s) = scenario(Driver::AfXdp, if nat { "qn" } else { "ql" }, args) else {
        return;
    };
    let gw = start(&s, &s.config());
    let (vip_port, backend_port) = if nat { (53, 5353) } else { (5353, 5353) };
    let dst = format!("{VIP}:{vip_port}");
    let addr_of = |name: &str| format!("{}:{backend_port}", s.backend_ip(name));

    let seen = udp_backends(&s, vip_port, 20_000..21_000);
    assert_eq!(seen.len(), 1000);
    let flows: Vec<(String, String)> = seen
        .keys()
        .map(|p| (format!("{CLIENT}:{p}"), dst.clone()))
        .collect();
    let mut held_by = BTreeMap::<u64, usize>::new();
    let mut core_of = BTreeMap::<u16, u64>::new();
    for ((p, backend), v) in seen.iter().zip(explain_all(&s, "udp", &flows)) {
        let (explained, why) = named(&v);
        assert_eq!(
            (explained.as_str(), why.as_str()),
            (addr_of(backend).as_str(), "entry"),
            "port {p}: the servers saw {backend}: {v}"
        );
        assert_eq!(v["cores"], 2, "{v}");
        let entries = v["entries"].as_array().expect("entries");
        assert_eq!(entries.len(), 1, "one core holds the flow: {v}");
        let core = entries[0]["core"].as_u64().expect("a core");
        let asked: Vec<u64> = v["cores_asked"]
            .as_array()
            .expect("cores_asked")
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        if nat {
            assert_eq!(asked, [core], "only the owner is asked, and holds it: {v}");
            assert_eq!(v["rewrite"]["reply_entry"]["core"], core, "{v}");
        } else {
            assert_eq!(asked, [0, 1], "DSR: every core is asked: {v}");
        }
        *held_by.entry(core).or_default() += 1;
        core_of.insert(*p, core);
    }
    assert_eq!(held_by.len(), 2, "both workers hold flows: {held_by:?}");

    if nat {
        // Each reply's 5-tuple: its flow's entry, on the flow's owner core.
        for ((p, _), v) in seen
            .iter()
            .zip(explain_all(&s, "udp", &replies(&seen, addr_of)))
        {
            assert_eq!(v["kind"], "reply", "{v}");
            assert_eq!(v["reply_entry"]["core"], core_of[p], "{v}");
            assert_eq!(v["forward_entry"]["core"], core_of[p], "{v}");
        }
    }
    eprintln!(
        "explain on two workers, {}: flows held per core {held_by:?}",
        if nat { "nat" } else { "dsr-l2" }
    );
    drop(gw);
}
