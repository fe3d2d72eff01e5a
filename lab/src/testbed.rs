//! `strait-lab testbed up|down`: a client, the gateway and backends in network namespaces on
//! one machine, with the gateway configuration that matches them.
//!
//! ```text
//! up(opts) ── plan::Layout ── ip netns add / ip -n NS link|addr|route / sysctl / ethtool
//!    │                         (every command inside a namespace of its own; see plan.rs)
//!    ├── config::render ── strait_config::parse ── /run/strait/{prefix}/strait.toml
//!    └── per backend: ip netns exec {prefix}-bN strait-lab testbed serve ...   (pids recorded)
//!
//! down(prefix) ── kill the recorded pids ── ip netns del {prefix}-* ── rm /run/strait/{prefix}
//! ```
//!
//! Safety of the host comes first: the testbed never adds an address, route or link to the
//! namespace it is started from (each veth is created with its peer directly in the other
//! namespace), uses documentation addresses only, and removes what it made also when a
//! step fails half-way ([`Testbed`] cleans up on drop). `down` removes only the namespaces
//! named `{prefix}-client`, `-gw`, `-gwN`, `-rt`, `-sw`, `-bN` and kills only processes it recorded whose
//! start time still matches, so a recycled pid is left alone.
//!
//! `--gateways N` (2 to 4) and `--l2` build the layouts of `fleet.rs` instead: N gateway
//! namespaces `{prefix}-gw1..N`, each with a configuration of its own
//! (`/run/strait/{prefix}/gwN.toml`), behind a router namespace `{prefix}-rt` that runs BIRD
//! 2 (BGP to every gateway, the VIP as a kernel multipath route), or on the client's
//! segment; with `--ipv6`, dual stack. The router's BIRD is a recorded server like the
//! backends, so `down` ends it.
//!
//! The backends are real processes (`strait-lab testbed serve`, see `backend_server`) rather
//! than threads: a thread cannot enter another network namespace without `setns`, which
//! would be this crate's first unsafe code, and a process per backend can be killed on
//! its own to test failover.

mod config;
mod fleet;
mod plan;

use std::fmt;
use std::fs;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;
use strait_config::BackendState;

use crate::vdev::Vdev;

pub use config::SYNC_PORT;
pub use fleet::{
    GatewaySpec, GATEWAY_ASN, ROUTER_ASN, ROUTER_BACKEND4, ROUTER_BACKEND6, ROUTER_CLIENT4,
    ROUTER_CLIENT6,
};
pub use plan::{
    owns, valid_prefix, BackendSpec, Front, Layout, GW_MAC, HTTP_PORT, MAX_BACKENDS, MAX_GATEWAYS,
    NAT_PORT, NAT_UDP_PORT, VIP4, VIP6,
};

/// The router's tc program (`bpf/rehash.bpf.c`): it clears the socket hash a packet brings
/// from the client's TCP stack, so the router's multipath choice hashes the headers.
static REHASH_OBJECT: &strait_dataplane::xsk::Aligned<[u8]> =
    strait_dataplane::embedded_object!("rehash");
/// How long the router's BIRD may take to open its control socket.
const ROUTER_READY_TIMEOUT: Duration = Duration::from_secs(5);

/// Where testbeds keep their state: `{RUN_DIR}/{prefix}/` holds the generated
/// configuration (by default), the backend pids and the backend logs.
pub const RUN_DIR: &str = "/run/strait";
/// Where `ip netns add` mounts namespaces (iproute2's `NETNS_RUN_DIR`).
const NETNS_DIR: &str = "/run/netns";
/// How long a backend server may take to bind its sockets. It binds in well under 10 ms;
/// five seconds covers a loaded CI machine without making a broken start hang a test.
const SERVER_READY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `down` waits for killed servers to exit before deleting their namespaces.
const EXIT_TIMEOUT: Duration = Duration::from_secs(2);
/// Poll interval while waiting for a server to become ready or to exit.
const POLL: Duration = Duration::from_millis(10);

/// The gateway's port driver on the testbed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PortDriver {
    /// AF_XDP on the gateway's veths.
    #[default]
    AfXdp,
    /// DPDK ports on the veths (`net_af_packet` or `net_af_xdp`), a TAP each for the kernel.
    Dpdk,
}

/// How the gateway is wired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Topology {
    /// One L2 segment (a bridge) for client, gateway and backends; `dsr-l2` services.
    #[default]
    OneArm,
    /// Client and backends on two segments with the gateway between; `nat` services.
    TwoArm,
}

