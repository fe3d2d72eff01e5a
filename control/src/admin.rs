//! The admin and metrics HTTP endpoint (default `127.0.0.1:9900`).
//!
//! | request | answer |
//! |---|---|
//! | `GET /healthz` | `200 ok` once the workers forward and the VIPs are announced, `503` before |
//! | `GET /services` | every service and backend with weight, state and health, as JSON |
//! | `GET /metrics` | Prometheus text format: per-core packets, drops by reason, flow table, new flows per backend, backend health, snapshot generation |
//! | `GET /routes` | every VIP's route (announced, or why not), whether the gateway drains, the BGP sessions, as JSON |
//! | `GET /explain?client=ADDR:PORT&vip=ADDR:PORT&proto=tcp` | where that flow goes and why: frontend, source ranges, flow entry or Maglev choice, rewrite, as JSON ([`crate::explain`]) |
//! | `POST /reload` | re-reads the configuration file and swaps the table in atomically (loopback listener only; 403 elsewhere) |
//! | `POST /drain` | withdraws every route, forwards for `drain_grace`, then stops the gateway (loopback listener only) |
//! | `POST /capture?FILTER` | arms a capture in the workers and streams it as pcapng until its `count` or `duration`, or the client leaves (taken as `POST /reload` is; see [`crate::capture`]) |
//!
//! A small HTTP/1.1 server on a thread of its own, with a current-thread tokio runtime: each
//! connection is a task, so a thousand idle or slow clients cost a thousand small buffers and
//! never keep `/healthz` from answering; each has [`DEADLINE`] to send at most
//! [`MAX_REQUEST`] bytes of request, and a malformed request is answered 400. `POST /reload`
//! and `POST /drain` are taken only when the endpoint listens on loopback.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, PoisonError};
use std::thread;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use serde_json::json;
use strait_config::model::{BackendState, MacAddr};
use strait_dataplane::stats::DropReason;

use crate::core::BackendKey;
use crate::metrics::{counter, gauge};
use crate::shared::Shared;

/// Where the control loop answers a request: a message, or why it refused.
pub type Answer = Sender<Result<String, String>>;

/// What the API asks of the control loop.
#[derive(Debug)]
pub enum Request {
    /// Re-read the configuration file.
    Reload(Answer),
    /// Withdraw every route, forward for the drain grace, then stop.
    Drain(Answer),
}

/// Longest a client may take to send its whole request and to take the answer: an idle or
/// slow connection is closed after it, so it holds nothing for long.
const DEADLINE: Duration = Duration::from_secs(5);

/// Largest request (request line and headers) taken; a larger one is answered 431. No
/// request here needs more than a few hundred bytes.
const MAX_REQUEST: usize = 8 * 1024;

/// Connections served at once; a connection beyond them is answered 503 at once and closed.
/// Each costs a task and its buffer, not a thread, so the bound is far above what the
/// endpoint's users (a scraper, an orchestrator, an operator) open, and well below the
/// process's file limit.
const MAX_CONNECTIONS: usize = 4096;

/// Connections the kernel queues for the endpoint before it accepts them (capped by
/// `net.core.somaxconn`, 4096 by default). The standard library's 128 overflows when a
/// thousand clients connect at once: the kernel drops the SYNs beyond it, and each of those
/// clients, `/healthz` probes among them, waits a second for its SYN's retransmission.
const BACKLOG: i32 = MAX_CONNECTIONS as i32;

/// A non-blocking TCP listener on `addr` with [`BACKLOG`].
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(BACKLOG)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// A non-blocking Unix stream listener at `path` with [`BACKLOG`].
fn listen_unix(path: &std::path::Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    use socket2::{Domain, SockAddr, Socket, Type};
    let s = Socket::new(Domain::UNIX, Type::STREAM, None)?;
    s.bind(&SockAddr::unix(path)?)?;
    s.listen(BACKLOG)?;
    s.set_nonblocking(true)?;
    Ok(std::os::unix::net::UnixListener::from(
        std::os::fd::OwnedFd::from(s),
    ))
}

/// Where the endpoint listens, and who may change things.
#[derive(Debug, Clone)]
pub struct Options {
    /// The TCP listener (`gateway.admin_listen`).
    pub listen: SocketAddr,
    /// A Unix socket listener too (`gateway.admin_socket`), created mode 0600.
    pub socket: Option<std::path::PathBuf>,
    /// The token that lets a non-loopback TCP client make mutating requests
    /// (`gateway.admin_token_file`'s content).
    pub token: Option<String>,
}

/// Starts the endpoint on `addr` (TCP only, no token).
///
/// # Errors
/// When the address cannot be bound (in use, not local).
pub fn start(
    addr: SocketAddr,
    shared: Arc<Shared>,
    requests: Sender<Request>,
) -> anyhow::Result<SocketAddr> {
    let opts = Options {
        listen: addr,
        socket: None,
        token: None,
    };
    start_with(&opts, shared, requests)
}

