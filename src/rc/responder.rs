//! The responder (IBTA 9.7.5.1): a pipeline of checks, in order, each ending in one answer
//! when it fails — PSN → opcode sequence → operation valid → resources → length → R_Key →
//! execute → acknowledge — plus duplicate handling and the transmission of responses.
//! [`Qp::on_request`] reads as that pipeline; each [`Step`] is a method.
//!
//! Error classes (IBTA 9.9.3): a PSN gap gets one PSN-sequence-error NAK; an empty receive
//! queue gets an RNR NAK; an invalid request, a remote access error and a remote operational
//! error are fatal: one NAK, then the QP moves to the error state.

use super::qp::{
    InMsg, PayloadSrc, Qp, Resource, RespItem, TxDesc, XrcRole, MAX_RESP_QUEUE, RESP_ROOM,
};
use crate::ib::mr::{scatter, MrShared};
use crate::ib::wc::{WcOpcode, WcStatus};
use crate::ib::{AccessFlags, AsyncEvent, Ctx, QpState};
use crate::wire::{
    AethRepr, AtomicEthRepr, BthRepr, CreditCode, ExtRepr, NakCode, OpFlags, Opcode, Psn, QpNumber,
    RnrTimer, RoceRepr, Syndrome,
};
use std::sync::Arc;

/// The responder's steps, in the order a request goes through them (IBTA 9.7.5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The PSN against the expected one: in sequence, a duplicate, or ahead (9.7.5.1.1).
    Psn,
    /// FIRST/MIDDLE/LAST/ONLY against the message in progress (9.7.5.1.2).
    OpSequence,
    /// The operation is one this QP executes with the rights it grants (9.7.5.1.3).
    OpValid,
    /// A receive WQE for a SEND or a WRITE with immediate (9.7.5.1.4).
    Resources,
    /// The payload length against the path MTU and the packet's place in the message; the
    /// request's own sizes and alignment (9.7.5.1.5).
    Length,
    /// The R_Key, its rights and bounds for WRITE, READ and ATOMIC (9.7.5.1.6, 10.6.3.2).
    RKey,
    /// The operation itself: data placed, READ queued, ATOMIC executed once.
    Execute,
}

/// Why a request fatally failed, and what each side reports.
#[derive(Clone, Copy, Debug)]
struct Fatal {
    nak: NakCode,
    /// The status of the receive completion at the responder, if a receive WQE is involved.
    recv_status: WcStatus,
}

const INVALID: Fatal = Fatal {
    nak: NakCode::InvalidRequest,
    recv_status: WcStatus::RemInvReqErr,
};
const LENGTH: Fatal = Fatal {
    nak: NakCode::InvalidRequest,
    recv_status: WcStatus::LocLenErr,
};
const ACCESS: Fatal = Fatal {
    nak: NakCode::RemoteAccessError,
    recv_status: WcStatus::RemAccessErr,
};

/// How a request leaves the pipeline before it is acknowledged.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// Behind the expected PSN: a duplicate, answered from what was saved, never executed.
    Duplicate,
    /// Ahead of the expected PSN: one PSN-sequence-error NAK per gap, then silence.
    OutOfSequence,
    /// No receive WQE: an RNR NAK; the requester retries after the RNR timer.
    NotReady,
    /// A fatal error found at a step: one NAK, the QP moves to the error state.
    Fatal(Step, Fatal),
    /// A READ or ATOMIC beyond the responder resources: NAKed and the QP in error already.
    Excess,
}

impl Stop {
    /// The step that stopped the request.
    fn step(self) -> Step {
        match self {
            Stop::Duplicate | Stop::OutOfSequence => Step::Psn,
            Stop::NotReady | Stop::Excess => Step::Resources,
            Stop::Fatal(step, _) => step,
        }
    }
}

/// The memory a WRITE (first packet), READ or ATOMIC names, its R_Key checked: the region
/// and the offset of the first byte (no region for a zero-length request).
struct Target {
    mr: Option<Arc<MrShared>>,
    off: usize,
}

impl Qp {
    /// The AETH credit count: the receive WQEs queued, or "not tracked" (0x1F) on an SRQ,
    /// whose WQEs other QPs take too (IBTA 9.7.7.2).
    fn credits(&self) -> CreditCode {
        if self.shares_rq() {
            return CreditCode::UNLIMITED;
        }
        if self.dev.zero_credits {
            return CreditCode::from_count(0);
        }
        CreditCode::from_count(self.rq.len().min(u32::MAX as usize) as u32)
    }

    fn push_resp(&mut self, item: RespItem) {
        // Requests are taken only with room for their answers (`on_request`), so the bound
        // is not reached; were it reached, the loss is counted, never silent.
        if self.resp.resp_q.len() < MAX_RESP_QUEUE + RESP_ROOM {
            self.resp.resp_q.push_back(item);
        } else {
            self.counters.resp_queue_drops += 1;
        }
    }

    /// Queue an ACK for `psn`, coalescing with an ACK already waiting at the tail.
    fn queue_ack(&mut self, psn: Psn) {
        let syndrome = Syndrome::Ack(self.credits());
        let msn = self.resp.msn;
        if let Some(RespItem::Ack {
            psn: p,
            syndrome: s,
            msn: m,
        }) = self.resp.resp_q.back_mut()
        {
            if s.is_ack() {
                *p = psn;
                *s = syndrome;
                *m = msn;
                return;
            }
        }
        self.push_resp(RespItem::Ack { psn, syndrome, msn });
    }

