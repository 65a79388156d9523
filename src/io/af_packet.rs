//! The AF_PACKET backend: whole Ethernet frames through a packet socket bound to one
//! interface, received through a **TPACKET_V3 ring** and sent with **`sendmmsg(2)`** (default)
//! or a TPACKET_V3 TX ring (selectable: [`AfPacketTx`]).
//!
//! Set-up order (no window in which unfiltered frames reach the socket): socket with protocol
//! 0 → `PACKET_VERSION = TPACKET_V3` → the RoCE v2 BPF filter ([`filter::roce_v2`]) →
//! `PACKET_IGNORE_OUTGOING` (frames that other senders on this host transmit on the
//! interface — the kernel's UDP stack, another device — are not received; a packet socket
//! never receives its own transmissions anyway) →
//! `PACKET_QDISC_BYPASS` (if configured and available) → rings → `mmap` → `bind(ETH_P_ALL)`.
//!
//! **Receive**: the kernel fills blocks of the ring with frames and hands a block over when
//! it is full or when the retire timer fires ([`AfPacketConfig::rx_retire_ms`], 1 ms by
//! default: that is the latency floor of a lightly loaded V3 ring). [`PacketDevice::recv_batch`]
//! walks the owned blocks in ring order with [`ring::Block`] (every kernel-written offset and
//! length is checked before use), delivers each frame in place, and hands a block back once
//! all of its frames are consumed; a batch that ends mid-block resumes there. A VLAN tag the
//! driver stripped into the frame's metadata is put back in the frame (one copy, tagged
//! frames only). Truncated frames (longer than the block can hold) and blocks that fail
//! validation are counted in `rx_dropped`, as are the kernel's own drops (ring full).
//!
//! **Transmit**: the caller writes the frame into a device buffer and it is sent as is.
//! `sendmmsg` is the default because it measured at least as fast as the TX ring on this
//! project's veth testbed (1082-byte frames, transmit-only, three alternating rounds of one
//! second: sendmmsg 584k–629k frames/s, TX ring 485k–583k; end to end A → R → B both modes
//! land at 180k–250k frames/s, limited by the forwarding path on two cores — see
//! `throughput_1024_byte_payload_frames` in `tests/packet_backends.rs`). The TX ring saves
//! the copy into the skb, which for ~1 KiB frames costs less than the ring's per-slot
//! bookkeeping and page references. It also carries a hazard on veth that `sendmmsg` does
//! not: its pages are attached to the skb by reference and the slot returns to
//! `AVAILABLE` when the skb is orphaned, which on a veth pair (by our reading of the
//! kernel: `skb_orphan` in `ip_rcv_core`) happens in the *peer's* IP layer, possibly before
//! the last reader downstream has copied the frame. A million-frame stress test
//! (`af_packet_full_speed_distinct_frames_arrive_intact`) saw no corruption with either
//! mode, so this is a theoretical concern here, but it is one more reason for the default.
//! The ring remains available ([`AfPacketTx::Ring`]) for NICs where it may win.
//!
//! Needs `CAP_NET_RAW`. The kernel's own stack still sees every frame: run with the testbed's
//! `--drop-roce-input` (or an equivalent nft rule) so that it does not answer RoCE packets
//! with ICMP port unreachable.

pub mod filter;
pub mod ring;

use super::sys::packet::{PacketSocket, RecvMeta, RingReq, RxRing, TxFill, TxRing};
use super::{IoStats, PacketDevice};
use ring::{Block, Cursor};
use std::cell::Cell;
use std::io;
use std::time::Duration;

/// How frames are received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfPacketRx {
    /// The TPACKET_V3 ring (no copy; a block reaches user space when it is full or its
    /// retire timer fires, so a lightly loaded ring adds up to `rx_retire_ms` of delay).
    Ring,
    /// `recvmmsg(2)` into `batch` (1..=64) device buffers, with `PACKET_AUXDATA` for VLAN
    /// tags: one copy per frame, but every frame is available as soon as it arrives. Needs
    /// [`AfPacketTx::Sendmmsg`]. What a switch wants: no batching delay on sparse traffic
    /// (ACKs, CNPs).
    Recvmmsg { batch: usize },
}

