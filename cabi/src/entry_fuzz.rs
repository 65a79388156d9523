//! A fuzz harness for the C entry points (issue 17): everything a C program hands this library
//! as *values* — work requests with any opcode, flags, scatter/gather count, lengths, keys and
//! addresses, NULL lists; QP, SRQ, CQ and AH attributes with any field and attribute mask;
//! creation capabilities and types; poll and notify counts — driven by a byte string read as a
//! sequence of calls on one open device. Pointers stay within libibverbs' contract (objects
//! this library handed out, arrays as long as the count says, or NULL), since a wild pointer
//! crashes any libibverbs; but a count larger than the array behind it is fuzzed too, where
//! the library can know better (a scatter/gather count beyond the QP's `max_sge`).
//!
//! Checked after every call: nothing crashes (the fuzz build runs with AddressSanitizer and
//! overflow checks); a post returns 0 or a positive errno, and on an error `bad_wr` names one
//! of the requests of the list; `poll_cq` returns at most what was asked, `-EINVAL` for a
//! negative count; every completion names a work request posted in this input to a QP not
//! destroyed since (or to an SRQ) and a QP of the input that is still alive (no completion
//! without a request, none for a destroyed QP ever, not even a flush of a QP destroyed in the
//! error state); the bytes of the buffer no memory region covers are never written.
//! At the end of each input every object it created is destroyed again, and must be: the
//! device is shared by all inputs.
//!
//! The device is this process's (`FERROCE_DEV`): the harness refuses to run unless the only
//! interface it can see is `lo`, i.e. in a network namespace of its own (`unshare -rn` with
//! `lo` up), since connected QPs send to whatever GID the input names.
//!
//! Run by `fuzz/fuzz_targets/cabi_entry.rs` (`tools/fuzz cabi_entry RUNS [SECONDS]`) and, on
//! stable, by `cabi/tests/entry_fuzz.rs` (seeded inputs and the kept regressions).
#![allow(missing_docs)]

use crate::abi::*;
use crate::verbs::*;
use ferroce::verbs::QpAttrMask as M;
use libc::{c_int, c_void, EINVAL};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ptr::null_mut;

/// Reads the fuzz input; zeros once it is exhausted (also the rsocket harness's reader).
pub(crate) struct Input<'a> {
    pub(crate) d: &'a [u8],
    pub(crate) i: usize,
}

impl Input<'_> {
    pub(crate) fn done(&self) -> bool {
        self.i >= self.d.len()
    }
    pub(crate) fn u8(&mut self) -> u8 {
        let b = self.d.get(self.i).copied().unwrap_or(0);
        self.i += 1;
        b
    }
    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
    fn int(&mut self) -> c_int {
        self.u32() as c_int
    }
    /// Mostly `sane`, sometimes a small or a wild value.
    fn pick_u32(&mut self, sane: u32) -> u32 {
        match self.u8() % 8 {
            0..=4 => sane,
            5 => u32::from(self.u8()),
            6 => self.u32(),
            _ => u32::MAX - u32::from(self.u8()),
        }
    }
}

/// The application's memory: registered regions cover `[0, MR_END)`; the rest is a guard
/// that nothing may write.
const BUF: usize = 1 << 16;
const MR_END: usize = BUF / 2;
const GUARD: u8 = 0xa7;

/// What every input shares: the open device and the objects that live as long as it.
struct Env {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    other_pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    /// Local write, remote read/write/atomic, over `buf[0..MR_END/2]`.
    mr: *mut ibv_mr,
    /// Remote read only, over `buf[MR_END/2..MR_END]`.
    mr_ro: *mut ibv_mr,
    /// Another PD's region over the same bytes as `mr`.
    mr_other: *mut ibv_mr,
    buf: Box<[u8]>,
    gid: ibv_gid,
    /// The number of the input running, in bits 24.. of every wr_id it posts.
    input: u64,
    /// The wr_ids the running input posted and that have not completed, each with the QP it
    /// was posted to (`SRQ` for an SRQ's): a QP's go when it is destroyed, all of them at the
    /// end of the input (every object of the input is destroyed then).
    pending: BTreeMap<u64, u32>,
}

/// The owner of a receive posted to an SRQ in `Env::pending`.
const SRQ: u32 = u32::MAX;

thread_local! {
    static ENV: RefCell<Option<Env>> = const { RefCell::new(None) };
}

fn must<T>(p: *mut T, what: &str) -> *mut T {
    assert!(
        !p.is_null(),
        "{what} failed: {}",
        std::io::Error::last_os_error()
    );
    p
}

fn env() -> Env {
    let others: Vec<String> = ferroce::io::netdev::netdevs()
        .into_iter()
        .map(|d| d.name)
        .filter(|n| n != "lo")
        .collect();
    assert!(
        others.is_empty(),
        "the C entry point harness sends to any address: run it in a network namespace of its \
         own with only lo (unshare -rn; tools/fuzz does); interfaces seen: {others:?}"
    );
    std::env::set_var("FERROCE_DEV", "lo");
    let mut n = 0;
    // SAFETY: the calls below follow libibverbs' contract: out parameters are locals, every
    // object passed was returned by this library and is alive, the buffer outlives its regions
    // (it lives in `Env`, whose regions are never deregistered).
    unsafe {
        let list = must(ibv_get_device_list(&mut n), "ibv_get_device_list");
        assert_eq!(n, 1);
        let ctx = must(ibv_open_device(*list), "ibv_open_device");
        ibv_free_device_list(list);
        let pd = must(ibv_alloc_pd(ctx), "ibv_alloc_pd");
        let other_pd = must(ibv_alloc_pd(ctx), "ibv_alloc_pd");
        let cq = must(
            ibv_create_cq(ctx, 4096, null_mut(), null_mut(), 0),
            "ibv_create_cq",
        );
        let mut buf = vec![GUARD; BUF].into_boxed_slice();
        let base = buf.as_mut_ptr();
        let all = 1 | 2 | 4 | 8; // LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC
        let mr = must(
            ibv_reg_mr(pd, base as *mut c_void, MR_END / 2, all),
            "ibv_reg_mr",
        );
        let mr_ro = must(
            ibv_reg_mr(pd, base.add(MR_END / 2) as *mut c_void, MR_END / 2, 4),
            "ibv_reg_mr",
        );
        let mr_other = must(
            ibv_reg_mr(other_pd, base as *mut c_void, MR_END / 2, all),
            "ibv_reg_mr",
        );
        let mut gid = ibv_gid { raw: [0; 16] };
        assert_eq!(ibv_query_gid(ctx, 1, 0, &mut gid), 0);
        Env {
            ctx,
            pd,
            other_pd,
            cq,
            mr,
            mr_ro,
            mr_other,
            buf,
            gid,
            input: 0,
            pending: BTreeMap::new(),
        }
    }
}

