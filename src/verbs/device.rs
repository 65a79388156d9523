//! The device: the verbs (`alloc_pd`, `reg_mr`, `create_cq`, `create_qp`, `modify_qp`,
//! `post_send`, `post_recv`, `poll_cq`, ...) and the sans-IO engine that runs every QP.
//!
//! # The sans-IO contract
//!
//! A `Device` never reads a clock, opens a socket or spawns a thread. Its driver (the
//! simulator, the runtime, a test) calls, in any order:
//! - [`Device::handle_frame`]`(now, frame)` for every received Ethernet frame;
//! - [`Device::poll_transmit`]`(now, buf)` until it returns `None`, putting each frame it
//!   writes on the wire;
//! - [`Device::poll_timeout`]`()` to learn when to call [`Device::handle_timeout`]`(now)`.
//!
//! Verbs calls (`post_send`, `modify_qp`, ...) only queue work; packets leave on the next
//! `poll_transmit`. Completions are read with [`Device::poll_cq`].

use crate::ib::attr::check_modify_qp;
use crate::ib::counters::{DeviceCounters, QpCounters};
use crate::ib::cq::{Cq, CqRing, NotifyMode};
use crate::ib::mr::{gather, LKey, MemoryRegion, MrShared, MrTable, Pd};
use crate::ib::path::{gid_of, Path};
use crate::ib::wc::{WcStatus, WorkCompletion};
use crate::ib::wqe::{RecvWqe, SendWqe};
use crate::ib::wr::{RecvWr, SendFlags, SendWr};
use crate::ib::{
    AccessFlags, Ctx, KeyMap, ModifyQpError, QpAttr, QpAttrMask, QpCap, QpState, QpType,
};
use crate::keys::KeyGen;
use crate::rc::qp::{PayloadSrc, Qp, Requester, Responder, SqEntry};
use crate::time::Instant;
use crate::wire::{
    self, Ecn, EthernetRepr, FrameRepr, IpRepr, Ipv4Repr, Ipv6Repr, MacAddr, OpFlags, Psn,
    QpNumber, RKey, Transport, UdpRepr, ROCE_V2_PORT,
};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

/// Largest message (IBTA: 2^31 bytes).
pub const MAX_MSG: u64 = 1 << 31;

/// How a device is set up.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// The port's MAC address.
    pub mac: MacAddr,
    /// The GID table, by index: each entry an IP address (IPv4 entries are the IPv4-mapped
    /// GIDs `::ffff:a.b.c.d`, as Linux numbers them).
    pub gids: Vec<IpAddr>,
    /// Seed for keys and other choices. `None`: unpredictable (from the OS).
    pub seed: Option<u64>,
    /// Compute the UDP checksum of IPv6 packets (RFC 8200 requires one; rxe sends 0).
    pub ipv6_udp_checksum: bool,
    /// Limits.
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_inline: u32,
    pub max_cqe: u32,
    /// Most unacknowledged packets per QP (the go-back-N window).
    pub max_inflight: u32,
    /// Congestion control of every QP's transmissions (default: none, line rate, unpaced).
    /// With DCQCN, data packets are sent ECN-capable (ECT(0)) and paced at the QP's rate.
    pub cc: crate::cc::CcConfig,
    /// The port's line rate in bits per second (DCQCN's highest rate).
    pub line_rate_bps: u64,
    /// The notification point: at most one CNP per QP per this interval for CE-marked packets
    /// received (ConnectX: 4 µs; the DCQCN paper: 50 µs). `None`: never send CNPs.
    pub cnp_interval: Option<crate::time::Duration>,
    /// Delayed ACK: hold a lone ACK up to this long so that it follows the QP's next request
    /// packet instead of going first (a ping-pong's reply leaves one transmission earlier;
    /// fewer ACKs). `None` (default): every ACK goes out in the engine round that made it.
    pub ack_delay: Option<crate::time::Duration>,
}

impl DeviceConfig {
    /// A device with one IPv4 address.
    pub fn new(mac: MacAddr, ip: IpAddr) -> Self {
        DeviceConfig {
            mac,
            gids: vec![ip],
            seed: None,
            ipv6_udp_checksum: true,
            max_qp: 1 << 20,
            max_qp_wr: 1 << 15,
            max_sge: 32,
            max_inline: 512,
            max_cqe: 1 << 22,
            max_inflight: crate::rc::qp::DEFAULT_MAX_INFLIGHT,
            cc: crate::cc::CcConfig::None,
            line_rate_bps: 100_000_000_000,
            cnp_interval: Some(crate::time::Duration::from_micros(4)),
            ack_delay: None,
        }
    }
    /// Use a fixed seed (reproducible keys).
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
}

