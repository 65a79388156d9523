//! The AF_XDP socket (`XSK`): its packet memory (UMEM), its four single-producer /
//! single-consumer rings, and the system calls around them.
//!
//! # How AF_XDP moves frames
//!
//! The process allocates a page-aligned area, the **UMEM**, cut into equal **frames**
//! (chunks), and registers it with the socket (`setsockopt(XDP_UMEM_REG)`). Four rings, each
//! mapped from the socket with `mmap`, carry frame addresses between process and kernel:
//!
//! | ring           | producer | consumer | entries                    |
//! |----------------|----------|----------|----------------------------|
//! | fill (FQ)      | process  | kernel   | `u64` frame addresses      |
//! | rx             | kernel   | process  | [`XdpDesc`] (addr, len)    |
//! | tx             | process  | kernel   | [`XdpDesc`]                |
//! | completion (CQ)| kernel   | process  | `u64` frame addresses      |
//!
//! Receive: the process gives empty frames to the kernel on the fill ring; the kernel
//! writes a received frame into one and posts (address, length) on the rx ring; the process
//! reads it and gives the frame back on the fill ring. Transmit: the process writes a frame
//! into a frame it owns and posts it on the tx ring, then kicks the kernel (`sendto`); once
//! the frame has left, the kernel returns its address on the completion ring.
//!
//! # Ring indices and memory ordering
//!
//! Each ring has a `producer` and a `consumer` index (free-running `u32`s that wrap; the slot
//! is `index & (size - 1)`), a `flags` word, and `size` descriptor slots. Exactly one side
//! writes each index. The protocol is the one of `tools/testing/selftests/bpf/xsk.h` and the
//! kernel's `net/xdp/xsk_queue.h`:
//!
//! - **Producer**: read `consumer` with **Acquire** (the consumer's reads of the slots it
//!   released happened before, so they may be overwritten now); write the slots; store the
//!   new `producer` with **Release** (the slot writes become visible before the index that
//!   publishes them).
//! - **Consumer**: read `producer` with **Acquire** (the producer's slot writes are visible
//!   after it); read the slots; store the new `consumer` with **Release** (the slot reads
//!   are done before the producer may reuse them).
//!
//! The kernel side uses `smp_load_acquire`/`smp_store_release` (or equivalent barriers) on
//! the same indices, so these orderings pair with it. The `flags` word (`XDP_RING_NEED_WAKEUP`)
//! is advisory and read with Relaxed: a missed flag costs a wake-up syscall or a poll
//! timeout, never a corrupt ring.
//!
//! The ring logic ([`ProducerRing`], [`ConsumerRing`]) works over any memory with that
//! layout; [`heap_ring`] builds one on the heap so the index arithmetic can be tested without
//! the kernel, under miri: `cargo +nightly miri test --lib io::sys::xsk`.
//!
//! # Safety of the interface
//!
//! Every slot access is `index & mask` into a mapping checked at construction to hold `size`
//! slots, and a slot can only be written after [`ProducerRing::reserve`] and read after
//! [`ConsumerRing::peek`] granted it (an out-of-range index panics): no method can touch
//! memory outside the mapping or a slot the other side owns. UMEM frames are handed out as
//! slices after a bounds check against the UMEM length.

use super::cvt;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// `XDP_PACKET_HEADROOM`: the kernel keeps this many bytes free in front of every received
/// frame (for `bpf_xdp_adjust_head`), so a received frame starts 256 bytes into its chunk.
pub const XDP_PACKET_HEADROOM: u32 = 256;

/// Bind flags (`sockaddr_xdp.sxdp_flags`).
pub mod bind_flags {
    /// `XDP_COPY`: force copy mode (the kernel copies each frame between its buffers and
    /// the UMEM).
    pub const COPY: u16 = libc::XDP_COPY;
    /// `XDP_ZEROCOPY`: force zero-copy mode (the driver DMAs straight into the UMEM); fails
    /// (EOPNOTSUPP) when the driver cannot.
    pub const ZEROCOPY: u16 = libc::XDP_ZEROCOPY;
    /// `XDP_USE_NEED_WAKEUP`: the kernel sets `XDP_RING_NEED_WAKEUP` in a ring's flags when
    /// it needs a syscall to make progress, so the process can skip the syscall otherwise.
    pub const USE_NEED_WAKEUP: u16 = libc::XDP_USE_NEED_WAKEUP;
    /// `XDP_USE_SG`: multi-buffer (Linux >= 6.6). A frame larger than a UMEM frame is carried
    /// by several descriptors, all but the last with [`super::XDP_PKT_CONTD`] in `options`.
    pub const USE_SG: u16 = libc::XDP_USE_SG;
}

