//! perftest's command line, read the way perftest 4.5-0.17 reads it (`parser` and
//! `force_dependecies` in perftest_parameters.c): the same short and long options (getopt
//! syntax: `-n5`, `-n 5`, `--iters=5`, `--iters 5`, clustered flags, unambiguous prefixes of
//! long options, the server address anywhere), numbers as C's `strtol(s, &end, 0)` reads them
//! (`0x10`, `010`) with the same range checks and messages, `-s 64K`, and the same defaults per
//! test. Both `ferroce perf TEST ...` and the perftest program names (`ib_write_bw ...`, links
//! to the ferroce binary) come here.
//!
//! ferroce's own options (the packet backend, captures, congestion control, `--verify`) are
//! long options that perftest does not have.
//!
//! What ferroce cannot do is refused with a one-line reason: `-z`, `-R` with UC, dual port,
//! multicast, raw Ethernet, hardware counters, ODP, mmap'd buffers, the rate limiter. `-c UC`
//! (SEND and WRITE) and `-c UD` (SEND, messages up to the MTU) run as perftest allows them,
//! `--use-srq` too (an SRQ on the receiving side).

use super::{Connection, Output, PerfConfig, Test, Verb};
use crate::io::backend::BackendKind;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// A command line perftest (or ferroce) refuses: a usage error (exit status 2).
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// What clap found (an unknown option, a missing value, an invalid choice): its whole
    /// message.
    #[error("{}", .0.render())]
    Clap(#[from] clap::Error),
    /// A value perftest's rules refuse, with perftest's words for why.
    #[error("invalid value '{value}' for '{flag}': {why}")]
    Value {
        /// The option.
        flag: String,
        /// Its value as given.
        value: String,
        /// perftest's reason.
        why: String,
    },
    /// A combination perftest refuses, or something ferroce cannot do.
    #[error("{0}")]
    Other(String),
}

impl ArgsError {
    /// The message without clap's formatting, for tests.
    pub fn text(&self) -> String {
        match self {
            ArgsError::Clap(e) => e.to_string(),
            ArgsError::Value { why, .. } => why.clone(),
            ArgsError::Other(s) => s.clone(),
        }
    }
    /// The exit status: clap's for its errors, 2 for the others.
    pub fn exit_code(&self) -> i32 {
        match self {
            ArgsError::Clap(e) => e.exit_code(),
            _ => 2,
        }
    }
}

fn err<T>(s: impl Into<String>) -> Result<T, ArgsError> {
    Err(ArgsError::Other(s.into()))
}

/// A value `flag` had that perftest refuses.
fn bad(flag: &str, value: &str, why: impl std::fmt::Display) -> ArgsError {
    ArgsError::Value {
        flag: flag.into(),
        value: value.into(),
        why: why.to_string(),
    }
}

/// perftest's `CHECK_VALUE` / `CHECK_VALUE_IN_RANGE` complaints, in its words.
#[derive(Debug, thiserror::Error)]
enum BadNumber {
    #[error("{name} argument {value} should be {ty}")]
    NotA {
        name: &'static str,
        value: String,
        ty: &'static str,
    },
    #[error("{name} should be between {min} and {max}")]
    Range {
        name: &'static str,
        min: i64,
        max: i64,
    },
}

/// The engine's polling (see `tool::Poll`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollArg {
    /// Inline for latency tests (a busy engine thread for a read-lat or atomic-lat server),
    /// adaptive for bandwidth tests.
    Auto,
    /// Spin a while, then sleep until woken.
    Adaptive,
    /// An engine thread that never sleeps.
    Busy,
    /// The test's thread drives the engine.
    Inline,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
