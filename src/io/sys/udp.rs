//! Batched UDP socket I/O: `recvmmsg(2)` with ancillary data (destination address, TOS /
//! traffic class, TTL / hop limit, the segment size of a coalesced `UDP_GRO` datagram) and
//! `sendmmsg(2)` with a per-datagram TOS / traffic class and, for segmentation offload, a
//! per-message `UDP_SEGMENT` size over data gathered from several buffers.
//!
//! The message headers hold raw pointers. They live in a [`BatchScratch`] the caller keeps
//! between calls (so that no call zeroes 6-22 KiB of headers, addresses and control buffers
//! first: a `memset` was 9-11 % of an idle UDP engine's time); each call points the headers
//! it uses at buffers borrowed for that call ([`RecvSlot`], the data to send), and no
//! pointer is read between calls.
//! The control messages are parsed by [`parse_control`], safe code over the bytes the kernel
//! wrote (bounds-checked like everything else the kernel hands over).

use super::cvt;
use super::sockutil::{Mmsg, MsgBufs};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};

/// Largest batch one call moves.
pub const MAX_BATCH: usize = 64;

// Option numbers (linux/in.h, linux/in6.h, linux/udp.h); ABI-stable.
pub const IP_TOS: libc::c_int = 1;
pub const IP_TTL: libc::c_int = 2;
pub const IP_PKTINFO: libc::c_int = 8;
pub const IP_MTU_DISCOVER: libc::c_int = 10;
pub const IP_RECVTTL: libc::c_int = 12;
pub const IP_RECVTOS: libc::c_int = 13;
pub const IP_PMTUDISC_DO: libc::c_int = 2;
pub const IPV6_UNICAST_HOPS: libc::c_int = 16;
pub const IPV6_MTU_DISCOVER: libc::c_int = 23;
pub const IPV6_RECVPKTINFO: libc::c_int = 49;
pub const IPV6_PKTINFO: libc::c_int = 50;
pub const IPV6_RECVHOPLIMIT: libc::c_int = 51;
pub const IPV6_HOPLIMIT: libc::c_int = 52;
pub const IPV6_RECVTCLASS: libc::c_int = 66;
pub const IPV6_TCLASS: libc::c_int = 67;
pub const IPV6_PMTUDISC_DO: libc::c_int = 2;
pub const SOL_UDP: libc::c_int = 17;
pub const UDP_NO_CHECK6_RX: libc::c_int = 102;
/// `UDP_SEGMENT` (Linux 4.18): as a socket option or a per-message control message (a
/// `u16`), the size the kernel cuts a message's data into (GSO; the last datagram may be
/// shorter).
pub const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (Linux 5.0): as a socket option, deliver coalesced datagrams; each comes with a
/// control message (an `int`) carrying the size of its segments.
pub const UDP_GRO: libc::c_int = 104;
/// Segments per GSO message that every kernel with `UDP_SEGMENT` accepts (`UDP_MAX_SEGMENTS`
/// in `include/linux/udp.h`: 64, raised to 128 in later kernels).
pub const UDP_MAX_SEGMENTS: usize = 64;

/// Control buffer, aligned for `struct cmsghdr`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct Ctrl([u8; 128]);

/// One receive buffer of a batch: the datagram goes to `buf[data_off..]`, so the caller can
/// write headers in front of it without moving it.
pub struct RecvSlot {
    pub buf: Box<[u8]>,
    pub data_off: usize,
    /// Bytes of datagram received by the last call (valid for the slots it filled).
    pub len: usize,
    /// The datagram was longer than the buffer (`MSG_TRUNC`); `len` is what fit.
    pub truncated: bool,
    ctrl: Ctrl,
    ctrl_len: usize,
    name: libc::sockaddr_storage,
    name_len: libc::socklen_t,
}

impl RecvSlot {
    /// A slot of `cap` bytes receiving at offset `data_off` (`< cap`).
    pub fn new(cap: usize, data_off: usize) -> Self {
        assert!(
            data_off < cap,
            "receive slot: header room {data_off} >= {cap}"
        );
        RecvSlot {
            buf: vec![0u8; cap].into_boxed_slice(),
            data_off,
            len: 0,
            truncated: false,
            ctrl: Ctrl([0; 128]),
            ctrl_len: 0,
            // SAFETY: sockaddr_storage is plain data; all-zero is valid (AF_UNSPEC).
            name: unsafe { std::mem::zeroed() },
            name_len: 0,
        }
    }

