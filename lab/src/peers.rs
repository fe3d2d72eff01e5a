//! Kernel forwarding peers: the rules kube-proxy writes, as text, and a namespace that
//! forwards with them, for the benchmarks that compare Strait with the kernel.
//!
//! ```text
//! &[SvcSpec] ──iptables_rules──► iptables-restore input (nat table, kube-proxy's shape)
//!            ──nftables_rules──► nft -f input (table ip kube-proxy, kube-proxy's shape)
//!  before, after ──iptables_update / nftables_update──► the partial sync kube-proxy sends
//!
//! KernelGateway::up(ns, kind, services)
//!   ip netns exec NS sysctl net.ipv4.ip_forward=1
//!   ip netns exec NS iptables-restore [--noflush] | nft -f -   (timed: load_time)
//!   update(after): the partial sync above                       (timed)
//!   drop: our chains / our table removed, ip_forward restored
//! ```
//!
//! # What the rules are
//!
//! The shapes follow kube-proxy's `syncProxyRules` in `pkg/proxy/iptables/proxier.go` and
//! `pkg/proxy/nftables/proxier.go` (Kubernetes 1.29 and later) for ClusterIP-style services,
//! written out in the order kube-proxy writes them:
//!
//! - iptables: `KUBE-SERVICES` holds one `-d VIP -p tcp --dport P -j KUBE-SVC-…` per
//!   service; `KUBE-SVC-…` picks an endpoint with `-m statistic --mode random --probability
//!   1/(n-i)` (ten decimals, as kube-proxy prints them), the last rule unconditional;
//!   `KUBE-SEP-…` marks hairpin traffic (`-s EP -j KUBE-MARK-MASQ`) and DNATs. Above 1,000
//!   endpoints kube-proxy drops the per-rule comments ("large cluster mode"), and so do we.
//! - nftables: one `table ip kube-proxy`; a `service-ips` verdict map keyed by
//!   `ipv4_addr . inet_proto . inet_service` jumps to per-service chains, which choose with
//!   `numgen random mod n vmap { 0 : goto endpoint-…, … }`; endpoint chains mark hairpin
//!   traffic and `dnat to EP:PORT`.
//!
//! Chain names are kube-proxy's exactly: SHA-256 of the same strings, base32 (RFC 4648),
//! 16 characters for iptables (`KUBE-SVC-AQI2S6QIMU7PVVRP`), 8 plus the readable name for
//! nftables (`service-ULMVA6XW-ns1/svc1/tcp/p80`); the tests pin kube-proxy's own vectors.
//!
//! Left out, because a gateway benchmark does not exercise them: the filter table
//! (`KUBE-FORWARD`, `KUBE-FIREWALL`, no-endpoint rejects, `cluster-ips-check`), NodePorts,
//! external and LoadBalancer-IP chains with `loadBalancerSourceRanges`, session affinity,
//! and the cluster-CIDR masquerade rule (written only when kube-proxy knows the cluster
//! CIDR). Without that rule a client's address survives to the endpoint, as in Strait's
//! `nat` mode, so the two peers are compared doing the same job.
//!
//! # Safety of the host
//!
//! Every command here runs as `ip netns exec NS ...` ([`run_in`] is the only place that
//! starts `iptables-restore`, `nft` or `sysctl`), so the namespace this process runs in is
//! never touched. [`Netns`] creates a throwaway namespace and deletes it on drop;
//! [`KernelGateway`] removes exactly what it added on drop, also while a test panics.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};
use strait_config::model::Protocol;

/// kube-proxy's `largeClusterEndpointsThreshold`: with more endpoints than this, per-rule
/// comments are left out of the `KUBE-SVC-`/`KUBE-SEP-` chains (they make the restore input
/// 40% larger).
pub const LARGE_CLUSTER_ENDPOINTS: usize = 1000;
/// kube-proxy's masquerade mark bit (`--iptables-masquerade-bit` 14).
const MASQ_MARK: &str = "0x4000";
/// Services per VIP in [`synthetic`]: 254 VIPs of 203.0.113.0/24 with 250 ports each hold
/// 63,500 services, far more than any benchmark here asks for.
pub const PORTS_PER_VIP: usize = 250;
/// First frontend port of [`synthetic`] services on each VIP.
pub const FIRST_SERVICE_PORT: u16 = 10_000;
/// First endpoint port of [`synthetic`] endpoints; 250 addresses of 198.51.100.0/24 take
/// turns, so 100,000 endpoints use ports 20,000 to 20,399.
pub const FIRST_ENDPOINT_PORT: u16 = 20_000;
/// First port of [`replacement_endpoint`]s, above every [`synthetic`] endpoint port.
pub const FIRST_REPLACEMENT_PORT: u16 = 40_000;
/// Endpoint addresses [`synthetic`] cycles through: 198.51.100.1 to .250.
const ENDPOINT_ADDRS: usize = 250;
/// Most services [`synthetic`] can make: 254 VIPs times [`PORTS_PER_VIP`].
pub const MAX_SYNTHETIC_SERVICES: usize = 254 * PORTS_PER_VIP;

