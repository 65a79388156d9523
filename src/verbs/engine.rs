//! The sans-IO engine of a [`Device`]: packets in ([`Device::handle_frame`],
//! [`Device::handle_roce`]), packets out ([`Device::poll_transmit`]) and time
//! ([`Device::poll_timeout`], [`Device::handle_timeout`]).
//!
//! # The sans-IO contract
//!
//! A `Device` never reads a clock, opens a socket or spawns a thread. Its driver (the
//! simulator, the runtime, a test) calls, in any order:
//! - [`Device::handle_frame`]`(now, frame)` for every received Ethernet frame;
//! - [`Device::poll_transmit`]`(now, buf)` until it returns `Ok(None)`, putting each frame it
//!   writes on the wire;
//! - [`Device::poll_timeout`]`()` to learn when to call [`Device::handle_timeout`]`(now)`.
//!
//! Verbs calls (`post_send`, `modify_qp`, ...) only queue work; packets leave on the next
//! `poll_transmit`. Completions are read with [`Device::poll_cq`].
//!
//! # Inside
//!
//! The engine keeps, per QP, a `Slot`: the QP and the engine's bookkeeping about it. A QP
//! with something to send (as the QP's `next_tx` says) is on the transmit list; the earliest
//! deadline of each QP is on a timer heap (entries go stale when a QP's deadline moves; a
//! stale entry is skipped). Received packets are demultiplexed by destination QPN after the
//! device-wide checks (address, P_Key, TVer, transport), and frames are built by the
//! `Framer` (`verbs/frame.rs`) from what the QP describes.

use super::device::Device;
use super::frame::{FrameError, Framer};
use super::qps::TransportQp;
use crate::ib::QpState;
use crate::ib::WcStatus;
use crate::time::Instant;
use crate::wire::{self, Ecn, MacAddr, QpNumber, Transport};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::IpAddr;

/// Why [`Device::poll_transmit`] wrote nothing into the caller's buffer. A caller's error: the
/// device takes nothing from the QP whose packet did not fit, and sends it on the next call
/// with a buffer large enough.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TransmitError {
    /// The buffer is shorter than the largest frame the next QP may send (its path MTU plus
    /// headers; see [`Device::max_frame_len`]).
    #[error("transmit buffer of {had} bytes is shorter than the {needed} bytes a frame may take")]
    BufferTooSmall {
        /// Bytes the frame may take.
        needed: usize,
        /// Bytes the buffer has.
        had: usize,
    },
}

/// A QP in the engine's table: the QP and the engine's bookkeeping about it.
pub(super) struct Slot {
    pub(super) qp: Box<TransportQp>,
    /// On the transmit list.
    in_ready: bool,
    /// The deadline last pushed on the timer heap.
    timer_armed: Option<Instant>,
    /// On the list of QPs touched since the runtime last looked.
    touched: bool,
}

impl Slot {
    pub(super) fn new(qp: TransportQp) -> Slot {
        Slot {
            qp: Box::new(qp),
            in_ready: false,
            timer_armed: None,
            touched: false,
        }
    }
}

/// The engine's scheduling state.
pub(super) struct Scheduler {
    /// QPs with something to send, in the order they got it.
    ready: VecDeque<u32>,
    /// (deadline, QPN), earliest first; stale entries are skipped.
    timers: BinaryHeap<Reverse<(Instant, u32)>>,
    /// QPs touched since the last `drain_touched`.
    touched: Vec<u32>,
    /// The latest time the driver gave (the time of verbs calls, which take none).
    pub(super) now: Instant,
    /// Frame building.
    framer: Framer,
}

impl Scheduler {
    pub(super) fn new(framer: Framer) -> Scheduler {
        Scheduler {
            ready: VecDeque::new(),
            timers: BinaryHeap::new(),
            touched: Vec::new(),
            now: Instant::ZERO,
            framer,
        }
    }

    /// [`Device::schedule`] for a QP whose slot the caller already holds (no second lookup).
    fn schedule_slot(&mut self, slot: &mut Slot, qpn: u32, now: Instant) {
        let s = self;
        if !slot.touched {
            slot.touched = true;
            s.touched.push(qpn);
        }
        if !slot.in_ready && slot.qp.next_tx(now).is_some() {
            slot.in_ready = true;
            s.ready.push_back(qpn);
        }
        if let Some(t) = slot.qp.next_deadline() {
            if slot.timer_armed.is_none_or(|a| t < a) {
                slot.timer_armed = Some(t);
                s.timers.push(Reverse((t, qpn)));
            }
        }
    }
}

