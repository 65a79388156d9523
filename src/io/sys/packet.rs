//! AF_PACKET sockets and their PACKET_MMAP rings (`packet(7)`,
//! `Documentation/networking/packet_mmap.rst`).
//!
//! The unsafe parts are the socket calls and the shared mapping. The ring protocol is encoded
//! in the types so that the safe API cannot misuse it:
//!
//! - [`RxRing::user_block`] hands out a block's bytes only after an acquire load of its
//!   `block_status` saw `TP_STATUS_USER` (the kernel writes the block, then sets the status
//!   with a write barrier; it never touches a user-owned block). The slice borrows the ring
//!   mutably, and [`RxRing::release`] (a release store of `TP_STATUS_KERNEL`) needs the ring
//!   mutably too, so no slice of a block can outlive its hand-back.
//! - [`TxRing::fill`] lends a slot's data area only after an acquire load saw
//!   `TP_STATUS_AVAILABLE`, writes the header, then publishes it with a release store of
//!   `TP_STATUS_SEND_REQUEST`.
//! - Every offset into the mapping is computed from the ring geometry the kernel accepted and
//!   checked against the mapping's length; what the kernel writes inside a block is parsed by
//!   the safe `io::af_packet::ring` module, which trusts none of it.

use super::cvt;
use super::event::poll_readable;
use super::sockutil::{set_int, setsockopt, Mmsg, MsgBufs};
use crate::io::af_packet::ring::BLOCK_STATUS_OFFSET;
use crate::io::cbpf::Insn;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

// linux/if_packet.h (ABI-stable values).
const SOL_PACKET: libc::c_int = 263;
const PACKET_RX_RING: libc::c_int = 5;
const PACKET_AUXDATA: libc::c_int = 8;
const PACKET_STATISTICS: libc::c_int = 6;
const PACKET_VERSION: libc::c_int = 10;
const PACKET_TX_RING: libc::c_int = 13;
const PACKET_LOSS: libc::c_int = 14;
const PACKET_QDISC_BYPASS: libc::c_int = 20;
const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const TPACKET_V3: libc::c_int = 2;
const ETH_P_ALL: u16 = 0x0003;

const TP_STATUS_KERNEL: u32 = 0;
const TP_STATUS_USER: u32 = 1;
const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;
/// TX slot states.
pub const TP_STATUS_AVAILABLE: u32 = 0;
pub const TP_STATUS_SEND_REQUEST: u32 = 1;
pub const TP_STATUS_SENDING: u32 = 2;
pub const TP_STATUS_WRONG_FORMAT: u32 = 4;

/// Where frame data starts in a V3 TX slot: `TPACKET3_HDRLEN - sizeof(struct sockaddr_ll)`
/// (`TPACKET_ALIGN(48) + 20 - 20`), what the kernel uses when `PACKET_TX_HAS_OFF` is off.
pub const TX_DATA_OFFSET: usize = 48;

/// Most frames one [`PacketSocket::send_frames`] call sends.
pub const MAX_SEND_BATCH: usize = 64;

/// `sizeof(struct virtio_net_hdr)`: what precedes every frame, both ways, on a socket with
/// `PACKET_VNET_HDR` ([`PacketSocket::set_vnet_hdr`]).
pub const VNET_HDR_LEN: usize = 10;

/// A `struct virtio_net_hdr` (`linux/virtio_net.h`; host byte order for packet sockets on
/// the little-endian hosts this runs on, `vio_le()`): the kernel's segmentation offload
/// state of a received frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnetHdr {
    /// `VIRTIO_NET_HDR_F_*` (1: the checksum at `csum_start + csum_offset` is partial).
    pub flags: u8,
    /// `VIRTIO_NET_HDR_GSO_*`: 0 none, 1 TCPv4, 3 UDP (fragmentation), 4 TCPv6, 5 UDP_L4
    /// (UDP segmentation: the frame is a super-datagram of `gso_size` segments); bit 0x80 ECN.
    pub gso_type: u8,
    /// Bytes of headers (Ethernet, IP, UDP) before the segmented payload.
    pub hdr_len: u16,
    /// Payload bytes per segment (the last may be shorter).
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    /// `VIRTIO_NET_HDR_GSO_UDP_L4`.
    pub const GSO_UDP_L4: u8 = 5;

    /// Parse the first [`VNET_HDR_LEN`] bytes of `b` (`None`: too short).
    pub fn parse(b: &[u8]) -> Option<VnetHdr> {
        let b = b.get(..VNET_HDR_LEN)?;
        let u = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        })
    }
}

