//! Selective repeat between two ferroce devices (optional: `DeviceConfig::selective_repeat`,
//! off by default; both ends must have it).
//!
//! In the spirit of IRN (Mittal et al., SIGCOMM 2018), without new headers: the responder
//! keeps request packets that arrive ahead of the expected PSN (up to [`MAX_REORDER`] of
//! them, within the window) instead of dropping them, still sends its one sequence-error NAK
//! for the gap, and once the missing PSN arrives runs the kept packets through the normal
//! pipeline in PSN order: every check and every semantic is that of in-order arrival, only
//! later. If a gap remains after that, it NAKs the new expected PSN at once. The requester,
//! on a sequence-error NAK, resends that one packet (with AckReq) instead of going back N;
//! its probe timeout (fast recovery, which selective repeat turns on) still goes back N when
//! a resend is lost. Against a responder without it (a standard RoCE device), each gap
//! would cost a round trip per packet dropped behind it: hence the agreement by
//! configuration on both ends.

use super::qp::Qp;
use crate::ib::Ctx;
use crate::wire::{NakCode, Psn, RoceRepr, Syndrome};

/// Most request packets a responder keeps ahead of its expected PSN (payload ≤ path MTU
/// each: at most 1 MiB per QP at MTU 4096).
pub(crate) const MAX_REORDER: usize = 256;

impl Qp {
    /// An out-of-sequence request at `r.bth.psn`: keep it if selective repeat is on, it lies
    /// within [`MAX_REORDER`] PSNs of the expected one and there is room. True if kept.
    pub(super) fn sr_keep(&mut self, r: &RoceRepr, payload: &[u8]) -> bool {
        if !self.sr {
            return false;
        }
        let d = r.bth.psn.diff(self.resp.epsn);
        if d <= 0 || d as usize > MAX_REORDER || payload.len() > self.mtu() as usize {
            return false;
        }
        let key = r.bth.psn.get();
        if self.resp.reorder.contains_key(&key) {
            // A second copy of a kept packet.
            return true;
        }
        if self.resp.reorder.len() >= MAX_REORDER {
            return false;
        }
        self.resp.reorder.insert(key, (*r, payload.to_vec()));
        self.counters.reordered_kept += 1;
        true
    }

    /// The expected PSN advanced: run the kept packets that are now in sequence through the
    /// pipeline, drop those left behind, and NAK the next gap if one remains.
    pub(super) fn sr_drain(&mut self, ctx: &mut Ctx<'_>) {
        if !self.sr || self.resp.reorder.is_empty() {
            return;
        }
        while let Some((r, payload)) = self.resp.reorder.remove(&self.resp.epsn.get()) {
            if !self.on_request_in_sequence(ctx, &r, &payload) {
                // Stopped (RNR, a fatal error): the requester resends from there.
                self.resp.reorder.clear();
                return;
            }
        }
        let epsn = self.resp.epsn;
        self.resp.reorder.retain(|&k, _| Psn::new(k).diff(epsn) > 0);
        if !self.resp.reorder.is_empty() && !self.resp.nak_sent {
            self.resp.nak_sent = true;
            self.counters.seq_naks_sent += 1;
            self.queue_seq_nak(epsn);
        }
    }

    /// Selective repeat: build the one packet at PSN `p` that a sequence-error NAK asked
    /// for (with AckReq), leaving the send pointer where it was. `None` if `p` is no longer
    /// outstanding.
    pub(super) fn sr_resend_packet(
        &mut self,
        ctx: &mut Ctx<'_>,
        p: Psn,
    ) -> Option<super::qp::TxDesc> {
        if p.before(self.req.una) || !p.before(self.req.hwm) {
            return None;
        }
        let saved = (
            self.req.send_idx,
            self.req.send_off,
            self.req.send_psn,
            self.req.pkts_since_ackreq,
            self.req.recovery_until.take(),
        );
        self.rewind_to(p);
        let d = self.next_request_packet(ctx);
        (
            self.req.send_idx,
            self.req.send_off,
            self.req.send_psn,
            self.req.pkts_since_ackreq,
            self.req.recovery_until,
        ) = saved;
        d.map(|mut d| {
            d.repr.bth.ack_req = true;
            d
        })
    }

    /// Queue a PSN-sequence-error NAK for `psn`.
    fn queue_seq_nak(&mut self, psn: Psn) {
        let msn = self.resp.msn;
        self.resp.resp_q.push_back(crate::rc::qp::RespItem::Ack {
            psn,
            syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
            msn,
        });
    }
}
