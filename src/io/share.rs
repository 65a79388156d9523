//! Several devices on one address and UDP port, as several programs use one kernel RoCE
//! device: each program's UDP socket binds the address and port 4791 with `SO_REUSEPORT`
//! ([`super::udp::UdpConfig::reuse_port`]), and the kernel hands each datagram to one of the
//! sockets by a hash of its addresses and ports — not by the QP it is for. So each device
//! takes a **slot** ([`Slot::take`]): a number 0–255, unique among the devices of this user
//! in this network namespace, held as an abstract Unix datagram socket named after it (gone
//! with the process, however it ends). The device hands out QPNs of its slot's block only
//! ([`crate::verbs::DeviceConfig::qpn_block`]: slot *s* numbers its QPs from `s << 16 | 0x11`
//! to `s << 16 | 0xffff`), and [`Shared`], around its packet device, reads the destination QPN of every
//! frame received: a frame of another slot's block goes to that slot's socket, with the
//! headers the UDP device synthesised (and whether its ICRC was verified); what other slots
//! send here is handed up as if received. Frames to QP1 (the CM's MADs) belong to slot 0's
//! block and go to slot 0's device; multicast (QPN 0xffffff) stays (each device's group
//! socket receives its own copy).
//!
//! A REQ or SIDR_REQ for a service nobody has claimed yet is held for the program about to
//! claim it (it binds its port and listens just after its peer connects: perftest `-R`): a
//! REQ for as long as its sender waits before sending it again (its Remote CM Response
//! Timeout; at least 2 s, at most 8 s), a SIDR_REQ for 2 s; then handed up here, whose CM (if
//! the program runs one) answers it. A copy its sender sent again meanwhile takes the held
//! copy's place (counted, [`ShareStats::superseded`]), so the claimant gets one.
//!
//! A frame for a block whose slot nobody holds is handed up here (the engine drops it as an
//! unknown QP, as before). Frames of one receive batch for one slot travel as one datagram
//! (the kernel queues ten datagrams per Unix socket by default, `net.unix.max_dgram_qlen`);
//! a full queue drops the batch, counted ([`ShareStats::forward_dropped`]), as a full socket
//! buffer would. A datagram is taken only from a sender of this user (the kernel attaches
//! the sender's credentials): anyone in the namespace can send to an abstract name, but
//! `SO_REUSEPORT` already ties the sharing devices to one user.

use super::event::ReadySet;
use super::sys::unix as sysunix;
use super::{IcrcCheck, IoStats, Medium, PacketDevice};
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

/// Slots per user and network namespace (the top 8 bits of a 24-bit QPN).
pub const SLOTS: usize = 256;
/// Socket buffers of a slot's socket (where the system allows).
const SOCKET_BUF: usize = 4 << 20;
/// A forwarded datagram holds frames of up to this many bytes in all (each frame at most a
/// UDP datagram's payload plus the synthesised headers).
const BATCH_BYTES: usize = 64 << 10;
/// The largest frame forwarded: headers (14 + 40 + 8) and a UDP payload of 65,507 bytes.
const MAX_FRAME: usize = 14 + 40 + 8 + 65_507;
/// Each frame in a forwarded datagram: its length (2 bytes, big-endian), whether its ICRC was
/// verified (1 byte), the frame.
const RECORD_HEAD: usize = 3;
/// How long a slot that refused a datagram (nobody holds it) is not tried again.
const DEAD_FOR: Duration = Duration::from_millis(100);
/// How long a REQ or SIDR_REQ for a service nobody claims yet is held for its claimant (a
/// program binds its port and listens just after its peer connects: perftest `-R`; on a loaded
/// 2-core machine that took more than 0.5 s, the hold before 2026-12-07), and how often it is
/// looked for meanwhile; at most this many held at once. The same 2 s as the CM's own listen
/// grace, well inside a client's REQ response timeout.
const HOLD_FOR: Duration = Duration::from_secs(2);
/// The longest a REQ is held, whatever its Remote CM Response Timeout says.
const MAX_HOLD: Duration = Duration::from_secs(8);
const HOLD_CHECK: Duration = Duration::from_millis(5);
const MAX_HELD: usize = 16;

fn slot_name(uid: u32, n: u8) -> Vec<u8> {
    format!("ferroce-share/{uid}/{n}").into_bytes()
}

/// A slot: its number and its socket, held for as long as this lives.
#[derive(Debug)]
pub struct Slot {
    n: u8,
    uid: u32,
    sock: UnixDatagram,
}

impl Slot {
    /// Take the lowest free slot of this user in this network namespace (`AddrInUse` when
    /// all [`SLOTS`] are taken).
    pub fn take() -> io::Result<Slot> {
        let uid = sysunix::euid();
        for n in 0..=u8::MAX {
            match sysunix::bind_abstract(&slot_name(uid, n), SOCKET_BUF) {
                Ok(sock) => return Ok(Slot { n, uid, sock }),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("all {SLOTS} slots for devices sharing an address are taken"),
        ))
    }

    /// The slot's number: the block of QPNs its device hands out.
    pub fn number(&self) -> u8 {
        self.n
    }

    /// The abstract name of the slot's socket (other slots' devices send to it).
    pub fn name(&self) -> Vec<u8> {
        slot_name(self.uid, self.n)
    }
}

/// An address as a name part: IPv4 (an IPv4-mapped IPv6 address as its IPv4 one), IPv6, or
/// `*` for any.
fn addr_part(ip: Option<IpAddr>) -> String {
    match ip.map(|ip| ip.to_canonical()) {
        None => "*".into(),
        Some(a) if a.is_unspecified() => "*".into(),
        Some(a) => a.to_string(),
    }
}

fn service_name(uid: u32, ip: Option<IpAddr>, sid: u64, slot: Option<u8>) -> Vec<u8> {
    let mut n = format!("ferroce-share/{uid}/svc/{}/{sid:016x}", addr_part(ip));
    if let Some(s) = slot {
        n.push_str(&format!("/{s}"));
    }
    n.into_bytes()
}

