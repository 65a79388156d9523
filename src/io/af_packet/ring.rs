//! Walking a TPACKET_V3 receive block, treating every byte the kernel wrote as untrusted.
//!
//! A V3 receive ring is `block_nr` blocks of `block_size` bytes. The kernel fills one block at
//! a time with variable-sized frames and hands the whole block to user space at once (status
//! `TP_STATUS_USER`, when it is full or when the retire timer fires); user space walks the
//! frames and gives the block back (`TP_STATUS_KERNEL`). The ownership handshake (atomic
//! status words, the mapping) lives in `io::sys::packet`; this module only interprets the
//! bytes of a block the caller owns, given as a plain `&[u8]`, so it is safe code and runs
//! under miri over heap buffers (`cargo +nightly miri test --lib io::af_packet`).
//!
//! Layout (all fields host-endian, `linux/if_packet.h`):
//!
//! ```text
//! block:  tpacket_block_desc (48 bytes)
//!           0 version u32 | 4 offset_to_priv u32 | 8 block_status u32 | 12 num_pkts u32
//!          16 offset_to_first_pkt u32 | 20 blk_len u32 | 24 seq_num u64 | 32 ts_first | 40 ts_last
//!         ... frames from offset_to_first_pkt, each:
//! frame:  tpacket3_hdr (48 bytes)
//!           0 tp_next_offset u32 | 4 tp_sec | 8 tp_nsec | 12 tp_snaplen | 16 tp_len
//!          20 tp_status | 24 tp_mac u16 | 26 tp_net u16 | 28 hv1.tp_rxhash | 32 hv1.tp_vlan_tci
//!          36 hv1.tp_vlan_tpid u16 | 38 pad | 40 pad[8]
//!         ... frame bytes at frame + tp_mac, tp_snaplen of them (tp_len on the wire)
//! ```
//!
//! Every offset and length is checked before use: the block header against the block, each
//! frame header against `blk_len`, the frame data against the frame's slot (it must end
//! before the next frame header starts). A block that fails a check yields an error for the
//! rest of its frames, never a panic or a read outside the block.

use core::fmt;

/// `sizeof(struct tpacket_block_desc)`.
pub const BLOCK_DESC_LEN: usize = 48;
/// `sizeof(struct tpacket3_hdr)`.
pub const FRAME_HDR_LEN: usize = 48;

/// Offset of `block_status` in the block descriptor (the word the ownership handshake uses).
pub const BLOCK_STATUS_OFFSET: usize = 8;
const NUM_PKTS: usize = 12;
const OFFSET_TO_FIRST: usize = 16;
const BLK_LEN: usize = 20;
const SEQ_NUM: usize = 24;

const F_NEXT: usize = 0;
const F_SEC: usize = 4;
const F_NSEC: usize = 8;
const F_SNAPLEN: usize = 12;
const F_LEN: usize = 16;
const F_STATUS: usize = 20;
const F_MAC: usize = 24;
const F_VLAN_TCI: usize = 32;
const F_VLAN_TPID: usize = 36;

/// `tp_status` / `block_status` bits (`linux/if_packet.h`).
pub mod status {
    /// The slot belongs to the kernel.
    pub const KERNEL: u32 = 0;
    /// The slot belongs to user space.
    pub const USER: u32 = 1 << 0;
    /// The frame was copied (truncated to the slot).
    pub const COPY: u32 = 1 << 1;
    /// Frames were dropped since the last statistics read.
    pub const LOSING: u32 = 1 << 2;
    /// The checksum is not computed yet (offload).
    pub const CSUMNOTREADY: u32 = 1 << 3;
    /// `tp_vlan_tci` holds a stripped tag.
    pub const VLAN_VALID: u32 = 1 << 4;
    /// The block was retired by its timer, not because it was full.
    pub const BLK_TMO: u32 = 1 << 5;
    /// `tp_vlan_tpid` is valid.
    pub const VLAN_TPID_VALID: u32 = 1 << 6;
    /// The checksum was verified.
    pub const CSUM_VALID: u32 = 1 << 7;
}

