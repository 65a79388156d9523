//! The completer: ACKs, NAKs, READ responses and ATOMIC ACKs become work completions, retries
//! or errors (IBTA 9.7.5.2, 9.9.2).
//!
//! Its steps, in the order of [`Qp::on_response`]: check the state, check the PSN (a
//! duplicate or a ghost is dropped), classify the response ([`Response`]), then handle it: an
//! ACK completes SEND/WRITE WQEs ([`Qp::ack_through`]), an RNR NAK starts an RNR wait, a
//! sequence NAK a retry, another NAK fails the oldest WQE; a READ response is placed and an
//! ATOMIC ACK's value returned once the WQEs before them are implicitly acknowledged
//! ([`Qp::implicit_ack_before`]).

use super::qp::Qp;
use super::requester::Retry;
use super::timer::Timer;
use crate::ib::mr::scatter;
use crate::ib::{Ctx, QpState, WcStatus};
use crate::wire::{NakCode, OpFlags, Opcode, Psn, RnrTimer, RoceRepr, Syndrome};

/// What a response packet is, once its PSN is known to be outstanding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Response {
    /// A positive ACK.
    Ack,
    /// Receiver not ready: wait, then resend.
    RnrNak(RnrTimer),
    /// PSN sequence error: resend from the NAKed PSN.
    SequenceNak,
    /// A fatal NAK: invalid request, remote access or operational error.
    ErrorNak(NakCode),
    /// A READ response (FIRST, MIDDLE, LAST or ONLY).
    Read,
    /// An ATOMIC ACKNOWLEDGE.
    AtomicAck,
    /// A reserved AETH syndrome or an opcode that is no response.
    Bad,
    /// An ACK without an AETH (the parser never yields one): ignored.
    NoAeth,
}

impl Response {
    fn classify(r: &RoceRepr) -> Response {
        let op = r.bth.opcode;
        if op == Opcode::RC_ACK {
            match r.ext.aeth.map(|a| a.syndrome) {
                Some(Syndrome::Ack(_)) => Response::Ack,
                Some(Syndrome::RnrNak(t)) => Response::RnrNak(t),
                Some(Syndrome::Nak(NakCode::PsnSequenceError)) => Response::SequenceNak,
                Some(Syndrome::Nak(code)) => Response::ErrorNak(code),
                Some(Syndrome::Reserved(_)) => Response::Bad,
                None => Response::NoAeth,
            }
        } else if op.is(OpFlags::READ) {
            Response::Read
        } else if op == Opcode::RC_ATOMIC_ACK {
            Response::AtomicAck
        } else {
            Response::Bad
        }
    }
}

/// What acknowledging up to a PSN found.
enum Acked {
    /// WQEs up to the PSN completed (true if anything moved).
    Progress(bool),
    /// A READ or ATOMIC before the PSN has not had its response: resend from this PSN (true
    /// if WQEs before it completed first).
    Missing(Psn, bool),
}

/// Where a READ response or ATOMIC ACK falls once the WQEs before it are acknowledged.
enum RespAt {
    /// In the oldest outstanding WQE.
    Head,
    /// After an older READ/ATOMIC that has not had its response (a retry from it was started).
    Gap,
    /// In no outstanding WQE.
    Nowhere,
}

impl Qp {
    /// Acknowledge every SEND/WRITE PSN up to and including `p` (`head_only`: the oldest
    /// alone, the `ack-head-only` deviation).
    fn ack_through(&mut self, ctx: &mut Ctx<'_>, p: Psn, head_only: bool) -> Acked {
        let mut progress = false;
        while let Some(w) = self.sq.front() {
            if !w.assigned {
                break;
            }
            if w.wqe.op.is_rd_atomic() {
                if !p.before(w.first_psn) {
                    let mtu = self.mtu();
                    return Acked::Missing(w.first_psn.add(w.read_done / mtu), progress);
                }
                break;
            }
            let last = w.last_psn();
            if last.before_or_eq(p) {
                self.req.una = last.next();
                self.complete_send_head(ctx, WcStatus::Success);
                progress = true;
                if head_only {
                    // Deliberate deviation: the oldest request alone (deviations.rs).
                    break;
                }
            } else {
                if !p.before(self.req.una) {
                    self.req.una = p.next();
                    progress = true;
                    // A go-back-N retry may have rewound the send pointer into this WQE below
                    // what is now acknowledged: resume after it. Left behind `una`, the pointer
                    // is outside the window forever, and when `una` reached `hwm` no timer is
                    // armed either: the QP would never send again.
                    if self.req.send_idx == 0 && self.req.send_psn.before(self.req.una) {
                        self.rewind_to(self.req.una);
                    }
                }
                break;
            }
        }
        Acked::Progress(progress)
    }

