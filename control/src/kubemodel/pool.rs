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
//! The one promise: no two Services' statuses show one address, unless they share it by
//! choice (one sharing key, ports that do not overlap: [`Use`]), and then every address
//! belongs to one sharing group. An address leaves a
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
//! Pure: no IO, no clock. Allocation is deterministic (the lowest address the Service's
//! sharing group holds that it may join, else the lowest free address of the first pool of
//! the family that has one), so tests can name the address they expect. The annotations
//! read are Strait's, MetalLB's and Cilium LB-IPAM's ([`super::settings`]), so Services
//! move from those without edits.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;

use super::events::{Notice, NoticeType};
use super::settings::{
    ADDRESS_ANNOTATIONS, CROSS_NAMESPACE_ANNOTATIONS, POOL_ANNOTATIONS, SHARING_ANNOTATIONS,
};
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
    #[error("requested address {addr} not in {pools}")]
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
    /// No pool of the family is configured (in the pool the Service names).
    #[error("no {family} address pool is configured{}", pool.as_deref().map(|p| format!(" named {p}")).unwrap_or_default())]
    NoPool {
        /// The family asked for.
        family: Family,
        /// The pool the Service names, if any.
        pool: Option<String>,
    },
    /// The address is held by Services the asking one may not share it with.
    #[error("address {addr} cannot be shared: {why}")]
    NotShared {
        /// The address asked for.
        addr: IpAddr,
        /// Why not.
        why: String,
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
            AllocError::NotShared { .. } => "AddressNotShared",
        }
    }
}

/// How a Service uses an address, for the sharing rules: Services share an address only
/// with the same sharing key, in the same namespace (or namespaces that allow each other),
/// with the same backends under `externalTrafficPolicy: Local`, and on ports and protocols
/// that do not overlap (MetalLB's rules, plus Cilium's namespace rule).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Use {
    /// The sharing key (`strait.dev/allow-shared-ip` and its MetalLB and Cilium
    /// spellings); `None`: the Service shares with nobody.
    pub sharing: Option<String>,
    /// Under `externalTrafficPolicy: Local`, the pod selector (`k=v,...`): sharers must
    /// send to the same pods, since a node is a backend of the address only where they
    /// run. `None` under `Cluster`.
    pub backends: Option<String>,
    /// The Service's namespace.
    pub namespace: String,
    /// Other namespaces whose Services may share with this one (`*`: any).
    pub cross_namespace: Vec<String>,
    /// The ports it serves, as (protocol, port).
    pub ports: BTreeSet<(String, u16)>,
}

impl Use {
    /// Why `self` (a Service `me`) cannot share an address with `other` (held by `them`),
    /// or `None` when it can. The first element says whether it is a sharing conflict (one
    /// side has a sharing key) or plain use.
    fn conflict(&self, other: &Use, them: &str) -> Option<(bool, String)> {
        let (mine, theirs) = match (&self.sharing, &other.sharing) {
            (None, None) => return Some((false, String::new())),
            (None, Some(_)) => {
                return Some((
                    true,
                    format!("{them} shares it, but this Service has no sharing key"),
                ))
            }
            (Some(_), None) => return Some((true, format!("{them} does not share it"))),
            (Some(a), Some(b)) => (a, b),
        };
        if mine != theirs {
            return Some((
                true,
                format!("{them} shares it under the key {theirs:?}, not {mine:?}"),
            ));
        }
        let allows = |u: &Use, ns: &str| {
            u.namespace == ns || u.cross_namespace.iter().any(|n| n == "*" || n == ns)
        };
        if !allows(self, &other.namespace) || !allows(other, &self.namespace) {
            return Some((
                true,
                format!(
                    "{them} is in namespace {}; sharing across namespaces needs both Services to allow it ({})",
                    other.namespace, CROSS_NAMESPACE_ANNOTATIONS[0]
                ),
            ));
        }
        if self.backends != other.backends {
            return Some((
                true,
                format!(
                    "{them} has other backends (under externalTrafficPolicy: Local, sharers need the same policy and selector: {} and {})",
                    other.backends.as_deref().map_or("Cluster".to_owned(), |b| format!("Local {{{b}}}")),
                    self.backends.as_deref().map_or("Cluster".to_owned(), |b| format!("Local {{{b}}}")),
                ),
            ));
        }
        let both: Vec<String> = self
            .ports
            .intersection(&other.ports)
            .map(|(p, n)| format!("{p}/{n}"))
            .collect();
        if !both.is_empty() {
            return Some((
                true,
                format!("{them} already serves {} on it", both.join(", ")),
            ));
        }
        None
    }
}

