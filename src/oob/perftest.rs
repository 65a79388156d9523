//! perftest's out-of-band exchange over TCP ("Ethernet" data exchange method, port 18515), as
//! captured between real perftest 4.5-0.17 peers on Linux rxe (shared/rxe-vm/NOTES.md). The
//! client always writes first; the server answers with the same number of bytes:
//!
//! 1. version, 16 bytes: `"6.06"` NUL-padded;
//! 2. cycle buffer (page size), 4 bytes big-endian (4096);
//! 3. cache line size, 4 bytes big-endian (64);
//! 4. MTU, 2 bytes: the `ibv_mtu` enum printed with `%d`, cut to 2 bytes (`"3\0"` = 1024); the
//!    smaller MTU wins;
//! 5. per QP, the key message, 108 bytes with a GID (59 without):
//!    `"%04x:%04x:%06x:%06x:%08x:%016llx:" + 16 × "%02x:" + "%08x:"` of lid, out_reads, qpn,
//!    psn, rkey, vaddr, gid bytes, srqn, NUL-terminated;
//! 6. the key message again as a barrier, twice before the traffic; then, per test family
//!    (seen against perftest 4.5-0.17 on Linux rxe):
//!    - write_bw, read_bw, atomic_bw: the traffic, a barrier, the bandwidth reports (7.);
//!    - send_bw: a third barrier once the receiver has posted its receives, the traffic, and
//!      no barrier or report after it (each side prints what it measured itself);
//!    - send_lat, write_lat, read_lat: a third barrier (per size), the traffic, no report;
//! 7. write_bw / read_bw / atomic_bw only: 5 rounds of 8 bytes, big-endian: size, iterations,
//!    peak, average, message rate (the doubles byte-swapped as `hton_double` does), each round
//!    answered before the next is sent;
//! 8. close: a last key barrier, then each side writes `"done\0"` (write_lat: none of this,
//!    it closes the connection after its run).

use super::{read_exact, write_all, CmError};
use crate::ib::Mtu;
use std::net::TcpStream;
use std::time::Duration;

/// The version string perftest 4.5-0.17 sends.
pub const VERSION: &str = "6.06";
/// Default TCP port.
pub const PORT: u16 = 18515;
/// Key message length with a GID, NUL included.
pub const KEY_LEN: usize = 108;

/// One QP's connection data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyMsg {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// The responder resources this side offers (max_dest_rd_atomic).
    pub out_reads: u16,
    /// QP number.
    pub qpn: u32,
    /// Starting PSN.
    pub psn: u32,
    /// R_Key of the buffer the peer may access.
    pub rkey: u32,
    /// Virtual address of that buffer.
    pub vaddr: u64,
    /// GID (IPv4-mapped for IPv4).
    pub gid: [u8; 16],
    /// SRQ number (0 without SRQ).
    pub srqn: u32,
}

impl KeyMsg {
    /// The 108 bytes on the wire.
    pub fn to_wire(&self) -> [u8; KEY_LEN] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            self.rkey,
            self.vaddr
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; KEY_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    /// Parse the 108 bytes of a peer's key message.
    pub fn from_wire(buf: &[u8]) -> Result<KeyMsg, CmError> {
        let bad = |d: &str| CmError::Malformed {
            what: "perftest key message",
            detail: d.to_string(),
        };
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        let s = std::str::from_utf8(&buf[..end]).map_err(|_| bad("not ASCII"))?;
        let f: Vec<&str> = s.split(':').collect();
        // 6 fixed fields, 16 GID bytes, srqn, and the empty string after the last ':'.
        if f.len() != 24 {
            return Err(bad(&format!(
                "{} fields, expected 23",
                f.len().saturating_sub(1)
            )));
        }
        let hex = |i: usize, name: &str| u64::from_str_radix(f[i], 16).map_err(|_| bad(name));
        let mut gid = [0u8; 16];
        for (k, g) in gid.iter_mut().enumerate() {
            *g = u8::from_str_radix(f[6 + k], 16).map_err(|_| bad("GID byte"))?;
        }
        let m = KeyMsg {
            lid: hex(0, "lid")? as u16,
            out_reads: hex(1, "out_reads")? as u16,
            qpn: hex(2, "qpn")? as u32,
            psn: hex(3, "psn")? as u32,
            rkey: hex(4, "rkey")? as u32,
            vaddr: hex(5, "vaddr")?,
            gid,
            srqn: hex(22, "srqn")? as u32,
        };
        if m.qpn > 0xff_ffff || m.psn > 0xff_ffff {
            return Err(bad("QPN or PSN wider than 24 bits"));
        }
        Ok(m)
    }
}

