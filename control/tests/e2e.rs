//! End to end: the testbed, the gateway (`strait run` with its AF_XDP workers and XDP
//! program) and real clients and servers in network namespaces. Needs root; fails with a
//! clear message without it unless `STRAIT_SKIP_PRIVILEGED=1` (CI never sets it).
//!
//! Each test brings up its own testbed under a unique prefix and tears it down on drop (also
//! when the test fails). The tests run one at a time: each gateway runs a busy-polling worker,
//! and two of them on a two-core machine would measure each other.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde_json::Value;

const STRAIT: &str = env!("CARGO_BIN_EXE_strait");
const VIP: &str = "203.0.113.10";
static SERIAL: Mutex<()> = Mutex::new(());

#[path = "support/privileged.rs"]
mod gate;

/// Root and the tools these tests drive (see `support/privileged.rs`).
fn privileged() -> bool {
    gate::privileged(
        "end-to-end",
        &[
            ("ip", "-V", "iproute2"),
            ("curl", "--version", "curl"),
            ("ping", "-V", "iputils-ping"),
            ("tcpdump", "--version", "tcpdump"),
            ("tshark", "--version", "tshark"),
            ("arping", "-V", "iputils-arping"),
        ],
    )
}

fn client_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/client.py")
}

fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    out
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A testbed, torn down on drop.
struct Bed {
    prefix: String,
    info: Value,
}

impl Bed {
    fn up(tag: &str, args: &[&str]) -> Bed {
        let prefix = format!("se{}{tag}", std::process::id() % 100_000);
        let out = run(Command::new(STRAIT)
            .args(["testbed", "up", "--prefix", &prefix, "--json"])
            .args(args));
        assert!(
            out.status.success(),
            "testbed up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let info = serde_json::from_slice(&out.stdout).expect("testbed summary");
        Bed { prefix, info }
    }

    fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }

    fn config(&self) -> PathBuf {
        PathBuf::from(self.info["config"].as_str().expect("config path"))
    }

    /// Runs a command in a namespace of the testbed.
    fn exec(&self, role: &str, args: &[&str]) -> Output {
        run(Command::new("ip")
            .args(["netns", "exec", &self.ns(role)])
            .args(args))
    }

    fn curl(&self, url: &str) -> Option<String> {
        let o = self.exec("client", &["curl", "-s", "--max-time", "3", url]);
        o.status.success().then(|| text(&o).trim().to_string())
    }

    /// `n` HTTP requests to the VIP, each a new connection; the answers.
    fn requests(&self, n: usize) -> Vec<Option<String>> {
        (0..n)
            .map(|_| self.curl(&format!("http://{VIP}/")))
            .collect()
    }

    fn backend_pid(&self, name: &str) -> i32 {
        self.info["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == name)
            .and_then(|b| b["pid"].as_i64())
            .expect("backend pid") as i32
    }

    fn python(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns("client"), python()])
            .arg(client_py())
            .args(args);
        c
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        let _ = Command::new(STRAIT)
            .args(["testbed", "down", "--prefix", &self.prefix])
            .output();
    }
}

/// A gateway process in the testbed's gateway namespace, stopped (SIGTERM) on drop.
struct Gateway<'b> {
    bed: &'b Bed,
    child: Option<Child>,
    log: PathBuf,
}