/// The objects one input made (destroyed at its end).
#[derive(Default)]
struct Made {
    qps: Vec<*mut ibv_qp>,
    srqs: Vec<*mut ibv_srq>,
    cqs: Vec<*mut ibv_cq>,
    ahs: Vec<*mut ibv_ah>,
    mrs: Vec<*mut ibv_mr>,
    mws: Vec<*mut ibv_mw>,
    dms: Vec<*mut ibv_dm>,
    xrcds: Vec<*mut ibv_xrcd>,
    /// The XRC target QPs' numbers: what one received completes on its XRC SRQ's CQ and
    /// stays there when the target is destroyed (the WQE was the SRQ's, spent).
    xrc_targets: Vec<u32>,
    next: u64,
    st: Stats,
}

/// What one input did (for the stable test's depth check).
#[derive(Default, Debug, Clone, Copy)]
pub struct Stats {
    pub calls: u64,
    pub qps: u64,
    pub posts_taken: u64,
    pub posts_refused: u64,
    pub modify_ok: u64,
    pub modify_refused: u64,
    pub completions: u64,
    pub error_completions: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.calls += o.calls;
        self.qps += o.qps;
        self.posts_taken += o.posts_taken;
        self.posts_refused += o.posts_refused;
        self.modify_ok += o.modify_ok;
        self.modify_refused += o.modify_refused;
        self.completions += o.completions;
        self.error_completions += o.error_completions;
    }
}

/// Run one input.
pub fn run(data: &[u8]) {
    run_stats(data);
}

/// Run one input; what it did.
pub fn run_stats(data: &[u8]) -> Stats {
    ENV.with(|e| {
        let mut e = e.borrow_mut();
        let env = e.get_or_insert_with(env);
        env.input += 1;
        let mut inp = Input { d: data, i: 0 };
        let mut m = Made::default();
        setup(env, &mut m, &mut inp);
        let mut calls = 0;
        while !inp.done() && calls < 64 {
            calls += 1;
            call(env, &mut m, &mut inp);
        }
        teardown(env, &mut m);
        m.st.calls = calls;
        m.st
    })
}

/// Any of the CQs (the shared one mostly), or NULL.
fn some_cq(env: &Env, m: &Made, k: u8) -> *mut ibv_cq {
    match k % 8 {
        0 => null_mut(),
        1 if !m.cqs.is_empty() => m.cqs[usize::from(k / 8) % m.cqs.len()],
        _ => env.cq,
    }
}

/// QPs from `ibv_create_qp` with attributes from the input (mostly sane, any field wild);
/// then, sometimes, the first two of one type connected to each other the proper way.
fn setup(env: &mut Env, m: &mut Made, inp: &mut Input) {
    let n = 2 + inp.u8() % 3;
    let pair = inp.u8();
    for _ in 0..n {
        if inp.u8() % 4 == 0 {
            // SAFETY: an attribute struct of ours for an SRQ of our PD.
            let srq = unsafe {
                let mut a = ibv_srq_init_attr {
                    srq_context: null_mut(),
                    attr: ibv_srq_attr {
                        max_wr: inp.pick_u32(16),
                        max_sge: inp.pick_u32(2),
                        srq_limit: inp.pick_u32(0),
                    },
                };
                ibv_create_srq(env.pd, &mut a)
            };
            if !srq.is_null() {
                m.srqs.push(srq);
            }
        }
        let kind = inp.u8();
        let srq = if kind & 0x80 != 0 {
            m.srqs.last().copied().unwrap_or(null_mut())
        } else {
            null_mut()
        };
        let mut init = if kind % 4 != 0 {
            // Sane attributes (the first two QPs of one type, to be connected).
            let ty = [2, 2, 3, 4][usize::from(if m.qps.len() < 2 { pair } else { kind >> 2 }) % 4];
            ibv_qp_init_attr {
                qp_context: null_mut(),
                send_cq: env.cq,
                recv_cq: env.cq,
                srq,
                cap: ibv_qp_cap {
                    max_send_wr: 16,
                    max_recv_wr: 16,
                    max_send_sge: 4,
                    max_recv_sge: 4,
                    max_inline_data: 64,
                },
                qp_type: ty,
                sq_sig_all: 1,
            }
        } else {
            let ty = match inp.u8() % 8 {
                0..=3 => 2, // RC
                4 => 3,     // UC
                5 | 6 => 4, // UD
                _ => inp.int(),
            };
            let k = inp.u8();
            ibv_qp_init_attr {
                qp_context: null_mut(),
                send_cq: some_cq(env, m, k),
                recv_cq: some_cq(env, m, k.rotate_left(3)),
                srq,
                cap: qp_cap(inp),
                qp_type: ty,
                sq_sig_all: if inp.u8() % 4 == 0 { inp.int() } else { 1 },
            }
        };
        let pd = if inp.u8() % 16 == 0 {
            env.other_pd
        } else {
            env.pd
        };
        // SAFETY: our attribute struct, naming our CQs/SRQ (or NULL).
        let qp = unsafe { ibv_create_qp(pd, &mut init) };
        if !qp.is_null() {
            m.qps.push(qp);
            m.st.qps += 1;
        }
    }
    if inp.u8() % 4 == 0 {
        xrc_setup(env, m, inp);
    }
    if m.qps.len() >= 2 && inp.u8() % 4 != 0 {
        let (a, b) = (m.qps[0], m.qps[1]);
        // SAFETY: QPs of ours.
        let (ta, tb) = unsafe { ((*a).qp_type, (*b).qp_type) };
        if ta == tb {
            m.st.modify_ok += connect(env, a, b, ta) + connect(env, b, a, ta);
        }
    }
}

