//! End-to-end tests of `strait testbed up|down` on the real `strait` binary: namespaces,
//! links, addresses, routes, backend servers and the generated configuration, checked from
//! inside the client namespace with curl.
//!
//! They need root, iproute2, procps, ethtool, curl and bash. Without them they fail with a
//! message saying what is missing, unless `STRAIT_SKIP_PRIVILEGED=1`, when they print a
//! loud SKIPPED line instead: a root-only suite must never pass silently where it did not
//! run.
//!
//! Every test works under its own prefix (`st{pid}{tag}`) so tests run in parallel, and
//! holds a guard that runs `strait testbed down` on drop, also when an assertion fails.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use strait_config::{Mode, Protocol};

const STRAIT: &str = env!("CARGO_BIN_EXE_strait");

#[path = "support/privileged.rs"]
mod gate;

/// Root and the tools these tests drive (see `support/privileged.rs`).
fn privileged(test: &str) -> bool {
    gate::privileged(
        test,
        &[
            ("ip", "-V", "iproute2"),
            ("curl", "--version", "curl"),
            ("ethtool", "--version", "ethtool"),
            ("sysctl", "--version", "procps"),
            ("bash", "--version", "bash"),
        ],
    )
}

fn prefix(tag: &str) -> String {
    format!("st{}{tag}", std::process::id())
}

fn strait(args: &[&str]) -> Output {
    Command::new(STRAIT)
        .args(args)
        .output()
        .expect("run the strait binary")
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// The namespaces named `{prefix}-...` that exist now, from `ip netns list`.
fn namespaces(prefix: &str) -> BTreeSet<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(out.status.success(), "ip netns list: {}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .map(str::to_owned)
        .collect()
}

/// Whether `pid` runs (exists and is not a zombie).
fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// A testbed brought up through the CLI; removed through the CLI on drop.
struct Testbed {
    prefix: String,
    summary: serde_json::Value,
}

impl Testbed {
    fn up(tag: &str, topology: &str, backends: usize) -> Testbed {
        let mut tb = Testbed {
            prefix: prefix(tag),
            summary: serde_json::Value::Null,
        };
        let n = backends.to_string();
        let out = strait(&[
            "testbed",
            "up",
            "--json",
            "--prefix",
            &tb.prefix,
            "--topology",
            topology,
            "--backends",
            &n,
        ]);
        assert!(
            out.status.success(),
            "strait testbed up failed:\n{}",
            text(&out.stderr)
        );
        tb.summary = serde_json::from_slice(&out.stdout).expect("up --json prints JSON");
        tb
    }

    fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }

    fn pids(&self) -> Vec<u64> {
        self.summary["backends"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["pid"].as_u64().unwrap())
            .collect()
    }

    fn config(&self) -> PathBuf {
        PathBuf::from(self.summary["config"].as_str().unwrap())
    }

    /// Runs `args` in namespace `{prefix}-{role}`; panics with its stderr if it fails.
    fn exec(&self, role: &str, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns(role)])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?} in {} failed ({}): {}",
            self.ns(role),
            out.status,
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// `curl` from the client namespace, response body only (or head and body with `-i`).
    fn curl(&self, extra: &[&str], url: &str) -> String {
        let mut args = vec!["curl", "-s", "-g", "--max-time", "5"];
        args.extend(extra);
        args.push(url);
        self.exec("client", &args)
    }

    /// One UDP datagram from the client to `host`:`port`, and the answer.
    fn udp(&self, host: &str, port: u16) -> String {
        // bash's /dev/udp connects a socket; dd reads the whole answer in one read.
        let script = format!(
            "exec 3<>/dev/udp/{host}/{port}; echo hi >&3; dd bs=2048 count=1 status=none <&3"
        );
        self.exec("client", &["timeout", "5", "bash", "-c", &script])
    }

    /// Makes the client send traffic for the gateway's IPv4 address to backend `mac`
    /// instead: on the wire, exactly what a dsr-l2 gateway does to a VIP packet.
    fn steer_client_to(&self, mac: &str) {
        let args = [
            "ip",
            "neigh",
            "replace",
            "192.0.2.1",
            "lladdr",
            mac,
            "dev",
            "eth0",
        ];
        self.exec("client", &args);
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let out = strait(&["testbed", "down", "--prefix", &self.prefix]);
        if !out.status.success() {
            eprintln!(
                "strait testbed down --prefix {} failed: {}",
                self.prefix,
                text(&out.stderr)
            );
        }
    }
}

/// Asserts that testbed `prefix` is completely gone.
fn assert_gone(prefix: &str, pids: &[u64]) {
    assert_eq!(
        namespaces(prefix),
        BTreeSet::new(),
        "namespaces left behind"
    );
    let dir = Path::new("/run/strait").join(prefix);
    assert!(!dir.exists(), "{} left behind", dir.display());
    for &pid in pids {
        assert!(!alive(pid), "backend server {pid} still runs");
    }
}

