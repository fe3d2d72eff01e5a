//! Shared helpers for Strait's cross-crate tests.
