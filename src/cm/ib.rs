//! The IB CM engine ([`Cm`]): connections, listeners and service ID resolution, as a sans-IO
//! state machine (IBTA Vol. 1 §12.9 for connections, §12.11 for SIDR).
//!
//! # How a connection goes
//!
//! ```text
//! active (connect)                     passive (listen)
//! REQ ─────────────────────────────▶  ReqRcvd ── event ReqReceived
//! ReqSent                              (dup REQ: MRA; consumer: accept → REP / reject → REJ)
//!          ◀───────────────────────── REP          RepSent
//! RepRcvd ── event RepReceived         (dup REQ: REP again; timeout: REP again, then REJ)
//! (consumer: establish → RTU)
//! RTU ─────────────────────────────▶  Established ── event Established
//! Established ── event Established     (dup REP at the active side: RTU again)
//!
//! DREQ ───────────────────────────▶  DreqRcvd ── event DreqReceived
//! DreqSent                             (consumer: disconnect → DREP)
//!          ◀───────────────────────── DREP         TimeWait
//! TimeWait ── event Disconnected       (dup DREQ: DREP again)
//! ... TimeWaitExit on both sides after the TimeWait duration.
//! ```
//!
//! Timeouts: the active side waits for REP as long as the REQ says the passive CM takes
//! (Remote CM Response Timeout) plus two packet lifetimes, and sends the REQ again, at most
//! Max CM Retries times; an MRA stretches the wait by its service timeout. The passive side
//! waits for RTU as long as the REQ says the active CM takes (Local CM Response Timeout), the
//! same number of times. When a side gives up it sends REJ with reason Timeout and reports
//! [`CmEvent::TimedOut`]. A DREQ is retried the same way and, unanswered, ends in TimeWait.
//!
//! # What is not answered
//!
//! Every MAD that is dropped is counted (see [`CmCounters`]): wrong length, wrong class or
//! version, a comm ID of zero where one is required, messages for unknown connections (a DREQ
//! for an unknown connection is answered with DREP and a REP with REJ, as Linux does, so the
//! peer can finish), IDs or a source that do not match the connection, and messages not
//! valid in the connection's state. Get and Set of ClassPortInfo are answered; other Get/Set
//! requests get an "unsupported" status.

use super::types::*;
use crate::keys::KeyGen;
use crate::time::{Duration, Instant};
use crate::wire::mad::cm::{
    self as wcm, private_len, CmMadRepr, CmMessage, DrepRepr, DreqRepr, MraRepr, MsgCode,
    RejReason, RejRepr, RepRepr, ReqRepr, RtuRepr, SidrRepRepr, SidrReqRepr, SidrStatus, ARI_LEN,
};
use crate::wire::mad::{
    ClassPortInfoRepr, Gid, MadHeaderRepr, MadStatus, Method, MgmtClass, BASE_VERSION, MAD_LEN,
};
use crate::wire::{PKey, QpNumber};
use std::collections::{BTreeSet, HashMap, VecDeque};

/// A MAD for the QP1 layer to send.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Transmit {
    /// Where to send it.
    pub dest: MadAddr,
    /// The GRH traffic class (the IP TOS byte on RoCE v2) to send it with: a connection's
    /// MADs take its primary path's (the active side's REQ path, as Linux's CM builds its
    /// address from the path record), others 0.
    pub traffic_class: u8,
    /// The 256-byte MAD.
    pub mad: [u8; MAD_LEN],
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
enum TimerKey {
    Conn(u32),
    SidrOut(u32),
    SidrIn(u32),
    Held(u32),
}

/// Most requests held for a listener at once ([`Cm`]'s `held`); more are answered at once.
const MAX_HELD: usize = 64;

struct Conn {
    role: Role,
    state: CmState,
    peer: MadAddr,
    /// The peer's communication ID (0 until known).
    remote_id: u32,
    remote_ca_guid: u64,
    /// Passive, until accepted or rejected: the listener whose backlog this counts in.
    listen: Option<ListenId>,
    /// The transaction of the establishment (the REQ's).
    tid: u64,
    req: ReqRepr,
    qp: Option<QpParams>,
    /// How long the peer's CM takes to answer (IBA time exponent).
    peer_timeout: u8,
    max_retries: u8,
    retries_left: u8,
    deadline: Option<Instant>,
    /// The last message sent on this connection and its transaction: sent again on a timeout
    /// and on duplicates.
    last: Option<(u64, CmMessage)>,
}

struct Listener {
    id: ListenId,
    backlog: usize,
    pending: usize,
}

struct SidrOut {
    dest: MadAddr,
    tid: u64,
    req: SidrReqRepr,
    retries_left: u8,
    deadline: Option<Instant>,
}

/// A REQ or SIDR_REQ that found no listener, from a peer this CM has an established
/// connection with or for a service a consumer has reserved ([`Cm::reserve`]): held until a
/// listener for its service appears (then taken as if it had just arrived) or until its grace
/// ends (then answered as Linux answers it at once: REJ Invalid Service ID, SIDR_REP "service
/// ID not supported").
///
/// Why: a peer that is connected here already is usually an application talking to ours
/// over that connection (perftest -R: the exchange connection), and it may send its next
/// REQ before our application has called `rdma_listen` again; a REJ then ends its attempt
/// (Debian's perftest 4.5-0.17 crashes in its retry). The grace never exceeds the time the
/// REQ allows this CM to answer (its Remote CM Response Timeout), so the peer does not
/// retransmit meanwhile. Likewise a program that has bound the port it is about to listen on
/// and has told its peer the port first (qperf's server: bind, send the port, listen).
struct Held {
    src: MadAddr,
    tid: u64,
    msg: HeldMsg,
    /// The end of the grace.
    until: Instant,
    deadline: Option<Instant>,
}

#[derive(Clone, Copy)]
enum HeldMsg {
    Req(ReqRepr),
    Sidr(SidrReqRepr),
}

impl HeldMsg {
    fn service_id(&self) -> u64 {
        match self {
            HeldMsg::Req(r) => r.service_id,
            HeldMsg::Sidr(r) => r.service_id,
        }
    }
    /// The sender's ID of the request (REQ: its communication ID; SIDR: its request ID).
    fn sender_id(&self) -> (bool, u32) {
        match self {
            HeldMsg::Req(r) => (false, r.local_comm_id),
            HeldMsg::Sidr(r) => (true, r.request_id),
        }
    }
}

struct SidrIn {
    src: MadAddr,
    tid: u64,
    request_id: u32,
    /// The request's service ID (kept: the listener may be gone when the consumer answers).
    service_id: u64,
    listen: Option<ListenId>,
    answer: Option<SidrRepRepr>,
    deadline: Option<Instant>,
}

/// The IB communication manager of one port: connections, listeners, SIDR; sans-IO.
///
/// Driving it (the QP1 layer's job): give every MAD received on QP1 to
/// [`handle_mad`](Cm::handle_mad); send what [`poll_transmit`](Cm::poll_transmit) returns
/// until `None`; call [`handle_timeout`](Cm::handle_timeout) at
/// [`poll_timeout`](Cm::poll_timeout); hand [`poll_event`](Cm::poll_event)'s events to the
/// consumer (the RDMA-CM layer or an application).
pub struct Cm {
    cfg: CmConfig,
    keys: KeyGen,
    conns: HashMap<u32, Conn>,
    /// Passive connections by the active side's (CA GUID, communication ID): duplicates.
    by_remote: HashMap<(u64, u32), u32>,
    /// Passive connections by the active side's (CA GUID, QPN): stale connections.
    by_remote_qpn: HashMap<(u64, u32), u32>,
    listeners: HashMap<u64, Listener>,
    listen_ids: HashMap<ListenId, u64>,
    next_listen: u32,
    sidr_out: HashMap<u32, SidrOut>,
    sidr_in: HashMap<u32, SidrIn>,
    sidr_in_by_remote: HashMap<(Gid, u32), u32>,
    held: HashMap<u32, Held>,
    next_held: u32,
    /// Service IDs a consumer has reserved without listening yet ([`Cm::reserve`]), with how
    /// many reservations each has.
    reserved: HashMap<u64, usize>,
    timers: BTreeSet<(Instant, TimerKey)>,
    tx: VecDeque<Transmit>,
    events: VecDeque<CmEvent>,
    counters: CmCounters,
}

