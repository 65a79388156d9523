//! DCQCN (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM
//! 2015): the sender's **reaction point** ([`Dcqcn`], a [`RateControl`]) and the receiver's
//! **notification point** ([`NotificationPoint`]). The switch's **congestion point** (RED
//! marking by queue depth) is [`crate::sim::Red`].
//!
//! # The reaction point
//!
//! State: the current rate R_C (what the pacer enforces), the target rate R_T, and the
//! congestion estimate α. All rates are kept in `f64` bits per second and clamped to
//! `[min_rate, line_rate]`.
//!
//! - **CNP** (at most one rate reduction per `rate_reduce_period`):
//!   `R_T ← R_C; R_C ← R_C·max(1 − α/2, min_dec_factor); α ← (1 − g)·α + g` (the α step
//!   as the paper has it; see [`AlphaUpdate`] for the firmware's variant, and
//!   [`ClampTarget`] for when the firmware skips `R_T ← R_C`); the rate-increase timer
//!   restarts, the byte counter and both stage counters are reset.
//! - **α timer** (period K): with no CNP in a period, `α ← (1 − g)·α`. α is evaluated
//!   lazily, exactly as if the timer fired every K from the last CNP (so a 1 µs period
//!   costs nothing), and [`RateControl::next_timer`] never reports it.
//! - **Rate increase**: an *increase event* happens every T (the timer, counter `t`) and
//!   every B bytes sent (the byte counter, counter `b`), both counted since the last CNP,
//!   the current event included. Then, with F stages:
//!   - fast recovery when `max(t, b) ≤ F` (so the first F events): R_T unchanged;
//!   - hyper increase when `min(t, b) > F`: `R_T ← R_T + R_HAI`;
//!   - additive increase otherwise: `R_T ← R_T + R_AI`;
//!
//!   and in every case `R_C ← (R_T + R_C)/2`. Once R_C is back at the line rate the
//!   timer stops and bytes are no longer counted (nothing is left to recover) until the
//!   next CNP; before the first CNP the flow sends at the line rate.
//!
//! # Parameters
//!
//! [`Params::paper`] and [`Params::connectx`] give the two presets; every field is public.
//! See `docs/dcqcn.md` for where each number comes from and how "g = 1019/1024" is read.

use super::RateControl;
use crate::time::{Duration, Instant};

/// A `--dcqcn KEY=VALUE` override that cannot be applied ([`Params::set`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParamError {
    /// Not `KEY=VALUE`.
    #[error("'{0}' is not KEY=VALUE")]
    NotKeyValue(String),
    /// A key that is none of [`Params::KEYS`].
    #[error("unknown DCQCN parameter '{0}' (one of: {keys})", keys = Params::KEYS.join(", "))]
    Unknown(String),
    /// A value that is not a finite number ≥ 0.
    #[error("{key}: '{value}' is not a non-negative number")]
    NotANumber {
        /// The parameter.
        key: String,
        /// The value given.
        value: String,
    },
    /// A fraction above 1.
    #[error("{key}: {value} is not in [0, 1]")]
    NotAFraction {
        /// The parameter.
        key: String,
        /// The value given.
        value: f64,
    },
    /// None of the parameter's named choices.
    #[error("{key}: '{value}' ({choices})")]
    NotAChoice {
        /// The parameter.
        key: &'static str,
        /// The value given.
        value: String,
        /// The choices, `|`-separated.
        choices: &'static str,
    },
}

impl ParamError {
    fn choice(key: &'static str, value: &str, choices: &'static str) -> ParamError {
        ParamError::NotAChoice {
            key,
            value: value.to_string(),
            choices,
        }
    }
}

