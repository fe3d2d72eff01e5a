//! `strait-lab testbed serve`: the backend that runs in each testbed backend namespace.
//!
//! ```text
//! client ──TCP──> [::]:80, [::]:8080     HTTP/1.1: GET /healthz -> 200 "ok\n"
//!                                          GET /stream  -> a line every 100 ms until the client leaves
//!                                          GET /echo    -> then every byte sent comes back
//!                                          anything else -> 200 "backend=b1 client=IP:PORT\n"
//! client ──UDP──> ADDR:5353 (each given)  any datagram   -> "backend=b1 client=IP:PORT\n"
//! ```
//!
//! The body names the backend and the peer address the backend saw, so an end-to-end test
//! learns from one request which backend Maglev chose and whether the client address
//! survived the trip (preserved in DSR and `nat`, lost in full NAT). A header
//! `X-Strait-Local` carries the local address the connection was accepted on (the VIP in
//! `dsr-l2`, the backend address when reached directly).
//!
//! Why UDP binds specific addresses rather than `[::]`: a datagram socket bound to the
//! wildcard answers from the address the route picks, not from the address the request
//! was sent to, and std exposes no `IP_PKTINFO` to fix that per datagram. In `dsr-l2` the
//! request goes to the VIP (held on `lo`), and the client only accepts a reply from the
//! VIP; one socket per address gives every reply the right source. TCP has no such problem:
//! an accepted connection always answers from its own local address.
//!
//! Plain std: one thread per TCP connection (bounded by [`MAX_CONNECTIONS`]), one thread
//! per listening socket. It is a test peer, not a web server: no chunked bodies, no
//! pipelining beyond reading requests in order.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// TCP ports served when `serve` is given no address: the dsr-l2 service port and the
/// `nat` target port of the testbed's generated configuration.
pub const DEFAULT_TCP_PORTS: [u16; 2] = [80, 8080];
/// UDP port served when `serve` is given no address: the testbed's UDP echo port.
pub const DEFAULT_UDP_PORT: u16 = 5353;
/// Concurrent TCP connections; more are closed at once. 1,024 threads with their default
/// 2 MiB (virtual, mostly untouched) stacks is far more than a veth testbed's clients open,
/// and low enough that a runaway load generator cannot exhaust the box's threads.
pub const MAX_CONNECTIONS: usize = 1024;
/// How long an idle keep-alive connection is kept; matches common server defaults
/// (nginx `keepalive_timeout` 75 s would hold threads longer than tests need).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest request head (request line plus headers) read; larger requests get a 431.
const MAX_HEAD: u64 = 8 * 1024;
/// Largest request body read and discarded; larger ones close the connection.
const MAX_BODY: u64 = 1024 * 1024;
/// Largest UDP datagram read; longer ones are truncated, which only matters for the
/// request, never the reply.
const MAX_DATAGRAM: usize = 2048;

/// A socket the server could not open.
#[derive(Debug)]
pub struct BindError {
    /// `"tcp"` or `"udp"`.
    pub protocol: &'static str,
    /// The address asked for.
    pub addr: SocketAddr,
    /// What `bind` said.
    pub source: io::Error,
}

impl fmt::Display for BindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot bind {} {}: {}",
            self.protocol, self.addr, self.source
        )
    }
}

impl std::error::Error for BindError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// A running backend: its sockets are bound and answered by background threads.
#[derive(Debug)]
pub struct Server {
    tcp: Vec<SocketAddr>,
    udp: Vec<SocketAddr>,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    /// The bound TCP addresses (with the real port where port 0 was asked for).
    pub fn tcp_addrs(&self) -> &[SocketAddr] {
        &self.tcp
    }

    /// The bound UDP addresses.
    pub fn udp_addrs(&self) -> &[SocketAddr] {
        &self.udp
    }

