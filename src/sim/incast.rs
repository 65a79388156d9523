//! A packet-level incast simulator for congestion-control experiments that needs no RC
//! engine: N senders, each with a [`RateControl`] and a [`Pacer`], send back-to-back
//! frames of one size into one switch output port; the port drains at the bottleneck rate
//! to one receiver, whose [`NotificationPoint`] per flow sends CNPs back to the senders.
//!
//! # Model
//!
//! ```text
//!  sender i ──(NIC at link rate, leg delay)──▶ switch queue ──(bottleneck)──(leg)──▶ receiver
//!     ▲                                         RED/ECN, buffer limit, PFC                │
//!     └──────────────── CNP (2 × leg delay, never queued, never lost) ◀── NP per flow ───┘
//! ```
//!
//! - Every flow always has data (an infinite backlog) from its start time on. A sender
//!   sends a frame when its NIC is free (frames are serialised at the link rate), its
//!   pacer allows it (at the controller's rate) and it is not PFC-paused.
//! - The **leg delay** is `rtt / 4`: sender → switch, switch → receiver, and the CNP's
//!   way back takes two legs. A frame reaches the switch when its last bit has (store and
//!   forward), plus a seeded random jitter uniform in `0..=jitter` that keeps each flow's
//!   frames in order. Without it, senders that all run at the line rate stay phase-locked
//!   against the port and the same flow wins every free buffer slot, a simulation artefact.
//! - The **switch port** is one FIFO shared by all flows, draining at `link_bps`. A frame
//!   arriving to a backlog `q` (bytes admitted and not fully sent, itself not included)
//!   is tail-dropped if `q > 0` and `q + frame > buffer_bytes`; otherwise it is marked CE
//!   with the [`Red`] probability of `q` (the congestion point), drawn from a seeded
//!   [`SplitMix64`].
//! - **PFC** (optional) works on the shared queue: when the backlog reaches `xoff_bytes`
//!   the switch pauses every sender, when it falls to `xon_bytes` it resumes them; PAUSE
//!   and RESUME take one leg to reach the senders. A sender finishes the frame it is
//!   serialising. (A real switch counts per ingress port; in a symmetric incast the two
//!   agree up to the threshold's scale.)
//! - A dropped frame is simply lost: there are no retransmissions here (the RC engine's
//!   go-back-N is not modelled), so "throughput" is goodput of first transmissions.
//! - The **receiver** runs one [`NotificationPoint`] per flow on the CE-marked frames'
//!   arrival times; each CNP reaches its sender two legs later, where
//!   [`RateControl::on_cnp`] runs and the pacer takes the new rate.
//!
//! Everything runs on a virtual clock from a binary heap of events (ties in scheduling
//! order); a run is a pure function of the [`IncastConfig`].
//!
//! # Outputs
//!
//! [`IncastResult`] holds the time series, sampled every `sample_interval` (per-flow
//! goodput over the interval, each controller's rate and α at the sample instant, the
//! backlog at the instant and its maximum over the interval, whether PFC was pausing),
//! and the totals. [`IncastResult::summary`] computes, over the **steady-state window**
//! (by default the second half of the run, [`IncastConfig::steady_from`]):
//! link utilisation (bytes delivered ÷ what the link could carry), Jain's fairness index
//! `(Σx)² / (n·Σx²)` of the per-flow bytes delivered in the window (over the flows
//! active for the whole window), the maximum and mean backlog; and over the whole run: the
//! maximum backlog (the start-up transient included), drops, CE marks, CNPs, PFC pauses.
//! [`IncastResult::convergence_time`] measures how long a flow that started late takes to
//! reach a tolerance of its fair share.
//!
//! `ferroce sim incast` writes the time series as CSV and PNG (`apps::incast_plot`).

use super::net::SplitMix64;
use super::queue::{EgressConfig, EgressQueue, Red, Serialiser, Verdict};
use crate::cc::dcqcn::NotificationPoint;
use crate::cc::{CcConfig, Pacer, RateControl};
use crate::time::{Duration, Instant};
use core::cmp::Ordering;
use core::fmt;
use std::collections::BinaryHeap;

/// PFC thresholds on the switch queue (bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pfc {
    /// Pause every sender when the backlog reaches this.
    pub xoff_bytes: u64,
    /// Resume them when it falls to this.
    pub xon_bytes: u64,
}

