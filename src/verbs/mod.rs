//! The public API, in the shape RDMA programmers know from libibverbs: a device (context),
//! protection domains, memory regions, completion queues, queue pairs (RC, UC, UD and QP1),
//! shared receive queues, address handles, work requests, work completions and asynchronous
//! events. See [`device::Device`] for the verbs and the sans-IO contract.

/// The [`Ctx`](crate::ib::Ctx) over a device's shared objects (MRs, CQs, SRQs, events,
/// counters) at `now`. A macro rather than a method so that it borrows only those fields of
/// the [`Device`]: the QP being driven stays borrowed from its table meanwhile.
macro_rules! ctx {
    ($dev:expr, $now:expr) => {
        crate::ib::Ctx {
            now: $now,
            mrs: &$dev.mrs,
            cqs: &mut $dev.cqs,
            srqs: &mut $dev.srqs,
            events: &mut $dev.events,
            dev: &mut $dev.counters,
        }
    };
}

pub mod connect;
pub mod device;
pub mod engine;
pub(crate) mod frame;
pub mod limits;
mod qps;

pub use crate::ib::ah::{Ah, AhFromWcError};
pub use crate::ib::appmem::{AppMemory, OnDemandMemory, UserMemory};
pub use crate::ib::attr::{
    AccessFlags, AddressVector, ModifyQpError, Mtu, QpAttr, QpAttrMask, QpCap, QpState, QpType,
};
pub use crate::ib::counters::{DeviceCounters, QpCounters};
pub use crate::ib::cq::{Cq, NotifyMode};
pub use crate::ib::event::AsyncEvent;
pub use crate::ib::mr::{
    inc_rkey, LKey, MemoryRegion, MemoryWindow, MrError, MwBindInfo, MwType, Pd,
};
pub use crate::ib::path::{gid_of, ip_of_gid, AvError};
pub use crate::ib::srq::{Srq, SrqAttr, SrqAttrMask, SrqModifyError, Xrcd};
pub use crate::ib::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use crate::ib::wr::{RecvWr, SendFlags, SendOp, SendWr, SgList, Sge, UdDest};
pub use crate::rc::deviations::Deviations;
pub use crate::wire::grh::{GrhSlot, GRH_LEN};
pub use connect::{RcParams, RemoteQp, UcParams, UdParams};
pub use device::{
    Device, DeviceConfig, QpInitAttr, QpStatus, ReceiveScope, VerbsError, MAX_MCAST_GROUPS,
    MAX_MCAST_QP_ATTACH, PKEY_TABLE,
};
pub use engine::TransmitError;
pub use limits::DeviceAttr;