/// What to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opts {
    /// Backend namespaces, 1 ..= [`MAX_BACKENDS`]. Default 4.
    pub backends: usize,
    /// Default [`Topology::OneArm`].
    pub topology: Topology,
    /// Start of every namespace name; see [`valid_prefix`]. Default `strait`.
    pub prefix: String,
    /// Where to write the gateway configuration. Default `/run/strait/{prefix}/strait.toml`.
    pub config_path: Option<PathBuf>,
    /// The `strait` binary the backends run (`strait-lab testbed serve`). Default: the
    /// running executable.
    pub server_binary: Option<PathBuf>,
    /// Gateway namespaces, 1 ..= [`MAX_GATEWAYS`]. Default 1: the layout as it always was.
    /// More: a router namespace with BGP and ECMP in front of them (see `fleet`).
    pub gateways: usize,
    /// The gateways on the client segment, no router (see `fleet`).
    pub l2: bool,
    /// The gateway's ports are DPDK ports on this vdev (see `plan`'s "DPDK" section).
    pub dpdk: Option<Vdev>,
    /// Queues of each of the gateway's veths, 1 ..= [`plan::MAX_QUEUES`], and so its
    /// workers per interface. Default 1.
    pub queues: u16,
    /// The layouts with several gateways are dual stack: IPv6 addresses, an IPv6 BGP session
    /// per gateway, the IPv6 VIP's service and flow sync over IPv6 (see `fleet`). The
    /// one-gateway layouts have IPv6 whenever the kernel has it. Default false.
    pub ipv6: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            backends: 4,
            topology: Topology::OneArm,
            prefix: "strait".to_owned(),
            config_path: None,
            server_binary: None,
            gateways: 1,
            l2: false,
            dpdk: None,
            queues: 1,
            ipv6: false,
        }
    }
}