/// An incast experiment. [`IncastConfig::new`] gives the defaults; every field is public.
#[derive(Clone, Debug)]
pub struct IncastConfig {
    /// Number of senders (flows).
    pub senders: usize,
    /// Rate of every link: the senders' NICs and the bottleneck (bits per second).
    pub link_bps: u64,
    /// Size of every frame on the wire (bytes).
    pub frame_bytes: usize,
    /// Base round-trip propagation time; each of the four legs takes a quarter.
    pub rtt: Duration,
    /// Simulated time.
    pub duration: Duration,
    /// Switch buffer for the port (bytes).
    pub buffer_bytes: u64,
    /// ECN marking; `None` marks nothing.
    pub red: Option<Red>,
    /// PFC; `None` drops at the buffer limit instead.
    pub pfc: Option<Pfc>,
    /// Each sender's congestion control.
    pub cc: CcConfig,
    /// The notification point's minimum interval between CNPs per flow.
    pub np_interval: Duration,
    /// Each sender's pacer bucket (bytes).
    pub pacer_burst_bytes: u64,
    /// Time-series resolution.
    pub sample_interval: Duration,
    /// Extra delay of each frame on its way to the switch, uniform in `0..=jitter` (never
    /// reordering a flow).
    pub jitter: Duration,
    /// Seed of the marking and jitter decisions.
    pub seed: u64,
    /// Per-flow start times (missing entries start at 0).
    pub starts: Vec<Duration>,
    /// Where the steady-state window starts, as a fraction of `duration` (default 0.5).
    pub steady_from: f64,
}

/// Frame bytes of a RoCE v2 packet with a 4096-byte payload over IPv4: Ethernet 14 + IPv4
/// 20 + UDP 8 + BTH 12 + payload + ICRC 4 (no FCS, preamble or gap).
pub const FRAME_4096: usize = 14 + 20 + 8 + 12 + 4096 + 4;

impl IncastConfig {
    /// `senders` flows into one receiver over `link_bps` links with DCQCN's paper
    /// parameters: 4096-byte payloads, an 8 µs base RTT, RED 5 KB / 200 KB / 1 %, a 12 MB
    /// buffer, no PFC, NP interval 50 µs, 8 KB pacer bursts, 64 ns of jitter, 10 ms of
    /// simulated time sampled every 20 µs.
    pub fn new(senders: usize, link_bps: u64) -> Self {
        IncastConfig {
            senders,
            link_bps,
            frame_bytes: FRAME_4096,
            rtt: Duration::from_micros(8),
            duration: Duration::from_millis(10),
            buffer_bytes: 12_000_000,
            red: Some(Red::new(5_000, 200_000, 0.01)),
            pfc: None,
            cc: CcConfig::Dcqcn(crate::cc::dcqcn::Params::paper()),
            np_interval: Duration::from_micros(50),
            pacer_burst_bytes: 2 * FRAME_4096 as u64,
            sample_interval: Duration::from_micros(20),
            jitter: Duration::from_nanos(64),
            seed: 1,
            starts: Vec::new(),
            steady_from: 0.5,
        }
    }

    fn start_of(&self, flow: usize) -> Instant {
        Instant::ZERO + self.starts.get(flow).copied().unwrap_or(Duration::ZERO)
    }

    /// Check the configuration; the message says what is wrong.
    pub fn validate(&self) -> Result<(), IncastConfigError> {
        if self.senders == 0 {
            return Err(IncastConfigError::NoSenders);
        }
        if self.link_bps == 0 {
            return Err(IncastConfigError::ZeroLinkRate);
        }
        if self.frame_bytes == 0 {
            return Err(IncastConfigError::ZeroFrame);
        }
        if self.duration.is_zero() || self.sample_interval.is_zero() {
            return Err(IncastConfigError::ZeroDuration);
        }
        if !(0.0..1.0).contains(&self.steady_from) {
            return Err(IncastConfigError::SteadyFrom);
        }
        if let Some(r) = self.red {
            if r.kmin_bytes > r.kmax_bytes || !(0.0..=1.0).contains(&r.pmax) {
                return Err(IncastConfigError::Red);
            }
        }
        if let Some(p) = self.pfc {
            if p.xon_bytes > p.xoff_bytes {
                return Err(IncastConfigError::Pfc);
            }
        }
        Ok(())
    }
}

