//! One UC queue pair: requester, responder and the engine's contract (the same methods as an
//! RC QP's, see `rc/qp.rs`).
//!
//! # The requester
//!
//! A SEND or RDMA WRITE (with immediate) is cut into packets of the path MTU with consecutive
//! PSNs and the UC opcodes (FIRST/MIDDLE/LAST/ONLY), the RETH on the first packet of a WRITE,
//! the immediate data on the last; no AckReq. The request completes when its last packet has
//! left (there is nothing to wait for). A send error (a local protection error, memory gone)
//! completes the request in error, flushes the ones behind it and moves the QP to SQE, from
//! which `modify_qp(SQE → RTS)` resumes (IBTA Vol. 1 §10.3.1). In SQD a message already
//! started is finished; no new one starts.
//!
//! # The responder: IBTA's UC rules, step by step ([`Step`])
//!
//! 1. **PSN.** A packet at the expected PSN goes on. One *ahead* of it means packets were
//!    lost: the message in progress is abandoned (nothing of it is delivered; a SEND's receive
//!    WQE takes the next message) and the responder resumes at the next FIRST or ONLY packet;
//!    the expected PSN follows every packet seen. One *behind* it (in the 2^23 PSNs before,
//!    the duplicate region RC defines) can only be a copy or a late packet of a message already
//!    handled or abandoned: it is dropped without touching the message in progress, so that a
//!    duplicated packet is never delivered twice. (IBTA's UC text treats every unexpected PSN
//!    as loss; the behind-case is ferroce's reading of what no sender can mean.)
//! 2. **Opcode sequence.** A message in progress continues with MIDDLE or LAST of its kind. A
//!    FIRST or ONLY instead abandons it and starts anew (IBTA class D1: "this packet may be the
//!    start of a new message"); anything else abandons it and waits for the next FIRST/ONLY.
//! 3. **Operation valid.** An RDMA WRITE needs the QP's remote write right; otherwise the
//!    message is dropped.
//! 4. **Resources.** A SEND's first packet and a WRITE with immediate's last take a receive
//!    WQE; with none, the message is dropped (UC has no RNR NAK).
//! 5. **Length.** FIRST and MIDDLE carry exactly the path MTU, LAST 1 ..= MTU, ONLY ≤ MTU, and a
//!    message fits its receive buffer or RETH length.
//! 6. **R_Key.** A WRITE's RETH names memory of the QP's PD with remote write, in bounds.
//! 7. **Execute.** Place the data; the last packet completes the receive WQE.
//!
//! A message dropped at steps 3–6 is counted in `msg_drops` and never completes, except that
//! a WQE already taken from a shared receive queue for a malformed message completes with an
//! error status (IBTA class E, as rxe does: it cannot simply go back to a queue other QPs
//! share while it is known to be tied to a bad message). A receive WQE with a local error
//! (bad lkey, memory gone) fails the QP (class A): it completes in error, the QP moves to ERR
//! and `IBV_EVENT_QP_FATAL` is raised.

use crate::ib::counters::QpCounters;
use crate::ib::cq::Cq;
use crate::ib::event::AsyncEvent;
use crate::ib::mr::{gather, scatter, MrShared, MrTable, Pd};
use crate::ib::path::Path;
use crate::ib::srq::Srq;
use crate::ib::tx::{PayloadSrc, PostError, TxDesc, TxKind};
use crate::ib::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
use crate::ib::wq::{QpInit, WorkQueues};
use crate::ib::wqe::{RecvWqe, SendWqe};
use crate::ib::wr::{SendFlags, SendOp};
use crate::ib::{AccessFlags, Ctx, QpAttr, QpAttrMask, QpCap, QpState};
use crate::time::Instant;
use crate::wire::ext::RethRepr;
use crate::wire::{BthRepr, ExtRepr, OpFlags, Opcode, Psn, QpNumber, RoceRepr};
use std::net::IpAddr;
use std::sync::Arc;

/// The UC opcode of a SEND or WRITE packet (IBTA table 38: the RC operation codes in the UC
/// range 0x20..0x2B).
pub(crate) fn uc_opcode(op: &SendOp, first: bool, last: bool) -> Option<Opcode> {
    let rc = match (op, first, last) {
        (SendOp::Send, true, true) => 0x04,
        (SendOp::SendWithImm { .. }, true, true) => 0x05,
        (SendOp::Send | SendOp::SendWithImm { .. }, true, false) => 0x00,
        (SendOp::Send | SendOp::SendWithImm { .. }, false, false) => 0x01,
        (SendOp::Send, false, true) => 0x02,
        (SendOp::SendWithImm { .. }, false, true) => 0x03,
        (SendOp::RdmaWrite { .. }, true, true) => 0x0A,
        (SendOp::RdmaWriteWithImm { .. }, true, true) => 0x0B,
        (SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. }, true, false) => 0x06,
        (SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. }, false, false) => 0x07,
        (SendOp::RdmaWrite { .. }, false, true) => 0x08,
        (SendOp::RdmaWriteWithImm { .. }, false, true) => 0x09,
        _ => return None,
    };
    Some(Opcode(0x20 | rc))
}

/// The responder's steps, in the order a packet goes through them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The PSN against the expected one.
    Psn,
    /// FIRST/MIDDLE/LAST/ONLY against the message in progress.
    OpSequence,
    /// The operation is one the QP takes (WRITE: remote write right).
    OpValid,
    /// A receive WQE where one is needed.
    Resources,
    /// Packet and message lengths.
    Length,
    /// A WRITE's R_Key, rights and bounds.
    RKey,
    /// Placing the data, completing the message.
    Execute,
}