/// One Kubernetes service port as kube-proxy sees it: a ClusterIP-style frontend and its
/// ready endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SvcSpec {
    /// Kubernetes namespace.
    pub namespace: String,
    /// Service name.
    pub name: String,
    /// The port's name (may be empty, as for a single-port service).
    pub port_name: String,
    /// Transport protocol.
    pub protocol: Protocol,
    /// The service address.
    pub vip: Ipv4Addr,
    /// The service port.
    pub port: u16,
    /// Ready endpoints, in the order kube-proxy would list them.
    pub endpoints: Vec<SocketAddrV4>,
}

impl SvcSpec {
    /// kube-proxy's `ServicePortName.String()`: `ns/name:port`, or `ns/name` for an unnamed
    /// port. Used in iptables comments and chain hashes.
    pub fn port_name_string(&self) -> String {
        if self.port_name.is_empty() {
            format!("{}/{}", self.namespace, self.name)
        } else {
            format!("{}/{}:{}", self.namespace, self.name, self.port_name)
        }
    }

    /// `KUBE-SVC-` and 16 base32 characters of `sha256(port name string + protocol)`.
    pub fn iptables_chain(&self) -> String {
        let input = format!("{}{}", self.port_name_string(), self.protocol.as_str());
        format!("KUBE-SVC-{}", &hash32(&input)[..16])
    }

    /// `KUBE-SEP-` and 16 base32 characters of `sha256(port name string + protocol +
    /// "ip:port")`.
    pub fn iptables_endpoint_chain(&self, ep: SocketAddrV4) -> String {
        let input = format!("{}{}{ep}", self.port_name_string(), self.protocol.as_str());
        format!("KUBE-SEP-{}", &hash32(&input)[..16])
    }

    /// kube-proxy nftables' `servicePortChainNameBase`: `ns/name/proto/port`.
    fn nft_base(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.namespace,
            self.name,
            self.protocol.as_str(),
            self.port_name
        )
    }

    /// `service-HASH8-ns/name/proto/port`.
    pub fn nft_chain(&self) -> String {
        format!("service-{}", hash_and_name(&self.nft_base()))
    }

    /// `endpoint-HASH8-ns/name/proto/port__ip/port`.
    pub fn nft_endpoint_chain(&self, ep: SocketAddrV4) -> String {
        let base = format!("{}__{}/{}", self.nft_base(), ep.ip(), ep.port());
        format!("endpoint-{}", hash_and_name(&base))
    }

    /// kube-proxy's identity of a service port (what decides "the same service, changed").
    fn key(&self) -> (&str, &str, &str, Protocol) {
        (&self.namespace, &self.name, &self.port_name, self.protocol)
    }
}

/// `base32(sha256(s))`, RFC 4648 alphabet, without padding: Go's
/// `base32.StdEncoding.EncodeToString(sha256.Sum256(s))` up to its padding.
fn hash32(s: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let digest = Sha256::digest(s.as_bytes());
    let mut out = String::with_capacity(52);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &b in digest.iter() {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((acc >> bits) & 31) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((acc << (5 - bits)) & 31) as usize]));
    }
    out
}

/// kube-proxy nftables' `hashAndTruncate`: eight hash characters, a dash, the name. Names
/// here stay far below nftables' 256-byte limit, so nothing is ever truncated.
fn hash_and_name(name: &str) -> String {
    format!("{}-{name}", &hash32(name)[..8])
}

