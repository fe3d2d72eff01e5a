//! `[gateway.l2]`: what the keepalived configuration the gateway writes is made from.

use std::collections::HashSet;
use std::path::PathBuf;

use super::{show, Checker};
use crate::model::L2;
use crate::raw::RawL2;

/// Longest gateway name (keepalived's `router_id` and instance names carry it).
const MAX_NAME_LEN: usize = 32;

impl Checker {
    pub(super) fn l2(&mut self, raw: &RawL2) -> Option<L2> {
        let name = self
            .required("gateway.l2.name", raw.name.as_deref())
            .and_then(|n| self.gateway_name("gateway.l2.name", n));
        let members = self
            .required("gateway.l2.members", raw.members.as_deref())
            .and_then(|m| self.members(m));
        if let (Some(n), Some(m)) = (&name, &members) {
            if !m.contains(n) {
                self.problem(
                    "gateway.l2.members",
                    format!("does not name this gateway ({n:?}, gateway.l2.name)"),
                );
                return None;
            }
        }
        let advert_interval = self
            .duration_or(
                "gateway.l2.advert_interval",
                raw.advert_interval.as_ref(),
                L2::DEFAULT_ADVERT_INTERVAL,
            )
            .and_then(|d| {
                if d.as_nanos() % 10_000_000 != 0 {
                    self.problem(
                        "gateway.l2.advert_interval",
                        format!(
                            "{} is not a whole number of centiseconds (VRRPv3's unit)",
                            show(d)
                        ),
                    );
                    return None;
                }
                self.duration_in(
                    "gateway.l2.advert_interval",
                    d,
                    L2::MIN_ADVERT_INTERVAL,
                    L2::MAX_ADVERT_INTERVAL,
                )
            });
        let daemon = match raw.daemon.as_deref() {
            None => Some(PathBuf::from(L2::DEFAULT_DAEMON)),
            Some("") => {
                self.problem(
                    "gateway.l2.daemon",
                    "is empty; give the path of `keepalived`",
                );
                None
            }
            Some(p) => Some(PathBuf::from(p)),
        };
        Some(L2 {
            name: name?,
            members: members?,
            advert_interval: advert_interval?,
            daemon: daemon?,
        })
    }

    fn gateway_name(&mut self, path: &str, name: &str) -> Option<String> {
        let ok = !name.is_empty()
            && name.len() <= MAX_NAME_LEN
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if ok {
            Some(name.to_owned())
        } else {
            self.problem(
                path,
                format!(
                    "{name:?} is not a gateway name (1 to {MAX_NAME_LEN} of A-Z a-z 0-9 . _ -)"
                ),
            );
            None
        }
    }

    fn members(&mut self, raw: &[String]) -> Option<Vec<String>> {
        if raw.is_empty() || raw.len() > L2::MAX_MEMBERS {
            self.problem(
                "gateway.l2.members",
                format!(
                    "has {} names; give 1 to {} gateways",
                    raw.len(),
                    L2::MAX_MEMBERS
                ),
            );
            return None;
        }
        let mut seen = HashSet::new();
        let mut out = Vec::with_capacity(raw.len());
        let mut ok = true;
        for (i, m) in raw.iter().enumerate() {
            let path = format!("gateway.l2.members[{i}]");
            match self.gateway_name(&path, m) {
                Some(n) if !seen.insert(n.clone()) => {
                    self.problem(path, format!("{n:?} is named twice"));
                    ok = false;
                }
                Some(n) => out.push(n),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }
}
