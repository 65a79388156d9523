//! Work requests, shaped like `struct ibv_send_wr` / `ibv_recv_wr`.

use super::mr::LKey;
use super::wc::WcOpcode;
use crate::wire::RKey;
use bitflags::bitflags;

/// One scatter/gather entry: `length` bytes at virtual address `addr` of the MR named by `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
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
    Send,
    SendWithImm {
        imm: u32,
    },
    SendWithInv {
        invalidate_rkey: RKey,
    },
    RdmaWrite {
        remote_addr: u64,
        rkey: RKey,
    },
    RdmaWriteWithImm {
        remote_addr: u64,
        rkey: RKey,
        imm: u32,
    },
    RdmaRead {
        remote_addr: u64,
        rkey: RKey,
    },
    /// 64-bit compare and swap at an 8-byte aligned remote address; the original value lands
    /// in the (8-byte) local buffer.
    AtomicCmpSwp {
        remote_addr: u64,
        rkey: RKey,
        compare: u64,
        swap: u64,
    },
    /// 64-bit fetch and add.
    AtomicFetchAdd {
        remote_addr: u64,
        rkey: RKey,
        add: u64,
    },
}

impl SendOp {
    pub fn is_read(&self) -> bool {
        matches!(self, SendOp::RdmaRead { .. })
    }
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
    pub fn is_send(&self) -> bool {
        matches!(
            self,
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }
        )
    }
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
        }
    }
}

/// A send work request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub op: SendOp,
    pub sg_list: Vec<Sge>,
    pub flags: SendFlags,
}

impl SendWr {
    /// A signaled request.
    pub fn new(wr_id: u64, op: SendOp, sg_list: Vec<Sge>) -> Self {
        SendWr {
            wr_id,
            op,
            sg_list,
            flags: SendFlags::SIGNALED,
        }
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
    pub wr_id: u64,
    pub sg_list: Vec<Sge>,
}
