//! perftest's tests over a running [`Nic`]: `write_bw`, `read_bw`, `send_bw`, `atomic_bw`,
//! `write_lat`, `read_lat`, `send_lat`, `atomic_lat`, with perftest's out-of-band exchange
//! ([`crate::oob::perftest`]) in perftest's order, so that either end can be ferroce or the
//! real `ib_*` tool, for every mode ferroce supports on RC: several QPs (`-q`), every size
//! (`-a`), bidirectional (`-b`), a duration (`-D`), forever (`--run_infinitely`), post lists,
//! CQ moderation, inline sends, events.
//!
//! Roles as in perftest: the server waits for a connection on TCP 18515, the client connects
//! and writes first in every exchange. Which side sends data is perftest's "machine": the
//! client, or the server with `--reversed`, or both with `-b`.
//!
//! The exchange per test (one key message per QP in the first two rounds, `H` a key message of
//! QP 0 exchanged as a barrier; every round client-first):
//!
//! | test | before the traffic | per size | after |
//! | --- | --- | --- | --- |
//! | write/read/atomic bw | keys×q, keys×q, H | `-b`: H, run (`-a`: H), reports | passive side: H, reports; close |
//! | send bw | keys×q, H, keys×q | post receives, H, run, (`-b`: reports), (`-a`: H) | close |
//! | send lat | keys×q, H, keys×q | post receives, H, run | close |
//! | write lat | H, keys×q, keys×q, H | run (no sync between sizes) | nothing |
//! | read/atomic lat | H, keys×q, keys×q, H | run (client only) | close |
//!
//! "close" is one more H and `done\0` each way; "reports" are five 8-byte rounds.

pub mod args;
mod bw;
mod ctx;
mod lat;
pub mod rdma_cm;
pub mod report;
mod verify;

pub use ctx::{qp_to_init, MAX_OUT_READS};
pub use report::{BwLine, LatDurationLine, LatLine, Report, TestInfo};
pub use verify::VerifyReport;

use crate::oob::perftest::{BwReport, KeyMsg, Role, Session};
use crate::oob::CmError;
use crate::runtime::Nic;
use crate::verbs::Mtu;
use crate::verbs::{AvError, VerbsError, WcStatus};
use crate::wire::MacAddr;
use ctx::Endpoint;
use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// perftest's verbs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// SEND (`ib_send_*`).
    Send,
    /// RDMA WRITE (`ib_write_*`).
    Write,
    /// RDMA READ (`ib_read_*`).
    Read,
    /// Atomic FETCH_AND_ADD (`ib_atomic_*`).
    Atomic,
}

impl Verb {
    /// perftest's `testsStr`.
    pub fn perftest_name(self) -> &'static str {
        match self {
            Verb::Send => "Send",
            Verb::Write => "RDMA_Write",
            Verb::Read => "RDMA_Read",
            Verb::Atomic => "Atomic",
        }
    }
}

/// The tests (perftest's programs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    /// `ib_write_bw`.
    WriteBw,
    /// `ib_read_bw`.
    ReadBw,
    /// `ib_send_bw`.
    SendBw,
    /// `ib_atomic_bw`.
    AtomicBw,
    /// `ib_send_lat`.
    SendLat,
    /// `ib_write_lat`.
    WriteLat,
    /// `ib_read_lat`.
    ReadLat,
    /// `ib_atomic_lat`.
    AtomicLat,
}

impl Test {
    /// Every test, in perftest's order.
    pub const ALL: [Test; 8] = [
        Test::WriteBw,
        Test::ReadBw,
        Test::SendBw,
        Test::AtomicBw,
        Test::WriteLat,
        Test::ReadLat,
        Test::SendLat,
        Test::AtomicLat,
    ];

    /// `write-bw`, `write_bw` or `ib_write_bw`.
    pub fn from_name(s: &str) -> Option<Test> {
        let s = s.strip_prefix("ib_").unwrap_or(s).replace('-', "_");
        Test::ALL.into_iter().find(|t| t.name() == s)
    }
    /// perftest's name without the `ib_` prefix: `write_bw`.
    pub fn name(self) -> &'static str {
        match self {
            Test::WriteBw => "write_bw",
            Test::ReadBw => "read_bw",
            Test::SendBw => "send_bw",
            Test::AtomicBw => "atomic_bw",
            Test::SendLat => "send_lat",
            Test::WriteLat => "write_lat",
            Test::ReadLat => "read_lat",
            Test::AtomicLat => "atomic_lat",
        }
    }
    /// The program perftest installs: `ib_write_bw`.
    pub fn program(self) -> String {
        format!("ib_{}", self.name())
    }
    /// The verb the test measures.
    pub fn verb(self) -> Verb {
        match self {
            Test::WriteBw | Test::WriteLat => Verb::Write,
            Test::ReadBw | Test::ReadLat => Verb::Read,
            Test::SendBw | Test::SendLat => Verb::Send,
            Test::AtomicBw | Test::AtomicLat => Verb::Atomic,
        }
    }
    /// Whether it is a bandwidth test (`_bw`) rather than a latency test.
    pub fn is_bw(self) -> bool {
        matches!(
            self,
            Test::WriteBw | Test::ReadBw | Test::SendBw | Test::AtomicBw
        )
    }
    /// perftest's banner title (without the modes `-b` and `-l` add).
    pub fn title(self) -> &'static str {
        match self {
            Test::WriteBw => "RDMA_Write BW Test",
            Test::ReadBw => "RDMA_Read BW Test",
            Test::SendBw => "Send BW Test",
            Test::AtomicBw => "Atomic FETCH_AND_ADD BW Test",
            Test::SendLat => "Send Latency Test",
            Test::WriteLat => "RDMA_Write Latency Test",
            Test::ReadLat => "RDMA_Read Latency Test",
            Test::AtomicLat => "Atomic FETCH_AND_ADD Latency Test",
        }
    }
}

