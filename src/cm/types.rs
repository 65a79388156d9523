//! The vocabulary of the IB CM engine: addresses, identifiers, parameters, events, errors,
//! counters, configuration and the IBA time units its timeouts are written in.

use crate::time::Duration;
use crate::wire::mad::cm::{
    private_len, MsgCode, PathMtu, PathRepr, RejReason, RepRepr, ReqRepr, SidrRepRepr, SidrReqRepr,
    TransportType, ARI_LEN,
};
use crate::wire::mad::Gid;
use crate::wire::{PKey, Psn, QpNumber};
use core::fmt;

/// 4.096 µs × 2^`exp`: the unit of every CM timeout field (IBTA §12.6: "4.096 µs × 2^value").
/// Exponents above 31 are taken as 31 (the fields are 5 bits).
pub fn iba_time(exp: u8) -> Duration {
    Duration::from_nanos(4096u64 << exp.min(31))
}

/// The smallest Local ACK Timeout exponent `t` with 4.096 µs × 2^t ≥ 2 × packet lifetime +
/// the target's ACK delay (IBTA §9.7.6.1.3: the ACK timeout must cover a round trip through
/// the fabric plus the responder's delay). Capped at 31.
pub fn ack_timeout(target_ack_delay: u8, packet_lifetime: u8) -> u8 {
    let need = (2u64 << packet_lifetime.min(31)) + (1u64 << target_ack_delay.min(31));
    (0..=31u8).find(|&t| (1u64 << t) >= need).unwrap_or(31)
}

/// Where a MAD comes from or goes to: the GSI of a port. On RoCE v2 the GID is the port's IP
/// address; the QPN is the peer's GSI QP (1 unless redirected) and the P_Key that of the
/// packet.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct MadAddr {
    /// The port's GID.
    pub gid: Gid,
    /// The QPN that serves the service.
    pub qpn: QpNumber,
    /// The partition key.
    pub pkey: PKey,
}

impl MadAddr {
    /// QP1 of the port with `gid`, default P_Key.
    pub fn gsi(gid: Gid) -> Self {
        MadAddr {
            gid,
            qpn: QpNumber::GSI,
            pkey: PKey::DEFAULT,
        }
    }
}

impl fmt::Display for MadAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/qp{}", self.gid, self.qpn.get())
    }
}

/// A connection's local communication ID (what the peer calls the "remote communication
/// ID"). Never zero.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CommId(pub u32);

impl fmt::Debug for CommId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CommId(0x{:08x})", self.0)
    }
}
impl fmt::Display for CommId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:08x}", self.0)
    }
}

/// A listening service.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ListenId(pub u32);

/// A service ID resolution, on either side (the request ID for a request we sent, a local
/// handle for one we received).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct SidrId(pub u32);

/// The CM states of a connection (IBTA §12.9.8, figure 150 and its passive half).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum CmState {
    /// Active: REQ sent, waiting for REP (or REJ, MRA).
    ReqSent,
    /// Active: the passive side acknowledged the REQ with an MRA; waiting longer for REP.
    MraReqRcvd,
    /// Passive: REQ received and handed to the consumer, who has not answered yet.
    ReqRcvd,
    /// Passive: as `ReqRcvd`, and an MRA told the active side to wait.
    MraReqSent,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Passive: the active side acknowledged the REP with an MRA.
    MraRepRcvd,
    /// Active: REP received and handed to the consumer, who has not sent RTU yet.
    RepRcvd,
    /// Active: as `RepRcvd`, and an MRA told the passive side to wait.
    MraRepSent,
    /// The connection is up.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// DREQ received and handed to the consumer, who has not answered with DREP yet.
    DreqRcvd,
    /// The connection is down; its identifiers and QP stay reserved until stray packets have
    /// left the fabric.
    TimeWait,
}

impl CmState {
    /// Every state.
    pub const ALL: [CmState; 12] = [
        CmState::ReqSent,
        CmState::MraReqRcvd,
        CmState::ReqRcvd,
        CmState::MraReqSent,
        CmState::RepSent,
        CmState::MraRepRcvd,
        CmState::RepRcvd,
        CmState::MraRepSent,
        CmState::Established,
        CmState::DreqSent,
        CmState::DreqRcvd,
        CmState::TimeWait,
    ];
}

