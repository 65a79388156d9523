//! The public API, in the shape RDMA programmers know from libibverbs: a device (context),
//! protection domains, memory regions, completion queues, RC queue pairs, work requests and
//! work completions. See [`device::Device`] for the verbs and the sans-IO contract.

pub mod connect;
pub mod device;
pub mod engine;
pub(crate) mod frame;

pub use crate::ib::attr::{
    AccessFlags, AddressVector, ModifyQpError, Mtu, QpAttr, QpAttrMask, QpCap, QpState, QpType,
};
pub use crate::ib::counters::{DeviceCounters, QpCounters};
pub use crate::ib::cq::{Cq, NotifyMode};
pub use crate::ib::mr::{LKey, MemoryRegion, MrError, Pd};
pub use crate::ib::path::{gid_of, ip_of_gid};
pub use crate::ib::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use crate::ib::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};
pub use connect::{RcParams, RemoteQp};
pub use device::{Device, DeviceConfig, QpInitAttr, VerbsError};
pub use engine::TransmitError;
