//! What a queue pair hands the engine to send, and what a post refuses: shared by every
//! transport (RC, UC, UD), so that the engine drives them through one contract.

use super::mr::MrShared;
use super::QpState;
use crate::wire::RoceRepr;
use std::sync::Arc;

/// The kind of packet a QP sends next: the order of the variants is the priority rule of a
/// QP's `next_tx`, and the kind decides how the frame is marked (see `verbs::frame`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TxKind {
    /// A congestion notification owed to the peer (never paced).
    Cnp,
    /// An ACK, NAK or ATOMIC ACKNOWLEDGE (never paced).
    Control,
    /// A READ response or a request: carries data, paced at the QP's rate.
    Data,
}

/// A packet the QP built: its transport part and where its payload comes from.
pub(crate) struct TxDesc {
    pub repr: RoceRepr,
    pub payload: PayloadSrc,
}

/// Where a packet's payload bytes live.
pub(crate) enum PayloadSrc {
    None,
    /// `len` bytes at message offset `off` of send WQE `idx` (an index into the sending QP's
    /// own send queue).
    Wqe {
        idx: usize,
        off: u32,
    },
    /// Bytes of a registered region.
    Mr {
        mr: Arc<MrShared>,
        off: usize,
    },
}

/// Why a work request cannot be posted (what `ibv_post_send`/`ibv_post_recv` return).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PostError {
    /// The QP's state does not accept work requests of this kind.
    InvalidState(QpState),
    /// The queue holds its `max_*_wr` requests.
    QueueFull,
    /// Receives of a QP attached to a shared receive queue are posted to the SRQ
    /// (`ibv_post_recv` on such a QP fails with EINVAL).
    HasSrq,
}
