//! `ferroce pingpong` and `ibv_rc_pingpong`, `ibv_uc_pingpong`, `ibv_ud_pingpong`,
//! `ibv_srq_pingpong` (links to the ferroce binary): rdma-core's ping-pong examples, each with
//! its flags (read as its `getopt_long` and `strtoul` read them), its out-of-band messages
//! ([`crate::oob::pingpong`]) and its output, so either end can be the real tool.
//!
//! - UC: the RC example over a UC QP (no ACKs; a lost message stalls the run).
//! - UD: receive buffers of `size + 40` bytes whose first 40 are the GRH slot, sends from byte
//!   40, Q_Key 0x11111111, an address handle to the peer (hop limit 64); no `-m` (a message
//!   must fit the port's MTU); its local address line reads `PSN 0x...: GID`.
//! - SRQ: `-q` RC QPs (default 16) sharing one SRQ of `rx_depth` receives, refilled when no
//!   more than one per QP is left; 256 connection messages each way whatever `-q`.

use crate::apps::tool::{self, ToolError};
use crate::io::backend::{self, BackendKind};
use crate::io::netdev;
use crate::io::PcapTap;
use crate::oob::pingpong::{self as pp, Dest};
use crate::oob::CmError;
use crate::runtime::{Nic, NicOptions, PollMode};
use crate::verbs::{
    gid_of, Ah, DeviceConfig, NotifyMode, QpInitAttr, QpType, RcParams, RecvWr, RemoteQp,
    SendFlags, SendOp, SendWr, Sge, SrqAttr, UcParams, UdDest, UdParams, VerbsError, WcStatus,
};
use crate::verbs::{AccessFlags, AddressVector, Mtu, QpCap};
use crate::wire::{MacAddr, QpNumber};
use std::ffi::OsString;
use std::io::Write;
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
    /// `ibv_srq_pingpong`: fewer receives than QPs.
    #[error("rx_depth {rx_depth} is too small for {num_qp} QPs -- must have at least one receive per QP.")]
    SrqDepth {
        /// `-r`
        rx_depth: u32,
        /// `-q`
        num_qp: u32,
    },
    /// `ibv_srq_pingpong`: `-q` of 256 or more (its message, its bound).
    #[error("num_qp {0} must be less than 255")]
    SrqNumQp(u32),
    /// `ibv_ud_pingpong`: a message larger than the port's active MTU.
    #[error("Requested size larger than port MTU ({0})")]
    UdSize(u32),
    /// A completion for a QP the example does not have.
    #[error("Couldn't find QPN {0:06x}")]
    UnknownQpn(u32),
    /// `--verify` of a UD receive: the GRH slot does not hold the packet's IP header.
    #[error("verify: receive {r}: the GRH slot is {why}")]
    VerifyGrh {
        /// Which receive (0-based).
        r: u64,
        /// What is wrong.
        why: String,
    },
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
    /// `--bind`: the server listens on this address only (default: all interfaces).
    pub bind: Option<std::net::IpAddr>,
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
    /// `-q` (`ibv_srq_pingpong`: QPs sharing the SRQ; 1 for the others).
    pub num_qp: u32,
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
    #[arg(short = 'q', long = "num-qp", allow_hyphen_values = true)]
    num_qp: Option<String>,
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
    /// Server: listen on this address only (default: all interfaces).
    #[arg(long)]
    bind: Option<std::net::IpAddr>,
    /// Seconds to wait for the peer.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    /// Check every byte of every message against an ibv_rc_pingpong peer, which sends back
    /// the buffer it has just received.
    #[arg(long)]
    verify: bool,
    #[arg(long = "verify-seed", default_value_t = 0x5eed)]
    verify_seed: u64,
    /// `ferroce pingpong`: which example to be (rc, uc, ud, srq); the program names choose
    /// by themselves.
    #[arg(long, value_parser = ["rc", "uc", "ud", "srq"])]
    transport: Option<String>,
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

/// rdma-core's usage text of `ibv_rc_pingpong`.
pub fn usage(program: &str) -> String {
    usage_for(Example::Rc, program)
}

