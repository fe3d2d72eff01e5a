//! `[gateway.sync]`: where this gateway exchanges flow state and with whom. The peers list
//! is also the sync thread's access list (a datagram from any other address is dropped), so
//! every entry must be an address a datagram can come from.

use std::collections::HashSet;
use std::net::SocketAddr;

use super::Checker;
use crate::model::FlowSync;
use crate::raw::RawSync;

/// More peers than this is a mistake: every record is sent to every peer, so the cost of a
/// new flow grows with the list, and a rack's fleet is a handful of gateways (the testbed
/// runs four).
pub(crate) const MAX_PEERS: usize = 16;

impl Checker {
    pub(super) fn sync(&mut self, raw: &RawSync) -> Option<FlowSync> {
        let listen = self
            .required("gateway.sync.listen", raw.listen.as_deref())
            .and_then(|s| self.sync_addr("gateway.sync.listen", s))
            .and_then(|a| {
                if a.ip().is_unspecified() {
                    // Records go out from it, and a peer takes them only from the address
                    // it lists for this gateway: that address, not any.
                    self.problem(
                        "gateway.sync.listen",
                        format!(
                            "{} is no address a peer can list; give this gateway's own",
                            a.ip()
                        ),
                    );
                    return None;
                }
                Some(a)
            });
        let peers = self.sync_peers(raw.peers.as_deref(), listen);
        Some(FlowSync {
            listen: listen?,
            peers: peers?,
        })
    }

    fn sync_addr(&mut self, path: &str, value: &str) -> Option<SocketAddr> {
        let Ok(a) = value.parse::<SocketAddr>() else {
            self.problem(
                path,
                format!("{value:?} is not an address:port like \"192.0.2.1:7946\""),
            );
            return None;
        };
        if a.port() == 0 {
            self.problem(path, "port 0 is not a port to exchange flows on");
            return None;
        }
        if a.ip().is_multicast() {
            self.problem(path, format!("{} is a multicast address", a.ip()));
            return None;
        }
        if matches!(a.ip(), std::net::IpAddr::V4(v4) if v4.is_broadcast()) {
            self.problem(path, format!("{} is the broadcast address", a.ip()));
            return None;
        }
        Some(a)
    }

    fn sync_peers(
        &mut self,
        raw: Option<&[String]>,
        listen: Option<SocketAddr>,
    ) -> Option<Vec<SocketAddr>> {
        let path = "gateway.sync.peers";
        let raw = self.required(path, raw)?;
        if raw.is_empty() {
            self.problem(
                path,
                "is empty; name at least one peer gateway's sync.listen",
            );
            return None;
        }
        if raw.len() > MAX_PEERS {
            self.problem(path, format!("{} peers; at most {MAX_PEERS}", raw.len()));
            return None;
        }
        let mut seen = HashSet::new();
        let mut ok = true;
        let mut out = Vec::with_capacity(raw.len());
        for (i, s) in raw.iter().enumerate() {
            let p = format!("{path}[{i}]");
            let Some(a) = self.sync_addr(&p, s) else {
                ok = false;
                continue;
            };
            if a.ip().is_unspecified() {
                self.problem(&p, format!("{} is not a peer's address", a.ip()));
                ok = false;
            } else if !seen.insert(a) {
                self.problem(&p, format!("{a} is listed twice"));
                ok = false;
            } else if Some(a) == listen {
                self.problem(&p, format!("{a} is this gateway's own sync.listen"));
                ok = false;
            } else if listen.is_some_and(|l| l.is_ipv4() != a.is_ipv4()) {
                self.problem(
                    &p,
                    format!("{a} is not of sync.listen's address family (records go out from it)"),
                );
                ok = false;
            }
            out.push(a);
        }
        ok.then_some(out)
    }
}
