//! LoadBalancer address allocation from configured pools, as MetalLB does it.
//!
//! ```text
//! owned Services ──► plan(): 1. release the addresses of Services no longer owned
//!                            2. claim every address a Service already holds
//!                               (status.loadBalancer.ingress, or an earlier allocation
//!                               whose status write has not come back yet)
//!                            3. only then: honour requests, allocate the rest
//!                 ──► AddressPlan { assigned, status writes, notices for Events }
//! ```
//!
//! The allocator keeps no state of its own across restarts: the cluster does, in each
//! Service's `status.loadBalancer.ingress`. Step 2 runs over all Services before step 3
//! allocates anything, and the caller runs the first plan only once the initial list of
//! Services is complete, so a restarted gateway never hands out an address that a Service
//! it has not seen yet already holds.
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

/// Which addresses are held, by whom, and which pools they come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocator {
    pools: Vec<IpNet>,
    owner: BTreeMap<IpAddr, String>,
    held: BTreeMap<String, BTreeSet<IpAddr>>,
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

    /// Records that `owner` holds `addr`, in a pool or not (an address a Service already
    /// has in its status is kept even if the pools changed since).
    ///
    /// # Errors
    /// [`AllocError::InUse`] when another owner holds it.
    pub fn claim(&mut self, owner: &str, addr: IpAddr) -> Result<(), AllocError> {
        match self.owner.get(&addr) {
            Some(o) if o == owner => Ok(()),
            Some(o) => Err(AllocError::InUse {
                addr,
                owner: o.clone(),
            }),
            None => {
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
    /// subnet-router anycast address of IPv6 pools larger than /127 are never handed out.
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

    /// The lowest usable address of `pool` nobody holds. Walks the held addresses inside
    /// the pool in order, so the work is bounded by the number held, not the pool's size
    /// (an IPv6 /64 is fine).
    fn first_free(&self, pool: IpNet) -> Option<IpAddr> {
        let (lo, hi) = usable(pool)?;
        let mut candidate = lo;
        for held in self
            .owner
            .range(to_ip(pool, lo)..=to_ip(pool, hi))
            .map(|(a, _)| to_u128(*a))
        {
            if held > candidate {
                break;
            }
            if held == candidate {
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
    /// The addresses, primary family first.
    pub addresses: Vec<IpAddr>,
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
    /// Status writes needed: Services whose status does not show their addresses.
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

/// The families a Service wants addresses of: `spec.ipFamilies` (only the first under
/// `SingleStack`, the default policy); without it, IPv4 if an IPv4 pool exists, else IPv6.
fn wanted_families(svc: &Service, alloc: &Allocator) -> Vec<Family> {
    let spec = svc.spec.as_ref();
    let listed: Vec<Family> = spec
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
        let v4 = alloc.pools.iter().any(|p| p.addr().is_ipv4());
        return vec![if v4 || alloc.pools.is_empty() {
            Family::V4
        } else {
            Family::V6
        }];
    }
    let dual = matches!(
        spec.and_then(|s| s.ip_family_policy.as_deref()),
        Some("PreferDualStack" | "RequireDualStack")
    );
    if dual {
        listed
    } else {
        listed.into_iter().take(1).collect()
    }
}

fn require_dual_stack(svc: &Service) -> bool {
    svc.spec
        .as_ref()
        .and_then(|s| s.ip_family_policy.as_deref())
        == Some("RequireDualStack")
}

/// One planning round over the LoadBalancer Services this gateway owns, oldest first
/// (an older Service wins a contested address). See the module documentation.
pub fn plan(alloc: &mut Allocator, owned: &[&Service]) -> AddressPlan {
    let mut out = AddressPlan::default();
    let keys: Vec<String> = owned.iter().map(|s| object_key(&s.metadata)).collect();

    // 1. Services that left (deleted, no longer LoadBalancer, another class) release.
    let present: std::collections::HashSet<&str> = keys.iter().map(String::as_str).collect();
    let gone: Vec<String> = alloc
        .owners()
        .filter(|o| !present.contains(o))
        .map(str::to_owned)
        .collect();
    for g in gone {
        alloc.release(&g);
    }

    // 2. Claim what each Service already holds, before anything is allocated.
    let mut requests = Vec::with_capacity(owned.len());
    for (svc, key) in owned.iter().zip(&keys) {
        let (requested, bad) = requested_addresses(svc);
        for b in bad {
            out.notices.push(notice(
                svc,
                NoticeType::Warning,
                "InvalidAddress",
                format!("requested address {b:?} is not an IP address"),
            ));
        }
        let status = status_addresses(svc);
        let held = alloc.addresses_of(key);
        let keep: Vec<IpAddr> = status
            .iter()
            .chain(&held)
            .copied()
            .filter(|a| requested.is_empty() || requested.contains(a))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        for a in held.iter().filter(|a| !keep.contains(a)) {
            alloc.release_one(key, *a);
        }
        for a in keep {
            if let Err(e) = alloc.claim(key, a) {
                out.notices
                    .push(notice(svc, NoticeType::Warning, e.reason(), e.to_string()));
            }
        }
        requests.push(requested);
    }

    // 3. Requests, then allocation for Services that hold nothing of a family they want.
    for ((svc, key), requested) in owned.iter().zip(&keys).zip(requests) {
        if !requested.is_empty() {
            for a in requested {
                if alloc.owner(a) == Some(key.as_str()) {
                    continue;
                }
                match alloc.request(key, a) {
                    Ok(()) => out.notices.push(notice(
                        svc,
                        NoticeType::Normal,
                        "AddressAssigned",
                        format!("assigned requested address {a}"),
                    )),
                    Err(e) => out.notices.push(notice(
                        svc,
                        NoticeType::Warning,
                        e.reason(),
                        e.to_string(),
                    )),
                }
            }
        } else {
            let held = alloc.addresses_of(key);
            // A Service that holds an address keeps it as its whole set, even if it
            // wants more families: adding one means a status write it did not ask for.
            if held.is_empty() {
                let mut failed = Vec::new();
                for family in wanted_families(svc, alloc) {
                    match alloc.allocate(key, family) {
                        Ok(a) => out.notices.push(notice(
                            svc,
                            NoticeType::Normal,
                            "AddressAssigned",
                            format!("assigned {a} from the address pool"),
                        )),
                        Err(e) => failed.push(e),
                    }
                }
                // PreferDualStack without a pool of one family is fine once the other
                // family has an address.
                let partial_ok = !require_dual_stack(svc) && alloc.held.contains_key(key);
                for e in failed {
                    if partial_ok && matches!(e, AllocError::NoPool { .. }) {
                        continue;
                    }
                    out.notices
                        .push(notice(svc, NoticeType::Warning, e.reason(), e.to_string()));
                }
            }
        }
        let mut addrs = alloc.addresses_of(key);
        if addrs.is_empty() {
            continue;
        }
        // Primary family first, as in spec.ipFamilies.
        let first = wanted_families(svc, alloc).first().copied();
        addrs.sort_by_key(|a| (Some(Family::of(*a)) != first, *a));
        if status_addresses(svc) != addrs {
            out.status.push(StatusUpdate {
                namespace: svc.metadata.namespace.clone().unwrap_or_default(),
                name: svc.metadata.name.clone().unwrap_or_default(),
                addresses: addrs.clone(),
            });
        }
        out.assigned.insert(key.clone(), addrs);
    }
    out
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
