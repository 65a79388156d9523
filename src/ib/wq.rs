//! What a queue pair of any service keeps alike: the objects it was created on, its state, its
//! two work queues with their bookkeeping, and the rules of posting and flushing that do not
//! depend on the transport.
//!
//! - Posting (IBTA Vol. 1 §11.4.1.1, `ibv_post_send`/`ibv_post_recv`): a send is refused in
//!   RESET, INIT and RTR, a receive only in RESET; a full queue refuses either.
//! - Errors (§10.3.1): in ERR every outstanding request completes with `IBV_WC_WR_FLUSH_ERR`,
//!   and in SQE those of the send queue do; a QP on a shared receive queue that enters ERR
//!   raises `IBV_EVENT_QP_LAST_WQE_REACHED` (§11.6.3.2, C11-xx: it takes no more of its WQEs).
//!
//! The unreliable services (`uc`, `ud`) keep their queues in one [`WorkQueues`]; what differs
//! between them (how a message is cut into packets, what a receive completion carries) stays
//! with each.

use super::counters::QpCounters;
use super::cq::Cq;
use super::event::AsyncEvent;
use super::mr::Pd;
use super::srq::Srq;
use super::tx::PostError;
use super::wc::{WcOpcode, WcStatus, WorkCompletion};
use super::wqe::{RecvQueue, RecvWqe, SendWqe};
use super::{Ctx, QpCap, QpState};
use crate::wire::QpNumber;
use std::collections::VecDeque;

/// What the application gives `create_qp`, for every service.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpInit {
    pub pd: Pd,
    pub send_cq: Cq,
    pub recv_cq: Cq,
    pub cap: QpCap,
    /// Every send WR generates a completion, signaled or not.
    pub sq_sig_all: bool,
    /// The shared receive queue the QP takes receive WQEs from, if any.
    pub srq: Option<Srq>,
}

/// A QP's state, work queues and queue bookkeeping (see the module's text).
pub(crate) struct WorkQueues {
    pub(crate) num: QpNumber,
    pub(crate) init: QpInit,
    pub(crate) state: QpState,
    pub(crate) sq: VecDeque<SendWqe>,
    pub(crate) rq: RecvQueue,
    pub(crate) counters: QpCounters,
    /// Send and receive WQEs that have left the queues (completed, flushed or dropped).
    pub(crate) sq_retired: u64,
    pub(crate) rq_retired: u64,
}

impl WorkQueues {
    /// Empty queues of a QP in RESET.
    pub(crate) fn new(num: QpNumber, init: QpInit) -> WorkQueues {
        WorkQueues {
            num,
            init,
            state: QpState::Reset,
            sq: VecDeque::new(),
            rq: RecvQueue::new(init.srq),
            counters: QpCounters::default(),
            sq_retired: 0,
            rq_retired: 0,
        }
    }

    /// Sent and received WQEs retired so far.
    pub(crate) fn retired(&self) -> (u64, u64) {
        (self.sq_retired, self.rq_retired)
    }

    /// The memory the queues hold, beyond the QP itself.
    pub(crate) fn memory(&self) -> usize {
        self.sq.capacity() * std::mem::size_of::<SendWqe>()
            + self.rq.own_len() * std::mem::size_of::<RecvWqe>()
    }

    /// Enter `next`, traced with the service's name.
    pub(crate) fn set_state(&mut self, next: QpState, service: &'static str) {
        if next != self.state {
            tracing::debug!(qpn = %self.num, from = %self.state, to = %next, service, "QP state");
            self.state = next;
        }
    }

    /// Whether `ibv_post_send` may queue a request now.
    pub(crate) fn check_post_send(&self) -> Result<(), PostError> {
        if matches!(self.state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(PostError::InvalidState(self.state));
        }
        if self.sq.len() >= self.init.cap.max_send_wr as usize {
            return Err(PostError::QueueFull);
        }
        Ok(())
    }

