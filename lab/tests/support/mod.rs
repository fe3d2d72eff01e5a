//! What the lab's integration tests share: the workspace's test kit (`strait-testkit`:
//! the privileged gate, the harness, the configuration builder, the fake Kubernetes API
//! server) and the testbed of
//! `strait-lab testbed up` with a gateway in it ([`bed`]).

// Every test binary compiles all of it and uses a part.
#![allow(dead_code, unused_imports)]

pub mod bed;
pub mod capture;
pub mod e2e;

pub use strait_testkit::{config, fake_api, objects, privileged};

/// The test kit's harness, and the lab binary under test.
pub mod harness {
    pub use strait_testkit::harness::*;

    /// The lab binary under test (`strait-lab`); the gateway is [`strait`].
    pub const LAB: &str = env!("CARGO_BIN_EXE_strait-lab");
}
