//! `ferroce pingpong` and `ibv_rc_pingpong` (a link to the ferroce binary): rdma-core's RC
//! ping-pong example, with its flags (read as its `getopt_long` and `strtoul` read them), its
//! out-of-band messages ([`crate::oob::pingpong`]) and its output, so either end can be the
//! real tool.
//!
//! The UC, UD and SRQ variants (`ibv_uc_pingpong`, `ibv_ud_pingpong`, `ibv_srq_pingpong`) are
//! recognised and refused until those queue pairs exist.

use crate::apps::tool::{self, ToolError};
use crate::io::backend::{self, BackendKind};
use crate::io::netdev;
use crate::io::PcapTap;
use crate::oob::pingpong::{self as pp, Dest};
use crate::oob::CmError;
use crate::runtime::{Nic, NicOptions, PollMode};
use crate::verbs::{
    gid_of, DeviceConfig, NotifyMode, RcParams, RecvWr, RemoteQp, SendFlags, SendOp, SendWr, Sge,
    VerbsError, WcStatus,
};
use crate::verbs::{AccessFlags, Mtu, QpCap};
use crate::wire::{MacAddr, QpNumber};
use std::ffi::OsString;
use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The rdma-core examples ferroce answers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Example {
    /// `ibv_rc_pingpong`: reliable connection.
    Rc,
    /// `ibv_uc_pingpong`: unreliable connection.
    Uc,
    /// `ibv_ud_pingpong`: unreliable datagram.
    Ud,
    /// `ibv_srq_pingpong`: RC with a shared receive queue.
    Srq,
}

impl Example {
    /// `ibv_rc_pingpong` and its siblings (a path is fine).
    pub fn of_program(argv0: &str) -> Option<Example> {
        let base = std::path::Path::new(argv0)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(argv0);
        Some(match base {
            "ibv_rc_pingpong" => Example::Rc,
            "ibv_uc_pingpong" => Example::Uc,
            "ibv_ud_pingpong" => Example::Ud,
            "ibv_srq_pingpong" => Example::Srq,
            _ => return None,
        })
    }
    /// The program's name.
    pub fn program(self) -> &'static str {
        match self {
            Example::Rc => "ibv_rc_pingpong",
            Example::Uc => "ibv_uc_pingpong",
            Example::Ud => "ibv_ud_pingpong",
            Example::Srq => "ibv_srq_pingpong",
        }
    }
}

