//! The translation kept between rounds: each Service's own translation ([`Entry`]) is made
//! again only when the Service is dirty; who holds a contested frontend or name is decided
//! again only when one of its contenders changed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use strait_config::model;

use super::translator::{
    index_nodes, project_node, slice_use, NodeInfo, NodeUse, SliceUse, Translator,
};
use super::{owner_key, Age, Candidate, Change, Cluster, Front, Settings, Warning, WarningKind};

/// What one Service translates to on its own.
#[derive(Debug)]
struct Entry {
    age: Age,
    candidates: Vec<Candidate>,
    warnings: Vec<Warning>,
    /// Which Nodes it read, so that changes of those Nodes (only) touch it.
    node_use: NodeUse,
}

impl Entry {
    fn candidate(&self, f: Front) -> Option<&Candidate> {
        self.candidates.iter().find(|c| c.front == f)
    }
}

/// Which Service holds a frontend, and the name of its service if that is valid.
#[derive(Debug, Clone)]
struct Won {
    age: Age,
    name: Option<String>,
}

/// The translation kept between rounds, so that a change re-translates only the Services
/// it touches.
///
/// ```text
/// Service key ─► Entry (candidates, each checked on its own; warnings)   re-made when dirty
/// frontend    ─► contenders by age ─► the oldest wins                     re-decided when a
/// name        ─► valid winners by age ─► the oldest is published          contender changes
/// ```
///
/// The caller says which Services are dirty: a Service that changed, the Services named
/// by a changed EndpointSlice ([`Incremental::set_slice`]), the `dsr-*` Services that
/// read a Node whose projection changed ([`Incremental::set_node`]), those whose addresses
/// changed. Fed every Service at once it gives what [`translate`] gives (which is made
/// that way).
///
/// A Node is read as its projection (addresses, readiness, the exclusion label) only: a
/// kubelet heartbeat or any other status churn leaves it as it was and touches no Service.
/// One whose projection changed touches the `dsr-*` Services under
/// `externalTrafficPolicy: Cluster` (every Node is their backend) and those under `Local`
/// whose endpoints name it, not the others.
///
/// [`translate`]: super::translate
#[derive(Debug, Default)]
pub struct Incremental {
    nodes: BTreeMap<String, NodeInfo>,
    /// Warnings of the Nodes that have some.
    node_warnings: BTreeMap<String, Vec<Warning>>,
    /// Services whose backends are every Node.
    all_node_users: BTreeSet<String>,
    /// Node name -> the Services whose endpoints name it (under `Local`).
    node_users: HashMap<String, BTreeSet<String>>,
    /// Usable slice key -> key of the Service it is labelled for.
    slice_owner: HashMap<String, String>,
    /// Service key -> its usable slices.
    slices_of: HashMap<String, BTreeSet<String>>,
    slice_warnings: BTreeMap<String, Warning>,
    entries: HashMap<String, Entry>,
    /// Entries with warnings.
    warned: BTreeSet<String>,
    claims: HashMap<Front, BTreeSet<Age>>,
    /// Frontends with more than one contender.
    contested: BTreeSet<Front>,
    won: HashMap<Front, Won>,
    /// Won frontends whose service is invalid: the rules it breaks.
    invalid: HashMap<Front, Vec<Warning>>,
    names: HashMap<String, BTreeSet<(Age, Front)>>,
    /// Names with more than one valid contender.
    doubled: BTreeSet<String>,
    out: BTreeMap<String, Arc<model::Service>>,
    /// Services translated by the last [`Incremental::update`].
    translated: usize,
}

impl Incremental {
    /// The translated services, sorted by name.
    pub fn services(&self) -> impl ExactSizeIterator<Item = &Arc<model::Service>> {
        self.out.values()
    }

    /// Whether Service `key` (`namespace/name`) has a translated service: the gateway
    /// serves it.
    pub fn publishes(&self, key: &str) -> bool {
        let prefix = format!("{key}/");
        self.out
            .range(prefix.clone()..)
            .next()
            .is_some_and(|(name, _)| name.starts_with(&prefix))
    }

    /// Everything left out, sorted, each once.
    pub fn warnings(&self) -> Vec<Warning> {
        let mut w: Vec<Warning> = self.node_warnings.values().flatten().cloned().collect();
        w.extend(self.slice_warnings.values().cloned());
        for key in &self.warned {
            if let Some(e) = self.entries.get(key) {
                w.extend(e.warnings.iter().cloned());
            }
        }
        for f in &self.contested {
            let Some(set) = self.claims.get(f) else {
                continue;
            };
            let mut it = set.iter();
            let Some(winner) = it.next() else { continue };
            for loser in it {
                w.push(Warning {
                    kind: WarningKind::FrontendConflict,
                    object: format!("service {}", loser.key),
                    message: format!(
                        "{} {} is already served for {}",
                        std::net::SocketAddr::new(f.0, f.1),
                        f.2,
                        winner.key
                    ),
                });
            }
        }
        for v in self.invalid.values() {
            w.extend(v.iter().cloned());
        }
        for name in &self.doubled {
            let Some(set) = self.names.get(name) else {
                continue;
            };
            let mut it = set.iter();
            let Some((first, _)) = it.next() else {
                continue;
            };
            for (age, _) in it {
                w.push(Warning {
                    kind: WarningKind::Invalid,
                    object: format!("service {name}"),
                    message: format!(
                        "name {name:?} of service {} is already used by a service of {}",
                        age.key, first.key
                    ),
                });
            }
        }
        w.sort();
        w.dedup();
        w
    }

