//! The C entry point fuzz harness (`ferroce_cabi::entry_fuzz`, issue 17) on stable: the kept
//! regression inputs (`fuzz/regressions/cabi_entry/`) and a seeded batch of random inputs, the
//! CI smoke (`CABI_ENTRY_RUNS=N` runs more). The harness opens the process's device on `lo`
//! and connects QPs to whatever the input says, so it runs in a network namespace of its own:
//! the test re-runs itself under `unshare -rn` (no privilege needed) with `lo` up. The
//! coverage-guided runs are `tools/fuzz cabi_entry RUNS [SECONDS]`.

mod common;

use ferroce::rng::SplitMix64;

/// Run `test` of this binary again in a network namespace of its own (`unshare -rn`, `lo`
/// up): true when this is that run.
fn reexec(test: &str) -> bool {
    common::reexec_in_netns(test, "FERROCE_CABI_ENTRY_CHILD")
}

#[test]
fn regressions_found_by_the_fuzzer_stay_fixed() {
    if !reexec("regressions_found_by_the_fuzzer_stay_fixed") {
        return;
    }
    let dir = common::repo().join("fuzz/regressions/cabi_entry");
    let mut n = 0;
    for f in std::fs::read_dir(&dir).expect("fuzz/regressions/cabi_entry") {
        let p = f.unwrap().path();
        eprintln!("{}", p.display());
        ferroce_cabi::entry_fuzz::run(&std::fs::read(&p).unwrap());
        n += 1;
    }
    assert!(n > 0, "no regression inputs in {}", dir.display());
}

#[test]
fn random_calls_with_untrusted_values_keep_the_invariants() {
    if !reexec("random_calls_with_untrusted_values_keep_the_invariants") {
        return;
    }
    let runs: u64 = std::env::var("CABI_ENTRY_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let mut rng = SplitMix64::new(0x17_cab1);
    let mut total = ferroce_cabi::entry_fuzz::Stats::default();
    for _ in 0..runs {
        let len = 16 + (rng.next_u64() % 1500) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        match std::panic::catch_unwind(|| ferroce_cabi::entry_fuzz::run_stats(&data)) {
            Ok(s) => total.add(&s),
            Err(_) => {
                let p = std::env::temp_dir().join("cabi_entry-failure.bin");
                let _ = std::fs::write(&p, &data);
                panic!("input kept in {}", p.display());
            }
        }
    }
    eprintln!("{total:?}");
    // The batch reaches past the argument checks: QPs made, posts taken and refused, QPs
    // modified, completions (of both kinds) polled.
    assert!(
        total.qps > runs && total.posts_taken > runs && total.posts_refused > runs,
        "{total:?}"
    );
    assert!(
        total.modify_ok > runs / 4 && total.completions > runs / 4,
        "{total:?}"
    );
    assert!(total.error_completions > 0, "{total:?}");
}

/// `CABI_ENTRY_REPLAY=FILE`: run one kept input.
#[test]
fn replay_a_kept_input() {
    if std::env::var_os("CABI_ENTRY_REPLAY").is_none() || !reexec("replay_a_kept_input") {
        return;
    }
    let p = std::env::var_os("CABI_ENTRY_REPLAY").unwrap();
    ferroce_cabi::entry_fuzz::run(&std::fs::read(p).expect("CABI_ENTRY_REPLAY"));
}
