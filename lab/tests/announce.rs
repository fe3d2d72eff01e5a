//! VIP announcement end to end. BGP: the gateway (`strait run` with
//! `[gateway.bgp]`) and its BIRD child in the testbed's gateway namespace; a real BIRD 2
//! router in the client namespace, whose routing table the tests read over its control
//! socket. L2: the gateway with `[gateway.l2]` and its keepalived child. Needs root, `bird2`
//! and `keepalived`; fails with a clear message without them unless
//! `STRAIT_SKIP_PRIVILEGED=1`.
//!
//! - the VIP is announced once the gateway forwards, withdrawn within the health checks'
//!   `fall` period when every backend is down, announced again when one recovers;
//! - SIGKILL of `strait` takes the route away within a second (BIRD dies with it);
//! - `POST /drain` withdraws the route at once, the gateway forwards through the grace and
//!   then exits 0;
//! - a gateway whose peer never answers starts, forwards, and says so in `/routes`,
//!   `strait status` and `/metrics`;
//! - with `[gateway.l2]`, the VIP is on the client interface of the elected owner (not on
//!   `lo`), clients reach it, and SIGKILL of `strait` gives it up within a second
//!   (keepalived stops in order with it).
//! - SIGTERM to the gateway's whole process group (`systemctl stop` under systemd's default
//!   `KillMode=control-group`: the routing daemon gets it too) drains the gateway, which
//!   does not start the daemon again while it drains and exits 0 leaving nothing running.

mod support;

use std::path::Path;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use serde_json::Value;
use strait_control::bgp::bird;
use support::bed::{Bed, Gateway};
use support::harness::{in_ns, serial_if, sh, text, wait_for, Proc};
use support::privileged as gate;

const VIP: &str = "203.0.113.10";
/// The router (the client namespace) and the gateway's address facing it.
const ROUTER: &str = "192.0.2.2";
const GATEWAY: &str = "192.0.2.1";

fn privileged() -> bool {
    gate::privileged(
        "announce",
        &[gate::IP, gate::CURL, gate::BIRD, gate::KEEPALIVED],
    )
}

/// A testbed, a router in its client namespace, and the serial lock (the gateway's worker
/// busy-polls; two at once on two cores measure each other).
struct Scene {
    router: Router,
    bed: Bed,
    _serial: MutexGuard<'static, ()>,
}

fn scene(tag: &str) -> Option<Scene> {
    scene_with(tag, Router::start)
}

/// [`scene`] with a router of `router`'s making.
fn scene_with(tag: &str, router: impl FnOnce(&Bed) -> Router) -> Option<Scene> {
    let serial = serial_if(privileged)?;
    let bed = Bed::up(
        &format!("bg{}{tag}", std::process::id() % 100_000),
        &["--backends", "2"],
    );
    let router = router(&bed);
    Some(Scene {
        router,
        bed,
        _serial: serial,
    })
}

/// BIRD as the client side's router: AS 64500, one session to the gateway, importing
/// what it announces into BIRD's own table only (the namespace's kernel table is left as
/// the testbed made it).
struct Router {
    socket: std::path::PathBuf,
    _bird: Proc,
}

impl Router {
    fn start(bed: &Bed) -> Router {
        Router::with(bed, "hold time 3;\n  keepalive time 1;", "")
    }

    /// A router whose session has `timers`, with `extra` protocols besides.
    fn with(bed: &Bed, timers: &str, extra: &str) -> Router {
        Router::with_as(bed, 64500, timers, extra)
    }

    /// [`Router::with`] in AS `asn`: 64512, the gateway's, makes the session iBGP.
    fn with_as(bed: &Bed, asn: u32, timers: &str, extra: &str) -> Router {
        let conf = bed.dir.join("router.conf");
        let socket = bed.dir.join("router.ctl");
        std::fs::write(
            &conf,
            format!(
                "router id {ROUTER};\nlog stderr all;\nprotocol device {{ scan time 10; }}\n{extra}\n\
                 protocol bgp to_strait {{\n  local {ROUTER} as {asn};\n  neighbor {GATEWAY} as 64512;\n  direct;\n\
                 {timers}\n  connect retry time 1;\n  error wait time 1, 5;\n\
                 ipv4 {{ import all; export none; }};\n}}\n"
            ),
        )
        .expect("router config");
        let log = std::fs::File::create(bed.dir.join("router.log")).expect("router log");
        let bird = Proc::spawn(
            in_ns(&bed.ns("client"), ["bird", "-f", "-c"])
                .arg(&conf)
                .arg("-s")
                .arg(&socket)
                .stdout(std::process::Stdio::null())
                .stderr(log),
        );
        wait_for(
            "the router's control socket",
            Duration::from_secs(5),
            || bird::BirdSocket::connect(&socket).ok(),
        );
        Router {
            socket,
            _bird: bird,
        }
    }

