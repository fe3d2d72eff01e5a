//! Which VIPs the gateway claims: those of the published table's services, once the workers
//! forward. Followed per changed service (a count of services per VIP), so that a change
//! of one service of ten thousand looks at that one only, and a VIP two services share is
//! claimed once and released with the last of them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use strait_config::model::Config;

use super::merge;
use super::Changed;

/// The VIPs of the published services.
#[derive(Debug, Default)]
pub struct Vips {
    /// Each published service's VIP.
    of: HashMap<String, IpAddr>,
    /// How many published services use each VIP.
    users: BTreeMap<IpAddr, u32>,
    /// Whether the VIPs are claimed (the workers forward).
    claiming: bool,
}

impl Vips {
    /// Starts claiming: every VIP of the published services, sorted; none when claiming
    /// already.
    pub fn start(&mut self) -> Vec<IpAddr> {
        if std::mem::replace(&mut self.claiming, true) {
            return Vec::new();
        }
        self.users.keys().copied().collect()
    }

    /// Whether claiming started (the workers forward).
    pub fn claiming(&self) -> bool {
        self.claiming
    }

    /// Whether a published service has `vip`.
    pub fn has(&self, vip: IpAddr) -> bool {
        self.users.contains_key(&vip)
    }

    /// The VIPs of the published services, claimed or not.
    pub fn known(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.users.keys().copied()
    }

    /// The VIPs claimed.
    pub fn claimed(&self) -> BTreeSet<IpAddr> {
        if self.claiming {
            self.users.keys().copied().collect()
        } else {
            BTreeSet::new()
        }
    }

    /// Follows a published table that `changed` these services of `config` (whose first
    /// `file_len` services are the file's): the VIPs to claim and to release, sorted
    /// (none before claiming starts).
    pub fn follow(
        &mut self,
        changed: &Changed,
        config: &Config,
        file_len: usize,
    ) -> (Vec<IpAddr>, Vec<IpAddr>) {
        // Every VIP whose users may change, and whether it was claimed before.
        let touched: BTreeSet<IpAddr> = match changed {
            Changed::All => self
                .users
                .keys()
                .copied()
                .chain(config.services.iter().map(|s| s.vip))
                .collect(),
            Changed::Services(names) => names
                .iter()
                .filter_map(|n| self.of.get(n).copied())
                .chain(
                    names
                        .iter()
                        .filter_map(|n| merge::find(config, file_len, n).map(|s| s.vip)),
                )
                .collect(),
        };
        let before: BTreeSet<IpAddr> = touched
            .iter()
            .filter(|v| self.users.contains_key(v))
            .copied()
            .collect();
        match changed {
            Changed::All => {
                self.of.clear();
                self.users.clear();
                for s in &config.services {
                    self.add(&s.name, s.vip);
                }
            }
            Changed::Services(names) => {
                for n in names {
                    if let Some(old) = self.of.remove(n) {
                        if let Some(c) = self.users.get_mut(&old) {
                            *c -= 1;
                            if *c == 0 {
                                self.users.remove(&old);
                            }
                        }
                    }
                    if let Some(s) = merge::find(config, file_len, n) {
                        self.add(n, s.vip);
                    }
                }
            }
        }
        if !self.claiming {
            return (Vec::new(), Vec::new());
        }
        let (mut claim, mut release) = (Vec::new(), Vec::new());
        for vip in touched {
            match (before.contains(&vip), self.users.contains_key(&vip)) {
                (false, true) => claim.push(vip),
                (true, false) => release.push(vip),
                _ => {}
            }
        }
        (claim, release)
    }

    fn add(&mut self, service: &str, vip: IpAddr) {
        self.of.insert(service.to_owned(), vip);
        *self.users.entry(vip).or_default() += 1;
    }
}
