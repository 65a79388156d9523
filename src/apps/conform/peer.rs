//! The other side of each peer tool's ordinary out-of-band exchange, and what each tool's
//! QP and memory region allow (its "profile"): the tester learns the peer's QPN, PSN, R_Key,
//! buffer and MTU exactly as the real client would, then plays scripted packets instead of
//! the tool's traffic.
//!
//! | tool | exchange | QP rights | R_Key rights | receives | peer sends to us |
//! | --- | --- | --- | --- | --- | --- |
//! | `ibv_rc_pingpong` (server) | 52-byte message, `done` | none | no R_Key | 500 posted | a SEND per message it receives |
//! | `ib_write_bw` (server) | perftest | write | write | none | nothing |
//! | `ib_read_bw` (server) | perftest | read | read | none | nothing |
//! | `ib_send_bw` (server) | perftest | write | local only | 512 posted | nothing |
//! | `ib_atomic_bw` (server) | perftest | atomic | atomic | none | nothing |
//! | `ferroce conform --serve` | a line protocol (below) | chosen per test | all, plus keys lacking each right | chosen per test | SENDs on request |
//! | `ib_*_bw HOST` (client) | perftest, the tester as server | (not tested) | (not tested) | (not tested) | its WRITEs, SENDs, READs or ATOMICs, without end |
//!
//! In the client roles the tester listens on the perftest port, answers the exchange as
//! perftest's server does (announcing [`CLIENT_OUT_READS`] outstanding READ/ATOMICs, which
//! perftest takes as its `max_rd_atomic`), and is the responder of the peer's requests: the
//! tests script the responses (ACKs withheld, NAKs, RNR NAKs, ghost ACKs, READ responses out
//! of order) and watch the peer's requester. perftest 4.5/6.x sets `retry_cnt` 7,
//! `rnr_retry` 7 and the local ACK timeout from `-u` (14 by default): the tester assumes
//! those ([`RetrySettings::PERFTEST`]).
//!
//! (perftest 4.5-0.17 sets the QP's access flags from the verb and registers its buffer
//! with `LOCAL_WRITE` plus the verb's remote right; `ibv_rc_pingpong` leaves the QP's access
//! flags 0; both use `min_rnr_timer` 12, perftest takes `max_dest_rd_atomic` from the
//! `out_reads` it announces, `ibv_rc_pingpong` uses 1.)
//!
//! The ferroce peer's control protocol: one line per request, one line per answer (`ok
//! key=value ...` or `err message`), over TCP; see [`super::serve`].

use super::frames::ip_of_gid;
use crate::oob::perftest::{BwReport, KeyMsg, Role, Session as PtSession};
use crate::oob::pingpong::{self, Dest};
use crate::oob::CmError;
use crate::verbs::Mtu;
use crate::wire::MacAddr;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The peer tools the tester can talk to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum PeerTool {
    /// `ibv_rc_pingpong -g N` as the server.
    Pingpong,
    /// `ib_write_bw -x N` as the server.
    PerftestWrite,
    /// `ib_read_bw -x N` as the server.
    PerftestRead,
    /// `ib_send_bw -x N` as the server.
    PerftestSend,
    /// `ib_atomic_bw -x N` as the server.
    PerftestAtomic,
    /// `ferroce conform --serve` (every test applicable; memory and completions observable).
    Ferroce,
    /// `ib_write_bw -x N HOST` as the client: the tester is the server and its responder,
    /// the peer's requester sends RDMA WRITEs.
    PerftestWriteClient,
    /// `ib_send_bw -x N HOST` as the client (the peer's requester sends SENDs).
    PerftestSendClient,
    /// `ib_read_bw -x N HOST` as the client (the peer's requester sends RDMA READs).
    PerftestReadClient,
    /// `ib_atomic_bw -x N HOST` as the client (the peer's requester sends ATOMICs).
    PerftestAtomicClient,
}