impl<'b> Gateway<'b> {
    fn start(bed: &'b Bed, config: &Path) -> Gateway<'b> {
        let log = std::env::temp_dir().join(format!("{}-gw.log", bed.prefix));
        let child = Command::new("ip")
            .args(["netns", "exec", &bed.ns("gw"), STRAIT, "run", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("strait run");
        let mut g = Gateway {
            bed,
            child: Some(child),
            log,
        };
        // Ready when the workers publish counters and every backend is up.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = g.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("gateway exited ({s}):\n{}", g.log_text());
            }
            let ok = g.admin("GET", "/healthz") == "ok\n"
                && g.services().map(|v| all_up(&v)).unwrap_or(false);
            if ok {
                return g;
            }
            assert!(
                Instant::now() < deadline,
                "gateway not ready in 20 s:\n{}",
                g.log_text()
            );
            sleep(Duration::from_millis(100));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn admin(&self, method: &str, path: &str) -> String {
        let o = self.bed.exec(
            "gw",
            &[
                "curl",
                "-s",
                "--max-time",
                "5",
                "-X",
                method,
                &format!("http://127.0.0.1:9900{path}"),
            ],
        );
        text(&o)
    }

    fn metrics(&self) -> String {
        self.admin("GET", "/metrics")
    }

    fn services(&self) -> Option<Value> {
        serde_json::from_str(&self.admin("GET", "/services")).ok()
    }

    fn metric(&self, name: &str) -> u64 {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    /// Sends SIGTERM and waits; the exit status.
    fn stop(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        child.wait().expect("wait")
    }
}

impl Drop for Gateway<'_> {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.stop();
        }
    }
}

/// Every backend up, or without a health check.
fn all_up(v: &Value) -> bool {
    v["services"].as_array().is_some_and(|s| {
        s.iter().all(|s| {
            s["backends"]
                .as_array()
                .is_some_and(|b| b.iter().all(|b| b["health"] != "down"))
        })
    })
}

fn health_of(v: &Value, service: &str, addr: &str) -> String {
    v["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == service)
        .and_then(|s| {
            s["backends"]
                .as_array()
                .unwrap()
                .iter()
                .find(|b| b["address"] == addr)
        })
        .map(|b| b["health"].as_str().unwrap_or("?").to_string())
        .unwrap_or_default()
}

/// Counts answers per backend name (`backend=bN client=...`), and checks the client address.
fn per_backend(answers: &[Option<String>]) -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for a in answers.iter().flatten() {
        let name = a
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_start_matches("backend=")
            .to_string();
        assert!(
            a.contains("client=192.0.2.2:"),
            "the backend did not see the client's address: {a}"
        );
        *m.entry(name).or_default() += 1;
    }
    m
}

fn write_config(bed: &Bed, edit: impl Fn(&str) -> String) -> PathBuf {
    let text = std::fs::read_to_string(bed.config()).unwrap();
    let path = std::env::temp_dir().join(format!("{}-edited.toml", bed.prefix));
    std::fs::write(&path, edit(&text)).unwrap();
    path
}

#[test]
fn a_dsr_l2_http_reaches_every_backend_with_the_client_address_and_i_leaves_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !privileged() {
        return;
    }
    let bed = Bed::up("a", &["--backends", "4"]);
    let mut gw = Gateway::start(&bed, &bed.config());
    let answers = bed.requests(300);
    let failed = answers.iter().filter(|a| a.is_none()).count();
    assert_eq!(failed, 0, "{failed} of 300 requests failed");
    let per = per_backend(&answers);
    assert_eq!(per.len(), 4, "{per:?}");
    for (b, n) in &per {
        assert!(
            (38..=150).contains(n),
            "{b} got {n} of 300: outside half to double its fair share (75)"
        );
    }
    // i. SIGTERM: exit 0, no XDP program left on the interface.
    let status = gw.stop();
    assert!(status.success(), "exit {status}:\n{}", gw.log_text());
    let link = text(&bed.exec("gw", &["ip", "link", "show", "veth-gw"]));
    assert!(
        !link.contains("xdp"),
        "an XDP program is still attached:\n{link}"
    );
    let prefix = bed.prefix.clone();
    drop(gw);
    drop(bed);
    let left = text(&run(Command::new("ip").args(["netns", "list"])));
    assert!(!left.contains(&prefix), "namespaces left behind:\n{left}");
}

