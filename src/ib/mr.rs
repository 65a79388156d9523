//! Memory regions: the application's handle ([`MemoryRegion`]), the device's table of them by
//! key, and the scatter/gather copies every transport makes in and out of them.
//!
//! # The memory model
//!
//! An RNIC writes into registered memory while the application may be reading it. In ferroce
//! the **memory region owns its buffer** (`Box<[u8]>` behind an `RwLock`), shared by `Arc`
//! between the application's [`MemoryRegion`] handle and the device's MR table. Every access
//! is a short critical section: the engine takes the write lock to place one packet's payload
//! (a single `memcpy`) or to execute one atomic, and the read lock to gather one packet's
//! payload; the application copies in and out with [`MemoryRegion::write`] /
//! [`MemoryRegion::read`] or looks at the bytes in a scoped borrow
//! ([`MemoryRegion::with_bytes`] / [`MemoryRegion::with_bytes_mut`]) that holds the lock.
//! There is no raw pointer into the buffer and no `unsafe`: a concurrent remote WRITE and a local
//! read are ordered by the lock, never a data race. What the application sees in the middle of
//! a multi-packet message is some prefix of it, exactly as with a hardware RNIC; completions
//! say when a message is whole.
//!
//! Addresses: an MR is given a virtual address (`addr()`), page-aligned, chosen by the device;
//! scatter/gather entries and remote keys name bytes by that address, as in libibverbs.
//!
//! **Application memory.** A region may instead sit on memory the application owns
//! ([`AppMemory`](crate::ib::AppMemory), `Device::reg_mr_app`: what
//! `ibv_reg_mr(pd, addr, len, access)` registers; or, registered on demand,
//! [`OnDemandMemory`](crate::ib::OnDemandMemory), reached through system calls page by page).
//! The engine then reads and writes those bytes directly, with no copy, under the same lock;
//! the `unsafe` this needs and its safety argument are in [`super::appmem`], the only such
//! module of the library. Its address is the one the application gives (the buffer's own, or
//! an I/O virtual address). Deregistration releases it: every later access fails.

use super::appmem::{Memory, UserMemory};
use super::attr::AccessFlags;
use super::wc::WcStatus;
use super::wr::Sge;
use super::KeyMap;
use crate::wire::{QpNumber, RKey};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A local key: names an MR to the local device (work request scatter/gather entries).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Debug)]
pub struct LKey(pub u32);

/// A protection domain handle.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Pd(pub(crate) u32);

/// Errors of MR access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MrError {
    /// The region's memory is gone: application memory
    /// ([`AppMemory`](crate::ib::AppMemory)) after deregistration; or, on demand, not there.
    #[error("the region was deregistered and its application memory released")]
    Gone,
    /// The range is not inside the region.
    #[error("range {offset}+{len} outside a region of {size} bytes")]
    OutOfBounds {
        /// The first byte asked for.
        offset: usize,
        /// The bytes asked for.
        len: usize,
        /// The region's size.
        size: usize,
    },
}

/// A registered region as the device sees it: keys, rights, address and the bytes. Shared by
/// `Arc` between the device's [`MrTable`] and the application's [`MemoryRegion`] handles.
pub(crate) struct MrShared {
    pub(crate) lkey: LKey,
    pub(crate) rkey: RKey,
    pub(crate) pd: Pd,
    pub(crate) access: AccessFlags,
    pub(crate) va: u64,
    pub(crate) len: usize,
    mem: RwLock<Memory>,
    /// Registered on demand (fixed at registration: a READ response's pages are looked for
    /// only then).
    on_demand: bool,
    /// Cleared by SEND with invalidate and by deregistration: the rkey no longer works.
    pub(crate) rkey_valid: AtomicBool,
    /// A memory window's binding: the region it was bound to and the offset in it of the
    /// window's first byte. Every access goes to that region (whose own key must still work).
    parent: Option<(Arc<MrShared>, usize)>,
    /// A memory window's type.
    pub(crate) window: Option<MwType>,
    /// A type 2 window: the QP it was bound through, the only one its R_Key works on.
    pub(crate) bound_qp: Option<QpNumber>,
}

impl std::fmt::Debug for MrShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MR(lkey={:#x} rkey={} va={:#x} len={})",
            self.lkey.0, self.rkey, self.va, self.len
        )
    }
}

impl MrShared {
    pub(crate) fn new(
        lkey: LKey,
        rkey: RKey,
        pd: Pd,
        access: AccessFlags,
        va: u64,
        len: usize,
    ) -> Self {
        MrShared {
            lkey,
            rkey,
            pd,
            access,
            va,
            len,
            mem: RwLock::new(Memory::Owned(vec![0u8; len].into_boxed_slice())),
            on_demand: false,
            rkey_valid: AtomicBool::new(true),
            parent: None,
            window: None,
            bound_qp: None,
        }
    }

