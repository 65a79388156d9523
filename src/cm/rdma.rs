//! RDMA-CM on top of the IB CM, sans-IO: CM ids in librdmacm's shape (create, bind, resolve
//! address and route, connect, listen, accept, reject, establish, disconnect, destroy), its
//! id states (`enum rdma_cm_state`) and events (`enum rdma_cm_event_type`), the port spaces
//! and their service IDs, and the private-data header in front of the application's private
//! data in REQ and SIDR_REQ.
//!
//! # What the driver does
//!
//! Everything the IB CM needs ([`RdmaCm::handle_mad`], [`RdmaCm::poll_transmit`],
//! [`RdmaCm::poll_timeout`], [`RdmaCm::handle_timeout`]), plus address and route resolution,
//! which need the kernel's routes and neighbours: [`RdmaCm::poll_request`] hands out
//! [`Request::ResolveAddr`] / [`Request::ResolveRoute`] and the driver answers with
//! [`RdmaCm::complete_addr`] / [`RdmaCm::complete_route`] (a missing answer becomes
//! ADDR_ERROR / ROUTE_ERROR with `-ETIMEDOUT` at the caller's timeout).
//!
//! # Connecting, as librdmacm does it
//!
//! Active: `resolve_addr` → ADDR_RESOLVED, `resolve_route` → ROUTE_RESOLVED, `connect` (REQ;
//! SIDR_REQ for UD) → CONNECT_RESPONSE with the QP parameters (set the QP to RTR and RTS) →
//! `establish` (RTU) → ESTABLISHED. UD: ESTABLISHED with the remote QPN and Q_Key straight
//! from the SIDR_REP. Failures: REJECTED (status = the REJ reason, e.g. 8 when nothing
//! listens), UNREACHABLE (`-ETIMEDOUT` when no answer came).
//!
//! Passive: `bind_addr`, `listen` → CONNECT_REQUEST on a new id (the listener's child) →
//! `accept` (returns the QP parameters: set the QP to RTR before the REP leaves) → ESTABLISHED
//! on RTU; or `reject`. Then DISCONNECTED (DREQ received, or our DREQ answered or timed out)
//! and TIMEWAIT_EXIT.

use super::ib::{Cm, Transmit};
use super::types::*;
use crate::keys::KeyGen;
use crate::time::{Duration, Instant};
use crate::wire::mad::cm::{private_len, PathMtu, PathRepr, RejReason, SidrStatus};
use crate::wire::mad::rdma_cm::{
    self as wrc, service_id, HeaderRepr, PortSpace, REQ_USER_PRIVATE_LEN, SIDR_REQ_USER_PRIVATE_LEN,
};
use crate::wire::mad::Gid;
use crate::wire::{Psn, QpNumber};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};

/// Linux's errno values that librdmacm puts in an event's status.
pub mod errno {
    /// No answer in time.
    pub const ETIMEDOUT: i32 = 110;
    /// No route to the host.
    pub const EHOSTUNREACH: i32 = 113;
    /// The network is unreachable.
    pub const ENETUNREACH: i32 = 101;
    /// The address is not available here.
    pub const EADDRNOTAVAIL: i32 = 99;
    /// Connection refused (a REJ from the peer's consumer).
    pub const ECONNREFUSED: i32 = 111;
}

/// The Q_Key rdma_cm gives UD QPs of the UDP port space (`RDMA_UDP_QKEY`).
pub const UDP_QKEY: u32 = 0x0123_4567;

/// A CM id (`struct rdma_cm_id`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct RdmaId(pub u32);

/// The transport of an id's QP.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum QpKind {
    /// Reliable connection: REQ/REP/RTU.
    Rc,
    /// Unreliable datagram: SIDR.
    Ud,
}

/// An id's state (`enum rdma_cm_state`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum IdState {
    /// Created, not bound.
    Idle,
    /// Resolving the address.
    AddrQuery,
    /// The address is resolved.
    AddrResolved,
    /// Resolving the route.
    RouteQuery,
    /// The route is resolved.
    RouteResolved,
    /// Connecting or connected.
    Connect,
    /// Disconnecting or disconnected.
    Disconnect,
    /// Bound to an address (`rdma_bind_addr`).
    AddrBound,
    /// Listening.
    Listen,
}

/// An event type (`enum rdma_cm_event_type`; those an RDMA-CM over RoCE reports).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum EventType {
    /// The address is resolved.
    AddrResolved,
    /// Address resolution failed.
    AddrError,
    /// The route is resolved.
    RouteResolved,
    /// Route resolution failed.
    RouteError,
    /// A connection request on a listening id (a new id).
    ConnectRequest,
    /// The peer accepted: set the QP up and `establish`.
    ConnectResponse,
    /// The connection failed after it was set up.
    ConnectError,
    /// The peer could not be reached (no answer, or a SIDR status).
    Unreachable,
    /// The peer rejected the connection.
    Rejected,
    /// The connection is established.
    Established,
    /// The connection is down.
    Disconnected,
    /// TimeWait is over: the QP may be reused.
    TimewaitExit,
    /// A multicast join completed (made by the library itself over RoCE: no message).
    MulticastJoin,
    /// A multicast join failed.
    MulticastError,
}

impl EventType {
    /// librdmacm's name (`rdma_event_str`).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            EventType::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            EventType::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            EventType::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            EventType::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            EventType::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            EventType::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            EventType::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            EventType::Rejected => "RDMA_CM_EVENT_REJECTED",
            EventType::Established => "RDMA_CM_EVENT_ESTABLISHED",
            EventType::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            EventType::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
            EventType::MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            EventType::MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
        }
    }
}

/// Bytes of private data an event can carry (a REP's, the largest).
pub const EVENT_PRIVATE_MAX: usize = private_len::REP;

