//! The kernel UDP-socket backend: RoCE v2 over an ordinary UDP socket bound to
//! `<local ip>:4791`. No root, no raw sockets; the kernel does Ethernet, IP and UDP.
//! [`Medium::UdpSocket`].
//!
//! The engine above still speaks whole Ethernet frames (as [`crate::wire::FrameRepr::emit`]
//! writes them), so this device translates in both directions:
//!
//! **Send.** The device takes the destination address, the UDP destination port, the
//! IPv4 TOS / IPv6 traffic class and the UDP payload (BTH … ICRC) from the frame, and sends
//! the payload with `sendmmsg` to `dst:port`, the TOS as a per-datagram `IP_TOS` /
//! `IPV6_TCLASS` control message (so ECN-capable transport marks survive). The kernel writes
//! its own IP and UDP headers, which differ from the engine's in fields the ICRC covers:
//! the UDP source port is the bound port, the source address is the bound address, the IPv4
//! identification is the kernel's (below), there are no IPv4 options. So before sending, the
//! device **corrects the ICRC** for the headers the kernel will write: CRC-32 is affine, so
//! the change is the CRC of the XOR of the two headers (at most 48 bytes) shifted over the
//! rest of the packet ([`icrc::Shift`], cached per length) — no second pass over the payload,
//! and a frame whose ICRC was wrong (a fault injector's corruption) stays wrong. TTL / hop
//! limit is the socket's (64) and the IPv4 checksum, UDP checksum, flow label are masked
//! anyway. IPv6 datagrams get a real UDP checksum from the kernel.
//!
//! **Segmentation offload (GSO).** A run of frames of one batch to the same destination and
//! traffic class whose payloads all have one size (the last may be shorter; at most
//! 64 segments (`UDP_MAX_SEGMENTS`), 65,507 bytes in all) goes to the kernel as *one* message
//! gathered from the device buffers, with a `UDP_SEGMENT` control message: the kernel builds
//! one super-datagram that crosses the stack (and, on veth, the peer's and a router's
//! stacks) once, and cuts it into the datagrams on the wire, each segment a complete BTH …
//! ICRC, where it leaves the machine or reaches a device without UDP segmentation. Engines
//! produce such runs naturally: the MIDDLE and LAST packets of a message, back-to-back small
//! WRITEs. The IPv4 IDs of the segments are the super-datagram's plus the segment index
//! (`inet_gso_segment`: `id++` per segment; not for TCP's fixed-ID GSO), and a DF datagram
//! of an unconnected socket gets ID 0 (`ip_select_ident_segs`), so segment *i* of a run
//! carries ID *i*: the device writes each ICRC for that ID. Both rules are the kernel's
//! source, and checked by a capture of the segments in `tests/packet_backends.rs`. A single
//! frame is a plain datagram (ID 0). When the kernel refuses a GSO message (no checksum
//! offload on the route's device: `EIO`; a kernel without `UDP_SEGMENT`: `EINVAL` /
//! `EMSGSIZE`), the device turns GSO off for good, rewrites the ICRCs of what is left of the
//! batch for ID 0 and sends those frames one datagram each ([`OffloadStats::gso_refused`]).
//! [`UdpConfig::gso`] turns it off from the start.
//!
//! **Receive.** `recvmmsg` with `IP_PKTINFO`/`IPV6_RECVPKTINFO` (the header's destination
//! address), `IP_RECVTOS`/`IPV6_RECVTCLASS` (ECN, for congestion control),
//! `IP_RECVTTL`/`IPV6_RECVHOPLIMIT` and, with `UDP_GRO` on ([`UdpConfig::gro`]), the size of
//! the segments of a coalesced datagram: a super-datagram from a GSO sender arrives whole
//! (the kernel does not cut it up for this socket), as do datagrams that GRO merged, and the
//! device splits it back into its segments. Each datagram or segment gets its headers
//! synthesised in place, right in front of it: Ethernet (zero MACs), IPv4 or IPv6, UDP
//! (source address and port from the socket, checksum 0) — no copy of the payload. For a
//! segment after the first, the headers overwrite the tail of the previous segment, which
//! has already been handed up. Receive buffers hold 64 KiB with GRO on (the MTU otherwise).
//! IPv6 zero-checksum datagrams (what Linux rxe sends) are accepted: the socket sets
//! `UDP_NO_CHECK6_RX` (RFC 8200 says to drop them otherwise, and Linux does).
//!
//! **The IPv4 identification.** The ICRC covers the sender's IPv4 ID and flags, which a UDP
//! socket never reports. The device recovers them (see [`icrc::solve_ipv4_ident`] for the
//! algebra). It predicts the ID: for the segments after the first of a coalesced datagram,
//! the previous segment's ID + 1 (GSO and GRO both count up per segment; GRO also merges
//! DF datagrams whose IDs stay fixed, the second prediction); for a datagram or a first
//! segment, the source's last ID + 1 (Linux rxe counts per destination, and a GSO run from a
//! ferroce peer continues its count when the kernel cut it up before this socket) or ID 0
//! with DF (what a ferroce peer sends a single frame with). It computes the ICRC once with
//! the first prediction. On a mismatch it solves the 32 GF(2) equations for the 16 ID bits
//! from the difference (per length, the equations are cached: [`icrc::IdentSolver`]), first
//! with the predicted DF and then with DF flipped (a constant, no second CRC pass). A
//! solution that is one of the predictions is as good as a matching ICRC (a corrupted packet
//! hits a given ID with probability 2^-32): counted as `guessed`. Any other solution is
//! written into the synthesised header and the frame verifies, but **such a frame has only
//! 16 (15, counting the DF retry) bits of residual ICRC strength**: a corrupted datagram
//! passes with probability about 2^-15 — still in addition to the UDP checksum, which the
//! kernel has verified for IPv4 datagrams that carry one. A frame with no solution is
//! corrupt: it goes up with ID 0 so that the engine counts an ICRC drop.
//! [`UdpConfig::solve_ident`] turns the solver off (then only the predictions verify, at
//! full strength). IPv6 has no ID and its flow label is masked: nothing to solve. Senders
//! that use IPv4 options cannot be verified (the socket does not report them).

use super::sys::event::poll_readable;
use super::sys::sockutil::set_int;
use super::sys::udp::{self as sysudp, RecvInfo, RecvSlot, SendItem};
use super::{IoStats, Medium, PacketDevice};
use crate::wire::eth::{self, EthernetRepr};
use crate::wire::icrc::{IdentSolver, Shift};
use crate::wire::ip::{internet_checksum, Ipv4Repr, Ipv6Repr, PROTO_UDP};
use crate::wire::udp::UdpRepr;
use crate::wire::{icrc, ROCE_V2_PORT};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::os::fd::AsFd;
use std::time::Duration;

const ETH: usize = eth::HEADER_LEN;
const IP4: usize = 20;
const IP6: usize = 40;
const UDP: usize = 8;
/// The largest UDP payload of one (super-)datagram: 65,535 minus the IPv4 and UDP headers.
const MAX_DATAGRAM: usize = 65_535 - IP4 - UDP;

/// Configuration of a [`UdpDevice`].
#[derive(Clone, Debug)]
pub struct UdpConfig {
    /// The address to bind (must be a specific address: it is the source of every datagram
    /// and goes into the recomputed ICRC).
    pub local: IpAddr,
    /// The port to bind (RoCE v2: 4791; 0 picks a free one, for tests).
    pub port: u16,
    /// IP MTU of the path: the device takes frames of up to `mtu + 18` bytes.
    pub mtu: usize,
    /// Datagrams per `recvmmsg` / `sendmmsg` (1..=64).
    pub batch: usize,
    /// Recover unknown IPv4 identifications with the GF(2) solver (see the module docs).
    pub solve_ident: bool,
    /// Send runs of equal-sized frames as one `UDP_SEGMENT` message (see the module docs).
    pub gso: bool,
    /// Receive coalesced datagrams (`UDP_GRO`) and split them (see the module docs).
    pub gro: bool,
    /// Offer the kernel-side receive filter ([`crate::io::udp_filter`]): the runtime then
    /// keeps a classic BPF program on the socket that drops, before the kernel queues them,
    /// the datagrams the device would drop on its first checks. Off: every datagram to the
    /// port reaches the engine. Off by default (`FERROCE_UDP_FILTER=1` turns it on in the
    /// runtime's configuration): the kernel judges a GSO/GRO datagram by its first segment,
    /// and a peer that batches frames for several QPs into one (ferroce does, with GSO) can
    /// have live QPs' frames dropped behind a first segment for a QP just destroyed.
    pub filter: bool,
    /// The interface index an IPv6 link-local address belongs to (its scope): the bound
    /// address's when it is link-local, and that of every link-local peer. 0: none (a
    /// link-local address cannot then be bound).
    pub scope_id: u32,
    /// Bind with `IP_FREEBIND`: an address the interface has but still tests for duplicates
    /// (a tentative IPv6 address) is bound instead of refused (`EADDRNOTAVAIL`). Off: the
    /// address must be usable now.
    pub freebind: bool,
    /// Bind with `SO_REUSEPORT`: other devices of this user may bind the same address and
    /// port (each must set it, this one too), and the kernel hands each datagram to one of
    /// them; [`crate::io::share`] forwards what reached the wrong one. Off: the address and
    /// port are this device's alone (`EADDRINUSE` while another socket holds them).
    pub reuse_port: bool,
}

impl UdpConfig {
    /// Bind `local`:4791 with the defaults (IP MTU 1500, batches of 64, the IPv4 ID solver,
    /// GSO and GRO on).
    pub fn new(local: IpAddr) -> Self {
        UdpConfig {
            local,
            port: ROCE_V2_PORT,
            mtu: 1500,
            batch: 64,
            solve_ident: true,
            gso: true,
            gro: true,
            filter: false,
            scope_id: 0,
            freebind: false,
            reuse_port: false,
        }
    }
}

