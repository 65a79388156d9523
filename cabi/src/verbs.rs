//! The exported `ibv_*` functions and the operations of the context's ops table.
//!
//! Return conventions are libibverbs': object constructors return NULL and set `errno`;
//! `ibv_modify_qp`, `ibv_query_qp`, `ibv_dereg_mr`, `ibv_destroy_*`, the post verbs and
//! `_ibv_query_gid_ex` return an errno value; `ibv_query_device`/`ibv_query_port` return an
//! errno value too; `ibv_query_gid`, `ibv_get_cq_event` and `ibv_req_notify_cq` return 0 or
//! -1 (with `errno`) as libibverbs does.

use crate::abi::*;
use crate::device::{self, Shared};
use ferroce::verbs::AsyncEvent;
use ferroce::verbs::LKey;
use ferroce::verbs::{
    AccessFlags, AddressVector, Ah, AppMemory, Cq, MemoryRegion, MemoryWindow, Mtu, MwBindInfo,
    MwType, NotifyMode, OnDemandMemory, Pd, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType,
    RecvWr, SendFlags, SendOp, SendWr, SgList, Sge, Srq, SrqAttr, SrqAttrMask, UdDest, UserMemory,
    VerbsError, WcFlags, WcOpcode, WcStatus, WorkCompletion, Xrcd,
};
use ferroce::wire::{QpNumber, RKey};
use libc::{c_char, c_int, c_uint, c_void, EINVAL, ENOENT, ENOMEM, EOPNOTSUPP};
use std::collections::{HashMap, VecDeque};
use std::mem::offset_of;
use std::ptr::{null_mut, NonNull};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

// ---- errno and small helpers ---------------------------------------------------------------

pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// NULL with `errno` set: how libibverbs' constructors fail.
pub(crate) fn fail<T>(e: c_int) -> *mut T {
    set_errno(e);
    null_mut()
}

/// The errno a verbs error maps to (what rdma-core's providers return for the same cause).
pub(crate) fn errno_of(e: &VerbsError) -> c_int {
    match e {
        VerbsError::QueueFull | VerbsError::NoResources(_) => ENOMEM,
        VerbsError::Busy(_) => libc::EBUSY,
        _ => EINVAL,
    }
}

pub(crate) fn warn(what: &str) {
    eprintln!("ferroce libibverbs: {what}");
}

/// The running NIC of a `Shared` (started now if need be: [`Shared::nic`]), or return from the
/// function with `$ret` applied to the errno.
macro_rules! nic_or {
    ($s:expr, $ret:expr) => {
        match $s.nic() {
            Ok(n) => n,
            Err(e) => return $ret(e),
        }
    };
}

// ---- objects: a Box of a wrapper whose first field is the C structure ----------------------

/// An open device context.
#[repr(C)]
pub(crate) struct Ctx {
    pub(crate) v: verbs_context,
    sh: Arc<Shared>,
}

#[repr(C)]
struct PdW {
    c: ibv_pd,
    /// The protection domain (a parent domain's is the one it was made on).
    pd: Pd,
    /// A parent domain: what it was made with.
    parent: Option<Parent>,
    /// What must go first (EBUSY until then): of a PD, the parent domains made on it; of a
    /// parent domain, the QPs, SRQs and CQs made on or with it.
    children: AtomicUsize,
}

/// What a parent domain holds (`struct ibv_parent_domain_init_attr`): the PD it was made on,
/// its thread domain, the allocators and their context. The allocators are kept, not called:
/// no object of this library has memory the device reaches except the application's own
/// regions, so there is nothing a provider would take from them.
struct Parent {
    base: *mut PdW,
    td: *mut TdW,
    _alloc: Option<PdAllocFn>,
    _free: Option<PdFreeFn>,
    _pd_context: *mut c_void,
}

/// A thread domain: `struct ibv_td`, and the parent domains that name it.
#[repr(C)]
struct TdW {
    c: ibv_td,
    refs: AtomicUsize,
}

#[repr(C)]
struct MrW {
    c: ibv_mr,
    mr: MemoryRegion,
    /// A region over device memory (`ibv_reg_dm_mr`): that memory, held until deregistration.
    dm: *mut DmW,
}

/// A CQ: `struct ibv_cq_ex` (whose first part is `struct ibv_cq`), then ferroce's handle.
#[repr(C)]
pub(crate) struct CqW {
    pub(crate) c: ibv_cq,
    pub(crate) ex: ibv_cq_ex_tail,
    pub(crate) cq: Cq,
    /// The polling session of the extended interface.
    pub(crate) poll: Mutex<crate::ex::ExPoll>,
    /// Completion events `ibv_get_cq_event` handed out, and those `ibv_ack_cq_events`
    /// acknowledged: `ibv_destroy_cq` waits until they are equal, as libibverbs' does.
    events: std::sync::atomic::AtomicU32,
    acked: std::sync::atomic::AtomicU32,
    /// The parent domain `ibv_create_cq_ex` made it with (`IBV_CQ_INIT_ATTR_MASK_PD`), held
    /// until it is destroyed; else NULL.
    pub(crate) parent_pd: std::sync::atomic::AtomicPtr<ibv_pd>,
}

/// Signalled by `ibv_ack_cq_events` (`ibv_destroy_cq` waits on it).
static CQ_ACKS: (Mutex<()>, std::sync::Condvar) = (Mutex::new(()), std::sync::Condvar::new());

/// How long `ibv_destroy_cq` waits for its events to be acknowledged. libibverbs waits
/// forever; a program that never acknowledges costs this wait here, then the CQ goes.
const CQ_ACK_WAIT: Duration = Duration::from_secs(5);

/// A QP: `struct ibv_qp_ex` (whose first part is `struct ibv_qp`), then ferroce's state.
#[repr(C)]
pub(crate) struct QpW {
    pub(crate) c: ibv_qp,
    pub(crate) ex: ibv_qp_ex_tail,
    pub(crate) qpn: QpNumber,
    pub(crate) qp_type: QpType,
    /// The scatter/gather limits the QP was created with: a request naming more entries is
    /// refused before its list is read (the count is the caller's word for the array's length;
    /// nothing beyond the limit is ever read).
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    /// Created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`: `ibv_qp_to_qp_ex` hands out `ex`.
    pub(crate) ex_on: bool,
    /// The builder's session and the inline bounce region.
    pub(crate) tx: Mutex<crate::ex::Tx>,
}

#[repr(C)]
struct SrqW {
    c: ibv_srq,
    srq: Srq,
    /// The SRQ's scatter/gather limit (see `QpW::max_send_sge`).
    max_sge: u32,
}

#[repr(C)]
struct AhW {
    c: ibv_ah,
    ah: Ah,
}

#[repr(C)]
struct ChanW {
    c: ibv_comp_channel,
    /// Shared with each CQ bound to the channel (its notification writes the descriptor) and
    /// with every thread inside `ibv_get_cq_event` on it: a thread waiting there when the
    /// program destroys the channel keeps waiting on a channel that stays alive under it (with
    /// the kernel's channel it sleeps in `read`), instead of reading freed memory.
    inner: Arc<ChanInner>,
}

struct ChanInner {
    /// The eventfd (`c.fd`), closed when the last user lets go.
    fd: c_int,
    /// The CQs bound to the channel: (handle, the C object's address).
    cqs: Mutex<Vec<(Cq, usize)>>,
}

impl Drop for ChanInner {
    fn drop(&mut self) {
        // SAFETY: the descriptor this object owns, closed once.
        unsafe { libc::close(self.fd) };
    }
}

/// The C objects by their number on the device, for asynchronous events (which name a QP by
/// its number, a CQ or an SRQ by its index): the object's address and the address of the
/// `ibv_context` it was made in (the context the event goes to).
#[derive(Default)]
struct Objects {
    qps: HashMap<u32, (usize, usize)>,
    cqs: HashMap<u32, (usize, usize)>,
    srqs: HashMap<u32, (usize, usize)>,
}

impl Objects {
    /// The C object an event names and its context, if it still exists.
    fn find(&self, e: AsyncEvent) -> Option<(ibv_async_element, usize)> {
        use AsyncEvent as E;
        match e {
            E::CqErr(cq) => self.cqs.get(&cq.index()).map(|&(p, c)| {
                let cq = p as *mut ibv_cq;
                (ibv_async_element { cq }, c)
            }),
            E::QpFatal(q) | E::QpReqErr(q) | E::QpAccessErr(q) | E::QpLastWqeReached(q) => {
                self.qps.get(&q.get()).map(|&(p, c)| {
                    let qp = p as *mut ibv_qp;
                    (ibv_async_element { qp }, c)
                })
            }
            E::SrqLimitReached(q) => self.srqs.get(&q.number()).map(|&(p, c)| {
                let srq = p as *mut ibv_srq;
                (ibv_async_element { srq }, c)
            }),
            // The device's own events go to every context ([`broadcast_async_event`]).
            E::PortActive(_) | E::PortErr(_) | E::GidChange(_) => None,
        }
    }
}

static OBJECTS: Mutex<Option<Objects>> = Mutex::new(None);

fn objects<R>(f: impl FnOnce(&mut Objects) -> R) -> R {
    let mut g = OBJECTS.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Objects::default))
}

/// Run `f` on the QP at `qp` if it is a QP of this library that still exists, with the
/// registry's lock held: `ibv_destroy_qp` takes a QP out of the registry before it frees it,
/// so the QP cannot go away under `f`. For pointers another object keeps (an RDMA-CM id's
/// `qp`), which the program may destroy with `ibv_destroy_qp` at any time, from any thread
/// (rping does, while its CM thread may be reading DISCONNECTED).
pub(crate) fn with_live_qp<R>(qp: *mut ibv_qp, f: impl FnOnce(&mut QpW) -> R) -> Option<R> {
    objects(|o| {
        o.qps.values().any(|&(p, _)| p == qp as usize).then(|| {
            // SAFETY: a live QP of this library (in the registry, under its lock).
            f(unsafe { &mut *(qp as *mut QpW) })
        })
    })
}

/// The most events a context keeps unread; older ones are dropped (and counted) beyond it.
const ASYNC_QUEUE_MAX: usize = 4096;

/// One open context's asynchronous events: its `async_fd` (an eventfd, readable exactly
/// while `q` is not empty: both change only under the lock of [`Contexts`]) and the events
/// routed to it, oldest first.
pub(crate) struct CtxEvents {
    fd: c_int,
    q: VecDeque<AsyncEvent>,
    lost: u64,
}

/// Every open context of the process by the address of its `ibv_context`.
pub(crate) type Contexts = Mutex<HashMap<usize, CtxEvents>>;

fn lock_ctxs(c: &Contexts) -> std::sync::MutexGuard<'_, HashMap<usize, CtxEvents>> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

impl CtxEvents {
    fn push(&mut self, e: AsyncEvent) {
        if self.q.len() >= ASYNC_QUEUE_MAX {
            self.q.pop_front();
            self.lost += 1;
            if self.lost.is_power_of_two() {
                warn(&format!(
                    "{} asynchronous events dropped: more than {ASYNC_QUEUE_MAX} unread",
                    self.lost
                ));
            }
        }
        if self.q.is_empty() {
            let one: u64 = 1;
            // SAFETY: an 8-byte write from a local to the context's eventfd, which stays
            // open while the context is in `Contexts` (ibv_close_device takes it out first).
            unsafe { libc::write(self.fd, &one as *const u64 as *const c_void, 8) };
        }
        self.q.push_back(e);
    }