#[test]
fn d_the_kernel_still_owns_everything_else() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !privileged() {
        return;
    }
    let bed = Bed::up("d", &["--backends", "2"]);
    let gw = Gateway::start(&bed, &bed.config());
    // A TCP server on a non-service port of the gateway itself.
    let mut server = Command::new("ip")
        .args([
            "netns",
            "exec",
            &bed.ns("gw"),
            STRAIT,
            "testbed",
            "serve",
            "--name",
            "gw",
            "--tcp",
            "192.0.2.1:2222",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    sleep(Duration::from_millis(300));
    let ping = bed.exec("client", &["ping", "-c", "2", "-W", "2", "192.0.2.1"]);
    let tcp = bed.curl("http://192.0.2.1:2222/");
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        ping.status.success(),
        "ping to the gateway failed: {}",
        text(&ping)
    );
    assert_eq!(
        tcp.as_deref()
            .map(|t| t.starts_with("backend=gw client=192.0.2.2:")),
        Some(true),
        "{tcp:?}"
    );
    // And service traffic still flows meanwhile.
    assert!(bed.curl(&format!("http://{VIP}/")).is_some());
    drop(gw);
}

#[test]
fn e_a_dead_backend_is_taken_out_fast_and_others_streams_do_not_notice() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !privileged() {
        return;
    }
    let bed = Bed::up("e", &["--backends", "3"]);
    let gw = Gateway::start(&bed, &bed.config());
    // Long-lived streams, opened before the failure, on several backends.
    let streams = bed
        .python(&["stream", VIP, "12", "6"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    sleep(Duration::from_millis(1500));
    let pid = bed.backend_pid("b1");
    assert!(Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let killed = Instant::now();
    loop {
        let v = gw.services().expect("services");
        if health_of(&v, "web", "198.51.100.11") == "down" {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(3),
            "backend not marked down within 3 s"
        );
        sleep(Duration::from_millis(50));
    }
    let down_after = killed.elapsed();
    let answers = bed.requests(60);
    assert!(
        answers.iter().all(Option::is_some),
        "requests failed after the backend was marked down"
    );
    assert!(
        !per_backend(&answers).contains_key("b1"),
        "new flows still went to the dead backend"
    );
    let out = streams.wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout).to_string();
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
    let mut revived = Command::new("ip")
        .args([
            "netns",
            "exec",
            &bed.ns("b1"),
            STRAIT,
            "testbed",
            "serve",
            "--name",
            "b1",
            "--tcp",
            "[::]:80",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let back = Instant::now();
    while health_of(&gw.services().unwrap(), "web", "198.51.100.11") != "up" {
        assert!(
            back.elapsed() < Duration::from_secs(5),
            "revived backend not up in 5 s"
        );
        sleep(Duration::from_millis(50));
    }
    let again = per_backend(&bed.requests(60));
    let _ = revived.kill();
    let _ = revived.wait();
    assert!(
        again.get("b1").copied().unwrap_or(0) > 0,
        "the revived backend takes no new flows: {again:?}"
    );
    eprintln!("backend marked down {down_after:?} after its server died");
    drop(gw);
}

/// Opens keep-alive connections through the gateway; `round()` sends one more request on each.
struct KeepAlive {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl KeepAlive {
    fn open(bed: &Bed, n: usize) -> (KeepAlive, Vec<String>) {
        let mut child = bed
            .python(&["keepalive", VIP, &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut k = KeepAlive {
            child,
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
                "client exited"
            );
            let line = line.trim().to_string();
            if line == "END" {
                return out;
            }
            out.push(line);
        }
    }

    fn round(&mut self) -> Vec<String> {
        writeln!(self.stdin, "again").unwrap();
        self.stdin.flush().unwrap();
        self.read_round()
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn reload(gw: &Gateway<'_>, bed: &Bed, config: &Path) {
    std::fs::copy(config, bed.config()).unwrap();
    let answer = gw.admin("POST", "/reload");
    assert!(answer.starts_with("reloaded"), "reload refused: {answer}");
}

#[test]
fn f_draining_keeps_existing_connections_and_takes_no_new_ones() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !privileged() {
        return;
    }
    let bed = Bed::up("f", &["--backends", "3"]);
    let gw = Gateway::start(&bed, &bed.config());
    let (mut conns, first) = KeepAlive::open(&bed, 24);
    assert!(
        first.iter().any(|a| a.starts_with("backend=b2 ")),
        "no connection landed on b2: {first:?}"
    );
    // Drain b2 (its first service `web`): weight 0 via a reload.
    let drained = write_config(&bed, |t| {
        t.replacen(
            "address = \"198.51.100.12\"\nport = 80\n",
            "address = \"198.51.100.12\"\nport = 80\nweight = 0\n",
            1,
        )
    });
    reload(&gw, &bed, &drained);
    let second = conns.round();
    assert_eq!(
        second, first,
        "existing connections moved or broke after draining"
    );
    let fresh = per_backend(&bed.requests(60));
    assert!(
        !fresh.contains_key("b2"),
        "a draining backend took new flows: {fresh:?}"
    );
    drop(conns);
    drop(gw);
}

#[test]
fn g_a_reload_adding_a_backend_breaks_nothing_and_it_takes_new_flows() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !privileged() {
        return;
    }
    let bed = Bed::up("g", &["--backends", "3"]);
    // Start with b3 absent from `web`.
    let without = write_config(&bed, |t| {
        let start = t
            .find("[[services.backends]]\naddress = \"198.51.100.13\"\nport = 80\n")
            .expect("b3 in web");
        let end = t[start + 10..]
            .find("[[")
            .map_or(t.len(), |e| start + 10 + e);
        format!("{}{}", &t[..start], &t[end..])
    });
    let full = std::env::temp_dir().join(format!("{}-full.toml", bed.prefix));
    std::fs::copy(bed.config(), &full).unwrap();
    std::fs::copy(&without, bed.config()).unwrap();
    let gw = Gateway::start(&bed, &bed.config());
    let (mut conns, first) = KeepAlive::open(&bed, 24);
    assert!(
        !first.iter().any(|a| a.starts_with("backend=b3 ")),
        "b3 answered before it was configured"
    );
    reload(&gw, &bed, &full);
    assert_eq!(
        conns.round(),
        first,
        "an established connection moved or broke on reload"
    );
    let fresh = per_backend(&bed.requests(90));
    assert!(
        fresh.get("b3").copied().unwrap_or(0) > 0,
        "the added backend took no new flows: {fresh:?}"
    );
    drop(conns);
    drop(gw);
}

#[test]
fn h_ten_thousand_udp_flows_are_all_delivered_and_the_books_balance() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !privileged() {
        return;
    }
    let bed = Bed::up("h", &["--backends", "4"]);
    let gw = Gateway::start(&bed, &bed.config());
    let out = bed
        .python(&["udp", VIP, "5353", "20000", "10000"])
        .output()
        .unwrap();
    let report = text(&out);
    assert!(
        report.contains("sent=10000 answered=10000"),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The workers publish when idle; give them a moment, then the identity must hold exactly.
    sleep(Duration::from_millis(500));
    let rx = gw.metric("strait_rx_packets_total");
    let tx = gw.metric("strait_tx_packets_total");
    let pass = gw.metric("strait_pass_packets_total");
    let handoff = gw.metric("strait_handoff_packets_total");
    let drops = gw.metric("strait_dropped_packets_total");
    assert!(rx >= 10_000, "rx {rx}");
    assert_eq!(
        rx,
        tx + pass + handoff + drops,
        "rx {rx} != tx {tx} + pass {pass} + handoff {handoff} + drops {drops}"
    );
    let created =
        gw.metric("strait_flows_created_total") + gw.metric("strait_flows_stateless_total");
    assert!(
        created >= 10_000,
        "10,000 distinct 5-tuples made {created} flows"
    );
    drop(gw);
}

/// Captures on the interfaces of `backends` while `traffic` runs; one pcap per backend.
fn capture(bed: &Bed, backends: &[&str], filter: &str, traffic: impl FnOnce()) -> Vec<PathBuf> {
    let mut running = Vec::new();
    for b in backends {
        let pcap = std::env::temp_dir().join(format!("{}-{b}.pcap", bed.prefix));
        let tcpdump = Command::new("ip")
            .args([
                "netns",
                "exec",
                &bed.ns(b),
                "tcpdump",
                "-U",
                "-n",
                "-i",
                "eth0",
                "-w",
            ])
            .arg(&pcap)
            .arg(filter)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tcpdump");
        running.push((pcap, tcpdump));
    }
    sleep(Duration::from_millis(800));
    traffic();
    sleep(Duration::from_millis(500));
    running
        .into_iter()
        .map(|(pcap, mut t)| {
            let _ = Command::new("kill")
                .args(["-INT", &t.id().to_string()])
                .status();
            let _ = t.wait();
            pcap
        })
        .collect()
}

/// tshark's reading of a capture, one line per packet, tab-separated `fields`, with every
/// checksum verified.
fn tshark(pcap: &Path, fields: &[&str], decode_as: Option<&str>) -> Vec<String> {
    let mut c = Command::new("tshark");
    c.arg("-r").arg(pcap).args([
        "-o",
        "ip.check_checksum:TRUE",
        "-o",
        "tcp.check_checksum:TRUE",
        "-o",
        "udp.check_checksum:TRUE",
        "-T",
        "fields",
        "-E",
        "separator=/t",
    ]);
    if let Some(d) = decode_as {
        c.args(["-d", d]);
    }
    for f in fields {
        c.args(["-e", f]);
    }
    let out = run(&mut c);
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text(&out).lines().map(str::to_string).collect()
}

#[test]
fn c_ipip_and_gue_leave_encapsulated_with_valid_checksums() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !privileged() {
        return;
    }
    let bed = Bed::up("c", &["--backends", "2"]);
    // `web` becomes dsr-ipip on port 80; a second service, dsr-gue on port 81, over the same
    // backends (no server listens on 81: this kernel cannot decapsulate either, so only the
    // packets on the wire are checked). No tunnel source is configured: the gateway takes its
    // own address on the backend-facing interface.
    let cfg = write_config(&bed, |t| {
        let t = t.replacen("mode = \"dsr-l2\"", "mode = \"dsr-ipip\"", 1);
        format!(
            "{t}\n[[services]]\nname = \"gue\"\nvip = \"{VIP}\"\nport = 81\nmode = \"dsr-gue\"\n\
             backends = [{{ address = \"198.51.100.11\", port = 81, mac = \"02:00:00:00:01:11\" }}]\n"
        )
    });
    let gw = Gateway::start(&bed, &cfg);
    let pcaps = capture(&bed, &["b1", "b2"], "ip proto 4 or udp port 6080", || {
        for port in [80, 81, 80, 81] {
            let _ = bed.exec(
                "client",
                &[
                    "curl",
                    "-s",
                    "--max-time",
                    "1",
                    &format!("http://{VIP}:{port}/"),
                ],
            );
        }
    });
    let fields = [
        "ip.proto",
        "ip.src",
        "ip.dst",
        "ip.checksum.status",
        "udp.dstport",
        "udp.checksum.status",
        "tcp.dstport",
        "tcp.checksum.status",
        "_ws.malformed",
        "_ws.expert.severity",
    ];
    let lines: Vec<String> = pcaps
        .iter()
        .flat_map(|p| tshark(p, &fields, Some("udp.port==6080,ip")))
        .collect();
    let (mut ipip, mut gue) = (0, 0);
    for l in &lines {
        let f: Vec<&str> = l.split('\t').collect();
        assert!(f[8].is_empty(), "malformed packet: {l}");
        assert!(
            !f[3].split(',').any(|s| s == "0"),
            "bad IP header checksum: {l}"
        );
        assert!(!f[7].split(',').any(|s| s == "0"), "bad TCP checksum: {l}");
        // Outer and inner headers come comma-separated, outer first.
        let protos: Vec<&str> = f[0].split(',').collect();
        let (src, dst): (Vec<&str>, Vec<&str>) =
            (f[1].split(',').collect(), f[2].split(',').collect());
        assert!(
            ["198.51.100.11", "198.51.100.12"].contains(&dst[0]),
            "outer destination is a backend node: {l}"
        );
        assert!(
            src[0].starts_with("192.0.2."),
            "outer source from the tunnel source /24: {l}"
        );
        assert_eq!(
            src.last(),
            Some(&"192.0.2.2"),
            "inner source is the client: {l}"
        );
        assert_eq!(dst.last(), Some(&VIP), "inner destination is the VIP: {l}");
        match protos[0] {
            "4" => {
                ipip += 1;
                assert_eq!(f[6], "80", "{l}");
            }
            "17" => {
                gue += 1;
                assert_eq!(f[4], "6080", "{l}");
                assert_eq!(f[6], "81", "{l}");
            }
            p => panic!("unexpected outer protocol {p}: {l}"),
        }
    }
    assert!(
        ipip >= 2 && gue >= 2,
        "ipip {ipip}, gue {gue} packets captured:\n{lines:#?}"
    );
    for p in pcaps {
        let _ = std::fs::remove_file(p);
    }
    drop(gw);
}

#[test]
fn b_nat_two_arm_translates_both_ways_and_keeps_the_client_address() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !privileged() {
        return;
    }
    let bed = Bed::up("b", &["--topology", "two-arm", "--backends", "4"]);
    // Ready means every backend passed its health check through the gateway's own kernel
    // path: the replies from backend:8080 to the gateway must not be taken for nat replies.
    let gw = Gateway::start(&bed, &bed.config());
    let answers = bed.requests(300);
    let failed = answers.iter().filter(|a| a.is_none()).count();
    assert_eq!(
        failed,
        0,
        "{failed} of 300 requests failed:\n{}",
        gw.log_text()
    );
    let per = per_backend(&answers);
    assert_eq!(per.len(), 4, "{per:?}");
    for (b, n) in &per {
        assert!(
            (38..=150).contains(n),
            "{b} got {n} of 300: outside half to double its fair share (75)"
        );
    }
    // UDP through nat: 53 on the VIP to 5353 on a backend, and back from the VIP.
    let out = bed
        .python(&["udp", VIP, "53", "31000", "200"])
        .output()
        .unwrap();
    assert!(
        text(&out).contains("sent=200 answered=200"),
        "{}",
        text(&out)
    );
    let handoff = gw.metric("strait_handoff_packets_total");
    let rx = gw.metric("strait_rx_packets_total");
    let tx = gw.metric("strait_tx_packets_total");
    assert!(tx > 0 && rx >= tx, "rx {rx} tx {tx} handoff {handoff}");
    drop(gw);
}

#[test]
fn j_backends_without_macs_are_reached_through_the_neighbour_table() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !privileged() {
        return;
    }
    let bed = Bed::up("j", &["--backends", "3"]);
    // As the Kubernetes source produces them: no MACs anywhere.
    let cfg = write_config(&bed, |t| {
        t.lines()
            .filter(|l| !l.starts_with("mac = "))
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    });
    assert!(!std::fs::read_to_string(&cfg).unwrap().contains("mac = "));
    let gw = Gateway::start(&bed, &cfg);
    // The health checks make the kernel resolve the backends; the gateway picks them up.
    let deadline = Instant::now() + Duration::from_secs(5);
    let answers = loop {
        let a = bed.requests(30);
        if a.iter().all(Option::is_some) || Instant::now() > deadline {
            break a;
        }
        sleep(Duration::from_millis(300));
    };
    assert!(
        answers.iter().all(Option::is_some),
        "requests failed:\n{}",
        gw.log_text()
    );
    assert_eq!(per_backend(&answers).len(), 3);
    drop(gw);
}