/// How received IPv4 identifications were found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct IdentStats {
    /// A predicted ID (see the module docs) verified: full 32-bit ICRC strength.
    pub guessed: u64,
    /// Recovered by the solver (16-bit residual strength).
    pub solved: u64,
    /// … of which with DF the other way round than guessed.
    pub solved_df_flipped: u64,
    /// No ID verifies: handed up with ID 0 (the engine drops it on the ICRC).
    pub unsolved: u64,
}

/// What segmentation offload did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct OffloadStats {
    /// `UDP_SEGMENT` messages sent, and the datagrams (frames) they carried.
    pub gso_sends: u64,
    /// Datagrams those messages carried.
    pub gso_segments: u64,
    /// Times the kernel refused a GSO message (GSO is then off for the device's life).
    pub gso_refused: u64,
    /// Coalesced datagrams received (`UDP_GRO`), and the segments they held.
    pub gro_datagrams: u64,
    /// Segments those datagrams held.
    pub gro_segments: u64,
}

/// A handful of values computed per packet length, most recently made first out.
struct LenCache<T> {
    items: Vec<(usize, T)>,
    next: usize,
}

impl<T> LenCache<T> {
    const SIZE: usize = 8;

    fn new() -> Self {
        LenCache {
            items: Vec::with_capacity(Self::SIZE),
            next: 0,
        }
    }

    fn get(&mut self, key: usize, make: impl FnOnce(usize) -> T) -> &T {
        let i = match self.items.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None if self.items.len() < Self::SIZE => {
                self.items.push((key, make(key)));
                self.items.len() - 1
            }
            None => {
                let i = self.next;
                self.next = (self.next + 1) % Self::SIZE;
                self.items[i] = (key, make(key));
                i
            }
        };
        &self.items[i].1
    }
}

/// Where the receive side is in the datagrams of the last `recvmmsg` (a batch that ended
/// early resumes here).
#[derive(Default)]
struct RxCursor {
    /// Slots filled by the last call, and the one being delivered.
    filled: usize,
    slot: usize,
    /// Offset of the next segment in the slot's datagram, and its index.
    off: usize,
    seg: usize,
    /// (ID, DF) found for the previous segment of this datagram.
    prev: Option<(u16, bool)>,
}

/// A packet device on a kernel UDP socket (see the module documentation).
pub struct UdpDevice {
    sock: std::net::UdpSocket,
    local: IpAddr,
    port: u16,
    v6: bool,
    rx: Vec<RecvSlot>,
    rx_info: Vec<(Option<SocketAddr>, RecvInfo)>,
    /// The `recvmmsg` / `sendmmsg` headers, kept between calls (not zeroed for each).
    scratch: Box<sysudp::BatchScratch>,
    /// Datagrams the next `recvmmsg` asks for (see [`next_rx_hint`]).
    rx_hint: usize,
    /// Where each frame of a transmit batch goes (kept between calls, cleared for each).
    outs: Vec<Option<Out>>,
    cur: RxCursor,
    tx: Vec<Box<[u8]>>,
    capacity: usize,
    solve_ident: bool,
    gso: bool,
    gro: bool,
    stats: IoStats,
    ident: IdentStats,
    offload: OffloadStats,
    /// Last (ID, DF) seen per IPv4 source, for the next guess.
    last_ident: HashMap<Ipv4Addr, (u16, bool)>,
    solvers: LenCache<IdentSolver>,
    shifts: LenCache<Shift>,
    /// The multicast groups joined ([`PacketDevice::join_group`]): a socket bound to the
    /// group and port each (a socket bound to the unicast address receives no multicast).
    groups: Vec<(IpAddr, std::net::UdpSocket)>,
    /// Once a group was joined: the bound socket and every group's socket, one descriptor
    /// for the engine to sleep on ([`PacketDevice::poll_fd`]), so that a group's datagram
    /// wakes it as a unicast one does.
    ready: Option<super::sys::event::ReadySet>,
    /// Whether [`PacketDevice::rx_filter`] hands out a filter handle.
    filter: bool,
    /// The socket's kernel drop count last read, and the drops counted so far
    /// (`IoStats::rx_kernel_drops`).
    kernel_drops: std::cell::Cell<(u32, u64)>,
    /// [`UdpConfig::scope_id`]: given to link-local destinations.
    scope_id: u32,
}

/// An IPv6 link-local unicast address (fe80::/10), or a multicast one of link-local scope.
fn is_link_local(a: std::net::Ipv6Addr) -> bool {
    super::netdev::is_link_local_v6(&a) || (a.is_multicast() && a.segments()[0] & 0x000f == 2)
}

/// `dst`:`port` as a socket address, with `scope_id` when `dst` is link-local (the kernel
/// refuses to send to, or bind, one without its interface).
fn destination(dst: IpAddr, port: u16, scope_id: u32) -> SocketAddr {
    match dst {
        IpAddr::V6(a) if is_link_local(a) => {
            SocketAddr::V6(std::net::SocketAddrV6::new(a, port, 0, scope_id))
        }
        a => SocketAddr::new(a, port),
    }
}

impl Drop for UdpDevice {
    fn drop(&mut self) {
        tracing::info!(local = %self.local, port = self.port, stats = ?self.stats, offload = ?self.offload, "UDP device closed");
    }
}

impl UdpDevice {
    /// Bind and configure the socket.
    pub fn open(cfg: &UdpConfig) -> io::Result<Self> {
        if cfg.local.is_unspecified() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "UdpDevice needs a specific local address (it is covered by the ICRC)",
            ));
        }
        if cfg.batch == 0 || cfg.batch > sysudp::MAX_BATCH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the UDP backend's batch must be 1 to {} frames, not {}",
                    sysudp::MAX_BATCH,
                    cfg.batch
                ),
            ));
        }
        if !(128..=65535).contains(&cfg.mtu) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the UDP backend needs an IP MTU of 128 to 65535 bytes (a UDP datagram's limit), not {}",
                    cfg.mtu
                ),
            ));
        }
        if let IpAddr::V6(a) = cfg.local {
            if is_link_local(a) && cfg.scope_id == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{a} is link-local: the UDP backend needs its interface (scope)"),
                ));
            }
        }
        let bind_to = destination(cfg.local, cfg.port, cfg.scope_id);
        let sock = if cfg.freebind || cfg.reuse_port {
            sysudp::bind_opts(bind_to, cfg.freebind, cfg.reuse_port)?
        } else {
            std::net::UdpSocket::bind(bind_to)?
        };
        sock.set_nonblocking(true)?;
        let port = sock.local_addr()?.port();
        let fd = sock.as_fd();
        let v6 = cfg.local.is_ipv6();
        if v6 {
            let ip6 = libc::IPPROTO_IPV6;
            set_int(fd, ip6, sysudp::IPV6_MTU_DISCOVER, sysudp::IPV6_PMTUDISC_DO)?;
            set_int(fd, ip6, sysudp::IPV6_UNICAST_HOPS, 64)?;
            set_int(fd, ip6, sysudp::IPV6_RECVPKTINFO, 1)?;
            set_int(fd, ip6, sysudp::IPV6_RECVTCLASS, 1)?;
            set_int(fd, ip6, sysudp::IPV6_RECVHOPLIMIT, 1)?;
            set_int(fd, sysudp::SOL_UDP, sysudp::UDP_NO_CHECK6_RX, 1)?;
        } else {
            let ip = libc::IPPROTO_IP;
            set_int(fd, ip, sysudp::IP_MTU_DISCOVER, sysudp::IP_PMTUDISC_DO)?;
            set_int(fd, ip, sysudp::IP_TTL, 64)?;
            set_int(fd, ip, sysudp::IP_PKTINFO, 1)?;
            set_int(fd, ip, sysudp::IP_RECVTOS, 1)?;
            set_int(fd, ip, sysudp::IP_RECVTTL, 1)?;
            if let IpAddr::V4(a) = cfg.local {
                // Multicast leaves from the bound address's interface (not the default
                // route's); an interface without multicast refuses it, and sends none.
                let _ = sysudp::set_multicast_if_v4(fd, a);
            }
        }
        // Room for bursts: 4 MiB each way (FORCE works as root, else capped by rmem_max).
        for (force, plain) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        ] {
            if set_int(fd, libc::SOL_SOCKET, force, 4 << 20).is_err() {
                let _ = set_int(fd, libc::SOL_SOCKET, plain, 4 << 20);
            }
        }
        // Offloads, where the kernel has them: setting the socket's default segment size to 0
        // (none) fails on kernels without UDP_SEGMENT; UDP_GRO likewise.
        let gso = cfg.gso && set_int(fd, sysudp::SOL_UDP, sysudp::UDP_SEGMENT, 0).is_ok();
        let gro = cfg.gro && set_int(fd, sysudp::SOL_UDP, sysudp::UDP_GRO, 1).is_ok();
        let hdr = ETH + if v6 { IP6 } else { IP4 } + UDP;
        let capacity = cfg.mtu + ETH + 4;
        let room = if gro { 65_535 } else { cfg.mtu };
        let rx = (0..cfg.batch)
            .map(|_| RecvSlot::new(hdr + room, hdr))
            .collect();
        let tx = (0..cfg.batch)
            .map(|_| vec![0u8; capacity].into_boxed_slice())
            .collect();
        tracing::info!(local = %cfg.local, port, batch = cfg.batch, mtu = cfg.mtu, gso, gro, "UDP device open");
        Ok(UdpDevice {
            sock,
            local: cfg.local,
            port,
            v6,
            rx,
            rx_info: vec![(None, RecvInfo::default()); cfg.batch],
            scratch: sysudp::BatchScratch::new(),
            rx_hint: RX_HINT_MIN,
            outs: Vec::with_capacity(cfg.batch),
            cur: RxCursor::default(),
            tx,
            capacity,
            solve_ident: cfg.solve_ident,
            gso,
            gro,
            stats: IoStats::default(),
            ident: IdentStats::default(),
            offload: OffloadStats::default(),
            last_ident: HashMap::new(),
            solvers: LenCache::new(),
            shifts: LenCache::new(),
            groups: Vec::new(),
            ready: None,
            filter: cfg.filter,
            kernel_drops: std::cell::Cell::new((0, 0)),
            scope_id: cfg.scope_id,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        SocketAddr::new(self.local, self.port)
    }

    /// How received IPv4 identifications were recovered.
    pub fn ident_stats(&self) -> IdentStats {
        self.ident
    }

    /// What segmentation offload did.
    pub fn offload_stats(&self) -> OffloadStats {
        self.offload
    }

    /// Whether runs of frames go out as GSO messages (configured, the kernel has
    /// `UDP_SEGMENT`, and it has not refused one) and whether coalesced datagrams come in.
    pub fn offloads(&self) -> (bool, bool) {
        (self.gso, self.gro)
    }
}