    fn pop(&mut self) -> Option<AsyncEvent> {
        let e = self.q.pop_front()?;
        if self.q.is_empty() {
            // Not readable any more: take the descriptor's count (poll first, so that a
            // program that read the descriptor itself does not make this block).
            let mut p = libc::pollfd {
                fd: self.fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll(2) on one local pollfd with no wait; read(2) of 8 bytes into a
            // local from the context's eventfd, readable (so it does not block).
            unsafe {
                if libc::poll(&mut p, 1, 0) == 1 {
                    let mut v = 0u64;
                    libc::read(self.fd, &mut v as *mut u64 as *mut c_void, 8);
                }
            }
        }
        Some(e)
    }
}

/// The NIC's asynchronous-event sink (on the engine's thread): the event goes to the context
/// that made the QP, CQ or SRQ it names, as the kernel's uverbs delivers it on the file of
/// the context that owns the object; one about an object already destroyed is dropped.
/// (An event naming no object, a port's, would go to every context; ferroce raises none.)
pub(crate) fn route_async_event(ctxs: &Contexts, e: AsyncEvent) {
    let Some((_, owner)) = objects(|o| o.find(e)) else {
        return;
    };
    if let Some(c) = lock_ctxs(ctxs).get_mut(&owner) {
        c.push(e);
    }
}

/// A device event (the port's): queued on every open context, as the kernel does.
pub(crate) fn broadcast_async_event(ctxs: &Contexts, e: AsyncEvent) {
    for c in lock_ctxs(ctxs).values_mut() {
        c.push(e);
    }
}

/// The wrapper of a context pointer.
///
/// # Safety
/// `c` is a context this library returned from `ibv_open_device`, not yet closed.
pub(crate) unsafe fn ctx<'a>(c: *mut ibv_context) -> &'a Ctx {
    // SAFETY: the context is the last field of the `verbs_context` at the start of `Ctx`
    // (`#[repr(C)]`), so stepping back by its offset gives the `Ctx` (the caller's promise).
    unsafe { &*((c as *mut u8).sub(offset_of!(verbs_context, context)) as *const Ctx) }
}

/// The shared device of any object with a context pointer.
pub(crate) unsafe fn sh<'a>(c: *mut ibv_context) -> &'a Shared {
    // SAFETY: as for `ctx`.
    unsafe { &ctx(c).sh }
}

/// The shared device of a context, held.
///
/// # Safety
/// As for [`sh`].
pub(crate) unsafe fn sh_arc(c: *mut ibv_context) -> Arc<Shared> {
    // SAFETY: as for `ctx`.
    unsafe { ctx(c).sh.clone() }
}

// ---- the device list -----------------------------------------------------------------------

/// The device and its node GUID (network-order bytes, as `ibv_get_device_guid` returns them),
/// both fixed when the list is first read.
struct DevSlot(*mut ibv_device, u64);
// SAFETY: the device structure is written once, before it is published, and only read after.
unsafe impl Send for DevSlot {}
// SAFETY: as above.
unsafe impl Sync for DevSlot {}

static DEVICE: OnceLock<Option<DevSlot>> = OnceLock::new();

fn copy_str(dst: &mut [c_char], s: &str) {
    let n = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
}

/// The process's one device (allocated once, never freed: `ibv_free_device_list` frees the
/// list, not the devices, as in libibverbs).
pub(crate) fn the_device() -> Option<*mut ibv_device> {
    DEVICE
        .get_or_init(|| match device::Port::from_env() {
            Ok(p) => {
                // SAFETY: ibv_device is plain C data; all-zero is a valid value.
                let mut d: Box<ibv_device> = Box::new(unsafe { std::mem::zeroed() });
                d.node_type = 1; // IBV_NODE_CA
                d.transport_type = 0; // IBV_TRANSPORT_IB (RoCE devices report IB)
                copy_str(&mut d.name, &p.name());
                // The name `ferroce run --dev-node` makes a node for (UCX looks for it).
                let uverbs = ferroce::io::VERBS_DEV_NAME;
                copy_str(&mut d.dev_name, uverbs);
                copy_str(
                    &mut d.dev_path,
                    &format!("/sys/class/infiniband_verbs/{uverbs}"),
                );
                copy_str(
                    &mut d.ibdev_path,
                    &format!("/sys/class/infiniband/{}", p.name()),
                );
                Some(DevSlot(Box::into_raw(d), u64::from_ne_bytes(p.guid())))
            }
            Err(e) => {
                warn(&e.to_string());
                None
            }
        })
        .as_ref()
        .map(|d| d.0)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    let devs: Vec<*mut ibv_device> = the_device().into_iter().collect();
    // SAFETY: calloc of n+1 pointers; the list is freed by ibv_free_device_list with free().
    let list = unsafe { libc::calloc(devs.len() + 1, size_of::<*mut ibv_device>()) }
        as *mut *mut ibv_device;
    if list.is_null() {
        return fail(ENOMEM);
    }
    for (i, d) in devs.iter().enumerate() {
        // SAFETY: `list` has devs.len() + 1 slots.
        unsafe { *list.add(i) = *d };
    }
    if !num.is_null() {
        // SAFETY: the caller's out parameter.
        unsafe { *num = devs.len() as c_int };
    }
    list
}

#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: allocated by calloc in ibv_get_device_list (or NULL).
    unsafe { libc::free(list as *mut c_void) };
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    if dev.is_null() {
        return fail::<c_char>(EINVAL);
    }
    // SAFETY: a device from our list.
    unsafe { (*dev).name.as_ptr() }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    // The slot's GUID, without looking the interface up again.
    match DEVICE.get().and_then(Option::as_ref) {
        Some(d) if d.0 == dev => d.1,
        _ => 0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(_dev: *mut ibv_device) -> c_int {
    0
}

// ---- contexts --------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    if dev.is_null() || Some(dev) != the_device() {
        return fail(EINVAL);
    }
    let sh = match device::shared() {
        Ok(s) => s,
        Err(e) => {
            warn(&e.to_string());
            return fail(e.errno());
        }
    };
    // SAFETY: verbs_context is plain C data (pointers, ints, a pthread mutex whose all-zero
    // value is PTHREAD_MUTEX_INITIALIZER on glibc); every field used is set below.
    let mut v: verbs_context = unsafe { std::mem::zeroed() };
    v.query_port = Some(query_port_ex);
    v.create_cq_ex = Some(crate::ex::create_cq_ex);
    v.query_device_ex = Some(crate::ex::query_device_ex);
    v.query_rt_values = Some(crate::ex::query_rt_values);
    v.advise_mr = Some(advise_mr);
    v.alloc_parent_domain = Some(alloc_parent_domain);
    v.alloc_dm = Some(alloc_dm);
    v.free_dm = Some(free_dm);
    v.reg_dm_mr = Some(reg_dm_mr);
    v.alloc_td = Some(alloc_td);
    v.dealloc_td = Some(dealloc_td);
    v.create_qp_ex = Some(crate::ex::create_qp_ex);
    v.get_srq_num = Some(get_srq_num);
    v.create_srq_ex = Some(create_srq_ex);
    v.open_xrcd = Some(open_xrcd);
    v.close_xrcd = Some(close_xrcd);
    v.sz = size_of::<verbs_context>();
    v.context.device = dev;
    v.context.ops.alloc_mw = Some(alloc_mw);
    v.context.ops.bind_mw = Some(bind_mw);
    v.context.ops.dealloc_mw = Some(dealloc_mw);
    v.context.ops.poll_cq = Some(poll_cq);
    v.context.ops.req_notify_cq = Some(req_notify_cq);
    v.context.ops.post_send = Some(post_send);
    v.context.ops.post_recv = Some(post_recv);
    v.context.ops.post_srq_recv = Some(post_srq_recv);
    // The command descriptor: with no kernel driver there are no commands, but programs
    // (rdma-core's tests among them) dup it to import the context elsewhere; /dev/null lets
    // them, and ibv_import_device then says EOPNOTSUPP (-1 if even that cannot be opened).
    // SAFETY: open(2) of a NUL-terminated path; closed by ibv_close_device.
    v.context.cmd_fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    // SAFETY: eventfd(2); the descriptor is closed by ibv_close_device.
    // Blocking, as the kernel's; a program may set O_NONBLOCK (see ibv_get_async_event).
    v.context.async_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    v.context.num_comp_vectors = 1;
    v.context.abi_compat = usize::MAX as *mut c_void; // __VERBS_ABI_IS_EXTENDED
    if v.context.async_fd < 0 {
        let e = std::io::Error::last_os_error().raw_os_error();
        return fail(e.unwrap_or(libc::EMFILE));
    }
    let fd = v.context.async_fd;
    let b = Box::new(Ctx { v, sh });
    let p = Box::into_raw(b);
    // SAFETY: just allocated.
    let c = unsafe { &mut (*p).v.context };
    // SAFETY: as above.
    let s = unsafe { &(*p).sh };
    let ev = CtxEvents {
        fd,
        q: VecDeque::new(),
        lost: 0,
    };
    lock_ctxs(&s.contexts).insert(c as *mut ibv_context as usize, ev);
    c
}

#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(c: *mut ibv_context) -> c_int {
    if c.is_null() {
        return EINVAL;
    }
    // SAFETY: a context from ibv_open_device (see `ctx`); it is not used after this.
    unsafe {
        let p = (c as *mut u8).sub(offset_of!(verbs_context, context)) as *mut Ctx;
        let w = &*p;
        lock_ctxs(&w.sh.contexts).remove(&(c as usize));
        libc::close(w.v.context.async_fd);
        if w.v.context.cmd_fd >= 0 {
            libc::close(w.v.context.cmd_fd);
        }
        drop(Box::from_raw(p));
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(c: *mut ibv_context, a: *mut ibv_device_attr) -> c_int {
    if c.is_null() || a.is_null() {
        return EINVAL;
    }
    // SAFETY: caller's context and out struct.
    let (s, a) = unsafe { (sh(c), &mut *a) };
    let l = s.limits();
    // SAFETY: plain C data.
    *a = unsafe { std::mem::zeroed() };
    copy_str(&mut a.fw_ver, env!("CARGO_PKG_VERSION"));
    a.node_guid = u64::from_ne_bytes(s.port.guid());
    a.sys_image_guid = a.node_guid;
    a.max_mr_size = l.max_mr_size;
    a.page_size_cap = 0xffff_f000;
    a.vendor_id = 0xffffff; // as rxe: no vendor
    a.hw_ver = 0;
    let int = |v: u32| v.min(c_int::MAX as u32) as c_int;
    a.max_qp = int(l.max_qp);
    a.max_qp_wr = int(l.max_qp_wr);
    a.device_cap_flags = l.device_cap_flags;
    a.max_mcast_grp = int(ferroce::verbs::MAX_MCAST_GROUPS as u32);
    a.max_mcast_qp_attach = int(ferroce::verbs::MAX_MCAST_QP_ATTACH as u32);
    a.max_total_mcast_qp_attach = a.max_mcast_grp * a.max_mcast_qp_attach;
    a.max_sge = int(l.max_sge);
    a.max_sge_rd = int(l.max_sge_rd);
    a.max_cq = int(l.max_cq);
    a.max_cqe = int(l.max_cqe);
    a.max_mr = int(l.max_mr);
    a.max_mw = int(l.max_mw);
    a.max_pd = int(l.max_pd);
    a.max_qp_rd_atom = int(l.max_qp_rd_atom);
    a.max_res_rd_atom = l.max_res_rd_atom.min(c_int::MAX as u64) as c_int;
    a.max_qp_init_rd_atom = int(l.max_qp_init_rd_atom);
    a.atomic_cap = 1; // IBV_ATOMIC_HCA
    a.max_ah = int(l.max_ah);
    a.max_srq = int(l.max_srq);
    a.max_srq_wr = int(l.max_srq_wr);
    a.max_srq_sge = int(l.max_srq_sge);
    a.max_pkeys = l.max_pkeys;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = 1;
    0
}

fn fill_port(s: &Shared, a: &mut ibv_port_attr) {
    // SAFETY: plain C data.
    *a = unsafe { std::mem::zeroed() };
    // The interface's state, as rxe reports it: ACTIVE and LinkUp while it is up with its
    // link; else DOWN, and Polling (up without link) or Disabled (down).
    let link = ferroce::io::netdev::port_link(&s.port.netdev.name);
    a.state = link.ibv_state().into();
    let (active, max) = s.port_mtus();
    a.max_mtu = max.to_ibv() as c_int;
    a.active_mtu = active.to_ibv() as c_int;
    a.gid_tbl_len = s.port.served().table.len() as c_int;
    // IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS
    a.port_cap_flags = (1 << 16) | (1 << 26);
    a.max_msg_sz = 0x8000_0000;
    a.pkey_tbl_len = 1;
    a.max_vl_num = 1;
    // From the interface's Ethernet speed, as rxe's (ib_get_eth_speed).
    let rate = ferroce::io::netdev::port_rate(&s.port.netdev.name);
    a.active_width = rate.width;
    a.active_speed = rate.speed;
    a.phys_state = link.ibv_phys_state();
    a.link_layer = 2; // IBV_LINK_LAYER_ETHERNET
}

/// `verbs_context.query_port`: what the inline `ibv_query_port` calls.
unsafe extern "C" fn query_port_ex(
    c: *mut ibv_context,
    port: u8,
    a: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    if c.is_null() || a.is_null() || port != 1 {
        return EINVAL;
    }
    // SAFETY: plain C data: all-zero is a valid value of every field.
    let mut full: ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: caller's context.
    fill_port(unsafe { sh(c) }, &mut full);
    let n = len.min(size_of::<ibv_port_attr>());
    // SAFETY: the caller's struct holds `len` bytes; we copy at most that many.
    unsafe { std::ptr::copy_nonoverlapping(&full as *const _ as *const u8, a as *mut u8, n) };
    0
}

/// The exported `ibv_query_port` (IBVERBS_1.1), for callers of the old ABI: the structure up to
/// `link_layer` (`struct _compat_ibv_port_attr`).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    c: *mut ibv_context,
    port: u8,
    a: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { query_port_ex(c, port, a, offset_of!(ibv_port_attr, flags)) }
}

/// Entry `index` of the GID table: `None` past its end, `Some(None)` for an empty entry (an
/// address the UDP backend does not serve; see `device`).
fn gid_bytes(s: &Shared, index: c_int) -> Option<Option<[u8; 16]>> {
    let i = usize::try_from(index).ok()?;
    s.port.shown_gid(i).map(|e| e.map(ferroce::verbs::gid_of))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    if c.is_null() || gid.is_null() || port != 1 {
        set_errno(EINVAL);
        return -1;
    }
    // SAFETY: caller's context and out struct.
    match gid_bytes(unsafe { sh(c) }, index) {
        Some(g) => {
            // An empty entry reads as the zero GID (rdma-core: "preserve API behavior for
            // empty GID").
            // SAFETY: the caller's out structure, valid for writes (libibverbs' contract).
            unsafe { (*gid).raw = g.unwrap_or([0; 16]) };
            0
        }
        None => {
            set_errno(EINVAL);
            -1
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    c: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    _flags: u32,
    entry_size: usize,
) -> c_int {
    if c.is_null() || entry.is_null() || port != 1 || entry_size < size_of::<ibv_gid_entry>() {
        return EINVAL;
    }
    // SAFETY: caller's context.
    let s = unsafe { sh(c) };
    match gid_bytes(s, index as c_int) {
        None => EINVAL,
        Some(None) => libc::ENODATA,
        Some(Some(g)) => {
            // SAFETY: the caller's entry of at least our size.
            unsafe {
                *entry = ibv_gid_entry {
                    gid: ibv_gid { raw: g },
                    gid_index: index,
                    port_num: port,
                    gid_type: 2, // IBV_GID_TYPE_ROCE_V2
                    ndev_ifindex: s.port.netdev.index,
                };
            }
            0
        }
    }
}

/// `_ibv_query_gid_table` (behind `ibv_query_gid_table`): every valid GID of the device
/// (port 1), in index order, `entry_size` bytes apart; the number written, or `-EINVAL` when
/// an entry is smaller than ours or `max_entries` cannot hold them all.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    c: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    _flags: u32,
    entry_size: usize,
) -> isize {
    let einval = -(EINVAL as isize);
    if c.is_null()
        || (entries.is_null() && max_entries > 0)
        || entry_size < size_of::<ibv_gid_entry>()
    {
        return einval;
    }
    // SAFETY: caller's context.
    let s = unsafe { sh(c) };
    let mut n = 0usize;
    // One look at the table (before the NIC starts, each look probes the address's port).
    let table = s.port.served().table.clone();
    for (index, entry) in table.iter().enumerate() {
        let Some(g) = entry.map(ferroce::verbs::gid_of) else {
            continue;
        };
        // A size no array of `max_entries` entries can have (the product overflows) is
        // refused rather than wrapped.
        let Some(offset) = n.checked_mul(entry_size).filter(|_| n < max_entries) else {
            return einval;
        };
        // SAFETY: the caller's array of `max_entries` entries of `entry_size` bytes each
        // (libibverbs' contract), `n` < `max_entries`; written unaligned, as `entry_size` may
        // be any size.
        unsafe {
            (entries as *mut u8)
                .add(offset)
                .cast::<ibv_gid_entry>()
                .write_unaligned(ibv_gid_entry {
                    gid: ibv_gid { raw: g },
                    gid_index: index as u32,
                    port_num: 1,
                    gid_type: 2, // IBV_GID_TYPE_ROCE_V2
                    ndev_ifindex: s.port.netdev.index,
                });
        }
        n += 1;
    }
    n as isize
}

/// `ibv_query_qp_data_in_order`: 0, in-order data placement is not promised (what
/// libibverbs answers for a provider without the query). The engine places a message's
/// packets in PSN order, but each packet's bytes are copied with `memcpy`, whose stores
/// another CPU may see out of order, so polling on a message's last byte is not safe.
#[no_mangle]
pub extern "C" fn ibv_query_qp_data_in_order(_qp: *mut ibv_qp, _op: c_int, _flags: u32) -> c_int {
    0
}

/// IBVERBS_PRIVATE: `ibv_devinfo` asks each GID's type (RoCE v2 for all of ours).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    c: *mut ibv_context,
    _port: u8,
    index: u32,
    ty: *mut c_int,
) -> c_int {
    if c.is_null() || ty.is_null() {
        return -1;
    }
    // SAFETY: caller's context and out parameter.
    if gid_bytes(unsafe { sh(c) }, index as c_int)
        .flatten()
        .is_none()
    {
        set_errno(EINVAL);
        return -1;
    }
    // SAFETY: the caller's out structure, valid for writes (libibverbs' contract).
    unsafe { *ty = 1 }; // IBV_GID_TYPE_SYSFS_ROCE_V2
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    if c.is_null() || pkey.is_null() || port != 1 || index != 0 {
        return EINVAL;
    }
    // SAFETY: caller's out parameter; the default P_Key, network order.
    unsafe { *pkey = 0xffffu16.to_be() };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(_c: *mut ibv_context, _port: u8, pkey: u16) -> c_int {
    if u16::from_be(pkey) & 0x7fff == 0x7fff {
        0
    } else {
        -1
    }
}

/// `ibv_read_sysfs_file`: the file's first line (without the newline), as libibverbs reads it.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        return -1;
    }
    // SAFETY: NUL-terminated strings from the caller.
    let (d, f) = unsafe {
        (
            std::ffi::CStr::from_ptr(dir).to_string_lossy().into_owned(),
            std::ffi::CStr::from_ptr(file)
                .to_string_lossy()
                .into_owned(),
        )
    };
    let Ok(mut s) = std::fs::read(format!("{d}/{f}")) else {
        return -1;
    };
    if s.last() == Some(&b'\n') {
        s.pop();
    }
    let n = s.len().min(size - 1);
    // SAFETY: `buf` holds `size` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    n as c_int
}

// ---- protection domains and memory regions -------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(c: *mut ibv_context) -> *mut ibv_pd {
    if c.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: caller's context.
    let nic = nic_or!(unsafe { sh(c) }, fail);
    let pd = match nic.alloc_pd() {
        Ok(pd) => pd,
        Err(e) => return fail(errno_of(&e)),
    };
    let w = Box::new(PdW {
        c: ibv_pd {
            context: c,
            handle: 0,
        },
        pd,
        parent: None,
        children: AtomicUsize::new(0),
    });
    Box::into_raw(w) as *mut ibv_pd
}

