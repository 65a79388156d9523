//! The extended verbs: `ibv_create_cq_ex` with its polling interface (`ibv_start_poll`,
//! `ibv_next_poll`, `ibv_end_poll`, `ibv_wc_read_*`), `ibv_create_qp_ex` and the work request
//! builder of `ibv_qp_to_qp_ex` (`ibv_wr_start`, `ibv_wr_send`, `ibv_wr_rdma_write`,
//! `ibv_wr_set_sge`, `ibv_wr_complete`, …), and the copy of inline data at post time.
//!
//! Every CQ and QP of this library has the extended layout (`struct ibv_cq_ex` and
//! `struct ibv_qp_ex` begin with `struct ibv_cq` and `struct ibv_qp`), so `ibv_poll_cq` works on
//! an extended CQ and the builder's QP is the same object as the legacy one.
//!
//! # Inline data
//! `IBV_SEND_INLINE` (and `ibv_wr_set_inline_data`) hands the data over at post time: the
//! program may reuse the buffer as soon as the call returns, and the buffer need not be
//! registered. The engine gathers from registered memory when it processes the request, so a
//! QP with `max_inline_data` has a bounce region of `max_send_wr + 1` slots of that size,
//! registered on its PD: the data is copied into the next slot and the request points there.
//! A slot is reused only after `max_send_wr + 1` further successful posts, and the engine
//! refuses a post while `max_send_wr` requests are outstanding, so a slot is never rewritten
//! while its request can still be read.

use crate::abi::*;
use crate::device::Shared;
use crate::verbs::{errno_of, set_errno, sh, to_c_wc, CqW, QpW};
use ferroce::verbs::{
    AccessFlags, AppMemory, LKey, MemoryRegion, Pd, SendFlags, SendOp, SendWr, SgList, Sge, UdDest,
    WorkCompletion,
};
use ferroce::wire::{QpNumber, RKey};
use libc::{c_int, c_uint, c_void, EINVAL, ENOENT, EOPNOTSUPP};
use std::ptr::null_mut;
use std::sync::{Mutex, MutexGuard};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// ---- extended CQs ----------------------------------------------------------------------------

/// The completions of one polling session (`ibv_start_poll` … `ibv_end_poll`), each with the
/// time ([`clock_ns`]) the library took it from the engine.
#[derive(Default)]
pub(crate) struct ExPoll {
    wcs: Vec<WorkCompletion>,
    ts: Vec<u64>,
    i: usize,
}

/// The device clock: nanoseconds since the library first read it (`hca_core_clock` is
/// 1,000,000 kHz). Completion timestamps, `ibv_query_rt_values_ex`'s raw clock.
pub(crate) fn clock_ns() -> u64 {
    epoch().0.elapsed().as_nanos() as u64
}

/// The device clock's start, and the wall clock (ns since 1970) at that moment.
fn epoch() -> &'static (std::time::Instant, u64) {
    static E: std::sync::OnceLock<(std::time::Instant, u64)> = std::sync::OnceLock::new();
    E.get_or_init(|| {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        (std::time::Instant::now(), wall)
    })
}

/// Take up to a batch of completions from the engine into the session, stamped now.
fn take(s: &Shared, w: &CqW, p: &mut ExPoll) -> Result<(), ()> {
    let before = p.wcs.len();
    s.nic()
        .map_err(|_| ())?
        .poll_cq(w.cq, &mut p.wcs, POLL_BATCH)
        .map_err(|_| ())?;
    if p.wcs.len() > before {
        let now = clock_ns();
        p.ts.resize(p.wcs.len(), now);
    }
    Ok(())
}

/// How many completions a session takes from the engine at a time.
const POLL_BATCH: usize = 32;

/// # Safety
/// `cq` is a CQ of this library.
unsafe fn cqw<'a>(cq: CqExPtr) -> &'a mut CqW {
    // SAFETY: `CqW` starts with the C CQ (`#[repr(C)]`).
    unsafe { &mut *(cq as *mut CqW) }
}

/// Publish completion `i` of the session in `status`/`wr_id` (or ENOENT past the end).
fn show(w: &mut CqW, p: &ExPoll) -> c_int {
    match p.wcs.get(p.i) {
        Some(c) => {
            w.ex.status = c.status.to_ibv() as c_int;
            w.ex.wr_id = c.wr_id;
            0
        }
        None => ENOENT,
    }
}

