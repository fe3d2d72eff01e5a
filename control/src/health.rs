//! Active health checks: one thread per checked backend, TCP connect or HTTP GET, on an interval with
//! ±10 % jitter (so checks of many backends do not fall into step), a timeout, and rise / fall
//! counts like HAProxy's: a backend goes down after `fall` consecutive failures and up after
//! `rise` consecutive successes.
//!
//! Backends start up: a freshly configured backend takes traffic at once, as kube-proxy's
//! ready endpoints do, and a dead one is taken out after `fall` intervals (3 s with the
//! defaults). A state change is sent on a channel; the control loop tells the control core,
//! which updates the table for that service and publishes it, so workers never wait on a
//! check. Which checks run is the core's decision ([`crate::core::Effect::StartCheck`]).
//!
//! HTTP success is a status of 200 to 399, as for Kubernetes' HTTP probes.
//!
//! Each backend keeps its last [`HISTORY`] transitions (up or down, when, and for a fall the
//! [`Cause`] of the failure that tipped it: refused, timeout, reset, HTTP status N...), so
//! that `strait status` answers "since when, and why" in an incident. Bounded, so a flapping
//! backend costs the same as a steady one.
//!
//! UDP services are checked as UDP: `udp` sends a datagram and wants a reply, `dns` asks a
//! question and wants an answer ([`dns`]). Each check sends from a connected socket of its
//! own, so the kernel hands it the ICMP port unreachable a closed port answers with, as
//! `ECONNREFUSED`: a stopped server fails the check at once, not after the timeout.
//!
//! A check's thread outlives its check: a stopped check's thread parks in an idle pool (at
//! most [`IDLE_MAX`]) and the next check started takes it. Endpoints come and go by the
//! thousand a minute in a busy cluster; a thread started and ended for each would make the
//! allocator give each new thread an arena and a cached stack whose high-water marks creep
//! up for minutes, so the gateway's resident memory would grow with the churn
//! (`strait-lab bench soak`). Pooled, the threads and their memory stay as they were.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime};

use strait_config::model::{Config, HealthCheck, HealthKind};

use crate::core::BackendKey;

mod dns;

/// What the checker knows of one backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    /// Whether the backend takes traffic.
    pub up: bool,
    /// Consecutive successes (while down) or 0.
    pub rises: u32,
    /// Consecutive failures (while up) or 0.
    pub falls: u32,
    /// Checks run so far.
    pub checks: u64,
    /// The last failure, if the last check failed.
    pub last_error: Option<String>,
    /// The last [`HISTORY`] transitions, oldest first.
    pub history: VecDeque<Transition>,
    /// Set while passive health holds the backend out of new flows: the first pass of a
    /// check that began after it brings the backend back (a report on the channel).
    pub passive: Option<PassiveOut>,
}

/// Why and since when passive health holds a backend out ([`State::passive`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassiveOut {
    /// The failure that tipped it: `refused` or `unanswered`.
    pub cause: &'static str,
    /// In words: how many attempts failed within how long.
    pub detail: String,
    /// When (wall clock, for operators).
    pub at: SystemTime,
    /// When, by the checks' clock: a check that began before says nothing of it.
    pub since: Instant,
}

impl Default for State {
    fn default() -> Self {
        Self {
            up: true,
            rises: 0,
            falls: 0,
            checks: 0,
            last_error: None,
            history: VecDeque::new(),
            passive: None,
        }
    }
}

/// Transitions a backend's [`State::history`] keeps: enough to see a flapping backend's
/// pattern (four downs and four ups), small enough to cost nothing per backend.
pub const HISTORY: usize = 8;

/// A backend going up or down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    /// When the check that decided it ended (wall clock, for operators).
    pub at: SystemTime,
    /// The state it went to.
    pub up: bool,
    /// Why: for a fall, the failure that made it ([`Cause`]'s words); for a rise, "passed".
    pub cause: String,
    /// The failure's whole message (empty for a rise).
    pub detail: String,
}

impl Transition {
    /// As `/services` shows it: `at` (RFC 3339, UTC, seconds), `at_unix_ms`, `to` (`up` or
    /// `down`), `cause` and `detail`.
    pub fn to_json(&self) -> serde_json::Value {
        let ms = self
            .at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        serde_json::json!({
            "at": humantime::format_rfc3339_seconds(self.at).to_string(),
            "at_unix_ms": ms,
            "to": if self.up { "up" } else { "down" },
            "cause": self.cause,
            "detail": self.detail,
        })
    }
}