/// How α is updated (the paper and the ConnectX firmware differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlphaUpdate {
    /// The paper: each CNP does `α ← (1 − g)α + g` at once (after its rate cut), and
    /// restarts the α timer; every K without a CNP does `α ← (1 − g)α`.
    OnCnp,
    /// ConnectX (`dce_tcp_g`, `dce_tcp_rtt`): α is updated once every K on a free-running
    /// timer started by the first CNP: `α ← (1 − g)α + g` if a CNP arrived during that
    /// period, `α ← (1 − g)α` otherwise. A rate cut uses α as of the last update.
    Periodic,
}

/// When a CNP's rate cut also lowers the target rate (`R_T ← R_C`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClampTarget {
    /// The paper: every cut (ConnectX `clamp_tgt_rate` = 1).
    Always,
    /// The ConnectX firmware defaults (`clamp_tgt_rate` = 0,
    /// `clamp_tgt_rate_after_time_inc` = 1): only if the rate-increase *timer* raised the
    /// rate since the previous cut; otherwise R_T stays where it was, and fast recovery
    /// heads back to it. Not used by [`Params::connectx`] (see there).
    AfterTimerIncrease,
}

/// The reaction point's parameters. Rates in bits per second.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    /// The port's line rate: the initial rate and the upper clamp.
    pub line_rate_bps: u64,
    /// The α gain g (the weight of a new sample).
    pub g: f64,
    /// α before the first CNP.
    pub initial_alpha: f64,
    /// When α moves.
    pub alpha_update: AlphaUpdate,
    /// K: the α timer period (zero: α never decays).
    pub alpha_period: Duration,
    /// T: the rate-increase timer period (zero: no timer-driven increases).
    pub rate_increase_period: Duration,
    /// B: bytes sent per byte-counter increase event (0: no byte counter).
    pub byte_counter: u64,
    /// F: the number of fast-recovery stages.
    pub stages: u32,
    /// R_AI: the additive increase step of R_T.
    pub rai_bps: u64,
    /// R_HAI: the hyper increase step of R_T.
    pub rhai_bps: u64,
    /// The lower clamp of R_C and R_T.
    pub min_rate_bps: u64,
    /// ConnectX `rpg_min_dec_fac` as a fraction: one CNP never cuts R_C below
    /// `min_dec_factor × R_C` (0.5 = the default 50 %, which `1 − α/2 ≥ 1/2` already
    /// implies; 1.0 disables rate cuts).
    pub min_dec_factor: f64,
    /// Whether a cut sets `R_T ← R_C`.
    pub clamp_target: ClampTarget,
    /// ConnectX `rate_reduce_monitor_period`: CNPs arriving sooner than this after the last
    /// rate cut do not cut again (with [`AlphaUpdate::Periodic`] they still count for α;
    /// with [`AlphaUpdate::OnCnp`] they are ignored). Zero: every CNP cuts.
    pub rate_reduce_period: Duration,
}

impl Params {
    /// The parameters of the DCQCN paper (SIGCOMM 2015) at 100 Gb/s: g = 1/256, K = 55 µs,
    /// T = 55 µs, B = 10 MB, F = 5, R_AI = 40 Mb/s; R_HAI = 400 Mb/s (10 × R_AI, as in QCN:
    /// our assumption), minimum rate 1 Mb/s, α₀ = 1.
    pub fn paper() -> Self {
        Params {
            line_rate_bps: 100_000_000_000,
            g: 1.0 / 256.0,
            initial_alpha: 1.0,
            alpha_update: AlphaUpdate::OnCnp,
            alpha_period: Duration::from_micros(55),
            rate_increase_period: Duration::from_micros(55),
            byte_counter: 10_000_000,
            stages: 5,
            rai_bps: 40_000_000,
            rhai_bps: 400_000_000,
            min_rate_bps: 1_000_000,
            min_dec_factor: 0.5,
            clamp_target: ClampTarget::Always,
            rate_reduce_period: Duration::ZERO,
        }
    }

