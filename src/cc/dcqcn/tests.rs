//! Hand-computed sequences: every expected number below was worked out from the equations
//! in the module documentation (with exact fractions), not by running this code.

use super::*;

const G40: u64 = 40_000_000_000;

fn us(n: u64) -> Instant {
    Instant::from_micros(n)
}

fn paper40() -> Dcqcn {
    Dcqcn::new(Params::paper().line_rate(G40))
}

/// Relative comparison for values that are not exact binary fractions.
#[track_caller]
fn close(got: f64, want: f64) {
    assert!(
        (got - want).abs() <= want.abs() * 1e-12,
        "got {got}, want {want}"
    );
}

#[test]
fn starts_at_line_rate_with_no_timer() {
    let d = paper40();
    assert_eq!(d.rate_bps(), G40);
    assert_eq!(d.next_timer(), None);
    assert_eq!(d.alpha_at(us(1_000_000)), 1.0);
    assert!(!d.recovering());
}

#[test]
fn cnp_storm_halves_the_rate_down_to_the_minimum() {
    // α₀ = 1 and g = 1/256: α ← (255/256)·1 + 1/256 = 1 exactly, so every CNP halves R_C
    // and R_T takes the old R_C. CNPs 1 µs apart: no α decay (K = 55 µs), no increase
    // (T = 55 µs).
    let mut d = paper40();
    let mut expect = 40e9;
    for k in 1..=15u64 {
        d.on_cnp(us(k));
        let rt = expect;
        expect /= 2.0;
        assert_eq!(d.current_rate(), expect, "cnp {k}");
        assert_eq!(d.target_rate(), rt, "cnp {k}");
        assert_eq!(d.alpha_at(us(k)), 1.0);
    }
    // After 15 halvings: 40e9 / 32768 = 1,220,703.125 b/s.
    assert_eq!(d.current_rate(), 1_220_703.125);
    assert_eq!(d.rate_bps(), 1_220_703);
    // The 16th would give 610,351.5625: clamped to the 1 Mb/s minimum, and stays there.
    d.on_cnp(us(16));
    assert_eq!(d.current_rate(), 1_000_000.0);
    assert_eq!(d.target_rate(), 1_220_703.125);
    d.on_cnp(us(17));
    assert_eq!(d.current_rate(), 1_000_000.0);
    assert_eq!(d.target_rate(), 1_000_000.0);
    assert_eq!(d.stats().cnps, 17);
}

#[test]
fn alpha_grows_towards_one_under_a_storm() {
    // α₀ = 0: α_k = 1 − (255/256)^k; the k-th cut uses α_{k−1}.
    let mut p = Params::paper().line_rate(G40);
    p.initial_alpha = 0.0;
    let mut d = Dcqcn::new(p);
    let alphas = [
        0.00390625,           // 1/256
        0.0077972412109375,   // 511/65536
        0.011673033237457275, // 195841/16777216
        0.015533685451373458, // 66716671/4294967296
        0.01937925699257903,  // 21307718401/1099511627776
    ];
    let rates = [
        40e9,                  // α₀ = 0: no cut at all
        39_921_875_000.0,      // 40e9 · (1 − 1/512)
        39_766_234_755.516_05, // · (1 − 511/131072)
        39_534_138_465.501_22,
        39_227_083_029.744_15,
    ];
    for k in 0..5 {
        d.on_cnp(us(k as u64 + 1));
        close(d.alpha_at(us(k as u64 + 1)), alphas[k]);
        close(d.current_rate(), rates[k]);
    }
    // Keep storming (1 µs apart, below K): α → 1.
    for k in 6..3000u64 {
        d.on_cnp(us(k));
    }
    let a = d.alpha_at(us(3000));
    assert!(a > 0.9999 && a <= 1.0, "{a}");
}