#[test]
fn one_arm_backends_answer_directly_and_on_the_vip() {
    if !privileged("one_arm_backends_answer_directly_and_on_the_vip") {
        return;
    }
    let tb = Testbed::up("a", "one-arm", 2);
    let p = tb.prefix.clone();
    let expected: BTreeSet<String> = ["b1", "b2", "client", "gw", "sw"]
        .iter()
        .map(|r| format!("{p}-{r}"))
        .collect();
    assert_eq!(namespaces(&p), expected);

    // Straight to each backend over the bridge, no gateway involved.
    for (i, b) in ["b1", "b2"].iter().enumerate() {
        let body = tb.curl(&[], &format!("http://198.51.100.1{}/", i + 1));
        assert!(
            body.starts_with(&format!("backend={b} client=192.0.2.2:")),
            "{body}"
        );
        let body = tb.curl(&[], &format!("http://198.51.100.1{}:8080/", i + 1));
        assert!(
            body.starts_with(&format!("backend={b} client=192.0.2.2:")),
            "{body}"
        );
    }
    assert_eq!(tb.curl(&[], "http://198.51.100.12/healthz"), "ok\n");
    let body = tb.curl(&[], "http://[2001:db8:b::12]/");
    assert!(
        body.starts_with("backend=b2 client=[2001:db8:c::2]:"),
        "{body}"
    );
    let answer = tb.udp("198.51.100.11", 5353);
    assert!(
        answer.starts_with("backend=b1 client=192.0.2.2:"),
        "{answer}"
    );

    // What a dsr-l2 gateway does: VIP packets to a backend's MAC. The backend accepts them
    // on the VIP held on lo and answers the client directly, from the VIP.
    tb.steer_client_to("02:00:00:00:01:12");
    let response = tb.curl(&["-i"], "http://203.0.113.10/");
    assert!(
        response.contains("X-Strait-Local: 203.0.113.10:80\r\n"),
        "{response}"
    );
    assert!(
        response.contains("\r\n\r\nbackend=b2 client=192.0.2.2:"),
        "{response}"
    );
    let answer = tb.udp("203.0.113.10", 5353);
    assert!(
        answer.starts_with("backend=b2 client=192.0.2.2:"),
        "{answer}"
    );
    // The backends keep quiet about the VIP: nobody answered ARP for it.
    let neigh = tb.exec("client", &["ip", "neigh", "show", "203.0.113.10"]);
    assert_eq!(neigh.trim(), "");
    let arp = tb.exec("b1", &["sysctl", "-n", "net.ipv4.conf.all.arp_ignore"]);
    assert_eq!(arp.trim(), "1");

    // Deterministic MACs.
    let link = tb.exec("gw", &["ip", "link", "show", "veth-gw"]);
    assert!(link.contains("link/ether 02:00:00:00:00:01 "), "{link}");
    let link = tb.exec("b2", &["ip", "link", "show", "eth0"]);
    assert!(link.contains("link/ether 02:00:00:00:01:12 "), "{link}");

    // The generated configuration parses and names the backends with their MACs.
    let config = strait_config::load(tb.config()).expect("generated config is valid");
    assert_eq!(config.gateway.interfaces[0].name, "veth-gw");
    let web = &config.services[0];
    assert_eq!((web.name.as_str(), web.mode), ("web", Mode::DsrL2));
    assert_eq!(web.frontend().to_string(), "203.0.113.10:80");
    let macs: Vec<String> = web
        .backends
        .iter()
        .map(|b| b.mac.unwrap().to_string())
        .collect();
    assert_eq!(macs, ["02:00:00:00:01:11", "02:00:00:00:01:12"]);
    assert_eq!(config.services[1].protocol, Protocol::Udp);

    let pids = tb.pids();
    assert!(pids.iter().all(|&pid| alive(pid)));
    drop(tb);
    assert_gone(&p, &pids);
}