/// How a packet leaves the responder's pipeline early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// Behind the expected PSN: a copy or a late packet, dropped on its own.
    Stale,
    /// Not the start of a message while none is in progress (after a loss, found at the PSN
    /// or the opcode-sequence step): dropped.
    Resync(Step),
    /// The message is dropped at `Step` (counted; a WQE from an SRQ completes with the status).
    Drop(Step, WcStatus),
    /// No receive WQE: the message is dropped.
    NoWqe,
    /// A receive WQE that cannot be used (found at `Step`): the QP fails.
    Fatal(Step, WcStatus),
}

impl Stop {
    /// The step that stopped the packet.
    fn step(self) -> Step {
        match self {
            Stop::Stale => Step::Psn,
            Stop::NoWqe => Step::Resources,
            Stop::Resync(s) | Stop::Drop(s, _) | Stop::Fatal(s, _) => s,
        }
    }
}

/// The message a responder is in the middle of.
#[derive(Debug)]
enum InMsg {
    Send {
        rwqe: RecvWqe,
        off: u64,
    },
    Write {
        mr: Option<Arc<MrShared>>,
        mr_off: usize,
        done: u64,
        dma_len: u64,
    },
}

/// A UC queue pair.
pub(crate) struct Qp {
    q: WorkQueues,
    attr: QpAttr,
    path: Option<Path>,
    /// The PSN of the next packet sent.
    next_psn: Psn,
    /// Bytes of the oldest send request already sent.
    send_off: u32,
    /// The packet last built ends its request.
    built_last: bool,
    /// The expected PSN.
    epsn: Psn,
    in_msg: Option<InMsg>,
    /// After a loss: packets are dropped until a FIRST or ONLY.
    resync: bool,
}

impl Qp {
    /// A new UC QP in the RESET state.
    pub(crate) fn new(num: QpNumber, init: QpInit) -> Qp {
        Qp {
            q: WorkQueues::new(num, init),
            attr: QpAttr {
                cap: init.cap,
                ..QpAttr::default()
            },
            path: None,
            next_psn: Psn::new(0),
            send_off: 0,
            built_last: false,
            epsn: Psn::new(0),
            in_msg: None,
            resync: false,
        }
    }

    // ---- getters ----------------------------------------------------------------------

    pub(crate) fn num(&self) -> QpNumber {
        self.q.num
    }
    pub(crate) fn state(&self) -> QpState {
        self.q.state
    }
    pub(crate) fn attr(&self) -> &QpAttr {
        &self.attr
    }
    pub(crate) fn cap(&self) -> QpCap {
        self.q.init.cap
    }
    pub(crate) fn pd(&self) -> Pd {
        self.q.init.pd
    }
    pub(crate) fn send_cq(&self) -> Cq {
        self.q.init.send_cq
    }
    /// Its receive CQ.
    pub(crate) fn recv_cq(&self) -> Cq {
        self.q.init.recv_cq
    }
    pub(crate) fn srq(&self) -> Option<Srq> {
        self.q.init.srq
    }
    pub(crate) fn counters(&self) -> &QpCounters {
        &self.q.counters
    }
    pub(crate) fn retired(&self) -> (u64, u64) {
        self.q.retired()
    }
    /// The next PSN to send, the same (UC is never acknowledged), and the expected PSN.
    pub(crate) fn psns(&self) -> (Psn, Psn, Psn) {
        (self.next_psn, self.next_psn, self.epsn)
    }
    pub(crate) fn path(&self) -> Option<&Path> {
        self.path.as_ref()
    }
    /// Whether a packet from `src` may be for this QP: it has a path and `src` is its peer.
    pub(crate) fn is_peer(&self, src: IpAddr) -> bool {
        self.path.is_some_and(|p| p.dst_ip == src)
    }
    pub(crate) fn memory(&self) -> usize {
        std::mem::size_of::<Qp>() + self.q.memory()
    }
    fn mtu(&self) -> u32 {
        self.attr.path_mtu.bytes()
    }

    // ---- the verbs ---------------------------------------------------------------------

    /// `ibv_modify_qp`, checked by the device against the UC table; `path` is the resolved
    /// address vector if the mask has one.
    pub(crate) fn modify(
        &mut self,
        ctx: &mut Ctx<'_>,
        attr: &QpAttr,
        mask: QpAttrMask,
        next: QpState,
        path: Option<Path>,
    ) {
        self.attr.apply(attr, mask);
        if let Some(p) = path {
            self.path = Some(p);
        }
        if mask.contains(QpAttrMask::RQ_PSN) {
            self.epsn = Psn::new(attr.rq_psn);
        }
        if mask.contains(QpAttrMask::SQ_PSN) {
            self.next_psn = Psn::new(attr.sq_psn);
        }
        match next {
            QpState::Err if self.q.state != QpState::Err => self.enter_error(ctx, None),
            QpState::Reset => self.reset(),
            _ => {}
        }
        self.set_state(next);
    }

    fn reset(&mut self) {
        self.q.reset();
        self.path = None;
        self.attr = QpAttr {
            cap: self.q.init.cap,
            ..QpAttr::default()
        };
        self.next_psn = Psn::new(0);
        self.send_off = 0;
        self.built_last = false;
        self.epsn = Psn::new(0);
        self.in_msg = None;
        self.resync = false;
    }

    fn set_state(&mut self, next: QpState) {
        self.q.set_state(next, "UC");
    }

    /// The remote QP a completion names.
    fn peer_qp(&self) -> QpNumber {
        QpNumber::new(self.attr.dest_qp_num)
    }

    pub(crate) fn check_post_send(&self) -> Result<(), PostError> {
        self.q.check_post_send()
    }

    /// Queue a send the device checked; in ERR or SQE it is flushed at once.
    pub(crate) fn post_send(&mut self, ctx: &mut Ctx<'_>, wqe: SendWqe) {
        let peer = self.peer_qp();
        self.q.post_send(ctx, wqe, peer);
    }

    pub(crate) fn check_post_recv(&self) -> Result<(), PostError> {
        self.q.check_post_recv()
    }