/// `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`, `IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT`.
const PARENT_DOMAIN_MASK: u32 = 0b11;

/// `verbs_context.alloc_td` (the inline `ibv_alloc_td`): a thread domain. ferroce serializes
/// each QP's posts itself, so a QP of a parent domain with a thread domain behaves as any.
unsafe extern "C" fn alloc_td(c: *mut ibv_context, a: *mut ibv_td_init_attr) -> *mut ibv_td {
    // SAFETY: the caller's attributes (libibverbs' contract).
    if c.is_null() || a.is_null() || unsafe { (*a).comp_mask } != 0 {
        return fail(EINVAL);
    }
    let w = Box::new(TdW {
        c: ibv_td { context: c },
        refs: AtomicUsize::new(0),
    });
    Box::into_raw(w) as *mut ibv_td
}

/// `verbs_context.dealloc_td` (`ibv_dealloc_td`): EBUSY while a parent domain names it.
unsafe extern "C" fn dealloc_td(td: *mut ibv_td) -> c_int {
    // SAFETY: a thread domain of this library or NULL (libibverbs' contract).
    let Some(w) = (unsafe { (td as *mut TdW).as_ref() }) else {
        return EINVAL;
    };
    if w.refs.load(Ordering::Acquire) > 0 {
        return libc::EBUSY;
    }
    // SAFETY: from alloc_td, not used after this (the caller's contract).
    drop(unsafe { Box::from_raw(td as *mut TdW) });
    0
}

/// `verbs_context.alloc_parent_domain` (the inline `ibv_alloc_parent_domain`): a PD object
/// that stands for `attr.pd` wherever a PD is taken (regions, QPs, SRQs, address handles,
/// windows, `ibv_create_cq_ex`'s `parent_domain`), with a thread domain and allocators.
/// `attr.pd` must be a PD of this context (not a parent domain), `td` one of its thread
/// domains or NULL, `comp_mask` the allocators' and context's bits only: else EINVAL.
unsafe extern "C" fn alloc_parent_domain(
    c: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    // SAFETY: the caller's attributes (libibverbs' contract).
    let Some(a) = (unsafe { attr.as_ref() }) else {
        return fail(EINVAL);
    };
    // SAFETY: a PD and a thread domain of this library, or NULL (libibverbs' contract).
    let (base, td) = unsafe { ((a.pd as *mut PdW).as_ref(), (a.td as *mut TdW).as_ref()) };
    let Some(base) = base.filter(|b| b.parent.is_none() && b.c.context == c) else {
        return fail(EINVAL);
    };
    if a.comp_mask & !PARENT_DOMAIN_MASK != 0 || td.is_some_and(|t| t.c.context != c) {
        return fail(EINVAL);
    }
    let allocators = a.comp_mask & 1 != 0;
    if allocators && (a.alloc.is_none() || a.free.is_none()) {
        return fail(EINVAL);
    }
    base.children.fetch_add(1, Ordering::AcqRel);
    if let Some(t) = td {
        t.refs.fetch_add(1, Ordering::AcqRel);
    }
    let w = Box::new(PdW {
        c: ibv_pd {
            context: c,
            handle: base.c.handle,
        },
        pd: base.pd,
        parent: Some(Parent {
            base: a.pd as *mut PdW,
            td: a.td as *mut TdW,
            _alloc: if allocators { a.alloc } else { None },
            _free: if allocators { a.free } else { None },
            _pd_context: if a.comp_mask & 2 != 0 {
                a.pd_context
            } else {
                null_mut()
            },
        }),
        children: AtomicUsize::new(0),
    });
    Box::into_raw(w) as *mut ibv_pd
}

