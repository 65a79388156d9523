//! `ferroce conform --break` end to end over real kernel interfaces: `tools/testbed` (prefix
//! `cf`: host A in netns `cfa`, router R in `cfr`, host B in `cfb`; A = 10.61.1.2 and B =
//! 10.61.2.2 on their `eth0`, routed through R), the ferroce peer `ferroce conform --serve`
//! in B and the tester `ferroce conform 10.61.2.2` in A, both processes on AF_PACKET.
//!
//! The same selection of tests runs twice: against the conformant peer every test passes
//! (exit status 0, read from its TAP output), against `--break skip-rkey-check` exactly the
//! three invalid-R_Key tests fail (exit status 1, read from its JUnit file) and the others
//! still pass. The per-test captures are checked as well (the captures by `ferroce inspect`: every packet's
//! ICRC good, the invalid R_Key's WRITE answered by an ACK only under the break).
//! Root (namespaces, AF_PACKET); run under `flock /tmp/ferroce-net.lock` on a shared machine.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const P: &str = "cf";
const ONLY: &str = "psn.in-order,key.invalid-rkey,key.out-of-bounds-write,drop.bad-icrc";

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_ferroce")
}

fn testbed(cmd: &str) -> Output {
    let tb = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/testbed");
    let mut a = vec![cmd, "--prefix", P];
    if cmd == "up" {
        a.extend(["--drop-roce-input", "--force"]);
    }
    Command::new(tb).args(&a).output().unwrap()
}

/// `ferroce conform --serve` in B with `breaks`; killed (by its own process id) on drop.
struct Peer(Child);

impl Peer {
    fn start(breaks: &[&str]) -> Peer {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &format!("{P}b"), bin()]).args([
            "conform",
            "--serve",
            "-d",
            "eth0",
            "--backend",
            "packet",
        ]);
        for b in breaks {
            c.args(["--break", b]);
        }
        let child = c
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Peer(child)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The tester in A against B's peer: TAP on stdout (`tap`) or JUnit in `dir/report.xml`,
/// captures in `dir/pcap`.
fn tester(dir: &Path, tap: bool) -> Output {
    Command::new("ip")
        .args(["netns", "exec", &format!("{P}a"), bin()])
        .args(["conform", "10.61.2.2", "-d", "eth0", "--backend", "packet"])
        .args(["--peer-tool", "ferroce", "--only", ONLY])
        .args(if tap {
            vec!["--tap".into()]
        } else {
            vec!["--junit".into(), dir.join("report.xml").into_os_string()]
        })
        .arg("--pcap-dir")
        .arg(dir.join("pcap"))
        // The serve process needs a moment to listen: the tester keeps trying for this long.
        .args(["--timeout-ms", "300"])
        .output()
        .unwrap()
}

/// JUnit test cases: (id, passed), a case passing when it has no failure, error or skip.
fn junit(x: &str) -> Vec<(String, bool)> {
    x.split("<testcase ")
        .skip(1)
        .filter_map(|c| {
            let name = c.split_once(" name=\"")?.1.split('"').next()?;
            let bad = c.contains("<failure") || c.contains("<error") || c.contains("<skipped");
            Some((name.to_string(), !bad))
        })
        .collect()
}

/// TAP lines `ok N - ID` / `not ok N - ID`: (id, passed); an `ok` with `# SKIP` (not
/// applicable, inconclusive) is not a pass.
fn tap(out: &str) -> Vec<(String, bool)> {
    out.lines()
        .filter_map(|l| {
            let (ok, rest) = if let Some(r) = l.strip_prefix("not ok ") {
                (false, r)
            } else {
                (!l.contains("# SKIP"), l.strip_prefix("ok ")?)
            };
            let id = rest.split_once(" - ")?.1.split_whitespace().next()?;
            Some((id.to_string(), ok))
        })
        .collect()
}

fn inspect(p: &Path) -> String {
    let o = Command::new(bin()).arg("inspect").arg(p).output().unwrap();
    assert!(o.status.success(), "inspect {}", p.display());
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn run(dir: &Path, breaks: &[&str], as_tap: bool) -> (Output, Vec<(String, bool)>) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let peer = Peer::start(breaks);
    std::thread::sleep(Duration::from_millis(300));
    let out = tester(dir, as_tap);
    drop(peer);
    let t = if as_tap {
        tap(&String::from_utf8_lossy(&out.stdout))
    } else {
        junit(&std::fs::read_to_string(dir.join("report.xml")).unwrap_or_default())
    };
    (out, t)
}

#[test]
fn a_break_over_veth_fails_exactly_its_tests() {
    require_root!("conform_testbed", "network namespaces and AF_PACKET");
    let o = testbed("up");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let base: PathBuf =
        std::env::temp_dir().join(format!("ferroce-conform-tb-{}", std::process::id()));
    let good = run(&base.join("good"), &[], true);
    let broken = run(&base.join("broken"), &["skip-rkey-check"], false);
    testbed("down");

    let ids = [
        "psn.in-order",
        "key.invalid-rkey-write",
        "key.invalid-rkey-read",
        "key.invalid-rkey-atomic",
        "key.out-of-bounds-write",
        "drop.bad-icrc",
    ];
    let said = |o: &Output| {
        format!(
            "{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    // The conformant peer: every selected test passes, exit 0.
    let (out, t) = &good;
    assert_eq!(out.status.code(), Some(0), "{}", said(out));
    let got: Vec<&str> = t.iter().map(|(i, _)| i.as_str()).collect();
    assert_eq!(got, ids, "{}", said(out));
    assert!(t.iter().all(|(_, ok)| *ok), "{}", said(out));
    // The broken peer: the three invalid-R_Key tests fail, the others pass, exit 1.
    let (out, t) = &broken;
    assert_eq!(out.status.code(), Some(1), "{}", said(out));
    for (id, ok) in t {
        assert_eq!(
            *ok,
            !id.starts_with("key.invalid-rkey"),
            "{id}: {}",
            said(out)
        );
    }
    assert_eq!(t.len(), ids.len(), "{}", said(out));

    let x = std::fs::read_to_string(base.join("broken/report.xml")).unwrap();
    assert_eq!(x.matches("<failure").count(), 3, "{x}");
    // One capture per test; the invalid R_Key's WRITE is NAKed by the conformant peer
    // (remote access error) and ACKed under the break.
    for id in ids {
        for dir in ["good", "broken"] {
            let p = base.join(dir).join("pcap").join(format!("{id}.pcap"));
            assert!(p.exists(), "{}", p.display());
        }
    }
    let w = |dir: &str| inspect(&base.join(dir).join("pcap/key.invalid-rkey-write.pcap"));
    let (g, b) = (w("good"), w("broken"));
    assert!(g.contains("NAK REM_ACCESS_ERR"), "{g}");
    assert!(!b.contains("NAK REM_ACCESS_ERR"), "{b}");
    for s in [&g, &b] {
        assert!(!s.contains("icrc=bad"), "{s}");
    }
    let _ = std::fs::remove_dir_all(&base);
}