    pub(crate) fn post_recv(&mut self, ctx: &mut Ctx<'_>, wqe: RecvWqe) {
        self.q.rq.post(wqe);
        if self.q.state == QpState::Err {
            self.flush_rq(ctx);
        }
    }

    // ---- completions and errors ---------------------------------------------------------

    fn complete_send_head(&mut self, ctx: &mut Ctx<'_>, status: WcStatus) {
        self.send_off = 0;
        let peer = self.peer_qp();
        self.q.complete_send_head(ctx, status, peer);
    }

    fn complete_recv(&mut self, ctx: &mut Ctx<'_>, w: &RecvWqe, mut wc: WorkCompletion) {
        wc.wr_id = w.wr_id;
        wc.src_qp = self.peer_qp();
        wc.wc_flags |= WcFlags::GRH;
        self.q.complete_recv(ctx, wc);
    }

    fn recv_error(&mut self, ctx: &mut Ctx<'_>, w: &RecvWqe, status: WcStatus) {
        let wc = WorkCompletion::blank(w.wr_id, status, WcOpcode::Recv, self.q.num);
        self.complete_recv(ctx, w, wc);
    }

    fn flush_rq(&mut self, ctx: &mut Ctx<'_>) {
        if let Some(InMsg::Send { rwqe, .. }) = self.in_msg.take() {
            self.recv_error(ctx, &rwqe, WcStatus::WrFlushErr);
        }
        let peer = self.peer_qp();
        self.q.flush_own_rq(ctx, |wc| {
            wc.src_qp = peer;
            wc.wc_flags |= WcFlags::GRH;
        });
    }

    /// A send failed: it completes with `status`, the requests behind it are flushed, the QP
    /// moves to SQE (receives go on).
    fn send_error(&mut self, ctx: &mut Ctx<'_>, status: WcStatus) {
        self.send_off = 0;
        let peer = self.peer_qp();
        self.q.send_error(ctx, status, peer, "UC");
    }

    fn enter_error(&mut self, ctx: &mut Ctx<'_>, event: Option<AsyncEvent>) {
        self.set_state(QpState::Err);
        self.send_off = 0;
        let peer = self.peer_qp();
        self.q.flush_sq(ctx, peer);
        self.flush_rq(ctx);
        self.q.raise_error_events(ctx, event);
    }

    // ---- the responder ------------------------------------------------------------------

    /// A UC packet for this QP (the device checked address, P_Key, TVer and transport).
    pub(crate) fn handle_packet(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr, payload: &[u8]) {
        self.q.counters.rx_packets += 1;
        self.q.counters.rx_bytes += payload.len() as u64;
        if !matches!(
            self.q.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            self.q.counters.state_drops += 1;
            return;
        }
        if let Err(stop) = self.respond(ctx, r, payload) {
            tracing::trace!(qpn = %self.q.num, psn = %r.bth.psn, step = ?stop.step(), ?stop, "UC packet stopped");
            self.stop(ctx, stop);
        }
    }

    fn respond(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr, payload: &[u8]) -> Result<(), Stop> {
        let f = r.bth.opcode.flags();
        self.check_psn(ctx, r.bth.psn, f)?;
        self.check_op_sequence(ctx, f)?;
        self.check_op_valid(f)?;
        self.check_resources(ctx, f)?;
        self.check_length(f, payload.len())?;
        self.check_rkey(ctx, r, f)?;
        self.execute(ctx, r, payload)
    }

    /// How a packet that left the pipeline is answered: never with a packet (UC has no
    /// responses); counted; a message dropped.
    fn stop(&mut self, ctx: &mut Ctx<'_>, stop: Stop) {
        match stop {
            Stop::Stale => self.q.counters.duplicates += 1,
            Stop::Resync(_) => {}
            Stop::NoWqe => {
                self.q.counters.no_wqe_drops += 1;
                self.drop_message(ctx, None);
            }
            Stop::Drop(_, status) => {
                self.q.counters.msg_drops += 1;
                self.drop_message(ctx, Some(status));
            }
            Stop::Fatal(_, status) => {
                let rwqe = match self.in_msg.take() {
                    Some(InMsg::Send { rwqe, .. }) => Some(rwqe),
                    _ => None,
                };
                if let Some(w) = rwqe {
                    self.recv_error(ctx, &w, status);
                }
                self.enter_error(ctx, Some(AsyncEvent::QpFatal(self.q.num)));
            }
        }
    }

    /// Drop the message this packet belongs to: the rest of it is ignored until the next
    /// FIRST/ONLY. A SEND's receive WQE takes the next message, except one from an SRQ
    /// dropped for a malformed message (`status`), which completes with that status.
    fn drop_message(&mut self, ctx: &mut Ctx<'_>, status: Option<WcStatus>) {
        self.resync = true;
        if let Some(InMsg::Send { rwqe, .. }) = self.in_msg.take() {
            match status {
                Some(s) if self.q.rq.srq().is_some() => self.recv_error(ctx, &rwqe, s),
                _ => self.q.rq.put_back(ctx, rwqe),
            }
        }
    }

    /// Abandon the message in progress after a loss: nothing of it was delivered; its receive
    /// WQE takes the next message.
    fn abandon(&mut self, ctx: &mut Ctx<'_>) {
        match self.in_msg.take() {
            Some(InMsg::Send { rwqe, .. }) => {
                self.q.counters.msg_drops += 1;
                self.q.rq.put_back(ctx, rwqe);
            }
            Some(InMsg::Write { .. }) => self.q.counters.msg_drops += 1,
            None => {}
        }
    }