impl PeerTool {
    /// Every peer tool.
    pub const ALL: [PeerTool; 10] = [
        PeerTool::Pingpong,
        PeerTool::PerftestWrite,
        PeerTool::PerftestRead,
        PeerTool::PerftestSend,
        PeerTool::PerftestAtomic,
        PeerTool::Ferroce,
        PeerTool::PerftestWriteClient,
        PeerTool::PerftestSendClient,
        PeerTool::PerftestReadClient,
        PeerTool::PerftestAtomicClient,
    ];
    /// The perftest client roles: the peer connects to the tester, which listens as
    /// perftest's server; only the peer's requester is tested.
    pub fn is_client(self) -> bool {
        matches!(
            self,
            PeerTool::PerftestWriteClient
                | PeerTool::PerftestSendClient
                | PeerTool::PerftestReadClient
                | PeerTool::PerftestAtomicClient
        )
    }
    /// The name `--peer-tool` takes.
    pub fn name(self) -> &'static str {
        match self {
            PeerTool::Pingpong => "pingpong",
            PeerTool::PerftestWrite => "perftest-write",
            PeerTool::PerftestRead => "perftest-read",
            PeerTool::PerftestSend => "perftest-send",
            PeerTool::PerftestAtomic => "perftest-atomic",
            PeerTool::Ferroce => "ferroce",
            PeerTool::PerftestWriteClient => "perftest-write-client",
            PeerTool::PerftestSendClient => "perftest-send-client",
            PeerTool::PerftestReadClient => "perftest-read-client",
            PeerTool::PerftestAtomicClient => "perftest-atomic-client",
        }
    }
    /// The real program this stands for.
    pub fn program(self) -> &'static str {
        match self {
            PeerTool::Pingpong => "ibv_rc_pingpong",
            PeerTool::PerftestWrite => "ib_write_bw",
            PeerTool::PerftestRead => "ib_read_bw",
            PeerTool::PerftestSend => "ib_send_bw",
            PeerTool::PerftestAtomic => "ib_atomic_bw",
            PeerTool::Ferroce => "ferroce conform --serve",
            PeerTool::PerftestWriteClient => "ib_write_bw HOST",
            PeerTool::PerftestSendClient => "ib_send_bw HOST",
            PeerTool::PerftestReadClient => "ib_read_bw HOST",
            PeerTool::PerftestAtomicClient => "ib_atomic_bw HOST",
        }
    }
}

/// Remote access rights (of a QP, or of the memory region behind an R_Key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Rights {
    /// Remote READ.
    pub read: bool,
    /// Remote WRITE.
    pub write: bool,
    /// Remote atomics.
    pub atomic: bool,
}

impl Rights {
    /// No remote access.
    pub const NONE: Rights = Rights {
        read: false,
        write: false,
        atomic: false,
    };
    /// READ, WRITE and atomics.
    pub const ALL: Rights = Rights {
        read: true,
        write: true,
        atomic: true,
    };
    /// `"rwa"`-style letters.
    pub fn letters(self) -> String {
        let mut s = String::new();
        if self.read {
            s.push('r');
        }
        if self.write {
            s.push('w');
        }
        if self.atomic {
            s.push('a');
        }
        if s.is_empty() {
            s.push('-');
        }
        s
    }
    /// From `rwa`-style letters (others ignored).
    pub fn parse(s: &str) -> Rights {
        Rights {
            read: s.contains('r'),
            write: s.contains('w'),
            atomic: s.contains('a'),
        }
    }
}

/// How the tester can see what the peer's memory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadBack {
    /// Not at all.
    None,
    /// With RDMA READ (the R_Key allows it).
    Read,
    /// Eight bytes at a time with FETCH_AND_ADD of 0 (the R_Key allows atomics).
    Atomic,
    /// The ferroce peer's control channel reads it.
    Control,
}

/// How the tester can count the peer's receive completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvCount {
    /// Not at all.
    None,
    /// `ibv_rc_pingpong` answers each completed receive with one SEND.
    Echo,
    /// The ferroce peer's control channel reports them.
    Control,
}

/// A memory region of the peer: R_Key, start address, length (a lower bound where the tool
/// does not say), rights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Its R_Key.
    pub rkey: u32,
    /// Its start address.
    pub va: u64,
    /// Its length.
    pub len: u64,
    /// Its access rights.
    pub rights: Rights,
}

/// What the tester knows about the peer after the exchange.
#[derive(Clone, Debug)]
pub struct PeerInfo {
    /// The peer tool.
    pub tool: PeerTool,
    /// The peer's QP number.
    pub qpn: u32,
    /// The PSN the peer's requester starts at.
    pub psn: u32,
    /// The peer's GID.
    pub gid: [u8; 16],
    /// Path MTU in bytes.
    pub mtu: u32,
    /// The QP's remote access rights.
    pub qp_rights: Rights,
    /// The region the exchange announced (None: no R_Key announced).
    pub region: Option<Region>,
    /// Regions lacking one right each (the ferroce peer): no read, no write, no atomic.
    pub lacking: Option<[Region; 3]>,
    /// Receive WQEs posted when the session starts (None: unknown).
    pub recvs: Option<u32>,
    /// The peer's requester sends us messages (pingpong echoes; the ferroce peer on request).
    pub requester: bool,
    /// How its memory can be read back.
    pub readback: ReadBack,
    /// How its receive completions can be counted.
    pub recv_count: RecvCount,
    /// READ/atomic requests the peer's responder accepts at once.
    pub max_dest_rd_atomic: u32,
    /// The RNR NAK timer code the peer uses.
    pub min_rnr_timer: u8,
    /// The peer's CNP interval, if it says it sends CNPs.
    pub cnp_interval: Option<Duration>,
    /// The requester's retry settings of the peer's QP (None: unknown).
    pub retry: Option<RetrySettings>,
    /// The session can only be ended by making the peer's QP fail (the tool has no other
    /// way to stop early: `ibv_rc_pingpong`, `ib_send_bw`).
    pub end_by_error: bool,
    /// The READ/ATOMIC requests the tester's responder announced it takes at once (the
    /// peer's `max_rd_atomic`; client roles).
    pub our_rd_atomic: Option<u32>,
    /// One line about the peer for the report.
    pub about: String,
}