/// Why a check failed, in an operator's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The connection was refused (nothing listens).
    Refused,
    /// No answer within the check's timeout (connect or read).
    Timeout,
    /// The connection was reset or closed before an answer.
    Reset,
    /// No route to the backend (host or network unreachable).
    Unreachable,
    /// An HTTP answer with a status outside 200-399.
    HttpStatus(u16),
    /// An answer that is not HTTP.
    NotHttp,
    /// A `udp` check's reply that does not start with its `expect`.
    WrongReply,
    /// A `dns` check's answer with an rcode that says the server cannot serve the name.
    Rcode(dns::Rcode),
    /// Any other error (its message says which).
    Other,
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::Refused => f.write_str("refused"),
            Cause::Timeout => f.write_str("timeout"),
            Cause::Reset => f.write_str("reset"),
            Cause::Unreachable => f.write_str("unreachable"),
            Cause::HttpStatus(c) => write!(f, "HTTP status {c}"),
            Cause::NotHttp => f.write_str("not HTTP"),
            Cause::WrongReply => f.write_str("wrong reply"),
            Cause::Rcode(r) => write!(f, "{r}"),
            Cause::Other => f.write_str("error"),
        }
    }
}

impl Cause {
    /// The cause of an I/O error of a check's socket.
    fn of(e: &std::io::Error) -> Cause {
        use std::io::ErrorKind as K;
        match e.kind() {
            K::ConnectionRefused => Cause::Refused,
            K::TimedOut | K::WouldBlock => Cause::Timeout,
            K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof => {
                Cause::Reset
            }
            K::HostUnreachable | K::NetworkUnreachable => Cause::Unreachable,
            _ => Cause::Other,
        }
    }
}

/// A failed check: its [`Cause`] and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Why, in a word or two.
    pub cause: Cause,
    /// What happened, naming the address.
    pub detail: String,
}

impl Failure {
    fn io(what: String, e: &std::io::Error) -> Failure {
        Failure {
            cause: Cause::of(e),
            detail: format!("{what}: {e}"),
        }
    }
}

/// Shared view of every checked backend's state.
pub type States = Arc<Mutex<HashMap<BackendKey, State>>>;

/// Idle check threads kept for checks started later: enough for the endpoints a large
/// Service's rolling update replaces at once; above it a stopped check's thread ends. Each
/// costs its stack's touched pages (some tens of KiB) while parked.
pub const IDLE_MAX: usize = 64;

/// One check for a pooled thread to run until `stopped` disconnects; the thread drops `done`
/// when the check has ended, which [`Checker::stop`] waits for.
struct Job {
    key: BackendKey,
    check: HealthCheck,
    stopped: mpsc::Receiver<()>,
    done: Sender<()>,
}

/// A check thread, running a check or parked waiting for one.
struct Pooled {
    jobs: Sender<Job>,
    thread: JoinHandle<()>,
}

/// A running check.
struct Worker {
    check: HealthCheck,
    stop: Sender<()>,
    done: mpsc::Receiver<()>,
    pooled: Pooled,
}

/// Runs the checks of a configuration and follows its changes.
pub struct Checker {
    states: States,
    workers: HashMap<BackendKey, Worker>,
    idle: Vec<Pooled>,
    changed: Sender<BackendKey>,
}

impl std::fmt::Debug for Checker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checker")
            .field("backends", &self.workers.len())
            .finish()
    }
}

impl Checker {
    /// A checker that reports every state change (up/down) of a backend on `changed`.
    pub fn new(changed: Sender<BackendKey>) -> Self {
        Self {
            states: Arc::default(),
            workers: HashMap::new(),
            idle: Vec::new(),
            changed,
        }
    }

    /// The shared state map (for the admin API).
    pub fn states(&self) -> States {
        Arc::clone(&self.states)
    }

    /// Whether a backend is down. Backends without a health check are never down.
    pub fn is_down(&self, service: &str, addr: IpAddr, port: u16) -> bool {
        let states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        states
            .get(&BackendKey::new(service, addr, port))
            .is_some_and(|s| !s.up)
    }

    /// Passive health took `key` out of new flows for `cause` (`detail` in words): recorded
    /// in its history, and its first pass of a check that begins from now on is reported on
    /// the channel (then the core brings it back). Nothing for a backend not checked.
    pub fn passive_out(&self, key: &BackendKey, cause: &'static str, detail: String) {
        let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(s) = states.get_mut(key) else {
            return;
        };
        let at = SystemTime::now();
        push_history(
            s,
            Transition {
                at,
                up: false,
                cause: format!("passive: {cause}"),
                detail: detail.clone(),
            },
        );
        s.passive = Some(PassiveOut {
            cause,
            detail,
            at,
            since: Instant::now(),
        });
    }