unsafe extern "C" fn start_poll(cq: CqExPtr, _attr: *mut c_void) -> c_int {
    // SAFETY: a CQ of this library (libibverbs' contract).
    let w = unsafe { cqw(cq) };
    // SAFETY: its context is this library's.
    let s = unsafe { sh(w.c.context) };
    let mut p = std::mem::take(&mut *lock(&w.poll));
    p.i = 0;
    // What an earlier session left comes first.
    if p.wcs.is_empty() && take(s, w, &mut p).is_err() {
        *lock(&w.poll) = p;
        return EINVAL;
    }
    let r = show(w, &p);
    *lock(&w.poll) = p;
    r
}

unsafe extern "C" fn next_poll(cq: CqExPtr) -> c_int {
    // SAFETY: a CQ of this library in a polling session.
    let w = unsafe { cqw(cq) };
    let mut p = std::mem::take(&mut *lock(&w.poll));
    p.i += 1;
    if p.i >= p.wcs.len() {
        // SAFETY: its context is this library's.
        let s = unsafe { sh(w.c.context) };
        p.wcs.clear();
        p.ts.clear();
        p.i = 0;
        let _ = take(s, w, &mut p);
    }
    let r = show(w, &p);
    *lock(&w.poll) = p;
    r
}

unsafe extern "C" fn end_poll(cq: CqExPtr) {
    // SAFETY: a CQ of this library in a polling session.
    let w = unsafe { cqw(cq) };
    let mut p = lock(&w.poll);
    // Completions taken from the engine and not read yet stay for the next session.
    let k = (p.i + 1).min(p.wcs.len());
    p.wcs = p.wcs.split_off(k);
    let kt = k.min(p.ts.len());
    p.ts = p.ts.split_off(kt);
    p.i = 0;
}

/// Drop destroyed QP `qpn`'s completions an earlier polling session of the CQ took from the
/// engine and left unread (`ibv_destroy_qp` removes its completions from its CQs).
pub(crate) fn purge_qp(w: &CqW, qpn: QpNumber) {
    let mut p = lock(&w.poll);
    let p = &mut *p;
    if p.wcs.iter().all(|c| c.qp_num != qpn) {
        return;
    }
    let mut ts = p.ts.iter().copied();
    let (mut wcs, mut kept_ts) = (Vec::new(), Vec::new());
    for c in p.wcs.drain(..) {
        let t = ts.next();
        if c.qp_num != qpn {
            wcs.push(c);
            kept_ts.extend(t);
        }
    }
    p.wcs = wcs;
    p.ts = kept_ts;
    p.i = 0;
}

/// `ibv_wc_read_completion_ts`: when the library took the current completion from the
/// engine, in device clock ticks (ns, see [`clock_ns`]).
unsafe extern "C" fn read_completion_ts(cq: CqExPtr) -> u64 {
    // SAFETY: a CQ of this library in a polling session.
    let w = unsafe { cqw(cq) };
    let p = lock(&w.poll);
    p.ts.get(p.i).copied().unwrap_or(0)
}

/// `ibv_wc_read_completion_wallclock_ns`: the same moment on the wall clock.
unsafe extern "C" fn read_completion_wallclock_ns(cq: CqExPtr) -> u64 {
    // SAFETY: as read_completion_ts.
    let t = unsafe { read_completion_ts(cq) };
    epoch().1.saturating_add(t)
}

/// The session's current completion.
///
/// # Safety
/// `cq` is a CQ of this library in a polling session.
unsafe fn cur<R>(cq: CqExPtr, f: impl FnOnce(&WorkCompletion) -> R, none: R) -> R {
    // SAFETY: the caller's promise.
    let w = unsafe { cqw(cq) };
    let p = lock(&w.poll);
    p.wcs.get(p.i).map_or(none, f)
}

unsafe extern "C" fn read_opcode(cq: CqExPtr) -> c_int {
    // SAFETY: forwarded.
    unsafe { cur(cq, |c| c.opcode.to_ibv() as c_int, 0) }
}
unsafe extern "C" fn read_vendor_err(cq: CqExPtr) -> u32 {
    // SAFETY: forwarded.
    unsafe { cur(cq, |c| to_c_wc(c).vendor_err, 0) }
}
unsafe extern "C" fn read_byte_len(cq: CqExPtr) -> u32 {
    // SAFETY: forwarded.
    unsafe { cur(cq, |c| c.byte_len, 0) }
}
unsafe extern "C" fn read_imm_data(cq: CqExPtr) -> u32 {
    // SAFETY: forwarded.
    unsafe { cur(cq, |c| to_c_wc(c).imm_data, 0) }
}
unsafe extern "C" fn read_qp_num(cq: CqExPtr) -> u32 {
    // SAFETY: forwarded.
    unsafe { cur(cq, |c| c.qp_num.get(), 0) }
}
unsafe extern "C" fn read_src_qp(cq: CqExPtr) -> u32 {
    // SAFETY: forwarded.
    unsafe { cur(cq, |c| c.src_qp.get(), 0) }
}
unsafe extern "C" fn read_wc_flags(cq: CqExPtr) -> c_uint {
    // SAFETY: forwarded.
    unsafe { cur(cq, |c| to_c_wc(c).wc_flags, 0) }
}
unsafe extern "C" fn read_zero_u32(_cq: CqExPtr) -> u32 {
    0
}
unsafe extern "C" fn read_zero_u8(_cq: CqExPtr) -> u8 {
    0
}

