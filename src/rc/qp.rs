//! One RC queue pair: the state shared by its requester, completer and responder.

use crate::ib::counters::QpCounters;
use crate::ib::cq::Cq;
use crate::ib::mr::{MrShared, Pd};
use crate::ib::path::Path;
use crate::ib::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
use crate::ib::wqe::{RecvWqe, SendWqe};
use crate::ib::wr::SendOp;
use crate::ib::{Ctx, QpAttr, QpCap, QpState};
use crate::time::{Duration, Instant};
use crate::wire::{Psn, QpNumber, RoceRepr};
use std::collections::VecDeque;
use std::sync::Arc;

/// Most PSNs a requester keeps unacknowledged by default: go-back-N resends up to this many
/// packets per loss, so it is a window, not just a safety bound (far below the 2^23 the PSN
/// space allows). A READ may reserve more in one request (one PSN per response packet).
pub(crate) const DEFAULT_MAX_INFLIGHT: u32 = 256;
/// AckReq on at least every this many packets of a long message (as rxe does).
pub(crate) const ACKREQ_EVERY: u32 = 64;
/// Bound on queued responses (ACKs, read replies) per QP: a flood of duplicates cannot grow it.
pub(crate) const MAX_RESP_QUEUE: usize = 256;

/// An entry of the send queue: the posted request and the requester's progress on it.
#[derive(Debug)]
pub(crate) struct SqEntry {
    pub wqe: SendWqe,
    /// PSNs assigned (the WQE has been started).
    pub assigned: bool,
    pub first_psn: Psn,
    /// PSNs the operation consumes (READ: one per response packet).
    pub npkts: u32,
    /// READ: bytes of response received in order so far.
    pub read_done: u32,
    /// READ: the PSN of the latest READ request sent for this WQE (a retry restarts the
    /// response sequence there with FIRST/ONLY).
    pub read_req_psn: Psn,
}

impl SqEntry {
    pub(crate) fn new(wqe: SendWqe) -> SqEntry {
        SqEntry {
            wqe,
            assigned: false,
            first_psn: Psn::default(),
            npkts: 0,
            read_done: 0,
            read_req_psn: Psn::default(),
        }
    }
    pub(crate) fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts.saturating_sub(1))
    }
    pub(crate) fn contains(&self, p: Psn) -> bool {
        self.assigned && p.distance_from(self.first_psn) < self.npkts
    }
}

/// The requester's (and completer's) progress over the send queue.
#[derive(Debug, Default)]
pub(crate) struct Requester {
    /// The next PSN a new WQE will get.
    pub next_psn: Psn,
    /// Oldest PSN not yet acknowledged.
    pub una: Psn,
    /// The WQE being (re)transmitted: index into the send queue.
    pub send_idx: usize,
    /// Byte offset of the next packet inside that WQE.
    pub send_off: u32,
    /// PSN of the next packet to (re)transmit.
    pub send_psn: Psn,
    /// One past the highest PSN ever transmitted (READ requests reserve their response PSNs).
    /// PSNs in `[una, hwm)` are outstanding.
    pub hwm: Psn,
    pub retry_left: u8,
    pub rnr_left: u8,
    /// Local ACK timeout deadline (armed while PSNs are unacknowledged).
    pub retrans_at: Option<Instant>,
    /// Waiting out an RNR NAK: resend from `rnr_psn` at this time.
    pub rnr_at: Option<Instant>,
    pub rnr_psn: Psn,
    pub pkts_since_ackreq: u32,
    /// READ/ATOMIC WQEs sent and not completed (bounded by max_rd_atomic).
    pub rd_atomic_outstanding: u32,
    /// A retransmission from this PSN was started because a response showed a gap: further
    /// out-of-order responses of the same burst do not start (and pay for) another one.
    pub gap_retry: Option<Psn>,
    /// After a local ACK timeout: resend only the oldest outstanding WQE (whose last PSN this
    /// is) until it is acknowledged, then the rest. A responder that is merely slow (a long
    /// queue of READ responses) would otherwise get the whole window of duplicates on every
    /// timeout, queue them behind the originals, answer later still and time out again: a
    /// retry storm that ends in RETRY_EXC_ERR. IBTA leaves how much to resend to the requester.
    pub recovery_until: Option<Psn>,
    /// The window (see [`DEFAULT_MAX_INFLIGHT`]).
    pub max_inflight: u32,
}