/// perftest's connection types (`-c`). ferroce runs RC, UC and UD (see
/// [`PerfConfig::check_supported`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Connection {
    #[default]
    /// Reliable Connection.
    Rc,
    /// Unreliable Connection.
    Uc,
    /// Unreliable Datagram.
    Ud,
    /// eXtended Reliable Connection (not run by ferroce).
    Xrc,
    /// Dynamically Connected (not run by ferroce).
    Dc,
    /// Scalable Reliable Datagram (not run by ferroce).
    Srd,
}

impl Connection {
    /// perftest's name (`RC`, `UC`, ...), as its banner prints it.
    pub fn name(self) -> &'static str {
        match self {
            Connection::Rc => "RC",
            Connection::Uc => "UC",
            Connection::Ud => "UD",
            Connection::Xrc => "XRC",
            Connection::Dc => "DC",
            Connection::Srd => "SRD",
        }
    }
}

/// perftest's `--output` verbosity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Output {
    #[default]
    /// Everything (perftest's default).
    Full,
    /// Only the average bandwidth.
    Bandwidth,
    /// Only the message rate.
    MessageRate,
    /// Only the typical latency.
    Latency,
}

/// The largest message of `-a` (perftest's `MAX_SIZE`).
pub const MAX_SIZE: u32 = 8 << 20;
/// perftest's page ("cycle buffer") and cache line size on this host.
pub const PAGE: usize = 4096;
/// perftest's cache line size on this host.
pub const CACHE_LINE: usize = 64;

/// Test parameters: perftest's flags, with perftest's defaults ([`PerfConfig::for_test`]), and
/// ferroce's own (the timeout, `--verify`).
#[derive(Clone, Debug)]
pub struct PerfConfig {
    /// Which test.
    pub test: Test,
    /// `-R`: the test QP and the exchange over RDMA-CM (perftest's "rdma_cm QPs: ON, Data ex.
    /// method: rdma_cm"): see `apps/perf/rdma_cm.rs`.
    pub rdma_cm: bool,
    /// `-z` (and `-R`): the exchange over an RDMA-CM connected control QP, as with `-R`,
    /// but the test QPs are created and connected by hand from the key messages as over TCP
    /// (perftest's `use_rdma_cm` without `work_rdma_cm`: "rdma_cm QPs: OFF, Data ex. method:
    /// rdma_cm"; no all-zero rounds, no REQ for the test QPs).
    pub exchange_rdma_cm: bool,
    /// `--retry_count` (rdma_cm's `conn_param.retry_count`; default 7).
    pub retry_count: u8,
    /// `-c`.
    pub connection: Connection,
    /// `-s`: message size (with `-a` the largest, 8 MiB).
    pub size: u32,
    /// `-a`: every power of two from 2 B to 8 MiB (bandwidth and latency tests; atomics: 8 B).
    pub all_sizes: bool,
    /// `--run_infinitely`: report every `-D` seconds (default 5), forever.
    pub run_infinitely: bool,
    /// `-n`: iterations per QP.
    pub iters: u64,
    /// `-D`: run for this long (the iterations are counted in the middle, see `margin`).
    pub duration: Option<Duration>,
    /// `-f`: seconds at either end of a `-D` run that are not measured (default `D / 4`).
    pub margin: Option<u32>,
    /// `-q`: QPs (bandwidth tests).
    pub qps: u32,
    /// The path MTU (`-m`, capped by the link; see `tool`).
    pub mtu: Mtu,
    /// `-t`: send queue depth (perftest: 128 for bandwidth, 1 for latency; capped at `-n`).
    pub tx_depth: u32,
    /// `-r`: receive queue depth for SEND (512; capped at `-n`, even).
    pub rx_depth: u32,
    /// `-Q`: a completion every this many sends (100; 1 above 8 KiB unless asked).
    pub cq_mod: u32,
    /// `-Q` was given.
    pub req_cq_mod: bool,
    /// `-l`: work requests posted at once.
    pub post_list: u32,
    /// `--recv_post_list`.
    pub recv_post_list: u32,
    /// `-I`: messages up to this size are sent inline.
    pub inline_size: u32,
    /// `-o`: outstanding READ/ATOMIC (0: the device's maximum).
    pub out_reads: u16,
    /// `-e`: sleep on completion events.
    pub use_event: bool,
    /// `-b`: both sides send.
    pub duplex: bool,
    /// `-N`: no peak bandwidth.
    pub no_peak: bool,
    /// `--report_gbits`: Gb/s instead of MB/s (perftest's MB is 2^20 bytes).
    pub report_gbits: bool,
    /// `--report-both` (with `-b`): the local and remote results separately as well.
    pub report_both: bool,
    /// `-A CMP_AND_SWAP` (default FETCH_AND_ADD).
    pub cmp_swap: bool,
    /// `-x`: GID index.
    pub gid_index: u8,
    /// `--tclass`: the GRH traffic class (IPv4 TOS / IPv6 traffic class).
    pub traffic_class: u8,
    /// `-u`: the QPs' local ACK timeout, 4.096 µs × 2^t (perftest's default 14).
    pub qp_timeout: u8,
    /// `--use-srq` (parsed; needs SRQs).
    pub use_srq: bool,
    /// `--reversed`: the server sends, the client receives.
    pub reversed: bool,
    /// `--mr_per_qp`.
    pub mr_per_qp: bool,
    /// `--perform_warm_up`.
    pub perform_warm_up: bool,
    /// `--out_json` (with `--out_json_file`, default `perftest_out.json`).
    pub out_json: Option<PathBuf>,
    /// `--output`.
    pub output: Output,
    /// `-U`: also print every latency sample unsorted; `-H`: sorted (a histogram).
    pub unsorted: bool,
    /// `-H`: print the latency samples sorted (a histogram).
    pub histogram: bool,
    /// `-w`, `-y`: fail if the average bandwidth / message rate is below.
    pub limit_bw: Option<f64>,
    /// `-y`: fail if the average message rate (Mpps) is below.
    pub limit_msgrate: Option<f64>,
    /// `--latency_gap`: µs to wait before each latency post.
    pub latency_gap: u32,
    /// Out-of-band read timeout, and the longest a run may make no progress.
    pub timeout: Duration,
    /// Print a progress line on standard error every second on long runs.
    pub progress: bool,
    /// Check payloads byte for byte (see [`VerifyReport`]).
    pub verify: bool,
    /// Seed of the pattern ferroce sends with `verify` (write-bw / send-bw client).
    pub verify_seed: u64,
    /// `-c UD`: the largest message, the path MTU once it is known (perftest lowers `-s`
    /// to it; `-a` stops there).
    pub ud_max: u32,
}