/// The polling interface of every CQ.
pub(crate) fn cq_ex_tail() -> ibv_cq_ex_tail {
    ibv_cq_ex_tail {
        comp_mask: 0,
        status: 0,
        wr_id: 0,
        start_poll: Some(start_poll),
        next_poll: Some(next_poll),
        end_poll: Some(end_poll),
        read_opcode: Some(read_opcode),
        read_vendor_err: Some(read_vendor_err),
        read_byte_len: Some(read_byte_len),
        read_imm_data: Some(read_imm_data),
        read_qp_num: Some(read_qp_num),
        read_src_qp: Some(read_src_qp),
        read_wc_flags: Some(read_wc_flags),
        // RoCE has no LIDs; the service level is not carried.
        read_slid: Some(read_zero_u32),
        read_sl: Some(read_zero_u8),
        read_dlid_path_bits: Some(read_zero_u8),
        read_completion_ts: Some(read_completion_ts),
        // Not offered (create_cq_ex refuses the flags that would need them).
        read_cvlan: None,
        read_flow_tag: None,
        read_tm_info: None,
        read_completion_wallclock_ns: Some(read_completion_wallclock_ns),
    }
}

/// `verbs_context.create_cq_ex` (the inline `ibv_create_cq_ex`): a CQ with the standard
/// completion fields and timestamps (device clock and wall clock); VLAN, flow tag and tag
/// matching are refused (EOPNOTSUPP).
pub(crate) unsafe extern "C" fn create_cq_ex(
    c: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq {
    if c.is_null() || attr.is_null() {
        set_errno(EINVAL);
        return null_mut();
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &*attr };
    let offered = IBV_WC_STANDARD_FLAGS
        | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
        | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
    if a.wc_flags & !offered != 0 || a.comp_mask & !3 != 0 {
        set_errno(EOPNOTSUPP);
        return null_mut();
    }
    // IBV_CQ_INIT_ATTR_MASK_PD: a parent domain (its allocators are not needed: see
    // `alloc_parent_domain`); anything else is refused, as mlx5 refuses it.
    if a.comp_mask & 2 != 0 && !crate::verbs::is_parent_domain(a.parent_domain) {
        set_errno(EINVAL);
        return null_mut();
    }
    // SAFETY: forwarded (the same checks and objects as ibv_create_cq).
    let cq = unsafe {
        crate::verbs::ibv_create_cq(
            c,
            a.cqe.min(i32::MAX as u32) as c_int,
            a.cq_context,
            a.channel,
            a.comp_vector as c_int,
        )
    };
    if !cq.is_null() && a.comp_mask & 2 != 0 {
        // Held until the CQ is destroyed.
        crate::verbs::hold_pd(a.parent_domain, true);
        // SAFETY: the CQ just made.
        unsafe {
            (*(cq as *mut CqW))
                .parent_pd
                .store(a.parent_domain, std::sync::atomic::Ordering::Release)
        };
    }
    cq
}

/// `verbs_context.query_device_ex` (the inline `ibv_query_device_ex`): the legacy attributes,
/// the completion timestamp's mask and the clock's frequency, one physical port; the rest
/// zero. At most `size` bytes are written (a program built against an older header passes a
/// smaller structure).
pub(crate) unsafe extern "C" fn query_device_ex(
    c: *mut ibv_context,
    input: *const c_void,
    attr: *mut ibv_device_attr_ex,
    size: usize,
) -> c_int {
    let _ = input; // no comp_mask of the input is defined
    if c.is_null() || attr.is_null() || size < std::mem::size_of::<ibv_device_attr>() {
        return EINVAL;
    }
    // SAFETY: plain C data.
    let mut a: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's context; a local out structure.
    let r = unsafe { crate::verbs::ibv_query_device(c, &mut a.orig_attr) };
    if r != 0 {
        return r;
    }
    // The extended flags start with the 32 of `device_cap_flags` (as the kernel reports them
    // for rxe and every provider).
    a.device_cap_flags_ex = u64::from(a.orig_attr.device_cap_flags);
    a.completion_timestamp_mask = u64::MAX;
    a.hca_core_clock = 1_000_000;
    // On-demand paging: every region can be (ferroce reaches each page when it is accessed:
    // `ferroce::ib::OnDemandMemory`), implicit ones too, for every operation each transport
    // carries (XRC's are RC's).
    let both = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
    a.xrc_odp_caps = both | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC;
    a.odp_caps = ibv_odp_caps {
        general_caps: IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT,
        rc_odp_caps: both | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC,
        uc_odp_caps: both | IBV_ODP_SUPPORT_WRITE,
        ud_odp_caps: both,
    };
    a.phys_port_cnt_ex = 1;
    a.max_dm_size = crate::verbs::MAX_DM_SIZE as u64;
    let n = size.min(std::mem::size_of::<ibv_device_attr_ex>());
    // SAFETY: the caller's structure holds `size` >= n bytes (libibverbs' contract); `a`
    // holds n; they do not overlap (one is a local).
    unsafe {
        std::ptr::write_bytes(attr as *mut u8, 0, size);
        std::ptr::copy_nonoverlapping(&a as *const _ as *const u8, attr as *mut u8, n);
    }
    0
}

/// `verbs_context.query_rt_values` (`ibv_query_rt_values_ex`): the device clock
/// ([`clock_ns`]) as a timespec; other values are not offered.
pub(crate) unsafe extern "C" fn query_rt_values(
    c: *mut ibv_context,
    v: *mut ibv_values_ex,
) -> c_int {
    if c.is_null() || v.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's structure (libibverbs' contract).
    let v = unsafe { &mut *v };
    if v.comp_mask & !IBV_VALUES_MASK_RAW_CLOCK != 0 {
        return EOPNOTSUPP;
    }
    if v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK != 0 {
        let t = clock_ns();
        v.raw_clock.tv_sec = (t / 1_000_000_000) as libc::time_t;
        v.raw_clock.tv_nsec = (t % 1_000_000_000) as libc::c_long;
    }
    0
}

