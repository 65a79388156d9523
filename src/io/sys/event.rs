//! eventfd(2) and poll(2): how an idle engine thread sleeps until a packet arrives or an
//! application thread rings its doorbell, and how every backend waits for its descriptors
//! (the one `poll` wrapper of the crate).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A non-blocking eventfd counter.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A new counter at zero (non-blocking, closed on exec).
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; a negative return is an error, otherwise we own
        // the new descriptor.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Add one to the counter (wakes a poller). A full counter (never in practice) is ignored.
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own descriptor.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Reset the counter to zero.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64; EAGAIN when already zero is fine.
        let _ = unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    /// The descriptor, readable while the counter is not zero (for `poll`).
    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A non-blocking one-shot timer (timerfd, monotonic clock): readable once it fires, until
/// [`TimerFd::disarm`] or the next [`TimerFd::arm`].
#[derive(Debug)]
pub struct TimerFd(OwnedFd);

impl TimerFd {
    /// A new timer, not armed.
    pub fn new() -> io::Result<TimerFd> {
        // SAFETY: timerfd_create takes no pointers; a negative return is an error, otherwise
        // we own the new descriptor.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(TimerFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Fire once after `after` (at least 1 ns), replacing any earlier arming, and read away a
    /// firing not yet read.
    pub fn arm(&self, after: Duration) -> io::Result<()> {
        self.disarm_read();
        let after = after.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: libc::c_long::from(after.subsec_nanos() as i32),
            },
        };
        // SAFETY: `spec` is a live itimerspec the kernel only reads; no old value asked for.
        let r =
            unsafe { libc::timerfd_settime(self.0.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Stop the timer and read away a firing not yet read (the descriptor is then not
    /// readable).
    pub fn disarm(&self) {
        let zero = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
        };
        // SAFETY: as in `arm`; a zero value disarms.
        let _ =
            unsafe { libc::timerfd_settime(self.0.as_raw_fd(), 0, &zero, std::ptr::null_mut()) };
        self.disarm_read();
    }

    fn disarm_read(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64; EAGAIN when it has not fired is fine.
        let _ = unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    /// The descriptor, readable once the timer fired (for `poll` or a [`ReadySet`]).
    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

thread_local! {
    /// This thread's interrupt watch: 0 off, 1 armed, 2 a wait was interrupted since arming.
    static INTERRUPT_WATCH: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// Arm (`true`) or disarm this thread's interrupt watch. While it is armed, a wait of this
/// module that a signal handler interrupts (`EINTR`) is remembered, so that a blocking call
/// of the C library can return `EINTR` as rdma-core's do when the program's handler was
/// installed without `SA_RESTART` (qperf ends its test from `SIGALRM` that way, waiting in
/// `ibv_get_cq_event`). The waits themselves still treat `EINTR` as a spurious wake-up.
pub fn watch_interrupts(on: bool) {
    INTERRUPT_WATCH.with(|w| w.set(u8::from(on)));
}

/// Whether a wait of this thread was interrupted by a signal since
/// [`watch_interrupts`]`(true)` (always `false` while the watch is off).
pub fn interrupted() -> bool {
    INTERRUPT_WATCH.with(|w| w.get() == 2)
}

/// Wait until one of `fds` is readable or `timeout` passes (`None`: forever). Returns
/// whether any descriptor reported an event (readable, or an error or hang-up, which a read
/// then reports). EINTR counts as a spurious wake-up (`Ok(false)`).
///
/// The timeout is rounded up to whole milliseconds, `poll(2)`'s unit, so that a short wait
/// does not become a busy loop of zero-timeout polls; see [`poll_readable_precise`].
pub fn poll_readable<F: AsRawFd>(fds: &[F], timeout: Option<Duration>) -> io::Result<bool> {
    let ms = timeout.map(|d| {
        let ms = d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128);
        Duration::from_millis(ms as u64)
    });
    ppoll_readable(fds, ms)
}

/// Like [`poll_readable`], but the timeout is kept to the nanosecond (`ppoll(2)`), not
/// rounded up to milliseconds: for a loop that must wake at a precise instant (a switch
/// port's next departure) without spinning until then.
pub fn poll_readable_precise<F: AsRawFd>(fds: &[F], timeout: Duration) -> io::Result<bool> {
    ppoll_readable(fds, Some(timeout))
}

/// `ppoll(2)` for POLLIN on `fds` with `timeout` (`None`: forever), no signal mask.
fn ppoll_readable<F: AsRawFd>(fds: &[F], timeout: Option<Duration>) -> io::Result<bool> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `p` is a live array of `p.len()` pollfd structures; `tsp` is null or points to
    // `ts`, a valid timespec that outlives the call; no signal mask is passed. A descriptor
    // that is not open is no memory hazard: the kernel reports POLLNVAL for it.
    let r = unsafe {
        libc::ppoll(
            p.as_mut_ptr(),
            p.len() as libc::nfds_t,
            tsp,
            std::ptr::null(),
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            INTERRUPT_WATCH.with(|w| {
                if w.get() == 1 {
                    w.set(2);
                }
            });
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(r > 0)
}

/// One descriptor that is readable while any of a set of descriptors is (an epoll(7)
/// instance, level-triggered): how a device made of several sockets offers the one
/// descriptor an engine sleeps on.
#[derive(Debug)]
pub struct ReadySet(OwnedFd);

impl ReadySet {
    /// A set watching `fds` for input. The descriptors must stay open while the set is used
    /// (a closed one leaves the set by itself).
    pub fn new(fds: &[RawFd]) -> io::Result<ReadySet> {
        // SAFETY: epoll_create1 takes no pointers; a negative return is an error, otherwise
        // we own the new descriptor.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `ep` is a fresh descriptor nobody else owns.
        let set = ReadySet(unsafe { OwnedFd::from_raw_fd(ep) });
        for &fd in fds {
            set.add(fd)?;
        }
        Ok(set)
    }

    /// Watch `fd` too (it must stay open while the set is used).
    pub fn add(&self, fd: RawFd) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        // SAFETY: `ev` is a live epoll_event the kernel only reads; `self.0` is our epoll
        // descriptor; an invalid `fd` is reported as EBADF, no memory hazard.
        let r = unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Watch `fd` too, unless the set already does (a device whose descriptor changed
    /// re-offers it: see [`crate::io::PacketDevice::join_group`]).
    pub fn watch(&self, fd: RawFd) -> io::Result<()> {
        match self.add(fd) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            r => r,
        }
    }

    /// Watch `fd` for room to write (`on`), or stop (`!on`): the set is then readable while
    /// `fd` is writable, too. `fd` must not be in the set for input.
    pub fn watch_writable(&self, fd: RawFd, on: bool) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLOUT as u32,
            u64: fd as u64,
        };
        let op = if on {
            libc::EPOLL_CTL_ADD
        } else {
            libc::EPOLL_CTL_DEL
        };
        // SAFETY: as in `add`: `ev` is a live epoll_event the kernel only reads (ignored for
        // EPOLL_CTL_DEL), `self.0` our epoll descriptor.
        let r = unsafe { libc::epoll_ctl(self.0.as_raw_fd(), op, fd, &mut ev) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The descriptor, readable while one of the set's is (for `poll`).
    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timer_wakes_a_poller_once_armed() {
        let t = TimerFd::new().unwrap();
        assert!(!poll_readable(&[t.fd()], Some(Duration::from_millis(5))).unwrap());
        t.arm(Duration::from_millis(1)).unwrap();
        assert!(poll_readable(&[t.fd()], Some(Duration::from_secs(5))).unwrap());
        t.disarm();
        assert!(!poll_readable(&[t.fd()], Some(Duration::ZERO)).unwrap());
        // Armed far ahead, then disarmed: never readable.
        t.arm(Duration::from_secs(60)).unwrap();
        t.disarm();
        assert!(!poll_readable(&[t.fd()], Some(Duration::from_millis(5))).unwrap());
    }

    #[test]
    fn signal_wakes_a_poller() {
        let e = EventFd::new().unwrap();
        assert!(!poll_readable(&[e.fd()], Some(Duration::from_millis(1))).unwrap());
        e.signal();
        assert!(poll_readable(&[e.fd()], Some(Duration::from_millis(1000))).unwrap());
        e.drain();
        assert!(!poll_readable(&[e.fd()], Some(Duration::ZERO)).unwrap());
    }

    #[test]
    fn sockets_and_eventfds_in_one_wait() {
        use std::os::fd::AsFd;
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let e = EventFd::new().unwrap();
        let fds = [a.as_fd().as_raw_fd(), e.fd()];
        assert!(!poll_readable(&fds, Some(Duration::ZERO)).unwrap());
        assert!(!poll_readable_precise(&[a.as_fd()], Duration::from_micros(10)).unwrap());
        b.send_to(b"x", a.local_addr().unwrap()).unwrap();
        assert!(poll_readable(&[a.as_fd()], Some(Duration::from_secs(5))).unwrap());
        assert!(poll_readable_precise(&fds, Duration::from_secs(5)).unwrap());
        // A descriptor that is not open is reported (POLLNVAL), not waited on.
        assert!(poll_readable(&[1_000_000i32], Some(Duration::from_secs(5))).unwrap());
    }
}