/// Starts the endpoint as `opts` says; the TCP listener's address.
///
/// # Errors
/// When an address cannot be bound (in use, not local, a directory missing).
pub fn start_with(
    opts: &Options,
    shared: Arc<Shared>,
    requests: Sender<Request>,
) -> anyhow::Result<SocketAddr> {
    let addr = opts.listen;
    let listener = listen(addr).map_err(|e| anyhow::anyhow!("admin API: bind {addr}: {e}"))?;
    let local = listener.local_addr()?;
    let unix = match &opts.socket {
        None => None,
        Some(path) => {
            use std::os::unix::fs::PermissionsExt as _;
            // A socket file left by a killed run would refuse the bind.
            let _ = std::fs::remove_file(path);
            let l = listen_unix(path)
                .map_err(|e| anyhow::anyhow!("admin API: bind {}: {e}", path.display()))?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            Some(l)
        }
    };
    let mut registry = Registry::with_prefix("strait");
    registry.register_collector(Box::new(Metrics(Arc::clone(&shared))));
    registry.register_collector(Box::new(KubeMetrics(Arc::clone(&shared))));
    registry.register_collector(Box::new(RouteMetrics(Arc::clone(&shared))));
    registry.register_collector(Box::new(crate::traffic::TrafficMetrics(Arc::clone(
        &shared,
    ))));
    registry.register_collector(Box::new(crate::capture::Metrics(Arc::clone(&shared))));
    registry.register_collector(Box::new(crate::cores::Heartbeats::new(
        shared.cores.clone(),
    )));
    let endpoint = Arc::new(Endpoint {
        shared,
        registry,
        requests,
        token: opts.token.clone(),
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    let trusted_tcp = mutating_allowed(local);
    thread::Builder::new().name("admin".into()).spawn(move || {
        runtime.block_on(async move {
            let open = Arc::new(AtomicUsize::new(0));
            let tcp = tokio::net::TcpListener::from_std(listener).map(Listener::Tcp);
            let tcp = accept(tcp, Arc::clone(&endpoint), trusted_tcp, Arc::clone(&open));
            match unix {
                // The Unix socket is mode 0600: whoever reaches it is root, so mutating
                // requests are taken there.
                Some(u) => {
                    let u = tokio::net::UnixListener::from_std(u).map(Listener::Unix);
                    tokio::join!(tcp, accept(u, endpoint, true, open));
                }
                None => tcp.await,
            }
        });
    })?;
    Ok(local)
}

/// Whether mutating requests are taken from anyone on a TCP listener at `local`: only on
/// loopback, where only this machine reaches it. Elsewhere they need the token, or the
/// Unix socket, or a signal (SIGHUP, SIGTERM).
fn mutating_allowed(local: SocketAddr) -> bool {
    local.ip().is_loopback()
}

/// What every connection's task reads.
struct Endpoint {
    shared: Arc<Shared>,
    registry: Registry,
    requests: Sender<Request>,
    token: Option<String>,
}

impl Endpoint {
    /// Whether a request that presented `bearer` may change things, on a listener that is
    /// `trusted` or not.
    fn allows(&self, trusted: bool, bearer: Option<&str>) -> bool {
        trusted
            || matches!((&self.token, bearer), (Some(t), Some(b)) if same(t.as_bytes(), b.as_bytes()))
    }
}

/// Compares two secrets in time that depends on their lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// A listener of the endpoint.
enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

/// Takes connections, each on a task of its own, so that idle or slow clients never keep
/// `/healthz` from answering; `trusted` says whether mutating requests are taken without
/// the token.
async fn accept(
    listener: std::io::Result<Listener>,
    endpoint: Arc<Endpoint>,
    trusted: bool,
    open: Arc<AtomicUsize>,
) {
    let listener = match listener {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("admin API: {e}");
            return;
        }
    };
    loop {
        let taken = match &listener {
            Listener::Tcp(l) => l
                .accept()
                .await
                .map(|(conn, _)| take(conn, &endpoint, trusted, &open)),
            Listener::Unix(l) => l
                .accept()
                .await
                .map(|(conn, _)| take(conn, &endpoint, trusted, &open)),
        };
        if let Err(e) = taken {
            back_off(&e).await;
        }
    }
}

/// Out of file descriptors, most likely: back off rather than spin.
async fn back_off(e: &std::io::Error) {
    tracing::warn!("admin API: accept: {e}");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Serves `conn` on a task of its own, or answers 503 beyond [`MAX_CONNECTIONS`].
fn take<S>(conn: S, endpoint: &Arc<Endpoint>, trusted: bool, open: &Arc<AtomicUsize>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    if open.fetch_add(1, Ordering::Relaxed) >= MAX_CONNECTIONS {
        open.fetch_sub(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let mut conn = conn;
            let _ = tokio::time::timeout(
                DEADLINE,
                conn.write_all(&response(503, "text/plain", "busy\n")),
            )
            .await;
        });
        return;
    }
    let (endpoint, open) = (Arc::clone(endpoint), Arc::clone(open));
    tokio::spawn(async move {
        let _ = serve(conn, endpoint, trusted).await;
        open.fetch_sub(1, Ordering::Relaxed);
    });
}

/// Reads one request within [`DEADLINE`] and [`MAX_REQUEST`] bytes, answers it, closes.
async fn serve<S>(mut conn: S, endpoint: Arc<Endpoint>, trusted: bool) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let answer = match tokio::time::timeout(DEADLINE, read_request(&mut conn)).await {
        Err(_) => response(408, "text/plain", "request timeout\n"),
        Ok(Err(e)) => return Err(e),
        Ok(Ok(Err(status))) => response(status, "text/plain", "bad request\n"),
        Ok(Ok(Ok(req))) if crate::capture::wants(&req.path) => {
            // A capture streams until it ends: the connection is the capture's.
            let allowed = endpoint.allows(trusted, req.bearer.as_deref());
            let shared = Arc::clone(&endpoint.shared);
            return crate::capture::serve(conn, shared, &req.method, &req.path, allowed, DEADLINE)
                .await;
        }
        Ok(Ok(Ok(req))) => {
            let allowed = endpoint.allows(trusted, req.bearer.as_deref());
            if req.method == "POST" || req.path.starts_with("/explain") {
                // A reload waits for the control loop, an explanation for the workers: off
                // the task's thread.
                tokio::task::spawn_blocking(move || {
                    let (status, ctype, body) = answer(&endpoint, &req.method, &req.path, allowed);
                    response(status, ctype, &body)
                })
                .await
                .unwrap_or_else(|_| response(500, "text/plain", "internal error\n"))
            } else {
                let (status, ctype, body) = answer(&endpoint, &req.method, &req.path, allowed);
                response(status, ctype, &body)
            }
        }
    };
    tokio::time::timeout(DEADLINE, conn.write_all(&answer))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    conn.shutdown().await
}