/// Saved state of an executed READ or ATOMIC, for duplicates (IBTA 9.7.5.1.1).
#[derive(Debug, Clone)]
pub(crate) enum Resource {
    Read {
        first_psn: Psn,
        npkts: u32,
        mr: Option<Arc<MrShared>>,
        mr_off: usize,
        len: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
}

/// The message a responder is in the middle of.
#[derive(Debug)]
pub(crate) enum InMsg {
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

/// One queued response.
#[derive(Debug)]
pub(crate) enum RespItem {
    Ack {
        psn: Psn,
        syndrome: crate::wire::Syndrome,
        msn: u32,
    },
    Read {
        mr: Option<Arc<MrShared>>,
        mr_off: usize,
        len: u32,
        first_psn: Psn,
        npkts: u32,
        sent: u32,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
}

/// The responder's state.
#[derive(Debug, Default)]
pub(crate) struct Responder {
    /// Expected PSN.
    pub epsn: Psn,
    /// Message sequence number (24 bits).
    pub msn: u32,
    pub in_msg: Option<InMsg>,
    /// Kind of the message in progress, for the opcode-sequence check.
    pub in_msg_op: Option<crate::wire::Opcode>,
    /// A sequence-error or RNR NAK was sent and the expected PSN has not arrived since.
    pub nak_sent: bool,
    pub resources: VecDeque<Resource>,
    pub resp_q: VecDeque<RespItem>,
}

/// The queue pair.
pub(crate) struct Qp {
    pub num: QpNumber,
    pub pd: Pd,
    pub send_cq: Cq,
    pub recv_cq: Cq,
    pub sq_sig_all: bool,
    pub cap: QpCap,
    pub state: QpState,
    pub attr: QpAttr,
    pub path: Option<Path>,
    pub sq: VecDeque<SqEntry>,
    pub rq: VecDeque<RecvWqe>,
    pub req: Requester,
    pub resp: Responder,
    pub counters: QpCounters,
    /// Queued in the device's ready list.
    pub in_ready: bool,
    /// The deadline last pushed on the device's timer heap.
    pub timer_armed: Option<Instant>,
    /// Send and receive WQEs retired so far (completed, with or without a completion entry;
    /// flushed). The runtime derives the free queue slots from these.
    pub sq_retired: u64,
    pub rq_retired: u64,
    /// On the device's list of QPs touched since the runtime last looked.
    pub touched: bool,
    /// Congestion control of what this QP sends (the DCQCN reaction point, or none).
    pub cc: Box<dyn crate::cc::RateControl>,
    /// Paces this QP's payload-carrying packets at `cc`'s rate.
    pub pacer: crate::cc::Pacer,
    /// Held back by the pacer until then.
    pub pace_at: Option<Instant>,
    /// The notification point for what this QP receives (None: never send CNPs).
    pub np: Option<crate::cc::dcqcn::NotificationPoint>,
    /// A CNP is owed to the peer.
    pub cnp_due: bool,
    /// Delayed ACK (the device's `ack_delay`): a lone ACK waiting in the
    /// response queue is held back until then, or until this QP sends a request packet (the
    /// ACK then follows it in the same batch). IBTA 9.7.5.1.6 lets a responder coalesce ACKs;
    /// the requester's local ACK timeout (milliseconds) is far above the hold.
    pub ack_hold: Option<Instant>,
}

/// What the QP wants sent next: the transport part and where its payload comes from.
pub(crate) struct TxDesc {
    pub repr: RoceRepr,
    pub payload: PayloadSrc,
}

/// Where a packet's payload bytes live.
pub(crate) enum PayloadSrc {
    None,
    /// `len` bytes at message offset `off` of send WQE `idx`.
    Wqe {
        idx: usize,
        off: u32,
    },
    /// Bytes of a registered region.
    Mr {
        mr: Arc<MrShared>,
        off: usize,
    },
}

impl Qp {
    pub(crate) fn mtu(&self) -> u32 {
        self.attr.path_mtu.bytes()
    }

