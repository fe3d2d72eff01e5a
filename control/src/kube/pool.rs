//! LoadBalancer address allocation from configured pools, as MetalLB does it.
//!
//! ```text
//! every Service ──► plan(): 1. release what Services gone or no longer served hold,
//!  (oldest first)             and correct the status of those still there
//!                           2. claim what each served Service holds or its status shows,
//!                              if trusted (in a pool, of its family, or asked for);
//!                              set aside what other statuses still show
//!                           3. only then: every request, then allocation of the rest
//!                           4. status writes: the addresses held, or a cleared status
//!               ──► AddressPlan { assigned, status writes, notices for Events }
//! ```
//!
//! The one promise: no two Services' statuses show one address. An address leaves a
//! Service (released, refused, moved) at once, but it goes to another Service only once
//! no status shows it any more, that is once the status write that removes it has come
//! back through the watch. Until then the gateway serves it for nobody.
//!
//! The allocator keeps no state of its own across restarts: the cluster does, in each
//! Service's `status.loadBalancer.ingress`. Step 2 runs over all Services before step 3
//! allocates anything, and the caller runs the first plan only once the initial list of
//! Services is complete, so a restarted gateway never hands out an address that a Service
//! it has not seen yet already holds. A status is trusted only inside the pools: anyone
//! allowed to write `services/status` could otherwise make the gateway claim any address.
//!
//! Pure: no IO, no clock. Allocation is deterministic (lowest free address of the first
//! pool of the family that has one), so tests can name the address they expect.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;

use super::events::{Notice, NoticeType};
use super::settings::ADDRESS_ANNOTATION;
use super::{object_key, service_reference};

/// An address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// Kubernetes' spelling (`spec.ipFamilies`): `IPv4`, `IPv6`.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an address could not be given to a Service.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// The requested address lies outside every pool.
    #[error("requested address {addr} not in any pool ({pools})")]
    NotInPool {
        /// The address asked for.
        addr: IpAddr,
        /// The configured pools, for the message.
        pools: String,
    },
    /// The address is held by another Service.
    #[error("address {addr} is already used by {owner}")]
    InUse {
        /// The address asked for.
        addr: IpAddr,
        /// The Service (`namespace/name`) holding it.
        owner: String,
    },
    /// Every address of the family's pools is taken.
    #[error("no free {family} address left in pools {pools}")]
    Exhausted {
        /// The family asked for.
        family: Family,
        /// The pools of that family, for the message.
        pools: String,
    },
    /// No pool of the family is configured.
    #[error("no {family} address pool is configured")]
    NoPool {
        /// The family asked for.
        family: Family,
    },
}

impl AllocError {
    /// The Event reason for this error (PascalCase, as Kubernetes reasons are).
    pub fn reason(&self) -> &'static str {
        match self {
            AllocError::NotInPool { .. } => "AddressNotInPool",
            AllocError::InUse { .. } => "AddressInUse",
            AllocError::Exhausted { .. } => "PoolExhausted",
            AllocError::NoPool { .. } => "NoAddressPool",
        }
    }
}

/// Which addresses are held, by whom, which pools they come from, and which addresses
/// statuses still show though nobody holds them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocator {
    pools: Vec<IpNet>,
    owner: BTreeMap<IpAddr, String>,
    held: BTreeMap<String, BTreeSet<IpAddr>>,
    /// Addresses some Service's status shows that nobody holds, with the (oldest) Service
    /// showing them: never given to anyone else until that status stops showing them.
    /// Made anew by each [`plan`].
    shown: BTreeMap<IpAddr, String>,
    /// Services this gateway no longer serves whose status still shows addresses it gave
    /// them (or, for a Service that is no LoadBalancer at all, pool addresses): their
    /// status is corrected until it no longer shows them.
    releasing: BTreeMap<String, BTreeSet<IpAddr>>,
}

impl Allocator {
    /// An allocator over `pools` (normalised to their networks), holding nothing.
    pub fn new(pools: &[IpNet]) -> Self {
        Self {
            pools: pools.iter().map(IpNet::trunc).collect(),
            ..Self::default()
        }
    }

    /// Whether `addr` lies inside a pool.
    pub fn in_pool(&self, addr: IpAddr) -> bool {
        self.pools.iter().any(|p| p.contains(&addr))
    }

