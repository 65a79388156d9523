//! Queue-pair states and the rules of `modify_qp`: which state transitions are legal and which
//! attributes each transition requires or accepts.
//!
//! # Sources
//!
//! - IBTA Vol. 1 §10.3.1 (QP and EE context states, the QP state diagram) for the states and
//!   the legal transitions, and §11.2.5.2 (the Modify Queue Pair verb) for the attributes
//!   each transition takes.
//! - `ibv_modify_qp(3)` (rdma-core) for the attribute mask bits (`enum ibv_qp_attr_mask` in
//!   `<infiniband/verbs.h>`) and the minimum attribute lists for RESET → INIT → RTR → RTS.
//! - The Linux kernel's `ib_modify_qp_is_ok()` as the reference for the complete
//!   required/optional sets. That table is what a real `ibv_modify_qp` on soft-RoCE (rxe) is
//!   checked against, so [`check_modify`] gives the same answer for every
//!   (type, current state, next state, mask). The table below is written independently from
//!   those facts; no code was copied.
//!
//! # The rule
//!
//! A modify request is a mask of [`QpAttrMask`] bits. If [`QpAttrMask::STATE`] is present the QP
//! moves from the current state to `next`, otherwise the request modifies attributes in place,
//! which is the transition `cur → cur` and must itself be legal (RESET → RESET, INIT → INIT,
//! RTS → RTS, SQD → SQD and ERR → ERR are; RTR → RTR and SQE → SQE are not). For a legal
//! transition every *required* bit must be set, and every bit set must be required, optional,
//! or `STATE`. `CUR_STATE` is not special: like in the kernel's table it is optional only on the
//! transitions into RTS from RTR, RTS, SQD and (UC/UD) SQE, and rejected elsewhere.
//!
//! The legal transitions (for every QP type) are:
//!
//! | from \ to | RESET | INIT | RTR | RTS | SQD | SQE | ERR |
//! |-----------|:-----:|:----:|:---:|:---:|:---:|:---:|:---:|
//! | RESET     |   ✓   |  ✓   |     |     |     |     |     |
//! | INIT      |   ✓   |  ✓   |  ✓  |     |     |     |  ✓  |
//! | RTR       |   ✓   |      |     |  ✓  |     |     |  ✓  |
//! | RTS       |   ✓   |      |     |  ✓  |  ✓  |     |  ✓  |
//! | SQD       |   ✓   |      |     |  ✓  |  ✓  |     |  ✓  |
//! | SQE       |   ✓   |      |     |  ✓  |     |     |  ✓  |
//! | ERR       |   ✓   |      |     |     |     |     |  ✓  |
//!
//! RESET → ERR is not legal (the current kernel table has no such entry). SQE and the
//! transitions into it are entered only by the QP itself on a send error, never by a modify;
//! IBTA does not use SQE for RC (a send error moves an RC QP to ERR), but the verbs table still
//! accepts SQE → RTS for RC with no attributes, and so does this one.
//!
//! Not covered here: device limits (max_rd_atomic against the device, cap sizes), and the
//! runtime rule that an SQD QP still draining may only go to ERR; the QP object enforces those.

use core::fmt;
use core::fmt::Write as _;

use bitflags::bitflags;

/// The state of a queue pair (IBTA Vol. 1 §10.3.1). The discriminants are those of
/// `enum ibv_qp_state`; the default is RESET, the state of a new QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum QpState {
    /// Reset: just created, or reset; no work requests are accepted or processed.
    #[default]
    Reset = 0,
    /// Initialized: receive WRs may be posted but no packets are processed.
    Init = 1,
    /// Ready To Receive: the responder side runs; sends may not be posted.
    Rtr = 2,
    /// Ready To Send: fully operational.
    Rts = 3,
    /// Send Queue Drain(ed): outstanding sends complete, new ones are not started.
    Sqd = 4,
    /// Send Queue Error: a send completed in error (UC/UD); receives still run.
    Sqe = 5,
    /// Error: all work requests are flushed with error.
    Err = 6,
}

impl QpState {
    /// Every state, in `ibv_qp_state` order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    /// The short name used by verbs (`IBV_QPS_<name>`): `RESET`, `INIT`, `RTR`, ….
    pub const fn name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        }
    }

    /// The `enum ibv_qp_state` value.
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }

    /// The state for an `enum ibv_qp_state` value (`IBV_QPS_UNKNOWN` and others give `None`).
    pub const fn from_ibv(v: u32) -> Option<QpState> {
        match v {
            0 => Some(QpState::Reset),
            1 => Some(QpState::Init),
            2 => Some(QpState::Rtr),
            3 => Some(QpState::Rts),
            4 => Some(QpState::Sqd),
            5 => Some(QpState::Sqe),
            6 => Some(QpState::Err),
            _ => None,
        }
    }

    /// A Graphviz rendering of the legal transitions of an RC QP (IBTA Vol. 1 §10.3.1), each
    /// edge labelled with its required (`req`) and optional (`opt`) attributes. The output is
    /// deterministic: edges in `ibv_qp_state` order, attribute names in bit order.
    pub fn dot() -> String {
        let mut s = String::from(
            "digraph rc_qp_states {\n    rankdir=LR;\n    node [shape=box, fontname=\"monospace\"];\n",
        );
        for cur in QpState::ALL {
            for next in QpState::ALL {
                let Some(rule) = rule(QpType::Rc, cur, next) else {
                    continue;
                };
                let mut label = String::new();
                if !rule.required.is_empty() {
                    label.push_str("req: ");
                    label.push_str(&short_names(rule.required));
                }
                if !rule.optional.is_empty() {
                    if !label.is_empty() {
                        label.push_str("\\n");
                    }
                    label.push_str("opt: ");
                    label.push_str(&short_names(rule.optional));
                }
                s.push_str("    ");
                s.push_str(cur.name());
                s.push_str(" -> ");
                s.push_str(next.name());
                if !label.is_empty() {
                    s.push_str(" [label=\"");
                    s.push_str(&label);
                    s.push_str("\"]");
                }
                s.push_str(";\n");
            }
        }
        s.push_str("}\n");
        s
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The transport service of a QP: the connected (RC, UC), datagram (UD) and extended reliable
/// connected (XRC, its two halves) services ferroce implements; RD and raw QPs are not
/// modelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable Connected.
    Rc,
    /// Unreliable Connected.
    Uc,
    /// Unreliable Datagram.
    Ud,
    /// XRC initiator (`IBV_QPT_XRC_SEND`): an RC requester whose requests name the XRC SRQ
    /// that receives them (XRCETH); no receive queue.
    XrcSend,
    /// XRC target (`IBV_QPT_XRC_RECV`): an RC responder of an XRC domain, whose SENDs land in
    /// the XRC SRQ each request names and whose memory checks use that SRQ's PD; no send
    /// queue, no CQ of its own.
    XrcRecv,
}

