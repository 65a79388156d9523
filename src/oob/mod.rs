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
//! The servers ([`listen`]) serve **one client**: the first that sends a well-formed first
//! message ([`Acceptor`]) gets the exchange, and with it (perftest) the R_Key and address of
//! the region under test. Clients that connect and send nothing, send part of a message or
//! garbage are dropped, each after at most its own deadline and without delaying the others
//! (up to [`MAX_PENDING`] connections are watched at once, the oldest dropped beyond that);
//! a perftest client whose handshake fails before the keys are exchanged is dropped too, and
//! the server waits for the next. They listen on all interfaces unless given a bind address (`--bind`), as
//! `ibv_rc_pingpong` and perftest do. Nothing in the exchange is authenticated: run the
//! servers on a trusted network or bind them to one (docs/security.md).

pub mod perftest;
pub mod pingpong;

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
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

/// [`Acceptor`]: at most this many accepted connections wait for their first message at
/// once; a connection beyond it drops the oldest.
pub const MAX_PENDING: usize = 256;

/// An out-of-band server's listener that hands out clients with a valid first message
/// ([`Acceptor::next`]). Connections accepted but not chosen stay watched for the next call
/// (a chosen client whose exchange fails is replaced by one that was waiting behind it).
#[derive(Debug)]
pub struct Acceptor {
    l: TcpListener,
    first_len: usize,
    valid: fn(&[u8]) -> bool,
    timeout: Duration,
    pending: std::collections::VecDeque<(TcpStream, SocketAddr, Instant)>,
}

impl Acceptor {
    /// Clients of `l` must send `first_len` bytes that `valid` accepts within `timeout` of
    /// their connection.
    pub fn new(
        l: TcpListener,
        first_len: usize,
        valid: fn(&[u8]) -> bool,
        timeout: Duration,
    ) -> Self {
        Acceptor {
            l,
            first_len,
            valid,
            timeout,
            pending: std::collections::VecDeque::new(),
        }
    }

