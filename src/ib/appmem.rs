//! Memory regions on memory the application owns: what `ibv_reg_mr(pd, addr, length, access)`
//! registers, the one place outside `io::sys` (and the C-ABI crate) where ferroce uses
//! `unsafe`.
//!
//! A hardware RNIC reads and writes registered memory by DMA while the application keeps its
//! own pointer to it; there is no copy between "the NIC's buffer" and "the application's
//! buffer". [`AppMemory`] gives the engine the same: a pointer and a length handed over by the
//! caller, turned into byte slices only inside a region's lock (see [`super::mr`]) and only
//! while the region is registered.
//!
//! # Safety argument
//!
//! 1. **Validity** is the caller's promise, made once, in the `unsafe` constructor
//!    [`AppMemory::new`]: `len` bytes at `ptr` are readable and writable, and stay so until the
//!    region is deregistered ([`crate::verbs::Device::dereg_mr`] returns) or, if it never is,
//!    until the device and every [`super::MemoryRegion`] handle of it are dropped. This is
//!    the contract of `ibv_reg_mr` (the memory must stay valid until `ibv_dereg_mr`).
//! 2. **No access after deregistration.** Every access goes through `Memory`, held in the
//!    region's `RwLock`. Deregistration takes the write lock (so it waits for an access in
//!    progress, which is one packet's copy or one atomic) and replaces the memory with
//!    `Memory::Gone`; every later access finds no bytes and fails (a protection error, a
//!    counted drop), whoever still holds the region (a responder's saved READ, a posted WQE).
//!    So the caller may free the memory as soon as `dereg_mr` returns.
//! 3. **No aliasing inside Rust.** A slice over the memory lives only inside one lock guard:
//!    shared (`&[u8]`) under the read lock, exclusive (`&mut [u8]`) under the write lock, never
//!    both, never escaping the guard (the accessors take closures or copy).
//! 4. **Concurrent access by the application** (its own loads and stores while a remote WRITE
//!    lands) is outside what Rust can order, exactly as with DMA from a hardware NIC: the verbs
//!    contract says the contents are undefined until the completion, and ferroce does not read
//!    back what it wrote to make any decision (no value read from application memory steers
//!    control flow except the operands of an ATOMIC, which a hardware NIC also reads racily).
//!
//! # On-demand paging
//!
//! [`OnDemandMemory`] is what `ibv_reg_mr(…, IBV_ACCESS_ON_DEMAND)` registers: a range of the
//! process's address space whose pages need not exist when it is registered and may come and
//! go while it is (memory `malloc`ed or `mmap`ed later, or unmapped: an *implicit* region
//! covers the whole address space). An RNIC with ODP takes a page fault when it meets a page
//! that is not there and fails the access if the fault cannot be resolved. ferroce never
//! forms a pointer or a slice over such memory: every access is a `process_vm_readv` or
//! `process_vm_writev` on the process itself, which the kernel performs page by page with the
//! mapping's own protections and which fails with `EFAULT` instead of a fault where a page is
//! missing, read-only (for a write) or not accessible — the access then fails like any other
//! (a remote access error NAK, a local protection error completion). So no promise about the
//! pages' validity is needed; what [`OnDemandMemory::new`]'s caller promises is only that
//! ferroce may read and write whatever is mapped in the range while it is registered (memory
//! that Rust code holds `&`/`&mut` references to must not be in it, as for any DMA).
#![allow(unsafe_code)]

use std::ptr::NonNull;

/// Memory the application owns and registers (see the module's safety argument).
pub struct AppMemory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `AppMemory` is a pointer to bytes (no thread affinity); every access to the bytes is
// serialised by the region's `RwLock` (point 3 of the module's argument), so moving the handle
// to, or sharing it with, the engine thread is sound.
unsafe impl Send for AppMemory {}
// SAFETY: as for `Send`: `&AppMemory` gives no access to the bytes except through the lock.
unsafe impl Sync for AppMemory {}

impl std::fmt::Debug for AppMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AppMemory({:p}, {} bytes)", self.ptr, self.len)
    }
}

impl AppMemory {
    /// `len` bytes at `ptr`, owned by the caller. `None` if `ptr` is null, or if the range would
    /// wrap around the address space or exceed `isize::MAX` bytes (what a slice may span).
    ///
    /// # Safety
    /// The caller promises that `len` bytes at `ptr` are valid for reads and writes, and stay
    /// valid until the region registered with them is deregistered
    /// ([`crate::verbs::Device::dereg_mr`] has returned) or, if it never is, until the device
    /// and every [`super::MemoryRegion`] handle of the region are dropped. The application may
    /// keep using the memory meanwhile (its contents are then those of any RNIC's memory under
    /// DMA: undefined while an operation on them is in flight).
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Option<AppMemory> {
        let ptr = NonNull::new(ptr)?;
        if len > isize::MAX as usize || (ptr.as_ptr() as usize).checked_add(len).is_none() {
            return None;
        }
        Some(AppMemory { ptr, len })
    }

