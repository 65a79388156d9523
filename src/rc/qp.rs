//! One RC queue pair: its state (private to `rc`), and the contract between the QP and the
//! device engine that drives it.
//!
//! # The engine's contract with a queue pair
//!
//! The engine (`verbs::engine`) owns a table of QPs and calls, with the time as an argument:
//! - [`Qp::handle_packet`] for every packet addressed to the QP (after the device's address
//!   and header checks), [`Qp::handle_cnp`] for a congestion notification;
//! - [`Qp::next_tx`] to learn whether (and what kind of) packet the QP would send now — the
//!   one priority rule, used both to put the QP on the transmit list and to pick its packet —
//!   then [`Qp::build_tx`] for the packet itself, [`Qp::write_payload`] to copy its payload into
//!   the frame and [`Qp::on_transmitted`] once it left;
//! - [`Qp::next_deadline`] to learn when to call [`Qp::handle_timeout`];
//! - the verbs: [`Qp::modify`], [`Qp::post_send`], [`Qp::post_recv`], and getters.
//!
//! A QP never reads a clock, never touches a socket, and reports completions through the
//! [`Ctx`] it is lent. Another QP type (UC, UD) offers the same methods.

use super::timer::{Timer, TimerTable};
use crate::cc::dcqcn::NotificationPoint;
use crate::cc::{Pacer, RateControl};
use crate::ib::counters::QpCounters;
use crate::ib::cq::Cq;
use crate::ib::mr::{gather, MrShared, MrTable, Pd};
use crate::ib::path::Path;
use crate::ib::srq::{Srq, Xrcd};
pub(crate) use crate::ib::tx::{PayloadSrc, PostError, TxDesc, TxKind};
use crate::ib::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
use crate::ib::wq::QpInit;
use crate::ib::wqe::{RecvWqe, SendWqe};
use crate::ib::wr::SendOp;
use crate::ib::{Ctx, QpAttr, QpAttrMask, QpCap, QpState};
use crate::time::{Duration, Instant};
use crate::wire::{self, BthRepr, Ecn, ExtRepr, OpFlags, Opcode, Psn, QpNumber, RoceRepr};
use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Arc;

/// Most PSNs a requester keeps unacknowledged by default: go-back-N resends up to this many
/// packets per loss, so it is a window, not just a safety bound (far below the 2^23 the PSN
/// space allows). A READ may reserve more in one request (one PSN per response packet).
pub(crate) const DEFAULT_MAX_INFLIGHT: u32 = 256;
/// AckReq on at least every this many packets of a long message (as rxe does).
pub(crate) const ACKREQ_EVERY: u32 = 64;
/// Bound on queued responses (ACKs, read replies) per QP: a flood of duplicates cannot grow it.
pub(crate) const MAX_RESP_QUEUE: usize = 256;
/// Room a request needs in the response queue to be taken: one packet queues at most one
/// response (an ACK, a NAK, a READ or ATOMIC reply), and requests kept by selective repeat
/// that it releases add one each, up to the responder resources for READs and ATOMICs (ACKs
/// coalesce). Below this room a request is dropped unexecuted (back-pressure).
pub(crate) const RESP_ROOM: usize = 32;

/// What the device gives each QP it creates.
pub(crate) struct QpConfig {
    /// The go-back-N window (see [`DEFAULT_MAX_INFLIGHT`]).
    pub max_inflight: u32,
    /// Congestion control of what this QP sends (the DCQCN reaction point, or none).
    pub cc: Box<dyn RateControl>,
    /// Paces this QP's payload-carrying packets at `cc`'s rate.
    pub pacer: Pacer,
    /// The notification point for what this QP receives (`None`: never send CNPs).
    pub np: Option<NotificationPoint>,
    /// Delayed ACK: hold a lone ACK up to this long (`None`: never).
    pub ack_delay: Option<Duration>,
    /// Fast loss recovery for go-back-N (`rc/recovery.rs`).
    pub fast_recovery: bool,
    /// Selective repeat with a peer that has it too (`rc/reorder.rs`).
    pub selective_repeat: bool,
    /// Test-only deliberate deviations (all off by default).
    pub deviations: super::deviations::Deviations,
    /// The half of XRC this QP is, if any, and (target) its domain.
    pub xrc: XrcRole,
    pub xrcd: Option<Xrcd>,
}

/// Which half of XRC an RC machine is (IBTA Vol. 1 §9.8.3, §11.2.9): XRC's operations,
/// sequencing, ACKs and retries are RC's, under XRC's opcodes. The initiator is a requester
/// whose every request packet names the target's XRC SRQ (XRCETH); the target is a responder
/// whose SENDs land in the SRQ a request names, whose memory checks use that SRQ's PD and
/// whose receive completions go to that SRQ's CQ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum XrcRole {
    /// Plain RC.
    #[default]
    None,
    /// `IBV_QPT_XRC_SEND`.
    Send,
    /// `IBV_QPT_XRC_RECV`.
    Recv,
}

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
    /// READ with selective repeat: the responses placed ahead of `read_done`, made when the
    /// first one is (boxed: most entries never need it, and an empty box costs nothing to
    /// move or drop).
    pub read_ahead: Option<Box<ReadAhead>>,
}