/// An XRC domain, an XRC SRQ of it on the shared CQ (attributes from the input), a target QP
/// and an initiator (`ibv_create_qp_ex`), both brought to RTS towards each other with each
/// half's attributes: the initiator's requests then name the SRQ (or another number, below in
/// `post_send`). Refusals are fine; what is made is destroyed at the end.
fn xrc_setup(env: &mut Env, m: &mut Made, inp: &mut Input) {
    // SAFETY: our open context.
    let v = unsafe { &crate::verbs::ctx(env.ctx).v };
    let mut xa = ibv_xrcd_init_attr {
        comp_mask: IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
        fd: -1,
        oflags: 0,
    };
    if inp.u8() % 8 == 0 {
        xa.comp_mask = inp.u32();
        xa.oflags = inp.int();
    }
    // SAFETY: the context's own operations on our context and attribute structs.
    unsafe {
        let x = (v.open_xrcd.expect("open_xrcd"))(env.ctx, &mut xa);
        if x.is_null() {
            return;
        }
        m.xrcds.push(x);
        let mut sa: ibv_srq_init_attr_ex = std::mem::zeroed();
        sa.attr.max_wr = inp.pick_u32(16);
        sa.attr.max_sge = inp.pick_u32(2);
        sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE
            | IBV_SRQ_INIT_ATTR_PD
            | IBV_SRQ_INIT_ATTR_XRCD
            | IBV_SRQ_INIT_ATTR_CQ;
        sa.srq_type = IBV_SRQT_XRC;
        sa.pd = env.pd;
        sa.xrcd = x;
        sa.cq = env.cq;
        let srq = (v.create_srq_ex.expect("create_srq_ex"))(env.ctx, &mut sa);
        if !srq.is_null() {
            m.srqs.push(srq);
        }
        let mut qa: ibv_qp_init_attr_ex = std::mem::zeroed();
        qa.qp_type = IBV_QPT_XRC_RECV;
        qa.comp_mask = IBV_QP_INIT_ATTR_XRCD;
        qa.xrcd = x;
        let tgt = crate::ex::create_qp_ex(env.ctx, &mut qa);
        if !tgt.is_null() {
            m.xrc_targets.push((*tgt).qp_num);
        }
        let mut qa: ibv_qp_init_attr_ex = std::mem::zeroed();
        qa.qp_type = IBV_QPT_XRC_SEND;
        qa.comp_mask = IBV_QP_INIT_ATTR_PD;
        qa.pd = env.pd;
        qa.send_cq = env.cq;
        qa.cap = qp_cap(inp);
        qa.sq_sig_all = 1;
        let ini = crate::ex::create_qp_ex(env.ctx, &mut qa);
        for q in [tgt, ini] {
            if !q.is_null() {
                m.qps.push(q);
                m.st.qps += 1;
            }
        }
        if !tgt.is_null() && !ini.is_null() {
            m.st.modify_ok +=
                connect(env, tgt, ini, IBV_QPT_XRC_RECV) + connect(env, ini, tgt, IBV_QPT_XRC_SEND);
        }
    }
}

/// An `ibv_qp_attr_mask` from ferroce's mask (the same bits, as `ibv_modify_qp` reads them).
fn bits(m: M) -> c_int {
    m.bits() as c_int
}

/// An attribute struct with every field zero.
fn zero_attr() -> ibv_qp_attr {
    // SAFETY: `ibv_qp_attr` is plain data (integers and arrays of them): all zeros is a value.
    unsafe { std::mem::zeroed() }
}

/// `x` through INIT, RTR and RTS towards `peer` (both of type `ty`); how many of the three
/// steps were taken (the input may have made either QP unusable).
fn connect(env: &Env, x: *mut ibv_qp, peer: *mut ibv_qp, ty: c_int) -> u64 {
    let mut ok = 0;
    let mut a = zero_attr();
    a.qp_state = 1;
    a.port_num = 1;
    a.qkey = 0x1111_1111;
    a.qp_access_flags = 1 | 2 | 4 | 8;
    let mask =
        bits(M::STATE | M::PKEY_INDEX | M::PORT | if ty == 4 { M::QKEY } else { M::ACCESS_FLAGS });
    // SAFETY: QPs of ours, our attribute struct.
    unsafe {
        ok += u64::from(ibv_modify_qp(x, &mut a, mask) == 0);
        let mut a = zero_attr();
        a.qp_state = 2;
        a.path_mtu = 3; // 1024
        a.dest_qp_num = (*peer).qp_num;
        a.rq_psn = 0x10;
        a.max_dest_rd_atomic = 4;
        a.min_rnr_timer = 1;
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = 1;
        a.ah_attr.grh.dgid = env.gid;
        a.ah_attr.grh.hop_limit = 64;
        let rtr = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
        let mask = bits(match ty {
            4 => M::STATE,
            3 | IBV_QPT_XRC_SEND => rtr,
            _ => rtr | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
        });
        ok += u64::from(ibv_modify_qp(x, &mut a, mask) == 0);
        let mut a = zero_attr();
        a.qp_state = 3;
        a.sq_psn = 0x10;
        a.timeout = 10;
        a.retry_cnt = 2;
        a.rnr_retry = 2;
        a.max_rd_atomic = 4;
        let mask = bits(match ty {
            2 | IBV_QPT_XRC_SEND => {
                M::STATE
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::SQ_PSN
                    | M::MAX_QP_RD_ATOMIC
            }
            IBV_QPT_XRC_RECV => M::STATE | M::TIMEOUT | M::SQ_PSN,
            _ => M::STATE | M::SQ_PSN,
        });
        ok += u64::from(ibv_modify_qp(x, &mut a, mask) == 0);
    }
    ok
}

/// A scatter/gather entry: mostly inside a region with its key, sometimes a wrong key, a
/// range beyond the region, or anything.
fn sge(env: &Env, inp: &mut Input) -> ibv_sge {
    let k = inp.u8();
    // SAFETY: regions of ours.
    let (mr, mr_ro, mr_other) = unsafe { (&*env.mr, &*env.mr_ro, &*env.mr_other) };
    let r = match k % 8 {
        0..=3 => mr,
        4 => mr_ro,
        5 => mr_other,
        6 => {
            return ibv_sge {
                addr: inp.u64(),
                length: inp.u32(),
                lkey: inp.u32(),
            }
        }
        _ => {
            return ibv_sge {
                addr: mr.addr as u64 + u64::from(inp.u16()),
                length: inp.u32(),
                lkey: mr.lkey,
            }
        }
    };
    let off = u64::from(inp.u16()) % r.length as u64;
    let len = match inp.u8() % 4 {
        0 => 0,
        1 => u32::from(inp.u16()),
        _ => u32::from(inp.u8()),
    };
    ibv_sge {
        addr: r.addr as u64 + off,
        length: len,
        lkey: if k & 0x80 != 0 { inp.u32() } else { r.lkey },
    }
}

/// Up to `MAX_SGE` entries behind every list (what a C program would have in an array); the
/// count given is mostly the entries there, sometimes more than the QP allows (with the
/// array still `MAX_SGE` long: a library that reads more than its limit before checking
/// overruns it), negative, or zero with entries.
const MAX_SGE: usize = 40;