/// Where the parts of an outgoing frame are.
#[derive(Clone, Debug)]
struct Out {
    dst: IpAddr,
    dport: u16,
    tclass: u8,
    /// The frame's IP header, and its UDP payload (BTH … ICRC).
    ip: Range<usize>,
    payload: Range<usize>,
}

/// Locate destination, traffic class and UDP payload of a frame (`None`: not IP/UDP).
fn locate(frame: &[u8]) -> Option<Out> {
    let (e, off) = EthernetRepr::parse(frame).ok()?;
    let ip = frame.get(off..)?;
    let (dst, tclass, hlen, plen) = match e.ethertype {
        eth::ETHERTYPE_IPV4 => {
            let (r, p) = Ipv4Repr::parse(ip).ok()?;
            (
                IpAddr::V4(r.dst),
                (r.dscp << 2) | r.ecn.bits(),
                p.header_len,
                p.payload_len,
            )
        }
        eth::ETHERTYPE_IPV6 => {
            let (r, p) = Ipv6Repr::parse(ip).ok()?;
            (
                IpAddr::V6(r.dst),
                (r.dscp << 2) | r.ecn.bits(),
                p.header_len,
                p.payload_len,
            )
        }
        _ => return None,
    };
    let udp_off = off + hlen;
    let (u, ulen) = UdpRepr::parse(frame.get(udp_off..udp_off + plen)?).ok()?;
    if ulen < UDP + icrc::LEN {
        return None;
    }
    Some(Out {
        dst,
        dport: u.dst_port,
        tclass,
        ip: off..udp_off,
        payload: udp_off + UDP..udp_off + ulen,
    })
}

/// Write the IP and UDP headers the kernel will put in front of `payload_len` bytes sent from
/// `local:port` to `dst:dport` with `tclass` (IPv4: identification `ident`, DF) into `out`;
/// returns the IP header's length (0: the address families differ).
#[allow(clippy::too_many_arguments)]
fn kernel_headers(
    out: &mut [u8; IP6 + UDP],
    local: IpAddr,
    port: u16,
    dst: IpAddr,
    dport: u16,
    tclass: u8,
    payload_len: usize,
    ident: u16,
) -> usize {
    let udp_len = (UDP + payload_len) as u16;
    let ihl = match (local, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let h = &mut out[..IP4];
            h[0] = 0x45;
            h[1] = tclass;
            h[2..4].copy_from_slice(&((IP4 as u16) + udp_len).to_be_bytes());
            h[4..6].copy_from_slice(&ident.to_be_bytes());
            h[6..8].copy_from_slice(&[0x40, 0]); // DF
            h[8] = 64;
            h[9] = PROTO_UDP;
            h[10..12].copy_from_slice(&[0, 0]);
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
            IP4
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let h = &mut out[..IP6];
            let w0 = (6u32 << 28) | (u32::from(tclass) << 20);
            h[0..4].copy_from_slice(&w0.to_be_bytes());
            h[4..6].copy_from_slice(&udp_len.to_be_bytes());
            h[6] = PROTO_UDP;
            h[7] = 64;
            h[8..24].copy_from_slice(&s.octets());
            h[24..40].copy_from_slice(&d.octets());
            IP6
        }
        _ => return 0,
    };
    let u = &mut out[ihl..ihl + UDP];
    u[0..2].copy_from_slice(&port.to_be_bytes());
    u[2..4].copy_from_slice(&dport.to_be_bytes());
    u[4..6].copy_from_slice(&udp_len.to_be_bytes());
    u[6..8].copy_from_slice(&[0, 0]);
    ihl
}

/// Recompute the ICRC at the end of `payload` (BTH … ICRC) for the headers the kernel writes
/// for a single datagram (IPv4 ID 0). A full CRC pass: see [`UdpDevice`]'s send path for the
/// incremental correction it uses instead.
pub fn rewrite_icrc_for_kernel(
    payload: &mut [u8],
    local: IpAddr,
    port: u16,
    dst: IpAddr,
    dport: u16,
    tclass: u8,
) -> bool {
    if payload.len() < icrc::LEN || local.is_ipv4() != dst.is_ipv4() {
        return false;
    }
    let mut h = [0u8; IP6 + UDP];
    let ihl = kernel_headers(&mut h, local, port, dst, dport, tclass, payload.len(), 0);
    let n = payload.len() - icrc::LEN;
    let c = icrc::compute(&h[..ihl], &h[ihl..ihl + UDP], &payload[..n]);
    payload[n..].copy_from_slice(&icrc::to_wire(c));
    true
}

/// XOR `with` into `acc`, then clear the bytes the ICRC masks (IPv4 TOS, TTL, checksum;
/// IPv6 traffic class, flow label, hop limit; the UDP checksum): what is left is the
/// difference the ICRC sees between two IP + UDP headers of the same layout.
fn covered_difference(acc: &mut [u8], with: &[u8], ihl: usize) {
    for (a, b) in acc.iter_mut().zip(with) {
        *a ^= b;
    }
    if ihl == IP4 {
        for i in [1, 8, 10, 11] {
            acc[i] = 0;
        }
    } else {
        acc[0] &= 0xf0;
        for i in [1, 2, 3, 7] {
            acc[i] = 0;
        }
    }
    acc[ihl + 6] = 0;
    acc[ihl + 7] = 0;
}

/// Correct the ICRC of `frame` (located as `o`) for the headers the kernel writes with IPv4
/// identification `ident`: incrementally when the frame's IP + UDP headers have the kernel's
/// layout (the usual case), else by recomputing it. Nothing changes when the addresses'
/// families differ or the payload is shorter than an ICRC (frames `locate` does not pass).
fn icrc_for_kernel(
    frame: &mut [u8],
    o: &Out,
    local: IpAddr,
    port: u16,
    ident: u16,
    shifts: &mut LenCache<Shift>,
) {
    let mut k = [0u8; IP6 + UDP];
    let ihl = kernel_headers(
        &mut k,
        local,
        port,
        o.dst,
        o.dport,
        o.tclass,
        o.payload.len(),
        ident,
    );
    let Some(t_len) = o.payload.len().checked_sub(icrc::LEN) else {
        return;
    };
    if ihl == 0 {
        return;
    }
    if o.ip.len() != ihl {
        // IPv4 options in the engine's frame: recompute for the kernel's plain header.
        let p = &mut frame[o.payload.clone()];
        let c = icrc::compute(&k[..ihl], &k[ihl..ihl + UDP], &p[..t_len]);
        p[t_len..].copy_from_slice(&icrc::to_wire(c));
        return;
    }
    let mut x = [0u8; IP6 + UDP];
    x[..ihl + UDP].copy_from_slice(&frame[o.ip.start..o.ip.end + UDP]);
    covered_difference(&mut x[..ihl + UDP], &k[..ihl + UDP], ihl);
    if x.iter().all(|&b| b == 0) {
        return;
    }
    let d = shifts.get(t_len, Shift::new).delta(&x[..ihl + UDP]);
    let p = &mut frame[o.payload.clone()];
    if let Some(c) = icrc::stored(p) {
        p[t_len..].copy_from_slice(&icrc::to_wire(c ^ d));
    }
}

/// Move the ICRC at the end of `payload` (IPv4) from identification `from` to `to`.
fn change_ident(payload: &mut [u8], from: u16, to: u16, shifts: &mut LenCache<Shift>) {
    let Some(t_len) = payload.len().checked_sub(icrc::LEN) else {
        return;
    };
    // The ID is IPv4 header bytes 4 and 5, followed by 14 header bytes and the UDP header.
    let mut x = [0u8; IP4 + UDP - 4];
    x[..2].copy_from_slice(&(from ^ to).to_be_bytes());
    let d = shifts.get(t_len, Shift::new).delta(&x);
    if let Some(c) = icrc::stored(payload) {
        payload[t_len..].copy_from_slice(&icrc::to_wire(c ^ d));
    }
}

/// Errors with which the kernel refuses a `UDP_SEGMENT` message that a plain datagram would
/// not get: no checksum offload on the route's device (`EIO`), a segment size or count it
/// does not take, or a kernel that does not know the control message (`EINVAL`, `EMSGSIZE`,
/// `ENOPROTOOPT`, `EOPNOTSUPP`).
fn gso_refusal(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::EMSGSIZE | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
    )
}

/// The predictions for a datagram's (or first segment's) IPv4 ID: the source's last ID + 1
/// (and its DF), then ID 0 with DF; a new source only the latter.
fn first_predictions(last: Option<(u16, bool)>) -> [(u16, bool); 2] {
    match last {
        Some((id, df)) => [(id.wrapping_add(1), df), (0, true)],
        None => [(0, true), (0, true)],
    }
}

