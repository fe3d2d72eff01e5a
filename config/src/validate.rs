//! From the raw file to the model, collecting every problem on the way.
//!
//! Each `Checker` method checks one value and returns it typed, or records a [`Problem`]
//! and returns `None`. A section's checks all run before its `Option`s are combined, so one
//! bad field never hides another; cross-field rules run only when the fields they relate
//! were themselves valid, so a bad value yields one problem, not a cascade.

mod bgp;
mod dpdk;
mod l2;
mod sync;

use std::collections::HashMap;
use std::fmt::Display;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;

use crate::error::Problem;
use crate::model::{
    is_prime, Backend, BackendState, Config, Gateway, HealthCheck, HealthKind, Interface, MacAddr,
    Mode, ParseEnumError, PassiveHealth, Protocol, Role, RouteAttrs, Service, Timeouts,
};
use crate::raw::{
    RawAffinity, RawBackend, RawConfig, RawGateway, RawHealthCheck, RawInterface, RawPassiveHealth,
    RawService, RawTimeouts,
};

/// Longest Unix socket path: `sun_path` (108 bytes) less the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

/// Longest interface name: `IFNAMSIZ` (16) less the terminating NUL.
const MAX_IFNAME_LEN: usize = 15;

/// Converts a raw configuration to the model, or returns every problem found.
pub(crate) fn validate(raw: &RawConfig) -> Result<Config, Vec<Problem>> {
    let mut c = Checker::default();
    let gateway = c.gateway(&raw.gateway);
    let default_mode = gateway.as_ref().map(|g| g.default_mode).or_else(|| {
        // A bad `default_mode` is reported once; services without a mode then skip their
        // mode-dependent rules.
        match &raw.gateway.default_mode {
            None => Some(Gateway::DEFAULT_MODE),
            Some(s) => s.parse().ok(),
        }
    });
    let services: Vec<Option<Service>> = raw
        .services
        .iter()
        .enumerate()
        .map(|(i, s)| c.service(&format!("services[{i}]"), s, default_mode))
        .collect();
    c.services_unique(&services);
    if let Some(gateway) = &gateway {
        c.mtu_fits_ipv6(gateway, &services);
    }

    let services: Option<Vec<Service>> = services.into_iter().collect();
    match (gateway, services) {
        (Some(gateway), Some(services)) if c.problems.is_empty() => {
            Ok(Config { gateway, services })
        }
        _ => {
            if c.problems.is_empty() {
                c.problems.push(Problem::new(
                    "",
                    "invalid configuration (internal error: no problem recorded)",
                ));
            }
            Err(c.problems)
        }
    }
}

/// Checks one service on its own, as [`validate`] checks `services[index]` of a
/// configuration with `gateway`: every rule of a single service, and the IPv6 minimum MTU
/// rule. The rules across services (unique names and frontends) are the caller's.
pub(crate) fn validate_service(
    gateway: &Gateway,
    raw: &RawService,
    index: usize,
) -> Result<Service, Vec<Problem>> {
    let mut c = Checker::default();
    let service = c.service(
        &format!("services[{index}]"),
        raw,
        Some(gateway.default_mode),
    );
    if let Some(s) = &service {
        c.mtu_fits_ipv6_at(gateway, s, index);
    }
    match service {
        Some(s) if c.problems.is_empty() => Ok(s),
        _ => {
            if c.problems.is_empty() {
                c.problems.push(Problem::new(
                    format!("services[{index}]"),
                    "invalid service (internal error: no problem recorded)",
                ));
            }
            Err(c.problems)
        }
    }
}

#[derive(Default)]
struct Checker {
    problems: Vec<Problem>,
}

