//! A seeded, virtual-time model of a network of one-directional links that carries raw
//! Ethernet frames (Ethernet/IP/UDP/RoCE v2 as [`crate::wire::FrameRepr::emit`] writes them).
//!
//! # Model
//!
//! A [`Network`] holds endpoints ([`EndpointId`]) and links, each link one direction between
//! two endpoints with its own [`LinkConfig`]. [`Network::send`] hands a frame to a link at
//! `now`, and every random decision about that frame is taken there and then; the frame is
//! put on a binary heap of pending deliveries that [`Network::poll_deliver`] pops in
//! delivery-time order (ties in send order). A frame goes through these stages:
//!
//! 1. **Queue.** A link with a [`bandwidth_bps`](LinkConfig::bandwidth_bps) serialises one
//!    frame at a time, FIFO: a frame starts when the previous one has finished and takes
//!    `len * 8 / bps` seconds. The *backlog* is the bytes of frames admitted and not yet fully
//!    serialised (the frame on the wire counts whole until its last bit has left). With
//!    [`queue_limit_bytes`](LinkConfig::queue_limit_bytes), a frame that finds a non-empty
//!    backlog and would take it above the limit is tail-dropped (`dropped_queue`); a frame
//!    that finds the link idle is always admitted, so a limit below one frame means "no
//!    buffer", not "no traffic".
//! 2. **Marking.** An ECN-capable frame (ECT(0) or ECT(1)) is marked CE with probability
//!    [`ce_mark`](LinkConfig::ce_mark), or with the [`Red`] probability of the backlog it
//!    found on arrival. Marking rewrites the ECN bits with [`crate::wire::ip::set_ecn`] (the
//!    IPv4 header checksum is fixed; the ICRC masks the field and stays valid). Not-ECT and
//!    CE frames and frames that are not IP are never touched.
//! 3. **Wire.** After serialisation the frame is lost with probability
//!    [`loss`](LinkConfig::loss) (it did use the link's bandwidth), or has one bit flipped
//!    with probability [`corrupt`](LinkConfig::corrupt) (see below).
//! 4. **Arrival.** It arrives `latency + jitter` after its serialisation ended, jitter uniform
//!    in `0..=jitter` nanoseconds (so jitter alone can reorder frames). With probability
//!    [`reorder`](LinkConfig::reorder) it is held back a further
//!    [`reorder_delay`](LinkConfig::reorder_delay), letting later frames overtake it. With
//!    probability [`duplicate`](LinkConfig::duplicate) a byte-identical copy is delivered as
//!    well, at `latency` plus a jitter of its own (the copy costs no bandwidth and is never
//!    held back).
//!
//! **Corruption** models a bit error that the Ethernet FCS missed. For a frame that decodes
//! as RoCE v2 the flipped bit is chosen uniformly among the bits the ICRC protects from the
//! UDP header to the ICRC trailer, leaving out the masked UDP checksum and BTH byte 4 (FECN,
//! BECN, reserved), so [`crate::wire::parse_frame`] is guaranteed to reject the frame (with
//! [`crate::wire::Error::BadIcrc`], or a length/port/opcode error when the bit lands in
//! one of those fields). Any other frame gets a uniformly chosen bit of the whole frame
//! flipped. An empty frame cannot be corrupted and is not counted.
//!
//! # Determinism
//!
//! The randomness is a counter-based use of [`SplitMix64`]: decision `k` about the `n`-th
//! frame sent on link `a → b` is output `16 n + k + 1` of a SplitMix64 stream keyed by
//! `(seed, a, b)`. A run is therefore a pure function of the seed, the topology and the calls
//! made, and moreover the fate of a link's `n`-th frame does not depend on the traffic on
//! other links nor on which other impairments are enabled (raising `loss` from 1 % to 2 %
//! keeps the frames lost at 1 % lost: common random numbers for experiments).
//!
//! # Cost
//!
//! `send` and `poll_deliver` are O(log n) in the frames in flight (one heap operation, a
//! `BTreeMap` lookup of the link, an amortised O(1) queue update). No allocation is made
//! besides the copy of a duplicated frame and the growth of the heap and queues.
//!
//! # Example
//!
//! ```
//! use ferroce::sim::{LinkConfig, Network};
//! use ferroce::time::{Duration, Instant};
//!
//! let mut net = Network::new(7);
//! let (a, b) = (net.add_endpoint(), net.add_endpoint());
//! let link = LinkConfig::default()
//!     .latency(Duration::from_micros(2))
//!     .bandwidth_bps(1_000_000_000);
//! net.connect_both(a, b, link);
//! net.send(Instant::ZERO, a, b, vec![0u8; 125]);
//! let t = net.next_event().unwrap();
//! assert_eq!(t, Instant::from_nanos(1_000 + 2_000)); // 125 B at 1 Gb/s, then 2 µs
//! let d = net.poll_deliver(t).unwrap();
//! assert_eq!((d.from, d.to, d.frame.len()), (a, b, 125));
//! assert!(net.poll_deliver(t).is_none());
//! ```