/// How frames are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfPacketTx {
    /// Copy frames out of `batch` (1..=64) device buffers with one `sendmmsg` per batch.
    Sendmmsg { batch: usize },
    /// A TPACKET_V3 TX ring of `slots` slots, one `send()` doorbell per batch.
    Ring { slots: usize },
}

/// Configuration of an [`AfPacketDevice`].
#[derive(Clone, Debug)]
pub struct AfPacketConfig {
    /// Interface to bind to (in the calling thread's network namespace).
    pub ifname: String,
    /// Bytes per RX block (a multiple of the page size; at least one full frame).
    pub rx_block_size: usize,
    /// RX blocks.
    pub rx_blocks: usize,
    /// Hand a partly filled block to user space after this many milliseconds.
    pub rx_retire_ms: u32,
    /// The receive path (the ring fields above apply to [`AfPacketRx::Ring`]).
    pub rx: AfPacketRx,
    pub tx: AfPacketTx,
    /// Request `PACKET_QDISC_BYPASS` (ignored if the kernel refuses it).
    pub qdisc_bypass: bool,
    /// Attach the RoCE v2 BPF filter (turn off only to debug).
    pub filter: bool,
}

impl AfPacketConfig {
    /// Defaults: 16 × 256 KiB RX blocks, 1 ms retire timeout, `sendmmsg` in batches of 64,
    /// qdisc bypass, RoCE filter.
    pub fn new(ifname: &str) -> Self {
        AfPacketConfig {
            ifname: ifname.to_string(),
            rx_block_size: 1 << 18,
            rx_blocks: 16,
            rx_retire_ms: 1,
            rx: AfPacketRx::Ring,
            tx: AfPacketTx::Sendmmsg { batch: 64 },
            qdisc_bypass: true,
            filter: true,
        }
    }
}

enum Tx {
    Mmsg {
        bufs: Vec<Box<[u8]>>,
    },
    /// `rekick`: a doorbell failed, frames may still be waiting in the ring.
    Ring {
        ring: TxRing,
        next: usize,
        rekick: bool,
    },
}

enum Rx {
    Ring {
        ring: RxRing,
        walker: RxWalker,
    },
    Mmsg {
        bufs: Vec<Box<[u8]>>,
        meta: Vec<RecvMeta>,
        /// Frames received but not yet delivered (a batch that ended early): `next..got`.
        next: usize,
        got: usize,
        scratch: Vec<u8>,
    },
}

/// A packet device on an AF_PACKET socket (see the module documentation).
pub struct AfPacketDevice {
    sock: PacketSocket,
    rx: Rx,
    tx: Tx,
    capacity: usize,
    stats: IoStats,
    /// Kernel drops read so far (`PACKET_STATISTICS` resets on read).
    kernel_drops: Cell<u64>,
    qdisc_bypass: bool,
    desc: String,
}

fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl Drop for AfPacketDevice {
    fn drop(&mut self) {
        tracing::info!(device = %self.desc, stats = ?self.stats, "AF_PACKET device closed");
    }
}

