//! `strait status`: the running gateway's `/services`, `/traffic` and `/routes`, as tables;
//! `strait drain`, which asks it to drain and waits until it stopped; and `strait explain`,
//! its `/explain` as a block ([`crate::explain::render`]).
//!
//! For an incident, plain `strait status` shows beside the services and backends each
//! backend's last health transitions (when, and why: refused, timeout, HTTP status N...),
//! each service's traffic per second over [`Show::interval`] (two samples of `/traffic` that
//! far apart), and each worker's flow-table occupancy. `--stats` shows the totals per service
//! and backend since the start, `--rate` the same per second, as `ipvsadm -L -n --stats` and
//! `--rate` do.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::Value;

/// Where a running gateway's admin API is, and the token to present, if any.
#[derive(Debug, Clone)]
pub struct Admin {
    /// Its TCP address (`gateway.admin_listen`).
    pub addr: SocketAddr,
    /// Its Unix socket (`gateway.admin_socket`), used instead of `addr` when given.
    pub socket: Option<PathBuf>,
    /// A file holding the token (`gateway.admin_token_file`), sent as
    /// `Authorization: Bearer`.
    pub token_file: Option<PathBuf>,
}

impl Admin {
    /// The admin API at `addr`, over TCP, without a token.
    pub fn tcp(addr: SocketAddr) -> Self {
        Self {
            addr,
            socket: None,
            token_file: None,
        }
    }

    fn name(&self) -> String {
        match &self.socket {
            Some(p) => p.display().to_string(),
            None => self.addr.to_string(),
        }
    }

    /// Whether it answers a connection at all.
    fn reachable(&self) -> bool {
        match &self.socket {
            Some(p) => UnixStream::connect(p).is_ok(),
            None => TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok(),
        }
    }

    pub(crate) fn request(&self, method: &str, path: &str) -> anyhow::Result<String> {
        let auth = match &self.token_file {
            None => String::new(),
            Some(f) => {
                let t = std::fs::read_to_string(f)
                    .with_context(|| format!("reading the token file {}", f.display()))?;
                format!("Authorization: Bearer {}\r\n", t.trim())
            }
        };
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: strait\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let mut out = String::new();
        let hint = || {
            format!("no gateway admin API at {} (is `strait run` running, and is this its admin_listen or admin_socket?)", self.name())
        };
        match &self.socket {
            Some(p) => {
                let mut c = UnixStream::connect(p).with_context(hint)?;
                c.set_read_timeout(Some(Duration::from_secs(35)))?;
                c.write_all(req.as_bytes())?;
                c.read_to_string(&mut out)?;
            }
            None => {
                let mut c = TcpStream::connect_timeout(&self.addr, Duration::from_secs(3))
                    .with_context(hint)?;
                c.set_read_timeout(Some(Duration::from_secs(35)))?;
                c.write_all(req.as_bytes())?;
                c.read_to_string(&mut out)?;
            }
        }
        let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
        if !head.starts_with("HTTP/1.1 200") {
            bail!(
                "{method} {path}: {}: {}",
                head.lines().next().unwrap_or("no answer"),
                body.trim()
            );
        }
        Ok(body.to_string())
    }
}

/// What `strait status` shows.
#[derive(Debug, Clone, Copy)]
pub struct Show {
    /// Totals per service and backend (`--stats`) instead of the overview.
    pub stats: bool,
    /// Rates per service and backend (`--rate`) instead of the overview.
    pub rate: bool,
    /// Between the two samples a rate is measured over.
    pub interval: Duration,
}

impl Default for Show {
    fn default() -> Self {
        Self {
            stats: false,
            rate: false,
            interval: Duration::from_secs(1),
        }
    }
}

impl Admin {
    fn json(&self, path: &str) -> anyhow::Result<Value> {
        let body = self.request("GET", path)?;
        serde_json::from_str(&body).with_context(|| {
            format!("GET {path}: the admin API answered something that is not JSON")
        })
    }

