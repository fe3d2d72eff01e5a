//! What Strait tells about the Services it serves, as the texts of Kubernetes Events
//! (`events.k8s.io/v1`): [`Notice`]s, their reasons, and which of them are new.
//! `crate::kube::events` posts them.
//!
//! Planning runs on every change in the cluster and would say the same thing again each
//! time; [`Deduper`] lets a notice through only when it is new for its Service, and again
//! only after it went away and came back.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ObjectReference;

use super::translate::WarningKind;

/// The reasons of Warning notices (Events): each is a metrics label, and
/// docs/kubernetes.md says what each means.
pub const WARNING_REASONS: [&str; 8] = [
    "InvalidAddress",
    "AddressFamilyMismatch",
    "AddressNotInPool",
    "AddressInUse",
    "AddressNotShared",
    "UnknownAddressPool",
    "PoolExhausted",
    "NoAddressPool",
];

/// Severity of a [`Notice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NoticeType {
    /// Something happened as asked (an address was assigned or released).
    Normal,
    /// Something could not be done (a pool is exhausted, a request cannot be met).
    Warning,
}

/// Something to tell a Service's owner: becomes a Kubernetes Event.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// The Service the notice is about.
    pub regarding: ObjectReference,
    /// Severity.
    pub type_: NoticeType,
    /// Short PascalCase reason: `AddressAssigned`, `AddressReleased`, or one of
    /// [`WARNING_REASONS`].
    pub reason: String,
    /// A sentence for people.
    pub message: String,
}

impl Notice {
    /// The Event's `action`: what the gateway was doing when it noticed.
    pub fn action(&self) -> &'static str {
        if self.reason == "AddressReleased" {
            "ReleaseAddress"
        } else if WarningKind::ALL.iter().any(|k| k.reason() == self.reason) {
            // Something the translation left out of the Service.
            "ServeService"
        } else {
            "AssignAddress"
        }
    }

    /// `namespace/name` of the Service.
    pub fn key(&self) -> String {
        format!(
            "{}/{}",
            self.regarding.namespace.as_deref().unwrap_or(""),
            self.regarding.name.as_deref().unwrap_or("")
        )
    }
}

/// Lets each notice through once while it holds.
#[derive(Debug, Default)]
pub struct Deduper {
    seen: BTreeMap<String, BTreeSet<(String, String)>>,
}

impl Deduper {
    /// Of this round's notices, those not given in the previous round for the same
    /// Service. `Normal` notices are one-off facts and always pass (they are only made
    /// when something was just done).
    pub fn fresh(&mut self, notices: Vec<Notice>) -> Vec<Notice> {
        let mut now: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
        let mut out = Vec::new();
        for n in notices {
            let key = n.key();
            let id = (n.reason.clone(), n.message.clone());
            let before = self.seen.get(&key).is_some_and(|s| s.contains(&id));
            if n.type_ == NoticeType::Warning {
                now.entry(key).or_default().insert(id);
            }
            if !before || n.type_ == NoticeType::Normal {
                out.push(n);
            }
        }
        self.seen = now;
        out
    }

    /// The number of Services with a standing warning, by reason (as of the last
    /// [`Deduper::fresh`]).
    pub fn standing(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for reasons in self.seen.values() {
            let distinct: BTreeSet<&str> = reasons.iter().map(|(r, _)| r.as_str()).collect();
            for r in distinct {
                *m.entry(r.to_owned()).or_insert(0) += 1;
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(name: &str, t: NoticeType, reason: &str) -> Notice {
        Notice {
            regarding: ObjectReference {
                namespace: Some("default".into()),
                name: Some(name.into()),
                ..Default::default()
            },
            type_: t,
            reason: reason.into(),
            message: "m".into(),
        }
    }

    #[test]
    fn warnings_pass_once_while_they_hold() {
        let mut d = Deduper::default();
        let w = n("a", NoticeType::Warning, "PoolExhausted");
        assert_eq!(d.fresh(vec![w.clone()]).len(), 1);
        assert_eq!(d.fresh(vec![w.clone()]).len(), 0);
        assert_eq!(d.fresh(vec![]).len(), 0);
        assert_eq!(d.fresh(vec![w.clone()]).len(), 1, "came back");
        let ok = n("a", NoticeType::Normal, "AddressAssigned");
        assert_eq!(d.fresh(vec![ok.clone()]).len(), 1);
        assert_eq!(d.fresh(vec![ok]).len(), 1);
    }
}