    /// ConnectX-4 and later firmware defaults at 100 Gb/s: rate-increase timer 300 µs, byte
    /// counter 32767 B, R_AI 5 Mb/s, R_HAI 50 Mb/s, F = 1, minimum rate 1 Mb/s, minimum
    /// decrease factor 50 %, `dce_tcp_g` = 1019 read as the *retention* (1 − g)·1024, so
    /// g = 5/1024, α₀ = 1023/1024, α updated every `dce_tcp_rtt` = 1 µs
    /// ([`AlphaUpdate::Periodic`]), at most one cut per 4 µs.
    ///
    /// Not the firmware's default: [`ClampTarget::Always`]. The firmware's
    /// `clamp_tgt_rate` = 0 is [`ClampTarget::AfterTimerIncrease`], but with a 32767-*byte*
    /// counter it lets fast recovery jump halfway back to the line rate every 32 KB after a
    /// cut, and in our incast the queue then sits at the buffer limit (see
    /// `docs/dcqcn.md`): some firmware detail we do not know (the counter's unit?) must
    /// differ, so the preset keeps the paper's target clamp.
    pub fn connectx() -> Self {
        Params {
            line_rate_bps: 100_000_000_000,
            g: 5.0 / 1024.0,
            initial_alpha: 1023.0 / 1024.0,
            alpha_update: AlphaUpdate::Periodic,
            alpha_period: Duration::from_micros(1),
            rate_increase_period: Duration::from_micros(300),
            byte_counter: 32767,
            stages: 1,
            rai_bps: 5_000_000,
            rhai_bps: 50_000_000,
            min_rate_bps: 1_000_000,
            min_dec_factor: 0.5,
            clamp_target: ClampTarget::Always,
            rate_reduce_period: Duration::from_micros(4),
        }
    }

    /// The same parameters at another line rate.
    pub fn line_rate(mut self, bps: u64) -> Self {
        self.line_rate_bps = bps;
        self
    }

    /// The names [`set`](Self::set) accepts, with their units.
    pub const KEYS: &'static [&'static str] = &[
        "g",
        "initial_alpha",
        "alpha_update=on-cnp|periodic",
        "alpha_period_us",
        "rate_increase_period_us",
        "byte_counter",
        "stages",
        "rai_mbps",
        "rhai_mbps",
        "min_rate_mbps",
        "min_dec_factor",
        "clamp_target=always|after-timer-increase",
        "rate_reduce_period_us",
        "time_scale",
    ];

    /// Override one parameter by name (the CLI's `--dcqcn KEY=VALUE`): see [`KEYS`](Self::KEYS).
    /// `time_scale` applies [`time_scaled`](Self::time_scaled). Rates in Mb/s, periods in µs.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ParamError> {
        fn num(key: &str, v: &str) -> Result<f64, ParamError> {
            match v.parse::<f64>() {
                Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
                _ => Err(ParamError::NotANumber {
                    key: key.to_string(),
                    value: v.to_string(),
                }),
            }
        }
        let us = |v: &str| num(key, v).map(|x| Duration::from_nanos((x * 1e3).round() as u64));
        let mbps = |v: &str| num(key, v).map(|x| (x * 1e6).round() as u64);
        match key {
            "g" | "initial_alpha" | "min_dec_factor" => {
                let x = num(key, value)?;
                if x > 1.0 {
                    return Err(ParamError::NotAFraction {
                        key: key.to_string(),
                        value: x,
                    });
                }
                match key {
                    "g" => self.g = x,
                    "initial_alpha" => self.initial_alpha = x,
                    _ => self.min_dec_factor = x,
                }
            }
            "alpha_update" => {
                self.alpha_update = match value {
                    "on-cnp" => AlphaUpdate::OnCnp,
                    "periodic" => AlphaUpdate::Periodic,
                    _ => return Err(ParamError::choice("alpha_update", value, "on-cnp|periodic")),
                }
            }
            "clamp_target" => {
                self.clamp_target = match value {
                    "always" => ClampTarget::Always,
                    "after-timer-increase" => ClampTarget::AfterTimerIncrease,
                    _ => {
                        return Err(ParamError::choice(
                            "clamp_target",
                            value,
                            "always|after-timer-increase",
                        ))
                    }
                }
            }
            "alpha_period_us" => self.alpha_period = us(value)?,
            "rate_increase_period_us" => self.rate_increase_period = us(value)?,
            "rate_reduce_period_us" => self.rate_reduce_period = us(value)?,
            "byte_counter" => self.byte_counter = num(key, value)? as u64,
            "stages" => self.stages = num(key, value)? as u32,
            "rai_mbps" => self.rai_bps = mbps(value)?,
            "rhai_mbps" => self.rhai_bps = mbps(value)?,
            "min_rate_mbps" => self.min_rate_bps = mbps(value)?.max(1),
            "time_scale" => *self = self.clone().time_scaled(num(key, value)?),
            _ => return Err(ParamError::Unknown(key.to_string())),
        }
        Ok(())
    }

    /// Apply `KEY=VALUE` overrides in order.
    pub fn with_overrides<S: AsRef<str>>(mut self, kvs: &[S]) -> Result<Self, ParamError> {
        for kv in kvs {
            let kv = kv.as_ref();
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| ParamError::NotKeyValue(kv.to_string()))?;
            self.set(k.trim(), v.trim())?;
        }
        Ok(self)
    }

    /// The same parameters on a slower time scale: the α period K, the rate-increase
    /// period T and the rate-reduction monitor period multiplied by `factor` (≥ 0; rates,
    /// steps and the byte counter unchanged). For networks whose round trip is far longer
    /// than a data centre's few microseconds (a software testbed whose hosts see packets
    /// in millisecond batches): with the paper's 55 µs timers, a flow that gets one CNP per
    /// millisecond recovers to the line rate between two CNPs and never slows down.
    pub fn time_scaled(mut self, factor: f64) -> Self {
        let f = factor.max(0.0);
        self.alpha_period = self.alpha_period.mul_f64(f);
        self.rate_increase_period = self.rate_increase_period.mul_f64(f);
        self.rate_reduce_period = self.rate_reduce_period.mul_f64(f);
        self
    }
}

