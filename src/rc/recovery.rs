//! Fast loss recovery for go-back-N (optional: `DeviceConfig::fast_recovery`, off by default).
//!
//! Go-back-N as IBTA has it pays for a loss in two ways, and this module makes both cheaper
//! without changing what goes on the wire or what the responder must do:
//!
//! - **The local ACK timeout.** A responder NAKs a gap once and then drops silently until the
//!   missing PSN arrives. If that NAK, or the retransmission it asked for, is lost too, only
//!   the local ACK timeout (4.096 µs × 2^timeout: 67 ms at perftest's default 14) restarts
//!   the flow. With 1 % random loss that happens for about one gap in fifty, and the waits
//!   dominated everything else. Here a *probe timeout* (PTO), derived from measured round
//!   trips (RFC 6298's smoothed RTT and variance, one sample at a time, none from
//!   retransmitted packets), fires first when nothing has been acknowledged for that long
//!   and resends from the oldest unacknowledged PSN: exactly what the timeout would do, only
//!   sooner, and without spending the QP's retry count (the local ACK timer keeps running
//!   and still ends in RETRY_EXC_ERR for a peer that is gone). Consecutive probes back off
//!   (×2 each) and are never later than half the local ACK timeout. A resend is always
//!   allowed to a requester: a copy that arrives twice is a duplicate, which the responder
//!   acknowledges (or replays, for READ and ATOMIC) and never executes twice.
//! - **The window.** Each gap costs every packet sent after it, because the responder
//!   drops them: about one window. The window therefore shrinks by half on a loss (at most
//!   once per window of data, as TCP's NewReno does) and grows back by one packet per
//!   window acknowledged, up to `max_inflight`. On a lossless path it stays at
//!   `max_inflight`.

use super::qp::{Qp, ACKREQ_EVERY};
use super::requester::Retry;
use super::timer::Timer;
use crate::ib::Ctx;
use crate::time::{Duration, Instant};
use crate::wire::Psn;

/// The smallest window loss can shrink to, in packets. Measured on the namespace testbed
/// (AF_XDP, 64 KiB WRITE and READ under 1 % loss, 3 s each, Gb/s): floor 8: 7.7 / 9.5;
/// 32: 9.1–9.6 / 10.6–10.8; 64: 10.2–10.5 / 10.0–10.3; 128: 10.5–11.4 / 9.0–9.3; no
/// adaptation (256): 10.3 / 8.5. Below a few engine batches of packets the pipeline stalls
/// between ACKs, which costs more than the packets a loss wastes.
pub(crate) const MIN_WINDOW: u32 = 64;
/// The probe timeout before any round trip was measured.
const INITIAL_PTO: Duration = Duration::from_micros(1000);
/// The shortest probe timeout (an engine round on a loaded host takes tens of µs).
const MIN_PTO: Duration = Duration::from_micros(200);

/// The requester's fast-recovery state (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct Recovery {
    /// Fast recovery is on for this QP.
    pub enabled: bool,
    /// The smoothed round trip and its variance (`None`: no sample yet).
    srtt: Option<Duration>,
    rttvar: Duration,
    /// The packet being timed: its PSN and when it was first sent.
    sample: Option<(Psn, Instant)>,
    /// The go-back-N window in packets (≤ `max_inflight`).
    pub window: u32,
    /// Packets acknowledged towards the next one-packet growth of the window.
    acc: u32,
    /// The oldest unacknowledged PSN when the last acknowledgement was counted.
    last_una: Psn,
    /// The window is not shrunk again until `una` passes this PSN (one halving per window).
    recover: Option<Psn>,
    /// Probes sent since the last progress (each doubles the next probe timeout).
    backoff: u32,
}

impl Recovery {
    /// Fast recovery on (`enabled`) or off, the window at `max_inflight`.
    pub(crate) fn new(enabled: bool, max_inflight: u32) -> Recovery {
        Recovery {
            enabled,
            window: max_inflight.max(1),
            ..Recovery::default()
        }
    }

    /// Start afresh with the send PSN `psn` and the full window `max_inflight`.
    pub(crate) fn reset(&mut self, psn: Psn, max_inflight: u32) {
        *self = Recovery {
            enabled: self.enabled,
            window: max_inflight.max(1),
            last_una: psn,
            ..Recovery::default()
        };
    }

    /// The probe timeout: srtt + 4·rttvar (or the initial value), at least [`MIN_PTO`],
    /// doubled per probe without progress.
    fn pto(&self) -> Duration {
        let base = match self.srtt {
            Some(s) => s + self.rttvar * 4,
            None => INITIAL_PTO,
        };
        base.max(MIN_PTO)
            .saturating_mul(1u32 << self.backoff.min(16))
    }

    fn rtt_sample(&mut self, r: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                let d = s.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + d) / 4;
                self.srtt = Some((s * 7 + r) / 8);
            }
        }
    }
}