    fn on_progress(&mut self, ctx: &mut Ctx<'_>) {
        self.rec_on_progress(ctx.now);
        if self
            .req
            .gap_retry
            .is_some_and(|q| !self.req.una.before_or_eq(q))
        {
            self.req.gap_retry = None;
        }
        if self
            .req
            .recovery_until
            .is_some_and(|r| !self.req.una.before_or_eq(r))
        {
            self.req.recovery_until = None;
        }
        self.req.retry_left = self.attr.retry_cnt;
        self.req.rnr_left = self.attr.rnr_retry;
        if self.req.una == self.req.hwm {
            self.timers.stop(Timer::Retransmit);
        } else {
            self.arm_ack_timer(ctx.now);
        }
    }

    /// A gap seen in responses: resend from `p` once per gap (see `Requester::gap_retry`).
    fn gap_retry(&mut self, ctx: &mut Ctx<'_>, p: Psn) {
        if self.req.gap_retry == Some(p) {
            // More of the stream that was in flight before the retry: the responder is alive
            // and working through its queue, our retried request is behind it. Restart the
            // local ACK timer (without refilling the retry count): a slow responder with a
            // deep queue of READ responses must not exhaust the retries while it drains it.
            self.counters.dup_responses += 1;
            if self.timers.is_armed(Timer::Retransmit) {
                self.arm_ack_timer(ctx.now);
            }
            return;
        }
        self.req.gap_retry = Some(p);
        self.seq_retry(ctx, p, Retry::Gap);
    }

    /// A NAK-like event: resend from `p`, or fail with RETRY_EXC_ERR when retries are spent.
    fn seq_retry(&mut self, ctx: &mut Ctx<'_>, p: Psn, why: Retry) {
        if self.req.retry_left == 0 {
            tracing::debug!(qpn = %self.num, psn = %p, ?why, "requester: retries exhausted");
            self.fail_head(ctx, WcStatus::RetryExcErr);
            return;
        }
        self.req.retry_left -= 1;
        let read_gap =
            why == Retry::Gap && self.sq.iter().any(|w| w.contains(p) && w.wqe.op.is_read());
        if self.sr && (why == Retry::SequenceNak || read_gap) {
            // Selective repeat: the peer kept what came after p; resend p alone. A NAK for
            // the PSN right after the last lone resend means the loss was a burst (the UDP
            // backend's GSO super-datagrams are dropped whole): resend the rest of p's WQE
            // as one run instead of paying a NAK round trip per packet. (A READ's lone
            // resend already asks for its whole gap.)
            self.counters.sr_resends += 1;
            self.req.sr_run_end = None;
            if !read_gap && self.req.sr_sent.is_some_and(|q| q.add(1) == p) {
                self.req.sr_run_end = self
                    .sq
                    .iter()
                    .find(|w| w.contains(p) && !w.wqe.op.is_read())
                    .map(|w| w.last_psn());
            }
            self.req.sr_sent = Some(p);
            self.req.sr_resend = Some(p);
            self.arm_ack_timer(ctx.now);
            return;
        }
        self.rec_on_loss();
        self.retry_from(p, why);
        self.arm_ack_timer(ctx.now);
    }

    /// Complete the oldest WQE with the error `status`; the QP moves to the error state.
    pub(super) fn fail_head(&mut self, ctx: &mut Ctx<'_>, status: WcStatus) {
        self.complete_send_head(ctx, status);
        self.enter_error(ctx);
    }

    fn handle_acked(&mut self, ctx: &mut Ctx<'_>, a: Acked) -> bool {
        match a {
            Acked::Progress(true) => {
                self.on_progress(ctx);
                true
            }
            Acked::Progress(false) => true,
            Acked::Missing(q, moved) => {
                // What completed before the missing response is progress like any other: it
                // ends a recovery that was waiting for it (else the retry below could wait
                // behind `recovery_until` for ever) and refills the retry counts.
                if moved {
                    self.on_progress(ctx);
                }
                self.gap_retry(ctx, q);
                false
            }
        }
    }