    /// A `'static` buffer the caller hands over for good (for example a leaked `Vec` or a
    /// mapping that is never unmapped): no `unsafe` needed, the borrow checker has the proof.
    pub fn from_static(buf: &'static mut [u8]) -> AppMemory {
        AppMemory {
            // A slice's pointer is never null (dangling but non-null when empty).
            ptr: NonNull::from(&mut *buf).cast(),
            len: buf.len(),
        }
    }

    /// The address of the first byte.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A range of the process's address space registered on demand (see the module's section on
/// on-demand paging): its pages may be missing at registration and come and go afterwards;
/// every access is a system call that fails where a page is not there.
pub struct OnDemandMemory {
    addr: u64,
    len: u64,
    /// A buffer this value allocated itself ([`OnDemandMemory::allocate`]), freed on drop;
    /// `false` for the application's memory.
    owned: bool,
}

impl Drop for OnDemandMemory {
    fn drop(&mut self) {
        if self.owned {
            let raw = std::ptr::slice_from_raw_parts_mut(
                self.addr as usize as *mut u8,
                self.len as usize,
            );
            // SAFETY: `allocate` made this pointer and length with `Box::into_raw` of a boxed
            // slice and nothing else frees it; the bytes were reached only through
            // process_vm_* (no reference into them exists), and this runs once, when the
            // region lets the memory go.
            drop(unsafe { Box::from_raw(raw) });
        }
    }
}

impl std::fmt::Debug for OnDemandMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OnDemandMemory({:#x}, {} bytes)", self.addr, self.len)
    }
}

/// The most bytes one `process_vm_*` call is given (the kernel caps one call's work as well).
const ODP_CHUNK: usize = 1 << 20;

impl OnDemandMemory {
    /// `len` bytes of the address space from `addr` (`0` and `u64::MAX` for the whole of it:
    /// an implicit region). `None` for an empty range or one that wraps around.
    ///
    /// # Safety
    /// While the region registered with it stays registered, ferroce may read and write any
    /// byte of the range that is mapped (with the mapping's protections); the caller makes
    /// sure no Rust reference (`&`/`&mut`) covers bytes of the range that way (memory the
    /// application manages itself: a C program's buffers, an `mmap` of its own). Nothing is
    /// promised about which pages are mapped: a missing page fails the access, it is not
    /// touched.
    pub unsafe fn new(addr: u64, len: u64) -> Option<OnDemandMemory> {
        if len == 0 || addr.checked_add(len - 1).is_none() {
            return None;
        }
        Some(OnDemandMemory {
            addr,
            len,
            owned: false,
        })
    }

    /// `len` bytes (at least 1) of memory allocated for the region and filled with `fill`,
    /// reached like the application's (through `process_vm_*`) and freed when the region
    /// lets it go: no promise needed (tests and fuzzing of the on-demand path).
    pub fn allocate(len: usize, fill: u8) -> OnDemandMemory {
        let b = vec![fill; len.max(1)].into_boxed_slice();
        let len = b.len() as u64;
        // From here on the bytes are reached only through this value (process_vm_* and the
        // final `Box::from_raw` in `drop`).
        let addr = Box::into_raw(b) as *mut u8 as usize as u64;
        OnDemandMemory {
            addr,
            len,
            owned: true,
        }
    }

    /// The first address of the range.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Its length in bytes (`u64::MAX` for an implicit region).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it has no bytes (never: the constructor refuses an empty range).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of byte `off`, if `off + n` bytes lie inside the range.
    fn at(&self, off: usize, n: usize) -> Option<u64> {
        let end = (off as u64).checked_add(n as u64)?;
        (end <= self.len).then(|| self.addr + off as u64)
    }

    /// Copy the bytes at offset `off` into `dst`; false if any of them is outside the range or
    /// not readable (a missing page).
    fn read(&self, off: usize, dst: &mut [u8]) -> bool {
        let n = dst.len();
        // SAFETY: `dst` is `n` bytes this function holds exclusively, for the kernel to write.
        unsafe { self.copy(off, dst.as_mut_ptr(), n, libc::process_vm_readv) }
    }

    /// Copy `src` into the range at offset `off`; false if any byte is outside the range or
    /// not writable (a missing or read-only page); bytes before such a page may be written.
    fn write(&self, off: usize, src: &[u8]) -> bool {
        // SAFETY: `src` is `src.len()` readable bytes; process_vm_writev only reads the local
        // buffer (its iovec is not const in C).
        unsafe {
            self.copy(
                off,
                src.as_ptr().cast_mut(),
                src.len(),
                libc::process_vm_writev,
            )
        }
    }

