//! librdmacm on ferroce: the `rdma_*` calls of `<rdma/rdma_cma.h>` over
//! [`ferroce::runtime::cm`], sharing the NIC of this library's verbs.
//!
//! The functions live in `libibverbs.so.1` under their own names prefixed `ferroce_` (version
//! node `FERROCE_RDMACM_PRIVATE`), so that the connection manager and the verbs of one
//! process share one NIC, one set of QPs and one set of C objects. `librdmacm.so.1`
//! (tools/build-cabi, `cabi/librdmacm.map`) is a forwarder: each of its names, with
//! rdma-core's version (RDMACM_1.0 … 1.3), jumps to the `ferroce_` function here. `rpoll` and
//! `rselect` call libc's `poll` and `select` directly when no rsocket is among the
//! descriptors (cabi/rdmacm-poll.c), so that a thread cancelled while it waits there (rping's
//! CM thread) never unwinds through Rust; rsockets themselves are in `rsocket.rs`.
//!
//! # Objects
//! - An event channel is a `Box<ChW>`: `struct rdma_event_channel` (its `fd` the runtime's
//!   eventfd: readable while events wait) and the runtime's [`EventChannel`].
//! - An id is a `Box<IdW>`: `struct rdma_cm_id` and the runtime's [`CmId`]. A CONNECT_REQUEST's
//!   new id is made when the event is read, with the listener's channel and `context`, as
//!   librdmacm does. `id->verbs` is the CM's context (opened once, with the first channel):
//!   the application allocates PDs, CQs and MRs on it with this library's verbs.
//! - An event is a `Box<EvW>`: `struct rdma_cm_event` and the runtime's [`CmEvent`], whose
//!   private data it points to; `rdma_ack_cm_event` frees it.
//! - Teardown from one thread while another reads events: an event counts against its id (a
//!   CONNECT_REQUEST against the listener) until acknowledged, and `rdma_destroy_id` waits
//!   for those (bounded; an id still counted is freed by its last acknowledgement); a thread
//!   in `rdma_get_cm_event` holds the channel's inner part, so destroying the channel never
//!   frees it under that thread; an id's `qp` is touched only while the QP still exists.
//! - `rdma_create_qp` creates the QP with this library's `ibv_create_qp` and gives it to the
//!   id ([`CmId::attach_qp`]): the CM moves it through INIT, RTR, RTS and ERROR. A UD id's QP
//!   is brought to RTS here with Q_Key `RDMA_UDP_QKEY` (SIDR needs no QP transitions).
//!
//! Synchronous ids (`rdma_create_ep`, or a NULL channel to `rdma_create_id`) get a channel of
//! their own; their calls wait for the event that ends them, as librdmacm's do.

use crate::abi::*;
use crate::verbs::{self, set_errno, QpW};
use ferroce::cm::CmConfig;
use ferroce::io::backend::BackendKind;
use ferroce::runtime::cm::{
    ca_guid_of, CmApiError, CmEvent, CmId, CmService, ConnParam, EventChannel, EventType,
    KernelResolver, PortSpace,
};
use ferroce::wire::{Psn, QpNumber};
use libc::{c_char, c_int, c_void, sockaddr, EINVAL, ENODEV, ENOMEM, ENOSYS, EOPNOTSUPP};
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ptr::null_mut;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// -1 with `errno` set: how librdmacm's calls fail.
fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

/// The errno of a runtime CM error (librdmacm returns the kernel's for the same cause).
fn errno_of(e: &CmApiError) -> c_int {
    use ferroce::cm::rdma::RdmaCmError as R;
    match e {
        CmApiError::Cm(c) => match c {
            R::NoSuchId => EINVAL,
            R::AddrInUse(..) => libc::EADDRINUSE,
            R::InvalidState(_) => EINVAL,
            _ => EINVAL,
        },
        CmApiError::Verbs(v) => verbs::errno_of(v),
        CmApiError::Qp(_) => EINVAL,
        CmApiError::Stopped => ENODEV,
        CmApiError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
    }
}

/// `FERROCE_DEBUG` set: say what happens on standard error.
pub(crate) fn trace() -> bool {
    static T: OnceLock<bool> = OnceLock::new();
    *T.get_or_init(|| std::env::var_os("FERROCE_DEBUG").is_some())
}

fn ret(r: Result<(), CmApiError>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            if trace() {
                eprintln!("ferroce librdmacm: {e}");
            }
            fail(errno_of(&e))
        }
    }
}

// ---- the CM service, once per process ---------------------------------------------------------

struct Cm {
    /// The context every id's `verbs` names (never closed: the CM lives as long as the
    /// process).
    ctx: usize,
    svc: CmService,
    /// The address the device runs with (the GID at index 0).
    local: IpAddr,
    /// The device's PD and XRC domain, made when first needed ([`cm_pd`], [`cm_xrcd`]).
    pd: Mutex<usize>,
    xrcd: Mutex<usize>,
}

/// The kernel's resolution ([`KernelResolver`]) over the port's addresses as they are at each
/// question: the GID table follows the interface's addresses.
struct PortResolver {
    sh: Arc<crate::device::Shared>,
    /// The address the device runs with (the GID in use).
    local: IpAddr,
}

impl PortResolver {
    fn kernel(&self) -> KernelResolver {
        let port = &self.sh.port;
        KernelResolver {
            ifname: port.netdev.name.clone(),
            gids: port.gids(),
            udp: port.backend == BackendKind::Udp,
            local: Some(self.local),
        }
    }
}

impl ferroce::runtime::cm::Resolver for PortResolver {
    fn local_addr(&self, src: Option<IpAddr>, dst: IpAddr) -> Result<IpAddr, i32> {
        self.kernel().local_addr(src, dst)
    }

    fn neighbour(&self, local: IpAddr, dst: IpAddr) -> Result<ferroce::wire::MacAddr, i32> {
        self.kernel().neighbour(local, dst)
    }
}

/// The process's CM, made by its first RDMA-CM call, with the ID of the process that made it:
/// a child of fork(2) inherits its parent's, whose threads it has not, and makes its own
/// (rdma-core's RDMA-CM tests fork both ends from a process that used the device before).
static CM: Mutex<Option<(u32, Result<&'static Cm, c_int>)>> = Mutex::new(None);

/// The CM made by this process, if any.
fn cm_made() -> Option<Result<&'static Cm, c_int>> {
    match *lock(&CM) {
        Some((pid, r)) if pid == std::process::id() => Some(r),
        _ => None,
    }
}

fn cm() -> Result<&'static Cm, c_int> {
    let mut g = lock(&CM);
    let pid = std::process::id();
    if let Some((p, r)) = *g {
        if p == pid {
            return r;
        }
    }
    // (A parent's CM, if any, stays in this child's memory, unused.)
    let r = make_cm().map(|c| &*Box::leak(Box::new(c)));
    *g = Some((pid, r));
    r
}

fn make_cm() -> Result<Cm, c_int> {
    {
        let dev = verbs::the_device().ok_or(ENODEV)?;
        // SAFETY: the process's device, from this library's list.
        let ctx = unsafe { verbs::ibv_open_device(dev) };
        if ctx.is_null() {
            return Err(ENODEV);
        }
        // SAFETY: a context just opened.
        let sh = unsafe { verbs::sh_arc(ctx) };
        let port = &sh.port;
        // The NIC first: it settles the addresses the port serves.
        let nic = sh.nic()?.clone();
        let gids = port.gids();
        let mac = port.netdev.mac;
        let resolver = PortResolver {
            sh: sh.clone(),
            local: gids[0],
        };
        let svc = CmService::start(nic, CmConfig::new(ca_guid_of(mac)), Box::new(resolver))
            .map_err(|e| {
                eprintln!("ferroce librdmacm: {e}");
                ENODEV
            })?;
        // Once per process line: a child of fork inherits its parent's registration, which
        // finds the child's CM.
        static AT_EXIT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !AT_EXIT.swap(true, std::sync::atomic::Ordering::SeqCst) {
            // SAFETY: atexit(3) with a function that lives as long as the process.
            unsafe { libc::atexit(disconnect_at_exit) };
        }
        Ok(Cm {
            ctx: ctx as usize,
            svc,
            local: gids[0],
            pd: Mutex::new(0),
            xrcd: Mutex::new(0),
        })
    }
}

/// Let what the CM just emitted leave: a program may exit right after `rdma_disconnect` (as
/// perftest's server does), and its DREQ must not die in the doorbell queue with it (the
/// kernel's CM would still send it).
fn flush() {
    if let Ok(c) = cm() {
        c.svc.nic().settle(Duration::from_millis(200));
    }
}

/// At exit, what the kernel does when a process closes its RDMA-CM descriptor (ucma's close
/// destroys every id; the kernel's CM outlives the process): every connection still up is
/// disconnected (DREQ), a DREQ that came and was not answered yet gets its DREP, a request not
/// accepted its REJ, and the process ends only once those MADs have left (bounded), so that
/// peers see DISCONNECTED instead of waiting for their DREQ's retries to run out. Before,
/// only connections in `Connect` were disconnected: a server whose peer's DREQ had come
/// (perftest's, exiting without `rdma_disconnect` on that id) left the client retrying its
/// DREQ for over a minute.
extern "C" fn disconnect_at_exit() {
    if let Some(Ok(c)) = cm_made() {
        if !c.svc.close_all(Duration::from_millis(100)) && trace() {
            eprintln!("ferroce librdmacm: at exit, QP1 did not finish sending within 100 ms");
        }
    }
}

fn cm_ctx() -> *mut ibv_context {
    cm().map(|c| c.ctx as *mut ibv_context)
        .unwrap_or(null_mut())
}

/// The CM device's protection domain, allocated the first time an id is on the device, as
/// librdmacm allocates one per device and sets every id's `pd` to it once the id is bound to
/// the device (`rdma_bind_addr`, `rdma_resolve_addr`, a connection request's new id):
/// applications use `id->pd` for their regions and address handles without allocating one
/// (pyverbs' `CMID.pd`, rdma-core's RDMA-CM tests); NULL if it cannot be allocated.
fn cm_pd() -> *mut ibv_pd {
    let Ok(c) = cm() else {
        return null_mut();
    };
    let mut g = lock(&c.pd);
    if *g == 0 {
        // SAFETY: the CM's context.
        *g = unsafe { verbs::ibv_alloc_pd(c.ctx as *mut ibv_context) } as usize;
    }
    *g as *mut ibv_pd
}

/// The XRC domain of the CM's device, opened (unshared) the first time an XRC id needs one,
/// as librdmacm keeps one per device; NULL if it cannot be opened.
fn cm_xrcd() -> *mut ibv_xrcd {
    let Ok(c) = cm() else {
        return null_mut();
    };
    let mut g = lock(&c.xrcd);
    if *g == 0 {
        let mut a = ibv_xrcd_init_attr {
            comp_mask: IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
            fd: -1,
            oflags: 0,
        };
        // SAFETY: the CM's context and a local attribute struct.
        *g = unsafe { verbs::open_xrcd(c.ctx as *mut ibv_context, &mut a) } as usize;
    }
    *g as *mut ibv_xrcd
}

/// Whether a C id is of an XRC half (`rdma_create_ep` with an XRC `ai_qp_type`).
fn xrc_id(c: &rdma_cm_id) -> bool {
    matches!(c.qp_type, IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV)
}

