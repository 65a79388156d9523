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

/// The bytes behind a memory region: owned by the region, owned by the application, or gone
/// (deregistered application memory: no bytes, every access fails).
pub(crate) enum Memory {
    /// Allocated by the device for the region (`Device::reg_mr`).
    Owned(Box<[u8]>),
    /// The application's own memory (`Device::reg_mr_app`).
    App(AppMemory),
    /// Application memory after deregistration.
    Gone,
}

impl Memory {
    /// The bytes, to read. Only called with the region's read (or write) lock held.
    pub(crate) fn get(&self) -> Option<&[u8]> {
        match self {
            Memory::Owned(b) => Some(b),
            // SAFETY: the caller's promise (AppMemory::new) makes `len` bytes at `ptr` valid
            // while the memory is registered, which it is while this is not `Gone` (point 2);
            // `&self` comes from the region's lock guard, under which no `&mut` exists
            // (point 3).
            Memory::App(m) => Some(unsafe { std::slice::from_raw_parts(m.ptr.as_ptr(), m.len) }),
            Memory::Gone => None,
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
            Memory::Gone => None,
        }
    }

    /// Whether this is the application's memory.
    pub(crate) fn is_app(&self) -> bool {
        matches!(self, Memory::App(_))
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

    /// Two devices over a perfect in-test link, each with a region on a buffer of the test's
    /// own: a WRITE from one buffer lands in the other buffer itself (no copy to fetch it
    /// from), a READ brings bytes back, and after `dereg_mr` the engine touches the memory no
    /// more (the rest of a WRITE in flight writes nothing). Under miri this also checks that
    /// no access uses the memory outside the caller's promise.
    #[test]
    fn devices_use_the_callers_buffers_in_place_until_dereg() {
        use crate::time::Instant;
        use crate::verbs::*;
        use crate::wire::MacAddr;
        use std::net::{IpAddr, Ipv4Addr};
        let mk = |i: u8| {
            let cfg = DeviceConfig::new(
                MacAddr([2, 0, 0, 0, 0, i]),
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, i)),
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
        };
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
}