/// What is wrong with an [`IncastConfig`] ([`IncastConfig::validate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IncastConfigError {
    /// No sender.
    #[error("need at least one sender")]
    NoSenders,
    /// A link rate of 0.
    #[error("the link rate must be positive")]
    ZeroLinkRate,
    /// A frame size of 0.
    #[error("the frame size must be positive")]
    ZeroFrame,
    /// A duration or sample interval of 0.
    #[error("the duration and the sample interval must be positive")]
    ZeroDuration,
    /// `steady_from` outside [0, 1).
    #[error("steady_from must be in [0, 1)")]
    SteadyFrom,
    /// RED's thresholds or probability out of order.
    #[error("RED needs kmin <= kmax and pmax in [0, 1]")]
    Red,
    /// PFC's XON above XOFF.
    #[error("PFC needs xon <= xoff")]
    Pfc,
}

/// One flow at one sample instant.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FlowSample {
    /// Goodput delivered to the receiver over the sample interval ending here (b/s).
    pub throughput_bps: f64,
    /// The controller's rate at the instant (b/s; 0 before the flow starts).
    pub rate_bps: u64,
    /// The controller's α at the instant, if it has one (and the flow has started).
    pub alpha: Option<f64>,
}

/// The state at one sample instant.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The instant (the end of the interval the throughputs cover).
    pub t: Instant,
    /// Switch backlog at the instant (bytes).
    pub queue_bytes: u64,
    /// Largest backlog seen by an arriving frame during the interval (bytes).
    pub queue_max_bytes: u64,
    /// Whether the senders were PFC-paused at the instant.
    pub pfc_paused: bool,
    /// One entry per flow.
    pub flows: Vec<FlowSample>,
}

/// Totals of one flow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowTotals {
    /// Frames sent.
    pub sent: u64,
    /// Frames delivered.
    pub delivered: u64,
    /// Frames dropped at the switch.
    pub dropped: u64,
    /// Frames marked CE.
    pub ce_marked: u64,
    /// CNPs sent by the NP (all reach the sender before or after the run ends).
    pub cnps: u64,
}

/// Everything a run produced.
#[derive(Clone, Debug)]
pub struct IncastResult {
    /// The configuration that was run.
    pub config: IncastConfig,
    /// The time series.
    pub samples: Vec<Sample>,
    /// Per-flow totals.
    pub flows: Vec<FlowTotals>,
    /// Bytes delivered per flow per sample interval (index = interval number).
    delivered_bins: Vec<Vec<u64>>,
    /// Largest backlog per sample interval.
    queue_max_bins: Vec<u64>,
    /// Largest backlog over the run.
    pub max_queue_bytes: u64,
    /// PAUSE transitions (XOFF) sent by the switch.
    pub pfc_pauses: u64,
    /// Total time the senders were paused.
    pub pfc_paused: Duration,
    /// Events processed (for cost measurements).
    pub events: u64,
}

/// The headline numbers of a run (see the [module documentation](self) for definitions).
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Delivered bytes ÷ link capacity over the steady-state window.
    pub utilization: f64,
    /// Jain's index of the per-flow bytes delivered in the steady-state window.
    pub jain: f64,
    /// Largest backlog over the whole run (bytes).
    pub max_queue_bytes: u64,
    /// Largest backlog within the steady-state window (bytes).
    pub steady_max_queue_bytes: u64,
    /// Time-averaged backlog in the steady-state window (bytes; mean of the samples).
    pub steady_mean_queue_bytes: f64,
    /// Frames dropped at the switch.
    pub drops: u64,
    /// Frames marked CE.
    pub ce_marked: u64,
    /// CNPs sent.
    pub cnps: u64,
    /// PFC PAUSE transitions.
    pub pfc_pauses: u64,
    /// Time spent paused.
    pub pfc_paused: Duration,
    /// Flows, controller name.
    pub senders: usize,
    /// `"dcqcn"` or `"none"`.
    pub cc: &'static str,
}

