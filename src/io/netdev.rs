//! Interfaces and neighbours: the GID table of a port, built from its IP addresses, and the
//! MAC address of a peer, from the kernel's routing and neighbour tables (over rtnetlink,
//! [`super::route`]).
//!
//! The GID table is ordered as Linux numbers it for a RoCE v2 port: IPv6 link-local first,
//! then the IPv4 addresses (as IPv4-mapped GIDs `::ffff:a.b.c.d`), then the other IPv6
//! addresses. On a host with one IPv4 and one global IPv6 address that gives rxe's indexes:
//! 0 link-local, 1 IPv4, 2 IPv6 global.

use super::route::{self, RouteError};
use crate::wire::MacAddr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::time::{Duration, Instant};

/// What ferroce needs to know about a network interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Netdev {
    /// Interface name.
    pub name: String,
    /// Interface index.
    pub index: u32,
    /// MAC address (zero for interfaces without one, such as loopback).
    pub mac: MacAddr,
    /// MTU, if it could be read.
    pub mtu: Option<u32>,
    /// The GID table, in Linux's order.
    pub gids: Vec<IpAddr>,
}

/// An IPv6 link-local unicast address (fe80::/10).
pub fn is_link_local_v6(a: &Ipv6Addr) -> bool {
    (a.segments()[0] & 0xffc0) == 0xfe80
}

/// A link-local unicast address of either family (169.254.0.0/16, fe80::/10).
pub fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => is_link_local_v6(&a),
    }
}

/// Order addresses as Linux's RoCE GID table does.
pub fn gid_order(addrs: &[IpAddr]) -> Vec<IpAddr> {
    let ll = addrs
        .iter()
        .filter(|a| matches!(a, IpAddr::V6(v) if is_link_local_v6(v)));
    let v4 = addrs.iter().filter(|a| a.is_ipv4());
    let v6 = addrs
        .iter()
        .filter(|a| matches!(a, IpAddr::V6(v) if !is_link_local_v6(v)));
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

/// A RoCE port's state as its interface gives it (rxe's rule, `rxe_query_port`): active while
/// the interface is up (`IFF_UP`) and running (`IFF_RUNNING`: its link is up); down otherwise,
/// physically polling while the interface is up and disabled when it is down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// The interface is down: `PORT_DOWN (1)`, physically `DISABLED (3)`.
    Down,
    /// The interface is up without a carrier: `PORT_DOWN (1)`, physically `POLLING (2)`.
    NoLink,
    /// Up with a carrier: `PORT_ACTIVE (4)`, physically `LINK_UP (5)`.
    Active,
}

impl PortState {
    /// From the interface's kernel flags (`IFF_*`): active when it is administratively up
    /// (`IFF_UP`) and operationally running (`IFF_RUNNING`: carrier and operstate up, or
    /// unknown as on loopback), as Linux's RoCE drivers (rxe: `netif_running` and
    /// `netif_carrier_ok`) report their ports.
    pub fn from_if_flags(flags: u32) -> PortState {
        let up = flags & libc::IFF_UP as u32 != 0;
        let running = flags & libc::IFF_RUNNING as u32 != 0;
        match (up, running) {
            (true, true) => PortState::Active,
            (true, false) => PortState::NoLink,
            _ => PortState::Down,
        }
    }

    /// `enum ibv_port_state`: `IBV_PORT_ACTIVE` (4) or `IBV_PORT_DOWN` (1).
    pub fn ibv_state(self) -> u8 {
        match self {
            PortState::Down | PortState::NoLink => 1,
            PortState::Active => 4,
        }
    }

    /// `ibv_port_attr.phys_state`: LinkUp (5), Polling (2) or Disabled (3).
    pub fn ibv_phys_state(self) -> u8 {
        match self {
            PortState::Down => 3,
            PortState::NoLink => 2,
            PortState::Active => 5,
        }
    }

