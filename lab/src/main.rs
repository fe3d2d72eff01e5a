//! `strait-lab`: the lab's command line. It tries and measures the gateway; the gateway
//! itself is the `strait` binary (`strait run`), which knows nothing of this one.
//!
//! ```text
//! strait-lab testbed up|down [...]     namespaces, veths and HTTP backends for trying the gateway
//! strait-lab gen --iface IF --dst-mac MAC --to VIP:PORT [...]   AF_XDP traffic generator
//! strait-lab sink --iface IFACE [...]  count (and reflect probes) with an XDP program
//! strait-lab l2fwd --rx A --tx B --dst-mac MAC [...]   plain AF_XDP forwarder (`limit`)
//! strait-lab bench pipeline [--json] [--flows 1M,8M] [--batch 16,32,64] [--mode M,..]
//!                          [--traffic T,..] [--seconds S]   in-memory pipeline, one core,
//!                                      beside a bare lookup of the same flow count
//! strait-lab bench maglev [--json]     Maglev build time, balance and disruption
//! strait-lab bench control [...]       Kubernetes change to live table, p50/p99
//! strait-lab bench rule-update [--json] [--services N]   endpoint change: Strait vs iptables/nft
//! strait-lab bench line-rate [--quick] [--json FILE] [--plot FILE]   Mpps through one core:
//!                                      Strait vs kube-proxy's iptables/nftables vs limit
//! strait-lab bench failover [--gateways 3] [--streams 200] [--json F]   streams and requests
//!                                      through N gateways while one is killed, drained, restarted
//! strait-lab bench flood [--flood syn|udp|both] [--flow-capacity N] [--json F]  floods
//! strait-lab bench admin [--seconds S] [--rate R] [--json F]   forwarding under admin abuse
//! strait-lab bench churn [--minutes 10] [--via reload|kube] [--json F]   1,000 endpoint
//!                                      changes a minute under requests: failures, memory, fds
//! strait-lab bench soak [--minutes 10] [--json F]   traffic, churn and health flaps: memory,
//!                                      fds, UMEM frames, flow table, counters every 10 s
//! ```
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use strait_lab::{bench, gen, l2fwd, sink, testbed};

#[derive(Debug, Parser)]
#[command(
    name = "strait-lab",
    version,
    about = "Strait's lab: testbed, traffic generator, sink and benches (the gateway is `strait`)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
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
    /// flows (1M and 8M), all-new (SYN) and 90/10 mixed traffic, worker batches of 16, 32
    /// and 64 frames, each beside a bare lookup in a table of the same flow count.
    Pipeline(bench::pipeline::Options),
    /// Time from a Kubernetes EndpointSlice change to the new table being live, with
    /// 10,000 Services of 10 endpoints each (p50 and p99).
    Control(bench::control::Run),
    /// Rule-update latency: one endpoint change among N services (10 endpoints each), in
    /// Strait (build + swap) and in kube-proxy's iptables and nftables rules (restored into
    /// throwaway namespaces). Needs root, iptables and nftables.
    RuleUpdate {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Number of services.
        #[arg(long, default_value_t = bench::rules::DEFAULT_SERVICES)]
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
    /// Needs root, iptables, nftables and curl, and the `strait` binary beside this one.
    LineRate(bench::line::Options),
    /// Gateway failover behind a BGP/ECMP router: long-lived TCP streams and short requests
    /// through N gateways while one is killed, one drained, one restarted after a backend
    /// change, and one killed during a backend change. Needs root, bird2, and the `strait`
    /// binary beside this one.
    Failover(bench::failover::Options),
    /// A spoofed-source SYN flood and a UDP flood at the generator's full rate against one
    /// gateway, with long-lived TCP streams and new connections running: streams reset,
    /// the longest stall, the share of new connections that succeeded, flow-table numbers.
    /// Needs root and the `strait` binary beside this one.
    Flood(bench::flood::Options),
    /// Forwarding and `/healthz` while the admin API is abused (1,000 idle connections,
    /// slow clients, malformed, oversized and scrape requests), against a quiet phase in the
    /// same run. Needs root and the `strait` binary beside this one.
    Admin(bench::admin_load::Options),
    /// Endpoint churn (1,000 changes a minute by default) through SIGHUP reloads or the
    /// Kubernetes path (a fake API server), with steady requests: failed requests, whether
    /// the table generation and steering maps follow, the gateway's memory and descriptors.
    /// Needs root and the `strait` binary beside this one.
    Churn(bench::churn::Options),
    /// A long run of mixed traffic (HTTP and UDP), endpoint churn and health flaps (a
    /// backend's server killed and started again), sampled every 10 s: memory, descriptors,
    /// UMEM frames by state, flow-table entries, failures, the counters' identity. Needs
    /// root and the `strait` binary beside this one.
    Soak(bench::soak::Options),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    let result = match cli.command {
        Command::Gen(args) => gen::run(&args),
        Command::Testbed { what } => testbed::run_command(what),
        Command::Sink(args) => sink::run(&args),
        Command::L2fwd(args) => l2fwd::run(&args),
        Command::Bench { what } => match what {
            Bench::Pipeline(o) => bench::pipeline::run(&o),
            Bench::Maglev { json } => bench::maglev::run(json),
            Bench::RuleUpdate { json, services } => bench::rules::run(json, services),
            Bench::LineRate(options) => bench::line::run(&options),
            Bench::Control(r) => bench::control::run(r),
            Bench::Failover(o) => bench::failover::run(&o),
            Bench::Flood(o) => bench::flood::run(&o),
            Bench::Admin(o) => bench::admin_load::run(&o),
            Bench::Churn(o) => bench::churn::run(&o),
            Bench::Soak(o) => bench::soak::run(&o),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strait-lab: {e:#}");
            ExitCode::FAILURE
        }
    }
}