/// An event (`struct rdma_cm_event`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Event {
    /// The connection (or request, or CM id).
    pub id: RdmaId,
    /// CONNECT_REQUEST: the listening id the new `id` came from.
    pub listen_id: Option<RdmaId>,
    /// The event type.
    pub kind: EventType,
    /// 0, a negative errno, or for REJECTED the REJ reason (SIDR: the SIDR status).
    pub status: i32,
    /// The peer's private data (REQ/SIDR_REQ: after the RDMA-CM header).
    pub private_data: [u8; EVENT_PRIVATE_MAX],
    /// Bytes of `private_data` that are the peer's.
    pub private_data_len: usize,
    /// CONNECT_REQUEST: the REQ's responder resources and initiator depth, as sent.
    pub responder_resources: u8,
    /// The initiator depth (max_rd_atomic).
    pub initiator_depth: u8,
    /// The transport retry count.
    pub retry_count: u8,
    /// The RNR retry count.
    pub rnr_retry_count: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// The peer's QPN (CONNECT_REQUEST, CONNECT_RESPONSE, UD ESTABLISHED).
    pub qp_num: Option<QpNumber>,
    /// UD: the Q_Key to send with.
    pub qkey: Option<u32>,
    /// RC: what the QP must be set to (CONNECT_RESPONSE, ESTABLISHED).
    pub qp: Option<QpParams>,
    /// CONNECT_REQUEST (RC): the REQ's starting PSN, the receive PSN of a QP the consumer
    /// moves itself (`rdma_init_qp_attr` for RTR).
    pub starting_psn: Option<Psn>,
}

impl Event {
    pub(crate) fn new(id: RdmaId, kind: EventType, status: i32) -> Self {
        Event {
            id,
            listen_id: None,
            kind,
            status,
            private_data: [0; EVENT_PRIVATE_MAX],
            private_data_len: 0,
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 0,
            rnr_retry_count: 0,
            srq: false,
            qp_num: None,
            qkey: None,
            qp: None,
            starting_psn: None,
        }
    }
    fn with_private(mut self, d: &[u8]) -> Self {
        let n = d.len().min(EVENT_PRIVATE_MAX);
        self.private_data[..n].copy_from_slice(&d[..n]);
        self.private_data_len = n;
        self
    }
    /// The private data.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data[..self.private_data_len]
    }
}

/// `struct rdma_conn_param` (RC) and the UD fields of `rdma_ud_param`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ConnParam<'a> {
    /// The private data.
    pub private_data: &'a [u8],
    /// The responder resources (max_dest_rd_atomic).
    pub responder_resources: u8,
    /// The initiator depth (max_rd_atomic).
    pub initiator_depth: u8,
    /// The transport retry count.
    pub retry_count: u8,
    /// The RNR retry count.
    pub rnr_retry_count: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// The QP of this side.
    pub qp_num: QpNumber,
    /// RC: the QP's starting PSN.
    pub starting_psn: Psn,
    /// UD accept: the Q_Key the peer must use (default [`UDP_QKEY`]).
    pub qkey: u32,
    /// The QP is an XRC initiator: the REQ says so (Transport Service Type 3, Extended
    /// Transport Type 1, as Linux's CM sends for `IB_QPT_XRC_INI`).
    pub xrc: bool,
}

impl<'a> ConnParam<'a> {
    /// rping's parameters: one outstanding READ each way, retry and RNR retry 7.
    pub fn new(qp_num: QpNumber, starting_psn: Psn, private_data: &'a [u8]) -> Self {
        ConnParam {
            private_data,
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num,
            starting_psn,
            qkey: UDP_QKEY,
            xrc: false,
        }
    }
}

/// A resolved route (what `rdma_resolve_route` learns on RoCE: the GIDs are the IP addresses,
/// the rest comes from the interface and the kernel's route).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Route {
    /// The local port's GID.
    pub local_gid: Gid,
    /// The remote port's GID.
    pub remote_gid: Gid,
    /// The path MTU.
    pub path_mtu: PathMtu,
    /// The GRH hop limit.
    pub hop_limit: u8,
    /// The GRH traffic class.
    pub traffic_class: u8,
    /// The GRH flow label (20 bits).
    pub flow_label: u32,
}

impl Route {
    /// The RoCE route between two addresses: their GIDs, hop limit 64.
    pub fn roce(local: IpAddr, remote: IpAddr, path_mtu: PathMtu) -> Self {
        Route {
            local_gid: Gid::from_ip(local),
            remote_gid: Gid::from_ip(remote),
            path_mtu,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        }
    }
}

/// Something the driver must find out from the kernel.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Request {
    /// Which local address (and RoCE device) reaches `dst`? Answer with
    /// [`RdmaCm::complete_addr`].
    ResolveAddr {
        /// The connection (or request, or CM id).
        id: RdmaId,
        /// Where it came from.
        src: Option<IpAddr>,
        /// The destination.
        dst: IpAddr,
    },
    /// The route from `src` to `dst` (neighbour reachable, path MTU). Answer with
    /// [`RdmaCm::complete_route`].
    ResolveRoute {
        /// The connection (or request, or CM id).
        id: RdmaId,
        /// Where it came from.
        src: IpAddr,
        /// The destination.
        dst: IpAddr,
    },
}

