//! `[gateway.bgp]`: what the BIRD configuration the gateway writes is made from, so every
//! value that reaches it is checked here (numbers in range, addresses of the right kind, a
//! password BIRD's quoting cannot be broken out of).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;

use super::{show, Checker};
use crate::model::{Bgp, BgpPeer};
use crate::raw::{RawBgp, RawBgpPeer};

/// AS_TRANS (RFC 6793): a placeholder for four-byte numbers on old sessions, never an AS.
const AS_TRANS: u32 = 23456;

/// TCP MD5 keys are at most 80 bytes (`TCP_MD5SIG_MAXKEYLEN`).
const MAX_PASSWORD_LEN: usize = 80;

impl Checker {
    pub(super) fn bgp(&mut self, raw: &RawBgp) -> Option<Bgp> {
        let asn = self
            .required("gateway.bgp.asn", raw.asn)
            .and_then(|a| self.asn("gateway.bgp.asn", a));
        let router_id = self
            .required("gateway.bgp.router_id", raw.router_id.as_deref())
            .and_then(|s| self.router_id(s));
        let communities = self.communities(raw.communities.as_deref().unwrap_or_default());
        let announce = self.announce(raw.announce.as_deref().unwrap_or_default());
        let daemon = match raw.daemon.as_deref() {
            None => Some(PathBuf::from(Bgp::DEFAULT_DAEMON)),
            Some("") => {
                self.problem(
                    "gateway.bgp.daemon",
                    "is empty; give the path of BIRD 2's `bird`",
                );
                None
            }
            Some(p) => Some(PathBuf::from(p)),
        };
        let peers = self.peers(&raw.peers);
        Some(Bgp {
            asn: asn?,
            router_id: router_id?,
            peers: peers?,
            communities: communities?,
            announce: announce?,
            daemon: daemon?,
        })
    }

    fn asn(&mut self, path: &str, value: i64) -> Option<u32> {
        let asn = self.int(path, value, 1u32, u32::MAX - 1)?;
        if asn == AS_TRANS {
            self.problem(
                path,
                format!("{AS_TRANS} is AS_TRANS (RFC 6793), reserved, not an AS number"),
            );
            return None;
        }
        Some(asn)
    }

    fn router_id(&mut self, value: &str) -> Option<Ipv4Addr> {
        let path = "gateway.bgp.router_id";
        match value.parse::<Ipv4Addr>() {
            Ok(id) if id.is_unspecified() => {
                self.problem(path, "0.0.0.0 is not a router id");
                None
            }
            Ok(id) => Some(id),
            Err(_) => {
                self.problem(
                    path,
                    format!("{value:?} is not a router id (written as an IPv4 address, e.g. \"192.0.2.1\")"),
                );
                None
            }
        }
    }

    fn communities(&mut self, raw: &[String]) -> Option<Vec<(u16, u16)>> {
        let mut out = Vec::with_capacity(raw.len());
        let mut ok = true;
        for (i, c) in raw.iter().enumerate() {
            let parsed = c
                .split_once(':')
                .and_then(|(a, v)| Some((a.parse::<u16>().ok()?, v.parse::<u16>().ok()?)));
            match parsed {
                Some(pair) => out.push(pair),
                None => {
                    self.problem(
                        format!("gateway.bgp.communities[{i}]"),
                        format!("{c:?} is not a community like \"64512:100\" (two numbers of 0..=65535)"),
                    );
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }

    fn announce(&mut self, raw: &[String]) -> Option<Vec<IpNet>> {
        let mut out = Vec::with_capacity(raw.len());
        let mut ok = true;
        for (i, n) in raw.iter().enumerate() {
            match n.parse::<IpNet>() {
                Ok(net) => out.push(net.trunc()),
                Err(_) => {
                    self.problem(
                        format!("gateway.bgp.announce[{i}]"),
                        format!("{n:?} is not a prefix like \"203.0.113.0/24\""),
                    );
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }

    fn peers(&mut self, raw: &[RawBgpPeer]) -> Option<Vec<BgpPeer>> {
        if raw.is_empty() {
            self.problem(
                "gateway.bgp.peers",
                "at least one peer is required ([[gateway.bgp.peers]])",
            );
            return None;
        }
        let mut seen: HashMap<IpAddr, String> = HashMap::new();
        let mut out = Vec::with_capacity(raw.len());
        for (i, p) in raw.iter().enumerate() {
            let path = format!("gateway.bgp.peers[{i}]");
            let address = self.peer_address(&path, p.address.as_deref());
            if let Some(a) = address {
                if let Some(first) = seen.get(&a) {
                    self.problem(
                        format!("{path}.address"),
                        format!("{a} is already the peer {first}"),
                    );
                } else {
                    seen.insert(a, path.clone());
                }
            }
            let asn = self
                .required(&format!("{path}.asn"), p.asn)
                .and_then(|a| self.asn(&format!("{path}.asn"), a));
            let port = self.port_or(&format!("{path}.port"), p.port, BgpPeer::DEFAULT_PORT);
            let password = match &p.password {
                None => Some(None),
                Some(pw) => self.password(&format!("{path}.password"), pw).map(Some),
            };
            let hold_time = self.hold_time(&format!("{path}.hold_time"), p.hold_time.as_ref());
            out.push(match (address, asn, port, password, hold_time) {
                (Some(address), Some(asn), Some(port), Some(password), Some(hold_time)) => {
                    Some(BgpPeer {
                        address,
                        asn,
                        port,
                        password,
                        bfd: p.bfd.unwrap_or(false),
                        hold_time,
                    })
                }
                _ => None,
            });
        }
        out.into_iter().collect()
    }

    fn peer_address(&mut self, path: &str, raw: Option<&str>) -> Option<IpAddr> {
        let path = format!("{path}.address");
        let a = self.required(&path, raw)?;
        if let Ok(IpAddr::V6(v6)) = a.parse::<IpAddr>() {
            if v6.is_unicast_link_local() {
                self.problem(
                    path,
                    format!("{v6} is link-local; give the peer's global address (a link-local session needs an interface, which Strait does not configure)"),
                );
                return None;
            }
        }
        self.unicast(&path, a)
    }

    fn password(&mut self, path: &str, pw: &str) -> Option<String> {
        let printable = pw.chars().all(|c| c.is_ascii_graphic() || c == ' ');
        if pw.is_empty() || pw.len() > MAX_PASSWORD_LEN {
            self.problem(
                path,
                format!(
                    "is {} bytes long; TCP MD5 passwords have 1 to {MAX_PASSWORD_LEN}",
                    pw.len()
                ),
            );
            None
        } else if !printable || pw.contains(['"', '\\']) {
            self.problem(
                path,
                "may hold printable ASCII and spaces only, without '\"' or '\\'",
            );
            None
        } else {
            Some(pw.to_owned())
        }
    }

    fn hold_time(&mut self, path: &str, raw: Option<&String>) -> Option<Duration> {
        let d = self.duration_or(path, raw, BgpPeer::DEFAULT_HOLD_TIME)?;
        if d.subsec_nanos() != 0 {
            self.problem(
                path,
                format!("{} is not a whole number of seconds", show(d)),
            );
            return None;
        }
        if d.is_zero() {
            // RFC 4271: zero turns keepalives and the hold timer off.
            return Some(d);
        }
        self.duration_in(path, d, BgpPeer::MIN_HOLD_TIME, BgpPeer::MAX_HOLD_TIME)
    }
}
