//! `ferroce switch`: a userspace Ethernet switch with a DCQCN congestion point, for testbeds
//! of network namespaces (`tools/dcqcn-testbed`).
//!
//! **What it is.** An L2 learning switch over AF_PACKET sockets (one per port, no BPF
//! filter, so ARP, NDP and TCP cross it as well as RoCE):
//!
//! - it learns the source MAC of every frame on the port it came in on (a station that moves
//!   is re-learned); an entry not refreshed for [`FDB_AGEING`] (300 s, IEEE 802.1Q's default
//!   ageing time) is forgotten, and the table holds at most [`FDB_MAX`] stations: when it is
//!   full of live entries a new source is not learned (counted in `fdb_full`; frames to it
//!   are flooded), so a flood of forged source MACs neither grows the switch's memory nor
//!   evicts the stations already learned (issue 17 finding 7);
//! - it forwards a unicast frame whose destination it knows to that port, and floods
//!   broadcast, multicast and unknown unicast to every other port;
//! - it never sends a frame back out of the port it came in on (a known destination behind
//!   the ingress port is filtered).
//!
//! **The congestion point.** Every egress port has one FIFO queue drained by a *virtual link*
//! of the bottleneck rate: the simulator's egress queue ([`crate::sim::EgressQueue`], one
//! implementation for the simulator, the incast model and this switch). Each frame admitted
//! is scheduled to start when the link finishes the previous one, and takes its length plus
//! [`WIRE_OVERHEAD`] bytes (preamble, FCS, inter-frame gap) at the line rate, as on Ethernet.
//! A frame is handed to the kernel when its virtual start time has come. The backlog is the
//! link's outstanding work in those wire bytes (the frames not fully sent by the virtual
//! link, the one on the wire counted whole), so the queue the marking sees, the rate and the
//! drops do not depend on when this thread happens to run: on a loaded machine a late round
//! sends everything that became due meanwhile (a token bucket with a small burst would
//! instead lose the capacity of every moment the thread was descheduled). Without a rate
//! limit the backlog is the frame bytes held here, not yet handed to the kernel. On enqueue,
//! with the backlog the frame finds (itself not included):
//!
//! 1. **tail drop** if the backlog plus the frame would exceed the buffer (a frame that finds
//!    the queue empty is always taken);
//! 2. **RED/ECN** ([`Red::probability`], the same profile as the simulator's): with that
//!    probability, drawn from a seeded [`SplitMix64`] (one draw per frame that can be
//!    marked), an ECN-capable (ECT(0)/ECT(1)) IPv4 or IPv6 frame, untagged or with one or two
//!    802.1Q/802.1ad tags, is marked CE in place ([`crate::sim::mark_ce`]:
//!    `wire::ip::set_ecn` at the IP header's offset, IPv4 checksum fixed; the ICRC masks the
//!    ECN bits and stays valid). A frame that is not ECN-capable is forwarded unmarked
//!    (counted in `red_not_ect`), never dropped by RED.
//!
//! The decisions are made by [`SwitchCore`], a sans-IO state machine (frames in, frames out,
//! time as an argument) that the unit tests drive without sockets; [`run`] is the I/O loop:
//! one thread, each round receiving a batch from every port, then sending from every queue
//! what its token bucket allows, polling busily or, when every queue is empty and nothing
//! arrives, sleeping in `poll(2)` on all ports. Ports receive with `recvmmsg(2)` (one copy
//! per frame, but each frame is there as soon as the kernel queues it; a TPACKET_V3 ring
//! hands frames over a block at a time, up to 1 ms late when traffic is sparse, which would
//! add milliseconds to every ACK's and CNP's trip) and send with `sendmmsg(2)`.
//!
//! Counters per port (rx/tx frames and bytes, tail drops, CE marks, the largest backlog, the
//! kernel's receive-ring drops, send failures) are printed at exit (SIGINT, SIGTERM or the
//! configured duration) and optionally written as JSON. `--pcap` records, for one chosen
//! port, every frame the switch received on it and every frame it sent out of it (as a tap on
//! that link would see them), after marking.
//!
//! Needs CAP_NET_RAW (AF_PACKET), and CAP_SYS_ADMIN to enter a network namespace.

use crate::io::af_packet::AfPacketRx;
use crate::io::{AfPacketConfig, AfPacketDevice, AfPacketTx, PacketDevice};
use crate::pcap::capture::PcapSink;
use crate::sim::{mark_ce, Admission, EgressConfig, EgressQueue, Red, SplitMix64, Verdict};
use crate::time::Instant;
use crate::wire::MacAddr;
use std::collections::{HashMap, VecDeque};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Most stations the forwarding table holds.
pub const FDB_MAX: usize = 4096;
/// A station not heard from for this long is forgotten (IEEE 802.1Q's default ageing time).
pub const FDB_AGEING: Duration = Duration::from_secs(300);

/// Bytes an Ethernet link spends on a frame beyond what the frame buffer holds: preamble and
/// start delimiter (8), FCS (4) and the minimum inter-frame gap (12).
pub const WIRE_OVERHEAD: usize = 24;

/// The congestion point's parameters (shared by every egress port).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QueueConfig {
    /// Bottleneck rate of every egress port in bits/s, counting [`WIRE_OVERHEAD`] per frame;
    /// `None`: as fast as the port can send.
    pub rate_bps: Option<u64>,
    /// Tail-drop limit on the backlog of a port, in bytes.
    pub buffer_bytes: usize,
    /// ECN marking by backlog; `None`: no marking.
    pub red: Option<Red>,
    /// Seed of the marking decisions.
    pub seed: u64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            rate_bps: None,
            buffer_bytes: 1_000_000,
            red: None,
            seed: 1,
        }
    }
}