    /// Blocks while the server runs, which is until the process ends: the socket threads
    /// only return if their socket fails.
    pub fn wait(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Binds every address and starts answering on each in background threads.
///
/// `[::]` falls back to `0.0.0.0` where the kernel has no IPv6. Nothing is started unless
/// every socket binds.
///
/// # Errors
///
/// The first address that cannot be bound.
pub fn start(name: &str, tcp: &[SocketAddr], udp: &[SocketAddr]) -> Result<Server, BindError> {
    let listeners = tcp
        .iter()
        .map(|&addr| bind_with_fallback("tcp", addr, TcpListener::bind))
        .collect::<Result<Vec<_>, _>>()?;
    let sockets = udp
        .iter()
        .map(|&addr| bind_with_fallback("udp", addr, UdpSocket::bind))
        .collect::<Result<Vec<_>, _>>()?;
    let name: Arc<str> = Arc::from(name);
    let active = Arc::new(AtomicUsize::new(0));
    let mut server = Server {
        tcp: Vec::new(),
        udp: Vec::new(),
        threads: Vec::new(),
    };
    for listener in listeners {
        server.tcp.push(local_addr(&listener.local_addr()));
        let (name, active) = (Arc::clone(&name), Arc::clone(&active));
        server.threads.push(thread::spawn(move || {
            accept_loop(&listener, &name, &active)
        }));
    }
    for socket in sockets {
        server.udp.push(local_addr(&socket.local_addr()));
        let name = Arc::clone(&name);
        server
            .threads
            .push(thread::spawn(move || echo_loop(&socket, &name)));
    }
    Ok(server)
}

/// `strait-lab testbed serve`: binds (defaults: TCP `[::]:80` and `[::]:8080`, UDP
/// `[::]:5353`), prints one `ready` line on stdout, then serves until killed.
///
/// The `ready` line is the testbed's signal that the sockets are bound; nothing else is
/// ever written to stdout, so a reader may stop reading after it. Errors go to stderr.
///
/// # Errors
///
/// A socket that cannot be bound.
pub fn serve(name: &str, tcp: &[SocketAddr], udp: &[SocketAddr]) -> Result<(), BindError> {
    let any = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0));
    let tcp_default: Vec<SocketAddr>;
    let udp_default: Vec<SocketAddr>;
    let (tcp, udp) = if tcp.is_empty() && udp.is_empty() {
        tcp_default = DEFAULT_TCP_PORTS
            .iter()
            .map(|&p| SocketAddr::new(any.ip(), p))
            .collect();
        udp_default = vec![SocketAddr::new(any.ip(), DEFAULT_UDP_PORT)];
        (&tcp_default[..], &udp_default[..])
    } else {
        (tcp, udp)
    };
    let server = start(name, tcp, udp)?;
    println!(
        "strait-lab testbed serve: {name} ready: tcp {} udp {}",
        join(server.tcp_addrs()),
        join(server.udp_addrs())
    );
    server.wait();
    Ok(())
}

fn join(addrs: &[SocketAddr]) -> String {
    let parts: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(",")
    }
}

/// Binds `addr`; for `[::]` on a kernel without IPv6, binds `0.0.0.0` instead.
fn bind_with_fallback<S>(
    protocol: &'static str,
    addr: SocketAddr,
    bind: impl Fn(SocketAddr) -> io::Result<S>,
) -> Result<S, BindError> {
    bind(addr).or_else(|source| {
        let v6_any = addr.ip() == std::net::Ipv6Addr::UNSPECIFIED;
        if v6_any && source.kind() != io::ErrorKind::AddrInUse {
            if let Ok(s) = bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()))) {
                return Ok(s);
            }
        }
        Err(BindError {
            protocol,
            addr,
            source,
        })
    })
}

/// The address as a peer would write it: IPv4-mapped IPv6 (`::ffff:192.0.2.2`, what a
/// dual-stack socket reports for IPv4 peers) shown as plain IPv4.
fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

fn local_addr(addr: &io::Result<SocketAddr>) -> SocketAddr {
    addr.as_ref()
        .map_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)), |a| *a)
}

/// The text every answer carries.
fn identity(name: &str, peer: SocketAddr) -> String {
    format!("backend={name} client={}\n", canonical(peer))
}

