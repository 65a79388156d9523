//! Datagram rsockets (`SOCK_DGRAM`): UDP-like sockets whose messages ride on UD QPs, speaking
//! rdma-core's datagram rsocket protocol (facts from `librdmacm/rsocket.c`; our own code).
//!
//! # The protocol
//! - The socket's number is a real UDP socket (kernel UDP, the same address and port). It is
//!   the side channel through which two sockets learn each other's UD QP.
//! - Every local address the socket sends from gets one UD QP (an `RDMA_PS_UDP` id bound to
//!   that address and the socket's port; Q_Key `RDMA_UDP_QKEY`).
//! - A message to a destination whose QP is not yet known goes over the UDP socket with a
//!   `ds_udp_header` in front (16 bytes for IPv4, 28 for IPv6): tag `0x55555555` (big-endian),
//!   version 4 or 6, op (0 data, 7 control), the header's length, a reserved byte, the sender's
//!   QPN (big-endian, low 24 bits) and the sender's QP address. The receiver answers a data
//!   message with a control message of its own (its QPN), takes the sender's QPN into an
//!   address handle for the sender's UDP address and delivers the data; from then on each side
//!   sends to the other over UD.
//! - A UD message carries a `ds_header` in front of the data (8 bytes for IPv4, 24 for IPv6):
//!   version, the header's length, the sender's port (big-endian) and address (IPv6: flow
//!   label, then the address). A receiver reports that address and port as the message's
//!   source.
//!
//! # Where this differs from rdma-core
//! rdma-core drives the side channel from a service thread; here it is read from the
//! socket's own calls (`rrecvfrom`, `rsendto`, `rpoll`), which a datagram program makes
//! anyway. A side-channel message is delivered directly instead of being sent to ourselves
//! over UD. A message too long for the path's UD MTU goes over the side channel (rdma-core
//! would post it and lose it), and one longer than a message buffer (2048 bytes less the
//! header) is refused with `EMSGSIZE` (rdma-core overruns its buffer). A socket that was
//! neither bound nor connected is bound on its first send or `rconnect` to the device address
//! that reaches the peer and an ephemeral port (rdma-core would advertise port 0, and a UDP
//! socket's implicit bind may take another local address than the QP's). The address handle
//! for a peer goes to the QP address its side-channel header names (rdma-core takes the
//! datagram's IP source, "to do" in its code). A UD message whose `ds_header` claims an address
//! other than the IP source its packet came from is dropped (rdma-core trusts the header).
//! rdma-core's own datagram rsockets do not run on RoCE at all (their loopback address handle
//! has no GRH: `rconnect` fails on rxe), so these talk to each other, not to rdma-core's.
//!
//! # Bounds
//! At most `rq_size` side-channel messages wait to be read (more are dropped, as a full UDP
//! receive buffer drops); UD messages wait in their receive buffers (the QP's receive queue
//! bounds them); at most [`MAX_DESTS`] peers are remembered (new ones beyond are refused
//! with `ENOBUFS` when sending and ignored when they write to us). The side channel is as
//! trusting as UDP: a datagram with a forged source can point our messages for that source
//! at another QP of the same address.

#[doc(hidden)]
pub mod fuzz;

use super::{
    arm_cq, copy_addr, drain_channel, errno_or, fail, poll_cq_into, post_recv_on, post_send_on,
    slice, slice_mut, Buf, RECV_FLAG, SNDLOWAT,
};
use crate::abi::*;
use crate::rdmacm::{
    from_sockaddr, gid_index, gid_of, rdma_bind_addr, rdma_create_id, rdma_create_qp,
    rdma_destroy_id, rdma_destroy_qp, rdma_resolve_addr, to_sockaddr,
};
use crate::verbs::{
    ibv_ack_cq_events, ibv_alloc_pd, ibv_create_ah, ibv_create_comp_channel, ibv_create_cq,
    ibv_dealloc_pd, ibv_destroy_ah, ibv_destroy_comp_channel, ibv_destroy_cq, ibv_query_port,
    wait_cq_for,
};
use libc::{c_int, c_void, pollfd, sockaddr, socklen_t};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ptr::null_mut;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

const DS_UDP_TAG: u32 = 0x5555_5555;
const UDP_HDR_V4: usize = 16;
const UDP_HDR_V6: usize = 28;
const DS_HDR_V4: usize = 8;
const DS_HDR_V6: usize = 24;
const OP_DATA: u8 = 0;
const OP_CTRL: u8 = 7;
const GRH_LEN: usize = 40;
/// One message buffer (`RS_SNDLOWAT`): header and data.
const SLOT: usize = SNDLOWAT as usize;
/// A receive buffer: the GRH, then a message buffer.
const RSLOT: usize = GRH_LEN + SLOT;
/// Peers remembered at most.
pub(crate) const MAX_DESTS: usize = 4096;
/// How long one wait drives the engine before the caller looks again. Short: a completion
/// the engine's background thread makes (it takes frames too) does not wake a thread asleep
/// in the packet device, which then sleeps out its slice, and udpong resends after 1 ms.
const SLICE: Duration = Duration::from_micros(200);
/// Side-channel datagrams taken per round of progress.
const UDP_BATCH: usize = 64;
const IBV_QPT_UD: c_int = 4;
const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_RQSIZE: c_int = 1;
const RDMA_INLINE: c_int = 2;

fn ds_hdr_len(a: &SocketAddr) -> usize {
    if a.is_ipv4() {
        DS_HDR_V4
    } else {
        DS_HDR_V6
    }
}

/// The `ds_header` naming `a` (the sender's address and port).
fn ds_header(a: &SocketAddr) -> Vec<u8> {
    let mut h = Vec::with_capacity(DS_HDR_V6);
    match a {
        SocketAddr::V4(v) => {
            h.extend_from_slice(&[4, DS_HDR_V4 as u8]);
            h.extend_from_slice(&v.port().to_be_bytes());
            h.extend_from_slice(&v.ip().octets());
        }
        SocketAddr::V6(v) => {
            h.extend_from_slice(&[6, DS_HDR_V6 as u8]);
            h.extend_from_slice(&v.port().to_be_bytes());
            h.extend_from_slice(&v.flowinfo().to_be_bytes());
            h.extend_from_slice(&v.ip().octets());
        }
    }
    h
}

