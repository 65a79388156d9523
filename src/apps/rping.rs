//! `ferroce rping` (and a link named `rping`): librdmacm's rping example over ferroce's
//! RDMA-CM ([`crate::runtime::cm`]), with its flags, protocol, output and exit status.
//!
//! The protocol (facts from rdma-core's `librdmacm/examples/rping.c`): the client connects
//! with responder resources and initiator depth 1, retry and RNR retry 7. Each ping: the
//! client fills its start buffer with `rdma-ping-N: ` and a rotating run of the characters
//! 65..=122 (the last byte 0) and SENDs its address, R_Key and size (16 bytes: big-endian
//! u64, u32, u32); the server RDMA READs that many bytes into its buffer and SENDs a "go
//! ahead" (16 bytes); the client SENDs its sink buffer's address; the server RDMA WRITEs the
//! string it read (up to and with its NUL) there and SENDs another "go ahead"; the client
//! compares (`-V`) and prints (`-v`). The client disconnects after `-C` pings (none: forever);
//! the server serves one client and ends when it disconnects; with `-P` it serves every
//! client that connects, each in a thread of its own, all at once (rping's
//! `rping_persistent_server_thread`), and never ends.
//!
//! Output as rping's: `ping data: ...` (client, `-v`), `server ping data: ...` (server,
//! `-v`) on standard output; `cma event RDMA_CM_EVENT_REJECTED, error 8`, `server DISCONNECT
//! EVENT...`, `wait for RDMA_READ_ADV state 10` and the other diagnostics on standard error.
//! Exit status: 0; 255 (rping's -1) on a failed connection or ping; 22 (EINVAL) on bad
//! arguments.
//!
//! ferroce's additions (after rping's flags): `--backend xdp|packet|udp` (default
//! `$FERROCE_BACKEND`, else xdp), `--ib-dev IFACE` (default `$FERROCE_DEV`, else the
//! interface of the address), `--pcap FILE`.

use crate::apps::tool::ToolError;
use crate::cm::CmConfig;
use crate::io::backend::{self, BackendKind};
use crate::io::netdev::{self, Netdev};
use crate::io::PcapTap;
use crate::runtime::cm::CmApiError;
use crate::runtime::cm::{
    ca_guid_of, CmEvent, CmId, CmService, ConnParam, EventChannel, EventType, KernelResolver,
    PortSpace,
};
use crate::runtime::{Nic, NicOptions, PollMode};
use crate::verbs::{
    AccessFlags, Cq, MemoryRegion, QpCap, QpInitAttr, RecvWr, SendOp, SendWr, Sge, VerbsError,
    WcOpcode, WcStatus, WorkCompletion,
};
use crate::wire::{Psn, QpNumber};
use std::collections::VecDeque;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// rping's default port.
pub const DEFAULT_PORT: u16 = 7174;
/// rping's largest buffer (`RPING_BUFSIZE`); sizes up to one less are valid.
pub const BUFSIZE: i32 = 64 * 1024;
/// rping's smallest buffer (`RPING_MIN_BUFSIZE`: `sizeof "2147483647"` + `sizeof
/// "rdma-ping-%d: "`).
pub const MIN_BUFSIZE: i32 = 11 + 15;
/// EINVAL, rping's exit status for bad arguments.
pub const EXIT_EINVAL: i32 = 22;
/// rping's -1 as an exit status.
pub const EXIT_FAIL: i32 = 255;

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RpingArgs {
    /// `-s` (true) or `-c`.
    pub server: bool,
    /// `-a`: the server's address (server: the address to bind, default any).
    pub addr: Option<IpAddr>,
    /// `-I`: the client's source address.
    pub src: Option<IpAddr>,
    /// `-p`.
    pub port: u16,
    /// `-C` (0: forever).
    pub count: i32,
    /// `-S`.
    pub size: i32,
    /// `-v`.
    pub verbose: bool,
    /// `-V`.
    pub validate: bool,
    /// `-d`.
    pub debug: bool,
    /// `-P`.
    pub persistent: bool,
    /// `-q` (accepted; the QP is the CM's either way).
    pub self_create_qp: bool,
    /// `--backend`.
    pub backend: BackendKind,
    /// `--ib-dev`.
    pub dev: Option<String>,
    /// `--pcap`.
    pub pcap: Option<PathBuf>,
}

const USAGE: &str = "rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]\n\
rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]\n\
\t-c\t\tclient side\n\
\t-I\t\tSource address to bind to for client.\n\
\t-s\t\tserver side.  To bind to any address with IPv6 use -a ::0\n\
\t-v\t\tdisplay ping data to stdout\n\
\t-V\t\tvalidate ping data\n\
\t-d\t\tdebug printfs\n\
\t-S size \tping data size\n\
\t-C count\tping count times\n\
\t-a addr\t\taddress\n\
\t-p port\t\tport\n\
\t-P\t\tpersistent server mode allowing multiple connections\n\
\t-q\t\tuse self-created, self-modified QP\n\
ferroce's options: --backend xdp|packet|udp, --ib-dev IFACE, --pcap FILE\n";

