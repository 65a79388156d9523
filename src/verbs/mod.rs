//! The public API, in the shape RDMA programmers know from libibverbs: a device (context),
//! protection domains, memory regions, completion queues, RC queue pairs, work requests and
//! work completions. See [`device::Device`] for the verbs and the sans-IO contract.

pub mod cq;
pub mod device;
pub mod mr;
pub mod wc;
pub mod wr;

pub use crate::rc::state::{AccessFlags, AddressVector, Mtu, QpAttr, QpAttrMask, QpCap, QpState};
pub use cq::{Cq, NotifyMode};
pub use device::{
    gid_of, ip_of_gid, Device, DeviceConfig, QpInitAttr, RcParams, RemoteQp, VerbsError,
};
pub use mr::{LKey, MemoryRegion, MrError, Pd};
pub use wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};

use mr::MrShared;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

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

pub(crate) type KeyMap<V> = HashMap<u32, V, BuildHasherDefault<KeyHasher>>;

/// The device's registered memory regions, by local and by remote key.
#[derive(Default)]
pub(crate) struct MrTable {
    by_lkey: KeyMap<Arc<MrShared>>,
    by_rkey: KeyMap<Arc<MrShared>>,
}

impl MrTable {
    pub(crate) fn by_rkey(&self, k: crate::wire::RKey) -> Option<Arc<MrShared>> {
        self.by_rkey.get(&k.0).cloned()
    }
    pub(crate) fn lkey_ref(&self, k: LKey) -> Option<&Arc<MrShared>> {
        self.by_lkey.get(&k.0)
    }
    pub(crate) fn contains_key(&self, k: u32) -> bool {
        self.by_lkey.contains_key(&k) || self.by_rkey.contains_key(&k)
    }
    pub(crate) fn insert(&mut self, mr: Arc<MrShared>) {
        self.by_lkey.insert(mr.lkey.0, mr.clone());
        self.by_rkey.insert(mr.rkey.0, mr);
    }
    pub(crate) fn remove(&mut self, lkey: LKey) -> Option<Arc<MrShared>> {
        let mr = self.by_lkey.remove(&lkey.0)?;
        self.by_rkey.remove(&mr.rkey.0);
        Some(mr)
    }
}