/// `XDP_PKT_CONTD` (descriptor `options`): the frame continues in the next descriptor.
pub const XDP_PKT_CONTD: u32 = libc::XDP_PKT_CONTD;

/// An rx or tx descriptor (`struct xdp_desc`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpDesc {
    /// Address of the frame data: an offset into the UMEM.
    pub addr: u64,
    pub len: u32,
    /// [`XDP_PKT_CONTD`] (multi-buffer); tx-metadata flags are not used.
    pub options: u32,
}

// ---------------------------------------------------------------------------------------
// Memory mappings
// ---------------------------------------------------------------------------------------

/// An `mmap`ed region, unmapped on drop.
#[derive(Debug)]
struct Mmap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; who may access which part is governed by the ring
// protocol and by the borrow rules of the types that hand it out.
unsafe impl Send for Mmap {}
// SAFETY: as above; &Mmap gives no access by itself.
unsafe impl Sync for Mmap {}

impl Mmap {
    /// `mmap(NULL, len, PROT_READ|PROT_WRITE, flags, fd, offset)`.
    fn new(len: usize, flags: i32, fd: i32, offset: libc::off_t) -> io::Result<Mmap> {
        // SAFETY: a fresh mapping chosen by the kernel (addr NULL) aliases nothing we hold.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mmap {
            ptr: NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned NULL"))?,
            len,
        })
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; nothing borrows the mapping any
        // more (every borrow is tied to the owner of this Mmap).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Rings
// ---------------------------------------------------------------------------------------

/// Where one ring's indices and slots live. Keeps its backing memory alive.
struct RingMem<T> {
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
    flags: NonNull<AtomicU32>,
    descs: NonNull<T>,
    /// Number of slots, a power of two.
    size: u32,
    _backing: Arc<dyn Send + Sync>,
}

// SAFETY: the pointers target memory owned by `_backing` (Send + Sync); the indices are
// atomics and slot access follows the ring protocol documented above.
unsafe impl<T: Send> Send for RingMem<T> {}

impl<T: Copy> RingMem<T> {
    /// # Safety
    /// `base` must stay valid (kept alive by `backing`) for reads and writes of: three
    /// `AtomicU32`s at `base + producer/consumer/flags` offsets (4-byte aligned) and `size`
    /// values of `T` at `base + descs` (aligned for `T`). `size` must be a power of two.
    /// The other side of the ring must follow the SPSC protocol.
    unsafe fn from_raw(
        base: NonNull<u8>,
        off: &libc::xdp_ring_offset,
        size: u32,
        backing: Arc<dyn Send + Sync>,
    ) -> Self {
        debug_assert!(size.is_power_of_two());
        let at = |o: u64| NonNull::new_unchecked(base.as_ptr().add(o as usize));
        RingMem {
            producer: at(off.producer).cast(),
            consumer: at(off.consumer).cast(),
            flags: at(off.flags).cast(),
            descs: at(off.desc).cast(),
            size,
            _backing: backing,
        }
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: valid and aligned for the lifetime of self (see from_raw).
        unsafe { self.producer.as_ref() }
    }
    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { self.consumer.as_ref() }
    }
    fn flags(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { self.flags.as_ref() }
    }

    /// Read the slot of free-running index `idx`.
    ///
    /// The caller (ConsumerRing) only reads slots between the consumer and the producer
    /// index it acquired, which the other side does not write.
    fn read(&self, idx: u32) -> T {
        let slot = (idx & (self.size - 1)) as usize;
        // SAFETY: slot < size, so in bounds of the descriptor array (from_raw); T: Copy.
        unsafe { self.descs.as_ptr().add(slot).read() }
    }

    /// Write the slot of free-running index `idx`.
    ///
    /// The caller (ProducerRing) only writes slots between its producer index and the
    /// consumer index + size it acquired, which the other side does not read.
    fn write(&self, idx: u32, v: T) {
        let slot = (idx & (self.size - 1)) as usize;
        // SAFETY: slot < size, in bounds (from_raw); no reference to the slot exists.
        unsafe { self.descs.as_ptr().add(slot).write(v) }
    }
}

/// The side of a ring this process produces on (fill, tx).
pub struct ProducerRing<T> {
    mem: RingMem<T>,
    /// Our producer index (only we write the shared one; this is its current value).
    prod: u32,
    /// consumer + size as last read: we may produce up to (not including) this index.
    limit: u32,
    /// Slots granted by the last `reserve`, starting at `prod`.
    reserved: u32,
}

impl<T: Copy> ProducerRing<T> {
    fn new(mem: RingMem<T>) -> Self {
        // Relaxed: only we write `producer`. Acquire on `consumer`: see the module doc.
        let prod = mem.producer().load(Ordering::Relaxed);
        let limit = mem
            .consumer()
            .load(Ordering::Acquire)
            .wrapping_add(mem.size);
        ProducerRing {
            mem,
            prod,
            limit,
            reserved: 0,
        }
    }

