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
            if let Some(reth) = d.repr.ext.reth.as_mut() {
                if d.repr.bth.opcode == crate::wire::Opcode::RC_READ_REQUEST {
                    reth.dma_len = reth.dma_len.min(self.sr_read_gap_len(p));
                }
            }
            d
        })
    }

    /// A READ with selective repeat: how many bytes from its response PSN `p` up to the
    /// first response placed beyond it (the rest of the READ when none is).
    fn sr_read_gap_len(&self, p: Psn) -> u32 {
        let mtu = self.mtu();
        self.sq
            .iter()
            .find(|w| w.contains(p) && w.wqe.op.is_read())
            .and_then(|w| {
                let k = p.distance_from(w.first_psn);
                let end = w.read_ahead.as_ref()?.placed.range(k + 1..).next()?;
                Some((end - k) * mtu)
            })
            .unwrap_or(u32::MAX)
    }

    /// A READ response at `p`, ahead of the response expected for the READ WQE `idx` that
    /// holds it (selective repeat): check it as the in-order one would be, land its bytes and
    /// remember it. True if it was handled (placed, or a copy of one already placed).
    pub(super) fn sr_place_read(
        &mut self,
        ctx: &mut Ctx<'_>,
        idx: usize,
        r: &RoceRepr,
        payload: &[u8],
    ) -> bool {
        let mtu = self.mtu();
        let p = r.bth.psn;
        let Some(w) = self.sq.get(idx) else {
            return false;
        };
        if !self.sr || !w.wqe.op.is_read() || !w.contains(p) {
            return false;
        }
        // A READ response lands early only where no byte it writes can still be written by
        // anything else (otherwise it is kept and written in order): the READ's own scatter entries are disjoint (in order, where two overlap the later
        // offset's bytes win; placed out of order, a gap filled last would overwrite them),
        // and every WQE before it is a READ into other local bytes (local writes keep the
        // order of the send queue).
        let clear = !sges_overlap(&w.wqe.sges)
            && self.sq.iter().take(idx).all(|e| {
                e.wqe.op.is_read()
                    && e.wqe
                        .sges
                        .iter()
                        .all(|a| w.wqe.sges.iter().all(|b| !sge_pair_overlaps(a, b)))
            });
        let k = p.distance_from(w.first_psn);
        let off = k * mtu;
        if off < w.read_done || w.read_placed(k) {
            self.counters.dup_responses += 1;
            return true;
        }
        let want = (w.wqe.len - off).min(mtu);
        let nak = r.ext.aeth.is_some_and(|a| !a.syndrome.is_ack());
        if off >= w.wqe.len || payload.len() != want as usize || nak {
            return false;
        }
        if !clear {
            // Not yet: keep a copy (at most MAX_REORDER per QP), written in order later.
            let kept: usize = self
                .sq
                .iter()
                .filter_map(|e| e.read_ahead.as_ref())
                .map(|a| a.kept.len())
                .sum();
            if kept >= super::reorder::MAX_REORDER {
                return false;
            }
            let a = self.sq[idx].read_ahead.get_or_insert_with(Default::default);
            a.kept.insert(k, payload.to_vec());
        } else if crate::ib::mr::scatter(ctx.mrs, &w.wqe.sges, u64::from(off), payload).is_err() {
            return false;
        }
        let a = self.sq[idx].read_ahead.get_or_insert_with(Default::default);
        a.placed.insert(k);
        self.counters.reordered_kept += 1;
        true
    }

    /// Selective repeat: count in the responses placed right after the head READ's
    /// `read_done`, completing it (and the READs after it) when whole; if a gap remains
    /// behind placed responses, ask for it at once.
    pub(super) fn sr_drain_reads(&mut self, ctx: &mut Ctx<'_>) {
        let mtu = self.mtu();
        loop {
            let Some(w) = self.sq.front_mut() else {
                return;
            };
            if !w.assigned || !w.wqe.op.is_read() || !w.any_read_placed() {
                return;
            }
            let Some(ahead) = w.read_ahead.as_mut() else {
                return;
            };
            let mut failed = None;
            while ahead.placed.remove(&(w.read_done / mtu)) {
                if let Some(bytes) = ahead.kept.remove(&(w.read_done / mtu)) {
                    let at = u64::from(w.read_done);
                    if let Err(status) = crate::ib::mr::scatter(ctx.mrs, &w.wqe.sges, at, &bytes) {
                        failed = Some(status);
                        break;
                    }
                }
                w.read_done = (w.read_done + mtu).min(w.wqe.len);
            }
            if let Some(status) = failed {
                self.fail_head(ctx, status);
                return;
            }
            let done = w.read_done == w.wqe.len;
            let una = if done {
                w.last_psn().next()
            } else {
                w.first_psn.add(w.read_done / mtu)
            };
            if una.after(self.req.una) {
                self.req.una = una;
            }
            if !done {
                if self.sq[0].any_read_placed() && self.req.sr_resend.is_none() {
                    self.counters.sr_resends += 1;
                    self.req.gap_retry = Some(una);
                    self.req.sr_resend = Some(una);
                }
                return;
            }
            self.complete_send_head(ctx, crate::ib::WcStatus::Success);
        }
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

/// Whether two entries of a scatter list may share a byte of memory (same addresses, under
/// any key: two MRs may cover the same memory).
fn sges_overlap(sges: &[crate::ib::Sge]) -> bool {
    sges.iter()
        .enumerate()
        .any(|(i, a)| sges[i + 1..].iter().any(|b| sge_pair_overlaps(a, b)))
}

/// Whether two scatter entries may share a byte of memory.
fn sge_pair_overlaps(a: &crate::ib::Sge, b: &crate::ib::Sge) -> bool {
    a.length > 0
        && b.length > 0
        && a.addr < b.addr.saturating_add(u64::from(b.length))
        && b.addr < a.addr.saturating_add(u64::from(a.length))
}