impl Default for PerfConfig {
    /// ib_write_bw's defaults, and a 20 s progress timeout.
    fn default() -> Self {
        PerfConfig::for_test(Test::WriteBw)
    }
}

impl PerfConfig {
    /// perftest's defaults for `test` (`init_perftest_params`).
    pub fn for_test(test: Test) -> Self {
        let bw = test.is_bw();
        PerfConfig {
            test,
            rdma_cm: false,
            exchange_rdma_cm: false,
            retry_count: 7,
            connection: Connection::Rc,
            size: match test.verb() {
                Verb::Atomic => 8,
                _ if bw => 65536,
                _ => 2,
            },
            all_sizes: false,
            run_infinitely: false,
            iters: if test == Test::WriteBw { 5000 } else { 1000 },
            duration: None,
            margin: None,
            qps: 1,
            mtu: Mtu::M4096,
            tx_depth: if bw { 128 } else { 1 },
            rx_depth: if test.verb() == Verb::Send { 512 } else { 1 },
            cq_mod: 100,
            req_cq_mod: false,
            post_list: 1,
            recv_post_list: 1,
            inline_size: 0,
            out_reads: 0,
            use_event: false,
            duplex: false,
            no_peak: false,
            report_gbits: false,
            report_both: false,
            cmp_swap: false,
            gid_index: 0,
            traffic_class: 0,
            qp_timeout: 14,
            use_srq: false,
            reversed: false,
            mr_per_qp: false,
            perform_warm_up: false,
            out_json: None,
            output: Output::Full,
            unsorted: false,
            histogram: false,
            limit_bw: None,
            limit_msgrate: None,
            latency_gap: 0,
            timeout: Duration::from_secs(20),
            progress: true,
            verify: false,
            verify_seed: 0x5eed,
            ud_max: u32::MAX,
        }
    }

    /// The sizes to run.
    pub fn sizes(&self) -> Vec<u32> {
        if self.test.verb() == Verb::Atomic {
            vec![8]
        } else if self.all_sizes {
            (1..24)
                .map(|i| 1u32 << i)
                .filter(|&s| s <= self.ud_max)
                .collect()
        } else {
            vec![self.size]
        }
    }

    /// The size the buffers are laid out for (perftest's `ctx->size`).
    pub fn ctx_size(&self) -> u32 {
        if self.test.verb() == Verb::Atomic {
            8
        } else if self.all_sizes {
            MAX_SIZE
        } else {
            self.size.max(1)
        }
    }

    /// The outstanding reads this side offers (`-o`, capped at the device's maximum).
    pub fn out_reads_effective(&self) -> u16 {
        if self.out_reads == 0 || self.out_reads > MAX_OUT_READS {
            MAX_OUT_READS
        } else {
            self.out_reads
        }
    }

    /// perftest's `force_dependecies` for the values that shape a run (idempotent): the send
    /// depth and receive depth capped at the iterations, CQ moderation off above 8 KiB (unless
    /// asked) and never above the send depth, post lists moderating by their length, an even
    /// receive depth for SEND. Returns the notices perftest prints on standard output.
    pub fn apply_dependencies(&mut self) -> Vec<String> {
        let mut notes = Vec::new();
        if self.test.verb() == Verb::Atomic {
            self.size = 8;
        }
        let iterations = self.duration.is_none() && !self.run_infinitely;
        if iterations {
            if u64::from(self.tx_depth) > self.iters {
                self.tx_depth = self.iters.max(1) as u32;
            }
            if self.test.verb() == Verb::Send && u64::from(self.rx_depth) > self.iters {
                self.rx_depth = self.iters.max(1) as u32;
            }
        }
        if self.size > 8192 && !self.all_sizes && !self.use_event && !self.req_cq_mod {
            self.cq_mod = 1;
        } else if self.size > 8192 && !self.all_sizes && !self.use_event && self.cq_mod > 1 {
            notes.push(
                "Warning: Large message requested and CQ moderation enabled\nWarning: It can lead to inaccurate results".into(),
            );
        }
        if self.cq_mod > self.tx_depth {
            self.cq_mod = self.tx_depth.max(1);
        }
        if matches!(self.test.verb(), Verb::Read | Verb::Atomic) {
            self.inline_size = 0;
        }
        if self.post_list > 1 && self.test.is_bw() && !self.req_cq_mod {
            self.cq_mod = self.post_list;
            notes.push(
                "Post List requested - CQ moderation will be the size of the post list".into(),
            );
        }
        if self.duration.is_some() || self.run_infinitely {
            self.no_peak = true;
        }
        if self.test == Test::SendBw && !self.duplex && self.duration.is_none() {
            // The passive SEND side never measures a peak; that is decided per role in `run`.
        }
        if self.test.verb() == Verb::Send
            && self.rx_depth % 2 == 1
            && !self.all_sizes
            && !self.run_infinitely
        {
            self.rx_depth += 1;
        }
        if iterations && self.iters > 20000 && self.test.is_bw() {
            self.no_peak = true;
        }
        notes
    }