/// The source a received `ds_header` names and the header's length; `None` when it is not
/// one (or `len`, the bytes received after the GRH, cannot hold it).
pub(crate) fn parse_ds_header(b: &[u8]) -> Option<(SocketAddr, usize)> {
    let (&ver, &hl) = (b.first()?, b.get(1)?);
    let port = u16::from_be_bytes([*b.get(2)?, *b.get(3)?]);
    match (ver, hl as usize) {
        (4, DS_HDR_V4) => {
            let ip: [u8; 4] = b.get(4..8)?.try_into().ok()?;
            Some((SocketAddr::new(Ipv4Addr::from(ip).into(), port), DS_HDR_V4))
        }
        (6, DS_HDR_V6) => {
            let flow = u32::from_be_bytes(b.get(4..8)?.try_into().ok()?);
            let ip: [u8; 16] = b.get(8..24)?.try_into().ok()?;
            Some((
                SocketAddr::V6(std::net::SocketAddrV6::new(
                    Ipv6Addr::from(ip),
                    port,
                    flow,
                    0,
                )),
                DS_HDR_V6,
            ))
        }
        _ => None,
    }
}

/// A side-channel header: (op, sender's QPN, header length, the address of the sender's QP),
/// checked against the family of the address it came from; `None` when it is not one.
pub(crate) fn parse_udp_header(b: &[u8], from_v4: bool) -> Option<(u8, u32, usize, IpAddr)> {
    let tag = u32::from_be_bytes(b.get(0..4)?.try_into().ok()?);
    let (ver, op, hl) = (*b.get(4)?, *b.get(5)?, *b.get(6)? as usize);
    let qpn = u32::from_be_bytes(b.get(8..12)?.try_into().ok()?) & 0xff_ffff;
    let ok = tag == DS_UDP_TAG
        && match ver {
            4 => from_v4 && hl == UDP_HDR_V4,
            6 => !from_v4 && hl == UDP_HDR_V6,
            _ => false,
        }
        && b.len() >= hl;
    if !ok {
        return None;
    }
    let ip = if ver == 4 {
        IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&b[12..16]).ok()?))
    } else {
        IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&b[12..28]).ok()?))
    };
    Some((op, qpn, hl, ip))
}

/// The side-channel header from a QP of QPN `qpn` on address `local`.
fn udp_header(op: u8, qpn: u32, local: &IpAddr) -> Vec<u8> {
    let mut h = DS_UDP_TAG.to_be_bytes().to_vec();
    let (ver, len) = if local.is_ipv4() {
        (4, UDP_HDR_V4)
    } else {
        (6, UDP_HDR_V6)
    };
    h.extend_from_slice(&[ver, op, len as u8, 0]);
    h.extend_from_slice(&(qpn & 0xff_ffff).to_be_bytes());
    match local {
        IpAddr::V4(a) => h.extend_from_slice(&a.octets()),
        IpAddr::V6(a) => h.extend_from_slice(&a.octets()),
    }
    h
}

/// The source address RDMA-CM picks for `dst` (a synchronous id, resolved and destroyed).
fn resolve_src(dst: &SocketAddr) -> Option<IpAddr> {
    let mut id = null_mut();
    // SAFETY: this library's calls; out parameter a local.
    if unsafe { rdma_create_id(null_mut(), &mut id, null_mut(), RDMA_PS_UDP) } != 0 {
        return None;
    }
    // SAFETY: as in `Dg::local`.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    to_sockaddr(&mut ss, *dst);
    // SAFETY: the id made above (synchronous: the call waits for the result); a local
    // address; the id's own source address read, then the id destroyed.
    unsafe {
        let r = if rdma_resolve_addr(id, null_mut(), &mut ss as *mut _ as *mut sockaddr, 2000) == 0
        {
            from_sockaddr(&(*id).route.addr.src_storage as *const _ as *const sockaddr)
                .map(|a| a.ip())
        } else {
            None
        };
        rdma_destroy_id(id);
        r
    }
}