/// A synchronous id keeps the event its call completed with in `id->event` (librdmacm's
/// `ucma_complete`: `rdma_xclient` reads the REP's private data there) until its next
/// synchronous call or its destruction acknowledges it.
fn hold_sync_event(old: *mut rdma_cm_event, ev: CmEvent) {
    if !old.is_null() {
        // SAFETY: the event this id held, not handed to the program to acknowledge.
        unsafe { rdma_ack_cm_event(old) };
    }
    deliver(ev);
}

// ---- objects -------------------------------------------------------------------------------------

#[repr(C)]
struct ChW {
    c: rdma_event_channel,
    /// Shared with every thread inside `rdma_get_cm_event` on the channel: one that waits
    /// there when the program destroys the channel keeps waiting (as it would in the
    /// kernel), on a channel that stays alive under it.
    inner: Arc<ChInner>,
}

/// The live event channels (their `ChW` addresses): a channel the program already destroyed
/// (perftest's `-R` client does after a REJ: its retry destroys the channel, its failure path
/// destroys it again) or any other pointer is refused with `EINVAL` instead of being followed.
static CHANNELS: Mutex<Option<std::collections::HashSet<usize>>> = Mutex::new(None);

/// The inner part of a live channel (taken under the registry's lock, so a concurrent
/// `rdma_destroy_event_channel` cannot free it meanwhile) and its descriptor.
fn live_channel(ch: *mut rdma_event_channel) -> Result<(Arc<ChInner>, c_int), c_int> {
    let g = lock(&CHANNELS);
    if ch.is_null() || !g.as_ref().is_some_and(|s| s.contains(&(ch as usize))) {
        return Err(EINVAL);
    }
    // SAFETY: a channel of this library, in the registry: freed only after it leaves it,
    // which needs this lock.
    let w = unsafe { &*(ch as *const ChW) };
    Ok((w.inner.clone(), w.c.fd))
}

struct ChInner {
    ch: EventChannel,
    /// Events read while a synchronous call waited for another id's.
    stash: Mutex<VecDeque<CmEvent>>,
}

#[repr(C)]
struct IdW {
    c: rdma_cm_id,
    id: Option<CmId>,
    /// A UD id's QP, set up here (not given to the CM).
    ud_qp: Option<QpNumber>,
    /// The path record `route.path_rec` points to.
    path: Box<ibv_sa_path_rec>,
    /// The channel was made for this id (a synchronous id): destroyed with it.
    own_channel: bool,
    /// A synchronous id (its own channel, or a request's id from `rdma_get_request`): its
    /// calls wait for the event that ends them.
    sync: bool,
    /// The CQs and channels `rdma_create_qp` made (destroyed by `rdma_destroy_qp`).
    made_cqs: bool,
    /// A synchronous listener: the QP attributes each new id gets (`rdma_create_ep`).
    ep_qp_attr: Option<(usize, ibv_qp_init_attr)>,
    /// The starting PSN this side announces for a QP the program moves itself.
    my_psn: u32,
    /// Active side: the connection's QP attributes (from CONNECT_RESPONSE).
    conn_qp: Option<ferroce::cm::QpParams>,
    /// `rdma_establish` was called: the runtime's ESTABLISHED that follows is not reported
    /// (the kernel's CM reports none after CONNECT_RESPONSE; rping -q counts on it).
    established_by_app: bool,
    /// Passive side: the REQ's QP number, starting PSN, initiator depth, responder
    /// resources, retry and RNR retry counts.
    req: Option<(u32, u32, u8, u8, u8, u8)>,
    /// The multicast groups joined, each with the context the program gave.
    mc: Vec<(IpAddr, usize)>,
    /// Joins whose MULTICAST_JOIN event was not read yet, oldest first.
    mc_pending: VecDeque<(IpAddr, usize)>,
}

#[repr(C)]
struct EvW {
    c: rdma_cm_event,
    ev: CmEvent,
    /// The C id the event counts against until it is acknowledged: its id, or for a
    /// CONNECT_REQUEST the listener (librdmacm counts it there).
    counted: usize,
}

/// The C ids, and the events handed out on each and not acknowledged yet.
#[derive(Default)]
struct Registry {
    /// The C id of each runtime id, by number (an id leaves at `rdma_destroy_id`).
    by_num: HashMap<u32, usize>,
    /// Events handed out and not acknowledged, by the C id they count against.
    unacked: HashMap<usize, u32>,
    /// Ids destroyed while an event counted against them was still out (the program
    /// destroyed an id before acknowledging its events, which librdmacm forbids): each is
    /// freed with the acknowledgement of its last event, never under a reader.
    zombies: HashSet<usize>,
    /// Every id made and not destroyed: a call naming another pointer (an id the program
    /// already destroyed, as perftest's retry after a REJ does) fails with EINVAL instead of
    /// reading freed memory.
    live: HashSet<usize>,
}

/// `id` is an id of this library, not destroyed.
fn live_id(id: *mut rdma_cm_id) -> bool {
    !id.is_null() && ids(|r| r.live.contains(&(id as usize)))
}

static IDS: Mutex<Option<Registry>> = Mutex::new(None);
/// Signalled when an event is acknowledged (`rdma_destroy_id` waits for its id's).
static ACKED: Condvar = Condvar::new();

fn ids<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    f(lock(&IDS).get_or_insert_with(Registry::default))
}

/// How long `rdma_destroy_id` waits for the acknowledgement of its id's events. librdmacm
/// waits forever; an id is not freed while events count against it either way, so a program
/// that acknowledges later (or on the destroying thread, which would deadlock librdmacm)
/// costs this wait and nothing else.
const DESTROY_WAIT: Duration = Duration::from_secs(5);

/// An event counted against `p` was acknowledged (or never handed out).
fn release(p: usize) {
    let free = ids(|r| {
        let n = r.unacked.entry(p).or_insert(0);
        *n = n.saturating_sub(1);
        if *n == 0 {
            r.unacked.remove(&p);
            r.zombies.remove(&p)
        } else {
            false
        }
    });
    ACKED.notify_all();
    if free {
        // SAFETY: a destroyed id (out of the registry) whose last event was just
        // acknowledged: nothing refers to it any more.
        drop(unsafe { Box::from_raw(p as *mut IdW) });
    }
}

/// # Safety
/// `id` is an id of this library, not destroyed.
unsafe fn idw<'a>(id: *mut rdma_cm_id) -> &'a mut IdW {
    // SAFETY: `IdW` starts with the C id (`#[repr(C)]`).
    unsafe { &mut *(id as *mut IdW) }
}

fn port_space(ps: c_int) -> Option<PortSpace> {
    match ps {
        RDMA_PS_TCP => Some(PortSpace::TCP),
        RDMA_PS_UDP => Some(PortSpace::UDP),
        // Native IB addressing: connected ids here (rdma_xserver/rdma_xclient's XRC ids).
        RDMA_PS_IB => Some(PortSpace::IB),
        _ => None,
    }
}

/// The `enum rdma_cm_event_type` number of an event.
pub fn event_code(t: EventType) -> c_int {
    match t {
        EventType::AddrResolved => 0,
        EventType::AddrError => 1,
        EventType::RouteResolved => 2,
        EventType::RouteError => 3,
        EventType::ConnectRequest => 4,
        EventType::ConnectResponse => 5,
        EventType::ConnectError => 6,
        EventType::Unreachable => 7,
        EventType::Rejected => 8,
        EventType::Established => 9,
        EventType::Disconnected => 10,
        EventType::TimewaitExit => 15,
        EventType::MulticastJoin => 12,
        EventType::MulticastError => 13,
    }
}

/// Every event type with its C name.
pub const EVENT_NAMES: [(EventType, &str); 14] = [
    (EventType::AddrResolved, "RDMA_CM_EVENT_ADDR_RESOLVED"),
    (EventType::AddrError, "RDMA_CM_EVENT_ADDR_ERROR"),
    (EventType::RouteResolved, "RDMA_CM_EVENT_ROUTE_RESOLVED"),
    (EventType::RouteError, "RDMA_CM_EVENT_ROUTE_ERROR"),
    (EventType::ConnectRequest, "RDMA_CM_EVENT_CONNECT_REQUEST"),
    (EventType::ConnectResponse, "RDMA_CM_EVENT_CONNECT_RESPONSE"),
    (EventType::ConnectError, "RDMA_CM_EVENT_CONNECT_ERROR"),
    (EventType::Unreachable, "RDMA_CM_EVENT_UNREACHABLE"),
    (EventType::Rejected, "RDMA_CM_EVENT_REJECTED"),
    (EventType::Established, "RDMA_CM_EVENT_ESTABLISHED"),
    (EventType::Disconnected, "RDMA_CM_EVENT_DISCONNECTED"),
    (EventType::TimewaitExit, "RDMA_CM_EVENT_TIMEWAIT_EXIT"),
    (EventType::MulticastJoin, "RDMA_CM_EVENT_MULTICAST_JOIN"),
    (EventType::MulticastError, "RDMA_CM_EVENT_MULTICAST_ERROR"),
];

// ---- socket addresses ------------------------------------------------------------------------------

/// # Safety
/// `sa` is NULL or points to a socket address of its family's size.
pub(crate) unsafe fn from_sockaddr(sa: *const sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's socket address; the family says which structure it is.
    unsafe {
        match (*sa).sa_family as c_int {
            libc::AF_INET => {
                let s = &*(sa as *const libc::sockaddr_in);
                Some(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr))),
                    u16::from_be(s.sin_port),
                ))
            }
            libc::AF_INET6 => {
                let s = &*(sa as *const libc::sockaddr_in6);
                Some(SocketAddr::new(
                    IpAddr::V6(Ipv6Addr::from(s.sin6_addr.s6_addr)),
                    u16::from_be(s.sin6_port),
                ))
            }
            _ => None,
        }
    }
}

