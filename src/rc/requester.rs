//! The requester: turns send WQEs into request packets (IBTA 9.7.4), and go-back-N
//! retransmission from a PSN.
//!
//! Its steps: [`Qp::request_gate`] says whether a packet may go now or names what it waits
//! for ([`Wait`]); [`Qp::next_request_packet`] starts the next WQE (assigns its PSNs) or
//! continues the current one; [`Qp::retry_from`] rewinds for a retry ([`Retry`] names why);
//! the timers end an RNR wait ([`Qp::on_rnr_wait_over`]) or a local ACK timeout
//! ([`Qp::on_ack_timeout`]).

use super::qp::{PayloadSrc, Qp, TxDesc};
use super::timer::Timer;
use crate::ib::wr::{SendFlags, SendOp};
use crate::ib::{Ctx, QpState, WcStatus};
use crate::wire::ext::{AtomicEthRepr, RethRepr};
use crate::wire::{BthRepr, ExtRepr, Opcode, Psn, QpNumber, RoceRepr};

/// The opcode of a SEND or WRITE packet (IBTA table 38), from the operation and the packet's
/// place in the message. A pure function: see the table test below.
pub(crate) fn next_opcode(op: &SendOp, first: bool, last: bool) -> Opcode {
    use Opcode as O;
    match (op, first, last) {
        (SendOp::Send, true, true) => O::RC_SEND_ONLY,
        (SendOp::SendWithImm { .. }, true, true) => O::RC_SEND_ONLY_IMM,
        (SendOp::SendWithInv { .. }, true, true) => O::RC_SEND_ONLY_INV,
        (SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }, true, false) => {
            O::RC_SEND_FIRST
        }
        (SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }, false, false) => {
            O::RC_SEND_MIDDLE
        }
        (SendOp::Send, false, true) => O::RC_SEND_LAST,
        (SendOp::SendWithImm { .. }, false, true) => O::RC_SEND_LAST_IMM,
        (SendOp::SendWithInv { .. }, false, true) => O::RC_SEND_LAST_INV,
        (SendOp::RdmaWrite { .. }, true, true) => O::RC_WRITE_ONLY,
        (SendOp::RdmaWriteWithImm { .. }, true, true) => O::RC_WRITE_ONLY_IMM,
        (SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. }, true, false) => {
            O::RC_WRITE_FIRST
        }
        (SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. }, false, false) => {
            O::RC_WRITE_MIDDLE
        }
        (SendOp::RdmaWrite { .. }, false, true) => O::RC_WRITE_LAST,
        (SendOp::RdmaWriteWithImm { .. }, false, true) => O::RC_WRITE_LAST_IMM,
        (SendOp::RdmaRead { .. }, _, _) => O::RC_READ_REQUEST,
        (SendOp::AtomicCmpSwp { .. }, _, _) => O::RC_CMP_SWAP,
        (SendOp::AtomicFetchAdd { .. }, _, _) => O::RC_FETCH_ADD,
        (SendOp::AtomicWrite { .. }, _, _) => O::RC_ATOMIC_WRITE,
        // Never asked: a bind or local invalidate sends no packet (`Qp::execute_local`).
        (SendOp::BindMw { .. } | SendOp::LocalInv { .. }, _, _) => O::RC_SEND_ONLY,
    }
}

/// PSNs an operation of `len` bytes consumes at path MTU `mtu`.
pub(crate) fn psns_for(op: &SendOp, len: u32, mtu: u32) -> u32 {
    if op.is_atomic() {
        1
    } else {
        len.div_ceil(mtu).max(1)
    }
}

/// What the requester waits for when it sends nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// The QP is not in RTS (or SQD, which finishes what was started).
    State,
    /// An RNR NAK is being waited out ([`Timer::Rnr`]).
    Rnr,
    /// Nothing to send: the send queue is sent up to its end.
    Empty,
    /// After a local ACK timeout only the oldest outstanding WQE is resent until it is
    /// acknowledged (see `Requester::recovery_until`).
    Recovery,
    /// The go-back-N window is full.
    Window,
    /// SQD: no new WQE is started.
    Drained,
    /// A WQE with a local error waits until everything before it has completed.
    LocalError,
    /// A memory window bind or local invalidate waits until everything before it has
    /// completed.
    LocalOp,
    /// A fenced WQE waits for the READs and ATOMICs before it.
    Fence,
    /// max_rd_atomic READs and ATOMICs are outstanding.
    RdAtomic,
}

