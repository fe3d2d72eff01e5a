//! A fake Kubernetes API server for tests: plain HTTP/1.1 on 127.0.0.1 over tokio, speaking
//! the real list/watch wire format for Services, EndpointSlices and Nodes.
//!
//! | request | answer |
//! |---|---|
//! | `GET /version` | a `version.Info` |
//! | `GET /api/v1/services`, `/api/v1/namespaces/{ns}/services` | `ServiceList` (paged by `limit` / `continue`) |
//! | `GET /apis/discovery.k8s.io/v1[/namespaces/{ns}]/endpointslices` | `EndpointSliceList` |
//! | `GET /api/v1/nodes` | `NodeList` |
//! | `GET /api/v1/namespaces` | `NamespaceList` |
//! | `GET /apis/strait.dev/v1alpha1/straitaddresspools` | `StraitAddressPoolList` (cluster-scoped; writes of the object keep its status, `metadata.generation` counts spec changes) |
//! | the same with `watch=1` / `watch=true` | chunked JSON lines `{"type":"ADDED","object":{..}}` from `resourceVersion` on, `BOOKMARK`s every second with `allowWatchBookmarks`, ended after `timeoutSeconds`; an `ERROR` event with a 410 `Status` ("Expired") when the version is compacted or [`FakeApi::expire`] is called |
//! | `GET /api/v1/namespaces/{ns}/services/{name}` | the Service |
//! | `PATCH /api/v1/namespaces/{ns}/services/{name}/status`, `PATCH /apis/strait.dev/v1alpha1/straitaddresspools/{name}/status` | JSON merge patch of `status` only, stored, seen by later lists and watches |
//! | `POST /apis/events.k8s.io/v1/namespaces/{ns}/events`, `POST /api/v1/namespaces/{ns}/events`, `PATCH .../events/{name}` | stored, readable with [`FakeApi::events`] |
//!
//! Tests drive it from ordinary threads: [`FakeApi::apply`] and [`FakeApi::delete`] change
//! objects (each change gets the next resource version, as etcd's revision), [`FakeApi::expire`]
//! forces a 410 on every watch, [`FakeApi::set_down`] drops the listener and every open
//! connection until it is called again with `false`, [`FakeApi::set_status_fault`] makes
//! status writes slow or refused (a loaded or forbidding server) and
//! [`FakeApi::status_writes`] lists the ones that landed. The server runs on a runtime
//! and thread of its own and stops when the value is dropped.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;

/// The resources served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Res {
    /// `v1` Services (namespaced).
    Services,
    /// `discovery.k8s.io/v1` EndpointSlices (namespaced).
    EndpointSlices,
    /// `v1` Nodes (cluster-scoped).
    Nodes,
    /// `coordination.k8s.io/v1` Leases (namespaced): get, create, replace with the
    /// `resourceVersion` precondition (409 Conflict), as the real server.
    Leases,
    /// `strait.dev/v1alpha1` StraitAddressPools (cluster-scoped custom resources with a
    /// status subresource: writes of the object keep its status, and
    /// `metadata.generation` counts spec changes only).
    AddressPools,
    /// `v1` Namespaces (cluster-scoped).
    Namespaces,
}

impl Res {
    fn of_kind(kind: &str) -> Option<Self> {
        match kind {
            "Service" => Some(Res::Services),
            "EndpointSlice" => Some(Res::EndpointSlices),
            "Node" => Some(Res::Nodes),
            "Lease" => Some(Res::Leases),
            "StraitAddressPool" => Some(Res::AddressPools),
            "Namespace" => Some(Res::Namespaces),
            _ => None,
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Res::Services => "Service",
            Res::EndpointSlices => "EndpointSlice",
            Res::Nodes => "Node",
            Res::Leases => "Lease",
            Res::AddressPools => "StraitAddressPool",
            Res::Namespaces => "Namespace",
        }
    }

    fn api_version(self) -> &'static str {
        match self {
            Res::Services | Res::Nodes | Res::Namespaces => "v1",
            Res::EndpointSlices => "discovery.k8s.io/v1",
            Res::Leases => "coordination.k8s.io/v1",
            Res::AddressPools => "strait.dev/v1alpha1",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Res::Services => "services",
            Res::EndpointSlices => "endpointslices",
            Res::Nodes => "nodes",
            Res::Leases => "leases",
            Res::AddressPools => "straitaddresspools",
            Res::Namespaces => "namespaces",
        }
    }

    fn namespaced(self) -> bool {
        !matches!(self, Res::Nodes | Res::AddressPools | Res::Namespaces)
    }
}

/// What [`FakeApi::set_status_fault`] does to `PATCH .../services/{name}/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StatusFault {
    /// Answered at once.
    #[default]
    None,
    /// Held this long, then applied and answered (a loaded server: the write lands late).
    Delay(Duration),
    /// Refused with this code (403 Forbidden, 500, 503 ...), nothing stored.
    Refuse(u16),
}

