//! The queue pairs of the engine's table, whatever their transport: one enum over the RC, UC
//! and UD state machines, each offering the contract of `rc/qp.rs` (packets in, `next_tx`,
//! `build_tx`, payload, transmitted, timers, the verbs). The engine calls these methods and
//! never looks inside a transport.

use crate::ib::counters::QpCounters;
use crate::ib::cq::Cq;
use crate::ib::mr::{MrTable, Pd};
use crate::ib::path::Path;
use crate::ib::srq::Srq;
use crate::ib::tx::{PayloadSrc, PostError, TxDesc, TxKind};
use crate::ib::wc::WcStatus;
use crate::ib::wqe::{RecvWqe, SendWqe};
use crate::ib::{Ctx, QpAttr, QpAttrMask, QpCap, QpState, QpType};
use crate::time::Instant;
use crate::wire::{Ecn, QpNumber, RoceRepr, Transport};
use std::net::IpAddr;

/// A queue pair of any transport. (The variants differ in size; the engine keeps each QP in a
/// `Box` of its own, so the enum's size costs nothing per QP.)
#[allow(clippy::large_enum_variant)]
pub(super) enum TransportQp {
    /// Reliable Connected.
    Rc(crate::rc::qp::Qp),
    /// Unreliable Connected.
    Uc(crate::uc::qp::Qp),
    /// Unreliable Datagram (QP1 included).
    Ud(crate::ud::qp::Qp),
}

macro_rules! each {
    ($self:expr, $q:ident => $e:expr) => {
        match $self {
            TransportQp::Rc($q) => $e,
            TransportQp::Uc($q) => $e,
            TransportQp::Ud($q) => $e,
        }
    };
}

impl TransportQp {
    /// Its transport service.
    pub(super) fn qp_type(&self) -> QpType {
        match self {
            TransportQp::Rc(q) => q.qp_type(),
            TransportQp::Uc(_) => QpType::Uc,
            TransportQp::Ud(_) => QpType::Ud,
        }
    }
    /// The transport of the packets it takes (the opcode range).
    pub(super) fn transport(&self) -> Transport {
        match self {
            TransportQp::Rc(q) => q.transport(),
            TransportQp::Uc(_) => Transport::Uc,
            TransportQp::Ud(_) => Transport::Ud,
        }
    }
    /// Let a held (delayed) ACK go now; whether one was held. Only RC holds ACKs.
    pub(super) fn release_held_ack(&mut self) -> bool {
        match self {
            TransportQp::Rc(q) => q.release_held_ack(),
            _ => false,
        }
    }
    /// An XRC target's domain.
    pub(super) fn xrcd(&self) -> Option<crate::ib::srq::Xrcd> {
        match self {
            TransportQp::Rc(q) => q.xrcd(),
            _ => None,
        }
    }
    pub(super) fn num(&self) -> QpNumber {
        each!(self, q => q.num())
    }
    pub(super) fn state(&self) -> QpState {
        each!(self, q => q.state())
    }
    pub(super) fn attr(&self) -> &QpAttr {
        each!(self, q => q.attr())
    }
    pub(super) fn cap(&self) -> QpCap {
        each!(self, q => q.cap())
    }
    pub(super) fn pd(&self) -> Pd {
        each!(self, q => q.pd())
    }
    pub(super) fn send_cq(&self) -> Cq {
        each!(self, q => q.send_cq())
    }
    pub(super) fn recv_cq(&self) -> Cq {
        each!(self, q => q.recv_cq())
    }
    pub(super) fn srq(&self) -> Option<Srq> {
        each!(self, q => q.srq())
    }
    /// The CQs its completions go to now: its send and receive CQs (an XRC target, which has
    /// none, completes into the CQ of the XRC SRQ its current or last message used).
    pub(super) fn completing_cqs(&self) -> [Cq; 2] {
        match self {
            TransportQp::Rc(q) => [q.send_cq(), q.rx_cq()],
            _ => [self.send_cq(), self.recv_cq()],
        }
    }
    pub(super) fn counters(&self) -> &QpCounters {
        each!(self, q => q.counters())
    }
    pub(super) fn retired(&self) -> (u64, u64) {
        each!(self, q => q.retired())
    }
    pub(super) fn psns(&self) -> (crate::wire::Psn, crate::wire::Psn, crate::wire::Psn) {
        each!(self, q => q.psns())
    }
    pub(super) fn memory(&self) -> usize {
        each!(self, q => q.memory())
    }
    /// Its congestion-controlled rate (UC and UD are not rate controlled: the line rate).
    pub(super) fn rate_bps(&self, line_rate_bps: u64) -> u64 {
        match self {
            TransportQp::Rc(q) => q.rate_bps(),
            _ => line_rate_bps,
        }
    }
    pub(super) fn cc_alpha(&self, now: Instant) -> Option<f64> {
        match self {
            TransportQp::Rc(q) => q.cc_alpha(now),
            _ => None,
        }
    }

    /// Whether a packet from `src` may be for it: a connected QP's peer, anyone for UD.
    pub(super) fn is_peer(&self, src: IpAddr) -> bool {
        match self {
            TransportQp::Rc(q) => q.is_peer(src),
            TransportQp::Uc(q) => q.is_peer(src),
            TransportQp::Ud(_) => true,
        }
    }

