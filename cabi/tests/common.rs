//! Shared by the cabi tests: the built library, prerequisites, and two processes on one host
//! in an unprivileged network namespace.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A missing prerequisite: a failure under FERROCE_REQUIRE_DEPS=1 (tools/test installs them
/// all), otherwise the test is skipped with the reason printed.
pub fn have(ok: bool, test: &str, what: &str) -> bool {
    if !ok {
        if std::env::var_os("FERROCE_REQUIRE_DEPS").is_some_and(|v| v == "1") {
            panic!("{test}: missing prerequisite: {what}");
        }
        eprintln!("skipped {test}: {what} unavailable");
    }
    ok
}

pub fn which(p: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {p}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A finished program's output, then its errors, as text.
pub fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// tools/build-cabi, once per test binary: the directory holding libibverbs.so.1.
pub fn lib_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new(repo().join("tools/build-cabi"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tools/build-cabi: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let p = repo().join(String::from_utf8_lossy(&out.stdout).trim());
        p.parent().unwrap().to_path_buf()
    })
    .clone()
}

/// The ferroce binary of this tree (built if needed).
pub fn ferroce_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let st = Command::new("cargo")
            .args(["build", "--release", "-q", "--bin", "ferroce"])
            .current_dir(repo())
            .status()
            .unwrap();
        assert!(st.success());
        repo().join("target/release/ferroce")
    })
    .clone()
}

pub fn can_unshare(test: &str) -> bool {
    let ok = Command::new("unshare")
        .args(["-rn", "true"])
        .status()
        .is_ok_and(|s| s.success());
    have(
        ok,
        test,
        "unshare -rn (unprivileged user and network namespaces)",
    )
}

/// Run `script` with sh in a new user and network namespace whose loopback has 127.0.0.1 and
/// 127.0.0.2, with $LIB the library's directory and $F the ferroce binary. Returns its output.
pub fn in_netns(script: &str) -> Output {
    in_netns_lo(
        "ip link set lo up && ip addr add 127.0.0.2/8 dev lo || exit 99",
        script,
    )
}

/// [`in_netns`] with `setup` instead of its loopback setup (`lo` brought up by it, with only
/// the addresses it gives).
pub fn in_netns_lo(setup: &str, script: &str) -> Output {
    let full = format!("{setup}\nexport FERROCE_DEV=lo\n{script}");
    Command::new("unshare")
        .args(["-rn", "sh", "-c", &full])
        .env("LIB", lib_dir())
        .env("F", ferroce_bin())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// What shows that a server is ready for its client: a listening TCP socket (the
/// out-of-band exchange of rdma-core's examples and perftest), or a UDP socket (RDMA-CM
/// programs: the UDP backend's socket; the program listens right after it opens the device).
#[derive(Clone, Copy, Debug)]
pub enum Ready {
    /// `ss -Hltn` lists a socket.
    TcpListen,
    /// `ss -Huan` lists a socket.
    Udp,
    /// A program on ferroce's librdmacm listens (it writes `$L`, the file FERROCE_LISTENING
    /// names).
    CmListen,
}

/// A server and a client program, each with ferroce's library and its own address, run to the
/// end (30 s at most each); the client starts once the server listens on TCP. Returns
/// (server output, client output, status line).
pub fn pair(server: &str, client: &str) -> (String, String, String) {
    pair_when(Ready::TcpListen, server, client)
}

/// [`pair`], the client starting when `ready` shows the server's socket (polled every 50 ms,
/// for 20 s at most: then the client starts anyway and the test reports what it sees). The
/// namespace is the test's own, so the only sockets in it are the server's.
pub fn pair_when(ready: Ready, server: &str, client: &str) -> (String, String, String) {
    let dir = std::env::temp_dir().join(format!(
        "ferroce-cabi-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let (s, c, l) = (
        dir.join("server.out"),
        dir.join("client.out"),
        dir.join("listening"),
    );
    // `$G` in a command: the GID index of that side's address as Linux numbers lo's
    // (127.0.0.1, 127.0.0.2, ::1), which the library's table keeps.
    let (server, client) = (server.replace("$G", "0"), client.replace("$G", "1"));
    let script = format!(
        "export LD_LIBRARY_PATH=$LIB\n\
         FERROCE_LISTENING={l} FERROCE_ADDR=127.0.0.1 timeout 30 {server} > {s} 2>&1 &\n\
         i=0; while [ $i -lt 400 ] && ! {ready}; do sleep 0.05; i=$((i+1)); done\n\
         FERROCE_ADDR=127.0.0.2 timeout 30 {client} 127.0.0.1 > {c} 2>&1\n\
         cs=$?\nwait $!\necho \"server=$? client=$cs\"",
        s = s.display(),
        c = c.display(),
        l = l.display(),
        ready = match ready {
            Ready::TcpListen => "[ -n \"$(ss -Hltn)\" ]".to_string(),
            Ready::Udp => "[ -n \"$(ss -Huan)\" ]".to_string(),
            Ready::CmListen => format!("[ -e {} ]", l.display()),
        }
    );
    let out = in_netns(&script);
    let r = (
        std::fs::read_to_string(&s).unwrap_or_default(),
        std::fs::read_to_string(&c).unwrap_or_default(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    );
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// Runs `test` of the calling test binary again inside `unshare -rn` with `lo` up (no
/// privilege needed), marked by the environment variable `child`: true when this is that run
/// (the caller then does the work), false after the child passed (or when namespaces are not
/// available: said, and skipped).
pub fn reexec_in_netns(test: &str, child: &str) -> bool {
    if std::env::var_os(child).is_some() {
        return true;
    }
    if !can_unshare(test) {
        return false;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .args(["-rn", "sh", "-c", "ip link set lo up && exec \"$0\" \"$@\""])
        .arg(&exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(child, "1")
        .output()
        .unwrap();
    let text = output_text(&out);
    assert!(out.status.success(), "{test} in its namespace:\n{text}");
    assert!(
        text.contains("1 passed"),
        "{test} did not run in its namespace:\n{text}"
    );
    eprint!("{text}");
    false
}