    /// Two samples of `/traffic`, `interval` apart, and the time between them.
    fn two_samples(&self, interval: Duration) -> anyhow::Result<(Value, Value, Duration)> {
        let a = self.json("/traffic")?;
        let t = std::time::Instant::now();
        std::thread::sleep(interval);
        let b = self.json("/traffic")?;
        Ok((a, b, t.elapsed()))
    }
}

/// Fetches `/services`, `/traffic` and `/routes` from the admin API and renders them as
/// `show` says.
///
/// # Errors
/// When the gateway does not answer or answers something else than the JSON it serves.
pub fn run(admin: &Admin, show: Show) -> anyhow::Result<()> {
    if show.stats {
        let t = admin.json("/traffic")?;
        out(&render_stats(&t))?;
        out(&render_cores(&t))?;
        return Ok(());
    }
    if show.rate {
        let (a, b, dt) = admin.two_samples(show.interval)?;
        out(&render_rates(&a, &b, dt, true))?;
        return Ok(());
    }
    let v = admin.json("/services")?;
    out(&render(&v))?;
    out(&render_transitions(&v))?;
    match admin.two_samples(show.interval) {
        Ok((a, b, dt)) => {
            out(&render_rates(&a, &b, dt, false))?;
            out(&render_cores(&b))?;
        }
        // A gateway from before `/traffic` has none to show.
        Err(e) => eprintln!("traffic: {e:#}"),
    }
    match admin.request("GET", "/routes") {
        Ok(body) => {
            let r: Value = serde_json::from_str(&body)
                .context("the admin API answered something that is not JSON")?;
            out(&render_routes(&r))?;
        }
        // A gateway from before `/routes` has none to show.
        Err(e) => eprintln!("routes: {e:#}"),
    }
    Ok(())
}