/// A request's line and the token it presented.
struct Req {
    method: String,
    path: String,
    /// `Authorization: Bearer TOKEN`'s token.
    bearer: Option<String>,
}

/// The method, path and token of a request, once its headers have ended; or the status of
/// a refusal: 431 for more than [`MAX_REQUEST`] bytes, 400 for a request line that is not
/// `METHOD PATH HTTP/1.x`. Of the headers only `Authorization: Bearer` is read; no request
/// here has a body that matters.
async fn read_request<S>(conn: &mut S) -> std::io::Result<Result<Req, u16>>
where
    S: AsyncRead + Unpin,
{
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let end = loop {
        if let Some(i) = find_end(&buf) {
            break i;
        }
        if buf.len() > MAX_REQUEST {
            return Ok(Err(431));
        }
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    if end > MAX_REQUEST {
        return Ok(Err(431));
    }
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut lines = head.lines();
    let line = lines.next().unwrap_or("");
    let bearer = lines.find_map(|l| {
        let (name, value) = l.split_once(':')?;
        if !name.trim().eq_ignore_ascii_case("authorization") {
            return None;
        }
        let value = value.trim();
        value
            .get(..7)
            .filter(|s| s.eq_ignore_ascii_case("bearer "))
            .map(|_| value[7..].trim().to_owned())
    });
    let mut parts = line.split_whitespace();
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(method), Some(path), Some(version), None) if version.starts_with("HTTP/1.") => {
            Ok(Ok(Req {
                method: method.to_owned(),
                path: path.to_owned(),
                bearer,
            }))
        }
        _ => Ok(Err(400)),
    }
}

/// Where the headers of `buf` end (the blank line), if they do.
fn find_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .or_else(|| buf.windows(2).position(|w| w == b"\n\n"))
}

/// The answer to `method path`, from a client `allowed` to change things or not: status,
/// content type, body.
fn answer(
    endpoint: &Endpoint,
    method: &str,
    path: &str,
    allowed: bool,
) -> (u16, &'static str, String) {
    let shared = &endpoint.shared;
    match (method, path) {
        ("GET", "/healthz") if shared.draining.load(Ordering::Relaxed) => {
            (503, "text/plain", "draining\n".to_string())
        }
        ("GET", "/healthz") if shared.ready.load(Ordering::Relaxed) => {
            (200, "text/plain", "ok\n".to_string())
        }
        ("GET", "/healthz") => (503, "text/plain", "starting\n".to_string()),
        ("GET", "/services") => (200, "application/json", services_json(shared)),
        ("GET", "/metrics") => {
            let mut out = String::new();
            match prometheus_client::encoding::text::encode(&mut out, &endpoint.registry) {
                Ok(()) => (
                    200,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    out,
                ),
                Err(e) => (500, "text/plain", format!("encoding metrics: {e}\n")),
            }
        }
        ("GET", "/routes") => (200, "application/json", routes_json(shared)),
        ("GET", "/traffic") => (200, "application/json", crate::traffic::json(shared)),
        ("GET", p) if p == "/explain" || p.starts_with("/explain?") => {
            crate::explain::http(shared, p.split_once('?').map_or("", |(_, q)| q))
        }
        ("POST", "/reload") if !allowed => (
            403,
            "text/plain",
            "POST /reload is taken on a loopback admin_listen, the admin_socket, or with the admin token (Authorization: Bearer); or send SIGHUP\n".into(),
        ),
        ("POST", "/drain") if !allowed => (
            403,
            "text/plain",
            "POST /drain is taken on a loopback admin_listen, the admin_socket, or with the admin token (Authorization: Bearer); or send SIGTERM\n".into(),
        ),
        ("POST", "/reload") => ask(endpoint, Request::Reload),
        ("POST", "/drain") => ask(endpoint, Request::Drain),
        (
            _,
            "/healthz" | "/services" | "/metrics" | "/routes" | "/traffic" | "/explain"
            | "/reload" | "/drain",
        ) => {
            (405, "text/plain", "method not allowed\n".into())
        }
        _ => (
            404,
            "text/plain",
            "not found: try /healthz, /services, /routes, /traffic, /metrics, /explain, POST /reload, POST /drain\n"
                .into(),
        ),
    }
}

