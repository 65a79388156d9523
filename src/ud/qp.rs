//! One UD queue pair: its state and the engine's contract with it (the same methods as an RC
//! QP's, see `rc/qp.rs`; what differs is said here).
//!
//! # Sending
//!
//! Each send work request is one packet: `SEND_ONLY` or `SEND_ONLY_WITH_IMMEDIATE`, BTH to the
//! destination QP, PSN from the QP's send PSN (one per packet; the receiver does not check
//! it), a DETH with the Q_Key and our QPN. The Q_Key is the request's, unless its most
//! significant bit is set: then the QP's own (IBTA Vol. 1 §10.2.4, C10-15: a consumer may not
//! send a controlled Q_Key). The outer headers come from the request's address handle, the
//! UDP source port from our QPN as rxe computes it. A message longer than the port's MTU
//! completes with a local length error (IBTA C9-? "UD messages are one packet"), and, as every
//! send error of an unreliable service does, moves the QP to SQE (IBTA §10.3.1): the requests
//! behind it are flushed, receives go on, `modify_qp(SQE → RTS)` resumes. The send completes
//! when its packet has left.
//!
//! # Receiving
//!
//! A packet is accepted in RTR, RTS, SQD and SQE. It is dropped, and counted, when its Q_Key
//! is not the QP's (`qkey_drops`, IBTA C10-23), when it carries more than the port MTU, when
//! no receive WQE is there (`no_wqe_drops`: UD has no RNR NAK), or when it does not fit the
//! WQE (`msg_drops`; without an SRQ the WQE takes the next message; with an SRQ it was taken
//! from the shared queue and completes with a remote invalid request error, as rxe does).
//! Otherwise the receive buffer gets the 40-byte GRH slot (the packet's IP header as
//! [`crate::wire::grh`] lays it out) and then the payload; the completion's byte count
//! includes the 40 bytes, it carries the source QP, `IBV_WC_GRH`, the immediate data and the
//! solicited bit. A receive WQE whose memory is not usable (a local error found when it was
//! posted, or memory gone since) fails the QP: the WQE completes with that error, the QP moves
//! to ERR and `IBV_EVENT_QP_FATAL` is raised (IBTA class A).

use crate::ib::counters::QpCounters;
use crate::ib::cq::Cq;
use crate::ib::event::AsyncEvent;
use crate::ib::mr::{gather, scatter, MrTable, Pd};
use crate::ib::path::{rxe_ud_udp_sport, Path};
use crate::ib::srq::Srq;
use crate::ib::tx::{PayloadSrc, PostError, TxDesc, TxKind};
use crate::ib::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
use crate::ib::wq::{QpInit, WorkQueues};
use crate::ib::wqe::{RecvWqe, SendWqe};
use crate::ib::wr::SendOp;
use crate::ib::{Ctx, Mtu, QpAttr, QpAttrMask, QpCap, QpState};
use crate::time::Instant;
use crate::wire::grh::{slot_from_ip_header, GRH_LEN};
use crate::wire::{BthRepr, DethRepr, ExtRepr, Opcode, PKey, Psn, QKey, QpNumber, RoceRepr};

/// The Q_Key of QP1, the general services QP (IBTA Vol. 1 §13.5.1: the GSI's well-known
/// Q_Key, a controlled one).
pub(crate) const GSI_QKEY: u32 = 0x8001_0000;

/// The remote QP a UD send completion names: none (only receives carry a source QP).
const NO_QP: QpNumber = QpNumber::new(0);

/// What `create_qp` gives a UD QP.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UdInit {
    /// What every QP type is created with.
    pub qp: QpInit,
    /// QP1, the GSI: its Q_Key is always [`GSI_QKEY`].
    pub gsi: bool,
    /// The port's active MTU: the largest UD message.
    pub port_mtu: Mtu,
}

