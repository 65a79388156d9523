//! rsockets on ferroce: librdmacm's stream sockets over RDMA (`<rdma/rsocket.h>`), speaking
//! rdma-core's rsocket protocol on the wire, so that an rsocket program under `ferroce run`
//! talks to one on rdma-core (rxe or a hardware NIC) as well as to another under ferroce.
//!
//! Built on this library's own RDMA-CM and verbs calls, as rdma-core builds its rsockets on
//! its own: one RC QP per connected socket, one CQ (send and receive) with a completion
//! channel, and three registered buffers.
//!
//! # The protocol (facts from rdma-core's `librdmacm/rsocket.c`; this is our own code)
//! - Connection: the REQ's and the REP's private data is `struct rs_conn_data` (40 bytes):
//!   version 1, flags (bit 0: the sender is big-endian, bit 1: it has an iomap area), the
//!   receive credits (big-endian u16: its receive queue depth), 3 reserved bytes, the iomap
//!   size (scaled u8), then two `{addr: be64, key: be32, length: be32}`: the sender's *target
//!   SGL* (an array of 2 SGEs in the sender's host order that the peer RDMA-WRITEs to give it
//!   receive buffer space; length = the entry count) and its first receive buffer (half the
//!   ring).
//! - Data: RDMA WRITE with immediate into the space the last SGL named; the immediate is
//!   `op << 29 | value` (op 0 data: value = bytes written; op 4 SGL: value = the new credit
//!   limit, the receiver's consumed-message count plus its queue depth; op 7 control:
//!   0 disconnect, 2 shutdown of writing). Receives are posted without SGEs. Every send is
//!   signalled; 4 send-queue slots are kept for control messages.
//! - A receiver grants buffer space half a ring at a time (when half is free) by writing one
//!   SGE into the sender's target SGL with an SGL message; it grants credits alone (an SGL
//!   message without a write) when half its queue's messages were consumed.
//! - A peer's DREQ without the disconnect message (its process died) ends the connection:
//!   a connected socket reads its CM channel too (`St::poll_cm`).
//!
//! # Limits of this implementation
//! Datagram rsockets (`SOCK_DGRAM`) are in [`dgram`]. For stream sockets, a non-blocking
//! `rconnect` returns `EINPROGRESS` and the connection is made from the socket's later calls
//! (`rpoll`, `rconnect`, data calls), as rdma-core's; a non-blocking listener's `raccept`
//! hands out the socket once it has sent the REP, the RTU taken from the socket's later calls
//! (a blocking one's waits for it); a listener accepts a request when the program calls
//! `raccept` (or `rpoll` finds it), not from a service thread; keepalives (`SO_KEEPALIVE`,
//! every `TCP_KEEPIDLE`) are sent from the socket's own calls, blocked ones included, not
//! from a service thread ([`St::keepalive`]).
//!
//! # Descriptors
//! An rsocket's number is an eventfd of its own (a real descriptor, so it never collides with
//! the program's sockets); `rpoll`/`rselect` in `librdmacm.so.1` call libc's `poll`/`select`
//! directly when no rsocket is among the descriptors (tools/build-cabi), and
//! [`ferroce_rpoll`] otherwise.

use crate::abi::*;
use crate::rdmacm::{
    rdma_accept, rdma_ack_cm_event, rdma_bind_addr, rdma_connect, rdma_create_event_channel,
    rdma_create_id, rdma_create_qp, rdma_destroy_event_channel, rdma_destroy_id, rdma_destroy_qp,
    rdma_disconnect, rdma_get_cm_event, rdma_listen, rdma_migrate_id, rdma_reject,
    rdma_resolve_addr, rdma_resolve_route, rdma_set_option,
};
use crate::verbs::{
    ibv_ack_cq_events, ibv_alloc_pd, ibv_create_comp_channel, ibv_create_cq, ibv_dealloc_pd,
    ibv_dereg_mr, ibv_destroy_comp_channel, ibv_destroy_cq, ibv_get_cq_event, ibv_reg_mr,
    set_errno,
};
use libc::{c_int, c_void, nfds_t, pollfd, sockaddr, socklen_t};
use std::collections::HashMap;
use std::ptr::null_mut;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

// ---- protocol constants (rdma-core's rsocket.c, rsocket.h) --------------------------------------

const OP_DATA: u32 = 0;
/// A direct write into a peer's iomap (riowrite): never on the wire, only in work-request ids.
const OP_WRITE: u32 = 2;
const OP_SGL: u32 = 4;
const OP_IOMAP_SGL: u32 = 6;
const OP_CTRL: u32 = 7;
const CTRL_DISCONNECT: u32 = 0;
const CTRL_KEEPALIVE: u32 = 1;
const CTRL_SHUTDOWN: u32 = 2;
/// rdma-core's default keepalive time (`/etc/rdma/rsocket/keepalive_time`, TCP's 2 hours).
const DEF_KEEPALIVE: Duration = Duration::from_secs(7200);
const CONN_FLAG_NET: u8 = 1;
const CONN_FLAG_IOMAP: u8 = 2;
const CONN_DATA_LEN: usize = 40;
/// Entries of the target SGL.
const SGL_SIZE: u32 = 2;
/// One `struct rs_sge`.
const SGE_LEN: usize = 16;
/// One `struct rs_iomap`: an offset (u64) and an SGE.
const IOMAP_LEN: usize = 24;
/// Send-queue slots kept for control messages.
const CTRL_SLOTS: u32 = 4;
/// rsend waits for this much send buffer before it sends.
const SNDLOWAT: u32 = 2048;
const OLAP_START: usize = 2048;
const MAX_TRANSFER: usize = 65536;
const QP_MIN: u32 = 16;
const QP_MAX: u32 = 0xfffe;
const RECV_FLAG: u64 = 1 << 63;

const DEF_SQ: u32 = 384;
const DEF_RQ: u32 = 384;
const DEF_INLINE: u32 = 64;
const DEF_MEM: u32 = 1 << 17;

const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_RQSIZE: c_int = 1;
const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;
const RDMA_ROUTE: c_int = 4;

const IBV_WR_RDMA_WRITE: c_int = 0;
const IBV_WR_RDMA_WRITE_WITH_IMM: c_int = 1;
const IBV_SEND_INLINE: u32 = 8;
const IBV_WC_WITH_IMM: u32 = 2;
const IBV_QPT_RC: c_int = 2;
const ACCESS_WRITE: c_int = 1 | 2; // LOCAL_WRITE | REMOTE_WRITE

const EV_ADDR_RESOLVED: c_int = 0;
const EV_ROUTE_RESOLVED: c_int = 2;
const EV_CONNECT_REQUEST: c_int = 4;
const EV_ESTABLISHED: c_int = 9;
const EV_DISCONNECTED: c_int = 10;
const EV_REJECTED: c_int = 8;
const EV_UNREACHABLE: c_int = 7;

/// How long the CM steps of connect and accept may take.
const CM_TIMEOUT: Duration = Duration::from_secs(20);

fn msg(op: u32, v: u32) -> u32 {
    (op << 29) | (v & 0x1fff_ffff)
}

/// rdma-core's scaled u8 for an iomap size: values up to 128 as they are, larger ones as
/// 128 | value / 256.
fn value_to_scale(v: u32) -> u8 {
    if v <= 128 {
        v as u8
    } else {
        (128 | (v >> 8).min(127)) as u8
    }
}

fn scale_to_value(v: u8) -> u32 {
    if v <= 128 {
        u32::from(v)
    } else {
        u32::from(v & 127) << 8
    }
}

/// A region this side mapped with `riomap`.
struct IoMap {
    /// Its slot in the peer's view of our iomap (`None`: mapped without PROT_WRITE, local).
    index: Option<u32>,
    offset: u64,
    mr: *mut ibv_mr,
    /// Announced to the peer.
    sent: bool,
}

// ---- state ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Init,
    Bound,
    Listening,
    /// `rconnect` began; what the connection waits for next. A non-blocking socket returns
    /// `EINPROGRESS` here and goes on from `rpoll`, `rconnect`, `rsend` or `rrecv`.
    Connecting(Step),
    Connected,
    /// The peer said it is done (or the connection failed): what was received can still be
    /// read, nothing more arrives.
    Disconnected,
    Error,
}