/// One change in the history.
#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    res: Res,
    namespace: String,
    type_: &'static str,
    object: Value,
}

#[derive(Debug, Default)]
struct State {
    rv: u64,
    /// Watches from a version below this one get 410 Gone (etcd keeps the compaction
    /// revision itself).
    compacted: u64,
    /// Bumped by `expire`: running watches end with 410.
    epoch: u64,
    seq: u64,
    objects: BTreeMap<(Res, String, String), Value>,
    history: Vec<Change>,
    events: Vec<Value>,
    requests: Vec<String>,
    watching: BTreeMap<Res, usize>,
    /// Set by [`FakeApi::authorize`]: the bearer token and the rules it is granted.
    auth: Option<(String, Vec<Rule>)>,
    /// Requests refused with 401 or 403, as `METHOD path?query: why`.
    denied: Vec<String>,
    /// Next node port handed out by [`FakeApi::create`] (the API server's 30000-32767).
    node_port: u16,
    /// Next cluster IP handed out by [`FakeApi::create`].
    cluster_ip: u8,
    status_fault: StatusFault,
    /// Status writes applied, in order: `namespace/name` and the status after the write.
    status_writes: Vec<(String, Value)>,
    /// Status writes being held by a [`StatusFault::Delay`] now.
    status_held: usize,
}

/// One rule of a ClusterRole: `apiGroups`, `resources` (`services/status` for a
/// subresource), `verbs`; `*` matches anything.
#[derive(Debug, Clone)]
struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
}

impl Rule {
    fn allows(&self, group: &str, resource: &str, verb: &str) -> bool {
        let any = |v: &[String], x: &str| v.iter().any(|e| e == "*" || e == x);
        any(&self.groups, group) && any(&self.resources, resource) && any(&self.verbs, verb)
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Carries the latest resource version / epoch to wake watches.
    changed: tokio::sync::watch::Sender<u64>,
    up: tokio::sync::watch::Sender<bool>,
}

impl State {
    /// The next resource version: stamped on `obj` and recorded in the history as a
    /// `type_` change of `res` in `namespace`.
    fn record(&mut self, res: Res, namespace: String, type_: &'static str, obj: &mut Value) {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.history.push(Change {
            rv: self.rv,
            res,
            namespace,
            type_,
            object: obj.clone(),
        });
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wake(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }
}

/// The fake server; stops on drop.
#[derive(Debug)]
pub struct FakeApi {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeApi {
    /// Starts a server on a free port of 127.0.0.1.
    ///
    /// # Panics
    /// When no port can be bound or the runtime cannot start.
    pub fn start() -> Self {
        Self::start_in(None)
    }

    /// Starts a server on a free port of 127.0.0.1 of network namespace `netns` (a name
    /// under `/run/netns`, as `ip netns` makes them): the server's thread enters the
    /// namespace before it binds, so a gateway in that namespace reaches the server on its
    /// own loopback, and nothing of the server is reachable from anywhere else. Needs root.
    ///
    /// # Panics
    /// When the namespace cannot be entered, no port can be bound or the runtime cannot
    /// start.
    pub fn start_in_netns(netns: &str) -> Self {
        Self::start_in(Some(Path::new("/run/netns").join(netns)))
    }