/// The source address the kernel's routing picks for `dst`.
fn route_src(dst: &SocketAddr) -> Result<IpAddr, c_int> {
    let fam = if dst.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: a new socket of our own, closed below.
    let s = unsafe { libc::socket(fam, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(errno_or(libc::EMFILE));
    }
    // SAFETY: as in `Dg::local`.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let l = to_sockaddr(&mut ss, *dst);
    let mut l2 = size_of::<libc::sockaddr_storage>() as socklen_t;
    // SAFETY: our socket; local addresses.
    let r = unsafe {
        if libc::connect(s, &ss as *const _ as *const sockaddr, l) != 0
            || libc::getsockname(s, &mut ss as *mut _ as *mut sockaddr, &mut l2) != 0
        {
            Err(errno_or(libc::ENETUNREACH))
        } else {
            from_sockaddr(&ss as *const _ as *const sockaddr)
                .map(|a| a.ip())
                .ok_or(libc::EAFNOSUPPORT)
        }
    };
    // SAFETY: ours.
    unsafe { libc::close(s) };
    r
}

/// One UD QP: the socket's endpoint on one local address.
struct Qp {
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    cc: *mut ibv_comp_channel,
    cq: *mut ibv_cq,
    qp: *mut ibv_qp,
    qpn: u32,
    local: SocketAddr,
    /// Send buffers (`sq` slots) and receive buffers (`rq` slots, each GRH + message).
    sbuf: Option<Buf>,
    rbuf: Option<Buf>,
    free: Vec<u32>,
    /// Send buffers (and send-queue depth).
    sq: u32,
    /// The largest UD payload (the port's active MTU).
    mtu: usize,
    unacked: u32,
}

impl Qp {
    /// Creates the QP on `local` with `sq` send and `rq` receive buffers, receives posted and
    /// the CQ armed.
    fn create(local: SocketAddr, sq: u32, rq: u32, inline: &mut u32) -> Result<Qp, c_int> {
        let mut id = null_mut();
        // SAFETY: this library's calls; out parameter a local. A NULL channel makes the id
        // synchronous (it never waits here: a bound UD id has no events).
        if unsafe { rdma_create_id(null_mut(), &mut id, null_mut(), RDMA_PS_UDP) } != 0 {
            return Err(errno_or(libc::ENODEV));
        }
        let mut q = Qp {
            id,
            pd: null_mut(),
            cc: null_mut(),
            cq: null_mut(),
            qp: null_mut(),
            qpn: 0,
            local,
            sbuf: None,
            rbuf: None,
            free: Vec::new(),
            sq,
            mtu: 1024,
            unacked: 0,
        };
        // SAFETY: a zeroed sockaddr_storage is valid; written by to_sockaddr.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        to_sockaddr(&mut ss, local);
        // SAFETY: the id made above; the address a local.
        if unsafe { rdma_bind_addr(id, &mut ss as *mut _ as *mut sockaddr) } != 0 {
            return Err(errno_or(libc::EADDRNOTAVAIL));
        }
        // SAFETY: the bound id's context (NULL when no device serves the address).
        let ctx = unsafe { (*id).verbs };
        if ctx.is_null() {
            return Err(libc::ENODEV);
        }
        // SAFETY: this library's verbs on its own context; everything made here is released
        // by `Drop` (which checks each pointer).
        unsafe {
            q.pd = ibv_alloc_pd(ctx);
            if q.pd.is_null() {
                return Err(errno_or(libc::ENOMEM));
            }
            q.cc = ibv_create_comp_channel(ctx);
            if q.cc.is_null() {
                return Err(errno_or(libc::ENOMEM));
            }
            let fl = libc::fcntl((*q.cc).fd, libc::F_GETFL);
            libc::fcntl((*q.cc).fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
            q.cq = ibv_create_cq(ctx, (sq + rq) as c_int, null_mut(), q.cc, 0);
            if q.cq.is_null() {
                return Err(errno_or(libc::ENOMEM));
            }
            q.sbuf = Some(Buf::alloc(q.pd, sq as usize * SLOT, 0)?);
            q.rbuf = Some(Buf::alloc(q.pd, rq as usize * RSLOT, 1)?);
            let mut a = ibv_qp_init_attr {
                qp_context: null_mut(),
                send_cq: q.cq,
                recv_cq: q.cq,
                srq: null_mut(),
                cap: ibv_qp_cap {
                    max_send_wr: sq,
                    max_recv_wr: rq,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: *inline,
                },
                qp_type: IBV_QPT_UD,
                sq_sig_all: 1,
            };
            if rdma_create_qp(id, q.pd, &mut a) != 0 {
                return Err(errno_or(libc::ENOMEM));
            }
            *inline = a.cap.max_inline_data;
            q.qp = (*id).qp;
            q.qpn = (*q.qp).qp_num;
            let mut pa: ibv_port_attr = std::mem::zeroed();
            if ibv_query_port(ctx, (*id).port_num.max(1), &mut pa) == 0 && pa.active_mtu >= 1 {
                q.mtu = 128usize << pa.active_mtu.clamp(1, 5);
            }
        }
        q.free = (0..sq).rev().collect();
        for i in 0..rq {
            q.post_recv(i)?;
        }
        q.arm();
        Ok(q)
    }

    /// An address handle from this QP's address to `ip` (NULL when the device refuses it).
    fn ah_to(&self, ip: IpAddr) -> *mut ibv_ah {
        let mut a = ibv_ah_attr {
            grh: ibv_global_route {
                dgid: ibv_gid { raw: gid_of(ip) },
                flow_label: 0,
                sgid_index: gid_index(self.local.ip()),
                hop_limit: 64,
                traffic_class: 0,
            },
            dlid: 0,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            is_global: 1,
            // SAFETY: the QP's bound id.
            port_num: unsafe { (*self.id).port_num }.max(1),
        };
        // SAFETY: the QP's PD; attributes a local.
        unsafe { ibv_create_ah(self.pd, &mut a) }
    }

    fn post_recv(&self, slot: u32) -> Result<(), c_int> {
        let rb = self.rbuf.as_ref().ok_or(libc::EINVAL)?;
        let mut sge = ibv_sge {
            // SAFETY: slot < rq: inside the receive buffer.
            addr: unsafe { rb.ptr.add(slot as usize * RSLOT) } as u64,
            length: RSLOT as u32,
            lkey: rb.lkey(),
        };
        let mut wr = ibv_recv_wr {
            wr_id: RECV_FLAG | slot as u64,
            next: null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        // SAFETY: the live QP; the request and its SGE are valid for the call.
        unsafe { post_recv_on(self.qp, &mut wr) }
    }

    fn arm(&self) {
        // SAFETY: the live CQ.
        unsafe { arm_cq(self.cq) };
    }

    /// Takes the channel's notifications (non-blocking).
    fn drain_events(&mut self) {
        // SAFETY: the QP's live channel and CQ.
        unsafe { drain_channel(self.cc, self.cq, &mut self.unacked) };
    }

    /// The message in receive buffer `slot` as received: the GRH's IP source and the bytes
    /// after the GRH.
    fn received(&self, slot: u32, byte_len: u32) -> Option<(IpAddr, &[u8])> {
        let rb = self.rbuf.as_ref()?;
        let n = (byte_len as usize).min(RSLOT);
        if n < GRH_LEN {
            return None;
        }
        // SAFETY: the slot lies inside the receive buffer; the engine finished writing it
        // (its completion was polled) and it is not reposted until the message is read.
        let b = unsafe { std::slice::from_raw_parts(rb.ptr.add(slot as usize * RSLOT), n) };
        // RoCE v2: an IPv4 packet's header fills the GRH's last 20 bytes; an IPv6 packet's
        // GRH is its IPv6 header.
        let src = if b[20] >> 4 == 4 {
            IpAddr::V4(Ipv4Addr::new(b[32], b[33], b[34], b[35]))
        } else {
            let g: [u8; 16] = b[8..24].try_into().ok()?;
            let v6 = Ipv6Addr::from(g);
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        };
        Some((src, &b[GRH_LEN..]))
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: the objects made in `create` (each checked); the QP goes first, then the
        // buffers' registrations, the CQ, the channel (its events acknowledged), the PD, the
        // id.
        unsafe {
            if !self.qp.is_null() {
                rdma_destroy_qp(self.id);
            }
            self.sbuf = None;
            self.rbuf = None;
            if !self.cq.is_null() {
                self.drain_events();
                ibv_ack_cq_events(self.cq, self.unacked);
                ibv_destroy_cq(self.cq);
            }
            if !self.cc.is_null() {
                ibv_destroy_comp_channel(self.cc);
            }
            if !self.pd.is_null() {
                ibv_dealloc_pd(self.pd);
            }
            rdma_destroy_id(self.id);
        }
    }
}

/// A peer: the QP we reach it from and, once its QPN is known, its address handle.
struct Dest {
    qp: usize,
    ah: *mut ibv_ah,
    qpn: u32,
    ip: IpAddr,
}

enum Msg {
    /// In receive buffer `slot` of QP `qp`: `len` bytes of data at `off` after the GRH.
    Ud {
        qp: usize,
        slot: u32,
        off: usize,
        len: usize,
        src: SocketAddr,
    },
    /// From the side channel.
    Udp { src: SocketAddr, data: Vec<u8> },
}

pub(crate) struct Dg {
    udp: c_int,
    /// The UDP socket has its address (bound by the program or by `bind_for`).
    bound: bool,
    nonblock: bool,
    sq_size: u32,
    rq_size: u32,
    sq_inline: u32,
    sbuf_size: u32,
    rbuf_size: u32,
    qps: Vec<Qp>,
    dests: HashMap<SocketAddr, Dest>,
    /// The address `rconnect` named.
    conn: Option<SocketAddr>,
    msgs: VecDeque<Msg>,
    udp_msgs: usize,
    /// Messages dropped: not rsocket datagrams, forged sources, no room.
    drops: u64,
}

// SAFETY: the raw pointers name objects of this library used only under the socket's lock.
unsafe impl Send for Dg {}

impl Dg {
    /// rdma-core's `ds_set_qp_size`: as many buffers of 2048 bytes as the memory allows.
    fn sizes(&mut self) {
        let max = 0xfffe;
        self.sq_size = self.sq_size.clamp(1, max);
        self.rq_size = self.rq_size.clamp(1, max);
        let rb = (self.rbuf_size / SNDLOWAT).max(1);
        if self.rq_size > rb {
            self.rq_size = rb;
        }
        let sb = (self.sbuf_size / SNDLOWAT).max(1);
        if self.sq_size > sb {
            self.sq_size = sb;
        }
    }

    /// The socket's own address, bound to an ephemeral port first if it has none.
    fn local(&self) -> Result<SocketAddr, c_int> {
        // SAFETY: a zeroed sockaddr_storage is valid; the kernel fills it.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut l = size_of::<libc::sockaddr_storage>() as socklen_t;
        // SAFETY: the socket's descriptor; out parameters locals.
        if unsafe { libc::getsockname(self.udp, &mut ss as *mut _ as *mut sockaddr, &mut l) } != 0 {
            return Err(errno_or(libc::EBADF));
        }
        // SAFETY: filled by the kernel.
        unsafe { from_sockaddr(&ss as *const _ as *const sockaddr) }.ok_or(libc::EAFNOSUPPORT)
    }

    /// A socket that is not bound yet is bound, before it first sends or connects, to the
    /// device address that reaches `dst` and an ephemeral port, so that its UDP datagrams
    /// leave from the address its UD QP sends from (a UDP socket's implicit bind would take
    /// the kernel's route, another address on a host with several).
    fn bind_for(&mut self, dst: &SocketAddr) -> Result<(), c_int> {
        if self.bound {
            return Ok(());
        }
        let a = self.local()?;
        if a.port() != 0 {
            self.bound = true;
            return Ok(());
        }
        let ip = resolve_src(dst).unwrap_or(if a.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            Ipv6Addr::UNSPECIFIED.into()
        });
        // SAFETY: as above.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let l = to_sockaddr(&mut ss, SocketAddr::new(ip, 0));
        // SAFETY: the socket's descriptor and a local address.
        if unsafe { libc::bind(self.udp, &ss as *const _ as *const sockaddr, l) } != 0 {
            return Err(errno_or(libc::EADDRINUSE));
        }
        self.bound = true;
        Ok(())
    }

    /// The local address (with the socket's port) that reaches `dst`: the socket's own
    /// when it is bound to one, else the device address RDMA-CM resolves for `dst` (as
    /// rdma-core resolves its address handles), else the kernel's route.
    fn src_for(&self, dst: &SocketAddr) -> Result<SocketAddr, c_int> {
        let mut local = self.local()?;
        if !(local.ip().is_unspecified() || local.ip().is_loopback()) {
            return Ok(local);
        }
        let ip = match resolve_src(dst) {
            Some(ip) => ip,
            None => route_src(dst)?,
        };
        local.set_ip(ip);
        Ok(local)
    }

    /// The peer `dst`, added (with a QP for the local address that reaches it) if new.
    fn dest(&mut self, dst: SocketAddr) -> Result<&mut Dest, c_int> {
        if !self.dests.contains_key(&dst) {
            if self.dests.len() >= MAX_DESTS {
                return Err(libc::ENOBUFS);
            }
            let src = self.src_for(&dst)?;
            let qi = match self.qps.iter().position(|q| q.local == src) {
                Some(i) => i,
                None => {
                    self.sizes();
                    let q = Qp::create(src, self.sq_size, self.rq_size, &mut self.sq_inline)?;
                    self.qps.push(q);
                    self.qps.len() - 1
                }
            };
            self.dests.insert(
                dst,
                Dest {
                    qp: qi,
                    ah: null_mut(),
                    qpn: 0,
                    ip: dst.ip(),
                },
            );
        }
        self.dests.get_mut(&dst).ok_or(libc::EINVAL)
    }

    /// Points the address handle for `dst` at its QP `qpn` on address `qp_ip` (the address
    /// the side-channel header names: the peer's UDP socket may be bound to another, or to
    /// none).
    fn learn(&mut self, dst: SocketAddr, qpn: u32, qp_ip: IpAddr) {
        let Some(d) = self.dests.get(&dst) else {
            return;
        };
        if !d.ah.is_null() && d.qpn == qpn && d.ip == qp_ip {
            return;
        }
        let ah = self.qps[d.qp].ah_to(qp_ip);
        if ah.is_null() {
            return;
        }
        if let Some(d) = self.dests.get_mut(&dst) {
            if !d.ah.is_null() {
                // SAFETY: the handle made for this peer before; no send in flight names it
                // after this (sends are posted under this lock and copy the handle's route).
                unsafe { ibv_destroy_ah(d.ah) };
            }
            d.ah = ah;
            d.qpn = qpn;
            d.ip = qp_ip;
        }
    }

    /// Sends `data` to `dst` over the side channel with our QP's header.
    fn send_udp(&mut self, dst: SocketAddr, op: u8, data: &[u8], flags: c_int) -> isize {
        let qi = match self.dest(dst) {
            Ok(d) => d.qp,
            Err(e) => return fail(e),
        };
        let q = &self.qps[qi];
        let mut h = udp_header(op, q.qpn, &q.local.ip());
        let hl = h.len();
        h.extend_from_slice(data);
        // SAFETY: as in `local`.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let l = to_sockaddr(&mut ss, dst);
        // SAFETY: the socket's descriptor; a local buffer and address.
        let r = unsafe {
            libc::sendto(
                self.udp,
                h.as_ptr() as *const c_void,
                h.len(),
                (flags & !libc::MSG_DONTWAIT) | libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                &ss as *const _ as *const sockaddr,
                l,
            )
        };
        if r < 0 {
            -1
        } else {
            (r as usize).saturating_sub(hl) as isize
        }
    }

    /// Sends one message; `Err(EAGAIN)` when no send buffer is free.
    fn send(&mut self, dst: SocketAddr, data: &[u8], flags: c_int) -> Result<isize, c_int> {
        let hl = ds_hdr_len(&dst);
        if data.len() > SLOT - hl {
            return Err(libc::EMSGSIZE);
        }
        if self.dests.get(&dst).is_none_or(|d| d.ah.is_null()) {
            // The peer's QP may have been announced on the side channel meanwhile (no other
            // system call per datagram once it is known: send buffers are taken back below,
            // when none is free).
            self.poll_udp();
        }
        let (qi, ah, qpn) = {
            let d = self.dest(dst)?;
            (d.qp, d.ah, d.qpn)
        };
        let src = self.qps[qi].local;
        let sh = ds_hdr_len(&src);
        if sh + data.len() > SLOT {
            return Err(libc::EMSGSIZE);
        }
        if ah.is_null() || sh + data.len() > self.qps[qi].mtu {
            let r = self.send_udp(dst, OP_DATA, data, flags);
            return if r < 0 {
                Err(errno_or(libc::EIO))
            } else {
                Ok(r)
            };
        }
        if self.qps[qi].free.is_empty() {
            self.poll_qp(qi);
        }
        let q = &mut self.qps[qi];
        let Some(slot) = q.free.pop() else {
            return Err(libc::EAGAIN);
        };
        let sb = q.sbuf.as_ref().ok_or(libc::EINVAL)?;
        let h = ds_header(&src);
        // SAFETY: slot < sq: a message buffer of SLOT bytes that no posted send uses (it was
        // free); header and data fit (checked above).
        let p = unsafe { sb.ptr.add(slot as usize * SLOT) };
        // SAFETY: as above: hl + data.len() <= SLOT bytes at `p`, from our own slices.
        unsafe {
            std::ptr::copy_nonoverlapping(h.as_ptr(), p, h.len());
            std::ptr::copy_nonoverlapping(data.as_ptr(), p.add(h.len()), data.len());
        }
        let len = (h.len() + data.len()) as u32;
        let mut sge = ibv_sge {
            addr: p as u64,
            length: len,
            lkey: sb.lkey(),
        };
        let mut wr = ibv_send_wr {
            wr_id: slot as u64,
            next: null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: 2, // IBV_WR_SEND
            send_flags: if len <= self.sq_inline { 8 } else { 0 },
            imm_data: 0,
            wr: wr_union {
                ud: wr_ud {
                    ah,
                    remote_qpn: qpn,
                    remote_qkey: RDMA_UDP_QKEY,
                },
            },
            remote_srqn: 0,
            bind_mw: crate::abi::ibv_send_wr_bind_mw::NONE,
        };
        // SAFETY: the live QP; the request and its SGE are valid for the call.
        if let Err(e) = unsafe { post_send_on(q.qp, &mut wr) } {
            q.free.push(slot);
            return Err(e);
        }
        Ok(data.len() as isize)
    }

    /// Takes QP `qi`'s completions: received messages queued (or their buffers reposted),
    /// send buffers freed.
    fn poll_qp(&mut self, qi: usize) {
        const BATCH: usize = 16;
        loop {
            // SAFETY: an all-zero ibv_wc is valid.
            let mut wcs: [ibv_wc; BATCH] = unsafe { std::mem::zeroed() };
            // SAFETY: the QP's live CQ.
            let n = unsafe { poll_cq_into(self.qps[qi].cq, &mut wcs) };
            if n == 0 {
                return;
            }
            for wc in &wcs[..n] {
                let slot = (wc.wr_id & 0xffff_ffff) as u32;
                if wc.wr_id & RECV_FLAG == 0 {
                    self.qps[qi].free.push(slot);
                    continue;
                }
                if wc.status != 0 {
                    // Flushed (the QP is going away): nothing to read.
                    continue;
                }
                let q = &self.qps[qi];
                let m = q.received(slot, wc.byte_len).and_then(|(ip, b)| {
                    let (src, hl) = parse_ds_header(b)?;
                    // The header's address must be the packet's own source.
                    (src.ip() == ip).then_some(Msg::Ud {
                        qp: qi,
                        slot,
                        off: hl,
                        len: b.len() - hl,
                        src,
                    })
                });
                match m {
                    Some(m) => self.msgs.push_back(m),
                    None => {
                        self.drops += 1;
                        let _ = q.post_recv(slot);
                    }
                }
            }
        }
    }

    /// Takes what waits on the side channel.
    fn poll_udp(&mut self) {
        let mut buf = vec![0u8; SLOT + UDP_HDR_V6];
        for _ in 0..UDP_BATCH {
            // SAFETY: as in `local`.
            let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut l = size_of::<libc::sockaddr_storage>() as socklen_t;
            // SAFETY: the socket's descriptor; a local buffer and address.
            let n = unsafe {
                libc::recvfrom(
                    self.udp,
                    buf.as_mut_ptr() as *mut c_void,
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    &mut ss as *mut _ as *mut sockaddr,
                    &mut l,
                )
            };
            if n < 0 {
                return;
            }
            // SAFETY: filled by the kernel.
            let Some(src) = (unsafe { from_sockaddr(&ss as *const _ as *const sockaddr) }) else {
                continue;
            };
            let b = &buf[..n as usize];
            let Some((op, qpn, hl, qp_ip)) = parse_udp_header(b, src.is_ipv4()) else {
                self.drops += 1;
                continue;
            };
            if self.dest(src).is_err() {
                self.drops += 1;
                continue;
            }
            if op == OP_DATA {
                // Tell the sender our QPN.
                self.send_udp(src, OP_CTRL, &[], 0);
            }
            self.learn(src, qpn, qp_ip);
            if op == OP_DATA {
                if self.udp_msgs < self.rq_size as usize {
                    self.udp_msgs += 1;
                    self.msgs.push_back(Msg::Udp {
                        src,
                        data: b[hl..].to_vec(),
                    });
                } else {
                    self.drops += 1;
                }
            }
        }
    }

    fn progress(&mut self) {
        for qi in 0..self.qps.len() {
            self.poll_qp(qi);
        }
        self.poll_udp();
    }

    /// Waits until every posted send completed, or `deadline`.
    fn flush(&mut self, deadline: Instant) {
        for qi in 0..self.qps.len() {
            loop {
                self.poll_qp(qi);
                let q = &self.qps[qi];
                if q.free.len() >= q.sq as usize || Instant::now() >= deadline {
                    break;
                }
                // SAFETY: the QP's live CQ.
                unsafe { wait_cq_for(q.cq, Duration::from_millis(1)) };
            }
        }
    }

    fn can_send(&self) -> bool {
        self.qps.is_empty() || self.qps.iter().any(|q| !q.free.is_empty())
    }

    /// Events now (after progress); when none and `arm`, arms the CQs and says what to wait
    /// on (for a `poll()` on descriptors; a wait that drives the engine needs neither).
    fn revents(&mut self, events: i16, arm: bool) -> (i16, Vec<c_int>) {
        for q in &mut self.qps {
            q.drain_events();
        }
        self.progress();
        let ready = |d: &Dg| {
            let mut r = 0;
            if events & libc::POLLIN != 0 && !d.msgs.is_empty() {
                r |= libc::POLLIN;
            }
            if events & libc::POLLOUT != 0 && d.can_send() {
                r |= libc::POLLOUT;
            }
            r
        };
        let mut r = ready(self);
        if r == 0 && arm {
            for q in &self.qps {
                q.arm();
            }
            self.progress();
            r = ready(self);
        }
        let fds = if r == 0 && arm {
            std::iter::once(self.udp)
                // SAFETY: the QPs' live channels.
                .chain(self.qps.iter().map(|q| unsafe { (*q.cc).fd }))
                .collect()
        } else {
            Vec::new()
        };
        (r, fds)
    }

    /// Copies the next message into `out` (truncated as UDP truncates); its source.
    fn take(&mut self, out: &mut [u8], peek: bool) -> Option<(usize, SocketAddr)> {
        let m = self.msgs.front()?;
        let (n, src) = match m {
            Msg::Ud {
                qp,
                slot,
                off,
                len,
                src,
            } => {
                let rb = self.qps[*qp].rbuf.as_ref()?;
                let n = (*len).min(out.len());
                // SAFETY: the message's bytes inside its receive buffer (not reposted yet).
                let p = unsafe { rb.ptr.add(*slot as usize * RSLOT + GRH_LEN + off) };
                // SAFETY: as above; n <= len, the message's length.
                out[..n].copy_from_slice(unsafe { std::slice::from_raw_parts(p, n) });
                (n, *src)
            }
            Msg::Udp { src, data } => {
                let n = data.len().min(out.len());
                out[..n].copy_from_slice(&data[..n]);
                (n, *src)
            }
        };
        if !peek {
            match self.msgs.pop_front() {
                Some(Msg::Ud { qp, slot, .. }) => {
                    let _ = self.qps[qp].post_recv(slot);
                }
                Some(Msg::Udp { .. }) => self.udp_msgs -= 1,
                None => {}
            }
        }
        Some((n, src))
    }
}

impl Drop for Dg {
    fn drop(&mut self) {
        if crate::rdmacm::trace() && self.drops > 0 {
            eprintln!(
                "ferroce librdmacm: datagram rsocket {}: {} datagrams dropped (not rsocket \
                 datagrams, forged sources, no room)",
                self.udp, self.drops
            );
        }
        for d in self.dests.values() {
            if !d.ah.is_null() {
                // SAFETY: handles made by `learn`, destroyed once, before their PDs go.
                unsafe { ibv_destroy_ah(d.ah) };
            }
        }
        self.dests.clear();
        self.msgs.clear();
        self.qps.clear();
        // SAFETY: the socket's descriptor, ours.
        unsafe { libc::close(self.udp) };
    }
}

// ---- the table and the calls -------------------------------------------------------------------

type Shared = Arc<Mutex<Dg>>;

static TABLE: RwLock<Option<HashMap<c_int, Shared>>> = RwLock::new(None);

pub(crate) fn lookup(fd: c_int) -> Option<Shared> {
    TABLE
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|t| t.get(&fd).cloned())
}

fn lock(m: &Mutex<Dg>) -> MutexGuard<'_, Dg> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `rsocket(domain, SOCK_DGRAM[|flags], 0 or IPPROTO_UDP)`.
pub(crate) fn create(domain: c_int, ty: c_int) -> c_int {
    // SAFETY: socket(2); the descriptor is the rsocket's number, closed by `close`.
    let s = unsafe {
        libc::socket(
            domain,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | (ty & libc::SOCK_CLOEXEC),
            0,
        )
    };
    if s < 0 {
        return -1;
    }
    let d = Dg {
        udp: s,
        bound: false,
        nonblock: ty & libc::SOCK_NONBLOCK != 0,
        sq_size: super::DEF_SQ,
        rq_size: super::DEF_RQ,
        sq_inline: super::DEF_INLINE,
        sbuf_size: super::DEF_MEM,
        rbuf_size: super::DEF_MEM,
        qps: Vec::new(),
        dests: HashMap::new(),
        conn: None,
        msgs: VecDeque::new(),
        udp_msgs: 0,
        drops: 0,
    };
    TABLE
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(s, Arc::new(Mutex::new(d)));
    s
}

pub(crate) fn close(s: c_int) -> Option<c_int> {
    let d = TABLE
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
        .and_then(|t| t.remove(&s))?;
    // Datagrams posted but not yet sent go out first (up to a second), as rdma-core's close
    // waits for its sends: a reply sent just before the close would otherwise be lost.
    lock(&d).flush(Instant::now() + Duration::from_secs(1));
    // The last reference goes when other threads' calls on it return.
    drop(d);
    Some(0)
}

/// Waits (lock released) until something may have changed, at most one [`SLICE`] with a QP
/// (the thread drives the engine while it waits for a completion, [`wait_cq_for`]; the
/// caller then looks at the side channel too) or 50 ms before the first QP (asleep on the
/// side channel), never past `deadline`: the caller looks again.
fn wait(d: &Shared, deadline: Option<Instant>) -> Result<(), c_int> {
    // The caller has just looked (after progress). What came since ends the wait at once: a
    // completion is already in the CQ, a datagram already readable on the side channel (or
    // seen at the end of the slice).
    let (cq, udp) = {
        let g = lock(d);
        (g.qps.first().map(|q| q.cq), g.udp)
    };
    let mut left = Duration::from_millis(50);
    if let Some(dl) = deadline {
        left = left.min(dl.saturating_duration_since(Instant::now()));
        if left.is_zero() {
            return Err(libc::EAGAIN);
        }
    }
    match cq {
        Some(cq) => {
            // SAFETY: the QP's CQ; QPs are destroyed only when the socket is, which the
            // caller's reference keeps alive.
            unsafe { wait_cq_for(cq, left.min(SLICE)) };
        }
        None => {
            let mut p = pollfd {
                fd: udp,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd on the stack.
            unsafe { libc::poll(&mut p, 1, left.as_millis().max(1) as c_int) };
        }
    }
    Ok(())
}

/// Waits for `events` on the socket until `deadline` (`rpoll` with one datagram rsocket).
pub(crate) fn poll_one(d: &Shared, events: i16, deadline: Option<Instant>) -> i16 {
    loop {
        let r = lock(d).revents(events, false).0;
        if r != 0 || wait(d, deadline).is_err() {
            return r;
        }
    }
}

/// `rbind`.
pub(crate) fn bind(d: &Shared, addr: *const sockaddr, len: socklen_t) -> c_int {
    let g = lock(d);
    // SAFETY: the caller's address of `len` bytes.
    unsafe { libc::bind(g.udp, addr, len) }
}

/// `rconnect`: the peer every `rsend` goes to.
pub(crate) fn connect(d: &Shared, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's address (NULL checked by from_sockaddr).
    let Some(dst) = (unsafe { from_sockaddr(addr) }) else {
        return fail(libc::EAFNOSUPPORT);
    };
    let mut g = lock(d);
    if let Err(e) = g.bind_for(&dst) {
        return fail(e);
    }
    // SAFETY: the caller's address of `len` bytes.
    if unsafe { libc::connect(g.udp, addr, len) } != 0 {
        return -1;
    }
    match g.dest(dst) {
        Ok(_) => {
            g.conn = Some(dst);
            0
        }
        Err(e) => fail(e),
    }
}

/// `rsendto` (`dst` None: the connected peer).
pub(crate) fn send_to(d: &Shared, data: &[u8], flags: c_int, dst: Option<SocketAddr>) -> isize {
    loop {
        let mut g = lock(d);
        let Some(to) = dst.or(g.conn) else {
            return fail(libc::EDESTADDRREQ);
        };
        let nonblock = g.nonblock || flags & libc::MSG_DONTWAIT != 0;
        if let Err(e) = g.bind_for(&to) {
            return fail(e);
        }
        match g.send(to, data, flags) {
            Ok(n) => return n,
            Err(libc::EAGAIN) if !nonblock => {}
            Err(e) => return fail(e),
        }
        drop(g);
        if let Err(e) = wait(d, None) {
            return fail(e);
        }
    }
}

/// `rrecvfrom`.
pub(crate) fn recv_from(
    d: &Shared,
    out: &mut [u8],
    flags: c_int,
) -> Result<(usize, SocketAddr), c_int> {
    loop {
        let mut g = lock(d);
        let nonblock = g.nonblock || flags & libc::MSG_DONTWAIT != 0;
        if g.msgs.is_empty() {
            g.progress();
        }
        if let Some(r) = g.take(out, flags & libc::MSG_PEEK != 0) {
            return Ok(r);
        }
        if nonblock {
            return Err(libc::EAGAIN);
        }
        drop(g);
        wait(d, None)?;
    }
}

/// Events of the socket for `rpoll`, and what to wait on when there are none.
pub(crate) fn revents(d: &Shared, events: i16) -> (i16, Vec<c_int>) {
    lock(d).revents(events, true)
}

/// The UDP socket, for the calls that are its own (names, options, descriptor flags).
pub(crate) fn udp(d: &Shared) -> c_int {
    lock(d).udp
}

pub(crate) fn setsockopt(
    d: &Shared,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    let mut g = lock(d);
    let int = if val.is_null() || (len as usize) < 4 {
        None
    } else {
        // SAFETY: at least 4 readable bytes.
        Some(unsafe { std::ptr::read_unaligned(val as *const c_int) })
    };
    if level != SOL_RDMA {
        // SAFETY: the caller's option, passed on as given.
        if unsafe { libc::setsockopt(g.udp, level, name, val, len) } != 0 {
            return -1;
        }
    }
    let Some(v) = int else {
        return if level == SOL_RDMA {
            fail(libc::EINVAL)
        } else {
            0
        };
    };
    let v = v.max(0) as u32;
    let before = g.qps.is_empty();
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_RCVBUF) if before => {
            g.rbuf_size = v.saturating_mul(2).min(1 << 30)
        }
        (libc::SOL_SOCKET, libc::SO_SNDBUF) if before => {
            g.sbuf_size = v.saturating_mul(2).clamp(SNDLOWAT * 2, 1 << 30)
        }
        (SOL_RDMA, RDMA_SQSIZE) if before => g.sq_size = v,
        (SOL_RDMA, RDMA_RQSIZE) if before => g.rq_size = v,
        (SOL_RDMA, RDMA_INLINE) if before => g.sq_inline = v,
        (SOL_RDMA, _) => return fail(libc::ENOTSUP),
        _ => {}
    }
    0
}

