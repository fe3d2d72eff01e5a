//! UDP and DNS health checks against real servers, in a network namespace of their own on
//! documentation addresses: a UDP echo server (and one that reads and never answers) made
//! here, and Debian's dnsmasq answering, refusing, silenced by an nftables drop rule, or
//! stopped; a raw responder answers SERVFAIL. Each check is `strait_control::health::probe`,
//! the function the checker's threads run.

use std::net::{SocketAddr, UdpSocket};
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use strait_config::model::{DnsType, HealthCheck, HealthKind};
use strait_control::health::probe;
use strait_testkit::harness::{in_ns, must, sh, wait_for, wait_port_closed, Netns, Proc};
use strait_testkit::privileged::{self as gate, Tool};

const DNSMASQ: Tool = ("dnsmasq", "--version", "dnsmasq-base");
const ADDR: &str = "192.0.2.1";
/// Long enough for an answer from another process on a loaded 2-CPU machine; the checks
/// that fail "at once" must end in a third of it, those that time out take all of it.
const TIMEOUT: Duration = Duration::from_secs(1);

fn check(kind: HealthKind) -> HealthCheck {
    HealthCheck {
        kind,
        port: None,
        interval: Duration::from_secs(1),
        timeout: TIMEOUT,
        rise: 1,
        fall: 1,
    }
}

fn udp(payload: &[u8], expect: Option<&[u8]>) -> HealthCheck {
    check(HealthKind::Udp {
        payload: payload.to_vec(),
        expect: expect.map(<[u8]>::to_vec),
    })
}

fn dns(query: &str) -> HealthCheck {
    check(HealthKind::Dns {
        query: query.into(),
        qtype: DnsType::A,
    })
}

/// A quiet namespace with [`ADDR`] on its loopback.
fn namespace(tag: &str) -> Netns {
    let ns = Netns::quiet(&format!("hu{}-{tag}", std::process::id()));
    sh(&[
        "ip",
        "-n",
        ns.name(),
        "addr",
        "add",
        &format!("{ADDR}/32"),
        "dev",
        "lo",
    ]);
    ns
}

/// A UDP socket bound in `ns` at [`ADDR`]:`port` (0: any).
fn bind(ns: &Netns, port: u16) -> UdpSocket {
    ns.run_in(|| UdpSocket::bind((ADDR, port)).expect("binding in the namespace"))
}

/// `probe` run from inside `ns`, with how long it took.
fn probe_in(ns: &Netns, hc: &HealthCheck, addr: SocketAddr) -> (Result<(), String>, Duration) {
    ns.run_in(|| {
        let t = Instant::now();
        (probe(hc, addr), t.elapsed())
    })
}

#[track_caller]
fn down_with(r: &(Result<(), String>, Duration), cause: &str) {
    let e = r.0.as_ref().expect_err("the check failed");
    assert!(e.contains(cause), "{e:?} does not say {cause:?}");
}

#[test]
fn udp_check_follows_a_real_echo_server() {
    if !gate::privileged("udp health check", &[gate::IP, gate::SYSCTL]) {
        return;
    }
    let ns = namespace("echo");
    let server = bind(&ns, 0);
    let addr = server.local_addr().unwrap();
    let echo = server.try_clone().unwrap();
    let echoing = thread::spawn(move || {
        let mut buf = [0u8; 2048];
        // Ends when the test shuts the socket down (an error or an empty read).
        while let Ok((n, from)) = echo.recv_from(&mut buf) {
            if n == 0 || &buf[..n] == b"quit" {
                break;
            }
            let mut reply = b"pong:".to_vec();
            reply.extend_from_slice(&buf[..n]);
            let _ = echo.send_to(&reply, from);
        }
    });

    assert_eq!(probe_in(&ns, &udp(b"ping", None), addr).0, Ok(()));
    assert_eq!(probe_in(&ns, &udp(b"ping", Some(b"pong:")), addr).0, Ok(()));
    let wrong = probe_in(&ns, &udp(b"ping", Some(b"PONG")), addr);
    down_with(&wrong, "wrong reply");

    // The server stops: the kernel answers port unreachable, the check fails at once.
    server.send_to(b"quit", addr).unwrap();
    echoing.join().unwrap();
    drop(server);
    ns.run_in(|| wait_port_closed(addr.port()));
    let refused = probe_in(&ns, &udp(b"ping", None), addr);
    down_with(&refused, "refused");
    assert!(
        refused.1 < TIMEOUT / 3,
        "refused after {:?}, not at once",
        refused.1
    );

    // A server that reads and never answers: down when the timeout runs out.
    let silent = bind(&ns, 0);
    let at = silent.local_addr().unwrap();
    let timeout = probe_in(&ns, &udp(b"ping", None), at);
    down_with(&timeout, "timeout");
    assert!(timeout.1 >= TIMEOUT, "gave up after {:?}", timeout.1);
    let mut buf = [0u8; 16];
    silent.set_read_timeout(Some(TIMEOUT)).unwrap();
    assert_eq!(
        silent.recv(&mut buf).unwrap(),
        4,
        "the probe reached the silent server"
    );
}