// ---- extended QPs -------------------------------------------------------------------------------

/// `verbs_context.create_qp_ex` (the inline `ibv_create_qp_ex` with more than a PD): a QP
/// whose `ibv_qp_to_qp_ex` is its work request builder (`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`).
/// XRC, RSS, TSO and creation flags are refused (EOPNOTSUPP).
pub(crate) unsafe extern "C" fn create_qp_ex(
    c: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    if attr.is_null() {
        set_errno(EINVAL);
        return null_mut();
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    if a.qp_type == IBV_QPT_XRC_RECV {
        // An XRC target: a domain, no PD, CQ or queue.
        if a.comp_mask & IBV_QP_INIT_ATTR_XRCD == 0 || a.xrcd.is_null() {
            set_errno(EINVAL);
            return null_mut();
        }
        if a.comp_mask & !(IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_PD) != 0 {
            set_errno(EOPNOTSUPP);
            return null_mut();
        }
        // SAFETY: the caller's context and a domain of this library (libibverbs' contract).
        return unsafe { crate::verbs::create_xrc_recv_qp(c, a) };
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_XRCD != 0 {
        // Only a target QP has a domain.
        set_errno(EINVAL);
        return null_mut();
    }
    // The creation-flags and TSO-header bits are taken when they ask for nothing (no creation
    // flag, no TSO header), as the kernel takes them; with a flag or a header they are refused.
    let known = IBV_QP_INIT_ATTR_PD
        | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
        | IBV_QP_INIT_ATTR_CREATE_FLAGS
        | IBV_QP_INIT_ATTR_MAX_TSO_HEADER;
    if a.comp_mask & !known != 0
        || a.comp_mask & IBV_QP_INIT_ATTR_PD == 0
        || (a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
        || (a.comp_mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER != 0 && a.max_tso_header != 0)
    {
        set_errno(EOPNOTSUPP);
        return null_mut();
    }
    // A QP asking for an operation the work request builder does not carry (TSO, flush) is
    // refused here, as rdma-core's providers
    // refuse it, rather than failing each such request at `ibv_wr_complete`.
    let carried = SEND_OPS_CARRIED.iter().fold(0, |m, &(_, f)| m | f);
    if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 && a.send_ops_flags & !carried != 0 {
        set_errno(EOPNOTSUPP);
        return null_mut();
    }
    let mut b = a.base();
    // SAFETY: forwarded.
    let qp = unsafe { crate::verbs::ibv_create_qp(a.pd, &mut b) };
    if !qp.is_null() {
        // The granted capabilities, as `ibv_create_qp` writes them.
        a.cap = b.cap;
    }
    if !qp.is_null() && a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
        // SAFETY: the QP just made.
        unsafe { (*(qp as *mut QpW)).ex_on = true };
    }
    qp
}

/// The bounce region of a QP's inline data (see the module's documentation).
pub(crate) struct Bounce {
    /// The memory (never moved: registered by address).
    buf: Box<[u8]>,
    mr: MemoryRegion,
    slot: usize,
    slots: u64,
    /// Successful posts through the region.
    posted: u64,
}

impl Bounce {
    /// A region for `max_send_wr + 1` slots of `max_inline` bytes on `pd`.
    pub(crate) fn new(s: &Shared, pd: Pd, max_send_wr: u32, max_inline: u32) -> Option<Bounce> {
        if max_inline == 0 {
            return None;
        }
        let slot = max_inline as usize;
        let slots = u64::from(max_send_wr) + 1;
        let mut buf = vec![0u8; slot * slots as usize].into_boxed_slice();
        let p = buf.as_mut_ptr();
        // SAFETY: `buf` is this region's own memory, not touched by Rust code while registered
        // except through the raw pointer in `copy_in`, and deregistered (`release`) before it
        // is freed.
        let mem = unsafe { AppMemory::new(p, buf.len()) }?;
        let mr = s
            .nic()
            .ok()?
            .reg_mr_app(pd, mem, p as u64, AccessFlags::LOCAL_WRITE)
            .ok()?;
        Some(Bounce {
            buf,
            mr,
            slot,
            slots,
            posted: 0,
        })
    }

    /// Deregister (before the region is dropped).
    pub(crate) fn release(self, s: &Shared) {
        if let Ok(n) = s.nic() {
            let _ = n.dereg_mr(&self.mr);
        }
        drop(self.buf);
    }

    /// Copy `parts` (addresses and lengths in the program's memory) into the next slot: the
    /// scatter/gather entry that names it. `Err(EINVAL)` when they do not fit.
    ///
    /// # Safety
    /// Each part is `len` readable bytes at `addr` (the inline contract of libibverbs).
    unsafe fn copy_in(&mut self, parts: &[(u64, usize)]) -> Result<Sge, c_int> {
        let total: usize = parts.iter().map(|p| p.1).sum();
        if total > self.slot {
            return Err(EINVAL);
        }
        let off = (self.posted % self.slots) as usize * self.slot;
        let base = self.buf.as_mut_ptr();
        let mut at = off;
        for &(addr, len) in parts {
            if len == 0 {
                continue;
            }
            // SAFETY: the caller's readable bytes; the destination lies inside the slot (the
            // total fits), which no outstanding request reads (see the module's documentation).
            unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, base.add(at), len) };
            at += len;
        }
        Ok(Sge {
            addr: base as u64 + off as u64,
            length: total as u32,
            lkey: self.mr.lkey(),
        })
    }
}