/// A READ's responses placed out of order by selective repeat (`rc/reorder.rs`).
#[derive(Debug, Default)]
pub(crate) struct ReadAhead {
    /// Response packets placed ahead of `read_done` (their PSN's distance from
    /// `first_psn`), counted in once the gap before them is filled.
    pub placed: std::collections::BTreeSet<u32>,
    /// Responses among `placed` that could not land yet (a byte of theirs may still be
    /// written by an earlier WQE or an earlier offset): kept, written in order when the gap
    /// before them fills.
    pub kept: std::collections::BTreeMap<u32, Vec<u8>>,
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
            read_ahead: None,
        }
    }
    /// Whether a response `k` packets into this READ was placed ahead of `read_done`.
    pub(crate) fn read_placed(&self, k: u32) -> bool {
        self.read_ahead
            .as_ref()
            .is_some_and(|a| a.placed.contains(&k))
    }
    /// Whether any response was placed ahead of `read_done`.
    pub(crate) fn any_read_placed(&self) -> bool {
        self.read_ahead
            .as_ref()
            .is_some_and(|a| !a.placed.is_empty())
    }
    pub(crate) fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts.saturating_sub(1))
    }
    pub(crate) fn contains(&self, p: Psn) -> bool {
        self.assigned && p.distance_from(self.first_psn) < self.npkts
    }
}

/// The requester's (and completer's) progress over the send queue. Its timers (local ACK
/// timeout, RNR wait) are in the QP's [`TimerTable`].
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
    /// Where to resend from when the RNR wait ([`Timer::Rnr`]) ends.
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
    /// Selective repeat: the one PSN a sequence-error NAK asked for, to resend next.
    pub sr_resend: Option<Psn>,
    /// Selective repeat: the PSN the last sequence NAK asked for, resent alone (or as the
    /// start of a run); in flight while not before `una`. A probe then resends it (and its
    /// run) again instead of going back to `una` (`rc/recovery.rs`).
    pub sr_sent: Option<Psn>,
    /// Selective repeat: a resend from `sr_sent` goes on packet by packet up to this PSN
    /// (the NAK was for the PSN right after the previous NAK's: a burst was lost, see
    /// `Qp::seq_retry`).
    pub sr_run_end: Option<Psn>,
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
        /// The request's virtual address (a duplicate's RETH must lie inside the original).
        va: u64,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
}

/// The multi-packet message a responder is in the middle of (between its FIRST and its LAST
/// packet).
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
        /// An answer to a duplicate READ (a retry of a request already counted, or a late
        /// network copy of one already answered): not counted against `max_dest_rd_atomic`.
        replay: bool,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: u32,
        /// An answer to a duplicate ATOMIC: not counted against `max_dest_rd_atomic`.
        replay: bool,
    },
}

/// The responder's state (laid out in declaration order, `repr(C)`: what every request
/// touches first).
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct Responder {
    /// Expected PSN.
    pub epsn: Psn,
    /// Message sequence number (24 bits).
    pub msn: u32,
    /// A sequence-error or RNR NAK was sent and the expected PSN has not arrived since.
    pub nak_sent: bool,
    pub resp_q: VecDeque<RespItem>,
    /// The message in progress, if the last packet executed was a FIRST or MIDDLE.
    pub in_msg: Option<InMsg>,
    pub resources: VecDeque<Resource>,
    /// Selective repeat: request packets kept ahead of the expected PSN, by PSN
    /// (`rc/reorder.rs`).
    pub reorder: std::collections::BTreeMap<u32, (RoceRepr, Vec<u8>)>,
    /// XRC target: where the message being received (or the last one) lands, chosen by the
    /// XRCETH of the request that starts it; `None` before the first request and when that
    /// XRCETH names no XRC SRQ of the target's domain (the request is refused). The QP's own
    /// PD, receive CQ and SRQ stay none of these: the target has none (IBTA 14.2.3 via
    /// libibverbs' `IBV_QPT_XRC_RECV`).
    pub xrc_dest: Option<XrcDest>,
}

/// An XRC target's message destination: the XRC SRQ its XRCETH names, with that SRQ's PD
/// (checked against the memory it lands in and the R_Keys it uses) and CQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct XrcDest {
    pub srq: Srq,
    pub pd: Pd,
    pub cq: Cq,
}

/// A value that starts a cache line (the QP's counters: the ones every packet counts, the first
/// four and the ACK and completion counts, then sit in two lines, not three).
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct LineAligned<T>(pub T);

impl<T> std::ops::Deref for LineAligned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::DerefMut for LineAligned<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