/// `struct ibv_qp_init_attr` for an RC QP.
#[derive(Clone, Copy, Debug)]
pub struct QpInitAttr {
    pub pd: Pd,
    pub send_cq: Cq,
    pub recv_cq: Cq,
    pub cap: QpCap,
    /// Every send WR generates a completion, signaled or not.
    pub sq_sig_all: bool,
}

/// Errors a verb returns synchronously (what libibverbs returns as an errno).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerbsError {
    #[error("no such QP {0}")]
    NoSuchQp(QpNumber),
    #[error("no such CQ")]
    NoSuchCq,
    #[error("no such protection domain")]
    NoSuchPd,
    #[error("no such memory region")]
    NoSuchMr,
    #[error("QP is in state {0}, which does not accept this")]
    InvalidState(QpState),
    #[error("modify_qp: {0}")]
    Modify(#[from] ModifyQpError),
    #[error("queue full")]
    QueueFull,
    #[error("too many scatter/gather entries ({0})")]
    TooManySge(usize),
    #[error("inline data of {0} bytes exceeds max_inline_data")]
    InlineTooLarge(u64),
    #[error("message length {0} exceeds 2^31 bytes")]
    MessageTooLong(u64),
    #[error("atomic operations take exactly one 8-byte scatter/gather entry")]
    BadAtomicSge,
    #[error("address vector: {0}")]
    BadAddressVector(&'static str),
    #[error("resource limit reached: {0}")]
    NoResources(&'static str),
    #[error("invalid capability: {0}")]
    BadCap(&'static str),
    #[error("resource busy: {0}")]
    Busy(&'static str),
}

/// A software RNIC.
pub struct Device {
    cfg: DeviceConfig,
    keys: KeyGen,
    next_pd: u32,
    pds: Vec<u32>,
    mrs: MrTable,
    cqs: Vec<Option<CqRing>>,
    qps: KeyMap<Box<Qp>>,
    next_qpn: u32,
    ready: VecDeque<u32>,
    timers: BinaryHeap<Reverse<(Instant, u32)>>,
    /// QPs touched since the last `drain_touched`.
    touched: Vec<u32>,
    counters: DeviceCounters,
    ip_id: u16,
}

impl Device {
    pub fn new(cfg: DeviceConfig) -> Self {
        Device {
            keys: KeyGen::new(cfg.seed),
            cfg,
            next_pd: 1,
            pds: Vec::new(),
            mrs: MrTable::default(),
            cqs: Vec::new(),
            qps: KeyMap::default(),
            next_qpn: 0x11,
            ready: VecDeque::new(),
            timers: BinaryHeap::new(),
            touched: Vec::new(),
            counters: DeviceCounters::default(),
            ip_id: 0,
        }
    }

    pub fn config(&self) -> &DeviceConfig {
        &self.cfg
    }

    /// The GID at `index`.
    pub fn gid(&self, index: usize) -> Option<[u8; 16]> {
        self.cfg.gids.get(index).map(|ip| gid_of(*ip))
    }

    // ---- protection domains and memory regions -------------------------------------------

    pub fn alloc_pd(&mut self) -> Pd {
        let id = self.next_pd;
        self.next_pd += 1;
        self.pds.push(id);
        Pd(id)
    }

    fn new_key(&mut self) -> u32 {
        // 24 random index bits and an 8-bit random tag: never sequential, never reused while
        // the MR lives, never 0.
        let mrs = &self.mrs;
        self.keys.mr_key(|k| mrs.contains_key(k))
    }

    /// Register `len` bytes of memory (owned by the region: see [`MemoryRegion`]).
    pub fn reg_mr(
        &mut self,
        pd: Pd,
        len: usize,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        if !self.pds.contains(&pd.0) {
            return Err(VerbsError::NoSuchPd);
        }
        // IBTA 10.6.3.1: remote write or atomic access needs local write.
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(VerbsError::BadCap(
                "REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE",
            ));
        }
        let lkey = self.new_key();
        let rkey = loop {
            let k = self.new_key();
            if k != lkey {
                break k;
            }
        };
        // A page-aligned virtual address in the style of a user mapping.
        let va = 0x0000_7f00_0000_0000 | ((self.keys.next_u64() & 0x00ff_ffff) << 16);
        let mr = Arc::new(MrShared::new(LKey(lkey), RKey(rkey), pd, access, va, len));
        self.mrs.insert(mr.clone());
        Ok(MemoryRegion(mr))
    }

    /// Deregister: the keys stop working at once (the memory lives while handles remain).
    pub fn dereg_mr(&mut self, mr: &MemoryRegion) -> Result<(), VerbsError> {
        let m = self.mrs.remove(mr.lkey()).ok_or(VerbsError::NoSuchMr)?;
        m.invalidate_rkey();
        Ok(())
    }

    // ---- completion queues -------------------------------------------------------------

    pub fn create_cq(&mut self, depth: usize) -> Result<Cq, VerbsError> {
        if depth == 0 || depth > self.cfg.max_cqe as usize {
            return Err(VerbsError::BadCap("CQ depth"));
        }
        self.cqs.push(Some(CqRing::new(depth)));
        Ok(Cq((self.cqs.len() - 1) as u32))
    }

    fn cq_mut(&mut self, cq: Cq) -> Result<&mut CqRing, VerbsError> {
        self.cqs
            .get_mut(cq.0 as usize)
            .and_then(|c| c.as_mut())
            .ok_or(VerbsError::NoSuchCq)
    }

    /// Move up to `max` completions into `out`; returns how many.
    pub fn poll_cq(
        &mut self,
        cq: Cq,
        out: &mut Vec<WorkCompletion>,
        max: usize,
    ) -> Result<usize, VerbsError> {
        Ok(self.cq_mut(cq)?.poll(out, max))
    }

    /// Completions waiting in the CQ.
    pub fn cq_len(&self, cq: Cq) -> usize {
        self.cqs
            .get(cq.0 as usize)
            .and_then(|c| c.as_ref())
            .map_or(0, |c| c.len())
    }

    /// Arm the CQ's notification (`ibv_req_notify_cq`).
    pub fn req_notify_cq(&mut self, cq: Cq, mode: NotifyMode) -> Result<(), VerbsError> {
        self.cq_mut(cq)?.arm(mode);
        Ok(())
    }

    /// Consume one completion event if one fired (`ibv_get_cq_event`, non-blocking).
    pub fn get_cq_event(&mut self, cq: Cq) -> Result<bool, VerbsError> {
        Ok(self.cq_mut(cq)?.take_event())
    }

    // ---- queue pairs ------------------------------------------------------------------

    pub fn create_qp(&mut self, init: QpInitAttr) -> Result<QpNumber, VerbsError> {
        if !self.pds.contains(&init.pd.0) {
            return Err(VerbsError::NoSuchPd);
        }
        for cq in [init.send_cq, init.recv_cq] {
            self.cq_mut(cq)?;
        }
        let c = init.cap;
        if c.max_send_wr > self.cfg.max_qp_wr || c.max_recv_wr > self.cfg.max_qp_wr {
            return Err(VerbsError::BadCap("max_send_wr/max_recv_wr"));
        }
        if c.max_send_sge > self.cfg.max_sge || c.max_recv_sge > self.cfg.max_sge {
            return Err(VerbsError::BadCap("max_send_sge/max_recv_sge"));
        }
        if c.max_inline_data > self.cfg.max_inline {
            return Err(VerbsError::BadCap("max_inline_data"));
        }
        if self.qps.len() as u32 >= self.cfg.max_qp {
            return Err(VerbsError::NoResources("max_qp"));
        }
        let mut qpn = self.next_qpn;
        while self.qps.contains_key(&qpn) || qpn < 0x11 {
            qpn = (qpn + 1) & QpNumber::MASK;
        }
        self.next_qpn = (qpn + 1) & QpNumber::MASK;
        let qp = Qp {
            num: QpNumber::new(qpn),
            pd: init.pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            sq_sig_all: init.sq_sig_all,
            cap: c,
            state: QpState::Reset,
            attr: QpAttr {
                cap: c,
                ..QpAttr::default()
            },
            path: None,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            req: Requester {
                max_inflight: self.cfg.max_inflight.max(1),
                ..Requester::default()
            },
            resp: Responder::default(),
            counters: QpCounters::default(),
            in_ready: false,
            timer_armed: None,
            sq_retired: 0,
            rq_retired: 0,
            touched: false,
            cc: self.cfg.cc.build(self.cfg.line_rate_bps),
            pacer: match self.cfg.cc {
                crate::cc::CcConfig::None => crate::cc::Pacer::unlimited(),
                // A burst of two full frames keeps the pacer accurate without stalling batches.
                _ => crate::cc::Pacer::new(self.cfg.line_rate_bps, 2 * 4200),
            },
            pace_at: None,
            ack_hold: None,
            np: self
                .cfg
                .cnp_interval
                .map(crate::cc::dcqcn::NotificationPoint::new),
            cnp_due: false,
        };
        self.qps.insert(qpn, Box::new(qp));
        Ok(QpNumber::new(qpn))
    }

    pub fn destroy_qp(&mut self, qpn: QpNumber) -> Result<(), VerbsError> {
        self.qps
            .remove(&qpn.get())
            .map(|_| ())
            .ok_or(VerbsError::NoSuchQp(qpn))
    }

    /// The QP's state and current attributes (`ibv_query_qp`).
    pub fn query_qp(&self, qpn: QpNumber) -> Result<(QpState, QpAttr), VerbsError> {
        let qp = self.qps.get(&qpn.get()).ok_or(VerbsError::NoSuchQp(qpn))?;
        let mut a = qp.attr;
        a.qp_state = qp.state;
        a.cur_qp_state = qp.state;
        Ok((qp.state, a))
    }

    /// `ibv_modify_qp`: the transition table and value checks of [`crate::ib::attr`], then
    /// the attributes in `mask` take effect.
    pub fn modify_qp(
        &mut self,
        qpn: QpNumber,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), VerbsError> {
        let cfg_mac = self.cfg.mac;
        let gids = self.cfg.gids.clone();
        let qp = self
            .qps
            .get_mut(&qpn.get())
            .map(|b| &mut **b)
            .ok_or(VerbsError::NoSuchQp(qpn))?;
        let next = check_modify_qp(QpType::Rc, qp.state, attr, mask)?;
        let path = if mask.contains(QpAttrMask::AV) {
            let dqpn = if mask.contains(QpAttrMask::DEST_QPN) {
                attr.dest_qp_num
            } else {
                qp.attr.dest_qp_num
            };
            Some(
                Path::resolve(&attr.ah_attr, &gids, cfg_mac, qpn.get(), dqpn)
                    .map_err(VerbsError::BadAddressVector)?,
            )
        } else {
            None
        };
        // Apply the attributes named in the mask.
        let a = &mut qp.attr;
        macro_rules! set { ($($bit:ident => $f:ident),*) => { $( if mask.contains(QpAttrMask::$bit) { a.$f = attr.$f; } )* } }
        set!(ACCESS_FLAGS => qp_access_flags, PKEY_INDEX => pkey_index, PORT => port_num, QKEY => qkey,
             AV => ah_attr, PATH_MTU => path_mtu, TIMEOUT => timeout, RETRY_CNT => retry_cnt,
             RNR_RETRY => rnr_retry, RQ_PSN => rq_psn, MAX_QP_RD_ATOMIC => max_rd_atomic,
             MIN_RNR_TIMER => min_rnr_timer, SQ_PSN => sq_psn, MAX_DEST_RD_ATOMIC => max_dest_rd_atomic,
             DEST_QPN => dest_qp_num, EN_SQD_ASYNC_NOTIFY => en_sqd_async_notify);
        if let Some(p) = path {
            qp.path = Some(p);
        }
        if mask.contains(QpAttrMask::RQ_PSN) {
            qp.resp.epsn = Psn::new(attr.rq_psn);
        }
        if mask.contains(QpAttrMask::SQ_PSN) {
            let p = Psn::new(attr.sq_psn);
            qp.req.next_psn = p;
            qp.req.una = p;
            qp.req.send_psn = p;
            qp.req.hwm = p;
        }
        if mask.contains(QpAttrMask::RETRY_CNT) {
            qp.req.retry_left = attr.retry_cnt;
        }
        if mask.contains(QpAttrMask::RNR_RETRY) {
            qp.req.rnr_left = attr.rnr_retry;
        }
        let prev = qp.state;
        match next {
            QpState::Err if prev != QpState::Err => {
                let mut ctx = Ctx {
                    now: Instant::ZERO,
                    mrs: &self.mrs,
                    cqs: &mut self.cqs,
                    dev: &mut self.counters,
                };
                qp.enter_error(&mut ctx);
            }
            QpState::Reset => {
                // Back to a fresh QP: queues emptied without completions (as ibv does).
                qp.sq_retired += qp.sq.len() as u64;
                qp.rq_retired += qp.rq.len() as u64;
                qp.sq.clear();
                qp.rq.clear();
                qp.req = Requester {
                    max_inflight: qp.req.max_inflight,
                    ..Requester::default()
                };
                qp.resp = Responder::default();
                qp.path = None;
                qp.attr = QpAttr {
                    cap: qp.cap,
                    ..QpAttr::default()
                };
            }
            _ => {}
        }
        qp.state = next;
        self.schedule(qpn.get());
        Ok(())
    }

    // ---- work requests -----------------------------------------------------------------

    /// `ibv_post_send`.
    pub fn post_send(&mut self, qpn: QpNumber, wr: SendWr) -> Result<(), VerbsError> {
        let qp = self
            .qps
            .get_mut(&qpn.get())
            .map(|b| &mut **b)
            .ok_or(VerbsError::NoSuchQp(qpn))?;
        if matches!(qp.state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(VerbsError::InvalidState(qp.state));
        }
        if qp.sq.len() >= qp.cap.max_send_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        if wr.sg_list.len() > qp.cap.max_send_sge.max(1) as usize {
            return Err(VerbsError::TooManySge(wr.sg_list.len()));
        }
        let len: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        if len > MAX_MSG {
            return Err(VerbsError::MessageTooLong(len));
        }
        if wr.op.is_atomic() && (wr.sg_list.len() != 1 || len != 8) {
            return Err(VerbsError::BadAtomicSge);
        }
        let inline_req =
            wr.flags.contains(SendFlags::INLINE) && (wr.op.is_send() || wr.op.is_write());
        if inline_req && len > u64::from(qp.cap.max_inline_data) {
            return Err(VerbsError::InlineTooLarge(len));
        }
        let w = SqEntry::new(SendWqe::new(wr, len as u32, inline_req, &self.mrs, qp.pd));
        qp.sq.push_back(w);
        if matches!(qp.state, QpState::Err | QpState::Sqe) {
            let mut ctx = Ctx {
                now: Instant::ZERO,
                mrs: &self.mrs,
                cqs: &mut self.cqs,
                dev: &mut self.counters,
            };
            qp.flush(&mut ctx);
        }
        self.schedule(qpn.get());
        Ok(())
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, qpn: QpNumber, wr: RecvWr) -> Result<(), VerbsError> {
        let qp = self
            .qps
            .get_mut(&qpn.get())
            .map(|b| &mut **b)
            .ok_or(VerbsError::NoSuchQp(qpn))?;
        if qp.state == QpState::Reset {
            return Err(VerbsError::InvalidState(qp.state));
        }
        if qp.rq.len() >= qp.cap.max_recv_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        if wr.sg_list.len() > qp.cap.max_recv_sge.max(1) as usize {
            return Err(VerbsError::TooManySge(wr.sg_list.len()));
        }
        qp.rq.push_back(RecvWqe::new(wr, &self.mrs, qp.pd));
        if qp.state == QpState::Err {
            let mut ctx = Ctx {
                now: Instant::ZERO,
                mrs: &self.mrs,
                cqs: &mut self.cqs,
                dev: &mut self.counters,
            };
            qp.flush(&mut ctx);
        }
        Ok(())
    }

    // ---- counters ---------------------------------------------------------------------

    /// Device counters with QP totals.
    pub fn counters(&self) -> (DeviceCounters, QpCounters) {
        let mut t = QpCounters::default();
        for qp in self.qps.values() {
            t.accumulate(&qp.counters);
        }
        (self.counters, t)
    }

    /// The QP's current sending rate (bits/s) under its congestion control.
    pub fn qp_rate_bps(&self, qpn: QpNumber) -> Option<u64> {
        self.qps.get(&qpn.get()).map(|q| q.cc.rate_bps())
    }

    /// Every QP's congestion-control state at `now`: (QPN, rate in bits/s, α if the
    /// controller has one, CNPs handled, CE-marked packets received), by QPN.
    pub fn cc_snapshot(&self, now: Instant) -> Vec<(QpNumber, u64, Option<f64>, u64, u64)> {
        let mut v: Vec<_> = self
            .qps
            .iter()
            .map(|(&n, q)| {
                (
                    QpNumber::new(n),
                    q.cc.rate_bps(),
                    q.cc.alpha(now),
                    q.counters.cnps_handled,
                    q.counters.ce_rcvd,
                )
            })
            .collect();
        v.sort_by_key(|e| e.0.get());
        v
    }

    pub fn qp_counters(&self, qpn: QpNumber) -> Option<QpCounters> {
        self.qps.get(&qpn.get()).map(|q| q.counters)
    }

    /// Number of QPs.
    pub fn qp_count(&self) -> usize {
        self.qps.len()
    }

    /// Approximate bytes of memory a QP uses (its struct and queue buffers).
    pub fn qp_memory(&self, qpn: QpNumber) -> Option<usize> {
        self.qps.get(&qpn.get()).map(|q| {
            std::mem::size_of::<Qp>()
                + q.sq.capacity() * std::mem::size_of::<SqEntry>()
                + q.rq.capacity() * std::mem::size_of::<RecvWqe>()
                + q.resp.resp_q.capacity() * std::mem::size_of::<crate::rc::qp::RespItem>()
                + q.resp.resources.capacity() * std::mem::size_of::<crate::rc::qp::Resource>()
        })
    }

    /// Visit every QP touched since the last call: its state and how many send and receive
    /// work requests it has retired in total (for a runtime that tracks queue occupancy).
    pub fn drain_touched(&mut self, mut f: impl FnMut(QpNumber, QpState, u64, u64)) {
        for qpn in self.touched.drain(..) {
            if let Some(qp) = self.qps.get_mut(&qpn) {
                qp.touched = false;
                f(qp.num, qp.state, qp.sq_retired, qp.rq_retired);
            }
        }
    }

    /// The send CQ of a QP.
    pub fn send_cq_of(&self, qpn: QpNumber) -> Option<Cq> {
        self.qps.get(&qpn.get()).map(|q| q.send_cq)
    }

    /// Completion queues that hold completions.
    pub fn cq_ids(&self) -> impl Iterator<Item = Cq> + '_ {
        self.cqs
            .iter()
            .enumerate()
            .filter(|(_, c)| c.as_ref().is_some_and(|c| c.len() > 0))
            .map(|(i, _)| Cq(i as u32))
    }

    // ---- the sans-IO engine ------------------------------------------------------------

    /// Put the QP on the transmit list if it has something to send, and (re)arm its timer.
    fn schedule(&mut self, qpn: u32) {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        if !qp.touched {
            qp.touched = true;
            self.touched.push(qpn);
        }
        if !qp.in_ready && qp.has_tx_work() {
            qp.in_ready = true;
            self.ready.push_back(qpn);
        }
        if let Some(t) = qp.next_deadline() {
            if qp.timer_armed.is_none_or(|a| t < a) {
                qp.timer_armed = Some(t);
                self.timers.push(Reverse((t, qpn)));
            }
        }
    }

    /// The next instant `handle_timeout` has work (may be early; never late).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((t, _))| *t)
    }

    /// Run the timers that are due.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&Reverse((t, qpn))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            if qp.timer_armed != Some(t) {
                continue; // stale entry
            }
            qp.timer_armed = None;
            if qp.next_deadline().is_some_and(|d| d <= now) {
                qp.on_cc_timer(now);
                let mut ctx = Ctx {
                    now,
                    mrs: &self.mrs,
                    cqs: &mut self.cqs,
                    dev: &mut self.counters,
                };
                qp.on_timer(&mut ctx);
            }
            self.schedule(qpn);
        }
    }

    /// Receive one Ethernet frame.
    pub fn handle_frame(&mut self, now: Instant, frame: &[u8]) {
        self.counters.rx_frames += 1;
        // Decode once and judge the ICRC in place (parse_frame would move the large parsed
        // value through one more function).
        let p = match wire::packet::decode_frame(frame) {
            Ok(p) if p.icrc_ok() || cfg!(fuzzing) => p,
            Ok(_) => {
                self.counters.icrc_drops += 1;
                return;
            }
            Err(e) => {
                self.count_parse_error(e);
                return;
            }
        };
        if let Some(e) = p.repr.eth {
            // The all-zero MAC is what a socket backend synthesises (the kernel took the real
            // Ethernet header off); it never appears on a real wire.
            if e.dst != self.cfg.mac && e.dst != MacAddr::BROADCAST && e.dst != MacAddr::ZERO {
                self.counters.address_drops += 1;
                return;
            }
        }
        let (src, dst, ecn) = (p.repr.ip.src(), p.repr.ip.dst(), p.repr.ip.ecn());
        self.handle_roce(now, src, dst, ecn, &p.repr.roce, p.payload);
    }

    fn count_parse_error(&mut self, e: wire::Error) {
        match e {
            wire::Error::BadIcrc { .. } => self.counters.icrc_drops += 1,
            wire::Error::NotRoceV2Port(_) | wire::Error::NotUdp(_) | wire::Error::NotIp(_) => {
                self.counters.not_roce += 1
            }
            _ => self.counters.malformed_drops += 1,
        }
    }

    /// Receive one already-parsed RoCE packet (for backends that see only the UDP payload).
    pub fn handle_roce(
        &mut self,
        now: Instant,
        src: IpAddr,
        dst: IpAddr,
        ecn: Ecn,
        r: &wire::RoceRepr,
        payload: &[u8],
    ) {
        if !self.cfg.gids.contains(&dst) {
            self.counters.address_drops += 1;
            return;
        }
        let b = &r.bth;
        if b.tver != 0 || (b.pkey.0 & 0x7fff) != 0x7fff {
            self.counters.header_drops += 1;
            return;
        }
        if b.opcode == wire::Opcode::CNP {
            // The reaction point: a CNP names the QP whose packets were marked (its DestQP is
            // our QPN, as the peer's notification point addresses it).
            self.counters.cnps_rcvd += 1;
            let qpn = b.dest_qp.get();
            let Some(qp) = self.qps.get_mut(&qpn) else {
                self.counters.unknown_qp_drops += 1;
                return;
            };
            if qp.path.is_none_or(|p| p.dst_ip != src) {
                self.counters.address_drops += 1;
                return;
            }
            qp.cc.on_cnp(now);
            qp.sync_rate(now);
            qp.counters.cnps_handled += 1;
            self.schedule(qpn);
            return;
        }
        if b.opcode.transport() != Transport::Rc {
            self.counters.header_drops += 1;
            return;
        }
        let qpn = b.dest_qp.get();
        let Some(qp) = self.qps.get_mut(&qpn) else {
            self.counters.unknown_qp_drops += 1;
            return;
        };
        if qp.path.is_none_or(|p| p.dst_ip != src) {
            self.counters.address_drops += 1;
            return;
        }
        qp.counters.rx_packets += 1;
        qp.counters.rx_bytes += payload.len() as u64;
        if ecn == Ecn::Ce {
            // The notification point: a congested path; CNPs to the sender, spaced.
            qp.counters.ce_rcvd += 1;
            if qp.np.as_mut().is_some_and(|np| np.on_ce(now)) {
                qp.cnp_due = true;
            }
        }
        let mut ctx = Ctx {
            now,
            mrs: &self.mrs,
            cqs: &mut self.cqs,
            dev: &mut self.counters,
        };
        if b.opcode.is(OpFlags::RESPONSE) {
            qp.on_response(&mut ctx, r, payload);
        } else {
            qp.on_request(&mut ctx, r, payload);
            if let Some(d) = self.cfg.ack_delay {
                qp.hold_ack(now, d);
            }
        }
        self.schedule(qpn);
    }

    /// Write the next frame to send into `buf` (at least MTU + 100 bytes); returns its length.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        while let Some(qpn) = self.ready.pop_front() {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            qp.in_ready = false;
            let mut ctx = Ctx {
                now,
                mrs: &self.mrs,
                cqs: &mut self.cqs,
                dev: &mut self.counters,
            };
            // What goes next: a CNP owed to the peer (never paced), an ACK/NAK/ATOMIC ACK (not
            // paced), or data — a READ response or a request — paced at the QP's rate.
            let mtu_frame = qp.mtu() as usize + 100;
            let front_is_data = matches!(
                qp.resp.resp_q.front(),
                Some(crate::rc::qp::RespItem::Read { .. })
            );
            let held = qp.ack_held(now);
            let (desc, kind) = if qp.cnp_due && qp.path.is_some() {
                qp.cnp_due = false;
                let mut bth = wire::BthRepr::new(
                    wire::Opcode::CNP,
                    QpNumber::new(qp.attr.dest_qp_num),
                    Psn::new(0),
                );
                bth.becn = true;
                let repr = wire::RoceRepr::new(bth, wire::ExtRepr::default(), 0);
                (
                    Some(crate::rc::qp::TxDesc {
                        repr,
                        payload: PayloadSrc::None,
                    }),
                    TxKind::Cnp,
                )
            } else if !qp.resp.resp_q.is_empty() && !front_is_data && !held {
                (qp.next_response_packet(), TxKind::Control)
            } else if (front_is_data || qp.requester_ready()) && qp.paced_out(now, mtu_frame) {
                (None, TxKind::Data)
            } else {
                // A held ACK waits behind the request (it is released once that is sent).
                let resp = if held {
                    None
                } else {
                    qp.next_response_packet()
                };
                let d = match resp {
                    Some(d) => Some(d),
                    None => qp.next_request_packet(&mut ctx),
                };
                (d, TxKind::Data)
            };
            let out = match (desc, qp.path) {
                (Some(d), Some(path)) => {
                    // CNPs as a ConnectX sends them (roce-facts.md): DSCP 48, ECT(0), UDP source
                    // port 0. Data is ECN-capable when congestion control is on.
                    let (dscp, ecn, sport) = match kind {
                        TxKind::Cnp => (48, Ecn::Ect0, 0),
                        TxKind::Data if !matches!(self.cfg.cc, crate::cc::CcConfig::None) => {
                            (path.dscp, Ecn::Ect0, path.udp_sport)
                        }
                        _ => (path.dscp, path.ecn, path.udp_sport),
                    };
                    let ip = match (path.src_ip, path.dst_ip) {
                        (IpAddr::V4(s), IpAddr::V4(t)) => {
                            self.ip_id = self.ip_id.wrapping_add(1);
                            IpRepr::V4(Ipv4Repr {
                                src: s,
                                dst: t,
                                dscp,
                                ecn,
                                ident: self.ip_id,
                                dont_frag: true,
                                ttl: path.hop_limit,
                            })
                        }
                        (s, t) => IpRepr::V6(Ipv6Repr {
                            src: v6(s),
                            dst: v6(t),
                            dscp,
                            ecn,
                            flow_label: path.flow_label,
                            hop_limit: path.hop_limit,
                        }),
                    };
                    let f = FrameRepr {
                        eth: Some(EthernetRepr {
                            dst: path.dst_mac,
                            src: path.src_mac,
                            vlan: None,
                            ethertype: 0,
                        }),
                        ip,
                        udp: UdpRepr {
                            src_port: sport,
                            dst_port: ROCE_V2_PORT,
                            checksum: 0,
                        },
                        roce: d.repr,
                    };
                    let mrs = &self.mrs;
                    let sq = &qp.sq;
                    let r = f.emit_with(buf, |dst| match &d.payload {
                        PayloadSrc::None => Ok(()),
                        PayloadSrc::Mr { mr, off } => {
                            dst.copy_from_slice(&mr.bytes()[*off..*off + dst.len()]);
                            Ok(())
                        }
                        PayloadSrc::Wqe { idx, off } => {
                            let w = &sq[*idx].wqe;
                            match &w.inline {
                                Some(data) => {
                                    dst.copy_from_slice(
                                        &data[*off as usize..*off as usize + dst.len()],
                                    );
                                    Ok(())
                                }
                                None => gather(mrs, &w.sges, u64::from(*off), dst)
                                    .map_err(|_| wire::Error::FieldOverflow("local SGE")),
                            }
                        }
                    });
                    match r {
                        Ok(n) => {
                            if let IpRepr::V6(_) = f.ip {
                                if self.cfg.ipv6_udp_checksum {
                                    wire::udp::fill_checksum(
                                        path.src_ip,
                                        path.dst_ip,
                                        &mut buf[14 + 40..n],
                                    );
                                }
                            }
                            qp.counters.tx_packets += 1;
                            qp.counters.tx_bytes += f.roce.payload_len as u64;
                            qp.ack_hold = None;
                            match kind {
                                TxKind::Cnp => qp.counters.cnps_sent += 1,
                                TxKind::Data => {
                                    qp.pacer.on_send(now, n);
                                    qp.cc.on_sent(now, n);
                                    qp.sync_rate(now);
                                }
                                TxKind::Control => {}
                            }
                            Some(n)
                        }
                        Err(_) => {
                            // The memory behind a request vanished (deregistered): a local
                            // protection error on the oldest request.
                            let mut ctx = Ctx {
                                now,
                                mrs: &self.mrs,
                                cqs: &mut self.cqs,
                                dev: &mut self.counters,
                            };
                            qp.complete_send_head(&mut ctx, WcStatus::LocProtErr);
                            qp.enter_error(&mut ctx);
                            None
                        }
                    }
                }
                _ => None,
            };
            self.schedule(qpn);
            if let Some(n) = out {
                self.counters.tx_frames += 1;
                return Some(n);
            }
        }
        None
    }
}

