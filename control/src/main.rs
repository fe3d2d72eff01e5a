//! `strait`: the Strait gateway's command line.
//!
//! ```text
//! strait run [--config FILE]          run the gateway (default: the built-in example)
//! strait status [--admin ADDR]       the running gateway's services, backends and health
//! strait testbed up|down [...]       namespaces, veths and HTTP backends for trying it out
//! strait check [--config FILE]        validate a configuration (default: the built-in example)
//! strait bench pipeline [--json]      in-memory packet pipeline, one core, per mode
//! strait bench rule-update [--json] [--services N]   endpoint change: Strait vs iptables/nft
//! strait bench maglev [--json]        Maglev build time, balance and disruption
//! strait bench line-rate [--quick] [--json FILE] [--plot FILE]   Mpps through one core:
//!                                     Strait vs kube-proxy's iptables/nftables vs limit
//! strait gen --iface IF --dst-mac MAC --to VIP:PORT [...]   AF_XDP traffic generator
//! strait sink --iface IFACE [...]     count (and reflect probes) with an XDP program
//! strait l2fwd --rx A --tx B --dst-mac MAC [...]   plain AF_XDP forwarder (`limit`)
//! ```
#![forbid(unsafe_code)]

mod admin;
mod backend_server;
mod bench_control;
mod bench_line;
mod bench_maglev;
mod bench_pipeline;
mod bench_rules;
mod gen;
mod health;
mod kube;
mod l2fwd;
mod neigh;
mod peers;
mod run;
mod shared;
mod sink;
mod status;
mod testbed;
mod vip;
mod workers;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// workers; SIGHUP or `POST /reload` reloads the configuration, SIGINT/SIGTERM stop.
    Run {
        /// The TOML file (default: the built-in annotated example, the testbed's setup).
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        kube: kube::Args,
    },
    /// Show the running gateway's services and backends (from its admin API).
    Status {
        /// The admin API address (`gateway.admin_listen`).
        #[arg(long, default_value = "127.0.0.1:9900")]
        admin: std::net::SocketAddr,
    },
    /// Validate a configuration: print every problem with its field path, or a summary.
    Check {
        /// The TOML file (default: the built-in annotated example).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Network-namespace testbed: a client, the gateway and backends on this machine.
    Testbed {
        #[command(subcommand)]
        what: testbed::Command,
    },
    /// AF_XDP traffic generator: UDP, TCP SYN or established TCP to VIPs, N flows or every
    /// packet a new one, at a rate or as fast as possible, with latency probes.
    Gen(Box<gen::Args>),
    /// Measure parts of the gateway on this machine.
    Bench {
        #[command(subcommand)]
        what: Bench,
    },
    /// Count the frames arriving on an interface with an XDP program (and reflect latency
    /// probes): the line-rate benchmark's receiver.
    Sink(sink::Args),
    /// Plain AF_XDP forwarder that only rewrites MACs: the line-rate benchmark's `limit`.
    L2fwd(l2fwd::Args),
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// The in-memory packet pipeline on one core: 1,000 services, every mode, established
    /// flows (1M) and all-new (SYN) traffic.
    Pipeline {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Time from a Kubernetes EndpointSlice change to the new table being live, with
    /// 10,000 Services of 10 endpoints each (p50 and p99).
    Control(bench_control::Run),
    /// Rule-update latency: one endpoint change among N services (10 endpoints each), in
    /// Strait (build + swap) and in kube-proxy's iptables and nftables rules (restored into
    /// throwaway namespaces). Needs root, iptables and nftables.
    RuleUpdate {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Number of services.
        #[arg(long, default_value_t = bench_rules::DEFAULT_SERVICES)]
        services: usize,
    },
    /// Maglev table build time, balance and disruption with 1,000 backends.
    Maglev {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Line rate through one forwarding core on a three-namespace veth testbed: Strait
    /// (dsr-l2, nat), kube-proxy's iptables and nftables rules (10, 1,000, 10,000
    /// services) and a bare AF_XDP forwarder (limit), new-flow and established UDP traffic.
    /// Needs root, iptables, nftables and curl.
    LineRate(bench_line::Options),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    let result = match cli.command {
        Command::Status { admin } => status::run(admin),
        Command::Gen(args) => gen::run(&args),
        Command::Testbed { what } => testbed::run_command(what),
        Command::Run { config, kube } => run::run(
            config.map_or(run::Source::Builtin, run::Source::File),
            &kube,
        ),
        Command::Check { config } => return check(config),
        Command::Sink(args) => sink::run(&args),
        Command::L2fwd(args) => l2fwd::run(&args),
        Command::Bench {
            what: Bench::Pipeline { json },
        } => bench_pipeline::run(json),
        Command::Bench {
            what: Bench::Maglev { json },
        } => bench_maglev::run(json),
        Command::Bench {
            what: Bench::RuleUpdate { json, services },
        } => bench_rules::run(json, services),
        Command::Bench {
            what: Bench::LineRate(options),
        } => bench_line::run(&options),
        Command::Bench {
            what: Bench::Control(r),
        } => bench_control::run(r),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strait: {e:#}");
            ExitCode::FAILURE
        }
    }
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
            println!("{name}: valid");
            print!("{}", strait_config::summary(&cfg));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{name}: invalid");
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