fn sge_list(env: &Env, inp: &mut Input) -> (Vec<ibv_sge>, c_int, bool) {
    let n = usize::from(inp.u8()) % 6;
    let mut v: Vec<ibv_sge> = (0..n).map(|_| sge(env, inp)).collect();
    let count = match inp.u8() % 16 {
        0 => 0,
        1 => -1 - c_int::from(inp.u8()),
        2 => MAX_SGE as c_int + c_int::from(inp.u16()),
        3 => c_int::MAX,
        // every entry in memory, the unused ones zero (the resize below)
        4 => MAX_SGE as c_int,
        _ => v.len() as c_int,
    };
    let null = inp.u8() % 16 == 0;
    // Every list is MAX_SGE entries long in memory; `count` is what the request says.
    v.resize(
        MAX_SGE,
        ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        },
    );
    (v, count, null)
}

/// A fresh wr_id for a request posted to QP number `owner` (or [`SRQ`]).
fn wr_id(env: &mut Env, m: &mut Made, owner: u32) -> u64 {
    m.next += 1;
    let id = (env.input << 24) | m.next;
    env.pending.insert(id, owner);
    id
}

/// `ibv_destroy_qp` on a QP of the input; its requests not completed never will be.
///
/// # Safety
/// `q` is a live QP of ours, not used after.
unsafe fn destroy_qp(env: &mut Env, q: *mut ibv_qp) {
    // SAFETY: a live QP of ours (the caller's word).
    let num = unsafe { (*q).qp_num };
    // SAFETY: as above; destroyed once.
    assert_eq!(unsafe { ibv_destroy_qp(q) }, 0, "ibv_destroy_qp");
    env.pending.retain(|_, o| *o != num);
}

fn ah(env: &Env, m: &mut Made, inp: &mut Input) -> *mut ibv_ah {
    // SAFETY: our attribute struct and PD.
    let ah = unsafe {
        let mut a: ibv_ah_attr = zero_attr().ah_attr;
        a.is_global = if inp.u8() % 8 == 0 { inp.u8() } else { 1 };
        a.port_num = if inp.u8() % 8 == 0 { inp.u8() } else { 1 };
        a.grh.dgid = env.gid;
        if inp.u8() % 4 == 0 {
            for b in a.grh.dgid.raw.iter_mut() {
                *b = inp.u8();
            }
        }
        a.grh.sgid_index = if inp.u8() % 8 == 0 { inp.u8() } else { 0 };
        a.grh.hop_limit = inp.u8();
        a.grh.traffic_class = inp.u8();
        a.grh.flow_label = inp.u32();
        a.dlid = inp.u16();
        a.sl = inp.u8();
        a.static_rate = inp.u8();
        let pd = if inp.u8() % 8 == 0 {
            env.other_pd
        } else {
            env.pd
        };
        ibv_create_ah(pd, &mut a)
    };
    if !ah.is_null() {
        m.ahs.push(ah);
    }
    ah
}

fn post_send(env: &mut Env, m: &mut Made, inp: &mut Input, qp: *mut ibv_qp) {
    let n = 1 + usize::from(inp.u8() % 4);
    let mut lists = Vec::with_capacity(n);
    // SAFETY: all-zero is a value of the plain-data request (its union's pointer NULL).
    let mut wrs: Vec<ibv_send_wr> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
    // SAFETY: regions of ours.
    let (mr, mr_ro) = unsafe { (&*env.mr, &*env.mr_ro) };
    let ud_ah = m.ahs.last().copied();
    // SAFETY: a QP of ours.
    let ud_qp = unsafe { (*qp).qp_type } == 4;
    let base = env.buf.as_ptr() as u64;
    for w in wrs.iter_mut() {
        let (l, count, null) = sge_list(env, inp);
        lists.push(l);
        // SAFETY: a QP of ours.
        w.wr_id = wr_id(env, m, unsafe { (*qp).qp_num });
        w.num_sge = count;
        w.sg_list = if null {
            null_mut()
        } else {
            lists.last_mut().unwrap().as_mut_ptr()
        };
        let op = inp.u8();
        w.opcode = match op % 16 {
            0..=10 => c_int::from(op % 11),
            11 => inp.int(),
            12 => 15, // IBV_WR_ATOMIC_WRITE
            _ => 2,
        };
        w.send_flags = match inp.u8() % 4 {
            0 => inp.u32(),
            1 => 8, // INLINE
            _ => 2, // SIGNALED
        };
        w.imm_data = inp.u32();
        // An XRC initiator's target SRQ: one of the input's SRQs (an XRC one, an ordinary one:
        // refused by the target), or any number.
        w.remote_srqn = match inp.u8() % 4 {
            0 => inp.u32(),
            // SAFETY: SRQs of ours.
            _ => m.srqs.last().map_or(0, |&s| unsafe { (*s).handle }),
        };
        let target = inp.u8();
        let (addr, rkey) = match target % 8 {
            0..=3 => (mr.addr as u64 + u64::from(inp.u16()) % 4096, mr.rkey),
            4 => (mr_ro.addr as u64, mr_ro.rkey),
            5 => (mr.addr as u64 + u64::from(inp.u32()), mr.rkey),
            _ => (inp.u64(), inp.u32()),
        };
        // Inline data is read from the addresses given, with no key (libibverbs' contract:
        // they are the program's readable memory): entries short enough to be taken are
        // moved into the buffer; longer ones (beyond any inline limit) keep any address.
        if w.send_flags & 8 != 0 {
            for e in lists.last_mut().unwrap().iter_mut() {
                if e.length <= 1024 {
                    e.addr = base + e.addr % (BUF as u64 - 1024);
                }
            }
        }
        // An ATOMIC WRITE's 8 bytes are read from its first entry's address, likewise with no
        // key: an entry of 8 bytes there is moved into the buffer (any other is refused).
        if w.opcode == 15 {
            let eight = inp.u8() % 4 != 0;
            if let Some(e) = lists.last_mut().unwrap().first_mut() {
                if eight {
                    e.length = 8;
                }
                if e.length == 8 {
                    e.addr = base + e.addr % (BUF as u64 - 8);
                }
            }
        }
        // A UD QP reads the `ud` member (its AH is dereferenced): always that one there.
        w.wr = if ud_qp || target & 0x40 != 0 {
            wr_union {
                ud: wr_ud {
                    ah: match ud_ah {
                        Some(a) if inp.u8() % 8 != 0 => a,
                        _ => null_mut(),
                    },
                    remote_qpn: if inp.u8() % 4 == 0 {
                        inp.u32()
                    } else {
                        // SAFETY: QPs of ours.
                        m.qps.first().map_or(0, |q| unsafe { (**q).qp_num })
                    },
                    remote_qkey: 0x1111_1111 ^ u32::from(inp.u8() % 2),
                },
            }
        } else if target & 0x80 != 0 {
            wr_union {
                atomic: wr_atomic {
                    remote_addr: addr & !7,
                    compare_add: inp.u64(),
                    swap: inp.u64(),
                    rkey,
                },
            }
        } else {
            wr_union {
                rdma: wr_rdma {
                    remote_addr: addr,
                    rkey,
                },
            }
        };
        // A bind request naming one of the input's windows (else its window is NULL).
        if w.opcode == 8 && !m.mws.is_empty() && target & 0x20 != 0 {
            let mw = m.mws[usize::from(inp.u8()) % m.mws.len()];
            // SAFETY: a window of ours.
            let cur = unsafe { (*mw).rkey };
            w.bind_mw = ibv_send_wr_bind_mw {
                mw,
                rkey: match inp.u8() % 4 {
                    0 => inp.u32(),
                    _ => ferroce::verbs::inc_rkey(ferroce::wire::RKey(cur)).0,
                },
                bind_info: bind_info(env, inp),
            };
        }
    }
    for i in 1..n {
        let next: *mut ibv_send_wr = &mut wrs[i];
        wrs[i - 1].next = next;
    }
    let first = if inp.u8() % 32 == 0 {
        null_mut()
    } else {
        wrs.as_mut_ptr()
    };
    let mut bad: *mut ibv_send_wr = null_mut();
    // SAFETY: the context's own operation on a QP of ours, with a list of live requests
    // whose scatter/gather arrays hold MAX_SGE entries each (see `sge_list` for the counts).
    let rc = unsafe {
        let post = (*env.ctx).ops.post_send.expect("post_send");
        post(qp, first, &mut bad)
    };
    check_post(
        m,
        rc,
        bad as *const u8,
        wrs.as_ptr() as *const u8,
        n,
        size_of_send(),
    );
    drop(lists);
}