#[test]
fn alpha_decays_every_k_without_cnps() {
    let mut d = paper40();
    d.on_cnp(us(0)); // R_C 20e9, R_T 40e9, α = 1, α timer from 0
    assert_eq!(d.alpha_at(Instant::from_nanos(54_999)), 1.0);
    assert_eq!(d.alpha_at(us(55)), 0.99609375); // 255/256
    assert_eq!(d.alpha_at(us(110)), 0.9922027587890625); // 65025/65536
    assert_eq!(d.alpha_at(us(165)), 0.9883269667625427); // 16581375/16777216
    assert_eq!(d.alpha_at(us(199)), 0.9883269667625427);
    // Meanwhile the increase timer fired at 55, 110, 165 µs: fast recovery towards 40e9.
    d.on_timer(us(199));
    assert_eq!(d.current_rate(), 37.5e9); // 30, 35, 37.5
    assert_eq!(d.stage_counts(), (3, 0));
    // A CNP at 200 µs cuts with α = 16581375/16777216:
    // R_C = 37.5e9 · (1 − α/2) = 2486287646484375/131072 = 18,968,869,373.2023...
    d.on_cnp(us(200));
    assert_eq!(d.target_rate(), 37.5e9);
    close(d.current_rate(), 18_968_869_373.202324);
    assert_eq!(d.stage_counts(), (0, 0));
    // ... then α ← (255/256)α + 1/256 = 4245027841/4294967296, and the α timer restarts.
    close(d.alpha_at(us(200)), 0.9883725645486265);
    close(d.alpha_at(us(254)), 0.9883725645486265);
    close(d.alpha_at(us(255)), 0.9883725645486265 * 255.0 / 256.0);
    // A long quiet spell: 100 periods.
    close(
        d.alpha_at(us(200 + 5_500)),
        0.9883725645486265 * (255.0f64 / 256.0).powi(100),
    );
}

#[test]
fn recovery_stages_after_a_cnp() {
    // Two CNPs (0 and 1 µs) leave R_T = 20e9, R_C = 10e9 below the 40e9 line, so the
    // additive steps are not hidden by the clamp. The timer restarts at 1 µs.
    let mut d = paper40();
    d.on_cnp(us(0));
    d.on_cnp(us(1));
    assert_eq!((d.target_rate(), d.current_rate()), (20e9, 10e9));
    assert_eq!(d.next_timer(), Some(us(56)));
    // Timer events every 55 µs; F = 5, b = 0.
    let timer = [
        // (t, R_T, R_C, stage)
        (56, 20e9, 15e9, Stage::FastRecovery),
        (111, 20e9, 17.5e9, Stage::FastRecovery),
        (166, 20e9, 18.75e9, Stage::FastRecovery),
        (221, 20e9, 19.375e9, Stage::FastRecovery),
        (276, 20e9, 19.6875e9, Stage::FastRecovery),
        // max(t, b) = 6 > F, min = 0: additive, R_T += 40 Mb/s.
        (331, 20.04e9, 19.86375e9, Stage::Additive),
        (386, 20.08e9, 19.971875e9, Stage::Additive),
    ];
    for (i, &(t, rt, rc, _stage)) in timer.iter().enumerate() {
        d.on_timer(Instant::from_nanos(t * 1000 - 1));
        assert_eq!(d.stage_counts().0, i as u32, "before {t}");
        d.on_timer(us(t));
        assert_eq!(d.target_rate(), rt, "R_T at {t} µs");
        assert_eq!(d.current_rate(), rc, "R_C at {t} µs");
    }
    assert_eq!((d.stats().fast_recovery, d.stats().additive), (5, 2));
    // Now the byte counter (B = 10 MB): b = 1..5 are additive (t = 7 > F but b ≤ F), b = 6
    // makes both exceed F: hyper, R_T += 400 Mb/s.
    let bytes = [
        (20.12e9, 20_045_937_500.0),
        (20.16e9, 20_102_968_750.0),
        (20.20e9, 20_151_484_375.0),
        (20.24e9, 20_195_742_187.5),
        (20.28e9, 20_237_871_093.75),
        (20.68e9, 20_458_935_546.875),
    ];
    for (i, &(rt, rc)) in bytes.iter().enumerate() {
        d.on_sent(us(400), 10_000_000);
        assert_eq!(d.stage_counts(), (7, i as u32 + 1));
        close(d.target_rate(), rt);
        close(d.current_rate(), rc);
    }
    assert_eq!(d.stats().hyper, 1);
    assert_eq!(d.stats().additive, 7);
    assert_eq!(d.next_timer(), Some(us(441)));
}