fn accept_loop(listener: &TcpListener, name: &Arc<str>, active: &Arc<AtomicUsize>) {
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            // Aborted handshakes and fd exhaustion are transient; keep accepting.
            Err(e) => {
                eprintln!("{name}: accept: {e}");
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if active.fetch_add(1, Ordering::Relaxed) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::Relaxed);
            continue; // dropping the stream closes it
        }
        let (conn_name, conn_active) = (Arc::clone(name), Arc::clone(active));
        let spawned = thread::Builder::new().spawn(move || {
            let name = conn_name;
            if let Err(e) = handle_connection(stream, &name) {
                if !matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::BrokenPipe
                ) {
                    eprintln!("{name}: connection: {e}");
                }
            }
            conn_active.fetch_sub(1, Ordering::Relaxed);
        });
        if let Err(e) = spawned {
            eprintln!("{name}: cannot start a connection thread: {e}");
            active.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// One parsed request head.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    method: String,
    path: String,
    keep_alive: bool,
    content_length: u64,
    chunked: bool,
}

/// Why a request head was refused.
#[derive(Debug, PartialEq, Eq)]
enum HeadError {
    TooLarge,
    Malformed,
}

/// Reads one request head; `Ok(None)` at a clean end of stream before any byte.
fn read_head(reader: &mut impl BufRead) -> io::Result<Option<Result<Request, HeadError>>> {
    let mut limited = reader.take(MAX_HEAD);
    let mut line = String::new();
    // Tolerate empty lines before the request line (RFC 9112 section 2.2).
    loop {
        line.clear();
        if limited.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        if !line.trim().is_empty() {
            break;
        }
    }
    if !line.ends_with('\n') {
        return Ok((limited.limit() == 0).then_some(Err(HeadError::TooLarge)));
    }
    let mut parts = line.split_whitespace();
    let (Some(method), Some(path), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Ok(Some(Err(HeadError::Malformed)));
    };
    if !version.starts_with("HTTP/1.") {
        return Ok(Some(Err(HeadError::Malformed)));
    }
    let mut request = Request {
        method: method.to_owned(),
        path: path.to_owned(),
        keep_alive: version != "HTTP/1.0",
        content_length: 0,
        chunked: false,
    };
    loop {
        line.clear();
        limited.read_line(&mut line)?;
        if !line.ends_with('\n') {
            return Ok(if limited.limit() == 0 {
                Some(Err(HeadError::TooLarge))
            } else {
                None // the peer closed mid-head
            });
        }
        let header = line.trim_end();
        if header.is_empty() {
            return Ok(Some(Ok(request)));
        }
        let Some((key, value)) = header.split_once(':') else {
            return Ok(Some(Err(HeadError::Malformed)));
        };
        let value = value.trim();
        match key.trim().to_ascii_lowercase().as_str() {
            "connection" => {
                let v = value.to_ascii_lowercase();
                if v.contains("close") {
                    request.keep_alive = false;
                } else if v.contains("keep-alive") {
                    request.keep_alive = true;
                }
            }
            "content-length" => match value.parse() {
                Ok(n) => request.content_length = n,
                Err(_) => return Ok(Some(Err(HeadError::Malformed))),
            },
            "transfer-encoding" => request.chunked = true,
            _ => {}
        }
    }
}

fn handle_connection(stream: TcpStream, name: &str) -> io::Result<()> {
    stream.set_read_timeout(Some(IDLE_TIMEOUT))?;
    stream.set_write_timeout(Some(IDLE_TIMEOUT))?;
    let peer = stream.peer_addr()?;
    let local = canonical(stream.local_addr()?);
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let request = match read_head(&mut reader)? {
            None => return Ok(()),
            Some(Ok(r)) => r,
            Some(Err(e)) => {
                let status = match e {
                    HeadError::TooLarge => "431 Request Header Fields Too Large",
                    HeadError::Malformed => "400 Bad Request",
                };
                respond(&mut writer, status, "", false, name, local, false)?;
                return lingering_close(&writer, reader);
            }
        };
        let refusal = if request.chunked {
            Some("501 Not Implemented")
        } else if request.content_length > MAX_BODY {
            Some("413 Content Too Large")
        } else {
            None
        };
        if let Some(status) = refusal {
            respond(&mut writer, status, "", false, name, local, false)?;
            return lingering_close(&writer, reader);
        }
        let discarded = io::copy(
            &mut (&mut reader).take(request.content_length),
            &mut io::sink(),
        )?;
        if discarded < request.content_length {
            return Ok(()); // the peer closed mid-body
        }
        let path = request.path.split('?').next().unwrap_or_default();
        if path == "/stream" {
            return stream_lines(&mut writer, name, peer);
        }
        if path == "/echo" {
            return echo_bytes(&mut writer, reader, name);
        }
        let body = if path == "/healthz" {
            "ok\n".to_owned()
        } else {
            identity(name, peer)
        };
        let head_only = request.method == "HEAD";
        respond(
            &mut writer,
            "200 OK",
            &body,
            head_only,
            name,
            local,
            request.keep_alive,
        )?;
        if !request.keep_alive {
            return Ok(());
        }
    }
}

