//! The Strait gateway's control side: everything `strait run` does around the packet path.
//!
//! ```text
//!  config file ─┐   events   ┌──────────────┐  effects  ┌─► ServiceTable snapshot ─► workers
//!  (run, SIGHUP)│  (now in)  │ core::Control│           │     (arc-swap, once per RX batch)
//!  Kubernetes ──┼──────────► │ merge, build,├──────────►├─► XDP steering maps
//!  (kube)       │  run::     │ publish; no  │  run::    ├─► VIPs on lo, gratuitous ARP / NA (vip)
//!  health ──────┤  Gateway   │ I/O          │  Gateway  ├─► health checks, next-hop probes (neigh)
//!  neighbours ──┘            └──────────────┘           └─► admin API's view
//!                         admin API (admin): /healthz /services /traffic /metrics /reload
//!               (the Kubernetes source writes Service status and Events itself)
//! ```
//!
//! The modules import one way, top to bottom; `scripts/check-imports.py` (run by
//! `scripts/test.sh`) fails on any circle. Each line imports only from lines below it:
//!
//! ```text
//!  main.rs (the `strait` binary) ─► run      the driver: event loop, effects carried out
//!                                ─► status   `strait status`, a client of the admin API
//!  admin ─ workers                           the admin API; starting the workers
//!  capture                                   `POST /capture`'s stream and `strait capture`
//!  explain                                   `GET /explain`: asks the workers' desks
//!  shared                                    the admin API's view, composed of the drivers'
//!  kube health neigh vip bgp l2 sync         the drivers: each does its I/O and owns the
//!  supervise dpdk footprint heap daemon        view of its own state (status, stats)
//!  core                                      the state machine: events in, effects out
//!  kubemodel                                 the Kubernetes model, pure
//!  cores ─► metrics                          the workers' counters; the family encoder
//!  strait_config, strait_dataplane           (crates)
//! ```
//!
//! `core` imports only `kubemodel` (and the configuration and the dataplane), so "the core
//! does no I/O" is held by the compiler: it cannot name a socket-owning module. Its own
//! vocabulary (events, effects, [`core::BackendKey`], [`core::Neighbours`],
//! [`core::Route`]) lives in it and the drivers import it from there.
//!
//! | module | what it holds |
//! |---|---|
//! | [`core`] | the control core, without I/O: events in (configuration, Kubernetes, health, neighbours, time), effects out (publish, health checks, VIPs, probes); next hops followed (`core::hops`) |
//! | [`kubemodel`] | the Kubernetes model, pure: translation to services, address planning, the reconcile round, Event texts, publications and their merge into the file's services |
//! | [`run`] | the core's driver: the configuration source, the event loop, carrying out effects |
//! | [`kube`] | the Kubernetes source's I/O: watch, the Lease, status and Event writes, its counters |
//! | [`health`] | active TCP/HTTP health checks with rise/fall |
//! | [`neigh`] | next-hop MACs: the kernel's neighbour table and routes (rtnetlink), probes |
//! | [`vip`] | claiming VIPs on `lo` and announcing them (gratuitous ARP, unsolicited NA) |
//! | [`l2`] | VIP failover on one segment: the keepalived child that speaks VRRP, one owner per VIP |
//! | [`bgp`] | route announcement: the BIRD 2 child that speaks BGP (and BFD) for the VIPs the core announces |
//! | [`daemon`] | starting and supervising the routing daemons' child processes |
//! | [`workers`] | starting, pinning and stopping the AF_XDP (or DPDK) workers |
//! | [`cores`] | what each worker publishes of itself: counters, heartbeat, the UMEM family |
//! | [`dpdk`] | the DPDK ports, when the gateway runs on DPDK |
//! | [`admin`] | the admin and metrics HTTP API (`metrics`: how every family is written) |
//! | [`capture`] | `strait capture`: the admin API's pcapng stream of the workers' capture rings, and its client |
//! | [`explain`] | `GET /explain` and `strait explain`: where a flow goes and why, from the snapshot and the owning workers' flow tables |
//! | [`shared`] | the admin API's view: the table, the configuration, and each driver's view of its state |
//! | [`footprint`] | the memory a configuration takes, known before anything is allocated |
//! | [`heap`] | giving freed heap back to the kernel (`malloc_trim`) |
//! | [`supervise`] | systemd: readiness, stopping, a watchdog fed only while every worker makes progress |
//! | [`status`] | `strait status`: the admin API's `/services` as a table |
//! | [`manual`] | the man pages and shell completions of the command line, for the package |
//! | [`sync`] | flow sync with the peer gateways: the thread between the workers' sync rings and UDP |
//! | [`traffic`] | packets and bytes per service and backend, flows per service, summed over the workers |
//!
//! The lab (testbed, generators, benches) is another crate, `strait-lab`, that depends on
//! this one; nothing here knows it.

// Denied, with two exceptions (listed with the workspace's other unsafe islands in
// docs/architecture.md, "Unsafe islands"): `daemon::spawn`'s `pre_exec` (a parent-death
// signal for the routing daemons), which std offers only as `unsafe`, and `heap`'s
// `malloc_trim`, which no safe crate wraps.
#![deny(unsafe_code)]

pub mod admin;
pub mod bgp;
pub mod capture;
pub mod core;
pub mod cores;
pub mod daemon;
pub mod dpdk;
pub mod explain;
pub mod footprint;
pub mod health;
pub mod heap;
pub mod kube;
pub mod kubemodel;
pub mod l2;
pub mod manual;
mod metrics;
pub mod neigh;
pub mod passive;
pub mod run;
pub mod shared;
pub mod status;
pub mod supervise;
pub mod sync;
pub mod traffic;
pub mod vip;
pub mod workers;