/// The header that goes in front of every frame sent on a `PACKET_VNET_HDR` socket: no
/// offload asked for.
static VNET_NONE: [u8; VNET_HDR_LEN] = [0; VNET_HDR_LEN];

/// Ring geometry (`struct tpacket_req3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingReq {
    pub block_size: u32,
    pub block_nr: u32,
    pub frame_size: u32,
    pub frame_nr: u32,
    /// RX only: retire a partly filled block after this many milliseconds.
    pub retire_blk_tov: u32,
}

impl RingReq {
    fn bytes(&self) -> Option<usize> {
        (self.block_size as usize).checked_mul(self.block_nr as usize)
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
struct TpacketReq3 {
    tp_block_size: u32,
    tp_block_nr: u32,
    tp_frame_size: u32,
    tp_frame_nr: u32,
    tp_retire_blk_tov: u32,
    tp_sizeof_priv: u32,
    tp_feature_req_word: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct TpacketStatsV3 {
    tp_packets: u32,
    tp_drops: u32,
    tp_freeze_q_cnt: u32,
}

/// `struct tpacket_auxdata` (the `PACKET_AUXDATA` control message).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct TpacketAuxdata {
    tp_status: u32,
    tp_len: u32,
    tp_snaplen: u32,
    tp_mac: u16,
    tp_net: u16,
    tp_vlan_tci: u16,
    tp_vlan_tpid: u16,
}

/// Most frames one [`PacketSocket::recv_frames`] call receives.
pub const MAX_RECV_BATCH: usize = 64;

/// What [`PacketSocket::recv_frames`] says about one received frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvMeta {
    /// Bytes written to the buffer.
    pub len: usize,
    /// The frame was longer than the buffer (the rest was discarded).
    pub truncated: bool,
    /// A VLAN tag the kernel took out of the frame into its metadata: (TCI, TPID).
    pub vlan: Option<(u16, u16)>,
    /// On a `PACKET_VNET_HDR` socket: the header the kernel put in front of the frame.
    pub vnet: Option<VnetHdr>,
}

/// `struct ifreq` with the union used as an `int` (ifindex, MTU).
#[repr(C)]
#[derive(Clone, Copy)]
struct IfReqInt {
    name: [u8; libc::IFNAMSIZ],
    val: libc::c_int,
    _pad: [u8; 20],
}

/// Kernel counters of a packet socket since the last read (`PACKET_STATISTICS` resets them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketStats {
    pub packets: u32,
    pub drops: u32,
    pub freeze_q_cnt: u32,
}

/// An `AF_PACKET`, `SOCK_RAW` socket.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    /// `PACKET_VNET_HDR` is on: a `virtio_net_hdr` precedes every frame both ways.
    vnet: bool,
}

