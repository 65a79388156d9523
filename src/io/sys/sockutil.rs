//! Small socket helpers shared by the packet and UDP backends: `setsockopt`/`getsockopt` of
//! plain integers and structs, and the headers of a `sendmmsg(2)`/`recvmmsg(2)` batch.

use super::cvt;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `setsockopt(fd, level, name, &val, sizeof val)` for a plain-data `T` (an integer or a
/// `#[repr(C)]` struct without padding the kernel would misread).
pub(super) fn setsockopt<T: Copy>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    val: &T,
) -> io::Result<()> {
    // SAFETY: `val` points to `size_of::<T>()` initialised bytes that outlive the call; the
    // kernel only reads them.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (val as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    cvt(r).map(drop)
}

/// `setsockopt` of an `int` option.
pub fn set_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    val: libc::c_int,
) -> io::Result<()> {
    setsockopt(fd, level, name, &val)
}

/// Attach (or replace: the kernel swaps programs atomically) a classic BPF program
/// (`SO_ATTACH_FILTER`).
pub fn attach_filter(fd: BorrowedFd<'_>, prog: &[crate::io::cbpf::Insn]) -> io::Result<()> {
    let mut code: Vec<libc::sock_filter> = prog
        .iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect();
    let len = u16::try_from(code.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "BPF program too long"))?;
    let fprog = libc::sock_fprog {
        len,
        filter: code.as_mut_ptr(),
    };
    // The kernel copies the program during the call; `code` outlives it.
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
}

/// The buffers of one message of a `sendmmsg(2)`/`recvmmsg(2)` batch: the data, and
/// optionally the peer address and the control (ancillary) data, each a pointer and a length
/// into storage the caller keeps alive, and does not touch, until the system call returns.
#[derive(Clone, Copy, Debug)]
pub(super) struct MsgBufs {
    pub data: *mut libc::c_void,
    pub data_len: usize,
    /// Null: no address (a connected or packet socket).
    pub name: *mut libc::c_void,
    pub name_len: libc::socklen_t,
    /// Null: no control data.
    pub control: *mut libc::c_void,
    pub control_len: usize,
}

impl MsgBufs {
    /// Just the data (no address, no control data).
    pub fn data(data: *mut libc::c_void, data_len: usize) -> MsgBufs {
        MsgBufs {
            data,
            data_len,
            name: std::ptr::null_mut(),
            name_len: 0,
            control: std::ptr::null_mut(),
            control_len: 0,
        }
    }
}

/// The iovecs and message headers of a batch of up to `N` messages and `N` iovecs: the one
/// place `sendmmsg(2)` and `recvmmsg(2)` arguments are built (UDP and packet sockets). A
/// message has one iovec ([`Self::set`]) or gathers several consecutive ones
/// ([`Self::set_gather`], for a UDP GSO super-datagram).
pub(super) struct Mmsg<const N: usize> {
    iov: [libc::iovec; N],
    hdr: [libc::mmsghdr; N],
    /// Message `i` uses `iov[span[i].0 .. span[i].0 + span[i].1]`.
    span: [(usize, usize); N],
}

impl<const N: usize> Mmsg<N> {
    /// A batch with every header empty.
    pub fn new() -> Self {
        Mmsg {
            // SAFETY: iovec and mmsghdr are plain data; all-zero (null pointers) is valid.
            iov: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            hdr: unsafe { std::mem::zeroed() },
            span: [(0, 0); N],
        }
    }

    /// Describe message `i` (`i < N`), its data in iovec `i`.
    pub fn set(&mut self, i: usize, b: MsgBufs) {
        self.set_iov(i, b.data, b.data_len);
        self.set_gather(i, i..i + 1, b);
    }

    /// Point iovec `j` (`j < N`) at `len` bytes at `data`.
    pub fn set_iov(&mut self, j: usize, data: *mut libc::c_void, len: usize) {
        self.iov[j].iov_base = data;
        self.iov[j].iov_len = len;
    }

    /// Describe message `i` (`i < N`) with its data gathered from the iovecs `iovs` (set with
    /// [`Self::set_iov`]; `b.data` is not used). Out-of-range iovecs are clipped to `N`.
    pub fn set_gather(&mut self, i: usize, iovs: std::ops::Range<usize>, b: MsgBufs) {
        let start = iovs.start.min(N);
        self.span[i] = (start, iovs.end.clamp(start, N) - start);
        let h = &mut self.hdr[i].msg_hdr;
        h.msg_name = b.name;
        h.msg_namelen = b.name_len;
        h.msg_control = b.control;
        h.msg_controllen = b.control_len as _;
    }

    /// The header of message `i` as the kernel left it (`msg_len`, `msg_flags`, the lengths
    /// of the address and control data received).
    pub fn header(&self, i: usize) -> &libc::mmsghdr {
        &self.hdr[i]
    }

    /// Point every header of `..n` at its iovecs (here, where `self` no longer moves).
    fn link(&mut self, n: usize) -> usize {
        let n = n.min(N);
        for i in 0..n {
            let (start, count) = self.span[i];
            let h = &mut self.hdr[i].msg_hdr;
            // `start <= N` (set_gather clips it); with `count == 0` the pointer is not read.
            h.msg_iov = self.iov.as_mut_ptr().wrapping_add(start);
            h.msg_iovlen = count as _;
        }
        n
    }

    /// `sendmmsg(fd, messages ..n, MSG_DONTWAIT)`: how many the kernel took (an error only
    /// when it took none).
    ///
    /// # Safety
    /// Every buffer given to [`Self::set`] or [`Self::set_iov`] (for an iovec a message of
    /// `..n` uses) and every name and control buffer of those messages must be valid for
    /// reads of its length until this returns.
    pub unsafe fn send(&mut self, fd: BorrowedFd<'_>, n: usize) -> io::Result<usize> {
        let n = self.link(n);
        // SAFETY: the headers point at `self.iov` and at the caller's buffers, valid for
        // their lengths per this function's contract; the kernel only reads them.
        let r = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                self.hdr.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        cvt(r).map(|k| k as usize)
    }

    /// `recvmmsg(fd, messages ..n, MSG_DONTWAIT)`: how many messages were received, 0 when
    /// none was waiting (or the call was interrupted).
    ///
    /// # Safety
    /// Every buffer given to [`Self::set`] or [`Self::set_iov`] (for an iovec a message of
    /// `..n` uses) and every name and control buffer of those messages must be valid for
    /// writes of its length, and not otherwise accessed, until this returns.
    pub unsafe fn recv(&mut self, fd: BorrowedFd<'_>, n: usize) -> io::Result<usize> {
        let n = self.link(n);
        // SAFETY: the headers point at `self.iov` and at the caller's buffers, writable for
        // their lengths and unaliased per this function's contract.
        let r = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                self.hdr.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        match cvt(r) {
            Ok(k) => Ok((k as usize).min(n)),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }
}
