//! What Strait's tests share, in one place for every crate's tests:
//!
//! - [`bird`]: BIRD's own parser as the judge of a configuration a test wrote;
//! - [`config`]: gateway configurations as TOML text, built from the parts a test varies;
//! - [`privileged`]: the gate of the privileged tests (root and the tools a test drives;
//!   a loud SKIPPED banner with `STRAIT_SKIP_PRIVILEGED=1`, a panic otherwise);
//! - [`harness`]: commands with errors that name them, network namespaces and veths removed
//!   on drop, processes killed (by pid) on drop, polling with a deadline, captures read
//!   with tshark, the workspace's binaries;
//! - [`frames`]: what frame-building tests share on top of etherparse (the TCP flags byte);
//! - [`fake_api`] and [`objects`]: a fake Kubernetes API server speaking the real
//!   list/watch wire format, and the objects the tests give it;
//! - [`alloc`]: a global allocator that counts a thread's allocations (the proof that a loop
//!   allocates nothing), which a test file installs;
//! - [`packet_socket`]: a raw `AF_PACKET` socket to send and capture whole Ethernet frames.
//!
//! A test helper crate, not part of the product: only dev-dependencies name it. `unsafe` is
//! denied except in `alloc` and `packet_socket` (unsafe islands, listed with the others in
//! docs/architecture.md).

#![deny(unsafe_code)]

pub mod alloc;
pub mod bird;
pub mod config;
pub mod fake_api;
pub mod frames;
pub mod harness;
pub mod objects;
pub mod packet_socket;
pub mod privileged;