impl Device {
    /// Put the QP on the transmit list if it has something to send at `now`, and (re)arm its
    /// timer.
    pub(super) fn schedule(&mut self, qpn: u32, now: Instant) {
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return;
        };
        self.sched.schedule_slot(slot, qpn, now);
    }

    /// Visit every QP touched since the last call: its state and how many send and receive
    /// work requests it has retired in total (for a runtime that tracks queue occupancy).
    pub fn drain_touched(&mut self, mut f: impl FnMut(QpNumber, QpState, u64, u64)) {
        for qpn in self.sched.touched.drain(..) {
            if let Some(slot) = self.qps.get_mut(&qpn) {
                slot.touched = false;
                let (sr, rr) = slot.qp.retired();
                f(slot.qp.num(), slot.qp.state(), sr, rr);
            }
        }
    }

    /// Let every held (delayed) ACK go at the next `poll_transmit`, as before shutting down:
    /// a peer must not be left retrying a request whose ACK the hold kept back. Returns how
    /// many QPs held one.
    pub fn release_held_acks(&mut self, now: Instant) -> usize {
        let held: Vec<u32> = self
            .qps
            .iter_mut()
            .filter_map(|(&n, slot)| slot.qp.release_held_ack().then_some(n))
            .collect();
        for &n in &held {
            self.schedule(n, now);
        }
        held.len()
    }

    /// [`release_held_acks`](Self::release_held_acks) for QP `qpn` alone (before it is
    /// destroyed). Whether it held one.
    pub fn release_held_ack(&mut self, qpn: QpNumber, now: Instant) -> bool {
        let n = qpn.get();
        let held = self
            .qps
            .get_mut(&n)
            .is_some_and(|slot| slot.qp.release_held_ack());
        if held {
            self.schedule(n, now);
        }
        held
    }

    /// The next instant `handle_timeout` has work (may be early; never late).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.sched.timers.peek().map(|Reverse((t, _))| *t)
    }

    /// Run the timers that are due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.sched.now = now;
        while let Some(&Reverse((t, qpn))) = self.sched.timers.peek() {
            if t > now {
                break;
            }
            self.sched.timers.pop();
            let Some(slot) = self.qps.get_mut(&qpn) else {
                continue;
            };
            if slot.timer_armed != Some(t) {
                continue; // stale entry
            }
            slot.timer_armed = None;
            if slot.qp.next_deadline().is_some_and(|d| d <= now) {
                let mut ctx = ctx!(self, now);
                slot.qp.handle_timeout(&mut ctx);
            }
            self.schedule(qpn, now);
        }
        self.fail_overrun_qps();
    }

    /// A completion lost to a full CQ puts the CQ in error (the `CqErr` event is raised where
    /// it happens) and every QP that completes into it in the error state, with the fatal
    /// event (IBTA 11.6.2, 11.6.3.1): nothing goes on silently after a lost completion
    /// (issue 17 finding 5). Cheap when nothing overran: one comparison.
    #[inline]
    pub(super) fn fail_overrun_qps(&mut self) {
        if self.counters.cq_overruns != self.overruns_seen {
            self.fail_overrun_qps_now();
        }
    }

    #[cold]
    fn fail_overrun_qps_now(&mut self) {
        while self.counters.cq_overruns != self.overruns_seen {
            self.overruns_seen = self.counters.cq_overruns;
            let now = self.sched.now;
            let bad = |cqs: &[Option<crate::ib::cq::CqRing>], c: crate::ib::Cq| {
                cqs.get(c.0 as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|r| r.overrun())
            };
            let mut failed = Vec::new();
            for (&qpn, slot) in self.qps.iter_mut() {
                let qp = &mut *slot.qp;
                if matches!(qp.state(), QpState::Err | QpState::Reset)
                    || !qp.completing_cqs().into_iter().any(|c| bad(&self.cqs, c))
                {
                    continue;
                }
                let mut ctx = ctx!(self, now);
                ctx.events.push(crate::ib::AsyncEvent::QpFatal(qp.num()));
                let attr = crate::ib::QpAttr {
                    qp_state: QpState::Err,
                    ..Default::default()
                };
                qp.modify(
                    &mut ctx,
                    &attr,
                    crate::ib::QpAttrMask::STATE,
                    QpState::Err,
                    None,
                );
                failed.push(qpn);
            }
            for qpn in failed {
                self.schedule(qpn, now);
            }
        }
    }

    /// Receive one Ethernet frame.
    ///
    /// The checks that drop a frame not meant for this device or any of its QPs (the
    /// Ethernet and IP destination, TVer and P_Key, the transport, the destination QPN, the
    /// QP's transport and peer) run before the ICRC, which is a CRC pass over the whole
    /// frame: a flood of such frames costs a parse and a table lookup each, no CRC and no
    /// per-QP state. The ICRC is checked before anything reads or changes the QP. A frame
    /// is counted at the first check it fails in that order, so a frame with a bad ICRC
    /// *and* an unknown QPN (or a wrong address, P_Key, transport or source) lands in that
    /// check's counter, not in `icrc_drops`; either way it is dropped silently (IBTA drops
    /// both without a response, and fixes no order between these silent drops).
    pub fn handle_frame(&mut self, now: Instant, frame: &[u8]) {
        self.receive_frame(now, frame, false);
    }

    /// [`Self::handle_frame`] for a frame whose ICRC the caller has already computed over
    /// exactly these bytes and found matching (a packet device that must compute it anyway:
    /// the UDP socket's, which recovers the IPv4 identification from it). Every other check
    /// is made as for any frame; only the second CRC pass is saved.
    pub fn handle_checked_frame(&mut self, now: Instant, frame: &[u8]) {
        self.receive_frame(now, frame, true);
    }

    fn receive_frame(&mut self, now: Instant, frame: &[u8], icrc_checked: bool) {
        self.counters.rx_frames += 1;
        // Decode once, the ICRC left for later. Bound by reference: the parsed frame is
        // large, and is not moved out of the Result.
        let decoded = wire::packet::decode_frame_unchecked(frame);
        let p = match &decoded {
            Ok(p) => p,
            Err(e) => {
                self.count_parse_error(*e);
                return;
            }
        };
        if let Some(e) = p.repr.eth {
            // The all-zero MAC is what a socket backend synthesises (the kernel took the real
            // Ethernet header off); it never appears on a real wire, so only a device behind
            // such a backend takes it.
            let zero_ok = self.cfg.accept_zero_dst_mac && e.dst == MacAddr::ZERO;
            // A multicast MAC while a group is joined: the IP group is checked below.
            let mcast_ok = e.dst.0[0] & 1 == 1 && !self.mcast.is_empty();
            if e.dst != self.cfg.mac && e.dst != MacAddr::BROADCAST && !zero_ok && !mcast_ok {
                self.counters.address_drops += 1;
                return;
            }
        }
        let (src, dst, ecn) = (p.repr.ip.src(), p.repr.ip.dst(), p.repr.ip.ecn());
        let ip_hdr = frame.get(p.offsets.ip..p.offsets.udp).unwrap_or(&[]);
        let learned = p.repr.eth.map(|e| e.src);
        let lax = icrc_checked || cfg!(fuzzing) || self.cfg.deviations.accept_bad_icrc;
        let icrc_ok = || lax || wire::packet::frame_icrc(frame, &p.offsets) == p.icrc_stored;
        self.receive(
            now,
            Received {
                src,
                dst,
                ecn,
                ip_hdr,
                learned,
            },
            &p.repr.roce,
            p.payload,
            icrc_ok,
        );
    }

    fn count_parse_error(&mut self, e: wire::Error) {
        match e {
            wire::Error::BadIcrc { .. } => self.counters.icrc_drops += 1,
            wire::Error::NotRoceV2Port(_) | wire::Error::NotUdp(_) | wire::Error::NotIp(_) => {
                self.counters.not_roce += 1
            }
            _ => self.counters.malformed_drops += 1,
        }
    }

    /// Receive one already-parsed RoCE packet (for backends that see only the UDP payload).
    /// A UD receive's GRH slot then holds an IP header rebuilt from `src`, `dst` and `ecn`
    /// (TTL 64, DF, identification 0), as the packet would have arrived.
    pub fn handle_roce(
        &mut self,
        now: Instant,
        src: IpAddr,
        dst: IpAddr,
        ecn: Ecn,
        r: &wire::RoceRepr,
        payload: &[u8],
    ) {
        let mut hdr = [0u8; wire::ip::IPV6_HEADER_LEN];
        let n = rebuilt_ip_header(&mut hdr, src, dst, ecn, r.buffer_len());
        let rx = Received {
            src,
            dst,
            ecn,
            ip_hdr: &hdr[..n],
            learned: None,
        };
        // The ICRC is not on a packet handed up without it (the backend checked or rebuilt it).
        self.receive(now, rx, r, payload, || true);
    }

    /// The receive path after parsing: the device's checks (address, P_Key, TVer, transport),
    /// the demultiplexing by destination QPN, then `icrc_ok` (the ICRC, computed only for a
    /// frame that passed them), and the QP.
    fn receive(
        &mut self,
        now: Instant,
        rx: Received<'_>,
        r: &wire::RoceRepr,
        payload: &[u8],
        icrc_ok: impl FnOnce() -> bool,
    ) {
        self.sched.now = now;
        let mcast = rx.dst.is_multicast();
        if !mcast && !self.cfg.gids.contains(&rx.dst) {
            self.counters.address_drops += 1;
            return;
        }
        let b = &r.bth;
        if b.tver != 0 || (b.pkey.0 & 0x7fff) != 0x7fff {
            self.counters.header_drops += 1;
            return;
        }
        let is_cnp = b.opcode == wire::Opcode::CNP;
        if !is_cnp
            && !matches!(
                b.opcode.transport(),
                Transport::Rc | Transport::Uc | Transport::Ud | Transport::Xrc
            )
        {
            self.counters.header_drops += 1;
            return;
        }
        let qpn = b.dest_qp.get();
        if mcast {
            if !icrc_ok() {
                self.counters.icrc_drops += 1;
                return;
            }
            self.receive_mcast(now, rx, r, payload);
            return;
        }
        let Some(slot) = self.qps.get_mut(&qpn) else {
            self.counters.unknown_qp_drops += 1;
            return;
        };
        if !is_cnp && b.opcode.transport() != slot.qp.transport() {
            // An opcode of another service than the QP's (IBTA C9-54: silently dropped).
            self.counters.header_drops += 1;
            return;
        }
        if !slot.qp.is_peer(rx.src) {
            self.counters.address_drops += 1;
            return;
        }
        if !icrc_ok() {
            self.counters.icrc_drops += 1;
            return;
        }
        if is_cnp {
            self.counters.cnps_rcvd += 1;
            // The reaction point: a CNP names the QP whose packets were marked (its DestQP is
            // our QPN, as the peer's notification point addresses it).
            slot.qp.handle_cnp(now);
        } else {
            let mut ctx = ctx!(self, now);
            slot.qp
                .handle_packet(&mut ctx, rx.ecn, r, payload, rx.ip_hdr);
        }
        self.sched.schedule_slot(slot, qpn, now);
        if let Some(mac) = rx.learned {
            self.learn_neighbour(rx.src, mac);
        }
    }

    /// A packet sent to a multicast group: a copy to every UD QP attached to the group
    /// (IBTA 10.5: a multicast packet carries destination QPN 0xFFFFFF and only UD uses it;
    /// anything else, or a group nobody here joined, is dropped and counted).
    fn receive_mcast(
        &mut self,
        now: Instant,
        rx: Received<'_>,
        r: &wire::RoceRepr,
        payload: &[u8],
    ) {
        const MULTICAST_QPN: u32 = 0xFF_FFFF;
        let b = &r.bth;
        if b.dest_qp.get() != MULTICAST_QPN || b.opcode.transport() != Transport::Ud {
            self.counters.header_drops += 1;
            return;
        }
        // The group's list is taken out while its QPs receive (no copy per packet; nothing
        // a QP does on receive attaches or detaches) and put back after.
        let Some(qpns) = self.mcast.get_mut(&rx.dst).map(std::mem::take) else {
            self.counters.address_drops += 1;
            return;
        };
        // Every attached QP, the sender's own included (as on an RNIC without
        // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB).
        for &qpn in &qpns {
            let Some(slot) = self.qps.get_mut(&qpn) else {
                continue;
            };
            if slot.qp.transport() != Transport::Ud {
                continue;
            }
            let mut ctx = ctx!(self, now);
            slot.qp
                .handle_packet(&mut ctx, rx.ecn, r, payload, rx.ip_hdr);
            self.sched.schedule_slot(slot, qpn, now);
        }
        if let Some(v) = self.mcast.get_mut(&rx.dst) {
            *v = qpns;
        }
    }

    /// The largest frame any QP of this device may send: a `poll_transmit` buffer of this
    /// size never gets [`TransmitError::BufferTooSmall`].
    pub fn max_frame_len(&self) -> usize {
        self.qps
            .values()
            .filter_map(|s| {
                let mtu = s.qp.max_payload()?;
                Some(Framer::max_frame_len_for(s.qp.may_send_ipv6(), mtu))
            })
            .max()
            .unwrap_or(0)
    }

    /// Write the next frame to send into `buf`; returns its length, or `None` when no QP has
    /// anything to send now. `buf` must hold the largest frame the next QP may send (its path
    /// MTU plus at most 98 bytes of headers: [`Device::max_frame_len`]); if it does not, the
    /// call fails with [`TransmitError::BufferTooSmall`] and takes nothing from the QP.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<usize>, TransmitError> {
        self.sched.now = now;
        self.fail_overrun_qps();
        while let Some(qpn) = self.sched.ready.pop_front() {
            let Some(slot) = self.qps.get_mut(&qpn) else {
                continue;
            };
            slot.in_ready = false;
            let qp = &mut *slot.qp;
            let out = match (qp.next_tx(now), qp.max_payload()) {
                (Some(kind), Some(mtu)) => {
                    let needed = Framer::max_frame_len_for(qp.may_send_ipv6(), mtu);
                    if buf.len() < needed {
                        slot.in_ready = true;
                        self.sched.ready.push_front(qpn);
                        return Err(TransmitError::BufferTooSmall {
                            needed,
                            had: buf.len(),
                        });
                    }
                    let mut ctx = ctx!(self, now);
                    match qp.build_tx(&mut ctx, kind) {
                        None => None,
                        Some(desc) => {
                            let payload_len = desc.repr.payload_len;
                            let mrs = ctx.mrs;
                            // build_tx checked that an RC or UC QP has its path; a UD QP
                            // keeps the one of the packet it built.
                            let r = match qp.tx_path() {
                                Some(path) => {
                                    self.sched.framer.emit(buf, path, kind, &desc.repr, |dst| {
                                        qp.write_payload(mrs, &desc.payload, dst)
                                    })
                                }
                                None => Err(FrameError::Payload(WcStatus::LocQpOpErr)),
                            };
                            match r {
                                Ok(n) => {
                                    qp.on_transmitted(&mut ctx, kind, n, payload_len);
                                    Some(n)
                                }
                                Err(FrameError::Payload(status)) => {
                                    qp.on_tx_error(&mut ctx, status);
                                    None
                                }
                                Err(FrameError::Wire(e)) => {
                                    tracing::warn!(qpn, error = %e, "frame not built");
                                    qp.on_tx_error(&mut ctx, WcStatus::LocQpOpErr);
                                    None
                                }
                            }
                        }
                    }
                }
                _ => None,
            };
            self.sched.schedule_slot(slot, qpn, now);
            if let Some(n) = out {
                self.counters.tx_frames += 1;
                return Ok(Some(n));
            }
        }
        Ok(None)
    }
}