    /// `ibv_port_state_str` and the number, as `ibv_devinfo` prints them: `PORT_ACTIVE (4)`.
    pub fn as_ibv(self) -> &'static str {
        match self {
            PortState::Down | PortState::NoLink => "PORT_DOWN (1)",
            PortState::Active => "PORT_ACTIVE (4)",
        }
    }

    /// The physical state as `ibv_devinfo -v` prints it: `LINK_UP (5)`, `POLLING (2)` or
    /// `DISABLED (3)`.
    pub fn phys_state(self) -> &'static str {
        match self {
            PortState::Down => "DISABLED (3)",
            PortState::NoLink => "POLLING (2)",
            PortState::Active => "LINK_UP (5)",
        }
    }
}

/// The kernel flags (`IFF_*`) of interface `name` in this thread's network namespace.
pub fn if_flags(name: &str) -> Option<u32> {
    pnet_datalink::interfaces()
        .into_iter()
        .find(|i| i.name == name)
        .map(|i| i.flags)
}

/// The port state of interface `name`, in the calling thread's network namespace.
pub fn link_state(name: &str) -> io::Result<PortState> {
    if_flags(name).map(PortState::from_if_flags).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no interface named {name:?}"),
        )
    })
}

/// [`link_state`] for a RoCE port: an interface that is gone is down; one whose state cannot
/// be read (the interface list failed, the interface still exists) counts as active, so that a
/// failed lookup never takes a working port down.
pub fn port_link(name: &str) -> PortState {
    link_state(name).unwrap_or_else(|_| {
        if super::sys::if_nametoindex(name).is_ok() {
            PortState::Active
        } else {
            PortState::Down
        }
    })
}

/// A RoCE port's link width and speed, in libibverbs' encodings (`ibv_port_attr.active_width`,
/// `.active_speed`), as rxe derives them from its interface's Ethernet speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRate {
    /// `IBV_WIDTH_*`-style value: 1 = 1X, 2 = 4X, 4 = 8X, 8 = 12X, 16 = 2X.
    pub width: u8,
    /// `IBV_SPEED_*`-style value: 1 = SDR, 2 = DDR, 4 = QDR, 8 = FDR10, 16 = FDR, 32 = EDR.
    pub speed: u8,
}

impl PortRate {
    /// The rate Linux gives a RoCE port whose interface runs at `mbps` (Mb/s; `None`: the
    /// driver reports no speed, counted as 1 Gb/s). The table is what Debian 12's kernel
    /// (6.1) gives rxe, read with `ibv_devinfo -v` in the tools/rxe-peer guest whose virtio
    /// NIC was told each speed (`FERROCE_RXE_NIC_OPTS=speed=N`; docs/cabi.md has the
    /// measurements): up to 1 G 1X SDR, 10 G 1X FDR10, 20 G 4X DDR, 25 G 1X EDR, 40 G 4X FDR10,
    /// above 4X EDR.
    pub fn for_ethernet(mbps: Option<u32>) -> PortRate {
        let (width, speed) = match mbps.unwrap_or(1_000) {
            0..=1_000 => (1, 1),
            1_001..=10_000 => (1, 8),
            10_001..=20_000 => (2, 2),
            20_001..=25_000 => (1, 32),
            25_001..=40_000 => (2, 8),
            _ => (2, 32),
        };
        PortRate { width, speed }
    }

    /// `ibv_devinfo`'s words for the width: "4X (2)".
    pub fn width_str(self) -> String {
        let w = match self.width {
            1 => "1X",
            2 => "4X",
            4 => "8X",
            8 => "12X",
            16 => "2X",
            _ => "invalid width",
        };
        format!("{w} ({})", self.width)
    }

    /// `ibv_devinfo`'s words for the speed: "25.0 Gbps (32)".
    pub fn speed_str(self) -> String {
        let s = match self.speed {
            1 => "2.5 Gbps",
            2 => "5.0 Gbps",
            4 | 8 => "10.0 Gbps",
            16 => "14.0 Gbps",
            32 => "25.0 Gbps",
            64 => "50.0 Gbps",
            128 => "100.0 Gbps",
            _ => "invalid speed",
        };
        format!("{s} ({})", self.speed)
    }
}

