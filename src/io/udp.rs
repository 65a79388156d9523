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
//! identification is **0** (`IP_MTU_DISCOVER = IP_PMTUDISC_DO` sets DF, and Linux gives DF
//! datagrams of an unconnected socket ID 0 — `ip_select_ident_segs`; checked by a capture in
//! `tests/packet_backends.rs`), there are no IPv4 options. So before sending, the device
//! **recomputes the ICRC** over the headers the kernel will write and patches it into the
//! payload (skipped when the frame already has exactly those headers). TTL / hop limit is
//! the socket's (64) and the IPv4 checksum, UDP checksum, flow label are masked anyway.
//! IPv6 datagrams get a real UDP checksum from the kernel.
//!
//! **Receive.** `recvmmsg` with `IP_PKTINFO`/`IPV6_RECVPKTINFO` (the header's destination
//! address), `IP_RECVTOS`/`IPV6_RECVTCLASS` (ECN, for congestion control) and
//! `IP_RECVTTL`/`IPV6_RECVHOPLIMIT`. The datagram lands in a buffer right after room for the
//! headers, which the device then synthesises in place: Ethernet (zero MACs), IPv4 or IPv6,
//! UDP (source address and port from the socket, checksum 0) — no copy of the payload.
//! IPv6 zero-checksum datagrams (what Linux rxe sends) are accepted: the socket sets
//! `UDP_NO_CHECK6_RX` (RFC 8200 says to drop them otherwise, and Linux does).
//!
//! **The IPv4 identification.** The ICRC covers the sender's IPv4 ID and flags, which a UDP
//! socket never reports. The device recovers them (see [`icrc::solve_ipv4_ident`] for the
//! algebra): it writes a guess (ID 0 with DF — what a ferroce peer on this backend sends —
//! or, for a source seen before, its last ID + 1, since Linux rxe's IDs count up per
//! destination), computes the ICRC once, and if it does not match, solves the 32 GF(2)
//! equations for the 16 ID bits from the difference, first with the guessed DF and then with
//! DF flipped (the flip's effect on the ICRC is a constant, no second CRC pass). A solution
//! is written into the synthesised header and the frame verifies. **Such a frame has only 16
//! (15, counting the DF retry) bits of residual ICRC strength**: a corrupted datagram passes
//! with probability about 2^-15 — still in addition to the UDP checksum, which the kernel
//! has verified for IPv4 datagrams that carry one. A frame with no solution is corrupt: it
//! goes up with ID 0 so that the engine counts an ICRC drop. [`UdpConfig::solve_ident`]
//! turns the solver off (then only ID-0/DF and last+1 guesses verify, at full strength).
//! IPv6 has no ID and its flow label is masked: nothing to solve. Senders that use IPv4
//! options cannot be verified (the socket does not report them).

use super::sys::event::poll_readable;
use super::sys::sockutil::set_int;
use super::sys::udp::{self as sysudp, RecvSlot, SendItem};
use super::{IoStats, Medium, PacketDevice};
use crate::wire::eth::{self, EthernetRepr};
use crate::wire::ip::{internet_checksum, Ipv4Repr, Ipv6Repr, PROTO_UDP};
use crate::wire::udp::UdpRepr;
use crate::wire::{icrc, ROCE_V2_PORT};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::time::Duration;

const ETH: usize = eth::HEADER_LEN;
const IP4: usize = 20;
const IP6: usize = 40;
const UDP: usize = 8;

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
}

impl UdpConfig {
    pub fn new(local: IpAddr) -> Self {
        UdpConfig {
            local,
            port: ROCE_V2_PORT,
            mtu: 1500,
            batch: 64,
            solve_ident: true,
        }
    }
}

/// How received IPv4 identifications were found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct IdentStats {
    /// The guess (ID 0 / DF, or last + 1) verified: full 32-bit ICRC strength.
    pub guessed: u64,
    /// Recovered by the solver (16-bit residual strength).
    pub solved: u64,
    /// … of which with DF the other way round than guessed.
    pub solved_df_flipped: u64,
    /// No ID verifies: handed up with ID 0 (the engine drops it on the ICRC).
    pub unsolved: u64,
}

