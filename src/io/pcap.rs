//! A wrapper that writes every frame sent and received through any device to a pcap file,
//! with timestamps (what `--pcap FILE` does). Frames are written as they cross the wrapper,
//! all of them or, with a [`PcapBudget`], as many as the budget allows.

use super::{IoStats, Medium, PacketDevice};
use crate::pcap::capture::PcapSink;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How many more frames a [`PcapTap`] may record, shared with whoever runs the traffic (which
/// may renew it, e.g. at the start of each test); frames beyond it cross the tap unrecorded
/// and are counted. Cloning shares the budget.
#[derive(Clone, Debug)]
pub struct PcapBudget(Arc<BudgetState>);

#[derive(Debug)]
struct BudgetState {
    /// Frames that may still be recorded (`u64::MAX`: no limit).
    remaining: AtomicU64,
    recorded: AtomicU64,
    skipped: AtomicU64,
}

impl PcapBudget {
    /// A budget of `frames` (`None`: no limit).
    pub fn new(frames: Option<u64>) -> Self {
        PcapBudget(Arc::new(BudgetState {
            remaining: AtomicU64::new(frames.unwrap_or(u64::MAX)),
            recorded: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        }))
    }

    /// Start over with `frames` (`None`: no limit) and zero counts.
    pub fn reset(&self, frames: Option<u64>) {
        self.0.recorded.store(0, Ordering::Relaxed);
        self.0.skipped.store(0, Ordering::Relaxed);
        self.0
            .remaining
            .store(frames.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Frames recorded and frames left out since the last [`reset`](Self::reset).
    pub fn counts(&self) -> (u64, u64) {
        (
            self.0.recorded.load(Ordering::Relaxed),
            self.0.skipped.load(Ordering::Relaxed),
        )
    }

    /// Whether the next frame may be recorded (taking it from the budget) or not (counted).
    fn take(&self) -> bool {
        let ok = self
            .0
            .remaining
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| match r {
                0 => None,
                u64::MAX => Some(u64::MAX),
                r => Some(r - 1),
            })
            .is_ok();
        let counter = if ok {
            &self.0.recorded
        } else {
            &self.0.skipped
        };
        counter.fetch_add(1, Ordering::Relaxed);
        ok
    }
}

/// Records traffic of `D` into a pcap sink.
pub struct PcapTap<D, W: Write> {
    inner: D,
    sink: PcapSink<W>,
    budget: Option<PcapBudget>,
    /// Frames that could not be written (the file is best effort; the traffic goes on).
    pub write_errors: u64,
}

impl<D: PacketDevice, W: Write + Send> PcapTap<D, W> {
    /// Record every frame of `inner` to `w` (a pcap file header is written at once).
    pub fn new(inner: D, w: W) -> Result<Self, crate::pcap::capture::CaptureError> {
        Ok(PcapTap {
            inner,
            sink: PcapSink::new(w)?,
            budget: None,
            write_errors: 0,
        })
    }
    /// Record frames only while `budget` lasts.
    pub fn with_budget(
        inner: D,
        w: W,
        budget: PcapBudget,
    ) -> Result<Self, crate::pcap::capture::CaptureError> {
        let mut t = Self::new(inner, w)?;
        t.budget = Some(budget);
        Ok(t)
    }
    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }
    /// The wrapped device and the writer.
    pub fn into_parts(self) -> (D, W) {
        (self.inner, self.sink.into_inner())
    }
}

/// Record `frame` unless the budget is spent.
fn record<W: Write>(
    sink: &mut PcapSink<W>,
    budget: &Option<PcapBudget>,
    errs: &mut u64,
    frame: &[u8],
) {
    if budget.as_ref().is_none_or(PcapBudget::take) && sink.write(now(), frame).is_err() {
        *errs += 1;
    }
}

fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

impl<D: PacketDevice, W: Write + Send> PacketDevice for PcapTap<D, W> {
    fn recv_batch(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let sink = &mut self.sink;
        let errs = &mut self.write_errors;
        let budget = &self.budget;
        self.inner.recv_batch(max, &mut |frame| {
            record(sink, budget, errs, frame);
            f(frame)
        })
    }

    fn recv_batch_checked(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], crate::io::IcrcCheck),
    ) -> io::Result<usize> {
        // Recording does not change the frame: the inner device's verdict holds.
        let sink = &mut self.sink;
        let errs = &mut self.write_errors;
        let budget = &self.budget;
        self.inner.recv_batch_checked(max, &mut |frame, icrc| {
            record(sink, budget, errs, frame);
            f(frame, icrc)
        })
    }

    fn send_batch(
        &mut self,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> io::Result<usize> {
        let sink = &mut self.sink;
        let errs = &mut self.write_errors;
        let budget = &self.budget;
        self.inner.send_batch(max, &mut |buf| {
            let n = fill(buf)?;
            record(sink, budget, errs, &buf[..n.min(buf.len())]);
            Some(n)
        })
    }

    fn wait_readable(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.inner.wait_readable(timeout)
    }
    fn frame_capacity(&self) -> usize {
        self.inner.frame_capacity()
    }
    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.poll_fd()
    }
    fn rx_filter(&self) -> Option<crate::io::udp_filter::SocketFilter> {
        self.inner.rx_filter()
    }
    fn join_group(&mut self, group: std::net::IpAddr, join: bool) -> io::Result<()> {
        self.inner.join_group(group, join)
    }
    fn medium(&self) -> Medium {
        self.inner.medium()
    }
    fn stats(&self) -> IoStats {
        self.inner.stats()
    }
    fn describe(&self) -> String {
        format!("{}+pcap", self.inner.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::Loopback;

    /// Send `n` frames through the tap (and receive them on the other side).
    fn send(tap: &mut impl PacketDevice, n: usize) {
        let mut left = n;
        while left > 0 {
            left -= tap
                .send_batch(left, &mut |buf| {
                    buf[..64].fill(0xab);
                    Some(64)
                })
                .unwrap();
        }
    }

    fn frames_in(bytes: &[u8]) -> usize {
        crate::pcap::capture::open(bytes).unwrap().count()
    }

    #[test]
    fn a_budget_records_the_first_frames_and_counts_the_rest() {
        let (a, mut b) = Loopback::pair(64, 1500).unwrap();
        let budget = PcapBudget::new(Some(3));
        let mut tap = PcapTap::with_budget(a, Vec::new(), budget.clone()).unwrap();
        send(&mut tap, 5);
        assert_eq!(budget.counts(), (3, 2));
        // Renewed (as the demo does per test): two more recorded, then none.
        budget.reset(Some(2));
        send(&mut tap, 4);
        assert_eq!(budget.counts(), (2, 2));
        // Unlimited.
        budget.reset(None);
        send(&mut tap, 7);
        assert_eq!(budget.counts(), (7, 0));
        // Every frame reached the other side; the file holds 3 + 2 + 7.
        let mut got = 0;
        while b.recv_batch(64, &mut |_| got += 1).unwrap() > 0 {}
        assert_eq!(got, 16);
        let (_, file) = tap.into_parts();
        assert_eq!(frames_in(&file), 12);
    }

    #[test]
    fn without_a_budget_every_frame_is_recorded() {
        let (a, _b) = Loopback::pair(64, 1500).unwrap();
        let mut tap = PcapTap::new(a, Vec::new()).unwrap();
        send(&mut tap, 9);
        assert_eq!(frames_in(&tap.into_parts().1), 9);
    }
}
