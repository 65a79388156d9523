//! The rsocket fuzz harness (`ferroce_cabi::rsocket_fuzz`: a hostile peer against a real
//! rsocket) on stable: the kept regression inputs (`fuzz/regressions/rsocket_rx/`) and a seeded
//! batch of random inputs, the CI smoke (`RSOCKET_RX_RUNS=N` runs more). The harness listens
//! on 127.0.0.1 of the process's device on `lo`, so it runs in a network namespace of its own:
//! the test re-runs itself under `unshare -rn` (no privilege needed) with `lo` up. The
//! coverage-guided runs are `tools/fuzz rsocket_rx RUNS [SECONDS]`.

mod common;

use ferroce::rng::SplitMix64;

/// Run `test` of this binary again in a network namespace of its own (`unshare -rn`, `lo`
/// up): true when this is that run.
fn reexec(test: &str) -> bool {
    common::reexec_in_netns(test, "FERROCE_RSOCKET_RX_CHILD")
}

#[test]
fn regressions_found_by_the_fuzzer_stay_fixed() {
    if !reexec("regressions_found_by_the_fuzzer_stay_fixed") {
        return;
    }
    let dir = common::repo().join("fuzz/regressions/rsocket_rx");
    let mut n = 0;
    for f in std::fs::read_dir(&dir).expect("fuzz/regressions/rsocket_rx") {
        let p = f.unwrap().path();
        eprintln!("{}", p.display());
        ferroce_cabi::rsocket_fuzz::run(&std::fs::read(&p).unwrap());
        n += 1;
    }
    assert!(n > 0, "no regression inputs in {}", dir.display());
}