    /// A region over the application's own memory, at virtual address `va` (`ibv_reg_mr`
    /// passes the pointer itself, `ibv_reg_mr_iova2` any I/O virtual address).
    pub(crate) fn new_app(
        lkey: LKey,
        rkey: RKey,
        pd: Pd,
        access: AccessFlags,
        va: u64,
        mem: UserMemory,
    ) -> Self {
        MrShared {
            lkey,
            rkey,
            pd,
            access,
            va,
            // An implicit on-demand region's u64::MAX bytes (usize is 64 bits on every target
            // ferroce builds for: see `io::sys`).
            len: usize::try_from(mem.len()).unwrap_or(usize::MAX),
            on_demand: matches!(mem, UserMemory::OnDemand(_)),
            mem: RwLock::new(Memory::from(mem)),
            rkey_valid: AtomicBool::new(true),
            parent: None,
            window: None,
            bound_qp: None,
        }
    }

    /// A memory window bound to `len` bytes of `parent` from offset `off`, named by `rkey` at
    /// address `va` (0 for a zero-based window) with rights `access`.
    fn new_window(w: &WindowBinding, parent: Arc<MrShared>, off: usize) -> Self {
        MrShared {
            lkey: LKey(0),
            rkey: w.rkey,
            pd: parent.pd,
            access: w.access,
            va: w.va,
            len: w.len,
            on_demand: parent.on_demand,
            mem: RwLock::new(Memory::Gone),
            rkey_valid: AtomicBool::new(true),
            parent: Some((parent, off)),
            window: Some(w.kind),
            bound_qp: w.qp,
        }
    }

    /// The read lock. A poisoned lock (a panic while holding it) still guards valid bytes.
    fn lock_read(&self) -> RwLockReadGuard<'_, Memory> {
        self.mem.read().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_write(&self) -> RwLockWriteGuard<'_, Memory> {
        self.mem.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Copy `dst.len()` bytes at offset `off` out of the region; false if the range is outside
    /// it or its memory is gone.
    pub(crate) fn read_at(&self, off: usize, dst: &mut [u8]) -> bool {
        match &self.parent {
            Some((p, o)) => self.inside(off, dst.len()) && p.read_at(o + off, dst),
            None => self.lock_read().read_at(off, dst),
        }
    }

    /// A window's bytes `[off, off + len)` lie inside it (its region checks its own bounds).
    fn inside(&self, off: usize, len: usize) -> bool {
        off.checked_add(len).is_some_and(|e| e <= self.len)
    }

    /// Copy `src` into the region at offset `off`; false if the range is outside it or its
    /// memory is gone.
    pub(crate) fn write_at(&self, off: usize, src: &[u8]) -> bool {
        match &self.parent {
            Some((p, o)) => self.inside(off, src.len()) && p.write_at(o + off, src),
            None => self.lock_write().write_at(off, src),
        }
    }

    /// Whether the `len` bytes at offset `off` are there to read (on demand: every page mapped
    /// now, and the memory not gone; pinned or owned memory: always).
    pub(crate) fn present(&self, off: usize, len: usize) -> bool {
        // Pinned memory is there until deregistration, which the R_Key check catches.
        match &self.parent {
            Some((p, o)) => self.inside(off, len) && p.present(o + off, len),
            None => !self.on_demand || self.lock_read().present(off, len),
        }
    }

    /// Replace the 8 bytes at offset `off` by `f` of them under the write lock (an ATOMIC):
    /// their old value, or `None` if they are outside the region, gone or not there.
    pub(crate) fn update8_at(
        &self,
        off: usize,
        f: impl FnOnce([u8; 8]) -> [u8; 8],
    ) -> Option<[u8; 8]> {
        match &self.parent {
            Some((p, o)) if self.inside(off, 8) => p.update8_at(o + off, f),
            Some(_) => None,
            None => self.lock_write().update8_at(off, f),
        }
    }

