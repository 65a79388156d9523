//! perftest's out-of-band exchange, mode by mode, against what real perftest does.
//!
//! Each fixture in tests/fixtures/perftest/ is the exchange two real perftest 4.5-0.17
//! processes had (rdma_rxe in two tools/rxe-peer guests, captured on the bridge and reduced
//! by extract.py): every turn of the TCP conversation, its length, and which QP each key
//! message describes. Here two ferroce devices in one process (the loopback backend) run the
//! same command line through `apps::perf`, with a relay between client and server that
//! records the conversation; the turns must be the same, byte counts and QP order included.
//! A ferroce that sent one QP's key message for all QPs, skipped a per-size barrier or added
//! a report exchange fails here.

use ferroce::apps::perf::args::{self, Parsed};
use ferroce::apps::perf::{self, PerfConfig, Printer, Test};
use ferroce::io::Loopback;
use ferroce::oob::perftest::{Role, Session};
use ferroce::runtime::{Nic, NicOptions, PollMode};
use ferroce::verbs::{DeviceConfig, Mtu};
use ferroce::wire::MacAddr;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const MAC_A: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 1]);
const MAC_B: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 2]);

fn ip(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, n))
}

type Log = Arc<Mutex<Vec<(char, Vec<u8>)>>>;

/// Copy `from` to `to`, logging what passes as turns of side `side`.
fn forward(mut from: TcpStream, mut to: TcpStream, side: char, log: Log) {
    let mut buf = [0u8; 4096];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        {
            let mut l = log.lock().unwrap();
            match l.last_mut() {
                Some((s, b)) if *s == side => b.extend_from_slice(&buf[..n]),
                _ => l.push((side, buf[..n].to_vec())),
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// The turns as extract.py writes them.
fn turns(log: &[(char, Vec<u8>)]) -> Vec<String> {
    let mut dones = Vec::new();
    let mut t: Vec<(char, Vec<u8>)> = Vec::new();
    for (s, b) in log {
        let mut b = b.clone();
        if b.ends_with(b"done\0") {
            b.truncate(b.len() - 5);
            dones.push(*s);
        }
        if b.is_empty() {
            continue;
        }
        match t.last_mut() {
            Some((ls, lb)) if ls == s => lb.extend_from_slice(&b),
            _ => t.push((*s, b)),
        }
    }
    let mut qpns: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
    let mut out = Vec::new();
    for (s, b) in &t {
        let side = usize::from(*s == 'S');
        let mut line = format!("{s} {}", b.len());
        let mut off = 0;
        while off + 108 <= b.len() {
            let m = &b[off..off + 108];
            let f: Vec<&[u8]> = m.split(|&c| c == b':').collect();
            if f.len() < 24 || m[107] != 0 {
                break;
            }
            let qpn = u32::from_str_radix(std::str::from_utf8(f[2]).unwrap_or("x"), 16)
                .unwrap_or(u32::MAX);
            if !qpns[side].contains(&qpn) {
                qpns[side].push(qpn);
            }
            let k = qpns[side].iter().position(|&q| q == qpn).unwrap_or(99);
            line.push_str(&format!(" k{k}"));
            off += 108;
        }
        out.push(line);
    }
    dones.sort();
    out.extend(dones.iter().map(|d| format!("{d} done")));
    out
}

fn config(test: Test, a: &[&str]) -> PerfConfig {
    let Parsed::Run(inv) = args::parse(test, "test", a.iter().copied()).unwrap() else {
        panic!("{a:?} is not a run");
    };
    let mut cfg = inv.cfg;
    cfg.mtu = Mtu::M1024;
    cfg.gid_index = 0;
    cfg.progress = false;
    cfg.timeout = Duration::from_secs(60);
    // 4.3 s per retry (not perftest's 67 ms): a debug build on a loaded machine can leave the
    // peer's engine thread unscheduled long enough for seven timeouts in a row (the key
    // messages do not carry it, so the exchange compared is the same).
    cfg.qp_timeout = 20;
    cfg
}

/// One pair of devices at a time: their engine threads poll, and parallel tests on two cores
/// would starve each other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Run `test` with perftest options `a` between two ferroce devices and return the turns.
fn exchange(test: Test, a: &[&str]) -> Vec<String> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cfg = config(test, a);
    let opts = NicOptions {
        poll: PollMode::Adaptive {
            spins: 200,
            max_sleep: Duration::from_micros(200),
        },
        batch: 64,
    };
    let (la, lb) = Loopback::pair(8192, 9000).unwrap();
    let na = Nic::start(DeviceConfig::new(MAC_A, ip(1)), la, opts).unwrap();
    let nb = Nic::start(DeviceConfig::new(MAC_B, ip(2)), lb, opts).unwrap();
    let resolve = |addr: IpAddr| {
        if addr == ip(1) {
            Some(MAC_A)
        } else if addr == ip(2) {
            Some(MAC_B)
        } else {
            None
        }
    };
    let server_l = TcpListener::bind("127.0.0.1:0").unwrap();
    let relay_l = TcpListener::bind("127.0.0.1:0").unwrap();
    let (server_addr, relay_addr) = (
        server_l.local_addr().unwrap(),
        relay_l.local_addr().unwrap(),
    );
    let log: Log = Arc::default();
    let cfg = &cfg;
    let resolve = &resolve;
    let (c, s) = std::thread::scope(|sc| {
        let log2 = log.clone();
        sc.spawn(move || {
            let (from_client, _) = relay_l.accept().unwrap();
            let to_server = TcpStream::connect(server_addr).unwrap();
            let (c2, s2) = (
                from_client.try_clone().unwrap(),
                to_server.try_clone().unwrap(),
            );
            let l3 = log2.clone();
            let up = std::thread::spawn(move || forward(from_client, to_server, 'C', log2));
            forward(s2, c2, 'S', l3);
            let _ = up.join();
        });
        let nb = &nb;
        let server = sc.spawn(move || {
            let (st, _) = server_l.accept().unwrap();
            let mut ses = Session::new(st, Role::Server, cfg.timeout);
            let mut out = Vec::new();
            let mut pr = Printer {
                out: &mut out,
                device: "b".into(),
            };
            perf::run_with(nb, cfg, &mut ses, resolve, &mut pr).map(|_| ())
        });
        let st = TcpStream::connect(relay_addr).unwrap();
        let mut ses = Session::new(st, Role::Client, cfg.timeout);
        let mut out = Vec::new();
        let mut pr = Printer {
            out: &mut out,
            device: "a".into(),
        };
        let c = perf::run_with(&na, cfg, &mut ses, resolve, &mut pr).map(|_| ());
        drop(ses);
        (c, server.join().unwrap())
    });
    na.shutdown();
    nb.shutdown();
    c.unwrap_or_else(|e| panic!("{test:?} {a:?}: client: {e}"));
    s.unwrap_or_else(|e| panic!("{test:?} {a:?}: server: {e}"));
    let l = log.lock().unwrap();
    turns(&l)
}

fn fixture(name: &str) -> Vec<String> {
    let p = format!(
        "{}/tests/fixtures/perftest/{name}.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{p}: {e}"))
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(str::to_string)
        .collect()
}

fn check(name: &str, test: Test, a: &[&str]) {
    let want = fixture(name);
    let got = exchange(test, a);
    if got != want {
        let first = got
            .iter()
            .zip(&want)
            .position(|(g, w)| g != w)
            .unwrap_or(got.len().min(want.len()));
        panic!(
            "{name}: ferroce's exchange differs from perftest's at turn {first}: ferroce {:?}, perftest {:?}\nferroce: {got:?}\nperftest: {want:?}",
            got.get(first),
            want.get(first)
        );
    }
}

#[test]
fn write_bw_with_four_qps() {
    check(
        "write_bw-q4",
        Test::WriteBw,
        &["-q", "4", "-n", "20", "-s", "4096"],
    );
}

#[test]
fn read_bw_with_two_qps() {
    check(
        "read_bw-q2",
        Test::ReadBw,
        &["-q", "2", "-n", "20", "-s", "4096"],
    );
}

#[test]
fn atomic_bw_with_two_qps() {
    check("atomic_bw-q2", Test::AtomicBw, &["-n", "20", "-q", "2"]);
}

#[test]
fn send_bw_every_size() {
    check("send_bw-a", Test::SendBw, &["-a", "-n", "5"]);
}

#[test]
fn write_bw_every_size() {
    check("write_bw-a", Test::WriteBw, &["-a", "-n", "5"]);
}

#[test]
fn read_bw_every_size() {
    check("read_bw-a", Test::ReadBw, &["-a", "-n", "5"]);
}

#[test]
fn write_bw_bidirectional() {
    check(
        "write_bw-b",
        Test::WriteBw,
        &["-b", "-n", "20", "-s", "4096"],
    );
}

#[test]
fn read_bw_bidirectional() {
    check(
        "read_bw-b",
        Test::ReadBw,
        &["-b", "-n", "20", "-s", "4096", "--report_gbits"],
    );
}

#[test]
fn send_bw_bidirectional() {
    check("send_bw-b", Test::SendBw, &["-b", "-n", "20", "-s", "4096"]);
}

#[test]
fn latency_tests_every_size() {
    check("write_lat-a", Test::WriteLat, &["-a", "-n", "5"]);
    check("send_lat-a", Test::SendLat, &["-a", "-n", "5"]);
    check("read_lat-a", Test::ReadLat, &["-a", "-n", "5"]);
}

#[test]
fn latency_tests_one_size() {
    check("write_lat", Test::WriteLat, &["-n", "20", "-I", "0"]);
    check("atomic_lat", Test::AtomicLat, &["-n", "20"]);
}

#[test]
fn post_lists_events_and_outstanding_reads() {
    check(
        "write_bw-flags",
        Test::WriteBw,
        &[
            "-I", "64", "-t", "16", "-l", "4", "-Q", "2", "-n", "20", "-s", "64",
        ],
    );
    check(
        "send_bw-flags",
        Test::SendBw,
        &[
            "-r", "16", "-e", "-I", "100", "-s", "64", "-n", "20", "-q", "2",
        ],
    );
    check(
        "read_bw-flags",
        Test::ReadBw,
        &["-o", "4", "-e", "-n", "20", "-s", "64"],
    );
}

#[test]
fn duration_runs() {
    check("write_bw-D", Test::WriteBw, &["-D", "2", "-s", "4096"]);
    check("send_bw-D", Test::SendBw, &["-D", "2", "-s", "4096"]);
}
