//! A per-flow transmit pacer: a token bucket with a small burst, kept in picoseconds.

use crate::time::Instant;

/// Picoseconds per second.
const PS_PER_S: u128 = 1_000_000_000_000;

/// "Long ago": the bucket starts full.
const LONG_AGO: i128 = i128::MIN / 4;

/// A token bucket that tells the transmit path when the next packet of a flow may leave.
///
/// Tokens (bytes) accrue at the configured rate up to [`burst_bytes`](Self::burst_bytes); a
/// packet of `n` bytes may leave once `min(n, burst)` tokens are there, and takes `n`
/// (the bucket may go into debt for a packet larger than the burst, which later packets
/// repay). Over any interval of length `d` the pacer therefore lets at most
/// `burst + rate·d + (largest packet − burst, if positive)` bytes go, and a sender that
/// sends whenever allowed gets the rate exactly in the long run (to within 10⁻³ at any rate
/// from 1 Mb/s to 100 Gb/s: serialisation times are rounded *up* to the picosecond, so the
/// error is on the slow side; the only allowance the other way is the 999 ps forgiven for
/// the rounding of [`earliest_send`](Self::earliest_send) to whole nanoseconds).
///
/// The state is one instant, "when the bucket was (or will be) empty", so that
/// `tokens(t) = min(burst, rate·(t − empty_at))`, negative in debt.
///
/// A rate of `u64::MAX` means unlimited ([`Pacer::unlimited`]): every packet may leave at
/// once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pacer {
    rate_bps: u64,
    burst_bytes: u64,
    /// Picoseconds since the epoch at which `tokens` is (was) zero.
    empty_at_ps: i128,
    /// One-entry cache of `duration_ps` for the last size asked about (sizes repeat).
    cache: (u64, u128),
}

impl Pacer {
    /// A pacer at `rate_bps` (at least 1) with a bucket of `burst_bytes`, full at the start.
    pub fn new(rate_bps: u64, burst_bytes: u64) -> Self {
        Pacer {
            rate_bps: rate_bps.max(1),
            burst_bytes,
            empty_at_ps: LONG_AGO,
            cache: (u64::MAX, 0),
        }
    }

    /// A pacer that never holds a packet back.
    pub fn unlimited() -> Self {
        Self::new(u64::MAX, 0)
    }

    /// The configured rate (bits per second; `u64::MAX` when unlimited).
    pub fn rate_bps(&self) -> u64 {
        self.rate_bps
    }

    /// The bucket size in bytes.
    pub fn burst_bytes(&self) -> u64 {
        self.burst_bytes
    }

    /// Whether the pacer never holds a packet back.
    pub fn is_unlimited(&self) -> bool {
        self.rate_bps == u64::MAX
    }

    /// Picoseconds to send `bytes` at `rate`, rounded up.
    fn ps_at(bytes: u64, rate: u64) -> u128 {
        let bits = u128::from(bytes) * 8 * PS_PER_S;
        bits.div_ceil(u128::from(rate))
    }

    fn duration_ps(&mut self, bytes: u64) -> u128 {
        if self.cache.0 != bytes {
            self.cache = (bytes, Self::ps_at(bytes, self.rate_bps));
        }
        self.cache.1
    }

    fn now_ps(now: Instant) -> i128 {
        i128::from(now.as_nanos()) * 1000
    }