/// What a QP's posts share: the builder's session and the inline region (one lock: posts on
/// one QP from several threads are serialized, as in rdma-core's providers).
#[derive(Default)]
pub(crate) struct Tx {
    /// The builder's requests since `ibv_wr_start`.
    wrs: Vec<SendWr>,
    /// Inline parts of each request (`None`: its scatter/gather list is used).
    inline: Vec<Option<Vec<(u64, usize)>>>,
    /// The first error of the session (returned by `ibv_wr_complete`).
    err: c_int,
    pub(crate) bounce: Option<Bounce>,
}

impl Tx {
    /// A QP's transmit state, with its inline region (if it has inline data).
    pub(crate) fn new(bounce: Option<Bounce>) -> Tx {
        Tx {
            bounce,
            ..Default::default()
        }
    }
}

/// Post one request on `w`, its inline data (`parts`, or its scatter/gather list when the
/// request is marked inline) copied into the bounce region first.
///
/// # Safety
/// Inline parts and an inline request's entries are readable memory of the program.
pub(crate) unsafe fn submit(
    s: &Shared,
    w: &QpW,
    tx: &mut Tx,
    mut x: SendWr,
    parts: Option<Vec<(u64, usize)>>,
) -> Result<(), c_int> {
    let inline = x.flags.contains(SendFlags::INLINE) && (x.op.is_send() || x.op.is_write());
    let parts = parts.or_else(|| {
        inline.then(|| {
            x.sg_list
                .iter()
                .map(|g| (g.addr, g.length as usize))
                .collect()
        })
    });
    let mut bounced = false;
    if let (Some(parts), Some(b)) = (parts, tx.bounce.as_mut()) {
        // SAFETY: the caller's promise.
        let sge = unsafe { b.copy_in(&parts) }?;
        x.sg_list = if sge.length == 0 {
            SgList::new()
        } else {
            sge.into()
        };
        x.flags.insert(SendFlags::INLINE);
        bounced = true;
    }
    s.nic()?.post_send(w.qpn, x).map_err(|e| errno_of(&e))?;
    if bounced {
        if let Some(b) = tx.bounce.as_mut() {
            b.posted += 1;
        }
    }
    Ok(())
}