impl AfPacketDevice {
    /// Open the device on `cfg.ifname`. Needs `CAP_NET_RAW`.
    pub fn open(cfg: &AfPacketConfig) -> io::Result<Self> {
        let page = 4096usize;
        let sock = PacketSocket::new().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("AF_PACKET socket (needs CAP_NET_RAW): {e}"),
            )
        })?;
        let ifindex = sock.ifindex(&cfg.ifname)?;
        let mtu = sock.mtu(&cfg.ifname)? as usize;
        // Largest frame: MTU + Ethernet header + one VLAN tag.
        let max_frame = mtu + 14 + 4;
        if cfg.rx_block_size % page != 0 || cfg.rx_block_size < max_frame + 256 {
            return Err(invalid(format!(
                "rx_block_size {} must be a multiple of {page} and hold a {max_frame}-byte frame",
                cfg.rx_block_size
            )));
        }
        if cfg.rx_blocks == 0 || cfg.rx_blocks > 1 << 16 {
            return Err(invalid(format!("rx_blocks {} out of range", cfg.rx_blocks)));
        }
        let mmsg_rx = match cfg.rx {
            AfPacketRx::Ring => None,
            AfPacketRx::Recvmmsg { batch } => {
                if batch == 0 || batch > super::sys::packet::MAX_RECV_BATCH {
                    return Err(invalid(format!("recvmmsg batch {batch} out of range")));
                }
                if !matches!(cfg.tx, AfPacketTx::Sendmmsg { .. }) {
                    return Err(invalid(
                        "recvmmsg receive needs sendmmsg transmit (no rings)".into(),
                    ));
                }
                Some(batch)
            }
        };
        if mmsg_rx.is_none() {
            sock.set_tpacket_v3()?;
        } else {
            sock.set_auxdata()?;
            // Room for bursts while the owner is descheduled (the kernel counts overflows as
            // drops in PACKET_STATISTICS).
            let _ = sock.set_rcvbuf(cfg.rx_block_size.saturating_mul(cfg.rx_blocks));
        }
        if cfg.filter {
            sock.attach_filter(&filter::roce_v2())?;
        }
        sock.set_ignore_outgoing()?;
        let qdisc_bypass = cfg.qdisc_bypass && sock.set_qdisc_bypass().is_ok();
        let rx_frame = 2048u32;
        let rx_req = RingReq {
            block_size: cfg.rx_block_size as u32,
            block_nr: cfg.rx_blocks as u32,
            frame_size: rx_frame,
            frame_nr: (cfg.rx_block_size as u32 / rx_frame) * cfg.rx_blocks as u32,
            retire_blk_tov: cfg.rx_retire_ms,
        };
        let tx_req = match cfg.tx {
            AfPacketTx::Ring { slots } => {
                if slots == 0 || slots > 1 << 16 {
                    return Err(invalid(format!("tx ring slots {slots} out of range")));
                }
                sock.set_tx_loss()?;
                let frame_size = round_up(super::sys::packet::TX_DATA_OFFSET + max_frame, 16);
                let block_size = round_up(frame_size * 8, page);
                let fpb = block_size / frame_size;
                let blocks = slots.div_ceil(fpb);
                Some(RingReq {
                    block_size: block_size as u32,
                    block_nr: blocks as u32,
                    frame_size: frame_size as u32,
                    frame_nr: (fpb * blocks) as u32,
                    retire_blk_tov: 0,
                })
            }
            AfPacketTx::Sendmmsg { batch } => {
                if batch == 0 || batch > super::sys::packet::MAX_SEND_BATCH {
                    return Err(invalid(format!("sendmmsg batch {batch} out of range")));
                }
                None
            }
        };
        let (rx, tx_ring) = match mmsg_rx {
            None => {
                let (ring, tx_ring) = sock.map_rings(rx_req, tx_req)?;
                (
                    Rx::Ring {
                        ring,
                        walker: RxWalker::new(max_frame + 4),
                    },
                    tx_ring,
                )
            }
            Some(batch) => (
                Rx::Mmsg {
                    // Room for a frame longer than the MTU allows, so that one is seen as
                    // truncated rather than passed on cut.
                    bufs: (0..batch)
                        .map(|_| vec![0u8; max_frame + 1].into_boxed_slice())
                        .collect(),
                    meta: vec![RecvMeta::default(); batch],
                    next: 0,
                    got: 0,
                    scratch: Vec::with_capacity(max_frame + 4),
                },
                None,
            ),
        };
        let (tx, capacity, tx_desc) = match (cfg.tx, tx_ring) {
            (AfPacketTx::Ring { .. }, Some(ring)) => {
                let cap = ring.capacity().min(max_frame);
                let d = format!("tx ring {}x{}", ring.slots(), ring.capacity());
                (
                    Tx::Ring {
                        ring,
                        next: 0,
                        rekick: false,
                    },
                    cap,
                    d,
                )
            }
            (AfPacketTx::Sendmmsg { batch }, _) | (AfPacketTx::Ring { slots: batch }, None) => {
                let bufs = (0..batch)
                    .map(|_| vec![0u8; max_frame].into_boxed_slice())
                    .collect();
                (
                    Tx::Mmsg { bufs },
                    max_frame,
                    format!("tx sendmmsg x{batch}"),
                )
            }
        };
        sock.bind(ifindex)?;
        let rx_desc = match mmsg_rx {
            None => format!(
                "tpacket_v3 rx {}x{}KiB/{}ms",
                cfg.rx_blocks,
                cfg.rx_block_size / 1024,
                cfg.rx_retire_ms
            ),
            Some(b) => format!("rx recvmmsg x{b}"),
        };
        let desc = format!(
            "af_packet({} mtu {mtu}, {rx_desc}, {tx_desc}{})",
            cfg.ifname,
            if qdisc_bypass { ", qdisc bypass" } else { "" }
        );
        tracing::info!(device = %desc, ifindex, "AF_PACKET device open");
        Ok(AfPacketDevice {
            sock,
            rx,
            tx,
            capacity,
            stats: IoStats::default(),
            kernel_drops: Cell::new(0),
            qdisc_bypass,
            desc,
        })
    }

    /// Blocks or frames the kernel handed over that failed validation.
    pub fn ring_errors(&self) -> u64 {
        match &self.rx {
            Rx::Ring { walker, .. } => walker.ring_errors,
            Rx::Mmsg { .. } => 0,
        }
    }

    /// Whether `PACKET_QDISC_BYPASS` is in effect.
    pub fn qdisc_bypass(&self) -> bool {
        self.qdisc_bypass
    }

    /// TX ring slots still owned by the kernel (0 for `sendmmsg`).
    pub fn tx_in_flight(&self) -> usize {
        match &self.tx {
            Tx::Ring { ring, .. } => ring.in_flight(),
            Tx::Mmsg { .. } => 0,
        }
    }
}

