//! The egress queue of a link or a switch port, the one implementation of the idea that the
//! simulated network ([`super::net`]), the incast model ([`super::incast`]) and
//! `ferroce switch` share: a FIFO drained by a *virtual link* at a fixed rate, tail drop at a
//! buffer limit, and RED/ECN marking by the backlog an arriving frame finds.
//!
//! # Model
//!
//! - **The virtual link** serialises one frame at a time, FIFO: a frame starts when the
//!   previous one has finished (or on arrival, if the link is idle) and takes
//!   `bytes × 8 / rate` seconds, in whole nanoseconds with the sub-nanosecond remainder
//!   carried to the next frame while the link stays busy, so the long-run rate is exact.
//!   Without a rate a frame takes no time and never waits.
//! - **The backlog** at an instant is the bytes of the frames admitted and not fully
//!   serialised by then: the frame on the wire counts whole until its last bit has left.
//! - **Admission** ([`EgressConfig::admit`]), with the backlog `found` a frame finds on
//!   arrival, itself not included:
//!   1. *tail drop* if `found > 0` and `found + bytes` exceeds the limit (a frame that finds
//!      the queue empty is always admitted, so a limit below one frame means "no buffer",
//!      not "no traffic");
//!   2. *RED*: marked with the [`Red`] probability of `found`; a uniform draw is asked for
//!      only when that probability is above zero.
//!
//! What "bytes" are is the caller's: the simulator counts frame bytes, `ferroce switch` adds
//! Ethernet's per-frame overhead (preamble, FCS, inter-frame gap) to each. Marking the frame
//! (rewriting its ECN bits, [`super::mark_ce`]) is the caller's too: the incast model has no
//! frames, and the switch counts frames that were not ECN-capable.
//!
//! # Cost
//!
//! [`EgressQueue::offer`] is amortised O(1); [`EgressQueue::backlog`] and
//! [`EgressQueue::drain_time`] are O(log n) in the frames queued. The queue keeps one
//! `(finish time, bytes admitted)` pair per frame not yet serialised, so with a limit its
//! memory is bounded by the limit over the smallest frame.
//!
//! # Example
//!
//! ```
//! use ferroce::sim::{EgressConfig, EgressQueue, Red, Verdict};
//! use ferroce::time::Instant;
//!
//! // 1 Gb/s, a 3000-byte buffer, every frame marked above 1000 bytes of backlog.
//! let mut q = EgressQueue::new(EgressConfig {
//!     rate_bps: Some(1_000_000_000),
//!     limit_bytes: Some(3_000),
//!     red: Some(Red::new(1_000, 1_000, 1.0)),
//! });
//! let t = Instant::ZERO;
//! let v: Vec<Verdict> = (0..4).map(|_| q.offer(t, 1_000, || 0)).collect();
//! assert!(matches!(v[0], Verdict::Queued { found: 0, mark: false, .. }));
//! assert!(matches!(v[1], Verdict::Queued { found: 1_000, mark: false, .. }));
//! assert!(matches!(v[2], Verdict::Queued { found: 2_000, mark: true, .. }));
//! assert_eq!(v[3], Verdict::Dropped { found: 3_000 });
//! // 1000 bytes take 8 µs: the second frame has left at 16 µs.
//! assert_eq!(q.backlog(Instant::from_nanos(16_000)), 1_000);
//! ```

use crate::rng::hit;
use crate::time::{Duration, Instant};
use std::collections::VecDeque;

/// RED-style ECN marking by instantaneous queue depth, as DCQCN switches do: no marking at or
/// below `kmin_bytes` of backlog, a probability rising linearly to `pmax` at `kmax_bytes`,
/// and every ECT frame marked above `kmax_bytes`. The depth is the backlog the frame finds
/// on arrival, itself not included.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Red {
    /// Backlog at or below which nothing is marked.
    pub kmin_bytes: usize,
    /// Backlog above which every ECT frame is marked.
    pub kmax_bytes: usize,
    /// Marking probability at `kmax_bytes`.
    pub pmax: f64,
}

impl Red {
    /// A RED profile.
    pub const fn new(kmin_bytes: usize, kmax_bytes: usize, pmax: f64) -> Self {
        Red {
            kmin_bytes,
            kmax_bytes,
            pmax,
        }
    }