/// What is wrong with a block or frame the kernel handed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingError {
    /// The block is shorter than its descriptor.
    BlockTooShort(usize),
    /// `blk_len` claims more bytes than the block has, or fewer than the descriptor.
    BadBlockLen {
        /// The descriptor's `blk_len`.
        blk_len: u32,
        /// The block's size.
        block: usize,
    },
    /// `offset_to_first_pkt` points into the descriptor or past `blk_len`.
    BadFirstOffset(u32),
    /// A frame header does not fit before `blk_len`.
    FrameHeaderOutOfBlock {
        /// Where the frame header starts in the block.
        offset: usize,
    },
    /// `tp_mac` points into the frame header.
    BadMacOffset {
        /// Where the frame header starts in the block.
        offset: usize,
        /// Its `tp_mac`.
        mac: u16,
    },
    /// The frame's data runs past its slot or the block.
    FrameDataOutOfBlock {
        /// Where the frame header starts in the block.
        offset: usize,
        /// Its `tp_mac`.
        mac: u16,
        /// Its `tp_snaplen`.
        snaplen: u32,
    },
    /// `tp_next_offset` of a frame that is not the last one is too small or runs out.
    BadNextOffset {
        /// Where the frame header starts in the block.
        offset: usize,
        /// Its `tp_next_offset`.
        next: u32,
    },
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RingError::BlockTooShort(n) => write!(f, "ring block of {n} bytes is too short"),
            RingError::BadBlockLen { blk_len, block } => {
                write!(f, "blk_len {blk_len} out of range for a {block}-byte block")
            }
            RingError::BadFirstOffset(o) => write!(f, "offset_to_first_pkt {o} out of range"),
            RingError::FrameHeaderOutOfBlock { offset } => {
                write!(f, "frame header at {offset} runs past blk_len")
            }
            RingError::BadMacOffset { offset, mac } => {
                write!(f, "frame at {offset}: tp_mac {mac} inside the header")
            }
            RingError::FrameDataOutOfBlock {
                offset,
                mac,
                snaplen,
            } => write!(
                f,
                "frame at {offset}: data (mac {mac}, snaplen {snaplen}) runs past its slot"
            ),
            RingError::BadNextOffset { offset, next } => {
                write!(f, "frame at {offset}: tp_next_offset {next} out of range")
            }
        }
    }
}

impl std::error::Error for RingError {}

fn rd32(b: &[u8], off: usize) -> u32 {
    // Callers have checked `off + 4 <= b.len()`; `get` keeps this panic-free regardless.
    b.get(off..off + 4)
        .map_or(0, |s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

fn rd16(b: &[u8], off: usize) -> u16 {
    b.get(off..off + 2)
        .map_or(0, |s| u16::from_ne_bytes([s[0], s[1]]))
}

fn rd64(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8).map_or(0, |s| {
        let mut w = [0u8; 8];
        w.copy_from_slice(s);
        u64::from_ne_bytes(w)
    })
}

/// A validated view of a block the caller owns.
#[derive(Clone, Copy, Debug)]
pub struct Block<'a> {
    /// The block bytes up to `blk_len` (everything the kernel says it used).
    bytes: &'a [u8],
    num_pkts: u32,
    first: usize,
    seq: u64,
    status: u32,
}

/// Where to resume walking a block (after a batch ended in the middle of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Cursor {
    /// Frames of the block already consumed.
    pub index: u32,
    /// Offset of the next frame header (0: not started yet, use `offset_to_first_pkt`).
    pub offset: usize,
}

impl<'a> Block<'a> {
    /// Validate the descriptor of `block` (the whole `block_size` bytes of one ring block).
    pub fn parse(block: &'a [u8]) -> Result<Self, RingError> {
        if block.len() < BLOCK_DESC_LEN {
            return Err(RingError::BlockTooShort(block.len()));
        }
        let blk_len = rd32(block, BLK_LEN);
        let used = blk_len as usize;
        if used < BLOCK_DESC_LEN || used > block.len() {
            return Err(RingError::BadBlockLen {
                blk_len,
                block: block.len(),
            });
        }
        let num_pkts = rd32(block, NUM_PKTS);
        let first = rd32(block, OFFSET_TO_FIRST);
        let first_us = first as usize;
        if num_pkts > 0 && (first_us < BLOCK_DESC_LEN || first_us > used) {
            return Err(RingError::BadFirstOffset(first));
        }
        Ok(Block {
            bytes: &block[..used],
            num_pkts,
            first: first_us,
            seq: rd64(block, SEQ_NUM),
            status: rd32(block, BLOCK_STATUS_OFFSET),
        })
    }