    fn start_in(netns: Option<PathBuf>) -> Self {
        let (changed, _) = tokio::sync::watch::channel(0);
        let (up, _) = tokio::sync::watch::channel(true);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                rv: 100,
                ..State::default()
            }),
            changed,
            up,
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready, bound) = std::sync::mpsc::channel::<Result<SocketAddr, String>>();
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("fake-api".into())
            .spawn(move || {
                // setns(CLONE_NEWNET) moves this thread only; every socket it opens from
                // here on (the listener, and the listener again after `set_down`) lives
                // in that namespace.
                if let Some(path) = &netns {
                    let entered = std::fs::File::open(path)
                        .map_err(|e| format!("opening {}: {e}", path.display()))
                        .and_then(|f| {
                            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
                                .map_err(|e| format!("setns into {}: {e}", path.display()))
                        });
                    if let Err(e) = entered {
                        let _ = ready.send(Err(e));
                        return;
                    }
                }
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready.send(Err(format!("fake API runtime: {e}")));
                        return;
                    }
                };
                let first = match rt.block_on(bind(None)) {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = ready.send(Err(format!("fake API: binding 127.0.0.1: {e}")));
                        return;
                    }
                };
                let addr = match first.local_addr() {
                    Ok(a) => a,
                    Err(e) => {
                        let _ = ready.send(Err(format!("fake API address: {e}")));
                        return;
                    }
                };
                let _ = ready.send(Ok(addr));
                rt.block_on(async move {
                    tokio::select! {
                        _ = serve(s, addr, Some(first)) => {}
                        _ = stopped => {}
                    }
                });
                rt.shutdown_timeout(Duration::from_secs(1));
            })
            .expect("fake API thread");
        let addr = bound
            .recv()
            .unwrap_or_else(|_| Err("the fake API thread died".to_owned()))
            .unwrap_or_else(|e| panic!("{e}"));
        Self {
            shared,
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes a kubeconfig for this server (no authentication) into `dir`.
    ///
    /// # Panics
    /// When the file cannot be written.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             current-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            self.url()
        );
        std::fs::write(&path, text).expect("writing the kubeconfig");
        path
    }

    /// Creates or replaces an object (its `kind` says which resource). Sets
    /// `metadata.resourceVersion`, and on creation `uid` and `creationTimestamp` (one
    /// second after the previous creation, so age order is creation order).
    ///
    /// # Panics
    /// On an object of another kind or without a name.
    pub fn apply(&self, mut obj: Value) {
        let res = Res::of_kind(obj["kind"].as_str().unwrap_or("")).expect("a served kind");
        let name = obj["metadata"]["name"]
            .as_str()
            .expect("metadata.name")
            .to_owned();
        let ns = if res.namespaced() {
            obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_owned()
        } else {
            String::new()
        };
        obj["apiVersion"] = json!(res.api_version());
        if res.namespaced() {
            obj["metadata"]["namespace"] = json!(ns);
        }
        let mut st = self.shared.lock();
        let key = (res, ns.clone(), name);
        let type_ = match st.objects.get(&key) {
            Some(old) => {
                obj["metadata"]["uid"] = old["metadata"]["uid"].clone();
                obj["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
                if res == Res::AddressPools {
                    // With a status subresource, writes of the object keep its status, and
                    // the generation moves only when the spec changes.
                    match old.get("status") {
                        Some(st) => obj["status"] = st.clone(),
                        None => {
                            if let Some(m) = obj.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                    let g = old["metadata"]["generation"].as_i64().unwrap_or(1);
                    let g = if old["spec"] == obj["spec"] { g } else { g + 1 };
                    obj["metadata"]["generation"] = json!(g);
                }
                "MODIFIED"
            }
            None => {
                st.seq += 1;
                obj["metadata"]["uid"] = json!(format!("uid-{}", st.seq));
                obj["metadata"]["creationTimestamp"] = json!(timestamp(st.seq));
                if res == Res::AddressPools {
                    obj["metadata"]["generation"] = json!(1);
                }
                "ADDED"
            }
        };
        st.record(res, ns, type_, &mut obj);
        st.objects.insert(key, obj);
        drop(st);
        self.shared.wake();
    }

    /// Deletes an object (`namespace` is ignored for Nodes). Returns whether it existed.
    pub fn delete(&self, res: Res, namespace: &str, name: &str) -> bool {
        let ns = if res.namespaced() { namespace } else { "" };
        let mut st = self.shared.lock();
        let Some(mut obj) = st.objects.remove(&(res, ns.to_owned(), name.to_owned())) else {
            return false;
        };
        st.record(res, ns.to_owned(), "DELETED", &mut obj);
        drop(st);
        self.shared.wake();
        true
    }

    /// An object as stored.
    pub fn get(&self, res: Res, namespace: &str, name: &str) -> Option<Value> {
        let ns = if res.namespaced() { namespace } else { "" };
        self.shared
            .lock()
            .objects
            .get(&(res, ns.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Forces 410 Gone: every version up to now is compacted (a watch resuming from one
    /// gets an `ERROR` event), and running watches end with one.
    pub fn expire(&self) {
        let mut st = self.shared.lock();
        st.compacted = st.rv;
        st.epoch += 1;
        drop(st);
        self.shared.wake();
    }

    /// Takes the server down (listener closed, every connection dropped) or back up on the
    /// same port.
    pub fn set_down(&self, down: bool) {
        self.shared.up.send_replace(!down);
    }

    /// Events posted so far (both event APIs), as stored.
    pub fn events(&self) -> Vec<Value> {
        self.shared.lock().events.clone()
    }

    /// Drops every stored Event, as an API server's event TTL does: a later PATCH of one
    /// gets 404.
    pub fn expire_events(&self) {
        self.shared.lock().events.clear();
    }

    /// `METHOD path?query` of every request so far.
    pub fn requests(&self) -> Vec<String> {
        self.shared.lock().requests.clone()
    }

    /// Watches of `res` streaming now.
    pub fn watching(&self, res: Res) -> usize {
        self.shared.lock().watching.get(&res).copied().unwrap_or(0)
    }

    /// The current resource version.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv
    }

    /// Creates an object as the real API server does on `kubectl apply` of a manifest:
    /// a Service first gets the fields the server defaults and allocates (`clusterIP`,
    /// `ipFamilies` / `ipFamilyPolicy`, `sessionAffinity`, port `protocol` and
    /// `targetPort`, `nodePort`s for NodePort and LoadBalancer Services,
    /// `externalTrafficPolicy` and, under `Local`, a `healthCheckNodePort`), then it is
    /// stored as by [`FakeApi::apply`]. Other kinds are stored as they are.
    ///
    /// # Panics
    /// As [`FakeApi::apply`].
    pub fn create(&self, mut obj: Value) {
        if obj["kind"] == "Service" {
            let mut st = self.shared.lock();
            default_service(&mut st, &mut obj);
        }
        self.apply(obj);
    }

    /// From now on every request must carry `Authorization: Bearer {token}` (else 401)
    /// and be allowed by one of `cluster_role`'s rules (else 403), as the API server's
    /// RBAC authorizer decides for a ServiceAccount bound to that ClusterRole. `GET
    /// /version` stays open, as for `system:public-info-viewer`.
    ///
    /// # Panics
    /// When `cluster_role` has no `rules` array.
    pub fn authorize(&self, token: &str, cluster_role: &Value) {
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        let rules = cluster_role["rules"]
            .as_array()
            .expect("a ClusterRole with rules")
            .iter()
            .map(|r| Rule {
                groups: strings(&r["apiGroups"]),
                resources: strings(&r["resources"]),
                verbs: strings(&r["verbs"]),
            })
            .collect();
        self.shared.lock().auth = Some((token.to_owned(), rules));
    }

    /// From now on, status writes (`PATCH .../services/{name}/status`) are answered as
    /// `fault` says; [`StatusFault::None`] heals the server.
    pub fn set_status_fault(&self, fault: StatusFault) {
        self.shared.lock().status_fault = fault;
    }

    /// The status writes applied so far, in order: `namespace/name` and the Service's
    /// `status` after each.
    pub fn status_writes(&self) -> Vec<(String, Value)> {
        self.shared.lock().status_writes.clone()
    }

    /// Status writes held by a [`StatusFault::Delay`] right now (received, not answered).
    pub fn status_writes_held(&self) -> usize {
        self.shared.lock().status_held
    }

    /// Requests refused so far (401 or 403), as `METHOD path?query: why`.
    pub fn denied(&self) -> Vec<String> {
        self.shared.lock().denied.clone()
    }
}

/// The API server's defaulting and allocation for a Service being created.
fn default_service(st: &mut State, obj: &mut Value) {
    if st.node_port == 0 {
        st.node_port = 30000;
    }
    let spec = &mut obj["spec"];
    let ty = spec["type"].as_str().unwrap_or("ClusterIP").to_owned();
    spec["type"] = json!(ty);
    if ty == "ExternalName" {
        return;
    }
    if spec["clusterIP"].is_null() {
        st.cluster_ip = st.cluster_ip.wrapping_add(1).max(1);
        // Never routed anywhere in the tests; from the documentation range all the same.
        spec["clusterIP"] = json!(format!("192.0.2.{}", 128 + st.cluster_ip % 120));
        spec["clusterIPs"] = json!([spec["clusterIP"].clone()]);
    }
    if spec["ipFamilies"].is_null() {
        spec["ipFamilies"] = json!(["IPv4"]);
    }
    if spec["ipFamilyPolicy"].is_null() {
        spec["ipFamilyPolicy"] = json!("SingleStack");
    }
    if spec["sessionAffinity"].is_null() {
        spec["sessionAffinity"] = json!("None");
    }
    let external = ty == "NodePort" || ty == "LoadBalancer";
    let node_ports =
        ty == "NodePort" || spec["allocateLoadBalancerNodePorts"].as_bool() != Some(false);
    if let Some(ports) = spec["ports"].as_array_mut() {
        for p in ports {
            if p["protocol"].is_null() {
                p["protocol"] = json!("TCP");
            }
            if p["targetPort"].is_null() {
                p["targetPort"] = p["port"].clone();
            }
            if external && node_ports && p["nodePort"].is_null() {
                p["nodePort"] = json!(st.node_port);
                st.node_port += 1;
            }
        }
    }
    if external {
        if spec["externalTrafficPolicy"].is_null() {
            spec["externalTrafficPolicy"] = json!("Cluster");
        }
        if ty == "LoadBalancer"
            && spec["externalTrafficPolicy"] == "Local"
            && spec["healthCheckNodePort"].is_null()
        {
            spec["healthCheckNodePort"] = json!(st.node_port);
            st.node_port += 1;
        }
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `2024-01-01T00:00:00Z` plus `seq` seconds (RFC 3339, as the API writes it).
fn timestamp(seq: u64) -> String {
    let (h, m, s) = (seq / 3600, (seq / 60) % 60, seq % 60);
    format!("2024-01-01T{h:02}:{m:02}:{s:02}Z")
}

async fn bind(port: Option<u16>) -> io::Result<tokio::net::TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from(([127, 0, 0, 1], port.unwrap_or(0))))?;
    socket.listen(64)
}

/// Accepts connections while up; going down drops the listener and every connection.
async fn serve(shared: Arc<Shared>, addr: SocketAddr, first: Option<tokio::net::TcpListener>) {
    let mut up = shared.up.subscribe();
    let mut listener = first;
    loop {
        if !*up.borrow_and_update() {
            listener = None;
            if up.changed().await.is_err() {
                return;
            }
            continue;
        }
        let l = match listener.take() {
            Some(l) => l,
            None => match bind(Some(addr.port())).await {
                Ok(l) => l,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                r = l.accept() => {
                    if let Ok((stream, _)) = r {
                        conns.spawn(connection(Arc::clone(&shared), stream));
                    }
                }
                _ = up.changed() => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
        // Down (or the state was re-sent): drop everything and look again.
        conns.abort_all();
        drop(l);
    }
}

/// One parsed request.
#[derive(Debug)]
struct Request {
    method: String,
    path: String,
    query: BTreeMap<String, String>,
    body: Vec<u8>,
    authorization: Option<String>,
}

enum Answer {
    Json(u16, Value),
    Watch(Res, Option<String>, BTreeMap<String, String>),
}

async fn connection(shared: Arc<Shared>, stream: TcpStream) -> io::Result<()> {
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    loop {
        let mut line = String::new();
        if rd.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_owned();
        let target = parts.next().unwrap_or("").to_owned();
        let mut length = 0usize;
        let mut authorization = None;
        loop {
            let mut h = String::new();
            if rd.read_line(&mut h).await? == 0 {
                return Ok(());
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.trim().eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                } else if k.trim().eq_ignore_ascii_case("authorization") {
                    authorization = Some(v.trim().to_owned());
                }
            }
        }
        let mut body = vec![0; length];
        rd.read_exact(&mut body).await?;
        let (path, query) = match target.split_once('?') {
            Some((p, q)) => (p.to_owned(), parse_query(q)),
            None => (target.clone(), BTreeMap::new()),
        };
        shared.lock().requests.push(format!("{method} {target}"));
        let req = Request {
            method,
            path,
            query,
            body,
            authorization,
        };
        let is_status_write = req.method == "PATCH" && req.path.ends_with("/status");
        let fault = shared.lock().status_fault;
        let answer = match check_access(&shared, &req) {
            Some(refused) => refused,
            None if is_status_write => match fault {
                StatusFault::None => route(&shared, &req),
                StatusFault::Delay(d) => {
                    shared.lock().status_held += 1;
                    tokio::time::sleep(d).await;
                    shared.lock().status_held -= 1;
                    route(&shared, &req)
                }
                StatusFault::Refuse(code) => Answer::Json(
                    code,
                    status(
                        code,
                        reason(code),
                        "refused by the test (FakeApi::set_status_fault)",
                    ),
                ),
            },
            None => route(&shared, &req),
        };
        match answer {
            Answer::Json(code, v) => {
                let text = v.to_string();
                let head = format!(
                    "HTTP/1.1 {code} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    reason(code),
                    text.len()
                );
                wr.write_all(head.as_bytes()).await?;
                wr.write_all(text.as_bytes()).await?;
                wr.flush().await?;
            }
            Answer::Watch(res, ns, q) => {
                wr.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                      transfer-encoding: chunked\r\nconnection: close\r\n\r\n",
                )
                .await?;
                let _counted = Watching::new(&shared, res);
                watch(&shared, &mut wr, res, ns, &q).await?;
                wr.write_all(b"0\r\n\r\n").await?;
                wr.flush().await?;
                return Ok(());
            }
        }
    }
}

/// Counts a running watch until dropped (also when the connection task is aborted).
struct Watching<'a>(&'a Shared, Res);

impl<'a> Watching<'a> {
    fn new(shared: &'a Shared, res: Res) -> Self {
        *shared.lock().watching.entry(res).or_default() += 1;
        Self(shared, res)
    }
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.0.lock().watching.get_mut(&self.1) {
            *n = n.saturating_sub(1);
        }
    }
}

fn parse_query(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (k.to_owned(), unescape(v)),
            None => (p.to_owned(), String::new()),
        })
        .collect()
}

/// Percent-decoding of the few characters our queries carry.
fn unescape(s: &str) -> String {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => out.push(v),
                    Err(_) => out.extend_from_slice(&b[i..i + 3]),
                }
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        410 => "Gone",
        415 => "Unsupported Media Type",
        409 => "Conflict",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Bad Request",
    }
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