/// Find the IPv4 ID and DF under which the packet verifies, given the header `ip` (ID and
/// flags are overwritten), `udp` and `transport` (BTH … ICRC). `predicted[0]` is tried with
/// one CRC pass, the others through the cached solver. Updates `stats`.
fn resolve_ident(
    ip: &mut [u8],
    udp: &[u8],
    transport: &[u8],
    predicted: &[(u16, bool)],
    solve: bool,
    solvers: &mut LenCache<IdentSolver>,
    stats: &mut IdentStats,
) -> Option<(u16, bool)> {
    let write_id = |ip: &mut [u8], id: u16, df: bool| {
        ip[4..6].copy_from_slice(&id.to_be_bytes());
        ip[6..8].copy_from_slice(&[if df { 0x40 } else { 0 }, 0]);
    };
    let (gid, gdf) = predicted[0];
    write_id(ip, gid, gdf);
    let stored = icrc::stored(transport)?;
    if transport.len() < icrc::LEN + 12 {
        return None;
    }
    let t = &transport[..transport.len() - icrc::LEN];
    let c = icrc::compute(ip, udp, t);
    if c == stored {
        stats.guessed += 1;
        return Some((gid, gdf));
    }
    let s = solvers.get(icrc::ipv4_ident_bytes_after(IP4, t.len()), IdentSolver::new);
    let d = c ^ stored;
    // The same difference, seen from the other DF.
    let d_flip = d ^ s.df_delta();
    for &(id, df) in &predicted[1..] {
        let want = if df == gdf { d } else { d_flip };
        if s.delta(id ^ gid) == want {
            stats.guessed += 1;
            return Some((id, df));
        }
    }
    if !solve {
        return None;
    }
    if let Some(x) = s.solve(d) {
        stats.solved += 1;
        return Some((gid ^ x, gdf));
    }
    if let Some(x) = s.solve(d_flip) {
        stats.solved += 1;
        stats.solved_df_flipped += 1;
        return Some((gid ^ x, !gdf));
    }
    None
}

impl UdpDevice {
    /// Build Ethernet + IP + UDP in front of the segment at `off..off + len` of the datagram
    /// in slot `k` (in place) and resolve the IPv4 identification. Returns the frame's start
    /// offset in the slot's buffer.
    /// With the start, whether the ICRC was found to match (an IPv4 identification guessed
    /// or solved: the ICRC over the synthesised headers then matches by construction).
    fn synthesise(&mut self, k: usize, off: usize, len: usize) -> Option<(usize, bool)> {
        let (src, info) = self.rx_info[k];
        let src = src?;
        let dport = self.port;
        let dst = info.dst.unwrap_or(self.local);
        // Headers of the socket's family only (the room in front of the datagram is sized
        // for it): an address of the other family is not ours to frame.
        if src.is_ipv6() != self.v6 || dst.is_ipv6() != self.v6 {
            return None;
        }
        let tclass = info.tclass.unwrap_or(0);
        let ttl = info.ttl.unwrap_or(64);
        let udp_len = u16::try_from(UDP + len).ok()?;
        let (ip_len, ethertype) = if self.v6 {
            (IP6, eth::ETHERTYPE_IPV6)
        } else {
            (IP4, eth::ETHERTYPE_IPV4)
        };
        // An IPv4 datagram says its total length in 16 bits: a segment longer than 65,507
        // bytes (a GRO segment size no kernel reports) cannot be framed; dropped and counted
        // like any other segment that cannot.
        let ip4_total = if self.v6 {
            0
        } else {
            u16::try_from(IP4 + UDP + len).ok()?
        };
        let data_at = self.rx[k].data_off + off;
        let start = data_at - UDP - ip_len - ETH;
        let predicted = match (src.ip(), self.cur.prev) {
            // A later segment of a coalesced datagram: counting on, or a fixed DF ID.
            (IpAddr::V4(_), Some((id, df))) => [(id.wrapping_add(1), df), (id, df)],
            (IpAddr::V4(a), None) => first_predictions(self.last_ident.get(&a).copied()),
            (IpAddr::V6(_), _) => [(0, true); 2],
        };
        let solve = self.solve_ident;
        let mut verified = false;
        let buf = &mut self.rx[k].buf[start..data_at + len];
        buf[..12].fill(0);
        buf[12..14].copy_from_slice(&ethertype.to_be_bytes());
        let (ip, rest) = buf[ETH..].split_at_mut(ip_len);
        let (udp, transport) = rest.split_at_mut(UDP);
        udp[0..2].copy_from_slice(&src.port().to_be_bytes());
        udp[2..4].copy_from_slice(&dport.to_be_bytes());
        udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
        udp[6..8].copy_from_slice(&[0, 0]);
        match (src.ip(), dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                ip[0] = 0x45;
                ip[1] = tclass;
                ip[2..4].copy_from_slice(&ip4_total.to_be_bytes());
                ip[8] = ttl;
                ip[9] = PROTO_UDP;
                ip[10..12].copy_from_slice(&[0, 0]);
                ip[12..16].copy_from_slice(&s.octets());
                ip[16..20].copy_from_slice(&d.octets());
                let found = resolve_ident(
                    ip,
                    udp,
                    transport,
                    &predicted,
                    solve,
                    &mut self.solvers,
                    &mut self.ident,
                );
                let (id, df) = match found {
                    Some(f) => {
                        if self.last_ident.len() >= 4096 {
                            self.last_ident.clear();
                        }
                        self.last_ident.insert(s, f);
                        f
                    }
                    None => {
                        self.ident.unsolved += 1;
                        (0, true)
                    }
                };
                self.cur.prev = found;
                verified = found.is_some();
                ip[4..6].copy_from_slice(&id.to_be_bytes());
                ip[6..8].copy_from_slice(&[if df { 0x40 } else { 0 }, 0]);
                let c = internet_checksum(ip);
                ip[10..12].copy_from_slice(&c.to_be_bytes());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let w0 = (6u32 << 28) | (u32::from(tclass) << 20);
                ip[0..4].copy_from_slice(&w0.to_be_bytes());
                ip[4..6].copy_from_slice(&udp_len.to_be_bytes());
                ip[6] = PROTO_UDP;
                ip[7] = ttl;
                ip[8..24].copy_from_slice(&s.octets());
                ip[24..40].copy_from_slice(&d.octets());
            }
            _ => return None,
        }
        Some((start, verified))
    }

    /// Hand up the datagrams (and segments) of the last `recvmmsg` from the cursor on, until
    /// `max` frames were delivered in this call (`*n` counts them). `true` when all were.
    fn deliver(
        &mut self,
        max: usize,
        n: &mut usize,
        f: &mut dyn FnMut(&[u8], super::IcrcCheck),
    ) -> bool {
        while self.cur.slot < self.cur.filled {
            if *n >= max {
                return false;
            }
            let k = self.cur.slot;
            let len = self.rx[k].len;
            if self.rx[k].truncated {
                self.stats.rx_dropped += 1;
                self.next_slot();
                continue;
            }
            let seg = match self.rx_info[k].1.gro_segment {
                Some(g) if self.gro && usize::from(g) < len => usize::from(g),
                _ => len,
            };
            let off = self.cur.off;
            let seg_len = seg.min(len - off);
            match self.synthesise(k, off, seg_len) {
                Some((start, verified)) => {
                    let slot = &self.rx[k];
                    let frame = &slot.buf[start..slot.data_off + off + seg_len];
                    self.stats.rx_frames += 1;
                    self.stats.rx_bytes += frame.len() as u64;
                    let icrc = if verified {
                        super::IcrcCheck::Good
                    } else {
                        super::IcrcCheck::Unchecked
                    };
                    f(frame, icrc);
                    *n += 1;
                }
                None => self.stats.rx_dropped += 1,
            }
            self.cur.off += seg_len;
            self.cur.seg += 1;
            if self.cur.off >= len {
                if self.cur.seg > 1 {
                    self.offload.gro_datagrams += 1;
                    self.offload.gro_segments += self.cur.seg as u64;
                    self.stats.rx_coalesced += self.cur.seg as u64;
                }
                self.next_slot();
            }
        }
        true
    }

    fn next_slot(&mut self) {
        self.cur.slot += 1;
        self.cur.off = 0;
        self.cur.seg = 0;
        self.cur.prev = None;
    }
}

/// Frames of one send batch grouped into messages: `(first, end)` index ranges into the
/// batch, every frame of a range sent in one GSO message (or alone).
struct Groups {
    ranges: [(usize, usize); sysudp::MAX_BATCH],
    len: usize,
}

impl Groups {
    /// Group `outs` (`None`: a frame that cannot be sent, skipped): a run of frames to the
    /// same destination and traffic class with equal payload sizes, the last possibly
    /// shorter, within the kernel's segment count and datagram size (`gso`), else singles.
    fn of(outs: &[Option<Out>], gso: bool) -> Groups {
        let mut g = Groups {
            ranges: [(0, 0); sysudp::MAX_BATCH],
            len: 0,
        };
        let mut i = 0;
        while i < outs.len() {
            let Some(o) = &outs[i] else {
                i += 1;
                continue;
            };
            let seg = o.payload.len();
            let mut end = i + 1;
            let mut bytes = seg;
            if gso {
                while end < outs.len() && end - i < sysudp::UDP_MAX_SEGMENTS {
                    let Some(p) = &outs[end] else {
                        break;
                    };
                    let plen = p.payload.len();
                    if (p.dst, p.dport, p.tclass) != (o.dst, o.dport, o.tclass)
                        || plen > seg
                        || bytes + plen > MAX_DATAGRAM
                    {
                        break;
                    }
                    bytes += plen;
                    end += 1;
                    if plen < seg {
                        break;
                    }
                }
            }
            g.ranges[g.len] = (i, end);
            g.len += 1;
            i = end;
        }
        g
    }

    fn ranges(&self) -> &[(usize, usize)] {
        &self.ranges[..self.len]
    }
}

