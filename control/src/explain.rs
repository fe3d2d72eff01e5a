//! `GET /explain` and `strait explain`: where a flow goes, and why.
//!
//! The admin API parses the 5-tuple, asks the workers whose flow tables may hold it
//! ([`strait_dataplane::explain::cores_to_ask`]) through their explain desks, all at once,
//! waits [`WAIT`] in all for their answers, and builds the story with
//! [`strait_dataplane::explain::explain`] from the current snapshot; it answers JSON whose field names are the contract. `strait
//! explain` fetches it and prints the same fields as a short block for a person (or the
//! JSON itself with `--json`). The meaning of every line is in `docs/observability.md`.
//!
//! Both port drivers run the same worker loop, so both answer; a worker that does not turn
//! its loop within [`WAIT`] is named in the answer (`unanswered`), and when no asked worker
//! answers the request fails with 503 rather than showing a story without the flow tables.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::PoisonError;
use std::time::Duration;

use serde_json::{json, Value};
use strait_config::model::MacAddr;
use strait_dataplane::explain::{
    cores_to_ask, explain, Entry, Explanation, Forward, Outcome, Probe, Reply, Rewrite, Source, Why,
};
use strait_dataplane::flow::FlowState;
use strait_dataplane::key::{addr_bytes, bytes_addr, proto, Addr, FlowKey, Proto};
use strait_dataplane::table::{Backend, Health, ServiceTable};

use crate::shared::Shared;

/// How long the admin API waits for a worker's answer. A turning worker answers within a
/// turn: microseconds when busy, at most its idle poll (1 ms) when idle. A second is far
/// beyond that, and short enough for an operator at a prompt.
pub const WAIT: Duration = Duration::from_secs(1);

/// The answer to `GET /explain?QUERY`: status, content type, body.
pub fn http(shared: &Shared, query: &str) -> (u16, &'static str, String) {
    let key = match parse_query(query) {
        Ok(k) => k,
        Err(e) => return (400, "text/plain", format!("{e}\n")),
    };
    let table = shared.table.load_full();
    let cores = shared.cores.len() as u16;
    let asked = cores_to_ask(&table, &key, cores);
    let (probes, unanswered) = ask_all(shared, &asked, &key);
    if !asked.is_empty() && probes.is_empty() {
        let why: Vec<&str> = unanswered.iter().map(|(_, e)| e.as_str()).collect();
        return (
            503,
            "text/plain",
            format!("no worker answered: {}\n", why.join("; ")),
        );
    }
    let e = explain(&table, cores, &key, &probes);
    let names = interface_names(shared);
    let mut v = to_json(&table, &e, &names);
    v["cores"] = json!(cores);
    v["unanswered"] = unanswered
        .iter()
        .map(|(c, e)| json!({"core": c, "error": e}))
        .collect();
    (200, "application/json", v.to_string() + "\n")
}

