//! One side's verbs objects, laid out as perftest lays out its own (`alloc_ctx`,
//! `create_mr`, `set_up_connection`, `ctx_set_send_wqes`, `ctx_set_recv_wqes`), so that a
//! perftest peer's view of our memory is the one it expects:
//!
//! - one memory region of `INC(B, line) * 2 * qps` bytes (`B = BUFF_SIZE(size, cycle)`,
//!   `size` the largest message), or one of `INC(B, line) * 2` per QP with `--mr_per_qp`;
//! - QP `i` sends from `i * B` and advertises `(qps + i) * B` (its "receive half") in its key
//!   message; its SEND receives land at `(qps + i) * INC(B, line)` (own MR: at its start);
//! - messages of at most half a cycle buffer walk through it in steps of `INC(size, line)`,
//!   locally and (WRITE, READ, ATOMIC) remotely, back to the start every `cycle / INC` messages.

use super::{Connection, PerfConfig, PerfError, Test, Verb};
use crate::oob::perftest::KeyMsg;
use crate::runtime::Nic;
use crate::verbs::{
    ip_of_gid, Cq, MemoryRegion, NotifyMode, QpInitAttr, QpType, RcParams, RecvWr, RemoteQp, Sge,
    Srq, SrqAttr, UcParams, UdDest, UdParams, VerbsError,
};
use crate::verbs::{AccessFlags, QpCap};
use crate::verbs::{AddressVector, Pd, SendWr};
use crate::wire::{MacAddr, QpNumber};
use std::net::IpAddr;

/// perftest's buffer fill: byte `i` of `mr` is byte `i` of the `(char)rand()` stream after
/// `srand(seed)` ([`crate::apps::pattern::glibc_bytes`]).
fn fill_like_perftest(mr: &MemoryRegion, seed: u32) -> Result<(), PerfError> {
    use crate::apps::pattern::{GlibcRand, Jump};
    let mut g = GlibcRand::at(seed, &Jump::steps(310));
    let mut chunk = vec![0u8; 64 * 1024];
    let len = mr.len();
    let mut off = 0;
    while off < len {
        let n = chunk.len().min(len - off);
        for b in &mut chunk[..n] {
            *b = g.next_byte();
        }
        mr.write(off, &chunk[..n])
            .map_err(|e| PerfError::Verify(e.to_string()))?;
        off += n;
    }
    Ok(())
}

/// perftest's `BUFF_SIZE`: at least a cycle buffer.
pub fn buff_size(size: usize, cycle: usize) -> usize {
    size.max(cycle)
}

/// perftest's `INC`: a size rounded up to whole cache lines (at least one).
pub fn inc(size: usize, line: usize) -> usize {
    let line = line.max(1);
    if size > line {
        size.div_ceil(line) * line
    } else {
        line
    }
}

/// The outstanding READ/ATOMIC requests ferroce's responder offers a QP at most (perftest's
/// "device max" for `-o`).
pub const MAX_OUT_READS: u16 = 16;

/// The verbs objects and memory of one side.
pub struct Endpoint<'a> {
    pub nic: &'a Nic,
    pub send_cq: Cq,
    pub recv_cq: Cq,
    pub qps: Vec<QpNumber>,
    /// The protection domain of everything here.
    pub pd: Pd,
    /// `-c UD`: 40, the GRH slot in front of every receive; 0 otherwise.
    pub grh: usize,
    /// `-c UD`: each QP's destination (the address handle to the peer's QP), once connected.
    pub ud: std::cell::OnceCell<Vec<UdDest>>,
    /// `--use_srq` on a receiving side: the shared receive queue every QP takes from
    /// (`max_wr` = `-r`); receives are posted to it instead of to the QPs.
    pub srq: Option<Srq>,
    /// One region, or one per QP (`--mr_per_qp`).
    pub mrs: Vec<MemoryRegion>,
    /// The cycle buffer and cache line both sides agreed on (the larger of each).
    pub cycle: usize,
    pub line: usize,
    /// `BUFF_SIZE(largest message, cycle)`.
    pub bsize: usize,
    pub psns: Vec<u32>,
    /// The outstanding reads this side offers (its key messages' `out_reads`).
    pub out_reads: u16,
    /// `--verify` only: read-bw's and atomic-bw's destinations and send-bw's receive slots,
    /// one message-sized slot per queue entry.
    pub vbuf: Option<MemoryRegion>,
    /// Slots of `vbuf` per QP, and the bytes of each (the largest message).
    pub vslots: usize,
    pub vstride: usize,
}