#[test]
fn byte_counter_path_counts_across_packets() {
    // B = 1 MB, no timer: only bytes drive increases. Two CNPs: R_T 20e9, R_C 10e9.
    let mut p = Params::paper().line_rate(G40);
    p.byte_counter = 1_000_000;
    p.rate_increase_period = Duration::ZERO;
    let mut d = Dcqcn::new(p);
    d.on_cnp(us(0));
    d.on_cnp(us(1));
    assert_eq!(d.next_timer(), None);
    // 999 packets of 1000 B: 999,000 B, no event yet; the 1000th completes 1 MB.
    for i in 0..999 {
        d.on_sent(us(2 + i), 1000);
    }
    assert_eq!(d.stage_counts(), (0, 0));
    assert_eq!(d.current_rate(), 10e9);
    d.on_sent(us(1001), 1000);
    assert_eq!(d.stage_counts(), (0, 1));
    assert_eq!(d.current_rate(), 15e9);
    // One big send worth 4.5 MB: four more events (b = 2..5, fast recovery), 0.5 MB carried.
    d.on_sent(us(1002), 4_500_000);
    assert_eq!(d.stage_counts(), (0, 5));
    assert_eq!(d.current_rate(), 19.6875e9);
    // 0.5 MB more completes b = 6: additive (t = 0 ≤ F).
    d.on_sent(us(1003), 500_000);
    assert_eq!(d.stage_counts(), (0, 6));
    assert_eq!((d.target_rate(), d.current_rate()), (20.04e9, 19.86375e9));
    // A CNP resets the counter: 0.9 MB after it is not an event.
    d.on_cnp(us(1004));
    d.on_sent(us(1005), 900_000);
    assert_eq!(d.stage_counts(), (0, 0));
}

#[test]
fn clamps_and_the_minimum_decrease_factor() {
    // R_T never exceeds the line rate; R_C converges to it and then the timer stops.
    let mut d = paper40();
    d.on_cnp(us(0)); // 20e9 / 40e9
    for k in 1..=5 {
        d.on_timer(us(55 * k));
    }
    assert_eq!(d.current_rate(), 39.375e9);
    d.on_timer(us(55 * 6)); // additive: R_T 40.04e9 clamped to 40e9
    assert_eq!(d.target_rate(), 40e9);
    assert_eq!(d.current_rate(), 39.6875e9);
    // Halving the gap each 55 µs reaches 40e9 within 64 steps; then no more timer.
    d.on_timer(us(55 * 80));
    assert_eq!(d.current_rate(), 40e9);
    assert_eq!(d.rate_bps(), G40);
    assert_eq!(d.next_timer(), None);
    assert!(!d.recovering());
    let events = d.stats().fast_recovery + d.stats().additive;
    assert!(events < 80, "{events}");
    // Bytes sent at line rate count for nothing.
    d.on_sent(us(5000), 100_000_000);
    assert_eq!(d.stage_counts().1, 0);

    // min_dec_factor 0.75: a cut with α = 1 keeps 75 % instead of 50 %.
    let mut p = Params::paper().line_rate(G40);
    p.min_dec_factor = 0.75;
    let mut d = Dcqcn::new(p);
    d.on_cnp(us(0));
    assert_eq!(d.current_rate(), 30e9);
    d.on_cnp(us(1));
    assert_eq!(d.current_rate(), 22.5e9);
    // 1.0 disables cuts altogether (and with it the increase machinery).
    let mut p = Params::paper().line_rate(G40);
    p.min_dec_factor = 1.0;
    let mut d = Dcqcn::new(p);
    d.on_cnp(us(0));
    assert_eq!(d.current_rate(), 40e9);
    assert_eq!(d.next_timer(), None);

    // The minimum rate is also the floor of R_T.
    let mut p = Params::paper().line_rate(G40);
    p.min_rate_bps = 10_000_000_000;
    let mut d = Dcqcn::new(p);
    d.on_cnp(us(0));
    d.on_cnp(us(1));
    d.on_cnp(us(2));
    assert_eq!((d.target_rate(), d.current_rate()), (10e9, 10e9));
}