/// Asks workers `cores` about `key`, all at once, and waits [`WAIT`] in all for their
/// answers: the probes, and the workers that gave none with the reason.
fn ask_all(shared: &Shared, cores: &[u16], key: &FlowKey) -> (Vec<Probe>, Vec<(u16, String)>) {
    let mut probes = Vec::with_capacity(cores.len());
    let mut unanswered = Vec::new();
    let mut waiting = Vec::new();
    for &core in cores {
        let Some(slot) = shared.cores.get(usize::from(core)) else {
            unanswered.push((core, format!("no worker {core}")));
            continue;
        };
        let who = match slot.name.as_str() {
            "" => format!("worker {core}"),
            name => format!("worker {core} ({name})"),
        };
        // Held until the answer: one query at a time per worker.
        let mut window = slot.explain.lock().unwrap_or_else(PoisonError::into_inner);
        match window.as_mut().map(|w| w.send(key)) {
            None => unanswered.push((core, format!("{who} is not running"))),
            Some(Err(e)) => unanswered.push((core, format!("{who}: {e}"))),
            Some(Ok(id)) => waiting.push((core, who, window, id)),
        }
    }
    let until = std::time::Instant::now() + WAIT;
    while !waiting.is_empty() {
        waiting.retain_mut(|(core, _, window, id)| {
            match window.as_mut().and_then(|w| w.receive(*id)) {
                Some(p) => {
                    probes.push(Probe { core: *core, ..p });
                    false
                }
                None => true,
            }
        });
        if std::time::Instant::now() >= until {
            break;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    for (core, who, _, _) in waiting {
        let e = strait_dataplane::explain::AskError::Timeout(WAIT);
        unanswered.push((core, format!("{who}: {e}")));
    }
    unanswered.sort_by_key(|(c, _)| *c);
    probes.sort_by_key(|p| p.core);
    (probes, unanswered)
}

/// The data interfaces' names by table port index (configuration order).
fn interface_names(shared: &Shared) -> Vec<String> {
    let sources = shared.config.lock().unwrap_or_else(PoisonError::into_inner);
    sources
        .file
        .gateway
        .interfaces
        .iter()
        .map(|i| i.name.clone())
        .collect()
}

/// Why a query is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueryError {
    /// A parameter is missing.
    #[error("missing `{0}`: ask GET /explain?client=ADDR:PORT&vip=ADDR:PORT[&proto=tcp|udp|sctp]")]
    Missing(&'static str),
    /// A parameter the query does not know (a misspelt one would otherwise be left out
    /// silently).
    #[error("unknown parameter `{0}`: ask GET /explain?client=ADDR:PORT&vip=ADDR:PORT[&proto=tcp|udp|sctp]")]
    Unknown(String),
    /// A parameter does not parse.
    #[error("`{name}` = {value:?}: {why}")]
    Bad {
        /// The parameter.
        name: &'static str,
        /// What was given.
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

/// The 5-tuple of `client=ADDR:PORT&vip=ADDR:PORT&proto=tcp` (percent-encoded or not;
/// `proto` defaults to tcp; an IPv6 address in brackets).
pub fn parse_query(query: &str) -> Result<FlowKey, QueryError> {
    let mut client = None;
    let mut vip = None;
    let mut proto = "tcp".to_string();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v);
        match k {
            "client" => client = Some(v),
            "vip" => vip = Some(v),
            "proto" => proto = v,
            _ => return Err(QueryError::Unknown(percent_decode(k))),
        }
    }
    let sock = |name: &'static str, v: Option<String>| -> Result<SocketAddr, QueryError> {
        let v = v.ok_or(QueryError::Missing(name))?;
        v.parse().map_err(|_| QueryError::Bad {
            name,
            value: v,
            why: "not ADDRESS:PORT (IPv6 as [2001:db8::2]:40000)",
        })
    };
    let (c, d) = (sock("client", client)?, sock("vip", vip)?);
    if c.is_ipv4() != d.is_ipv4() {
        return Err(QueryError::Bad {
            name: "vip",
            value: d.to_string(),
            why: "not of the client's address family (no packet carries an IPv4 and an IPv6 \
                  address)",
        });
    }
    let p = proto_number(&proto).ok_or(QueryError::Bad {
        name: "proto",
        value: proto,
        why: "not tcp, udp or sctp",
    })?;
    Ok(FlowKey {
        src: addr_bytes(c.ip()),
        dst: addr_bytes(d.ip()),
        src_port: c.port(),
        dst_port: d.port(),
        proto: p,
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).copied(), b.get(i + 2).copied()) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn proto_number(s: &str) -> Option<Proto> {
    match s.to_ascii_lowercase().as_str() {
        "tcp" => Some(proto::TCP),
        "udp" => Some(proto::UDP),
        "sctp" => Some(proto::SCTP),
        _ => None,
    }
}

fn proto_name(p: Proto) -> String {
    match p {
        proto::TCP => "tcp".into(),
        proto::UDP => "udp".into(),
        proto::SCTP => "sctp".into(),
        other => other.0.to_string(),
    }
}

fn sock(a: Addr, port: u16) -> String {
    SocketAddr::new(bytes_addr(a), port).to_string()
}

fn mac(m: strait_dataplane::wire::ethernet::Address) -> String {
    MacAddr(m.0).to_string()
}

fn state_name(s: FlowState) -> &'static str {
    match s {
        FlowState::TcpSyn => "syn",
        FlowState::TcpEstablished => "established",
        FlowState::TcpClosing => "closing",
        FlowState::Udp => "udp",
        FlowState::Other => "other",
    }
}

fn health_name(h: Health) -> &'static str {
    match h {
        Health::Up => "up",
        Health::Draining => "draining",
        Health::Down => "down",
    }
}

fn entry_json(t: &ServiceTable, core: u16, e: &Entry) -> Value {
    let backend = t
        .backend(e.backend)
        .filter(|b| b.incarnation == e.incarnation)
        .map(|b| b.socket_addr().to_string());
    json!({
        "core": core,
        "backend": backend,
        "backend_id": e.backend.0,
        "state": state_name(e.state),
        "age_ms": e.age_ms,
        "idle_ms": e.idle_ms,
        "timeout_ms": e.timeout_ms,
        "left_ms": e.left_ms(),
        "origin": if e.learnt { "peer" } else { "here" },
    })
}

