//! Interfaces and neighbours: the GID table of a port, built from its IP addresses, and the
//! MAC address of a peer, from the kernel's neighbour table.
//!
//! The GID table is ordered as Linux numbers it for a RoCE v2 port: IPv6 link-local first,
//! then the IPv4 addresses (as IPv4-mapped GIDs `::ffff:a.b.c.d`), then the other IPv6
//! addresses. On a host with one IPv4 and one global IPv6 address that gives rxe's indexes:
//! 0 link-local, 1 IPv4, 2 IPv6 global.

use crate::wire::MacAddr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::time::{Duration, Instant};

/// What ferroce needs to know about a network interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Netdev {
    pub name: String,
    pub index: u32,
    pub mac: MacAddr,
    pub mtu: Option<u32>,
    /// The GID table, in Linux's order.
    pub gids: Vec<IpAddr>,
}

fn is_link_local(a: &Ipv6Addr) -> bool {
    (a.segments()[0] & 0xffc0) == 0xfe80
}

/// Order addresses as Linux's RoCE GID table does.
pub fn gid_order(addrs: &[IpAddr]) -> Vec<IpAddr> {
    let ll = addrs
        .iter()
        .filter(|a| matches!(a, IpAddr::V6(v) if is_link_local(v)));
    let v4 = addrs.iter().filter(|a| a.is_ipv4());
    let v6 = addrs
        .iter()
        .filter(|a| matches!(a, IpAddr::V6(v) if !is_link_local(v)));
    ll.chain(v4).chain(v6).copied().collect()
}

/// Look an interface up by name, in the calling thread's network namespace (a thread that
/// entered another namespace sees that namespace's interfaces, MTUs and neighbours).
pub fn netdev(name: &str) -> io::Result<Netdev> {
    let ifs = pnet_datalink::interfaces();
    let i = ifs.into_iter().find(|i| i.name == name).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no interface named {name:?}"),
        )
    })?;
    let mac = i.mac.map(|m| MacAddr(m.octets())).unwrap_or(MacAddr::ZERO);
    let addrs: Vec<IpAddr> = i.ips.iter().map(|n| n.ip()).collect();
    // An ioctl, not /sys/class/net/NAME/mtu: sysfs shows the namespace it was mounted in,
    // not the calling thread's (see `sys::if_mtu`).
    let mtu = super::sys::if_mtu(name).ok();
    Ok(Netdev {
        name: i.name,
        index: i.index,
        mac,
        mtu,
        gids: gid_order(&addrs),
    })
}

/// Every interface with its GID table.
pub fn netdevs() -> Vec<Netdev> {
    pnet_datalink::interfaces()
        .into_iter()
        .filter_map(|i| netdev(&i.name).ok())
        .collect()
}

/// The path MTU (payload bytes per packet, an IBTA value) an Ethernet MTU allows, as Linux
/// does for RoCE: 1500 → 1024, 9000 → 4096.
pub fn ib_mtu_for(eth_mtu: u32) -> crate::ib::Mtu {
    use crate::ib::Mtu;
    // Room for IPv6 (40) + UDP (8) + BTH and the largest request headers (12 + 16 + 4) + ICRC (4).
    let room = eth_mtu.saturating_sub(40 + 8 + 32 + 4);
    [Mtu::M4096, Mtu::M2048, Mtu::M1024, Mtu::M512, Mtu::M256]
        .into_iter()
        .find(|m| m.bytes() <= room)
        .unwrap_or(Mtu::M256)
}

/// Parse `/proc/net/arp` for `ip` on `dev` (complete entries only).
pub fn arp_lookup(table: &str, ip: Ipv4Addr, dev: Option<&str>) -> Option<MacAddr> {
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[0].parse::<Ipv4Addr>().ok() != Some(ip) {
            continue;
        }
        if dev.is_some_and(|d| d != f[5]) {
            continue;
        }
        // Flags 0x2 = complete.
        let flags = u32::from_str_radix(f[2].trim_start_matches("0x"), 16).unwrap_or(0);
        if flags & 2 == 0 {
            continue;
        }
        let mac: MacAddr = f[3].parse().ok()?;
        if mac != MacAddr::ZERO {
            return Some(mac);
        }
    }
    None
}

/// Parse `ip -6 neigh show` output for `ip`.
pub fn ndp_lookup(out: &str, ip: Ipv6Addr) -> Option<MacAddr> {
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first().and_then(|a| a.parse::<Ipv6Addr>().ok()) != Some(ip) {
            continue;
        }
        if f.iter().any(|w| matches!(*w, "FAILED" | "INCOMPLETE")) {
            continue;
        }
        let i = f.iter().position(|w| *w == "lladdr")?;
        return f.get(i + 1)?.parse().ok();
    }
    None
}

/// The calling thread's ARP table. `/proc/net` is a link to `/proc/self/net`, which shows the
/// namespace of the process's main thread; `/proc/thread-self/net` (Linux 3.17) shows this
/// thread's, which differs when the thread entered another namespace.
fn arp_table() -> Option<String> {
    std::fs::read_to_string("/proc/thread-self/net/arp")
        .or_else(|_| std::fs::read_to_string("/proc/net/arp"))
        .ok()
}

