//! The admin and metrics HTTP endpoint (default `127.0.0.1:9900`).
//!
//! | request | answer |
//! |---|---|
//! | `GET /healthz` | `200 ok` once the workers forward and the VIPs are announced, `503` before |
//! | `GET /services` | every service and backend with weight, state and health, as JSON |
//! | `GET /metrics` | Prometheus text format: per-core packets, drops by reason, flow table, new flows per backend, backend health, snapshot generation |
//! | `GET /routes` | every VIP's route (announced, or why not), whether the gateway drains, the BGP sessions, as JSON |
//! | `GET /traffic` | packets and bytes per service and backend, as JSON ([`crate::traffic`]) |
//! | `GET /explain?client=ADDR:PORT&vip=ADDR:PORT&proto=tcp` | where that flow goes and why: frontend, source ranges, flow entry or Maglev choice, rewrite, as JSON ([`crate::explain`]) |
//! | `POST /reload` | re-reads the configuration file and swaps the table in atomically (loopback listener only; 403 elsewhere) |
//! | `POST /drain` | withdraws every route, forwards for `drain_grace`, then stops the gateway (loopback listener only) |
//! | `POST /capture?FILTER` | arms a capture in the workers and streams it as pcapng until its `count` or `duration`, or the client leaves (taken as `POST /reload` is; see [`crate::capture`]) |
//!
//! A small HTTP/1.1 server on a thread of its own ([`http`]): each connection is a task, so a
//! thousand idle or slow clients never keep `/healthz` from answering, and each has a
//! deadline and a size bound for its request. `POST /reload` and `POST /drain` are taken only
//! on a loopback listener, the Unix socket, or with the token.
//!
//! Where to look:
//!
//! - here: what the endpoint is, where it listens, who may change things, and which path is
//!   answered by what ([`answer`]);
//! - [`http`]: the listeners, connections, request parsing and the bounds on clients;
//! - [`views`]: the JSON of `/services` and `/routes`;
//! - [`collectors`]: the families of `/metrics`, read on each scrape;
//! - `/traffic`, `/explain` and `/capture` are answered by the modules that own that state
//!   ([`crate::traffic`], [`crate::explain`], [`crate::capture`]).

mod collectors;
mod http;
#[cfg(test)]
mod tests;
mod views;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;

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
    let endpoint = Endpoint {
        registry: collectors::registry(&shared),
        shared,
        requests,
        token: opts.token.clone(),
    };
    http::spawn(opts, endpoint)
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

/// The answer to `method path`, from a client `allowed` to change things or not: status,
/// content type, body.
fn answer(
    endpoint: &Endpoint,
    method: &str,
    path: &str,
    allowed: bool,
) -> (u16, &'static str, String) {
    let shared = &endpoint.shared;
    // Routed by the path without its query, which only /explain reads.
    let (route, query) = path.split_once('?').unwrap_or((path, ""));
    match (method, route) {
        ("GET", "/healthz") if shared.draining.load(Ordering::Relaxed) => {
            (503, "text/plain", "draining\n".to_string())
        }
        ("GET", "/healthz") if shared.ready.load(Ordering::Relaxed) => {
            (200, "text/plain", "ok\n".to_string())
        }
        ("GET", "/healthz") => (503, "text/plain", "starting\n".to_string()),
        ("GET", "/services") => (200, "application/json", views::services_json(shared)),
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
        ("GET", "/routes") => (200, "application/json", views::routes_json(shared)),
        ("GET", "/traffic") => (200, "application/json", crate::traffic::json(shared)),
        ("GET", "/explain") => crate::explain::http(shared, query),
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
            | "/reload" | "/drain" | "/capture",
        ) => {
            (405, "text/plain", "method not allowed\n".into())
        }
        _ => (
            404,
            "text/plain",
            "not found: try /healthz, /services, /routes, /traffic, /metrics, /explain, POST /capture, POST /reload, POST /drain\n"
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