impl Qp {
    /// The go-back-N window in force: the adaptive one with fast recovery, else
    /// `max_inflight`.
    pub(super) fn window(&self) -> u32 {
        if self.rec.enabled {
            self.rec.window.clamp(1, self.req.max_inflight)
        } else {
            self.req.max_inflight
        }
    }

    /// AckReq on at least every this many packets of a long message: [`ACKREQ_EVERY`], or
    /// half the window when that is smaller (a window that closes before the next AckReq
    /// would wait for a probe: the responder need not ACK a packet without it).
    pub(super) fn ackreq_every(&self) -> u32 {
        ACKREQ_EVERY.min((self.window() / 2).max(1))
    }

    /// A request packet at `psn` left for the first time at `now`: time it if nothing is.
    pub(super) fn rec_on_first_send(&mut self, psn: Psn, now: Instant) {
        if self.rec.enabled && self.rec.sample.is_none() {
            self.rec.sample = Some((psn, now));
        }
    }

    /// The oldest unacknowledged PSN moved forward (to `self.req.una`) at `now`: take the
    /// round-trip sample if it is acknowledged, grow the window, end the backoff.
    pub(super) fn rec_on_progress(&mut self, now: Instant) {
        if !self.rec.enabled {
            return;
        }
        let una = self.req.una;
        let acked = una.distance_from(self.rec.last_una);
        self.rec.last_una = una;
        if let Some((p, t)) = self.rec.sample {
            if una.after(p) {
                self.rec.sample = None;
                self.rec.rtt_sample(now - t);
            }
        }
        if self.rec.recover.is_some_and(|r| !una.before(r)) {
            self.rec.recover = None;
        }
        self.rec.backoff = 0;
        if una == self.req.hwm {
            self.timers.stop(Timer::Probe);
        }
        // Additive increase: one packet per window acknowledged.
        if acked < (1 << 23) {
            self.rec.acc += acked;
            while self.rec.acc >= self.rec.window.max(1) && self.rec.window < self.req.max_inflight
            {
                self.rec.acc -= self.rec.window.max(1);
                self.rec.window += 1;
            }
            if self.rec.window >= self.req.max_inflight {
                self.rec.acc = 0;
            }
        }
    }

    /// A loss was detected (sequence NAK, response gap, timeout, probe): halve the window
    /// once per window of data; the sample in flight may be a retransmission now (Karn).
    pub(super) fn rec_on_loss(&mut self) {
        if !self.rec.enabled {
            return;
        }
        self.rec.sample = None;
        if self.rec.recover.is_none() {
            self.rec.window = (self.rec.window / 2).max(MIN_WINDOW);
            self.rec.acc = 0;
            self.rec.recover = Some(self.req.hwm);
        }
    }

    /// (Re)arm the probe timer from `now` (with the local ACK timer).
    pub(super) fn arm_probe(&mut self, now: Instant) {
        if !self.rec.enabled {
            return;
        }
        let at = self
            .ack_timeout()
            .map(|rto| now + self.rec.pto().min(rto / 2));
        self.timers.set(Timer::Probe, at);
    }

    /// [`Timer::Probe`] fired: nothing acknowledged for a probe timeout. Resend from the
    /// oldest unacknowledged PSN as a local ACK timeout would, without spending a retry.
    pub(super) fn on_probe(&mut self, ctx: &mut Ctx<'_>) {
        self.timers.stop(Timer::Probe);
        if !self.rec.enabled
            || self.req.una == self.req.hwm
            || self.timers.is_armed(Timer::Rnr)
            || !self.timers.is_armed(Timer::Retransmit)
        {
            return;
        }
        self.counters.probes += 1;
        tracing::debug!(qpn = %self.num, una = %self.req.una, hwm = %self.req.hwm,
            srtt = ?self.rec.srtt, pto = ?self.rec.pto(), window = self.rec.window, "requester: probe");
        if let Some(p) = self.req.sr_sent.filter(|p| !p.before(self.req.una)) {
            // Selective repeat with a resend of `p` (alone, or its run) unanswered: the
            // responder keeps what came after the gap, so resend `p` (and its run) again
            // (with AckReq) rather than go back to `una` and resend the oldest WQE whole.
            // The window is not halved: the NAK that asked for `p` did not halve it either
            // (the loss was one packet). Backoff and the local ACK timeout still bound a
            // peer that is gone.
            self.req.sr_resend = Some(p);
            self.rec.backoff += 1;
            self.arm_probe(ctx.now);
            return;
        }
        self.rec_on_loss();
        let una = self.req.una;
        self.req.gap_retry = Some(una);
        self.retry_from(una, Retry::Probe);
        // As after a timeout: the oldest WQE first, the rest once it is acknowledged (a
        // merely slow responder gets one WQE of duplicates, not a window).
        self.req.recovery_until = self.sq.front().filter(|w| w.assigned).map(|w| w.last_psn());
        self.rec.backoff += 1;
        self.arm_probe(ctx.now);
    }
}
