//! Small socket helpers shared by the packet and UDP backends: `setsockopt`/`getsockopt` of
//! plain integers and structs, `poll` for one descriptor, errno conversion.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

/// Turn a `-1` return into the `errno` error.
pub(super) fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

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

/// `getsockopt` of an `int` option.
pub fn get_int(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int) -> io::Result<i32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    cvt(r).map(|_| v)
}

/// Wait until `fd` is readable or `timeout` passes (`None`: indefinitely). Returns whether it
/// became readable. `EINTR` counts as a (spurious) wake-up.
pub fn poll_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<bool> {
    let ms = match timeout {
        None => -1,
        Some(t) => {
            // Round up so that a short timeout does not become a busy 0 ms poll.
            let ms = t.as_micros().div_ceil(1000);
            libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
        }
    };
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(r > 0 && p.revents & (libc::POLLIN | libc::POLLERR) != 0)
}
