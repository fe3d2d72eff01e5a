//! `strait capture`: what the gateway did with some packets, as pcapng, from the live
//! workers.
//!
//! ```text
//!  strait capture --client 192.0.2.0/24 -w F ──POST /capture?client=192.0.2.0/24──► admin API
//!        ▲                                                                         │ Hub::arm
//!        │ pcapng, block by block                                                  ▼
//!        └──── section, one interface per port, packets ◄── drain every 10 ms ◄── worker rings
//! ```
//!
//! The gateway's side ([`serve`]) arms the capture hub ([`strait_dataplane::capture`]) with
//! the request's filter, answers `200` with a pcapng stream that has no length, and drains the
//! workers' rings every [`DRAIN_EVERY`] into Enhanced Packet Blocks. Each block carries its
//! frame as the worker saw it and, in its comment, what the worker did:
//!
//! ```text
//!  in core=0 port=veth-c verdict=tx service=web mode=dsr-l2
//!  out verdict=tx service=web backend=198.51.100.12:80 mode=dsr-l2 core=0 port=veth-b
//!  in core=0 port=veth-c verdict=drop reason=ipv4_header_checksum
//! ```
//!
//! and in its flags word the direction (inbound as received, outbound as sent). The capture
//! stops when the request's `count` frames were written, its `duration` passed, or the
//! client went away (its connection closed, or a write to it stalled past the admin API's
//! deadline); dropping the [`Session`] then disarms the workers, whichever way it ended.
//! `POST /capture` is taken where `POST /reload` is (a loopback listener, the Unix socket, or
//! the admin token), since a capture carries traffic.
//!
//! The client side ([`run`]) sends the request and copies the stream to a file or to
//! standard output a whole block at a time, so that an interrupted capture (Ctrl-C) still
//! leaves a file every pcapng reader takes.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use anyhow::{bail, Context};
use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::blocks::section_header::{SectionHeaderBlock, SectionHeaderOption};
use pcap_file::pcapng::{PcapNgParser, PcapNgWriter};
use pcap_file::DataLink;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use strait_dataplane::capture::{
    key_addr, ArmError, Decision, Direction, Filter, Hub, Outcome, Record, Session, DRAIN_EVERY,
    SNAP_MAX,
};
use strait_dataplane::stats::DropReason;
use strait_dataplane::table::Prefix;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::shared::Shared;

/// What a client asks for: the workers' filter and when to stop.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaptureRequest {
    /// What the workers take.
    pub filter: Filter,
    /// Stop after this many frames (a sent frame's two copies count as one).
    pub count: Option<u64>,
    /// Stop after this long.
    pub duration: Option<Duration>,
}

impl CaptureRequest {
    /// The request from a `/capture` query string (`vip=..&client=..&...`; see
    /// [`CaptureRequest::query`]).
    ///
    /// # Errors
    /// A message naming the parameter and what is wrong with it.
    pub fn parse(query: &str) -> Result<Self, String> {
        let mut r = CaptureRequest::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let bad = |what: &str| format!("capture parameter {k}={v}: {what}");
            match k {
                "vip" => {
                    let a: IpAddr = v.parse().map_err(|_| bad("not an IP address"))?;
                    r.filter.vip = Some(key_addr(a));
                }
                "client" => {
                    let net: ipnet::IpNet = match v.parse() {
                        Ok(n) => n,
                        Err(_) => v
                            .parse::<IpAddr>()
                            .map(ipnet::IpNet::from)
                            .map_err(|_| bad("not an address or a prefix (192.0.2.0/24)"))?,
                    };
                    r.filter.client = Some(Prefix::new(net.addr(), net.prefix_len()));
                }
                "port" => r.filter.port = Some(v.parse().map_err(|_| bad("not a port"))?),
                "verdict" => {
                    r.filter.outcome =
                        Outcome::parse(v).ok_or_else(|| bad("not one of tx, drop, pass, any"))?;
                }
                "reason" => {
                    r.filter.reason = Some(
                        DropReason::ALL
                            .into_iter()
                            .find(|d| d.as_str() == v)
                            .ok_or_else(|| bad("not a drop reason (see strait_dropped_packets_total)"))?,
                    );
                }
                "count" => {
                    r.count = Some(
                        v.parse()
                            .ok()
                            .filter(|&n| n > 0)
                            .ok_or_else(|| bad("not a positive count"))?,
                    );
                }
                "duration" => {
                    let d = humantime::parse_duration(v).map_err(|e| bad(&e.to_string()))?;
                    if d.is_zero() {
                        return Err(bad("not longer than zero"));
                    }
                    r.duration = Some(d);
                }
                "snaplen" => {
                    r.filter.snaplen = v
                        .parse()
                        .ok()
                        .filter(|&n| n > 0 && usize::from(n) <= SNAP_MAX)
                        .ok_or_else(|| bad(&format!("not a length from 1 to {SNAP_MAX}")))?;
                }
                "every" => {
                    r.filter.every = v
                        .parse()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| bad("not a positive number"))?;
                }
                "budget" => {
                    r.filter.budget = v
                        .parse()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| bad("not a positive number of frames a second"))?;
                }
                _ => return Err(format!(
                    "unknown capture parameter {k:?}: try vip, client, port, verdict, reason, count, duration, snaplen, every, budget"
                )),
            }
        }
        if r.filter.reason.is_some() && !matches!(r.filter.outcome, Outcome::Any | Outcome::Drop) {
            return Err(format!(
                "capture parameters: reason keeps drops, but verdict={}",
                r.filter.outcome.as_str()
            ));
        }
        Ok(r)
    }
}

