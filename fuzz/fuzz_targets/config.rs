//! Arbitrary text as a configuration file: no panic, and every refusal names its field or
//! line (see `strait_fuzz::check_config`).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| strait_fuzz::check_config(data));
