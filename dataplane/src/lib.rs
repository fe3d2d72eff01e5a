//! Strait's packet path.
//!
//! ```text
//! frame ──► wire::parse ──► table lookup (vip, port, proto) ──► source ACL
//!                               │ no service: Pass (kernel)          │ outside: Drop(Acl)
//!                               ▼
//!                        flow::FlowTable (per core, 5-tuple)
//!                               │ miss: maglev::Table[hash % M]
//!                               ▼
//!                        rewrite (dsr-l2 | dsr-ipip | dsr-gue | nat | reply-nat)
//!                               ▼
//!                        Verdict::Tx / Pass / Drop(reason) / Handoff(core)
//! ```
//!
//! Everything here is sans-IO: functions of a snapshot, a per-core flow table, the time
//! (passed in) and a frame. The AF_XDP driver, the in-memory test driver and the benches all
//! call [`pipeline::Pipeline::process`].
//!
//! The modules import one way (`scripts/check-imports.py` holds it; the graph is in
//! docs/architecture.md, "Module graph"): `xsk` → `pipeline` → `capture`, `explain` → `sync`,
//! `rewrite`, `traffic` → `spsc`, `table`, `wire` → `maglev`, `flow` → `key`, `hint`, `stats`
//! → `hash`. Flow sync, the explain desk and capture meet the pipeline through
//! [`sync::WorkerSync`], [`explain::Desk`] and [`capture::Tap`], which know nothing of the
//! pipeline.

pub mod capture;
#[cfg(test)]
mod capture_tests;
pub mod explain;
#[cfg(test)]
mod explain_tests;
pub mod flow;
pub mod hash;
pub mod hint;
pub mod key;
pub mod maglev;
pub mod passive;
#[cfg(test)]
mod passive_tests;
pub mod pipeline;
pub mod rewrite;
pub mod spsc;
pub mod stats;
pub mod sync;
#[cfg(test)]
mod sync_tests;
pub mod table;
pub mod traffic;
#[cfg(test)]
mod traffic_tests;
pub mod wire;
#[cfg(feature = "xsk")]
pub mod xsk;

pub use key::{BackendId, FlowKey};