impl QpType {
    /// `RC`, `UC`, `UD`, `XRC_SEND` or `XRC_RECV`.
    pub const fn name(self) -> &'static str {
        match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
            QpType::XrcSend => "XRC_SEND",
            QpType::XrcRecv => "XRC_RECV",
        }
    }
    /// Whether it is either half of XRC.
    pub const fn is_xrc(self) -> bool {
        matches!(self, QpType::XrcSend | QpType::XrcRecv)
    }
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

bitflags! {
    /// Which attributes of a modify request are valid: `enum ibv_qp_attr_mask` from
    /// `<infiniband/verbs.h>`, same names (without `IBV_QP_`) and same bit values.
    /// Bits 21–24 (`SMAC`, `ALT_SMAC`, `VID`, `ALT_VID`) were never exposed by libibverbs and
    /// are not defined; a mask carrying them (via `from_bits_retain`) is rejected by
    /// [`check_modify`] as unexpected.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `qp_state`: move the QP to this state.
        const STATE = 1 << 0;
        /// `cur_qp_state`: the state the consumer believes the QP is in.
        const CUR_STATE = 1 << 1;
        /// `en_sqd_async_notify`: raise an event when the SQ has drained (RTS → SQD).
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `qp_access_flags`: remote access rights of the responder.
        const ACCESS_FLAGS = 1 << 3;
        /// `pkey_index`.
        const PKEY_INDEX = 1 << 4;
        /// `port_num`.
        const PORT = 1 << 5;
        /// `qkey` (UD).
        const QKEY = 1 << 6;
        /// `ah_attr`: the primary path address vector.
        const AV = 1 << 7;
        /// `path_mtu`.
        const PATH_MTU = 1 << 8;
        /// `timeout`: local ACK timeout exponent.
        const TIMEOUT = 1 << 9;
        /// `retry_cnt`: transport retry count.
        const RETRY_CNT = 1 << 10;
        /// `rnr_retry`: RNR NAK retry count.
        const RNR_RETRY = 1 << 11;
        /// `rq_psn`: expected PSN of the receive side.
        const RQ_PSN = 1 << 12;
        /// `max_rd_atomic`: outstanding RDMA READ/atomic as initiator.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `alt_ah_attr` and friends: the alternate path (APM).
        const ALT_PATH = 1 << 14;
        /// `min_rnr_timer`: RNR NAK timer code sent by the responder.
        const MIN_RNR_TIMER = 1 << 15;
        /// `sq_psn`: first PSN of the send side.
        const SQ_PSN = 1 << 16;
        /// `max_dest_rd_atomic`: responder resources for RDMA READ/atomic.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `path_mig_state` (APM).
        const PATH_MIG_STATE = 1 << 18;
        /// `cap`: resize the queues.
        const CAP = 1 << 19;
        /// `dest_qp_num`.
        const DEST_QPN = 1 << 20;
        /// `rate_limit` (raw packet QPs only).
        const RATE_LIMIT = 1 << 25;
    }
}

/// Names of the set bits, each after `prefix`, joined by `|`; unknown bits as one hexadecimal
/// number; `0` for the empty mask.
fn join_names(mask: QpAttrMask, prefix: &str) -> String {
    let mut out = String::new();
    for (name, _) in mask.iter_names() {
        if !out.is_empty() {
            out.push('|');
        }
        out.push_str(prefix);
        out.push_str(name);
    }
    let unknown = mask.bits() & !QpAttrMask::all().bits();
    if unknown != 0 {
        if !out.is_empty() {
            out.push('|');
        }
        // Writing to a String cannot fail.
        let _ = write!(out, "{unknown:#x}");
    }
    if out.is_empty() {
        out.push('0');
    }
    out
}

fn short_names(mask: QpAttrMask) -> String {
    join_names(mask, "")
}

/// `IBV_QP_AV|IBV_QP_PATH_MTU`: the verbs spelling, for error messages.
impl fmt::Display for QpAttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&join_names(*self, "IBV_QP_"))
    }
}

bitflags! {
    /// Remote/local access rights of a QP or memory region: the first five bits of
    /// `enum ibv_access_flags`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`.
        const LOCAL_WRITE = 1 << 0;
        /// `IBV_ACCESS_REMOTE_WRITE`: incoming RDMA WRITE (and WRITE with immediate).
        const REMOTE_WRITE = 1 << 1;
        /// `IBV_ACCESS_REMOTE_READ`: incoming RDMA READ.
        const REMOTE_READ = 1 << 2;
        /// `IBV_ACCESS_REMOTE_ATOMIC`: incoming atomics.
        const REMOTE_ATOMIC = 1 << 3;
        /// `IBV_ACCESS_MW_BIND`: memory windows may be bound to the region.
        const MW_BIND = 1 << 4;
    }
}

/// A path MTU (IBTA Vol. 1 §9.7.7 / `enum ibv_mtu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Mtu {
    /// 256 bytes; the default (what rxe gives a new QP).
    #[default]
    M256,
    /// 512 bytes.
    M512,
    /// 1024 bytes.
    M1024,
    /// 2048 bytes.
    M2048,
    /// 4096 bytes.
    M4096,
}

impl Mtu {
    /// Every MTU, ascending.
    pub const ALL: [Mtu; 5] = [Mtu::M256, Mtu::M512, Mtu::M1024, Mtu::M2048, Mtu::M4096];

    /// The payload size in bytes.
    pub const fn bytes(self) -> u32 {
        match self {
            Mtu::M256 => 256,
            Mtu::M512 => 512,
            Mtu::M1024 => 1024,
            Mtu::M2048 => 2048,
            Mtu::M4096 => 4096,
        }
    }

    /// The MTU of exactly `bytes` bytes, if it is one of the five IB MTUs.
    pub const fn from_bytes(bytes: u32) -> Option<Mtu> {
        match bytes {
            256 => Some(Mtu::M256),
            512 => Some(Mtu::M512),
            1024 => Some(Mtu::M1024),
            2048 => Some(Mtu::M2048),
            4096 => Some(Mtu::M4096),
            _ => None,
        }
    }

    /// The `enum ibv_mtu` value (`IBV_MTU_256` = 1 … `IBV_MTU_4096` = 5).
    pub const fn to_ibv(self) -> u32 {
        match self {
            Mtu::M256 => 1,
            Mtu::M512 => 2,
            Mtu::M1024 => 3,
            Mtu::M2048 => 4,
            Mtu::M4096 => 5,
        }
    }

    /// The MTU for an `enum ibv_mtu` value.
    pub const fn from_ibv(v: u32) -> Option<Mtu> {
        match v {
            1 => Some(Mtu::M256),
            2 => Some(Mtu::M512),
            3 => Some(Mtu::M1024),
            4 => Some(Mtu::M2048),
            5 => Some(Mtu::M4096),
            _ => None,
        }
    }
}

impl fmt::Display for Mtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