    /// Takes the Nodes as they are now (after a relist); returns the keys of the Services
    /// that read a Node whose projection changed (to mark dirty).
    pub fn set_nodes(&mut self, nodes: &BTreeMap<String, Node>) -> Vec<String> {
        let (index, warnings) = index_nodes(nodes);
        let old = std::mem::replace(&mut self.nodes, index);
        self.node_warnings = warnings;
        let mut changed: BTreeSet<&String> = BTreeSet::new();
        for (name, info) in &old {
            if self.nodes.get(name) != Some(info) {
                changed.insert(name);
            }
        }
        for name in self.nodes.keys() {
            if !old.contains_key(name) {
                changed.insert(name);
            }
        }
        let mut users: BTreeSet<String> = BTreeSet::new();
        if !changed.is_empty() {
            users.extend(self.all_node_users.iter().cloned());
        }
        for name in changed {
            users.extend(self.node_users.get(name).into_iter().flatten().cloned());
        }
        users.into_iter().collect()
    }

    /// Takes Node `name` as it is now (`None`: deleted, or never parsed). Returns `None` when
    /// nothing translation reads of it changed (its projection and its warnings: a
    /// heartbeat, say), else the keys of the Services that read it (to mark dirty; empty
    /// when only its warnings changed).
    pub fn set_node(&mut self, name: &str, node: Option<&Node>) -> Option<Vec<String>> {
        let (info, warnings) = match node {
            Some(n) => project_node(name, n),
            None => (None, Vec::new()),
        };
        let warnings_changed =
            self.node_warnings.get(name).map_or(&[][..], Vec::as_slice) != warnings.as_slice();
        if warnings_changed {
            if warnings.is_empty() {
                self.node_warnings.remove(name);
            } else {
                self.node_warnings.insert(name.to_owned(), warnings);
            }
        }
        if self.nodes.get(name) == info.as_ref() {
            return warnings_changed.then(Vec::new);
        }
        match info {
            Some(i) => {
                self.nodes.insert(name.to_owned(), i);
            }
            None => {
                self.nodes.remove(name);
            }
        }
        let mut users: BTreeSet<String> = self.all_node_users.clone();
        users.extend(self.node_users.get(name).into_iter().flatten().cloned());
        Some(users.into_iter().collect())
    }

    /// Adds (or removes) Service `key`'s use of Nodes to the indexes of who reads a Node.
    fn index_node_use(&mut self, key: &str, use_: &NodeUse, add: bool) {
        match use_ {
            NodeUse::None => {}
            NodeUse::All => {
                if add {
                    self.all_node_users.insert(key.to_owned());
                } else {
                    self.all_node_users.remove(key);
                }
            }
            NodeUse::Named(names) => {
                for n in names {
                    if add {
                        self.node_users
                            .entry(n.clone())
                            .or_default()
                            .insert(key.to_owned());
                    } else if let Some(set) = self.node_users.get_mut(n) {
                        set.remove(key);
                        if set.is_empty() {
                            self.node_users.remove(n);
                        }
                    }
                }
            }
        }
    }

    /// Takes EndpointSlice `key` as it is now (`None`: deleted, or never parsed); returns the
    /// keys of the Services it was and is labelled for (to mark dirty).
    pub fn set_slice(&mut self, key: &str, slice: Option<&EndpointSlice>) -> Vec<String> {
        let mut touched = Vec::new();
        if let Some(old) = self.slice_owner.remove(key) {
            if let Some(set) = self.slices_of.get_mut(&old) {
                set.remove(key);
                if set.is_empty() {
                    self.slices_of.remove(&old);
                }
            }
            touched.push(old);
        }
        self.slice_warnings.remove(key);
        if let Some(slice) = slice {
            match slice_use(key, slice) {
                SliceUse::Unlabelled => {}
                SliceUse::Unusable(w) => {
                    self.slice_warnings.insert(key.to_owned(), w);
                }
                SliceUse::For(owner) => {
                    self.slices_of
                        .entry(owner.clone())
                        .or_default()
                        .insert(key.to_owned());
                    self.slice_owner.insert(key.to_owned(), owner.clone());
                    touched.push(owner);
                }
            }
        }
        touched
    }

    /// Takes every EndpointSlice anew (after a relist).
    pub fn reset_slices(&mut self, slices: &BTreeMap<String, EndpointSlice>) {
        self.slice_owner.clear();
        self.slices_of.clear();
        self.slice_warnings.clear();
        for (key, slice) in slices {
            self.set_slice(key, Some(slice));
        }
    }

    /// How many Services the last [`Incremental::update`] translated (those it was told
    /// were dirty and that exist).
    pub fn translated(&self) -> usize {
        self.translated
    }