/// The usage text of `example` (as rdma-core prints it, for the options ferroce has).
pub fn usage_for(example: Example, program: &str) -> String {
    let size = match example {
        // ud_pingpong's usage says 2048; its default is 1024.
        Example::Ud => "  -s, --size=<size>      size of message to exchange (default 2048)\n",
        _ => "  -s, --size=<size>      size of message to exchange (default 4096)\n",
    };
    let mtu = match example {
        Example::Ud => "",
        _ => "  -m, --mtu=<size>       path MTU (default 1024)\n",
    };
    let num_qp = match example {
        Example::Srq => "  -q, --num-qp=<num>     number of QPs to use (default 16)\n",
        _ => "",
    };
    let iters = match example {
        Example::Srq => "  -n, --iters=<iters>    number of exchanges per QP(default 1000)\n",
        _ => "  -n, --iters=<iters>    number of exchanges (default 1000)\n",
    };
    let sl = match example {
        Example::Ud => {
            "  -l, --sl=<SL>          send messages with service level <SL> (default 0)\n"
        }
        _ => "  -l, --sl=<sl>          service level value\n",
    };
    let transport = if program.starts_with("ferroce") {
        " --transport rc|uc|ud|srq,"
    } else {
        ""
    };
    format!(
        "Usage:\n  {program}            start a server and wait for connection\n  {program} <host>     connect to server at <host>\n\nOptions:\n  -p, --port=<port>      listen on/connect to port <port> (default 18515)\n  -d, --ib-dev=<dev>     use IB device <dev> (default first device found)\n  -i, --ib-port=<port>   use port <port> of IB device (default 1)\n{size}{mtu}{num_qp}  -r, --rx-depth=<dep>   number of receives to post at a time (default 500)\n{iters}{sl}  -e, --events           sleep on CQ events (default poll)\n  -g, --gid-idx=<gid index> local port gid index\n  -c, --chk              validate received buffer\n\nferroce's own options:{transport} --backend xdp|packet|udp, --pcap FILE, --timeout S, --bind ADDR, --verify [--verify-seed N]\n"
    )
}

