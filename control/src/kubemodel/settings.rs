//! What the Kubernetes source is told: which Services it owns, how it forwards them, where
//! addresses come from, and the command-line flags that say so.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use strait_config::model::{Gateway, Mode};

/// Settings of the Kubernetes source.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The gateway the produced services are validated against (MTU, tunnel rules).
    pub gateway: Gateway,
    /// `spec.loadBalancerClass` of the LoadBalancer Services this gateway owns.
    pub class: String,
    /// Also own LoadBalancer Services that name no class. Off by default: a cluster may
    /// run another load-balancer implementation for those (a cloud provider, MetalLB).
    pub classless: bool,
    /// Frontend address of NodePort Services (`address:nodePort`); `None` leaves NodePort
    /// Services out.
    pub node_port_address: Option<IpAddr>,
    /// Forwarding mode of the Services (a Service may override it with the
    /// [`MODE_ANNOTATION`] annotation).
    pub mode: Mode,
    /// Serve `spec.externalIPs` of every Service, as kube-proxy does on the nodes. Off by
    /// default: the gateway would claim (answer ARP/ND for) any address anyone with
    /// Service write access names (CVE-2020-8554). The external IPs of the LoadBalancer
    /// Services this gateway owns are served either way.
    pub all_external_ips: bool,
    /// Address pools LoadBalancer addresses are allocated from (IPv4 and IPv6 CIDRs).
    pub pools: Vec<IpNet>,
    /// Named address pools (`--kube-pool NAME=CIDR`; several CIDRs may share a name, e.g.
    /// one of each family): a Service selects one with the [`POOL_ANNOTATIONS`]. Services
    /// that name no pool are given addresses from [`Settings::pools`] first, then from
    /// these.
    pub named_pools: Vec<(String, IpNet)>,
    /// Also take pools from `StraitAddressPool` objects (`--kube-pool-objects`; the CRD
    /// must be installed: deploy/crd.yaml), with Namespaces watched for their
    /// `namespaceSelectors`. They apply live; the first list of both is awaited before any
    /// address is planned.
    pub pool_objects: bool,
    /// Health check of DSR node backends under `externalTrafficPolicy: Cluster`, as
    /// `(port, path)`: kube-proxy's health endpoint for load balancers (`10256`,
    /// [`KUBE_PROXY_HEALTH_PATH`]). `None`: node backends are taken as healthy.
    pub cluster_node_check: Option<(u16, String)>,
    /// Shortest and longest wait between reconnection attempts to the API server.
    pub backoff: (Duration, Duration),
    /// Name under which Events are reported (`reportingController`).
    pub reporter: String,
    /// Smallest Maglev table of a Service, a prime: Services get the smallest of this and
    /// [`strait_dataplane::maglev::SIZES`] that holds 100 slots per backend. The default
    /// (the smallest of those sizes) sizes each table from its backend count; 65537 gives
    /// every Service at least Katran's fixed size.
    pub maglev_min_table_size: u32,
    /// The Lease that elects the one gateway writing Service status and Events, when
    /// several run (`--kube-lease`); `None`: this gateway writes them.
    pub lease: Option<LeaseSettings>,
}

/// Default `loadBalancerClass` of the Services Strait owns.
pub const DEFAULT_CLASS: &str = "strait.dev/gateway";

/// Annotation requesting LoadBalancer addresses: one address, or a comma-separated list
/// (one per family for dual-stack). Takes precedence over the deprecated
/// `spec.loadBalancerIP`.
pub const ADDRESS_ANNOTATION: &str = "strait.dev/load-balancer-ip";

/// Annotations requesting LoadBalancer addresses, the first present wins: Strait's
/// [`ADDRESS_ANNOTATION`], MetalLB's (current and older spelling) and Cilium LB-IPAM's,
/// so Services move from those without edits. `spec.loadBalancerIP` comes after them.
pub const ADDRESS_ANNOTATIONS: [&str; 4] = [
    ADDRESS_ANNOTATION,
    "metallb.io/loadBalancerIPs",
    "metallb.universe.tf/loadBalancerIPs",
    "lbipam.cilium.io/ips",
];