/// A CM service this device listens on, claimed among the devices sharing its port: a REQ or
/// SIDR_REQ for it that the kernel hands to another device's socket is passed on to this one.
/// Two names, held while this lives: the claim (`…/svc/ADDR/SID`, one device's at a time:
/// a second claim is refused with `AddrInUse`, as a second bind of one port is) and the
/// claimant's (`…/svc/ADDR/SID/SLOT`), which a device holding the request finds by trying
/// each slot. Nothing is ever read from either (a try leaves an empty datagram, at most the
/// queue's ten).
#[derive(Debug)]
pub struct ServiceClaim {
    _claim: UnixDatagram,
    _slot: UnixDatagram,
}

impl ServiceClaim {
    /// Claim service `sid` at `ip` (`None` or an unspecified address: any) for the device of
    /// `slot`.
    pub fn take(slot: u8, ip: Option<IpAddr>, sid: u64) -> io::Result<ServiceClaim> {
        let uid = sysunix::euid();
        let claim = sysunix::bind_abstract(&service_name(uid, ip, sid, None), 0)?;
        let mine = sysunix::bind_abstract(&service_name(uid, ip, sid, Some(slot)), 0)?;
        Ok(ServiceClaim {
            _claim: claim,
            _slot: mine,
        })
    }
}

/// Whether some socket has the abstract `name` (an empty datagram is sent to find out).
fn is_bound(sock: &UnixDatagram, name: &[u8]) -> bool {
    match sysunix::send_abstract(sock, name, &[]) {
        Ok(()) => true,
        Err(e) => e.kind() == io::ErrorKind::WouldBlock,
    }
}

/// The slot of the device that claims service `sid` at `dst` (or at any address), if one
/// does; `own` is tried first.
fn claimant(slot: &Slot, dst: IpAddr, sid: u64) -> Option<u8> {
    let uid = slot.uid;
    for ip in [Some(dst), None] {
        if !is_bound(&slot.sock, &service_name(uid, ip, sid, None)) {
            continue;
        }
        let own = slot.n;
        return std::iter::once(own)
            .chain((0..=u8::MAX).filter(|&n| n != own))
            .find(|&n| is_bound(&slot.sock, &service_name(uid, ip, sid, Some(n))));
    }
    None
}

/// What the sharing did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShareStats {
    /// Frames received here for another slot's QPs and sent on to it.
    pub forwarded: u64,
    /// Frames for another slot dropped because its queue was full.
    pub forward_dropped: u64,
    /// Frames this device sent to another slot's device on one of its own addresses straight
    /// through that slot's socket (not through the kernel's UDP path).
    pub sent_direct: u64,
    /// Frames another slot sent here, handed up.
    pub received: u64,
    /// Frames for a slot nobody holds, handed up here.
    pub unowned: u64,
    /// Datagrams refused: from another user, without credentials, cut short or malformed.
    pub refused: u64,
    /// CM requests for a service nobody claimed yet, held for their claimant.
    pub held: u64,
    /// Held CM requests whose sender sent them again while held (the newer copy waits in
    /// the held one's place).
    pub superseded: u64,
}

/// Where a received frame goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// Handed up here.
    Here,
    /// To the device of this slot (if anyone holds it).
    Slot(u8),
    /// A CM request (REQ, SIDR_REQ) for this service ID at this destination address: to the
    /// device that claims it ([`ServiceClaim`]).
    Service(IpAddr, u64),
}

/// The destination address and the BTH's offset of `frame` (Ethernet, IPv4 or IPv6, UDP,
/// BTH: what the UDP device hands up).
fn ip_and_bth(frame: &[u8]) -> Option<(IpAddr, usize)> {
    match u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]) {
        0x0800 => {
            let d: [u8; 4] = frame.get(30..34)?.try_into().ok()?;
            let ihl = usize::from(frame.get(14)? & 0x0f) * 4;
            Some((IpAddr::from(d), 14 + ihl + 8))
        }
        0x86dd => {
            let d: [u8; 16] = frame.get(38..54)?.try_into().ok()?;
            Some((IpAddr::from(d), 14 + 40 + 8))
        }
        _ => None,
    }
}

/// The slot whose block QPN-addressed `frame` is for; `None` for QP1, multicast, or a frame
/// too short to say.
#[cfg(test)]
fn block_of(frame: &[u8]) -> Option<u8> {
    match route(frame) {
        Route::Slot(b) => Some(b),
        _ => None,
    }
}

/// Where `frame` goes. By its destination QPN's block; multicast (each device's group socket
/// has its own copy) and anything too short to say stay here. A MAD to QP1 — every device
/// has its own — goes by what the CM message names (IBTA §12.6): a REQ or SIDR_REQ by its
/// service ID (offset 32 of the MAD), to the device that claims it; a message with a
/// Remote Communication ID (MRA, REJ, REP, RTU, DREQ, DREP, LAP, APR: offset 28), which is
/// the receiver's own Local Communication ID, and a SIDR_REP's Request ID (offset 24), the
/// requester's own, by the ID's top byte (the CM's block of IDs,
/// [`crate::cm::CmConfig::id_block`]); any other MAD stays.
fn route(frame: &[u8]) -> Route {
    let Some((dst, bth)) = ip_and_bth(frame) else {
        return Route::Here;
    };
    let Some(q) = frame.get(bth + 5..bth + 8) else {
        return Route::Here;
    };
    let qpn = u32::from_be_bytes([0, q[0], q[1], q[2]]);
    match qpn {
        0x00ff_ffff | 0 => Route::Here,
        1 => cm_route(dst, frame.get(bth..).unwrap_or(&[])),
        q => Route::Slot((q >> 16) as u8),
    }
}