#[test]
fn late_timer_calls_give_the_same_result() {
    // One on_timer call 10 ms late equals 181 timely ones (the timer is anchored).
    let mut a = paper40();
    let mut b = paper40();
    for d in [&mut a, &mut b] {
        d.on_cnp(us(0));
        d.on_cnp(us(3));
    }
    let mut t = 3 + 55;
    while t <= 10_000 {
        a.on_timer(us(t));
        t += 55;
    }
    b.on_timer(us(10_000));
    assert_eq!(a.current_rate(), b.current_rate());
    assert_eq!(a.target_rate(), b.target_rate());
    assert_eq!(a.next_timer(), b.next_timer());
    // A handler runs the due timers first: on_sent at 20 ms = on_timer then on_sent.
    let mut c = a.clone();
    a.on_sent(us(20_000), 1500);
    c.on_timer(us(20_000));
    c.on_sent(us(20_000), 1500);
    assert_eq!(a.current_rate(), c.current_rate());
}

#[test]
fn connectx_periodic_alpha_and_rate_reduce_period() {
    // ConnectX at 40 Gb/s: α₀ = 1023/1024, g = 5/1024, α ticks every 1 µs from the first
    // CNP, at most one cut per 4 µs.
    let mut d = Dcqcn::new(Params::connectx().line_rate(G40));
    d.on_cnp(us(0));
    // R_C = 40e9 · (1 − 1023/2048) = 40e9 · 1025/2048.
    assert_eq!(d.current_rate(), 20_019_531_250.0);
    assert_eq!(d.target_rate(), 40e9);
    // α does not move at the CNP, but at the next tick (1 µs): (1019/1024)α + 5/1024 =
    // 1047557/1048576; then ·1019/1024 at 2 µs (no CNP in (1, 2]).
    assert_eq!(d.alpha_at(us(0)), 1023.0 / 1024.0);
    assert_eq!(d.alpha_at(us(1)), 0.999028205871582);
    assert_eq!(d.alpha_at(us(2)), 0.9941501384600997);
    // A CNP at 2 µs is within the 4 µs rate-reduce period: no cut, but α sees it:
    // 1093111043197/1099511627776 at 3 µs, ·1019/1024 at 4 µs.
    d.on_cnp(us(2));
    assert_eq!(d.current_rate(), 20_019_531_250.0);
    assert_eq!(d.stats().rate_cuts, 1);
    close(d.alpha_at(us(3)), 0.99417870223715);
    close(d.alpha_at(us(4)), 0.9893243140426327);
    // At 4 µs the period is over: cut with α(4 µs).
    d.on_cnp(us(4));
    assert_eq!(d.target_rate(), 20_019_531_250.0);
    close(d.current_rate(), 10_116_626_739.319351);
    close(d.alpha_at(us(5)), 0.9893764414154713);
    close(d.alpha_at(us(105)), 0.6064350603498107);
    // Byte counter 32767 B with F = 1: the first event is fast recovery ...
    d.on_sent(us(10), 32767);
    close(d.current_rate(), 15_068_078_994.659676);
    // ... the second additive (R_T += 5 Mb/s).
    d.on_sent(us(11), 32767);
    close(d.target_rate(), 20_024_531_250.0);
    close(d.current_rate(), 17_546_305_122.329838);
    // The 300 µs timer was restarted by the cut at 4 µs.
    assert_eq!(d.next_timer(), Some(us(304)));
    // Timer event t = 1 with b = 2: max = 2 > F, min = 1: additive; the next timer event
    // (t = 2, b = 2) is hyper: R_T += 50 Mb/s.
    d.on_timer(us(304));
    close(d.target_rate(), 20_029_531_250.0);
    d.on_timer(us(604));
    close(d.target_rate(), 20_079_531_250.0);
    assert_eq!(d.stats().hyper, 1);
}

