//! perftest-style tests over a running [`Nic`]: `write-bw`, `read-bw`, `send-bw`,
//! `atomic-bw`, `send-lat`, `write-lat`, `read-lat`, with perftest's out-of-band exchange
//! ([`crate::oob::perftest`]) so either end can be ferroce or the real `ib_*` tool.
//!
//! Roles as in perftest: the server waits for a connection on TCP 18515, the client connects.
//! In the bandwidth tests the client is the active side (for `send-bw` the server posts the
//! receives); in the latency tests both sides take part in each round trip (`read-lat`:
//! only the client).

use crate::oob::perftest::{BwReport, KeyMsg, Role, Session};
use crate::oob::CmError;
use crate::runtime::Nic;
use crate::verbs::{
    gid_of, ip_of_gid, Cq, MemoryRegion, RcParams, RecvWr, RemoteQp, SendFlags, SendOp, SendWr,
    Sge, VerbsError, WcStatus, WorkCompletion,
};
use crate::verbs::{AccessFlags, Mtu, QpCap};
use crate::wire::{MacAddr, QpNumber, RKey};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The seven tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    WriteBw,
    ReadBw,
    SendBw,
    AtomicBw,
    SendLat,
    WriteLat,
    ReadLat,
}

impl Test {
    pub fn from_name(s: &str) -> Option<Test> {
        Some(match s {
            "write-bw" | "write_bw" => Test::WriteBw,
            "read-bw" | "read_bw" => Test::ReadBw,
            "send-bw" | "send_bw" => Test::SendBw,
            "atomic-bw" | "atomic_bw" => Test::AtomicBw,
            "send-lat" | "send_lat" => Test::SendLat,
            "write-lat" | "write_lat" => Test::WriteLat,
            "read-lat" | "read_lat" => Test::ReadLat,
            _ => return None,
        })
    }
    pub fn is_bw(self) -> bool {
        matches!(
            self,
            Test::WriteBw | Test::ReadBw | Test::SendBw | Test::AtomicBw
        )
    }
    /// perftest's banner title.
    pub fn title(self) -> &'static str {
        match self {
            Test::WriteBw => "RDMA_Write BW Test",
            Test::ReadBw => "RDMA_Read BW Test",
            Test::SendBw => "Send BW Test",
            Test::AtomicBw => "Atomic FETCH_AND_ADD BW Test",
            Test::SendLat => "Send Latency Test",
            Test::WriteLat => "RDMA_Write Latency Test",
            Test::ReadLat => "RDMA_Read Latency Test",
        }
    }
    fn out_reads(self) -> u16 {
        if matches!(self, Test::ReadBw | Test::AtomicBw | Test::ReadLat) {
            16
        } else {
            1
        }
    }
}

/// Test parameters (perftest's flags).
#[derive(Clone, Debug)]
pub struct PerfConfig {
    pub test: Test,
    /// `-s`: message size.
    pub size: u32,
    /// `-a`: all sizes 2 B .. 8 MiB (powers of two).
    pub all_sizes: bool,
    /// `-n`: iterations (per QP).
    pub iters: u64,
    /// `-D`: run for this long instead of a number of iterations (bandwidth tests).
    pub duration: Option<Duration>,
    /// `-q`: QPs (bandwidth tests).
    pub qps: u32,
    /// `-m`: path MTU.
    pub mtu: Mtu,
    /// `-t`: send queue depth.
    pub tx_depth: u32,
    /// `--report_gbits`.
    pub report_gbits: bool,
    /// `-A CMP_AND_SWAP` (default FETCH_AND_ADD) for atomic-bw.
    pub cmp_swap: bool,
    /// `-x`: GID index.
    pub gid_index: u8,
    /// Out-of-band read timeout.
    pub timeout: Duration,
    /// Print a progress line every second on long runs.
    pub progress: bool,
    /// Check payloads byte for byte (see [`Verify`]).
    pub verify: bool,
    /// Seed of the pattern ferroce sends with `verify` (write-bw / send-bw client).
    pub verify_seed: u64,
    /// `-u`: the QPs' local ACK timeout, 4.096 µs × 2^t (0: none; perftest's default 14,
    /// 67 ms).
    pub qp_timeout: u8,
}

impl Default for PerfConfig {
    fn default() -> Self {
        PerfConfig {
            test: Test::WriteBw,
            size: 65536,
            all_sizes: false,
            iters: 5000,
            duration: None,
            qps: 1,
            mtu: Mtu::M4096,
            tx_depth: 128,
            report_gbits: false,
            cmp_swap: false,
            gid_index: 0,
            timeout: Duration::from_secs(20),
            progress: true,
            verify: false,
            verify_seed: 0x5eed,
            qp_timeout: 14,
        }
    }
}

/// Why a test failed.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    #[error(transparent)]
    Cm(#[from] CmError),
    #[error("verbs: {0}")]
    Verbs(#[from] VerbsError),
    #[error("work completion {wr_id} failed: {status}")]
    Completion { wr_id: u64, status: WcStatus },
    #[error("no progress for {0:?}")]
    Stalled(Duration),
    #[error("cannot resolve the MAC address of {0}")]
    Neighbour(IpAddr),
    #[error("data check failed: {0}")]
    Verify(String),
}

/// One line of results.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BwLine {
    pub bytes: u32,
    pub iterations: u64,
    /// MB/s (10^6 bytes), or Gb/s with `report_gbits`.
    pub bw_peak: f64,
    pub bw_avg: f64,
    pub msg_rate_mpps: f64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct LatLine {
    pub bytes: u32,
    pub iterations: u64,
    pub t_min: f64,
    pub t_max: f64,
    pub t_typical: f64,
    pub t_avg: f64,
    pub t_stdev: f64,
    pub p99: f64,
    pub p999: f64,
}

/// The result of a run.
#[derive(Clone, Debug, serde::Serialize)]
pub enum Report {
    Bw(Vec<BwLine>),
    Lat(Vec<LatLine>),
}

/// The verbs objects one side of a test uses.
///
/// The memory is laid out as perftest lays out its own (`alloc_ctx`, `set_up_connection`):
/// each QP has a send half and a receive half of `half` bytes, `max(size, page)` rounded up to
/// a cache line, and the key message advertises the **receive half**. A perftest peer targets
/// exactly that address and, for messages of at most half a page, walks forward through the
/// page (`increase_rem_addr`), so the receive half must be at least a page long.
pub struct Endpoint<'a> {
    pub nic: &'a Nic,
    pub cq: Cq,
    pub qps: Vec<QpNumber>,
    pub mr: MemoryRegion,
    /// Bytes of the MR each QP uses (its send half and receive half).
    pub slot: usize,
    /// Bytes of each half.
    pub half: usize,
    pub psns: Vec<u32>,
    /// With `verify`, read-bw's destination: one message-sized slot per send queue entry.
    pub vbuf: Option<MemoryRegion>,
}

