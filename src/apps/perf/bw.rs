//! The bandwidth tests' data path, as perftest runs it (`run_iter_bw`, `run_iter_bw_server`,
//! `run_iter_bi`, `run_iter_bw_infinitely`, `perform_warm_up`): every QP keeps up to `-t`
//! requests outstanding, counted by perftest's rule (a completion is requested every `-Q`
//! sends and for the last, and each completion retires `-Q` of them); `-l` posts lists; a
//! receiver keeps exactly `-n` receives per QP coming, re-posting as they complete.

use super::ctx::{inc, Endpoint};
use super::report::{self, BwLine, BwStamps};
use super::verify::{self, AtomicCheck, ReadCheck, SendCheck, VerifyReport};
use super::{Ctl, PerfConfig, PerfError, Printer, Test, Verb};
use crate::oob::perftest::KeyMsg;
use crate::verbs::{
    Cq, NotifyMode, RecvWr, SendFlags, SendOp, SendWr, Sge, VerbsError, WorkCompletion,
};
use crate::wire::RKey;
use std::time::{Duration, Instant};

/// perftest's `CTX_POLL_BATCH`.
const POLL_BATCH: usize = 16;

/// How long a test thread spins on an empty CQ before it sleeps on it: spinning for ever
/// starves the engine thread when cores are scarce.
pub(super) const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);

/// The phases of a `-D` run (perftest's `catch_alarm` states): nothing is counted for
/// `margin` after the start and before the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Start,
    Sample,
    StopSample,
    End,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct DurClock {
    t0: Instant,
    margin: Duration,
    duration: Duration,
}

impl DurClock {
    pub(super) fn new(cfg: &PerfConfig, duration: Duration) -> Self {
        let secs = duration.as_secs();
        let margin = u64::from(cfg.margin.unwrap_or((secs / 4) as u32));
        DurClock {
            t0: Instant::now(),
            margin: Duration::from_secs(margin),
            duration,
        }
    }
    pub(super) fn phase(&self) -> Phase {
        let e = self.t0.elapsed();
        if e < self.margin {
            Phase::Start
        } else if e + self.margin < self.duration {
            Phase::Sample
        } else if e < self.duration {
            Phase::StopSample
        } else {
            Phase::End
        }
    }
    /// The measured window.
    pub(super) fn window(&self) -> Duration {
        self.duration.saturating_sub(self.margin * 2)
    }
}

/// Wait for a completion on `cq`: with `-e` sleep on the completion channel (perftest's
/// `ctx_notify_events`), else spin briefly and then sleep on the CQ. False when `timeout`
/// passed without one.
pub(super) fn await_cq(
    ep: &Endpoint<'_>,
    cq: Cq,
    events: bool,
    idle_since: Instant,
    timeout: Duration,
) -> Result<(), PerfError> {
    if idle_since.elapsed() > timeout {
        return Err(PerfError::Stalled(timeout));
    }
    if events {
        if ep.nic.get_cq_event(cq, Duration::from_millis(10))? {
            ep.nic.req_notify_cq(cq, NotifyMode::NextCompletion)?;
        }
        return Ok(());
    }
    if ep.nic.progress() > 0 {
        return Ok(());
    }
    if idle_since.elapsed() < crate::runtime::spin_budget(SPIN_BEFORE_SLEEP) {
        std::hint::spin_loop();
    } else {
        ep.nic.wait_cq(cq, Duration::from_millis(1))?;
    }
    Ok(())
}

/// One QP's sending state (perftest's `scnt`, `ccnt`, and its work request template).
struct QpTx {
    scnt: u64,
    ccnt: u64,
    /// The current local offset in the send half and remote address (they walk).
    loc: usize,
    rem: u64,
    /// The template's signaled flag.
    signaled: bool,
}

/// What a request does to the peer.
fn op_for(cfg: &PerfConfig, remote_addr: u64, rkey: RKey, i: u64, chain: Option<u64>) -> SendOp {
    match cfg.test.verb() {
        Verb::Write => SendOp::RdmaWrite { remote_addr, rkey },
        Verb::Read => SendOp::RdmaRead { remote_addr, rkey },
        Verb::Send => SendOp::Send,
        Verb::Atomic if cfg.cmp_swap => {
            // perftest compares with 0 and swaps in 0; --verify chains its values (see
            // AtomicCheck).
            let (compare, swap) = match chain {
                Some(b) if i > 0 => (AtomicCheck::chain(b, i - 1), AtomicCheck::chain(b, i)),
                _ => (0, 0),
            };
            SendOp::AtomicCmpSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            }
        }
        Verb::Atomic => SendOp::AtomicFetchAdd {
            remote_addr,
            rkey,
            add: 1,
        },
    }
}