/// # Safety
/// `qp` is a QP of this library.
unsafe fn qpw<'a>(qp: QpExPtr) -> &'a mut QpW {
    // SAFETY: `QpW` starts with the C QP (`#[repr(C)]`).
    unsafe { &mut *(qp as *mut QpW) }
}

/// Start a new request of the session with `op`, the builder's `wr_id` and `wr_flags`.
///
/// # Safety
/// `qp` is a QP of this library.
unsafe fn begin(qp: QpExPtr, op: SendOp) {
    // SAFETY: the caller's promise.
    let w = unsafe { qpw(qp) };
    let x = SendWr::new(w.ex.wr_id, op, Vec::new())
        .with_flags(SendFlags::from_bits_truncate(w.ex.wr_flags & 0xf));
    let mut tx = lock(&w.tx);
    tx.wrs.push(x);
    tx.inline.push(None);
}

/// Change the session's last request (an error when there is none).
///
/// # Safety
/// `qp` is a QP of this library.
unsafe fn last(qp: QpExPtr, f: impl FnOnce(&mut SendWr, &mut Option<Vec<(u64, usize)>>)) {
    // SAFETY: the caller's promise.
    let w = unsafe { qpw(qp) };
    let mut tx = lock(&w.tx);
    let tx = &mut *tx;
    match (tx.wrs.last_mut(), tx.inline.last_mut()) {
        (Some(x), Some(i)) => f(x, i),
        _ => {
            if tx.err == 0 {
                tx.err = EINVAL;
            }
        }
    }
}

/// Mark the session failed (an operation ferroce does not offer).
///
/// # Safety
/// `qp` is a QP of this library.
unsafe fn refuse(qp: QpExPtr) {
    // SAFETY: the caller's promise.
    unsafe { refuse_with(qp, EOPNOTSUPP) }
}

/// Mark the session failed with `e` (`ibv_wr_complete` returns it).
///
/// # Safety
/// `qp` is a QP of this library.
unsafe fn refuse_with(qp: QpExPtr, e: c_int) {
    // SAFETY: the caller's promise.
    let w = unsafe { qpw(qp) };
    let mut tx = lock(&w.tx);
    if tx.err == 0 {
        tx.err = e;
    }
}

unsafe extern "C" fn wr_start(qp: QpExPtr) {
    // SAFETY: a QP of this library (libibverbs' contract, as for every builder call).
    let w = unsafe { qpw(qp) };
    let mut tx = lock(&w.tx);
    tx.wrs.clear();
    tx.inline.clear();
    tx.err = 0;
}

unsafe extern "C" fn wr_complete(qp: QpExPtr) -> c_int {
    // SAFETY: a QP of this library.
    let w = unsafe { qpw(qp) };
    // SAFETY: its context is this library's.
    let s = unsafe { sh(w.c.context) };
    let mut tx = lock(&w.tx);
    let wrs = std::mem::take(&mut tx.wrs);
    let inl = std::mem::take(&mut tx.inline);
    if tx.err != 0 {
        let e = tx.err;
        tx.err = 0;
        return e;
    }
    for (x, parts) in wrs.into_iter().zip(inl) {
        // SAFETY: inline parts the program named with ibv_wr_set_inline_data(_list), readable
        // until this call returns (libibverbs' contract).
        if let Err(e) = unsafe { submit(s, w, &mut tx, x, parts) } {
            return e;
        }
    }
    0
}

unsafe extern "C" fn wr_abort(qp: QpExPtr) {
    // SAFETY: a QP of this library.
    unsafe { wr_start(qp) };
}

