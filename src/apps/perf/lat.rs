//! The latency tests' data path, as perftest runs it: `run_iter_lat_send` (ping-pong of
//! SENDs, the client first), `run_iter_lat_write` (each side WRITEs the iteration number into
//! the last byte of the other's buffer and spins on its own, the server first) and
//! `run_iter_lat` (READ or ATOMIC, the client alone, one at a time). Each post is stamped; the
//! report is computed from the gaps between posts ([`report::lat_line`]).

use super::bw::{await_cq, DurClock, Phase, SPIN_BEFORE_SLEEP};
use super::ctx::Endpoint;
use super::report::{self, LatDurationLine, LatLine};
use super::{Ctl, PerfError, Printer, Verb};
use crate::oob::perftest::{KeyMsg, Role};
use crate::verbs::{RecvWr, SendFlags, SendOp, SendWr, WorkCompletion};
use crate::wire::RKey;
use std::time::{Duration, Instant};

/// A latency run's result.
pub(super) enum LatResult {
    Iterations(LatLine),
    Duration(LatDurationLine),
}

/// How long a latency test busy-polls for one completion before it sleeps. Longer than any
/// round trip it measures: with a spin shorter than the peer's wake-up from a sleep (50 µs
/// was: ~80 µs on the 2-core VM), a ping-pong where both sides once slept stayed asleep,
/// every round trip ~170 µs, for hundreds of iterations (the 40–90 µs p99 runs).
pub(super) const LAT_SPIN_BEFORE_SLEEP: Duration = Duration::from_millis(2);

/// Block until one completion arrives on `cq` (busy-polling first: a latency test).
fn one(
    ep: &Endpoint<'_>,
    cq: crate::verbs::Cq,
    events: bool,
    timeout: Duration,
    buf: &mut Vec<WorkCompletion>,
    stop: &dyn Fn() -> bool,
) -> Result<Option<WorkCompletion>, PerfError> {
    let t0 = Instant::now();
    let spin = crate::runtime::spin_budget(LAT_SPIN_BEFORE_SLEEP);
    let mut spinner = crate::runtime::Spinner::new();
    loop {
        buf.clear();
        if ep.nic.poll_cq(cq, buf, 1)? == 1 {
            ep.check_wc(&buf[0])?;
            return Ok(Some(buf[0]));
        }
        if stop() {
            return Ok(None);
        }
        if !events && t0.elapsed() < spin {
            // Busy-poll as perftest does (poll_cq drives an inline engine).
            spinner.pause();
            continue;
        }
        await_cq(ep, cq, events, t0, timeout)?;
    }
}

/// `--latency_gap`: wait this long before a post.
fn gap(us: u32) {
    if us > 0 {
        let until = Instant::now() + Duration::from_micros(u64::from(us));
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
}

/// The run's end: a latency line from the post stamps, or a duration line.
fn finish(
    c: &Ctl<'_>,
    posted: &[Instant],
    size: u32,
    counted: u64,
    window: Option<Duration>,
    pr: &mut Printer<'_>,
) -> Result<LatResult, PerfError> {
    let verb = c.cfg.test.verb();
    if let Some(w) = window {
        return Ok(LatResult::Duration(report::lat_duration_line(
            size, counted, w, verb,
        )));
    }
    let l = report::lat_line(posted, size, c.cfg.iters, verb);
    if c.cfg.unsorted || c.cfg.histogram {
        // -U: every sample in the order taken; -H: sorted. Then the header again.
        let rtt = if matches!(verb, Verb::Read | Verb::Atomic) {
            1.0
        } else {
            2.0
        };
        let mut d: Vec<f64> = posted
            .windows(2)
            .map(|w| w[1].saturating_duration_since(w[0]).as_secs_f64() * 1e6 / rtt)
            .collect();
        if c.cfg.unsorted {
            pr.line("#, usec")?;
            for (i, x) in d.iter().enumerate() {
                pr.line(&format!("{}, {}", i + 1, c_g(*x)))?;
            }
        }
        d.sort_by(|a, b| a.total_cmp(b));
        if c.cfg.histogram {
            pr.line("#, usec")?;
            for (i, x) in d.iter().take(d.len().saturating_sub(2)).enumerate() {
                pr.line(&format!("{}, {}", i + 1, c_g(*x)))?;
            }
        }
        if c.full() {
            pr.line(report::RESULT_LINE)?;
            pr.line(report::result_header(c.cfg))?;
        }
    }
    Ok(LatResult::Iterations(l))
}

/// C's `%g` (6 significant digits, no trailing zeros).
fn c_g(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let exp = x.abs().log10().floor() as i32;
    if (-4..6).contains(&exp) {
        let decimals = (5 - exp).max(0) as usize;
        let s = format!("{x:.decimals$}");
        let s = if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        };
        s
    } else {
        let s = format!("{x:.5e}");
        // Rust: 1.23450e7 -> C: 1.2345e+07
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        let m = if m.contains('.') {
            m.trim_end_matches('0').trim_end_matches('.')
        } else {
            m
        };
        let e: i32 = e.parse().unwrap_or(0);
        format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
    }
}