/// `n` services with `endpoints` endpoints each, all on documentation addresses: service
/// `i` is `203.0.113.(1 + i / 250):(10000 + i % 250)`; endpoint `g` (counting over all
/// services) is `198.51.100.(1 + g % 250):(20000 + g / 250)`, so no two endpoints share an
/// address and port. Named `bench/svc-{i}`, port `http`, TCP.
///
/// # Panics
///
/// If `n` exceeds [`MAX_SYNTHETIC_SERVICES`] or the endpoint ports would pass 39,999
/// (more than 5 million endpoints): the caller checks its sizes first.
pub fn synthetic(n: usize, endpoints: usize) -> Vec<SvcSpec> {
    assert!(
        n <= MAX_SYNTHETIC_SERVICES,
        "{n} services: at most {MAX_SYNTHETIC_SERVICES}"
    );
    assert!(
        n * endpoints / ENDPOINT_ADDRS < usize::from(FIRST_REPLACEMENT_PORT - FIRST_ENDPOINT_PORT),
        "{n} x {endpoints} endpoints do not fit the synthetic port range"
    );
    (0..n)
        .map(|i| SvcSpec {
            namespace: "bench".to_owned(),
            name: format!("svc-{i}"),
            port_name: "http".to_owned(),
            protocol: Protocol::Tcp,
            vip: Ipv4Addr::new(203, 0, 113, octet(1 + i / PORTS_PER_VIP)),
            port: FIRST_SERVICE_PORT + port_offset(i % PORTS_PER_VIP),
            endpoints: (0..endpoints)
                .map(|j| {
                    let g = i * endpoints + j;
                    SocketAddrV4::new(
                        Ipv4Addr::new(198, 51, 100, octet(1 + g % ENDPOINT_ADDRS)),
                        FIRST_ENDPOINT_PORT + port_offset(g / ENDPOINT_ADDRS),
                    )
                })
                .collect(),
        })
        .collect()
}

/// The `k`-th fresh endpoint for a simulated endpoint change: a documentation address with
/// a port from [`FIRST_REPLACEMENT_PORT`] up, never one [`synthetic`] hands out.
pub fn replacement_endpoint(k: usize) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::new(198, 51, 100, octet(1 + k % ENDPOINT_ADDRS)),
        FIRST_REPLACEMENT_PORT.saturating_add(port_offset(k / ENDPOINT_ADDRS)),
    )
}

fn octet(n: usize) -> u8 {
    u8::try_from(n).unwrap_or(u8::MAX)
}

