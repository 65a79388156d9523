//! The shared port's receive paths (`ferroce::io::share`) on hostile input: UDP datagrams of
//! any payload and Unix datagrams of any bytes on a slot's socket. Invariants:
//! `fuzz/harness/share_rx.rs`.
#![no_main]

#[path = "../harness/share_rx.rs"]
mod harness;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    harness::run(data);
});
