//! Routes and neighbours over rtnetlink (`ferroce::io::route`, `netdev::resolve_mac`)
//! against iproute2's answers (`ip route get`, `ip neigh show`) on the testbed: hosts A and B
//! in namespaces with default routes via the router R (prefix `fn`), IPv4 and IPv6.
//!
//! Needs root (namespaces); it fails instead of skipping. Checked:
//! - `route_get` gives the gateway, output interface and source address `ip route get`
//!   prints, for destinations behind R, on a connected network and local;
//! - a destination without a route (R has no default route) is `RouteError::NoRoute`, where
//!   `ip route get` fails too; an `unreachable` route is `NoRoute`, `blackhole` and
//!   `prohibit` routes are `Refused`;
//! - `neighbours` lists what `ip neigh show nud all` lists (address, interface, link-layer
//!   address, state), both families, in A and in R;
//! - `resolve_mac` finds R's MAC for B's addresses after A's neighbour table was flushed (it
//!   primes the entry with a datagram, as before), and a next hop nobody answers for is
//!   `RouteError::NoNeighbour`.

mod common;

use common::net::{in_ns, must, run_cmd, Testbed};
use ferroce::io::netdev;
use ferroce::io::route::{self, Neighbour, RouteError};
use ferroce::wire::MacAddr;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

const PREFIX: &str = "fn";
const NS_A: &str = "fna";
const NS_R: &str = "fnr";
const RA_MAC: MacAddr = MacAddr([0x02, 0xfe, 0x61, 0x01, 0x00, 0x01]);

fn ip_addr(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// `ip ARGS`: (success, stdout + stderr).
fn ip(args: &[&str]) -> (bool, String) {
    run_cmd(&[&["ip"], args].concat())
}

fn must_ip(args: &[&str]) -> String {
    must(&[&["ip"], args].concat())
}

/// The word after `key` in `ip`'s output.
fn after<'a>(words: &[&'a str], key: &str) -> Option<&'a str> {
    let i = words.iter().position(|w| *w == key)?;
    words.get(i + 1).copied()
}

/// The interface index of `dev` in `ns`.
fn ifindex(ns: &'static str, dev: &str) -> u32 {
    let dev = dev.to_string();
    in_ns(ns, move || ferroce::io::if_nametoindex(&dev).unwrap())
}

/// `ip route get DST` in `ns` and ferroce's answer agree on the gateway, the interface and
/// the source address.
fn check_route(ns: &'static str, dst: &str, want_gateway: Option<&str>) {
    let text = must_ip(&["-n", ns, "route", "get", dst]);
    let words: Vec<&str> = text.split_whitespace().collect();
    let dst = ip_addr(dst);
    let ours = in_ns(ns, move || route::route_get(dst)).unwrap_or_else(|e| panic!("{e}"));
    let via = after(&words, "via").map(ip_addr);
    assert_eq!(ours.gateway, via, "{ns} {dst}: ip says {text}");
    assert_eq!(ours.gateway, want_gateway.map(ip_addr), "{ns} {dst}");
    let dev = after(&words, "dev").expect("dev");
    assert_eq!(
        ours.oif,
        Some(ifindex(ns, dev)),
        "{ns} {dst}: ip says {text}"
    );
    assert_eq!(
        ours.prefsrc,
        after(&words, "src").map(ip_addr),
        "{ns} {dst}: ip says {text}"
    );
    assert_eq!(ours.local, words.first() == Some(&"local"), "{text}");
    assert_eq!(ours.next_hop(), via.unwrap_or(dst));
}

/// The kernel's answer to a lookup that `ip route get` also refuses.
fn route_error(ns: &'static str, dst: &str) -> RouteError {
    let (ok, text) = ip(&["-n", ns, "route", "get", dst]);
    assert!(!ok, "ip route get {dst} in {ns} succeeded: {text}");
    let dst = ip_addr(dst);
    in_ns(ns, move || route::route_get(dst))
        .err()
        .unwrap_or_else(|| panic!("a route to {dst} in {ns}"))
}

/// One neighbour entry as text: address, interface index, link-layer address, state.
type Entry = (IpAddr, u32, Option<String>, String);

fn ours(n: &Neighbour) -> Entry {
    (
        n.ip,
        n.ifindex,
        n.mac.map(|m| m.to_string()),
        format!("{:?}", n.state).to_uppercase(),
    )
}

/// `ip -4|-6 neigh show nud all` in `ns`.
fn theirs(ns: &'static str, v6: bool) -> BTreeSet<Entry> {
    let fam = if v6 { "-6" } else { "-4" };
    let text = must_ip(&["-n", ns, fam, "neigh", "show", "nud", "all"]);
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let dev = after(&w, "dev").expect("dev");
            (
                ip_addr(w[0]),
                ifindex(ns, dev),
                after(&w, "lladdr").map(str::to_string),
                w.last().unwrap().to_string(),
            )
        })
        .collect()
}