    /// Free slots, refreshing the consumer index only when the cached view has fewer than
    /// `want` (saves a shared cache line read per batch).
    pub fn free(&mut self, want: u32) -> u32 {
        let free = self.limit.wrapping_sub(self.prod);
        if free >= want {
            return free;
        }
        // Acquire: the consumer finished reading the slots it released before we reuse them.
        self.limit = self
            .mem
            .consumer()
            .load(Ordering::Acquire)
            .wrapping_add(self.mem.size);
        // A consumer index from the future (a broken peer) must not grant more than `size`.
        self.limit.wrapping_sub(self.prod).min(self.mem.size)
    }

    /// Reserve up to `n` slots; returns how many were granted (0 if the ring is full). The
    /// slots are filled with [`Self::write`] (index 0..granted) and published with
    /// [`Self::submit`]. A new `reserve` replaces an unsubmitted one.
    pub fn reserve(&mut self, n: u32) -> u32 {
        self.reserved = self.free(n).min(n);
        self.reserved
    }

    /// Write reserved slot `i` (0-based within the reservation). Panics if `i` was not
    /// reserved.
    pub fn write(&mut self, i: u32, v: T) {
        assert!(i < self.reserved, "ring slot {i} not reserved");
        self.mem.write(self.prod.wrapping_add(i), v);
    }

    /// Publish the first `n` reserved slots (the rest of the reservation is dropped).
    /// Panics if `n` exceeds the reservation.
    pub fn submit(&mut self, n: u32) {
        assert!(
            n <= self.reserved,
            "submitting {n} of {} reserved",
            self.reserved
        );
        self.reserved = 0;
        if n == 0 {
            return;
        }
        self.prod = self.prod.wrapping_add(n);
        // Release: the slot writes happen-before the consumer sees the new index.
        self.mem.producer().store(self.prod, Ordering::Release);
    }

    /// Slots published but not yet consumed by the other side (fresh read).
    pub fn outstanding(&self) -> u32 {
        let cons = self.mem.consumer().load(Ordering::Acquire);
        self.prod.wrapping_sub(cons).min(self.mem.size)
    }

    /// `XDP_RING_NEED_WAKEUP` is set: the kernel wants a syscall to process this ring.
    pub fn needs_wakeup(&self) -> bool {
        self.mem.flags().load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }
}

/// The side of a ring this process consumes from (rx, completion).
pub struct ConsumerRing<T> {
    mem: RingMem<T>,
    /// Our consumer index.
    cons: u32,
    /// The producer index as last read (Acquire).
    prod: u32,
    /// Entries granted by the last `peek`, starting at `cons`.
    peeked: u32,
}

impl<T: Copy> ConsumerRing<T> {
    fn new(mem: RingMem<T>) -> Self {
        let cons = mem.consumer().load(Ordering::Relaxed);
        let prod = mem.producer().load(Ordering::Acquire);
        ConsumerRing {
            mem,
            cons,
            prod,
            peeked: 0,
        }
    }

    pub fn size(&self) -> u32 {
        self.mem.size
    }

    /// Entries ready, refreshing the producer index if the cached view has fewer than
    /// `want`.
    pub fn available(&mut self, want: u32) -> u32 {
        let avail = self.prod.wrapping_sub(self.cons);
        if avail >= want {
            return avail.min(self.mem.size);
        }
        // Acquire: the producer's slot writes are visible once we see its index.
        self.prod = self.mem.producer().load(Ordering::Acquire);
        self.prod.wrapping_sub(self.cons).min(self.mem.size)
    }

    /// Grant up to `max` ready entries for reading with [`Self::read`] (index 0..granted);
    /// returns how many. Give them back with [`Self::release`].
    pub fn peek(&mut self, max: u32) -> u32 {
        self.peeked = self.available(max).min(max);
        self.peeked
    }

    /// Entry `i` of the last peek. Panics if `i` was not granted.
    pub fn read(&self, i: u32) -> T {
        assert!(i < self.peeked, "ring entry {i} not peeked");
        self.mem.read(self.cons.wrapping_add(i))
    }

    /// Hand the first `n` peeked entries back to the producer.
    pub fn release(&mut self, n: u32) {
        assert!(n <= self.peeked, "releasing {n} of {} peeked", self.peeked);
        self.peeked = 0;
        if n == 0 {
            return;
        }
        self.cons = self.cons.wrapping_add(n);
        // Release: our slot reads happen-before the producer may overwrite them.
        self.mem.consumer().store(self.cons, Ordering::Release);
    }
}