fn size_of_send() -> usize {
    std::mem::size_of::<ibv_send_wr>()
}

/// A post's result: 0, or a positive errno with `bad` naming one of the `n` requests at
/// `first` (each `size` bytes).
fn check_post(m: &mut Made, rc: c_int, bad: *const u8, first: *const u8, n: usize, size: usize) {
    assert!(rc >= 0, "a post returned {rc}");
    if rc == 0 {
        m.st.posts_taken += 1;
    } else {
        m.st.posts_refused += 1;
    }
    if rc != 0 && !first.is_null() {
        let ok = (0..n).any(|i| bad == first.wrapping_add(i * size));
        assert!(ok || bad.is_null(), "bad_wr names no request of the list");
    }
}

fn post_recv(env: &mut Env, m: &mut Made, inp: &mut Input, qp: *mut ibv_qp, srq: *mut ibv_srq) {
    let n = 1 + usize::from(inp.u8() % 4);
    let mut lists = Vec::with_capacity(n);
    let mut wrs: Vec<ibv_recv_wr> = Vec::with_capacity(n);
    let owner = if srq.is_null() {
        // SAFETY: a QP of ours.
        unsafe { (*qp).qp_num }
    } else {
        SRQ
    };
    for _ in 0..n {
        let (l, count, null) = sge_list(env, inp);
        lists.push(l);
        wrs.push(ibv_recv_wr {
            wr_id: wr_id(env, m, owner),
            next: null_mut(),
            sg_list: if null {
                null_mut()
            } else {
                lists.last_mut().unwrap().as_mut_ptr()
            },
            num_sge: count,
        });
    }
    for i in 1..n {
        let next: *mut ibv_recv_wr = &mut wrs[i];
        wrs[i - 1].next = next;
    }
    let mut bad: *mut ibv_recv_wr = null_mut();
    // SAFETY: the context's own operations on a QP/SRQ of ours, with a list of live requests
    // whose arrays hold MAX_SGE entries each.
    let rc = unsafe {
        if srq.is_null() {
            let post = (*env.ctx).ops.post_recv.expect("post_recv");
            post(qp, wrs.as_mut_ptr(), &mut bad)
        } else {
            let post = (*env.ctx).ops.post_srq_recv.expect("post_srq_recv");
            post(srq, wrs.as_mut_ptr(), &mut bad)
        }
    };
    check_post(
        m,
        rc,
        bad as *const u8,
        wrs.as_ptr() as *const u8,
        n,
        std::mem::size_of::<ibv_recv_wr>(),
    );
    drop(lists);
}

/// QP capabilities from the input (mostly sane, any field wild).
fn qp_cap(inp: &mut Input) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: inp.pick_u32(16),
        max_recv_wr: inp.pick_u32(16),
        max_send_sge: inp.pick_u32(4),
        max_recv_sge: inp.pick_u32(4),
        max_inline_data: inp.pick_u32(64),
    }
}

/// An attribute struct with any field, mostly sane values.
fn qp_attr(env: &Env, m: &Made, inp: &mut Input) -> ibv_qp_attr {
    let mut a = zero_attr();
    a.qp_state = match inp.u8() % 10 {
        9 => inp.int(),
        s => c_int::from(s % 7),
    };
    a.cur_qp_state = c_int::from(inp.u8() % 8);
    a.path_mtu = match inp.u8() % 8 {
        0 => inp.int(),
        k => c_int::from(k % 6),
    };
    a.qkey = inp.u32();
    a.rq_psn = inp.u32();
    a.sq_psn = inp.u32();
    a.dest_qp_num = match inp.u8() % 4 {
        // SAFETY: QPs of ours.
        0 | 1 if !m.qps.is_empty() => unsafe { (*m.qps[0]).qp_num },
        _ => inp.u32(),
    };
    a.qp_access_flags = u32::from(inp.u8()) | if inp.u8() % 8 == 0 { inp.u32() } else { 0 };
    a.cap = qp_cap(inp);
    a.ah_attr.is_global = inp.u8() % 3;
    a.ah_attr.port_num = inp.u8() % 3;
    a.ah_attr.grh.dgid = env.gid;
    if inp.u8() % 4 == 0 {
        for b in a.ah_attr.grh.dgid.raw.iter_mut() {
            *b = inp.u8();
        }
    }
    a.ah_attr.grh.sgid_index = inp.u8() % 4;
    a.ah_attr.grh.hop_limit = inp.u8();
    a.ah_attr.grh.flow_label = inp.u32();
    a.ah_attr.grh.traffic_class = inp.u8();
    a.ah_attr.sl = inp.u8();
    a.ah_attr.static_rate = inp.u8();
    a.alt_ah_attr = a.ah_attr;
    a.pkey_index = u16::from(inp.u8() % 3);
    a.en_sqd_async_notify = inp.u8();
    a.max_rd_atomic = inp.u8();
    a.max_dest_rd_atomic = inp.u8();
    a.min_rnr_timer = inp.u8();
    a.port_num = inp.u8() % 3;
    a.timeout = inp.u8();
    a.retry_cnt = inp.u8();
    a.rnr_retry = inp.u8();
    a.rate_limit = inp.u32();
    a
}

