//! Work requests, shaped like `struct ibv_send_wr` / `ibv_recv_wr`.

use super::ah::Ah;
use super::mr::{LKey, MwBindInfo, MwType};
use super::wc::WcOpcode;
use crate::wire::{QpNumber, RKey};
use bitflags::bitflags;

/// One scatter/gather entry: `length` bytes at virtual address `addr` of the MR named by `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// The virtual address of the first byte (inside the MR).
    pub addr: u64,
    /// Bytes.
    pub length: u32,
    /// The MR's local key.
    pub lkey: LKey,
}

bitflags! {
    /// `enum ibv_send_flags`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub struct SendFlags: u32 {
        /// Wait for all prior RDMA READ and ATOMIC operations to complete first.
        const FENCE = 1 << 0;
        /// Generate a completion (otherwise only on error, unless the QP signals all).
        const SIGNALED = 1 << 1;
        /// Set the solicited-event bit on the last packet.
        const SOLICITED = 1 << 2;
        /// Copy the data at post time; the buffers may be reused at once.
        const INLINE = 1 << 3;
    }
}

/// The operation of a send work request (`ibv_wr_opcode` plus its operands).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// SEND: the data lands in the peer's next receive WQE.
    Send,
    /// SEND with 32 bits of immediate data, delivered in the peer's receive completion.
    SendWithImm {
        /// The immediate data.
        imm: u32,
    },
    /// SEND that invalidates one of the peer's R_Keys (IBTA 10.6.7.2.1).
    SendWithInv {
        /// The R_Key the peer's responder invalidates.
        invalidate_rkey: RKey,
    },
    /// RDMA WRITE into the peer's memory.
    RdmaWrite {
        /// The first byte written, in the peer's MR.
        remote_addr: u64,
        /// The peer MR's remote key.
        rkey: RKey,
    },
    /// RDMA WRITE with immediate data (consumes a receive WQE at the peer).
    RdmaWriteWithImm {
        /// The first byte written, in the peer's MR.
        remote_addr: u64,
        /// The peer MR's remote key.
        rkey: RKey,
        /// The immediate data.
        imm: u32,
    },
    /// RDMA READ from the peer's memory into the scatter/gather list.
    RdmaRead {
        /// The first byte read, in the peer's MR.
        remote_addr: u64,
        /// The peer MR's remote key.
        rkey: RKey,
    },
    /// 64-bit compare and swap at an 8-byte aligned remote address; the original value lands
    /// in the (8-byte) local buffer.
    AtomicCmpSwp {
        /// The 8-byte aligned target in the peer's MR.
        remote_addr: u64,
        /// The peer MR's remote key.
        rkey: RKey,
        /// The value the target is compared with.
        compare: u64,
        /// The value written if they are equal.
        swap: u64,
    },
    /// RDMA ATOMIC WRITE (IBTA Vol. 1 1.5, `IBV_WR_ATOMIC_WRITE`): `value` stored at an 8-byte
    /// aligned remote address as one 8-byte write that no reader sees half done; RC only,
    /// no scatter/gather list (the value is taken when the request is posted, as
    /// libibverbs' `ibv_wr_atomic_write` copies it). The peer needs remote write access.
    AtomicWrite {
        /// The 8-byte aligned target in the peer's MR.
        remote_addr: u64,
        /// The peer MR's remote key.
        rkey: RKey,
        /// The bytes stored, in memory order.
        value: [u8; 8],
    },
    /// 64-bit fetch and add.
    AtomicFetchAdd {
        /// The 8-byte aligned target in the peer's MR.
        remote_addr: u64,
        /// The peer MR's remote key.
        rkey: RKey,
        /// What is added (modulo 2^64).
        add: u64,
    },
    /// Bind a memory window (`IBV_WR_BIND_MW`, and the request `ibv_bind_mw` posts for a
    /// type 1 window): executed in send-queue order, once every request before it has
    /// completed; no packet. A failure completes `MwBindErr` and moves the QP to the error
    /// state.
    BindMw {
        /// The window, by the index of its R_Keys (`rkey >> 8`).
        mw: u32,
        /// Its type (a type 2 window is bound only by a work request).
        kind: MwType,
        /// The R_Key the window has once bound (its index the window's).
        rkey: RKey,
        /// What it is bound to.
        info: MwBindInfo,
    },
    /// Invalidate a type 2 memory window's R_Key (`IBV_WR_LOCAL_INV`), in send-queue order.
    LocalInv {
        /// The R_Key.
        rkey: RKey,
    },
}