/// The queue pair. Laid out in declaration order (`repr(C)`), aligned to a cache line, the
/// fields the packet paths touch first and grouped by who touches them (issue 15: with
/// 10,000 QPs and every packet on another QP, each cache line of a QP a packet touches is a
/// miss; the compiler's order spread them over all 18 lines of the struct).
#[repr(C, align(64))]
pub(crate) struct Qp {
    // Hot on every packet of either direction: the QP's state and number, its send queue (the
    // responder's transmit check looks at it too), the requester, the timers.
    pub(super) state: QpState,
    pub(super) sq_sig_all: bool,
    /// Selective repeat (`rc/reorder.rs`).
    pub(super) sr: bool,
    /// XRC: which half, if any.
    pub(super) xrc: XrcRole,
    /// CNPs owed to the peer (at most one, unless the `cnp_every_ce` deviation is set).
    pub(super) cnp_due: u32,
    pub(super) num: QpNumber,
    pub(super) send_cq: Cq,
    pub(super) recv_cq: Cq,
    pub(super) sq: VecDeque<SqEntry>,
    pub(super) req: Requester,
    /// Every deadline of the QP.
    pub(super) timers: TimerTable,
    // The requester's per-packet gates (window, pacing, rate).
    /// Fast loss recovery: probe timeout and adaptive window (`rc/recovery.rs`).
    pub(super) rec: super::recovery::Recovery,
    /// Paces this QP's payload-carrying packets at `cc`'s rate.
    pub(super) pacer: Pacer,
    /// Congestion control of what this QP sends.
    pub(super) cc: Box<dyn RateControl>,
    // The responder's per-packet state.
    pub(super) resp: Responder,
    pub(super) rq: VecDeque<RecvWqe>,
    /// The shared receive queue receive WQEs come from instead of `rq`, if any.
    pub(super) srq: Option<Srq>,
    /// Delayed ACK: a lone ACK waiting in the response queue is held back up to this long
    /// ([`Timer::AckHold`]), or until this QP sends a request packet (the ACK then follows it
    /// in the same batch). IBTA 9.7.5.1.6 lets a responder coalesce ACKs; the requester's
    /// local ACK timeout (milliseconds) is far above the hold.
    pub(super) ack_delay: Option<Duration>,
    /// The notification point for what this QP receives (None: never send CNPs).
    pub(super) np: Option<NotificationPoint>,
    /// Send and receive WQEs retired so far (completed, with or without a completion entry;
    /// flushed). The runtime derives the free queue slots from these.
    pub(super) sq_retired: u64,
    pub(super) rq_retired: u64,
    // The counters (cache-line aligned: the per-packet ones in two lines), then what the
    // headers take on transmit (the path, the attributes).
    pub(super) counters: LineAligned<QpCounters>,
    pub(super) path: Option<Path>,
    pub(super) attr: QpAttr,
    /// Test-only deliberate deviations (all off by default).
    pub(super) dev: super::deviations::Deviations,
    // Cold: read by the verbs, not by the packet paths.
    pub(super) pd: Pd,
    /// An XRC target's domain.
    pub(super) xrcd: Option<Xrcd>,
    pub(super) cap: QpCap,
}

// ---- creation, getters -------------------------------------------------------------------

impl Qp {
    /// A new QP in the RESET state.
    pub(crate) fn new(num: QpNumber, init: QpInit, cfg: QpConfig) -> Qp {
        let mut timers = TimerTable::default();
        timers.set(Timer::Cc, cfg.cc.next_timer());
        Qp {
            num,
            pd: init.pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            sq_sig_all: init.sq_sig_all,
            cap: init.cap,
            state: QpState::Reset,
            attr: QpAttr {
                cap: init.cap,
                ..QpAttr::default()
            },
            path: None,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            srq: init.srq,
            req: Requester {
                max_inflight: cfg.max_inflight.max(1),
                ..Requester::default()
            },
            resp: Responder::default(),
            counters: LineAligned(QpCounters::default()),
            sq_retired: 0,
            rq_retired: 0,
            timers,
            cc: cfg.cc,
            pacer: cfg.pacer,
            np: cfg.np,
            cnp_due: 0,
            ack_delay: cfg.ack_delay,
            rec: super::recovery::Recovery::new(
                cfg.fast_recovery || cfg.selective_repeat,
                cfg.max_inflight,
            ),
            // Selective repeat keeps requests past a gap, and an XRC target chooses its SRQ
            // as a message starts: XRC runs go-back-N.
            sr: cfg.selective_repeat && cfg.xrc == XrcRole::None,
            xrc: cfg.xrc,
            xrcd: cfg.xrcd,
            dev: cfg.deviations,
        }
    }