impl Checker {
    fn problem(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem::new(path, message));
    }

    fn required<T>(&mut self, path: &str, value: Option<T>) -> Option<T> {
        if value.is_none() {
            self.problem(path, "is required");
        }
        value
    }

    /// An integer in `lo..=hi`, converted to `T`.
    fn int<T: TryFrom<i64> + Display + Copy + Into<i64>>(
        &mut self,
        path: &str,
        value: i64,
        lo: T,
        hi: T,
    ) -> Option<T> {
        match T::try_from(value) {
            Ok(v) if value >= lo.into() && value <= hi.into() => Some(v),
            _ => {
                self.problem(path, format!("{value} is outside {lo}..={hi}"));
                None
            }
        }
    }

    /// An optional integer in `lo..=hi`, `default` when absent.
    fn int_or<T: TryFrom<i64> + Display + Copy + Into<i64>>(
        &mut self,
        path: &str,
        value: Option<i64>,
        lo: T,
        hi: T,
        default: T,
    ) -> Option<T> {
        match value {
            None => Some(default),
            Some(v) => self.int(path, v, lo, hi),
        }
    }

    fn port(&mut self, path: &str, value: i64) -> Option<u16> {
        match u16::try_from(value) {
            Ok(port) if port != 0 => Some(port),
            _ => {
                self.problem(path, format!("{value} is not a port number"));
                None
            }
        }
    }

    fn port_or(&mut self, path: &str, value: Option<i64>, default: u16) -> Option<u16> {
        match value {
            None => Some(default),
            Some(v) => self.port(path, v),
        }
    }

    fn choice<T: FromStr<Err = ParseEnumError>>(&mut self, path: &str, value: &str) -> Option<T> {
        value
            .parse()
            .map_err(|e: ParseEnumError| self.problem(path, e.to_string()))
            .ok()
    }

    fn choice_or<T: FromStr<Err = ParseEnumError>>(
        &mut self,
        path: &str,
        value: Option<&String>,
        default: T,
    ) -> Option<T> {
        match value {
            None => Some(default),
            Some(v) => self.choice(path, v),
        }
    }

    /// A humantime duration, e.g. `30s`, `500ms`, `2h 4m`.
    fn duration(&mut self, path: &str, value: &str) -> Option<Duration> {
        humantime::parse_duration(value)
            .map_err(|e| {
                self.problem(
                    path,
                    format!("{value:?} is not a duration like \"30s\", \"500ms\" or \"2h\" ({e})"),
                )
            })
            .ok()
    }

    fn duration_or(
        &mut self,
        path: &str,
        value: Option<&String>,
        default: Duration,
    ) -> Option<Duration> {
        match value {
            None => Some(default),
            Some(v) => self.duration(path, v),
        }
    }

    /// A duration in `lo..=hi`; when `lo` is zero, zero itself is refused too.
    fn duration_in(
        &mut self,
        path: &str,
        d: Duration,
        lo: Duration,
        hi: Duration,
    ) -> Option<Duration> {
        if d.is_zero() && lo.is_zero() {
            self.problem(path, format!("{} must be more than zero", show(d)));
            None
        } else if d < lo {
            self.problem(path, format!("{} is shorter than {}", show(d), show(lo)));
            None
        } else if d > hi {
            self.problem(path, format!("{} is longer than {}", show(d), show(hi)));
            None
        } else {
            Some(d)
        }
    }

    fn ip(&mut self, path: &str, value: &str) -> Option<IpAddr> {
        value
            .parse()
            .map_err(|_| self.problem(path, format!("{value:?} is not an IP address")))
            .ok()
    }

    /// A unicast address: not unspecified, multicast or the IPv4 broadcast address; and an
    /// IPv4 address written as IPv4, not IPv4-mapped (`::ffff:a.b.c.d`), so that one address
    /// has one spelling and two spellings of a frontend or a peer are seen as one.
    fn unicast(&mut self, path: &str, value: &str) -> Option<IpAddr> {
        let ip = self.ip(path, value)?;
        let bad = match ip {
            IpAddr::V4(v4) if v4.is_broadcast() => Some("is the broadcast address".to_owned()),
            _ if ip.is_unspecified() => Some("is the unspecified address".to_owned()),
            _ if ip.is_multicast() => Some("is a multicast address".to_owned()),
            IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map(|v4| format!("is an IPv4-mapped IPv6 address: write the IPv4 address, {v4}")),
            IpAddr::V4(_) => None,
        };
        self.address_unless(path, ip, bad)
    }

    /// An address that can be a VIP, a backend or a tunnel endpoint, one that packets on the
    /// gateway's network carry: [`Self::unicast`], and not loopback or link-local (which
    /// needs an interface to mean anything).
    fn station(&mut self, path: &str, value: &str) -> Option<IpAddr> {
        let ip = self.unicast(path, value)?;
        let bad = match ip {
            _ if ip.is_loopback() => Some("is a loopback address"),
            IpAddr::V4(v4) if v4.is_link_local() => Some("is a link-local address"),
            IpAddr::V6(v6) if v6.is_unicast_link_local() => Some("is a link-local address"),
            _ => None,
        };
        self.address_unless(path, ip, bad)
    }

    /// `ip`, or with `bad` (what is wrong with it) a problem at `path` naming it.
    fn address_unless(
        &mut self,
        path: &str,
        ip: IpAddr,
        bad: Option<impl std::fmt::Display>,
    ) -> Option<IpAddr> {
        match bad {
            Some(what) => {
                self.problem(path, format!("{ip} {what}"));
                None
            }
            None => Some(ip),
        }
    }

    // ---- gateway ---------------------------------------------------------------------

    fn gateway(&mut self, raw: &RawGateway) -> Option<Gateway> {
        let admin_listen = match &raw.admin_listen {
            None => Some(Gateway::DEFAULT_ADMIN_LISTEN),
            Some(s) => s
                .parse::<SocketAddr>()
                .map_err(|_| {
                    self.problem(
                        "gateway.admin_listen",
                        format!("{s:?} is not an address:port like \"127.0.0.1:9900\""),
                    )
                })
                .ok(),
        };
        let admin_socket = self
            .absolute_path("gateway.admin_socket", raw.admin_socket.as_deref())
            .and_then(|p| match p {
                // sun_path holds 108 bytes with the terminating NUL.
                Some(p) if p.as_os_str().len() > MAX_SOCKET_PATH => {
                    self.problem(
                        "gateway.admin_socket",
                        format!(
                            "{} is {} bytes long; a Unix socket's path has at most {MAX_SOCKET_PATH}",
                            p.display(),
                            p.as_os_str().len()
                        ),
                    );
                    None
                }
                p => Some(p),
            });
        let admin_token_file =
            self.absolute_path("gateway.admin_token_file", raw.admin_token_file.as_deref());
        let default_mode = self.choice_or(
            "gateway.default_mode",
            raw.default_mode.as_ref(),
            Gateway::DEFAULT_MODE,
        );
        let flow_capacity_per_core = self.int_or(
            "gateway.flow_capacity_per_core",
            raw.flow_capacity_per_core,
            1,
            Gateway::MAX_FLOW_CAPACITY_PER_CORE,
            Gateway::DEFAULT_FLOW_CAPACITY_PER_CORE,
        );
        let new_flows_per_second_per_core = self.int_or(
            "gateway.new_flows_per_second_per_core",
            raw.new_flows_per_second_per_core,
            0,
            u32::MAX,
            Gateway::DEFAULT_NEW_FLOWS_PER_SECOND_PER_CORE,
        );
        let gue_port = self.port_or("gateway.gue_port", raw.gue_port, Gateway::DEFAULT_GUE_PORT);
        let tunnel_source_v4 = match &raw.tunnel_source_v4 {
            None => Some(None),
            Some(s) => self.tunnel_source("gateway.tunnel_source_v4", s, "IPv4", |ip| match ip {
                IpAddr::V4(v4) => Some(v4),
                IpAddr::V6(_) => None,
            }),
        };
        let tunnel_source_v6 = match &raw.tunnel_source_v6 {
            None => Some(None),
            Some(s) => self.tunnel_source("gateway.tunnel_source_v6", s, "IPv6", |ip| match ip {
                IpAddr::V6(v6) => Some(v6),
                IpAddr::V4(_) => None,
            }),
        };
        let mtu = self.int_or(
            "gateway.mtu",
            raw.mtu,
            Gateway::MIN_MTU,
            Gateway::MAX_MTU,
            Gateway::DEFAULT_MTU,
        );
        let timeouts = self.timeouts(raw.timeouts.as_ref());
        let interfaces = self.interfaces(&raw.interfaces);
        let default_grace = if raw.bgp.is_some() || raw.l2.is_some() {
            Gateway::DEFAULT_DRAIN_GRACE
        } else {
            Duration::ZERO
        };
        let drain_grace = self
            .duration_or(
                "gateway.drain_grace",
                raw.drain_grace.as_ref(),
                default_grace,
            )
            .and_then(|d| {
                if d.is_zero() {
                    // Zero: stop right after withdrawing (a lab, or a box behind BFD only).
                    return Some(d);
                }
                self.duration_in(
                    "gateway.drain_grace",
                    d,
                    Duration::ZERO,
                    Gateway::MAX_DRAIN_GRACE,
                )
            });
        let bgp = match &raw.bgp {
            None => Some(None),
            Some(b) => self.bgp(b).map(Some),
        };
        let l2 = match &raw.l2 {
            None => Some(None),
            Some(_) if raw.bgp.is_some() => {
                self.problem(
                    "gateway.l2",
                    "[gateway.bgp] is configured too: with routes, routers move traffic between gateways; VRRP is for segments without them (choose one)",
                );
                None
            }
            Some(l) => self.l2(l).map(Some),
        };
        let sync = match &raw.sync {
            None => Some(None),
            Some(s) => self.sync(s).map(Some),
        };
        if let Some(interfaces) = &interfaces {
            self.drivers_agree(interfaces, raw.dpdk.as_ref());
            if let Some(mtu) = mtu {
                self.dpdk_mtu(interfaces, mtu);
            }
        }
        let dpdk = match &raw.dpdk {
            None => Some(None),
            Some(d) => self.dpdk(d).map(Some),
        };
        Some(Gateway {
            sync: sync?,
            dpdk: dpdk?,
            admin_listen: admin_listen?,
            admin_socket: admin_socket?,
            admin_token_file: admin_token_file?,
            default_mode: default_mode?,
            flow_capacity_per_core: flow_capacity_per_core?,
            new_flows_per_second_per_core: new_flows_per_second_per_core?,
            gue_port: gue_port?,
            tunnel_source_v4: tunnel_source_v4?,
            tunnel_source_v6: tunnel_source_v6?,
            mtu: mtu?,
            timeouts: timeouts?,
            interfaces: interfaces?,
            drain_grace: drain_grace?,
            bgp: bgp?,
            l2: l2?,
        })
    }

    /// An optional absolute path (a relative one would depend on where `strait` was
    /// started).
    fn absolute_path(&mut self, path: &str, value: Option<&str>) -> Option<Option<PathBuf>> {
        match value {
            None => Some(None),
            Some(v) if v.starts_with('/') && v.len() > 1 => Some(Some(PathBuf::from(v))),
            Some(v) => {
                self.problem(path, format!("{v:?} is not an absolute path"));
                None
            }
        }
    }

    fn tunnel_source<T>(
        &mut self,
        path: &str,
        value: &str,
        family: &str,
        of_family: fn(IpAddr) -> Option<T>,
    ) -> Option<Option<T>> {
        let ip = match value.parse::<IpAddr>() {
            Ok(_) => self.station(path, value)?,
            Err(_) => {
                self.problem(path, format!("{value:?} is not an {family} address"));
                return None;
            }
        };
        match of_family(ip) {
            Some(v) => Some(Some(v)),
            None => {
                self.problem(path, format!("{ip} is not an {family} address"));
                None
            }
        }
    }

    fn timeouts(&mut self, raw: Option<&RawTimeouts>) -> Option<Timeouts> {
        let empty = RawTimeouts::default();
        let raw = raw.unwrap_or(&empty);
        let one = |c: &mut Self, name: &str, value: Option<&String>, default: Duration| {
            let path = format!("gateway.timeouts.{name}");
            let d = c.duration_or(&path, value, default)?;
            c.duration_in(&path, d, Duration::ZERO, Timeouts::MAX)
        };
        let tcp_syn = one(
            self,
            "tcp_syn",
            raw.tcp_syn.as_ref(),
            Timeouts::DEFAULT_TCP_SYN,
        );
        let tcp_established = one(
            self,
            "tcp_established",
            raw.tcp_established.as_ref(),
            Timeouts::DEFAULT_TCP_ESTABLISHED,
        );
        let tcp_closing = one(
            self,
            "tcp_closing",
            raw.tcp_closing.as_ref(),
            Timeouts::DEFAULT_TCP_CLOSING,
        );
        let udp = one(self, "udp", raw.udp.as_ref(), Timeouts::DEFAULT_UDP);
        if let (Some(syn), Some(est)) = (tcp_syn, tcp_established) {
            if syn > est {
                self.problem(
                    "gateway.timeouts.tcp_syn",
                    format!(
                        "{} is longer than tcp_established ({}); a half-open flow would outlive an established one",
                        show(syn),
                        show(est)
                    ),
                );
                return None;
            }
        }
        Some(Timeouts {
            tcp_syn: tcp_syn?,
            tcp_established: tcp_established?,
            tcp_closing: tcp_closing?,
            udp: udp?,
        })
    }

    fn interfaces(&mut self, raw: &[RawInterface]) -> Option<Vec<Interface>> {
        if raw.is_empty() {
            self.problem(
                "gateway.interfaces",
                "at least one interface is required ([[gateway.interfaces]])",
            );
            return None;
        }
        let mut names: HashMap<&str, String> = HashMap::new();
        let mut cores_seen: HashMap<i64, String> = HashMap::new();
        let mut queue_cores: HashMap<i64, (i64, String)> = HashMap::new();
        let mut out = Vec::with_capacity(raw.len());
        for (i, iface) in raw.iter().enumerate() {
            let path = format!("gateway.interfaces[{i}]");
            let name = self.interface_name(&path, iface.name.as_deref());
            if let Some(name) = name {
                if let Some(first) = names.get(name) {
                    self.problem(
                        format!("{path}.name"),
                        format!("{name:?} is already used by {first}"),
                    );
                } else {
                    names.insert(name, path.clone());
                }
            }
            let queues = self.queues(&path, iface.queues.as_deref());
            let cores = match &iface.cores {
                None => Some(None),
                Some(cores) => self.cores(
                    &path,
                    cores,
                    iface.queues.as_deref(),
                    &mut cores_seen,
                    &mut queue_cores,
                ),
            };
            let role = self.choice_or(
                &format!("{path}.role"),
                iface.role.as_ref(),
                Role::default(),
            );
            let vlans = self.vlans(&path, iface.vlans.as_deref().unwrap_or_default());
            let driver = self.driver(&path, iface);
            out.push(match (name, queues, cores, role, vlans, driver) {
                (Some(name), Some(queues), Some(cores), Some(role), Some(vlans), Some(driver)) => {
                    Some(Interface {
                        name: name.to_owned(),
                        queues,
                        cores,
                        role,
                        vlans,
                        driver,
                    })
                }
                _ => None,
            });
        }
        out.into_iter().collect()
    }

    /// The kernel's rules for a device name (`dev_valid_name()` in `net/core/dev.c`):
    /// 1..IFNAMSIZ-1 bytes, not `.` or `..`, no `/`, `:` or whitespace; and no control
    /// character.
    fn interface_name<'a>(&mut self, path: &str, name: Option<&'a str>) -> Option<&'a str> {
        let path = format!("{path}.name");
        let name = self.required(&path, name)?;
        let message = if name.is_empty() || name.len() > MAX_IFNAME_LEN {
            format!(
                "{name:?} is {} bytes long; interface names have 1 to {MAX_IFNAME_LEN}",
                name.len()
            )
        } else if name == "." || name == ".." {
            format!("{name:?} is not a valid interface name")
        } else if name
            .chars()
            .any(|ch| ch == '/' || ch == ':' || ch.is_whitespace())
        {
            format!("{name:?} contains '/', ':' or whitespace, which interface names cannot")
        } else if name.chars().any(char::is_control) {
            // NUL ends the kernel's copy of the name; the others no tool shows.
            format!("{name:?} contains a control character")
        } else {
            return Some(name);
        };
        self.problem(path, message);
        None
    }

    fn queues(&mut self, path: &str, raw: Option<&[i64]>) -> Option<Vec<u32>> {
        let path = format!("{path}.queues");
        let raw = self.required(&path, raw)?;
        if raw.is_empty() {
            self.problem(path, "must list at least one queue");
            return None;
        }
        let mut seen: HashMap<i64, usize> = HashMap::new();
        let mut out = Vec::with_capacity(raw.len());
        for (j, &q) in raw.iter().enumerate() {
            let qpath = format!("{path}[{j}]");
            if let Some(first) = seen.get(&q) {
                self.problem(
                    qpath,
                    format!("queue {q} is already listed at {path}[{first}]"),
                );
                out.push(None);
                continue;
            }
            seen.insert(q, j);
            out.push(self.int(&qpath, q, 0, u32::MAX));
        }
        out.into_iter().collect()
    }

    /// 802.1Q VLAN ids: 1..=4094 (0 is a priority tag without a VLAN, 4095 reserved), each
    /// once.
    fn vlans(&mut self, path: &str, raw: &[i64]) -> Option<Vec<u16>> {
        let path = format!("{path}.vlans");
        let mut seen: HashMap<i64, usize> = HashMap::new();
        let mut out = Vec::with_capacity(raw.len());
        for (j, &v) in raw.iter().enumerate() {
            let vpath = format!("{path}[{j}]");
            if let Some(first) = seen.get(&v) {
                self.problem(
                    vpath,
                    format!("VLAN {v} is already listed at {path}[{first}]"),
                );
                out.push(None);
                continue;
            }
            seen.insert(v, j);
            out.push(
                u16::try_from(v)
                    .ok()
                    .filter(|v| (1..=Interface::MAX_VLAN).contains(v))
                    .or_else(|| {
                        self.problem(
                            &vpath,
                            format!(
                                "{v} is not a VLAN id (1..={}; 0 is a priority tag, 4095 reserved)",
                                Interface::MAX_VLAN
                            ),
                        );
                        None
                    }),
            );
        }
        out.into_iter().collect()
    }

    fn cores(
        &mut self,
        path: &str,
        raw: &[i64],
        queues: Option<&[i64]>,
        seen: &mut HashMap<i64, String>,
        queue_cores: &mut HashMap<i64, (i64, String)>,
    ) -> Option<Option<Vec<usize>>> {
        let path = format!("{path}.cores");
        let mut ok = true;
        if let Some(queues) = queues {
            if raw.len() != queues.len() {
                self.problem(
                    &path,
                    format!(
                        "length {} differs from the length of queues ({}); give one core per queue",
                        raw.len(),
                        queues.len()
                    ),
                );
                ok = false;
            }
        }
        let mut out = Vec::with_capacity(raw.len());
        for (j, &core) in raw.iter().enumerate() {
            let cpath = format!("{path}[{j}]");
            let Some(c) = usize::try_from(core)
                .ok()
                .filter(|&c| c <= Interface::MAX_CORE)
            else {
                self.problem(
                    cpath,
                    format!("{core} is not a CPU number (0..={})", Interface::MAX_CORE),
                );
                ok = false;
                continue;
            };
            // One worker serves a queue number on every interface that lists it (two-arm:
            // the client side's queue 0 and the backend side's), so such a queue's core is
            // the same wherever it is given.
            let queue = queues.and_then(|q| q.get(j)).copied();
            match queue.and_then(|q| queue_cores.get(&q)) {
                Some((first, _)) if *first == core => {}
                Some((first, at)) => {
                    self.problem(
                        &cpath,
                        format!(
                            "core {core} for queue {q}, whose worker (it serves queue {q} of every interface) {at} puts on core {first}",
                            q = queue.unwrap_or_default()
                        ),
                    );
                    ok = false;
                }
                None => {
                    if let Some(first) = seen.get(&core) {
                        self.problem(&cpath, format!("core {core} is already used by {first}"));
                        ok = false;
                    } else {
                        seen.insert(core, cpath.clone());
                        if let Some(q) = queue {
                            queue_cores.insert(q, (core, cpath));
                        }
                    }
                }
            }
            out.push(c);
        }
        ok.then_some(Some(out))
    }

    // ---- services --------------------------------------------------------------------

    fn service(
        &mut self,
        path: &str,
        raw: &RawService,
        default_mode: Option<Mode>,
    ) -> Option<Service> {
        let name = self.service_name(path, raw.name.as_deref());
        let vip = self
            .required(&format!("{path}.vip"), raw.vip.as_deref())
            .and_then(|s| self.station(&format!("{path}.vip"), s));
        let port = self
            .required(&format!("{path}.port"), raw.port)
            .and_then(|p| self.port(&format!("{path}.port"), p));
        // Kubernetes' ServicePort.protocol defaults to TCP; so does ours.
        let protocol = self.choice_or(
            &format!("{path}.protocol"),
            raw.protocol.as_ref(),
            Protocol::Tcp,
        );
        let mode = match &raw.mode {
            None => default_mode,
            Some(m) => self.choice(&format!("{path}.mode"), m),
        };
        let mut few_enough = true;
        if raw.backends.len() > Service::MAX_BACKENDS {
            self.problem(
                format!("{path}.backends"),
                format!(
                    "{} backends; a service has at most {} (a Maglev slot names its backend in 16 bits)",
                    raw.backends.len(),
                    Service::MAX_BACKENDS
                ),
            );
            few_enough = false;
        }
        let maglev_table_size =
            self.maglev_table_size(path, raw.maglev_table_size, raw.backends.len());
        let source_ranges = self.source_ranges(path, raw.source_ranges.as_deref(), vip);
        let session_affinity = match &raw.session_affinity {
            None => Some(None),
            Some(a) => self.affinity(path, a).map(Some),
        };
        let health_check = match &raw.health_check {
            None => Some(None),
            Some(h) => self.health_check(path, h, protocol).map(Some),
        };
        let passive_health = match (mode, protocol, &health_check) {
            (Some(m), Some(p), Some(hc)) => {
                self.passive_health(path, raw.passive_health.as_ref(), m, p, hc.as_ref())
            }
            _ => None,
        };
        let slow_start = match &raw.slow_start {
            None => Some(None),
            Some(v) => {
                let path = format!("{path}.slow_start");
                parse_slow_start(v)
                    .map_err(|why| self.problem(path, why))
                    .ok()
                    .map(Some)
            }
        };
        let backends = self.backends(path, &raw.backends, vip, port, mode);
        let route = self.route_attrs(path, raw);
        if !few_enough {
            return None;
        }
        Some(Service {
            name: name?,
            vip: vip?,
            port: port?,
            protocol: protocol?,
            mode: mode?,
            maglev_table_size: maglev_table_size?,
            source_ranges: source_ranges?,
            session_affinity: session_affinity?,
            health_check: health_check?,
            passive_health: passive_health?,
            slow_start: slow_start?,
            backends: backends?,
            route: route?,
        })
    }

    fn route_attrs(&mut self, path: &str, raw: &RawService) -> Option<RouteAttrs> {
        let mut ok = true;
        let mut communities = Vec::new();
        for (i, c) in raw.bgp_communities.iter().flatten().enumerate() {
            match parse_community(c) {
                Some(pair) => communities.push(pair),
                None => {
                    self.problem(
                        format!("{path}.bgp_communities[{i}]"),
                        format!("{c:?} is not a community like \"64512:100\" (two numbers of 0..=65535)"),
                    );
                    ok = false;
                }
            }
        }
        let mut large_communities = Vec::new();
        for (i, c) in raw.bgp_large_communities.iter().flatten().enumerate() {
            match parse_large_community(c) {
                Some(triple) => large_communities.push(triple),
                None => {
                    self.problem(
                        format!("{path}.bgp_large_communities[{i}]"),
                        format!("{c:?} is not a large community like \"64512:1:2\" (three numbers of 0..=4294967295)"),
                    );
                    ok = false;
                }
            }
        }
        let local_pref = match raw.bgp_local_pref {
            None => Some(None),
            Some(v) => self
                .int(&format!("{path}.bgp_local_pref"), v, 0, u32::MAX)
                .map(Some),
        };
        let local_pref = local_pref?;
        ok.then(|| {
            let mut attrs = RouteAttrs::default();
            attrs.merge(&RouteAttrs {
                communities,
                large_communities,
                local_pref,
            });
            attrs
        })
    }

    fn service_name(&mut self, path: &str, name: Option<&str>) -> Option<String> {
        let path = format!("{path}.name");
        let name = self.required(&path, name)?;
        let allowed =
            |ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit() || "-./_".contains(ch);
        if name.is_empty() {
            self.problem(path, "must not be empty");
            None
        } else if !name.chars().all(allowed) {
            self.problem(
                path,
                format!("{name:?} may only contain a-z, 0-9, '-', '.', '/' and '_'"),
            );
            None
        } else {
            Some(name.to_owned())
        }
    }

    fn maglev_table_size(&mut self, path: &str, raw: Option<i64>, backends: usize) -> Option<u32> {
        let path = format!("{path}.maglev_table_size");
        let size = self.int_or(
            &path,
            raw,
            Service::MIN_MAGLEV_TABLE_SIZE,
            Service::MAX_MAGLEV_TABLE_SIZE,
            Service::DEFAULT_MAGLEV_TABLE_SIZE,
        )?;
        if !is_prime(size) {
            self.problem(
                path,
                format!("{size} is not a prime number (Maglev needs a prime table size, such as 65537 or 655373)"),
            );
            None
        } else if (size as usize) < backends {
            self.problem(
                path,
                format!("{size} is smaller than the number of backends ({backends})"),
            );
            None
        } else {
            Some(size)
        }
    }

    fn source_ranges(
        &mut self,
        path: &str,
        raw: Option<&[String]>,
        vip: Option<IpAddr>,
    ) -> Option<Vec<IpNet>> {
        let Some(raw) = raw else {
            return Some(Vec::new());
        };
        let mut out = Vec::with_capacity(raw.len());
        for (j, s) in raw.iter().enumerate() {
            let rpath = format!("{path}.source_ranges[{j}]");
            let net = match s.parse::<IpNet>() {
                Ok(net) => net,
                Err(_) => {
                    self.problem(
                        rpath,
                        format!("{s:?} is not a CIDR like \"198.51.100.0/24\""),
                    );
                    out.push(None);
                    continue;
                }
            };
            if let Some(vip) = vip {
                if family(net.addr()) != family(vip) {
                    self.problem(
                        rpath,
                        format!(
                            "{net} is {} but the vip {vip} is {}",
                            family(net.addr()),
                            family(vip)
                        ),
                    );
                    out.push(None);
                    continue;
                }
            }
            out.push(Some(net));
        }
        out.into_iter().collect()
    }

    fn affinity(&mut self, path: &str, raw: &RawAffinity) -> Option<Duration> {
        let path = format!("{path}.session_affinity.timeout");
        let d = self.duration_or(
            &path,
            raw.timeout.as_ref(),
            Service::DEFAULT_AFFINITY_TIMEOUT,
        )?;
        self.duration_in(
            &path,
            d,
            Service::MIN_AFFINITY_TIMEOUT,
            Service::MAX_AFFINITY_TIMEOUT,
        )
    }

    /// `[services.passive_health]` of a service in `mode` over `protocol` with active check
    /// `check`: absent, the default for such a service; `enabled = false`, off; otherwise on,
    /// where it can work.
    fn passive_health(
        &mut self,
        path: &str,
        raw: Option<&RawPassiveHealth>,
        mode: Mode,
        protocol: Protocol,
        check: Option<&HealthCheck>,
    ) -> Option<Option<PassiveHealth>> {
        let Some(raw) = raw else {
            return Some(PassiveHealth::default_for(mode, protocol, check));
        };
        let path = format!("{path}.passive_health");
        let failures = self.int_or(
            &format!("{path}.failures"),
            raw.failures,
            1,
            PassiveHealth::MAX_FAILURES,
            PassiveHealth::DEFAULT_FAILURES,
        );
        let window_path = format!("{path}.window");
        let window = self
            .duration_or(
                &window_path,
                raw.window.as_ref(),
                PassiveHealth::DEFAULT_WINDOW,
            )
            .and_then(|d| {
                self.duration_in(
                    &window_path,
                    d,
                    PassiveHealth::MIN_WINDOW,
                    PassiveHealth::MAX_WINDOW,
                )
            });
        if raw.enabled == Some(false) {
            return Some(None);
        }
        if let Err(why) = PassiveHealth::applies(mode, protocol, check) {
            self.problem(&path, why);
            return None;
        }
        Some(Some(PassiveHealth {
            failures: failures?,
            window: window?,
        }))
    }

    fn health_check(
        &mut self,
        path: &str,
        raw: &RawHealthCheck,
        protocol: Option<Protocol>,
    ) -> Option<HealthCheck> {
        let path = format!("{path}.health_check");
        let kind_path = format!("{path}.kind");
        let kind = match raw.kind.as_deref() {
            None => {
                self.problem(&kind_path, "is required (one of tcp, http, udp, dns)");
                None
            }
            Some(k @ ("tcp" | "http" | "udp" | "dns")) => self.health_kind(&path, k, raw),
            Some(other) => {
                self.problem(
                    &kind_path,
                    format!("{other:?} is not one of tcp, http, udp, dns"),
                );
                None
            }
        };
        let kind = kind.and_then(|k| match protocol {
            Some(p) if k.is_udp() && p != Protocol::Udp => {
                self.problem(
                    &kind_path,
                    format!(
                        "{:?} needs a UDP service (protocol = \"udp\"); this one is {p}",
                        k.as_str()
                    ),
                );
                None
            }
            _ => Some(k),
        });
        let port = match raw.port {
            None => Some(None),
            Some(p) => self.port(&format!("{path}.port"), p).map(Some),
        };
        let interval_path = format!("{path}.interval");
        let interval = self
            .duration_or(
                &interval_path,
                raw.interval.as_ref(),
                HealthCheck::DEFAULT_INTERVAL,
            )
            .and_then(|d| {
                self.duration_in(
                    &interval_path,
                    d,
                    HealthCheck::MIN_INTERVAL,
                    HealthCheck::MAX_INTERVAL,
                )
            });
        let timeout_path = format!("{path}.timeout");
        let timeout = self
            .duration_or(
                &timeout_path,
                raw.timeout.as_ref(),
                HealthCheck::DEFAULT_TIMEOUT,
            )
            .and_then(|d| self.duration_in(&timeout_path, d, Duration::ZERO, Duration::MAX));
        if let (Some(t), Some(i)) = (timeout, interval) {
            if t >= i {
                self.problem(
                    &timeout_path,
                    format!("{} is not shorter than the interval ({})", show(t), show(i)),
                );
                return None;
            }
        }
        let max = HealthCheck::MAX_RISE_FALL;
        let rise = self.int_or(
            &format!("{path}.rise"),
            raw.rise,
            1,
            max,
            HealthCheck::DEFAULT_RISE,
        );
        let fall = self.int_or(
            &format!("{path}.fall"),
            raw.fall,
            1,
            max,
            HealthCheck::DEFAULT_FALL,
        );
        Some(HealthCheck {
            kind: kind?,
            port: port?,
            interval: interval?,
            timeout: timeout?,
            rise: rise?,
            fall: fall?,
        })
    }

    /// The kind `kind` (one of the four spellings) with its own fields; a field of
    /// another kind is refused.
    fn health_kind(&mut self, path: &str, kind: &str, raw: &RawHealthCheck) -> Option<HealthKind> {
        let fields: [(&str, bool, &[&str]); 4] = [
            ("path", raw.path.is_some(), &["http"]),
            ("payload", raw.payload.is_some(), &["udp"]),
            ("expect", raw.expect.is_some(), &["udp"]),
            ("query", raw.query.is_some(), &["dns"]),
        ];
        let mut ok = true;
        for (field, set, kinds) in fields {
            if set && !kinds.contains(&kind) {
                self.problem(
                    format!("{path}.{field}"),
                    format!("only {} health checks have a {field}", kinds.join(", ")),
                );
                ok = false;
            }
        }
        if raw.qtype.is_some() && kind != "dns" {
            self.problem(
                format!("{path}.qtype"),
                "only dns health checks have a qtype",
            );
            ok = false;
        }
        let kind = match kind {
            "tcp" => Some(HealthKind::Tcp),
            "http" => self.http_path(path, raw.path.as_deref()),
            "udp" => self.udp_check(path, raw),
            _ => self.dns_check(path, raw),
        };
        kind.filter(|_| ok)
    }

    fn http_path(&mut self, path: &str, raw: Option<&str>) -> Option<HealthKind> {
        let path_path = format!("{path}.path");
        let p = raw.unwrap_or(HealthCheck::DEFAULT_HTTP_PATH);
        if !p.starts_with('/') {
            self.problem(&path_path, format!("{p:?} must start with '/'"));
            None
        } else if p.chars().any(|ch| ch.is_whitespace() || ch.is_control()) {
            self.problem(
                &path_path,
                format!("{p:?} contains whitespace or control characters"),
            );
            None
        } else {
            Some(HealthKind::Http { path: p.to_owned() })
        }
    }

    fn udp_check(&mut self, path: &str, raw: &RawHealthCheck) -> Option<HealthKind> {
        let max = HealthCheck::MAX_PAYLOAD;
        let mut bytes = |field: &str, value: Option<&String>| -> Option<Option<Vec<u8>>> {
            let Some(v) = value else {
                return Some(None);
            };
            let fpath = format!("{path}.{field}");
            if v.is_empty() {
                self.problem(fpath, "must not be empty");
                None
            } else if v.len() > max {
                self.problem(
                    fpath,
                    format!("{} bytes is longer than {max} (one datagram)", v.len()),
                );
                None
            } else {
                Some(Some(v.as_bytes().to_vec()))
            }
        };
        let payload = bytes("payload", raw.payload.as_ref());
        let expect = bytes("expect", raw.expect.as_ref());
        let payload = match payload? {
            Some(p) => p,
            None => {
                self.problem(
                    format!("{path}.payload"),
                    "is required for a udp health check (the datagram sent)",
                );
                return None;
            }
        };
        Some(HealthKind::Udp {
            payload,
            expect: expect?,
        })
    }

    fn dns_check(&mut self, path: &str, raw: &RawHealthCheck) -> Option<HealthKind> {
        let qpath = format!("{path}.query");
        let query = match raw.query.as_deref() {
            None => {
                self.problem(
                    &qpath,
                    "is required for a dns health check (the name asked for, e.g. \"health.example.org\")",
                );
                None
            }
            Some(q) => match dns_name(q) {
                Ok(n) => Some(n),
                Err(why) => {
                    self.problem(&qpath, format!("{q:?} is not a DNS name: {why}"));
                    None
                }
            },
        };
        let qtype = self.choice_or(
            &format!("{path}.qtype"),
            raw.qtype.as_ref(),
            HealthCheck::DEFAULT_QTYPE,
        );
        Some(HealthKind::Dns {
            query: query?,
            qtype: qtype?,
        })
    }

    fn backends(
        &mut self,
        path: &str,
        raw: &[RawBackend],
        vip: Option<IpAddr>,
        service_port: Option<u16>,
        mode: Option<Mode>,
    ) -> Option<Vec<Backend>> {
        let mut seen: HashMap<SocketAddr, String> = HashMap::new();
        let mut out = Vec::with_capacity(raw.len());
        for (j, b) in raw.iter().enumerate() {
            let bpath = format!("{path}.backends[{j}]");
            let backend = self.backend(&bpath, b, vip, service_port, mode);
            if let Some(backend) = &backend {
                let key = backend.socket_addr();
                if let Some(first) = seen.get(&key) {
                    self.problem(&bpath, format!("{key} is already listed at {first}"));
                    out.push(None);
                    continue;
                }
                seen.insert(key, bpath);
            }
            out.push(backend);
        }
        out.into_iter().collect()
    }

    fn backend(
        &mut self,
        path: &str,
        raw: &RawBackend,
        vip: Option<IpAddr>,
        service_port: Option<u16>,
        mode: Option<Mode>,
    ) -> Option<Backend> {
        let address_path = format!("{path}.address");
        let port_path = format!("{path}.port");
        let tunnel_path = format!("{path}.tunnel");
        let address = self
            .required(&address_path, raw.address.as_deref())
            .and_then(|s| self.station(&address_path, s));
        let port = match (raw.port, service_port) {
            // The backend port defaults to the service port: what DSR needs anyway.
            (None, Some(p)) => Some(p),
            (None, None) => None,
            (Some(p), _) => self.port(&port_path, p),
        };
        let weight = self.int_or(
            &format!("{path}.weight"),
            raw.weight,
            0,
            Backend::MAX_WEIGHT,
            Backend::DEFAULT_WEIGHT,
        );
        let mac = match &raw.mac {
            None => Some(None),
            Some(s) => match s.parse::<MacAddr>() {
                Err(e) => {
                    self.problem(format!("{path}.mac"), e.to_string());
                    None
                }
                // A next hop is one station: frames to a group address reach many or
                // none, and the all-zero address no one.
                Ok(m) if m.0[0] & 1 != 0 => {
                    self.problem(
                        format!("{path}.mac"),
                        format!("{s} is a group (multicast or broadcast) address, not a station's"),
                    );
                    None
                }
                Ok(m) if m.0 == [0; 6] => {
                    self.problem(
                        format!("{path}.mac"),
                        format!("{s} is the all-zero address"),
                    );
                    None
                }
                Ok(m) => Some(Some(m)),
            },
        };
        let tunnel = match &raw.tunnel {
            None => Some(None),
            Some(s) => self.station(&tunnel_path, s).map(Some),
        };
        let state = self.choice_or(
            &format!("{path}.state"),
            raw.state.as_ref(),
            BackendState::default(),
        );

        // Rules that relate the backend to its service.
        let mut ok = true;
        if let (Some(mode), Some(p), Some(sp)) = (mode, port, service_port) {
            if mode.is_dsr() && p != sp {
                self.problem(
                    &port_path,
                    format!("{p} differs from the service port {sp}; {mode} cannot change ports"),
                );
                ok = false;
            }
        }
        if let (Some(mode), Some(Some(_))) = (mode, tunnel) {
            if !mode.is_tunnel() {
                self.problem(
                    &tunnel_path,
                    format!("only dsr-ipip and dsr-gue backends have a tunnel target; this service is {mode}"),
                );
                ok = false;
            }
        }
        if let (Some(mode), Some(vip), Some(address), Some(tunnel)) = (mode, vip, address, tunnel) {
            if mode.is_tunnel() {
                let (target, target_path) = match tunnel {
                    Some(t) => (t, &tunnel_path),
                    None => (address, &address_path),
                };
                if vip.is_ipv6() && target.is_ipv4() {
                    self.problem(
                        target_path,
                        format!("{target} is IPv4 but the vip {vip} is IPv6: IPv6 in IPv4 is not supported"),
                    );
                    ok = false;
                }
            } else if family(address) != family(vip) {
                self.problem(
                    &address_path,
                    format!(
                        "{address} is {} but the vip {vip} is {}; {mode} cannot change the address family",
                        family(address),
                        family(vip)
                    ),
                );
                ok = false;
            }
        }
        if !ok {
            return None;
        }
        Some(Backend {
            address: address?,
            port: port?,
            weight: weight?,
            mac: mac?,
            tunnel: tunnel?,
            state: state?,
        })
    }

    // ---- rules across services -------------------------------------------------------

    fn services_unique(&mut self, services: &[Option<Service>]) {
        let mut names: HashMap<&str, usize> = HashMap::new();
        let mut frontends: HashMap<(IpAddr, u16, Protocol), usize> = HashMap::new();
        for (i, s) in services.iter().enumerate() {
            let Some(s) = s else { continue };
            if let Some(first) = names.get(s.name.as_str()) {
                self.problem(
                    format!("services[{i}].name"),
                    format!("{:?} is already used by services[{first}]", s.name),
                );
            } else {
                names.insert(&s.name, i);
            }
            let key = (s.vip, s.port, s.protocol);
            if let Some(&first) = frontends.get(&key) {
                self.problem(
                    format!("services[{i}]"),
                    format!(
                        "{}/{} is already served by services[{first}] ({:?})",
                        s.frontend(),
                        s.protocol,
                        services[first].as_ref().map_or("", |f| f.name.as_str())
                    ),
                );
            } else {
                frontends.insert(key, i);
            }
        }
    }

    fn mtu_fits_ipv6(&mut self, gateway: &Gateway, services: &[Option<Service>]) {
        if gateway.mtu >= Gateway::MIN_MTU_IPV6 {
            return;
        }
        let first = services
            .iter()
            .enumerate()
            .find_map(|(i, s)| Some((i, ipv6_part(s.as_ref()?)?)));
        if let Some((i, what)) = first {
            self.mtu_problem(gateway, i, what);
        }
    }

    fn mtu_fits_ipv6_at(&mut self, gateway: &Gateway, service: &Service, index: usize) {
        if gateway.mtu < Gateway::MIN_MTU_IPV6 {
            if let Some(what) = ipv6_part(service) {
                self.mtu_problem(gateway, index, what);
            }
        }
    }

    fn mtu_problem(&mut self, gateway: &Gateway, i: usize, what: &str) {
        self.problem(
            "gateway.mtu",
            format!(
                "{} is below {}, the IPv6 minimum link MTU (RFC 8200), and services[{i}] has {what}",
                gateway.mtu,
                Gateway::MIN_MTU_IPV6
            ),
        );
    }
}