/// `--cc`: the congestion control algorithm.
pub enum CcArg {
    /// None: send at line rate.
    None,
    /// DCQCN (the reaction point; CNPs come from the peer).
    Dcqcn,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
/// `--cc-preset`: DCQCN's parameters.
pub enum PresetArg {
    /// The DCQCN paper's.
    Paper,
    /// ConnectX firmware defaults.
    Connectx,
}

/// The options, as clap reads them (values as strings: perftest's own rules convert them).
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
    #[arg(short = 'm', long = "mtu", allow_hyphen_values = true)]
    mtu: Option<String>,
    #[arg(short = 's', long = "size", allow_hyphen_values = true)]
    size: Option<String>,
    #[arg(short = 'n', long = "iters", allow_hyphen_values = true)]
    iters: Option<String>,
    #[arg(short = 't', long = "tx-depth", allow_hyphen_values = true)]
    tx_depth: Option<String>,
    #[arg(short = 'u', long = "qp-timeout", allow_hyphen_values = true)]
    qp_timeout: Option<String>,
    #[arg(short = 'S', long = "sl", allow_hyphen_values = true)]
    sl: Option<String>,
    #[arg(short = 'x', long = "gid-index", allow_hyphen_values = true)]
    gid_index: Option<String>,
    #[arg(short = 'a', long = "all")]
    all: bool,
    #[arg(short = 'F', long = "CPU-freq")]
    cpu_freq: bool,
    #[arg(short = 'c', long = "connection", allow_hyphen_values = true)]
    connection: Option<String>,
    #[arg(short = 'q', long = "qp", allow_hyphen_values = true)]
    qp: Option<String>,
    #[arg(short = 'e', long = "events")]
    events: bool,
    #[arg(short = 'X', long = "vector", allow_hyphen_values = true)]
    vector: Option<String>,
    #[arg(short = 'I', long = "inline_size", allow_hyphen_values = true)]
    inline_size: Option<String>,
    #[arg(short = 'o', long = "outs", allow_hyphen_values = true)]
    outs: Option<String>,
    #[arg(short = 'g', long = "mcg")]
    mcg: bool,
    #[arg(short = 'z', long = "com_rdma_cm", alias = "comm_rdma_cm")]
    comm_rdma_cm: bool,
    #[arg(short = 'R', long = "rdma_cm")]
    rdma_cm: bool,
    #[arg(short = 'T', long = "tos", allow_hyphen_values = true)]
    tos: Option<String>,
    #[arg(short = 'L', long = "hop_limit", allow_hyphen_values = true)]
    hop_limit: Option<String>,
    #[arg(short = 'h', long = "help")]
    help: bool,
    #[arg(short = 'M', long = "MGID", allow_hyphen_values = true)]
    mgid: Option<String>,
    #[arg(short = 'r', long = "rx-depth", allow_hyphen_values = true)]
    rx_depth: Option<String>,
    #[arg(short = 'b', long = "bidirectional")]
    bidirectional: bool,
    #[arg(short = 'Q', long = "cq-mod", allow_hyphen_values = true)]
    cq_mod: Option<String>,
    #[arg(short = 'N', long = "noPeak")]
    no_peak: bool,
    #[arg(short = 'V', long = "version")]
    version: bool,
    #[arg(short = 'C', long = "report-cycles")]
    report_cycles: bool,
    #[arg(short = 'H', long = "report-histogrm")]
    histogram: bool,
    #[arg(short = 'U', long = "report-unsorted")]
    unsorted: bool,
    #[arg(short = 'A', long = "atomic_type", allow_hyphen_values = true)]
    atomic_type: Option<String>,
    #[arg(short = 'O', long = "dualport")]
    dualport: bool,
    #[arg(short = 'l', long = "post_list", allow_hyphen_values = true)]
    post_list: Option<String>,
    #[arg(short = 'D', long = "duration", allow_hyphen_values = true)]
    duration: Option<String>,
    #[arg(short = 'f', long = "margin", allow_hyphen_values = true)]
    margin: Option<String>,
    #[arg(short = 'w', long = "limit_bw", allow_hyphen_values = true)]
    limit_bw: Option<String>,
    #[arg(short = 'y', long = "limit_msgrate", allow_hyphen_values = true)]
    limit_msgrate: Option<String>,
    #[arg(short = 'W', long = "report-counters", allow_hyphen_values = true)]
    report_counters: Option<String>,
    // Raw Ethernet (raw_ethernet_bw's): refused.
    #[arg(short = 'B', long = "source_mac")]
    source_mac: Option<String>,
    #[arg(short = 'E', long = "dest_mac")]
    dest_mac: Option<String>,
    #[arg(short = 'J', long = "dest_ip")]
    dest_ip: Option<String>,
    // perftest's table lists `source_ip` twice; getopt takes the first, the raw Ethernet one.
    #[arg(short = 'j', long = "source_ip")]
    source_ip_raw: Option<String>,
    #[arg(short = 'K', long = "dest_port")]
    dest_port: Option<String>,
    #[arg(short = 'k', long = "source_port")]
    source_port: Option<String>,
    #[arg(short = 'Y', long = "ethertype")]
    ethertype: Option<String>,
    #[arg(short = 'Z', long = "server")]
    server: bool,
    #[arg(short = 'P', long = "client")]
    client: bool,
    #[arg(short = 'v', long = "mac_fwd")]
    mac_fwd: bool,
    #[arg(short = 'G', long = "use_rss")]
    use_rss: bool,
    #[arg(long = "remote_mac")]
    remote_mac: Option<String>,
    #[arg(long = "local_mac")]
    local_mac: Option<String>,
    #[arg(long = "remote_ip")]
    remote_ip: Option<String>,
    #[arg(long = "local_ip")]
    local_ip: Option<String>,
    #[arg(long = "remote_port")]
    remote_port: Option<String>,
    #[arg(long = "local_port")]
    local_port: Option<String>,
    #[arg(long = "tcp")]
    tcp: bool,
    #[arg(long = "flows")]
    flows: Option<String>,
    #[arg(long = "flows_burst")]
    flows_burst: Option<String>,
    #[arg(long = "reply_every")]
    reply_every: Option<String>,
    #[arg(long = "promiscuous")]
    promiscuous: bool,
    #[arg(long = "raw_mcast")]
    raw_mcast: bool,
    #[arg(long = "vlan_en")]
    vlan_en: bool,
    #[arg(long = "vlan_pcp")]
    vlan_pcp: Option<String>,
    #[arg(long = "raw_ipv6")]
    raw_ipv6: bool,
    #[arg(long = "flow_label")]
    flow_label: Option<String>,
    // Long-only options.
    #[arg(long = "force-link")]
    force_link: Option<String>,
    #[arg(long = "run_infinitely")]
    run_infinitely: bool,
    #[arg(long = "report_gbits", alias = "report-gbits")]
    report_gbits: bool,
    #[arg(long = "use-srq", alias = "use_srq")]
    use_srq: bool,
    #[arg(long = "report-both")]
    report_both: bool,
    #[arg(long = "reversed")]
    reversed: bool,
    #[arg(long = "pkey_index", allow_hyphen_values = true)]
    pkey_index: Option<String>,
    #[arg(long = "inline_recv", allow_hyphen_values = true)]
    inline_recv: Option<String>,
    #[arg(long = "burst_size")]
    burst_size: Option<String>,
    #[arg(long = "typical_pkt_size")]
    typical_pkt_size: Option<String>,
    #[arg(long = "rate_limit")]
    rate_limit: Option<String>,
    #[arg(long = "rate_limit_type")]
    rate_limit_type: Option<String>,
    #[arg(long = "rate_units")]
    rate_units: Option<String>,
    #[arg(long = "output")]
    output: Option<String>,
    #[arg(long = "cpu_util")]
    cpu_util: bool,
    #[arg(long = "out_json")]
    out_json: bool,
    #[arg(long = "out_json_file")]
    out_json_file: Option<PathBuf>,
    #[arg(long = "latency_gap", allow_hyphen_values = true)]
    latency_gap: Option<String>,
    #[arg(long = "retry_count", allow_hyphen_values = true)]
    retry_count: Option<String>,
    #[arg(long = "dont_xchg_versions")]
    dont_xchg_versions: bool,
    #[arg(long = "mmap")]
    mmap: Option<String>,
    #[arg(long = "mmap-offset")]
    mmap_offset: Option<String>,
    #[arg(long = "ipv6")]
    ipv6: bool,
    #[arg(long = "report-per-port")]
    report_per_port: bool,
    #[arg(long = "odp")]
    odp: bool,
    #[arg(long = "use_hugepages")]
    use_hugepages: bool,
    #[arg(long = "use_old_post_send")]
    use_old_post_send: bool,
    #[arg(long = "mr_per_qp")]
    mr_per_qp: bool,
    #[arg(long = "dlid", allow_hyphen_values = true)]
    dlid: Option<String>,
    #[arg(long = "tclass", allow_hyphen_values = true)]
    tclass: Option<String>,
    #[arg(long = "wait_destroy", allow_hyphen_values = true)]
    wait_destroy: Option<String>,
    #[arg(long = "perform_warm_up")]
    perform_warm_up: bool,
    #[arg(long = "recv_post_list", allow_hyphen_values = true)]
    recv_post_list: Option<String>,
    /// The server's address (client role); none: the server role.
    #[arg(value_parser = crate::apps::addr::check_host)]
    hosts: Vec<String>,
    #[command(flatten)]
    fx: FerroceCli,
}

/// ferroce's own options (long only).
#[derive(clap::Args, Debug)]
struct FerroceCli {
    /// Packet backend (default: $FERROCE_BACKEND, else xdp).
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    /// Write every frame sent and received to this pcap file.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// The engine's polling.
    #[arg(long, value_enum, default_value = "auto")]
    poll: PollArg,
    /// Same as --poll busy.
    #[arg(long)]
    busy: bool,
    /// One JSON object with the results and counters (instead of perftest's text).
    #[arg(long)]
    json: bool,
    /// Seconds to wait for the peer at each step, and the longest a run may stall.
    #[arg(long, allow_hyphen_values = true)]
    timeout: Option<String>,
    #[arg(long, value_enum, default_value = "none")]
    cc: CcArg,
    #[arg(long = "cc-preset", value_enum, default_value = "paper")]
    cc_preset: PresetArg,
    #[arg(long = "line-gbps", default_value = "10", allow_hyphen_values = true)]
    line_gbps: String,
    #[arg(
        long = "cc-time-scale",
        default_value = "1",
        allow_hyphen_values = true
    )]
    cc_time_scale: String,
    #[arg(long = "dcqcn", value_name = "KEY=VALUE")]
    dcqcn: Vec<String>,
    #[arg(long = "cc-csv")]
    cc_csv: Option<PathBuf>,
    #[arg(
        long = "cc-sample-ms",
        default_value_t = 10.0,
        allow_hyphen_values = true
    )]
    cc_sample_ms: f64,
    #[arg(long = "cnp-interval-us", default_value_t = 4)]
    cnp_interval_us: u64,
    #[arg(long = "ack-delay-us", value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    ack_delay_us: Option<u64>,
    /// Fast loss recovery (DeviceConfig::fast_recovery): probe timeout, adaptive window.
    #[arg(long = "fast-recovery")]
    fast_recovery: bool,
    /// Selective repeat (DeviceConfig::selective_repeat; the peer must have it too).
    #[arg(long = "selective-repeat")]
    selective_repeat: bool,
    /// The RC go-back-N window in packets (DeviceConfig::max_inflight).
    #[arg(long = "max-inflight", value_parser = clap::value_parser!(u32).range(1..=8_388_607))]
    max_inflight: Option<u32>,
    /// Check payloads byte for byte (see docs/interop-rxe.md).
    #[arg(long)]
    verify: bool,
    #[arg(long = "verify-seed", default_value_t = 0x5eed)]
    verify_seed: u64,
    /// Print no progress lines on standard error.
    #[arg(long = "no-progress")]
    no_progress: bool,
    /// Server: listen on this address only (default: all interfaces).
    #[arg(long)]
    bind: Option<std::net::IpAddr>,
}

