//! Arbitrary frames through a pipeline over every mode: no panic, counters balanced after
//! every frame, Pass and Handoff leave the frame alone, and a frame whose checksums were
//! valid leaves with valid checksums (see `strait_fuzz::run_pipeline` for the input format).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| strait_fuzz::run_pipeline(data));