/// A command line's duration (`1s`, `500ms`) that must be longer than zero: a rate over no
/// time, or a capture that ends as it starts, is a mistake to name.
///
/// # Errors
/// When `s` is not a duration or is zero.
pub fn positive_duration(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Err("must be longer than zero".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

/// Writes `text` to standard output. A reader that left (`strait status | head`) ends the
/// command quietly, with success, as it ends other Unix tools, where `print!` would panic.
///
/// # Errors
/// When standard output fails otherwise.
pub fn out(text: &str) -> anyhow::Result<()> {
    let mut o = std::io::stdout().lock();
    match o.write_all(text.as_bytes()).and_then(|()| o.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        r => r.context("writing to standard output"),
    }
}

/// `strait drain`: asks the gateway to drain (withdraw its routes, forward for its grace,
/// stop), then waits until it stopped, at most `wait`.
///
/// # Errors
/// When the gateway does not answer or refuses, or is still running after `wait`.
pub fn drain(admin: &Admin, wait: Duration) -> anyhow::Result<()> {
    let answer = admin.request("POST", "/drain")?;
    out(&answer)?;
    // When the gateway's process is one this command sees (a Unix socket or a loopback
    // address, and its pid a running `strait` here), it is stopped when it has exited: its
    // admin API closes before the workers and XDP are done. Otherwise (another machine, a
    // forwarded port, another pid namespace) the admin API closing is all there is to see.
    let pid = drain_pid(&answer)
        .filter(|_| admin.socket.is_some() || admin.addr.ip().is_loopback())
        .filter(|&pid| running(pid));
    let deadline = std::time::Instant::now() + wait;
    while std::time::Instant::now() < deadline {
        let stopped = match pid {
            Some(pid) => !running(pid),
            None => !admin.reachable(),
        };
        if stopped {
            out(if pid.is_some() {
                "stopped\n"
            } else {
                "stopped: the admin API closed\n"
            })?;
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "the gateway at {} is still running after {wait:?}",
        admin.name()
    )
}

/// The gateway's pid in its answer to `POST /drain` (`... then stopping (pid 1234)`).
fn drain_pid(answer: &str) -> Option<u32> {
    let (_, rest) = answer.rsplit_once("(pid ")?;
    rest.split(')').next()?.trim().parse().ok()
}

/// Whether process `pid` is a gateway that has not exited: `/proc/PID` is a `strait` that is
/// not a zombie (exited, not yet reaped by its parent).
fn running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `PID (COMM) STATE ...`; COMM may hold spaces and parentheses, so the last `)` ends it.
    let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
        return false;
    };
    let comm = &stat[open + 1..close];
    let state = stat[close + 1..].split_whitespace().next();
    comm == "strait" && state != Some("Z")
}

/// `strait explain`: asks the gateway and prints its answer, as a block for a person or as
/// the JSON (`json`).
///
/// # Errors
/// When the gateway does not answer, refuses the query, or answers something that is not
/// the JSON it serves.
pub fn explain(
    admin: &Admin,
    client: &str,
    vip: &str,
    proto: &str,
    json_out: bool,
) -> anyhow::Result<()> {
    let enc = |s: &str| s.replace('[', "%5B").replace(']', "%5D");
    let path = format!(
        "/explain?client={}&vip={}&proto={}",
        enc(client),
        enc(vip),
        enc(proto)
    );
    let body = admin.request("GET", &path)?;
    let v: Value =
        serde_json::from_str(&body).context("the admin API answered something that is not JSON")?;
    if json_out {
        out(&(serde_json::to_string_pretty(&v)? + "\n"))?;
    } else {
        out(&crate::explain::render(&v))?;
    }
    Ok(())
}

/// A table for a terminal: each column as wide as its widest cell, and at least its
/// minimum (so that the tables of different gateways line up); columns marked right-aligned
/// (numbers) to the right. A row may end early with a note in the column it reaches,
/// printed as it is and not counted in that column's width.
struct Table {
    head: Vec<(&'static str, usize, bool)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Columns as (title, minimum width, right-aligned).
    fn new(head: &[(&'static str, usize, bool)]) -> Self {
        Self {
            head: head.to_vec(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn render(&self) -> String {
        let n = self.head.len();
        let mut width: Vec<usize> = self.head.iter().map(|&(t, w, _)| w.max(t.len())).collect();
        for r in self.rows.iter().filter(|r| r.len() == n) {
            for (w, c) in width.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cells: &[&str]| {
            let mut l = String::new();
            for (k, c) in cells.iter().enumerate() {
                let (w, right) = (width[k], self.head[k].2);
                let last = k + 1 == cells.len();
                l += &match (right, last && cells.len() < n) {
                    (_, true) => c.to_string(),
                    (true, false) => format!("{c:>w$} "),
                    (false, false) => format!("{c:<w$} "),
                };
            }
            l.trim_end().to_owned() + "\n"
        };
        let mut out = line(&self.head.iter().map(|h| h.0).collect::<Vec<_>>());
        for r in &self.rows {
            out += &line(&r.iter().map(String::as_str).collect::<Vec<_>>());
        }
        out
    }
}

/// The table `strait status` prints.
pub fn render(v: &Value) -> String {
    let mut table = Table::new(&[
        ("SERVICE", 20, false),
        ("FRONTEND", 28, false),
        ("MODE", 9, false),
        ("HEALTHY", 8, false),
        ("BACKEND", 28, false),
        ("WEIGHT", 6, true),
        ("STATE", 9, false),
        ("HEALTH", 9, false),
        ("NEXT HOP", 0, false),
    ]);
    let empty = Vec::new();
    for s in v["services"].as_array().unwrap_or(&empty) {
        let service = [
            s["name"].as_str().unwrap_or("?").to_owned(),
            format!(
                "{}:{}/{}",
                fmt_ip(&s["vip"]),
                s["port"],
                s["protocol"].as_str().unwrap_or("?")
            ),
            s["mode"].as_str().unwrap_or("?").to_owned(),
            if s["healthy"].as_bool() == Some(true) {
                "yes"
            } else {
                "NO"
            }
            .to_owned(),
        ];
        let backends = s["backends"].as_array().unwrap_or(&empty);
        if backends.is_empty() {
            let mut row = service.to_vec();
            row.push("(no backends)".into());
            table.row(row);
        }
        for (i, b) in backends.iter().enumerate() {
            let mut row = if i == 0 {
                service.to_vec()
            } else {
                vec![String::new(); 4]
            };
            row.extend([
                format!("{}:{}", fmt_ip(&b["address"]), b["port"]),
                match &b["slow_start_weight"] {
                    Value::Number(now) => format!("{now}/{}", b["weight"]),
                    _ => b["weight"].to_string(),
                },
                b["state"].as_str().unwrap_or("?").to_owned(),
                health_cell(b),
                match &b["next_hop_mac"] {
                    Value::String(m) => m.clone(),
                    Value::Null if b.get("next_hop_mac").is_some() => "unresolved".into(),
                    // A gateway from before the field.
                    _ => "-".into(),
                },
            ]);
            table.row(row);
        }
    }
    format!("table generation {}\n{}", v["generation"], table.render())
}

/// A backend's health as `strait status` shows it: the active check's word, and when its
/// health keeps it from new flows, by what and why: `down (active: timeout)`,
/// `out (passive: refused)`.
fn health_cell(b: &Value) -> String {
    let health = b["health"].as_str().unwrap_or("?");
    let out = &b["out"];
    match (out["by"].as_str(), out["cause"].as_str()) {
        (Some("passive"), Some(cause)) => format!("out (passive: {cause})"),
        (Some(by), Some(cause)) if !cause.is_empty() => format!("{health} ({by}: {cause})"),
        _ => health.to_owned(),
    }
}

/// The routes part of `strait status`: the BGP sessions, then each VIP's route.
pub fn render_routes(v: &Value) -> String {
    let mut out = String::new();
    let empty = Vec::new();
    if v["draining"].as_bool() == Some(true) {
        out += "DRAINING: every route withdrawn; the gateway stops after its grace\n";
    }
    if let Value::Object(_) = &v["l2"] {
        let l = &v["l2"];
        let owned: Vec<&str> = l["owned"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .filter_map(Value::as_str)
            .collect();
        out += &format!(
            "l2: keepalived {}, owner of {} of {} VIPs: {}\n",
            if l["running"].as_bool() == Some(true) {
                "running".to_owned()
            } else {
                format!("NOT RUNNING ({})", l["error"].as_str().unwrap_or("no VIPs"))
            },
            owned.len(),
            l["vips"],
            if owned.is_empty() {
                "-".to_owned()
            } else {
                owned.join(", ")
            }
        );
    }
    match &v["bgp"] {
        Value::Null if v["l2"].is_object() => {}
        Value::Null => out += "bgp: not configured (no [gateway.bgp])\n",
        b => {
            let daemon = if b["running"].as_bool() == Some(true) {
                "running".to_owned()
            } else {
                format!("NOT RUNNING ({})", b["error"].as_str().unwrap_or("?"))
            };
            out += &format!(
                "bgp: speaker {daemon}, {} routes announced, {} restarts\n",
                b["announced"], b["restarts"]
            );
            let mut peers = Table::new(&[
                ("PEER", 28, false),
                ("ASN", 10, true),
                ("UP", 5, false),
                ("STATE", 0, false),
            ]);
            for s in b["sessions"].as_array().unwrap_or(&empty) {
                peers.row(vec![
                    s["peer"].as_str().unwrap_or("?").to_owned(),
                    s["asn"].to_string(),
                    if s["up"].as_bool() == Some(true) {
                        "yes"
                    } else {
                        "NO"
                    }
                    .to_owned(),
                    s["state"].as_str().unwrap_or("?").to_owned(),
                ]);
            }
            out += &peers.render();
        }
    }
    let mut vips = Table::new(&[("VIP", 40, false), ("ROUTE", 0, false)]);
    for r in v["vips"].as_array().unwrap_or(&empty) {
        vips.row(vec![
            r["vip"].as_str().unwrap_or("?").to_owned(),
            r["route"].as_str().unwrap_or("?").to_owned(),
        ]);
    }
    out + &vips.render()
}

/// Each backend's last health transitions, oldest first (`/services`' `transitions`).
pub fn render_transitions(v: &Value) -> String {
    let empty = Vec::new();
    let mut table = Table::new(&[
        ("SERVICE", 20, false),
        ("BACKEND", 28, false),
        ("AT (UTC)", 21, false),
        ("TO", 5, false),
        ("CAUSE", 0, false),
    ]);
    for s in v["services"].as_array().unwrap_or(&empty) {
        for b in s["backends"].as_array().unwrap_or(&empty) {
            for t in b["transitions"].as_array().unwrap_or(&empty) {
                table.row(
                    [
                        s["name"].as_str().unwrap_or("?").to_owned(),
                        format!("{}:{}", fmt_ip(&b["address"]), b["port"]),
                        t["at"].as_str().unwrap_or("?").to_owned(),
                        t["to"].as_str().unwrap_or("?").to_owned(),
                        t["cause"].as_str().unwrap_or("?").to_owned(),
                    ]
                    .to_vec(),
                );
            }
        }
    }
    if table.rows.is_empty() {
        return "health transitions: none\n".into();
    }
    format!(
        "health transitions (the last few per backend, oldest first)\n{}",
        table.render()
    )
}

/// The counts of one `/traffic` entry (service or backend): new flows, flows, packets in and
/// out, bytes in and out.
fn counts(v: &Value) -> [u64; 6] {
    [
        "new_flows",
        "flows",
        "in_packets",
        "out_packets",
        "in_bytes",
        "out_bytes",
    ]
    .map(|k| v[k].as_u64().unwrap_or(0))
}

/// `strait status --stats`: totals per service and backend since the gateway started.
pub fn render_stats(t: &Value) -> String {
    let empty = Vec::new();
    let mut table = Table::new(&[
        ("SERVICE / BACKEND", 34, false),
        ("NEW FLOWS", 10, true),
        ("FLOWS", 8, true),
        ("IN PKTS", 12, true),
        ("OUT PKTS", 12, true),
        ("IN BYTES", 14, true),
        ("OUT BYTES", 14, true),
    ]);
    let mut row = |name: String, c: [u64; 6]| {
        let mut r = vec![name];
        r.extend(c.iter().map(u64::to_string));
        table.row(r);
    };
    for s in t["services"].as_array().unwrap_or(&empty) {
        row(s["name"].as_str().unwrap_or("?").to_owned(), counts(s));
        for b in s["backends"].as_array().unwrap_or(&empty) {
            row(
                format!("  -> {}", b["backend"].as_str().unwrap_or("?")),
                counts(b),
            );
        }
    }
    table.render()
}

/// Per second between two `/traffic` samples `dt` apart, per service and, with `backends`,
/// per backend (`strait status --rate`). Entries are matched by name; one in only one sample,
/// or whose counts went down (its id was given to a new holder), shows no rate.
pub fn render_rates(a: &Value, b: &Value, dt: Duration, backends: bool) -> String {
    let empty = Vec::new();
    let secs = dt.as_secs_f64().max(1e-3);
    let mut table = Table::new(&[
        ("SERVICE / BACKEND", 34, false),
        ("NEW/S", 10, true),
        ("IN PPS", 12, true),
        ("OUT PPS", 12, true),
        ("IN BPS", 14, true),
        ("OUT BPS", 14, true),
    ]);
    let rate = |name: String, before: Option<&Value>, now: &Value| -> Vec<String> {
        let now_c = counts(now);
        let Some(before) = before else {
            return vec![name, "(new since the first sample)".into()];
        };
        let was = counts(before);
        if now_c.iter().zip(&was).any(|(n, w)| n < w) {
            return vec![name, "(counters restarted)".into()];
        }
        let r = |i: usize| format!("{:.1}", (now_c[i] - was[i]) as f64 / secs);
        vec![name, r(0), r(2), r(3), r(4), r(5)]
    };
    let find = |list: &Value, key: &str, want: &Value| -> Option<Value> {
        list.as_array()?.iter().find(|x| &x[key] == want).cloned()
    };
    for s in b["services"].as_array().unwrap_or(&empty) {
        let before = find(&a["services"], "name", &s["name"]);
        table.row(rate(
            s["name"].as_str().unwrap_or("?").to_owned(),
            before.as_ref(),
            s,
        ));
        if !backends {
            continue;
        }
        for be in s["backends"].as_array().unwrap_or(&empty) {
            let was = before
                .as_ref()
                .and_then(|w| find(&w["backends"], "backend", &be["backend"]));
            table.row(rate(
                format!("  -> {}", be["backend"].as_str().unwrap_or("?")),
                was.as_ref(),
                be,
            ));
        }
    }
    format!(
        "traffic per second over {:.1} s\n{}",
        dt.as_secs_f64(),
        table.render()
    )
}

/// Each worker's flow-table occupancy (`/traffic`'s `cores`).
pub fn render_cores(t: &Value) -> String {
    let empty = Vec::new();
    let mut table = Table::new(&[
        ("WORKER", 28, false),
        ("FLOW ENTRIES", 14, true),
        ("CAPACITY", 14, true),
        ("USED", 7, true),
    ]);
    for c in t["cores"].as_array().unwrap_or(&empty) {
        let (n, cap) = (
            c["entries"].as_u64().unwrap_or(0),
            c["capacity"].as_u64().unwrap_or(0),
        );
        table.row(vec![
            c["worker"].as_str().unwrap_or("?").to_owned(),
            n.to_string(),
            cap.to_string(),
            format!("{:.1}%", 100.0 * n as f64 / cap.max(1) as f64),
        ]);
    }
    table.render()
}

fn fmt_ip(v: &Value) -> String {
    let s = v.as_str().unwrap_or("?");
    if s.contains(':') {
        format!("[{s}]")
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drain_answer_names_the_pid_and_a_live_process_is_seen_running() {
        let a = "draining: routes withdrawn, forwarding for 5s more, then stopping (pid 4242)\n";
        assert_eq!(drain_pid(a), Some(4242));
        assert_eq!(drain_pid("draining"), None);
        // This test process is not a `strait`, and no process has pid 0 in /proc.
        assert!(!running(std::process::id()));
        assert!(!running(0));
    }

    #[test]
    fn a_duration_of_zero_is_refused() {
        assert_eq!(
            positive_duration("0s"),
            Err("must be longer than zero".into())
        );
        assert_eq!(positive_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(positive_duration("soon").is_err());
    }

    #[test]
    fn renders_services_and_backends() {
        let v: Value = serde_json::from_str(
            r#"{"generation":3,"services":[{"name":"web","vip":"203.0.113.10","port":80,"protocol":"tcp","mode":"dsr-l2","healthy":true,
            "backends":[{"address":"198.51.100.11","port":80,"weight":100,"state":"active","health":"up","next_hop_mac":"02:00:00:00:01:11"},
                        {"address":"198.51.100.12","port":80,"weight":100,"slow_start_weight":25,"state":"active","health":"up","next_hop_mac":"02:00:00:00:01:12"},
                        {"address":"2001:db8::11","port":80,"weight":0,"state":"draining","health":"down","next_hop_mac":null}]},
            {"name":"empty","vip":"203.0.113.11","port":53,"protocol":"udp","mode":"nat","healthy":false,"backends":[]}]}"#,
        )
        .unwrap();
        let t = render(&v);
        assert!(
            t.contains("198.51.100.12:80             25/100 active"),
            "{t}"
        );
        assert!(t.starts_with("table generation 3\n"));
        assert!(t.contains("web                  203.0.113.10:80/tcp"));
        assert!(t.contains("198.51.100.11:80"));
        assert!(t.contains("[2001:db8::11]:80"));
        assert!(t.contains("up        02:00:00:00:01:11"));
        assert!(t.contains("draining  down      unresolved"));
        assert!(t.contains("(no backends)"));
    }

    #[test]
    fn a_table_widens_to_its_cells_aligns_numbers_right_and_prints_notes_as_they_are() {
        let mut t = Table::new(&[("NAME", 6, false), ("N", 4, true), ("NOTE", 0, false)]);
        t.row(vec!["a".into(), "7".into(), "x".into()]);
        t.row(vec!["longer-name".into(), "12345".into(), "y".into()]);
        t.row(vec!["b".into(), "(a note wider than the column)".into()]);
        assert_eq!(
            t.render(),
            "NAME            N NOTE\n\
             a               7 x\n\
             longer-name 12345 y\n\
             b           (a note wider than the column)\n"
        );
    }

    #[test]
    fn a_wide_cell_widens_its_column_and_the_next_stay_aligned() {
        let v: Value = serde_json::from_str(
            r#"{"generation":1,"services":[{"name":"web","vip":"2001:db8:ffff:ffff:ffff:ffff:ffff:10","port":8443,"protocol":"tcp","mode":"dsr-l2","healthy":true,
            "backends":[{"address":"198.51.100.11","port":80,"weight":100,"state":"active","health":"down","out":{"by":"active","cause":"refused"},"next_hop_mac":"02:00:00:00:01:11"},
                        {"address":"2001:db8:ffff:ffff:ffff:ffff:ffff:11","port":8080,"weight":100,"state":"active","health":"up","next_hop_mac":"02:00:00:00:01:12"}]}]}"#,
        )
        .unwrap();
        let t = render(&v);
        let lines: Vec<&str> = t.lines().collect();
        let column = |l: &str, word: &str| l.find(word).unwrap_or_else(|| panic!("{word}:\n{t}"));
        let next_hop = column(lines[1], "NEXT HOP");
        assert_eq!(column(lines[2], "02:00:00:00:01:11"), next_hop, "\n{t}");
        assert_eq!(column(lines[3], "02:00:00:00:01:12"), next_hop, "\n{t}");
        assert!(lines[2].contains(" down (active: refused) "), "{t}");
        let mode = column(lines[1], "MODE");
        assert_eq!(column(lines[2], "dsr-l2"), mode, "\n{t}");
        let state = column(lines[1], "STATE");
        assert_eq!(column(lines[3], "active"), state, "\n{t}");
    }

    #[test]
    fn the_health_column_says_by_what_and_why_a_backend_is_out() {
        let b = |health: &str, out: &str| -> Value {
            serde_json::from_str(&format!(r#"{{"health":"{health}","out":{out}}}"#)).unwrap()
        };
        assert_eq!(health_cell(&b("up", "null")), "up");
        assert_eq!(
            health_cell(&b("up", r#"{"by":"passive","cause":"refused"}"#)),
            "out (passive: refused)"
        );
        assert_eq!(
            health_cell(&b("down", r#"{"by":"active","cause":"timeout"}"#)),
            "down (active: timeout)"
        );
        // A gateway that does not say why.
        assert_eq!(health_cell(&serde_json::json!({"health": "down"})), "down");
    }

    #[test]
    fn renders_routes_and_sessions() {
        let v: Value = serde_json::from_str(
            r#"{"draining":false,"bgp":{"running":true,"error":null,"announced":1,"restarts":0,
            "sessions":[{"peer":"198.51.100.1","asn":64500,"up":false,"state":"Active Socket: Connection refused"}]},
            "vips":[{"vip":"203.0.113.10","route":"announced"},{"vip":"203.0.113.11","route":"no-serving-backend"}]}"#,
        )
        .unwrap();
        let t = render_routes(&v);
        assert!(
            t.contains("bgp: speaker running, 1 routes announced"),
            "{t}"
        );
        assert!(t.contains("198.51.100.1"), "{t}");
        assert!(t.contains("NO    Active Socket: Connection refused"), "{t}");
        assert!(
            t.contains("203.0.113.11                             no-serving-backend"),
            "{t}"
        );
    }

    fn traffic(in_packets: u64, out_packets: u64) -> Value {
        serde_json::from_str(&format!(
            r#"{{"generation":4,"services":[{{"name":"web","in_packets":{in_packets},"in_bytes":{},"out_packets":{out_packets},"out_bytes":{},"new_flows":3,"flows":6,
            "backends":[{{"backend":"198.51.100.11:8080","in_packets":{in_packets},"in_bytes":{},"out_packets":{out_packets},"out_bytes":{},"new_flows":3,"flows":6}}]}}],
            "cores":[{{"worker":"eth0/0","entries":6,"capacity":1024}}]}}"#,
            in_packets * 100,
            out_packets * 1000,
            in_packets * 100,
            out_packets * 1000
        ))
        .unwrap()
    }

    #[test]
    fn renders_traffic_totals_rates_and_occupancy() {
        let t = render_stats(&traffic(10, 8));
        let web = t
            .lines()
            .find(|l| l.starts_with("web "))
            .expect("a web row");
        let cols: Vec<&str> = web.split_whitespace().collect();
        assert_eq!(cols, ["web", "3", "6", "10", "8", "1000", "8000"], "{t}");
        assert!(t.contains("  -> 198.51.100.11:8080"), "{t}");
        let r = render_rates(
            &traffic(10, 8),
            &traffic(30, 18),
            Duration::from_secs(2),
            true,
        );
        let web = r
            .lines()
            .find(|l| l.starts_with("web "))
            .expect("a web row");
        let cols: Vec<&str> = web.split_whitespace().collect();
        assert_eq!(
            cols,
            ["web", "0.0", "10.0", "5.0", "1000.0", "5000.0"],
            "{r}"
        );
        assert!(r.contains("  -> 198.51.100.11:8080"), "{r}");
        let r = render_rates(
            &traffic(30, 18),
            &traffic(10, 8),
            Duration::from_secs(2),
            false,
        );
        assert!(r.contains("(counters restarted)"), "{r}");
        assert!(!r.contains("->"), "{r}");
        let c = render_cores(&traffic(1, 1));
        assert!(c.contains("eth0/0"), "{c}");
        assert!(c.trim_end().ends_with("0.6%"), "{c}");
    }

    #[test]
    fn renders_health_transitions() {
        let v: Value = serde_json::from_str(
            r#"{"services":[{"name":"web","backends":[{"address":"198.51.100.11","port":80,
            "transitions":[{"at":"2026-12-04T22:30:01Z","to":"down","cause":"refused"},
                           {"at":"2026-12-04T22:31:00Z","to":"up","cause":"passed"}]}]}]}"#,
        )
        .unwrap();
        let t = render_transitions(&v);
        assert!(
            t.contains("web                  198.51.100.11:80             2026-12-04T22:30:01Z  down  refused"),
            "{t}"
        );
        assert!(t.contains("up    passed"), "{t}");
        let none: Value = serde_json::from_str(r#"{"services":[]}"#).unwrap();
        assert_eq!(render_transitions(&none), "health transitions: none\n");
    }
}