    /// The sender's address and port.
    pub fn source(&self) -> Option<SocketAddr> {
        sockaddr_to_std(&self.name, self.name_len)
    }

    /// The control messages the kernel wrote.
    pub fn control(&self) -> &[u8] {
        &self.ctrl.0[..self.ctrl_len.min(self.ctrl.0.len())]
    }
}

fn sockaddr_to_std(ss: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match libc::c_int::from(ss.ss_family) {
        libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, and sockaddr_storage
            // is large and aligned enough for any sockaddr.
            let sin =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// A C socket address for `a`, and its length.
fn std_to_sockaddr(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: plain data; all-zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            sin6.sin6_flowinfo = v6.flowinfo().to_be();
            sin6.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// The headers, socket addresses and control buffers of one `recvmmsg` / `sendmmsg` call,
/// kept by a device between calls instead of being built, zeroed, on the stack for each.
/// Every call sets what it passes to the kernel (the headers and iovecs of the messages it
/// uses, their names and control data); what an earlier call left there is never read.
pub struct BatchScratch {
    m: Mmsg<MAX_BATCH>,
    names: [libc::sockaddr_storage; MAX_BATCH],
    ctrls: [Ctrl; MAX_BATCH],
}

impl BatchScratch {
    pub fn new() -> Box<BatchScratch> {
        Box::new(BatchScratch {
            m: Mmsg::new(),
            // SAFETY: plain data, all-zero valid.
            names: unsafe { std::mem::zeroed() },
            ctrls: [Ctrl([0; 128]); MAX_BATCH],
        })
    }
}

// SAFETY: the raw pointers in the headers are only written and handed to the kernel inside
// `recv_batch` / `send_batch`, which borrow the buffers they point at for the call; between
// calls they are stale and never dereferenced, so moving the scratch to another thread (the
// engine's) is sound.
unsafe impl Send for BatchScratch {}

/// Receive up to `slots.len()` (at most [`MAX_BATCH`]) datagrams without blocking. Returns
/// how many slots were filled (0 when nothing was waiting).
pub fn recv_batch(
    fd: BorrowedFd<'_>,
    slots: &mut [RecvSlot],
    scratch: &mut BatchScratch,
) -> io::Result<usize> {
    let n = slots.len().min(MAX_BATCH);
    if n == 0 {
        return Ok(0);
    }
    let m = &mut scratch.m;
    for (i, s) in slots[..n].iter_mut().enumerate() {
        let room = &mut s.buf[s.data_off..];
        m.set(
            i,
            MsgBufs {
                data: room.as_mut_ptr().cast(),
                data_len: room.len(),
                name: (&mut s.name as *mut libc::sockaddr_storage).cast(),
                name_len: std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t,
                control: s.ctrl.0.as_mut_ptr().cast(),
                control_len: s.ctrl.0.len(),
            },
        );
    }
    // SAFETY: every message points into its own slot's buffer, name and control storage,
    // with their true lengths; the slots are borrowed mutably for the call, so nothing else
    // reads or writes them.
    let got = unsafe { m.recv(fd, n)? };
    for (i, s) in slots[..got].iter_mut().enumerate() {
        let h = m.header(i);
        let room = s.buf.len() - s.data_off;
        s.len = (h.msg_len as usize).min(room);
        s.truncated = h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        // size_t on glibc, socklen_t on musl.
        #[allow(clippy::unnecessary_cast)]
        let ctrl_len = h.msg_hdr.msg_controllen as usize;
        s.ctrl_len = ctrl_len.min(s.ctrl.0.len());
        s.name_len = h.msg_hdr.msg_namelen;
    }
    Ok(got)
}

/// One message to send: a datagram, or with `segment` a GSO super-datagram that the kernel
/// cuts into datagrams of `segment` bytes (the last may be shorter), each with its own IP and
/// UDP header.
#[derive(Clone, Copy, Debug)]
pub struct SendItem<'a> {
    /// The data, gathered from these parts in order (one iovec each).
    pub parts: &'a [&'a [u8]],
    pub dst: SocketAddr,
    /// IPv4 TOS / IPv6 traffic class byte for this datagram (DSCP and ECN).
    pub tclass: Option<u8>,
    /// `UDP_SEGMENT` for this message (`None`: one datagram).
    pub segment: Option<u16>,
}

/// Send the messages of `items` with one `sendmmsg`, as many as fit [`MAX_BATCH`] messages
/// and [`MAX_BATCH`] parts in all. Returns how many messages the kernel took (an error only
/// when it took none: the error of the first one).
pub fn send_batch(
    fd: BorrowedFd<'_>,
    items: &[SendItem<'_>],
    scratch: &mut BatchScratch,
) -> io::Result<usize> {
    let BatchScratch { m, names, ctrls } = scratch;
    let mut iov = 0;
    let mut n = 0;
    for (i, it) in items.iter().take(MAX_BATCH).enumerate() {
        if it.parts.is_empty() || iov + it.parts.len() > MAX_BATCH {
            break;
        }
        for (j, p) in it.parts.iter().enumerate() {
            m.set_iov(iov + j, p.as_ptr() as *mut libc::c_void, p.len());
        }
        let (ss, len) = std_to_sockaddr(&it.dst);
        names[i] = ss;
        let mut b = MsgBufs::data(std::ptr::null_mut(), 0);
        b.name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
        b.name_len = len;
        let mut clen = 0;
        if let Some(tc) = it.tclass {
            let (level, ty) = match it.dst {
                SocketAddr::V4(_) => (libc::IPPROTO_IP, IP_TOS),
                SocketAddr::V6(_) => (libc::IPPROTO_IPV6, IPV6_TCLASS),
            };
            clen += write_cmsg(
                &mut ctrls[i].0,
                level,
                ty,
                &libc::c_int::from(tc).to_ne_bytes(),
            );
        }
        if let Some(seg) = it.segment {
            clen += write_cmsg(
                &mut ctrls[i].0[clen..],
                SOL_UDP,
                UDP_SEGMENT,
                &seg.to_ne_bytes(),
            );
        }
        if clen > 0 {
            b.control = ctrls[i].0.as_mut_ptr().cast();
            b.control_len = clen;
        }
        m.set_gather(i, iov..iov + it.parts.len(), b);
        iov += it.parts.len();
        n = i + 1;
    }
    if n == 0 {
        return Ok(0);
    }
    // SAFETY: every message points at the caller's data (read only, borrowed for the call),
    // its own name and its own control buffer, with their true lengths; all outlive the call.
    unsafe { m.send(fd, n) }
}

const fn cmsg_align(n: usize) -> usize {
    let a = std::mem::size_of::<usize>();
    (n + a - 1) & !(a - 1)
}
const CMSG_HDR: usize = cmsg_align(std::mem::size_of::<libc::cmsghdr>());

/// Write one control message carrying `data` (4 bytes or fewer) into `buf`; returns its
/// space (`CMSG_SPACE`). The length field is `CMSG_LEN(data.len())`, as the kernel checks it
/// exactly for some options (`UDP_SEGMENT` takes a `u16`, `IP_TOS` an `int`).
fn write_cmsg(buf: &mut [u8], level: libc::c_int, ty: libc::c_int, data: &[u8]) -> usize {
    let len = CMSG_HDR + data.len();
    let space = cmsg_align(len);
    let w = std::mem::size_of::<usize>();
    buf[..space].fill(0);
    buf[..w].copy_from_slice(&len.to_ne_bytes()[..w]);
    buf[w..w + 4].copy_from_slice(&level.to_ne_bytes());
    buf[w + 4..w + 8].copy_from_slice(&ty.to_ne_bytes());
    buf[CMSG_HDR..len].copy_from_slice(data);
    space
}

/// What the receive control messages said about one datagram.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvInfo {
    /// The destination address in the IP header (`IP_PKTINFO.ipi_addr` /
    /// `IPV6_PKTINFO.ipi6_addr`).
    pub dst: Option<IpAddr>,
    /// IPv4 TOS byte / IPv6 traffic class (DSCP and ECN).
    pub tclass: Option<u8>,
    /// IPv4 TTL / IPv6 hop limit.
    pub ttl: Option<u8>,
    /// `UDP_GRO`: the datagram is several coalesced ones of this size (the last may be
    /// shorter).
    pub gro_segment: Option<u16>,
}

/// Parse the control messages of a received datagram. Unknown or malformed ones are ignored;
/// nothing is read outside `ctrl`.
pub fn parse_control(ctrl: &[u8]) -> RecvInfo {
    let w = std::mem::size_of::<usize>();
    let mut info = RecvInfo::default();
    let mut off = 0usize;
    let int_at = |d: &[u8]| -> Option<i32> {
        d.get(..4)
            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    while let Some(h) = off.checked_add(CMSG_HDR).and_then(|e| ctrl.get(off..e)) {
        let mut lb = [0u8; 8];
        lb[..w].copy_from_slice(&h[..w]);
        let len = if w == 8 {
            u64::from_ne_bytes(lb) as usize
        } else {
            u32::from_ne_bytes([lb[0], lb[1], lb[2], lb[3]]) as usize
        };
        let level = i32::from_ne_bytes([h[w], h[w + 1], h[w + 2], h[w + 3]]);
        let ty = i32::from_ne_bytes([h[w + 4], h[w + 5], h[w + 6], h[w + 7]]);
        if len < CMSG_HDR {
            break;
        }
        let Some(data) = off
            .checked_add(len)
            .and_then(|e| ctrl.get(off + CMSG_HDR..e))
        else {
            break;
        };
        match (level, ty) {
            (libc::IPPROTO_IP, IP_PKTINFO) if data.len() >= 12 => {
                info.dst = Some(IpAddr::V4(Ipv4Addr::new(
                    data[8], data[9], data[10], data[11],
                )));
            }
            (libc::IPPROTO_IP, IP_TOS) if !data.is_empty() => info.tclass = Some(data[0]),
            (libc::IPPROTO_IP, IP_TTL) => {
                info.ttl = int_at(data).and_then(|v| u8::try_from(v).ok());
            }
            (libc::IPPROTO_IPV6, IPV6_PKTINFO) if data.len() >= 16 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(&data[..16]);
                info.dst = Some(IpAddr::V6(Ipv6Addr::from(a)));
            }
            (libc::IPPROTO_IPV6, IPV6_TCLASS) => {
                info.tclass = int_at(data).and_then(|v| u8::try_from(v).ok());
            }
            (libc::IPPROTO_IPV6, IPV6_HOPLIMIT) => {
                info.ttl = int_at(data).and_then(|v| u8::try_from(v).ok());
            }
            (SOL_UDP, UDP_GRO) => {
                info.gro_segment = int_at(data)
                    .and_then(|v| u16::try_from(v).ok())
                    .filter(|&v| v > 0);
            }
            _ => {}
        }
        off = match off.checked_add(cmsg_align(len)) {
            Some(o) => o,
            None => break,
        };
    }
    info
}

/// A non-blocking UDP socket bound to `addr` with `SO_REUSEADDR` set before the bind, so that
/// several sockets (of this and other processes) can bind the same multicast group and port,
/// each receiving a copy of every datagram sent to it.
pub fn bind_shared(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    bind_with(addr, &[(libc::SOL_SOCKET, libc::SO_REUSEADDR)])
}

/// A non-blocking UDP socket bound to `addr`, with `IP_FREEBIND` when `free`: an address the
/// interface has but still tests for duplicates (an IPv6 address is "tentative" for a second
/// or two after it is added, and a plain bind is refused with `EADDRNOTAVAIL`) is bound all
/// the same (measured on a veth: bound and sent from while tentative, the peer received every
/// datagram; the kernel delivers to the address once the test is done); and `SO_REUSEPORT` when `reuse_port`: sockets of one effective user that all
/// set it may bind one address and port together, and the kernel hands each datagram to one
/// of them (by a hash of its addresses and ports).
pub fn bind_opts(
    addr: SocketAddr,
    free: bool,
    reuse_port: bool,
) -> io::Result<std::net::UdpSocket> {
    let mut opts = Vec::with_capacity(2);
    if free {
        opts.push((libc::IPPROTO_IP, libc::IP_FREEBIND));
    }
    if reuse_port {
        opts.push((libc::SOL_SOCKET, libc::SO_REUSEPORT));
    }
    bind_with(addr, &opts)
}

/// A non-blocking UDP socket bound to `addr` with each boolean option `(level, name)` of
/// `opts` set before the bind.
fn bind_with(
    addr: SocketAddr,
    opts: &[(libc::c_int, libc::c_int)],
) -> io::Result<std::net::UdpSocket> {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    let family = if addr.is_ipv6() {
        libc::AF_INET6
    } else {
        libc::AF_INET
    };
    // SAFETY: socket(2) with constant arguments; the descriptor it returns is owned below.
    let fd = super::cvt(unsafe {
        libc::socket(
            family,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?;
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    for &(level, name) in opts {
        super::sockutil::set_int(fd.as_fd(), level, name, 1)?;
    }
    let (ss, len) = std_to_sockaddr(&addr);
    // SAFETY: bind(2) reads `len` bytes of the local `ss`, which std_to_sockaddr filled.
    super::cvt(unsafe {
        libc::bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            (&ss as *const libc::sockaddr_storage).cast(),
            len,
        )
    })?;
    Ok(std::net::UdpSocket::from(fd))
}

/// A UDP socket that makes interface `ifindex` a member of IP multicast `group` for as long
/// as it is open (`IP_ADD_MEMBERSHIP` with `struct ip_mreqn`, `IPV6_ADD_MEMBERSHIP`): the
/// kernel puts the group's MAC into the interface's receive filter and reports the membership
/// (IGMP / MLD). The socket is bound to the wildcard address and an ephemeral port, so no
/// datagram sent to the group (whose port is 4791) is ever queued on it.
pub fn group_member(group: IpAddr, ifindex: u32) -> io::Result<std::net::UdpSocket> {
    use std::os::fd::AsFd;
    match group {
        IpAddr::V4(g) => {
            let sock = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
            let m = libc::ip_mreqn {
                imr_multiaddr: libc::in_addr {
                    s_addr: u32::from(g).to_be(),
                },
                imr_address: libc::in_addr { s_addr: 0 },
                imr_ifindex: libc::c_int::try_from(ifindex)
                    .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
            };
            super::sockutil::setsockopt(
                sock.as_fd(),
                libc::IPPROTO_IP,
                libc::IP_ADD_MEMBERSHIP,
                &m,
            )?;
            Ok(sock)
        }
        IpAddr::V6(g) => {
            let sock = std::net::UdpSocket::bind((std::net::Ipv6Addr::UNSPECIFIED, 0))?;
            sock.join_multicast_v6(&g, ifindex)?;
            Ok(sock)
        }
    }
}

/// The socket's drop count (`SO_MEMINFO`'s `SK_MEMINFO_DROPS`): datagrams the kernel dropped
/// at this socket — its filter refused them, or its receive buffer was full — since it was
/// opened. A 32-bit counter in the kernel (it wraps).
pub fn socket_drops(fd: BorrowedFd<'_>) -> io::Result<u32> {
    const VARS: usize = libc::SK_MEMINFO_DROPS as usize + 1;
    let mut v = [0u32; VARS];
    let mut len = std::mem::size_of_val(&v) as libc::socklen_t;
    // SAFETY: `v` is writable for `len` bytes and outlives the call; the kernel writes at most
    // `len` bytes (it copies min(len, its array's size)) and stores the length it wrote.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            v.as_mut_ptr().cast(),
            &mut len,
        )
    };
    cvt(r)?;
    if (len as usize) < VARS * 4 {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "SO_MEMINFO without a drop count",
        ));
    }
    Ok(v[libc::SK_MEMINFO_DROPS as usize])
}