/// A QP, SRQ or CQ made on (or with) a parent domain holds it: `ibv_dealloc_pd` of the parent
/// domain is EBUSY until they are destroyed, as on mlx5 (`up`: made; else destroyed). Nothing
/// for a PD.
pub(crate) fn hold_pd(pd: *mut ibv_pd, up: bool) {
    // SAFETY: a PD of this library or NULL (libibverbs' contract), alive while objects made
    // on it are.
    if let Some(w) = unsafe { (pd as *mut PdW).as_ref() }.filter(|w| w.parent.is_some()) {
        if up {
            w.children.fetch_add(1, Ordering::AcqRel);
        } else {
            w.children.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Whether `pd` is a parent domain of this library.
pub(crate) fn is_parent_domain(pd: *mut ibv_pd) -> bool {
    // SAFETY: a PD of this library or NULL (libibverbs' contract).
    unsafe { (pd as *mut PdW).as_ref() }.is_some_and(|w| w.parent.is_some())
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    if pd.is_null() {
        return EINVAL;
    }
    // SAFETY: a PD from ibv_alloc_pd; freed below only if the NIC let it go.
    let w = unsafe { &*(pd as *mut PdW) };
    if let Some(p) = &w.parent {
        // A parent domain: EBUSY while QPs or SRQs made on it exist; the PD it stands for
        // stays.
        if w.children.load(Ordering::Acquire) > 0 {
            return libc::EBUSY;
        }
        // SAFETY: the PD and thread domain it was made with outlive it (EBUSY above them).
        unsafe {
            (*p.base).children.fetch_sub(1, Ordering::AcqRel);
            if let Some(t) = p.td.as_ref() {
                t.refs.fetch_sub(1, Ordering::AcqRel);
            }
        }
        // SAFETY: from alloc_parent_domain, not used after this (the caller's contract).
        drop(unsafe { Box::from_raw(pd as *mut PdW) });
        return 0;
    }
    if w.children.load(Ordering::Acquire) > 0 {
        // Parent domains made on it.
        return libc::EBUSY;
    }
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let nic = nic_or!(unsafe { sh(w.c.context) }, |e| e);
    if let Err(e) = nic.dealloc_pd(w.pd) {
        // EBUSY while its MRs, QPs, SRQs or AHs exist, as on any provider.
        return errno_of(&e);
    }
    // SAFETY: a PD from ibv_alloc_pd, not used after this (the caller's contract).
    drop(unsafe { Box::from_raw(pd as *mut PdW) });
    0
}

/// A region's rights from `ibv_access_flags`: the four rights and `IBV_ACCESS_MW_BIND`; the
/// optional, zero-based and on-demand bits are not rights.
fn mr_access(access: c_int) -> AccessFlags {
    AccessFlags::from_bits_truncate(access as u32 & 0x1f)
}

/// The memory `ibv_reg_mr` registers: `len` bytes at `addr`, pinned, or with
/// `IBV_ACCESS_ON_DEMAND` on demand (`addr` NULL and `len` `SIZE_MAX`: the whole address
/// space, an implicit region). `None` for a range the library refuses (EINVAL).
///
/// # Safety
/// ibv_reg_mr's contract: `len` bytes at `addr` are the caller's, readable and writable (with
/// local write) until ibv_dereg_mr returns — the promise `AppMemory::new` asks; on demand,
/// only that the library may read and write what is mapped there meanwhile (what
/// `OnDemandMemory::new` asks: a C program's memory, no Rust reference into it).
///
/// A pinned range must be mapped, readable, and writable when `access` lets anything write
/// it, as the kernel's `ib_umem_get` pins it for a provider: otherwise `EFAULT` (not a later
/// fault in the engine). The range is looked up in `/proc/self/maps` at the call; a program
/// that unmaps it while it is registered breaks ibv_reg_mr's contract (on an RNIC the pages
/// stay pinned; here the engine would fault), which nothing here can catch.
unsafe fn user_memory(addr: *mut c_void, len: usize, access: c_int) -> Result<UserMemory, c_int> {
    if access & IBV_ACCESS_ON_DEMAND != 0 {
        if addr.is_null() && len != usize::MAX {
            return Err(EINVAL);
        }
        // SAFETY: the caller's promise (above).
        return unsafe { OnDemandMemory::new(addr as u64, len as u64) }
            .map(UserMemory::from)
            .ok_or(EINVAL);
    }
    // SAFETY: the caller's promise (above).
    let mem = unsafe { AppMemory::new(addr as *mut u8, len) }.ok_or(EINVAL)?;
    // What makes a region writable for the kernel's pinning (ib_access_writable).
    const WRITABLE: c_int = 1 | 2 | 8 | 16; // LOCAL_WRITE, REMOTE_WRITE, REMOTE_ATOMIC, MW_BIND
    if len > 0 {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        if !mapped(&maps, addr as u64, len as u64, access & WRITABLE != 0) {
            return Err(libc::EFAULT);
        }
    }
    Ok(UserMemory::from(mem))
}

/// Whether `/proc/<pid>/maps` text `maps` covers `[addr, addr + len)` with mappings that are
/// readable, and writable if `write` (adjacent mappings may split the range; a gap, a
/// `PROT_NONE` guard or a read-only part fails it).
fn mapped(maps: &str, addr: u64, len: u64, write: bool) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let mut at = addr;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else {
            continue;
        };
        if hi <= at {
            continue;
        }
        // The lines are in address order: the next one must begin where the range stands.
        let p = perms.as_bytes();
        if lo > at || p.first() != Some(&b'r') || (write && p.get(1) != Some(&b'w')) {
            return false;
        }
        at = hi;
        if at >= end {
            return true;
        }
    }
    false
}

unsafe fn reg(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    if pd.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: a PD from ibv_alloc_pd.
    let p = unsafe { &*(pd as *mut PdW) };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let s = unsafe { sh(p.c.context) };
    let acc = mr_access(access);
    // SAFETY: as `user_memory` asks: ibv_reg_mr's contract (see there).
    let mem = match unsafe { user_memory(addr, len, access) } {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    match nic_or!(s, fail).reg_mr_app(p.pd, mem, iova, acc) {
        Ok(mr) => {
            let w = Box::new(MrW {
                c: ibv_mr {
                    context: p.c.context,
                    pd,
                    addr,
                    length: len,
                    handle: 0,
                    lkey: mr.lkey().0,
                    rkey: mr.rkey().0,
                },
                mr,
                dm: null_mut(),
            });
            Box::into_raw(w) as *mut ibv_mr
        }
        Err(e) => fail(errno_of(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded.
    unsafe { reg(pd, addr, len, addr as u64, access) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    // SAFETY: forwarded.
    unsafe { reg(pd, addr, len, iova, access as c_int) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded.
    unsafe { reg(pd, addr, len, iova, access) }
}

/// `ibv_rereg_mr`: change a region's translation (`addr`, `length`), PD or rights in place;
/// the `struct ibv_mr` stays the caller's, with new keys. The new registration is made
/// before the old one goes, so on failure the region is still registered as it was.
/// Returns 0, `IBV_REREG_MR_ERR_INPUT` (-1) for arguments libibverbs refuses itself, or
/// `IBV_REREG_MR_ERR_CMD` (-4) when the registration fails; errno says why.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    const TRANSLATION: c_int = 1;
    const CHANGE_PD: c_int = 2;
    const CHANGE_ACCESS: c_int = 4;
    const ERR_INPUT: c_int = -1;
    const ERR_CMD: c_int = -4;
    let input = |bad: bool| {
        bad.then(|| {
            set_errno(EINVAL);
            ERR_INPUT
        })
    };
    if let Some(e) = input(
        mr.is_null()
            || flags & !(TRANSLATION | CHANGE_PD | CHANGE_ACCESS) != 0
            || (flags & TRANSLATION != 0 && (addr.is_null() || length == 0))
            || (access != 0 && flags & CHANGE_ACCESS == 0)
            || (flags & CHANGE_PD != 0 && pd.is_null()),
    ) {
        return e;
    }
    if flags == 0 {
        return 0;
    }
    // SAFETY: an MR from ibv_reg_mr that the caller still holds (libibverbs' contract).
    let w = unsafe { &mut *(mr as *mut MrW) };
    if !w.dm.is_null() {
        // A region over device memory is not re-registered (the kernel refuses it too).
        set_errno(EINVAL);
        return ERR_CMD;
    }
    let new_pd = if flags & CHANGE_PD != 0 { pd } else { w.c.pd };
    let (new_addr, new_len, iova) = if flags & TRANSLATION != 0 {
        (addr, length, addr as u64)
    } else {
        (w.c.addr, w.c.length, w.mr.addr())
    };
    let new_access = if flags & CHANGE_ACCESS != 0 {
        access
    } else if w.mr.is_on_demand() {
        w.mr.access().bits() as c_int | IBV_ACCESS_ON_DEMAND
    } else {
        w.mr.access().bits() as c_int
    };
    // SAFETY: a PD from ibv_alloc_pd (the caller's, libibverbs' contract, or the region's own).
    let p = unsafe { &*(new_pd as *mut PdW) };
    // SAFETY: the region's context is the one set at creation.
    let s = unsafe { sh(w.c.context) };
    let nic = nic_or!(s, |e| {
        set_errno(e);
        ERR_CMD
    });
    let acc = mr_access(new_access);
    // SAFETY: the caller's new range or the range the region already had, with ibv_reg_mr's
    // promise (see `user_memory`).
    // A range the kernel could not pin fails as its command would (EFAULT).
    let mem = match unsafe { user_memory(new_addr, new_len, new_access) } {
        Ok(m) => m,
        Err(e) => {
            set_errno(e);
            return if e == EINVAL { ERR_INPUT } else { ERR_CMD };
        }
    };
    // The keys stay while the PD does (Device::rereg_mr_app); a refused call leaves the region
    // as it was.
    match nic.rereg_mr_app(&w.mr, p.pd, mem, iova, acc) {
        Ok(region) => {
            w.c.pd = new_pd;
            w.c.addr = new_addr;
            w.c.length = new_len;
            // New keys when the PD changed (Device::rereg_mr_app).
            w.c.lkey = region.lkey().0;
            w.c.rkey = region.rkey().0;
            w.mr = region;
            0
        }
        Err(e) => {
            set_errno(errno_of(&e));
            ERR_CMD
        }
    }
}

/// `verbs_context.advise_mr` (the inline `ibv_advise_mr`): a prefetch hint for regions
/// registered on demand. ferroce finds each page when it is accessed (see
/// `ferroce::ib::OnDemandMemory`), so there is nothing to prefetch; the call checks what the
/// kernel checks for mlx5 and returns 0: the advice and flags known (else EOPNOTSUPP), at least
/// one entry (EINVAL), each entry's L_Key an on-demand region of this PD (ENOENT), writable
/// for `PREFETCH_WRITE` (ENOENT), the range inside it (EINVAL). Errors are returned, as
/// libibverbs' providers return them.
unsafe extern "C" fn advise_mr(
    pd: *mut ibv_pd,
    advice: c_int,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    if !(IBV_ADVISE_MR_ADVICE_PREFETCH..=IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT).contains(&advice)
        || flags & !IBV_ADVISE_MR_FLAG_FLUSH != 0
    {
        return EOPNOTSUPP;
    }
    if pd.is_null() || sg_list.is_null() || num_sge == 0 {
        return EINVAL;
    }
    // SAFETY: a PD from ibv_alloc_pd.
    let p = unsafe { &*(pd as *mut PdW) };
    // SAFETY: an object this library handed out (libibverbs' contract).
    let s = unsafe { sh(p.c.context) };
    let nic = nic_or!(s, |e| e);
    // SAFETY: `num_sge` entries at `sg_list` (the caller's contract).
    let sges = unsafe { std::slice::from_raw_parts(sg_list, num_sge as usize) };
    for e in sges {
        let Some(mr) = nic.mr_by_lkey(LKey(e.lkey)) else {
            return ENOENT;
        };
        if mr.pd() != p.pd
            || !mr.is_on_demand()
            || (advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE
                && !mr.access().contains(AccessFlags::LOCAL_WRITE))
        {
            return ENOENT;
        }
        if mr.offset_of(e.addr, u64::from(e.length)).is_none() {
            return EINVAL;
        }
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    if mr.is_null() {
        return EINVAL;
    }
    // SAFETY: an MR from ibv_reg_mr, not used after this.
    let w = unsafe { Box::from_raw(mr as *mut MrW) };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let s = unsafe { sh(w.c.context) };
    let r = match nic_or!(s, |e| e).dereg_mr(&w.mr) {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    };
    // SAFETY: the device memory under the region outlives it (ibv_free_dm: EBUSY until here).
    if let Some(d) = unsafe { w.dm.as_ref() } {
        d.mrs.fetch_sub(1, Ordering::AcqRel);
    }
    r
}

// ---- device memory --------------------------------------------------------------------------

/// The most device memory one allocation may have (`max_dm_size`), as an mlx5 NIC's on-chip
/// memory (MEMIC) offers 128–256 KiB.
pub(crate) const MAX_DM_SIZE: usize = 256 * 1024;

/// Device memory: `struct ibv_dm`, then the memory. ferroce's "device" memory is memory the
/// library allocates and owns, reached by the engine as any registered region's (there is no
/// on-NIC memory to be faster than host memory), by the program only through
/// `ibv_memcpy_to_dm`/`ibv_memcpy_from_dm`, as on a NIC.
#[repr(C)]
struct DmW {
    c: ibv_dm,
    mem: NonNull<u8>,
    len: usize,
    layout: std::alloc::Layout,
    /// Regions registered over it (`ibv_free_dm` is EBUSY while there are any).
    mrs: AtomicUsize,
}

/// `IBV_ACCESS_ZERO_BASED` and the rights a region over device memory may have (mlx5's).
const DM_MR_ACCESS: c_uint = 1 | 2 | 4 | 8 | IBV_ACCESS_ZERO_BASED | (1 << 20);

/// Device memory accesses are 4-byte units (mlx5's, which rdma-core's tests assume).
const DM_ALIGN: u64 = 4;

/// `verbs_context.alloc_dm` (the inline `ibv_alloc_dm`): `length` bytes (1 ..= `max_dm_size`)
/// aligned to `2^log_align_req` (at most 4096), zero; `comp_mask` 0. Else EINVAL.
unsafe extern "C" fn alloc_dm(c: *mut ibv_context, attr: *mut ibv_alloc_dm_attr) -> *mut ibv_dm {
    // SAFETY: the caller's attributes (libibverbs' contract).
    let Some(a) = (unsafe { attr.as_ref() }) else {
        return fail(EINVAL);
    };
    if c.is_null()
        || a.comp_mask != 0
        || a.length == 0
        || a.length > MAX_DM_SIZE
        || a.log_align_req > 12
    {
        return fail(EINVAL);
    }
    let Ok(layout) = std::alloc::Layout::from_size_align(a.length, 1 << a.log_align_req.max(3))
    else {
        return fail(EINVAL);
    };
    // SAFETY: a layout of non-zero size.
    let Some(mem) = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }) else {
        return fail(ENOMEM);
    };
    let w = Box::new(DmW {
        c: ibv_dm {
            context: c,
            memcpy_to_dm: Some(memcpy_to_dm),
            memcpy_from_dm: Some(memcpy_from_dm),
            comp_mask: 0,
            handle: 0,
        },
        mem,
        len: a.length,
        layout,
        mrs: AtomicUsize::new(0),
    });
    Box::into_raw(w) as *mut ibv_dm
}

/// `verbs_context.free_dm` (`ibv_free_dm`): EBUSY while regions are registered over it.
unsafe extern "C" fn free_dm(dm: *mut ibv_dm) -> c_int {
    // SAFETY: device memory of this library or NULL (libibverbs' contract).
    let Some(w) = (unsafe { (dm as *mut DmW).as_ref() }) else {
        return EINVAL;
    };
    if w.mrs.load(Ordering::Acquire) > 0 {
        return libc::EBUSY;
    }
    // SAFETY: from alloc_dm, not used after this (the caller's contract); no region is over
    // the memory (just checked), so nothing reaches it any more.
    unsafe {
        let b = Box::from_raw(dm as *mut DmW);
        std::alloc::dealloc(b.mem.as_ptr(), b.layout);
    }
    0
}

/// The bytes `[off, off + len)` of `w`, if they are whole 4-byte units inside it.
fn dm_range(w: &DmW, off: u64, len: usize) -> Option<usize> {
    let end = off.checked_add(len as u64)?;
    (off % DM_ALIGN == 0 && len as u64 % DM_ALIGN == 0 && end <= w.len as u64)
        .then_some(off as usize)
}

/// `ibv_dm.memcpy_to_dm` (`ibv_memcpy_to_dm`): EINVAL for a range outside the memory or not in
/// 4-byte units.
unsafe extern "C" fn memcpy_to_dm(
    dm: *mut ibv_dm,
    off: u64,
    src: *const c_void,
    len: usize,
) -> c_int {
    // SAFETY: device memory of this library or NULL (libibverbs' contract).
    let Some(w) = (unsafe { (dm as *mut DmW).as_ref() }) else {
        return EINVAL;
    };
    let Some(o) = dm_range(w, off, len) else {
        return EINVAL;
    };
    if len > 0 {
        if src.is_null() {
            return EINVAL;
        }
        // SAFETY: `len` bytes of the caller's at `src` (libibverbs' contract) into the
        // memory's `[o, o + len)` (checked above); distinct allocations. A region over these
        // bytes may be written by the engine meanwhile: that is the program's own access to
        // registered memory under DMA (point 4 of `ferroce::ib::appmem`'s safety argument),
        // through raw pointers only, as the engine's.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, w.mem.as_ptr().add(o), len) };
    }
    0
}

/// `ibv_dm.memcpy_from_dm` (`ibv_memcpy_from_dm`): as [`memcpy_to_dm`], the other way.
unsafe extern "C" fn memcpy_from_dm(
    dst: *mut c_void,
    dm: *mut ibv_dm,
    off: u64,
    len: usize,
) -> c_int {
    // SAFETY: device memory of this library or NULL (libibverbs' contract).
    let Some(w) = (unsafe { (dm as *mut DmW).as_ref() }) else {
        return EINVAL;
    };
    let Some(o) = dm_range(w, off, len) else {
        return EINVAL;
    };
    if len > 0 {
        if dst.is_null() {
            return EINVAL;
        }
        // SAFETY: the memory's `[o, o + len)` (checked above) into `len` bytes of the
        // caller's at `dst` (libibverbs' contract); distinct allocations; see memcpy_to_dm
        // on the engine's concurrent access.
        unsafe { std::ptr::copy_nonoverlapping(w.mem.as_ptr().add(o), dst as *mut u8, len) };
    }
    0
}

/// `verbs_context.reg_dm_mr` (the inline `ibv_reg_dm_mr`): a region over `length` bytes of
/// device memory from `offset`, zero-based (`IBV_ACCESS_ZERO_BASED` is required: its first
/// byte is address 0, as the kernel requires for every provider), with the rights asked.
/// EINVAL for another bit, a range outside the memory, or no zero-based bit.
unsafe extern "C" fn reg_dm_mr(
    pd: *mut ibv_pd,
    dm: *mut ibv_dm,
    offset: u64,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr {
    // SAFETY: a PD and device memory of this library, or NULL (libibverbs' contract).
    let (Some(p), Some(d)) = (unsafe { (pd as *mut PdW).as_ref() }, unsafe {
        (dm as *mut DmW).as_ref()
    }) else {
        return fail(EINVAL);
    };
    if access & !DM_MR_ACCESS != 0 || access & IBV_ACCESS_ZERO_BASED == 0 {
        return fail(EINVAL);
    }
    if offset
        .checked_add(length as u64)
        .is_none_or(|e| e > d.len as u64)
    {
        return fail(EINVAL);
    }
    // SAFETY: `length` bytes of the device memory from `offset` (inside it: checked), which
    // stays allocated until the region is deregistered (ibv_free_dm is EBUSY until then, and
    // ibv_dereg_mr releases the region's hold on it only after the engine let go), and which
    // no Rust reference ever covers (the memcpy calls use raw pointers).
    let Some(mem) = (unsafe { AppMemory::new(d.mem.as_ptr().add(offset as usize), length) }) else {
        return fail(EINVAL);
    };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let s = unsafe { sh(p.c.context) };
    match nic_or!(s, fail).reg_mr_app(p.pd, UserMemory::from(mem), 0, mr_access(access as c_int)) {
        Ok(mr) => {
            d.mrs.fetch_add(1, Ordering::AcqRel);
            let w = Box::new(MrW {
                c: ibv_mr {
                    context: p.c.context,
                    pd,
                    addr: null_mut(),
                    length,
                    handle: 0,
                    lkey: mr.lkey().0,
                    rkey: mr.rkey().0,
                },
                mr,
                dm: dm as *mut DmW,
            });
            Box::into_raw(w) as *mut ibv_mr
        }
        Err(e) => fail(errno_of(&e)),
    }
}

// ---- memory windows ---------------------------------------------------------------------------

/// A memory window: `struct ibv_mw`, then ferroce's handle.
#[repr(C)]
struct MwW {
    c: ibv_mw,
    mw: MemoryWindow,
}

/// `IBV_ACCESS_ZERO_BASED`.
const IBV_ACCESS_ZERO_BASED: c_uint = 1 << 5;

/// `ops.alloc_mw` (the inline `ibv_alloc_mw`): a window of type 1 or 2 (another: EINVAL).
unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, t: c_int) -> *mut ibv_mw {
    let Some(kind) = u32::try_from(t).ok().and_then(MwType::from_ibv) else {
        return fail(EINVAL);
    };
    // SAFETY: a PD of this library or NULL (libibverbs' contract).
    let Some(p) = (unsafe { (pd as *mut PdW).as_ref() }) else {
        return fail(EINVAL);
    };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let nic = nic_or!(unsafe { sh(p.c.context) }, fail);
    match nic.alloc_mw(p.pd, kind) {
        Ok(mw) => {
            let c = ibv_mw {
                context: p.c.context,
                pd,
                rkey: mw.rkey().0,
                handle: mw.index(),
                mw_type: t,
            };
            Box::into_raw(Box::new(MwW { c, mw })) as *mut ibv_mw
        }
        Err(e) => fail(errno_of(&e)),
    }
}

/// `ops.dealloc_mw` (`ibv_dealloc_mw`): its key stops working at once.
unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    if mw.is_null() {
        return EINVAL;
    }
    // SAFETY: a window from ibv_alloc_mw, not used after this (libibverbs' contract).
    let w = unsafe { Box::from_raw(mw as *mut MwW) };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let s = unsafe { sh(w.c.context) };
    match nic_or!(s, |e| e).dealloc_mw(&w.mw) {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}

/// The bind request `IBV_WR_BIND_MW` (and `ibv_wr_bind_mw`) names: window `mw`, its new
/// `rkey`, and what it is bound to; `None` for a NULL window or bind information.
///
/// # Safety
/// `mw` is a window of this library or NULL; `b`'s region, if not NULL, one of this library's.
pub(crate) unsafe fn bind_op(
    mw: *mut ibv_mw,
    rkey: u32,
    b: Option<&ibv_mw_bind_info>,
) -> Option<SendOp> {
    // SAFETY: the caller's promise.
    let m = unsafe { (mw as *mut MwW).as_ref() }?;
    Some(SendOp::BindMw {
        mw: m.mw.index(),
        kind: m.mw.kind(),
        rkey: RKey(rkey),
        // SAFETY: the caller's promise.
        info: unsafe { bind_info(b?) },
    })
}

/// `struct ibv_mw_bind_info` as the engine takes it: the region by its local key (none for
/// a NULL region), the remote rights (local write is the region's own), zero-based or not.
///
/// # Safety
/// `b.mr` is a region of this library or NULL.
unsafe fn bind_info(b: &ibv_mw_bind_info) -> MwBindInfo {
    // SAFETY: the caller's promise.
    let mr = unsafe { (b.mr as *mut MrW).as_ref() }.map(|m| m.mr.lkey());
    MwBindInfo {
        mr,
        addr: b.addr,
        length: b.length,
        access: AccessFlags::from_bits_truncate(b.mw_access_flags)
            & (AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC),
        zero_based: b.mw_access_flags & IBV_ACCESS_ZERO_BASED != 0,
    }
}

/// `ops.bind_mw` (the inline `ibv_bind_mw`, type 1 windows): posts the bind on `qp` with the
/// window's next R_Key (`ibv_inc_rkey`), which `mw->rkey` holds once posted, as rdma-core's
/// providers do; the bind takes effect, and completes, in the send queue's order.
unsafe extern "C" fn bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, b: *mut ibv_mw_bind) -> c_int {
    if qp.is_null() || mw.is_null() || b.is_null() {
        return EINVAL;
    }
    // SAFETY: a QP and a window of this library and the caller's request (libibverbs' contract).
    let (q, m, b) = unsafe { (&*(qp as *mut QpW), &mut *(mw as *mut MwW), &*b) };
    let rkey = ferroce::verbs::inc_rkey(RKey(m.c.rkey)).0;
    // SAFETY: the request's region is the caller's (one of this library's, or NULL).
    let Some(op) = (unsafe { bind_op(mw, rkey, Some(&b.bind_info)) }) else {
        return EINVAL;
    };
    let wr = SendWr::new(b.wr_id, op, SgList::new())
        .with_flags(SendFlags::from_bits_truncate(b.send_flags & 0xf));
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let s = unsafe { sh(q.c.context) };
    match nic_or!(s, |e| e).post_send(q.qpn, wr) {
        Ok(()) => {
            m.c.rkey = rkey;
            0
        }
        Err(e) => errno_of(&e),
    }
}

// ---- completion channels and CQs --------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(c: *mut ibv_context) -> *mut ibv_comp_channel {
    if c.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: eventfd(2); closed by ibv_destroy_comp_channel.
    // A blocking descriptor, as the kernel's: a program may set O_NONBLOCK on it, and then
    // ibv_get_cq_event returns EAGAIN instead of waiting.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return null_mut();
    }
    let w = Box::new(ChanW {
        c: ibv_comp_channel {
            context: c,
            fd,
            refcnt: 0,
        },
        inner: Arc::new(ChanInner {
            fd,
            cqs: Mutex::new(Vec::new()),
        }),
    });
    Box::into_raw(w) as *mut ibv_comp_channel
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    if ch.is_null() {
        return EINVAL;
    }
    // SAFETY: a channel from ibv_create_comp_channel.
    let w = unsafe { &*(ch as *mut ChanW) };
    if !w
        .inner
        .cqs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_empty()
    {
        return libc::EBUSY;
    }
    // SAFETY: not used by the program after this. The descriptor closes with the last
    // reference (now, unless a thread still waits in ibv_get_cq_event on the channel).
    drop(unsafe { Box::from_raw(ch as *mut ChanW) });
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    c: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    if c.is_null() || cqe <= 0 {
        return fail(EINVAL);
    }
    // A completion vector the device does not have (it has `num_comp_vectors`, 1) is EINVAL,
    // as the kernel's create_cq checks it (rdma-core's tests/test_cq.py asks for one past).
    // SAFETY: caller's context.
    if comp_vector < 0 || comp_vector >= unsafe { (*c).num_comp_vectors } {
        return fail(EINVAL);
    }
    // SAFETY: caller's context.
    let s = unsafe { sh(c) };
    let nic = nic_or!(s, fail);
    let cq = match nic.create_cq(cqe as usize) {
        Ok(q) => q,
        Err(e) => return fail(errno_of(&e)),
    };
    // SAFETY: plain C data (the mutex and condition variable all-zero are their initialisers).
    let mut cc: ibv_cq = unsafe { std::mem::zeroed() };
    cc.context = c;
    cc.channel = channel;
    cc.cq_context = cq_context;
    cc.handle = cq.index();
    cc.cqe = cqe;
    let p = Box::into_raw(Box::new(CqW {
        c: cc,
        ex: crate::ex::cq_ex_tail(),
        cq,
        poll: Mutex::new(Default::default()),
        events: Default::default(),
        acked: Default::default(),
        parent_pd: Default::default(),
    })) as *mut ibv_cq;
    objects(|o| o.cqs.insert(cq.index(), (p as usize, c as usize)));
    if !channel.is_null() {
        // SAFETY: a channel from ibv_create_comp_channel.
        let ch = unsafe { &*(channel as *mut ChanW) };
        ch.inner
            .cqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((cq, p as usize));
        let inner = ch.inner.clone();
        let notify: ferroce::runtime::CqNotify = Arc::new(move || {
            let one: u64 = 1;
            // SAFETY: an 8-byte write from a local to the channel's eventfd, open while this
            // notification holds the channel.
            unsafe { libc::write(inner.fd, &one as *const u64 as *const c_void, 8) };
        });
        let _ = nic.set_cq_notify(cq, Some(notify));
    }
    p
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    if cq.is_null() {
        return EINVAL;
    }
    {
        // SAFETY: a CQ from ibv_create_cq; freed below only if the NIC let it go.
        let w = unsafe { &*(cq as *mut CqW) };
        // SAFETY: the CQ's channel is one of ours (or NULL), alive while CQs are bound to it.
        let ch = (!w.c.channel.is_null()).then(|| unsafe { &*(w.c.channel as *mut ChanW) });
        // Unbound first, so that no ibv_get_cq_event hands it out from now on; then, as
        // libibverbs, wait until every event handed out is acknowledged (a completion thread
        // may still be handling one).
        let mut pos = None;
        if let Some(ch) = ch {
            let mut l = ch.inner.cqs.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = l.iter().position(|&(_, p)| p == cq as usize) {
                pos = Some((i, l.remove(i)));
            }
        }
        let acked = crate::wait_until(
            CQ_ACKS.0.lock().unwrap_or_else(|e| e.into_inner()),
            &CQ_ACKS.1,
            CQ_ACK_WAIT,
            |_| {
                w.events
                    .load(Ordering::Acquire)
                    .wrapping_sub(w.acked.load(Ordering::Acquire)) as i32
                    <= 0
            },
        )
        .1;
        if !acked && std::env::var_os("FERROCE_DEBUG").is_some() {
            eprintln!(
                "ferroce libibverbs: ibv_destroy_cq: events still not acknowledged after \
                 {CQ_ACK_WAIT:?}; destroyed anyway"
            );
        }
        // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
        let nic = nic_or!(unsafe { sh(w.c.context) }, |e| e);
        if let Err(e) = nic.destroy_cq(w.cq) {
            // EBUSY while a QP completes into it: bound to its channel again.
            if let (Some(ch), Some((i, e))) = (ch, pos) {
                let mut l = ch.inner.cqs.lock().unwrap_or_else(|e| e.into_inner());
                let i = i.min(l.len());
                l.insert(i, e);
            }
            return errno_of(&e);
        }
    }
    // SAFETY: a CQ from ibv_create_cq, not used after this.
    let w = unsafe { Box::from_raw(cq as *mut CqW) };
    hold_pd(w.parent_pd.load(Ordering::Acquire), false);
    // The number may already belong to a CQ another thread created since: only this CQ's
    // entries go (its notification went with the engine's CQ).
    objects(|o| {
        if o.cqs
            .get(&w.cq.index())
            .is_some_and(|&(p, _)| p == cq as usize)
        {
            o.cqs.remove(&w.cq.index());
        }
    });
    0
}

/// `ibv_resize_cq`: the CQ holds `cqe` completions from now on (`cq->cqe` says so);
/// EINVAL below one, above `max_cqe` or below what it holds, the CQ unchanged.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    if cq.is_null() || cqe <= 0 {
        return EINVAL;
    }
    // SAFETY: a CQ from ibv_create_cq that the caller still holds (libibverbs' contract).
    let w = unsafe { &mut *(cq as *mut CqW) };
    // SAFETY: its context pointer is the one set at creation.
    let nic = nic_or!(unsafe { sh(w.c.context) }, |e| e);
    match nic.resize_cq(w.cq, cqe as usize) {
        Ok(()) => {
            w.c.cqe = cqe;
            0
        }
        Err(e) => errno_of(&e),
    }
}