/// Counters of one reaction point.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DcqcnStats {
    /// CNPs received.
    pub cnps: u64,
    /// CNPs that cut the rate (the others fell within `rate_reduce_period`).
    pub rate_cuts: u64,
    /// Increase events in fast recovery.
    pub fast_recovery: u64,
    /// Increase events in additive increase.
    pub additive: u64,
    /// Increase events in hyper increase.
    pub hyper: u64,
}

/// The phase an increase event was in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// `max(t, b) ≤ F`.
    FastRecovery,
    /// Neither of the others.
    Additive,
    /// `min(t, b) > F`.
    Hyper,
}

/// The DCQCN reaction point of one flow (one QP). See the [module documentation](self).
#[derive(Clone, Debug)]
pub struct Dcqcn {
    p: Params,
    line: f64,
    min: f64,
    rc: f64,
    rt: f64,
    alpha: f64,
    /// Where the α timer's grid starts (the last applied α tick, or the last CNP with
    /// [`AlphaUpdate::OnCnp`]); `None` before the first CNP.
    alpha_anchor: Option<Instant>,
    /// A CNP arrived in the current α period ([`AlphaUpdate::Periodic`]).
    cnp_pending: bool,
    /// The next rate-increase timer expiry; `None` when nothing is left to recover.
    increase_at: Option<Instant>,
    t_count: u32,
    b_count: u32,
    bytes: u64,
    last_cut: Option<Instant>,
    /// The timer raised the rate since the last cut.
    timer_increase_since_cut: bool,
    stats: DcqcnStats,
}

impl Dcqcn {
    /// A reaction point sending at the line rate.
    pub fn new(p: Params) -> Self {
        let line = p.line_rate_bps.max(1) as f64;
        let min = (p.min_rate_bps.max(1) as f64).min(line);
        Dcqcn {
            line,
            min,
            rc: line,
            rt: line,
            alpha: p.initial_alpha,
            alpha_anchor: None,
            cnp_pending: false,
            increase_at: None,
            t_count: 0,
            b_count: 0,
            bytes: 0,
            last_cut: None,
            timer_increase_since_cut: false,
            stats: DcqcnStats::default(),
            p,
        }
    }