fn poll(env: &mut Env, m: &mut Made, cq: *mut ibv_cq, n: c_int) -> c_int {
    let mut wc = [ibv_wc {
        wr_id: 0,
        status: 0,
        opcode: 0,
        vendor_err: 0,
        byte_len: 0,
        imm_data: 0,
        qp_num: 0,
        src_qp: 0,
        wc_flags: 0,
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    }; 64];
    // SAFETY: the context's own operation on a CQ of ours with an array of 64 entries; the
    // count is at most 64 (or negative).
    let got = unsafe {
        let poll = (*env.ctx).ops.poll_cq.expect("poll_cq");
        poll(cq, n.min(64), wc.as_mut_ptr())
    };
    if n < 0 {
        assert_eq!(got, -EINVAL, "poll_cq with a negative count");
        return 0;
    }
    assert!(
        (0..=n.min(64)).contains(&got),
        "poll_cq returned {got} for {n}"
    );
    for w in &wc[..got as usize] {
        m.st.completions += 1;
        if w.status != 0 {
            m.st.error_completions += 1;
        }
        // SAFETY: QPs of ours.
        let live = m.qps.iter().any(|&q| unsafe { (*q).qp_num } == w.qp_num);
        let owner = env.pending.remove(&w.wr_id);
        // A destroyed XRC target's receive stays in its XRC SRQ's CQ (its WQE was spent).
        let srq_recv_of_a_target = owner == Some(SRQ) && m.xrc_targets.contains(&w.qp_num);
        assert!(
            owner.is_some() && (live || srq_recv_of_a_target),
            "a completion for no pending work request or of a destroyed QP (input {}): wr_id \
             {:#x} (input {}, request {}) status {} opcode {} qp {:#x}",
            env.input,
            w.wr_id,
            w.wr_id >> 24,
            w.wr_id & 0xff_ffff,
            w.status,
            w.opcode,
            w.qp_num
        );
    }
    got
}

/// One call chosen by the input.
fn call(env: &mut Env, m: &mut Made, inp: &mut Input) {
    let act = inp.u8();
    let qp = if m.qps.is_empty() {
        null_mut()
    } else {
        m.qps[usize::from(act >> 4) % m.qps.len()]
    };
    match act % 16 {
        0..=3 if !qp.is_null() => post_send(env, m, inp, qp),
        4 | 5 if !qp.is_null() => post_recv(env, m, inp, qp, null_mut()),
        6 if !m.srqs.is_empty() => {
            let srq = m.srqs[usize::from(act >> 4) % m.srqs.len()];
            post_recv(env, m, inp, null_mut(), srq);
        }
        7 if !qp.is_null() => {
            let mut a = qp_attr(env, m, inp);
            let mask = match inp.u8() % 4 {
                0 => inp.int(),
                _ => c_int::from(inp.u16()) << (inp.u8() % 12) | bits(M::STATE),
            };
            // SAFETY: a QP of ours and our attribute struct.
            let rc = unsafe { ibv_modify_qp(qp, &mut a, mask) };
            assert!(rc >= 0, "ibv_modify_qp returned {rc}");
            if rc == 0 {
                m.st.modify_ok += 1;
            } else {
                m.st.modify_refused += 1;
            }
        }
        8 if !qp.is_null() => {
            let mut a = zero_attr();
            // SAFETY: all-zero is a value of this plain-data struct (its pointers NULL).
            let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
            // SAFETY: a QP of ours and our out parameters.
            let rc = unsafe { ibv_query_qp(qp, &mut a, inp.int(), &mut init) };
            assert_eq!(rc, 0, "ibv_query_qp");
        }
        9 => {
            let cq = some_cq(env, m, inp.u8());
            if !cq.is_null() {
                let n = match inp.u8() % 4 {
                    0 => -1 - c_int::from(inp.u8()),
                    _ => c_int::from(inp.u8() % 65),
                };
                poll(env, m, cq, n);
            }
        }
        10 => {
            let cq = some_cq(env, m, inp.u8());
            if !cq.is_null() {
                // SAFETY: the context's own operation on a CQ of ours.
                let rc = unsafe {
                    let notify = (*env.ctx).ops.req_notify_cq.expect("req_notify_cq");
                    notify(cq, inp.int())
                };
                assert!(rc >= 0);
            }
        }
        11 => {
            let cqe = match inp.u8() % 4 {
                0 => inp.int(),
                1 => -c_int::from(inp.u8()),
                _ => c_int::from(inp.u16()),
            };
            // SAFETY: our context; no channel.
            let cq = unsafe { ibv_create_cq(env.ctx, cqe, null_mut(), null_mut(), inp.int()) };
            if !cq.is_null() {
                m.cqs.push(cq);
            }
        }
        12 => {
            let mut a = ibv_srq_attr {
                max_wr: inp.pick_u32(16),
                max_sge: inp.pick_u32(2),
                srq_limit: inp.pick_u32(4),
            };
            if let Some(&srq) = m.srqs.first() {
                // SAFETY: an SRQ of ours and our attribute struct.
                let rc = unsafe { ibv_modify_srq(srq, &mut a, inp.int()) };
                assert!(rc >= 0);
            } else {
                let mut init = ibv_srq_init_attr {
                    srq_context: null_mut(),
                    attr: a,
                };
                // SAFETY: our PD and attribute struct.
                let srq = unsafe { ibv_create_srq(env.pd, &mut init) };
                if !srq.is_null() {
                    m.srqs.push(srq);
                }
            }
        }
        13 if act >> 4 >= 12 => mw_op(env, m, inp, qp),
        13 if act >> 4 >= 10 => dm_op(env, m, inp),
        13 => {
            ah(env, m, inp);
        }
        14 if act >> 4 >= 12 && !m.mrs.is_empty() => rereg(env, m, inp),
        14 if act >> 4 == 11 => gid_table(env, inp),
        14 => {
            // A region over bytes of the registered part of the buffer, any access flags.
            let off = usize::from(inp.u16()) % MR_END;
            let len = match inp.u8() % 4 {
                0 => 0,
                _ => usize::from(inp.u16()) % (MR_END - off + 1),
            };
            let access = match inp.u8() % 4 {
                0 => inp.int(),
                _ => c_int::from(inp.u8() % 16),
            };
            // SAFETY: `len` bytes of our buffer, which outlives every region of the input.
            let mr = unsafe {
                let base = env.buf.as_mut_ptr().add(off);
                ibv_reg_mr(env.pd, base as *mut c_void, len, access)
            };
            if !mr.is_null() {
                m.mrs.push(mr);
            }
        }
        _ => {
            // Destroy an object of the input (the QP's CQ may be in use: EBUSY).
            let k = inp.u8();
            // SAFETY: objects of ours, each destroyed once (taken out of the list first).
            unsafe {
                match k % 4 {
                    0 if !m.qps.is_empty() => {
                        let q = m.qps.remove(usize::from(k >> 2) % m.qps.len());
                        destroy_qp(env, q);
                    }
                    1 if !m.cqs.is_empty() => {
                        let i = usize::from(k >> 2) % m.cqs.len();
                        if ibv_destroy_cq(m.cqs[i]) == 0 {
                            m.cqs.remove(i);
                        }
                    }
                    2 if !m.ahs.is_empty() => {
                        let a = m.ahs.remove(usize::from(k >> 2) % m.ahs.len());
                        assert_eq!(ibv_destroy_ah(a), 0, "ibv_destroy_ah");
                    }
                    _ if !m.mrs.is_empty() => {
                        let r = m.mrs.remove(usize::from(k >> 2) % m.mrs.len());
                        assert_eq!(ibv_dereg_mr(r), 0, "ibv_dereg_mr");
                    }
                    _ => {}
                }
            }
        }
    }
}