/// ferroce's and iproute2's neighbour tables of `ns` are the same (read again if an entry
/// changed state between the two reads).
fn check_neighbours(ns: &'static str, v6: bool) -> usize {
    for attempt in 0.. {
        let a: BTreeSet<Entry> = in_ns(ns, move || route::neighbours(v6))
            .unwrap()
            .iter()
            .map(ours)
            .collect();
        let b = theirs(ns, v6);
        if a == b {
            return a.len();
        }
        assert!(attempt < 5, "{ns} v6={v6}:\n ours   {a:?}\n theirs {b:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    unreachable!()
}

#[test]
fn routes_and_neighbours_agree_with_iproute2() {
    require_root!("netlink_routes", "network namespaces: CAP_SYS_ADMIN");
    let _tb = Testbed::up(PREFIX, &[]);

    // Routes: behind R (via R), on the connected network, local; IPv4 and IPv6.
    check_route(NS_A, "10.61.2.2", Some("10.61.1.1"));
    check_route(NS_A, "fd61:2::2", Some("fd61:1::1"));
    check_route(NS_A, "10.61.1.1", None);
    check_route(NS_A, "fd61:1::1", None);
    check_route(NS_A, "10.61.1.2", None);
    check_route(NS_R, "10.61.2.2", None);
    check_route(NS_R, "fd61:1::2", None);

    // No route: R has no default route.
    for dst in ["203.0.113.7", "2001:db8::7"] {
        match route_error(NS_R, dst) {
            RouteError::NoRoute { dst: d, source } => {
                assert_eq!(d, ip_addr(dst));
                assert_eq!(source.raw_os_error(), Some(libc::ENETUNREACH), "{source}");
            }
            e => panic!("{dst}: {e:?}"),
        }
    }
    // Routes that refuse: unreachable (no route to host), blackhole, prohibit.
    must_ip(&["-n", NS_R, "route", "add", "unreachable", "198.51.100.0/24"]);
    must_ip(&["-n", NS_R, "route", "add", "blackhole", "198.51.101.0/24"]);
    must_ip(&["-n", NS_R, "route", "add", "prohibit", "198.51.102.0/24"]);
    let e = route_error(NS_R, "198.51.100.1");
    assert!(matches!(e, RouteError::NoRoute { .. }), "{e:?}");
    assert!(e.to_string().starts_with("no route to 198.51.100.1"), "{e}");
    for dst in ["198.51.101.1", "198.51.102.1"] {
        let e = route_error(NS_R, dst);
        assert!(matches!(e, RouteError::Refused { .. }), "{dst}: {e:?}");
    }

    // Neighbours: fill the tables with traffic both ways (A -> B through R), then compare.
    must_ip(&[
        "netns",
        "exec",
        NS_A,
        "ping",
        "-c",
        "1",
        "-W",
        "2",
        "10.61.2.2",
    ]);
    must_ip(&[
        "netns",
        "exec",
        NS_A,
        "ping",
        "-6",
        "-c",
        "1",
        "-W",
        "2",
        "fd61:2::2",
    ]);
    for ns in [NS_A, NS_R] {
        let n4 = check_neighbours(ns, false);
        let n6 = check_neighbours(ns, true);
        assert!(n4 >= 1 && n6 >= 1, "{ns}: {n4} IPv4 and {n6} IPv6 entries");
    }
    let r = in_ns(NS_R, || route::neighbour(ip_addr("10.61.1.2"), None))
        .unwrap()
        .expect("R knows A");
    assert!(r.usable_mac().is_some(), "{r:?}");

    // resolve_mac primes a missing entry, as before: flush A's table, then resolve B's
    // addresses (next hop R) and R's own.
    must_ip(&["-n", NS_A, "neigh", "flush", "all"]);
    let before = in_ns(NS_A, || route::neighbour(ip_addr("10.61.1.1"), None)).unwrap();
    assert!(
        before.as_ref().and_then(Neighbour::usable_mac).is_none(),
        "flushed, yet {before:?}"
    );
    for dst in ["10.61.2.2", "fd61:2::2", "10.61.1.1", "fd61:1::1"] {
        let d = ip_addr(dst);
        let mac = in_ns(NS_A, move || {
            netdev::resolve_mac(d, Some("eth0"), Duration::from_secs(3))
        })
        .unwrap_or_else(|e| panic!("resolve {dst}: {e}"));
        assert_eq!(mac, RA_MAC, "{dst}");
    }
    // ... and what iproute2 then shows for R agrees.
    let text = must_ip(&["-n", NS_A, "neigh", "show", "10.61.1.1"]);
    let w: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(
        after(&w, "lladdr"),
        Some(RA_MAC.to_string().as_str()),
        "{text}"
    );

    // A next hop that never answers.
    let e = in_ns(NS_A, || {
        netdev::resolve_mac(
            ip_addr("10.61.1.99"),
            Some("eth0"),
            Duration::from_millis(300),
        )
    })
    .expect_err("nobody has 10.61.1.99");
    match e {
        RouteError::NoNeighbour { dst, ip } => {
            assert_eq!((dst, ip), (ip_addr("10.61.1.99"), ip_addr("10.61.1.99")));
        }
        e => panic!("{e:?}"),
    }
    // resolve (Option) says the same, and a missing route is an error before any waiting.
    assert_eq!(
        in_ns(NS_R, || netdev::resolve(
            ip_addr("203.0.113.7"),
            None,
            Duration::from_secs(60)
        )),
        None
    );
    let e = in_ns(NS_R, || netdev::next_hop(ip_addr("2001:db8::9"))).unwrap_err();
    assert!(matches!(e, RouteError::NoRoute { .. }), "{e:?}");
}