/// The rate of the RoCE port on interface `name` now ([`PortRate::for_ethernet`] of the speed
/// its driver reports, in the calling thread's network namespace). An interface whose speed
/// cannot be read counts as one without a speed, as the kernel counts it.
pub fn port_rate(name: &str) -> PortRate {
    PortRate::for_ethernet(super::sys::if_speed(name).ok().flatten())
}

/// Wakes on changes of interfaces' links and addresses: an rtnetlink socket in the link and
/// address groups (`RTMGRP_LINK`, `RTMGRP_IPV4_IFADDR`, `RTMGRP_IPV6_IFADDR`) of the calling
/// thread's network namespace. It only says that something changed; the state itself is read
/// with [`link_state`] and [`netdev`].
pub struct LinkWatch {
    sock: netlink_sys::Socket,
}

impl LinkWatch {
    /// Subscribe to link and address changes.
    pub fn new() -> io::Result<LinkWatch> {
        const RTMGRP_LINK: u32 = 0x1;
        const RTMGRP_IPV4_IFADDR: u32 = 0x10;
        const RTMGRP_IPV6_IFADDR: u32 = 0x100;
        let mut sock = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_ROUTE)?;
        sock.bind(&netlink_sys::SocketAddr::new(
            0,
            RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR,
        ))?;
        sock.set_non_blocking(true)?;
        Ok(LinkWatch { sock })
    }

    /// Wait up to `timeout` for a link or address change; `true` if one (or more) came, whose messages are
    /// then read and dropped. A socket that overflowed (`ENOBUFS`: changes were lost) counts as
    /// a change.
    pub fn wait(&mut self, timeout: Duration) -> io::Result<bool> {
        use std::os::fd::AsRawFd;
        let fd = self.sock.as_raw_fd();
        if !super::sys::event::poll_readable(&[fd], Some(timeout))? {
            return Ok(false);
        }
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match self.sock.recv(&mut &mut buf[..], 0) {
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
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
    // Room for IPv6 (40) + UDP (8) + BTH and the largest request headers (12 + 16 + 4) + ICRC (4).
    largest_mtu_within(eth_mtu.saturating_sub(40 + 8 + 32 + 4) as usize)
}

/// The largest path MTU of at most `room` payload bytes (256 when none is).
fn largest_mtu_within(room: usize) -> crate::ib::Mtu {
    use crate::ib::Mtu;
    [Mtu::M4096, Mtu::M2048, Mtu::M1024, Mtu::M512, Mtu::M256]
        .into_iter()
        .find(|m| m.bytes() as usize <= room)
        .unwrap_or(Mtu::M256)
}

/// The largest path MTU whose every packet fits a frame of `frame` bytes: Ethernet (14),
/// IPv6 (40), UDP (8), the BTH and the largest request headers (12 + XRCETH 4 + RETH 16 +
/// ImmDt 4) and the ICRC (4) around the payload; 256 when even that does not fit.
pub fn ib_mtu_for_frame(frame: usize) -> crate::ib::Mtu {
    largest_mtu_within(frame.saturating_sub(14 + 40 + 8 + 36 + 4))
}

/// The next hop towards `dst` per the kernel's routing table (the gateway, or `dst` itself
/// when it is on a connected network): `RTM_GETROUTE`, as `ip route get` asks.
///
/// # Errors
/// [`RouteError::NoRoute`] when the kernel has no route to `dst`, or a netlink error.
pub fn next_hop(dst: IpAddr) -> Result<IpAddr, RouteError> {
    Ok(route::route_get(dst)?.next_hop())
}

/// The destination MAC address for packets to `dst` leaving through `dev` (or the route's
/// interface): that of the next hop (the gateway when `dst` is not on a connected network),
/// from the kernel's neighbour table (`RTM_GETNEIGH`). If the kernel has no usable entry,
/// make it resolve one: a datagram to the discard port (9) of `dst` from a plain UDP socket
/// sends the ARP request / neighbour solicitation for the next hop; then look again every
/// 10 ms for up to `timeout`.
///
/// # Errors
/// [`RouteError::NoRoute`] without a route, [`RouteError::NoNeighbour`] when the next hop
/// did not answer within `timeout`, or a netlink error.
pub fn resolve_mac(
    dst: IpAddr,
    dev: Option<&str>,
    timeout: Duration,
) -> Result<MacAddr, RouteError> {
    let r = route::route_get(dst)?;
    let ip = r.next_hop();
    let ifindex = match dev {
        Some(d) => Some(super::sys::if_nametoindex(d)?),
        None => r.oif,
    };
    let lookup = || -> Result<Option<MacAddr>, RouteError> {
        Ok(route::neighbour(ip, ifindex)?.and_then(|n| n.usable_mac()))
    };
    if let Some(m) = lookup()? {
        return Ok(m);
    }
    tracing::debug!(%dst, next_hop = %ip, "no neighbour entry: priming with a datagram to port 9");
    let bind: IpAddr = if dst.is_ipv4() {
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
        if let Some(m) = lookup()? {
            return Ok(m);
        }
    }
    Err(RouteError::NoNeighbour { dst, ip })
}

/// [`resolve_mac`], for callers that only need to know whether it worked (the reason is
/// logged at debug level).
pub fn resolve(dst: IpAddr, dev: Option<&str>, timeout: Duration) -> Option<MacAddr> {
    resolve_mac(dst, dev, timeout)
        .inspect_err(|e| tracing::debug!(%dst, error = %e, "resolve"))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_on_an_interface_that_is_gone_is_down() {
        assert_eq!(port_link("ferroce-none0"), PortState::Down);
        assert!(link_state("ferroce-none0").is_err());
        // lo is listed (up or not) and answers from its flags, as the interface list says.
        let lo = pnet_datalink::interfaces()
            .into_iter()
            .find(|i| i.name == "lo")
            .unwrap();
        let want = match (lo.is_up(), lo.is_running()) {
            (true, true) => PortState::Active,
            (true, false) => PortState::NoLink,
            _ => PortState::Down,
        };
        assert_eq!(port_link("lo"), want);
    }

    /// Known answers: Debian 12's rxe (kernel 6.1.0-48-amd64) in the tools/rxe-peer guest,
    /// `ibv_devinfo -v`'s active_width and active_speed with the guest's virtio NIC booted at
    /// each speed (`FERROCE_RXE_NIC_OPTS=speed=N,duplex=full`; no `speed`: the NIC reports
    /// SPEED_UNKNOWN, /sys/class/net/eth0/speed -1).
    #[test]
    fn port_rate_matches_rxe_for_each_speed() {
        let rxe: [(Option<u32>, &str, &str); 13] = [
            (None, "1X (1)", "2.5 Gbps (1)"),
            (Some(100), "1X (1)", "2.5 Gbps (1)"),
            (Some(1000), "1X (1)", "2.5 Gbps (1)"),
            (Some(2500), "1X (1)", "10.0 Gbps (8)"),
            (Some(10000), "1X (1)", "10.0 Gbps (8)"),
            (Some(20000), "4X (2)", "5.0 Gbps (2)"),
            (Some(25000), "1X (1)", "25.0 Gbps (32)"),
            (Some(40000), "4X (2)", "10.0 Gbps (8)"),
            (Some(50000), "4X (2)", "25.0 Gbps (32)"),
            (Some(56000), "4X (2)", "25.0 Gbps (32)"),
            (Some(100000), "4X (2)", "25.0 Gbps (32)"),
            (Some(200000), "4X (2)", "25.0 Gbps (32)"),
            (Some(400000), "4X (2)", "25.0 Gbps (32)"),
        ];
        for (mbps, w, s) in rxe {
            let r = PortRate::for_ethernet(mbps);
            assert_eq!(
                (r.width_str().as_str(), r.speed_str().as_str()),
                (w, s),
                "{mbps:?}"
            );
        }
    }

    #[test]
    fn loopback_has_no_speed() {
        // lo has no link settings (ethtool shows no Speed): counted as 1 Gb/s, as rxe counts it.
        assert_eq!(crate::io::sys::if_speed("lo").unwrap(), None);
        assert_eq!(port_rate("lo"), PortRate { width: 1, speed: 1 });
        assert!(crate::io::sys::if_speed("ferroce-none0").is_err());
    }

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
}