pub use super::queue::Red;
use super::queue::{EgressConfig, EgressQueue, Verdict};
use crate::time::{Duration, Instant};
use crate::wire::eth::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_VLAN};
use crate::wire::ip::{read_ecn, set_ecn};
use crate::wire::Ecn;
use core::cmp::Ordering;
use core::fmt;
use std::collections::{BTreeMap, BinaryHeap};

/// Ethertype of an 802.1ad service tag (outer tag of a QinQ frame).
const ETHERTYPE_QINQ: u16 = 0x88a8;

pub use crate::rng::SplitMix64;
use crate::rng::{hit, mix64, scale, GAMMA};

/// The random decisions taken about one frame; each has its own slot in the link's stream.
#[derive(Clone, Copy)]
enum Slot {
    Loss = 0,
    Duplicate = 1,
    Reorder = 2,
    Corrupt = 3,
    CorruptBit = 4,
    CeMark = 5,
    Red = 6,
    Jitter = 7,
    CopyJitter = 8,
}

/// Slots reserved per frame (room for decisions added later without changing old ones).
const SLOTS: u64 = 16;

/// A link's counter-based random stream: `draw(n, k)` is output `SLOTS * n + k + 1` of the
/// SplitMix64 stream seeded with `key`.
#[derive(Clone, Copy, Debug)]
struct Stream {
    key: u64,
}

impl Stream {
    fn new(seed: u64, from: EndpointId, to: EndpointId) -> Self {
        let pair = (u64::from(from.0) << 32) | u64::from(to.0);
        Stream {
            key: mix64(seed) ^ mix64(pair.wrapping_add(GAMMA)),
        }
    }

    #[inline]
    fn draw(self, frame: u64, slot: Slot) -> u64 {
        let index = frame.wrapping_mul(SLOTS).wrapping_add(slot as u64 + 1);
        mix64(self.key.wrapping_add(index.wrapping_mul(GAMMA)))
    }
}

/// An endpoint of the network (a NIC port). Small and `Copy`; ids are dense from 0 in the
/// order of [`Network::add_endpoint`] calls.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointId(u32);

impl EndpointId {
    /// The id's index (0 for the first endpoint added).
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Debug for EndpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ep{}", self.0)
    }
}

impl fmt::Display for EndpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The conditions of one link. `LinkConfig::default()` is a perfect link: no latency,
/// unlimited bandwidth, no loss and no impairment. Probabilities are clamped to `[0, 1]`.
/// Every field has a builder-style setter of the same name:
///
/// ```
/// # use ferroce::sim::{LinkConfig, Red};
/// # use ferroce::time::Duration;
/// let lossy = LinkConfig::default()
///     .latency(Duration::from_micros(5))
///     .jitter(Duration::from_micros(1))
///     .bandwidth_bps(25_000_000_000)
///     .queue_limit_bytes(256 * 1024)
///     .loss(0.001)
///     .red(Red::new(5_000, 200_000, 0.01));
/// assert_eq!(lossy.bandwidth_bps, Some(25_000_000_000));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinkConfig {
    /// Propagation delay, added after serialisation.
    pub latency: Duration,
    /// Extra delay per frame, uniform in `0..=jitter` (nanosecond resolution).
    pub jitter: Duration,
    /// Line rate in bits per second; `None` (or 0) is unlimited, frames take no time to send.
    pub bandwidth_bps: Option<u64>,
    /// Tail-drop limit on the backlog in bytes (see the module documentation).
    pub queue_limit_bytes: Option<usize>,
    /// Probability that a frame is lost on the wire.
    pub loss: f64,
    /// Probability that a frame is delivered twice.
    pub duplicate: f64,
    /// Probability that a frame is held back by [`reorder_delay`](Self::reorder_delay).
    pub reorder: f64,
    /// How long a reordered frame is held back.
    pub reorder_delay: Duration,
    /// Probability that one bit of a frame is flipped.
    pub corrupt: f64,
    /// Probability that an ECT frame is marked CE, independently of the queue.
    pub ce_mark: f64,
    /// Queue-depth-driven CE marking.
    pub red: Option<Red>,
}