    /// Who holds `addr`.
    pub fn owner(&self, addr: IpAddr) -> Option<&str> {
        self.owner.get(&addr).map(String::as_str)
    }

    /// The Service whose status shows `addr` though nobody holds it (as of the last
    /// [`plan`]).
    pub fn shown_by(&self, addr: IpAddr) -> Option<&str> {
        self.shown.get(&addr).map(String::as_str)
    }

    /// The addresses `owner` holds, lowest first.
    pub fn addresses_of(&self, owner: &str) -> Vec<IpAddr> {
        self.held
            .get(owner)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The owners that hold something.
    pub fn owners(&self) -> impl Iterator<Item = &str> {
        self.held.keys().map(String::as_str)
    }

    /// Number of addresses held.
    pub fn count(&self) -> usize {
        self.owner.len()
    }

    fn take(&mut self, owner: &str, addr: IpAddr) {
        self.owner.insert(addr, owner.to_owned());
        self.held.entry(owner.to_owned()).or_default().insert(addr);
    }

    /// Records that `owner` holds `addr`, in a pool or not ([`plan`] decides which
    /// addresses to trust).
    ///
    /// # Errors
    /// [`AllocError::InUse`] when another owner holds it, or another Service's status
    /// still shows it.
    pub fn claim(&mut self, owner: &str, addr: IpAddr) -> Result<(), AllocError> {
        match (self.owner.get(&addr), self.shown.get(&addr)) {
            (Some(o), _) if o == owner => Ok(()),
            (Some(o), _) => Err(AllocError::InUse {
                addr,
                owner: o.clone(),
            }),
            (None, Some(s)) if s != owner => Err(AllocError::InUse {
                addr,
                owner: format!("{s} (its status still shows it)"),
            }),
            (None, _) => {
                self.take(owner, addr);
                Ok(())
            }
        }
    }

    /// Gives `owner` the address it asked for. With pools configured the address must lie
    /// in one; with none, the operator manages addresses and any address is accepted.
    ///
    /// # Errors
    /// [`AllocError::NotInPool`], [`AllocError::InUse`].
    pub fn request(&mut self, owner: &str, addr: IpAddr) -> Result<(), AllocError> {
        if !self.pools.is_empty() && !self.in_pool(addr) {
            return Err(AllocError::NotInPool {
                addr,
                pools: show(self.pools.iter()),
            });
        }
        self.claim(owner, addr)
    }

    /// Gives `owner` the lowest free address of `family`, from the first pool that has
    /// one. The network and broadcast addresses of IPv4 pools larger than /31 and the
    /// subnet-router anycast address of IPv6 pools larger than /127 are never handed out,
    /// nor is an address a status still shows.
    ///
    /// # Errors
    /// [`AllocError::NoPool`], [`AllocError::Exhausted`].
    pub fn allocate(&mut self, owner: &str, family: Family) -> Result<IpAddr, AllocError> {
        let pools: Vec<IpNet> = self
            .pools
            .iter()
            .filter(|p| Family::of(p.addr()) == family)
            .copied()
            .collect();
        if pools.is_empty() {
            return Err(AllocError::NoPool { family });
        }
        for pool in &pools {
            if let Some(addr) = self.first_free(*pool) {
                self.take(owner, addr);
                return Ok(addr);
            }
        }
        Err(AllocError::Exhausted {
            family,
            pools: show(pools.iter()),
        })
    }

    /// The lowest usable address of `pool` nobody holds and no status shows. Walks the
    /// taken addresses inside the pool in order, so the work is bounded by the number
    /// taken, not the pool's size (an IPv6 /64 is fine).
    fn first_free(&self, pool: IpNet) -> Option<IpAddr> {
        let (lo, hi) = usable(pool)?;
        let range = to_ip(pool, lo)..=to_ip(pool, hi);
        let mut held = self.owner.range(range.clone()).map(|(a, _)| *a).peekable();
        let mut shown = self.shown.range(range).map(|(a, _)| *a).peekable();
        // Both in order, merged (an address may be in both).
        let taken = std::iter::from_fn(|| match (held.peek(), shown.peek()) {
            (Some(h), Some(s)) if s < h => shown.next(),
            (Some(_), _) => held.next(),
            (None, _) => shown.next(),
        });
        let mut candidate = lo;
        for t in taken.map(to_u128) {
            if t > candidate {
                break;
            }
            if t == candidate {
                if candidate == hi {
                    return None;
                }
                candidate += 1;
            }
        }
        Some(to_ip(pool, candidate))
    }

    /// Releases everything `owner` holds; returns what it held.
    pub fn release(&mut self, owner: &str) -> Vec<IpAddr> {
        let held = self.held.remove(owner).unwrap_or_default();
        for a in &held {
            self.owner.remove(a);
        }
        held.into_iter().collect()
    }

    /// Releases one address of `owner`.
    pub fn release_one(&mut self, owner: &str, addr: IpAddr) {
        if self.owner.get(&addr).is_some_and(|o| o == owner) {
            self.owner.remove(&addr);
            if let Some(set) = self.held.get_mut(owner) {
                set.remove(&addr);
                if set.is_empty() {
                    self.held.remove(owner);
                }
            }
        }
    }
}

/// First and last address of `pool` that may be handed out, as integers.
fn usable(pool: IpNet) -> Option<(u128, u128)> {
    let (first, last, bits) = match pool {
        IpNet::V4(n) => (
            u128::from(u32::from(n.network())),
            u128::from(u32::from(n.broadcast())),
            32,
        ),
        IpNet::V6(n) => (u128::from(n.network()), u128::from(n.broadcast()), 128),
    };
    let host_bits = bits - pool.prefix_len();
    let (lo, hi) = match (pool, host_bits) {
        // /31, /32, /127, /128: every address is a host (RFC 3021 for /31).
        (_, 0 | 1) => (first, last),
        // IPv4: not the network nor the broadcast address.
        (IpNet::V4(_), _) => (first + 1, last - 1),
        // IPv6 has no broadcast; the all-zeros host is the subnet-router anycast
        // address (RFC 4291 section 2.6.1).
        (IpNet::V6(_), _) => (first + 1, last),
    };
    (lo <= hi).then_some((lo, hi))
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn to_ip(pool: IpNet, v: u128) -> IpAddr {
    match pool {
        // `v` comes from the pool's own IPv4 range, so it fits.
        IpNet::V4(_) => IpAddr::V4(Ipv4Addr::from(u32::try_from(v).unwrap_or(u32::MAX))),
        IpNet::V6(_) => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

fn show<T: fmt::Display>(items: impl Iterator<Item = T>) -> String {
    items.map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

/// A Service's new `status.loadBalancer.ingress` addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusUpdate {
    /// Namespace of the Service.
    pub namespace: String,
    /// Name of the Service.
    pub name: String,
    /// The addresses, primary family first; none clears the status.
    pub addresses: Vec<IpAddr>,
    /// The Service's `metadata.resourceVersion` the write is meant for, when it must not
    /// apply to a newer version: set when correcting the status of a Service this gateway
    /// no longer serves, whose new owner may have written its own addresses meanwhile.
    pub resource_version: Option<String>,
}

impl StatusUpdate {
    /// `namespace/name` of the Service.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What one planning round decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AddressPlan {
    /// LoadBalancer addresses of each owned Service (`namespace/name`), primary family
    /// first. Services that could not be given any address are absent.
    pub assigned: BTreeMap<String, Vec<IpAddr>>,
    /// Status writes needed: Services whose status does not show their addresses, and
    /// Services no longer served whose status still shows an address they were given.
    pub status: Vec<StatusUpdate>,
    /// What to tell the Services' owners (Kubernetes Events).
    pub notices: Vec<Notice>,
}

/// The addresses a Service shows in `status.loadBalancer.ingress[].ip` (hostnames and
/// unparsable entries are ignored).
pub fn status_addresses(svc: &Service) -> Vec<IpAddr> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|ing| {
            ing.iter()
                .filter_map(|i| i.ip.as_deref())
                .filter_map(|ip| ip.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The addresses a Service asks for: the [`ADDRESS_ANNOTATION`] (comma-separated), else
/// `spec.loadBalancerIP`. Unparsable entries are returned as errors for a notice.
pub fn requested_addresses(svc: &Service) -> (Vec<IpAddr>, Vec<String>) {
    let annotation = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ADDRESS_ANNOTATION))
        .map(String::as_str)
        .filter(|s| !s.trim().is_empty());
    let spec = svc
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_ip.as_deref())
        .filter(|s| !s.trim().is_empty());
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for part in annotation.or(spec).unwrap_or("").split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        match part.parse::<IpAddr>() {
            Ok(ip) if !ok.contains(&ip) => ok.push(ip),
            Ok(_) => {}
            Err(_) => bad.push(part.to_owned()),
        }
    }
    (ok, bad)
}

/// `spec.ipFamilyPolicy`, `SingleStack` when unset (the API server's default).
fn family_policy(svc: &Service) -> &str {
    svc.spec
        .as_ref()
        .and_then(|s| s.ip_family_policy.as_deref())
        .unwrap_or("SingleStack")
}

/// The families the Service has: `spec.ipFamilies`, only the first under `SingleStack`.
/// `None` when the spec lists none (the API server always fills it in for a LoadBalancer
/// Service; hand-made objects may not).
fn service_families(svc: &Service) -> Option<Vec<Family>> {
    let listed: Vec<Family> = svc
        .spec
        .as_ref()
        .and_then(|s| s.ip_families.as_ref())
        .map(|f| {
            f.iter()
                .filter_map(|f| match f.as_str() {
                    "IPv4" => Some(Family::V4),
                    "IPv6" => Some(Family::V6),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if listed.is_empty() {
        return None;
    }
    let dual = matches!(family_policy(svc), "PreferDualStack" | "RequireDualStack");
    Some(if dual {
        listed
    } else {
        listed.into_iter().take(1).collect()
    })
}

/// The families a Service wants addresses of: its own ([`service_families`]); without
/// them, IPv4 if an IPv4 pool exists, else IPv6.
fn wanted_families(svc: &Service, alloc: &Allocator) -> Vec<Family> {
    service_families(svc).unwrap_or_else(|| {
        let v4 = alloc.pools.iter().any(|p| p.addr().is_ipv4());
        vec![if v4 || alloc.pools.is_empty() {
            Family::V4
        } else {
            Family::V6
        }]
    })
}

fn require_dual_stack(svc: &Service) -> bool {
    family_policy(svc) == "RequireDualStack"
}

/// Refuses a request a Service cannot have, as MetalLB does: an address of a family the
/// Service does not have (an IPv6 address for a `SingleStack` IPv4 Service), or two of
/// one family.
fn check_families(svc: &Service, requested: &[IpAddr]) -> Result<(), String> {
    let families = service_families(svc);
    let mut seen = BTreeSet::new();
    for a in requested {
        let f = Family::of(*a);
        if let Some(fs) = &families {
            if !fs.contains(&f) {
                return Err(format!(
                    "requested address {a} is {f}, but the Service is {} {}",
                    family_policy(svc),
                    show(fs.iter())
                ));
            }
        }
        if !seen.insert(f) {
            return Err(format!(
                "requested addresses {} hold more than one {f} address; a Service has at most one per family",
                show(requested.iter())
            ));
        }
    }
    Ok(())
}

fn is_load_balancer(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
}

/// Why a Service this gateway gave addresses to is no longer served (for the Event).
fn not_served(svc: &Service) -> String {
    let spec = svc.spec.as_ref();
    match spec.and_then(|s| s.type_.as_deref()) {
        Some("LoadBalancer") => match spec.and_then(|s| s.load_balancer_class.as_deref()) {
            Some(c) => format!("the Service's loadBalancerClass is now {c}"),
            None => "the Service names no loadBalancerClass now".to_owned(),
        },
        t => format!("the Service is of type {} now", t.unwrap_or("ClusterIP")),
    }
}

/// What step 2 of [`plan`] learnt about an owned Service, for steps 3 and 4.
struct Owned<'a> {
    svc: &'a Service,
    key: &'a str,
    requested: Vec<IpAddr>,
    /// The request is refused as a whole: the Service gets nothing.
    refused: bool,
    /// What it held when the round began.
    held_before: Vec<IpAddr>,
}

/// One planning round over every Service, oldest first (an older Service wins a contested
/// address); `owns` says which ones this gateway serves.
///
/// 1. Services gone release their addresses. A Service no longer served (type or class
///    changed) releases them too, and its status is corrected until it no longer shows
///    them (so is that of a Service of another type showing a pool address).
/// 2. Every owned Service claims what it holds and what its status shows, if trusted:
///    inside a pool and of a family the Service has, or the address it requests. Then
///    every address a status shows that nobody holds is set aside for that Service.
/// 3. Requests, all of them; only then allocation from the pools, for Services that asked
///    for nothing.
/// 4. A Service whose status does not show exactly what it holds gets a status write,
///    one that holds nothing (a refused request, an exhausted pool) a cleared status.
///
/// Steps 2 and 4 keep the promise that no two statuses show one address: an address is
/// given to a Service only once no other Service's status shows it.
pub fn plan(
    alloc: &mut Allocator,
    services: &[&Service],
    owns: impl Fn(&Service) -> bool,
) -> AddressPlan {
    let mut out = AddressPlan::default();
    let keys: Vec<String> = services.iter().map(|s| object_key(&s.metadata)).collect();
    let owned: Vec<bool> = services.iter().map(|s| owns(s)).collect();
    alloc.shown.clear();

    // 1. Services gone release; those no longer served release and are corrected.
    let present: std::collections::HashSet<&str> = keys.iter().map(String::as_str).collect();
    let gone: Vec<String> = alloc
        .owners()
        .filter(|o| !present.contains(o))
        .map(str::to_owned)
        .collect();
    for g in gone {
        alloc.release(&g);
    }
    alloc.releasing.retain(|k, _| present.contains(k.as_str()));
    for ((svc, key), _) in services.iter().zip(&keys).zip(&owned).filter(|(_, o)| !**o) {
        release_unserved(alloc, svc, key, &mut out);
    }

    // 2. Claims of what owned Services hold, then what statuses show.
    let mut work = Vec::new();
    for ((svc, key), _) in services.iter().zip(&keys).zip(&owned).filter(|(_, o)| **o) {
        alloc.releasing.remove(key);
        work.push(claim_held(alloc, svc, key, &mut out));
    }
    for (svc, key) in services.iter().zip(&keys) {
        for a in status_addresses(svc) {
            if alloc.owner(a).is_none() {
                alloc.shown.entry(a).or_insert_with(|| key.clone());
            }
        }
    }

    // 3. Requests first, so that no older Service takes from the pool what a newer one
    //    asks for; then allocation.
    for w in work.iter().filter(|w| !w.refused) {
        for a in &w.requested {
            if alloc.owner(*a) == Some(w.key) {
                continue;
            }
            match alloc.request(w.key, *a) {
                Ok(()) => out.notices.push(notice(
                    w.svc,
                    NoticeType::Normal,
                    "AddressAssigned",
                    format!("assigned requested address {a}"),
                )),
                Err(e) => {
                    out.notices.push(notice(
                        w.svc,
                        NoticeType::Warning,
                        e.reason(),
                        e.to_string(),
                    ));
                }
            }
        }
    }
    for w in &work {
        // A Service that holds an address keeps it as its whole set, even if it wants
        // more families: adding one means a status write it did not ask for.
        if w.refused || !w.requested.is_empty() || !alloc.addresses_of(w.key).is_empty() {
            continue;
        }
        allocate(alloc, w.svc, w.key, &mut out);
    }

    // 4. Statuses.
    for w in &work {
        let mut addrs = alloc.addresses_of(w.key);
        // Primary family first, as in spec.ipFamilies.
        let first = wanted_families(w.svc, alloc).first().copied();
        addrs.sort_by_key(|a| (Some(Family::of(*a)) != first, *a));
        let lost: Vec<IpAddr> = w
            .held_before
            .iter()
            .copied()
            .filter(|a| !addrs.contains(a))
            .collect();
        if !lost.is_empty() {
            out.notices.push(notice(
                w.svc,
                NoticeType::Normal,
                "AddressReleased",
                format!("released {}", show(lost.iter())),
            ));
        }
        if status_addresses(w.svc) != addrs {
            out.status.push(StatusUpdate {
                namespace: w.svc.metadata.namespace.clone().unwrap_or_default(),
                name: w.svc.metadata.name.clone().unwrap_or_default(),
                addresses: addrs.clone(),
                resource_version: None,
            });
        }
        if !addrs.is_empty() {
            out.assigned.insert(w.key.to_owned(), addrs);
        }
    }
    out
}

/// Step 1 of [`plan`] for a Service this gateway does not serve: releases what it held,
/// and asks for its status to be corrected while it shows what it was given.
fn release_unserved(alloc: &mut Allocator, svc: &Service, key: &str, out: &mut AddressPlan) {
    let held = alloc.release(key);
    let status = status_addresses(svc);
    if !held.is_empty() {
        out.notices.push(notice(
            svc,
            NoticeType::Normal,
            "AddressReleased",
            format!("released {}: {}", show(held.iter()), not_served(svc)),
        ));
    }
    let before = alloc.releasing.get(key).cloned().unwrap_or_default();
    let mut mine: BTreeSet<IpAddr> = held.into_iter().filter(|a| status.contains(a)).collect();
    if !is_load_balancer(svc) {
        // Only a LoadBalancer Service has LoadBalancer addresses; a pool address in the
        // status of another is left over from before this gateway (re)started.
        let stale: Vec<IpAddr> = status
            .iter()
            .copied()
            .filter(|a| alloc.in_pool(*a) && !before.contains(a) && !mine.contains(a))
            .collect();
        if !stale.is_empty() {
            out.notices.push(notice(
                svc,
                NoticeType::Normal,
                "AddressReleased",
                format!(
                    "removing {} from the status: {}",
                    show(stale.iter()),
                    not_served(svc)
                ),
            ));
        }
        mine.extend(stale);
    }
    let mut releasing = before;
    releasing.extend(mine);
    releasing.retain(|a| status.contains(a));
    if releasing.is_empty() {
        alloc.releasing.remove(key);
        return;
    }
    out.status.push(StatusUpdate {
        namespace: svc.metadata.namespace.clone().unwrap_or_default(),
        name: svc.metadata.name.clone().unwrap_or_default(),
        addresses: status
            .iter()
            .copied()
            .filter(|a| !releasing.contains(a))
            .collect(),
        resource_version: svc.metadata.resource_version.clone(),
    });
    alloc.releasing.insert(key.to_owned(), releasing);
}

/// Step 2 of [`plan`] for an owned Service: checks its request, keeps what it holds and
/// what its status shows where trusted, and releases the rest.
fn claim_held<'a>(
    alloc: &mut Allocator,
    svc: &'a Service,
    key: &'a str,
    out: &mut AddressPlan,
) -> Owned<'a> {
    let (requested, bad) = requested_addresses(svc);
    for b in bad {
        out.notices.push(notice(
            svc,
            NoticeType::Warning,
            "InvalidAddress",
            format!("requested address {b:?} is not an IP address"),
        ));
    }
    let refused = match check_families(svc, &requested) {
        Ok(()) => false,
        Err(why) => {
            out.notices.push(notice(
                svc,
                NoticeType::Warning,
                "AddressFamilyMismatch",
                why,
            ));
            true
        }
    };
    let held_before = alloc.addresses_of(key);
    let status = status_addresses(svc);
    let families = service_families(svc);
    let trusted = |a: &IpAddr| {
        if refused {
            false
        } else if !requested.is_empty() {
            requested.contains(a)
        } else {
            alloc.in_pool(*a)
                && families
                    .as_ref()
                    .is_none_or(|f| f.contains(&Family::of(*a)))
        }
    };
    let keep: BTreeSet<IpAddr> = held_before
        .iter()
        .chain(&status)
        .copied()
        .filter(trusted)
        .collect();
    if requested.is_empty() && !refused {
        // Anyone allowed to write services/status could otherwise make the gateway claim
        // (answer ARP/ND for) any address.
        let pools = if alloc.pools.is_empty() {
            "none is configured".to_owned()
        } else {
            show(alloc.pools.iter())
        };
        for a in status.iter().filter(|a| !alloc.in_pool(**a)) {
            out.notices.push(notice(
                svc,
                NoticeType::Warning,
                "AddressNotInPool",
                format!("status address {a} is not in any pool ({pools}): not served, replaced"),
            ));
        }
    }
    for a in held_before.iter().filter(|a| !keep.contains(a)) {
        alloc.release_one(key, *a);
    }
    for a in keep {
        if let Err(e) = alloc.claim(key, a) {
            out.notices
                .push(notice(svc, NoticeType::Warning, e.reason(), e.to_string()));
        }
    }
    Owned {
        svc,
        key,
        requested,
        refused,
        held_before,
    }
}

/// Step 3 of [`plan`] for an owned Service that asked for nothing and holds nothing: an
/// address of each family it wants. A `RequireDualStack` Service gets both or none.
fn allocate(alloc: &mut Allocator, svc: &Service, key: &str, out: &mut AddressPlan) {
    let mut got = Vec::new();
    let mut failed = Vec::new();
    for family in wanted_families(svc, alloc) {
        match alloc.allocate(key, family) {
            Ok(a) => got.push(a),
            Err(e) => failed.push(e),
        }
    }
    if require_dual_stack(svc) && !failed.is_empty() {
        for a in got.drain(..) {
            alloc.release_one(key, a);
        }
    }
    for a in &got {
        out.notices.push(notice(
            svc,
            NoticeType::Normal,
            "AddressAssigned",
            format!("assigned {a} from the address pool"),
        ));
    }
    // PreferDualStack without a pool of one family is fine once the other family has an
    // address.
    let partial_ok = !got.is_empty();
    for e in failed {
        if partial_ok && matches!(e, AllocError::NoPool { .. }) {
            continue;
        }
        out.notices
            .push(notice(svc, NoticeType::Warning, e.reason(), e.to_string()));
    }
}

fn notice(svc: &Service, type_: NoticeType, reason: &str, message: String) -> Notice {
    Notice {
        regarding: service_reference(svc),
        type_,
        reason: reason.to_owned(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn lowest_free_address_skipping_network_and_broadcast() {
        let mut a = Allocator::new(&[net("203.0.113.0/30")]);
        assert_eq!(a.allocate("a", Family::V4), Ok(ip("203.0.113.1")));
        assert_eq!(a.allocate("b", Family::V4), Ok(ip("203.0.113.2")));
        assert!(matches!(
            a.allocate("c", Family::V4),
            Err(AllocError::Exhausted { .. })
        ));
        assert_eq!(a.release("a"), vec![ip("203.0.113.1")]);
        assert_eq!(a.allocate("c", Family::V4), Ok(ip("203.0.113.1")));
    }

    #[test]
    fn an_address_a_status_shows_is_not_handed_out() {
        let mut a = Allocator::new(&[net("203.0.113.16/29")]);
        a.claim("a", ip("203.0.113.17")).unwrap();
        a.shown.insert(ip("203.0.113.18"), "s".into());
        a.claim("b", ip("203.0.113.19")).unwrap();
        a.shown.insert(ip("203.0.113.19"), "b".into()); // held and shown: counted once
        a.shown.insert(ip("203.0.113.21"), "t".into());
        assert_eq!(a.allocate("c", Family::V4), Ok(ip("203.0.113.20")));
        assert_eq!(a.allocate("d", Family::V4), Ok(ip("203.0.113.22")));
        assert!(matches!(
            a.allocate("e", Family::V4),
            Err(AllocError::Exhausted { .. })
        ));
        assert!(matches!(
            a.request("e", ip("203.0.113.18")),
            Err(AllocError::InUse { .. })
        ));
        a.request("s", ip("203.0.113.18")).unwrap();
    }

    #[test]
    fn small_and_v6_pools() {
        let mut a = Allocator::new(&[net("192.0.2.8/31"), net("2001:db8::/64")]);
        assert_eq!(a.allocate("a", Family::V4), Ok(ip("192.0.2.8")));
        assert_eq!(a.allocate("b", Family::V4), Ok(ip("192.0.2.9")));
        assert_eq!(a.allocate("c", Family::V6), Ok(ip("2001:db8::1")));
        a.claim("x", ip("2001:db8::2")).unwrap();
        assert_eq!(a.allocate("d", Family::V6), Ok(ip("2001:db8::3")));
        let mut b = Allocator::new(&[net("2001:db8::/64")]);
        assert_eq!(
            b.allocate("a", Family::V4),
            Err(AllocError::NoPool { family: Family::V4 })
        );
    }

    #[test]
    fn request_must_be_in_a_pool_unless_there_are_none() {
        let mut a = Allocator::new(&[net("203.0.113.0/28")]);
        assert!(matches!(
            a.request("a", ip("198.51.100.1")),
            Err(AllocError::NotInPool { .. })
        ));
        a.request("a", ip("203.0.113.5")).unwrap();
        assert_eq!(
            a.request("b", ip("203.0.113.5")),
            Err(AllocError::InUse {
                addr: ip("203.0.113.5"),
                owner: "a".into()
            })
        );
        let mut none = Allocator::new(&[]);
        none.request("a", ip("198.51.100.1")).unwrap();
    }
}
