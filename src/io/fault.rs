//! A wrapper that impairs any device, on the receive side: drop, duplicate, reorder, corrupt
//! (one bit the ICRC covers) and CE-mark frames with given probabilities, from a seeded
//! generator (the same decisions as the simulator's links, on real traffic).

use super::{IoStats, Medium, PacketDevice};
use crate::rng::SplitMix64;
use std::collections::VecDeque;
use std::io;
use std::time::Duration;

/// Probabilities per received frame.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultConfig {
    /// Drop the frame.
    pub drop: f64,
    /// Deliver it twice.
    pub duplicate: f64,
    /// Hold a frame back until `reorder_depth` later frames have been delivered.
    pub reorder: f64,
    /// How many frames pass a held-back one.
    pub reorder_depth: usize,
    /// Flip a random bit.
    pub corrupt: f64,
    /// Set ECN CE on an ECN-capable IP packet.
    pub ce_mark: f64,
    /// Seed of the decisions.
    pub seed: u64,
}

/// What the injector did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FaultStats {
    /// Frames dropped.
    pub dropped: u64,
    /// Frames delivered twice.
    pub duplicated: u64,
    /// Frames held back.
    pub reordered: u64,
    /// Frames with a bit flipped.
    pub corrupted: u64,
    /// Frames marked CE.
    pub ce_marked: u64,
}

/// A wrapper that drops, duplicates, reorders, corrupts and CE-marks the frames `D`
/// receives, with seeded probabilities ([`FaultConfig`]); what it sends passes unchanged.
pub struct FaultInjector<D> {
    inner: D,
    cfg: FaultConfig,
    rng: SplitMix64,
    /// Held-back frames with the number of frames still to pass them.
    held: VecDeque<(usize, Vec<u8>)>,
    /// What it did so far.
    pub stats: FaultStats,
}

impl<D: PacketDevice> FaultInjector<D> {
    /// Wrap `inner`.
    pub fn new(inner: D, cfg: FaultConfig) -> Self {
        FaultInjector {
            inner,
            rng: SplitMix64::new(cfg.seed),
            cfg,
            held: VecDeque::new(),
            stats: FaultStats::default(),
        }
    }
    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }
}

/// Flip one bit of a RoCE frame that its ICRC covers (after the UDP header's first 6 bytes);
/// any other frame gets a random bit flipped.
fn corrupt(frame: &mut [u8], rng: &mut SplitMix64) {
    if frame.is_empty() {
        return;
    }
    let start = match crate::wire::packet::decode_frame(frame) {
        Ok(p) => p.offsets.bth,
        Err(_) => 0,
    };
    let span = frame.len() - start;
    let bit = rng.below(span as u64 * 8) as usize;
    frame[start + bit / 8] ^= 0x80 >> (bit % 8);
}

fn ce_mark(frame: &mut [u8]) {
    let mut off = 14;
    if frame.len() >= 18 && frame[12..14] == [0x81, 0x00] {
        off = 18;
    }
    if let Some(ip) = frame.get_mut(off..) {
        if matches!(
            crate::wire::ip::read_ecn(ip),
            Some(crate::wire::Ecn::Ect0 | crate::wire::Ecn::Ect1)
        ) {
            crate::wire::ip::set_ecn(ip, crate::wire::Ecn::Ce);
        }
    }
}

impl<D: PacketDevice> PacketDevice for FaultInjector<D> {
    fn recv_batch(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let cfg = self.cfg;
        let rng = &mut self.rng;
        let held = &mut self.held;
        let st = &mut self.stats;
        let mut out = 0usize;
        let n = self.inner.recv_batch(max, &mut |frame| {
            if rng.chance(cfg.drop) {
                st.dropped += 1;
                return;
            }
            let mut fr = frame.to_vec();
            if rng.chance(cfg.corrupt) {
                st.corrupted += 1;
                corrupt(&mut fr, rng);
            }
            if rng.chance(cfg.ce_mark) {
                st.ce_marked += 1;
                ce_mark(&mut fr);
            }
            let dup = rng.chance(cfg.duplicate);
            if rng.chance(cfg.reorder) && cfg.reorder_depth > 0 {
                st.reordered += 1;
                held.push_back((cfg.reorder_depth, fr));
                return;
            }
            f(&fr);
            out += 1;
            if dup {
                st.duplicated += 1;
                f(&fr);
                out += 1;
            }
            // Frames held back are released after enough later frames went past.
            for h in held.iter_mut() {
                h.0 = h.0.saturating_sub(1);
            }
            while held.front().is_some_and(|h| h.0 == 0) {
                let (_, h) = held.pop_front().unwrap_or_default();
                f(&h);
                out += 1;
            }
        })?;
        // Nothing else arrived: release the held frames rather than keep them forever.
        if n == 0 {
            while let Some((_, h)) = self.held.pop_front() {
                f(&h);
                out += 1;
            }
        }
        Ok(out)
    }

    fn send_batch(
        &mut self,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> io::Result<usize> {
        self.inner.send_batch(max, fill)
    }
    fn wait_readable(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        if !self.held.is_empty() {
            return Ok(());
        }
        self.inner.wait_readable(timeout)
    }
    fn frame_capacity(&self) -> usize {
        self.inner.frame_capacity()
    }
    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.poll_fd()
    }
    fn rx_udp_checksum_synthesised(&self) -> bool {
        self.inner.rx_udp_checksum_synthesised()
    }
    fn rx_filter(&self) -> Option<crate::io::udp_filter::SocketFilter> {
        self.inner.rx_filter()
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
        format!("{}+faults", self.inner.describe())
    }
}