    /// [`Step::Psn`].
    fn check_psn(&mut self, ctx: &mut Ctx<'_>, p: Psn, f: OpFlags) -> Result<(), Stop> {
        let d = p.diff(self.epsn);
        if d < 0 {
            return Err(Stop::Stale);
        }
        self.epsn = p.next();
        if d > 0 {
            self.q.counters.out_of_sequence += 1;
            self.abandon(ctx);
            self.resync = true;
        }
        if self.resync {
            if !f.contains(OpFlags::FIRST) {
                return Err(Stop::Resync(Step::Psn));
            }
            self.resync = false;
        }
        Ok(())
    }

    /// [`Step::OpSequence`].
    fn check_op_sequence(&mut self, ctx: &mut Ctx<'_>, f: OpFlags) -> Result<(), Stop> {
        let continues = |m: &InMsg| {
            let kind_ok = match m {
                InMsg::Send { .. } => f.contains(OpFlags::SEND),
                InMsg::Write { .. } => f.contains(OpFlags::WRITE),
            };
            kind_ok && !f.contains(OpFlags::FIRST)
        };
        match &self.in_msg {
            Some(m) if continues(m) => Ok(()),
            Some(_) => {
                self.abandon(ctx);
                if f.contains(OpFlags::FIRST) {
                    Ok(())
                } else {
                    self.resync = true;
                    Err(Stop::Resync(Step::OpSequence))
                }
            }
            None if f.contains(OpFlags::FIRST) => Ok(()),
            None => {
                self.q.counters.msg_drops += 1;
                self.resync = !f.contains(OpFlags::LAST);
                Err(Stop::Resync(Step::OpSequence))
            }
        }
    }

    /// [`Step::OpValid`].
    fn check_op_valid(&self, f: OpFlags) -> Result<(), Stop> {
        if f.contains(OpFlags::WRITE)
            && !self
                .attr
                .qp_access_flags
                .contains(AccessFlags::REMOTE_WRITE)
        {
            return Err(Stop::Drop(Step::OpValid, WcStatus::RemInvReqErr));
        }
        Ok(())
    }

    /// [`Step::Resources`]: a SEND's first packet takes its receive WQE here; a WRITE with
    /// immediate takes one at its last packet (in [`Qp::execute`]), checked here.
    fn check_resources(&mut self, ctx: &mut Ctx<'_>, f: OpFlags) -> Result<(), Stop> {
        if f.contains(OpFlags::SEND) && f.contains(OpFlags::FIRST) {
            let w = self.q.rq.take(ctx).ok_or(Stop::NoWqe)?;
            let err = w.local_err;
            self.in_msg = Some(InMsg::Send { rwqe: w, off: 0 });
            if let Some(status) = err {
                return Err(Stop::Fatal(Step::Resources, status));
            }
        }
        Ok(())
    }

    /// [`Step::Length`]: the packet against the path MTU and its place in the message.
    fn check_length(&self, f: OpFlags, len: usize) -> Result<(), Stop> {
        let mtu = self.mtu() as usize;
        let ok = if f.contains(OpFlags::FULL_MTU) {
            len == mtu
        } else if f.contains(OpFlags::LAST) && !f.contains(OpFlags::FIRST) {
            (1..=mtu).contains(&len)
        } else {
            len <= mtu
        };
        if ok {
            Ok(())
        } else {
            Err(Stop::Drop(Step::Length, WcStatus::RemInvReqErr))
        }
    }

    /// [`Step::RKey`]: a WRITE's first packet names memory of our PD with remote write, its
    /// whole DMA length in bounds (none for a zero-length WRITE).
    fn check_rkey(&mut self, ctx: &Ctx<'_>, r: &RoceRepr, f: OpFlags) -> Result<(), Stop> {
        if !(f.contains(OpFlags::WRITE) && f.contains(OpFlags::FIRST)) {
            return Ok(());
        }
        let bad = Stop::Drop(Step::RKey, WcStatus::RemAccessErr);
        let Some(RethRepr { va, rkey, dma_len }) = r.ext.reth else {
            return Err(bad);
        };
        if dma_len > 1 << 31 {
            return Err(Stop::Drop(Step::Length, WcStatus::RemInvReqErr));
        }
        let (mr, mr_off) = if dma_len == 0 {
            (None, 0)
        } else {
            let mr = ctx.mrs.by_rkey(rkey).filter(|m| {
                m.rkey_valid()
                    && m.pd == self.q.init.pd
                    && m.access.contains(AccessFlags::REMOTE_WRITE)
                    && m.bound_qp.is_none_or(|q| q == self.q.num)
            });
            let Some((mr, off)) =
                mr.and_then(|m| m.offset_of(va, u64::from(dma_len)).map(|o| (m, o)))
            else {
                return Err(bad);
            };
            (Some(mr), off)
        };
        self.in_msg = Some(InMsg::Write {
            mr,
            mr_off,
            done: 0,
            dma_len: u64::from(dma_len),
        });
        Ok(())
    }