/// Splits `/api/v1/...` or `/apis/discovery.k8s.io/v1/...` into (resource, namespace,
/// rest after the resource).
fn resource_path(path: &str) -> Option<(Res, Option<String>, Vec<String>)> {
    let rest = path
        .strip_prefix("/api/v1/")
        .map(|r| (r, ""))
        .or_else(|| {
            path.strip_prefix("/apis/discovery.k8s.io/v1/")
                .map(|r| (r, "discovery.k8s.io"))
        })
        .or_else(|| {
            path.strip_prefix("/apis/coordination.k8s.io/v1/")
                .map(|r| (r, "coordination.k8s.io"))
        })
        .or_else(|| {
            path.strip_prefix("/apis/strait.dev/v1alpha1/")
                .map(|r| (r, "strait.dev"))
        });
    let (rest, group) = rest?;
    let mut seg: Vec<String> = rest.split('/').map(str::to_owned).collect();
    let mut ns = None;
    if seg.first().map(String::as_str) == Some("namespaces") && seg.len() >= 3 {
        ns = Some(seg[1].clone());
        seg.drain(..2);
    }
    let res = match (seg.first()?.as_str(), group) {
        ("services", "") => Res::Services,
        ("nodes", "") if ns.is_none() => Res::Nodes,
        ("namespaces", "") if ns.is_none() => Res::Namespaces,
        ("endpointslices", "discovery.k8s.io") => Res::EndpointSlices,
        ("leases", "coordination.k8s.io") if ns.is_some() => Res::Leases,
        ("straitaddresspools", "strait.dev") if ns.is_none() => Res::AddressPools,
        _ => return None,
    };
    seg.remove(0);
    Some((res, ns, seg))
}