    /// Frames the kernel says the block holds.
    pub fn num_pkts(&self) -> u32 {
        self.num_pkts
    }

    /// The block's sequence number (increments by one per block the kernel fills).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// `block_status` as read with the block (`USER`, maybe `LOSING`, `BLK_TMO`).
    pub fn status(&self) -> u32 {
        self.status
    }

    /// Iterate over all frames.
    pub fn frames(&self) -> Frames<'a> {
        self.frames_from(Cursor::default())
    }

    /// Iterate over the frames from `cursor` on (as returned by [`Frames::cursor`]).
    pub fn frames_from(&self, cursor: Cursor) -> Frames<'a> {
        Frames {
            bytes: self.bytes,
            remaining: self.num_pkts.saturating_sub(cursor.index),
            index: cursor.index,
            offset: if cursor.index == 0 {
                self.first
            } else {
                cursor.offset
            },
        }
    }
}

/// One received frame, borrowed from the block.
#[derive(Clone, Copy, Debug)]
pub struct Frame<'a> {
    /// The captured bytes (`tp_snaplen` of them), starting with the Ethernet header.
    pub data: &'a [u8],
    /// The length of the frame on the wire (`tp_len`); more than `data.len()` if truncated.
    pub wire_len: u32,
    /// `tp_status` (`VLAN_VALID`, `CSUMNOTREADY`, …).
    pub status: u32,
    /// The 802.1Q tag the NIC/driver stripped, if any: (TCI, TPID).
    pub vlan: Option<(u16, u16)>,
    /// The bytes of the slot between the frame header and the frame (where a
    /// `PACKET_VNET_HDR` socket gets its `virtio_net_hdr`, right before the frame).
    pub before_mac: &'a [u8],
    /// Receive time, seconds (`tp_sec`).
    pub sec: u32,
    /// Receive time, nanoseconds (`tp_nsec`).
    pub nsec: u32,
}

impl Frame<'_> {
    /// The ring slot was too small for the whole frame.
    pub fn truncated(&self) -> bool {
        (self.wire_len as usize) > self.data.len()
    }
}

/// Iterator over the frames of a [`Block`]. Yields `Err` once on the first inconsistency and
/// then ends (the rest of the block cannot be located).
#[derive(Clone, Debug)]
pub struct Frames<'a> {
    bytes: &'a [u8],
    remaining: u32,
    index: u32,
    offset: usize,
}

impl<'a> Frames<'a> {
    /// Where the next frame is, to resume later with [`Block::frames_from`].
    pub fn cursor(&self) -> Cursor {
        Cursor {
            index: self.index,
            offset: self.offset,
        }
    }

    /// No more frames in the block.
    pub fn is_done(&self) -> bool {
        self.remaining == 0
    }

    fn fail(&mut self, e: RingError) -> Option<Result<Frame<'a>, RingError>> {
        self.remaining = 0;
        Some(Err(e))
    }
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<Frame<'a>, RingError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        let off = self.offset;
        let end = self.bytes.len();
        let hdr_end = match off.checked_add(FRAME_HDR_LEN) {
            Some(e) if e <= end && off >= BLOCK_DESC_LEN => e,
            _ => return self.fail(RingError::FrameHeaderOutOfBlock { offset: off }),
        };
        let h = &self.bytes[off..hdr_end];
        let next = rd32(h, F_NEXT);
        let snaplen = rd32(h, F_SNAPLEN);
        let mac = rd16(h, F_MAC);
        let last = self.remaining == 1;
        // The end of this frame's slot: the next header, or blk_len for the last frame.
        let slot_end = if last {
            end
        } else {
            match off.checked_add(next as usize) {
                Some(e) if next as usize >= FRAME_HDR_LEN && e <= end => e,
                _ => return self.fail(RingError::BadNextOffset { offset: off, next }),
            }
        };
        if usize::from(mac) < FRAME_HDR_LEN {
            return self.fail(RingError::BadMacOffset { offset: off, mac });
        }
        let data_start = off + usize::from(mac);
        let data_end = match data_start.checked_add(snaplen as usize) {
            Some(e) if e <= slot_end => e,
            _ => {
                return self.fail(RingError::FrameDataOutOfBlock {
                    offset: off,
                    mac,
                    snaplen,
                })
            }
        };
        let status = rd32(h, F_STATUS);
        let vlan = (status & status::VLAN_VALID != 0).then(|| {
            let tpid = if status & status::VLAN_TPID_VALID != 0 {
                rd16(h, F_VLAN_TPID)
            } else {
                0x8100
            };
            (rd32(h, F_VLAN_TCI) as u16, tpid)
        });
        let frame = Frame {
            data: &self.bytes[data_start..data_end],
            before_mac: &self.bytes[off + FRAME_HDR_LEN..data_start],
            wire_len: rd32(h, F_LEN),
            status,
            vlan,
            sec: rd32(h, F_SEC),
            nsec: rd32(h, F_NSEC),
        };
        self.remaining -= 1;
        self.index += 1;
        self.offset = slot_end;
        Some(Ok(frame))
    }
}