/// A parsed command line: the test parameters and everything about where and how to run it.
#[derive(Clone, Debug)]
pub struct Invocation {
    /// The test parameters.
    pub cfg: PerfConfig,
    /// The server (client role), or none (server role).
    pub host: Option<String>,
    /// The out-of-band TCP port (`-p`).
    pub port: u16,
    /// `--bind`: the server listens on this address only (default: all interfaces).
    pub bind: Option<std::net::IpAddr>,
    /// `-d`: a network interface, or `ferroce_<interface>` as `ferroce devinfo` names it.
    pub dev: Option<String>,
    /// `-x` if given.
    pub gid_index: Option<u8>,
    /// `--ipv6`: prefer an IPv6 GID.
    pub ipv6: bool,
    /// `-m` as given (0: the port's active MTU).
    pub mtu: i64,
    /// `--wait_destroy`: seconds to wait before releasing the resources.
    pub wait_destroy: u32,
    /// Lines perftest prints on standard output while it reads its options.
    pub notices: Vec<String>,
    /// Lines perftest prints on standard error while it reads its options.
    pub warnings: Vec<String>,
    /// `--backend`: the packet backend.
    pub backend: BackendKind,
    /// `--pcap`: write every frame to this file.
    pub pcap: Option<PathBuf>,
    /// `--poll`: how the engine polls.
    pub poll: PollArg,
    /// `--busy`: same as `--poll busy`.
    pub busy: bool,
    /// `--json`: one JSON object instead of perftest's text.
    pub json: bool,
    /// `--cc`, `--cc-preset`, `--dcqcn`, `--cc-time-scale`: the congestion control.
    pub cc: crate::cc::CcConfig,
    /// `--line-gbps`: the port's line rate (DCQCN's highest rate).
    pub line_gbps: f64,
    /// `--cc-csv`: write the congestion control's samples here.
    pub cc_csv: Option<PathBuf>,
    /// `--cc-sample-ms`: the sampling interval of `--cc-csv`.
    pub cc_sample: Duration,
    /// `--cnp-interval-us`: at most one CNP per QP per this interval (0: no CNPs).
    pub cnp_interval_us: u64,
    /// `--ack-delay-us`: hold an ACK this long for coalescing (default: 20 for latency
    /// tests, 0 for bandwidth tests).
    pub ack_delay_us: Option<u64>,
    /// `--fast-recovery`: probe timeout and adaptive window.
    pub fast_recovery: bool,
    /// `--selective-repeat`: retransmit only what was lost (the peer must have it too).
    pub selective_repeat: bool,
    /// `--max-inflight`: the go-back-N window in packets.
    pub max_inflight: Option<u32>,
}

/// What a command line asks for.
#[derive(Debug)]
pub enum Parsed {
    /// Run the test.
    Run(Box<Invocation>),
    /// `-h`: the text to print.
    Help(String),
    /// `-V`: the text to print.
    Version(String),
}

/// C's `strtol(s, &end, 0)`: the value and the unparsed rest (leading white space and a sign
/// allowed; `0x` hex, `0` octal; saturating at the limits of `long`).
pub fn strtol(s: &str) -> (i64, &str) {
    let t = s.trim_start();
    let b = t.as_bytes();
    let mut i = 0;
    let neg = match b.first() {
        Some(b'-') => {
            i = 1;
            true
        }
        Some(b'+') => {
            i = 1;
            false
        }
        _ => false,
    };
    let (radix, start) = if b.len() > i + 1
        && b[i] == b'0'
        && (b[i + 1] | 0x20) == b'x'
        && b.get(i + 2).is_some_and(|c| c.is_ascii_hexdigit())
    {
        (16, i + 2)
    } else if b.get(i) == Some(&b'0') {
        (8, i)
    } else {
        (10, i)
    };
    let mut v: i128 = 0;
    let mut j = start;
    while j < b.len() {
        let Some(d) = (b[j] as char).to_digit(radix) else {
            break;
        };
        v = (v * i128::from(radix) + i128::from(d)).min(i128::from(i64::MAX) + 1);
        j += 1;
    }
    if j == start && radix != 8 {
        return (0, s);
    }
    let v = if neg { -v } else { v };
    let v = v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
    (v, &t[j..])
}

/// perftest's `CHECK_VALUE`: the whole argument must be a number.
fn check_value(s: &str, name: &'static str, ty: &'static str) -> Result<i64, BadNumber> {
    let (v, rest) = strtol(s);
    if !rest.is_empty() || s.trim().is_empty() {
        return Err(BadNumber::NotA {
            name,
            value: s.into(),
            ty,
        });
    }
    Ok(v)
}

/// `(int)` of a C long.
fn as_int(v: i64) -> i64 {
    i64::from(v as i32)
}

/// `CHECK_VALUE_IN_RANGE` for an int.
fn int_in_range(s: &str, name: &'static str, min: i64, max: i64) -> Result<i64, BadNumber> {
    let v = as_int(check_value(s, name, "int")?);
    if v < min || v > max {
        return Err(BadNumber::Range { name, min, max });
    }
    Ok(v)
}

/// The test perftest runs under this program name (`ib_write_bw`, a path to it, ...).
pub fn test_of_program(argv0: &str) -> Option<Test> {
    let base = std::path::Path::new(argv0)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(argv0);
    base.strip_prefix("ib_").and_then(Test::from_name)
}

