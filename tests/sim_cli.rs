//! `ferroce sim incast` as a user runs it: one summary line, files written, one-line errors.

mod common;

use common::cli::ferroce;
use ferroce::apps::cc_csv;

/// The value of `key=` in a summary line.
fn field(line: &str, key: &str) -> f64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        .parse()
        .unwrap()
}

#[test]
fn incast_prints_exactly_one_summary_line() {
    let (code, out, err) = ferroce(&["sim", "incast", "--senders", "4", "--duration-ms", "100"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    let line = out.trim_end();
    assert!(line.starts_with("utilization="), "{line}");
    let keys: Vec<&str> = line
        .split_whitespace()
        .map(|kv| kv.split('=').next().unwrap())
        .collect();
    assert_eq!(
        &keys[..5],
        &["utilization", "jain", "max_queue_kb", "drops", "cnps"]
    );
    assert!(field(line, "utilization") >= 0.95, "{line}");
    assert!(field(line, "jain") >= 0.99, "{line}");
    assert!(field(line, "cnps") > 0.0, "{line}");
}

#[test]
fn incast_default_run_reports_the_steady_state_first() {
    // The first number is the steady state's: the default run is long enough for DCQCN to
    // recover from the incast of 8 senders (at 10 ms the window was still the transient).
    let (code, out, err) = ferroce(&["sim", "incast", "--senders", "8"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.is_empty(), "{err}");
    let line = out.trim_end();
    assert!(line.starts_with("utilization="), "{line}");
    assert!(field(line, "utilization") >= 0.99, "{line}");
    assert!(line.ends_with(" steady=yes"), "{line}");
    // The whole run's figure, start-up included, is printed beside it and is lower.
    assert!(
        field(line, "run_utilization") < field(line, "utilization"),
        "{line}"
    );
    // A run too short says so, on the line and on standard error.
    let (code, out, err) = ferroce(&["sim", "incast", "--senders", "8", "--duration-ms", "10"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.trim_end().ends_with(" steady=no"), "{out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("not yet in a steady state") && err.contains("--duration-ms"));
}

#[test]
fn incast_without_cc_fills_the_buffer_or_pauses() {
    let (code, out, _) = ferroce(&[
        "sim",
        "incast",
        "--senders",
        "8",
        "--cc",
        "none",
        "--duration-ms",
        "2",
        "--buffer-kb",
        "2000",
    ]);
    assert_eq!(code, 0);
    assert!(field(&out, "drops") > 0.0, "{out}");
    assert!(field(&out, "max_queue_kb") > 1990.0, "{out}");
    assert!(out.contains("cc=none"), "{out}");
    let (code, out, _) = ferroce(&[
        "sim",
        "incast",
        "--senders",
        "8",
        "--cc",
        "none",
        "--duration-ms",
        "2",
        "--pfc",
    ]);
    assert_eq!(code, 0);
    assert_eq!(field(&out, "drops"), 0.0, "{out}");
    assert!(field(&out, "pfc_pauses") > 0.0, "{out}");
}

#[test]
fn incast_writes_csv_and_png_and_reports_a_join() {
    let dir = std::env::temp_dir().join(format!("ferroce-sim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("x.csv");
    let png = dir.join("x.png");
    let (code, out, err) = ferroce(&[
        "sim",
        "incast",
        "--senders",
        "2",
        "--preset",
        "connectx",
        "--link-gbps",
        "40",
        "--duration-ms",
        "3",
        "--join-ms",
        "1",
        "--seed",
        "9",
        "--csv",
        csv.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("join_convergence_ms="), "{out}");
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.starts_with("t_us,queue_kb,queue_max_kb,pfc_paused,f0_gbps"));
    assert_eq!(text.lines().count(), 1 + 150);
    assert_eq!(&std::fs::read(&png).unwrap()[..4], b"\x89PNG");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn incast_bad_arguments_are_one_line_errors() {
    // What clap checks: its whole message (naming the argument), status 2.
    for args in [
        &["sim", "incast"][..],
        &["sim", "incast", "--senders", "0"][..],
        &["sim", "incast", "--senders", "x"][..],
        &["sim", "incast", "--senders", "2", "--cc", "cubic"][..],
        &["sim", "incast", "--senders", "2", "--preset", "mine"][..],
        &["sim", "incast", "--senders", "2", "--bogus"][..],
        &["sim", "incast", "--senders", "2", "--link-gbps", "-1"][..],
    ] {
        let (code, out, err) = ferroce(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(err.contains("try '--help'"), "{args:?}: {err}");
    }
    // What the command checks: one line, status 2.
    for args in [
        &["sim", "incast", "--senders", "2", "--link-gbps=-1"][..],
        &["sim", "incast", "--senders", "2", "--duration-ms", "0"][..],
        &["sim", "incast", "--senders", "2", "--pmax", "1.5"][..],
        &["sim", "incast", "--senders", "2", "--kmin-kb", "300"][..],
        &[
            "sim",
            "incast",
            "--senders",
            "2",
            "--pfc",
            "--xon-kb",
            "2000",
        ][..],
        &[
            "sim",
            "incast",
            "--senders",
            "2",
            "--duration-ms",
            "10",
            "--join-ms",
            "20",
        ][..],
        &["sim", "incast", "--senders", "2", "--dcqcn", "bogus=1"][..],
        &["sim", "incast", "--senders", "2", "--dcqcn", "g"][..],
        &["sim", "incast", "--senders", "2", "--dcqcn", "g=1.5"][..],
    ] {
        let (code, out, err) = ferroce(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("ferroce: "), "{args:?}: {err}");
    }
    // An unwritable output file: a one-line error, status 1.
    let (code, _, err) = ferroce(&[
        "sim",
        "incast",
        "--senders",
        "2",
        "--duration-ms",
        "1",
        "--csv",
        "/nonexistent/x.csv",
    ]);
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn incast_dcqcn_overrides_take_effect() {
    // min_dec_factor=1 forbids every rate cut: DCQCN then controls nothing and the queue
    // grows as without congestion control.
    let base = ["sim", "incast", "--senders", "8", "--duration-ms", "3"];
    let (code, out, err) = ferroce(&base);
    assert_eq!(code, 0, "{err}");
    let mut args = base.to_vec();
    args.extend(["--dcqcn", "min_dec_factor=1"]);
    let (code2, out2, err2) = ferroce(&args);
    assert_eq!(code2, 0, "{err2}");
    let (q, q2) = (
        field(out.trim(), "max_queue_kb"),
        field(out2.trim(), "max_queue_kb"),
    );
    assert!(q2 > 2.0 * q, "with cuts {q} KB, without {q2} KB");
}

#[test]
fn cc_plot_draws_perf_csvs_and_rejects_other_files() {
    let dir = std::env::temp_dir().join(format!("ferroce-ccplot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("cc1.csv");
    let mut text = format!("{}\n", cc_csv::HEADER);
    for i in 0..50u32 {
        let t = 1_796_000_000.0 + f64::from(i) * 0.01;
        let rate = 1_000_000_000 - u64::from(i) * 10_000_000;
        let alpha = 1.0 - f64::from(i) / 100.0;
        text.push_str(&cc_csv::row(t, 0x11, rate, Some(alpha), i.into(), 0));
        text.push('\n');
    }
    std::fs::write(&csv, text).unwrap();
    let log = dir.join("switch.log");
    std::fs::write(
        &log,
        "switching between s1, r\n  ... 0.5 s: 10 frames/s forwarded, queues [0 12] KB, rx_mbps [100.0 1.0], ce_marked 3, drops 0, unix 1796000000.100\n",
    )
    .unwrap();
    let png = dir.join("out.png");
    let (code, _, err) = ferroce(&[
        "cc-plot",
        "--csv",
        csv.to_str().unwrap(),
        "--switch-log",
        log.to_str().unwrap(),
        "--out",
        png.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(&std::fs::read(&png).unwrap()[..4], b"\x89PNG");
    // Not a --cc-csv file, a missing file, a malformed line: one-line errors, status 2.
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, "a,b\n1,2\n").unwrap();
    let broken = dir.join("broken.csv");
    std::fs::write(&broken, format!("{}\n1.0,0x11,x,,0,0\n", cc_csv::HEADER)).unwrap();
    for f in [bad, dir.join("missing.csv"), broken] {
        let (code, out, err) = ferroce(&[
            "cc-plot",
            "--csv",
            f.to_str().unwrap(),
            "--out",
            png.to_str().unwrap(),
        ]);
        assert_eq!(code, 2, "{err}");
        assert!(out.is_empty());
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("ferroce: cc-plot: "), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