    /// The parameters.
    pub fn params(&self) -> &Params {
        &self.p
    }

    /// R_C, the current rate, unrounded.
    pub fn current_rate(&self) -> f64 {
        self.rc
    }

    /// R_T, the target rate, unrounded.
    pub fn target_rate(&self) -> f64 {
        self.rt
    }

    /// The stage counters (timer events, byte-counter events) since the last CNP.
    pub fn stage_counts(&self) -> (u32, u32) {
        (self.t_count, self.b_count)
    }

    /// The counters.
    pub fn stats(&self) -> DcqcnStats {
        self.stats
    }

    /// Whether R_C is below the line rate (the increase machinery is running).
    pub fn recovering(&self) -> bool {
        self.rc < self.line
    }

    /// α at `now` (the α timer's updates due by `now` applied).
    pub fn alpha_at(&self, now: Instant) -> f64 {
        self.alpha_after(now).0
    }

    /// α, the anchor and the pending flag after the α ticks due by `now`.
    fn alpha_after(&self, now: Instant) -> (f64, Option<Instant>, bool) {
        let same = (self.alpha, self.alpha_anchor, self.cnp_pending);
        let Some(anchor) = self.alpha_anchor else {
            return same;
        };
        let k = u64::try_from(self.p.alpha_period.as_nanos()).unwrap_or(u64::MAX);
        if k == 0 || now < anchor {
            return same;
        }
        let n = (now - anchor).as_nanos() as u64 / k;
        if n == 0 {
            return same;
        }
        let keep = 1.0 - self.p.g;
        let mut a = keep * self.alpha;
        if self.cnp_pending {
            a += self.p.g;
        }
        if n > 1 {
            a *= keep.powi(i32::try_from(n - 1).unwrap_or(i32::MAX));
        }
        let anchor = anchor + Duration::from_nanos(n.saturating_mul(k));
        (a, Some(anchor), false)
    }

    fn advance_alpha(&mut self, now: Instant) {
        (self.alpha, self.alpha_anchor, self.cnp_pending) = self.alpha_after(now);
    }

    /// The stage the next increase event falls in, given the counters after it.
    fn stage(&self) -> Stage {
        let f = self.p.stages;
        if self.t_count.max(self.b_count) <= f {
            Stage::FastRecovery
        } else if self.t_count.min(self.b_count) > f {
            Stage::Hyper
        } else {
            Stage::Additive
        }
    }

    /// One increase event (the counters already bumped).
    fn increase(&mut self) {
        match self.stage() {
            Stage::FastRecovery => self.stats.fast_recovery += 1,
            Stage::Additive => {
                self.stats.additive += 1;
                self.rt += self.p.rai_bps as f64;
            }
            Stage::Hyper => {
                self.stats.hyper += 1;
                self.rt += self.p.rhai_bps as f64;
            }
        }
        self.rt = self.rt.clamp(self.min, self.line);
        self.rc = ((self.rt + self.rc) / 2.0).clamp(self.min, self.line);
        if self.rt - self.rc < 1.0 {
            // Within a bit per second of the target: the averaging has converged.
            self.rc = self.rt;
        }
    }
}