/// Lays out a block the way the kernel does, for tests (here and in the device's tests) and
/// the receive-path fuzz target (`fuzz/harness/backend_rx.rs`).
#[doc(hidden)]
pub mod build {
    use super::*;

    /// `TPACKET_ALIGN(TPACKET3_HDRLEN + 16) - ETH_HLEN`: where the kernel puts the MAC header
    /// of a SOCK_RAW frame in a V3 slot (netoff 96, macoff 82).
    pub const MAC_OFF: u16 = 82;

    fn wr32(b: &mut [u8], off: usize, v: u32) {
        b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
    }
    fn wr16(b: &mut [u8], off: usize, v: u16) {
        b[off..off + 2].copy_from_slice(&v.to_ne_bytes());
    }

    /// Write `frames` into a `block_size`-byte block like `tpacket_rcv` does (8-byte aligned
    /// slots, the last frame's `tp_next_offset` zero). `vlan`: a stripped tag per frame.
    pub fn block(block_size: usize, frames: &[(&[u8], Option<u16>)]) -> Vec<u8> {
        let mut b = vec![0u8; block_size];
        let mut off = BLOCK_DESC_LEN;
        wr32(&mut b, 0, 3);
        wr32(&mut b, OFFSET_TO_FIRST, off as u32);
        for (i, (data, vlan)) in frames.iter().enumerate() {
            let len = usize::from(MAC_OFF) + data.len();
            let slot = (len + 7) & !7;
            wr32(&mut b, off + F_SNAPLEN, data.len() as u32);
            wr32(&mut b, off + F_LEN, data.len() as u32);
            let mut st = status::USER;
            if let Some(tci) = vlan {
                st |= status::VLAN_VALID | status::VLAN_TPID_VALID;
                wr32(&mut b, off + F_VLAN_TCI, u32::from(*tci));
                wr16(&mut b, off + F_VLAN_TPID, 0x8100);
            }
            wr32(&mut b, off + F_STATUS, st);
            wr16(&mut b, off + F_MAC, MAC_OFF);
            wr16(&mut b, off + 26, MAC_OFF + 14);
            let next = if i + 1 == frames.len() {
                0
            } else {
                slot as u32
            };
            wr32(&mut b, off + F_NEXT, next);
            let d = off + usize::from(MAC_OFF);
            b[d..d + data.len()].copy_from_slice(data);
            off += slot;
        }
        wr32(&mut b, NUM_PKTS, frames.len() as u32);
        wr32(&mut b, BLK_LEN, off as u32);
        b[SEQ_NUM..SEQ_NUM + 8].copy_from_slice(&7u64.to_ne_bytes());
        wr32(&mut b, BLOCK_STATUS_OFFSET, status::USER);
        b
    }

