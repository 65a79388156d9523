//! Choosing and opening a packet backend by name (`--backend xdp|packet|udp`).

use super::netdev::Netdev;
use super::PacketDevice;
use std::io;
use std::net::IpAddr;

/// The backends a user can pick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum BackendKind {
    /// AF_XDP with an XDP program that redirects UDP 4791 (root; native mode where the driver
    /// has it, generic otherwise; zero-copy where available).
    Xdp,
    /// AF_PACKET with TPACKET_V3 rings and a classic BPF filter (root).
    Packet,
    /// A kernel UDP socket on port 4791 (no root).
    Udp,
}

impl BackendKind {
    /// The name `--backend` takes.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Xdp => "xdp",
            BackendKind::Packet => "packet",
            BackendKind::Udp => "udp",
        }
    }
}

/// Open `kind` on `dev`; `local` is the address the UDP backend binds.
pub fn open(kind: BackendKind, dev: &Netdev, local: IpAddr) -> io::Result<Box<dyn PacketDevice>> {
    open_with(kind, dev, local, false)
}

/// [`open`], tuned for latency when `low_latency`: AF_PACKET then receives with
/// `recvmmsg(2)` (every frame at once) instead of the TPACKET_V3 ring (whose partly filled
/// blocks reach user space only when the 1 ms retire timer fires).
pub fn open_with(
    kind: BackendKind,
    dev: &Netdev,
    local: IpAddr,
    low_latency: bool,
) -> io::Result<Box<dyn PacketDevice>> {
    Ok(match kind {
        BackendKind::Xdp => Box::new(super::xdp::XdpDevice::open_all_queues(
            &dev.name,
            super::xdp::XdpOptions::default(),
        )?),
        BackendKind::Packet => {
            let mut c = super::af_packet::AfPacketConfig::new(&dev.name);
            if low_latency {
                c.rx = super::af_packet::AfPacketRx::Recvmmsg { batch: 64 };
            }
            Box::new(super::af_packet::AfPacketDevice::open(&c)?)
        }
        BackendKind::Udp => {
            let c = udp_config(dev, local);
            Box::new(super::udp::UdpDevice::open(&c).map_err(|e| in_use(e, &c))?)
        }
    })
}

/// Whether UDP port `port` of `local` on `dev` is free: no socket, shared or not, holds it
/// (a plain bind succeeds; the socket is closed again at once).
pub fn udp_port_free(dev: &Netdev, local: IpAddr, port: u16) -> bool {
    let at = match local {
        IpAddr::V6(a) if super::netdev::is_link_local_v6(&a) => {
            std::net::SocketAddr::V6(std::net::SocketAddrV6::new(a, port, 0, dev.index))
        }
        a => std::net::SocketAddr::new(a, port),
    };
    std::net::UdpSocket::bind(at).map_or_else(|e| e.kind() != io::ErrorKind::AddrInUse, |_| true)
}

/// The UDP backend's configuration for `local` on `dev`.
fn udp_config(dev: &Netdev, local: IpAddr) -> super::udp::UdpConfig {
    let mut c = super::udp::UdpConfig::new(local);
    // A UDP datagram carries at most 65535 bytes of IP packet; loopback's MTU is 65536
    // and RoCE frames are far smaller (path MTU 4096 at most).
    c.mtu = (dev.mtu.unwrap_or(1500) as usize).min(65535);
    // `FERROCE_UDP_FILTER=1`: the kernel-side filter (see `udp_filter`; off by default).
    c.filter = std::env::var("FERROCE_UDP_FILTER").is_ok_and(|v| v == "1");
    // A link-local address is the interface's own.
    c.scope_id = dev.index;
    c
}

/// `AddrInUse` said in a user's words.
fn in_use(e: io::Error, c: &super::udp::UdpConfig) -> io::Error {
    if e.kind() != io::ErrorKind::AddrInUse {
        return e;
    }
    io::Error::new(
        e.kind(),
        format!(
            "UDP port {} on {} is in use (by another RoCE endpoint on this host: a ferroce process or the kernel's rdma_rxe); one host runs one RoCE endpoint per address",
            c.port, c.local
        ),
    )
}

/// Open `kind` on `dev` to serve `locals` (the first must be served; see [`open_with`] for
/// `low_latency`). A raw backend sees every address of the interface; the UDP backend binds
/// a socket per address ([`super::udp_set::UdpSet`]), the first required, the others where
/// they can be bound (one held by another program is left out; a tentative one is bound,
/// `UdpConfig::freebind`).
/// With `reuse_port`, the UDP backend's sockets bind with `SO_REUSEPORT`
/// ([`super::udp::UdpConfig::reuse_port`]: shared with other devices of this user, see
/// [`super::share`]).
/// Returns the device and the addresses it serves.
pub fn open_serving(
    kind: BackendKind,
    dev: &Netdev,
    locals: &[IpAddr],
    low_latency: bool,
    reuse_port: bool,
) -> io::Result<(Box<dyn PacketDevice>, Vec<IpAddr>)> {
    let Some(&first) = locals.first() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no address to serve",
        ));
    };
    if kind != BackendKind::Udp || (locals.len() == 1 && !reuse_port) {
        return Ok((open_with(kind, dev, first, low_latency)?, locals.to_vec()));
    }
    let mut c = udp_config(dev, first);
    c.reuse_port = reuse_port;
    // The interface's own addresses: one still tentative (an IPv6 address tests for
    // duplicates for a second or two after it is added; a program started with its
    // interface would otherwise never serve its link-local address) is bound all the same.
    c.freebind = true;
    let (set, held) =
        super::udp_set::UdpSet::open_available(&c, locals).map_err(|e| in_use(e, &c))?;
    // Only the first: a lone device (no epoll descriptor, no copies).
    match set.into_single() {
        Ok(d) => Ok((Box::new(d), held)),
        Err(set) => Ok((set, held)),
    }
}