    /// The earliest instant (`>= now`) at which a packet of `bytes` bytes may leave.
    pub fn earliest_send(&mut self, now: Instant, bytes: usize) -> Instant {
        if self.is_unlimited() {
            return now;
        }
        let need = (bytes as u64).min(self.burst_bytes);
        let at = self.empty_at_ps + self.duration_ps(need) as i128;
        let now_ps = Self::now_ps(now);
        if at <= now_ps {
            return now;
        }
        // Round up to the nanosecond so the packet is never early.
        let ns = (at as u128).div_ceil(1000);
        Instant::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// Whether a packet of `bytes` bytes may leave at `now`.
    pub fn can_send(&mut self, now: Instant, bytes: usize) -> bool {
        self.earliest_send(now, bytes) <= now
    }

    /// A packet of `bytes` bytes left at `now` (normally no earlier than
    /// [`earliest_send`](Self::earliest_send) said; an early packet is charged all the same).
    pub fn on_send(&mut self, now: Instant, bytes: usize) {
        if self.is_unlimited() {
            return;
        }
        // The bucket is full (idle) if it was empty more than a burst ago; less than 1 ns
        // late counts as on time (that is the rounding of `earliest_send` up to the
        // nanosecond), so a sender that sends as soon as allowed keeps the exact
        // sub-nanosecond schedule.
        let full = Self::now_ps(now) - self.duration_ps(self.burst_bytes) as i128;
        let cost = self.duration_ps(bytes as u64) as i128;
        let base = if full > self.empty_at_ps + 999 {
            full
        } else {
            self.empty_at_ps
        };
        self.empty_at_ps = base + cost;
    }

    /// Change the rate at `now`, keeping the tokens (or the debt) the bucket holds, in bytes.
    pub fn set_rate(&mut self, now: Instant, rate_bps: u64) {
        let rate_bps = rate_bps.max(1);
        if rate_bps == self.rate_bps {
            return;
        }
        let now_ps = Self::now_ps(now);
        let was_unlimited = self.is_unlimited();
        let full_old = Self::ps_at(self.burst_bytes, self.rate_bps) as i128;
        let elapsed = now_ps - self.empty_at_ps;
        let old = self.rate_bps;
        self.rate_bps = rate_bps;
        self.cache = (u64::MAX, 0);
        if was_unlimited || elapsed >= full_old {
            self.empty_at_ps = LONG_AGO;
            return;
        }
        if rate_bps == u64::MAX {
            self.empty_at_ps = LONG_AGO;
            return;
        }
        // tokens · 8 · 10^12 = old · elapsed (bit-picoseconds per second); keep it in bytes.
        let scaled = i128::from(old) * elapsed;
        let new = i128::from(rate_bps);
        self.empty_at_ps = if scaled >= 0 {
            // Fewer tokens when in doubt: round the credit down.
            now_ps - scaled / new
        } else {
            // More debt when in doubt: round the debt up.
            now_ps + (-scaled + new - 1) / new
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// Send greedily (each packet at the first instant allowed) until `horizon_ns`;
    /// returns (bytes sent, instant of the last packet in ns).
    fn greedy(p: &mut Pacer, sizes: &mut dyn FnMut() -> usize, horizon_ns: u64) -> (u64, u64) {
        let mut now = Instant::ZERO;
        let mut total = 0u64;
        loop {
            let n = sizes();
            let t = p.earliest_send(now, n);
            assert!(t >= now);
            if t.as_nanos() > horizon_ns {
                return (total, now.as_nanos());
            }
            now = t;
            p.on_send(now, n);
            total += n as u64;
        }
    }

    const RATES: [u64; 8] = [
        1_000_000,
        10_000_000,
        100_000_000,
        1_000_000_000,
        10_000_000_000,
        25_000_000_000,
        40_000_000_000,
        100_000_000_000,
    ];

    #[test]
    fn long_run_rate_is_exact_and_never_exceeded() {
        for &rate in &RATES {
            for &size in &[64usize, 1086, 4154] {
                let burst = 2 * 4154;
                let mut p = Pacer::new(rate, burst);
                // Long enough for at least 20,000 packets (or one simulated hour).
                let pkt_ns = size as u64 * 8 * 1_000_000_000 / rate;
                let horizon = (pkt_ns * 20_000).clamp(1, 3_600_000_000_000);
                let (total, _) = greedy(&mut p, &mut || size, horizon);
                // Never more than rate·T + burst + one packet.
                let allowed =
                    rate as u128 * horizon as u128 / 8_000_000_000 + burst as u128 + size as u128;
                assert!(
                    (total as u128) <= allowed,
                    "rate {rate} size {size}: {total} > {allowed}"
                );
                // And within 0.1 % of it in the long run (the burst is a fixed offset).
                let achieved = (total - burst.min(total)) as f64 * 8e9 / horizon as f64;
                let err = (achieved - rate as f64).abs() / rate as f64;
                assert!(
                    err < 1e-3,
                    "rate {rate} size {size}: got {achieved} ({err})"
                );
            }
        }
    }

    #[test]
    fn random_sizes_hold_the_rate() {
        let mut rng = SplitMix64::new(7);
        for &rate in &RATES {
            let mut p = Pacer::new(rate, 8192);
            let horizon = (4096u64 * 8 * 1_000_000_000 / rate) * 20_000;
            let (total, _) = greedy(&mut p, &mut || 64 + rng.below(4033) as usize, horizon);
            let allowed = rate as u128 * horizon as u128 / 8_000_000_000 + 8192 + 4096;
            assert!((total as u128) <= allowed, "rate {rate}");
            let achieved = total as f64 * 8e9 / horizon as f64;
            assert!((achieved / rate as f64) > 0.99, "rate {rate}: {achieved}");
        }
    }

    #[test]
    fn strict_pacing_spaces_packets_exactly() {
        // 1500 B at 1 Gb/s = 12 µs; no burst: every packet exactly 12 µs after the last.
        let mut p = Pacer::new(1_000_000_000, 0);
        let mut now = Instant::from_micros(100);
        for k in 0..100u64 {
            let t = p.earliest_send(now, 1500);
            assert_eq!(t, Instant::from_micros(100 + 12 * k));
            now = t;
            p.on_send(now, 1500);
        }
        // 100 Gb/s, 64 B: 5.12 ns per packet; the picosecond state keeps the fractions.
        let mut p = Pacer::new(100_000_000_000, 0);
        let mut now = Instant::ZERO;
        for _ in 0..1000 {
            now = p.earliest_send(now, 64);
            p.on_send(now, 64);
        }
        // 1000 packets sent: the 1000th starts at 999 × 5.12 ns = 5114.88 ns → 5115 ns.
        assert_eq!(now, Instant::from_nanos(5115));
    }

    #[test]
    fn burst_is_bounded_after_idle() {
        // A 4 KiB bucket lets 4 packets of 1 KiB go at once after a long idle, not 5.
        let mut p = Pacer::new(10_000_000_000, 4096);
        let now = Instant::from_micros(1_000);
        let mut at_once = 0;
        while p.can_send(now, 1024) {
            p.on_send(now, 1024);
            at_once += 1;
        }
        assert_eq!(at_once, 4);
        // Then one every 1024 B at 10 Gb/s = 819.2 ns.
        assert_eq!(
            p.earliest_send(now, 1024),
            Instant::from_nanos(1_000_000 + 820)
        );
        // A packet bigger than the bucket waits for a full bucket and then runs a debt.
        let mut p = Pacer::new(8_000_000, 1000); // 1 byte per µs
        let t0 = Instant::from_micros(10_000);
        assert!(p.can_send(t0, 3000));
        p.on_send(t0, 3000);
        // Debt 2000 B, then needs 1000 B: 3000 µs later.
        assert_eq!(p.earliest_send(t0, 3000), Instant::from_micros(13_000));
    }

    #[test]
    fn rate_changes_keep_the_bytes_owed() {
        let mut p = Pacer::new(8_000_000, 0); // 1 byte per µs
        let t0 = Instant::from_micros(1_000);
        p.on_send(t0, 1000); // the next may go at t0 + 1000 µs
        assert_eq!(p.earliest_send(t0, 1000), Instant::from_micros(2_000));
        // At t0 + 500 µs, 500 B are still owed; at 2 B/µs that is 250 µs.
        let t1 = Instant::from_micros(1_500);
        p.set_rate(t1, 16_000_000);
        assert_eq!(p.earliest_send(t1, 1000), Instant::from_micros(1_750));
        // Halving the rate doubles the rest.
        p.set_rate(t1, 8_000_000);
        assert_eq!(p.earliest_send(t1, 1000), Instant::from_micros(2_000));
        // Tokens are kept as bytes too: a full bucket stays full.
        let mut p = Pacer::new(8_000_000, 4000);
        let t = Instant::from_micros(1_000_000);
        p.set_rate(t, 80_000_000);
        let mut n = 0;
        while p.can_send(t, 1000) {
            p.on_send(t, 1000);
            n += 1;
        }
        assert_eq!(n, 4);
    }

    #[test]
    fn unlimited_never_waits() {
        let mut p = Pacer::unlimited();
        let t = Instant::from_micros(3);
        for _ in 0..1000 {
            assert_eq!(p.earliest_send(t, 9000), t);
            p.on_send(t, 9000);
        }
        // Switching to a rate starts from a full bucket.
        p.set_rate(t, 8_000_000);
        assert!(p.can_send(t, 0));
        assert!(!p.is_unlimited() && p.rate_bps() == 8_000_000);
    }

    #[test]
    fn rate_steps_never_exceed_the_piecewise_budget() {
        // Alternate between 1 Gb/s and 40 Gb/s every 100 µs for 100 ms; the bytes sent may
        // not exceed the integral of the rate plus the burst plus one packet per change.
        let mut p = Pacer::new(1_000_000_000, 2048);
        let mut now = Instant::ZERO;
        let mut total: u128 = 0;
        let mut budget_bits: u128 = 0;
        let mut rate = 1_000_000_000u64;
        for step in 1..=1000u64 {
            let end = Instant::from_micros(step * 100);
            loop {
                let t = p.earliest_send(now, 1024);
                if t >= end {
                    break;
                }
                now = t;
                p.on_send(now, 1024);
                total += 1024;
            }
            budget_bits += u128::from(rate) * 100_000 / 1_000_000_000;
            now = end;
            rate = if rate == 1_000_000_000 {
                40_000_000_000
            } else {
                1_000_000_000
            };
            p.set_rate(now, rate);
        }
        let budget = budget_bits / 8 + 2048 + 1024;
        assert!(total <= budget, "{total} > {budget}");
        assert!(total as f64 > 0.99 * (budget_bits / 8) as f64);
    }
}