/// `ibv_get_cq_event`: block until a CQ bound to the channel fires an armed notification.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    ctx_out: *mut *mut c_void,
) -> c_int {
    if ch.is_null() || cq_out.is_null() {
        set_errno(EINVAL);
        return -1;
    }
    // SAFETY: a channel from ibv_create_comp_channel. Its inner part is held from here on:
    // the program may destroy the channel while this thread waits.
    let (context, w) = unsafe {
        (
            (*(ch as *mut ChanW)).c.context,
            (*(ch as *mut ChanW)).inner.clone(),
        )
    };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let s = unsafe { sh(context) };
    // SAFETY: fcntl on the channel's own descriptor.
    let nonblock = unsafe { libc::fcntl(w.fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    // A blocking wait returns -1 with EINTR when a signal handler runs meanwhile, as
    // rdma-core's `read()` of the channel does for a handler installed without SA_RESTART
    // (qperf's SIGALRM ends its test while the server waits here); with SA_RESTART the
    // kernel restarts such a read, and the wait goes on here too (`handlers_restart`).
    ferroce::io::event::watch_interrupts(!nonblock);
    // SAFETY: the caller's out parameters, checked above (libibverbs' contract).
    let r = unsafe { get_cq_event_loop(s, &w, nonblock, cq_out, ctx_out) };
    ferroce::io::event::watch_interrupts(false);
    r
}

/// The body of [`ibv_get_cq_event`].
///
/// # Safety
/// As [`ibv_get_cq_event`]'s: `cq_out` is writable, `ctx_out` null or writable.
unsafe fn get_cq_event_loop(
    s: &Shared,
    w: &Arc<ChanInner>,
    nonblock: bool,
    cq_out: *mut *mut ibv_cq,
    ctx_out: *mut *mut c_void,
) -> c_int {
    let interrupted = || {
        if !ferroce::io::event::interrupted() {
            return false;
        }
        if handlers_restart() {
            // The kernel would have restarted the read: wait on, watching again.
            ferroce::io::event::watch_interrupts(true);
            return false;
        }
        set_errno(libc::EINTR);
        true
    };
    let nic = nic_or!(s, |e| {
        set_errno(e);
        -1
    });
    let inline = nic.drives_inline();
    let mut idle_readable = false;
    loop {
        let cqs = w.cqs.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if cqs.is_empty() {
            if nonblock {
                set_errno(libc::EAGAIN);
                return -1;
            }
            // Sleep on the channel's descriptor (a wait that notices a signal).
            let _ = ferroce::io::event::poll_readable(&[w.fd], Some(Duration::from_millis(10)));
            if interrupted() {
                return -1;
            }
            continue;
        }
        if !nonblock && !inline {
            // An engine thread notifies: wait on the descriptor it makes readable, where a
            // signal is noticed (the CQ's own wait is a condition variable, where it is not).
            // After a round that found the descriptor readable and no event (another thread
            // took it), sleep a little instead of finding it readable again at once.
            let wait = if idle_readable {
                Duration::from_micros(200)
            } else {
                Duration::from_secs(1)
            };
            let fds: &[c_int] = if idle_readable { &[] } else { &[w.fd] };
            idle_readable = matches!(ferroce::io::event::poll_readable(fds, Some(wait)), Ok(true));
            if interrupted() {
                return -1;
            }
        }
        // With several CQs on the channel, each is only looked at here; the wait below is
        // for any of them (a wait on each in turn slept on one while another's event waited:
        // perftest's UD and RC `-e` latency tests, whose send and receive CQs share a
        // channel, took ~0.6 ms a round trip).
        let slice = if nonblock || !inline || cqs.len() > 1 {
            Duration::ZERO
        } else {
            Duration::from_secs(1)
        };
        for &(cq, p) in &cqs {
            if let Ok(true) = nic.get_cq_event(cq, slice) {
                // The descriptor counts notifications: take this one off it (a read of the
                // whole count), and make it readable again if others wait.
                let mut v = 0u64;
                // SAFETY: reads 8 bytes into a local from the channel's eventfd; it is
                // readable (this notification signalled it), so the read does not block.
                let _ = unsafe { libc::read(w.fd, &mut v as *mut u64 as *mut c_void, 8) };
                let more: u64 = cqs
                    .iter()
                    .map(|&(q, _)| nic.cq_events_pending(q).unwrap_or(0))
                    .sum();
                if more > 0 {
                    let one = 1u64;
                    // SAFETY: an 8-byte write from a local to the channel's eventfd.
                    unsafe { libc::write(w.fd, &one as *const u64 as *const c_void, 8) };
                }
                // The CQ may have been destroyed by another thread since the list was read:
                // read it only while it is still bound (ibv_destroy_cq unbinds it, under this
                // lock, before it frees it).
                let bound = w.cqs.lock().unwrap_or_else(|e| e.into_inner());
                if !bound.iter().any(|&(_, q)| q == p) {
                    continue;
                }
                let p = p as *mut ibv_cq;
                // SAFETY: out parameters; `p` is a live CQ bound to the channel (the lock
                // held keeps it so).
                unsafe {
                    (*(p as *mut CqW)).events.fetch_add(1, Ordering::AcqRel);
                    *cq_out = p;
                    if !ctx_out.is_null() {
                        *ctx_out = (*p).cq_context;
                    }
                }
                return 0;
            }
            if interrupted() {
                return -1;
            }
        }
        if nonblock {
            set_errno(libc::EAGAIN);
            return -1;
        }
        if inline && cqs.len() > 1 {
            let handles: Vec<Cq> = cqs.iter().map(|&(cq, _)| cq).collect();
            let _ = nic.wait_cq_events(&handles, Duration::from_secs(1));
            if interrupted() {
                return -1;
            }
        }
    }
}

/// Whether the kernel would restart a `read()` that a signal interrupted: every signal the
/// program catches has `SA_RESTART` (the wait does not know which signal it was). Faults are
/// left out: they are the thread's own, never a wait's interruption.
fn handlers_restart() -> bool {
    use libc::{SIGBUS, SIGFPE, SIGILL, SIGKILL, SIGSEGV, SIGSTOP, SIGTRAP};
    (1..=libc::SIGRTMAX())
        .filter(|s| ![SIGKILL, SIGSTOP, SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP].contains(s))
        .all(|sig| {
            // SAFETY: plain C data.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: a query (no new action); `old` is a local the call fills.
            if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
                return true;
            }
            old.sa_sigaction == libc::SIG_DFL
                || old.sa_sigaction == libc::SIG_IGN
                || old.sa_flags & libc::SA_RESTART != 0
        })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, n: u32) {
    if !cq.is_null() {
        // SAFETY: a CQ from ibv_create_cq.
        unsafe { (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(n) };
        // SAFETY: as above.
        let w = unsafe { &*(cq as *mut CqW) };
        let _g = CQ_ACKS.0.lock().unwrap_or_else(|e| e.into_inner());
        w.acked.fetch_add(n, Ordering::AcqRel);
        CQ_ACKS.1.notify_all();
    }
}

unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited: c_int) -> c_int {
    if cq.is_null() {
        return EINVAL;
    }
    // SAFETY: a CQ from ibv_create_cq.
    let w = unsafe { &*(cq as *mut CqW) };
    let mode = if solicited != 0 {
        NotifyMode::SolicitedOnly
    } else {
        NotifyMode::NextCompletion
    };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    match nic_or!(unsafe { sh(w.c.context) }, |e| e).req_notify_cq(w.cq, mode) {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}

pub(crate) fn to_c_wc(w: &WorkCompletion) -> ibv_wc {
    let mut flags = 0;
    if w.wc_flags.contains(WcFlags::GRH) {
        flags |= 1;
    }
    if w.wc_flags.contains(WcFlags::WITH_IMM) {
        flags |= 2;
    }
    if w.wc_flags.contains(WcFlags::WITH_INV) {
        flags |= 8;
    }
    let imm = match (w.imm_data, w.invalidated_rkey) {
        (Some(i), _) => i.to_be(),
        (None, Some(k)) => k.0,
        _ => 0,
    };
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status.to_ibv() as c_int,
        opcode: w.opcode.to_ibv() as c_int,
        vendor_err: 0,
        byte_len: w.byte_len,
        imm_data: imm,
        qp_num: w.qp_num.get(),
        src_qp: w.src_qp.get(),
        wc_flags: flags,
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
    }
}

thread_local! {
    static WCS: std::cell::RefCell<Vec<WorkCompletion>> = const { std::cell::RefCell::new(Vec::new()) };
}

unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    if cq.is_null() || n < 0 || (n > 0 && wc.is_null()) {
        return -EINVAL;
    }
    // SAFETY: a CQ from ibv_create_cq.
    let w = unsafe { &*(cq as *mut CqW) };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let nic = nic_or!(unsafe { sh(w.c.context) }, |e: c_int| -e);
    WCS.with(|v| {
        let mut v = v.borrow_mut();
        v.clear();
        match nic.poll_cq(w.cq, &mut v, n as usize) {
            Ok(k) => {
                for (i, x) in v.iter().take(k).enumerate() {
                    // SAFETY: the caller's array of `n` >= k entries.
                    unsafe { *wc.add(i) = to_c_wc(x) };
                }
                k as c_int
            }
            Err(_) => -EINVAL,
        }
    })
}

/// Waits up to `timeout` for a completion on `cq`. With the inline engine the waiting
/// thread drives it, sleeping in the packet device: a thread that sleeps in `poll()` on the
/// completion channel instead is woken only once the engine's background thread takes over
/// (`INLINE_TAKEOVER` after the last call in, then its wake-up): hundreds of microseconds.
///
/// # Safety
/// `cq` is a live CQ of this library.
pub(crate) unsafe fn wait_cq_for(cq: *mut ibv_cq, timeout: Duration) -> bool {
    // SAFETY: the caller's contract.
    let w = unsafe { &*(cq as *mut CqW) };
    // SAFETY: as above; its context pointer is the one set at creation.
    let s = unsafe { sh(w.c.context) };
    s.nic()
        .is_ok_and(|n| n.wait_cq(w.cq, timeout).unwrap_or(false))
}

// ---- shared receive queues ----------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    if pd.is_null() || init.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: a PD from ibv_alloc_pd and the caller's attributes.
    let (p, init) = unsafe { (&*(pd as *mut PdW), &mut *init) };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let s = unsafe { sh(p.c.context) };
    let attr = SrqAttr {
        max_wr: init.attr.max_wr,
        max_sge: init.attr.max_sge,
        srq_limit: init.attr.srq_limit,
    };
    let nic = nic_or!(s, fail);
    match nic.create_srq(p.pd, attr) {
        Ok(srq) => srq_object(nic, pd, p.c.context, srq, init.srq_context, &mut init.attr),
        Err(e) => fail(errno_of(&e)),
    }
}