/// Which side of a connection this end is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Role {
    /// Sent the REQ.
    Active,
    /// Received the REQ.
    Passive,
}

/// What a connection's QP must be set to (RTR and RTS attributes), from the exchanged REQ and
/// REP. Handed to the consumer with [`CmEvent::RepReceived`] (active side) and returned by
/// [`super::Cm::accept`] (passive side), before either side's QP may be used.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct QpParams {
    /// The transport service type.
    pub transport: TransportType,
    /// The sender's QPN.
    pub local_qpn: QpNumber,
    /// `dest_qp_num`.
    pub remote_qpn: QpNumber,
    /// `sq_psn`: this side's starting PSN.
    pub sq_psn: Psn,
    /// `rq_psn`: the peer's starting PSN.
    pub rq_psn: Psn,
    /// The path MTU.
    pub path_mtu: PathMtu,
    /// `max_rd_atomic`: RDMA READs / atomics this side may have outstanding.
    pub max_rd_atomic: u8,
    /// `max_dest_rd_atomic`: RDMA READs / atomics this side accepts from the peer.
    pub max_dest_rd_atomic: u8,
    /// `retry_cnt` (3 bits).
    pub retry_count: u8,
    /// `rnr_retry` (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// `timeout`: the Local ACK Timeout exponent (4.096 µs × 2^value).
    pub local_ack_timeout: u8,
    /// The partition key.
    pub pkey: PKey,
    /// The local port's GID.
    pub local_gid: Gid,
    /// The remote port's GID.
    pub remote_gid: Gid,
    /// The GRH flow label (20 bits).
    pub flow_label: u32,
    /// The GRH traffic class.
    pub traffic_class: u8,
    /// The GRH hop limit.
    pub hop_limit: u8,
    /// The service level (4 bits).
    pub sl: u8,
    /// The peer's QP has an SRQ.
    pub remote_srq: bool,
    /// The peer's local Q_Key (UD, RD; 0 for RC).
    pub remote_qkey: u32,
}

/// What [`super::Cm::connect`] puts in the REQ.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ConnectParams {
    /// The service to connect to.
    pub service_id: u64,
    /// The passive side's GSI.
    pub dest: MadAddr,
    /// The transport service type.
    pub transport: TransportType,
    /// The Extended Transport Type (with [`TransportType::EXTENDED`]; XRC: 1).
    pub ext_transport: u8,
    /// The sender's QPN.
    pub local_qpn: QpNumber,
    /// The sender's starting PSN.
    pub starting_psn: Psn,
    /// The path MTU.
    pub path_mtu: PathMtu,
    /// This side's `max_dest_rd_atomic`.
    pub responder_resources: u8,
    /// This side's `max_rd_atomic`.
    pub initiator_depth: u8,
    /// The passive side's QP `retry_cnt` (and this side's).
    pub retry_count: u8,
    /// The passive side's QP `rnr_retry`.
    pub rnr_retry_count: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// The primary path. A `local_ack_timeout` of 0 is filled in from the configuration
    /// ([`CmConfig::local_ack_timeout`]).
    pub path: PathRepr,
    /// Up to 92 bytes of private data (the rest is zero).
    pub private_data: [u8; private_len::REQ],
}

impl ConnectParams {
    /// RC to `service_id` at `dest`, over the path between `local_gid` and `dest.gid`, with
    /// the rdma_cm defaults (retry and RNR retry 7, one outstanding READ each way, MTU 1024,
    /// hop limit 64).
    pub fn rc(
        service_id: u64,
        dest: MadAddr,
        local_gid: Gid,
        local_qpn: QpNumber,
        starting_psn: Psn,
    ) -> Self {
        ConnectParams {
            service_id,
            dest,
            transport: TransportType::RC,
            ext_transport: 0,
            local_qpn,
            starting_psn,
            path_mtu: PathMtu::M1024,
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            path: PathRepr {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid,
                remote_gid: dest.gid,
                hop_limit: 64,
                ..PathRepr::default()
            },
            private_data: [0; private_len::REQ],
        }
    }
}

/// What [`super::Cm::accept`] puts in the REP.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AcceptParams {
    /// The sender's QPN.
    pub local_qpn: QpNumber,
    /// The sender's starting PSN.
    pub starting_psn: Psn,
    /// This side's `max_dest_rd_atomic` (cut to the REQ's initiator depth).
    pub responder_resources: u8,
    /// This side's `max_rd_atomic` (cut to the REQ's responder resources).
    pub initiator_depth: u8,
    /// The active side's QP `rnr_retry`.
    pub rnr_retry_count: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// Up to 196 bytes of private data.
    pub private_data: [u8; private_len::REP],
}