/// A memory window's bind information read from the input: one of the shared regions (the
/// other PD's too) or NULL, an address inside it or anywhere, any length and rights.
fn bind_info(env: &Env, inp: &mut Input) -> ibv_mw_bind_info {
    let mr = match inp.u8() % 8 {
        0..=4 => env.mr,
        5 => env.mr_ro,
        6 => env.mr_other,
        _ => null_mut(),
    };
    // SAFETY: regions of ours, or NULL.
    let base = unsafe { mr.as_ref() }.map_or(0, |r| r.addr as u64);
    let k = inp.u8();
    ibv_mw_bind_info {
        mr,
        addr: match k % 4 {
            0 => inp.u64(),
            _ => base + u64::from(inp.u16()) % (MR_END as u64 / 2),
        },
        length: match (k >> 2) % 4 {
            0 => 0,
            1 => inp.u64(),
            _ => u64::from(inp.u16()),
        },
        mw_access_flags: match (k >> 4) % 4 {
            0 => inp.u32(),
            _ => u32::from(inp.u8() % 64),
        },
    }
}

/// A device memory call: `ibv_alloc_dm` of any length, alignment and mask, a copy in or out
/// at any offset and length (from or into a buffer of that length), a region over any range
/// of it with any rights (kept with the input's regions), or `ibv_free_dm` (EBUSY while a
/// region is over it).
fn dm_op(env: &mut Env, m: &mut Made, inp: &mut Input) {
    let k = inp.u8();
    // SAFETY: the context's own operations on objects of ours; the copies' host buffer holds
    // the length they are given.
    unsafe {
        let v = &crate::verbs::ctx(env.ctx).v;
        match k % 4 {
            0 => {
                let mut a = ibv_alloc_dm_attr {
                    length: match inp.u8() % 4 {
                        0 => inp.u64() as usize,
                        _ => usize::from(inp.u16()),
                    },
                    log_align_req: u32::from(inp.u8() % 16),
                    comp_mask: if inp.u8() % 8 == 0 { inp.u32() } else { 0 },
                };
                let dm = (v.alloc_dm.expect("alloc_dm"))(env.ctx, &mut a);
                if !dm.is_null() {
                    m.dms.push(dm);
                }
            }
            1 if !m.dms.is_empty() => {
                let dm = m.dms[usize::from(k >> 2) % m.dms.len()];
                let off = u64::from(inp.u16());
                let len = usize::from(inp.u16());
                let mut host = vec![0x5au8; len];
                let rc = if inp.u8() % 2 == 0 {
                    ((*dm).memcpy_to_dm.expect("memcpy_to_dm"))(dm, off, host.as_ptr().cast(), len)
                } else {
                    let f = (*dm).memcpy_from_dm.expect("memcpy_from_dm");
                    f(host.as_mut_ptr().cast(), dm, off, len)
                };
                assert!(
                    rc == 0 || rc == EINVAL,
                    "a device memory copy returned {rc}"
                );
            }
            2 if !m.dms.is_empty() => {
                let dm = m.dms[usize::from(k >> 2) % m.dms.len()];
                let access = match inp.u8() % 4 {
                    0 => inp.u32(),
                    _ => u32::from(inp.u8() % 16) | (1 << 5),
                };
                let (off, len) = (u64::from(inp.u16()), usize::from(inp.u16()));
                let mr = (v.reg_dm_mr.expect("reg_dm_mr"))(env.pd, dm, off, len, access);
                if !mr.is_null() {
                    m.mrs.push(mr);
                }
            }
            3 if !m.dms.is_empty() => {
                let i = usize::from(k >> 2) % m.dms.len();
                let rc = (v.free_dm.expect("free_dm"))(m.dms[i]);
                assert!(rc == 0 || rc == libc::EBUSY, "ibv_free_dm returned {rc}");
                if rc == 0 {
                    m.dms.remove(i);
                }
            }
            _ => {}
        }
    }
}

/// A memory window call: `ibv_alloc_mw` of any type, `ibv_dealloc_mw`, or `ibv_bind_mw` (the
/// context's `bind_mw`: any window, QP and bind information).
fn mw_op(env: &mut Env, m: &mut Made, inp: &mut Input, qp: *mut ibv_qp) {
    let k = inp.u8();
    // SAFETY: the context's own operations, on objects of ours (each window deallocated once:
    // taken out of the list first) and our bind request.
    unsafe {
        let ops = &(*env.ctx).ops;
        match k % 4 {
            0 | 1 => {
                let t = match k >> 2 {
                    0..=29 => c_int::from(1 + (k >> 2) % 2),
                    _ => inp.int(),
                };
                let mw = (ops.alloc_mw.expect("alloc_mw"))(env.pd, t);
                if !mw.is_null() {
                    m.mws.push(mw);
                }
            }
            2 if !m.mws.is_empty() => {
                let mw = m.mws.remove(usize::from(k >> 2) % m.mws.len());
                assert_eq!(
                    (ops.dealloc_mw.expect("dealloc_mw"))(mw),
                    0,
                    "ibv_dealloc_mw"
                );
            }
            _ if !m.mws.is_empty() && !qp.is_null() => {
                let mw = m.mws[usize::from(k >> 2) % m.mws.len()];
                let mut b = ibv_mw_bind {
                    wr_id: wr_id(env, m, (*qp).qp_num),
                    send_flags: match inp.u8() % 4 {
                        0 => inp.u32(),
                        _ => 2,
                    },
                    bind_info: bind_info(env, inp),
                };
                let rc = (ops.bind_mw.expect("bind_mw"))(qp, mw, &mut b);
                assert!(rc >= 0, "bind_mw returned {rc}");
                if rc != 0 {
                    env.pending.remove(&b.wr_id);
                }
            }
            _ => {}
        }
    }
}