/// (API group, resource or `resource/subresource`, verb) of a request, as RBAC sees it.
fn attributes(req: &Request) -> Option<(String, String, &'static str)> {
    let m = req.method.as_str();
    let verb_of = |collection: bool| match m {
        "GET"
            if collection
                && matches!(
                    req.query.get("watch").map(String::as_str),
                    Some("1" | "true")
                ) =>
        {
            Some("watch")
        }
        "GET" if collection => Some("list"),
        "GET" => Some("get"),
        "POST" => Some("create"),
        "PUT" => Some("update"),
        "PATCH" => Some("patch"),
        "DELETE" => Some("delete"),
        _ => None,
    };
    if events_path(&req.path).is_some() {
        let group = if req.path.starts_with("/apis/events.k8s.io/") {
            "events.k8s.io"
        } else {
            ""
        };
        let collection = req.path.ends_with("/events");
        return Some((group.to_owned(), "events".to_owned(), verb_of(collection)?));
    }
    let (res, _, rest) = resource_path(&req.path)?;
    let group = match res {
        Res::EndpointSlices => "discovery.k8s.io",
        Res::Leases => "coordination.k8s.io",
        Res::AddressPools => "strait.dev",
        _ => "",
    };
    let resource = match rest.as_slice() {
        [_, sub] => format!("{}/{sub}", res.plural()),
        _ => res.plural().to_owned(),
    };
    Some((group.to_owned(), resource, verb_of(rest.is_empty())?))
}