fn port_offset(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

/// The total endpoint count decides kube-proxy's "large cluster mode".
fn large_cluster(services: &[SvcSpec]) -> bool {
    services.iter().map(|s| s.endpoints.len()).sum::<usize>() > LARGE_CLUSTER_ENDPOINTS
}

/// The `iptables-restore` input kube-proxy's iptables mode writes for `services` (nat
/// table), plus the jumps from `PREROUTING`, `OUTPUT` and `POSTROUTING` that kube-proxy
/// installs separately (`EnsureRule`). It loads with or without `--noflush`; load it into a
/// namespace once, since a second `--noflush` load would append the three jumps again (see
/// [`iptables_update`] for re-syncs).
pub fn iptables_rules(services: &[SvcSpec]) -> String {
    let all: Vec<bool> = vec![true; services.len()];
    iptables_input(services, &all, &[], true)
}

/// What kube-proxy (1.27+, `MinimizeIPTablesRestore`) sends with `iptables-restore
/// --noflush` when the services change from `before` to `after`: the top-level chains and
/// every `KUBE-SERVICES` rule in full, the chains of new or changed services, and a flush
/// and delete (`-X`) for each chain that is gone. Services are matched by namespace, name,
/// port name and protocol.
pub fn iptables_update(before: &[SvcSpec], after: &[SvcSpec]) -> String {
    let old: HashMap<_, &SvcSpec> = before.iter().map(|s| (s.key(), s)).collect();
    let write: Vec<bool> = after
        .iter()
        .map(|s| old.get(&s.key()).is_none_or(|o| *o != s))
        .collect();
    let live: HashSet<String> = after.iter().flat_map(iptables_chains).collect();
    let mut stale: Vec<String> = before
        .iter()
        .flat_map(iptables_chains)
        .filter(|c| !live.contains(c))
        .collect();
    stale.sort();
    stale.dedup();
    iptables_input(after, &write, &stale, false)
}

/// Every chain of one service: its `KUBE-SVC-` chain, then one `KUBE-SEP-` per endpoint;
/// none without endpoints (kube-proxy writes no nat chain for such a service).
fn iptables_chains(s: &SvcSpec) -> Vec<String> {
    if s.endpoints.is_empty() {
        return Vec::new();
    }
    let mut v = vec![s.iptables_chain()];
    v.extend(s.endpoints.iter().map(|&e| s.iptables_endpoint_chain(e)));
    v
}

/// The `iptables-restore --noflush` input that removes everything [`iptables_rules`]
/// added: the three jumps, then every kube-proxy chain (declared, which flushes it, then
/// deleted).
pub fn iptables_teardown(services: &[SvcSpec]) -> String {
    let mut chains: Vec<String> = TOP_CHAINS.iter().map(|c| (*c).to_owned()).collect();
    chains.extend(services.iter().flat_map(iptables_chains));
    let mut s = String::from("*nat\n");
    for c in &chains {
        let _ = writeln!(s, ":{c} - [0:0]");
    }
    for (from, to, comment) in JUMPS {
        let _ = writeln!(s, "-D {from} -m comment --comment \"{comment}\" -j {to}");
    }
    for c in &chains {
        let _ = writeln!(s, "-X {c}");
    }
    s.push_str("COMMIT\n");
    s
}

/// The top-level nat chains kube-proxy always rewrites.
const TOP_CHAINS: [&str; 4] = [
    "KUBE-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
];

/// The jumps kube-proxy installs into the built-in chains: (from, to, comment).
const JUMPS: [(&str, &str, &str); 3] = [
    ("PREROUTING", "KUBE-SERVICES", "kubernetes service portals"),
    ("OUTPUT", "KUBE-SERVICES", "kubernetes service portals"),
    (
        "POSTROUTING",
        "KUBE-POSTROUTING",
        "kubernetes postrouting rules",
    ),
];

/// kube-proxy's `probability(n)`: `1/n` with ten decimals.
fn probability(n: usize) -> String {
    format!("{:.10}", 1.0 / n as f64)
}

/// The restore input: chain declarations, then rules, in kube-proxy's order. `write[i]`
/// says whether service `i`'s own chains are written; `stale` chains are flushed and
/// deleted; `jumps` adds the built-in chains' jumps.
fn iptables_input(services: &[SvcSpec], write: &[bool], stale: &[String], jumps: bool) -> String {
    let comments = !large_cluster(services);
    let mut chains = String::from("*nat\n");
    let mut rules = String::new();
    for c in TOP_CHAINS {
        let _ = writeln!(chains, ":{c} - [0:0]");
    }
    if jumps {
        for (from, to, comment) in JUMPS {
            let _ = writeln!(
                rules,
                "-A {from} -m comment --comment \"{comment}\" -j {to}"
            );
        }
    }
    let _ = writeln!(
        rules,
        "-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE\n\
         -A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}"
    );
    for (s, &w) in services.iter().zip(write) {
        let proto = s.protocol.as_str();
        let name = s.port_name_string();
        let svc_chain = s.iptables_chain();
        if s.endpoints.is_empty() {
            // kube-proxy sends these to a filter-table REJECT; the nat table has nothing.
            continue;
        }
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -m comment --comment \"{name} cluster IP\" -m {proto} -p {proto} -d {} --dport {} -j {svc_chain}",
            s.vip, s.port
        );
        if !w {
            continue;
        }
        let _ = writeln!(chains, ":{svc_chain} - [0:0]");
        let n = s.endpoints.len();
        for (i, &ep) in s.endpoints.iter().enumerate() {
            let ep_chain = s.iptables_endpoint_chain(ep);
            let _ = writeln!(chains, ":{ep_chain} - [0:0]");
            let _ = write!(rules, "-A {svc_chain}");
            if comments {
                let _ = write!(rules, " -m comment --comment \"{name} -> {ep}\"");
            }
            if i + 1 < n {
                let _ = write!(
                    rules,
                    " -m statistic --mode random --probability {}",
                    probability(n - i)
                );
            }
            let _ = writeln!(rules, " -j {ep_chain}");
        }
        for &ep in &s.endpoints {
            let ep_chain = s.iptables_endpoint_chain(ep);
            let comment = if comments {
                format!(" -m comment --comment {name}")
            } else {
                String::new()
            };
            let _ = writeln!(
                rules,
                "-A {ep_chain}{comment} -s {} -j KUBE-MARK-MASQ\n\
                 -A {ep_chain}{comment} -m {proto} -p {proto} -j DNAT --to-destination {ep}",
                ep.ip()
            );
        }
    }
    for c in stale {
        let _ = writeln!(chains, ":{c} - [0:0]");
        let _ = writeln!(rules, "-X {c}");
    }
    let _ = writeln!(
        rules,
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
         COMMIT"
    );
    chains.push_str(&rules);
    chains
}

/// The nftables table kube-proxy owns.
const NFT_TABLE: &str = "ip kube-proxy";