/// The usage text (`-h`).
pub fn usage(program: &str, test: Test) -> String {
    let bw = test.is_bw();
    let verb = test.verb();
    let mut s = format!(
        "Usage:\n  {program}            start a server and wait for connection\n  {program} <host>     connect to server at <host>\n\nOptions (perftest's; ferroce runs RC queue pairs over RoCE v2):\n"
    );
    let mut o = |line: &str| {
        s.push_str("  ");
        s.push_str(line);
        s.push('\n');
    };
    o("-a, --all  Run sizes from 2 till 2^23");
    if verb == Verb::Atomic {
        o("-A, --atomic_type=<type>  Type of atomic operation from {CMP_AND_SWAP,FETCH_AND_ADD} (default FETCH_AND_ADD)");
    }
    if bw {
        o("-b, --bidirectional  Measure bidirectional bandwidth (default unidirectional)");
    }
    o("-c, --connection=<RC/UC/UD>  Connection type RC/UC/UD (default RC)");
    o("-d, --ib-dev=<dev>  Use IB device <dev>: a network interface or ferroce_<interface> (default first device found)");
    o("-D, --duration  Run test for a customized period of seconds");
    if verb != Verb::Write {
        o("-e, --events  Sleep on CQ events (default poll)");
    }
    o("-f, --margin  measure results within margins (default=2sec)");
    o("-F, --CPU-freq  Do not show a warning even if cpufreq_ondemand module is loaded");
    o("-h, --help  Show this help screen");
    if !bw {
        o("-H, --report-histogrm  Print out all results (default print summary only)");
    }
    o("-i, --ib-port=<port>  Use port <port> of IB device (default 1)");
    if !matches!(verb, Verb::Read | Verb::Atomic) {
        o("-I, --inline_size=<size>  Max size of message to be sent in inline");
    }
    if bw {
        o("-l, --post_list=<list size>  Post list of send WQEs of <list size> size (instead of single post)");
        o("    --recv_post_list=<list size>  Post list of receive WQEs of <list size> size");
    }
    o("-m, --mtu=<mtu>  MTU size : 256 - 4096 (default port mtu)");
    o(&format!(
        "-n, --iters=<iters>  Number of exchanges (at least 5, default {})",
        if test == Test::WriteBw { 5000 } else { 1000 }
    ));
    if bw {
        o("-N, --noPeak  Cancel peak-bw calculation (default with peak up to iters=20000)");
    }
    if matches!(verb, Verb::Read | Verb::Atomic) {
        o("-o, --outs=<num>  num of outstanding read/atom(default max of device)");
    }
    o("-p, --port=<port>  Listen on/connect to port <port> (default 18515)");
    if bw {
        o("-q, --qp=<num of qp's>  Num of qp's(default 1)");
        o("-Q, --cq-mod  Generate Cqe only after <--cq-mod> completion");
    }
    if verb == Verb::Send {
        o("-r, --rx-depth=<dep>  Rx queue size (default 512)");
    }
    if verb != Verb::Atomic {
        o(&format!(
            "-s, --size=<size>  Size of message to exchange (default {})",
            if bw { 65536 } else { 2 }
        ));
    }
    o("-S, --sl=<sl>  SL (default 0)");
    if bw {
        o("-t, --tx-depth=<dep>  Size of tx queue (default 128)");
    }
    o("-u, --qp-timeout=<timeout>  QP timeout, timeout value is 4 usec * 2 ^(timeout), default 14");
    if !bw {
        o("-U, --report-unsorted  (implies -H) print out unsorted results (default sorted)");
    }
    o("-V, --version  Display version number");
    if bw {
        o("-w, --limit_bw=<value>  Set verifier limit for bandwidth");
    }
    o("-x, --gid-index=<index>  Test uses GID with GID index (default: the first IPv4 GID)");
    if bw {
        o("-y, --limit_msgrate=<value>  Set verifier limit for Msg Rate");
    }
    o("    --out_json  Save the report in a json file");
    o("    --out_json_file=<file>  Name of the report json file. (Default: perftest_out.json in the working directory)");
    o("    --ipv6  Use IPv6 GID. Default is IPv4");
    if !bw {
        o("    --latency_gap=<delay_time>  delay time between each post send");
    }
    if bw {
        o("    --mr_per_qp  Create memory region for each qp.");
        o("    --report-both  Report RX & TX results separately on Bidirectional BW tests");
        o("    --report_gbits  Report Max/Average BW of test in Gbit/sec (instead of MiB/sec)");
        o("    --reversed  Reverse traffic direction - Server send to client");
        o("    --run_infinitely  Run test forever, print results every <duration> seconds");
        o("    --wait_destroy=<seconds>  Wait <seconds> before destroying allocated resources");
    }
    if verb == Verb::Send {
        o("    --use-srq  Use a Shared Receive Queue. --rx-depth controls max-wr size of the SRQ");
    }
    o("    --output=<units>  Set verbosity output level: bandwidth , message_rate, latency");
    o("    --perform_warm_up  Perform some iterations before start measuring");
    o("    --tclass=<value>  Set the Traffic Class in GRH");
    s.push_str("\nferroce's own options:\n");
    s.push_str(
        "      --backend xdp|packet|udp   packet backend (default $FERROCE_BACKEND, else xdp)\n",
    );
    s.push_str("      --pcap FILE                 capture every frame sent and received\n");
    s.push_str("      --poll auto|adaptive|busy|inline, --busy\n");
    s.push_str("      --json                      one JSON object with results and counters\n");
    s.push_str("      --timeout S                 wait at most S s for each message of the peer (default 20)\n");
    s.push_str(
        "      --bind ADDR                 server: listen on ADDR only (default: all interfaces)\n",
    );
    s.push_str(
        "      --verify [--verify-seed N]  check every byte of the data (docs/interop-rxe.md)\n",
    );
    s.push_str(
        "      --cc none|dcqcn [--cc-preset paper|connectx] [--dcqcn K=V] [--line-gbps G]\n",
    );
    s.push_str(
        "      --cc-csv FILE [--cc-sample-ms MS] [--cc-time-scale F] [--cnp-interval-us US]\n",
    );
    s.push_str("      --ack-delay-us US           delayed ACK (default 20 for latency tests)\n");
    s.push_str("      --fast-recovery             RC loss recovery: probe timeout from measured RTTs, adaptive go-back-N window\n");
    s.push_str("      --selective-repeat          RC selective repeat with a ferroce peer that has it too (implies --fast-recovery)\n");
    s.push_str("      --max-inflight N            RC window: most unacknowledged packets per QP (default 256)\n");
    s
}

/// Read a perftest command line for `test` (`args` without the program name).
pub fn parse<I, T>(test: Test, program: &str, args: I) -> Result<Parsed, ArgsError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    parse_as(test, program, false, args)
}

/// [`parse`], for `ferroce perf TEST` (`dev_required`: ferroce's own command wants `-d`;
/// perftest's programs take the first device without it).
pub fn parse_as<I, T>(
    test: Test,
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
    let cli = Cli::from_arg_matches(&m)?;
    if cli.help {
        return Ok(Parsed::Help(usage(program, test)));
    }
    if cli.version {
        return Ok(Parsed::Version(format!(
            "Version: {}",
            crate::oob::perftest::VERSION
        )));
    }
    from_cli(test, cli).map(|i| Parsed::Run(Box::new(i)))
}

fn refuse(what: &str) -> Result<Invocation, ArgsError> {
    err(format!("{what} is not supported by ferroce"))
}