/// [`route`] for a frame to QP1, from its BTH on.
fn cm_route(dst: IpAddr, t: &[u8]) -> Route {
    // BTH (12) and DETH (8) of a UD SEND_ONLY, then the MAD.
    if t.first() != Some(&0x64) {
        return Route::Here;
    }
    let mad = t.get(20..).unwrap_or(&[]);
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(mad.get(at..at + 4)?.try_into().ok()?))
    };
    // Management class 7: communication management.
    if mad.get(1) != Some(&0x07) {
        return Route::Here;
    }
    let Some(attr) = mad.get(16..18).map(|a| u16::from_be_bytes([a[0], a[1]])) else {
        return Route::Here;
    };
    let by_id = |id: Option<u32>| id.map_or(Route::Here, |id| Route::Slot((id >> 24) as u8));
    match attr {
        // REQ, SIDR_REQ.
        0x0010 | 0x0017 => match mad.get(32..40) {
            Some(sid) => Route::Service(dst, u64::from_be_bytes(sid.try_into().unwrap_or([0; 8]))),
            None => Route::Here,
        },
        // MRA, REJ, REP, RTU, DREQ, DREP, LAP, APR.
        0x0011..=0x0016 | 0x0019 | 0x001a => by_id(word(28)),
        // SIDR_REP.
        0x0018 => by_id(word(24)),
        _ => Route::Here,
    }
}

/// Full batches waiting for room in one receiver's queue, at most (beyond, a batch is dropped
/// and counted, as a full socket buffer drops).
const PENDING_MAX: usize = 4 << 20;

/// A batch of frames for one slot, and what its frames are (for the counts).
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    /// Frames received here and passed on.
    forwarded: u64,
    /// Frames this device sent.
    direct: u64,
}

impl Batch {
    fn frames(&self) -> u64 {
        self.forwarded + self.direct
    }
}

/// The device of another slot this one sends to: a socket connected to its slot's socket
/// (writable while the receiver's queue has room), the batch being filled, and full batches
/// waiting for room, oldest first.
struct Peer {
    to: u8,
    sock: UnixDatagram,
    filling: Batch,
    pending: std::collections::VecDeque<Batch>,
    pending_bytes: usize,
    /// Whether the set the engine sleeps on watches `sock` for room.
    watched: bool,
}

/// Counts gathered while batches are queued and sent, added to [`ShareStats`] by
/// [`Peers::flush`].
#[derive(Clone, Copy, Debug, Default)]
struct StatsDelta {
    forwarded: u64,
    direct: u64,
    dropped: u64,
}

/// The other slots' devices this one sends to.
struct Peers {
    uid: u32,
    list: Vec<Peer>,
    /// Slots nobody held when last tried, until when.
    dead: Vec<(u8, Instant)>,
    /// Counts of batches queued or dropped since the last flush.
    delta: StatsDelta,
}

impl Peers {
    fn is_dead(&self, b: u8) -> bool {
        self.dead.iter().any(|&(d, _)| d == b)
    }

    /// Add `frame` to the batch for slot `to` (`direct`: this device sent it; else it was
    /// received here and is passed on). `false` when nobody holds the slot.
    fn push(&mut self, to: u8, frame: &[u8], check: IcrcCheck, direct: bool) -> bool {
        let Ok(len) = u16::try_from(frame.len()) else {
            return false;
        };
        let k = match self.list.iter().position(|p| p.to == to) {
            Some(k) => k,
            None => match sysunix::connect_abstract(&slot_name(self.uid, to), SOCKET_BUF) {
                Ok(sock) => {
                    self.list.push(Peer {
                        to,
                        sock,
                        filling: Batch::default(),
                        pending: Default::default(),
                        pending_bytes: 0,
                        watched: false,
                    });
                    self.list.len() - 1
                }
                Err(_) => {
                    self.dead.push((to, Instant::now() + DEAD_FOR));
                    return false;
                }
            },
        };
        let b = &mut self.list[k].filling;
        if b.bytes.capacity() == 0 {
            b.bytes.reserve(BATCH_BYTES + MAX_FRAME);
        }
        b.bytes.extend_from_slice(&len.to_be_bytes());
        b.bytes.push(u8::from(check == IcrcCheck::Good));
        b.bytes.extend_from_slice(frame);
        if direct {
            b.direct += 1;
        } else {
            b.forwarded += 1;
        }
        if b.bytes.len() >= BATCH_BYTES {
            let full = std::mem::take(b);
            Self::queue(&mut self.list[k], full, &mut self.delta);
        }
        true
    }

    /// Queue `b` behind `p`'s pending batches (dropped, counted, beyond [`PENDING_MAX`]).
    fn queue(p: &mut Peer, b: Batch, d: &mut StatsDelta) {
        if p.pending_bytes + b.bytes.len() > PENDING_MAX {
            d.dropped += b.frames();
            return;
        }
        p.pending_bytes += b.bytes.len();
        p.pending.push_back(b);
    }

    /// Send what can be sent: every batch being filled goes behind its peer's pending ones,
    /// and each peer's are sent oldest first until its receiver's queue is full (the set
    /// `ready` then watches for room, so the engine wakes to send the rest). A peer whose
    /// slot nobody holds any more is forgotten with what it held (dropped, counted).
    fn flush(&mut self, ready: &ReadySet, stats: &mut ShareStats) {
        let mut d = std::mem::take(&mut self.delta);
        let now = Instant::now();
        let mut gone = Vec::new();
        for (i, p) in self.list.iter_mut().enumerate() {
            if !p.filling.bytes.is_empty() {
                let b = std::mem::take(&mut p.filling);
                Self::queue(p, b, &mut d);
            }
            while let Some(b) = p.pending.front() {
                match p.sock.send(&b.bytes) {
                    Ok(_) => {
                        d.forwarded += b.forwarded;
                        d.direct += b.direct;
                        p.pending_bytes -= b.bytes.len();
                        let mut b = p.pending.pop_front().unwrap_or_default();
                        if p.filling.bytes.capacity() == 0 {
                            // Keep one buffer for the next batch.
                            b.bytes.clear();
                            p.filling.bytes = b.bytes;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        if e.kind() != io::ErrorKind::ConnectionRefused {
                            tracing::debug!(to = p.to, error = %e, "a batch for another slot was not sent");
                        }
                        d.dropped += p.pending.iter().map(Batch::frames).sum::<u64>();
                        p.pending.clear();
                        p.pending_bytes = 0;
                        gone.push(i);
                        break;
                    }
                }
            }
            let want = !p.pending.is_empty();
            if want != p.watched
                && ready
                    .watch_writable(p.sock.as_fd().as_raw_fd(), want)
                    .is_ok()
            {
                p.watched = want;
            }
        }
        for &i in gone.iter().rev() {
            let p = self.list.swap_remove(i);
            self.dead.push((p.to, now + DEAD_FOR));
        }
        stats.forwarded += d.forwarded;
        stats.sent_direct += d.direct;
        stats.forward_dropped += d.dropped;
    }
}

/// A CM request held for the device that will claim its service.
struct Held {
    until: Instant,
    frame: Vec<u8>,
    check: IcrcCheck,
    dst: IpAddr,
    sid: u64,
    /// Who sent it and its ID, as [`request_of`] reads them (a copy sent again has the same).
    key: Option<RequestKey>,
}

/// A CM request's sender (source address), attribute (REQ, SIDR_REQ) and the sender's ID of
/// it (REQ: Local Communication ID; SIDR_REQ: Request ID).
type RequestKey = (IpAddr, u16, u32);

/// The source address of `frame` (as [`ip_and_bth`] reads it).
fn src_ip(frame: &[u8]) -> Option<IpAddr> {
    match u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]) {
        0x0800 => {
            let a: [u8; 4] = frame.get(26..30)?.try_into().ok()?;
            Some(IpAddr::from(a).to_canonical())
        }
        0x86dd => {
            let a: [u8; 16] = frame.get(22..38)?.try_into().ok()?;
            Some(IpAddr::from(a).to_canonical())
        }
        _ => None,
    }
}