/// The `nft -f` transaction kube-proxy's nftables mode sends on a full sync for
/// `services`: the table (created, then flushed, so loading it again replaces
/// everything atomically), the hook chains, the `service-ips` verdict map and the chains
/// of every service and endpoint.
pub fn nftables_rules(services: &[SvcSpec]) -> String {
    let t = NFT_TABLE;
    let mut s = format!(
        "add table {t} {{ comment \"rules for kube-proxy\" ; }}\n\
         flush table {t}\n\
         add chain {t} mark-for-masquerade\n\
         add chain {t} masquerading\n\
         add chain {t} services\n\
         add chain {t} nat-prerouting {{ type nat hook prerouting priority -100 ; }}\n\
         add chain {t} nat-output {{ type nat hook output priority -100 ; }}\n\
         add chain {t} nat-postrouting {{ type nat hook postrouting priority 100 ; }}\n\
         add rule {t} mark-for-masquerade mark set mark or {MASQ_MARK}\n\
         add rule {t} masquerading mark and {MASQ_MARK} == 0 return\n\
         add rule {t} masquerading mark set mark xor {MASQ_MARK}\n\
         add rule {t} masquerading masquerade fully-random\n\
         add rule {t} nat-prerouting jump services\n\
         add rule {t} nat-output jump services\n\
         add rule {t} nat-postrouting jump masquerading\n\
         add map {t} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; \
         comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }}\n\
         add rule {t} services ip daddr . meta l4proto . th dport vmap @service-ips\n"
    );
    for svc in services {
        nft_service(&mut s, svc, true);
    }
    s
}

/// Writes one service: its chains (`add` and, on a partial sync, `flush` first), rules and
/// `service-ips` element. A service without endpoints gets nothing (kube-proxy sends its
/// traffic to a reject map instead).
fn nft_service(s: &mut String, svc: &SvcSpec, element: bool) {
    let t = NFT_TABLE;
    if svc.endpoints.is_empty() {
        return;
    }
    let chain = svc.nft_chain();
    let eps: Vec<String> = svc
        .endpoints
        .iter()
        .map(|&e| svc.nft_endpoint_chain(e))
        .collect();
    for c in std::iter::once(&chain).chain(&eps) {
        let _ = writeln!(s, "add chain {t} {c}\nflush chain {t} {c}");
    }
    let vmap: Vec<String> = eps
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{i} : goto {c}"))
        .collect();
    let _ = writeln!(
        s,
        "add rule {t} {chain} numgen random mod {} vmap {{ {} }}",
        eps.len(),
        vmap.join(" , ")
    );
    let proto = svc.protocol.as_str();
    for (ep, c) in svc.endpoints.iter().zip(&eps) {
        let _ = writeln!(
            s,
            "add rule {t} {c} ip saddr {} jump mark-for-masquerade\n\
             add rule {t} {c} meta l4proto {proto} dnat to {ep}",
            ep.ip()
        );
    }
    if element {
        let _ = writeln!(
            s,
            "add element {t} service-ips {{ {} . {proto} . {} : goto {chain} }}",
            svc.vip, svc.port
        );
    }
}

/// The `nft -f` transaction kube-proxy's nftables mode sends on a partial sync from
/// `before` to `after`: each new or changed service's chains re-written (flushed and
/// refilled), map elements added for new services and deleted for removed ones, and every
/// chain that is gone flushed and deleted. Services are matched as in [`iptables_update`].
pub fn nftables_update(before: &[SvcSpec], after: &[SvcSpec]) -> String {
    let t = NFT_TABLE;
    let old: HashMap<_, &SvcSpec> = before.iter().map(|s| (s.key(), s)).collect();
    let new_keys: HashSet<_> = after.iter().map(SvcSpec::key).collect();
    let mut s = String::new();
    for svc in after {
        match old.get(&svc.key()) {
            Some(o) if *o == svc => {}
            Some(o) => {
                // The element stays unless the frontend moved or the endpoints appeared
                // or vanished.
                let same_element = o.vip == svc.vip
                    && o.port == svc.port
                    && o.endpoints.is_empty() == svc.endpoints.is_empty();
                if !same_element && !o.endpoints.is_empty() {
                    nft_delete_element(&mut s, o);
                }
                nft_service(&mut s, svc, !same_element);
            }
            None => nft_service(&mut s, svc, true),
        }
    }
    for o in before.iter().filter(|o| !new_keys.contains(&o.key())) {
        if !o.endpoints.is_empty() {
            nft_delete_element(&mut s, o);
        }
    }
    let live: HashSet<String> = after.iter().flat_map(nft_chains).collect();
    let mut stale: Vec<String> = before
        .iter()
        .flat_map(nft_chains)
        .filter(|c| !live.contains(c))
        .collect();
    stale.sort();
    stale.dedup();
    // Every flush before any delete: a gone service's chain refers to its endpoint chains
    // (through its vmap) until it is flushed, and a referenced chain cannot be deleted.
    for c in &stale {
        let _ = writeln!(s, "flush chain {t} {c}");
    }
    for c in &stale {
        let _ = writeln!(s, "delete chain {t} {c}");
    }
    s
}