/// `ibv_rereg_mr` of one of the input's regions with any flags, PD (ours, the other one or
/// NULL), range (NULL, or bytes of the registered part of the buffer) and rights: it returns
/// 0, `IBV_REREG_MR_ERR_INPUT` or `IBV_REREG_MR_ERR_CMD`, and a failed call leaves the region
/// as it was (it stays registered either way, and is deregistered with the input).
fn rereg(env: &mut Env, m: &mut Made, inp: &mut Input) {
    let mr = m.mrs[usize::from(inp.u8()) % m.mrs.len()];
    let flags = match inp.u8() % 4 {
        0 => inp.int(),
        _ => c_int::from(inp.u8() % 8),
    };
    let pd = match inp.u8() % 4 {
        0 => null_mut(),
        1 => env.other_pd,
        _ => env.pd,
    };
    let (addr, len) = match inp.u8() % 4 {
        0 => (null_mut(), usize::from(inp.u16())),
        _ => {
            let off = usize::from(inp.u16()) % MR_END;
            let len = usize::from(inp.u16()) % (MR_END - off + 1);
            // SAFETY: an offset inside our buffer.
            (unsafe { env.buf.as_mut_ptr().add(off) } as *mut c_void, len)
        }
    };
    let access = match inp.u8() % 4 {
        0 => inp.int(),
        1 => 0,
        _ => c_int::from(inp.u8() % 16),
    };
    // SAFETY: a region of ours.
    let before = unsafe { ((*mr).addr, (*mr).length, (*mr).lkey, (*mr).rkey, (*mr).pd) };
    // SAFETY: a region of ours; a PD of ours or NULL; bytes of our buffer, which outlives every
    // region of the input, or NULL.
    let r = unsafe { ibv_rereg_mr(mr, flags, pd, addr, len, access) };
    assert!(matches!(r, 0 | -1 | -4), "ibv_rereg_mr returned {r}");
    if r != 0 {
        // SAFETY: as above.
        let after = unsafe { ((*mr).addr, (*mr).length, (*mr).lkey, (*mr).rkey, (*mr).pd) };
        assert!(before == after, "a failed ibv_rereg_mr changed the region");
    }
}

/// `ibv_query_gid_table` into an array of any length and entry size: `-EINVAL` or at most
/// as many entries as asked, each naming port 1.
fn gid_table(env: &mut Env, inp: &mut Input) {
    let max = usize::from(inp.u8() % 8);
    let size = match inp.u8() % 4 {
        0 => usize::from(inp.u8() % 40),
        _ => std::mem::size_of::<ibv_gid_entry>() + 4 * usize::from(inp.u8() % 3),
    };
    let mut buf = vec![0u8; max * size.max(1) + 1];
    let entries = if max == 0 && inp.u8() % 2 == 0 {
        null_mut()
    } else {
        buf.as_mut_ptr() as *mut ibv_gid_entry
    };
    // SAFETY: our context; an array of `max` entries of `size` bytes (or NULL with none).
    let n = unsafe { _ibv_query_gid_table(env.ctx, entries, max, 0, size) };
    assert!(
        n == -(EINVAL as isize) || (0..=max as isize).contains(&n),
        "{n} entries"
    );
    for i in 0..n.max(0) as usize {
        // SAFETY: an entry the call wrote, inside `buf`.
        let e = unsafe { (buf.as_ptr().add(i * size) as *const ibv_gid_entry).read_unaligned() };
        assert_eq!(e.port_num, 1, "entry {i}");
    }
    assert_eq!(buf[max * size.max(1)], 0, "written past the array");
}

/// Move the input's QPs to the error state (their work requests flush), poll the shared CQ,
/// destroy what the input made (QPs first, then what they used), drain the shared CQ, and
/// check the guard bytes.
fn teardown(env: &mut Env, m: &mut Made) {
    let cq = env.cq;
    for _ in 0..4 {
        poll(env, m, cq, 64);
    }
    for &q in &m.qps {
        let mut a = zero_attr();
        a.qp_state = 6;
        // SAFETY: a QP of ours and our attribute struct.
        unsafe { ibv_modify_qp(q, &mut a, bits(M::STATE)) };
    }
    while poll(env, m, cq, 64) > 0 {}
    // SAFETY: objects of ours, each destroyed once; QPs before the CQs and SRQs they use.
    unsafe {
        for q in std::mem::take(&mut m.qps) {
            destroy_qp(env, q);
        }
        for s in m.srqs.drain(..) {
            assert_eq!(ibv_destroy_srq(s), 0, "ibv_destroy_srq at the end");
        }
        let v = &crate::verbs::ctx(env.ctx).v;
        for x in m.xrcds.drain(..) {
            assert_eq!(
                (v.close_xrcd.expect("close_xrcd"))(x),
                0,
                "ibv_close_xrcd at the end"
            );
        }
        for c in m.cqs.drain(..) {
            assert_eq!(ibv_destroy_cq(c), 0, "ibv_destroy_cq at the end");
        }
        for a in m.ahs.drain(..) {
            assert_eq!(ibv_destroy_ah(a), 0, "ibv_destroy_ah at the end");
        }
        for r in m.mrs.drain(..) {
            assert_eq!(ibv_dereg_mr(r), 0, "ibv_dereg_mr at the end");
        }
        for w in m.mws.drain(..) {
            let dealloc = (*env.ctx).ops.dealloc_mw.expect("dealloc_mw");
            assert_eq!(dealloc(w), 0, "ibv_dealloc_mw at the end");
        }
        let v = &crate::verbs::ctx(env.ctx).v;
        for d in m.dms.drain(..) {
            assert_eq!(
                (v.free_dm.expect("free_dm"))(d),
                0,
                "ibv_free_dm at the end"
            );
        }
    }
    while poll(env, m, cq, 64) > 0 {}
    // Every object of the input is gone: none of its requests may complete any more.
    env.pending.clear();
    let guard = &env.buf[MR_END..];
    if let Some(i) = guard.iter().position(|&b| b != GUARD) {
        panic!(
            "byte {} of the application's buffer, in no memory region, was written",
            MR_END + i
        );
    }
}