impl LinkConfig {
    /// A perfect link (the same as `default()`).
    pub fn new() -> Self {
        Self::default()
    }

    /// Set [`latency`](Self::latency).
    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Set [`jitter`](Self::jitter).
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// Limit the line rate to `bps` bits per second (0 means unlimited).
    pub fn bandwidth_bps(mut self, bps: u64) -> Self {
        self.bandwidth_bps = Some(bps);
        self
    }

    /// Tail-drop frames that would take the backlog above `bytes`.
    pub fn queue_limit_bytes(mut self, bytes: usize) -> Self {
        self.queue_limit_bytes = Some(bytes);
        self
    }

    /// Set [`loss`](Self::loss).
    pub fn loss(mut self, p: f64) -> Self {
        self.loss = p;
        self
    }

    /// Set [`duplicate`](Self::duplicate).
    pub fn duplicate(mut self, p: f64) -> Self {
        self.duplicate = p;
        self
    }

    /// Hold back a fraction `p` of the frames by `delay`.
    pub fn reorder(mut self, p: f64, delay: Duration) -> Self {
        self.reorder = p;
        self.reorder_delay = delay;
        self
    }

    /// Set [`reorder_delay`](Self::reorder_delay) alone.
    pub fn reorder_delay(mut self, delay: Duration) -> Self {
        self.reorder_delay = delay;
        self
    }

    /// Set [`corrupt`](Self::corrupt).
    pub fn corrupt(mut self, p: f64) -> Self {
        self.corrupt = p;
        self
    }

    /// Set [`ce_mark`](Self::ce_mark).
    pub fn ce_mark(mut self, p: f64) -> Self {
        self.ce_mark = p;
        self
    }

    /// Mark ECT frames by queue depth with `red`.
    pub fn red(mut self, red: Red) -> Self {
        self.red = Some(red);
        self
    }
}

/// Counters of one link, or of the whole network (see [`Network::total_stats`]).
///
/// Each counter records an event at the stage where it happens (see the module
/// documentation), so a frame marked CE and then lost on the wire counts in both `ce_marked`
/// and `dropped_loss`. Once nothing is in flight,
/// `sent + duplicated == delivered + dropped_loss + dropped_queue`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames handed to [`Network::send`].
    pub sent: u64,
    /// Frames handed out by [`Network::poll_deliver`], copies included.
    pub delivered: u64,
    /// Frames lost on the wire (`loss`).
    pub dropped_loss: u64,
    /// Frames tail-dropped by the queue limit.
    pub dropped_queue: u64,
    /// Frames that were delivered twice (copies made).
    pub duplicated: u64,
    /// Frames held back by `reorder_delay`.
    pub reordered: u64,
    /// Frames with a bit flipped.
    pub corrupted: u64,
    /// ECT frames marked CE (randomly or by RED).
    pub ce_marked: u64,
    /// Bytes handed to `send`.
    pub bytes_sent: u64,
    /// Bytes handed out by `poll_deliver`, copies included.
    pub bytes_delivered: u64,
    /// The largest backlog seen, in bytes, just after admitting a frame (for the totals,
    /// the largest of any link).
    pub max_queue_bytes: u64,
}

impl LinkStats {
    /// Add `other`'s counters to these (the maximum for `max_queue_bytes`).
    pub fn merge(&mut self, other: &LinkStats) {
        self.sent += other.sent;
        self.delivered += other.delivered;
        self.dropped_loss += other.dropped_loss;
        self.dropped_queue += other.dropped_queue;
        self.duplicated += other.duplicated;
        self.reordered += other.reordered;
        self.corrupted += other.corrupted;
        self.ce_marked += other.ce_marked;
        self.bytes_sent += other.bytes_sent;
        self.bytes_delivered += other.bytes_delivered;
        self.max_queue_bytes = self.max_queue_bytes.max(other.max_queue_bytes);
    }
}