/// An address pool: a CIDR, and the name `--kube-pool NAME=CIDR` gave it (the name a
/// Service selects it by with `strait.dev/address-pool` or MetalLB's annotation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// The pool's name; unnamed pools serve Services that name no pool.
    pub name: Option<String>,
    /// Its addresses.
    pub net: IpNet,
    /// Whether Services that name no pool get addresses from it (false: only those
    /// naming it).
    pub auto_assign: bool,
    /// Never hand out IPv4 addresses ending in .0 or .255 (old client firmware takes them
    /// for broadcast addresses).
    pub avoid_buggy: bool,
    /// Every address of `net` may be handed out (a CIDR cut from a range), not only its
    /// hosts.
    pub whole: bool,
    /// Which Services it is handed out to automatically, and before which other pools;
    /// `None`: any Service, after the scoped pools that admit it.
    pub scope: Option<Allocation>,
}

/// Which Services a pool's addresses are handed out to automatically (MetalLB's
/// `serviceAllocation`): in one of `namespaces` or of the namespaces `namespace_selectors`
/// picked (any namespace when both are empty), and matching one of `service_labels` (any
/// Service when empty); pools with a lower `priority` are tried first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocation {
    /// Namespaces admitted by name.
    pub namespaces: Vec<String>,
    /// Namespaces admitted because their labels match one of the pool's
    /// `namespaceSelectors`, as of the Namespaces last seen; `None`: the pool has no
    /// namespace selector.
    pub selected_namespaces: Option<BTreeSet<String>>,
    /// Label selectors, one of which a Service's labels must match; empty: all Services.
    pub service_labels: Vec<LabelSelector>,
    /// Lower first; unset after every set one.
    pub priority: Option<i32>,
}

impl Allocation {
    /// Whether a Service in `namespace` with `labels` is admitted.
    pub fn admits(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        let by_name = self.namespaces.iter().any(|n| n == namespace);
        let ns_ok = match &self.selected_namespaces {
            None => self.namespaces.is_empty() || by_name,
            Some(picked) => by_name || picked.contains(namespace),
        };
        ns_ok
            && (self.service_labels.is_empty()
                || self.service_labels.iter().any(|sel| sel.matches(labels)))
    }
}

/// A checked Kubernetes label selector: `matchLabels` and `matchExpressions`, all of
/// which must hold (an empty selector matches everything).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    /// Labels that must be present with these values.
    pub labels: BTreeMap<String, String>,
    /// `(key, operator, values)` requirements.
    pub exprs: Vec<(String, SelectorOp, BTreeSet<String>)>,
}

/// A `matchExpressions` operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectorOp {
    /// The label is present with one of the values.
    In,
    /// The label is absent or has none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

impl LabelSelector {
    /// Whether `labels` satisfy the selector.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.exprs.iter().all(|(k, op, values)| {
                let v = labels.get(k);
                match op {
                    SelectorOp::In => v.is_some_and(|v| values.contains(v)),
                    SelectorOp::NotIn => v.is_none_or(|v| !values.contains(v)),
                    SelectorOp::Exists => v.is_some(),
                    SelectorOp::DoesNotExist => v.is_none(),
                }
            })
    }
}

impl Pool {
    /// A pool of `net` as `--kube-pool` gives it: auto-assigned, hosts only.
    pub fn cidr(name: Option<String>, net: IpNet) -> Self {
        Self {
            name,
            net: net.trunc(),
            auto_assign: true,
            avoid_buggy: false,
            whole: false,
            scope: None,
        }
    }