    /// The marking probability for a frame that finds `queue_bytes` of backlog.
    pub fn probability(&self, queue_bytes: usize) -> f64 {
        if queue_bytes <= self.kmin_bytes {
            0.0
        } else if queue_bytes > self.kmax_bytes {
            1.0
        } else {
            // kmin < queue <= kmax, so the span is positive.
            let span = (self.kmax_bytes - self.kmin_bytes) as f64;
            self.pmax * (queue_bytes - self.kmin_bytes) as f64 / span
        }
    }
}

/// An egress queue's policy and rate. `EgressConfig::default()` is an unlimited link with no
/// buffer limit and no marking.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EgressConfig {
    /// The virtual link's rate in bits per second; `None` (or 0): frames take no time.
    pub rate_bps: Option<u64>,
    /// Tail-drop limit on the backlog, in bytes; `None`: no limit.
    pub limit_bytes: Option<u64>,
    /// Marking by backlog; `None`: no marking.
    pub red: Option<Red>,
}

/// The admission decision for one frame (see [`EgressConfig::admit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Tail-dropped: the buffer is full.
    Drop,
    /// Admitted, and whether RED selected it for marking.
    Accept {
        /// RED selected the frame (the caller marks it CE if it is ECN-capable).
        mark: bool,
    },
}

impl EgressConfig {
    /// Tail drop, then RED, for a frame of `bytes` that finds `found` bytes of backlog (see
    /// the module documentation). `draw` gives a uniform `u64`; it is called once, and only
    /// when the marking probability is above zero, so the decisions are a function of the
    /// sequence of backlogs and the draws.
    pub fn admit(&self, found: u64, bytes: u64, draw: impl FnOnce() -> u64) -> Admission {
        if let Some(limit) = self.limit_bytes {
            if found > 0 && found.saturating_add(bytes) > limit {
                return Admission::Drop;
            }
        }
        let mark = match self.red {
            Some(red) => {
                let p = red.probability(usize::try_from(found).unwrap_or(usize::MAX));
                p > 0.0 && hit(draw(), p)
            }
            None => false,
        };
        Admission::Accept { mark }
    }
}

/// What became of a frame offered to an [`EgressQueue`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Tail-dropped.
    Dropped {
        /// The backlog the frame found (bytes).
        found: u64,
    },
    /// Admitted.
    Queued {
        /// The backlog the frame found (bytes).
        found: u64,
        /// RED selected it for marking.
        mark: bool,
        /// When its first bit goes on the virtual link.
        start: Instant,
        /// When its last bit has left.
        finish: Instant,
    },
}

/// Serialisation time at a fixed rate, in whole nanoseconds, carrying the sub-nanosecond
/// remainder from frame to frame while the sender stays busy (exact in the long run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Serialiser {
    carry: u64,
}

impl Serialiser {
    /// Nanoseconds to send `bytes` at `bps` (0 when `bps` is 0). `continuing`: the sender
    /// was still busy with the previous frame (else the carried remainder is dropped).
    pub fn ns(&mut self, bps: u64, bytes: u64, continuing: bool) -> u64 {
        if !continuing {
            self.carry = 0;
        }
        if bps == 0 {
            return 0;
        }
        let num = u128::from(bytes) * 8 * 1_000_000_000 + u128::from(self.carry);
        let bps = u128::from(bps);
        self.carry = (num % bps) as u64;
        u64::try_from(num / bps).unwrap_or(u64::MAX)
    }
}

/// An egress queue (see the module documentation).
#[derive(Clone, Debug)]
pub struct EgressQueue {
    cfg: EgressConfig,
    ser: Serialiser,
    /// When the last admitted frame finishes serialising.
    busy_until: Instant,
    /// Frames not yet fully serialised: (finish time, `admitted` just after this frame).
    queue: VecDeque<(Instant, u64)>,
    /// Bytes ever admitted into `queue`.
    admitted: u64,
    /// Bytes of the frames that have left `queue`.
    departed: u64,
    /// The largest backlog just after admitting a frame.
    max_backlog: u64,
}