/// Write `a` into a `sockaddr_storage`; its length.
pub(crate) fn to_sockaddr(dst: &mut libc::sockaddr_storage, a: SocketAddr) -> libc::socklen_t {
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    *dst = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v) => {
            // SAFETY: sockaddr_storage is large and aligned enough for any socket address.
            let s = unsafe { &mut *(dst as *mut _ as *mut libc::sockaddr_in) };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = v.port().to_be();
            s.sin_addr.s_addr = u32::from(*v.ip()).to_be();
            size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(v) => {
            // SAFETY: as above.
            let s = unsafe { &mut *(dst as *mut _ as *mut libc::sockaddr_in6) };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = v.port().to_be();
            s.sin6_addr.s6_addr = v.ip().octets();
            size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// A RoCE v2 GID of an address (IPv4-mapped for IPv4).
pub(crate) fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The index of `ip` in the GID table applications see (0 when it is not there).
pub(crate) fn gid_index(ip: IpAddr) -> u8 {
    let Ok(c) = cm() else { return 0 };
    // SAFETY: the CM's context, open for the life of the process.
    let sh = unsafe { verbs::sh(c.ctx as *mut ibv_context) };
    sh.port.shown_of(ip).unwrap_or(0)
}

impl IdW {
    fn cmid(&self) -> Result<&CmId, c_int> {
        self.id.as_ref().ok_or(EINVAL)
    }

    /// Copy the id's addresses (and, once known, its route) into `route`.
    fn refresh(&mut self) {
        let Some(id) = self.id.as_ref() else { return };
        let (local, peer, route) = (id.local_addr(), id.peer_addr(), id.route());
        if let Some(a) = local {
            to_sockaddr(&mut self.c.route.addr.src_storage, a);
            self.c.route.addr.ibaddr.sgid.raw = gid_of(a.ip());
            // An id bound to an address of the device is on the device; the wildcard and a
            // loopback address the device does not serve are on none (yet).
            if !a.ip().is_unspecified() && served(a.ip()) {
                self.c.verbs = cm_ctx();
                self.c.port_num = 1;
                if self.c.pd.is_null() {
                    self.c.pd = cm_pd();
                }
            }
        }
        if let Some(a) = peer {
            to_sockaddr(&mut self.c.route.addr.dst_storage, a);
            self.c.route.addr.ibaddr.dgid.raw = gid_of(a.ip());
        }
        self.c.route.addr.ibaddr.pkey = 0xffffu16.to_be();
        if let Some(r) = route {
            let p = &mut self.path;
            p.sgid.raw = r.local_gid.0;
            p.dgid.raw = r.remote_gid.0;
            p.hop_limit = r.hop_limit;
            p.traffic_class = r.traffic_class;
            p.flow_label = r.flow_label.to_be();
            p.pkey = 0xffffu16.to_be();
            p.reversible = 1;
            p.numb_path = 1;
            p.mtu_selector = 2; // exactly
            p.mtu = r.path_mtu.0;
            p.rate_selector = 2;
            p.rate = 3; // IB_RATE_10_GBPS, as rxe reports
            p.packet_life_time_selector = 2;
            self.c.route.path_rec = &mut *self.path;
            self.c.route.num_paths = 1;
        }
    }

    /// The C QP's state from the engine (the CM moves it).
    fn refresh_qp_state(&mut self) {
        if self.c.qp.is_null() {
            return;
        }
        // The program may have destroyed the QP itself (`ibv_destroy_qp`, as rping does) while
        // the id still names it: only a QP that still exists is touched.
        verbs::with_live_qp(self.c.qp, |w| {
            // SAFETY: its context is this library's.
            let nic = unsafe { verbs::sh(w.c.context) }.nic();
            if let Ok((st, _)) = nic.and_then(|n| n.query_qp(w.qpn).map_err(|_| EINVAL)) {
                w.c.state = st.to_ibv() as c_int;
            }
        });
    }
}

/// A random 24-bit starting PSN.
fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    (h.finish() & 0xff_ffff) as u32
}

fn new_idw(
    id: CmId,
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: c_int,
) -> *mut IdW {
    // SAFETY: rdma_cm_id and ibv_sa_path_rec are plain C data; all-zero is valid.
    let mut c: rdma_cm_id = unsafe { std::mem::zeroed() };
    c.channel = channel;
    c.context = context;
    c.ps = ps;
    c.qp_type = if ps == RDMA_PS_UDP { 4 } else { 2 };
    let num = id.id().0;
    let w = Box::into_raw(Box::new(IdW {
        c,
        id: Some(id),
        ud_qp: None,
        // SAFETY: as above.
        path: Box::new(unsafe { std::mem::zeroed() }),
        own_channel: false,
        sync: false,
        made_cqs: false,
        ep_qp_attr: None,
        my_psn: random_psn(),
        conn_qp: None,
        established_by_app: false,
        req: None,
        mc: Vec::new(),
        mc_pending: VecDeque::new(),
    }));
    ids(|r| {
        r.by_num.insert(num, w as usize);
        r.live.insert(w as usize);
    });
    w
}

// ---- event channels ---------------------------------------------------------------------------------

fn new_channel() -> Result<*mut ChW, c_int> {
    let cm = cm()?;
    let ch = cm.svc.create_event_channel().map_err(|e| errno_of(&e))?;
    // librdmacm's descriptor is blocking until the application sets O_NONBLOCK (then
    // rdma_get_cm_event returns EAGAIN instead of waiting). The runtime reads it only when it
    // is readable, so it never blocks there.
    // SAFETY: fcntl on the channel's own descriptor.
    unsafe {
        let fl = libc::fcntl(ch.fd(), libc::F_GETFL);
        libc::fcntl(ch.fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
    }
    let p = Box::into_raw(Box::new(ChW {
        c: rdma_event_channel { fd: ch.fd() },
        inner: Arc::new(ChInner {
            ch,
            stash: Mutex::new(VecDeque::new()),
        }),
    }));
    lock(&CHANNELS)
        .get_or_insert_with(Default::default)
        .insert(p as usize);
    Ok(p)
}

/// librdmacm's `rdma_create_event_channel` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_create_event_channel"]
pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    match new_channel() {
        Ok(p) => p as *mut rdma_event_channel,
        Err(e) => {
            set_errno(e);
            null_mut()
        }
    }
}

/// librdmacm's `rdma_destroy_event_channel` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_destroy_event_channel"]
pub unsafe extern "C" fn rdma_destroy_event_channel(ch: *mut rdma_event_channel) {
    // Out of the registry first: a pointer that is not there (destroyed already, or never a
    // channel) is left alone, with errno EINVAL (the function returns nothing).
    let known = lock(&CHANNELS)
        .as_mut()
        .is_some_and(|s| s.remove(&(ch as usize)));
    if !known {
        set_errno(EINVAL);
        return;
    }
    // SAFETY: a channel of this library, just taken out of the registry (so nothing else
    // reaches it from now on). A thread waiting in rdma_get_cm_event on it holds its own
    // reference to the inner channel, so that goes on existing under it.
    drop(unsafe { Box::from_raw(ch as *mut ChW) });
}

/// Turn a runtime event into a C one (making a CONNECT_REQUEST's id); NULL for an event of an
/// id already destroyed.
fn deliver(ev: CmEvent) -> *mut rdma_cm_event {
    let num = ev.id.id().0;
    let request = ev.event == EventType::ConnectRequest;
    // Under the registry's lock: find the ids and count the event against the one it is
    // reported on, so that no rdma_destroy_id frees that id before the event is acknowledged
    // (and none frees it while this thread fills it in below). A request's listener is read
    // here too, while it cannot go away.
    let (listen, mut id, counted) = ids(|r| {
        let listen = ev.listen_id.as_ref().and_then(|l| {
            r.by_num.get(&l.id().0).map(|&p| {
                // SAFETY: a live C id (in the registry, and freed only once out of it).
                let lw = unsafe { &*(p as *const IdW) };
                (p, lw.c.channel, lw.c.context, lw.c.ps)
            })
        });
        let id = r.by_num.get(&num).copied();
        let counted = if request { listen.map(|l| l.0) } else { id };
        if let Some(p) = counted {
            *r.unacked.entry(p).or_insert(0) += 1;
        }
        (listen, id, counted)
    });
    let Some(counted) = counted else {
        if trace() {
            eprintln!(
                "ferroce librdmacm: {} id {num} (no such id: dropped)",
                ev.event.as_str()
            );
        }
        return null_mut();
    };
    if request && id.is_none() {
        let Some((_, channel, context, ps)) = listen else {
            release(counted);
            return null_mut();
        };
        let w = new_idw(ev.id.clone(), channel, context, ps);
        // SAFETY: just made.
        unsafe {
            (*w).c.verbs = cm_ctx();
            (*w).c.port_num = 1;
            (*w).c.pd = cm_pd();
        }
        id = Some(w as usize);
    }
    let listen = listen.map(|l| l.0);
    if trace() {
        eprintln!(
            "ferroce librdmacm: {} id {} status {}{}",
            ev.event.as_str(),
            num,
            ev.status,
            if id.is_none() {
                " (no such id: dropped)"
            } else {
                ""
            }
        );
    }
    let Some(idp) = id else {
        release(counted);
        return null_mut();
    };
    // SAFETY: a live C id of this library (the event counts against it, or it is a
    // request's new id, which only this event names).
    let w = unsafe { &mut *(idp as *mut IdW) };
    if ev.event == EventType::Established && std::mem::take(&mut w.established_by_app) {
        release(counted);
        return null_mut();
    }
    if let Some(q) = ev.param.qp {
        w.conn_qp = Some(q);
    }
    if ev.event == EventType::ConnectRequest {
        if let (Some(q), Some(psn)) = (ev.param.qp_num, ev.param.starting_psn) {
            w.req = Some((
                q.get(),
                psn.get(),
                ev.param.initiator_depth,
                ev.param.responder_resources,
                ev.param.retry_count,
                ev.param.rnr_retry_count,
            ));
        }
    }
    w.refresh();
    w.refresh_qp_state();
    // SAFETY: plain C data.
    let mut c: rdma_cm_event = unsafe { std::mem::zeroed() };
    c.id = idp as *mut rdma_cm_id;
    c.listen_id = listen.map_or(null_mut(), |l| l as *mut rdma_cm_id);
    c.event = event_code(ev.event);
    c.status = ev.status;
    let mut b = Box::new(EvW { c, ev, counted });
    let p = &b.ev.param;
    let (pd, pdl) = (b.ev.private_data().as_ptr(), b.ev.private_data().len());
    let join = matches!(
        b.ev.event,
        EventType::MulticastJoin | EventType::MulticastError
    );
    if join {
        // librdmacm's: the group's address handle attributes, QPN 0xFFFFFF, the UDP Q_Key,
        // and the join's context as the private data.
        // SAFETY: plain C data.
        let mut ud: rdma_ud_param = unsafe { std::mem::zeroed() };
        if let Some((group, ctx)) = w.mc_pending.pop_front() {
            ud.private_data = ctx as *const c_void;
            ud.qp_num = 0xff_ffff;
            ud.qkey = RDMA_UDP_QKEY;
            ud.ah_attr.is_global = 1;
            ud.ah_attr.port_num = 1;
            ud.ah_attr.grh.dgid.raw = gid_of(group);
            ud.ah_attr.grh.sgid_index = b.ev.id.local_addr().map_or(0, |a| gid_index(a.ip()));
            ud.ah_attr.grh.hop_limit = 64;
        }
        b.c.param.ud = ud;
    } else if w.c.ps == RDMA_PS_UDP {
        // SAFETY: plain C data.
        let mut ud: rdma_ud_param = unsafe { std::mem::zeroed() };
        ud.private_data = pd as *const c_void;
        ud.private_data_len = pdl.min(255) as u8;
        ud.qp_num = p.qp_num.map_or(0, |q| q.get());
        ud.qkey = p.qkey.unwrap_or(RDMA_UDP_QKEY);
        if let (Some(l), Some(r)) = (
            b.ev.id.local_addr().map(|a| a.ip()),
            b.ev.id.peer_addr().map(|a| a.ip()),
        ) {
            ud.ah_attr.is_global = 1;
            ud.ah_attr.port_num = 1;
            ud.ah_attr.grh.dgid.raw = gid_of(r);
            ud.ah_attr.grh.sgid_index = gid_index(l);
            ud.ah_attr.grh.hop_limit = 64;
            // The route's traffic class (RDMA_OPTION_ID_TOS), as the kernel's path record.
            ud.ah_attr.grh.traffic_class = b.ev.id.route().map_or(0, |r| r.traffic_class);
        }
        b.c.param.ud = ud;
    } else {
        b.c.param.conn = rdma_conn_param {
            private_data: pd as *const c_void,
            private_data_len: pdl.min(255) as u8,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: 1,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq as u8,
            qp_num: p.qp_num.map_or(0, |q| q.get()),
        };
    }
    let e = Box::into_raw(b) as *mut rdma_cm_event;
    w.c.event = e;
    e
}

/// The next event of a channel: a stashed one first; waits unless the descriptor is
/// non-blocking. `Err(errno)` when there is none.
fn next_event(chw: &ChInner, wait: bool) -> Result<CmEvent, c_int> {
    if let Some(e) = lock(&chw.stash).pop_front() {
        return Ok(e);
    }
    if wait {
        chw.ch.get_cm_event(None).ok_or(ENODEV)
    } else {
        chw.ch.try_get_cm_event().ok_or(libc::EAGAIN)
    }
}

/// librdmacm's `rdma_get_cm_event` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_get_cm_event"]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    if event.is_null() {
        return fail(EINVAL);
    }
    // Its inner channel is held from here on: the program may destroy the channel while this
    // thread waits.
    let (chw, fd) = match live_channel(channel) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    // SAFETY: fcntl on the channel's own descriptor.
    let nonblock = unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    loop {
        let ev = match next_event(&chw, !nonblock) {
            Ok(e) => e,
            Err(e) => return fail(e),
        };
        let p = deliver(ev);
        if !p.is_null() {
            // SAFETY: the caller's out parameter.
            unsafe { *event = p };
            return 0;
        }
    }
}

