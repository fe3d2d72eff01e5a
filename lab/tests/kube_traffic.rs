//! The Kubernetes source with real traffic: `strait run --kube` in the testbed's gateway
//! namespace, fed by the fake API server of `support/fake_api.rs`, with curl in the
//! client namespace and `strait testbed serve` as pods and nodes. Needs root; fails with a
//! clear message without it unless `STRAIT_SKIP_PRIVILEGED=1` (CI never sets it).
//!
//! ```text
//!  test thread ── FakeApi (apply / delete / set_down) ──┐ its thread setns'd into {p}-gw,
//!                                                        │ listening on 127.0.0.1 there
//!  {p}-gw:  strait run --config gw.toml --kube --kubeconfig kubeconfig --kube-pool ...
//!  {p}-client: curl http://<the address the Service's status shows>/
//!  {p}-bN:  the nodes (dsr-l2: they hold the LoadBalancer address on lo, as kube-proxy
//!           accepts it) or the pods (nat: 198.51.100.1N:8080)
//! ```
//!
//! Each test brings up its own testbed under a unique prefix and removes it on drop (also
//! when the test fails); processes a test starts are killed on drop. The tests run one
//! at a time: each gateway runs a busy-polling worker.

mod support;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, MutexGuard};
use std::thread::{sleep, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::bed::{assert_client_seen, tally, Bed, Gateway};
use support::fake_api::{FakeApi, Res};
use support::harness::{in_ns, run, serial_if, strait, text, wait_for, Proc};
use support::objects::{node, CLASS};
use support::privileged as gate;

/// Root and the tools these tests drive (see `strait_testkit::privileged`).
fn privileged() -> bool {
    gate::privileged(
        "kubernetes traffic",
        &[
            gate::IP,
            gate::CURL,
            // The guide walkthrough's kubeconfig needs a CA certificate.
            gate::OPENSSL,
        ],
    )
}

/// The testbed prefix of test `tag`.
fn prefix(tag: &str) -> String {
    format!("sk{}{tag}", std::process::id() % 100_000)
}

// ---- the testbed ---------------------------------------------------------------------

impl Bed {
    /// Adds `addr` to `lo` of every backend: what kube-proxy's rules do for a
    /// LoadBalancer address on a node (accept it locally). Backends keep
    /// `arp_ignore=1`, so they do not answer ARP for it.
    fn nodes_accept(&self, addr: &str) {
        for b in self.backends() {
            let ns = b["namespace"].as_str().expect("namespace");
            let o = run(Command::new("ip").args([
                "-n",
                ns,
                "addr",
                "add",
                &format!("{addr}/32"),
                "dev",
                "lo",
            ]));
            assert!(
                o.status.success() || text(&o.stderr).contains("exists"),
                "adding {addr} on {ns}: {}",
                text(&o.stderr)
            );
        }
    }

    /// Stops the backend servers `testbed up` started (the tests that model pods and
    /// kube-proxy health ports start their own).
    fn stop_testbed_servers(&self) {
        for b in self.backends() {
            if let Some(pid) = b["pid"].as_i64() {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
        sleep(Duration::from_millis(200));
    }
}

/// `strait testbed serve --name NAME --tcp [::]:PORT` in backend namespace `backend` (a pod,
/// a health port), once it answers on `port` from the gateway namespace; killed on drop.
fn serve(bed: &Bed, backend: &str, name: &str, port: u16) -> Proc {
    let tcp = format!("[::]:{port}");
    // No UDP echo: only one process per namespace could bind its port.
    let p = bed.serve(backend, name, &["--tcp", &tcp, "--udp", "127.0.0.1:0"]);
    let url = format!("http://{}:{port}/healthz", bed.backend_ip(backend));
    wait_for(
        &format!("{name} answering on {url}"),
        Duration::from_secs(5),
        || {
            let o = bed.exec("gw", &["curl", "-s", "--max-time", "1", &url]);
            o.status.success().then_some(())
        },
    );
    p
}

// ---- the gateway ---------------------------------------------------------------------

impl Gateway {
    /// The service serving `vip:port`.
    fn service(&self, vip: &str, port: u16) -> Option<Value> {
        self.services()?["services"]
            .as_array()?
            .iter()
            .find(|s| s["vip"] == vip && s["port"] == port)
            .cloned()
    }

    /// `address -> state` of the backends of the service on `vip:port`.
    fn backends(&self, vip: &str, port: u16) -> BTreeMap<String, String> {
        self.service(vip, port)
            .and_then(|s| s["backends"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(|b| {
                (
                    b["address"].as_str().unwrap_or("").to_owned(),
                    b["state"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }

    /// Waits up to `timeout` for the service on `vip:port` to have `n` backends; they.
    fn wait_backends(
        &self,
        vip: &str,
        port: u16,
        n: usize,
        timeout: Duration,
    ) -> BTreeMap<String, String> {
        wait_for(
            &format!("{n} backends of {vip}:{port} in /services"),
            timeout,
            || {
                let b = self.backends(vip, port);
                (b.len() == n).then_some(b)
            },
        )
    }
}

/// A test's world: a testbed, the fake API server in its gateway namespace with the
/// testbed's backends b1..bN as Nodes n1..nN, and `strait run --kube` in the gateway
/// namespace. Dropped in that order reversed, then the serial lock goes.
struct Cluster {
    gw: Gateway,
    fake: FakeApi,
    bed: Bed,
    _serial: MutexGuard<'static, ()>,
}

/// The [`Cluster`] of test `tag` on a `topology` testbed with `backends` backends, the
/// gateway started with `--kube-mode MODE --kube-pool POOL`; `None` if the tests may not
/// run.
fn cluster(tag: &str, topology: &str, backends: usize, mode: &str, pool: &str) -> Option<Cluster> {
    let serial = serial_if(privileged)?;
    let n = backends.to_string();
    let bed = Bed::up(&prefix(tag), &["--topology", topology, "--backends", &n]);
    let fake = FakeApi::start_in_netns(&bed.ns("gw"));
    for i in 1..=backends {
        fake.apply(node(&format!("n{i}"), &bed.backend_ip(&format!("b{i}"))));
    }
    let mut cmd = Gateway::command(&bed, &bed.gateway_config());
    cmd.args(["--kube", "--kubeconfig"])
        .arg(fake.kubeconfig(bed.dir.path()))
        .args(["--kube-mode", mode, "--kube-pool", pool]);
    let gw = Gateway::spawn(&bed, cmd, Gateway::healthy);
    Some(Cluster {
        gw,
        fake,
        bed,
        _serial: serial,
    })
}

/// The forwarding counters of `/metrics` that tell why requests fail.
fn forwarding_metrics(gw: &Gateway) -> String {
    gw.get("/metrics")
        .lines()
        .filter(|l| l.contains("no_next_hop") || l.contains("strait_tx_packets"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `n` requests to `url`: every one answered, by the backends `want` exactly, and every
/// answer shows the client's address: the backends (`who`: the node, the pod) saw it.
fn assert_answered(bed: &Bed, gw: &Gateway, url: &str, n: usize, who: &str, want: &[&str]) {
    let answers = bed.requests(url, n);
    let failed = answers.iter().filter(|a| a.is_none()).count();
    assert_eq!(
        failed,
        0,
        "{failed} of {n} requests to {url} failed: {answers:?}\n{}\n{}",
        forwarding_metrics(gw),
        gw.log_text()
    );
    assert_client_seen(&answers, who);
    let per = tally(&answers);
    assert_eq!(
        per.keys().map(String::as_str).collect::<Vec<_>>(),
        want,
        "{per:?}"
    );
}

// ---- a client loop -------------------------------------------------------------------

/// One request of a [`Load`].
#[derive(Debug, Clone)]
struct Sample {
    /// When curl was started.
    at: Instant,
    /// The body (`backend=NAME client=...`), or curl's error.
    answer: Result<String, String>,
}

impl Sample {
    fn backend(&self) -> Option<&str> {
        support::bed::backend_of(self.answer.as_ref().ok()?)
    }
}

/// curl in the client namespace in a loop, a new connection each time, until finished.
struct Load {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Sample>>>,
}

impl Load {
    fn start(bed: &Bed, url: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let (ns, url, flag) = (bed.ns("client"), url.to_owned(), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            let mut out = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let at = Instant::now();
                let o = in_ns(&ns, ["curl", "-sS", "--max-time", "4", &url]).output();
                let answer = match o {
                    Ok(o) if o.status.success() => Ok(text(&o.stdout).trim().to_owned()),
                    Ok(o) => Err(text(&o.stderr).trim().to_owned()),
                    Err(e) => Err(e.to_string()),
                };
                out.push(Sample { at, answer });
            }
            out
        });
        Load {
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn failures(samples: &[Sample]) -> Vec<String> {
    samples
        .iter()
        .filter_map(|s| s.answer.as_ref().err().cloned())
        .collect()
}

/// Answers per backend among `samples` started in `[from, to)`.
fn per_backend(samples: &[Sample], from: Instant, to: Instant) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for s in samples.iter().filter(|s| s.at >= from && s.at < to) {
        if let Some(b) = s.backend() {
            *m.entry(b.to_owned()).or_default() += 1;
        }
    }
    m
}

// ---- objects -------------------------------------------------------------------------

/// A LoadBalancer Service of our class, `http` 80 -> 8080, created through the fake
/// server's defaulting (node ports, and a health-check node port under `Local`).
fn web(local: bool) -> Value {
    json!({
        "kind": "Service", "apiVersion": "v1",
        "metadata": { "name": "web", "namespace": "default" },
        "spec": {
            "type": "LoadBalancer",
            "loadBalancerClass": CLASS,
            "externalTrafficPolicy": if local { "Local" } else { "Cluster" },
            "selector": { "app": "web" },
            "ports": [{ "name": "http", "port": 80, "targetPort": 8080 }]
        }
    })
}

/// Endpoint conditions: a ready pod, or one terminating (still serving).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Pod {
    Ready,
    Starting,
    Terminating,
}

/// EndpointSlice `web-1` of `web` with port `http` 8080: `(pod address, node, state)`.
fn web_slice(endpoints: &[(&str, &str, Pod)]) -> Value {
    let eps: Vec<Value> = endpoints
        .iter()
        .map(|(addr, node, pod)| {
            let (ready, serving, terminating) = match pod {
                Pod::Ready => (true, true, false),
                Pod::Starting => (false, false, false),
                Pod::Terminating => (false, true, true),
            };
            json!({
                "addresses": [addr], "nodeName": node,
                "conditions": { "ready": ready, "serving": serving, "terminating": terminating }
            })
        })
        .collect();
    json!({
        "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": "web-1", "namespace": "default",
            "labels": { "kubernetes.io/service-name": "web" }
        },
        "addressType": "IPv4",
        "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
        "endpoints": eps
    })
}

/// Waits for the fake server's stored Service `ns/name` to carry a LoadBalancer address;
/// returns it.
fn written_address(fake: &FakeApi, ns: &str, name: &str) -> String {
    wait_for(
        &format!("status.loadBalancer.ingress of {ns}/{name}"),
        Duration::from_secs(10),
        || {
            let svc = fake.get(Res::Services, ns, name)?;
            svc["status"]["loadBalancer"]["ingress"][0]["ip"]
                .as_str()
                .map(str::to_owned)
        },
    )
}

fn in_pool(addr: &str, pool: &str) -> bool {
    let net: ipnet::IpNet = pool.parse().expect("pool");
    addr.parse::<IpAddr>().is_ok_and(|a| net.contains(&a))
}

// ---- 1. a Service gets an address, its status and traffic ----------------------------

#[test]
fn a_dsr_service_gets_a_pool_address_its_status_and_traffic_over_every_node() {
    let pool = "203.0.113.16/28";
    let Some(c) = cluster("a", "one-arm", 3, "dsr-l2", pool) else {
        return;
    };
    let (bed, fake, gw) = (&c.bed, &c.fake, &c.gw);
    fake.create(web(false));
    let vip = written_address(fake, "default", "web");
    assert!(in_pool(&vip, pool), "{vip} is not from the pool {pool}");
    assert_eq!(
        vip, "203.0.113.17",
        "the lowest free host of {pool} is handed out first"
    );
    // The gateway serves it with the three nodes as backends, at the Service port.
    let backends = gw.wait_backends(&vip, 80, 3, Duration::from_secs(5));
    let want: Vec<String> = (1..=3).map(|i| bed.backend_ip(&format!("b{i}"))).collect();
    assert_eq!(backends.keys().cloned().collect::<Vec<_>>(), want);
    bed.nodes_accept(&vip);
    let url = format!("http://{vip}/");
    assert_answered(bed, gw, &url, 60, "node", &["b1", "b2", "b3"]);
}

#[test]
fn b_a_nat_service_gets_a_pool_address_its_status_and_traffic_to_its_endpoints() {
    let pool = "203.0.113.40/29";
    let Some(c) = cluster("b", "two-arm", 3, "nat", pool) else {
        return;
    };
    let (bed, fake, gw) = (&c.bed, &c.fake, &c.gw);
    // Pods on b1 and b2 only; b3 runs the same server but is no endpoint of `web`.
    let (b1, b2) = (bed.backend_ip("b1"), bed.backend_ip("b2"));
    fake.apply(web_slice(&[
        (&b1, "n1", Pod::Ready),
        (&b2, "n2", Pod::Ready),
    ]));
    fake.create(web(false));
    let vip = written_address(fake, "default", "web");
    assert!(in_pool(&vip, pool), "{vip} is not from the pool {pool}");
    let backends = wait_for("the service in /services", Duration::from_secs(5), || {
        let b = gw.backends(&vip, 80);
        (!b.is_empty()).then_some(b)
    });
    assert_eq!(
        backends.keys().cloned().collect::<Vec<_>>(),
        [b1.clone(), b2.clone()]
    );
    let url = format!("http://{vip}/");
    assert_answered(bed, gw, &url, 60, "pod", &["b1", "b2"]);
    // The status write is a real subresource write: only status changed in the store.
    let stored = fake.get(Res::Services, "default", "web").expect("web");
    assert_eq!(stored["spec"]["loadBalancerClass"], CLASS);
    assert!(fake
        .requests()
        .iter()
        .any(|r| r.starts_with("PATCH /api/v1/namespaces/default/services/web/status")));
}

/// Two Services sharing one address: `web` on port 80 with its pod on
/// b1, `api` on port 81 with its pod on b2, one sharing key. Both get the same address,
/// and each port reaches its own Service's pod only.
#[test]
fn b2_two_services_share_one_address_and_each_port_reaches_its_own_pods() {
    let pool = "203.0.113.40/29";
    let Some(c) = cluster("b2", "two-arm", 2, "nat", pool) else {
        return;
    };
    let (bed, fake, gw) = (&c.bed, &c.fake, &c.gw);
    let (b1, b2) = (bed.backend_ip("b1"), bed.backend_ip("b2"));
    let service = |name: &str, port: u16| {
        let mut v = web(false);
        v["metadata"]["name"] = json!(name);
        v["metadata"]["annotations"] = json!({ "metallb.io/allow-shared-ip": "front" });
        v["spec"]["selector"] = json!({ "app": name });
        v["spec"]["ports"] = json!([{ "name": "http", "port": port, "targetPort": 8080 }]);
        v
    };
    let slice = |name: &str, pod: &str, node: &str| {
        let mut v = web_slice(&[(pod, node, Pod::Ready)]);
        v["metadata"]["name"] = json!(format!("{name}-1"));
        v["metadata"]["labels"]["kubernetes.io/service-name"] = json!(name);
        v
    };
    fake.apply(slice("web", &b1, "n1"));
    fake.apply(slice("api", &b2, "n2"));
    fake.create(service("web", 80));
    fake.create(service("api", 81));
    let vip = written_address(fake, "default", "web");
    assert!(in_pool(&vip, pool), "{vip} is not from the pool {pool}");
    assert_eq!(written_address(fake, "default", "api"), vip, "one address");
    for (port, pod) in [(80, &b1), (81, &b2)] {
        let backends = wait_for(
            &format!("{vip}:{port} in /services"),
            Duration::from_secs(5),
            || {
                let b = gw.backends(&vip, port);
                (!b.is_empty()).then_some(b)
            },
        );
        assert_eq!(backends.keys().collect::<Vec<_>>(), [pod]);
    }
    assert_answered(bed, gw, &format!("http://{vip}:80/"), 20, "pod", &["b1"]);
    assert_answered(bed, gw, &format!("http://{vip}:81/"), 20, "pod", &["b2"]);
}

// ---- 2. endpoints scale up and down while requests run --------------------------------

#[test]
fn c_nat_endpoints_scale_up_and_down_while_requests_run() {
    let Some(c) = cluster("c", "two-arm", 4, "nat", "203.0.113.40/29") else {
        return;
    };
    let (bed, fake, gw) = (&c.bed, &c.fake, &c.gw);
    let ip: Vec<String> = (1..=4).map(|i| bed.backend_ip(&format!("b{i}"))).collect();
    let pod = |i: usize, p: Pod| (ip[i - 1].as_str(), ["n1", "n2", "n3", "n4"][i - 1], p);
    fake.apply(web_slice(&[pod(1, Pod::Ready), pod(2, Pod::Ready)]));
    fake.create(web(false));
    let vip = written_address(fake, "default", "web");
    gw.wait_backends(&vip, 80, 2, Duration::from_secs(5));
    // How long a change may take from the API server to new flows: generous against a
    // loaded CI machine, far below what a person would notice.
    let settle = Duration::from_secs(2);
    let load = Load::start(bed, &format!("http://{vip}/"));
    sleep(Duration::from_secs(2));
    let up = Instant::now();
    fake.apply(web_slice(&[
        pod(1, Pod::Ready),
        pod(2, Pod::Ready),
        pod(3, Pod::Ready),
        pod(4, Pod::Ready),
    ]));
    sleep(Duration::from_secs(4));
    // Scale down the way Kubernetes does it: b1 and b2 terminate (serving, not ready),
    // then leave the slice.
    let terminating = Instant::now();
    fake.apply(web_slice(&[
        pod(1, Pod::Terminating),
        pod(2, Pod::Terminating),
        pod(3, Pod::Ready),
        pod(4, Pod::Ready),
    ]));
    sleep(Duration::from_secs(2));
    let removed = Instant::now();
    fake.apply(web_slice(&[pod(3, Pod::Ready), pod(4, Pod::Ready)]));
    sleep(Duration::from_secs(2));
    let end = Instant::now();
    let samples = load.finish();
    let failed = failures(&samples);
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {failed:?}\n{}",
        failed.len(),
        samples.len(),
        gw.log_text()
    );
    let start = samples.first().map_or(up, |s| s.at);
    let before = per_backend(&samples, start, up);
    assert_eq!(
        before.keys().cloned().collect::<Vec<_>>(),
        ["b1", "b2"],
        "before scaling up: {before:?}"
    );
    let scaled = per_backend(&samples, up + settle, terminating);
    assert_eq!(
        scaled.keys().cloned().collect::<Vec<_>>(),
        ["b1", "b2", "b3", "b4"],
        "after scaling up to four endpoints, every one takes new flows: {scaled:?}"
    );
    let draining = per_backend(&samples, terminating + settle, end);
    assert_eq!(
        draining.keys().cloned().collect::<Vec<_>>(),
        ["b3", "b4"],
        "terminating and removed endpoints take no new flows: {draining:?}"
    );
    assert!(
        per_backend(&samples, removed, end).values().sum::<usize>() >= 10,
        "too few requests after the scale-down to tell anything: {}",
        samples.len()
    );
    let last = gw.backends(&vip, 80);
    assert_eq!(
        last.keys().cloned().collect::<Vec<_>>(),
        [ip[2].clone(), ip[3].clone()]
    );
}

// ---- 3. a rolling update under externalTrafficPolicy: Local ---------------------------

/// One node of the rolling update: its pod (the HTTP server on port 80) and its kube-proxy
/// health-check node port (200 on /healthz while it runs; the real one answers 503 when
/// the node has no ready endpoint, refused is as unhealthy to the gateway).
#[derive(Default)]
struct NodeProcs {
    pod: Option<Proc>,
    health: Option<Proc>,
}

#[test]
fn d_a_rolling_update_under_local_fails_no_request() {
    let Some(c) = cluster("d", "one-arm", 4, "dsr-l2", "203.0.113.16/28") else {
        return;
    };
    let (bed, fake, gw) = (&c.bed, &c.fake, &c.gw);
    bed.stop_testbed_servers();
    fake.create(web(true));
    let vip = written_address(fake, "default", "web");
    let svc = fake.get(Res::Services, "default", "web").expect("web");
    let hc = u16::try_from(
        svc["spec"]["healthCheckNodePort"]
            .as_u64()
            .expect("allocated"),
    )
    .expect("a port");
    bed.nodes_accept(&vip);

    // Pod addresses are never dialled in DSR (the nodes' kube-proxy would): any will do.
    let pod_ip = |node: usize, version: usize| format!("203.0.113.{}", 100 + 10 * version + node);
    let mut procs: Vec<NodeProcs> = (0..=4).map(|_| NodeProcs::default()).collect();
    let mut endpoints: BTreeMap<usize, (String, Pod)> = BTreeMap::new();
    let publish = |endpoints: &BTreeMap<usize, (String, Pod)>| {
        let names: Vec<String> = endpoints.keys().map(|n| format!("n{n}")).collect();
        let list: Vec<(&str, &str, Pod)> = endpoints
            .iter()
            .zip(&names)
            .map(|((_, (ip, p)), n)| (ip.as_str(), n.as_str(), *p))
            .collect();
        fake.apply(web_slice(&list));
    };
    // v1 on n1 and n2.
    for n in [1, 2] {
        let b = format!("b{n}");
        procs[n].pod = Some(serve(bed, &b, &format!("{b}-v1"), 80));
        procs[n].health = Some(serve(bed, &b, "kube-proxy", hc));
        endpoints.insert(n, (pod_ip(n, 1), Pod::Ready));
    }
    publish(&endpoints);
    gw.wait_backends(&vip, 80, 2, Duration::from_secs(5));
    let load = Load::start(bed, &format!("http://{vip}/"));
    sleep(Duration::from_secs(2));

    // maxSurge 1, maxUnavailable 0: v2 on n3 comes up, then v1 on n1 goes; the same for
    // n4 and n2.
    let grace = Duration::from_secs(2);
    for (new, old) in [(3, 1), (4, 2)] {
        let b = format!("b{new}");
        procs[new].pod = Some(serve(bed, &b, &format!("{b}-v2"), 80));
        endpoints.insert(new, (pod_ip(new, 2), Pod::Starting));
        publish(&endpoints);
        sleep(Duration::from_millis(500));
        // Ready: kube-proxy on the node now has a local endpoint and answers 200.
        procs[new].health = Some(serve(bed, &b, "kube-proxy", hc));
        endpoints.insert(new, (pod_ip(new, 2), Pod::Ready));
        publish(&endpoints);
        sleep(Duration::from_secs(1));
        // The old pod terminates: not ready, still serving for its grace period; its
        // node's health port turns unhealthy (no ready local endpoint).
        endpoints.insert(old, (pod_ip(old, 1), Pod::Terminating));
        publish(&endpoints);
        procs[old].health = None;
        sleep(grace);
        // The grace period is over: the container is killed, and the endpoint leaves the
        // slice a moment later (when the pod object is deleted). A gateway that sent new
        // flows to a terminating endpoint's node would see them refused now.
        procs[old].pod = None;
        sleep(Duration::from_secs(1));
        endpoints.remove(&old);
        publish(&endpoints);
        sleep(Duration::from_millis(500));
    }
    sleep(Duration::from_secs(1));
    let end = Instant::now();
    let samples = load.finish();
    let failed = failures(&samples);
    assert!(
        failed.is_empty(),
        "{} of {} requests failed during the rolling update: {failed:?}\n{}",
        failed.len(),
        samples.len(),
        gw.log_text()
    );
    assert!(
        samples.len() >= 50,
        "only {} requests ran during the update",
        samples.len()
    );
    let all = per_backend(&samples, samples[0].at, end);
    for pod in ["b1-v1", "b2-v1", "b3-v2", "b4-v2"] {
        assert!(all.contains_key(pod), "{pod} answered nothing: {all:?}");
    }
    let last = gw.backends(&vip, 80);
    assert_eq!(
        last.keys().cloned().collect::<Vec<_>>(),
        [bed.backend_ip("b3"), bed.backend_ip("b4")],
        "after the update web is served by the nodes of the new pods only"
    );
    drop(procs);
}

// ---- 4. the API server is down for 30 s ----------------------------------------------

#[test]
fn e_the_api_server_is_down_for_30_s_and_traffic_goes_on() {
    let Some(c) = cluster("e", "two-arm", 3, "nat", "203.0.113.40/29") else {
        return;
    };
    let (bed, fake, gw) = (&c.bed, &c.fake, &c.gw);
    let ip: Vec<String> = (1..=3).map(|i| bed.backend_ip(&format!("b{i}"))).collect();
    let ready = |i: usize| (ip[i - 1].as_str(), ["n1", "n2", "n3"][i - 1], Pod::Ready);
    fake.apply(web_slice(&[ready(1), ready(2)]));
    fake.create(web(false));
    let vip = written_address(fake, "default", "web");
    gw.wait_backends(&vip, 80, 2, Duration::from_secs(5));
    assert_eq!(
        gw.metric("strait_kube_connected"),
        Some(1.0),
        "{}",
        gw.get("/metrics")
    );
    let disconnects = gw.metric("strait_kube_disconnects").unwrap_or(0.0);

    let load = Load::start(bed, &format!("http://{vip}/"));
    sleep(Duration::from_secs(1));
    let down = Instant::now();
    fake.set_down(true);
    wait_for(
        "/metrics showing the disconnect",
        Duration::from_secs(10),
        || {
            (gw.metric("strait_kube_connected") == Some(0.0)
                && gw.metric("strait_kube_disconnects").unwrap_or(0.0) > disconnects)
                .then_some(())
        },
    );
    let noticed = down.elapsed();
    sleep(Duration::from_secs(30).saturating_sub(down.elapsed()));
    // Still forwarding on the last good table, same backends.
    assert_eq!(gw.backends(&vip, 80).len(), 2);
    fake.set_down(false);
    let back = Instant::now();
    let during = load.finish();
    let failed = failures(&during);
    assert!(
        failed.is_empty(),
        "{} of {} requests failed while the API server was down: {failed:?}",
        failed.len(),
        during.len()
    );
    let in_outage = during.iter().filter(|s| s.at >= down).count();
    assert!(
        in_outage >= 100,
        "only {in_outage} requests ran during the outage"
    );
    let seen = per_backend(&during, down, back);
    assert_eq!(
        seen.keys().cloned().collect::<Vec<_>>(),
        ["b1", "b2"],
        "{seen:?}"
    );

    // Back: a change made now is picked up (reconnecting waits out kube-rs' back-off,
    // at most 30 s).
    fake.apply(web_slice(&[ready(1), ready(2), ready(3)]));
    let load = Load::start(bed, &format!("http://{vip}/"));
    gw.wait_backends(&vip, 80, 3, Duration::from_secs(45));
    let picked = back.elapsed();
    sleep(Duration::from_secs(2));
    let after = load.finish();
    let failed = failures(&after);
    assert!(
        failed.is_empty(),
        "requests failed after reconnecting: {failed:?}"
    );
    let last = after.last().map_or(Instant::now(), |s| s.at);
    let fresh = per_backend(
        &after,
        last - Duration::from_secs(2),
        last + Duration::from_secs(1),
    );
    assert!(
        fresh.contains_key("b3"),
        "the endpoint added after the outage takes no new flows: {fresh:?}"
    );
    assert_eq!(gw.metric("strait_kube_connected"), Some(1.0));
    let log = gw.log_text();
    eprintln!(
        "disconnect seen after {noticed:?}; change picked up {picked:?} after the server came back"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("kubernetes") && l.contains("API server")),
        "no warning in the log about losing the API server:\n{log}"
    );
}

// ---- 5. the guide's cluster section, step by step ------------------------------------

/// The "Put Strait in front of your cluster" section of docs/kubernetes.md: up to its NAT
/// part, and the NAT part.
fn readme_cluster_section() -> (String, String) {
    let readme = include_str!("../../docs/kubernetes.md");
    let start = readme
        .find("## Put Strait in front of your cluster")
        .expect("docs/kubernetes.md: the section \"Put Strait in front of your cluster\"");
    let rest = &readme[start..];
    let end = rest.find("\n## ").unwrap_or(rest.len());
    let nat = rest
        .find("### 3b.")
        .expect("docs/kubernetes.md: the NAT part, 3b.");
    (rest[..nat].to_owned(), rest[nat..end].to_owned())
}

/// The fenced code blocks of `text` (language tag, body), in order.
fn code_blocks(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        let Some(lang) = l.trim_start().strip_prefix("```") else {
            continue;
        };
        let indent = l.len() - l.trim_start().len();
        let mut body = String::new();
        for b in lines.by_ref() {
            if b.trim_start().starts_with("```") {
                break;
            }
            body.push_str(b.get(indent..).unwrap_or(b.trim_start()));
            body.push('\n');
        }
        out.push((lang.trim().to_owned(), body));
    }
    out
}

/// The one block of `blocks` containing `needle`.
fn block<'a>(blocks: &'a [(String, String)], needle: &str) -> &'a str {
    let found: Vec<&(String, String)> = blocks.iter().filter(|(_, b)| b.contains(needle)).collect();
    assert_eq!(
        found.len(),
        1,
        "guide's cluster section: expected one code block with {needle:?}"
    );
    &found[0].1
}

/// The text between the first `before` after `from` and the next `after`.
fn between<'a>(text: &'a str, before: &str, after: &str) -> &'a str {
    let i = text
        .find(before)
        .unwrap_or_else(|| panic!("docs/kubernetes.md: no {before:?}"))
        + before.len();
    let j = text[i..]
        .find(after)
        .unwrap_or_else(|| panic!("docs/kubernetes.md: nothing ends {before:?}"));
    &text[i..i + j]
}

/// deploy/rbac.yaml as JSON documents.
fn manifests(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| {
            let v: serde_yaml::Value = serde::Deserialize::deserialize(d).expect("YAML");
            serde_json::to_value(v).expect("YAML as JSON")
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// The guide's cluster section, read once per test.
struct Readme {
    /// The code blocks up to the NAT part.
    blocks: Vec<(String, String)>,
    /// Its prose up to the NAT part, line breaks and indentation as single spaces.
    prose: String,
    /// The NAT part (3b), the same way.
    nat: String,
    /// The repository root (the guide's commands run from there).
    repo: PathBuf,
}

impl Readme {
    fn load() -> Readme {
        let (section, nat) = readme_cluster_section();
        let flat = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
        Readme {
            blocks: code_blocks(&section),
            prose: flat(&section),
            nat: flat(&nat),
            repo: Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
        }
    }
}

/// Steps 1 (permissions), 2 (a kubeconfig) and 4 (install the configuration and start),
/// with `start` applied to the guide's command line (the NAT part changes the mode).
/// Returns the gateway and the ServiceAccount's token.
fn steps_1_2_and_4(
    readme: &Readme,
    bed: &Bed,
    fake: &FakeApi,
    start: &dyn Fn(&str) -> String,
) -> (Gateway, String) {
    let (blocks, repo) = (&readme.blocks, &readme.repo);
    // The guide's /etc/strait, made by its own `install -D` steps.
    let etc = bed.dir.join("etc-strait");
    // 1. Permissions: `kubectl apply -f deploy/rbac.yaml`. The fake server enforces the
    //    ClusterRole bound to the ServiceAccount, with the token of the Secret made for it.
    let apply = block(blocks, "kubectl apply -f");
    let rbac_file = apply
        .split_whitespace()
        .skip_while(|w| *w != "-f")
        .nth(1)
        .expect("kubectl apply -f FILE");
    let docs = manifests(
        &std::fs::read_to_string(repo.join(rbac_file))
            .unwrap_or_else(|e| panic!("{rbac_file}: {e}")),
    );
    let of_kind = |k: &'static str| docs.iter().filter(move |d| d["kind"] == k);
    let account = of_kind("ServiceAccount").next().expect("a ServiceAccount");
    let (sa_ns, sa_name) = (
        account["metadata"]["namespace"]
            .as_str()
            .expect("namespace"),
        account["metadata"]["name"].as_str().expect("name"),
    );
    let binding = of_kind("ClusterRoleBinding")
        .find(|b| {
            b["subjects"].as_array().is_some_and(|s| {
                s.iter().any(|s| {
                    s["kind"] == "ServiceAccount" && s["name"] == sa_name && s["namespace"] == sa_ns
                })
            })
        })
        .expect("a ClusterRoleBinding of the ServiceAccount");
    let role = of_kind("ClusterRole")
        .find(|r| r["metadata"]["name"] == binding["roleRef"]["name"])
        .expect("the bound ClusterRole");
    let token = format!("strait-walkthrough-{}", std::process::id());
    fake.authorize(&token, role);

    // 2. A kubeconfig: the guide's script, with what its three kubectl queries return
    //    from this cluster (the server, the CA and the token of the Secret it names).
    let script = block(blocks, "cat > kubeconfig");
    let secret_name = between(script, "get secret ", " ").to_owned();
    let secret = of_kind("Secret")
        .find(|s| s["metadata"]["name"] == secret_name.as_str())
        .unwrap_or_else(|| panic!("{rbac_file} has no Secret {secret_name}"));
    assert_eq!(secret["type"], "kubernetes.io/service-account-token");
    assert_eq!(
        secret["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        sa_name
    );
    let ca = bed.dir.join("ca.crt");
    let key = bed.dir.join("ca.key");
    let o = run(Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=fake-kubernetes-ca", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&ca));
    assert!(o.status.success(), "openssl: {}", text(&o.stderr));
    let ca_data = run(Command::new("base64").arg("-w0").arg(&ca));
    let kept: Vec<&str> = script
        .lines()
        .filter(|l| {
            !["SERVER=$(", "CA=$(", "TOKEN=$("]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .collect();
    assert_eq!(
        script.lines().count() - kept.len(),
        3,
        "the script asks kubectl for SERVER, CA and TOKEN"
    );
    let script = kept
        .join("\n")
        .replace("/etc/strait", &etc.to_string_lossy());
    let o = run(Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(bed.dir.path())
        .env("SERVER", fake.url())
        .env("CA", text(&ca_data.stdout).trim())
        .env("TOKEN", &token));
    assert!(
        o.status.success(),
        "the guide's kubeconfig script: {}",
        text(&o.stderr)
    );
    let kubeconfig = etc.join("kubeconfig");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&kubeconfig)
            .expect("installed kubeconfig")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    // 3a.4: install the example configuration (the guide's own `install` line, run from
    //    the repository), set its interface to this machine's NIC, then the command line.
    let joined = start(block(blocks, "strait run "))
        .replace("\\\n", " ")
        .replace("/etc/strait", &etc.to_string_lossy());
    let (installs, runs): (Vec<&str>, Vec<&str>) = joined
        .lines()
        .filter(|l| !l.trim().is_empty())
        .partition(|l| l.starts_with("install "));
    assert_eq!(runs.len(), 1, "one command starts the gateway: {runs:?}");
    for line in &installs {
        let o = run(Command::new("bash")
            .args(["-euo", "pipefail", "-c", line])
            .current_dir(repo));
        assert!(o.status.success(), "{line}: {}", text(&o.stderr));
    }
    let installed = etc.join("strait.toml");
    let example = std::fs::read_to_string(&installed).expect("the installed configuration");
    let theirs = "name = \"eth1\"\nqueues = [0, 1, 2, 3]\ncores = [2, 3, 4, 5]\n";
    assert!(
        example.contains(theirs),
        "the example's interface:\n{example}"
    );
    let mine = example.replace(theirs, "name = \"veth-gw\"\nqueues = [0]\n");
    std::fs::write(&installed, mine).expect("editing strait.toml");
    let words: Vec<&str> = runs[0].split_whitespace().collect();
    assert_eq!(words.first(), Some(&"strait"), "{}", runs[0]);
    let mut cmd = in_ns(&bed.ns("gw"), [strait()]);
    cmd.args(&words[1..]);

    (Gateway::spawn(bed, cmd, Gateway::healthy), token)
}

/// The Service of step 5 as created, and what the test needs of it.
struct Created {
    ns: String,
    name: String,
    local: bool,
    port: u16,
    target: u16,
    /// `spec.healthCheckNodePort`, allocated by the API server under `Local`.
    health_port: Option<u16>,
}

/// Step 5: the guide's Service manifest, created as the API server does on `kubectl
/// apply`.
fn step_5(readme: &Readme, fake: &FakeApi) -> Created {
    let manifest = block(&readme.blocks, "kind: Service");
    let svc: serde_yaml::Value = serde_yaml::from_str(manifest).expect("the Service manifest");
    let svc = serde_json::to_value(svc).expect("as JSON");
    let ns = svc["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_owned();
    let name = svc["metadata"]["name"].as_str().expect("a name").to_owned();
    let port = |v: &Value| v.as_u64().and_then(|p| u16::try_from(p).ok());
    let c = Created {
        local: svc["spec"]["externalTrafficPolicy"] == "Local",
        port: port(&svc["spec"]["ports"][0]["port"]).expect("a port"),
        target: port(&svc["spec"]["ports"][0]["targetPort"]).expect("a targetPort"),
        health_port: None,
        ns,
        name,
    };
    fake.create(svc);
    let stored = fake.get(Res::Services, &c.ns, &c.name).expect("stored");
    Created {
        health_port: port(&stored["spec"]["healthCheckNodePort"]),
        ..c
    }
}

/// The endpoints controller's part: the Service's EndpointSlice with ready pods
/// `(address, node)`.
fn pods(fake: &FakeApi, svc: &Created, pods: &[(&str, &str)]) {
    let eps: Vec<(&str, &str, Pod)> = pods.iter().map(|(a, n)| (*a, *n, Pod::Ready)).collect();
    let mut slice = web_slice(&eps);
    slice["metadata"]["name"] = json!(format!("{}-abcde", svc.name));
    slice["metadata"]["namespace"] = json!(svc.ns);
    slice["metadata"]["labels"]["kubernetes.io/service-name"] = json!(svc.name);
    slice["ports"][0]["port"] = json!(svc.target);
    fake.apply(slice);
}

/// "`kubectl get svc web` shows `EXTERNAL-IP 203.0.113.33`": the address written to the
/// Service's status, which must be the guide's.
fn external_ip(readme: &Readme, fake: &FakeApi, svc: &Created) -> String {
    let shown = between(&readme.prose, "EXTERNAL-IP ", "`").to_owned();
    let ip = written_address(fake, &svc.ns, &svc.name);
    assert_eq!(ip, shown, "the guide promises {shown}");
    ip
}

#[test]
fn f_the_readme_cluster_section_followed_step_by_step() {
    let Some(_serial) = serial_if(privileged) else {
        return;
    };
    let readme = Readme::load();
    // The example: nodes 198.51.100.11-13 on one segment with the gateway (the testbed's
    // one-arm b1-b3), clients on 192.0.2.0/24.
    let bed = Bed::up(&prefix("f"), &["--backends", "3"]);
    let fake = FakeApi::start_in_netns(&bed.ns("gw"));
    for i in 1..=3 {
        fake.apply(node(&format!("n{i}"), &format!("198.51.100.1{i}")));
    }
    // 3a.1-3: the gateway on the nodes' segment (dsr-l2), the pools routed to it.
    let route = bed.must("client", &["ip", "route", "get", "203.0.113.33"]);
    assert!(route.contains("via 192.0.2.1"), "{route}");
    let (gw, token) = steps_1_2_and_4(&readme, &bed, &fake, &|s| s.to_owned());
    let svc = step_5(&readme, &fake);
    // Pods on n1 and n2; under `Local` kube-proxy there answers on the health-check port.
    let mut health = Vec::new();
    if svc.local {
        let hc = svc.health_port.expect("a healthCheckNodePort under Local");
        for b in ["b1", "b2"] {
            health.push(serve(&bed, b, "kube-proxy", hc));
        }
    }
    pods(
        &fake,
        &svc,
        &[("203.0.113.201", "n1"), ("203.0.113.202", "n2")],
    );
    let ip = external_ip(&readme, &fake, &svc);
    // kube-proxy on the nodes accepts the address (step 3a.2).
    bed.nodes_accept(&ip);
    let (prose, ns, name, local, port) = (&readme.prose, &svc.ns, &svc.name, svc.local, svc.port);

    // "`strait status` shows `default/web/http/203.0.113.33` with ... under `Local`, the
    // nodes with a pod, health-checked on the Service's `healthCheckNodePort`"
    let status_name = between(prose, "`strait status` shows `", "`").to_owned();
    let rows = |t: &str| -> String {
        t.lines()
            .skip_while(|l| !l.starts_with(&status_name))
            .take_while(|l| l.starts_with(&status_name) || l.starts_with(' '))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let status = wait_for(
        "strait status listing the Service",
        Duration::from_secs(10),
        || {
            let t = text(&bed.exec("gw", &[strait(), "status"]).stdout);
            rows(&t).contains("198.51.100.11").then_some(t)
        },
    );
    let web_rows = rows(&status);
    assert!(web_rows.contains("198.51.100.12"), "{status}");
    if local {
        assert!(
            !web_rows.contains("198.51.100.13"),
            "n3 has no pod:\n{status}"
        );
    }
    if local {
        let json = gw.service(&ip, port).expect("served");
        let addrs: Vec<&str> = json["backends"]
            .as_array()
            .expect("backends")
            .iter()
            .filter_map(|b| b["address"].as_str())
            .collect();
        assert_eq!(addrs, ["198.51.100.11", "198.51.100.12"], "{json}");
    }

    // "and `curl http://203.0.113.33/` from a client answers"
    let url = between(prose, "`curl ", "`").to_owned();
    assert_eq!(url, format!("http://{ip}/"));
    // Answers from the nodes with a pod only.
    assert_answered(&bed, &gw, &url, 30, "node", &["b1", "b2"]);
    // Every request of the gateway was allowed by the rules of deploy/rbac.yaml ...
    assert_eq!(
        fake.denied(),
        Vec::<String>::new(),
        "requests the RBAC rules refused"
    );
    // ... and they are enforced: no token, or a verb the role lacks, is refused.
    let api = |args: &[&str]| -> String {
        let mut a = vec!["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}"];
        a.extend_from_slice(args);
        text(&bed.exec("gw", &a).stdout)
    };
    let services = format!("{}/api/v1/namespaces/{ns}/services", fake.url());
    assert_eq!(api(&[&services]), "401");
    let bearer = format!("Authorization: Bearer {token}");
    assert_eq!(api(&["-H", &bearer, &services]), "200");
    let one = format!("{services}/{name}");
    assert_eq!(api(&["-H", &bearer, "-X", "DELETE", &one]), "403");
    assert_eq!(fake.denied().len(), 2, "{:?}", fake.denied());
    drop(health);
}

#[test]
fn g_the_readme_nat_steps_with_pods_behind_their_nodes() {
    let Some(_serial) = serial_if(privileged) else {
        return;
    };
    let readme = Readme::load();
    let prose = &readme.prose;
    let bed = Bed::up(&prefix("g"), &["--backends", "3"]);
    // The example's gateway address on the node segment (the testbed's gateway has .1).
    bed.must(
        "gw",
        &["ip", "addr", "add", "198.51.100.2/24", "dev", "veth-gw"],
    );
    let fake = FakeApi::start_in_netns(&bed.ns("gw"));
    // Each node routes a pod CIDR of its own; a pod is an address on the node (what a
    // pod's veth and the node's route to it amount to, seen from the gateway), served
    // by the node's `strait testbed serve` on 8080.
    let cidrs = ["203.0.113.64/28", "203.0.113.80/28", "203.0.113.96/28"];
    let pod_ips = ["203.0.113.65", "203.0.113.81", "203.0.113.97"];
    for i in 1..=3 {
        let mut n = node(&format!("n{i}"), &format!("198.51.100.1{i}"));
        n["spec"] = json!({ "podCIDR": cidrs[i - 1], "podCIDRs": [cidrs[i - 1]] });
        fake.apply(n);
        let pod = format!("{}/32", pod_ips[i - 1]);
        bed.must(&format!("b{i}"), &["ip", "addr", "add", &pod, "dev", "lo"]);
    }

    // 3b.1: "`ip route add <podCIDR> via <node InternalIP>` on the gateway", for each
    //    node's `.spec.podCIDR`.
    let template = between(&readme.nat, "then `", "` on the gateway").to_owned();
    assert!(template.contains("<podCIDR>") && template.contains("<node InternalIP>"));
    for i in 1..=3 {
        let node = fake.get(Res::Nodes, "", &format!("n{i}")).expect("node");
        let cidr = node["spec"]["podCIDR"].as_str().expect("podCIDR");
        let internal = node["status"]["addresses"][0]["address"]
            .as_str()
            .expect("InternalIP");
        let cmd = template
            .replace("<podCIDR>", cidr)
            .replace("<node InternalIP>", internal);
        let words: Vec<&str> = cmd.split_whitespace().collect();
        bed.must("gw", &words);
    }
    // 3b.2: "make the gateway the nodes' route to the client networks (`ip route add
    //    192.0.2.0/24 via 198.51.100.2` on each node)". The testbed's flat segment gave
    //    them an on-link route to the clients; it goes first.
    let node_route = between(&readme.nat, "client networks (`", "` on each node").to_owned();
    for i in 1..=3 {
        let b = format!("b{i}");
        bed.must(&b, &["ip", "route", "del", "192.0.2.0/24"]);
        let words: Vec<&str> = node_route.split_whitespace().collect();
        bed.must(&b, &words);
    }
    // 3b.3: "Start it with `--kube-mode nat` ... and create LoadBalancer Services as above".
    let mode = between(&readme.nat, "Start it with `", "`").to_owned();
    assert_eq!(mode, "--kube-mode nat");
    let (gw, _token) = steps_1_2_and_4(&readme, &bed, &fake, &|s| {
        s.replace("--kube-mode dsr-l2", &mode)
    });
    let svc = step_5(&readme, &fake);
    pods(&fake, &svc, &[(pod_ips[0], "n1"), (pod_ips[1], "n2")]);
    let ip = external_ip(&readme, &fake, &svc);
    let backends = gw.wait_backends(&ip, svc.port, 2, Duration::from_secs(10));
    assert_eq!(
        backends.keys().cloned().collect::<Vec<_>>(),
        [pod_ips[0], pod_ips[1]]
    );
    let url = between(prose, "`curl ", "`").to_owned();
    // The first request may find a next hop unresolved (the gateway probes it, and
    // looks again every second).
    let deadline = Instant::now() + Duration::from_secs(5);
    while bed.curl(&url).is_err() && Instant::now() < deadline {
        sleep(Duration::from_millis(200));
    }
    assert_answered(&bed, &gw, &url, 20, "pod", &["b1", "b2"]);
}