/// The CM event a connection being made waits for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Step {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`
    Addr,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`
    Route,
    /// `RDMA_CM_EVENT_ESTABLISHED` (the REQ is out)
    Established,
    /// `RDMA_CM_EVENT_ESTABLISHED` on an accepted socket (the REP is out, the RTU to come)
    Accepted,
}

/// A buffer registered with the device: the engine (another thread) writes into it, so it
/// is only touched through raw pointers.
struct Buf {
    ptr: *mut u8,
    len: usize,
    mr: *mut ibv_mr,
}

impl Buf {
    fn alloc(pd: *mut ibv_pd, len: usize, access: c_int) -> Result<Buf, c_int> {
        let layout =
            std::alloc::Layout::from_size_align(len.max(1), 64).map_err(|_| libc::ENOMEM)?;
        // SAFETY: a non-zero-sized layout; zeroed so the peer never reads our old memory.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(libc::ENOMEM);
        }
        // SAFETY: the PD is live; the buffer is ours and outlives the MR (dropped after it).
        let mr = unsafe { ibv_reg_mr(pd, ptr as *mut c_void, len, access) };
        if mr.is_null() {
            // SAFETY: allocated above with this layout.
            unsafe { std::alloc::dealloc(ptr, layout) };
            return Err(errno_or(libc::ENOMEM));
        }
        Ok(Buf { ptr, len, mr })
    }
    fn lkey(&self) -> u32 {
        // SAFETY: the MR registered at alloc, live until drop.
        unsafe { (*self.mr).lkey }
    }
    fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: the MR and the allocation made in `alloc`; the QP using them is destroyed
        // before the buffers are (field order in `Conn`).
        unsafe {
            ibv_dereg_mr(self.mr);
            std::alloc::dealloc(
                self.ptr,
                std::alloc::Layout::from_size_align_unchecked(self.len.max(1), 64),
            );
        }
    }
}

/// The verbs objects of a connected socket.
struct Conn {
    qp: *mut ibv_qp,
    cq: *mut ibv_cq,
    cc: *mut ibv_comp_channel,
    pd: *mut ibv_pd,
    sbuf: Buf,
    rbuf: Buf,
    /// Our target SGL: `SGL_SIZE` entries the peer writes.
    tsgl: Buf,
    unacked_events: u32,
    iomaps: Vec<IoMap>,
}

struct St {
    phase: Phase,
    readable: bool,
    writable: bool,
    err: c_int,
    nonblock: bool,
    fd_flags: c_int,
    ch: *mut rdma_event_channel,
    id: *mut rdma_cm_id,
    conn: Option<Conn>,
    // Sizes (options before connecting).
    sq_size: u32,
    rq_size: u32,
    sq_inline: u32,
    sbuf_size: u32,
    rbuf_size: u32,
    /// Entries of our iomap area (`RDMA_IOMAPSIZE`), in the target buffer after the SGL.
    target_iomap_size: u32,
    /// The peer's iomap area: address, key, entries.
    remote_iomap: (u64, u32, u32),
    so_opts: u64,
    tcp_opts: u64,
    ipv6_opts: u64,
    // Protocol counters (rsocket.c's names).
    ctrl_seqno: u32,
    ctrl_max_seqno: u32,
    sseq_no: u16,
    sseq_comp: u16,
    rseq_no: u16,
    rseq_comp: u16,
    remote_sge: u32,
    remote_sgl: (u64, u32, u32),
    target_sge: usize,
    swap_sgl: bool,
    rbuf_bytes_avail: u32,
    rbuf_free_offset: u32,
    rbuf_offset: u32,
    sbuf_bytes_avail: u32,
    sbuf_pos: u32,
    sqe_avail: u32,
    /// Received messages (op, bytes) not yet read.
    rmsg: std::collections::VecDeque<u32>,
    /// Their bytes.
    unread: u64,
    cq_armed: bool,
    /// `TCP_KEEPIDLE`: how often a connection with `SO_KEEPALIVE` sends a keepalive.
    keepalive_time: Duration,
    /// When the next keepalive is due (set once the connection has `SO_KEEPALIVE`).
    next_keepalive: Option<Instant>,
    /// When a connection being made gives up (`ETIMEDOUT`).
    connect_deadline: Option<Instant>,
    /// A connection that returned `EINPROGRESS` and has not yet been reported made by
    /// `rconnect` (which then returns 0 once, as a TCP socket's does; `EISCONN` after).
    connect_unreported: bool,
}

// SAFETY: the raw pointers name objects of this library that are used only under the
// socket's lock.
unsafe impl Send for St {}

pub(crate) struct Rs {
    fd: c_int,
    st: Mutex<St>,
}

fn lock(m: &Mutex<St>) -> MutexGuard<'_, St> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

static TABLE: RwLock<Option<HashMap<c_int, Arc<Rs>>>> = RwLock::new(None);

fn lookup(fd: c_int) -> Option<Arc<Rs>> {
    TABLE
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|t| t.get(&fd).cloned())
}

fn is_rsocket(fd: c_int) -> bool {
    TABLE
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_some_and(|t| t.contains_key(&fd))
        || dgram::lookup(fd).is_some()
}

/// Polls up to `wcs.len()` completions of `cq` through this library's ops table; how many.
///
/// # Safety
/// `cq` is a live CQ of this library.
unsafe fn poll_cq_into(cq: *mut ibv_cq, wcs: &mut [ibv_wc]) -> usize {
    // SAFETY: the caller's contract; the array has room for `wcs.len()` completions.
    let n = unsafe {
        match (*(*cq).context).ops.poll_cq {
            Some(f) => f(cq, wcs.len() as c_int, wcs.as_mut_ptr()),
            None => -1,
        }
    };
    n.max(0) as usize
}

/// Posts the send work requests `wr` on `qp` through this library's ops table.
///
/// # Safety
/// `qp` is a live QP of this library; `wr` (a list) and its SGEs are valid for the call.
unsafe fn post_send_on(qp: *mut ibv_qp, wr: *mut ibv_send_wr) -> Result<(), c_int> {
    let mut bad = null_mut();
    // SAFETY: the caller's contract.
    let r = unsafe {
        match (*(*qp).context).ops.post_send {
            Some(f) => f(qp, wr, &mut bad),
            None => libc::EOPNOTSUPP,
        }
    };
    if r == 0 {
        Ok(())
    } else {
        Err(r)
    }
}

/// Posts the receive work requests `wr` on `qp` through this library's ops table.
///
/// # Safety
/// As [`post_send_on`]'s.
unsafe fn post_recv_on(qp: *mut ibv_qp, wr: *mut ibv_recv_wr) -> Result<(), c_int> {
    let mut bad = null_mut();
    // SAFETY: the caller's contract.
    let r = unsafe {
        match (*(*qp).context).ops.post_recv {
            Some(f) => f(qp, wr, &mut bad),
            None => libc::EOPNOTSUPP,
        }
    };
    if r == 0 {
        Ok(())
    } else {
        Err(r)
    }
}

/// Asks `cq` for a notification of its next completion, through this library's ops table.
///
/// # Safety
/// `cq` is a live CQ of this library.
unsafe fn arm_cq(cq: *mut ibv_cq) {
    // SAFETY: the caller's contract.
    unsafe {
        if let Some(f) = (*(*cq).context).ops.req_notify_cq {
            f(cq, 0);
        }
    }
}

/// Takes the notifications waiting on `cc` (a non-blocking channel) and acknowledges them on
/// `cq` 64 at a time (`unacked` counts those not acknowledged yet); how many were taken.
///
/// # Safety
/// `cc` is a live completion channel of this library and `cq` its CQ.
unsafe fn drain_channel(cc: *mut ibv_comp_channel, cq: *mut ibv_cq, unacked: &mut u32) -> u32 {
    let mut n = 0;
    loop {
        let mut c = null_mut();
        let mut ctx = null_mut();
        // SAFETY: the caller's channel, non-blocking; out parameters are locals.
        if unsafe { ibv_get_cq_event(cc, &mut c, &mut ctx) } != 0 {
            break;
        }
        *unacked += 1;
        n += 1;
    }
    if *unacked >= 64 {
        // SAFETY: events of the caller's CQ, taken above or before.
        unsafe { ibv_ack_cq_events(cq, *unacked) };
        *unacked = 0;
    }
    n
}

fn errno_or(d: c_int) -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .filter(|e| *e != 0)
        .unwrap_or(d)
}

fn fail<T: From<i8>>(e: c_int) -> T {
    set_errno(e);
    T::from(-1)
}

impl St {
    fn new(ch: *mut rdma_event_channel, id: *mut rdma_cm_id, nonblock: bool) -> St {
        St {
            phase: Phase::Init,
            readable: false,
            writable: false,
            err: 0,
            nonblock,
            fd_flags: 0,
            ch,
            id,
            conn: None,
            sq_size: DEF_SQ,
            rq_size: DEF_RQ,
            sq_inline: DEF_INLINE,
            sbuf_size: DEF_MEM,
            rbuf_size: DEF_MEM,
            target_iomap_size: 0,
            remote_iomap: (0, 0, 0),
            so_opts: 0,
            tcp_opts: 0,
            ipv6_opts: 0,
            keepalive_time: DEF_KEEPALIVE,
            next_keepalive: None,
            ctrl_seqno: 0,
            ctrl_max_seqno: CTRL_SLOTS,
            sseq_no: 0,
            sseq_comp: 0,
            rseq_no: 0,
            rseq_comp: 0,
            remote_sge: 0,
            remote_sgl: (0, 0, 0),
            target_sge: 0,
            swap_sgl: false,
            rbuf_bytes_avail: 0,
            rbuf_free_offset: 0,
            rbuf_offset: 0,
            sbuf_bytes_avail: 0,
            sbuf_pos: 0,
            sqe_avail: 0,
            rmsg: std::collections::VecDeque::new(),
            unread: 0,
            cq_armed: false,
            connect_deadline: None,
            connect_unreported: false,
        }
    }

    fn connected(&self) -> bool {
        self.phase == Phase::Connected
    }

    // -- the target SGL (written by the peer) --

    fn tsgl_get(&self, i: usize) -> (u64, u32, u32) {
        // Closed by another thread: no space.
        let Some(c) = self.conn.as_ref() else {
            return (0, 0, 0);
        };
        // SAFETY: entry i < SGL_SIZE of our registered target SGL; the peer may write it at
        // any time (volatile reads of plain integers).
        unsafe {
            let p = c.tsgl.ptr.add(i * SGE_LEN);
            let addr = std::ptr::read_volatile(p as *const u64);
            let key = std::ptr::read_volatile(p.add(8) as *const u32);
            let len = std::ptr::read_volatile(p.add(12) as *const u32);
            if self.swap_sgl {
                (addr.swap_bytes(), key.swap_bytes(), len.swap_bytes())
            } else {
                (addr, key, len)
            }
        }
    }

    /// Entry `i` of our iomap area (the peer writes it): (offset, addr, key, length).
    fn target_iomap(&self, i: usize) -> (u64, u64, u32, u32) {
        let Some(c) = self.conn.as_ref() else {
            return (0, 0, 0, 0);
        };
        // SAFETY: entry i < target_iomap_size of the registered target buffer, after the
        // SGL; volatile reads of plain integers the peer may write at any time.
        unsafe {
            let p = c.tsgl.ptr.add(SGE_LEN * SGL_SIZE as usize + i * IOMAP_LEN);
            let off = std::ptr::read_volatile(p as *const u64);
            let addr = std::ptr::read_volatile(p.add(8) as *const u64);
            let key = std::ptr::read_volatile(p.add(16) as *const u32);
            let len = std::ptr::read_volatile(p.add(20) as *const u32);
            if self.swap_sgl {
                (
                    off.swap_bytes(),
                    addr.swap_bytes(),
                    key.swap_bytes(),
                    len.swap_bytes(),
                )
            } else {
                (off, addr, key, len)
            }
        }
    }

    fn tsgl_set(&self, i: usize, v: (u64, u32, u32)) {
        let Some(c) = self.conn.as_ref() else {
            return;
        };
        let v = if self.swap_sgl {
            (v.0.swap_bytes(), v.1.swap_bytes(), v.2.swap_bytes())
        } else {
            v
        };
        // SAFETY: as in tsgl_get.
        unsafe {
            let p = c.tsgl.ptr.add(i * SGE_LEN);
            std::ptr::write_volatile(p as *mut u64, v.0);
            std::ptr::write_volatile(p.add(8) as *mut u32, v.1);
            std::ptr::write_volatile(p.add(12) as *mut u32, v.2);
        }
    }

    // -- posting --

    fn post_send(&self, wr: &mut ibv_send_wr) -> Result<(), c_int> {
        let c = self.conn.as_ref().ok_or(libc::ENOTCONN)?;
        // SAFETY: the QP is live while `conn` is; the work request and its SGEs are valid
        // for the call (inline data is copied during it).
        unsafe { post_send_on(c.qp, wr) }
    }

    /// Posts `n` receives (no SGE: every message is an RDMA WRITE with immediate), up to
    /// 32 per call as one linked list.
    fn post_recvs(&self, mut n: u32) -> Result<(), c_int> {
        let c = self.conn.as_ref().ok_or(libc::ENOTCONN)?;
        const CHAIN: usize = 32;
        let mut wrs: [ibv_recv_wr; CHAIN] = std::array::from_fn(|_| ibv_recv_wr {
            wr_id: RECV_FLAG,
            next: null_mut(),
            sg_list: null_mut(),
            num_sge: 0,
        });
        while n > 0 {
            let k = (n as usize).min(CHAIN);
            // Every access through this one pointer until the post returns.
            let base = wrs.as_mut_ptr();
            for i in 0..k {
                // SAFETY: i < k <= CHAIN, and i + 1 < k when it is linked: elements of the
                // array.
                unsafe {
                    (*base.add(i)).next = if i + 1 < k {
                        base.add(i + 1)
                    } else {
                        null_mut()
                    };
                }
            }
            // SAFETY: the QP is live while `conn` is; the list is valid for the call.
            unsafe { post_recv_on(c.qp, base) }?;
            n -= k as u32;
        }
        Ok(())
    }

    fn write_imm(
        &self,
        sges: &mut [ibv_sge],
        imm: u32,
        flags: u32,
        addr: u64,
        rkey: u32,
    ) -> Result<(), c_int> {
        self.write(sges, IBV_WR_RDMA_WRITE_WITH_IMM, imm, flags, addr, rkey)
    }

    /// An RDMA WRITE (with immediate `m` when `opcode` says so); `m` is also the work
    /// request's id, which the send completion reads back.
    fn write(
        &self,
        sges: &mut [ibv_sge],
        opcode: c_int,
        m: u32,
        flags: u32,
        addr: u64,
        rkey: u32,
    ) -> Result<(), c_int> {
        let imm = m;
        // SAFETY: an all-zero work request is a valid starting point (pointers NULL).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = imm as u64;
        wr.sg_list = if sges.is_empty() {
            null_mut()
        } else {
            sges.as_mut_ptr()
        };
        wr.num_sge = sges.len() as c_int;
        wr.opcode = opcode;
        wr.send_flags = flags;
        wr.imm_data = imm.to_be();
        wr.wr.rdma = wr_rdma {
            remote_addr: addr,
            rkey,
        };
        self.post_send(&mut wr)
    }

    /// Posts `chunk` to the peer's `addr`: inline when it fits, else copied into the send
    /// ring (two SGEs when it wraps). The caller has counted its bytes out of
    /// `sbuf_bytes_avail`.
    fn post_chunk(
        &mut self,
        chunk: &[u8],
        opcode: c_int,
        m: u32,
        addr: u64,
        rkey: u32,
    ) -> Result<(), c_int> {
        let n = chunk.len();
        if n as u32 <= self.sq_inline {
            let mut s = [ibv_sge {
                addr: chunk.as_ptr() as u64,
                length: n as u32,
                lkey: 0,
            }];
            return self.write(&mut s, opcode, m, IBV_SEND_INLINE, addr, rkey);
        }
        let c = self.conn.as_ref().ok_or(libc::ENOTCONN)?;
        let (base, lkey, size) = (c.sbuf.ptr, c.sbuf.lkey(), self.sbuf_size as usize);
        let pos = self.sbuf_pos as usize;
        let first = n.min(size - pos);
        // SAFETY: `pos + first <= size` and `n - first <= size - first` (n is at most the
        // free bytes, at most the ring's size), inside the registered send ring; the bytes
        // there are free (`sbuf_bytes_avail` counted them), so no posted WRITE still reads
        // them.
        unsafe {
            std::ptr::copy_nonoverlapping(chunk.as_ptr(), base.add(pos), first);
            std::ptr::copy_nonoverlapping(chunk[first..].as_ptr(), base, n - first);
        }
        let mut s = [
            ibv_sge {
                addr: base as u64 + pos as u64,
                length: first as u32,
                lkey,
            },
            ibv_sge {
                addr: base as u64,
                length: (n - first) as u32,
                lkey,
            },
        ];
        self.sbuf_pos = ((pos + n) % size) as u32;
        let k = if n > first { 2 } else { 1 };
        self.write(&mut s[..k], opcode, m, 0, addr, rkey)
    }

    fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    // -- credits --

    fn give_credits(&self) -> bool {
        (self.rbuf_bytes_avail >= self.rbuf_size >> 1
            || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0)
            && self.ctrl_avail()
            && self.connected()
    }

    fn send_credits(&mut self) {
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.rseq_comp = self.rseq_no.wrapping_add((self.rq_size >> 1) as u16);
        let credit = (self.rseq_no as u32).wrapping_add(self.rq_size);
        let Some(c) = self.conn.as_ref() else {
            return;
        };
        let r = if self.rbuf_bytes_avail >= self.rbuf_size >> 1 {
            let addr = c.rbuf.ptr as u64 + self.rbuf_free_offset as u64;
            let (a, k, l) = (addr, c.rbuf.rkey(), self.rbuf_size >> 1);
            let mut sge = [0u8; SGE_LEN];
            if self.swap_sgl {
                sge[..8].copy_from_slice(&a.swap_bytes().to_ne_bytes());
                sge[8..12].copy_from_slice(&k.swap_bytes().to_ne_bytes());
                sge[12..].copy_from_slice(&l.swap_bytes().to_ne_bytes());
            } else {
                sge[..8].copy_from_slice(&a.to_ne_bytes());
                sge[8..12].copy_from_slice(&k.to_ne_bytes());
                sge[12..].copy_from_slice(&l.to_ne_bytes());
            }
            let mut s = [ibv_sge {
                addr: sge.as_ptr() as u64,
                length: SGE_LEN as u32,
                lkey: 0,
            }];
            let dst = self
                .remote_sgl
                .0
                .wrapping_add(u64::from(self.remote_sge) * SGE_LEN as u64);
            let r = self.write_imm(
                &mut s,
                msg(OP_SGL, credit),
                IBV_SEND_INLINE,
                dst,
                self.remote_sgl.1,
            );
            self.rbuf_bytes_avail -= self.rbuf_size >> 1;
            self.rbuf_free_offset += self.rbuf_size >> 1;
            if self.rbuf_free_offset >= self.rbuf_size {
                self.rbuf_free_offset = 0;
            }
            self.remote_sge += 1;
            if self.remote_sge >= self.remote_sgl.2 {
                self.remote_sge = 0;
            }
            r
        } else {
            self.write_imm(&mut [], msg(OP_SGL, credit), 0, 0, 0)
        };
        if let Err(e) = r {
            self.fail_conn(e);
        }
    }

    fn update_credits(&mut self) {
        if self.give_credits() {
            self.send_credits();
        }
    }

    fn fail_conn(&mut self, e: c_int) {
        if self.connected() {
            self.phase = Phase::Error;
            self.err = e;
            self.readable = false;
            self.writable = false;
        }
    }

    // -- completions --

    /// Takes every completion there is.
    fn poll_cq(&mut self) {
        let Some(c) = self.conn.as_ref() else { return };
        let cq = c.cq;
        let mut reposts = 0u32;
        const BATCH: usize = 32;
        // SAFETY: an all-zero ibv_wc is valid.
        let mut wcs: [ibv_wc; BATCH] = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: the CQ is live while `conn` is.
            let n = unsafe { poll_cq_into(cq, &mut wcs) };
            if n == 0 {
                break;
            }
            for wc in &wcs[..n] {
                if wc.wr_id & RECV_FLAG != 0 {
                    if wc.status != 0 {
                        // A flushed receive: the QP is in error (the peer went away without a
                        // disconnect message, or the CM tore the connection down). Nothing more
                        // can arrive.
                        if self.connected() {
                            self.phase = Phase::Disconnected;
                            self.readable = false;
                            self.writable = false;
                        }
                        continue;
                    }
                    reposts += 1;
                    if wc.wc_flags & IBV_WC_WITH_IMM == 0 {
                        continue;
                    }
                    let m = u32::from_be(wc.imm_data);
                    match m >> 29 {
                        OP_SGL => self.sseq_comp = (m & 0x1fff_ffff) as u16,
                        OP_IOMAP_SGL => {}
                        OP_CTRL => {
                            // A failed connection stays failed (its error is what the
                            // program reads), whatever the peer says after.
                            let d = m & 0x1fff_ffff;
                            if !self.connected() {
                                continue;
                            }
                            if d == CTRL_DISCONNECT {
                                self.phase = Phase::Disconnected;
                                self.readable = false;
                                self.writable = false;
                            } else if d == CTRL_SHUTDOWN {
                                if self.writable {
                                    self.readable = false;
                                } else {
                                    self.phase = Phase::Disconnected;
                                    self.readable = false;
                                }
                            }
                        }
                        OP_DATA => {
                            // Data after the peer shut down its side, or after the connection
                            // failed or ended, is not for the reader: dropped.
                            if !self.readable {
                                continue;
                            }
                            // More messages than the credits this side granted: the peer broke
                            // the protocol; nothing it sends can be trusted to be in place.
                            // More bytes than the ring holds unread likewise.
                            let len = m & 0x1fff_ffff;
                            if self.rmsg.len() >= self.rq_size as usize
                                || self.unread + u64::from(len) > u64::from(self.rbuf_size)
                            {
                                self.fail_conn(libc::EPROTO);
                            } else {
                                self.rmsg.push_back(len);
                                self.unread += u64::from(len);
                            }
                        }
                        _ => {}
                    }
                } else {
                    let m = wc.wr_id as u32;
                    match m >> 29 {
                        OP_SGL | OP_CTRL => {
                            self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1);
                            if m >> 29 == OP_CTRL && m & 0x1fff_ffff == CTRL_DISCONNECT {
                                self.phase = if self.phase == Phase::Connected {
                                    Phase::Disconnected
                                } else {
                                    self.phase
                                };
                            }
                        }
                        OP_IOMAP_SGL => {
                            self.sqe_avail += 1;
                            self.sbuf_bytes_avail += IOMAP_LEN as u32;
                        }
                        _ => {
                            self.sqe_avail += 1;
                            self.sbuf_bytes_avail += m & 0x1fff_ffff;
                        }
                    }
                    if wc.status != 0 && self.connected() {
                        self.fail_conn(libc::EIO);
                    }
                }
            }
            if (n as usize) < BATCH {
                break;
            }
        }
        if self.connected() && reposts > 0 {
            if let Err(e) = self.post_recvs(reposts) {
                self.fail_conn(e);
            }
        }
    }

    /// Takes pending completion notifications off the channel (non-blocking).
    fn drain_cq_events(&mut self) {
        let Some(c) = self.conn.as_mut() else { return };
        // SAFETY: the connection's live channel and CQ.
        if unsafe { drain_channel(c.cc, c.cq, &mut c.unacked_events) } > 0 {
            self.cq_armed = false;
        }
    }

    /// Takes the connection's CM events (non-blocking). A DISCONNECTED (the peer's DREQ: it
    /// destroyed its id, or its process went away without a disconnect message) ends the
    /// connection: the DREQ is answered, which moves the QP to the error state, so sends
    /// still out are flushed instead of retried towards a peer that is gone, and a reader
    /// gets what arrived, then the end of the stream.
    fn poll_cm(&mut self) -> bool {
        if self.conn.is_none() || self.ch.is_null() {
            return false;
        }
        let mut ended = false;
        while let Ok(ev) = next_event(self.ch, None) {
            if ev.kind == EV_DISCONNECTED {
                ended = true;
                // SAFETY: the socket's id.
                unsafe { rdma_disconnect(self.id) };
                if self.connected() {
                    self.phase = Phase::Disconnected;
                }
                self.readable = false;
                self.writable = false;
            }
        }
        ended
    }

    /// After `progress`, when the caller is about to wait or give up: a look at the CM
    /// channel (not on every progress: a system call per chunk of a busy stream). True when
    /// the peer's disconnect ended the connection; its flushed sends are taken then.
    /// Completions come first, so what the peer sent before its disconnect is taken in
    /// before the disconnect ends the stream.
    fn check_cm(&mut self) -> bool {
        if self.poll_cm() {
            self.poll_cq();
            true
        } else {
            false
        }
    }

    /// The connection's CM channel (for waiting on its events).
    fn cm_fd(&self) -> Option<c_int> {
        // SAFETY: the socket's channel while it has one.
        (!self.ch.is_null()).then(|| unsafe { (*self.ch).fd })
    }

    fn arm(&mut self) {
        if let Some(c) = self.conn.as_ref() {
            // SAFETY: the connection's live CQ.
            unsafe { arm_cq(c.cq) };
            self.cq_armed = true;
        }
    }

    fn comp_fd(&self) -> Option<c_int> {
        // SAFETY: the live channel.
        self.conn.as_ref().map(|c| unsafe { (*c.cc).fd })
    }

    /// One round of progress: credits out, completions in.
    fn progress(&mut self) {
        self.update_credits();
        self.poll_cq();
        self.update_credits();
        self.keepalive();
    }

    /// With `SO_KEEPALIVE`, a connection sends a keepalive (a control message, an RDMA WRITE
    /// with immediate and no data, as rdma-core's service thread sends it) every
    /// `TCP_KEEPIDLE`. A peer that died without disconnecting (a process killed, whose CM
    /// cannot say so) never acknowledges it: the QP runs out of retries, the send completes
    /// in error and the connection fails, so a program blocked reading from it gets an error
    /// instead of waiting for ever. Sent from every call that makes progress, including the
    /// waits of blocked calls, which look at least every 50 ms; no service thread.
    fn keepalive(&mut self) {
        if self.so_opts >> libc::SO_KEEPALIVE & 1 == 0 || !self.connected() {
            self.next_keepalive = None;
            return;
        }
        let now = Instant::now();
        let due = *self.next_keepalive.get_or_insert(now + self.keepalive_time);
        if now < due {
            return;
        }
        self.next_keepalive = Some(now + self.keepalive_time);
        if self.ctrl_avail() {
            self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
            if let Err(e) = self.write_imm(&mut [], msg(OP_CTRL, CTRL_KEEPALIVE), 0, 0, 0) {
                self.fail_conn(e);
            }
        }
    }

    // -- tests --

    fn can_send(&self) -> bool {
        self.conn.is_some()
            && self.sqe_avail > 0
            && self.sbuf_bytes_avail >= SNDLOWAT
            && self.sseq_no != self.sseq_comp
            && self.tsgl_get(self.target_sge).2 != 0
    }
    fn conn_can_send(&self) -> bool {
        !self.writable || self.can_send()
    }
    fn conn_have_rdata(&self) -> bool {
        !self.rmsg.is_empty() || !self.readable
    }
    fn all_sends_done(&self) -> bool {
        !self.connected()
            || (self.ctrl_max_seqno.wrapping_sub(self.ctrl_seqno)).wrapping_add(self.sqe_avail)
                == self.sq_size
    }
}

/// Waits (the socket's lock released) until `test` holds or, non-blocking, fails with
/// EAGAIN. Returns the lock.
fn wait<'a>(
    rs: &'a Rs,
    mut g: MutexGuard<'a, St>,
    nonblock: bool,
    test: fn(&St) -> bool,
) -> (MutexGuard<'a, St>, Result<(), c_int>) {
    let spin_until = Instant::now() + Duration::from_micros(10);
    loop {
        g.progress();
        if test(&g) {
            return (g, Ok(()));
        }
        if Instant::now() < spin_until && !nonblock {
            continue;
        }
        if g.check_cm() {
            continue;
        }
        if nonblock {
            return (g, Err(libc::EAGAIN));
        }
        if !g.cq_armed {
            g.arm();
            continue;
        }
        let Some(fd) = g.comp_fd() else {
            return (g, Err(libc::ENOTCONN));
        };
        let mut p = [fd, g.cm_fd().unwrap_or(-1)].map(|fd| pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        drop(g);
        // SAFETY: two pollfds on the stack (a negative descriptor is skipped). A short
        // timeout: another thread may take the notification first.
        unsafe { libc::poll(p.as_mut_ptr(), 2, 50) };
        g = lock(&rs.st);
        g.drain_cq_events();
    }
}

// ---- connection management --------------------------------------------------------------------

/// The next event of `ch`, waiting up to `deadline`; copies what callers need and acks it.
struct Ev {
    kind: c_int,
    status: c_int,
    id: *mut rdma_cm_id,
    conn: rdma_conn_param,
    pdata: Vec<u8>,
}

fn next_event(ch: *mut rdma_event_channel, deadline: Option<Instant>) -> Result<Ev, c_int> {
    loop {
        // SAFETY: a channel of this library, kept non-blocking by this module.
        let fd = unsafe { (*ch).fd };
        let mut e = null_mut();
        // SAFETY: as above; out parameter a local.
        if unsafe { rdma_get_cm_event(ch, &mut e) } == 0 {
            // SAFETY: the event just delivered; read before it is acknowledged.
            let ev = unsafe {
                let c = (*e).param.conn;
                let pdata = if c.private_data.is_null() {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(
                        c.private_data as *const u8,
                        c.private_data_len as usize,
                    )
                    .to_vec()
                };
                Ev {
                    kind: (*e).event,
                    status: (*e).status,
                    id: (*e).id,
                    conn: c,
                    pdata,
                }
            };
            // SAFETY: the event above, not used after this.
            unsafe { rdma_ack_cm_event(e) };
            return Ok(ev);
        }
        let err = errno_or(libc::EIO);
        if err != libc::EAGAIN {
            return Err(err);
        }
        let left = match deadline {
            None => return Err(libc::EAGAIN),
            Some(d) => d.saturating_duration_since(Instant::now()),
        };
        if left.is_zero() {
            return Err(libc::ETIMEDOUT);
        }
        let mut p = pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on the stack.
        unsafe { libc::poll(&mut p, 1, left.as_millis().min(100) as c_int) };
    }
}

fn wait_event(ch: *mut rdma_event_channel, want: c_int) -> Result<Ev, c_int> {
    let deadline = Instant::now() + CM_TIMEOUT;
    loop {
        let e = next_event(ch, Some(deadline))?;
        if e.kind == want {
            return Ok(e);
        }
        if let Some(err) = event_error(&e) {
            return Err(err);
        }
    }
}

/// What an event other than the one waited for means: `None` to pass over it (a stale
/// disconnect), else the error the wait ends with.
fn event_error(e: &Ev) -> Option<c_int> {
    Some(match e.kind {
        EV_DISCONNECTED => return None,
        EV_REJECTED => libc::ECONNREFUSED,
        EV_UNREACHABLE => libc::ENETUNREACH,
        1 | 3 => libc::EHOSTUNREACH,
        _ if e.status < 0 => -e.status,
        _ => libc::ECONNABORTED,
    })
}

fn new_channel() -> Result<*mut rdma_event_channel, c_int> {
    let ch = rdma_create_event_channel();
    if ch.is_null() {
        return Err(errno_or(libc::ENODEV));
    }
    // SAFETY: the channel's descriptor; non-blocking so that waits are bounded here.
    unsafe {
        let fl = libc::fcntl((*ch).fd, libc::F_GETFL);
        libc::fcntl((*ch).fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
    Ok(ch)
}

/// Creates the QP, CQ and buffers of a socket whose id has its device (route resolved or a
/// request received), and posts the receives.
fn create_ep(st: &mut St) -> Result<(), c_int> {
    st.sq_size = st.sq_size.clamp(QP_MIN, QP_MAX);
    st.rq_size = st.rq_size.clamp(QP_MIN, QP_MAX);
    st.sbuf_size = st.sbuf_size.max(SNDLOWAT * 2);
    st.rbuf_size = st.rbuf_size.max(SNDLOWAT * 2) & !1;
    // SAFETY: the id's device context (set once the address is resolved).
    let ctx = unsafe { (*st.id).verbs };
    if ctx.is_null() {
        return Err(libc::ENODEV);
    }
    // SAFETY: this library's verbs on its own context; every object made here is owned by
    // the `Conn` below (or released on the error paths).
    unsafe {
        let pd = ibv_alloc_pd(ctx);
        if pd.is_null() {
            return Err(errno_or(libc::ENOMEM));
        }
        let cc = ibv_create_comp_channel(ctx);
        if cc.is_null() {
            ibv_dealloc_pd(pd);
            return Err(errno_or(libc::ENOMEM));
        }
        let fl = libc::fcntl((*cc).fd, libc::F_GETFL);
        libc::fcntl((*cc).fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        let cq = ibv_create_cq(ctx, (st.sq_size + st.rq_size) as c_int, null_mut(), cc, 0);
        if cq.is_null() {
            ibv_destroy_comp_channel(cc);
            ibv_dealloc_pd(pd);
            return Err(errno_or(libc::ENOMEM));
        }
        let undo = |e: c_int| {
            ibv_destroy_cq(cq);
            ibv_destroy_comp_channel(cc);
            ibv_dealloc_pd(pd);
            e
        };
        let bufs = (|| {
            Ok::<_, c_int>((
                Buf::alloc(pd, st.sbuf_size as usize, 1)?,
                Buf::alloc(pd, st.rbuf_size as usize, ACCESS_WRITE)?,
                Buf::alloc(
                    pd,
                    SGE_LEN * SGL_SIZE as usize + IOMAP_LEN * st.target_iomap_size as usize,
                    ACCESS_WRITE,
                )?,
            ))
        })();
        let (sbuf, rbuf, tsgl) = match bufs {
            Ok(b) => b,
            Err(e) => return Err(undo(e)),
        };
        let mut a = ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: st.sq_size,
                max_recv_wr: st.rq_size,
                max_send_sge: 2,
                max_recv_sge: 1,
                max_inline_data: st.sq_inline.max(SGE_LEN as u32),
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 1,
        };
        if rdma_create_qp(st.id, pd, &mut a) != 0 {
            let e = errno_or(libc::ENOMEM);
            drop((sbuf, rbuf, tsgl));
            return Err(undo(e));
        }
        st.sq_inline = a.cap.max_inline_data;
        st.conn = Some(Conn {
            qp: (*st.id).qp,
            cq,
            cc,
            pd,
            sbuf,
            rbuf,
            tsgl,
            unacked_events: 0,
            iomaps: Vec::new(),
        });
    }
    st.rbuf_free_offset = st.rbuf_size >> 1;
    st.rbuf_bytes_avail = st.rbuf_size >> 1;
    st.sbuf_bytes_avail = st.sbuf_size;
    st.sbuf_pos = 0;
    st.sqe_avail = st.sq_size - st.ctrl_max_seqno;
    st.rseq_comp = (st.rq_size >> 1) as u16;
    st.post_recvs(st.rq_size)?;
    st.arm();
    Ok(())
}

/// `struct rs_conn_data`: what each side says about itself in the REQ or the REP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ConnData {
    flags: u8,
    /// Its receive-queue depth.
    credits: u16,
    /// Its iomap area's size, rdma-core's scaled byte.
    iomap_scale: u8,
    /// Its target SGL: address, key, entries.
    target_sgl: (u64, u32, u32),
    /// Its first receive buffer: address, key, length.
    data_buf: (u64, u32, u32),
}

impl ConnData {
    /// Version 1, at least 40 bytes, a target SGL of at least one entry; `None` otherwise
    /// (the peer is not an rsocket this side can talk to).
    fn parse(d: &[u8]) -> Option<ConnData> {
        let d: &[u8; CONN_DATA_LEN] = d.get(..CONN_DATA_LEN)?.try_into().ok()?;
        if d[0] != 1 {
            return None;
        }
        let be64 = |o: usize| {
            u64::from_be_bytes([
                d[o],
                d[o + 1],
                d[o + 2],
                d[o + 3],
                d[o + 4],
                d[o + 5],
                d[o + 6],
                d[o + 7],
            ])
        };
        let be32 = |o: usize| u32::from_be_bytes([d[o], d[o + 1], d[o + 2], d[o + 3]]);
        let c = ConnData {
            flags: d[1],
            credits: u16::from_be_bytes([d[2], d[3]]),
            iomap_scale: d[7],
            target_sgl: (be64(8), be32(16), be32(20)),
            data_buf: (be64(24), be32(32), be32(36)),
        };
        (c.target_sgl.2 > 0).then_some(c)
    }

    fn emit(&self) -> [u8; CONN_DATA_LEN] {
        let mut d = [0u8; CONN_DATA_LEN];
        d[0] = 1;
        d[1] = self.flags;
        d[2..4].copy_from_slice(&self.credits.to_be_bytes());
        // d[4..7] reserved.
        d[7] = self.iomap_scale;
        d[8..16].copy_from_slice(&self.target_sgl.0.to_be_bytes());
        d[16..20].copy_from_slice(&self.target_sgl.1.to_be_bytes());
        d[20..24].copy_from_slice(&self.target_sgl.2.to_be_bytes());
        d[24..32].copy_from_slice(&self.data_buf.0.to_be_bytes());
        d[32..36].copy_from_slice(&self.data_buf.1.to_be_bytes());
        d[36..40].copy_from_slice(&self.data_buf.2.to_be_bytes());
        d
    }
}

fn conn_data(st: &St) -> [u8; CONN_DATA_LEN] {
    let c = st.conn.as_ref().expect("endpoint made");
    ConnData {
        flags: CONN_FLAG_IOMAP
            | if cfg!(target_endian = "big") {
                CONN_FLAG_NET
            } else {
                0
            },
        credits: st.rq_size as u16,
        iomap_scale: value_to_scale(st.target_iomap_size),
        target_sgl: (c.tsgl.ptr as u64, c.tsgl.rkey(), SGL_SIZE),
        data_buf: (c.rbuf.ptr as u64, c.rbuf.rkey(), st.rbuf_size >> 1),
    }
    .emit()
}

/// Takes the peer's connection data (REQ or REP). `None`: not rsocket version 1.
fn save_conn_data(st: &mut St, d: &[u8]) -> Option<()> {
    let c = ConnData::parse(d)?;
    let n = c.target_sgl.2;
    st.remote_sgl = c.target_sgl;
    st.remote_sge = 1 % n;
    let peer_net = c.flags & CONN_FLAG_NET != 0;
    st.swap_sgl = peer_net != cfg!(target_endian = "big");
    st.remote_iomap = if c.flags & CONN_FLAG_IOMAP != 0 {
        (
            st.remote_sgl.0.wrapping_add(SGE_LEN as u64 * u64::from(n)),
            st.remote_sgl.1,
            scale_to_value(c.iomap_scale),
        )
    } else {
        (0, 0, 0)
    };
    st.tsgl_set(0, c.data_buf);
    st.sseq_comp = c.credits;
    Some(())
}

fn set_connected(st: &mut St) {
    st.phase = Phase::Connected;
    st.readable = true;
    st.writable = true;
}

/// Tears down the verbs objects and the id (the socket is gone or failed).
fn free_conn(st: &mut St) {
    if st.phase == Phase::Connected {
        st.phase = Phase::Disconnected;
        st.readable = false;
        st.writable = false;
    }
    if let Some(c) = st.conn.take() {
        // SAFETY: the id's QP (made by rdma_create_qp) and the objects of `create_ep`, freed
        // in dependency order; the buffers' MRs go with `c` after the QP.
        unsafe {
            if c.unacked_events > 0 {
                ibv_ack_cq_events(c.cq, c.unacked_events);
            }
            rdma_destroy_qp(st.id);
            for m in &c.iomaps {
                ibv_dereg_mr(m.mr);
            }
            let Conn {
                cq,
                cc,
                pd,
                sbuf,
                rbuf,
                tsgl,
                ..
            } = c;
            drop((sbuf, rbuf, tsgl));
            ibv_destroy_cq(cq);
            ibv_destroy_comp_channel(cc);
            ibv_dealloc_pd(pd);
        }
    }
}

/// Starts a connection to `dst`: address resolution asked for, the socket `Connecting`
/// ([`advance_connect`] takes it on).
fn start_connect(st: &mut St, dst: *const sockaddr) -> Result<(), c_int> {
    // SAFETY: the socket's id and the caller's address.
    unsafe {
        if rdma_resolve_addr(st.id, null_mut(), dst as *mut sockaddr, 2000) != 0 {
            return Err(errno_or(libc::EHOSTUNREACH));
        }
    }
    st.phase = Phase::Connecting(Step::Addr);
    st.connect_deadline = Some(Instant::now() + CM_TIMEOUT);
    Ok(())
}

/// Takes a connection being made as far as its CM events go: waiting for each (`block`, until
/// the connection's deadline) or only taking those already there. `Ok(true)` once connected,
/// `Ok(false)` while an event is still to come (only when not blocking); an error ends the
/// attempt, recorded in the socket ([`connect_failed`]).
fn advance_connect(st: &mut St, block: bool) -> Result<bool, c_int> {
    let r = connect_steps(st, block);
    if let Err(e) = r {
        connect_failed(st, e);
    }
    r
}

/// [`advance_connect`] without recording a failure.
fn connect_steps(st: &mut St, block: bool) -> Result<bool, c_int> {
    loop {
        let step = match st.phase {
            Phase::Connecting(step) => step,
            Phase::Connected => return Ok(true),
            _ => return Err(libc::ENOTCONN),
        };
        let limit = st.connect_deadline.unwrap_or_else(far);
        let ev = match next_event(st.ch, block.then_some(limit)) {
            Ok(ev) => ev,
            Err(libc::EAGAIN) if !block => {
                return if Instant::now() >= limit {
                    Err(libc::ETIMEDOUT)
                } else {
                    Ok(false)
                };
            }
            Err(e) => return Err(e),
        };
        let want = match step {
            Step::Addr => EV_ADDR_RESOLVED,
            Step::Route => EV_ROUTE_RESOLVED,
            Step::Established | Step::Accepted => EV_ESTABLISHED,
        };
        if ev.kind != want {
            match event_error(&ev) {
                None => continue,
                Some(e) => return Err(e),
            }
        }
        match step {
            Step::Addr => {
                // SAFETY: the socket's id.
                if unsafe { rdma_resolve_route(st.id, 2000) } != 0 {
                    return Err(errno_or(libc::EHOSTUNREACH));
                }
                st.phase = Phase::Connecting(Step::Route);
            }
            Step::Route => {
                create_ep(st)?;
                let d = conn_data(st);
                let mut p = rdma_conn_param {
                    private_data: d.as_ptr() as *const c_void,
                    private_data_len: CONN_DATA_LEN as u8,
                    responder_resources: 0,
                    initiator_depth: 0,
                    flow_control: 1,
                    retry_count: 7,
                    rnr_retry_count: 7,
                    srq: 0,
                    qp_num: 0,
                };
                // SAFETY: the id and a parameter block on the stack (the library copies
                // private data).
                if unsafe { rdma_connect(st.id, &mut p) } != 0 {
                    return Err(errno_or(libc::ECONNREFUSED));
                }
                st.phase = Phase::Connecting(Step::Established);
            }
            Step::Established | Step::Accepted => {
                if step == Step::Established {
                    save_conn_data(st, &ev.pdata).ok_or(libc::EOPNOTSUPP)?;
                }
                set_connected(st);
                st.connect_deadline = None;
                return Ok(true);
            }
        }
    }
}

/// A connection attempt that failed with `e`: its verbs objects freed, the socket in error
/// with `e` for `SO_ERROR`.
fn connect_failed(st: &mut St, e: c_int) {
    free_conn(st);
    st.phase = Phase::Error;
    st.err = e;
    st.connect_deadline = None;
}

/// For a data call on a socket whose connection is being made: goes on with it (waiting unless
/// `nonblock`); `EAGAIN` while it is not made yet, the attempt's error when it failed.
fn finish_connecting(st: &mut St, nonblock: bool) -> Result<(), c_int> {
    if !matches!(st.phase, Phase::Connecting(_)) {
        return Ok(());
    }
    match advance_connect(st, !nonblock)? {
        true => Ok(()),
        false => Err(libc::EAGAIN),
    }
}

/// Accepts one request taken off the listener's channel: a new socket.
fn accept_one(parent: &St, ev: Ev) -> Result<Arc<Rs>, c_int> {
    let id = ev.id;
    let reject = |e: c_int| {
        // SAFETY: the request's id, not handed out.
        unsafe {
            rdma_reject(id, std::ptr::null(), 0);
            rdma_destroy_id(id);
        }
        e
    };
    if ConnData::parse(&ev.pdata).is_none() {
        return Err(reject(libc::ECONNABORTED));
    }
    let ch = new_channel().map_err(reject)?;
    // SAFETY: the new id and the new channel: its later events come there.
    if unsafe { rdma_migrate_id(id, ch) } != 0 {
        let e = errno_or(libc::ENOMEM);
        // SAFETY: the channel made above.
        unsafe { rdma_destroy_event_channel(ch) };
        return Err(reject(e));
    }
    let mut st = St::new(ch, id, parent.nonblock);
    st.sq_size = parent.sq_size;
    st.rq_size = parent.rq_size;
    st.sq_inline = parent.sq_inline;
    st.sbuf_size = parent.sbuf_size;
    st.rbuf_size = parent.rbuf_size;
    st.fd_flags = parent.fd_flags;
    st.target_iomap_size = parent.target_iomap_size;
    st.keepalive_time = parent.keepalive_time;
    let undo = |st: &mut St, e: c_int| {
        free_conn(st);
        // SAFETY: the id and its channel, not handed out.
        unsafe {
            rdma_reject(st.id, std::ptr::null(), 0);
            rdma_destroy_id(st.id);
            rdma_destroy_event_channel(st.ch);
        }
        e
    };
    if let Err(e) = create_ep(&mut st) {
        return Err(undo(&mut st, e));
    }
    if save_conn_data(&mut st, &ev.pdata).is_none() {
        return Err(undo(&mut st, libc::ECONNABORTED));
    }
    let d = conn_data(&st);
    let mut p = ev.conn;
    p.private_data = d.as_ptr() as *const c_void;
    p.private_data_len = CONN_DATA_LEN as u8;
    // SAFETY: the id and a parameter block on the stack.
    if unsafe { rdma_accept(st.id, &mut p) } != 0 {
        let e = errno_or(libc::ECONNABORTED);
        return Err(undo(&mut st, e));
    }
    // A blocking listener's socket is handed out connected. A non-blocking one's at once, its
    // RTU taken from its later calls as a connecting socket's ESTABLISHED is: a peer that
    // never sends one does not hold up the program's accept loop (for CM_TIMEOUT).
    st.phase = Phase::Connecting(Step::Accepted);
    st.connect_deadline = Some(Instant::now() + CM_TIMEOUT);
    if let Err(e) = advance_connect(&mut st, !parent.nonblock) {
        // SAFETY: as above (the connection failed and its verbs objects are freed; no reject
        // after an accept).
        unsafe {
            rdma_destroy_id(st.id);
            rdma_destroy_event_channel(st.ch);
        }
        return Err(e);
    }
    insert(st)
}

fn insert(st: St) -> Result<Arc<Rs>, c_int> {
    // SAFETY: eventfd(2): the socket's number, closed by rclose.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(errno_or(libc::EMFILE));
    }
    let rs = Arc::new(Rs {
        fd,
        st: Mutex::new(st),
    });
    TABLE
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(fd, rs.clone());
    Ok(rs)
}

// ---- the calls ----------------------------------------------------------------------------------

/// librdmacm's `rsocket`.
#[export_name = "ferroce_rsocket"]
pub extern "C" fn rsocket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    let st_ty = ty & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return fail(libc::EAFNOSUPPORT);
    }
    if st_ty == libc::SOCK_DGRAM && (protocol == 0 || protocol == libc::IPPROTO_UDP) {
        return dgram::create(domain, ty);
    }
    if st_ty != libc::SOCK_STREAM || (protocol != 0 && protocol != libc::IPPROTO_TCP) {
        return fail(libc::EOPNOTSUPP);
    }
    let ch = match new_channel() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let mut id = null_mut();
    // SAFETY: this library's call with a live channel; out parameter a local.
    if unsafe { rdma_create_id(ch, &mut id, null_mut(), RDMA_PS_TCP) } != 0 {
        let e = errno_or(libc::ENODEV);
        // SAFETY: the channel made above.
        unsafe { rdma_destroy_event_channel(ch) };
        return fail(e);
    }
    let mut st = St::new(ch, id, ty & libc::SOCK_NONBLOCK != 0);
    if ty & libc::SOCK_CLOEXEC != 0 {
        st.fd_flags = libc::FD_CLOEXEC;
    }
    match insert(st) {
        Ok(rs) => rs.fd,
        Err(e) => {
            // SAFETY: the id and channel made above.
            unsafe {
                rdma_destroy_id(id);
                rdma_destroy_event_channel(ch);
            }
            fail(e)
        }
    }
}

/// librdmacm's `rbind`.
#[export_name = "ferroce_rbind"]
pub unsafe extern "C" fn rbind(s: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    if let Some(d) = dgram::lookup(s) {
        return dgram::bind(&d, addr, len);
    }
    let Some(rs) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let mut g = lock(&rs.st);
    if g.phase != Phase::Init {
        return fail(libc::EINVAL);
    }
    // SAFETY: the socket's id; the caller's address.
    if unsafe { rdma_bind_addr(g.id, addr as *mut sockaddr) } != 0 {
        return -1;
    }
    g.phase = Phase::Bound;
    0
}

/// librdmacm's `rlisten`.
#[export_name = "ferroce_rlisten"]
pub extern "C" fn rlisten(s: c_int, backlog: c_int) -> c_int {
    if dgram::lookup(s).is_some() {
        return fail(libc::EOPNOTSUPP);
    }
    let Some(rs) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let mut g = lock(&rs.st);
    match g.phase {
        Phase::Listening => return 0,
        Phase::Init | Phase::Bound => {}
        _ => return fail(libc::EINVAL),
    }
    // SAFETY: the socket's id.
    if unsafe { rdma_listen(g.id, backlog) } != 0 {
        return -1;
    }
    g.phase = Phase::Listening;
    0
}

/// librdmacm's `raccept`: takes the next connection request, accepts it and returns the
/// new socket (blocking unless the listener is non-blocking: then EAGAIN when none waits).
#[export_name = "ferroce_raccept"]
pub unsafe extern "C" fn raccept(s: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if dgram::lookup(s).is_some() {
        return fail(libc::EOPNOTSUPP);
    }
    let Some(rs) = lookup(s) else {
        return fail(libc::EBADF);
    };
    loop {
        let (ch, nonblock) = {
            let g = lock(&rs.st);
            if g.phase != Phase::Listening {
                return fail(libc::EINVAL);
            }
            (g.ch, g.nonblock)
        };
        let ev = match next_event(ch, if nonblock { None } else { Some(far()) }) {
            Ok(e) => e,
            Err(libc::ETIMEDOUT) => continue,
            Err(e) => return fail(e),
        };
        if ev.kind != EV_CONNECT_REQUEST {
            continue;
        }
        let new = {
            let g = lock(&rs.st);
            accept_one(&g, ev)
        };
        match new {
            Ok(n) => {
                if !addr.is_null() && !len.is_null() {
                    // SAFETY: the caller's out parameters.
                    unsafe { rgetpeername(n.fd, addr, len) };
                }
                return n.fd;
            }
            // A request that could not be accepted was rejected: wait for the next one.
            Err(_) if !nonblock => continue,
            Err(e) => return fail(e),
        }
    }
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

/// librdmacm's `rconnect`. On a non-blocking socket it returns `EINPROGRESS` until the
/// connection is made (as rdma-core's: again from a later `rconnect` while it is being made);
/// `rpoll` reports `POLLOUT` once it is, and `SO_ERROR` the error if it failed.
#[export_name = "ferroce_rconnect"]
pub unsafe extern "C" fn rconnect(s: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    if let Some(d) = dgram::lookup(s) {
        if addr.is_null() {
            return fail(libc::EFAULT);
        }
        return dgram::connect(&d, addr, len);
    }
    let Some(rs) = lookup(s) else {
        return fail(libc::EBADF);
    };
    if addr.is_null() {
        return fail(libc::EFAULT);
    }
    let mut g = lock(&rs.st);
    let phase = g.phase;
    match phase {
        Phase::Init | Phase::Bound => {
            if let Err(e) = start_connect(&mut g, addr) {
                connect_failed(&mut g, e);
                return fail(e);
            }
        }
        Phase::Connecting(_) => {}
        Phase::Connected if std::mem::take(&mut g.connect_unreported) => return 0,
        Phase::Connected => return fail(libc::EISCONN),
        // A connection that failed after `EINPROGRESS`: its error, once (as TCP's).
        Phase::Error if g.conn.is_none() && g.err != 0 && g.connect_unreported => {
            g.connect_unreported = false;
            return fail(std::mem::take(&mut g.err));
        }
        _ => return fail(libc::EINVAL),
    }
    let block = !g.nonblock;
    match advance_connect(&mut g, block) {
        Ok(true) => {
            g.connect_unreported = false;
            0
        }
        Ok(false) => {
            g.connect_unreported = true;
            fail(libc::EINPROGRESS)
        }
        Err(e) => {
            g.connect_unreported = false;
            fail(e)
        }
    }
}

/// Copies from the receive ring into `out`, consuming (or, `peek`, not).
fn copy_out(st: &mut St, out: &mut [u8], peek: bool) -> usize {
    // Closed by another thread while this one waited: nothing to read.
    let Some(c) = st.conn.as_ref() else {
        return 0;
    };
    let base = c.rbuf.ptr;
    let size = st.rbuf_size as usize;
    let mut off = st.rbuf_offset as usize;
    let mut done = 0;
    let mut i = 0;
    let mut consumed_msgs = 0u16;
    let mut part_left: Option<u32> = None;
    while done < out.len() && i < st.rmsg.len() {
        let avail = st.rmsg[i] as usize;
        let n = avail.min(out.len() - done);
        let mut left = n;
        while left > 0 {
            let chunk = left.min(size - off);
            // SAFETY: `off + chunk <= size` within the registered ring; the peer's write
            // of these bytes completed before its message's completion was polled.
            unsafe {
                std::ptr::copy_nonoverlapping(base.add(off), out[done..].as_mut_ptr(), chunk)
            };
            done += chunk;
            left -= chunk;
            off = (off + chunk) % size;
        }
        if n == avail {
            consumed_msgs += 1;
            i += 1;
        } else {
            part_left = Some((avail - n) as u32);
            break;
        }
    }
    if !peek {
        for _ in 0..consumed_msgs {
            st.rmsg.pop_front();
        }
        if let Some(l) = part_left {
            st.rmsg[0] = l;
        }
        st.rseq_no = st.rseq_no.wrapping_add(consumed_msgs);
        st.rbuf_offset = off as u32;
        st.rbuf_bytes_avail += done as u32;
        st.unread -= done as u64;
    }
    done
}

fn recv_impl(s: c_int, out: &mut [u8], flags: c_int) -> isize {
    if let Some(d) = dgram::lookup(s) {
        return match dgram::recv_from(&d, out, flags) {
            Ok((n, _)) => n as isize,
            Err(e) => fail(e),
        };
    }
    let Some(rs) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let mut g = lock(&rs.st);
    let nonblock = g.nonblock || flags & libc::MSG_DONTWAIT != 0;
    if let Err(e) = finish_connecting(&mut g, nonblock) {
        return fail(e);
    }
    if g.conn.is_none() {
        return fail(libc::ENOTCONN);
    }
    if out.is_empty() {
        return 0;
    }
    let mut done = 0usize;
    loop {
        if g.rmsg.is_empty() {
            let (g2, r) = wait(&rs, g, nonblock, St::conn_have_rdata);
            g = g2;
            if let Err(e) = r {
                return if done > 0 { done as isize } else { fail(e) };
            }
        }
        if g.rmsg.is_empty() && g.phase == Phase::Error && done == 0 {
            // A failed connection (a protocol violation, a transport error): an error, as
            // a reset TCP connection gives, not the end of the stream.
            let e = if g.err != 0 { g.err } else { libc::ECONNRESET };
            return fail(e);
        }
        let n = copy_out(&mut g, &mut out[done..], flags & libc::MSG_PEEK != 0);
        done += n;
        if flags & libc::MSG_PEEK != 0 {
            break;
        }
        g.update_credits();
        if done == out.len() || flags & libc::MSG_WAITALL == 0 || !g.readable {
            break;
        }
    }
    done as isize
}

/// Waits (unless `nonblock`) until a message may be posted: a send queue entry, a credit and
/// send-buffer space. The error is the wait's, or the connection's failure (`ECONNRESET` when it
/// recorded none) once it can no longer send.
fn wait_can_send<'a>(
    rs: &'a Rs,
    g: MutexGuard<'a, St>,
    nonblock: bool,
) -> (MutexGuard<'a, St>, Result<(), c_int>) {
    if g.can_send() {
        return (g, Ok(()));
    }
    let (g, r) = wait(rs, g, nonblock, St::conn_can_send);
    if let Err(e) = r {
        return (g, Err(e));
    }
    if !g.writable {
        let e = if g.err != 0 { g.err } else { libc::ECONNRESET };
        return (g, Err(e));
    }
    (g, Ok(()))
}

/// rdma-core's send sizes: a transfer starts with `OLAP_START` bytes and doubles each chunk up
/// to `MAX_TRANSFER`, so a small write goes out at once and a large one in big pieces.
struct Ramp(usize);

impl Ramp {
    fn new() -> Ramp {
        Ramp(OLAP_START)
    }

    /// The next chunk of the `left` bytes still to go (before the space limits).
    fn next(&mut self, left: usize) -> usize {
        if self.0 >= left {
            return left;
        }
        let n = self.0;
        if self.0 < MAX_TRANSFER {
            self.0 <<= 1;
        }
        n
    }
}

/// Announces every region mapped with `riomap` (PROT_WRITE) that the peer does not know yet:
/// one `struct rs_iomap` written into its iomap area with an IOMAP_SGL message (which takes a
/// credit, as in rdma-core).
fn send_iomaps<'a>(
    rs: &'a Rs,
    mut g: MutexGuard<'a, St>,
    nonblock: bool,
) -> (MutexGuard<'a, St>, Result<(), c_int>) {
    loop {
        let Some(k) = g
            .conn
            .as_ref()
            .and_then(|c| c.iomaps.iter().position(|m| !m.sent && m.index.is_some()))
        else {
            return (g, Ok(()));
        };
        let (g2, r) = wait_can_send(rs, g, nonblock);
        g = g2;
        if let Err(e) = r {
            return (g, Err(e));
        }
        let Some(c) = g.conn.as_ref() else {
            return (g, Err(libc::ENOTCONN));
        };
        let Some(m) = c.iomaps.get(k) else {
            continue;
        };
        let index = m.index.expect("announced maps have a slot");
        // SAFETY: a live MR of this socket.
        let (addr, key, len) =
            unsafe { ((*m.mr).addr as u64, (*m.mr).rkey, (*m.mr).length as u32) };
        let v = if g.swap_sgl {
            (
                m.offset.swap_bytes(),
                addr.swap_bytes(),
                key.swap_bytes(),
                len.swap_bytes(),
            )
        } else {
            (m.offset, addr, key, len)
        };
        let mut b = [0u8; IOMAP_LEN];
        b[..8].copy_from_slice(&v.0.to_ne_bytes());
        b[8..16].copy_from_slice(&v.1.to_ne_bytes());
        b[16..20].copy_from_slice(&v.2.to_ne_bytes());
        b[20..].copy_from_slice(&v.3.to_ne_bytes());
        let dst = g
            .remote_iomap
            .0
            .wrapping_add(u64::from(index) * IOMAP_LEN as u64);
        let rkey = g.remote_iomap.1;
        g.sseq_no = g.sseq_no.wrapping_add(1);
        g.sqe_avail -= 1;
        g.sbuf_bytes_avail -= IOMAP_LEN as u32;
        let r = g.post_chunk(
            &b,
            IBV_WR_RDMA_WRITE_WITH_IMM,
            msg(OP_IOMAP_SGL, index),
            dst,
            rkey,
        );
        if let Some(m) = g.conn.as_mut().and_then(|c| c.iomaps.get_mut(k)) {
            m.sent = true;
        }
        if let Err(e) = r {
            g.fail_conn(e);
            return (g, Err(e));
        }
    }
}

fn send_impl(s: c_int, data: &[u8], flags: c_int) -> isize {
    if let Some(d) = dgram::lookup(s) {
        return dgram::send_to(&d, data, flags, None);
    }
    let Some(rs) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let mut g = lock(&rs.st);
    let nonblock = g.nonblock || flags & libc::MSG_DONTWAIT != 0;
    if let Err(e) = finish_connecting(&mut g, nonblock) {
        return fail(e);
    }
    if g.conn.is_none() {
        return fail(libc::ENOTCONN);
    }
    let (g2, r) = send_iomaps(&rs, g, nonblock);
    g = g2;
    if let Err(e) = r {
        return fail(e);
    }
    let mut sent = 0usize;
    let mut ramp = Ramp::new();
    while sent < data.len() {
        let (g2, r) = wait_can_send(&rs, g, nonblock);
        g = g2;
        if let Err(e) = r {
            return if sent > 0 { sent as isize } else { fail(e) };
        }
        let mut n = ramp.next(data.len() - sent);
        let t = g.tsgl_get(g.target_sge);
        n = n.min(g.sbuf_bytes_avail as usize).min(t.2 as usize);
        let chunk = &data[sent..sent + n];
        // Take the target space first (the peer may rewrite the next entry once this one
        // is used up).
        g.sseq_no = g.sseq_no.wrapping_add(1);
        g.sqe_avail -= 1;
        g.sbuf_bytes_avail -= n as u32;
        let ts = g.target_sge;
        g.tsgl_set(ts, (t.0.wrapping_add(n as u64), t.1, t.2 - n as u32));
        if t.2 as usize == n {
            g.target_sge = (g.target_sge + 1) % SGL_SIZE as usize;
        }
        let r = g.post_chunk(
            chunk,
            IBV_WR_RDMA_WRITE_WITH_IMM,
            msg(OP_DATA, n as u32),
            t.0,
            t.1,
        );
        if let Err(e) = r {
            g.fail_conn(e);
            return if sent > 0 { sent as isize } else { fail(e) };
        }
        sent += n;
    }
    sent as isize
}

/// librdmacm's `rrecv`.
#[export_name = "ferroce_rrecv"]
pub unsafe extern "C" fn rrecv(s: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
    if buf.is_null() && len > 0 {
        return fail(libc::EFAULT);
    }
    // SAFETY: the caller's buffer of `len` bytes.
    let out = unsafe { slice_mut(buf, len) };
    recv_impl(s, out, flags)
}

unsafe fn slice_mut<'a>(p: *mut c_void, len: usize) -> &'a mut [u8] {
    if len == 0 {
        &mut []
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) }
    }
}

unsafe fn slice<'a>(p: *const c_void, len: usize) -> &'a [u8] {
    if len == 0 {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(p as *const u8, len) }
    }
}

/// librdmacm's `rsend`.
#[export_name = "ferroce_rsend"]
pub unsafe extern "C" fn rsend(s: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize {
    if buf.is_null() && len > 0 {
        return fail(libc::EFAULT);
    }
    // SAFETY: the caller's buffer of `len` bytes.
    send_impl(s, unsafe { slice(buf, len) }, flags)
}

/// librdmacm's `rread`.
#[export_name = "ferroce_rread"]
pub unsafe extern "C" fn rread(s: c_int, buf: *mut c_void, len: usize) -> isize {
    // SAFETY: forwarded.
    unsafe { rrecv(s, buf, len, 0) }
}

/// librdmacm's `rwrite`.
#[export_name = "ferroce_rwrite"]
pub unsafe extern "C" fn rwrite(s: c_int, buf: *const c_void, len: usize) -> isize {
    // SAFETY: forwarded.
    unsafe { rsend(s, buf, len, 0) }
}

/// librdmacm's `rrecvfrom` (a stream socket: the peer's address; a datagram socket: the
/// message's source).
#[export_name = "ferroce_rrecvfrom"]
pub unsafe extern "C" fn rrecvfrom(
    s: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    src: *mut sockaddr,
    alen: *mut socklen_t,
) -> isize {
    if buf.is_null() && len > 0 {
        return fail(libc::EFAULT);
    }
    if let Some(d) = dgram::lookup(s) {
        // SAFETY: the caller's buffers.
        return unsafe { dgram::recvfrom_c(&d, buf, len, flags, src, alen) };
    }
    // SAFETY: forwarded.
    let r = unsafe { rrecv(s, buf, len, flags) };
    if r >= 0 && !src.is_null() && !alen.is_null() {
        // SAFETY: the caller's out parameters.
        unsafe { rgetpeername(s, src, alen) };
    }
    r
}

/// librdmacm's `rsendto` (a stream socket: no address, as a connected TCP socket).
#[export_name = "ferroce_rsendto"]
pub unsafe extern "C" fn rsendto(
    s: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    dst: *const sockaddr,
    alen: socklen_t,
) -> isize {
    if let Some(d) = dgram::lookup(s) {
        if buf.is_null() && len > 0 {
            return fail(libc::EFAULT);
        }
        // SAFETY: the caller's buffer and address.
        return unsafe { dgram::sendto_c(&d, buf, len, flags, dst) };
    }
    if lookup(s).is_none() {
        return fail(libc::EBADF);
    }
    if !dst.is_null() || alen != 0 {
        return fail(libc::EISCONN);
    }
    // SAFETY: forwarded.
    unsafe { rsend(s, buf, len, flags) }
}

/// `iov`'s buffers, gathered into one (the protocol copies into its ring anyway).
unsafe fn gather(iov: *const libc::iovec, n: c_int) -> Result<Vec<u8>, c_int> {
    if n < 0 || (iov.is_null() && n > 0) {
        return Err(libc::EINVAL);
    }
    let mut v = Vec::new();
    for i in 0..n as usize {
        // SAFETY: the caller's array of `n` iovecs, each naming readable memory.
        unsafe {
            let e = &*iov.add(i);
            v.extend_from_slice(slice(e.iov_base, e.iov_len));
        }
    }
    Ok(v)
}

unsafe fn recv_iov(s: c_int, iov: *const libc::iovec, n: c_int, flags: c_int) -> isize {
    // SAFETY: forwarded.
    unsafe { recv_iov_with(iov, n, |out| recv_impl(s, out, flags)) }
}

/// Receives with `recv` into one buffer as large as `iov`'s, then scatters it.
///
/// # Safety
/// `iov` is an array of `n` iovecs naming writable memory.
unsafe fn recv_iov_with(
    iov: *const libc::iovec,
    n: c_int,
    recv: impl FnOnce(&mut [u8]) -> isize,
) -> isize {
    if n < 0 || (iov.is_null() && n > 0) {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's array.
    let total: usize = (0..n as usize)
        .map(|i| unsafe { (*iov.add(i)).iov_len })
        .sum();
    let mut tmp = vec![0u8; total];
    let r = recv(&mut tmp);
    if r > 0 {
        let mut off = 0;
        for i in 0..n as usize {
            // SAFETY: the caller's array of writable buffers.
            let e = unsafe { &*iov.add(i) };
            let k = e.iov_len.min(r as usize - off);
            // SAFETY: as above.
            unsafe { slice_mut(e.iov_base, k) }.copy_from_slice(&tmp[off..off + k]);
            off += k;
            if off == r as usize {
                break;
            }
        }
    }
    r
}

/// librdmacm's `rreadv`.
#[export_name = "ferroce_rreadv"]
pub unsafe extern "C" fn rreadv(s: c_int, iov: *const libc::iovec, n: c_int) -> isize {
    // SAFETY: forwarded.
    unsafe { recv_iov(s, iov, n, 0) }
}

/// librdmacm's `rwritev`.
#[export_name = "ferroce_rwritev"]
pub unsafe extern "C" fn rwritev(s: c_int, iov: *const libc::iovec, n: c_int) -> isize {
    // SAFETY: the caller's array.
    match unsafe { gather(iov, n) } {
        Ok(v) => send_impl(s, &v, 0),
        Err(e) => fail(e),
    }
}

/// Ancillary data (none is carried by rsockets).
///
/// # Safety
/// `m` is a readable message header.
unsafe fn has_control(m: *const libc::msghdr) -> bool {
    // SAFETY: the caller's contract.
    unsafe { !(*m).msg_control.is_null() && (*m).msg_controllen > 0 }
}

/// librdmacm's `rrecvmsg`.
#[export_name = "ferroce_rrecvmsg"]
pub unsafe extern "C" fn rrecvmsg(s: c_int, m: *mut libc::msghdr, flags: c_int) -> isize {
    if m.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's message header.
    unsafe {
        if has_control(m) {
            return fail(libc::ENOTSUP);
        }
        if let Some(d) = dgram::lookup(s) {
            let mut from = None;
            let r =
                recv_iov_with(
                    (*m).msg_iov,
                    (*m).msg_iovlen as c_int,
                    |out| match dgram::recv_from(&d, out, flags) {
                        Ok((n, a)) => {
                            from = Some(a);
                            n as isize
                        }
                        Err(e) => fail(e),
                    },
                );
            if let Some(a) = from {
                if !(*m).msg_name.is_null() {
                    dgram::copy_source((*m).msg_name as *mut sockaddr, &mut (*m).msg_namelen, a);
                }
            }
            return r;
        }
        recv_iov(s, (*m).msg_iov, (*m).msg_iovlen as c_int, flags)
    }
}

/// librdmacm's `rsendmsg`.
#[export_name = "ferroce_rsendmsg"]
pub unsafe extern "C" fn rsendmsg(s: c_int, m: *const libc::msghdr, flags: c_int) -> isize {
    if m.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's message header.
    unsafe {
        if has_control(m) {
            return fail(libc::ENOTSUP);
        }
        match gather((*m).msg_iov, (*m).msg_iovlen as c_int) {
            Ok(v) => match dgram::lookup(s) {
                Some(d) if !(*m).msg_name.is_null() => dgram::sendto_c(
                    &d,
                    v.as_ptr() as *const c_void,
                    v.len(),
                    flags,
                    (*m).msg_name as *const sockaddr,
                ),
                _ => send_impl(s, &v, flags),
            },
            Err(e) => fail(e),
        }
    }
}

/// Sends a control message and waits until every send completed (rshutdown's core).
fn shutdown_locked<'a>(rs: &'a Rs, mut g: MutexGuard<'a, St>, how: c_int) -> MutexGuard<'a, St> {
    if !g.connected() {
        return g;
    }
    let ctrl = if how == libc::SHUT_RDWR {
        g.readable = false;
        g.writable = false;
        CTRL_DISCONNECT
    } else if how == libc::SHUT_WR {
        g.writable = false;
        if g.readable {
            CTRL_SHUTDOWN
        } else {
            CTRL_DISCONNECT
        }
    } else {
        g.readable = false;
        if g.writable {
            return g;
        }
        CTRL_DISCONNECT
    };
    if !g.ctrl_avail() {
        let (g2, _) = wait(rs, g, false, |s| s.ctrl_avail() || !s.connected());
        g = g2;
    }
    if g.connected() && g.ctrl_avail() {
        g.ctrl_seqno = g.ctrl_seqno.wrapping_add(1);
        let r = g.write_imm(&mut [], msg(OP_CTRL, ctrl), 0, 0, 0);
        if let Err(e) = r {
            g.fail_conn(e);
        }
    }
    if g.connected() {
        // Bounded: a peer that stopped answering fails the QP (retry exceeded) first.
        let (g2, _) = wait(rs, g, false, St::all_sends_done);
        g = g2;
    }
    g
}

/// librdmacm's `rshutdown`.
#[export_name = "ferroce_rshutdown"]
pub extern "C" fn rshutdown(s: c_int, how: c_int) -> c_int {
    if dgram::lookup(s).is_some() {
        // As rdma-core: a datagram socket is never connected in the stream sense.
        return 0;
    }
    let Some(rs) = lookup(s) else {
        return fail(libc::EBADF);
    };
    if ![libc::SHUT_RD, libc::SHUT_WR, libc::SHUT_RDWR].contains(&how) {
        return fail(libc::EINVAL);
    }
    let g = lock(&rs.st);
    if g.conn.is_none()
        || !matches!(
            g.phase,
            Phase::Connected | Phase::Disconnected | Phase::Error
        )
    {
        return fail(libc::ENOTCONN);
    }
    let _g = shutdown_locked(&rs, g, how);
    0
}

/// librdmacm's `rclose`.
#[export_name = "ferroce_rclose"]
pub extern "C" fn rclose(s: c_int) -> c_int {
    if let Some(r) = dgram::close(s) {
        return r;
    }
    let rs = {
        let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
        match t.as_mut().and_then(|t| t.remove(&s)) {
            Some(r) => r,
            None => return fail(libc::EBADF),
        }
    };
    let g = lock(&rs.st);
    let mut g = shutdown_locked(&rs, g, libc::SHUT_RDWR);
    free_conn(&mut g);
    // SAFETY: the socket's id and channel, not used after this (the socket is out of the
    // table, and this thread holds its lock).
    unsafe {
        rdma_destroy_id(g.id);
        rdma_destroy_event_channel(g.ch);
        libc::close(rs.fd);
    }
    g.id = null_mut();
    g.ch = null_mut();
    0
}

fn copy_addr(dst: *mut sockaddr, len: *mut socklen_t, src: &libc::sockaddr_storage) -> c_int {
    if dst.is_null() || len.is_null() {
        return fail(libc::EFAULT);
    }
    let size = if src.ss_family as c_int == libc::AF_INET {
        std::mem::size_of::<libc::sockaddr_in>()
    } else {
        std::mem::size_of::<libc::sockaddr_in6>()
    };
    // SAFETY: the caller's buffer of `*len` bytes; `src` holds `size` bytes.
    unsafe {
        let n = (*len as usize).min(size);
        std::ptr::copy_nonoverlapping(src as *const _ as *const u8, dst as *mut u8, n);
        *len = size as socklen_t;
    }
    0
}

/// librdmacm's `rgetpeername`.
#[export_name = "ferroce_rgetpeername"]
pub unsafe extern "C" fn rgetpeername(s: c_int, a: *mut sockaddr, l: *mut socklen_t) -> c_int {
    if let Some(d) = dgram::lookup(s) {
        // SAFETY: the UDP socket's own call with the caller's buffers.
        return unsafe { libc::getpeername(dgram::udp(&d), a, l) };
    }
    let Some(rs) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let g = lock(&rs.st);
    // SAFETY: the socket's live id.
    copy_addr(a, l, unsafe { &(*g.id).route.addr.dst_storage })
}

/// librdmacm's `rgetsockname`.
#[export_name = "ferroce_rgetsockname"]
pub unsafe extern "C" fn rgetsockname(s: c_int, a: *mut sockaddr, l: *mut socklen_t) -> c_int {
    if let Some(d) = dgram::lookup(s) {
        // SAFETY: the UDP socket's own call with the caller's buffers.
        return unsafe { libc::getsockname(dgram::udp(&d), a, l) };
    }
    let Some(rs) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let g = lock(&rs.st);
    // SAFETY: the socket's live id.
    copy_addr(a, l, unsafe { &(*g.id).route.addr.src_storage })
}

fn set_bit(opts: &mut u64, name: c_int, on: bool) {
    if (0..64).contains(&name) {
        if on {
            *opts |= 1 << name;
        } else {
            *opts &= !(1 << name);
        }
    }
}

/// librdmacm's `rsetsockopt`: the options rsockets keep (buffer and queue sizes, inline
/// size, and the socket options a TCP program sets, accepted and remembered).
#[export_name = "ferroce_rsetsockopt"]
pub unsafe extern "C" fn rsetsockopt(
    s: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    if let Some(d) = dgram::lookup(s) {
        return dgram::setsockopt(&d, level, name, val, len);
    }
    let Some(rs) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let mut g = lock(&rs.st);
    let int = || -> Option<c_int> {
        if val.is_null() || (len as usize) < 4 {
            None
        } else {
            // SAFETY: at least 4 readable bytes.
            Some(unsafe { std::ptr::read_unaligned(val as *const c_int) })
        }
    };
    // As rdma-core: before connecting (a listener passes its sizes on to what it accepts).
    let before = g.conn.is_none();
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
            let Some(v) = int() else {
                return fail(libc::EINVAL);
            };
            if g.conn.is_none() {
                g.rbuf_size = (v.max(0) as u32).saturating_mul(2).min(1 << 30);
            }
        }
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
            let Some(v) = int() else {
                return fail(libc::EINVAL);
            };
            if g.conn.is_none() {
                g.sbuf_size = (v.max(0) as u32)
                    .saturating_mul(2)
                    .clamp(SNDLOWAT * 2, 1 << 30);
            }
        }
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => {
            let Some(v) = int() else {
                return fail(libc::EINVAL);
            };
            let mut one = v;
            // SAFETY: the socket's id; a local value (librdmacm's option: REUSEADDR).
            unsafe { rdma_set_option(g.id, 0, 1, &mut one as *mut c_int as *mut c_void, 4) };
            set_bit(&mut g.so_opts, name, v != 0);
        }
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE | libc::SO_OOBINLINE) => {
            let Some(v) = int() else {
                return fail(libc::EINVAL);
            };
            set_bit(&mut g.so_opts, name, v != 0);
        }
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            if val.is_null() || (len as usize) < std::mem::size_of::<libc::linger>() {
                return fail(libc::EINVAL);
            }
            // SAFETY: a struct linger.
            let on = unsafe { std::ptr::read_unaligned(val as *const libc::linger) }.l_onoff;
            set_bit(&mut g.so_opts, name, on == 0);
        }
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
            let Some(v) = int().filter(|v| *v > 0) else {
                return fail(libc::EINVAL);
            };
            g.keepalive_time = Duration::from_secs(v as u64);
            g.next_keepalive = None;
        }
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => {
            let Some(v) = int() else {
                return fail(libc::EINVAL);
            };
            set_bit(&mut g.tcp_opts, name, v != 0);
        }
        (
            libc::IPPROTO_TCP,
            libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL | libc::TCP_MAXSEG | libc::TCP_CONGESTION,
        ) => {}
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => {
            let Some(v) = int() else {
                return fail(libc::EINVAL);
            };
            set_bit(&mut g.ipv6_opts, name, v != 0);
        }
        (SOL_RDMA, _) if !before => return fail(libc::EINVAL),
        (SOL_RDMA, RDMA_SQSIZE | RDMA_RQSIZE | RDMA_INLINE) => {
            let Some(v) = int() else {
                return fail(libc::EINVAL);
            };
            let v = (v.max(0) as u32).min(QP_MAX);
            match name {
                RDMA_SQSIZE => g.sq_size = v,
                RDMA_RQSIZE => g.rq_size = v,
                _ => g.sq_inline = v,
            }
        }
        (SOL_RDMA, RDMA_IOMAPSIZE) => {
            let Some(v) = int() else {
                return fail(libc::EINVAL);
            };
            g.target_iomap_size = scale_to_value(value_to_scale(v.max(0) as u32));
        }
        // A path record: the CM's route is used instead.
        (SOL_RDMA, RDMA_ROUTE) => {}
        _ => return fail(libc::ENOTSUP),
    }
    0
}

/// librdmacm's `rgetsockopt`.
#[export_name = "ferroce_rgetsockopt"]
pub unsafe extern "C" fn rgetsockopt(
    s: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    let dg = dgram::lookup(s);
    let rs = lookup(s);
    if dg.is_none() && rs.is_none() {
        return fail(libc::EBADF);
    }
    if val.is_null() || len.is_null() {
        return fail(libc::EFAULT);
    }
    if let Some(d) = dg {
        return dgram::getsockopt(&d, level, name, val, len);
    }
    let Some(rs) = rs else {
        return fail(libc::EBADF);
    };
    let mut g = lock(&rs.st);
    let v: c_int = match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_OOBINLINE) => {
            (g.so_opts >> name & 1) as c_int
        }
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
            g.keepalive_time.as_secs().min(c_int::MAX as u64) as c_int
        }
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => g.rbuf_size as c_int,
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => g.sbuf_size as c_int,
        (libc::SOL_SOCKET, libc::SO_ERROR) => std::mem::take(&mut g.err),
        (libc::SOL_SOCKET, libc::SO_TYPE) => libc::SOCK_STREAM,
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            // SAFETY: the caller's buffer and length.
            unsafe {
                if (*len as usize) < std::mem::size_of::<libc::linger>() {
                    return fail(libc::EINVAL);
                }
                *(val as *mut libc::linger) = libc::linger {
                    l_onoff: (g.so_opts >> name & 1 == 0) as c_int,
                    l_linger: 0,
                };
                *len = std::mem::size_of::<libc::linger>() as socklen_t;
            }
            return 0;
        }
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => (g.tcp_opts >> name & 1) as c_int,
        (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => 2048,
        (libc::IPPROTO_TCP, libc::TCP_INFO) => {
            // As rdma-core: the state (ESTABLISHED or CLOSE) and the send queue's depth as
            // the congestion window; every other field 0 (iperf3 reads it).
            // SAFETY: an all-zero tcp_info is valid.
            let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
            info.tcpi_state = if g.connected() { 1 } else { 7 };
            info.tcpi_snd_cwnd = g.sq_size;
            // SAFETY: the caller's buffer of `*len` bytes; at most the struct is copied.
            unsafe {
                let n = (*len as usize).min(std::mem::size_of::<libc::tcp_info>());
                std::ptr::copy_nonoverlapping(&info as *const _ as *const u8, val as *mut u8, n);
                *len = n as socklen_t;
            }
            return 0;
        }
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => (g.ipv6_opts >> name & 1) as c_int,
        (SOL_RDMA, RDMA_SQSIZE) => g.sq_size as c_int,
        (SOL_RDMA, RDMA_RQSIZE) => g.rq_size as c_int,
        (SOL_RDMA, RDMA_INLINE) => g.sq_inline as c_int,
        (SOL_RDMA, RDMA_IOMAPSIZE) => g.target_iomap_size as c_int,
        _ => return fail(libc::ENOTSUP),
    };
    // SAFETY: the caller's buffer of `*len` bytes.
    unsafe {
        if (*len as usize) < 4 {
            return fail(libc::EINVAL);
        }
        std::ptr::write_unaligned(val as *mut c_int, v);
        *len = 4;
    }
    0
}

/// librdmacm's `rfcntl(socket, cmd, ...)`. Its one variadic argument is read as a third
/// integer argument: on the System V x86-64 and AAPCS64 (Linux) ABIs an int passed
/// variadically arrives in the same register as a fixed one.
#[export_name = "ferroce_rfcntl"]
pub extern "C" fn rfcntl(s: c_int, cmd: c_int, arg: libc::c_long) -> c_int {
    if let Some(d) = dgram::lookup(s) {
        return dgram::fcntl(&d, cmd, arg);
    }
    let Some(rs) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let mut g = lock(&rs.st);
    match cmd {
        libc::F_GETFL => libc::O_RDWR | if g.nonblock { libc::O_NONBLOCK } else { 0 },
        libc::F_SETFL => {
            g.nonblock = arg as c_int & libc::O_NONBLOCK != 0;
            0
        }
        libc::F_GETFD => g.fd_flags,
        libc::F_SETFD => {
            g.fd_flags = arg as c_int;
            0
        }
        _ => fail(libc::ENOTSUP),
    }
}

// ---- iomaps: direct placement ------------------------------------------------------------

/// librdmacm's `riomap`: registers `buf` so that the peer's `riowrite` at `offset` (or, with
/// `offset == -1`, at the buffer's address) lands there directly; announced to the peer with
/// the next `rsend`/`riowrite`. Needs a connected socket and, for PROT_WRITE, a free slot in
/// the peer's iomap area (its `RDMA_IOMAPSIZE`).
#[export_name = "ferroce_riomap"]
pub unsafe extern "C" fn riomap(
    s: c_int,
    buf: *mut c_void,
    len: usize,
    prot: c_int,
    _flags: c_int,
    offset: libc::off_t,
) -> libc::off_t {
    let Some(rs) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let mut g = lock(&rs.st);
    if prot & !libc::PROT_WRITE != 0 || buf.is_null() || len == 0 || len > u32::MAX as usize {
        return fail(libc::EINVAL);
    }
    let slots = g.remote_iomap.2;
    let Some(c) = g.conn.as_mut() else {
        return fail(libc::EINVAL);
    };
    let index = if prot & libc::PROT_WRITE != 0 {
        match (0..slots).find(|i| !c.iomaps.iter().any(|m| m.index == Some(*i))) {
            Some(i) => Some(i),
            None => return fail(libc::ENOMEM),
        }
    } else {
        None
    };
    let access = if index.is_some() { ACCESS_WRITE } else { 1 };
    // SAFETY: the socket's PD; the caller's buffer, which it keeps until riounmap.
    let mr = unsafe { ibv_reg_mr(c.pd, buf, len, access) };
    if mr.is_null() {
        return fail(errno_or(libc::ENOMEM));
    }
    let offset = if offset == -1 {
        buf as libc::off_t
    } else {
        offset
    };
    c.iomaps.push(IoMap {
        index,
        offset: offset as u64,
        mr,
        sent: false,
    });
    offset
}

/// librdmacm's `riounmap`: forgets the region `buf`/`len` mapped with `riomap`.
#[export_name = "ferroce_riounmap"]
pub unsafe extern "C" fn riounmap(s: c_int, buf: *mut c_void, len: usize) -> c_int {
    let Some(rs) = lookup(s) else {
        return fail(libc::EBADF);
    };
    let mut g = lock(&rs.st);
    let Some(c) = g.conn.as_mut() else {
        return fail(libc::EINVAL);
    };
    // SAFETY: live MRs of this socket.
    let k = c
        .iomaps
        .iter()
        .position(|m| unsafe { (*m.mr).addr == buf && (*m.mr).length == len });
    match k {
        Some(k) => {
            let m = c.iomaps.remove(k);
            // SAFETY: the region's MR, out of the list.
            unsafe { ibv_dereg_mr(m.mr) };
            0
        }
        None => fail(libc::EINVAL),
    }
}

/// librdmacm's `riowrite`: RDMA WRITE of `buf` into the region the peer mapped at `offset`
/// (no message: the peer learns of it by its own means, e.g. a byte it polls). Returns what
/// was written: less than `count` when the peer's map ends first.
#[export_name = "ferroce_riowrite"]
pub unsafe extern "C" fn riowrite(
    s: c_int,
    buf: *const c_void,
    count: usize,
    offset: libc::off_t,
    flags: c_int,
) -> usize {
    if buf.is_null() && count > 0 {
        return fail::<isize>(libc::EFAULT) as usize;
    }
    let Some(rs) = lookup(s) else {
        return fail::<isize>(libc::EBADF) as usize;
    };
    // SAFETY: the caller's buffer of `count` bytes.
    let data = unsafe { slice(buf, count) };
    let mut g = lock(&rs.st);
    let nonblock = g.nonblock || flags & libc::MSG_DONTWAIT != 0;
    if let Err(e) = finish_connecting(&mut g, nonblock) {
        return fail::<isize>(e) as usize;
    }
    if g.conn.is_none() {
        return fail::<isize>(libc::ENOTCONN) as usize;
    }
    let (g2, r) = send_iomaps(&rs, g, nonblock);
    g = g2;
    if let Err(e) = r {
        return fail::<isize>(e) as usize;
    }
    let mut done = 0usize;
    let mut ramp = Ramp::new();
    let mut off = offset as u64;
    while done < count {
        let n_maps = g.target_iomap_size as usize;
        let Some(m) = (0..n_maps)
            .map(|i| g.target_iomap(i))
            .find(|m| m.3 > 0 && off >= m.0 && off - m.0 < u64::from(m.3))
        else {
            break;
        };
        let (g2, r) = wait_can_send(&rs, g, nonblock);
        g = g2;
        if let Err(e) = r {
            return if done > 0 {
                done
            } else {
                fail::<isize>(e) as usize
            };
        }
        let mut n = ramp.next(count - done);
        n = n
            .min(g.sbuf_bytes_avail as usize)
            .min((u64::from(m.3) - (off - m.0)) as usize);
        g.sqe_avail -= 1;
        g.sbuf_bytes_avail -= n as u32;
        let dst = m.1.wrapping_add(off - m.0);
        let r = g.post_chunk(
            &data[done..done + n],
            IBV_WR_RDMA_WRITE,
            msg(OP_WRITE, n as u32),
            dst,
            m.2,
        );
        if let Err(e) = r {
            g.fail_conn(e);
            return if done > 0 {
                done
            } else {
                fail::<isize>(e) as usize
            };
        }
        done += n;
        off += n as u64;
    }
    done
}

#[doc(hidden)]
pub mod fuzz;

mod dgram;
pub use dgram::fuzz as dgram_fuzz;

// ---- polling ----------------------------------------------------------------------------------------

/// The events of one rsocket now (progress made, never waits); also what to wait on.
fn rs_revents(rs: &Rs, events: i16) -> (i16, Vec<c_int>) {
    let mut g = lock(&rs.st);
    if let Phase::Connecting(_) = g.phase {
        match advance_connect(&mut g, false) {
            Ok(true) => {}
            // Waits on the CM channel for the next event.
            Ok(false) => return (0, g.cm_fd().into_iter().collect()),
            // Failed: POLLOUT and POLLERR, as a TCP socket's failed connect gives, and errno
            // says why (ECONNREFUSED for a REJ), as rdma-core's rpoll leaves it when the
            // connection fails inside the call (riostream prints "rpoll: Connection refused").
            Err(e) => {
                set_errno(e);
                return (libc::POLLERR | (events & libc::POLLOUT), vec![]);
            }
        }
    }
    match g.phase {
        Phase::Listening => {
            // SAFETY: the listener's channel.
            let fd = unsafe { (*g.ch).fd };
            let mut p = pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd on the stack.
            unsafe { libc::poll(&mut p, 1, 0) };
            let r = if p.revents & libc::POLLIN != 0 {
                events & libc::POLLIN
            } else {
                0
            };
            (r, vec![fd])
        }
        Phase::Connected | Phase::Disconnected | Phase::Error if g.conn.is_some() => {
            let ready = |g: &St| {
                let mut r = 0;
                if events & libc::POLLIN != 0 && g.conn_have_rdata() {
                    r |= libc::POLLIN;
                }
                if events & libc::POLLOUT != 0 && g.writable && g.can_send() {
                    r |= libc::POLLOUT;
                }
                // Hang-up only once what arrived was read (rdma-core reports it with unread
                // data too, and a program that takes POLLHUP as failure, as rstream does,
                // then loses the end of the stream).
                match g.phase {
                    Phase::Disconnected if g.rmsg.is_empty() => r |= libc::POLLHUP,
                    Phase::Error => r |= libc::POLLERR,
                    _ => {}
                }
                r
            };
            // Notifications already signalled are taken first: the CQ must be armed again
            // before this thread sleeps on the channel.
            g.drain_cq_events();
            g.progress();
            let mut r = ready(&g);
            if r == 0 && g.check_cm() {
                r = ready(&g);
            }
            if r == 0 && !g.cq_armed {
                g.arm();
                // A completion that came between the poll above and arming.
                g.progress();
                r = ready(&g);
            }
            let fds = if r == 0 {
                g.comp_fd().into_iter().chain(g.cm_fd()).collect()
            } else {
                Vec::new()
            };
            (r, fds)
        }
        Phase::Error => (
            libc::POLLERR | (events & (libc::POLLIN | libc::POLLOUT)),
            vec![],
        ),
        _ => (0, vec![]),
    }
}

/// True when any descriptor of `fds` is an rsocket (librdmacm.so.1's `rpoll` calls libc's
/// `poll` directly otherwise).
#[no_mangle]
pub unsafe extern "C" fn ferroce_rsocket_in_poll(fds: *const pollfd, n: nfds_t) -> c_int {
    if fds.is_null() {
        return 0;
    }
    // SAFETY: the caller's array of `n` entries.
    (0..n as usize).any(|i| is_rsocket(unsafe { (*fds.add(i)).fd })) as c_int
}

/// librdmacm's `rpoll` when an rsocket is among the descriptors.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rpoll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    if fds.is_null() && n > 0 {
        return fail(libc::EFAULT);
    }
    let fds: &mut [pollfd] = if n == 0 {
        &mut []
    } else {
        // SAFETY: the caller's array of `n` entries.
        unsafe { std::slice::from_raw_parts_mut(fds, n as usize) }
    };
    let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    // One datagram rsocket alone (a datagram program's usual wait): waited on driving the
    // engine (see dgram::wait).
    if let [f] = fds {
        if let Some(d) = dgram::lookup(f.fd) {
            f.revents = dgram::poll_one(&d, f.events, deadline);
            return (f.revents != 0) as c_int;
        }
    }
    let spin_until = Instant::now() + Duration::from_micros(10);
    loop {
        let mut ready = 0;
        let mut wait_fds: Vec<pollfd> = Vec::new();
        let mut plain: Vec<usize> = Vec::new();
        for (i, f) in fds.iter_mut().enumerate() {
            f.revents = 0;
            let rsock = match lookup(f.fd) {
                Some(rs) => Some(rs_revents(&rs, f.events)),
                None => dgram::lookup(f.fd).map(|d| dgram::revents(&d, f.events)),
            };
            if let Some((r, w)) = rsock {
                f.revents = r;
                wait_fds.extend(w.into_iter().map(|fd| pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                }));
            } else {
                plain.push(i);
                wait_fds.push(pollfd {
                    fd: f.fd,
                    events: f.events,
                    revents: 0,
                });
            }
        }
        // The program's own descriptors, now.
        let mut own: Vec<pollfd> = plain.iter().map(|&i| fds[i]).collect();
        if !own.is_empty() {
            // SAFETY: a local array.
            unsafe { libc::poll(own.as_mut_ptr(), own.len() as nfds_t, 0) };
            for (k, &i) in plain.iter().enumerate() {
                fds[i].revents = own[k].revents;
            }
        }
        for f in fds.iter() {
            if f.revents != 0 {
                ready += 1;
            }
        }
        if ready > 0 {
            return ready;
        }
        let left = match deadline {
            Some(d) => {
                let l = d.saturating_duration_since(Instant::now());
                if l.is_zero() {
                    return 0;
                }
                l.as_millis().min(50) as c_int
            }
            None => 50,
        };
        if Instant::now() < spin_until {
            continue;
        }
        // SAFETY: a local array: completion channels, listeners' CM channels and the
        // program's descriptors. A short wait: a rsocket's state can also change under
        // another thread's calls.
        unsafe { libc::poll(wait_fds.as_mut_ptr(), wait_fds.len() as nfds_t, left.max(1)) };
    }
}

/// True when any descriptor of the sets is an rsocket.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rsocket_in_select(
    nfds: c_int,
    r: *const libc::fd_set,
    w: *const libc::fd_set,
    e: *const libc::fd_set,
) -> c_int {
    (0..nfds.clamp(0, libc::FD_SETSIZE as c_int)).any(|fd| {
        // SAFETY: the caller's sets (or NULL).
        let inset = |s: *const libc::fd_set| !s.is_null() && unsafe { libc::FD_ISSET(fd, s) };
        (inset(r) || inset(w) || inset(e)) && is_rsocket(fd)
    }) as c_int
}

/// librdmacm's `rselect` when an rsocket is among the descriptors: `rpoll` on the sets.
#[no_mangle]
pub unsafe extern "C" fn ferroce_rselect(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    tv: *mut libc::timeval,
) -> c_int {
    let n = nfds.clamp(0, libc::FD_SETSIZE as c_int);
    // SAFETY: the caller's sets (or NULL).
    let inset = |s: *mut libc::fd_set, fd| !s.is_null() && unsafe { libc::FD_ISSET(fd, s) };
    let mut p: Vec<pollfd> = Vec::new();
    for fd in 0..n {
        let mut ev = 0;
        if inset(r, fd) {
            ev |= libc::POLLIN;
        }
        if inset(w, fd) {
            ev |= libc::POLLOUT;
        }
        if inset(e, fd) {
            ev |= libc::POLLPRI;
        }
        if ev != 0 {
            p.push(pollfd {
                fd,
                events: ev,
                revents: 0,
            });
        }
    }
    let timeout = if tv.is_null() {
        -1
    } else {
        // SAFETY: the caller's timeval.
        let t = unsafe { *tv };
        (t.tv_sec.max(0).saturating_mul(1000) + t.tv_usec.max(0) / 1000).min(c_int::MAX as i64)
            as c_int
    };
    // SAFETY: a local array.
    let rc = unsafe { ferroce_rpoll(p.as_mut_ptr(), p.len() as nfds_t, timeout) };
    if rc < 0 {
        return rc;
    }
    let mut count = 0;
    // SAFETY: the caller's sets, rewritten with what is ready.
    unsafe {
        for s in [r, w, e] {
            if !s.is_null() {
                libc::FD_ZERO(s);
            }
        }
        for q in &p {
            let asked = |bit: i16| q.events & bit != 0;
            if asked(libc::POLLIN)
                && q.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
            {
                libc::FD_SET(q.fd, r);
                count += 1;
            }
            if asked(libc::POLLOUT) && q.revents & (libc::POLLOUT | libc::POLLERR) != 0 {
                libc::FD_SET(q.fd, w);
                count += 1;
            }
            if asked(libc::POLLPRI) && q.revents & libc::POLLPRI != 0 {
                libc::FD_SET(q.fd, e);
                count += 1;
            }
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The REP private data of Debian's `rstream -b 10.77.0.21 -S 65536 -C 200 -T v` on
    /// rdma-core 44 (rdma_rxe in the tools/rxe-peer guest), as tshark decodes it
    /// (`infiniband.cm.rep.private`, first 40 of 196 bytes) from tools/interop-rxe's bridge
    /// capture of `dropin-rstream-64k/ferroce-client`, 2026-12-06: an independent sample of
    /// the format.
    const RDMA_CORE_REP: [u8; 40] = [
        0x01, 0x02, 0x01, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0x77, 0x7c, 0x00, 0x30,
        0x00, 0x00, 0x00, 0x03, 0x87, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x7f, 0x77, 0x80, 0xfe,
        0x20, 0x00, 0x00, 0x00, 0x04, 0xdc, 0x00, 0x08, 0x00, 0x00,
    ];

    #[test]
    fn rdma_cores_connection_data_reads_as_rstream_set_it_up() {
        let c = ConnData::parse(&RDMA_CORE_REP).unwrap();
        // Little-endian host with an iomap area (flag 2), 384 receive credits (rdma-core's
        // default queue), no iomap entries (rstream sets none), a 2-entry target SGL, and
        // half of a 1 MiB ring (rstream's SO_RCVBUF of 512 KiB, doubled).
        assert_eq!(c.flags, CONN_FLAG_IOMAP);
        assert_eq!(c.credits, 384);
        assert_eq!(c.iomap_scale, 0);
        assert_eq!(c.target_sgl, (0x7f77_7c00_3000, 0x387, 2));
        assert_eq!(c.data_buf, (0x7f77_80fe_2000, 0x4dc, 512 * 1024));
        // What this side emits for the same values is the same 40 bytes.
        assert_eq!(c.emit(), RDMA_CORE_REP);
        // Followed by the REP's zero padding, it still reads the same.
        let mut rep = [0u8; 196];
        rep[..40].copy_from_slice(&RDMA_CORE_REP);
        assert_eq!(ConnData::parse(&rep), Some(c));
    }

    #[test]
    fn connection_data_that_is_not_rsocket_v1_is_refused() {
        let mut v2 = RDMA_CORE_REP;
        v2[0] = 2;
        assert_eq!(ConnData::parse(&v2), None);
        let mut no_sgl = RDMA_CORE_REP;
        no_sgl[20..24].copy_from_slice(&[0; 4]);
        assert_eq!(ConnData::parse(&no_sgl), None);
        for n in 0..40 {
            assert_eq!(ConnData::parse(&RDMA_CORE_REP[..n]), None, "{n} bytes");
        }
        assert_eq!(ConnData::parse(&[]), None);
    }

    #[test]
    fn sends_start_small_and_double_up_to_the_largest_transfer() {
        // rdma-core's rsend: 2 KiB first, doubling per chunk to 64 KiB; what is left when
        // it is less.
        let mut r = Ramp::new();
        let mut left = 300_000usize;
        let mut chunks = Vec::new();
        while left > 0 {
            let n = r.next(left);
            chunks.push(n);
            left -= n;
        }
        assert_eq!(
            chunks,
            [2048, 4096, 8192, 16384, 32768, 65536, 65536, 65536, 39904]
        );
        assert_eq!(Ramp::new().next(100), 100);
        assert_eq!(Ramp::new().next(2048), 2048);
    }

    #[test]
    fn iomap_sizes_scale_as_rdma_cores() {
        for v in [0, 1, 2, 64, 127, 128] {
            assert_eq!(scale_to_value(value_to_scale(v)), v);
        }
        // Above 128: multiples of 256.
        assert_eq!(value_to_scale(129), 128);
        assert_eq!(value_to_scale(256), 129);
        assert_eq!(scale_to_value(129), 256);
        assert_eq!(scale_to_value(value_to_scale(1000)), 768);
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_parse_without_panic_and_round_trip(d in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            if let Some(c) = ConnData::parse(&d) {
                let e = c.emit();
                proptest::prop_assert_eq!(&e[..4], &d[..4]);
                proptest::prop_assert_eq!(&e[7..40], &d[7..40]);
                proptest::prop_assert_eq!(ConnData::parse(&e), Some(c));
            }
        }
    }
}