/// perftest's cycle buffer (the page size it exchanges) and cache line.
pub const PAGE: usize = 4096;
pub const CACHE_LINE: usize = 64;

/// perftest's `INC(BUFF_SIZE(size, page), line)`: the size of each half of a QP's buffer.
pub fn perftest_half(size: usize, page: usize, line: usize) -> usize {
    let b = size.max(page);
    let line = line.max(1);
    b.div_ceil(line) * line
}

/// Move a fresh QP to INIT (as `ibv_modify_qp` to INIT right after `ibv_create_qp`), so that
/// receives can be posted before the connection is made.
pub fn qp_to_init(nic: &Nic, qpn: QpNumber, access: AccessFlags) -> Result<(), VerbsError> {
    let (a, mask) = crate::verbs::RcParams {
        access,
        ..Default::default()
    }
    .init_attr();
    nic.modify_qp(qpn, &a, mask)
}

fn sizes(cfg: &PerfConfig) -> Vec<u32> {
    if cfg.all_sizes {
        let top = if cfg.test == Test::AtomicBw {
            8
        } else {
            1 << 23
        };
        (1..=23).map(|i| 1u32 << i).filter(|&s| s <= top).collect()
    } else if cfg.test == Test::AtomicBw {
        vec![8]
    } else {
        vec![cfg.size]
    }
}

fn max_size(cfg: &PerfConfig) -> usize {
    sizes(cfg).into_iter().max().unwrap_or(8).max(8) as usize
}

/// Create the CQ, QPs and memory for one side.
pub fn setup<'a>(nic: &'a Nic, cfg: &PerfConfig) -> Result<Endpoint<'a>, PerfError> {
    let qps = if cfg.test.is_bw() { cfg.qps.max(1) } else { 1 };
    let pd = nic.alloc_pd();
    let depth = (cfg.tx_depth as usize * 2 + 16) * qps as usize;
    let cq = nic.create_cq(depth.max(256))?;
    let cap = QpCap {
        max_send_wr: cfg.tx_depth,
        max_recv_wr: cfg.tx_depth.max(64),
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let half = perftest_half(max_size(cfg), PAGE, CACHE_LINE);
    let slot = half * 2;
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = nic.reg_mr(pd, slot * qps as usize, all)?;
    if cfg.verify {
        // What ferroce sends (write-bw, send-bw): pattern message q in QP q's send half.
        for q in 0..qps as usize {
            let len = max_size(cfg);
            let p = crate::apps::pattern::expected(len, cfg.verify_seed, q as u64, false);
            mr.write(q * slot, &p)
                .map_err(|_| PerfError::Verify("pattern does not fit".into()))?;
        }
    }
    let vbuf = if cfg.verify && matches!(cfg.test, Test::ReadBw | Test::AtomicBw) {
        let n = cfg.tx_depth as usize * qps as usize * max_size(cfg);
        Some(nic.reg_mr(pd, n, AccessFlags::LOCAL_WRITE)?)
    } else {
        None
    };
    let mut v = Vec::new();
    let mut psns = Vec::new();
    for i in 0..qps {
        let q = crate::runtime::create_rc_qp(nic, pd, cq, cap)?;
        qp_to_init(nic, q, RcParams::default().access)?;
        v.push(q);
        // perftest draws PSNs with lrand48; any 24-bit value will do.
        psns.push((0x1f_0000u32.wrapping_mul(i + 7) ^ (std::process::id() << 4)) & 0xff_ffff);
    }
    Ok(Endpoint {
        nic,
        cq,
        qps: v,
        mr,
        slot,
        half,
        psns,
        vbuf,
    })
}

impl Endpoint<'_> {
    /// The key messages describing this side.
    pub fn keys(&self, cfg: &PerfConfig) -> Result<Vec<KeyMsg>, PerfError> {
        let gid = self
            .nic
            .with_device(|d| d.gid(usize::from(cfg.gid_index)))
            .ok_or(PerfError::Verbs(VerbsError::BadAddressVector(
                "GID index not in the table",
            )))?;
        Ok(self
            .qps
            .iter()
            .enumerate()
            .map(|(i, q)| KeyMsg {
                lid: 0,
                out_reads: cfg.test.out_reads(),
                qpn: q.get(),
                psn: self.psns[i],
                rkey: self.mr.rkey().0,
                // The receive half, as perftest advertises it.
                vaddr: self.mr.addr() + (i * self.slot + self.half) as u64,
                gid,
                srqn: 0,
            })
            .collect())
    }

    /// Connect each QP to the peer's, resolving MAC addresses with `resolve`.
    pub fn connect(
        &self,
        cfg: &PerfConfig,
        mtu: Mtu,
        theirs: &[KeyMsg],
        resolve: &dyn Fn(IpAddr) -> Option<MacAddr>,
    ) -> Result<(), PerfError> {
        for (i, q) in self.qps.iter().enumerate() {
            let t = theirs.get(i).ok_or(CmError::Malformed {
                what: "key messages",
                detail: "fewer QPs than ours".into(),
            })?;
            let ip = ip_of_gid(t.gid);
            let mac = resolve(ip).ok_or(PerfError::Neighbour(ip))?;
            let remote = RemoteQp {
                qpn: QpNumber::new(t.qpn),
                gid: t.gid,
                mac,
                psn: t.psn,
            };
            let p = RcParams {
                mtu,
                sgid_index: cfg.gid_index,
                local_psn: self.psns[i],
                max_rd_atomic: t.out_reads.clamp(1, 16) as u8,
                max_dest_rd_atomic: 16,
                timeout: cfg.qp_timeout.min(31),
                ..RcParams::default()
            };
            self.nic.connect_rc(*q, &remote, &p)?;
        }
        Ok(())
    }

    fn sge(&self, qp: usize, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.mr.addr() + (qp * self.slot + off) as u64,
            length: len,
            lkey: self.mr.lkey(),
        }
    }
}