    /// Its transport service: RC, or a half of XRC.
    pub(crate) fn qp_type(&self) -> crate::ib::QpType {
        match self.xrc {
            XrcRole::None => crate::ib::QpType::Rc,
            XrcRole::Send => crate::ib::QpType::XrcSend,
            XrcRole::Recv => crate::ib::QpType::XrcRecv,
        }
    }
    /// The transport of its opcodes.
    pub(crate) fn transport(&self) -> wire::Transport {
        match self.xrc {
            XrcRole::None => wire::Transport::Rc,
            _ => wire::Transport::Xrc,
        }
    }
    /// An XRC target's domain.
    pub(crate) fn xrcd(&self) -> Option<Xrcd> {
        self.xrcd
    }
    /// The QP number.
    pub(crate) fn num(&self) -> QpNumber {
        self.num
    }
    /// The state.
    pub(crate) fn state(&self) -> QpState {
        self.state
    }
    /// The attributes as last modified.
    pub(crate) fn attr(&self) -> &QpAttr {
        &self.attr
    }
    /// The queue sizes it was created with.
    pub(crate) fn cap(&self) -> QpCap {
        self.cap
    }
    /// Its protection domain.
    pub(crate) fn pd(&self) -> Pd {
        self.pd
    }
    /// The CQ of its send completions.
    pub(crate) fn send_cq(&self) -> Cq {
        self.send_cq
    }
    /// Its receive CQ.
    pub(crate) fn recv_cq(&self) -> Cq {
        self.recv_cq
    }
    /// The shared receive queue it is attached to, if any.
    pub(crate) fn srq(&self) -> Option<Srq> {
        self.srq
    }
    /// Its counters.
    pub(crate) fn counters(&self) -> &QpCounters {
        &self.counters.0
    }
    /// The sequence numbers: the next PSN a new request gets, the oldest one not yet
    /// acknowledged, and the PSN the responder expects.
    pub(crate) fn psns(&self) -> (Psn, Psn, Psn) {
        (self.req.next_psn, self.req.una, self.resp.epsn)
    }
    /// Send and receive work requests retired so far (completed or flushed).
    pub(crate) fn retired(&self) -> (u64, u64) {
        (self.sq_retired, self.rq_retired)
    }
    /// Whether a packet from `src` may be for this QP: it has a path and `src` is its peer.
    pub(crate) fn is_peer(&self, src: IpAddr) -> bool {
        self.path.is_some_and(|p| p.dst_ip == src)
    }
    /// The sending rate its congestion control allows, in bits per second.
    pub(crate) fn rate_bps(&self) -> u64 {
        self.cc.rate_bps()
    }
    /// Its congestion controller's α at `now`, if it has one.
    pub(crate) fn cc_alpha(&self, now: Instant) -> Option<f64> {
        self.cc.alpha(now)
    }
    /// Approximate bytes of memory the QP uses (its struct and queue buffers).
    pub(crate) fn memory(&self) -> usize {
        std::mem::size_of::<Qp>()
            + self.sq.capacity() * std::mem::size_of::<SqEntry>()
            + self.rq.capacity() * std::mem::size_of::<RecvWqe>()
            + self.resp.resp_q.capacity() * std::mem::size_of::<RespItem>()
            + self.resp.resources.capacity() * std::mem::size_of::<Resource>()
    }

    pub(super) fn mtu(&self) -> u32 {
        self.attr.path_mtu.bytes()
    }

    /// The local ACK timeout: 4.096 µs × 2^timeout (IBTA 9.7.6.1.3); 0 disables it.
    pub(super) fn ack_timeout(&self) -> Option<Duration> {
        match self.attr.timeout {
            0 => None,
            t => Some(Duration::from_nanos(4096u64 << u32::from(t.min(31)))),
        }
    }
}

// ---- the verbs: modify, post ---------------------------------------------------------------

impl Qp {
    /// `ibv_modify_qp` once the device checked the request against the transition table
    /// (`next` is the state it moves to) and resolved the path (`path`, if the mask has the
    /// address vector): the attributes named in `mask` take effect.
    pub(crate) fn modify(
        &mut self,
        ctx: &mut Ctx<'_>,
        attr: &QpAttr,
        mask: QpAttrMask,
        next: QpState,
        path: Option<Path>,
    ) {
        let a = &mut self.attr;
        macro_rules! set { ($($bit:ident => $f:ident),*) => { $( if mask.contains(QpAttrMask::$bit) { a.$f = attr.$f; } )* } }
        set!(ACCESS_FLAGS => qp_access_flags, PKEY_INDEX => pkey_index, PORT => port_num, QKEY => qkey,
             AV => ah_attr, PATH_MTU => path_mtu, TIMEOUT => timeout, RETRY_CNT => retry_cnt,
             RNR_RETRY => rnr_retry, RQ_PSN => rq_psn, MAX_QP_RD_ATOMIC => max_rd_atomic,
             MIN_RNR_TIMER => min_rnr_timer, SQ_PSN => sq_psn, MAX_DEST_RD_ATOMIC => max_dest_rd_atomic,
             DEST_QPN => dest_qp_num, EN_SQD_ASYNC_NOTIFY => en_sqd_async_notify);
        if let Some(p) = path {
            self.path = Some(p);
        }
        if mask.contains(QpAttrMask::RQ_PSN) {
            self.resp.epsn = Psn::new(attr.rq_psn);
        }
        if mask.contains(QpAttrMask::SQ_PSN) {
            let p = Psn::new(attr.sq_psn);
            self.req.next_psn = p;
            self.req.una = p;
            self.req.send_psn = p;
            self.req.hwm = p;
            self.rec.reset(p, self.req.max_inflight);
        }
        if mask.contains(QpAttrMask::RETRY_CNT) {
            self.req.retry_left = attr.retry_cnt;
        }
        if mask.contains(QpAttrMask::RNR_RETRY) {
            self.req.rnr_left = attr.rnr_retry;
        }
        let prev = self.state;
        match next {
            QpState::Err if prev != QpState::Err => self.enter_error(ctx),
            QpState::Reset => self.reset(),
            _ => {}
        }
        self.set_state(next);
    }

    /// Back to a fresh QP: queues emptied without completions (as ibv does), timers stopped,
    /// nothing owed to the peer.
    fn reset(&mut self) {
        self.sq_retired += self.sq.len() as u64;
        self.rq_retired += self.rq.len() as u64;
        self.sq.clear();
        self.rq.clear();
        self.req = Requester {
            max_inflight: self.req.max_inflight,
            ..Requester::default()
        };
        self.resp = Responder::default();
        self.rec.reset(Psn::default(), self.req.max_inflight);
        self.path = None;
        self.attr = QpAttr {
            cap: self.cap,
            ..QpAttr::default()
        };
        let cc = self.timers.get(Timer::Cc);
        self.timers = TimerTable::default();
        self.timers.set(Timer::Cc, cc);
        self.cnp_due = 0;
    }