/// A frame handed out by [`Network::poll_deliver`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The receiving endpoint.
    pub to: EndpointId,
    /// The sending endpoint.
    pub from: EndpointId,
    /// When the frame arrived (its scheduled delivery time, which is `<=` the `now` given to
    /// `poll_deliver`).
    pub at: Instant,
    /// When the frame was handed to [`Network::send`].
    pub sent: Instant,
    /// The frame's bytes, after any marking or corruption.
    pub frame: Vec<u8>,
}

/// A link's state.
#[derive(Debug)]
struct Link {
    from: EndpointId,
    to: EndpointId,
    config: LinkConfig,
    stream: Stream,
    stats: LinkStats,
    /// The link's queue and serialisation (configured from `config` at every send).
    queue: EgressQueue,
}

impl LinkConfig {
    /// The queue part of the configuration.
    fn egress(&self) -> EgressConfig {
        EgressConfig {
            rate_bps: self.bandwidth_bps,
            limit_bytes: self.queue_limit_bytes.map(|l| l as u64),
            red: self.red,
        }
    }
}

/// A frame in flight, ordered so that `BinaryHeap` pops the earliest `(at, seq)` first.
#[derive(Debug)]
struct Pending {
    at: Instant,
    seq: u64,
    sent: Instant,
    link: u32,
    frame: Vec<u8>,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// A deterministic network of endpoints joined by one-directional links. See the module
/// documentation for the model.
///
/// Methods that name a link by its endpoints (`send`, `stats`, `queue_bytes`) panic if the
/// link does not exist: that is a mistake in the test's topology, not a network condition.
/// The driving loop is:
///
/// ```text
/// while let Some(t) = net.next_event().min(other deadlines) {
///     while let Some(d) = net.poll_deliver(t) { hand d.frame to d.to; it may call net.send(t, ..) }
/// }
/// ```
#[derive(Debug)]
pub struct Network {
    seed: u64,
    endpoints: u32,
    links: Vec<Link>,
    index: BTreeMap<(EndpointId, EndpointId), u32>,
    pending: BinaryHeap<Pending>,
    next_seq: u64,
}

impl Network {
    /// An empty network whose every random decision derives from `seed`.
    pub fn new(seed: u64) -> Self {
        Network {
            seed,
            endpoints: 0,
            links: Vec::new(),
            index: BTreeMap::new(),
            pending: BinaryHeap::new(),
            next_seq: 0,
        }
    }

    /// The seed given to [`Network::new`].
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Add an endpoint.
    pub fn add_endpoint(&mut self) -> EndpointId {
        let id = EndpointId(self.endpoints);
        self.endpoints += 1;
        id
    }

    /// Number of endpoints added.
    pub fn endpoint_count(&self) -> usize {
        self.endpoints as usize
    }

    /// Create the link `from → to` with `config`, or replace the configuration of an existing
    /// one (its counters, queue and frames in flight are kept). `from == to` is a loopback.
    ///
    /// # Panics
    /// If either endpoint was not made by this network's [`add_endpoint`](Self::add_endpoint).
    #[track_caller]
    pub fn connect(&mut self, from: EndpointId, to: EndpointId, config: LinkConfig) {
        assert!(
            from.0 < self.endpoints && to.0 < self.endpoints,
            "connect({from}, {to}): unknown endpoint"
        );
        if let Some(&i) = self.index.get(&(from, to)) {
            self.links[i as usize].config = config;
            return;
        }
        let i = u32::try_from(self.links.len()).expect("too many links");
        self.links.push(Link {
            from,
            to,
            config,
            stream: Stream::new(self.seed, from, to),
            stats: LinkStats::default(),
            queue: EgressQueue::new(config.egress()),
        });
        self.index.insert((from, to), i);
    }

    /// [`connect`](Self::connect) both `a → b` and `b → a` with the same configuration (the
    /// two directions remain independent links with their own queues and random streams).
    #[track_caller]
    pub fn connect_both(&mut self, a: EndpointId, b: EndpointId, config: LinkConfig) {
        self.connect(a, b, config);
        self.connect(b, a, config);
    }

    /// The configuration of `from → to`, if connected.
    pub fn link(&self, from: EndpointId, to: EndpointId) -> Option<&LinkConfig> {
        let i = *self.index.get(&(from, to))?;
        Some(&self.links[i as usize].config)
    }