/// Move a fresh QP to INIT (as `ibv_modify_qp` to INIT right after `ibv_create_qp`), so that
/// receives can be posted before the connection is made.
pub fn qp_to_init(nic: &Nic, qpn: QpNumber, access: AccessFlags) -> Result<(), VerbsError> {
    let (a, mask) = RcParams {
        access,
        ..Default::default()
    }
    .init_attr();
    nic.modify_qp(qpn, &a, mask)
}

/// A 24-bit starting PSN (perftest draws them with `lrand48`); distinct per QP.
fn psn_for(_i: u32) -> u32 {
    // From the cryptographic generator, not the PID (issue 17, finding 2).
    crate::keys::KeyGen::new(None).psn()
}

impl<'a> Endpoint<'a> {
    /// `Ok` for a successful completion; otherwise the error to report. A flush (the QP had
    /// already failed, so every outstanding request completes with `IBV_WC_WR_FLUSH_ERR`)
    /// says nothing of why: the completion that failed the QP is looked for on this side's
    /// CQs first, so that the report names the cause (a transport retry counter exceeded,
    /// say) rather than a flushed receive.
    pub fn check_wc(&self, wc: &crate::verbs::WorkCompletion) -> Result<(), PerfError> {
        use crate::verbs::WcStatus;
        if wc.status == WcStatus::Success {
            return Ok(());
        }
        let mut first = *wc;
        if wc.status == WcStatus::WrFlushErr {
            let mut v = Vec::new();
            let cqs = [self.send_cq, self.recv_cq];
            'look: for (i, &cq) in cqs.iter().enumerate() {
                if i == 1 && cqs[1] == cqs[0] {
                    break;
                }
                v.clear();
                while self.nic.poll_cq(cq, &mut v, 64).unwrap_or(0) > 0 {
                    if let Some(c) = v
                        .iter()
                        .find(|c| !matches!(c.status, WcStatus::Success | WcStatus::WrFlushErr))
                    {
                        first = *c;
                        break 'look;
                    }
                    v.clear();
                }
            }
        }
        Err(PerfError::Completion {
            wr_id: first.wr_id,
            status: first.status,
        })
    }

    /// Create the CQs, QPs (in INIT) and memory for one side. `cycle`/`line` are the larger
    /// of both sides' page and cache line sizes (`check_sys_data`).
    ///
    /// `with_srq`: perftest's `srq_exists` (`--use_srq` on a side that receives: latency
    /// tests, the server, `-b`).
    pub fn new(
        nic: &'a Nic,
        cfg: &PerfConfig,
        cycle: usize,
        line: usize,
        with_srq: bool,
    ) -> Result<Endpoint<'a>, PerfError> {
        let nq = cfg.qps.max(1) as usize;
        let pd = nic.alloc_pd()?;
        let size = cfg.ctx_size() as usize;
        let bsize = buff_size(size, cycle);
        let half = inc(bsize, line);
        let depth = (cfg.tx_depth.max(1) as usize + cfg.rx_depth.max(1) as usize) * nq + 16;
        let send_cq = nic.create_cq(depth.max(256))?;
        let recv_cq = nic.create_cq(depth.max(256))?;
        let cap = QpCap {
            // perftest's tx depth, and room for one more post list.
            max_send_wr: cfg.tx_depth.max(1) + cfg.post_list.max(1),
            max_recv_wr: cfg.rx_depth.max(1) + cfg.recv_post_list.max(1),
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: cfg.inline_size,
        };
        let access = match cfg.test.verb() {
            Verb::Write => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            Verb::Read => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
            Verb::Atomic => AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
            Verb::Send => AccessFlags::LOCAL_WRITE,
        };
        let ud = cfg.connection == Connection::Ud;
        let grh = if ud { 40 } else { 0 };
        // UD: room for the GRH slot of the last receive.
        let tail = if ud { 128 } else { 0 };
        let mrs = if cfg.mr_per_qp {
            (0..nq)
                .map(|_| nic.reg_mr(pd, half * 2 + tail, access))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            vec![nic.reg_mr(pd, half * 2 * nq + tail, access)?]
        };
        if cfg.test.verb() == Verb::Read {
            // What a READ reads is the peer's memory as it was registered: perftest fills
            // its buffer with `(char)rand()` after `srand(time(NULL))`, so a `--verify`
            // client (ferroce's or one that knows perftest's fill) can check every byte.
            let seed = crate::apps::pattern::unix_now() as u32;
            for mr in &mrs {
                fill_like_perftest(mr, seed)?;
            }
        }
        let qp_access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let srq = if with_srq {
            Some(nic.create_srq(
                pd,
                SrqAttr {
                    max_wr: cfg.rx_depth.max(1),
                    max_sge: 1,
                    srq_limit: 0,
                },
            )?)
        } else {
            None
        };
        let mut qps = Vec::with_capacity(nq);
        let mut psns = Vec::with_capacity(nq);
        for i in 0..nq {
            let mut init = QpInitAttr::new(pd, send_cq, recv_cq, cap);
            init.srq = srq;
            if cfg.connection == Connection::Uc {
                // perftest's UC QPs: INIT with local and remote write access only.
                init.qp_type = QpType::Uc;
            }
            if ud {
                init.qp_type = QpType::Ud;
            }
            let q = nic.create_qp(init)?;
            if ud {
                // perftest's UD QPs: INIT with its Q_Key, 0x11111111; with -R, made by
                // rdma_create_qp: RDMA-CM's UD Q_Key, 0x01234567 (what the SIDR_REP says).
                let qkey = if cfg.rdma_cm {
                    crate::runtime::cm::UDP_QKEY
                } else {
                    UdParams::default().qkey
                };
                let (a, mask) = UdParams {
                    qkey,
                    ..UdParams::default()
                }
                .init_attr();
                nic.modify_qp(q, &a, mask)?;
            } else if cfg.connection == Connection::Uc {
                let (a, mask) = UcParams {
                    access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
                    ..UcParams::default()
                }
                .init_attr();
                nic.modify_qp(q, &a, mask)?;
            } else {
                qp_to_init(nic, q, qp_access)?;
            }
            qps.push(q);
            psns.push(psn_for(i as u32));
        }
        let out_reads = if matches!(cfg.test.verb(), Verb::Read | Verb::Atomic) {
            cfg.out_reads_effective()
        } else {
            1
        };
        let mut ep = Endpoint {
            nic,
            send_cq,
            recv_cq,
            qps,
            pd,
            grh,
            ud: std::cell::OnceCell::new(),
            srq,
            mrs,
            cycle,
            line,
            bsize,
            psns,
            out_reads,
            vbuf: None,
            vslots: 0,
            vstride: 0,
        };
        if cfg.verify {
            let vslots = match cfg.test {
                Test::ReadBw | Test::AtomicBw => cfg.tx_depth.max(1) as usize,
                Test::SendBw => (cfg.rx_depth.max(1) + cfg.recv_post_list.max(1)) as usize,
                _ => 0,
            };
            if vslots > 0 {
                let msg = (cfg.ctx_size() as usize).max(8) + grh;
                ep.vbuf = Some(nic.reg_mr(pd, vslots * nq * msg, AccessFlags::LOCAL_WRITE)?);
                ep.vslots = vslots;
                ep.vstride = msg;
            }
        }
        if cfg.use_event {
            nic.req_notify_cq(send_cq, NotifyMode::NextCompletion)?;
            nic.req_notify_cq(recv_cq, NotifyMode::NextCompletion)?;
        }
        Ok(ep)
    }

    pub fn nq(&self) -> usize {
        self.qps.len()
    }

    /// Post a send on QP `q` (UD: addressed to the peer's QP along its address handle).
    pub fn post_send(&self, q: usize, mut wr: SendWr) -> Result<(), VerbsError> {
        if let Some(d) = self.ud.get().and_then(|v| v.get(q)) {
            wr = wr.with_ud(*d);
        }
        self.nic.post_send(self.qps[q], wr)
    }

    /// Post a receive for QP `q`: to the SRQ when there is one (`ibv_post_srq_recv`), else
    /// to the QP.
    pub fn post_recv(&self, q: usize, wr: RecvWr) -> Result<(), VerbsError> {
        match self.srq {
            Some(s) => self.nic.post_srq_recv(s, wr),
            None => self.nic.post_recv(self.qps[q], wr),
        }
    }

    /// Receives each QP posts before the run: `-r`, divided among the QPs with an SRQ
    /// (perftest's `size_per_qp /= num_of_qps`).
    pub fn rx_depth_per_qp(&self, cfg: &PerfConfig) -> u32 {
        if self.srq.is_some() {
            (cfg.rx_depth / self.nq().max(1) as u32).max(1)
        } else {
            cfg.rx_depth
        }
    }

    /// Which of our QPs a receive completion belongs to (with an SRQ not the one that posted
    /// the receive: the one whose message took it).
    pub fn recv_qp(&self, wc: &crate::verbs::WorkCompletion) -> Result<usize, PerfError> {
        self.qps
            .iter()
            .position(|&n| n == wc.qp_num)
            .ok_or(PerfError::Peer(
                "a receive completion for a QP we do not have",
            ))
    }

    /// `--verify`: the offset in `vbuf` of QP `q`'s slot for its message (or receive) `k`.
    pub fn vslot(&self, q: usize, k: u64) -> usize {
        self.vslot_index(q, k) * self.vstride
    }

    /// `--verify`: the number of QP `q`'s slot for its message (or receive) `k` (its offset
    /// is this times `vstride`).
    pub fn vslot_index(&self, q: usize, k: u64) -> usize {
        let vs = self.vslots.max(1);
        q * vs + (k % vs as u64) as usize
    }

    /// The region QP `q` uses and the offset of its send half in it.
    fn send_base(&self, q: usize) -> (&MemoryRegion, usize) {
        if self.mrs.len() > 1 {
            (&self.mrs[q], 0)
        } else {
            (&self.mrs[0], q * self.bsize)
        }
    }

    /// The region QP `q` uses and the offset it advertises (its receive half).
    pub fn advertised(&self, q: usize) -> (&MemoryRegion, usize) {
        if self.mrs.len() > 1 {
            (&self.mrs[q], self.bsize)
        } else {
            (&self.mrs[0], (self.nq() + q) * self.bsize)
        }
    }

    /// The region and offset where QP `q`'s SEND receives start.
    pub fn recv_base(&self, q: usize) -> (&MemoryRegion, usize) {
        if self.mrs.len() > 1 {
            (&self.mrs[q], 0)
        } else {
            (&self.mrs[0], (self.nq() + q) * inc(self.bsize, self.line))
        }
    }

    /// A scatter entry in QP `q`'s send half, `off` bytes in.
    pub fn send_sge(&self, q: usize, off: usize, len: u32) -> Sge {
        let (mr, base) = self.send_base(q);
        Sge {
            addr: mr.addr() + (base + off) as u64,
            length: len,
            lkey: mr.lkey(),
        }
    }

    /// A scatter entry for a receive of QP `q`, `off` bytes past its receive start (UD: 40
    /// bytes longer, for the GRH slot in front of the message).
    pub fn recv_sge(&self, q: usize, off: usize, len: u32) -> Sge {
        let (mr, base) = self.recv_base(q);
        Sge {
            addr: mr.addr() + (base + off) as u64,
            length: len + self.grh as u32,
            lkey: mr.lkey(),
        }
    }

    /// The key messages describing this side.
    pub fn keys(&self, gid: [u8; 16]) -> Vec<KeyMsg> {
        (0..self.nq())
            .map(|i| {
                let (mr, off) = self.advertised(i);
                KeyMsg {
                    lid: 0,
                    out_reads: self.out_reads,
                    qpn: self.qps[i].get(),
                    psn: self.psns[i],
                    rkey: mr.rkey().0,
                    vaddr: mr.addr() + off as u64,
                    gid,
                    srqn: 0,
                }
            })
            .collect()
    }

    /// Connect each QP to the peer's (`ctx_connect`: RTR with the peer's address, our
    /// outstanding reads as responder resources; RTS with the peer's as initiator depth).
    pub fn connect(
        &self,
        cfg: &PerfConfig,
        mtu: crate::verbs::Mtu,
        theirs: &[KeyMsg],
        resolve: &dyn Fn(IpAddr) -> Option<MacAddr>,
    ) -> Result<(), PerfError> {
        let mut dests = Vec::new();
        for (i, q) in self.qps.iter().enumerate() {
            let t = theirs
                .get(i)
                .ok_or(PerfError::Peer("fewer QPs than ours"))?;
            let ip = ip_of_gid(t.gid);
            let mac = resolve(ip).ok_or(PerfError::Neighbour(ip))?;
            if self.grh > 0 {
                // UD: RTR, RTS with our PSN, and an address handle to the peer's GID.
                let p = UdParams {
                    local_psn: self.psns[i],
                    ..UdParams::default()
                };
                for (a, mask) in [p.rtr_attr(), p.rts_attr()] {
                    self.nic.modify_qp(*q, &a, mask)?;
                }
                let av = AddressVector {
                    dgid: t.gid,
                    sgid_index: cfg.gid_index,
                    hop_limit: 64,
                    traffic_class: cfg.traffic_class,
                    flow_label: 0,
                    dmac: Some(mac.0),
                };
                let ah = self.nic.create_ah(self.pd, &av)?;
                dests.push(UdDest {
                    ah,
                    remote_qpn: QpNumber::new(t.qpn),
                    remote_qkey: UdParams::default().qkey,
                });
                continue;
            }
            let remote = RemoteQp {
                qpn: QpNumber::new(t.qpn),
                gid: t.gid,
                mac,
                psn: t.psn,
            };
            if cfg.connection == Connection::Uc {
                let p = UcParams {
                    mtu,
                    access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
                    sgid_index: cfg.gid_index,
                    local_psn: self.psns[i],
                    traffic_class: cfg.traffic_class,
                };
                self.nic.connect_uc(*q, &remote, &p)?;
                continue;
            }
            let p = RcParams {
                mtu,
                sgid_index: cfg.gid_index,
                local_psn: self.psns[i],
                max_rd_atomic: t.out_reads.clamp(1, 255) as u8,
                max_dest_rd_atomic: self.out_reads.clamp(1, 255) as u8,
                timeout: cfg.qp_timeout.min(31),
                retry_cnt: 7,
                rnr_retry: 7,
                min_rnr_timer: 12,
                traffic_class: cfg.traffic_class,
                ..RcParams::default()
            };
            self.nic.connect_rc(*q, &remote, &p)?;
        }
        if self.grh > 0 {
            let _ = self.ud.set(dests);
        }
        Ok(())
    }

    /// UD: where each QP's sends go (set once; `-R` sets them from the SIDR exchange).
    pub fn set_ud_dests(&self, dests: Vec<UdDest>) {
        let _ = self.ud.set(dests);
    }

    /// An address handle to the port with GID `ip` (`resolve` gives its MAC).
    pub fn ah_to(
        &self,
        cfg: &PerfConfig,
        ip: IpAddr,
        resolve: &dyn Fn(IpAddr) -> Option<MacAddr>,
    ) -> Result<crate::verbs::Ah, PerfError> {
        let mac = resolve(ip).ok_or(PerfError::Neighbour(ip))?;
        let av = AddressVector {
            dgid: crate::wire::mad::Gid::from_ip(ip).0,
            sgid_index: cfg.gid_index,
            hop_limit: 64,
            traffic_class: cfg.traffic_class,
            flow_label: 0,
            dmac: Some(mac.0),
        };
        Ok(self.nic.create_ah(self.pd, &av)?)
    }

    /// Read from QP `q`'s receive area, `off` bytes in.
    pub fn read_recv(&self, q: usize, off: usize, out: &mut [u8]) -> Result<(), PerfError> {
        let (mr, base) = self.recv_base(q);
        mr.read(base + off, out)
            .map_err(|e| PerfError::Verify(e.to_string()))
    }

    /// Write `bytes` into QP `q`'s send half, `off` bytes in.
    pub fn write_send_half(&self, q: usize, off: usize, bytes: &[u8]) -> Result<(), PerfError> {
        let (mr, base) = self.send_base(q);
        mr.write(base + off, bytes)
            .map_err(|e| PerfError::Verify(e.to_string()))
    }

    /// Read from the region QP `q` advertises, `off` bytes in.
    pub fn read_advertised(&self, q: usize, off: usize, out: &mut [u8]) -> Result<(), PerfError> {
        let (mr, base) = self.advertised(q);
        mr.read(base + off, out)
            .map_err(|e| PerfError::Verify(e.to_string()))
    }

    /// Post `n` receives of `len` bytes on QP `q` (`ctx_set_recv_wqes` for one QP), walking
    /// the receive area as perftest does; returns the next slot index.
    pub fn post_recvs(&self, q: usize, n: u32, len: u32, walk: bool) -> Result<(), PerfError> {
        let step = inc(len as usize, self.line);
        let slots = (self.cycle / step).max(1);
        for j in 0..n as usize {
            let off = if walk { (j % slots) * step } else { 0 };
            self.post_recv(
                q,
                RecvWr {
                    wr_id: q as u64,
                    sg_list: smallvec::smallvec![self.recv_sge(q, off, len)],
                },
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::Loopback;
    use crate::runtime::{NicOptions, PollMode};
    use crate::verbs::{
        DeviceConfig, QpInitAttr, RecvWr, RemoteQp, SendOp, Sge, WcStatus, WorkCompletion,
    };
    use std::time::{Duration, Instant};

    /// A WRITE to a peer that never answers, retry_cnt 0: the QP fails with a transport retry
    /// error on the send CQ and flushes its receive on the receive CQ. Reported from the
    /// flushed receive, the error names the retry error, the cause.
    #[test]
    fn a_flush_is_reported_as_the_completion_that_failed_the_qp() {
        let (dev, _silent_peer) = Loopback::pair(64, 9000).unwrap();
        let nic = Nic::start(
            DeviceConfig::new(MacAddr([2, 0, 0, 0, 0, 1]), "10.9.9.1".parse().unwrap()),
            dev,
            NicOptions {
                poll: PollMode::Adaptive {
                    spins: 10,
                    max_sleep: Duration::from_micros(200),
                },
                batch: 16,
            },
        )
        .unwrap();
        let pd = nic.alloc_pd().unwrap();
        let (scq, rcq) = (nic.create_cq(16).unwrap(), nic.create_cq(16).unwrap());
        let cap = QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qpn = nic.create_qp(QpInitAttr::new(pd, scq, rcq, cap)).unwrap();
        let mr = nic.reg_mr(pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
        let sge = |off: u64| Sge {
            addr: mr.addr() + off,
            length: 64,
            lkey: mr.lkey(),
        };
        let remote = RemoteQp {
            qpn: QpNumber::new(0x99),
            gid: crate::verbs::gid_of("10.9.9.2".parse().unwrap()),
            mac: MacAddr([2, 0, 0, 0, 0, 2]),
            psn: 0,
        };
        let p = RcParams {
            timeout: 1,
            retry_cnt: 0,
            ..RcParams::default()
        };
        nic.connect_rc(qpn, &remote, &p).unwrap();
        nic.post_recv(
            qpn,
            RecvWr {
                wr_id: 7,
                sg_list: smallvec::smallvec![sge(0)],
            },
        )
        .unwrap();
        nic.post_send(
            qpn,
            SendWr::new(
                9,
                SendOp::RdmaWrite {
                    remote_addr: 0x1000,
                    rkey: crate::wire::RKey(1),
                },
                vec![sge(64)],
            ),
        )
        .unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        let mut v: Vec<WorkCompletion> = Vec::new();
        while v.is_empty() && Instant::now() < end {
            nic.poll_cq(rcq, &mut v, 1).unwrap();
            if v.is_empty() {
                nic.wait_cq(rcq, Duration::from_millis(1)).unwrap();
            }
        }
        let flushed = v.pop().expect("the receive was flushed");
        assert_eq!((flushed.wr_id, flushed.status), (7, WcStatus::WrFlushErr));
        let ep = Endpoint {
            nic: &nic,
            send_cq: scq,
            recv_cq: rcq,
            qps: vec![qpn],
            pd,
            grh: 0,
            ud: std::cell::OnceCell::new(),
            srq: None,
            mrs: vec![],
            cycle: 0,
            line: 0,
            bsize: 0,
            psns: vec![],
            out_reads: 0,
            vbuf: None,
            vslots: 0,
            vstride: 0,
        };
        match ep.check_wc(&flushed) {
            Err(PerfError::Completion { wr_id, status }) => {
                assert_eq!((wr_id, status), (9, WcStatus::RetryExcErr))
            }
            other => panic!("{:?}", other.err().map(|e| e.to_string())),
        }
    }
}