pub(crate) fn getsockopt(
    d: &Shared,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    let mut g = lock(d);
    if level != SOL_RDMA {
        // SAFETY: the caller's buffers, passed on.
        return unsafe { libc::getsockopt(g.udp, level, name, val, len) };
    }
    g.sizes();
    let v = match name {
        RDMA_SQSIZE => g.sq_size,
        RDMA_RQSIZE => g.rq_size,
        RDMA_INLINE => g.sq_inline,
        _ => return fail(libc::ENOTSUP),
    };
    // SAFETY: the caller's buffers (checked non-null by the caller).
    unsafe {
        if (*len as usize) < 4 {
            return fail(libc::EINVAL);
        }
        std::ptr::write_unaligned(val as *mut u32, v);
        *len = 4;
    }
    0
}

pub(crate) fn fcntl(d: &Shared, cmd: c_int, arg: libc::c_long) -> c_int {
    let mut g = lock(d);
    match cmd {
        libc::F_GETFL => libc::O_RDWR | if g.nonblock { libc::O_NONBLOCK } else { 0 },
        libc::F_SETFL => {
            g.nonblock = arg as c_int & libc::O_NONBLOCK != 0;
            0
        }
        // SAFETY: the socket's own descriptor.
        libc::F_GETFD | libc::F_SETFD => unsafe { libc::fcntl(g.udp, cmd, arg) },
        _ => fail(libc::ENOTSUP),
    }
}