/// A ring in ordinary heap memory with the kernel's layout (indices then slots): for tests
/// of the ring logic without a socket (miri runs them).
#[cfg(test)]
struct HeapRing<T> {
    /// producer, consumer, flags.
    idx: [AtomicU32; 3],
    /// The slots, owned through a raw pointer (from `Box::into_raw`) so that both ring ends
    /// may access them through raw pointers with full provenance.
    descs: NonNull<T>,
    size: u32,
}

// SAFETY: the slots are only accessed through the SPSC protocol of the two ring ends.
#[cfg(test)]
unsafe impl<T: Send> Send for HeapRing<T> {}
// SAFETY: as above; the indices are atomics.
#[cfg(test)]
unsafe impl<T: Send> Sync for HeapRing<T> {}

#[cfg(test)]
impl<T> Drop for HeapRing<T> {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.descs.as_ptr(), self.size as usize);
        // SAFETY: `descs` came from Box::into_raw of a boxed slice of `size` elements, and
        // both ring ends (which hold this HeapRing in an Arc) are gone.
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// Build the two ends of a ring of `size` slots (a power of two) in heap memory whose
/// producer and consumer indices both start at `start` (tests start near `u32::MAX` to
/// exercise wrap-around). Returns (producer end, consumer end).
#[cfg(test)]
pub fn heap_ring<T: Copy + Default + Send + 'static>(
    size: u32,
    start: u32,
) -> (ProducerRing<T>, ConsumerRing<T>) {
    assert!(size.is_power_of_two(), "ring size must be a power of two");
    let descs: Box<[T]> = (0..size).map(|_| T::default()).collect();
    let descs = NonNull::new(Box::into_raw(descs) as *mut T).expect("Box is non-null");
    let ring = Arc::new(HeapRing {
        idx: [
            AtomicU32::new(start),
            AtomicU32::new(start),
            AtomicU32::new(0),
        ],
        descs,
        size,
    });
    let mem = || {
        let backing: Arc<dyn Send + Sync> = ring.clone();
        RingMem {
            producer: NonNull::from(&ring.idx[0]),
            consumer: NonNull::from(&ring.idx[1]),
            flags: NonNull::from(&ring.idx[2]),
            descs: ring.descs,
            size,
            _backing: backing,
        }
    };
    (ProducerRing::new(mem()), ConsumerRing::new(mem()))
}

// ---------------------------------------------------------------------------------------
// UMEM
// ---------------------------------------------------------------------------------------

/// The packet memory shared with the kernel: `frame_count` frames of `frame_size` bytes in
/// one page-aligned anonymous mapping.
pub struct Umem {
    map: Mmap,
    frame_size: u32,
}

impl Umem {
    /// Map `frame_count × frame_size` bytes (`MAP_PRIVATE|MAP_ANONYMOUS|MAP_POPULATE`: the
    /// pages exist up front; the kernel pins them at registration anyway).
    pub fn new(frame_size: u32, frame_count: u32) -> io::Result<Umem> {
        let len = frame_size as usize * frame_count as usize;
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty UMEM"));
        }
        let map = Mmap::new(
            len,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )?;
        Ok(Umem { map, frame_size })
    }

    pub fn frame_size(&self) -> u32 {
        self.frame_size
    }
    pub fn len(&self) -> usize {
        self.map.len
    }

    /// The start of the frame containing UMEM offset `addr`.
    pub fn frame_base(&self, addr: u64) -> u64 {
        addr - addr % u64::from(self.frame_size)
    }

    /// The `len` bytes at UMEM offset `addr`, or `None` if that is not inside the UMEM.
    ///
    /// The bytes must belong to the process at the moment (a frame taken from the rx ring
    /// or kept off the rings): the kernel writes only frames it was given.
    pub fn bytes(&self, addr: u64, len: u32) -> Option<&[u8]> {
        let (start, len) = self.check(addr, len)?;
        // SAFETY: start + len <= map.len (check); the shared borrow of self keeps the
        // mapping alive and excludes `bytes_mut` on it for the slice's lifetime.
        Some(unsafe { std::slice::from_raw_parts(self.map.ptr.as_ptr().add(start), len) })
    }

    /// Like [`Self::bytes`], writable.
    pub fn bytes_mut(&mut self, addr: u64, len: u32) -> Option<&mut [u8]> {
        let (start, len) = self.check(addr, len)?;
        // SAFETY: in bounds (check); the exclusive borrow of self excludes any other slice
        // of the mapping for the returned slice's lifetime.
        Some(unsafe { std::slice::from_raw_parts_mut(self.map.ptr.as_ptr().add(start), len) })
    }

    fn check(&self, addr: u64, len: u32) -> Option<(usize, usize)> {
        let start = usize::try_from(addr).ok()?;
        let end = start.checked_add(len as usize)?;
        (end <= self.map.len).then_some((start, len as usize))
    }
}