#[test]
fn dns_check_follows_a_real_dnsmasq() {
    if !gate::privileged(
        "dns health check",
        &[gate::IP, gate::SYSCTL, gate::NFT, DNSMASQ],
    ) {
        return;
    }
    let ns = namespace("dns");
    let port = 5353;
    let addr: SocketAddr = format!("{ADDR}:{port}").parse().unwrap();
    let mut dnsmasq = Proc::spawn(
        in_ns(
            ns.name(),
            [
                "dnsmasq",
                "--no-daemon",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--port",
                &port.to_string(),
                "--listen-address",
                ADDR,
                "--bind-interfaces",
                "--address=/health.example.org/192.0.2.53",
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null()),
    );
    let hc = dns("health.example.org");
    wait_for("dnsmasq answering", Duration::from_secs(10), || {
        probe_in(&ns, &hc, addr).0.ok()
    });
    assert_eq!(probe_in(&ns, &hc, addr).0, Ok(()));

    // A name dnsmasq has no answer for and no upstream to ask: REFUSED, down.
    let refused = probe_in(&ns, &dns("other.example.net"), addr);
    down_with(&refused, "rcode 5 (REFUSED)");

    // Its packets dropped: silence, down when the timeout runs out.
    let nft = |rule: &str| must(&mut in_ns(ns.name(), ["nft", rule]));
    nft("add table inet health");
    nft("add chain inet health input { type filter hook input priority 0; }");
    nft(&format!("add rule inet health input udp dport {port} drop"));
    let silence = probe_in(&ns, &hc, addr);
    down_with(&silence, "timeout");
    assert!(silence.1 >= TIMEOUT);
    nft("delete table inet health");
    assert_eq!(probe_in(&ns, &hc, addr).0, Ok(()));

    // dnsmasq stopped: port unreachable, down at once.
    dnsmasq.stop(Duration::from_secs(2));
    ns.run_in(|| wait_port_closed(port));
    let gone = probe_in(&ns, &hc, addr);
    down_with(&gone, "refused");
    assert!(gone.1 < TIMEOUT / 3, "refused after {:?}", gone.1);
}

#[test]
fn dns_servfail_is_down() {
    if !gate::privileged("dns servfail", &[gate::IP, gate::SYSCTL]) {
        return;
    }
    let ns = namespace("servfail");
    let server = bind(&ns, 0);
    let addr = server.local_addr().unwrap();
    let responder = server.try_clone().unwrap();
    // A raw responder: the query back with QR and RA set and rcode 2 (SERVFAIL), or rcode 0
    // and no answer records for the name `fine.example.org`.
    thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = responder.recv_from(&mut buf) {
            if n < 12 {
                break;
            }
            let mut reply = buf[..n].to_vec();
            let ok = reply.windows(4).any(|w| w == b"fine");
            reply[2] = 0x81;
            reply[3] = if ok { 0x80 } else { 0x82 };
            let _ = responder.send_to(&reply, from);
        }
    });
    let servfail = probe_in(&ns, &dns("broken.example.org"), addr);
    down_with(&servfail, "rcode 2 (SERVFAIL)");
    assert!(servfail.1 < TIMEOUT, "an answer, not a timeout");
    assert_eq!(probe_in(&ns, &dns("fine.example.org"), addr).0, Ok(()));
    let _ = server.send_to(b"", addr);
}
