//! The JSON documents of `GET /services` and `GET /routes`: each reads the views the
//! drivers hand to [`Shared`] (the configuration, the live table, the health checker's
//! states, the routes, the BGP and VRRP sides' status) and shapes them for an operator.
//! `/metrics` says the same things as families ([`super::collectors`]), and names why a
//! backend is out with [`out_json`]'s words so that the two never disagree.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::PoisonError;

use serde_json::json;
use strait_config::model::{BackendState, MacAddr};

use crate::core::BackendKey;
use crate::shared::Shared;

/// `/routes`: each VIP's route, the drain state and the BGP speaker's sessions.
pub(super) fn routes_json(shared: &Shared) -> String {
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

/// Why a backend takes no new flows for its health, as `/services` shows it: `null` when
/// it takes them, else `by` (`active`: its check fell; `passive`: the gateway saw it refuse
/// or leave unanswered new connections, nat mode), `cause` (the check's failure: refused,
/// timeout, HTTP status N...; or passive health's: refused, unanswered), `detail` (the
/// message of the failure that took it out) and `since` (RFC 3339). A backend out both
/// ways shows its active check's fall. The latest check's error is the backend's
/// `last_error`, apart.
pub(super) fn out_json(h: Option<&crate::health::State>) -> serde_json::Value {
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
            "detail": fall.map_or("", |t| t.detail.as_str()),
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
pub(super) fn services_json(shared: &Shared) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
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
        s.history.push_back(Transition {
            at: SystemTime::UNIX_EPOCH,
            up: false,
            cause: "timeout".into(),
            detail: "connect 198.51.100.11:80: timed out".into(),
        });
        // A later check failed another way (or passed): the fall's own message shows.
        s.last_error = Some("connect 198.51.100.11:80: No route to host".into());
        let v = out_json(Some(&s));
        assert_eq!(
            (v["by"].as_str(), v["cause"].as_str()),
            (Some("active"), Some("timeout"))
        );
        assert_eq!(v["detail"], "connect 198.51.100.11:80: timed out");
        s.last_error = None;
        assert_eq!(
            out_json(Some(&s))["detail"],
            "connect 198.51.100.11:80: timed out"
        );
    }
}
