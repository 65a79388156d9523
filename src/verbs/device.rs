//! The device and its verbs: protection domains, memory regions, completion queues, queue
//! pairs and work requests (`alloc_pd`, `reg_mr`, `create_cq`, `create_qp`, `modify_qp`,
//! `post_send`, `post_recv`, `poll_cq`, ...). The engine that runs the QPs (packets and time)
//! is in [`super::engine`], with the sans-IO contract.

use super::engine::{Scheduler, Slot};
use super::frame::Framer;
use super::qps::TransportQp;
use crate::ib::ah::{ah_attr_from_wc, Ah, AhEntry, AhFromWcError};
use crate::ib::appmem::UserMemory;
use crate::ib::attr::check_modify_qp;
use crate::ib::counters::{DeviceCounters, QpCounters};
use crate::ib::cq::{Cq, CqRing, NotifyMode};
use crate::ib::event::{AsyncEvent, EventQueue};
use crate::ib::mr::{LKey, MemoryRegion, MemoryWindow, MrShared, MrTable, MwShared, MwType, Pd};
use crate::ib::path::{gid_of, AvError, Path};
use crate::ib::srq::{Srq, SrqAttr, SrqAttrMask, SrqModifyError, SrqRing, SrqTable, Xrcd};
use crate::ib::tx::PostError;
use crate::ib::wc::WorkCompletion;
use crate::ib::wq::QpInit;
use crate::ib::wqe::{RecvWqe, SendWqe, UdSendDest};
use crate::ib::wr::{RecvWr, SendFlags, SendWr};
use crate::ib::{
    AccessFlags, AddressVector, KeyMap, ModifyQpError, Mtu, QpAttr, QpAttrMask, QpCap, QpState,
    QpType,
};
use crate::keys::KeyGen;
use crate::rc::qp::{Qp, QpConfig, XrcRole};
use crate::time::Instant;
use crate::wire::{MacAddr, QpNumber, RKey};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

/// Largest message (IBTA: 2^31 bytes).
pub const MAX_MSG: u64 = 1 << 31;

/// How a device is set up.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// The port's MAC address.
    pub mac: MacAddr,
    /// The GID table, by index: each entry an IP address (IPv4 entries are the IPv4-mapped
    /// GIDs `::ffff:a.b.c.d`, as Linux numbers them).
    pub gids: Vec<IpAddr>,
    /// Seed for keys and other choices. `None`: unpredictable (from the OS).
    pub seed: Option<u64>,
    /// Compute the UDP checksum of IPv6 packets (RFC 8200 requires one; rxe sends 0).
    pub ipv6_udp_checksum: bool,
    /// Most QPs (`max_qp` of `ibv_query_device`).
    pub max_qp: u32,
    /// Most work requests per queue (`max_qp_wr`).
    pub max_qp_wr: u32,
    /// Most scatter/gather entries per work request (`max_sge`).
    pub max_sge: u32,
    /// Most inline data per send work request.
    pub max_inline: u32,
    /// Most completions per CQ (`max_cqe`).
    pub max_cqe: u32,
    /// Most completion queues (`max_cq`).
    pub max_cq: u32,
    /// Most protection domains (`max_pd`).
    pub max_pd: u32,
    /// Most memory regions (`max_mr`).
    pub max_mr: u32,
    /// Most memory windows (`max_mw`).
    pub max_mw: u32,
    /// Longest memory region in bytes (`max_mr_size`).
    pub max_mr_size: u64,
    /// Most shared receive queues (`max_srq`).
    pub max_srq: u32,
    /// Most address handles (`max_ah`).
    pub max_ah: u32,
    /// Most outstanding RDMA READ/atomic requests per QP, as initiator (`max_rd_atomic`) and
    /// as responder (`max_dest_rd_atomic`): `max_qp_init_rd_atom` and `max_qp_rd_atom`.
    pub max_qp_rd_atom: u8,
    /// Most unacknowledged packets per QP (the go-back-N window).
    pub max_inflight: u32,
    /// Congestion control of every QP's transmissions (default: none, line rate, unpaced).
    /// With DCQCN, data packets are sent ECN-capable (ECT(0)) and paced at the QP's rate.
    pub cc: crate::cc::CcConfig,
    /// The port's line rate in bits per second (DCQCN's highest rate).
    pub line_rate_bps: u64,
    /// The notification point: at most one CNP per QP per this interval for CE-marked packets
    /// received (ConnectX: 4 µs; the DCQCN paper: 50 µs). `None`: never send CNPs.
    pub cnp_interval: Option<crate::time::Duration>,
    /// Delayed ACK: hold a lone ACK up to this long so that it follows the QP's next request
    /// packet instead of going first (a ping-pong's reply leaves one transmission earlier;
    /// fewer ACKs). `None` (default): every ACK goes out in the engine round that made it.
    pub ack_delay: Option<crate::time::Duration>,
    /// The port's active MTU (`ibv_query_port`'s `active_mtu`): the largest UD message, and
    /// what perftest and the pingpongs read. Default 4096; a device on a network interface
    /// takes what its MTU allows ([`crate::io::netdev::ib_mtu_for`]: 1500 → 1024).
    pub port_mtu: Mtu,
    /// The largest path MTU a connected QP may be given (`ibv_query_port`'s `max_mtu`): what
    /// the packet device's frames can carry. A modify to a larger `path_mtu` fails with
    /// `InvalidValue` (EINVAL), as rxe's against its port's `max_mtu`, instead of leaving the
    /// QP with packets no frame can hold. Default 4096; [`crate::runtime::Nic::start`] lowers
    /// it (and `port_mtu`) to what its packet device's frame capacity allows.
    pub max_mtu: Mtu,
    /// Fast loss recovery for RC go-back-N (`rc/recovery.rs`): a probe timeout from measured
    /// round trips resends before the local ACK timeout (without spending a retry), and the
    /// window halves on loss and grows back by one packet per window acknowledged. What goes
    /// on the wire stays IBTA go-back-N, so any peer works. Default off.
    pub fast_recovery: bool,
    /// Selective repeat for RC between two devices that both have it (`rc/reorder.rs`): the
    /// responder keeps requests that arrive ahead of the expected PSN and runs them in order
    /// once the gap is filled; the requester resends only the PSN a sequence-error NAK
    /// names. Implies `fast_recovery`. Against a peer without it every gap costs a round
    /// trip per packet dropped behind it, so both ends must agree. Default off.
    pub selective_repeat: bool,
    /// Accept frames whose destination MAC is all zeros. Only what a UDP-socket backend
    /// synthesises (the kernel took the real Ethernet header off) carries it; on a real wire
    /// it is never a valid unicast address, so a device on whole Ethernet frames drops it
    /// (counted `address_drops`; issue 17 finding 3). [`crate::runtime::Nic::start`] sets it
    /// for a backend whose medium is [`crate::io::Medium::UdpSocket`]. Default off.
    pub accept_zero_dst_mac: bool,
    /// TEST-ONLY: deliberate deviations from IBTA (all off by default), so that a
    /// conformance tester's own tests can show each check fails (`ferroce conform --serve
    /// --break NAME`). Never set on a device that talks to anything but a tester.
    pub deviations: crate::rc::deviations::Deviations,
    /// The block of QPNs this device hands out: `Some(b)` keeps every QPN in
    /// `b << 16 | 0x11 ..= b << 16 | 0xffff`, [`super::limits::QPN_BLOCK_QPS`] at most (for several devices that share one address and port,
    /// [`crate::io::share`]: the block says which device a frame is for); `None` (default):
    /// any 24-bit QPN.
    pub qpn_block: Option<u8>,
}

impl DeviceConfig {
    /// A device with one IPv4 address.
    pub fn new(mac: MacAddr, ip: IpAddr) -> Self {
        DeviceConfig {
            mac,
            gids: vec![ip],
            seed: None,
            ipv6_udp_checksum: true,
            max_qp: 1 << 20,
            max_qp_wr: 1 << 15,
            max_sge: 32,
            max_inline: 512,
            max_cqe: 1 << 22,
            max_cq: 1 << 16,
            max_pd: 1 << 16,
            max_mr: 1 << 20,
            max_mw: 1 << 16,
            // The user half of an x86-64 or AArch64 address space (47 bits).
            max_mr_size: 1 << 47,
            max_srq: 1 << 16,
            max_ah: 1 << 16,
            max_qp_rd_atom: 128,
            max_inflight: crate::rc::qp::DEFAULT_MAX_INFLIGHT,
            cc: crate::cc::CcConfig::None,
            line_rate_bps: 100_000_000_000,
            cnp_interval: Some(crate::time::Duration::from_micros(4)),
            ack_delay: None,
            port_mtu: Mtu::M4096,
            max_mtu: Mtu::M4096,
            fast_recovery: false,
            selective_repeat: false,
            accept_zero_dst_mac: false,
            deviations: crate::rc::deviations::Deviations::default(),
            qpn_block: None,
        }
    }
    /// Use a fixed seed (reproducible keys).
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
}

/// One QP as [`Device::qp_status`] sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QpStatus {
    /// Its number.
    pub qpn: QpNumber,
    /// Its transport.
    pub qp_type: QpType,
    /// Its state.
    pub state: QpState,
    /// The connected peer's QPN (0 for UD).
    pub dest_qp: u32,
    /// The PSN the next new request packet gets.
    pub next_psn: u32,
    /// The oldest PSN not yet acknowledged (RC; `next_psn` for UC and UD).
    pub una_psn: u32,
    /// The PSN the responder expects next (0 for UD).
    pub expected_psn: u32,
    /// Its sending rate under congestion control (the line rate without it), bits/s.
    pub rate_bps: u64,
    /// Its counters.
    pub counters: QpCounters,
}

/// The PD and CQ numbers of an XRC target, which has none: no PD, CQ or MR is ever numbered so.
const NO_OBJECT: u32 = u32::MAX;