impl PeerInfo {
    /// The peer's IP address (from its GID).
    pub fn ip(&self) -> IpAddr {
        ip_of_gid(self.gid)
    }
}

/// The retry settings of the peer's requester (IBTA 9.7.6.1: the local ACK timeout and
/// its retry count, and the RNR retry count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetrySettings {
    /// Retries after a local ACK timeout or a sequence-error NAK (7 is seven).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK (7: without end).
    pub rnr_retry: u8,
    /// The local ACK timeout code: 4.096 µs × 2^timeout.
    pub timeout: u8,
}

impl RetrySettings {
    /// What `ibv_rc_pingpong` sets (rdma-core's libibverbs/examples/rc_pingpong.c).
    pub const PINGPONG: RetrySettings = RetrySettings {
        retry_cnt: 7,
        rnr_retry: 7,
        timeout: 14,
    };
    /// What perftest's clients set (retry_cnt 7, rnr_retry 7, `-u` 14 by default).
    pub const PERFTEST: RetrySettings = RetrySettings {
        retry_cnt: 7,
        rnr_retry: 7,
        timeout: 14,
    };
    /// The local ACK timeout (None for code 0: no timeout).
    pub fn ack_timeout(&self) -> Option<Duration> {
        (self.timeout > 0).then(|| Duration::from_nanos(4096u64 << self.timeout))
    }
}

/// Our side of the exchange.
#[derive(Clone, Copy, Debug)]
pub struct Ours {
    /// Our QP number.
    pub qpn: u32,
    /// Our starting PSN.
    pub psn: u32,
    /// Our GID.
    pub gid: [u8; 16],
    /// Our MAC address.
    pub mac: MacAddr,
    /// The MTU we offer (perftest takes the smaller).
    pub mtu: Mtu,
}

/// What a test asks of a new session (only the ferroce peer can honour the QP settings;
/// the real tools fix them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionReq {
    /// Our starting PSN (default: the runner's).
    pub start_psn: Option<u32>,
    /// The peer QP's remote access rights (ferroce peer).
    pub qp_rights: Option<Rights>,
    /// Receive WQEs to post (ferroce peer).
    pub recvs: Option<u32>,
    /// A fresh session even if the current one is usable.
    pub fresh: bool,
    /// The ferroce peer's requester retry settings (default: ibv_rc_pingpong's).
    pub retry: Option<RetrySettings>,
}

