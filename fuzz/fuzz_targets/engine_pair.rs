//! The live engine under a hostile peer and a hostile network: see `fuzz/harness/engine_pair.rs`
//! for the actions and the invariants checked after each of them.
#![no_main]

#[path = "../harness/engine_pair.rs"]
mod harness;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    harness::run(data);
});