/// Why a ping-pong failed: rdma-core's messages where it has one.
#[derive(Debug, thiserror::Error)]
pub enum PingpongError {
    /// Opening the device or resolving the host failed.
    #[error(transparent)]
    Tool(#[from] ToolError),
    /// The example needs what ferroce does not have yet.
    #[error("{0} is not yet supported by ferroce (only RC queue pairs exist so far)")]
    NotYet(&'static str),
    /// Creating a verbs object failed.
    #[error("Couldn't create {what}: {err}")]
    Create {
        /// Which (`QP`, `CQ`, ...).
        what: &'static str,
        /// Why.
        #[source]
        err: VerbsError,
    },
    /// A QP state transition failed.
    #[error("Failed to modify QP to {state}: {err}")]
    Modify {
        /// The target state.
        state: &'static str,
        /// Why.
        #[source]
        err: VerbsError,
    },
    /// Posting receives failed after this many.
    #[error("Couldn't post receive ({0})")]
    PostRecv(u32),
    /// Posting a send failed.
    #[error("Couldn't post send: {0}")]
    PostSend(#[source] VerbsError),
    /// The out-of-band exchange failed.
    #[error("Couldn't get remote LID: {0}")]
    Exchange(#[source] CmError),
    /// The peer's next hop has no known MAC address.
    #[error("cannot resolve the MAC address of {0}")]
    Neighbour(std::net::IpAddr),
    /// A work completion with an error status.
    #[error("Failed status {status} ({code}) for wr_id {wr_id}")]
    Completion {
        /// The status.
        status: WcStatus,
        /// Its number (`enum ibv_wc_status`).
        code: u32,
        /// The work request.
        wr_id: u64,
    },
    /// A completion for a work request the example never posted.
    #[error("Completion for unknown wr_id {0}")]
    UnknownWrId(u64),
    /// No completion arrived for `timeout`.
    #[error("no completion for {timeout:?} (received {rcnt}, sent {scnt})")]
    Stalled {
        /// How long it waited.
        timeout: Duration,
        /// Messages received so far.
        rcnt: u64,
        /// Messages sent so far.
        scnt: u64,
    },
    /// `-c`: a page of a received buffer does not start with the expected byte.
    #[error("invalid data in page {0} of received buffer")]
    InvalidData(usize),
    /// `--verify`: a received message differs from what was expected.
    #[error("verify: receive {r}, {what}: {n} of {size} bytes differ, the first at byte {at}: got {got:#04x}, expected {want:#04x}")]
    Verify {
        /// Which receive (0-based).
        r: u64,
        /// What it should have been.
        what: String,
        /// Bytes that differ.
        n: usize,
        /// Bytes compared.
        size: usize,
        /// The first that differs.
        at: usize,
        /// Its value.
        got: u8,
        /// The expected value.
        want: u8,
    },
    /// Another verb failed.
    #[error("verbs: {0}")]
    Verbs(#[from] VerbsError),
    /// Writing the output failed.
    #[error("writing the output: {0}")]
    Output(#[from] std::io::Error),
}

/// Options of the ping-pong (`ibv_rc_pingpong`'s flags and ferroce's).
#[derive(Clone, Debug)]
pub struct PingpongRun {
    /// Which rdma-core example to be.
    pub example: Example,
    /// The server to connect to (`None`: be the server).
    pub host: Option<String>,
    /// `-p`: TCP port of the exchange.
    pub port: u16,
    /// `-d`: a network interface or `ferroce_<interface>` (default: the first with an address).
    pub dev: Option<String>,
    /// The packet backend.
    pub backend: BackendKind,
    /// `-g`: GID index (default: the first IPv4 GID; rdma-core's default, no GID, cannot work
    /// over RoCE).
    pub gid_index: Option<u8>,
    /// `-m`
    pub mtu: Mtu,
    /// `-s`
    pub size: u32,
    /// `-r`
    pub rx_depth: u32,
    /// `-n`
    pub iters: u32,
    /// `-l`: service level (accepted; RoCE carries none).
    pub sl: i64,
    /// `-e`: sleep on completion events instead of busy polling.
    pub events: bool,
    /// `-c`: validate received buffers.
    pub validate: bool,
    /// Check every byte of every echo (see `ferroce pingpong --verify`).
    pub verify: bool,
    /// Seed of the `--verify` pattern.
    pub verify_seed: u64,
    /// Write every frame sent and received to this pcap file.
    pub pcap: Option<PathBuf>,
    /// How long to wait for the peer.
    pub timeout: Duration,
}

/// The options as clap reads them (numbers as strings: rdma-core's `strtoul` reads them).
#[derive(clap::Parser, Debug)]
#[command(
    no_binary_name = true,
    disable_help_flag = true,
    disable_version_flag = true,
    args_override_self = true,
    infer_long_args = true
)]
struct Cli {
    #[arg(short = 'p', long = "port", allow_hyphen_values = true)]
    port: Option<String>,
    #[arg(short = 'd', long = "ib-dev", value_name = "DEV")]
    ib_dev: Option<String>,
    #[arg(short = 'i', long = "ib-port", allow_hyphen_values = true)]
    ib_port: Option<String>,
    #[arg(short = 's', long = "size", allow_hyphen_values = true)]
    size: Option<String>,
    #[arg(short = 'm', long = "mtu", allow_hyphen_values = true)]
    mtu: Option<String>,
    #[arg(short = 'r', long = "rx-depth", allow_hyphen_values = true)]
    rx_depth: Option<String>,
    #[arg(short = 'n', long = "iters", allow_hyphen_values = true)]
    iters: Option<String>,
    #[arg(short = 'l', long = "sl", allow_hyphen_values = true)]
    sl: Option<String>,
    #[arg(short = 'e', long = "events")]
    events: bool,
    #[arg(short = 'g', long = "gid-idx", allow_hyphen_values = true)]
    gid_idx: Option<String>,
    #[arg(short = 'c', long = "chk")]
    chk: bool,
    #[arg(short = 'o', long = "odp")]
    odp: bool,
    #[arg(short = 'O', long = "odp-prefetch")]
    odp_prefetch: bool,
    #[arg(short = 'P', long = "prefetch")]
    prefetch: bool,
    #[arg(short = 't', long = "ts")]
    ts: bool,
    #[arg(short = 'j', long = "dm")]
    dm: bool,
    #[arg(short = 'N', long = "new_send")]
    new_send: bool,
    #[arg(short = 'h', long = "help")]
    help: bool,
    #[arg(value_parser = crate::apps::addr::check_host)]
    hosts: Vec<String>,
    /// Packet backend (default: $FERROCE_BACKEND, else xdp).
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Write every frame sent and received to this pcap file.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Seconds to wait for the peer.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    /// Check every byte of every message against an ibv_rc_pingpong peer, which sends back
    /// the buffer it has just received.
    #[arg(long)]
    verify: bool,
    #[arg(long = "verify-seed", default_value_t = 0x5eed)]
    verify_seed: u64,
}

/// What a command line asks for.
#[derive(Debug)]
pub enum Parsed {
    /// Run with these options.
    Run(Box<PingpongRun>),
    /// `-h`: the text to print.
    Help(String),
}

/// A command line rdma-core refuses (it prints its usage), or that clap cannot read.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// clap could not read it.
    #[error("{}", .0.render())]
    Clap(#[from] clap::Error),
    /// A value rdma-core would refuse.
    #[error("invalid value '{value}' for '{flag}': {why}")]
    Value {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: String,
        /// Why it is refused.
        why: &'static str,
    },
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// C's `strtoul(s, NULL, 0)` as an `unsigned int`: the leading number, wrapped to 32 bits
/// (a minus sign negates, as `strtoul` does), 0 when there is none.
fn strtoul32(s: &str) -> u32 {
    let (v, _) = crate::apps::perf::args::strtol(s);
    v as u32
}

/// rdma-core's usage text.
pub fn usage(program: &str) -> String {
    format!(
        "Usage:\n  {program}            start a server and wait for connection\n  {program} <host>     connect to server at <host>\n\nOptions:\n  -p, --port=<port>      listen on/connect to port <port> (default 18515)\n  -d, --ib-dev=<dev>     use IB device <dev> (default first device found)\n  -i, --ib-port=<port>   use port <port> of IB device (default 1)\n  -s, --size=<size>      size of message to exchange (default 4096)\n  -m, --mtu=<size>       path MTU (default 1024)\n  -r, --rx-depth=<dep>   number of receives to post at a time (default 500)\n  -n, --iters=<iters>    number of exchanges (default 1000)\n  -l, --sl=<sl>          service level value\n  -e, --events           sleep on CQ events (default poll)\n  -g, --gid-idx=<gid index> local port gid index\n  -c, --chk              validate received buffer\n\nferroce's own options: --backend xdp|packet|udp, --pcap FILE, --timeout S, --verify [--verify-seed N]\n"
    )
}

/// Read a ping-pong command line (`args` without the program name), as `ibv_rc_pingpong`.
pub fn parse<I, T>(example: Example, args: I) -> Result<Parsed, ArgsError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    parse_as(example, example.program(), false, args)
}

/// [`parse`], for `ferroce pingpong` (`dev_required`: ferroce's own command wants `-d`).
pub fn parse_as<I, T>(
    example: Example,
    program: &str,
    dev_required: bool,
    args: I,
) -> Result<Parsed, ArgsError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    use clap::{CommandFactory, FromArgMatches};
    let cmd = Cli::command()
        .bin_name(program.to_string())
        .mut_arg("ib_dev", |a| a.required(dev_required));
    let m = cmd.try_get_matches_from(args)?;
    let c = Cli::from_arg_matches(&m)?;
    if c.help {
        return Ok(Parsed::Help(usage(program)));
    }
    let value = |flag: &'static str, v: &str, why: &'static str| ArgsError::Value {
        flag,
        value: v.to_string(),
        why,
    };
    let mut port = 18515u32;
    if let Some(s) = &c.port {
        port = strtoul32(s);
        if port > 65535 || port == 0 {
            return Err(value("-p", s, "not a TCP port (1 to 65535)"));
        }
    }
    if let Some(s) = &c.ib_port {
        let v = crate::apps::perf::args::strtol(s).0;
        if v < 1 {
            return Err(value("-i", s, "ports are numbered from 1"));
        }
        if v != 1 {
            return Err(value("-i", s, "ferroce devices have one port"));
        }
    }
    let mut mtu = Mtu::M1024;
    if let Some(s) = &c.mtu {
        match u32::try_from(crate::apps::perf::args::strtol(s).0)
            .ok()
            .and_then(Mtu::from_bytes)
        {
            Some(m) => mtu = m,
            None => return Err(value("-m", s, "one of 256, 512, 1024, 2048, 4096")),
        }
    }
    let gid_index = match &c.gid_idx {
        // A negative index is rdma-core's "no GID", which cannot work over RoCE: ferroce then
        // picks the first IPv4 GID.
        Some(s) => u8::try_from(crate::apps::perf::args::strtol(s).0).ok(),
        None => None,
    };
    let host = match c.hosts.as_slice() {
        [] => None,
        [h] => Some(h.clone()),
        _ => {
            return Err(ArgsError::Other(format!(
                "one server address at most, not {}",
                c.hosts.len()
            )))
        }
    };
    if c.odp || c.odp_prefetch || c.prefetch || c.ts || c.dm || c.new_send {
        return Err(ArgsError::Other(
            "-o, -O, -P, -t, -j and -N (ODP, completion timestamps, device memory, the new send API) are not supported by ferroce".into(),
        ));
    }
    let backend = match c.backend {
        Some(b) => b,
        None => match std::env::var("FERROCE_BACKEND").ok().as_deref() {
            Some("packet") => BackendKind::Packet,
            Some("udp") => BackendKind::Udp,
            _ => BackendKind::Xdp,
        },
    };
    Ok(Parsed::Run(Box::new(PingpongRun {
        example,
        host,
        port: port as u16,
        dev: c.ib_dev,
        backend,
        gid_index,
        mtu,
        size: c.size.as_deref().map(strtoul32).unwrap_or(4096),
        rx_depth: c.rx_depth.as_deref().map(strtoul32).unwrap_or(500),
        iters: c.iters.as_deref().map(strtoul32).unwrap_or(1000),
        sl: c
            .sl
            .as_deref()
            .map(|s| crate::apps::perf::args::strtol(s).0)
            .unwrap_or(0),
        events: c.events,
        validate: c.chk,
        verify: c.verify,
        verify_seed: c.verify_seed,
        pcap: c.pcap,
        timeout: Duration::from_secs(c.timeout),
    })))
}

const PAGE: usize = 4096;
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

/// Run the ping-pong, compatible on the wire and in its output with `ibv_rc_pingpong`.
pub fn run_pingpong(o: &PingpongRun, out: &mut dyn Write) -> Result<(), PingpongError> {
    match o.example {
        Example::Rc => {}
        // The hook for the other examples: once UC/UD queue pairs and SRQs exist, they run
        // here with their own exchanges.
        Example::Uc => return Err(PingpongError::NotYet("ibv_uc_pingpong (UC queue pairs)")),
        Example::Ud => return Err(PingpongError::NotYet("ibv_ud_pingpong (UD queue pairs)")),
        Example::Srq => {
            return Err(PingpongError::NotYet(
                "ibv_srq_pingpong (shared receive queues)",
            ))
        }
    }
    let dev = tool::find_device(o.dev.as_deref())?;
    let gid_index = tool::pick_gid(&dev, o.gid_index)?;
    let local = dev.gids[usize::from(gid_index)];
    // Ping-pong is a latency test: the application's thread drives the engine (no thread
    // hand-off), and AF_PACKET receives without the ring's batching delay.
    let pkt = backend::open_with(o.backend, &dev, local, true).map_err(|e| ToolError::Backend {
        kind: o.backend.name(),
        dev: dev.name.clone(),
        err: e,
    })?;
    let mut dcfg = DeviceConfig::new(dev.mac, local);
    dcfg.gids = dev.gids.clone();
    let opts = NicOptions {
        poll: PollMode::Inline,
        batch: 64,
    };
    let nic = match &o.pcap {
        Some(p) => {
            let f = std::fs::File::create(p).map_err(|e| ToolError::Io {
                what: p.display().to_string(),
                err: e,
            })?;
            let tap = PcapTap::new(pkt, std::io::BufWriter::new(f)).map_err(|e| ToolError::Io {
                what: p.display().to_string(),
                err: std::io::Error::other(e),
            })?;
            Nic::start(dcfg, tap, opts)
        }
        None => Nic::start(dcfg, pkt, opts),
    }
    .map_err(|e| ToolError::Io {
        what: "starting the NIC".into(),
        err: e,
    })?;
    let r = pingpong_on(o, &nic, &dev, gid_index, local, out);
    // Let the last ACKs leave before the engine stops.
    std::thread::sleep(Duration::from_millis(50));
    nic.shutdown();
    r
}

fn pingpong_on(
    o: &PingpongRun,
    nic: &Nic,
    dev: &netdev::Netdev,
    gid_index: u8,
    local: std::net::IpAddr,
    out: &mut dyn Write,
) -> Result<(), PingpongError> {
    let size = o.size as usize;
    let pd = nic.alloc_pd();
    let cq = nic
        .create_cq(o.rx_depth as usize + 1)
        .map_err(|err| PingpongError::Create { what: "CQ", err })?;
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: o.rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = crate::runtime::create_rc_qp(nic, pd, cq, cap)
        .map_err(|err| PingpongError::Create { what: "QP", err })?;
    // As rc_pingpong: the QP goes to INIT at creation, so that the receives can be posted
    // before the exchange.
    crate::apps::perf::qp_to_init(nic, qp, AccessFlags::empty())
        .map_err(|err| PingpongError::Modify { state: "INIT", err })?;
    let mr = nic
        .reg_mr(pd, size.max(1), AccessFlags::LOCAL_WRITE)
        .map_err(|err| PingpongError::Create { what: "MR", err })?;
    // As rc_pingpong: the buffer is filled with 0x7b; with -c the first byte of each page is
    // set to `page index % sizeof(char)`, which is 0, and checked on every receive.
    mr.fill(0x7b);
    if o.validate {
        for i in (0..size).step_by(PAGE) {
            mr.write(i, &[0])
                .map_err(|_| PingpongError::InvalidData(i / PAGE))?;
        }
    }
    let psn = ((std::process::id().wrapping_mul(2_654_435_761)) ^ 0x5a5a5a) & 0xff_ffff;
    let gid = gid_of(local);
    let ours = Dest {
        lid: 0,
        qpn: qp.get(),
        psn,
        gid,
    };
    let ifname = dev.name.clone();
    let udp = o.backend == BackendKind::Udp;
    let connect = |t: &Dest| -> Result<(), PingpongError> {
        let ip = crate::verbs::ip_of_gid(t.gid);
        let mac = if udp {
            Some(MacAddr::ZERO)
        } else {
            netdev::resolve(ip, Some(&ifname), Duration::from_secs(2))
        };
        let mac = mac.ok_or(PingpongError::Neighbour(ip))?;
        let p = RcParams {
            mtu: o.mtu,
            access: AccessFlags::empty(),
            sgid_index: gid_index,
            local_psn: psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            traffic_class: 0,
        };
        nic.connect_rc(
            qp,
            &RemoteQp {
                qpn: QpNumber::new(t.qpn),
                gid: t.gid,
                mac,
                psn: t.psn,
            },
            &p,
        )
        .map_err(|err| PingpongError::Modify { state: "RTR", err })
    };
    let recv = || RecvWr {
        wr_id: RECV_WRID,
        sg_list: vec![Sge {
            addr: mr.addr(),
            length: o.size,
            lkey: mr.lkey(),
        }],
    };
    // pp_post_recv: as many as fit, at most rx_depth.
    let mut routs = 0u32;
    for _ in 0..o.rx_depth {
        if nic.post_recv(qp, recv()).is_err() {
            break;
        }
        routs += 1;
    }
    if routs < o.rx_depth {
        return Err(PingpongError::PostRecv(routs));
    }
    if o.events {
        nic.req_notify_cq(cq, NotifyMode::NextCompletion)?;
    }
    let fmt_dest = |d: &Dest| {
        format!(
            "LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            d.lid,
            d.qpn,
            d.psn,
            std::net::Ipv6Addr::from(d.gid)
        )
    };
    writeln!(out, "  local address:  {}", fmt_dest(&ours))?;
    out.flush()?;
    let theirs = match &o.host {
        None => {
            let l = TcpListener::bind(("::", o.port))
                .or_else(|_| TcpListener::bind(("0.0.0.0", o.port)))
                .map_err(|e| ToolError::Io {
                    what: format!("Couldn't listen to port {}", o.port),
                    err: e,
                })?;
            let (mut s, _) = l.accept().map_err(|e| ToolError::Io {
                what: "accept() failed".into(),
                err: e,
            })?;
            // The server connects its QP before it answers (rc_pingpong does); a failure
            // ends the exchange there.
            let mut connected = Ok(());
            let theirs = pp::server_exchange(&mut s, &ours, o.timeout, |t| {
                connected = connect(t);
                match &connected {
                    Ok(()) => Ok(()),
                    Err(_) => Err(CmError::Malformed {
                        what: "connection",
                        detail: "Couldn't connect to remote QP".into(),
                    }),
                }
            });
            connected?;
            let theirs = theirs.map_err(PingpongError::Exchange)?;
            pp::wait_done(&mut s, o.timeout).map_err(PingpongError::Exchange)?;
            theirs
        }
        Some(h) => {
            let mut s = tool::connect(h, o.port)?;
            let theirs =
                pp::client_exchange(&mut s, &ours, o.timeout).map_err(PingpongError::Exchange)?;
            pp::send_done(&mut s).map_err(PingpongError::Exchange)?;
            connect(&theirs)?;
            theirs
        }
    };
    writeln!(out, "  remote address: {}", fmt_dest(&theirs))?;
    out.flush()?;
    let send = |nic: &Nic| {
        nic.post_send(
            qp,
            SendWr::new(
                SEND_WRID,
                SendOp::Send,
                vec![Sge {
                    addr: mr.addr(),
                    length: o.size,
                    lkey: mr.lkey(),
                }],
            )
            .with_flags(SendFlags::SIGNALED),
        )
    };
    // --verify: message k that we send is pattern k; the peer echoes it, so receive k (client)
    // or k+1 (server: receive 0 is the client's initial buffer) must equal it.
    let mut verified = 0u64;
    let mut sent_msgs = 0u64;
    let initial: Vec<u8> = {
        let mut v = vec![0x7bu8; size];
        if o.validate {
            for i in (0..size).step_by(PAGE) {
                v[i] = 0;
            }
        }
        v
    };
    let fill_next = |k: u64| {
        if o.verify {
            let p = crate::apps::pattern::expected(size, o.verify_seed, k, true);
            let _ = mr.write(0, &p);
        }
    };
    let check_echo = |r: u64| -> Result<(), PingpongError> {
        let (want, what) = if o.host.is_none() && r == 0 {
            (
                initial.clone(),
                "the client's first message (ibv_rc_pingpong's initial buffer)".to_string(),
            )
        } else {
            let k = if o.host.is_none() { r - 1 } else { r };
            (
                crate::apps::pattern::expected(size, o.verify_seed, k, true),
                format!("the echo of our message {k}"),
            )
        };
        let got = mr.to_vec();
        match crate::apps::pattern::first_mismatch(&got[..size], &want) {
            None => Ok(()),
            Some((at, g, w, n)) => Err(PingpongError::Verify {
                r,
                what,
                n,
                size,
                at,
                got: g,
                want: w,
            }),
        }
    };
    let iters = u64::from(o.iters);
    let mut pending = RECV_WRID;
    let t0 = Instant::now();
    if o.host.is_some() {
        fill_next(sent_msgs);
        sent_msgs += 1;
        send(nic).map_err(PingpongError::PostSend)?;
        pending |= SEND_WRID;
    }
    let (mut rcnt, mut scnt) = (0u64, 0u64);
    let mut wcs = Vec::new();
    let mut last = Instant::now();
    while rcnt < iters || scnt < iters {
        if o.events {
            // ibv_get_cq_event, then ibv_req_notify_cq, then poll (possibly nothing).
            if !nic.get_cq_event(cq, Duration::from_millis(100))? {
                if last.elapsed() > o.timeout {
                    return Err(PingpongError::Stalled {
                        timeout: o.timeout,
                        rcnt,
                        scnt,
                    });
                }
                continue;
            }
            nic.req_notify_cq(cq, NotifyMode::NextCompletion)?;
        }
        wcs.clear();
        nic.poll_cq(cq, &mut wcs, 2)?;
        if wcs.is_empty() {
            let idle = last.elapsed();
            if idle > o.timeout {
                return Err(PingpongError::Stalled {
                    timeout: o.timeout,
                    rcnt,
                    scnt,
                });
            }
            // Busy-poll as rc_pingpong does, but only briefly: a thread that spins for ever
            // starves the engine when cores are scarce.
            if !o.events {
                if idle < Duration::from_micros(50) {
                    std::hint::spin_loop();
                } else {
                    nic.wait_cq(cq, Duration::from_millis(1))?;
                }
            }
            continue;
        }
        last = Instant::now();
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                return Err(PingpongError::Completion {
                    status: wc.status,
                    code: wc.status as u32,
                    wr_id: wc.wr_id,
                });
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    // parse_single_wc: when one or none is left, post up to rx_depth again.
                    routs = routs.saturating_sub(1);
                    if routs <= 1 {
                        let want = o.rx_depth - routs;
                        for _ in 0..want {
                            if nic.post_recv(qp, recv()).is_err() {
                                break;
                            }
                            routs += 1;
                        }
                        if routs < o.rx_depth {
                            return Err(PingpongError::PostRecv(routs));
                        }
                    }
                    if o.verify {
                        check_echo(rcnt)?;
                        verified += 1;
                    }
                    if o.validate {
                        for i in (0..size).step_by(PAGE) {
                            let mut b = [0u8];
                            let _ = mr.read(i, &mut b);
                            if b[0] != 0 {
                                return Err(PingpongError::InvalidData(i / PAGE));
                            }
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(PingpongError::UnknownWrId(other)),
            }
            pending &= !wc.wr_id;
            if scnt < iters && pending == 0 {
                fill_next(sent_msgs);
                sent_msgs += 1;
                send(nic).map_err(PingpongError::PostSend)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    // rdma-core measures in float microseconds from gettimeofday.
    let usec = t0.elapsed().as_micros().max(1) as f64;
    let bytes = u64::from(o.size) * iters * 2;
    writeln!(
        out,
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    )?;
    writeln!(
        out,
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        o.iters,
        usec / 1e6,
        usec / iters.max(1) as f64
    )?;
    if o.verify {
        writeln!(
            out,
            "verify: ok: {verified} received messages of {size} bytes equal what was expected byte for byte (pattern seed {:#x})",
            o.verify_seed
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> PingpongRun {
        match parse(Example::Rc, args.iter().copied()).unwrap() {
            Parsed::Run(r) => *r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rdma_core_defaults_and_values() {
        let r = run(&[]);
        assert_eq!(
            (r.size, r.rx_depth, r.iters, r.port),
            (4096, 500, 1000, 18515)
        );
        assert_eq!(r.mtu, Mtu::M1024);
        // -r 1 (issue 11), and any other unsigned value rdma-core takes
        assert_eq!(run(&["-r", "1"]).rx_depth, 1);
        assert_eq!(run(&["-r", "0"]).rx_depth, 0);
        assert_eq!(run(&["-r", "0x20"]).rx_depth, 32);
        assert_eq!(run(&["-n", "0"]).iters, 0);
        assert_eq!(run(&["-n", "1", "-s", "1"]).iters, 1);
        assert_eq!(run(&["-m", "4096"]).mtu, Mtu::M4096);
        assert_eq!(
            run(&["10.0.0.1", "-g", "1"]).host.as_deref(),
            Some("10.0.0.1")
        );
    }

    #[test]
    fn what_rdma_core_refuses_is_refused() {
        for bad in [
            &["-m", "1000"][..],
            &["-p", "70000"],
            &["-i", "0"],
            &["a", "b"],
            &["--bogus"],
            &["999.1.1.1"],
        ] {
            assert!(parse(Example::Rc, bad.iter().copied()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn program_names() {
        assert_eq!(
            Example::of_program("/usr/bin/ibv_rc_pingpong"),
            Some(Example::Rc)
        );
        assert_eq!(Example::of_program("ibv_ud_pingpong"), Some(Example::Ud));
        assert_eq!(Example::of_program("ferroce"), None);
    }
}