// ---------------------------------------------------------------------------------------
// The socket
// ---------------------------------------------------------------------------------------

/// Sizes of an AF_XDP socket's UMEM and rings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XskConfig {
    /// Chunk size: a power of two, 2048 or 4096 (the kernel allows at most the page size
    /// without huge pages).
    pub frame_size: u32,
    pub frame_count: u32,
    /// Ring sizes (powers of two).
    pub fill_size: u32,
    pub comp_size: u32,
    pub rx_size: u32,
    pub tx_size: u32,
}

/// Which step of setting up an AF_XDP socket failed, with the OS error (its `errno` kept,
/// so callers can fall back, e.g. from zero-copy to copy mode on EOPNOTSUPP).
#[derive(Debug)]
pub struct XskError {
    pub step: &'static str,
    pub error: io::Error,
}

impl std::fmt::Display for XskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AF_XDP {}: {}", self.step, self.error)
    }
}

impl std::error::Error for XskError {}

impl From<XskError> for io::Error {
    fn from(e: XskError) -> io::Error {
        io::Error::new(e.error.kind(), e.to_string())
    }
}

/// Kernel statistics of a socket (`XDP_STATISTICS`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XskStats {
    /// Frames dropped for other reasons than a full ring (e.g. too big for a frame).
    pub rx_dropped: u64,
    pub rx_invalid_descs: u64,
    pub tx_invalid_descs: u64,
    /// Frames dropped because the rx ring was full.
    pub rx_ring_full: u64,
    /// Times the fill ring was found empty.
    pub rx_fill_ring_empty_descs: u64,
    /// Times the tx ring was found empty.
    pub tx_ring_empty_descs: u64,
}

/// A bound AF_XDP socket with its UMEM and rings. Dropping it closes the socket (which also
/// removes it from any XSKMAP) and unmaps the rings and the UMEM.
pub struct XskSocket {
    // Field order is drop order: the socket is closed first, then the rings and the UMEM
    // are unmapped (the kernel holds its own references to ring and UMEM pages).
    fd: OwnedFd,
    pub fill: ProducerRing<u64>,
    pub comp: ConsumerRing<u64>,
    pub rx: ConsumerRing<XdpDesc>,
    pub tx: ProducerRing<XdpDesc>,
    pub umem: Umem,
    bind_flags: u16,
}