    /// Whether `ibv_post_recv` may queue a WQE now.
    pub(crate) fn check_post_recv(&self) -> Result<(), PostError> {
        if self.state == QpState::Reset {
            return Err(PostError::InvalidState(self.state));
        }
        self.rq.check_post(self.init.cap.max_recv_wr)
    }

    /// Queue a send the device checked; in ERR or SQE it is flushed at once. `src_qp` is what
    /// the QP's send completions name as the remote QP.
    pub(crate) fn post_send(&mut self, ctx: &mut Ctx<'_>, wqe: SendWqe, src_qp: QpNumber) {
        self.sq.push_back(wqe);
        if matches!(self.state, QpState::Err | QpState::Sqe) {
            self.flush_sq(ctx, src_qp);
        }
    }

    /// Retire the oldest send request with `status`; a completion is generated for an error,
    /// a signaled request or with `sq_sig_all`.
    pub(crate) fn complete_send_head(
        &mut self,
        ctx: &mut Ctx<'_>,
        status: WcStatus,
        src_qp: QpNumber,
    ) {
        let Some(w) = self.sq.pop_front() else { return };
        self.sq_retired += 1;
        if status == WcStatus::Success && !(w.signaled || self.init.sq_sig_all) {
            return;
        }
        let mut wc = WorkCompletion::blank(w.wr_id, status, w.op.wc_opcode(), self.num);
        if status == WcStatus::Success {
            wc.byte_len = w.len;
        }
        wc.src_qp = src_qp;
        ctx.complete(self.init.send_cq, wc);
        self.counters.send_completions += 1;
    }

    /// Flush every queued send request.
    pub(crate) fn flush_sq(&mut self, ctx: &mut Ctx<'_>, src_qp: QpNumber) {
        while !self.sq.is_empty() {
            self.complete_send_head(ctx, WcStatus::WrFlushErr, src_qp);
        }
    }

    /// A send failed: it completes with `status`, the requests behind it are flushed and the
    /// QP moves to SQE (receives go on).
    pub(crate) fn send_error(
        &mut self,
        ctx: &mut Ctx<'_>,
        status: WcStatus,
        src_qp: QpNumber,
        service: &'static str,
    ) {
        tracing::debug!(qpn = %self.num, %status, service, "send error: SQE");
        self.complete_send_head(ctx, status, src_qp);
        self.flush_sq(ctx, src_qp);
        if self.state != QpState::Err {
            self.set_state(QpState::Sqe, service);
        }
    }

    /// Retire a receive WQE with the completion `wc`.
    pub(crate) fn complete_recv(&mut self, ctx: &mut Ctx<'_>, wc: WorkCompletion) {
        self.rq_retired += 1;
        ctx.complete(self.init.recv_cq, wc);
        self.counters.recv_completions += 1;
    }

    /// Flush the QP's own receive WQEs (an SRQ keeps its own); `fill` completes each flush
    /// completion with what the service's receive completions carry.
    pub(crate) fn flush_own_rq(
        &mut self,
        ctx: &mut Ctx<'_>,
        mut fill: impl FnMut(&mut WorkCompletion),
    ) {
        let ws: Vec<RecvWqe> = self.rq.drain_own().collect();
        for w in ws {
            let mut wc =
                WorkCompletion::blank(w.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.num);
            fill(&mut wc);
            self.complete_recv(ctx, wc);
        }
    }

    /// The events of entering ERR (after the flushes): `event` says why (none when the
    /// consumer asked), and a QP on an SRQ says it takes no more of its WQEs.
    pub(crate) fn raise_error_events(&self, ctx: &mut Ctx<'_>, event: Option<AsyncEvent>) {
        if let Some(e) = event {
            ctx.events.push(e);
        }
        if self.rq.srq().is_some() {
            ctx.events.push(AsyncEvent::QpLastWqeReached(self.num));
        }
    }

    /// Back to RESET: every WQE is gone without a completion.
    pub(crate) fn reset(&mut self) {
        self.sq_retired += self.sq.len() as u64;
        self.sq.clear();
        self.rq_retired += self.rq.drain_own().count() as u64;
    }
}