impl fmt::Display for Summary {
    /// The one summary line: `utilization=… jain=… max_queue_kb=… drops=… cnps=…` and more.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "utilization={:.4} jain={:.4} max_queue_kb={:.1} drops={} cnps={} \
             steady_max_queue_kb={:.1} steady_mean_queue_kb={:.1} ce_marked={} \
             pfc_pauses={} pfc_paused_us={:.1} senders={} cc={}",
            self.utilization,
            self.jain,
            self.max_queue_bytes as f64 / 1000.0,
            self.drops,
            self.cnps,
            self.steady_max_queue_bytes as f64 / 1000.0,
            self.steady_mean_queue_bytes / 1000.0,
            self.ce_marked,
            self.pfc_pauses,
            self.pfc_paused.as_nanos() as f64 / 1000.0,
            self.senders,
            self.cc,
        )
    }
}

/// Jain's fairness index `(Σx)² / (n·Σx²)` (1 = perfectly fair, 1/n = one flow has all);
/// 1 for an empty or all-zero set.
pub fn jain_index(xs: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if sq == 0.0 {
        1.0
    } else {
        sum * sum / (n * sq)
    }
}

impl IncastResult {
    /// The sample interval in nanoseconds.
    fn bin_ns(&self) -> u64 {
        self.config.sample_interval.as_nanos() as u64
    }

    /// The steady-state window as a range of sample intervals.
    fn steady_bins(&self) -> core::ops::Range<usize> {
        let n = self.samples.len();
        let first = ((n as f64) * self.config.steady_from).floor() as usize;
        first.min(n)..n
    }

    /// Bytes flow `i` delivered during intervals `bins`.
    fn delivered_in(&self, flow: usize, bins: core::ops::Range<usize>) -> u64 {
        let v = &self.delivered_bins[flow];
        bins.map(|b| v.get(b).copied().unwrap_or(0)).sum()
    }

    /// The headline numbers.
    pub fn summary(&self) -> Summary {
        let bins = self.steady_bins();
        let window_ns = (bins.len() as u64 * self.bin_ns()).max(1);
        let w_start = Instant::from_nanos(bins.start as u64 * self.bin_ns());
        let per_flow: Vec<u64> = (0..self.flows.len())
            .map(|i| self.delivered_in(i, bins.clone()))
            .collect();
        let total: u64 = per_flow.iter().sum();
        let capacity = self.config.link_bps as f64 * window_ns as f64 / 8e9;
        let active: Vec<f64> = per_flow
            .iter()
            .enumerate()
            .filter(|&(i, _)| self.config.start_of(i) <= w_start)
            .map(|(_, &b)| b as f64)
            .collect();
        let steady_max = bins
            .clone()
            .map(|b| self.queue_max_bins.get(b).copied().unwrap_or(0))
            .max()
            .unwrap_or(0);
        let steady_samples = &self.samples[bins];
        let mean = if steady_samples.is_empty() {
            0.0
        } else {
            steady_samples
                .iter()
                .map(|s| s.queue_bytes as f64)
                .sum::<f64>()
                / steady_samples.len() as f64
        };
        Summary {
            utilization: total as f64 / capacity,
            jain: jain_index(&active),
            max_queue_bytes: self.max_queue_bytes,
            steady_max_queue_bytes: steady_max,
            steady_mean_queue_bytes: mean,
            drops: self.flows.iter().map(|f| f.dropped).sum(),
            ce_marked: self.flows.iter().map(|f| f.ce_marked).sum(),
            cnps: self.flows.iter().map(|f| f.cnps).sum(),
            pfc_pauses: self.pfc_pauses,
            pfc_paused: self.pfc_paused,
            senders: self.config.senders,
            cc: self.config.cc.name(),
        }
    }

    /// Goodput of `flow` averaged over the sample intervals `bins` (b/s).
    pub fn mean_throughput_bps(&self, flow: usize, from: Instant, to: Instant) -> f64 {
        let b = self.bin_ns();
        let first = (from.as_nanos() / b) as usize;
        let last = (to.as_nanos() / b) as usize;
        if last <= first {
            return 0.0;
        }
        self.delivered_in(flow, first..last) as f64 * 8e9 / ((last - first) as u64 * b) as f64
    }

