//! The packet backends' receive paths on hostile input: the UDP socket backend's header
//! synthesis, GRO splitting and IPv4 identification recovery, and the AF_PACKET ring walk
//! (VLAN tags put back, UDP GSO super-frames split). Invariants: `fuzz/harness/backend_rx.rs`.
#![no_main]

#[path = "../harness/backend_rx.rs"]
mod harness;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    harness::run(data);
});