/// Walks the RX ring in order: the block it is in, where in that block, and the scratch
/// buffer for frames whose VLAN tag is put back. Safe code over [`RxRing`]; unit-tested (and
/// run under miri) with a ring on heap memory.
struct RxWalker {
    block: usize,
    cursor: Cursor,
    scratch: Vec<u8>,
    /// Blocks or frames that failed validation.
    ring_errors: u64,
}

impl RxWalker {
    fn new(frame_capacity: usize) -> Self {
        RxWalker {
            block: 0,
            cursor: Cursor::default(),
            scratch: Vec::with_capacity(frame_capacity),
            ring_errors: 0,
        }
    }

    /// A frame is ready without waiting.
    fn readable(&self, rx: &RxRing) -> bool {
        rx.is_user(self.block)
    }

    /// Deliver up to `max` frames to `f`, handing blocks back as they are used up.
    fn recv(
        &mut self,
        rx: &mut RxRing,
        max: usize,
        stats: &mut IoStats,
        f: &mut dyn FnMut(&[u8]),
    ) -> usize {
        let mut n = 0;
        let blocks = rx.block_count();
        while n < max {
            let i = self.block;
            let Some(bytes) = rx.user_block(i) else {
                break;
            };
            let done = match Block::parse(bytes) {
                Err(_) => {
                    self.ring_errors += 1;
                    stats.rx_dropped += 1;
                    true
                }
                Ok(blk) => {
                    let mut it = blk.frames_from(self.cursor);
                    while n < max {
                        match it.next() {
                            None => break,
                            Some(Err(_)) => {
                                self.ring_errors += 1;
                                stats.rx_dropped += 1;
                            }
                            Some(Ok(fr)) => {
                                if fr.truncated() || fr.data.len() < 14 {
                                    stats.rx_dropped += 1;
                                    continue;
                                }
                                stats.rx_frames += 1;
                                n += 1;
                                match fr.vlan {
                                    Some((tci, tpid)) => {
                                        let s = &mut self.scratch;
                                        s.clear();
                                        s.extend_from_slice(&fr.data[..12]);
                                        s.extend_from_slice(&tpid.to_be_bytes());
                                        s.extend_from_slice(&tci.to_be_bytes());
                                        s.extend_from_slice(&fr.data[12..]);
                                        stats.rx_bytes += s.len() as u64;
                                        f(s);
                                    }
                                    None => {
                                        stats.rx_bytes += fr.data.len() as u64;
                                        f(fr.data);
                                    }
                                }
                            }
                        }
                    }
                    self.cursor = it.cursor();
                    it.is_done()
                }
            };
            if !done {
                break;
            }
            rx.release(i);
            self.block = (i + 1) % blocks;
            self.cursor = Cursor::default();
        }
        n
    }
}

