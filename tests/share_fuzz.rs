//! The shared port's receive-path fuzz harness (`fuzz/harness/share_rx.rs`, issue 17) on
//! stable: a seeded batch of random inputs over real sockets (two devices sharing 127.0.0.1
//! and one UDP port). The long runs are `tools/fuzz share_rx RUNS`.

#[path = "../fuzz/harness/share_rx.rs"]
#[allow(dead_code)]
mod harness;

use ferroce::rng::SplitMix64;

#[test]
fn random_datagrams_and_batches_keep_the_invariants() {
    let mut rng = SplitMix64::new(0x5_4a7e);
    let mut total = harness::Stats::default();
    let runs: u32 = std::env::var("SHARE_RX_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    for _ in 0..runs {
        let len = 2 + (rng.next_u64() % 400) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let s = harness::run(&data);
        total.udp_datagrams += s.udp_datagrams;
        total.udp_to_a_block += s.udp_to_a_block;
        total.batches += s.batches;
        total.batch_frames += s.batch_frames;
        total.raw_datagrams += s.raw_datagrams;
        total.refused += s.refused;
        total.forwarded += s.forwarded;
    }
    eprintln!("{total:?}");
    // Every path was taken: datagrams to a's block, frames passed on to b (or from b to a,
    // whichever socket the kernel picked), batches, refused bytes.
    assert!(total.udp_datagrams > 500, "{total:?}");
    assert!(total.udp_to_a_block > 50, "{total:?}");
    assert!(total.forwarded > 50, "{total:?}");
    assert!(total.batch_frames > 200, "{total:?}");
    assert!(total.refused > 50, "{total:?}");
}

/// The inputs the fuzzer found (`fuzz/regressions/share_rx/`), each kept once fixed.
#[test]
fn regressions_found_by_the_fuzzer_stay_fixed() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/regressions/share_rx");
    for e in std::fs::read_dir(dir).expect("fuzz/regressions/share_rx") {
        let p = e.unwrap().path();
        let data = std::fs::read(&p).unwrap();
        if std::panic::catch_unwind(|| harness::run(&data)).is_err() {
            panic!("{} fails again", p.display());
        }
    }
}

/// A CM request to QP1 for a service nobody claims: held by the device the kernel gave it to,
/// then handed up there once (the harness waits for it).
#[test]
fn a_cm_request_for_an_unclaimed_service_comes_out_once() {
    // op 0 (a UDP datagram), its QPN left as the input says; length 4 * 20 + 0 = 80 bytes:
    // BTH (UD SEND_ONLY to QP1), DETH, then the MAD's first 60 bytes (class 7, REQ).
    let mut p = vec![0u8; 80];
    p[0] = 0x64;
    p[7] = 1;
    p[20 + 1] = 7;
    p[20 + 17] = 0x10;
    let mut data = vec![0x0c, 20];
    data.extend_from_slice(&p);
    let s = harness::run(&data);
    assert_eq!(s.udp_datagrams, 1);
}