/// The C object of SRQ `srq` made on `pd` of context `ctx`; `attr` (the caller's) gets the
/// sizes the SRQ was given, as rdma-core's providers write them back.
fn srq_object(
    nic: &ferroce::runtime::Nic,
    pd: *mut ibv_pd,
    ctx: *mut ibv_context,
    srq: Srq,
    srq_context: *mut c_void,
    attr: &mut ibv_srq_attr,
) -> *mut ibv_srq {
    let mut max_sge = attr.max_sge;
    if let Ok(g) = nic.query_srq(srq) {
        attr.max_wr = g.max_wr;
        attr.max_sge = g.max_sge;
        max_sge = g.max_sge;
    }
    // SAFETY: plain C data.
    let mut c: ibv_srq = unsafe { std::mem::zeroed() };
    c.context = ctx;
    c.srq_context = srq_context;
    c.pd = pd;
    c.handle = srq.number();
    let owner = c.context as usize;
    hold_pd(c.pd, true);
    let p = Box::into_raw(Box::new(SrqW { c, srq, max_sge })) as *mut ibv_srq;
    objects(|o| o.srqs.insert(srq.number(), (p as usize, owner)));
    p
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    if srq.is_null() || attr.is_null() {
        return EINVAL;
    }
    // SAFETY: an SRQ from ibv_create_srq and the caller's attributes.
    let (w, a) = unsafe { (&*(srq as *mut SrqW), &*attr) };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let s = unsafe { sh(w.c.context) };
    let at = SrqAttr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    };
    match nic_or!(s, |e| e).modify_srq(w.srq, &at, SrqAttrMask::from_bits_truncate(mask as u32)) {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    if srq.is_null() || attr.is_null() {
        return EINVAL;
    }
    // SAFETY: as ibv_modify_srq.
    let w = unsafe { &*(srq as *mut SrqW) };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    match nic_or!(unsafe { sh(w.c.context) }, |e| e).query_srq(w.srq) {
        Ok(a) => {
            // SAFETY: the caller's out structure, valid for writes (libibverbs' contract).
            unsafe {
                *attr = ibv_srq_attr {
                    max_wr: a.max_wr,
                    max_sge: a.max_sge,
                    srq_limit: a.srq_limit,
                }
            };
            0
        }
        Err(e) => errno_of(&e),
    }
}

// ---- XRC ---------------------------------------------------------------------------------

/// An XRC domain of this library.
#[repr(C)]
struct XrcdW {
    c: ibv_xrcd,
    xrcd: Xrcd,
    /// The file it was opened through (its device and inode), if any.
    file: Option<(u64, u64)>,
}

/// The XRC domains opened through a file, by (context, device, inode): the domain and how
/// many opens hold it. Every `ibv_open_xrcd` of the same file in a context gives the same
/// domain, as the kernel's inode table does for one process. (The kernel shares a domain
/// between processes through the file too; each process here has its own device, so a
/// domain is this process's only.)
static XRCD_FILES: Mutex<Option<XrcdFiles>> = Mutex::new(None);

/// (context, device, inode) → (the `XrcdW`, its opens).
type XrcdFiles = HashMap<(usize, u64, u64), (usize, u32)>;

fn xrcd_files<R>(f: impl FnOnce(&mut XrcdFiles) -> R) -> R {
    let mut g = XRCD_FILES.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

/// `ibv_open_xrcd` (through `verbs_context.open_xrcd`): both `fd` and `oflags` must be given
/// (as the kernel's command requires); `fd` -1 opens a domain of its own, a file's descriptor
/// the file's domain (`O_CREAT` makes it if there is none, else EINVAL; with `O_EXCL` an
/// existing one is EEXIST).
pub(crate) unsafe extern "C" fn open_xrcd(
    ctx: *mut ibv_context,
    attr: *mut ibv_xrcd_init_attr,
) -> *mut ibv_xrcd {
    if ctx.is_null() || attr.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &*attr };
    let both = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    if a.comp_mask & !both != 0 {
        return fail(EOPNOTSUPP);
    }
    if a.comp_mask & both != both || a.oflags & !(libc::O_CREAT | libc::O_EXCL) != 0 {
        return fail(EINVAL);
    }
    let file = if a.fd == -1 {
        None
    } else {
        // SAFETY: plain C data.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat(2) into a local structure; a bad descriptor is an error it returns.
        if unsafe { libc::fstat(a.fd, &mut st) } != 0 {
            return fail(libc::EBADF);
        }
        Some((st.st_dev as u64, st.st_ino as u64))
    };
    // SAFETY: a context of this library (libibverbs' contract).
    let s = unsafe { sh(ctx) };
    let nic = nic_or!(s, fail);
    let make = || -> Result<*mut XrcdW, c_int> {
        let xrcd = nic.alloc_xrcd().map_err(|e| errno_of(&e))?;
        Ok(Box::into_raw(Box::new(XrcdW {
            c: ibv_xrcd { context: ctx },
            xrcd,
            file,
        })))
    };
    let r = match file {
        None => make(),
        Some((dev, ino)) => xrcd_files(|m| match m.get_mut(&(ctx as usize, dev, ino)) {
            Some(_) if a.oflags & libc::O_CREAT != 0 && a.oflags & libc::O_EXCL != 0 => {
                Err(libc::EEXIST)
            }
            Some((p, opens)) => {
                *opens += 1;
                Ok(*p as *mut XrcdW)
            }
            None if a.oflags & libc::O_CREAT == 0 => Err(EINVAL),
            None => {
                let p = make()?;
                m.insert((ctx as usize, dev, ino), (p as usize, 1));
                Ok(p)
            }
        }),
    };
    match r {
        Ok(p) => p as *mut ibv_xrcd,
        Err(e) => fail(e),
    }
}

/// `ibv_close_xrcd`: the last close of a domain frees it (EBUSY while its XRC SRQs or target
/// QPs exist).
unsafe extern "C" fn close_xrcd(x: *mut ibv_xrcd) -> c_int {
    if x.is_null() {
        return EINVAL;
    }
    // SAFETY: a domain from open_xrcd (libibverbs' contract).
    let w = unsafe { &*(x as *mut XrcdW) };
    let ctx = w.c.context;
    let key = w.file.map(|(d, i)| (ctx as usize, d, i));
    let last = match key {
        None => true,
        Some(k) => xrcd_files(|m| match m.get_mut(&k) {
            Some((_, opens)) if *opens > 1 => {
                *opens -= 1;
                false
            }
            _ => true,
        }),
    };
    if !last {
        return 0;
    }
    // SAFETY: a context of this library.
    if let Err(e) = nic_or!(unsafe { sh(ctx) }, |e| e).dealloc_xrcd(w.xrcd) {
        return errno_of(&e);
    }
    if let Some(k) = key {
        xrcd_files(|m| m.remove(&k));
    }
    // SAFETY: not used after this.
    drop(unsafe { Box::from_raw(x as *mut XrcdW) });
    0
}

/// `ibv_create_srq_ex` (through `verbs_context.create_srq_ex`; libibverbs itself sends a
/// basic SRQ with a PD to `ibv_create_srq`): an XRC SRQ needs its PD, domain and CQ; a basic
/// one its PD; tag matching is EOPNOTSUPP.
pub(crate) unsafe extern "C" fn create_srq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    if ctx.is_null() || attr.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    let known = IBV_SRQ_INIT_ATTR_TYPE
        | IBV_SRQ_INIT_ATTR_PD
        | IBV_SRQ_INIT_ATTR_XRCD
        | IBV_SRQ_INIT_ATTR_CQ;
    if a.comp_mask & !known != 0 {
        return fail(EOPNOTSUPP);
    }
    let ty = if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0 {
        a.srq_type
    } else {
        IBV_SRQT_BASIC
    };
    if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
        return fail(EINVAL);
    }
    match ty {
        IBV_SRQT_BASIC => {
            let mut basic = ibv_srq_init_attr {
                srq_context: a.srq_context,
                attr: a.attr,
            };
            // SAFETY: the caller's PD, the basic attributes just made.
            let r = unsafe { ibv_create_srq(a.pd, &mut basic) };
            a.attr = basic.attr;
            r
        }
        IBV_SRQT_XRC => {
            let need = IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
            if a.comp_mask & need != need || a.xrcd.is_null() || a.cq.is_null() {
                return fail(EINVAL);
            }
            // SAFETY: a PD, a domain and a CQ of this library (libibverbs' contract).
            let (p, x, cq) = unsafe {
                (
                    &*(a.pd as *mut PdW),
                    &*(a.xrcd as *mut XrcdW),
                    (*(a.cq as *mut CqW)).cq,
                )
            };
            let attr = SrqAttr {
                max_wr: a.attr.max_wr,
                max_sge: a.attr.max_sge,
                srq_limit: a.attr.srq_limit,
            };
            // SAFETY: an object this library handed out; its context pointer is the one set
            // at creation.
            let s = unsafe { sh(p.c.context) };
            let nic = nic_or!(s, fail);
            match nic.create_xrc_srq(p.pd, attr, x.xrcd, cq) {
                Ok(srq) => srq_object(nic, a.pd, p.c.context, srq, a.srq_context, &mut a.attr),
                Err(e) => fail(errno_of(&e)),
            }
        }
        _ => fail(EOPNOTSUPP),
    }
}

/// `ibv_get_srq_num`: the number initiators name (XRCETH).
unsafe extern "C" fn get_srq_num(srq: *mut ibv_srq, num: *mut u32) -> c_int {
    if srq.is_null() || num.is_null() {
        return EINVAL;
    }
    // SAFETY: an SRQ of this library and the caller's out parameter.
    unsafe { *num = (*(srq as *mut SrqW)).srq.number() };
    0
}

/// `ibv_create_qp_ex` of an XRC target QP (`IBV_QPT_XRC_RECV` in domain `a.xrcd`): no PD,
/// CQ, SRQ or queue (the object's pointers to them are NULL, as rdma-core leaves them).
///
/// # Safety
/// `ctx` is a context of this library, `a.xrcd` a domain from `open_xrcd` not yet closed.
pub(crate) unsafe fn create_xrc_recv_qp(
    ctx: *mut ibv_context,
    a: &mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    // SAFETY: per the contract.
    let Some(x) = (unsafe { (a.xrcd as *mut XrcdW).as_ref() }) else {
        return fail(EINVAL);
    };
    let ctx = if ctx.is_null() { x.c.context } else { ctx };
    // SAFETY: a context of this library.
    let s = unsafe { sh(ctx) };
    let nic = nic_or!(s, fail);
    let qpn = match nic.create_qp(QpInitAttr::xrc_recv(x.xrcd)) {
        Ok(q) => q,
        Err(e) => return fail(errno_of(&e)),
    };
    a.cap = ibv_qp_cap {
        max_send_wr: 0,
        max_recv_wr: 0,
        max_send_sge: 0,
        max_recv_sge: 0,
        max_inline_data: 0,
    };
    // SAFETY: plain C data.
    let mut c: ibv_qp = unsafe { std::mem::zeroed() };
    c.context = ctx;
    c.qp_context = a.qp_context;
    c.handle = qpn.get();
    c.qp_num = qpn.get();
    c.qp_type = IBV_QPT_XRC_RECV;
    let p = Box::into_raw(Box::new(QpW {
        c,
        ex: crate::ex::qp_ex_tail(),
        qpn,
        qp_type: QpType::XrcRecv,
        max_send_sge: 0,
        max_recv_sge: 0,
        ex_on: false,
        tx: Mutex::new(crate::ex::Tx::new(None)),
    })) as *mut ibv_qp;
    objects(|o| o.qps.insert(qpn.get(), (p as usize, ctx as usize)));
    p
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    if srq.is_null() {
        return EINVAL;
    }
    // SAFETY: an SRQ from ibv_create_srq.
    let w = unsafe { &*(srq as *mut SrqW) };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    match nic_or!(unsafe { sh(w.c.context) }, |e| e).destroy_srq(w.srq) {
        Ok(()) => {
            objects(|o| o.srqs.remove(&w.srq.number()));
            hold_pd(w.c.pd, false);
            // SAFETY: not used after this.
            drop(unsafe { Box::from_raw(srq as *mut SrqW) });
            0
        }
        Err(e) => errno_of(&e),
    }
}

/// The scatter/gather list of a work request.
///
/// A count beyond `max` (the queue's limit) is refused before anything is read: a wrong
/// count must not make the library read past the caller's array (found by the C entry point
/// fuzzer: `num_sge` 48,148 with an array of 40 entries read unmapped memory).
///
/// # Safety
/// `sg` points to `n` entries (or `n` is 0 or beyond `max`).
unsafe fn sges(sg: *const ibv_sge, n: c_int, max: u32) -> Result<SgList, c_int> {
    if n < 0 || (n > 0 && sg.is_null()) || n as u32 > max {
        return Err(EINVAL);
    }
    if n == 0 {
        // No entries: the list may be NULL (a slice from a NULL pointer is undefined even
        // when empty; the fuzzer's debug build stopped on it).
        return Ok(SgList::new());
    }
    // SAFETY: the caller's array.
    let s = unsafe { std::slice::from_raw_parts(sg, n as usize) };
    Ok(s.iter()
        .map(|e| Sge {
            addr: e.addr,
            length: e.length,
            lkey: LKey(e.lkey),
        })
        .collect())
}

/// A C work request list: each request names the next (NULL ends it).
trait WrList {
    fn next(&self) -> *mut Self;
}

impl WrList for ibv_send_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
}

impl WrList for ibv_recv_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
}

/// Post each request of the list `wr` with `post`, in order. The first one refused stops the
/// walk: `*bad` names it and its errno is returned, as libibverbs' post verbs do.
///
/// # Safety
/// `wr` is NULL or the caller's list of live requests; `bad` is NULL or writable.
unsafe fn post_list<W: WrList>(
    mut wr: *mut W,
    bad: *mut *mut W,
    mut post: impl FnMut(&W) -> Result<(), c_int>,
) -> c_int {
    while !wr.is_null() {
        // SAFETY: the caller's work request list: live requests (libibverbs' contract).
        let r = unsafe { &*wr };
        if let Err(e) = post(r) {
            if !bad.is_null() {
                // SAFETY: the caller's out parameter.
                unsafe { *bad = wr };
            }
            return e;
        }
        wr = r.next();
    }
    0
}

/// A receive request as the engine takes it (at most `max` entries).
fn recv_wr(r: &ibv_recv_wr, max: u32) -> Result<RecvWr, c_int> {
    // SAFETY: the request's scatter/gather list holds num_sge entries (libibverbs' contract).
    let sg_list = unsafe { sges(r.sg_list, r.num_sge, max) }?;
    Ok(RecvWr {
        wr_id: r.wr_id,
        sg_list,
    })
}

unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    if srq.is_null() {
        return EINVAL;
    }
    // SAFETY: an SRQ from ibv_create_srq.
    let w = unsafe { &*(srq as *mut SrqW) };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let s = unsafe { sh(w.c.context) };
    // SAFETY: the caller's list and out parameter (libibverbs' contract).
    unsafe {
        post_list(wr, bad, |r| {
            let x = recv_wr(r, w.max_sge)?;
            s.nic()?.post_srq_recv(w.srq, x).map_err(|e| errno_of(&e))
        })
    }
}

// ---- queue pairs -----------------------------------------------------------------------------------

fn qp_type_of(t: c_int) -> Option<QpType> {
    match t {
        2 => Some(QpType::Rc),
        3 => Some(QpType::Uc),
        4 => Some(QpType::Ud),
        IBV_QPT_XRC_SEND => Some(QpType::XrcSend),
        IBV_QPT_XRC_RECV => Some(QpType::XrcRecv),
        _ => None,
    }
}

