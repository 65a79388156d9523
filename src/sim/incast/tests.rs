use super::*;
use crate::cc::dcqcn::Params;

const G100: u64 = 100_000_000_000;
const G40: u64 = 40_000_000_000;

fn config(senders: usize, link_bps: u64, ms: u64) -> IncastConfig {
    let mut c = IncastConfig::new(senders, link_bps);
    c.duration = Duration::from_millis(ms);
    c
}

/// The bound on the steady-state backlog we claim for DCQCN with the paper's RED profile
/// (Kmin 5 KB, Kmax 200 KB, Pmax 1 %): 1.5 × Kmax. Above Kmax every frame is marked, so
/// the backlog only overshoots Kmax for the feedback delay (≤ the 50 µs NP interval plus
/// an RTT) of the flows' last increase steps.
const STEADY_QUEUE_BOUND: u64 = 300_000;

#[test]
fn dcqcn_paper_incast_grid_at_100g() {
    // 200 ms each; steady state = the second 100 ms (the start-up transient, where every
    // flow begins at the line rate with α = 1 and over-reacts, takes about 20 ms to
    // recover from at R_AI = 40 Mb/s per 55 µs).
    for n in [2usize, 4, 8, 16] {
        let r = run(&config(n, G100, 200)).unwrap();
        let s = r.summary();
        assert!(s.utilization >= 0.95, "{n} senders: {s}");
        assert!(s.jain >= 0.99, "{n} senders: {s}");
        assert!(
            s.steady_max_queue_bytes <= STEADY_QUEUE_BOUND,
            "{n} senders: {s}"
        );
        // The steady-state backlog sits between Kmin and Kmax on average.
        assert!(
            s.steady_mean_queue_bytes > 5_000.0 && s.steady_mean_queue_bytes < 200_000.0,
            "{n} senders: {s}"
        );
        // CNPs keep flowing in the steady state: the queue is controlled, not idle.
        assert!(s.cnps > 100 * n as u64, "{n} senders: {s}");
        // Only the 16-sender transient reaches the 12 MB buffer (without PFC): a handful
        // of drops, all before the steady state.
        let sent: u64 = r.flows.iter().map(|f| f.sent).sum();
        assert!(s.drops * 1000 <= sent, "{n} senders: {s}");
        if n <= 8 {
            assert_eq!(s.drops, 0, "{n} senders: {s}");
        }
        assert!(s.steady_max_queue_bytes < s.max_queue_bytes);
    }
}

#[test]
fn dcqcn_paper_incast_at_40g() {
    for n in [2usize, 16] {
        let r = run(&config(n, G40, 200)).unwrap();
        let s = r.summary();
        assert!(s.utilization >= 0.95, "{n} senders: {s}");
        assert!(s.jain >= 0.99, "{n} senders: {s}");
        assert!(
            s.steady_max_queue_bytes <= STEADY_QUEUE_BOUND,
            "{n} senders: {s}"
        );
        assert_eq!(s.drops, 0, "{n} senders: {s}");
    }
}

#[test]
fn dcqcn_with_pfc_is_lossless_and_pauses_only_at_start() {
    let mut c = config(16, G100, 100);
    c.pfc = Some(Pfc {
        xoff_bytes: 1_000_000,
        xon_bytes: 900_000,
    });
    let r = run(&c).unwrap();
    let s = r.summary();
    assert_eq!(s.drops, 0, "{s}");
    assert!(s.pfc_pauses >= 1, "{s}");
    // Every pause is in the start-up transient (the first millisecond).
    assert!(r
        .samples
        .iter()
        .all(|x| !x.pfc_paused || x.t.as_nanos() <= 1_000_000));
    assert!(s.pfc_paused < Duration::from_millis(1), "{s}");
    assert!(s.utilization >= 0.95 && s.jain >= 0.99, "{s}");
    assert!(s.steady_max_queue_bytes <= STEADY_QUEUE_BOUND, "{s}");
}

