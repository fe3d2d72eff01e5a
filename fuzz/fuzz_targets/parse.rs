//! Arbitrary bytes into the one-pass parser: it must not panic, and whatever it returns must
//! describe the bytes it was given (see `strait_fuzz::check_parse`).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| strait_fuzz::check_parse(data));
