//! The Strait gateway's control side: everything `strait run` does around the packet path.
//!
//! ```text
//!  config file ─┐                        ┌─► ServiceTable snapshot ─► workers (AF_XDP)
//!  (run, SIGHUP)│                        │     (arc-swap, once per RX batch)
//!  Kubernetes ──┼─► run::Control ────────┼─► XDP steering maps
//!  (kube)       │   merge, build,        ├─► VIPs on lo, gratuitous ARP / NA (vip)
//!  health ──────┤   publish              ├─► next-hop probes (neigh)
//!  neighbours ──┘                        └─► Service status, Events (kube)
//!                         admin API (admin): /healthz /services /metrics /reload
//! ```
//!
//! | module | what it holds |
//! |---|---|
//! | [`run`] | the control loop: sources, the merged configuration, building and publishing tables |
//! | [`kube`] | the Kubernetes source: watch, translation to services, address pools, status and Events |
//! | [`health`] | active TCP/HTTP health checks with rise/fall |
//! | [`neigh`] | next-hop MACs from the kernel's neighbour table and routes (rtnetlink) |
//! | [`vip`] | claiming VIPs on `lo` and announcing them (gratuitous ARP, unsolicited NA) |
//! | [`workers`] | starting, pinning and stopping the AF_XDP workers; their counters |
//! | [`admin`] | the admin and metrics HTTP API (`metrics`: how every family is written) |
//! | [`footprint`] | the memory a configuration takes, known before anything is allocated |
//! | [`shared`] | what the control loop, the workers and the admin API share |
//! | [`status`] | `strait status`: the admin API's `/services` as a table |
//!
//! The lab (testbed, generators, benches) is another crate, `strait-lab`, that depends on
//! this one; nothing here knows it.

#![forbid(unsafe_code)]

pub mod admin;
pub mod footprint;
pub mod health;
pub mod kube;
mod metrics;
pub mod neigh;
pub mod run;
pub mod shared;
pub mod status;
pub mod vip;
pub mod workers;