fn backend_json(b: &Backend) -> Value {
    json!({
        "address": b.socket_addr().to_string(),
        "id": b.id.0,
        "weight": b.weight,
        "health": health_name(b.health),
        "mac": b.mac.map(mac),
        "tunnel": b.tunnel_target().to_string(),
    })
}

fn service_json(s: &strait_dataplane::explain::ServiceRef) -> Value {
    json!({
        "name": s.name,
        "vip": s.frontend.vip_addr().to_string(),
        "port": s.frontend.port,
        "proto": proto_name(s.frontend.proto),
        "mode": s.mode.as_str(),
    })
}

/// The explanation as the admin API's JSON (see `docs/observability.md` for each field).
/// `names` are the data interfaces by port index.
pub fn to_json(t: &ServiceTable, e: &Explanation, names: &[String]) -> Value {
    let k = &e.key;
    let mut v = json!({
        "flow": {
            "proto": proto_name(k.proto),
            "src": sock(k.src, k.src_port),
            "dst": sock(k.dst, k.dst_port),
        },
        "generation": e.generation,
        "other_generation": e.other_generation,
    });
    let iface = |p: u8| names.get(usize::from(p)).cloned();
    match &e.verdict {
        Outcome::NoFrontend { served } => {
            v["kind"] = json!("no_frontend");
            v["vip_known"] = json!(!served.is_empty());
            v["served"] = served
                .iter()
                .map(|(n, port, p)| json!({"service": n, "port": port, "proto": proto_name(*p)}))
                .collect();
        }
        Outcome::Forward(f) => {
            v["kind"] = json!("forward");
            forward_json(t, f, &mut v, &iface);
        }
        Outcome::Reply(r) => {
            v["kind"] = json!("reply");
            reply_json(t, r, &mut v, &iface);
        }
    }
    v
}

fn forward_json(
    t: &ServiceTable,
    f: &Forward,
    v: &mut Value,
    iface: &dyn Fn(u8) -> Option<String>,
) {
    v["service"] = service_json(&f.service);
    v["source"] = match &f.source {
        Source::Open => json!({"verdict": "open"}),
        Source::Allowed(p) => json!({"verdict": "allowed", "range": p.to_string()}),
        Source::Refused(r) => json!({
            "verdict": "refused",
            "ranges": r.iter().map(ToString::to_string).collect::<Vec<_>>(),
        }),
    };
    v["cores_asked"] = json!(f.cores);
    v["entries"] = f
        .entries
        .iter()
        .map(|(c, e)| entry_json(t, *c, e))
        .collect();
    v["stale"] = f.stale.iter().map(|(c, e)| entry_json(t, *c, e)).collect();
    v["backend"] = f
        .backend
        .as_ref()
        .map_or(Value::Null, |(b, _)| backend_json(b));
    v["why"] = match f.backend.as_ref().map(|(_, w)| w) {
        None => Value::Null,
        Some(Why::Entry { core, .. }) => json!({"by": "entry", "core": core}),
        Some(Why::Affinity { core, entry }) => {
            json!({"by": "affinity", "core": core, "entry": entry_json(t, *core, entry)})
        }
        Some(Why::Maglev {
            slot,
            size,
            by_client,
        }) => json!({
            "by": "maglev",
            "slot": slot,
            "size": size,
            "hash": if *by_client { "client_address" } else { "five_tuple" },
        }),
    };
    let mut drop = match (&f.source, &f.backend) {
        (Source::Refused(_), _) => Some("source_not_allowed"),
        (_, None) => Some("no_backend"),
        _ => None,
    };
    v["rewrite"] = match &f.rewrite {
        None => Value::Null,
        Some(Rewrite::NoNextHop) => {
            drop = Some("no_next_hop");
            Value::Null
        }
        Some(Rewrite::DsrL2 { macs, port }) => json!({
            "mode": "dsr-l2",
            "src_mac": mac(macs.0), "dst_mac": mac(macs.1),
            "port": port, "interface": iface(*port),
        }),
        Some(Rewrite::Encap {
            macs,
            port,
            outer,
            udp,
        }) => json!({
            "mode": f.service.mode.as_str(),
            "src_mac": mac(macs.0), "dst_mac": mac(macs.1),
            "port": port, "interface": iface(*port),
            "outer_src": outer.0.to_string(), "outer_dst": outer.1.to_string(),
            "outer_sport": udp.map(|u| u.0), "outer_dport": udp.map(|u| u.1),
        }),
        Some(Rewrite::Nat {
            macs,
            port,
            to,
            reply,
            reply_entry,
        }) => json!({
            "mode": "nat",
            "src_mac": mac(macs.0), "dst_mac": mac(macs.1),
            "port": port, "interface": iface(*port),
            "to": SocketAddr::new(to.0, to.1).to_string(),
            "reply": {"src": sock(reply.src, reply.src_port), "dst": sock(reply.dst, reply.dst_port)},
            "reply_entry": reply_entry.map(|e| entry_json(t, f.cores.first().copied().unwrap_or(0), &e)),
        }),
    };
    v["drop"] = json!(drop);
}