    /// The local ACK timeout: 4.096 µs × 2^timeout (IBTA 9.7.6.1.3); 0 disables it.
    pub(crate) fn ack_timeout(&self) -> Option<Duration> {
        match self.attr.timeout {
            0 => None,
            t => Some(Duration::from_nanos(4096u64 << u32::from(t.min(31)))),
        }
    }

    /// The earliest deadline of this QP's timers (retransmission, RNR wait, pacing, and the
    /// congestion controller's own timers).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        [
            self.req.retrans_at,
            self.req.rnr_at,
            self.pace_at,
            self.cc.next_timer(),
            self.ack_held_until(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Pacing gate for a payload-carrying packet of about `bytes` bytes: true if it must wait
    /// (and `pace_at` then says until when).
    pub(crate) fn paced_out(&mut self, now: Instant, bytes: usize) -> bool {
        if self.pacer.is_unlimited() {
            return false;
        }
        let at = self.pacer.earliest_send(now, bytes);
        if at > now {
            self.pace_at = Some(at);
            true
        } else {
            false
        }
    }

    /// Keep the pacer at the controller's current rate. Without congestion control the pacer
    /// is unlimited and stays so (the no-CC controller reports the line rate, which must not
    /// turn pacing on).
    pub(crate) fn sync_rate(&mut self, now: Instant) {
        if self.pacer.is_unlimited() {
            return;
        }
        let r = self.cc.rate_bps();
        if r != self.pacer.rate_bps() {
            self.pacer.set_rate(now, r);
        }
    }

    /// Congestion-control timers that are due.
    pub(crate) fn on_cc_timer(&mut self, now: Instant) {
        if self.pace_at.is_some_and(|t| t <= now) {
            self.pace_at = None;
        }
        if self.ack_hold.is_some_and(|t| t <= now) {
            self.ack_hold = None;
        }
        if self.cc.next_timer().is_some_and(|t| t <= now) {
            self.cc.on_timer(now);
            self.sync_rate(now);
        }
    }

    /// Whether a send completion is generated for `w` on success.
    fn signal(&self, w: &SqEntry) -> bool {
        w.wqe.signaled || self.sq_sig_all
    }

    /// Complete the oldest send WQE with `status` (pops it).
    pub(crate) fn complete_send_head(&mut self, ctx: &mut Ctx<'_>, status: WcStatus) {
        let Some(w) = self.sq.pop_front() else { return };
        self.sq_retired += 1;
        if self.req.send_idx == 0 {
            // The requester was (re)sending this very WQE (a go-back-N retry overtaken by the
            // ACK that completes it): go on from the start of the next one, not with this
            // one's offset and PSN.
            self.enter_wqe(0);
        } else {
            self.req.send_idx -= 1;
        }
        if w.assigned && w.wqe.op.is_rd_atomic() {
            self.req.rd_atomic_outstanding = self.req.rd_atomic_outstanding.saturating_sub(1);
        }
        if status != WcStatus::Success || self.signal(&w) {
            let byte_len = match w.wqe.op {
                SendOp::AtomicCmpSwp { .. } | SendOp::AtomicFetchAdd { .. } => 8,
                _ => w.wqe.len,
            };
            ctx.complete(
                self.send_cq,
                WorkCompletion {
                    wr_id: w.wqe.wr_id,
                    status,
                    opcode: w.wqe.op.wc_opcode(),
                    byte_len: if status == WcStatus::Success {
                        byte_len
                    } else {
                        0
                    },
                    imm_data: None,
                    invalidated_rkey: None,
                    qp_num: self.num,
                    src_qp: QpNumber::new(self.attr.dest_qp_num),
                    wc_flags: WcFlags::empty(),
                    solicited: false,
                },
            );
            self.counters.send_completions += 1;
        }
    }

    /// Complete a receive WQE.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn complete_recv(
        &mut self,
        ctx: &mut Ctx<'_>,
        rwqe: &RecvWqe,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        imm: Option<u32>,
        inv: Option<crate::wire::RKey>,
        solicited: bool,
    ) {
        self.rq_retired += 1;
        let mut flags = WcFlags::empty();
        flags.set(WcFlags::WITH_IMM, imm.is_some());
        flags.set(WcFlags::WITH_INV, inv.is_some());
        flags.insert(WcFlags::GRH);
        ctx.complete(
            self.recv_cq,
            WorkCompletion {
                wr_id: rwqe.wr_id,
                status,
                opcode,
                byte_len,
                imm_data: imm,
                invalidated_rkey: inv,
                qp_num: self.num,
                src_qp: QpNumber::new(self.attr.dest_qp_num),
                wc_flags: flags,
                solicited,
            },
        );
        self.counters.recv_completions += 1;
    }