/// What of `s` puts IPv6 packets on the gateway's links: its VIP, or in `dsr-ipip` and
/// `dsr-gue` the outer header to an IPv6 tunnel endpoint.
fn ipv6_part(s: &Service) -> Option<&'static str> {
    if s.vip.is_ipv6() {
        return Some("an IPv6 vip");
    }
    let tunnels_v6 = s.mode.is_tunnel()
        && s.backends
            .iter()
            .any(|b| b.tunnel.unwrap_or(b.address).is_ipv6());
    tunnels_v6.then_some("an IPv6 tunnel endpoint")
}

fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    }
}

/// A duration the way the file writes it (`2h 4m`, `500ms`).
fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// `name` without its trailing dot, when it is a DNS name a query can carry: labels of 1 to
/// 63 letters, digits, `-` or `_`, at most 253 characters in all (RFC 1035 section 2.3.4).
fn dns_name(name: &str) -> Result<String, &'static str> {
    let n = name.strip_suffix('.').unwrap_or(name);
    if n.is_empty() {
        return Err("it is empty");
    }
    if n.len() > 253 {
        return Err("it is longer than 253 characters");
    }
    for label in n.split('.') {
        if label.is_empty() {
            return Err("it has an empty label");
        }
        if label.len() > 63 {
            return Err("a label is longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("a label holds a character other than a-z, 0-9, '-' and '_'");
        }
    }
    Ok(n.to_owned())
}