/// Post stamps for a run of `iters` (none for a `-D` run).
fn stamps(c: &Ctl<'_>) -> Vec<Instant> {
    if c.cfg.duration.is_some() {
        Vec::new()
    } else {
        Vec::with_capacity(c.cfg.iters as usize)
    }
}

/// `run_iter_lat_send`: SEND ping-pong. The receives were posted before the barrier.
///
/// perftest waits for each signaled send's completion right after posting it, then for the
/// peer's message. Completions are local, and ferroce relaxes that one wait: the next message
/// goes out as soon as the peer's answer is here, while the ACK of our last message may still
/// be on its way (the send before it must be complete: at most two in flight). With a delayed
/// ACK the peer sends its answer first and the ACK right behind it; waiting for that ACK would
/// let our own held ACK's timer fire first, and the answer would no longer carry it. On the
/// wire each message still follows the peer's answer, as in ib_send_lat.
pub(super) fn run_send(
    c: &Ctl<'_>,
    ep: &Endpoint<'_>,
    size: u32,
    pr: &mut Printer<'_>,
) -> Result<LatResult, PerfError> {
    let cfg = c.cfg;
    let clock = cfg.duration.map(|d| DurClock::new(cfg, d));
    let iters = cfg.iters;
    let dur = clock.is_some();
    let stop = || clock.is_some_and(|k| k.phase() == Phase::End);
    let mut posted = stamps(c);
    let (mut scnt, mut rcnt, mut counted) = (0u64, 0u64, 0u64);
    let (mut sample_start, mut sample_end) = (None, None);
    let size_per_qp = u64::from(cfg.rx_depth.max(1));
    let cq_mod = u64::from(cfg.cq_mod.max(1));
    let mut buf = Vec::new();
    let inline = size <= cfg.inline_size;
    // Signaled sends not yet completed.
    let mut in_flight = 0u32;
    let drain = |in_flight: &mut u32, buf: &mut Vec<WorkCompletion>| -> Result<(), PerfError> {
        while *in_flight > 0 {
            buf.clear();
            if ep.nic.poll_cq(ep.send_cq, buf, 4)? == 0 {
                return Ok(());
            }
            for wc in buf.iter() {
                ep.check_wc(wc)?;
                *in_flight = in_flight.saturating_sub(1);
            }
        }
        Ok(())
    };
    while scnt < iters || rcnt < iters || (dur && !stop()) {
        if let Some(k) = clock {
            let p = k.phase();
            if p != Phase::Start && sample_start.is_none() {
                sample_start = Some(Instant::now());
            }
            if matches!(p, Phase::StopSample | Phase::End) && sample_end.is_none() {
                sample_end = Some(Instant::now());
            }
        }
        // The server waits for the client's message first; the client sends first.
        if (rcnt < iters || dur) && !(scnt < 1 && c.machine == Role::Client) {
            let Some(_) = one(ep, ep.recv_cq, cfg.use_event, cfg.timeout, &mut buf, &stop)? else {
                break;
            };
            rcnt += 1;
            if clock.is_some_and(|k| k.phase() == Phase::Sample) {
                counted += 1;
            }
            if dur || rcnt + size_per_qp <= iters {
                ep.post_recv(
                    0,
                    RecvWr {
                        wr_id: 0,
                        sg_list: smallvec::smallvec![ep.recv_sge(0, 0, size)],
                    },
                )?;
            }
        }
        // The send before the last must be complete before the next one.
        drain(&mut in_flight, &mut buf)?;
        while in_flight > 1 {
            if one(ep, ep.send_cq, cfg.use_event, cfg.timeout, &mut buf, &stop)?.is_none() {
                break;
            }
            in_flight -= 1;
        }
        if scnt < iters || (dur && !stop()) {
            gap(cfg.latency_gap);
            if !dur {
                posted.push(Instant::now());
            }
            scnt += 1;
            let signaled = scnt % cq_mod == 0 || (!dur && scnt == iters);
            let mut flags = if signaled {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
            if inline {
                flags |= SendFlags::INLINE;
            }
            ep.post_send(
                0,
                SendWr::new(scnt, SendOp::Send, vec![ep.send_sge(0, 0, size)]).with_flags(flags),
            )?;
            if signaled {
                in_flight += 1;
            }
        }
    }
    while in_flight > 0 {
        if one(ep, ep.send_cq, cfg.use_event, cfg.timeout, &mut buf, &stop)?.is_none() {
            break;
        }
        in_flight -= 1;
    }
    let window = clock.map(|k| match (sample_start, sample_end) {
        (Some(a), Some(b)) => b.saturating_duration_since(a),
        _ => k.window(),
    });
    finish(c, &posted, size, counted, window, pr)
}

/// `run_iter_lat_write`: WRITE ping-pong through memory. The last byte of each message is the
/// iteration number (`(char)++scnt`); each side spins on the same byte of its own buffer for
/// the number it expects next. The server writes first.
pub(super) fn run_write(
    c: &Ctl<'_>,
    ep: &Endpoint<'_>,
    theirs: &KeyMsg,
    size: u32,
    pr: &mut Printer<'_>,
) -> Result<LatResult, PerfError> {
    let cfg = c.cfg;
    let q = ep.qps[0];
    let len = size.max(1);
    let clock = cfg.duration.map(|d| DurClock::new(cfg, d));
    let dur = clock.is_some();
    let iters = cfg.iters;
    let stop = || clock.is_some_and(|k| k.phase() == Phase::End);
    let mut posted = stamps(c);
    let (mut scnt, mut ccnt, mut rcnt, mut counted) = (0u64, 0u64, 0u64, 0u64);
    let (mut sample_start, mut sample_end) = (None, None);
    let mut buf = Vec::new();
    let mark = len as usize - 1;
    let (mr, base) = ep.advertised(0);
    let inline = len <= cfg.inline_size;
    while scnt < iters || ccnt < iters || rcnt < iters || (dur && !stop()) {
        if let Some(k) = clock {
            let p = k.phase();
            if p != Phase::Start && sample_start.is_none() {
                sample_start = Some(Instant::now());
            }
            if matches!(p, Phase::StopSample | Phase::End) && sample_end.is_none() {
                sample_end = Some(Instant::now());
            }
        }
        if (rcnt < iters || dur) && !(scnt < 1 && c.machine == Role::Server) {
            rcnt += 1;
            let want = rcnt as u8;
            let t0 = Instant::now();
            let mut spinner = crate::runtime::Spinner::new();
            while mr.with_bytes(|b| b.get(base + mark).copied()) != Some(want) {
                if stop() {
                    break;
                }
                if t0.elapsed() > cfg.timeout {
                    return Err(PerfError::Stalled(cfg.timeout));
                }
                // No completion tells of a remote WRITE: spin, then let the engine have the
                // core. With an inline engine this thread is what runs it.
                if ep.nic.progress() > 0 {
                    continue;
                }
                if t0.elapsed() < crate::runtime::spin_budget(SPIN_BEFORE_SLEEP) {
                    spinner.pause();
                } else {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        }
        if scnt < iters || dur {
            gap(cfg.latency_gap);
            if !dur {
                posted.push(Instant::now());
            }
            scnt += 1;
            ep.write_send_half(0, mark, &[scnt as u8])?;
            let mut flags = SendFlags::SIGNALED;
            if inline {
                flags |= SendFlags::INLINE;
            }
            ep.nic.post_send(
                q,
                SendWr::new(
                    scnt,
                    SendOp::RdmaWrite {
                        remote_addr: theirs.vaddr,
                        rkey: RKey(theirs.rkey),
                    },
                    vec![ep.send_sge(0, 0, len)],
                )
                .with_flags(flags),
            )?;
        }
        if dur && stop() {
            break;
        }
        if ccnt < iters || dur {
            if one(ep, ep.send_cq, false, cfg.timeout, &mut buf, &stop)?.is_none() {
                break;
            }
            ccnt += 1;
            if clock.is_some_and(|k| k.phase() == Phase::Sample) {
                counted += 1;
            }
        }
    }
    let window = clock.map(|k| match (sample_start, sample_end) {
        (Some(a), Some(b)) => b.saturating_duration_since(a),
        _ => k.window(),
    });
    finish(c, &posted, len, counted, window, pr)
}

/// `run_iter_lat`: READ (or ATOMIC) one at a time, each waited for. Only the client runs it.
pub(super) fn run_read(
    c: &Ctl<'_>,
    ep: &Endpoint<'_>,
    theirs: &KeyMsg,
    size: u32,
    pr: &mut Printer<'_>,
) -> Result<LatResult, PerfError> {
    let cfg = c.cfg;
    let q = ep.qps[0];
    let verb = cfg.test.verb();
    let len = if verb == Verb::Atomic { 8 } else { size.max(1) };
    let clock = cfg.duration.map(|d| DurClock::new(cfg, d));
    let dur = clock.is_some();
    let stop = || clock.is_some_and(|k| k.phase() == Phase::End);
    let mut posted = stamps(c);
    let (mut scnt, mut counted) = (0u64, 0u64);
    let (mut sample_start, mut sample_end) = (None, None);
    let mut buf = Vec::new();
    let rkey = RKey(theirs.rkey);
    let remote_addr = theirs.vaddr;
    while scnt < cfg.iters || (dur && !stop()) {
        if let Some(k) = clock {
            let p = k.phase();
            if p != Phase::Start && sample_start.is_none() {
                sample_start = Some(Instant::now());
            }
            if matches!(p, Phase::StopSample | Phase::End) && sample_end.is_none() {
                sample_end = Some(Instant::now());
            }
        }
        gap(cfg.latency_gap);
        if !dur {
            posted.push(Instant::now());
        }
        scnt += 1;
        let op = match verb {
            Verb::Atomic if cfg.cmp_swap => SendOp::AtomicCmpSwp {
                remote_addr,
                rkey,
                compare: 0,
                swap: 0,
            },
            Verb::Atomic => SendOp::AtomicFetchAdd {
                remote_addr,
                rkey,
                add: 1,
            },
            _ => SendOp::RdmaRead { remote_addr, rkey },
        };
        ep.nic
            .post_send(q, SendWr::new(scnt, op, vec![ep.send_sge(0, 0, len)]))?;
        if one(ep, ep.send_cq, cfg.use_event, cfg.timeout, &mut buf, &stop)?.is_none() {
            break;
        }
        if clock.is_some_and(|k| k.phase() == Phase::Sample) {
            counted += 1;
        }
    }
    let window = clock.map(|k| match (sample_start, sample_end) {
        (Some(a), Some(b)) => b.saturating_duration_since(a),
        _ => k.window(),
    });
    finish(c, &posted, len, counted, window, pr)
}

#[cfg(test)]
mod tests {
    use super::c_g;

    #[test]
    fn percent_g_like_c() {
        assert_eq!(c_g(661.09), "661.09");
        assert_eq!(c_g(0.5), "0.5");
        assert_eq!(c_g(123456.7), "123457");
        assert_eq!(c_g(1234567.0), "1.23457e+06");
        assert_eq!(c_g(0.0001234), "0.0001234");
    }
}