    /// Refuse, with a clear message, what ferroce does not run yet.
    pub fn check_supported(&self) -> Result<(), PerfError> {
        match self.connection {
            Connection::Rc | Connection::Uc | Connection::Ud => {}
            c => {
                return Err(PerfError::Unsupported(format!(
                    "connection type {} is not supported by ferroce",
                    c.name()
                )))
            }
        }

        if self.verify && self.run_infinitely {
            return Err(PerfError::Unsupported(
                "--verify needs a run that ends (not --run_infinitely)".into(),
            ));
        }
        Ok(())
    }
}

/// Why a test failed.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    #[error(transparent)]
    /// The out-of-band exchange failed.
    Cm(#[from] CmError),
    #[error("verbs: {0}")]
    /// A verb failed.
    Verbs(#[from] VerbsError),
    #[error("work completion {wr_id} failed: {status}")]
    /// A work completion with an error status.
    Completion {
        /// The work request's id.
        wr_id: u64,
        /// Its status.
        status: WcStatus,
    },
    #[error("no progress for {0:?}")]
    /// The run made no progress for this long.
    Stalled(Duration),
    #[error("cannot resolve the MAC address of {0}")]
    /// No MAC address for the peer's GID.
    Neighbour(IpAddr),
    #[error("data check failed: {0}")]
    /// `--verify` found data that differs from the pattern.
    Verify(String),
    #[error("the peer's exchange does not match ours: {0}")]
    /// The peer's exchange does not match this side's settings.
    Peer(&'static str),
    #[error("{0}")]
    /// Something ferroce does not run (a connection type, an option).
    Unsupported(String),
    #[error("writing the results: {0}")]
    /// Standard output (or the JSON file) failed.
    Output(#[from] std::io::Error),
    #[error("Error: BW result is below bw limit")]
    /// `-w`: the average bandwidth is below the limit (perftest's words).
    BwLimit,
    #[error("Error: Msg rate  is below msg_rate limit")]
    /// `-y`: the average message rate is below the limit (perftest's words).
    MsgRateLimit,
}

/// Where the text goes and what the header says about this side.
pub struct Printer<'a> {
    /// Where the results go.
    pub out: &'a mut dyn Write,
    /// The device name perftest prints (`-d`).
    pub device: String,
}

impl Printer<'_> {
    fn line(&mut self, s: &str) -> Result<(), PerfError> {
        writeln!(self.out, "{s}")?;
        self.out.flush()?;
        Ok(())
    }
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct RunOutput {
    /// The results.
    pub report: Report,
    /// This side's key messages (one per QP).
    pub ours: Vec<KeyMsg>,
    /// The peer's key messages.
    pub theirs: Vec<KeyMsg>,
    /// What `--verify` checked, if it was asked for.
    pub verify: Option<VerifyReport>,
    /// The path MTU the two sides agreed on.
    pub mtu: Mtu,
}

/// Run a test over an established control session, printing nothing. Returns the report,
/// both sides' key messages and, with `verify`, what was checked.
#[allow(clippy::type_complexity)]
pub fn run(
    nic: &Nic,
    cfg: &PerfConfig,
    ses: &mut Session,
    resolve: &dyn Fn(IpAddr) -> Option<MacAddr>,
) -> Result<(Report, Vec<KeyMsg>, Vec<KeyMsg>, Option<VerifyReport>), PerfError> {
    let mut sink = std::io::sink();
    let mut pr = Printer {
        out: &mut sink,
        device: String::new(),
    };
    let cfg = PerfConfig {
        output: Output::Full,
        out_json: None,
        ..cfg.clone()
    };
    let o = run_with(nic, &cfg, ses, resolve, &mut pr)?;
    Ok((o.report, o.ours, o.theirs, o.verify))
}

/// Run a test over an established control session, printing perftest's output to `pr` as
/// perftest prints it (the test-information block, the addresses, each result line as it is
/// measured).
pub fn run_with(
    nic: &Nic,
    cfg0: &PerfConfig,
    ses: &mut Session,
    resolve: &dyn Fn(IpAddr) -> Option<MacAddr>,
    pr: &mut Printer<'_>,
) -> Result<RunOutput, PerfError> {
    let mut cfg = cfg0.clone();
    cfg.apply_dependencies();
    cfg.check_supported()?;
    if !cfg.test.is_bw() {
        cfg.qps = 1;
        cfg.duplex = false;
    }
    let tcp_role = ses.role;
    // perftest's "machine": who sends (the client; the server with --reversed).
    let machine = match (tcp_role, cfg.reversed) {
        (r, false) => r,
        (Role::Client, true) => Role::Server,
        (Role::Server, true) => Role::Client,
    };
    if cfg.test == Test::SendBw && machine == Role::Server && !cfg.duplex {
        cfg.no_peak = true;
    }
    let full = cfg.output == Output::Full;
    // Versions, page and cache line sizes, MTU.
    let mtu = ses.handshake(cfg.mtu)?;
    if cfg.connection == Connection::Ud {
        // perftest: a UD message is at most the MTU ("Max msg size in UD is MTU", printed
        // with -a); -s is lowered to it.
        cfg.ud_max = mtu.bytes();
        if cfg.size > cfg.ud_max {
            if cfg.all_sizes {
                eprintln!(" Max msg size in UD is MTU {}", cfg.ud_max);
                eprintln!(" Changing to this MTU");
            }
            cfg.size = cfg.ud_max;
        }
    }
    let cycle = (ses.peer_page as usize).clamp(64, 1 << 24).max(PAGE);
    let line = (ses.peer_cache_line as usize)
        .clamp(1, 4096)
        .max(CACHE_LINE);
    // perftest's srq_exists: an SRQ on the sides that receive.
    let with_srq = cfg.use_srq && (!cfg.test.is_bw() || machine == Role::Server || cfg.duplex);
    let ep = Endpoint::new(nic, &cfg, cycle, line, with_srq)?;
    let gid = nic
        .with_device(|d| d.gid(usize::from(cfg.gid_index)))
        .ok_or(PerfError::Verbs(VerbsError::BadAddressVector(
            AvError::NoSuchGid(cfg.gid_index),
        )))?;
    let ours = ep.keys(gid);
    // Key messages over rdma_cm carry the GID index (-R and -z).
    ses.gid_index = u32::from(cfg.gid_index);
    if cfg.rdma_cm {
        // perftest -R: an all-zero key round, the test QP connected over RDMA-CM (RTR and
        // RTS from the REQ/REP: no ctx_connect), another all-zero round.
        ses.zero_round()?;
        let resources = if matches!(cfg.test.verb(), Verb::Read | Verb::Atomic) {
            ep.out_reads.clamp(1, 255) as u8
        } else {
            0
        };
        if cfg.connection == Connection::Ud {
            ud_over_sidr(nic, &cfg, &ep, ses, tcp_role, resolve)?;
        } else {
            // One connection per test QP, in order: perftest's server takes them in the order
            // the REQs come, and its client sends them in the order of its QPs.
            for q in &ep.qps {
                ses.connect_qp(*q, resources, cfg.retry_count)?;
            }
        }
        ses.zero_round()?;
    }
    let info = TestInfo {
        device: pr.device.clone(),
        mtu: mtu.bytes(),
        gid_index: cfg.gid_index,
        // perftest's header: TX depth for the client "machine" (or -b), RX depth for the server.
        sender: cfg.duplex || machine == Role::Client,
        receiver: cfg.duplex || machine == Role::Server,
        out_reads: ep.out_reads,
    };
    if full {
        pr.line(&report::test_info(&cfg, &info))?;
        if cfg.rdma_cm && tcp_role == Role::Server {
            pr.line(" Waiting for client rdma_cm QP to connect")?;
            pr.line(" Please run the same command with the IB/RoCE interface IP")?;
            pr.line(report::RESULT_LINE)?;
        }
    }
    let verb = cfg.test.verb();
    let lat_rdma = matches!(cfg.test, Test::WriteLat | Test::ReadLat | Test::AtomicLat);
    if lat_rdma {
        ses.hand_shake(&ours[0])?;
    }
    let mut theirs = Vec::with_capacity(ours.len());
    for k in &ours {
        theirs.push(ses.hand_shake(k)?);
    }
    if !cfg.rdma_cm {
        ep.connect(&cfg, mtu, &theirs, resolve)?;
    }
    let send_family = verb == Verb::Send;
    if send_family {
        ses.hand_shake(&ours[0])?;
    }
    if full {
        for k in &ours {
            pr.line(&report::address_text("local", k, verb))?;
        }
    }
    // The second round per QP: perftest keeps what arrives here (it overwrites the first).
    for (i, k) in ours.iter().enumerate() {
        let t = ses.hand_shake(k)?;
        if t.qpn != theirs[i].qpn {
            return Err(PerfError::Peer(
                "the QPN of a QP changed between two exchanges",
            ));
        }
        theirs[i] = t;
        if full {
            pr.line(&report::address_text("remote", &theirs[i], verb))?;
        }
    }
    if !send_family {
        // "An additional handshake is required after moving qp to RTR."
        ses.hand_shake(&ours[0])?;
    }
    // The rest of the exchange waits for whole runs: a longer timeout (none when the run
    // never ends).
    let wait = if cfg.run_infinitely {
        Duration::MAX
    } else {
        cfg.timeout + cfg.duration.unwrap_or_default() + Duration::from_secs(600)
    };
    ses.timeout = wait;
    let ctl = Ctl {
        cfg: &cfg,
        machine,
        tcp_role,
        info: &info,
    };
    let mut verify = None;
    let report = match cfg.test {
        Test::WriteBw | Test::ReadBw | Test::AtomicBw => {
            rdma_bw(&ctl, &ep, ses, &ours, &theirs, pr, &mut verify)?
        }
        Test::SendBw => send_bw(&ctl, &ep, ses, &ours, &theirs, pr, &mut verify)?,
        Test::SendLat | Test::WriteLat | Test::ReadLat | Test::AtomicLat => {
            latency(&ctl, &ep, ses, &ours, &theirs, pr)?
        }
    };
    Ok(RunOutput {
        report,
        ours,
        theirs,
        verify,
        mtu,
    })
}

/// perftest `-c UD -R`: each test QP's peer over RDMA-CM's SIDR, one SIDR exchange per QP
/// in QP order (`-q N`: perftest's client resolves and connects its N ids at once, its server
/// takes the requests in the order they come, creating the next QP for each). The client
/// learns the server's QP and Q_Key from the SIDR_REP (ESTABLISHED); when the server sends too
/// (`-b`, latency tests), the client then sends it a 4-byte SEND with immediate data from the
/// same QP, its QPN, and the server takes the address from that message before it accepts
/// the next request (perftest's `rdma_cm_send_ud_connection_parameters` /
/// `rdma_cm_initialize_ud_connection_parameters`: `ibv_create_ah_from_wc`, the QPN from the
/// immediate, its own Q_Key).
fn ud_over_sidr(
    nic: &Nic,
    cfg: &PerfConfig,
    ep: &Endpoint<'_>,
    ses: &mut Session,
    role: Role,
    resolve: &dyn Fn(IpAddr) -> Option<MacAddr>,
) -> Result<(), PerfError> {
    use crate::verbs::{RecvWr, SendOp, SendWr, UdDest, WcOpcode};
    let both_ways = !cfg.test.is_bw() || cfg.duplex;
    let wait = |cq: crate::verbs::Cq| -> Result<crate::verbs::WorkCompletion, PerfError> {
        let end = std::time::Instant::now() + cfg.timeout;
        let mut v = Vec::new();
        loop {
            nic.poll_cq(cq, &mut v, 1)?;
            if let Some(wc) = v.pop() {
                if wc.status != WcStatus::Success {
                    return Err(PerfError::Peer(
                        "the UD connection parameters' completion failed",
                    ));
                }
                return Ok(wc);
            }
            if std::time::Instant::now() >= end {
                return Err(PerfError::Cm(CmError::Timeout(
                    cfg.timeout,
                    "UD connection parameters",
                )));
            }
            nic.wait_cq(cq, Duration::from_millis(10))?;
        }
    };
    let mut dests = Vec::with_capacity(ep.qps.len());
    for (i, q) in ep.qps.iter().enumerate() {
        if role == Role::Server && both_ways {
            // Before the SIDR_REP leaves: the client's message may follow it at once.
            ep.post_recv(
                i,
                RecvWr {
                    wr_id: i as u64,
                    sg_list: smallvec::smallvec![ep.recv_sge(i, 0, 4)],
                },
            )?;
        }
        match ses.connect_ud(*q)? {
            Some(p) => {
                let ah = ep.ah_to(cfg, p.ip, resolve)?;
                let d = UdDest {
                    ah,
                    remote_qpn: p.qpn,
                    remote_qkey: p.qkey,
                };
                dests.push(d);
                if both_ways {
                    let wr = SendWr::new(
                        i as u64,
                        SendOp::SendWithImm { imm: q.get() },
                        vec![ep.send_sge(i, 0, 4)],
                    )
                    .with_ud(d);
                    nic.post_send(*q, wr)?;
                    wait(ep.send_cq)?;
                }
            }
            None if both_ways => {
                let wc = wait(ep.recv_cq)?;
                let qpn = match (wc.opcode, wc.imm_data) {
                    (WcOpcode::Recv, Some(imm)) if wc.qp_num == *q => {
                        crate::wire::QpNumber::new(imm)
                    }
                    (WcOpcode::Recv, Some(_)) => {
                        return Err(PerfError::Peer(
                            "the client's UD connection parameters came to another QP",
                        ))
                    }
                    _ => {
                        return Err(PerfError::Peer(
                            "the client's UD connection parameters carry no immediate data",
                        ))
                    }
                };
                let mut grh = [0u8; crate::wire::grh::GRH_LEN];
                ep.read_recv(i, 0, &mut grh)?;
                let ip = match crate::wire::grh::GrhSlot::parse(&grh) {
                    Ok(crate::wire::grh::GrhSlot::V4 { src, .. }) => IpAddr::V4(src),
                    Ok(crate::wire::grh::GrhSlot::V6 { src, .. }) => IpAddr::V6(src),
                    Err(_) => return Err(PerfError::Peer("the client's message has no GRH")),
                };
                let ah = ep.ah_to(cfg, ip, resolve)?;
                dests.push(UdDest {
                    ah,
                    remote_qpn: qpn,
                    remote_qkey: crate::runtime::cm::UDP_QKEY,
                });
            }
            None => {}
        }
    }
    if dests.len() == ep.qps.len() {
        ep.set_ud_dests(dests);
    }
    Ok(())
}

/// What the test phases share.
struct Ctl<'a> {
    cfg: &'a PerfConfig,
    machine: Role,
    /// Who connected (the client) and who listened.
    tcp_role: Role,
    info: &'a TestInfo,
}

impl Ctl<'_> {
    fn full(&self) -> bool {
        self.cfg.output == Output::Full
    }

    /// Print one bandwidth result (`print_full_bw_report`) and write the JSON file.
    fn print_bw(&self, pr: &mut Printer<'_>, l: &BwLine) -> Result<(), PerfError> {
        self.print_bw_as(pr, l, l.bw_avg)
    }

    /// [`Ctl::print_bw`] of a sum with the peer's report: the format follows `own_avg`.
    fn print_bw_as(&self, pr: &mut Printer<'_>, l: &BwLine, own_avg: f64) -> Result<(), PerfError> {
        if self.full() {
            pr.line(&report::bw_text_as(l, self.cfg.report_gbits, own_avg))?;
        } else {
            pr.line(&report::output_bw(self.cfg, l))?;
        }
        if let Some(p) = &self.cfg.out_json {
            std::fs::write(p, report::json_bw(self.cfg, self.info, l, own_avg))?;
        }
        Ok(())
    }

    fn check_limits(&self, l: &BwLine) -> Result<(), PerfError> {
        if self.cfg.limit_bw.is_some_and(|lim| lim > l.bw_avg) {
            return Err(PerfError::BwLimit);
        }
        if self
            .cfg
            .limit_msgrate
            .is_some_and(|lim| lim > l.msg_rate_mpps)
        {
            return Err(PerfError::MsgRateLimit);
        }
        Ok(())
    }

    fn result_header(&self, pr: &mut Printer<'_>) -> Result<(), PerfError> {
        if self.full() {
            pr.line(report::RESULT_LINE)?;
            pr.line(report::result_header(self.cfg))?;
        }
        Ok(())
    }

    fn result_line(&self, pr: &mut Printer<'_>) -> Result<(), PerfError> {
        if self.full() {
            pr.line(report::RESULT_LINE)?;
        }
        Ok(())
    }
}