    /// How long after its start `flow` takes to converge: the first instant `t` (on the
    /// sample grid, from its start on) at which its goodput averaged over `[t, t + window]`
    /// is within `tolerance` (e.g. 0.1) of its fair share, the link rate divided by the
    /// number of flows started by the end of the run. The window smooths DCQCN's sawtooth
    /// (±20 % at a 1 ms scale at 100 Gb/s) and the line-rate burst a new flow starts with.
    /// `None` if it never gets there.
    pub fn convergence_time(
        &self,
        flow: usize,
        window: Duration,
        tolerance: f64,
    ) -> Option<Duration> {
        let start = self.config.start_of(flow);
        let b = self.bin_ns();
        let w = ((window.as_nanos() as u64).div_ceil(b)).max(1) as usize;
        let n = self.samples.len();
        let first = start.as_nanos().div_ceil(b) as usize;
        let end = Instant::from_nanos(n as u64 * b);
        let active = (0..self.flows.len())
            .filter(|&i| self.config.start_of(i) < end)
            .count()
            .max(1);
        let fair = self.config.link_bps as f64 / active as f64;
        let v = &self.delivered_bins[flow];
        let mut bytes: u64 = (first..first + w)
            .map(|i| v.get(i).copied().unwrap_or(0))
            .sum();
        let to_bps = |bytes: u64| bytes as f64 * 8e9 / (w as u64 * b) as f64;
        for k in first..(n + 1).saturating_sub(w) {
            if (to_bps(bytes) - fair).abs() <= tolerance * fair {
                let t = k as u64 * b;
                return Some(Duration::from_nanos(t.saturating_sub(start.as_nanos())));
            }
            bytes -= v.get(k).copied().unwrap_or(0);
            bytes += v.get(k + w).copied().unwrap_or(0);
        }
        None
    }
}

/// What happens at an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Sender `flow` may have something to do (stale unless `gen` is current).
    Wake { flow: u32, gen: u32 },
    /// A frame of `flow` reaches the switch.
    Arrive { flow: u32 },
    /// A CNP reaches sender `flow`.
    Cnp { flow: u32 },
    /// A PAUSE reaches the senders.
    Pause,
    /// A RESUME reaches the senders.
    Resume,
    /// The switch checks whether the backlog fell to XON.
    PfcCheck,
    /// Record a sample.
    Sample,
}

#[derive(Debug)]
struct Event {
    at: Instant,
    seq: u64,
    kind: Kind,
}

impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

struct Sender {
    cc: Box<dyn RateControl>,
    pacer: Pacer,
    np: NotificationPoint,
    start: Instant,
    nic_free: Instant,
    nic: Serialiser,
    /// When the flow's last frame reaches the switch (jitter never reorders a flow).
    last_arrival: Instant,
    gen: u32,
    wake_at: Option<Instant>,
    totals: FlowTotals,
}

struct Sim {
    cfg: IncastConfig,
    end: Instant,
    leg: Duration,
    heap: BinaryHeap<Event>,
    seq: u64,
    senders: Vec<Sender>,
    /// The switch port: one FIFO shared by all flows, draining at `link_bps`.
    port: EgressQueue,
    rng: SplitMix64,
    paused: bool,
    paused_since: Instant,
    pfc_asserted: bool,
    pfc_check_at: Option<Instant>,
    result: IncastResult,
    bin_ns: u64,
    events: u64,
}

impl Sim {
    fn push(&mut self, at: Instant, kind: Kind) {
        self.seq += 1;
        self.heap.push(Event {
            at,
            seq: self.seq,
            kind,
        });
    }

    /// Recompute when sender `i` next has work and schedule it if earlier than planned
    /// (or if `force`, e.g. after its own wake-up).
    fn schedule(&mut self, i: usize, now: Instant, force: bool) {
        let frame = self.cfg.frame_bytes;
        let s = &mut self.senders[i];
        let mut next = s.cc.next_timer();
        if now < s.start {
            next = Some(s.start);
        } else if !self.paused {
            let from = s.nic_free.max(now);
            let send = s.pacer.earliest_send(from, frame);
            next = Some(next.map_or(send, |t| t.min(send)));
        }
        let Some(next) = next else {
            s.wake_at = None;
            return;
        };
        let next = next.max(now);
        if force || s.wake_at.is_none_or(|w| next < w) {
            s.gen = s.gen.wrapping_add(1);
            s.wake_at = Some(next);
            let gen = s.gen;
            self.push(
                next,
                Kind::Wake {
                    flow: i as u32,
                    gen,
                },
            );
        }
    }