/// librdmacm's `rdma_ack_cm_event` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_ack_cm_event"]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    if event.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: an event of this library, not used after this (librdmacm's contract).
    let b = unsafe { Box::from_raw(event as *mut EvW) };
    ids(|r| {
        if let Some(&idp) = r.by_num.get(&b.ev.id.id().0) {
            // SAFETY: a live C id (in the registry, so not freed while the lock is held).
            let w = unsafe { &mut *(idp as *mut IdW) };
            if w.c.event == event {
                w.c.event = null_mut();
            }
        }
    });
    release(b.counted);
    0
}

/// Wait on a synchronous id's channel for the next event of `id` (others are stashed), and
/// consume it: `Ok(event)` for the one wanted, `Err(errno)` otherwise.
fn sync_wait(w: &IdW, want: EventType) -> Result<CmEvent, c_int> {
    // A synchronous id's channel is its own, alive while the id is (unless the program
    // destroyed it: then EINVAL).
    let chw = live_channel(w.c.channel)?.0;
    let me = w.cmid()?.id();
    loop {
        let e = chw.ch.get_cm_event(None).ok_or(ENODEV)?;
        let mine = e.id.id() == me || e.listen_id.as_ref().is_some_and(|l| l.id() == me);
        if !mine {
            lock(&chw.stash).push_back(e);
            continue;
        }
        if e.event == want {
            return Ok(e);
        }
        return Err(match e.event {
            EventType::Rejected => libc::ECONNREFUSED,
            EventType::Unreachable => libc::ENETUNREACH,
            EventType::AddrError | EventType::RouteError => libc::EHOSTUNREACH,
            _ if e.status < 0 => -e.status,
            _ => libc::ECONNABORTED,
        });
    }
}

// ---- ids ------------------------------------------------------------------------------------------

/// librdmacm's `rdma_create_id` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_create_id"]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    if id.is_null() {
        return fail(EINVAL);
    }
    let Some(space) = port_space(ps) else {
        return fail(EOPNOTSUPP);
    };
    let (ch, own) = if channel.is_null() {
        match new_channel() {
            Ok(c) => (c, true),
            Err(e) => return fail(e),
        }
    } else {
        (channel as *mut ChW, false)
    };
    let cmid = match live_channel(ch as *mut rdma_event_channel) {
        Ok((inner, _)) => inner.ch.create_id(space),
        Err(e) => return fail(e),
    };
    let w = new_idw(cmid, ch as *mut rdma_event_channel, context, ps);
    // SAFETY: just made; the caller's out parameter.
    unsafe {
        (*w).own_channel = own;
        (*w).sync = own;
        *id = w as *mut rdma_cm_id;
    }
    0
}

/// librdmacm's `rdma_destroy_id` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_destroy_id"]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    if !live_id(id) {
        return fail(EINVAL);
    }
    let p = id as usize;
    // SAFETY: an id of this library, not used by the program after this.
    let w = unsafe { &mut *(id as *mut IdW) };
    if w.sync && !w.c.event.is_null() {
        // The event a synchronous call left in `id->event` (`hold_sync_event`).
        // SAFETY: an event of this id, never the program's to acknowledge.
        unsafe { rdma_ack_cm_event(w.c.event) };
    }
    let num = w.id.as_ref().map(|c| c.id().0);
    // Out of the registry first (no event reaches it after this), then wait until the events
    // counted against it are acknowledged, as librdmacm does: another thread may be handling
    // one (rping's CM thread takes DISCONNECTED while its main thread destroys the id), or
    // filling one in.
    {
        let mut g = lock(&IDS);
        let r = g.get_or_insert_with(Registry::default);
        r.live.remove(&p);
        if let Some(n) = num {
            if r.by_num.get(&n) == Some(&p) {
                r.by_num.remove(&n);
            }
        }
        let acked = crate::wait_until(g, &ACKED, DESTROY_WAIT, |r| {
            r.as_ref().is_none_or(|r| !r.unacked.contains_key(&p))
        })
        .1;
        if !acked && trace() {
            eprintln!(
                "ferroce librdmacm: rdma_destroy_id: events of the id still not \
                 acknowledged after {DESTROY_WAIT:?}; freed with the last one"
            );
        }
    }
    let mut r = Ok(());
    if let Some(cmid) = w.id.take() {
        // The application's QP stays the application's: librdmacm does not destroy it.
        cmid.detach_qp();
        let was = cmid.state();
        r = cmid.destroy();
        if matches!(
            was,
            Some(
                ferroce::runtime::cm::IdState::Connect | ferroce::runtime::cm::IdState::Disconnect
            )
        ) {
            flush();
        }
    }
    if w.own_channel {
        // SAFETY: the id's own channel, used by nothing else.
        unsafe { rdma_destroy_event_channel(w.c.channel) };
    }
    // Free it now, or (events still out) with the acknowledgement of the last one.
    let now = ids(|r| {
        if r.unacked.contains_key(&p) {
            r.zombies.insert(p);
            false
        } else {
            true
        }
    });
    if now {
        // SAFETY: out of the registry, no event counts against it: nothing refers to it.
        drop(unsafe { Box::from_raw(id as *mut IdW) });
    }
    ret(r)
}

/// librdmacm's `rdma_bind_addr` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_bind_addr"]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    if !live_id(id) {
        return fail(EINVAL);
    }
    // SAFETY: an id of this library; the caller's address.
    let (w, a) = unsafe { (idw(id), from_sockaddr(addr)) };
    let Some(a) = a else {
        return fail(libc::EAFNOSUPPORT);
    };
    if let Err(e) = bindable(a.ip()) {
        return fail(e);
    }
    let r = match w.cmid() {
        Ok(c) => c.bind_addr(a),
        Err(e) => return fail(e),
    };
    w.refresh();
    ret(r)
}

/// Whether the device serves `ip` (one of its GIDs).
fn served(ip: IpAddr) -> bool {
    let Ok(c) = cm() else { return false };
    // SAFETY: the CM's context, open for the process's lifetime.
    let port = &unsafe { verbs::sh(c.ctx as *mut ibv_context) }.port;
    port.gids()
        .iter()
        .any(|g| g.to_canonical() == ip.to_canonical())
}

/// Whether an id may bind `ip`: the wildcard, an address the device serves (its GIDs; the
/// UDP backend serves its one address), or a loopback address, which binds without a device
/// (`id->verbs` stays NULL). Another local address, of no RDMA device, is refused with
/// `ENODEV`, an address that is not the host's with `EADDRNOTAVAIL`. libfabric's verbs
/// provider relies on both: it binds each of the host's addresses to find those with a
/// device, and binds "localhost" for a server's default source, then takes the device's
/// addresses when that id has no device; an id attached to the device there made every peer
/// connect to 127.0.0.1.
fn bindable(ip: IpAddr) -> Result<(), c_int> {
    if ip.is_unspecified() || ip.to_canonical().is_loopback() || served(ip) {
        return Ok(());
    }
    // A UDP socket binds to an address exactly when it is one of the host's.
    if std::net::UdpSocket::bind((ip.to_canonical(), 0)).is_ok() {
        Err(libc::ENODEV)
    } else {
        Err(libc::EADDRNOTAVAIL)
    }
}

/// librdmacm's `rdma_resolve_addr` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_resolve_addr"]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut sockaddr,
    dst: *mut sockaddr,
    timeout_ms: c_int,
) -> c_int {
    if !live_id(id) {
        return fail(EINVAL);
    }
    // SAFETY: an id of this library; the caller's addresses.
    let (w, s, d) = unsafe { (idw(id), from_sockaddr(src), from_sockaddr(dst)) };
    let Some(d) = d else {
        return fail(libc::EAFNOSUPPORT);
    };
    let t = Duration::from_millis(timeout_ms.max(1) as u64);
    let r = match w.cmid() {
        Ok(c) => c.resolve_addr(s, d, t),
        Err(e) => return fail(e),
    };
    if r.is_ok() && w.sync {
        return match sync_wait(w, EventType::AddrResolved) {
            Ok(_) => {
                w.refresh();
                0
            }
            Err(e) => fail(e),
        };
    }
    ret(r)
}

/// librdmacm's `rdma_resolve_route` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_resolve_route"]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int {
    if !live_id(id) {
        return fail(EINVAL);
    }
    // SAFETY: an id of this library.
    let w = unsafe { idw(id) };
    let t = Duration::from_millis(timeout_ms.max(1) as u64);
    let r = match w.cmid() {
        Ok(c) => c.resolve_route(t),
        Err(e) => return fail(e),
    };
    if r.is_ok() && w.sync {
        return match sync_wait(w, EventType::RouteResolved) {
            Ok(_) => {
                w.refresh();
                0
            }
            Err(e) => fail(e),
        };
    }
    ret(r)
}

// ---- QPs ---------------------------------------------------------------------------------------------

/// A completion channel and a CQ of `n` entries on the CM's context, whose `cq_context` is
/// the id (librdmacm's `rdma_get_recv_comp`/`rdma_get_send_comp` check it).
fn cq_with_channel(
    n: u32,
    id: *mut rdma_cm_id,
) -> Result<(*mut ibv_comp_channel, *mut ibv_cq), c_int> {
    let ctx = cm_ctx();
    // SAFETY: the CM's context.
    let ch = unsafe { verbs::ibv_create_comp_channel(ctx) };
    if ch.is_null() {
        return Err(ENOMEM);
    }
    // SAFETY: as above, with the channel just made.
    let cq = unsafe { verbs::ibv_create_cq(ctx, n.max(1) as c_int, id as *mut c_void, ch, 0) };
    if cq.is_null() {
        // SAFETY: the channel just made, bound to nothing.
        unsafe { verbs::ibv_destroy_comp_channel(ch) };
        return Err(ENOMEM);
    }
    Ok((ch, cq))
}

/// Bring a UD QP to RTS with librdmacm's Q_Key (`RDMA_UDP_QKEY`), as librdmacm does for ids
/// of `RDMA_PS_UDP`.
fn ud_to_rts(qp: *mut ibv_qp) -> c_int {
    for (state, mask) in [
        (1, 1 | 16 | 32 | 64), // INIT: state, pkey index, port, qkey
        (2, 1),                // RTR
        (3, 1 | 65536),        // RTS: state, sq_psn
    ] {
        // SAFETY: plain C data.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = state;
        a.port_num = 1;
        a.qkey = RDMA_UDP_QKEY;
        // SAFETY: a QP of this library and a local attribute struct.
        let r = unsafe { verbs::ibv_modify_qp(qp, &mut a, mask) };
        if r != 0 {
            return r;
        }
    }
    0
}