/// A UD queue pair.
pub(crate) struct Qp {
    q: WorkQueues,
    /// QP1, the GSI.
    gsi: bool,
    /// The port's active MTU: the largest UD message.
    port_mtu: Mtu,
    attr: QpAttr,
    /// The PSN of the next packet.
    next_psn: Psn,
    /// The path of the packet [`build_tx`](Self::build_tx) built last (each UD packet takes
    /// its WQE's address handle), kept for the engine to frame it by reference.
    tx_path: Option<Path>,
}

impl Qp {
    /// A new UD QP in the RESET state.
    pub(crate) fn new(num: QpNumber, init: UdInit) -> Qp {
        let mut q = Qp {
            q: WorkQueues::new(num, init.qp),
            gsi: init.gsi,
            port_mtu: init.port_mtu,
            attr: QpAttr::default(),
            next_psn: Psn::new(0),
            tx_path: None,
        };
        q.reset_attr();
        q
    }

    fn reset_attr(&mut self) {
        self.attr = QpAttr {
            cap: self.q.init.cap,
            qkey: if self.gsi { GSI_QKEY } else { 0 },
            ..QpAttr::default()
        };
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
    /// The next PSN to send, the same (never acknowledged), and 0: a UD receiver expects no
    /// PSN.
    pub(crate) fn psns(&self) -> (Psn, Psn, Psn) {
        (self.next_psn, self.next_psn, Psn::new(0))
    }
    /// The largest message: the port's MTU.
    pub(crate) fn max_message(&self) -> u32 {
        self.port_mtu.bytes()
    }
    pub(crate) fn memory(&self) -> usize {
        std::mem::size_of::<Qp>() + self.q.memory()
    }

    /// The Q_Key a send carries: the request's, or ours for a controlled one.
    fn send_qkey(&self, wr_qkey: u32) -> u32 {
        if wr_qkey & 0x8000_0000 != 0 {
            self.attr.qkey
        } else {
            wr_qkey
        }
    }

    // ---- the verbs ---------------------------------------------------------------------

    /// `ibv_modify_qp`, checked by the device against the UD table (`next` is the state it
    /// moves to).
    pub(crate) fn modify(
        &mut self,
        ctx: &mut Ctx<'_>,
        attr: &QpAttr,
        mask: QpAttrMask,
        next: QpState,
    ) {
        self.attr.apply(attr, mask);
        if self.gsi {
            self.attr.qkey = GSI_QKEY;
        }
        if mask.contains(QpAttrMask::SQ_PSN) {
            self.next_psn = Psn::new(attr.sq_psn);
        }
        match next {
            QpState::Err if self.q.state != QpState::Err => self.enter_error(ctx, None),
            QpState::Reset => {
                self.q.reset();
                self.next_psn = Psn::new(0);
                self.reset_attr();
            }
            _ => {}
        }
        self.set_state(next);
    }

    fn set_state(&mut self, next: QpState) {
        self.q.set_state(next, "UD");
    }

    pub(crate) fn check_post_send(&self) -> Result<(), PostError> {
        self.q.check_post_send()
    }

    /// Queue a send the device checked (its destination resolved); in ERR or SQE it is flushed
    /// at once.
    pub(crate) fn post_send(&mut self, ctx: &mut Ctx<'_>, wqe: SendWqe) {
        self.q.post_send(ctx, wqe, NO_QP);
    }

    pub(crate) fn check_post_recv(&self) -> Result<(), PostError> {
        self.q.check_post_recv()
    }

    pub(crate) fn post_recv(&mut self, ctx: &mut Ctx<'_>, wqe: RecvWqe) {
        self.q.rq.post(wqe);
        if self.q.state == QpState::Err {
            self.q.flush_own_rq(ctx, |_| {});
        }
    }

    // ---- completions and errors ---------------------------------------------------------

    /// A send failed: its completion says why, the requests behind it are flushed and the QP
    /// moves to SQE (receives go on).
    fn send_error(&mut self, ctx: &mut Ctx<'_>, status: WcStatus) {
        self.q.send_error(ctx, status, NO_QP, "UD");
    }

    /// Move to ERR: everything outstanding is flushed; `event` reports why (none when the
    /// consumer asked); a QP on an SRQ says it takes no more of its WQEs.
    fn enter_error(&mut self, ctx: &mut Ctx<'_>, event: Option<AsyncEvent>) {
        self.set_state(QpState::Err);
        self.q.flush_sq(ctx, NO_QP);
        self.q.flush_own_rq(ctx, |_| {});
        self.q.raise_error_events(ctx, event);
    }

    // ---- packets in ----------------------------------------------------------------------

    /// A UD packet for this QP (the device checked address, P_Key, TVer and transport);
    /// `ip_hdr` is its IP header as received.
    pub(crate) fn handle_packet(
        &mut self,
        ctx: &mut Ctx<'_>,
        r: &RoceRepr,
        payload: &[u8],
        ip_hdr: &[u8],
    ) {
        self.q.counters.rx_packets += 1;
        self.q.counters.rx_bytes += payload.len() as u64;
        if !matches!(
            self.q.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            self.q.counters.state_drops += 1;
            return;
        }
        let Some(deth) = r.ext.deth else {
            self.q.counters.msg_drops += 1;
            return;
        };
        if deth.qkey.get() != self.attr.qkey {
            self.q.counters.qkey_drops += 1;
            tracing::trace!(qpn = %self.q.num, qkey = %deth.qkey, "UD: wrong Q_Key, dropped");
            return;
        }
        if payload.len() > self.max_message() as usize {
            self.q.counters.msg_drops += 1;
            return;
        }
        let Ok(slot) = slot_from_ip_header(ip_hdr) else {
            self.q.counters.msg_drops += 1;
            return;
        };
        let Some(w) = self.q.rq.take(ctx) else {
            self.q.counters.no_wqe_drops += 1;
            return;
        };
        if let Some(status) = w.local_err {
            self.fail_on_wqe(ctx, &w, status);
            return;
        }
        if (GRH_LEN + payload.len()) as u64 > w.len {
            self.q.counters.msg_drops += 1;
            if self.q.rq.srq().is_some() {
                let wc = WorkCompletion::blank(
                    w.wr_id,
                    WcStatus::RemInvReqErr,
                    WcOpcode::Recv,
                    self.q.num,
                );
                self.q.complete_recv(ctx, wc);
            } else {
                self.q.rq.put_back(ctx, w);
            }
            return;
        }
        let placed = scatter(ctx.mrs, &w.sges, 0, &slot)
            .and_then(|()| scatter(ctx.mrs, &w.sges, GRH_LEN as u64, payload));
        if let Err(status) = placed {
            self.fail_on_wqe(ctx, &w, status);
            return;
        }
        let mut wc = WorkCompletion::blank(w.wr_id, WcStatus::Success, WcOpcode::Recv, self.q.num);
        wc.byte_len = (GRH_LEN + payload.len()) as u32;
        wc.src_qp = deth.src_qp;
        wc.wc_flags = WcFlags::GRH;
        if let Some(imm) = r.ext.imm {
            wc.imm_data = Some(imm);
            wc.wc_flags |= WcFlags::WITH_IMM;
        }
        wc.solicited = r.bth.solicited;
        wc.pkey_index = self.attr.pkey_index;
        self.q.complete_recv(ctx, wc);
    }

    /// A receive WQE whose memory is unusable (IBTA class A): it completes with `status`, the
    /// QP fails.
    fn fail_on_wqe(&mut self, ctx: &mut Ctx<'_>, w: &RecvWqe, status: WcStatus) {
        let wc = WorkCompletion::blank(w.wr_id, status, WcOpcode::Recv, self.q.num);
        self.q.complete_recv(ctx, wc);
        self.enter_error(ctx, Some(AsyncEvent::QpFatal(self.q.num)));
    }

    // ---- packets out ---------------------------------------------------------------------

    /// Whether the QP sends a packet now: in RTS, with a request queued. (SQD starts nothing:
    /// every UD request is one packet.)
    pub(crate) fn next_tx(&self, _now: Instant) -> Option<TxKind> {
        (self.q.state == QpState::Rts && !self.q.sq.is_empty()).then_some(TxKind::Data)
    }

    /// The packet of the oldest request and the path it takes; `None` if that request fails
    /// instead (its error completion made, the QP in SQE).
    pub(crate) fn build_tx(&mut self, ctx: &mut Ctx<'_>) -> Option<(TxDesc, Path)> {
        let w = self.q.sq.front()?;
        if let Some(status) = w.local_err {
            self.send_error(ctx, status);
            return None;
        }
        if w.len > self.max_message() {
            self.send_error(ctx, WcStatus::LocLenErr);
            return None;
        }
        let Some(dest) = w.ud else {
            self.send_error(ctx, WcStatus::LocQpOpErr);
            return None;
        };
        let (opcode, imm) = match w.op {
            SendOp::Send => (Opcode::UD_SEND_ONLY, None),
            SendOp::SendWithImm { imm } => (Opcode::UD_SEND_ONLY_IMM, Some(imm)),
            _ => {
                self.send_error(ctx, WcStatus::LocQpOpErr);
                return None;
            }
        };
        let mut bth = BthRepr::new(opcode, dest.qpn, self.next_psn);
        bth.solicited = w.flags.contains(crate::ib::SendFlags::SOLICITED);
        bth.pkey = PKey::DEFAULT;
        let ext = ExtRepr {
            deth: Some(DethRepr {
                qkey: QKey(self.send_qkey(dest.qkey)),
                src_qp: self.q.num,
            }),
            imm,
            ..ExtRepr::default()
        };
        let len = w.len as usize;
        self.next_psn = self.next_psn.next();
        let mut path = dest.path;
        path.udp_sport = rxe_ud_udp_sport(self.q.num.get());
        Some((
            TxDesc {
                repr: RoceRepr::new(bth, ext, len),
                payload: PayloadSrc::Wqe { idx: 0, off: 0 },
            },
            path,
        ))
    }

    /// [`build_tx`](Self::build_tx), keeping the path for [`tx_path`](Self::tx_path).
    pub(crate) fn build_tx_keep_path(&mut self, ctx: &mut Ctx<'_>) -> Option<TxDesc> {
        let (d, path) = self.build_tx(ctx)?;
        self.tx_path = Some(path);
        Some(d)
    }

    /// The path of the packet built last by [`build_tx_keep_path`](Self::build_tx_keep_path).
    pub(crate) fn tx_path(&self) -> Option<&Path> {
        self.tx_path.as_ref()
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

    /// The packet left: its request completes.
    pub(crate) fn on_transmitted(&mut self, ctx: &mut Ctx<'_>, payload_len: usize) {
        self.q.counters.tx_packets += 1;
        self.q.counters.tx_bytes += payload_len as u64;
        self.q.complete_send_head(ctx, WcStatus::Success, NO_QP);
    }

    /// The packet could not be written (its memory is gone): the request fails.
    pub(crate) fn on_tx_error(&mut self, ctx: &mut Ctx<'_>, status: WcStatus) {
        self.send_error(ctx, status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ib::counters::DeviceCounters;
    use crate::ib::cq::CqRing;
    use crate::ib::event::EventQueue;
    use crate::ib::mr::{LKey, MrShared};
    use crate::ib::srq::{SrqRing, SrqTable};
    use crate::ib::wqe::UdSendDest;
    use crate::ib::wr::{RecvWr, SendWr, Sge};
    use crate::ib::AccessFlags;
    use crate::wire::ip::internet_checksum;
    use crate::wire::{Ecn, MacAddr, RKey};
    use std::sync::Arc;

    /// The shared objects a UD QP works on in these tests.
    struct World {
        mrs: MrTable,
        cqs: Vec<Option<CqRing>>,
        srqs: SrqTable,
        events: EventQueue,
        dev: DeviceCounters,
        mr: Arc<MrShared>,
    }

    impl World {
        fn new() -> World {
            let mut mrs = MrTable::default();
            let mr = Arc::new(MrShared::new(
                LKey(7),
                RKey(8),
                Pd(1),
                AccessFlags::LOCAL_WRITE,
                0x10000,
                8192,
            ));
            mrs.insert(mr.clone());
            World {
                mrs,
                cqs: vec![Some(CqRing::new(64)), Some(CqRing::new(64))],
                srqs: vec![Some(SrqRing::new(Pd(1), 8, 1))],
                events: EventQueue::default(),
                dev: DeviceCounters::default(),
                mr,
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
            self.cqs[cq].as_mut().unwrap().poll(&mut v, 64);
            v
        }
        fn recv_wqe(&self, id: u64, off: u64, len: u32) -> RecvWqe {
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

    fn init(srq: bool, gsi: bool) -> UdInit {
        UdInit {
            qp: QpInit {
                pd: Pd(1),
                send_cq: Cq(0),
                recv_cq: Cq(1),
                cap: QpCap {
                    max_send_wr: 8,
                    max_recv_wr: 8,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
                srq: srq.then_some(Srq(0)),
            },
            gsi,
            port_mtu: Mtu::M1024,
        }
    }

    /// A UD QP brought to RTS with Q_Key `qkey`, send PSN 100.
    fn rts(w: &mut World, num: u32, i: UdInit, qkey: u32) -> Qp {
        let mut q = Qp::new(QpNumber::new(num), i);
        let a = QpAttr {
            qkey,
            port_num: 1,
            sq_psn: 100,
            ..QpAttr::default()
        };
        let mut ctx = w.ctx();
        q.modify(
            &mut ctx,
            &a,
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
            QpState::Init,
        );
        q.modify(&mut ctx, &a, QpAttrMask::STATE, QpState::Rtr);
        q.modify(
            &mut ctx,
            &a,
            QpAttrMask::STATE | QpAttrMask::SQ_PSN,
            QpState::Rts,
        );
        q
    }

    fn v4_header(payload_len: usize) -> [u8; 20] {
        let total = (20 + 8 + payload_len) as u16;
        let mut h = [
            0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        h[2..4].copy_from_slice(&total.to_be_bytes());
        let c = internet_checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h
    }

    fn ud_packet(dst: u32, qkey: u32, src_qp: u32, imm: Option<u32>, len: usize) -> RoceRepr {
        let op = if imm.is_some() {
            Opcode::UD_SEND_ONLY_IMM
        } else {
            Opcode::UD_SEND_ONLY
        };
        let ext = ExtRepr {
            deth: Some(DethRepr {
                qkey: QKey(qkey),
                src_qp: QpNumber::new(src_qp),
            }),
            imm,
            ..ExtRepr::default()
        };
        RoceRepr::new(BthRepr::new(op, QpNumber::new(dst), Psn::new(9)), ext, len)
    }

    fn dest(qkey: u32) -> UdSendDest {
        UdSendDest {
            path: Path {
                src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
                dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
                src_ip: "10.0.0.1".parse().unwrap(),
                dst_ip: "10.0.0.2".parse().unwrap(),
                udp_sport: 0,
                dscp: 0,
                ecn: Ecn::NotEct,
                hop_limit: 64,
                flow_label: 0,
            },
            qpn: QpNumber::new(0x33),
            qkey,
        }
    }

    fn send_wqe(w: &World, id: u64, len: u32, op: SendOp, qkey: u32) -> SendWqe {
        // Odd ids unsignaled, even ones signaled.
        let flags = if id % 2 == 1 {
            crate::ib::SendFlags::empty()
        } else {
            crate::ib::SendFlags::SIGNALED
        };
        let wr = SendWr::new(
            id,
            op,
            vec![Sge {
                addr: 0x10000,
                length: len,
                lkey: LKey(7),
            }],
        )
        .with_flags(flags);
        let mut wqe = SendWqe::new(wr, len, false, &w.mrs, Pd(1), None);
        wqe.ud = Some(dest(qkey));
        wqe
    }

    #[test]
    fn a_receive_gets_the_grh_slot_then_the_payload() {
        let mut w = World::new();
        let mut q = rts(&mut w, 0x12, init(false, false), 0x1111_1111);
        let wqe = w.recv_wqe(5, 0, 40 + 100);
        q.post_recv(&mut w.ctx(), wqe);
        let payload: Vec<u8> = (0..100u8).collect();
        let r = ud_packet(0x12, 0x1111_1111, 0x44, Some(0xdead_beef), 100);
        let ip = v4_header(r.buffer_len());
        q.handle_packet(&mut w.ctx(), &r, &payload, &ip);
        let wcs = w.wcs(1);
        assert_eq!(wcs.len(), 1);
        let wc = wcs[0];
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (5, WcStatus::Success, WcOpcode::Recv)
        );
        assert_eq!(wc.byte_len, 140);
        assert_eq!(wc.src_qp, QpNumber::new(0x44));
        assert_eq!(wc.wc_flags, WcFlags::GRH | WcFlags::WITH_IMM);
        assert_eq!(wc.imm_data, Some(0xdead_beef));
        let mut buf = [0u8; 140];
        buf.copy_from_slice(&w.mr.copy_range(0..140));
        assert_eq!(buf[..20], [0u8; 20]);
        assert_eq!(buf[20..40], ip);
        assert_eq!(buf[40..], payload[..]);
    }

    #[test]
    fn wrong_qkey_no_wqe_and_too_long_are_dropped_and_counted() {
        let mut w = World::new();
        let mut q = rts(&mut w, 0x12, init(false, false), 0x1111_1111);
        let payload = [7u8; 64];
        let ip = v4_header(100);
        // No WQE.
        q.handle_packet(
            &mut w.ctx(),
            &ud_packet(0x12, 0x1111_1111, 1, None, 64),
            &payload,
            &ip,
        );
        assert_eq!(q.counters().no_wqe_drops, 1);
        let wqe = w.recv_wqe(1, 0, 40 + 32);
        q.post_recv(&mut w.ctx(), wqe);
        // Wrong Q_Key: not even a WQE is touched.
        q.handle_packet(
            &mut w.ctx(),
            &ud_packet(0x12, 0x2222_2222, 1, None, 64),
            &payload,
            &ip,
        );
        assert_eq!(q.counters().qkey_drops, 1);
        // Too long for the WQE (72 > 72? 40 + 64 = 104 > 72): dropped, the WQE stays.
        q.handle_packet(
            &mut w.ctx(),
            &ud_packet(0x12, 0x1111_1111, 1, None, 64),
            &payload,
            &ip,
        );
        assert_eq!(q.counters().msg_drops, 1);
        assert!(w.wcs(1).is_empty());
        // The WQE takes the next message that fits.
        q.handle_packet(
            &mut w.ctx(),
            &ud_packet(0x12, 0x1111_1111, 1, None, 32),
            &payload[..32],
            &ip,
        );
        let wcs = w.wcs(1);
        assert_eq!((wcs.len(), wcs[0].wr_id, wcs[0].byte_len), (1, 1, 72));
        // Beyond the port MTU (1024): dropped whatever the buffer.
        let big = vec![0u8; 1025];
        q.handle_packet(
            &mut w.ctx(),
            &ud_packet(0x12, 0x1111_1111, 1, None, 1025),
            &big,
            &ip,
        );
        assert_eq!(q.counters().msg_drops, 2);
        assert_eq!(q.state(), QpState::Rts);
    }

    #[test]
    fn a_send_is_one_packet_with_deth_and_the_controlled_qkey_rule() {
        let mut w = World::new();
        let mut q = rts(&mut w, 0x11, init(false, false), 0x1111_1111);
        let wqe = send_wqe(&w, 9, 100, SendOp::Send, 0x0000_0042);
        q.post_send(&mut w.ctx(), wqe);
        let wqe = send_wqe(&w, 10, 8, SendOp::SendWithImm { imm: 3 }, 0x8000_0001);
        q.post_send(&mut w.ctx(), wqe);
        assert_eq!(q.next_tx(Instant::ZERO), Some(TxKind::Data));
        let (d, path) = q.build_tx(&mut w.ctx()).unwrap();
        assert_eq!(d.repr.bth.opcode, Opcode::UD_SEND_ONLY);
        assert_eq!(d.repr.bth.dest_qp, QpNumber::new(0x33));
        assert_eq!(d.repr.bth.psn, Psn::new(100));
        assert!(!d.repr.bth.ack_req);
        let deth = d.repr.ext.deth.unwrap();
        assert_eq!((deth.qkey, deth.src_qp), (QKey(0x42), QpNumber::new(0x11)));
        assert_eq!(d.repr.payload_len, 100);
        // rxe's UD source port for QP 0x11.
        assert_eq!(path.udp_sport, 57236);
        q.on_transmitted(&mut w.ctx(), 100);
        // Unsignaled: no completion, but retired.
        assert!(w.wcs(0).is_empty());
        let (d, _) = q.build_tx(&mut w.ctx()).unwrap();
        assert_eq!(d.repr.bth.opcode, Opcode::UD_SEND_ONLY_IMM);
        assert_eq!(d.repr.ext.imm, Some(3));
        assert_eq!(d.repr.bth.psn, Psn::new(101));
        // A controlled Q_Key in the request: the QP's own goes out.
        assert_eq!(d.repr.ext.deth.unwrap().qkey, QKey(0x1111_1111));
        q.on_transmitted(&mut w.ctx(), 8);
        let wcs = w.wcs(0);
        assert_eq!(
            (wcs.len(), wcs[0].wr_id, wcs[0].status, wcs[0].byte_len),
            (1, 10, WcStatus::Success, 8)
        );
        assert_eq!(q.retired(), (2, 0));
        assert_eq!(q.next_tx(Instant::ZERO), None);
    }

    #[test]
    fn a_message_beyond_the_mtu_is_a_local_length_error_and_sqe() {
        let mut w = World::new();
        let mut q = rts(&mut w, 0x11, init(false, false), 1);
        for (id, len) in [(1, 1025), (2, 10)] {
            let wqe = send_wqe(&w, id, len, SendOp::Send, 1);
            q.post_send(&mut w.ctx(), wqe);
        }
        assert!(q.build_tx(&mut w.ctx()).is_none());
        let wcs = w.wcs(0);
        assert_eq!(
            wcs.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            [(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)]
        );
        assert_eq!(q.state(), QpState::Sqe);
        assert_eq!(q.next_tx(Instant::ZERO), None);
        // Receives still work in SQE.
        let wqe = w.recv_wqe(3, 0, 100);
        q.post_recv(&mut w.ctx(), wqe);
        q.handle_packet(
            &mut w.ctx(),
            &ud_packet(0x11, 1, 2, None, 4),
            &[1, 2, 3, 4],
            &v4_header(4),
        );
        assert_eq!(w.wcs(1)[0].status, WcStatus::Success);
        // SQE -> RTS resumes.
        q.modify(
            &mut w.ctx(),
            &QpAttr::default(),
            QpAttrMask::STATE,
            QpState::Rts,
        );
        let wqe = send_wqe(&w, 4, 10, SendOp::Send, 1);
        q.post_send(&mut w.ctx(), wqe);
        assert!(q.build_tx(&mut w.ctx()).is_some());
    }

    #[test]
    fn the_gsi_keeps_its_qkey() {
        let mut w = World::new();
        let mut q = rts(&mut w, 1, init(false, true), 0x1234);
        assert_eq!(q.attr().qkey, GSI_QKEY);
        let wqe = w.recv_wqe(1, 0, 40 + 256);
        q.post_recv(&mut w.ctx(), wqe);
        let mad = [1u8; 256];
        q.handle_packet(
            &mut w.ctx(),
            &ud_packet(1, 0x1234, 1, None, 256),
            &mad,
            &v4_header(256),
        );
        assert_eq!(q.counters().qkey_drops, 1);
        q.handle_packet(
            &mut w.ctx(),
            &ud_packet(1, GSI_QKEY, 1, None, 256),
            &mad,
            &v4_header(256),
        );
        assert_eq!(w.wcs(1)[0].byte_len, 296);
        // QP1 sends from rxe's port for QP1.
        let wqe = send_wqe(&w, 2, 256, SendOp::Send, GSI_QKEY);
        q.post_send(&mut w.ctx(), wqe);
        let (d, path) = q.build_tx(&mut w.ctx()).unwrap();
        assert_eq!(path.udp_sport, 55410);
        assert_eq!(d.repr.ext.deth.unwrap().qkey, QKey(GSI_QKEY));
        assert_eq!(d.repr.ext.deth.unwrap().src_qp, QpNumber::GSI);
    }

    #[test]
    fn an_empty_srq_drops_silently_and_a_bad_length_completes_the_srq_wqe() {
        let mut w = World::new();
        let mut q = rts(&mut w, 0x12, init(true, false), 5);
        let payload = [9u8; 50];
        let ip = v4_header(50);
        q.handle_packet(
            &mut w.ctx(),
            &ud_packet(0x12, 5, 1, None, 50),
            &payload,
            &ip,
        );
        assert_eq!(q.counters().no_wqe_drops, 1);
        // Receives go to the SRQ, not the QP.
        assert_eq!(q.check_post_recv(), Err(PostError::HasSrq));
        for (id, len) in [(1, 60), (2, 200)] {
            let wqe = w.recv_wqe(id, 0, len);
            w.srqs[0].as_mut().unwrap().post(wqe);
        }
        // 90 bytes into a 60-byte WQE taken from the SRQ: completed in error, not reused.
        q.handle_packet(
            &mut w.ctx(),
            &ud_packet(0x12, 5, 1, None, 50),
            &payload,
            &ip,
        );
        q.handle_packet(
            &mut w.ctx(),
            &ud_packet(0x12, 5, 1, None, 50),
            &payload,
            &ip,
        );
        let wcs = w.wcs(1);
        assert_eq!(
            wcs.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            [(1, WcStatus::RemInvReqErr), (2, WcStatus::Success)]
        );
        assert_eq!(q.retired(), (0, 2));
        // ERR: the SRQ's WQEs stay, the last-WQE event says the QP takes no more.
        q.modify(
            &mut w.ctx(),
            &QpAttr::default(),
            QpAttrMask::STATE,
            QpState::Err,
        );
        assert_eq!(
            w.events.pop(),
            Some(AsyncEvent::QpLastWqeReached(QpNumber::new(0x12)))
        );
    }

    #[test]
    fn a_receive_wqe_with_a_local_error_fails_the_qp() {
        let mut w = World::new();
        let mut q = rts(&mut w, 0x12, init(false, false), 5);
        let mut bad = w.recv_wqe(1, 0, 100);
        bad.local_err = Some(WcStatus::LocProtErr);
        q.post_recv(&mut w.ctx(), bad);
        let wqe = w.recv_wqe(2, 0, 100);
        q.post_recv(&mut w.ctx(), wqe);
        q.handle_packet(
            &mut w.ctx(),
            &ud_packet(0x12, 5, 1, None, 4),
            &[0; 4],
            &v4_header(4),
        );
        let wcs = w.wcs(1);
        assert_eq!(
            wcs.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            [(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
        );
        assert_eq!(q.state(), QpState::Err);
        assert_eq!(
            w.events.pop(),
            Some(AsyncEvent::QpFatal(QpNumber::new(0x12)))
        );
    }
}
