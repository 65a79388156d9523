//! The responder (IBTA 9.7.5.1): a pipeline of checks, in order, each ending in one NAK when
//! it fails — PSN → opcode sequence → operation valid → resources → length → R_Key → execute
//! → acknowledge — plus duplicate handling and the transmission of responses.
//!
//! Error classes (IBTA 9.9.3): a PSN gap gets one PSN-sequence-error NAK; an empty receive
//! queue gets an RNR NAK; an invalid request, a remote access error and a remote operational
//! error are fatal: one NAK, then the QP moves to the error state.

use super::qp::{InMsg, PayloadSrc, Qp, Resource, RespItem, TxDesc, MAX_RESP_QUEUE};
use crate::ib::mr::{scatter, MrShared};
use crate::ib::wc::{WcOpcode, WcStatus};
use crate::ib::{AccessFlags, Ctx, QpState};
use crate::wire::{
    AethRepr, BthRepr, CreditCode, ExtRepr, NakCode, OpFlags, Opcode, Psn, QpNumber, RnrTimer,
    RoceRepr, Syndrome,
};
use std::sync::Arc;

/// Why a request failed, and what each side reports.
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

impl Qp {
    fn credits(&self) -> CreditCode {
        CreditCode::from_count(self.rq.len().min(u32::MAX as usize) as u32)
    }