#[test]
fn connectx_target_clamp_only_after_a_timer_increase() {
    // clamp_tgt_rate = 0, clamp_tgt_rate_after_time_inc = 1 (the ConnectX defaults), on the
    // paper's numbers at 40 Gb/s, α kept at 1 (no α timer) so that every cut halves R_C.
    let mut p = Params::paper().line_rate(G40);
    p.clamp_target = ClampTarget::AfterTimerIncrease;
    p.alpha_period = Duration::ZERO;
    let mut d = Dcqcn::new(p);
    d.on_cnp(us(0));
    assert_eq!((d.target_rate(), d.current_rate()), (40e9, 20e9));
    // No increase since: R_T stays at 40e9.
    d.on_cnp(us(1));
    assert_eq!((d.target_rate(), d.current_rate()), (40e9, 10e9));
    // A timer increase (fast recovery, 56 µs): R_C = (40 + 10)/2 = 25e9 ...
    d.on_timer(us(56));
    assert_eq!(d.current_rate(), 25e9);
    // ... so the next cut lowers R_T to 25e9.
    d.on_cnp(us(60));
    assert_eq!((d.target_rate(), d.current_rate()), (25e9, 12.5e9));
    d.on_cnp(us(61));
    assert_eq!((d.target_rate(), d.current_rate()), (25e9, 6.25e9));
    // A byte-counter increase does not count: R_C = (25 + 6.25)/2, and R_T survives the cut.
    d.on_sent(us(62), 10_000_000);
    assert_eq!(d.current_rate(), 15.625e9);
    d.on_cnp(us(63));
    assert_eq!((d.target_rate(), d.current_rate()), (25e9, 7.8125e9));
    // The ConnectX preset with the firmware's clamp: the second cut keeps R_T at the line
    // rate.
    let mut p = Params::connectx().line_rate(G40);
    p.clamp_target = ClampTarget::AfterTimerIncrease;
    let mut d = Dcqcn::new(p);
    d.on_cnp(us(0));
    d.on_cnp(us(4));
    assert_eq!(d.target_rate(), 40e9);
    // α(4 µs) = ((1019/1024)(1023/1024) + 5/1024)(1019/1024)³
    //         = 1108409438424463/1125899906842624; R_C = 40e9 · (1025/2048)(1 − α/2).
    close(d.alpha_at(us(4)), 0.9844653434005428);
    close(d.current_rate(), 10_165_263_896.625425);
    // Fast recovery heads back to 40e9: (40e9 + R_C)/2.
    d.on_sent(us(5), 32767);
    close(d.current_rate(), 25_082_631_948.312714);
}

#[test]
fn np_spaces_cnps_by_the_interval() {
    // CE-marked packets every 1 µs, interval 50 µs: CNPs at exactly 0, 50, 100, ... µs.
    let mut np = NotificationPoint::paper();
    let mut sent = Vec::new();
    for t in 0..=1000u64 {
        if np.on_ce(us(t)) {
            sent.push(t);
        }
    }
    assert_eq!(sent, (0..=1000).step_by(50).collect::<Vec<_>>());
    assert_eq!(np.counts(), (1001, 21));
    // CE every 3 µs with 4 µs (ConnectX): CNPs at 0, 6, 12, ... (the first mark ≥ 4 µs on).
    let mut np = NotificationPoint::connectx();
    let sent: Vec<u64> = (0..40u64)
        .map(|k| 3 * k)
        .filter(|&t| np.on_ce(us(t)))
        .collect();
    assert_eq!(sent, (0..120).step_by(6).collect::<Vec<_>>());
    // Zero interval: every mark.
    let mut np = NotificationPoint::new(Duration::ZERO);
    assert!((0..10).all(|_| np.on_ce(us(5))));
}

#[test]
fn overrides_by_name() {
    let p = Params::paper()
        .with_overrides(&[
            "rai_mbps=1",
            "rate_increase_period_us=550",
            "stages=3",
            "alpha_update=periodic",
            "g=0.5",
        ])
        .unwrap();
    assert_eq!(p.rai_bps, 1_000_000);
    assert_eq!(p.rate_increase_period, Duration::from_micros(550));
    assert_eq!(p.stages, 3);
    assert_eq!(p.alpha_update, AlphaUpdate::Periodic);
    assert_eq!(p.g, 0.5);
    let s = Params::paper().with_overrides(&["time_scale=10"]).unwrap();
    assert_eq!(s.alpha_period, Duration::from_micros(550));
    let err = |kv: &str| Params::paper().with_overrides(&[kv]).unwrap_err();
    assert_eq!(err("bogus=1"), ParamError::Unknown("bogus".into()));
    assert!(err("bogus=1")
        .to_string()
        .starts_with("unknown DCQCN parameter 'bogus' (one of: g, initial_alpha, "));
    assert_eq!(err("g=2").to_string(), "g: 2 is not in [0, 1]");
    assert_eq!(err("g"), ParamError::NotKeyValue("g".into()));
    assert_eq!(
        err("rai_mbps=-1").to_string(),
        "rai_mbps: '-1' is not a non-negative number"
    );
    assert_eq!(
        err("alpha_update=never").to_string(),
        "alpha_update: 'never' (on-cnp|periodic)"
    );
}