    /// Run `f` on the bytes under the write lock (an ATOMIC); `None` if the memory is gone.
    pub(crate) fn update<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        self.lock_write().get_mut().map(f)
    }

    /// Run `f` on the bytes under the read lock (empty if the memory is gone).
    pub(crate) fn view<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(self.lock_read().get().unwrap_or(&[]))
    }

    /// Run `f` on the bytes under the write lock (empty if the memory is gone).
    pub(crate) fn view_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut g = self.lock_write();
        match g.get_mut() {
            Some(b) => f(b),
            None => f(&mut []),
        }
    }

    /// Deregistration: application memory is released to its owner (every later access
    /// fails); memory the region owns stays with the handles that remain.
    pub(crate) fn release_app_memory(&self) {
        let mut g = self.lock_write();
        if g.is_app() {
            *g = Memory::Gone;
        }
    }

    /// Whether the region is over the application's memory (still registered).
    pub(crate) fn is_app(&self) -> bool {
        self.lock_read().is_app()
    }

    /// Whether the region is registered on demand (and still registered).
    pub(crate) fn is_on_demand(&self) -> bool {
        self.lock_read().is_on_demand()
    }

    /// A copy of the bytes `[from, to)` (test helper).
    #[cfg(test)]
    pub(crate) fn copy_range(&self, r: std::ops::Range<usize>) -> Vec<u8> {
        self.view(|b| b[r].to_vec())
    }

    /// Offset of `[va, va + len)` inside the region, if it lies inside.
    pub(crate) fn offset_of(&self, va: u64, len: u64) -> Option<usize> {
        let off = va.checked_sub(self.va)?;
        let end = off.checked_add(len)?;
        (end <= self.len as u64).then_some(off as usize)
    }

    /// Whether the R_Key works: not invalidated or deregistered, and for a window, its
    /// region's key still works too (a window dies with the region under it).
    pub(crate) fn rkey_valid(&self) -> bool {
        self.rkey_valid.load(Ordering::Acquire)
            && self.parent.as_ref().is_none_or(|(p, _)| p.rkey_valid())
    }

    pub(crate) fn invalidate_rkey(&self) {
        self.rkey_valid.store(false, Ordering::Release);
    }
}

/// The application's handle on a registered memory region. Cloning it is cheap; the memory
/// lives until the last handle and the device's table entry are gone.
#[derive(Clone)]
pub struct MemoryRegion(pub(crate) Arc<MrShared>);

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("0x{:x}", self.0.va))
            .field("len", &self.0.len)
            .field("lkey", &self.0.lkey)
            .field("rkey", &self.0.rkey)
            .field("access", &self.0.access)
            .finish()
    }
}

impl MemoryRegion {
    /// The local key (scatter/gather entries name the region by it).
    pub fn lkey(&self) -> LKey {
        self.0.lkey
    }
    /// The remote key (a peer's WRITE, READ and ATOMIC name the region by it).
    pub fn rkey(&self) -> RKey {
        self.0.rkey
    }
    /// The virtual address of the first byte.
    pub fn addr(&self) -> u64 {
        self.0.va
    }
    /// The region's size in bytes.
    pub fn len(&self) -> usize {
        self.0.len
    }
    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }
    /// The rights it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.0.access
    }
    /// Its protection domain.
    pub fn pd(&self) -> Pd {
        self.0.pd
    }
    /// Whether the rkey still works (false after SEND with invalidate or deregistration).
    pub fn rkey_valid(&self) -> bool {
        self.0.rkey_valid()
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), MrError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.0.len => Ok(()),
            _ => Err(MrError::OutOfBounds {
                offset,
                len,
                size: self.0.len,
            }),
        }
    }

    /// Copy `out.len()` bytes starting at `offset` out of the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), MrError> {
        self.check(offset, out.len())?;
        self.0
            .read_at(offset, out)
            .then_some(())
            .ok_or(MrError::Gone)
    }

    /// Copy `data` into the region at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), MrError> {
        self.check(offset, data.len())?;
        self.0
            .write_at(offset, data)
            .then_some(())
            .ok_or(MrError::Gone)
    }

    /// Fill the whole region with `byte` (nothing once application memory is released).
    pub fn fill(&self, byte: u8) {
        self.0.update(|b| b.fill(byte));
    }

    /// A copy of the whole region (empty once application memory is released).
    pub fn to_vec(&self) -> Vec<u8> {
        self.0.view(|b| b.to_vec())
    }

    /// Look at the bytes while holding the region's read lock (the device cannot write
    /// meanwhile). Application memory released by deregistration shows as no bytes.
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        self.0.view(f)
    }

    /// Change the bytes while holding the region's write lock (no bytes once application
    /// memory is released).
    pub fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        self.0.view_mut(f)
    }

    /// The offset in the region of the `len` bytes at address `addr`, if they lie inside it
    /// (the check every scatter/gather entry and remote request is put to).
    pub fn offset_of(&self, addr: u64, len: u64) -> Option<usize> {
        self.0.offset_of(addr, len)
    }

    /// Whether the region is over the application's own memory
    /// ([`AppMemory`](crate::ib::AppMemory) or [`super::appmem::OnDemandMemory`]).
    pub fn is_app_memory(&self) -> bool {
        self.0.is_app()
    }

    /// Whether the region is registered on demand ([`super::appmem::OnDemandMemory`]): its
    /// bytes are reached through system calls, never as a slice, so [`Self::with_bytes`]
    /// shows none of them (read them with [`Self::read`], or through the application's own
    /// pointer).
    pub fn is_on_demand(&self) -> bool {
        self.0.is_on_demand()
    }
}