/// librdmacm's `rdma_create_qp` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_create_qp"]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    if !live_id(id) || attr.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: an id of this library; the caller's attributes.
    let (w, a) = unsafe { (idw(id), &mut *attr) };
    let Ok(cmid) = w.cmid().cloned() else {
        return fail(EINVAL);
    };
    if !w.c.qp.is_null() {
        return fail(EINVAL);
    }
    let mut pd = if pd.is_null() { w.c.pd } else { pd };
    if pd.is_null() {
        pd = cm_pd();
        if pd.is_null() {
            return -1;
        }
    }
    if a.send_cq.is_null() || a.recv_cq.is_null() {
        // librdmacm makes the CQs the application did not give, each with a channel.
        if w.c.send_cq.is_null() {
            let (sch, scq) = match cq_with_channel(a.cap.max_send_wr, id) {
                Ok(x) => x,
                Err(e) => return fail(e),
            };
            let (rch, rcq) = match cq_with_channel(a.cap.max_recv_wr, id) {
                Ok(x) => x,
                Err(e) => return fail(e),
            };
            w.c.send_cq_channel = sch;
            w.c.send_cq = scq;
            w.c.recv_cq_channel = rch;
            w.c.recv_cq = rcq;
            w.made_cqs = true;
        }
        if a.send_cq.is_null() {
            a.send_cq = w.c.send_cq;
        }
        if a.recv_cq.is_null() {
            a.recv_cq = w.c.recv_cq;
        }
    }
    if a.srq.is_null() {
        a.srq = w.c.srq;
    }
    let ud = w.c.ps == RDMA_PS_UDP;
    a.qp_type = if ud {
        4
    } else if xrc_id(&w.c) {
        w.c.qp_type
    } else {
        2
    };
    let qp = if a.qp_type == IBV_QPT_XRC_RECV {
        // A target QP in the CM device's XRC domain (librdmacm's `ucma_get_xrcd`).
        let x = cm_xrcd();
        if x.is_null() {
            return -1;
        }
        // SAFETY: plain C data.
        let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        ex.qp_context = a.qp_context;
        ex.qp_type = IBV_QPT_XRC_RECV;
        ex.comp_mask = IBV_QP_INIT_ATTR_XRCD;
        ex.xrcd = x;
        // SAFETY: the CM's context and a domain of this library.
        unsafe { verbs::create_xrc_recv_qp(cm_ctx(), &mut ex) }
    } else {
        if a.qp_type == IBV_QPT_XRC_SEND {
            a.srq = null_mut();
        }
        // SAFETY: a PD of this library and the caller's attributes, CQs filled in.
        unsafe { verbs::ibv_create_qp(pd, attr) }
    };
    if qp.is_null() {
        return -1;
    }
    // SAFETY: a QP just made by this library.
    let qpn = unsafe { (*(qp as *mut QpW)).qpn };
    if ud {
        let r = ud_to_rts(qp);
        if r != 0 {
            // SAFETY: the QP just made.
            unsafe { verbs::ibv_destroy_qp(qp) };
            return fail(r);
        }
        w.ud_qp = Some(qpn);
    } else if let Err(e) = cmid.attach_qp(qpn) {
        // SAFETY: the QP just made.
        unsafe { verbs::ibv_destroy_qp(qp) };
        return fail(errno_of(&e));
    }
    w.c.qp = qp;
    w.c.pd = pd;
    w.refresh_qp_state();
    0
}

/// librdmacm's `rdma_create_qp_ex` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_create_qp_ex"]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    if !live_id(id) || attr.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    // Only the PD: not the extended send API (IBV_QP_INIT_ATTR_SEND_OPS_FLAGS), XRC, RSS.
    if a.comp_mask & !IBV_QP_INIT_ATTR_PD != 0 {
        return fail(EOPNOTSUPP);
    }
    let mut b = a.base();
    let pd = if a.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
        a.pd
    } else {
        null_mut()
    };
    // SAFETY: forwarded.
    let r = unsafe { rdma_create_qp(id, pd, &mut b) };
    if r == 0 {
        a.send_cq = b.send_cq;
        a.recv_cq = b.recv_cq;
        a.cap = b.cap;
    }
    r
}

/// librdmacm's `rdma_destroy_qp` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_destroy_qp"]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    if !live_id(id) {
        return;
    }
    // SAFETY: an id of this library.
    let w = unsafe { idw(id) };
    if let Some(c) = w.id.as_ref() {
        c.detach_qp();
    }
    w.ud_qp = None;
    if !w.c.qp.is_null() {
        // SAFETY: the id's QP, not used after this.
        unsafe { verbs::ibv_destroy_qp(w.c.qp) };
        w.c.qp = null_mut();
    }
    if w.made_cqs {
        // SAFETY: the CQs and channels rdma_create_qp made for this id.
        unsafe {
            verbs::ibv_destroy_cq(w.c.send_cq);
            verbs::ibv_destroy_cq(w.c.recv_cq);
            verbs::ibv_destroy_comp_channel(w.c.send_cq_channel);
            verbs::ibv_destroy_comp_channel(w.c.recv_cq_channel);
        }
        w.c.send_cq = null_mut();
        w.c.recv_cq = null_mut();
        w.c.send_cq_channel = null_mut();
        w.c.recv_cq_channel = null_mut();
        w.made_cqs = false;
    }
}

/// librdmacm's `rdma_init_qp_attr` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_init_qp_attr"]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    if !live_id(id) || attr.is_null() || mask.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: an id of this library; the caller's in/out structures.
    let (w, a) = unsafe { (idw(id), &mut *attr) };
    // The state asked for is the caller's `qp_state` (as the kernel's CM reads it).
    let want = a.qp_state;
    // SAFETY: plain C data.
    *a = unsafe { std::mem::zeroed() };
    a.qp_state = want;
    a.port_num = 1;
    use ferroce::verbs::QpAttrMask as M;
    let m = match want {
        // INIT (and RESET, whose attributes librdmacm gives as INIT's).
        0 | 1 => {
            a.qp_state = 1;
            if w.c.ps == RDMA_PS_UDP {
                a.qkey = RDMA_UDP_QKEY;
                M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY
            } else {
                a.qp_access_flags = 1 | 2 | 4 | 8;
                M::STATE | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PORT
            }
        }
        2 | 3 if w.c.ps == RDMA_PS_UDP => {
            a.sq_psn = w.my_psn;
            if want == 2 {
                M::STATE
            } else {
                M::STATE | M::SQ_PSN
            }
        }
        2 => {
            let route = w.id.as_ref().and_then(|c| c.route());
            let local = w.id.as_ref().and_then(|c| c.local_addr()).map(|s| s.ip());
            a.min_rnr_timer = 12;
            a.ah_attr.is_global = 1;
            a.ah_attr.port_num = 1;
            a.ah_attr.grh.sgid_index = local.map_or(0, gid_index);
            if let Some(q) = w.conn_qp {
                a.dest_qp_num = q.remote_qpn.get();
                a.rq_psn = q.rq_psn.get();
                a.path_mtu = c_int::from(q.path_mtu.0);
                a.max_dest_rd_atomic = q.max_dest_rd_atomic;
                a.ah_attr.grh.dgid.raw = q.remote_gid.0;
                // (A route's hop limit; a REQ/REP-derived 0 would keep packets in.)
                a.ah_attr.grh.hop_limit = if q.hop_limit == 0 { 64 } else { q.hop_limit };
                a.ah_attr.grh.traffic_class = q.traffic_class;
                a.ah_attr.grh.flow_label = q.flow_label;
            } else if let (Some((qpn, psn, depth, ..)), Some(r)) = (w.req, route) {
                a.dest_qp_num = qpn;
                a.rq_psn = psn;
                a.path_mtu = c_int::from(r.path_mtu.0);
                a.max_dest_rd_atomic = depth;
                a.ah_attr.grh.dgid.raw = r.remote_gid.0;
                a.ah_attr.grh.hop_limit = r.hop_limit;
                a.ah_attr.grh.traffic_class = r.traffic_class;
                a.ah_attr.grh.flow_label = r.flow_label;
            } else {
                // No connection yet: nothing to be ready to receive from.
                return fail(EINVAL);
            }
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER
        }
        3 => {
            if let Some(q) = w.conn_qp {
                a.sq_psn = q.sq_psn.get();
                a.timeout = q.local_ack_timeout;
                a.retry_cnt = q.retry_count;
                a.rnr_retry = q.rnr_retry_count;
                a.max_rd_atomic = q.max_rd_atomic;
            } else if let Some((_, _, _, resources, retry, rnr)) = w.req {
                a.sq_psn = w.my_psn;
                a.timeout = 14;
                a.retry_cnt = retry;
                a.rnr_retry = rnr;
                a.max_rd_atomic = resources;
            } else {
                return fail(EINVAL);
            }
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC
        }
        _ => return fail(EINVAL),
    };
    if trace() {
        eprintln!(
            "ferroce librdmacm: rdma_init_qp_attr state {} mask {:#x}: dest_qp {:#x} rq_psn {:#x} sq_psn {:#x} mtu {} rd {}/{} retry {}/{} hop {}",
            a.qp_state, m.bits(), a.dest_qp_num, a.rq_psn, a.sq_psn, a.path_mtu, a.max_rd_atomic,
            a.max_dest_rd_atomic, a.retry_cnt, a.rnr_retry, a.ah_attr.grh.hop_limit
        );
    }
    // SAFETY: the caller's out parameter.
    unsafe { *mask = m.bits() as c_int };
    0
}

// ---- connections ------------------------------------------------------------------------------------

/// The runtime's connection parameters from C's (NULL: librdmacm's defaults).
///
/// # Safety
/// `p` is NULL or the caller's parameters, its private data `private_data_len` bytes.
unsafe fn conn_param<'a>(p: *const rdma_conn_param, qpn: u32) -> ConnParam<'a> {
    let mut c = ConnParam::new(QpNumber::new(qpn), Psn::new(0), &[]);
    if p.is_null() {
        return c;
    }
    // SAFETY: the caller's parameters.
    let p = unsafe { &*p };
    if !p.private_data.is_null() && p.private_data_len > 0 {
        // SAFETY: as promised.
        c.private_data = unsafe {
            std::slice::from_raw_parts(p.private_data as *const u8, p.private_data_len as usize)
        };
    }
    c.responder_resources = p.responder_resources;
    c.initiator_depth = p.initiator_depth;
    c.retry_count = p.retry_count.min(7);
    c.rnr_retry_count = p.rnr_retry_count.min(7);
    c.srq = p.srq != 0;
    if qpn == 0 {
        c.qp_num = QpNumber::new(p.qp_num);
    }
    c
}

/// `RDMA_MAX_RESP_RES` and `RDMA_MAX_INIT_DEPTH` (rdma_cma.h): as many READ/atomic requests
/// as the device allows.
const RDMA_MAX_DEPTH: u8 = 0xff;

