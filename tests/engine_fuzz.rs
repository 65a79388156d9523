//! The engine fuzz harness (`fuzz/harness/engine_pair.rs`, issue 17) on stable: every input
//! in `fuzz/regressions/engine_pair/` (crashes the fuzzer found, kept as regressions) and a
//! seeded batch of random inputs. The long runs are `tools/fuzz engine_pair RUNS`.

#[path = "../fuzz/harness/engine_pair.rs"]
#[allow(dead_code)]
mod harness;

use ferroce::rng::SplitMix64;

#[test]
fn regressions_found_by_the_fuzzer_stay_fixed() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/regressions/engine_pair");
    let mut n = 0;
    for e in std::fs::read_dir(dir).expect("fuzz/regressions/engine_pair") {
        let p = e.unwrap().path();
        let data = std::fs::read(&p).unwrap();
        eprintln!("{}", p.display());
        harness::run(&data);
        n += 1;
    }
    assert!(n > 0, "no regression inputs in {dir}");
}

#[test]
fn random_action_sequences_keep_the_invariants() {
    let mut rng = SplitMix64::new(0x17_e4e1);
    let mut total = harness::Stats::default();
    for _ in 0..300 {
        let len = 16 + (rng.next_u64() % 600) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        match std::panic::catch_unwind(|| harness::run_stats(&data)) {
            Ok(s) => {
                total.actions += s.actions;
                total.forged += s.forged;
                total.posted += s.posted;
                total.ok_completions += s.ok_completions;
                total.err_completions += s.err_completions;
                total.ended_in_rts += s.ended_in_rts;
                total.probes += s.probes;
            }
            Err(_) => {
                // Keep the input to replay it (and to add it to the regressions once fixed).
                let p = std::env::temp_dir().join("engine_pair-failure.bin");
                let _ = std::fs::write(&p, &data);
                panic!("input kept in {}", p.display());
            }
        }
    }
    eprintln!("{total:?}");
    // The batch reaches the transport: frames forged, work completed both ways.
    assert!(
        total.forged > 500 && total.ok_completions > 100 && total.probes > 10,
        "{total:?}"
    );
}
