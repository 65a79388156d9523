//! The tester's packet link: any [`PacketDevice`] (AF_PACKET, AF_XDP, the UDP socket, or an
//! in-memory loopback in tests), a per-test capture of every frame sent and received, and
//! the parse of what arrives into [`Rx`] values. Nothing here knows the protocol rules.

use crate::io::PacketDevice;
use crate::pcap::capture::PcapSink;
use crate::wire::{self, Ecn, RoceRepr};
use std::fs::File;
use std::io::{self, BufWriter};
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// One RoCE packet received from the peer.
#[derive(Clone, Debug)]
pub struct Rx {
    /// When it arrived.
    pub at: Instant,
    /// Its transport headers.
    pub repr: RoceRepr,
    /// Its payload.
    pub payload: Vec<u8>,
    /// The IP header's ECN bits.
    pub ecn: Ecn,
    /// IP source.
    pub src: IpAddr,
    /// IP destination.
    pub dst: IpAddr,
    /// Whether its ICRC is good.
    pub icrc_ok: bool,
    /// The one-line rendering (`ferroce inspect` style).
    pub line: String,
    /// The whole frame.
    pub raw: Vec<u8>,
    /// Offset of the BTH in `raw`.
    pub bth_at: usize,
}

impl Rx {
    /// Its opcode.
    pub fn opcode(&self) -> wire::Opcode {
        self.repr.bth.opcode
    }
    /// Its PSN.
    pub fn psn(&self) -> u32 {
        self.repr.bth.psn.get()
    }
}

/// The device plus the capture of the current test.
pub struct Link {
    dev: Box<dyn PacketDevice>,
    cap: Option<PcapSink<BufWriter<File>>>,
    ident: u16,
    /// Addresses we accept frames for (our IP).
    pub our_ip: IpAddr,
    /// Frames that were not RoCE v2, or malformed (counted, not delivered).
    pub ignored: u64,
    /// Frames sent.
    pub sent: u64,
    /// RoCE packets received for us.
    pub received: u64,
    /// Whether the backend puts our frames on the wire as built (raw backends); the UDP
    /// socket backend rewrites the IP/UDP headers and recomputes the ICRC.
    pub raw: bool,
}

fn wall() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

impl Link {
    /// A link over `dev`, accepting frames for `our_ip`; `raw` as the field says.
    pub fn new(dev: Box<dyn PacketDevice>, our_ip: IpAddr, raw: bool) -> Link {
        Link {
            dev,
            cap: None,
            ident: 1,
            our_ip,
            ignored: 0,
            sent: 0,
            received: 0,
            raw,
        }
    }

    /// The device's short name.
    pub fn describe(&self) -> String {
        self.dev.describe()
    }

    /// Start writing every frame to `path` (ending any capture in progress).
    pub fn start_capture(&mut self, path: &Path) -> io::Result<()> {
        self.stop_capture();
        let f = File::create(path)?;
        self.cap =
            Some(PcapSink::new(BufWriter::new(f)).map_err(|e| io::Error::other(e.to_string()))?);
        Ok(())
    }

    /// End the capture in progress, if any.
    pub fn stop_capture(&mut self) {
        if let Some(c) = self.cap.take() {
            let mut w = c.into_inner();
            let _ = std::io::Write::flush(&mut w);
        }
    }

    /// The next IPv4 identification (counts up, as Linux does per destination).
    pub fn next_ident(&mut self) -> u16 {
        self.ident = self.ident.wrapping_add(1);
        self.ident
    }

    /// Send frames back to back (one batch where the device allows). Retries a full ring
    /// for up to 100 ms.
    pub fn send(&mut self, frames: &[Vec<u8>]) -> io::Result<()> {
        let mut next = 0;
        let t0 = Instant::now();
        while next < frames.len() {
            let cap = &mut self.cap;
            let mut k = next;
            let n = self.dev.send_batch(frames.len() - next, &mut |buf| {
                let f = frames.get(k)?;
                if f.len() > buf.len() {
                    return None;
                }
                buf[..f.len()].copy_from_slice(f);
                if let Some(c) = cap.as_mut() {
                    let _ = c.write(wall(), f);
                }
                k += 1;
                Some(f.len())
            })?;
            if n == 0 {
                if frames[next].len() > self.dev.frame_capacity() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "a {}-byte frame does not fit the device ({} bytes)",
                            frames[next].len(),
                            self.dev.frame_capacity()
                        ),
                    ));
                }
                if t0.elapsed() > Duration::from_millis(100) {
                    return Err(io::Error::new(
                        io::ErrorKind::WouldBlock,
                        "the device accepts no frames",
                    ));
                }
                std::thread::sleep(Duration::from_micros(50));
            }
            next += n;
            self.sent += n as u64;
        }
        Ok(())
    }

    /// Wait up to `timeout` for frames and return the RoCE packets addressed to us that
    /// arrived (possibly none).
    pub fn recv(&mut self, timeout: Duration) -> io::Result<Vec<Rx>> {
        let mut out = Vec::new();
        let mut got = self.take(&mut out)?;
        if got == 0 && !timeout.is_zero() {
            self.dev.wait_readable(Some(timeout))?;
            got = self.take(&mut out)?;
        }
        let _ = got;
        Ok(out)
    }

    fn take(&mut self, out: &mut Vec<Rx>) -> io::Result<usize> {
        let cap = &mut self.cap;
        let our_ip = self.our_ip;
        let ignored = &mut self.ignored;
        let received = &mut self.received;
        let mut total = 0;
        loop {
            let n = self.dev.recv_batch(64, &mut |frame| {
                let at = Instant::now();
                match wire::packet::decode_frame(frame) {
                    Ok(p) if p.repr.ip.dst() == our_ip => {
                        if let Some(c) = cap.as_mut() {
                            let _ = c.write(wall(), frame);
                        }
                        *received += 1;
                        out.push(Rx {
                            at,
                            repr: p.repr.roce,
                            payload: p.payload.to_vec(),
                            ecn: p.repr.ip.ecn(),
                            src: p.repr.ip.src(),
                            dst: p.repr.ip.dst(),
                            icrc_ok: p.icrc_ok(),
                            line: format!("{}", wire::pretty::FrameLine(&p)),
                            raw: frame.to_vec(),
                            bth_at: p.offsets.bth,
                        });
                    }
                    _ => *ignored += 1,
                }
            })?;
            total += n;
            if n < 64 {
                break;
            }
        }
        Ok(total)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.stop_capture();
    }
}
