//! Routes and neighbours from the kernel, over rtnetlink: the route the kernel would use to
//! a destination (`RTM_GETROUTE`, what `ip route get` asks) and the entries of its neighbour
//! table (`RTM_GETNEIGH`, what `ip neigh` shows), in the calling thread's network namespace
//! (a netlink socket belongs to the namespace of the thread that opens it).
//!
//! The messages are built and parsed by the `netlink-packet-route` crate and travel over
//! `netlink-sys`'s socket: no `unsafe` and no hand-written attribute parsing here, where a
//! typed answer matters (gateways, output interfaces, neighbour states of both families).
//!
//! [`crate::io::netdev::resolve`] puts the two together: the next hop towards a
//! destination, then its link-layer address.

use crate::wire::MacAddr;
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteType};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use std::io;
use std::net::IpAddr;

/// Why a route or a neighbour could not be had.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// The kernel has no route to the destination (`ENETUNREACH`), or its route says the
    /// destination is unreachable (`EHOSTUNREACH`): `ip route get` prints "Network is
    /// unreachable" / "No route to host".
    #[error("no route to {dst}: {source}")]
    NoRoute {
        /// The destination asked for.
        dst: IpAddr,
        /// The kernel's answer.
        source: io::Error,
    },
    /// The kernel refused the lookup otherwise, e.g. a blackhole (`EINVAL`) or prohibit
    /// (`EACCES`) route.
    #[error("route to {dst}: {source}")]
    Refused {
        /// The destination asked for.
        dst: IpAddr,
        /// The kernel's answer.
        source: io::Error,
    },
    /// The neighbour table has no usable entry for the next hop, even after a datagram made
    /// the kernel resolve it (ARP or neighbour discovery got no answer).
    #[error("no link-layer address for {ip} (next hop towards {dst}): no ARP/ND answer")]
    NoNeighbour {
        /// The destination asked for.
        dst: IpAddr,
        /// The next hop whose address is missing.
        ip: IpAddr,
    },
    /// The netlink socket failed.
    #[error("rtnetlink: {0}")]
    Netlink(#[from] io::Error),
    /// The kernel's answer did not parse, or lacked what every answer has.
    #[error("rtnetlink: malformed answer: {0}")]
    Malformed(String),
}

/// The route the kernel picked for a destination (the answer to `RTM_GETROUTE`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The destination asked for.
    pub dst: IpAddr,
    /// The gateway (`via`), if the destination is not on a connected network.
    pub gateway: Option<IpAddr>,
    /// The output interface (`dev`), by index.
    pub oif: Option<u32>,
    /// The preferred source address (`src`).
    pub prefsrc: Option<IpAddr>,
    /// The routing table it came from.
    pub table: Option<u32>,
    /// Whether the destination is an address of this host (`local`).
    pub local: bool,
}

impl Route {
    /// Where frames to [`Self::dst`] go on the link: the gateway, or the destination itself.
    pub fn next_hop(&self) -> IpAddr {
        self.gateway.unwrap_or(self.dst)
    }
}

/// The state of a neighbour-table entry (`NUD_*`, as `ip neigh` prints it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NeighState {
    /// Resolution under way.
    Incomplete,
    /// Confirmed recently.
    Reachable,
    /// Not confirmed recently, still used (and re-confirmed on use).
    Stale,
    /// Waiting before re-confirming.
    Delay,
    /// Being re-confirmed.
    Probe,
    /// Resolution failed.
    Failed,
    /// A device without link-layer addresses.
    Noarp,
    /// Set by the administrator.
    Permanent,
    /// No state.
    None,
    /// Another value.
    Other(u16),
}

impl NeighState {
    /// Whether the entry's link-layer address may be used to send (what the kernel does
    /// itself: every state but INCOMPLETE, FAILED and NONE).
    pub fn usable(self) -> bool {
        !matches!(
            self,
            NeighState::Incomplete | NeighState::Failed | NeighState::None
        )
    }
}

impl From<NeighbourState> for NeighState {
    fn from(s: NeighbourState) -> Self {
        match s {
            NeighbourState::Incomplete => NeighState::Incomplete,
            NeighbourState::Reachable => NeighState::Reachable,
            NeighbourState::Stale => NeighState::Stale,
            NeighbourState::Delay => NeighState::Delay,
            NeighbourState::Probe => NeighState::Probe,
            NeighbourState::Failed => NeighState::Failed,
            NeighbourState::Noarp => NeighState::Noarp,
            NeighbourState::Permanent => NeighState::Permanent,
            NeighbourState::None => NeighState::None,
            NeighbourState::Other(v) => NeighState::Other(v),
            _ => NeighState::Other(u16::from(s)),
        }
    }
}

