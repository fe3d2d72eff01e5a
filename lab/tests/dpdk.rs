//! End to end on DPDK ports: the scenarios of `e2e.rs` (shared in `support/e2e.rs`) with the
//! gateway's interfaces as DPDK `net_af_packet` ports on the testbed's veths
//! (`testbed up --driver dpdk`: EAL without hugepages, the kernel's side of each port a TAP
//! of the interface's name), plus what only DPDK has: the kernel's traffic through the
//! exception TAP, and EAL's runtime directory gone after SIGTERM.
//!
//! Needs root and a `strait` built with the `dpdk` feature (`cargo build -p strait-control
//! --features dpdk`; scripts/test.sh does it before running this file, which is built only
//! with `--features dpdk`). Fails loudly when the binary lacks DPDK.

mod support;

use std::path::Path;
use std::thread::sleep;
use std::time::Duration;

use support::bed::CLIENT;
use support::e2e::{
    self, counter, counter_in, dsr_l2_spread, start, udp_ten_thousand, Driver, Scenario, VIP,
};
use support::harness::{namespaces, text};

const D: Driver = Driver::Dpdk;

/// The serial lock and a DPDK testbed (whose `scenario` checks that `strait` has DPDK).
fn scenario(tag: &str, args: &[&str]) -> Option<Scenario> {
    e2e::scenario(D, tag, args)
}

/// The EAL runtime directories of running gateways (`/var/run/dpdk/strait-PID`).
fn eal_dir(pid: u32) -> bool {
    Path::new(&format!("/var/run/dpdk/strait-{pid}")).exists()
}

#[test]
fn a_dsr_l2_http_reaches_every_backend_with_the_client_address_and_i_leaves_nothing() {
    let Some(s) = scenario("a", &["--backends", "4"]) else {
        return;
    };
    let mut gw = start(&s, &s.config());
    let pid = gw.pid();
    assert!(eal_dir(pid), "no EAL runtime directory for pid {pid}");
    dsr_l2_spread(&s, &gw);
    let log = gw.log_text();
    assert!(
        log.contains("net_af_packet0,iface=dp-gw") && log.contains("DPDK queue group ready"),
        "the gateway did not run a DPDK port:\n{log}"
    );
    // SIGTERM: exit 0; EAL's runtime directory removed; the persistent TAP left as the
    // testbed made it (the gateway only attached to it), without the VIPs it claimed.
    let status = gw.stop();
    assert!(status.success(), "exit {status}:\n{}", gw.log_text());
    assert!(!eal_dir(pid), "EAL's runtime directory is left behind");
    let log = gw.log_text();
    assert!(log.contains("worker stopped"), "{log}");
    let prefix = s.prefix.clone();
    drop(gw);
    drop(s);
    let left = namespaces(&prefix);
    assert!(left.is_empty(), "namespaces left behind:\n{left:?}");
}

/// The same on `net_af_xdp` ports, where libxdp's program takes every frame from the wire
/// (the kernel's ARP and the health checks' replies come back only through the TAP): HTTP
/// spread over four backends with the client address kept, and the ten thousand UDP flows.
#[test]
fn i_net_af_xdp_ports_serve_the_same_traffic() {
    let Some(s) = e2e::scenario(Driver::DpdkAfXdp, "i", &["--backends", "4"]) else {
        return;
    };
    let gw = start(&s, &s.config());
    dsr_l2_spread(&s, &gw);
    udp_ten_thousand(&s, &gw);
    let log = gw.log_text();
    assert!(
        log.contains("net_af_xdp0,iface=dp-gw") && log.contains("DPDK queue group ready"),
        "the gateway did not run a net_af_xdp port:\n{log}"
    );
    assert!(
        counter(&gw, "strait_worker_kernel_sent_frames_total") > 0,
        "nothing from the kernel went out through the port"
    );
}