/// `GET /stream`: a long-lived response, one line every [`STREAM_EVERY`] naming the backend,
/// the peer and a sequence number, until the client goes away. Tests use it to see that an
/// established connection keeps flowing (no reset, no stall) while the gateway's table
/// changes around it.
fn stream_lines(writer: &mut TcpStream, name: &str, peer: SocketAddr) -> io::Result<()> {
    writer
        .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")?;
    for seq in 0u64.. {
        let line = format!("{} seq={seq}\n", identity(name, peer).trim_end());
        if writer.write_all(line.as_bytes()).is_err() {
            return Ok(()); // the client left
        }
        std::thread::sleep(STREAM_EVERY);
    }
    Ok(())
}

/// `GET /echo`: a response head naming the backend (`X-Strait-Backend`), then every byte
/// the client sends comes back, until it leaves: the failover bench's long-lived streams,
/// each write checked end to end. A stream moved to another backend meets one that does
/// not know the connection, and a RST.
fn echo_bytes(writer: &mut TcpStream, mut reader: impl Read, name: &str) -> io::Result<()> {
    writer.write_all(
        format!("HTTP/1.1 200 OK\r\nX-Strait-Backend: {name}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )?;
    // Small writes go out at once, not after the peer's delayed ACK.
    writer.set_nodelay(true)?;
    let mut buf = [0u8; 4096];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        writer.write_all(&buf[..n])?;
    }
}

/// Interval between two lines of `GET /stream`: ten a second makes a one-second stall
/// obvious without loading the testbed.
pub const STREAM_EVERY: Duration = Duration::from_millis(100);

/// Closes after an error response without losing it: closing a socket with unread input
/// sends a RST, which can make the peer drop the response before reading it. So: send FIN,
/// then read (and discard) what the peer still sends, for a bounded time and amount.
fn lingering_close(writer: &TcpStream, mut reader: impl Read) -> io::Result<()> {
    writer.shutdown(std::net::Shutdown::Write)?;
    writer.set_read_timeout(Some(Duration::from_secs(1)))?;
    let _ = io::copy(&mut (&mut reader).take(MAX_BODY), &mut io::sink());
    Ok(())
}

fn respond(
    writer: &mut TcpStream,
    status: &str,
    body: &str,
    head_only: bool,
    name: &str,
    local: SocketAddr,
    keep_alive: bool,
) -> io::Result<()> {
    let connection = if keep_alive { "keep-alive" } else { "close" };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         X-Strait-Backend: {name}\r\nX-Strait-Local: {local}\r\nConnection: {connection}\r\n\r\n",
        body.len()
    );
    if !head_only {
        out.push_str(body);
    }
    writer.write_all(out.as_bytes())?;
    writer.flush()
}

