//! The IB CM state machine fed arbitrary and mutated MADs between two live CMs. Invariants:
//! `fuzz/harness/cm_mad.rs`.
#![no_main]

#[path = "../harness/cm_mad.rs"]
mod harness;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    harness::run(data);
});