impl AsFd for PacketSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl PacketSocket {
    /// A non-blocking packet socket with protocol 0: it receives nothing until [`Self::bind`]
    /// gives it a protocol, so the filter and rings can be set up first without a window in
    /// which unfiltered frames reach it. Needs `CAP_NET_RAW`.
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain socket(2); the descriptor is owned from here on.
        let fd = cvt(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        })?;
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(PacketSocket {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            vnet: false,
        })
    }

    fn ifreq_int(&self, name: &str, req: libc::c_ulong) -> io::Result<i32> {
        let b = name.as_bytes();
        if b.is_empty() || b.len() >= libc::IFNAMSIZ || b.contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad interface name {name:?}"),
            ));
        }
        let mut ifr = IfReqInt {
            name: [0; libc::IFNAMSIZ],
            val: 0,
            _pad: [0; 20],
        };
        ifr.name[..b.len()].copy_from_slice(b);
        // SAFETY: SIOCGIFINDEX/SIOCGIFMTU read the name and write the int of a 40-byte ifreq.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), req as _, &mut ifr) };
        cvt(r).map_err(|e| io::Error::new(e.kind(), format!("interface {name}: {e}")))?;
        Ok(ifr.val)
    }

    /// The index of interface `name` in the socket's network namespace.
    pub fn ifindex(&self, name: &str) -> io::Result<i32> {
        self.ifreq_int(name, libc::SIOCGIFINDEX as libc::c_ulong)
    }

    /// The MTU of interface `name`.
    pub fn mtu(&self, name: &str) -> io::Result<u32> {
        self.ifreq_int(name, libc::SIOCGIFMTU as libc::c_ulong)
            .map(|m| m.max(0) as u32)
    }

    /// Use TPACKET_V3 rings (both directions; must precede the ring setup).
    pub fn set_tpacket_v3(&self) -> io::Result<()> {
        set_int(self.as_fd(), SOL_PACKET, PACKET_VERSION, TPACKET_V3)
    }

    /// Turn on `PACKET_VNET_HDR` (before the rings are set up): the kernel then hands over
    /// frames it has not segmented yet (a UDP GSO super-datagram from a sender on this host
    /// crosses veth whole) with a [`VnetHdr`] saying how, and every frame sent must be
    /// preceded by one (this socket's send paths add an empty one).
    pub fn set_vnet_hdr(&mut self) -> io::Result<()> {
        set_int(self.as_fd(), SOL_PACKET, PACKET_VNET_HDR, 1)?;
        self.vnet = true;
        Ok(())
    }

    /// Do not deliver frames this host sends to this socket (Linux 4.20+).
    pub fn set_ignore_outgoing(&self) -> io::Result<()> {
        set_int(self.as_fd(), SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    }

    /// Transmit straight to the driver, bypassing the qdisc layer (Linux 3.14+).
    pub fn set_qdisc_bypass(&self) -> io::Result<()> {
        set_int(self.as_fd(), SOL_PACKET, PACKET_QDISC_BYPASS, 1)
    }

    /// Skip malformed TX ring slots instead of stopping the ring on them.
    pub fn set_tx_loss(&self) -> io::Result<()> {
        set_int(self.as_fd(), SOL_PACKET, PACKET_LOSS, 1)
    }

    /// Attach a classic BPF program (`SO_ATTACH_FILTER`).
    pub fn attach_filter(&self, prog: &[Insn]) -> io::Result<()> {
        super::sockutil::attach_filter(self.as_fd(), prog)
    }

    fn set_ring(&self, opt: libc::c_int, r: &RingReq) -> io::Result<()> {
        let req = TpacketReq3 {
            tp_block_size: r.block_size,
            tp_block_nr: r.block_nr,
            tp_frame_size: r.frame_size,
            tp_frame_nr: r.frame_nr,
            tp_retire_blk_tov: r.retire_blk_tov,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        setsockopt(self.as_fd(), SOL_PACKET, opt, &req)
    }

    /// Bind to interface `ifindex` for all protocols; frames start arriving (through the
    /// filter, into the ring) from here on.
    pub fn bind(&self, ifindex: i32) -> io::Result<()> {
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_protocol = ETH_P_ALL.to_be();
        sa.sll_ifindex = ifindex;
        // SAFETY: `sa` is a valid sockaddr_ll of the length given.
        let r = unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        cvt(r).map(drop)
    }

    /// Create the rings (`PACKET_RX_RING`, and `PACKET_TX_RING` if `tx` is given) and map
    /// them (one mapping: RX ring first, then TX ring, as the kernel lays them out).
    pub fn map_rings(
        &self,
        rx: RingReq,
        tx: Option<RingReq>,
    ) -> io::Result<(RxRing, Option<TxRing>)> {
        let bad = || io::Error::new(io::ErrorKind::InvalidInput, "ring geometry overflows");
        self.set_ring(PACKET_RX_RING, &rx)?;
        if let Some(t) = &tx {
            self.set_ring(PACKET_TX_RING, t)?;
        }
        let rx_len = rx.bytes().ok_or_else(bad)?;
        let tx_len = match &tx {
            Some(t) => t.bytes().ok_or_else(bad)?,
            None => 0,
        };
        let len = rx_len.checked_add(tx_len).ok_or_else(bad)?;
        // SAFETY: mapping the socket's own rings, whose total size the kernel just accepted.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                self.fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = Arc::new(Mapping {
            ptr: NonNull::new(p.cast()).ok_or_else(bad)?,
            len,
            heap: false,
        });
        let rx_ring = RxRing {
            map: Arc::clone(&map),
            block_size: rx.block_size as usize,
            block_nr: rx.block_nr as usize,
        };
        let tx_ring = match tx {
            Some(t) => {
                let fpb = (t.block_size / t.frame_size.max(1)) as usize;
                if fpb == 0 || t.frame_size as usize <= TX_DATA_OFFSET {
                    return Err(bad());
                }
                let prefix = if self.vnet { VNET_HDR_LEN } else { 0 };
                if t.frame_size as usize <= TX_DATA_OFFSET + prefix {
                    return Err(bad());
                }
                Some(TxRing {
                    map,
                    base: rx_len,
                    block_size: t.block_size as usize,
                    frame_size: t.frame_size as usize,
                    frames_per_block: fpb,
                    frame_nr: (t.frame_nr as usize).min(fpb * t.block_nr as usize),
                    prefix,
                })
            }
            None => None,
        };
        Ok((rx_ring, tx_ring))
    }

    /// Ask the kernel to transmit every TX ring slot marked `SEND_REQUEST` (without waiting).
    pub fn kick_tx(&self) -> io::Result<()> {
        // SAFETY: send(2) of zero bytes from a null buffer is the documented TX-ring doorbell.
        let r = unsafe { libc::send(self.fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Send whole frames with one `sendmmsg(2)` (at most [`MAX_SEND_BATCH`] per call). Returns how many the
    /// kernel took; an error only if it took none.
    pub fn send_frames(&self, frames: &[&[u8]]) -> io::Result<usize> {
        const MAX: usize = MAX_SEND_BATCH;
        let n = frames.len().min(MAX);
        if n == 0 {
            return Ok(0);
        }
        // Two iovecs a message with PACKET_VNET_HDR: the empty header, then the frame.
        let mut m = Mmsg::<{ 2 * MAX }>::new();
        for (i, f) in frames[..n].iter().enumerate() {
            let b = MsgBufs::data(f.as_ptr() as *mut libc::c_void, f.len());
            if self.vnet {
                m.set_iov(2 * i, VNET_NONE.as_ptr() as *mut libc::c_void, VNET_HDR_LEN);
                m.set_iov(2 * i + 1, b.data, b.data_len);
                m.set_gather(i, 2 * i..2 * i + 2, b);
            } else {
                m.set(i, b);
            }
        }
        // SAFETY: the messages point at the caller's frames, which outlive the call, and at
        // the static empty header; the kernel only reads them (no names, no control data).
        unsafe { m.send(self.as_fd(), n) }
    }

    /// Ask for `PACKET_AUXDATA` with every received frame (VLAN tags the kernel stripped,
    /// the original length); needed by [`Self::recv_frames`].
    pub fn set_auxdata(&self) -> io::Result<()> {
        set_int(self.as_fd(), SOL_PACKET, PACKET_AUXDATA, 1)
    }

    /// Ask for a receive buffer of `bytes` (`SO_RCVBUFFORCE` if allowed, else `SO_RCVBUF`,
    /// which the kernel caps at `net.core.rmem_max`).
    pub fn set_rcvbuf(&self, bytes: usize) -> io::Result<()> {
        let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        set_int(self.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, v)
            .or_else(|_| set_int(self.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, v))
    }

    /// Receive up to `bufs.len()` (at most [`MAX_RECV_BATCH`]) frames without waiting, one
    /// per buffer, with one `recvmmsg(2)`; `meta[i]` describes the frame in `bufs[i]`. For a
    /// socket without a receive ring: each frame is available as soon as the kernel queues
    /// it (no block to fill or retire). Returns how many were received (0 when none was
    /// waiting).
    pub fn recv_frames(&self, bufs: &mut [Box<[u8]>], meta: &mut [RecvMeta]) -> io::Result<usize> {
        const MAX: usize = MAX_RECV_BATCH;
        // CMSG_SPACE(sizeof(struct tpacket_auxdata)) with room to spare, 8-byte aligned.
        const CTL: usize = 64;
        let n = bufs.len().min(meta.len()).min(MAX);
        if n == 0 {
            return Ok(0);
        }
        let mut ctl = [[0u64; CTL / 8]; MAX];
        let mut vnet = [[0u8; VNET_HDR_LEN]; MAX];
        let mut m = Mmsg::<{ 2 * MAX }>::new();
        for (i, ((b, c), v)) in bufs[..n]
            .iter_mut()
            .zip(ctl.iter_mut())
            .zip(vnet.iter_mut())
            .enumerate()
        {
            let mut mb = MsgBufs::data(b.as_mut_ptr().cast(), b.len());
            mb.control = c.as_mut_ptr().cast();
            mb.control_len = CTL;
            if self.vnet {
                // The kernel's virtio_net_hdr first, then the frame into the buffer.
                m.set_iov(2 * i, v.as_mut_ptr().cast(), VNET_HDR_LEN);
                m.set_iov(2 * i + 1, mb.data, mb.data_len);
                m.set_gather(i, 2 * i..2 * i + 2, mb);
            } else {
                m.set(i, mb);
            }
        }
        // SAFETY: the messages point at the caller's buffers (borrowed mutably for the call,
        // writable for their lengths), at `vnet[..n]` and at `ctl[..n]` (CTL bytes each); all
        // outlive it.
        let got = unsafe { m.recv(self.as_fd(), n)? };
        let pre = if self.vnet { VNET_HDR_LEN } else { 0 };
        for i in 0..got {
            let h = &m.header(i).msg_hdr;
            let len = (m.header(i).msg_len as usize)
                .saturating_sub(pre)
                .min(bufs[i].len());
            let mut m = RecvMeta {
                len,
                truncated: h.msg_flags & libc::MSG_TRUNC != 0,
                vlan: None,
                vnet: if self.vnet {
                    VnetHdr::parse(&vnet[i])
                } else {
                    None
                },
            };
            // SAFETY: `h` is the header the kernel just filled; its control pointer and
            // length describe `ctl[i]`, and the CMSG macros stay within them.
            let mut c = unsafe { libc::CMSG_FIRSTHDR(h) };
            while !c.is_null() {
                // SAFETY: `c` is a control message header inside `ctl[i]` (CMSG_FIRSTHDR /
                // CMSG_NXTHDR return null otherwise).
                let (level, ty, clen) = unsafe { ((*c).cmsg_level, (*c).cmsg_type, (*c).cmsg_len) };
                let need = std::mem::size_of::<TpacketAuxdata>();
                // SAFETY: CMSG_LEN is arithmetic on a constant.
                if level == SOL_PACKET
                    && ty == PACKET_AUXDATA
                    && clen >= unsafe { libc::CMSG_LEN(need as u32) } as usize
                {
                    // SAFETY: the message holds a whole tpacket_auxdata (checked above); it
                    // may be unaligned for u32, hence read_unaligned.
                    let aux: TpacketAuxdata =
                        unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast()) };
                    if aux.tp_len as usize > len {
                        m.truncated = true;
                    }
                    if aux.tp_status & TP_STATUS_VLAN_VALID != 0 {
                        let tpid = if aux.tp_status & TP_STATUS_VLAN_TPID_VALID != 0 {
                            aux.tp_vlan_tpid
                        } else {
                            0x8100
                        };
                        m.vlan = Some((aux.tp_vlan_tci, tpid));
                    }
                }
                // SAFETY: `c` is a valid header of `h`'s control buffer.
                c = unsafe { libc::CMSG_NXTHDR(h, c) };
            }
            meta[i] = m;
        }
        Ok(got)
    }

    /// Wait until the socket is readable (for a V3 ring: a block was handed to user space).
    pub fn wait_readable(&self, timeout: Option<Duration>) -> io::Result<bool> {
        poll_readable(&[self.as_fd()], timeout)
    }

    /// Read (and reset) the kernel's counters.
    pub fn take_stats(&self) -> io::Result<PacketStats> {
        let mut st = TpacketStatsV3 {
            tp_packets: 0,
            tp_drops: 0,
            tp_freeze_q_cnt: 0,
        };
        let mut len = std::mem::size_of::<TpacketStatsV3>() as libc::socklen_t;
        // SAFETY: `st` and `len` are valid for writes of the sizes given.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                SOL_PACKET,
                PACKET_STATISTICS,
                (&mut st as *mut TpacketStatsV3).cast(),
                &mut len,
            )
        };
        cvt(r)?;
        Ok(PacketStats {
            packets: st.tp_packets,
            drops: st.tp_drops,
            freeze_q_cnt: st.tp_freeze_q_cnt,
        })
    }
}