/// Counters of one port.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PortCounters {
    /// Frames received on the port (handed to the switching logic).
    pub rx_frames: u64,
    /// Bytes of those frames.
    pub rx_bytes: u64,
    /// Frames sent out of the port.
    pub tx_frames: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// Frames tail-dropped at this port's egress queue (buffer full).
    pub drops: u64,
    /// Frames marked CE at this port's egress queue.
    pub ce_marked: u64,
    /// Frames RED selected for marking that were not ECN-capable (forwarded unmarked).
    pub red_not_ect: u64,
    /// Frames flooded out of this port (broadcast, multicast, unknown unicast).
    pub flooded: u64,
    /// Frames received here for a station learned on this same port (not forwarded).
    pub filtered: u64,
    /// Frames too large for this port's MTU (not forwarded).
    pub oversize: u64,
    /// Frames received here whose source was not learned: the forwarding table was full of
    /// live entries ([`FDB_MAX`]).
    pub fdb_full: u64,
    /// Largest backlog of the egress queue, in bytes (frames and their wire overhead).
    pub max_queue_bytes: u64,
    /// Frames offered to the egress queue (queued or dropped), and the sum of the backlogs
    /// they found: their ratio is the mean queue an arriving frame sees.
    pub arrivals: u64,
    /// The sum of the backlogs those frames found (bytes).
    pub queue_sum_bytes: u64,
    /// Frames the kernel dropped before the switch saw them (receive ring full), and frames
    /// the backend could not send: from the AF_PACKET device.
    pub kernel_rx_drops: u64,
    /// Frames the backend could not send.
    pub tx_errors: u64,
}

/// A frame waiting in an egress queue.
type Frame = Vec<u8>;

struct Port {
    /// Frames with the virtual instant their transmission starts.
    queue: VecDeque<(Instant, Frame)>,
    /// Frame bytes in `queue`.
    queue_bytes: usize,
    /// The virtual link (with a rate limit): backlog in wire bytes, start times.
    link: EgressQueue,
    /// Largest frame the port can send.
    capacity: usize,
    c: PortCounters,
}

/// The switching logic and the egress queues, without any I/O (see the module documentation).
pub struct SwitchCore {
    ports: Vec<Port>,
    /// Station → (port, when last heard from).
    fdb: HashMap<MacAddr, (usize, Instant)>,
    fdb_max: usize,
    fdb_ageing: Duration,
    cfg: QueueConfig,
    rng: SplitMix64,
    /// Spare frame buffers (no allocation per frame in the steady state).
    pool: Vec<Frame>,
}

impl QueueConfig {
    /// The egress queue of a port.
    fn egress(&self) -> EgressConfig {
        EgressConfig {
            rate_bps: self.rate_bps,
            limit_bytes: Some(self.buffer_bytes as u64),
            red: self.red,
        }
    }
}

impl PortCounters {
    /// The mean backlog arriving frames found (bytes).
    pub fn mean_queue_bytes(&self) -> f64 {
        if self.arrivals == 0 {
            0.0
        } else {
            self.queue_sum_bytes as f64 / self.arrivals as f64
        }
    }
}

impl SwitchCore {
    /// A switch whose port `i` can send frames of up to `capacities[i]` bytes.
    pub fn new(capacities: &[usize], cfg: QueueConfig) -> Self {
        let cfg = QueueConfig {
            rate_bps: cfg.rate_bps.filter(|&r| r > 0),
            ..cfg
        };
        let egress = cfg.egress();
        SwitchCore {
            ports: capacities
                .iter()
                .map(|&capacity| Port {
                    queue: VecDeque::new(),
                    queue_bytes: 0,
                    link: EgressQueue::new(egress),
                    capacity,
                    c: PortCounters::default(),
                })
                .collect(),
            fdb: HashMap::new(),
            fdb_max: FDB_MAX,
            fdb_ageing: FDB_AGEING,
            rng: SplitMix64::new(cfg.seed),
            cfg,
            pool: Vec::new(),
        }
    }

    /// Number of ports.
    pub fn port_count(&self) -> usize {
        self.ports.len()
    }

    /// Other limits for the forwarding table than [`FDB_MAX`] and [`FDB_AGEING`].
    pub fn set_fdb_limits(&mut self, max: usize, ageing: Duration) {
        self.fdb_max = max;
        self.fdb_ageing = ageing;
    }

    /// The port a MAC address was learned on (aged entries included until the next frame
    /// finds them stale).
    pub fn lookup(&self, mac: &MacAddr) -> Option<usize> {
        self.fdb.get(mac).map(|e| e.0)
    }

    /// Learned stations.
    pub fn fdb_len(&self) -> usize {
        self.fdb.len()
    }

    fn live(&self, heard: Instant, now: Instant) -> bool {
        now.saturating_duration_since(heard) < self.fdb_ageing
    }

    /// Learn `src` on `port` at `now`, within the table's bound.
    fn learn(&mut self, now: Instant, port: usize, src: MacAddr) {
        if let Some(e) = self.fdb.get_mut(&src) {
            *e = (port, now);
            return;
        }
        if self.fdb.len() >= self.fdb_max {
            // Forget the stations gone quiet; if every one is live, learn nothing.
            let age = self.fdb_ageing;
            self.fdb
                .retain(|_, e| now.saturating_duration_since(e.1) < age);
            if self.fdb.len() >= self.fdb_max {
                self.ports[port].c.fdb_full += 1;
                return;
            }
        }
        self.fdb.insert(src, (port, now));
    }

    /// The counters of `port`.
    pub fn counters(&self, port: usize) -> &PortCounters {
        &self.ports[port].c
    }

    /// The counters of `port`, to update.
    pub fn counters_mut(&mut self, port: usize) -> &mut PortCounters {
        &mut self.ports[port].c
    }

    /// Frame bytes held at `port`'s egress (not yet handed to the kernel).
    pub fn queue_bytes(&self, port: usize) -> usize {
        self.ports[port].queue_bytes
    }

    /// The backlog of `port` at `now`: the bytes its link has still to send (frames not
    /// fully sent, with their wire overhead); without a rate limit, the frame bytes held.
    pub fn backlog_bytes(&self, now: Instant, port: usize) -> usize {
        let p = &self.ports[port];
        match self.cfg.rate_bps {
            Some(_) => usize::try_from(p.link.backlog(now)).unwrap_or(usize::MAX),
            None => p.queue_bytes,
        }
    }

    /// Frames waiting at `port`'s egress.
    pub fn queue_len(&self, port: usize) -> usize {
        self.ports[port].queue.len()
    }

    /// Whether any egress queue holds a frame.
    pub fn any_queued(&self) -> bool {
        self.ports.iter().any(|p| !p.queue.is_empty())
    }