    fn set_state(&mut self, next: QpState) {
        if next != self.state {
            tracing::debug!(qpn = %self.num, from = %self.state, to = %next, "QP state");
            self.state = next;
        }
    }

    /// Whether a send work request may be posted now: the state accepts one and the send
    /// queue has room (the first checks of `ibv_post_send`).
    pub(crate) fn check_post_send(&self) -> Result<(), PostError> {
        if matches!(self.state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(PostError::InvalidState(self.state));
        }
        if self.sq.len() >= self.cap.max_send_wr as usize {
            return Err(PostError::QueueFull);
        }
        Ok(())
    }

    /// Queue a send work request that [`check_post_send`](Self::check_post_send) admitted
    /// (and the device checked). In the error state it is flushed at once.
    #[inline]
    pub(crate) fn post_send(&mut self, ctx: &mut Ctx<'_>, wqe: SendWqe) {
        debug_assert!(self.check_post_send().is_ok());
        self.sq.push_back(SqEntry::new(wqe));
        if matches!(self.state, QpState::Err | QpState::Sqe) {
            self.flush(ctx);
        }
    }

    /// Whether a receive work request may be posted now (the first checks of
    /// `ibv_post_recv`).
    pub(crate) fn check_post_recv(&self) -> Result<(), PostError> {
        if self.state == QpState::Reset {
            return Err(PostError::InvalidState(self.state));
        }
        if self.srq.is_some() || self.xrc != XrcRole::None {
            // An XRC initiator has no receive queue; a target receives into XRC SRQs.
            return Err(PostError::HasSrq);
        }
        if self.rq.len() >= self.cap.max_recv_wr as usize {
            return Err(PostError::QueueFull);
        }
        Ok(())
    }

    /// Queue a receive work request that [`check_post_recv`](Self::check_post_recv) admitted.
    /// In the error state it is flushed at once.
    #[inline]
    pub(crate) fn post_recv(&mut self, ctx: &mut Ctx<'_>, wqe: RecvWqe) {
        debug_assert!(self.check_post_recv().is_ok());
        self.rq.push_back(wqe);
        if self.state == QpState::Err {
            self.flush(ctx);
        }
    }
}

// ---- packets in ------------------------------------------------------------------------------

impl Qp {
    /// A packet for this QP (the device checked its address, P_Key, TVer and transport).
    pub(crate) fn handle_packet(
        &mut self,
        ctx: &mut Ctx<'_>,
        ecn: Ecn,
        r: &RoceRepr,
        payload: &[u8],
    ) {
        if self.xrc != XrcRole::None {
            return self.handle_xrc_packet(ctx, ecn, r, payload);
        }
        self.handle_rc_packet(ctx, ecn, r, payload)
    }

    /// A packet for an XRC QP, whose XRC opcode this machine reads as RC's. Each half is one
    /// direction of the connection: the initiator takes responses only, the target requests
    /// only; the other kind is dropped (counted in `opcode_drops`). At the target, the XRCETH
    /// of a request that starts a message chooses the XRC SRQ (see [`XrcRole`]); one that
    /// names no XRC SRQ of the target's domain is an invalid request (NAKed, the QP in error).
    fn handle_xrc_packet(&mut self, ctx: &mut Ctx<'_>, ecn: Ecn, r: &RoceRepr, payload: &[u8]) {
        let mut rc = *r;
        rc.bth.opcode = r.bth.opcode.to_rc();
        rc.ext.xrceth = None;
        let response = rc.bth.opcode.is(OpFlags::RESPONSE);
        match self.xrc {
            XrcRole::Send if response => {}
            XrcRole::Recv if !response => {
                if self.resp.in_msg.is_none() {
                    self.choose_xrc_srq(ctx, r.ext.xrceth);
                }
            }
            _ => {
                self.counters.opcode_drops += 1;
                return;
            }
        }
        self.handle_rc_packet(ctx, ecn, &rc, payload)
    }

    /// An XRC target's SRQ for the message a request starts: the one its XRCETH names, if
    /// that is an XRC SRQ of the target's domain (else the request is refused at
    /// [`Step::OpValid`](super::responder)).
    fn choose_xrc_srq(&mut self, ctx: &Ctx<'_>, srqn: Option<u32>) {
        self.resp.xrc_dest = srqn.and_then(|n| {
            let ring = ctx.srqs.get(n as usize)?.as_ref()?;
            let x = ring.xrc?;
            (Some(x.xrcd) == self.xrcd).then_some(XrcDest {
                srq: Srq(n),
                pd: ring.pd,
                cq: x.cq,
            })
        });
    }

    // Only an XRC target ever has an `xrc_dest`, and it has no SRQ, PD or receive CQ of its
    // own: the message's destination, where there is one, else the QP's own.

    /// The SRQ the message being received takes its WQE from: the QP's own, or the XRC SRQ
    /// an XRC target's message names.
    pub(super) fn rx_srq(&self) -> Option<Srq> {
        self.resp.xrc_dest.map_or(self.srq, |d| Some(d.srq))
    }

    /// The PD the message being received is checked against (an XRC target's: its XRC SRQ's).
    pub(super) fn rx_pd(&self) -> Pd {
        self.resp.xrc_dest.map_or(self.pd, |d| d.pd)
    }