    /// How many addresses of the pool may be handed out (hosts only unless `whole`,
    /// without the .0 / .255 addresses when `avoid_buggy`).
    pub fn size(&self) -> u128 {
        let (lo, hi) = if self.whole {
            usable_whole(self.net)
        } else {
            match usable(self.net) {
                Some(r) => r,
                None => return 0,
            }
        };
        let all = hi - lo + 1;
        if !(self.avoid_buggy && matches!(self.net, IpNet::V4(_))) {
            return all;
        }
        // Addresses in lo..=hi congruent to r modulo 256.
        let congruent = |r: u128| {
            let upto = |x: u128| if x < r { 0 } else { (x - r) / 256 + 1 };
            upto(hi) - if lo == 0 { 0 } else { upto(lo - 1) }
        };
        all - congruent(0) - congruent(255)
    }
}

impl fmt::Display for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(n) => write!(f, "{n}={}", self.net),
            None => write!(f, "{}", self.net),
        }
    }
}

/// Which addresses are held, by whom (one Service, or the Services of one sharing group),
/// which pools they come from, and which addresses statuses still show though nobody
/// holds them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocator {
    pools: Vec<Pool>,
    /// Each held address's holders and how they use it: one Service, or several that may
    /// share it (see [`Use`]); never two that may not.
    owner: BTreeMap<IpAddr, BTreeMap<String, Use>>,
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
    /// An allocator over unnamed `pools` (normalised to their networks), holding nothing.
    pub fn new(pools: &[IpNet]) -> Self {
        Self::with_names(pools, &[])
    }

    /// An allocator over unnamed `pools` and `named` ones, holding nothing. Allocation
    /// for a Service that names no pool tries the unnamed ones first, then the named
    /// ones, each in the order given.
    pub fn with_names(pools: &[IpNet], named: &[(String, IpNet)]) -> Self {
        let mut a = Self::default();
        a.set_pools(pools, named);
        a
    }

    /// Replaces the pools. Addresses held outside the new pools stay held until the next
    /// [`plan`] releases them (it trusts only addresses inside a pool); Services that
    /// lack an address of a family they want get one there, if a pool of it now exists.
    /// Returns whether the pools changed.
    pub fn set_pools(&mut self, pools: &[IpNet], named: &[(String, IpNet)]) -> bool {
        let new: Vec<Pool> = pools
            .iter()
            .map(|p| Pool::cidr(None, *p))
            .chain(named.iter().map(|(n, p)| Pool::cidr(Some(n.clone()), *p)))
            .collect();
        self.replace_pools(new)
    }

    /// Replaces the pools with `pools` (in the order allocation tries them). Returns
    /// whether they changed.
    pub fn replace_pools(&mut self, pools: Vec<Pool>) -> bool {
        let changed = pools != self.pools;
        self.pools = pools;
        changed
    }

    /// The pools, unnamed first.
    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    /// Whether a pool named `name` exists.
    pub fn has_pool(&self, name: &str) -> bool {
        self.pools.iter().any(|p| p.name.as_deref() == Some(name))
    }

    /// Whether `addr` lies inside a pool.
    pub fn in_pool(&self, addr: IpAddr) -> bool {
        self.pools.iter().any(|p| p.net.contains(&addr))
    }

    /// Whether `addr` lies inside the pool named `name` (any pool when `None`).
    fn in_named(&self, addr: IpAddr, name: Option<&str>) -> bool {
        self.pools
            .iter()
            .filter(|p| name.is_none() || p.name.as_deref() == name)
            .any(|p| p.net.contains(&addr) && !(p.avoid_buggy && buggy(addr)))
    }

    /// The pools named `name` (all when `None`), for messages.
    fn describe(&self, name: Option<&str>, family: Option<Family>) -> String {
        let nets = show(
            self.pools
                .iter()
                .filter(|p| name.is_none() || p.name.as_deref() == name)
                .filter(|p| family.is_none_or(|f| Family::of(p.net.addr()) == f))
                .map(|p| p.net),
        );
        match name {
            Some(n) => format!("pool {n} ({nets})"),
            None => nets,
        }
    }

    /// A holder of `addr` (the first by name when a sharing group holds it).
    pub fn owner(&self, addr: IpAddr) -> Option<&str> {
        self.owner
            .get(&addr)
            .and_then(|h| h.keys().next())
            .map(String::as_str)
    }

    /// Every holder of `addr`: one Service, or the Services of one sharing group.
    pub fn holders(&self, addr: IpAddr) -> Vec<&str> {
        self.owner
            .get(&addr)
            .map(|h| h.keys().map(String::as_str).collect())
            .unwrap_or_default()
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

    /// Number of addresses held (a shared address counts once).
    pub fn count(&self) -> usize {
        self.owner.len()
    }

    fn take(&mut self, owner: &str, addr: IpAddr, how: &Use) {
        // Each round claims again what Services hold: no allocation when nothing changed.
        if let Some(u) = self.owner.get_mut(&addr).and_then(|h| h.get_mut(owner)) {
            if u != how {
                u.clone_from(how);
            }
            return;
        }
        self.owner
            .entry(addr)
            .or_default()
            .insert(owner.to_owned(), how.clone());
        self.held.entry(owner.to_owned()).or_default().insert(addr);
    }

    /// Lets go of every address several Services share, so that [`plan`] claims it again
    /// for them in order (their ports or keys may have changed since).
    fn unshare_all(&mut self) {
        let shared: Vec<(IpAddr, Vec<String>)> = self
            .owner
            .iter()
            .filter(|(_, h)| h.len() > 1)
            .map(|(a, h)| (*a, h.keys().cloned().collect()))
            .collect();
        for (a, holders) in shared {
            for h in holders {
                self.release_one(&h, a);
            }
        }
    }

    /// Records that `owner` holds `addr`, in a pool or not ([`plan`] decides which
    /// addresses to trust), sharing nothing.
    ///
    /// # Errors
    /// [`AllocError::InUse`] when another owner holds it, or another Service's status
    /// still shows it.
    pub fn claim(&mut self, owner: &str, addr: IpAddr) -> Result<(), AllocError> {
        self.claim_as(owner, addr, &Use::default())
    }

    /// [`Allocator::claim`] for a Service that uses the address as `how` says: it joins
    /// the holders when they may all share it.
    ///
    /// # Errors
    /// [`AllocError::InUse`], or [`AllocError::NotShared`] when a holder and `owner` may
    /// not share it.
    pub fn claim_as(&mut self, owner: &str, addr: IpAddr, how: &Use) -> Result<(), AllocError> {
        if let Some(holders) = self.owner.get(&addr) {
            for (them, other) in holders.iter().filter(|(k, _)| *k != owner) {
                if let Some((sharing, why)) = how.conflict(other, them) {
                    return Err(if sharing {
                        AllocError::NotShared { addr, why }
                    } else {
                        AllocError::InUse {
                            addr,
                            owner: them.clone(),
                        }
                    });
                }
            }
        } else if let Some(s) = self.shown.get(&addr).filter(|s| *s != owner) {
            return Err(AllocError::InUse {
                addr,
                owner: format!("{s} (its status still shows it)"),
            });
        }
        self.take(owner, addr, how);
        Ok(())
    }

    /// Gives `owner` the address it asked for. With pools configured the address must lie
    /// in one; with none, the operator manages addresses and any address is accepted.
    ///
    /// # Errors
    /// [`AllocError::NotInPool`], [`AllocError::InUse`].
    pub fn request(&mut self, owner: &str, addr: IpAddr) -> Result<(), AllocError> {
        self.request_as(owner, addr, &Use::default(), None)
    }

    /// [`Allocator::request`] for a Service using the address as `how` says, from the pool
    /// named `pool` when given.
    ///
    /// # Errors
    /// [`AllocError::NotInPool`], [`AllocError::InUse`], [`AllocError::NotShared`].
    pub fn request_as(
        &mut self,
        owner: &str,
        addr: IpAddr,
        how: &Use,
        pool: Option<&str>,
    ) -> Result<(), AllocError> {
        if (!self.pools.is_empty() || pool.is_some()) && !self.in_named(addr, pool) {
            return Err(AllocError::NotInPool {
                addr,
                pools: match pool {
                    Some(_) => self.describe(pool, None),
                    None => format!("any pool ({})", self.describe(None, None)),
                },
            });
        }
        self.claim_as(owner, addr, how)
    }

    /// Gives `owner` the lowest free address of `family`, from the first pool that has
    /// one. The network and broadcast addresses of IPv4 pools larger than /31 and the
    /// subnet-router anycast address of IPv6 pools larger than /127 are never handed out,
    /// nor is an address a status still shows.
    ///
    /// # Errors
    /// [`AllocError::NoPool`], [`AllocError::Exhausted`].
    pub fn allocate(&mut self, owner: &str, family: Family) -> Result<IpAddr, AllocError> {
        self.allocate_as(owner, family, &Use::default(), None, &BTreeMap::new())
    }

    /// [`Allocator::allocate`] for a Service using the address as `how` says, from the
    /// pool named `pool` when given. A Service with a sharing key first joins the lowest
    /// address of those pools its sharing group holds, if it may share it.
    ///
    /// # Errors
    /// [`AllocError::NoPool`], [`AllocError::Exhausted`].
    pub fn allocate_as(
        &mut self,
        owner: &str,
        family: Family,
        how: &Use,
        pool: Option<&str>,
        labels: &BTreeMap<String, String>,
    ) -> Result<IpAddr, AllocError> {
        let mut pools: Vec<Pool> = self
            .pools
            .iter()
            .filter(|p| Family::of(p.net.addr()) == family)
            .filter(|p| match pool {
                Some(_) => p.name.as_deref() == pool,
                None => {
                    p.auto_assign
                        && p.scope
                            .as_ref()
                            .is_none_or(|s| s.admits(&how.namespace, labels))
                }
            })
            .cloned()
            .collect();
        // Scoped pools by priority, then the others, each in the order configured.
        pools.sort_by_key(|p| {
            p.scope
                .as_ref()
                .map_or((1, 0), |s| (0, s.priority.unwrap_or(i32::MAX)))
        });
        if pools.is_empty() {
            return Err(AllocError::NoPool {
                family,
                pool: pool.map(str::to_owned),
            });
        }
        if how.sharing.is_some() {
            let joinable = self.owner.iter().find(|(a, holders)| {
                pools.iter().any(|p| p.net.contains(*a))
                    && holders
                        .iter()
                        .all(|(k, u)| k == owner || how.conflict(u, k).is_none())
            });
            if let Some((addr, _)) = joinable {
                let addr = *addr;
                self.take(owner, addr, how);
                return Ok(addr);
            }
        }
        for p in &pools {
            if let Some(addr) = self.first_free(p) {
                self.take(owner, addr, how);
                return Ok(addr);
            }
        }
        Err(AllocError::Exhausted {
            family,
            pools: self.describe(pool, Some(family)),
        })
    }

    /// The lowest usable address of `pool` nobody holds and no status shows. Walks the
    /// taken addresses inside the pool in order, so the work is bounded by the number
    /// taken, not the pool's size (an IPv6 /64 is fine).
    fn first_free(&self, p: &Pool) -> Option<IpAddr> {
        let pool = p.net;
        let (lo, hi) = if p.whole {
            usable_whole(pool)
        } else {
            usable(pool)?
        };
        let range = to_ip(pool, lo)..=to_ip(pool, hi);
        let mut held = self.owner.range(range.clone()).map(|(a, _)| *a).peekable();
        let mut shown = self.shown.range(range).map(|(a, _)| *a).peekable();
        // Both in order, merged (an address may be in both).
        let taken = std::iter::from_fn(|| match (held.peek(), shown.peek()) {
            (Some(h), Some(s)) if s < h => shown.next(),
            (Some(_), _) => held.next(),
            (None, _) => shown.next(),
        });
        let buggy = |v: u128| p.avoid_buggy && buggy(to_ip(pool, v));
        let mut candidate = lo;
        let mut taken = taken.map(to_u128).peekable();
        loop {
            while taken.next_if(|t| *t < candidate).is_some() {}
            let used = taken.peek() == Some(&candidate);
            if !used && !buggy(candidate) {
                return Some(to_ip(pool, candidate));
            }
            if candidate == hi {
                return None;
            }
            candidate += 1;
        }
    }

    /// Releases everything `owner` holds; returns what it held. A shared address stays
    /// held while another sharer holds it.
    pub fn release(&mut self, owner: &str) -> Vec<IpAddr> {
        let held = self.held.remove(owner).unwrap_or_default();
        for a in &held {
            self.drop_holder(owner, *a);
        }
        held.into_iter().collect()
    }

    fn drop_holder(&mut self, owner: &str, addr: IpAddr) {
        if let Some(h) = self.owner.get_mut(&addr) {
            h.remove(owner);
            if h.is_empty() {
                self.owner.remove(&addr);
            }
        }
    }

    /// Releases one address of `owner`.
    pub fn release_one(&mut self, owner: &str, addr: IpAddr) {
        let Some(set) = self.held.get_mut(owner) else {
            return;
        };
        let had = set.remove(&addr);
        if set.is_empty() {
            self.held.remove(owner);
        }
        if had {
            self.drop_holder(owner, addr);
        }
    }
}