    /// The configuration of `from → to` for changing conditions mid-run. Changes apply to
    /// frames sent afterwards; frames already queued or in flight keep their times.
    pub fn link_mut(&mut self, from: EndpointId, to: EndpointId) -> Option<&mut LinkConfig> {
        let i = *self.index.get(&(from, to))?;
        Some(&mut self.links[i as usize].config)
    }

    #[track_caller]
    fn link_index(&self, from: EndpointId, to: EndpointId) -> usize {
        match self.index.get(&(from, to)) {
            Some(&i) => i as usize,
            None => panic!("no link {from} -> {to}"),
        }
    }

    /// Hand `frame` to the link `from → to` at `now`. Every decision about the frame (drop,
    /// marking, corruption, duplication, delay) is taken here; the frame (and any copy) then
    /// waits for [`poll_deliver`](Self::poll_deliver). `now` should not go backwards on a
    /// link.
    ///
    /// # Panics
    /// If there is no link `from → to`.
    #[track_caller]
    pub fn send(&mut self, now: Instant, from: EndpointId, to: EndpointId, mut frame: Vec<u8>) {
        let li = self.link_index(from, to);
        let link = &mut self.links[li];
        let cfg = link.config;
        let stream = link.stream;
        let n = link.stats.sent;
        let len = frame.len() as u64;
        link.stats.sent += 1;
        link.stats.bytes_sent += len;

        // 1. The queue: tail drop, RED by the backlog the frame finds, serialisation.
        link.queue.set_config(cfg.egress());
        let (red_mark, finish) = match link.queue.offer(now, len, || stream.draw(n, Slot::Red)) {
            Verdict::Dropped { .. } => {
                link.stats.dropped_queue += 1;
                return;
            }
            Verdict::Queued { mark, finish, .. } => (mark, finish),
        };
        link.stats.max_queue_bytes = link.queue.max_backlog();

        // 2. Marking, by the queue the frame joins or at random.
        let mark = hit(stream.draw(n, Slot::CeMark), cfg.ce_mark) | red_mark;
        if mark && mark_ce(&mut frame) {
            link.stats.ce_marked += 1;
        }

        // 3. The wire.
        if hit(stream.draw(n, Slot::Loss), cfg.loss) {
            link.stats.dropped_loss += 1;
            return;
        }
        if hit(stream.draw(n, Slot::Corrupt), cfg.corrupt)
            && flip_bit(&mut frame, stream.draw(n, Slot::CorruptBit))
        {
            link.stats.corrupted += 1;
        }

        // 4. Arrival.
        let arrive = finish + cfg.latency;
        let mut at = arrive + jitter(stream.draw(n, Slot::Jitter), cfg.jitter);
        if hit(stream.draw(n, Slot::Reorder), cfg.reorder) {
            link.stats.reordered += 1;
            at += cfg.reorder_delay;
        }
        let copy = hit(stream.draw(n, Slot::Duplicate), cfg.duplicate).then(|| {
            link.stats.duplicated += 1;
            let at = arrive + jitter(stream.draw(n, Slot::CopyJitter), cfg.jitter);
            (at, frame.clone())
        });
        let link = li as u32;
        self.push(at, now, link, frame);
        if let Some((at, frame)) = copy {
            self.push(at, now, link, frame);
        }
    }

    fn push(&mut self, at: Instant, sent: Instant, link: u32, frame: Vec<u8>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.pending.push(Pending {
            at,
            seq,
            sent,
            link,
            frame,
        });
    }

    /// The next frame due at or before `now`, in delivery-time order (frames due at the same
    /// time in the order they were scheduled), or `None` if nothing is due yet.
    pub fn poll_deliver(&mut self, now: Instant) -> Option<Delivery> {
        if self.pending.peek()?.at > now {
            return None;
        }
        let p = self.pending.pop()?;
        let link = &mut self.links[p.link as usize];
        link.stats.delivered += 1;
        link.stats.bytes_delivered += p.frame.len() as u64;
        Some(Delivery {
            to: link.to,
            from: link.from,
            at: p.at,
            sent: p.sent,
            frame: p.frame,
        })
    }

    /// When the earliest frame in flight is due, if any.
    pub fn next_event(&self) -> Option<Instant> {
        self.pending.peek().map(|p| p.at)
    }