    /// The CQ the message being received completes into (an XRC target's: its XRC SRQ's).
    pub(crate) fn rx_cq(&self) -> Cq {
        self.resp.xrc_dest.map_or(self.recv_cq, |d| d.cq)
    }

    /// Whether its receive WQEs come from a shared queue (an SRQ, or an XRC target's XRC
    /// SRQs): none of them is this QP's to count in credits or to spend on an error report.
    pub(super) fn shares_rq(&self) -> bool {
        self.srq.is_some() || self.xrc == XrcRole::Recv
    }

    fn handle_rc_packet(&mut self, ctx: &mut Ctx<'_>, ecn: Ecn, r: &RoceRepr, payload: &[u8]) {
        self.counters.rx_packets += 1;
        self.counters.rx_bytes += payload.len() as u64;
        if ecn == Ecn::Ce && self.ce_counts(r) {
            // The notification point: a congested path; CNPs to the sender, spaced.
            self.counters.ce_rcvd += 1;
            let every = self.dev.cnp_every_ce;
            if self
                .np
                .as_mut()
                .is_some_and(|np| np.on_ce(ctx.now) || every)
            {
                self.cnp_due = if every {
                    self.cnp_due.saturating_add(1)
                } else {
                    1
                };
            }
        }
        if r.bth.opcode.is(OpFlags::RESPONSE) {
            self.on_response(ctx, r, payload);
        } else {
            self.on_request(ctx, r, payload);
            if let Some(d) = self.ack_delay {
                self.hold_ack(ctx.now, d);
            }
        }
    }

    /// Whether a CE-marked packet makes this QP owe its sender a CNP: only a packet this QP
    /// takes as part of the connection, checked before anything is owed (issue 17, finding 3;
    /// a forged packet must not throttle the real peer through our CNPs). The QP receives
    /// (RTR, RTS, SQD); a request's PSN is the expected one or a duplicate of one before it
    /// (a retransmission crossing the same congestion); a response's PSN is outstanding
    /// (`[una, hwm)`, the completer's own check).
    fn ce_counts(&self, r: &RoceRepr) -> bool {
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            return false;
        }
        let p = r.bth.psn;
        if r.bth.opcode.is(OpFlags::RESPONSE) {
            !p.before(self.req.una) && p.before(self.req.hwm)
        } else {
            p.before_or_eq(self.resp.epsn)
        }
    }

    /// A congestion notification for this QP's transmissions (the reaction point).
    pub(crate) fn handle_cnp(&mut self, now: Instant) {
        self.cc.on_cnp(now);
        self.cc_changed(now);
        self.counters.cnps_handled += 1;
    }

    /// After any call into the congestion controller: keep the pacer at its rate (without
    /// congestion control the pacer is unlimited and stays so: the no-CC controller reports
    /// the line rate, which must not turn pacing on) and its timer in the table.
    fn cc_changed(&mut self, now: Instant) {
        if !self.pacer.is_unlimited() {
            let r = self.cc.rate_bps();
            if r != self.pacer.rate_bps() {
                self.pacer.set_rate(now, r);
            }
        }
        self.timers.set(Timer::Cc, self.cc.next_timer());
    }
}

// ---- packets out -------------------------------------------------------------------------

impl Qp {
    /// The kind of packet this QP would send at `now`, if any: the one priority rule of the
    /// transmit path. A CNP owed to the peer goes first (never paced); then a control
    /// response (ACK, NAK, ATOMIC ACK; not paced) unless it is a lone ACK held back; then
    /// data (a READ response before a new request), paced at the QP's rate. A held ACK waits
    /// behind the request (it is released once that is sent). When the pacer holds data back
    /// this arms [`Timer::Pace`] and answers `None`.
    pub(crate) fn next_tx(&mut self, now: Instant) -> Option<TxKind> {
        self.path.as_ref()?;
        if self.cnp_due > 0 {
            return Some(TxKind::Cnp);
        }
        let front_is_data = match self.resp.resp_q.front() {
            Some(RespItem::Read { .. }) => true,
            Some(_) if !self.ack_held(now) => return Some(TxKind::Control),
            _ => false,
        };
        if !front_is_data && !self.requester_ready() {
            return None;
        }
        if self.timers.is_armed(Timer::Pace) || self.paced_out(now) {
            return None;
        }
        Some(TxKind::Data)
    }

    /// Pacing gate for a data packet: true if it must wait (and [`Timer::Pace`] then says
    /// until when). The pacer is asked about a full frame of the path MTU.
    fn paced_out(&mut self, now: Instant) -> bool {
        if self.pacer.is_unlimited() {
            return false;
        }
        let at = self.pacer.earliest_send(now, self.mtu() as usize + 100);
        if at > now {
            self.timers.set(Timer::Pace, Some(at));
            true
        } else {
            false
        }
    }

    /// Build the packet [`next_tx`](Self::next_tx) announced as `kind`; `None` if there is
    /// none after all (a request whose local error was found when it was reached: its error
    /// completion is made and the QP moves to the error state).
    pub(crate) fn build_tx(&mut self, ctx: &mut Ctx<'_>, kind: TxKind) -> Option<TxDesc> {
        let mut d = self.build_rc_tx(ctx, kind)?;
        if self.xrc != XrcRole::None && d.repr.bth.opcode != Opcode::CNP {
            d.repr.bth.opcode = d.repr.bth.opcode.to_xrc();
        }
        Some(d)
    }