/// Hands the control loop a request and waits for its answer.
fn ask(endpoint: &Endpoint, request: fn(Answer) -> Request) -> (u16, &'static str, String) {
    let (tx, rx) = mpsc::channel();
    let answer = endpoint
        .requests
        .send(request(tx))
        .ok()
        .and_then(|()| rx.recv_timeout(Duration::from_secs(30)).ok())
        .unwrap_or_else(|| Err("the control loop did not answer".into()));
    match answer {
        Ok(m) => (200, "text/plain", m + "\n"),
        Err(m) => (400, "text/plain", m + "\n"),
    }
}

/// `/routes`: each VIP's route, the drain state and the BGP speaker's sessions.
pub fn routes_json(shared: &Shared) -> String {
    let routes = shared.routes();
    let bgp = shared.bgp();
    let vips: Vec<_> = routes
        .iter()
        .map(|(vip, r)| json!({ "vip": vip.to_string(), "route": r.as_str() }))
        .collect();
    let bgp = bgp.map(|b| {
        json!({
            "running": b.running,
            "error": b.error,
            "announced": b.announced,
            "restarts": b.restarts,
            "sessions": b.sessions.iter().map(|s| json!({
                "peer": s.peer.to_string(),
                "asn": s.asn,
                "up": s.up,
                "state": s.state,
            })).collect::<Vec<_>>(),
        })
    });
    let l2 = shared.l2().map(|l| {
        json!({
            "running": l.running,
            "error": l.error,
            "vips": l.vips,
            "owned": l.owned.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "restarts": l.restarts,
        })
    });
    let v = json!({
        "draining": shared.draining.load(Ordering::Relaxed),
        "bgp": bgp,
        "l2": l2,
        "vips": vips,
    });
    serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
}

/// A whole HTTP/1.1 response that closes the connection.
fn response(status: u16, ctype: &str, body: &str) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    };
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Why a backend takes no new flows for its health, as `/services` shows it: `null` when
/// it takes them, else `by` (`active`: its check fell; `passive`: the gateway saw it refuse
/// or leave unanswered new connections, nat mode), `cause` (the check's failure: refused,
/// timeout, HTTP status N...; or passive health's: refused, unanswered), `detail` and
/// `since` (RFC 3339). A backend out both ways shows its active check's fall.
fn out_json(h: Option<&crate::health::State>) -> serde_json::Value {
    let Some(h) = h else {
        return serde_json::Value::Null;
    };
    if !h.up {
        let fall = h
            .history
            .iter()
            .rev()
            .find(|t| !t.up && !t.cause.starts_with("passive"));
        return json!({
            "by": "active",
            "cause": fall.map_or("", |t| t.cause.as_str()),
            "detail": h.last_error.clone().unwrap_or_default(),
            "since": fall.map(|t| humantime::format_rfc3339_seconds(t.at).to_string()),
        });
    }
    match &h.passive {
        Some(p) => json!({
            "by": "passive",
            "cause": p.cause,
            "detail": p.detail,
            "since": humantime::format_rfc3339_seconds(p.at).to_string(),
        }),
        None => serde_json::Value::Null,
    }
}