    fn queue_nak(&mut self, psn: Psn, syndrome: Syndrome) {
        tracing::debug!(qpn = %self.num, %psn, ?syndrome, "NAK sent");
        let msn = self.resp.msn;
        self.push_resp(RespItem::Ack { psn, syndrome, msn });
    }

    /// A request packet for this QP's responder: the pipeline of [`Step`]s.
    pub(super) fn on_request(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr, payload: &[u8]) {
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            self.counters.state_drops += 1;
            return;
        }
        // Back-pressure (issue 17 finding 7): a request whose answer may find no room in the
        // response queue is not taken at all — no PSN, memory or receive WQE touched — and
        // the requester's retry (IBTA 9.7.6.1.3: its ACK timeout) brings it back once the
        // queue has drained, instead of executing it and dropping its ACK or NAK.
        if self.resp.resp_q.len() + RESP_ROOM > MAX_RESP_QUEUE {
            self.counters.resp_full_drops += 1;
            return;
        }
        match self.respond(ctx, r, payload) {
            Ok(()) => self.sr_drain(ctx),
            Err(Stop::OutOfSequence) => {
                self.sr_keep(r, payload);
                self.stop(ctx, r, Stop::OutOfSequence);
            }
            Err(stop) => self.stop(ctx, r, stop),
        }
    }

    /// A request at the expected PSN, kept for later by selective repeat (`rc/reorder.rs`):
    /// the pipeline as for any request. False if it stopped.
    pub(super) fn on_request_in_sequence(
        &mut self,
        ctx: &mut Ctx<'_>,
        r: &RoceRepr,
        payload: &[u8],
    ) -> bool {
        match self.respond(ctx, r, payload) {
            Ok(()) => true,
            Err(stop) => {
                self.stop(ctx, r, stop);
                false
            }
        }
    }

    fn respond(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr, payload: &[u8]) -> Result<(), Stop> {
        let f = r.bth.opcode.flags();
        self.check_psn(r.bth.psn)?;
        self.check_op_sequence(f)?;
        self.check_op_valid(r.bth.opcode, f)?;
        self.check_resources(ctx, f)?;
        if self.rd_atomic_excess(r.bth.opcode) {
            // Not executed; NAKed after the responses still queued for the requests within
            // the limit (the requester waits for those), and the QP enters the error state
            // as for any Invalid Request, keeping those responses.
            self.counters.err_naks_sent += 1;
            ctx.events.push(AsyncEvent::QpReqErr(self.num));
            let queued = std::mem::take(&mut self.resp.resp_q);
            self.enter_error(ctx);
            let naks = std::mem::replace(&mut self.resp.resp_q, queued);
            self.resp.resp_q.extend(naks);
            self.queue_nak(r.bth.psn, Syndrome::Nak(NakCode::InvalidRequest));
            return Err(Stop::Excess);
        }
        self.check_length(r, f, payload)?;
        let target = self.check_rkey(ctx, r, f)?;
        self.execute(ctx, r, payload, target)
    }

    /// How a stopped request is answered.
    fn stop(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr, stop: Stop) {
        let p = r.bth.psn;
        tracing::trace!(qpn = %self.num, psn = %p, step = ?stop.step(), ?stop, "request stopped");
        match stop {
            Stop::Duplicate if self.dev.dup_atomic_again && r.ext.atomic_eth.is_some() => {
                self.atomic_again(ctx, r)
            }
            Stop::Duplicate => self.duplicate(ctx, r),
            Stop::OutOfSequence => {
                // One NAK per gap, then silence until the expected PSN arrives.
                self.counters.out_of_sequence += 1;
                if !self.resp.nak_sent && !self.dev.no_seq_nak {
                    self.resp.nak_sent = true;
                    self.counters.seq_naks_sent += 1;
                    let e = self.resp.epsn;
                    self.queue_nak(e, Syndrome::Nak(NakCode::PsnSequenceError));
                }
            }
            Stop::NotReady if self.dev.no_rnr_nak => {}
            Stop::NotReady => {
                self.counters.rnr_naks_sent += 1;
                self.resp.nak_sent = true;
                let t = RnrTimer::new(self.attr.min_rnr_timer);
                self.queue_nak(p, Syndrome::RnrNak(t));
            }
            Stop::Fatal(_, f) => self.fatal(ctx, p, f),
            Stop::Excess => {}
        }
    }

    /// A fatal request error: NAK, complete the receive WQE involved, enter the error state.
    fn fatal(&mut self, ctx: &mut Ctx<'_>, psn: Psn, f: Fatal) {
        self.counters.err_naks_sent += 1;
        self.queue_nak(psn, Syndrome::Nak(f.nak));
        let rwqe = match self.resp.in_msg.take() {
            Some(InMsg::Send { rwqe, .. }) => Some(rwqe),
            // An SRQ's WQEs are not this QP's to spend on an error report.
            _ if self.shares_rq() => None,
            _ => self.rq.pop_front(),
        };
        // The responder's affiliated error (IBTA 11.6.3.1), as the event verbs reports it.
        let event = match f.nak {
            NakCode::InvalidRequest => AsyncEvent::QpReqErr(self.num),
            NakCode::RemoteAccessError => AsyncEvent::QpAccessErr(self.num),
            _ => AsyncEvent::QpFatal(self.num),
        };
        ctx.events.push(event);
        if let Some(rwqe) = rwqe {
            self.complete_recv(
                ctx,
                &rwqe,
                f.recv_status,
                WcOpcode::Recv,
                0,
                None,
                None,
                false,
            );
        }
        self.enter_error(ctx);
    }

    /// [`Step::Psn`].
    fn check_psn(&mut self, p: Psn) -> Result<(), Stop> {
        let d = p.diff(self.resp.epsn);
        if d > 0 {
            return Err(Stop::OutOfSequence);
        }
        if d < 0 {
            return Err(Stop::Duplicate);
        }
        self.resp.nak_sent = false;
        Ok(())
    }

    /// [`Step::OpSequence`]: a message in progress continues with MIDDLE/LAST of the same
    /// kind; otherwise a new message starts with FIRST or ONLY.
    fn check_op_sequence(&self, f: OpFlags) -> Result<(), Stop> {
        let ok = match &self.resp.in_msg {
            Some(m) => {
                let (send, write) = match m {
                    InMsg::Send { .. } => (true, false),
                    InMsg::Write { .. } => (false, true),
                };
                (f.contains(OpFlags::MIDDLE)
                    || (f.contains(OpFlags::LAST) && !f.contains(OpFlags::FIRST)))
                    && send == f.contains(OpFlags::SEND)
                    && write == f.contains(OpFlags::WRITE)
            }
            None => f.contains(OpFlags::FIRST),
        };
        if ok || self.dev.no_opseq_check {
            Ok(())
        } else {
            Err(Stop::Fatal(Step::OpSequence, INVALID))
        }
    }

    /// [`Step::OpValid`]: RC opcodes we execute, and the QP's remote access rights.
    fn check_op_valid(&self, op: Opcode, f: OpFlags) -> Result<(), Stop> {
        if self.xrc == XrcRole::Recv && self.resp.xrc_dest.is_none() {
            return Err(Stop::Fatal(Step::OpValid, INVALID));
        }
        let acc = self.attr.qp_access_flags;
        let valid = if f.contains(OpFlags::SEND) {
            true
        } else if f.contains(OpFlags::WRITE) || op == Opcode::RC_ATOMIC_WRITE {
            // (ATOMIC WRITE: a write of 8 bytes, remote write rights, as rxe asks of it.)
            acc.contains(AccessFlags::REMOTE_WRITE)
        } else if op == Opcode::RC_READ_REQUEST {
            acc.contains(AccessFlags::REMOTE_READ)
        } else if op == Opcode::RC_CMP_SWAP || op == Opcode::RC_FETCH_ADD {
            acc.contains(AccessFlags::REMOTE_ATOMIC)
        } else {
            false // FLUSH: not supported
        };
        if valid {
            Ok(())
        } else {
            Err(Stop::Fatal(Step::OpValid, INVALID))
        }
    }

    /// [`Step::Resources`]: a receive WQE for SEND (first packet) and WRITE with immediate
    /// (in the SRQ if the QP has one: an empty SRQ is answered with an RNR NAK too).
    fn check_resources(&self, ctx: &Ctx<'_>, f: OpFlags) -> Result<(), Stop> {
        let needs_rwqe = (f.contains(OpFlags::SEND) && f.contains(OpFlags::FIRST))
            || (f.contains(OpFlags::WRITE) && f.contains(OpFlags::IMMEDIATE));
        if needs_rwqe && !self.recv_available(ctx) {
            Err(Stop::NotReady)
        } else {
            Ok(())
        }
    }

    /// Whether a READ or ATOMIC exceeds the responder resources: at most `max_dest_rd_atomic` with
    /// responses still pending; one more is an Invalid Request (IBTA 9.7.5.1.5, 9.9.3: the requester
    /// exceeded the responder resources it negotiated), never a silent eviction of a pending
    /// one (issue 17 finding 7). Saved resources whose responses have all left are history
    /// for duplicates and do not count, nor do queued answers to duplicates.
    ///
    /// A resource is held from the request's acceptance until its last response packet is
    /// handed to the link, and no longer: IBTA's class C error is "more requests received
    /// and not ACKed than allowed", and a requester keeping to its limit may send the next
    /// request as soon as a response arrives, so holding it any longer would refuse a
    /// conformant requester. The outcome for a requester that exceeds the limit therefore
    /// depends on when the responses left, which no accounting can avoid: a burst of
    /// `max_dest_rd_atomic + 1` requests is refused when it arrives in one receive batch and
    /// executed when the first responses leave before the last request is taken. The
    /// conformance test (`res.too-many-*`) judges a burst only when the responses show which
    /// of the two happened.
    fn rd_atomic_excess(&self, op: Opcode) -> bool {
        if op != Opcode::RC_READ_REQUEST && op != Opcode::RC_CMP_SWAP && op != Opcode::RC_FETCH_ADD
        {
            return false;
        }
        if self.dev.recycle_rd_atomic {
            return false;
        }
        let pending = self
            .resp
            .resp_q
            .iter()
            .filter(|i| match i {
                // Only the answers to requests executed here count. An answer to a duplicate
                // is not a new request: the requester's retry of one it still waits for
                // (counted when it was first taken; selective repeat even keeps the
                // original's responses next to it), or a late network copy of one the
                // requester has completed already, which may arrive together with its next
                // READ/ATOMIC. Counted, it made that legitimate request "excess": NAKed as
                // an Invalid Request, never executed, and both QPs in error (rc_props).
                RespItem::Read { replay, .. } | RespItem::AtomicAck { replay, .. } => !*replay,
                RespItem::Ack { .. } => false,
            })
            .count();
        pending >= usize::from(self.attr.max_dest_rd_atomic.max(1))
    }

    /// [`Step::Length`]: the payload against the path MTU (IBTA C9-87..C9-90); a READ of at
    /// most 2^31 bytes; an ATOMIC on an 8-byte aligned address.
    fn check_length(&self, r: &RoceRepr, f: OpFlags, payload: &[u8]) -> Result<(), Stop> {
        let mtu = self.mtu() as usize;
        let len_ok = if f.contains(OpFlags::FULL_MTU) {
            payload.len() == mtu
        } else if f.contains(OpFlags::LAST) && !f.contains(OpFlags::FIRST) {
            (1..=mtu).contains(&payload.len())
        } else {
            payload.len() <= mtu
        };
        let op = r.bth.opcode;
        let request_ok = if op == Opcode::RC_READ_REQUEST {
            r.ext.reth.is_some_and(|reth| reth.dma_len <= 1 << 31)
        } else if op == Opcode::RC_CMP_SWAP || op == Opcode::RC_FETCH_ADD {
            // A misaligned atomic is an invalid request (as rxe answers it).
            r.ext.atomic_eth.is_some_and(|a| a.va % 8 == 0)
        } else if op == Opcode::RC_ATOMIC_WRITE {
            // 8 bytes, for 8 aligned bytes.
            payload.len() == 8
                && r.ext
                    .reth
                    .is_some_and(|reth| reth.va % 8 == 0 && reth.dma_len == 8)
        } else {
            true
        };
        if len_ok && request_ok || self.dev.no_length_check {
            Ok(())
        } else {
            Err(Stop::Fatal(Step::Length, INVALID))
        }
    }

    /// [`Step::RKey`]: the memory a WRITE's first packet, a READ or an ATOMIC names, checked
    /// (IBTA 10.6.3.2, 9.7.5.1.7). A zero-length WRITE or READ names no memory and has no
    /// R_Key to check. Other packets name none (`None`).
    fn check_rkey(&self, ctx: &Ctx<'_>, r: &RoceRepr, f: OpFlags) -> Result<Option<Target>, Stop> {
        let op = r.bth.opcode;
        let (rkey, va, len, need) = if f.contains(OpFlags::WRITE) && f.contains(OpFlags::FIRST)
            || op == Opcode::RC_READ_REQUEST
            || op == Opcode::RC_ATOMIC_WRITE
        {
            let Some(reth) = r.ext.reth else {
                return Err(Stop::Fatal(Step::RKey, INVALID));
            };
            if reth.dma_len == 0 {
                return Ok(Some(Target { mr: None, off: 0 }));
            }
            // (An ATOMIC WRITE's DMA length is 8, checked by the length step.)
            let need = if op == Opcode::RC_READ_REQUEST {
                AccessFlags::REMOTE_READ
            } else {
                AccessFlags::REMOTE_WRITE
            };
            (reth.rkey, reth.va, u64::from(reth.dma_len), need)
        } else if op == Opcode::RC_CMP_SWAP || op == Opcode::RC_FETCH_ADD {
            let Some(a) = r.ext.atomic_eth else {
                return Err(Stop::Fatal(Step::RKey, INVALID));
            };
            (a.rkey, a.va, 8, AccessFlags::REMOTE_ATOMIC)
        } else {
            return Ok(None);
        };
        let pd = self.rx_pd();
        let mr = ctx.mrs.by_rkey(rkey).filter(|mr| {
            mr.rkey_valid()
                    && mr.pd == pd
                    && mr.access.contains(need)
                    // A type 2 memory window: only on the QP it was bound through.
                    && mr.bound_qp.is_none_or(|q| q == self.num)
        });
        match mr.and_then(|mr| mr.offset_of(va, len).map(|off| (mr, off))) {
            Some((mr, off)) => Ok(Some(Target { mr: Some(mr), off })),
            // Deliberate deviation: an R_Key naming no region names no memory either.
            None if self.dev.skip_rkey_check && ctx.mrs.by_rkey(rkey).is_none() => {
                Ok(Some(Target { mr: None, off: 0 }))
            }
            None => Err(Stop::Fatal(Step::RKey, ACCESS)),
        }
    }

    /// [`Step::Execute`], then the acknowledgement ([`acknowledge`](Self::acknowledge)).
    fn execute(
        &mut self,
        ctx: &mut Ctx<'_>,
        r: &RoceRepr,
        payload: &[u8],
        target: Option<Target>,
    ) -> Result<(), Stop> {
        let f = r.bth.opcode.flags();
        if f.contains(OpFlags::SEND) {
            self.exec_send(ctx, r, payload)
        } else if f.contains(OpFlags::WRITE) {
            self.exec_write(ctx, r, payload, target)
        } else if r.bth.opcode == Opcode::RC_READ_REQUEST {
            self.exec_read(r, target);
            Ok(())
        } else if r.bth.opcode == Opcode::RC_ATOMIC_WRITE {
            self.exec_atomic_write(r, payload, target)
        } else {
            self.exec_atomic(r, target);
            Ok(())
        }
    }

    /// The last step: the expected PSN moves on, a message that ends counts in the MSN, and
    /// an ACK is queued if the packet asked for one (coalesced with one already waiting).
    fn acknowledge(&mut self, r: &RoceRepr, ends_message: bool) {
        self.resp.epsn = r.bth.psn.next();
        if ends_message {
            self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
        }
        if r.bth.ack_req {
            self.queue_ack(r.bth.psn);
        }
    }

    fn exec_send(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr, payload: &[u8]) -> Result<(), Stop> {
        let f = r.bth.opcode.flags();
        let (first, last) = (f.contains(OpFlags::FIRST), f.contains(OpFlags::LAST));
        if first && last {
            // SEND ONLY: the receive WQE is used where it is, not parked in `in_msg` and taken
            // back out; only a request that fails leaves it there, for `fatal` to complete.
            // The resources step made sure there is one.
            let Some(rwqe) = self.take_recv(ctx) else {
                return Err(Stop::NotReady);
            };
            return match land_send(
                ctx,
                self.rx_pd(),
                self.num,
                r,
                &rwqe,
                0,
                first,
                last,
                payload,
            ) {
                Ok(inv) => {
                    self.finish_send(ctx, r, &rwqe, payload.len() as u64, inv);
                    Ok(())
                }
                Err(stop) => {
                    self.resp.in_msg = Some(InMsg::Send { rwqe, off: 0 });
                    Err(stop)
                }
            };
        }
        if first {
            // The resources step made sure there is one.
            let Some(rwqe) = self.take_recv(ctx) else {
                return Err(Stop::NotReady);
            };
            self.resp.in_msg = Some(InMsg::Send { rwqe, off: 0 });
        }
        let pd = self.rx_pd();
        let Some(InMsg::Send { rwqe, off }) = &mut self.resp.in_msg else {
            return Err(Stop::Fatal(Step::Execute, INVALID));
        };
        let inv = land_send(ctx, pd, self.num, r, rwqe, *off, first, last, payload)?;
        *off += payload.len() as u64;
        if !last {
            self.acknowledge(r, false);
            return Ok(());
        }
        let Some(InMsg::Send { rwqe, off }) = self.resp.in_msg.take() else {
            return Ok(());
        };
        self.finish_send(ctx, r, &rwqe, off, inv);
        Ok(())
    }

    /// A SEND message's last packet landed (`len` bytes in all): acknowledge it and complete
    /// its receive WQE.
    #[inline]
    fn finish_send(
        &mut self,
        ctx: &mut Ctx<'_>,
        r: &RoceRepr,
        rwqe: &crate::ib::wqe::RecvWqe,
        len: u64,
        inv: Option<crate::wire::RKey>,
    ) {
        self.acknowledge(r, true);
        self.complete_recv(
            ctx,
            rwqe,
            WcStatus::Success,
            WcOpcode::Recv,
            len as u32,
            r.ext.imm,
            inv,
            r.bth.solicited,
        );
    }

    fn exec_write(
        &mut self,
        ctx: &mut Ctx<'_>,
        r: &RoceRepr,
        payload: &[u8],
        target: Option<Target>,
    ) -> Result<(), Stop> {
        let f = r.bth.opcode.flags();
        if let Some(Target { mr, off }) = target {
            // The first packet: its RETH was checked by the R_Key step.
            let dma_len = r.ext.reth.map_or(0, |reth| u64::from(reth.dma_len));
            self.resp.in_msg = Some(InMsg::Write {
                mr,
                mr_off: off,
                done: 0,
                dma_len,
            });
        }
        let Some(InMsg::Write {
            mr,
            mr_off,
            done,
            dma_len,
        }) = &mut self.resp.in_msg
        else {
            return Err(Stop::Fatal(Step::Execute, INVALID));
        };
        let end = *done + payload.len() as u64;
        if end > *dma_len || (f.contains(OpFlags::LAST) && end != *dma_len) {
            return Err(Stop::Fatal(Step::Execute, INVALID));
        }
        if let Some(mr) = mr {
            // The region may have been deregistered or invalidated since the first packet
            // (its R_Key checked then): the rest of the message writes nothing.
            if !mr.rkey_valid() {
                self.counters.mr_gone += 1;
                return Err(Stop::Fatal(Step::Execute, ACCESS));
            }
            let at = *mr_off + *done as usize;
            if !mr.write_at(at, payload) {
                self.counters.mr_gone += 1;
                return Err(Stop::Fatal(Step::Execute, ACCESS));
            }
        }
        *done = end;
        if !f.contains(OpFlags::LAST) {
            self.acknowledge(r, false);
            return Ok(());
        }
        let total = *dma_len as u32;
        self.resp.in_msg = None;
        let Some(imm) = r.ext.imm else {
            self.acknowledge(r, true);
            return Ok(());
        };
        // The resources step made sure there is one.
        let Some(rwqe) = self.take_recv(ctx) else {
            return Err(Stop::NotReady);
        };
        self.acknowledge(r, true);
        self.complete_recv(
            ctx,
            &rwqe,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            total,
            Some(imm),
            None,
            r.bth.solicited,
        );
        Ok(())
    }

    fn push_resource(&mut self, res: Resource) {
        let max = usize::from(self.attr.max_dest_rd_atomic.max(1));
        while self.resp.resources.len() >= max {
            self.resp.resources.pop_front();
        }
        self.resp.resources.push_back(res);
    }

    /// A READ: its resource is saved for duplicates, its responses queued. The expected PSN
    /// moves past the PSNs the responses take; a READ is acknowledged by its responses.
    fn exec_read(&mut self, r: &RoceRepr, target: Option<Target>) {
        let p = r.bth.psn;
        let len = r.ext.reth.map_or(0, |reth| reth.dma_len);
        let va = r.ext.reth.map_or(0, |reth| reth.va);
        let Target { mr, off: mr_off } = target.unwrap_or(Target { mr: None, off: 0 });
        let npkts = len.div_ceil(self.mtu()).max(1);
        self.push_resource(Resource::Read {
            first_psn: p,
            npkts,
            mr: mr.clone(),
            mr_off,
            len,
            va,
        });
        self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
        self.resp.epsn = p.add(npkts);
        self.push_resp(RespItem::Read {
            mr,
            mr_off,
            len,
            first_psn: p,
            npkts,
            sent: 0,
            replay: false,
        });
    }

    /// An ATOMIC: executed once, under the region's write lock, in host byte order as rxe
    /// does; the original value is saved for duplicates and returned in the ATOMIC ACK.
    fn exec_atomic(&mut self, r: &RoceRepr, target: Option<Target>) {
        let p = r.bth.psn;
        let (Some(a), Some(Target { mr: Some(mr), off })) = (r.ext.atomic_eth, target) else {
            return;
        };
        // The R_Key was checked under the device lock, which deregistration takes too: the
        // memory is there. Should it be gone, nothing is executed or answered (the retry
        // then meets the invalid R_Key).
        let Some(orig) = apply_atomic(r.bth.opcode, a, &mr, off) else {
            self.counters.mr_gone += 1;
            return;
        };
        self.push_resource(Resource::Atomic { psn: p, orig });
        self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
        self.resp.epsn = p.next();
        let msn = self.resp.msn;
        self.push_resp(RespItem::AtomicAck {
            psn: p,
            orig,
            msn,
            replay: false,
        });
    }

    /// ATOMIC WRITE: the 8 bytes stored at once (no reader of the region sees half of them),
    /// then acknowledged as a WRITE is. A duplicate is re-ACKed, never stored again.
    fn exec_atomic_write(
        &mut self,
        r: &RoceRepr,
        payload: &[u8],
        target: Option<Target>,
    ) -> Result<(), Stop> {
        let Ok(value) = <[u8; 8]>::try_from(payload) else {
            return Err(Stop::Fatal(Step::Execute, INVALID));
        };
        if let Some(Target { mr: Some(mr), off }) = target {
            // Its R_Key was checked for this very packet, under the device lock that
            // deregistration takes too (see exec_atomic); memory gone from under a region
            // (an on-demand one unmapped) is an access error.
            if mr.update8_at(off, |_| value).is_none() {
                self.counters.mr_gone += 1;
                return Err(Stop::Fatal(Step::Execute, ACCESS));
            }
        }
        self.acknowledge(r, true);
        Ok(())
    }

    /// Deliberate deviation `dup_atomic_again`: a duplicate ATOMIC executed once more, its
    /// new original value returned; the expected PSN and the MSN stay.
    fn atomic_again(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr) {
        let f = r.bth.opcode.flags();
        if let (Some(a), Ok(Some(Target { mr: Some(mr), off }))) =
            (r.ext.atomic_eth, self.check_rkey(ctx, r, f))
        {
            let Some(orig) = apply_atomic(r.bth.opcode, a, &mr, off) else {
                return;
            };
            let msn = self.resp.msn;
            self.push_resp(RespItem::AtomicAck {
                psn: r.bth.psn,
                orig,
                msn,
                replay: true,
            });
        }
    }

    /// A request whose PSN is before the expected one (IBTA 9.7.5.1.1): re-ACK SEND/WRITE,
    /// replay READ from the saved resource, return the saved ATOMIC result. Never re-execute.
    ///
    /// A duplicate READ is read again from memory, so it passes the R_Key step as a new one
    /// would (10.6.3.2) against the region as it is now: its own R_Key must name a live
    /// region of the QP's PD with remote read rights that holds its range, the very region
    /// and bytes the saved request named. Otherwise (a forged or stale retry, a region since
    /// deregistered or invalidated) it is dropped and counted (`dup_refused`): a duplicate
    /// gets no NAK, and nothing of the region leaves.
    fn duplicate(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr) {
        self.counters.duplicates += 1;
        let p = r.bth.psn;
        let op = r.bth.opcode;
        let mtu = self.mtu();
        if op == Opcode::RC_READ_REQUEST && self.dev.dup_read_ack {
            let last = self.resp.epsn.sub(1);
            self.queue_ack(last);
        } else if op == Opcode::RC_READ_REQUEST {
            let found = self.resp.resources.iter().find_map(|res| match res {
                Resource::Read {
                    first_psn,
                    npkts,
                    mr,
                    mr_off,
                    len,
                    va,
                } if p.distance_from(*first_psn) < *npkts => {
                    Some((*first_psn, mr.clone(), *mr_off, *len, *va))
                }
                _ => None,
            });
            let Some((first, mr, mr_off, len, va)) = found else {
                return;
            };
            let k = p.distance_from(first);
            let skip = k * mtu;
            // The duplicate is executed with its own RETH, which must lie inside the original
            // request from the byte its PSN stands for (IBTA 9.7.5.1.1; roce-facts.md): a
            // retry of the remainder, or of a part of it. Anything else is not a retry of this
            // request: ignored, as a duplicate with no saved request is.
            let Some(reth) = r.ext.reth else {
                return;
            };
            if skip > len
                || reth.va != va.wrapping_add(u64::from(skip))
                || reth.dma_len > len - skip
            {
                return;
            }
            let dup_len = reth.dma_len;
            let now = self.check_rkey(ctx, r, r.bth.opcode.flags());
            let same = match (&now, &mr) {
                (Ok(Some(Target { mr: Some(m), off })), Some(saved)) => {
                    Arc::ptr_eq(m, saved) && *off == mr_off + skip as usize
                }
                (Ok(Some(Target { mr: None, .. })), _) => dup_len == 0 || mr.is_none(),
                _ => false,
            };
            if !same {
                self.counters.dup_refused += 1;
                return;
            }
            // Go-back-N: the requester resends from `p` and discards every response after it
            // until the retried one arrives, then asks again, in order, for whatever follows.
            // So the replies still queued from `p` on (the rest of this request's and those
            // of later READs and ATOMICs) cannot help: drop them, and answer the retry at
            // once instead of behind them. The saved resources stay: the requests that follow
            // are answered from them.
            // Selective repeat (`rc/reorder.rs`): the requester keeps those replies and asks
            // for the gap alone, so they stay, and the retry goes before them.
            let item = RespItem::Read {
                mr,
                mr_off: mr_off + skip as usize,
                len: dup_len,
                first_psn: p,
                npkts: dup_len.div_ceil(mtu).max(1),
                sent: 0,
                replay: true,
            };
            self.counters.read_replays += 1;
            if self.sr {
                if self.resp.resp_q.len() < MAX_RESP_QUEUE {
                    let item = self.sr_trim_original(item, first, k);
                    self.resp.resp_q.push_front(item);
                }
                return;
            }
            self.resp.resp_q.retain(|i| match i {
                RespItem::Read {
                    first_psn, npkts, ..
                } => first_psn.add(*npkts).before_or_eq(p),
                RespItem::AtomicAck { psn, .. } => psn.before(p),
                RespItem::Ack { .. } => true,
            });
            self.push_resp(item);
        } else if op == Opcode::RC_CMP_SWAP || op == Opcode::RC_FETCH_ADD {
            let orig = self.resp.resources.iter().find_map(|res| match res {
                Resource::Atomic { psn, orig } if *psn == p => Some(*orig),
                _ => None,
            });
            if let Some(orig) = orig {
                self.counters.atomic_replays += 1;
                let msn = self.resp.msn;
                self.push_resp(RespItem::AtomicAck {
                    psn: p,
                    orig,
                    msn,
                    replay: true,
                });
            }
        } else {
            let last = self.resp.epsn.sub(1);
            self.queue_ack(last);
        }
    }

    /// Selective repeat: a retry of READ `first` from its packet `k` (the answer `replay`)
    /// goes out ahead of the original's responses still queued. The original's packets that
    /// the retry's answer carries are not sent a second time: the original skips them, or,
    /// when the answer carries all that is left of it, leaves the queue and the answer takes
    /// its place in the count against `max_dest_rd_atomic`. Without this, a requester that
    /// completed the READ from the answer (after a probe timeout on a responder slow to drain
    /// its queue) and posted the next READ found the original still counted: the next READ
    /// was one too many, an Invalid Request (testbed, `--selective-repeat`, no loss: `perf
    /// read_bw: work completion 86 failed: remote invalid request error`).
    fn sr_trim_original(&mut self, mut replay: RespItem, first: Psn, k: u32) -> RespItem {
        let RespItem::Read { npkts: n, .. } = replay else {
            return replay;
        };
        let kend = k.saturating_add(n);
        let pos = self.resp.resp_q.iter().position(
            |i| matches!(i, RespItem::Read { first_psn, replay: false, .. } if *first_psn == first),
        );
        let Some(pos) = pos else {
            return replay;
        };
        let Some(RespItem::Read { npkts, sent, .. }) = self.resp.resp_q.get_mut(pos) else {
            return replay;
        };
        // Only a retry from a packet not yet past the original's next one can stand in for
        // its rest (a requester asks from the first packet it lacks; anything else, as a
        // forged retry, changes nothing).
        if k > *sent || kend <= *sent {
            return replay;
        }
        if kend < *npkts {
            *sent = kend;
            return replay;
        }
        self.resp.resp_q.remove(pos);
        if let RespItem::Read { replay: r, .. } = &mut replay {
            *r = false;
        }
        replay
    }

    /// The next response packet (ACK/NAK, READ response, ATOMIC ACK), if any.
    pub(super) fn next_response_packet(&mut self) -> Option<TxDesc> {
        let dest = QpNumber::new(self.attr.dest_qp_num);
        let mtu = self.mtu();
        let credits = self.credits();
        let msn_now = self.resp.msn;
        let item = self.resp.resp_q.front_mut()?;
        match item {
            RespItem::Ack { psn, syndrome, msn } => {
                let bth = BthRepr::new(Opcode::RC_ACK, dest, *psn);
                let ext = ExtRepr {
                    aeth: Some(AethRepr {
                        syndrome: *syndrome,
                        msn: *msn,
                    }),
                    ..Default::default()
                };
                self.resp.resp_q.pop_front();
                self.counters.acks_sent += 1;
                Some(TxDesc {
                    repr: RoceRepr::new(bth, ext, 0),
                    payload: PayloadSrc::None,
                })
            }
            RespItem::AtomicAck { psn, orig, msn, .. } => {
                let bth = BthRepr::new(Opcode::RC_ATOMIC_ACK, dest, *psn);
                let ext = ExtRepr {
                    aeth: Some(AethRepr {
                        syndrome: Syndrome::Ack(credits),
                        msn: *msn,
                    }),
                    atomic_ack: Some(*orig),
                    ..Default::default()
                };
                self.resp.resp_q.pop_front();
                Some(TxDesc {
                    repr: RoceRepr::new(bth, ext, 0),
                    payload: PayloadSrc::None,
                })
            }
            RespItem::Read {
                mr,
                mr_off,
                len,
                first_psn,
                npkts,
                sent,
                ..
            } => {
                let k = *sent;
                let start = k * mtu;
                let plen = (*len - start.min(*len)).min(mtu);
                // The region deregistered or invalidated since the request was accepted, or
                // (registered on demand) a page of this packet's bytes not mapped now: none
                // of its bytes leave any more; the requester gets a Remote Access Error NAK
                // at the PSN it waits for (9.7.5.2.4) in place of the rest.
                if mr.as_ref().is_some_and(|m| {
                    !m.rkey_valid() || !m.present(*mr_off + start as usize, plen as usize)
                }) {
                    let psn = first_psn.add(k);
                    self.resp.resp_q.pop_front();
                    self.counters.mr_gone += 1;
                    self.counters.err_naks_sent += 1;
                    self.counters.acks_sent += 1;
                    let bth = BthRepr::new(Opcode::RC_ACK, dest, psn);
                    let ext = ExtRepr {
                        aeth: Some(AethRepr {
                            syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                            msn: msn_now,
                        }),
                        ..Default::default()
                    };
                    return Some(TxDesc {
                        repr: RoceRepr::new(bth, ext, 0),
                        payload: PayloadSrc::None,
                    });
                }
                let first = k == 0;
                let last = k + 1 == *npkts;
                let opcode = match (first, last) {
                    (true, true) => Opcode::RC_READ_RESPONSE_ONLY,
                    (true, false) => Opcode::RC_READ_RESPONSE_FIRST,
                    (false, true) => Opcode::RC_READ_RESPONSE_LAST,
                    (false, false) => Opcode::RC_READ_RESPONSE_MIDDLE,
                };
                let bth = BthRepr::new(opcode, dest, first_psn.add(k));
                let mut ext = ExtRepr::default();
                if first || last {
                    ext.aeth = Some(AethRepr {
                        syndrome: Syndrome::Ack(credits),
                        msn: msn_now,
                    });
                }
                let payload = match mr {
                    Some(mr) if plen > 0 => PayloadSrc::Mr {
                        mr: mr.clone(),
                        off: *mr_off + start as usize,
                    },
                    _ => PayloadSrc::None,
                };
                *sent += 1;
                if last {
                    self.resp.resp_q.pop_front();
                }
                Some(TxDesc {
                    repr: RoceRepr::new(bth, ext, plen as usize),
                    payload,
                })
            }
        }
    }
}