/// Why the testbed could not be built or removed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The prefix is not 1 to 32 bytes of `[a-z0-9-]`.
    Prefix(String),
    /// The backend count is 0 or more than [`MAX_BACKENDS`].
    Backends(usize),
    /// The gateway count is 0 or more than [`MAX_GATEWAYS`].
    Gateways(usize),
    /// Options that do not go together.
    Options(&'static str),
    /// Namespaces of this prefix exist already.
    Exists {
        /// The prefix asked for.
        prefix: String,
        /// Its namespaces found.
        namespaces: Vec<String>,
    },
    /// A command could not be started at all.
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        source: io::Error,
    },
    /// A command ran and failed.
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// What it wrote to stderr, trimmed.
        stderr: String,
    },
    /// A file or directory operation failed.
    Io {
        /// What was being done.
        action: &'static str,
        /// On what.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A backend server did not come up.
    Server {
        /// Backend name (`b1`).
        name: String,
        /// What happened.
        detail: String,
        /// Its log file.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },
    /// The generated configuration does not pass `strait_config::parse`: a bug here.
    Config(String),
    /// `down` met several failures; every step was still tried.
    Cleanup(Vec<Error>),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Prefix(p) => write!(
                f,
                "testbed prefix {p:?} must be 1 to {} characters of a-z, 0-9 and '-', not starting with '-'",
                plan::MAX_PREFIX
            ),
            Error::Backends(n) => {
                write!(f, "{n} backends: the testbed has 1 to {MAX_BACKENDS}")
            }
            Error::Gateways(n) => {
                write!(f, "{n} gateways: the testbed has 1 to {MAX_GATEWAYS}")
            }
            Error::Options(why) => f.write_str(why),
            Error::Exists { prefix, namespaces } => write!(
                f,
                "testbed {prefix:?} exists already ({}); remove it with `strait-lab testbed down --prefix {prefix}`",
                namespaces.join(", ")
            ),
            Error::Spawn { command, source } => {
                write!(f, "cannot run `{command}`: {source}")?;
                if source.kind() == io::ErrorKind::NotFound {
                    write!(f, " (is it installed? the testbed needs iproute2, procps and ethtool)")?;
                }
                Ok(())
            }
            Error::Failed {
                command,
                status,
                stderr,
            } => {
                write!(f, "`{command}` failed ({status})")?;
                if !stderr.is_empty() {
                    write!(f, ": {stderr}")?;
                }
                Ok(())
            }
            Error::Io {
                action,
                path,
                source,
            } => write!(f, "cannot {action} {}: {source}", path.display()),
            Error::Server {
                name,
                detail,
                log,
                tail,
            } => write!(
                f,
                "backend server {name} {detail} (log {}):\n{tail}",
                log.display()
            ),
            Error::Config(problems) => write!(
                f,
                "the generated gateway configuration is invalid (a testbed bug):\n{problems}"
            ),
            Error::Cleanup(errors) => {
                write!(f, "testbed cleanup failed:")?;
                for e in errors {
                    write!(f, "\n  {e}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Spawn { source, .. } | Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A backend of a running testbed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackendInfo {
    /// `b1`, `b2`, ...
    pub name: String,
    /// `{prefix}-b1`, ...
    pub namespace: String,
    /// Its address on the backend segment.
    pub ipv4: Ipv4Addr,
    /// Its IPv6 address, if the kernel has IPv6.
    pub ipv6: Option<Ipv6Addr>,
    /// Its MAC, as in the generated configuration.
    pub mac: String,
    /// Pid of its server process.
    pub pid: u32,
    /// The TCP and UDP addresses its server answers on.
    pub tcp: Vec<SocketAddr>,
    /// The UDP addresses.
    pub udp: Vec<SocketAddr>,
}

/// A gateway of a running testbed: where to start `strait run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GatewayInfo {
    /// `gw` (the single gateway) or `gw1` ..= `gw4`.
    pub name: String,
    /// `{prefix}-{name}`.
    pub namespace: String,
    /// Its generated configuration.
    pub config: PathBuf,
    /// Its address on the client side (its BGP router id in the router layout).
    pub client_address: Ipv4Addr,
    /// Its address on the backend segment.
    pub backend_address: Ipv4Addr,
    /// Its BGP peer, the router's end of its link (router layout only).
    pub peer: Option<Ipv4Addr>,
    /// Its IPv6 address on the client side, if the layout has IPv6.
    pub client_address6: Option<Ipv6Addr>,
    /// Its IPv6 address on the backend segment, if the layout has IPv6.
    pub backend_address6: Option<Ipv6Addr>,
    /// Its IPv6 BGP peer (router layout with IPv6).
    pub peer6: Option<Ipv6Addr>,
    /// The MAC of its interfaces.
    pub mac: String,
    /// Its admin API, inside its namespace.
    pub admin: SocketAddr,
}

/// The router of the router layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouterInfo {
    /// `{prefix}-rt`.
    pub namespace: String,
    /// Its BIRD's control socket (`birdc -s SOCKET show route`).
    pub socket: PathBuf,
    /// Its BIRD's configuration.
    pub config: PathBuf,
    /// Pid of its BIRD.
    pub pid: u32,
}

/// What `strait-lab testbed up --json` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The namespace prefix.
    pub prefix: String,
    /// One or two arms.
    pub topology: Topology,
    /// The generated gateway configuration.
    pub config: PathBuf,
    /// `{prefix}-client`.
    pub client_namespace: String,
    /// `{prefix}-gw`.
    pub gateway_namespace: String,
    /// The gateway's data interfaces.
    pub gateway_interfaces: Vec<String>,
    /// The IPv4 VIP.
    pub vip4: Ipv4Addr,
    /// The IPv6 VIP, if the kernel has IPv6.
    pub vip6: Option<Ipv6Addr>,
    /// The backends.
    pub backends: Vec<BackendInfo>,
    /// The gateways: one (`config` and `gateway_namespace` above) or several.
    pub gateways: Vec<GatewayInfo>,
    /// The router, when there are several gateways behind one.
    pub router: Option<RouterInfo>,
}

/// A running testbed. Dropping it tears it down (servers killed, namespaces deleted,
/// failures printed to stderr), also while a test panics; [`Testbed::detach`] leaves it
/// running instead, for [`down`] to remove later.
#[derive(Debug)]
pub struct Testbed {
    layout: Layout,
    config_path: PathBuf,
    backends: Vec<BackendInfo>,
    gateways: Vec<GatewayInfo>,
    router: Option<RouterInfo>,
    servers: Vec<Child>,
    armed: bool,
}

impl Testbed {
    /// The namespace prefix.
    pub fn prefix(&self) -> &str {
        &self.layout.prefix
    }

    /// One or two arms.
    pub fn topology(&self) -> Topology {
        self.layout.topology
    }

    /// `{prefix}-client`.
    pub fn client_namespace(&self) -> String {
        self.layout.client_ns()
    }

    /// `{prefix}-gw` (`{prefix}-gw1` when there are several).
    pub fn gateway_namespace(&self) -> String {
        self.layout.gateway(1).namespace
    }

    /// The backends, in order.
    pub fn backends(&self) -> &[BackendInfo] {
        &self.backends
    }

    /// The generated gateway configuration (of the first gateway, when there are several).
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// The gateways, in order.
    pub fn gateways(&self) -> &[GatewayInfo] {
        &self.gateways
    }

    /// The router, when there is one.
    pub fn router(&self) -> Option<&RouterInfo> {
        self.router.as_ref()
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Everything above, serializable.
    pub fn summary(&self) -> Summary {
        Summary {
            prefix: self.layout.prefix.clone(),
            topology: self.layout.topology,
            config: self.config_path().to_owned(),
            client_namespace: self.client_namespace(),
            gateway_namespace: self.gateway_namespace(),
            gateway_interfaces: self
                .layout
                .gateway_interfaces()
                .iter()
                .map(|(n, _)| (*n).to_owned())
                .collect(),
            vip4: VIP4,
            vip6: self.layout.ipv6.then_some(VIP6),
            backends: self.backends().to_vec(),
            gateways: self.gateways.clone(),
            router: self.router.clone(),
        }
    }

    /// What is where and how to start the gateways, for people.
    pub fn instructions(&self) -> String {
        if self.layout.front() != Front::Direct {
            return self.fleet_instructions();
        }
        let exe = std::env::current_exe()
            .map_or_else(|_| "strait-lab".to_owned(), |p| p.display().to_string());
        let strait = crate::strait_binary()
            .map_or_else(|_| "strait".to_owned(), |p| p.display().to_string());
        let prefix = self.prefix();
        let arms = match self.topology() {
            Topology::OneArm => "one-arm, dsr-l2",
            Topology::TwoArm => "two-arm, nat",
        };
        format!(
            "testbed {prefix:?} is up ({arms}, {n} backends)\n{layout}\
             gateway configuration: {config}\n\
             start the gateway:     ip netns exec {gw} {strait} run --config {config}\n\
             try it:                ip netns exec {client} curl -s http://{VIP4}/\n\
             tear down:             {exe} testbed down --prefix {prefix}\n",
            n = self.backends.len(),
            layout = self.layout.describe(),
            config = self.config_path.display(),
            gw = self.gateway_namespace(),
            client = self.client_namespace(),
        )
    }

    fn fleet_instructions(&self) -> String {
        let exe = std::env::current_exe()
            .map_or_else(|_| "strait-lab".to_owned(), |p| p.display().to_string());
        let strait = crate::strait_binary()
            .map_or_else(|_| "strait".to_owned(), |p| p.display().to_string());
        let prefix = self.prefix();
        let how = match self.layout.front() {
            Front::L2 => "gateways on the client segment, no router; dsr-l2",
            _ => "a BGP/ECMP router in front; dsr-l2",
        };
        let mut s = format!(
            "testbed {prefix:?} is up ({n} gateways, {how}, {m} backends)\n{layout}",
            n = self.gateways.len(),
            m = self.backends.len(),
            layout = self.layout.describe(),
        );
        for g in &self.gateways {
            s.push_str(&format!(
                "start {}:  ip netns exec {} {strait} run --config {}\n",
                g.name,
                g.namespace,
                g.config.display()
            ));
        }
        if let Some(r) = &self.router {
            s.push_str(&format!(
                "the router's routes:  ip -n {} route show {VIP4}; birdc -s {} show protocols\n",
                r.namespace,
                r.socket.display()
            ));
            if self.layout.ipv6 {
                s.push_str(&format!(
                    "                      ip -n {} -6 route show {VIP6}\n",
                    r.namespace
                ));
            }
        }
        s.push_str(&format!(
            "try it:       ip netns exec {client} curl -s http://{VIP4}/\n",
            client = self.client_namespace(),
        ));
        if self.layout.ipv6 {
            s.push_str(&format!(
                "              ip netns exec {client} curl -s http://[{VIP6}]/\n",
                client = self.client_namespace(),
            ));
        }
        s.push_str(&format!(
            "tear down:    {exe} testbed down --prefix {prefix}\n"
        ));
        s
    }

    /// Leaves the testbed running (for `strait-lab testbed up`); `down(prefix)` removes it
    /// later. Returns the prefix.
    pub fn detach(mut self) -> String {
        self.armed = false;
        self.servers.clear(); // dropping a Child neither kills nor waits
        self.layout.prefix.clone()
    }

    fn kill_servers(&mut self) {
        for mut child in self.servers.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.kill_servers();
        if let Err(e) = down(&self.layout.prefix) {
            eprintln!("strait-lab testbed: {e}");
        }
    }
}

/// Builds the testbed: namespaces, links, addresses, routes, backend servers and the
/// gateway configuration.
///
/// # Errors
///
/// A bad prefix or backend count; namespaces of the prefix exist already; a command or
/// file operation failed (everything made so far is removed again); a server did not
/// start.
pub fn up(opts: &Opts) -> Result<Testbed, Error> {
    if !valid_prefix(&opts.prefix) {
        return Err(Error::Prefix(opts.prefix.clone()));
    }
    if opts.backends == 0 || opts.backends > MAX_BACKENDS {
        return Err(Error::Backends(opts.backends));
    }
    if opts.gateways == 0 || opts.gateways > MAX_GATEWAYS {
        return Err(Error::Gateways(opts.gateways));
    }
    let fleet = opts.gateways > 1 || opts.l2;
    if fleet && opts.topology != Topology::OneArm {
        return Err(Error::Options(
            "several gateways (or --l2) run dsr-l2 on the one-arm backend segment: leave out --topology two-arm",
        ));
    }
    if fleet && opts.dpdk.is_some() {
        return Err(Error::Options(
            "--driver dpdk builds the one-gateway layouts only: leave out --gateways and --l2",
        ));
    }
    if opts.queues == 0 || opts.queues > plan::MAX_QUEUES {
        return Err(Error::Options(
            "--queues: the gateway's veths have 1 to 4 queues",
        ));
    }
    if opts.queues > 1 && (fleet || opts.dpdk.is_some()) {
        return Err(Error::Options(
            "--queues builds the one-gateway AF_XDP layouts only: leave out --gateways, --l2 and --driver dpdk",
        ));
    }
    if fleet && opts.config_path.is_some() {
        return Err(Error::Options(
            "--config names one file; with several gateways (or --l2) each configuration goes to /run/strait/PREFIX/gwN.toml",
        ));
    }
    let kernel_ipv6 = Path::new("/proc/sys/net/ipv6").exists();
    if fleet && opts.ipv6 && !kernel_ipv6 {
        return Err(Error::Options(
            "--ipv6: this kernel has no IPv6 (/proc/sys/net/ipv6 is missing)",
        ));
    }
    let existing = namespaces_of(&opts.prefix)?;
    if !existing.is_empty() {
        return Err(Error::Exists {
            prefix: opts.prefix.clone(),
            namespaces: existing,
        });
    }
    let exe = match &opts.server_binary {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(|source| Error::Io {
            action: "find the running executable",
            path: PathBuf::from("/proc/self/exe"),
            source,
        })?,
    };
    let layout = Layout {
        prefix: opts.prefix.clone(),
        topology: opts.topology,
        backends: opts.backends,
        ipv6: kernel_ipv6 && (!fleet || opts.ipv6),
        gateways: opts.gateways,
        l2: opts.l2,
        dpdk: opts.dpdk,
        queues: opts.queues,
    };
    let dir = run_dir(&layout.prefix);
    let config_path = opts.config_path.clone().unwrap_or_else(|| {
        if fleet {
            dir.join("gw1.toml")
        } else {
            dir.join("strait.toml")
        }
    });

    // From here on, a failure drops `testbed`, which removes whatever exists.
    let mut testbed = Testbed {
        layout,
        config_path,
        backends: Vec::new(),
        gateways: Vec::new(),
        router: None,
        servers: Vec::new(),
        armed: true,
    };
    let layout = testbed.layout.clone();
    fs::create_dir_all(&dir).map_err(|source| Error::Io {
        action: "create",
        path: dir.clone(),
        source,
    })?;
    write(&dir.join("pids"), "")?;
    for args in layout.commands() {
        run("ip", &args)?;
    }

    if fleet {
        let specs: Vec<(BackendSpec, BackendState)> = layout
            .backend_specs()
            .into_iter()
            .map(|b| (b, BackendState::Active))
            .collect();
        for g in layout.gateway_specs() {
            let path = dir.join(format!("{}.toml", g.name));
            let text = config::render_gateway(&layout, &g, &specs, true, &path);
            strait_config::parse(&text).map_err(|e| Error::Config(e.to_string()))?;
            write(&path, &text)?;
            testbed.gateways.push(gateway_info(&g, path));
        }
    } else {
        let text = config::render(&layout, &testbed.config_path);
        strait_config::parse(&text).map_err(|e| Error::Config(e.to_string()))?;
        if let Some(parent) = testbed.config_path.parent() {
            fs::create_dir_all(parent).map_err(|source| Error::Io {
                action: "create",
                path: parent.to_owned(),
                source,
            })?;
        }
        write(&testbed.config_path, &text)?;
        testbed.gateways.push(gateway_info(
            &layout.gateway(1),
            testbed.config_path.clone(),
        ));
    }
    if layout.front() == Front::Router {
        let (child, info) = start_router(&layout, &dir)?;
        testbed.servers.push(child);
        append(&dir.join("pids"), &pid_line(info.pid, "router"))?;
        testbed.router = Some(info);
    }

    let specs = layout.backend_specs();
    for b in &specs {
        let (child, info) = start_server(&layout, &exe, b, &dir)?;
        testbed.servers.push(child);
        append(&dir.join("pids"), &pid_line(info.pid, &info.name))?;
        testbed.backends.push(info);
    }
    let routers = usize::from(testbed.router.is_some());
    for (b, child) in specs.iter().zip(&mut testbed.servers[routers..]) {
        wait_ready(&b.name, child, &dir.join(format!("{}.log", b.name)))?;
    }
    Ok(testbed)
}

/// The configuration of gateway `i` (1-based) of `layout` (several gateways), to be written
/// to `path`: every backend, those named in `draining` (`b1`, ...) with `state =
/// "draining"` (what the failover bench writes to change the backend set), and flow sync
/// with the other gateways if `sync`.
pub fn gateway_config(
    layout: &Layout,
    i: usize,
    draining: &[&str],
    sync: bool,
    path: &Path,
) -> String {
    let specs: Vec<(BackendSpec, BackendState)> = layout
        .backend_specs()
        .into_iter()
        .map(|b| {
            let state = if draining.contains(&b.name.as_str()) {
                BackendState::Draining
            } else {
                BackendState::Active
            };
            (b, state)
        })
        .collect();
    config::render_gateway(layout, &layout.gateway(i), &specs, sync, path)
}

fn gateway_info(g: &GatewaySpec, config: PathBuf) -> GatewayInfo {
    GatewayInfo {
        name: g.name.clone(),
        namespace: g.namespace.clone(),
        config,
        client_address: g.client,
        backend_address: g.backend,
        peer: g.peer,
        client_address6: g.client6,
        backend_address6: g.backend6,
        peer6: g.peer6,
        mac: g.mac.to_string(),
        admin: SocketAddr::from(([127, 0, 0, 1], 9900)),
    }
}

/// The router of the router layout: the hash reset on its client-facing veth (tc), then
/// BIRD with one session per gateway, in the foreground as a recorded server process.
fn start_router(layout: &Layout, dir: &Path) -> Result<(Child, RouterInfo), Error> {
    let ns = layout.router_ns();
    let object = dir.join("rehash.bpf.o");
    fs::write(&object, &REHASH_OBJECT.0).map_err(|source| Error::Io {
        action: "write",
        path: object.clone(),
        source,
    })?;
    let dev = fleet::ROUTER_CLIENT_IF;
    let tc = |args: &str| {
        let mut v = vec!["-n".to_owned(), ns.clone()];
        v.extend(args.split_whitespace().map(str::to_owned));
        run("tc", &v)
    };
    tc(&format!("qdisc add dev {dev} clsact"))?;
    tc(&format!(
        "filter add dev {dev} ingress bpf direct-action obj {} sec tc",
        object.display()
    ))?;

    let config = dir.join("router.conf");
    let socket = dir.join("router.ctl");
    write(&config, &layout.router_config())?;
    let log_path = dir.join("router.log");
    let io_err = |source| Error::Io {
        action: "create",
        path: log_path.clone(),
        source,
    };
    let log = fs::File::create(&log_path).map_err(io_err)?;
    let log2 = log.try_clone().map_err(io_err)?;
    let mut cmd = Process::new("ip");
    cmd.args(["netns", "exec", &ns, "bird", "-f", "-c"])
        .arg(&config)
        .arg("-s")
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .process_group(0);
    let mut child = cmd.spawn().map_err(|source| Error::Spawn {
        command: format!("ip netns exec {ns} bird -f -c {}", config.display()),
        source,
    })?;
    let deadline = Instant::now() + ROUTER_READY_TIMEOUT;
    while strait_control::bgp::bird::BirdSocket::connect(&socket).is_err() {
        let failed = |detail: String| Error::Server {
            name: "router".to_owned(),
            detail,
            log: log_path.clone(),
            tail: tail(&log_path),
        };
        if let Ok(Some(status)) = child.try_wait() {
            return Err(failed(format!(
                "(bird) exited ({status}); is bird2 installed?"
            )));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(failed("(bird) opened no control socket".to_owned()));
        }
        thread::sleep(POLL);
    }
    let info = RouterInfo {
        namespace: ns,
        socket,
        config,
        pid: child.id(),
    };
    Ok((child, info))
}

fn start_server(
    layout: &Layout,
    exe: &Path,
    b: &plan::BackendSpec,
    dir: &Path,
) -> Result<(Child, BackendInfo), Error> {
    let log_path = dir.join(format!("{}.log", b.name));
    let io_err = |source| Error::Io {
        action: "create",
        path: log_path.clone(),
        source,
    };
    let log = fs::File::create(&log_path).map_err(io_err)?;
    let log2 = log.try_clone().map_err(io_err)?;
    let args = layout.server_args(b);
    let mut cmd = Process::new("ip");
    cmd.args(["netns", "exec", &b.namespace])
        .arg(exe)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        // Its own process group: a Ctrl-C meant for `strait-lab testbed up` must not take
        // the backends down with it; `down` ends them.
        .process_group(0);
    let child = cmd.spawn().map_err(|source| Error::Spawn {
        command: format!(
            "ip netns exec {} {} {}",
            b.namespace,
            exe.display(),
            args.join(" ")
        ),
        source,
    })?;
    let (tcp, udp) = layout.server_addrs(b);
    let info = BackendInfo {
        name: b.name.clone(),
        namespace: b.namespace.clone(),
        ipv4: b.ipv4,
        ipv6: b.ipv6,
        mac: b.mac.to_string(),
        pid: child.id(),
        tcp,
        udp,
    };
    Ok((child, info))
}

/// Waits for the server's `ready` line in its log.
fn wait_ready(name: &str, child: &mut Child, log: &Path) -> Result<(), Error> {
    let deadline = Instant::now() + SERVER_READY_TIMEOUT;
    let failed = |detail: String| Error::Server {
        name: name.to_owned(),
        detail,
        log: log.to_owned(),
        tail: tail(log),
    };
    loop {
        if fs::read_to_string(log).is_ok_and(|t| t.contains(" ready: ")) {
            return Ok(());
        }
        match child.try_wait() {
            Ok(Some(status)) => return Err(failed(format!("exited ({status})"))),
            Ok(None) => {}
            Err(e) => return Err(failed(format!("cannot be waited for: {e}"))),
        }
        if Instant::now() >= deadline {
            return Err(failed(format!(
                "was not ready after {} s",
                SERVER_READY_TIMEOUT.as_secs()
            )));
        }
        thread::sleep(POLL);
    }
}

/// The last lines of a log, for error messages.
fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// What [`down`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    /// Namespaces deleted.
    pub namespaces: Vec<String>,
    /// Recorded server pids that were alive and got SIGKILL.
    pub killed: Vec<u32>,
    /// Processes found still inside a namespace when it was deleted (not started by the
    /// testbed, so not killed; the namespace lives on, unnamed, until they exit).
    pub strangers: Vec<(String, u32)>,
}

/// Removes the testbed `prefix`: kills its recorded servers, deletes its namespaces (with
/// them every veth and the bridge), removes `/run/strait/{prefix}`. Removes nothing else;
/// succeeds when there is nothing to remove.
///
/// # Errors
///
/// A bad prefix, or [`Error::Cleanup`] listing every step that failed (the others were
/// still done).
pub fn down(prefix: &str) -> Result<Removed, Error> {
    if !valid_prefix(prefix) {
        return Err(Error::Prefix(prefix.to_owned()));
    }
    let mut removed = Removed::default();
    let mut errors = Vec::new();
    let dir = run_dir(prefix);

    let recorded = fs::read_to_string(dir.join("pids")).unwrap_or_default();
    for (pid, start) in recorded.lines().filter_map(parse_pid_line) {
        if start_time(pid) != Some(start) {
            continue; // exited, or the pid now belongs to someone else
        }
        match run("kill", &["-KILL".to_owned(), pid.to_string()]) {
            Ok(_) => removed.killed.push(pid),
            Err(e) if start_time(pid).is_none() => drop(e), // exited meanwhile
            Err(e) => errors.push(e),
        }
    }
    let deadline = Instant::now() + EXIT_TIMEOUT;
    while removed.killed.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        thread::sleep(POLL);
    }

    match namespaces_of(prefix) {
        Ok(names) => {
            for ns in names {
                if let Ok(pids) = run("ip", &["netns".into(), "pids".into(), ns.clone()]) {
                    removed.strangers.extend(
                        pids.split_whitespace()
                            .filter_map(|p| p.parse().ok())
                            .filter(|&p| alive(p))
                            .map(|p| (ns.clone(), p)),
                    );
                }
                match run("ip", &["netns".into(), "del".into(), ns.clone()]) {
                    Ok(_) => removed.namespaces.push(ns),
                    Err(e) => errors.push(e),
                }
            }
        }
        Err(e) => errors.push(e),
    }

    match fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => errors.push(Error::Io {
            action: "remove",
            path: dir,
            source: e,
        }),
        _ => {}
    }
    if errors.is_empty() {
        Ok(removed)
    } else {
        Err(Error::Cleanup(errors))
    }
}