fn nft_delete_element(s: &mut String, svc: &SvcSpec) {
    let _ = writeln!(
        s,
        "delete element {NFT_TABLE} service-ips {{ {} . {} . {} }}",
        svc.vip,
        svc.protocol.as_str(),
        svc.port
    );
}

/// Every nftables chain of one service (none without endpoints).
fn nft_chains(s: &SvcSpec) -> Vec<String> {
    if s.endpoints.is_empty() {
        return Vec::new();
    }
    let mut v = vec![s.nft_chain()];
    v.extend(s.endpoints.iter().map(|&e| s.nft_endpoint_chain(e)));
    v
}

/// Why a kernel peer could not be set up, changed or removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A namespace name that is not 1 to [`MAX_NAME`] characters of `[a-z0-9-]`.
    #[error("namespace name {0:?} must be 1 to {MAX_NAME} characters of a-z, 0-9 and '-'")]
    Name(String),
    /// A command could not be started.
    #[error("cannot run `{command}`: {source}{}", install_hint(source))]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        source: io::Error,
    },
    /// A command ran and failed.
    #[error("`{command}` failed ({status}){}", colon(stderr))]
    Failed {
        /// The command line (a restore input is not shown; its size is).
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// What it wrote to stderr, trimmed and cut to its first lines.
        stderr: String,
    },
}

/// The hint for a program that is not there.
fn install_hint(e: &io::Error) -> &'static str {
    if e.kind() == io::ErrorKind::NotFound {
        " (is it installed? kernel peers need iproute2, procps, iptables and nftables)"
    } else {
        ""
    }
}

/// `": text"`, or nothing for empty text.
fn colon(text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

/// Lines of a failing command's stderr kept in [`Error::Failed`]: `iptables-restore` names
/// the failing line in its first line; the rest of a long complaint is noise.
const STDERR_LINES: usize = 10;

/// The argument list (after `ip`) that runs `program args` inside namespace `ns`.
pub fn in_namespace(ns: &str, program: &str, args: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["netns", "exec", ns, program]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    v.extend(args.iter().map(|s| (*s).to_owned()));
    v
}

/// Runs `program args` inside namespace `ns` (as `ip netns exec ns program args`), feeding
/// it `stdin` if given. Returns its stdout and the wall time from start to exit.
///
/// # Errors
///
/// [`Error::Spawn`] or [`Error::Failed`], naming the command (and the size of `stdin`).
pub fn run_in(
    ns: &str,
    program: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<(String, Duration), Error> {
    let argv = in_namespace(ns, program, args);
    run("ip", &argv, stdin)
}

/// Runs `program args`; see [`run_in`].
fn run(program: &str, args: &[String], stdin: Option<&str>) -> Result<(String, Duration), Error> {
    let command = || {
        let mut c = format!("{program} {}", args.join(" "));
        if let Some(input) = stdin {
            let _ = write!(c, " < ({} lines of input)", input.lines().count());
        }
        c
    };
    let start = Instant::now();
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| Error::Spawn {
            command: command(),
            source,
        })?;
    // Feed the input from a second thread: a child that fills its stdout or stderr pipe
    // while we are still writing would otherwise wait for us as we wait for it.
    let out = thread::scope(|scope| {
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            scope.spawn(move || {
                // A child that exits early closes the pipe; its status tells why.
                let _ = pipe.write_all(input.as_bytes());
            });
        }
        child.wait_with_output()
    });
    let elapsed = start.elapsed();
    let out = out.map_err(|source| Error::Spawn {
        command: command(),
        source,
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stderr: Vec<&str> = stderr.trim().lines().take(STDERR_LINES).collect();
        return Err(Error::Failed {
            command: command(),
            status: out.status,
            stderr: stderr.join("\n"),
        });
    }
    Ok((String::from_utf8_lossy(&out.stdout).into_owned(), elapsed))
}

/// Longest namespace name accepted: room for a testbed's 32-byte prefix and its role
/// suffix (`{prefix}-gw`).
pub const MAX_NAME: usize = 64;

/// Whether `name` may name a namespace used here: 1 to [`MAX_NAME`] bytes of
/// `[a-z0-9-]`, not starting with `-` (safe in paths and as an `ip` argument).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A network namespace this process created; deleted on drop (errors printed to stderr).
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates namespace `name` (`ip netns add`) with its loopback up.
    ///
    /// # Errors
    ///
    /// A bad name, or the failing `ip` command (for example: the name exists already).
    pub fn create(name: &str) -> Result<Self, Error> {
        if !valid_name(name) {
            return Err(Error::Name(name.to_owned()));
        }
        run("ip", &["netns".into(), "add".into(), name.into()], None)?;
        let ns = Self {
            name: name.to_owned(),
        };
        run(
            "ip",
            &["-n", name, "link", "set", "lo", "up"].map(String::from),
            None,
        )?;
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = run(
            "ip",
            &["netns".into(), "del".into(), self.name.clone()],
            None,
        ) {
            eprintln!("strait: removing namespace {}: {e}", self.name);
        }
    }
}