    /// `len` bytes between the local buffer at `buf` and the range at `off`, by `op`
    /// (`process_vm_readv`: into the buffer; `process_vm_writev`: out of it), in chunks of at
    /// most [`ODP_CHUNK`]; false if any chunk is not copied whole.
    ///
    /// # Safety
    /// `buf` is valid for `len` bytes: for writes with `process_vm_readv`, for reads with
    /// `process_vm_writev`, and nothing else accesses them meanwhile.
    unsafe fn copy(
        &self,
        off: usize,
        buf: *mut u8,
        len: usize,
        op: unsafe extern "C" fn(
            libc::pid_t,
            *const libc::iovec,
            libc::c_ulong,
            *const libc::iovec,
            libc::c_ulong,
            libc::c_ulong,
        ) -> isize,
    ) -> bool {
        let Some(addr) = self.at(off, len) else {
            return false;
        };
        (0..len).step_by(ODP_CHUNK).all(|done| {
            let n = (len - done).min(ODP_CHUNK);
            // SAFETY: the local iovec is `n` bytes of the caller's buffer (valid as this
            // function's contract says), `done + n <= len`; the remote one is an address of
            // this very process, which the kernel reads or writes through its page tables
            // with the mapping's protections (EFAULT where a page is missing or, for a write,
            // read-only: no access is made through a pointer here). The range's contract
            // (`new`) lets ferroce read and write what is mapped there, and no Rust reference
            // covers it.
            let got = unsafe {
                let local = libc::iovec {
                    iov_base: buf.add(done).cast(),
                    iov_len: n,
                };
                let remote = libc::iovec {
                    iov_base: (addr + done as u64) as usize as *mut libc::c_void,
                    iov_len: n,
                };
                op(libc::getpid(), &local, 1, &remote, 1, 0)
            };
            got == n as isize
        })
    }

    /// Whether every page of the `n` bytes at offset `off` is there to read, touching one byte
    /// of each (a READ response is checked this way before it is built, so that a missing page
    /// is answered with a NAK rather than found while the packet is framed).
    fn present(&self, off: usize, n: usize) -> bool {
        if n == 0 {
            return self.at(off, 0).is_some();
        }
        let Some(first) = self.at(off, n) else {
            return false;
        };
        // SAFETY: sysconf has no preconditions.
        let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64).max(4096);
        let last = first + (n as u64 - 1);
        // The first byte, then the first byte of every later page up to the last byte.
        let later = (first & !(page - 1))
            .checked_add(page)
            .map(|p| (p..=last).step_by(page as usize));
        let mut addrs = std::iter::once(first).chain(later.into_iter().flatten());
        let mut sink = [0u8; 64];
        loop {
            let mut remote = [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 1,
            }; 64];
            let mut k = 0;
            for a in addrs.by_ref().take(64) {
                remote[k].iov_base = a as usize as *mut libc::c_void;
                k += 1;
            }
            if k == 0 {
                return true;
            }
            // SAFETY: the local iovec is `sink`, this function's own (k <= 64 bytes); the
            // remote ones are addresses of this process read by the kernel through its page
            // tables (EFAULT where a page is missing), one byte each, as in `read`.
            let got = unsafe {
                let local = libc::iovec {
                    iov_base: sink.as_mut_ptr().cast(),
                    iov_len: k,
                };
                libc::process_vm_readv(libc::getpid(), &local, 1, remote.as_ptr(), k as u64, 0)
            };
            if got != k as isize {
                return false;
            }
        }
    }
}

/// The application memory a region can be registered on: pinned (valid throughout, used in
/// place) or on demand (pages found at each access).
#[derive(Debug)]
pub enum UserMemory {
    /// `ibv_reg_mr` without `IBV_ACCESS_ON_DEMAND`.
    Pinned(AppMemory),
    /// `ibv_reg_mr` with `IBV_ACCESS_ON_DEMAND`.
    OnDemand(OnDemandMemory),
}

impl UserMemory {
    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            UserMemory::Pinned(m) => m.len() as u64,
            UserMemory::OnDemand(m) => m.len(),
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether it is an implicit on-demand region (the whole address space).
    pub fn is_implicit(&self) -> bool {
        matches!(self, UserMemory::OnDemand(m) if m.addr == 0 && m.len == u64::MAX)
    }
}

impl From<AppMemory> for UserMemory {
    fn from(m: AppMemory) -> Self {
        UserMemory::Pinned(m)
    }
}

impl From<OnDemandMemory> for UserMemory {
    fn from(m: OnDemandMemory) -> Self {
        UserMemory::OnDemand(m)
    }
}

/// The bytes behind a memory region: owned by the region, owned by the application (pinned or
/// on demand), or gone (deregistered application memory: no bytes, every access fails).
pub(crate) enum Memory {
    /// Allocated by the device for the region (`Device::reg_mr`).
    Owned(Box<[u8]>),
    /// The application's own memory (`Device::reg_mr_app`).
    App(AppMemory),
    /// The application's address space, on demand: never seen as a slice.
    OnDemand(OnDemandMemory),
    /// Application memory after deregistration.
    Gone,
}

impl From<UserMemory> for Memory {
    fn from(m: UserMemory) -> Self {
        match m {
            UserMemory::Pinned(m) => Memory::App(m),
            UserMemory::OnDemand(m) => Memory::OnDemand(m),
        }
    }
}