/// The shared ring mapping. Unmapped when the last ring referring to it is dropped (the
/// mapping stays valid after the socket is closed).
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// Test builds only: the memory is a leaked `Box<[u64]>` instead of an mmap.
    heap: bool,
}

// SAFETY: the mapping is plain memory shared with the kernel; access to it goes through
// `RxRing`/`TxRing`, whose `&mut self` methods serialise user-side access per ring, and the
// two rings cover disjoint ranges.
unsafe impl Send for Mapping {}
// SAFETY: shared references only ever perform atomic loads/stores of status words.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.heap {
            // SAFETY: `on_heap` leaked exactly this `Box<[u64]>` of `len / 8` words; this is
            // the only place that reclaims it.
            unsafe {
                drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                    self.ptr.as_ptr().cast::<u64>(),
                    self.len / 8,
                )));
            }
            return;
        }
        // SAFETY: unmapping exactly what `map_rings` mapped, once.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

impl Mapping {
    /// Zeroed heap memory standing in for a ring mapping (tests, miri).
    #[cfg(test)]
    fn on_heap(len: usize) -> Arc<Mapping> {
        let words = len.div_ceil(8);
        let b: &'static mut [u64] = Box::leak(vec![0u64; words].into_boxed_slice());
        Arc::new(Mapping {
            ptr: NonNull::new(b.as_mut_ptr().cast()).expect("non-null"),
            len: words * 8,
            heap: true,
        })
    }