    /// The largest payload one of its packets carries: the path MTU of a connected QP (once
    /// it has a path), the port MTU of a UD QP.
    pub(super) fn max_payload(&self) -> Option<u32> {
        match self {
            TransportQp::Rc(q) => q.path().map(|_| q.attr().path_mtu.bytes()),
            TransportQp::Uc(q) => q.path().map(|_| q.attr().path_mtu.bytes()),
            TransportQp::Ud(q) => Some(q.max_message()),
        }
    }

    /// Whether its packets may be IPv6 (a buffer must then hold the longer header).
    pub(super) fn may_send_ipv6(&self) -> bool {
        match self {
            TransportQp::Rc(q) => q.path().is_some_and(|p| p.src_ip.is_ipv6()),
            TransportQp::Uc(q) => q.path().is_some_and(|p| p.src_ip.is_ipv6()),
            TransportQp::Ud(_) => true,
        }
    }

    // ---- packets in, timers ------------------------------------------------------------

    /// A packet for this QP; `ip_hdr` is its IP header as received.
    pub(super) fn handle_packet(
        &mut self,
        ctx: &mut Ctx<'_>,
        ecn: Ecn,
        r: &RoceRepr,
        payload: &[u8],
        ip_hdr: &[u8],
    ) {
        match self {
            TransportQp::Rc(q) => q.handle_packet(ctx, ecn, r, payload),
            TransportQp::Uc(q) => q.handle_packet(ctx, r, payload),
            TransportQp::Ud(q) => q.handle_packet(ctx, r, payload, ip_hdr),
        }
    }

    /// A CNP for this QP's transmissions (only RC QPs are rate controlled).
    pub(super) fn handle_cnp(&mut self, now: Instant) {
        if let TransportQp::Rc(q) = self {
            q.handle_cnp(now);
        }
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        match self {
            TransportQp::Rc(q) => q.next_deadline(),
            _ => None,
        }
    }

    pub(super) fn handle_timeout(&mut self, ctx: &mut Ctx<'_>) {
        if let TransportQp::Rc(q) = self {
            q.handle_timeout(ctx);
        }
    }

    // ---- packets out -------------------------------------------------------------------

    pub(super) fn next_tx(&mut self, now: Instant) -> Option<TxKind> {
        match self {
            TransportQp::Rc(q) => q.next_tx(now),
            TransportQp::Uc(q) => q.next_tx(now),
            TransportQp::Ud(q) => q.next_tx(now),
        }
    }

    /// The packet [`next_tx`](Self::next_tx) announced; it takes [`tx_path`](Self::tx_path)
    /// (the path is not copied per packet, nor the packet moved through a tuple).
    pub(super) fn build_tx(&mut self, ctx: &mut Ctx<'_>, kind: TxKind) -> Option<TxDesc> {
        match self {
            TransportQp::Rc(q) => {
                q.path()?;
                q.build_tx(ctx, kind)
            }
            TransportQp::Uc(q) => {
                q.path()?;
                q.build_tx(ctx)
            }
            TransportQp::Ud(q) => q.build_tx_keep_path(ctx),
        }
    }

    /// The path of the packet [`build_tx`](Self::build_tx) built: an RC or UC QP's connected
    /// path, a UD packet's own (its WQE's address handle).
    pub(super) fn tx_path(&self) -> Option<&Path> {
        match self {
            TransportQp::Rc(q) => q.path(),
            TransportQp::Uc(q) => q.path(),
            TransportQp::Ud(q) => q.tx_path(),
        }
    }

    pub(super) fn write_payload(
        &self,
        mrs: &MrTable,
        src: &PayloadSrc,
        dst: &mut [u8],
    ) -> Result<(), WcStatus> {
        each!(self, q => q.write_payload(mrs, src, dst))
    }

    pub(super) fn on_transmitted(
        &mut self,
        ctx: &mut Ctx<'_>,
        kind: TxKind,
        frame_len: usize,
        payload_len: usize,
    ) {
        match self {
            TransportQp::Rc(q) => q.on_transmitted(ctx.now, kind, frame_len, payload_len),
            TransportQp::Uc(q) => q.on_transmitted(ctx, payload_len),
            TransportQp::Ud(q) => q.on_transmitted(ctx, payload_len),
        }
    }

    pub(super) fn on_tx_error(&mut self, ctx: &mut Ctx<'_>, status: WcStatus) {
        each!(self, q => q.on_tx_error(ctx, status))
    }

    // ---- the verbs ---------------------------------------------------------------------

    pub(super) fn modify(
        &mut self,
        ctx: &mut Ctx<'_>,
        attr: &QpAttr,
        mask: QpAttrMask,
        next: QpState,
        path: Option<Path>,
    ) {
        match self {
            TransportQp::Rc(q) => q.modify(ctx, attr, mask, next, path),
            TransportQp::Uc(q) => q.modify(ctx, attr, mask, next, path),
            TransportQp::Ud(q) => q.modify(ctx, attr, mask, next),
        }
    }

    pub(super) fn check_post_send(&self) -> Result<(), PostError> {
        each!(self, q => q.check_post_send())
    }

    #[inline]
    pub(super) fn post_send(&mut self, ctx: &mut Ctx<'_>, wqe: SendWqe) {
        each!(self, q => q.post_send(ctx, wqe))
    }

    pub(super) fn check_post_recv(&self) -> Result<(), PostError> {
        each!(self, q => q.check_post_recv())
    }

    #[inline]
    pub(super) fn post_recv(&mut self, ctx: &mut Ctx<'_>, wqe: RecvWqe) {
        each!(self, q => q.post_recv(ctx, wqe))
    }
}