/// One entry of the kernel's neighbour table (ARP for IPv4, NDP for IPv6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Neighbour {
    /// The neighbour's IP address.
    pub ip: IpAddr,
    /// The interface, by index.
    pub ifindex: u32,
    /// Its link-layer address (`lladdr`), if known and 6 bytes long.
    pub mac: Option<MacAddr>,
    /// The entry's state.
    pub state: NeighState,
    /// Whether the neighbour is a router (IPv6).
    pub router: bool,
}

impl Neighbour {
    /// The MAC address to send to, if the entry has one and may be used.
    pub fn usable_mac(&self) -> Option<MacAddr> {
        self.mac
            .filter(|m| *m != MacAddr::ZERO && self.state.usable())
    }
}

/// Send `msg` to the kernel and collect the answers: until `NLMSG_DONE` for a dump, the first
/// answer otherwise. A kernel error comes back as `Err(errno error)` (the caller types it).
fn transact(
    msg: RouteNetlinkMessage,
    dump: bool,
) -> Result<Result<Vec<RouteNetlinkMessage>, io::Error>, RouteError> {
    /// At most this many messages of a dump are read (a bound on memory; a neighbour table
    /// holds far fewer).
    const MAX_MESSAGES: usize = 1 << 16;
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { 0 };
    header.sequence_number = 1;
    let mut req = NetlinkMessage::new(header, NetlinkPayload::from(msg));
    req.finalize();
    let mut buf = vec![0; req.header.length as usize];
    req.serialize(&mut buf);
    sock.send(&buf, 0)?;
    let mut out = Vec::new();
    loop {
        let (data, _) = sock.recv_from_full()?;
        if data.is_empty() {
            return Err(RouteError::Malformed("empty datagram".into()));
        }
        let mut off = 0;
        while off < data.len() {
            let m: NetlinkMessage<RouteNetlinkMessage> = NetlinkMessage::deserialize(&data[off..])
                .map_err(|e| RouteError::Malformed(e.to_string()))?;
            let len = m.header.length as usize;
            if len == 0 {
                return Err(RouteError::Malformed("a message of length 0".into()));
            }
            off += len;
            match m.payload {
                NetlinkPayload::Done(_) => return Ok(Ok(out)),
                NetlinkPayload::Error(e) if e.code.is_some() => return Ok(Err(e.to_io())),
                NetlinkPayload::InnerMessage(inner) => {
                    out.push(inner);
                    if !dump {
                        return Ok(Ok(out));
                    }
                    if out.len() >= MAX_MESSAGES {
                        return Err(RouteError::Malformed(format!(
                            "more than {MAX_MESSAGES} messages"
                        )));
                    }
                }
                _ => {}
            }
        }
    }
}

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some((*v4).into()),
        RouteAddress::Inet6(v6) => Some((*v6).into()),
        _ => None,
    }
}

/// The route the kernel would use for packets to `dst` (`ip route get DST`).
///
/// # Errors
/// [`RouteError::NoRoute`] when the kernel has none (or an unreachable route),
/// [`RouteError::Refused`] for other refusals (blackhole, prohibit), and socket or parse
/// errors.
pub fn route_get(dst: IpAddr) -> Result<Route, RouteError> {
    let mut m = RouteMessage::default();
    let (family, bits) = match dst {
        IpAddr::V4(_) => (AddressFamily::Inet, 32),
        IpAddr::V6(_) => (AddressFamily::Inet6, 128),
    };
    m.header.address_family = family;
    m.header.destination_prefix_length = bits;
    m.attributes
        .push(RouteAttribute::Destination(RouteAddress::from(dst)));
    let answer = match transact(RouteNetlinkMessage::GetRoute(m), false)? {
        Ok(v) => v,
        Err(e) => {
            return Err(match e.raw_os_error() {
                Some(libc::ENETUNREACH) | Some(libc::EHOSTUNREACH) => {
                    RouteError::NoRoute { dst, source: e }
                }
                _ => RouteError::Refused { dst, source: e },
            })
        }
    };
    let Some(RouteNetlinkMessage::NewRoute(r)) = answer.into_iter().next() else {
        return Err(RouteError::Malformed(
            "no RTM_NEWROUTE in the answer".into(),
        ));
    };
    let mut route = Route {
        dst,
        gateway: None,
        oif: None,
        prefsrc: None,
        table: None,
        local: r.header.kind == RouteType::Local,
    };
    for a in &r.attributes {
        match a {
            RouteAttribute::Gateway(g) => route.gateway = route_ip(g),
            RouteAttribute::Oif(i) => route.oif = Some(*i),
            RouteAttribute::PrefSource(s) => route.prefsrc = route_ip(s),
            RouteAttribute::Table(t) => route.table = Some(*t),
            _ => {}
        }
    }
    if route.table.is_none() {
        route.table = Some(u32::from(r.header.table));
    }
    tracing::trace!(?route, "RTM_GETROUTE");
    Ok(route)
}