/// The short options `example`'s `getopt_long` knows (besides those every example has:
/// p d i s r n l e g c): `-m`, `-q`, and the RC example's ODP/timestamp/DM/new-send flags.
fn knows(example: Example, flag: char) -> bool {
    match flag {
        'm' => example != Example::Ud,
        'q' => example == Example::Srq,
        'o' => matches!(example, Example::Rc | Example::Srq),
        'O' | 'P' | 't' | 'j' | 'N' => example == Example::Rc,
        _ => true,
    }
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
    let example = match c.transport.as_deref() {
        Some("rc") => Example::Rc,
        Some("uc") => Example::Uc,
        Some("ud") => Example::Ud,
        Some("srq") => Example::Srq,
        _ => example,
    };
    if c.help {
        return Ok(Parsed::Help(usage_for(example, program)));
    }
    // What the example's getopt does not know: rdma-core prints its usage and exits.
    for (flag, given) in [
        ('m', c.mtu.is_some()),
        ('q', c.num_qp.is_some()),
        ('o', c.odp),
        ('O', c.odp_prefetch),
        ('P', c.prefetch),
        ('t', c.ts),
        ('j', c.dm),
        ('N', c.new_send),
    ] {
        if given && !knows(example, flag) {
            return Err(ArgsError::Other(format!(
                "{} has no option -{flag} (invalid option -- '{flag}')",
                example.program()
            )));
        }
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
    let size = c
        .size
        .as_deref()
        .map(strtoul32)
        .unwrap_or(if example == Example::Ud { 1024 } else { 4096 });
    if example == Example::Srq && size < 1 {
        return Err(value("-s", c.size.as_deref().unwrap_or(""), "at least 1"));
    }
    let num_qp = match (&c.num_qp, example) {
        (Some(s), _) => {
            let n = strtoul32(s);
            if n == 0 {
                return Err(value("-q", s, "at least one QP"));
            }
            n
        }
        (None, Example::Srq) => 16,
        (None, _) => 1,
    };
    if c.verify && example == Example::Srq && num_qp > 1 {
        return Err(ArgsError::Other(
            "--verify needs one message in flight: ibv_srq_pingpong's QPs share one buffer; use -q 1".into(),
        ));
    }
    Ok(Parsed::Run(Box::new(PingpongRun {
        example,
        host,
        port: port as u16,
        bind: c.bind,
        dev: c.ib_dev,
        backend,
        gid_index,
        mtu,
        size,
        rx_depth: c.rx_depth.as_deref().map(strtoul32).unwrap_or(500),
        iters: c.iters.as_deref().map(strtoul32).unwrap_or(1000),
        num_qp,
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
/// `ibv_ud_pingpong`'s Q_Key.
const UD_QKEY: u32 = 0x1111_1111;
/// The GRH slot at the start of every UD receive buffer.
const GRH: usize = 40;

/// Run the ping-pong, compatible on the wire and in its output with the rdma-core example
/// `o.example` names.
pub fn run_pingpong(o: &PingpongRun, out: &mut dyn Write) -> Result<(), PingpongError> {
    if o.example == Example::Srq {
        // srq_pingpong's checks, in its order, before it opens the device.
        if o.num_qp > o.rx_depth {
            return Err(PingpongError::SrqDepth {
                rx_depth: o.rx_depth,
                num_qp: o.num_qp,
            });
        }
        if o.num_qp >= pp::SRQ_MSGS as u32 {
            return Err(PingpongError::SrqNumQp(o.num_qp));
        }
    }
    let dev = tool::find_device(o.dev.as_deref())?;
    let gid_index = tool::pick_gid(&dev, o.gid_index)?;
    let local = dev.gids[usize::from(gid_index)];
    let port_mtu = netdev::ib_mtu_for(dev.mtu.unwrap_or(1500));
    if o.example == Example::Ud && o.size > port_mtu.bytes() {
        return Err(PingpongError::UdSize(port_mtu.bytes()));
    }
    // Ping-pong is a latency test: the application's thread drives the engine (no thread
    // hand-off), and AF_PACKET receives without the ring's batching delay.
    let pkt = backend::open_with(o.backend, &dev, local, true).map_err(|e| ToolError::Backend {
        kind: o.backend.name(),
        dev: dev.name.clone(),
        err: e,
    })?;
    let mut dcfg = DeviceConfig::new(dev.mac, local);
    dcfg.gids = dev.gids.clone();
    dcfg.port_mtu = port_mtu;
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

/// A starting PSN per QP (the examples draw theirs with `lrand48() & 0xffffff`).
fn psn_for(_i: u32) -> u32 {
    // From the cryptographic generator, not the PID (issue 17, finding 2).
    crate::keys::KeyGen::new(None).psn()
}

/// `LID 0x0000, QPN 0x000011, PSN 0x670d5e, GID ::ffff:10.77.0.12`: the examples' address
/// line (`ibv_ud_pingpong` writes its own local line with `: GID`).
fn fmt_dest(d: &Dest, gid_sep: &str) -> String {
    format!(
        "LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}{gid_sep} GID {}",
        d.lid,
        d.qpn,
        d.psn,
        std::net::Ipv6Addr::from(d.gid)
    )
}

fn pingpong_on(
    o: &PingpongRun,
    nic: &Nic,
    dev: &netdev::Netdev,
    gid_index: u8,
    local: std::net::IpAddr,
    out: &mut dyn Write,
) -> Result<(), PingpongError> {
    let ex = o.example;
    let size = o.size as usize;
    // UD: every buffer starts with the 40-byte GRH slot; the message follows it.
    let off = if ex == Example::Ud { GRH } else { 0 };
    let num_qp = if ex == Example::Srq { o.num_qp } else { 1 };
    let pd = nic.alloc_pd()?;
    let cq_depth = if ex == Example::Srq {
        o.rx_depth as usize + num_qp as usize
    } else {
        o.rx_depth as usize + 1
    };
    let cq = nic
        .create_cq(cq_depth)
        .map_err(|err| PingpongError::Create { what: "CQ", err })?;
    let srq = if ex == Example::Srq {
        Some(
            nic.create_srq(
                pd,
                SrqAttr {
                    max_wr: o.rx_depth,
                    max_sge: 1,
                    srq_limit: 0,
                },
            )
            .map_err(|err| PingpongError::Create { what: "SRQ", err })?,
        )
    } else {
        None
    };
    let qp_type = match ex {
        Example::Rc | Example::Srq => QpType::Rc,
        Example::Uc => QpType::Uc,
        Example::Ud => QpType::Ud,
    };
    let mut qps = Vec::with_capacity(num_qp as usize);
    for _ in 0..num_qp {
        let mut init = QpInitAttr::new(
            pd,
            cq,
            cq,
            QpCap {
                max_send_wr: 1,
                max_recv_wr: if srq.is_some() { 0 } else { o.rx_depth },
                max_send_sge: 1,
                max_recv_sge: if srq.is_some() { 0 } else { 1 },
                max_inline_data: 0,
            },
        );
        init.qp_type = qp_type;
        init.srq = srq;
        let qp = nic
            .create_qp(init)
            .map_err(|err| PingpongError::Create { what: "QP", err })?;
        // As the examples: the QPs go to INIT at creation, so that the receives can be posted
        // before the exchange (UD with its Q_Key).
        let (a, mask) = match ex {
            Example::Ud => UdParams {
                qkey: UD_QKEY,
                local_psn: 0,
            }
            .init_attr(),
            _ => RcParams {
                access: AccessFlags::empty(),
                ..Default::default()
            }
            .init_attr(),
        };
        nic.modify_qp(qp, &a, mask)
            .map_err(|err| PingpongError::Modify { state: "INIT", err })?;
        qps.push(qp);
    }
    let mr = nic
        .reg_mr(pd, (size + off).max(1), AccessFlags::LOCAL_WRITE)
        .map_err(|err| PingpongError::Create { what: "MR", err })?;
    // The examples fill their buffer with 0x7b (srq_pingpong with 0); with -c the first byte
    // of each page of the message is set to `page index % sizeof(char)`, which is 0.
    let fill = if ex == Example::Srq { 0 } else { 0x7b };
    mr.fill(fill);
    if o.validate {
        for i in (0..size).step_by(PAGE) {
            mr.write(off + i, &[0])
                .map_err(|_| PingpongError::InvalidData(i / PAGE))?;
        }
    }
    let gid = gid_of(local);
    let ours: Vec<Dest> = qps
        .iter()
        .enumerate()
        .map(|(i, q)| Dest {
            lid: 0,
            qpn: q.get(),
            psn: psn_for(i as u32),
            gid,
        })
        .collect();
    let ifname = dev.name.clone();
    let udp = o.backend == BackendKind::Udp;
    let mac_of = |gid: [u8; 16]| -> Result<MacAddr, PingpongError> {
        let ip = crate::verbs::ip_of_gid(gid);
        let mac = if udp {
            Some(MacAddr::ZERO)
        } else {
            netdev::resolve(ip, Some(&ifname), Duration::from_secs(2))
        };
        mac.ok_or(PingpongError::Neighbour(ip))
    };
    // Connect QP i to the peer's QP described by `t` (UD: RTR, RTS and the address handle).
    let connect = |i: usize, t: &Dest| -> Result<Option<Ah>, PingpongError> {
        let qp = qps[i];
        let mac = mac_of(t.gid)?;
        let remote = RemoteQp {
            qpn: QpNumber::new(t.qpn),
            gid: t.gid,
            mac,
            psn: t.psn,
        };
        match ex {
            Example::Rc | Example::Srq => {
                let p = RcParams {
                    mtu: o.mtu,
                    access: AccessFlags::empty(),
                    sgid_index: gid_index,
                    local_psn: ours[i].psn,
                    timeout: 14,
                    retry_cnt: 7,
                    rnr_retry: 7,
                    min_rnr_timer: 12,
                    max_rd_atomic: 1,
                    max_dest_rd_atomic: 1,
                    traffic_class: 0,
                };
                nic.connect_rc(qp, &remote, &p)
                    .map_err(|err| PingpongError::Modify { state: "RTR", err })?;
                Ok(None)
            }
            Example::Uc => {
                let p = UcParams {
                    mtu: o.mtu,
                    access: AccessFlags::empty(),
                    sgid_index: gid_index,
                    local_psn: ours[i].psn,
                    traffic_class: 0,
                };
                nic.connect_uc(qp, &remote, &p)
                    .map_err(|err| PingpongError::Modify { state: "RTR", err })?;
                Ok(None)
            }
            Example::Ud => {
                let p = UdParams {
                    qkey: UD_QKEY,
                    local_psn: ours[i].psn,
                };
                let (a, mask) = p.rtr_attr();
                nic.modify_qp(qp, &a, mask)
                    .map_err(|err| PingpongError::Modify { state: "RTR", err })?;
                let (a, mask) = p.rts_attr();
                nic.modify_qp(qp, &a, mask)
                    .map_err(|err| PingpongError::Modify { state: "RTS", err })?;
                // ud_pingpong's address handle: hop limit 64, the peer's GID.
                let av = AddressVector {
                    dgid: t.gid,
                    sgid_index: gid_index,
                    hop_limit: 64,
                    traffic_class: 0,
                    flow_label: 0,
                    dmac: Some(mac.0),
                };
                let ah = nic
                    .create_ah(pd, &av)
                    .map_err(|err| PingpongError::Create { what: "AH", err })?;
                Ok(Some(ah))
            }
        }
    };
    let recv = || RecvWr {
        wr_id: RECV_WRID,
        sg_list: smallvec::smallvec![Sge {
            addr: mr.addr(),
            length: o.size + off as u32,
            lkey: mr.lkey(),
        }],
    };
    let post_recvs = |n: u32| -> u32 {
        let mut done = 0;
        for _ in 0..n {
            let r = match srq {
                Some(s) => nic.post_srq_recv(s, recv()),
                None => nic.post_recv(qps[0], recv()),
            };
            if r.is_err() {
                break;
            }
            done += 1;
        }
        done
    };
    // pp_post_recv: as many as fit, at most rx_depth.
    let mut routs = post_recvs(o.rx_depth);
    if routs < o.rx_depth {
        return Err(PingpongError::PostRecv(routs));
    }
    if o.events {
        nic.req_notify_cq(cq, NotifyMode::NextCompletion)?;
    }
    let local_sep = if ex == Example::Ud { ":" } else { "," };
    for d in &ours {
        writeln!(out, "  local address:  {}", fmt_dest(d, local_sep))?;
    }
    out.flush()?;
    let mut ah = None;
    let theirs: Vec<Dest> = match &o.host {
        None => {
            let l = crate::oob::listen(o.bind, o.port).map_err(|e| ToolError::Io {
                what: format!("Couldn't listen to port {}", o.port),
                err: e,
            })?;
            // The first client whose first message is a valid destination; one that stalls
            // or sends garbage is dropped (see `oob::Acceptor`), never the run.
            let mut acc = crate::oob::Acceptor::new(
                l,
                pp::MSG_LEN,
                |b| pp::Dest::from_wire(b).is_ok(),
                o.timeout,
            );
            let mut s = acc
                .next(&mut |who, why| tracing::warn!("dropped client {who}: {why}"))
                .map_err(|e| ToolError::Io {
                    what: "accept() failed".into(),
                    err: e,
                })?;
            drop(acc);
            // The server connects its QPs before it answers (the examples do); a failure
            // ends the exchange there.
            let mut connected = Ok(());
            let refuse = || CmError::Malformed {
                what: "connection",
                detail: "Couldn't connect to remote QP".into(),
            };
            if ex == Example::Srq {
                let theirs =
                    pp::server_exchange_many(&mut s, &ours, pp::SRQ_MSGS, o.timeout, |t| {
                        connected = (0..qps.len()).try_for_each(|i| connect(i, &t[i]).map(drop));
                        connected.as_ref().map(drop).map_err(|_| refuse())
                    });
                connected?;
                theirs.map_err(PingpongError::Exchange)?
            } else {
                let theirs = pp::server_exchange(&mut s, &ours[0], o.timeout, |t| {
                    connected = connect(0, t).map(|a| ah = a);
                    connected.as_ref().map(drop).map_err(|_| refuse())
                });
                connected?;
                let theirs = theirs.map_err(PingpongError::Exchange)?;
                pp::wait_done(&mut s, o.timeout).map_err(PingpongError::Exchange)?;
                vec![theirs]
            }
        }
        Some(h) => {
            let mut s = tool::connect(h, o.port)?;
            if ex == Example::Srq {
                pp::client_exchange_many(&mut s, &ours, pp::SRQ_MSGS, o.timeout)
                    .map_err(PingpongError::Exchange)?
            } else {
                let theirs = pp::client_exchange(&mut s, &ours[0], o.timeout)
                    .map_err(PingpongError::Exchange)?;
                pp::send_done(&mut s).map_err(PingpongError::Exchange)?;
                vec![theirs]
            }
        }
    };
    for t in &theirs[..qps.len()] {
        writeln!(out, "  remote address: {}", fmt_dest(t, ","))?;
    }
    out.flush()?;
    if o.host.is_some() {
        for (i, t) in theirs[..qps.len()].iter().enumerate() {
            if let Some(a) = connect(i, t)? {
                ah = Some(a);
            }
        }
    }
    let send = |i: usize| {
        let mut wr = SendWr::new(
            SEND_WRID,
            SendOp::Send,
            vec![Sge {
                addr: mr.addr() + off as u64,
                length: o.size,
                lkey: mr.lkey(),
            }],
        )
        .with_flags(SendFlags::SIGNALED);
        if let Some(ah) = ah {
            wr = wr.with_ud(UdDest {
                ah,
                remote_qpn: QpNumber::new(theirs[i].qpn),
                remote_qkey: UD_QKEY,
            });
        }
        nic.post_send(qps[i], wr)
    };
    // --verify: message k that we send is pattern k; the peer echoes it, so receive k (client)
    // or k+1 (server: receive 0 is the client's initial buffer) must equal it.
    let mut verified = 0u64;
    let mut sent_msgs = 0u64;
    let initial: Vec<u8> = {
        let mut v = vec![fill; size];
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
            let _ = mr.write(off, &p);
        }
    };
    let peer_ip = crate::verbs::ip_of_gid(theirs[0].gid);
    let check_echo = |r: u64| -> Result<(), PingpongError> {
        let (want, what) = if o.host.is_none() && r == 0 {
            (
                initial.clone(),
                format!(
                    "the client's first message ({}'s initial buffer)",
                    ex.program()
                ),
            )
        } else {
            let k = if o.host.is_none() { r - 1 } else { r };
            (
                crate::apps::pattern::expected(size, o.verify_seed, k, true),
                format!("the echo of our message {k}"),
            )
        };
        let got = mr.to_vec();
        if ex == Example::Ud {
            check_grh(&got[..GRH], peer_ip, local, r)?;
        }
        match crate::apps::pattern::first_mismatch(&got[off..off + size], &want) {
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
    // What each QP waits for before it sends again (the examples' `pending`).
    let mut pending = vec![RECV_WRID; qps.len()];
    let t0 = Instant::now();
    if o.host.is_some() {
        for (i, p) in pending.iter_mut().enumerate() {
            fill_next(sent_msgs);
            sent_msgs += 1;
            send(i).map_err(PingpongError::PostSend)?;
            *p |= SEND_WRID;
        }
    }
    // srq_pingpong refills the SRQ when no more than one receive per QP is left.
    let low = if srq.is_some() { num_qp } else { 1 };
    let batch = if srq.is_some() {
        (num_qp + o.rx_depth) as usize
    } else {
        2
    };
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
        nic.poll_cq(cq, &mut wcs, batch)?;
        if wcs.is_empty() {
            let idle = last.elapsed();
            if idle > o.timeout {
                return Err(PingpongError::Stalled {
                    timeout: o.timeout,
                    rcnt,
                    scnt,
                });
            }
            // Busy-poll as the examples do, but only briefly: a thread that spins for ever
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
            let qi = qps
                .iter()
                .position(|q| *q == wc.qp_num)
                .ok_or(PingpongError::UnknownQpn(wc.qp_num.get()))?;
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    // When `low` or fewer are left, post up to rx_depth again.
                    routs = routs.saturating_sub(1);
                    if routs <= low {
                        routs += post_recvs(o.rx_depth - routs);
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
                            let _ = mr.read(off + i, &mut b);
                            if b[0] != 0 {
                                return Err(PingpongError::InvalidData(i / PAGE));
                            }
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(PingpongError::UnknownWrId(other)),
            }
            pending[qi] &= !wc.wr_id;
            if scnt < iters && pending[qi] == 0 {
                fill_next(sent_msgs);
                sent_msgs += 1;
                send(qi).map_err(PingpongError::PostSend)?;
                pending[qi] = RECV_WRID | SEND_WRID;
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
        if ex == Example::Ud {
            writeln!(
                out,
                "verify: ok: every GRH slot holds the IP header of the peer's packet ({peer_ip} -> {local})"
            )?;
        }
    }
    Ok(())
}

/// `--verify` of a UD receive: the GRH slot holds the received packet's IP header, from the
/// peer to us (for IPv4 in its last 20 bytes, as rxe writes it).
fn check_grh(
    slot: &[u8],
    peer: std::net::IpAddr,
    us: std::net::IpAddr,
    r: u64,
) -> Result<(), PingpongError> {
    use crate::wire::grh::GrhSlot;
    use std::net::IpAddr;
    let bad = |why: String| PingpongError::VerifyGrh { r, why };
    match GrhSlot::parse(slot).map_err(|e| bad(format!("not an IP header: {e}")))? {
        GrhSlot::V4 { src, dst, .. } if (IpAddr::V4(src), IpAddr::V4(dst)) == (peer, us) => Ok(()),
        GrhSlot::V6 { src, dst, .. } if (IpAddr::V6(src), IpAddr::V6(dst)) == (peer, us) => Ok(()),
        other => Err(bad(format!("{other:?}, expected {peer} -> {us}"))),
    }
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
        // --bind (issue 17 finding 6): all interfaces unless given; a bad address refused.
        assert_eq!(r.bind, None);
        assert_eq!(
            run(&["--bind", "10.0.0.2"]).bind,
            Some("10.0.0.2".parse().unwrap())
        );
        assert!(parse(Example::Rc, ["--bind", "10.0.0"].iter().copied()).is_err());
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

    fn run_as(ex: Example, args: &[&str]) -> PingpongRun {
        match parse(ex, args.iter().copied()).unwrap() {
            Parsed::Run(r) => *r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_example_s_defaults_and_flags() {
        // ud_pingpong: size 1024 (its usage text says 2048), no -m
        let r = run_as(Example::Ud, &[]);
        assert_eq!((r.size, r.num_qp, r.rx_depth), (1024, 1, 500));
        assert!(parse(Example::Ud, ["-m", "1024"]).is_err());
        // srq_pingpong: 16 QPs, -q, -s of at least 1
        let r = run_as(Example::Srq, &[]);
        assert_eq!((r.size, r.num_qp), (4096, 16));
        assert_eq!(run_as(Example::Srq, &["-q", "0x4"]).num_qp, 4);
        assert!(parse(Example::Srq, ["-s", "0"]).is_err());
        assert!(parse(Example::Rc, ["-q", "2"]).is_err());
        assert!(parse(Example::Uc, ["-q", "2"]).is_err());
        // uc_pingpong's getopt has none of rc's ODP/timestamp/DM flags
        assert!(parse(Example::Uc, ["-t"]).is_err());
        // ferroce pingpong --transport
        assert_eq!(
            run_as(Example::Rc, &["--transport", "ud"]).example,
            Example::Ud
        );
        // --verify with several SRQ QPs sharing one buffer cannot tell echoes apart
        assert!(parse(Example::Srq, ["--verify"]).is_err());
        assert!(run_as(Example::Srq, &["--verify", "-q", "1"]).verify);
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