    /// Accept connections until one has sent its first message and `valid` accepts it (left
    /// unread in the socket, for the exchange to read), and return it. A connection that
    /// closes, sends something `valid` refuses, or runs out of time is dropped (`dropped` is
    /// told who and why) while the others wait on. At most [`MAX_PENDING`] wait at once (a
    /// flood of connections drops the oldest, never blocks the listener). Waits for ever for a
    /// valid client, as perftest's servers do.
    pub fn next(&mut self, dropped: &mut dyn FnMut(SocketAddr, &str)) -> io::Result<TcpStream> {
        let mut buf = vec![0u8; self.first_len];
        self.l.set_nonblocking(true)?;
        loop {
            let mut busy = false;
            // Take every waiting connection.
            loop {
                match self.l.accept() {
                    Ok((s, a)) => {
                        busy = true;
                        if s.set_nonblocking(true).is_err() {
                            dropped(a, "could not be set non-blocking");
                            continue;
                        }
                        let deadline = Instant::now().checked_add(self.timeout);
                        self.pending
                            .push_back((s, a, deadline.unwrap_or_else(far_future)));
                        if self.pending.len() > MAX_PENDING {
                            if let Some((_, old, _)) = self.pending.pop_front() {
                                dropped(old, "too many connections waiting: the oldest is dropped");
                            }
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // Out of descriptors (a connection flood) or a connection reset before it
                    // was accepted: make room, try again on the next round.
                    Err(_) => {
                        if let Some((_, old, _)) = self.pending.pop_front() {
                            dropped(old, "out of resources: the oldest is dropped");
                        }
                        break;
                    }
                }
            }
            let now = Instant::now();
            let mut i = 0;
            while i < self.pending.len() {
                let (s, a, deadline) = &self.pending[i];
                let verdict = match s.peek(&mut buf) {
                    Ok(0) => Some("closed the connection before its first message"),
                    Ok(n) if n == self.first_len => {
                        if (self.valid)(&buf) {
                            let (s, _, _) = self.pending.remove(i).expect("index in range");
                            s.set_nonblocking(false)?;
                            return Ok(s);
                        }
                        Some("sent a malformed first message")
                    }
                    Ok(_) => {
                        (now >= *deadline).then_some("sent only part of its first message in time")
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        (now >= *deadline).then_some("sent nothing in time")
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => None,
                    Err(_) => Some("connection failed"),
                };
                match verdict {
                    Some(why) => {
                        busy = true;
                        let a = *a;
                        self.pending.remove(i);
                        dropped(a, why);
                    }
                    None => i += 1,
                }
            }
            if !busy {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Connections accepted and still waiting (not chosen, not dropped).
    pub fn waiting(&self) -> usize {
        self.pending.len()
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(1 << 30)
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

    /// A server takes the first client with a valid first message; a client that sends
    /// nothing, half a message, garbage or a megabyte of it is dropped (each for its reason),
    /// and none of them keeps the valid one waiting.
    #[test]
    fn accept_first_drops_bad_clients_and_takes_the_valid_one() {
        let l = listen(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), 0).unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<(SocketAddr, String)>();
        let valid: fn(&[u8]) -> bool = |b| b == b"HELLO-0123456789";
        let clients = std::thread::spawn(move || {
            let silent = TcpStream::connect(addr).unwrap();
            let mut half = TcpStream::connect(addr).unwrap();
            half.write_all(b"HELLO-01").unwrap();
            let mut garbage = TcpStream::connect(addr).unwrap();
            garbage.write_all(b"GET / HTTP/1.1\r\n").unwrap();
            let mut huge = TcpStream::connect(addr).unwrap();
            // Written from another thread: the server never reads it, so the write blocks
            // once the buffers are full and fails when the server drops the connection.
            let h = std::thread::spawn(move || {
                let _ = huge.write_all(&vec![b'A'; 1 << 20]);
            });
            let bad = [
                silent.local_addr().unwrap(),
                half.local_addr().unwrap(),
                garbage.local_addr().unwrap(),
            ];
            // The valid client connects once all four are dropped (the silent and half ones
            // at their 100 ms deadline): nothing of theirs may hold it up or be chosen.
            let mut seen = Vec::new();
            while seen.len() < 4 {
                seen.push(rx.recv().unwrap());
            }
            let mut good = TcpStream::connect(addr).unwrap();
            good.write_all(b"HELLO-0123456789").unwrap();
            let _ = h.join();
            (
                bad,
                seen,
                good.local_addr().unwrap(),
                silent,
                half,
                garbage,
                good,
            )
        });
        let mut acc = Acceptor::new(l, 16, valid, Duration::from_millis(100));
        let s = acc
            .next(&mut |a, why| {
                let _ = tx.send((a, why.to_string()));
            })
            .unwrap();
        let (bad, seen, good, ..) = clients.join().unwrap();
        assert_eq!(s.peer_addr().unwrap(), good);
        let why = |a: SocketAddr| {
            seen.iter()
                .find(|(x, _)| *x == a)
                .map(|(_, w)| w.as_str())
                .unwrap_or("not dropped")
        };
        assert_eq!(why(bad[0]), "sent nothing in time");
        assert_eq!(why(bad[1]), "sent only part of its first message in time");
        assert_eq!(why(bad[2]), "sent a malformed first message");
        assert_eq!(
            seen.iter()
                .filter(|(_, w)| w == "sent a malformed first message")
                .count(),
            2,
            "the garbage and the megabyte: {seen:?}"
        );
        // The chosen client's first message is still there for the exchange to read.
        let mut s = s;
        let mut first = [0u8; 16];
        read_exact(&mut s, &mut first, "first", Duration::from_secs(20)).unwrap();
        assert_eq!(&first, b"HELLO-0123456789");
    }

    /// A flood of connections that send nothing: the valid client that comes after 300 of
    /// them is taken at once (not after their deadlines), and no more than MAX_PENDING wait.
    #[test]
    fn accept_first_survives_a_connection_flood() {
        let l = listen(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), 0).unwrap();
        let addr = l.local_addr().unwrap();
        let clients = std::thread::spawn(move || {
            let flood: Vec<TcpStream> = (0..300)
                .map(|_| TcpStream::connect(addr).unwrap())
                .collect();
            let mut good = TcpStream::connect(addr).unwrap();
            good.write_all(b"HELLO-0123456789").unwrap();
            (flood, good.local_addr().unwrap(), good)
        });
        let mut drops = Vec::new();
        // The silent connections' deadline is far beyond the test's run.
        let mut acc = Acceptor::new(
            l,
            16,
            |b| b == b"HELLO-0123456789",
            Duration::from_secs(3600),
        );
        let s = acc.next(&mut |_, why| drops.push(why.to_string())).unwrap();
        let (flood, good, _g) = clients.join().unwrap();
        assert_eq!(s.peer_addr().unwrap(), good);
        let oldest = drops.iter().filter(|w| w.starts_with("too many")).count();
        assert_eq!(oldest, drops.len(), "{drops:?}");
        // Every flood connection the server took is either dropped or still waiting, and no
        // more than MAX_PENDING wait.
        assert!(
            acc.waiting() <= MAX_PENDING,
            "{} waited at once",
            acc.waiting()
        );
        assert!(
            oldest + acc.waiting() <= flood.len() && acc.waiting() > 0,
            "{oldest} dropped, {} waiting of {}",
            acc.waiting(),
            flood.len()
        );
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