impl Memory {
    /// Copy the bytes at `off` into `dst` (the region's read lock held); false if the range
    /// is outside the memory, or the memory is gone or (on demand) not there.
    pub(crate) fn read_at(&self, off: usize, dst: &mut [u8]) -> bool {
        if let Memory::OnDemand(m) = self {
            return m.read(off, dst);
        }
        match self
            .get()
            .and_then(|b| b.get(off..off.checked_add(dst.len())?))
        {
            Some(src) => {
                dst.copy_from_slice(src);
                true
            }
            None => false,
        }
    }

    /// Copy `src` into the memory at `off` (the region's write lock held); false as for
    /// [`Self::read_at`].
    pub(crate) fn write_at(&mut self, off: usize, src: &[u8]) -> bool {
        if let Memory::OnDemand(m) = self {
            return m.write(off, src);
        }
        match self
            .get_mut()
            .and_then(|b| b.get_mut(off..off.checked_add(src.len())?))
        {
            Some(dst) => {
                dst.copy_from_slice(src);
                true
            }
            None => false,
        }
    }

    /// Whether the `n` bytes at `off` are all there to read: on-demand memory has each of
    /// their pages mapped now, other memory is not gone.
    pub(crate) fn present(&self, off: usize, n: usize) -> bool {
        match self {
            Memory::OnDemand(m) => m.present(off, n),
            Memory::Gone => false,
            _ => true,
        }
    }

    /// Replace the 8 bytes at `off` by `f` of them (the region's write lock held): their old
    /// value, or `None` as for [`Self::read_at`] (nothing is written then).
    pub(crate) fn update8_at(
        &mut self,
        off: usize,
        f: impl FnOnce([u8; 8]) -> [u8; 8],
    ) -> Option<[u8; 8]> {
        let mut cur = [0u8; 8];
        if !self.read_at(off, &mut cur) {
            return None;
        }
        self.write_at(off, &f(cur)).then_some(cur)
    }

    /// The bytes, to read. Only called with the region's read (or write) lock held. `None`
    /// for memory that is gone and for on-demand memory (never seen as a slice).
    pub(crate) fn get(&self) -> Option<&[u8]> {
        match self {
            Memory::Owned(b) => Some(b),
            // SAFETY: the caller's promise (AppMemory::new) makes `len` bytes at `ptr` valid
            // while the memory is registered, which it is while this is not `Gone` (point 2);
            // `&self` comes from the region's lock guard, under which no `&mut` exists
            // (point 3).
            Memory::App(m) => Some(unsafe { std::slice::from_raw_parts(m.ptr.as_ptr(), m.len) }),
            Memory::OnDemand(_) | Memory::Gone => None,
        }
    }

    /// The bytes, to write. Only called with the region's write lock held.
    pub(crate) fn get_mut(&mut self) -> Option<&mut [u8]> {
        match self {
            Memory::Owned(b) => Some(b),
            // SAFETY: valid as in `get`; `&mut self` comes from the write guard, so this is the
            // only slice over the bytes in Rust while it lives (point 3).
            Memory::App(m) => {
                Some(unsafe { std::slice::from_raw_parts_mut(m.ptr.as_ptr(), m.len) })
            }
            Memory::OnDemand(_) | Memory::Gone => None,
        }
    }

    /// Whether this is the application's memory (pinned or on demand).
    pub(crate) fn is_app(&self) -> bool {
        matches!(self, Memory::App(_) | Memory::OnDemand(_))
    }