impl PacketDevice for AfPacketDevice {
    fn recv_batch(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        match &mut self.rx {
            Rx::Ring { ring, walker } => Ok(walker.recv(ring, max, &mut self.stats, f)),
            Rx::Mmsg {
                bufs,
                meta,
                next,
                got,
                scratch,
            } => {
                let mut n = 0;
                while n < max {
                    if *next == *got {
                        *next = 0;
                        *got = self.sock.recv_frames(bufs, meta)?;
                        if *got == 0 {
                            break;
                        }
                    }
                    let i = *next;
                    *next += 1;
                    let m = meta[i];
                    if m.truncated || m.len < 14 {
                        self.stats.rx_dropped += 1;
                        continue;
                    }
                    let data = &bufs[i][..m.len];
                    self.stats.rx_frames += 1;
                    n += 1;
                    match m.vlan {
                        Some((tci, tpid)) => {
                            scratch.clear();
                            scratch.extend_from_slice(&data[..12]);
                            scratch.extend_from_slice(&tpid.to_be_bytes());
                            scratch.extend_from_slice(&tci.to_be_bytes());
                            scratch.extend_from_slice(&data[12..]);
                            self.stats.rx_bytes += scratch.len() as u64;
                            f(scratch);
                        }
                        None => {
                            self.stats.rx_bytes += data.len() as u64;
                            f(data);
                        }
                    }
                }
                Ok(n)
            }
        }
    }