fn from_cli(test: Test, c: Cli) -> Result<Invocation, ArgsError> {
    let verb = test.verb();
    let bw = test.is_bw();
    let mut cfg = PerfConfig::for_test(test);
    let mut notices = Vec::new();
    let mut warnings = Vec::new();
    let mut port = 18515u16;
    if let Some(s) = &c.port {
        // perftest stores an int and connects with it as a service name.
        let v = as_int(check_value(s, "Port", "int").map_err(|w| bad("-p", s, w))?);
        port = u16::try_from(v)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| bad("-p", s, format!("Port {v} is not a TCP port (1 to 65535)")))?;
    }
    if let Some(s) = &c.ib_port {
        let v = check_value(s, "IB Port", "uint8_t").map_err(|w| bad("-i", s, w))? as u8;
        if v < 1 {
            return Err(bad("-i", s, "IB Port can't be less than 1"));
        }
        if v != 1 {
            return Err(bad(
                "-i",
                s,
                format!("Unable to query port {v} attributes: ferroce devices have one port"),
            ));
        }
    }
    let mut mtu = 0i64;
    if let Some(s) = &c.mtu {
        mtu = as_int(check_value(s, "MTU", "int").map_err(|w| bad("-m", s, w))?);
    }
    if let Some(s) = &c.iters {
        cfg.iters =
            int_in_range(s, "Iteration num", 5, 100_000_000).map_err(|w| bad("-n", s, w))? as u64;
    }
    if let Some(s) = &c.tx_depth {
        cfg.tx_depth = int_in_range(s, "Tx depth", 1, 15000).map_err(|w| bad("-t", s, w))? as u32;
    }
    if let Some(s) = &c.tos {
        int_in_range(s, "TOS", 0, 255).map_err(|w| bad("-T", s, w))?;
    }
    if let Some(s) = &c.hop_limit {
        int_in_range(s, "Hop Limit", 0, 255).map_err(|w| bad("-L", s, w))?;
    }
    if let Some(s) = &c.qp_timeout {
        cfg.qp_timeout =
            check_value(s, "QP Timeout", "uint8_t").map_err(|w| bad("-u", s, w))? as u8;
        if cfg.qp_timeout > 31 {
            // The attribute has 5 bits; perftest passes the byte on and ibv_modify_qp fails.
            return Err(bad(
                "-u",
                s,
                format!(
                    "Failed to modify QP to RTS: timeout {} is above 31",
                    cfg.qp_timeout
                ),
            ));
        }
    }
    if let Some(s) = &c.sl {
        let v = check_value(s, "Service Level", "uint8_t").map_err(|w| bad("-S", s, w))? as u8;
        if v > 15 {
            return Err(bad("-S", s, " Only 15 Service levels".trim()));
        }
        // RoCE carries no service level; perftest's value only reaches the address vector.
    }
    let mut gid_index = None;
    if let Some(s) = &c.gid_index {
        let v = check_value(s, "Gid index", "uint8_t").map_err(|w| bad("-x", s, w))? as u8;
        if v > 64 {
            return Err(bad("-x", s, "Gid index should be between 0 and 64"));
        }
        gid_index = Some(v);
    }
    if c.all {
        cfg.all_sizes = true;
    }
    if let Some(s) = &c.connection {
        cfg.connection = match s.as_str() {
            "RC" => Connection::Rc,
            "UC" => {
                if matches!(verb, Verb::Read | Verb::Atomic) {
                    return Err(bad(
                        "-c",
                        s,
                        "UC connection not possible in READ/ATOMIC verbs",
                    ));
                }
                Connection::Uc
            }
            "UD" => {
                if verb != Verb::Send {
                    return Err(bad("-c", s, "UD connection only possible in SEND verb"));
                }
                Connection::Ud
            }
            "RawEth" => return refuse("RawEth (raw_ethernet_bw's connection type)"),
            "XRC" => Connection::Xrc,
            "DC" => Connection::Dc,
            "SRD" => {
                if !matches!(verb, Verb::Send | Verb::Read) {
                    return Err(bad(
                        "-c",
                        s,
                        "SRD connection only possible in SEND/READ verbs",
                    ));
                }
                Connection::Srd
            }
            _ => {
                return Err(bad(
                    "-c",
                    s,
                    "Invalid Connection type. Please choose from {RC,UC,UD,XRC,DC,SRD}",
                ))
            }
        };
    }
    if let Some(s) = &c.qp {
        if !bw {
            return Err(bad("-q", s, "Multiple QPs only available on bw tests"));
        }
        cfg.qps = int_in_range(s, "num of Qps", 1, 16384).map_err(|w| bad("-q", s, w))? as u32;
    }
    if let Some(s) = &c.inline_size {
        cfg.inline_size =
            int_in_range(s, "Max inline", 0, 912).map_err(|w| bad("-I", s, w))? as u32;
        if matches!(verb, Verb::Read | Verb::Atomic) {
            return Err(bad(
                "-I",
                s,
                "Inline feature not available on READ/Atomic verbs",
            ));
        }
    }
    if let Some(s) = &c.outs {
        let v = as_int(check_value(s, "Outstanding Reads", "int").map_err(|w| bad("-o", s, w))?);
        if !matches!(verb, Verb::Read | Verb::Atomic) {
            return Err(bad(
                "-o",
                s,
                "Setting Outstanding reads only available on READ verb",
            ));
        }
        cfg.out_reads = if v <= 0 {
            0
        } else if v > i64::from(super::MAX_OUT_READS) {
            notices.push(super::report::RESULT_LINE.to_string());
            warnings.push(format!(
                " Number of outstanding reads is above max = {}\n Changing to that max value",
                super::MAX_OUT_READS
            ));
            super::MAX_OUT_READS
        } else {
            v as u16
        };
    }
    if let Some(s) = &c.rx_depth {
        cfg.rx_depth = int_in_range(s, " Rx depth", 1, 16384).map_err(|w| bad("-r", s, w))? as u32;
        if verb != Verb::Send && cfg.rx_depth > 1 {
            return Err(bad("-r", s, "On RDMA verbs rx depth can be only 1"));
        }
    }
    if let Some(s) = &c.cq_mod {
        cfg.cq_mod = int_in_range(s, "CQ moderation", 1, 1024).map_err(|w| bad("-Q", s, w))? as u32;
        cfg.req_cq_mod = true;
    }
    if let Some(s) = &c.atomic_type {
        if verb != Verb::Atomic {
            return Err(bad("-A", s, "You are not running the atomic_lat/bw test! To change the atomic action type, you must run one of the atomic tests"));
        }
        cfg.cmp_swap = match s.as_str() {
            "CMP_AND_SWAP" => true,
            "FETCH_AND_ADD" => false,
            _ => {
                return Err(bad(
                    "-A",
                    s,
                    "Invalid Atomic type! please choose from {CMP_AND_SWAP,FETCH_AND_ADD}",
                ))
            }
        };
    }
    if let Some(s) = &c.post_list {
        cfg.post_list =
            as_int(check_value(s, "Send Post List size", "int").map_err(|w| bad("-l", s, w))?)
                .max(0) as u32;
    }
    if let Some(s) = &c.duration {
        let v = as_int(check_value(s, "Duration period", "int").map_err(|w| bad("-D", s, w))?);
        if v <= 0 {
            return Err(bad("-D", s, "Duration period must be positive"));
        }
        cfg.duration = Some(Duration::from_secs(v as u64));
    }
    if let Some(s) = &c.margin {
        let v = as_int(check_value(s, "Margin", "int").map_err(|w| bad("-f", s, w))?);
        if v < 0 {
            return Err(bad("-f", s, "Margin must be non-negative"));
        }
        cfg.margin = Some(v as u32);
    }
    if let Some(s) = &c.size {
        // perftest: a K or M suffix, then strtol with no check of the rest.
        let (body, factor) = match s.strip_suffix('K') {
            Some(b) => (b, 1024i64),
            None => match s.strip_suffix('M') {
                Some(b) => (b, 1 << 20),
                None => (s.as_str(), 1),
            },
        };
        let v = strtol(body).0.saturating_mul(factor);
        if v < 1 || v > i64::from(u32::MAX / 2) {
            return Err(bad(
                "-s",
                s,
                format!("Message Size should be between 1 and {}", u32::MAX / 2),
            ));
        }
        cfg.size = v as u32;
        if verb == Verb::Atomic && cfg.size != 8 {
            return Err(bad(
                "-s",
                s,
                "Message size cannot be changed for Atomic tests",
            ));
        }
    }
    if c.events {
        if verb == Verb::Write {
            return err("Events feature not available on WRITE verb");
        }
        cfg.use_event = true;
    }
    if let Some(s) = &c.vector {
        if verb == Verb::Write {
            return Err(bad("-X", s, "Events feature not available on WRITE verb"));
        }
        int_in_range(s, "EQN", 0, 2048).map_err(|w| bad("-X", s, w))?;
        if !c.events {
            return Err(bad(
                "-X",
                s,
                "Events must be enabled to select a completion vector",
            ));
        }
    }
    if c.bidirectional {
        if !bw {
            return err("Bidirectional is only available in BW test");
        }
        cfg.duplex = true;
    }
    if c.no_peak {
        if !bw {
            return err("NoPeak only valid for BW tests");
        }
        cfg.no_peak = true;
    }
    if c.report_cycles {
        if bw {
            return err("Available only on Latency tests");
        }
        return refuse("-C (results in CPU cycles: ferroce measures with the monotonic clock)");
    }
    if c.histogram {
        if bw {
            return err("Available only on Latency tests");
        }
        cfg.histogram = true;
    }
    if c.unsorted {
        if bw {
            return err("is Available only on Latency tests");
        }
        cfg.unsorted = true;
    }
    if c.mcg {
        if verb != Verb::Send {
            return err("MultiCast feature only available on SEND verb");
        }
        return refuse("-g (multicast)");
    }
    if c.mgid.is_some() {
        return refuse("-M (multicast)");
    }
    if let Some(s) = &c.limit_bw {
        let v = s.trim().parse::<f64>().unwrap_or(0.0);
        if v < 0.0 {
            return Err(bad("-w", s, "Invalid Minimum BW Limit"));
        }
        cfg.limit_bw = Some(v);
    }
    if let Some(s) = &c.limit_msgrate {
        let v = s.trim().parse::<f64>().unwrap_or(0.0);
        if v < 0.0 {
            return Err(bad("-y", s, "Invalid Minimum msgRate Limit"));
        }
        cfg.limit_msgrate = Some(v);
    }
    if c.comm_rdma_cm {
        cfg.exchange_rdma_cm = true;
    }
    if c.rdma_cm {
        cfg.exchange_rdma_cm = true;
        if cfg.connection == Connection::Uc {
            return refuse("-R with -c UC (rdma_cm connects RC QPs, and UD ones over SIDR)");
        }
        cfg.rdma_cm = true;
    }
    if c.dualport {
        return refuse("-O (dual-port: ferroce devices have one port)");
    }
    if c.report_counters.is_some() {
        return refuse("-W (performance counters)");
    }
    let raw = c.source_mac.is_some()
        || c.dest_mac.is_some()
        || c.dest_ip.is_some()
        || c.source_ip_raw.is_some()
        || c.dest_port.is_some()
        || c.source_port.is_some()
        || c.ethertype.is_some()
        || c.server
        || c.client
        || c.mac_fwd
        || c.use_rss
        || c.remote_mac.is_some()
        || c.local_mac.is_some()
        || c.remote_ip.is_some()
        || c.local_ip.is_some()
        || c.remote_port.is_some()
        || c.local_port.is_some()
        || c.tcp
        || c.flows.is_some()
        || c.flows_burst.is_some()
        || c.reply_every.is_some()
        || c.promiscuous
        || c.raw_mcast
        || c.vlan_en
        || c.vlan_pcp.is_some()
        || c.raw_ipv6
        || c.flow_label.is_some();
    if raw {
        return refuse("raw Ethernet options (raw_ethernet_bw's)");
    }
    if let Some(s) = &c.force_link {
        if s.len() >= 2 && s[..2].eq_ignore_ascii_case("IB") {
            return refuse("--force-link=IB (ferroce ports are Ethernet: RoCE)");
        }
        if !(s.len() >= 8 && s[..8].eq_ignore_ascii_case("Ethernet")) {
            return Err(bad(
                "--force-link",
                s,
                "Invalid link layer value should be IB or ETHERNET.",
            ));
        }
    }
    cfg.run_infinitely = c.run_infinitely;
    cfg.report_gbits = c.report_gbits;
    cfg.use_srq = c.use_srq;
    cfg.report_both = c.report_both;
    cfg.reversed = c.reversed;
    if let Some(s) = &c.pkey_index {
        let v = as_int(check_value(s, "Pkey index", "int").map_err(|w| bad("--pkey_index", s, w))?);
        if v > 0 {
            notices.push(super::report::RESULT_LINE.to_string());
            warnings.push(format!(
                " Specified PKey Index, {v}, greater than allowed max, 0\n Changing to 0"
            ));
        }
    }
    if let Some(s) = &c.inline_recv {
        // A receive-inlining hint to mlx5; nothing to do here.
        check_value(s, "Inline Receive size", "int").map_err(|w| bad("--inline_recv", s, w))?;
    }
    if c.burst_size.is_some()
        || c.typical_pkt_size.is_some()
        || c.rate_limit.is_some()
        || c.rate_limit_type.is_some()
        || c.rate_units.is_some()
    {
        return refuse("the rate limiter (--rate_limit, --burst_size, --rate_units, ...)");
    }
    if let Some(s) = &c.output {
        cfg.output = match s.as_str() {
            "bandwidth" => Output::Bandwidth,
            "message_rate" => Output::MessageRate,
            "latency" => Output::Latency,
            _ => return Err(bad(
                "--output",
                s,
                "Invalid verbosity level output flag. Please use bandwidth, latency, message_rate",
            )),
        };
    }
    if c.cpu_util {
        return refuse("--cpu_util");
    }
    if c.out_json || c.out_json_file.is_some() {
        // perftest writes the file only with --out_json; --out_json_file names it.
        if c.out_json {
            cfg.out_json = Some(
                c.out_json_file
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("perftest_out.json")),
            );
        }
    }
    if let Some(s) = &c.latency_gap {
        let v = as_int(
            check_value(s, "Latency gap time", "int").map_err(|w| bad("--latency_gap", s, w))?,
        );
        if v < 0 {
            return Err(bad(
                "--latency_gap",
                s,
                "Latency gap time must be non-negative",
            ));
        }
        cfg.latency_gap = v as u32;
    }
    if let Some(s) = &c.retry_count {
        // Only rdma_cm uses it.
        let v =
            as_int(check_value(s, "Retry Count", "int").map_err(|w| bad("--retry_count", s, w))?);
        if v < 0 {
            return Err(bad("--retry_count", s, "Retry Count must be non-negative"));
        }
        cfg.retry_count = v.min(7) as u8;
    }
    if c.dont_xchg_versions {
        // perftest 6.06 then sees version "" from the peer and stops (atof("") < 5.70).
        return err("Current implementation is not compatible with versions older than 5.70");
    }
    if c.mmap.is_some() || c.mmap_offset.is_some() {
        return refuse("--mmap");
    }
    if c.report_per_port {
        return err("report per port feature work only with Duration and Dualport");
    }
    if c.odp {
        return refuse("--odp (on-demand paging)");
    }
    // --use_hugepages: ferroce's memory regions own their buffers; --use_old_post_send:
    // ferroce always posts with ibv_post_send. Both are accepted as they change nothing.
    let _ = (c.use_hugepages, c.use_old_post_send, c.cpu_freq);
    cfg.mr_per_qp = c.mr_per_qp;
    if let Some(s) = &c.dlid {
        // RoCE has no LIDs; perftest only puts it in the address vector.
        check_value(s, "dlid", "uint16_t").map_err(|w| bad("--dlid", s, w))?;
    }
    if let Some(s) = &c.tclass {
        cfg.traffic_class =
            check_value(s, "traffic class", "uint16_t").map_err(|w| bad("--tclass", s, w))? as u8;
    }
    let mut wait_destroy = 0;
    if let Some(s) = &c.wait_destroy {
        wait_destroy = check_value(s, "wait_destroy", "uint32_t")
            .map_err(|w| bad("--wait_destroy", s, w))? as u32;
    }
    cfg.perform_warm_up = c.perform_warm_up;
    if let Some(s) = &c.recv_post_list {
        cfg.recv_post_list = as_int(
            check_value(s, "Receive Post List size", "int")
                .map_err(|w| bad("--recv_post_list", s, w))?,
        )
        .max(0) as u32;
    }
    let host = match c.hosts.as_slice() {
        [] => None,
        [h] => Some(h.clone()),
        _ => return err("Invalid Command line. Please check command rerun"),
    };
    // force_dependecies: the checks that end the program.
    if cfg.post_list > 1 {
        if !bw {
            return err("Post list is supported in BW tests only");
        }
        if cfg.duration.is_none() && cfg.iters % u64::from(cfg.post_list) != 0 {
            return err("Number of iterations must be a multiple of post list size");
        }
        if cfg.req_cq_mod && cfg.post_list % cfg.cq_mod != 0 {
            return err("Post list size must be a multiple of CQ moderation");
        }
    }
    if cfg.recv_post_list > 1 {
        if !bw {
            return err("Receive post list is supported in BW tests only");
        }
        if cfg.duration.is_none() && cfg.iters % u64::from(cfg.recv_post_list) != 0 {
            return err("Number of iterations must be a multiple of receive post list size");
        }
    }
    if cfg.use_srq && verb != Verb::Send {
        return err("Using SRQ only avavilible in SEND tests.");
    }
    if cfg.use_srq && cfg.qps > cfg.rx_depth {
        return err("Using SRQ depth should be greater than number of QPs.");
    }
    if cfg.duration.is_some() {
        if cfg.use_event {
            return err("Duration mode doesn't work with events.");
        }
        if cfg.all_sizes {
            return err("Duration mode currently doesn't support running on all sizes.");
        }
    }
    if c.tos.is_some() {
        return err("TOS only valid for rdma_cm based QP and RawEth QP");
    }
    if c.hop_limit.is_some() {
        return err("Hop limit only valid for RawEth QP");
    }
    if cfg.run_infinitely {
        if cfg.use_event {
            return err("run_infinitely does not support events feature yet.");
        }
        if !bw {
            return err("run_infinitely exists only in BW tests for now.");
        }
        if cfg.duplex && verb == Verb::Send {
            return err("run_infinitely mode is not supported in SEND Bidirectional BW test");
        }
    }
    match cfg.output {
        Output::Full => {}
        Output::Bandwidth | Output::MessageRate if !bw => {
            return err("Output verbosity level for LAT can be: latency")
        }
        Output::Latency if bw => {
            return err("Output verbosity level for BW can be: bandwidth, message_rate")
        }
        _ => {}
    }
    if cfg.latency_gap > 0 && bw {
        return err("Latency gap feature is only for latency tests");
    }
    let secs = cfg.duration.map(|d| d.as_secs()).unwrap_or(5);
    let margin = u64::from(cfg.margin.unwrap_or((secs / 4) as u32));
    if cfg.duration.is_some() && secs <= 2 * margin {
        return err("please check that DURATION > 2*MARGIN");
    }
    notices.extend(cfg.apply_dependencies());
    let fx = c.fx;
    cfg.timeout = match &fx.timeout {
        Some(s) => s
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v > 0.0)
            .and_then(|v| Duration::try_from_secs_f64(v).ok())
            .ok_or_else(|| {
                ArgsError::Other(format!(
                    "--timeout: '{s}' is not a positive number of seconds"
                ))
            })?,
        None => Duration::from_secs(20),
    };
    let positive = |flag: &str, v: &str| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x > 0.0)
            .ok_or_else(|| {
                ArgsError::Other(format!(
                    "{flag}: '{v}' must be a finite number greater than 0"
                ))
            })
    };
    let line_gbps = positive("--line-gbps", &fx.line_gbps)?;
    let cc_time_scale = positive("--cc-time-scale", &fx.cc_time_scale)?;
    cfg.progress = !fx.json && !fx.no_progress;
    cfg.verify = fx.verify;
    cfg.verify_seed = fx.verify_seed;
    let cc = match fx.cc {
        CcArg::None => crate::cc::CcConfig::None,
        CcArg::Dcqcn => {
            let p = match fx.cc_preset {
                PresetArg::Paper => crate::cc::dcqcn::Params::paper(),
                PresetArg::Connectx => crate::cc::dcqcn::Params::connectx(),
            };
            let p = p
                .time_scaled(cc_time_scale)
                .with_overrides(&fx.dcqcn)
                .map_err(|e| ArgsError::Other(format!("--dcqcn: {e}")))?;
            crate::cc::CcConfig::Dcqcn(p)
        }
    };
    let sample = fx.cc_sample_ms / 1e3;
    if sample.is_nan() || sample < 0.0 {
        return err(format!(
            "--cc-sample-ms: '{}' is not a number of milliseconds >= 0",
            fx.cc_sample_ms
        ));
    }
    let cc_sample = Duration::try_from_secs_f64(sample)
        .map_err(|_| {
            ArgsError::Other(format!(
                "--cc-sample-ms: '{}' is not a usable number of milliseconds",
                fx.cc_sample_ms
            ))
        })?
        .clamp(Duration::from_micros(100), Duration::from_secs(60));
    let backend = match fx.backend {
        Some(b) => b,
        None => match std::env::var("FERROCE_BACKEND").ok().as_deref() {
            None | Some("") | Some("xdp") => BackendKind::Xdp,
            Some("packet") => BackendKind::Packet,
            Some("udp") => BackendKind::Udp,
            Some(o) => return err(format!("FERROCE_BACKEND={o}: use xdp, packet or udp")),
        },
    };
    Ok(Invocation {
        cfg,
        host,
        port,
        bind: fx.bind,
        dev: c.ib_dev,
        gid_index,
        ipv6: c.ipv6,
        mtu,
        wait_destroy,
        notices,
        warnings,
        backend,
        pcap: fx.pcap,
        poll: fx.poll,
        busy: fx.busy,
        json: fx.json,
        cc,
        line_gbps,
        cc_csv: fx.cc_csv,
        cc_sample,
        cnp_interval_us: fx.cnp_interval_us,
        ack_delay_us: fx.ack_delay_us,
        fast_recovery: fx.fast_recovery,
        selective_repeat: fx.selective_repeat,
        max_inflight: fx.max_inflight,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(test: Test, args: &[&str]) -> Result<Invocation, ArgsError> {
        match parse(test, "ib_test", args.iter().copied())? {
            Parsed::Run(i) => Ok(*i),
            other => panic!("not a run: {other:?}"),
        }
    }

    #[test]
    fn strtol_reads_like_c() {
        assert_eq!(strtol("42"), (42, ""));
        assert_eq!(strtol("0x10"), (16, ""));
        assert_eq!(strtol("010"), (8, ""));
        assert_eq!(strtol("  -7z"), (-7, "z"));
        assert_eq!(strtol("0"), (0, ""));
        assert_eq!(strtol("abc").0, 0);
        assert_eq!(strtol("99999999999999999999999").0, i64::MAX);
    }

    #[test]
    fn perftest_defaults_per_test() {
        let w = run(Test::WriteBw, &[]).unwrap().cfg;
        assert_eq!(
            (w.size, w.iters, w.tx_depth, w.cq_mod, w.qps),
            (65536, 5000, 128, 1, 1)
        );
        let s = run(Test::SendBw, &[]).unwrap().cfg;
        assert_eq!((s.iters, s.rx_depth), (1000, 512));
        let l = run(Test::SendLat, &[]).unwrap().cfg;
        assert_eq!((l.size, l.iters, l.tx_depth), (2, 1000, 1));
        let a = run(Test::AtomicBw, &[]).unwrap().cfg;
        assert_eq!((a.size, a.cq_mod), (8, 100));
    }

    #[test]
    fn dependencies_as_perftest_applies_them() {
        // tx depth and CQ moderation capped at the iterations (seen: "TX depth : 20",
        // "CQ Moderation : 20" for -n 20 -s 4096 on rxe).
        let c = run(Test::WriteBw, &["-n", "20", "-s", "4096"]).unwrap().cfg;
        assert_eq!((c.tx_depth, c.cq_mod), (20, 20));
        // send_bw -a -n 5: RX depth 5, odd stays odd with -a.
        let c = run(Test::SendBw, &["-a", "-n", "5"]).unwrap().cfg;
        assert_eq!((c.rx_depth, c.tx_depth, c.cq_mod), (5, 5, 5));
        // without -a an odd receive depth gets one more
        let c = run(Test::SendBw, &["-n", "5"]).unwrap().cfg;
        assert_eq!(c.rx_depth, 6);
        let i = run(Test::WriteBw, &["-l", "4", "-n", "20", "-s", "64"]).unwrap();
        assert_eq!(i.cfg.cq_mod, 4);
        assert!(i.notices.iter().any(|n| n.contains("Post List requested")));
    }

    #[test]
    fn getopt_syntax_variants() {
        let i = run(
            Test::WriteBw,
            &[
                "-n5",
                "--size=4K",
                "--qp",
                "4",
                "10.0.0.1",
                "-aF",
                "--report_g",
            ],
        )
        .unwrap();
        assert_eq!(i.cfg.iters, 5);
        assert_eq!(i.cfg.size, 4096);
        assert_eq!(i.cfg.qps, 4);
        assert!(i.cfg.all_sizes && i.cfg.report_gbits);
        assert_eq!(i.host.as_deref(), Some("10.0.0.1"));
        let i = run(Test::WriteBw, &["-n", "0x10"]).unwrap();
        assert_eq!(i.cfg.iters, 16);
        assert_eq!(i.bind, None);
        // ferroce's --bind (issue 17 finding 6).
        let i = run(Test::WriteBw, &["--bind", "::1"]).unwrap();
        assert_eq!(i.bind, Some("::1".parse().unwrap()));
        assert!(run(Test::WriteBw, &["--bind", "nowhere"]).is_err());
    }

    #[test]
    fn perftest_range_errors() {
        let e = |t, a: &[&str]| run(t, a).unwrap_err().text();
        assert_eq!(
            e(Test::WriteBw, &["-n", "4"]),
            "Iteration num should be between 5 and 100000000"
        );
        assert_eq!(
            e(Test::WriteBw, &["-n", "x"]),
            "Iteration num argument x should be int"
        );
        assert_eq!(
            e(Test::WriteLat, &["-q", "2"]),
            "Multiple QPs only available on bw tests"
        );
        assert_eq!(
            e(Test::WriteBw, &["-r", "2"]),
            "On RDMA verbs rx depth can be only 1"
        );
        assert_eq!(
            e(Test::ReadBw, &["-I", "10"]),
            "Inline feature not available on READ/Atomic verbs"
        );
        assert_eq!(
            e(Test::WriteBw, &["-e"]),
            "Events feature not available on WRITE verb"
        );
        assert_eq!(
            e(Test::SendLat, &["-b"]),
            "Bidirectional is only available in BW test"
        );
        assert_eq!(
            e(Test::WriteBw, &["-a", "-D", "3"]),
            "Duration mode currently doesn't support running on all sizes."
        );
        assert_eq!(
            e(Test::WriteBw, &["-l", "3", "-n", "10"]),
            "Number of iterations must be a multiple of post list size"
        );
        assert_eq!(
            e(Test::WriteBw, &["a", "b"]),
            "Invalid Command line. Please check command rerun"
        );
        let z = run(Test::WriteBw, &["-z"]).unwrap().cfg;
        assert!(z.exchange_rdma_cm && !z.rdma_cm, "-z: the exchange only");
        let r = run(Test::WriteBw, &["-R"]).unwrap().cfg;
        assert!(
            r.exchange_rdma_cm && r.rdma_cm,
            "-R: the exchange and the test QPs"
        );
        assert!(e(Test::SendBw, &["-R", "-c", "UC"]).contains("not supported"));
        assert!(run(Test::SendBw, &["-R", "-c", "UD"]).unwrap().cfg.rdma_cm);
        assert_eq!(
            run(Test::SendBw, &["-R", "-c", "UD", "-q", "2"])
                .unwrap()
                .cfg
                .qps,
            2
        );
        assert_eq!(run(Test::SendBw, &["-R", "-q", "2"]).unwrap().cfg.qps, 2);
        assert!(matches!(
            run(Test::WriteBw, &["--bogus"]),
            Err(ArgsError::Clap(_))
        ));
        assert!(matches!(
            run(Test::WriteBw, &["999.1.1.1"]),
            Err(ArgsError::Clap(_))
        ));
    }

    #[test]
    fn values_perftest_accepts_are_accepted() {
        // -r 1, -t 1, -Q 1024, -I 912, -m (any number: perftest falls back to the port's MTU)
        assert_eq!(run(Test::SendBw, &["-r", "1"]).unwrap().cfg.rx_depth, 2);
        assert_eq!(
            run(Test::SendBw, &["-r", "1", "-a"]).unwrap().cfg.rx_depth,
            1
        );
        assert_eq!(run(Test::WriteBw, &["-t", "1"]).unwrap().cfg.tx_depth, 1);
        assert_eq!(
            run(Test::SendBw, &["-I", "912"]).unwrap().cfg.inline_size,
            912
        );
        assert_eq!(run(Test::WriteBw, &["-m", "300"]).unwrap().mtu, 300);
        assert_eq!(run(Test::ReadBw, &["-o", "0"]).unwrap().cfg.out_reads, 0);
        assert_eq!(run(Test::SendBw, &["-q", "16384"]).unwrap().cfg.qps, 16384);
        assert_eq!(
            run(Test::WriteBw, &["-s", "2147483647"]).unwrap().cfg.size,
            2147483647
        );
        let u = run(Test::SendBw, &["-c", "UD"]).unwrap();
        assert_eq!(u.cfg.connection, Connection::Ud);
        u.cfg.check_supported().unwrap();
        let s = run(Test::SendBw, &["--use_srq"]).unwrap();
        assert!(s.cfg.use_srq);
        s.cfg.check_supported().unwrap();
    }

    #[test]
    fn program_names() {
        assert_eq!(test_of_program("/usr/bin/ib_write_bw"), Some(Test::WriteBw));
        assert_eq!(test_of_program("ib_atomic_lat"), Some(Test::AtomicLat));
        assert_eq!(test_of_program("ib_send"), None);
        assert_eq!(test_of_program("ferroce"), None);
    }
}