    /// Offsets of the frame headers in a block made by [`block`].
    pub fn frame_offsets(b: &[u8]) -> Vec<usize> {
        let n = rd32(b, NUM_PKTS) as usize;
        let mut off = rd32(b, OFFSET_TO_FIRST) as usize;
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(off);
            off += rd32(b, off + F_NEXT) as usize;
        }
        v
    }

    pub fn set32(b: &mut [u8], off: usize, v: u32) {
        wr32(b, off, v);
    }
    pub fn set16(b: &mut [u8], off: usize, v: u16) {
        wr16(b, off, v);
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;

    fn collect(b: &[u8]) -> Result<Vec<Vec<u8>>, RingError> {
        Block::parse(b)?
            .frames()
            .map(|f| f.map(|f| f.data.to_vec()))
            .collect()
    }

    fn frames_of(n: usize, seed: u8) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                (0..60 + i * 37)
                    .map(|j| (j as u8) ^ seed ^ i as u8)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn walks_a_kernel_shaped_block() {
        let frames = frames_of(5, 1);
        let refs: Vec<(&[u8], Option<u16>)> = frames
            .iter()
            .enumerate()
            .map(|(i, f)| (f.as_slice(), (i == 2).then_some(0x2005)))
            .collect();
        let b = block(4096, &refs);
        let blk = Block::parse(&b).unwrap();
        assert_eq!(blk.num_pkts(), 5);
        assert_eq!(blk.seq(), 7);
        assert_eq!(blk.status() & status::USER, status::USER);
        let got: Vec<Frame<'_>> = blk.frames().map(Result::unwrap).collect();
        assert_eq!(got.len(), 5);
        for (i, f) in got.iter().enumerate() {
            assert_eq!(f.data, frames[i].as_slice());
            assert!(!f.truncated());
            assert_eq!(f.vlan, (i == 2).then_some((0x2005, 0x8100)));
        }
    }

    #[test]
    fn empty_block_and_resume_from_cursor() {
        let b = block(4096, &[]);
        assert_eq!(collect(&b).unwrap(), Vec::<Vec<u8>>::new());
        let frames = frames_of(6, 9);
        let refs: Vec<(&[u8], Option<u16>)> = frames.iter().map(|f| (f.as_slice(), None)).collect();
        let b = block(8192, &refs);
        let blk = Block::parse(&b).unwrap();
        // Take two, stop, resume twice: same frames as one walk.
        let mut out = Vec::new();
        let mut cur = Cursor::default();
        for take in [2usize, 1, 10] {
            let mut it = blk.frames_from(cur);
            for f in it.by_ref().take(take) {
                out.push(f.unwrap().data.to_vec());
            }
            cur = it.cursor();
        }
        assert_eq!(out, frames);
        assert!(blk.frames_from(cur).is_done());
    }

    #[test]
    fn truncated_frames_are_reported() {
        let f = frames_of(1, 3);
        let mut b = block(4096, &[(f[0].as_slice(), None)]);
        let off = frame_offsets(&b)[0];
        set32(&mut b, off + F_LEN, 9000);
        let blk = Block::parse(&b).unwrap();
        let fr = blk.frames().next().unwrap().unwrap();
        assert!(fr.truncated());
        assert_eq!(fr.data, f[0].as_slice());
    }

    #[test]
    fn hostile_descriptors_are_rejected() {
        let frames = frames_of(3, 5);
        let refs: Vec<(&[u8], Option<u16>)> = frames.iter().map(|f| (f.as_slice(), None)).collect();
        let good = block(2048, &refs);
        let offs = frame_offsets(&good);
        assert!(collect(&good).is_ok());

        assert_eq!(
            Block::parse(&good[..47]).unwrap_err(),
            RingError::BlockTooShort(47)
        );
        let mut b = good.clone();
        set32(&mut b, BLK_LEN, 4096);
        assert!(matches!(
            Block::parse(&b),
            Err(RingError::BadBlockLen { .. })
        ));
        set32(&mut b, BLK_LEN, 10);
        assert!(matches!(
            Block::parse(&b),
            Err(RingError::BadBlockLen { .. })
        ));
        let mut b = good.clone();
        set32(&mut b, OFFSET_TO_FIRST, 8);
        assert_eq!(Block::parse(&b).unwrap_err(), RingError::BadFirstOffset(8));
        set32(&mut b, OFFSET_TO_FIRST, u32::MAX);
        assert!(Block::parse(&b).is_err());

        // A huge num_pkts: the real last frame (next_offset 0) now claims a successor, which
        // is inconsistent; the walk ends there with an error.
        let mut b = good.clone();
        set32(&mut b, NUM_PKTS, u32::MAX);
        let r: Vec<_> = Block::parse(&b).unwrap().frames().collect();
        assert_eq!(r.len(), 3);
        assert!(r[..2].iter().all(Result::is_ok));
        assert!(matches!(r[2], Err(RingError::BadNextOffset { .. })));

        // The last frame's next_offset is ignored; a middle one of 0 or past the end is not.
        for bad_next in [0u32, 8, 47, 100_000, u32::MAX] {
            let mut b = good.clone();
            set32(&mut b, offs[1] + F_NEXT, bad_next);
            let r: Vec<_> = Block::parse(&b).unwrap().frames().collect();
            assert!(r[0].is_ok());
            assert!(
                matches!(r[1], Err(RingError::BadNextOffset { .. })),
                "{bad_next}"
            );
            assert_eq!(r.len(), 2);
        }

        // tp_mac inside the header, or data overlapping the next header / past blk_len.
        let mut b = good.clone();
        set16(&mut b, offs[0] + F_MAC, 20);
        assert!(matches!(collect(&b), Err(RingError::BadMacOffset { .. })));
        let mut b = good.clone();
        set32(&mut b, offs[0] + F_SNAPLEN, frames[0].len() as u32 + 64);
        assert!(matches!(
            collect(&b),
            Err(RingError::FrameDataOutOfBlock { .. })
        ));
        let mut b = good.clone();
        set16(&mut b, offs[2] + F_MAC, u16::MAX);
        assert!(matches!(
            collect(&b),
            Err(RingError::FrameDataOutOfBlock { .. })
        ));
        let mut b = good.clone();
        set32(&mut b, offs[2] + F_SNAPLEN, u32::MAX);
        assert!(matches!(
            collect(&b),
            Err(RingError::FrameDataOutOfBlock { .. })
        ));

        // A resume cursor pointing anywhere is checked like a next offset.
        let blk = Block::parse(&good).unwrap();
        for offset in [0usize, 47, good.len() - 10, usize::MAX - 3] {
            let mut it = blk.frames_from(Cursor { index: 1, offset });
            assert!(it.next().unwrap().is_err());
            assert!(it.next().is_none());
        }
    }

    /// Random garbage in every header field never panics, and every frame handed out lies
    /// inside the block (it is a sub-slice, so that is checked by construction; the test
    /// checks the walk terminates and respects `num_pkts`).
    #[test]
    fn random_descriptors_never_escape() {
        let frames = frames_of(4, 7);
        let refs: Vec<(&[u8], Option<u16>)> =
            frames.iter().map(|f| (f.as_slice(), Some(1))).collect();
        let good = block(1024, &refs);
        let offs = frame_offsets(&good);
        let mut fields: Vec<(usize, usize)> =
            vec![(NUM_PKTS, 4), (OFFSET_TO_FIRST, 4), (BLK_LEN, 4)];
        for &o in &offs {
            for (f, w) in [
                (F_NEXT, 4),
                (F_SNAPLEN, 4),
                (F_LEN, 4),
                (F_MAC, 2),
                (F_STATUS, 4),
            ] {
                fields.push((o + f, w));
            }
        }
        let mut s = 0x1234_5678_9abc_def0u64;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let iters = if cfg!(miri) { 150 } else { 20_000 };
        for _ in 0..iters {
            let mut b = good.clone();
            for _ in 0..1 + rnd() % 3 {
                let (off, w) = fields[(rnd() % fields.len() as u64) as usize];
                let v = match rnd() % 4 {
                    0 => 0,
                    1 => u32::MAX,
                    2 => (rnd() % 2048) as u32,
                    _ => rnd() as u32,
                };
                if w == 4 {
                    set32(&mut b, off, v);
                } else {
                    set16(&mut b, off, v as u16);
                }
            }
            let len = if rnd() % 5 == 0 {
                (rnd() % 1024) as usize
            } else {
                b.len()
            };
            if let Ok(blk) = Block::parse(&b[..len]) {
                let n = blk.frames().take(1000).count();
                assert!(n as u64 <= u64::from(blk.num_pkts()));
                assert!(n <= len / FRAME_HDR_LEN + 1);
            }
        }
    }
}
