//! Work completions, shaped like `struct ibv_wc`.

use crate::wire::{QpNumber, RKey};
use bitflags::bitflags;
use core::fmt;

/// `enum ibv_wc_status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// The work request completed.
    Success,
    /// Local length error: a receive buffer too small for the SEND, or a bad SGE total.
    LocLenErr,
    /// Local QP operation error (an internal consistency error of the QP).
    LocQpOpErr,
    /// Local protection error: an lkey that does not exist, is in another PD, lacks local
    /// write access, or an SGE outside its MR.
    LocProtErr,
    /// The QP moved to the error state before this request was processed.
    WrFlushErr,
    /// A memory window bind failed (the window, region, rights or range; IBTA 10.6.7.2).
    MwBindErr,
    /// Unexpected response opcode, length or sequence.
    BadRespErr,
    /// Local access error (e.g. an invalidate of an rkey that cannot be invalidated).
    LocAccessErr,
    /// The responder NAKed with "invalid request".
    RemInvReqErr,
    /// The responder NAKed with "remote access error" (R_Key, bounds, rights).
    RemAccessErr,
    /// The responder NAKed with "remote operational error".
    RemOpErr,
    /// Transport retry counter exceeded (timeouts or sequence-error NAKs).
    RetryExcErr,
    /// RNR retry counter exceeded.
    RnrRetryExcErr,
    /// The responder NAKed with "invalid RD request".
    RemInvRdReqErr,
    /// Any other error.
    GeneralErr,
}

impl WcStatus {
    /// Its number in `enum ibv_wc_status` (rdma-core's `<infiniband/verbs.h>`; the C-ABI
    /// crate's layout test compares these with the header).
    pub const fn to_ibv(self) -> u32 {
        match self {
            WcStatus::Success => 0,
            WcStatus::LocLenErr => 1,
            WcStatus::LocQpOpErr => 2,
            WcStatus::LocProtErr => 4,
            WcStatus::WrFlushErr => 5,
            WcStatus::MwBindErr => 6,
            WcStatus::BadRespErr => 7,
            WcStatus::LocAccessErr => 8,
            WcStatus::RemInvReqErr => 9,
            WcStatus::RemAccessErr => 10,
            WcStatus::RemOpErr => 11,
            WcStatus::RetryExcErr => 12,
            WcStatus::RnrRetryExcErr => 13,
            WcStatus::RemInvRdReqErr => 15,
            WcStatus::GeneralErr => 21,
        }
    }

    /// The `ibv_wc_status_str` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::GeneralErr => "general error",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `enum ibv_wc_opcode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A SEND (with or without immediate or invalidate) completed.
    Send,
    /// An RDMA WRITE completed.
    RdmaWrite,
    /// An RDMA READ completed.
    RdmaRead,
    /// A compare-and-swap completed.
    CompSwap,
    /// A fetch-and-add completed.
    FetchAdd,
    /// A memory window bind completed.
    BindMw,
    /// A local invalidate completed.
    LocalInv,
    /// An RDMA ATOMIC WRITE completed.
    AtomicWrite,
    /// A SEND was received.
    Recv,
    /// An RDMA WRITE with immediate was received.
    RecvRdmaWithImm,
}

impl WcOpcode {
    /// Its number in `enum ibv_wc_opcode` (receive completions from 128, as in rdma-core).
    pub const fn to_ibv(self) -> u32 {
        match self {
            WcOpcode::Send => 0,
            WcOpcode::RdmaWrite => 1,
            WcOpcode::RdmaRead => 2,
            WcOpcode::CompSwap => 3,
            WcOpcode::FetchAdd => 4,
            WcOpcode::BindMw => 5,
            WcOpcode::LocalInv => 6,
            WcOpcode::AtomicWrite => 9,
            WcOpcode::Recv => 128,
            WcOpcode::RecvRdmaWithImm => 129,
        }
    }
}

bitflags! {
    /// `enum ibv_wc_flags`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
    pub struct WcFlags: u32 {
        /// A GRH is present (always on RoCE).
        const GRH = 1 << 0;
        /// `imm_data` is valid.
        const WITH_IMM = 1 << 1;
        /// `invalidated_rkey` is valid.
        const WITH_INV = 1 << 3;
    }
}

/// One completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WorkCompletion {
    /// The work request's identifier.
    pub wr_id: u64,
    /// How it completed.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes received (receive completions) or transferred.
    pub byte_len: u32,
    /// Immediate data (with `WITH_IMM`), as sent.
    pub imm_data: Option<u32>,
    /// The rkey a SEND with invalidate invalidated (with `WITH_INV`).
    pub invalidated_rkey: Option<RKey>,
    /// The local QP.
    pub qp_num: QpNumber,
    /// The remote QP (receive completions).
    pub src_qp: QpNumber,
    /// Which optional fields are valid.
    pub wc_flags: WcFlags,
    /// The sender set the solicited-event bit.
    pub solicited: bool,
    /// Receive completions of UD QPs: the index of the packet's P_Key in the port's P_Key
    /// table (ferroce's table has the one default P_Key, index 0).
    pub pkey_index: u16,
    /// The source LID: 0 on RoCE, which has no LIDs (as rxe reports it).
    pub slid: u16,
    /// The service level: 0 on RoCE (no LRH), as rxe reports it.
    pub sl: u8,
    /// The destination LID path bits: 0 on RoCE.
    pub dlid_path_bits: u8,
}

impl WorkCompletion {
    /// A completion of `wr_id` on QP `qp_num` with every optional field empty: byte count 0,
    /// no immediate or invalidated key, no flags, source QP 0, P_Key index, LID, SL and path
    /// bits 0 (what RoCE reports).
    pub(crate) fn blank(
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        qp_num: QpNumber,
    ) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm_data: None,
            invalidated_rkey: None,
            qp_num,
            src_qp: QpNumber::new(0),
            wc_flags: WcFlags::empty(),
            solicited: false,
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        }
    }
}