/// First and last address of `pool`, as integers.
fn usable_whole(pool: IpNet) -> (u128, u128) {
    match pool {
        IpNet::V4(n) => (
            u128::from(u32::from(n.network())),
            u128::from(u32::from(n.broadcast())),
        ),
        IpNet::V6(n) => (u128::from(n.network()), u128::from(n.broadcast())),
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

/// An IPv4 address ending in .0 or .255, which some client firmware takes for a broadcast
/// address.
fn buggy(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V4(a) if matches!(a.octets()[3], 0 | 255))
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

/// The first of `names` the Service has as a non-empty annotation, with its name.
fn annotation<'a>(svc: &'a Service, names: &[&'static str]) -> Option<(&'static str, &'a str)> {
    let a = svc.metadata.annotations.as_ref()?;
    names.iter().find_map(|n| {
        a.get(*n)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
            .map(|v| (*n, v))
    })
}

/// The addresses a Service asks for: the first of the [`ADDRESS_ANNOTATIONS`]
/// (comma-separated), else `spec.loadBalancerIP`. Unparsable entries are returned as
/// errors for a notice.
pub fn requested_addresses(svc: &Service) -> (Vec<IpAddr>, Vec<String>) {
    let annotation = annotation(svc, &ADDRESS_ANNOTATIONS).map(|(_, v)| v);
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

/// The pool a Service names (the first of the [`POOL_ANNOTATIONS`]).
pub fn requested_pool(svc: &Service) -> Option<&str> {
    annotation(svc, &POOL_ANNOTATIONS).map(|(_, v)| v)
}

/// How a Service would use an address: its sharing key (the first of the
/// [`SHARING_ANNOTATIONS`]), namespaces it shares with, backends under
/// `externalTrafficPolicy: Local`, and its ports.
pub fn use_of(svc: &Service) -> Use {
    let spec = svc.spec.as_ref();
    let local = spec.and_then(|s| s.external_traffic_policy.as_deref()) == Some("Local");
    Use {
        sharing: annotation(svc, &SHARING_ANNOTATIONS).map(|(_, v)| v.to_owned()),
        backends: local.then(|| {
            spec.and_then(|s| s.selector.as_ref())
                .map(|sel| {
                    sel.iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default()
        }),
        namespace: svc.metadata.namespace.clone().unwrap_or_default(),
        cross_namespace: annotation(svc, &CROSS_NAMESPACE_ANNOTATIONS)
            .map(|(_, v)| {
                v.split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        ports: spec
            .and_then(|s| s.ports.as_ref())
            .map(|ports| {
                ports
                    .iter()
                    .filter_map(|p| {
                        let n = u16::try_from(p.port).ok()?;
                        Some((p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()), n))
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
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
        let v4 = alloc.pools.iter().any(|p| p.net.addr().is_ipv4());
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
    /// What it may keep of that and of what its status shows.
    keep: BTreeSet<IpAddr>,
    /// How it uses its addresses (sharing).
    how: Use,
    /// The pool it names.
    pool: Option<String>,
}

/// One planning round over every Service, oldest first (an older Service wins a contested
/// address); `owns` says which ones this gateway serves.
///
/// 1. Services gone release their addresses. A Service no longer served (type or class
///    changed) releases them too, and its status is corrected until it no longer shows
///    them (so is that of a Service of another type showing a pool address).
/// 2. Every owned Service claims what it holds, then (all of them again) what its status
///    shows, if trusted: inside a pool (the one it names, if any) and of a family the
///    Service has, or the address it requests. A claim of an address others hold succeeds
///    only if they may all share it ([`Use`]). Then every address a status shows that
///    nobody holds is set aside for that Service.
/// 3. Requests, all of them; only then allocation from the pools, for Services that asked
///    for nothing, of each family they want and lack (so a dual-stack Service gains its
///    second family once a pool of it exists). A Service with a sharing key joins an
///    address its group holds when it may.
/// 4. A Service whose status does not show exactly what it holds gets a status write,
///    one that holds nothing (a refused request, an exhausted pool) a cleared status.
///
/// Steps 2 and 4 keep the promise that no two statuses show one address, unless the
/// Services may share it: an address is given to a Service only once no other Service's
/// status shows it, and every held address belongs to one sharing group.
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

    // 2. What each owned Service may keep; the rest is let go, and so is every shared
    //    address. Then claims: first what Services held (an incumbent keeps its address
    //    against a status that shows it elsewhere; sharers whose ports now overlap resolve
    //    by age), then what statuses show, oldest first each time.
    let mut work = Vec::new();
    for ((svc, key), _) in services.iter().zip(&keys).zip(&owned).filter(|(_, o)| **o) {
        alloc.releasing.remove(key);
        work.push(examine(alloc, svc, key, &mut out));
    }
    for w in &work {
        for a in w.held_before.iter().filter(|a| !w.keep.contains(a)) {
            alloc.release_one(w.key, *a);
        }
    }
    alloc.unshare_all();
    for incumbent in [true, false] {
        for w in &work {
            for a in w
                .keep
                .iter()
                .filter(|a| w.held_before.contains(a) == incumbent)
            {
                if let Err(e) = alloc.claim_as(w.key, *a, &w.how) {
                    out.notices.push(service_notice(
                        w.svc,
                        NoticeType::Warning,
                        e.reason(),
                        e.to_string(),
                    ));
                }
            }
        }
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
            if alloc.addresses_of(w.key).contains(a) {
                continue;
            }
            match alloc.request_as(w.key, *a, &w.how, w.pool.as_deref()) {
                Ok(()) => out.notices.push(service_notice(
                    w.svc,
                    NoticeType::Normal,
                    "AddressAssigned",
                    format!(
                        "assigned requested address {a}{}",
                        shared_with(alloc, w.key, *a)
                    ),
                )),
                Err(e) => {
                    out.notices.push(service_notice(
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
        if w.refused || !w.requested.is_empty() {
            continue;
        }
        allocate(alloc, w, &mut out);
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
            out.notices.push(service_notice(
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

/// ` (shared with a, b)` when others hold `addr` with `key`, for a notice.
fn shared_with(alloc: &Allocator, key: &str, addr: IpAddr) -> String {
    let others: Vec<&str> = alloc
        .holders(addr)
        .into_iter()
        .filter(|h| *h != key)
        .collect();
    if others.is_empty() {
        String::new()
    } else {
        format!(" (shared with {})", others.join(", "))
    }
}

/// Step 1 of [`plan`] for a Service this gateway does not serve: releases what it held,
/// and asks for its status to be corrected while it shows what it was given.
fn release_unserved(alloc: &mut Allocator, svc: &Service, key: &str, out: &mut AddressPlan) {
    let held = alloc.release(key);
    let status = status_addresses(svc);
    if !held.is_empty() {
        out.notices.push(service_notice(
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
            out.notices.push(service_notice(
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

/// Step 2 of [`plan`] for an owned Service: checks its request and the pool it names, and
/// works out what it may keep of what it holds and what its status shows.
fn examine<'a>(
    alloc: &mut Allocator,
    svc: &'a Service,
    key: &'a str,
    out: &mut AddressPlan,
) -> Owned<'a> {
    let (requested, bad) = requested_addresses(svc);
    for b in bad {
        out.notices.push(service_notice(
            svc,
            NoticeType::Warning,
            "InvalidAddress",
            format!("requested address {b:?} is not an IP address"),
        ));
    }
    let pool = requested_pool(svc).map(str::to_owned);
    let mut refused = false;
    if let Some(p) = pool.as_deref().filter(|p| !alloc.has_pool(p)) {
        let names: BTreeSet<&str> = alloc
            .pools
            .iter()
            .filter_map(|p| p.name.as_deref())
            .collect();
        out.notices.push(service_notice(
            svc,
            NoticeType::Warning,
            "UnknownAddressPool",
            format!(
                "the Service names address pool {p:?}, which is not configured (named pools: {})",
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    show(names.iter())
                }
            ),
        ));
        refused = true;
    }
    if !refused {
        if let Err(why) = check_families(svc, &requested) {
            out.notices.push(service_notice(
                svc,
                NoticeType::Warning,
                "AddressFamilyMismatch",
                why,
            ));
            refused = true;
        }
    }
    let held_before = alloc.addresses_of(key);
    let status = status_addresses(svc);
    let families = service_families(svc);
    let trusted = |a: &IpAddr| {
        if refused {
            false
        } else if !requested.is_empty() {
            requested.contains(a)
        } else {
            alloc.in_named(*a, pool.as_deref())
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
            alloc.describe(pool.as_deref(), None)
        };
        for a in status
            .iter()
            .filter(|a| !alloc.in_named(**a, pool.as_deref()))
        {
            out.notices.push(service_notice(
                svc,
                NoticeType::Warning,
                "AddressNotInPool",
                format!("status address {a} is not in any pool ({pools}): not served, replaced"),
            ));
        }
    }
    Owned {
        svc,
        key,
        requested,
        refused,
        held_before,
        keep,
        how: use_of(svc),
        pool,
    }
}

/// Step 3 of [`plan`] for an owned Service that asked for nothing: an address of each
/// family it wants and does not hold yet. A `RequireDualStack` Service that holds nothing
/// gets both or none.
fn allocate(alloc: &mut Allocator, w: &Owned<'_>, out: &mut AddressPlan) {
    let (svc, key) = (w.svc, w.key);
    let had: BTreeSet<Family> = alloc
        .addresses_of(key)
        .into_iter()
        .map(Family::of)
        .collect();
    if service_families(svc).is_none() && !had.is_empty() {
        // Without spec.ipFamilies the family wanted is a guess: what it holds is enough.
        return;
    }
    let mut got = Vec::new();
    let mut failed = Vec::new();
    for family in wanted_families(svc, alloc) {
        if had.contains(&family) {
            continue;
        }
        let labels = svc.metadata.labels.clone().unwrap_or_default();
        match alloc.allocate_as(key, family, &w.how, w.pool.as_deref(), &labels) {
            Ok(a) => got.push(a),
            Err(e) => failed.push(e),
        }
    }
    if require_dual_stack(svc) && had.is_empty() && !failed.is_empty() {
        for a in got.drain(..) {
            alloc.release_one(key, a);
        }
    }
    for a in &got {
        let shared = shared_with(alloc, key, *a);
        out.notices.push(service_notice(
            svc,
            NoticeType::Normal,
            "AddressAssigned",
            format!(
                "assigned {a} from {}{shared}",
                match &w.pool {
                    Some(p) => format!("address pool {p}"),
                    None => "the address pool".to_owned(),
                }
            ),
        ));
        if shared.is_empty() && w.how.sharing.is_some() {
            // A sharer that could not join its group's address says why.
            if let Some(why) = unshared_reason(alloc, key, &w.how, *a) {
                out.notices.push(service_notice(
                    svc,
                    NoticeType::Warning,
                    "AddressNotShared",
                    why,
                ));
            }
        }
    }
    // PreferDualStack without a pool of one family is fine once the other family has an
    // address.
    let partial_ok = !got.is_empty() || !had.is_empty();
    for e in failed {
        if partial_ok && matches!(e, AllocError::NoPool { .. }) {
            continue;
        }
        out.notices.push(service_notice(
            svc,
            NoticeType::Warning,
            e.reason(),
            e.to_string(),
        ));
    }
}

/// Why a Service with a sharing key got `addr` of its own though other Services of its key
/// hold addresses of that family: the first such address and the conflict.
fn unshared_reason(alloc: &Allocator, key: &str, how: &Use, addr: IpAddr) -> Option<String> {
    let family = Family::of(addr);
    alloc.owner.iter().find_map(|(a, holders)| {
        if *a == addr || Family::of(*a) != family {
            return None;
        }
        let (them, other) = holders
            .iter()
            .find(|(k, u)| *k != key && u.sharing == how.sharing)?;
        let (_, why) = how.conflict(other, them)?;
        Some(format!(
            "sharing key {:?}: not sharing {a}: {why}; given {addr} of its own",
            how.sharing.as_deref().unwrap_or("")
        ))
    })
}

/// A notice about `svc`: an Event on it once given.
pub fn service_notice(svc: &Service, type_: NoticeType, reason: &str, message: String) -> Notice {
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
            Err(AllocError::NoPool {
                family: Family::V4,
                pool: None
            })
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