    /// The status word at byte `off`. Panics if it is out of range or misaligned (ring
    /// geometry bugs, never kernel-supplied data).
    fn status(&self, off: usize) -> &AtomicU32 {
        assert!(
            off % 4 == 0 && off.checked_add(4).is_some_and(|e| e <= self.len),
            "ring status word at {off} outside the {}-byte mapping",
            self.len
        );
        // SAFETY: in bounds and 4-byte aligned (the mapping is page-aligned); the kernel
        // accesses this word with READ_ONCE/WRITE_ONCE-style plain 32-bit accesses and
        // barriers, which atomic accesses from this side pair with.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() }
    }

    /// `len` bytes at `off`, checked against the mapping.
    fn range(&self, off: usize, len: usize) -> *mut u8 {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.len),
            "ring range {off}+{len} outside the {}-byte mapping",
            self.len
        );
        // SAFETY: in bounds of the mapping.
        unsafe { self.ptr.as_ptr().add(off) }
    }
}

/// The TPACKET_V3 receive ring: `block_count()` blocks of `block_size()` bytes.
#[derive(Debug)]
pub struct RxRing {
    map: Arc<Mapping>,
    block_size: usize,
    block_nr: usize,
}

impl RxRing {
    pub fn block_count(&self) -> usize {
        self.block_nr
    }

