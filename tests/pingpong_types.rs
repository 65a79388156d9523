//! `ibv_uc_pingpong`, `ibv_ud_pingpong` and `ibv_srq_pingpong` (links to the ferroce binary)
//! between two ferroce processes: the UDP backend on loopback, in a network namespace of a
//! user namespace (`unshare -rn`, no privilege needed) whose `lo` has 127.0.0.1 and
//! 127.0.0.2, one process on each (GID index 0 and 1). The client captures (`--pcap`) and
//! tshark, not ferroce, reads the capture: opcodes, Q_Keys, destination QPs, frame lengths.
//! What the messages and lines must be is rdma-core's (libibverbs/examples/*_pingpong.c).
//!
//! Against the real rdma-core programs and Linux rxe: tools/interop-rxe.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A fresh directory of links (one per test: they run in parallel).
fn links(test: &str) -> PathBuf {
    common::cli::links("pptypes", test)
}

fn can_unshare(test: &str) -> bool {
    common::net::can_unshare("pingpong_types", test)
}

struct Run {
    server: (i32, String, String),
    client: (i32, String, String),
    /// tshark's fields of the client's capture, one line per frame.
    frames: Vec<Vec<String>>,
}

/// Server (127.0.0.1) and client (127.0.0.2) of `prog` with their own arguments; the client
/// captures to a pcap that tshark reads.
fn pair(test: &str, prog: &str, server: &[&str], client: &[&str]) -> Run {
    pair_under(test, "", prog, server, client)
}

