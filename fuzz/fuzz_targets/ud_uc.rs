//! The UD and UC receive paths (QPs on an SRQ and on their own queues) under a hostile peer
//! and network: see `fuzz/harness/ud_uc.rs` for the actions and the invariants checked.
#![no_main]

#[path = "../harness/ud_uc.rs"]
mod harness;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    harness::run(data);
});
