//! Work queue entries: a work request as the device keeps it once `post_send`/`post_recv`
//! accepted it. Transport-independent: what a transport adds (PSNs, progress) it keeps beside.

use super::mr::{gather_any, sge_error, MrTable, Pd};
use super::path::Path;
use super::wc::WcStatus;
use super::wr::{RecvWr, SendFlags, SendOp, SendWr, SgList};
use crate::wire::QpNumber;

/// A UD send's destination, its address handle resolved when the request was posted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UdSendDest {
    /// The outer headers (the UDP source port is the sending QP's).
    pub path: Path,
    /// The destination QP.
    pub qpn: QpNumber,
    /// The Q_Key of the work request (a controlled one is replaced by the QP's own when sent).
    pub qkey: u32,
}

/// A posted send work request.
#[derive(Debug)]
pub(crate) struct SendWqe {
    /// The application's identifier, returned in the completion.
    pub wr_id: u64,
    /// The operation and its operands.
    pub op: SendOp,
    /// Where the data comes from (SEND/WRITE) or goes to (READ, the atomic's original value).
    pub sges: SgList,
    /// The flags as posted.
    pub flags: SendFlags,
    /// Data copied at post time for INLINE requests.
    pub inline: Option<Box<[u8]>>,
    /// Message length: the sum of the scatter/gather lengths.
    pub len: u32,
    /// A completion is generated on success (failed requests always complete).
    pub signaled: bool,
    /// A local error found when the request was posted, reported when it is reached.
    pub local_err: Option<WcStatus>,
    /// UD: the destination.
    pub ud: Option<UdSendDest>,
    /// XRC: the target's SRQ (XRCETH).
    pub xrc_srqn: u32,
}

impl SendWqe {
    /// The queue entry of `wr` (whose total length `len` the caller has checked), its
    /// scatter/gather list checked against `mrs` for protection domain `pd`; `inline` copies
    /// the data now (any registered MR, as libibverbs does); `ud` is a UD request's
    /// destination (built in place with the rest).
    #[inline]
    pub(crate) fn new(
        wr: SendWr,
        len: u32,
        inline: bool,
        mrs: &MrTable,
        pd: Pd,
        ud: Option<UdSendDest>,
    ) -> SendWqe {
        let mut local_err = sge_error(mrs, pd, &wr.sg_list, wr.op.is_rd_atomic());
        let inline = if let SendOp::AtomicWrite { value, .. } = wr.op {
            // The payload, as inline data (an ATOMIC WRITE has no scatter/gather list).
            Some(Box::new(value) as Box<[u8]>)
        } else {
            inline.then(|| {
                // Copied now: the application may reuse its buffer at once. Inline data is not
                // checked against protection domains or rights (as in libibverbs).
                let mut data = vec![0u8; len as usize];
                local_err = gather_any(mrs, &wr.sg_list, &mut data).err();
                data.into_boxed_slice()
            })
        };
        SendWqe {
            wr_id: wr.wr_id,
            op: wr.op,
            sges: wr.sg_list,
            flags: wr.flags,
            inline,
            len,
            signaled: wr.flags.contains(SendFlags::SIGNALED),
            local_err,
            ud,
            xrc_srqn: wr.xrc_srqn,
        }
    }
}

/// A posted receive work request.
#[derive(Debug)]
pub(crate) struct RecvWqe {
    /// The application's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where received data lands.
    pub sges: SgList,
    /// Total bytes the scatter/gather list holds.
    pub len: u64,
    /// A local error found when the request was posted, reported when it is used.
    pub local_err: Option<WcStatus>,
}

impl RecvWqe {
    /// The queue entry of `wr`, its scatter/gather list checked against `mrs` for protection
    /// domain `pd` (receive buffers need local write access).
    #[inline]
    pub(crate) fn new(wr: RecvWr, mrs: &MrTable, pd: Pd) -> RecvWqe {
        let len: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        let local_err = sge_error(mrs, pd, &wr.sg_list, true);
        RecvWqe {
            wr_id: wr.wr_id,
            sges: wr.sg_list,
            len,
            local_err,
        }
    }
}

/// The receive side of a UC or UD QP: its own queue of receive WQEs, or a shared receive
/// queue (whose WQEs the QP takes one message at a time).
#[derive(Debug, Default)]
pub(crate) struct RecvQueue {
    own: std::collections::VecDeque<RecvWqe>,
    srq: Option<super::srq::Srq>,
}

impl RecvQueue {
    /// A queue of its own, or the shared `srq`.
    pub(crate) fn new(srq: Option<super::srq::Srq>) -> RecvQueue {
        RecvQueue {
            own: std::collections::VecDeque::new(),
            srq,
        }
    }

    /// The SRQ, if the QP is attached to one.
    pub(crate) fn srq(&self) -> Option<super::srq::Srq> {
        self.srq
    }

    /// `ibv_post_recv`'s checks: not on an SRQ-attached QP, not past `max_recv_wr`.
    pub(crate) fn check_post(&self, max_recv_wr: u32) -> Result<(), super::tx::PostError> {
        if self.srq.is_some() {
            return Err(super::tx::PostError::HasSrq);
        }
        if self.own.len() >= max_recv_wr as usize {
            return Err(super::tx::PostError::QueueFull);
        }
        Ok(())
    }

    /// Queue a receive WQE [`check_post`](Self::check_post) admitted.
    pub(crate) fn post(&mut self, w: RecvWqe) {
        self.own.push_back(w);
    }

    /// Take the next receive WQE for a message (from the SRQ if attached).
    pub(crate) fn take(&mut self, ctx: &mut super::Ctx<'_>) -> Option<RecvWqe> {
        match self.srq {
            Some(s) => ctx.srq_take(s),
            None => self.own.pop_front(),
        }
    }

    /// Give back a WQE taken for a message that is dropped without a completion: it takes the
    /// next message (at the head of the QP's own queue or of the SRQ).
    pub(crate) fn put_back(&mut self, ctx: &mut super::Ctx<'_>, w: RecvWqe) {
        match self.srq {
            Some(s) => ctx.srq_put_back(s, w),
            None => self.own.push_front(w),
        }
    }

    /// The WQEs of the QP's own queue, oldest first, removed (for a flush or a reset).
    pub(crate) fn drain_own(&mut self) -> std::collections::vec_deque::Drain<'_, RecvWqe> {
        self.own.drain(..)
    }

    /// WQEs in the QP's own queue.
    pub(crate) fn own_len(&self) -> usize {
        self.own.len()
    }
}