    /// Frames scheduled and not yet delivered, on all links.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// The counters of the link `from → to`.
    ///
    /// # Panics
    /// If there is no such link.
    #[track_caller]
    pub fn stats(&self, from: EndpointId, to: EndpointId) -> LinkStats {
        self.links[self.link_index(from, to)].stats
    }

    /// The counters of every link added up (`max_queue_bytes` is the largest of any link).
    pub fn total_stats(&self) -> LinkStats {
        let mut t = LinkStats::default();
        for l in &self.links {
            t.merge(&l.stats);
        }
        t
    }

    /// The backlog of `from → to` at `now` in bytes: frames admitted and not fully
    /// serialised by then (for a time series, sample it with non-decreasing `now` no earlier
    /// than the last `send` on the link).
    ///
    /// # Panics
    /// If there is no such link.
    #[track_caller]
    pub fn queue_bytes(&self, from: EndpointId, to: EndpointId, now: Instant) -> u64 {
        self.links[self.link_index(from, to)].queue.backlog(now)
    }

    /// When the link `from → to` finishes serialising what it holds (its idle time, if that
    /// is in the past).
    ///
    /// # Panics
    /// If there is no such link.
    #[track_caller]
    pub fn busy_until(&self, from: EndpointId, to: EndpointId) -> Instant {
        self.links[self.link_index(from, to)].queue.busy_until()
    }
}

/// A jitter in `0..=max` nanoseconds from a uniform `x`.
#[inline]
fn jitter(x: u64, max: Duration) -> Duration {
    let max = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    if max == 0 {
        Duration::ZERO
    } else {
        Duration::from_nanos(scale(x, max.saturating_add(1)))
    }
}

/// The offset of the IP header in an Ethernet frame and whether it is IPv6, after up to two
/// 802.1Q / 802.1ad tags. `None` if the frame does not carry IP.
fn ip_offset(frame: &[u8]) -> Option<(usize, bool)> {
    let mut off = 12;
    for _ in 0..3 {
        let et = u16::from_be_bytes([*frame.get(off)?, *frame.get(off + 1)?]);
        match et {
            ETHERTYPE_VLAN | ETHERTYPE_QINQ => off += 4,
            ETHERTYPE_IPV4 => return Some((off + 2, false)),
            ETHERTYPE_IPV6 => return Some((off + 2, true)),
            _ => return None,
        }
    }
    None
}

/// Mark an ECT IP frame CE in place (Ethernet, up to two VLAN tags, IPv4 or IPv6; the IPv4
/// header checksum is fixed). Returns whether the frame was changed: false for a frame that
/// is not IP or not ECN-capable. `ferroce switch` marks with it too.
pub fn mark_ce(frame: &mut [u8]) -> bool {
    let Some((off, v6)) = ip_offset(frame) else {
        return false;
    };
    let ip = &mut frame[off..];
    let version = ip.first().map(|b| b >> 4);
    if version != Some(if v6 { 6 } else { 4 }) {
        return false;
    }
    matches!(read_ecn(ip), Some(Ecn::Ect0 | Ecn::Ect1)) && set_ecn(ip, Ecn::Ce)
}

/// Flip one bit of `frame` chosen by `x` (see the module documentation for which bits).
/// Returns false for an empty frame.
fn flip_bit(frame: &mut [u8], x: u64) -> bool {
    if frame.is_empty() {
        return false;
    }
    // Byte ranges the ICRC protects and does not mask: UDP ports and length, BTH bytes 0-3,
    // BTH byte 5 to the end of the ICRC.
    let protected = crate::wire::packet::decode_frame(frame)
        .ok()
        .map(|p| p.offsets)
        .map(|o| [o.udp..o.udp + 6, o.bth..o.bth + 4, o.bth + 5..o.end]);
    let byte = match protected {
        Some(ranges) => {
            let total: usize = ranges.iter().map(|r| r.len()).sum();
            let mut bit = scale(x, total as u64 * 8) as usize;
            let mut at = None;
            for r in ranges {
                if bit < r.len() * 8 {
                    at = Some((r.start + bit / 8, bit % 8));
                    break;
                }
                bit -= r.len() * 8;
            }
            at
        }
        None => {
            let bit = scale(x, frame.len() as u64 * 8) as usize;
            Some((bit / 8, bit % 8))
        }
    };
    match byte {
        Some((i, b)) => {
            frame[i] ^= 1 << b;
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests;