/// The bandwidth report exchanged after a bandwidth test.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct BwReport {
    /// Message size (bytes).
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// Peak bandwidth (perftest's unit: MB/s or Gb/s).
    pub bw_peak: f64,
    /// Average bandwidth.
    pub bw_avg: f64,
    /// Message rate (Mpps).
    pub msg_rate: f64,
}

impl BwReport {
    /// The 40 bytes on the wire (big-endian integers and IEEE doubles).
    pub fn to_wire(&self) -> [u8; 40] {
        let mut o = [0u8; 40];
        o[0..8].copy_from_slice(&self.size.to_be_bytes());
        o[8..16].copy_from_slice(&self.iters.to_be_bytes());
        o[16..24].copy_from_slice(&self.bw_peak.to_bits().to_be_bytes());
        o[24..32].copy_from_slice(&self.bw_avg.to_bits().to_be_bytes());
        o[32..40].copy_from_slice(&self.msg_rate.to_bits().to_be_bytes());
        o
    }
    /// Read the 40 bytes of a peer's report.
    pub fn from_wire(b: &[u8; 40]) -> BwReport {
        let u = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        BwReport {
            size: u(0),
            iters: u(8),
            bw_peak: f64::from_bits(u(16)),
            bw_avg: f64::from_bits(u(24)),
            msg_rate: f64::from_bits(u(32)),
        }
    }
}

/// C's `atof` of a version string: its leading decimal number ("6.06" is 6.06, "5.70.1" is
/// 5.7, "" is 0).
fn c_atof(s: &str) -> f64 {
    let b = s.trim_start().as_bytes();
    let mut end = 0;
    let mut dot = false;
    while end < b.len() && (b[end].is_ascii_digit() || (b[end] == b'.' && !dot)) {
        dot |= b[end] == b'.';
        end += 1;
    }
    std::str::from_utf8(&b[..end])
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0.0)
}

/// The `ibv_mtu` enum value of a path MTU.
pub fn mtu_enum(m: Mtu) -> u8 {
    m.to_ibv() as u8
}

/// Which end of the exchange this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Connects (the side given the server's address).
    Client,
    /// Listens.
    Server,
}

/// A message channel that carries perftest's exchange when the control connection is an
/// RDMA-CM connected RC QP (`-R`, "Data ex. method : rdma_cm"): each message one SEND of
/// exactly its size, received into a posted buffer.
pub trait MsgLink: Send {
    /// Send one message.
    fn send(&mut self, msg: &[u8]) -> Result<(), CmError>;
    /// The next message of the peer (`len` bytes expected), waiting at most `timeout`.
    fn recv(
        &mut self,
        len: usize,
        what: &'static str,
        timeout: Duration,
    ) -> Result<Vec<u8>, CmError>;
    /// Connect the test QP `qpn` over RDMA-CM (client: REQ to the server's port; server:
    /// accept the next connection request) with `resources` as responder resources and
    /// initiator depth and `retry_count`; returns when it is established.
    fn connect_qp(
        &mut self,
        qpn: crate::wire::QpNumber,
        resources: u8,
        retry_count: u8,
        timeout: Duration,
    ) -> Result<(), CmError>;
    /// Connect the UD test QP `qpn` over RDMA-CM's SIDR (perftest `-c UD -R`; the QP is
    /// brought to RTS with RDMA-CM's UD Q_Key): the client sends a SIDR_REQ to the server's
    /// port and returns the server's QP from the SIDR_REP; the server answers the next
    /// request with `qpn` and returns `None` (a SIDR_REQ does not say which QP sent it).
    fn connect_ud(
        &mut self,
        qpn: crate::wire::QpNumber,
        timeout: Duration,
    ) -> Result<Option<UdPeer>, CmError>;
}

/// The server's UD QP as the SIDR_REP announced it (`event->param.ud`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct UdPeer {
    /// The server's QP.
    pub qpn: crate::wire::QpNumber,
    /// The Q_Key to send with.
    pub qkey: u32,
    /// The server's address (the GID of the address handle).
    pub ip: std::net::IpAddr,
}