/// What identifies CM request `frame` (a REQ or SIDR_REQ, as [`route`] found it) among the
/// copies its sender sends, and how long its sender waits for an answer before sending it
/// again, where the request says (a REQ's Remote CM Response Timeout, IBTA §12.6.5: 4.096 µs
/// × 2^value).
fn request_of(frame: &[u8]) -> Option<(RequestKey, Option<Duration>)> {
    use crate::wire::mad::cm::{Req, SidrReq};
    let (_, bth) = ip_and_bth(frame)?;
    // BTH and DETH, then the MAD: its header, then the attribute's data.
    let mad = frame.get(bth + 20..)?;
    let attr = u16::from_be_bytes(mad.get(16..18)?.try_into().ok()?);
    let data = mad.get(24..)?;
    let src = src_ip(frame)?;
    match attr {
        0x0010 => {
            let r = Req::new_checked(data).ok()?;
            let wait = Duration::from_nanos(4096u64 << r.remote_cm_response_timeout().min(31));
            Some(((src, attr, r.local_comm_id()), Some(wait)))
        }
        0x0017 => {
            let r = SidrReq::new_checked(data).ok()?;
            Some(((src, attr, r.request_id()), None))
        }
        _ => None,
    }
}

/// A packet device shared with the devices of other slots (see the module documentation).
pub struct Shared<D> {
    inner: D,
    slot: Slot,
    /// The addresses the device serves (canonical): a frame to one of them for another slot
    /// goes straight to that slot's socket.
    locals: Vec<IpAddr>,
    ready: ReadySet,
    stats: ShareStats,
    peers: Peers,
    /// CM requests for services nobody claimed yet, oldest first, and the timer that wakes
    /// the engine to look for their claimants.
    held: std::collections::VecDeque<Held>,
    timer: super::event::TimerFd,
    /// How long every request is held, if [`Shared::with_hold`] said (otherwise as the
    /// module documentation says).
    hold_for: Option<Duration>,
    /// The datagram last received from another slot, and how much of it is handed up.
    rx: Vec<u8>,
    rx_len: usize,
    rx_pos: usize,
}

impl<D: PacketDevice> Shared<D> {
    /// Share `inner` (whose sockets were bound with `SO_REUSEPORT`, one on each of `locals`)
    /// as `slot`.
    pub fn new(inner: D, slot: Slot, locals: &[IpAddr]) -> io::Result<Shared<D>> {
        let Some(fd) = inner.poll_fd() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a shared device needs a packet device with a descriptor to wait on",
            ));
        };
        let timer = super::event::TimerFd::new()?;
        let ready = ReadySet::new(&[fd, slot.sock.as_fd().as_raw_fd(), timer.fd()])?;
        tracing::info!(slot = slot.n, device = %inner.describe(), "sharing the address and port");
        Ok(Shared {
            inner,
            peers: Peers {
                uid: slot.uid,
                list: Vec::new(),
                dead: Vec::new(),
                delta: StatsDelta::default(),
            },
            slot,
            locals: locals.iter().map(|a| a.to_canonical()).collect(),
            ready,
            stats: ShareStats::default(),
            held: Default::default(),
            timer,
            hold_for: None,
            rx: vec![0; BATCH_BYTES + MAX_FRAME + RECORD_HEAD],
            rx_len: 0,
            rx_pos: 0,
        })
    }

    /// Hold every CM request for a service nobody claims for `d`, whatever the request
    /// says (its claimant is looked for every 5 ms meanwhile, or every `d` if shorter).
    #[must_use]
    pub fn with_hold(mut self, d: Duration) -> Self {
        self.hold_for = Some(d);
        self
    }

    /// The slot's number.
    pub fn slot(&self) -> u8 {
        self.slot.n
    }

    /// What the sharing did so far.
    pub fn share_stats(&self) -> ShareStats {
        self.stats
    }

    /// The device shared.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Hand up what is left of the datagram last received from another slot, then receive
    /// more, until `max` frames were handed up (`*n` counts them).
    fn receive_forwarded(
        &mut self,
        max: usize,
        n: &mut usize,
        f: &mut dyn FnMut(&[u8], IcrcCheck),
    ) -> io::Result<()> {
        loop {
            while self.rx_pos < self.rx_len {
                if *n >= max {
                    return Ok(());
                }
                let r = &self.rx[self.rx_pos..self.rx_len];
                let len = match r {
                    [a, b, _, ..] => usize::from(u16::from_be_bytes([*a, *b])),
                    _ => 0,
                };
                if len == 0 || r.len() < RECORD_HEAD + len {
                    // Malformed: the rest of the datagram is dropped.
                    self.stats.refused += 1;
                    self.rx_pos = self.rx_len;
                    break;
                }
                let check = if r[2] == 1 {
                    IcrcCheck::Good
                } else {
                    IcrcCheck::Unchecked
                };
                f(&r[RECORD_HEAD..RECORD_HEAD + len], check);
                self.stats.received += 1;
                *n += 1;
                self.rx_pos += RECORD_HEAD + len;
            }
            if *n >= max {
                return Ok(());
            }
            let Some(got) = sysunix::recv_with_uid(&self.slot.sock, &mut self.rx)? else {
                return Ok(());
            };
            if got.truncated || got.uid != Some(self.slot.uid) {
                self.stats.refused += 1;
                continue;
            }
            self.rx_len = got.len;
            self.rx_pos = 0;
        }
    }

    /// Hand on the held CM requests whose service is claimed now (or hand them up here if
    /// this device claims it, or once held long enough: the CM here answers), at most
    /// `max` handed up (`*n` counts them); the timer wakes the engine again while some wait.
    fn release_held(&mut self, max: usize, n: &mut usize, f: &mut dyn FnMut(&[u8], IcrcCheck)) {
        if self.held.is_empty() {
            return;
        }
        let now = Instant::now();
        let own = self.slot.n;
        let mut keep = std::collections::VecDeque::new();
        while let Some(h) = self.held.pop_front() {
            let to = claimant(&self.slot, h.dst, h.sid);
            let here = match to {
                Some(b) if b != own => !self.peers.push(b, &h.frame, h.check, false),
                Some(_) => true,
                None if now >= h.until => true,
                None => {
                    keep.push_back(h);
                    continue;
                }
            };
            if here {
                if *n >= max {
                    keep.push_back(h);
                    continue;
                }
                f(&h.frame, h.check);
                *n += 1;
            }
        }
        self.held = keep;
        if self.held.is_empty() {
            self.timer.disarm();
        } else if self.timer.arm(self.look_every()).is_err() {
            // No timer: hand them up now rather than hold them unwatched.
            while let Some(h) = self.held.pop_front() {
                f(&h.frame, h.check);
                *n += 1;
            }
        }
    }

    /// How often the claimants of held requests are looked for: every 5 ms, or every hold if
    /// [`Shared::with_hold`] set a shorter one.
    fn look_every(&self) -> Duration {
        HOLD_CHECK.min(self.hold_for.unwrap_or(HOLD_CHECK))
    }

    /// Slots found dead long enough ago are tried again.
    fn forget_the_dead(&mut self) {
        let now = Instant::now();
        self.peers.dead.retain(|&(_, until)| until > now);
    }
}