/// `/run/strait/{prefix}`.
pub fn run_dir(prefix: &str) -> PathBuf {
    Path::new(RUN_DIR).join(prefix)
}

/// The namespaces of testbed `prefix` that exist now, sorted.
fn namespaces_of(prefix: &str) -> Result<Vec<String>, Error> {
    let entries = match fs::read_dir(NETNS_DIR) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(Error::Io {
                action: "list",
                path: NETNS_DIR.into(),
                source,
            })
        }
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| owns(prefix, n))
        .collect();
    names.sort();
    Ok(names)
}

/// Runs `program args`, returning its stdout.
fn run(program: &str, args: &[String]) -> Result<String, Error> {
    let command = || format!("{program} {}", args.join(" "));
    let out = Process::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| Error::Spawn {
            command: command(),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::Failed {
            command: command(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn write(path: &Path, text: &str) -> Result<(), Error> {
    fs::write(path, text).map_err(|source| Error::Io {
        action: "write",
        path: path.to_owned(),
        source,
    })
}

fn append(path: &Path, line: &str) -> Result<(), Error> {
    use std::io::Write as _;
    fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(line.as_bytes()))
        .map_err(|source| Error::Io {
            action: "append to",
            path: path.to_owned(),
            source,
        })
}

/// Records `pid` (a process started in testbed `prefix`, such as a gateway) with the
/// testbed's servers, so `down` ends it too if whoever started it could not (a Ctrl-C).
///
/// # Errors
/// The testbed's pid file cannot be appended to.
pub fn record_pid(prefix: &str, pid: u32, name: &str) -> Result<(), Error> {
    append(&run_dir(prefix).join("pids"), &pid_line(pid, name))
}

/// `"{pid} {start time} {name}\n"`: the start time tells a recycled pid from ours.
fn pid_line(pid: u32, name: &str) -> String {
    format!("{pid} {} {name}\n", start_time(pid).unwrap_or(0))
}

fn parse_pid_line(line: &str) -> Option<(u32, u64)> {
    let mut parts = line.split_whitespace();
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Field 22 of `/proc/{pid}/stat` (start time in clock ticks after boot); `None` if the
/// process is gone.
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces; count after it.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Whether `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// `strait-lab testbed ...`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Build the testbed: namespaces, veths, addresses, backend servers, and the matching
    /// gateway configuration. Needs root, iproute2, procps (sysctl, kill) and ethtool.
    Up {
        /// Backend namespaces, 1 to 200.
        #[arg(long, default_value_t = 4)]
        backends: usize,
        /// one-arm (a bridge, dsr-l2) or two-arm (client and backend segments, nat).
        #[arg(long, value_enum, default_value_t = Topology::OneArm)]
        topology: Topology,
        /// Start of every namespace name.
        #[arg(long, visible_alias = "name", default_value = "strait")]
        prefix: String,
        /// Where to write the gateway configuration (default /run/strait/PREFIX/strait.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Gateway namespaces, 1 to 4. More than one: a router namespace (BIRD, BGP, ECMP)
        /// between the client and the gateways, each with its own configuration.
        #[arg(long, default_value_t = 1)]
        gateways: usize,
        /// The gateways share the client segment (no router), for L2 failover.
        #[arg(long)]
        l2: bool,
        /// The gateway's port driver: af-xdp (its interfaces are veths), or dpdk (each veth
        /// becomes the wire of a DPDK port, `--vdev`, the kernel sees the port through a TAP
        /// of the interface's name, and EAL runs without hugepages).
        #[arg(long, value_enum, default_value_t = PortDriver::AfXdp)]
        driver: PortDriver,
        /// With `--driver dpdk`: the PMD of the gateway's ports.
        #[arg(long, value_enum, default_value_t = Vdev::AfPacket)]
        vdev: Vdev,
        /// Queues of each of the gateway's veths, 1 to 4: the gateway runs a worker per
        /// queue, and the veth before it spreads flows over them by their hash, as a NIC's
        /// RSS does (one-gateway AF_XDP layouts).
        #[arg(long, default_value_t = 1)]
        queues: u16,
        /// With --gateways or --l2: dual stack, the IPv6 VIP announced over an IPv6 BGP
        /// session per gateway (or elected with VRRPv3) and flow sync over IPv6. The
        /// one-gateway layouts have IPv6 whenever the kernel has it.
        #[arg(long)]
        ipv6: bool,
        /// Print a JSON description instead of instructions.
        #[arg(long)]
        json: bool,
    },
    /// Remove the testbed: kill its servers, delete its namespaces and /run/strait/PREFIX.
    Down {
        /// The prefix given to `up`.
        #[arg(long, visible_alias = "name", default_value = "strait")]
        prefix: String,
    },
    /// Run a backend server (started by `up` inside each backend namespace).
    #[command(hide = true)]
    Serve {
        /// Backend name, echoed in every answer.
        #[arg(long)]
        name: String,
        /// TCP address to serve HTTP on (repeatable; default [::]:80 and [::]:8080).
        #[arg(long)]
        tcp: Vec<SocketAddr>,
        /// UDP address to echo on (repeatable; default [::]:5353).
        #[arg(long)]
        udp: Vec<SocketAddr>,
    },
}

/// Runs a `strait-lab testbed` subcommand.
///
/// # Errors
///
/// Whatever [`up`], [`down`] or the server report.
pub fn run_command(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Up {
            backends,
            topology,
            prefix,
            config,
            gateways,
            l2,
            driver,
            vdev,
            queues,
            ipv6,
            json,
        } => {
            let testbed = up(&Opts {
                backends,
                topology,
                prefix,
                config_path: config,
                server_binary: None,
                gateways,
                l2,
                dpdk: (driver == PortDriver::Dpdk).then_some(vdev),
                queues,
                ipv6,
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&testbed.summary())?);
            } else {
                print!("{}", testbed.instructions());
            }
            testbed.detach();
        }
        Command::Down { prefix } => {
            let removed = down(&prefix)?;
            for (ns, pid) in &removed.strangers {
                eprintln!(
                    "strait-lab testbed: warning: process {pid} (not started by the testbed) was still in {ns}; \
                     the namespace lives on until it exits"
                );
            }
            println!(
                "testbed {prefix:?}: removed {} namespaces, killed {} servers",
                removed.namespaces.len(),
                removed.killed.len()
            );
        }
        Command::Serve { name, tcp, udp } => crate::backend_server::serve(&name, &tcp, &udp)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_options_are_refused_before_anything_runs() {
        let e = up(&Opts {
            prefix: "a/b".into(),
            ..Opts::default()
        })
        .unwrap_err();
        assert!(
            e.to_string().starts_with("testbed prefix \"a/b\" must be"),
            "{e}"
        );
        let e = up(&Opts {
            backends: 0,
            prefix: "st-unit-none".into(),
            ..Opts::default()
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "0 backends: the testbed has 1 to 200");
        assert!(matches!(down("../etc"), Err(Error::Prefix(_))));
    }

    #[test]
    fn down_of_nothing_succeeds() {
        // A prefix no testbed uses; touches nothing (no namespace of it, no run dir).
        let removed = down("st-unit-nothing-here").unwrap();
        assert_eq!(removed, Removed::default());
    }

    #[test]
    fn failed_commands_name_command_and_stderr() {
        let e = run("sh", &["-c".into(), "echo oops >&2; exit 3".into()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`sh -c echo oops >&2; exit 3` failed (exit status: 3): oops"
        );
        let e = run("strait-no-such-program", &[]).unwrap_err();
        assert!(e.to_string().contains("is it installed?"), "{e}");
    }

    #[test]
    fn pid_records_survive_a_round_trip() {
        let me = std::process::id();
        let line = pid_line(me, "b1");
        let (pid, start) = parse_pid_line(&line).unwrap();
        assert_eq!(pid, me);
        assert_eq!(Some(start), start_time(me));
        assert!(alive(me));
        assert_eq!(parse_pid_line("garbage"), None);
    }
}
