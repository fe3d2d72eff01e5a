//! What the integration tests share. Each test file declares `mod support;` and uses what
//! it needs of it:
//!
//! - [`privileged`]: the gate of the privileged tests and the tools they drive (a file may
//!   also include it alone, `#[path = "support/privileged.rs"] mod gate;`);
//! - [`harness`]: commands, namespaces, veths, processes, polling, captures;
//! - [`bed`]: the testbed of `strait testbed up` and a gateway in it;
//! - [`fake_api`] and [`objects`]: a fake Kubernetes API server and the objects it serves.

// Every test binary compiles all of it and uses a part.
#![allow(dead_code)]

pub mod bed;
pub mod fake_api;
pub mod harness;
pub mod objects;
pub mod privileged;