/// Why a session with the peer tool could not be opened, or a request on it failed.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The peer's port did not accept a connection within the patience.
    #[error("connect to {addr}: {err}")]
    Connect {
        /// The peer's address.
        addr: SocketAddr,
        /// The last attempt's error.
        #[source]
        err: std::io::Error,
    },
    /// The tool's out-of-band exchange failed.
    #[error("{tool} exchange: {err}")]
    Exchange {
        /// `ibv_rc_pingpong` or `perftest`.
        tool: &'static str,
        /// Why.
        #[source]
        err: CmError,
    },
    /// No perftest client connected within the patience (client roles).
    #[error("no perftest client connected to {addr} within {patience:?} (run the client in a loop: while :; do ib_write_bw -x N HOST; done)")]
    NoClient {
        /// The address the tester listened on.
        addr: SocketAddr,
        /// How long it waited.
        patience: Duration,
    },
    /// perftest's server sent no key message.
    #[error("perftest exchange: no key message")]
    NoKeyMessage,
    /// perftest's closing exchange (barrier, reports, `done`) failed.
    #[error("perftest closing exchange: {0}")]
    Closing(#[source] CmError),
    /// The peer announced an all-zero GID.
    #[error("the peer announced an all-zero GID: run {tool} with {flag} (RoCE needs a GID)")]
    ZeroGid {
        /// `ibv_rc_pingpong` or `perftest`.
        tool: &'static str,
        /// The tool's option that sets a GID index.
        flag: &'static str,
    },
    /// The peer's GID and ours are of different IP versions.
    #[error("the peer's GID is {peer}, ours {ours}: use the same IP version (-x/-g on the peer, --gid-index here)")]
    IpVersion {
        /// The peer's address (from its GID).
        peer: IpAddr,
        /// Ours.
        ours: IpAddr,
    },
    /// No neighbour entry for the peer.
    #[error("cannot resolve the MAC address of {0}")]
    NoMac(IpAddr),
    /// `hello` was answered by something else.
    #[error("not a ferroce conformance peer: {0:?}")]
    NotAPeer(String),
    /// The control connection failed.
    #[error("ferroce peer: {0}")]
    Io(#[source] std::io::Error),
    /// The ferroce peer closed the control connection.
    #[error("ferroce peer closed the control connection")]
    Closed,
    /// No answer within the timeout.
    #[error("ferroce peer: no answer to {what:?} within {timeout:?}")]
    NoAnswer {
        /// The request's first word.
        what: String,
        /// How long it was awaited.
        timeout: Duration,
    },
    /// An answer longer than 1 MiB, or one that took too long to arrive.
    #[error("ferroce peer: answer too long or too slow")]
    TooLong,
    /// The ferroce peer answered `err`.
    #[error("ferroce peer refused {what:?}: {why}")]
    Refused {
        /// The request's first word.
        what: String,
        /// The peer's reason.
        why: String,
    },
    /// The answer is neither `ok` nor `err`.
    #[error("answered {what:?} with {shown:?}: not a ferroce conformance peer")]
    Garbled {
        /// The request's first word.
        what: String,
        /// The answer's first 60 characters.
        shown: String,
    },
    /// `read` returned the wrong number of hex digits, or something else than hex digits.
    #[error("ferroce peer: read returned {0:?}, not {1} hex digits")]
    BadRead(String, usize),
    /// A key is missing from an answer.
    #[error("ferroce peer: no {0}= in its answer")]
    Missing(String),
    /// A key's value in an answer does not parse.
    #[error("ferroce peer: bad {key}={value}")]
    Bad {
        /// The key.
        key: String,
        /// Its value.
        value: String,
    },
}

/// An open session with the peer tool.
pub trait Session: Send {
    /// What the exchange told us about the peer.
    fn info(&self) -> &PeerInfo;
    /// The ferroce peer's control channel.
    fn control(&mut self) -> Option<&mut Control> {
        None
    }
    /// The tool's closing steps, where it has them (perftest's barrier, reports and `done`).
    fn finish(&mut self, timeout: Duration) -> Result<(), PeerError>;
    /// Whether the peer still holds the out-of-band connection (a perftest server or the
    /// ferroce peer that closes it has gone away; `ibv_rc_pingpong` closes it by design).
    fn alive(&mut self) -> bool {
        true
    }
}

/// Whether `s` is still open (no EOF or error pending; waiting data is left unread).
fn still_open(s: &TcpStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return false;
    }
    let mut b = [0u8; 1];
    let r = match s.peek(&mut b) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
    };
    let _ = s.set_nonblocking(false);
    r
}