/// `enum ibv_mw_type`: a memory window's type (IBTA Vol. 1 §10.6.7.2).
///
/// - **Type 1** is bound with `ibv_bind_mw` (a bind work request the library posts) and may be
///   bound again at any time; any QP of its protection domain may use it. Binding it to no
///   region, or to zero bytes, takes its access away; it cannot be invalidated by a peer.
/// - **Type 2** (2B: QP and PD) is bound by an `IBV_WR_BIND_MW` work request that names the
///   new R_Key (its index the window's, `ibv_inc_rkey` of the last); only from the free state
///   (never bound, or invalidated since), and only the QP it was bound through accepts its
///   R_Key. `IBV_WR_LOCAL_INV` on that QP or a peer's SEND with invalidate frees it again.
///
/// Either dies with its region: once the region's key stops working (deregistration) so does
/// the window's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MwType {
    /// `IBV_MW_TYPE_1`.
    Type1,
    /// `IBV_MW_TYPE_2`.
    Type2,
}

impl MwType {
    /// From `enum ibv_mw_type` (1, 2).
    pub fn from_ibv(t: u32) -> Option<MwType> {
        match t {
            1 => Some(MwType::Type1),
            2 => Some(MwType::Type2),
            _ => None,
        }
    }
    /// Its number in `enum ibv_mw_type`.
    pub fn to_ibv(self) -> u32 {
        match self {
            MwType::Type1 => 1,
            MwType::Type2 => 2,
        }
    }
}

/// What a bind asks for (`struct ibv_mw_bind_info`): `length` bytes of the region named by
/// `mr` from address `addr`, with the remote rights `access`; no region (type 1 only): unbind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MwBindInfo {
    /// The region's local key (`bind_info.mr`), `None` to unbind a type 1 window.
    pub mr: Option<LKey>,
    /// The window's first byte, an address inside the region.
    pub addr: u64,
    /// Its length.
    pub length: u64,
    /// The rights a peer gets (remote read, write, atomic; local write is the region's).
    pub access: AccessFlags,
    /// `IBV_ACCESS_ZERO_BASED`: peers name the window's bytes from address 0.
    pub zero_based: bool,
}

/// A binding about to be made.
struct WindowBinding {
    rkey: RKey,
    access: AccessFlags,
    va: u64,
    len: usize,
    kind: MwType,
    qp: Option<QpNumber>,
}

/// A memory window: its protection domain, type, the index its R_Keys share (their upper 24
/// bits) and its binding (a window view, [`MrShared`] with a parent, in the R_Key table's
/// place while it lasts).
pub(crate) struct MwShared {
    pub(crate) pd: Pd,
    pub(crate) kind: MwType,
    index: u32,
    state: Mutex<MwState>,
}

struct MwState {
    /// The R_Key of the last bind (or the one given at allocation).
    rkey: RKey,
    bound: Option<Arc<MrShared>>,
}

impl std::fmt::Debug for MwShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MW({:?} index={:#x})", self.kind, self.index)
    }
}