/// librdmacm's reading of a connection's READ/atomic depths (RC): `RDMA_MAX_*` (0xff), or no
/// parameters at all, asks for the device's maximum, and on the passive side for at most what
/// the request offered (`offered`: the request event's initiator depth and responder
/// resources); any other value above the device's maximum is refused with `EINVAL`.
/// libfabric's verbs provider connects and accepts with 0xff for both.
fn resolve_depths(
    cp: &mut ConnParam<'_>,
    given: bool,
    offered: Option<(u8, u8)>,
) -> Result<(), c_int> {
    let a = cm()?.svc.nic().query_device();
    let dev = |v: u32| u8::try_from(v).unwrap_or(u8::MAX - 1);
    let (max_resp, max_init) = (dev(a.max_qp_rd_atom), dev(a.max_qp_init_rd_atom));
    if given
        && ((cp.responder_resources != RDMA_MAX_DEPTH && cp.responder_resources > max_resp)
            || (cp.initiator_depth != RDMA_MAX_DEPTH && cp.initiator_depth > max_init))
    {
        return Err(EINVAL);
    }
    let (offered_init, offered_resp) = offered.unwrap_or((max_init, max_resp));
    if !given || cp.initiator_depth == RDMA_MAX_DEPTH {
        cp.initiator_depth = offered_init.min(max_init);
    }
    if !given || cp.responder_resources == RDMA_MAX_DEPTH {
        cp.responder_resources = offered_resp.min(max_resp);
    }
    Ok(())
}

/// librdmacm's `rdma_connect` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_connect"]
pub unsafe extern "C" fn rdma_connect(id: *mut rdma_cm_id, p: *mut rdma_conn_param) -> c_int {
    if !live_id(id) {
        return fail(EINVAL);
    }
    // SAFETY: an id of this library.
    let w = unsafe { idw(id) };
    // SAFETY: the caller's parameters.
    let mut cp = unsafe { conn_param(p, w.ud_qp.map_or(0, |q| q.get())) };
    if w.c.ps == RDMA_PS_TCP {
        if let Err(e) = resolve_depths(&mut cp, !p.is_null(), None) {
            return fail(e);
        }
    }
    // A QP the program moves itself starts at the PSN rdma_init_qp_attr gives it (the CM
    // picks its own for a QP it holds).
    cp.starting_psn = Psn::new(w.my_psn);
    let r = match w.cmid() {
        Ok(c) => c.connect(&cp),
        Err(e) => return fail(e),
    };
    if r.is_ok() && w.sync {
        return match sync_wait(w, EventType::Established) {
            Ok(ev) => {
                w.refresh();
                w.refresh_qp_state();
                hold_sync_event(w.c.event, ev);
                0
            }
            Err(e) => fail(e),
        };
    }
    ret(r)
}

/// librdmacm's `rdma_establish` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_establish"]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    if !live_id(id) {
        return fail(EINVAL);
    }
    // SAFETY: an id of this library.
    let w = unsafe { idw(id) };
    w.established_by_app = true;
    match w.cmid() {
        Ok(c) => ret(c.establish()),
        Err(e) => {
            w.established_by_app = false;
            fail(e)
        }
    }
}

/// librdmacm's `rdma_listen` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_listen"]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    if !live_id(id) {
        return fail(EINVAL);
    }
    // SAFETY: an id of this library.
    let r = match unsafe { idw(id) }.cmid() {
        Ok(c) => c.listen(if backlog <= 0 { 1024 } else { backlog as usize }),
        Err(e) => return fail(e),
    };
    if r.is_ok() {
        // FERROCE_LISTENING=FILE: say "listening" in FILE once an id listens, so that a script
        // starts its client when the server is ready (a client whose REQ comes first is
        // rejected, as with the kernel's CM).
        if let Some(f) = std::env::var_os("FERROCE_LISTENING").filter(|f| !f.is_empty()) {
            let _ = std::fs::write(f, "listening\n");
        }
    }
    ret(r)
}

/// librdmacm's `rdma_get_request` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_get_request"]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    if !live_id(listen) || id.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: an id of this library.
    let lw = unsafe { idw(listen) };
    if !lw.own_channel {
        return fail(EINVAL);
    }
    let ev = match sync_wait(lw, EventType::ConnectRequest) {
        Ok(e) => e,
        Err(e) => return fail(e),
    };
    let e = deliver(ev);
    if e.is_null() {
        return fail(libc::ECONNABORTED);
    }
    // SAFETY: the event just made; its id is the new id.
    let new = unsafe { (*e).id };
    // SAFETY: as above; the event is not handed out.
    unsafe { rdma_ack_cm_event(e) };
    // SAFETY: the new id; it inherits the listener's synchronous channel.
    let nw = unsafe { idw(new) };
    nw.sync = true;
    if !lw.c.pd.is_null() {
        nw.c.pd = lw.c.pd;
    }
    nw.c.srq = lw.c.srq;
    if xrc_id(&lw.c) {
        nw.c.qp_type = lw.c.qp_type;
    }
    if let Some((pd, mut a)) = lw.ep_qp_attr {
        // SAFETY: the listener's PD (or NULL) and a copy of its QP attributes.
        if unsafe { rdma_create_qp(new, pd as *mut ibv_pd, &mut a) } != 0 {
            let e = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(EINVAL);
            // SAFETY: the new id, not handed out.
            let _ = unsafe { rdma_reject(new, std::ptr::null(), 0) };
            return fail(e);
        }
    }
    // SAFETY: the caller's out parameter.
    unsafe { *id = new };
    0
}

/// librdmacm's `rdma_accept` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_accept"]
pub unsafe extern "C" fn rdma_accept(id: *mut rdma_cm_id, p: *mut rdma_conn_param) -> c_int {
    if !live_id(id) {
        return fail(EINVAL);
    }
    // SAFETY: an id of this library.
    let w = unsafe { idw(id) };
    // SAFETY: the caller's parameters.
    let mut cp = unsafe { conn_param(p, w.ud_qp.map_or(0, |q| q.get())) };
    if w.c.ps == RDMA_PS_TCP {
        let offered = w.req.map(|r| (r.2, r.3));
        if let Err(e) = resolve_depths(&mut cp, !p.is_null(), offered) {
            return fail(e);
        }
    }
    cp.qkey = RDMA_UDP_QKEY;
    cp.starting_psn = Psn::new(w.my_psn);
    let r = match w.cmid() {
        Ok(c) => c.accept(&cp),
        Err(e) => return fail(e),
    };
    w.refresh_qp_state();
    if w.c.ps == RDMA_PS_UDP {
        // A SIDR_REP leaves before the call returns, as the REJ above.
        flush();
    }
    // A synchronous id (from rdma_get_request) waits for the connection.
    if r.is_ok() && w.sync && w.c.ps == RDMA_PS_TCP {
        return match sync_wait(w, EventType::Established) {
            Ok(ev) => {
                w.refresh_qp_state();
                hold_sync_event(w.c.event, ev);
                0
            }
            Err(e) => fail(e),
        };
    }
    ret(r)
}

/// librdmacm's `rdma_reject` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_reject"]
pub unsafe extern "C" fn rdma_reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    if !live_id(id) {
        return fail(EINVAL);
    }
    let pd: &[u8] = if data.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: the caller's private data of `len` bytes.
        unsafe { std::slice::from_raw_parts(data as *const u8, len as usize) }
    };
    // SAFETY: an id of this library.
    let r = match unsafe { idw(id) }.cmid() {
        Ok(c) => c.reject(pd),
        Err(e) => return fail(e),
    };
    // The REJ leaves before the call returns, as the kernel's CM sends it whatever the
    // process does next: a server that rejects and exits at once (without exit handlers: a
    // Python multiprocessing child ends in _exit) would otherwise take it along, and the
    // client's CM, sending its REQ again, would get another program's answer (rdma-core's
    // test_rdmacm_async_reject_traffic, 2 runs in 14: a REJ without the private data).
    flush();
    ret(r)
}

/// librdmacm's `rdma_reject_ece` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_reject_ece"]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    data: *const c_void,
    len: u8,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { rdma_reject(id, data, len) }
}

/// librdmacm's `rdma_disconnect` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_disconnect"]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    if !live_id(id) {
        return fail(EINVAL);
    }
    // SAFETY: an id of this library.
    let w = unsafe { idw(id) };
    if trace() {
        eprintln!(
            "ferroce librdmacm: rdma_disconnect id {:?}",
            w.id.as_ref().map(|c| c.id().0)
        );
    }
    let r = match w.cmid() {
        Ok(c) => c.disconnect(),
        Err(e) => return fail(e),
    };
    w.refresh_qp_state();
    flush();
    ret(r)
}

/// librdmacm's `rdma_notify` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_notify"]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    if !live_id(id) {
        return fail(EINVAL);
    }
    0
}

