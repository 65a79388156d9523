//! Work queue entries: a work request as the device keeps it once `post_send`/`post_recv`
//! accepted it. Transport-independent: what a transport adds (PSNs, progress) it keeps beside.

use super::mr::{gather_any, sge_error, MrTable, Pd};
use super::wc::WcStatus;
use super::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};

/// A posted send work request.
#[derive(Debug)]
pub(crate) struct SendWqe {
    /// The application's identifier, returned in the completion.
    pub wr_id: u64,
    /// The operation and its operands.
    pub op: SendOp,
    /// Where the data comes from (SEND/WRITE) or goes to (READ, the atomic's original value).
    pub sges: Vec<Sge>,
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
}

impl SendWqe {
    /// The queue entry of `wr` (whose total length `len` the caller has checked), its
    /// scatter/gather list checked against `mrs` for protection domain `pd`; `inline` copies
    /// the data now (any registered MR, as libibverbs does).
    pub(crate) fn new(wr: SendWr, len: u32, inline: bool, mrs: &MrTable, pd: Pd) -> SendWqe {
        let mut local_err = sge_error(mrs, pd, &wr.sg_list, wr.op.is_rd_atomic());
        let inline = inline.then(|| {
            // Copied now: the application may reuse its buffer at once. Inline data is not
            // checked against protection domains or rights (as in libibverbs).
            let mut data = vec![0u8; len as usize];
            local_err = gather_any(mrs, &wr.sg_list, &mut data).err();
            data.into_boxed_slice()
        });
        SendWqe {
            wr_id: wr.wr_id,
            op: wr.op,
            sges: wr.sg_list,
            flags: wr.flags,
            inline,
            len,
            signaled: wr.flags.contains(SendFlags::SIGNALED),
            local_err,
        }
    }
}

/// A posted receive work request.
#[derive(Debug)]
pub(crate) struct RecvWqe {
    /// The application's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where received data lands.
    pub sges: Vec<Sge>,
    /// Total bytes the scatter/gather list holds.
    pub len: u64,
    /// A local error found when the request was posted, reported when it is used.
    pub local_err: Option<WcStatus>,
}

impl RecvWqe {
    /// The queue entry of `wr`, its scatter/gather list checked against `mrs` for protection
    /// domain `pd` (receive buffers need local write access).
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