    fn send_batch(
        &mut self,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> io::Result<usize> {
        let cap = self.capacity;
        match &mut self.tx {
            Tx::Ring { ring, next, rekick } => {
                let mut n = 0;
                let mut queued = 0;
                let slots = ring.slots();
                while n < max {
                    match ring.fill(*next, |buf| fill(&mut buf[..cap])) {
                        TxFill::Busy | TxFill::Empty => break,
                        TxFill::Queued(len) => {
                            self.stats.tx_frames += 1;
                            self.stats.tx_bytes += len as u64;
                            queued += 1;
                        }
                        TxFill::Rejected(_) => self.stats.tx_dropped += 1,
                    }
                    n += 1;
                    *next = (*next + 1) % slots;
                }
                if queued > 0 || *rekick {
                    *rekick = false;
                    match self.sock.kick_tx() {
                        Ok(()) => {}
                        Err(e)
                            if matches!(e.raw_os_error(), Some(libc::ENOBUFS))
                                || e.kind() == io::ErrorKind::WouldBlock
                                || e.kind() == io::ErrorKind::Interrupted =>
                        {
                            // The frame the driver refused is dropped; the rest stay queued
                            // for the next doorbell.
                            self.stats.tx_dropped += 1;
                            *rekick = true;
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok(n)
            }
            Tx::Mmsg { bufs } => {
                const B: usize = super::sys::packet::MAX_SEND_BATCH;
                let mut total = 0;
                while total < max {
                    let want = (max - total).min(bufs.len()).min(B);
                    let mut lens = [0usize; B];
                    let mut k = 0;
                    while k < want {
                        let Some(len) = fill(&mut bufs[k][..cap]) else {
                            break;
                        };
                        lens[k] = len;
                        k += 1;
                    }
                    if k == 0 {
                        break;
                    }
                    total += k;
                    let mut frames: [&[u8]; B] = [&[]; B];
                    let mut m = 0;
                    for (b, &len) in bufs[..k].iter().zip(&lens[..k]) {
                        if (14..=cap).contains(&len) {
                            frames[m] = &b[..len];
                            m += 1;
                        } else {
                            self.stats.tx_dropped += 1;
                        }
                    }
                    let frames = &frames[..m];
                    let mut sent = 0;
                    while sent < frames.len() {
                        match self.sock.send_frames(&frames[sent..]) {
                            Ok(j) => {
                                for fr in &frames[sent..sent + j] {
                                    self.stats.tx_frames += 1;
                                    self.stats.tx_bytes += fr.len() as u64;
                                }
                                sent += j.max(1);
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => {
                                // Device queue full (ENOBUFS/EAGAIN) or a per-frame error:
                                // drop the frame the kernel refused and carry on with the
                                // rest (never block, never lose the batch).
                                let _ = e;
                                self.stats.tx_dropped += 1;
                                sent += 1;
                            }
                        }
                    }
                    if k < want {
                        break;
                    }
                }
                Ok(total)
            }
        }
    }

    fn wait_readable(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        match &self.rx {
            Rx::Ring { ring, walker } if walker.readable(ring) => return Ok(()),
            Rx::Mmsg { next, got, .. } if next < got => return Ok(()),
            _ => {}
        }
        self.sock.wait_readable(timeout).map(drop)
    }

    fn frame_capacity(&self) -> usize {
        self.capacity
    }

    /// The packet socket: readable when a ring block is handed over (the runtime sleeps on it).
    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::{AsFd, AsRawFd};
        Some(self.sock.as_fd().as_raw_fd())
    }

    fn stats(&self) -> IoStats {
        if let Ok(k) = self.sock.take_stats() {
            self.kernel_drops
                .set(self.kernel_drops.get() + u64::from(k.drops));
        }
        IoStats {
            rx_dropped: self.stats.rx_dropped + self.kernel_drops.get(),
            ..self.stats
        }
    }

    fn describe(&self) -> String {
        self.desc.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::ring::build;
    use super::*;

    fn frame(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
    }

    /// The device's receive walk over a ring on heap memory (runs under miri): order across
    /// blocks and the wrap, batches ending mid-block, hand-back, VLAN re-insertion, drops.
    #[test]
    fn walker_delivers_in_order_and_hands_blocks_back() {
        let bs = 2048;
        let mut rx = RxRing::on_heap(bs, 3);
        let mut w = RxWalker::new(1600);
        let mut st = IoStats::default();
        let f0: Vec<Vec<u8>> = (0..5).map(|i| frame(60 + i * 10, i as u8)).collect();
        let f1: Vec<Vec<u8>> = (0..3).map(|i| frame(100 + i, 50 + i as u8)).collect();
        let b0: Vec<(&[u8], Option<u16>)> = f0.iter().map(|f| (f.as_slice(), None)).collect();
        let mut b1: Vec<(&[u8], Option<u16>)> = f1.iter().map(|f| (f.as_slice(), None)).collect();
        b1[1].1 = Some(0x6007);
        rx.kernel_fill(0, &build::block(bs, &b0));
        rx.kernel_fill(1, &build::block(bs, &b1));
        assert!(w.readable(&rx));

        let mut got = Vec::new();
        assert_eq!(
            w.recv(&mut rx, 3, &mut st, &mut |f| got.push(f.to_vec())),
            3
        );
        assert!(rx.is_user(0), "block 0 is not done yet");
        assert_eq!(
            w.recv(&mut rx, 100, &mut st, &mut |f| got.push(f.to_vec())),
            5
        );
        assert!(!rx.is_user(0) && !rx.is_user(1), "both blocks handed back");
        assert!(!w.readable(&rx));
        assert_eq!(w.recv(&mut rx, 100, &mut st, &mut |_| panic!()), 0);

        let mut want: Vec<Vec<u8>> = f0.clone();
        want.extend(f1.iter().cloned());
        let mut tagged = f1[1][..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x60, 0x07]);
        tagged.extend_from_slice(&f1[1][12..]);
        want[6] = tagged;
        assert_eq!(got, want);
        assert_eq!(st.rx_frames, 8);
        assert_eq!(
            st.rx_bytes,
            want.iter().map(|f| f.len() as u64).sum::<u64>()
        );

        // Block 2, then the wrap to block 0; a truncated frame and a corrupt block count as
        // drops, and the walk carries on.
        let g = frame(80, 9);
        let mut b2 = build::block(bs, &[(g.as_slice(), None), (g.as_slice(), None)]);
        let second = build::frame_offsets(&b2)[1];
        build::set32(&mut b2, second + 16, 5000); // tp_len > tp_snaplen: truncated
        rx.kernel_fill(2, &b2);
        let mut bad = build::block(bs, &[(g.as_slice(), None)]);
        build::set32(&mut bad, 20, 1 << 20); // blk_len past the block
        rx.kernel_fill(0, &bad);
        rx.kernel_fill(1, &build::block(bs, &[(g.as_slice(), None)]));
        let mut got = Vec::new();
        assert_eq!(
            w.recv(&mut rx, 100, &mut st, &mut |f| got.push(f.to_vec())),
            2
        );
        assert_eq!(got, vec![g.clone(), g]);
        assert_eq!(st.rx_dropped, 2);
        assert_eq!(w.ring_errors, 1);
        assert!((0..3).all(|i| !rx.is_user(i)));
    }
}
