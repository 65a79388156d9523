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

/// What is written for a received `frame`: the frame itself, or, when the device synthesised
/// its headers (`fill`) and it is an IPv6 UDP datagram with checksum 0, a copy in `scratch`
/// with the checksum computed (the kernel checked the real one; the ICRC does not cover it).
fn recorded<'a>(frame: &'a [u8], fill: bool, scratch: &'a mut Vec<u8>) -> &'a [u8] {
    const ETH: usize = 14;
    const UDP: usize = ETH + 40;
    if !fill
        || frame.len() < UDP + 8
        || frame[12..14] != [0x86, 0xdd]
        || frame[ETH + 6] != 17
        || frame[UDP + 6..UDP + 8] != [0, 0]
    {
        return frame;
    }
    let len = usize::from(u16::from_be_bytes([frame[UDP + 4], frame[UDP + 5]]));
    if len < 8 || UDP + len > frame.len() {
        return frame;
    }
    let ip = |o: usize| {
        let mut a = [0u8; 16];
        a.copy_from_slice(&frame[o..o + 16]);
        std::net::IpAddr::V6(std::net::Ipv6Addr::from(a))
    };
    let c = crate::wire::udp::checksum(ip(ETH + 8), ip(ETH + 24), &frame[UDP..UDP + len]);
    scratch.clear();
    scratch.extend_from_slice(frame);
    scratch[UDP + 6..UDP + 8].copy_from_slice(&c.to_be_bytes());
    scratch
}

fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

impl<D: PacketDevice, W: Write + Send> PacketDevice for PcapTap<D, W> {
    fn recv_batch(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let fill = self.inner.rx_udp_checksum_synthesised();
        let sink = &mut self.sink;
        let errs = &mut self.write_errors;
        let budget = &self.budget;
        let mut scratch = Vec::new();
        self.inner.recv_batch(max, &mut |frame| {
            record(sink, budget, errs, recorded(frame, fill, &mut scratch));
            f(frame)
        })
    }

    fn recv_batch_checked(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], crate::io::IcrcCheck),
    ) -> io::Result<usize> {
        // Recording does not change the frame: the inner device's verdict holds.
        let fill = self.inner.rx_udp_checksum_synthesised();
        let sink = &mut self.sink;
        let errs = &mut self.write_errors;
        let budget = &self.budget;
        let mut scratch = Vec::new();
        self.inner.recv_batch_checked(max, &mut |frame, icrc| {
            record(sink, budget, errs, recorded(frame, fill, &mut scratch));
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
    fn rx_udp_checksum_synthesised(&self) -> bool {
        self.inner.rx_udp_checksum_synthesised()
    }
    fn join_group(&mut self, group: std::net::IpAddr, join: bool) -> io::Result<()> {
        self.inner.join_group(group, join)
    }
    fn serve_address(&mut self, local: std::net::IpAddr) -> io::Result<()> {
        self.inner.serve_address(local)
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

    /// An IPv6 UDP frame as the UDP socket device synthesises a received one (checksum 0).
    fn udp6_frame(payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x86, 0xdd]);
        let ulen = (8 + payload.len()) as u16;
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&ulen.to_be_bytes());
        f.extend_from_slice(&[17, 64]);
        f.extend_from_slice(&"fd00::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
        f.extend_from_slice(&"fd00::2".parse::<std::net::Ipv6Addr>().unwrap().octets());
        f.extend_from_slice(&[0xc0, 0x01, 0x12, 0xb7]);
        f.extend_from_slice(&ulen.to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn a_synthesised_ipv6_checksum_is_filled_in_for_the_capture() {
        let payload: Vec<u8> = (0..37u8).map(|i| i.wrapping_mul(29)).collect();
        let f = udp6_frame(&payload);
        let mut scratch = Vec::new();
        let out = recorded(&f, true, &mut scratch).to_vec();
        assert_eq!(out.len(), f.len());
        assert_eq!(out[..60], f[..60], "only the checksum changes");
        assert_eq!(out[62..], f[62..]);
        assert_ne!(out[60..62], [0, 0]);
        // RFC 8200 §8.1, summed here on its own: pseudo-header (addresses, length, next
        // header) and the datagram with its checksum add up to 0xffff.
        let mut sum = 0u32;
        let mut add = |b: &[u8]| {
            for c in b.chunks(2) {
                sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
            }
        };
        add(&out[22..54]);
        add(&(8 + payload.len() as u32).to_be_bytes());
        add(&[0, 0, 0, 17]);
        add(&out[54..]);
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff);
        // Left as they are: devices that record what was on the wire, checksums already
        // there, IPv4.
        assert_eq!(recorded(&f, false, &mut scratch), &f[..]);
        let mut set = f.clone();
        set[60] = 0x12;
        assert_eq!(recorded(&set, true, &mut scratch), &set[..]);
        let mut v4 = f.clone();
        v4[12..14].copy_from_slice(&[0x08, 0x00]);
        assert_eq!(recorded(&v4, true, &mut scratch), &v4[..]);
        assert_eq!(recorded(&f[..40], true, &mut scratch), &f[..40]);
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