/// The primary path of a RoCE v2 QP (the parts of `struct ibv_ah_attr` that RoCE uses; the GRH
/// is mandatory on RoCE, so its fields sit here directly).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AddressVector {
    /// Destination GID (an IPv4-mapped or IPv6 address for RoCE v2).
    pub dgid: [u8; 16],
    /// Index of the local GID to send from.
    pub sgid_index: u8,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
    /// IP traffic class (DSCP and ECN).
    pub traffic_class: u8,
    /// IPv6 flow label, 20 bits.
    pub flow_label: u32,
    /// Destination MAC, if already resolved (the kernel resolves it from the GID on modify).
    pub dmac: Option<[u8; 6]>,
}

/// Queue sizes (`struct ibv_qp_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct QpCap {
    /// Send queue depth in work requests.
    pub max_send_wr: u32,
    /// Receive queue depth in work requests.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send WR.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive WR.
    pub max_recv_sge: u32,
    /// Largest inline send, in bytes.
    pub max_inline_data: u32,
}

/// The attribute values of a modify request (the subset of `struct ibv_qp_attr` that ferroce
/// uses). Only the fields whose bit is in the accompanying [`QpAttrMask`] are meaningful.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct QpAttr {
    /// [`QpAttrMask::STATE`]: the state to move to.
    pub qp_state: QpState,
    /// [`QpAttrMask::CUR_STATE`]: the state the consumer believes the QP is in.
    pub cur_qp_state: QpState,
    /// [`QpAttrMask::PATH_MTU`].
    pub path_mtu: Mtu,
    /// [`QpAttrMask::ACCESS_FLAGS`].
    pub qp_access_flags: AccessFlags,
    /// [`QpAttrMask::PKEY_INDEX`].
    pub pkey_index: u16,
    /// [`QpAttrMask::PORT`]: 1-based, as in verbs.
    pub port_num: u8,
    /// [`QpAttrMask::QKEY`].
    pub qkey: u32,
    /// [`QpAttrMask::AV`].
    pub ah_attr: AddressVector,
    /// [`QpAttrMask::DEST_QPN`]: 24 bits.
    pub dest_qp_num: u32,
    /// [`QpAttrMask::RQ_PSN`]: 24 bits.
    pub rq_psn: u32,
    /// [`QpAttrMask::SQ_PSN`]: 24 bits.
    pub sq_psn: u32,
    /// [`QpAttrMask::TIMEOUT`]: 5 bits; 0 means infinite, otherwise 4.096 µs × 2^timeout.
    pub timeout: u8,
    /// [`QpAttrMask::RETRY_CNT`]: 3 bits.
    pub retry_cnt: u8,
    /// [`QpAttrMask::RNR_RETRY`]: 3 bits; 7 means retry forever.
    pub rnr_retry: u8,
    /// [`QpAttrMask::MIN_RNR_TIMER`]: 5-bit code of IBTA Table 45 (AETH RNR timer).
    pub min_rnr_timer: u8,
    /// [`QpAttrMask::MAX_QP_RD_ATOMIC`].
    pub max_rd_atomic: u8,
    /// [`QpAttrMask::MAX_DEST_RD_ATOMIC`].
    pub max_dest_rd_atomic: u8,
    /// [`QpAttrMask::EN_SQD_ASYNC_NOTIFY`].
    pub en_sqd_async_notify: bool,
    /// [`QpAttrMask::CAP`].
    pub cap: QpCap,
}

impl QpAttr {
    /// Take the fields named in `mask` from `from` (what a modify request changes; the state
    /// bits and `cap` are the QP's business, not copied here).
    pub(crate) fn apply(&mut self, from: &QpAttr, mask: QpAttrMask) {
        macro_rules! set { ($($bit:ident => $f:ident),*) => { $( if mask.contains(QpAttrMask::$bit) { self.$f = from.$f; } )* } }
        set!(ACCESS_FLAGS => qp_access_flags, PKEY_INDEX => pkey_index, PORT => port_num, QKEY => qkey,
             AV => ah_attr, PATH_MTU => path_mtu, TIMEOUT => timeout, RETRY_CNT => retry_cnt,
             RNR_RETRY => rnr_retry, RQ_PSN => rq_psn, MAX_QP_RD_ATOMIC => max_rd_atomic,
             MIN_RNR_TIMER => min_rnr_timer, SQ_PSN => sq_psn, MAX_DEST_RD_ATOMIC => max_dest_rd_atomic,
             DEST_QPN => dest_qp_num, EN_SQD_ASYNC_NOTIFY => en_sqd_async_notify);
    }
}

/// Why a modify request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ModifyQpError {
    /// The state machine has no edge `from → to` (IBTA Vol. 1 §10.3.1).
    #[error("illegal {qp_type} QP state transition {from} -> {to}")]
    IllegalTransition {
        /// The QP's type.
        qp_type: QpType,
        /// Its state.
        from: QpState,
        /// The state asked for.
        to: QpState,
    },
    /// A required attribute of the transition is not in the mask (IBTA Vol. 1 §11.2.5.2).
    #[error("{qp_type} QP {from} -> {to}: missing required attributes {missing}")]
    MissingAttributes {
        /// The QP's type.
        qp_type: QpType,
        /// Its state.
        from: QpState,
        /// The state asked for.
        to: QpState,
        /// Every required attribute not in the mask.
        missing: QpAttrMask,
    },
    /// The mask carries attributes the transition neither requires nor accepts.
    #[error("{qp_type} QP {from} -> {to}: attributes not allowed in this transition: {extra}")]
    UnexpectedAttributes {
        /// The QP's type.
        qp_type: QpType,
        /// Its state.
        from: QpState,
        /// The state asked for.
        to: QpState,
        /// Every attribute in the mask the transition does not take.
        extra: QpAttrMask,
    },
    /// An attribute in the mask has a value outside its range.
    #[error("QP attribute {attr} = {value} is out of range")]
    InvalidValue {
        /// The field (`"retry_cnt"`, ...).
        attr: &'static str,
        /// Its value.
        value: u64,
    },
    /// [`QpAttrMask::CUR_STATE`] names a state the QP is not in.
    #[error("cur_qp_state {claimed} does not match the QP's state {actual}")]
    CurStateMismatch {
        /// The state the request names.
        claimed: QpState,
        /// The QP's state.
        actual: QpState,
    },
    /// [`QpAttrMask::ALT_PATH`] on RoCE: automatic path migration exists only on InfiniBand.
    #[error("alternate path (IBV_QP_ALT_PATH) is not supported on RoCE")]
    AltPathUnsupported,
}

/// Required and optional attributes of one legal transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rule {
    required: QpAttrMask,
    optional: QpAttrMask,
}

impl Rule {
    const fn new(required: QpAttrMask, optional: QpAttrMask) -> Rule {
        Rule { required, optional }
    }
}