/// The control connection: perftest's TCP socket, or an RDMA-CM connected QP.
pub enum Link {
    /// TCP (perftest's default; messages as text where perftest writes text).
    Tcp(TcpStream),
    /// RDMA-CM (`-R`): binary messages over SEND.
    Rdma(Box<dyn MsgLink>),
}

/// The size of perftest's `struct pingpong_dest` (the key message over rdma_cm).
pub const DEST_LEN: usize = 56;

impl KeyMsg {
    /// `struct pingpong_dest` as perftest sends it over rdma_cm (`rdma_write_keys`): lid,
    /// out_reads, qpn, psn, rkey as big-endian 32-bit words, 4 bytes of padding, vaddr as a
    /// big-endian 64-bit word, the GID, srqn, gid_index (captured from perftest 6.06 against
    /// rxe: `00000000 00000001 00000012 00f19296 000003c3 ........ 000055b5bbccf000 ...`).
    pub fn to_dest(&self, gid_index: u32) -> [u8; DEST_LEN] {
        let mut b = [0u8; DEST_LEN];
        b[0..4].copy_from_slice(&u32::from(self.lid).to_be_bytes());
        b[4..8].copy_from_slice(&u32::from(self.out_reads).to_be_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        b[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        b[32..48].copy_from_slice(&self.gid);
        b[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        b[52..56].copy_from_slice(&gid_index.to_be_bytes());
        b
    }

    /// Parse a peer's `struct pingpong_dest` (perftest reads no srqn from it: 0).
    pub fn from_dest(b: &[u8]) -> Result<KeyMsg, CmError> {
        if b.len() < DEST_LEN {
            return Err(CmError::Malformed {
                what: "perftest pingpong_dest",
                detail: format!("{} bytes, expected {DEST_LEN}", b.len()),
            });
        }
        let w = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[32..48]);
        Ok(KeyMsg {
            lid: w(0) as u16,
            out_reads: w(4) as u16,
            qpn: w(8) & 0xff_ffff,
            psn: w(12) & 0xff_ffff,
            rkey: w(16),
            vaddr: u64::from_be_bytes(b[24..32].try_into().expect("8 bytes")),
            gid,
            srqn: 0,
        })
    }
}

/// Whether `b` is perftest's first message: a NUL-padded version string of 16 bytes that a
/// perftest from 5.70 on would accept (see [`Session::handshake`]).
pub fn is_version_message(b: &[u8]) -> bool {
    if b.len() != 16 {
        return false;
    }
    let end = b.iter().position(|&c| c == 0).unwrap_or(16);
    std::str::from_utf8(&b[..end]).is_ok_and(|v| !v.is_empty() && c_atof(v) >= 5.70)
}

/// A perftest server's acceptor on `l`: each client must send its version message within
/// `timeout` of connecting.
pub fn acceptor(l: std::net::TcpListener, timeout: Duration) -> super::Acceptor {
    super::Acceptor::new(l, 16, is_version_message, timeout)
}

/// A perftest server's next client: the first connection that sends a valid version message
/// ([`super::Acceptor::next`]); the others are dropped, each with a warning.
pub fn accept_client(a: &mut super::Acceptor) -> Result<TcpStream, CmError> {
    Ok(a.next(&mut |who, why| tracing::warn!("dropped client {who}: {why}"))?)
}

/// A perftest control connection.
pub struct Session {
    /// The control connection.
    pub link: Link,
    /// Which end this is.
    pub role: Role,
    /// How long to wait for each message of the peer.
    pub timeout: Duration,
    /// The peer's cycle buffer (page size) and cache line size from the handshake: perftest
    /// lays out its buffers with them (each half is `max(size, page)` rounded up to a line).
    pub peer_page: u32,
    /// The peer's cache line size.
    pub peer_cache_line: u32,
    /// The GID index sent in rdma_cm key messages (`gid_index` of `pingpong_dest`).
    pub gid_index: u32,
    /// A TCP server's acceptor ([`Session::with_acceptor`]) until the handshake succeeds: a
    /// client whose handshake fails is dropped and the next one taken from it.
    acceptor: Option<super::Acceptor>,
}

impl Session {
    /// A session over an accepted or connected stream.
    pub fn new(stream: TcpStream, role: Role, timeout: Duration) -> Self {
        let _ = stream.set_nodelay(true);
        Session {
            link: Link::Tcp(stream),
            role,
            timeout,
            peer_page: 4096,
            peer_cache_line: 64,
            gid_index: 0,
            acceptor: None,
        }
    }

    /// A session over an RDMA-CM connected control QP (perftest `-R`).
    pub fn new_rdma(link: Box<dyn MsgLink>, role: Role, timeout: Duration) -> Self {
        Session {
            link: Link::Rdma(link),
            role,
            timeout,
            peer_page: 4096,
            peer_cache_line: 64,
            gid_index: 0,
            acceptor: None,
        }
    }

    /// A server's session that may take another client from `a` while the handshake (version,
    /// page size, cache line, MTU: before any key is sent) fails, instead of failing the run.
    /// Once a handshake succeeds the acceptor is closed (its listener and every connection
    /// still waiting): the run has its one client.
    pub fn with_acceptor(mut self, a: super::Acceptor) -> Self {
        self.acceptor = Some(a);
        self
    }

    /// Whether the exchange runs over rdma_cm (binary messages).
    pub fn is_rdma(&self) -> bool {
        matches!(self.link, Link::Rdma(_))
    }

    fn write(&mut self, ours: &[u8]) -> Result<(), CmError> {
        match &mut self.link {
            Link::Tcp(s) => write_all(s, ours),
            Link::Rdma(l) => l.send(ours),
        }
    }

    fn read(&mut self, len: usize, what: &'static str) -> Result<Vec<u8>, CmError> {
        match &mut self.link {
            Link::Tcp(s) => {
                let mut theirs = vec![0u8; len];
                read_exact(s, &mut theirs, what, self.timeout)?;
                Ok(theirs)
            }
            Link::Rdma(l) => l.recv(len, what, self.timeout),
        }
    }

    /// One `ctx_xchg_data` round: the client writes then reads, the server reads then writes.
    fn xchg(&mut self, ours: &[u8], what: &'static str) -> Result<Vec<u8>, CmError> {
        match self.role {
            Role::Client => {
                self.write(ours)?;
                self.read(ours.len(), what)
            }
            Role::Server => {
                let t = self.read(ours.len(), what)?;
                self.write(ours)?;
                Ok(t)
            }
        }
    }

    /// rdma_cm only: connect the test QP (see [`MsgLink::connect_qp`]).
    pub fn connect_qp(
        &mut self,
        qpn: crate::wire::QpNumber,
        resources: u8,
        retry_count: u8,
    ) -> Result<(), CmError> {
        let t = self.timeout;
        match &mut self.link {
            Link::Rdma(l) => l.connect_qp(qpn, resources, retry_count, t),
            Link::Tcp(_) => Err(CmError::Malformed {
                what: "rdma_cm",
                detail: "the test QP of a TCP session is connected by hand".into(),
            }),
        }
    }

    /// The UD test QP over RDMA-CM's SIDR (see [`MsgLink::connect_ud`]).
    pub fn connect_ud(&mut self, qpn: crate::wire::QpNumber) -> Result<Option<UdPeer>, CmError> {
        let t = self.timeout;
        match &mut self.link {
            Link::Rdma(l) => l.connect_ud(qpn, t),
            Link::Tcp(_) => Err(CmError::Malformed {
                what: "rdma_cm",
                detail: "the test QP of a TCP session is connected by hand".into(),
            }),
        }
    }

    /// rdma_cm only: a key-message round with an all-zero `pingpong_dest`, as perftest does
    /// before and after it connects the test QPs.
    pub fn zero_round(&mut self) -> Result<(), CmError> {
        self.xchg(&[0u8; DEST_LEN], "key message").map(|_| ())
    }

    /// Steps 1–4: version, page size, cache line, MTU. Returns the agreed (smaller) MTU.
    ///
    /// As perftest 6.06 (`check_version_compatibility`), a peer older than 5.70 is refused;
    /// from 5.70 on, the later fields have the sizes used here.
    ///
    /// A server with a listener ([`Session::with_listener`]) drops a client whose handshake
    /// fails and runs it again with the next valid one ([`accept_client`]).
    pub fn handshake(&mut self, mtu: Mtu) -> Result<Mtu, CmError> {
        loop {
            let e = match self.handshake_once(mtu) {
                Ok(m) => {
                    self.acceptor = None;
                    return Ok(m);
                }
                Err(e) => e,
            };
            let (Role::Server, Some(acc)) = (self.role, &mut self.acceptor) else {
                return Err(e);
            };
            let who = match &self.link {
                Link::Tcp(s) => s
                    .peer_addr()
                    .map_or_else(|_| "a client".to_string(), |a| a.to_string()),
                Link::Rdma(_) => return Err(e),
            };
            tracing::warn!("dropped {who}: {e}; waiting for the next client");
            let s = accept_client(acc)?;
            let _ = s.set_nodelay(true);
            self.link = Link::Tcp(s);
        }
    }

    fn handshake_once(&mut self, mtu: Mtu) -> Result<Mtu, CmError> {
        let mut v = [0u8; 16];
        v[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
        let theirs = self.xchg(&v, "version")?;
        let end = theirs.iter().position(|&b| b == 0).unwrap_or(16);
        let ver = std::str::from_utf8(&theirs[..end]).unwrap_or("");
        if c_atof(ver) < 5.70 {
            return Err(CmError::Malformed {
                what: "perftest version",
                detail: format!(
                    "{ver:?}: Current implementation is not compatible with versions older than 5.70"
                ),
            });
        }
        let page = self.xchg(&4096u32.to_be_bytes(), "page size")?;
        let line = self.xchg(&64u32.to_be_bytes(), "cache line size")?;
        let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        self.peer_page = be(&page);
        self.peer_cache_line = be(&line);
        let ours = [b'0' + mtu_enum(mtu), 0];
        let t = self.xchg(&ours, "MTU")?;
        let their = t[0].wrapping_sub(b'0');
        let theirs = Mtu::from_ibv(u32::from(their)).ok_or_else(|| CmError::Malformed {
            what: "MTU",
            detail: format!("{t:?}"),
        })?;
        Ok(if theirs.bytes() < mtu.bytes() {
            theirs
        } else {
            mtu
        })
    }

    /// Step 5: one key message per QP.
    pub fn exchange_keys(&mut self, ours: &[KeyMsg]) -> Result<Vec<KeyMsg>, CmError> {
        ours.iter().map(|k| self.hand_shake(k)).collect()
    }

    /// perftest's `ctx_hand_shake`: one key message each way (the client's first); returns
    /// the peer's.
    pub fn hand_shake(&mut self, ours: &KeyMsg) -> Result<KeyMsg, CmError> {
        if self.is_rdma() {
            let t = self.xchg(&ours.to_dest(self.gid_index), "key message")?;
            return KeyMsg::from_dest(&t);
        }
        let t = self.xchg(&ours.to_wire(), "key message")?;
        KeyMsg::from_wire(&t)
    }

    /// A barrier: `ours` (QP 0's key message) exchanged once more.
    pub fn barrier(&mut self, ours: &KeyMsg) -> Result<(), CmError> {
        self.hand_shake(ours).map(|_| ())
    }

    /// Step 7: bandwidth reports — five `ctx_xchg_data` rounds of 8 bytes each (size,
    /// iterations, peak, average, message rate), as a perftest peer sends them: a peer waits
    /// for our 8-byte answer before it writes its next field.
    pub fn bw_reports(&mut self, ours: &BwReport) -> Result<BwReport, CmError> {
        let w = ours.to_wire();
        let mut b = [0u8; 40];
        for i in 0..5 {
            let t = self.xchg(&w[i * 8..i * 8 + 8], "bandwidth report")?;
            b[i * 8..i * 8 + 8].copy_from_slice(&t);
        }
        Ok(BwReport::from_wire(&b))
    }

    /// Step 8: the closing barrier and `done`.
    pub fn close(&mut self, ours: &KeyMsg) -> Result<(), CmError> {
        self.barrier(ours)?;
        let Link::Tcp(stream) = &mut self.link else {
            // rdma_cm: no `done` (the connections are disconnected instead).
            return Ok(());
        };
        write_all(stream, b"done\0")?;
        let mut d = [0u8; 5];
        // The peer's `done` (best effort: it may already have closed).
        let _ = read_exact(
            stream,
            &mut d,
            "done",
            self.timeout.min(Duration::from_secs(2)),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn key_message_matches_a_captured_perftest_message() {
        // ib_write_bw client on Linux rxe (shared/rxe-vm/NOTES.md).
        let wire = b"0000:0001:000011:a5244e:0000025e:00007f9f506bb000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:0c:00000000:\0";
        assert_eq!(wire.len(), KEY_LEN);
        let k = KeyMsg::from_wire(wire).unwrap();
        assert_eq!(
            (k.out_reads, k.qpn, k.psn, k.rkey, k.vaddr),
            (1, 0x11, 0xa5244e, 0x25e, 0x7f9f506bb000)
        );
        assert_eq!(k.gid[10..], [0xff, 0xff, 10, 77, 0, 12]);
        assert_eq!(&k.to_wire()[..], &wire[..]);
    }

    #[test]
    fn malformed_key_messages_are_errors() {
        let good = KeyMsg {
            lid: 0,
            out_reads: 1,
            qpn: 0x11,
            psn: 1,
            rkey: 2,
            vaddr: 3,
            gid: [0; 16],
            srqn: 0,
        }
        .to_wire();
        let mut short = good;
        short[50] = 0;
        let mut bad_hex = good;
        bad_hex[6] = b'z';
        for b in [&short[..], &bad_hex[..], &[0u8; 108][..], b"x:y"] {
            assert!(KeyMsg::from_wire(b).is_err());
        }
    }

    #[test]
    fn bw_report_round_trip_is_big_endian() {
        let r = BwReport {
            size: 65536,
            iters: 200,
            bw_peak: 1.5,
            bw_avg: 1.25,
            msg_rate: 0.002,
        };
        let w = r.to_wire();
        assert_eq!(&w[..8], &[0, 0, 0, 0, 0, 1, 0, 0]);
        assert_eq!(&w[16..24], &1.5f64.to_bits().to_be_bytes());
        assert_eq!(BwReport::from_wire(&w), r);
    }

    #[test]
    fn full_exchange_between_a_client_and_a_server() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let key = |q| KeyMsg {
            lid: 0,
            out_reads: 16,
            qpn: q,
            psn: q + 1,
            rkey: 7,
            vaddr: 0x1000,
            gid: [1; 16],
            srqn: 0,
        };
        let srv = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut ses = Session::new(s, Role::Server, Duration::from_secs(5));
            let mtu = ses.handshake(Mtu::M4096).unwrap();
            let theirs = ses.exchange_keys(&[key(0x22)]).unwrap();
            ses.barrier(&key(0x22)).unwrap();
            let r = ses
                .bw_reports(&BwReport {
                    size: 1,
                    iters: 2,
                    bw_peak: 3.0,
                    bw_avg: 4.0,
                    msg_rate: 5.0,
                })
                .unwrap();
            ses.close(&key(0x22)).unwrap();
            (mtu, theirs, r)
        });
        let s = TcpStream::connect(addr).unwrap();
        let mut ses = Session::new(s, Role::Client, Duration::from_secs(5));
        assert_eq!(ses.handshake(Mtu::M1024).unwrap(), Mtu::M1024);
        assert_eq!(ses.exchange_keys(&[key(0x11)]).unwrap(), vec![key(0x22)]);
        ses.barrier(&key(0x11)).unwrap();
        let r = ses
            .bw_reports(&BwReport {
                size: 9,
                iters: 8,
                bw_peak: 7.0,
                bw_avg: 6.0,
                msg_rate: 5.0,
            })
            .unwrap();
        assert_eq!(r.bw_avg, 4.0);
        ses.close(&key(0x11)).unwrap();
        let (mtu, theirs, r) = srv.join().unwrap();
        assert_eq!(mtu, Mtu::M1024);
        assert_eq!(theirs, vec![key(0x11)]);
        assert_eq!(r.size, 9);
    }

    /// A server with its listener drops a client whose handshake fails after a valid version
    /// (an MTU byte that is no MTU, then a stall), and runs the whole exchange with the next
    /// client; without the listener the same client fails the server's handshake.
    #[test]
    fn a_server_drops_a_failed_handshake_and_serves_the_next_client() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let bad_client = move |mtu_byte: u8| {
            let mut c = TcpStream::connect(addr).unwrap();
            let mut v = [0u8; 16];
            v[..4].copy_from_slice(b"6.06");
            let mut all = v.to_vec();
            all.extend_from_slice(&4096u32.to_be_bytes());
            all.extend_from_slice(&64u32.to_be_bytes());
            all.extend_from_slice(&[mtu_byte, 0]);
            c.write_all(&all).unwrap();
            c
        };
        let srv = std::thread::spawn(move || {
            let mut acc = acceptor(l, Duration::from_secs(5));
            let s = accept_client(&mut acc).unwrap();
            let mut ses = Session::new(s, Role::Server, Duration::from_secs(5)).with_acceptor(acc);
            let mtu = ses.handshake(Mtu::M4096).unwrap();
            let key = KeyMsg {
                lid: 0,
                out_reads: 1,
                qpn: 0x22,
                psn: 1,
                rkey: 7,
                vaddr: 0x1000,
                gid: [1; 16],
                srqn: 0,
            };
            let theirs = ses.exchange_keys(&[key]).unwrap();
            (mtu, theirs[0].qpn)
        });
        let _bad = bad_client(b'z');
        let s = TcpStream::connect(addr).unwrap();
        let mut ses = Session::new(s, Role::Client, Duration::from_secs(20));
        assert_eq!(ses.handshake(Mtu::M2048).unwrap(), Mtu::M2048);
        let key = KeyMsg {
            lid: 0,
            out_reads: 1,
            qpn: 0x11,
            psn: 1,
            rkey: 8,
            vaddr: 0x2000,
            gid: [2; 16],
            srqn: 0,
        };
        assert_eq!(ses.exchange_keys(&[key]).unwrap()[0].qpn, 0x22);
        assert_eq!(srv.join().unwrap(), (Mtu::M2048, 0x11));

        // Without a listener the failed handshake is the server's error.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr2 = l.local_addr().unwrap();
        let srv = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            Session::new(s, Role::Server, Duration::from_secs(5)).handshake(Mtu::M4096)
        });
        let mut c = TcpStream::connect(addr2).unwrap();
        let mut all = b"6.06".to_vec();
        all.resize(16, 0);
        all.extend_from_slice(&[0, 0, 16, 0, 0, 0, 0, 64, b'z', 0]);
        c.write_all(&all).unwrap();
        let r = srv.join().unwrap();
        assert!(
            matches!(r, Err(CmError::Malformed { what: "MTU", .. })),
            "{r:?}"
        );
    }

    #[test]
    fn version_messages_are_recognised() {
        let msg = |s: &str| {
            let mut v = [0u8; 16];
            v[..s.len()].copy_from_slice(s.as_bytes());
            v
        };
        assert!(is_version_message(&msg("6.06")));
        assert!(is_version_message(&msg("5.70")));
        assert!(!is_version_message(&msg("5.60")));
        assert!(!is_version_message(&msg("")));
        assert!(!is_version_message(b"GET / HTTP/1.1\r\n"));
        assert!(!is_version_message(&[0xff; 16]));
        assert!(!is_version_message(&msg("6.06")[..15]));
    }

    #[test]
    fn bw_reports_go_as_five_answered_rounds() {
        // A perftest client writes 8 bytes and waits for 8 back before the next field
        // (captured from ib_write_bw on rxe against ferroce).
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let srv = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut ses = Session::new(s, Role::Server, Duration::from_secs(5));
            ses.bw_reports(&BwReport {
                size: 1,
                iters: 2,
                bw_peak: 3.0,
                bw_avg: 4.0,
                msg_rate: 5.0,
            })
            .unwrap()
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let mine = BwReport {
            size: 65536,
            iters: 200,
            bw_peak: 0.5,
            bw_avg: 0.25,
            msg_rate: 0.1,
        }
        .to_wire();
        let mut theirs = [0u8; 40];
        for i in 0..5 {
            write_all(&mut c, &mine[i * 8..i * 8 + 8]).unwrap();
            read_exact(
                &mut c,
                &mut theirs[i * 8..i * 8 + 8],
                "field",
                Duration::from_secs(5),
            )
            .unwrap();
        }
        assert_eq!(BwReport::from_wire(&theirs).bw_avg, 4.0);
        assert_eq!(srv.join().unwrap().iters, 200);
    }

    #[test]
    fn a_silent_peer_times_out() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let _keep = std::thread::spawn(move || {
            let c = l.accept();
            std::thread::sleep(Duration::from_millis(500));
            drop(c);
        });
        let s = TcpStream::connect(addr).unwrap();
        let mut ses = Session::new(s, Role::Client, Duration::from_millis(100));
        assert!(matches!(
            ses.handshake(Mtu::M1024),
            Err(CmError::Timeout(..))
        ));
    }
}