/// `struct ibv_qp_init_attr`.
#[derive(Clone, Copy, Debug)]
pub struct QpInitAttr {
    /// The protection domain: the QP may use the memory regions of this PD only.
    pub pd: Pd,
    /// Where send completions go.
    pub send_cq: Cq,
    /// Where receive completions go.
    pub recv_cq: Cq,
    /// Queue sizes (with an SRQ, `max_recv_wr` and `max_recv_sge` are not used).
    pub cap: QpCap,
    /// Every send WR generates a completion, signaled or not.
    pub sq_sig_all: bool,
    /// The transport service (`qp_type`): RC, UC, UD or a half of XRC.
    pub qp_type: QpType,
    /// A shared receive queue the QP takes its receive WQEs from (`srq`).
    pub srq: Option<Srq>,
    /// An XRC target's domain (`xrcd`); its PD and CQs are not used (see
    /// [`QpInitAttr::xrc_recv`]).
    pub xrcd: Option<Xrcd>,
}

impl QpInitAttr {
    /// An RC QP with its own receive queue, signaling only the requests that ask for it.
    pub fn new(pd: Pd, send_cq: Cq, recv_cq: Cq, cap: QpCap) -> QpInitAttr {
        QpInitAttr {
            pd,
            send_cq,
            recv_cq,
            cap,
            sq_sig_all: false,
            qp_type: QpType::Rc,
            srq: None,
            xrcd: None,
        }
    }
    /// An XRC target QP of domain `xrcd` (`IBV_QPT_XRC_RECV`): no PD, CQ or queue of its own
    /// (the messages it takes land in the XRC SRQs of its domain, checked against their PDs
    /// and completed on their CQs).
    pub fn xrc_recv(xrcd: Xrcd) -> QpInitAttr {
        QpInitAttr {
            pd: Pd(NO_OBJECT),
            send_cq: Cq(NO_OBJECT),
            recv_cq: Cq(NO_OBJECT),
            cap: QpCap::default(),
            sq_sig_all: false,
            qp_type: QpType::XrcRecv,
            srq: None,
            xrcd: Some(xrcd),
        }
    }
    /// Of transport `t`.
    #[must_use]
    pub fn with_type(mut self, t: QpType) -> QpInitAttr {
        self.qp_type = t;
        self
    }
    /// Attached to `srq`.
    #[must_use]
    pub fn with_srq(mut self, srq: Srq) -> QpInitAttr {
        self.srq = Some(srq);
        self
    }
}

