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
//! **Coalesced frames** ([`AfPacketConfig::gso_rx`], on by default): a UDP sender on this
//! host that uses segmentation offload (ferroce's UDP backend does) puts one super-datagram
//! of many RoCE packets on a host-internal path (veth, a bridge), and the packet socket on
//! the receiving interface sees it as one oversized frame. The socket sets
//! `PACKET_VNET_HDR`, so the kernel says which frames those are and their segment size; the
//! device splits each into the frames the kernel's own segmentation would have produced
//! ([`gso::split`]: same headers, segment lengths, IPv4 ID + i, fresh checksum) and hands
//! those up, one copy each. Every frame sent then carries an empty `virtio_net_hdr` in front
//! (added by the send paths).
//!
//! Needs `CAP_NET_RAW`. The kernel's own stack still sees every frame: run with the testbed's
//! `--drop-roce-input` (or an equivalent nft rule) so that it does not answer RoCE packets
//! with ICMP port unreachable.

pub mod filter;
pub mod gso;
pub mod ring;

use super::sys::packet::{
    PacketSocket, RecvMeta, RingReq, RxRing, TxFill, TxRing, VnetHdr, VNET_HDR_LEN,
};
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
    Recvmmsg {
        /// Frames per `recvmmsg` call.
        batch: usize,
    },
}

/// How frames are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfPacketTx {
    /// Copy frames out of `batch` (1..=64) device buffers with one `sendmmsg` per batch.
    Sendmmsg {
        /// Frames per `sendmmsg` call.
        batch: usize,
    },
    /// A TPACKET_V3 TX ring of `slots` slots, one `send()` doorbell per batch.
    Ring {
        /// Slots of the TX ring.
        slots: usize,
    },
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
    /// The send path.
    pub tx: AfPacketTx,
    /// Request `PACKET_QDISC_BYPASS` (ignored if the kernel refuses it).
    pub qdisc_bypass: bool,
    /// Attach the RoCE v2 BPF filter (turn off only to debug).
    pub filter: bool,
    /// Receive UDP GSO super-frames with their segment size (`PACKET_VNET_HDR`) and split
    /// them (see the module docs); ignored if the kernel refuses the option.
    pub gso_rx: bool,
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
            gso_rx: true,
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
        rebuild: Rebuild,
        /// Segments of frame `next - 1` delivered so far, when a batch ended inside a
        /// super-frame (0: none pending).
        seg: usize,
    },
}

