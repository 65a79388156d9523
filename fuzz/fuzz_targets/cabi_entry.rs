//! The C entry points of the cabi crate with untrusted values (`cabi/src/entry_fuzz.rs`).
//! Runs in a network namespace of its own: `tools/fuzz cabi_entry RUNS [SECONDS]`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferroce_cabi::entry_fuzz::run(data);
});