    /// Starts checks for backends new in `cfg`, replaces those whose check changed (keeping
    /// their health) and stops those of backends that left. A backend whose check did not
    /// change keeps its thread and state.
    /// (The gateway's control core decides which checks run and says so one by one, with
    /// [`Checker::start`] and [`Checker::stop`].)
    pub fn sync(&mut self, cfg: &Config) {
        let mut want: HashMap<BackendKey, HealthCheck> = HashMap::new();
        for s in &cfg.services {
            if let Some(hc) = &s.health_check {
                for b in &s.backends {
                    want.insert(BackendKey::new(&s.name, b.address, b.port), hc.clone());
                }
            }
        }
        // Checks no longer wanted stop; changed ones are replaced by `start`, keeping health.
        let stale: Vec<BackendKey> = self
            .workers
            .keys()
            .filter(|k| !want.contains_key(*k))
            .cloned()
            .collect();
        for k in stale {
            self.stop(&k);
        }
        for (k, check) in want {
            self.start(k, check);
        }
    }

    /// Stops the check of `key` and forgets its state; nothing when none runs. Returns once
    /// the check has ended (a probe under way finishes first, within its timeout), so that
    /// no result of it is recorded afterwards.
    pub fn stop(&mut self, key: &BackendKey) {
        self.stop_taking(key);
    }

    /// [`Checker::stop`], returning the state the check ended with (its last result
    /// recorded, since the check has ended when the state is taken).
    fn stop_taking(&mut self, key: &BackendKey) -> Option<State> {
        if let Some(w) = self.workers.remove(key) {
            drop(w.stop);
            // Disconnected when the thread drops the job's `done`: the check has ended.
            let _ = w.done.recv();
            if self.idle.len() < IDLE_MAX {
                self.idle.push(w.pooled);
            } else {
                drop(w.pooled.jobs);
                let _ = w.pooled.thread.join();
            }
        }
        self.states
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key)
    }

    /// Starts checking `key` with `check`, from the up state, on an idle pooled thread or a
    /// new one. A check already running for `key` is left as it is when `check` is the same,
    /// and otherwise replaced by one that goes on from the backend's health (up or down, its
    /// history, a hold of passive health), counting rises and falls afresh: a reload that
    /// changes a check does not bring a down backend back.
    pub fn start(&mut self, key: BackendKey, check: HealthCheck) {
        let kept = match self.workers.get(&key) {
            Some(w) if w.check == check => return,
            Some(_) => self.stop_taking(&key).map(|s| State {
                rises: 0,
                falls: 0,
                ..s
            }),
            None => None,
        };
        self.states
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone(), kept.unwrap_or_default());
        let (stop, stopped) = mpsc::channel::<()>();
        let (done_tx, done) = mpsc::channel::<()>();
        let mut job = Job {
            key: key.clone(),
            check: check.clone(),
            stopped,
            done: done_tx,
        };
        let pooled = loop {
            let p = self.idle.pop().unwrap_or_else(|| self.spawn());
            match p.jobs.send(job) {
                Ok(()) => break p,
                // The thread has ended (a panic in a probe): take another.
                Err(mpsc::SendError(j)) => {
                    job = j;
                    let _ = p.thread.join();
                }
            }
        };
        self.workers.insert(
            key,
            Worker {
                check,
                stop,
                done,
                pooled,
            },
        );
    }

    /// A new check thread, parked until it is given a job.
    fn spawn(&self) -> Pooled {
        let (jobs, queue) = mpsc::channel::<Job>();
        let (states, changed) = (Arc::clone(&self.states), self.changed.clone());
        let thread = thread::Builder::new()
            .name("health".into())
            .spawn(move || {
                for job in queue {
                    run(&states, &changed, job);
                }
            })
            .expect("spawning a health-check thread");
        Pooled { jobs, thread }
    }
}