/// `/services`: the configuration's view, with health from the checker and the table's
/// traffic state.
pub fn services_json(shared: &Shared) -> String {
    let cfg = shared.config();
    let table = shared.table.load();
    let health = shared
        .health
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    // The next-hop MAC each backend is sent to, from the live table (filled from the
    // kernel's neighbour table when the configuration gives none), by service and then by
    // (address, port): one pass over the table's backends.
    let mut macs = std::collections::HashMap::with_capacity(table.backends.len());
    // And the weight of each backend taking new flows, which is less than its configured
    // weight while it ramps (slow start).
    let mut weights = std::collections::HashMap::new();
    for s in &table.services {
        for b in s.backends.iter().filter_map(|&id| table.backend(id)) {
            if let Some(mac) = b.mac_addr() {
                macs.insert((s.name.as_str(), b.socket_addr()), mac);
            }
            if b.health == strait_dataplane::table::Health::Up {
                weights.insert((s.name.as_str(), b.socket_addr()), b.weight);
            }
        }
    }
    let next_hop_mac = |service: &str, addr: std::net::IpAddr, port: u16| -> Option<String> {
        // The table's addresses are canonical (an IPv4-mapped one is IPv4).
        let key = (service, SocketAddr::new(addr.to_canonical(), port));
        macs.get(&key).map(MacAddr::to_string)
    };
    let services: Vec<_> = cfg
        .services
        .iter()
        .map(|s| {
            let backends: Vec<_> = s
                .backends
                .iter()
                .map(|b| {
                    let h = health.get(&BackendKey::new(s.name.clone(), b.address, b.port));
                    let state = match (b.state, b.weight) {
                        (BackendState::Draining, _) | (_, 0) => "draining",
                        _ => "active",
                    };
                    let key = (s.name.as_str(), SocketAddr::new(b.address.to_canonical(), b.port));
                    let ramping = weights.get(&key).filter(|&&w| w < b.weight);
                    json!({
                        "address": b.address.to_string(),
                        "port": b.port,
                        "weight": b.weight,
                        "slow_start_weight": ramping,
                        "state": state,
                        "health": match h { None => "unchecked", Some(h) if h.up => "up", Some(_) => "down" },
                        "out": out_json(h),
                        "last_error": h.and_then(|h| h.last_error.clone()),
                        "transitions": h.map_or_else(Vec::new, |h| h.history.iter().map(|t| t.to_json()).collect()),
                        "next_hop_mac": next_hop_mac(&s.name, b.address, b.port),
                    })
                })
                .collect();
            let healthy = s.backends.is_empty()
                || s.backends.iter().any(|b| health.get(&BackendKey::new(s.name.clone(), b.address, b.port)).is_none_or(|h| h.up && h.passive.is_none()));
            json!({
                "name": s.name,
                "vip": s.vip.to_string(),
                "port": s.port,
                "protocol": s.protocol.as_str(),
                "mode": s.mode.as_str(),
                "healthy": healthy && !s.backends.is_empty(),
                "backends": backends,
            })
        })
        .collect();
    let v = json!({ "generation": table.generation, "services": services });
    serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
}

/// Reads the shared state on each scrape.
#[derive(Debug)]
struct Metrics(Arc<Shared>);

/// The Kubernetes source's numbers (`strait_kube_*`), looked up on each scrape: `run`
/// starts the source after this endpoint, so they cannot be registered at start.
#[derive(Debug)]
struct KubeMetrics(Arc<Shared>);

/// Routes and the BGP speaker (`strait_vip_route`, `strait_bgp_*`), read on each scrape.
#[derive(Debug)]
struct RouteMetrics(Arc<Shared>);

impl Collector for RouteMetrics {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let shared = &self.0;
        let routes = shared.routes();
        let per_vip: Vec<_> = routes
            .iter()
            .map(|(vip, r)| {
                (
                    vec![("vip", vip.to_string()), ("state", r.as_str().to_owned())],
                    1,
                )
            })
            .collect();
        gauge(
            &mut enc,
            "vip_route",
            "Each published VIP's route: 1 for its state (announced, or why not).",
            &per_vip,
        )?;
        let counts: Vec<_> = crate::core::Route::ALL
            .iter()
            .map(|s| {
                let n = routes.values().filter(|r| *r == s).count();
                (
                    vec![("state", s.as_str().to_owned())],
                    crate::metrics::gauge_of(n as u64),
                )
            })
            .collect();
        gauge(&mut enc, "vip_routes", "VIPs by route state.", &counts)?;
        gauge(
            &mut enc,
            "draining",
            "1 while the gateway drains (routes withdrawn, still forwarding).",
            &crate::metrics::one(i64::from(shared.draining.load(Ordering::Relaxed))),
        )?;
        if let Some(l2) = shared.l2() {
            let owned: Vec<_> = routes
                .keys()
                .map(|v| {
                    (
                        vec![("vip", v.to_string())],
                        i64::from(l2.owned.contains(v)),
                    )
                })
                .collect();
            gauge(
                &mut enc,
                "vrrp_owner",
                "1 while this gateway owns the VIP on its segment (VRRP master).",
                &owned,
            )?;
            let changes: Vec<_> = routes
                .keys()
                .map(|v| {
                    let n = l2.owner_changes.get(v).copied().unwrap_or(0);
                    (vec![("vip", v.to_string())], n)
                })
                .collect();
            counter(
                &mut enc,
                "vrrp_owner_changes",
                "Times this gateway took or lost the VIP (VRRP master or not).",
                &changes,
            )?;
            gauge(
                &mut enc,
                "vrrp_running",
                "1 while keepalived runs.",
                &crate::metrics::one(i64::from(l2.running)),
            )?;
        }
        let Some(bgp) = shared.bgp() else {
            return Ok(());
        };
        let sessions: Vec<_> = bgp
            .sessions
            .iter()
            .map(|s| {
                (
                    vec![("peer", s.peer.to_string()), ("state", s.state.clone())],
                    i64::from(s.up),
                )
            })
            .collect();
        gauge(
            &mut enc,
            "bgp_session_up",
            "1 while the BGP session with the peer is established; `state` is BIRD's word for it.",
            &sessions,
        )?;
        gauge(
            &mut enc,
            "bgp_daemon_running",
            "1 while the BIRD speaker runs and answers.",
            &crate::metrics::one(i64::from(bgp.running)),
        )?;
        gauge(
            &mut enc,
            "bgp_announced_routes",
            "VIPs given to the BGP speaker to announce.",
            &crate::metrics::one(crate::metrics::gauge_of(bgp.announced as u64)),
        )?;
        counter(
            &mut enc,
            "bgp_daemon_restarts",
            "Times the BIRD speaker was started again after it died.",
            &crate::metrics::one(bgp.restarts),
        )
    }
}

