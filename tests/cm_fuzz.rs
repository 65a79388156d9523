//! The CM fuzz harness (`fuzz/harness/cm_mad.rs`, issue 17) on stable: a seeded batch of
//! random action sequences (the CI smoke run). The long runs are `tools/fuzz cm_mad RUNS`.

#[path = "../fuzz/harness/cm_mad.rs"]
#[allow(dead_code)]
mod harness;

use ferroce::rng::SplitMix64;

#[test]
fn random_mads_and_api_calls_keep_the_invariants() {
    let mut rng = SplitMix64::new(0x17_c3ad);
    let mut total = harness::Stats::default();
    // More with CM_MAD_RUNS=N (a longer run on stable; the figures in docs/security.md).
    let runs: u32 = std::env::var("CM_MAD_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    for _ in 0..runs {
        let len = 16 + (rng.next_u64() % 1500) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        match std::panic::catch_unwind(|| harness::run(&data)) {
            Ok(s) => {
                total.actions += s.actions;
                total.injected += s.injected;
                total.delivered += s.delivered;
                total.established += s.established;
                total.rejected_or_timed_out += s.rejected_or_timed_out;
            }
            Err(_) => {
                let p = std::env::temp_dir().join("cm_mad-failure.bin");
                let _ = std::fs::write(&p, &data);
                panic!("input kept in {}", p.display());
            }
        }
    }
    eprintln!("{total:?}");
    // The batch reaches the state machine: MADs injected and delivered, connections
    // established, rejected or timed out.
    assert!(
        total.injected > 1000
            && total.delivered > 1000
            && total.established > 50
            && total.rejected_or_timed_out > 50,
        "{total:?}"
    );
}