    /// Whether block `i` is currently owned by user space (without borrowing it).
    pub fn is_user(&self, i: usize) -> bool {
        i < self.block_nr
            && self
                .map
                .status(i * self.block_size + BLOCK_STATUS_OFFSET)
                .load(Ordering::Acquire)
                & TP_STATUS_USER
                != 0
    }

    /// The bytes of block `i` if the kernel has handed it to user space, else `None`. The
    /// contents are untrusted: parse them with `io::af_packet::ring::Block`.
    pub fn user_block(&mut self, i: usize) -> Option<&[u8]> {
        if !self.is_user(i) {
            return None;
        }
        let p = self.map.range(i * self.block_size, self.block_size);
        // SAFETY: in bounds (checked by `range`); the acquire load above saw TP_STATUS_USER,
        // after which the kernel does not write the block until `release`, which needs
        // `&mut self` and so ends this borrow first.
        Some(unsafe { std::slice::from_raw_parts(p, self.block_size) })
    }

    /// Hand block `i` back to the kernel.
    pub fn release(&mut self, i: usize) {
        if i < self.block_nr {
            self.map
                .status(i * self.block_size + BLOCK_STATUS_OFFSET)
                .store(TP_STATUS_KERNEL, Ordering::Release);
        }
    }
}

/// What [`TxRing::fill`] did with a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxFill {
    /// The slot is still owned by the kernel (ring full): nothing was asked of the caller.
    Busy,
    /// The caller had no frame (`fill` returned `None`).
    Empty,
    /// A frame of this length was queued (`SEND_REQUEST`).
    Queued(usize),
    /// The caller wrote a frame of an impossible length (shorter than an Ethernet header or
    /// longer than the slot); it was not queued.
    Rejected(usize),
}

/// The transmit ring (V3 slots: `tpacket3_hdr` + frame at [`TX_DATA_OFFSET`]).
#[derive(Debug)]
pub struct TxRing {
    map: Arc<Mapping>,
    base: usize,
    block_size: usize,
    frame_size: usize,
    frames_per_block: usize,
    frame_nr: usize,
    /// Bytes written in front of each frame: an empty `virtio_net_hdr` on a
    /// `PACKET_VNET_HDR` socket, else nothing.
    prefix: usize,
}

impl TxRing {
    pub fn slots(&self) -> usize {
        self.frame_nr
    }

    /// Bytes of frame a slot holds.
    pub fn capacity(&self) -> usize {
        self.frame_size - TX_DATA_OFFSET - self.prefix
    }

