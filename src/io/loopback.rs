//! An in-memory device pair: what one end sends, the other receives, in order, with no loss
//! (a full queue drops, as a full NIC ring would). Used by `ferroce demo` (no root, no setup)
//! and by tests of the runtime.

use super::sys::event::{poll_readable, EventFd};
use super::{IoStats, PacketDevice};
use crossbeam::channel::{bounded, Receiver, Sender, TrySendError};
use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// One end of a loopback link.
pub struct Loopback {
    tx: Sender<Vec<u8>>,
    rx: Receiver<Vec<u8>>,
    /// A frame taken off the queue by `wait_readable`, delivered first by `recv_batch`.
    pending: VecDeque<Vec<u8>>,
    /// Buffers handed back by the peer after it received them (no allocation in steady state).
    recycle_rx: Receiver<Vec<u8>>,
    recycle_tx: Sender<Vec<u8>>,
    capacity: usize,
    stats: IoStats,
    /// Signalled by the peer when it queues frames for us.
    ready: Arc<EventFd>,
    /// The peer's.
    peer_ready: Arc<EventFd>,
    /// The frames of the batch being sent, filled before any is queued (kept for its
    /// capacity).
    outbox: Vec<Vec<u8>>,
}

impl Loopback {
    /// Two connected ends; each direction holds up to `depth` frames of up to `capacity` bytes.
    pub fn pair(depth: usize, capacity: usize) -> io::Result<(Loopback, Loopback)> {
        let (ab_tx, ab_rx) = bounded(depth);
        let (ba_tx, ba_rx) = bounded(depth);
        // Buffers A received are recycled to B's sender, and vice versa.
        let (to_b_tx, to_b_rx) = bounded(depth);
        let (to_a_tx, to_a_rx) = bounded(depth);
        let ea = Arc::new(EventFd::new()?);
        let eb = Arc::new(EventFd::new()?);
        tracing::debug!(depth, capacity, "loopback pair open");
        let mk = |tx, rx, recycle_rx, recycle_tx, ready, peer_ready| Loopback {
            tx,
            rx,
            pending: VecDeque::new(),
            recycle_rx,
            recycle_tx,
            capacity,
            stats: IoStats::default(),
            ready,
            peer_ready,
            outbox: Vec::new(),
        };
        Ok((
            mk(ab_tx, ba_rx, to_a_rx, to_b_tx, ea.clone(), eb.clone()),
            mk(ba_tx, ab_rx, to_b_rx, to_a_tx, eb, ea),
        ))
    }
}

impl PacketDevice for Loopback {
    fn recv_batch(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let mut n = 0;
        while n < max {
            let Some(frame) = self.pending.pop_front().or_else(|| self.rx.try_recv().ok()) else {
                break;
            };
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += frame.len() as u64;
            f(&frame);
            let _ = self.recycle_tx.try_send(frame);
            n += 1;
        }
        Ok(n)
    }

    fn send_batch(
        &mut self,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> io::Result<usize> {
        // Fill every frame of the batch first, then queue them back to back: a peer that
        // polls the queue sees the batch arrive together, as a NIC's ring would take the
        // frames of one doorbell, not one frame per fill (a conformance test's burst of READs
        // reached a spinning peer one at a time and never made it hold more than one).
        let mut buf = Vec::new();
        while self.outbox.len() < max {
            if buf.is_empty() {
                buf = self.recycle_rx.try_recv().unwrap_or_default();
            }
            buf.resize(self.capacity, 0);
            let Some(len) = fill(&mut buf) else { break };
            let mut frame = std::mem::take(&mut buf);
            frame.truncate(len.min(self.capacity));
            self.outbox.push(frame);
        }
        let n = self.outbox.len();
        let sent_before = self.stats.tx_frames;
        for frame in self.outbox.drain(..) {
            let len = frame.len();
            match self.tx.try_send(frame) {
                Ok(()) => {
                    self.stats.tx_frames += 1;
                    self.stats.tx_bytes += len as u64;
                }
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                    self.stats.tx_dropped += 1;
                }
            }
        }
        if self.stats.tx_frames != sent_before {
            self.peer_ready.signal();
        }
        Ok(n)
    }

    fn wait_readable(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.ready.drain();
        if !self.pending.is_empty() || !self.rx.is_empty() {
            return Ok(());
        }
        poll_readable(&[self.ready.fd()], timeout).map(|_| ())
    }

    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.ready.fd())
    }

    fn frame_capacity(&self) -> usize {
        self.capacity
    }

    fn stats(&self) -> IoStats {
        self.stats
    }

    fn describe(&self) -> String {
        "loopback".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_cross_in_order_and_full_queue_drops() {
        let (mut a, mut b) = Loopback::pair(4, 64).unwrap();
        let mut k = 0u8;
        let sent = a
            .send_batch(10, &mut |buf| {
                k += 1;
                buf[..3].copy_from_slice(&[k, k, k]);
                Some(3)
            })
            .unwrap();
        assert_eq!(sent, 10);
        assert_eq!(a.stats().tx_frames, 4);
        assert_eq!(a.stats().tx_dropped, 6);
        b.wait_readable(Some(Duration::from_millis(1))).unwrap();
        let mut got = Vec::new();
        b.recv_batch(100, &mut |f| got.push(f.to_vec())).unwrap();
        assert_eq!(
            got,
            vec![vec![1, 1, 1], vec![2, 2, 2], vec![3, 3, 3], vec![4, 4, 4]]
        );
    }

    #[test]
    fn wait_readable_then_receive_keeps_the_frame() {
        let (mut a, mut b) = Loopback::pair(4, 64).unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            a.send_batch(1, &mut |buf| {
                buf[0] = 9;
                Some(1)
            })
            .unwrap();
            a
        });
        b.wait_readable(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        b.recv_batch(10, &mut |f| got.push(f.to_vec())).unwrap();
        assert_eq!(got, vec![vec![9]]);
        t.join().unwrap();
    }
}
