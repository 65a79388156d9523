//! The public API, in the shape RDMA programmers know from libibverbs: a device (context),
//! protection domains, memory regions, completion queues, queue pairs (RC, UC, UD and QP1),
//! shared receive queues, address handles, work requests, work completions and asynchronous
//! events. See [`device::Device`] for the verbs and the sans-IO contract.

pub mod connect;
pub mod device;
pub mod engine;
pub(crate) mod frame;
mod qps;

pub use crate::ib::ah::{Ah, AhFromWcError};
pub use crate::ib::appmem::AppMemory;
pub use crate::ib::attr::{
    AccessFlags, AddressVector, ModifyQpError, Mtu, QpAttr, QpAttrMask, QpCap, QpState, QpType,
};
pub use crate::ib::counters::{DeviceCounters, QpCounters};
pub use crate::ib::cq::{Cq, NotifyMode};
pub use crate::ib::event::AsyncEvent;
pub use crate::ib::mr::{LKey, MemoryRegion, MrError, Pd};
pub use crate::ib::path::{gid_of, ip_of_gid};
pub use crate::ib::srq::{Srq, SrqAttr, SrqAttrMask, SrqModifyError};
pub use crate::ib::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use crate::ib::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest};
pub use crate::rc::deviations::Deviations;
pub use crate::wire::grh::{GrhSlot, GRH_LEN};
pub use connect::{RcParams, RemoteQp, UcParams, UdParams};
pub use device::{Device, DeviceConfig, QpInitAttr, QpStatus, VerbsError, PKEY_TABLE};
pub use engine::TransmitError;
