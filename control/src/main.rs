//! `strait`: the gateway's command line, the only binary an appliance runs.
//!
//! ```text
//! strait run [--config FILE] [--kube ...]   run the gateway (default: the built-in example)
//! strait status [--admin ADDR] [--stats|--rate]  services, backends, health, traffic, routes
//! strait drain [--admin ADDR]               withdraw every route, forward for the grace, stop
//! strait explain CLIENT:PORT VIP:PORT       where that flow goes and why (--proto, --json)
//! strait check [--config FILE]              validate a configuration (default: the built-in example)
//! strait capture [FILTER] -w FILE           what the workers do with matching frames, as pcapng
//! ```
//!
//! Everything else (the testbed, the traffic generator, the sink, the benches) is the lab's
//! binary, `strait-lab`, which depends on this crate and never the other way round.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use strait_control::{capture, explain, kube, manual, run, status};

#[derive(Debug, Parser)]
#[command(
    name = "strait",
    version,
    about = "Strait: a kernel-bypass load balancer for Kubernetes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway: build the table, start health checks, the admin API and the
    /// workers; SIGHUP or `POST /reload` reloads the configuration; SIGINT/SIGTERM (or
    /// `strait drain`) drain: routes withdrawn, forwarding for `drain_grace`, then stop
    /// (a second signal stops at once).
    Run {
        /// The TOML file (default: the built-in annotated example, the testbed's setup).
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        kube: kube::Args,
    },
    /// Show the running gateway's services, backends, health transitions, traffic per
    /// service, flow-table occupancy, routes and BGP sessions (from its admin API).
    Status {
        #[command(flatten)]
        admin: AdminArgs,
        /// Totals per service and backend since the start: new flows, flows, packets and
        /// bytes in and out (as `ipvsadm -L -n --stats`).
        #[arg(long, conflicts_with = "rate")]
        stats: bool,
        /// The same per second, over `--interval` (as `ipvsadm -L -n --rate`).
        #[arg(long)]
        rate: bool,
        /// How far apart the two samples a rate is measured from are.
        #[arg(long, default_value = "1s", value_parser = status::positive_duration)]
        interval: std::time::Duration,
    },
    /// Drain the running gateway: withdraw every route, keep forwarding for
    /// `gateway.drain_grace` while routers move traffic away, then stop (as SIGTERM does).
    /// Waits until it stopped.
    Drain {
        #[command(flatten)]
        admin: AdminArgs,
        /// How long to wait for the gateway to stop.
        #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
        wait: std::time::Duration,
    },
    /// Capture what the running gateway's workers do with matching frames, as pcapng: each
    /// frame as received and, if sent, as sent, with its verdict in the packet comment
    /// ("in core=0 port=eth0 verdict=tx service=web mode=dsr-l2", "out verdict=tx ...
    /// backend=198.51.100.12:80 ...", "... verdict=drop reason=ipv4_header_checksum").
    /// Stops at --count or --duration, or on Ctrl-C; the gateway disarms the capture however
    /// it ends. Example: `strait capture --vip 203.0.113.10 -c 10 -w - | tshark -r -`.
    Capture {
        #[command(flatten)]
        admin: AdminArgs,
        #[command(flatten)]
        ask: capture::Ask,
        /// Where to write the pcapng: a file, or `-` for standard output.
        #[arg(short = 'w', long = "write")]
        write: PathBuf,
    },
    /// Explain where a flow goes and why: the frontend it matches (or why none), the source
    /// ranges' verdict, the flow entry of the core that owns it (or the backend a new
    /// connection gets now, and why), and the rewrite. A nat reply's 5-tuple (backend to
    /// client) is explained as the reply of its flow. Asks the running gateway.
    Explain {
        /// The client's address and port (IPv6 as `[2001:db8::2]:40000`); for a nat reply,
        /// the backend's.
        #[arg(value_name = "CLIENT_ADDR:PORT")]
        client: String,
        /// The VIP and port; for a nat reply, the client's address and port.
        #[arg(value_name = "VIP:PORT")]
        vip: String,
        /// The transport protocol.
        #[arg(long, default_value = "tcp", value_parser = ["tcp", "udp", "sctp"])]
        proto: String,
        /// Print the admin API's JSON instead of the block for a person.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Validate a configuration: print every problem with its field path, or a summary.
    Check {
        /// The TOML file (default: the built-in annotated example).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

/// Where the running gateway's admin API is.
#[derive(Debug, clap::Args)]
struct AdminArgs {
    /// The admin API address (`gateway.admin_listen`).
    #[arg(long, default_value = "127.0.0.1:9900")]
    admin: std::net::SocketAddr,
    /// The admin API's Unix socket (`gateway.admin_socket`), used instead of `--admin`.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// A file with the admin token (`gateway.admin_token_file`), for a gateway whose
    /// `--admin` is not loopback.
    #[arg(long)]
    token_file: Option<PathBuf>,
}

impl AdminArgs {
    fn admin(self) -> status::Admin {
        status::Admin {
            addr: self.admin,
            socket: self.socket,
            token_file: self.token_file,
        }
    }
}

fn main() -> ExitCode {
    // `Cli` plus the hidden `generate-docs DIR`, which writes this command line's man pages
    // and completions for the package (strait_control::manual).
    let matches = manual::with_generator(Cli::command()).get_matches();
    if let Some(dir) = manual::requested(&matches) {
        return match manual::write(Cli::command(), &dir) {
            Ok(files) => {
                files.iter().for_each(|f| println!("{}", f.display()));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("strait: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    let result = match cli.command {
        Command::Status {
            admin,
            stats,
            rate,
            interval,
        } => status::run(
            &admin.admin(),
            status::Show {
                stats,
                rate,
                interval,
            },
        ),
        Command::Drain { admin, wait } => status::drain(&admin.admin(), wait),
        Command::Explain {
            client,
            vip,
            proto,
            json,
            admin,
        } => explain::check_socket("client", &client)
            .and_then(|_| explain::check_socket("vip", &vip))
            .and_then(|_| status::explain(&admin.admin(), &client, &vip, &proto, json)),
        Command::Run { config, kube } => run::run(
            config.map_or(run::ConfigSource::Builtin, run::ConfigSource::File),
            &kube,
        ),
        Command::Check { config } => return check(config),
        Command::Capture { admin, ask, write } => capture(&admin.admin(), &ask, &write),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strait: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `strait capture`: the capture until the gateway ends it or Ctrl-C (SIGINT, SIGTERM) ends
/// the client, which then closes its connection (the gateway disarms).
fn capture(admin: &status::Admin, ask: &capture::Ask, out: &std::path::Path) -> anyhow::Result<()> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, std::sync::Arc::clone(&stop))?;
    }
    let frames = capture::run(admin, ask, out, &stop)?;
    eprintln!(
        "strait capture: {frames} frames written to {}",
        out.display()
    );
    Ok(())
}

/// `strait check`: exit 0 with a summary for a valid file; exit 1 listing every problem.
fn check(path: Option<PathBuf>) -> ExitCode {
    let (name, loaded) = match &path {
        Some(p) => (p.display().to_string(), strait_config::load(p)),
        None => (
            "built-in example".to_string(),
            strait_config::parse(strait_config::EXAMPLE),
        ),
    };
    match loaded {
        Ok(cfg) => {
            if let Some(why) = strait_control::dpdk::unsupported(&cfg) {
                eprintln!("{name}: cannot run in this build");
                eprintln!("{why}");
                return ExitCode::FAILURE;
            }
            let footprint = strait_control::footprint::Footprint::of(&cfg);
            let text = format!(
                "{name}: valid\n{}memory: {:.1} MiB ({footprint})\n",
                strait_config::summary(&cfg),
                footprint.total() as f64 / (1024.0 * 1024.0)
            );
            match status::out(&text) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("strait: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            eprintln!("{name}: invalid");
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