fn check(wc: &WorkCompletion) -> Result<(), PerfError> {
    if wc.status == WcStatus::Success {
        Ok(())
    } else {
        Err(PerfError::Completion {
            wr_id: wc.wr_id,
            status: wc.status,
        })
    }
}

fn units(cfg: &PerfConfig, bytes_per_s: f64) -> f64 {
    if cfg.report_gbits {
        bytes_per_s * 8.0 / 1e9
    } else {
        bytes_per_s / 1e6
    }
}

/// What `verify` checked, for the report.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct VerifyReport {
    /// Messages whose every byte was compared.
    pub messages: u64,
    /// Bytes compared.
    pub bytes: u64,
    /// What the bytes were compared with.
    pub against: String,
}

/// read-bw's check of each message read from a perftest peer: perftest filled its buffer
/// with `(char)rand()` after `srand(time(NULL))`, and advertised the receive half, which is
/// `(qps + q) * half` bytes into that stream.
struct ReadCheck {
    seed: Option<u32>,
    want: Vec<Vec<u8>>,
    tmp: Vec<u8>,
    report: VerifyReport,
}

impl ReadCheck {
    fn check(
        &mut self,
        ep: &Endpoint<'_>,
        cfg: &PerfConfig,
        peer_half: usize,
        q: usize,
        i: u64,
        size: u32,
    ) -> Result<(), PerfError> {
        let Some(vbuf) = &ep.vbuf else {
            return Ok(());
        };
        let nq = ep.qps.len();
        let len = size as usize;
        let off = (q * cfg.tx_depth as usize + (i % u64::from(cfg.tx_depth)) as usize) * len;
        self.tmp.resize(len, 0);
        vbuf.read(off, &mut self.tmp)
            .map_err(|e| PerfError::Verify(e.to_string()))?;
        let stream_off = (nq + q) * peer_half;
        if self.seed.is_none() {
            let now = crate::apps::pattern::unix_now();
            let seed = crate::apps::pattern::find_glibc_seed(&self.tmp, stream_off, now, 900, 300)
                .ok_or_else(|| {
                    PerfError::Verify(format!(
                        "message {i} of QP {q} is not perftest's srand(time)/rand() fill at offset {stream_off} for any second within 900 s before to 300 s after now (first bytes {:02x?})",
                        &self.tmp[..len.min(8)]
                    ))
                })?;
            self.seed = Some(seed);
            self.report.against = format!(
                "the peer's buffer as perftest fills it: glibc srand({seed}) then (char)rand() per byte, from byte {stream_off}"
            );
        }
        if self.want.len() <= q {
            let seed = self.seed.unwrap_or(0);
            self.want = (0..nq)
                .map(|k| crate::apps::pattern::glibc_bytes(seed, (nq + k) * peer_half, len))
                .collect();
        }
        if let Some((at, got, want, n)) =
            crate::apps::pattern::first_mismatch(&self.tmp, &self.want[q])
        {
            return Err(PerfError::Verify(format!(
                "READ {i} of QP {q}: {n} of {len} bytes differ, the first at byte {at}: got {got:#04x}, expected {want:#04x}"
            )));
        }
        self.report.messages += 1;
        self.report.bytes += len as u64;
        Ok(())
    }
}

/// atomic-bw's check (`verify`): every ATOMIC gets its own result slot and is signaled, and
/// the original values it returns must tell that each operation ran exactly once, in order:
/// - FETCH_AND_ADD (add 1): result i is result 0 + i;
/// - CMP_AND_SWAP: operation 0 compares with 0 and swaps in 0 (it only reads), then
///   operation i compares with `c(i-1)` and swaps in `c(i)` (`c(0)` = result 0,
///   `c(k) = c(0) + k * K`), so each must succeed and return `c(i-1)`; a swap done twice or
///   not at all breaks the chain;
/// - result 0, the peer's memory before the test, must be perftest's `(char)rand()` fill
///   after `srand(time(NULL))` at the advertised address.
struct AtomicCheck {
    base: Vec<Option<u64>>,
    seed: Option<u32>,
    report: VerifyReport,
}

const CAS_STEP: u64 = 0x9e37_79b9_7f4a_7c15;

impl AtomicCheck {
    fn chain(base: u64, k: u64) -> u64 {
        base.wrapping_add(k.wrapping_mul(CAS_STEP))
    }