/// 401 or 403 when [`FakeApi::authorize`] is in force and the request is not allowed.
fn check_access(shared: &Shared, req: &Request) -> Option<Answer> {
    if req.path == "/version" {
        return None;
    }
    let mut st = shared.lock();
    let (token, rules) = st.auth.as_ref()?;
    let refused = if req.authorization.as_deref() != Some(&format!("Bearer {token}")) {
        Some((401, "Unauthorized", "no valid bearer token".to_owned()))
    } else {
        match attributes(req) {
            Some((g, r, v)) if rules.iter().any(|rule| rule.allows(&g, &r, v)) => None,
            Some((g, r, v)) => Some((
                403,
                "Forbidden",
                format!("{v} on {r} in API group {g:?} is not allowed"),
            )),
            None => Some((403, "Forbidden", "not a request RBAC allows".to_owned())),
        }
    };
    let (code, reason, why) = refused?;
    let line = format!(
        "{} {}{}: {why}",
        req.method,
        req.path,
        if req.query.is_empty() { "" } else { "?.." }
    );
    st.denied.push(line);
    Some(Answer::Json(code, status(code, reason, &why)))
}

fn route(shared: &Shared, req: &Request) -> Answer {
    let m = req.method.as_str();
    if req.path == "/version" && m == "GET" {
        return Answer::Json(
            200,
            json!({
                "major": "1", "minor": "35", "gitVersion": "v1.35.0-fake",
                "gitCommit": "0000000", "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25",
                "compiler": "gc", "platform": "linux/amd64"
            }),
        );
    }
    if let Some(ns) = events_path(&req.path) {
        return event(shared, m, ns, req);
    }
    let Some((res, ns, rest)) = resource_path(&req.path) else {
        return Answer::Json(
            404,
            status(404, "NotFound", &format!("no route for {}", req.path)),
        );
    };
    let watching = matches!(
        req.query.get("watch").map(String::as_str),
        Some("1" | "true")
    );
    match (m, rest.as_slice()) {
        ("GET", []) if watching => Answer::Watch(res, ns, req.query.clone()),
        ("GET", []) => list(shared, res, ns.as_deref(), &req.query),
        ("GET", [name]) => {
            match shared
                .lock()
                .objects
                .get(&(res, ns.clone().unwrap_or_default(), name.clone()))
            {
                Some(o) => Answer::Json(200, o.clone()),
                None => Answer::Json(404, not_found(res, name)),
            }
        }
        ("PATCH", [name, sub])
            if sub == "status" && matches!(res, Res::Services | Res::AddressPools) =>
        {
            patch_status(shared, res, ns.unwrap_or_default(), name, &req.body)
        }
        ("POST", []) if res == Res::Leases => {
            create_lease(shared, ns.unwrap_or_default(), &req.body)
        }
        ("PUT", [name]) if res == Res::Leases => {
            replace_lease(shared, ns.unwrap_or_default(), name, &req.body)
        }
        _ => Answer::Json(
            405,
            status(405, "MethodNotAllowed", "not supported by the fake"),
        ),
    }
}