#[test]
fn two_arm_kernel_path_through_the_gateway() {
    if !privileged("two_arm_kernel_path_through_the_gateway") {
        return;
    }
    let tb = Testbed::up("b", "two-arm", 2);
    let p = tb.prefix.clone();
    assert_eq!(namespaces(&p).len(), 5);

    // Client -> gateway (kernel forwarding) -> backend and back: client address preserved.
    let body = tb.curl(&[], "http://198.51.100.11/");
    assert!(body.starts_with("backend=b1 client=192.0.2.2:"), "{body}");
    let body = tb.curl(&[], "http://198.51.100.12:8080/");
    assert!(body.starts_with("backend=b2 client=192.0.2.2:"), "{body}");
    let body = tb.curl(&[], "http://[2001:db8:b::11]:8080/");
    assert!(
        body.starts_with("backend=b1 client=[2001:db8:c::2]:"),
        "{body}"
    );
    let answer = tb.udp("198.51.100.12", 5353);
    assert!(
        answer.starts_with("backend=b2 client=192.0.2.2:"),
        "{answer}"
    );
    let fwd = tb.exec("gw", &["sysctl", "-n", "net.ipv4.ip_forward"]);
    assert_eq!(fwd.trim(), "1");
    // The backends do not hold the VIP in nat mode.
    let lo = tb.exec("b1", &["ip", "addr", "show", "dev", "lo"]);
    assert!(!lo.contains("203.0.113.10"), "{lo}");

    let config = strait_config::load(tb.config()).expect("generated config is valid");
    let ifs: Vec<&str> = config
        .gateway
        .interfaces
        .iter()
        .map(|i| i.name.as_str())
        .collect();
    assert_eq!(ifs, ["veth-c", "veth-b"]);
    let web = &config.services[0];
    assert_eq!(web.mode, Mode::Nat);
    assert_eq!(
        web.backends[1].socket_addr().to_string(),
        "198.51.100.12:8080"
    );

    let pids = tb.pids();
    drop(tb);
    assert_gone(&p, &pids);
}

#[test]
fn guard_cleans_up_when_a_test_panics() {
    if !privileged("guard_cleans_up_when_a_test_panics") {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::thread::spawn(move || {
        let tb = Testbed::up("c", "one-arm", 1);
        tx.send((tb.prefix.clone(), tb.pids())).unwrap();
        panic!("deliberate failure with a testbed up");
    })
    .join();
    assert!(result.is_err());
    let (p, pids) = rx.recv().unwrap();
    assert_gone(&p, &pids);
}

#[test]
fn a_failed_up_removes_what_it_made() {
    if !privileged("a_failed_up_removes_what_it_made") {
        return;
    }
    // An ethtool that fails: `up` stops after the namespaces and links exist.
    let stub = std::env::temp_dir().join(format!("strait-stub-{}", std::process::id()));
    std::fs::create_dir_all(&stub).unwrap();
    let ethtool = stub.join("ethtool");
    std::fs::write(
        &ethtool,
        "#!/bin/sh\necho 'stub ethtool says no' >&2\nexit 1\n",
    )
    .unwrap();
    let exec = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(&ethtool, exec).unwrap();
    let path = format!(
        "{}:{}",
        stub.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let p = prefix("d");
    let out = Command::new(STRAIT)
        .args(["testbed", "up", "--prefix", &p, "--backends", "2"])
        .env("PATH", path)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&stub);
    let _guard = Testbed {
        prefix: p.clone(),
        summary: serde_json::Value::Null,
    };
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("ethtool -K") && err.contains("stub ethtool says no"),
        "{err}"
    );
    assert_gone(&p, &[]);
}

#[test]
fn down_removes_only_its_own_and_up_refuses_to_clobber() {
    if !privileged("down_removes_only_its_own_and_up_refuses_to_clobber") {
        return;
    }
    let p = prefix("e");
    // Namespaces that share the prefix's text but belong to someone else.
    let foreign = [
        format!("{p}-x-client"),
        format!("{p}x-gw"),
        format!("{p}-other"),
    ];
    struct Foreign<'a>(&'a [String]);
    impl Drop for Foreign<'_> {
        fn drop(&mut self) {
            for ns in self.0 {
                let _ = Command::new("ip").args(["netns", "del", ns]).output();
            }
        }
    }
    let _foreign = Foreign(&foreign);
    for ns in &foreign {
        let out = Command::new("ip")
            .args(["netns", "add", ns])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    }

    let down = strait(&["testbed", "down", "--prefix", &p]);
    assert!(down.status.success(), "{}", text(&down.stderr));
    assert!(text(&down.stdout).contains("removed 0 namespaces"));

    let tb = Testbed::up("e", "one-arm", 1);
    let again = strait(&["testbed", "up", "--prefix", &p]);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains(&format!("testbed \"{p}\" exists already")),
        "{}",
        text(&again.stderr)
    );
    drop(tb);
    let left = namespaces(&p);
    let expected: BTreeSet<String> = [format!("{p}-x-client"), format!("{p}-other")].into();
    assert_eq!(left, expected);
    assert_eq!(namespaces(&format!("{p}x")).len(), 1);
}

#[test]
fn bad_options_fail_with_a_clear_message() {
    // No privileges needed: refused before anything is created.
    let out = strait(&["testbed", "up", "--prefix", "../etc"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("testbed prefix \"../etc\" must be"));
    let out = strait(&["testbed", "up", "--backends", "0", "--prefix", "st-none"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("0 backends: the testbed has 1 to 200"));
}