impl AcceptParams {
    /// Accept with `local_qpn` starting at `starting_psn`, one outstanding READ each way,
    /// RNR retry 7.
    pub fn new(local_qpn: QpNumber, starting_psn: Psn) -> Self {
        AcceptParams {
            local_qpn,
            starting_psn,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            srq: false,
            private_data: [0; private_len::REP],
        }
    }
}

/// Why a connection attempt or a request timed out: which answer never came.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Waiting {
    /// Active: REP (after every REQ retry).
    Rep,
    /// Passive: RTU (after every REP retry).
    Rtu,
    /// Passive: the consumer never answered a REQ within the active side's patience.
    Consumer,
}

/// How a connection ended for [`CmEvent::Disconnected`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum DisconnectHow {
    /// Our DREQ was answered with DREP.
    DrepReceived,
    /// Our DREQ was never answered (every retry): the connection is down anyway.
    DreqTimeout,
    /// Both sides sent DREQ; we answered theirs.
    Simultaneous,
}

/// What the CM tells its consumer ([`super::Cm::poll_event`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum CmEvent {
    /// Passive: a REQ for a listened service ID. Answer with [`super::Cm::accept`],
    /// [`super::Cm::reject`] or [`super::Cm::mra`].
    ReqReceived {
        /// The connection (or request, or CM id).
        id: CommId,
        /// The listener it came to.
        listen: ListenId,
        /// Where it came from.
        src: MadAddr,
        /// The REQ as received.
        req: ReqRepr,
    },
    /// Active: the passive side asked for more time (service timeout exponent).
    /// The peer needs more time.
    MraReceived {
        /// The connection.
        id: CommId,
        /// The extra wait the peer asks for (IBA time exponent).
        service_timeout: u8,
    },
    /// Active: the passive side accepted. Set the QP up from `qp`, then call
    /// [`super::Cm::establish`] (which sends RTU), or [`super::Cm::reject`].
    RepReceived {
        /// The connection (or request, or CM id).
        id: CommId,
        /// What the QP must be set to.
        qp: QpParams,
        /// The REP as received.
        rep: RepRepr,
    },
    /// The connection is established (passive: RTU received or communication established;
    /// active: RTU sent).
    /// The connection is established.
    Established {
        /// The connection.
        id: CommId,
        /// What the QP must be set to.
        qp: QpParams,
    },
    /// The peer rejected (REJ received).
    Rejected {
        /// The connection (or request, or CM id).
        id: CommId,
        /// The reason.
        reason: RejReason,
        /// Which message the peer rejected.
        message: MsgCode,
        /// Additional reject information.
        ari: [u8; ARI_LEN],
        /// Bytes of `ari` that mean something.
        ari_len: u8,
        /// The private data.
        private_data: [u8; private_len::REJ],
    },
    /// No answer came after every retry (see [`Waiting`]); a REJ with reason Timeout was
    /// sent to the peer.
    /// No answer came.
    TimedOut {
        /// The connection (gone now).
        id: CommId,
        /// Which answer never came.
        waiting: Waiting,
    },
    /// The peer wants to disconnect (DREQ received). Answer with [`super::Cm::disconnect`]
    /// (which sends DREP).
    DreqReceived {
        /// The connection (or request, or CM id).
        id: CommId,
        /// The private data.
        private_data: [u8; private_len::DREQ],
    },
    /// Our side of the disconnection is complete; the connection is in TimeWait.
    /// The connection is down.
    Disconnected {
        /// The connection.
        id: CommId,
        /// How it ended.
        how: DisconnectHow,
    },
    /// TimeWait is over: the connection's identifiers (and its QP) may be reused.
    /// TimeWait is over.
    TimeWaitExit {
        /// The connection (gone now).
        id: CommId,
    },
    /// Passive: a SIDR_REQ for a listened service ID. Answer with
    /// [`super::Cm::sidr_reply`].
    SidrReqReceived {
        /// The connection (or request, or CM id).
        id: SidrId,
        /// The listener it came to.
        listen: ListenId,
        /// Where it came from.
        src: MadAddr,
        /// The REQ as received.
        req: SidrReqRepr,
    },
    /// Active: the SIDR_REP for our request.
    /// The SIDR_REP for our request.
    SidrRepReceived {
        /// Our request.
        id: SidrId,
        /// The SIDR_REP.
        rep: SidrRepRepr,
    },
    /// Active: no SIDR_REP came after every retry.
    /// No SIDR_REP came.
    SidrTimedOut {
        /// Our request (gone now).
        id: SidrId,
    },
}