/// The parts of a `strait capture` command line that make its request.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct Ask {
    /// Frames to or from this address, as received (a VIP, a backend).
    #[arg(long)]
    pub vip: Option<std::net::IpAddr>,
    /// Frames whose source or destination, as received, lies in this prefix or is this
    /// address.
    #[arg(long, value_parser = parse_net)]
    pub client: Option<ipnet::IpNet>,
    /// Frames whose source or destination port, as received, is this one.
    #[arg(long)]
    pub port: Option<u16>,
    /// Which decisions to keep.
    #[arg(long, value_parser = ["tx", "drop", "pass", "any"])]
    pub verdict: Option<String>,
    /// Only drops for this reason (a `reason` of strait_dropped_packets_total, e.g.
    /// source_not_allowed).
    #[arg(long)]
    pub reason: Option<String>,
    /// Stop after this many frames (a sent frame's two copies count as one).
    #[arg(short = 'c', long, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Stop after this long (e.g. 10s, 1m).
    #[arg(long, value_parser = crate::status::positive_duration)]
    pub duration: Option<std::time::Duration>,
    /// Bytes kept of each frame (at most 2048).
    #[arg(short = 's', long, value_parser = clap::value_parser!(u16).range(1..=SNAP_MAX as i64))]
    pub snaplen: Option<u16>,
    /// Keep one matching frame in N.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub every: Option<u32>,
    /// Frames each worker keeps per second at most (default 10000); more are counted in
    /// strait_capture_frames_total{result="over_budget"}.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub budget: Option<u32>,
}

/// `--client`: a prefix, or one address as its host prefix.
fn parse_net(s: &str) -> Result<ipnet::IpNet, String> {
    s.parse::<ipnet::IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{s:?} is not an address or a prefix (192.0.2.0/24)"))
}

impl Ask {
    /// The query string of `POST /capture` ([`CaptureRequest::parse`] reads it).
    pub fn query(&self) -> String {
        let mut q = String::new();
        let mut put = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                let _ = write!(q, "{}{k}={v}", if q.is_empty() { "" } else { "&" });
            }
        };
        put("vip", self.vip.map(|a| a.to_string()));
        put("client", self.client.map(|n| n.to_string()));
        put("port", self.port.map(|p| p.to_string()));
        put("verdict", self.verdict.clone());
        put("reason", self.reason.clone());
        put("count", self.count.map(|n| n.to_string()));
        put(
            "duration",
            self.duration.map(|d| format!("{}ms", d.as_millis().max(1))),
        );
        put("snaplen", self.snaplen.map(|n| n.to_string()));
        put("every", self.every.map(|n| n.to_string()));
        put("budget", self.budget.map(|n| n.to_string()));
        q
    }
}