    /// Whether this is on-demand memory.
    pub(crate) fn is_on_demand(&self) -> bool {
        matches!(self, Memory::OnDemand(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_null_and_wrapping_ranges() {
        // SAFETY: nothing is accessed: the constructor refuses these before keeping them.
        unsafe {
            assert!(AppMemory::new(std::ptr::null_mut(), 8).is_none());
            assert!(AppMemory::new(usize::MAX as *mut u8, 2).is_none());
            assert!(AppMemory::new(8 as *mut u8, usize::MAX - 4).is_none());
        }
    }

    #[test]
    fn reads_and_writes_the_callers_bytes_until_gone() {
        let mut buf = vec![7u8; 64];
        // SAFETY: `buf` outlives `mem` and is not touched while `mem` is in use.
        let mut mem = Memory::App(unsafe { AppMemory::new(buf.as_mut_ptr(), buf.len()) }.unwrap());
        assert!(mem.is_app());
        assert_eq!(mem.get().unwrap()[10], 7);
        mem.get_mut().unwrap()[3..6].copy_from_slice(b"abc");
        mem = Memory::Gone;
        assert!(mem.get().is_none() && mem.get_mut().is_none());
        assert_eq!(&buf[2..7], &[7, b'a', b'b', b'c', 7]);
    }

    #[test]
    fn static_buffer_needs_no_unsafe() {
        let buf: &'static mut [u8] = Box::leak(vec![1u8; 16].into_boxed_slice());
        let a = AppMemory::from_static(buf);
        assert_eq!((a.len(), a.is_empty()), (16, false));
        let mut m = Memory::App(a);
        m.get_mut().unwrap()[0] = 9;
        assert_eq!(m.get().unwrap()[..2], [9, 1]);
    }

    /// A device at 10.0.0.`i` with a PD, a CQ and an RC QP (16 WRs, one SGE each way).
    fn test_device(
        i: u8,
    ) -> (
        crate::verbs::Device,
        crate::verbs::Pd,
        crate::verbs::Cq,
        crate::wire::QpNumber,
    ) {
        use crate::verbs::*;
        let cfg = DeviceConfig::new(
            crate::wire::MacAddr([2, 0, 0, 0, 0, i]),
            std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, i)),
        )
        .with_seed(u64::from(i));
        let mut dev = Device::new(cfg);
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(64).unwrap();
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = dev.create_qp(QpInitAttr::new(pd, cq, cq, cap)).unwrap();
        (dev, pd, cq, qp)
    }

    /// Two devices over a perfect in-test link, each with a region on a buffer of the test's
    /// own: a WRITE from one buffer lands in the other buffer itself (no copy to fetch it
    /// from), a READ brings bytes back, and after `dereg_mr` the engine touches the memory no
    /// more (the rest of a WRITE in flight writes nothing). Under miri this also checks that
    /// no access uses the memory outside the caller's promise.
    #[test]
    fn devices_use_the_callers_buffers_in_place_until_dereg() {
        use crate::time::Instant;
        use crate::verbs::*;
        let mk = test_device;
        let (mut a, pa, cqa, qa) = mk(1);
        let (mut b, pb, _, qb) = mk(2);
        let p = RcParams {
            mtu: Mtu::M256,
            ..RcParams::default()
        };
        let (ra, rb) = (
            a.local_end(qa, 0, 0).unwrap(),
            b.local_end(qb, 0, 0).unwrap(),
        );
        a.connect_rc(qa, &rb, &p).unwrap();
        b.connect_rc(qb, &ra, &p).unwrap();
        let mut now = Instant::from_nanos(1_000_000);
        let mut frame = vec![0u8; 2048];
        let mut hop = |from: &mut Device, to: &mut Device, now: Instant| {
            let mut v = Vec::new();
            while let Some(n) = from.poll_transmit(now, &mut frame).unwrap() {
                v.push(frame[..n].to_vec());
            }
            for f in &v {
                to.handle_frame(now, f);
            }
            v.len()
        };
        let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        let mut src: Vec<u8> = (0..2048u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut dst = vec![0u8; 2048];
        // SAFETY: both buffers outlive their registrations (deregistered below, before the
        // test reads them) and the test does not touch them meanwhile.
        let (ms, md) = unsafe {
            (
                AppMemory::new(src.as_mut_ptr(), src.len()).unwrap(),
                AppMemory::new(dst.as_mut_ptr(), dst.len()).unwrap(),
            )
        };
        let src_addr = ms.addr();
        let ma = a.reg_mr_app(pa, ms, src_addr, all).unwrap();
        // B's buffer is named by an I/O virtual address of its own (ibv_reg_mr_iova2).
        let mb = b.reg_mr_app(pb, md, 0x1_0000, all).unwrap();
        assert!(ma.is_app_memory() && mb.is_app_memory());
        assert_eq!((ma.addr(), mb.addr(), mb.len()), (src_addr, 0x1_0000, 2048));
        let wr = |id, op, off: u64, len| {
            SendWr::new(
                id,
                op,
                vec![Sge {
                    addr: ma.addr() + off,
                    length: len,
                    lkey: ma.lkey(),
                }],
            )
        };
        let write = |off: u64| SendOp::RdmaWrite {
            remote_addr: mb.addr() + off,
            rkey: mb.rkey(),
        };
        let settle =
            |a: &mut Device,
             b: &mut Device,
             now: &mut Instant,
             hop: &mut dyn FnMut(&mut Device, &mut Device, Instant) -> usize| {
                for _ in 0..100 {
                    *now += crate::time::Duration::from_micros(10);
                    a.handle_timeout(*now);
                    b.handle_timeout(*now);
                    if hop(a, b, *now) + hop(b, a, *now) == 0 {
                        break;
                    }
                }
            };
        a.post_send(qa, wr(1, write(0), 0, 1024)).unwrap();
        settle(&mut a, &mut b, &mut now, &mut hop);
        // A READ of 300 bytes at B's offset 10 into A's buffer at 1100.
        let read = SendOp::RdmaRead {
            remote_addr: mb.addr() + 10,
            rkey: mb.rkey(),
        };
        a.post_send(qa, wr(2, read, 1100, 300)).unwrap();
        settle(&mut a, &mut b, &mut now, &mut hop);
        let mut wcs = Vec::new();
        a.poll_cq(cqa, &mut wcs, 8).unwrap();
        assert_eq!(wcs.len(), 2);
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
        // A 4-packet WRITE at 1024: two packets land, then B deregisters.
        a.post_send(qa, wr(3, write(1024), 1024, 1024)).unwrap();
        let mut w = Vec::new();
        while let Some(n) = a.poll_transmit(now, &mut frame).unwrap() {
            w.push(frame[..n].to_vec());
        }
        assert_eq!(w.len(), 4);
        b.handle_frame(now, &w[0]);
        b.handle_frame(now, &w[1]);
        b.dereg_mr(&mb).unwrap();
        assert!(!mb.is_app_memory(), "released at dereg");
        assert_eq!(mb.read(0, &mut [0u8; 4]), Err(MrError::Gone));
        b.handle_frame(now, &w[2]);
        b.handle_frame(now, &w[3]);
        a.dereg_mr(&ma).unwrap();
        drop((ma, mb, a, b));
        // What the buffers hold, read by their owner.
        assert_eq!(dst[..1024], src[..1024], "WRITE placed in B's own buffer");
        assert_eq!(
            src[1100..1400],
            dst[10..310],
            "READ placed in A's own buffer"
        );
        assert_eq!(
            dst[1024..1536],
            src[1024..1536],
            "the two packets before dereg"
        );
        assert!(dst[1536..].iter().all(|&x| x == 0), "written after dereg");
    }

    /// An anonymous mapping of `pages` pages, read-write, and the page size.
    #[cfg(not(miri))]
    fn map(pages: usize) -> (u64, usize) {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        // SAFETY: a fresh private anonymous mapping chosen by the kernel: no existing memory is
        // affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                pages * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        (p as u64, page)
    }

    /// Give back `len` bytes at `at` (memory of a [`map`] of this test, no reference into it).
    #[cfg(not(miri))]
    fn release(at: u64, len: usize) {
        // SAFETY: the range is part of a mapping this test made and holds no reference into.
        assert_eq!(
            unsafe { libc::munmap(at as usize as *mut libc::c_void, len) },
            0
        );
    }

    /// Replace `len` bytes at `at` (a range of a [`map`] of this test) by a fresh mapping with
    /// `prot`.
    #[cfg(not(miri))]
    fn map_at(at: u64, len: usize, prot: libc::c_int) {
        // SAFETY: MAP_FIXED over a range this test mapped itself and holds no reference into.
        let p = unsafe {
            libc::mmap(
                at as usize as *mut libc::c_void,
                len,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        assert_eq!(p as u64, at);
    }

    /// Make `len` bytes at `at` a hole: no page to read or write, as unmapped memory, but kept
    /// reserved (a fresh `PROT_NONE` mapping) so that no other test's mapping, running in
    /// another thread of this process, can take the range meanwhile.
    #[cfg(not(miri))]
    fn unmap(at: u64, len: usize) {
        map_at(at, len, libc::PROT_NONE);
    }

    /// Map a fresh zeroed page (or pages) at `at` again, read-write.
    #[cfg(not(miri))]
    fn remap(at: u64, len: usize) {
        map_at(at, len, libc::PROT_READ | libc::PROT_WRITE);
    }

    /// Read `n` bytes of this test's own mapping at `at`.
    #[cfg(not(miri))]
    fn peek(at: u64, n: usize) -> Vec<u8> {
        // SAFETY: `n` mapped, readable bytes of a mapping of this test, nothing writing them now.
        unsafe { std::slice::from_raw_parts(at as usize as *const u8, n) }.to_vec()
    }

    /// On-demand memory is reached page by page: a missing page fails the access (no fault),
    /// a read-only page refuses writes only, a page mapped after registration is used, an
    /// access across the 1 MiB chunk is whole, and the range's bounds hold.
    #[test]
    #[cfg_attr(miri, ignore = "process_vm_readv is not supported under miri")]
    fn on_demand_memory_follows_the_mapping() {
        #[cfg(not(miri))]
        {
            let pages = (2 << 20) / 4096 + 4;
            let (base, page) = map(pages);
            let len = pages * page;
            // SAFETY: the mapping is this test's and no reference covers it.
            let od = unsafe { OnDemandMemory::new(base, len as u64) }.unwrap();
            let mut m = Memory::from(UserMemory::from(od));
            assert!(m.is_app() && m.is_on_demand() && m.get().is_none());
            assert!(m.write_at(10, b"hello"));
            assert_eq!(peek(base + 10, 5), b"hello");
            let mut out = [0u8; 5];
            assert!(m.read_at(10, &mut out) && &out == b"hello");
            // Across the first 1 MiB chunk's end, in one access.
            let big: Vec<u8> = (0..(1 << 20) + 5000).map(|i| (i % 253) as u8).collect();
            assert!(m.write_at(100, &big));
            let mut back = vec![0u8; big.len()];
            assert!(m.read_at(100, &mut back) && back == big);
            // Outside the range: refused before any system call.
            assert!(!m.read_at(len - 2, &mut out) && !m.write_at(len, b"x"));
            // A page unmapped: both directions fail, neighbours still work.
            let hole = base + page as u64;
            unmap(hole, page);
            assert!(!m.write_at(page + 1, b"x") && !m.read_at(page - 2, &mut out));
            assert!(m.write_at(page - 2, b"ab") && m.write_at(len - page, b"cd"));
            // `present` touches one byte per page, 64 pages per call: the hole is seen from
            // any range that covers a byte of it, and not from the others.
            assert!(m.present(0, page) && m.present(2 * page, len - 2 * page));
            assert!(!m.present(0, len) && !m.present(page - 1, 2) && !m.present(page + 7, 1));
            assert!(m.present(page, 0) && !m.present(len, 1));
            assert!(!Memory::Gone.present(0, 1));
            // Mapped again (fresh, zeroed): used as it is now.
            remap(hole, page);
            assert!(m.read_at(page, &mut out) && out == [0; 5]);
            assert!(m.write_at(page, b"again"));
            assert_eq!(peek(hole, 5), b"again");
            // Read-only: reads work, writes fail and change nothing; an atomic too.
            // SAFETY: a page of this test's mapping, no reference into it.
            assert_eq!(
                unsafe {
                    libc::mprotect(hole as usize as *mut libc::c_void, page, libc::PROT_READ)
                },
                0
            );
            assert!(m.read_at(page, &mut out) && &out == b"again");
            assert!(!m.write_at(page, b"X"));
            assert_eq!(m.update8_at(page, |_| [9; 8]), None);
            assert_eq!(peek(hole, 5), b"again");
            // An atomic where the page is writable: the old value comes back.
            assert_eq!(
                m.update8_at(len - page, |v| {
                    let mut v = v;
                    v[0] += 1;
                    v
                }),
                Some([b'c', b'd', 0, 0, 0, 0, 0, 0])
            );
            assert_eq!(peek(base + (len - page) as u64, 2), b"dd");
            m = Memory::Gone;
            assert!(!m.read_at(0, &mut out));
            release(base, len);
        }
    }

    /// Memory an on-demand region allocates for itself: filled, read and written through the
    /// region like the application's, gone (and freed) at deregistration.
    #[test]
    #[cfg_attr(miri, ignore = "process_vm_readv is not supported under miri")]
    fn allocated_on_demand_memory_is_the_regions_until_dereg() {
        let (mut dev, pd, _, _) = test_device(1);
        let mem = OnDemandMemory::allocate(10_000, 0x5a);
        let (addr, len) = (mem.addr(), mem.len());
        assert_eq!(len, 10_000);
        let all = crate::verbs::AccessFlags::LOCAL_WRITE | crate::verbs::AccessFlags::REMOTE_WRITE;
        let mr = dev.reg_mr_app(pd, mem, addr, all).unwrap();
        assert!(mr.is_on_demand());
        let mut b = [0u8; 4];
        mr.read(9_996, &mut b).unwrap();
        assert_eq!(b, [0x5a; 4]);
        mr.write(100, b"odp!").unwrap();
        mr.read(100, &mut b).unwrap();
        assert_eq!(&b, b"odp!");
        assert!(mr.read(9_998, &mut b).is_err());
        dev.dereg_mr(&mr).unwrap();
        assert!(!mr.is_on_demand() && mr.read(0, &mut b).is_err());
        assert_eq!(OnDemandMemory::allocate(0, 1).len(), 1);
    }

    #[test]
    fn on_demand_ranges_are_checked() {
        // Memory a region allocates is freed on drop (under miri: exactly once, no leak).
        let a = OnDemandMemory::allocate(64, 1);
        assert_eq!((a.len(), a.is_empty()), (64, false));
        assert!(!UserMemory::from(a).is_implicit());
        // SAFETY: nothing is accessed.
        unsafe {
            assert!(OnDemandMemory::new(0x1000, 0).is_none());
            assert!(OnDemandMemory::new(u64::MAX, 2).is_none());
            let whole = OnDemandMemory::new(0, u64::MAX).unwrap();
            assert!(UserMemory::from(whole).is_implicit());
            let part = OnDemandMemory::new(0x1000, u64::MAX - 0x1000).unwrap();
            assert!(!UserMemory::from(part).is_implicit());
            assert!(OnDemandMemory::new(u64::MAX, 1).is_some());
        }
    }

    /// Two devices, B's region registered on demand over a mapping of 4 pages, one of them
    /// unmapped at registration: a WRITE lands in the mapping; a page mapped after
    /// registration takes a WRITE; an ATOMIC and a READ work; a READ of a page unmapped since
    /// completes at the requester with a remote access error (no fault in B); an implicit
    /// region names memory by its own address, and only from iova 0.
    #[test]
    #[cfg_attr(miri, ignore = "process_vm_readv is not supported under miri")]
    fn devices_use_on_demand_regions_page_by_page() {
        #[cfg(not(miri))]
        {
            use crate::time::Instant;
            use crate::verbs::*;
            let mk = test_device;
            let (mut a, pa, cqa, qa) = mk(1);
            let (mut b, pb, _, qb) = mk(2);
            let p = RcParams::default();
            let (ra, rb) = (
                a.local_end(qa, 0, 0).unwrap(),
                b.local_end(qb, 0, 0).unwrap(),
            );
            a.connect_rc(qa, &rb, &p).unwrap();
            b.connect_rc(qb, &ra, &p).unwrap();
            let mut now = Instant::from_nanos(1_000_000);
            let all = AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_ATOMIC;
            let ma = a.reg_mr(pa, 1 << 16, all).unwrap();
            let src: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
            ma.write(0, &src).unwrap();
            let (base, page) = map(4);
            unmap(base + page as u64, page);
            // SAFETY: the mapping is this test's and no reference covers it.
            let od = unsafe { OnDemandMemory::new(base, 4 * page as u64) }.unwrap();
            let mb = b.reg_mr_app(pb, od, base, all).unwrap();
            assert!(mb.is_on_demand() && mb.is_app_memory());
            let mut run = |a: &mut Device, b: &mut Device, op: SendOp, off: u64, len: u32| {
                let wr = SendWr::new(
                    7,
                    op,
                    Sge {
                        addr: ma.addr() + off,
                        length: len,
                        lkey: ma.lkey(),
                    },
                );
                a.post_send(qa, wr).unwrap();
                let mut frame = vec![0u8; 4096];
                // Until A's completion (a delayed ACK comes after its deadline).
                let mut wcs = Vec::new();
                for _ in 0..10_000 {
                    now += crate::time::Duration::from_micros(10);
                    a.handle_timeout(now);
                    b.handle_timeout(now);
                    for dir in 0..2 {
                        let (from, to) = if dir == 0 {
                            (&mut *a, &mut *b)
                        } else {
                            (&mut *b, &mut *a)
                        };
                        let mut v = Vec::new();
                        while let Some(n) = from.poll_transmit(now, &mut frame).unwrap() {
                            v.push(frame[..n].to_vec());
                        }
                        for f in &v {
                            to.handle_frame(now, f);
                        }
                    }
                    a.poll_cq(cqa, &mut wcs, 8).unwrap();
                    if !wcs.is_empty() {
                        break;
                    }
                }
                assert_eq!(
                    wcs.len(),
                    1,
                    "{wcs:?} {:?} {:?}",
                    a.counters(),
                    b.counters()
                );
                wcs[0].status
            };
            let write = |at: u64| SendOp::RdmaWrite {
                remote_addr: at,
                rkey: mb.rkey(),
            };
            assert_eq!(
                run(&mut a, &mut b, write(base + 100), 0, 3000),
                WcStatus::Success
            );
            assert_eq!(peek(base + 100, 3000), src[..3000]);
            // The page missing at registration, mapped now.
            let late = base + page as u64;
            remap(late, page);
            assert_eq!(
                run(&mut a, &mut b, write(late + 8), 3000, 2000),
                WcStatus::Success
            );
            assert_eq!(peek(late + 8, 2000), src[3000..5000]);
            // ATOMIC fetch-and-add on the late page: the old 8 bytes come back to A.
            let add = SendOp::AtomicFetchAdd {
                remote_addr: late + 8,
                rkey: mb.rkey(),
                add: 5,
            };
            assert_eq!(run(&mut a, &mut b, add, 6000, 8), WcStatus::Success);
            let mut old = [0u8; 8];
            ma.read(6000, &mut old).unwrap();
            assert_eq!(old[..], src[3000..3008]);
            let want = u64::from_ne_bytes(old).wrapping_add(5).to_ne_bytes();
            assert_eq!(peek(late + 8, 8), want);
            // READ from the last page into A at 7000.
            let read = |at: u64| SendOp::RdmaRead {
                remote_addr: at,
                rkey: mb.rkey(),
            };
            assert_eq!(
                run(&mut a, &mut b, read(base + 100), 7000, 1000),
                WcStatus::Success
            );
            let mut got = vec![0u8; 1000];
            ma.read(7000, &mut got).unwrap();
            assert_eq!(got, src[..1000]);
            // The page unmapped again: a READ of it is a remote access error, B survives.
            unmap(late, page);
            assert_eq!(
                run(&mut a, &mut b, read(late), 7000, 64),
                WcStatus::RemAccessErr
            );
            b.dereg_mr(&mb).unwrap();
            release(base, 4 * page);

            // An implicit region: iova 0 only; it names a fresh mapping by its address.
            let (c, pc, _, _) = mk(3);
            let mut c = c;
            // SAFETY: nothing of the test is accessed through the region but its own mapping.
            let whole = || unsafe { OnDemandMemory::new(0, u64::MAX) }.unwrap();
            assert!(c.reg_mr_app(pc, whole(), 0x1000, all).is_err());
            let mi = c.reg_mr_app(pc, whole(), 0, all).unwrap();
            let (fresh, page) = map(1);
            mi.write(fresh as usize + 5, b"implicit").unwrap();
            assert_eq!(peek(fresh + 5, 8), b"implicit");
            unmap(fresh, page);
            assert_eq!(mi.read(fresh as usize, &mut [0u8; 4]), Err(MrError::Gone));
            release(fresh, page);
        }
    }
}