/// A CM call that cannot be done.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum CmError {
    #[error("no such connection {0}")]
    /// No connection has this ID.
    NoSuchConnection(CommId),
    #[error("no such listener")]
    /// No listener has this ID.
    NoSuchListener,
    #[error("no such service ID resolution")]
    /// No pending SIDR request has this ID.
    NoSuchSidr,
    #[error("service ID 0x{0:016x} already has a listener")]
    /// The service ID already has a listener.
    AlreadyListening(u64),
    #[error("operation not allowed in state {0:?}")]
    /// The call is not valid in this state.
    InvalidState(CmState),
    #[error("private data of {len} bytes exceeds {max}")]
    /// More private data than the message holds.
    PrivateDataTooLong {
        /// The length given.
        len: usize,
        /// The most the message holds.
        max: usize,
    },
    #[error("too many connections (limit {0})")]
    /// The connection table is full.
    TooManyConnections(usize),
}

/// Counts of what the CM saw and did. Every MAD that is dropped is counted in exactly one
/// of the drop counters.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct CmCounters {
    /// MADs received.
    pub mads_received: u64,
    /// MADs queued for sending.
    pub mads_sent: u64,
    /// Dropped: shorter than 256 bytes.
    pub truncated: u64,
    /// Dropped: longer than 256 bytes, or a field that makes no sense (a comm ID of zero).
    pub malformed: u64,
    /// Dropped (or, for Get/Set, answered with an error status): base or class version.
    pub bad_version: u64,
    /// Dropped: not the CM class.
    pub wrong_class: u64,
    /// Dropped or answered with an error status: a method or attribute the CM does not serve.
    pub unsupported: u64,
    /// Dropped: a message for a connection or request this CM does not know (REJ, DREP, RTU,
    /// MRA, SIDR_REP); or answered (DREQ with DREP, REP with REJ).
    pub unknown_id: u64,
    /// Dropped: the communication IDs or the source do not match the connection's.
    pub mismatched: u64,
    /// Dropped: a message that is not valid in the connection's state.
    pub unexpected: u64,
    /// Duplicates recognised (and answered where the IBTA says so).
    pub duplicates: u64,
    /// Retransmissions of REQ, REP, DREQ, SIDR_REQ on a timeout.
    pub retransmissions: u64,
    /// Connections and requests given up after every retry.
    pub timeouts: u64,
    /// REJs sent.
    pub rej_sent: u64,
    /// REJs received.
    pub rej_received: u64,
    /// MRAs sent.
    pub mra_sent: u64,
    /// REQs rejected (and SIDR_REQs answered "not supported") because nothing listens on
    /// their service ID.
    pub no_listener: u64,
    /// REQs and SIDR_REQs that found no listener held for one (their sender has an
    /// established connection here; see `CmConfig::listen_grace`).
    pub held_for_listener: u64,
    /// REQs and SIDR_REQs dropped because the listener's backlog was full (the sender's
    /// retries will try again).
    pub backlog_drops: u64,
    /// REQs rejected because the connection table was full.
    pub table_full: u64,
    /// MADs not sent because the transmit queue was full.
    pub tx_drops: u64,
    /// Events dropped because the consumer did not read them (event queue full).
    pub event_drops: u64,
    /// Connections established.
    pub established: u64,
}