/// `IP_MULTICAST_IF`: send IPv4 multicast from the interface that has `local`.
pub fn set_multicast_if_v4(fd: BorrowedFd<'_>, local: Ipv4Addr) -> io::Result<()> {
    let a = libc::in_addr {
        s_addr: u32::from(local).to_be(),
    };
    super::sockutil::setsockopt(fd, libc::IPPROTO_IP, libc::IP_MULTICAST_IF, &a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmsg(level: i32, ty: i32, data: &[u8]) -> Vec<u8> {
        let w = std::mem::size_of::<usize>();
        let len = CMSG_HDR + data.len();
        let mut v = vec![0u8; cmsg_align(len)];
        v[..w].copy_from_slice(&len.to_ne_bytes());
        v[w..w + 4].copy_from_slice(&level.to_ne_bytes());
        v[w + 4..w + 8].copy_from_slice(&ty.to_ne_bytes());
        v[CMSG_HDR..CMSG_HDR + data.len()].copy_from_slice(data);
        v
    }

    #[test]
    fn parses_ipv4_and_ipv6_control_messages() {
        let mut c = cmsg(libc::IPPROTO_IP, IP_TOS, &[0x8b]);
        c.extend(cmsg(libc::IPPROTO_IP, IP_TTL, &63i32.to_ne_bytes()));
        let mut pk = vec![0u8; 12];
        pk[8..12].copy_from_slice(&[10, 61, 2, 2]);
        c.extend(cmsg(libc::IPPROTO_IP, IP_PKTINFO, &pk));
        assert_eq!(
            parse_control(&c),
            RecvInfo {
                dst: Some("10.61.2.2".parse().unwrap()),
                tclass: Some(0x8b),
                ttl: Some(63),
                gro_segment: None,
            }
        );
        let mut p6 = vec![0u8; 20];
        p6[..16].copy_from_slice(&"fd61:2::2".parse::<Ipv6Addr>().unwrap().octets());
        let mut c = cmsg(libc::IPPROTO_IPV6, IPV6_PKTINFO, &p6);
        c.extend(cmsg(libc::IPPROTO_IPV6, IPV6_TCLASS, &3i32.to_ne_bytes()));
        c.extend(cmsg(
            libc::IPPROTO_IPV6,
            IPV6_HOPLIMIT,
            &62i32.to_ne_bytes(),
        ));
        assert_eq!(
            parse_control(&c),
            RecvInfo {
                dst: Some("fd61:2::2".parse().unwrap()),
                tclass: Some(3),
                ttl: Some(62),
                gro_segment: None,
            }
        );
    }

    #[test]
    fn malformed_control_is_ignored_without_panicking() {
        let good = cmsg(libc::IPPROTO_IP, IP_TOS, &[1]);
        for n in 0..good.len() {
            let _ = parse_control(&good[..n]);
        }
        let mut bad = good.clone();
        bad[..8].copy_from_slice(&usize::MAX.to_ne_bytes()[..8]);
        assert_eq!(parse_control(&bad), RecvInfo::default());
        let mut zero = good.clone();
        zero[..8].fill(0);
        assert_eq!(parse_control(&zero), RecvInfo::default());
        let mut buf = [0u8; 64];
        let n = write_cmsg(
            &mut buf,
            libc::IPPROTO_IPV6,
            IPV6_TCLASS,
            &0xb8i32.to_ne_bytes(),
        );
        assert_eq!(parse_control(&buf[..n]).tclass, Some(0xb8));
        // The GRO segment size: an int; zero and out-of-range sizes mean "not coalesced".
        for (v, want) in [
            (1448i32, Some(1448u16)),
            (0, None),
            (-1, None),
            (70000, None),
        ] {
            let c = cmsg(SOL_UDP, UDP_GRO, &v.to_ne_bytes());
            assert_eq!(parse_control(&c).gro_segment, want, "{v}");
        }
    }

    #[test]
    fn cmsg_lengths_are_exact() {
        // CMSG_LEN(2) = header + 2 for UDP_SEGMENT (the kernel insists), space rounded up.
        let mut buf = [0xffu8; 64];
        let n = write_cmsg(&mut buf, SOL_UDP, UDP_SEGMENT, &1000u16.to_ne_bytes());
        assert_eq!(n, cmsg_align(CMSG_HDR + 2));
        let w = std::mem::size_of::<usize>();
        let mut lb = [0u8; 8];
        lb[..w].copy_from_slice(&buf[..w]);
        assert_eq!(u64::from_ne_bytes(lb) as usize, CMSG_HDR + 2);
        assert_eq!(&buf[CMSG_HDR..CMSG_HDR + 2], &1000u16.to_ne_bytes());
        assert!(buf[CMSG_HDR + 2..n].iter().all(|&b| b == 0));
    }

    #[test]
    fn sockaddr_round_trip() {
        for a in ["10.61.1.2:4791", "[fd61:1::2]:4791"] {
            let a: SocketAddr = a.parse().unwrap();
            let (ss, len) = std_to_sockaddr(&a);
            assert_eq!(sockaddr_to_std(&ss, len), Some(a));
        }
    }
}
