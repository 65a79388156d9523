//! Out-of-band connection exchanges, byte-exact with the rdma-core and perftest tools, so
//! that either end can be ferroce or the real tool:
//! - [`pingpong`]: `ibv_rc_pingpong`'s 52-byte `LID:QPN:PSN:GID` message and `done`;
//! - [`perftest`]: perftest's version / page size / cache line / MTU / key messages /
//!   barriers / bandwidth reports / `done` sequence over TCP port 18515.
//!
//! Every read has a timeout; a malformed or unexpected peer message ends the exchange with a
//! clear [`CmError`], never a hang.

pub mod perftest;
pub mod pingpong;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum CmError {
    /// The TCP connection failed.
    #[error("connection: {0}")]
    Io(#[from] io::Error),
    /// The peer did not send the named message in time.
    #[error("timed out after {0:?} waiting for the peer's {1}")]
    Timeout(Duration, &'static str),
    /// The peer closed the connection before sending the named message.
    #[error("peer closed the connection while we waited for its {0}")]
    Closed(&'static str),
    /// The peer's message could not be read.
    #[error("malformed {what} from the peer: {detail}")]
    Malformed {
        /// Which message.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
}

/// Read exactly `buf.len()` bytes (`what` names the message for errors).
pub(crate) fn read_exact(
    s: &mut TcpStream,
    buf: &mut [u8],
    what: &'static str,
    timeout: Duration,
) -> Result<(), CmError> {
    // Durations beyond any run (`Duration::MAX`: wait for ever) mean no timeout.
    s.set_read_timeout((timeout < Duration::from_secs(1 << 40)).then_some(timeout))?;
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(CmError::Closed(what)),
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(CmError::Timeout(timeout, what))
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

pub(crate) fn write_all(s: &mut TcpStream, buf: &[u8]) -> Result<(), CmError> {
    s.write_all(buf)?;
    Ok(())
}

/// A GID as 32 lowercase hex digits, the 16 bytes in network order (as ibv_rc_pingpong's
/// `gid_to_wire_gid` writes it: four `%08x` of the big-endian 32-bit words).
pub fn gid_to_wire(gid: &[u8; 16]) -> String {
    gid.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parse 32 hex digits back into a GID.
pub fn gid_from_wire(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(g)
}
