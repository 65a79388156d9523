//! Helpers of the tests that need root and network namespaces (`tools/testbed`): the root
//! check, running code inside a namespace, and resolving neighbours before traffic.

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

/// Fail unless the test runs as root. `test` names the test target (`packet_backends`) and
/// `needs` what it uses (namespaces, AF_PACKET...). These tests fail instead of skipping, so
/// that a CI without root cannot pass them silently.
#[track_caller]
pub fn require_root(test: &str, needs: &str) {
    let euid = euid();
    assert!(
        euid == "0",
        "tests/{test}.rs must run as root ({needs}); effective uid is {euid}. Run \
         `sudo cargo test --release --test {test}`. It fails instead of skipping so that a CI \
         without root cannot pass it silently."
    );
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
