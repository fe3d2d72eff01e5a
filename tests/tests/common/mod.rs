//! Code shared by the golden-fixture and truncation test binaries.

pub mod fixtures_list;