/// librdmacm's `rdma_set_option` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_set_option"]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: usize,
) -> c_int {
    if !live_id(id) || val.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: an id of this library.
    let w = unsafe { idw(id) };
    let Ok(cmid) = w.cmid() else {
        return fail(EINVAL);
    };
    // The kernel's checks (ucma_set_option_id): each option's value has its exact size.
    let u8_val = || {
        // SAFETY: the caller's value, `len` bytes (checked to be one).
        (len == 1).then(|| unsafe { *(val as *const u8) })
    };
    match (level, name) {
        // RDMA_OPTION_ID_TOS: the IP TOS byte (the GRH traffic class) of the route and of the
        // connection's packets (perftest's --tos).
        (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => match u8_val() {
            Some(t) => {
                let r = ret(cmid.set_tos(t));
                w.refresh();
                r
            }
            None => fail(EINVAL),
        },
        // RDMA_OPTION_ID_ACK_TIMEOUT: the QP's Local ACK Timeout exponent.
        (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => match u8_val() {
            Some(t) => ret(cmid.set_ack_timeout(t)),
            None => fail(EINVAL),
        },
        // RDMA_OPTION_ID_REUSEADDR, _AFONLY: an int. Ports here are the process's own
        // (one CM per process), so reuse changes nothing; an IPv6 id binds IPv6 only.
        (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY) => {
            if len == size_of::<c_int>() {
                0
            } else {
                fail(EINVAL)
            }
        }
        // RDMA_OPTION_IB_PATH: path records from an SA or ibacm, as the kernel's
        // ucma_set_ib_path: an array of `struct ibv_path_data` (EINVAL for a length that is
        // not a multiple of it), the primary bidirectional GMP path used (EINVAL when there
        // is none), only once the address is resolved; ROUTE_RESOLVED follows.
        (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {
            let n = size_of::<ibv_path_data>();
            if len == 0 || len % n != 0 {
                return fail(EINVAL);
            }
            // SAFETY: the caller's array of `len / n` path data (4-byte aligned as C's).
            let paths = unsafe { std::slice::from_raw_parts(val as *const ibv_path_data, len / n) };
            let want = IBV_PATH_FLAG_GMP | IBV_PATH_FLAG_PRIMARY | IBV_PATH_FLAG_BIDIRECTIONAL;
            let Some(p) = paths.iter().find(|p| p.flags == want) else {
                return fail(EINVAL);
            };
            let r = &p.path;
            let gid = |o: usize| {
                let mut g = [0u8; 16];
                g.copy_from_slice(&r[o..o + 16]);
                ferroce::wire::mad::Gid(g)
            };
            let flh = u32::from_be_bytes([
                r[PATH_REC_FLOWLABEL_HOPLIMIT],
                r[PATH_REC_FLOWLABEL_HOPLIMIT + 1],
                r[PATH_REC_FLOWLABEL_HOPLIMIT + 2],
                r[PATH_REC_FLOWLABEL_HOPLIMIT + 3],
            ]);
            let mtu = ferroce::wire::mad::cm::PathMtu(r[PATH_REC_MTU] & 0x3f);
            if mtu.bytes().is_none() {
                return fail(EINVAL);
            }
            let route = ferroce::cm::rdma::Route {
                local_gid: gid(PATH_REC_SGID),
                remote_gid: gid(PATH_REC_DGID),
                path_mtu: mtu,
                hop_limit: flh as u8,
                traffic_class: r[PATH_REC_TCLASS],
                flow_label: (flh >> 8) & 0xf_ffff,
            };
            let r = ret(cmid.set_route(route));
            w.refresh();
            r
        }
        _ => fail(ENOSYS),
    }
}

/// librdmacm's `rdma_migrate_id` (`librdmacm.so.1` forwards to it): the id's events,
/// those already waiting included, go to `channel` from now on; a NULL channel makes the id
/// synchronous on a channel of its own. A synchronous id's old channel (its own) is
/// destroyed, with the event it last returned acknowledged, as librdmacm does.
#[export_name = "ferroce_rdma_migrate_id"]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    if !live_id(id) {
        return fail(EINVAL);
    }
    // SAFETY: an id of this library.
    let w = unsafe { &mut *(id as *mut IdW) };
    let Ok(cmid) = w.cmid().cloned() else {
        return fail(EINVAL);
    };
    let (to, sync) = if channel.is_null() {
        match new_channel() {
            Ok(c) => (c, true),
            Err(e) => return fail(e),
        }
    } else {
        (channel as *mut ChW, false)
    };
    if to as *mut rdma_event_channel == w.c.channel {
        return 0;
    }
    // The target must be a live channel; the id's current one is alive while the id is,
    // unless the program destroyed it early (its stash is then gone with it).
    let new = match live_channel(to as *mut rdma_event_channel) {
        Ok((inner, _)) => inner,
        Err(e) => return fail(e),
    };
    let old = live_channel(w.c.channel).ok().map(|c| c.0);
    if let Err(e) = cmid.migrate(&new.ch) {
        if sync {
            // SAFETY: the channel made above, used by nothing else.
            unsafe { rdma_destroy_event_channel(to as *mut rdma_event_channel) };
        }
        return fail(errno_of(&e));
    }
    // Events a synchronous call set aside on the old channel follow the id too.
    let me = cmid.id();
    if let Some(old) = old {
        let mut stash = lock(&old.stash);
        let (mine, rest): (VecDeque<CmEvent>, VecDeque<CmEvent>) = stash
            .drain(..)
            .partition(|e| e.id.id() == me || e.listen_id.as_ref().is_some_and(|l| l.id() == me));
        *stash = rest;
        lock(&new.stash).extend(mine);
    }
    if w.own_channel {
        if !w.c.event.is_null() {
            // SAFETY: the event this library returned last for the id, not yet acknowledged.
            unsafe { rdma_ack_cm_event(w.c.event) };
            w.c.event = null_mut();
        }
        // SAFETY: the id's own channel, used by nothing else.
        unsafe { rdma_destroy_event_channel(w.c.channel) };
    }
    w.own_channel = sync;
    w.sync = sync;
    w.c.channel = to as *mut rdma_event_channel;
    0
}

/// librdmacm's `rdma_get_src_port` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_get_src_port"]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    if !live_id(id) {
        return 0;
    }
    // SAFETY: an id of this library.
    let w = unsafe { idw(id) };
    w.id.as_ref()
        .and_then(|c| c.local_addr())
        .map_or(0, |a| a.port().to_be())
}

/// librdmacm's `rdma_get_dst_port` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_get_dst_port"]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    if !live_id(id) {
        return 0;
    }
    // SAFETY: an id of this library.
    let w = unsafe { idw(id) };
    w.id.as_ref()
        .and_then(|c| c.peer_addr())
        .map_or(0, |a| a.port().to_be())
}

// ---- SRQs ----------------------------------------------------------------------------------------------

/// librdmacm's `rdma_create_srq` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_create_srq"]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    if !live_id(id) || attr.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: an id of this library.
    let w = unsafe { idw(id) };
    let mut pd = if pd.is_null() { w.c.pd } else { pd };
    if pd.is_null() {
        pd = cm_pd();
        if pd.is_null() {
            return -1;
        }
    }
    let srq = if w.c.qp_type == IBV_QPT_XRC_RECV {
        // An XRC SRQ in the CM device's domain, completing on the id's receive CQ (made
        // here if the id has none), as librdmacm makes it for an XRC id.
        let x = cm_xrcd();
        if x.is_null() {
            return -1;
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &mut *attr };
        if w.c.recv_cq.is_null() {
            let (ch, cq) = match cq_with_channel(a.attr.max_wr, id) {
                Ok(x) => x,
                Err(e) => return fail(e),
            };
            w.c.recv_cq_channel = ch;
            w.c.recv_cq = cq;
        }
        // SAFETY: plain C data.
        let mut ex: ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
        ex.srq_context = a.srq_context;
        ex.attr = a.attr;
        ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE
            | IBV_SRQ_INIT_ATTR_PD
            | IBV_SRQ_INIT_ATTR_XRCD
            | IBV_SRQ_INIT_ATTR_CQ;
        ex.srq_type = IBV_SRQT_XRC;
        ex.pd = pd;
        ex.xrcd = x;
        ex.cq = w.c.recv_cq;
        // SAFETY: the CM's context, objects of this library.
        let s = unsafe { verbs::create_srq_ex(cm_ctx(), &mut ex) };
        a.attr = ex.attr;
        s
    } else {
        // SAFETY: a PD of this library and the caller's attributes.
        unsafe { verbs::ibv_create_srq(pd, attr) }
    };
    if srq.is_null() {
        return -1;
    }
    w.c.srq = srq;
    w.c.pd = pd;
    0
}

/// librdmacm's `rdma_create_srq_ex` (`librdmacm.so.1` forwards to it): as librdmacm, the
/// type must be given (EINVAL otherwise) and a missing PD is the id's (or a new one). Basic
/// SRQs only: XRC and tag-matching SRQs, and a completion queue or XRC domain in the mask,
/// are EOPNOTSUPP, as on a provider without `create_srq_ex`.
#[export_name = "ferroce_rdma_create_srq_ex"]
pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    if !live_id(id) || attr.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 {
        return fail(EINVAL);
    }
    if a.srq_type != IBV_SRQT_BASIC
        || a.comp_mask & !(IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD) != 0
    {
        return fail(EOPNOTSUPP);
    }
    let pd = if a.comp_mask & IBV_SRQ_INIT_ATTR_PD != 0 {
        a.pd
    } else {
        null_mut()
    };
    let mut basic = ibv_srq_init_attr {
        srq_context: a.srq_context,
        attr: a.attr,
    };
    // SAFETY: an id of this library; the basic attributes just made.
    let r = unsafe { rdma_create_srq(id, pd, &mut basic) };
    if r == 0 {
        // What the SRQ got (rdma-core's providers write back the actual sizes), and the PD.
        a.attr = basic.attr;
        // SAFETY: an id of this library.
        a.pd = unsafe { idw(id) }.c.pd;
        a.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    }
    r
}

/// librdmacm's `rdma_destroy_srq` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_destroy_srq"]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    if !live_id(id) {
        return;
    }
    // SAFETY: an id of this library.
    let w = unsafe { idw(id) };
    if !w.c.srq.is_null() {
        // SAFETY: the id's SRQ, not used after this.
        unsafe { verbs::ibv_destroy_srq(w.c.srq) };
        w.c.srq = null_mut();
    }
}

// ---- endpoints (the synchronous API) --------------------------------------------------------------------

/// librdmacm's `rdma_create_ep` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_create_ep"]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_attr: *mut ibv_qp_init_attr,
) -> c_int {
    if id.is_null() || res.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: the caller's address information.
    let r = unsafe { &*res };
    let ps = if r.ai_port_space != 0 {
        r.ai_port_space
    } else if r.ai_qp_type == 4 {
        RDMA_PS_UDP
    } else {
        RDMA_PS_TCP
    };
    let mut new: *mut rdma_cm_id = null_mut();
    // SAFETY: a NULL channel: a synchronous id.
    if unsafe { rdma_create_id(null_mut(), &mut new, null_mut(), ps) } != 0 {
        return -1;
    }
    let passive = r.ai_flags & RAI_PASSIVE != 0;
    // SAFETY: the id just made; the caller's addresses.
    let st = unsafe {
        if passive {
            rdma_bind_addr(new, r.ai_src_addr)
        } else {
            let s = rdma_resolve_addr(new, r.ai_src_addr, r.ai_dst_addr, 2000);
            if s == 0 {
                rdma_resolve_route(new, 2000)
            } else {
                s
            }
        }
    };
    if st != 0 {
        let e = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(EINVAL);
        // SAFETY: the id just made.
        unsafe { rdma_destroy_id(new) };
        return fail(e);
    }
    // SAFETY: the id just made.
    let w = unsafe { idw(new) };
    w.c.pd = pd;
    if matches!(r.ai_qp_type, IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV) {
        // The id's QPs are of that XRC half (librdmacm's `rdma_create_id2` with the type).
        w.c.qp_type = r.ai_qp_type;
    }
    if !qp_attr.is_null() {
        if passive {
            // SAFETY: the caller's attributes, copied for each request's id.
            w.ep_qp_attr = Some((pd as usize, unsafe { std::ptr::read(qp_attr) }));
        } else {
            // SAFETY: the id just made and the caller's attributes.
            if unsafe { rdma_create_qp(new, pd, qp_attr) } != 0 {
                let e = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(EINVAL);
                // SAFETY: the id just made.
                unsafe { rdma_destroy_id(new) };
                return fail(e);
            }
        }
    }
    // SAFETY: the caller's out parameter.
    unsafe { *id = new };
    0
}

/// librdmacm's `rdma_destroy_ep` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_destroy_ep"]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    if !live_id(id) {
        return;
    }
    // SAFETY: an id of this library, not used after this.
    unsafe {
        rdma_destroy_qp(id);
        rdma_destroy_srq(id);
        rdma_destroy_id(id);
    }
}

// ---- devices, strings, ECE, multicast ---------------------------------------------------------------------

/// librdmacm's `rdma_get_devices` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_get_devices"]
pub unsafe extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    let ctx = cm_ctx();
    let n = usize::from(!ctx.is_null());
    // SAFETY: calloc of n+1 pointers, freed by rdma_free_devices.
    let list =
        unsafe { libc::calloc(n + 1, size_of::<*mut ibv_context>()) } as *mut *mut ibv_context;
    if list.is_null() {
        set_errno(ENOMEM);
        return null_mut();
    }
    if n == 1 {
        // SAFETY: two slots.
        unsafe { *list = ctx };
    }
    if !num.is_null() {
        // SAFETY: the caller's out parameter.
        unsafe { *num = n as c_int };
    }
    list
}

/// librdmacm's `rdma_free_devices` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_free_devices"]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: from rdma_get_devices (calloc) or NULL.
    unsafe { libc::free(list as *mut c_void) };
}

