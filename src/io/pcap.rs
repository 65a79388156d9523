//! A wrapper that writes every frame sent and received through any device to a pcap file,
//! with timestamps (what `--pcap FILE` does). Frames are written as they cross the wrapper.

use super::{IoStats, Medium, PacketDevice};
use crate::pcap::capture::PcapSink;
use std::io::{self, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Records traffic of `D` into a pcap sink.
pub struct PcapTap<D, W: Write> {
    inner: D,
    sink: PcapSink<W>,
    /// Frames that could not be written (the file is best effort; the traffic goes on).
    pub write_errors: u64,
}

impl<D: PacketDevice, W: Write + Send> PcapTap<D, W> {
    pub fn new(inner: D, w: W) -> Result<Self, crate::pcap::capture::CaptureError> {
        Ok(PcapTap {
            inner,
            sink: PcapSink::new(w)?,
            write_errors: 0,
        })
    }
    pub fn inner(&self) -> &D {
        &self.inner
    }
    pub fn into_parts(self) -> (D, W) {
        (self.inner, self.sink.into_inner())
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
        self.inner.recv_batch(max, &mut |frame| {
            if sink.write(now(), frame).is_err() {
                *errs += 1;
            }
            f(frame)
        })
    }

    fn send_batch(
        &mut self,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> io::Result<usize> {
        let sink = &mut self.sink;
        let errs = &mut self.write_errors;
        self.inner.send_batch(max, &mut |buf| {
            let n = fill(buf)?;
            if sink.write(now(), &buf[..n.min(buf.len())]).is_err() {
                *errs += 1;
            }
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
