//! SIGINT and SIGTERM as a flag: long-running tools (`ferroce switch`) poll it and end
//! cleanly, printing their counters, instead of dying mid-write.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

/// Install handlers for SIGINT and SIGTERM that set a process-wide flag, and return it.
/// Blocking system calls interrupted by the signal return `EINTR` (no `SA_RESTART`), so a
/// loop that sleeps in `poll(2)` sees the flag at once.
pub fn stop_on_sigint_sigterm() -> io::Result<&'static AtomicBool> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: sigaction is plain old data; all-zero is a valid value (empty mask, no flags).
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        // SAFETY: `sa.sa_mask` is a live sigset_t.
        unsafe { libc::sigemptyset(&mut sa.sa_mask) };
        // SAFETY: installs a handler that only stores to an atomic; `sa` outlives the call and
        // the old action is not asked for.
        super::cvt(unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) })?;
    }
    Ok(&STOP)
}

/// Whether SIGINT or SIGTERM arrived since [`stop_on_sigint_sigterm`] was called.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}