/// The comment of a record's packet block: the direction, then what the worker did.
pub fn comment(r: &Record<'_>, ports: &[String]) -> String {
    let port = |p: u8| {
        ports
            .get(usize::from(p))
            .cloned()
            .unwrap_or_else(|| format!("#{p}"))
    };
    let mut c = String::with_capacity(96);
    match r.direction {
        Direction::In => {
            let _ = write!(c, "in core={} port={} ", r.core, port(r.port));
        }
        Direction::Out => c.push_str("out "),
    }
    let _ = match r.verdict {
        Decision::Tx { .. } => write!(c, "verdict=tx"),
        Decision::Pass => write!(c, "verdict=pass"),
        Decision::Drop(reason) => write!(c, "verdict=drop reason={reason}"),
        Decision::Handoff { core } => write!(c, "verdict=handoff to_core={core}"),
    };
    if let Some(s) = r.service {
        let _ = write!(c, " service={s}");
    }
    if let Some((a, p)) = r.backend {
        let a = match a {
            IpAddr::V6(_) => format!("[{a}]"),
            IpAddr::V4(_) => a.to_string(),
        };
        let _ = write!(c, " backend={a}:{p}");
    }
    if let Some(m) = r.mode {
        let _ = write!(c, " mode={}", m.as_str());
    }
    if r.direction == Direction::Out {
        let _ = write!(c, " core={} port={}", r.core, port(r.port));
    }
    c
}

/// A pcapng stream under construction: a section, an interface per port, then packets.
pub struct Pcap {
    w: PcapNgWriter<Vec<u8>>,
    ports: Vec<String>,
}

impl std::fmt::Debug for Pcap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pcap")
            .field("ports", &self.ports)
            .finish_non_exhaustive()
    }
}

/// `epb_flags` direction bits (pcapng, section 4.3.1): inbound, outbound.
const INBOUND: u32 = 1;
const OUTBOUND: u32 = 2;

impl Pcap {
    /// A stream whose interfaces are `ports` (the table's ports, in order), taking frames of
    /// at most `snaplen` bytes.
    ///
    /// # Errors
    /// Never in practice: writing to memory.
    pub fn new(ports: &[String], snaplen: u16) -> anyhow::Result<Self> {
        let section = SectionHeaderBlock {
            options: vec![SectionHeaderOption::UserApplication(
                format!("strait {} capture", env!("CARGO_PKG_VERSION")).into(),
            )],
            ..SectionHeaderBlock::default()
        };
        let mut w = PcapNgWriter::with_section_header(Vec::new(), section)?;
        for name in ports {
            w.write_pcapng_block(InterfaceDescriptionBlock {
                linktype: DataLink::ETHERNET,
                snaplen: u32::from(snaplen),
                options: vec![
                    InterfaceDescriptionOption::IfName(name.clone().into()),
                    // Nanosecond timestamps.
                    InterfaceDescriptionOption::IfTsResol(9),
                ],
            })?;
        }
        Ok(Self {
            w,
            ports: ports.to_vec(),
        })
    }

    /// Appends a record as a packet block, its time on the wall clock of `hub`.
    ///
    /// # Errors
    /// Never in practice: writing to memory.
    pub fn push(&mut self, hub: &Hub, r: &Record<'_>) -> anyhow::Result<()> {
        let interface_id = if usize::from(r.port) < self.ports.len() {
            u32::from(r.port)
        } else {
            0
        };
        let timestamp = hub
            .wall_time(r.time_ns)
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let flags = match r.direction {
            Direction::In => INBOUND,
            Direction::Out => OUTBOUND,
        };
        self.w.write_pcapng_block(EnhancedPacketBlock {
            interface_id,
            timestamp,
            original_len: r.len,
            data: r.data.into(),
            options: vec![
                EnhancedPacketOption::Comment(comment(r, &self.ports).into()),
                EnhancedPacketOption::Flags(flags),
            ],
        })?;
        Ok(())
    }

    /// The bytes written since the last call.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(self.w.get_mut())
    }
}

/// Whether a request is the capture endpoint's.
pub fn wants(path: &str) -> bool {
    path == "/capture" || path.starts_with("/capture?")
}