/// [`pair`], each side started by `wrap` (a command prefix such as `taskset -c 0 `).
fn pair_under(test: &str, wrap: &str, prog: &str, server: &[&str], client: &[&str]) -> Run {
    // rdma-core's examples take the GID index with -g, perftest with -x
    let g = if prog.starts_with("ib_") { "-x" } else { "-g" };
    let dir = links(test);
    let p = dir.join(prog);
    let q = |a: &[&str]| {
        a.iter()
            .map(|s| format!("'{s}'"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let pcap = dir.join("client.pcap");
    let script = format!(
        "ip link set lo up && ip addr add 127.0.0.2/8 dev lo || exit 99\n\
         {wrap}{p} -d lo --backend udp {g} 0 --timeout 10 {sa} >{d}/s.out 2>{d}/s.err &\n\
         S=$!\n\
         {wrap}{p} 127.0.0.1 -d lo --backend udp {g} 1 --timeout 10 --pcap {pcap} {ca} >{d}/c.out 2>{d}/c.err\n\
         echo $? >{d}/c.rc\n\
         wait $S; echo $? >{d}/s.rc\n",
        p = p.display(),
        d = dir.display(),
        pcap = pcap.display(),
        wrap = wrap,
        sa = q(server),
        ca = q(client),
    );
    let st = Command::new("unshare")
        .args(["-rn", "sh", "-c", &script])
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "the namespace script failed: {st}");
    let read = |n: &str| std::fs::read_to_string(dir.join(n)).unwrap_or_default();
    let side = |s: &str| {
        (
            read(&format!("{s}.rc")).trim().parse::<i32>().unwrap_or(-1),
            read(&format!("{s}.out")),
            read(&format!("{s}.err")),
        )
    };
    let frames = tshark(&pcap);
    let r = Run {
        server: side("s"),
        client: side("c"),
        frames,
    };
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn tshark(pcap: &Path) -> Vec<Vec<String>> {
    let out = Command::new("tshark")
        .args([
            "-r",
            pcap.to_str().unwrap(),
            "-T",
            "fields",
            "-E",
            "separator=,",
        ])
        .args([
            "-e",
            "frame.len",
            "-e",
            "ip.src",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.bth.destqp",
            "-e",
            "infiniband.deth.q_key",
            "-e",
            "infiniband.deth.srcqp",
            "-e",
            "infiniband.bth.psn",
        ])
        .stderr(Stdio::null())
        .output()
        .expect("tshark (tools/deps.sh installs it)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

fn ok(r: &Run) {
    assert_eq!(
        (r.server.0, r.client.0),
        (0, 0),
        "server {:?}\nclient {:?}",
        r.server,
        r.client
    );
}

/// `  local address:  LID 0x0000, QPN 0x000011, ...`: the QPNs of the lines starting `what`.
fn qpns(out: &str, what: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with(what))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let i = w.iter().position(|x| *x == "QPN").unwrap();
            w[i + 1].trim_end_matches(',').to_string()
        })
        .collect()
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap()
}

#[test]
fn ud_pingpong_with_the_grh_slot() {
    if !can_unshare("ud_pingpong_with_the_grh_slot") {
        return;
    }
    let r = pair(
        "ud",
        "ibv_ud_pingpong",
        &["-n", "100"],
        &["-n", "100", "--verify"],
    );
    ok(&r);
    for (side, out) in [("server", &r.server.1), ("client", &r.client.1)] {
        // ud_pingpong's own local line: "PSN 0x......: GID"; the remote one with a comma.
        let local = out.lines().find(|l| l.starts_with("  local address:  "));
        let local = local.unwrap_or_else(|| panic!("{side}: {out}"));
        assert!(local.contains(": GID ::ffff:127.0.0."), "{side}: {local}");
        let remote = out.lines().find(|l| l.starts_with("  remote address: "));
        assert!(remote.unwrap().contains(", GID ::ffff:127.0.0."), "{out}");
        // default size 1024: 1024 * 100 * 2 bytes
        assert!(out.contains("204800 bytes in "), "{side}: {out}");
        assert!(out.contains("100 iters in "), "{side}: {out}");
    }
    // The client checked every echo byte for byte and every GRH slot (IPv4 header of the
    // server's packet in its last 20 bytes).
    assert!(
        r.client
            .1
            .contains("verify: ok: 100 received messages of 1024 bytes"),
        "{}",
        r.client.1
    );
    assert!(
        r.client.1.contains(
            "every GRH slot holds the IP header of the peer's packet (127.0.0.1 -> 127.0.0.2)"
        ),
        "{}",
        r.client.1
    );
    // On the wire: 200 UD SEND-only packets (opcode 100), Q_Key 0x11111111, each to the QPN
    // the other side printed, source QP in the DETH; 1024 B payload: 14 + 20 + 8 + 12 + 8 +
    // 1024 + 4 = 1090-byte frames; nothing else (no ACKs).
    assert_eq!(r.frames.len(), 200, "{:?}", r.frames);
    let srv_qpn = &qpns(&r.server.1, "  local address:")[0];
    let cli_qpn = &qpns(&r.client.1, "  local address:")[0];
    for f in &r.frames {
        assert_eq!(f[0], "1090", "{f:?}");
        assert_eq!(f[2], "100", "{f:?}");
        assert_eq!(f[4], "0x0000000011111111", "{f:?}");
        let (dst, src) = if f[1] == "127.0.0.2" {
            (srv_qpn, cli_qpn)
        } else {
            (cli_qpn, srv_qpn)
        };
        assert_eq!(hex(&f[3]), hex(dst), "{f:?}");
        assert_eq!(hex(&f[5]), hex(src), "{f:?}");
    }
}

#[test]
fn uc_pingpong_sends_without_acks() {
    if !can_unshare("uc_pingpong_sends_without_acks") {
        return;
    }
    // 4096-byte messages at path MTU 1024: SEND FIRST, MIDDLE, MIDDLE, LAST each.
    let r = pair(
        "uc",
        "ibv_uc_pingpong",
        &["-n", "100", "-m", "1024"],
        &["-n", "100", "-m", "1024", "--verify"],
    );
    ok(&r);
    for out in [&r.server.1, &r.client.1] {
        assert!(out.contains("819200 bytes in "), "{out}");
        assert!(out.contains("100 iters in "), "{out}");
    }
    assert!(r
        .client
        .1
        .contains("verify: ok: 100 received messages of 4096 bytes"));
    // UC opcodes only (SEND FIRST 32, MIDDLE 33, LAST 34), 4 per message, 200 messages; no
    // acknowledgements of any kind (RC's 17).
    let mut ops: Vec<&str> = r.frames.iter().map(|f| f[2].as_str()).collect();
    assert_eq!(ops.len(), 800, "{ops:?}");
    for m in ops.chunks(4) {
        assert_eq!(m, ["32", "33", "33", "34"]);
    }
    ops.sort();
    ops.dedup();
    assert_eq!(ops, ["32", "33", "34"]);
}

#[test]
fn srq_pingpong_with_four_qps_on_one_srq() {
    if !can_unshare("srq_pingpong_with_four_qps_on_one_srq") {
        return;
    }
    let r = pair(
        "srq",
        "ibv_srq_pingpong",
        &["-q", "4", "-n", "400", "-r", "8"],
        &["-q", "4", "-n", "400", "-r", "8"],
    );
    ok(&r);
    let (sl, sr) = (
        qpns(&r.server.1, "  local address:"),
        qpns(&r.server.1, "  remote address:"),
    );
    let (cl, cr) = (
        qpns(&r.client.1, "  local address:"),
        qpns(&r.client.1, "  remote address:"),
    );
    assert_eq!(sl.len(), 4, "{}", r.server.1);
    assert_eq!(
        (sl.clone(), cl.clone()),
        (cr, sr),
        "each side prints the other's QPNs"
    );
    let mut d = sl.clone();
    d.dedup();
    assert_eq!(d.len(), 4);
    for out in [&r.server.1, &r.client.1] {
        // -n counts messages over all QPs (srq_pingpong's rcnt/scnt): 4096 * 400 * 2
        assert!(out.contains("3276800 bytes in "), "{out}");
        assert!(out.contains("400 iters in "), "{out}");
    }
    // The client's requests go to all four of the server's QPs, its ACKs come back from them.
    let mut to_server: Vec<u64> = r
        .frames
        .iter()
        .filter(|f| f[1] == "127.0.0.2")
        .map(|f| hex(&f[3]))
        .collect();
    to_server.sort();
    to_server.dedup();
    let mut want: Vec<u64> = sl.iter().map(|q| hex(q)).collect();
    want.sort();
    assert_eq!(to_server, want);
}

#[test]
fn each_example_takes_its_own_flags() {
    let dir = links("flags");
    let run = |prog: &str, args: &[&str]| common::cli::run(&dir.join(prog), args);
    // ud_pingpong has no -m (getopt "p:d:i:s:r:n:l:eg:c"), uc_pingpong no -q.
    let (code, _, err) = run("ibv_ud_pingpong", &["-m", "1024", "-d", "lo"]);
    assert_eq!(code, 1, "rdma-core's examples return 1 after usage()");
    assert!(err.contains("invalid option -- 'm'"), "{err}");
    let (code, _, err) = run("ibv_uc_pingpong", &["-q", "2", "-d", "lo"]);
    assert_eq!(code, 1);
    assert!(err.contains("invalid option -- 'q'"), "{err}");
    // srq_pingpong's own checks, with its messages, exit status 1
    let (code, _, err) = run("ibv_srq_pingpong", &["-q", "600", "-d", "lo"]);
    assert_eq!(code, 1);
    assert!(
        err.contains(
            "rx_depth 500 is too small for 600 QPs -- must have at least one receive per QP."
        ),
        "{err}"
    );
    let (code, _, err) = run("ibv_srq_pingpong", &["-q", "300", "-r", "1000", "-d", "lo"]);
    assert_eq!(code, 1);
    assert!(err.contains("num_qp 300 must be less than 255"), "{err}");
    // ud_pingpong: a message must fit the port's MTU (lo's 65536 → 4096)
    let (code, _, err) = run(
        "ibv_ud_pingpong",
        &["-s", "5000", "-d", "lo", "--backend", "udp"],
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("Requested size larger than port MTU (4096)"),
        "{err}"
    );
    // the usage texts
    let (code, out, _) = run("ibv_srq_pingpong", &["-h"]);
    assert_eq!(code, 0);
    assert!(out.contains("-q, --num-qp=<num>     number of QPs to use (default 16)"));
    let (_, out, _) = run("ibv_ud_pingpong", &["-h"]);
    assert!(!out.contains("--mtu"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// perftest's `-c UC` (ferroce under perftest's names): SEND and WRITE over UC QPs, the data
/// checked byte for byte on the receiving side, UC opcodes only on the wire.
#[test]
fn perftest_over_uc() {
    if !can_unshare("perftest_over_uc") {
        return;
    }
    // UC has no retransmission: a burst larger than the socket buffers could lose packets
    // on loopback (and the run would stall), so the send queue is kept short.
    let args = [
        "-c", "UC", "-m", "1024", "-s", "4096", "-n", "200", "-t", "16", "--verify",
    ];
    let r = pair("ucsend", "ib_send_bw", &args, &args);
    ok(&r);
    assert!(
        r.client.1.contains("Connection type : UC"),
        "{}",
        r.client.1
    );
    // the receiver (server) checked every message
    assert!(
        r.server
            .1
            .contains("verify: ok: 200 messages, 819200 bytes"),
        "{}",
        r.server.1
    );
    let mut ops: Vec<&str> = r.frames.iter().map(|f| f[2].as_str()).collect();
    assert_eq!(
        ops.len(),
        800,
        "4 packets per 4 KiB message at MTU 1024, no ACKs"
    );
    ops.sort();
    ops.dedup();
    assert_eq!(ops, ["32", "33", "34"], "UC SEND FIRST/MIDDLE/LAST");
    let r = pair("ucwrite", "ib_write_bw", &args, &args);
    ok(&r);
    assert!(r.server.1.contains("verify: ok: "), "{}", r.server.1);
    let mut ops: Vec<&str> = r.frames.iter().map(|f| f[2].as_str()).collect();
    assert_eq!(ops.len(), 800);
    ops.sort();
    ops.dedup();
    // UC RDMA WRITE FIRST 38, MIDDLE 39, LAST 40
    assert_eq!(ops, ["38", "39", "40"]);
    let lat = ["-c", "UC", "-n", "300"];
    for prog in ["ib_send_lat", "ib_write_lat"] {
        let r = pair("uclat", prog, &lat, &lat);
        ok(&r);
        assert!(
            r.client.1.contains("Connection type : UC"),
            "{}",
            r.client.1
        );
        // 300 pings and 300 pongs of 2 bytes: UC SEND ONLY (36) or RDMA WRITE ONLY (42)
        let want = if prog == "ib_send_lat" { "36" } else { "42" };
        let n = r.frames.iter().filter(|f| f[2] == want).count();
        assert_eq!(n, 600, "{prog}: {:?}", &r.frames[..4.min(r.frames.len())]);
    }
}

/// perftest's `--use_srq` (ferroce as `ib_send_bw` / `ib_send_lat`): the receiving side's QPs
/// share one SRQ; every message arrives, checked byte for byte with one QP.
#[test]
fn perftest_with_an_srq() {
    if !can_unshare("perftest_with_an_srq") {
        return;
    }
    let args = ["--use-srq", "-q", "4", "-s", "4096", "-n", "300"];
    let r = pair("srqbw", "ib_send_bw", &args, &args);
    ok(&r);
    for out in [&r.server.1, &r.client.1] {
        assert!(out.contains("Using SRQ      : ON"), "{out}");
        // -n per QP: 4 x 300 messages counted on both sides
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with("4096 "))
            .unwrap_or_else(|| panic!("{out}"));
        assert_eq!(line.split_whitespace().nth(1), Some("1200"), "{line}");
    }
    // 1200 different RC SEND ONLY (4) requests from the client (RNR retries repeat some),
    // spread over the server's four QPs
    let mut reqs: Vec<(u64, u64)> = r
        .frames
        .iter()
        .filter(|f| f[1] == "127.0.0.2" && f[2] == "4")
        .map(|f| (hex(&f[3]), f[6].parse().unwrap()))
        .collect();
    reqs.sort();
    reqs.dedup();
    assert_eq!(reqs.len(), 1200);
    let mut dst: Vec<u64> = reqs.iter().map(|r| r.0).collect();
    dst.dedup();
    assert_eq!(dst.len(), 4);
    // --verify with four QPs on the SRQ: each message is checked as the k-th of the QP it
    // arrived on (the work completion's qp_num), whichever QP's receive it took
    let args = [
        "--use_srq",
        "-q",
        "4",
        "-s",
        "4096",
        "-n",
        "300",
        "--verify",
    ];
    let r = pair("srqbw1", "ib_send_bw", &args, &args);
    ok(&r);
    assert!(
        r.server
            .1
            .contains("verify: ok: 1200 messages, 4915200 bytes"),
        "{}",
        r.server.1
    );
    let lat = ["--use_srq", "-n", "300"];
    let r = pair("srqlat", "ib_send_lat", &lat, &lat);
    ok(&r);
    assert!(r.client.1.contains("Using SRQ      : ON"), "{}", r.client.1);
}

/// perftest's `-c UD` (ferroce as `ib_send_bw` / `ib_send_lat`): one UD SEND-only packet per
/// message, the message lowered to the MTU, Q_Key 0x11111111, every receive (behind its GRH
/// slot) checked byte for byte.
#[test]
fn perftest_over_ud() {
    if !can_unshare("perftest_over_ud") {
        return;
    }
    // -s 8192 > the MTU (lo: 4096): perftest lowers it to the MTU
    let args = [
        "-c", "UD", "-s", "8192", "-n", "300", "-t", "16", "--verify",
    ];
    let r = pair("udbw", "ib_send_bw", &args, &args);
    ok(&r);
    assert!(
        r.client.1.contains("Connection type : UD"),
        "{}",
        r.client.1
    );
    assert!(
        r.server
            .1
            .contains("verify: ok: 300 messages, 1228800 bytes"),
        "{}",
        r.server.1
    );
    let data: Vec<&Vec<String>> = r.frames.iter().filter(|f| f[1] == "127.0.0.2").collect();
    assert_eq!(data.len(), 300);
    for f in data {
        // 14 + 20 + 8 + 12 (BTH) + 8 (DETH) + 4096 + 4 (ICRC), UD SEND ONLY (100)
        assert_eq!((f[0].as_str(), f[2].as_str()), ("4162", "100"), "{f:?}");
        assert_eq!(f[4], "0x0000000011111111");
    }
    let lat = ["-c", "UD", "-s", "64", "-n", "300"];
    let r = pair("udlat", "ib_send_lat", &lat, &lat);
    ok(&r);
    assert!(
        r.client.1.contains("Connection type : UD"),
        "{}",
        r.client.1
    );
    assert_eq!(r.frames.iter().filter(|f| f[2] == "100").count(), 600);
}

/// On a one-CPU host nothing busy-polls (`runtime::single_cpu`): the latency tests sleep in the
/// packet device at once, a bandwidth test's engine thread sleeps without spinning first, and
/// read_lat's server runs the inline engine instead of a busy engine thread. Both processes
/// pinned to one CPU (`taskset -c 0`: `available_parallelism` is 1): every message arrives
/// byte for byte and every ping-pong completes all its iterations.
#[test]
fn perftest_on_one_cpu() {
    if !can_unshare("perftest_on_one_cpu") {
        return;
    }
    let one = "taskset -c 0 ";
    let bw = ["-s", "4096", "-n", "200", "--verify"];
    let r = pair_under("cpu1send", one, "ib_send_bw", &bw, &bw);
    ok(&r);
    assert!(
        r.server
            .1
            .contains("verify: ok: 200 messages, 819200 bytes"),
        "{}",
        r.server.1
    );
    let r = pair_under("cpu1write", one, "ib_write_bw", &bw, &bw);
    ok(&r);
    assert!(
        r.server.1.contains("verify: ok: 1 messages, 4096 bytes"),
        "{}",
        r.server.1
    );
    // READ (responses through the responder's side of the engine): all 200 complete.
    let r = pair_under("cpu1read", one, "ib_read_bw", &bw[..4], &bw[..4]);
    ok(&r);
    assert_eq!(
        iterations(&r.client.1, "4096"),
        Some("200"),
        "{}",
        r.client.1
    );
    for prog in ["ib_send_lat", "ib_read_lat", "ib_write_lat"] {
        let lat = ["-s", "64", "-n", "300"];
        let r = pair_under("cpu1lat", one, prog, &lat, &lat);
        ok(&r);
        assert_eq!(
            iterations(&r.client.1, "64"),
            Some("300"),
            "{prog}: {}",
            r.client.1
        );
    }
}

/// ib_read_bw --verify between two ferroce processes: the passive side's buffer holds
/// perftest's fill (`srand(time(NULL))`, then `(char)rand()` per byte), so every READ the
/// client checks finds it (before, the server's memory was zeros and the check failed).
#[test]
fn read_bw_verify_between_two_ferroce() {
    if !can_unshare("read_bw_verify_between_two_ferroce") {
        return;
    }
    for (s, n) in [("4096", "200"), ("65536", "50")] {
        let a = ["-s", s, "-n", n, "--verify"];
        let r = pair("readverify", "ib_read_bw", &a[..4], &a);
        ok(&r);
        assert_eq!(iterations(&r.client.1, s), Some(n), "{}", r.client.1);
        let bytes = n.parse::<u64>().unwrap() * s.parse::<u64>().unwrap();
        assert!(
            r.client
                .1
                .contains(&format!("verify: ok: {n} messages, {bytes} bytes")),
            "{}\n{}",
            r.client.1,
            r.client.2
        );
    }
}

/// The iteration count of a perftest result line (`SIZE ITERATIONS ...`).
fn iterations<'a>(out: &'a str, size: &str) -> Option<&'a str> {
    out.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.len() > 4 && w[0] == size).then(|| w[1])
    })
}