/// Connect, retrying until `patience` runs out (a peer tool started in a loop may be between
/// two runs).
pub fn connect(addr: SocketAddr, patience: Duration) -> Result<TcpStream, PeerError> {
    let t0 = Instant::now();
    loop {
        match TcpStream::connect_timeout(
            &addr,
            Duration::from_secs(1).min(patience.max(Duration::from_millis(10))),
        ) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) if t0.elapsed() >= patience => {
                return Err(PeerError::Connect { addr, err: e });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

// ---------------------------------------------------------------------------------------
// ibv_rc_pingpong

struct PingpongSession {
    info: PeerInfo,
    _stream: TcpStream,
}

impl Session for PingpongSession {
    fn info(&self) -> &PeerInfo {
        &self.info
    }
    fn finish(&mut self, _: Duration) -> Result<(), PeerError> {
        Ok(())
    }
}

fn open_pingpong(
    addr: SocketAddr,
    ours: &Ours,
    peer_mtu: u32,
    timeout: Duration,
    patience: Duration,
) -> Result<Box<dyn Session>, PeerError> {
    let mut s = connect(addr, patience)?;
    let mine = Dest {
        lid: 0,
        qpn: ours.qpn,
        psn: ours.psn,
        gid: ours.gid,
    };
    let what = |err| PeerError::Exchange {
        tool: "ibv_rc_pingpong",
        err,
    };
    let theirs = pingpong::client_exchange(&mut s, &mine, timeout).map_err(what)?;
    pingpong::send_done(&mut s).map_err(what)?;
    if theirs.gid == [0; 16] {
        return Err(PeerError::ZeroGid {
            tool: "ibv_rc_pingpong",
            flag: "-g",
        });
    }
    let info = PeerInfo {
        tool: PeerTool::Pingpong,
        qpn: theirs.qpn,
        psn: theirs.psn,
        gid: theirs.gid,
        mtu: peer_mtu,
        qp_rights: Rights::NONE,
        region: None,
        lacking: None,
        recvs: Some(500),
        requester: true,
        readback: ReadBack::None,
        recv_count: RecvCount::Echo,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        cnp_interval: None,
        retry: Some(RetrySettings::PINGPONG),
        end_by_error: true,
        our_rd_atomic: None,
        about: format!(
            "ibv_rc_pingpong QPN {:#08x} PSN {:#08x} GID {} (path MTU {} assumed: --peer-mtu)",
            theirs.qpn,
            theirs.psn,
            ip_of_gid(theirs.gid),
            peer_mtu
        ),
    };
    Ok(Box::new(PingpongSession { info, _stream: s }))
}

// ---------------------------------------------------------------------------------------
// perftest

/// A perftest session, the tester as perftest's client or (the client roles) its server.
struct PerftestSession {
    info: PeerInfo,
    ses: PtSession,
    /// The tester's key message, for the closing barrier; `None` in the client roles.
    ours: Option<KeyMsg>,
}

impl Session for PerftestSession {
    fn info(&self) -> &PeerInfo {
        &self.info
    }
    fn alive(&mut self) -> bool {
        match &self.ses.link {
            crate::oob::perftest::Link::Tcp(s) => still_open(s),
            crate::oob::perftest::Link::Rdma(_) => true,
        }
    }
    fn finish(&mut self, timeout: Duration) -> Result<(), PeerError> {
        let Some(ours) = self.ours else {
            // A client role: the client ends on the fatal NAK `close` sends (its requests
            // never complete otherwise): nothing more to say on the socket.
            return Ok(());
        };
        if self.info.tool == PeerTool::PerftestSend {
            // ib_send_bw waits for its messages before it reads the socket again.
            return Ok(());
        }
        self.ses.timeout = timeout;
        let r = BwReport {
            size: 8,
            iters: 0,
            bw_peak: 0.0,
            bw_avg: 0.0,
            msg_rate: 0.0,
        };
        self.ses
            .barrier(&ours)
            .and_then(|_| self.ses.bw_reports(&r))
            .and_then(|_| self.ses.close(&ours))
            .map(drop)
            .map_err(PeerError::Closing)
    }
}

/// perftest's exchange, either role: the MTU handshake, the key messages (the tester's
/// announcing `(out_reads, rkey, vaddr)`), two barriers and a third when `sends` (ib_send_bw's,
/// once its receives are up). Returns the MTU, the tester's key message and the peer's.
fn perftest_exchange(
    ses: &mut PtSession,
    ours: &Ours,
    (out_reads, rkey, vaddr): (u16, u32, u64),
    sends: bool,
) -> Result<(Mtu, KeyMsg, KeyMsg), PeerError> {
    let what = |err| PeerError::Exchange {
        tool: "perftest",
        err,
    };
    let mtu = ses.handshake(ours.mtu).map_err(what)?;
    let mine = KeyMsg {
        lid: 0,
        out_reads,
        qpn: ours.qpn,
        psn: ours.psn,
        rkey,
        vaddr,
        gid: ours.gid,
        srqn: 0,
    };
    let theirs = ses.exchange_keys(&[mine]).map_err(what)?;
    let t = *theirs.first().ok_or(PeerError::NoKeyMessage)?;
    ses.barrier(&mine).map_err(what)?;
    ses.barrier(&mine).map_err(what)?;
    if sends {
        ses.barrier(&mine).map_err(what)?;
    }
    if t.gid == [0; 16] {
        return Err(PeerError::ZeroGid {
            tool: "perftest",
            flag: "-x",
        });
    }
    Ok((mtu, mine, t))
}

/// A perftest session: the tester connects to a server tool as perftest's client, or (the
/// client roles) waits for the client as its server.
fn open_perftest(
    tool: PeerTool,
    addr: SocketAddr,
    ours: &Ours,
    timeout: Duration,
    patience: Duration,
) -> Result<Box<dyn Session>, PeerError> {
    let client = tool.is_client();
    let (s, role) = if client {
        (accept(addr, patience)?, Role::Server)
    } else {
        (connect(addr, patience)?, Role::Client)
    };
    let mut ses = PtSession::new(s, role, timeout);
    // ib_send_bw's receiver says its receives are up with a third barrier (in the client
    // roles the tester is the receiver and takes any SEND).
    let sends = matches!(tool, PeerTool::PerftestSend | PeerTool::PerftestSendClient);
    let announce = if client {
        (CLIENT_OUT_READS, CLIENT_RKEY, CLIENT_VA)
    } else {
        (16, 0, 0)
    };
    let (mtu, mine, t) = perftest_exchange(&mut ses, ours, announce, sends)?;
    let (info, ours) = if client {
        (client_info(tool, mtu, &t), None)
    } else {
        (server_info(tool, mtu, &t, ses.peer_page), Some(mine))
    };
    Ok(Box::new(PerftestSession { info, ses, ours }))
}

/// What the exchange with a perftest server tool tells about its responder.
fn server_info(tool: PeerTool, mtu: Mtu, t: &KeyMsg, peer_page: u32) -> PeerInfo {
    let (qp_rights, rights, recvs, readback) = match tool {
        PeerTool::PerftestWrite => (
            Rights {
                write: true,
                ..Rights::NONE
            },
            Rights {
                write: true,
                ..Rights::NONE
            },
            Some(0),
            ReadBack::None,
        ),
        PeerTool::PerftestRead => (
            Rights {
                read: true,
                ..Rights::NONE
            },
            Rights {
                read: true,
                ..Rights::NONE
            },
            Some(0),
            ReadBack::Read,
        ),
        PeerTool::PerftestAtomic => (
            Rights {
                atomic: true,
                ..Rights::NONE
            },
            Rights {
                atomic: true,
                ..Rights::NONE
            },
            Some(0),
            ReadBack::Atomic,
        ),
        // ib_send_bw: QP REMOTE_WRITE | LOCAL_WRITE, buffer LOCAL_WRITE only.
        _ => (
            Rights {
                write: true,
                ..Rights::NONE
            },
            Rights::NONE,
            None,
            ReadBack::None,
        ),
    };
    PeerInfo {
        tool,
        qpn: t.qpn,
        psn: t.psn,
        gid: t.gid,
        mtu: mtu.bytes(),
        qp_rights,
        region: Some(Region {
            rkey: t.rkey,
            va: t.vaddr,
            // perftest's buffer is at least a page (cycle buffer) long.
            len: u64::from(peer_page.clamp(64, 1 << 20)),
            rights,
        }),
        lacking: None,
        recvs,
        requester: false,
        readback,
        recv_count: RecvCount::None,
        max_dest_rd_atomic: u32::from(t.out_reads).max(1),
        min_rnr_timer: 12,
        cnp_interval: None,
        retry: None,
        end_by_error: tool == PeerTool::PerftestSend,
        our_rd_atomic: None,
        about: format!(
            "{} QPN {:#08x} PSN {:#08x} R_Key {:#010x} VA {:#x} out_reads {} GID {} path MTU {}",
            tool.program(),
            t.qpn,
            t.psn,
            t.rkey,
            t.vaddr,
            t.out_reads,
            ip_of_gid(t.gid),
            mtu.bytes()
        ),
    }
}

// ---------------------------------------------------------------------------------------
// perftest clients: the tester as perftest's server

/// The READ/ATOMIC requests the tester announces as its `out_reads` in the client roles
/// (perftest's client makes it its `max_rd_atomic`): small, so that `req.max-rd-atomic` can
/// see a requester exceed it.
pub const CLIENT_OUT_READS: u16 = 2;
/// The R_Key the tester announces in the client roles (it has no memory: WRITEs are
/// acknowledged, READs answered with a pattern, ATOMICs against eight bytes per address).
pub const CLIENT_RKEY: u32 = 0x00c0_f0a5;
/// The buffer address the tester announces in the client roles.
pub const CLIENT_VA: u64 = 0x7e57_0000_0000;

/// Accept one connection on `addr` within `patience`.
fn accept(addr: SocketAddr, patience: Duration) -> Result<TcpStream, PeerError> {
    let l = std::net::TcpListener::bind(addr).map_err(|err| PeerError::Connect { addr, err })?;
    l.set_nonblocking(true).map_err(PeerError::Io)?;
    let t0 = Instant::now();
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(PeerError::Io)?;
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if t0.elapsed() >= patience {
                    return Err(PeerError::NoClient { addr, patience });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => return Err(PeerError::Connect { addr, err }),
        }
    }
}

/// What the exchange with a perftest client tells about its requester.
fn client_info(tool: PeerTool, mtu: Mtu, t: &KeyMsg) -> PeerInfo {
    PeerInfo {
        tool,
        qpn: t.qpn,
        psn: t.psn,
        gid: t.gid,
        mtu: mtu.bytes(),
        qp_rights: Rights::NONE,
        region: None,
        lacking: None,
        recvs: None,
        requester: true,
        readback: ReadBack::None,
        recv_count: RecvCount::None,
        max_dest_rd_atomic: u32::from(t.out_reads).max(1),
        min_rnr_timer: 12,
        cnp_interval: None,
        retry: Some(RetrySettings::PERFTEST),
        end_by_error: true,
        our_rd_atomic: Some(u32::from(CLIENT_OUT_READS)),
        about: format!(
            "{} (client) QPN {:#08x} PSN {:#08x} out_reads {} GID {} path MTU {}; the tester announced out_reads {CLIENT_OUT_READS}",
            tool.program(),
            t.qpn,
            t.psn,
            t.out_reads,
            ip_of_gid(t.gid),
            mtu.bytes()
        ),
    }
}

// ---------------------------------------------------------------------------------------
// the ferroce peer

/// The ferroce peer's control channel (client side).
pub struct Control {
    r: BufReader<TcpStream>,
    w: TcpStream,
    timeout: Duration,
    /// What `hello` said.
    pub hello: HashMap<String, String>,
}

/// Parse `key=value` words.
pub fn kv(line: &str) -> HashMap<String, String> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn hex(m: &HashMap<String, String>, k: &str) -> Result<u64, PeerError> {
    let v = m.get(k).ok_or_else(|| PeerError::Missing(k.into()))?;
    u64::from_str_radix(v.trim_start_matches("0x"), 16).map_err(|_| PeerError::Bad {
        key: k.into(),
        value: v.clone(),
    })
}

impl Control {
    /// Connect to the ferroce peer's control channel at `addr`, trying for `patience`; each
    /// answer is awaited for `timeout`.
    pub fn connect(
        addr: SocketAddr,
        timeout: Duration,
        patience: Duration,
    ) -> Result<Control, PeerError> {
        let s = connect(addr, patience)?;
        s.set_read_timeout(Some(timeout)).map_err(PeerError::Io)?;
        let w = s.try_clone().map_err(PeerError::Io)?;
        let mut c = Control {
            r: BufReader::new(s),
            w,
            timeout,
            hello: HashMap::new(),
        };
        let h = c.call("hello")?;
        if !h.starts_with("ferroce-conform/1") {
            return Err(PeerError::NotAPeer(h));
        }
        c.hello = kv(&h);
        Ok(c)
    }

    /// Send one request and return the text after `ok `.
    pub fn call(&mut self, req: &str) -> Result<String, PeerError> {
        writeln!(self.w, "{req}").map_err(PeerError::Io)?;
        let mut line = String::new();
        let t0 = Instant::now();
        loop {
            match self.r.read_line(&mut line) {
                Ok(0) => return Err(PeerError::Closed),
                Ok(_) if line.ends_with('\n') => break,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(PeerError::NoAnswer {
                        what: req.split_whitespace().next().unwrap_or("").into(),
                        timeout: self.timeout,
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(PeerError::Io(e)),
            }
            if t0.elapsed() > self.timeout || line.len() > 1 << 20 {
                return Err(PeerError::TooLong);
            }
        }
        let line = line.trim_end();
        let what = req.split_whitespace().next().unwrap_or("");
        if let Some(rest) = line.strip_prefix("ok") {
            Ok(rest.trim_start().to_string())
        } else if let Some(e) = line.strip_prefix("err ") {
            Err(PeerError::Refused {
                what: what.into(),
                why: e.into(),
            })
        } else {
            Err(PeerError::Garbled {
                what: what.into(),
                shown: line.chars().take(60).collect(),
            })
        }
    }

    /// Read `len` bytes of the peer's memory at `va`.
    pub fn read_mem(&mut self, va: u64, len: usize) -> Result<Vec<u8>, PeerError> {
        let s = self.call(&format!("read va={va:x} len={len}"))?;
        let h = s.trim();
        let bytes = (h.len() == 2 * len)
            .then(|| {
                (0..len)
                    .map(|i| u8::from_str_radix(h.get(2 * i..2 * i + 2)?, 16).ok())
                    .collect::<Option<Vec<u8>>>()
            })
            .flatten();
        bytes.ok_or_else(|| PeerError::BadRead(h.chars().take(40).collect(), 2 * len))
    }

    /// Receive completions so far: (successful, with an error).
    pub fn recv_completions(&mut self) -> Result<(u64, u64), PeerError> {
        let m = kv(&self.call("recvs")?);
        let n = |k: &str| m.get(k).and_then(|v| v.parse().ok()).unwrap_or(0);
        Ok((n("ok"), n("err")))
    }

    /// Send completions so far: (successful, with an error).
    pub fn send_completions(&mut self) -> Result<(u64, u64), PeerError> {
        let m = kv(&self.call("sends")?);
        let n = |k: &str| m.get(k).and_then(|v| v.parse().ok()).unwrap_or(0);
        Ok((n("ok"), n("err")))
    }

    /// The status of the peer's first send completion with an error (`RETRY_EXC_ERR`,
    /// `RNR_RETRY_EXC_ERR`, ..., or `none`).
    pub fn first_send_error(&mut self) -> Result<String, PeerError> {
        Ok(kv(&self.call("sends")?)
            .get("first_err")
            .cloned()
            .unwrap_or_else(|| "none".into()))
    }

    /// Make the peer post a SEND of `len` bytes to us.
    pub fn post_send(&mut self, len: usize) -> Result<(), PeerError> {
        self.call(&format!("post_send len={len}")).map(drop)
    }

    /// The peer QP's state (`RTS`, `ERR`, ...).
    pub fn state(&mut self) -> Result<String, PeerError> {
        Ok(kv(&self.call("state")?)
            .get("state")
            .cloned()
            .unwrap_or_default())
    }
}

struct FerroceSession {
    info: PeerInfo,
    ctl: Control,
}

impl Session for FerroceSession {
    fn info(&self) -> &PeerInfo {
        &self.info
    }
    fn alive(&mut self) -> bool {
        still_open(&self.ctl.w)
    }
    fn control(&mut self) -> Option<&mut Control> {
        Some(&mut self.ctl)
    }
    fn finish(&mut self, _: Duration) -> Result<(), PeerError> {
        let _ = self.ctl.call("bye");
        Ok(())
    }
}

fn open_ferroce(
    addr: SocketAddr,
    ours: &Ours,
    req: &SessionReq,
    timeout: Duration,
    patience: Duration,
) -> Result<Box<dyn Session>, PeerError> {
    let mut ctl = Control::connect(addr, timeout, patience)?;
    let rights = req.qp_rights.unwrap_or(Rights::ALL);
    let recvs = req.recvs.unwrap_or(64);
    let gid: String = ours.gid.iter().map(|b| format!("{b:02x}")).collect();
    let mac: String = ours.mac.0.iter().map(|b| format!("{b:02x}")).collect();
    let r = req.retry.unwrap_or(RetrySettings::PINGPONG);
    let a = kv(&ctl.call(&format!(
        "qp qpn={:x} psn={:x} gid={gid} mac={mac} rights={} recvs={recvs} mtu={} retry_cnt={} rnr_retry={} timeout={}",
        ours.qpn,
        ours.psn,
        rights.letters(),
        ours.mtu.bytes(),
        r.retry_cnt,
        r.rnr_retry,
        r.timeout
    ))?);
    let small = |k: &str| a.get(k).and_then(|v| v.parse::<u8>().ok());
    let retry = match (small("retry_cnt"), small("rnr_retry"), small("timeout")) {
        (Some(retry_cnt), Some(rnr_retry), Some(timeout)) => Some(RetrySettings {
            retry_cnt,
            rnr_retry,
            timeout,
        }),
        _ => None,
    };
    let region = |p: &str, r: Rights| -> Result<Region, PeerError> {
        Ok(Region {
            rkey: hex(&a, &format!("{p}rkey"))? as u32,
            va: hex(&a, &format!("{p}va"))?,
            len: hex(&a, &format!("{p}len"))?,
            rights: r,
        })
    };
    let gid_hex = a.get("gid").cloned().unwrap_or_default();
    let gidb: [u8; 16] = (0..16)
        .map(|i| u8::from_str_radix(gid_hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()
        .filter(|_| gid_hex.len() == 32)
        .and_then(|v| v.try_into().ok())
        .ok_or(PeerError::Bad {
            key: "gid".into(),
            value: gid_hex,
        })?;
    let cnp_us = a.get("cnp_interval_us").and_then(|v| v.parse::<u64>().ok());
    let info = PeerInfo {
        tool: PeerTool::Ferroce,
        qpn: hex(&a, "qpn")? as u32,
        psn: hex(&a, "psn")? as u32,
        gid: gidb,
        mtu: a.get("mtu").and_then(|v| v.parse().ok()).unwrap_or(1024),
        qp_rights: rights,
        region: Some(region("", Rights::ALL)?),
        lacking: Some([
            region(
                "noread_",
                Rights {
                    read: false,
                    ..Rights::ALL
                },
            )?,
            region(
                "nowrite_",
                Rights {
                    write: false,
                    ..Rights::ALL
                },
            )?,
            region(
                "noatomic_",
                Rights {
                    atomic: false,
                    ..Rights::ALL
                },
            )?,
        ]),
        recvs: Some(recvs),
        requester: true,
        readback: ReadBack::Control,
        recv_count: RecvCount::Control,
        max_dest_rd_atomic: a
            .get("max_dest_rd_atomic")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1),
        min_rnr_timer: a
            .get("min_rnr_timer")
            .and_then(|v| v.parse().ok())
            .unwrap_or(12),
        cnp_interval: cnp_us.filter(|&u| u > 0).map(Duration::from_micros),
        retry,
        end_by_error: false,
        our_rd_atomic: None,
        about: format!(
            "ferroce peer QPN {} rights {} receives {recvs} knobs {}",
            a.get("qpn").map(String::as_str).unwrap_or("?"),
            rights.letters(),
            ctl.hello.get("break").map(String::as_str).unwrap_or("none")
        ),
    };
    Ok(Box::new(FerroceSession { info, ctl }))
}

/// Open a session with `tool` at `addr`.
pub fn open(
    tool: PeerTool,
    addr: SocketAddr,
    ours: &Ours,
    req: &SessionReq,
    peer_mtu: u32,
    timeout: Duration,
    patience: Duration,
) -> Result<Box<dyn Session>, PeerError> {
    match tool {
        PeerTool::Pingpong => open_pingpong(addr, ours, peer_mtu, timeout, patience),
        PeerTool::Ferroce => open_ferroce(addr, ours, req, timeout, patience),
        t => open_perftest(t, addr, ours, timeout, patience),
    }
}