impl<D: PacketDevice> PacketDevice for Shared<D> {
    fn recv_batch(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        self.recv_batch_checked(max, &mut |fr, _| f(fr))
    }

    fn recv_batch_checked(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], IcrcCheck),
    ) -> io::Result<usize> {
        let mut n = 0;
        self.receive_forwarded(max, &mut n, f)?;
        self.forget_the_dead();
        self.release_held(max, &mut n, f);
        self.peers.flush(&self.ready, &mut self.stats);
        if n >= max {
            return Ok(n);
        }
        let (own, hold_for, look_every) = (self.slot.n, self.hold_for, self.look_every());
        let Shared {
            inner,
            slot,
            stats,
            peers,
            held,
            timer,
            ..
        } = self;
        let got = inner.recv_batch_checked(max - n, &mut |fr, check| {
            let to = match route(fr) {
                Route::Slot(b) if b != own && !peers.is_dead(b) => b,
                Route::Service(dst, sid) => match claimant(slot, dst, sid) {
                    Some(b) if b != own => b,
                    // Claimed here.
                    Some(_) => return f(fr, check),
                    // By nobody yet: held for a while for the program about to claim it
                    // (then, or once held long enough, the CM there or here answers).
                    None => {
                        let req = request_of(fr);
                        let key = req.map(|r| r.0);
                        if let Some(h) = held.iter_mut().find(|h| key.is_some() && h.key == key) {
                            // Sent again: the newer copy waits in its place, as long as the
                            // first was to wait (the sender is told no later than it was).
                            h.frame.clear();
                            h.frame.extend_from_slice(fr);
                            h.check = check;
                            stats.superseded += 1;
                            return;
                        }
                        if held.len() >= MAX_HELD || timer.arm(look_every).is_err() {
                            return f(fr, check);
                        }
                        let wait = hold_for.unwrap_or_else(|| {
                            req.and_then(|r| r.1)
                                .map_or(HOLD_FOR, |w| w.clamp(HOLD_FOR, MAX_HOLD))
                        });
                        held.push_back(Held {
                            until: Instant::now() + wait,
                            frame: fr.to_vec(),
                            check,
                            dst,
                            sid,
                            key,
                        });
                        stats.held += 1;
                        return;
                    }
                },
                Route::Slot(b) if b != own => {
                    stats.unowned += 1;
                    return f(fr, check);
                }
                _ => return f(fr, check),
            };
            if !peers.push(to, fr, check, false) {
                stats.unowned += 1;
                f(fr, check);
            }
        })?;
        self.peers.flush(&self.ready, &mut self.stats);
        Ok(n + got)
    }

    /// A frame to one of the device's own addresses for another slot's QP (or a service
    /// another slot claims) goes straight to that slot's socket, as the engine wrote it (its
    /// ICRC covers its own headers; the destination MAC zeroed, as a UDP device's frames
    /// come): no trip through the kernel's UDP path, and no hop from whichever socket the
    /// kernel's hash would have picked. A frame for a slot nobody holds is dropped (no QP
    /// takes it), counted in [`ShareStats::unowned`]. Everything else goes to the device.
    fn send_batch(
        &mut self,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> io::Result<usize> {
        self.forget_the_dead();
        let Shared {
            inner,
            slot,
            locals,
            stats,
            peers,
            ..
        } = self;
        let own = slot.n;
        let mut direct = 0;
        let mut handed = 0;
        let sent = inner.send_batch(max, &mut |buf| loop {
            if handed + direct >= max {
                return None;
            }
            let len = fill(buf)?;
            let to = ip_and_bth(&buf[..len])
                .filter(|(dst, _)| locals.contains(&dst.to_canonical()))
                .and_then(|(dst, _)| match route(&buf[..len]) {
                    Route::Slot(b) => Some(b),
                    Route::Service(_, sid) => claimant(slot, dst, sid),
                    Route::Here => None,
                })
                .filter(|&b| b != own && !peers.is_dead(b));
            let Some(to) = to else {
                handed += 1;
                return Some(len);
            };
            direct += 1;
            buf[..6].fill(0);
            if !peers.push(to, &buf[..len], IcrcCheck::Unchecked, true) {
                stats.unowned += 1;
            }
        })?;
        self.peers.flush(&self.ready, &mut self.stats);
        Ok(sent + direct)
    }

    fn wait_readable(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        super::event::poll_readable(&[self.ready.fd()], timeout).map(drop)
    }

    fn frame_capacity(&self) -> usize {
        self.inner.frame_capacity()
    }

    fn medium(&self) -> Medium {
        self.inner.medium()
    }

    fn stats(&self) -> IoStats {
        let mut s = self.inner.stats();
        s.rx_dropped += self.stats.forward_dropped + self.stats.refused;
        s
    }

    fn describe(&self) -> String {
        format!("{} shared as slot {}", self.inner.describe(), self.slot.n)
    }

    fn poll_fd(&self) -> Option<RawFd> {
        Some(self.ready.fd())
    }

    /// None: a kernel filter built from this device's QPs would drop the frames of the other
    /// slots' QPs that the kernel hands to this socket.
    fn rx_filter(&self) -> Option<super::udp_filter::SocketFilter> {
        None
    }

    fn rx_udp_checksum_synthesised(&self) -> bool {
        self.inner.rx_udp_checksum_synthesised()
    }

    fn join_group(&mut self, group: IpAddr, join: bool) -> io::Result<()> {
        self.inner.join_group(group, join)?;
        // The device may sleep on another descriptor once it joined (one over its group
        // sockets too): watch that as well.
        match self.inner.poll_fd() {
            Some(fd) if join => self.ready.watch(fd),
            _ => Ok(()),
        }
    }

    fn serve_address(&mut self, local: IpAddr) -> io::Result<()> {
        self.inner.serve_address(local)?;
        let a = local.to_canonical();
        if !self.locals.contains(&a) {
            self.locals.push(a);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::udp::tests::{frame_with, to_port};
    use crate::io::udp::{UdpConfig, UdpDevice};
    use std::net::Ipv4Addr;

    const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn device(port: u16, reuse_port: bool) -> UdpDevice {
        let mut c = UdpConfig::new(LO);
        c.port = port;
        c.reuse_port = reuse_port;
        UdpDevice::open(&c).unwrap()
    }

    /// A SEND frame to QPN `qpn` at `LO`:`port`, its payload telling `psn` apart.
    fn frame_to(qpn: u32, psn: u32, port: u16) -> Vec<u8> {
        let mut f = frame_with(LO, LO, 0, 4791, psn, 64);
        let bth = 14 + 20 + 8;
        f[bth + 5..bth + 8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        to_port(&mut f, LO, port);
        f
    }

    fn qpn_psn(fr: &[u8]) -> (u32, u32) {
        let b = &fr[14 + 20 + 8..];
        (
            u32::from_be_bytes([0, b[5], b[6], b[7]]),
            u32::from_be_bytes([0, b[9], b[10], b[11]]),
        )
    }

    fn send(d: &mut UdpDevice, frames: &[Vec<u8>]) {
        let mut k = 0;
        while k < frames.len() {
            d.send_batch(64, &mut |buf| {
                let f = frames.get(k)?;
                buf[..f.len()].copy_from_slice(f);
                k += 1;
                Some(f.len())
            })
            .unwrap();
        }
    }

    #[test]
    fn each_frame_reaches_the_device_whose_block_its_qpn_names() {
        let (sa, sb) = (Slot::take().unwrap(), Slot::take().unwrap());
        // A block nobody holds: a slot taken and let go.
        let gone = Slot::take().unwrap().number();
        let (na, nb) = (sa.number(), sb.number());
        assert_ne!(na, nb);
        let da = device(0, true);
        let port = da.local_addr().port();
        let db = device(port, true);
        // Without SO_REUSEPORT the port is refused while the sharing devices hold it.
        let mut plain = UdpConfig::new(LO);
        plain.port = port;
        assert_eq!(
            UdpDevice::open(&plain).err().map(|e| e.kind()),
            Some(io::ErrorKind::AddrInUse)
        );
        let mut a = Shared::new(da, sa, &[LO]).unwrap();
        let mut b = Shared::new(db, sb, &[LO]).unwrap();
        let mut peer = device(0, false);
        let mut frames = Vec::new();
        for i in 0..30u32 {
            let block = [na, nb, gone][i as usize % 3];
            frames.push(frame_to((u32::from(block) << 16) | (0x20 + i), i, port));
        }
        send(&mut peer, &frames);
        type Got = Vec<(u32, u32, Vec<u8>, IcrcCheck)>;
        let mut got: [Got; 2] = [Vec::new(), Vec::new()];
        let deadline = Instant::now() + Duration::from_secs(5);
        while got[0].len() + got[1].len() < frames.len() && Instant::now() < deadline {
            for (k, d) in [&mut a, &mut b].into_iter().enumerate() {
                d.wait_readable(Some(Duration::from_millis(20))).unwrap();
                d.recv_batch_checked(64, &mut |fr, c| {
                    let (q, p) = qpn_psn(fr);
                    got[k].push((q, p, fr.to_vec(), c));
                })
                .unwrap();
            }
        }
        assert_eq!(got[0].len() + got[1].len(), frames.len());
        for (k, own) in [(0, na), (1, nb)] {
            for (q, p, fr, c) in &got[k] {
                let block = (q >> 16) as u8;
                assert!(block == own || block == gone, "slot {own} got QPN {q:#x}");
                // BTH and payload byte for byte what the peer sent, and the ICRC (which the
                // peer's device rewrote for the headers the kernel wrote) verified.
                let sent = &frames[*p as usize];
                let t = 14 + 20 + 8;
                assert_eq!(fr[t..fr.len() - 4], sent[t..sent.len() - 4], "frame {p}");
                assert_eq!(*c, IcrcCheck::Good, "frame {p}");
            }
            let mine = got[k].iter().filter(|g| (g.0 >> 16) as u8 == own).count();
            assert_eq!(mine, 10, "slot {own}");
        }
        // The kernel hashed the peer's one flow to one of the two sockets: that one sent the
        // other's frames on, and kept those of the block nobody holds.
        let (sa, sb) = (a.share_stats(), b.share_stats());
        assert_eq!(sa.forwarded + sb.forwarded, 10, "{sa:?} {sb:?}");
        assert_eq!(sa.received + sb.received, 10, "{sa:?} {sb:?}");
        assert_eq!(sa.unowned + sb.unowned, 10, "{sa:?} {sb:?}");
        assert_eq!(sa.forward_dropped + sb.forward_dropped, 0);
    }

    #[test]
    fn a_malformed_datagram_from_another_slot_is_refused() {
        let s = Slot::take().unwrap();
        let name = slot_name(s.uid, s.number());
        let mut a = Shared::new(device(0, true), s, &[LO]).unwrap();
        let junk = UnixDatagram::unbound().unwrap();
        // A record longer than the datagram, then a record of length 0.
        sysunix::send_abstract(&junk, &name, &[0, 200, 1, 9, 9]).unwrap();
        sysunix::send_abstract(&junk, &name, &[0, 0, 0]).unwrap();
        let mut n = 0;
        let deadline = Instant::now() + Duration::from_secs(5);
        while a.share_stats().refused < 2 && Instant::now() < deadline {
            a.wait_readable(Some(Duration::from_millis(20))).unwrap();
            a.recv_batch(64, &mut |_| n += 1).unwrap();
        }
        assert_eq!((a.share_stats().refused, n), (2, 0));
    }

    /// A MAD to QP1 at `LO` (UD SEND_ONLY, DETH, 256 bytes of MAD): management class
    /// `class`, attribute `attr`, `word24` at MAD offset 24, `word28` at 28, `sid` at 32.
    fn mad(class: u8, attr: u16, word24: u32, word28: u32, sid: u64) -> Vec<u8> {
        let mut f = frame_with(LO, LO, 0, 4791, 1, 8 + 256);
        let bth = 14 + 20 + 8;
        f[bth] = 0x64;
        f[bth + 5..bth + 8].copy_from_slice(&[0, 0, 1]);
        let m = bth + 12 + 8;
        f[m] = 1;
        f[m + 1] = class;
        f[m + 16..m + 18].copy_from_slice(&attr.to_be_bytes());
        f[m + 24..m + 28].copy_from_slice(&word24.to_be_bytes());
        f[m + 28..m + 32].copy_from_slice(&word28.to_be_bytes());
        f[m + 32..m + 40].copy_from_slice(&sid.to_be_bytes());
        f
    }

    #[test]
    fn a_cm_message_goes_by_its_service_or_the_id_it_names() {
        let sid = 0x0000_0000_0106_1c06;
        // REQ and SIDR_REQ: by service ID, at the frame's destination.
        assert_eq!(
            route(&mad(7, 0x10, 0x0300_0001, 0, sid)),
            Route::Service(LO, sid)
        );
        assert_eq!(
            route(&mad(7, 0x17, 0x0300_0001, 0, sid)),
            Route::Service(LO, sid)
        );
        // REP, RTU, REJ, MRA, DREQ, DREP, LAP, APR: by the Remote Communication ID's block.
        for attr in [0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x19, 0x1a] {
            assert_eq!(
                route(&mad(7, attr, 0x0900_0001, 0x05ab_cdef, 0)),
                Route::Slot(5),
                "{attr:#x}"
            );
        }
        // SIDR_REP: by its Request ID's.
        assert_eq!(
            route(&mad(7, 0x18, 0x07ab_cdef, 0x0500_0000, 0)),
            Route::Slot(7)
        );
        // ClassPortInfo, another class, a MAD cut short: here.
        assert_eq!(
            route(&mad(7, 0x01, 0x0700_0000, 0x0700_0000, 0)),
            Route::Here
        );
        assert_eq!(
            route(&mad(4, 0x13, 0x0700_0000, 0x0700_0000, 0)),
            Route::Here
        );
        let f = mad(7, 0x13, 0, 0x0500_0000, 0);
        let m = 14 + 20 + 8 + 20;
        assert_eq!(route(&f[..m + 30]), Route::Here);
        for n in 0..f.len() {
            let _ = route(&f[..n]);
        }
        // Not a UD SEND_ONLY to QP1: here.
        let mut g = mad(7, 0x13, 0, 0x0500_0000, 0);
        g[14 + 20 + 8] = 0x04;
        assert_eq!(route(&g), Route::Here);
    }

    /// Two devices sharing a port on `LO` as two slots, the second's slot number, the port, and
    /// a peer's socket to send from.
    fn two_sharing() -> (Shared<UdpDevice>, Shared<UdpDevice>, u8, u16, UdpDevice) {
        let (sa, sb) = (Slot::take().unwrap(), Slot::take().unwrap());
        let nb = sb.number();
        let da = device(0, true);
        let port = da.local_addr().port();
        let db = device(port, true);
        let a = Shared::new(da, sa, &[LO]).unwrap();
        let b = Shared::new(db, sb, &[LO]).unwrap();
        (a, b, nb, port, device(0, false))
    }

    /// What both devices hand up for `for_`: (0 for `a`, 1 for `b`; `what` of the frame).
    fn drain_both<T>(
        a: &mut Shared<UdpDevice>,
        b: &mut Shared<UdpDevice>,
        for_: Duration,
        what: impl Fn(&[u8]) -> T,
    ) -> Vec<(usize, T)> {
        let mut got = Vec::new();
        let until = Instant::now() + for_;
        while Instant::now() < until {
            for (k, d) in [&mut *a, &mut *b].into_iter().enumerate() {
                d.wait_readable(Some(Duration::from_millis(2))).unwrap();
                d.recv_batch(64, &mut |fr| got.push((k, what(fr)))).unwrap();
            }
        }
        got
    }

    /// A REQ for a service nobody claims yet is held (not handed up) until a device claims
    /// it, then handed to that device, whichever socket the kernel gave it to; one for a
    /// service never claimed is handed up where it was held once [`HOLD_FOR`] has passed.
    #[test]
    fn a_req_before_its_claim_waits_for_the_claimant() {
        let (mut a, mut b, nb, port, mut peer) = two_sharing();
        let sid = 0x0106_0000 | u64::from(port);
        let req = |sid: u64| {
            let mut f = mad(7, 0x10, 0x0900_0001, 0, sid);
            to_port(&mut f, LO, port);
            f
        };
        let drain = |a: &mut Shared<UdpDevice>, b: &mut Shared<UdpDevice>, for_: Duration| {
            drain_both(a, b, for_, |fr| fr.len())
        };
        send(&mut peer, &[req(sid)]);
        assert!(drain(&mut a, &mut b, Duration::from_millis(100)).is_empty());
        let claim = ServiceClaim::take(nb, Some(LO), sid).unwrap();
        let got = drain(&mut a, &mut b, Duration::from_millis(100));
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), [1], "{got:?}");
        drop(claim);
        // Never claimed: handed up where it was held, once.
        send(&mut peer, &[req(sid + 1)]);
        assert!(drain(&mut a, &mut b, HOLD_FOR / 2).is_empty());
        assert_eq!(drain(&mut a, &mut b, HOLD_FOR).len(), 1);
    }

    /// A REQ is held as long as its sender waits before sending it again (its Remote CM
    /// Response Timeout, byte 43 of the REQ, top 5 bits: here 2^21 × 4.096 µs = 8.6 s, so the
    /// 8 s cap), not only the 2 s a SIDR_REQ or a REQ that waits less is held; a copy sent
    /// again while held takes the held one's place, so the claimant gets one copy, the
    /// newer; a REQ of another ID is held on its own.
    #[test]
    fn a_held_req_waits_its_response_timeout_and_a_resent_copy_replaces_it() {
        let (mut a, mut b, nb, port, mut peer) = two_sharing();
        let sid = 0x0106_0000 | u64::from(port);
        let m = 14 + 20 + 8 + 20;
        let req = |id: u32, timeout: u8, mark: u8| {
            let mut f = mad(7, 0x10, id, 0, sid);
            f[m + 24 + 43] = timeout << 3;
            // A byte the CM does not read (private data) tells the copies apart.
            f[m + 24 + 100] = mark;
            to_port(&mut f, LO, port);
            f
        };
        assert_eq!(
            request_of(&req(0x0900_0001, 21, 0)),
            Some((
                (LO, 0x10, 0x0900_0001),
                Some(Duration::from_nanos(4096 << 21))
            ))
        );
        assert_eq!(
            request_of(&mad(7, 0x17, 0x0a00_0002, 0, sid)),
            Some(((LO, 0x17, 0x0a00_0002), None))
        );
        assert_eq!(request_of(&mad(7, 0x10, 1, 0, sid)[..m + 24 + 200]), None);
        let drain = |a: &mut Shared<UdpDevice>, b: &mut Shared<UdpDevice>, for_: Duration| {
            drain_both(a, b, for_, |fr| fr[m + 24 + 100])
        };
        send(&mut peer, &[req(0x0900_0001, 21, 1)]);
        send(&mut peer, &[req(0x0900_0002, 21, 7)]);
        assert!(drain(&mut a, &mut b, Duration::from_millis(50)).is_empty());
        send(&mut peer, &[req(0x0900_0001, 21, 2)]);
        // Past the 2 s a SIDR_REQ is held: still held.
        assert!(drain(&mut a, &mut b, HOLD_FOR + Duration::from_millis(300)).is_empty());
        let claim = ServiceClaim::take(nb, Some(LO), sid).unwrap();
        let mut got = drain(&mut a, &mut b, Duration::from_millis(100));
        got.sort_unstable();
        assert_eq!(got, [(1, 2), (1, 7)]);
        let st = a.share_stats();
        let tb = b.share_stats();
        assert_eq!((st.held + tb.held, st.superseded + tb.superseded), (2, 1));
        drop(claim);
    }

    #[test]
    fn a_service_is_claimed_once_and_found_by_its_claimants_slot() {
        let s = Slot::take().unwrap();
        let sid = 0x0106_0000 | u64::from(std::process::id() & 0xffff);
        let mine = ServiceClaim::take(s.number(), Some(LO), sid).unwrap();
        assert_eq!(
            ServiceClaim::take(s.number(), Some(LO), sid)
                .unwrap_err()
                .kind(),
            io::ErrorKind::AddrInUse
        );
        // The IPv4-mapped form names the same address.
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert_eq!(
            ServiceClaim::take(7, Some(mapped), sid).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
        assert_eq!(claimant(&s, LO, sid), Some(s.number()));
        assert_eq!(claimant(&s, LO, sid + 1), None);
        // Another slot's claim at any address (a wildcard listener): found for any address.
        let other = s.number().wrapping_add(100);
        let any = ServiceClaim::take(other, None, sid + 1).unwrap();
        assert_eq!(
            claimant(&s, "10.1.2.3".parse().unwrap(), sid + 1),
            Some(other)
        );
        drop((mine, any));
        assert_eq!(claimant(&s, LO, sid), None);
        assert_eq!(claimant(&s, LO, sid + 1), None);
    }

    #[test]
    fn block_of_reads_the_destination_qpn_of_either_family() {
        let f = frame_to(0x03_0042, 1, 4791);
        assert_eq!(block_of(&f), Some(3));
        assert_eq!(block_of(&frame_to(0x11, 1, 4791)), Some(0));
        // QP1 (every device has its own): stays.
        assert_eq!(block_of(&frame_to(1, 1, 4791)), None);
        // Multicast stays.
        assert_eq!(block_of(&frame_to(0xff_ffff, 1, 4791)), None);
        let v6: IpAddr = "::1".parse().unwrap();
        let g = frame_with(v6, v6, 0, 4791, 1, 8);
        assert_eq!(block_of(&g), Some(0), "QPN 0x123");
        for n in 0..f.len() {
            let _ = block_of(&f[..n]);
        }
        assert_eq!(block_of(&f[..14 + 20 + 8 + 7]), None);
    }
}