fn setsockopt<T>(fd: &OwnedFd, opt: i32, val: &T) -> io::Result<()> {
    // SAFETY: the kernel reads size_of::<T>() bytes from `val`, which is a valid T.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            opt,
            val as *const T as *const libc::c_void,
            size_of::<T>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// `getsockopt(SOL_XDP, opt)` into a zeroed `T`; returns it and the length the kernel wrote.
///
/// # Safety
/// `T` must be plain old data (all-zero and any bytes the kernel writes are valid values).
unsafe fn getsockopt<T>(fd: BorrowedFd<'_>, opt: i32) -> io::Result<(T, usize)> {
    let mut val: T = std::mem::zeroed();
    let mut len = size_of::<T>() as libc::socklen_t;
    cvt(libc::getsockopt(
        fd.as_raw_fd(),
        libc::SOL_XDP,
        opt,
        &mut val as *mut T as *mut libc::c_void,
        &mut len,
    ))?;
    Ok((val, len as usize))
}

fn step(step: &'static str) -> impl FnOnce(io::Error) -> XskError {
    move |error| XskError { step, error }
}

impl XskSocket {
    /// Create an AF_XDP socket for `queue` of interface `ifindex` (in the calling thread's
    /// network namespace): `socket(AF_XDP)`, UMEM mapping and `XDP_UMEM_REG`, the four ring
    /// sizes, `XDP_MMAP_OFFSETS` and the four ring `mmap`s, then `bind` with `flags` (see
    /// [`bind_flags`]). Needs CAP_NET_RAW.
    ///
    /// The socket receives nothing until an XDP program redirects frames to it (through an
    /// XSKMAP entry) and frames are on the fill ring.
    pub fn open(ifindex: u32, queue: u32, cfg: &XskConfig, flags: u16) -> Result<Self, XskError> {
        for (what, n) in [
            ("fill ring size", cfg.fill_size),
            ("completion ring size", cfg.comp_size),
            ("rx ring size", cfg.rx_size),
            ("tx ring size", cfg.tx_size),
            ("frame size", cfg.frame_size),
        ] {
            if !n.is_power_of_two() {
                return Err(XskError {
                    step: "configuration",
                    error: io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{what} {n} is not a power of two"),
                    ),
                });
            }
        }
        // socket(2): an AF_XDP socket is SOCK_RAW, protocol 0.
        // SAFETY: plain socket(2); the descriptor is owned below.
        let raw =
            cvt(unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })
                .map_err(step("socket(AF_XDP)"))?;
        // SAFETY: fresh descriptor, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        // The UMEM, registered: the kernel pins its pages and will read/write frames there.
        let umem = Umem::new(cfg.frame_size, cfg.frame_count).map_err(step("UMEM mmap"))?;
        let reg = libc::xdp_umem_reg {
            addr: umem.map.ptr.as_ptr() as u64,
            len: umem.len() as u64,
            chunk_size: cfg.frame_size,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(&fd, libc::XDP_UMEM_REG, &reg).map_err(step("XDP_UMEM_REG"))?;

        // Ring sizes: the kernel allocates each ring when its size is set.
        setsockopt(&fd, libc::XDP_UMEM_FILL_RING, &cfg.fill_size)
            .map_err(step("XDP_UMEM_FILL_RING"))?;
        setsockopt(&fd, libc::XDP_UMEM_COMPLETION_RING, &cfg.comp_size)
            .map_err(step("XDP_UMEM_COMPLETION_RING"))?;
        setsockopt(&fd, libc::XDP_RX_RING, &cfg.rx_size).map_err(step("XDP_RX_RING"))?;
        setsockopt(&fd, libc::XDP_TX_RING, &cfg.tx_size).map_err(step("XDP_TX_RING"))?;

        // Where, inside each ring's mapping, the indices, flags and slots are.
        // SAFETY: xdp_mmap_offsets is plain integers.
        let (off, len) =
            unsafe { getsockopt::<libc::xdp_mmap_offsets>(fd.as_fd(), libc::XDP_MMAP_OFFSETS) }
                .map_err(step("XDP_MMAP_OFFSETS"))?;
        if len != size_of::<libc::xdp_mmap_offsets>() {
            return Err(XskError {
                step: "XDP_MMAP_OFFSETS",
                error: io::Error::new(
                    io::ErrorKind::Unsupported,
                    "kernel too old: rings have no flags word (needs Linux >= 5.4)",
                ),
            });
        }

        let map_ring =
            |o: &libc::xdp_ring_offset, size: u32, elem: usize, pgoff: u64, what: &'static str| {
                let len = o.desc as usize + size as usize * elem;
                let m = Mmap::new(
                    len,
                    libc::MAP_SHARED | libc::MAP_POPULATE,
                    raw,
                    pgoff as libc::off_t,
                )
                .map_err(step(what))?;
                // The offsets come from the kernel; check them anyway before building pointers.
                let ok = [o.producer, o.consumer, o.flags]
                    .iter()
                    .all(|&x| x % 4 == 0 && x as usize + 4 <= len)
                    && o.desc as usize % 8 == 0;
                if !ok {
                    return Err(XskError {
                        step: what,
                        error: io::Error::other("ring offsets out of range"),
                    });
                }
                Ok(m)
            };
        let fr = map_ring(
            &off.fr,
            cfg.fill_size,
            8,
            libc::XDP_UMEM_PGOFF_FILL_RING,
            "mmap fill ring",
        )?;
        let cr = map_ring(
            &off.cr,
            cfg.comp_size,
            8,
            libc::XDP_UMEM_PGOFF_COMPLETION_RING,
            "mmap completion ring",
        )?;
        let rx = map_ring(
            &off.rx,
            cfg.rx_size,
            size_of::<XdpDesc>(),
            libc::XDP_PGOFF_RX_RING as u64,
            "mmap rx ring",
        )?;
        let tx = map_ring(
            &off.tx,
            cfg.tx_size,
            size_of::<XdpDesc>(),
            libc::XDP_PGOFF_TX_RING as u64,
            "mmap tx ring",
        )?;

        fn ring<T: Copy>(m: Mmap, o: &libc::xdp_ring_offset, size: u32) -> RingMem<T> {
            let base = m.ptr;
            // SAFETY: the mapping is desc + size * size_of::<T>() long and the offsets were
            // checked to lie inside it, aligned; the Arc keeps it mapped as long as the ring.
            unsafe { RingMem::from_raw(base, o, size, Arc::new(m)) }
        }
        let fill = ProducerRing::new(ring::<u64>(fr, &off.fr, cfg.fill_size));
        let comp = ConsumerRing::new(ring::<u64>(cr, &off.cr, cfg.comp_size));
        let rx = ConsumerRing::new(ring::<XdpDesc>(rx, &off.rx, cfg.rx_size));
        let tx = ProducerRing::new(ring::<XdpDesc>(tx, &off.tx, cfg.tx_size));

        // bind(2) to (interface, queue): from now on frames an XDP program redirects to this
        // socket (and only those arriving on this queue) land in the rx ring.
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: flags,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // A queue the previous owner just left (its process exited or closed the socket) can
        // stay busy for a moment: the kernel releases an AF_XDP socket's binding after an RCU
        // grace period. A server restarted at once (perftest runs one test after another)
        // then gets EBUSY; wait for the release, at most 2 s.
        let t0 = std::time::Instant::now();
        loop {
            // SAFETY: `sa` is a valid sockaddr_xdp of the length given.
            let r = cvt(unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    &sa as *const libc::sockaddr_xdp as *const libc::sockaddr,
                    size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            });
            match r {
                Err(e)
                    if e.raw_os_error() == Some(libc::EBUSY)
                        && t0.elapsed() < std::time::Duration::from_secs(2) =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                r => {
                    r.map_err(step("bind"))?;
                    break;
                }
            }
        }
        Ok(XskSocket {
            fd,
            fill,
            comp,
            rx,
            tx,
            umem,
            bind_flags: flags,
        })
    }

    /// The socket descriptor (for the XSKMAP and for `poll`).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn bind_flags(&self) -> u16 {
        self.bind_flags
    }

    /// Whether the kernel runs this socket in zero-copy mode (`XDP_OPTIONS`).
    pub fn is_zero_copy(&self) -> io::Result<bool> {
        // SAFETY: xdp_options is a u32.
        let (o, _) =
            unsafe { getsockopt::<libc::xdp_options>(self.fd.as_fd(), libc::XDP_OPTIONS)? };
        Ok(o.flags & libc::XDP_OPTIONS_ZEROCOPY != 0)
    }

    /// Tell the kernel there is work on the tx ring: `sendto(fd, NULL, 0, MSG_DONTWAIT)`.
    /// In copy mode this is where the kernel transmits (up to a budget of frames per call,
    /// then EAGAIN). EAGAIN, EBUSY, ENOBUFS and ENETDOWN are transient: the descriptors stay
    /// on the ring for the next kick; they are returned as errors for the caller to judge.
    pub fn kick_tx(&self) -> io::Result<()> {
        // SAFETY: a zero-length send with no buffer and no address.
        let r = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Let one copy-mode `sendto` carry up to `budget` descriptors
    /// (`XDP_MAX_TX_SKB_BUDGET`, Linux 6.17; the kernel's default is 32, so a larger batch
    /// otherwise takes several calls). The kernel accepts 32 up to the TX ring's size
    /// (`EACCES` otherwise); older kernels answer `ENOPROTOOPT`.
    pub fn set_tx_budget(&self, budget: u32) -> io::Result<()> {
        const XDP_MAX_TX_SKB_BUDGET: i32 = 9;
        setsockopt(&self.fd, XDP_MAX_TX_SKB_BUDGET, &budget)
    }

    /// Tell the kernel the fill ring has frames again (`recvfrom(fd, NULL, 0, MSG_DONTWAIT)`),
    /// for drivers that stopped receiving for want of them (`XDP_RING_NEED_WAKEUP` on the
    /// fill ring). Errors are ignored: the call is only a nudge.
    pub fn wake_rx(&self) {
        // SAFETY: a zero-length receive with no buffer and no address.
        unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
        }
    }

    /// The kernel's counters for this socket (`XDP_STATISTICS`).
    pub fn stats(&self) -> io::Result<XskStats> {
        // SAFETY: xdp_statistics is plain integers.
        let (s, _) =
            unsafe { getsockopt::<libc::xdp_statistics>(self.fd.as_fd(), libc::XDP_STATISTICS)? };
        Ok(XskStats {
            rx_dropped: s.rx_dropped,
            rx_invalid_descs: s.rx_invalid_descs,
            tx_invalid_descs: s.tx_invalid_descs,
            rx_ring_full: s.rx_ring_full,
            rx_fill_ring_empty_descs: s.rx_fill_ring_empty_descs,
            tx_ring_empty_descs: s.tx_ring_empty_descs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Push `vals` through a ring and read them back, `batch` at a time.
    fn roundtrip(size: u32, start: u32, total: u32, batch: u32) {
        let (mut p, mut c) = heap_ring::<u64>(size, start);
        let (mut sent, mut got) = (0u32, 0u32);
        while got < total {
            let n = p.reserve(batch.min(total - sent));
            for i in 0..n {
                p.write(i, u64::from(sent + i) * 3 + 1);
            }
            p.submit(n);
            sent += n;
            let m = c.peek(batch);
            for i in 0..m {
                assert_eq!(c.read(i), u64::from(got + i) * 3 + 1);
            }
            c.release(m);
            got += m;
        }
        assert_eq!(sent, total);
    }

    #[test]
    fn ring_passes_entries_in_order_across_index_wrap() {
        // Indices start 5 below u32::MAX: they wrap in the middle of the run.
        roundtrip(8, u32::MAX - 5, 100, 3);
        roundtrip(4, u32::MAX, 33, 4);
        roundtrip(1, u32::MAX - 1, 5, 1);
    }

    #[test]
    fn producer_cannot_overrun_the_consumer() {
        let (mut p, mut c) = heap_ring::<u64>(4, u32::MAX - 1);
        assert_eq!(p.free(0), 4);
        assert_eq!(p.reserve(10), 4);
        for i in 0..4 {
            p.write(i, u64::from(i));
        }
        p.submit(4);
        assert_eq!(p.reserve(1), 0, "full ring grants nothing");
        assert_eq!(p.outstanding(), 4);
        assert_eq!(c.peek(2), 2);
        c.release(1); // one slot back
        assert_eq!(p.reserve(3), 1);
        p.write(0, 99);
        p.submit(1);
        assert_eq!(c.peek(10), 4);
        let v: Vec<u64> = (0..4).map(|i| c.read(i)).collect();
        assert_eq!(v, vec![1, 2, 3, 99]);
        c.release(4);
        assert_eq!(c.peek(1), 0);
        assert_eq!(p.free(4), 4);
        assert_eq!(p.outstanding(), 0);
    }

    #[test]
    fn partial_submit_and_release_keep_the_rest() {
        let (mut p, mut c) = heap_ring::<XdpDesc>(8, 7);
        assert_eq!(p.reserve(5), 5);
        for i in 0..5 {
            p.write(
                i,
                XdpDesc {
                    addr: u64::from(i) * 4096,
                    len: 60 + i,
                    options: 0,
                },
            );
        }
        p.submit(2); // the other three reservations are dropped
        assert_eq!(c.peek(8), 2);
        assert_eq!(c.read(1).len, 61);
        c.release(0);
        assert_eq!(c.peek(8), 2, "nothing released, both still there");
        c.release(2);
        assert_eq!(p.reserve(1), 1);
        p.write(
            0,
            XdpDesc {
                addr: 1,
                len: 2,
                options: 3,
            },
        );
        p.submit(1);
        assert_eq!(c.peek(8), 1);
        assert_eq!(
            c.read(0),
            XdpDesc {
                addr: 1,
                len: 2,
                options: 3
            }
        );
    }

    #[test]
    #[should_panic(expected = "not reserved")]
    fn writing_an_unreserved_slot_panics() {
        let (mut p, _c) = heap_ring::<u64>(4, 0);
        p.reserve(1);
        p.write(1, 0);
    }

    #[test]
    #[should_panic(expected = "not peeked")]
    fn reading_an_unpeeked_entry_panics() {
        let (mut p, mut c) = heap_ring::<u64>(4, 0);
        p.reserve(1);
        p.write(0, 5);
        p.submit(1);
        c.peek(1);
        c.read(1);
    }

    #[test]
    fn a_consumer_index_from_the_future_grants_at_most_size() {
        let (mut p, c) = heap_ring::<u64>(4, 0);
        // A broken peer jumps its consumer index ahead of the producer.
        c.mem.consumer().store(1000, Ordering::Release);
        assert_eq!(p.reserve(100), 4);
    }

    #[test]
    fn two_threads_stream_through_a_small_ring() {
        // Producer and consumer on different threads: miri checks the orderings (a missing
        // Release/Acquire shows up as a data race on the slots).
        let total: u32 = if cfg!(miri) { 200 } else { 100_000 };
        let (mut p, mut c) = heap_ring::<u64>(4, u32::MAX - 50);
        let t = std::thread::spawn(move || {
            let mut sent = 0u32;
            while sent < total {
                let n = p.reserve(3.min(total - sent));
                for i in 0..n {
                    p.write(i, u64::from(sent + i));
                }
                p.submit(n);
                sent += n;
                if n == 0 {
                    std::thread::yield_now();
                }
            }
        });
        let mut got = 0u32;
        while got < total {
            let n = c.peek(2);
            for i in 0..n {
                assert_eq!(c.read(i), u64::from(got + i));
            }
            c.release(n);
            got += n;
            if n == 0 {
                std::thread::yield_now();
            }
        }
        t.join().unwrap();
    }

    #[test]
    #[cfg_attr(miri, ignore = "mmap")]
    fn umem_slices_are_bounds_checked() {
        let mut u = Umem::new(2048, 4).unwrap();
        assert_eq!(u.len(), 8192);
        assert_eq!(u.frame_base(2048 + 300), 2048);
        u.bytes_mut(8192 - 10, 10).unwrap().fill(7);
        assert_eq!(u.bytes(8190, 2).unwrap(), &[7, 7]);
        assert!(u.bytes(8190, 3).is_none());
        assert!(u.bytes(u64::MAX, 1).is_none());
        assert!(u.bytes_mut(0, 8193).is_none());
    }
}