/// C's `atoi`: leading blanks, a sign, digits; anything else ends it (0 if no digit).
pub fn atoi(s: &str) -> i32 {
    let t = s.trim_start();
    let (neg, d) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let mut v: i64 = 0;
    for b in d.bytes().take_while(u8::is_ascii_digit) {
        v = (v * 10 + i64::from(b - b'0')).min(i64::from(u32::MAX) + 1);
    }
    let v = if neg { -v } else { v };
    v as i32
}

fn get_addr(s: &str, out: &mut dyn Write) -> Result<IpAddr, i32> {
    match crate::apps::addr::resolve_host(s, 0) {
        Ok(a) => Ok(a.ip()),
        Err(_) => {
            let _ = writeln!(
                out,
                "getaddrinfo failed (Name or service not known) - invalid hostname or IP address"
            );
            // EAI_NONAME (-2) as an exit status.
            Err(254)
        }
    }
}

/// Parse rping's command line (getopt `a:I:Pp:C:S:t:scvVdq`, then ferroce's long options).
/// `Err(status)`: the messages are written, exit with `status`.
pub fn parse(args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> Result<RpingArgs, i32> {
    let mut a = RpingArgs {
        server: false,
        addr: None,
        src: None,
        port: DEFAULT_PORT,
        count: 0,
        size: 64,
        verbose: false,
        validate: false,
        debug: false,
        persistent: false,
        self_create_qp: false,
        backend: match std::env::var("FERROCE_BACKEND").ok().as_deref() {
            Some("packet") => BackendKind::Packet,
            Some("udp") => BackendKind::Udp,
            _ => BackendKind::Xdp,
        },
        dev: std::env::var("FERROCE_DEV").ok().filter(|s| !s.is_empty()),
        pcap: None,
    };
    let mut role: Option<bool> = None;
    let mut ret = 0;
    let usage = |out: &mut dyn Write| {
        let _ = out.write_all(USAGE.as_bytes());
        Err(EXIT_EINVAL)
    };
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            break;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (k, v) = match long.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (long.to_string(), None),
            };
            let mut value = || {
                v.clone().or_else(|| {
                    i += 1;
                    args.get(i - 1).cloned()
                })
            };
            match k.as_str() {
                "backend" => match value().as_deref() {
                    Some("xdp") => a.backend = BackendKind::Xdp,
                    Some("packet") => a.backend = BackendKind::Packet,
                    Some("udp") => a.backend = BackendKind::Udp,
                    _ => {
                        let _ = writeln!(err, "rping: --backend takes xdp, packet or udp");
                        return Err(EXIT_EINVAL);
                    }
                },
                "ib-dev" => a.dev = value(),
                "pcap" => a.pcap = value().map(PathBuf::from),
                _ => return usage(out),
            }
            continue;
        }
        let Some(flags) = arg.strip_prefix('-').filter(|f| !f.is_empty()) else {
            continue; // getopt leaves operands alone; rping ignores them
        };
        for (k, c) in flags.char_indices() {
            let takes = matches!(c, 'a' | 'I' | 'p' | 'C' | 'S' | 't');
            let optarg = if takes {
                let rest = &flags[k + c.len_utf8()..];
                let v = if !rest.is_empty() {
                    rest.to_string()
                } else if let Some(n) = args.get(i) {
                    i += 1;
                    n.clone()
                } else {
                    return usage(out); // getopt: missing argument is '?'
                };
                Some(v)
            } else {
                None
            };
            let optarg = optarg.unwrap_or_default();
            match c {
                'a' => match get_addr(&optarg, out) {
                    Ok(ip) => a.addr = Some(ip),
                    Err(e) => ret = e,
                },
                'I' => match get_addr(&optarg, out) {
                    Ok(ip) => a.src = Some(ip),
                    Err(e) => ret = e,
                },
                'P' => a.persistent = true,
                'p' => a.port = atoi(&optarg) as u16,
                's' => role = Some(true),
                'c' => role = Some(false),
                'S' => {
                    a.size = atoi(&optarg);
                    if a.size < MIN_BUFSIZE || a.size > BUFSIZE - 1 {
                        let _ = writeln!(
                            err,
                            "Invalid size {} (valid range is {} to {})",
                            a.size, MIN_BUFSIZE, BUFSIZE
                        );
                        ret = EXIT_EINVAL;
                    }
                }
                'C' => {
                    a.count = atoi(&optarg);
                    if a.count < 0 {
                        let _ = writeln!(err, "Invalid count {}", a.count);
                        ret = EXIT_EINVAL;
                    }
                }
                'v' => a.verbose = true,
                'V' => a.validate = true,
                'd' => a.debug = true,
                'q' => a.self_create_qp = true,
                // -t is in rping's option string but not handled: usage, as rping.
                _ => return usage(out),
            }
            if takes {
                break;
            }
        }
    }
    if ret != 0 {
        return Err(ret);
    }
    match role {
        Some(s) => a.server = s,
        None => return usage(out),
    }
    Ok(a)
}