    fn build_rc_tx(&mut self, ctx: &mut Ctx<'_>, kind: TxKind) -> Option<TxDesc> {
        match kind {
            TxKind::Cnp => {
                self.cnp_due -= 1;
                let mut bth = BthRepr::new(
                    Opcode::CNP,
                    QpNumber::new(self.attr.dest_qp_num),
                    Psn::new(0),
                );
                bth.becn = true;
                Some(TxDesc {
                    repr: RoceRepr::new(bth, ExtRepr::default(), 0),
                    payload: PayloadSrc::None,
                })
            }
            TxKind::Control => self.next_response_packet(),
            TxKind::Data => match self.resp.resp_q.front() {
                Some(RespItem::Read { .. }) => self.next_response_packet(),
                // next_tx found the requester ready (or it would not have announced data
                // without a READ response first).
                _ => self.next_ready_request_packet(ctx),
            },
        }
    }

    /// The path packets of this QP take (`None` before the address vector is set).
    pub(crate) fn path(&self) -> Option<&Path> {
        self.path.as_ref()
    }

    /// Copy the payload of a packet [`build_tx`](Self::build_tx) described into `dst` (its
    /// length). Fails with a local protection error if the memory behind a request is gone
    /// (deregistered since it was posted).
    pub(crate) fn write_payload(
        &self,
        mrs: &MrTable,
        src: &PayloadSrc,
        dst: &mut [u8],
    ) -> Result<(), WcStatus> {
        match src {
            PayloadSrc::None => Ok(()),
            PayloadSrc::Mr { mr, off } => {
                if mr.read_at(*off, dst) {
                    Ok(())
                } else {
                    Err(WcStatus::LocProtErr)
                }
            }
            PayloadSrc::Wqe { idx, off } => {
                let w = &self.sq[*idx].wqe;
                match &w.inline {
                    Some(data) => {
                        let off = *off as usize;
                        dst.copy_from_slice(&data[off..off + dst.len()]);
                        Ok(())
                    }
                    None => {
                        gather(mrs, &w.sges, u64::from(*off), dst).map_err(|_| WcStatus::LocProtErr)
                    }
                }
            }
        }
    }

    /// A packet of `kind` left at `now`: `frame_len` bytes on the wire, `payload_len` of them
    /// payload. A held ACK is released (it follows the packet), and data packets are charged
    /// to the pacer and the congestion controller.
    pub(crate) fn on_transmitted(
        &mut self,
        now: Instant,
        kind: TxKind,
        frame_len: usize,
        payload_len: usize,
    ) {
        self.counters.tx_packets += 1;
        self.counters.tx_bytes += payload_len as u64;
        self.timers.stop(Timer::AckHold);
        match kind {
            TxKind::Cnp => self.counters.cnps_sent += 1,
            TxKind::Data => {
                self.pacer.on_send(now, frame_len);
                self.cc.on_sent(now, frame_len);
                self.cc_changed(now);
            }
            TxKind::Control => {}
        }
    }

    /// A packet could not be written for a reason that is the QP's, not the caller's: the
    /// memory behind the oldest request vanished (`status`, a local protection error), or an
    /// internal error. Its error completion is made and the QP moves to the error state.
    pub(crate) fn on_tx_error(&mut self, ctx: &mut Ctx<'_>, status: WcStatus) {
        tracing::debug!(qpn = %self.num, %status, "transmit failed: local error");
        self.complete_send_head(ctx, status);
        self.enter_error(ctx);
    }

    /// The response queue holds exactly one positive ACK (nothing that must go first).
    fn lone_ack(&self) -> bool {
        self.resp.resp_q.len() == 1
            && matches!(self.resp.resp_q.front(), Some(RespItem::Ack { syndrome, .. }) if syndrome.is_ack())
    }

    /// After a request was handled: start holding a new lone ACK for `delay`; a hold whose
    /// ACK has company in the queue (or has gone) stops.
    fn hold_ack(&mut self, now: Instant, delay: Duration) {
        if !self.lone_ack() {
            self.timers.stop(Timer::AckHold);
        } else if !self.timers.is_armed(Timer::AckHold) {
            self.timers.set(Timer::AckHold, Some(now + delay));
        }
    }

    /// Let a held ACK go now (the device is shutting down, or its driver stops driving it):
    /// the hold is an optimisation of ferroce's own, and a peer must never wait for an ACK
    /// that the hold kept back. Returns whether one was held.
    pub(crate) fn release_held_ack(&mut self) -> bool {
        let held = self.timers.is_armed(Timer::AckHold);
        self.timers.stop(Timer::AckHold);
        held
    }

    /// Whether a lone ACK is still held back at `now`.
    fn ack_held(&self, now: Instant) -> bool {
        self.timers.get(Timer::AckHold).is_some_and(|t| now < t)
    }
}

// ---- timers ----------------------------------------------------------------------------------