    /// BIRD's `show route all PREFIX` on the router: the route with its attributes.
    fn show_all(&self, prefix: &str) -> String {
        let mut c = bird::BirdSocket::connect(&self.socket).expect("the router's socket");
        c.command(&format!("show route all {prefix}"))
            .expect("show route all")
            .into_iter()
            .map(|(_, l)| l + "\n")
            .collect()
    }

    /// Whether the router has a route to `prefix` (BIRD's `show route PREFIX`).
    fn has(&self, prefix: &str) -> bool {
        let Ok(mut c) = bird::BirdSocket::connect(&self.socket) else {
            return false;
        };
        c.command(&format!("show route {prefix}"))
            .is_ok_and(|lines| lines.iter().any(|(_, l)| l.contains(prefix)))
    }

    /// Polls (every 20 ms) until the route to `prefix` is `present`; how long it took.
    fn wait(&self, prefix: &str, present: bool, timeout: Duration) -> Duration {
        let t = Instant::now();
        while self.has(prefix) != present {
            assert!(
                t.elapsed() < timeout,
                "route {prefix} {} within {timeout:?}",
                if present {
                    "not announced"
                } else {
                    "still there"
                }
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        t.elapsed()
    }
}

/// The testbed's configuration with `[gateway.bgp]` to `peer` and `extra` gateway keys.
fn config(bed: &Bed, peer: &str, extra: &str) -> std::path::PathBuf {
    with_section(
        bed,
        extra,
        &format!(
            "[gateway.bgp]\nasn = 64512\nrouter_id = \"{GATEWAY}\"\n\
             [[gateway.bgp.peers]]\naddress = \"{peer}\"\nasn = 64500\nhold_time = \"3s\"\n"
        ),
    )
}

/// The testbed's configuration with `extra` gateway keys and `section` appended, checked
/// with `strait check`.
fn with_section(bed: &Bed, extra: &str, section: &str) -> std::path::PathBuf {
    with_section_edited(bed, extra, section, |base| base)
}

/// [`with_section`] with the testbed's configuration passed through `edit` first.
fn with_section_edited(
    bed: &Bed,
    extra: &str,
    section: &str,
    edit: impl FnOnce(String) -> String,
) -> std::path::PathBuf {
    let base = edit(std::fs::read_to_string(bed.config()).expect("testbed config"));
    // Keys of [gateway] go before its first sub-table; a sub-table may come anywhere.
    let base = base.replacen("[gateway]\n", &format!("[gateway]\n{extra}\n"), 1);
    let path = bed.dir.join("gateway.toml");
    std::fs::write(&path, format!("{base}\n{section}")).expect("config");
    let check = std::process::Command::new(support::harness::strait())
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .expect("strait check");
    assert!(check.status.success(), "{}", text(&check.stderr));
    path
}

fn start(bed: &Bed, config: &Path) -> Gateway {
    Gateway::spawn(bed, Gateway::command(bed, config), |g| {
        g.healthy() && g.services().is_some_and(|v| all_up(&v))
    })
}

fn all_up(v: &Value) -> bool {
    v["services"].as_array().is_some_and(|s| {
        s.iter().all(|s| {
            s["backends"]
                .as_array()
                .is_some_and(|b| b.iter().all(|b| b["health"] == "up"))
        })
    })
}

fn routes(g: &Gateway) -> Value {
    serde_json::from_str(&g.get("/routes")).expect("/routes is JSON")
}

fn route_of(g: &Gateway, vip: &str) -> String {
    routes(g)["vips"]
        .as_array()
        .and_then(|v| v.iter().find(|r| r["vip"] == vip))
        .and_then(|r| r["route"].as_str())
        .unwrap_or("absent")
        .to_owned()
}

#[test]
fn announced_while_serving_withdrawn_without_backends_gone_with_a_killed_gateway() {
    let Some(s) = scene("a") else {
        return;
    };
    let cfg = config(&s.bed, ROUTER, "");
    let mut g = start(&s.bed, &cfg);
    let prefix = format!("{VIP}/32");
    s.router.wait(&prefix, true, Duration::from_secs(15));
    // The speaker reads the session's state every 500 ms.
    wait_for("the session up in /routes", Duration::from_secs(2), || {
        (routes(&g)["bgp"]["sessions"][0]["up"] == true).then_some(())
    });
    assert_eq!(route_of(&g, VIP), "announced");
    assert_eq!(g.metric("strait_bgp_session_up"), Some(1.0));
    assert!(s.bed.curl(&format!("http://{VIP}/")).is_ok());

    // Every backend down: withdrawn within the checks' fall period (2 x 500 ms) and the
    // speaker's turn (a configure, an UPDATE), well within 3 s.
    let servers: Vec<u32> = ["b1", "b2"].iter().map(|b| s.bed.backend_pid(b)).collect();
    let killed = Instant::now();
    for pid in servers {
        sh(&["kill", "-KILL", &pid.to_string()]);
    }
    s.router.wait(&prefix, false, Duration::from_secs(3));
    eprintln!("withdrawn {:?} after the backends died", killed.elapsed());
    assert_eq!(route_of(&g, VIP), "no-serving-backend");

    // One comes back: announced again.
    let _revived = s.bed.serve("b1", "b1", &["--tcp", "[::]:80"]);
    s.router.wait(&prefix, true, Duration::from_secs(5));
    assert_eq!(route_of(&g, VIP), "announced");

    // SIGKILL: BIRD dies with strait (parent-death signal), its session closes, the router
    // drops the route.
    let speaker_dir = format!("/tmp/strait-bgp-{}", g.pid());
    let bird_pid = sh(&["cat", &format!("{speaker_dir}/bird.pid")]);
    let killed = Instant::now();
    g.kill();
    let gone = s.router.wait(&prefix, false, Duration::from_secs(3));
    eprintln!(
        "route gone {gone:?} after SIGKILL ({:?} since the kill)",
        killed.elapsed()
    );
    // Gone, or a zombie waiting for init to reap it (its sockets are closed either way).
    let bird_pid = bird_pid.trim().to_owned();
    wait_for(
        "BIRD to die with the gateway",
        Duration::from_secs(3),
        || {
            let stat =
                std::fs::read_to_string(format!("/proc/{bird_pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            (!stat.contains("(bird)") || state == Some("Z")).then_some(())
        },
    );
    // A killed gateway cannot remove its speaker's directory; the next one with its pid
    // would.
    let _ = std::fs::remove_dir_all(&speaker_dir);
}

#[test]
fn a_services_communities_and_local_pref_reach_the_router_on_its_vips_route() {
    let Some(s) = scene_with("r", |bed| {
        Router::with_as(bed, 64512, "hold time 3;\n  keepalive time 1;", "")
    }) else {
        return;
    };
    let section = format!(
        "[gateway.bgp]\nasn = 64512\nrouter_id = \"{GATEWAY}\"\ncommunities = [\"64512:7\"]\n\
         [[gateway.bgp.peers]]\naddress = \"{ROUTER}\"\nasn = 64512\nhold_time = \"3s\"\n"
    );
    // The first service of the VIP sets the attributes; its other services set none.
    let cfg = with_section_edited(&s.bed, "", &section, |base| {
        let at = format!("vip = \"{VIP}\"\n");
        assert!(base.contains(&at), "the testbed has a service at {VIP}");
        base.replacen(
            &at,
            &format!(
                "{at}bgp_communities = [\"64512:100\", \"65000:2\"]\n\
                 bgp_large_communities = [\"4200000000:1:2\"]\nbgp_local_pref = 250\n"
            ),
            1,
        )
    });
    let _g = start(&s.bed, &cfg);
    let prefix = format!("{VIP}/32");
    s.router.wait(&prefix, true, Duration::from_secs(15));
    let shown = s.router.show_all(&prefix);
    let compact: String = shown.chars().filter(|c| *c != ' ').collect();
    for want in [
        "(64512,7)",
        "(64512,100)",
        "(65000,2)",
        "(4200000000,1,2)",
        "BGP.local_pref:250",
    ] {
        assert!(compact.contains(want), "{want} not on the route:\n{shown}");
    }
}

#[test]
fn drain_withdraws_first_forwards_through_the_grace_then_stops() {
    let Some(s) = scene("d") else {
        return;
    };
    // `strait drain` over the admin API's Unix socket, as an operator would.
    let socket = s.bed.dir.join("admin.sock");
    let cfg = config(
        &s.bed,
        ROUTER,
        &format!(
            "drain_grace = \"3s\"\nadmin_socket = \"{}\"",
            socket.display()
        ),
    );
    let mut g = start(&s.bed, &cfg);
    let prefix = format!("{VIP}/32");
    s.router.wait(&prefix, true, Duration::from_secs(15));
    let asked = Instant::now();
    let drain = Proc::spawn(
        std::process::Command::new(support::harness::strait())
            .args(["drain", "--wait", "20s", "--socket"])
            .arg(&socket)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped()),
    );
    let gone = s.router.wait(&prefix, false, Duration::from_secs(3));
    eprintln!("route withdrawn {gone:?} after strait drain");
    assert_eq!(route_of(&g, VIP), "draining");
    assert_eq!(g.get("/healthz"), "draining\n");
    // Still forwarding during the grace: traffic the router has not moved yet is served.
    for _ in 0..5 {
        s.bed
            .curl(&format!("http://{VIP}/"))
            .unwrap_or_else(|e| panic!("not forwarding while draining: {e}"));
    }
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "the checks took the grace"
    );
    // `strait drain` says stopped once the gateway has exited, not when its admin API
    // closes (the workers and XDP stop after that).
    let out = drain.wait();
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(said.starts_with("draining: routes withdrawn"), "{said}");
    assert!(said.ends_with("stopped\n"), "{said}");
    let status = g
        .exited_within(Duration::from_millis(100))
        .unwrap_or_else(|| {
            panic!(
                "strait drain said stopped while the gateway ran:\n{}",
                g.log_text()
            )
        });
    assert!(status.success(), "{status}\n{}", g.log_text());
    assert!(
        asked.elapsed() >= Duration::from_secs(3),
        "stopped before the grace ended ({:?})",
        asked.elapsed()
    );
}

#[test]
fn a_gateway_whose_peer_never_answers_starts_and_says_so() {
    let Some(s) = scene("u") else {
        return;
    };
    // Nobody has .99 on the client segment.
    let cfg = config(&s.bed, "192.0.2.99", "");
    let g = start(&s.bed, &cfg);
    assert!(s.bed.curl(&format!("http://{VIP}/")).is_ok(), "forwards");
    // BIRD runs once its control socket answers (the speaker's thread starts it).
    let r = wait_for("the speaker running", Duration::from_secs(5), || {
        let r = routes(&g);
        (r["bgp"]["running"] == true).then_some(r)
    });
    assert_eq!(r["bgp"]["sessions"][0]["up"], false, "{r}");
    assert_eq!(r["bgp"]["sessions"][0]["peer"], "192.0.2.99", "{r}");
    // The route is the gateway's decision; the session is what keeps it from the peer.
    assert_eq!(route_of(&g, VIP), "announced");
    assert_eq!(g.metric("strait_bgp_session_up"), Some(0.0));
    let out = in_ns(&s.bed.ns("gw"), [support::harness::strait(), "status"])
        .output()
        .expect("strait status");
    let status = text(&out.stdout) + &text(&out.stderr);
    assert!(status.contains("192.0.2.99"), "{status}");
    assert!(status.contains(" NO "), "{status}");
    assert!(!s.router.has(&format!("{VIP}/32")));
}

/// The namespace's addresses (`ip -o addr`), one per line.
fn addresses(bed: &Bed, role: &str) -> String {
    bed.must(role, &["ip", "-o", "addr", "show"])
}

#[test]
fn l2_owner_holds_the_vip_on_its_client_interface_and_gives_it_up_when_killed() {
    let Some(s) = scene("l") else {
        return;
    };
    let cfg = with_section(
        &s.bed,
        "",
        "[gateway.l2]\nname = \"gw1\"\nmembers = [\"gw1\", \"gw2\"]\n",
    );
    let mut g = start(&s.bed, &cfg);
    // Alone on the segment, gw1 wins every election after the master-down interval
    // (3 x 100 ms and the skew) whatever its priority.
    let vip = format!("{VIP}/32");
    wait_for(
        "the VIP on the client interface",
        Duration::from_secs(3),
        || {
            addresses(&s.bed, "gw")
                .lines()
                .any(|l| l.contains(&vip) && !l.contains(" lo "))
                .then_some(())
        },
    );
    assert!(
        !addresses(&s.bed, "gw")
            .lines()
            .any(|l| l.contains(&vip) && l.contains(" lo ")),
        "the VIP is on lo too: every gateway would answer ARP for it"
    );
    for _ in 0..5 {
        s.bed
            .curl(&format!("http://{VIP}/"))
            .unwrap_or_else(|e| panic!("through the VRRP owner: {e}"));
    }
    // The VRRP side reads the interface's addresses every 500 ms.
    let r = wait_for(
        "/routes to show the VIP owned",
        Duration::from_secs(2),
        || {
            let r = routes(&g);
            r["l2"]["owned"]
                .as_array()
                .is_some_and(|o| o.iter().any(|v| v == VIP))
                .then_some(r)
        },
    );
    assert_eq!(r["l2"]["running"], true, "{r}");
    assert_eq!(g.metric("strait_vrrp_running"), Some(1.0));
    // SIGKILL: keepalived gets SIGTERM, removes the VIP and tells the segment (priority 0).
    let pid = g.pid();
    let killed = Instant::now();
    g.kill();
    wait_for("the VIP given up", Duration::from_secs(3), || {
        (!addresses(&s.bed, "gw").contains(&vip)).then_some(())
    });
    eprintln!("VIP given up {:?} after SIGKILL", killed.elapsed());
    let _ = std::fs::remove_dir_all(format!("/tmp/strait-vrrp-{pid}"));
}

/// systemd's side of `Type=notify` and `WatchdogSec=`, played by the test: a datagram
/// socket as `NOTIFY_SOCKET`. The gateway says READY=1 once it forwards, feeds the
/// watchdog (WATCHDOG_USEC=1 s: every 500 ms) while its worker turns, and says STOPPING=1
/// when it drains.
#[test]
fn systemd_hears_ready_watchdog_and_stopping() {
    let Some(s) = scene("n") else {
        return;
    };
    let socket_path = s.bed.dir.join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).expect("notify socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let cfg = with_section(&s.bed, "", "");
    let mut cmd = Gateway::command(&s.bed, &cfg);
    // `ip netns exec` keeps the environment and execs strait in place: the pid is strait's.
    cmd.env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "1000000");
    let mut g = Gateway::spawn(&s.bed, cmd, |g| g.healthy());
    let mut heard = Vec::new();
    let mut buf = [0u8; 512];
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5)
        && heard
            .iter()
            .filter(|m: &&String| m.contains("WATCHDOG=1"))
            .count()
            < 3
    {
        let n = socket.recv(&mut buf).expect("a notification");
        heard.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(heard[0].contains("READY=1"), "{heard:?}");
    let feeds = heard.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    assert!(feeds >= 3, "watchdog fed {feeds} times in 5 s: {heard:?}");
    let _ = g.pid();
    assert!(g.stop().success());
    let mut rest = Vec::new();
    while let Ok(n) = socket.recv(&mut buf) {
        rest.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        if rest.last().is_some_and(|m| m.contains("STOPPING=1")) {
            break;
        }
    }
    assert!(rest.iter().any(|m| m.contains("STOPPING=1")), "{rest:?}");
}

/// A dead machine, found by BFD: the gateway's BIRD frozen (SIGSTOP: its TCP session stays
/// open, the kernel still acknowledges), a 9 s hold time on both sides; BFD at 100 ms x 3
/// takes the route away in well under the hold time.
#[test]
fn bfd_finds_a_frozen_gateway_long_before_the_hold_timer() {
    // This test's router speaks BFD and holds the session 9 s.
    let Some(s) = scene_with("f", |bed| {
        Router::with(
            bed,
            "hold time 9;\n  keepalive time 3;\n  bfd on;",
            "protocol bfd { interface \"*\" { min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }; }",
        )
    }) else {
        return;
    };
    let cfg = with_section(
        &s.bed,
        "",
        &format!(
            "[gateway.bgp]\nasn = 64512\nrouter_id = \"{GATEWAY}\"\n\
             [[gateway.bgp.peers]]\naddress = \"{ROUTER}\"\nasn = 64500\nhold_time = \"9s\"\nbfd = true\n"
        ),
    );
    let mut g = start(&s.bed, &cfg);
    let prefix = format!("{VIP}/32");
    s.router.wait(&prefix, true, Duration::from_secs(20));
    let speaker_dir = format!("/tmp/strait-bgp-{}", g.pid());
    let bird = sh(&["cat", &format!("{speaker_dir}/bird.pid")])
        .trim()
        .to_owned();
    sh(&["kill", "-STOP", &bird]);
    let gone = s.router.wait(&prefix, false, Duration::from_secs(5));
    sh(&["kill", "-CONT", &bird]);
    eprintln!("route gone {gone:?} after the gateway's BIRD froze (hold time 9 s)");
    // The hold timer cannot fire before 6 s: 9 s after the last keepalive, sent at most
    // 3 s before the freeze.
    assert!(
        gone < Duration::from_millis(4000),
        "{gone:?}: not BFD's doing"
    );
    assert!(g.stop().success(), "{}", g.log_text());
}

/// `strait run` as systemd's default `KillMode=control-group` stops it, played by the test:
/// the gateway in a process group of its own (its routing daemon inherits it), SIGTERM to
/// the whole group. The daemon dies at once; the gateway drains for its grace without
/// starting the daemon again, then exits 0, and nothing of the group is left. The packaged
/// unit has `KillMode=mixed`, so there the daemon outlives the signal and carries the
/// drain's withdrawals; this is the case where it does not.
fn stop_the_group(s: &Scene, cfg: &Path, daemon: &str) -> Gateway {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = Gateway::command(&s.bed, cfg);
    cmd.process_group(0);
    let mut g = Gateway::spawn(&s.bed, cmd, |g| {
        g.healthy() && g.services().is_some_and(|v| all_up(&v))
    });
    let started = format!("{daemon}: started");
    wait_for("the daemon started", Duration::from_secs(10), || {
        g.log_text().contains(&started).then_some(())
    });
    // `ip netns exec` execs strait in place: the group's id is strait's pid.
    let pgid = g.pid();
    let signalled = Instant::now();
    sh(&["kill", "-TERM", "--", &format!("-{pgid}")]);
    // drain_grace is 3 s; a daemon started again would be so 1 s after the gateway saw it
    // exit (a poll every 500 ms), well within the grace.
    let status = g
        .exited_within(Duration::from_secs(15))
        .unwrap_or_else(|| panic!("still running after the grace:\n{}", g.log_text()));
    let log = g.log_text();
    assert!(status.success(), "{status}\n{log}");
    assert!(
        signalled.elapsed() >= Duration::from_secs(3),
        "stopped before the grace ended ({:?}):\n{log}",
        signalled.elapsed()
    );
    assert!(log.contains("draining"), "{log}");
    assert_eq!(
        log.matches(&started).count(),
        1,
        "the daemon was started again while draining:\n{log}"
    );
    // Nothing of the group is left (a zombie would be init's to reap, and is none of ours:
    // `pgrep` lists it, so the wait covers it).
    wait_for(
        "nothing left in the gateway's process group",
        Duration::from_secs(2),
        || {
            let left = std::process::Command::new("pgrep")
                .args(["-g", &pgid.to_string()])
                .output()
                .expect("pgrep");
            left.stdout.is_empty().then_some(())
        },
    );
    g
}

#[test]
fn sigterm_to_the_process_group_drains_without_starting_bird_again() {
    let Some(s) = scene("g") else {
        return;
    };
    let cfg = config(&s.bed, ROUTER, "drain_grace = \"3s\"");
    let prefix = format!("{VIP}/32");
    let g = stop_the_group(&s, &cfg, "bgp");
    assert!(!s.router.has(&prefix), "the route outlived the gateway");
    let log = g.log_text();
    assert!(log.contains("speaker stopped"), "{log}");
}

#[test]
fn sigterm_to_the_process_group_drains_without_starting_keepalived_again() {
    let Some(s) = scene("k") else {
        return;
    };
    let cfg = with_section(
        &s.bed,
        "drain_grace = \"3s\"",
        "[gateway.l2]\nname = \"gw1\"\nmembers = [\"gw1\", \"gw2\"]\n",
    );
    let g = stop_the_group(&s, &cfg, "vrrp");
    assert!(
        !addresses(&s.bed, "gw").contains(&format!("{VIP}/32")),
        "the VIP outlived the gateway"
    );
    let log = g.log_text();
    assert!(log.contains("keepalived stopped"), "{log}");
}
