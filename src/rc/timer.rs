//! A QP's timers: one table keyed by [`Timer`], as quinn-proto keeps a connection's.
//!
//! [`TimerTable::next`] is the one place a QP's next deadline is computed, and
//! [`Qp::handle_timeout`](super::qp::Qp::handle_timeout) the one place expired timers are
//! dispatched, in the order of [`Timer::ALL`].

use crate::time::Instant;

/// The timers of an RC queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Timer {
    /// The pacer holds the next data packet back until then.
    Pace = 0,
    /// A lone ACK is held back (delayed ACK) until then.
    AckHold = 1,
    /// The congestion controller's own timer (DCQCN's rate increase and α update): a copy of
    /// `RateControl::next_timer`, refreshed after every call into the controller.
    Cc = 2,
    /// An RNR NAK is being waited out: resend when it fires.
    Rnr = 3,
    /// The local ACK timeout (IBTA 9.7.6.1.3): armed while PSNs are unacknowledged.
    Retransmit = 4,
    /// Fast recovery's probe timeout (`rc/recovery.rs`): armed with the local ACK timer,
    /// earlier than it, when the QP has fast recovery.
    Probe = 5,
}

impl Timer {
    /// Every timer, in dispatch order: the gates of the transmit path first (pacing, held ACK,
    /// rate), then the requester's (an RNR wait that ends resends, and so defers a retransmit
    /// timeout due at the same instant).
    pub(crate) const ALL: [Timer; 6] = [
        Timer::Pace,
        Timer::AckHold,
        Timer::Cc,
        Timer::Rnr,
        Timer::Retransmit,
        Timer::Probe,
    ];
}

/// The deadline of every [`Timer`] (`None`: not armed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TimerTable {
    at: [Option<Instant>; 6],
}

impl TimerTable {
    /// The deadline of `t`.
    pub(crate) fn get(&self, t: Timer) -> Option<Instant> {
        self.at[t as usize]
    }

    /// Arm (`Some`) or stop (`None`) `t`.
    pub(crate) fn set(&mut self, t: Timer, at: Option<Instant>) {
        self.at[t as usize] = at;
    }

    /// Stop `t`.
    pub(crate) fn stop(&mut self, t: Timer) {
        self.at[t as usize] = None;
    }

    /// Whether `t` is armed.
    pub(crate) fn is_armed(&self, t: Timer) -> bool {
        self.at[t as usize].is_some()
    }

    /// Whether `t` is armed and due at `now`.
    pub(crate) fn expired(&self, t: Timer, now: Instant) -> bool {
        self.at[t as usize].is_some_and(|at| at <= now)
    }

    /// The earliest deadline of all.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.at.iter().flatten().min().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_deadline_is_the_earliest_armed_one() {
        let mut t = TimerTable::default();
        assert_eq!(t.next(), None);
        t.set(Timer::Retransmit, Some(Instant::from_micros(50)));
        t.set(Timer::Pace, Some(Instant::from_micros(7)));
        assert_eq!(t.next(), Some(Instant::from_micros(7)));
        assert!(t.expired(Timer::Pace, Instant::from_micros(7)));
        assert!(!t.expired(Timer::Retransmit, Instant::from_micros(49)));
        t.stop(Timer::Pace);
        assert!(!t.is_armed(Timer::Pace));
        assert_eq!(t.next(), Some(Instant::from_micros(50)));
        for (i, timer) in Timer::ALL.iter().enumerate() {
            assert_eq!(*timer as usize, i, "ALL lists the timers by index");
        }
    }
}