    fn check(
        &mut self,
        ep: &Endpoint<'_>,
        cfg: &PerfConfig,
        peer_half: usize,
        q: usize,
        i: u64,
    ) -> Result<(), PerfError> {
        let Some(vbuf) = &ep.vbuf else {
            return Ok(());
        };
        let off = (q * cfg.tx_depth as usize + (i % u64::from(cfg.tx_depth)) as usize) * 8;
        let mut b = [0u8; 8];
        vbuf.read(off, &mut b)
            .map_err(|e| PerfError::Verify(e.to_string()))?;
        // The original value arrives in host byte order: the bytes of the peer's memory.
        let r = u64::from_ne_bytes(b);
        if i == 0 {
            let nq = ep.qps.len();
            let stream_off = (nq + q) * peer_half;
            let seed = match self.seed {
                Some(s) => s,
                None => {
                    let now = crate::apps::pattern::unix_now();
                    let s = crate::apps::pattern::find_glibc_seed(&b, stream_off, now, 900, 300)
                        .ok_or_else(|| {
                            PerfError::Verify(format!(
                                "QP {q}: the peer's memory before the first ATOMIC ({b:02x?}) is not perftest's srand(time)/rand() fill at offset {stream_off} for any second within 900 s before to 300 s after now"
                            ))
                        })?;
                    self.seed = Some(s);
                    s
                }
            };
            let want = crate::apps::pattern::glibc_bytes(seed, stream_off, 8);
            if want != b {
                return Err(PerfError::Verify(format!(
                    "QP {q}: first ATOMIC returned {b:02x?}, the peer's buffer holds {want:02x?}"
                )));
            }
            self.base[q] = Some(r);
            self.report.against = format!(
                "exactly-once {} results, the first equal to the peer's buffer as perftest fills it (glibc srand({seed}), from byte {stream_off})",
                if cfg.cmp_swap { "CMP_AND_SWAP chain" } else { "FETCH_AND_ADD +1" }
            );
        } else {
            let base = self.base[q].ok_or_else(|| {
                PerfError::Verify(format!("QP {q}: ATOMIC {i} completed before ATOMIC 0"))
            })?;
            let want = if cfg.cmp_swap {
                Self::chain(base, i - 1)
            } else {
                base.wrapping_add(i)
            };
            if r != want {
                return Err(PerfError::Verify(format!(
                    "QP {q}: ATOMIC {i} returned {r:#018x}, expected {want:#018x} (an operation ran twice, not at all, or out of order)"
                )));
            }
        }
        self.report.messages += 1;
        self.report.bytes += 8;
        Ok(())
    }
}

