//! Datagram rsockets against a hostile peer (`cabi/src/rsocket/dgram/fuzz.rs`).
//! Runs in a network namespace of its own: `tools/fuzz rsocket_dgram RUNS [SECONDS]`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferroce_cabi::rsocket_dgram_fuzz::run(data);
});
