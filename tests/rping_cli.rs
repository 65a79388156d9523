//! `rping` (a link to the ferroce binary) between two ferroce processes: the UDP backend on
//! loopback in a network namespace of a user namespace (`unshare -rn`) whose `lo` has
//! 127.0.0.1 (server) and 127.0.0.2 (client). What the lines, statuses and the protocol must
//! be is rdma-core's rping (librdmacm/examples/rping.c); against Debian's real rping and
//! Linux rxe: tools/interop-rxe (rping cases).

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};

fn links(test: &str) -> PathBuf {
    common::cli::links("rping", test)
}

fn can_unshare(test: &str) -> bool {
    common::net::can_unshare("rping_cli", test)
}

/// Runs `script` (with $R the rping link, $D a scratch directory) in a fresh namespace;
/// returns the named files' contents.
fn ns(test: &str, script: &str, files: &[&str]) -> Vec<String> {
    let dir = links(test);
    let full = format!(
        "ip link set lo up && ip addr add 127.0.0.2/8 dev lo || exit 99\nR={r}\nD={d}\n{script}",
        r = dir.join("rping").display(),
        d = dir.display()
    );
    let st = Command::new("unshare")
        .args(["-rn", "sh", "-c", &full])
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "namespace script: {st}");
    let v = files
        .iter()
        .map(|f| std::fs::read_to_string(dir.join(f)).unwrap_or_default())
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    v
}

const OPTS: &str = "--ib-dev lo --backend udp";

#[test]
fn ping_ten_times_with_validation() {
    if !can_unshare("ping") {
        return;
    }
    let r = ns(
        "ping",
        &format!(
            "$R -s -v -S 100 -a 127.0.0.1 {OPTS} >$D/s.out 2>$D/s.err & S=$!\n\
             sleep 0.3\n\
             timeout 30 $R -c -v -V -C 10 -S 100 -a 127.0.0.1 -I 127.0.0.2 {OPTS} >$D/c.out 2>$D/c.err; echo $? >$D/c.rc\n\
             wait $S; echo $? >$D/s.rc"
        ),
        &["s.out", "s.err", "s.rc", "c.out", "c.err", "c.rc"],
    );
    let (sout, serr, src, cout, cerr, crc) = (&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]);
    assert_eq!(crc.trim(), "0", "client: {cerr}");
    assert_eq!(src.trim(), "0", "server: {serr}");
    let client: Vec<&str> = cout.lines().collect();
    assert_eq!(client.len(), 10, "{cout}");
    // rping's pattern: "rdma-ping-N: " then characters from 'A' + N, cycling 65..=122,
    // up to size - 1 (99) characters.
    for (n, l) in client.iter().enumerate() {
        let data = l.strip_prefix("ping data: ").unwrap();
        assert_eq!(data.len(), 99);
        let head = format!("rdma-ping-{n}: ");
        assert!(data.starts_with(&head), "{l}");
        let first = data.as_bytes()[head.len()];
        assert_eq!(first, b'A' + n as u8);
    }
    let server: Vec<&str> = sout
        .lines()
        .map(|l| l.strip_prefix("server ping data: ").unwrap())
        .collect();
    let client_data: Vec<&str> = client
        .iter()
        .map(|l| l.strip_prefix("ping data: ").unwrap())
        .collect();
    assert_eq!(server, client_data);
    assert_eq!(
        serr.lines().collect::<Vec<_>>(),
        [
            "server DISCONNECT EVENT...",
            "wait for RDMA_READ_ADV state 10"
        ]
    );
}

#[test]
fn nothing_listens_is_rejected() {
    if !can_unshare("rej") {
        return;
    }
    // A persistent server on 7174; the client asks for 7175.
    let r = ns(
        "rej",
        &format!(
            "$R -s -P -a 127.0.0.1 {OPTS} >/dev/null 2>&1 & S=$!\n\
             sleep 0.3\n\
             timeout 30 $R -c -C 1 -p 7175 -a 127.0.0.1 -I 127.0.0.2 {OPTS} >$D/c.out 2>$D/c.err; echo $? >$D/c.rc\n\
             kill $S"
        ),
        &["c.err", "c.rc"],
    );
    assert_eq!(r[1].trim(), "255");
    assert_eq!(r[0].trim(), "cma event RDMA_CM_EVENT_REJECTED, error 8");
}

#[test]
fn bad_arguments() {
    let dir = links("args");
    let run = |args: &[&str]| {
        let o = Command::new(dir.join("rping")).args(args).output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, out, _) = run(&["-v"]);
    assert_eq!(code, Some(22));
    assert!(out.starts_with("rping -s [-vVd]"), "{out}");
    let (code, _, err) = run(&["-s", "-S", "10"]);
    assert_eq!(code, Some(22));
    assert_eq!(err.trim(), "Invalid size 10 (valid range is 26 to 65536)");
    let (code, _, err) = run(&["-c", "-C", "-5"]);
    assert_eq!(code, Some(22));
    assert_eq!(err.trim(), "Invalid count -5");
    let _ = std::fs::remove_dir_all(&dir);
}