#[test]
fn a_hostile_peer_never_gets_past_the_rsocket_checks() {
    if !reexec("a_hostile_peer_never_gets_past_the_rsocket_checks") {
        return;
    }
    let runs: u64 = std::env::var("RSOCKET_RX_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut rng = SplitMix64::new(0x13_75ec);
    let mut total = ferroce_cabi::rsocket_fuzz::Stats::default();
    for _ in 0..runs {
        let len = 8 + (rng.next_u64() % 400) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        match std::panic::catch_unwind(|| ferroce_cabi::rsocket_fuzz::run_stats(&data)) {
            Ok(s) => total.add(&s),
            Err(_) => {
                let p = std::env::temp_dir().join("rsocket_rx-failure.bin");
                let _ = std::fs::write(&p, &data);
                panic!("input kept in {}", p.display());
            }
        }
    }
    eprintln!("{total:?}");
    // The batch reaches past the connection checks both ways, into data read, protocol
    // violations caught and data sent back.
    assert!(
        total.rejected > runs / 20 && total.connected > runs / 4,
        "{total:?}"
    );
    assert!(
        total.bytes_read > 0 && total.eproto > 0 && total.bytes_sent > 0,
        "{total:?}"
    );
    assert!(total.peer_writes > runs, "{total:?}");
}

/// The direct-placement path, which random inputs rarely reach whole (an iomap area, a healthy
/// peer, an entry, then a riowrite into it): a listener with 4 iomap entries; the peer writes
/// entry 1 (offset 1000, 8 KiB of its ring from 4096) and announces it; the rsocket's riowrite
/// of 3,000 bytes at offset 1010 lands there, all of it (the harness checks every byte of the
/// peer's ring outside what it granted).
#[test]
fn riowrite_lands_in_the_entry_the_peer_announced() {
    if !reexec("riowrite_lands_in_the_entry_the_peer_announced") {
        return;
    }
    let input = [
        0, 32, 4, // the listener's sizes: only the iomap area, 4 entries
        1, // well-formed connection data
        30, 1, 1, 0xe8, 0x03, 0x00, 0x10, 0, 0x00, 0x20,
        1, // entry 1: offset 1000 -> ring+4096, 8 KiB
        31, 0xb8, 0x0b, 1, 0, 10, // riowrite 3000 bytes at the first announced offset + 10
    ];
    let st = ferroce_cabi::rsocket_fuzz::run_stats(&input);
    assert_eq!(st.connected, 1, "{st:?}");
    assert_eq!(st.bytes_iowritten, 3000, "{st:?}");
}

/// `RSOCKET_RX_REPLAY=FILE`: run one kept input.
#[test]
fn replay_a_kept_input() {
    if std::env::var_os("RSOCKET_RX_REPLAY").is_none() || !reexec("replay_a_kept_input") {
        return;
    }
    let p = std::env::var_os("RSOCKET_RX_REPLAY").unwrap();
    ferroce_cabi::rsocket_fuzz::run(&std::fs::read(p).expect("RSOCKET_RX_REPLAY"));
}

/// The datagram rsocket harness (`ferroce_cabi::rsocket_dgram_fuzz`: a hostile peer's
/// side-channel datagrams and UD messages against a real datagram rsocket) on a seeded batch
/// (`RSOCKET_DGRAM_RUNS=N` runs more; coverage-guided: `tools/fuzz rsocket_dgram`).
#[test]
fn a_hostile_datagram_peer_gets_nothing_past_the_checks() {
    if !reexec("a_hostile_datagram_peer_gets_nothing_past_the_checks") {
        return;
    }
    let runs: u64 = std::env::var("RSOCKET_DGRAM_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut rng = SplitMix64::new(0xd6_7a3);
    let mut total = ferroce_cabi::rsocket_dgram_fuzz::Stats::default();
    for _ in 0..runs {
        let len = 8 + (rng.next_u64() % 300) as usize;
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        match std::panic::catch_unwind(|| ferroce_cabi::rsocket_dgram_fuzz::run_stats(&data)) {
            Ok(s) => total.add(&s),
            Err(_) => {
                let p = std::env::temp_dir().join("rsocket_dgram-failure.bin");
                let _ = std::fs::write(&p, &data);
                panic!("input kept in {}", p.display());
            }
        }
    }
    ferroce_cabi::rsocket_dgram_fuzz::close();
    eprintln!("{total:?}");
    // The batch reaches delivery both ways, reads that truncate and peek, and the socket's
    // sends back over both ways.
    assert!(
        total.delivered_side > 0 && total.delivered_ud > 0,
        "{total:?}"
    );
    assert!(total.truncated > 0 && total.peeked > 0, "{total:?}");
    assert!(total.sent_back_side + total.sent_back_ud > 0, "{total:?}");
}

/// The datagram harness's kept inputs (`fuzz/regressions/rsocket_dgram/`): each once found
/// the harness wrong, and stays as a check of its model.
#[test]
fn datagram_inputs_kept_from_the_fuzzer_pass() {
    if !reexec("datagram_inputs_kept_from_the_fuzzer_pass") {
        return;
    }
    let dir = common::repo().join("fuzz/regressions/rsocket_dgram");
    let mut n = 0;
    for f in std::fs::read_dir(&dir).expect("fuzz/regressions/rsocket_dgram") {
        let p = f.unwrap().path();
        eprintln!("{}", p.display());
        ferroce_cabi::rsocket_dgram_fuzz::run(&std::fs::read(&p).unwrap());
        n += 1;
    }
    ferroce_cabi::rsocket_dgram_fuzz::close();
    assert!(n > 0, "no kept inputs in {}", dir.display());
}

/// `RSOCKET_DGRAM_REPLAY=FILE`: run one kept input of the datagram harness.
#[test]
fn replay_a_kept_datagram_input() {
    if std::env::var_os("RSOCKET_DGRAM_REPLAY").is_none() || !reexec("replay_a_kept_datagram_input")
    {
        return;
    }
    let p = std::env::var_os("RSOCKET_DGRAM_REPLAY").unwrap();
    ferroce_cabi::rsocket_dgram_fuzz::run(&std::fs::read(p).expect("RSOCKET_DGRAM_REPLAY"));
    ferroce_cabi::rsocket_dgram_fuzz::close();
}