    fn slot_off(&self, i: usize) -> usize {
        self.base
            + (i / self.frames_per_block) * self.block_size
            + (i % self.frames_per_block) * self.frame_size
    }

    /// The status of slot `i` (`TP_STATUS_AVAILABLE`, `SEND_REQUEST`, `SENDING`, …).
    pub fn status(&self, i: usize) -> u32 {
        if i >= self.frame_nr {
            return TP_STATUS_AVAILABLE;
        }
        self.map
            .status(self.slot_off(i) + 20)
            .load(Ordering::Acquire)
    }

    /// If slot `i` is free, lend its data area to `fill` and queue what it wrote.
    pub fn fill(&mut self, i: usize, fill: impl FnOnce(&mut [u8]) -> Option<usize>) -> TxFill {
        if i >= self.frame_nr {
            return TxFill::Busy;
        }
        let off = self.slot_off(i);
        let st = self.map.status(off + 20).load(Ordering::Acquire);
        if st != TP_STATUS_AVAILABLE && st != TP_STATUS_WRONG_FORMAT {
            return TxFill::Busy;
        }
        let cap = self.capacity();
        let p = self.map.range(off, self.frame_size);
        // SAFETY: the slot is in bounds (`range`), and AVAILABLE (or WRONG_FORMAT, i.e. given
        // up on): the kernel neither reads nor writes it until we store SEND_REQUEST below.
        // The data area and the header fields written here do not include the status word,
        // which is only accessed atomically.
        let area =
            unsafe { std::slice::from_raw_parts_mut(p.add(TX_DATA_OFFSET), self.prefix + cap) };
        let (pre, data) = area.split_at_mut(self.prefix);
        let Some(len) = fill(data) else {
            return TxFill::Empty;
        };
        if !(14..=cap).contains(&len) {
            return TxFill::Rejected(len);
        }
        pre.fill(0);
        let wire = (self.prefix + len) as u32;
        // SAFETY: the first 20 bytes of the slot header (tp_next_offset, tp_sec, tp_nsec,
        // tp_snaplen, tp_len), same ownership argument as above; `data` is no longer used.
        let hdr = unsafe { std::slice::from_raw_parts_mut(p, 20) };
        hdr.fill(0); // tp_next_offset must be 0 for V3 TX
        hdr[12..16].copy_from_slice(&wire.to_ne_bytes());
        hdr[16..20].copy_from_slice(&wire.to_ne_bytes());
        self.map
            .status(off + 20)
            .store(TP_STATUS_SEND_REQUEST, Ordering::Release);
        TxFill::Queued(len)
    }

    /// Slots not yet handed back by the kernel (queued or in flight).
    pub fn in_flight(&self) -> usize {
        (0..self.frame_nr)
            .filter(|&i| {
                let s = self.status(i);
                s == TP_STATUS_SEND_REQUEST || s == TP_STATUS_SENDING
            })
            .count()
    }
}

/// Test doubles: rings on heap memory, and the kernel's side of the handshake, so the ring
/// code above (and the device logic over it) runs under miri.
#[cfg(test)]
pub(crate) mod heap {
    use super::*;

    impl RxRing {
        /// `block_nr` zeroed (kernel-owned) blocks of `block_size` bytes.
        pub(crate) fn on_heap(block_size: usize, block_nr: usize) -> RxRing {
            assert!(block_size % 8 == 0);
            RxRing {
                map: Mapping::on_heap(block_size * block_nr),
                block_size,
                block_nr,
            }
        }

        /// Act as the kernel: write `bytes` into kernel-owned block `i`, then hand it to
        /// user space (release store of `TP_STATUS_USER`, as `prb_close_block` does).
        pub(crate) fn kernel_fill(&mut self, i: usize, bytes: &[u8]) {
            assert!(!self.is_user(i), "kernel_fill of a user-owned block");
            assert!(bytes.len() <= self.block_size);
            let p = self.map.range(i * self.block_size, self.block_size);
            // SAFETY: in bounds; the block is kernel-owned and `&mut self` excludes any user
            // slice of it.
            let blk = unsafe { std::slice::from_raw_parts_mut(p, self.block_size) };
            blk[..bytes.len()].copy_from_slice(bytes);
            blk[bytes.len()..].fill(0);
            blk[BLOCK_STATUS_OFFSET..BLOCK_STATUS_OFFSET + 4].fill(0);
            self.map
                .status(i * self.block_size + BLOCK_STATUS_OFFSET)
                .store(TP_STATUS_USER, Ordering::Release);
        }
    }