/// The transition table: `None` if `cur → next` is illegal.
///
/// Per IBTA Vol. 1 §11.2.5.2 and `ibv_modify_qp(3)`, restricted to RC, UC, UD and XRC. XRC's
/// halves follow RC's rows (as Linux's table does) but for what each half lacks: the
/// initiator has no responder (no `MAX_DEST_RD_ATOMIC` or `MIN_RNR_TIMER` anywhere), the
/// target no requester (RTR → RTS requires only `TIMEOUT` and `SQ_PSN`, and takes no retry
/// counts or `MAX_QP_RD_ATOMIC`).
fn rule(qp_type: QpType, cur: QpState, next: QpState) -> Option<Rule> {
    use QpAttrMask as M;
    use QpState as S;
    use QpType as T;
    match qp_type {
        T::XrcSend => {
            let r = rule(T::Rc, cur, next)?;
            let responder = M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
            return Some(Rule::new(
                r.required.difference(responder),
                r.optional.difference(responder),
            ));
        }
        T::XrcRecv => {
            let r = rule(T::Rc, cur, next)?;
            let requester = M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
            return Some(if (cur, next) == (S::Rtr, S::Rts) {
                Rule::new(M::TIMEOUT | M::SQ_PSN, r.optional.difference(requester))
            } else {
                Rule::new(
                    r.required.difference(requester),
                    r.optional.difference(requester),
                )
            });
        }
        T::Rc | T::Uc | T::Ud => {}
    }

    let none = M::empty();
    // Attributes that may be changed on an operational connected QP (RTS → RTS, SQD → RTS,
    // RTR → RTS optionals). RC adds the responder's RNR timer.
    let connected_live = M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE;
    let r = match (cur, next) {
        // Any state may be reset; every state but RESET may be moved to ERR.
        (_, S::Reset) => Rule::new(none, none),
        (S::Reset, S::Err) => return None,
        (_, S::Err) => Rule::new(none, none),

        (S::Reset, S::Init) => match qp_type {
            T::Rc | T::Uc => Rule::new(M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none),
            _ /* UD */ => Rule::new(M::PKEY_INDEX | M::PORT | M::QKEY, none),
        },
        (S::Init, S::Init) => match qp_type {
            T::Rc | T::Uc => Rule::new(none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
            _ /* UD */ => Rule::new(none, M::PKEY_INDEX | M::PORT | M::QKEY),
        },
        (S::Init, S::Rtr) => {
            let path = M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
            let opt = M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX;
            match qp_type {
                T::Rc => Rule::new(path | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER, opt),
                T::Uc => Rule::new(path, opt),
                _ /* UD */ => Rule::new(none, M::PKEY_INDEX | M::QKEY),
            }
        }
        (S::Rtr, S::Rts) => match qp_type {
            T::Rc => Rule::new(
                M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
                connected_live | M::MIN_RNR_TIMER,
            ),
            T::Uc => Rule::new(M::SQ_PSN, connected_live),
            _ /* UD */ => Rule::new(M::SQ_PSN, M::CUR_STATE | M::QKEY),
        },
        (S::Rts, S::Rts) | (S::Sqd, S::Rts) => match qp_type {
            T::Rc => Rule::new(none, connected_live | M::MIN_RNR_TIMER),
            T::Uc => Rule::new(none, connected_live),
            _ /* UD */ => Rule::new(none, M::CUR_STATE | M::QKEY),
        },
        (S::Rts, S::Sqd) => Rule::new(none, M::EN_SQD_ASYNC_NOTIFY),
        // While drained, the path and the RC timers/limits may be changed.
        (S::Sqd, S::Sqd) => match qp_type {
            T::Rc => Rule::new(
                none,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::MAX_DEST_RD_ATOMIC
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE,
            ),
            T::Uc => Rule::new(
                none,
                M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
            ),
            _ /* UD */ => Rule::new(none, M::PKEY_INDEX | M::QKEY),
        },
        // Recovery from a send queue error. RC never enters SQE (IBTA), and the verbs table
        // gives RC no attributes here.
        (S::Sqe, S::Rts) => match qp_type {
            T::Rc => Rule::new(none, none),
            T::Uc => Rule::new(none, M::CUR_STATE | M::ACCESS_FLAGS),
            _ /* UD */ => Rule::new(none, M::CUR_STATE | M::QKEY),
        },
        _ => return None,
    };
    Some(r)
}

/// Whether `cur → next` is a legal transition for `qp_type` (IBTA Vol. 1 §10.3.1).
pub fn is_legal(qp_type: QpType, cur: QpState, next: QpState) -> bool {
    rule(qp_type, cur, next).is_some()
}

/// The attributes `cur → next` requires (besides [`QpAttrMask::STATE`] itself), or `None` if
/// the transition is illegal.
pub fn required(qp_type: QpType, cur: QpState, next: QpState) -> Option<QpAttrMask> {
    rule(qp_type, cur, next).map(|r| r.required)
}

/// The attributes `cur → next` accepts but does not require, or `None` if the transition is
/// illegal.
pub fn optional(qp_type: QpType, cur: QpState, next: QpState) -> Option<QpAttrMask> {
    rule(qp_type, cur, next).map(|r| r.optional)
}

/// Checks a modify request against the transition table, as `ibv_modify_qp` does
/// (IBTA Vol. 1 §10.3.1, §11.2.5.2).
///
/// `cur` is the QP's current state. `next` is the requested state and is used only if `mask`
/// contains [`QpAttrMask::STATE`]; without it the request is the transition `cur → cur`
/// (`attr.qp_state` is ignored by verbs in that case too).
///
/// Checks in order: the transition is legal ([`ModifyQpError::IllegalTransition`]), every
/// required attribute is present ([`ModifyQpError::MissingAttributes`], naming all missing
/// bits), and no attribute outside required ∪ optional ∪ {STATE} is present
/// ([`ModifyQpError::UnexpectedAttributes`], naming all extra bits, unknown bits included).
pub fn check_modify(
    qp_type: QpType,
    cur: QpState,
    next: QpState,
    mask: QpAttrMask,
) -> Result<(), ModifyQpError> {
    let to = if mask.contains(QpAttrMask::STATE) {
        next
    } else {
        cur
    };
    let Some(r) = rule(qp_type, cur, to) else {
        return Err(ModifyQpError::IllegalTransition {
            qp_type,
            from: cur,
            to,
        });
    };
    let missing = r.required.difference(mask);
    if !missing.is_empty() {
        return Err(ModifyQpError::MissingAttributes {
            qp_type,
            from: cur,
            to,
            missing,
        });
    }
    let extra = mask.difference(r.required | r.optional | QpAttrMask::STATE);
    if !extra.is_empty() {
        return Err(ModifyQpError::UnexpectedAttributes {
            qp_type,
            from: cur,
            to,
            extra,
        });
    }
    Ok(())
}

const MAX_24: u32 = (1 << 24) - 1;
const MAX_20: u32 = (1 << 20) - 1;

/// Checks the ranges of the attribute values selected by `mask` (the fields whose bit is not
/// in `mask` are ignored):
///
/// | bit | field | range |
/// |-----|-------|-------|
/// | `PORT` | `port_num` | 1 ..= 255 (verbs ports are 1-based) |
/// | `AV` | `ah_attr.flow_label` | < 2^20 (IPv6 flow label) |
/// | `TIMEOUT` | `timeout` | ≤ 31 (5 bits) |
/// | `RETRY_CNT` | `retry_cnt` | ≤ 7 (3 bits) |
/// | `RNR_RETRY` | `rnr_retry` | ≤ 7 (3 bits) |
/// | `RQ_PSN` | `rq_psn` | < 2^24 |
/// | `MIN_RNR_TIMER` | `min_rnr_timer` | ≤ 31 (5 bits) |
/// | `SQ_PSN` | `sq_psn` | < 2^24 |
/// | `DEST_QPN` | `dest_qp_num` | < 2^24 |
///
/// The widths are those of the IBTA Vol. 1 §11.2.5.2 modifiers and of the wire fields they end
/// up in (BTH PSN and DestQP, AETH timer). The kernel silently masks over-wide PSNs to 24 bits;
/// ferroce refuses them instead. The first offending field in bit order is reported.
pub fn validate_values(attr: &QpAttr, mask: QpAttrMask) -> Result<(), ModifyQpError> {
    use QpAttrMask as M;
    let max_24 = u64::from(MAX_24);
    // (bit, field, value, smallest valid, largest valid), in bit order.
    let checks: [(M, &'static str, u64, u64, u64); 9] = [
        (M::PORT, "port_num", attr.port_num.into(), 1, 255),
        (
            M::AV,
            "ah_attr.flow_label",
            attr.ah_attr.flow_label.into(),
            0,
            MAX_20.into(),
        ),
        (M::TIMEOUT, "timeout", attr.timeout.into(), 0, 31),
        (M::RETRY_CNT, "retry_cnt", attr.retry_cnt.into(), 0, 7),
        (M::RNR_RETRY, "rnr_retry", attr.rnr_retry.into(), 0, 7),
        (M::RQ_PSN, "rq_psn", attr.rq_psn.into(), 0, max_24),
        (
            M::MIN_RNR_TIMER,
            "min_rnr_timer",
            attr.min_rnr_timer.into(),
            0,
            31,
        ),
        (M::SQ_PSN, "sq_psn", attr.sq_psn.into(), 0, max_24),
        (
            M::DEST_QPN,
            "dest_qp_num",
            attr.dest_qp_num.into(),
            0,
            max_24,
        ),
    ];
    for (bit, name, value, lo, hi) in checks {
        if mask.contains(bit) && !(lo..=hi).contains(&value) {
            return Err(ModifyQpError::InvalidValue { attr: name, value });
        }
    }
    Ok(())
}

/// The whole check of a modify request on a RoCE QP whose actual state is `actual`; returns
/// the state the QP moves to.
///
/// 1. If the mask has [`QpAttrMask::CUR_STATE`], `attr.cur_qp_state` must equal `actual`
///    ([`ModifyQpError::CurStateMismatch`]). The kernel instead trusts the claim and checks the
///    table from the claimed state; a software NIC knows its state, so a wrong claim is an error.
/// 2. The target is `attr.qp_state` if the mask has [`QpAttrMask::STATE`], else `actual`.
/// 3. [`check_modify`].
/// 4. [`QpAttrMask::ALT_PATH`] is refused ([`ModifyQpError::AltPathUnsupported`]), as the kernel
///    does for RoCE ports: the table accepts it, the transport cannot do it.
/// 5. [`validate_values`].
pub fn check_modify_qp(
    qp_type: QpType,
    actual: QpState,
    attr: &QpAttr,
    mask: QpAttrMask,
) -> Result<QpState, ModifyQpError> {
    if mask.contains(QpAttrMask::CUR_STATE) && attr.cur_qp_state != actual {
        return Err(ModifyQpError::CurStateMismatch {
            claimed: attr.cur_qp_state,
            actual,
        });
    }
    let next = if mask.contains(QpAttrMask::STATE) {
        attr.qp_state
    } else {
        actual
    };
    check_modify(qp_type, actual, next, mask)?;
    if mask.contains(QpAttrMask::ALT_PATH) {
        return Err(ModifyQpError::AltPathUnsupported);
    }
    validate_values(attr, mask)?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpAttrMask as M;
    use QpState as S;

    /// One row of an expected table: (from, to, required, optional).
    type Row = (S, S, M, M);

    const E: M = M::empty();

    /// Every attribute bit verbs defines, written out from `<infiniband/verbs.h>`.
    const IBV_BITS: [(M, u32); 22] = [
        (M::STATE, 1 << 0),
        (M::CUR_STATE, 1 << 1),
        (M::EN_SQD_ASYNC_NOTIFY, 1 << 2),
        (M::ACCESS_FLAGS, 1 << 3),
        (M::PKEY_INDEX, 1 << 4),
        (M::PORT, 1 << 5),
        (M::QKEY, 1 << 6),
        (M::AV, 1 << 7),
        (M::PATH_MTU, 1 << 8),
        (M::TIMEOUT, 1 << 9),
        (M::RETRY_CNT, 1 << 10),
        (M::RNR_RETRY, 1 << 11),
        (M::RQ_PSN, 1 << 12),
        (M::MAX_QP_RD_ATOMIC, 1 << 13),
        (M::ALT_PATH, 1 << 14),
        (M::MIN_RNR_TIMER, 1 << 15),
        (M::SQ_PSN, 1 << 16),
        (M::MAX_DEST_RD_ATOMIC, 1 << 17),
        (M::PATH_MIG_STATE, 1 << 18),
        (M::CAP, 1 << 19),
        (M::DEST_QPN, 1 << 20),
        (M::RATE_LIMIT, 1 << 25),
    ];

    /// RC, written from ibv_modify_qp(3) (the RESET → INIT → RTR → RTS minimum lists) and the
    /// IBTA Modify QP / kernel transition table for the rest. Every pair not listed is illegal.
    fn rc_table() -> Vec<Row> {
        let all_live = M::CUR_STATE
            .union(M::ALT_PATH)
            .union(M::ACCESS_FLAGS)
            .union(M::MIN_RNR_TIMER)
            .union(M::PATH_MIG_STATE);
        vec![
            (S::Reset, S::Reset, E, E),
            (
                S::Reset,
                S::Init,
                M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
                E,
            ),
            (S::Init, S::Reset, E, E),
            (
                S::Init,
                S::Init,
                E,
                M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
            ),
            (
                S::Init,
                S::Rtr,
                M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            (S::Init, S::Err, E, E),
            (S::Rtr, S::Reset, E, E),
            (
                S::Rtr,
                S::Rts,
                M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
                all_live,
            ),
            (S::Rtr, S::Err, E, E),
            (S::Rts, S::Reset, E, E),
            (S::Rts, S::Rts, E, all_live),
            (S::Rts, S::Sqd, E, M::EN_SQD_ASYNC_NOTIFY),
            (S::Rts, S::Err, E, E),
            (S::Sqd, S::Reset, E, E),
            (S::Sqd, S::Rts, E, all_live),
            (
                S::Sqd,
                S::Sqd,
                E,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::MAX_DEST_RD_ATOMIC
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE,
            ),
            (S::Sqd, S::Err, E, E),
            (S::Sqe, S::Reset, E, E),
            (S::Sqe, S::Rts, E, E),
            (S::Sqe, S::Err, E, E),
            (S::Err, S::Reset, E, E),
            (S::Err, S::Err, E, E),
        ]
    }

    fn uc_table() -> Vec<Row> {
        let live = M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE;
        vec![
            (S::Reset, S::Reset, E, E),
            (
                S::Reset,
                S::Init,
                M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
                E,
            ),
            (S::Init, S::Reset, E, E),
            (
                S::Init,
                S::Init,
                E,
                M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
            ),
            (
                S::Init,
                S::Rtr,
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            (S::Init, S::Err, E, E),
            (S::Rtr, S::Reset, E, E),
            (S::Rtr, S::Rts, M::SQ_PSN, live),
            (S::Rtr, S::Err, E, E),
            (S::Rts, S::Reset, E, E),
            (S::Rts, S::Rts, E, live),
            (S::Rts, S::Sqd, E, M::EN_SQD_ASYNC_NOTIFY),
            (S::Rts, S::Err, E, E),
            (S::Sqd, S::Reset, E, E),
            (S::Sqd, S::Rts, E, live),
            (
                S::Sqd,
                S::Sqd,
                E,
                M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
            ),
            (S::Sqd, S::Err, E, E),
            (S::Sqe, S::Reset, E, E),
            (S::Sqe, S::Rts, E, M::CUR_STATE | M::ACCESS_FLAGS),
            (S::Sqe, S::Err, E, E),
            (S::Err, S::Reset, E, E),
            (S::Err, S::Err, E, E),
        ]
    }

    fn ud_table() -> Vec<Row> {
        let live = M::CUR_STATE | M::QKEY;
        vec![
            (S::Reset, S::Reset, E, E),
            (S::Reset, S::Init, M::PKEY_INDEX | M::PORT | M::QKEY, E),
            (S::Init, S::Reset, E, E),
            (S::Init, S::Init, E, M::PKEY_INDEX | M::PORT | M::QKEY),
            (S::Init, S::Rtr, E, M::PKEY_INDEX | M::QKEY),
            (S::Init, S::Err, E, E),
            (S::Rtr, S::Reset, E, E),
            (S::Rtr, S::Rts, M::SQ_PSN, live),
            (S::Rtr, S::Err, E, E),
            (S::Rts, S::Reset, E, E),
            (S::Rts, S::Rts, E, live),
            (S::Rts, S::Sqd, E, M::EN_SQD_ASYNC_NOTIFY),
            (S::Rts, S::Err, E, E),
            (S::Sqd, S::Reset, E, E),
            (S::Sqd, S::Rts, E, live),
            (S::Sqd, S::Sqd, E, M::PKEY_INDEX | M::QKEY),
            (S::Sqd, S::Err, E, E),
            (S::Sqe, S::Reset, E, E),
            (S::Sqe, S::Rts, E, live),
            (S::Sqe, S::Err, E, E),
            (S::Err, S::Reset, E, E),
            (S::Err, S::Err, E, E),
        ]
    }

    fn bits(m: M) -> impl Iterator<Item = M> {
        IBV_BITS
            .iter()
            .map(|&(b, _)| b)
            .filter(move |b| m.contains(*b))
    }

    /// Drives one QP type through all 7 × 7 pairs against its literal table.
    fn check_table(t: QpType, table: &[Row]) {
        let mut legal_count = 0;
        for from in QpState::ALL {
            for to in QpState::ALL {
                let row = table.iter().find(|r| r.0 == from && r.1 == to);
                let ctx = format!("{t} {from} -> {to}");
                let Some(&(_, _, req, opt)) = row else {
                    assert!(!is_legal(t, from, to), "{ctx} must be illegal");
                    assert_eq!(required(t, from, to), None, "{ctx}");
                    assert_eq!(optional(t, from, to), None, "{ctx}");
                    let illegal = Err(ModifyQpError::IllegalTransition {
                        qp_type: t,
                        from,
                        to,
                    });
                    assert_eq!(check_modify(t, from, to, M::STATE), illegal, "{ctx}");
                    assert_eq!(check_modify(t, from, to, M::all()), illegal, "{ctx}");
                    if from == to {
                        // Attribute-only modify in a state that allows none.
                        assert_eq!(check_modify(t, from, S::Init, E), illegal, "{ctx}");
                    }
                    continue;
                };
                legal_count += 1;
                assert!(is_legal(t, from, to), "{ctx} must be legal");
                assert_eq!(required(t, from, to), Some(req), "{ctx} required");
                assert_eq!(optional(t, from, to), Some(opt), "{ctx} optional");

                let base = M::STATE | req;
                assert_eq!(check_modify(t, from, to, base), Ok(()), "{ctx} exact");
                assert_eq!(
                    check_modify(t, from, to, base | opt),
                    Ok(()),
                    "{ctx} all optional"
                );
                for b in bits(req) {
                    assert_eq!(
                        check_modify(t, from, to, base - b),
                        Err(ModifyQpError::MissingAttributes {
                            qp_type: t,
                            from,
                            to,
                            missing: b
                        }),
                        "{ctx} without {b}"
                    );
                }
                for b in bits(M::all()) {
                    let mask = base | b;
                    if (req | opt | M::STATE).contains(b) {
                        assert_eq!(check_modify(t, from, to, mask), Ok(()), "{ctx} + {b}");
                    } else {
                        assert_eq!(
                            check_modify(t, from, to, mask),
                            Err(ModifyQpError::UnexpectedAttributes {
                                qp_type: t,
                                from,
                                to,
                                extra: b
                            }),
                            "{ctx} + {b}"
                        );
                    }
                }
                // The undefined bits 21..=24 and 26..=31 are never accepted.
                for shift in (21..=24).chain(26..32) {
                    let b = M::from_bits_retain(1 << shift);
                    assert_eq!(
                        check_modify(t, from, to, base | b),
                        Err(ModifyQpError::UnexpectedAttributes {
                            qp_type: t,
                            from,
                            to,
                            extra: b
                        }),
                        "{ctx} + bit {shift}"
                    );
                }
                if from == to {
                    // Without STATE the request is `from -> from`; `next` is ignored.
                    for ignored in QpState::ALL {
                        assert_eq!(check_modify(t, from, ignored, req | opt), Ok(()), "{ctx}");
                    }
                }
            }
        }
        assert_eq!(legal_count, table.len(), "{t}: table has duplicate rows");
    }

    #[test]
    fn state_rc_table_all_pairs() {
        let table = rc_table();
        assert_eq!(table.len(), 22);
        check_table(QpType::Rc, &table);
    }

    #[test]
    fn state_uc_table_all_pairs() {
        check_table(QpType::Uc, &uc_table());
    }

    #[test]
    fn state_ud_table_all_pairs() {
        check_table(QpType::Ud, &ud_table());
    }

    #[test]
    fn state_mask_bits_match_verbs_h() {
        for (flag, value) in IBV_BITS {
            assert_eq!(flag.bits(), value, "{flag}");
        }
        assert_eq!(
            M::all().bits(),
            IBV_BITS.iter().map(|&(_, v)| v).sum::<u32>()
        );
        assert_eq!(AccessFlags::LOCAL_WRITE.bits(), 1);
        assert_eq!(AccessFlags::REMOTE_WRITE.bits(), 2);
        assert_eq!(AccessFlags::REMOTE_READ.bits(), 4);
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 8);
    }

    #[test]
    fn state_rc_bring_up_sequence() {
        let t = QpType::Rc;
        check_modify(
            t,
            S::Reset,
            S::Init,
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
        )
        .unwrap();
        check_modify(
            t,
            S::Init,
            S::Rtr,
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
        )
        .unwrap();
        check_modify(
            t,
            S::Rtr,
            S::Rts,
            M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
        )
        .unwrap();
        // Forgetting two at once names both.
        assert_eq!(
            check_modify(
                t,
                S::Init,
                S::Rtr,
                M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN
            ),
            Err(ModifyQpError::MissingAttributes {
                qp_type: t,
                from: S::Init,
                to: S::Rtr,
                missing: M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
            })
        );
        // Skipping a state.
        assert!(matches!(
            check_modify(t, S::Init, S::Rts, M::all()),
            Err(ModifyQpError::IllegalTransition { .. })
        ));
        // Missing is reported before unexpected.
        assert!(matches!(
            check_modify(t, S::Reset, S::Init, M::STATE | M::QKEY),
            Err(ModifyQpError::MissingAttributes { .. })
        ));
    }

    #[test]
    fn state_ud_and_uc_differences() {
        assert_eq!(
            required(QpType::Ud, S::Reset, S::Init),
            Some(M::PKEY_INDEX | M::PORT | M::QKEY)
        );
        assert_eq!(
            check_modify(
                QpType::Ud,
                S::Reset,
                S::Init,
                M::STATE | M::PKEY_INDEX | M::PORT
            ),
            Err(ModifyQpError::MissingAttributes {
                qp_type: QpType::Ud,
                from: S::Reset,
                to: S::Init,
                missing: M::QKEY
            })
        );
        // UD has no access flags; RC has no Q_Key.
        assert!(check_modify(
            QpType::Ud,
            S::Reset,
            S::Init,
            M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY | M::ACCESS_FLAGS
        )
        .is_err());
        assert!(check_modify(
            QpType::Rc,
            S::Reset,
            S::Init,
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS | M::QKEY
        )
        .is_err());
        let uc_rtr = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
        check_modify(QpType::Uc, S::Init, S::Rtr, uc_rtr).unwrap();
        assert_eq!(
            check_modify(QpType::Uc, S::Init, S::Rtr, uc_rtr | M::MAX_DEST_RD_ATOMIC),
            Err(ModifyQpError::UnexpectedAttributes {
                qp_type: QpType::Uc,
                from: S::Init,
                to: S::Rtr,
                extra: M::MAX_DEST_RD_ATOMIC
            })
        );
        // UD needs nothing to reach RTR.
        check_modify(QpType::Ud, S::Init, S::Rtr, M::STATE).unwrap();
    }

    #[test]
    fn state_cur_state_only_where_listed() {
        let t = QpType::Rc;
        check_modify(t, S::Rts, S::Rts, M::STATE | M::CUR_STATE).unwrap();
        check_modify(t, S::Sqd, S::Rts, M::STATE | M::CUR_STATE).unwrap();
        for (from, to) in [
            (S::Reset, S::Init),
            (S::Init, S::Err),
            (S::Rts, S::Sqd),
            (S::Sqe, S::Rts),
            (S::Err, S::Reset),
        ] {
            let mask = M::STATE | required(t, from, to).unwrap() | M::CUR_STATE;
            assert!(
                matches!(
                    check_modify(t, from, to, mask),
                    Err(ModifyQpError::UnexpectedAttributes { extra, .. }) if extra == M::CUR_STATE
                ),
                "{from} -> {to}"
            );
        }
        check_modify(QpType::Uc, S::Sqe, S::Rts, M::STATE | M::CUR_STATE).unwrap();
    }

    #[test]
    fn state_reset_to_err_and_rtr_in_place_are_illegal() {
        for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
            assert_eq!(
                check_modify(t, S::Reset, S::Err, M::STATE),
                Err(ModifyQpError::IllegalTransition {
                    qp_type: t,
                    from: S::Reset,
                    to: S::Err
                })
            );
            assert_eq!(
                check_modify(t, S::Rtr, S::Rts, M::PATH_MTU),
                Err(ModifyQpError::IllegalTransition {
                    qp_type: t,
                    from: S::Rtr,
                    to: S::Rtr
                })
            );
        }
        // An empty mask in RESET or ERR is a no-op, and legal.
        check_modify(QpType::Rc, S::Reset, S::Rts, E).unwrap();
        check_modify(QpType::Rc, S::Err, S::Rts, E).unwrap();
    }

    fn valid_attr() -> QpAttr {
        QpAttr {
            port_num: 1,
            dest_qp_num: 0xff_ffff,
            rq_psn: 0xff_ffff,
            sq_psn: 0,
            timeout: 31,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 31,
            ah_attr: AddressVector {
                flow_label: 0xf_ffff,
                ..AddressVector::default()
            },
            ..QpAttr::default()
        }
    }

    #[test]
    fn state_value_ranges() {
        validate_values(&valid_attr(), M::all()).unwrap();

        type Case = (M, &'static str, u64, fn(&mut QpAttr));
        let cases: [Case; 9] = [
            (M::TIMEOUT, "timeout", 32, |a| a.timeout = 32),
            (M::RETRY_CNT, "retry_cnt", 8, |a| a.retry_cnt = 8),
            (M::RNR_RETRY, "rnr_retry", 8, |a| a.rnr_retry = 8),
            (M::MIN_RNR_TIMER, "min_rnr_timer", 32, |a| {
                a.min_rnr_timer = 32
            }),
            (M::DEST_QPN, "dest_qp_num", 1 << 24, |a| {
                a.dest_qp_num = 1 << 24
            }),
            (M::RQ_PSN, "rq_psn", 1 << 24, |a| a.rq_psn = 1 << 24),
            (M::SQ_PSN, "sq_psn", u64::from(u32::MAX), |a| {
                a.sq_psn = u32::MAX
            }),
            (M::PORT, "port_num", 0, |a| a.port_num = 0),
            (M::AV, "ah_attr.flow_label", 1 << 20, |a| {
                a.ah_attr.flow_label = 1 << 20
            }),
        ];
        for (bit, name, value, set) in cases {
            let mut a = valid_attr();
            set(&mut a);
            assert_eq!(
                validate_values(&a, bit),
                Err(ModifyQpError::InvalidValue { attr: name, value }),
                "{name}"
            );
            assert_eq!(
                validate_values(&a, M::all()),
                Err(ModifyQpError::InvalidValue { attr: name, value }),
                "{name} in full mask"
            );
            // Not in the mask: not looked at.
            validate_values(&a, M::all() - bit).unwrap();
        }
        // Fields with no mask bit set are never checked.
        let mut junk = valid_attr();
        junk.timeout = 200;
        junk.sq_psn = u32::MAX;
        validate_values(&junk, E).unwrap();
    }

    #[test]
    fn state_check_modify_qp_wrapper() {
        let t = QpType::Rc;
        let mut a = valid_attr();
        a.qp_state = S::Rts;
        let rts = M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY;
        let rts = rts | M::MAX_QP_RD_ATOMIC;
        assert_eq!(check_modify_qp(t, S::Rtr, &a, rts), Ok(S::Rts));

        a.cur_qp_state = S::Sqd;
        assert_eq!(
            check_modify_qp(t, S::Rtr, &a, rts | M::CUR_STATE),
            Err(ModifyQpError::CurStateMismatch {
                claimed: S::Sqd,
                actual: S::Rtr
            })
        );
        a.cur_qp_state = S::Rtr;
        assert_eq!(
            check_modify_qp(t, S::Rtr, &a, rts | M::CUR_STATE),
            Ok(S::Rts)
        );
        assert_eq!(
            check_modify_qp(t, S::Rtr, &a, rts | M::ALT_PATH),
            Err(ModifyQpError::AltPathUnsupported)
        );
        a.timeout = 40;
        assert_eq!(
            check_modify_qp(t, S::Rtr, &a, rts),
            Err(ModifyQpError::InvalidValue {
                attr: "timeout",
                value: 40
            })
        );
        // No STATE bit: attr.qp_state is ignored and the QP stays where it is.
        a.timeout = 14;
        a.qp_state = S::Reset;
        assert_eq!(check_modify_qp(t, S::Rts, &a, M::MIN_RNR_TIMER), Ok(S::Rts));
    }

    #[test]
    fn state_mtu_and_ibv_conversions() {
        for (m, b, ibv) in [
            (Mtu::M256, 256, 1),
            (Mtu::M512, 512, 2),
            (Mtu::M1024, 1024, 3),
            (Mtu::M2048, 2048, 4),
            (Mtu::M4096, 4096, 5),
        ] {
            assert_eq!(m.bytes(), b);
            assert_eq!(Mtu::from_bytes(b), Some(m));
            assert_eq!(m.to_ibv(), ibv);
            assert_eq!(Mtu::from_ibv(ibv), Some(m));
        }
        for bad in [0, 255, 1500, 9000] {
            assert_eq!(Mtu::from_bytes(bad), None);
        }
        assert_eq!(Mtu::from_ibv(0), None);
        assert_eq!(Mtu::from_ibv(6), None);
        for (i, s) in QpState::ALL.into_iter().enumerate() {
            let i = u32::try_from(i).unwrap();
            assert_eq!(s.to_ibv(), i);
            assert_eq!(QpState::from_ibv(i), Some(s));
        }
        assert_eq!(QpState::from_ibv(7), None); // IBV_QPS_UNKNOWN
    }

    #[test]
    fn state_display_and_messages() {
        let names: Vec<String> = QpState::ALL.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"]);
        assert_eq!(
            (M::AV | M::PATH_MTU).to_string(),
            "IBV_QP_AV|IBV_QP_PATH_MTU"
        );
        assert_eq!(E.to_string(), "0");
        assert_eq!(
            (M::STATE | M::from_bits_retain(1 << 21)).to_string(),
            "IBV_QP_STATE|0x200000"
        );
        let e = check_modify(QpType::Rc, S::Rtr, S::Init, M::STATE).unwrap_err();
        assert_eq!(e.to_string(), "illegal RC QP state transition RTR -> INIT");
        let e = check_modify(
            QpType::Rc,
            S::Reset,
            S::Init,
            M::STATE | M::PKEY_INDEX | M::PORT,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "RC QP RESET -> INIT: missing required attributes IBV_QP_ACCESS_FLAGS"
        );
        let e = check_modify(QpType::Rc, S::Rts, S::Sqd, M::STATE | M::QKEY | M::CAP).unwrap_err();
        assert_eq!(
            e.to_string(),
            "RC QP RTS -> SQD: attributes not allowed in this transition: \
             IBV_QP_QKEY|IBV_QP_CAP"
        );
        let e = ModifyQpError::InvalidValue {
            attr: "timeout",
            value: 32,
        };
        assert_eq!(e.to_string(), "QP attribute timeout = 32 is out of range");
    }

    #[test]
    fn state_dot_snapshot() {
        let expected = r#"digraph rc_qp_states {
    rankdir=LR;
    node [shape=box, fontname="monospace"];
    RESET -> RESET;
    RESET -> INIT [label="req: ACCESS_FLAGS|PKEY_INDEX|PORT"];
    INIT -> RESET;
    INIT -> INIT [label="opt: ACCESS_FLAGS|PKEY_INDEX|PORT"];
    INIT -> RTR [label="req: AV|PATH_MTU|RQ_PSN|MIN_RNR_TIMER|MAX_DEST_RD_ATOMIC|DEST_QPN\nopt: ACCESS_FLAGS|PKEY_INDEX|ALT_PATH"];
    INIT -> ERR;
    RTR -> RESET;
    RTR -> RTS [label="req: TIMEOUT|RETRY_CNT|RNR_RETRY|MAX_QP_RD_ATOMIC|SQ_PSN\nopt: CUR_STATE|ACCESS_FLAGS|ALT_PATH|MIN_RNR_TIMER|PATH_MIG_STATE"];
    RTR -> ERR;
    RTS -> RESET;
    RTS -> RTS [label="opt: CUR_STATE|ACCESS_FLAGS|ALT_PATH|MIN_RNR_TIMER|PATH_MIG_STATE"];
    RTS -> SQD [label="opt: EN_SQD_ASYNC_NOTIFY"];
    RTS -> ERR;
    SQD -> RESET;
    SQD -> RTS [label="opt: CUR_STATE|ACCESS_FLAGS|ALT_PATH|MIN_RNR_TIMER|PATH_MIG_STATE"];
    SQD -> SQD [label="opt: ACCESS_FLAGS|PKEY_INDEX|PORT|AV|TIMEOUT|RETRY_CNT|RNR_RETRY|MAX_QP_RD_ATOMIC|ALT_PATH|MIN_RNR_TIMER|MAX_DEST_RD_ATOMIC|PATH_MIG_STATE"];
    SQD -> ERR;
    SQE -> RESET;
    SQE -> RTS;
    SQE -> ERR;
    ERR -> RESET;
    ERR -> ERR;
}
"#;
        assert_eq!(QpState::dot(), expected);
    }
}