fn copy_private<const N: usize>(data: &[u8]) -> Result<[u8; N], CmError> {
    if data.len() > N {
        return Err(CmError::PrivateDataTooLong {
            len: data.len(),
            max: N,
        });
    }
    let mut a = [0u8; N];
    a[..data.len()].copy_from_slice(data);
    Ok(a)
}

/// A fresh non-zero ID that `taken` does not hold, with `block` as its top byte if given
/// ([`CmConfig::id_block`]).
fn fresh_id(keys: &mut KeyGen, block: Option<u8>, mut taken: impl FnMut(u32) -> bool) -> u32 {
    let Some(b) = block else {
        return keys.fresh_u32(taken);
    };
    let with = |k: u32| (u32::from(b) << 24) | (k & 0x00ff_ffff);
    with(keys.fresh_u32(|k| with(k) == 0 || taken(with(k))))
}

impl Cm {
    /// A CM with no connections and no listeners.
    pub fn new(cfg: CmConfig) -> Self {
        Cm {
            keys: KeyGen::new(cfg.seed),
            cfg,
            conns: HashMap::new(),
            by_remote: HashMap::new(),
            by_remote_qpn: HashMap::new(),
            listeners: HashMap::new(),
            listen_ids: HashMap::new(),
            next_listen: 1,
            sidr_out: HashMap::new(),
            sidr_in: HashMap::new(),
            sidr_in_by_remote: HashMap::new(),
            held: HashMap::new(),
            next_held: 1,
            reserved: HashMap::new(),
            timers: BTreeSet::new(),
            tx: VecDeque::new(),
            events: VecDeque::new(),
            counters: CmCounters::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }

    /// What was counted so far.
    pub fn counters(&self) -> &CmCounters {
        &self.counters
    }

    /// A connection's state, `None` once it is gone (after TimeWait, a REJ or a timeout).
    pub fn state(&self, id: CommId) -> Option<CmState> {
        self.conns.get(&id.0).map(|c| c.state)
    }

    /// A connection's role.
    pub fn role(&self, id: CommId) -> Option<Role> {
        self.conns.get(&id.0).map(|c| c.role)
    }

    /// A connection's QP parameters, once REP was sent or received.
    pub fn qp_params(&self, id: CommId) -> Option<QpParams> {
        self.conns.get(&id.0).and_then(|c| c.qp)
    }

    /// The number of connections tracked (TimeWait included).
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// The REQs of `listen` handed to the consumer and not answered yet.
    pub fn pending(&self, listen: ListenId) -> Option<usize> {
        let sid = self.listen_ids.get(&listen)?;
        self.listeners.get(sid).map(|l| l.pending)
    }

    // ---- the sans-IO interface ----------------------------------------------------------

    /// The next MAD to send.
    pub fn poll_transmit(&mut self, _now: Instant) -> Option<Transmit> {
        self.tx.pop_front()
    }

    /// The next event for the consumer.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// When [`handle_timeout`](Cm::handle_timeout) must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|&(t, _)| t)
    }