impl MwShared {
    /// A window with R_Key `rkey` (its index is `rkey >> 8`), bound to nothing.
    pub(crate) fn new(pd: Pd, kind: MwType, rkey: RKey) -> Self {
        MwShared {
            pd,
            kind,
            index: rkey.0 >> 8,
            state: Mutex::new(MwState { rkey, bound: None }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MwState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The R_Key of the last bind.
    pub(crate) fn rkey(&self) -> RKey {
        self.lock().rkey
    }

    /// The binding `k` names now, if it is this window's current R_Key.
    fn current(&self, k: RKey) -> Option<Arc<MrShared>> {
        self.lock().bound.as_ref().filter(|b| b.rkey == k).cloned()
    }

    /// Whether the window is bound with a key that works.
    pub(crate) fn is_valid(&self) -> bool {
        self.lock().bound.as_ref().is_some_and(|b| b.rkey_valid())
    }

    /// Execute a bind work request posted on QP `qpn` of protection domain `qp_pd`: the
    /// window's R_Key becomes `new_rkey`, naming the bytes and rights of `b` (IBTA Vol. 1
    /// §10.6.7.2: the window and the region in the QP's PD, the region registered with
    /// `IBV_ACCESS_MW_BIND` and with local write if the window grants remote write or atomics,
    /// the range inside it; a type 2 window free and the key's index its own). The previous
    /// binding's key stops working at once. `Err(MwBindErr)` changes nothing.
    pub(crate) fn bind(
        &self,
        mrs: &MrTable,
        qp_pd: Pd,
        qpn: QpNumber,
        new_rkey: RKey,
        b: &MwBindInfo,
    ) -> Result<(), WcStatus> {
        let bad = Err(WcStatus::MwBindErr);
        if self.pd != qp_pd || new_rkey.0 >> 8 != self.index {
            return bad;
        }
        let mut st = self.lock();
        let valid = st.bound.as_ref().is_some_and(|m| m.rkey_valid());
        if self.kind == MwType::Type2 && (valid || b.mr.is_none()) {
            return bad;
        }
        let new = match b.mr {
            None if b.addr != 0 || b.length != 0 => return bad,
            None => None,
            Some(lkey) => {
                let Some(mr) = mrs.lkey_ref(lkey).filter(|m| m.window.is_none()) else {
                    return bad;
                };
                let remote_writes = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
                if mr.pd != qp_pd
                    || !mr.access.contains(AccessFlags::MW_BIND)
                    || b.access.intersects(remote_writes)
                        && !mr.access.contains(AccessFlags::LOCAL_WRITE)
                {
                    return bad;
                }
                let (Some(off), Ok(len)) =
                    (mr.offset_of(b.addr, b.length), usize::try_from(b.length))
                else {
                    return bad;
                };
                let w = WindowBinding {
                    rkey: new_rkey,
                    access: b.access & (AccessFlags::REMOTE_READ | remote_writes),
                    va: if b.zero_based { 0 } else { b.addr },
                    len,
                    kind: self.kind,
                    qp: (self.kind == MwType::Type2).then_some(qpn),
                };
                Some(Arc::new(MrShared::new_window(&w, mr.clone(), off)))
            }
        };
        if let Some(old) = st.bound.take() {
            old.invalidate_rkey();
        }
        st.bound = new;
        st.rkey = new_rkey;
        Ok(())
    }

    /// Free the window: its key stops working (`IBV_WR_LOCAL_INV`, a peer's SEND with
    /// invalidate, deallocation).
    pub(crate) fn invalidate(&self) {
        if let Some(old) = self.lock().bound.take() {
            old.invalidate_rkey();
        }
    }
}

/// Execute a memory window bind or a local invalidate posted on QP `qpn` of protection
/// domain `pd` (IBTA Vol. 1 §10.6.7.2, §10.6.7.3): its completion status.
pub(crate) fn execute_local(
    mrs: &MrTable,
    pd: Pd,
    qpn: QpNumber,
    op: super::wr::SendOp,
) -> WcStatus {
    use super::wr::SendOp;
    let r = match op {
        SendOp::BindMw { mw, rkey, info, .. } => match mrs.window(mw) {
            Some(w) => w.bind(mrs, pd, qpn, rkey, &info),
            None => Err(WcStatus::MwBindErr),
        },
        SendOp::LocalInv { rkey } => mrs.local_invalidate(pd, rkey),
        _ => Err(WcStatus::LocQpOpErr),
    };
    tracing::debug!(%qpn, ?op, ?r, "memory window operation");
    r.err().unwrap_or(WcStatus::Success)
}

/// `ibv_inc_rkey`: the same index (upper 24 bits), the next tag (low 8 bits, wrapping).
pub fn inc_rkey(k: RKey) -> RKey {
    RKey((k.0 & !0xff) | (k.0.wrapping_add(1) & 0xff))
}

/// The application's handle on a memory window (`struct ibv_mw`): see [`MwType`].
#[derive(Clone, Debug)]
pub struct MemoryWindow(pub(crate) Arc<MwShared>);

impl MemoryWindow {
    /// The R_Key of its last bind (at first, the one it was allocated with, bound to nothing).
    pub fn rkey(&self) -> RKey {
        self.0.rkey()
    }
    /// The R_Key the next bind gives it: `ibv_inc_rkey` of [`Self::rkey`] (the same index,
    /// the next tag).
    pub fn next_rkey(&self) -> RKey {
        inc_rkey(self.rkey())
    }
    /// Its index: the upper 24 bits every one of its R_Keys shares (what a bind request names
    /// it by).
    pub fn index(&self) -> u32 {
        self.0.index
    }
    /// Its type.
    pub fn kind(&self) -> MwType {
        self.0.kind
    }
    /// Its protection domain.
    pub fn pd(&self) -> Pd {
        self.0.pd
    }
    /// Whether it is bound with a key that works (not invalidated, its region registered).
    pub fn is_bound(&self) -> bool {
        self.0.is_valid()
    }
}

/// The device's registered memory regions, by local and by remote key, and its memory
/// windows, by the index their R_Keys share.
#[derive(Default)]
pub(crate) struct MrTable {
    by_lkey: KeyMap<Arc<MrShared>>,
    by_rkey: KeyMap<Arc<MrShared>>,
    windows: KeyMap<Arc<MwShared>>,
}

impl MrTable {
    /// The region or window binding an R_Key names (valid or not: the caller checks
    /// [`MrShared::rkey_valid`]).
    pub(crate) fn by_rkey(&self, k: RKey) -> Option<Arc<MrShared>> {
        match self.by_rkey.get(&k.0) {
            Some(m) => Some(m.clone()),
            None => self.windows.get(&(k.0 >> 8))?.current(k),
        }
    }
    /// The memory window whose R_Keys have index `index` (`rkey >> 8`).
    pub(crate) fn window(&self, index: u32) -> Option<&Arc<MwShared>> {
        self.windows.get(&index)
    }
    /// Whether a window or a region's key uses index `index` (the upper 24 bits of a key).
    pub(crate) fn index_taken(&self, index: u32) -> bool {
        self.windows.contains_key(&index)
            || self
                .by_lkey
                .keys()
                .chain(self.by_rkey.keys())
                .any(|k| k >> 8 == index)
    }
    /// Add a memory window (its index free: [`Self::index_taken`]).
    pub(crate) fn insert_window(&mut self, w: Arc<MwShared>) {
        self.windows.insert(w.index, w);
    }
    /// Remove the memory window of index `index`; its key stops working.
    pub(crate) fn remove_window(&mut self, index: u32) -> Option<Arc<MwShared>> {
        let w = self.windows.remove(&index)?;
        w.invalidate();
        Some(w)
    }
    /// How many memory windows exist.
    pub(crate) fn windows_len(&self) -> usize {
        self.windows.len()
    }
    /// `IBV_WR_LOCAL_INV` on a QP of protection domain `pd`: the type 2 window `k` names now
    /// is freed. `Err(LocQpOpErr)` (as rxe completes it) for a key that names no window of
    /// the PD bound with it, or a type 1 window.
    pub(crate) fn local_invalidate(&self, pd: Pd, k: RKey) -> Result<(), WcStatus> {
        match self.windows.get(&(k.0 >> 8)) {
            Some(w) if w.pd == pd && w.kind == MwType::Type2 && w.current(k).is_some() => {
                w.invalidate();
                Ok(())
            }
            _ => Err(WcStatus::LocQpOpErr),
        }
    }
    /// The region an L_Key names.
    pub(crate) fn lkey_ref(&self, k: LKey) -> Option<&Arc<MrShared>> {
        self.by_lkey.get(&k.0)
    }
    /// How many regions are registered.
    pub(crate) fn len(&self) -> usize {
        self.by_lkey.len()
    }
    /// Whether a region or a memory window of protection domain `pd` exists.
    pub(crate) fn any_of_pd(&self, pd: Pd) -> bool {
        self.by_lkey.values().any(|m| m.pd == pd) || self.windows.values().any(|w| w.pd == pd)
    }
    /// Whether `k` is in use as a local or a remote key, or its index by a memory window
    /// (whose keys take every value of the low 8 bits).
    pub(crate) fn contains_key(&self, k: u32) -> bool {
        self.by_lkey.contains_key(&k)
            || self.by_rkey.contains_key(&k)
            || self.windows.contains_key(&(k >> 8))
    }
    pub(crate) fn insert(&mut self, mr: Arc<MrShared>) {
        self.by_lkey.insert(mr.lkey.0, mr.clone());
        self.by_rkey.insert(mr.rkey.0, mr);
    }
    /// Remove the region with local key `lkey` (both keys stop resolving).
    pub(crate) fn remove(&mut self, lkey: LKey) -> Option<Arc<MrShared>> {
        let mr = self.by_lkey.remove(&lkey.0)?;
        self.by_rkey.remove(&mr.rkey.0);
        Some(mr)
    }
}

/// Gather `dst.len()` bytes starting at byte `off` of a scatter/gather list.
pub(crate) fn gather(
    mrs: &MrTable,
    sges: &[Sge],
    mut off: u64,
    dst: &mut [u8],
) -> Result<(), WcStatus> {
    let mut done = 0usize;
    for s in sges {
        if done == dst.len() {
            break;
        }
        let sl = u64::from(s.length);
        if off >= sl {
            off -= sl;
            continue;
        }
        let take = ((sl - off) as usize).min(dst.len() - done);
        let mr = mrs.lkey_ref(s.lkey).ok_or(WcStatus::LocProtErr)?;
        let mo = mr
            .offset_of(s.addr + off, take as u64)
            .ok_or(WcStatus::LocProtErr)?;
        if !mr.read_at(mo, &mut dst[done..done + take]) {
            return Err(WcStatus::LocProtErr);
        }
        done += take;
        off = 0;
    }
    if done == dst.len() {
        Ok(())
    } else {
        Err(WcStatus::LocLenErr)
    }
}

/// Scatter `src` into a scatter/gather list starting at byte `off`.
pub(crate) fn scatter(
    mrs: &MrTable,
    sges: &[Sge],
    mut off: u64,
    src: &[u8],
) -> Result<(), WcStatus> {
    let mut done = 0usize;
    for s in sges {
        if done == src.len() {
            break;
        }
        let sl = u64::from(s.length);
        if off >= sl {
            off -= sl;
            continue;
        }
        let take = ((sl - off) as usize).min(src.len() - done);
        let mr = mrs.lkey_ref(s.lkey).ok_or(WcStatus::LocProtErr)?;
        let mo = mr
            .offset_of(s.addr + off, take as u64)
            .ok_or(WcStatus::LocProtErr)?;
        if !mr.write_at(mo, &src[done..done + take]) {
            return Err(WcStatus::LocProtErr);
        }
        done += take;
        off = 0;
    }
    if done == src.len() {
        Ok(())
    } else {
        Err(WcStatus::LocLenErr)
    }
}

/// Gather a whole scatter/gather list for inline data: any registered MR, no protection-domain
/// or rights check (as libibverbs copies inline data).
pub(crate) fn gather_any(mrs: &MrTable, sges: &[Sge], dst: &mut [u8]) -> Result<(), WcStatus> {
    let mut at = 0usize;
    for s in sges {
        let n = s.length as usize;
        if n == 0 {
            continue;
        }
        let mr = mrs.lkey_ref(s.lkey).ok_or(WcStatus::LocProtErr)?;
        let o = mr.offset_of(s.addr, n as u64).ok_or(WcStatus::LocProtErr)?;
        if !mr.read_at(o, &mut dst[at..at + n]) {
            return Err(WcStatus::LocProtErr);
        }
        at += n;
    }
    Ok(())
}

/// Check a scatter/gather list against the MR table at post time: every non-empty entry names
/// a region of protection domain `pd` and lies inside it, and (`need_write`) the region grants
/// local write. The error is reported as a completion when the request is reached (IBTA: local
/// protection errors are detected while processing), not as a verb failure.
pub(crate) fn sge_error(mrs: &MrTable, pd: Pd, sges: &[Sge], need_write: bool) -> Option<WcStatus> {
    for s in sges.iter().filter(|s| s.length > 0) {
        let Some(mr) = mrs.lkey_ref(s.lkey) else {
            return Some(WcStatus::LocProtErr);
        };
        if mr.pd != pd || mr.offset_of(s.addr, u64::from(s.length)).is_none() {
            return Some(WcStatus::LocProtErr);
        }
        if need_write && !mr.access.contains(AccessFlags::LOCAL_WRITE) {
            return Some(WcStatus::LocProtErr);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mr(len: usize) -> MemoryRegion {
        MemoryRegion(Arc::new(MrShared::new(
            LKey(1),
            RKey(2),
            Pd(0),
            AccessFlags::all(),
            0x1000,
            len,
        )))
    }

    #[test]
    fn copy_in_copy_out_and_bounds() {
        let m = mr(16);
        m.write(4, &[1, 2, 3]).unwrap();
        let mut out = [0u8; 5];
        m.read(3, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3, 0]);
        assert!(m.write(14, &[0; 3]).is_err());
        assert!(m.read(usize::MAX, &mut [0u8; 2]).is_err());
        assert_eq!(m.0.offset_of(0x1004, 12), Some(4));
        assert_eq!(m.0.offset_of(0x1004, 13), None);
        assert_eq!(m.0.offset_of(0xfff, 1), None);
        assert_eq!(m.0.offset_of(u64::MAX, 2), None);
    }

    #[test]
    fn concurrent_writer_and_reader_are_ordered() {
        // A "device" thread writes whole 64-byte records; the application reads records while it
        // runs. With the lock, every record read is whole (all bytes equal), never torn.
        // Under miri (an interpreter, ~1000x slower) fewer rounds still interleave the threads.
        const ROUNDS: u32 = if cfg!(miri) { 10 } else { 200 };
        let m = mr(4096);
        let dev = m.clone();
        let writer = std::thread::spawn(move || {
            for round in 0..ROUNDS {
                for rec in 0..64 {
                    dev.write(rec * 64, &[(round % 251) as u8; 64]).unwrap();
                }
            }
        });
        for _ in 0..ROUNDS {
            m.with_bytes(|b| {
                for rec in b.chunks(64) {
                    assert!(rec.iter().all(|&x| x == rec[0]), "torn record");
                }
            });
        }
        writer.join().unwrap();
    }
}

#[cfg(test)]
mod window_tests {
    use super::*;

    /// A table with one region (local write, MW_BIND, 8 KiB at 0x10000) and one window.
    fn table(kind: MwType) -> (MrTable, Arc<MrShared>, Arc<MwShared>) {
        let mut t = MrTable::default();
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
        let mr = Arc::new(MrShared::new(
            LKey(0x100),
            RKey(0x200),
            Pd(1),
            access,
            0x10000,
            8192,
        ));
        t.insert(mr.clone());
        let mw = Arc::new(MwShared::new(Pd(1), kind, RKey(0xabcd_ef07)));
        t.insert_window(mw.clone());
        (t, mr, mw)
    }

    fn info(mr: Option<LKey>, addr: u64, length: u64, zero_based: bool) -> MwBindInfo {
        MwBindInfo {
            mr,
            addr,
            length,
            access: AccessFlags::REMOTE_READ,
            zero_based,
        }
    }

    #[test]
    fn only_the_current_key_of_a_window_resolves_and_only_to_its_bytes() {
        let (t, mr, mw) = table(MwType::Type1);
        assert!(
            t.by_rkey(RKey(0xabcd_ef07)).is_none(),
            "bound to nothing yet"
        );
        let q = QpNumber::new(0x11);
        mw.bind(
            &t,
            Pd(1),
            q,
            RKey(0xabcd_ef08),
            &info(Some(LKey(0x100)), 0x10100, 16, false),
        )
        .unwrap();
        mr.write_at(0x100, b"0123456789abcdefXYZ");
        let w = t.by_rkey(RKey(0xabcd_ef08)).expect("the new key");
        assert!(t.by_rkey(RKey(0xabcd_ef09)).is_none() && t.by_rkey(RKey(0xabcd_ef07)).is_none());
        let mut b = [0u8; 16];
        assert!(w.read_at(w.offset_of(0x10100, 16).unwrap(), &mut b));
        assert_eq!(&b, b"0123456789abcdef");
        // Its bounds are its own, not the region's.
        assert!(w.offset_of(0x10100, 17).is_none());
        assert!(!w.read_at(1, &mut b) && !w.write_at(8, &b) && w.update8_at(9, |v| v).is_none());
        assert_eq!(w.bound_qp, None, "a type 1 window is the PD's");
        // Rebinding (type 1) ends the old key at once; unbinding ends the new one.
        mw.bind(
            &t,
            Pd(1),
            q,
            RKey(0xabcd_ef09),
            &info(Some(LKey(0x100)), 0x10000, 8, false),
        )
        .unwrap();
        assert!(!w.rkey_valid());
        let w2 = t.by_rkey(RKey(0xabcd_ef09)).unwrap();
        mw.bind(&t, Pd(1), q, RKey(0xabcd_ef0a), &info(None, 0, 0, false))
            .unwrap();
        assert!(!w2.rkey_valid() && !mw.is_valid());
        assert!(t.by_rkey(RKey(0xabcd_ef0a)).is_none());
    }

    #[test]
    fn a_zero_based_window_names_its_bytes_from_address_zero() {
        let (t, mr, mw) = table(MwType::Type2);
        let q = QpNumber::new(0x12);
        mw.bind(
            &t,
            Pd(1),
            q,
            RKey(0xabcd_ef10),
            &info(Some(LKey(0x100)), 0x11000, 64, true),
        )
        .unwrap();
        mr.write_at(0x1000, b"zero-based");
        let w = t.by_rkey(RKey(0xabcd_ef10)).unwrap();
        assert_eq!(w.offset_of(0, 10), Some(0));
        assert!(w.offset_of(0x11000, 1).is_none());
        let mut b = [0u8; 10];
        assert!(w.read_at(0, &mut b));
        assert_eq!(&b, b"zero-based");
        assert_eq!(w.bound_qp, Some(q));
        // Type 2: unbinding is not a bind; a local invalidate of another tag changes nothing.
        assert!(mw
            .bind(&t, Pd(1), q, RKey(0xabcd_ef11), &info(None, 0, 0, false))
            .is_err());
        assert!(t.local_invalidate(Pd(1), RKey(0xabcd_ef11)).is_err());
        assert!(t.local_invalidate(Pd(2), RKey(0xabcd_ef10)).is_err());
        t.local_invalidate(Pd(1), RKey(0xabcd_ef10)).unwrap();
        assert!(!w.rkey_valid() && !mw.is_valid());
    }

    #[test]
    fn a_window_index_is_never_a_region_key_index() {
        let (mut t, _mr, mw) = table(MwType::Type2);
        assert!(t.index_taken(0xab_cdef) && t.index_taken(0x1) && t.index_taken(0x2));
        assert!(!t.index_taken(0x3));
        assert!(t.contains_key(0xabcd_ef00) && t.contains_key(0xabcd_efff));
        assert!(t.any_of_pd(Pd(1)));
        t.remove_window(mw.index);
        assert!(!t.index_taken(0xab_cdef));
    }
}