/// How a CM behaves.
#[derive(Clone, Copy, Debug)]
pub struct CmConfig {
    /// This CA's GUID (the EUI-64 of the port's MAC on RoCE).
    pub ca_guid: u64,
    /// The fabric's packet lifetime exponent (Linux's rdma_cm uses 16 on RoCE,
    /// ≈ 268 ms).
    pub packet_lifetime: u8,
    /// This CA's ACK delay exponent (the REP's Target ACK Delay; rxe reports 15).
    pub ca_ack_delay: u8,
    /// How long this side takes to answer, and lets the peer take (REQ's CM response
    /// timeouts; rdma_cm: 20, ≈ 4.3 s).
    pub cm_response_timeout: u8,
    /// How many times a REQ, REP, DREQ or SIDR_REQ is sent again (rdma_cm: 15).
    pub max_cm_retries: u8,
    /// Answer a duplicate REQ (REP) that the consumer has not answered yet with an MRA, so
    /// that the peer stops retrying (as Linux does).
    pub auto_mra: bool,
    /// The service timeout exponent of those MRAs (Linux: 24, ≈ 69 s).
    pub mra_service_timeout: u8,
    /// How long a finished connection stays in TimeWait; `None`: 4.096 µs ×
    /// 2^(packet lifetime + 1), as Linux.
    pub timewait: Option<Duration>,
    /// Most connections (TimeWait included) and pending SIDR requests tracked at once.
    pub max_connections: usize,
    /// Most MADs waiting in the transmit queue.
    pub max_tx_queue: usize,
    /// Most events waiting to be read.
    pub max_events: usize,
    /// Seed of the communication and transaction IDs (`None`: unpredictable).
    pub seed: Option<u64>,
    /// A REQ or SIDR_REQ that finds no listener, from a peer with an established connection
    /// to this CM, waits this long (at most the REQ's Remote CM Response Timeout) for a
    /// listener on its service before it is rejected: such a peer is usually an application
    /// that talks to ours over that connection and connects again before ours has called
    /// `rdma_listen` (perftest -R). Other peers are answered at once (REJ Invalid Service
    /// ID), as by Linux. Zero: always at once.
    pub listen_grace: Duration,
    /// `Some(b)`: every Local Communication ID and SIDR Request ID this CM makes has `b` as
    /// its top byte, so that a device sharing its address and port with others can tell,
    /// from the ID a reply names, whose it is ([`crate::io::share`]). `None` (default): any.
    pub id_block: Option<u8>,
}

impl CmConfig {
    /// rdma_cm's settings on RoCE for a CA with `ca_guid`.
    pub fn new(ca_guid: u64) -> Self {
        CmConfig {
            ca_guid,
            packet_lifetime: 16,
            ca_ack_delay: 15,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            auto_mra: true,
            mra_service_timeout: 24,
            timewait: None,
            max_connections: 65_536,
            max_tx_queue: 4_096,
            max_events: 65_536,
            seed: None,
            listen_grace: Duration::from_secs(2),
            id_block: None,
        }
    }
    /// With a fixed seed.
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
    /// The Local ACK Timeout this side asks for in its REQ (2 × packet lifetime + ACK delay).
    pub fn local_ack_timeout(&self) -> u8 {
        ack_timeout(self.ca_ack_delay, self.packet_lifetime)
    }
    /// How long to wait for the answer to a message sent to a peer that takes
    /// 4.096 µs × 2^`peer_timeout` to answer: that plus a round trip (2 packet lifetimes).
    pub fn response_wait(&self, peer_timeout: u8) -> Duration {
        iba_time(peer_timeout) + iba_time(self.packet_lifetime) * 2
    }
    /// The TimeWait duration.
    pub fn timewait_duration(&self) -> Duration {
        self.timewait
            .unwrap_or_else(|| iba_time(self.packet_lifetime.saturating_add(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iba_time_units() {
        assert_eq!(iba_time(0), Duration::from_nanos(4096));
        // rdma_cm's CM response timeout 20: 4.096 µs × 2^20 = 4.294967296 s.
        assert_eq!(iba_time(20), Duration::from_nanos(4_294_967_296));
        assert_eq!(iba_time(40), iba_time(31));
    }

    #[test]
    fn ack_timeout_covers_two_lifetimes_and_the_delay() {
        for plt in 0..=30u8 {
            for d in 0..=31u8 {
                let t = ack_timeout(d, plt);
                let need = iba_time(plt) * 2 + iba_time(d);
                if t < 31 {
                    assert!(iba_time(t) >= need, "plt {plt} delay {d}");
                    assert!(
                        t == 0 || iba_time(t - 1) < need,
                        "smallest: plt {plt} delay {d}"
                    );
                }
            }
        }
        // RoCE defaults: packet lifetime 16, ACK delay 15: 2^17 + 2^15 needs 2^18.
        assert_eq!(ack_timeout(15, 16), 18);
    }
}