/// `rrecvfrom` into the caller's buffer and address.
///
/// # Safety
/// `buf` names `len` writable bytes; `src`/`alen` are NULL or writable.
pub(crate) unsafe fn recvfrom_c(
    d: &Shared,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    src: *mut sockaddr,
    alen: *mut socklen_t,
) -> isize {
    // SAFETY: the caller's contract.
    let out = unsafe { slice_mut(buf, len) };
    match recv_from(d, out, flags) {
        Ok((n, from)) => {
            if !src.is_null() && !alen.is_null() {
                copy_source(src, alen, from);
            }
            n as isize
        }
        Err(e) => fail(e),
    }
}

/// Writes `from` into the caller's address buffer `dst` of `*len` bytes (truncated to it), and
/// its whole length into `*len`, as `recvfrom` does. `dst` and `len` are not NULL.
pub(crate) fn copy_source(dst: *mut sockaddr, len: *mut socklen_t, from: SocketAddr) {
    // SAFETY: a zeroed sockaddr_storage is valid; written by to_sockaddr.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    to_sockaddr(&mut ss, from);
    copy_addr(dst, len, &ss);
}

/// `rsendto` from the caller's buffer.
///
/// # Safety
/// `buf` names `len` readable bytes; `dst` is NULL or a socket address.
pub(crate) unsafe fn sendto_c(
    d: &Shared,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    dst: *const sockaddr,
) -> isize {
    // SAFETY: the caller's contract.
    let data = unsafe { slice(buf, len) };
    let to = if dst.is_null() {
        None
    } else {
        // SAFETY: the caller's address.
        match unsafe { from_sockaddr(dst) } {
            Some(a) => Some(a),
            None => return fail(libc::EAFNOSUPPORT),
        }
    };
    send_to(d, data, flags, to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_headers_read_back_as_rdma_cores_layout() {
        // rdma-core's struct ds_udp_header: tag, version, op, length, reserved, qpn, addr.
        let h = udp_header(OP_DATA, 0x12_3456, &IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7)));
        assert_eq!(
            h,
            [0x55, 0x55, 0x55, 0x55, 4, 0, 16, 0, 0, 0x12, 0x34, 0x56, 10, 0, 0, 7]
        );
        assert_eq!(
            parse_udp_header(&h, true),
            Some((
                OP_DATA,
                0x12_3456,
                16,
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7))
            ))
        );
        // The family must match the address it came from; the tag must be there.
        assert_eq!(parse_udp_header(&h, false), None);
        let mut bad = h.clone();
        bad[0] = 0x54;
        assert_eq!(parse_udp_header(&bad, true), None);
        assert_eq!(parse_udp_header(&h[..12], true), None);
        let h6 = udp_header(OP_CTRL, 0xff_ffff, &IpAddr::V6(Ipv6Addr::LOCALHOST));
        assert_eq!(h6.len(), 28);
        assert_eq!(
            parse_udp_header(&h6, false),
            Some((OP_CTRL, 0xff_ffff, 28, IpAddr::V6(Ipv6Addr::LOCALHOST)))
        );
    }

    #[test]
    fn any_bytes_parse_or_are_refused_and_what_parses_emits_back() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for i in 0..200_000 {
            let len = i % 40;
            let mut b: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            // Often a plausible start, so that the checks past it are reached.
            if i % 3 == 0 && len >= 8 {
                b[..4].copy_from_slice(&DS_UDP_TAG.to_be_bytes());
                b[4] = [4, 6][i % 2];
                b[6] = [16, 28][(i / 2) % 2];
            }
            if let Some((op, qpn, hl, ip)) = parse_udp_header(&b, i % 5 != 0) {
                assert!(hl <= b.len() && qpn <= 0xff_ffff);
                let mut e = udp_header(op, qpn, &ip);
                e[7] = b[7]; // reserved: not checked on receive
                e[8] = b[8]; // the QPN's reserved top byte
                assert_eq!(&b[..hl], &e[..]);
            }
            let mut d = b.clone();
            if i % 3 == 1 && len >= 2 {
                d[0] = [4, 6][i % 2];
                d[1] = [8, 24][(i / 2) % 2];
            }
            if let Some((a, hl)) = parse_ds_header(&d) {
                assert!(hl <= d.len());
                assert_eq!(&d[..hl], &ds_header(&a)[..]);
            }
        }
    }

    #[test]
    fn ds_headers_name_the_sender() {
        let a: SocketAddr = "192.168.7.9:7174".parse().unwrap();
        let h = ds_header(&a);
        assert_eq!(h, [4, 8, 0x1c, 0x06, 192, 168, 7, 9]);
        assert_eq!(parse_ds_header(&h), Some((a, 8)));
        let a6: SocketAddr = "[fd77::2]:9".parse().unwrap();
        let h6 = ds_header(&a6);
        assert_eq!(h6.len(), 24);
        assert_eq!(parse_ds_header(&h6), Some((a6, 24)));
        // Version and length must agree; short buffers are refused, never read past.
        assert_eq!(parse_ds_header(&[4, 24, 0, 0, 1, 2, 3, 4]), None);
        assert_eq!(parse_ds_header(&h[..7]), None);
        assert_eq!(parse_ds_header(&[]), None);
    }
}