/// Every entry of the kernel's neighbour table of `family` (`ip -4 neigh` / `ip -6 neigh`):
/// `true` for IPv6.
pub fn neighbours(ipv6: bool) -> Result<Vec<Neighbour>, RouteError> {
    let mut m = NeighbourMessage::default();
    m.header.family = if ipv6 {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    let answer =
        transact(RouteNetlinkMessage::GetNeighbour(m), true)?.map_err(RouteError::Netlink)?;
    let mut v = Vec::new();
    for msg in answer {
        let RouteNetlinkMessage::NewNeighbour(n) = msg else {
            continue;
        };
        let mut ip = None;
        let mut mac = None;
        for a in &n.attributes {
            match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => {
                    ip = Some((*a).into())
                }
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => {
                    ip = Some((*a).into())
                }
                NeighbourAttribute::LinkLayerAddress(b) => {
                    mac = <[u8; 6]>::try_from(b.as_slice()).ok().map(MacAddr)
                }
                _ => {}
            }
        }
        let Some(ip) = ip else { continue };
        v.push(Neighbour {
            ip,
            ifindex: n.header.ifindex,
            mac,
            state: n.header.state.into(),
            router: n
                .header
                .flags
                .contains(netlink_packet_route::neighbour::NeighbourFlags::Router),
        });
    }
    Ok(v)
}

/// The neighbour-table entry for `ip`, on interface `ifindex` if given (the first one found
/// otherwise), or `None` if the kernel has none.
pub fn neighbour(ip: IpAddr, ifindex: Option<u32>) -> Result<Option<Neighbour>, RouteError> {
    Ok(neighbours(ip.is_ipv6())?
        .into_iter()
        .find(|n| n.ip == ip && ifindex.is_none_or(|i| n.ifindex == i)))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Every network namespace has `lo` with 127.0.0.1 and ::1 (no root needed to ask).
    #[test]
    fn loopback_destinations_are_local_routes_on_lo() {
        let lo = crate::io::if_nametoindex("lo").unwrap();
        for dst in ["127.0.0.1", "::1"] {
            let dst: IpAddr = dst.parse().unwrap();
            let r = route_get(dst).unwrap_or_else(|e| panic!("{dst}: {e}"));
            assert!(r.local, "{r:?}");
            assert_eq!(r.gateway, None);
            assert_eq!(r.next_hop(), dst);
            assert_eq!(r.oif, Some(lo), "{r:?}");
        }
    }

    #[test]
    fn neighbour_tables_can_be_read_and_states_mean_what_the_kernel_means() {
        for v6 in [false, true] {
            let t = neighbours(v6).unwrap();
            assert!(t.iter().all(|n| n.ip.is_ipv6() == v6), "{t:?}");
        }
        for (s, usable) in [
            (NeighbourState::Reachable, true),
            (NeighbourState::Stale, true),
            (NeighbourState::Delay, true),
            (NeighbourState::Probe, true),
            (NeighbourState::Permanent, true),
            (NeighbourState::Noarp, true),
            (NeighbourState::Incomplete, false),
            (NeighbourState::Failed, false),
            (NeighbourState::None, false),
        ] {
            assert_eq!(NeighState::from(s).usable(), usable, "{s:?}");
        }
        let n = Neighbour {
            ip: "10.0.0.1".parse().unwrap(),
            ifindex: 2,
            mac: Some(MacAddr([2, 0, 0, 0, 0, 1])),
            state: NeighState::Failed,
            router: false,
        };
        assert_eq!(n.usable_mac(), None);
        let n = Neighbour {
            state: NeighState::Stale,
            ..n
        };
        assert_eq!(n.usable_mac(), Some(MacAddr([2, 0, 0, 0, 0, 1])));
        let n = Neighbour {
            mac: Some(MacAddr::ZERO),
            ..n
        };
        assert_eq!(n.usable_mac(), None);
    }
}