    /// [`Step::Execute`].
    fn execute(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr, payload: &[u8]) -> Result<(), Stop> {
        let f = r.bth.opcode.flags();
        match &mut self.in_msg {
            Some(InMsg::Send { rwqe, off }) => {
                if *off + payload.len() as u64 > rwqe.len {
                    return Err(Stop::Drop(Step::Execute, WcStatus::RemInvReqErr));
                }
                if let Err(status) = scatter(ctx.mrs, &rwqe.sges, *off, payload) {
                    return Err(Stop::Fatal(Step::Execute, status));
                }
                *off += payload.len() as u64;
            }
            Some(InMsg::Write {
                mr,
                mr_off,
                done,
                dma_len,
            }) => {
                let end = *done + payload.len() as u64;
                if end > *dma_len || (f.contains(OpFlags::LAST) && end != *dma_len) {
                    return Err(Stop::Drop(Step::Execute, WcStatus::RemInvReqErr));
                }
                if let Some(mr) = mr {
                    let at = *mr_off + *done as usize;
                    if !mr.write_at(at, payload) {
                        return Err(Stop::Drop(Step::Execute, WcStatus::RemAccessErr));
                    }
                }
                *done = end;
            }
            None => return Err(Stop::Resync(Step::Execute)),
        }
        if !f.contains(OpFlags::LAST) {
            return Ok(());
        }
        match self.in_msg.take() {
            Some(InMsg::Send { rwqe, off }) => {
                let mut wc = WorkCompletion::blank(
                    rwqe.wr_id,
                    WcStatus::Success,
                    WcOpcode::Recv,
                    self.q.num,
                );
                wc.byte_len = off as u32;
                if let Some(imm) = r.ext.imm {
                    wc.imm_data = Some(imm);
                    wc.wc_flags = WcFlags::WITH_IMM;
                }
                wc.solicited = r.bth.solicited;
                self.complete_recv(ctx, &rwqe, wc);
            }
            Some(InMsg::Write { dma_len, .. }) => {
                if let Some(imm) = r.ext.imm {
                    let Some(w) = self.q.rq.take(ctx) else {
                        return Err(Stop::NoWqe);
                    };
                    if let Some(status) = w.local_err {
                        self.in_msg = Some(InMsg::Send { rwqe: w, off: 0 });
                        return Err(Stop::Fatal(Step::Resources, status));
                    }
                    let mut wc = WorkCompletion::blank(
                        w.wr_id,
                        WcStatus::Success,
                        WcOpcode::RecvRdmaWithImm,
                        self.q.num,
                    );
                    wc.byte_len = dma_len as u32;
                    wc.imm_data = Some(imm);
                    wc.wc_flags = WcFlags::WITH_IMM;
                    wc.solicited = r.bth.solicited;
                    self.complete_recv(ctx, &w, wc);
                }
            }
            None => {}
        }
        Ok(())
    }

    // ---- the requester ------------------------------------------------------------------

    /// Whether the QP sends a packet now: connected, in RTS (or SQD finishing a message it
    /// started), with a request queued.
    pub(crate) fn next_tx(&self, _now: Instant) -> Option<TxKind> {
        self.path.as_ref()?;
        let go = match self.q.state {
            QpState::Rts => true,
            QpState::Sqd => self.send_off > 0,
            _ => false,
        };
        (go && !self.q.sq.is_empty()).then_some(TxKind::Data)
    }

    /// The next packet of the oldest request; `None` if that request fails instead (its error
    /// completion made, the QP in SQE).
    pub(crate) fn build_tx(&mut self, ctx: &mut Ctx<'_>) -> Option<TxDesc> {
        // Memory window binds and local invalidates at the head: executed in queue order
        // (everything before them has left: UC completes a request when its last packet
        // goes), no packet.
        while let Some(op) = self
            .q
            .sq
            .front()
            .filter(|w| w.local_err.is_none() && w.op.is_local() && self.send_off == 0)
            .map(|w| w.op)
        {
            let status = crate::ib::mr::execute_local(ctx.mrs, self.q.init.pd, self.q.num, op);
            if status != WcStatus::Success {
                self.send_error(ctx, status);
                return None;
            }
            self.complete_send_head(ctx, status);
        }
        let w = self.q.sq.front()?;
        if let Some(status) = w.local_err {
            self.send_error(ctx, status);
            return None;
        }
        let off = self.send_off;
        let plen = (w.len - off.min(w.len)).min(self.mtu());
        let first = off == 0;
        let last = off + plen == w.len;
        let Some(opcode) = uc_opcode(&w.op, first, last) else {
            self.send_error(ctx, WcStatus::LocQpOpErr);
            return None;
        };
        let mut bth = BthRepr::new(opcode, QpNumber::new(self.attr.dest_qp_num), self.next_psn);
        let mut ext = ExtRepr::default();
        match w.op {
            SendOp::RdmaWrite { remote_addr, rkey }
            | SendOp::RdmaWriteWithImm {
                remote_addr, rkey, ..
            } if first => {
                ext.reth = Some(RethRepr {
                    va: remote_addr,
                    rkey,
                    dma_len: w.len,
                });
            }
            _ => {}
        }
        if last {
            if let SendOp::SendWithImm { imm } | SendOp::RdmaWriteWithImm { imm, .. } = w.op {
                ext.imm = Some(imm);
            }
            bth.solicited = w.flags.contains(SendFlags::SOLICITED);
        }
        self.next_psn = self.next_psn.next();
        self.send_off = off + plen;
        self.built_last = last;
        Some(TxDesc {
            repr: RoceRepr::new(bth, ext, plen as usize),
            payload: PayloadSrc::Wqe { idx: 0, off },
        })
    }

    /// Copy the payload of the packet [`build_tx`](Self::build_tx) described.
    pub(crate) fn write_payload(
        &self,
        mrs: &MrTable,
        src: &PayloadSrc,
        dst: &mut [u8],
    ) -> Result<(), WcStatus> {
        match src {
            PayloadSrc::Wqe { idx, off } => {
                let w = self.q.sq.get(*idx).ok_or(WcStatus::LocQpOpErr)?;
                match &w.inline {
                    Some(d) => {
                        let o = *off as usize;
                        dst.copy_from_slice(d.get(o..o + dst.len()).ok_or(WcStatus::LocLenErr)?);
                        Ok(())
                    }
                    None => {
                        gather(mrs, &w.sges, u64::from(*off), dst).map_err(|_| WcStatus::LocProtErr)
                    }
                }
            }
            PayloadSrc::None => Ok(()),
            PayloadSrc::Mr { .. } => Err(WcStatus::LocQpOpErr),
        }
    }

    /// The packet left; its request completes if it was its last.
    pub(crate) fn on_transmitted(&mut self, ctx: &mut Ctx<'_>, payload_len: usize) {
        self.q.counters.tx_packets += 1;
        self.q.counters.tx_bytes += payload_len as u64;
        if self.built_last {
            self.built_last = false;
            self.complete_send_head(ctx, WcStatus::Success);
        }
    }