/// A packet device on a kernel UDP socket (see the module documentation).
pub struct UdpDevice {
    sock: std::net::UdpSocket,
    local: IpAddr,
    port: u16,
    v6: bool,
    rx: Vec<RecvSlot>,
    tx: Vec<Box<[u8]>>,
    capacity: usize,
    solve_ident: bool,
    stats: IoStats,
    ident: IdentStats,
    /// Last (ID, DF) seen per IPv4 source, for the next guess.
    last_ident: HashMap<Ipv4Addr, (u16, bool)>,
}

impl Drop for UdpDevice {
    fn drop(&mut self) {
        tracing::info!(local = %self.local, port = self.port, stats = ?self.stats, "UDP device closed");
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
        let sock = std::net::UdpSocket::bind(SocketAddr::new(cfg.local, cfg.port))?;
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
        let hdr = ETH + if v6 { IP6 } else { IP4 } + UDP;
        let capacity = cfg.mtu + ETH + 4;
        let rx = (0..cfg.batch)
            .map(|_| RecvSlot::new(hdr + cfg.mtu, hdr))
            .collect();
        let tx = (0..cfg.batch)
            .map(|_| vec![0u8; capacity].into_boxed_slice())
            .collect();
        tracing::info!(local = %cfg.local, port, batch = cfg.batch, mtu = cfg.mtu, "UDP device open");
        Ok(UdpDevice {
            sock,
            local: cfg.local,
            port,
            v6,
            rx,
            tx,
            capacity,
            solve_ident: cfg.solve_ident,
            stats: IoStats::default(),
            ident: IdentStats::default(),
            last_ident: HashMap::new(),
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
}

/// Where the parts of an outgoing frame are.
struct Out {
    dst: IpAddr,
    dport: u16,
    tclass: u8,
    payload: core::ops::Range<usize>,
    /// The frame's headers are already exactly what the kernel will write.
    kernel_identical: bool,
}

/// Locate destination, traffic class and UDP payload of a frame (`None`: not IP/UDP).
fn locate(frame: &[u8], local: IpAddr, port: u16) -> Option<Out> {
    let (e, off) = EthernetRepr::parse(frame).ok()?;
    let ip = frame.get(off..)?;
    let (dst, tclass, hlen, plen, same_ip) = match e.ethertype {
        eth::ETHERTYPE_IPV4 => {
            let (r, p) = Ipv4Repr::parse(ip).ok()?;
            let same =
                IpAddr::V4(r.src) == local && r.ident == 0 && r.dont_frag && p.header_len == IP4;
            (
                IpAddr::V4(r.dst),
                (r.dscp << 2) | r.ecn.bits(),
                p.header_len,
                p.payload_len,
                same,
            )
        }
        eth::ETHERTYPE_IPV6 => {
            let (r, p) = Ipv6Repr::parse(ip).ok()?;
            (
                IpAddr::V6(r.dst),
                (r.dscp << 2) | r.ecn.bits(),
                p.header_len,
                p.payload_len,
                IpAddr::V6(r.src) == local,
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
        payload: udp_off + UDP..udp_off + ulen,
        kernel_identical: same_ip && u.src_port == port,
    })
}

/// Write the IP and UDP headers the kernel will put in front of `payload_len` bytes sent from
/// `local:port` to `dst:dport` with `tclass` into `out`; returns (IP header len).
fn kernel_headers(
    out: &mut [u8; IP6 + UDP],
    local: IpAddr,
    port: u16,
    dst: IpAddr,
    dport: u16,
    tclass: u8,
    payload_len: usize,
) -> usize {
    let udp_len = (UDP + payload_len) as u16;
    let ihl = match (local, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let h = &mut out[..IP4];
            h[0] = 0x45;
            h[1] = tclass;
            h[2..4].copy_from_slice(&((IP4 as u16) + udp_len).to_be_bytes());
            h[4..6].copy_from_slice(&[0, 0]); // ID 0: DF datagram, unconnected socket
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
        _ => 0,
    };
    let u = &mut out[ihl..ihl + UDP];
    u[0..2].copy_from_slice(&port.to_be_bytes());
    u[2..4].copy_from_slice(&dport.to_be_bytes());
    u[4..6].copy_from_slice(&udp_len.to_be_bytes());
    u[6..8].copy_from_slice(&[0, 0]);
    ihl
}

/// Recompute the ICRC at the end of `payload` (BTH … ICRC) for the headers the kernel writes.
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
    let ihl = kernel_headers(&mut h, local, port, dst, dport, tclass, payload.len());
    let n = payload.len() - icrc::LEN;
    let c = icrc::compute(&h[..ihl], &h[ihl..ihl + UDP], &payload[..n]);
    payload[n..].copy_from_slice(&icrc::to_wire(c));
    true
}

impl UdpDevice {
    /// Build Ethernet + IP + UDP in front of the datagram in `slot` (in place) and resolve
    /// the IPv4 identification. Returns the frame's start offset in the slot's buffer.
    fn synthesise(&mut self, k: usize) -> Option<usize> {
        let slot = &self.rx[k];
        let src = slot.source()?;
        let info = sysudp::parse_control(slot.control());
        let len = slot.len;
        let dport = self.port;
        let dst = info.dst.unwrap_or(self.local);
        let tclass = info.tclass.unwrap_or(0);
        let ttl = info.ttl.unwrap_or(64);
        let udp_len = u16::try_from(UDP + len).ok()?;
        let data_off = slot.data_off;
        let (ip_len, ethertype) = if self.v6 {
            (IP6, eth::ETHERTYPE_IPV6)
        } else {
            (IP4, eth::ETHERTYPE_IPV4)
        };
        let start = data_off - UDP - ip_len - ETH;
        let solve = self.solve_ident;
        let guess = match src.ip() {
            IpAddr::V4(a) => self
                .last_ident
                .get(&a)
                .map(|&(id, df)| (if id == 0 { 0 } else { id.wrapping_add(1) }, df))
                .unwrap_or((0, true)),
            IpAddr::V6(_) => (0, true),
        };
        let slot = &mut self.rx[k];
        let buf = &mut slot.buf[start..data_off + len];
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
                ip[2..4].copy_from_slice(&(IP4 as u16 + udp_len).to_be_bytes());
                ip[8] = ttl;
                ip[9] = PROTO_UDP;
                ip[12..16].copy_from_slice(&s.octets());
                ip[16..20].copy_from_slice(&d.octets());
                let write_id = |ip: &mut [u8], id: u16, df: bool| {
                    ip[4..6].copy_from_slice(&id.to_be_bytes());
                    ip[6..8].copy_from_slice(&[if df { 0x40 } else { 0 }, 0]);
                };
                let (gid, gdf) = guess;
                write_id(ip, gid, gdf);
                let mut found = None;
                if let Some(stored) = icrc::stored(transport) {
                    if transport.len() >= icrc::LEN + 12 {
                        let t = &transport[..transport.len() - icrc::LEN];
                        let c = icrc::compute(ip, udp, t);
                        if c == stored {
                            found = Some((gid, gdf));
                            self.ident.guessed += 1;
                        } else if solve {
                            let after = icrc::ipv4_ident_bytes_after(IP4, t.len());
                            let d = c ^ stored;
                            if let Some(x) = icrc::ident_from_delta(d, after) {
                                found = Some((gid ^ x, gdf));
                                self.ident.solved += 1;
                            } else if let Some(x) =
                                icrc::ident_from_delta(d ^ icrc::ipv4_df_delta(IP4, t.len()), after)
                            {
                                found = Some((gid ^ x, !gdf));
                                self.ident.solved += 1;
                                self.ident.solved_df_flipped += 1;
                            }
                        }
                    }
                }
                match found {
                    Some((id, df)) => {
                        write_id(ip, id, df);
                        if self.last_ident.len() >= 4096 {
                            self.last_ident.clear();
                        }
                        self.last_ident.insert(s, (id, df));
                    }
                    None => {
                        self.ident.unsolved += 1;
                        write_id(ip, 0, true);
                    }
                }
                ip[10..12].copy_from_slice(&[0, 0]);
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
        Some(start)
    }
}

impl PacketDevice for UdpDevice {
    fn recv_batch(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let mut n = 0;
        while n < max {
            let want = (max - n).min(self.rx.len());
            let got = sysudp::recv_batch(self.sock.as_fd(), &mut self.rx[..want])?;
            for k in 0..got {
                if self.rx[k].truncated {
                    self.stats.rx_dropped += 1;
                    continue;
                }
                let Some(start) = self.synthesise(k) else {
                    self.stats.rx_dropped += 1;
                    continue;
                };
                let slot = &self.rx[k];
                let frame = &slot.buf[start..slot.data_off + slot.len];
                self.stats.rx_frames += 1;
                self.stats.rx_bytes += frame.len() as u64;
                f(frame);
                n += 1;
            }
            if got < want {
                break;
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
            let mut outs: [Option<Out>; sysudp::MAX_BATCH] = [const { None }; sysudp::MAX_BATCH];
            let mut k = 0;
            while k < want {
                let buf = &mut self.tx[k];
                let Some(len) = fill(&mut buf[..cap]) else {
                    break;
                };
                let frame = &mut buf[..len.min(cap)];
                outs[k] = locate(frame, self.local, self.port).filter(|o| {
                    o.dst.is_ipv6() == self.v6
                        && (o.kernel_identical
                            || rewrite_icrc_for_kernel(
                                &mut frame[o.payload.clone()],
                                self.local,
                                self.port,
                                o.dst,
                                o.dport,
                                o.tclass,
                            ))
                });
                k += 1;
            }
            if k == 0 {
                break;
            }
            total += k;
            let none = SendItem {
                data: &[],
                dst: SocketAddr::new(self.local, 0),
                tclass: None,
            };
            let mut items = [none; sysudp::MAX_BATCH];
            let mut m = 0;
            for (buf, o) in self.tx[..k].iter().zip(&outs[..k]) {
                match o {
                    Some(o) => {
                        items[m] = SendItem {
                            data: &buf[o.payload.clone()],
                            dst: SocketAddr::new(o.dst, o.dport),
                            tclass: Some(o.tclass),
                        };
                        m += 1;
                    }
                    None => self.stats.tx_dropped += 1,
                }
            }
            let items = &items[..m];
            let mut sent = 0;
            while sent < items.len() {
                match sysudp::send_batch(self.sock.as_fd(), &items[sent..]) {
                    Ok(j) => {
                        for it in &items[sent..sent + j] {
                            self.stats.tx_frames += 1;
                            self.stats.tx_bytes += it.data.len() as u64;
                        }
                        sent += j.max(1);
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        // Send buffer full, no route, message too long for the path MTU…:
                        // drop this datagram and go on (never block).
                        self.stats.tx_dropped += 1;
                        sent += 1;
                    }
                }
            }
            if k < want {
                break;
            }
        }
        Ok(total)
    }

    fn wait_readable(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        poll_readable(&[self.sock.as_fd()], timeout).map(drop)
    }

    fn frame_capacity(&self) -> usize {
        self.capacity
    }

    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::{AsFd, AsRawFd};
        Some(self.sock.as_fd().as_raw_fd())
    }

    fn medium(&self) -> Medium {
        Medium::UdpSocket
    }

    fn stats(&self) -> IoStats {
        self.stats
    }

    fn describe(&self) -> String {
        format!(
            "udp({}, batch {}{})",
            self.local_addr(),
            self.rx.len(),
            if self.solve_ident {
                ", ident solver"
            } else {
                ""
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::*;
    use std::net::Ipv6Addr;

    fn frame(src: IpAddr, dst: IpAddr, ident: u16, sport: u16, payload: usize) -> Vec<u8> {
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
                BthRepr::new(Opcode::RC_SEND_ONLY, QpNumber::new(0x123), Psn::new(5)),
                ExtRepr::default(),
                payload,
            ),
        };
        let mut b = vec![0u8; f.buffer_len()];
        let data: Vec<u8> = (0..payload).map(|i| i as u8).collect();
        f.emit(&mut b, &data).unwrap();
        b
    }

    /// What the receiving engine sees: the frame with the kernel's headers.
    fn as_kernel_sends(local: IpAddr, port: u16, f: &[u8]) -> Vec<u8> {
        let mut f = f.to_vec();
        let o = locate(&f, local, port).unwrap();
        assert!(rewrite_icrc_for_kernel(
            &mut f[o.payload.clone()],
            local,
            port,
            o.dst,
            o.dport,
            o.tclass
        ));
        let mut h = [0u8; IP6 + UDP];
        let ihl = kernel_headers(
            &mut h,
            local,
            port,
            o.dst,
            o.dport,
            o.tclass,
            o.payload.len(),
        );
        let mut out = f[..ETH].to_vec();
        out.extend_from_slice(&h[..ihl + UDP]);
        out.extend_from_slice(&f[o.payload]);
        out
    }

    #[test]
    fn recomputed_icrc_matches_kernel_headers() {
        let cases: [(IpAddr, IpAddr); 2] = [
            (
                Ipv4Addr::new(10, 61, 1, 2).into(),
                Ipv4Addr::new(10, 61, 2, 2).into(),
            ),
            (
                "fd61:1::2".parse::<Ipv6Addr>().unwrap().into(),
                "fd61:2::2".parse::<Ipv6Addr>().unwrap().into(),
            ),
        ];
        for (s, d) in cases {
            let f = frame(s, d, 0x4242, 0xc123, 100);
            // As emitted, the engine's headers differ from the kernel's...
            let mut k = f.clone();
            let o = locate(&k, s, 4791).unwrap();
            assert!(!o.kernel_identical);
            assert_eq!(o.dst, d);
            assert_eq!(o.tclass, (26 << 2) | 2);
            let mut h = [0u8; IP6 + UDP];
            let ihl = kernel_headers(&mut h, s, 4791, o.dst, o.dport, o.tclass, o.payload.len());
            assert!(parse_roce(&h[..ihl], &h[ihl..ihl + UDP], &k[o.payload.clone()]).is_err());
            // ...and after the rewrite the payload verifies under the kernel's headers.
            rewrite_icrc_for_kernel(&mut k[o.payload.clone()], s, 4791, o.dst, o.dport, o.tclass);
            assert!(parse_roce(&h[..ihl], &h[ihl..ihl + UDP], &k[o.payload.clone()]).is_ok());
            let whole = as_kernel_sends(s, 4791, &f);
            let p = parse_frame(&whole).unwrap();
            assert_eq!(p.repr.udp.src_port, 4791);
        }
    }

    #[test]
    fn locate_rejects_non_roce() {
        let s: IpAddr = Ipv4Addr::new(1, 2, 3, 4).into();
        let f = frame(s, Ipv4Addr::new(5, 6, 7, 8).into(), 0, 4791, 0);
        assert!(locate(&f, s, 4791).is_some());
        for n in 0..f.len() - 4 {
            let _ = locate(&f[..n], s, 4791);
        }
        let mut arp = f.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(locate(&arp, s, 4791).is_none());
    }

    /// A real kernel round trip without root: two devices on loopback (ephemeral ports, so
    /// the frames' destination port is not 4791 and `parse_roce` checks the ICRC instead of
    /// `parse_frame`).
    #[test]
    fn loopback_round_trip_verifies() {
        for local in [
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ] {
            let mk = || {
                let mut c = UdpConfig::new(local);
                c.port = 0;
                UdpDevice::open(&c)
            };
            let (Ok(mut a), Ok(mut b)) = (mk(), mk()) else {
                eprintln!("no {local} loopback here; skipping");
                continue;
            };
            let bport = b.local_addr().port();
            let mut frames = Vec::new();
            for i in 0..20u16 {
                let mut f = frame(local, local, 0x9000 + i, 0xc000, usize::from(i) * 13);
                // Point the frame at B's port (UDP header right after the IP header).
                let u = ETH + if local.is_ipv6() { IP6 } else { IP4 };
                f[u + 2..u + 4].copy_from_slice(&bport.to_be_bytes());
                frames.push(f);
            }
            let mut k = 0;
            let sent = a
                .send_batch(100, &mut |buf| {
                    let f = frames.get(k)?;
                    buf[..f.len()].copy_from_slice(f);
                    k += 1;
                    Some(f.len())
                })
                .unwrap();
            assert_eq!(sent, 20);
            assert_eq!(a.stats().tx_frames, 20);
            let mut got = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while got.len() < 20 && std::time::Instant::now() < deadline {
                b.wait_readable(Some(Duration::from_millis(50))).unwrap();
                b.recv_batch(64, &mut |f| got.push(f.to_vec())).unwrap();
            }
            assert_eq!(got.len(), 20, "{local}");
            for (i, f) in got.iter().enumerate() {
                let p = crate::wire::packet::decode_frame(f);
                // decode_frame refuses the non-RoCE port; check the pieces by hand.
                assert!(matches!(p, Err(Error::NotRoceV2Port(_))));
                let ip_len = if local.is_ipv6() { IP6 } else { IP4 };
                let ip = &f[ETH..ETH + ip_len];
                let udp = &f[ETH + ip_len..ETH + ip_len + UDP];
                let r = parse_roce(ip, udp, &f[ETH + ip_len + UDP..]).unwrap();
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