impl RateControl for Dcqcn {
    fn name(&self) -> &'static str {
        "dcqcn"
    }

    fn rate_bps(&self) -> u64 {
        (self.rc.round() as u64).max(1)
    }

    fn on_cnp(&mut self, now: Instant) {
        self.on_timer(now);
        self.advance_alpha(now);
        self.stats.cnps += 1;
        let first = self.alpha_anchor.is_none();
        let periodic = self.p.alpha_update == AlphaUpdate::Periodic;
        if periodic {
            self.cnp_pending = true;
            if first {
                self.alpha_anchor = Some(now);
            }
        }
        let too_soon = self
            .last_cut
            .is_some_and(|t| now < t + self.p.rate_reduce_period);
        if too_soon {
            return;
        }
        self.stats.rate_cuts += 1;
        self.last_cut = Some(now);
        let clamp = match self.p.clamp_target {
            ClampTarget::Always => true,
            ClampTarget::AfterTimerIncrease => self.timer_increase_since_cut,
        };
        if clamp {
            self.rt = self.rc;
        }
        self.timer_increase_since_cut = false;
        let factor = (1.0 - self.alpha / 2.0).max(self.p.min_dec_factor);
        self.rc = (self.rc * factor).clamp(self.min, self.line);
        if !periodic {
            self.alpha = (1.0 - self.p.g) * self.alpha + self.p.g;
            self.alpha_anchor = Some(now);
        }
        self.t_count = 0;
        self.b_count = 0;
        self.bytes = 0;
        self.increase_at = (self.recovering() && !self.p.rate_increase_period.is_zero())
            .then(|| now + self.p.rate_increase_period);
    }

    fn on_sent(&mut self, now: Instant, bytes: usize) {
        self.on_timer(now);
        if self.p.byte_counter == 0 || !self.recovering() {
            return;
        }
        self.bytes += bytes as u64;
        while self.bytes >= self.p.byte_counter {
            self.bytes -= self.p.byte_counter;
            self.b_count = self.b_count.saturating_add(1);
            self.increase();
            if !self.recovering() {
                self.bytes = 0;
                self.increase_at = None;
                break;
            }
        }
    }

    fn next_timer(&self) -> Option<Instant> {
        self.increase_at
    }

    fn on_timer(&mut self, now: Instant) {
        while let Some(at) = self.increase_at {
            if at > now {
                break;
            }
            self.t_count = self.t_count.saturating_add(1);
            self.increase();
            self.timer_increase_since_cut = true;
            self.increase_at = self.recovering().then(|| at + self.p.rate_increase_period);
        }
    }

    fn alpha(&self, now: Instant) -> Option<f64> {
        Some(self.alpha_at(now))
    }

    fn target_rate_bps(&self) -> Option<u64> {
        Some(self.rt.round() as u64)
    }
}

/// The DCQCN notification point of one flow (at the receiver): decides when a CE-marked
/// arrival makes a CNP. A CNP is sent for a CE-marked packet when none was sent for the
/// flow in the last `interval` (the paper's N = 50 µs; ConnectX `min_time_between_cnps`,
/// 2–4 µs); CE marks in between are absorbed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotificationPoint {
    interval: Duration,
    last_cnp: Option<Instant>,
    ce_seen: u64,
    cnps: u64,
}

impl NotificationPoint {
    /// At most one CNP per `interval` (zero: one per CE-marked packet).
    pub fn new(interval: Duration) -> Self {
        NotificationPoint {
            interval,
            last_cnp: None,
            ce_seen: 0,
            cnps: 0,
        }
    }

    /// The paper's N = 50 µs.
    pub fn paper() -> Self {
        Self::new(Duration::from_micros(50))
    }

    /// ConnectX: 4 µs (the top of the 2–4 µs range).
    pub fn connectx() -> Self {
        Self::new(Duration::from_micros(4))
    }

    /// The minimum interval between CNPs.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// A CE-marked packet of this flow arrived at `now`: whether to send a CNP now.
    pub fn on_ce(&mut self, now: Instant) -> bool {
        self.ce_seen += 1;
        if self.last_cnp.is_some_and(|t| now < t + self.interval) {
            return false;
        }
        self.last_cnp = Some(now);
        self.cnps += 1;
        true
    }

    /// (CE-marked packets seen, CNPs decided.)
    pub fn counts(&self) -> (u64, u64) {
        (self.ce_seen, self.cnps)
    }
}

#[cfg(test)]
mod tests;