    /// The packet could not be written (its memory is gone): the request fails.
    pub(crate) fn on_tx_error(&mut self, ctx: &mut Ctx<'_>, status: WcStatus) {
        self.built_last = false;
        self.send_error(ctx, status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ib::counters::DeviceCounters;
    use crate::ib::cq::CqRing;
    use crate::ib::event::EventQueue;
    use crate::ib::mr::LKey;
    use crate::ib::srq::{SrqRing, SrqTable};
    use crate::ib::wr::{RecvWr, SendWr, Sge};
    use crate::ib::Mtu;
    use crate::wire::{Ecn, MacAddr, RKey};

    struct World {
        mrs: MrTable,
        cqs: Vec<Option<CqRing>>,
        srqs: SrqTable,
        events: EventQueue,
        dev: DeviceCounters,
        buf: Arc<MrShared>,
        target: Arc<MrShared>,
    }

    impl World {
        fn new() -> World {
            let mut mrs = MrTable::default();
            let buf = Arc::new(MrShared::new(
                LKey(7),
                RKey(8),
                Pd(1),
                AccessFlags::LOCAL_WRITE,
                0x10000,
                1 << 16,
            ));
            let target = Arc::new(MrShared::new(
                LKey(9),
                RKey(10),
                Pd(1),
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
                0x40000,
                1 << 16,
            ));
            mrs.insert(buf.clone());
            mrs.insert(target.clone());
            World {
                mrs,
                cqs: vec![Some(CqRing::new(256)), Some(CqRing::new(256))],
                srqs: vec![Some(SrqRing::new(Pd(1), 64, 1))],
                events: EventQueue::default(),
                dev: DeviceCounters::default(),
                buf,
                target,
            }
        }
        fn ctx(&mut self) -> Ctx<'_> {
            Ctx {
                now: Instant::ZERO,
                mrs: &self.mrs,
                cqs: &mut self.cqs,
                srqs: &mut self.srqs,
                events: &mut self.events,
                dev: &mut self.dev,
            }
        }
        fn wcs(&mut self, cq: usize) -> Vec<WorkCompletion> {
            let mut v = Vec::new();
            self.cqs[cq].as_mut().unwrap().poll(&mut v, 256);
            v
        }
        fn recv(&self, id: u64, off: u64, len: u32) -> RecvWqe {
            RecvWqe::new(
                RecvWr {
                    wr_id: id,
                    sg_list: smallvec::smallvec![Sge {
                        addr: 0x10000 + off,
                        length: len,
                        lkey: LKey(7),
                    }],
                },
                &self.mrs,
                Pd(1),
            )
        }
    }

    fn path() -> Path {
        Path {
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            src_ip: "10.0.0.1".parse().unwrap(),
            dst_ip: "10.0.0.2".parse().unwrap(),
            udp_sport: 49152,
            dscp: 0,
            ecn: Ecn::NotEct,
            hop_limit: 64,
            flow_label: 0,
        }
    }

    /// A UC QP in RTS with path MTU 256, receive PSN 1000, send PSN 500.
    fn rts(w: &mut World, srq: bool) -> Qp {
        let mut q = Qp::new(
            QpNumber::new(0x20),
            QpInit {
                pd: Pd(1),
                send_cq: Cq(0),
                recv_cq: Cq(1),
                cap: QpCap {
                    max_send_wr: 16,
                    max_recv_wr: 16,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: true,
                srq: srq.then_some(Srq(0)),
            },
        );
        let a = QpAttr {
            qp_access_flags: AccessFlags::REMOTE_WRITE,
            port_num: 1,
            path_mtu: Mtu::M256,
            dest_qp_num: 0x30,
            rq_psn: 1000,
            sq_psn: 500,
            ..QpAttr::default()
        };
        use QpAttrMask as M;
        let mut ctx = w.ctx();
        q.modify(
            &mut ctx,
            &a,
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
            QpState::Init,
            None,
        );
        q.modify(
            &mut ctx,
            &a,
            M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
            QpState::Rtr,
            Some(path()),
        );
        q.modify(&mut ctx, &a, M::STATE | M::SQ_PSN, QpState::Rts, None);
        q
    }

    /// The packets a sender would make of a SEND of `data` from PSN `psn` at MTU 256.
    fn send_packets(psn: u32, data: &[u8], imm: Option<u32>) -> Vec<(RoceRepr, Vec<u8>)> {
        let op = match imm {
            Some(imm) => SendOp::SendWithImm { imm },
            None => SendOp::Send,
        };
        let chunks: Vec<&[u8]> = if data.is_empty() {
            vec![&[]]
        } else {
            data.chunks(256).collect()
        };
        let n = chunks.len();
        chunks
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                let (first, last) = (i == 0, i + 1 == n);
                let mut ext = ExtRepr::default();
                if last {
                    ext.imm = imm;
                }
                let bth = BthRepr::new(
                    uc_opcode(&op, first, last).unwrap(),
                    QpNumber::new(0x20),
                    Psn::new(psn + i as u32),
                );
                (RoceRepr::new(bth, ext, c.len()), c.to_vec())
            })
            .collect()
    }

    fn deliver(w: &mut World, q: &mut Qp, pkts: &[(RoceRepr, Vec<u8>)]) {
        for (r, p) in pkts {
            q.handle_packet(&mut w.ctx(), r, p);
        }
    }