/// A service's `slow_start` (also the `strait.dev/slow-start` annotation's value): a
/// duration of whole seconds within
/// [`Service::MIN_SLOW_START`]`..=`[`Service::MAX_SLOW_START`].
///
/// # Errors
/// Why the value is refused, without the field's path.
pub fn parse_slow_start(value: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(value).map_err(|e| {
        format!("{value:?} is not a duration like \"30s\", \"500ms\" or \"2h\" ({e})")
    })?;
    if d.subsec_nanos() != 0 {
        Err(format!(
            "{} is not whole seconds (the ramp steps once a second)",
            show(d)
        ))
    } else if d < Service::MIN_SLOW_START {
        Err(format!(
            "{} is shorter than {} (omit the field for no slow start)",
            show(d),
            show(Service::MIN_SLOW_START)
        ))
    } else if d > Service::MAX_SLOW_START {
        Err(format!(
            "{} is longer than {}",
            show(d),
            show(Service::MAX_SLOW_START)
        ))
    } else {
        Ok(d)
    }
}

/// A standard BGP community `"asn:value"`, two numbers of 0..=65535.
pub fn parse_community(c: &str) -> Option<(u16, u16)> {
    let (a, v) = c.split_once(':')?;
    Some((a.parse().ok()?, v.parse().ok()?))
}

/// A large community `"global:local1:local2"`, three numbers of 0..=4294967295.
pub fn parse_large_community(c: &str) -> Option<(u32, u32, u32)> {
    let mut parts = c.split(':');
    let t = (
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
        parts.next()?.parse().ok()?,
    );
    parts.next().is_none().then_some(t)
}