    /// A frame arrived on `port` at `now`: learn, then queue it where it goes.
    pub fn ingress(&mut self, now: Instant, port: usize, frame: &[u8]) {
        let c = &mut self.ports[port].c;
        c.rx_frames += 1;
        c.rx_bytes += frame.len() as u64;
        if frame.len() < 14 {
            return;
        }
        let mut dst = [0u8; 6];
        let mut src = [0u8; 6];
        dst.copy_from_slice(&frame[..6]);
        src.copy_from_slice(&frame[6..12]);
        let (dst, src) = (MacAddr(dst), MacAddr(src));
        if src.0[0] & 1 == 0 && src != MacAddr::ZERO {
            self.learn(now, port, src);
        }
        let known = (dst.0[0] & 1 == 0)
            .then(|| self.fdb.get(&dst).copied())
            .flatten()
            .filter(|&(_, heard)| self.live(heard, now))
            .map(|(p, _)| p);
        match known {
            Some(out) if out == port => self.ports[port].c.filtered += 1,
            Some(out) => self.enqueue(now, out, frame),
            None => {
                for out in 0..self.ports.len() {
                    if out != port {
                        self.ports[out].c.flooded += 1;
                        self.enqueue(now, out, frame);
                    }
                }
            }
        }
    }

    /// Tail drop and RED/ECN marking (the egress queue's), then the queue.
    fn enqueue(&mut self, now: Instant, out: usize, frame: &[u8]) {
        let backlog = self.backlog_bytes(now, out);
        let egress = self.cfg.egress();
        let p = &mut self.ports[out];
        let len = frame.len();
        if len > p.capacity {
            p.c.oversize += 1;
            return;
        }
        p.c.arrivals += 1;
        p.c.queue_sum_bytes = p.c.queue_sum_bytes.saturating_add(backlog as u64);
        let rng = &mut self.rng;
        let draw = || rng.next_u64();
        let admitted = match self.cfg.rate_bps {
            // The virtual link: the frame with its wire overhead.
            Some(_) => match p.link.offer(now, (len + WIRE_OVERHEAD) as u64, draw) {
                Verdict::Dropped { .. } => None,
                Verdict::Queued { mark, start, .. } => {
                    p.c.max_queue_bytes = p.link.max_backlog();
                    Some((mark, start))
                }
            },
            // No rate: the frames held here are the backlog.
            None => match egress.admit(backlog as u64, len as u64, draw) {
                Admission::Drop => None,
                Admission::Accept { mark } => {
                    p.c.max_queue_bytes = p.c.max_queue_bytes.max((p.queue_bytes + len) as u64);
                    Some((mark, now))
                }
            },
        };
        let Some((mark, start)) = admitted else {
            p.c.drops += 1;
            return;
        };
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        if mark {
            if mark_ce(&mut buf) {
                p.c.ce_marked += 1;
            } else {
                p.c.red_not_ect += 1;
            }
        }
        p.queue_bytes += len;
        p.queue.push_back((start, buf));
    }

    /// The instant the head frame of `port` starts on its link (`None`: the queue is empty).
    pub fn next_departure(&self, port: usize) -> Option<Instant> {
        self.ports[port].queue.front().map(|&(start, _)| start)
    }

    /// Take the head frame of `port` if its transmission has started by `now`. Give the
    /// buffer back with [`Self::recycle`] once sent.
    pub fn pop_ready(&mut self, now: Instant, port: usize) -> Option<Frame> {
        let p = &mut self.ports[port];
        if p.queue.front()?.0 > now {
            return None;
        }
        let (_, f) = p.queue.pop_front()?;
        let len = f.len();
        p.queue_bytes -= len;
        p.c.tx_frames += 1;
        p.c.tx_bytes += len as u64;
        Some(f)
    }

    /// Return a frame buffer for reuse.
    pub fn recycle(&mut self, f: Frame) {
        if self.pool.len() < 4096 {
            self.pool.push(f);
        }
    }
}

/// How the switch thread waits when it has nothing to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchPoll {
    /// Never sleep (one core at 100 %).
    Busy,
    /// Spin this many idle rounds, then sleep in `poll(2)` (at most 1 ms) while every queue
    /// is empty; while frames wait for their link, sleep until the first is due (`ppoll(2)`,
    /// which also wakes on arrivals).
    Adaptive {
        /// Idle rounds before sleeping.
        spins: u32,
    },
}

/// Where `--pcap` writes and what it records.
#[derive(Clone, Debug)]
pub struct PcapConfig {
    /// The capture file.
    pub path: PathBuf,
    /// The port (interface name) whose traffic is recorded, both directions.
    pub port: String,
    /// Stop recording after this many frames.
    pub max_frames: Option<u64>,
}

/// Everything `ferroce switch` is told.
#[derive(Clone, Debug)]
pub struct SwitchConfig {
    /// Interface names, in port order.
    pub ports: Vec<String>,
    /// Enter this network namespace first (`/run/netns/NAME`).
    pub netns: Option<String>,
    /// Every egress queue's rate, buffer and RED marking.
    pub queue: QueueConfig,
    /// Stop after this long (also stops on SIGINT/SIGTERM).
    pub duration: Option<Duration>,
    /// Record one port's traffic.
    pub pcap: Option<PcapConfig>,
    /// Write the final counters as JSON here (`-`: standard output).
    pub json: Option<PathBuf>,
    /// How the switch thread waits when idle.
    pub poll: SwitchPoll,
    /// Receive with a TPACKET_V3 ring instead of `recvmmsg` (the default): no copy, but a
    /// block reaches the switch only when full or after 1 ms, which delays sparse frames.
    pub rx_ring: bool,
    /// Receive buffering of each port: `rx_blocks` blocks of `rx_block_kib` KiB (the ring, or
    /// the socket buffer size for `recvmmsg`).
    pub rx_block_kib: usize,
    /// Blocks per port (see `rx_block_kib`).
    pub rx_blocks: usize,
    /// Print a one-line progress report this often.
    pub stats_interval: Option<Duration>,
}

impl SwitchConfig {
    /// A switch between `ports` with the defaults: no rate limit or marking, adaptive
    /// polling, `recvmmsg` receive.
    pub fn new(ports: Vec<String>) -> Self {
        SwitchConfig {
            ports,
            netns: None,
            queue: QueueConfig::default(),
            duration: None,
            pcap: None,
            json: None,
            poll: SwitchPoll::Adaptive { spins: 2000 },
            rx_ring: false,
            rx_block_kib: 32,
            rx_blocks: 128,
            stats_interval: None,
        }
    }
}