/// What forwards in a [`KernelGateway`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerKind {
    /// kube-proxy's iptables mode ([`iptables_rules`], through `iptables-restore`, whichever
    /// back end the system's `iptables` is).
    Iptables,
    /// kube-proxy's nftables mode ([`nftables_rules`], through `nft -f`).
    Nftables,
    /// Routing only: `ip_forward` and no rules (the kernel's floor).
    #[allow(
        dead_code,
        reason = "the line-rate harness and tests/peers.rs use it; the CLI does not yet"
    )]
    PlainForward,
}

impl PeerKind {
    /// `iptables`, `nftables`, `plain-forward`.
    pub const fn as_str(self) -> &'static str {
        match self {
            PeerKind::Iptables => "iptables",
            PeerKind::Nftables => "nftables",
            PeerKind::PlainForward => "plain-forward",
        }
    }
}

/// Whether `iptables-save -t nat` output shows a nat table with nothing in it: no rule and
/// no chain but the four built-in ones.
pub fn nat_table_is_empty(save: &str) -> bool {
    save.lines().map(str::trim).all(|l| {
        l.is_empty()
            || l.starts_with('#')
            || l == "*nat"
            || l == "COMMIT"
            || ["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"]
                .iter()
                .any(|c| l.starts_with(&format!(":{c} ")))
    })
}

/// A namespace that forwards IPv4 with the kernel, optionally through kube-proxy's rules
/// for a set of services. Dropping it removes the rules it added and puts `ip_forward` back
/// as it was (failures printed to stderr); the namespace itself belongs to the caller.
///
/// # Why an empty nat table is restored whole
///
/// kube-proxy always passes `--noflush`, so that it leaves other software's nat rules
/// alone. With the nf_tables back end of iptables 1.8.9 (Debian 12) that mode is
/// quadratic in the number of chains declared: a full ruleset takes 0.75 s at 500
/// services, 3.1 s at 1,000, 17 s at 2,000 and more than 11 minutes at 10,000 (measured on a
/// 2-core VM; 64% of it in `strcmp`). When the namespace's nat table is empty there is
/// nothing to leave alone, so the first load replaces the table whole (plain
/// `iptables-restore`, 10.5 s at 10,000 services) and the teardown empties it again. A
/// namespace whose nat table holds rules gets `--noflush`, like kube-proxy, and a teardown
/// that removes only our chains. Updates always use `--noflush`, as kube-proxy's do.
#[derive(Debug)]
pub struct KernelGateway {
    ns: String,
    kind: PeerKind,
    services: Vec<SvcSpec>,
    forward_before: Option<String>,
    load_time: Duration,
    /// Whether rules were loaded (and so must be removed).
    loaded: bool,
    /// Whether the nat table was empty before the load (iptables only): then the teardown
    /// empties it again.
    owns_nat_table: bool,
    armed: bool,
}

/// The sysctl key of IPv4 forwarding.
const IP_FORWARD: &str = "net.ipv4.ip_forward";