impl UdpDevice {
    /// Send the frames `self.tx[..]` located in `outs`, grouped as `groups`, with their ICRCs
    /// already written for the IDs of their positions. Returns the index of a group whose GSO
    /// message the kernel refused (nothing from it on was sent), or `None` when every group
    /// went out or was dropped.
    fn send_groups(&mut self, outs: &[Option<Out>], groups: &Groups) -> Option<usize> {
        let mut parts: [&[u8]; sysudp::MAX_BATCH] = [&[]; sysudp::MAX_BATCH];
        let mut np = 0;
        let none = SendItem {
            parts: &[],
            dst: SocketAddr::new(self.local, 0),
            tclass: None,
            segment: None,
        };
        let mut spans = [(0usize, 0usize); sysudp::MAX_BATCH];
        for (gi, &(a, b)) in groups.ranges().iter().enumerate() {
            let start = np;
            for (o, buf) in outs[a..b].iter().zip(&self.tx[a..b]) {
                if let Some(o) = o {
                    parts[np] = &buf[o.payload.clone()];
                    np += 1;
                }
            }
            spans[gi] = (start, np);
        }
        let mut items = [none; sysudp::MAX_BATCH];
        for (gi, &(a, b)) in groups.ranges().iter().enumerate() {
            let o = outs[a].as_ref().expect("groups hold located frames");
            let (s, e) = spans[gi];
            items[gi] = SendItem {
                parts: &parts[s..e],
                dst: destination(o.dst, o.dport, self.scope_id),
                tclass: Some(o.tclass),
                segment: (b - a > 1).then(|| o.payload.len() as u16),
            };
        }
        let items = &items[..groups.len];
        let mut sent = 0;
        while sent < items.len() {
            match sysudp::send_batch(self.sock.as_fd(), &items[sent..], &mut self.scratch) {
                Ok(j) => {
                    for it in &items[sent..sent + j] {
                        self.stats.tx_frames += it.parts.len() as u64;
                        self.stats.tx_bytes += it.parts.iter().map(|p| p.len() as u64).sum::<u64>();
                        if it.segment.is_some() {
                            self.offload.gso_sends += 1;
                            self.offload.gso_segments += it.parts.len() as u64;
                            self.stats.tx_offloaded += it.parts.len() as u64;
                        }
                    }
                    sent += j.max(1);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if items[sent].segment.is_some() && gso_refusal(&e) => {
                    return Some(sent);
                }
                Err(_) => {
                    // Send buffer full, no route, message too long for the path MTU…:
                    // drop this message and go on (never block).
                    self.stats.tx_dropped += items[sent].parts.len() as u64;
                    sent += 1;
                }
            }
        }
        None
    }
}

impl UdpDevice {
    /// After a refused GSO message: send the frames of `rest` one datagram each, their ICRCs
    /// moved from the IDs of their positions in a run to the single datagram's ID 0.
    fn send_singly(&mut self, outs: &[Option<Out>], rest: &[(usize, usize)]) {
        let mut singles = Groups {
            ranges: [(0, 0); sysudp::MAX_BATCH],
            len: 0,
        };
        for &(a, b) in rest {
            for (j, (o, buf)) in outs[a..b].iter().zip(&mut self.tx[a..b]).enumerate() {
                let Some(o) = o else { continue };
                if !self.v6 && j > 0 {
                    change_ident(&mut buf[o.payload.clone()], j as u16, 0, &mut self.shifts);
                }
                singles.ranges[singles.len] = (a + j, a + j + 1);
                singles.len += 1;
            }
        }
        if let Some(r) = self.send_groups(outs, &singles) {
            // Singles carry no UDP_SEGMENT, so the kernel cannot refuse one for it: count any
            // such as dropped.
            for &(a, b) in &singles.ranges()[r..] {
                self.stats.tx_dropped += (b - a) as u64;
            }
        }
    }
}

/// A datagram as `recvmmsg` reports it (fuzzing and tests: [`UdpDevice::receive_datagrams`]).
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct Datagram<'a> {
    /// The sender's address (`None`: the kernel gave none).
    pub src: Option<SocketAddr>,
    /// The header's destination address, TOS / traffic class, TTL / hop limit and the GRO
    /// segment size, as the control messages said.
    pub dst: Option<IpAddr>,
    pub tclass: Option<u8>,
    pub ttl: Option<u8>,
    pub gro_segment: Option<u16>,
    /// The UDP payload (cut to the receive buffer, as `MSG_TRUNC` would).
    pub data: &'a [u8],
}

/// The receive control messages' parser on any bytes (fuzzing): (destination, TOS / traffic
/// class, TTL / hop limit, GRO segment size).
#[doc(hidden)]
pub fn parse_control(ctrl: &[u8]) -> (Option<IpAddr>, Option<u8>, Option<u8>, Option<u16>) {
    let i = sysudp::parse_control(ctrl);
    (i.dst, i.tclass, i.ttl, i.gro_segment)
}

impl UdpDevice {
    /// Fuzzing (`fuzz/fuzz_targets/backend_rx.rs`) and tests: hand up `datagrams` (at most the
    /// batch size; the rest are ignored) as if one `recvmmsg` had returned them, through the
    /// same splitting, header synthesis and IPv4 identification recovery as received ones,
    /// `max` frames per call of the receive loop, each with what the backend knows of its ICRC
    /// (as [`PacketDevice::recv_batch_checked`]). Returns the frames handed up.
    #[doc(hidden)]
    pub fn receive_datagrams(
        &mut self,
        datagrams: &[Datagram<'_>],
        max: usize,
        f: &mut dyn FnMut(&[u8], super::IcrcCheck),
    ) -> usize {
        let got = datagrams.len().min(self.rx.len());
        for (k, d) in datagrams[..got].iter().enumerate() {
            let slot = &mut self.rx[k];
            let room = slot.buf.len() - slot.data_off;
            let len = d.data.len().min(room);
            slot.buf[slot.data_off..slot.data_off + len].copy_from_slice(&d.data[..len]);
            slot.len = len;
            slot.truncated = d.data.len() > room;
            let info = RecvInfo {
                dst: d.dst,
                tclass: d.tclass,
                ttl: d.ttl,
                gro_segment: d.gro_segment.filter(|&g| g > 0),
            };
            self.rx_info[k] = (d.src, info);
        }
        self.cur = RxCursor {
            filled: got,
            ..RxCursor::default()
        };
        let mut total = 0;
        loop {
            let mut n = 0;
            let done = self.deliver(max.max(1), &mut n, f);
            total += n;
            if done || n == 0 {
                return total;
            }
        }
    }

    /// Whether the device splits coalesced datagrams (`UDP_GRO` was accepted).
    #[doc(hidden)]
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// The receive buffer's room for one (coalesced) datagram.
    #[doc(hidden)]
    pub fn receive_room(&self) -> usize {
        self.rx.first().map_or(0, |s| s.buf.len() - s.data_off)
    }
}

/// The fewest datagrams a `recvmmsg` asks for.
const RX_HINT_MIN: usize = 4;

/// How many datagrams the next `recvmmsg` asks for, after one that asked for `want` and got
/// `got`, with `slots` receive slots. Each message asked for costs a header set up in user
/// space and, for the one that finds the queue empty, a header and iovec copied in by the
/// kernel; a latency-bound loop (one datagram per round trip, most calls finding nothing) paid
/// that for all 64 slots on every call: 14 % of its CPU samples. So ask for twice what the
/// last call got, at least [`RX_HINT_MIN`], and double while calls fill what they asked for
/// (the caller then calls again at once, so a burst is read in a few calls, not lost).
fn next_rx_hint(want: usize, got: usize, slots: usize) -> usize {
    let next = if got >= want { want * 2 } else { got * 2 };
    next.clamp(RX_HINT_MIN.min(slots), slots.max(1))
}

impl UdpDevice {
    /// Join (open a socket bound to `group` and the port, a member of the group) or leave.
    fn update_group(&mut self, group: IpAddr, join: bool) -> io::Result<()> {
        let (v6, port, local) = (self.v6, self.port, self.local);
        super::update_groups(&mut self.groups, group, join, || {
            if !group.is_multicast() || group.is_ipv6() != v6 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{group} is not a multicast group of the bound address's family"),
                ));
            }
            let sock = sysudp::bind_shared(SocketAddr::new(group, port))?;
            let fd = sock.as_fd();
            match (group, local) {
                (IpAddr::V4(g), IpAddr::V4(l)) => {
                    let ip = libc::IPPROTO_IP;
                    set_int(fd, ip, sysudp::IP_PKTINFO, 1)?;
                    set_int(fd, ip, sysudp::IP_RECVTOS, 1)?;
                    set_int(fd, ip, sysudp::IP_RECVTTL, 1)?;
                    sock.join_multicast_v4(&g, &l)?;
                }
                (IpAddr::V6(g), _) => {
                    let ip6 = libc::IPPROTO_IPV6;
                    set_int(fd, ip6, sysudp::IPV6_RECVPKTINFO, 1)?;
                    set_int(fd, ip6, sysudp::IPV6_RECVTCLASS, 1)?;
                    set_int(fd, ip6, sysudp::IPV6_RECVHOPLIMIT, 1)?;
                    sock.join_multicast_v6(&g, 0)?;
                }
                _ => return Err(io::Error::from(io::ErrorKind::InvalidInput)),
            }
            tracing::info!(%group, port, "UDP device joined a multicast group");
            Ok(sock)
        })
    }
}

impl PacketDevice for UdpDevice {
    fn recv_batch(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        self.recv_batch_checked(max, &mut |fr, _| f(fr))
    }

