//! The rsocket receive path against a hostile peer (`cabi/src/rsocket/fuzz.rs`).
//! Runs in a network namespace of its own: `tools/fuzz rsocket_rx RUNS [SECONDS]`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferroce_cabi::rsocket_fuzz::run(data);
});