/// The final report.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SwitchReport {
    /// How long it ran.
    pub seconds: f64,
    /// The egress rate limit (bits/s), if any.
    pub rate_bps: Option<u64>,
    /// Each egress queue's buffer.
    pub buffer_bytes: usize,
    /// RED Kmin, if marking.
    pub kmin_bytes: Option<usize>,
    /// RED Kmax, if marking.
    pub kmax_bytes: Option<usize>,
    /// RED marking probability at Kmax, if marking.
    pub pmax: Option<f64>,
    /// Stations learned.
    pub learned: usize,
    /// Each port's name and counters, in port order.
    pub ports: Vec<(String, PortCounters)>,
    /// The sum over the ports.
    pub total: PortCounters,
    /// Frames written to the capture.
    pub pcap_frames: u64,
}

impl SwitchReport {
    /// Human-readable table.
    pub fn text(&self) -> String {
        let mut s =
            format!(
            "ferroce switch: {} ports, {:.3} s, rate {}, buffer {} KB, {}, {} stations learned\n",
            self.ports.len(),
            self.seconds,
            self.rate_bps
                .map(|r| format!("{:.3} Gb/s", r as f64 / 1e9))
                .unwrap_or_else(|| "unlimited".into()),
            self.buffer_bytes as f64 / 1000.0,
            match (self.kmin_bytes, self.kmax_bytes, self.pmax) {
                (Some(a), Some(b), Some(p)) =>
                    format!("RED kmin {} KB kmax {} KB pmax {p}", a as f64 / 1e3, b as f64 / 1e3),
                _ => "no ECN marking".into(),
            },
            self.learned
        );
        s.push_str(&format!(
            "{:<12} {:>10} {:>13} {:>10} {:>13} {:>8} {:>9} {:>8} {:>8} {:>9} {:>10} {:>8} {:>8}\n",
            "port",
            "rx_frames",
            "rx_bytes",
            "tx_frames",
            "tx_bytes",
            "drops",
            "ce_marked",
            "not_ect",
            "flooded",
            "max_q_kb",
            "mean_q_kb",
            "k_rxdrop",
            "tx_err"
        ));
        let row = |name: &str, c: &PortCounters| {
            format!(
                "{:<12} {:>10} {:>13} {:>10} {:>13} {:>8} {:>9} {:>8} {:>8} {:>9.1} {:>10.1} {:>8} {:>8}\n",
                name,
                c.rx_frames,
                c.rx_bytes,
                c.tx_frames,
                c.tx_bytes,
                c.drops,
                c.ce_marked,
                c.red_not_ect,
                c.flooded,
                c.max_queue_bytes as f64 / 1000.0,
                c.mean_queue_bytes() / 1000.0,
                c.kernel_rx_drops,
                c.tx_errors
            )
        };
        for (n, c) in &self.ports {
            s.push_str(&row(n, c));
        }
        s.push_str(&row("total", &self.total));
        if self.pcap_frames > 0 {
            s.push_str(&format!("pcap: {} frames\n", self.pcap_frames));
        }
        s
    }
}

fn wall() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

struct Tap {
    port: usize,
    sink: PcapSink<BufWriter<std::fs::File>>,
    left: Option<u64>,
    frames: u64,
    errors: u64,
}

impl Tap {
    fn record(&mut self, frame: &[u8]) {
        if self.left == Some(0) {
            return;
        }
        if self.sink.write(wall(), frame).is_err() {
            self.errors += 1;
            return;
        }
        self.frames += 1;
        if let Some(l) = &mut self.left {
            *l -= 1;
        }
    }
}

fn report(
    cfg: &SwitchConfig,
    core: &SwitchCore,
    devs: &[AfPacketDevice],
    secs: f64,
    pcap_frames: u64,
) -> SwitchReport {
    let mut ports = Vec::new();
    let mut total = PortCounters::default();
    for (i, name) in cfg.ports.iter().enumerate() {
        let mut c = core.counters(i).clone();
        let io = devs[i].stats();
        c.kernel_rx_drops = io.rx_dropped;
        c.tx_errors = io.tx_dropped;
        total.rx_frames += c.rx_frames;
        total.rx_bytes += c.rx_bytes;
        total.tx_frames += c.tx_frames;
        total.tx_bytes += c.tx_bytes;
        total.drops += c.drops;
        total.ce_marked += c.ce_marked;
        total.red_not_ect += c.red_not_ect;
        total.flooded += c.flooded;
        total.filtered += c.filtered;
        total.oversize += c.oversize;
        total.max_queue_bytes = total.max_queue_bytes.max(c.max_queue_bytes);
        total.arrivals += c.arrivals;
        total.queue_sum_bytes = total.queue_sum_bytes.saturating_add(c.queue_sum_bytes);
        total.kernel_rx_drops += c.kernel_rx_drops;
        total.tx_errors += c.tx_errors;
        ports.push((name.clone(), c));
    }
    let red = cfg.queue.red;
    SwitchReport {
        seconds: secs,
        rate_bps: cfg.queue.rate_bps.filter(|&r| r > 0),
        buffer_bytes: cfg.queue.buffer_bytes,
        kmin_bytes: red.map(|r| r.kmin_bytes),
        kmax_bytes: red.map(|r| r.kmax_bytes),
        pmax: red.map(|r| r.pmax),
        learned: core.fdb_len(),
        ports,
        total,
        pcap_frames,
    }
}