fn bw_report_msg(l: &BwLine) -> BwReport {
    BwReport {
        size: u64::from(l.bytes),
        iters: l.iterations,
        bw_peak: l.bw_peak,
        bw_avg: l.bw_avg,
        msg_rate: l.msg_rate_mpps,
    }
}

fn bw_line_of(r: &BwReport) -> BwLine {
    BwLine {
        bytes: r.size.min(u64::from(u32::MAX)) as u32,
        iterations: r.iters,
        bw_peak: r.bw_peak,
        bw_avg: r.bw_avg,
        msg_rate_mpps: r.msg_rate,
    }
}

/// write_bw, read_bw, atomic_bw.
fn rdma_bw(
    c: &Ctl<'_>,
    ep: &Endpoint<'_>,
    ses: &mut Session,
    ours: &[KeyMsg],
    theirs: &[KeyMsg],
    pr: &mut Printer<'_>,
    verify: &mut Option<VerifyReport>,
) -> Result<Report, PerfError> {
    let cfg = c.cfg;
    c.result_header(pr)?;
    let h = &ours[0];
    if c.machine == Role::Server && !cfg.duplex {
        // The passive side waits for the active side's whole run, then prints its report.
        ses.hand_shake(h)?;
        let r = ses.bw_reports(&BwReport::default())?;
        if cfg.verify && cfg.test == Test::WriteBw {
            *verify = Some(verify::passive_write(ep, cfg)?);
        }
        let l = bw_line_of(&r);
        c.print_bw(pr, &l)?;
        ses.close(h)?;
        c.result_line(pr)?;
        return Ok(Report::Bw(vec![l]));
    }
    let mut lines = Vec::new();
    if cfg.run_infinitely {
        bw::run_infinitely(c, ep, theirs, cfg.size, pr)?;
        unreachable!("run_infinitely returns only with an error");
    }
    let sizes = cfg.sizes();
    let mut last = None;
    for &size in &sizes {
        if cfg.perform_warm_up {
            bw::warm_up(ep, cfg, theirs, size)?;
        }
        if cfg.duplex {
            ses.hand_shake(h)?;
        }
        let (l, v) = bw::run_iter_bw(c, ep, theirs, size)?;
        if let Some(v) = v {
            // -a: what every size checked, together.
            let total = verify.get_or_insert_with(VerifyReport::default);
            total.messages += v.messages;
            total.bytes += v.bytes;
            total.against = v.against;
        }
        if cfg.duplex && cfg.all_sizes {
            ses.hand_shake(h)?;
        }
        if cfg.duplex {
            let r = ses.bw_reports(&bw_report_msg(&l))?;
            let rem = bw_line_of(&r);
            let sum = l.plus(&rem);
            c.print_bw_as(pr, &sum, l.bw_avg)?;
            if cfg.report_both && !cfg.all_sizes {
                print_both(c, pr, &l, &rem)?;
            }
            c.check_limits(&sum)?;
            lines.push(sum);
        } else {
            c.print_bw(pr, &l)?;
            c.check_limits(&l)?;
            lines.push(l.clone());
        }
        last = Some(l);
    }
    c.result_line(pr)?;
    if !cfg.duplex {
        ses.hand_shake(h)?;
        let mine = last.as_ref().map(bw_report_msg).unwrap_or_default();
        ses.bw_reports(&mine)?;
    }
    ses.close(h)?;
    if cfg.duplex && cfg.verify && cfg.test == Test::WriteBw {
        *verify = Some(verify::passive_write(ep, cfg)?);
    }
    Ok(Report::Bw(lines))
}