/// A received packet's addressing, as the receive path needs it.
struct Received<'a> {
    src: IpAddr,
    dst: IpAddr,
    ecn: Ecn,
    /// The IP header as received (for a UD receive's GRH slot).
    ip_hdr: &'a [u8],
    /// The source MAC of the frame, remembered as `src`'s (a neighbour).
    learned: Option<MacAddr>,
}

/// An IP header for a packet whose own the backend did not keep: `src` to `dst` with `ecn`,
/// TTL (hop limit) 64, IPv4 with DF and identification 0, UDP, for a transport part of
/// `roce_len` bytes. Returns its length.
fn rebuilt_ip_header(
    out: &mut [u8; wire::ip::IPV6_HEADER_LEN],
    src: IpAddr,
    dst: IpAddr,
    ecn: Ecn,
    roce_len: usize,
) -> usize {
    let udp_len = wire::udp::HEADER_LEN + roce_len;
    let ip = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => wire::IpRepr::V4(wire::Ipv4Repr {
            src: s,
            dst: d,
            dscp: 0,
            ecn,
            ident: 0,
            dont_frag: true,
            ttl: 64,
        }),
        (s, d) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V4(v) => v.to_ipv6_mapped(),
                IpAddr::V6(v) => v,
            };
            wire::IpRepr::V6(wire::Ipv6Repr {
                src: v6(s),
                dst: v6(d),
                dscp: 0,
                ecn,
                flow_label: 0,
                hop_limit: 64,
            })
        }
    };
    let n = match ip {
        wire::IpRepr::V4(_) => wire::ip::IPV4_HEADER_LEN,
        wire::IpRepr::V6(_) => wire::ip::IPV6_HEADER_LEN,
    };
    match ip.emit(&mut out[..n], udp_len) {
        Ok(()) => n,
        Err(_) => 0,
    }
}