/// Answers a request for `/capture` on `conn`: refusals as whole responses, else a pcapng
/// stream until the capture ends (see the module docs). `allowed` says whether the client
/// may start a capture (as for `POST /reload`).
///
/// # Errors
/// When writing to the client fails.
pub async fn serve<S>(
    mut conn: S,
    shared: Arc<Shared>,
    method: &str,
    path: &str,
    allowed: bool,
    deadline: Duration,
) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let refuse = |status: u16, reason: &str, body: String| {
        format!(
            "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let query = path.split_once('?').map_or("", |(_, q)| q);
    let refusal = if method != "POST" {
        Some(refuse(405, "Method Not Allowed", "POST /capture\n".into()))
    } else if !allowed {
        Some(refuse(403, "Forbidden", "POST /capture is taken on a loopback admin_listen, the admin_socket, or with the admin token (Authorization: Bearer): a capture carries traffic\n".into()))
    } else {
        None
    };
    let request = match (refusal, CaptureRequest::parse(query)) {
        (Some(r), _) => Err(r),
        (None, Err(e)) => Err(refuse(400, "Bad Request", e + "\n")),
        (None, Ok(r)) => Ok(r),
    };
    let armed = request.and_then(|r| match shared.capture.arm(r.filter) {
        Ok(s) => Ok((r, s)),
        Err(ArmError::Busy) => Err(refuse(
            409,
            "Conflict",
            "another capture is running: one at a time\n".into(),
        )),
    });
    let (request, session) = match armed {
        Ok(x) => x,
        Err(r) => {
            tokio::time::timeout(deadline, conn.write_all(r.as_bytes()))
                .await
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
            return conn.shutdown().await;
        }
    };
    let ports: Vec<String> = shared
        .config()
        .gateway
        .interfaces
        .iter()
        .map(|i| i.name.clone())
        .collect();
    tracing::info!(query, "capture started");
    let (taken, result) = stream(conn, session, &request, &ports, deadline).await;
    tracing::info!(frames = taken, "capture stopped");
    result
}

/// The capture's stream: drains `session` into pcapng on `conn` until the request's count or
/// duration, or the client leaves; the frames written and how writing went. The session is
/// dropped (the workers disarmed) before this returns.
async fn stream<S>(
    conn: S,
    mut session: Session,
    request: &CaptureRequest,
    ports: &[String],
    deadline: Duration,
) -> (u64, std::io::Result<()>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut rd, mut wr) = tokio::io::split(conn);
    let mut pcap = match Pcap::new(ports, request.filter.snaplen) {
        Ok(p) => p,
        Err(e) => return (0, Err(std::io::Error::other(e.to_string()))),
    };
    let head = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-pcapng\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n";
    let mut out = head.to_vec();
    out.extend(pcap.take());
    let end = request.duration.map(|d| Instant::now() + d);
    let limit = request.count.unwrap_or(u64::MAX);
    let mut tick = tokio::time::interval(DRAIN_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut taken = 0u64;
    let mut sink = [0u8; 256];
    let result = loop {
        if !out.is_empty() {
            match tokio::time::timeout(deadline, wr.write_all(&out)).await {
                Ok(Ok(())) => out.clear(),
                Ok(Err(e)) => break Err(e),
                Err(_) => break Err(std::io::ErrorKind::TimedOut.into()),
            }
        }
        if taken >= limit || end.is_some_and(|e| Instant::now() >= e) {
            break Ok(());
        }
        tokio::select! {
            _ = tick.tick() => {}
            // The client sends nothing after its request: a read that returns is its leaving.
            r = rd.read(&mut sink) => match r {
                Ok(0) | Err(_) => break Ok(()),
                Ok(_) => {}
            },
        }
        let mut skip = false;
        let mut failed = None;
        let hub = Arc::clone(session.hub());
        session.drain(|r| {
            if r.direction == Direction::In {
                skip = taken >= limit;
                if skip {
                    return;
                }
                taken += 1;
            } else if skip {
                // The copy as sent of a frame past the count.
                return;
            }
            if let Err(e) = pcap.push(&hub, r) {
                failed = Some(e);
            }
        });
        if let Some(e) = failed {
            break Err(std::io::Error::other(e.to_string()));
        }
        out.extend(pcap.take());
    };
    drop(session);
    let _ = wr.shutdown().await;
    (taken, result)
}

/// The capture counters (`strait_capture_*`), read from the hub on each scrape.
#[derive(Debug)]
pub struct CaptureMetrics(pub Arc<Shared>);

impl Collector for CaptureMetrics {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let shared = &self.0;
        let hub = &shared.capture;
        let mut rows = Vec::new();
        for (i, c) in shared.cores.iter().enumerate() {
            for (result, n) in hub.counters(i).results() {
                rows.push((
                    vec![("core", c.name.clone()), ("result", result.to_owned())],
                    n,
                ));
            }
        }
        crate::metrics::counter(
            &mut enc,
            "capture_frames",
            "Frames a capture's filter looked at in the workers, by result: captured, filtered (not taken by the filter), sampled (skipped by --every), over_budget (the per-second budget spent), ring_full (records lost, never packets).",
            &rows,
        )?;
        crate::metrics::gauge(
            &mut enc,
            "capture_armed",
            "1 while a capture (strait capture, POST /capture) runs.",
            &crate::metrics::one(i64::from(hub.is_armed())),
        )
    }
}

