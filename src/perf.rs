//! perftest-style tests over a running [`Nic`]: `write-bw`, `read-bw`, `send-bw`,
//! `atomic-bw`, `send-lat`, `write-lat`, `read-lat`, with perftest's out-of-band exchange
//! ([`crate::cm::perftest`]) so either end can be ferroce or the real `ib_*` tool.
//!
//! Roles as in perftest: the server waits for a connection on TCP 18515, the client connects.
//! In the bandwidth tests the client is the active side (for `send-bw` the server posts the
//! receives); in the latency tests both sides take part in each round trip (`read-lat`:
//! only the client).

use crate::cm::perftest::{BwReport, KeyMsg, Role, Session};
use crate::cm::CmError;
use crate::nic::Nic;
use crate::rc::state::{AccessFlags, Mtu, QpCap};
use crate::verbs::{
    gid_of, ip_of_gid, Cq, MemoryRegion, RcParams, RecvWr, RemoteQp, SendFlags, SendOp, SendWr,
    Sge, VerbsError, WcStatus, WorkCompletion,
};
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
pub struct Endpoint<'a> {
    pub nic: &'a Nic,
    pub cq: Cq,
    pub qps: Vec<QpNumber>,
    pub mr: MemoryRegion,
    /// Bytes of the MR each QP uses (its send half and receive half).
    pub slot: usize,
    pub psns: Vec<u32>,
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
    let slot = max_size(cfg) * 2;
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = nic.reg_mr(pd, slot * qps as usize, all)?;
    let mut v = Vec::new();
    let mut psns = Vec::new();
    for i in 0..qps {
        v.push(crate::nic::create_rc_qp(nic, pd, cq, cap)?);
        // perftest draws PSNs with lrand48; any 24-bit value will do.
        psns.push((0x1f_0000u32.wrapping_mul(i + 7) ^ (std::process::id() << 4)) & 0xff_ffff);
    }
    Ok(Endpoint {
        nic,
        cq,
        qps: v,
        mr,
        slot,
        psns,
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
                vaddr: self.mr.addr() + (i * self.slot) as u64,
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

/// The active side of a bandwidth test for one size.
fn bw_active(
    ep: &Endpoint<'_>,
    cfg: &PerfConfig,
    theirs: &[KeyMsg],
    size: u32,
) -> Result<BwLine, PerfError> {
    let nq = ep.qps.len();
    let per_qp = cfg.iters;
    let deadline = cfg.duration.map(|d| Instant::now() + d);
    let mut posted = vec![0u64; nq];
    let mut done = vec![0u64; nq];
    let mut outstanding = vec![0u32; nq];
    let signal_every = (cfg.tx_depth / 4).max(1) as u64;
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
                let last = deadline.is_none() && i + 1 == per_qp;
                let flags = if (i + 1) % signal_every == 0 || last {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::empty()
                };
                let remote = theirs[q].vaddr + (ep.slot / 2) as u64;
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
                    Test::AtomicBw if cfg.cmp_swap => (
                        SendOp::AtomicCmpSwp {
                            remote_addr: remote,
                            rkey,
                            compare: 0,
                            swap: i,
                        },
                        8,
                    ),
                    _ => (
                        SendOp::AtomicFetchAdd {
                            remote_addr: remote,
                            rkey,
                            add: 1,
                        },
                        8,
                    ),
                };
                let off = if cfg.test == Test::ReadBw {
                    ep.slot / 2
                } else {
                    0
                };
                let wr = SendWr {
                    wr_id: (q as u64) << 48 | i,
                    op,
                    sg_list: vec![ep.sge(q, off, len)],
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
    Ok(BwLine {
        bytes: size,
        iterations: total / nq as u64,
        bw_peak: units(cfg, peak * f64::from(size)),
        bw_avg: units(cfg, avg * f64::from(size)),
        msg_rate_mpps: avg / 1e6,
    })
}

/// The passive side of send-bw: keep receives posted until `expect` messages arrived.
fn bw_receiver(
    ep: &Endpoint<'_>,
    cfg: &PerfConfig,
    size: u32,
    expect: Option<u64>,
) -> Result<u64, PerfError> {
    let nq = ep.qps.len();
    let depth = cfg.tx_depth.max(64);
    let mut next = vec![0u64; nq];
    for (q, n) in next.iter_mut().enumerate() {
        for _ in 0..depth {
            ep.nic.post_recv(
                ep.qps[q],
                RecvWr {
                    wr_id: (q as u64) << 48 | *n,
                    sg_list: vec![ep.sge(q, ep.slot / 2, size.max(1))],
                },
            )?;
            *n += 1;
        }
    }
    let mut got = 0u64;
    let mut wcs = Vec::new();
    let mut last = Instant::now();
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
                    sg_list: vec![ep.sge(q, ep.slot / 2, size.max(1))],
                },
            )?;
            next[q] += 1;
        }
    }
    Ok(got)
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