    /// Run every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&(t, key)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            match key {
                TimerKey::Conn(id) => {
                    if let Some(c) = self.conns.get_mut(&id) {
                        c.deadline = None;
                        self.conn_timeout(now, id);
                    }
                }
                TimerKey::SidrOut(id) => {
                    if let Some(s) = self.sidr_out.get_mut(&id) {
                        s.deadline = None;
                        self.sidr_out_timeout(now, id);
                    }
                }
                TimerKey::SidrIn(id) => {
                    if let Some(s) = self.sidr_in.get_mut(&id) {
                        s.deadline = None;
                        self.remove_sidr_in(id);
                    }
                }
                TimerKey::Held(id) => {
                    if let Some(h) = self.held.get_mut(&id) {
                        h.deadline = None;
                        self.held_timeout(now, id);
                    }
                }
            }
        }
    }

    /// Take one MAD received on QP1 from `src`.
    pub fn handle_mad(&mut self, now: Instant, src: MadAddr, bytes: &[u8]) {
        self.counters.mads_received += 1;
        if bytes.len() < MAD_LEN {
            self.counters.truncated += 1;
            return;
        }
        if bytes.len() > MAD_LEN {
            self.counters.malformed += 1;
            return;
        }
        let Ok(hdr) = MadHeaderRepr::parse(bytes) else {
            self.counters.truncated += 1;
            return;
        };
        if hdr.mgmt_class != MgmtClass::CM {
            self.counters.wrong_class += 1;
            return;
        }
        if hdr.base_version != BASE_VERSION || hdr.class_version != wcm::CLASS_VERSION {
            self.counters.bad_version += 1;
            if matches!(hdr.method, Method::GET | Method::SET) {
                self.answer_status(src, &hdr, MadStatus::BAD_VERSION);
            }
            return;
        }
        let mad = match CmMadRepr::parse(bytes) {
            Ok(m) => m,
            Err(_) => {
                self.counters.malformed += 1;
                return;
            }
        };
        match (hdr.method, mad.msg) {
            (Method::GET, CmMessage::ClassPortInfo(_)) => {
                let info = self.class_port_info();
                self.push(
                    src,
                    CmMadRepr {
                        header: hdr.response(MadStatus::OK),
                        msg: CmMessage::ClassPortInfo(info),
                    },
                );
            }
            (Method::GET | Method::SET, _) => {
                self.counters.unsupported += 1;
                self.answer_status(src, &hdr, MadStatus::UNSUPPORTED_METHOD_ATTR);
            }
            (Method::SEND, msg) => self.dispatch(now, src, hdr.transaction_id, msg),
            _ => self.counters.unsupported += 1,
        }
    }

    fn dispatch(&mut self, now: Instant, src: MadAddr, tid: u64, msg: CmMessage) {
        match msg {
            CmMessage::Req(r) => self.on_req(now, src, tid, r),
            CmMessage::Mra(r) => self.on_mra(now, src, r),
            CmMessage::Rej(r) => self.on_rej(now, src, r),
            CmMessage::Rep(r) => self.on_rep(src, tid, r),
            CmMessage::Rtu(r) => self.on_rtu(now, src, r),
            CmMessage::Dreq(r) => self.on_dreq(now, src, tid, r),
            CmMessage::Drep(r) => self.on_drep(now, src, r),
            CmMessage::SidrReq(r) => self.on_sidr_req(now, src, tid, r),
            CmMessage::SidrRep(r) => self.on_sidr_rep(src, r),
            // LAP/APR (path migration) and unknown attributes: not served.
            CmMessage::ClassPortInfo(_) | CmMessage::Other { .. } => self.counters.unsupported += 1,
        }
    }

    // ---- listeners --------------------------------------------------------------------

    /// Listen on `service_id`; at most `backlog` REQs (and SIDR_REQs) wait for the consumer's
    /// answer at once, more are dropped (their senders retry).
    pub fn listen(&mut self, service_id: u64, backlog: usize) -> Result<ListenId, CmError> {
        if self.listeners.contains_key(&service_id) {
            return Err(CmError::AlreadyListening(service_id));
        }
        let id = ListenId(self.next_listen);
        self.next_listen = self.next_listen.wrapping_add(1).max(1);
        self.listeners.insert(
            service_id,
            Listener {
                id,
                backlog,
                pending: 0,
            },
        );
        self.listen_ids.insert(id, service_id);
        // Requests held for this service are taken at the next `handle_timeout` (due now).
        let due: Vec<u32> = self
            .held
            .iter()
            .filter(|(_, h)| h.msg.service_id() == service_id)
            .map(|(&k, _)| k)
            .collect();
        for k in due {
            self.arm_key(TimerKey::Held(k), Some(Instant::ZERO));
        }
        Ok(id)
    }

    /// Change a listener's backlog (REQs already waiting stay).
    pub fn set_backlog(&mut self, id: ListenId, backlog: usize) -> Result<(), CmError> {
        let sid = self.listen_ids.get(&id).ok_or(CmError::NoSuchListener)?;
        if let Some(l) = self.listeners.get_mut(sid) {
            l.backlog = backlog;
        }
        Ok(())
    }

    /// Stop listening. Connections already handed to the consumer are not touched.
    pub fn unlisten(&mut self, id: ListenId) -> Result<(), CmError> {
        let sid = self.listen_ids.remove(&id).ok_or(CmError::NoSuchListener)?;
        self.listeners.remove(&sid);
        Ok(())
    }

    /// Reserve `service_id` for a listener that is about to come (an RDMA-CM id bound to its
    /// port): a REQ or SIDR_REQ for it that finds no listener is held for the listen grace
    /// instead of being rejected at once. A program commonly binds a port, tells its peer
    /// the port over another channel, and only then listens (qperf's server does); the
    /// peer's REQ may come in between.
    pub fn reserve(&mut self, service_id: u64) {
        *self.reserved.entry(service_id).or_default() += 1;
    }

    /// Give back a reservation of [`reserve`](Self::reserve). Requests held for the service
    /// stay held until a listener comes or their grace ends.
    pub fn release(&mut self, service_id: u64) {
        if let Some(n) = self.reserved.get_mut(&service_id) {
            *n -= 1;
            if *n == 0 {
                self.reserved.remove(&service_id);
            }
        }
    }

    fn release_backlog(&mut self, listen: Option<ListenId>) {
        if let Some(l) = listen.and_then(|l| self.listen_ids.get(&l)) {
            if let Some(l) = self.listeners.get_mut(l) {
                l.pending = l.pending.saturating_sub(1);
            }
        }
    }

    // ---- the active side ----------------------------------------------------------------

    /// Send a REQ: start connecting. Returns the new connection's ID.
    pub fn connect(&mut self, now: Instant, p: &ConnectParams) -> Result<CommId, CmError> {
        if self.conns.len() >= self.cfg.max_connections {
            return Err(CmError::TooManyConnections(self.cfg.max_connections));
        }
        let conns = &self.conns;
        let id = fresh_id(&mut self.keys, self.cfg.id_block, |k| {
            conns.contains_key(&k)
        });
        let tid = self.keys.next_u64();
        let mut path = p.path;
        if path.local_ack_timeout == 0 {
            path.local_ack_timeout = self.cfg.local_ack_timeout();
        }
        let req = ReqRepr {
            local_comm_id: id,
            service_id: p.service_id,
            local_ca_guid: self.cfg.ca_guid,
            local_qpn: p.local_qpn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            remote_cm_response_timeout: self.cfg.cm_response_timeout,
            transport: p.transport,
            ext_transport: p.ext_transport & 7,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: self.cfg.cm_response_timeout,
            retry_count: p.retry_count & 7,
            pkey: p.dest.pkey,
            path_mtu: p.path_mtu,
            rnr_retry_count: p.rnr_retry_count & 7,
            max_cm_retries: self.cfg.max_cm_retries & 0xf,
            srq: p.srq,
            primary: path,
            private_data: p.private_data,
            ..ReqRepr::default()
        };
        let conn = Conn {
            role: Role::Active,
            state: CmState::ReqSent,
            peer: p.dest,
            remote_id: 0,
            remote_ca_guid: 0,
            listen: None,
            tid,
            req,
            qp: None,
            peer_timeout: req.remote_cm_response_timeout,
            max_retries: req.max_cm_retries,
            retries_left: req.max_cm_retries,
            deadline: None,
            last: None,
        };
        self.conns.insert(id, conn);
        self.send_on(id, tid, CmMessage::Req(req));
        self.arm_response_wait(now, id);
        Ok(CommId(id))
    }

    /// Active: the consumer has set its QP up from [`CmEvent::RepReceived`]; send RTU. The
    /// connection is established ([`CmEvent::Established`]).
    ///
    /// Passive: the QP received a packet before the RTU arrived (communication established):
    /// the connection is established without the RTU.
    pub fn establish(&mut self, _now: Instant, id: CommId) -> Result<(), CmError> {
        let c = self.conn(id)?;
        match (c.role, c.state) {
            (Role::Active, CmState::RepRcvd | CmState::MraRepSent) => {
                let rtu = RtuRepr {
                    local_comm_id: id.0,
                    remote_comm_id: c.remote_id,
                    ..RtuRepr::default()
                };
                let tid = c.tid;
                self.send_on(id.0, tid, CmMessage::Rtu(rtu));
                self.set_established(id.0);
                Ok(())
            }
            (Role::Passive, CmState::RepSent | CmState::MraRepRcvd) => {
                self.arm(id.0, None);
                self.set_established(id.0);
                Ok(())
            }
            (_, s) => Err(CmError::InvalidState(s)),
        }
    }

    fn set_established(&mut self, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.state = CmState::Established;
        let qp = c.qp;
        self.counters.established += 1;
        if let Some(qp) = qp {
            self.event(CmEvent::Established { id: CommId(id), qp });
        }
    }

    // ---- the passive side ---------------------------------------------------------------

    /// Passive: accept a REQ ([`CmEvent::ReqReceived`]) with a REP. Returns what the QP must
    /// be set to; set it (to RTR at least) before the REP leaves, i.e. before the next
    /// [`poll_transmit`](Cm::poll_transmit).
    pub fn accept(
        &mut self,
        now: Instant,
        id: CommId,
        a: &AcceptParams,
    ) -> Result<QpParams, CmError> {
        let c = self.conn(id)?;
        if c.role != Role::Passive || !matches!(c.state, CmState::ReqRcvd | CmState::MraReqSent) {
            return Err(CmError::InvalidState(c.state));
        }
        let req = c.req;
        let responder_resources = a.responder_resources.min(req.initiator_depth);
        let initiator_depth = a.initiator_depth.min(req.responder_resources);
        let rep = RepRepr {
            local_comm_id: id.0,
            remote_comm_id: req.local_comm_id,
            local_qpn: a.local_qpn,
            starting_psn: a.starting_psn,
            responder_resources,
            initiator_depth,
            target_ack_delay: self.cfg.ca_ack_delay,
            rnr_retry_count: a.rnr_retry_count & 7,
            srq: a.srq,
            local_ca_guid: self.cfg.ca_guid,
            private_data: a.private_data,
            ..RepRepr::default()
        };
        let p = req.primary;
        let qp = QpParams {
            transport: req.transport,
            local_qpn: a.local_qpn,
            remote_qpn: req.local_qpn,
            sq_psn: a.starting_psn,
            rq_psn: req.starting_psn,
            path_mtu: req.path_mtu,
            max_rd_atomic: initiator_depth,
            max_dest_rd_atomic: responder_resources,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            local_ack_timeout: p.local_ack_timeout,
            pkey: req.pkey,
            local_gid: p.remote_gid,
            remote_gid: p.local_gid,
            flow_label: p.flow_label,
            traffic_class: p.traffic_class,
            hop_limit: p.hop_limit,
            sl: p.sl,
            remote_srq: req.srq,
            remote_qkey: req.local_qkey,
        };
        let c = self.conns.get_mut(&id.0).expect("checked above");
        c.state = CmState::RepSent;
        c.qp = Some(qp);
        c.retries_left = c.max_retries;
        let (tid, listen) = (c.tid, c.listen.take());
        self.release_backlog(listen);
        self.send_on(id.0, tid, CmMessage::Rep(rep));
        self.arm_response_wait(now, id.0);
        Ok(qp)
    }

    /// Reject a REQ (passive, before accepting) or a REP (active, before establishing) with
    /// `reason` (usually [`RejReason::CONSUMER`]), additional reject information and up to
    /// 148 bytes of private data. The connection is gone afterwards.
    pub fn reject(
        &mut self,
        _now: Instant,
        id: CommId,
        reason: RejReason,
        ari: &[u8],
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let c = self.conn(id)?;
        let message = match (c.role, c.state) {
            (Role::Passive, CmState::ReqRcvd | CmState::MraReqSent) => MsgCode::REQ,
            (Role::Active, CmState::RepRcvd | CmState::MraRepSent) => MsgCode::REP,
            (_, s) => return Err(CmError::InvalidState(s)),
        };
        let ari_a: [u8; ARI_LEN] = copy_private(ari)?;
        let pd: [u8; private_len::REJ] = copy_private(private_data)?;
        let rej = RejRepr {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            message_rejected: message,
            reject_info_len: ari.len() as u8,
            reason,
            ari: ari_a,
            private_data: pd,
        };
        let (peer, tid) = (c.peer, c.tid);
        self.send_rej(peer, tid, rej);
        self.remove_conn(id.0);
        Ok(())
    }

    /// Send an MRA: the consumer needs more time to answer the REQ (passive) or the REP
    /// (active); the peer waits `service_timeout` (IBA time exponent) longer.
    pub fn mra(
        &mut self,
        _now: Instant,
        id: CommId,
        service_timeout: u8,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let pd: [u8; private_len::MRA] = copy_private(private_data)?;
        let c = self.conn(id)?;
        let (message, next) = match (c.role, c.state) {
            (Role::Passive, CmState::ReqRcvd | CmState::MraReqSent) => {
                (MsgCode::REQ, CmState::MraReqSent)
            }
            (Role::Active, CmState::RepRcvd | CmState::MraRepSent) => {
                (MsgCode::REP, CmState::MraRepSent)
            }
            (_, s) => return Err(CmError::InvalidState(s)),
        };
        self.send_mra(id.0, message, service_timeout, pd);
        if let Some(c) = self.conns.get_mut(&id.0) {
            c.state = next;
        }
        Ok(())
    }

    fn send_mra(&mut self, id: u32, message: MsgCode, service_timeout: u8, pd: [u8; 222]) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let mra = MraRepr {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            message_mraed: message,
            service_timeout: service_timeout & 0x1f,
            private_data: pd,
        };
        let tid = c.tid;
        self.counters.mra_sent += 1;
        self.send_on(id, tid, CmMessage::Mra(mra));
    }

    // ---- disconnection ------------------------------------------------------------------

    /// Established: send DREQ. After a [`CmEvent::DreqReceived`]: send DREP and go to
    /// TimeWait. Up to 220 (DREQ) or 224 (DREP) bytes of private data.
    pub fn disconnect(
        &mut self,
        now: Instant,
        id: CommId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let c = self.conn(id)?;
        match c.state {
            CmState::Established => {
                let dreq = DreqRepr {
                    local_comm_id: id.0,
                    remote_comm_id: c.remote_id,
                    remote_qpn: c.qp.map_or(QpNumber::new(0), |q| q.remote_qpn),
                    private_data: copy_private(private_data)?,
                };
                let tid = self.keys.next_u64();
                let c = self.conns.get_mut(&id.0).expect("checked");
                c.state = CmState::DreqSent;
                c.retries_left = c.max_retries;
                self.send_on(id.0, tid, CmMessage::Dreq(dreq));
                self.arm_response_wait(now, id.0);
                Ok(())
            }
            CmState::DreqRcvd => {
                let pd = copy_private(private_data)?;
                let tid = c.last.map_or(c.tid, |(t, _)| t);
                self.send_drep(id.0, tid, pd);
                self.enter_timewait(now, id.0);
                Ok(())
            }
            s => Err(CmError::InvalidState(s)),
        }
    }

    /// Forget a connection the consumer no longer wants, doing what the IBTA asks for its
    /// state (as `ib_destroy_cm_id`): reject a REQ or REP not answered yet, disconnect an
    /// established connection (DREQ, then TimeWait without events), answer a DREQ. A
    /// connection already in TimeWait finishes it; its TimeWaitExit event still comes.
    pub fn destroy(&mut self, now: Instant, id: CommId) -> Result<(), CmError> {
        let state = self.conn(id)?.state;
        match state {
            CmState::ReqRcvd | CmState::MraReqSent | CmState::RepRcvd | CmState::MraRepSent => {
                self.reject(now, id, RejReason::CONSUMER, &[], &[])
            }
            CmState::ReqSent | CmState::MraReqRcvd | CmState::RepSent | CmState::MraRepRcvd => {
                let c = self.conn(id)?;
                let rej = RejRepr {
                    local_comm_id: id.0,
                    remote_comm_id: c.remote_id,
                    message_rejected: MsgCode::OTHER,
                    reason: RejReason::CONSUMER,
                    ..RejRepr::default()
                };
                let (peer, tid) = (c.peer, c.tid);
                self.send_rej(peer, tid, rej);
                self.remove_conn(id.0);
                Ok(())
            }
            CmState::Established => self.disconnect(now, id, &[]),
            CmState::DreqRcvd => self.disconnect(now, id, &[]),
            CmState::DreqSent | CmState::TimeWait => Ok(()),
        }
    }

    // ---- service ID resolution ----------------------------------------------------------

    /// Send a SIDR_REQ for `service_id` to `dest` with up to 216 bytes of private data.
    pub fn sidr_request(
        &mut self,
        now: Instant,
        dest: MadAddr,
        service_id: u64,
        private_data: &[u8],
    ) -> Result<SidrId, CmError> {
        if self.sidr_out.len() + self.conns.len() >= self.cfg.max_connections {
            return Err(CmError::TooManyConnections(self.cfg.max_connections));
        }
        let pd = copy_private(private_data)?;
        let out = &self.sidr_out;
        let id = fresh_id(&mut self.keys, self.cfg.id_block, |k| out.contains_key(&k));
        let req = SidrReqRepr {
            request_id: id,
            pkey: dest.pkey,
            service_id,
            private_data: pd,
        };
        let tid = self.keys.next_u64();
        self.sidr_out.insert(
            id,
            SidrOut {
                dest,
                tid,
                req,
                retries_left: self.cfg.max_cm_retries,
                deadline: None,
            },
        );
        self.push(dest, CmMadRepr::send(tid, CmMessage::SidrReq(req)));
        let at = now + self.cfg.response_wait(self.cfg.cm_response_timeout);
        self.arm_key(TimerKey::SidrOut(id), Some(at));
        Ok(SidrId(id))
    }

    /// Answer a SIDR_REQ ([`CmEvent::SidrReqReceived`]): `status`, and for success the QPN and
    /// Q_Key that serve the service; up to 136 bytes of private data.
    pub fn sidr_reply(
        &mut self,
        now: Instant,
        id: SidrId,
        status: SidrStatus,
        qpn: QpNumber,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let pd = copy_private(private_data)?;
        let s = self.sidr_in.get_mut(&id.0).ok_or(CmError::NoSuchSidr)?;
        if s.answer.is_some() {
            return Err(CmError::NoSuchSidr);
        }
        let service_id = s.service_id;
        let rep = SidrRepRepr {
            request_id: s.request_id,
            status,
            qpn,
            service_id,
            qkey,
            private_data: pd,
            ..SidrRepRepr::default()
        };
        s.answer = Some(rep);
        let (src, tid, listen) = (s.src, s.tid, s.listen.take());
        self.release_backlog(listen);
        self.push(src, CmMadRepr::send(tid, CmMessage::SidrRep(rep)));
        // Keep the answer for duplicates while the requester may still be retrying.
        let at = now + self.cfg.timewait_duration();
        self.arm_key(TimerKey::SidrIn(id.0), Some(at));
        Ok(())
    }

    // ---- received messages --------------------------------------------------------------

    fn on_req(&mut self, now: Instant, src: MadAddr, tid: u64, req: ReqRepr) {
        if req.local_comm_id == 0 {
            self.counters.malformed += 1;
            return;
        }
        if let Some(&id) = self.by_remote.get(&(req.local_ca_guid, req.local_comm_id)) {
            self.dup_req(now, src, id);
            return;
        }
        let Some(l) = self.listeners.get(&req.service_id) else {
            let grace = self
                .cfg
                .listen_grace
                .min(iba_time(req.remote_cm_response_timeout));
            if self.hold(now, src, tid, HeldMsg::Req(req), grace) {
                return;
            }
            self.counters.no_listener += 1;
            self.rej_unknown(
                src,
                tid,
                req.local_comm_id,
                MsgCode::REQ,
                RejReason::INVALID_SERVICE_ID,
            );
            return;
        };
        if l.pending >= l.backlog {
            self.counters.backlog_drops += 1;
            return;
        }
        if self.conns.len() >= self.cfg.max_connections {
            self.counters.table_full += 1;
            self.rej_unknown(
                src,
                tid,
                req.local_comm_id,
                MsgCode::REQ,
                RejReason::NO_RESOURCES,
            );
            return;
        }
        let listen = l.id;
        // A new REQ from a QP that still has a connection here: that connection is stale
        // (IBTA §12.9.8.3.2); reject the REQ and take the old connection down.
        if let Some(&old) = self
            .by_remote_qpn
            .get(&(req.local_ca_guid, req.local_qpn.get()))
        {
            self.rej_unknown(
                src,
                tid,
                req.local_comm_id,
                MsgCode::REQ,
                RejReason::STALE_CONNECTION,
            );
            if self.conns.get(&old).map(|c| c.state) == Some(CmState::Established) {
                let _ = self.disconnect(now, CommId(old), &[]);
            }
            return;
        }
        let conns = &self.conns;
        let id = fresh_id(&mut self.keys, self.cfg.id_block, |k| {
            conns.contains_key(&k)
        });
        let peer_timeout = req.local_cm_response_timeout;
        let conn = Conn {
            role: Role::Passive,
            state: CmState::ReqRcvd,
            peer: src,
            remote_id: req.local_comm_id,
            remote_ca_guid: req.local_ca_guid,
            listen: Some(listen),
            tid,
            req,
            qp: None,
            peer_timeout,
            max_retries: req.max_cm_retries,
            retries_left: req.max_cm_retries,
            deadline: None,
            last: None,
        };
        self.conns.insert(id, conn);
        self.by_remote
            .insert((req.local_ca_guid, req.local_comm_id), id);
        self.by_remote_qpn
            .insert((req.local_ca_guid, req.local_qpn.get()), id);
        if let Some(l) = self.listeners.get_mut(&req.service_id) {
            l.pending += 1;
        }
        // If the consumer never answers, give up when the active side has: after all of its
        // REQ retries.
        let wait = self.cfg.response_wait(req.remote_cm_response_timeout)
            * (u32::from(req.max_cm_retries) + 1);
        self.arm(id, Some(now + wait));
        self.event(CmEvent::ReqReceived {
            id: CommId(id),
            listen,
            src,
            req,
        });
    }

    fn dup_req(&mut self, now: Instant, src: MadAddr, id: u32) {
        self.counters.duplicates += 1;
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if c.peer.gid != src.gid {
            self.counters.mismatched += 1;
            return;
        }
        match c.state {
            CmState::ReqRcvd if self.cfg.auto_mra => {
                let t = self.cfg.mra_service_timeout;
                self.send_mra(id, MsgCode::REQ, t, [0; private_len::MRA]);
                if let Some(c) = self.conns.get_mut(&id) {
                    c.state = CmState::MraReqSent;
                }
            }
            CmState::MraReqSent => self.resend_last(id),
            CmState::RepSent | CmState::MraRepRcvd => {
                // The REP was lost: send it again now, and restart the wait for the RTU (the
                // retransmission timer would otherwise send it once more right away).
                self.resend_last(id);
                self.arm_response_wait(now, id);
            }
            CmState::TimeWait => {
                let c = &self.conns[&id];
                let rej = RejRepr {
                    local_comm_id: id,
                    remote_comm_id: c.remote_id,
                    message_rejected: MsgCode::REQ,
                    reason: RejReason::STALE_CONNECTION,
                    ..RejRepr::default()
                };
                let (peer, tid) = (c.peer, c.tid);
                self.send_rej(peer, tid, rej);
            }
            _ => {}
        }
    }

    fn on_mra(&mut self, now: Instant, src: MadAddr, m: MraRepr) {
        let Some(id) = self.lookup(src, m.remote_comm_id, m.local_comm_id) else {
            return;
        };
        let c = &self.conns[&id];
        let next = match (c.state, m.message_mraed) {
            (CmState::ReqSent | CmState::MraReqRcvd, MsgCode::REQ) => CmState::MraReqRcvd,
            (CmState::RepSent | CmState::MraRepRcvd, MsgCode::REP) => CmState::MraRepRcvd,
            _ => {
                self.counters.unexpected += 1;
                return;
            }
        };
        let c = self.conns.get_mut(&id).expect("looked up");
        if c.remote_id == 0 {
            c.remote_id = m.local_comm_id;
        }
        c.state = next;
        let (peer_timeout, role) = (c.peer_timeout, c.role);
        let wait = iba_time(m.service_timeout) + self.cfg.response_wait(peer_timeout);
        self.arm(id, Some(now + wait));
        if role == Role::Active {
            self.event(CmEvent::MraReceived {
                id: CommId(id),
                service_timeout: m.service_timeout,
            });
        }
    }

    fn on_rej(&mut self, now: Instant, src: MadAddr, j: RejRepr) {
        self.counters.rej_received += 1;
        let id = if j.remote_comm_id == 0 {
            // The sender never learnt our ID (an active side that got no REP gives up with
            // REJ Timeout): find the connection by the sender's ID, and its CA GUID, which a
            // Timeout REJ carries in the ARI.
            let guid = (j.reason == RejReason::TIMEOUT && j.reject_info_len >= 8)
                .then(|| u64::from_be_bytes(j.ari[..8].try_into().expect("8 bytes")));
            let found = match guid {
                Some(g) => self.by_remote.get(&(g, j.local_comm_id)).copied(),
                None => self
                    .conns
                    .iter()
                    .find(|(_, c)| c.remote_id == j.local_comm_id && c.peer.gid == src.gid)
                    .map(|(&id, _)| id),
            };
            match found {
                Some(id) if self.conns[&id].peer.gid == src.gid => id,
                Some(_) => {
                    self.counters.mismatched += 1;
                    return;
                }
                None => {
                    self.counters.unknown_id += 1;
                    return;
                }
            }
        } else {
            // A REJ of our REQ may carry no local ID (the passive side never made a
            // connection): `lookup` then matches it on our ID alone.
            let Some(id) = self.lookup(src, j.remote_comm_id, j.local_comm_id) else {
                return;
            };
            id
        };
        let state = self.conns[&id].state;
        let ev = CmEvent::Rejected {
            id: CommId(id),
            reason: j.reason,
            message: j.message_rejected,
            ari: j.ari,
            ari_len: j.reject_info_len,
            private_data: j.private_data,
        };
        match state {
            CmState::ReqSent
            | CmState::MraReqRcvd
            | CmState::ReqRcvd
            | CmState::MraReqSent
            | CmState::RepSent
            | CmState::MraRepRcvd
            | CmState::RepRcvd
            | CmState::MraRepSent => {
                self.remove_conn(id);
                self.event(ev);
            }
            CmState::Established | CmState::DreqSent | CmState::DreqRcvd => {
                // The peer gave the connection up (e.g. it timed out waiting for our RTU):
                // it is gone, but its packets may still be in flight.
                self.event(ev);
                self.enter_timewait(now, id);
            }
            CmState::TimeWait => self.counters.unexpected += 1,
        }
    }

    fn on_rep(&mut self, src: MadAddr, tid: u64, r: RepRepr) {
        let Some(c) = self.conns.get(&r.remote_comm_id) else {
            // Linux answers a REP for an unknown connection with REJ, so that a passive side
            // whose REQ's sender is gone stops retrying.
            self.counters.unknown_id += 1;
            if r.local_comm_id != 0 && r.remote_comm_id != 0 {
                self.rej_unknown(
                    src,
                    tid,
                    r.local_comm_id,
                    MsgCode::REP,
                    RejReason::INVALID_COMM_ID,
                );
            }
            return;
        };
        let id = r.remote_comm_id;
        if c.role != Role::Active || c.peer.gid != src.gid || r.local_comm_id == 0 {
            self.counters.mismatched += 1;
            return;
        }
        if c.remote_id != 0 && c.remote_id != r.local_comm_id {
            self.counters.mismatched += 1;
            return;
        }
        match c.state {
            CmState::ReqSent | CmState::MraReqRcvd => {}
            CmState::RepRcvd => {
                self.counters.duplicates += 1;
                if self.cfg.auto_mra {
                    let t = self.cfg.mra_service_timeout;
                    self.send_mra(id, MsgCode::REP, t, [0; private_len::MRA]);
                    if let Some(c) = self.conns.get_mut(&id) {
                        c.state = CmState::MraRepSent;
                    }
                }
                return;
            }
            CmState::MraRepSent | CmState::Established => {
                // Our MRA or RTU was lost: send it again.
                self.counters.duplicates += 1;
                self.resend_last(id);
                return;
            }
            _ => {
                self.counters.duplicates += 1;
                return;
            }
        }
        let req = c.req;
        let p = req.primary;
        let qp = QpParams {
            transport: req.transport,
            local_qpn: req.local_qpn,
            remote_qpn: r.local_qpn,
            sq_psn: req.starting_psn,
            rq_psn: r.starting_psn,
            path_mtu: req.path_mtu,
            max_rd_atomic: r.responder_resources.min(req.initiator_depth),
            max_dest_rd_atomic: r.initiator_depth.min(req.responder_resources),
            retry_count: req.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            local_ack_timeout: ack_timeout(r.target_ack_delay, self.cfg.packet_lifetime)
                .max(p.local_ack_timeout),
            pkey: req.pkey,
            local_gid: p.local_gid,
            remote_gid: p.remote_gid,
            flow_label: p.flow_label,
            traffic_class: p.traffic_class,
            hop_limit: p.hop_limit,
            sl: p.sl,
            remote_srq: r.srq,
            remote_qkey: r.local_qkey,
        };
        let c = self.conns.get_mut(&id).expect("checked");
        c.remote_id = r.local_comm_id;
        c.remote_ca_guid = r.local_ca_guid;
        c.state = CmState::RepRcvd;
        c.qp = Some(qp);
        self.arm(id, None);
        self.event(CmEvent::RepReceived {
            id: CommId(id),
            qp,
            rep: r,
        });
    }

    fn on_rtu(&mut self, _now: Instant, src: MadAddr, t: RtuRepr) {
        let Some(id) = self.lookup(src, t.remote_comm_id, t.local_comm_id) else {
            return;
        };
        match self.conns[&id].state {
            CmState::RepSent | CmState::MraRepRcvd => {
                self.arm(id, None);
                self.set_established(id);
            }
            CmState::Established | CmState::DreqSent | CmState::DreqRcvd | CmState::TimeWait => {
                self.counters.duplicates += 1
            }
            _ => self.counters.unexpected += 1,
        }
    }

    fn on_dreq(&mut self, now: Instant, src: MadAddr, tid: u64, d: DreqRepr) {
        let Some(c) = self.conns.get(&d.remote_comm_id) else {
            // Answer so that the peer can finish: there is nothing here to disconnect.
            self.counters.unknown_id += 1;
            if d.local_comm_id != 0 {
                let drep = DrepRepr {
                    local_comm_id: d.remote_comm_id,
                    remote_comm_id: d.local_comm_id,
                    ..DrepRepr::default()
                };
                self.push(src, CmMadRepr::send(tid, CmMessage::Drep(drep)));
            }
            return;
        };
        let id = d.remote_comm_id;
        if c.peer.gid != src.gid || c.remote_id == 0 || c.remote_id != d.local_comm_id {
            self.counters.mismatched += 1;
            return;
        }
        match c.state {
            CmState::Established | CmState::RepSent | CmState::MraRepRcvd => {
                let c = self.conns.get_mut(&id).expect("checked");
                c.state = CmState::DreqRcvd;
                // Remember the DREQ's transaction for the DREP.
                c.last = Some((tid, CmMessage::Dreq(d)));
                // A consumer that never answers does not keep the connection forever: after
                // the peer's whole patience the DREP goes out by itself.
                let wait = self.cfg.response_wait(c.peer_timeout) * (u32::from(c.max_retries) + 1);
                self.arm(id, Some(now + wait));
                self.event(CmEvent::DreqReceived {
                    id: CommId(id),
                    private_data: d.private_data,
                });
            }
            CmState::DreqSent => {
                // Both sides disconnect at once: answer theirs and consider ours answered.
                self.send_drep(id, tid, [0; private_len::DREP]);
                self.enter_timewait(now, id);
                self.event(CmEvent::Disconnected {
                    id: CommId(id),
                    how: DisconnectHow::Simultaneous,
                });
            }
            CmState::DreqRcvd => self.counters.duplicates += 1,
            CmState::TimeWait => {
                // Our DREP was lost (or we never sent one): answer again.
                self.counters.duplicates += 1;
                self.send_drep(id, tid, [0; private_len::DREP]);
            }
            _ => self.counters.unexpected += 1,
        }
    }

    fn on_drep(&mut self, now: Instant, src: MadAddr, d: DrepRepr) {
        let Some(id) = self.lookup(src, d.remote_comm_id, d.local_comm_id) else {
            return;
        };
        match self.conns[&id].state {
            CmState::DreqSent => {
                self.enter_timewait(now, id);
                self.event(CmEvent::Disconnected {
                    id: CommId(id),
                    how: DisconnectHow::DrepReceived,
                });
            }
            CmState::TimeWait => self.counters.duplicates += 1,
            _ => self.counters.unexpected += 1,
        }
    }

    fn on_sidr_req(&mut self, now: Instant, src: MadAddr, tid: u64, r: SidrReqRepr) {
        if let Some(&id) = self.sidr_in_by_remote.get(&(src.gid, r.request_id)) {
            self.counters.duplicates += 1;
            let s = &self.sidr_in[&id];
            if let Some(rep) = s.answer {
                let (src, tid) = (s.src, s.tid);
                self.push(src, CmMadRepr::send(tid, CmMessage::SidrRep(rep)));
            }
            return;
        }
        let Some(l) = self.listeners.get(&r.service_id) else {
            let grace = self
                .cfg
                .listen_grace
                .min(iba_time(self.cfg.cm_response_timeout));
            if self.hold(now, src, tid, HeldMsg::Sidr(r), grace) {
                return;
            }
            self.counters.no_listener += 1;
            self.sidr_unsupported(src, tid, &r);
            return;
        };
        if l.pending >= l.backlog {
            self.counters.backlog_drops += 1;
            return;
        }
        if self.sidr_in.len() + self.conns.len() >= self.cfg.max_connections {
            self.counters.table_full += 1;
            return;
        }
        let listen = l.id;
        let sin = &self.sidr_in;
        let id = self.keys.fresh_u32(|k| sin.contains_key(&k));
        self.sidr_in.insert(
            id,
            SidrIn {
                src,
                tid,
                request_id: r.request_id,
                service_id: r.service_id,
                listen: Some(listen),
                answer: None,
                deadline: None,
            },
        );
        self.sidr_in_by_remote.insert((src.gid, r.request_id), id);
        if let Some(l) = self.listeners.get_mut(&r.service_id) {
            l.pending += 1;
        }
        let wait = self.cfg.response_wait(self.cfg.cm_response_timeout)
            * (u32::from(self.cfg.max_cm_retries) + 1);
        self.arm_key(TimerKey::SidrIn(id), Some(now + wait));
        self.event(CmEvent::SidrReqReceived {
            id: SidrId(id),
            listen,
            src,
            req: r,
        });
    }

    fn on_sidr_rep(&mut self, src: MadAddr, r: SidrRepRepr) {
        let Some(s) = self.sidr_out.get(&r.request_id) else {
            self.counters.unknown_id += 1;
            return;
        };
        if s.dest.gid != src.gid {
            self.counters.mismatched += 1;
            return;
        }
        self.arm_key(TimerKey::SidrOut(r.request_id), None);
        self.sidr_out.remove(&r.request_id);
        self.event(CmEvent::SidrRepReceived {
            id: SidrId(r.request_id),
            rep: r,
        });
    }

    fn sidr_unsupported(&mut self, src: MadAddr, tid: u64, r: &SidrReqRepr) {
        let rep = SidrRepRepr {
            request_id: r.request_id,
            status: SidrStatus::UNSUPPORTED,
            service_id: r.service_id,
            ..SidrRepRepr::default()
        };
        self.push(src, CmMadRepr::send(tid, CmMessage::SidrRep(rep)));
    }

    // ---- requests held for a listener -----------------------------------------------------

    /// Hold a request that found no listener (see [`Held`]) if its sender has an established
    /// connection here or its service is reserved; true if held (or already held: a duplicate).
    fn hold(
        &mut self,
        now: Instant,
        src: MadAddr,
        tid: u64,
        msg: HeldMsg,
        grace: Duration,
    ) -> bool {
        if grace.is_zero() {
            return false;
        }
        let key = msg.sender_id();
        if self
            .held
            .values()
            .any(|h| h.src.gid == src.gid && h.msg.sender_id() == key)
        {
            self.counters.duplicates += 1;
            return true;
        }
        let connected = self
            .conns
            .values()
            .any(|c| c.peer.gid == src.gid && c.state == CmState::Established);
        let reserved = self.reserved.contains_key(&msg.service_id());
        if !(connected || reserved) || self.held.len() >= MAX_HELD {
            return false;
        }
        let id = self.next_held;
        self.next_held = self.next_held.wrapping_add(1).max(1);
        let until = now + grace;
        self.held.insert(
            id,
            Held {
                src,
                tid,
                msg,
                until,
                deadline: None,
            },
        );
        self.counters.held_for_listener += 1;
        self.arm_key(TimerKey::Held(id), Some(until));
        true
    }

    /// A held request's timer: a listener has appeared (take the request as if it had just
    /// arrived) or the grace is over (answer it as when nothing listens).
    fn held_timeout(&mut self, now: Instant, id: u32) {
        let Some(h) = self.held.get(&id) else {
            return;
        };
        let listening = self.listeners.contains_key(&h.msg.service_id());
        if !listening && now < h.until {
            // Woken for a listener that has gone again: wait for the rest of the grace.
            let until = h.until;
            self.arm_key(TimerKey::Held(id), Some(until));
            return;
        }
        let Some(h) = self.held.remove(&id) else {
            return;
        };
        match (listening, h.msg) {
            (true, HeldMsg::Req(r)) => self.on_req(now, h.src, h.tid, r),
            (true, HeldMsg::Sidr(r)) => self.on_sidr_req(now, h.src, h.tid, r),
            (false, HeldMsg::Req(r)) => {
                self.counters.no_listener += 1;
                self.rej_unknown(
                    h.src,
                    h.tid,
                    r.local_comm_id,
                    MsgCode::REQ,
                    RejReason::INVALID_SERVICE_ID,
                );
            }
            (false, HeldMsg::Sidr(r)) => {
                self.counters.no_listener += 1;
                self.sidr_unsupported(h.src, h.tid, &r);
            }
        }
    }

    // ---- timeouts -----------------------------------------------------------------------

    fn conn_timeout(&mut self, now: Instant, id: u32) {
        let c = &self.conns[&id];
        match c.state {
            CmState::ReqSent
            | CmState::MraReqRcvd
            | CmState::RepSent
            | CmState::MraRepRcvd
            | CmState::DreqSent => {
                if c.retries_left > 0 {
                    self.counters.retransmissions += 1;
                    self.conns.get_mut(&id).expect("exists").retries_left -= 1;
                    self.resend_last(id);
                    self.arm_response_wait(now, id);
                    return;
                }
                self.counters.timeouts += 1;
                if c.state == CmState::DreqSent {
                    self.enter_timewait(now, id);
                    self.event(CmEvent::Disconnected {
                        id: CommId(id),
                        how: DisconnectHow::DreqTimeout,
                    });
                    return;
                }
                let waiting = if c.role == Role::Active {
                    Waiting::Rep
                } else {
                    Waiting::Rtu
                };
                self.give_up(id, waiting);
            }
            CmState::ReqRcvd | CmState::MraReqSent => {
                self.counters.timeouts += 1;
                self.give_up(id, Waiting::Consumer);
            }
            CmState::TimeWait => {
                self.remove_conn(id);
                self.event(CmEvent::TimeWaitExit { id: CommId(id) });
            }
            CmState::DreqRcvd => {
                let tid = c.last.map_or(c.tid, |(t, _)| t);
                self.send_drep(id, tid, [0; private_len::DREP]);
                self.enter_timewait(now, id);
            }
            CmState::RepRcvd | CmState::MraRepSent | CmState::Established => {}
        }
    }

    /// Send REJ (Timeout, our CA GUID as ARI), report the timeout, forget the connection.
    fn give_up(&mut self, id: u32, waiting: Waiting) {
        let c = &self.conns[&id];
        let mut ari = [0u8; ARI_LEN];
        ari[..8].copy_from_slice(&self.cfg.ca_guid.to_be_bytes());
        let rej = RejRepr {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            message_rejected: match waiting {
                Waiting::Rep => MsgCode::OTHER,
                Waiting::Rtu => MsgCode::REP,
                Waiting::Consumer => MsgCode::REQ,
            },
            reject_info_len: 8,
            reason: RejReason::TIMEOUT,
            ari,
            ..RejRepr::default()
        };
        let (peer, tid) = (c.peer, c.tid);
        self.send_rej(peer, tid, rej);
        self.remove_conn(id);
        self.event(CmEvent::TimedOut {
            id: CommId(id),
            waiting,
        });
    }

    fn sidr_out_timeout(&mut self, now: Instant, id: u32) {
        let s = self.sidr_out.get_mut(&id).expect("exists");
        if s.retries_left > 0 {
            s.retries_left -= 1;
            self.counters.retransmissions += 1;
            let (dest, tid, req) = (s.dest, s.tid, s.req);
            self.push(dest, CmMadRepr::send(tid, CmMessage::SidrReq(req)));
            let at = now + self.cfg.response_wait(self.cfg.cm_response_timeout);
            self.arm_key(TimerKey::SidrOut(id), Some(at));
        } else {
            self.counters.timeouts += 1;
            self.sidr_out.remove(&id);
            self.event(CmEvent::SidrTimedOut { id: SidrId(id) });
        }
    }

    fn remove_sidr_in(&mut self, id: u32) {
        if let Some(s) = self.sidr_in.remove(&id) {
            self.sidr_in_by_remote.remove(&(s.src.gid, s.request_id));
            self.release_backlog(s.listen);
            if let Some(d) = s.deadline {
                self.timers.remove(&(d, TimerKey::SidrIn(id)));
            }
        }
    }

    // ---- helpers ------------------------------------------------------------------------

    fn conn(&self, id: CommId) -> Result<&Conn, CmError> {
        self.conns.get(&id.0).ok_or(CmError::NoSuchConnection(id))
    }

    /// The connection a message is for: ours is `ours` (the message's remote comm ID), the
    /// sender's `theirs` must match what we know of the peer (0 where the sender had none).
    fn lookup(&mut self, src: MadAddr, ours: u32, theirs: u32) -> Option<u32> {
        let Some(c) = self.conns.get(&ours) else {
            self.counters.unknown_id += 1;
            return None;
        };
        let ids_match = c.remote_id == theirs || c.remote_id == 0 || theirs == 0;
        if c.peer.gid != src.gid || !ids_match {
            self.counters.mismatched += 1;
            return None;
        }
        Some(ours)
    }

    fn resend_last(&mut self, id: u32) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if let Some((tid, msg)) = c.last {
            if matches!(msg, CmMessage::Mra(_)) {
                self.counters.mra_sent += 1;
            }
            let (peer, tc) = (c.peer, c.req.primary.traffic_class);
            self.push_tc(peer, tc, CmMadRepr::send(tid, msg));
        }
    }

    /// Send `msg` on connection `id` and remember it as the last message sent.
    fn send_on(&mut self, id: u32, tid: u64, msg: CmMessage) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.last = Some((tid, msg));
        let (peer, tc) = (c.peer, c.req.primary.traffic_class);
        self.push_tc(peer, tc, CmMadRepr::send(tid, msg));
    }

    fn send_rej(&mut self, dest: MadAddr, tid: u64, rej: RejRepr) {
        self.counters.rej_sent += 1;
        self.push(dest, CmMadRepr::send(tid, CmMessage::Rej(rej)));
    }

    /// A REJ for a message that has no connection here (local comm ID 0).
    fn rej_unknown(
        &mut self,
        dest: MadAddr,
        tid: u64,
        their_id: u32,
        message: MsgCode,
        reason: RejReason,
    ) {
        let rej = RejRepr {
            local_comm_id: 0,
            remote_comm_id: their_id,
            message_rejected: message,
            reason,
            ..RejRepr::default()
        };
        self.send_rej(dest, tid, rej);
    }

    fn send_drep(&mut self, id: u32, tid: u64, pd: [u8; private_len::DREP]) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let drep = DrepRepr {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            private_data: pd,
        };
        self.send_on(id, tid, CmMessage::Drep(drep));
    }

    fn enter_timewait(&mut self, now: Instant, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.state = CmState::TimeWait;
        let listen = c.listen.take();
        // The peer may use its QPN for a new connection now; only late duplicates of this
        // connection's own messages still match it (by communication ID).
        let k = (c.remote_ca_guid, c.req.local_qpn.get());
        if c.role == Role::Passive && self.by_remote_qpn.get(&k) == Some(&id) {
            self.by_remote_qpn.remove(&k);
        }
        self.release_backlog(listen);
        let at = now + self.cfg.timewait_duration();
        self.arm(id, Some(at));
    }

    fn remove_conn(&mut self, id: u32) {
        self.arm(id, None);
        if let Some(c) = self.conns.remove(&id) {
            if c.role == Role::Passive {
                self.by_remote.remove(&(c.remote_ca_guid, c.remote_id));
                let k = (c.remote_ca_guid, c.req.local_qpn.get());
                if self.by_remote_qpn.get(&k) == Some(&id) {
                    self.by_remote_qpn.remove(&k);
                }
            }
            self.release_backlog(c.listen);
        }
    }

    fn arm_response_wait(&mut self, now: Instant, id: u32) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let at = now + self.cfg.response_wait(c.peer_timeout);
        self.arm(id, Some(at));
    }

    fn arm(&mut self, id: u32, at: Option<Instant>) {
        self.arm_key(TimerKey::Conn(id), at);
    }

    fn arm_key(&mut self, key: TimerKey, at: Option<Instant>) {
        let slot = match key {
            TimerKey::Conn(id) => self.conns.get_mut(&id).map(|c| &mut c.deadline),
            TimerKey::SidrOut(id) => self.sidr_out.get_mut(&id).map(|s| &mut s.deadline),
            TimerKey::SidrIn(id) => self.sidr_in.get_mut(&id).map(|s| &mut s.deadline),
            TimerKey::Held(id) => self.held.get_mut(&id).map(|h| &mut h.deadline),
        };
        let Some(slot) = slot else {
            return;
        };
        if let Some(old) = slot.take() {
            self.timers.remove(&(old, key));
        }
        *slot = at;
        if let Some(t) = at {
            self.timers.insert((t, key));
        }
    }

    fn push(&mut self, dest: MadAddr, mad: CmMadRepr) {
        self.push_tc(dest, 0, mad);
    }

    fn push_tc(&mut self, dest: MadAddr, traffic_class: u8, mad: CmMadRepr) {
        if self.tx.len() >= self.cfg.max_tx_queue {
            self.counters.tx_drops += 1;
            return;
        }
        self.counters.mads_sent += 1;
        self.tx.push_back(Transmit {
            dest,
            traffic_class,
            mad: mad.to_bytes(),
        });
    }

    fn event(&mut self, e: CmEvent) {
        if self.events.len() >= self.cfg.max_events {
            self.counters.event_drops += 1;
            return;
        }
        self.events.push_back(e);
    }

    fn answer_status(&mut self, dest: MadAddr, hdr: &MadHeaderRepr, status: MadStatus) {
        let msg = CmMessage::Other {
            attr_id: hdr.attr_id,
            data: [0; crate::wire::mad::DATA_LEN],
        };
        self.push(
            dest,
            CmMadRepr {
                header: hdr.response(status),
                msg,
            },
        );
    }

    fn class_port_info(&self) -> ClassPortInfoRepr {
        ClassPortInfoRepr {
            base_version: BASE_VERSION,
            class_version: wcm::CLASS_VERSION,
            resp_time_value: self.cfg.cm_response_timeout,
            redirect_pkey: PKey::DEFAULT.0,
            ..ClassPortInfoRepr::default()
        }
    }
}

#[cfg(test)]
mod tests;