/// rping's states (`enum test_state`), numbered as rping prints them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum State {
    /// Nothing happened yet (`IDLE`).
    Idle = 1,
    /// The server got a connection request (`CONNECT_REQUEST`).
    ConnectRequest,
    /// The client resolved the address (`ADDR_RESOLVED`).
    AddrResolved,
    /// The client resolved the route (`ROUTE_RESOLVED`).
    RouteResolved,
    /// Established (`CONNECTED`).
    Connected,
    /// The server got the client's source buffer advertisement (`RDMA_READ_ADV`).
    ReadAdv,
    /// The server's RDMA READ completed (`RDMA_READ_COMPLETE`).
    ReadComplete,
    /// The server got the client's sink buffer advertisement (`RDMA_WRITE_ADV`).
    WriteAdv,
    /// The server's RDMA WRITE completed (`RDMA_WRITE_COMPLETE`).
    WriteComplete,
    /// The peer disconnected (`DISCONNECTED`).
    Disconnected,
    /// A failure (`ERROR`).
    Error,
}

/// Why rping stops with a CM event it does not expect (its CM thread's `exit(-1)`).
struct Fatal;

/// One connection's resources and rping's state machine (its `struct rping_cb`).
struct Conn<'a> {
    nic: &'a Nic,
    ch: &'a EventChannel,
    id: CmId,
    qp: QpNumber,
    cq: Cq,
    server: bool,
    size: usize,
    debug: bool,
    recv_mr: MemoryRegion,
    send_mr: MemoryRegion,
    rdma_mr: MemoryRegion,
    start_mr: Option<MemoryRegion>,
    state: State,
    sem: u32,
    remote: (u64, u32, u32),
    /// Events of other ids (a server's next connection requests).
    stash: &'a mut VecDeque<CmEvent>,
    /// Set when a connection of the persistent server hit a CM event that ends rping (its CM
    /// thread's `exit`): every connection then stops.
    abort: &'a AtomicBool,
    err: &'a mut dyn Write,
}

const INFO_LEN: usize = 16;

