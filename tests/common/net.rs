//! Helpers of the tests that need root and network namespaces (`tools/testbed`): the root
//! check (skip with a printed reason when not root, fail under `tools/test`), running code
//! inside a namespace, and resolving neighbours before traffic.

use ferroce::io::enter_netns;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::process::Command;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The effective user id, from `/proc/self/status` (`?` if unreadable).
pub fn euid() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("?")
        .to_string()
}

/// Under this environment variable (`FERROCE_REQUIRE_ROOT=1`, which `tools/test` sets), a
/// test that needs root fails when it is not root instead of skipping: the suite CI runs
/// never passes such a test by skipping it.
pub const REQUIRE_ROOT_ENV: &str = "FERROCE_REQUIRE_ROOT";

/// Whether the calling test can run: true as root. Otherwise, with [`REQUIRE_ROOT_ENV`] set,
/// it fails; without, it prints why the test is skipped on the terminal (past the test
/// harness's output capture, so a plain `cargo test` shows it) and returns false. `test`
/// names the test target (`packet_backends`), `needs` what it uses (namespaces,
/// AF_PACKET...). Use it through [`require_root!`](crate::require_root).
#[track_caller]
pub fn root_or_skip(test: &str, needs: &str) -> bool {
    use std::io::Write;
    let euid = euid();
    if euid == "0" {
        return true;
    }
    let required = std::env::var_os(REQUIRE_ROOT_ENV).is_some_and(|v| v != "0" && !v.is_empty());
    assert!(
        !required,
        "tests/{test}.rs must run as root ({needs}); effective uid is {euid}, and \
         {REQUIRE_ROOT_ENV} is set (tools/test), so it fails instead of skipping."
    );
    let name = thread::current()
        .name()
        .unwrap_or("(unnamed test)")
        .to_string();
    // Straight to the file descriptor, in one write: `eprintln!` would be captured with the
    // test's output.
    let line = format!(
        "skipped {test}::{name}: needs root ({needs}); effective uid is {euid} (run as root, \
         or tools/test)\n"
    );
    let _ = std::io::stderr().write_all(line.as_bytes());
    false
}

/// Whether `unshare -rn` works here (root, or unprivileged user namespaces): tests that need
/// only a network namespace of their own run in one without privilege. If not, the test is
/// skipped with a line saying so (`target::test`), unless it runs as root (then it fails).
pub fn can_unshare(target: &str, test: &str) -> bool {
    use std::io::Write;
    let ok = Command::new("unshare")
        .args(["-rn", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(euid() != "0", "unshare -rn fails as root");
        let _ = std::io::stderr().write_all(
            format!("skipped {target}::{test}: unshare -rn (user namespaces) unavailable\n")
                .as_bytes(),
        );
    }
    ok
}

/// Return from the calling test (which then passes, with a line saying it was skipped) unless
/// it runs as root; fail instead with `FERROCE_REQUIRE_ROOT=1` (see
/// [`root_or_skip`](crate::common::net::root_or_skip)).
#[macro_export]
macro_rules! require_root {
    ($test:expr, $needs:expr) => {
        if !$crate::common::net::root_or_skip($test, $needs) {
            return;
        }
    };
}

/// Run `f` in a new thread, named after the namespace, inside network namespace `ns`.
pub fn spawn_in_ns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let name = ns.to_string();
    thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            enter_netns(&name).unwrap_or_else(|e| panic!("enter_netns({name}): {e}"));
            f()
        })
        .expect("spawn")
}

/// Wait for a thread, re-raising its panic (with its own message).
pub fn join<T>(h: JoinHandle<T>) -> T {
    h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// [`spawn_in_ns`] and [`join`]: run `f` inside `ns` and return its result.
pub fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    join(spawn_in_ns(ns, f))
}

/// Resolve the neighbours a test's traffic needs before it starts, so that no frame waits
/// for (or is lost to) ARP or neighbour discovery: from each `(namespace, destination)`, a
/// few UDP datagrams to the destination's discard port (9); then wait until the neighbour
/// table of `router` has a link-layer address for every address in `expect`. Panics after
/// `timeout` with the table.
#[track_caller]
pub fn prime_neighbours(
    sends: &[(&str, IpAddr)],
    router: &str,
    expect: &[IpAddr],
    timeout: Duration,
) {
    for &(ns, dst) in sends {
        in_ns(ns, move || {
            let bind: IpAddr = if dst.is_ipv4() {
                Ipv4Addr::UNSPECIFIED.into()
            } else {
                Ipv6Addr::UNSPECIFIED.into()
            };
            let s = UdpSocket::bind((bind, 0)).expect("bind");
            for _ in 0..3 {
                let _ = s.send_to(b"prime", (dst, 9));
            }
        });
    }
    let t0 = Instant::now();
    loop {
        let out = Command::new("ip")
            .args(["-n", router, "neigh", "show"])
            .output()
            .expect("ip neigh");
        let table = String::from_utf8_lossy(&out.stdout);
        let known = |ip: &IpAddr| {
            table
                .lines()
                .any(|l| l.starts_with(&format!("{ip} ")) && l.contains("lladdr"))
        };
        if expect.iter().all(known) {
            return;
        }
        assert!(
            t0.elapsed() < timeout,
            "{router} never resolved {expect:?}:\n{table}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Run `cmd[0]` with the rest as arguments: (success, standard output then standard error).
pub fn run_cmd(cmd: &[&str]) -> (bool, String) {
    let out = Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// [`run_cmd`], failing the test unless the command succeeds; its output.
pub fn must(cmd: &[&str]) -> String {
    let (ok, text) = run_cmd(cmd);
    assert!(ok, "{cmd:?} failed:\n{text}");
    text
}

/// `tools/testbed` with namespaces `PREFIX`a, `PREFIX`r, `PREFIX`b, up for the life of the
/// value (torn down on drop, also when the test panics).
pub struct Testbed {
    /// The path of `tools/testbed` (to run it again, e.g. `up --force` with other options).
    pub script: String,
    prefix: &'static str,
}

impl Testbed {
    /// `tools/testbed up --prefix PREFIX EXTRA...`, after taking down a leftover of an
    /// interrupted run (which would make `up` refuse).
    pub fn up(prefix: &'static str, extra: &[&str]) -> Testbed {
        let script = format!("{}/tools/testbed", env!("CARGO_MANIFEST_DIR"));
        let _ = run_cmd(&[&script, "down", "--prefix", prefix]);
        let tb = Testbed { script, prefix };
        let mut up = vec![tb.script.as_str(), "up", "--prefix", prefix];
        up.extend_from_slice(extra);
        must(&up);
        tb
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let _ = run_cmd(&[&self.script, "down", "--prefix", self.prefix]);
    }
}