    /// IPv4 frames whose identification was guessed or solved come with
    /// [`IcrcCheck::Good`](super::IcrcCheck): finding the ID computed their ICRC.
    fn recv_batch_checked(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], super::IcrcCheck),
    ) -> io::Result<usize> {
        let mut n = 0;
        if !self.deliver(max, &mut n, f) {
            return Ok(n);
        }
        // The bound socket, then each multicast group's.
        for g in 0..=self.groups.len() {
            while n < max {
                // Each datagram is at least one frame: never receive more than can be handed up.
                // The bound socket's calls are sized by the hint; a group socket's (rarely
                // used, and mostly empty) ask for all and leave the hint alone.
                let hint = if g == 0 { self.rx_hint } else { usize::MAX };
                let want = (max - n).min(self.rx.len()).min(hint);
                let fd = match g {
                    0 => self.sock.as_fd(),
                    _ => self.groups[g - 1].1.as_fd(),
                };
                let got = sysudp::recv_batch(fd, &mut self.rx[..want], &mut self.scratch)?;
                if g == 0 {
                    self.rx_hint = next_rx_hint(want, got, self.rx.len());
                }
                for k in 0..got {
                    let slot = &self.rx[k];
                    self.rx_info[k] = (slot.source(), sysudp::parse_control(slot.control()));
                }
                self.cur = RxCursor {
                    filled: got,
                    ..RxCursor::default()
                };
                if !self.deliver(max, &mut n, f) {
                    return Ok(n);
                }
                if got < want {
                    break;
                }
            }
        }
        Ok(n)
    }

    fn send_batch(
        &mut self,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> io::Result<usize> {
        let mut total = 0;
        let cap = self.capacity;
        while total < max {
            let want = (max - total).min(self.tx.len());
            // Kept between calls (an idle engine calls this every round: no array of
            // `MAX_BATCH` entries to initialise when there is nothing to send).
            let mut outs_v = std::mem::take(&mut self.outs);
            outs_v.clear();
            let mut k = 0;
            while k < want {
                let Some(len) = fill(&mut self.tx[k][..cap]) else {
                    break;
                };
                let frame = &self.tx[k][..len.min(cap)];
                let o = locate(frame).filter(|o| o.dst.is_ipv6() == self.v6);
                if o.is_none() {
                    self.stats.tx_dropped += 1;
                }
                outs_v.push(o);
                k += 1;
            }
            if k == 0 {
                self.outs = outs_v;
                break;
            }
            total += k;
            let outs = &outs_v[..k];
            let groups = Groups::of(outs, self.gso);
            // Each frame's ICRC for the headers the kernel writes: segment i of a GSO
            // message carries IPv4 ID i (see the module docs), a single datagram ID 0.
            // (`locate` checked what `icrc_for_kernel` needs: same address family, a payload
            // of at least the ICRC.)
            for &(a, b) in groups.ranges() {
                for (j, i) in (a..b).enumerate() {
                    if let Some(o) = &outs[i] {
                        icrc_for_kernel(
                            &mut self.tx[i],
                            o,
                            self.local,
                            self.port,
                            j as u16,
                            &mut self.shifts,
                        );
                    }
                }
            }
            if let Some(refused) = self.send_groups(outs, &groups) {
                // The kernel refused GSO: send the rest one datagram each, from now on.
                self.gso = false;
                self.offload.gso_refused += 1;
                tracing::warn!(local = %self.local, "UDP_SEGMENT refused by the kernel; sending single datagrams");
                self.send_singly(outs, &groups.ranges()[refused..]);
            }
            self.outs = outs_v;
            if k < want {
                break;
            }
        }
        Ok(total)
    }

    fn wait_readable(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        match &self.ready {
            Some(r) => poll_readable(&[r.fd()], timeout).map(drop),
            None => poll_readable(&[self.sock.as_fd()], timeout).map(drop),
        }
    }

    /// A filter handle on a duplicate of the bound socket's descriptor, when
    /// [`UdpConfig::filter`] asks for it.
    fn rx_udp_checksum_synthesised(&self) -> bool {
        true
    }
    fn rx_filter(&self) -> Option<crate::io::udp_filter::SocketFilter> {
        if !self.filter {
            return None;
        }
        match self.sock.try_clone() {
            Ok(s) => Some(crate::io::udp_filter::SocketFilter::new(s, self.v6)),
            Err(e) => {
                tracing::warn!(error = %e, "no UDP socket filter: the socket could not be shared");
                None
            }
        }
    }

    /// A socket bound to `group`:port with `SO_REUSEADDR` (other programs on the host may bind
    /// it too: each receives a copy), a member of the group on the bound address's interface.
    /// From the first join on, [`PacketDevice::poll_fd`] is a descriptor over the bound
    /// socket and every group's (a group's socket leaves it when it closes), so a group's
    /// datagram wakes an engine sleeping on it: a device wrapping this one watches the new
    /// descriptor too once its `join_group` returns.
    fn join_group(&mut self, group: IpAddr, join: bool) -> io::Result<()> {
        self.update_group(group, join)?;
        if !join {
            return Ok(());
        }
        use std::os::fd::{AsFd, AsRawFd};
        let Some((_, s)) = self.groups.iter().find(|(g, _)| *g == group) else {
            return Ok(());
        };
        let fd = s.as_fd().as_raw_fd();
        let ready = match &mut self.ready {
            Some(r) => r,
            none => none.insert(super::sys::event::ReadySet::new(&[self
                .sock
                .as_fd()
                .as_raw_fd()])?),
        };
        ready.watch(fd)
    }

    fn frame_capacity(&self) -> usize {
        self.capacity
    }

    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::{AsFd, AsRawFd};
        Some(match &self.ready {
            Some(r) => r.fd(),
            None => self.sock.as_fd().as_raw_fd(),
        })
    }

    fn medium(&self) -> Medium {
        Medium::UdpSocket
    }

    fn stats(&self) -> IoStats {
        if let Ok(now) = sysudp::socket_drops(self.sock.as_fd()) {
            let (seen, total) = self.kernel_drops.get();
            // A 32-bit counter in the kernel: the difference wraps with it.
            self.kernel_drops
                .set((now, total + u64::from(now.wrapping_sub(seen))));
        }
        IoStats {
            rx_kernel_drops: self.kernel_drops.get().1,
            ..self.stats
        }
    }

    fn describe(&self) -> String {
        format!(
            "udp({}, batch {}{}{}{})",
            self.local_addr(),
            self.rx.len(),
            if self.solve_ident {
                ", ident solver"
            } else {
                ""
            },
            if self.gso { ", gso" } else { "" },
            if self.gro { ", gro" } else { "" },
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::wire::*;
    use std::net::Ipv6Addr;

    #[test]
    fn receive_hint_follows_what_calls_find() {
        // Nothing or one datagram per call: the floor.
        assert_eq!(next_rx_hint(64, 0, 64), RX_HINT_MIN);
        assert_eq!(next_rx_hint(4, 1, 64), RX_HINT_MIN);
        // Full calls double up to the slots; a partial call falls back to twice its count.
        assert_eq!(next_rx_hint(4, 4, 64), 8);
        assert_eq!(next_rx_hint(32, 32, 64), 64);
        assert_eq!(next_rx_hint(64, 64, 64), 64);
        assert_eq!(next_rx_hint(64, 20, 64), 40);
        // Fewer slots than the floor.
        assert_eq!(next_rx_hint(2, 2, 2), 2);
        assert_eq!(next_rx_hint(1, 0, 1), 1);
    }

    /// A RoCE SEND frame (IP headers of the family of `src`, UDP port 4791, a payload pattern
    /// of `psn`), for this module's tests and `udp_set`'s.
    pub(crate) fn frame_with(
        src: IpAddr,
        dst: IpAddr,
        ident: u16,
        sport: u16,
        psn: u32,
        payload: usize,
    ) -> Vec<u8> {
        let ip = match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => IpRepr::V4(Ipv4Repr {
                src: s,
                dst: d,
                dscp: 26,
                ecn: Ecn::Ect0,
                ident,
                dont_frag: false,
                ttl: 17,
            }),
            (IpAddr::V6(s), IpAddr::V6(d)) => IpRepr::V6(Ipv6Repr {
                src: s,
                dst: d,
                dscp: 26,
                ecn: Ecn::Ect0,
                flow_label: 0x12345,
                hop_limit: 17,
            }),
            _ => unreachable!(),
        };
        let f = FrameRepr {
            eth: Some(EthernetRepr {
                dst: MacAddr([2; 6]),
                src: MacAddr([4; 6]),
                vlan: None,
                ethertype: 0,
            }),
            ip,
            udp: UdpRepr {
                src_port: sport,
                dst_port: ROCE_V2_PORT,
                checksum: 0,
            },
            roce: RoceRepr::new(
                BthRepr::new(Opcode::RC_SEND_ONLY, QpNumber::new(0x123), Psn::new(psn)),
                ExtRepr::default(),
                payload,
            ),
        };
        let mut b = vec![0u8; f.buffer_len()];
        let data: Vec<u8> = (0..payload)
            .map(|i| (i as u8) ^ (psn as u8).wrapping_mul(7))
            .collect();
        f.emit(&mut b, &data).unwrap();
        b
    }

    fn frame(src: IpAddr, dst: IpAddr, ident: u16, sport: u16, payload: usize) -> Vec<u8> {
        frame_with(src, dst, ident, sport, 5, payload)
    }

    fn v4_pair() -> (IpAddr, IpAddr) {
        (
            Ipv4Addr::new(10, 61, 1, 2).into(),
            Ipv4Addr::new(10, 61, 2, 2).into(),
        )
    }

    fn v6_pair() -> (IpAddr, IpAddr) {
        (
            "fd61:1::2".parse::<Ipv6Addr>().unwrap().into(),
            "fd61:2::2".parse::<Ipv6Addr>().unwrap().into(),
        )
    }

    /// The kernel's headers for `o` sent from `local:port` with `ident`.
    fn kernel_hdr(local: IpAddr, port: u16, o: &Out, ident: u16) -> (Vec<u8>, Vec<u8>) {
        let mut h = [0u8; IP6 + UDP];
        let ihl = kernel_headers(
            &mut h,
            local,
            port,
            o.dst,
            o.dport,
            o.tclass,
            o.payload.len(),
            ident,
        );
        assert!(ihl > 0);
        (h[..ihl].to_vec(), h[ihl..ihl + UDP].to_vec())
    }

    #[test]
    fn corrected_icrc_matches_kernel_headers_for_every_ident() {
        let mut shifts = LenCache::new();
        for (s, d) in [v4_pair(), v6_pair()] {
            for (len, ident) in [(0, 0u16), (1, 1), (100, 7), (1000, 63), (4096, 0xffff)] {
                let f = frame(s, d, 0x4242, 0xc123, len);
                let o = locate(&f).unwrap();
                assert_eq!((o.dst, o.tclass), (d, (26 << 2) | 2));
                let (ip, udp) = kernel_hdr(s, 4791, &o, ident);
                // As emitted, the engine's headers differ from the kernel's...
                assert!(parse_roce(&ip, &udp, &f[o.payload.clone()]).is_err());
                // ...and after the correction the payload verifies under the kernel's, the
                // same ICRC as a full recomputation.
                let mut k = f.clone();
                icrc_for_kernel(&mut k, &o, s, 4791, ident, &mut shifts);
                assert!(
                    parse_roce(&ip, &udp, &k[o.payload.clone()]).is_ok(),
                    "{s} len {len} ident {ident}"
                );
                let t = &k[o.payload.start..o.payload.end - 4];
                assert_eq!(
                    icrc::stored(&k[o.payload.clone()]),
                    Some(icrc::compute(&ip, &udp, t))
                );
                if ident == 0 {
                    let mut r = f.clone();
                    let p = &mut r[o.payload.clone()];
                    assert!(rewrite_icrc_for_kernel(
                        p, s, 4791, o.dst, o.dport, o.tclass
                    ));
                    assert_eq!(r, k);
                }
                // Moving a frame to another ID later (the GSO fallback).
                if s.is_ipv4() {
                    change_ident(&mut k[o.payload.clone()], ident, 0, &mut shifts);
                    let (ip0, udp0) = kernel_hdr(s, 4791, &o, 0);
                    assert!(parse_roce(&ip0, &udp0, &k[o.payload.clone()]).is_ok());
                }
            }
        }
    }

    #[test]
    fn a_corrupted_frame_stays_corrupted() {
        // The correction is incremental: it does not bless a frame whose ICRC was wrong (the
        // full recomputation this replaced would have).
        let mut shifts = LenCache::new();
        for (s, d) in [v4_pair(), v6_pair()] {
            let mut f = frame(s, d, 9, 0xc000, 300);
            let o = locate(&f).unwrap();
            f[o.payload.start + 40] ^= 0x10;
            icrc_for_kernel(&mut f, &o, s, 4791, 3, &mut shifts);
            let (ip, udp) = kernel_hdr(s, 4791, &o, 3);
            assert!(matches!(
                parse_roce(&ip, &udp, &f[o.payload.clone()]),
                Err(Error::BadIcrc { .. })
            ));
        }
    }

    #[test]
    fn ipv4_options_in_the_frame_are_recomputed_away() {
        // An engine frame with 4 bytes of IPv4 options (NOPs): the kernel writes none, so the
        // layouts differ and the device recomputes.
        let (s, d) = v4_pair();
        let f = frame(s, d, 1, 0xc000, 64);
        let mut g = f[..ETH + IP4].to_vec();
        g.extend_from_slice(&[1, 1, 1, 1]);
        g.extend_from_slice(&f[ETH + IP4..]);
        g[ETH] = 0x46;
        let total = u16::from_be_bytes([g[ETH + 2], g[ETH + 3]]) + 4;
        g[ETH + 2..ETH + 4].copy_from_slice(&total.to_be_bytes());
        g[ETH + 10..ETH + 12].copy_from_slice(&[0, 0]);
        let c = internet_checksum(&g[ETH..ETH + 24]);
        g[ETH + 10..ETH + 12].copy_from_slice(&c.to_be_bytes());
        let o = locate(&g).unwrap();
        assert_eq!(o.ip.len(), 24);
        let mut shifts = LenCache::new();
        icrc_for_kernel(&mut g, &o, s, 4791, 2, &mut shifts);
        let (ip, udp) = kernel_hdr(s, 4791, &o, 2);
        assert!(parse_roce(&ip, &udp, &g[o.payload.clone()]).is_ok());
    }

    fn out(dst: u8, tclass: u8, len: usize) -> Option<Out> {
        Some(Out {
            dst: Ipv4Addr::new(10, 0, 0, dst).into(),
            dport: 4791,
            tclass,
            ip: 14..34,
            payload: 42..42 + len,
        })
    }

    #[test]
    fn groups_are_runs_of_equal_sizes_to_one_destination() {
        let outs = vec![
            out(1, 0, 100), // alone: the next is larger
            out(1, 0, 200),
            out(1, 0, 200),
            out(1, 0, 150), // shorter: ends the run
            out(1, 0, 150),
            out(2, 0, 150), // another destination
            out(2, 0, 150),
            out(2, 4, 150), // another traffic class
            None,           // not sendable: skipped, ends a run
            out(2, 4, 150),
        ];
        let g = Groups::of(&outs, true);
        assert_eq!(
            g.ranges(),
            &[(0, 1), (1, 4), (4, 5), (5, 7), (7, 8), (9, 10)]
        );
        let singles = Groups::of(&outs, false);
        assert_eq!(singles.len, 9);
        // The kernel's limits: 64 segments, 65,507 bytes.
        let many: Vec<Option<Out>> = (0..64).map(|_| out(1, 0, 96)).collect();
        assert_eq!(Groups::of(&many, true).ranges(), &[(0, 64)]);
        let big: Vec<Option<Out>> = (0..20).map(|_| out(1, 0, 4112)).collect();
        assert_eq!(Groups::of(&big, true).ranges(), &[(0, 15), (15, 20)]);
        const { assert!(15 * 4112 <= MAX_DATAGRAM && 16 * 4112 > MAX_DATAGRAM) };
    }

    /// Found by the receive-path fuzz target (issue 17): a datagram whose source or header
    /// destination is of the other address family than the socket's made the header
    /// synthesis index past the room in front of the datagram (an IPv6 header in the 20
    /// bytes of an IPv4 one: a panic), or frame IPv4 addresses as an IPv6 header. Such a
    /// datagram is dropped and counted.
    #[test]
    fn a_datagram_of_the_other_family_is_dropped_not_framed() {
        let mut cfg = UdpConfig::new(IpAddr::V4(Ipv4Addr::LOCALHOST));
        cfg.port = 0;
        let mut d = UdpDevice::open(&cfg).unwrap();
        let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
        let data = [0u8; 40];
        let dg = |src: IpAddr, dst: Option<IpAddr>| Datagram {
            src: Some(SocketAddr::new(src, 4791)),
            dst,
            tclass: None,
            ttl: None,
            gro_segment: None,
            data: &data,
        };
        let v4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let mut n = 0;
        let got = d.receive_datagrams(
            &[
                dg(v6, Some(v6)),
                dg(v4, Some(v6)),
                dg(v6, None),
                dg(v4, None),
            ],
            8,
            &mut |_, _| n += 1,
        );
        assert_eq!((got, n), (1, 1), "only the IPv4 datagram is framed");
        assert_eq!(d.stats().rx_dropped, 3);
    }

    /// A link-local peer is reached through the device's interface (the kernel refuses a
    /// link-local destination without one); other addresses carry no scope; a link-local
    /// address is not bound without its interface.
    #[test]
    fn link_local_addresses_carry_the_interface() {
        let ll: IpAddr = "fe80::5054:ff:fe12:3456".parse().unwrap();
        match destination(ll, 4791, 7) {
            SocketAddr::V6(a) => assert_eq!((a.scope_id(), a.port()), (7, 4791)),
            a => panic!("{a}"),
        }
        let mcast: IpAddr = "ff02::1".parse().unwrap();
        assert!(matches!(destination(mcast, 4791, 7), SocketAddr::V6(a) if a.scope_id() == 7));
        for other in ["fd77::2", "ff0e::1", "10.0.0.1", "::ffff:10.0.0.1"] {
            let ip: IpAddr = other.parse().unwrap();
            assert_eq!(
                destination(ip, 4791, 7),
                SocketAddr::new(ip, 4791),
                "{other}"
            );
        }
        let e = UdpDevice::open(&UdpConfig::new(ll)).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("link-local"), "{e}");
    }

    #[test]
    fn locate_rejects_non_roce() {
        let s: IpAddr = Ipv4Addr::new(1, 2, 3, 4).into();
        let f = frame(s, Ipv4Addr::new(5, 6, 7, 8).into(), 0, 4791, 0);
        assert!(locate(&f).is_some());
        for n in 0..f.len() - 4 {
            let _ = locate(&f[..n]);
        }
        let mut arp = f.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(locate(&arp).is_none());
    }

    fn loopback_pair(local: IpAddr, gso: bool, gro: bool) -> Option<(UdpDevice, UdpDevice)> {
        let mk = || {
            let mut c = UdpConfig::new(local);
            c.port = 0;
            c.mtu = 9000;
            c.gso = gso;
            c.gro = gro;
            UdpDevice::open(&c)
        };
        match (mk(), mk()) {
            (Ok(a), Ok(b)) => Some((a, b)),
            _ => {
                eprintln!("no {local} loopback here; skipping");
                None
            }
        }
    }

    /// Point frame `f` (built for `local`) at port `port` (the UDP header right after the IP
    /// header; the ICRC covers the port, so it is recomputed).
    pub(crate) fn to_port(f: &mut [u8], local: IpAddr, port: u16) {
        let u = ETH + if local.is_ipv6() { IP6 } else { IP4 };
        f[u + 2..u + 4].copy_from_slice(&port.to_be_bytes());
        let n = f.len() - 4;
        let c = icrc::compute(&f[ETH..u], &f[u..u + UDP], &f[u + UDP..n]);
        f[n..].copy_from_slice(&icrc::to_wire(c));
    }

    fn send_frames(a: &mut UdpDevice, frames: &[Vec<u8>]) -> usize {
        let mut k = 0;
        let mut sent = 0;
        while k < frames.len() {
            sent += a
                .send_batch(64, &mut |buf| {
                    let f = frames.get(k)?;
                    buf[..f.len()].copy_from_slice(f);
                    k += 1;
                    Some(f.len())
                })
                .unwrap();
        }
        sent
    }

    fn receive(b: &mut UdpDevice, want: usize, max: usize) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while got.len() < want && std::time::Instant::now() < deadline {
            b.wait_readable(Some(Duration::from_millis(50))).unwrap();
            let n = b.recv_batch(max, &mut |f| got.push(f.to_vec())).unwrap();
            assert!(n <= max, "recv_batch handed up {n} > {max} frames");
        }
        got
    }

    /// The pieces of a frame the device synthesised: (IP header, UDP header, transport).
    fn pieces(f: &[u8], v6: bool) -> (&[u8], &[u8], &[u8]) {
        let ip_len = if v6 { IP6 } else { IP4 };
        (
            &f[ETH..ETH + ip_len],
            &f[ETH + ip_len..ETH + ip_len + UDP],
            &f[ETH + ip_len + UDP..],
        )
    }

    /// A real kernel round trip without root: two devices on loopback (ephemeral ports, so
    /// the frames' destination port is not 4791 and `parse_roce` checks the ICRC instead of
    /// `parse_frame`). Frames of growing sizes: no runs, single datagrams (ID 0).
    #[test]
    fn loopback_round_trip_verifies() {
        for local in [
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ] {
            for offload in [false, true] {
                let Some((mut a, mut b)) = loopback_pair(local, offload, offload) else {
                    continue;
                };
                let bport = b.local_addr().port();
                let frames: Vec<Vec<u8>> = (0..20u16)
                    .map(|i| {
                        let mut f = frame(local, local, 0x9000 + i, 0xc000, usize::from(i) * 13);
                        to_port(&mut f, local, bport);
                        f
                    })
                    .collect();
                assert_eq!(send_frames(&mut a, &frames), 20);
                assert_eq!(a.stats().tx_frames, 20);
                assert_eq!(a.offload_stats().gso_sends, 0);
                let got = receive(&mut b, 20, 64);
                assert_eq!(got.len(), 20, "{local}");
                for (i, f) in got.iter().enumerate() {
                    let p = crate::wire::packet::decode_frame(f);
                    // decode_frame refuses the non-RoCE port; check the pieces by hand.
                    assert!(matches!(p, Err(Error::NotRoceV2Port(_))));
                    let (ip, udp, t) = pieces(f, local.is_ipv6());
                    let r = parse_roce(ip, udp, t).unwrap();
                    assert_eq!(r.repr.bth.psn, Psn::new(5));
                    assert_eq!(r.payload.len(), i * 13);
                    if local.is_ipv4() {
                        assert_eq!(&ip[4..8], &[0, 0, 0x40, 0], "ID 0 with DF");
                        assert_eq!(internet_checksum(ip), 0);
                        // ECN came through IP_RECVTOS.
                        assert_eq!(ip[1], (26 << 2) | 2);
                    }
                    assert_eq!(u16::from_be_bytes([udp[0], udp[1]]), a.local_addr().port());
                }
                assert_eq!(
                    b.ident_stats().guessed,
                    if local.is_ipv4() { 20 } else { 0 }
                );
                assert_eq!(b.medium(), Medium::UdpSocket);
            }
        }
    }

    /// Runs of equal-sized frames through the kernel's segmentation offload on loopback (which
    /// passes a GSO super-datagram along whole): with `UDP_GRO` the receiver gets it whole
    /// and splits it; without, the kernel cuts it up for the socket. Either way every frame
    /// arrives once, in order, byte for byte, and verifies with the IPv4 ID the kernel gave
    /// it (segment i: ID i), predicted at full strength.
    #[test]
    fn loopback_gso_runs_arrive_as_frames() {
        for local in [
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ] {
            for gro in [true, false] {
                let Some((mut a, mut b)) = loopback_pair(local, true, gro) else {
                    continue;
                };
                assert_eq!(
                    a.offloads(),
                    (true, gro),
                    "this kernel has UDP_SEGMENT/UDP_GRO"
                );
                let bport = b.local_addr().port();
                // 3 runs: 40 × 1000 B, then 15 × 4096 B + a shorter last, then 64 × 64 B.
                let mut sizes = vec![1000usize; 40];
                sizes.extend(std::iter::repeat_n(4096, 15));
                sizes.push(100);
                sizes.extend(std::iter::repeat_n(64, 64));
                let frames: Vec<Vec<u8>> = sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| {
                        let mut f = frame_with(local, local, 0x100, 0xc000, i as u32, n);
                        to_port(&mut f, local, bport);
                        f
                    })
                    .collect();
                assert_eq!(send_frames(&mut a, &frames), frames.len());
                let o = a.offload_stats();
                assert!(
                    o.gso_sends >= 3 && o.gso_segments == frames.len() as u64,
                    "{o:?}"
                );
                // A small max: the receiver stops inside a coalesced datagram and resumes.
                let got = receive(&mut b, frames.len(), 7);
                assert_eq!(got.len(), frames.len(), "{local} gro={gro}");
                let mut run_start = 0;
                for (i, f) in got.iter().enumerate() {
                    let (ip, udp, t) = pieces(f, local.is_ipv6());
                    let r = parse_roce(ip, udp, t)
                        .unwrap_or_else(|e| panic!("{local} gro={gro} frame {i}: {e}"));
                    assert_eq!(r.repr.bth.psn, Psn::new(i as u32), "in order");
                    let want = &frames[i];
                    let u = ETH + ip.len() + UDP;
                    assert_eq!(&t[..t.len() - 4], &want[u..want.len() - 4], "bytes of {i}");
                    if local.is_ipv4() {
                        // Runs start at 40 and 56 (sizes change) and 64 (send batches
                        // hold 64 frames).
                        if [40, 56, 64].contains(&i) {
                            run_start = i;
                        }
                        let id = u16::from_be_bytes([ip[4], ip[5]]);
                        assert_eq!(id as usize, i - run_start, "ID of frame {i}");
                        assert_eq!(ip[6] & 0x40, 0x40, "DF");
                    }
                }
                if local.is_ipv4() {
                    let ids = b.ident_stats();
                    assert_eq!(ids.guessed, frames.len() as u64, "{ids:?}");
                }
                let bo = b.offload_stats();
                if gro {
                    assert!(bo.gro_datagrams >= 3, "{bo:?}");
                } else {
                    assert_eq!(bo.gro_datagrams, 0, "{bo:?}");
                }
                eprintln!("{local} gro={gro}: sender {o:?}, receiver {bo:?}");
            }
        }
    }

    /// The kernel refuses GSO on a socket without UDP checksums (`SO_NO_CHECK`: `EINVAL`):
    /// the device falls back to single datagrams for the rest of the batch and for good, and
    /// nothing is lost.
    #[test]
    fn refused_gso_falls_back_to_single_datagrams() {
        let local = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let Some((mut a, mut b)) = loopback_pair(local, true, true) else {
            return;
        };
        set_int(a.sock.as_fd(), libc::SOL_SOCKET, libc::SO_NO_CHECK, 1).unwrap();
        let bport = b.local_addr().port();
        let frames: Vec<Vec<u8>> = (0..100u32)
            .map(|i| {
                let mut f = frame_with(local, local, 7, 0xc000, i, 500);
                to_port(&mut f, local, bport);
                f
            })
            .collect();
        assert_eq!(send_frames(&mut a, &frames), 100);
        let o = a.offload_stats();
        assert_eq!((o.gso_refused, o.gso_sends), (1, 0), "{o:?}");
        assert!(!a.offloads().0);
        assert_eq!(a.stats().tx_frames, 100);
        let got = receive(&mut b, 100, 64);
        assert_eq!(got.len(), 100);
        for (i, f) in got.iter().enumerate() {
            let (ip, udp, t) = pieces(f, false);
            let r = parse_roce(ip, udp, t).unwrap_or_else(|e| panic!("frame {i}: {e}"));
            assert_eq!(r.repr.bth.psn, Psn::new(i as u32));
            assert_eq!(&ip[4..6], &[0, 0], "single datagrams: ID 0");
        }
        assert_eq!(b.ident_stats().guessed, 100);
    }

    #[test]
    fn ident_predictions_verify_at_full_strength() {
        // A datagram from a source last seen at ID 41: 42 (counting) or 0 (a single frame of
        // a ferroce peer) are predictions, anything else needs the solver.
        let (s, d) = v4_pair();
        let mut solvers = LenCache::new();
        for (sent_id, sent_df, expect_guess) in [
            (42u16, true, true),
            (0, true, true),
            (1234, true, false),
            (43, false, false),
        ] {
            let f = frame(s, d, 0, 0xc000, 200);
            let o = locate(&f).unwrap();
            let mut k = f.clone();
            let mut shifts = LenCache::new();
            icrc_for_kernel(&mut k, &o, s, 4791, sent_id, &mut shifts);
            let (mut ip, udp) = kernel_hdr(s, 4791, &o, sent_id);
            ip[6] = if sent_df { 0x40 } else { 0 };
            // Re-derive the ICRC for the DF the test wants.
            let t_len = o.payload.len() - 4;
            let c = icrc::compute(&ip, &udp, &k[o.payload.start..o.payload.start + t_len]);
            let mut transport = k[o.payload.clone()].to_vec();
            transport[t_len..].copy_from_slice(&icrc::to_wire(c));
            let mut stats = IdentStats::default();
            let mut rx_ip = ip.clone();
            let found = resolve_ident(
                &mut rx_ip,
                &udp,
                &transport,
                &first_predictions(Some((41, true))),
                true,
                &mut solvers,
                &mut stats,
            );
            assert_eq!(found, Some((sent_id, sent_df)));
            assert_eq!(stats.guessed == 1, expect_guess, "{sent_id}: {stats:?}");
            assert_eq!(stats.solved == 1, !expect_guess);
            // Without the solver only the predictions verify.
            let mut stats = IdentStats::default();
            let found = resolve_ident(
                &mut rx_ip,
                &udp,
                &transport,
                &first_predictions(Some((41, true))),
                false,
                &mut solvers,
                &mut stats,
            );
            assert_eq!(found.is_some(), expect_guess);
        }
    }
}