    /// Keys of every Service translated (those that made a service or a warning).
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.entries.keys()
    }

    /// Re-translates the Services `dirty` (keys; those not in `cluster` are dropped) and
    /// re-decides the frontends and names they contend for. Returns the changes to the
    /// list of [`Incremental::services`], by name.
    pub fn update(
        &mut self,
        settings: &Settings,
        cluster: Cluster<'_>,
        lb: &BTreeMap<String, Vec<IpAddr>>,
        dirty: BTreeSet<String>,
    ) -> Vec<Change> {
        let mut fronts: BTreeSet<Front> = BTreeSet::new();
        self.translated = 0;
        for key in dirty {
            if let Some(old) = self.entries.remove(&key) {
                for c in &old.candidates {
                    if let Some(set) = self.claims.get_mut(&c.front) {
                        set.remove(&old.age);
                        if set.is_empty() {
                            self.claims.remove(&c.front);
                        }
                    }
                    fronts.insert(c.front);
                }
                self.warned.remove(&key);
                self.index_node_use(&key, &old.node_use, false);
            }
            let Some(svc) = cluster.services.get(&key) else {
                continue;
            };
            self.translated += 1;
            let vips = lb.get(&key).map(Vec::as_slice).unwrap_or(&[]);
            let entry = self.translate_one(settings, cluster.slices, &key, svc, vips);
            if entry.candidates.is_empty()
                && entry.warnings.is_empty()
                && entry.node_use == NodeUse::None
            {
                continue;
            }
            self.index_node_use(&key, &entry.node_use, true);
            for c in &entry.candidates {
                self.claims
                    .entry(c.front)
                    .or_default()
                    .insert(entry.age.clone());
                fronts.insert(c.front);
            }
            if !entry.warnings.is_empty() {
                self.warned.insert(key.clone());
            }
            self.entries.insert(key, entry);
        }
        // Who holds each touched frontend now.
        let mut names: BTreeSet<String> = BTreeSet::new();
        for f in fronts {
            let contenders = self.claims.get(&f).map_or(0, BTreeSet::len);
            if contenders > 1 {
                self.contested.insert(f);
            } else {
                self.contested.remove(&f);
            }
            if let Some(Won {
                age,
                name: Some(name),
            }) = self.won.remove(&f)
            {
                if let Some(set) = self.names.get_mut(&name) {
                    set.remove(&(age, f));
                }
                names.insert(name);
            }
            self.invalid.remove(&f);
            let winner = self.claims.get(&f).and_then(|s| s.first()).and_then(|age| {
                let c = self.entries.get(&age.key)?.candidate(f)?;
                Some((age.clone(), c.checked.clone()))
            });
            let Some((age, checked)) = winner else {
                continue;
            };
            match checked {
                Ok(s) => {
                    self.names
                        .entry(s.name.clone())
                        .or_default()
                        .insert((age.clone(), f));
                    names.insert(s.name.clone());
                    self.won.insert(
                        f,
                        Won {
                            age,
                            name: Some(s.name.clone()),
                        },
                    );
                }
                Err(w) => {
                    self.invalid.insert(f, w);
                    self.won.insert(f, Won { age, name: None });
                }
            }
        }
        // Which service each touched name publishes now.
        let mut changes = Vec::new();
        for name in names {
            let first = self.names.get(&name).and_then(|s| {
                if s.len() > 1 {
                    self.doubled.insert(name.clone());
                } else {
                    self.doubled.remove(&name);
                }
                s.first().cloned()
            });
            if first.is_none() {
                self.names.remove(&name);
            }
            let new = first.and_then(|(age, f)| {
                let c = self.entries.get(&age.key)?.candidate(f)?;
                c.checked.as_ref().ok().cloned()
            });
            match (self.out.get(&name), new) {
                (Some(o), Some(n)) if **o == *n => {}
                (None, None) => {}
                (_, Some(n)) => {
                    self.out.insert(name.clone(), Arc::clone(&n));
                    changes.push((name, Some(n)));
                }
                (Some(_), None) => {
                    self.out.remove(&name);
                    changes.push((name, None));
                }
            }
        }
        changes
    }

    fn translate_one(
        &self,
        settings: &Settings,
        slices: &BTreeMap<String, EndpointSlice>,
        key: &str,
        svc: &Service,
        vips: &[IpAddr],
    ) -> Entry {
        let ns = svc.metadata.namespace.as_deref().unwrap_or("");
        let name = svc.metadata.name.as_deref().unwrap_or("");
        let list: Vec<(&str, &EndpointSlice)> = self
            .slices_of
            .get(&owner_key(ns, name))
            .into_iter()
            .flatten()
            .filter_map(|k| slices.get_key_value(k).map(|(k, s)| (k.as_str(), s)))
            .collect();
        let (out, warnings, node_use) =
            Translator::new(settings, &self.nodes, (ns, name), list).service(key, svc, vips);
        Entry {
            age: Age::of(key, svc),
            candidates: out,
            warnings,
            node_use,
        }
    }
}
