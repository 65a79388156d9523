//! What every transport shares: the verbs vocabulary and the objects a queue pair works on.
//!
//! This is the layer below the transports (`rc`, `uc`, `ud`) and above [`crate::wire`], in the
//! place Linux's `ib_verbs.h` holds for its providers:
//!
//! - the **vocabulary** of libibverbs' API, data only: QP states, attributes and the rules of
//!   `ibv_modify_qp` ([`attr`]), work requests ([`wr`]), work completions ([`wc`]), handles
//!   ([`Pd`], [`Cq`], [`LKey`], [`Srq`], [`Ah`]), asynchronous events ([`event`]);
//! - the **objects** transports operate on: the posted form of a work request (`wqe.rs`), the
//!   completion-queue ring ([`cq`]), memory regions, the key table and the scatter/gather
//!   copies in and out of them ([`mr`]), shared receive queues ([`srq`]), the resolved path of
//!   a connected QP ([`path`]) and address handles ([`ah`]), what a QP hands the engine to
//!   send (`tx.rs`), counters ([`counters`]) and `Ctx`, what the QPs of one device share while
//!   they run.
//!
//! [`crate::verbs`] re-exports the public part; applications never need to name this module.
//!
//! # What this module may import
//!
//! [`crate::wire`] (header types and numbers: `QpNumber`, `RKey`, `Psn`, `Ecn`, `MacAddr`) and
//! [`crate::time`]; nothing else of the crate. In particular no transport (`rc`, ...), no
//! `verbs`, no `cc`: the dependency points one way, `verbs → rc → ib → wire`.

pub mod ah;
pub mod appmem;
pub mod attr;
pub mod counters;
pub mod cq;
pub mod event;
pub mod mr;
pub mod path;
pub mod srq;
pub(crate) mod tx;
pub mod wc;
pub(crate) mod wq;
pub(crate) mod wqe;
pub mod wr;

pub use ah::{ah_attr_from_wc, Ah, AhFromWcError};
pub use appmem::{AppMemory, OnDemandMemory, UserMemory};
pub use attr::{
    AccessFlags, AddressVector, ModifyQpError, Mtu, QpAttr, QpAttrMask, QpCap, QpState, QpType,
};
pub use counters::{DeviceCounters, QpCounters};
pub use cq::{Cq, NotifyMode};
pub use event::AsyncEvent;
pub use mr::{LKey, MemoryRegion, MrError, Pd};
pub use path::{gid_of, ip_of_gid, AvError};
pub use srq::{Srq, SrqAttr, SrqAttrMask, SrqModifyError, Xrcd};
pub use wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use wr::{RecvWr, SendFlags, SendOp, SendWr, SgList, Sge, UdDest};

use crate::time::Instant;
use cq::CqRing;
use event::EventQueue;
use mr::MrTable;
use srq::SrqTable;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use wqe::RecvWqe;

/// A hasher for 32-bit keys that are already random (MR keys) or small (QPNs): one multiply.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = u64::from(v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A map keyed by MR keys or QP numbers.
pub(crate) type KeyMap<V> = HashMap<u32, V, BuildHasherDefault<KeyHasher>>;

/// What the QPs of a device share while they run: the time, the memory regions, the
/// completion queues, the shared receive queues, the asynchronous event queue and the device
/// counters. The engine lends one to a QP for each packet, timer or transmission it hands it.
pub(crate) struct Ctx<'a> {
    /// The time of the event being handled.
    pub now: Instant,
    /// The device's memory regions.
    pub mrs: &'a MrTable,
    /// The device's completion queues, by [`Cq`] index.
    pub cqs: &'a mut [Option<CqRing>],
    /// The device's shared receive queues, by [`Srq`] number.
    pub srqs: &'a mut SrqTable,
    /// The device's asynchronous events.
    pub events: &'a mut EventQueue,
    /// The device counters (completions lost to a full CQ are counted here).
    pub dev: &'a mut DeviceCounters,
}

impl Ctx<'_> {
    /// Put a completion on `cq` (counted in `cq_overruns` and reported as `IBV_EVENT_CQ_ERR`
    /// if the ring is full).
    pub(crate) fn complete(&mut self, cq: Cq, wc: WorkCompletion) {
        if let Some(Some(c)) = self.cqs.get_mut(cq.0 as usize) {
            if !c.push(wc) {
                self.dev.cq_overruns += 1;
                self.events.push(AsyncEvent::CqErr(cq));
                tracing::warn!(cq = cq.0, qpn = %wc.qp_num, wr_id = wc.wr_id, "CQ overrun: completion lost");
            }
        }
    }

    /// Whether shared receive queue `srq` holds a receive WQE.
    pub(crate) fn srq_has_wqe(&self, srq: Srq) -> bool {
        self.srqs
            .get(srq.0 as usize)
            .and_then(Option::as_ref)
            .is_some_and(|s| s.len() > 0)
    }

    /// Give a WQE taken from `srq` back, at its head (a UC message lost on the wire).
    pub(crate) fn srq_put_back(&mut self, srq: Srq, w: RecvWqe) {
        if let Some(s) = self.srqs.get_mut(srq.0 as usize).and_then(Option::as_mut) {
            s.put_back(w);
        }
    }

    /// Take the oldest receive WQE of `srq` (raising its limit event if due).
    pub(crate) fn srq_take(&mut self, srq: Srq) -> Option<RecvWqe> {
        self.srqs
            .get_mut(srq.0 as usize)
            .and_then(Option::as_mut)?
            .take(srq, self.events)
    }
}
