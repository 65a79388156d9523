//! The UD/UC receive-path fuzz harness (`fuzz/harness/ud_uc.rs`, issue 17) on stable: a seeded
//! batch of random inputs, the CI smoke (`UD_UC_RUNS=N` runs more). The coverage-guided runs
//! are `tools/fuzz ud_uc RUNS [SECONDS]`.

#[path = "../fuzz/harness/ud_uc.rs"]
#[allow(dead_code)]
mod harness;

use ferroce::rng::SplitMix64;

#[test]
fn random_ud_uc_traffic_and_forgeries_keep_the_invariants() {
    let runs: u64 = std::env::var("UD_UC_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let mut rng = SplitMix64::new(0x17_0dc0);
    let mut total = harness::Stats::default();
    for _ in 0..runs {
        let len = 16 + (rng.next_u64() % 1200) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        match std::panic::catch_unwind(|| harness::run_stats(&data)) {
            Ok(s) => total.add(&s),
            Err(_) => {
                let p = std::env::temp_dir().join("ud_uc-failure.bin");
                let _ = std::fs::write(&p, &data);
                panic!("input kept in {}", p.display());
            }
        }
    }
    eprintln!("{total:?}");
    // The batch reaches the receive paths: forged and mutated frames, messages received,
    // probes through the UD QP at the end.
    assert!(
        total.forged > runs && total.mutated > runs / 10 && total.received > runs / 2,
        "{total:?}"
    );
    assert!(total.probes > runs / 4, "{total:?}");
}

/// `UD_UC_REPLAY=FILE`: run one kept input (with `UD_UC_TRACE=1` to see every step).
#[test]
fn replay_a_kept_input() {
    if let Some(p) = std::env::var_os("UD_UC_REPLAY") {
        harness::run(&std::fs::read(p).expect("UD_UC_REPLAY"));
    }
}
