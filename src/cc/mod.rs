//! Congestion control for RoCE v2: the sender's rate controller ([`RateControl`]), the
//! per-flow transmit [`Pacer`] that enforces the controller's rate, and DCQCN
//! ([`dcqcn`]: the reaction point and the notification point).
//!
//! # Contract
//!
//! Everything here is a sans-IO state machine in the quinn-proto style: **time is an
//! argument** of every hook (`now`, a [`crate::time::Instant`] in nanoseconds), nothing
//! reads a clock, nothing allocates after construction, and a run is a pure function of the
//! calls made. A controller is driven with three kinds of calls:
//!
//! - **handlers**: [`on_cnp`](RateControl::on_cnp) (a congestion notification arrived for
//!   this flow) and [`on_sent`](RateControl::on_sent) (a packet of this flow left);
//! - **timers**: [`next_timer`](RateControl::next_timer) says when the controller next has
//!   work, and [`on_timer`](RateControl::on_timer) runs everything due at or before `now`.
//!   Calling `on_timer` early or more than once is harmless; every handler also runs the
//!   timers that are due before it acts, so a late `on_timer` never reorders events;
//! - **getters**: [`rate_bps`](RateControl::rate_bps) is the rate the flow may send at now,
//!   reflecting every event processed so far.
//!
//! The transmit path enforces the rate with a [`Pacer`] (a token bucket in picosecond
//! arithmetic): before each packet ask [`Pacer::earliest_send`], and after sending call
//! [`Pacer::on_send`]; whenever the controller's rate may have changed (after `on_cnp`,
//! `on_timer` or `on_sent`) call [`Pacer::set_rate`] with the new
//! [`rate_bps`](RateControl::rate_bps).
//!
//! # Wiring into the RC engine (for the integrator)
//!
//! Per QP (a DCQCN "flow" is a QP):
//!
//! 1. On creating/connecting the QP: `cc = CcConfig::build(line_rate)`,
//!    `pacer = Pacer::new(cc.rate_bps(), burst)`; the responder side keeps a
//!    [`dcqcn::NotificationPoint`].
//! 2. Transmit path (`poll_transmit`): before emitting a data packet of `n` frame bytes, if
//!    `pacer.earliest_send(now, n) > now` the QP is not ready: do not emit, and arm a timer
//!    for that instant (report it from `poll_timeout`). Otherwise emit it, then call
//!    `cc.on_sent(now, n)` and `pacer.on_send(now, n)`, then `pacer.set_rate(now,
//!    cc.rate_bps())`. ACKs, NAKs, read responses and CNPs should not be paced by the
//!    requester's controller (read responses are the responder's data: pace them with the
//!    responder QP's own controller if it has one).
//! 3. Receive path (`handle_roce`): a CNP (opcode 0x81) for QP `q` → `cc.on_cnp(now)` then
//!    `pacer.set_rate(now, cc.rate_bps())`. A packet arriving with ECN = CE for QP `q` →
//!    if `np.on_ce(now)` queue a CNP to the sender's QPN (see roce-facts: BTH opcode 0x81,
//!    BECN set, 16 zero bytes, DSCP 48), sent unpaced and ahead of data.
//! 4. Timers: fold `cc.next_timer()` and the pacer's pending instant into the QP's
//!    deadline; on expiry call `cc.on_timer(now)` then `pacer.set_rate(now, cc.rate_bps())`
//!    and retry the transmit.

pub mod dcqcn;
mod pacer;

pub use pacer::Pacer;

use crate::time::Instant;
use core::fmt;

/// A sender-side rate controller (the DCQCN "reaction point" or a trivial one).
///
/// See the [module documentation](self) for the calling contract. Implementations are
/// deterministic: the same calls with the same `now` values give the same rates.
pub trait RateControl: fmt::Debug + Send {
    /// A short name for logs and output (`"dcqcn"`, `"none"`).
    fn name(&self) -> &'static str;

    /// The rate the flow may send at, in bits per second (never 0).
    fn rate_bps(&self) -> u64;

    /// A congestion notification packet for this flow arrived at `now`.
    fn on_cnp(&mut self, now: Instant);

    /// A packet of `bytes` bytes (the whole frame) of this flow left at `now`.
    fn on_sent(&mut self, now: Instant, bytes: usize);

    /// When the controller next needs [`on_timer`](Self::on_timer), if ever.
    fn next_timer(&self) -> Option<Instant>;

    /// Run every timer due at or before `now` (a no-op if none is).
    fn on_timer(&mut self, now: Instant);

    /// The controller's congestion estimate at `now`, for diagnostics (DCQCN's α).
    fn alpha(&self, _now: Instant) -> Option<f64> {
        None
    }

    /// The controller's target rate in bits per second, for diagnostics (DCQCN's R_T).
    fn target_rate_bps(&self) -> Option<u64> {
        None
    }
}

/// No congestion control: always the line rate; CNPs are ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unlimited {
    line_rate_bps: u64,
}

impl Unlimited {
    /// A controller that always allows `line_rate_bps` (at least 1).
    pub fn new(line_rate_bps: u64) -> Self {
        Unlimited {
            line_rate_bps: line_rate_bps.max(1),
        }
    }
}

impl RateControl for Unlimited {
    fn name(&self) -> &'static str {
        "none"
    }
    fn rate_bps(&self) -> u64 {
        self.line_rate_bps
    }
    fn on_cnp(&mut self, _now: Instant) {}
    fn on_sent(&mut self, _now: Instant, _bytes: usize) {}
    fn next_timer(&self) -> Option<Instant> {
        None
    }
    fn on_timer(&mut self, _now: Instant) {}
}

/// Which controller a flow uses: the value a QP or an experiment is configured with.
#[derive(Clone, Debug, PartialEq)]
pub enum CcConfig {
    /// No congestion control ([`Unlimited`]): send at the line rate.
    None,
    /// DCQCN with these parameters (their `line_rate_bps` is replaced by the one given to
    /// [`build`](Self::build)).
    Dcqcn(dcqcn::Params),
}

impl CcConfig {
    /// A controller for a flow on a port of `line_rate_bps`.
    pub fn build(&self, line_rate_bps: u64) -> Box<dyn RateControl> {
        match self {
            CcConfig::None => Box::new(Unlimited::new(line_rate_bps)),
            CcConfig::Dcqcn(p) => {
                let mut p = p.clone();
                p.line_rate_bps = line_rate_bps;
                Box::new(dcqcn::Dcqcn::new(p))
            }
        }
    }

    /// The name the built controller reports.
    pub fn name(&self) -> &'static str {
        match self {
            CcConfig::None => "none",
            CcConfig::Dcqcn(_) => "dcqcn",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_ignores_everything() {
        let mut u = Unlimited::new(40_000_000_000);
        u.on_cnp(Instant::from_micros(1));
        u.on_sent(Instant::from_micros(2), 4096);
        u.on_timer(Instant::from_micros(3));
        assert_eq!(u.rate_bps(), 40_000_000_000);
        assert_eq!(u.next_timer(), None);
        assert_eq!(u.alpha(Instant::ZERO), None);
        assert_eq!(u.name(), "none");
        assert_eq!(Unlimited::new(0).rate_bps(), 1);
    }

    #[test]
    fn config_builds_with_the_port_rate() {
        let d = CcConfig::Dcqcn(dcqcn::Params::paper()).build(25_000_000_000);
        assert_eq!(d.name(), "dcqcn");
        assert_eq!(d.rate_bps(), 25_000_000_000);
        let n = CcConfig::None.build(10_000_000_000);
        assert_eq!((n.name(), n.rate_bps()), ("none", 10_000_000_000));
    }
}