#[test]
fn d_the_kernel_keeps_its_traffic_through_the_exception_tap() {
    let Some(s) = scenario("d", &["--backends", "2"]) else {
        return;
    };
    let gw = start(&s, &s.config());
    // Ready means the health checks passed: the gateway's kernel reached the backends
    // through the TAP and the port, both ways.
    let server = s.serve("gw", "gw", &["--tcp", "192.0.2.1:2222"]);
    sleep(Duration::from_millis(300));
    // ARP for the gateway's address and ping: answered by the kernel behind the TAP.
    let ping = s.exec("client", &["ping", "-c", "2", "-W", "2", "192.0.2.1"]);
    assert!(
        ping.status.success(),
        "ping to the gateway failed: {}",
        text(&ping.stdout)
    );
    // A TCP service of the gateway itself, on another port.
    let tcp = s.curl("http://192.0.2.1:2222/");
    drop(server);
    assert_eq!(
        tcp.as_deref()
            .map(|t| t.starts_with(&format!("backend=gw client={CLIENT}:"))),
        Ok(true),
        "{tcp:?}"
    );
    // ARP for the VIP, answered as in AF_XDP mode (the VIP on the kernel's `lo`), with the
    // port's MAC.
    let arp = s.exec(
        "client",
        &["arping", "-c", "1", "-w", "3", "-I", "eth0", VIP],
    );
    let arp_out = text(&arp.stdout);
    assert!(
        arp.status.success() && arp_out.to_lowercase().contains("02:00:00:00:00:01"),
        "ARP for the VIP not answered with the gateway's MAC:\n{arp_out}{}",
        text(&arp.stderr)
    );
    // The kernel's neighbours are on the TAP, named as the interface.
    let neigh = s.must("gw", &["ip", "neigh", "show", "dev", "veth-gw"]);
    assert!(neigh.contains("198.51.100.11"), "{neigh}");
    // The workers passed those frames to the kernel and sent its answers.
    let passed = counter(&gw, "strait_worker_kernel_passed_frames_total");
    let from_kernel = counter(&gw, "strait_worker_kernel_sent_frames_total");
    assert!(
        passed > 0 && from_kernel > 0,
        "passed {passed}, from the kernel {from_kernel}"
    );
    // And service traffic flows meanwhile.
    assert!(s.curl(&format!("http://{VIP}/")).is_ok());
}

#[test]
fn b_nat_two_arm_translates_both_ways_and_keeps_the_client_address() {
    e2e::nat_two_arm(D);
}

#[test]
fn e_a_dead_backend_is_taken_out_fast_and_others_streams_do_not_notice() {
    e2e::dead_backend(D);
}

#[test]
fn f_draining_keeps_existing_connections_and_takes_no_new_ones() {
    e2e::draining(D);
}

#[test]
fn g_a_reload_adding_a_backend_breaks_nothing_and_it_takes_new_flows() {
    e2e::reload_adding(D);
}

#[test]
fn h_ten_thousand_udp_flows_are_all_delivered_and_the_books_balance() {
    let Some(s) = scenario("h", &["--backends", "4"]) else {
        return;
    };
    let gw = start(&s, &s.config());
    udp_ten_thousand(&s, &gw);
    // The port's own count: every frame it received went through a worker's pipeline
    // (no steering program in front), so, once the workers have published, the port's rx
    // equals the workers' rx less what other workers handed in. Health-check replies keep
    // arriving: a scrape with a frame between the reads is tried again.
    let balanced = (0..50).any(|_| {
        let m = gw.get("/metrics");
        let port_rx = counter_in(&m, "strait_dpdk_port_rx_packets_total");
        let rx = counter_in(&m, "strait_rx_packets_total");
        let handed_in = counter_in(&m, "strait_worker_handed_in_frames_total");
        if port_rx >= 10_000 && port_rx == rx - handed_in {
            return true;
        }
        sleep(Duration::from_millis(100));
        false
    });
    assert!(
        balanced,
        "the DPDK port's rx never matched the workers' rx:\n{}",
        gw.get("/metrics")
    );
}

#[test]
fn c_a_capture_sees_the_dpdk_workers_verdicts_through_the_shared_loop() {
    // `strait capture` on DPDK ports: the pipeline's hook is in the loop both drivers run.
    support::capture::dsr_l2_verdicts(D);
}

#[test]
fn m_explain_names_the_backend_every_flow_reached() {
    e2e::explain_names_the_backends(D, false);
}
