//! Out-of-band connection exchanges, byte-exact with the rdma-core and perftest tools, so
//! that either end can be ferroce or the real tool:
//! - [`pingpong`]: `ibv_rc_pingpong`'s 52-byte `LID:QPN:PSN:GID` message and `done`;
//! - [`perftest`]: perftest's version / page size / cache line / MTU / key messages /
//!   barriers / bandwidth reports / `done` sequence over TCP port 18515.
//!
//! Every message of the peer has a deadline (the whole message, not each `read()`: a peer
//! that drips one byte at a time cannot stretch it); a malformed or unexpected peer message
//! ends the exchange with a clear [`CmError`], never a hang.
//!
//! The servers ([`listen`]) serve **one client**: the first that connects gets the exchange,
//! and with it (perftest) the R_Key and address of the region under test; no other client is
//! accepted. They listen on all interfaces unless given a bind address (`--bind`), as
//! `ibv_rc_pingpong` and perftest do. Nothing in the exchange is authenticated: run the
//! servers on a trusted network or bind them to one (docs/security.md).

pub mod perftest;
pub mod pingpong;

use std::io::{self, Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

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

/// Read exactly `buf.len()` bytes (`what` names the message for errors) within `timeout` for
/// the whole message: each `read()` waits only for what is left of it, so a peer sending a
/// byte at a time cannot keep the exchange waiting beyond `timeout`.
pub(crate) fn read_exact(
    s: &mut TcpStream,
    buf: &mut [u8],
    what: &'static str,
    timeout: Duration,
) -> Result<(), CmError> {
    // Durations beyond any run (`Duration::MAX`: wait for ever) mean no deadline.
    let deadline = (timeout < Duration::from_secs(1 << 40))
        .then(|| Instant::now().checked_add(timeout))
        .flatten();
    let mut got = 0;
    while got < buf.len() {
        let left = match deadline {
            Some(d) => match d.checked_duration_since(Instant::now()) {
                // A zero read timeout is refused by the socket: the deadline has passed.
                Some(l) if !l.is_zero() => Some(l),
                _ => return Err(CmError::Timeout(timeout, what)),
            },
            None => None,
        };
        s.set_read_timeout(left)?;
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

/// The listening socket of an out-of-band server on `port`: on `bind` if given, else on all
/// interfaces (`::`, which takes IPv4 too where the system allows it, else `0.0.0.0`), as
/// `ibv_rc_pingpong` and perftest listen. The caller accepts one client (see the module
/// documentation).
pub fn listen(bind: Option<IpAddr>, port: u16) -> io::Result<TcpListener> {
    match bind {
        Some(a) => TcpListener::bind((a, port)),
        None => TcpListener::bind(("::", port)).or_else(|_| TcpListener::bind(("0.0.0.0", port))),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::Ipv4Addr;

    /// A client that sends `msg` one byte every `gap`, then keeps the connection open.
    fn drip(
        addr: std::net::SocketAddr,
        msg: Vec<u8>,
        gap: Duration,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            for b in msg {
                if c.write_all(&[b]).is_err() {
                    return; // the server gave up and closed
                }
                std::thread::sleep(gap);
            }
            std::thread::sleep(Duration::from_millis(200));
        })
    }

    #[test]
    fn a_client_dripping_bytes_cannot_stretch_the_message_deadline() {
        // Issue 17 finding 6: the timeout was set per read(), so a byte every 40 ms kept a
        // 300 ms deadline alive for the whole 52-byte message (about 2 s).
        let l = listen(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), 0).unwrap();
        let msg = b"0000:000011:670d5e:00000000000000000000ffff0a4d000c\0".to_vec();
        let client = drip(l.local_addr().unwrap(), msg, Duration::from_millis(40));
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; pingpong::MSG_LEN];
        let r = read_exact(
            &mut s,
            &mut buf,
            "connection message",
            Duration::from_millis(300),
        );
        drop(s);
        client.join().unwrap();
        assert!(
            matches!(r, Err(CmError::Timeout(_, "connection message"))),
            "a 52-byte message dripped over ~2 s was accepted under a 300 ms deadline: {r:?}"
        );
    }

    #[test]
    fn a_silent_or_half_message_client_ends_the_exchange() {
        let l = listen(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), 0).unwrap();
        let addr = l.local_addr().unwrap();
        // Connects and sends nothing: the deadline ends the wait.
        let silent = std::thread::spawn(move || {
            let c = TcpStream::connect(addr).unwrap();
            std::thread::sleep(Duration::from_millis(500));
            drop(c);
        });
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; perftest::KEY_LEN];
        let r = read_exact(&mut s, &mut buf, "key message", Duration::from_millis(100));
        assert!(matches!(r, Err(CmError::Timeout(..))), "{r:?}");
        silent.join().unwrap();
        // Sends half a key message and closes: Closed, not a hang or a short message.
        let half = std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(&[b'0'; perftest::KEY_LEN / 2]).unwrap();
        });
        let (mut s, _) = l.accept().unwrap();
        let r = read_exact(&mut s, &mut buf, "key message", Duration::from_secs(20));
        assert!(matches!(r, Err(CmError::Closed("key message"))), "{r:?}");
        half.join().unwrap();
    }

    #[test]
    fn listen_binds_the_given_address_only() {
        let l = listen(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), 0).unwrap();
        assert_eq!(
            l.local_addr().unwrap().ip(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        let any = listen(None, 0).unwrap();
        assert!(any.local_addr().unwrap().ip().is_unspecified());
    }
}