/// What splitting coalesced frames did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GsoRxStats {
    /// UDP GSO super-frames received, and the frames they were split into.
    pub super_frames: u64,
    /// Frames those super-frames were split into.
    pub segments: u64,
    /// Frames with another kind of segmentation pending, or that did not split (dropped).
    pub unsplittable: u64,
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
    /// IP multicast groups joined on the interface.
    groups: super::GroupMemberships,
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
        let mut sock = PacketSocket::new().map_err(|e| {
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
        let gso_rx = cfg.gso_rx && sock.set_vnet_hdr().is_ok();
        // A super-frame can be as long as an IP datagram can.
        let max_rx_frame = if gso_rx { 65_535 + 14 + 4 } else { max_frame };
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
                        walker: RxWalker::new(max_frame + 4, gso_rx),
                    },
                    tx_ring,
                )
            }
            Some(batch) => (
                Rx::Mmsg {
                    // Room for a frame longer than the MTU allows, so that one is seen as
                    // truncated rather than passed on cut.
                    bufs: (0..batch)
                        .map(|_| vec![0u8; max_rx_frame + 1].into_boxed_slice())
                        .collect(),
                    meta: vec![RecvMeta::default(); batch],
                    next: 0,
                    got: 0,
                    rebuild: Rebuild::new(max_frame + 4),
                    seg: 0,
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
            "af_packet({} mtu {mtu}, {rx_desc}, {tx_desc}{}{})",
            cfg.ifname,
            if qdisc_bypass { ", qdisc bypass" } else { "" },
            if gso_rx { ", gso rx" } else { "" }
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
            // an interface index is positive
            groups: super::GroupMemberships::new(ifindex.unsigned_abs()),
        })
    }

    /// What splitting coalesced frames did.
    pub fn gso_rx_stats(&self) -> GsoRxStats {
        match &self.rx {
            Rx::Ring { walker, .. } => walker.rebuild.gso,
            Rx::Mmsg { rebuild, .. } => rebuild.gso,
        }
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

/// What the kernel said about a received frame besides its bytes.
#[derive(Clone, Copy, Debug, Default)]
struct FrameMeta {
    /// A VLAN tag the kernel moved out of the frame into the metadata: (TCI, TPID).
    vlan: Option<(u16, u16)>,
    /// The `virtio_net_hdr` of a `PACKET_VNET_HDR` socket.
    vnet: Option<VnetHdr>,
}

/// Rebuilding received frames before they go up: a VLAN tag put back, a UDP GSO super-frame
/// split. One scratch buffer; counters of the splitting.
struct Rebuild {
    scratch: Vec<u8>,
    gso: GsoRxStats,
}

impl Rebuild {
    fn new(frame_capacity: usize) -> Self {
        Rebuild {
            scratch: Vec::with_capacity(frame_capacity),
            gso: GsoRxStats::default(),
        }
    }

    /// Hand up one received frame: as it is (with its VLAN tag put back), or for a UDP GSO
    /// super-frame the datagrams it stands for, from segment `skip` on and at most `room`
    /// of them (`(skip, room)`). Returns how many frames went up and whether the received
    /// frame is done with.
    fn hand_up(
        &mut self,
        data: &[u8],
        meta: FrameMeta,
        (skip, room): (usize, usize),
        stats: &mut IoStats,
        f: &mut dyn FnMut(&[u8]),
    ) -> (usize, bool) {
        let gso_type = meta.vnet.map_or(0, |v| v.gso_type & 0x7f);
        if gso_type == 0 {
            let s = &mut self.scratch;
            let frame = match meta.vlan {
                Some((tci, tpid)) => {
                    s.clear();
                    s.extend_from_slice(&data[..12]);
                    s.extend_from_slice(&tpid.to_be_bytes());
                    s.extend_from_slice(&tci.to_be_bytes());
                    s.extend_from_slice(&data[12..]);
                    &s[..]
                }
                None => data,
            };
            stats.rx_frames += 1;
            stats.rx_bytes += frame.len() as u64;
            f(frame);
            return (1, true);
        }
        let size = meta.vnet.map_or(0, |v| v.gso_size);
        let split = match gso::split(data, size) {
            Ok(sp) if gso_type == VnetHdr::GSO_UDP_L4 => sp,
            _ => {
                // TCP or UDP-fragmentation offload (the filter lets no such frame through),
                // or headers that do not parse: nothing to hand up.
                self.gso.unsplittable += 1;
                stats.rx_dropped += 1;
                return (0, true);
            }
        };
        if skip == 0 {
            self.gso.super_frames += 1;
        }
        let mut k = 0;
        let mut i = skip;
        while i < split.count() && k < room {
            split.write(i, meta.vlan, &mut self.scratch);
            stats.rx_frames += 1;
            stats.rx_bytes += self.scratch.len() as u64;
            stats.rx_coalesced += 1;
            self.gso.segments += 1;
            f(&self.scratch);
            k += 1;
            i += 1;
        }
        (k, i >= split.count())
    }
}

/// Walks the RX ring in order: the block it is in, where in that block, and the scratch
/// buffer for frames whose VLAN tag is put back. Safe code over [`RxRing`]; unit-tested (and
/// run under miri) with a ring on heap memory.
struct RxWalker {
    block: usize,
    cursor: Cursor,
    /// Segments of the frame at `cursor` delivered so far (a batch ended inside a
    /// super-frame).
    seg: usize,
    /// The socket has `PACKET_VNET_HDR`: each frame's `virtio_net_hdr` sits right before it.
    vnet: bool,
    rebuild: Rebuild,
    /// Blocks or frames that failed validation.
    ring_errors: u64,
}

impl RxWalker {
    fn new(frame_capacity: usize, vnet: bool) -> Self {
        RxWalker {
            block: 0,
            cursor: Cursor::default(),
            seg: 0,
            vnet,
            rebuild: Rebuild::new(frame_capacity),
            ring_errors: 0,
        }
    }

    /// Deliver frames of the block `bytes` (the one at `self.block`) from the cursor on, until
    /// `*n` reaches `max`; `true` when the block is used up (or does not validate).
    fn walk_block(
        &mut self,
        bytes: &[u8],
        n: &mut usize,
        max: usize,
        stats: &mut IoStats,
        f: &mut dyn FnMut(&[u8]),
    ) -> bool {
        match Block::parse(bytes) {
            Err(_) => {
                self.ring_errors += 1;
                stats.rx_dropped += 1;
                true
            }
            Ok(blk) => {
                let mut it = blk.frames_from(self.cursor);
                // Where to resume when a batch ends inside a super-frame.
                let mut pending = None;
                while *n < max {
                    let before = it.cursor();
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
                            let vnet = if self.vnet {
                                let b = fr.before_mac;
                                b.len()
                                    .checked_sub(VNET_HDR_LEN)
                                    .and_then(|o| VnetHdr::parse(&b[o..]))
                            } else {
                                None
                            };
                            let meta = FrameMeta {
                                vlan: fr.vlan,
                                vnet,
                            };
                            let (k, done) =
                                self.rebuild
                                    .hand_up(fr.data, meta, (self.seg, max - *n), stats, f);
                            *n += k;
                            if done {
                                self.seg = 0;
                            } else {
                                self.seg += k;
                                pending = Some(before);
                                break;
                            }
                        }
                    }
                }
                match pending {
                    Some(c) => {
                        self.cursor = c;
                        false
                    }
                    None => {
                        self.cursor = it.cursor();
                        it.is_done()
                    }
                }
            }
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
            let done = self.walk_block(bytes, &mut n, max, stats, f);
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

/// Fuzzing (`fuzz/fuzz_targets/backend_rx.rs`) and tests: walk one TPACKET_V3 receive block
/// (any bytes) exactly as the receive ring's reader does, in batches of `batch` frames, each
/// frame (a VLAN tag put back, a UDP GSO super-frame split) handed to `f`. Returns the frames
/// handed up and the ring errors counted, or `None` when a batch neither handed up a frame nor
/// finished the block (the ring would stall on it) or more than `2^20` frames came out.
#[doc(hidden)]
pub fn walk_block(
    block: &[u8],
    vnet: bool,
    batch: usize,
    stats: &mut IoStats,
    f: &mut dyn FnMut(&[u8]),
) -> Option<(usize, u64)> {
    let mut w = RxWalker::new(65_536, vnet);
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let mut n = 0;
        let done = w.walk_block(block, &mut n, batch, stats, f);
        total += n;
        if done {
            return Some((total, w.ring_errors));
        }
        if n == 0 || total > 1 << 20 {
            return None;
        }
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
                rebuild,
                seg,
            } => {
                let mut n = 0;
                while n < max {
                    // A super-frame left half delivered is `next - 1`; else take the next.
                    if *seg == 0 {
                        if *next == *got {
                            *next = 0;
                            *got = self.sock.recv_frames(bufs, meta)?;
                            if *got == 0 {
                                break;
                            }
                        }
                        *next += 1;
                    }
                    let i = *next - 1;
                    let m = meta[i];
                    if m.truncated || m.len < 14 {
                        self.stats.rx_dropped += 1;
                        *seg = 0;
                        continue;
                    }
                    let fm = FrameMeta {
                        vlan: m.vlan,
                        vnet: m.vnet,
                    };
                    let (k, done) =
                        rebuild.hand_up(&bufs[i][..m.len], fm, (*seg, max - n), &mut self.stats, f);
                    n += k;
                    *seg = if done { 0 } else { *seg + k };
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
            Rx::Mmsg { next, got, seg, .. } if next < got || *seg > 0 => return Ok(()),
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

    /// A member of the group on the interface ([`super::GroupMemberships`]); the socket's
    /// filter takes its RoCE frames (UDP 4791) like any others.
    fn join_group(&mut self, group: std::net::IpAddr, join: bool) -> io::Result<()> {
        self.groups.join_group(group, join)
    }

    fn describe(&self) -> String {
        self.desc.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::ring::build;
    use super::*;

    /// A block with a UDP GSO super-frame between two plain frames, as a `PACKET_VNET_HDR`
    /// socket gets it: the walker hands up the split datagrams in order, resumes inside the
    /// super-frame when a batch ends there, and counts what it did.
    #[test]
    fn walker_splits_super_frames_and_resumes_inside_them() {
        let (want, sup) = gso::fixture::frames(false, 7, &[300, 300, 300, 40]);
        let seg = (want[0].len() - 42) as u16;
        let a = frame(70, 1);
        let z = frame(90, 2);
        let bs = 8192;
        let mut blk = build::block(bs, &[(&a, None), (&sup, None), (&z, None)]);
        let offs = build::frame_offsets(&blk);
        // The virtio_net_hdr right before each frame: none, UDP_L4 with the segment size,
        // none.
        let vnet = |gso_type: u8, size: u16| {
            let mut v = [0u8; VNET_HDR_LEN];
            v[0] = 1;
            v[1] = gso_type;
            v[2..4].copy_from_slice(&42u16.to_ne_bytes());
            v[4..6].copy_from_slice(&size.to_ne_bytes());
            v
        };
        let at = |o: usize| o + usize::from(build::MAC_OFF) - VNET_HDR_LEN;
        blk[at(offs[0])..at(offs[0]) + 10].copy_from_slice(&vnet(0, 0));
        blk[at(offs[1])..at(offs[1]) + 10].copy_from_slice(&vnet(VnetHdr::GSO_UDP_L4, seg));
        blk[at(offs[2])..at(offs[2]) + 10].copy_from_slice(&vnet(0, 0));
        let mut rx = RxRing::on_heap(bs, 2);
        rx.kernel_fill(0, &blk);
        let mut w = RxWalker::new(1600, true);
        let mut st = IoStats::default();
        let mut got = Vec::new();
        // 3 frames: the plain one and two segments; the block stays ours.
        assert_eq!(
            w.recv(&mut rx, 3, &mut st, &mut |f| got.push(f.to_vec())),
            3
        );
        assert!(rx.is_user(0));
        assert_eq!(
            w.recv(&mut rx, 100, &mut st, &mut |f| got.push(f.to_vec())),
            3
        );
        assert!(!rx.is_user(0));
        let mut expect = vec![a.clone()];
        expect.extend(want.iter().cloned());
        expect.push(z.clone());
        assert_eq!(got, expect);
        assert_eq!(st.rx_frames, 6);
        let g = w.rebuild.gso;
        assert_eq!((g.super_frames, g.segments, g.unsplittable), (1, 4, 0));
        // A super-frame of another offload type is dropped and counted, the walk goes on.
        let mut blk = build::block(bs, &[(&sup, None), (&z, None)]);
        let offs = build::frame_offsets(&blk);
        blk[at(offs[0])..at(offs[0]) + 10].copy_from_slice(&vnet(1, 1448));
        rx.kernel_fill(1, &blk);
        let mut got = Vec::new();
        assert_eq!(
            w.recv(&mut rx, 100, &mut st, &mut |f| got.push(f.to_vec())),
            1
        );
        assert_eq!(got, vec![z]);
        assert_eq!(w.rebuild.gso.unsplittable, 1);
        assert_eq!(st.rx_dropped, 1);
    }

    fn frame(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
    }

    /// The device's receive walk over a ring on heap memory (runs under miri): order across
    /// blocks and the wrap, batches ending mid-block, hand-back, VLAN re-insertion, drops.
    #[test]
    fn walker_delivers_in_order_and_hands_blocks_back() {
        let bs = 2048;
        let mut rx = RxRing::on_heap(bs, 3);
        let mut w = RxWalker::new(1600, false);
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