    fn wake(&mut self, i: usize, now: Instant) {
        let frame = self.cfg.frame_bytes;
        let leg = self.leg;
        let jitter = self.cfg.jitter.as_nanos() as u64;
        let extra = if jitter > 0 {
            Duration::from_nanos(self.rng.below(jitter + 1))
        } else {
            Duration::ZERO
        };
        let s = &mut self.senders[i];
        s.wake_at = None;
        s.cc.on_timer(now);
        s.pacer.set_rate(now, s.cc.rate_bps());
        let mut arrive = None;
        if now >= s.start && !self.paused && now >= s.nic_free && s.pacer.can_send(now, frame) {
            s.pacer.on_send(now, frame);
            s.cc.on_sent(now, frame);
            s.pacer.set_rate(now, s.cc.rate_bps());
            let continuing = s.nic_free >= now;
            let ns = s.nic.ns(self.cfg.link_bps, frame as u64, continuing);
            s.nic_free = now + Duration::from_nanos(ns);
            s.totals.sent += 1;
            s.last_arrival = s.last_arrival.max(s.nic_free + leg + extra);
            arrive = Some(s.last_arrival);
        }
        if let Some(at) = arrive {
            self.push(at, Kind::Arrive { flow: i as u32 });
        }
        self.schedule(i, now, true);
    }

    fn arrive(&mut self, i: usize, now: Instant) {
        let frame = self.cfg.frame_bytes;
        // The queue draws only when marking is possible, so runs without marking use no
        // randomness.
        let rng = &mut self.rng;
        let (marked, finish) = match self.port.offer(now, frame as u64, || rng.next_u64()) {
            Verdict::Dropped { .. } => {
                self.senders[i].totals.dropped += 1;
                return;
            }
            Verdict::Queued { mark, finish, .. } => (mark, finish),
        };
        let delivered = finish + self.leg;
        let depth = self.port.backlog(now);
        self.result.max_queue_bytes = self.result.max_queue_bytes.max(depth);
        let bin = (now.as_nanos() / self.bin_ns) as usize;
        if let Some(m) = self.result.queue_max_bins.get_mut(bin) {
            *m = (*m).max(depth);
        }
        let dbin = (delivered.as_nanos() / self.bin_ns) as usize;
        if let Some(b) = self.result.delivered_bins[i].get_mut(dbin) {
            *b += frame as u64;
        }
        let s = &mut self.senders[i];
        s.totals.delivered += 1;
        if marked {
            s.totals.ce_marked += 1;
            if s.np.on_ce(delivered) {
                s.totals.cnps += 1;
                self.push(
                    delivered + self.leg + self.leg,
                    Kind::Cnp { flow: i as u32 },
                );
            }
        }
        if let Some(pfc) = self.cfg.pfc {
            if !self.pfc_asserted && depth >= pfc.xoff_bytes {
                self.pfc_asserted = true;
                self.result.pfc_pauses += 1;
                self.push(now + self.leg, Kind::Pause);
            }
            if self.pfc_asserted && self.pfc_check_at.is_none() {
                self.arm_pfc_check(now, pfc);
            }
        }
    }

    fn arm_pfc_check(&mut self, now: Instant, pfc: Pfc) {
        if let Some(t) = self.port.drain_time(now, pfc.xon_bytes) {
            self.pfc_check_at = Some(t);
            self.push(t, Kind::PfcCheck);
        }
    }

    fn pfc_check(&mut self, now: Instant) {
        let Some(pfc) = self.cfg.pfc else { return };
        self.pfc_check_at = None;
        self.port.expire(now);
        if !self.pfc_asserted {
            return;
        }
        if self.port.backlog(now) <= pfc.xon_bytes {
            self.pfc_asserted = false;
            self.push(now + self.leg, Kind::Resume);
        } else {
            self.arm_pfc_check(now, pfc);
        }
    }

    fn sample(&mut self, now: Instant) {
        self.port.expire(now);
        let bin = (now.as_nanos() / self.bin_ns) as usize; // this sample closes bin - 1
        let idx = bin.saturating_sub(1);
        let interval_s = self.bin_ns as f64 / 1e9;
        let flows = self
            .senders
            .iter()
            .enumerate()
            .map(|(i, s)| FlowSample {
                throughput_bps: self.result.delivered_bins[i]
                    .get(idx)
                    .map_or(0.0, |&b| b as f64 * 8.0 / interval_s),
                rate_bps: if now >= s.start { s.cc.rate_bps() } else { 0 },
                alpha: if now >= s.start {
                    s.cc.alpha(now)
                } else {
                    None
                },
            })
            .collect();
        let queue_max = self
            .result
            .queue_max_bins
            .get(idx)
            .copied()
            .unwrap_or(0)
            .max(self.port.backlog(now));
        self.result.samples.push(Sample {
            t: now,
            queue_bytes: self.port.backlog(now),
            queue_max_bytes: queue_max,
            pfc_paused: self.paused,
            flows,
        });
        if let Some(m) = self.result.queue_max_bins.get_mut(idx) {
            *m = queue_max;
        }
        let next = now + self.cfg.sample_interval;
        if next <= self.end {
            self.push(next, Kind::Sample);
        }
    }

