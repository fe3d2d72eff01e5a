//! HTTP/1.1 as the admin endpoint speaks it: the listeners (TCP, and a Unix socket), one
//! task per connection on a current-thread tokio runtime of its own thread, and the bounds
//! that keep slow, idle, oversized or malformed clients from holding anything: each has
//! [`DEADLINE`] to send at most [`MAX_REQUEST`] bytes, at most [`MAX_CONNECTIONS`] are
//! served at once. One request per connection; what it is answered is
//! [`super::answer`]'s, except `POST /capture`, whose stream takes the connection over.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{answer, mutating_allowed, Endpoint, Options};

/// Longest a client may take to send its whole request and to take the answer: an idle or
/// slow connection is closed after it, so it holds nothing for long.
pub(super) const DEADLINE: Duration = Duration::from_secs(5);

/// Largest request (request line and headers) taken; a larger one is answered 431. No
/// request here needs more than a few hundred bytes.
pub(super) const MAX_REQUEST: usize = 8 * 1024;

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

/// Binds the listeners `opts` names and serves `endpoint` on them from a thread of its own;
/// the TCP listener's address.
///
/// # Errors
/// When an address cannot be bound (in use, not local, a directory missing).
pub(super) fn spawn(opts: &Options, endpoint: Endpoint) -> anyhow::Result<SocketAddr> {
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
    let endpoint = Arc::new(endpoint);
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

/// A whole HTTP/1.1 response that closes the connection.
pub(super) fn response(status: u16, ctype: &str, body: &str) -> Vec<u8> {
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