#[test]
fn without_cc_the_queue_fills_the_buffer_and_drops() {
    for n in [2usize, 16] {
        let mut c = config(n, G100, 10);
        c.cc = CcConfig::None;
        let r = run(&c).unwrap();
        let s = r.summary();
        let limit = c.buffer_bytes;
        let frame = c.frame_bytes as u64;
        assert!(s.max_queue_bytes > limit - frame, "{n}: {s}");
        assert!(s.max_queue_bytes <= limit, "{n}: {s}");
        // The steady state is a full buffer: every sample within a frame of the limit.
        assert!(
            s.steady_mean_queue_bytes >= (limit - 2 * frame) as f64,
            "{n}: {s}"
        );
        // Offered n × line rate, carried 1 ×: (n − 1)/n of the frames are dropped.
        let sent: u64 = r.flows.iter().map(|f| f.sent).sum();
        let dropped = s.drops as f64 / sent as f64;
        let expect = (n - 1) as f64 / n as f64;
        assert!((dropped - expect).abs() < 0.05, "{n}: dropped {dropped}");
        assert!(s.utilization > 0.999, "{n}: {s}");
        // Marks and CNPs happen (the NP does its job) but nobody listens.
        assert!(s.ce_marked > 0 && s.cnps > 0);
        assert!(r
            .samples
            .iter()
            .all(|x| x.flows.iter().all(|f| f.rate_bps == G100)));
        // Jitter keeps tail drop fair (no phase lock-out).
        assert!(s.jain > 0.98, "{n}: {s}");
    }
}

#[test]
fn without_cc_pfc_pauses_instead_of_dropping() {
    for n in [2usize, 16] {
        let mut c = config(n, G100, 10);
        c.cc = CcConfig::None;
        let pfc = Pfc {
            xoff_bytes: 1_000_000,
            xon_bytes: 900_000,
        };
        c.pfc = Some(pfc);
        let r = run(&c).unwrap();
        let s = r.summary();
        assert_eq!(s.drops, 0, "{n}: {s}");
        assert!(s.pfc_pauses > 10, "{n}: {s}");
        assert!(s.pfc_paused > Duration::from_millis(1), "{n}: {s}");
        // Headroom: after XOFF, each of the other n − 1 senders keeps sending for the
        // PAUSE's way back (one leg) plus its frame in flight (one leg) and the jitter,
        // plus up to two frames each.
        let leg_s = c.rtt.as_nanos() as f64 / 4e9;
        let headroom = (n - 1) as f64 * (G100 as f64 / 8.0) * (2.0 * leg_s + 64e-9)
            + (2 * n * c.frame_bytes) as f64;
        assert!(
            (s.max_queue_bytes as f64) <= pfc.xoff_bytes as f64 + headroom,
            "{n}: {s} (headroom {headroom})"
        );
        assert!(s.max_queue_bytes >= pfc.xoff_bytes, "{n}: {s}");
        assert!(s.utilization > 0.999, "{n}: {s}");
        assert!(s.jain > 0.99, "{n}: {s}");
    }
}

#[test]
fn a_single_flow_runs_at_line_rate_without_marks() {
    let r = run(&config(1, G100, 5)).unwrap();
    let s = r.summary();
    assert!(s.utilization > 0.999, "{s}");
    assert_eq!((s.ce_marked, s.cnps, s.drops), (0, 0, 0), "{s}");
    // The port never holds more than the frame being sent and one arriving.
    assert!(s.max_queue_bytes <= 2 * FRAME_4096 as u64, "{s}");
}

#[test]
fn a_joining_flow_converges_to_its_fair_share() {
    // Three flows from 0, a fourth from 100 ms; 300 ms in all. Fair share: 25 Gb/s.
    let mut c = config(4, G100, 300);
    c.starts = vec![
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
        Duration::from_millis(100),
    ];
    let r = run(&c).unwrap();
    let t = r
        .convergence_time(3, Duration::from_millis(5), 0.1)
        .expect("the joiner converges");
    // Measured 49.7 ms with seed 1 (50–76 ms over seeds 1–3): the joiner starts at the line
    // rate with α = 1, is cut to about 1 Gb/s within a few NP intervals, and climbs back
    // by fast recovery and 40 Mb/s additive steps.
    assert!(
        t > Duration::from_millis(5) && t < Duration::from_millis(150),
        "{t:?}"
    );
    // Before joining it sends nothing; at the end all four share the link.
    assert_eq!(
        r.mean_throughput_bps(3, Instant::ZERO, Instant::from_micros(99_000)),
        0.0
    );
    let s = r.summary();
    assert!(s.utilization >= 0.95 && s.jain >= 0.99, "{s}");
    let tail: Vec<f64> = (0..4)
        .map(|i| {
            r.mean_throughput_bps(
                i,
                Instant::from_micros(250_000),
                Instant::from_micros(300_000),
            )
        })
        .collect();
    assert!(jain_index(&tail) > 0.99, "{tail:?}");
}