/// Runs one check until it is stopped.
fn run(states: &States, changed: &Sender<BackendKey>, job: Job) {
    let Job {
        key,
        check,
        stopped,
        done,
    } = job;
    let addr = SocketAddr::new(key.address, check.port.unwrap_or(key.port));
    loop {
        let started = Instant::now();
        let result = check_once(&check, addr);
        let passed = result.is_ok();
        let mut report = record(states, &key, &check, result, SystemTime::now());
        report |= passed && passive_back(states, &key, started, SystemTime::now());
        if report {
            let _ = changed.send(key.clone());
        }
        let jitter = 0.9 + fastrand::f64() * 0.2;
        match stopped.recv_timeout(check.interval.mul_f64(jitter)) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => break,
        }
    }
    drop(done);
}

impl Drop for Checker {
    fn drop(&mut self) {
        for (_, w) in self.workers.drain() {
            drop(w.stop);
            drop(w.pooled.jobs);
            let _ = w.pooled.thread.join();
        }
        for p in self.idle.drain(..) {
            drop(p.jobs);
            let _ = p.thread.join();
        }
    }
}

/// A check of `key` that began at `started` passed, at `now`: whether that ends a hold of
/// passive health ([`State::passive`]) set before the check began (then the return to new
/// flows is added to its history, unless the check's own rise just added it).
fn passive_back(states: &States, key: &BackendKey, started: Instant, now: SystemTime) -> bool {
    let mut states = states.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(s) = states.get_mut(key) else {
        return false;
    };
    if s.passive.as_ref().is_none_or(|p| started < p.since) {
        return false;
    }
    s.passive = None;
    if s.up && !s.history.back().is_some_and(|t| t.up) {
        push_history(
            s,
            Transition {
                at: now,
                up: true,
                cause: "passed".into(),
                detail: String::new(),
            },
        );
    }
    true
}

/// Adds `t` to the backend's history, dropping the oldest beyond [`HISTORY`].
fn push_history(s: &mut State, t: Transition) {
    if s.history.len() == HISTORY {
        s.history.pop_front();
    }
    s.history.push_back(t);
}

/// Applies one check result, ended at `now`; returns whether the backend changed state (and
/// then adds the transition to its history).
fn record(
    states: &States,
    key: &BackendKey,
    hc: &HealthCheck,
    result: Result<(), Failure>,
    now: SystemTime,
) -> bool {
    let mut states = states.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(s) = states.get_mut(key) else {
        return false;
    };
    s.checks += 1;
    let was = s.up;
    match result {
        Ok(()) => {
            s.last_error = None;
            s.falls = 0;
            if !s.up {
                s.rises += 1;
                if s.rises >= hc.rise {
                    s.up = true;
                    s.rises = 0;
                }
            }
        }
        Err(e) => {
            s.rises = 0;
            if s.up {
                s.falls += 1;
                if s.falls >= hc.fall {
                    s.up = false;
                    s.falls = 0;
                    if s.history.len() == HISTORY {
                        s.history.pop_front();
                    }
                    s.history.push_back(Transition {
                        at: now,
                        up: false,
                        cause: e.cause.to_string(),
                        detail: e.detail.clone(),
                    });
                }
            }
            s.last_error = Some(e.detail);
        }
    }
    if s.up && !was {
        if s.history.len() == HISTORY {
            s.history.pop_front();
        }
        s.history.push_back(Transition {
            at: now,
            up: true,
            cause: "passed".into(),
            detail: String::new(),
        });
    }
    s.up != was
}

/// One check of `addr`.
///
/// # Errors
/// A short description of what failed.
pub fn probe(hc: &HealthCheck, addr: SocketAddr) -> Result<(), String> {
    check_once(hc, addr).map_err(|f| f.detail)
}

/// One check of `addr` by its kind, with the failure's [`Cause`] taken from what happened
/// (the socket's error, the reply), never from the message, which holds names an operator
/// chose (a DNS query, a path).
///
/// # Errors
/// What failed, and why in a word.
pub fn check_once(hc: &HealthCheck, addr: SocketAddr) -> Result<(), Failure> {
    let named = |what: &str, f: Failure| Failure {
        cause: f.cause,
        detail: format!("{what}: {}", f.detail),
    };
    match &hc.kind {
        HealthKind::Tcp | HealthKind::Http { .. } => stream_probe(hc, addr),
        HealthKind::Udp { payload, expect } => {
            let what = format!("udp {addr}");
            let mut buf = [0u8; REPLY_MAX];
            let reply = exchange(addr, hc.timeout, payload, &mut buf, |_| true)
                .map_err(|f| named(&what, f))?;
            match expect {
                Some(e) if !reply.starts_with(e) => Err(Failure {
                    cause: Cause::WrongReply,
                    detail: format!(
                        "{what}: wrong reply ({} bytes, not starting with the {} expected)",
                        reply.len(),
                        e.len()
                    ),
                }),
                _ => Ok(()),
            }
        }
        HealthKind::Dns { query, qtype } => {
            let q = dns::query(fastrand::u16(..), query, *qtype);
            let mut buf = [0u8; REPLY_MAX];
            let what = format!("dns {query} {qtype} at {addr}");
            let reply = exchange(addr, hc.timeout, &q, &mut buf, |r| {
                dns::verdict(&q, r) != dns::Verdict::Foreign
            })
            .map_err(|f| named(&what, f))?;
            match dns::verdict(&q, reply) {
                dns::Verdict::Failed(rcode) => Err(Failure {
                    cause: Cause::Rcode(rcode),
                    detail: format!("{what}: {rcode}"),
                }),
                _ => Ok(()),
            }
        }
    }
}