/// Why the requester goes back to resend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// The local ACK timer expired.
    Timeout,
    /// A PSN-sequence-error NAK.
    SequenceNak,
    /// Responses showed a gap (a READ response or ATOMIC ACK missing before a later one).
    Gap,
    /// An RNR wait ended.
    Rnr,
    /// Fast recovery's probe timeout (`rc/recovery.rs`).
    Probe,
}

impl Qp {
    /// Whether the requester can put a packet on the wire now.
    pub(super) fn requester_ready(&self) -> bool {
        self.request_gate().is_ok()
    }

    /// `Ok` if the requester has a packet to send now, else what it waits for.
    pub(crate) fn request_gate(&self) -> Result<(), Wait> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return Err(Wait::State);
        }
        if self.timers.is_armed(Timer::Rnr) {
            return Err(Wait::Rnr);
        }
        if self.req.sr_resend.is_some() {
            return Ok(());
        }
        let Some(w) = self.sq.get(self.req.send_idx) else {
            return Err(Wait::Empty);
        };
        // The go-back-N window: at most max_inflight packets past the oldest unacknowledged
        // PSN (a READ request is one packet, whatever it reserves).
        let window = self.window();
        let window_open = self.req.send_psn.distance_from(self.req.una) < window;
        if w.assigned {
            if self
                .req
                .recovery_until
                .is_some_and(|r| w.first_psn.after(r))
            {
                return Err(Wait::Recovery);
            }
            return if window_open || w.wqe.op.is_rd_atomic() {
                Ok(())
            } else {
                Err(Wait::Window)
            };
        }
        if self.state == QpState::Sqd {
            return Err(Wait::Drained);
        }
        if w.wqe.local_err.is_some() {
            // Reported once everything before it has completed.
            return if self.req.una == self.req.next_psn {
                Ok(())
            } else {
                Err(Wait::LocalError)
            };
        }
        if w.wqe.op.is_local() {
            // Executed once everything before it has completed: its effect is in send-queue
            // order for the requests around it and the peer alike.
            return if self.req.una == self.req.next_psn {
                Ok(())
            } else {
                Err(Wait::LocalOp)
            };
        }
        if w.wqe.flags.contains(SendFlags::FENCE) && self.req.rd_atomic_outstanding > 0 {
            return Err(Wait::Fence);
        }
        if w.wqe.op.is_rd_atomic() {
            // With fast recovery the adaptive window also bounds the response PSNs READs
            // reserve (a lost response costs the responses queued behind it).
            let rd_window_open = !self.rec.enabled
                || self.req.una == self.req.next_psn
                || self.req.next_psn.distance_from(self.req.una) < window;
            let bound = if self.dev.exceed_rd_atomic {
                u32::MAX
            } else {
                u32::from(self.attr.max_rd_atomic.max(1))
            };
            return if self.req.rd_atomic_outstanding < bound && rd_window_open {
                Ok(())
            } else {
                Err(Wait::RdAtomic)
            };
        }
        if self.req.next_psn.distance_from(self.req.una) < window {
            Ok(())
        } else {
            Err(Wait::Window)
        }
    }

    /// Execute a memory window bind or a local invalidate (IBTA Vol. 1 §10.6.7.2, §10.6.7.3):
    /// its completion status.
    fn execute_local(&mut self, ctx: &Ctx<'_>, op: SendOp) -> WcStatus {
        crate::ib::mr::execute_local(ctx.mrs, self.pd, self.num, op)
    }

    /// Point the send pointer at the start (or resume point) of WQE `idx`.
    pub(crate) fn enter_wqe(&mut self, idx: usize) {
        self.req.send_idx = idx;
        if let Some(w) = self.sq.get(idx) {
            if w.assigned {
                let mtu = self.attr.path_mtu.bytes();
                let (off, psn) = if w.wqe.op.is_read() {
                    (w.read_done, w.first_psn.add(w.read_done / mtu))
                } else {
                    (0, w.first_psn)
                };
                self.req.send_off = off;
                self.req.send_psn = psn;
            }
        }
    }

    /// Go-back-N: resend from PSN `p` (IBTA 9.7.7.1) because of `why`. A READ resumes from its
    /// first missing response byte.
    pub(crate) fn retry_from(&mut self, p: Psn, why: Retry) {
        tracing::debug!(qpn = %self.num, psn = %p, ?why, "requester: retry");
        // Everything from `p` goes again: no lone resend is in flight any more.
        self.req.sr_sent = None;
        self.req.sr_run_end = None;
        self.rewind_to(p);
    }

    /// Point the send pointer at PSN `p` (the start of the WQE holding it, or the packet at
    /// `p` inside a SEND/WRITE, or a READ's first missing response byte).
    pub(super) fn rewind_to(&mut self, p: Psn) {
        let Some(idx) = self.sq.iter().position(|w| w.contains(p)) else {
            // Nothing sent at or after p is outstanding: continue with new work.
            let idx = self
                .sq
                .iter()
                .position(|w| !w.assigned)
                .unwrap_or(self.sq.len());
            self.req.send_idx = idx;
            return;
        };
        self.enter_wqe(idx);
        let w = &self.sq[idx];
        if !w.wqe.op.is_rd_atomic() {
            let k = p.distance_from(w.first_psn);
            self.req.send_off = k * self.mtu();
            self.req.send_psn = p;
        }
        self.req.pkts_since_ackreq = 0;
    }

    /// The next request packet, if the requester has one.
    pub(crate) fn next_request_packet(&mut self, ctx: &mut Ctx<'_>) -> Option<TxDesc> {
        if !self.requester_ready() {
            return None;
        }
        self.next_ready_request_packet(ctx)
    }

    /// [`next_request_packet`](Self::next_request_packet) once
    /// [`requester_ready`](Self::requester_ready) said yes: as [`Qp::next_tx`] did for the
    /// packet [`Qp::build_tx`] builds next, so the gate is not evaluated twice per packet.
    /// Called otherwise it still never indexes past the send queue.
    pub(super) fn next_ready_request_packet(&mut self, ctx: &mut Ctx<'_>) -> Option<TxDesc> {
        if let Some(p) = self.req.sr_resend.take() {
            if let Some(d) = self.sr_resend_packet(ctx, p) {
                if self.req.sr_run_end.is_some_and(|end| p.before(end)) {
                    self.req.sr_resend = Some(p.add(1));
                }
                return Some(d);
            }
            if !self.requester_ready() {
                return None;
            }
        }
        // Binds and local invalidates at the head, everything before them complete
        // (request_gate): executed here, one after the other, then the next request.
        while let Some(op) = self
            .sq
            .get(self.req.send_idx)
            .filter(|h| !h.assigned && h.wqe.local_err.is_none() && h.wqe.op.is_local())
            .map(|h| h.wqe.op)
        {
            let status = self.execute_local(ctx, op);
            self.complete_send_head(ctx, status);
            if status != WcStatus::Success {
                self.enter_error(ctx);
                return None;
            }
            if !self.requester_ready() {
                return None;
            }
        }
        let mtu = self.mtu();
        let idx = self.req.send_idx;
        let head = self.sq.get(idx)?;
        if !head.assigned {
            if let Some(status) = head.wqe.local_err {
                // Everything before it has completed (requester_ready checked): report it.
                self.complete_send_head(ctx, status);
                self.enter_error(ctx);
                return None;
            }
            let next = self.req.next_psn;
            let w = &mut self.sq[idx];
            w.assigned = true;
            w.first_psn = next;
            w.npkts = psns_for(&w.wqe.op, w.wqe.len, mtu);
            w.read_req_psn = next;
            self.req.next_psn = next.add(w.npkts);
            if w.wqe.op.is_rd_atomic() {
                self.req.rd_atomic_outstanding += 1;
            }
            self.enter_wqe(idx);
        }
        let psn = self.req.send_psn;
        let off = self.req.send_off;
        let dest = QpNumber::new(self.attr.dest_qp_num);
        let xrc = self.xrc == super::qp::XrcRole::Send;
        let w = &mut self.sq[idx];
        let mut bth = BthRepr::new(Opcode::RC_SEND_ONLY, dest, psn);
        let mut ext = ExtRepr::default();
        if xrc {
            ext.xrceth = Some(w.wqe.xrc_srqn);
        }
        let (payload_len, payload, done_with_wqe, psns_used);
        match w.wqe.op {
            SendOp::RdmaRead { remote_addr, rkey } => {
                bth.opcode = Opcode::RC_READ_REQUEST;
                ext.reth = Some(RethRepr {
                    va: remote_addr + u64::from(off),
                    rkey,
                    dma_len: w.wqe.len - off,
                });
                bth.ack_req = true;
                w.read_req_psn = psn;
                payload_len = 0;
                payload = PayloadSrc::None;
                done_with_wqe = true;
                psns_used = (w.wqe.len - off).div_ceil(mtu).max(1);
            }
            SendOp::AtomicCmpSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                bth.opcode = Opcode::RC_CMP_SWAP;
                ext.atomic_eth = Some(AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                });
                bth.ack_req = true;
                (payload_len, payload, done_with_wqe, psns_used) = (0, PayloadSrc::None, true, 1);
            }
            SendOp::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                bth.opcode = Opcode::RC_FETCH_ADD;
                ext.atomic_eth = Some(AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                });
                bth.ack_req = true;
                (payload_len, payload, done_with_wqe, psns_used) = (0, PayloadSrc::None, true, 1);
            }
            SendOp::AtomicWrite {
                remote_addr, rkey, ..
            } => {
                // One packet: the RETH and the 8 bytes (the WQE's inline data).
                bth.opcode = Opcode::RC_ATOMIC_WRITE;
                ext.reth = Some(RethRepr {
                    va: remote_addr,
                    rkey,
                    dma_len: 8,
                });
                bth.ack_req = true;
                payload_len = 8;
                payload = PayloadSrc::Wqe { idx, off: 0 };
                (done_with_wqe, psns_used) = (true, 1);
            }
            ref op => {
                let plen = (w.wqe.len - off).min(mtu);
                let first = off == 0;
                let last = off + plen == w.wqe.len;
                bth.opcode = next_opcode(op, first, last);
                match *op {
                    SendOp::RdmaWrite { remote_addr, rkey }
                    | SendOp::RdmaWriteWithImm {
                        remote_addr, rkey, ..
                    } if first => {
                        ext.reth = Some(RethRepr {
                            va: remote_addr,
                            rkey,
                            dma_len: w.wqe.len,
                        });
                    }
                    _ => {}
                }
                if last {
                    match *op {
                        SendOp::SendWithImm { imm } | SendOp::RdmaWriteWithImm { imm, .. } => {
                            ext.imm = Some(imm)
                        }
                        SendOp::SendWithInv { invalidate_rkey } => ext.ieth = Some(invalidate_rkey),
                        _ => {}
                    }
                    bth.solicited = w.wqe.flags.contains(SendFlags::SOLICITED);
                }
                self.req.pkts_since_ackreq += 1;
                bth.ack_req = last || self.req.pkts_since_ackreq >= self.ackreq_every();
                payload_len = plen as usize;
                payload = PayloadSrc::Wqe { idx, off };
                done_with_wqe = last;
                psns_used = 1;
            }
        }
        if bth.ack_req {
            self.req.pkts_since_ackreq = 0;
        }
        let end = psn.add(psns_used);
        if psn.before(self.req.hwm) {
            self.counters.retransmits += 1;
        } else if bth.ack_req {
            self.rec_on_first_send(psn, ctx.now);
        }
        if end.after(self.req.hwm) {
            self.req.hwm = end;
        }
        if done_with_wqe {
            self.enter_wqe(idx + 1);
        } else {
            self.req.send_off = off + payload_len as u32;
            self.req.send_psn = psn.next();
        }
        if !self.timers.is_armed(Timer::Retransmit) {
            self.arm_ack_timer(ctx.now);
        }
        Some(TxDesc {
            repr: RoceRepr::new(bth, ext, payload_len),
            payload,
        })
    }

    /// (Re)start the local ACK timer at `now` (if the QP has one: timeout 0 disables it).
    pub(super) fn arm_ack_timer(&mut self, now: crate::time::Instant) {
        self.timers
            .set(Timer::Retransmit, self.ack_timeout().map(|d| now + d));
        self.arm_probe(now);
    }

    /// [`Timer::Rnr`] fired: the RNR wait is over, resend. The local ACK timer starts again
    /// from now: whatever happened during the wait, a QP with requests outstanding always has
    /// a timer that ends in a retry or in RETRY_EXC_ERR.
    pub(super) fn on_rnr_wait_over(&mut self, now: crate::time::Instant) {
        // An ACK may have come past the NAKed PSN while we waited (a retransmitted or
        // duplicated copy got through): resend from the oldest unacknowledged PSN then,
        // or retry_from would find no WQE there and skip the outstanding ones.
        let p = if self.req.rnr_psn.before(self.req.una) {
            self.req.una
        } else {
            self.req.rnr_psn
        };
        self.retry_from(p, Retry::Rnr);
        if self.req.una == self.req.hwm {
            self.timers.stop(Timer::Retransmit);
        } else {
            self.arm_ack_timer(now);
        }
    }

    /// [`Timer::Retransmit`] fired: the local ACK timeout. Retry from the oldest
    /// unacknowledged PSN, or complete the oldest WQE with RETRY_EXC_ERR when the retries are
    /// spent.
    pub(super) fn on_ack_timeout(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        if self.req.una == self.req.hwm {
            self.timers.stop(Timer::Retransmit);
            return;
        }
        self.counters.timeouts += 1;
        self.rec_on_loss();
        // The retry below resends from `una`: responses of the old stream that still
        // arrive past that point are the same gap, not a new one (see `gap_retry`).
        self.req.gap_retry = Some(self.req.una);
        if self.req.retry_left == 0 && !(self.dev.retry_seven_forever && self.attr.retry_cnt == 7) {
            tracing::debug!(qpn = %self.num, psn = %self.req.una, "requester: retries exhausted");
            self.complete_send_head(ctx, WcStatus::RetryExcErr);
            self.enter_error(ctx);
            return;
        }
        self.req.retry_left = self.req.retry_left.saturating_sub(1);
        let una = self.req.una;
        self.retry_from(una, Retry::Timeout);
        self.req.recovery_until = self.sq.front().filter(|w| w.assigned).map(|w| w.last_psn());
        self.arm_ack_timer(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::RKey;

    #[test]
    fn opcode_table() {
        let w = SendOp::RdmaWrite {
            remote_addr: 0,
            rkey: RKey(1),
        };
        let wi = SendOp::RdmaWriteWithImm {
            remote_addr: 0,
            rkey: RKey(1),
            imm: 5,
        };
        let si = SendOp::SendWithInv {
            invalidate_rkey: RKey(3),
        };
        let cases: &[(SendOp, bool, bool, Opcode)] = &[
            (SendOp::Send, true, true, Opcode::RC_SEND_ONLY),
            (SendOp::Send, true, false, Opcode::RC_SEND_FIRST),
            (SendOp::Send, false, false, Opcode::RC_SEND_MIDDLE),
            (SendOp::Send, false, true, Opcode::RC_SEND_LAST),
            (
                SendOp::SendWithImm { imm: 1 },
                true,
                true,
                Opcode::RC_SEND_ONLY_IMM,
            ),
            (
                SendOp::SendWithImm { imm: 1 },
                false,
                true,
                Opcode::RC_SEND_LAST_IMM,
            ),
            (si, true, true, Opcode::RC_SEND_ONLY_INV),
            (si, false, true, Opcode::RC_SEND_LAST_INV),
            (si, false, false, Opcode::RC_SEND_MIDDLE),
            (w, true, true, Opcode::RC_WRITE_ONLY),
            (w, true, false, Opcode::RC_WRITE_FIRST),
            (w, false, false, Opcode::RC_WRITE_MIDDLE),
            (w, false, true, Opcode::RC_WRITE_LAST),
            (wi, true, true, Opcode::RC_WRITE_ONLY_IMM),
            (wi, true, false, Opcode::RC_WRITE_FIRST),
            (wi, false, true, Opcode::RC_WRITE_LAST_IMM),
        ];
        for (op, f, l, expect) in cases {
            assert_eq!(
                next_opcode(op, *f, *l),
                *expect,
                "{op:?} first={f} last={l}"
            );
        }
    }

    #[test]
    fn psn_consumption() {
        let r = SendOp::RdmaRead {
            remote_addr: 0,
            rkey: RKey(1),
        };
        assert_eq!(psns_for(&r, 0, 1024), 1);
        assert_eq!(psns_for(&r, 1024, 1024), 1);
        assert_eq!(psns_for(&r, 1025, 1024), 2);
        assert_eq!(psns_for(&SendOp::Send, 4096 * 3, 4096), 3);
        assert_eq!(
            psns_for(
                &SendOp::AtomicFetchAdd {
                    remote_addr: 0,
                    rkey: RKey(1),
                    add: 1
                },
                8,
                256
            ),
            1
        );
    }
}