/// Why rping could not start, or could not set up a connection's QP (one line for the user).
#[derive(Debug, thiserror::Error)]
enum RpingError {
    /// Finding the device, its address, opening the backend or the capture file.
    #[error(transparent)]
    Tool(#[from] ToolError),
    /// The capture could not be started.
    #[error("{}: {err}", path.display())]
    Capture {
        path: std::path::PathBuf,
        #[source]
        err: crate::pcap::capture::CaptureError,
    },
    /// The NIC did not start.
    #[error("starting the NIC: {0}")]
    Nic(#[source] std::io::Error),
    /// The connection manager failed.
    #[error("{0}")]
    Cm(#[from] CmApiError),
    /// The protection domain could not be allocated.
    #[error("alloc_pd: {0}")]
    Pd(#[source] VerbsError),
    /// The completion queue could not be created.
    #[error("{0}")]
    Cq(#[source] VerbsError),
    /// The QP could not be created.
    #[error("rdma_create_qp: {0}")]
    CreateQp(#[source] CmApiError),
    /// A memory region could not be registered.
    #[error("reg_mr: {0}")]
    RegMr(#[source] VerbsError),
    /// The first receive could not be posted.
    #[error("ibv_post_recv failed: {0}")]
    PostRecv(#[source] VerbsError),
}

impl<'a> Conn<'a> {
    #[allow(clippy::too_many_arguments)]
    fn setup(
        nic: &'a Nic,
        ch: &'a EventChannel,
        id: CmId,
        server: bool,
        size: usize,
        debug: bool,
        stash: &'a mut VecDeque<CmEvent>,
        abort: &'a AtomicBool,
        err: &'a mut dyn Write,
    ) -> Result<Conn<'a>, RpingError> {
        let pd = nic.alloc_pd().map_err(RpingError::Pd)?;
        let cq = nic.create_cq(32).map_err(RpingError::Cq)?;
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 2,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = id
            .create_qp(QpInitAttr::new(pd, cq, cq, cap))
            .map_err(RpingError::CreateQp)?;
        let reg = |len: usize, acc: AccessFlags| nic.reg_mr(pd, len, acc);
        let remote =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        let r = (|| {
            Ok::<_, VerbsError>((
                reg(INFO_LEN, AccessFlags::LOCAL_WRITE)?,
                reg(INFO_LEN, AccessFlags::empty())?,
                reg(size, remote)?,
                if server {
                    None
                } else {
                    Some(reg(size, remote)?)
                },
            ))
        })()
        .map_err(RpingError::RegMr)?;
        let c = Conn {
            nic,
            ch,
            id,
            qp,
            cq,
            server,
            size,
            debug,
            recv_mr: r.0,
            send_mr: r.1,
            rdma_mr: r.2,
            start_mr: r.3,
            state: State::Idle,
            sem: 0,
            remote: (0, 0, 0),
            stash,
            abort,
            err,
        };
        c.post_recv().map_err(RpingError::PostRecv)?;
        Ok(c)
    }

    fn post_recv(&self) -> Result<(), VerbsError> {
        self.nic.post_recv(
            self.qp,
            RecvWr {
                wr_id: 0,
                sg_list: smallvec::smallvec![Sge {
                    addr: self.recv_mr.addr(),
                    length: INFO_LEN as u32,
                    lkey: self.recv_mr.lkey(),
                }],
            },
        )
    }

    fn post(&self, wr_id: u64, op: SendOp, mr: &MemoryRegion, len: usize) -> Result<(), i32> {
        let wr = SendWr::new(
            wr_id,
            op,
            vec![Sge {
                addr: mr.addr(),
                length: len as u32,
                lkey: mr.lkey(),
            }],
        );
        self.nic.post_send(self.qp, wr).map_err(|_| -1)
    }

    /// SEND the send buffer (rping's `sq_wr`).
    fn send_info(&self) -> Result<(), i32> {
        self.post(1, SendOp::Send, &self.send_mr, INFO_LEN)
    }

    /// `rping_format_send`: a buffer's address, R_Key and rping's size.
    fn format_send(&mut self, mr_is_start: bool) {
        let mr = if mr_is_start {
            self.start_mr.as_ref().expect("client")
        } else {
            &self.rdma_mr
        };
        let mut info = [0u8; INFO_LEN];
        info[..8].copy_from_slice(&mr.addr().to_be_bytes());
        info[8..12].copy_from_slice(&mr.rkey().0.to_be_bytes());
        info[12..].copy_from_slice(&(self.size as u32).to_be_bytes());
        if self.debug {
            println!(
                "RDMA addr {:x} rkey {:x} len {}",
                mr.addr(),
                mr.rkey().0,
                self.size
            );
        }
        let _ = self.send_mr.write(0, &info);
    }

    /// rping's `sem_wait`: until a completion or CM event posted.
    fn wait(&mut self) -> Result<(), Fatal> {
        let mut wcs = Vec::new();
        loop {
            if self.sem > 0 {
                self.sem -= 1;
                return Ok(());
            }
            if self.abort.load(Ordering::Acquire) {
                return Err(Fatal);
            }
            wcs.clear();
            let _ = self.nic.poll_cq(self.cq, &mut wcs, 16);
            for wc in &wcs {
                self.on_wc(wc);
            }
            while let Some(e) = self.ch.try_get_cm_event() {
                if e.id != self.id {
                    self.stash.push_back(e);
                    continue;
                }
                self.on_cm_event(&e)?;
            }
            if self.sem == 0 && wcs.is_empty() {
                let _ = self.nic.wait_cq(self.cq, Duration::from_millis(2));
            }
        }
    }

    fn on_cm_event(&mut self, e: &CmEvent) -> Result<(), Fatal> {
        if self.debug {
            println!(
                "cma_event type {} cma_id {} (child)",
                e.event.as_str(),
                e.id.id().0
            );
        }
        match e.event {
            EventType::Established => {
                if !self.server {
                    self.state = State::Connected;
                }
                self.sem += 1;
            }
            EventType::Disconnected => {
                let _ = writeln!(
                    self.err,
                    "{} DISCONNECT EVENT...",
                    if self.server { "server" } else { "client" }
                );
                self.state = State::Disconnected;
                self.sem += 1;
            }
            EventType::AddrError
            | EventType::RouteError
            | EventType::ConnectError
            | EventType::Unreachable
            | EventType::Rejected => {
                let _ = writeln!(
                    self.err,
                    "cma event {}, error {}",
                    e.event.as_str(),
                    e.status
                );
                self.abort.store(true, Ordering::Release);
                return Err(Fatal);
            }
            _ => {}
        }
        Ok(())
    }

    /// `rping_cq_event_handler` for one completion.
    fn on_wc(&mut self, wc: &WorkCompletion) {
        if wc.status != WcStatus::Success {
            if wc.status == WcStatus::WrFlushErr {
                return;
            }
            let _ = writeln!(
                self.err,
                "cq completion failed status {}",
                wc.status.to_ibv()
            );
            self.state = State::Error;
            self.sem += 1;
            return;
        }
        match wc.opcode {
            WcOpcode::Send => {
                if self.debug {
                    println!("send completion");
                }
            }
            WcOpcode::RdmaWrite => {
                self.state = State::WriteComplete;
                self.sem += 1;
            }
            WcOpcode::RdmaRead => {
                self.state = State::ReadComplete;
                self.sem += 1;
            }
            WcOpcode::Recv => {
                if wc.byte_len as usize != INFO_LEN {
                    let _ = writeln!(self.err, "Received bogus data, size {}", wc.byte_len);
                    let _ = writeln!(self.err, "recv wc error: -1");
                    self.state = State::Error;
                    self.sem += 1;
                    return;
                }
                if self.server {
                    let mut b = [0u8; INFO_LEN];
                    let _ = self.recv_mr.read(0, &mut b);
                    let addr = u64::from_be_bytes(b[..8].try_into().expect("8"));
                    let rkey = u32::from_be_bytes(b[8..12].try_into().expect("4"));
                    let len = u32::from_be_bytes(b[12..].try_into().expect("4"));
                    self.remote = (addr, rkey, len);
                    if self.debug {
                        println!("Received rkey {rkey:x} addr {addr:x} len {len} from peer");
                    }
                    self.state = if (self.state as u8) <= State::Connected as u8
                        || self.state == State::WriteComplete
                    {
                        State::ReadAdv
                    } else {
                        State::WriteAdv
                    };
                } else {
                    self.state = if self.state == State::ReadAdv {
                        State::WriteAdv
                    } else {
                        State::WriteComplete
                    };
                }
                if self.post_recv().is_err() {
                    let _ = writeln!(self.err, "post recv error: -1");
                    self.state = State::Error;
                }
                self.sem += 1;
            }
            _ => {
                self.state = State::Error;
                self.sem += 1;
            }
        }
    }

    fn expect(&mut self, want: State, what: &str) -> Result<bool, Fatal> {
        self.wait()?;
        if self.state != want {
            let _ = writeln!(self.err, "wait for {what} state {}", self.state as u8);
            return Ok(false);
        }
        Ok(true)
    }

    /// `rping_test_server`: 0, or -1 (a disconnect ends it with 0).
    fn test_server(&mut self, verbose: bool, out: &mut dyn Write) -> Result<i32, Fatal> {
        loop {
            if !self.expect(State::ReadAdv, "RDMA_READ_ADV")? {
                break;
            }
            let (addr, rkey, len) = self.remote;
            let len = (len as usize).min(self.rdma_mr.len());
            if self
                .post(
                    2,
                    SendOp::RdmaRead {
                        remote_addr: addr,
                        rkey: crate::wire::RKey(rkey),
                    },
                    &self.rdma_mr,
                    len,
                )
                .is_err()
            {
                let _ = writeln!(self.err, "post send error -1");
                return Ok(-1);
            }
            if !self.expect(State::ReadComplete, "RDMA_READ_COMPLETE")? {
                break;
            }
            let data = self.rdma_mr.to_vec();
            let n = data.iter().position(|&b| b == 0).unwrap_or(data.len());
            if verbose {
                let _ = writeln!(
                    out,
                    "server ping data: {}",
                    String::from_utf8_lossy(&data[..n])
                );
                let _ = out.flush();
            }
            if self.send_info().is_err() {
                return Ok(-1);
            }
            if !self.expect(State::WriteAdv, "RDMA_WRITE_ADV")? {
                break;
            }
            let (addr, rkey, _) = self.remote;
            let wlen = (n + 1).min(self.rdma_mr.len());
            if self
                .post(
                    3,
                    SendOp::RdmaWrite {
                        remote_addr: addr,
                        rkey: crate::wire::RKey(rkey),
                    },
                    &self.rdma_mr,
                    wlen,
                )
                .is_err()
            {
                let _ = writeln!(self.err, "post send error -1");
                return Ok(-1);
            }
            if !self.expect(State::WriteComplete, "RDMA_WRITE_COMPLETE")? {
                break;
            }
            if self.send_info().is_err() {
                return Ok(-1);
            }
        }
        Ok(if self.state == State::Disconnected {
            0
        } else {
            -1
        })
    }

    /// `rping_test_client`.
    fn test_client(
        &mut self,
        count: i32,
        validate: bool,
        verbose: bool,
        out: &mut dyn Write,
    ) -> Result<i32, Fatal> {
        let mut start: u8 = 65;
        let mut ping: i32 = 0;
        let mut ret = 0;
        while count == 0 || ping < count {
            self.state = State::ReadAdv;
            let mut buf = format!("rdma-ping-{ping}: ").into_bytes();
            buf.truncate(self.size - 1);
            let mut c = start;
            while buf.len() < self.size {
                buf.push(c);
                c += 1;
                if c > 122 {
                    c = 65;
                }
            }
            start += 1;
            if start > 122 {
                start = 65;
            }
            buf[self.size - 1] = 0;
            let start_mr = self.start_mr.as_ref().expect("client");
            let _ = start_mr.write(0, &buf);
            self.format_send(true);
            if self.send_info().is_err() {
                let _ = writeln!(self.err, "post send error -1");
                ret = -1;
                break;
            }
            if !self.expect(State::WriteAdv, "RDMA_WRITE_ADV")? {
                ret = -1;
                break;
            }
            self.format_send(false);
            if self.send_info().is_err() {
                let _ = writeln!(self.err, "post send error -1");
                ret = -1;
                break;
            }
            if !self.expect(State::WriteComplete, "RDMA_WRITE_COMPLETE")? {
                ret = -1;
                break;
            }
            let got = self.rdma_mr.to_vec();
            if validate && got[..self.size] != buf[..] {
                let _ = writeln!(self.err, "data mismatch!");
                ret = -1;
                break;
            }
            if verbose {
                let n = got.iter().position(|&b| b == 0).unwrap_or(got.len());
                let _ = writeln!(out, "ping data: {}", String::from_utf8_lossy(&got[..n]));
                let _ = out.flush();
            }
            ping += 1;
        }
        Ok(if self.state == State::Disconnected {
            0
        } else {
            ret
        })
    }

    /// `rping_disconnect`: the QP to ERROR and DREQ (or DREP). rping's own DISCONNECTED
    /// event after it is not waited for: the program ends first (Debian's rping client
    /// prints no DISCONNECT line after its pings).
    fn disconnect(&mut self) {
        let _ = self.id.disconnect();
    }
}

fn conn_param() -> ConnParam<'static> {
    // rping_init_conn_param: one READ each way, retry and RNR retry 7.
    ConnParam::new(QpNumber::new(0), Psn::new(0), &[])
}

/// The interface to run on: `--ib-dev`/`$FERROCE_DEV`, else the one holding the address
/// (server) or the source address of the route to it (client), else the first one with an
/// address.
fn pick_device(a: &RpingArgs) -> Result<Netdev, ToolError> {
    if let Some(d) = &a.dev {
        return crate::apps::tool::find_device(Some(d));
    }
    let all = netdev::netdevs();
    let want = if a.server {
        a.addr.filter(|ip| !ip.is_unspecified())
    } else {
        a.src.or_else(|| {
            a.addr
                .and_then(|d| crate::io::route::route_get(d).ok())
                .and_then(|r| r.prefsrc)
        })
    };
    if let Some(ip) = want {
        if let Some(d) = all.iter().find(|d| d.gids.contains(&ip)) {
            return Ok(d.clone());
        }
    }
    crate::apps::tool::find_device(None)
}

/// Run rping as `a` says; returns the exit status.
pub fn run(a: &RpingArgs, out: &mut (dyn Write + Send), err: &mut (dyn Write + Send)) -> i32 {
    match run_inner(a, out, err) {
        Ok(code) => code,
        Err(msg) => {
            let _ = writeln!(err, "rping: {msg}");
            EXIT_FAIL
        }
    }
}

/// The local address when none was given: a GID of the peer's family that is not link-local
/// (an IPv6 GID table starts with the link-local address, which the peer's routes do not
/// reach back to), else any of that family, else the first.
fn default_local(gids: &[IpAddr], want_v6: bool) -> Option<IpAddr> {
    gids.iter()
        .find(|g| g.is_ipv6() == want_v6 && !crate::io::netdev::is_link_local(**g))
        .or_else(|| gids.iter().find(|g| g.is_ipv6() == want_v6))
        .or(gids.first())
        .copied()
}

fn run_inner(
    a: &RpingArgs,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> Result<i32, RpingError> {
    let dev = pick_device(a)?;
    let want_v6 = a.addr.is_some_and(|ip| ip.is_ipv6());
    let local = a
        .src
        .or(a.addr.filter(|ip| a.server && !ip.is_unspecified()))
        .or_else(|| default_local(&dev.gids, want_v6))
        .ok_or_else(|| ToolError::NoAddress(dev.name.clone()))?;
    let pkt =
        backend::open_with(a.backend, &dev, local, true).map_err(|err| ToolError::Backend {
            kind: a.backend.name(),
            dev: dev.name.clone(),
            err,
        })?;
    let mut dcfg = crate::verbs::DeviceConfig::new(dev.mac, local);
    dcfg.gids = dev.gids.clone();
    dcfg.port_mtu = netdev::ib_mtu_for(dev.mtu.unwrap_or(1500));
    let opts = NicOptions {
        poll: PollMode::Adaptive {
            spins: 2000,
            max_sleep: Duration::from_millis(1),
        },
        batch: 64,
    };
    let nic = match &a.pcap {
        Some(p) => {
            let f = std::fs::File::create(p).map_err(|err| ToolError::Io {
                what: p.display().to_string(),
                err,
            })?;
            let tap = PcapTap::new(pkt, std::io::BufWriter::new(f)).map_err(|err| {
                RpingError::Capture {
                    path: p.clone(),
                    err,
                }
            })?;
            Nic::start(dcfg, tap, opts)
        }
        None => Nic::start(dcfg, pkt, opts),
    }
    .map_err(RpingError::Nic)?;
    let nic = Arc::new(nic);
    let resolver = KernelResolver {
        ifname: dev.name.clone(),
        gids: dev.gids.clone(),
        udp: a.backend == BackendKind::Udp,
        local: Some(local),
    };
    let svc = CmService::start(
        nic.clone(),
        CmConfig::new(ca_guid_of(dev.mac)),
        Box::new(resolver),
    )?;
    let ch = svc.create_event_channel()?;
    let code = if a.server {
        server(a, &svc, &nic, &ch, out, err)
    } else {
        client(a, &nic, &ch, out, err)
    };
    let _ = out.flush();
    // Let the last MADs (DREP) and ACKs leave before the engine stops.
    std::thread::sleep(Duration::from_millis(100));
    svc.shutdown();
    if let Ok(nic) = Arc::try_unwrap(nic) {
        nic.shutdown();
    }
    Ok(code)
}

fn client(
    a: &RpingArgs,
    nic: &Nic,
    ch: &EventChannel,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let id = ch.create_id(PortSpace::TCP);
    let dst = SocketAddr::new(a.addr.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), a.port);
    let timeout = Duration::from_millis(2000);
    if let Err(e) = id.resolve_addr(a.src.map(|s| SocketAddr::new(s, 0)), dst, timeout) {
        let _ = writeln!(err, "rdma_resolve_addr: {e}");
        return EXIT_FAIL;
    }
    // ADDR_RESOLVED → resolve_route → ROUTE_RESOLVED (rping's CM thread).
    loop {
        let Some(e) = ch.get_cm_event(None) else {
            return EXIT_FAIL;
        };
        if a.debug {
            println!(
                "cma_event type {} cma_id {} (parent)",
                e.event.as_str(),
                e.id.id().0
            );
        }
        match e.event {
            EventType::AddrResolved => {
                if let Err(x) = id.resolve_route(timeout) {
                    let _ = writeln!(err, "rdma_resolve_route: {x}");
                    let _ = writeln!(err, "waiting for addr/route resolution state 11");
                    return EXIT_FAIL;
                }
            }
            EventType::RouteResolved => break,
            k => {
                let _ = writeln!(err, "cma event {}, error {}", k.as_str(), e.status);
                return EXIT_FAIL;
            }
        }
    }
    let mut stash = VecDeque::new();
    let size = a.size as usize;
    let abort = AtomicBool::new(false);
    let mut c = match Conn::setup(
        nic,
        ch,
        id.clone(),
        false,
        size,
        a.debug,
        &mut stash,
        &abort,
        err,
    ) {
        Ok(c) => c,
        Err(m) => {
            let _ = writeln!(err, "setup_qp failed: {m}");
            return EXIT_FAIL;
        }
    };
    if let Err(e) = id.connect(&conn_param()) {
        let _ = writeln!(c.err, "rdma_connect: {e}");
        let _ = writeln!(c.err, "connect error -1");
        return EXIT_FAIL;
    }
    match c.wait() {
        Ok(()) if c.state == State::Connected => {}
        Ok(()) => {
            let _ = writeln!(c.err, "wait for CONNECTED state {}", c.state as u8);
            let _ = writeln!(c.err, "connect error -1");
            return EXIT_FAIL;
        }
        Err(Fatal) => return EXIT_FAIL,
    }
    if a.debug {
        println!("rdma_connect successful");
    }
    let r = match c.test_client(a.count, a.validate, a.verbose, out) {
        Ok(r) => r,
        Err(Fatal) => return EXIT_FAIL,
    };
    if r != 0 {
        let _ = writeln!(c.err, "rping client failed: {r}");
    }
    c.disconnect();
    let _ = id.destroy();
    if r == 0 {
        0
    } else {
        EXIT_FAIL
    }
}

fn server(
    a: &RpingArgs,
    svc: &CmService,
    nic: &Nic,
    ch: &EventChannel,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> i32 {
    let l = ch.create_id(PortSpace::TCP);
    let bind = SocketAddr::new(a.addr.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), a.port);
    if let Err(e) = l.bind_addr(bind) {
        let _ = writeln!(err, "rdma_bind_addr: {e}");
        return EXIT_FAIL;
    }
    if let Err(e) = l.listen(3) {
        let _ = writeln!(err, "rdma_listen: {e}");
        return EXIT_FAIL;
    }
    let abort = AtomicBool::new(false);
    if !a.persistent {
        // One connection, served here; then rping ends.
        let mut stash: VecDeque<CmEvent> = VecDeque::new();
        let Some(req) = next_request(a, ch, &mut stash, &abort, err) else {
            return EXIT_FAIL;
        };
        let r = serve(a, nic, ch, req.id, &mut stash, &abort, out, err);
        let _ = l.destroy();
        return r;
    }
    // rping_run_persistent_server: each connection request gets its own thread (with its own
    // copy of rping's control block); the listener goes on taking requests meanwhile. Here
    // each accepted id moves to its own event channel (rdma_migrate_id), so a connection's
    // thread reads its events only; lines go out whole.
    let out = Mutex::new(out);
    let err = Mutex::new(err);
    std::thread::scope(|s| {
        let mut stash: VecDeque<CmEvent> = VecDeque::new();
        loop {
            let mut lerr = Lines::new(&err);
            let Some(req) = next_request(a, ch, &mut stash, &abort, &mut lerr) else {
                return EXIT_FAIL;
            };
            drop(lerr);
            let cch = match svc.create_event_channel() {
                Ok(c) => c,
                Err(e) => {
                    let _ = writeln!(Lines::new(&err), "rdma_create_event_channel: {e}");
                    let _ = req.id.reject(&[]);
                    continue;
                }
            };
            if let Err(e) = req.id.migrate(&cch) {
                let _ = writeln!(Lines::new(&err), "rdma_migrate_id: {e}");
                let _ = req.id.reject(&[]);
                continue;
            }
            let (out, err, abort) = (&out, &err, &abort);
            s.spawn(move || {
                let (mut o, mut e) = (Lines::new(out), Lines::new(err));
                let mut stash = VecDeque::new();
                serve(a, nic, &cch, req.id, &mut stash, abort, &mut o, &mut e);
            });
        }
    })
}

/// The listener's next CONNECT_REQUEST (rping's listening cb's sem). `None`: rping ends (the
/// service stopped, an unexpected event without `-P`, or a connection's fatal event).
fn next_request(
    a: &RpingArgs,
    ch: &EventChannel,
    stash: &mut VecDeque<CmEvent>,
    abort: &AtomicBool,
    err: &mut dyn Write,
) -> Option<CmEvent> {
    loop {
        if abort.load(Ordering::Acquire) {
            return None;
        }
        let e = match stash.pop_front() {
            Some(e) => e,
            // The persistent server looks at `abort` now and then; the other waits until an
            // event comes or the service stops.
            None if a.persistent => match ch.get_cm_event(Some(Duration::from_millis(100))) {
                Some(e) => e,
                None => continue,
            },
            None => ch.get_cm_event(None)?,
        };
        if a.debug {
            println!(
                "cma_event type {} cma_id {} (parent)",
                e.event.as_str(),
                e.id.id().0
            );
        }
        match e.event {
            EventType::ConnectRequest => return Some(e),
            EventType::Disconnected | EventType::TimewaitExit => {}
            k => {
                let _ = writeln!(err, "cma event {}, error {}", k.as_str(), e.status);
                if !a.persistent {
                    return None;
                }
            }
        }
    }
}

/// One connection of the server (rping's `rping_run_server` after the request, or
/// `rping_persistent_server_thread`): QP and buffers, accept, the ping loop, disconnect.
/// Returns rping's exit status for it.
#[allow(clippy::too_many_arguments)]
fn serve(
    a: &RpingArgs,
    nic: &Nic,
    ch: &EventChannel,
    child: CmId,
    stash: &mut VecDeque<CmEvent>,
    abort: &AtomicBool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let size = a.size as usize;
    let mut c = match Conn::setup(
        nic,
        ch,
        child.clone(),
        true,
        size,
        a.debug,
        stash,
        abort,
        err,
    ) {
        Ok(c) => c,
        Err(m) => {
            let _ = writeln!(err, "setup_qp failed: {m}");
            let _ = child.reject(&[]);
            return EXIT_FAIL;
        }
    };
    c.state = State::ConnectRequest;
    if a.debug {
        println!("accepting client connection request");
    }
    if let Err(e) = child.accept(&conn_param()) {
        let _ = writeln!(c.err, "rdma_accept: {e}");
        let _ = writeln!(c.err, "connect error -1");
        return EXIT_FAIL;
    }
    // rping_accept: wait for ESTABLISHED (or the first RECV).
    match c.wait() {
        Ok(()) if c.state != State::Error => {}
        Ok(()) => {
            let _ = writeln!(c.err, "wait for CONNECTED state {}", c.state as u8);
            let _ = writeln!(c.err, "connect error -1");
            return EXIT_FAIL;
        }
        Err(Fatal) => return EXIT_FAIL,
    }
    let r = match c.test_server(a.verbose, out) {
        Ok(r) => r,
        Err(Fatal) => return EXIT_FAIL,
    };
    if r != 0 && !a.persistent {
        let _ = writeln!(c.err, "rping server failed: {r}");
    }
    c.disconnect();
    let _ = child.destroy();
    if r == 0 {
        0
    } else {
        EXIT_FAIL
    }
}

/// A writer for one thread of the persistent server: what it writes goes to the shared
/// writer a whole line at a time (and the rest on flush or drop), so the lines of connections
/// served at once do not mix.
struct Lines<'m, 'w> {
    to: &'m Mutex<&'w mut (dyn Write + Send)>,
    buf: Vec<u8>,
}

impl<'m, 'w> Lines<'m, 'w> {
    fn new(to: &'m Mutex<&'w mut (dyn Write + Send)>) -> Self {
        Lines {
            to,
            buf: Vec::new(),
        }
    }

    fn emit(&mut self, upto: usize) -> std::io::Result<()> {
        let mut w = self.to.lock().unwrap_or_else(|e| e.into_inner());
        w.write_all(&self.buf[..upto])?;
        w.flush()?;
        self.buf.drain(..upto);
        Ok(())
    }
}

impl Write for Lines<'_, '_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        if let Some(n) = self.buf.iter().rposition(|&c| c == b'\n') {
            self.emit(n + 1)?;
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let n = self.buf.len();
        self.emit(n)
    }
}

impl Drop for Lines<'_, '_> {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            let _ = self.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<RpingArgs, i32> {
        let v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        parse(&v, &mut Vec::new(), &mut Vec::new())
    }

    /// A device's GID table as ferroce devinfo shows it (link-local first): an IPv6 client
    /// talks from the global address; a v4 one from the v4 address (the capture of the first
    /// IPv6 run against rxe showed the REQ and the QP's packets from fe80::…).
    #[test]
    fn default_local_skips_link_local() {
        let gids: Vec<IpAddr> = ["fe80::5054:ff:fe77:2", "10.77.0.2", "fd77::2"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(default_local(&gids, true), Some("fd77::2".parse().unwrap()));
        assert_eq!(
            default_local(&gids, false),
            Some("10.77.0.2".parse().unwrap())
        );
        assert_eq!(
            default_local(&gids[..1], true),
            Some("fe80::5054:ff:fe77:2".parse().unwrap())
        );
    }

    #[test]
    fn atoi_is_cs() {
        assert_eq!(atoi("12ab"), 12);
        assert_eq!(atoi("  -3"), -3);
        assert_eq!(atoi("x"), 0);
    }

    #[test]
    fn flags() {
        let a = p(&[
            "-c", "-a", "10.0.0.1", "-C10", "-vV", "-S", "100", "-p", "9000",
        ])
        .unwrap();
        assert!(!a.server && a.verbose && a.validate);
        assert_eq!((a.count, a.size, a.port), (10, 100, 9000));
        assert_eq!(a.addr, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(p(&["-v"]), Err(EXIT_EINVAL), "no role: usage");
        assert_eq!(p(&["-s", "-S", "25"]), Err(EXIT_EINVAL));
        assert_eq!(p(&["-s", "-S", "65536"]), Err(EXIT_EINVAL));
        assert!(p(&["-s", "-S", "65535"]).is_ok());
        assert!(p(&["-s", "-S", "26"]).is_ok());
        assert_eq!(p(&["-s", "-C", "-1"]), Err(EXIT_EINVAL));
        assert_eq!(
            p(&["-s", "-t", "1"]),
            Err(EXIT_EINVAL),
            "-t: usage, as rping"
        );
        assert_eq!(p(&["-s", "-x"]), Err(EXIT_EINVAL));
        assert!(p(&["-s", "-P", "-d"]).unwrap().persistent);
    }
}