fn not_found(res: Res, name: &str) -> Value {
    let mut s = status(
        404,
        "NotFound",
        &format!("{} \"{name}\" not found", res.plural()),
    );
    s["details"] = json!({ "name": name, "kind": res.plural() });
    s
}

fn list(shared: &Shared, res: Res, ns: Option<&str>, q: &BTreeMap<String, String>) -> Answer {
    let st = shared.lock();
    let items: Vec<Value> = st
        .objects
        .iter()
        .filter(|((r, n, _), _)| *r == res && ns.is_none_or(|ns| ns == n))
        .map(|(_, o)| {
            // Items of a real list carry no kind / apiVersion.
            let mut o = o.clone();
            if let Some(m) = o.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            o
        })
        .collect();
    let start: usize = q.get("continue").and_then(|c| c.parse().ok()).unwrap_or(0);
    let limit: usize = q
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|&l| l > 0)
        .unwrap_or(usize::MAX);
    let end = start.saturating_add(limit).min(items.len());
    let page: Vec<Value> = items.get(start.min(end)..end).unwrap_or(&[]).to_vec();
    let mut metadata = json!({ "resourceVersion": st.rv.to_string() });
    if end < items.len() {
        metadata["continue"] = json!(end.to_string());
    }
    Answer::Json(
        200,
        json!({
            "kind": format!("{}List", res.kind()),
            "apiVersion": res.api_version(),
            "metadata": metadata,
            "items": page,
        }),
    )
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn patch_status(shared: &Shared, res: Res, ns: String, name: &str, body: &[u8]) -> Answer {
    let Ok(patch) = serde_json::from_slice::<Value>(body) else {
        return Answer::Json(400, status(400, "BadRequest", "body is not JSON"));
    };
    let mut st = shared.lock();
    let key = (res, ns.clone(), name.to_owned());
    let Some(mut obj) = st.objects.get(&key).cloned() else {
        return Answer::Json(404, not_found(res, name));
    };
    // The status subresource changes status only.
    if let Some(s) = patch.get("status") {
        merge(&mut obj["status"], s);
    }
    st.record(res, ns.clone(), "MODIFIED", &mut obj);
    st.objects.insert(key, obj.clone());
    st.status_writes
        .push((format!("{ns}/{name}"), obj["status"].clone()));
    drop(st);
    shared.wake();
    Answer::Json(200, obj)
}

/// `POST .../leases`: 409 AlreadyExists when the name is taken.
fn create_lease(shared: &Shared, ns: String, body: &[u8]) -> Answer {
    let Ok(mut obj) = serde_json::from_slice::<Value>(body) else {
        return Answer::Json(400, status(400, "BadRequest", "body is not JSON"));
    };
    let Some(name) = obj["metadata"]["name"].as_str().map(str::to_owned) else {
        return Answer::Json(422, status(422, "Invalid", "metadata.name is required"));
    };
    let mut st = shared.lock();
    let key = (Res::Leases, ns.clone(), name.clone());
    if st.objects.contains_key(&key) {
        return Answer::Json(
            409,
            status(
                409,
                "AlreadyExists",
                &format!("leases \"{name}\" already exists"),
            ),
        );
    }
    obj["apiVersion"] = json!(Res::Leases.api_version());
    obj["kind"] = json!("Lease");
    obj["metadata"]["namespace"] = json!(ns);
    st.record(Res::Leases, ns, "ADDED", &mut obj);
    st.objects.insert(key, obj.clone());
    drop(st);
    shared.wake();
    Answer::Json(201, obj)
}

/// `PUT .../leases/{name}`: the body's `metadata.resourceVersion` must be the stored one
/// (409 Conflict otherwise), as optimistic concurrency on the real server.
fn replace_lease(shared: &Shared, ns: String, name: &str, body: &[u8]) -> Answer {
    let Ok(mut obj) = serde_json::from_slice::<Value>(body) else {
        return Answer::Json(400, status(400, "BadRequest", "body is not JSON"));
    };
    let mut st = shared.lock();
    let key = (Res::Leases, ns.clone(), name.to_owned());
    let Some(old) = st.objects.get(&key) else {
        return Answer::Json(404, not_found(Res::Leases, name));
    };
    if obj["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
        return Answer::Json(
            409,
            status(
                409,
                "Conflict",
                &format!("Operation cannot be fulfilled on leases.coordination.k8s.io \"{name}\": the object has been modified; please apply your changes to the latest version and try again"),
            ),
        );
    }
    obj["apiVersion"] = json!(Res::Leases.api_version());
    obj["kind"] = json!("Lease");
    st.record(Res::Leases, ns, "MODIFIED", &mut obj);
    st.objects.insert(key, obj.clone());
    drop(st);
    shared.wake();
    Answer::Json(200, obj)
}