fn kernel_lookup(ip: IpAddr, dev: Option<&str>) -> Option<MacAddr> {
    match ip {
        IpAddr::V4(v4) => arp_lookup(&arp_table()?, v4, dev),
        IpAddr::V6(v6) => {
            let out = std::process::Command::new("ip")
                .args(["-6", "neigh", "show", &v6.to_string()])
                .output()
                .ok()?;
            ndp_lookup(&String::from_utf8_lossy(&out.stdout), v6)
        }
    }
}

/// Parse `ip route get` output: the gateway if the route has one, else the destination itself.
pub fn parse_route_get(out: &str, dst: IpAddr) -> IpAddr {
    let f: Vec<&str> = out.split_whitespace().collect();
    f.iter()
        .position(|w| *w == "via")
        .and_then(|i| f.get(i + 1))
        .and_then(|g| g.parse().ok())
        .unwrap_or(dst)
}

/// The next hop towards `dst` per the kernel's routing table (the gateway, or `dst` itself
/// when it is on a connected subnet).
pub fn next_hop(dst: IpAddr) -> IpAddr {
    match std::process::Command::new("ip")
        .args(["route", "get", &dst.to_string()])
        .output()
    {
        Ok(o) if o.status.success() => parse_route_get(&String::from_utf8_lossy(&o.stdout), dst),
        _ => dst,
    }
}

/// The destination MAC address for packets to `ip`: that of the next hop (the gateway when
/// `ip` is not on a connected subnet), from the kernel's neighbour table. If the kernel has no
/// entry, make it resolve one: a datagram to the discard port (9) of `ip` from a plain UDP
/// socket sends the ARP request / neighbour solicitation for the next hop; then wait up to
/// `timeout`.
pub fn resolve(dst: IpAddr, dev: Option<&str>, timeout: Duration) -> Option<MacAddr> {
    let ip = next_hop(dst);
    if let Some(m) = kernel_lookup(ip, dev) {
        return Some(m);
    }
    let bind: IpAddr = if ip.is_ipv4() {
        Ipv4Addr::UNSPECIFIED.into()
    } else {
        Ipv6Addr::UNSPECIFIED.into()
    };
    if let Ok(s) = UdpSocket::bind((bind, 0)) {
        let _ = s.send_to(&[], (dst, 9));
    }
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        std::thread::sleep(Duration::from_millis(10));
        if let Some(m) = kernel_lookup(ip, dev) {
            return Some(m);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_table_order_matches_linux() {
        let a: Vec<IpAddr> = vec![
            "fd77::11".parse().unwrap(),
            "10.77.0.11".parse().unwrap(),
            "fe80::5054:ff:fe77:b".parse().unwrap(),
        ];
        let g = gid_order(&a);
        assert_eq!(g[0], "fe80::5054:ff:fe77:b".parse::<IpAddr>().unwrap());
        assert_eq!(g[1], "10.77.0.11".parse::<IpAddr>().unwrap());
        assert_eq!(g[2], "fd77::11".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn mtu_mapping() {
        use crate::ib::Mtu;
        assert_eq!(ib_mtu_for(1500), Mtu::M1024);
        assert_eq!(ib_mtu_for(9000), Mtu::M4096);
        assert_eq!(ib_mtu_for(4200), Mtu::M4096);
        assert_eq!(ib_mtu_for(576), Mtu::M256);
    }

    #[test]
    fn route_get_parsing() {
        let d: IpAddr = "10.61.2.2".parse().unwrap();
        assert_eq!(
            parse_route_get(
                "10.61.2.2 via 10.61.1.1 dev eth0 src 10.61.1.2 uid 0 \n    cache",
                d
            ),
            "10.61.1.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            parse_route_get(
                "10.61.1.1 dev eth0 src 10.61.1.2 uid 0",
                "10.61.1.1".parse().unwrap()
            ),
            "10.61.1.1".parse::<IpAddr>().unwrap()
        );
        let d6: IpAddr = "fd61:2::2".parse().unwrap();
        assert_eq!(parse_route_get("fd61:2::2 from :: via fd61:1::1 dev eth0 proto static src fd61:1::2 metric 1024 pref medium", d6), "fd61:1::1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn arp_and_ndp_parsing() {
        let t = "IP address       HW type     Flags       HW address            Mask     Device\n\
                 10.61.1.1        0x1         0x2         02:fe:61:01:00:01     *        eth0\n\
                 10.61.1.9        0x1         0x0         00:00:00:00:00:00     *        eth0\n";
        assert_eq!(
            arp_lookup(t, "10.61.1.1".parse().unwrap(), Some("eth0")),
            Some("02:fe:61:01:00:01".parse().unwrap())
        );
        assert_eq!(
            arp_lookup(t, "10.61.1.1".parse().unwrap(), Some("eth1")),
            None
        );
        assert_eq!(arp_lookup(t, "10.61.1.9".parse().unwrap(), None), None);
        let n = "fd61:1::1 dev eth0 lladdr 02:fe:61:01:00:01 router REACHABLE\nfd61:1::7 dev eth0  FAILED\n";
        assert_eq!(
            ndp_lookup(n, "fd61:1::1".parse().unwrap()),
            Some("02:fe:61:01:00:01".parse().unwrap())
        );
        assert_eq!(ndp_lookup(n, "fd61:1::7".parse().unwrap()), None);
    }
}