/// Annotations naming the sharing key of a Service, the first present wins: Services with
/// one key share an address when their ports and protocols do not overlap (and, under
/// `externalTrafficPolicy: Local`, their selectors are equal), as with MetalLB's
/// `allow-shared-ip` and Cilium's `sharing-key`.
pub const SHARING_ANNOTATIONS: [&str; 4] = [
    "strait.dev/allow-shared-ip",
    "metallb.io/allow-shared-ip",
    "metallb.universe.tf/allow-shared-ip",
    "lbipam.cilium.io/sharing-key",
];

/// Annotations listing the other namespaces (comma-separated, `*` for any) whose
/// Services may share an address with this one; both sides must allow it (Cilium's rule).
/// Without them sharing stays within a namespace.
pub const CROSS_NAMESPACE_ANNOTATIONS: [&str; 2] = [
    "strait.dev/sharing-cross-namespace",
    "lbipam.cilium.io/sharing-cross-namespace",
];

/// Annotations naming the pool (`--kube-pool NAME=CIDR`) a Service's addresses come
/// from, the first present wins (MetalLB's two spellings after Strait's).
pub const POOL_ANNOTATIONS: [&str; 3] = [
    "strait.dev/address-pool",
    "metallb.io/address-pool",
    "metallb.universe.tf/address-pool",
];

/// Path of kube-proxy's health endpoint for load balancers (on `healthzBindAddress`,
/// port 10256 by default): 503 while kube-proxy's rules are stale and, with
/// [KEP-3836](https://github.com/kubernetes/enhancements/tree/master/keps/sig-network/3836-kube-proxy-improved-ingress-connectivity-reliability)
/// (on by default since Kubernetes 1.30), while the node is being deleted or is tainted
/// `ToBeDeletedByClusterAutoscaler`, so traffic drains from a node before it goes.
/// `/livez` does not fail then, and kube-proxies before 1.28 answer it with 404.
pub const KUBE_PROXY_HEALTH_PATH: &str = "/healthz";

/// Annotation overriding the forwarding mode of one Service (`dsr-l2`, `dsr-ipip`,
/// `dsr-gue`, `nat`).
pub const MODE_ANNOTATION: &str = "strait.dev/mode";

/// The annotation listing BGP communities for the route of a Service's VIPs,
/// comma-separated, each as MetalLB's `BGPAdvertisement.communities` spells one: a standard
/// community `64512:100` or a large one `large:64512:1:2`. Neither MetalLB nor Cilium has a
/// per-Service annotation for route attributes (both set them on an advertisement
/// resource), so the names are Strait's and the values are theirs.
pub const COMMUNITIES_ANNOTATION: &str = "strait.dev/bgp-communities";

/// The annotation listing large BGP communities, comma-separated, as Cilium's
/// `CiliumBGPAdvertisement` `attributes.communities.large` spells them: `64512:1:2`.
pub const LARGE_COMMUNITIES_ANNOTATION: &str = "strait.dev/bgp-large-communities";

/// The annotation setting the LOCAL_PREF of the route of a Service's VIPs (MetalLB's
/// `localPref`, Cilium's `localPreference`): a number.
pub const LOCAL_PREF_ANNOTATION: &str = "strait.dev/bgp-local-pref";

/// The annotation setting a Service's slow start (the configuration file's `slow_start`):
/// how long an endpoint that comes up ramps to its full share of new flows, e.g. `30s`.
/// Envoy's `slow_start_window` and Traefik's and HAProxy's `slowstart` do the same; none of
/// them has a Kubernetes annotation Strait could share, so the name is Strait's.
pub const SLOW_START_ANNOTATION: &str = "strait.dev/slow-start";

impl Settings {
    /// Shortest wait before reconnecting: 800 ms, kube-rs' `DefaultBackoff` start.
    pub const DEFAULT_BACKOFF_MIN: Duration = Duration::from_millis(800);
    /// Longest wait before reconnecting: 30 s, kube-rs' `DefaultBackoff` ceiling, so a
    /// gateway notices a recovered API server within half a minute.
    pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(30);