/// The largest datagram a UDP or DNS check reads: a DNS answer over UDP without EDNS is
/// at most 512 bytes, an echo at most [`HealthCheck::MAX_PAYLOAD`].
const REPLY_MAX: usize = 2048;

/// Sends `payload` to `addr` from a connected socket of its own (a fresh port, so a late
/// reply to an earlier check never counts) and returns the first reply `wanted` takes,
/// within `timeout`. A connected UDP socket is told of an ICMP port unreachable as
/// `ECONNREFUSED`: that ends the check at once.
fn exchange<'b>(
    addr: SocketAddr,
    timeout: Duration,
    payload: &[u8],
    buf: &'b mut [u8],
    wanted: impl Fn(&[u8]) -> bool,
) -> Result<&'b [u8], Failure> {
    let unspecified: SocketAddr = if addr.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let refused = || Failure {
        cause: Cause::Refused,
        detail: "refused (ICMP port unreachable)".to_owned(),
    };
    let sock = UdpSocket::bind(unspecified).map_err(|e| Failure::io("bind".into(), &e))?;
    sock.connect(addr)
        .map_err(|e| Failure::io("connect".into(), &e))?;
    match sock.send(payload) {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => return Err(refused()),
        Err(e) => return Err(Failure::io("send".into(), &e)),
    }
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Failure {
                cause: Cause::Timeout,
                detail: format!("timeout (no reply within {timeout:?})"),
            });
        }
        sock.set_read_timeout(Some(left))
            .map_err(|e| Failure::io("set_read_timeout".into(), &e))?;
        match sock.recv(buf) {
            Ok(n) if wanted(&buf[..n]) => return Ok(&buf[..n]),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => return Err(refused()),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err(Failure::io("recv".into(), &e)),
        }
    }
}