/// An RDMA-CM call that cannot be done (librdmacm would return -1 with this errno).
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum RdmaCmError {
    #[error("no such CM id")]
    /// No CM id has this number.
    NoSuchId,
    #[error("not allowed in state {0:?}")]
    /// The call is not valid in this state.
    InvalidState(IdState),
    #[error("address {0} already in use")]
    /// The address and port are taken in this port space.
    AddrInUse(SocketAddr),
    #[error("no free port")]
    /// No ephemeral port is free.
    NoPort,
    #[error("private data of {len} bytes exceeds {max}")]
    /// More private data than the message holds.
    PrivateDataTooLong {
        /// The length given.
        len: usize,
        /// The most the message holds.
        max: usize,
    },
    #[error("address families of source and destination differ")]
    /// Source and destination are not of one address family.
    FamilyMismatch,
    #[error(transparent)]
    /// The IB CM refused.
    Cm(#[from] CmError),
}

struct Id {
    ps: PortSpace,
    kind: QpKind,
    state: IdState,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    route: Option<Route>,
    comm: Option<CommId>,
    sidr: Option<SidrId>,
    /// Listening: the IB CM listener and the backlog.
    listen: Option<(ListenId, usize)>,
    /// A connection request's listening id.
    parent: Option<RdmaId>,
    /// Pending address or route resolution.
    deadline: Option<Instant>,
    /// DISCONNECTED was reported.
    disconnected: bool,
    /// A connection request not accepted or rejected yet (counts in the parent's backlog).
    pending: bool,
    /// `RDMA_OPTION_ID_TOS`: the traffic class (the IP TOS byte on RoCE v2) of the route and
    /// of the QP's packets; a request's id takes its listener's.
    tos: Option<u8>,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the QP's Local ACK Timeout exponent instead of the one
    /// the CM computes; a request's id takes its listener's.
    ack_timeout: Option<u8>,
    /// The REP's private data (active side), reported again with ESTABLISHED as the
    /// kernel's RDMA-CM reports it when the id has a QP (rsockets read the peer's
    /// connection data there).
    rep_private: Vec<u8>,
}

/// RDMA-CM over one port's IB CM; sans-IO (see the module documentation).
pub struct RdmaCm {
    cm: Cm,
    keys: KeyGen,
    ids: HashMap<u32, Id>,
    next_id: u32,
    by_comm: HashMap<CommId, u32>,
    by_sidr: HashMap<SidrId, u32>,
    /// Ports in use per port space: port → ids bound to it.
    ports: HashMap<(PortSpace, u16), Vec<u32>>,
    /// IB CM listeners by service ID, and how many RDMA ids listen on it.
    services: HashMap<u64, (ListenId, usize)>,
    timers: BTreeSet<(Instant, u32)>,
    requests: VecDeque<Request>,
    events: VecDeque<Event>,
}

impl RdmaCm {
    /// RDMA-CM over a new IB CM with `cfg`.
    pub fn new(cfg: CmConfig) -> Self {
        RdmaCm {
            keys: KeyGen::new(cfg.seed.map(|s| s ^ 0x5244_4d41)),
            cm: Cm::new(cfg),
            ids: HashMap::new(),
            next_id: 1,
            by_comm: HashMap::new(),
            by_sidr: HashMap::new(),
            ports: HashMap::new(),
            services: HashMap::new(),
            timers: BTreeSet::new(),
            requests: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// The IB CM underneath (counters, connection states).
    pub fn ib(&self) -> &Cm {
        &self.cm
    }

    /// An id's state.
    pub fn state(&self, id: RdmaId) -> Option<IdState> {
        self.ids.get(&id.0).map(|i| i.state)
    }

    /// An id's transport (RC, or UD over SIDR), from its port space.
    pub fn kind(&self, id: RdmaId) -> Option<QpKind> {
        self.ids.get(&id.0).map(|i| i.kind)
    }

    /// An id's IB CM connection.
    pub fn comm_id(&self, id: RdmaId) -> Option<CommId> {
        self.ids.get(&id.0).and_then(|i| i.comm)
    }

    /// An id's local address (`rdma_get_local_addr`).
    pub fn local_addr(&self, id: RdmaId) -> Option<SocketAddr> {
        self.ids.get(&id.0).and_then(|i| i.src)
    }

    /// The address an id is bound to and the service ID it listens on (or would, once
    /// `rdma_listen`): its port in its port space.
    pub fn service_of(&self, id: RdmaId) -> Option<(SocketAddr, u64)> {
        let i = self.ids.get(&id.0)?;
        let src = i.src?;
        Some((src, service_id::of(i.ps, src.port())))
    }

    /// The service ID an id would listen on at `port` (its port space's), `None` for an id
    /// that is not there.
    pub fn service_for(&self, id: RdmaId, port: u16) -> Option<u64> {
        let i = self.ids.get(&id.0)?;
        Some(service_id::of(i.ps, port))
    }

    /// An id's peer address (`rdma_get_peer_addr`).
    pub fn peer_addr(&self, id: RdmaId) -> Option<SocketAddr> {
        self.ids.get(&id.0).and_then(|i| i.dst)
    }

    /// An id's route.
    pub fn route(&self, id: RdmaId) -> Option<Route> {
        self.ids.get(&id.0).and_then(|i| i.route)
    }

    /// The number of ids.
    pub fn id_count(&self) -> usize {
        self.ids.len()
    }

    /// Every id, in creation order.
    pub fn ids(&self) -> Vec<RdmaId> {
        let mut v: Vec<RdmaId> = self.ids.keys().map(|&i| RdmaId(i)).collect();
        v.sort_by_key(|i| i.0);
        v
    }

    // ---- the sans-IO interface ----------------------------------------------------------

    /// A MAD received on QP1.
    pub fn handle_mad(&mut self, now: Instant, src: MadAddr, bytes: &[u8]) {
        self.cm.handle_mad(now, src, bytes);
        self.drain(now);
    }

    /// The next MAD to send.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        self.cm.poll_transmit(now)
    }

    /// The next timer.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let own = self.timers.first().map(|&(t, _)| t);
        match (self.cm.poll_timeout(), own) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Run the timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.cm.handle_timeout(now);
        while let Some(&(t, id)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            let Some(i) = self.ids.get_mut(&id) else {
                continue;
            };
            i.deadline = None;
            let kind = match i.state {
                IdState::AddrQuery => {
                    i.state = if i.src.is_some() {
                        IdState::AddrBound
                    } else {
                        IdState::Idle
                    };
                    EventType::AddrError
                }
                IdState::RouteQuery => {
                    i.state = IdState::AddrResolved;
                    EventType::RouteError
                }
                _ => continue,
            };
            self.event(Event::new(RdmaId(id), kind, -errno::ETIMEDOUT));
        }
        self.drain(now);
    }

    /// The next event (`rdma_get_cm_event`).
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The next question for the kernel.
    pub fn poll_request(&mut self) -> Option<Request> {
        self.requests.pop_front()
    }

    // ---- ids and addresses --------------------------------------------------------------

    /// `rdma_create_id`: a new id in port space `ps` (UDP and IPoIB ids use UD QPs).
    pub fn create_id(&mut self, ps: PortSpace) -> RdmaId {
        let kind = if matches!(ps, PortSpace::UDP | PortSpace::IPOIB) {
            QpKind::Ud
        } else {
            QpKind::Rc
        };
        self.new_id(ps, kind, IdState::Idle)
    }

    fn new_id(&mut self, ps: PortSpace, kind: QpKind, state: IdState) -> RdmaId {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.ids.insert(
            id,
            Id {
                ps,
                kind,
                state,
                src: None,
                dst: None,
                route: None,
                comm: None,
                sidr: None,
                listen: None,
                parent: None,
                deadline: None,
                disconnected: false,
                pending: false,
                tos: None,
                ack_timeout: None,
                rep_private: Vec::new(),
            },
        );
        RdmaId(id)
    }

    /// `rdma_set_option(RDMA_OPTION_ID, RDMA_OPTION_ID_TOS)`: the traffic class of the id's
    /// route (resolved after this; a route already resolved takes it too) and of its
    /// connection's packets, both ways on a connection this side accepts (as Linux's
    /// `rdma_set_service_type`; without it, the traffic class is 0 or, on the passive side,
    /// the REQ's).
    pub fn set_tos(&mut self, id: RdmaId, tos: u8) -> Result<(), RdmaCmError> {
        let i = self.id_mut(id)?;
        i.tos = Some(tos);
        if let Some(r) = i.route.as_mut() {
            r.traffic_class = tos;
        }
        Ok(())
    }

    /// `rdma_set_option(RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT)`: the Local ACK Timeout
    /// exponent (4.096 µs × 2^`t`, 5 bits) of the connection's QP, instead of the one computed
    /// from the packet lifetime and the peer's ACK delay (Linux's `rdma_set_ack_timeout`).
    pub fn set_ack_timeout(&mut self, id: RdmaId, t: u8) -> Result<(), RdmaCmError> {
        self.id_mut(id)?.ack_timeout = Some(t & 0x1f);
        Ok(())
    }

    /// The id's options (or its listener's) applied to the QP attributes the CM computed.
    fn tune(&self, id: RdmaId, qp: &mut QpParams) {
        let Ok(i) = self.id(id) else { return };
        let parent = i.parent.and_then(|p| self.id(p).ok());
        if let Some(t) = i.tos.or(parent.and_then(|p| p.tos)) {
            qp.traffic_class = t;
        }
        if let Some(t) = i.ack_timeout.or(parent.and_then(|p| p.ack_timeout)) {
            qp.local_ack_timeout = t;
        }
    }

    fn id(&self, id: RdmaId) -> Result<&Id, RdmaCmError> {
        self.ids.get(&id.0).ok_or(RdmaCmError::NoSuchId)
    }

    fn id_mut(&mut self, id: RdmaId) -> Result<&mut Id, RdmaCmError> {
        self.ids.get_mut(&id.0).ok_or(RdmaCmError::NoSuchId)
    }

    /// `rdma_bind_addr`: bind to an address and port (port 0: an ephemeral port; an
    /// unspecified address listens on every address).
    pub fn bind_addr(&mut self, id: RdmaId, addr: SocketAddr) -> Result<(), RdmaCmError> {
        let i = self.id(id)?;
        if i.state != IdState::Idle {
            return Err(RdmaCmError::InvalidState(i.state));
        }
        let ps = i.ps;
        let port = if addr.port() == 0 {
            self.ephemeral_port(ps)?
        } else {
            if let Some(users) = self.ports.get(&(ps, addr.port())) {
                let clash = users.iter().any(|u| {
                    self.ids[u].src.is_some_and(|s| {
                        s.ip() == addr.ip() || s.ip().is_unspecified() || addr.ip().is_unspecified()
                    })
                });
                if clash {
                    return Err(RdmaCmError::AddrInUse(addr));
                }
            }
            addr.port()
        };
        let users = self.ports.entry((ps, port)).or_default();
        users.push(id.0);
        if users.len() == 1 {
            // A bound port is usually about to listen: a REQ that comes first waits for it.
            self.cm.reserve(service_id::of(ps, port));
        }
        let i = self.id_mut(id)?;
        i.src = Some(SocketAddr::new(addr.ip(), port));
        i.state = IdState::AddrBound;
        Ok(())
    }

    fn ephemeral_port(&mut self, ps: PortSpace) -> Result<u16, RdmaCmError> {
        // Linux's default ip_local_port_range, 32768..=60999, from a random start.
        let (lo, n) = (32_768u32, 28_232u32);
        let start = self.keys.next_u32() % n;
        (0..n)
            .map(|k| (lo + (start + k) % n) as u16)
            .find(|p| !self.ports.contains_key(&(ps, *p)))
            .ok_or(RdmaCmError::NoPort)
    }

    fn unbind(&mut self, id: u32) {
        let Some(src) = self.ids.get(&id).and_then(|i| i.src) else {
            return;
        };
        let ps = self.ids[&id].ps;
        if let Some(v) = self.ports.get_mut(&(ps, src.port())) {
            v.retain(|&u| u != id);
            if v.is_empty() {
                self.ports.remove(&(ps, src.port()));
                self.cm.release(service_id::of(ps, src.port()));
            }
        }
    }

    /// `rdma_resolve_addr`: find the local address for `dst` (binding to an ephemeral port if
    /// the id is not bound). ADDR_RESOLVED or ADDR_ERROR follows.
    pub fn resolve_addr(
        &mut self,
        now: Instant,
        id: RdmaId,
        src: Option<IpAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), RdmaCmError> {
        let i = self.id(id)?;
        if !matches!(i.state, IdState::Idle | IdState::AddrBound) {
            return Err(RdmaCmError::InvalidState(i.state));
        }
        let src = src.or(i.src.map(|s| s.ip()).filter(|ip| !ip.is_unspecified()));
        if src.is_some_and(|s| s.is_ipv4() != dst.is_ipv4()) {
            return Err(RdmaCmError::FamilyMismatch);
        }
        let i = self.id_mut(id)?;
        i.dst = Some(dst);
        i.state = IdState::AddrQuery;
        self.requests.push_back(Request::ResolveAddr {
            id,
            src,
            dst: dst.ip(),
        });
        self.arm(id.0, Some(now + timeout));
        Ok(())
    }

    /// The driver's answer to [`Request::ResolveAddr`]: the local address that reaches the
    /// destination, or an errno (`EHOSTUNREACH`, `EADDRNOTAVAIL`, ...).
    pub fn complete_addr(
        &mut self,
        now: Instant,
        id: RdmaId,
        result: Result<IpAddr, i32>,
    ) -> Result<(), RdmaCmError> {
        let i = self.id(id)?;
        if i.state != IdState::AddrQuery {
            return Err(RdmaCmError::InvalidState(i.state));
        }
        self.arm(id.0, None);
        match result {
            Ok(local) => {
                let i = self.id_mut(id)?;
                if i.src.is_none() {
                    i.state = IdState::Idle;
                    self.bind_addr(id, SocketAddr::new(local, 0))?;
                } else if let Some(s) = i.src.as_mut() {
                    s.set_ip(local);
                }
                self.id_mut(id)?.state = IdState::AddrResolved;
                self.event(Event::new(id, EventType::AddrResolved, 0));
            }
            Err(e) => {
                let i = self.id_mut(id)?;
                i.state = if i.src.is_some() {
                    IdState::AddrBound
                } else {
                    IdState::Idle
                };
                self.event(Event::new(id, EventType::AddrError, -e.abs()));
            }
        }
        let _ = now;
        Ok(())
    }

    /// `rdma_resolve_route`. ROUTE_RESOLVED or ROUTE_ERROR follows.
    pub fn resolve_route(
        &mut self,
        now: Instant,
        id: RdmaId,
        timeout: Duration,
    ) -> Result<(), RdmaCmError> {
        let i = self.id(id)?;
        if i.state != IdState::AddrResolved {
            return Err(RdmaCmError::InvalidState(i.state));
        }
        let (src, dst) = (i.src.expect("resolved").ip(), i.dst.expect("resolved").ip());
        self.id_mut(id)?.state = IdState::RouteQuery;
        self.requests
            .push_back(Request::ResolveRoute { id, src, dst });
        self.arm(id.0, Some(now + timeout));
        Ok(())
    }

    /// `rdma_set_option(RDMA_OPTION_IB, RDMA_OPTION_IB_PATH)`: the route given by the consumer
    /// (a path record from an SA or ibacm) instead of resolving it, as Linux's
    /// `rdma_set_ib_path`: only once the address is resolved; ROUTE_RESOLVED follows. An
    /// id's TOS option still overrides the path's traffic class.
    pub fn set_route(&mut self, id: RdmaId, route: Route) -> Result<(), RdmaCmError> {
        let i = self.id(id)?;
        if i.state != IdState::AddrResolved {
            return Err(RdmaCmError::InvalidState(i.state));
        }
        self.route_resolved(id, route);
        Ok(())
    }

    /// The id's route is `route` (its TOS option, if any, the traffic class): ROUTE_RESOLVED.
    fn route_resolved(&mut self, id: RdmaId, mut route: Route) {
        let Ok(i) = self.id_mut(id) else { return };
        if let Some(t) = i.tos {
            route.traffic_class = t;
        }
        i.route = Some(route);
        i.state = IdState::RouteResolved;
        self.event(Event::new(id, EventType::RouteResolved, 0));
    }

    /// The driver's answer to [`Request::ResolveRoute`].
    pub fn complete_route(
        &mut self,
        _now: Instant,
        id: RdmaId,
        result: Result<Route, i32>,
    ) -> Result<(), RdmaCmError> {
        let i = self.id(id)?;
        if i.state != IdState::RouteQuery {
            return Err(RdmaCmError::InvalidState(i.state));
        }
        self.arm(id.0, None);
        match result {
            Ok(r) => self.route_resolved(id, r),
            Err(e) => {
                self.id_mut(id)?.state = IdState::AddrResolved;
                self.event(Event::new(id, EventType::RouteError, -e.abs()));
            }
        }
        Ok(())
    }

    // ---- the active side ----------------------------------------------------------------

    /// `rdma_connect`: REQ (RC) or SIDR_REQ (UD) with the RDMA-CM header and up to 56 (RC)
    /// or 180 (UD) bytes of the application's private data.
    pub fn connect(
        &mut self,
        now: Instant,
        id: RdmaId,
        p: &ConnParam<'_>,
    ) -> Result<(), RdmaCmError> {
        let i = self.id(id)?;
        if i.state != IdState::RouteResolved {
            return Err(RdmaCmError::InvalidState(i.state));
        }
        let (src, dst, route, ps, kind) = (
            i.src.expect("bound"),
            i.dst.expect("resolved"),
            i.route.expect("resolved"),
            i.ps,
            i.kind,
        );
        let max = match kind {
            QpKind::Rc => REQ_USER_PRIVATE_LEN,
            QpKind::Ud => SIDR_REQ_USER_PRIVATE_LEN,
        };
        if p.private_data.len() > max {
            return Err(RdmaCmError::PrivateDataTooLong {
                len: p.private_data.len(),
                max,
            });
        }
        let hdr = HeaderRepr {
            src_ip: src.ip(),
            src_port: src.port(),
            dst_ip: dst.ip(),
        };
        let sid = service_id::of(ps, dst.port());
        let dest = MadAddr::gsi(route.remote_gid);
        match kind {
            QpKind::Rc => {
                let mut cp =
                    ConnectParams::rc(sid, dest, route.local_gid, p.qp_num, p.starting_psn);
                cp.path_mtu = route.path_mtu;
                cp.responder_resources = p.responder_resources;
                cp.initiator_depth = p.initiator_depth;
                cp.retry_count = p.retry_count;
                cp.rnr_retry_count = p.rnr_retry_count;
                cp.srq = p.srq;
                if p.xrc {
                    cp.transport = crate::wire::mad::cm::TransportType::EXTENDED;
                    cp.ext_transport = 1;
                }
                cp.path = PathRepr {
                    hop_limit: route.hop_limit,
                    traffic_class: route.traffic_class,
                    flow_label: route.flow_label,
                    ..cp.path
                };
                hdr.emit(&mut cp.private_data)
                    .map_err(|_| RdmaCmError::FamilyMismatch)?;
                cp.private_data[wrc::HEADER_LEN..wrc::HEADER_LEN + p.private_data.len()]
                    .copy_from_slice(p.private_data);
                let comm = self.cm.connect(now, &cp)?;
                self.by_comm.insert(comm, id.0);
                let i = self.id_mut(id)?;
                i.comm = Some(comm);
                i.state = IdState::Connect;
            }
            QpKind::Ud => {
                let mut pd = [0u8; private_len::SIDR_REQ];
                hdr.emit(&mut pd).map_err(|_| RdmaCmError::FamilyMismatch)?;
                pd[wrc::HEADER_LEN..wrc::HEADER_LEN + p.private_data.len()]
                    .copy_from_slice(p.private_data);
                let s = self.cm.sidr_request(now, dest, sid, &pd)?;
                self.by_sidr.insert(s, id.0);
                let i = self.id_mut(id)?;
                i.sidr = Some(s);
                i.state = IdState::Connect;
            }
        }
        Ok(())
    }

    /// `rdma_establish`: after CONNECT_RESPONSE, with the QP at RTS: send RTU. ESTABLISHED
    /// follows.
    pub fn establish(&mut self, now: Instant, id: RdmaId) -> Result<(), RdmaCmError> {
        let comm = self
            .id(id)?
            .comm
            .ok_or(RdmaCmError::InvalidState(IdState::Connect))?;
        self.cm.establish(now, comm)?;
        self.drain(now);
        Ok(())
    }

    // ---- the passive side ---------------------------------------------------------------

    /// `rdma_listen`: at most `backlog` connection requests wait for `accept`/`reject`.
    pub fn listen(&mut self, id: RdmaId, backlog: usize) -> Result<(), RdmaCmError> {
        let i = self.id(id)?;
        if i.state != IdState::AddrBound {
            return Err(RdmaCmError::InvalidState(i.state));
        }
        let sid = service_id::of(i.ps, i.src.expect("bound").port());
        let backlog = backlog.max(1);
        let lid = match self.services.get_mut(&sid) {
            Some((lid, n)) => {
                *n += 1;
                *lid
            }
            None => {
                let lid = self.cm.listen(sid, 0)?;
                self.services.insert(sid, (lid, 1));
                lid
            }
        };
        let i = self.id_mut(id)?;
        i.listen = Some((lid, backlog));
        i.state = IdState::Listen;
        self.update_backlog(sid);
        Ok(())
    }

    /// The IB CM listener's backlog is the sum of its RDMA listeners'.
    fn update_backlog(&mut self, sid: u64) {
        let Some(&(lid, _)) = self.services.get(&sid) else {
            return;
        };
        let total: usize = self
            .ids
            .values()
            .filter(|i| i.state == IdState::Listen && i.listen.is_some_and(|(l, _)| l == lid))
            .map(|i| i.listen.map_or(0, |(_, b)| b))
            .sum();
        let _ = self.cm.set_backlog(lid, total);
    }

    /// `rdma_accept`: REP (RC; returns what the QP must be set to, before the REP leaves at
    /// the next `poll_transmit`) or SIDR_REP with success (UD; the QPN and Q_Key of `p`).
    pub fn accept(
        &mut self,
        now: Instant,
        id: RdmaId,
        p: &ConnParam<'_>,
    ) -> Result<Option<QpParams>, RdmaCmError> {
        let i = self.id(id)?;
        if i.state != IdState::Connect || i.parent.is_none() {
            return Err(RdmaCmError::InvalidState(i.state));
        }
        match (i.comm, i.sidr) {
            (Some(comm), _) => {
                let mut a = AcceptParams::new(p.qp_num, p.starting_psn);
                a.responder_resources = p.responder_resources;
                a.initiator_depth = p.initiator_depth;
                a.rnr_retry_count = p.rnr_retry_count;
                a.srq = p.srq;
                a.private_data = copy_max(p.private_data)?;
                let mut qp = self.cm.accept(now, comm, &a)?;
                self.id_mut(id)?.pending = false;
                self.tune(id, &mut qp);
                Ok(Some(qp))
            }
            (None, Some(s)) => {
                self.cm.sidr_reply(
                    now,
                    s,
                    SidrStatus::SUCCESS,
                    p.qp_num,
                    p.qkey,
                    p.private_data,
                )?;
                self.by_sidr.remove(&s);
                self.id_mut(id)?.pending = false;
                Ok(None)
            }
            (None, None) => Err(RdmaCmError::InvalidState(IdState::Connect)),
        }
    }

    /// `rdma_reject`: REJ (consumer reject) or SIDR_REP (rejected), with private data.
    pub fn reject(
        &mut self,
        now: Instant,
        id: RdmaId,
        private_data: &[u8],
    ) -> Result<(), RdmaCmError> {
        let i = self.id(id)?;
        match (i.comm, i.sidr) {
            (Some(comm), _) => {
                self.cm
                    .reject(now, comm, RejReason::CONSUMER, &[], private_data)?;
                self.by_comm.remove(&comm);
                self.id_mut(id)?.comm = None;
            }
            (None, Some(s)) => {
                self.cm.sidr_reply(
                    now,
                    s,
                    SidrStatus::REJECT,
                    QpNumber::new(0),
                    0,
                    private_data,
                )?;
                self.by_sidr.remove(&s);
            }
            (None, None) => return Err(RdmaCmError::InvalidState(i.state)),
        }
        let i = self.id_mut(id)?;
        i.state = IdState::Idle;
        i.pending = false;
        Ok(())
    }

    /// `rdma_disconnect`: DREQ, or DREP after the peer's DREQ.
    pub fn disconnect(&mut self, now: Instant, id: RdmaId) -> Result<(), RdmaCmError> {
        let i = self.id(id)?;
        let comm = i.comm.ok_or(RdmaCmError::InvalidState(i.state))?;
        match self.cm.state(comm) {
            Some(CmState::Established | CmState::DreqRcvd) => {
                self.cm.disconnect(now, comm, &[])?;
            }
            Some(CmState::RepSent | CmState::MraRepRcvd) => {
                // The RTU has not come: the connection is usable (the peer may send) and
                // being taken down before it was established.
                self.cm.establish(now, comm)?;
                self.cm.disconnect(now, comm, &[])?;
            }
            Some(s) => return Err(CmError::InvalidState(s).into()),
            None => return Err(RdmaCmError::InvalidState(i.state)),
        }
        self.id_mut(id)?.state = IdState::Disconnect;
        self.drain(now);
        Ok(())
    }

    /// `rdma_destroy_id`: forget the id, doing what its connection's state needs (reject a
    /// pending request, disconnect, answer a DREQ). Its connection's TimeWait goes on in the
    /// IB CM, without events.
    pub fn destroy_id(&mut self, now: Instant, id: RdmaId) -> Result<(), RdmaCmError> {
        let i = self.id(id)?;
        let (comm, sidr, listen, src, ps, parent) =
            (i.comm, i.sidr, i.listen, i.src, i.ps, i.parent);
        if let Some(comm) = comm {
            let _ = self.cm.destroy(now, comm);
            self.by_comm.remove(&comm);
        }
        if let Some(s) = sidr {
            if self.by_sidr.remove(&s).is_some() && parent.is_some() {
                let _ = self
                    .cm
                    .sidr_reply(now, s, SidrStatus::REJECT, QpNumber::new(0), 0, &[]);
            }
        }
        self.arm(id.0, None);
        self.unbind(id.0);
        self.ids.remove(&id.0);
        if let (Some((lid, _)), Some(src)) = (listen, src) {
            let sid = service_id::of(ps, src.port());
            if let Some((_, n)) = self.services.get_mut(&sid) {
                *n -= 1;
                if *n == 0 {
                    self.services.remove(&sid);
                    let _ = self.cm.unlisten(lid);
                } else {
                    self.update_backlog(sid);
                }
            }
        }
        // Children of a destroyed listener keep going on their own.
        for c in self.ids.values_mut() {
            if c.parent == Some(id) {
                c.parent = Some(RdmaId(0));
            }
        }
        self.drain(now);
        Ok(())
    }

    // ---- IB CM events -------------------------------------------------------------------

    /// Turn the IB CM's events into RDMA-CM events.
    fn drain(&mut self, now: Instant) {
        while let Some(e) = self.cm.poll_event() {
            self.on_cm_event(now, e);
        }
    }

    fn on_cm_event(&mut self, now: Instant, e: CmEvent) {
        match e {
            CmEvent::ReqReceived {
                id, listen, req, ..
            } => self.on_req(now, id, listen, &req),
            CmEvent::SidrReqReceived {
                id, listen, req, ..
            } => self.on_sidr_req(now, id, listen, req.service_id, &req.private_data),
            CmEvent::MraReceived { .. } => {}
            CmEvent::RepReceived { id, mut qp, rep } => {
                let Some(&rid) = self.by_comm.get(&id) else {
                    return;
                };
                self.tune(RdmaId(rid), &mut qp);
                if let Some(i) = self.ids.get_mut(&rid) {
                    i.rep_private = rep.private_data.to_vec();
                }
                let mut ev = Event::new(RdmaId(rid), EventType::ConnectResponse, 0)
                    .with_private(&rep.private_data);
                ev.qp = Some(qp);
                ev.qp_num = Some(rep.local_qpn);
                ev.responder_resources = rep.responder_resources;
                ev.initiator_depth = rep.initiator_depth;
                ev.rnr_retry_count = rep.rnr_retry_count;
                ev.srq = rep.srq;
                self.event(ev);
            }
            CmEvent::Established { id, mut qp } => {
                let Some(&rid) = self.by_comm.get(&id) else {
                    return;
                };
                self.tune(RdmaId(rid), &mut qp);
                let rep = self
                    .ids
                    .get_mut(&rid)
                    .map(|i| std::mem::take(&mut i.rep_private))
                    .unwrap_or_default();
                let mut ev = Event::new(RdmaId(rid), EventType::Established, 0).with_private(&rep);
                ev.qp = Some(qp);
                ev.qp_num = Some(qp.remote_qpn);
                self.event(ev);
            }
            CmEvent::Rejected {
                id,
                reason,
                private_data,
                ..
            } => {
                let Some(rid) = self.by_comm.remove(&id) else {
                    return;
                };
                if let Some(i) = self.ids.get_mut(&rid) {
                    i.comm = None;
                    i.state = IdState::Idle;
                    i.pending = false;
                }
                let ev = Event::new(RdmaId(rid), EventType::Rejected, i32::from(reason.0))
                    .with_private(&private_data);
                self.event(ev);
            }
            CmEvent::TimedOut { id, .. } => {
                let Some(rid) = self.by_comm.remove(&id) else {
                    return;
                };
                if let Some(i) = self.ids.get_mut(&rid) {
                    i.comm = None;
                    i.state = IdState::Idle;
                    i.pending = false;
                }
                self.event(Event::new(
                    RdmaId(rid),
                    EventType::Unreachable,
                    -errno::ETIMEDOUT,
                ));
            }
            CmEvent::DreqReceived { id, .. } | CmEvent::Disconnected { id, .. } => {
                let Some(&rid) = self.by_comm.get(&id) else {
                    return;
                };
                let i = self.ids.get_mut(&rid).expect("indexed ids exist");
                i.state = IdState::Disconnect;
                if !i.disconnected {
                    i.disconnected = true;
                    self.event(Event::new(RdmaId(rid), EventType::Disconnected, 0));
                }
            }
            CmEvent::TimeWaitExit { id } => {
                let Some(rid) = self.by_comm.remove(&id) else {
                    return;
                };
                if let Some(i) = self.ids.get_mut(&rid) {
                    i.comm = None;
                }
                self.event(Event::new(RdmaId(rid), EventType::TimewaitExit, 0));
            }
            CmEvent::SidrRepReceived { id, rep } => {
                let Some(rid) = self.by_sidr.remove(&id) else {
                    return;
                };
                if let Some(i) = self.ids.get_mut(&rid) {
                    i.sidr = None;
                }
                let ev = if rep.status == SidrStatus::SUCCESS {
                    let mut ev = Event::new(RdmaId(rid), EventType::Established, 0)
                        .with_private(&rep.private_data);
                    ev.qp_num = Some(rep.qpn);
                    ev.qkey = Some(rep.qkey);
                    ev
                } else {
                    if let Some(i) = self.ids.get_mut(&rid) {
                        i.state = IdState::RouteResolved;
                    }
                    Event::new(RdmaId(rid), EventType::Unreachable, i32::from(rep.status.0))
                        .with_private(&rep.private_data)
                };
                self.event(ev);
            }
            CmEvent::SidrTimedOut { id } => {
                let Some(rid) = self.by_sidr.remove(&id) else {
                    return;
                };
                if let Some(i) = self.ids.get_mut(&rid) {
                    i.sidr = None;
                    i.state = IdState::RouteResolved;
                }
                self.event(Event::new(
                    RdmaId(rid),
                    EventType::Unreachable,
                    -errno::ETIMEDOUT,
                ));
            }
        }
    }

    /// The RDMA listener of `sid` for destination `dst`: one bound to `dst` itself, else a
    /// wildcard one.
    fn find_listener(&self, lid: ListenId, dst: IpAddr) -> Option<u32> {
        let mut wildcard = None;
        for (&k, i) in &self.ids {
            if i.state != IdState::Listen || i.listen.is_none_or(|(l, _)| l != lid) {
                continue;
            }
            let ip = i.src.expect("bound").ip();
            if ip == dst {
                return Some(k);
            }
            if ip.is_unspecified() && ip.is_ipv4() == dst.is_ipv4() {
                wildcard = Some(k);
            } else if ip.is_unspecified() && wildcard.is_none() {
                // An IPv6 wildcard listener takes IPv4 too (as Linux's dual-stack default).
                wildcard = Some(k);
            }
        }
        wildcard
    }

    fn pending_children(&self, parent: u32) -> usize {
        self.ids
            .values()
            .filter(|i| i.pending && i.parent == Some(RdmaId(parent)))
            .count()
    }

    fn on_req(
        &mut self,
        now: Instant,
        comm: CommId,
        lid: ListenId,
        req: &crate::wire::mad::cm::ReqRepr,
    ) {
        let refuse = |s: &mut Self| {
            let _ = s.cm.reject(now, comm, RejReason::CONSUMER, &[], &[]);
        };
        let Ok(hdr) = HeaderRepr::parse(&req.private_data) else {
            return refuse(self);
        };
        let Some(parent) = self.find_listener(lid, hdr.dst_ip) else {
            return refuse(self);
        };
        let p = &self.ids[&parent];
        let (ps, port, backlog) = (
            p.ps,
            p.src.expect("bound").port(),
            p.listen.map_or(0, |(_, b)| b),
        );
        if p.kind != QpKind::Rc || self.pending_children(parent) >= backlog {
            return refuse(self);
        }
        let child = self.new_id(ps, QpKind::Rc, IdState::Connect);
        let prim = req.primary;
        let route = Route {
            local_gid: prim.remote_gid,
            remote_gid: prim.local_gid,
            path_mtu: req.path_mtu,
            hop_limit: prim.hop_limit,
            traffic_class: prim.traffic_class,
            flow_label: prim.flow_label,
        };
        let i = self.ids.get_mut(&child.0).expect("just made");
        i.src = Some(SocketAddr::new(hdr.dst_ip, port));
        i.dst = Some(SocketAddr::new(hdr.src_ip, hdr.src_port));
        i.route = Some(route);
        i.comm = Some(comm);
        i.parent = Some(RdmaId(parent));
        i.pending = true;
        self.by_comm.insert(comm, child.0);
        let mut ev = Event::new(child, EventType::ConnectRequest, 0)
            .with_private(&req.private_data[wrc::HEADER_LEN..]);
        ev.listen_id = Some(RdmaId(parent));
        ev.responder_resources = req.responder_resources;
        ev.initiator_depth = req.initiator_depth;
        ev.retry_count = req.retry_count;
        ev.rnr_retry_count = req.rnr_retry_count;
        ev.srq = req.srq;
        ev.qp_num = Some(req.local_qpn);
        ev.starting_psn = Some(req.starting_psn);
        self.event(ev);
    }

    fn on_sidr_req(&mut self, now: Instant, s: SidrId, lid: ListenId, sid: u64, pd: &[u8]) {
        let refuse = |x: &mut Self| {
            let _ =
                x.cm.sidr_reply(now, s, SidrStatus::REJECT, QpNumber::new(0), 0, &[]);
        };
        let Ok(hdr) = HeaderRepr::parse(pd) else {
            return refuse(self);
        };
        let Some(parent) = self.find_listener(lid, hdr.dst_ip) else {
            return refuse(self);
        };
        let p = &self.ids[&parent];
        let (ps, backlog) = (p.ps, p.listen.map_or(0, |(_, b)| b));
        if p.kind != QpKind::Ud || self.pending_children(parent) >= backlog {
            return refuse(self);
        }
        let child = self.new_id(ps, QpKind::Ud, IdState::Connect);
        let i = self.ids.get_mut(&child.0).expect("just made");
        i.src = Some(SocketAddr::new(hdr.dst_ip, sid as u16));
        i.dst = Some(SocketAddr::new(hdr.src_ip, hdr.src_port));
        i.route = Some(Route::roce(hdr.dst_ip, hdr.src_ip, PathMtu::M1024));
        i.sidr = Some(s);
        i.parent = Some(RdmaId(parent));
        i.pending = true;
        self.by_sidr.insert(s, child.0);
        let mut ev =
            Event::new(child, EventType::ConnectRequest, 0).with_private(&pd[wrc::HEADER_LEN..]);
        ev.listen_id = Some(RdmaId(parent));
        self.event(ev);
    }

    fn arm(&mut self, id: u32, at: Option<Instant>) {
        let Some(i) = self.ids.get_mut(&id) else {
            return;
        };
        if let Some(old) = i.deadline.take() {
            self.timers.remove(&(old, id));
        }
        i.deadline = at;
        if let Some(t) = at {
            self.timers.insert((t, id));
        }
    }

    fn event(&mut self, e: Event) {
        self.events.push_back(e);
    }
}

fn copy_max<const N: usize>(d: &[u8]) -> Result<[u8; N], RdmaCmError> {
    if d.len() > N {
        return Err(RdmaCmError::PrivateDataTooLong {
            len: d.len(),
            max: N,
        });
    }
    let mut a = [0u8; N];
    a[..d.len()].copy_from_slice(d);
    Ok(a)
}