    fn run(mut self) -> IncastResult {
        for i in 0..self.senders.len() {
            let start = self.senders[i].start;
            self.schedule(i, start, true);
        }
        self.push(Instant::ZERO + self.cfg.sample_interval, Kind::Sample);
        while let Some(ev) = self.heap.pop() {
            if ev.at > self.end {
                break;
            }
            self.events += 1;
            let now = ev.at;
            match ev.kind {
                Kind::Wake { flow, gen } => {
                    let i = flow as usize;
                    if self.senders[i].gen == gen {
                        self.wake(i, now);
                    }
                }
                Kind::Arrive { flow } => self.arrive(flow as usize, now),
                Kind::Cnp { flow } => {
                    let i = flow as usize;
                    let s = &mut self.senders[i];
                    s.cc.on_cnp(now);
                    s.pacer.set_rate(now, s.cc.rate_bps());
                    self.schedule(i, now, false);
                }
                Kind::Pause => {
                    if !self.paused {
                        self.paused = true;
                        self.paused_since = now;
                    }
                }
                Kind::Resume => {
                    if self.paused {
                        self.paused = false;
                        self.result.pfc_paused += now - self.paused_since;
                        for i in 0..self.senders.len() {
                            self.schedule(i, now, true);
                        }
                    }
                }
                Kind::PfcCheck => self.pfc_check(now),
                Kind::Sample => self.sample(now),
            }
        }
        if self.paused {
            self.result.pfc_paused += self.end - self.paused_since;
        }
        self.result.flows = self.senders.iter().map(|s| s.totals).collect();
        self.result.events = self.events;
        self.result
    }
}

/// Run an incast experiment.
///
/// # Errors
/// What [`validate`](IncastConfig::validate) finds wrong with the configuration.
pub fn run(cfg: &IncastConfig) -> Result<IncastResult, IncastConfigError> {
    cfg.validate()?;
    let bin_ns = cfg.sample_interval.as_nanos() as u64;
    let end = Instant::ZERO + cfg.duration;
    let bins = (end.as_nanos() / bin_ns) as usize + 2;
    let senders = (0..cfg.senders)
        .map(|i| {
            let cc = cfg.cc.build(cfg.link_bps);
            let pacer = Pacer::new(cc.rate_bps(), cfg.pacer_burst_bytes);
            Sender {
                cc,
                pacer,
                np: NotificationPoint::new(cfg.np_interval),
                start: cfg.start_of(i),
                nic_free: Instant::ZERO,
                nic: Serialiser::default(),
                last_arrival: Instant::ZERO,
                gen: 0,
                wake_at: None,
                totals: FlowTotals::default(),
            }
        })
        .collect();
    let result = IncastResult {
        config: cfg.clone(),
        samples: Vec::with_capacity(bins),
        flows: Vec::new(),
        delivered_bins: vec![vec![0; bins]; cfg.senders],
        queue_max_bins: vec![0; bins],
        max_queue_bytes: 0,
        pfc_pauses: 0,
        pfc_paused: Duration::ZERO,
        events: 0,
    };
    let sim = Sim {
        leg: cfg.rtt / 4,
        end,
        heap: BinaryHeap::new(),
        seq: 0,
        senders,
        port: EgressQueue::new(EgressConfig {
            rate_bps: Some(cfg.link_bps),
            limit_bytes: Some(cfg.buffer_bytes),
            red: cfg.red,
        }),
        rng: SplitMix64::new(cfg.seed),
        paused: false,
        paused_since: Instant::ZERO,
        pfc_asserted: false,
        pfc_check_at: None,
        result,
        bin_ns,
        events: 0,
        cfg: cfg.clone(),
    };
    Ok(sim.run())
}

#[cfg(test)]
mod tests;
