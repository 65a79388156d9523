//! Issue 17, "a slow or malicious client on the out-of-band TCP port": a real `ferroce perf`
//! server process (`write-bw`, UDP backend, in a network namespace of its own on `lo`) under
//! clients that connect and send nothing, send half a message, send a megabyte of garbage,
//! send a valid version and then stall, and 1,000 connections that send nothing; after all of
//! them a real `ferroce perf` client runs its test against the same server, and both exit 0.
//! Root (network namespaces); counted from the server's own warnings, never timed.

mod common;

use common::net::spawn_in_ns;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const NS: &str = "ftoob";
const NEEDS: &str = "a network namespace of its own (ip netns)";
const PORT: u16 = 18611;
/// A hang guard, not a limit.
const HANG: Duration = Duration::from_secs(120);

fn sh(args: &[&str]) -> std::process::Output {
    Command::new(args[0]).args(&args[1..]).output().unwrap()
}

/// `ferroce perf write-bw` in the namespace, as the server (no host) or the client.
fn perf(addr: &str, gid: &str, host: Option<&str>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", NS, "env"])
        .arg(format!("FERROCE_ADDR={addr}"))
        .arg("RUST_LOG=ferroce=warn")
        .arg(env!("CARGO_BIN_EXE_ferroce"))
        .args(["perf", "write-bw"]);
    if let Some(h) = host {
        c.arg(h);
    }
    c.args([
        "-d",
        "lo",
        "--backend",
        "udp",
        "-x",
        gid,
        "-s",
        "4096",
        "-n",
        "200",
    ])
    .args(["-p", &PORT.to_string(), "--timeout", "1"]);
    c
}

/// Connect to the server from inside the namespace.
fn connect() -> TcpStream {
    TcpStream::connect(("127.0.0.1", PORT)).expect("connect to the perf server")
}

/// perftest's version message.
fn version() -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..4].copy_from_slice(b"6.06");
    v
}

#[test]
fn a_perf_server_outlives_slow_and_malicious_clients() {
    require_root!("oob_server", NEEDS);
    let _ = sh(&["ip", "netns", "del", NS]);
    assert!(sh(&["ip", "netns", "add", NS]).status.success());
    for cmd in [
        &["ip", "link", "set", "lo", "up"][..],
        &["ip", "addr", "add", "127.0.0.2/8", "dev", "lo"][..],
    ] {
        let mut a = vec!["ip", "netns", "exec", NS];
        a.extend_from_slice(cmd);
        assert!(sh(&a).status.success(), "{a:?}");
    }
    let mut server = perf("127.0.0.1", "0", None)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The server's warnings, line by line, as they come.
    let (tx, warnings) = mpsc::channel::<String>();
    let err = server.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(l.clone());
            all.push(l);
        }
        all
    });
    let t0 = Instant::now();
    let mut seen: Vec<String> = Vec::new();
    let wait_for = |what: &str, n: usize, seen: &mut Vec<String>| {
        while seen.iter().filter(|l| l.contains(what)).count() < n {
            let left = HANG.saturating_sub(t0.elapsed());
            match warnings.recv_timeout(left) {
                Ok(l) => seen.push(l),
                Err(_) => panic!("no {n} × {what:?} from the server; it said:\n{seen:#?}"),
            }
        }
    };
    // The server listens once `ss` shows it (an event, polled; not a sleep for a time).
    while !String::from_utf8_lossy(&sh(&["ip", "netns", "exec", NS, "ss", "-Hltn"]).stdout)
        .contains(&format!(":{PORT}"))
    {
        assert!(t0.elapsed() < HANG, "the server never listened");
        std::thread::sleep(Duration::from_millis(20));
    }

    // 1. Sends nothing; sends half a version message; sends a megabyte of garbage.
    let held = spawn_in_ns(NS, || {
        let silent = connect();
        let mut half = connect();
        half.write_all(&version()[..8]).unwrap();
        let mut huge = connect();
        let h = std::thread::spawn(move || {
            let _ = huge.write_all(&vec![b'G'; 1 << 20]);
        });
        (silent, half, h)
    })
    .join()
    .unwrap();
    wait_for("sent nothing in time", 1, &mut seen);
    wait_for("sent only part of its first message in time", 1, &mut seen);
    wait_for("sent a malformed first message", 1, &mut seen);
    let _ = held.2.join();

    // 2. A valid version, then nothing: taken, and dropped when its page size does not come.
    let staller = spawn_in_ns(NS, || {
        let mut c = connect();
        c.write_all(&version()).unwrap();
        c
    })
    .join()
    .unwrap();
    wait_for("waiting for the next client", 1, &mut seen);

    // 3. 1,000 connections that send nothing, held open, then the real client.
    let flood = spawn_in_ns(NS, || (0..1000).map(|_| connect()).collect::<Vec<_>>())
        .join()
        .unwrap();
    let client = perf("127.0.0.2", "1", Some("127.0.0.1")).output().unwrap();
    let s = server.wait().unwrap();
    drop((held.0, held.1, staller, flood));
    let mut out = String::new();
    std::io::Read::read_to_string(&mut server.stdout.take().unwrap(), &mut out).unwrap();
    let all = reader.join().unwrap();
    let _ = sh(&["ip", "netns", "del", NS]);
    let c_out = String::from_utf8_lossy(&client.stdout);
    assert!(
        client.status.success(),
        "the real client failed: {}\n{c_out}\n{}",
        client.status,
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(s.success(), "the server failed: {s}\n{out}\n{all:#?}");
    // Both print perftest's result line: size 4096, 200 iterations.
    for (who, o) in [("client", &*c_out), ("server", &*out)] {
        assert!(
            o.lines()
                .any(|l| l.split_whitespace().take(2).eq(["4096", "200"])),
            "no result line from the {who}:\n{o}"
        );
    }
    // The flood: beyond the 256 the server watches at once, each connection was dropped
    // (the oldest first, or at its deadline), so at least 744 drops of flood connections.
    let flood_drops = all
        .iter()
        .filter(|l| {
            l.contains("too many connections waiting") || l.contains("sent nothing in time")
        })
        .count()
        - 1; // the silent client of step 1
    assert!(
        flood_drops >= 1000 - 256,
        "{flood_drops} of the flood's 1,000 connections dropped"
    );
}
