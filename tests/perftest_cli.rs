//! ferroce under perftest's and rdma-core's program names: `ferroce install-links DIR` makes
//! the links, and a link started by its name reads that program's command line and behaves as
//! it. The last test (root: network namespaces) runs the links between two hosts of
//! tools/testbed, as a benchmark script would: several QPs, every size, both directions, and
//! ibv_rc_pingpong with one receive.

mod common;

use common::cli::run;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A fresh directory of links (one per test: they run in parallel).
fn links(test: &str) -> PathBuf {
    common::cli::links("links", test)
}

#[test]
fn install_links_makes_every_program_name() {
    let dir = links("install");
    let (code, out, _) = run(
        Path::new(env!("CARGO_BIN_EXE_ferroce")),
        &["install-links", dir.to_str().unwrap()],
    );
    assert_eq!(code, 0);
    for name in [
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
        "ib_atomic_bw",
        "ib_write_lat",
        "ib_read_lat",
        "ib_send_lat",
        "ib_atomic_lat",
        "ibv_rc_pingpong",
        "ibv_uc_pingpong",
        "ibv_ud_pingpong",
        "ibv_srq_pingpong",
    ] {
        let l = dir.join(name);
        assert!(
            out.contains(l.to_str().unwrap()),
            "{name} not listed: {out}"
        );
        let meta = std::fs::symlink_metadata(&l).unwrap();
        assert!(meta.file_type().is_symlink(), "{name}");
        assert_eq!(
            std::fs::canonicalize(&l).unwrap(),
            std::fs::canonicalize(env!("CARGO_BIN_EXE_ferroce")).unwrap()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn each_name_is_its_program() {
    let dir = links("names");
    // perftest's -V and -h, rdma-core's -h
    let (code, out, _) = run(&dir.join("ib_send_lat"), &["-V"]);
    assert_eq!((code, out.trim()), (0, "Version: 6.06"));
    let (code, out, _) = run(&dir.join("ib_write_bw"), &["-h"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("ib_write_bw <host>") && out.contains("--qp="),
        "{out}"
    );
    assert!(out.contains("--bidirectional"), "{out}");
    let (_, out, _) = run(&dir.join("ib_write_lat"), &["-h"]);
    assert!(!out.contains("--bidirectional"), "{out}");
    let (code, out, _) = run(&dir.join("ibv_rc_pingpong"), &["-h"]);
    assert_eq!(code, 0);
    assert!(out.contains("ibv_rc_pingpong <host>"), "{out}");
    // perftest's own rules, per program
    let (code, _, err) = run(&dir.join("ib_write_bw"), &["-q", "0"]);
    assert_eq!(code, 1, "perftest and rdma-core exit 1 on a usage error");
    assert!(
        err.contains("num of Qps should be between 1 and 16384"),
        "{err}"
    );
    let (code, _, err) = run(&dir.join("ib_write_lat"), &["-q", "2"]);
    assert_eq!(code, 1, "perftest and rdma-core exit 1 on a usage error");
    assert!(
        err.contains("Multiple QPs only available on bw tests"),
        "{err}"
    );
    let (code, _, err) = run(&dir.join("ib_read_bw"), &["-I", "64"]);
    assert_eq!(code, 1, "perftest and rdma-core exit 1 on a usage error");
    assert!(
        err.contains("Inline feature not available on READ"),
        "{err}"
    );
    let (code, _, err) = run(&dir.join("ib_send_bw"), &["-e", "-D", "2"]);
    assert_eq!(code, 1, "perftest and rdma-core exit 1 on a usage error");
    assert!(
        err.contains("Duration mode doesn't work with events."),
        "{err}"
    );
    // perftest's rules for the connection types
    let (code, _, err) = run(&dir.join("ib_write_bw"), &["-c", "UD", "-d", "lo"]);
    assert_eq!(code, 1, "perftest and rdma-core exit 1 on a usage error");
    assert!(
        err.contains("UD connection only possible in SEND verb"),
        "{err}"
    );
    // ud_pingpong's getopt has no -m
    let (code, _, err) = run(&dir.join("ibv_ud_pingpong"), &["-d", "lo", "-m", "1024"]);
    assert_eq!(code, 1, "perftest and rdma-core exit 1 on a usage error");
    assert!(err.contains("invalid option -- 'm'"), "{err}");
    // ferroce's own command keeps its required -d; perftest's name takes the first device
    let (code, _, err) = run(
        Path::new(env!("CARGO_BIN_EXE_ferroce")),
        &["perf", "write-bw"],
    );
    assert_eq!(code, 2);
    assert!(err.contains("--ib-dev <DEV>"), "{err}");
    let (code, _, err) = run(&dir.join("ib_write_bw"), &["-d", "nosuch0"]);
    assert_eq!(code, 1);
    assert!(err.contains("IB device \"nosuch0\" not found"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn sh(args: &[&str]) -> Output {
    Command::new(args[0]).args(&args[1..]).output().unwrap()
}

fn testbed(cmd: &str, prefix: &str) {
    let tb = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/testbed");
    let mut a = vec![tb, cmd, "--prefix", prefix];
    if cmd == "up" {
        a.push("--drop-roce-input");
    }
    let o = sh(&a);
    assert!(
        o.status.success() || cmd == "down",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Run `prog` as server in `B` and as client in `A` with the same `args`; both outputs.
fn pair(dir: &Path, p: &str, prog: &str, args: &[&str]) -> Result<(String, String), String> {
    let spawn = |ns: String, host: Option<&str>| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &ns, "timeout", "120"])
            .arg(dir.join(prog))
            .args(["-d", "eth0"])
            .args(args);
        if let Some(h) = host {
            c.arg(h);
        }
        c.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let server = spawn(format!("{p}b"), None);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let client = spawn(format!("{p}a"), Some("10.61.2.2"));
    let (c, s) = (
        client.wait_with_output().unwrap(),
        server.wait_with_output().unwrap(),
    );
    let text = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    if !c.status.success() || !s.status.success() {
        return Err(format!(
            "{prog} {args:?}: client {} {}\nserver {} {}",
            c.status,
            String::from_utf8_lossy(&c.stderr),
            s.status,
            String::from_utf8_lossy(&s.stderr)
        ));
    }
    Ok((text(&c), text(&s)))
}

/// The result lines (after the header) and the remote QPNs of perftest-style output.
fn results(out: &str) -> (Vec<Vec<String>>, Vec<String>) {
    let mut lines = Vec::new();
    let mut seen_header = false;
    let mut qpns = Vec::new();
    for l in out.lines() {
        if l.contains("#bytes") {
            seen_header = true;
            continue;
        }
        if l.starts_with(" remote address:") {
            let w: Vec<&str> = l.split_whitespace().collect();
            if let Some(i) = w.iter().position(|x| *x == "QPN") {
                qpns.push(w[i + 1].to_string());
            }
        }
        let w: Vec<String> = l.split_whitespace().map(str::to_string).collect();
        if seen_header && w.first().is_some_and(|x| x.parse::<u64>().is_ok()) {
            lines.push(w);
        }
    }
    (lines, qpns)
}

#[test]
fn the_programs_between_two_hosts() {
    require_root!("perftest_cli", "network namespaces and AF_XDP");
    let dir = links("hosts");
    let p = "pc";
    testbed("up", p);
    let runs: Vec<(&str, Vec<&str>)> = vec![
        ("ib_write_bw", vec!["-q", "4", "-n", "200", "-s", "4096"]),
        ("ib_read_bw", vec!["-q", "2", "-n", "200", "-s", "4096"]),
        ("ib_send_bw", vec!["-a", "-n", "5"]),
        ("ib_write_bw", vec!["-b", "-n", "200", "--report_gbits"]),
        ("ibv_rc_pingpong", vec!["-r", "1", "-n", "100", "-c"]),
    ];
    let mut outs = Vec::new();
    for (prog, args) in &runs {
        outs.push(pair(&dir, p, prog, args));
    }
    testbed("down", p);
    let _ = std::fs::remove_dir_all(&dir);
    let outs: Vec<(String, String)> = outs.into_iter().map(|r| r.unwrap()).collect();
    // -q 4: four QPs exchanged on both sides, each with its own QPN; 4 x 200 iterations
    for (side, o) in [("client", &outs[0].0), ("server", &outs[0].1)] {
        let (lines, mut qpns) = results(o);
        qpns.sort();
        qpns.dedup();
        assert_eq!(qpns.len(), 4, "write_bw -q 4 {side}: {o}");
        assert_eq!(lines.len(), 1, "{o}");
        assert_eq!(lines[0][1], "800", "{o}");
    }
    let (lines, qpns) = results(&outs[1].0);
    assert_eq!(
        (lines[0][1].as_str(), qpns.len()),
        ("400", 2),
        "{}",
        outs[1].0
    );
    // -a: every size from 2 B to 8 MiB on both sides of send_bw
    for o in [&outs[2].0, &outs[2].1] {
        let (lines, _) = results(o);
        let sizes: Vec<&str> = lines.iter().map(|l| l[0].as_str()).collect();
        let want: Vec<String> = (1..24).map(|i| (1u64 << i).to_string()).collect();
        assert_eq!(sizes, want, "{o}");
    }
    // -b: both sides print the same sum
    let (c, s) = (results(&outs[3].0).0, results(&outs[3].1).0);
    assert!(outs[3].0.contains("RDMA_Write Bidirectional BW Test"));
    assert_eq!(c[0][..2], s[0][..2]);
    // ibv_rc_pingpong -r 1
    for o in [&outs[4].0, &outs[4].1] {
        assert!(o.contains("100 iters in "), "{o}");
    }
}