/// `--report-both`: the two sides' results separately.
fn print_both(
    c: &Ctl<'_>,
    pr: &mut Printer<'_>,
    mine: &BwLine,
    rem: &BwLine,
) -> Result<(), PerfError> {
    if !c.full() {
        return Ok(());
    }
    for (title, l) in [(" Local results: ", mine), (" Remote results: ", rem)] {
        pr.line(report::RESULT_LINE)?;
        pr.line(&format!("\n{title}"))?;
        pr.line(report::RESULT_LINE)?;
        pr.line(report::result_header(c.cfg))?;
        pr.line(&report::bw_text(l, c.cfg.report_gbits))?;
        if title.starts_with(" Local") {
            pr.line(report::RESULT_LINE)?;
        }
    }
    Ok(())
}

/// send_bw.
fn send_bw(
    c: &Ctl<'_>,
    ep: &Endpoint<'_>,
    ses: &mut Session,
    ours: &[KeyMsg],
    theirs: &[KeyMsg],
    pr: &mut Printer<'_>,
    verify: &mut Option<VerifyReport>,
) -> Result<Report, PerfError> {
    let cfg = c.cfg;
    c.result_header(pr)?;
    let h = &ours[0];
    let receiver = cfg.duplex || c.machine == Role::Server;
    if cfg.run_infinitely {
        if receiver {
            bw::post_receives(ep, cfg, cfg.size)?;
        }
        ses.hand_shake(h)?;
        if c.machine == Role::Client {
            bw::run_infinitely(c, ep, theirs, cfg.size, pr)?;
        } else {
            bw::run_infinitely_server(c, ep, cfg.size, pr)?;
        }
        unreachable!("run_infinitely returns only with an error");
    }
    let mut lines = Vec::new();
    let mut checker = verify::SendCheck::new(cfg, c.tcp_role);
    for size in cfg.sizes() {
        if receiver {
            bw::post_receives(ep, cfg, size)?;
        }
        ses.hand_shake(h)?;
        let l = if cfg.duplex {
            bw::run_iter_bi(c, ep, theirs, size, &mut checker)?
        } else if c.machine == Role::Client {
            bw::run_iter_bw(c, ep, theirs, size)?.0
        } else {
            bw::run_iter_bw_server(c, ep, size, &mut checker)?
        };
        if cfg.duplex && cfg.duration.is_none() {
            let r = ses.bw_reports(&bw_report_msg(&l))?;
            let rem = bw_line_of(&r);
            let sum = l.plus(&rem);
            c.print_bw_as(pr, &sum, l.bw_avg)?;
            if cfg.report_both && !cfg.all_sizes {
                print_both(c, pr, &l, &rem)?;
            }
            c.check_limits(&sum)?;
            lines.push(sum);
        } else {
            c.print_bw(pr, &l)?;
            c.check_limits(&l)?;
            lines.push(l);
        }
        if cfg.all_sizes {
            ses.hand_shake(h)?;
        }
    }
    c.result_line(pr)?;
    ses.close(h)?;
    if receiver && cfg.verify {
        *verify = checker.finish();
    }
    Ok(Report::Bw(lines))
}