/// A TCP connect, then for `http` a GET.
fn stream_probe(hc: &HealthCheck, addr: SocketAddr) -> Result<(), Failure> {
    let mut stream = TcpStream::connect_timeout(&addr, hc.timeout)
        .map_err(|e| Failure::io(format!("connect {addr}"), &e))?;
    let HealthKind::Http { path } = &hc.kind else {
        return Ok(());
    };
    let other = |e: std::io::Error| Failure::io(format!("socket to {addr}"), &e);
    stream.set_read_timeout(Some(hc.timeout)).map_err(other)?;
    stream.set_write_timeout(Some(hc.timeout)).map_err(other)?;
    let host = match addr {
        SocketAddr::V4(a) => a.to_string(),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    };
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: strait-health\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(req.as_bytes())
        .map_err(|e| Failure::io(format!("send to {addr}"), &e))?;
    let mut head = [0u8; 32];
    let mut got = 0;
    while got < 12 {
        match stream.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => return Err(Failure::io(format!("read from {addr}"), &e)),
        }
    }
    if got == 0 {
        return Err(Failure {
            cause: Cause::Reset,
            detail: format!("GET {path} on {addr}: closed without an answer"),
        });
    }
    let line = String::from_utf8_lossy(&head[..got]);
    let status: Option<u16> = line
        .strip_prefix("HTTP/1.")
        .and_then(|r| r.get(2..5))
        .and_then(|c| c.parse().ok());
    match status {
        Some(c) if (200..400).contains(&c) => Ok(()),
        Some(c) => Err(Failure {
            cause: Cause::HttpStatus(c),
            detail: format!("GET {path} on {addr}: status {c}"),
        }),
        None => Err(Failure {
            cause: Cause::NotHttp,
            detail: format!("GET {path} on {addr}: not an HTTP response"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicU16, Ordering};
    use strait_testkit::config::{GatewayToml, ServiceToml};
    use strait_testkit::harness::{free_addr, Transport};

    fn hc(kind: HealthKind) -> HealthCheck {
        HealthCheck {
            kind,
            port: None,
            interval: Duration::from_millis(20),
            timeout: Duration::from_millis(200),
            rise: 2,
            fall: 3,
        }
    }

    /// A real HTTP server on loopback answering every request with `status`.
    fn server(status: Arc<AtomicU16>) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let mut buf = [0u8; 512];
                let _ = c.read(&mut buf);
                let code = status.load(Ordering::Relaxed);
                let _ = write!(
                    c,
                    "HTTP/1.1 {code} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
            }
        });
        addr
    }

    #[test]
    fn a_pass_after_a_passive_verdict_is_reported_and_ends_it() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, changed) = mpsc::channel();
        let mut checker = Checker::new(tx);
        let key = BackendKey::new("web", addr.ip(), addr.port());
        checker.start(key.clone(), hc(HealthKind::Tcp));
        // Up all along: no report.
        assert!(changed.recv_timeout(Duration::from_millis(100)).is_err());
        checker.passive_out(
            &key,
            "refused",
            "3 connection attempts refused within 1s".into(),
        );
        let states = checker.states();
        let held = states.lock().unwrap()[&key].passive.clone();
        assert_eq!(held.map(|p| p.cause), Some("refused"));
        // The next check (20 ms later) passes: reported, and the hold ends.
        assert_eq!(
            changed.recv_timeout(Duration::from_secs(2)),
            Ok(key.clone())
        );
        let s = states.lock().unwrap()[&key].clone();
        assert!(s.up && s.passive.is_none());
        let t: Vec<(bool, &str)> = s.history.iter().map(|t| (t.up, t.cause.as_str())).collect();
        assert_eq!(t, [(false, "passive: refused"), (true, "passed")]);
        // Once: later passes report nothing.
        assert!(changed.recv_timeout(Duration::from_millis(100)).is_err());
        checker.stop(&key);
        drop(l);
    }

    #[test]
    fn probes_tcp_and_http() {
        let status = Arc::new(AtomicU16::new(200));
        let addr = server(Arc::clone(&status));
        assert_eq!(probe(&hc(HealthKind::Tcp), addr), Ok(()));
        let http = hc(HealthKind::Http {
            path: "/healthz".into(),
        });
        assert_eq!(probe(&http, addr), Ok(()));
        status.store(503, Ordering::Relaxed);
        assert!(probe(&http, addr).unwrap_err().contains("status 503"));
        // Nothing listens on a freshly closed port.
        let closed = free_addr(Transport::Tcp);
        assert!(probe(&hc(HealthKind::Tcp), closed).is_err());
    }

    #[test]
    fn probes_udp_on_loopback() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let echo = server.try_clone().unwrap();
        let serving = thread::spawn(move || {
            let mut buf = [0u8; 64];
            let (n, from) = echo.recv_from(&mut buf).unwrap();
            echo.send_to(&buf[..n], from).unwrap();
        });
        let udp = |expect: Option<&[u8]>| {
            hc(HealthKind::Udp {
                payload: b"ping".to_vec(),
                expect: expect.map(<[u8]>::to_vec),
            })
        };
        assert_eq!(probe(&udp(Some(b"pi")), addr), Ok(()));
        serving.join().unwrap();
        // Bound, read by nobody: silence.
        let e = probe(&udp(None), addr).unwrap_err();
        assert!(e.contains("timeout"), "{e}");
        drop(server);
        strait_testkit::harness::wait_port_closed(addr.port());
        let e = probe(&udp(None), addr).unwrap_err();
        assert!(e.contains("refused"), "{e}");
    }

    #[test]
    fn a_failure_s_cause_comes_from_what_happened_not_from_its_words() {
        // A DNS server that answers REFUSED, asked a name holding "timeout" and "refused".
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let answering = thread::spawn(move || {
            let mut buf = [0u8; 512];
            let (n, from) = server.recv_from(&mut buf).unwrap();
            buf[2] |= 0x80; // a response
            buf[3] = (buf[3] & 0xf0) | 5; // REFUSED
            server.send_to(&buf[..n], from).unwrap();
        });
        let check = hc(HealthKind::Dns {
            query: "timeout.refused.example.org".into(),
            qtype: strait_config::model::DnsType::A,
        });
        let f = check_once(&check, addr).unwrap_err();
        answering.join().unwrap();
        assert_eq!(f.cause, Cause::Rcode(dns::Rcode(5)), "{f:?}");
        assert_eq!(f.cause.to_string(), "rcode 5 (REFUSED)");
        assert_eq!(
            f.detail,
            format!("dns timeout.refused.example.org A at {addr}: rcode 5 (REFUSED)")
        );
        // A udp check's wrong reply is its own cause.
        let echo = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = echo.local_addr().unwrap();
        let echoing = thread::spawn(move || {
            let mut buf = [0u8; 64];
            let (n, from) = echo.recv_from(&mut buf).unwrap();
            echo.send_to(&buf[..n], from).unwrap();
        });
        let udp = hc(HealthKind::Udp {
            payload: b"timeout".to_vec(),
            expect: Some(b"pong".to_vec()),
        });
        let f = check_once(&udp, addr).unwrap_err();
        echoing.join().unwrap();
        assert_eq!(f.cause, Cause::WrongReply, "{f:?}");
    }

    #[test]
    fn rise_and_fall_count_consecutive_results() {
        let states: States = Arc::default();
        let key = BackendKey::new("web", "127.0.0.1".parse().unwrap(), 80);
        states.lock().unwrap().insert(key.clone(), State::default());
        let h = hc(HealthKind::Tcp);
        let now = SystemTime::UNIX_EPOCH;
        let bad = || {
            Err(Failure {
                cause: Cause::Refused,
                detail: "x".into(),
            })
        };
        let rec = |r| record(&states, &key, &h, r, now);
        assert!(!rec(bad()));
        assert!(!rec(bad()));
        assert!(!rec(Ok(())), "a success resets the fall count");
        assert!(!rec(bad()));
        assert!(!rec(bad()));
        assert!(rec(bad()), "third consecutive failure: down");
        assert!(!states.lock().unwrap()[&key].up);
        assert!(!rec(Ok(())));
        assert!(rec(Ok(())), "second consecutive success: up");
        assert!(states.lock().unwrap()[&key].up);
    }

    #[test]
    fn history_keeps_the_last_transitions_with_their_cause() {
        let states: States = Arc::default();
        let key = BackendKey::new("web", "127.0.0.1".parse().unwrap(), 80);
        states.lock().unwrap().insert(key.clone(), State::default());
        let h = HealthCheck {
            rise: 1,
            fall: 1,
            ..hc(HealthKind::Tcp)
        };
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let fail = |c: Cause| {
            Err(Failure {
                cause: c,
                detail: format!("because {c}"),
            })
        };
        // Ten flaps: down (cause varies) and up, one second apart.
        let causes = [
            Cause::Refused,
            Cause::Timeout,
            Cause::HttpStatus(503),
            Cause::Reset,
        ];
        for i in 0..10u64 {
            let c = causes[i as usize % causes.len()];
            assert!(record(&states, &key, &h, fail(c), at(2 * i)));
            // A second failure while down is no transition.
            assert!(!record(&states, &key, &h, fail(Cause::Other), at(2 * i)));
            assert!(record(&states, &key, &h, Ok(()), at(2 * i + 1)));
        }
        let st = states.lock().unwrap()[&key].clone();
        assert_eq!(st.history.len(), HISTORY, "bounded");
        // The last 8 of 20 transitions: flaps 6 to 9, each down then up.
        let got: Vec<(u64, bool, &str)> = st
            .history
            .iter()
            .map(|t| {
                let s =
                    t.at.duration_since(SystemTime::UNIX_EPOCH)
                        .unwrap()
                        .as_secs();
                (s, t.up, t.cause.as_str())
            })
            .collect();
        assert_eq!(
            got,
            [
                (12, false, "HTTP status 503"),
                (13, true, "passed"),
                (14, false, "reset"),
                (15, true, "passed"),
                (16, false, "refused"),
                (17, true, "passed"),
                (18, false, "timeout"),
                (19, true, "passed"),
            ]
        );
        assert_eq!(st.history[0].detail, "because HTTP status 503");
    }

    #[test]
    fn checks_name_the_cause_of_a_failure() {
        let status = Arc::new(AtomicU16::new(503));
        let addr = server(Arc::clone(&status));
        let http = hc(HealthKind::Http {
            path: "/healthz".into(),
        });
        assert_eq!(
            check_once(&http, addr).unwrap_err().cause,
            Cause::HttpStatus(503)
        );
        let closed = free_addr(Transport::Tcp);
        assert_eq!(
            check_once(&hc(HealthKind::Tcp), closed).unwrap_err().cause,
            Cause::Refused
        );
        // A server that accepts and never answers: the read times out.
        let mute = TcpListener::bind("127.0.0.1:0").unwrap();
        let f = check_once(&http, mute.local_addr().unwrap()).unwrap_err();
        assert_eq!(f.cause, Cause::Timeout, "{f:?}");
        // One that closes at once.
        let rude = TcpListener::bind("127.0.0.1:0").unwrap();
        let raddr = rude.local_addr().unwrap();
        thread::spawn(move || {
            for c in rude.incoming().flatten() {
                drop(c);
            }
        });
        let f = check_once(&http, raddr).unwrap_err();
        assert_eq!(f.cause, Cause::Reset, "{f:?}");
    }

    #[test]
    fn checker_follows_a_real_server_going_away_and_back() {
        let status = Arc::new(AtomicU16::new(200));
        let addr = server(Arc::clone(&status));
        let web = ServiceToml::new("web", "203.0.113.10", 80)
            .mode("nat")
            .set(
                "health_check",
                r#"{ kind = "http", path = "/healthz", interval = "50ms", timeout = "40ms" }"#,
            )
            .backend("198.51.100.11", addr.port());
        let mut cfg = strait_config::parse(&GatewayToml::eth0().service(web).to_string()).unwrap();
        // The server is on this test's loopback, which a configuration file refuses as a
        // backend (no packet from the wire reaches it); the checker takes the model as is.
        cfg.services[0].backends[0].address = addr.ip();
        let (tx, rx) = mpsc::channel();
        let mut c = Checker::new(tx);
        c.sync(&cfg);
        assert!(!c.is_down("web", addr.ip(), addr.port()));
        status.store(500, Ordering::Relaxed);
        let k = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("a down event");
        assert_eq!(k, BackendKey::new("web", addr.ip(), addr.port()));
        assert!(c.is_down("web", addr.ip(), addr.port()));
        // A reload that changes the check: the backend stays down under the new one.
        let mut slower = cfg.clone();
        let hc = slower.services[0].health_check.as_mut().unwrap();
        hc.interval = Duration::from_millis(60);
        c.sync(&slower);
        assert!(
            c.is_down("web", addr.ip(), addr.port()),
            "a changed check keeps down"
        );
        let fell = c.states().lock().unwrap()[&k].history.len();
        assert_eq!(fell, 1, "its history too");
        status.store(200, Ordering::Relaxed);
        rx.recv_timeout(Duration::from_secs(5))
            .expect("an up event");
        assert!(!c.is_down("web", addr.ip(), addr.port()));
        // A config without the backend stops its check and forgets it.
        let mut empty = cfg.clone();
        empty.services[0].backends.clear();
        c.sync(&empty);
        assert!(c.states().lock().unwrap().is_empty());
    }
    #[test]
    fn a_stopped_checks_thread_runs_the_next_check() {
        let status = Arc::new(AtomicU16::new(200));
        let addr = server(Arc::clone(&status));
        let (tx, _rx) = mpsc::channel();
        let mut c = Checker::new(tx);
        let key = |i: u16| BackendKey::new("web", addr.ip(), 10_000 + i);
        let check = HealthCheck {
            port: Some(addr.port()),
            ..hc(HealthKind::Tcp)
        };
        c.start(key(0), check.clone());
        let first = c.workers[&key(0)].pooled.thread.thread().id();
        // Endpoints replaced one by one, as a churning EndpointSlice does: one thread serves
        // them all, each check from a fresh state, and a stopped check records nothing more.
        for i in 1..50 {
            c.stop(&key(i - 1));
            assert_eq!(c.idle.len(), 1);
            c.start(key(i), check.clone());
            assert!(c.idle.is_empty());
            assert_eq!(c.workers[&key(i)].pooled.thread.thread().id(), first);
            assert_eq!(c.states().lock().unwrap().len(), 1);
        }
        let t = std::time::Instant::now();
        while c.states().lock().unwrap()[&key(49)].checks < 2 {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the pooled thread checks"
            );
            thread::sleep(Duration::from_millis(10));
        }
        // Beyond IDLE_MAX idle threads, a stopped check's thread ends.
        for i in 100..100 + IDLE_MAX as u16 + 3 {
            c.start(key(i), check.clone());
        }
        for i in 100..100 + IDLE_MAX as u16 + 3 {
            c.stop(&key(i));
        }
        assert_eq!(c.idle.len(), IDLE_MAX);
        drop(c);
    }
}