    /// Move to the error state: every outstanding work request completes with a flush error
    /// (after any error completion the caller already made), timers stop. Responses already
    /// queued (the NAK that reports the error) are still sent.
    pub(crate) fn enter_error(&mut self, ctx: &mut Ctx<'_>) {
        self.state = QpState::Err;
        self.flush(ctx);
    }

    pub(crate) fn flush(&mut self, ctx: &mut Ctx<'_>) {
        while !self.sq.is_empty() {
            self.complete_send_head(ctx, WcStatus::WrFlushErr);
        }
        if let Some(InMsg::Send { rwqe, .. }) = self.resp.in_msg.take() {
            self.complete_recv(
                ctx,
                &rwqe,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
                None,
                None,
                false,
            );
        }
        while let Some(r) = self.rq.pop_front() {
            self.complete_recv(
                ctx,
                &r,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
                None,
                None,
                false,
            );
        }
        self.resp.in_msg_op = None;
        self.req.retrans_at = None;
        self.req.rnr_at = None;
        self.req.rd_atomic_outstanding = 0;
        // Responses other than NAKs are pointless now.
        self.resp
            .resp_q
            .retain(|r| matches!(r, RespItem::Ack { syndrome, .. } if !syndrome.is_ack()));
    }

    /// Whether the QP has a packet to send now.
    pub(crate) fn has_tx_work(&self) -> bool {
        let held = self.ack_held_until().is_some();
        self.cnp_due
            || (self.pace_at.is_none()
                && ((!self.resp.resp_q.is_empty() && !held) || self.requester_ready()))
            || (!held
                && self
                    .resp
                    .resp_q
                    .front()
                    .is_some_and(|r| !matches!(r, RespItem::Read { .. })))
    }

    /// The response queue holds exactly one positive ACK (nothing that must go first).
    fn lone_ack(&self) -> bool {
        self.resp.resp_q.len() == 1
            && matches!(self.resp.resp_q.front(), Some(RespItem::Ack { syndrome, .. }) if syndrome.is_ack())
    }

    /// After a request was handled: start holding a new lone ACK for `delay`.
    pub(crate) fn hold_ack(&mut self, now: Instant, delay: Duration) {
        if !self.lone_ack() {
            self.ack_hold = None;
        } else if self.ack_hold.is_none() {
            self.ack_hold = Some(now + delay);
        }
    }

    /// Until when a lone ACK is held back (a hold set for an ACK that has since gone, or that
    /// has company in the queue, holds nothing).
    fn ack_held_until(&self) -> Option<Instant> {
        self.ack_hold.filter(|_| self.lone_ack())
    }

    /// Whether a lone ACK is still held back at `now`.
    pub(crate) fn ack_held(&self, now: Instant) -> bool {
        self.ack_held_until().is_some_and(|t| now < t)
    }
}