unsafe extern "C" fn wr_send(qp: QpExPtr) {
    // SAFETY: forwarded.
    unsafe { begin(qp, SendOp::Send) }
}
unsafe extern "C" fn wr_send_imm(qp: QpExPtr, imm: u32) {
    // SAFETY: forwarded.
    unsafe {
        begin(
            qp,
            SendOp::SendWithImm {
                imm: u32::from_be(imm),
            },
        )
    }
}
unsafe extern "C" fn wr_send_inv(qp: QpExPtr, rkey: u32) {
    // SAFETY: forwarded.
    unsafe {
        begin(
            qp,
            SendOp::SendWithInv {
                invalidate_rkey: RKey(rkey),
            },
        )
    }
}
unsafe extern "C" fn wr_rdma_write(qp: QpExPtr, rkey: u32, addr: u64) {
    // SAFETY: forwarded.
    unsafe {
        begin(
            qp,
            SendOp::RdmaWrite {
                remote_addr: addr,
                rkey: RKey(rkey),
            },
        )
    }
}
unsafe extern "C" fn wr_rdma_write_imm(qp: QpExPtr, rkey: u32, addr: u64, imm: u32) {
    // SAFETY: forwarded.
    unsafe {
        begin(
            qp,
            SendOp::RdmaWriteWithImm {
                remote_addr: addr,
                rkey: RKey(rkey),
                imm: u32::from_be(imm),
            },
        )
    }
}
unsafe extern "C" fn wr_rdma_read(qp: QpExPtr, rkey: u32, addr: u64) {
    // SAFETY: forwarded.
    unsafe {
        begin(
            qp,
            SendOp::RdmaRead {
                remote_addr: addr,
                rkey: RKey(rkey),
            },
        )
    }
}
unsafe extern "C" fn wr_atomic_cmp_swp(qp: QpExPtr, rkey: u32, addr: u64, cmp: u64, swap: u64) {
    // SAFETY: forwarded.
    unsafe {
        begin(
            qp,
            SendOp::AtomicCmpSwp {
                remote_addr: addr,
                rkey: RKey(rkey),
                compare: cmp,
                swap,
            },
        )
    }
}
unsafe extern "C" fn wr_atomic_fetch_add(qp: QpExPtr, rkey: u32, addr: u64, add: u64) {
    // SAFETY: forwarded.
    unsafe {
        begin(
            qp,
            SendOp::AtomicFetchAdd {
                remote_addr: addr,
                rkey: RKey(rkey),
                add,
            },
        )
    }
}
unsafe extern "C" fn wr_local_inv(qp: QpExPtr, rkey: u32) {
    // SAFETY: forwarded.
    unsafe { begin(qp, SendOp::LocalInv { rkey: RKey(rkey) }) }
}
unsafe extern "C" fn wr_bind_mw(
    qp: QpExPtr,
    mw: *mut crate::abi::ibv_mw,
    rkey: u32,
    b: *const crate::abi::ibv_mw_bind_info,
) {
    // SAFETY: a window of this library and the caller's bind information (or NULL), as
    // libibverbs' contract has them.
    match unsafe { crate::verbs::bind_op(mw, rkey, b.as_ref()) } {
        // SAFETY: forwarded.
        Some(op) => unsafe { begin(qp, op) },
        // SAFETY: forwarded.
        None => unsafe { refuse_with(qp, EINVAL) },
    }
}
unsafe extern "C" fn wr_send_tso(qp: QpExPtr, _hdr: *mut c_void, _sz: u16, _mss: u16) {
    // SAFETY: forwarded.
    unsafe { refuse(qp) }
}
unsafe extern "C" fn wr_set_xrc_srqn(qp: QpExPtr, srqn: u32) {
    // SAFETY: forwarded.
    unsafe { last(qp, |x, _| x.xrc_srqn = srqn & 0xff_ffff) }
}
unsafe extern "C" fn wr_atomic_write(qp: QpExPtr, rkey: u32, addr: u64, v: *const c_void) {
    if v.is_null() {
        // SAFETY: forwarded.
        return unsafe { refuse_with(qp, EINVAL) };
    }
    // SAFETY: `atomic_wr` points to the 8 bytes to write (libibverbs' contract for
    // `ibv_wr_atomic_write`), read now as rdma-core's providers copy them.
    let value = unsafe { std::ptr::read_unaligned(v as *const [u8; 8]) };
    // SAFETY: forwarded.
    unsafe {
        begin(
            qp,
            SendOp::AtomicWrite {
                remote_addr: addr,
                rkey: RKey(rkey),
                value,
            },
        )
    }
}