/// What kind of packet `poll_transmit` is building.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TxKind {
    Cnp,
    Control,
    Data,
}

fn v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(v) => v.to_ipv6_mapped(),
        IpAddr::V6(v) => v,
    }
}

/// The far end of an RC connection, as exchanged out of band.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteQp {
    pub qpn: QpNumber,
    pub gid: [u8; 16],
    pub mac: MacAddr,
    /// The peer's starting send PSN (our receive PSN).
    pub psn: u32,
}

/// Connection parameters for [`Device::connect_rc`]. The defaults are perftest's:
/// timeout 14 (≈ 67 ms), retry_cnt 7, rnr_retry 7, min_rnr_timer 12 (0.64 ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcParams {
    pub mtu: crate::ib::Mtu,
    pub access: AccessFlags,
    pub sgid_index: u8,
    /// Our starting send PSN.
    pub local_psn: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    /// IP traffic class (DSCP << 2 | ECN) of our packets.
    pub traffic_class: u8,
}

impl Default for RcParams {
    fn default() -> Self {
        RcParams {
            mtu: crate::ib::Mtu::M1024,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            sgid_index: 0,
            local_psn: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            traffic_class: 0,
        }
    }
}

impl Device {
    /// Move a QP from RESET through INIT and RTR to RTS, connected to `remote`: the three
    /// `modify_qp` calls every RC application makes.
    pub fn connect_rc(
        &mut self,
        qpn: QpNumber,
        remote: &RemoteQp,
        p: &RcParams,
    ) -> Result<(), VerbsError> {
        use QpAttrMask as M;
        let mut a = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: p.access,
            ..QpAttr::default()
        };
        self.modify_qp(
            qpn,
            &a,
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
        )?;
        a.qp_state = QpState::Rtr;
        a.path_mtu = p.mtu;
        a.dest_qp_num = remote.qpn.get();
        a.rq_psn = remote.psn;
        a.max_dest_rd_atomic = p.max_dest_rd_atomic;
        a.min_rnr_timer = p.min_rnr_timer;
        a.ah_attr = crate::ib::AddressVector {
            dgid: remote.gid,
            sgid_index: p.sgid_index,
            hop_limit: 64,
            traffic_class: p.traffic_class,
            flow_label: 0,
            dmac: Some(remote.mac.0),
        };
        self.modify_qp(
            qpn,
            &a,
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
        )?;
        a.qp_state = QpState::Rts;
        a.sq_psn = p.local_psn;
        a.timeout = p.timeout;
        a.retry_cnt = p.retry_cnt;
        a.rnr_retry = p.rnr_retry;
        a.max_rd_atomic = p.max_rd_atomic;
        self.modify_qp(
            qpn,
            &a,
            M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
        )
    }

    /// This end of a QP as a [`RemoteQp`] for the peer.
    pub fn local_end(&self, qpn: QpNumber, sgid_index: usize, psn: u32) -> Option<RemoteQp> {
        Some(RemoteQp {
            qpn,
            gid: self.gid(sgid_index)?,
            mac: self.cfg.mac,
            psn,
        })
    }
}