    /// A response packet (ACK, READ response, ATOMIC ACK) for this QP's requester.
    pub(super) fn on_response(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr, payload: &[u8]) {
        // Check the state.
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            self.counters.state_drops += 1;
            return;
        }
        // Check the PSN: outstanding, i.e. in [una, hwm).
        let p = r.bth.psn;
        if p.before(self.req.una) {
            self.counters.dup_responses += 1;
            return;
        }
        if !p.before(self.req.hwm) {
            // An acknowledgement of a PSN never sent.
            self.counters.ghost_acks += 1;
            return;
        }
        // Classify, then handle.
        let kind = Response::classify(r);
        if matches!(
            kind,
            Response::RnrNak(_) | Response::SequenceNak | Response::ErrorNak(_)
        ) {
            tracing::debug!(qpn = %self.num, psn = %p, nak = ?kind, "NAK received");
        }
        match kind {
            Response::Ack => {
                self.counters.acks_rcvd += 1;
                let a = self.ack_through(ctx, p, self.dev.ack_head_only);
                self.handle_acked(ctx, a);
            }
            Response::RnrNak(t) => self.on_rnr_nak(ctx, p, t),
            Response::SequenceNak if self.dev.nak_resend_from_start => {
                // Deliberate deviation: acknowledge nothing, resend from the oldest PSN.
                self.counters.seq_naks_rcvd += 1;
                self.seq_retry(ctx, self.req.una, Retry::SequenceNak);
            }
            Response::SequenceNak => {
                self.counters.seq_naks_rcvd += 1;
                let a = self.ack_through(ctx, p.sub(1), false);
                if self.handle_acked(ctx, a) {
                    self.seq_retry(ctx, p, Retry::SequenceNak);
                }
            }
            Response::ErrorNak(code) => {
                self.counters.err_naks_rcvd += 1;
                let a = self.ack_through(ctx, p.sub(1), false);
                if self.handle_acked(ctx, a) {
                    let status = match code {
                        NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                        NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                        NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                        NakCode::InvalidRdRequest => WcStatus::RemInvRdReqErr,
                        NakCode::Reserved(_) | NakCode::PsnSequenceError => WcStatus::BadRespErr,
                    };
                    self.fail_head(ctx, status);
                }
            }
            Response::Read => self.on_read_response(ctx, r, payload),
            Response::AtomicAck => self.on_atomic_ack(ctx, r),
            Response::Bad => self.fail_head(ctx, WcStatus::BadRespErr),
            Response::NoAeth => {}
        }
    }

    /// An RNR NAK at PSN `p`: the WQEs before it are acknowledged; wait out its timer and
    /// resend from `p` (rnr_retry 7 means retry forever, IBTA 9.7.5.2.8), or fail the oldest
    /// WQE with RNR_RETRY_EXC_ERR when the RNR retries are spent.
    ///
    /// An RNR NAK while a wait is already running is not acted on (counted
    /// `rnr_naks_ignored`): nothing has been resent since the wait began, so a genuine peer has
    /// nothing new to refuse, and a forged or duplicated NAK must not push the end of the wait
    /// further out (repeated before the timer ends it would stall the QP forever with
    /// rnr_retry 7; issue 17 finding 3).
    fn on_rnr_nak(&mut self, ctx: &mut Ctx<'_>, p: Psn, t: RnrTimer) {
        self.counters.rnr_naks_rcvd += 1;
        if self.timers.is_armed(Timer::Rnr) {
            self.counters.rnr_naks_ignored += 1;
            return;
        }
        let a = self.ack_through(ctx, p.sub(1), false);
        if !self.handle_acked(ctx, a) {
            return;
        }
        if self.attr.rnr_retry != 7 {
            if self.req.rnr_left == 0 {
                tracing::debug!(qpn = %self.num, psn = %p, "requester: RNR retries exhausted");
                self.fail_head(ctx, WcStatus::RnrRetryExcErr);
                return;
            }
            self.req.rnr_left -= 1;
        }
        tracing::debug!(qpn = %self.num, psn = %p, wait = ?t.duration(), "requester: RNR wait");
        self.timers.set(Timer::Rnr, Some(ctx.now + t.duration()));
        self.req.rnr_psn = p;
        self.timers.stop(Timer::Retransmit);
    }

    /// Complete the SEND/WRITE WQEs wholly before `p` (a response at `p` acknowledges them) and
    /// say where `p` falls now.
    fn implicit_ack_before(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr, payload: &[u8]) -> RespAt {
        let p = r.bth.psn;
        loop {
            let Some(w) = self.sq.front() else {
                return RespAt::Nowhere;
            };
            if !w.assigned {
                return RespAt::Nowhere;
            }
            if w.contains(p) {
                return RespAt::Head;
            }
            if !w.first_psn.before(p) {
                return RespAt::Nowhere;
            }
            if w.wqe.op.is_read() && self.dev.read_gap_completes {
                // Deliberate deviation (deviations.rs): the later response completes this
                // READ, whatever of it was not answered left unwritten.
                self.req.una = w.last_psn().next();
                self.complete_send_head(ctx, WcStatus::Success);
                self.on_progress(ctx);
                continue;
            }
            if w.wqe.op.is_rd_atomic() {
                // A later response arrived but this one's did not: resend it (selective
                // repeat: after landing the later one in its own READ).
                let q = w.first_psn.add(w.read_done / self.mtu());
                if self.sr {
                    if let Some(idx) = self.sq.iter().position(|w| w.contains(p)) {
                        self.sr_place_read(ctx, idx, r, payload);
                    }
                }
                self.gap_retry(ctx, q);
                return RespAt::Gap;
            }
            self.req.una = w.last_psn().next();
            self.complete_send_head(ctx, WcStatus::Success);
            self.on_progress(ctx);
        }
    }

    fn on_read_response(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr, payload: &[u8]) {
        let p = r.bth.psn;
        match self.implicit_ack_before(ctx, r, payload) {
            RespAt::Head => {}
            // Out of order (an earlier response is missing or late): the retry is started,
            // this one is dropped; the retried request brings it again.
            RespAt::Gap => return,
            RespAt::Nowhere => {
                if self.state == QpState::Err {
                    return;
                }
                if self.sq.front().is_some_and(|w| w.first_psn.after(p)) {
                    self.counters.dup_responses += 1;
                } else {
                    self.fail_head(ctx, WcStatus::BadRespErr);
                }
                return;
            }
        }
        let mtu = self.mtu();
        let w = &self.sq[0];
        if !w.wqe.op.is_read() {
            self.fail_head(ctx, WcStatus::BadRespErr);
            return;
        }
        let expected = w.first_psn.add(w.read_done / mtu);
        if p.before(expected) {
            self.counters.dup_responses += 1;
            return;
        }
        if p.after(expected) {
            // A response packet went missing: resume the READ from the first missing byte
            // (selective repeat: keep this one and ask for the gap alone).
            if self.sr {
                self.sr_place_read(ctx, 0, r, payload);
            }
            self.gap_retry(ctx, expected);
            return;
        }
        let remaining = w.wqe.len - w.read_done;
        let last = remaining <= mtu;
        // After a retry two response streams may overlap: the retried request's (starting with
        // FIRST/ONLY at its PSN) and stragglers of the original (MIDDLE/LAST). Both carry the
        // right bytes for their PSN. FIRST/ONLY may start only where a request started;
        // MIDDLE/LAST may not appear at the READ's first PSN.
        // With selective repeat a retry of a gap alone may start at any PSN of the READ.
        let starts_request = p == w.read_req_psn || p == w.first_psn || self.sr;
        let op = r.bth.opcode;
        let pos_ok = match (op, last) {
            (Opcode::RC_READ_RESPONSE_ONLY, true) | (Opcode::RC_READ_RESPONSE_FIRST, false) => {
                starts_request
            }
            (Opcode::RC_READ_RESPONSE_LAST, true) | (Opcode::RC_READ_RESPONSE_MIDDLE, false) => {
                p != w.first_psn
            }
            // Selective repeat: a retry of a gap alone ends before the READ does.
            (Opcode::RC_READ_RESPONSE_ONLY, false) => self.sr,
            (Opcode::RC_READ_RESPONSE_LAST, false) => self.sr && p != w.first_psn,
            _ => false,
        };
        let want_len = if last { remaining } else { mtu };
        let nak = r.ext.aeth.is_some_and(|a| !a.syndrome.is_ack());
        if !pos_ok || payload.len() != want_len as usize || nak {
            self.fail_head(ctx, WcStatus::BadRespErr);
            return;
        }
        if let Err(status) = scatter(ctx.mrs, &w.wqe.sges, u64::from(w.read_done), payload) {
            self.fail_head(ctx, status);
            return;
        }
        let w = &mut self.sq[0];
        w.read_done += payload.len() as u32;
        self.req.una = p.next();
        if last {
            self.complete_send_head(ctx, WcStatus::Success);
        }
        if self.sr {
            self.sr_drain_reads(ctx);
        }
        self.on_progress(ctx);
    }

    fn on_atomic_ack(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr) {
        let p = r.bth.psn;
        match self.implicit_ack_before(ctx, r, &[]) {
            RespAt::Head => {}
            // Out of order: dropped, the retry from the missing response is started.
            RespAt::Gap => return,
            RespAt::Nowhere => {
                if self.state != QpState::Err {
                    self.fail_head(ctx, WcStatus::BadRespErr);
                }
                return;
            }
        }
        let w = &self.sq[0];
        let ok = w.wqe.op.is_atomic()
            && w.first_psn == p
            && r.ext.aeth.is_some_and(|a| a.syndrome.is_ack())
            && r.ext.atomic_ack.is_some();
        if !ok {
            self.fail_head(ctx, WcStatus::BadRespErr);
            return;
        }
        let orig = r.ext.atomic_ack.unwrap_or(0);
        // The original value lands in local memory in host byte order, as rxe and mlx5 do.
        if let Err(status) = scatter(ctx.mrs, &w.wqe.sges, 0, &orig.to_ne_bytes()) {
            self.fail_head(ctx, status);
            return;
        }
        self.req.una = p.next();
        self.complete_send_head(ctx, WcStatus::Success);
        self.on_progress(ctx);
    }
}