impl Collector for KubeMetrics {
    fn encode(&self, encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let stats = self
            .0
            .kube
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match stats {
            Some(stats) => crate::kube::Metrics(stats).encode(encoder),
            None => Ok(()),
        }
    }
}

impl Collector for Metrics {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let shared = &self.0;
        let samples = shared.samples();
        let core = |n: &String| vec![("core", n.clone())];
        let per_core =
            |f: fn(&crate::cores::CoreSample) -> u64| -> Vec<(Vec<(&str, String)>, u64)> {
                samples.iter().map(|(n, s)| (core(n), f(s))).collect()
            };
        counter(
            &mut enc,
            "rx_packets",
            "Frames received by the worker.",
            &per_core(|s| s.counters.rx),
        )?;
        counter(
            &mut enc,
            "tx_packets",
            "Frames sent (forwarded or answered).",
            &per_core(|s| s.counters.tx),
        )?;
        counter(
            &mut enc,
            "pass_packets",
            "Frames given to the kernel.",
            &per_core(|s| s.counters.pass),
        )?;
        counter(
            &mut enc,
            "handoff_packets",
            "Frames handed to another core.",
            &per_core(|s| s.counters.handoff),
        )?;
        let drops: Vec<_> = samples
            .iter()
            .flat_map(|(n, s)| {
                DropReason::ALL.iter().map(move |r| {
                    (
                        vec![("core", n.clone()), ("reason", r.as_str().to_string())],
                        s.counters.drops_for(*r),
                    )
                })
            })
            .collect();
        counter(
            &mut enc,
            "dropped_packets",
            "Frames dropped, by reason.",
            &drops,
        )?;
        counter(
            &mut enc,
            "checksum_completed",
            "Frames sent with a TCP/UDP checksum the gateway completed: their local sender left \
             it to checksum offload.",
            &per_core(|s| s.counters.checksum_completed),
        )?;
        counter(
            &mut enc,
            "flows_created",
            "New flows entered in the flow table.",
            &per_core(|s| s.counters.flows_created),
        )?;
        counter(
            &mut enc,
            "flows_reopened",
            "New connections on the 5-tuple of a closing flow (a reused client port), given a \
             backend afresh.",
            &per_core(|s| s.counters.flows_reopened),
        )?;
        counter(
            &mut enc,
            "flows_stateless",
            "New flows forwarded without state (table bucket full or above the rate cap).",
            &per_core(|s| s.counters.stateless_full + s.counters.stateless_rate_limited),
        )?;
        counter(
            &mut enc,
            "flow_evictions",
            "Half-open flows evicted for new ones.",
            &per_core(|s| s.flows.evicted),
        )?;
        counter(
            &mut enc,
            "flow_expirations",
            "Flows reclaimed after their idle timeout.",
            &per_core(|s| s.flows.expired),
        )?;
        let worker_drops: Vec<_> = samples
            .iter()
            .flat_map(|(n, s)| {
                let w = &s.worker;
                [
                    ("pass_unsent", w.pass_unsent),
                    ("other_port", w.other_port),
                    ("tx_ring_full", w.tx_ring_full),
                    ("tx_refused", w.tx_refused),
                    ("invalid_rx", w.invalid_rx),
                    ("handoff_full", w.handoff_full),
                    ("handoff_too_big", w.handoff_too_big),
                    ("handoff_no_ring", w.handoff_no_ring),
                    ("handoff_no_frame", w.handoff_no_frame),
                    ("handoff_loop", w.handoff_loop),
                ]
                .map(|(cause, v)| (vec![("core", n.clone()), ("cause", cause.to_string())], v))
            })
            .collect();
        counter(
            &mut enc,
            "worker_dropped_frames",
            "Frames the worker (AF_XDP or DPDK) could not send on after the pipeline's verdict, by cause.",
            &worker_drops,
        )?;
        counter(
            &mut enc,
            "worker_kernel_passed_frames",
            "Frames the pipeline passed that the worker gave to the kernel (DPDK: written to the \
             port's exception TAP; AF_XDP passes in its steering program instead).",
            &per_core(|s| s.worker.passed),
        )?;
        counter(
            &mut enc,
            "worker_kernel_sent_frames",
            "Frames the kernel sent that the worker put on the wire (DPDK: read from the \
             port's exception TAP).",
            &per_core(|s| s.worker.exception_out),
        )?;
        counter(
            &mut enc,
            "worker_handed_in_frames",
            "Frames received from other cores' handoff rings.",
            &per_core(|s| s.worker.handed_in),
        )?;
        counter(
            &mut enc,
            "worker_wakeups",
            "Syscalls made to wake the kernel (TX and fill-ring kicks) and idle polls.",
            &per_core(|s| s.worker.tx_kicks + s.worker.fill_kicks + s.worker.idle_polls),
        )?;
        crate::cores::umem(&mut enc, &samples)?;
        let busy: Vec<_> = samples
            .iter()
            .map(|(n, s)| (core(n), s.worker.busy.seconds()))
            .collect();
        crate::metrics::seconds_counter(
            &mut enc,
            "worker_busy_seconds",
            "Time in worker turns that found frames (ring work, pipeline, TX kicks): over the \
             packets, the worker's CPU per packet.",
            &busy,
        )?;
        let kicks: Vec<_> = samples
            .iter()
            .map(|(n, s)| (core(n), s.worker.busy.kick_seconds()))
            .collect();
        crate::metrics::seconds_counter(
            &mut enc,
            "worker_kick_seconds",
            "Of the busy time, the TX kicks (copy-mode AF_XDP: the kernel copies and transmits \
             each frame inside the sendto; 0 on DPDK, whose PMD sends within the batch).",
            &kicks,
        )?;
        let occ: Vec<_> = samples
            .iter()
            .map(|(n, s)| (core(n), s.flows.occupancy as i64))
            .collect();
        gauge(
            &mut enc,
            "flow_table_entries",
            "Entries in the flow table.",
            &occ,
        )?;
        let cap: Vec<_> = samples
            .iter()
            .map(|(n, s)| (core(n), s.flow_capacity as i64))
            .collect();
        gauge(
            &mut enc,
            "flow_table_capacity",
            "Capacity of the flow table.",
            &cap,
        )?;