/// librdmacm's `rdma_event_str` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_event_str"]
pub extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    static NAMES: [&std::ffi::CStr; 17] = [
        c"RDMA_CM_EVENT_ADDR_RESOLVED",
        c"RDMA_CM_EVENT_ADDR_ERROR",
        c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        c"RDMA_CM_EVENT_ROUTE_ERROR",
        c"RDMA_CM_EVENT_CONNECT_REQUEST",
        c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        c"RDMA_CM_EVENT_CONNECT_ERROR",
        c"RDMA_CM_EVENT_UNREACHABLE",
        c"RDMA_CM_EVENT_REJECTED",
        c"RDMA_CM_EVENT_ESTABLISHED",
        c"RDMA_CM_EVENT_DISCONNECTED",
        c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        c"RDMA_CM_EVENT_MULTICAST_JOIN",
        c"RDMA_CM_EVENT_MULTICAST_ERROR",
        c"RDMA_CM_EVENT_ADDR_CHANGE",
        c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        c"UNKNOWN EVENT",
    ];
    let i = usize::try_from(event).unwrap_or(16).min(16);
    NAMES[i].as_ptr()
}

/// `struct ibv_ece`.
#[repr(C)]
pub struct ibv_ece {
    pub vendor_id: u32,
    pub options: u32,
    pub comp_mask: u32,
}

/// librdmacm's `rdma_set_local_ece` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_set_local_ece"]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    if !live_id(id) || ece.is_null() {
        return fail(EINVAL);
    }
    // ECE (vendor options in the REQ/REP) is not negotiated: accepted and not sent.
    0
}

/// librdmacm's `rdma_get_remote_ece` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_get_remote_ece"]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    if !live_id(id) || ece.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: the caller's out structure.
    unsafe {
        *ece = ibv_ece {
            vendor_id: 0,
            options: 0,
            comp_mask: 0,
        }
    };
    0
}

/// librdmacm's `rdma_join_multicast` (`librdmacm.so.1` forwards to it). Over RoCE a join
/// sends nothing: the id's QP (if it has one) is attached to the group's GID (IPv4-mapped
/// for an IPv4 group), which makes the packet device join the IP group (the UDP backend: a
/// socket bound to the group with `IP_ADD_MEMBERSHIP`), and RDMA_CM_EVENT_MULTICAST_JOIN
/// follows on the id's channel with the group's address handle attributes, QPN 0xFFFFFF and
/// the UDP Q_Key. The id must be UDP and bound or resolved; `addr` an IP multicast address.
#[export_name = "ferroce_rdma_join_multicast"]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut sockaddr,
    ctx: *mut c_void,
) -> c_int {
    if !live_id(id) {
        return fail(EINVAL);
    }
    // SAFETY: an id of this library; the caller's address.
    let (w, a) = unsafe { (idw(id), from_sockaddr(addr)) };
    let Some(group) = a.map(|a| a.ip()).filter(IpAddr::is_multicast) else {
        return fail(EINVAL);
    };
    if w.c.ps != RDMA_PS_UDP {
        return fail(libc::ENOSYS);
    }
    let cmid = match w.cmid() {
        Ok(c) => c.clone(),
        Err(e) => return fail(e),
    };
    if cmid.local_addr().is_none() {
        return fail(EINVAL);
    }
    if w.mc.iter().any(|&(g, _)| g == group) {
        return fail(libc::EADDRINUSE);
    }
    if !w.c.qp.is_null() {
        let gid = ibv_gid { raw: gid_of(group) };
        // SAFETY: the id's QP (made by this library) and a local GID.
        let r = unsafe { verbs::ibv_attach_mcast(w.c.qp, &gid, 0) };
        if r != 0 {
            return fail(r);
        }
    }
    w.mc.push((group, ctx as usize));
    w.mc_pending.push_back((group, ctx as usize));
    if let Err(e) = cmid.post_event(EventType::MulticastJoin, 0) {
        return fail(errno_of(&e));
    }
    0
}

/// `struct rdma_cm_join_mc_attr_ex`.
#[repr(C)]
pub struct rdma_cm_join_mc_attr_ex {
    pub comp_mask: u32,
    pub join_flags: u32,
    pub addr: *mut sockaddr,
}

/// librdmacm's `rdma_join_multicast_ex` (`librdmacm.so.1` forwards to it): as
/// `rdma_join_multicast` (full and send-only members alike: both receive over RoCE here).
#[export_name = "ferroce_rdma_join_multicast_ex"]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    ctx: *mut c_void,
) -> c_int {
    if !live_id(id) || attr.is_null() {
        return fail(EINVAL);
    }
    // RDMA_CM_JOIN_MC_ATTR_ADDRESS (1) and RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS (2).
    // SAFETY: the caller's attributes.
    let a = unsafe { &*attr };
    if a.comp_mask & 1 == 0 || a.comp_mask & !3 != 0 {
        return fail(EINVAL);
    }
    // SAFETY: as rdma_join_multicast.
    unsafe { rdma_join_multicast(id, a.addr, ctx) }
}

/// librdmacm's `rdma_leave_multicast` (`librdmacm.so.1` forwards to it): the QP is
/// detached (the packet device leaves the IP group when no QP is attached any more).
#[export_name = "ferroce_rdma_leave_multicast"]
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    if !live_id(id) {
        return fail(EINVAL);
    }
    // SAFETY: an id of this library; the caller's address.
    let (w, a) = unsafe { (idw(id), from_sockaddr(addr)) };
    let Some(group) = a.map(|a| a.ip()) else {
        return fail(EINVAL);
    };
    let Some(i) = w.mc.iter().position(|&(g, _)| g == group) else {
        return fail(libc::EADDRNOTAVAIL);
    };
    w.mc.remove(i);
    w.mc_pending.retain(|&(g, _)| g != group);
    if !w.c.qp.is_null() {
        let gid = ibv_gid { raw: gid_of(group) };
        // SAFETY: the id's QP and a local GID. A QP already detached (destroyed) is fine.
        let _ = unsafe { verbs::ibv_detach_mcast(w.c.qp, &gid, 0) };
    }
    0
}

// ---- rdma_getaddrinfo ---------------------------------------------------------------------------------

#[repr(C)]
struct AiW {
    c: rdma_addrinfo,
    src: libc::sockaddr_storage,
    dst: libc::sockaddr_storage,
}

/// The first address `node`/`service` name (numeric, or through the system's resolver).
///
/// # Safety
/// `node` and `service` are NULL or C strings.
unsafe fn lookup(
    node: *const c_char,
    service: *const c_char,
    family: c_int,
    flags: c_int,
    passive: bool,
) -> Result<SocketAddr, c_int> {
    // SAFETY: plain C data.
    let mut h: libc::addrinfo = unsafe { std::mem::zeroed() };
    h.ai_family = family;
    h.ai_socktype = libc::SOCK_STREAM;
    if flags & RAI_NUMERICHOST != 0 {
        h.ai_flags |= libc::AI_NUMERICHOST;
    }
    if passive {
        h.ai_flags |= libc::AI_PASSIVE;
    }
    let mut res: *mut libc::addrinfo = null_mut();
    // SAFETY: getaddrinfo(3) with the caller's strings and a local hints structure.
    let r = unsafe { libc::getaddrinfo(node, service, &h, &mut res) };
    if r != 0 || res.is_null() {
        return Err(r);
    }
    // The first answer, as librdmacm takes it.
    // SAFETY: a list from getaddrinfo, freed right after.
    let a = unsafe { from_sockaddr((*res).ai_addr) };
    // SAFETY: as above.
    unsafe { libc::freeaddrinfo(res) };
    a.ok_or(libc::EAI_FAMILY)
}

/// librdmacm's `rdma_getaddrinfo` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_getaddrinfo"]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
        return fail(EINVAL);
    }
    // SAFETY: the caller's hints (or none).
    let h = unsafe { hints.as_ref() };
    let flags = h.map_or(0, |h| h.ai_flags);
    let passive = flags & RAI_PASSIVE != 0;
    // SAFETY: plain C data.
    let mut w: Box<AiW> = Box::new(unsafe { std::mem::zeroed() });
    w.c.ai_flags = flags;
    w.c.ai_port_space = h
        .map(|h| h.ai_port_space)
        .filter(|p| *p != 0)
        .unwrap_or(RDMA_PS_TCP);
    w.c.ai_qp_type = h.map(|h| h.ai_qp_type).filter(|q| *q != 0).unwrap_or(
        if w.c.ai_port_space == RDMA_PS_UDP {
            4
        } else {
            2
        },
    );
    // SAFETY: the caller's hints' source address (or NULL).
    let hint_src = h.and_then(|h| unsafe { from_sockaddr(h.ai_src_addr) });
    // SAFETY: the caller's hints' destination address (or NULL).
    let hint_dst = h.and_then(|h| unsafe { from_sockaddr(h.ai_dst_addr) });
    if node.is_null() && service.is_null() {
        // No name to look up: the hints' family and addresses are the answer, copied as
        // librdmacm copies them (the family too, AF_UNSPEC included).
        w.c.ai_family = h.map_or(0, |h| h.ai_family);
        if let Some(d) = hint_dst {
            w.c.ai_dst_len = to_sockaddr(&mut w.dst, d);
            w.c.ai_dst_addr = &mut w.dst as *mut _ as *mut sockaddr;
        }
        if let Some(s) = hint_src {
            w.c.ai_src_len = to_sockaddr(&mut w.src, s);
            w.c.ai_src_addr = &mut w.src as *mut _ as *mut sockaddr;
        }
        // SAFETY: the caller's out parameter.
        unsafe { *res = Box::into_raw(w) as *mut rdma_addrinfo };
        return 0;
    }
    let mut family = h.map_or(0, |h| h.ai_family);
    if family == 0 && node.is_null() {
        // A wildcard address: IPv4's (ferroce's CM binds every address of the family).
        family = libc::AF_INET;
    }
    // SAFETY: the caller's strings.
    let addr = match unsafe { lookup(node, service, family, flags, passive) } {
        Ok(a) => a,
        Err(e) => {
            // librdmacm returns getaddrinfo's code (negative) and sets errno.
            set_errno(EINVAL);
            return if e != 0 { e } else { -1 };
        }
    };
    w.c.ai_family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    if passive {
        w.c.ai_src_len = to_sockaddr(&mut w.src, addr);
        w.c.ai_src_addr = &mut w.src as *mut _ as *mut sockaddr;
    } else {
        w.c.ai_dst_len = to_sockaddr(&mut w.dst, addr);
        w.c.ai_dst_addr = &mut w.dst as *mut _ as *mut sockaddr;
        // A source address from the hints.
        if let Some(s) = hint_src {
            w.c.ai_src_len = to_sockaddr(&mut w.src, s);
            w.c.ai_src_addr = &mut w.src as *mut _ as *mut sockaddr;
        } else if flags & RAI_NOROUTE == 0 {
            // The local address that reaches the destination, as librdmacm fills it in.
            if let Ok(c) = cm() {
                if c.local.is_ipv4() == addr.is_ipv4() {
                    w.c.ai_src_len = to_sockaddr(&mut w.src, SocketAddr::new(c.local, 0));
                    w.c.ai_src_addr = &mut w.src as *mut _ as *mut sockaddr;
                }
            }
        }
    }
    // SAFETY: the caller's out parameter.
    unsafe { *res = Box::into_raw(w) as *mut rdma_addrinfo };
    0
}

/// librdmacm's `rdma_freeaddrinfo` (`librdmacm.so.1` forwards to it).
#[export_name = "ferroce_rdma_freeaddrinfo"]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: a list from rdma_getaddrinfo, not used after this.
        let b = unsafe { Box::from_raw(p as *mut AiW) };
        p = b.c.ai_next;
    }
}