/// Whether messages of `size` walk through the cycle buffer.
fn walks(ep: &Endpoint<'_>, size: u32) -> bool {
    size as usize <= ep.cycle / 2
}

/// The active side of a bandwidth test for one size (`run_iter_bw`). With `--verify`, READ
/// and ATOMIC results are checked as they complete.
pub(super) fn run_iter_bw(
    c: &Ctl<'_>,
    ep: &Endpoint<'_>,
    theirs: &[KeyMsg],
    size: u32,
) -> Result<(BwLine, Option<VerifyReport>), PerfError> {
    let cfg = c.cfg;
    let nq = ep.nq();
    let verb = cfg.test.verb();
    let len = if verb == Verb::Atomic { 8 } else { size };
    let clock = cfg.duration.map(|d| DurClock::new(cfg, d));
    let iters = if clock.is_some() { u64::MAX } else { cfg.iters };
    let tot = if clock.is_some() {
        0
    } else {
        cfg.iters * nq as u64
    };
    let checking = cfg.verify && matches!(cfg.test, Test::ReadBw | Test::AtomicBw);
    // --verify checks every READ/ATOMIC: each is signaled and retires itself.
    let cq_mod = if checking { 1 } else { cfg.cq_mod.max(1) };
    let post_list = if checking { 1 } else { cfg.post_list.max(1) };
    if cfg.verify && matches!(verb, Verb::Write | Verb::Send) {
        verify::fill_sender(ep, cfg, size)?;
    }
    let mut rcheck = (checking && verb == Verb::Read).then(|| ReadCheck::new(nq));
    let mut acheck = (checking && verb == Verb::Atomic).then(|| AtomicCheck::new(nq));
    let step = inc(len as usize, ep.line) as u64;
    let slots = (ep.cycle as u64 / step).max(1);
    // perftest walks local addresses for size <= cycle/2, remote ones likewise (ATOMIC too).
    let walk = walks(ep, len) && post_list == 1;
    let mut tx: Vec<QpTx> = (0..nq)
        .map(|q| QpTx {
            scnt: 0,
            ccnt: 0,
            loc: 0,
            rem: theirs[q].vaddr,
            signaled: cq_mod == 1,
        })
        .collect();
    let mut st = BwStamps::new(
        cfg.no_peak || clock.is_some(),
        (cfg.iters as usize).saturating_mul(nq),
    );
    let (mut totscnt, mut totccnt, mut counted) = (0u64, 0u64, 0u64);
    let mut sample_start = None;
    let mut sample_end = None;
    if st.no_peak && clock.is_none() {
        st.start();
    }
    let mut wcs = Vec::with_capacity(POLL_BATCH);
    let mut idle = Instant::now();
    let mut last_progress = Instant::now();
    let t_start = Instant::now();
    loop {
        let phase = clock.map(|k| k.phase());
        if let Some(p) = phase {
            if p != Phase::Start && sample_start.is_none() {
                sample_start = Some(Instant::now());
            }
            if matches!(p, Phase::StopSample | Phase::End) && sample_end.is_none() {
                sample_end = Some(Instant::now());
            }
        }
        let ended = phase == Some(Phase::End);
        if clock.is_none() {
            if totscnt >= tot && totccnt >= tot {
                break;
            }
        } else if ended {
            break;
        }
        for q in 0..nq {
            loop {
                let t = &mut tx[q];
                let window_ok = t.scnt + u64::from(post_list) <= t.ccnt + u64::from(cfg.tx_depth);
                if !(t.scnt < iters && window_ok) {
                    break;
                }
                // The CMP_AND_SWAP chain needs its first result before the second operation.
                if let Some(a) = &acheck {
                    if cfg.cmp_swap && t.scnt > 0 && a.base(q).is_none() {
                        break;
                    }
                }
                if post_list == 1
                    && cq_mod > 1
                    && t.scnt % u64::from(cq_mod) == 0
                    && !(clock.is_none() && t.scnt + 1 == cfg.iters)
                {
                    t.signaled = false;
                }
                if !st.no_peak {
                    st.post(totscnt as usize);
                }
                let posted = post_send_list(
                    ep, cfg, q, t, theirs, len, post_list, cq_mod, checking, &acheck,
                )?;
                if !posted {
                    break;
                }
                let t = &mut tx[q];
                if walk {
                    t.loc += step as usize;
                    if (t.scnt + 1) % slots == 0 {
                        t.loc = 0;
                    }
                    if verb != Verb::Send && !checking_same_address(cfg) {
                        t.rem += step;
                        if (t.scnt + 1) % slots == 0 {
                            t.rem = theirs[q].vaddr;
                        }
                    }
                }
                t.scnt += u64::from(post_list);
                totscnt += u64::from(post_list);
                if post_list == 1
                    && (t.scnt % u64::from(cq_mod) == u64::from(cq_mod) - 1
                        || (clock.is_none() && t.scnt + 1 == cfg.iters))
                {
                    t.signaled = true;
                }
            }
        }
        if totccnt < tot || (clock.is_some() && totccnt < totscnt) {
            wcs.clear();
            ep.nic.poll_cq(ep.send_cq, &mut wcs, POLL_BATCH)?;
            if wcs.is_empty() {
                await_cq(ep, ep.send_cq, cfg.use_event, idle, cfg.timeout)?;
                continue;
            }
            idle = Instant::now();
            for wc in &wcs {
                ep.check_wc(wc)?;
                let q = (wc.wr_id >> 48) as usize;
                let i = wc.wr_id & 0xffff_ffff_ffff;
                let Some(t) = tx.get_mut(q) else {
                    return Err(PerfError::Peer("a completion for a QP we do not have"));
                };
                t.ccnt += u64::from(cq_mod);
                totccnt += u64::from(cq_mod);
                if !st.no_peak {
                    let k = if totccnt > tot { tot } else { totccnt };
                    st.complete(k.saturating_sub(1) as usize);
                }
                if clock.is_some_and(|k| k.phase() == Phase::Sample) {
                    counted += u64::from(cq_mod);
                }
                if let Some(rc) = rcheck.as_mut() {
                    rc.check(ep, cfg, q, i, len)?;
                }
                if let Some(ac) = acheck.as_mut() {
                    ac.check(ep, cfg, q, i)?;
                }
            }
            if cfg.progress && last_progress.elapsed() >= Duration::from_secs(1) {
                last_progress = Instant::now();
                let secs = t_start.elapsed().as_secs_f64();
                eprintln!(
                    "  ... {totccnt} messages in {secs:.1} s, {:.2} {}",
                    totccnt as f64 * f64::from(len)
                        / secs
                        / report::format_factor(cfg.report_gbits),
                    if cfg.report_gbits { "Gb/s" } else { "MB/s" }
                );
            }
        } else if clock.is_some() {
            // Everything posted is complete and the window is full: wait for the next phase.
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    if st.no_peak && clock.is_none() {
        st.end();
    }
    let line = match clock {
        Some(k) => {
            let window = match (sample_start, sample_end) {
                (Some(a), Some(b)) => b.saturating_duration_since(a),
                _ => k.window(),
            };
            report::bw_line_window(len, counted, window, cfg.report_gbits)
        }
        None => report::bw_line(&st, len, tot, cq_mod, post_list, cfg.report_gbits, 1.0),
    };
    let v = rcheck.map(|r| r.report).or(acheck.map(|a| a.report));
    Ok((line, v))
}

/// With `--verify` ATOMICs all go to the advertised address (the chain check needs it).
fn checking_same_address(cfg: &PerfConfig) -> bool {
    cfg.verify && cfg.test == Test::AtomicBw
}

/// Post QP `q`'s next request (or list of `post_list`); false if the send queue is full.
#[allow(clippy::too_many_arguments)]
fn post_send_list(
    ep: &Endpoint<'_>,
    cfg: &PerfConfig,
    q: usize,
    t: &QpTx,
    theirs: &[KeyMsg],
    len: u32,
    post_list: u32,
    cq_mod: u32,
    checking: bool,
    acheck: &Option<AtomicCheck>,
) -> Result<bool, PerfError> {
    let rkey = RKey(theirs[q].rkey);
    let step = inc(len as usize, ep.line);
    let slots = (ep.cycle / step).max(1);
    let walk_list = walks(ep, len) || cfg.test.verb() == Verb::Atomic;
    for j in 0..post_list {
        let i = t.scnt + u64::from(j);
        let (loc, rem) = if post_list == 1 {
            (t.loc, t.rem)
        } else if walk_list {
            // A list's requests walk the cycle buffer from its start, the same every time.
            let off = (j as usize % slots) * step;
            (off, theirs[q].vaddr + off as u64)
        } else {
            (0, theirs[q].vaddr)
        };
        let chain = acheck.as_ref().and_then(|a| a.base(q));
        let op = op_for(cfg, rem, rkey, i, chain);
        let sge = match (&ep.vbuf, checking) {
            (Some(vb), true) => Sge {
                addr: vb.addr() + ep.vslot(q, i) as u64,
                length: len,
                lkey: vb.lkey(),
            },
            _ => ep.send_sge(q, loc, len),
        };
        let mut flags = if post_list == 1 {
            if t.signaled || checking {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            }
        } else if (j + 1) % cq_mod == 0 {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        };
        if matches!(cfg.test.verb(), Verb::Send | Verb::Write) && len <= cfg.inline_size {
            flags |= SendFlags::INLINE;
        }
        let wr = SendWr {
            wr_id: (q as u64) << 48 | i,
            op,
            sg_list: smallvec::smallvec![sge],
            flags,
            ud: None,
            xrc_srqn: 0,
        };
        match ep.post_send(q, wr) {
            Ok(()) => {}
            Err(VerbsError::QueueFull) if j == 0 => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// `--perform_warm_up`: a send queue's worth of requests per QP, completed, before measuring.
pub(super) fn warm_up(
    ep: &Endpoint<'_>,
    cfg: &PerfConfig,
    theirs: &[KeyMsg],
    size: u32,
) -> Result<(), PerfError> {
    let len = if cfg.test.verb() == Verb::Atomic {
        8
    } else {
        size
    };
    let n = if cfg.post_list > 1 {
        cfg.post_list
    } else {
        cfg.tx_depth.max(1)
    };
    let mut wcs = Vec::new();
    for (q, th) in theirs.iter().enumerate().take(ep.nq()) {
        for i in 0..u64::from(n) {
            let op = op_for(cfg, th.vaddr, RKey(th.rkey), i, None);
            let op = match op {
                // A warm-up must not change the peer's memory under a CMP_AND_SWAP check.
                SendOp::AtomicCmpSwp {
                    remote_addr, rkey, ..
                } if cfg.verify => SendOp::AtomicFetchAdd {
                    remote_addr,
                    rkey,
                    add: 0,
                },
                o => o,
            };
            ep.post_send(
                q,
                SendWr::new((q as u64) << 48 | i, op, vec![ep.send_sge(q, 0, len)]),
            )?;
        }
        let mut got = 0;
        let idle = Instant::now();
        while got < n {
            wcs.clear();
            ep.nic.poll_cq(ep.send_cq, &mut wcs, POLL_BATCH)?;
            for wc in &wcs {
                ep.check_wc(wc)?;
                got += 1;
            }
            if wcs.is_empty() {
                await_cq(ep, ep.send_cq, cfg.use_event, idle, cfg.timeout)?;
            }
        }
    }
    Ok(())
}

/// One QP's receive queue as perftest keeps it: how many were posted, and where the next one
/// lands (receives walk the cycle buffer like sends).
#[derive(Clone, Copy, Debug, Default)]
struct QpRx {
    posted: u64,
    received: u64,
    unused: u64,
    off: usize,
}

/// `ctx_set_recv_wqes`: `-r` receives per QP for messages of `size` (posted before the
/// barrier that lets the sender start).
pub(super) fn post_receives(
    ep: &Endpoint<'_>,
    cfg: &PerfConfig,
    size: u32,
) -> Result<(), PerfError> {
    let lists = (ep.rx_depth_per_qp(cfg) / cfg.recv_post_list.max(1)).max(1);
    let per_qp = lists * cfg.recv_post_list.max(1);
    let walk = cfg.test.is_bw() && walks(ep, size) && cfg.recv_post_list <= 1;
    for q in 0..ep.nq() {
        if ep.vbuf.is_some() {
            for j in 0..u64::from(per_qp) {
                post_verify_recv(ep, q, ep.vslot_index(q, j), size)?;
            }
        } else {
            ep.post_recvs(q, per_qp, size, walk)?;
        }
    }
    Ok(())
}

/// `--verify`: a receive into slot `slot` of the check buffer (its `wr_id`), to be checked
/// when it completes. Without an SRQ QP `q` posts it and takes it; with one, any QP may.
fn post_verify_recv(ep: &Endpoint<'_>, q: usize, slot: usize, size: u32) -> Result<(), PerfError> {
    let Some(vb) = &ep.vbuf else {
        return Ok(());
    };
    ep.post_recv(
        q,
        RecvWr {
            wr_id: slot as u64,
            sg_list: smallvec::smallvec![Sge {
                addr: vb.addr() + (slot * ep.vstride) as u64,
                length: size + ep.grh as u32,
                lkey: vb.lkey(),
            }],
        },
    )?;
    Ok(())
}

/// The receiving side's state for one size, after `post_receives`.
struct Receiver {
    rx: Vec<QpRx>,
    posted_initial: u64,
    walk: bool,
    step: usize,
    slots: usize,
    /// `--verify`: the check buffer's slots no receive is posted into (with an SRQ a message
    /// of any QP may land in any posted slot, so a freed slot goes back to one pool).
    free: Vec<usize>,
}

impl Receiver {
    fn new(ep: &Endpoint<'_>, cfg: &PerfConfig, size: u32) -> Self {
        let lists = (ep.rx_depth_per_qp(cfg) / cfg.recv_post_list.max(1)).max(1);
        let per_qp = u64::from(lists * cfg.recv_post_list.max(1));
        let step = inc(size as usize, ep.line);
        Receiver {
            rx: vec![
                QpRx {
                    posted: per_qp,
                    ..QpRx::default()
                };
                ep.nq()
            ],
            posted_initial: per_qp,
            walk: walks(ep, size) && cfg.recv_post_list <= 1,
            step,
            slots: (ep.cycle / step).max(1),
            free: if ep.vbuf.is_some() {
                (0..ep.nq())
                    .flat_map(|q| (per_qp as usize..ep.vslots).map(move |j| q * ep.vslots + j))
                    .collect()
            } else {
                Vec::new()
            },
        }
    }

    /// A receive completed on QP `q` (`wc`): check it (`--verify`), and post more while fewer
    /// than `-n` were posted (every message gets exactly one receive).
    fn completed(
        &mut self,
        ep: &Endpoint<'_>,
        cfg: &PerfConfig,
        wc: &WorkCompletion,
        size: u32,
        duration: bool,
        checker: &mut SendCheck,
    ) -> Result<(), PerfError> {
        let q = ep.recv_qp(wc)?;
        let l = u64::from(cfg.recv_post_list.max(1));
        let r = &mut self.rx[q];
        let k = r.received;
        r.received += 1;
        r.unused += 1;
        if ep.vbuf.is_some() {
            let slot = wc.wr_id as usize;
            if slot >= ep.vslots * ep.nq() {
                return Err(PerfError::Peer(
                    "a receive completion for a slot we never posted",
                ));
            }
            // A QP's messages complete in order (RC, and UC and UD drop rather than reorder):
            // this is its message k, wherever the SRQ put it.
            checker.check(ep, cfg, q, k, slot, size)?;
            self.free.push(slot);
        }
        if (duration || r.posted + l <= cfg.iters) && r.unused >= l {
            for _ in 0..l {
                if ep.vbuf.is_some() {
                    let slot = self.free.pop().ok_or(PerfError::Peer(
                        "more receives outstanding than check slots",
                    ))?;
                    post_verify_recv(ep, q, slot, size)?;
                } else {
                    ep.post_recv(
                        q,
                        RecvWr {
                            wr_id: q as u64,
                            sg_list: smallvec::smallvec![ep.recv_sge(q, r.off, size)],
                        },
                    )?;
                }
                r.posted += 1;
            }
            r.unused -= l;
            if self.walk {
                r.off += self.step;
                if (r.posted + 1) % self.slots as u64 == 0 {
                    r.off = 0;
                }
            }
        }
        let _ = self.posted_initial;
        Ok(())
    }
}

/// The passive side of send_bw for one size (`run_iter_bw_server`): timed from the first
/// message to the last, no peak.
pub(super) fn run_iter_bw_server(
    c: &Ctl<'_>,
    ep: &Endpoint<'_>,
    size: u32,
    checker: &mut SendCheck,
) -> Result<BwLine, PerfError> {
    let cfg = c.cfg;
    let nq = ep.nq();
    let tot = cfg.iters * nq as u64;
    let mut rcv = Receiver::new(ep, cfg, size);
    let mut st = BwStamps::new(true, 1);
    let mut clock: Option<DurClock> = None;
    let (mut rcnt, mut counted) = (0u64, 0u64);
    let (mut sample_start, mut sample_end) = (None, None);
    let mut wcs = Vec::with_capacity(POLL_BATCH);
    let mut idle = Instant::now();
    let mut first = true;
    loop {
        if let Some(k) = clock {
            let p = k.phase();
            if p != Phase::Start && sample_start.is_none() {
                sample_start = Some(Instant::now());
            }
            if matches!(p, Phase::StopSample | Phase::End) && sample_end.is_none() {
                sample_end = Some(Instant::now());
            }
            if p == Phase::End {
                break;
            }
        } else if cfg.duration.is_none() && rcnt >= tot {
            break;
        }
        wcs.clear();
        ep.nic.poll_cq(ep.recv_cq, &mut wcs, POLL_BATCH)?;
        if wcs.is_empty() {
            if clock.is_some() {
                // A -D run ends on its clock, also when the sender has stopped.
                await_cq(ep, ep.recv_cq, cfg.use_event, Instant::now(), cfg.timeout)?;
            } else {
                await_cq(ep, ep.recv_cq, cfg.use_event, idle, cfg.timeout)?;
            }
            continue;
        }
        idle = Instant::now();
        if first {
            first = false;
            match cfg.duration {
                Some(d) => clock = Some(DurClock::new(cfg, d)),
                None => st.start(),
            }
        }
        for wc in &wcs {
            ep.check_wc(wc)?;
            rcnt += 1;
            if clock.is_some_and(|k| k.phase() == Phase::Sample) {
                counted += 1;
            }
            rcv.completed(ep, cfg, wc, size, cfg.duration.is_some(), checker)?;
        }
    }
    Ok(match (clock, cfg.duration) {
        (Some(k), _) => {
            let window = match (sample_start, sample_end) {
                (Some(a), Some(b)) => b.saturating_duration_since(a),
                _ => k.window(),
            };
            report::bw_line_window(size, counted, window, cfg.report_gbits)
        }
        (None, Some(_)) => report::bw_line_window(size, 0, Duration::ZERO, cfg.report_gbits),
        (None, None) => {
            st.end();
            report::bw_line(&st, size, tot, 1, 1, cfg.report_gbits, 1.0)
        }
    })
}

/// Bidirectional send_bw for one size (`run_iter_bi`): both sides send and receive; the
/// server starts sending when the client's first message arrives.
pub(super) fn run_iter_bi(
    c: &Ctl<'_>,
    ep: &Endpoint<'_>,
    theirs: &[KeyMsg],
    size: u32,
    checker: &mut SendCheck,
) -> Result<BwLine, PerfError> {
    let cfg = c.cfg;
    let nq = ep.nq();
    let clock = cfg.duration.map(|d| DurClock::new(cfg, d));
    let iters = if clock.is_some() { u64::MAX } else { cfg.iters };
    let tot = if clock.is_some() {
        0
    } else {
        cfg.iters * nq as u64
    };
    let cq_mod = cfg.cq_mod.max(1);
    let post_list = cfg.post_list.max(1);
    if cfg.verify {
        verify::fill_sender(ep, cfg, size)?;
    }
    let step = inc(size as usize, ep.line) as u64;
    let slots = (ep.cycle as u64 / step).max(1);
    let walk = walks(ep, size) && post_list == 1;
    let mut tx: Vec<QpTx> = (0..nq)
        .map(|q| QpTx {
            scnt: 0,
            ccnt: 0,
            loc: 0,
            rem: theirs[q].vaddr,
            signaled: cq_mod == 1,
        })
        .collect();
    let mut rcv = Receiver::new(ep, cfg, size);
    let mut st = BwStamps::new(
        cfg.no_peak || clock.is_some(),
        (cfg.iters as usize).saturating_mul(nq),
    );
    if st.no_peak && clock.is_none() {
        st.start();
    }
    let mut before_first_rx = c.machine == crate::oob::perftest::Role::Server;
    let (mut totscnt, mut totccnt, mut totrcnt, mut counted) = (0u64, 0u64, 0u64, 0u64);
    let (mut sample_start, mut sample_end) = (None, None);
    let mut wcs = Vec::with_capacity(POLL_BATCH);
    let mut idle = Instant::now();
    loop {
        let phase = clock.map(|k| k.phase());
        if let Some(p) = phase {
            if p != Phase::Start && sample_start.is_none() {
                sample_start = Some(Instant::now());
            }
            if matches!(p, Phase::StopSample | Phase::End) && sample_end.is_none() {
                sample_end = Some(Instant::now());
            }
            if p == Phase::End {
                break;
            }
        } else if totccnt >= tot && totrcnt >= tot {
            break;
        }
        if !before_first_rx {
            for (q, t) in tx.iter_mut().enumerate() {
                loop {
                    if !(t.scnt < iters
                        && t.scnt + u64::from(post_list) <= t.ccnt + u64::from(cfg.tx_depth))
                    {
                        break;
                    }
                    if post_list == 1
                        && cq_mod > 1
                        && t.scnt % u64::from(cq_mod) == 0
                        && !(clock.is_none() && t.scnt + 1 == cfg.iters)
                    {
                        t.signaled = false;
                    }
                    if !st.no_peak {
                        st.post(totscnt as usize);
                    }
                    if !post_send_list(
                        ep, cfg, q, t, theirs, size, post_list, cq_mod, false, &None,
                    )? {
                        break;
                    }
                    if walk {
                        t.loc += step as usize;
                        if (t.scnt + 1) % slots == 0 {
                            t.loc = 0;
                        }
                    }
                    t.scnt += u64::from(post_list);
                    totscnt += u64::from(post_list);
                    if post_list == 1
                        && (t.scnt % u64::from(cq_mod) == u64::from(cq_mod) - 1
                            || (clock.is_none() && t.scnt + 1 == cfg.iters))
                    {
                        t.signaled = true;
                    }
                }
            }
        }
        let mut work = false;
        wcs.clear();
        ep.nic
            .poll_cq(ep.recv_cq, &mut wcs, cfg.rx_depth.max(1) as usize)?;
        if !wcs.is_empty() {
            work = true;
            before_first_rx = false;
        }
        for wc in &wcs {
            ep.check_wc(wc)?;
            totrcnt += 1;
            rcv.completed(ep, cfg, wc, size, clock.is_some(), checker)?;
        }
        wcs.clear();
        ep.nic.poll_cq(ep.send_cq, &mut wcs, POLL_BATCH)?;
        if !wcs.is_empty() {
            work = true;
        }
        for wc in &wcs {
            ep.check_wc(wc)?;
            let q = (wc.wr_id >> 48) as usize;
            let Some(t) = tx.get_mut(q) else {
                return Err(PerfError::Peer("a completion for a QP we do not have"));
            };
            t.ccnt += u64::from(cq_mod);
            totccnt += u64::from(cq_mod);
            if !st.no_peak {
                let k = if totccnt > tot { tot } else { totccnt };
                st.complete(k.saturating_sub(1) as usize);
            }
            if clock.is_some_and(|k| k.phase() == Phase::Sample) {
                counted += u64::from(cq_mod);
            }
        }
        if work {
            idle = Instant::now();
        } else {
            if idle.elapsed() > cfg.timeout {
                return Err(PerfError::Stalled(cfg.timeout));
            }
            if ep.nic.progress() == 0 {
                if idle.elapsed() < crate::runtime::spin_budget(SPIN_BEFORE_SLEEP) {
                    std::hint::spin_loop();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
    }
    if st.no_peak && clock.is_none() {
        st.end();
    }
    Ok(match clock {
        Some(k) => {
            let window = match (sample_start, sample_end) {
                (Some(a), Some(b)) => b.saturating_duration_since(a),
                _ => k.window(),
            };
            report::bw_line_window(size, counted, window, cfg.report_gbits)
        }
        None => report::bw_line(&st, size, tot, cq_mod, post_list, cfg.report_gbits, 1.0),
    })
}

/// `--run_infinitely`, the sending side: send for ever, print a result every `-D` seconds
/// (default 5). Returns only with an error.
pub(super) fn run_infinitely(
    c: &Ctl<'_>,
    ep: &Endpoint<'_>,
    theirs: &[KeyMsg],
    size: u32,
    pr: &mut Printer<'_>,
) -> Result<(), PerfError> {
    let cfg = c.cfg;
    let nq = ep.nq();
    let len = if cfg.test.verb() == Verb::Atomic {
        8
    } else {
        size
    };
    let cq_mod = cfg.cq_mod.max(1);
    let post_list = cfg.post_list.max(1);
    let period = cfg.duration.unwrap_or(Duration::from_secs(5));
    let step = inc(len as usize, ep.line) as u64;
    let slots = (ep.cycle as u64 / step).max(1);
    let walk = walks(ep, len) && post_list == 1;
    let mut tx: Vec<QpTx> = (0..nq)
        .map(|q| QpTx {
            scnt: 0,
            ccnt: 0,
            loc: 0,
            rem: theirs[q].vaddr,
            signaled: cq_mod == 1,
        })
        .collect();
    let mut wcs = Vec::with_capacity(POLL_BATCH);
    let mut idle = Instant::now();
    let mut since = Instant::now();
    let mut done = 0u64;
    loop {
        for q in 0..nq {
            loop {
                let t = &mut tx[q];
                if t.scnt + u64::from(post_list) > t.ccnt + u64::from(cfg.tx_depth) {
                    break;
                }
                if post_list == 1 && cq_mod > 1 && t.scnt % u64::from(cq_mod) == 0 {
                    t.signaled = false;
                }
                if !post_send_list(ep, cfg, q, t, theirs, len, post_list, cq_mod, false, &None)? {
                    break;
                }
                let t = &mut tx[q];
                if walk {
                    t.loc += step as usize;
                    if (t.scnt + 1) % slots == 0 {
                        t.loc = 0;
                    }
                    if cfg.test.verb() != Verb::Send {
                        t.rem += step;
                        if (t.scnt + 1) % slots == 0 {
                            t.rem = theirs[q].vaddr;
                        }
                    }
                }
                t.scnt += u64::from(post_list);
                if post_list == 1 && t.scnt % u64::from(cq_mod) == u64::from(cq_mod) - 1 {
                    t.signaled = true;
                }
            }
        }
        wcs.clear();
        ep.nic.poll_cq(ep.send_cq, &mut wcs, POLL_BATCH)?;
        if wcs.is_empty() {
            await_cq(ep, ep.send_cq, cfg.use_event, idle, cfg.timeout)?;
        } else {
            idle = Instant::now();
        }
        for wc in &wcs {
            ep.check_wc(wc)?;
            let q = (wc.wr_id >> 48) as usize;
            if let Some(t) = tx.get_mut(q) {
                t.ccnt += u64::from(cq_mod);
            }
            done += u64::from(cq_mod);
        }
        if since.elapsed() >= period {
            let l = report::bw_line_window(len, done, since.elapsed(), cfg.report_gbits);
            c.print_bw(pr, &l)?;
            since = Instant::now();
            done = 0;
        }
    }
}

/// `--run_infinitely`, send_bw's receiving side: keep receiving for ever, printing a result
/// every `-D` seconds. Returns only with an error.
pub(super) fn run_infinitely_server(
    c: &Ctl<'_>,
    ep: &Endpoint<'_>,
    size: u32,
    pr: &mut Printer<'_>,
) -> Result<(), PerfError> {
    let cfg = c.cfg;
    let period = cfg.duration.unwrap_or(Duration::from_secs(5));
    let mut rcv = Receiver::new(ep, cfg, size);
    let mut checker = SendCheck::new(cfg, c.tcp_role);
    let mut wcs = Vec::with_capacity(POLL_BATCH);
    // The sender may pause (it is someone else's process): no stall error here.
    let mut since = Instant::now();
    let mut done = 0u64;
    loop {
        wcs.clear();
        ep.nic.poll_cq(ep.recv_cq, &mut wcs, POLL_BATCH)?;
        if wcs.is_empty() {
            await_cq(ep, ep.recv_cq, cfg.use_event, Instant::now(), Duration::MAX)?;
        }
        for wc in &wcs {
            ep.check_wc(wc)?;
            rcv.completed(ep, cfg, wc, size, true, &mut checker)?;
            done += 1;
        }
        if since.elapsed() >= period {
            let l = report::bw_line_window(size, done, since.elapsed(), cfg.report_gbits);
            c.print_bw(pr, &l)?;
            since = Instant::now();
            done = 0;
        }
    }
}