        // The steering program's verdicts: with the workers' counters after them, every frame
        // an interface received is counted once.
        let steering: Vec<_> = shared
            .xdp
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|r| Some((r.iface().to_owned(), r.counters().ok()?)))
            .collect();
        let port_rx: Vec<_> = steering
            .iter()
            .filter_map(|(iface, _)| {
                let path = format!("/sys/class/net/{iface}/statistics/rx_packets");
                let n = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
                Some((vec![("interface", iface.clone())], n))
            })
            .collect();
        let xdp: Vec<_> = steering
            .into_iter()
            .flat_map(|(iface, c)| {
                c.by_reason().map(|(verdict, reason, v)| {
                    (
                        vec![
                            ("interface", iface.clone()),
                            ("verdict", verdict.to_string()),
                            ("reason", reason.to_string()),
                        ],
                        v,
                    )
                })
            })
            .collect();
        counter(
            &mut enc,
            "xdp_packets",
            "Frames the XDP steering program saw, by verdict (pass: to the kernel; redirect: to \
             the workers) and reason. Their sum is every frame the interface received.",
            &xdp,
        )?;
        let dpdk = shared
            .dpdk
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(reader) = dpdk {
            let ports = crate::dpdk::port_counters(&reader);
            let per_port = |f: fn(&crate::dpdk::PortCounters) -> u64| -> Vec<_> {
                ports
                    .iter()
                    .map(|(n, c)| (vec![("interface", n.clone())], f(c)))
                    .collect()
            };
            for (name, help, f) in [
                (
                    "dpdk_port_rx_packets",
                    "Frames the DPDK port received (ethdev ipackets); every one goes to a worker.",
                    (|c| c.rx_packets) as fn(&crate::dpdk::PortCounters) -> u64,
                ),
                (
                    "dpdk_port_tx_packets",
                    "Frames the DPDK port sent (opackets).",
                    |c| c.tx_packets,
                ),
                (
                    "dpdk_port_rx_missed",
                    "Frames the DPDK port dropped for lack of RX descriptors (imissed).",
                    |c| c.rx_missed,
                ),
                (
                    "dpdk_port_rx_errors",
                    "Receive errors of the DPDK port.",
                    |c| c.rx_errors,
                ),
                (
                    "dpdk_port_tx_errors",
                    "Send errors of the DPDK port.",
                    |c| c.tx_errors,
                ),
                (
                    "dpdk_port_rx_nombuf",
                    "Receive failures of the DPDK port for lack of mbufs.",
                    |c| c.rx_nombuf,
                ),
            ] {
                counter(&mut enc, name, help, &per_port(f))?;
            }
            let link: Vec<_> = ports
                .iter()
                .map(|(n, c)| (vec![("interface", n.clone())], i64::from(c.link_up)))
                .collect();
            gauge(
                &mut enc,
                "dpdk_port_link_up",
                "1 when the DPDK port's link is up.",
                &link,
            )?;
        }
        counter(
            &mut enc,
            "interface_rx_packets",
            "Frames the interface received (its rx_packets, from sysfs). While the steering \
             program is attached, strait_xdp_packets_total grows by as much.",
            &port_rx,
        )?;

        let table = shared.table.load();
        let mut per_backend = Vec::new();
        let mut up = Vec::new();
        let mut passive_failures = Vec::new();
        let mut out = Vec::new();
        let mut weight = Vec::new();
        let health = shared
            .health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for b in table.backends.iter().flatten() {
            let svc = &table.services[b.service as usize];
            let mut label = String::new();
            let _ = write!(label, "{}", b.socket_addr());
            let labels = vec![("service", svc.name.clone()), ("backend", label)];
            let n: u64 = samples
                .iter()
                .map(|(_, s)| s.new_flows.get(b.id.0 as usize).copied().unwrap_or(0))
                .sum();
            per_backend.push((labels.clone(), n));
            let w = if b.health == strait_dataplane::table::Health::Up {
                i64::from(b.weight)
            } else {
                0
            };
            weight.push((labels.clone(), w));
            let h = health.get(&BackendKey::new(svc.name.clone(), b.address(), b.port));
            let is_up = h.is_none_or(|h| h.up);
            for why in strait_dataplane::passive::Failure::ALL {
                let n: u64 = samples
                    .iter()
                    .map(|(_, s)| {
                        s.passive
                            .get(b.id.0 as usize)
                            .map_or(0, |c| c[why as usize])
                    })
                    .sum();
                let mut l = labels.clone();
                l.push(("cause", why.as_str().to_owned()));
                passive_failures.push((l, n));
            }
            if let Some(h) = h {
                let by = if !h.up {
                    Some("active")
                } else {
                    h.passive.as_ref().map(|_| "passive")
                };
                if let Some(by) = by {
                    let cause = match &out_json(Some(h))["cause"] {
                        serde_json::Value::String(c) => c.clone(),
                        _ => String::new(),
                    };
                    let mut l = labels.clone();
                    l.push(("by", by.to_owned()));
                    l.push(("cause", cause));
                    out.push((l, 1));
                }
            }
            up.push((labels, i64::from(is_up)));
        }
        counter(
            &mut enc,
            "backend_passive_failures",
            "New connections the backend refused (RST to the SYN) or left unanswered (the SYN \
             retransmitted while the backend sent nothing), seen by the workers in nat mode \
             (passive health).",
            &passive_failures,
        )?;
        gauge(
            &mut enc,
            "backend_out",
            "1 for each backend its health keeps from new flows, by what took it out (active: \
             its check fell; passive: refused or unanswered connections, nat mode) and the \
             cause; a backend in service has no series.",
            &out,
        )?;
        counter(
            &mut enc,
            "backend_new_flows",
            "New flows sent to each backend.",
            &per_backend,
        )?;
        gauge(
            &mut enc,
            "backend_weight",
            "The Maglev weight each backend takes new flows by now: its configured weight, \
             less while it ramps up (slow_start), 0 while it takes none (down, draining).",
            &weight,
        )?;
        gauge(
            &mut enc,
            "backend_up",
            "1 when the backend passes its health check (or has none).",
            &up,
        )?;
        // The members of each service's Maglev table: 0 means new connections to the
        // service have nowhere to go.
        let serving: Vec<_> = table
            .services
            .iter()
            .map(|s| {
                (
                    vec![("service", s.name.clone())],
                    crate::metrics::gauge_of(s.members.len() as u64),
                )
            })
            .collect();
        gauge(
            &mut enc,
            "service_serving_backends",
            "Backends of the service that take new flows (healthy, weight above 0, not draining).",
            &serving,
        )?;
        let gen = vec![(Vec::new(), table.generation as i64)];
        gauge(
            &mut enc,
            "snapshot_generation",
            "Generation of the service table the workers use.",
            &gen,
        )?;
        let unresolved = table
            .backends
            .iter()
            .flatten()
            .filter(|b| b.mac.is_none())
            .count();
        gauge(
            &mut enc,
            "backends_without_next_hop",
            "Backends of the live table whose next-hop MAC is not resolved yet (their frames are \
             dropped as no_next_hop).",
            &[(Vec::new(), unresolved as i64)],
        )?;
        crate::sync::metrics(&mut enc, &samples, &shared.sync)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    #[test]
    fn out_names_what_took_a_backend_out_and_why() {
        use crate::health::{PassiveOut, State, Transition};
        use std::time::SystemTime;
        assert_eq!(out_json(None), serde_json::Value::Null);
        let mut s = State::default();
        assert_eq!(out_json(Some(&s)), serde_json::Value::Null);
        s.passive = Some(PassiveOut {
            cause: "refused",
            detail: "3 connection attempts refused within 1s".into(),
            at: SystemTime::UNIX_EPOCH,
            since: Instant::now(),
        });
        let v = out_json(Some(&s));
        assert_eq!(
            (v["by"].as_str(), v["cause"].as_str()),
            (Some("passive"), Some("refused"))
        );
        assert_eq!(v["since"], "1970-01-01T00:00:00Z");
        // Its check falls too: the active check's fall is what shows.
        s.up = false;
        s.last_error = Some("connect 198.51.100.11:80: timed out".into());
        s.history.push_back(Transition {
            at: SystemTime::UNIX_EPOCH,
            up: false,
            cause: "timeout".into(),
            detail: String::new(),
        });
        let v = out_json(Some(&s));
        assert_eq!(
            (v["by"].as_str(), v["cause"].as_str()),
            (Some("active"), Some("timeout"))
        );
    }

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
            asked.elapsed() < Duration::from_secs(1),
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
        assert!(m.contains(
            "strait_dropped_packets_total{core=\"veth-gw/0\",reason=\"ip_truncated\"} 0"
        ));
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
        assert_eq!(get(addr, "GET", "/nope").0, 404);

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
        let mut l2 = crate::l2::Status::default();
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
}