/// The latency tests.
fn latency(
    c: &Ctl<'_>,
    ep: &Endpoint<'_>,
    ses: &mut Session,
    ours: &[KeyMsg],
    theirs: &[KeyMsg],
    pr: &mut Printer<'_>,
) -> Result<Report, PerfError> {
    let cfg = c.cfg;
    let h = &ours[0];
    let t = &theirs[0];
    let mut lat = Vec::new();
    let mut dur = Vec::new();
    let mut record = |pr: &mut Printer<'_>, r: lat::LatResult| -> Result<(), PerfError> {
        match r {
            lat::LatResult::Iterations(l) => {
                if c.full() {
                    pr.line(&report::lat_text(&l))?;
                } else {
                    pr.line(&report::output_lat(&l))?;
                }
                if let Some(p) = &cfg.out_json {
                    std::fs::write(p, report::json_lat(cfg, c.info, &l))?;
                }
                lat.push(l);
            }
            lat::LatResult::Duration(l) => {
                if c.full() {
                    pr.line(&report::lat_duration_text(&l))?;
                } else {
                    pr.line(&format!("{:.6}", l.t_avg))?;
                }
                if let Some(p) = &cfg.out_json {
                    std::fs::write(p, report::json_lat_duration(cfg, c.info, &l))?;
                }
                dur.push(l);
            }
        }
        Ok(())
    };
    match cfg.test {
        Test::SendLat => {
            c.result_header(pr)?;
            for size in cfg.sizes() {
                bw::post_receives(ep, cfg, size)?;
                // "so the client won't send packets before the server has posted his
                // receive wqes"
                ses.hand_shake(h)?;
                let r = lat::run_send(c, ep, size, pr)?;
                record(pr, r)?;
            }
            c.result_line(pr)?;
            ses.close(h)?;
        }
        Test::WriteLat => {
            c.result_header(pr)?;
            for size in cfg.sizes() {
                let r = lat::run_write(c, ep, t, size, pr)?;
                record(pr, r)?;
            }
            c.result_line(pr)?;
        }
        Test::ReadLat | Test::AtomicLat => {
            if c.machine == Role::Server {
                // Only the client posts; the server's NIC answers.
                ses.close(h)?;
                c.result_line(pr)?;
            } else {
                c.result_header(pr)?;
                for size in cfg.sizes() {
                    let r = lat::run_read(c, ep, t, size, pr)?;
                    record(pr, r)?;
                }
                ses.close(h)?;
                c.result_line(pr)?;
            }
        }
        _ => unreachable!("not a latency test"),
    }
    Ok(if cfg.duration.is_some() {
        Report::LatDuration(dur)
    } else {
        Report::Lat(lat)
    })
}

/// perftest's result header (for callers that print results themselves).
pub fn header(cfg: &PerfConfig) -> String {
    report::result_header(cfg).to_string()
}

/// perftest's result lines.
pub fn lines(r: &Report) -> Vec<String> {
    report::lines(r, true)
}

/// perftest's "local address" / "remote address" lines.
pub fn address_lines(ours: &[KeyMsg], theirs: &[KeyMsg], verb: Verb) -> Vec<String> {
    ours.iter()
        .map(|k| report::address_text("local", k, verb))
        .chain(
            theirs
                .iter()
                .map(|k| report::address_text("remote", k, verb)),
        )
        .collect()
}