/// Wait for one completion (busy-polling: this is a latency test) and check it.
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
        if t0.elapsed() > timeout {
            return Err(PerfError::Stalled(timeout));
        }
        std::hint::spin_loop();
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
    let remote = theirs.vaddr + (ep.slot / 2) as u64;
    let rkey = RKey(theirs.rkey);
    let len = size.max(1);
    match cfg.test {
        Test::SendLat => {
            for i in 0..2u64 {
                ep.nic.post_recv(
                    q,
                    RecvWr {
                        wr_id: i,
                        sg_list: vec![ep.sge(0, ep.slot / 2, len)],
                    },
                )?;
            }
            for i in 0..iters {
                let t0 = Instant::now();
                if role == Role::Client {
                    ep.nic
                        .post_send(q, SendWr::new(i, SendOp::Send, vec![ep.sge(0, 0, size)]))?;
                }
                // Collect our send's completion and the peer's message, in either order.
                let mut need = if role == Role::Client { 2 } else { 1 };
                while need > 0 {
                    let wc = wait_one(ep, &mut buf, cfg.timeout)?;
                    if wc.opcode == crate::verbs::WcOpcode::Recv {
                        ep.nic.post_recv(
                            q,
                            RecvWr {
                                wr_id: wc.wr_id,
                                sg_list: vec![ep.sge(0, ep.slot / 2, len)],
                            },
                        )?;
                        if role == Role::Server {
                            ep.nic.post_send(
                                q,
                                SendWr::new(i, SendOp::Send, vec![ep.sge(0, 0, size)]),
                            )?;
                            wait_one(ep, &mut buf, cfg.timeout)?;
                        }
                    }
                    need -= 1;
                }
                samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
        }
        Test::WriteLat => {
            // The last byte of each message carries the iteration number; the receiver spins on
            // its own memory until it changes (as perftest does).
            let mark_off = ep.slot / 2 + len as usize - 1;
            for i in 0..iters {
                let tag = (i % 255 + 1) as u8;
                let t0 = Instant::now();
                let wait_tag = |t: Instant| -> Result<(), PerfError> {
                    while ep.mr.with_bytes(|b| b[mark_off]) != tag {
                        if t.elapsed() > cfg.timeout {
                            return Err(PerfError::Stalled(cfg.timeout));
                        }
                        std::hint::spin_loop();
                    }
                    Ok(())
                };
                if role == Role::Server {
                    wait_tag(t0)?;
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
                wait_one(ep, &mut buf, cfg.timeout)?;
                if role == Role::Client {
                    wait_tag(t0)?;
                }
                samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
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

/// Run a test over an established control session; prints nothing.
pub fn run(
    nic: &Nic,
    cfg: &PerfConfig,
    ses: &mut Session,
    resolve: &dyn Fn(IpAddr) -> Option<MacAddr>,
) -> Result<(Report, Vec<KeyMsg>, Vec<KeyMsg>), PerfError> {
    let ep = setup(nic, cfg)?;
    let mtu = ses.handshake(cfg.mtu)?;
    let ours = ep.keys(cfg)?;
    let theirs = ses.exchange_keys(&ours)?;
    ep.connect(cfg, mtu, &theirs, resolve)?;
    ses.barrier(&ours[0])?;
    ses.barrier(&ours[0])?;
    let long = Session {
        stream: ses.stream.try_clone().map_err(CmError::from)?,
        role: ses.role,
        timeout: cfg.timeout + cfg.duration.unwrap_or_default() + Duration::from_secs(600),
    };
    let mut long = long;
    let report = if cfg.test.is_bw() {
        let mut lines = Vec::new();
        for size in sizes(cfg) {
            let line = match (ses.role, cfg.test) {
                (Role::Client, _) => bw_active(&ep, cfg, &theirs, size)?,
                (Role::Server, Test::SendBw) => {
                    let expect = cfg
                        .duration
                        .is_none()
                        .then_some(cfg.iters * ep.qps.len() as u64);
                    let n = bw_receiver(&ep, cfg, size, expect)?;
                    BwLine {
                        bytes: size,
                        iterations: n / ep.qps.len() as u64,
                        bw_peak: 0.0,
                        bw_avg: 0.0,
                        msg_rate_mpps: 0.0,
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
            long.barrier(&ours[0])?;
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
            if let Some(l) = lat_run(&ep, cfg, &theirs[0], size, ses.role)? {
                lines.push(l);
            }
        }
        Report::Lat(lines)
    };
    ses.close(&ours[0])?;
    Ok((report, ours, theirs))
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