impl SendOp {
    /// RDMA READ.
    pub fn is_read(&self) -> bool {
        matches!(self, SendOp::RdmaRead { .. })
    }
    /// Compare-and-swap or fetch-and-add.
    pub fn is_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::AtomicCmpSwp { .. } | SendOp::AtomicFetchAdd { .. }
        )
    }
    /// READ and ATOMIC: the requester waits for response data, limited by max_rd_atomic.
    pub fn is_rd_atomic(&self) -> bool {
        self.is_read() || self.is_atomic()
    }
    /// A memory operation of the local device (bind, local invalidate): no packet.
    pub fn is_local(&self) -> bool {
        matches!(self, SendOp::BindMw { .. } | SendOp::LocalInv { .. })
    }
    /// A SEND of any kind.
    pub fn is_send(&self) -> bool {
        matches!(
            self,
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }
        )
    }
    /// An RDMA WRITE of any kind.
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. }
        )
    }
    /// The opcode of this operation's send completion.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => {
                WcOpcode::Send
            }
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::AtomicCmpSwp { .. } => WcOpcode::CompSwap,
            SendOp::AtomicFetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::AtomicWrite { .. } => WcOpcode::AtomicWrite,
            SendOp::BindMw { .. } => WcOpcode::BindMw,
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
        }
    }
}

impl SendOp {
    /// Whether a QP of type `t` carries this operation: RC and an XRC initiator all of them
    /// (an XRC target has no send queue); UC SEND and RDMA WRITE
    /// (with immediate; no invalidate, READ or atomics) and the memory window operations;
    /// UD SEND and SEND with immediate
    /// (IBTA Vol. 1 §3.6.1, the operations of each service; `ibv_post_send` refuses the others
    /// with EINVAL).
    pub fn allowed_on(&self, t: super::attr::QpType) -> bool {
        use super::attr::QpType;
        match t {
            QpType::Rc => true,
            // XRC has no ATOMIC WRITE opcode.
            QpType::XrcSend => !matches!(self, SendOp::AtomicWrite { .. }),
            QpType::XrcRecv => false,
            QpType::Uc => matches!(
                self,
                SendOp::Send
                    | SendOp::SendWithImm { .. }
                    | SendOp::RdmaWrite { .. }
                    | SendOp::RdmaWriteWithImm { .. }
                    | SendOp::BindMw { .. }
                    | SendOp::LocalInv { .. }
            ),
            QpType::Ud => matches!(self, SendOp::Send | SendOp::SendWithImm { .. }),
        }
    }
}

/// A scatter/gather list: one entry inline (no allocation per work request, the common case
/// and what perftest posts), more on the heap. It reads as a `[Sge]`.
///
/// ```
/// use ferroce::verbs::{LKey, SgList, Sge};
/// let a = Sge { addr: 0x1000, length: 64, lkey: LKey(1) };
/// let one: SgList = a.into();
/// let two = SgList::from_slice(&[a, a]);
/// let from_vec: SgList = vec![a, a, a].into();
/// assert_eq!((one.len(), two.len(), from_vec.len()), (1, 2, 3));
/// assert!(!one.spilled() && two.spilled());
/// ```
pub type SgList = smallvec::SmallVec<[Sge; 1]>;

impl From<Sge> for SgList {
    fn from(sge: Sge) -> SgList {
        smallvec::smallvec![sge]
    }
}

/// A send work request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// The application's identifier, returned in the completion.
    pub wr_id: u64,
    /// The operation and its operands.
    pub op: SendOp,
    /// The local memory: the data sent (SEND, WRITE), or where it lands (READ, an atomic's
    /// original value: one 8-byte entry).
    pub sg_list: SgList,
    /// `IBV_SEND_*` flags.
    pub flags: SendFlags,
    /// UD QPs: where the message goes (`wr.ud`); ignored by connected QPs.
    pub ud: Option<UdDest>,
    /// XRC initiator QPs: the XRC SRQ at the target that receives the message
    /// (`wr.qp_type.xrc.remote_srqn`, carried in every request packet's XRCETH); ignored by
    /// other QPs.
    pub xrc_srqn: u32,
}

/// The destination of a UD send (`wr.ud` of `struct ibv_send_wr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdDest {
    /// The address handle: the path to the destination port.
    pub ah: Ah,
    /// The destination QP.
    pub remote_qpn: QpNumber,
    /// The Q_Key the message carries. One with the most significant bit set (a controlled
    /// Q_Key) is not sent: the sending QP's own Q_Key is (IBTA Vol. 1 §10.2.4, C10-15).
    pub remote_qkey: u32,
}

impl SendWr {
    /// A signaled request.
    pub fn new(wr_id: u64, op: SendOp, sg_list: impl Into<SgList>) -> Self {
        SendWr {
            wr_id,
            op,
            sg_list: sg_list.into(),
            flags: SendFlags::SIGNALED,
            ud: None,
            xrc_srqn: 0,
        }
    }
    /// Address it to XRC SRQ `srqn` of the target (XRC initiator QPs).
    #[must_use]
    pub fn with_xrc_srqn(mut self, srqn: u32) -> Self {
        self.xrc_srqn = srqn & 0xff_ffff;
        self
    }
    /// Address it to a UD destination.
    #[must_use]
    pub fn with_ud(mut self, ud: UdDest) -> Self {
        self.ud = Some(ud);
        self
    }
    /// Replace the flags.
    #[must_use]
    pub fn with_flags(mut self, flags: SendFlags) -> Self {
        self.flags = flags;
        self
    }
}

/// A receive work request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// The application's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where a received message lands.
    pub sg_list: SgList,
}
