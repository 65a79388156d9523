//! The backends' receive-path fuzz harness (`fuzz/harness/backend_rx.rs`, issue 17) on stable:
//! a seeded batch of random inputs (the CI smoke run). The long runs are
//! `tools/fuzz backend_rx RUNS`.

#[path = "../fuzz/harness/backend_rx.rs"]
#[allow(dead_code)]
mod harness;

use ferroce::rng::SplitMix64;

/// The inputs the fuzzer found (`fuzz/regressions/backend_rx/`), each kept once fixed.
#[test]
fn regressions_found_by_the_fuzzer_stay_fixed() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/regressions/backend_rx");
    let mut n = 0;
    for e in std::fs::read_dir(dir).expect("fuzz/regressions/backend_rx") {
        let p = e.unwrap().path();
        let data = std::fs::read(&p).unwrap();
        if std::panic::catch_unwind(|| harness::run(&data)).is_err() {
            panic!("{} fails again", p.display());
        }
        n += 1;
    }
    assert!(n >= 1, "no regression inputs in {dir}");
}

#[test]
fn random_datagrams_and_ring_blocks_keep_the_invariants() {
    let mut rng = SplitMix64::new(0x17_bac4);
    let mut total = harness::Stats::default();
    // More with BACKEND_RX_RUNS=N (a longer run on stable; the figures in docs/security.md).
    let runs: u32 = std::env::var("BACKEND_RX_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4000);
    for i in 0..runs {
        let len = 8 + (rng.next_u64() % 700) as usize;
        let mut data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        // Every path in turn: UDP raw/valid over IPv4, IPv6, the AF_PACKET ring.
        data[0] = (data[0] & !3) | (i % 4) as u8;
        match std::panic::catch_unwind(|| harness::run(&data)) {
            Ok(s) => {
                total.udp_frames += s.udp_frames;
                total.udp_dropped += s.udp_dropped;
                total.udp_verified += s.udp_verified;
                total.udp_icrc_good += s.udp_icrc_good;
                total.gro_segments += s.gro_segments;
                total.ring_frames += s.ring_frames;
                total.ring_segments += s.ring_segments;
                total.ring_errors += s.ring_errors;
            }
            Err(_) => {
                let p = std::env::temp_dir().join("backend_rx-failure.bin");
                let _ = std::fs::write(&p, &data);
                panic!("input kept in {}", p.display());
            }
        }
    }
    eprintln!("{total:?}");
    // The batch reaches every path: frames synthesised and verified, GRO runs split, ring
    // frames and super-frame segments handed up, bad blocks counted.
    assert!(
        total.udp_frames > 1000
            && total.udp_verified > 60
            && total.udp_icrc_good > 60
            && total.udp_dropped > 100
            && total.gro_segments > 100
            && total.ring_frames > 100
            && total.ring_segments > 100
            && total.ring_errors > 50,
        "{total:?}"
    );
}