/// Errors a verb returns synchronously (what libibverbs returns as an errno).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerbsError {
    /// No QP with this number (EINVAL).
    #[error("no such QP {0}")]
    NoSuchQp(QpNumber),
    /// No such CQ (EINVAL).
    #[error("no such CQ")]
    NoSuchCq,
    /// No such protection domain (EINVAL).
    #[error("no such protection domain")]
    NoSuchPd,
    /// No such memory region (EINVAL).
    #[error("no such memory region")]
    NoSuchMr,
    /// No such memory window (EINVAL).
    #[error("no such memory window")]
    NoSuchMw,
    /// The QP's state does not accept this verb (EINVAL).
    #[error("QP is in state {0}, which does not accept this")]
    InvalidState(QpState),
    /// `modify_qp` refused the request (EINVAL).
    #[error("modify_qp: {0}")]
    Modify(#[from] ModifyQpError),
    /// The queue holds its `max_*_wr` requests (ENOMEM).
    #[error("queue full")]
    QueueFull,
    /// More scatter/gather entries than the QP's `max_*_sge` (EINVAL).
    #[error("too many scatter/gather entries ({0})")]
    TooManySge(usize),
    /// Inline data longer than the QP's `max_inline_data` (EINVAL).
    #[error("inline data of {0} bytes exceeds max_inline_data")]
    InlineTooLarge(u64),
    /// A message longer than 2^31 bytes (EINVAL).
    #[error("message length {0} exceeds 2^31 bytes")]
    MessageTooLong(u64),
    /// An atomic whose scatter/gather list is not one 8-byte entry (EINVAL).
    #[error("atomic operations take exactly one 8-byte scatter/gather entry")]
    BadAtomicSge,
    /// The address vector cannot be resolved (EINVAL).
    #[error("address vector: {0}")]
    BadAddressVector(#[from] AvError),
    /// A device limit is reached (ENOMEM).
    #[error("resource limit reached: {0}")]
    NoResources(&'static str),
    /// A capability or size outside the device's limits (EINVAL).
    #[error("invalid capability: {0}")]
    BadCap(&'static str),
    /// The object is in use (EBUSY).
    #[error("resource busy: {0}")]
    Busy(&'static str),
    /// No such shared receive queue (EINVAL).
    #[error("no such SRQ")]
    NoSuchSrq,
    /// No such XRC domain (EINVAL).
    #[error("no such XRC domain")]
    NoSuchXrcd,
    /// No such address handle, or one of another protection domain (EINVAL).
    #[error("no such address handle")]
    NoSuchAh,
    /// The operation is not one the QP's transport carries (EINVAL): UC has no READ or
    /// atomics, UD only SEND.
    #[error("operation not supported on a {0} QP")]
    BadOpcode(QpType),
    /// A UD send without a destination (`wr.ud`) (EINVAL).
    #[error("UD send without a destination (address handle, QPN, Q_Key)")]
    NoUdDest,
    /// `post_recv` on a QP attached to an SRQ: its receives go to the SRQ (EINVAL).
    #[error("the QP takes its receives from an SRQ: post them there")]
    QpHasSrq,
    /// `modify_srq` refused the request (EINVAL).
    #[error("modify_srq: {0}")]
    ModifySrq(#[from] SrqModifyError),
    /// `create_ah_from_wc` cannot answer this completion (EINVAL / EPROTONOSUPPORT).
    #[error("address handle from a work completion: {0}")]
    AhFromWc(#[from] AhFromWcError),
    /// `attach_mcast` of a GID that is not an IP multicast address, or of a QP that is not
    /// UD (EINVAL).
    #[error("multicast: {0}")]
    BadMulticast(&'static str),
}

impl From<PostError> for VerbsError {
    fn from(e: PostError) -> Self {
        match e {
            PostError::InvalidState(s) => VerbsError::InvalidState(s),
            PostError::QueueFull => VerbsError::QueueFull,
            PostError::HasSrq => VerbsError::QpHasSrq,
        }
    }
}

/// The checks `ibv_post_send` makes of a send work request against the QP's capabilities:
/// scatter/gather entries, message length, the atomic's one 8-byte entry, inline size.
/// Returns the message length.
pub(crate) fn check_send_wr(wr: &SendWr, cap: &QpCap) -> Result<u32, VerbsError> {
    if wr.sg_list.len() > cap.max_send_sge.max(1) as usize {
        return Err(VerbsError::TooManySge(wr.sg_list.len()));
    }
    let len: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
    if len > MAX_MSG {
        return Err(VerbsError::MessageTooLong(len));
    }
    if wr.op.is_atomic() && (wr.sg_list.len() != 1 || len != 8) {
        return Err(VerbsError::BadAtomicSge);
    }
    if let crate::ib::wr::SendOp::AtomicWrite { .. } = wr.op {
        // The 8 bytes travel in the operation itself.
        if !wr.sg_list.is_empty() {
            return Err(VerbsError::BadAtomicSge);
        }
        return Ok(8);
    }
    let inline = wr.flags.contains(SendFlags::INLINE) && (wr.op.is_send() || wr.op.is_write());
    if inline && len > u64::from(cap.max_inline_data) {
        return Err(VerbsError::InlineTooLarge(len));
    }
    Ok(len as u32)
}

/// The inline data a QP is granted: what was asked, and at least the room its send queue's
/// scatter/gather entries take (16 bytes each, `max_send_sge` of them), up to the device's
/// `max_inline` — as rxe and hardware providers grant it, so a program that asks for no inline
/// data but posts a small `IBV_SEND_INLINE` request (rdma-core's `rdma_xclient` sends 16
/// bytes inline from a QP created with `max_inline_data` 0) works here as there. The granted
/// value is what `query_qp` reports and `ibv_create_qp` writes back.
pub fn granted_inline(cap: &QpCap, device_max: u32) -> u32 {
    let sge_room = cap.max_send_sge.max(1).saturating_mul(16).min(device_max);
    cap.max_inline_data.max(sge_room)
}

/// A software RNIC: the verbs objects of one port and the sans-IO engine that runs its queue
/// pairs (see [`super::engine`] for the contract with its driver).
///
/// Two devices, an RC connection between them, an RDMA WRITE, with the frames carried by hand
/// (a real driver is [`crate::runtime::Nic`] over a packet backend, or [`crate::sim::Pair`]):
///
/// ```
/// use ferroce::time::Instant;
/// use ferroce::verbs::*;
/// use ferroce::wire::MacAddr;
///
/// let mut dev = |i: u8| {
///     let ip = std::net::Ipv4Addr::new(10, 0, 0, i).into();
///     Device::new(DeviceConfig::new(MacAddr([2, 0, 0, 0, 0, i]), ip))
/// };
/// let (mut a, mut b) = (dev(1), dev(2));
/// let cap = QpCap { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1,
///                   max_inline_data: 0 };
/// let mut setup = |d: &mut Device| {
///     let pd = d.alloc_pd().unwrap();
///     let cq = d.create_cq(16).unwrap();
///     let qp = d.create_qp(QpInitAttr::new(pd, cq, cq, cap))
///         .unwrap();
///     let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
///     let mr = d.reg_mr(pd, 4096, access).unwrap();
///     (cq, qp, mr)
/// };
/// let (cq_a, qp_a, mr_a) = setup(&mut a);
/// let (_, qp_b, mr_b) = setup(&mut b);
///
/// // Exchange the ends (out of band in real life) and connect: RESET → INIT → RTR → RTS.
/// let (end_a, end_b) = (a.local_end(qp_a, 0, 100).unwrap(), b.local_end(qp_b, 0, 200).unwrap());
/// a.connect_rc(qp_a, &end_b, &RcParams { local_psn: 100, ..RcParams::default() }).unwrap();
/// b.connect_rc(qp_b, &end_a, &RcParams { local_psn: 200, ..RcParams::default() }).unwrap();
///
/// // An RDMA WRITE of 11 bytes from A's region into B's.
/// mr_a.write(0, b"hello, RDMA").unwrap();
/// let sge = Sge { addr: mr_a.addr(), length: 11, lkey: mr_a.lkey() };
/// let op = SendOp::RdmaWrite { remote_addr: mr_b.addr() + 64, rkey: mr_b.rkey() };
/// a.post_send(qp_a, SendWr::new(7, op, vec![sge])).unwrap();
///
/// // Carry frames both ways until both sides are quiet.
/// let (now, mut buf) = (Instant::ZERO, vec![0u8; a.max_frame_len()]);
/// loop {
///     let mut moved = false;
///     while let Some(n) = a.poll_transmit(now, &mut buf).unwrap() {
///         b.handle_frame(now, &buf[..n]);
///         moved = true;
///     }
///     while let Some(n) = b.poll_transmit(now, &mut buf).unwrap() {
///         a.handle_frame(now, &buf[..n]);
///         moved = true;
///     }
///     if !moved {
///         break;
///     }
/// }
///
/// // The WRITE completed (A got B's ACK) and the bytes are in B's memory.
/// let mut wcs = Vec::new();
/// a.poll_cq(cq_a, &mut wcs, 16).unwrap();
/// assert_eq!((wcs[0].wr_id, wcs[0].status, wcs[0].byte_len), (7, WcStatus::Success, 11));
/// let mut got = [0u8; 11];
/// mr_b.read(64, &mut got).unwrap();
/// assert_eq!(&got, b"hello, RDMA");
/// ```
pub struct Device {
    /// `counters.cq_overruns` when the QPs of overrun CQs were last moved to the error state.
    pub(super) overruns_seen: u64,
    pub(super) cfg: DeviceConfig,
    keys: KeyGen,
    next_pd: u32,
    pds: Vec<u32>,
    /// XRC domains open.
    next_xrcd: u32,
    xrcds: Vec<u32>,
    pub(super) mrs: MrTable,
    pub(super) cqs: Vec<Option<CqRing>>,
    /// Live CQs, and the free numbers below `cqs.len()` (lowest first): `create_cq` is O(log n)
    /// at `max_cq`.
    cq_live: usize,
    cq_free: std::collections::BinaryHeap<std::cmp::Reverse<u32>>,
    /// The QP table, by QPN: each QP with the engine's bookkeeping.
    pub(super) qps: KeyMap<Slot>,
    next_qpn: u32,
    /// The highest QPN handed out so far (QPNs only increase until they wrap).
    max_qpn: u32,
    /// Counts the changes that may change which frames the QPs take (a QP created,
    /// modified or destroyed): see [`Device::receive_scope`].
    scope_gen: u64,
    /// Shared receive queues, by number.
    pub(super) srqs: SrqTable,
    /// Address handles, by number.
    ahs: KeyMap<AhEntry>,
    next_ah: u32,
    /// Unread asynchronous events.
    pub(super) events: EventQueue,
    /// The Ethernet source address each peer's RoCE frames came from (bounded; what an
    /// address vector without a MAC resolves to).
    neighbours: HashMap<IpAddr, MacAddr>,
    /// The pair [`learn_neighbour`](Self::learn_neighbour) last stored: a frame from the
    /// same peer (nearly every frame) then costs a comparison, not a hash-map insert.
    /// Entries are never removed, so the map still holds it.
    last_neighbour: Option<(IpAddr, MacAddr)>,
    /// The engine's transmit list, timer heap and clock.
    pub(super) sched: Scheduler,
    pub(super) counters: DeviceCounters,
    /// Multicast groups (IP address) and the QPs attached to each, in attach order.
    pub(super) mcast: HashMap<IpAddr, Vec<u32>>,
}

/// What [`Device::receive_scope`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReceiveScope {
    /// These QPs, each from its peer's address (`Some`) or any (`None`).
    Exact(Vec<(QpNumber, Option<IpAddr>)>),
    /// Any QP whose number is in `lo..=hi`, from any address.
    Range {
        /// The lowest QPN.
        lo: u32,
        /// The highest.
        hi: u32,
    },
}

/// Most multicast groups a device joins (`max_mcast_grp` of `ibv_query_device`).
pub const MAX_MCAST_GROUPS: usize = 256;
/// Most QPs attached to one group (`max_mcast_qp_attach`).
pub const MAX_MCAST_QP_ATTACH: usize = 64;

/// Most neighbours a device remembers.
const MAX_NEIGHBOURS: usize = 4096;

/// The device's P_Key table: one entry, the default full-membership P_Key (RoCE has no subnet
/// manager to hand out others).
pub const PKEY_TABLE: [u16; 1] = [0xffff];

impl Device {
    /// A device with configuration `cfg` (no PD, MR, CQ or QP yet).
    pub fn new(cfg: DeviceConfig) -> Self {
        Device {
            keys: KeyGen::new(cfg.seed),
            sched: Scheduler::new(Framer::new(
                cfg.ipv6_udp_checksum,
                !matches!(cfg.cc, crate::cc::CcConfig::None),
            )),
            cfg,
            next_pd: 1,
            pds: Vec::new(),
            next_xrcd: 1,
            xrcds: Vec::new(),
            mrs: MrTable::default(),
            cqs: Vec::new(),
            cq_live: 0,
            cq_free: std::collections::BinaryHeap::new(),
            qps: KeyMap::default(),
            next_qpn: 0x11,
            max_qpn: 0,
            scope_gen: 0,
            srqs: Vec::new(),
            ahs: KeyMap::default(),
            next_ah: 1,
            events: EventQueue::default(),
            neighbours: HashMap::new(),
            last_neighbour: None,
            counters: DeviceCounters::default(),
            overruns_seen: 0,
            mcast: HashMap::new(),
        }
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &DeviceConfig {
        &self.cfg
    }

    /// The GID at `index`.
    pub fn gid(&self, index: usize) -> Option<[u8; 16]> {
        self.cfg.gids.get(index).map(|ip| gid_of(*ip))
    }

    /// Serve `ip` too (its interface gained the address): its index in the GID table, appended
    /// if it is not there (entries never move, so a QP's `sgid_index` keeps its meaning).
    /// `None` when the table is full (256 entries: `sgid_index` is a byte).
    pub fn add_gid(&mut self, ip: IpAddr) -> Option<u8> {
        if let Some(i) = self.cfg.gids.iter().position(|g| *g == ip) {
            return u8::try_from(i).ok();
        }
        let i = u8::try_from(self.cfg.gids.len()).ok()?;
        self.cfg.gids.push(ip);
        Some(i)
    }

    // ---- protection domains and memory regions -------------------------------------------

    /// `ibv_alloc_pd`: a new protection domain (`NoResources("max_pd")` once `max_pd` live).
    pub fn alloc_pd(&mut self) -> Result<Pd, VerbsError> {
        if self.pds.len() >= self.cfg.max_pd as usize {
            return Err(VerbsError::NoResources("max_pd"));
        }
        let mut id = self.next_pd;
        while id == 0 || self.pds.contains(&id) {
            id = id.wrapping_add(1);
        }
        self.next_pd = id.wrapping_add(1);
        self.pds.push(id);
        Ok(Pd(id))
    }

    /// `ibv_dealloc_pd`: refused (`Busy`, EBUSY) while a memory region, QP, SRQ or address
    /// handle of the PD exists.
    pub fn dealloc_pd(&mut self, pd: Pd) -> Result<(), VerbsError> {
        let i = self
            .pds
            .iter()
            .position(|&p| p == pd.0)
            .ok_or(VerbsError::NoSuchPd)?;
        if self.mrs.any_of_pd(pd) {
            return Err(VerbsError::Busy(
                "memory regions or windows of the PD exist",
            ));
        }
        // (An XRC target has no PD: its XRC SRQs' are checked as theirs.)
        if self.qps.values().any(|s| s.qp.pd() == pd) {
            return Err(VerbsError::Busy("QPs of the PD exist"));
        }
        if self.srqs.iter().flatten().any(|s| s.pd == pd) {
            return Err(VerbsError::Busy("SRQs of the PD exist"));
        }
        if self.ahs.values().any(|a| a.pd == pd) {
            return Err(VerbsError::Busy("address handles of the PD exist"));
        }
        self.pds.swap_remove(i);
        Ok(())
    }

    fn new_key(&mut self) -> u32 {
        // 24 random index bits and an 8-bit random tag: never sequential, never reused while
        // the MR lives, never 0.
        let mrs = &self.mrs;
        self.keys.mr_key(|k| mrs.contains_key(k))
    }

    /// `ibv_reg_mr`: register `len` bytes of memory, owned by the region (see
    /// [`MemoryRegion`] for the memory model), with the given rights. Remote write and atomic
    /// rights need local write (IBTA 10.6.3.1).
    ///
    /// ```
    /// # use ferroce::verbs::*;
    /// # let mut dev = Device::new(DeviceConfig::new(
    /// #     ferroce::wire::MacAddr([2, 0, 0, 0, 0, 1]), "10.0.0.1".parse().unwrap()));
    /// let pd = dev.alloc_pd()?;
    /// let mr = dev.reg_mr(pd, 4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)?;
    /// mr.write(0, b"readable by the peer")?;
    /// assert_eq!(mr.len(), 4096);
    /// assert!(mr.rkey_valid());
    /// // Remote write without local write is refused.
    /// assert!(dev.reg_mr(pd, 64, AccessFlags::REMOTE_WRITE).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reg_mr(
        &mut self,
        pd: Pd,
        len: usize,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        if len as u64 > self.cfg.max_mr_size {
            return Err(VerbsError::BadCap("MR longer than max_mr_size"));
        }
        // The region's memory is allocated zeroed and lazily (calloc); ask first whether the
        // allocator can have it at all, so that a length it cannot serve is an error and
        // not an abort.
        if Vec::<u8>::new().try_reserve_exact(len).is_err() {
            return Err(VerbsError::NoResources("memory for the region"));
        }
        let (lkey, rkey) = self.mr_keys(pd, access)?;
        // A page-aligned virtual address in the style of a user mapping.
        let va = 0x0000_7f00_0000_0000 | ((self.keys.next_u64() & 0x00ff_ffff) << 16);
        let mr = Arc::new(MrShared::new(LKey(lkey), RKey(rkey), pd, access, va, len));
        self.mrs.insert(mr.clone());
        Ok(MemoryRegion(mr))
    }

    /// `ibv_reg_mr` on the application's own memory: the engine reads and writes `mem`
    /// directly, no copy (see [`AppMemory`](crate::ib::AppMemory)), or, registered on demand
    /// ([`crate::ib::OnDemandMemory`], `IBV_ACCESS_ON_DEMAND`), whatever is mapped there at
    /// each access. Scatter/gather entries and the peer's requests name its bytes from `iova`
    /// (`ibv_reg_mr` passes the buffer's own address, `ibv_reg_mr_iova2` any other; an
    /// implicit on-demand region, the whole address space, only `0`). The memory is the
    /// caller's again once [`dereg_mr`](Self::dereg_mr) returns.
    pub fn reg_mr_app(
        &mut self,
        pd: Pd,
        mem: impl Into<UserMemory>,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        let mem = mem.into();
        self.app_range_checks(&mem, iova)?;
        let (lkey, rkey) = self.mr_keys(pd, access)?;
        let mr = Arc::new(MrShared::new_app(
            LKey(lkey),
            RKey(rkey),
            pd,
            access,
            iova,
            mem,
        ));
        self.mrs.insert(mr.clone());
        Ok(MemoryRegion(mr))
    }

    /// `ibv_rereg_mr`: `mr` is registered again over `mem` from `iova`, in `pd`, with
    /// `access`, **keeping its keys** while the PD stays (as mlx5 and mlx4 do; rdma-core's own
    /// tests take the keys a peer already holds to stay valid). A region moved to another PD
    /// gets fresh keys: a receive posted with the old L_Key was checked against its QP's PD
    /// when posted, and must not reach memory of another PD. A refused reregistration (a
    /// region not registered, a bad range, PD or rights) leaves the region as it was.
    pub fn rereg_mr_app(
        &mut self,
        mr: &MemoryRegion,
        pd: Pd,
        mem: impl Into<UserMemory>,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        let mem = mem.into();
        // Every check first: a refused reregistration leaves the region as it was.
        if !self
            .mrs
            .lkey_ref(mr.lkey())
            .is_some_and(|m| Arc::ptr_eq(m, &mr.0))
        {
            return Err(VerbsError::NoSuchMr);
        }
        self.app_range_checks(&mem, iova)?;
        self.access_checks(pd, access)?;
        self.dereg_mr(mr)?;
        let (lkey, rkey) = if pd == mr.0.pd {
            (mr.lkey(), mr.rkey())
        } else {
            let (l, r) = self.key_pair();
            (LKey(l), RKey(r))
        };
        let new = Arc::new(MrShared::new_app(lkey, rkey, pd, access, iova, mem));
        self.mrs.insert(new.clone());
        Ok(MemoryRegion(new))
    }

    /// The registered region with local key `lkey`, if any (a handle on it: `ibv_advise_mr`
    /// looks its scatter/gather entries up this way).
    pub fn mr_by_lkey(&self, lkey: LKey) -> Option<MemoryRegion> {
        self.mrs.lkey_ref(lkey).cloned().map(MemoryRegion)
    }

    /// The checks of application memory registered from `iova`.
    fn app_range_checks(&self, mem: &UserMemory, iova: u64) -> Result<(), VerbsError> {
        // An implicit on-demand region names every address by itself (as mlx5's does).
        if mem.is_implicit() {
            return if iova == 0 {
                Ok(())
            } else {
                Err(VerbsError::BadCap(
                    "an implicit on-demand region's iova is 0",
                ))
            };
        }
        if iova.checked_add(mem.len()).is_none() {
            return Err(VerbsError::BadCap("iova + length overflows"));
        }
        if mem.len() > self.cfg.max_mr_size {
            return Err(VerbsError::BadCap("MR longer than max_mr_size"));
        }
        Ok(())
    }

    /// The checks of a registration's PD and rights.
    fn access_checks(&self, pd: Pd, access: AccessFlags) -> Result<(), VerbsError> {
        if !self.pds.contains(&pd.0) {
            return Err(VerbsError::NoSuchPd);
        }
        // IBTA 10.6.3.1: remote write or atomic access needs local write.
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(VerbsError::BadCap(
                "REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE",
            ));
        }
        Ok(())
    }

    /// The checks every registration makes.
    fn mr_checks(&self, pd: Pd, access: AccessFlags) -> Result<(), VerbsError> {
        if self.mrs.len() >= self.cfg.max_mr as usize {
            return Err(VerbsError::NoResources("max_mr"));
        }
        self.access_checks(pd, access)
    }

    /// The checks every registration makes, and a fresh pair of distinct keys.
    fn mr_keys(&mut self, pd: Pd, access: AccessFlags) -> Result<(u32, u32), VerbsError> {
        self.mr_checks(pd, access)?;
        Ok(self.key_pair())
    }

    /// A fresh L_Key and a fresh R_Key, distinct.
    fn key_pair(&mut self) -> (u32, u32) {
        let lkey = self.new_key();
        let rkey = loop {
            let k = self.new_key();
            if k != lkey {
                break k;
            }
        };
        (lkey, rkey)
    }

    /// Deregister: the keys stop working at once. Memory the region owns lives while handles
    /// remain; application memory ([`reg_mr_app`](Self::reg_mr_app)) is released: no access
    /// to it after this returns, whoever still holds the region.
    pub fn dereg_mr(&mut self, mr: &MemoryRegion) -> Result<(), VerbsError> {
        let m = self.mrs.remove(mr.lkey()).ok_or(VerbsError::NoSuchMr)?;
        m.invalidate_rkey();
        m.release_app_memory();
        Ok(())
    }

    // ---- memory windows ----------------------------------------------------------------

    /// `ibv_alloc_mw`: a memory window of type `kind` in `pd`, bound to nothing. Its R_Key's
    /// upper 24 bits (its index) are its own for its life: no region's key and no other
    /// window's shares them, so every tag a bind gives it names it alone. Bind it with a
    /// [`SendOp::BindMw`](crate::verbs::SendOp::BindMw) request (see [`MwType`] for the rules of each type); at most
    /// `max_mw` live (`NoResources("max_mw")`).
    ///
    /// ```
    /// # use ferroce::verbs::*;
    /// # let mut dev = Device::new(DeviceConfig::new(
    /// #     ferroce::wire::MacAddr([2, 0, 0, 0, 0, 1]), "10.0.0.1".parse().unwrap()));
    /// let pd = dev.alloc_pd()?;
    /// let mw = dev.alloc_mw(pd, MwType::Type2)?;
    /// assert!(!mw.is_bound());
    /// assert_eq!(mw.next_rkey().0 >> 8, mw.rkey().0 >> 8);
    /// assert!(dev.dealloc_pd(pd).is_err()); // the window holds the PD
    /// dev.dealloc_mw(&mw)?;
    /// dev.dealloc_pd(pd)?;
    /// # Ok::<(), VerbsError>(())
    /// ```
    pub fn alloc_mw(&mut self, pd: Pd, kind: MwType) -> Result<MemoryWindow, VerbsError> {
        if !self.pds.contains(&pd.0) {
            return Err(VerbsError::NoSuchPd);
        }
        if self.mrs.windows_len() >= self.cfg.max_mw as usize {
            return Err(VerbsError::NoResources("max_mw"));
        }
        let mrs = &self.mrs;
        let k = self.keys.mr_key(|k| mrs.index_taken(k >> 8));
        let w = Arc::new(MwShared::new(pd, kind, RKey(k)));
        self.mrs.insert_window(w.clone());
        Ok(MemoryWindow(w))
    }

    /// `ibv_dealloc_mw`: the window's key stops working at once.
    pub fn dealloc_mw(&mut self, mw: &MemoryWindow) -> Result<(), VerbsError> {
        match self.mrs.window(mw.index()) {
            Some(w) if Arc::ptr_eq(w, &mw.0) => {
                self.mrs.remove_window(mw.index());
                Ok(())
            }
            _ => Err(VerbsError::NoSuchMw),
        }
    }

    // ---- completion queues -------------------------------------------------------------

    /// `ibv_create_cq`: a completion queue of `depth` entries (1 ..= `max_cqe`). A completion
    /// that finds it full is lost and counted (`DeviceCounters::cq_overruns`), the CQ is in
    /// error (`AsyncEvent::CqErr`) and every QP completing into it moves to the error state
    /// (`AsyncEvent::QpFatal`), as IBTA 11.6.2 asks.
    ///
    /// Numbers of destroyed CQs are used again. At most `max_cq` live
    /// (`NoResources("max_cq")`).
    pub fn create_cq(&mut self, depth: usize) -> Result<Cq, VerbsError> {
        if depth == 0 || depth > self.cfg.max_cqe as usize {
            return Err(VerbsError::BadCap("CQ depth"));
        }
        if self.cq_live >= self.cfg.max_cq as usize {
            return Err(VerbsError::NoResources("max_cq"));
        }
        let ring = Some(CqRing::new(depth));
        self.cq_live += 1;
        match self.cq_free.pop() {
            Some(std::cmp::Reverse(i)) => {
                self.cqs[i as usize] = ring;
                Ok(Cq(i))
            }
            None => {
                self.cqs.push(ring);
                Ok(Cq((self.cqs.len() - 1) as u32))
            }
        }
    }

    /// `ibv_resize_cq`: the CQ holds `depth` completions from now on (those it holds stay).
    /// Refused (`BadCap`, EINVAL, the CQ unchanged) for a depth of 0 or above `max_cqe`, and
    /// for one below the completions it holds (`held` more are held above the device, by the
    /// runtime), as rxe refuses to shrink a CQ below its contents.
    pub fn resize_cq(&mut self, cq: Cq, depth: usize, held: usize) -> Result<(), VerbsError> {
        if depth == 0 || depth > self.cfg.max_cqe as usize {
            return Err(VerbsError::BadCap("CQ depth"));
        }
        let ring = self.cq_mut(cq)?;
        if ring.len() + held > depth {
            return Err(VerbsError::BadCap(
                "CQ depth below the completions it holds",
            ));
        }
        ring.set_depth(depth);
        Ok(())
    }

    /// `ibv_destroy_cq`: refused (`Busy`, EBUSY) while a QP completes into it; completions
    /// still in it are dropped with it.
    pub fn destroy_cq(&mut self, cq: Cq) -> Result<(), VerbsError> {
        self.cq_mut(cq)?;
        // (An XRC target has no CQ: it completes into its XRC SRQs', checked as theirs.)
        if self
            .qps
            .values()
            .any(|s| s.qp.send_cq() == cq || s.qp.recv_cq() == cq)
        {
            return Err(VerbsError::Busy("a QP completes into the CQ"));
        }
        if self
            .srqs
            .iter()
            .flatten()
            .any(|s| s.xrc.is_some_and(|x| x.cq == cq))
        {
            return Err(VerbsError::Busy("an XRC SRQ completes into the CQ"));
        }
        self.cqs[cq.0 as usize] = None;
        self.cq_live -= 1;
        self.cq_free.push(std::cmp::Reverse(cq.0));
        Ok(())
    }

    fn cq_mut(&mut self, cq: Cq) -> Result<&mut CqRing, VerbsError> {
        self.cqs
            .get_mut(cq.0 as usize)
            .and_then(|c| c.as_mut())
            .ok_or(VerbsError::NoSuchCq)
    }

    /// `ibv_poll_cq`: move up to `max` completions into `out`; returns how many. (See
    /// [`Device`] for a whole `post_send` → completion walk-through.)
    pub fn poll_cq(
        &mut self,
        cq: Cq,
        out: &mut Vec<WorkCompletion>,
        max: usize,
    ) -> Result<usize, VerbsError> {
        self.fail_overrun_qps();
        Ok(self.cq_mut(cq)?.poll(out, max))
    }

    /// Completions waiting in the CQ.
    pub fn cq_len(&self, cq: Cq) -> usize {
        self.cqs
            .get(cq.0 as usize)
            .and_then(|c| c.as_ref())
            .map_or(0, |c| c.len())
    }

    /// Arm the CQ's notification (`ibv_req_notify_cq`).
    pub fn req_notify_cq(&mut self, cq: Cq, mode: NotifyMode) -> Result<(), VerbsError> {
        self.cq_mut(cq)?.arm(mode);
        Ok(())
    }

    /// Consume one completion event if one fired (`ibv_get_cq_event`, non-blocking).
    pub fn get_cq_event(&mut self, cq: Cq) -> Result<bool, VerbsError> {
        Ok(self.cq_mut(cq)?.take_event())
    }

    // ---- queue pairs ------------------------------------------------------------------

    /// `ibv_create_qp`: a queue pair of `init.qp_type` (RC, UC or UD) in the RESET state,
    /// taking its receives from `init.srq` if given. It is brought up with
    /// [`modify_qp`](Self::modify_qp) (an RC QP all at once with
    /// [`connect_rc`](Self::connect_rc)).
    ///
    /// ```
    /// # use ferroce::verbs::*;
    /// # let mut dev = Device::new(DeviceConfig::new(
    /// #     ferroce::wire::MacAddr([2, 0, 0, 0, 0, 1]), "10.0.0.1".parse().unwrap()));
    /// let pd = dev.alloc_pd()?;
    /// let cq = dev.create_cq(64)?;
    /// let cap = QpCap { max_send_wr: 32, max_recv_wr: 32, max_send_sge: 2, max_recv_sge: 2,
    ///                   max_inline_data: 64 };
    /// let qp = dev.create_qp(QpInitAttr::new(pd, cq, cq, cap))?;
    /// assert_eq!(dev.query_qp(qp)?.0, QpState::Reset);
    ///
    /// // RESET → INIT (receives may be posted from INIT on).
    /// let (attr, mask) = RcParams::default().init_attr();
    /// dev.modify_qp(qp, &attr, mask)?;
    /// assert_eq!(dev.query_qp(qp)?.0, QpState::Init);
    ///
    /// // A UD QP needs a Q_Key to reach INIT.
    /// let ud = dev.create_qp(QpInitAttr::new(pd, cq, cq, cap).with_type(QpType::Ud))?;
    /// let a = QpAttr { qkey: 0x11111111, port_num: 1, ..QpAttr::default() };
    /// let m = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
    /// let mut init = a;
    /// init.qp_state = QpState::Init;
    /// assert!(dev.modify_qp(ud, &init, m).is_err());
    /// dev.modify_qp(ud, &init, m | QpAttrMask::QKEY)?;
    /// # Ok::<(), VerbsError>(())
    /// ```
    pub fn create_qp(&mut self, init: QpInitAttr) -> Result<QpNumber, VerbsError> {
        self.check_qp_init(&init)?;
        let (lo, hi) = self.qpn_range();
        let mut qpn = self.next_qpn.clamp(lo, hi);
        // At most one lap of the range (a full block has no free number).
        for _ in lo..=hi {
            if !self.qps.contains_key(&qpn) {
                self.next_qpn = if qpn == hi { lo } else { qpn + 1 };
                self.insert_qp(qpn, init, false);
                return Ok(QpNumber::new(qpn));
            }
            qpn = if qpn == hi { lo } else { qpn + 1 };
        }
        Err(VerbsError::NoResources(
            "max_qp (the device's block of QPNs is full)",
        ))
    }

    /// The QPNs `create_qp` hands out, `lo..=hi`: the 24-bit space above the special QPs
    /// (0 and 1; up to 0x10 kept free), or the configured block ([`DeviceConfig::qpn_block`])
    /// but its lowest 0x11 numbers (every block then holds as many QPs,
    /// [`super::limits::QPN_BLOCK_QPS`]).
    pub fn qpn_range(&self) -> (u32, u32) {
        match self.cfg.qpn_block {
            None => (0x11, QpNumber::MASK),
            Some(b) => {
                let base = u32::from(b) << 16;
                (base | 0x11, base | 0xffff)
            }
        }
    }

    /// Changes so far that may have changed [`Self::receive_scope`] (a QP created, modified
    /// or destroyed): a caller that keeps a copy of the scope recomputes it when this moves.
    pub fn scope_gen(&self) -> u64 {
        self.scope_gen
    }

    /// Which QPs may take a unicast frame, and from where, for a filter in front of the
    /// device (the UDP socket's, [`crate::io::udp_filter`]): with at most `exact_max` QPs,
    /// each QP — a connected (RC, UC) QP only once it has a path, and only from its peer's
    /// address; a UD QP from anywhere; else the range of QPNs handed out so far. A frame
    /// outside the scope is one the engine drops on its address or QPN check
    /// (`handle_frame`), so a filter that drops it changes nothing the peer sees. QP1 and the
    /// multicast QPN are not listed (a filter lets them through).
    pub fn receive_scope(&self, exact_max: usize) -> ReceiveScope {
        if self.qps.len() > exact_max {
            // QPNs only increase until they wrap: after a wrap, any QPN may be live.
            let (lo, hi) = self.qpn_range();
            let wrapped = self.next_qpn <= self.max_qpn;
            return ReceiveScope::Range {
                lo,
                hi: if wrapped { hi } else { self.max_qpn },
            };
        }
        let mut v: Vec<(QpNumber, Option<IpAddr>)> = self
            .qps
            .iter()
            .filter(|(&n, _)| n != QpNumber::GSI.get())
            .filter_map(|(&n, slot)| {
                let src = match &*slot.qp {
                    TransportQp::Rc(q) => Some(q.path()?.dst_ip),
                    TransportQp::Uc(q) => Some(q.path()?.dst_ip),
                    TransportQp::Ud(_) => None,
                };
                Some((QpNumber::new(n), src))
            })
            .collect();
        v.sort_unstable_by_key(|(n, _)| n.get());
        ReceiveScope::Exact(v)
    }

    /// QP1, the general services interface (GSI) of the port: a UD QP numbered 1 whose Q_Key
    /// is always 0x80010000, which takes MADs from any sender and sends with the port's P_Key
    /// (the kernel creates it for the CM; a userspace device makes it when asked). `init`
    /// must be of type UD. Fails with `Busy` if QP1 exists.
    pub fn create_gsi_qp(&mut self, init: QpInitAttr) -> Result<QpNumber, VerbsError> {
        if init.qp_type != QpType::Ud {
            return Err(VerbsError::BadCap("the GSI (QP1) is a UD QP"));
        }
        self.check_qp_init(&init)?;
        if self.qps.contains_key(&QpNumber::GSI.get()) {
            return Err(VerbsError::Busy("QP1 exists"));
        }
        self.insert_qp(QpNumber::GSI.get(), init, true);
        Ok(QpNumber::GSI)
    }

    fn check_qp_init(&mut self, init: &QpInitAttr) -> Result<(), VerbsError> {
        match (init.qp_type, init.xrcd) {
            (QpType::XrcRecv, Some(x)) if self.xrcds.contains(&x.0) => {
                return if self.qps.len() as u32 >= self.cfg.max_qp {
                    Err(VerbsError::NoResources("max_qp"))
                } else {
                    Ok(())
                };
            }
            (QpType::XrcRecv, _) => return Err(VerbsError::NoSuchXrcd),
            (QpType::XrcSend, _) if init.srq.is_some() => {
                return Err(VerbsError::BadCap("an XRC initiator has no receive queue"))
            }
            _ => {}
        }
        if !self.pds.contains(&init.pd.0) {
            return Err(VerbsError::NoSuchPd);
        }
        for cq in [init.send_cq, init.recv_cq] {
            self.cq_mut(cq)?;
        }
        if let Some(srq) = init.srq {
            self.srq_ring(srq)?;
        }
        let c = init.cap;
        let max_recv_wr = if init.srq.is_some() { 0 } else { c.max_recv_wr };
        if c.max_send_wr > self.cfg.max_qp_wr || max_recv_wr > self.cfg.max_qp_wr {
            return Err(VerbsError::BadCap("max_send_wr/max_recv_wr"));
        }
        if c.max_send_sge > self.cfg.max_sge || c.max_recv_sge > self.cfg.max_sge {
            return Err(VerbsError::BadCap("max_send_sge/max_recv_sge"));
        }
        if c.max_inline_data > self.cfg.max_inline {
            return Err(VerbsError::BadCap("max_inline_data"));
        }
        if self.qps.len() as u32 >= self.cfg.max_qp {
            return Err(VerbsError::NoResources("max_qp"));
        }
        Ok(())
    }

    /// Make QP `qpn` of a checked `init`.
    fn insert_qp(&mut self, qpn: u32, init: QpInitAttr, gsi: bool) {
        self.scope_gen += 1;
        self.max_qpn = self.max_qpn.max(qpn);
        let mut cap = init.cap;
        if init.srq.is_some() || init.qp_type.is_xrc() {
            cap.max_recv_wr = 0;
            cap.max_recv_sge = 0;
        }
        if init.qp_type == QpType::XrcRecv {
            cap = QpCap::default();
        }
        cap.max_inline_data = granted_inline(&cap, self.cfg.max_inline);
        let num = QpNumber::new(qpn);
        let i = QpInit {
            pd: init.pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            cap,
            sq_sig_all: init.sq_sig_all,
            srq: init.srq,
        };
        let qp = match init.qp_type {
            QpType::Rc | QpType::XrcSend | QpType::XrcRecv => {
                let cfg = QpConfig {
                    max_inflight: self.cfg.max_inflight,
                    cc: self.cfg.cc.build(self.cfg.line_rate_bps),
                    pacer: match self.cfg.cc {
                        crate::cc::CcConfig::None => crate::cc::Pacer::unlimited(),
                        // A burst of two full frames keeps the pacer accurate without
                        // stalling batches.
                        _ => crate::cc::Pacer::new(self.cfg.line_rate_bps, 2 * 4200),
                    },
                    np: self
                        .cfg
                        .cnp_interval
                        .map(crate::cc::dcqcn::NotificationPoint::new),
                    ack_delay: self.cfg.ack_delay,
                    fast_recovery: self.cfg.fast_recovery,
                    selective_repeat: self.cfg.selective_repeat,
                    deviations: self.cfg.deviations,
                    xrc: match init.qp_type {
                        QpType::XrcSend => XrcRole::Send,
                        QpType::XrcRecv => XrcRole::Recv,
                        _ => XrcRole::None,
                    },
                    xrcd: init.xrcd,
                };
                TransportQp::Rc(Qp::new(num, i, cfg))
            }
            QpType::Uc => TransportQp::Uc(crate::uc::qp::Qp::new(num, i)),
            QpType::Ud => TransportQp::Ud(crate::ud::qp::Qp::new(
                num,
                crate::ud::qp::UdInit {
                    qp: i,
                    gsi,
                    port_mtu: self.cfg.port_mtu,
                },
            )),
        };
        if let Some(srq) = init.srq {
            if let Ok(s) = self.srq_ring(srq) {
                s.attached += 1;
            }
        }
        self.qps.insert(qpn, Slot::new(qp));
    }

    /// `ibv_destroy_qp`: the QP and its queues are gone, without completions (an SRQ it was
    /// attached to keeps its WQEs). The completions of the QP its send and receive CQs still
    /// hold (flushes of a QP in the error state included) are removed with it, as rdma-core's
    /// providers clean a destroyed QP out of its CQs: no completion of it is polled after. An
    /// XRC target has no CQs: the completions of what it received stay in its XRC SRQs' CQs
    /// (their WQEs were spent; mlx5 cleans no CQ for an XRC target QP either).
    pub fn destroy_qp(&mut self, qpn: QpNumber) -> Result<(), VerbsError> {
        self.scope_gen += 1;
        let slot = self
            .qps
            .remove(&qpn.get())
            .ok_or(VerbsError::NoSuchQp(qpn))?;
        self.purge_cqs(qpn, [slot.qp.send_cq(), slot.qp.recv_cq()]);
        // A destroyed QP leaves its multicast groups (as the kernel detaches it).
        self.mcast.retain(|_, q| {
            q.retain(|&n| n != qpn.get());
            !q.is_empty()
        });
        if let Some(srq) = slot.qp.srq() {
            if let Ok(s) = self.srq_ring(srq) {
                s.attached = s.attached.saturating_sub(1);
            }
        }
        Ok(())
    }

    // ---- multicast -----------------------------------------------------------------------

    /// `ibv_attach_mcast`: the UD QP receives the packets sent to multicast `group` (an IP
    /// multicast address; its RoCE v2 GID is the IPv4-mapped or the IPv6 address) with
    /// destination QPN 0xFFFFFF. Attaching twice is one attachment.
    pub fn attach_mcast(&mut self, qpn: QpNumber, group: IpAddr) -> Result<(), VerbsError> {
        if !group.is_multicast() {
            return Err(VerbsError::BadMulticast("not an IP multicast address"));
        }
        if self.qp(qpn)?.qp_type() != QpType::Ud {
            return Err(VerbsError::BadMulticast(
                "only UD QPs join multicast groups",
            ));
        }
        if !self.mcast.contains_key(&group) && self.mcast.len() >= MAX_MCAST_GROUPS {
            return Err(VerbsError::NoResources("multicast groups"));
        }
        let q = self.mcast.entry(group).or_default();
        if !q.contains(&qpn.get()) {
            if q.len() >= MAX_MCAST_QP_ATTACH {
                return Err(VerbsError::NoResources("QPs attached to a multicast group"));
            }
            q.push(qpn.get());
        }
        Ok(())
    }

    /// `ibv_detach_mcast`: undo [`Device::attach_mcast`] (EINVAL if it was not attached).
    pub fn detach_mcast(&mut self, qpn: QpNumber, group: IpAddr) -> Result<(), VerbsError> {
        let q = self.mcast.get_mut(&group).ok_or(VerbsError::BadMulticast(
            "the QP is not attached to this group",
        ))?;
        let before = q.len();
        q.retain(|&n| n != qpn.get());
        if q.len() == before {
            return Err(VerbsError::BadMulticast(
                "the QP is not attached to this group",
            ));
        }
        if q.is_empty() {
            self.mcast.remove(&group);
        }
        Ok(())
    }

    /// The multicast groups at least one QP is attached to.
    pub fn mcast_groups(&self) -> Vec<IpAddr> {
        self.mcast.keys().copied().collect()
    }

    /// The QP's state and current attributes (`ibv_query_qp`).
    pub fn query_qp(&self, qpn: QpNumber) -> Result<(QpState, QpAttr), VerbsError> {
        let qp = self.qp(qpn)?;
        let mut a = *qp.attr();
        a.qp_state = qp.state();
        a.cur_qp_state = qp.state();
        Ok((qp.state(), a))
    }

    /// What the QP was granted (`ibv_qp_init_attr.cap` after `ibv_create_qp`): at least what
    /// was asked; inline data at least the room of its send SGEs ([`granted_inline`]).
    pub fn qp_cap(&self, qpn: QpNumber) -> Result<QpCap, VerbsError> {
        Ok(self.qp(qpn)?.cap())
    }

    /// The QP's transport.
    pub fn qp_type(&self, qpn: QpNumber) -> Result<QpType, VerbsError> {
        Ok(self.qp(qpn)?.qp_type())
    }

    fn qp(&self, qpn: QpNumber) -> Result<&TransportQp, VerbsError> {
        self.qps
            .get(&qpn.get())
            .map(|s| &*s.qp)
            .ok_or(VerbsError::NoSuchQp(qpn))
    }

    /// `ibv_modify_qp`: the transition table of the QP's transport and the value checks of
    /// [`crate::ib::attr`], then the attributes in `mask` take effect. [`RcParams`](super::RcParams)
    /// builds the attributes of RESET → INIT → RTR → RTS for RC, [`UcParams`](super::UcParams)
    /// and [`UdParams`](super::UdParams) those of UC and UD. The P_Key index must be 0 (the
    /// P_Key table has one entry, [`PKEY_TABLE`]).
    ///
    /// ```
    /// # use ferroce::verbs::*;
    /// # let mut dev = Device::new(DeviceConfig::new(
    /// #     ferroce::wire::MacAddr([2, 0, 0, 0, 0, 1]), "10.0.0.1".parse().unwrap()));
    /// # let pd = dev.alloc_pd()?;
    /// # let cq = dev.create_cq(8)?;
    /// # let cap = QpCap { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1,
    /// #                   max_inline_data: 0 };
    /// # let qp = dev.create_qp(QpInitAttr::new(pd, cq, cq, cap))?;
    /// // RESET → RTS is no transition of the state machine.
    /// let (mut attr, mask) = RcParams::default().rts_attr();
    /// assert!(matches!(
    ///     dev.modify_qp(qp, &attr, mask),
    ///     Err(VerbsError::Modify(ModifyQpError::IllegalTransition { .. }))
    /// ));
    /// // Values are checked too: retry_cnt has 3 bits.
    /// let (init, init_mask) = RcParams::default().init_attr();
    /// dev.modify_qp(qp, &init, init_mask)?;
    /// attr.qp_state = QpState::Init;
    /// attr.retry_cnt = 8;
    /// let r = dev.modify_qp(qp, &attr, QpAttrMask::RETRY_CNT);
    /// assert!(r.is_err());
    /// # Ok::<(), VerbsError>(())
    /// ```
    pub fn modify_qp(
        &mut self,
        qpn: QpNumber,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), VerbsError> {
        self.scope_gen += 1;
        let slot = self
            .qps
            .get_mut(&qpn.get())
            .ok_or(VerbsError::NoSuchQp(qpn))?;
        let qp = &mut *slot.qp;
        let next = check_modify_qp(qp.qp_type(), qp.state(), attr, mask)?;
        for (bit, name, v) in [
            (
                QpAttrMask::MAX_QP_RD_ATOMIC,
                "max_rd_atomic",
                attr.max_rd_atomic,
            ),
            (
                QpAttrMask::MAX_DEST_RD_ATOMIC,
                "max_dest_rd_atomic",
                attr.max_dest_rd_atomic,
            ),
        ] {
            if mask.contains(bit) && v > self.cfg.max_qp_rd_atom {
                return Err(VerbsError::Modify(ModifyQpError::InvalidValue {
                    attr: name,
                    value: v.into(),
                }));
            }
        }
        if mask.contains(QpAttrMask::PATH_MTU) && attr.path_mtu > self.cfg.max_mtu {
            return Err(VerbsError::Modify(ModifyQpError::InvalidValue {
                attr: "path_mtu",
                value: attr.path_mtu.bytes().into(),
            }));
        }
        if mask.contains(QpAttrMask::PKEY_INDEX) && usize::from(attr.pkey_index) >= PKEY_TABLE.len()
        {
            return Err(VerbsError::Modify(ModifyQpError::InvalidValue {
                attr: "pkey_index",
                value: attr.pkey_index.into(),
            }));
        }
        let path = if mask.contains(QpAttrMask::AV) {
            let dqpn = if mask.contains(QpAttrMask::DEST_QPN) {
                attr.dest_qp_num
            } else {
                qp.attr().dest_qp_num
            };
            Some(
                Path::resolve(&attr.ah_attr, &self.cfg.gids, self.cfg.mac, qpn.get(), dqpn)
                    .map_err(VerbsError::BadAddressVector)?,
            )
        } else {
            None
        };
        let cqs = [qp.send_cq(), qp.recv_cq()];
        let now = self.sched.now;
        let mut ctx = ctx!(self, now);
        qp.modify(&mut ctx, attr, mask, next, path);
        self.schedule(qpn.get(), now);
        // To RESET: the QP's completions its CQs still hold (the flushes of its error state)
        // go, as rdma-core's mlx4 and mlx5 providers clean a reset QP out of its CQs; a
        // program that restates a QP after an error then polls only what it posts anew
        // (rdma-core's tests/test_mr.py restates QPs so).
        if next == QpState::Reset {
            self.purge_cqs(qpn, cqs);
        }
        Ok(())
    }

    /// Remove QP `qpn`'s completions from its send and receive CQs' rings.
    fn purge_cqs(&mut self, qpn: QpNumber, cqs: [Cq; 2]) {
        for cq in cqs {
            if let Some(Some(ring)) = self.cqs.get_mut(cq.0 as usize) {
                ring.purge_qp(qpn);
            }
        }
    }

    // ---- work requests -----------------------------------------------------------------

    /// `ibv_post_send`: queue a send work request; its packets leave with the next
    /// [`poll_transmit`](Self::poll_transmit) calls and its completion (if signaled, or on
    /// error) lands in the send CQ. Errors here are the synchronous ones `ibv_post_send`
    /// returns (including an operation the QP's transport does not carry, and a UD request
    /// without a valid address handle of the QP's PD); a bad local key or an SGE outside its
    /// region is reported as a completion with a local protection error when the request is
    /// reached, as libibverbs reports it, and so is a UD message longer than the port MTU
    /// (a local length error).
    pub fn post_send(&mut self, qpn: QpNumber, wr: SendWr) -> Result<(), VerbsError> {
        let slot = self
            .qps
            .get_mut(&qpn.get())
            .ok_or(VerbsError::NoSuchQp(qpn))?;
        let qp = &mut *slot.qp;
        qp.check_post_send()?;
        let len = check_send_wr(&wr, &qp.cap())?;
        let t = qp.qp_type();
        if !wr.op.allowed_on(t) {
            return Err(VerbsError::BadOpcode(t));
        }
        let ud = if t == QpType::Ud {
            let d = wr.ud.ok_or(VerbsError::NoUdDest)?;
            let ah = self
                .ahs
                .get(&d.ah.0)
                .filter(|a| a.pd == qp.pd())
                .ok_or(VerbsError::NoSuchAh)?;
            Some(UdSendDest {
                path: ah.path,
                qpn: d.remote_qpn,
                qkey: d.remote_qkey,
            })
        } else {
            None
        };
        let inline = wr.flags.contains(SendFlags::INLINE) && (wr.op.is_send() || wr.op.is_write());
        let now = self.sched.now;
        let mut ctx = ctx!(self, now);
        let wqe = SendWqe::new(wr, len, inline, ctx.mrs, qp.pd(), ud);
        qp.post_send(&mut ctx, wqe);
        self.schedule(qpn.get(), now);
        Ok(())
    }

    /// `ibv_post_recv` (refused for a QP attached to an SRQ: use
    /// [`post_srq_recv`](Self::post_srq_recv)).
    pub fn post_recv(&mut self, qpn: QpNumber, wr: RecvWr) -> Result<(), VerbsError> {
        let slot = self
            .qps
            .get_mut(&qpn.get())
            .ok_or(VerbsError::NoSuchQp(qpn))?;
        let qp = &mut *slot.qp;
        qp.check_post_recv()?;
        if wr.sg_list.len() > qp.cap().max_recv_sge.max(1) as usize {
            return Err(VerbsError::TooManySge(wr.sg_list.len()));
        }
        let mut ctx = ctx!(self, self.sched.now);
        let wqe = RecvWqe::new(wr, ctx.mrs, qp.pd());
        qp.post_recv(&mut ctx, wqe);
        Ok(())
    }

    // ---- shared receive queues ---------------------------------------------------------

    fn srq_ring(&mut self, srq: Srq) -> Result<&mut SrqRing, VerbsError> {
        self.srqs
            .get_mut(srq.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(VerbsError::NoSuchSrq)
    }

    /// `ibv_create_srq`: a shared receive queue of `attr.max_wr` receive WQEs (1 ..=
    /// `max_qp_wr`) of at most `attr.max_sge` entries in `pd`. `attr.srq_limit` is ignored, as
    /// `ibv_create_srq(3)` says: [`modify_srq`](Self::modify_srq) arms the limit.
    ///
    /// ```
    /// # use ferroce::verbs::*;
    /// # let mut dev = Device::new(DeviceConfig::new(
    /// #     ferroce::wire::MacAddr([2, 0, 0, 0, 0, 1]), "10.0.0.1".parse().unwrap()));
    /// let pd = dev.alloc_pd()?;
    /// let srq = dev.create_srq(pd, SrqAttr { max_wr: 64, max_sge: 1, srq_limit: 0 })?;
    /// dev.modify_srq(srq, &SrqAttr { srq_limit: 8, ..SrqAttr::default() }, SrqAttrMask::LIMIT)?;
    /// assert_eq!(dev.query_srq(srq)?.srq_limit, 8);
    /// let cq = dev.create_cq(64)?;
    /// let cap = QpCap { max_send_wr: 8, max_send_sge: 1, ..QpCap::default() };
    /// let qp = dev.create_qp(QpInitAttr::new(pd, cq, cq, cap).with_srq(srq))?;
    /// // Attached QPs keep it alive.
    /// assert!(matches!(dev.destroy_srq(srq), Err(VerbsError::Busy(_))));
    /// dev.destroy_qp(qp)?;
    /// dev.destroy_srq(srq)?;
    /// # Ok::<(), VerbsError>(())
    /// ```
    pub fn create_srq(&mut self, pd: Pd, attr: SrqAttr) -> Result<Srq, VerbsError> {
        if !self.pds.contains(&pd.0) {
            return Err(VerbsError::NoSuchPd);
        }
        if attr.max_wr == 0 || attr.max_wr > self.cfg.max_qp_wr {
            return Err(VerbsError::BadCap("SRQ max_wr"));
        }
        if self.srqs.iter().flatten().count() >= self.cfg.max_srq as usize {
            return Err(VerbsError::NoResources("max_srq"));
        }
        if attr.max_sge > self.cfg.max_sge {
            return Err(VerbsError::BadCap("SRQ max_sge"));
        }
        let ring = SrqRing::new(pd, attr.max_wr, attr.max_sge.max(1));
        let n = match self.srqs.iter().position(Option::is_none) {
            Some(i) => {
                self.srqs[i] = Some(ring);
                i
            }
            None => {
                self.srqs.push(Some(ring));
                self.srqs.len() - 1
            }
        };
        Ok(Srq(n as u32))
    }

    /// `ibv_modify_srq`: resize (`MAX_WR`, never below the WQEs held or an armed limit) and
    /// arm the limit (`LIMIT`; 0 disarms). All or nothing.
    pub fn modify_srq(
        &mut self,
        srq: Srq,
        attr: &SrqAttr,
        mask: SrqAttrMask,
    ) -> Result<(), VerbsError> {
        let max = self.cfg.max_qp_wr;
        self.srq_ring(srq)?.modify(attr, mask, max)?;
        Ok(())
    }

    /// `ibv_query_srq`: the size, entries per WQE and the armed limit (0 once it fired).
    pub fn query_srq(&self, srq: Srq) -> Result<SrqAttr, VerbsError> {
        self.srqs
            .get(srq.0 as usize)
            .and_then(Option::as_ref)
            .map(SrqRing::attr)
            .ok_or(VerbsError::NoSuchSrq)
    }

    /// `ibv_open_xrcd`: a new XRC domain. (Sharing one between processes through a file, as
    /// `ibv_open_xrcd`'s `fd` does on a kernel device, is the C library's: see `docs/cabi.md`.)
    pub fn alloc_xrcd(&mut self) -> Result<Xrcd, VerbsError> {
        if self.xrcds.len() >= super::limits::MAX_XRCD as usize {
            return Err(VerbsError::NoResources("max_xrcd"));
        }
        let x = self.next_xrcd;
        self.next_xrcd = self.next_xrcd.wrapping_add(1).max(1);
        self.xrcds.push(x);
        Ok(Xrcd(x))
    }

    /// `ibv_close_xrcd`: refused (`Busy`) while XRC SRQs or target QPs of the domain exist.
    pub fn dealloc_xrcd(&mut self, xrcd: Xrcd) -> Result<(), VerbsError> {
        let i = self
            .xrcds
            .iter()
            .position(|&x| x == xrcd.0)
            .ok_or(VerbsError::NoSuchXrcd)?;
        if self
            .srqs
            .iter()
            .flatten()
            .any(|s| s.xrc.is_some_and(|x| x.xrcd == xrcd))
        {
            return Err(VerbsError::Busy("XRC SRQs of the domain exist"));
        }
        if self.qps.values().any(|s| s.qp.xrcd() == Some(xrcd)) {
            return Err(VerbsError::Busy("XRC target QPs of the domain exist"));
        }
        self.xrcds.swap_remove(i);
        Ok(())
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`: an XRC SRQ of domain `xrcd` whose receive
    /// completions go to `cq` (the limits of [`create_srq`](Self::create_srq)). Its number
    /// (`ibv_get_srq_num`) is what initiators name in their requests' XRCETH.
    pub fn create_xrc_srq(
        &mut self,
        pd: Pd,
        attr: SrqAttr,
        xrcd: Xrcd,
        cq: Cq,
    ) -> Result<Srq, VerbsError> {
        if !self.xrcds.contains(&xrcd.0) {
            return Err(VerbsError::NoSuchXrcd);
        }
        self.cq_mut(cq)?;
        let srq = self.create_srq(pd, attr)?;
        self.srq_ring(srq)?.xrc = Some(crate::ib::srq::XrcSrq { xrcd, cq });
        Ok(srq)
    }

    /// The XRC domain of an XRC SRQ (`None` for an ordinary one).
    pub fn srq_xrcd(&self, srq: Srq) -> Option<Xrcd> {
        self.srqs.get(srq.0 as usize)?.as_ref()?.xrc.map(|x| x.xrcd)
    }

    /// `ibv_destroy_srq`: refused (`Busy`, EBUSY) while QPs are attached.
    pub fn destroy_srq(&mut self, srq: Srq) -> Result<(), VerbsError> {
        if self.srq_ring(srq)?.attached > 0 {
            return Err(VerbsError::Busy("QPs are attached to the SRQ"));
        }
        self.srqs[srq.0 as usize] = None;
        Ok(())
    }

    /// `ibv_post_srq_recv`: queue a receive WQE on the SRQ (its entries checked against the
    /// SRQ's PD when a message reaches it, as `post_recv`'s are).
    pub fn post_srq_recv(&mut self, srq: Srq, wr: RecvWr) -> Result<(), VerbsError> {
        let mrs = &self.mrs;
        let s = self
            .srqs
            .get_mut(srq.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(VerbsError::NoSuchSrq)?;
        if wr.sg_list.len() > s.attr().max_sge as usize {
            return Err(VerbsError::TooManySge(wr.sg_list.len()));
        }
        s.check_post()?;
        let wqe = RecvWqe::new(wr, mrs, s.pd);
        s.post(wqe);
        Ok(())
    }

    /// Receive WQEs the SRQ holds, and the ones responders have taken from it so far (a
    /// runtime derives the free slots from these).
    pub fn srq_occupancy(&self, srq: Srq) -> Option<(usize, u64)> {
        self.srqs
            .get(srq.0 as usize)
            .and_then(Option::as_ref)
            .map(|s| (s.len(), s.taken()))
    }

    // ---- address handles ---------------------------------------------------------------

    /// `ibv_create_ah`: an address handle for UD sends along address vector `av` in `pd`. A
    /// vector without a destination MAC takes a multicast group's MAC (from its address), or
    /// the one the device last saw the destination's RoCE frames come from; with neither, the
    /// call fails (`BadAddressVector`).
    pub fn create_ah(&mut self, pd: Pd, av: &AddressVector) -> Result<Ah, VerbsError> {
        if !self.pds.contains(&pd.0) {
            return Err(VerbsError::NoSuchPd);
        }
        let mut av = *av;
        if av.dmac.is_none() {
            // a multicast group's MAC follows from its address; a peer's is the one it was
            // last seen with
            let ip = crate::ib::ip_of_gid(av.dgid);
            av.dmac = MacAddr::for_ip_multicast(ip)
                .or_else(|| self.neighbours.get(&ip).copied())
                .map(|m| m.0);
        }
        if av.flow_label > 0xf_ffff {
            return Err(AvError::FlowLabelTooWide(av.flow_label).into());
        }
        let path = Path::resolve(&av, &self.cfg.gids, self.cfg.mac, 0, 0)
            .map_err(VerbsError::BadAddressVector)?;
        if self.ahs.len() >= self.cfg.max_ah as usize {
            return Err(VerbsError::NoResources("max_ah"));
        }
        let mut n = self.next_ah;
        while self.ahs.contains_key(&n) || n == 0 {
            n = n.wrapping_add(1);
        }
        self.next_ah = n.wrapping_add(1);
        self.ahs.insert(n, AhEntry { pd, av, path });
        Ok(Ah(n))
    }

    /// `ibv_init_ah_from_wc`: the address vector that answers the sender of the UD message
    /// that completed as `wc`, whose receive buffer started with `grh` (its 40-byte slot);
    /// the destination MAC is the one its frame came from, if the device saw it.
    pub fn init_ah_from_wc(
        &self,
        wc: &WorkCompletion,
        grh: &[u8],
    ) -> Result<AddressVector, VerbsError> {
        let mut av = ah_attr_from_wc(wc, grh, &self.cfg.gids)?;
        av.dmac = self
            .neighbours
            .get(&crate::ib::ip_of_gid(av.dgid))
            .map(|m| m.0);
        Ok(av)
    }

    /// `ibv_create_ah_from_wc`: [`init_ah_from_wc`](Self::init_ah_from_wc) then
    /// [`create_ah`](Self::create_ah).
    pub fn create_ah_from_wc(
        &mut self,
        pd: Pd,
        wc: &WorkCompletion,
        grh: &[u8],
    ) -> Result<Ah, VerbsError> {
        let av = self.init_ah_from_wc(wc, grh)?;
        self.create_ah(pd, &av)
    }

    /// `ibv_destroy_ah` (sends already posted along it still go).
    pub fn destroy_ah(&mut self, ah: Ah) -> Result<(), VerbsError> {
        self.ahs
            .remove(&ah.0)
            .map(|_| ())
            .ok_or(VerbsError::NoSuchAh)
    }

    /// The address vector an address handle was made from.
    pub fn query_ah(&self, ah: Ah) -> Result<AddressVector, VerbsError> {
        self.ahs
            .get(&ah.0)
            .map(|a| a.av)
            .ok_or(VerbsError::NoSuchAh)
    }

    /// The MAC address the device last saw `ip`'s RoCE frames come from.
    pub fn neighbour(&self, ip: IpAddr) -> Option<MacAddr> {
        self.neighbours.get(&ip).copied()
    }

    #[inline]
    pub(super) fn learn_neighbour(&mut self, ip: IpAddr, mac: MacAddr) {
        if self.last_neighbour != Some((ip, mac)) {
            self.learn_new_neighbour(ip, mac);
        }
    }

    #[cold]
    fn learn_new_neighbour(&mut self, ip: IpAddr, mac: MacAddr) {
        if self.neighbours.len() >= MAX_NEIGHBOURS && !self.neighbours.contains_key(&ip) {
            return;
        }
        self.neighbours.insert(ip, mac);
        self.last_neighbour = Some((ip, mac));
    }

    // ---- asynchronous events -----------------------------------------------------------

    /// `ibv_get_async_event` without blocking: the oldest unread event. (`ibv_ack_async_event`
    /// has nothing to do here: an event is gone once read.)
    pub fn get_async_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop()
    }

    /// Events lost because too many were unread.
    pub fn async_events_lost(&self) -> u64 {
        self.events.lost()
    }

    /// Events queued so far, read or not (a driver notices new ones by comparing it).
    pub fn async_events_queued(&self) -> u64 {
        self.events.queued()
    }

    /// Events waiting to be read.
    pub fn async_events_pending(&self) -> usize {
        self.events.len()
    }

    // ---- counters ---------------------------------------------------------------------

    /// Device counters with QP totals.
    pub fn counters(&self) -> (DeviceCounters, QpCounters) {
        let mut t = QpCounters::default();
        for s in self.qps.values() {
            t.accumulate(s.qp.counters());
        }
        (self.counters, t)
    }

    /// The QP's current sending rate (bits/s) under its congestion control.
    pub fn qp_rate_bps(&self, qpn: QpNumber) -> Option<u64> {
        self.qp(qpn)
            .ok()
            .map(|q| q.rate_bps(self.cfg.line_rate_bps))
    }

    /// Every QP's congestion-control state at `now`: (QPN, rate in bits/s, α if the
    /// controller has one, CNPs handled, CE-marked packets received), by QPN.
    pub fn cc_snapshot(&self, now: Instant) -> Vec<(QpNumber, u64, Option<f64>, u64, u64)> {
        let mut v: Vec<_> = self
            .qps
            .values()
            .map(|s| {
                let q = &s.qp;
                (
                    q.num(),
                    q.rate_bps(self.cfg.line_rate_bps),
                    q.cc_alpha(now),
                    q.counters().cnps_handled,
                    q.counters().ce_rcvd,
                )
            })
            .collect();
        v.sort_by_key(|e| e.0.get());
        v
    }

    /// Every QP's state, sequence numbers, rate and counters, by QPN (what `ferroce res qp`
    /// shows).
    pub fn qp_status(&self) -> Vec<QpStatus> {
        let mut v: Vec<QpStatus> = self
            .qps
            .values()
            .map(|s| {
                let q = &s.qp;
                let (next, una, expected) = q.psns();
                QpStatus {
                    qpn: q.num(),
                    qp_type: q.qp_type(),
                    state: q.state(),
                    dest_qp: q.attr().dest_qp_num,
                    next_psn: next.get(),
                    una_psn: una.get(),
                    expected_psn: expected.get(),
                    rate_bps: q.rate_bps(self.cfg.line_rate_bps),
                    counters: *q.counters(),
                }
            })
            .collect();
        v.sort_by_key(|e| e.qpn.get());
        v
    }

    /// A QP's counters.
    pub fn qp_counters(&self, qpn: QpNumber) -> Option<QpCounters> {
        self.qp(qpn).ok().map(|q| *q.counters())
    }

    /// Number of QPs.
    pub fn qp_count(&self) -> usize {
        self.qps.len()
    }

    /// Approximate bytes of memory a QP uses (its struct, the engine's entry and its queue
    /// buffers).
    pub fn qp_memory(&self, qpn: QpNumber) -> Option<usize> {
        self.qp(qpn)
            .ok()
            .map(|q| std::mem::size_of::<Slot>() + q.memory())
    }

    /// The send CQ of a QP.
    pub fn send_cq_of(&self, qpn: QpNumber) -> Option<Cq> {
        self.qp(qpn).ok().map(|q| q.send_cq())
    }

    /// The QP's receive CQ (its send CQ: [`Device::send_cq_of`]).
    pub fn recv_cq_of(&self, qpn: QpNumber) -> Option<Cq> {
        self.qp(qpn).ok().map(|q| q.recv_cq())
    }

    /// Completion queues that hold completions.
    pub fn cq_ids(&self) -> impl Iterator<Item = Cq> + '_ {
        self.cqs
            .iter()
            .enumerate()
            .filter(|(_, c)| c.as_ref().is_some_and(|c| c.len() > 0))
            .map(|(i, _)| Cq(i as u32))
    }
}