/// Why the switch cannot start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    /// Fewer than two ports.
    #[error("a switch needs at least two ports (--port IFACE, repeated)")]
    TooFewPorts,
    /// A port given twice.
    #[error("port {0} given twice")]
    DuplicatePort(String),
    /// RED's Kmin above its Kmax.
    #[error("--kmin-kb must not exceed --kmax-kb")]
    KminAboveKmax,
    /// RED's marking probability outside [0, 1].
    #[error("--pmax must be in [0, 1]")]
    Pmax,
    /// No buffer.
    #[error("--buffer-kb must be positive")]
    ZeroBuffer,
    /// A capture port that is not a switch port.
    #[error("--pcap-port {0} is not one of the switch's ports")]
    PcapPort(String),
    /// A receive ring of no blocks.
    #[error("receive ring must have blocks")]
    NoRxBlocks,
    /// The network namespace could not be entered.
    #[error("{0}")]
    Netns(#[source] std::io::Error),
    /// The capture could not be started.
    #[error(transparent)]
    Capture(#[from] crate::pcap::capture::CaptureError),
    /// Frames that could not be written to the capture.
    #[error("{0} frames could not be written to the capture")]
    CaptureFrames(u64),
    /// The report could not be encoded.
    #[error("{0}")]
    Json(#[source] serde_json::Error),
    /// A system call failed.
    #[error("{what}: {err}{hint}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        err: std::io::Error,
        /// What to do about it, or empty.
        hint: &'static str,
    },
}

impl SwitchError {
    fn io(what: impl Into<String>, err: std::io::Error) -> SwitchError {
        SwitchError::Io {
            what: what.into(),
            err,
            hint: "",
        }
    }
}

/// Check the configuration before touching any socket.
pub fn validate(cfg: &SwitchConfig) -> Result<(), SwitchError> {
    if cfg.ports.len() < 2 {
        return Err(SwitchError::TooFewPorts);
    }
    for (i, p) in cfg.ports.iter().enumerate() {
        if cfg.ports[..i].contains(p) {
            return Err(SwitchError::DuplicatePort(p.clone()));
        }
    }
    if let Some(red) = cfg.queue.red {
        if red.kmin_bytes > red.kmax_bytes {
            return Err(SwitchError::KminAboveKmax);
        }
        if !(0.0..=1.0).contains(&red.pmax) {
            return Err(SwitchError::Pmax);
        }
    }
    if cfg.queue.buffer_bytes == 0 {
        return Err(SwitchError::ZeroBuffer);
    }
    if let Some(pc) = &cfg.pcap {
        if !cfg.ports.contains(&pc.port) {
            return Err(SwitchError::PcapPort(pc.port.clone()));
        }
    }
    if cfg.rx_block_kib == 0 || cfg.rx_blocks == 0 {
        return Err(SwitchError::NoRxBlocks);
    }
    Ok(())
}

/// Run the switch until SIGINT/SIGTERM or the configured duration; print the report to `out`
/// (and the JSON where configured) and return it.
pub fn run(cfg: &SwitchConfig, out: &mut dyn Write) -> Result<SwitchReport, SwitchError> {
    validate(cfg)?;
    if let Some(ns) = &cfg.netns {
        crate::io::enter_netns(ns).map_err(SwitchError::Netns)?;
    }
    let stop = crate::io::stop_on_sigint_sigterm()
        .map_err(|e| SwitchError::io("installing the SIGINT/SIGTERM handler", e))?;
    let mut devs = Vec::new();
    for name in &cfg.ports {
        let mut c = AfPacketConfig::new(name);
        c.filter = false;
        c.rx_block_size = cfg.rx_block_kib * 1024;
        c.rx_blocks = cfg.rx_blocks;
        c.rx_retire_ms = 1;
        c.rx = if cfg.rx_ring {
            AfPacketRx::Ring
        } else {
            AfPacketRx::Recvmmsg { batch: 64 }
        };
        c.tx = AfPacketTx::Sendmmsg { batch: 64 };
        let d = AfPacketDevice::open(&c).map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
                " (AF_PACKET needs CAP_NET_RAW: run as root)"
            } else {
                ""
            };
            SwitchError::Io {
                what: format!("port {name}"),
                err: e,
                hint,
            }
        })?;
        devs.push(d);
    }
    let caps: Vec<usize> = devs.iter().map(|d| d.frame_capacity()).collect();
    let mut core = SwitchCore::new(&caps, cfg.queue);
    let mut tap = match &cfg.pcap {
        Some(pc) => {
            let f = std::fs::File::create(&pc.path)
                .map_err(|e| SwitchError::io(pc.path.display().to_string(), e))?;
            Some(Tap {
                port: cfg.ports.iter().position(|p| *p == pc.port).unwrap_or(0),
                sink: PcapSink::new(BufWriter::new(f))?,
                left: pc.max_frames,
                frames: 0,
                errors: 0,
            })
        }
        None => None,
    };
    let fds: Vec<std::os::fd::RawFd> = devs.iter().filter_map(|d| d.poll_fd()).collect();
    writeln!(
        out,
        "ferroce switch: switching between {}",
        cfg.ports.join(" ")
    )
    .ok();
    out.flush().ok();
    let t0 = std::time::Instant::now();
    let mut idle = 0u32;
    let mut last_stats = t0;
    let mut last_tx = 0u64;
    let mut last_rx_bytes: Vec<u64> = vec![0; core.port_count()];
    const BATCH: usize = 64;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let el = t0.elapsed();
        if cfg.duration.is_some_and(|d| el >= d) {
            break;
        }
        let now = Instant::from_nanos(el.as_nanos() as u64);
        let mut work = 0usize;
        for (i, d) in devs.iter_mut().enumerate() {
            let n = d
                .recv_batch(BATCH, &mut |f| {
                    if let Some(t) = tap.as_mut().filter(|t| t.port == i) {
                        t.record(f);
                    }
                    core.ingress(now, i, f);
                })
                .map_err(|e| SwitchError::io(format!("receive on {}", cfg.ports[i]), e))?;
            work += n;
        }
        for (i, d) in devs.iter_mut().enumerate() {
            while core.next_departure(i).is_some_and(|t| t <= now) {
                let n = d
                    .send_batch(BATCH, &mut |buf| {
                        let f = core.pop_ready(now, i)?;
                        // Frames larger than the port's capacity were refused on enqueue.
                        let len = f.len().min(buf.len());
                        buf[..len].copy_from_slice(&f[..len]);
                        if let Some(t) = tap.as_mut().filter(|t| t.port == i) {
                            t.record(&f);
                        }
                        core.recycle(f);
                        Some(len)
                    })
                    .map_err(|e| SwitchError::io(format!("send on {}", cfg.ports[i]), e))?;
                work += n;
                if n == 0 {
                    break;
                }
            }
        }
        if let Some(iv) = cfg.stats_interval {
            if last_stats.elapsed() >= iv {
                let tx: u64 = (0..core.port_count())
                    .map(|i| core.counters(i).tx_frames)
                    .sum();
                let secs = last_stats.elapsed().as_secs_f64();
                last_stats = std::time::Instant::now();
                let q: Vec<String> = (0..core.port_count())
                    .map(|i| format!("{:.0}", core.backlog_bytes(now, i) as f64 / 1e3))
                    .collect();
                let marks: u64 = (0..core.port_count())
                    .map(|i| core.counters(i).ce_marked)
                    .sum();
                let drops: u64 = (0..core.port_count()).map(|i| core.counters(i).drops).sum();
                // What each port received in this interval (Mb/s): a sender's port shows
                // that sender's rate, which is what the incast experiment compares.
                let rx_mbps: Vec<String> = (0..core.port_count())
                    .map(|i| {
                        let b = core.counters(i).rx_bytes;
                        let r = (b - last_rx_bytes[i]) as f64 * 8.0 / secs / 1e6;
                        last_rx_bytes[i] = b;
                        format!("{r:.1}")
                    })
                    .collect();
                writeln!(
                    out,
                    "  ... {:.1} s: {:.0} frames/s forwarded, queues [{}] KB, rx_mbps [{}], ce_marked {marks}, drops {drops}, unix {:.3}",
                    el.as_secs_f64(),
                    (tx - last_tx) as f64 / secs,
                    q.join(" "),
                    rx_mbps.join(" "),
                    wall().as_secs_f64()
                )
                .ok();
                out.flush().ok();
                last_tx = tx;
            }
        }
        if work > 0 {
            idle = 0;
            continue;
        }
        match cfg.poll {
            SwitchPoll::Busy => std::hint::spin_loop(),
            SwitchPoll::Adaptive { spins } => {
                idle = idle.saturating_add(1);
                let next = (0..core.port_count())
                    .filter_map(|i| core.next_departure(i))
                    .min();
                if let Some(t) = next {
                    // Frames wait for their link: sleep until the first is due (or a frame
                    // arrives). Waking late costs no capacity (the link is virtual), only
                    // adds a little burstiness; spinning would take a core from the hosts.
                    let wait = Duration::from_nanos(t.as_nanos().saturating_sub(now.as_nanos()));
                    if wait > Duration::from_micros(20) {
                        crate::io::event::poll_readable_precise(&fds, wait)
                            .map_err(|e| SwitchError::io("poll", e))?;
                    } else {
                        std::hint::spin_loop();
                    }
                } else if idle <= spins {
                    std::hint::spin_loop();
                } else {
                    let mut wait = Duration::from_millis(1);
                    if let Some(d) = cfg.duration {
                        wait = wait.min(d.saturating_sub(t0.elapsed()));
                    }
                    crate::io::event::poll_readable(&fds, Some(wait))
                        .map_err(|e| SwitchError::io("poll", e))?;
                }
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let mut pcap_frames = 0;
    if let Some(t) = tap {
        pcap_frames = t.frames;
        let mut w = t.sink.into_inner();
        w.flush()
            .map_err(|e| SwitchError::io("writing the capture", e))?;
        if t.errors > 0 {
            return Err(SwitchError::CaptureFrames(t.errors));
        }
    }
    let r = report(cfg, &core, &devs, secs, pcap_frames);
    write!(out, "{}", r.text()).ok();
    if let Some(p) = &cfg.json {
        let v = serde_json::to_string(&r).map_err(SwitchError::Json)?;
        if p.as_os_str() == "-" {
            writeln!(out, "{v}").ok();
        } else {
            std::fs::write(p, format!("{v}\n"))
                .map_err(|e| SwitchError::io(p.display().to_string(), e))?;
        }
    }
    out.flush().ok();
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ip::{read_ecn, Ecn};

    const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
    const C: [u8; 6] = [2, 0, 0, 0, 0, 0xc];

    /// An Ethernet + IPv4 frame of `len` bytes (UDP inside, content irrelevant) with `ecn`.
    fn ip_frame(dst: [u8; 6], src: [u8; 6], len: usize, ecn: Ecn) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[..6].copy_from_slice(&dst);
        f[6..12].copy_from_slice(&src);
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip = crate::wire::Ipv4Repr {
            src: [10, 0, 0, 1].into(),
            dst: [10, 0, 0, 2].into(),
            dscp: 26,
            ecn,
            ident: 7,
            dont_frag: true,
            ttl: 64,
        };
        ip.emit(&mut f[14..], len - 34).unwrap();
        f
    }

    /// Everything queued at `port`, each frame taken when its token bucket allows (from
    /// `now` on).
    fn drain(core: &mut SwitchCore, now: Instant, port: usize) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        let mut t = now;
        while let Some(at) = core.next_departure(port) {
            t = at.max(t);
            v.push(core.pop_ready(t, port).expect("due"));
        }
        v
    }

    #[test]
    fn learns_floods_unknown_and_forwards_known() {
        let mut s = SwitchCore::new(&[1518; 3], QueueConfig::default());
        let t = Instant::from_nanos(0);
        // A (port 0) → B, unknown: flooded to 1 and 2, never back to 0.
        s.ingress(t, 0, &ip_frame(B, A, 100, Ecn::NotEct));
        assert_eq!(s.lookup(&MacAddr(A)), Some(0));
        assert_eq!((s.queue_len(0), s.queue_len(1), s.queue_len(2)), (0, 1, 1));
        drain(&mut s, t, 1);
        drain(&mut s, t, 2);
        // B answers from port 1: A is known, unicast to port 0 only.
        s.ingress(t, 1, &ip_frame(A, B, 100, Ecn::NotEct));
        assert_eq!((s.queue_len(0), s.queue_len(1), s.queue_len(2)), (1, 0, 0));
        drain(&mut s, t, 0);
        // Now A → B goes to port 1 only.
        s.ingress(t, 0, &ip_frame(B, A, 100, Ecn::NotEct));
        assert_eq!((s.queue_len(0), s.queue_len(1), s.queue_len(2)), (0, 1, 0));
        drain(&mut s, t, 1);
        // Broadcast from C (port 2) floods to 0 and 1.
        s.ingress(t, 2, &ip_frame([0xff; 6], C, 60, Ecn::NotEct));
        assert_eq!((s.queue_len(0), s.queue_len(1), s.queue_len(2)), (1, 1, 0));
        drain(&mut s, t, 0);
        drain(&mut s, t, 1);
        // A frame for a station behind the ingress port is filtered.
        s.ingress(t, 0, &ip_frame(A, C, 60, Ecn::NotEct));
        assert_eq!(s.counters(0).filtered, 1);
        assert!(!s.any_queued());
        // A station that moves is re-learned.
        s.ingress(t, 2, &ip_frame(C, A, 60, Ecn::NotEct));
        assert_eq!(s.lookup(&MacAddr(A)), Some(2));
        assert_eq!(s.fdb_len(), 3);
        assert_eq!(s.counters(0).rx_frames, 3);
        assert_eq!(s.counters(1).flooded, 2);
    }

    /// Issue 17 finding 7: the table was unbounded and never aged. A flood of forged source
    /// MACs now stops at the bound without evicting live stations, and a station gone quiet
    /// is forgotten after the ageing time (its frames flooded again, its slot reused).
    #[test]
    fn the_forwarding_table_is_bounded_and_ages() {
        let mut s = SwitchCore::new(&[1518; 3], QueueConfig::default());
        let t = Instant::from_nanos(0);
        // A on port 0 and B on port 1 are learned first.
        s.ingress(t, 0, &ip_frame(B, A, 60, Ecn::NotEct));
        drain(&mut s, t, 1);
        drain(&mut s, t, 2);
        s.ingress(t, 1, &ip_frame(A, B, 60, Ecn::NotEct));
        drain(&mut s, t, 0);
        // Then a flood of forged sources from port 2.
        let forged = FDB_MAX as u64 + 1000;
        for i in 0..forged {
            let [_, _, _, _, _, x, y, z] = i.to_be_bytes();
            s.ingress(t, 2, &ip_frame(A, [2, 0x66, 0, x, y, z], 60, Ecn::NotEct));
            drain(&mut s, t, 0);
        }
        assert_eq!(s.fdb_len(), FDB_MAX, "the table grew past its bound");
        assert_eq!(s.counters(2).fdb_full, forged - (FDB_MAX as u64 - 2));
        // A and B, learned before the flood, are still known: A → B goes to port 1 only.
        s.ingress(t, 0, &ip_frame(B, A, 60, Ecn::NotEct));
        assert_eq!((s.queue_len(1), s.queue_len(2)), (1, 0));
        drain(&mut s, t, 1);
        // A and B keep talking, the forged stations do not.
        let later = t + (FDB_AGEING - Duration::from_secs(1));
        s.ingress(later, 1, &ip_frame(A, B, 60, Ecn::NotEct));
        s.ingress(later, 0, &ip_frame(B, A, 60, Ecn::NotEct));
        drain(&mut s, later, 0);
        drain(&mut s, later, 1);
        // Past the ageing time the forged stations are forgotten: a new source is learned.
        let aged = t + (FDB_AGEING + Duration::from_secs(1));
        s.ingress(aged, 2, &ip_frame(A, C, 60, Ecn::NotEct));
        drain(&mut s, aged, 0);
        assert_eq!(s.counters(2).fdb_full, forged - (FDB_MAX as u64 - 2));
        assert_eq!(s.lookup(&MacAddr(C)), Some(2));
        assert_eq!(s.fdb_len(), 3, "A, B and C remain");
        // A station not heard from for the ageing time is flooded to again.
        let quiet = aged + FDB_AGEING;
        s.ingress(quiet, 0, &ip_frame(C, A, 60, Ecn::NotEct));
        assert_eq!(
            (s.queue_len(1), s.queue_len(2)),
            (1, 1),
            "C aged out: flooded"
        );
    }

    #[test]
    fn the_virtual_link_sets_the_rate() {
        // 1 Gb/s: 1000 frames of 1000 B (+24 on the wire) start 8.192 µs apart.
        let cfg = QueueConfig {
            rate_bps: Some(1_000_000_000),
            buffer_bytes: 10_000_000,
            ..QueueConfig::default()
        };
        let mut s = SwitchCore::new(&[1518; 2], cfg);
        s.ingress(Instant::from_nanos(0), 1, &ip_frame(A, B, 60, Ecn::NotEct));
        s.ingress(Instant::from_nanos(0), 0, &ip_frame(B, A, 60, Ecn::NotEct));
        drain(&mut s, Instant::from_nanos(0), 0);
        drain(&mut s, Instant::from_nanos(0), 1);
        let t0 = 1_000_000_000u64;
        for _ in 0..1000 {
            s.ingress(
                Instant::from_nanos(t0),
                0,
                &ip_frame(B, A, 1000, Ecn::NotEct),
            );
        }
        assert_eq!(s.backlog_bytes(Instant::from_nanos(t0), 1), 1_024_000);
        assert_eq!(s.counters(1).max_queue_bytes, 1_024_000);
        let mut starts = Vec::new();
        while let Some(at) = s.next_departure(1) {
            assert!(s
                .pop_ready(Instant::from_nanos(at.as_nanos() - 1), 1)
                .is_none());
            let f = s.pop_ready(at, 1).expect("due");
            s.recycle(f);
            starts.push(at.as_nanos() - t0);
        }
        assert_eq!(starts.len(), 1000);
        assert!(starts
            .iter()
            .enumerate()
            .all(|(k, &t)| t == k as u64 * 8192));
        // The backlog is the link's work left, whatever the thread did: half way, half.
        let mid = Instant::from_nanos(t0 + 500 * 8192);
        assert_eq!(s.backlog_bytes(mid, 1), 512_000);
        // A late thread loses no capacity: frames queued at t0 are all due by their times,
        // however late they are taken.
        for _ in 0..10 {
            s.ingress(
                Instant::from_nanos(t0 * 2),
                0,
                &ip_frame(B, A, 1000, Ecn::NotEct),
            );
        }
        assert_eq!(drain(&mut s, Instant::from_nanos(t0 * 3), 1).len(), 10);
    }

    #[test]
    fn tail_drop_at_the_buffer_limit() {
        let cfg = QueueConfig {
            rate_bps: Some(1_000_000),
            buffer_bytes: 5120,
            ..QueueConfig::default()
        };
        let mut s = SwitchCore::new(&[1518; 2], cfg);
        let t = Instant::from_nanos(0);
        s.ingress(t, 1, &ip_frame(A, B, 60, Ecn::NotEct));
        drain(&mut s, t, 0);
        for _ in 0..10 {
            s.ingress(t, 0, &ip_frame(B, A, 1000, Ecn::NotEct));
        }
        // At 1 Mb/s nothing drains meanwhile: frame k finds k × 1024 B of backlog; 5 fit in
        // the 5120 B buffer, the other 5 are dropped.
        let c = s.counters(1);
        assert_eq!(c.drops, 5);
        assert_eq!(c.max_queue_bytes, 5120);
        assert_eq!(s.backlog_bytes(t, 1), 5120);
        assert_eq!(s.queue_bytes(1), 5000);
    }

    #[test]
    fn red_marks_ect_only_and_keeps_the_ip_checksum() {
        let red = Red::new(2500, 4000, 1.0);
        let cfg = QueueConfig {
            rate_bps: Some(1_000_000),
            buffer_bytes: 1_000_000,
            red: Some(red),
            seed: 7,
        };
        let mut s = SwitchCore::new(&[1518; 2], cfg);
        let t = Instant::from_nanos(0);
        s.ingress(t, 1, &ip_frame(A, B, 60, Ecn::NotEct));
        drain(&mut s, t, 0);
        // Backlogs found (1024 B per frame): 0, 1024, 2048 (no mark), 3072 (p = 0.38),
        // 4096.. (above Kmax: 1).
        for i in 0..10 {
            let ecn = if i == 8 { Ecn::NotEct } else { Ecn::Ect0 };
            s.ingress(t, 0, &ip_frame(B, A, 1000, ecn));
        }
        let c = s.counters(1).clone();
        assert_eq!(c.red_not_ect, 1);
        assert!(
            (5..=6).contains(&c.ce_marked),
            "marked {} (frames 4..9 except 8, maybe 3)",
            c.ce_marked
        );
        let t1 = Instant::from_nanos(10_000_000_000);
        let frames = drain(&mut s, t1, 1);
        assert_eq!(frames.len(), 10);
        for (i, f) in frames.iter().enumerate() {
            let ip = &f[14..34];
            assert_eq!(crate::wire::ip::internet_checksum(ip), 0, "frame {i}");
            let e = read_ecn(ip).unwrap();
            match i {
                0..=2 => assert_eq!(e, Ecn::Ect0, "frame {i}: at or below kmin"),
                4..=7 | 9 => assert_eq!(e, Ecn::Ce, "frame {i}: above kmax"),
                8 => assert_eq!(e, Ecn::NotEct),
                _ => {}
            }
        }
        // The same seed gives the same decisions.
        let mut s2 = SwitchCore::new(&[1518; 2], cfg);
        s2.ingress(t, 1, &ip_frame(A, B, 60, Ecn::NotEct));
        drain(&mut s2, t, 0);
        for i in 0..10 {
            let ecn = if i == 8 { Ecn::NotEct } else { Ecn::Ect0 };
            s2.ingress(t, 0, &ip_frame(B, A, 1000, ecn));
        }
        assert_eq!(s2.counters(1), &c);
    }

    #[test]
    fn marks_behind_a_vlan_tag_and_over_ipv6() {
        let red = Red::new(0, 0, 1.0);
        let cfg = QueueConfig {
            rate_bps: Some(1_000_000),
            red: Some(red),
            ..QueueConfig::default()
        };
        let mut s = SwitchCore::new(&[1522; 2], cfg);
        let t = Instant::from_nanos(0);
        s.ingress(t, 1, &ip_frame(A, B, 60, Ecn::NotEct));
        drain(&mut s, t, 0);
        // Fill the queue so that every later frame finds a backlog above kmax = 0.
        s.ingress(t, 0, &ip_frame(B, A, 100, Ecn::NotEct));
        let mut tagged = ip_frame(B, A, 200, Ecn::Ect1);
        tagged.splice(12..12, [0x81, 0x00, 0x20, 0x05]);
        s.ingress(t, 0, &tagged);
        let mut v6 = vec![0u8; 14 + 40 + 8];
        v6[..6].copy_from_slice(&B);
        v6[6..12].copy_from_slice(&A);
        v6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        crate::wire::Ipv6Repr {
            src: std::net::Ipv6Addr::LOCALHOST,
            dst: std::net::Ipv6Addr::LOCALHOST,
            dscp: 0,
            ecn: Ecn::Ect0,
            flow_label: 5,
            hop_limit: 9,
        }
        .emit(&mut v6[14..], 8)
        .unwrap();
        s.ingress(t, 0, &v6);
        let mut arp = ip_frame(B, A, 60, Ecn::NotEct);
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        s.ingress(t, 0, &arp);
        assert_eq!(s.counters(1).ce_marked, 2);
        assert_eq!(s.counters(1).red_not_ect, 1, "the ARP frame");
        let f = drain(&mut s, Instant::from_nanos(1_000_000_000_000), 1);
        assert_eq!(read_ecn(&f[1][18..]), Some(Ecn::Ce));
        assert_eq!(crate::wire::ip::internet_checksum(&f[1][18..38]), 0);
        assert_eq!(read_ecn(&f[2][14..]), Some(Ecn::Ce));
        assert_eq!(f[3][12..14], [0x08, 0x06]);
    }

    #[test]
    fn oversize_frames_are_not_forwarded() {
        let mut s = SwitchCore::new(&[1518, 1000], QueueConfig::default());
        s.ingress(
            Instant::from_nanos(0),
            0,
            &ip_frame(B, A, 1200, Ecn::NotEct),
        );
        assert_eq!(s.counters(1).oversize, 1);
        assert!(!s.any_queued());
    }

    #[test]
    fn validate_rejects_bad_configs() {
        let mut c = SwitchConfig::new(vec!["a".into()]);
        assert!(validate(&c).unwrap_err().to_string().contains("two ports"));
        c.ports = vec!["a".into(), "a".into()];
        assert!(validate(&c).unwrap_err().to_string().contains("twice"));
        c.ports = vec!["a".into(), "b".into()];
        assert!(validate(&c).is_ok());
        c.queue.red = Some(Red::new(10, 5, 0.1));
        assert!(validate(&c).is_err());
        c.queue.red = Some(Red::new(5, 10, 0.1));
        c.pcap = Some(PcapConfig {
            path: "x.pcap".into(),
            port: "c".into(),
            max_frames: None,
        });
        assert!(validate(&c)
            .unwrap_err()
            .to_string()
            .contains("--pcap-port"));
    }
}