unsafe extern "C" fn wr_set_sge(qp: QpExPtr, lkey: u32, addr: u64, length: u32) {
    // SAFETY: forwarded.
    unsafe {
        last(qp, |x, i| {
            *i = None;
            x.sg_list = Sge {
                addr,
                length,
                lkey: LKey(lkey),
            }
            .into();
        })
    }
}

unsafe extern "C" fn wr_set_sge_list(qp: QpExPtr, n: usize, sg: *const ibv_sge) {
    // SAFETY: a QP of this library (libibverbs' contract, as for every builder call).
    let w = unsafe { qpw(qp) };
    if n > w.max_send_sge as usize {
        // More entries than the QP takes: the session fails with EINVAL, and the array is not
        // read (see `verbs::sges`).
        let mut tx = lock(&w.tx);
        if tx.err == 0 {
            tx.err = EINVAL;
        }
        return;
    }
    let list: SgList = if n == 0 || sg.is_null() {
        SgList::new()
    } else {
        // SAFETY: the caller's array of `n` entries.
        unsafe { std::slice::from_raw_parts(sg, n) }
            .iter()
            .map(|e| Sge {
                addr: e.addr,
                length: e.length,
                lkey: LKey(e.lkey),
            })
            .collect()
    };
    // SAFETY: forwarded.
    unsafe {
        last(qp, |x, i| {
            *i = None;
            x.sg_list = list;
        })
    }
}

unsafe extern "C" fn wr_set_inline_data(qp: QpExPtr, addr: *mut c_void, len: usize) {
    // SAFETY: forwarded.
    unsafe {
        last(qp, |x, i| {
            x.flags.insert(SendFlags::INLINE);
            *i = Some(vec![(addr as u64, len)]);
        })
    }
}

unsafe extern "C" fn wr_set_inline_data_list(qp: QpExPtr, n: usize, bufs: *const ibv_data_buf) {
    let parts: Vec<(u64, usize)> = if n == 0 || bufs.is_null() {
        Vec::new()
    } else {
        // SAFETY: the caller's array of `n` buffers.
        unsafe { std::slice::from_raw_parts(bufs, n) }
            .iter()
            .map(|b| (b.addr as u64, b.length))
            .collect()
    };
    // SAFETY: forwarded.
    unsafe {
        last(qp, |x, i| {
            x.flags.insert(SendFlags::INLINE);
            *i = Some(parts);
        })
    }
}

unsafe extern "C" fn wr_set_ud_addr(qp: QpExPtr, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    let Some(ah) = crate::verbs::ah_handle(ah) else {
        // SAFETY: forwarded.
        unsafe { refuse(qp) };
        return;
    };
    // SAFETY: forwarded.
    unsafe {
        last(qp, |x, _| {
            x.ud = Some(UdDest {
                ah,
                remote_qpn: QpNumber::new(qpn),
                remote_qkey: qkey,
            });
        })
    }
}

/// The work request builder every QP carries (`ibv_qp_to_qp_ex` hands it out for QPs created
/// with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`).
pub(crate) fn qp_ex_tail() -> ibv_qp_ex_tail {
    ibv_qp_ex_tail {
        comp_mask: 0,
        wr_id: 0,
        wr_flags: 0,
        wr_atomic_cmp_swp: Some(wr_atomic_cmp_swp),
        wr_atomic_fetch_add: Some(wr_atomic_fetch_add),
        wr_bind_mw: Some(wr_bind_mw),
        wr_local_inv: Some(wr_local_inv),
        wr_rdma_read: Some(wr_rdma_read),
        wr_rdma_write: Some(wr_rdma_write),
        wr_rdma_write_imm: Some(wr_rdma_write_imm),
        wr_send: Some(wr_send),
        wr_send_imm: Some(wr_send_imm),
        wr_send_inv: Some(wr_send_inv),
        wr_send_tso: Some(wr_send_tso),
        wr_set_ud_addr: Some(wr_set_ud_addr),
        wr_set_xrc_srqn: Some(wr_set_xrc_srqn),
        wr_set_inline_data: Some(wr_set_inline_data),
        wr_set_inline_data_list: Some(wr_set_inline_data_list),
        wr_set_sge: Some(wr_set_sge),
        wr_set_sge_list: Some(wr_set_sge_list),
        wr_start: Some(wr_start),
        wr_complete: Some(wr_complete),
        wr_abort: Some(wr_abort),
        wr_atomic_write: Some(wr_atomic_write),
    }
}