impl Qp {
    /// The earliest deadline of this QP's timers.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        debug_assert!(
            !self.timers.is_armed(Timer::AckHold) || self.lone_ack(),
            "a held ACK is alone in the response queue"
        );
        self.timers.next()
    }

    /// Run every timer due at `now`, in the order of [`Timer::ALL`].
    pub(crate) fn handle_timeout(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        for t in Timer::ALL {
            if !self.timers.expired(t, now) {
                continue;
            }
            match t {
                // The gates of the transmit path: the QP is rescheduled by the engine.
                Timer::Pace | Timer::AckHold => self.timers.stop(t),
                Timer::Cc => {
                    self.cc.on_timer(now);
                    self.cc_changed(now);
                }
                Timer::Rnr => {
                    self.timers.stop(t);
                    self.on_rnr_wait_over(ctx.now);
                }
                Timer::Retransmit => self.on_ack_timeout(ctx),
                Timer::Probe => self.on_probe(ctx),
            }
        }
    }
}

// ---- completions and the error state ---------------------------------------------------------

impl Qp {
    /// Whether a send completion is generated for `w` on success.
    fn signal(&self, w: &SqEntry) -> bool {
        w.wqe.signaled || self.sq_sig_all
    }

    /// Complete the oldest send WQE with `status` (pops it). What the completion needs is
    /// read in place; the entry is then dropped where it lies (not moved out first).
    pub(super) fn complete_send_head(&mut self, ctx: &mut Ctx<'_>, status: WcStatus) {
        let Some(w) = self.sq.front() else { return };
        let rd_atomic = w.assigned && w.wqe.op.is_rd_atomic();
        let wc = (status != WcStatus::Success || self.signal(w)).then(|| {
            let byte_len = match w.wqe.op {
                SendOp::AtomicCmpSwp { .. } | SendOp::AtomicFetchAdd { .. } => 8,
                _ => w.wqe.len,
            };
            (w.wqe.wr_id, w.wqe.op.wc_opcode(), byte_len)
        });
        self.sq.pop_front();
        self.sq_retired += 1;
        if self.req.send_idx == 0 {
            // The requester was (re)sending this very WQE (a go-back-N retry overtaken by the
            // ACK that completes it): go on from the start of the next one, not with this
            // one's offset and PSN.
            self.enter_wqe(0);
        } else {
            self.req.send_idx -= 1;
        }
        if rd_atomic {
            self.req.rd_atomic_outstanding = self.req.rd_atomic_outstanding.saturating_sub(1);
        }
        if let Some((wr_id, opcode, byte_len)) = wc {
            ctx.complete(
                self.send_cq,
                WorkCompletion {
                    wr_id,
                    status,
                    opcode,
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
                    pkey_index: 0,
                    slid: 0,
                    sl: 0,
                    dlid_path_bits: 0,
                },
            );
            self.counters.send_completions += 1;
        }
    }

    /// Complete a receive WQE.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn complete_recv(
        &mut self,
        ctx: &mut Ctx<'_>,
        rwqe: &RecvWqe,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        imm: Option<u32>,
        inv: Option<wire::RKey>,
        solicited: bool,
    ) {
        self.rq_retired += 1;
        let mut flags = WcFlags::empty();
        flags.set(WcFlags::WITH_IMM, imm.is_some());
        flags.set(WcFlags::WITH_INV, inv.is_some());
        flags.insert(WcFlags::GRH);
        ctx.complete(
            self.rx_cq(),
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
                pkey_index: 0,
                slid: 0,
                sl: 0,
                dlid_path_bits: 0,
            },
        );
        self.counters.recv_completions += 1;
    }

    /// Move to the error state: every outstanding work request completes with a flush error
    /// (after any error completion the caller already made), timers stop. Responses already
    /// queued (the NAK that reports the error) are still sent.
    pub(super) fn enter_error(&mut self, ctx: &mut Ctx<'_>) {
        self.set_state(QpState::Err);
        self.flush(ctx);
        if self.rx_srq().is_some() {
            // It takes no more of the SRQ's WQEs (IBTA 11.6.3.4, "Last WQE Reached").
            ctx.events
                .push(crate::ib::AsyncEvent::QpLastWqeReached(self.num));
        }
    }

    /// Whether a receive WQE is there for a message (in the SRQ if attached).
    pub(super) fn recv_available(&self, ctx: &Ctx<'_>) -> bool {
        match self.rx_srq() {
            Some(s) => ctx.srq_has_wqe(s),
            None => !self.rq.is_empty(),
        }
    }

    /// Take the receive WQE for a message (from the SRQ if attached).
    pub(super) fn take_recv(&mut self, ctx: &mut Ctx<'_>) -> Option<RecvWqe> {
        match self.rx_srq() {
            Some(s) => ctx.srq_take(s),
            None => self.rq.pop_front(),
        }
    }

    fn flush(&mut self, ctx: &mut Ctx<'_>) {
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
        self.timers.stop(Timer::Retransmit);
        self.timers.stop(Timer::Rnr);
        self.req.rd_atomic_outstanding = 0;
        // Data responses are pointless now; ACKs and NAKs still go. An ACK acknowledges
        // requests already executed and completed here: dropped, the peer would retry them
        // against a QP that no longer answers and fail messages that were delivered. A held
        // ACK goes at once: the hold is ferroce's own (a consumer that moves the QP to the
        // error state right after its last receive completed, as at a disconnect, would
        // otherwise always lose the last ACK).
        self.resp
            .resp_q
            .retain(|r| matches!(r, RespItem::Ack { .. }));
        self.timers.stop(Timer::AckHold);
    }
}