    #[test]
    fn opcodes_are_the_rc_codes_in_the_uc_range() {
        let w = SendOp::RdmaWrite {
            remote_addr: 0,
            rkey: RKey(1),
        };
        assert_eq!(
            uc_opcode(&SendOp::Send, true, true),
            Some(Opcode::UC_SEND_ONLY)
        );
        assert_eq!(uc_opcode(&SendOp::Send, true, false).unwrap().0, 0x20);
        assert_eq!(uc_opcode(&w, false, false).unwrap().0, 0x27);
        assert_eq!(
            uc_opcode(&SendOp::SendWithImm { imm: 1 }, false, true)
                .unwrap()
                .0,
            0x23
        );
        assert_eq!(
            uc_opcode(
                &SendOp::RdmaRead {
                    remote_addr: 0,
                    rkey: RKey(1)
                },
                true,
                true
            ),
            None
        );
        for (op, f, l) in [(SendOp::Send, true, false), (w, true, true)] {
            let o = uc_opcode(&op, f, l).unwrap();
            assert_eq!(o.transport(), crate::wire::Transport::Uc);
        }
    }

    #[test]
    fn a_multi_packet_send_is_delivered_whole() {
        let mut w = World::new();
        let mut q = rts(&mut w, false);
        let wqe = w.recv(1, 0, 4096);
        q.post_recv(&mut w.ctx(), wqe);
        let data: Vec<u8> = (0..700u32).map(|i| i as u8).collect();
        deliver(&mut w, &mut q, &send_packets(1000, &data, Some(7)));
        let wcs = w.wcs(1);
        assert_eq!(wcs.len(), 1);
        assert_eq!(
            (wcs[0].status, wcs[0].byte_len, wcs[0].imm_data),
            (WcStatus::Success, 700, Some(7))
        );
        assert_eq!(&w.buf.copy_range(0..700)[..], &data[..]);
        assert_eq!(q.epsn, Psn::new(1003));
    }

    #[test]
    fn a_gap_abandons_the_message_and_the_wqe_takes_the_next() {
        let mut w = World::new();
        let mut q = rts(&mut w, false);
        let wqe = w.recv(1, 0, 4096);
        q.post_recv(&mut w.ctx(), wqe);
        let a: Vec<u8> = vec![0xaa; 700];
        let b: Vec<u8> = vec![0xbb; 600];
        let mut pa = send_packets(1000, &a, None);
        pa.remove(1); // the MIDDLE is lost
        deliver(&mut w, &mut q, &pa);
        assert!(
            w.wcs(1).is_empty(),
            "nothing of the broken message is delivered"
        );
        assert_eq!(q.counters().out_of_sequence, 1);
        assert_eq!(q.counters().msg_drops, 1);
        // The next message (FIRST at 1003) is delivered into the same WQE.
        deliver(&mut w, &mut q, &send_packets(1003, &b, None));
        let wcs = w.wcs(1);
        assert_eq!((wcs.len(), wcs[0].wr_id, wcs[0].byte_len), (1, 1, 600));
        assert_eq!(&w.buf.copy_range(0..600)[..], &b[..]);
    }

    #[test]
    fn a_lost_first_packet_drops_the_rest_until_the_next_message() {
        let mut w = World::new();
        let mut q = rts(&mut w, false);
        for i in 0..2 {
            let wqe = w.recv(i, 0, 4096);
            q.post_recv(&mut w.ctx(), wqe);
        }
        let mut pa = send_packets(1000, &[1u8; 600], None);
        pa.remove(0);
        deliver(&mut w, &mut q, &pa);
        assert!(w.wcs(1).is_empty());
        deliver(&mut w, &mut q, &send_packets(1003, &[2u8; 10], None));
        let wcs = w.wcs(1);
        assert_eq!((wcs.len(), wcs[0].wr_id, wcs[0].byte_len), (1, 0, 10));
    }

    #[test]
    fn duplicates_and_late_packets_are_never_delivered_twice() {
        let mut w = World::new();
        let mut q = rts(&mut w, false);
        for i in 0..4 {
            let wqe = w.recv(i, 0, 4096);
            q.post_recv(&mut w.ctx(), wqe);
        }
        let p = send_packets(1000, &[3u8; 100], None);
        deliver(&mut w, &mut q, &p);
        deliver(&mut w, &mut q, &p);
        assert_eq!(w.wcs(1).len(), 1);
        assert_eq!(q.counters().duplicates, 1);
        // A copy of a middle packet inside a message in progress does not disturb it.
        let m = send_packets(1001, &[4u8; 600], None);
        deliver(&mut w, &mut q, &m[..2]);
        deliver(&mut w, &mut q, &m[..1]);
        deliver(&mut w, &mut q, &m[2..]);
        let wcs = w.wcs(1);
        assert_eq!((wcs.len(), wcs[0].byte_len), (1, 600));
    }

    #[test]
    fn no_wqe_and_bad_lengths_drop_the_message_silently() {
        let mut w = World::new();
        let mut q = rts(&mut w, false);
        deliver(&mut w, &mut q, &send_packets(1000, &[1u8; 300], None));
        assert_eq!(q.counters().no_wqe_drops, 1);
        let wqe = w.recv(1, 0, 100);
        q.post_recv(&mut w.ctx(), wqe);
        // 300 bytes for a 100-byte buffer.
        deliver(&mut w, &mut q, &send_packets(1002, &[1u8; 300], None));
        assert_eq!(q.counters().msg_drops, 1);
        // A FIRST shorter than the MTU.
        let mut bad = send_packets(1004, &[1u8; 300], None);
        bad[0].0.payload_len = 200;
        bad[0].1.truncate(200);
        deliver(&mut w, &mut q, &bad);
        assert_eq!(q.counters().msg_drops, 2);
        assert!(w.wcs(1).is_empty());
        // The WQE is still there for a message that fits.
        deliver(&mut w, &mut q, &send_packets(1006, &[9u8; 50], None));
        assert_eq!(w.wcs(1)[0].byte_len, 50);
        assert_eq!(q.state(), QpState::Rts);
    }

