//! Unix datagram sockets with abstract names, and the sender's credentials of what they
//! receive: how devices that share one address and port hand each other frames
//! ([`crate::io::share`]). Abstract names live in the network namespace (no file to clean
//! up, gone with the process), and anyone in the namespace may send to one, so a receiver
//! takes a datagram only with the sender's user ID attached by the kernel (`SO_PASSCRED`).

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// A non-blocking datagram socket bound to the abstract `name`, receiving its senders'
/// credentials, with send and receive buffers of `buf` bytes where the system allows
/// (`EADDRINUSE`: another socket has the name).
pub fn bind_abstract(name: &[u8], buf: usize) -> io::Result<UnixDatagram> {
    let sock = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name)?)?;
    sock.set_nonblocking(true)?;
    let fd = sock.as_fd();
    super::sockutil::set_int(fd, libc::SOL_SOCKET, libc::SO_PASSCRED, 1)?;
    let n = libc::c_int::try_from(buf).unwrap_or(libc::c_int::MAX);
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if super::sockutil::set_int(fd, libc::SOL_SOCKET, force, n).is_err() {
            let _ = super::sockutil::set_int(fd, libc::SOL_SOCKET, plain, n);
        }
    }
    Ok(sock)
}

/// Send `data` as one datagram to the socket bound to the abstract `name`, without
/// blocking (`ECONNREFUSED`: nobody has the name; `EAGAIN`: its queue is full).
pub fn send_abstract(sock: &UnixDatagram, name: &[u8], data: &[u8]) -> io::Result<()> {
    let n = sock.send_to_addr(data, &SocketAddr::from_abstract_name(name)?)?;
    if n != data.len() {
        return Err(io::Error::from(io::ErrorKind::WriteZero));
    }
    Ok(())
}

/// A non-blocking datagram socket connected to the abstract `name` (`ECONNREFUSED`: nobody
/// has it), with a send buffer of `buf` bytes where the system allows. Connected, it can be
/// polled for room in the receiver's queue (`POLLOUT`).
pub fn connect_abstract(name: &[u8], buf: usize) -> io::Result<UnixDatagram> {
    let sock = UnixDatagram::unbound()?;
    sock.connect_addr(&SocketAddr::from_abstract_name(name)?)?;
    sock.set_nonblocking(true)?;
    let n = libc::c_int::try_from(buf).unwrap_or(libc::c_int::MAX);
    let fd = sock.as_fd();
    if super::sockutil::set_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, n).is_err() {
        let _ = super::sockutil::set_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, n);
    }
    Ok(sock)
}

/// The effective user ID of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid(2) takes nothing and cannot fail.
    unsafe { libc::geteuid() }
}

/// One received datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// Its length (at most the buffer's).
    pub len: usize,
    /// It was longer than the buffer (the rest is lost).
    pub truncated: bool,
    /// The sender's user ID, as the kernel saw it (`None`: no credentials came with it).
    pub uid: Option<u32>,
}

/// Receive one datagram into `buf` without blocking: `Ok(None)` when none is queued.
pub fn recv_with_uid(sock: &UnixDatagram, buf: &mut [u8]) -> io::Result<Option<Received>> {
    // Room for one SCM_CREDENTIALS message (struct ucred), aligned for cmsghdr.
    let mut ctrl = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is a valid empty one; the pointers set below outlive the
    // call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&ctrl);
    // SAFETY: recvmsg(2) writes at most iov_len bytes into `buf` and at most msg_controllen
    // bytes into `ctrl`, both live and exclusively borrowed for the call.
    let n = unsafe { libc::recvmsg(sock.as_fd().as_raw_fd(), &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock => Ok(None),
            _ => Err(e),
        };
    }
    let mut uid = None;
    // SAFETY: the CMSG_* macros walk the control buffer the kernel filled, within
    // msg_controllen; a credentials message carries a whole struct ucred (read unaligned).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                let cred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::ucred>());
                uid = Some(cred.uid);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Some(Received {
        len: (n as usize).min(buf.len()),
        truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
        uid,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_comes_with_its_senders_user_id() {
        let name = format!("ferroce-test-unix-{}", std::process::id());
        let a = bind_abstract(name.as_bytes(), 1 << 16).unwrap();
        // The name is taken while `a` lives.
        assert_eq!(
            bind_abstract(name.as_bytes(), 1 << 16).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
        let b = UnixDatagram::unbound().unwrap();
        send_abstract(&b, name.as_bytes(), b"hello").unwrap();
        let mut buf = [0u8; 3];
        let r = recv_with_uid(&a, &mut buf).unwrap().unwrap();
        assert_eq!((r.len, r.truncated, r.uid), (3, true, Some(euid())));
        assert_eq!(&buf, b"hel");
        assert_eq!(recv_with_uid(&a, &mut buf).unwrap(), None);
        drop(a);
        // Nobody has the name now.
        let e = send_abstract(&b, name.as_bytes(), b"x").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
    }
}