impl KernelGateway {
    /// Turns on IPv4 forwarding in namespace `ns` and loads the rules of `kind` for
    /// `services` (none for [`PeerKind::PlainForward`]). An nftables load replaces any
    /// `ip kube-proxy` table already there.
    ///
    /// # Errors
    ///
    /// The failing command (`sysctl`, `iptables-save`, `iptables-restore`, `nft`); whatever
    /// was done before it is undone.
    pub fn up(ns: &str, kind: PeerKind, services: &[SvcSpec]) -> Result<Self, Error> {
        if !valid_name(ns) {
            return Err(Error::Name(ns.to_owned()));
        }
        let (before, _) = run_in(ns, "sysctl", &["-n", IP_FORWARD], None)?;
        let mut gw = Self {
            ns: ns.to_owned(),
            kind,
            services: Vec::new(),
            forward_before: Some(before.trim().to_owned()),
            load_time: Duration::ZERO,
            loaded: false,
            owns_nat_table: false,
            armed: true,
        };
        run_in(
            ns,
            "sysctl",
            &["-q", "-w", &format!("{IP_FORWARD}=1")],
            None,
        )?;
        let (_, took) = match kind {
            PeerKind::Iptables => {
                let (save, _) = run_in(ns, "iptables-save", &["-t", "nat"], None)?;
                gw.owns_nat_table = nat_table_is_empty(&save);
                let flags: &[&str] = if gw.owns_nat_table {
                    &[]
                } else {
                    &["--noflush"]
                };
                run_in(
                    ns,
                    "iptables-restore",
                    flags,
                    Some(&iptables_rules(services)),
                )?
            }
            PeerKind::Nftables => run_in(ns, "nft", &["-f", "-"], Some(&nftables_rules(services)))?,
            PeerKind::PlainForward => return Ok(gw),
        };
        // Both tools apply a whole input or nothing: had the load failed, there would be no
        // rules to remove, and dropping `gw` would put `ip_forward` back.
        gw.load_time = took;
        gw.services = services.to_vec();
        gw.loaded = true;
        Ok(gw)
    }

    /// The services whose rules are loaded now.
    pub fn services(&self) -> &[SvcSpec] {
        &self.services
    }

    /// Wall time of the command that loaded the rules in [`KernelGateway::up`]
    /// (`iptables-restore` or `nft -f`, including `ip netns exec`); zero for
    /// [`PeerKind::PlainForward`].
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    /// Moves the loaded rules to `after` with the partial sync kube-proxy would send
    /// ([`iptables_update`] through `iptables-restore --noflush`, [`nftables_update`] through
    /// `nft -f`); returns the command's wall time. Does nothing for
    /// [`PeerKind::PlainForward`].
    ///
    /// # Errors
    ///
    /// The failing command; the rules it was to replace stay (both tools apply a whole input
    /// or nothing).
    pub fn update(&mut self, after: &[SvcSpec]) -> Result<Duration, Error> {
        let (_, took) = match self.kind {
            PeerKind::Iptables => run_in(
                &self.ns,
                "iptables-restore",
                &["--noflush"],
                Some(&iptables_update(&self.services, after)),
            )?,
            PeerKind::Nftables => run_in(
                &self.ns,
                "nft",
                &["-f", "-"],
                Some(&nftables_update(&self.services, after)),
            )?,
            PeerKind::PlainForward => return Ok(Duration::ZERO),
        };
        self.services = after.to_vec();
        Ok(took)
    }

    /// Removes the rules and restores `ip_forward` now; every step is tried.
    ///
    /// # Errors
    ///
    /// The first command that failed.
    pub fn down(mut self) -> Result<(), Error> {
        self.armed = false;
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), Error> {
        let mut first = None;
        if self.loaded {
            let removed = match self.kind {
                PeerKind::Iptables if self.owns_nat_table => {
                    run_in(&self.ns, "iptables-restore", &[], Some("*nat\nCOMMIT\n"))
                }
                PeerKind::Iptables => run_in(
                    &self.ns,
                    "iptables-restore",
                    &["--noflush"],
                    Some(&iptables_teardown(&self.services)),
                ),
                PeerKind::Nftables => run_in(
                    &self.ns,
                    "nft",
                    &["delete", "table", "ip", "kube-proxy"],
                    None,
                ),
                PeerKind::PlainForward => Ok((String::new(), Duration::ZERO)),
            };
            match removed {
                Ok(_) => self.loaded = false,
                Err(e) => first = Some(e),
            }
        }
        if let Some(v) = self.forward_before.take().filter(|v| v != "1") {
            let set = format!("{IP_FORWARD}={v}");
            if let Err(e) = run_in(&self.ns, "sysctl", &["-q", "-w", &set], None) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for KernelGateway {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = self.teardown() {
                eprintln!(
                    "strait: removing the {} peer from {}: {e}",
                    self.kind.as_str(),
                    self.ns
                );
            }
        }
    }
}