/// `.../namespaces/{ns}/events[/name]` of either event API -> the namespace.
fn events_path(path: &str) -> Option<&str> {
    let rest = path
        .strip_prefix("/apis/events.k8s.io/v1/namespaces/")
        .or_else(|| path.strip_prefix("/api/v1/namespaces/"))?;
    let (ns, rest) = rest.split_once('/')?;
    (rest == "events" || rest.starts_with("events/")).then_some(ns)
}

fn event(shared: &Shared, method: &str, ns: &str, req: &Request) -> Answer {
    let Ok(mut body) = serde_json::from_slice::<Value>(&req.body) else {
        return Answer::Json(400, status(400, "BadRequest", "body is not JSON"));
    };
    let mut st = shared.lock();
    st.rv += 1;
    let rv = st.rv.to_string();
    match method {
        "POST" => {
            body["metadata"]["namespace"] = json!(ns);
            body["metadata"]["resourceVersion"] = json!(rv);
            st.events.push(body.clone());
            Answer::Json(201, body)
        }
        "PATCH" => {
            let name = req.path.rsplit('/').next().unwrap_or("");
            let found = st
                .events
                .iter_mut()
                .find(|e| e["metadata"]["name"].as_str() == Some(name));
            match found {
                Some(e) => {
                    merge(e, &body);
                    e["metadata"]["resourceVersion"] = json!(rv);
                    Answer::Json(200, e.clone())
                }
                None => Answer::Json(404, status(404, "NotFound", "event not found")),
            }
        }
        _ => Answer::Json(
            405,
            status(405, "MethodNotAllowed", "events: POST or PATCH"),
        ),
    }
}

async fn chunk<W: AsyncWriteExt + Unpin>(wr: &mut W, v: &Value) -> io::Result<()> {
    let line = format!("{v}\n");
    wr.write_all(format!("{:x}\r\n{line}\r\n", line.len()).as_bytes())
        .await?;
    wr.flush().await
}

/// Streams watch events until the timeout, a forced 410, or the connection drops.
async fn watch<W: AsyncWriteExt + Unpin>(
    shared: &Shared,
    wr: &mut W,
    res: Res,
    ns: Option<String>,
    q: &BTreeMap<String, String>,
) -> io::Result<()> {
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .unwrap_or(290u64);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    let bookmarks = q.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    let mut changed = shared.changed.subscribe();
    let requested = q.get("resourceVersion").cloned().unwrap_or_default();
    let (mut last, epoch, gone, initial) = {
        let st = shared.lock();
        let mut initial = Vec::new();
        let last = match requested.parse::<u64>() {
            Ok(rv) if rv != 0 => rv,
            // No version (or "0"): the current state as ADDED events first.
            _ => {
                for ((r, n, _), o) in &st.objects {
                    if *r == res && ns.as_deref().is_none_or(|ns| ns == n) {
                        initial.push(json!({ "type": "ADDED", "object": o }));
                    }
                }
                st.rv
            }
        };
        (last, st.epoch, last < st.compacted, initial)
    };
    if gone {
        return chunk(wr, &expired(last)).await;
    }
    for e in initial {
        chunk(wr, &e).await?;
    }
    let mut next_bookmark = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        let (out, gone, rv) = {
            let st = shared.lock();
            let out: Vec<Value> = st
                .history
                .iter()
                .filter(|c| {
                    c.rv > last && c.res == res && ns.as_deref().is_none_or(|ns| ns == c.namespace)
                })
                .map(|c| {
                    let mut o = c.object.clone();
                    o["kind"] = json!(res.kind());
                    json!({ "type": c.type_, "object": o })
                })
                .collect();
            (out, st.epoch != epoch, st.rv)
        };
        if gone {
            chunk(wr, &expired(last)).await?;
            return Ok(());
        }
        for e in &out {
            chunk(wr, e).await?;
        }
        last = rv;
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(());
        }
        if bookmarks && now >= next_bookmark {
            chunk(
                wr,
                &json!({
                    "type": "BOOKMARK",
                    "object": {
                        "kind": res.kind(),
                        "apiVersion": res.api_version(),
                        "metadata": { "resourceVersion": rv.to_string() }
                    }
                }),
            )
            .await?;
            next_bookmark = now + Duration::from_secs(1);
        }
        tokio::select! {
            r = changed.changed() => if r.is_err() { return Ok(()) },
            _ = tokio::time::sleep_until(next_bookmark.min(deadline)) => {}
        }
    }
}

fn expired(rv: u64) -> Value {
    json!({
        "type": "ERROR",
        "object": status(410, "Expired", &format!("too old resource version: {rv}")),
    })
}