    #[test]
    fn writes_need_the_right_and_a_good_rkey_and_with_imm_a_wqe() {
        let mut w = World::new();
        let mut q = rts(&mut w, false);
        let write = |psn: u32, rkey: u32, len: u32, imm: Option<u32>| {
            let op = match imm {
                Some(imm) => SendOp::RdmaWriteWithImm {
                    remote_addr: 0x40000,
                    rkey: RKey(rkey),
                    imm,
                },
                None => SendOp::RdmaWrite {
                    remote_addr: 0x40000,
                    rkey: RKey(rkey),
                },
            };
            let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let n = (len as usize).div_ceil(256).max(1);
            (0..n)
                .map(|i| {
                    let (first, last) = (i == 0, i + 1 == n);
                    let c = &data[(i * 256).min(data.len())..((i + 1) * 256).min(data.len())];
                    let mut ext = ExtRepr::default();
                    if first {
                        ext.reth = Some(RethRepr {
                            va: 0x40000,
                            rkey: RKey(rkey),
                            dma_len: len,
                        });
                    }
                    if last {
                        ext.imm = imm;
                    }
                    let bth = BthRepr::new(
                        uc_opcode(&op, first, last).unwrap(),
                        QpNumber::new(0x20),
                        Psn::new(psn + i as u32),
                    );
                    (RoceRepr::new(bth, ext, c.len()), c.to_vec())
                })
                .collect::<Vec<_>>()
        };
        deliver(&mut w, &mut q, &write(1000, 10, 600, None));
        let want: Vec<u8> = (0..600u32).map(|i| (i * 7) as u8).collect();
        assert_eq!(&w.target.copy_range(0..600)[..], &want[..]);
        // A bad R_Key: dropped, nothing written, QP fine.
        w.target.update(|b| b[..600].fill(0));
        deliver(&mut w, &mut q, &write(1003, 11, 600, None));
        assert_eq!(q.counters().msg_drops, 1);
        assert!(w.target.copy_range(0..600)[..].iter().all(|&b| b == 0));
        // With immediate and no WQE: dropped (the data lands, no completion).
        deliver(&mut w, &mut q, &write(1006, 10, 100, Some(5)));
        assert_eq!(q.counters().no_wqe_drops, 1);
        let wqe = w.recv(1, 0, 16);
        q.post_recv(&mut w.ctx(), wqe);
        deliver(&mut w, &mut q, &write(1007, 10, 300, Some(6)));
        let wcs = w.wcs(1);
        assert_eq!(
            (wcs.len(), wcs[0].opcode, wcs[0].byte_len, wcs[0].imm_data),
            (1, WcOpcode::RecvRdmaWithImm, 300, Some(6))
        );
        // Without the remote write right: dropped.
        q.attr.qp_access_flags = AccessFlags::empty();
        deliver(&mut w, &mut q, &write(1009, 10, 10, None));
        assert_eq!(q.counters().msg_drops, 2);
        assert_eq!(q.state(), QpState::Rts);
    }

    #[test]
    fn the_requester_packetises_without_ackreq_and_completes_on_the_last_packet() {
        let mut w = World::new();
        let mut q = rts(&mut w, false);
        let wr = SendWr::new(
            42,
            SendOp::RdmaWriteWithImm {
                remote_addr: 0x1234,
                rkey: RKey(99),
                imm: 0x55,
            },
            vec![Sge {
                addr: 0x10000,
                length: 600,
                lkey: LKey(7),
            }],
        );
        let wqe = SendWqe::new(wr, 600, false, &w.mrs, Pd(1), None);
        q.post_send(&mut w.ctx(), wqe);
        let mut ops = Vec::new();
        while q.next_tx(Instant::ZERO).is_some() {
            let d = q.build_tx(&mut w.ctx()).unwrap();
            let mut buf = vec![0u8; d.repr.payload_len];
            q.write_payload(&w.mrs, &d.payload, &mut buf).unwrap();
            assert!(!d.repr.bth.ack_req);
            ops.push((
                d.repr.bth.opcode.0,
                d.repr.bth.psn.get(),
                d.repr.payload_len,
                d.repr.ext.reth.is_some(),
                d.repr.ext.imm,
            ));
            assert!(
                w.wcs(0).is_empty(),
                "not complete before its last packet left"
            );
            q.on_transmitted(&mut w.ctx(), buf.len());
        }
        assert_eq!(
            ops,
            [
                (0x26, 500, 256, true, None),
                (0x27, 501, 256, false, None),
                (0x29, 502, 88, false, Some(0x55))
            ]
        );
        let wcs = w.wcs(0);
        assert_eq!(
            (wcs[0].wr_id, wcs[0].opcode, wcs[0].byte_len),
            (42, WcOpcode::RdmaWrite, 600)
        );
    }

    #[test]
    fn srq_messages_lost_on_the_wire_give_their_wqe_back() {
        let mut w = World::new();
        let mut q = rts(&mut w, true);
        for i in 0..2 {
            let wqe = w.recv(i, 0, 4096);
            w.srqs[0].as_mut().unwrap().post(wqe);
        }
        let mut pa = send_packets(1000, &[1u8; 600], None);
        pa.pop(); // LAST lost
        deliver(&mut w, &mut q, &pa);
        // The next message takes WQE 0 again: nothing was consumed.
        deliver(&mut w, &mut q, &send_packets(1003, &[2u8; 10], None));
        let wcs = w.wcs(1);
        assert_eq!((wcs.len(), wcs[0].wr_id), (1, 0));
        assert_eq!(w.srqs[0].as_ref().unwrap().len(), 1);
        // Too long for the SRQ's WQE: it completes in error (class E).
        let small = w.recv(5, 0, 16);
        w.srqs[0].as_mut().unwrap().put_back(small);
        deliver(&mut w, &mut q, &send_packets(1004, &[3u8; 100], None));
        let wcs = w.wcs(1);
        assert_eq!((wcs[0].wr_id, wcs[0].status), (5, WcStatus::RemInvReqErr));
    }
}