    /// Settings with the defaults: the default class, no class-less Services, no NodePort
    /// frontend, the gateway's `default_mode`, external IPs of owned Services only, no
    /// pools.
    pub fn new(gateway: Gateway) -> Self {
        Self {
            mode: gateway.default_mode,
            gateway,
            class: DEFAULT_CLASS.to_owned(),
            classless: false,
            node_port_address: None,
            all_external_ips: false,
            pools: Vec::new(),
            named_pools: Vec::new(),
            pool_objects: false,
            cluster_node_check: None,
            backoff: (Self::DEFAULT_BACKOFF_MIN, Self::DEFAULT_BACKOFF_MAX),
            reporter: "strait".to_owned(),
            maglev_min_table_size: strait_dataplane::maglev::SIZES[0],
            lease: None,
        }
    }
}

/// Command-line flags of `strait run` for the Kubernetes source (flatten into the `run`
/// subcommand with `#[command(flatten)]`).
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Take services from the Kubernetes API (Services, EndpointSlices, Nodes) in addition
    /// to the configuration file's.
    #[arg(long)]
    pub kube: bool,
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then the in-cluster service
    /// account).
    #[arg(long, requires = "kube")]
    pub kubeconfig: Option<PathBuf>,
    /// `spec.loadBalancerClass` of the LoadBalancer Services to serve.
    #[arg(long = "kube-class", default_value = DEFAULT_CLASS, requires = "kube")]
    pub class: String,
    /// Also serve LoadBalancer Services without a `loadBalancerClass`.
    #[arg(long = "kube-classless", requires = "kube")]
    pub classless: bool,
    /// Address pool for LoadBalancer addresses, a CIDR, or NAME=CIDR for a pool Services
    /// select by name (`strait.dev/address-pool`); repeat for several pools, or for
    /// several CIDRs of one name.
    #[arg(long = "kube-pool", value_name = "[NAME=]CIDR", value_parser = parse_pool, requires = "kube")]
    pub pools: Vec<(Option<String>, IpNet)>,
    /// Also take address pools from StraitAddressPool objects (strait.dev/v1alpha1; install
    /// deploy/crd.yaml first); changes to them and to Namespace labels apply without a
    /// restart, and the pools' status shows addresses assigned and available.
    #[arg(long = "kube-pool-objects", requires = "kube")]
    pub pool_objects: bool,
    /// Serve NodePort Services on ADDRESS:nodePort.
    #[arg(
        long = "kube-node-port-address",
        value_name = "ADDRESS",
        requires = "kube"
    )]
    pub node_port_address: Option<IpAddr>,
    /// Forwarding mode of Kubernetes services (default: gateway.default_mode).
    #[arg(long = "kube-mode", value_name = "MODE", requires = "kube")]
    pub mode: Option<Mode>,
    /// Serve `spec.externalIPs` of every Service, not only of the LoadBalancer Services
    /// this gateway owns.
    #[arg(long = "kube-all-external-ips", requires = "kube")]
    pub all_external_ips: bool,
    /// Health-check DSR node backends of `externalTrafficPolicy: Cluster` Services on
    /// kube-proxy's health port (`/healthz`), e.g. 10256.
    #[arg(
        long = "kube-proxy-health-port",
        value_name = "PORT",
        requires = "kube"
    )]
    pub kube_proxy_health_port: Option<u16>,
    /// Smallest Maglev table size of a Kubernetes Service, a prime; larger Services get
    /// larger tables (100 slots per backend).
    #[arg(
        long = "kube-maglev-min-table-size",
        value_name = "PRIME",
        default_value_t = strait_dataplane::maglev::SIZES[0],
        value_parser = parse_table_size,
        requires = "kube"
    )]
    pub maglev_min_table_size: u32,
    /// With several gateways on one cluster: the Lease (`NAMESPACE/NAME`,
    /// coordination.k8s.io/v1) that elects the one writing Service status and Events; the
    /// others serve traffic and follow. Without it this gateway writes them.
    #[arg(long = "kube-lease", value_name = "NAMESPACE/NAME", value_parser = parse_lease, requires = "kube")]
    pub lease: Option<(String, String)>,
    /// This gateway's identity in the Lease (default: the host name).
    #[arg(long = "kube-identity", value_name = "NAME", requires = "lease")]
    pub identity: Option<String>,
    /// The Lease's duration: how long a silent leader is waited for before another takes
    /// over.
    #[arg(
        long = "kube-lease-duration",
        value_name = "DURATION",
        default_value = "15s",
        value_parser = humantime::parse_duration,
        requires = "lease"
    )]
    pub lease_duration: Duration,
}