impl EgressQueue {
    /// An empty queue.
    pub fn new(cfg: EgressConfig) -> Self {
        EgressQueue {
            cfg,
            ser: Serialiser::default(),
            busy_until: Instant::ZERO,
            queue: VecDeque::new(),
            admitted: 0,
            departed: 0,
            max_backlog: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EgressConfig {
        &self.cfg
    }

    /// Change the configuration; it applies to frames offered afterwards (frames queued keep
    /// their times).
    pub fn set_config(&mut self, cfg: EgressConfig) {
        self.cfg = cfg;
    }

    /// Offer a frame of `bytes` at `now`: tail drop, RED (with `draw`, see
    /// [`EgressConfig::admit`]), then the virtual link. `now` should not go backwards.
    pub fn offer(&mut self, now: Instant, bytes: u64, draw: impl FnOnce() -> u64) -> Verdict {
        self.expire(now);
        let found = self.admitted - self.departed;
        let mark = match self.cfg.admit(found, bytes, draw) {
            Admission::Drop => return Verdict::Dropped { found },
            Admission::Accept { mark } => mark,
        };
        let continuing = now <= self.busy_until;
        let start = if continuing { self.busy_until } else { now };
        let bps = self.cfg.rate_bps.unwrap_or(0);
        let finish = start + Duration::from_nanos(self.ser.ns(bps, bytes, continuing));
        self.busy_until = finish;
        if finish > now {
            self.admitted += bytes;
            self.queue.push_back((finish, self.admitted));
            self.max_backlog = self.max_backlog.max(self.admitted - self.departed);
        }
        Verdict::Queued {
            found,
            mark,
            start,
            finish,
        }
    }

    /// Retire the frames whose serialisation ended at or before `now` (what
    /// [`Self::offer`] does first; for a caller that wants to free the memory early).
    pub fn expire(&mut self, now: Instant) {
        while let Some(&(finish, cum)) = self.queue.front() {
            if finish > now {
                break;
            }
            self.departed = cum;
            self.queue.pop_front();
        }
    }

    /// The backlog at `now` in bytes: admitted and not fully serialised by then. For a time
    /// series, ask with non-decreasing `now` no earlier than the last offer.
    pub fn backlog(&self, now: Instant) -> u64 {
        let done = self.queue.partition_point(|&(finish, _)| finish <= now);
        let departed = match done {
            0 => self.departed,
            i => self.queue[i - 1].1,
        };
        self.admitted - departed
    }

    /// When the backlog will have fallen to `level` bytes if nothing more arrives; `None` if
    /// it is there already at `now`.
    pub fn drain_time(&self, now: Instant, level: u64) -> Option<Instant> {
        if self.backlog(now) <= level {
            return None;
        }
        let i = self
            .queue
            .partition_point(|&(_, cum)| self.admitted - cum > level);
        self.queue.get(i).map(|&(t, _)| t)
    }

    /// When the virtual link finishes what it holds (its idle time, if in the past).
    pub fn busy_until(&self) -> Instant {
        self.busy_until
    }

    /// The largest backlog seen just after admitting a frame (bytes).
    pub fn max_backlog(&self) -> u64 {
        self.max_backlog
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ns: u64) -> Instant {
        Instant::from_nanos(ns)
    }

    fn queued(v: Verdict) -> (u64, bool, Instant, Instant) {
        match v {
            Verdict::Queued {
                found,
                mark,
                start,
                finish,
            } => (found, mark, start, finish),
            Verdict::Dropped { found } => panic!("dropped at backlog {found}"),
        }
    }

    #[test]
    fn the_virtual_link_serialises_fifo_at_the_rate_with_an_exact_long_run_rate() {
        // 3 Gb/s: 1 byte = 8/3 ns, so frames of 1 byte alternate 2, 3, 3 ns (carry).
        let mut q = EgressQueue::new(EgressConfig {
            rate_bps: Some(3_000_000_000),
            ..EgressConfig::default()
        });
        let mut ends = Vec::new();
        for _ in 0..300 {
            let (_, _, start, finish) = queued(q.offer(t(100), 1, || 0));
            ends.push((start.as_nanos(), finish.as_nanos()));
        }
        assert_eq!(ends[0], (100, 102));
        assert_eq!(ends[1], (102, 105));
        assert_eq!(ends[2], (105, 108));
        assert!(
            ends.windows(2).all(|w| w[1].0 == w[0].1),
            "FIFO, back to back"
        );
        // 300 bytes at 3 Gb/s: exactly 800 ns.
        assert_eq!(ends[299].1, 900);
        assert_eq!(q.busy_until(), t(900));
        // An idle link drops the carry and starts at once.
        let (found, _, start, finish) = queued(q.offer(t(1_000), 1, || 0));
        assert_eq!((found, start, finish), (0, t(1_000), t(1_002)));
    }

    #[test]
    fn the_backlog_counts_the_frame_on_the_wire_whole() {
        // 1 Gb/s: 1000 bytes take 8 µs.
        let mut q = EgressQueue::new(EgressConfig {
            rate_bps: Some(1_000_000_000),
            ..EgressConfig::default()
        });
        for _ in 0..3 {
            q.offer(t(0), 1_000, || 0);
        }
        assert_eq!(q.max_backlog(), 3_000);
        assert_eq!(q.backlog(t(0)), 3_000);
        assert_eq!(q.backlog(t(7_999)), 3_000);
        assert_eq!(q.backlog(t(8_000)), 2_000);
        assert_eq!(q.backlog(t(23_999)), 1_000);
        assert_eq!(q.backlog(t(24_000)), 0);
        assert_eq!(q.drain_time(t(0), 1_000), Some(t(16_000)));
        assert_eq!(q.drain_time(t(0), 0), Some(t(24_000)));
        assert_eq!(q.drain_time(t(16_000), 1_000), None);
        // A frame offered mid-way finds the frames not yet finished.
        let (found, ..) = queued(q.offer(t(12_000), 500, || 0));
        assert_eq!(found, 2_000);
        q.expire(t(100_000));
        assert_eq!(q.backlog(t(100_000)), 0);
    }

    #[test]
    fn without_a_rate_frames_take_no_time_and_never_queue() {
        let mut q = EgressQueue::new(EgressConfig {
            limit_bytes: Some(10),
            red: Some(Red::new(0, 0, 1.0)),
            ..EgressConfig::default()
        });
        for _ in 0..5 {
            let (found, mark, start, finish) = queued(q.offer(t(7), 1_000, || 0));
            assert_eq!((found, mark, start, finish), (0, false, t(7), t(7)));
        }
        assert_eq!(q.backlog(t(7)), 0);
        assert_eq!(q.max_backlog(), 0);
    }

    #[test]
    fn tail_drop_admits_a_frame_that_finds_the_queue_empty() {
        let cfg = EgressConfig {
            limit_bytes: Some(100),
            ..EgressConfig::default()
        };
        assert_eq!(cfg.admit(0, 5_000, || 0), Admission::Accept { mark: false });
        assert_eq!(cfg.admit(1, 99, || 0), Admission::Accept { mark: false });
        assert_eq!(cfg.admit(1, 100, || 0), Admission::Drop);
        assert_eq!(cfg.admit(u64::MAX, u64::MAX, || 0), Admission::Drop);
    }

    #[test]
    fn red_draws_only_when_it_may_mark() {
        let cfg = EgressConfig {
            red: Some(Red::new(1_000, 2_000, 0.5)),
            ..EgressConfig::default()
        };
        let never = || -> u64 { panic!("drew at probability 0") };
        assert_eq!(
            cfg.admit(1_000, 1, never),
            Admission::Accept { mark: false }
        );
        // p = 0.25 at 1500: a draw just below a quarter of 2^64 marks, one above does not.
        let quarter = 1u64 << 62;
        assert_eq!(
            cfg.admit(1_500, 1, || quarter - 4096),
            Admission::Accept { mark: true }
        );
        assert_eq!(
            cfg.admit(1_500, 1, || quarter + 4096),
            Admission::Accept { mark: false }
        );
        // Above kmax every frame, whatever the draw.
        assert_eq!(
            cfg.admit(2_001, 1, || u64::MAX),
            Admission::Accept { mark: true }
        );
    }

    #[test]
    fn red_profile() {
        let r = Red::new(1_000, 5_000, 0.2);
        assert_eq!(r.probability(0), 0.0);
        assert_eq!(r.probability(1_000), 0.0);
        assert!((r.probability(3_000) - 0.1).abs() < 1e-12);
        assert!((r.probability(5_000) - 0.2).abs() < 1e-12);
        assert_eq!(r.probability(5_001), 1.0);
    }
}
