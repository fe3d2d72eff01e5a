//! The Strait gateway's control side: everything `strait run` does around the packet path.
//!
//! ```text
//!  config file ─┐   events   ┌──────────────┐  effects  ┌─► ServiceTable snapshot ─► workers
//!  (run, SIGHUP)│  (now in)  │ core::Control│           │     (arc-swap, once per RX batch)
//!  Kubernetes ──┼──────────► │ merge, build,├──────────►├─► XDP steering maps
//!  (kube)       │  run::     │ publish; no  │  run::    ├─► VIPs on lo, gratuitous ARP / NA (vip)
//!  health ──────┤  Gateway   │ I/O          │  Gateway  ├─► health checks, next-hop probes (neigh)
//!  neighbours ──┘            └──────────────┘           └─► admin API's view
//!                         admin API (admin): /healthz /services /metrics /reload
//!               (the Kubernetes source writes Service status and Events itself)
//! ```
//!
//! | module | what it holds |
//! |---|---|
//! | [`core`] | the control core, without I/O: events in (configuration, Kubernetes, health, neighbours, time), effects out (publish, health checks, VIPs, probes) |
//! | [`run`] | the core's driver: the configuration source, the event loop, carrying out effects |
//! | [`kube`] | the Kubernetes source: watch, translation to services, address pools, status and Events |
//! | [`health`] | active TCP/HTTP health checks with rise/fall |
//! | [`neigh`] | next-hop MACs: the kernel's neighbour table and routes (rtnetlink), the next hops followed (pure), probes |
//! | [`vip`] | claiming VIPs on `lo` and announcing them (gratuitous ARP, unsolicited NA) |
//! | [`l2`] | VIP failover on one segment: the keepalived child that speaks VRRP, one owner per VIP |
//! | [`bgp`] | route announcement: the BIRD 2 child that speaks BGP (and BFD) for the VIPs the core announces |
//! | [`workers`] | starting, pinning and stopping the AF_XDP workers; their counters |
//! | [`admin`] | the admin and metrics HTTP API (`metrics`: how every family is written) |
//! | [`footprint`] | the memory a configuration takes, known before anything is allocated |
//! | [`shared`] | what the control loop, the workers and the admin API share |
//! | [`supervise`] | systemd: readiness, stopping, a watchdog fed only while every worker makes progress |
//! | [`status`] | `strait status`: the admin API's `/services` as a table |
//! | [`sync`] | flow sync with the peer gateways: the thread between the workers' sync rings and UDP |
//!
//! The lab (testbed, generators, benches) is another crate, `strait-lab`, that depends on
//! this one; nothing here knows it.

// Denied, with two exceptions: `daemon::spawn`'s `pre_exec` (a parent-death signal for the
// routing daemons), which std offers only as `unsafe`, and `heap`'s `malloc_trim`, which no
// safe crate wraps.
#![deny(unsafe_code)]

pub mod admin;
pub mod bgp;
pub mod capture;
pub mod core;
pub mod daemon;
pub mod dpdk;
pub mod footprint;
pub mod health;
pub mod heap;
pub mod kube;
pub mod l2;
mod metrics;
pub mod neigh;
pub mod run;
pub mod shared;
pub mod status;
pub mod supervise;
pub mod sync;
pub mod vip;
pub mod workers;