#[test]
fn connectx_preset_runs_and_stays_lossless() {
    let mut c = config(8, G100, 50);
    c.cc = CcConfig::Dcqcn(Params::connectx());
    c.np_interval = Duration::from_micros(4);
    let r = run(&c).unwrap();
    let s = r.summary();
    // With the firmware defaults as we read them (4 µs NP and cut spacing, α ≈ 1 at the
    // first CNP, R_AI 5 Mb/s) the start-up over-reaction is deep and the recovery slow;
    // see docs/dcqcn.md. We only check the machinery here.
    assert_eq!(s.drops, 0, "{s}");
    assert!(s.cnps > 0 && s.utilization > 0.5, "{s}");
    assert!(r.samples.iter().all(|x| x
        .flows
        .iter()
        .all(|f| f.alpha.is_some_and(|a| (0.0..=1.0).contains(&a)))));
}

#[test]
fn runs_are_deterministic_and_the_seed_matters() {
    let c = config(4, G100, 20);
    let a = run(&c).unwrap();
    let b = run(&c).unwrap();
    assert_eq!(a.samples, b.samples);
    assert_eq!(a.flows, b.flows);
    assert_eq!(a.summary(), b.summary());
    let mut c2 = c.clone();
    c2.seed = 2;
    let d = run(&c2).unwrap();
    assert_ne!(a.flows, d.flows);
}

#[test]
fn samples_cover_the_run() {
    let r = run(&config(2, G100, 4)).unwrap();
    // One sample every 20 µs: 200 samples, the first at 20 µs, the last at 4 ms.
    assert_eq!(r.samples.len(), 200);
    assert_eq!(r.samples[0].t, Instant::from_micros(20));
    assert_eq!(r.samples[199].t, Instant::from_micros(4000));
    assert!(r.samples.iter().all(|s| s.flows.len() == 2));
    // Goodput never exceeds the link in any interval (frames are attributed to the
    // interval their last bit reaches the receiver in: at most one frame of slack).
    let slack = FRAME_4096 as f64 * 8.0 / 20e-6;
    for s in &r.samples {
        let sum: f64 = s.flows.iter().map(|f| f.throughput_bps).sum();
        assert!(sum <= G100 as f64 + slack, "{sum}");
        assert!(s.queue_max_bytes >= s.queue_bytes);
    }
}

#[test]
fn bad_configurations_are_rejected() {
    let good = config(2, G100, 1);
    let mut c = good.clone();
    c.senders = 0;
    assert!(run(&c).is_err());
    let mut c = good.clone();
    c.link_bps = 0;
    assert!(run(&c).is_err());
    let mut c = good.clone();
    c.red = Some(Red::new(10, 5, 0.1));
    assert!(run(&c).is_err());
    let mut c = good.clone();
    c.pfc = Some(Pfc {
        xoff_bytes: 1,
        xon_bytes: 2,
    });
    assert!(run(&c).is_err());
    let mut c = good;
    c.steady_from = 1.0;
    assert!(run(&c).is_err());
}

#[test]
fn jain_index_known_values() {
    assert_eq!(jain_index(&[1.0, 1.0, 1.0, 1.0]), 1.0);
    assert_eq!(jain_index(&[1.0, 0.0, 0.0, 0.0]), 0.25);
    // (1 + 3)² / (2 · (1 + 9)) = 16 / 20.
    assert_eq!(jain_index(&[1.0, 3.0]), 0.8);
    assert_eq!(jain_index(&[]), 1.0);
}