fn reply_json(t: &ServiceTable, r: &Reply, v: &mut Value, iface: &dyn Fn(u8) -> Option<String>) {
    v["cores_asked"] = json!([r.core]);
    v["reply_entry"] = r.entry.map_or(Value::Null, |e| entry_json(t, r.core, &e));
    v["forward_entry"] = r
        .forward_entry
        .map_or(Value::Null, |e| entry_json(t, r.core, &e));
    match &r.flow {
        Some((b, fwd, s)) => {
            v["service"] = service_json(s);
            v["backend"] = backend_json(b);
            v["of_flow"] =
                json!({"src": sock(fwd.src, fwd.src_port), "dst": sock(fwd.dst, fwd.dst_port)});
            v["rewrite"] = json!({
                "mode": "reply-nat",
                "src": sock(fwd.dst, fwd.dst_port),
                "src_mac": mac(r.macs.0), "dst_mac": mac(r.macs.1),
                "port": r.port, "interface": iface(r.port),
            });
            v["drop"] = Value::Null;
        }
        None => {
            v["drop"] = json!("reply_no_flow");
        }
    }
}

fn secs(ms: &Value) -> String {
    let ms = ms.as_u64().unwrap_or(0);
    if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        humantime::format_duration(Duration::from_secs(ms / 1000)).to_string()
    }
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn entry_line(e: &Value) -> String {
    let backend = match &e["backend"] {
        Value::Null => format!("backend id {} (no longer in the table)", e["backend_id"]),
        b => s(b),
    };
    // The reply's view of a nat flow's entry has no age (the flow's own view has it).
    let age = match &e["age_ms"] {
        Value::Null => String::new(),
        a => format!("age {}, ", secs(a)),
    };
    format!(
        "core {}: {backend}, {}, {age}idle {}, {} left, {}",
        e["core"],
        s(&e["state"]),
        secs(&e["idle_ms"]),
        secs(&e["left_ms"]),
        if e["origin"] == "peer" {
            "learnt from a peer"
        } else {
            "made here"
        }
    )
}

fn out_port(r: &Value) -> String {
    match &r["interface"] {
        Value::Null => format!("port {}", r["port"]),
        i => format!("port {} ({})", r["port"], s(i)),
    }
}