fn qp_type_code(t: QpType) -> c_int {
    match t {
        QpType::Rc => 2,
        QpType::Uc => 3,
        QpType::Ud => 4,
        QpType::XrcSend => IBV_QPT_XRC_SEND,
        QpType::XrcRecv => IBV_QPT_XRC_RECV,
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    if pd.is_null() || init.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: a PD from ibv_alloc_pd; the caller's attributes with CQs (and an SRQ) of ours.
    let (p, ia) = unsafe { (&*(pd as *mut PdW), &mut *init) };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let s = unsafe { sh(p.c.context) };
    let Some(qp_type) = qp_type_of(ia.qp_type) else {
        return fail(EOPNOTSUPP);
    };
    if qp_type == QpType::XrcRecv {
        // A target QP has a domain, not a PD: `ibv_create_qp_ex` with IBV_QP_INIT_ATTR_XRCD.
        return fail(EINVAL);
    }
    if qp_type == QpType::XrcSend {
        // An initiator receives nothing: no receive CQ or SRQ (rdma-core's providers ignore
        // the receive CQ; its completions are the send CQ's).
        if !ia.srq.is_null() {
            return fail(EINVAL);
        }
        ia.recv_cq = ia.send_cq;
        ia.cap.max_recv_wr = 0;
        ia.cap.max_recv_sge = 0;
    }
    if ia.send_cq.is_null() || ia.recv_cq.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: the caller's out structure, valid for writes (libibverbs' contract).
    let (scq, rcq) = unsafe {
        (
            (*(ia.send_cq as *mut CqW)).cq,
            (*(ia.recv_cq as *mut CqW)).cq,
        )
    };
    // SAFETY: CQs, SRQs and AHs the caller names are ours and alive (libibverbs' contract).
    let srq = (!ia.srq.is_null()).then(|| unsafe { (*(ia.srq as *mut SrqW)).srq });
    let cap = QpCap {
        max_send_wr: ia.cap.max_send_wr.max(1),
        max_recv_wr: if srq.is_some() {
            0
        } else {
            ia.cap.max_recv_wr.max(1)
        },
        max_send_sge: ia.cap.max_send_sge.max(1),
        max_recv_sge: ia.cap.max_recv_sge.max(1),
        max_inline_data: ia.cap.max_inline_data,
    };
    let mut qi = QpInitAttr::new(p.pd, scq, rcq, cap).with_type(qp_type);
    qi.sq_sig_all = ia.sq_sig_all != 0;
    if let Some(q) = srq {
        qi = qi.with_srq(q);
    }
    let nic = nic_or!(s, fail);
    let qpn = match nic.create_qp(qi) {
        Ok(q) => q,
        Err(e) => return fail(errno_of(&e)),
    };
    // What was granted goes back to the caller, as every provider writes it (inline data is
    // granted at least the room of the send SGEs: `granted_inline` in src/verbs/device.rs);
    // with an SRQ the receive fields are left as they were, as rxe leaves them.
    let cap = match nic.qp_cap(qpn) {
        Ok(g) => QpCap {
            max_inline_data: g.max_inline_data,
            ..cap
        },
        Err(_) => cap,
    };
    ia.cap.max_send_wr = cap.max_send_wr;
    ia.cap.max_send_sge = cap.max_send_sge;
    ia.cap.max_inline_data = cap.max_inline_data;
    if srq.is_none() {
        ia.cap.max_recv_wr = cap.max_recv_wr;
        ia.cap.max_recv_sge = cap.max_recv_sge;
    }
    // SAFETY: plain C data.
    let mut c: ibv_qp = unsafe { std::mem::zeroed() };
    c.context = p.c.context;
    c.qp_context = ia.qp_context;
    c.pd = pd;
    c.send_cq = ia.send_cq;
    c.recv_cq = ia.recv_cq;
    c.srq = ia.srq;
    c.handle = qpn.get();
    c.qp_num = qpn.get();
    c.state = 0;
    c.qp_type = ia.qp_type;
    let tx = crate::ex::Tx::new(crate::ex::Bounce::new(
        s,
        p.pd,
        cap.max_send_wr,
        cap.max_inline_data,
    ));
    let owner = c.context as usize;
    let p = Box::into_raw(Box::new(QpW {
        c,
        ex: crate::ex::qp_ex_tail(),
        qpn,
        qp_type,
        max_send_sge: cap.max_send_sge,
        max_recv_sge: cap.max_recv_sge,
        ex_on: false,
        tx: Mutex::new(tx),
    })) as *mut ibv_qp;
    objects(|o| o.qps.insert(qpn.get(), (p as usize, owner)));
    // SAFETY: the QP just made.
    hold_pd(unsafe { (*p).pd }, true);
    p
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    if qp.is_null() {
        return EINVAL;
    }
    // SAFETY: a QP from ibv_create_qp.
    let w = unsafe { &*(qp as *mut QpW) };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    match nic_or!(unsafe { sh(w.c.context) }, |e| e).destroy_qp(w.qpn) {
        Ok(()) => {
            objects(|o| o.qps.remove(&w.qpn.get()));
            hold_pd(w.c.pd, false);
            for cq in [w.c.send_cq, w.c.recv_cq] {
                if !cq.is_null() {
                    // SAFETY: the QP's CQs, from ibv_create_cq, alive while the QP was (a CQ
                    // in use is never destroyed: EBUSY).
                    crate::ex::purge_qp(unsafe { &*(cq as *mut CqW) }, w.qpn);
                }
            }
            // (An XRC target has no CQs: what it received stays in its XRC SRQs' CQs, as
            // Device::destroy_qp keeps it.)
            // SAFETY: not used after this.
            let b = unsafe { Box::from_raw(qp as *mut QpW) };
            let bounce = b.tx.lock().unwrap_or_else(|e| e.into_inner()).bounce.take();
            if let Some(r) = bounce {
                // SAFETY: an object this library handed out; its context is the one set at creation.
                r.release(unsafe { sh(b.c.context) });
            }
            0
        }
        Err(e) => errno_of(&e),
    }
}

fn av_of(s: &Shared, a: &ibv_ah_attr) -> Result<AddressVector, c_int> {
    // RoCE needs the GRH: the GID is the address (rxe refuses an AV without it too).
    if a.is_global == 0 {
        return Err(EINVAL);
    }
    let dgid = a.grh.dgid.raw;
    let ip = ferroce::verbs::ip_of_gid(dgid);
    let dmac = s.port.resolve(ip).ok_or(libc::EHOSTUNREACH)?;
    // The application's index is Linux's numbering; an empty entry (an address the UDP
    // backend does not serve) is refused, as rxe refuses an AV on an empty GID entry.
    let sgid_index = s.port.engine_index(a.grh.sgid_index).ok_or(EINVAL)?;
    Ok(AddressVector {
        dgid,
        sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        // The flow label's 20 bits: the kernel passes the caller's 32-bit field on and the
        // providers keep its low 20 bits (UCX passes 0xffffffff when it leaves it unset).
        flow_label: a.grh.flow_label & 0xf_ffff,
        dmac: Some(dmac.0),
    })
}