/// A `--kube-lease`: `NAMESPACE/NAME`, both DNS labels.
fn parse_lease(s: &str) -> Result<(String, String), String> {
    let label = |x: &str| {
        !x.is_empty()
            && x.len() <= 63
            && x.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    };
    match s.split_once('/') {
        Some((ns, name)) if label(ns) && label(name) => Ok((ns.to_owned(), name.to_owned())),
        _ => Err(format!(
            "{s:?} is not NAMESPACE/NAME (lower-case names, e.g. strait-system/strait-gateway)"
        )),
    }
}

/// A `--kube-pool`: `CIDR` or `NAME=CIDR`, the name a DNS label (as MetalLB's pool names
/// are object names).
fn parse_pool(s: &str) -> Result<(Option<String>, IpNet), String> {
    let (name, cidr) = match s.split_once('=') {
        Some((n, c)) => (Some(n.trim()), c.trim()),
        None => (None, s.trim()),
    };
    if let Some(n) = name {
        let ok = !n.is_empty()
            && n.len() <= 63
            && n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
        if !ok {
            return Err(format!(
                "pool name {n:?} is not a lower-case name (letters, digits, '-', '.'; e.g. public=203.0.113.0/28)"
            ));
        }
    }
    let net: IpNet = cidr
        .parse()
        .map_err(|e| format!("{cidr:?} is not a CIDR (e.g. 203.0.113.0/28): {e}"))?;
    Ok((name.map(str::to_owned), net))
}

/// A `--kube-maglev-min-table-size`: a prime within the sizes a service may have.
fn parse_table_size(s: &str) -> Result<u32, String> {
    use strait_config::model::{is_prime, Service};
    let n: u32 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    let (min, max) = (
        Service::MIN_MAGLEV_TABLE_SIZE,
        strait_dataplane::maglev::LARGE_SIZE,
    );
    if !(min..=max).contains(&n) {
        Err(format!("{n} is outside {min}..={max}"))
    } else if !is_prime(n) {
        Err(format!(
            "{n} is not a prime number (Maglev needs a prime table size, such as 2039 or 65537)"
        ))
    } else {
        Ok(n)
    }
}

impl Args {
    /// The settings these flags give, with `gateway` from the configuration file.
    pub fn settings(&self, gateway: &Gateway) -> Settings {
        let mut s = Settings::new(gateway.clone());
        s.class.clone_from(&self.class);
        s.classless = self.classless;
        for (name, net) in &self.pools {
            match name {
                Some(n) => s.named_pools.push((n.clone(), *net)),
                None => s.pools.push(*net),
            }
        }
        s.node_port_address = self.node_port_address;
        s.pool_objects = self.pool_objects;
        if let Some(mode) = self.mode {
            s.mode = mode;
        }
        s.all_external_ips = self.all_external_ips;
        s.maglev_min_table_size = self.maglev_min_table_size;
        s.cluster_node_check = self
            .kube_proxy_health_port
            .filter(|&p| p != 0)
            .map(|p| (p, KUBE_PROXY_HEALTH_PATH.to_owned()));
        s.lease = self.lease.as_ref().map(|(namespace, name)| LeaseSettings {
            namespace: namespace.clone(),
            name: name.clone(),
            identity: self.identity.clone().unwrap_or_else(host_name),
            duration: self.lease_duration,
        });
        s
    }
}

/// The host name, for a gateway's identity in the Lease.
fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("strait-{}", std::process::id()))
}

/// Where the Lease is and who this gateway is (`crate::kube::lease` holds it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This gateway's identity (`holderIdentity`): unique among the gateways.
    pub identity: String,
    /// `leaseDurationSeconds`: how long a silent leader is waited for.
    pub duration: Duration,
}

impl LeaseSettings {
    /// Default duration: 15 s, client-go's and kube-controller-manager's.
    pub const DEFAULT_DURATION: Duration = Duration::from_secs(15);

    /// How often a candidate tries: a fifth of the duration, at least a second.
    pub fn retry(&self) -> Duration {
        (self.duration / 5).max(Duration::from_secs(1))
    }

    /// How long a leader may fail to renew before it stops leading: two thirds of the
    /// duration, so it stops before another may take over.
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }
}