    impl TxRing {
        /// `frame_nr` slots of `frame_size` bytes, `frames_per_block` to a block.
        pub(crate) fn on_heap(
            frame_size: usize,
            frames_per_block: usize,
            frame_nr: usize,
        ) -> TxRing {
            let block_size = (frame_size * frames_per_block).div_ceil(4096) * 4096;
            let blocks = frame_nr.div_ceil(frames_per_block);
            TxRing {
                map: Mapping::on_heap(block_size * blocks),
                base: 0,
                block_size,
                frame_size,
                frames_per_block,
                frame_nr,
                prefix: 0,
            }
        }

        /// Act as the kernel: take slot `i` if it was requested, returning the frame, and
        /// mark it `status` (`SENDING`, then later `AVAILABLE`).
        pub(crate) fn kernel_take(&mut self, i: usize) -> Option<Vec<u8>> {
            let off = self.slot_off(i);
            if self.map.status(off + 20).load(Ordering::Acquire) != TP_STATUS_SEND_REQUEST {
                return None;
            }
            let p = self.map.range(off, self.frame_size);
            // SAFETY: in bounds; the slot is SEND_REQUEST (user side is done with it) and
            // `&mut self` excludes a concurrent `fill`. Only the bytes outside the status
            // word are read.
            let hdr = unsafe { std::slice::from_raw_parts(p, 20) };
            assert_eq!(&hdr[0..4], &[0; 4], "tp_next_offset must be 0");
            let len = u32::from_ne_bytes([hdr[16], hdr[17], hdr[18], hdr[19]]) as usize;
            assert!(len <= self.capacity());
            // SAFETY: as above, the data area.
            let data = unsafe { std::slice::from_raw_parts(p.add(TX_DATA_OFFSET), len) };
            let v = data.to_vec();
            self.map
                .status(off + 20)
                .store(TP_STATUS_SENDING, Ordering::Release);
            Some(v)
        }

        /// Act as the kernel: the skb of slot `i` was freed.
        pub(crate) fn kernel_complete(&mut self, i: usize) {
            let off = self.slot_off(i);
            self.map
                .status(off + 20)
                .store(TP_STATUS_AVAILABLE, Ordering::Release);
        }
    }

    #[test]
    fn rx_ring_handshake() {
        let mut r = RxRing::on_heap(4096, 3);
        assert!(r.user_block(0).is_none());
        assert!(r.user_block(7).is_none());
        r.kernel_fill(1, &[7; 100]);
        assert!(!r.is_user(0) && r.is_user(1));
        let b = r.user_block(1).unwrap();
        assert_eq!(b.len(), 4096);
        assert_eq!(b[0], 7);
        assert_eq!(b[BLOCK_STATUS_OFFSET], 1);
        r.release(1);
        assert!(!r.is_user(1));
        r.release(99); // out of range: ignored
    }

    #[test]
    fn tx_ring_handshake() {
        let mut t = TxRing::on_heap(256, 3, 7);
        assert_eq!(t.slots(), 7);
        assert_eq!(t.capacity(), 256 - TX_DATA_OFFSET);
        // Slots in the second block start at the block boundary, not at 3 * 256.
        assert_eq!(t.slot_off(3), 4096);
        assert_eq!(t.fill(0, |_| None), TxFill::Empty);
        assert_eq!(t.fill(0, |_| Some(10)), TxFill::Rejected(10));
        assert_eq!(t.fill(0, |_| Some(10_000)), TxFill::Rejected(10_000));
        let q = t.fill(4, |b| {
            b[..20].copy_from_slice(&[0xab; 20]);
            Some(20)
        });
        assert_eq!(q, TxFill::Queued(20));
        assert_eq!(t.status(4), TP_STATUS_SEND_REQUEST);
        assert_eq!(t.in_flight(), 1);
        assert_eq!(t.fill(4, |_| panic!("busy slot lent out")), TxFill::Busy);
        assert_eq!(t.kernel_take(4).unwrap(), vec![0xab; 20]);
        assert_eq!(t.kernel_take(4), None);
        assert_eq!(t.fill(4, |_| panic!("sending slot lent out")), TxFill::Busy);
        t.kernel_complete(4);
        assert_eq!(t.in_flight(), 0);
        assert_eq!(t.fill(4, |b| Some(b.len())), TxFill::Queued(t.capacity()));
        assert_eq!(t.fill(99, |_| panic!()), TxFill::Busy);
    }
}