fn c_av(s: &Shared, av: &AddressVector) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: av.dgid },
            flow_label: av.flow_label,
            sgid_index: s.port.shown_index(av.sgid_index),
            hop_limit: av.hop_limit,
            traffic_class: av.traffic_class,
        },
        dlid: 0,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: 1,
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    if qp.is_null() || attr.is_null() {
        return EINVAL;
    }
    // SAFETY: a QP from ibv_create_qp and the caller's attributes.
    let (w, a) = unsafe { (&mut *(qp as *mut QpW), &*attr) };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let s = unsafe { sh(w.c.context) };
    let m = QpAttrMask::from_bits_truncate(mask as u32);
    let mut at = QpAttr::default();
    if m.contains(QpAttrMask::STATE) {
        match QpState::from_ibv(a.qp_state as u32) {
            Some(st) => at.qp_state = st,
            None => return EINVAL,
        }
    }
    if m.contains(QpAttrMask::CUR_STATE) {
        match QpState::from_ibv(a.cur_qp_state as u32) {
            Some(st) => at.cur_qp_state = st,
            None => return EINVAL,
        }
    }
    if m.contains(QpAttrMask::PATH_MTU) {
        match Mtu::from_ibv(a.path_mtu as u32) {
            Some(x) => at.path_mtu = x,
            None => return EINVAL,
        }
    }
    if m.contains(QpAttrMask::AV) {
        match av_of(s, &a.ah_attr) {
            Ok(av) => at.ah_attr = av,
            Err(e) => return e,
        }
    }
    at.qp_access_flags = AccessFlags::from_bits_truncate(a.qp_access_flags & 0xf);
    at.pkey_index = a.pkey_index;
    at.port_num = a.port_num;
    at.qkey = a.qkey;
    at.dest_qp_num = a.dest_qp_num;
    at.rq_psn = a.rq_psn;
    at.sq_psn = a.sq_psn;
    at.timeout = a.timeout;
    at.retry_cnt = a.retry_cnt;
    at.rnr_retry = a.rnr_retry;
    at.min_rnr_timer = a.min_rnr_timer;
    at.max_rd_atomic = a.max_rd_atomic;
    at.max_dest_rd_atomic = a.max_dest_rd_atomic;
    at.en_sqd_async_notify = a.en_sqd_async_notify != 0;
    at.cap = QpCap {
        max_send_wr: a.cap.max_send_wr,
        max_recv_wr: a.cap.max_recv_wr,
        max_send_sge: a.cap.max_send_sge,
        max_recv_sge: a.cap.max_recv_sge,
        max_inline_data: a.cap.max_inline_data,
    };
    let nic = nic_or!(s, |e| e);
    match nic.modify_qp(w.qpn, &at, m) {
        Ok(()) => {
            if let Ok((st, _)) = nic.query_qp(w.qpn) {
                w.c.state = st.to_ibv() as c_int;
            }
            0
        }
        Err(e) => {
            if std::env::var_os("FERROCE_DEBUG").is_some() {
                warn(&format!("ibv_modify_qp: {e}"));
            }
            errno_of(&e)
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    if qp.is_null() || attr.is_null() {
        return EINVAL;
    }
    // SAFETY: a QP from ibv_create_qp and the caller's out structs.
    let w = unsafe { &mut *(qp as *mut QpW) };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let s = unsafe { sh(w.c.context) };
    let (st, q) = match nic_or!(s, |e| e).query_qp(w.qpn) {
        Ok(x) => x,
        Err(e) => return errno_of(&e),
    };
    w.c.state = st.to_ibv() as c_int;
    // SAFETY: plain C data.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = st.to_ibv() as c_int;
    a.cur_qp_state = a.qp_state;
    a.path_mtu = q.path_mtu.to_ibv() as c_int;
    a.qkey = q.qkey;
    a.rq_psn = q.rq_psn;
    a.sq_psn = q.sq_psn;
    a.dest_qp_num = q.dest_qp_num;
    a.qp_access_flags = q.qp_access_flags.bits();
    a.cap = ibv_qp_cap {
        max_send_wr: q.cap.max_send_wr,
        max_recv_wr: q.cap.max_recv_wr,
        max_send_sge: q.cap.max_send_sge,
        max_recv_sge: q.cap.max_recv_sge,
        max_inline_data: q.cap.max_inline_data,
    };
    a.ah_attr = c_av(s, &q.ah_attr);
    a.pkey_index = q.pkey_index;
    a.max_rd_atomic = q.max_rd_atomic;
    a.max_dest_rd_atomic = q.max_dest_rd_atomic;
    a.min_rnr_timer = q.min_rnr_timer;
    a.port_num = 1;
    a.timeout = q.timeout;
    a.retry_cnt = q.retry_cnt;
    a.rnr_retry = q.rnr_retry;
    let cap = a.cap;
    // SAFETY: the caller's out structure, valid for writes (libibverbs' contract).
    unsafe { *attr = a };
    if !init.is_null() {
        // SAFETY: the caller's out structure, valid for writes (libibverbs' contract).
        unsafe {
            (*init).qp_context = w.c.qp_context;
            (*init).send_cq = w.c.send_cq;
            (*init).recv_cq = w.c.recv_cq;
            (*init).srq = w.c.srq;
            (*init).cap = cap;
            (*init).qp_type = qp_type_code(w.qp_type);
            (*init).sq_sig_all = 0;
        }
    }
    0
}

/// `ibv_qp_to_qp_ex`: the work request builder of a QP created with
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` (`ibv_create_qp_ex`); NULL for other QPs, as libibverbs
/// returns.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut c_void {
    // SAFETY: a QP of this library (or NULL).
    match unsafe { (qp as *mut QpW).as_ref() } {
        Some(w) if w.ex_on => qp as *mut c_void,
        _ => null_mut(),
    }
}

/// The engine's handle of an address handle of this library.
pub(crate) fn ah_handle(ah: *mut ibv_ah) -> Option<Ah> {
    // SAFETY: an AH of this library (libibverbs' contract) or NULL.
    unsafe { (ah as *mut AhW).as_ref() }.map(|w| w.ah)
}

fn send_op(r: &ibv_send_wr) -> Result<SendOp, c_int> {
    // SAFETY: reading the union member the opcode names (all members are plain data).
    let (rdma, atomic) = unsafe { (r.wr.rdma, r.wr.atomic) };
    Ok(match r.opcode {
        0 => SendOp::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey: RKey(rdma.rkey),
        },
        1 => SendOp::RdmaWriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: RKey(rdma.rkey),
            imm: u32::from_be(r.imm_data),
        },
        2 => SendOp::Send,
        3 => SendOp::SendWithImm {
            imm: u32::from_be(r.imm_data),
        },
        4 => SendOp::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey: RKey(rdma.rkey),
        },
        5 => SendOp::AtomicCmpSwp {
            remote_addr: atomic.remote_addr,
            rkey: RKey(atomic.rkey),
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        6 => SendOp::AtomicFetchAdd {
            remote_addr: atomic.remote_addr,
            rkey: RKey(atomic.rkey),
            add: atomic.compare_add,
        },
        7 => SendOp::LocalInv {
            rkey: RKey(r.imm_data),
        },
        8 => {
            let b = r.bind_mw;
            // SAFETY: the request's window and region are this library's (or NULL), as
            // libibverbs' contract has them.
            unsafe { bind_op(b.mw, b.rkey, Some(&b.bind_info)) }.ok_or(EINVAL)?
        }
        9 => SendOp::SendWithInv {
            invalidate_rkey: RKey(r.imm_data),
        },
        15 => {
            // IBV_WR_ATOMIC_WRITE: the 8 bytes are the first entry's, read when posted (as
            // rdma-core's rxe provider copies them).
            if r.num_sge < 1 || r.sg_list.is_null() {
                return Err(EINVAL);
            }
            // SAFETY: the request's list holds num_sge (>= 1) entries (libibverbs' contract).
            let e = unsafe { *r.sg_list };
            if e.length != 8 || e.addr == 0 {
                return Err(EINVAL);
            }
            // SAFETY: the entry names 8 readable bytes of the program, as for inline data
            // (libibverbs' contract: the provider reads them at post time).
            let value = unsafe { std::ptr::read_unaligned(e.addr as usize as *const [u8; 8]) };
            SendOp::AtomicWrite {
                remote_addr: rdma.remote_addr,
                rkey: RKey(rdma.rkey),
                value,
            }
        }
        _ => return Err(EINVAL),
    })
}

unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    if qp.is_null() {
        return EINVAL;
    }
    // SAFETY: a QP from ibv_create_qp.
    let w = unsafe { &*(qp as *mut QpW) };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let s = unsafe { sh(w.c.context) };
    let post = |r: &ibv_send_wr| -> Result<(), c_int> {
        let op = send_op(r)?;
        // A bind or local invalidate has no data, and an ATOMIC WRITE's 8 bytes were taken
        // into the operation (`send_op`): their list is not read here.
        let sg_list = if op.is_local() || matches!(op, SendOp::AtomicWrite { .. }) {
            SgList::new()
        } else {
            // SAFETY: the request's scatter/gather list holds num_sge entries (libibverbs'
            // contract).
            unsafe { sges(r.sg_list, r.num_sge, w.max_send_sge) }?
        };
        let mut x = SendWr::new(r.wr_id, op, sg_list)
            .with_flags(SendFlags::from_bits_truncate(r.send_flags & 0xf));
        if w.qp_type == QpType::XrcSend {
            x = x.with_xrc_srqn(r.remote_srqn);
        }
        if w.qp_type == QpType::Ud {
            // SAFETY: the UD member of the union, with an AH of ours.
            let ud = unsafe { r.wr.ud };
            if ud.ah.is_null() {
                return Err(EINVAL);
            }
            // SAFETY: CQs, SRQs and AHs the caller names are ours and alive (libibverbs' contract).
            let ah = unsafe { (*(ud.ah as *mut AhW)).ah };
            x = x.with_ud(UdDest {
                ah,
                remote_qpn: QpNumber::new(ud.remote_qpn),
                remote_qkey: ud.remote_qkey,
            });
        }
        let mut tx = w.tx.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: an inline request's entries are readable memory of the program
        // (libibverbs' contract for IBV_SEND_INLINE).
        unsafe { crate::ex::submit(s, w, &mut tx, x, None) }
    };
    // SAFETY: the caller's list and out parameter (libibverbs' contract).
    unsafe { post_list(wr, bad, post) }
}

unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    if qp.is_null() {
        return EINVAL;
    }
    // SAFETY: a QP from ibv_create_qp.
    let w = unsafe { &*(qp as *mut QpW) };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let s = unsafe { sh(w.c.context) };
    // SAFETY: the caller's list and out parameter (libibverbs' contract).
    unsafe {
        post_list(wr, bad, |r| {
            let x = recv_wr(r, w.max_recv_sge)?;
            s.nic()?.post_recv(w.qpn, x).map_err(|e| errno_of(&e))
        })
    }
}

// ---- address handles ----------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    if pd.is_null() || attr.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: a PD from ibv_alloc_pd and the caller's attributes.
    let (p, a) = unsafe { (&*(pd as *mut PdW), &*attr) };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    let s = unsafe { sh(p.c.context) };
    let av = match av_of(s, a) {
        Ok(av) => av,
        Err(e) => return fail(e),
    };
    match nic_or!(s, fail).create_ah(p.pd, &av) {
        Ok(ah) => Box::into_raw(Box::new(AhW {
            c: ibv_ah {
                context: p.c.context,
                pd,
                handle: ah.index(),
            },
            ah,
        })) as *mut ibv_ah,
        Err(e) => fail(errno_of(&e)),
    }
}

/// `ibv_init_ah_from_wc`: the address back to the sender of a UD receive (its GRH).
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    c: *mut ibv_context,
    _port: u8,
    wc: *mut ibv_wc,
    grh: *mut u8,
    attr: *mut ibv_ah_attr,
) -> c_int {
    if c.is_null() || wc.is_null() || grh.is_null() || attr.is_null() {
        return EINVAL;
    }
    // SAFETY: caller's context, completion, the 40-byte GRH slot and out struct.
    let (s, w) = unsafe { (sh(c), &*wc) };
    // SAFETY: the caller's buffer, valid for that length (libibverbs' contract).
    let g = unsafe { std::slice::from_raw_parts(grh, 40) };
    match nic_or!(s, |e| e).init_ah_from_wc(&rust_wc(w), g) {
        Ok(av) => {
            // SAFETY: the caller's out structure, valid for writes (libibverbs' contract).
            unsafe { *attr = c_av(s, &av) };
            0
        }
        Err(e) => errno_of(&e),
    }
}

fn rust_wc(w: &ibv_wc) -> WorkCompletion {
    let mut flags = WcFlags::empty();
    if w.wc_flags & 1 != 0 {
        flags |= WcFlags::GRH;
    }
    if w.wc_flags & 2 != 0 {
        flags |= WcFlags::WITH_IMM;
    }
    WorkCompletion {
        wr_id: w.wr_id,
        status: WcStatus::Success,
        opcode: WcOpcode::Recv,
        byte_len: w.byte_len,
        imm_data: (w.wc_flags & 2 != 0).then(|| u32::from_be(w.imm_data)),
        invalidated_rkey: None,
        qp_num: QpNumber::new(w.qp_num),
        src_qp: QpNumber::new(w.src_qp),
        wc_flags: flags,
        solicited: false,
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut u8,
    port: u8,
) -> *mut ibv_ah {
    if pd.is_null() {
        return fail(EINVAL);
    }
    // SAFETY: a PD from ibv_alloc_pd; the rest checked by ibv_init_ah_from_wc.
    let p = unsafe { &*(pd as *mut PdW) };
    // SAFETY: plain C data: all-zero is a valid value of every field.
    let mut a: ibv_ah_attr = unsafe { std::mem::zeroed() };
    // SAFETY: forwarded with the caller's pointers, under the same contract.
    let r = unsafe { ibv_init_ah_from_wc(p.c.context, port, wc, grh, &mut a) };
    if r != 0 {
        return fail(r);
    }
    // SAFETY: forwarded with our own attributes.
    unsafe { ibv_create_ah(pd, &mut a) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    if ah.is_null() {
        return EINVAL;
    }
    // SAFETY: an AH from ibv_create_ah.
    let w = unsafe { &*(ah as *mut AhW) };
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract); its context pointer is the one set at creation.
    match nic_or!(unsafe { sh(w.c.context) }, |e| e).destroy_ah(w.ah) {
        Ok(()) => {
            // SAFETY: allocated here with Box::into_raw; the caller gives the object up (libibverbs' contract), nothing uses it after.
            drop(unsafe { Box::from_raw(ah as *mut AhW) });
            0
        }
        Err(e) => errno_of(&e),
    }
}

// ---- multicast ----------------------------------------------------------------------------------

/// Attach or detach (`op`) the QP to the multicast group of GID `gid`: RoCE v2 names an IPv4
/// group by its IPv4-mapped GID, an IPv6 group by itself. 0 or an errno (EINVAL for a NULL
/// argument).
///
/// # Safety
/// `qp` is NULL or a QP this library made, `gid` NULL or a readable `union ibv_gid`.
unsafe fn mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    op: fn(&ferroce::runtime::Nic, QpNumber, std::net::IpAddr) -> Result<(), VerbsError>,
) -> c_int {
    if qp.is_null() || gid.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's promise (a QP from ibv_create_qp, a readable GID).
    let (w, raw) = unsafe { (&*(qp as *mut QpW), (*gid).raw) };
    // SAFETY: as above; its context is the one set at creation.
    let s = unsafe { sh(w.c.context) };
    match op(nic_or!(s, |e| e), w.qpn, ferroce::verbs::ip_of_gid(raw)) {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}

/// `ibv_attach_mcast`: the UD QP receives what is sent to the multicast group `gid` (RoCE
/// has no LIDs: `lid` is ignored); the packet device joins the IP group.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    // SAFETY: libibverbs' contract (see mcast).
    unsafe { mcast(qp, gid, ferroce::runtime::Nic::attach_mcast) }
}

/// `ibv_detach_mcast`: undo `ibv_attach_mcast`.
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    // SAFETY: libibverbs' contract (see mcast).
    unsafe { mcast(qp, gid, ferroce::runtime::Nic::detach_mcast) }
}

// ---- asynchronous events ------------------------------------------------------------------------

/// `ibv_get_async_event`: the next asynchronous event of this context (CQ error, QP fatal /
/// request / access error, last WQE reached, SRQ limit reached about an object made in it),
/// with the C object it names. Blocks until one comes, unless the program set `O_NONBLOCK`
/// on `async_fd`: then -1 and `EAGAIN` when none is there. Events about objects destroyed
/// since are dropped.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    c: *mut ibv_context,
    ev: *mut ibv_async_event,
) -> c_int {
    if c.is_null() || ev.is_null() {
        set_errno(EINVAL);
        return -1;
    }
    // SAFETY: an object this library handed out and the caller still holds (libibverbs' contract).
    let (s, fd) = unsafe { (sh(c), (*c).async_fd) };
    // SAFETY: fcntl on the context's own descriptor.
    let nonblock = unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    loop {
        // The inline engine finds events in the program's calls (an engine thread finds them
        // on its own).
        if let Some(n) = s.started() {
            n.progress();
        }
        let next = lock_ctxs(&s.contexts)
            .get_mut(&(c as usize))
            .and_then(CtxEvents::pop);
        let Some(e) = next else {
            if nonblock {
                set_errno(libc::EAGAIN);
                return -1;
            }
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll(2) on one local pollfd, the context's descriptor.
            unsafe { libc::poll(&mut p, 1, 1) };
            continue;
        };
        let element = match e {
            AsyncEvent::PortActive(p) | AsyncEvent::PortErr(p) | AsyncEvent::GidChange(p) => {
                Some(ibv_async_element {
                    port_num: c_int::from(p),
                })
            }
            _ => objects(|o| o.find(e)).map(|(element, _)| element),
        };
        if let Some(element) = element {
            // SAFETY: the caller's out structure, valid for writes (libibverbs' contract).
            unsafe {
                *ev = ibv_async_event {
                    element,
                    event_type: e.event_type() as c_int,
                }
            };
            return 0;
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(_ev: *mut ibv_async_event) {}

// ---- strings ------------------------------------------------------------------------------------

/// rdma-core's strings for `enum ibv_wc_status`, by value.
const WC_STATUS_STR: [&std::ffi::CStr; 22] = [
    c"success",
    c"local length error",
    c"local QP operation error",
    c"local EE context operation error",
    c"local protection error",
    c"Work Request Flushed Error",
    c"memory management operation error",
    c"bad response error",
    c"local access error",
    c"remote invalid request error",
    c"remote access error",
    c"remote operation error",
    c"transport retry counter exceeded",
    c"RNR retry counter exceeded",
    c"local RDD violation error",
    c"remote invalid RD request",
    c"aborted error",
    c"invalid EE context number",
    c"invalid EE context state",
    c"fatal error",
    c"response timeout error",
    c"general error",
];

#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    usize::try_from(status)
        .ok()
        .and_then(|i| WC_STATUS_STR.get(i))
        .unwrap_or(&c"unknown")
        .as_ptr()
}

#[no_mangle]
pub extern "C" fn ibv_node_type_str(t: c_int) -> *const c_char {
    match t {
        1 => c"InfiniBand channel adapter",
        2 => c"InfiniBand switch",
        3 => c"InfiniBand router",
        4 => c"iWARP NIC",
        5 => c"usNIC",
        6 => c"usNIC UDP",
        7 => c"unspecified",
        _ => c"unknown",
    }
    .as_ptr()
}

#[no_mangle]
pub extern "C" fn ibv_port_state_str(s: c_int) -> *const c_char {
    match s {
        0 => c"PORT_NOP",
        1 => c"PORT_DOWN",
        2 => c"PORT_INIT",
        3 => c"PORT_ARMED",
        4 => c"PORT_ACTIVE",
        5 => c"PORT_ACTIVE_DEFER",
        _ => c"invalid state",
    }
    .as_ptr()
}

#[no_mangle]
pub extern "C" fn ibv_event_type_str(e: c_int) -> *const c_char {
    match e {
        0 => c"CQ error",
        1 => c"local work queue catastrophic error",
        2 => c"invalid request local work queue error",
        3 => c"local access violation work queue error",
        15 => c"SRQ limit reached",
        16 => c"last WQE reached",
        _ => c"unknown",
    }
    .as_ptr()
}

/// `ibv_fork_init`: nothing to prepare (no pinned pages, no device file).
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

#[cfg(test)]
mod tests {
    use super::mapped;

    const MAPS: &str = "\
00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/prog
00651000-00652000 rw-p 00051000 08:02 173521      /usr/bin/prog
00652000-00655000 rw-p 00000000 00:00 0           [heap]
7f0000000000-7f0000001000 ---p 00000000 00:00 0
7f0000001000-7f0000003000 r--p 00000000 00:00 0
7f0000003000-7f0000004000 rw-s 00000000 00:05 42  /dev/zero (deleted)
";

    #[test]
    fn a_pinned_range_must_be_mapped_readable_and_writable_when_written() {
        // Inside one mapping, and across two adjacent writable ones.
        assert!(mapped(MAPS, 0x651010, 0x100, true));
        assert!(mapped(MAPS, 0x651ff0, 0x20, true));
        assert!(mapped(MAPS, 0x651000, 0x4000, true));
        // Past the heap's end, before the first mapping, in the gap between two.
        assert!(!mapped(MAPS, 0x654ff0, 0x20, false));
        assert!(!mapped(MAPS, 0x3ff000, 0x10, false));
        assert!(!mapped(MAPS, 0x452000, 0x10, false));
        assert!(!mapped(MAPS, 0x451ff0, 0x20, false));
        // Read-only: for reading only; a PROT_NONE guard never; a shared mapping like another.
        assert!(mapped(MAPS, 0x400000, 0x1000, false));
        assert!(!mapped(MAPS, 0x400000, 0x1000, true));
        assert!(mapped(MAPS, 0x7f0000001000, 0x2000, false));
        assert!(!mapped(MAPS, 0x7f0000002ff0, 0x20, true));
        assert!(!mapped(MAPS, 0x7f0000000ff0, 0x20, false));
        assert!(mapped(MAPS, 0x7f0000003000, 0x1000, true));
        // Wrapping, or running off the last mapping.
        assert!(!mapped(MAPS, u64::MAX - 4, 8, false));
        assert!(!mapped(MAPS, 0x7f0000003ff0, 0x20, false));
        assert!(!mapped("", 0x1000, 1, false));
    }
}

#[cfg(test)]
mod dm_tests {
    use super::*;

    /// Device memory's copies and lifetime without a device (no call here reaches the NIC;
    /// the context pointer is only stored): the bounds and 4-byte units every copy is held
    /// to, and freeing (also under miri: `cargo +nightly miri test -p ferroce-cabi --lib
    /// dm_tests`).
    #[test]
    fn device_memory_copies_stay_inside_it_in_four_byte_units() {
        let ctx = NonNull::<ibv_context>::dangling().as_ptr();
        let mut a = ibv_alloc_dm_attr {
            length: 64,
            log_align_req: 6,
            comp_mask: 0,
        };
        // SAFETY: the attributes are ours; the context is never dereferenced by alloc_dm.
        let dm = unsafe { alloc_dm(ctx, &mut a) };
        assert!(!dm.is_null());
        // SAFETY: device memory just made (aligned as asked).
        assert_eq!(unsafe { (*(dm as *mut DmW)).mem.as_ptr() } as usize % 64, 0);
        let src: Vec<u8> = (0..64u8).collect();
        let mut dst = vec![0u8; 64];
        // SAFETY: our buffers hold the lengths given; `dm` is ours until free_dm.
        unsafe {
            assert_eq!(memcpy_to_dm(dm, 8, src.as_ptr().cast(), 16), 0);
            assert_eq!(memcpy_from_dm(dst.as_mut_ptr().cast(), dm, 8, 16), 0);
            assert_eq!(&dst[..16], &src[..16]);
            // Untouched bytes are zero.
            assert_eq!(memcpy_from_dm(dst.as_mut_ptr().cast(), dm, 0, 8), 0);
            assert_eq!(&dst[..8], &[0; 8]);
            for (off, len) in [(2, 4), (0, 6), (60, 8), (64, 4), (u64::MAX - 3, 4)] {
                assert_eq!(
                    memcpy_to_dm(dm, off, src.as_ptr().cast(), len),
                    EINVAL,
                    "{off} {len}"
                );
                assert_eq!(
                    memcpy_from_dm(dst.as_mut_ptr().cast(), dm, off, len),
                    EINVAL
                );
            }
            assert_eq!(memcpy_to_dm(dm, 60, src.as_ptr().cast(), 4), 0);
            // A region over it holds it.
            (*(dm as *mut DmW)).mrs.fetch_add(1, Ordering::AcqRel);
            assert_eq!(free_dm(dm), libc::EBUSY);
            (*(dm as *mut DmW)).mrs.fetch_sub(1, Ordering::AcqRel);
            assert_eq!(free_dm(dm), 0);
        }
        for bad in [
            ibv_alloc_dm_attr {
                length: 0,
                log_align_req: 0,
                comp_mask: 0,
            },
            ibv_alloc_dm_attr {
                length: MAX_DM_SIZE + 1,
                log_align_req: 0,
                comp_mask: 0,
            },
            ibv_alloc_dm_attr {
                length: 64,
                log_align_req: 13,
                comp_mask: 0,
            },
            ibv_alloc_dm_attr {
                length: 64,
                log_align_req: 0,
                comp_mask: 1,
            },
        ] {
            let mut b = bad;
            // SAFETY: as above.
            assert!(unsafe { alloc_dm(ctx, &mut b) }.is_null());
        }
    }
}