/// A connection to the admin API, over TCP or its Unix socket.
enum Conn {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Conn {
    fn open(admin: &crate::status::Admin) -> anyhow::Result<Self> {
        let hint = || {
            format!(
                "no gateway admin API at {} (is `strait run` running, and is this its admin_listen or admin_socket?)",
                admin.socket.as_ref().map_or_else(|| admin.addr.to_string(), |p| p.display().to_string())
            )
        };
        Ok(match &admin.socket {
            Some(p) => Conn::Unix(std::os::unix::net::UnixStream::connect(p).with_context(hint)?),
            None => Conn::Tcp(
                std::net::TcpStream::connect_timeout(&admin.addr, Duration::from_secs(3))
                    .with_context(hint)?,
            ),
        })
    }

    fn set_read_timeout(&self, t: Duration) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.set_read_timeout(Some(t)),
            Conn::Unix(s) => s.set_read_timeout(Some(t)),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(buf),
            Conn::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(buf),
            Conn::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Where `strait capture` writes: a file, or standard output for `-`.
pub fn output(path: &Path) -> anyhow::Result<Box<dyn Write>> {
    if path == Path::new("-") {
        return Ok(Box::new(std::io::stdout().lock()));
    }
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    Ok(Box::new(f))
}

/// How often the client looks whether it was interrupted while no data comes.
const POLL: Duration = Duration::from_millis(100);

/// `strait capture`: asks the gateway at `admin` for a capture and copies its pcapng stream
/// to `out` (a path, or `-` for standard output), whole blocks at a time, until the gateway
/// ends it (count, duration) or `stop` is set (Ctrl-C). Returns the frames written.
///
/// # Errors
/// When the gateway cannot be reached, refuses the capture (the reason is in the message),
/// sends something that is not pcapng, or the output cannot be written.
pub fn run(
    admin: &crate::status::Admin,
    ask: &Ask,
    out: &Path,
    stop: &AtomicBool,
) -> anyhow::Result<u64> {
    let auth = match &admin.token_file {
        None => String::new(),
        Some(f) => {
            let t = std::fs::read_to_string(f)
                .with_context(|| format!("reading the token file {}", f.display()))?;
            format!("Authorization: Bearer {}\r\n", t.trim())
        }
    };
    let query = ask.query();
    let path = if query.is_empty() {
        "/capture".to_owned()
    } else {
        format!("/capture?{query}")
    };
    let mut conn = Conn::open(admin)?;
    conn.write_all(
        format!(
            "POST {path} HTTP/1.1\r\nHost: strait\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )?;
    conn.set_read_timeout(POLL)?;
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    // The response head.
    let body_at = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if stop.load(Ordering::Relaxed) {
            return Ok(0);
        }
        match read(&mut conn, &mut chunk)? {
            Some(0) => bail!("the gateway closed the connection without an answer"),
            Some(n) => buf.extend_from_slice(&chunk[..n]),
            None => {}
        }
    };
    let head = String::from_utf8_lossy(&buf[..body_at]).into_owned();
    if !head.starts_with("HTTP/1.1 200") {
        // A refusal is a whole response: read its body to the end.
        let mut rest = buf[body_at..].to_vec();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            match read(&mut conn, &mut chunk)? {
                Some(0) => break,
                Some(n) => rest.extend_from_slice(&chunk[..n]),
                None => {}
            }
        }
        bail!(
            "POST {path}: {}: {}",
            head.lines().next().unwrap_or_default(),
            String::from_utf8_lossy(&rest).trim()
        );
    }
    buf.drain(..body_at);
    let mut out = output(out)?;
    let mut parser: Option<PcapNgParser> = None;
    let mut frames = 0u64;
    loop {
        // Every whole block in `buf` goes out; a partial one waits for its rest.
        let mut at = 0;
        loop {
            let rest = &buf[at..];
            let parsed = match &mut parser {
                None => match PcapNgParser::new(rest) {
                    Ok((left, p)) => {
                        parser = Some(p);
                        Ok(left)
                    }
                    Err(e) => Err(e),
                },
                Some(p) => match p.next_block(rest) {
                    Ok((left, block)) => {
                        if let pcap_file::pcapng::Block::EnhancedPacket(b) = &block {
                            frames += u64::from(b.options.iter().any(
                                |o| matches!(o, EnhancedPacketOption::Flags(f) if *f == INBOUND),
                            ));
                        }
                        Ok(left)
                    }
                    Err(e) => Err(e),
                },
            };
            match parsed {
                Ok(left) => {
                    let used = rest.len() - left.len();
                    out.write_all(&rest[..used])?;
                    at += used;
                }
                Err(pcap_file::PcapError::IncompleteBuffer) => break,
                Err(e) => bail!("the gateway sent something that is not pcapng: {e}"),
            }
        }
        buf.drain(..at);
        out.flush()?;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        match read(&mut conn, &mut chunk)? {
            Some(0) => break,
            Some(n) => buf.extend_from_slice(&chunk[..n]),
            None => {}
        }
    }
    out.flush()?;
    Ok(frames)
}

/// One read from the gateway: `Some(n)` bytes (0 at its end), `None` when nothing came within
/// [`POLL`].
fn read(conn: &mut Conn, chunk: &mut [u8]) -> anyhow::Result<Option<usize>> {
    match conn.read(chunk) {
        Ok(n) => Ok(Some(n)),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock
                    | std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::Interrupted
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e).context("reading the capture from the gateway"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_round_trip_through_the_query() {
        let ask = Ask {
            vip: Some("203.0.113.10".parse().unwrap()),
            client: Some("192.0.2.0/24".parse().unwrap()),
            port: Some(80),
            verdict: Some("drop".into()),
            reason: Some("source_not_allowed".into()),
            count: Some(5),
            duration: Some(Duration::from_secs(3)),
            snaplen: Some(128),
            every: Some(2),
            budget: Some(100),
        };
        let r = CaptureRequest::parse(&ask.query()).unwrap();
        assert_eq!(r.count, Some(5));
        assert_eq!(r.duration, Some(Duration::from_secs(3)));
        let f = r.filter;
        assert_eq!(f.vip, Some(key_addr("203.0.113.10".parse().unwrap())));
        assert!(f
            .client
            .unwrap()
            .contains(&key_addr("192.0.2.77".parse().unwrap())));
        assert!(!f
            .client
            .unwrap()
            .contains(&key_addr("192.0.3.1".parse().unwrap())));
        assert_eq!((f.port, f.outcome), (Some(80), Outcome::Drop));
        assert_eq!(f.reason, Some(DropReason::SourceNotAllowed));
        assert_eq!((f.snaplen, f.every, f.budget), (128, 2, 100));
        assert_eq!(
            CaptureRequest::parse("").unwrap(),
            CaptureRequest::default()
        );
        let one = CaptureRequest::parse("client=2001:db8::1").unwrap();
        assert!(one
            .filter
            .client
            .unwrap()
            .contains(&key_addr("2001:db8::1".parse().unwrap())));
    }

    #[test]
    fn bad_requests_name_the_parameter() {
        for (q, says) in [
            ("vip=nope", "vip=nope"),
            ("verdict=maybe", "not one of tx, drop, pass, any"),
            ("reason=bored", "not a drop reason"),
            ("snaplen=99999", "snaplen=99999"),
            ("every=0", "every=0"),
            ("count=0", "count=0"),
            ("duration=soon", "duration=soon"),
            ("duration=0s", "duration=0s: not longer than zero"),
            ("reason=bored", "strait_dropped_packets_total"),
            ("colour=red", "unknown capture parameter \"colour\""),
            ("verdict=tx&reason=no_backend", "reason keeps drops"),
        ] {
            let e = CaptureRequest::parse(q).unwrap_err();
            assert!(e.contains(says), "{q}: {e}");
        }
    }

    #[test]
    fn the_stream_is_pcapng_with_an_interface_per_port() {
        let hub = Hub::new(1);
        let mut p = Pcap::new(&["eth0".into(), "eth1".into()], 2048).unwrap();
        let bytes = p.take();
        let mut r = pcap_file::pcapng::PcapNgReader::new(&bytes[..]).unwrap();
        let mut names = Vec::new();
        while let Some(b) = r.next_block() {
            if let pcap_file::pcapng::Block::InterfaceDescription(i) = b.unwrap() {
                names.extend(i.options.iter().filter_map(|o| match o {
                    InterfaceDescriptionOption::IfName(n) => Some(n.to_string()),
                    _ => None,
                }));
            }
        }
        assert_eq!(names, ["eth0", "eth1"]);
        let _ = hub;
    }
}