/// The block `strait explain` prints for the admin API's JSON answer.
pub fn render(v: &Value) -> String {
    let mut o = String::new();
    let f = &v["flow"];
    let _ = writeln!(
        o,
        "flow      {} {} -> {}",
        s(&f["proto"]),
        s(&f["src"]),
        s(&f["dst"])
    );
    let svc = &v["service"];
    let frontend = || {
        let vip = s(&svc["vip"]);
        let (open, close) = if vip.contains(':') {
            ("[", "]")
        } else {
            ("", "")
        };
        format!(
            "{} {open}{vip}{close}:{}/{}, mode {}",
            s(&svc["name"]),
            svc["port"],
            s(&svc["proto"]),
            s(&svc["mode"])
        )
    };
    match v["kind"].as_str() {
        Some("no_frontend") => {
            if v["vip_known"] == true {
                let served: Vec<String> = v["served"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|x| format!("{}/{} ({})", x["port"], s(&x["proto"]), s(&x["service"])))
                    .collect();
                let _ = writeln!(
                    o,
                    "frontend  none: the VIP serves {} only; not this port and protocol",
                    served.join(", ")
                );
            } else {
                let _ = writeln!(o, "frontend  none: no service has this VIP");
            }
            let _ = writeln!(o, "verdict   pass to the kernel (not service traffic)");
        }
        Some("forward") => {
            let _ = writeln!(o, "frontend  {}", frontend());
            let src = &v["source"];
            let _ = match src["verdict"].as_str() {
                Some("allowed") => writeln!(o, "source    allowed: inside {}", s(&src["range"])),
                Some("refused") => {
                    let r: Vec<String> = src["ranges"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(s)
                        .collect();
                    writeln!(
                        o,
                        "source    REFUSED: outside every source range ({})",
                        r.join(", ")
                    )
                }
                _ => writeln!(o, "source    allowed: the service has no source ranges"),
            };
            let asked: Vec<String> = v["cores_asked"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| c.to_string())
                .collect();
            let _ = if svc["mode"] == "nat" {
                writeln!(
                    o,
                    "core      {} of {} (the nat flow's owner, by client address and port)",
                    asked.join(","),
                    v["cores"]
                )
            } else {
                writeln!(
                    o,
                    "cores     {} (DSR: RSS picks the core, every one asked)",
                    asked.join(",")
                )
            };
            let entries = v["entries"].as_array().cloned().unwrap_or_default();
            for e in &entries {
                let _ = writeln!(o, "entry     {}", entry_line(e));
            }
            for e in v["stale"].as_array().into_iter().flatten() {
                let _ = writeln!(
                    o,
                    "stale     {} (its backend left or is down: the next packet re-hashes)",
                    entry_line(e)
                );
            }
            if entries.is_empty() && src["verdict"] != "refused" {
                let _ = writeln!(
                    o,
                    "entry     none: a new connection now gets the backend below"
                );
            }
            let b = &v["backend"];
            if !b.is_null() {
                let why = &v["why"];
                let reason = match why["by"].as_str() {
                    Some("entry") => format!("the flow's entry on core {}", why["core"]),
                    Some("affinity") => format!(
                        "session affinity: the client's entry on core {} ({} left)",
                        why["core"],
                        secs(&why["entry"]["left_ms"])
                    ),
                    _ => format!(
                        "Maglev slot {} of {}, by {}",
                        why["slot"],
                        why["size"],
                        if why["hash"] == "client_address" {
                            "client address (session affinity, no entry yet)"
                        } else {
                            "5-tuple hash"
                        }
                    ),
                };
                let _ = writeln!(
                    o,
                    "backend   {} (id {}, weight {}, {}): {reason}",
                    s(&b["address"]),
                    b["id"],
                    b["weight"],
                    s(&b["health"])
                );
            }
            let r = &v["rewrite"];
            match r["mode"].as_str() {
                Some("dsr-l2") => {
                    let _ = writeln!(
                        o,
                        "rewrite   dsr-l2: MAC {} -> {}, VIP kept, out {}",
                        s(&r["src_mac"]),
                        s(&r["dst_mac"]),
                        out_port(r)
                    );
                }
                Some(m @ ("dsr-ipip" | "dsr-gue")) => {
                    let udp = if m == "dsr-gue" {
                        format!(" udp {} -> {}", r["outer_sport"], r["outer_dport"])
                    } else {
                        String::new()
                    };
                    let _ = writeln!(
                        o,
                        "rewrite   {m}: outer {} -> {}{udp}, MAC {} -> {}, out {}",
                        s(&r["outer_src"]),
                        s(&r["outer_dst"]),
                        s(&r["src_mac"]),
                        s(&r["dst_mac"]),
                        out_port(r)
                    );
                }
                Some("nat") => {
                    let _ = writeln!(
                        o,
                        "rewrite   nat: to {}, MAC {} -> {}, out {}",
                        s(&r["to"]),
                        s(&r["src_mac"]),
                        s(&r["dst_mac"]),
                        out_port(r)
                    );
                    let held = match &r["reply_entry"] {
                        Value::Null => "no entry yet".to_string(),
                        e => format!("the flow's entry on core {}", e["core"]),
                    };
                    let _ = writeln!(
                        o,
                        "reply     {} -> {} goes back as from {}: {held}",
                        s(&r["reply"]["src"]),
                        s(&r["reply"]["dst"]),
                        s(&f["dst"])
                    );
                }
                _ => {}
            }
        }
        Some("reply") => {
            let core = &v["cores_asked"][0];
            match &v["reply_entry"] {
                Value::Null => {
                    let _ = writeln!(
                        o,
                        "reply     from a nat backend's port, but core {core} holds no flow it answers"
                    );
                }
                e => {
                    let of = &v["of_flow"];
                    let _ = writeln!(
                        o,
                        "reply     of the flow {} -> {} ({})",
                        s(&of["src"]),
                        s(&of["dst"]),
                        frontend()
                    );
                    // The same entry as the flow's packets see it has its age.
                    let e = match &v["forward_entry"] {
                        f @ Value::Object(_) => f,
                        _ => e,
                    };
                    let _ = writeln!(o, "entry     {} (the flow's)", entry_line(e));
                    let r = &v["rewrite"];
                    let _ = writeln!(
                        o,
                        "rewrite   reply-nat: source -> {}, MAC {} -> {}, out {}",
                        s(&r["src"]),
                        s(&r["src_mac"]),
                        s(&r["dst_mac"]),
                        out_port(r)
                    );
                }
            }
        }
        _ => {}
    }
    if let Some(d) = v["drop"].as_str() {
        let _ = writeln!(o, "verdict   DROP ({d})");
    }
    for u in v["unanswered"].as_array().into_iter().flatten() {
        let _ = writeln!(o, "warning   {}", s(&u["error"]));
    }
    if let Some(g) = v["other_generation"].as_array().filter(|g| !g.is_empty()) {
        let _ = writeln!(
            o,
            "warning   cores {g:?} read another table generation than {} (a table was published meanwhile)",
            v["generation"]
        );
    }
    o
}

/// The address part of `ADDR:PORT`, for the CLI's own check before asking.
pub fn check_socket(name: &str, s: &str) -> anyhow::Result<IpAddr> {
    s.parse::<SocketAddr>().map(|a| a.ip()).map_err(|_| {
        anyhow::anyhow!("{name} {s:?} is not ADDRESS:PORT (IPv6 as [2001:db8::2]:40000)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_parse_with_or_without_percent_encoding() {
        let k =
            parse_query("client=%5B2001:db8::2%5D:40000&vip=[2001:db8::10]:443&proto=udp").unwrap();
        assert_eq!(k.src_port, 40000);
        assert_eq!(k.dst_port, 443);
        assert_eq!(k.proto, proto::UDP);
        assert_eq!(bytes_addr(k.src), "2001:db8::2".parse::<IpAddr>().unwrap());
        let k = parse_query("vip=203.0.113.10:80&client=198.51.100.7:1").unwrap();
        assert_eq!(k.proto, proto::TCP);
        assert_eq!(
            parse_query("vip=203.0.113.10:80"),
            Err(QueryError::Missing("client"))
        );
        assert!(matches!(
            parse_query("client=1.2.3.4&vip=203.0.113.10:80"),
            Err(QueryError::Bad { name: "client", .. })
        ));
        assert!(matches!(
            parse_query("client=1.2.3.4:5&vip=203.0.113.10:80&proto=icmp"),
            Err(QueryError::Bad { name: "proto", .. })
        ));
    }

    #[test]
    fn an_ipv6_frontend_is_rendered_in_brackets() {
        let v = json!({
            "flow": {"proto": "tcp", "src": "[2001:db8::2]:40999", "dst": "[2001:db8::10]:80"},
            "kind": "forward",
            "service": {"name": "web6", "vip": "2001:db8::10", "port": 80, "proto": "tcp",
                        "mode": "dsr-l2"},
        });
        let out = render(&v);
        assert!(
            out.contains("frontend  web6 [2001:db8::10]:80/tcp, mode dsr-l2"),
            "{out}"
        );
        let v4 = json!({"kind": "forward", "service": {"vip": "203.0.113.10", "port": 80}});
        assert!(render(&v4).contains(" 203.0.113.10:80/"), "{}", render(&v4));
    }

    #[test]
    fn a_query_mixing_families_or_with_an_unknown_parameter_is_refused() {
        for q in [
            "client=192.0.2.2:40999&vip=%5B2001:db8::10%5D:80",
            "client=[2001:db8::2]:40999&vip=203.0.113.10:80",
        ] {
            let e = parse_query(q).unwrap_err();
            assert!(matches!(e, QueryError::Bad { name: "vip", .. }), "{q}: {e}");
            assert!(e.to_string().contains("address family"), "{e}");
        }
        let e = parse_query("client=192.0.2.2:1&vip=203.0.113.10:80&protocol=udp").unwrap_err();
        assert_eq!(e, QueryError::Unknown("protocol".into()));
        assert!(
            e.to_string().starts_with("unknown parameter `protocol`"),
            "{e}"
        );
    }
}