    fn push_resp(&mut self, item: RespItem) {
        if self.resp.resp_q.len() < MAX_RESP_QUEUE {
            self.resp.resp_q.push_back(item);
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
        let msn = self.resp.msn;
        self.push_resp(RespItem::Ack { psn, syndrome, msn });
    }

    /// A fatal request error: NAK, complete the receive WQE involved, enter the error state.
    fn fatal(&mut self, ctx: &mut Ctx<'_>, psn: Psn, f: Fatal) {
        self.counters.err_naks_sent += 1;
        self.queue_nak(psn, Syndrome::Nak(f.nak));
        let rwqe = match self.resp.in_msg.take() {
            Some(InMsg::Send { rwqe, .. }) => Some(rwqe),
            _ => self.rq.pop_front(),
        };
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

    /// Check an R_Key for `[va, va+len)` with `need` rights (IBTA 10.6.3.2, 9.7.5.1.7).
    fn check_rkey(
        &self,
        ctx: &Ctx<'_>,
        rkey: crate::wire::RKey,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Option<(Arc<MrShared>, usize)> {
        let mr = ctx.mrs.by_rkey(rkey)?;
        if !mr.rkey_valid() || mr.pd != self.pd || !mr.access.contains(need) {
            return None;
        }
        let off = mr.offset_of(va, len)?;
        Some((mr, off))
    }

    /// A request packet for this QP's responder.
    pub(crate) fn on_request(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr, payload: &[u8]) {
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            self.counters.state_drops += 1;
            return;
        }
        let op = r.bth.opcode;
        let p = r.bth.psn;
        let d = p.diff(self.resp.epsn);
        if d > 0 {
            // Out of sequence: one NAK per gap, then silence until the expected PSN arrives.
            self.counters.out_of_sequence += 1;
            if !self.resp.nak_sent {
                self.resp.nak_sent = true;
                self.counters.seq_naks_sent += 1;
                let e = self.resp.epsn;
                self.queue_nak(e, Syndrome::Nak(NakCode::PsnSequenceError));
            }
            return;
        }
        if d < 0 {
            self.duplicate(r);
            return;
        }
        self.resp.nak_sent = false;
        let f = op.flags();

        // Opcode sequence (IBTA 9.7.5.1.2): a message in progress continues with MIDDLE/LAST
        // of the same kind; otherwise a new message starts with FIRST or ONLY.
        let seq_ok = match self.resp.in_msg_op {
            Some(prev) => {
                (f.contains(OpFlags::MIDDLE)
                    || (f.contains(OpFlags::LAST) && !f.contains(OpFlags::FIRST)))
                    && (prev.is(OpFlags::SEND) == f.contains(OpFlags::SEND))
                    && (prev.is(OpFlags::WRITE) == f.contains(OpFlags::WRITE))
            }
            None => f.contains(OpFlags::FIRST),
        };
        if !seq_ok {
            self.fatal(ctx, p, INVALID);
            return;
        }

        // Operation valid for this QP (IBTA 9.7.5.1.3): RC opcodes we execute, and the QP's
        // remote access rights.
        let acc = self.attr.qp_access_flags;
        let valid = if f.contains(OpFlags::SEND) {
            true
        } else if f.contains(OpFlags::WRITE) {
            acc.contains(AccessFlags::REMOTE_WRITE)
        } else if op == Opcode::RC_READ_REQUEST {
            acc.contains(AccessFlags::REMOTE_READ)
        } else if op == Opcode::RC_CMP_SWAP || op == Opcode::RC_FETCH_ADD {
            acc.contains(AccessFlags::REMOTE_ATOMIC)
        } else {
            false // FLUSH, ATOMIC_WRITE: not supported
        };
        if !valid {
            self.fatal(ctx, p, INVALID);
            return;
        }

        // Packet length against the path MTU (IBTA 9.7.5.1.4 / C9-87..C9-90).
        let mtu = self.mtu() as usize;
        let len_ok = if f.contains(OpFlags::FULL_MTU) {
            payload.len() == mtu
        } else if f.contains(OpFlags::LAST) && !f.contains(OpFlags::FIRST) {
            (1..=mtu).contains(&payload.len())
        } else {
            payload.len() <= mtu
        };
        if !len_ok {
            self.fatal(ctx, p, INVALID);
            return;
        }

        // Resources: a receive WQE for SEND (first packet) and WRITE with immediate (last).
        let needs_rwqe = (f.contains(OpFlags::SEND) && f.contains(OpFlags::FIRST))
            || (f.contains(OpFlags::WRITE) && f.contains(OpFlags::IMMEDIATE));
        if needs_rwqe && self.rq.is_empty() {
            self.counters.rnr_naks_sent += 1;
            self.resp.nak_sent = true;
            let t = RnrTimer::new(self.attr.min_rnr_timer);
            self.queue_nak(p, Syndrome::RnrNak(t));
            return;
        }

        if f.contains(OpFlags::SEND) {
            self.exec_send(ctx, r, payload);
        } else if f.contains(OpFlags::WRITE) {
            self.exec_write(ctx, r, payload);
        } else if op == Opcode::RC_READ_REQUEST {
            self.exec_read(ctx, r);
        } else {
            self.exec_atomic(ctx, r);
        }
    }

    fn finish_packet(&mut self, r: &RoceRepr, ends_message: bool) {
        self.resp.epsn = r.bth.psn.next();
        if ends_message {
            self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
            self.resp.in_msg_op = None;
        } else {
            self.resp.in_msg_op = Some(r.bth.opcode);
        }
        if r.bth.ack_req {
            self.queue_ack(r.bth.psn);
        }
    }

    fn exec_send(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr, payload: &[u8]) {
        let f = r.bth.opcode.flags();
        let p = r.bth.psn;
        if f.contains(OpFlags::FIRST) {
            let Some(rwqe) = self.rq.pop_front() else {
                return;
            };
            if let Some(status) = rwqe.local_err {
                self.resp.in_msg = Some(InMsg::Send { rwqe, off: 0 });
                self.fatal(
                    ctx,
                    p,
                    Fatal {
                        nak: NakCode::RemoteOperationalError,
                        recv_status: status,
                    },
                );
                return;
            }
            self.resp.in_msg = Some(InMsg::Send { rwqe, off: 0 });
        }
        let Some(InMsg::Send { rwqe, off }) = &mut self.resp.in_msg else {
            self.fatal(ctx, p, INVALID);
            return;
        };
        if *off + payload.len() as u64 > rwqe.len {
            self.fatal(ctx, p, LENGTH);
            return;
        }
        if let Err(status) = scatter(ctx.mrs, &rwqe.sges, *off, payload) {
            self.fatal(
                ctx,
                p,
                Fatal {
                    nak: NakCode::RemoteOperationalError,
                    recv_status: status,
                },
            );
            return;
        }
        *off += payload.len() as u64;
        if !f.contains(OpFlags::LAST) {
            self.finish_packet(r, false);
            return;
        }
        let Some(InMsg::Send { rwqe, off }) = self.resp.in_msg.take() else {
            return;
        };
        let mut inv = None;
        if let Some(rkey) = r.ext.ieth {
            // SEND with invalidate (IBTA 10.6.7.2.1): the named MR's R_Key stops working.
            match ctx.mrs.by_rkey(rkey) {
                Some(mr) if mr.pd == self.pd => {
                    mr.invalidate_rkey();
                    inv = Some(rkey);
                }
                _ => {
                    self.resp.in_msg = Some(InMsg::Send { rwqe, off });
                    self.fatal(
                        ctx,
                        p,
                        Fatal {
                            nak: NakCode::InvalidRequest,
                            recv_status: WcStatus::LocAccessErr,
                        },
                    );
                    return;
                }
            }
        }
        self.finish_packet(r, true);
        let se = r.bth.solicited;
        self.complete_recv(
            ctx,
            &rwqe,
            WcStatus::Success,
            WcOpcode::Recv,
            off as u32,
            r.ext.imm,
            inv,
            se,
        );
    }

    fn exec_write(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr, payload: &[u8]) {
        let f = r.bth.opcode.flags();
        let p = r.bth.psn;
        if f.contains(OpFlags::FIRST) {
            let Some(reth) = r.ext.reth else { return };
            let dma_len = u64::from(reth.dma_len);
            let (mr, mr_off) = if dma_len == 0 {
                // A zero-length WRITE names no memory: no R_Key check (IBTA 9.7.5.1.7).
                (None, 0)
            } else {
                match self.check_rkey(ctx, reth.rkey, reth.va, dma_len, AccessFlags::REMOTE_WRITE) {
                    Some((mr, off)) => (Some(mr), off),
                    None => {
                        self.fatal(ctx, p, ACCESS);
                        return;
                    }
                }
            };
            self.resp.in_msg = Some(InMsg::Write {
                mr,
                mr_off,
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
            self.fatal(ctx, p, INVALID);
            return;
        };
        let end = *done + payload.len() as u64;
        if end > *dma_len || (f.contains(OpFlags::LAST) && end != *dma_len) {
            self.fatal(ctx, p, INVALID);
            return;
        }
        if let Some(mr) = mr {
            let at = *mr_off + *done as usize;
            mr.bytes_mut()[at..at + payload.len()].copy_from_slice(payload);
        }
        *done = end;
        if !f.contains(OpFlags::LAST) {
            self.finish_packet(r, false);
            return;
        }
        let total = *dma_len as u32;
        self.resp.in_msg = None;
        if let Some(imm) = r.ext.imm {
            let Some(rwqe) = self.rq.pop_front() else {
                return;
            };
            self.finish_packet(r, true);
            let se = r.bth.solicited;
            self.complete_recv(
                ctx,
                &rwqe,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                total,
                Some(imm),
                None,
                se,
            );
        } else {
            self.finish_packet(r, true);
        }
    }

    fn push_resource(&mut self, res: Resource) {
        let max = usize::from(self.attr.max_dest_rd_atomic.max(1));
        while self.resp.resources.len() >= max {
            self.resp.resources.pop_front();
        }
        self.resp.resources.push_back(res);
    }

    fn exec_read(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr) {
        let p = r.bth.psn;
        let Some(reth) = r.ext.reth else { return };
        if reth.dma_len > 1 << 31 {
            self.fatal(ctx, p, INVALID);
            return;
        }
        let (mr, mr_off) = if reth.dma_len == 0 {
            (None, 0)
        } else {
            match self.check_rkey(
                ctx,
                reth.rkey,
                reth.va,
                u64::from(reth.dma_len),
                AccessFlags::REMOTE_READ,
            ) {
                Some((mr, off)) => (Some(mr), off),
                None => {
                    self.fatal(ctx, p, ACCESS);
                    return;
                }
            }
        };
        let npkts = reth.dma_len.div_ceil(self.mtu()).max(1);
        self.push_resource(Resource::Read {
            first_psn: p,
            npkts,
            mr: mr.clone(),
            mr_off,
            len: reth.dma_len,
        });
        self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
        self.resp.epsn = p.add(npkts);
        self.resp.in_msg_op = None;
        self.push_resp(RespItem::Read {
            mr,
            mr_off,
            len: reth.dma_len,
            first_psn: p,
            npkts,
            sent: 0,
        });
    }

    fn exec_atomic(&mut self, ctx: &mut Ctx<'_>, r: &RoceRepr) {
        let p = r.bth.psn;
        let Some(a) = r.ext.atomic_eth else { return };
        if a.va % 8 != 0 {
            // Misaligned atomic (IBTA C9-... / rxe): invalid request.
            self.fatal(ctx, p, INVALID);
            return;
        }
        let Some((mr, off)) = self.check_rkey(ctx, a.rkey, a.va, 8, AccessFlags::REMOTE_ATOMIC)
        else {
            self.fatal(ctx, p, ACCESS);
            return;
        };
        // Executed once, under the region's write lock; host byte order, as rxe does.
        let orig = {
            let mut m = mr.bytes_mut();
            let mut cur = [0u8; 8];
            cur.copy_from_slice(&m[off..off + 8]);
            let orig = u64::from_ne_bytes(cur);
            let new = if r.bth.opcode == Opcode::RC_CMP_SWAP {
                if orig == a.compare {
                    a.swap_add
                } else {
                    orig
                }
            } else {
                orig.wrapping_add(a.swap_add)
            };
            m[off..off + 8].copy_from_slice(&new.to_ne_bytes());
            orig
        };
        self.push_resource(Resource::Atomic { psn: p, orig });
        self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
        self.resp.epsn = p.next();
        self.resp.in_msg_op = None;
        let msn = self.resp.msn;
        self.push_resp(RespItem::AtomicAck { psn: p, orig, msn });
    }

    /// A request whose PSN is before the expected one (IBTA 9.7.5.1.1): re-ACK SEND/WRITE,
    /// replay READ from the saved resource, return the saved ATOMIC result. Never re-execute.
    fn duplicate(&mut self, r: &RoceRepr) {
        self.counters.duplicates += 1;
        let p = r.bth.psn;
        let op = r.bth.opcode;
        let mtu = self.mtu();
        if op == Opcode::RC_READ_REQUEST {
            let found = self.resp.resources.iter().find_map(|res| match res {
                Resource::Read {
                    first_psn,
                    npkts,
                    mr,
                    mr_off,
                    len,
                } if p.distance_from(*first_psn) < *npkts => {
                    Some((*first_psn, *npkts, mr.clone(), *mr_off, *len))
                }
                _ => None,
            });
            let Some((first, npkts, mr, mr_off, len)) = found else {
                return;
            };
            let k = p.distance_from(first);
            let skip = k * mtu;
            if skip > len {
                return;
            }
            // A retried READ replaces any reply to the same request still queued.
            self.resp.resp_q.retain(|i| !matches!(i, RespItem::Read { first_psn, .. } if first.distance_from(*first_psn) < npkts || first_psn.distance_from(first) < npkts));
            self.counters.read_replays += 1;
            self.push_resp(RespItem::Read {
                mr,
                mr_off: mr_off + skip as usize,
                len: len - skip,
                first_psn: p,
                npkts: npkts - k,
                sent: 0,
            });
        } else if op == Opcode::RC_CMP_SWAP || op == Opcode::RC_FETCH_ADD {
            let orig = self.resp.resources.iter().find_map(|res| match res {
                Resource::Atomic { psn, orig } if *psn == p => Some(*orig),
                _ => None,
            });
            if let Some(orig) = orig {
                self.counters.atomic_replays += 1;
                let msn = self.resp.msn;
                self.push_resp(RespItem::AtomicAck { psn: p, orig, msn });
            }
        } else {
            let last = self.resp.epsn.sub(1);
            self.queue_ack(last);
        }
    }

    /// The next response packet (ACK/NAK, READ response, ATOMIC ACK), if any.
    pub(crate) fn next_response_packet(&mut self) -> Option<TxDesc> {
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
            RespItem::AtomicAck { psn, orig, msn } => {
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
            } => {
                let k = *sent;
                let start = k * mtu;
                let plen = (*len - start.min(*len)).min(mtu);
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