/// An ATOMIC on the 8 bytes at `off` of `mr`, under the region's write lock, in host byte
/// order as rxe does: the original value (`None` if the region's memory is gone).
fn apply_atomic(op: Opcode, a: AtomicEthRepr, mr: &MrShared, off: usize) -> Option<u64> {
    mr.update8_at(off, |cur| {
        let orig = u64::from_ne_bytes(cur);
        let new = if op == Opcode::RC_CMP_SWAP {
            if orig == a.compare {
                a.swap_add
            } else {
                orig
            }
        } else {
            orig.wrapping_add(a.swap_add)
        };
        new.to_ne_bytes()
    })
    .map(u64::from_ne_bytes)
}

/// A SEND packet's bytes into receive WQE `rwqe` at offset `off` (`first`: the message's
/// first packet, whose receive WQE's own error is reported now; `last`: its last, whose
/// invalidation, if it carries one, is done now). Returns the R_Key invalidated.
#[allow(clippy::too_many_arguments)]
#[inline]
fn land_send(
    ctx: &Ctx<'_>,
    pd: crate::ib::mr::Pd,
    qpn: crate::wire::QpNumber,
    r: &RoceRepr,
    rwqe: &crate::ib::wqe::RecvWqe,
    off: u64,
    first: bool,
    last: bool,
    payload: &[u8],
) -> Result<Option<crate::wire::RKey>, Stop> {
    let operational = |status| {
        Stop::Fatal(
            Step::Execute,
            Fatal {
                nak: NakCode::RemoteOperationalError,
                recv_status: status,
            },
        )
    };
    if first {
        if let Some(status) = rwqe.local_err {
            return Err(operational(status));
        }
    }
    if off + payload.len() as u64 > rwqe.len {
        return Err(Stop::Fatal(Step::Execute, LENGTH));
    }
    if let Err(status) = scatter(ctx.mrs, &rwqe.sges, off, payload) {
        return Err(operational(status));
    }
    let Some(rkey) = r.ext.ieth.filter(|_| last) else {
        return Ok(None);
    };
    // SEND with invalidate (IBTA 10.6.7.2.1): the named MR's R_Key stops working. Only a key
    // the peer may use at all: a region of this QP's PD that grants a remote right (a
    // local-only region is not remotely invalidatable, as on rdma-core's providers; issue 17
    // finding 4), or a type 2 memory window bound through this QP (which is then free; a
    // type 1 window cannot be invalidated by a peer, §10.6.7.2).
    let remote = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    match ctx.mrs.by_rkey(rkey) {
        Some(mr)
            if mr.pd == pd
                && mr.access.intersects(remote)
                && mr.window != Some(crate::ib::mr::MwType::Type1)
                && mr.bound_qp.is_none_or(|q| q == qpn) =>
        {
            mr.invalidate_rkey();
            Ok(Some(rkey))
        }
        _ => Err(Stop::Fatal(
            Step::Execute,
            Fatal {
                nak: NakCode::InvalidRequest,
                recv_status: WcStatus::LocAccessErr,
            },
        )),
    }
}
