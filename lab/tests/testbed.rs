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

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use strait_config::{Mode, Protocol};
use support::bed::{Bed, CLIENT};
use support::harness::{namespaces, text, Netns, LAB};
use support::privileged as gate;

/// Root and the tools these tests drive (see `strait_testkit::privileged`).
fn privileged(test: &str) -> bool {
    gate::privileged(
        test,
        &[
            gate::IP,
            gate::CURL,
            gate::ETHTOOL,
            gate::SYSCTL,
            gate::BASH,
        ],
    )
}

fn prefix(tag: &str) -> String {
    format!("st{}{tag}", std::process::id())
}

fn strait(args: &[&str]) -> Output {
    Command::new(LAB)
        .args(args)
        .output()
        .expect("run the strait binary")
}

/// Whether `pid` runs (exists and is not a zombie).
fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// A testbed brought up through the CLI (`st{pid}{tag}`); removed through the CLI on drop.
fn up(tag: &str, topology: &str, backends: usize) -> Bed {
    let n = backends.to_string();
    Bed::up(&prefix(tag), &["--topology", topology, "--backends", &n])
}

impl Bed {
    fn pids(&self) -> Vec<u64> {
        self.backends()
            .iter()
            .map(|b| b["pid"].as_u64().unwrap())
            .collect()
    }

    /// `curl` from the client namespace, response body only (or head and body with `-i`).
    fn fetch(&self, extra: &[&str], url: &str) -> String {
        let mut args = vec!["curl", "-s", "-g", "--max-time", "5"];
        args.extend(extra);
        args.push(url);
        self.must("client", &args)
    }

    /// One UDP datagram from the client to `host`:`port`, and the answer.
    fn udp(&self, host: &str, port: u16) -> String {
        // bash's /dev/udp connects a socket; dd reads the whole answer in one read.
        let script = format!(
            "exec 3<>/dev/udp/{host}/{port}; echo hi >&3; dd bs=2048 count=1 status=none <&3"
        );
        self.must("client", &["timeout", "5", "bash", "-c", &script])
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
        self.must("client", &args);
    }
}

/// Asserts that `answer` comes from `backend` and shows the client's `address` (its IPv4
/// address, or `[IPv6]`) with a port.
fn assert_from(answer: &str, backend: &str, address: &str) {
    assert!(
        answer.starts_with(&format!("backend={backend} client={address}:")),
        "{answer}"
    );
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
    let tb = up("a", "one-arm", 2);
    let p = tb.prefix.clone();
    let expected: BTreeSet<String> = ["b1", "b2", "client", "gw", "sw"]
        .iter()
        .map(|r| format!("{p}-{r}"))
        .collect();
    assert_eq!(namespaces(&p), expected);

    // Straight to each backend over the bridge, no gateway involved.
    for (i, b) in ["b1", "b2"].iter().enumerate() {
        let body = tb.fetch(&[], &format!("http://198.51.100.1{}/", i + 1));
        assert_from(&body, b, CLIENT);
        let body = tb.fetch(&[], &format!("http://198.51.100.1{}:8080/", i + 1));
        assert_from(&body, b, CLIENT);
    }
    assert_eq!(tb.fetch(&[], "http://198.51.100.12/healthz"), "ok\n");
    let body = tb.fetch(&[], "http://[2001:db8:b::12]/");
    assert_from(&body, "b2", "[2001:db8:c::2]");
    assert_from(&tb.udp("198.51.100.11", 5353), "b1", CLIENT);

    // What a dsr-l2 gateway does: VIP packets to a backend's MAC. The backend accepts them
    // on the VIP held on lo and answers the client directly, from the VIP.
    tb.steer_client_to("02:00:00:00:01:12");
    let response = tb.fetch(&["-i"], "http://203.0.113.10/");
    assert!(
        response.contains("X-Strait-Local: 203.0.113.10:80\r\n"),
        "{response}"
    );
    assert!(
        response.contains("\r\n\r\nbackend=b2 client=192.0.2.2:"),
        "{response}"
    );
    assert_from(&tb.udp("203.0.113.10", 5353), "b2", CLIENT);
    // The backends keep quiet about the VIP: nobody answered ARP for it.
    let neigh = tb.must("client", &["ip", "neigh", "show", "203.0.113.10"]);
    assert_eq!(neigh.trim(), "");
    let arp = tb.must("b1", &["sysctl", "-n", "net.ipv4.conf.all.arp_ignore"]);
    assert_eq!(arp.trim(), "1");

    // Deterministic MACs.
    let link = tb.must("gw", &["ip", "link", "show", "veth-gw"]);
    assert!(link.contains("link/ether 02:00:00:00:00:01 "), "{link}");
    let link = tb.must("b2", &["ip", "link", "show", "eth0"]);
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
    let tb = up("b", "two-arm", 2);
    let p = tb.prefix.clone();
    assert_eq!(namespaces(&p).len(), 5);

    // Client -> gateway (kernel forwarding) -> backend and back: client address preserved.
    assert_from(&tb.fetch(&[], "http://198.51.100.11/"), "b1", CLIENT);
    assert_from(&tb.fetch(&[], "http://198.51.100.12:8080/"), "b2", CLIENT);
    let body = tb.fetch(&[], "http://[2001:db8:b::11]:8080/");
    assert_from(&body, "b1", "[2001:db8:c::2]");
    assert_from(&tb.udp("198.51.100.12", 5353), "b2", CLIENT);
    let fwd = tb.must("gw", &["sysctl", "-n", "net.ipv4.ip_forward"]);
    assert_eq!(fwd.trim(), "1");
    // The backends do not hold the VIP in nat mode.
    let lo = tb.must("b1", &["ip", "addr", "show", "dev", "lo"]);
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
        let tb = up("c", "one-arm", 1);
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
    let out = Command::new(LAB)
        .args(["testbed", "up", "--prefix", &p, "--backends", "2"])
        .env("PATH", path)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&stub);
    let _guard = Bed::guard(&p);
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
    let _foreign: Vec<Netns> = foreign.iter().map(|ns| Netns::add(ns)).collect();

    let down = strait(&["testbed", "down", "--prefix", &p]);
    assert!(down.status.success(), "{}", text(&down.stderr));
    assert!(text(&down.stdout).contains("removed 0 namespaces"));

    let tb = up("e", "one-arm", 1);
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