fn echo_loop(socket: &UdpSocket, name: &str) {
    let mut buf = [0u8; MAX_DATAGRAM];
    loop {
        match socket.recv_from(&mut buf) {
            Ok((_, peer)) => {
                // A lost reply is what UDP does; the client retries or times out.
                let _ = socket.send_to(identity(name, peer).as_bytes(), peer);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // ICMP errors of earlier replies surface here on some kernels; keep going.
                eprintln!("{name}: udp recv: {e}");
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn loopback() -> Server {
        let any = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        start("b7", &[any], &[any]).expect("bind loopback")
    }

    fn exchange(addr: SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn echo_names_the_backend_then_returns_every_byte() {
        let server = loopback();
        let mut s = TcpStream::connect(server.tcp_addrs()[0]).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // The first line may arrive with the request head, as a client in a hurry sends it.
        s.write_all(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\nfirst\n")
            .unwrap();
        let mut reader = BufReader::new(s.try_clone().unwrap());
        let mut head = String::new();
        while !head.ends_with("\r\n\r\n") {
            assert!(reader.read_line(&mut head).unwrap() > 0, "{head}");
        }
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains("X-Strait-Backend: b7\r\n"), "{head}");
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert_eq!(line, "first\n");
        for i in 0..3 {
            let msg = format!("line {i}\n");
            s.write_all(msg.as_bytes()).unwrap();
            line.clear();
            reader.read_line(&mut line).unwrap();
            assert_eq!(line, msg);
        }
    }

    #[test]
    fn http_names_backend_and_peer() {
        let server = loopback();
        let addr = server.tcp_addrs()[0];
        let mut s = TcpStream::connect(addr).unwrap();
        let me = s.local_addr().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(
            out.contains(&format!("X-Strait-Local: {addr}\r\n")),
            "{out}"
        );
        assert!(
            out.ends_with(&format!("\r\n\r\nbackend=b7 client={me}\n")),
            "{out}"
        );
    }

    #[test]
    fn healthz_and_keep_alive() {
        let server = loopback();
        let out = exchange(
            server.tcp_addrs()[0],
            "GET /healthz?x=1 HTTP/1.1\r\n\r\nPOST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc\
             HEAD / HTTP/1.1\r\nConnection: close\r\n\r\n",
        );
        let responses: Vec<&str> = out.split("HTTP/1.1 ").skip(1).collect();
        assert_eq!(responses.len(), 3, "{out}");
        assert!(responses[0].ends_with("\r\n\r\nok\n"), "{out}");
        assert!(responses[0].contains("Connection: keep-alive"), "{out}");
        assert!(
            responses[1].contains("backend=b7 client=127.0.0.1:"),
            "{out}"
        );
        assert!(responses[2].ends_with("Connection: close\r\n\r\n"), "{out}");
    }

    #[test]
    fn malformed_requests_are_refused() {
        let server = loopback();
        let addr = server.tcp_addrs()[0];
        assert!(exchange(addr, "NONSENSE\r\n\r\n").starts_with("HTTP/1.1 400 "));
        let huge = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(10_000));
        assert!(exchange(addr, &huge).starts_with("HTTP/1.1 431 "));
        let chunked = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(exchange(addr, chunked).starts_with("HTTP/1.1 501 "));
    }

    #[test]
    fn udp_echo_names_backend_and_peer() {
        let server = loopback();
        let client = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        client.send_to(b"hi", server.udp_addrs()[0]).unwrap();
        let mut buf = [0u8; 256];
        let (n, from) = client.recv_from(&mut buf).unwrap();
        assert_eq!(from, server.udp_addrs()[0]);
        let me = client.local_addr().unwrap();
        assert_eq!(
            std::str::from_utf8(&buf[..n]).unwrap(),
            format!("backend=b7 client={me}\n")
        );
    }

    #[test]
    fn mapped_ipv4_is_shown_as_ipv4() {
        let mapped: SocketAddr = "[::ffff:192.0.2.2]:4242".parse().unwrap();
        assert_eq!(identity("b1", mapped), "backend=b1 client=192.0.2.2:4242\n");
        let v6: SocketAddr = "[2001:db8:c::2]:4242".parse().unwrap();
        assert_eq!(
            identity("b1", v6),
            "backend=b1 client=[2001:db8:c::2]:4242\n"
        );
    }

    #[test]
    fn head_parser() {
        let mut r = Cursor::new(&b"\r\nGET /x HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"[..]);
        let req = read_head(&mut r).unwrap().unwrap().unwrap();
        assert_eq!(req.method, "GET");
        assert_eq!(req.path, "/x");
        assert!(req.keep_alive);
        assert_eq!(read_head(&mut r).unwrap(), None);
        let mut r = Cursor::new(&b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n"[..]);
        assert_eq!(read_head(&mut r).unwrap(), Some(Err(HeadError::Malformed)));
        let mut r = Cursor::new(&b"GET / HTTP/1.1\r\nHost"[..]);
        assert_eq!(read_head(&mut r).unwrap(), None);
    }

    #[test]
    fn bind_errors_name_the_address() {
        let server = loopback();
        let taken = server.tcp_addrs()[0];
        let err = start("b8", &[taken], &[]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("cannot bind tcp {taken}: ")),
            "{err}"
        );
    }
}
