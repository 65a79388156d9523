//! What `ferroce sim incast` reports beside the simulator's summary: the link utilisation over
//! the whole run (start-up transient included) and whether the steady-state window really is
//! steady, so that a run too short for DCQCN to recover from the initial incast says so
//! instead of printing a transient as the result.

use crate::sim::incast::IncastResult;

/// The utilisation of the bottleneck over parts of a run, from the sampled goodput.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Steadiness {
    /// Bytes delivered over the whole run ÷ what the link could carry.
    pub whole_run: f64,
    /// The same over the first half of the steady-state window (the third quarter of the
    /// run with the default window, the second half).
    pub window_first_half: f64,
    /// The same over the second half of the window (the last quarter).
    pub window_second_half: f64,
}

/// How far apart the two halves of the window may be for the run to count as steady: DCQCN's
/// sawtooth moves the utilisation of a 100 Gb/s bottleneck by far less than this between two
/// quarters of a run long enough to have recovered from the incast.
pub const STEADY_TOLERANCE: f64 = 0.05;

impl Steadiness {
    /// Whether the two halves of the steady-state window agree within [`STEADY_TOLERANCE`].
    pub fn is_steady(&self) -> bool {
        (self.window_first_half - self.window_second_half).abs() <= STEADY_TOLERANCE
    }
}

/// The utilisation over the samples `bins` (mean over them of the goodput of every flow ÷
/// the link rate); 0 for no samples.
fn utilization(result: &IncastResult, bins: core::ops::Range<usize>) -> f64 {
    let samples = &result.samples[bins];
    if samples.is_empty() || result.config.link_bps == 0 {
        return 0.0;
    }
    let sum: f64 = samples
        .iter()
        .map(|s| s.flows.iter().map(|f| f.throughput_bps).sum::<f64>())
        .sum();
    sum / samples.len() as f64 / result.config.link_bps as f64
}

/// The whole run's utilisation and that of the two halves of the steady-state window
/// (`config.steady_from` to the end).
pub fn steadiness(result: &IncastResult) -> Steadiness {
    let n = result.samples.len();
    let from = ((n as f64 * result.config.steady_from).floor() as usize).min(n);
    let mid = from + (n - from) / 2;
    Steadiness {
        whole_run: utilization(result, 0..n),
        window_first_half: utilization(result, from..mid),
        window_second_half: utilization(result, mid..n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::incast::{run, IncastConfig};
    use crate::time::Duration;

    fn eight_senders(ms: u64) -> IncastResult {
        let mut c = IncastConfig::new(8, 100_000_000_000);
        c.duration = Duration::from_millis(ms);
        run(&c).unwrap()
    }

    #[test]
    fn ten_ms_of_an_eight_sender_incast_is_not_steady() {
        // DCQCN cuts every rate at the incast and needs tens of ms to recover: the window
        // 5-10 ms is still climbing.
        let s = steadiness(&eight_senders(10));
        assert!(!s.is_steady(), "{s:?}");
        assert!(s.window_second_half > s.window_first_half + 0.1, "{s:?}");
    }

    #[test]
    fn a_hundred_ms_is_steady_and_the_whole_run_includes_the_transient() {
        let r = eight_senders(100);
        let s = steadiness(&r);
        assert!(s.is_steady(), "{s:?}");
        // The window's utilisation is the summary's (the same bytes, two computations).
        let u = r.summary().utilization;
        let window = (s.window_first_half + s.window_second_half) / 2.0;
        assert!((window - u).abs() < 1e-3, "{window} vs {u}");
        assert!(s.whole_run < u, "{s:?} vs {u}");
    }
}