/// The active side of a bandwidth test for one size.
fn bw_active(
    ep: &Endpoint<'_>,
    cfg: &PerfConfig,
    theirs: &[KeyMsg],
    size: u32,
    peer_half: usize,
    verify: &mut Option<VerifyReport>,
) -> Result<BwLine, PerfError> {
    let nq = ep.qps.len();
    let per_qp = cfg.iters;
    let deadline = cfg.duration.map(|d| Instant::now() + d);
    let mut posted = vec![0u64; nq];
    let mut done = vec![0u64; nq];
    let mut outstanding = vec![0u32; nq];
    let mut rcheck = (ep.vbuf.is_some() && cfg.test == Test::ReadBw).then(|| ReadCheck {
        seed: None,
        want: Vec::new(),
        tmp: Vec::new(),
        report: VerifyReport::default(),
    });
    let mut acheck = (ep.vbuf.is_some() && cfg.test == Test::AtomicBw).then(|| AtomicCheck {
        base: vec![None; nq],
        seed: None,
        report: VerifyReport::default(),
    });
    // With a read or atomic check every request is signaled, so that each is checked when it
    // completes.
    let signal_every = if rcheck.is_some() || acheck.is_some() {
        1
    } else {
        (cfg.tx_depth / 4).max(1) as u64
    };
    let mut wcs = Vec::with_capacity(256);
    let t0 = Instant::now();
    let mut last_progress = t0;
    let mut last_change = t0;
    let mut marks: Vec<(Instant, u64)> = vec![(t0, 0)];
    let target_done = |d: &[u64]| d.iter().sum::<u64>();
    loop {
        let time_up = deadline.is_some_and(|d| Instant::now() >= d);
        let all_posted = time_up || posted.iter().all(|&p| p >= per_qp);
        for q in 0..nq {
            while !time_up
                && (deadline.is_some() || posted[q] < per_qp)
                && outstanding[q] < cfg.tx_depth
            {
                let i = posted[q];
                // The CMP_AND_SWAP chain needs the first result before the second operation.
                let chain_base = acheck.as_ref().and_then(|a| a.base[q]);
                if cfg.cmp_swap && acheck.is_some() && i > 0 && chain_base.is_none() {
                    break;
                }
                let last = deadline.is_none() && i + 1 == per_qp;
                let flags = if (i + 1) % signal_every == 0 || last {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::empty()
                };
                // Exactly the address the peer advertised (its receive half).
                let remote = theirs[q].vaddr;
                let rkey = RKey(theirs[q].rkey);
                let (op, len) = match cfg.test {
                    Test::WriteBw => (
                        SendOp::RdmaWrite {
                            remote_addr: remote,
                            rkey,
                        },
                        size,
                    ),
                    Test::ReadBw => (
                        SendOp::RdmaRead {
                            remote_addr: remote,
                            rkey,
                        },
                        size,
                    ),
                    Test::SendBw => (SendOp::Send, size),
                    Test::AtomicBw if cfg.cmp_swap => {
                        let (compare, swap) = match chain_base {
                            Some(b) if i > 0 => {
                                (AtomicCheck::chain(b, i - 1), AtomicCheck::chain(b, i))
                            }
                            _ if acheck.is_some() => (0, 0),
                            _ => (0, i),
                        };
                        (
                            SendOp::AtomicCmpSwp {
                                remote_addr: remote,
                                rkey,
                                compare,
                                swap,
                            },
                            8,
                        )
                    }
                    _ => (
                        SendOp::AtomicFetchAdd {
                            remote_addr: remote,
                            rkey,
                            add: 1,
                        },
                        8,
                    ),
                };
                let sge = match (&ep.vbuf, cfg.test) {
                    (Some(vb), Test::ReadBw | Test::AtomicBw) => Sge {
                        addr: vb.addr()
                            + ((q * cfg.tx_depth as usize + (i % u64::from(cfg.tx_depth)) as usize)
                                * len as usize) as u64,
                        length: len,
                        lkey: vb.lkey(),
                    },
                    (_, Test::ReadBw) => ep.sge(q, ep.half, len),
                    _ => ep.sge(q, 0, len),
                };
                let wr = SendWr {
                    wr_id: (q as u64) << 48 | i,
                    op,
                    sg_list: vec![sge],
                    flags,
                };
                match ep.nic.post_send(ep.qps[q], wr) {
                    Ok(()) => {
                        posted[q] += 1;
                        outstanding[q] += 1;
                    }
                    Err(VerbsError::QueueFull) => break,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        wcs.clear();
        ep.nic.poll_cq(ep.cq, &mut wcs, 256)?;
        if wcs.is_empty() {
            if all_posted && (0..nq).all(|q| done[q] >= posted[q]) {
                break;
            }
            if last_change.elapsed() > cfg.timeout {
                return Err(PerfError::Stalled(cfg.timeout));
            }
            ep.nic.wait_cq(ep.cq, Duration::from_millis(1))?;
            continue;
        }
        last_change = Instant::now();
        for wc in &wcs {
            check(wc)?;
            let q = (wc.wr_id >> 48) as usize;
            let i = wc.wr_id & 0xffff_ffff_ffff;
            // A signaled completion retires every earlier request of its QP.
            let n = i + 1 - done[q];
            done[q] = i + 1;
            outstanding[q] -= n as u32;
            if let Some(rc) = rcheck.as_mut() {
                rc.check(ep, cfg, peer_half, q, i, size)?;
            }
            if let Some(ac) = acheck.as_mut() {
                ac.check(ep, cfg, peer_half, q, i)?;
            }
        }
        let total = target_done(&done);
        marks.push((last_change, total));
        if cfg.progress && last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            let secs = t0.elapsed().as_secs_f64();
            eprintln!(
                "  ... {total} messages in {secs:.1} s, {:.2} {}",
                units(cfg, total as f64 * f64::from(size) / secs),
                if cfg.report_gbits { "Gb/s" } else { "MB/s" }
            );
        }
    }
    let elapsed = t0.elapsed().as_secs_f64().max(1e-9);
    let total = target_done(&done);
    // Peak: the best rate over any stretch of at least a tenth of the run.
    let min_span = (total / 10).max(1);
    let mut peak = 0f64;
    let mut j = 0;
    for i in 0..marks.len() {
        while j < i && marks[i].1 - marks[j + 1].1 >= min_span {
            j += 1;
        }
        let (dt, dn) = (
            marks[i].0.duration_since(marks[j].0).as_secs_f64(),
            marks[i].1 - marks[j].1,
        );
        if dn >= min_span && dt > 0.0 {
            peak = peak.max(dn as f64 / dt);
        }
    }
    let avg = total as f64 / elapsed;
    let peak = peak.max(avg);
    if let Some(rc) = rcheck {
        *verify = Some(rc.report);
    }
    if let Some(ac) = acheck {
        *verify = Some(ac.report);
    }
    Ok(BwLine {
        bytes: size,
        iterations: total / nq as u64,
        bw_peak: units(cfg, peak * f64::from(size)),
        bw_avg: units(cfg, avg * f64::from(size)),
        msg_rate_mpps: avg / 1e6,
    })
}

/// send-bw's receiver posts its receives before the last barrier, as perftest does
/// (`ctx_set_recv_wqes` before `ctx_hand_shake`), so the sender never meets an empty queue.
fn post_initial_recvs(
    ep: &Endpoint<'_>,
    cfg: &PerfConfig,
    size: u32,
) -> Result<Vec<u64>, PerfError> {
    let nq = ep.qps.len();
    let depth = cfg.tx_depth.max(64);
    let mut next = vec![0u64; nq];
    for (q, n) in next.iter_mut().enumerate() {
        for _ in 0..depth {
            ep.nic.post_recv(
                ep.qps[q],
                RecvWr {
                    wr_id: (q as u64) << 48 | *n,
                    sg_list: vec![ep.sge(q, ep.half, size.max(1))],
                },
            )?;
            *n += 1;
        }
    }
    Ok(next)
}

/// The passive side of send-bw: keep receives posted until `expect` messages arrived.
fn bw_receiver(
    ep: &Endpoint<'_>,
    cfg: &PerfConfig,
    _size: u32,
    expect: Option<u64>,
    mut next: Vec<u64>,
) -> Result<(u64, Vec<u64>, f64), PerfError> {
    let rlen = max_size(cfg) as u32;
    let mut got = 0u64;
    let mut wcs = Vec::new();
    let t0 = Instant::now();
    let mut last = t0;
    let stop_after = cfg
        .duration
        .map(|d| Instant::now() + d + Duration::from_secs(2));
    loop {
        if let Some(e) = expect {
            if got >= e {
                break;
            }
        }
        if stop_after.is_some_and(|t| Instant::now() > t) {
            break;
        }
        wcs.clear();
        ep.nic.poll_cq(ep.cq, &mut wcs, 256)?;
        if wcs.is_empty() {
            if last.elapsed() > cfg.timeout {
                return Err(PerfError::Stalled(cfg.timeout));
            }
            ep.nic.wait_cq(ep.cq, Duration::from_millis(1))?;
            continue;
        }
        last = Instant::now();
        for wc in &wcs {
            check(wc)?;
            got += 1;
            let q = (wc.wr_id >> 48) as usize;
            ep.nic.post_recv(
                ep.qps[q],
                RecvWr {
                    wr_id: (q as u64) << 48 | next[q],
                    sg_list: vec![ep.sge(q, ep.half, rlen)],
                },
            )?;
            next[q] += 1;
        }
    }
    Ok((got, next, last.duration_since(t0).as_secs_f64()))
}

fn lat_stats(size: u32, mut us: Vec<f64>) -> LatLine {
    us.sort_by(|a, b| a.total_cmp(b));
    let n = us.len().max(1);
    let avg = us.iter().sum::<f64>() / n as f64;
    let var = us.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
    let pct = |p: f64| {
        us.get(
            ((n as f64 * p).ceil() as usize)
                .saturating_sub(1)
                .min(n - 1),
        )
        .copied()
        .unwrap_or(0.0)
    };
    LatLine {
        bytes: size,
        iterations: us.len() as u64,
        t_min: us.first().copied().unwrap_or(0.0),
        t_max: us.last().copied().unwrap_or(0.0),
        t_typical: pct(0.5),
        t_avg: avg,
        t_stdev: var.sqrt(),
        p99: pct(0.99),
        p999: pct(0.999),
    }
}

/// How long a latency test busy-polls its CQ before it sleeps on it. Spinning for ever
/// starves the engine thread when cores are scarce (a shared host, a QEMU peer on the same
/// cores): the engine then waits a scheduler slice, milliseconds, for every packet.
const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);

/// Wait for one completion (busy-polling first: this is a latency test) and check it.
fn wait_one(
    ep: &Endpoint<'_>,
    buf: &mut Vec<WorkCompletion>,
    timeout: Duration,
) -> Result<WorkCompletion, PerfError> {
    let t0 = Instant::now();
    loop {
        buf.clear();
        if ep.nic.poll_cq(ep.cq, buf, 1)? == 1 {
            check(&buf[0])?;
            return Ok(buf[0]);
        }
        let waited = t0.elapsed();
        if waited > timeout {
            return Err(PerfError::Stalled(timeout));
        }
        if waited < SPIN_BEFORE_SLEEP {
            std::hint::spin_loop();
        } else {
            ep.nic.wait_cq(ep.cq, Duration::from_millis(1))?;
        }
    }
}

/// One latency run for one size. Both sides call it (`role` decides who starts).
fn lat_run(
    ep: &Endpoint<'_>,
    cfg: &PerfConfig,
    theirs: &KeyMsg,
    size: u32,
    role: Role,
) -> Result<Option<LatLine>, PerfError> {
    let iters = cfg.iters.max(1);
    let mut samples = Vec::with_capacity(iters as usize);
    let mut buf = Vec::new();
    let q = ep.qps[0];
    let remote = theirs.vaddr;
    let rkey = RKey(theirs.rkey);
    let len = size.max(1);
    match cfg.test {
        Test::SendLat => {
            // The receives were posted before the last barrier (see `run`). Completions are
            // counted in whatever order they come: with a delayed ACK the peer's next message
            // can arrive before the ACK that completes our last send.
            let (mut sends, mut recvs) = (0u64, 0u64);
            let mut take = |sends: &mut u64, recvs: &mut u64| -> Result<(), PerfError> {
                let wc = wait_one(ep, &mut buf, cfg.timeout)?;
                if wc.opcode == crate::verbs::WcOpcode::Recv {
                    *recvs += 1;
                    ep.nic.post_recv(
                        q,
                        RecvWr {
                            wr_id: wc.wr_id,
                            sg_list: vec![ep.sge(0, ep.half, len)],
                        },
                    )?;
                } else {
                    *sends += 1;
                }
                Ok(())
            };
            // Like ib_send_lat, an iteration ends with the peer's message; our send's
            // completion only has to come before the next send (one send in flight).
            for i in 0..iters {
                let t0 = Instant::now();
                if role == Role::Server {
                    // Answer message i once it is here (and our last answer is complete).
                    while recvs <= i || sends < i {
                        take(&mut sends, &mut recvs)?;
                    }
                }
                ep.nic
                    .post_send(q, SendWr::new(i, SendOp::Send, vec![ep.sge(0, 0, size)]))?;
                if role == Role::Client {
                    while recvs <= i || sends < i {
                        take(&mut sends, &mut recvs)?;
                    }
                }
                samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
            while sends < iters {
                take(&mut sends, &mut recvs)?;
            }
        }
        Test::WriteLat => {
            // The last byte of each message carries the iteration number as perftest's
            // `(char)++scnt` (1, 2, ..., 255, 0, 1, ...); the receiver spins on its own memory
            // (the receive half) until it has the value it expects (`(char)rcnt`). In
            // ib_write_lat the server writes first and the client answers (seen against
            // perftest 4.5-0.17 on rxe, rxe to rxe as well): a client that wrote first would
            // get ahead, and its second write would overwrite the first before the server
            // looked for it.
            let mark_off = ep.half + len as usize - 1;
            for i in 0..iters {
                let tag = (i + 1) as u8;
                let t0 = Instant::now();
                let wait_tag = |t: Instant| -> Result<(), PerfError> {
                    let spin_from = Instant::now();
                    while ep.mr.with_bytes(|b| b[mark_off]) != tag {
                        if t.elapsed() > cfg.timeout {
                            return Err(PerfError::Stalled(cfg.timeout));
                        }
                        // No completion tells of a remote WRITE: spin, then let the engine
                        // have the core (see SPIN_BEFORE_SLEEP).
                        // With an inline engine this thread is what runs it.
                        if ep.nic.progress() > 0 {
                            continue;
                        }
                        if spin_from.elapsed() < SPIN_BEFORE_SLEEP {
                            std::hint::spin_loop();
                        } else {
                            std::thread::sleep(Duration::from_micros(20));
                        }
                    }
                    Ok(())
                };
                if role == Role::Client {
                    wait_tag(t0)?;
                }
                // Our previous WRITE's completion: its ACK comes with or right behind the
                // peer's WRITE just seen (a delayed ACK follows the peer's next request), so it
                // is not waited for before the peer's answer, as in ib_write_lat.
                if i > 0 {
                    wait_one(ep, &mut buf, cfg.timeout)?;
                }
                ep.mr
                    .write(len as usize - 1, &[tag])
                    .map_err(|_| PerfError::Stalled(cfg.timeout))?;
                ep.nic.post_send(
                    q,
                    SendWr::new(
                        i,
                        SendOp::RdmaWrite {
                            remote_addr: remote,
                            rkey,
                        },
                        vec![ep.sge(0, 0, len)],
                    ),
                )?;
                if role == Role::Server {
                    wait_tag(t0)?;
                }
                samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
            wait_one(ep, &mut buf, cfg.timeout)?;
        }
        _ => {
            if role == Role::Server {
                return Ok(None);
            }
            for i in 0..iters {
                let t0 = Instant::now();
                ep.nic.post_send(
                    q,
                    SendWr::new(
                        i,
                        SendOp::RdmaRead {
                            remote_addr: remote,
                            rkey,
                        },
                        vec![ep.sge(0, 0, len)],
                    ),
                )?;
                wait_one(ep, &mut buf, cfg.timeout)?;
                samples.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    Ok(Some(lat_stats(size, samples)))
}

/// The passive side's check after write-bw / send-bw from a perftest client: the client
/// sends from the start of its own buffer (QP q from `q * max(size, page)`), which perftest
/// filled with `(char)rand()` after `srand(time(NULL))`, so the last message received must
/// be those bytes. (Every message carries the same bytes, so only the last one is seen here.)
/// A ferroce client run with `--verify` sends message q of its own pattern on QP q instead
/// (same `--verify-seed` on both sides): that is accepted too, for every QP or for none.
fn passive_check(
    ep: &Endpoint<'_>,
    cfg: &PerfConfig,
    size: u32,
    peer_page: usize,
) -> Result<VerifyReport, PerfError> {
    let len = size as usize;
    let mut rep = VerifyReport::default();
    let mut seed = None;
    let mut got_all = Vec::with_capacity(ep.qps.len());
    for q in 0..ep.qps.len() {
        let mut got = vec![0u8; len];
        ep.mr
            .read(q * ep.slot + ep.half, &mut got)
            .map_err(|e| PerfError::Verify(e.to_string()))?;
        got_all.push(got);
    }
    if got_all.iter().enumerate().all(|(q, got)| {
        *got == crate::apps::pattern::expected(len, cfg.verify_seed, q as u64, false)
    }) {
        rep.messages = got_all.len() as u64;
        rep.bytes = (got_all.len() * len) as u64;
        rep.against = format!(
            "ferroce's pattern (seed {:#x}, message q on QP q)",
            cfg.verify_seed
        );
        return Ok(rep);
    }
    for (q, got) in got_all.into_iter().enumerate() {
        let off = q * len.max(peer_page);
        let s = match seed {
            Some(s) => s,
            None => {
                let now = crate::apps::pattern::unix_now();
                let s = crate::apps::pattern::find_glibc_seed(&got, off, now, 900, 300).ok_or_else(|| {
                    PerfError::Verify(format!(
                        "the last message received on QP {q} is not perftest's srand(time)/rand() fill at offset {off} for any second within 900 s before to 300 s after now (first bytes {:02x?})",
                        &got[..len.min(8)]
                    ))
                })?;
                seed = Some(s);
                rep.against = format!(
                    "the peer's send buffer as perftest fills it: glibc srand({s}) then (char)rand() per byte"
                );
                s
            }
        };
        let want = crate::apps::pattern::glibc_bytes(s, off, len);
        if let Some((at, g, w, n)) = crate::apps::pattern::first_mismatch(&got, &want) {
            return Err(PerfError::Verify(format!(
                "QP {q}: {n} of {len} received bytes differ, the first at byte {at}: got {g:#04x}, expected {w:#04x}"
            )));
        }
        rep.messages += 1;
        rep.bytes += len as u64;
    }
    Ok(rep)
}

/// Run a test over an established control session; prints nothing. Returns the report, both
/// sides' key messages and, with `verify`, what was checked.
#[allow(clippy::type_complexity)]
pub fn run(
    nic: &Nic,
    cfg: &PerfConfig,
    ses: &mut Session,
    resolve: &dyn Fn(IpAddr) -> Option<MacAddr>,
) -> Result<(Report, Vec<KeyMsg>, Vec<KeyMsg>, Option<VerifyReport>), PerfError> {
    if cfg.verify && cfg.all_sizes {
        return Err(PerfError::Verify(
            "--verify needs one message size (not -a)".into(),
        ));
    }
    let ep = setup(nic, cfg)?;
    let mtu = ses.handshake(cfg.mtu)?;
    let peer_page = (ses.peer_page as usize).clamp(64, 1 << 20);
    let peer_line = (ses.peer_cache_line as usize).clamp(1, 4096);
    let peer_half = perftest_half(max_size(cfg), peer_page, peer_line);
    let ours = ep.keys(cfg)?;
    let theirs = ses.exchange_keys(&ours)?;
    ep.connect(cfg, mtu, &theirs, resolve)?;
    // Receives go up before the last barrier: after it the peer may send at once.
    let mut recv_next = None;
    match (cfg.test, ses.role) {
        (Test::SendBw, Role::Server) => {
            recv_next = Some(post_initial_recvs(&ep, cfg, max_size(cfg) as u32)?);
        }
        (Test::SendLat, _) => {
            let len = max_size(cfg) as u32;
            for i in 0..2u64 {
                ep.nic.post_recv(
                    ep.qps[0],
                    RecvWr {
                        wr_id: i,
                        sg_list: vec![ep.sge(0, ep.half, len)],
                    },
                )?;
            }
        }
        _ => {}
    }
    ses.barrier(&ours[0])?;
    ses.barrier(&ours[0])?;
    // The rest of the exchange waits for the whole test: a longer timeout.
    let mut long = Session {
        stream: ses.stream.try_clone().map_err(CmError::from)?,
        role: ses.role,
        timeout: cfg.timeout + cfg.duration.unwrap_or_default() + Duration::from_secs(600),
        peer_page: ses.peer_page,
        peer_cache_line: ses.peer_cache_line,
    };
    let mut verify = None;
    let report = if cfg.test.is_bw() {
        let mut lines = Vec::new();
        for size in sizes(cfg) {
            // send_bw syncs once more after the receiver posted its receives; it has no
            // barrier after the test and no report exchange (each side prints what it
            // measured), unlike write_bw / read_bw / atomic_bw.
            let send = cfg.test == Test::SendBw;
            if send {
                long.barrier(&ours[0])?;
            }
            let line = match (ses.role, cfg.test) {
                (Role::Client, _) => bw_active(&ep, cfg, &theirs, size, peer_half, &mut verify)?,
                (Role::Server, Test::SendBw) => {
                    let expect = cfg
                        .duration
                        .is_none()
                        .then_some(cfg.iters * ep.qps.len() as u64);
                    let next = match recv_next.take() {
                        Some(n) => n,
                        None => post_initial_recvs(&ep, cfg, max_size(cfg) as u32)?,
                    };
                    let (n, next, secs) = bw_receiver(&ep, cfg, size, expect, next)?;
                    recv_next = Some(next);
                    let rate = n as f64 / secs.max(1e-9);
                    BwLine {
                        bytes: size,
                        iterations: n / ep.qps.len() as u64,
                        bw_peak: units(cfg, rate * f64::from(size)),
                        bw_avg: units(cfg, rate * f64::from(size)),
                        msg_rate_mpps: rate / 1e6,
                    }
                }
                (Role::Server, _) => BwLine {
                    bytes: size,
                    iterations: cfg.iters,
                    bw_peak: 0.0,
                    bw_avg: 0.0,
                    msg_rate_mpps: 0.0,
                },
            };
            if send {
                if cfg.verify && ses.role == Role::Server {
                    verify = Some(passive_check(&ep, cfg, size, peer_page)?);
                }
                lines.push(line);
                continue;
            }
            long.barrier(&ours[0])?;
            if cfg.verify && ses.role == Role::Server && cfg.test == Test::WriteBw {
                verify = Some(passive_check(&ep, cfg, size, peer_page)?);
            }
            let r = long.bw_reports(&BwReport {
                size: u64::from(size),
                iters: line.iterations,
                bw_peak: line.bw_peak,
                bw_avg: line.bw_avg,
                msg_rate: line.msg_rate_mpps,
            })?;
            // The passive side prints what the active side measured, as perftest does.
            lines.push(if ses.role == Role::Server {
                BwLine {
                    bytes: size,
                    iterations: r.iters,
                    bw_peak: r.bw_peak,
                    bw_avg: r.bw_avg,
                    msg_rate_mpps: r.msg_rate,
                }
            } else {
                line
            });
        }
        Report::Bw(lines)
    } else {
        let mut lines = Vec::new();
        for size in sizes(cfg) {
            // The latency tests sync once more per size before they run (send_lat after
            // posting its receives, "so the client won't send packets before the server has
            // posted his receive wqes"; write_lat and read_lat as well): keys, two barriers,
            // this one, the run, the closing barrier.
            long.barrier(&ours[0])?;
            if let Some(l) = lat_run(&ep, cfg, &theirs[0], size, ses.role)? {
                lines.push(l);
            }
        }
        Report::Lat(lines)
    };
    // A passive read-lat server reaches this at once and waits for the client's whole run.
    // ib_write_lat has no closing exchange: it closes the connection after its run.
    if cfg.test != Test::WriteLat {
        long.close(&ours[0])?;
    }
    Ok((report, ours, theirs, verify))
}

/// perftest's result header.
pub fn header(cfg: &PerfConfig) -> String {
    if cfg.test.is_bw() {
        let u = if cfg.report_gbits { "Gb/sec" } else { "MB/sec" };
        format!(" #bytes     #iterations    BW peak[{u}]    BW average[{u}]   MsgRate[Mpps]")
    } else {
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ".to_string()
    }
}

/// perftest's result lines.
pub fn lines(r: &Report) -> Vec<String> {
    match r {
        Report::Bw(v) => v
            .iter()
            .map(|l| format!(" {:<10} {:<10}       {:.2}            {:.2}\t\t   {:.6}", l.bytes, l.iterations, l.bw_peak, l.bw_avg, l.msg_rate_mpps))
            .collect(),
        Report::Lat(v) => v
            .iter()
            .map(|l| {
                format!(
                    " {:<7} {:<10}     {:.2}          {:.2}         {:.2}     \t{:.2}       \t{:.2}   \t\t{:.2}  \t\t{:.2}   ",
                    l.bytes, l.iterations, l.t_min, l.t_max, l.t_typical, l.t_avg, l.t_stdev, l.p99, l.p999
                )
            })
            .collect(),
    }
}

/// perftest's "local address" / "remote address" lines.
pub fn address_lines(ours: &[KeyMsg], theirs: &[KeyMsg]) -> Vec<String> {
    let fmt = |who: &str, k: &KeyMsg| {
        let ip = ip_of_gid(k.gid);
        format!(
            " {who} address: LID {:#06x} QPN {:#06x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}\n GID: {} ({ip})",
            k.lid,
            k.qpn,
            k.psn,
            k.rkey,
            k.vaddr,
            k.gid.iter().map(|b| format!("{b:02}")).collect::<Vec<_>>().join(":")
        )
    };
    ours.iter()
        .map(|k| fmt("local", k))
        .chain(theirs.iter().map(|k| fmt("remote", k)))
        .collect()
}

#[allow(dead_code)]
fn _gid(ip: IpAddr) -> [u8; 16] {
    gid_of(ip)
}
