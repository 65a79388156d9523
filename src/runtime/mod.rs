//! The runtime: a NIC engine thread per device that drives the sans-IO [`Device`] over a real
//! [`PacketDevice`] — receive a batch, run the QPs, transmit a batch, fire timers — while
//! applications use the verbs from any thread.
//!
//! - **Posting is lock-free**: `post_send`/`post_recv` check what libibverbs checks
//!   synchronously (QP state, free queue slots, SGE count, inline size) against a per-QP
//!   shadow of atomics, then push the request onto a lock-free doorbell queue (crossbeam
//!   `SegQueue`) that the engine drains every loop.
//! - **Polling is lock-free**: the engine moves completions into a per-CQ lock-free queue;
//!   `poll_cq` pops from it. `wait_cq` blocks on a condition variable (a completion channel);
//!   `req_notify_cq` + `get_cq_event` give libibverbs' armed-notification semantics.
//! - **Control verbs** (`reg_mr`, `create_qp`, `modify_qp`, ...) take the device lock, which the
//!   engine holds only for one loop iteration.
//! - The engine **busy-polls** (one core at 100 %) or **adaptively sleeps**: after a run of
//!   idle iterations it waits in the packet device's `wait_readable` for at most the next
//!   timer or a short bound. Or it runs **inline** ([`PollMode::Inline`]): in the
//!   application's own verbs calls, with a background thread that takes over only while the
//!   application leaves it alone (the lowest latency when cores are few: no thread hand-off
//!   on the fast path; `ferroce perf`'s latency tests and `ferroce pingpong` use it).
//! - Dropping the [`Nic`] (or [`Nic::shutdown`]) stops the thread and drops the packet device,
//!   which restores the interface (an AF_XDP device detaches its XDP program).

pub mod cm;
pub mod stat;

use crate::io::{IoStats, PacketDevice};
use crate::time::Instant;
use crate::verbs::{
    AddressVector, Ah, AsyncEvent, Cq, Device, DeviceConfig, MemoryRegion, NotifyMode, Pd,
    QpInitAttr, QpType, RcParams, RecvWr, RemoteQp, SendWr, Srq, SrqAttr, SrqAttrMask, UcParams,
    UdParams, VerbsError, WcStatus, WorkCompletion,
};
use crate::verbs::{DeviceCounters, QpCounters};
use crate::verbs::{QpAttr, QpAttrMask, QpState};
use crate::wire::QpNumber;
use crossbeam::queue::SegQueue;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// How the engine thread waits when there is nothing to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollMode {
    /// Never sleep: lowest latency, one core at 100 %.
    Busy,
    /// Spin for a while, then sleep in the packet device for at most `max_sleep`.
    Adaptive {
        /// Idle rounds spun before sleeping.
        spins: u32,
        /// The longest sleep.
        max_sleep: Duration,
    },
    /// The engine runs in the application's own calls (`poll_cq`, `wait_cq`, `get_cq_event`,
    /// `post_send`, `post_recv` and [`Nic::progress`]), one thread at a time (a thread that
    /// finds another one driving it skips): no hand-off between threads on the fast path,
    /// hence the lowest latency when cores are scarce. A background thread takes over only
    /// while no application thread has called in for [`INLINE_TAKEOVER`] (a passive side
    /// blocked elsewhere, timers): it then sleeps in the packet device and drives the engine
    /// when frames arrive or a timer is due.
    Inline,
}

/// [`PollMode::Inline`]: how long the application may leave the engine alone before the
/// background thread drives it.
pub const INLINE_TAKEOVER: Duration = Duration::from_micros(200);

/// [`INLINE_TAKEOVER`] on a one-CPU host ([`single_cpu`]).
pub const INLINE_TAKEOVER_ONE_CPU: Duration = Duration::from_millis(2);

/// [`PollMode::Inline`]: the longest the background thread sleeps between looks while the
/// application drives (it starts at [`INLINE_TAKEOVER`] and doubles): the engine is left
/// alone at most this long plus `INLINE_TAKEOVER` after the application stops calling in.
/// Each look preempts a spinning thread when every core spins; at 2 ms these looks made
/// 1 % of a send-lat ping-pong's round trips 10–20 µs long (outliers every ~2 ms in the
/// sample sequence): p99 5.5–13.2 µs against 5.1–7.4 µs at 10 ms, alternating runs.
pub const INLINE_CHECK_MAX: Duration = Duration::from_millis(10);

/// [`PollMode::Inline`]: how long an application thread waiting for a completion busy-polls
/// the engine before it sleeps in the packet device (see [`spin_budget`]).
pub const INLINE_WAIT_SPIN: Duration = Duration::from_micros(20);

/// [`PollMode::Inline`]: how long the background thread, once it has taken over, keeps
/// driving the engine without sleeping after the last round that did work (none on a
/// one-CPU host, [`spin_budget`]). A passive side whose application never calls in (a WRITE
/// target, perftest's bandwidth server) otherwise sleeps in the packet device between two
/// bursts and wakes ~80 µs later on this VM for each, and its ACKs hold the sender's window:
/// Debian's `ib_write_bw` 64 KiB at both ends on the library, 1.6–1.9 GB/s with the server
/// sleeping, 2.1–2.4 in three rounds of four with this spin (docs/cabi.md, which also shows
/// what it costs on a machine loaded with other work: `Nic::set_background_spin`).
pub const INLINE_BACKGROUND_SPIN: Duration = Duration::from_micros(500);

/// Whether this process has one CPU to run on (`available_parallelism`: the affinity mask
/// and the cgroup's CPU quota). There a thread that busy-polls for a packet holds the only
/// CPU the packet's way in needs (the kernel's softirq thread, our own engine thread), and
/// the packet waits for the spinner's time slice to end.
pub fn single_cpu() -> bool {
    static ONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ONE.get_or_init(|| std::thread::available_parallelism().is_ok_and(|n| n.get() == 1))
}

/// How long to busy-poll before sleeping: `d`, or nothing on a one-CPU host ([`single_cpu`]).
/// In one-vCPU QEMU guests a send-lat ping-pong that spun 2 ms per completion before it slept
/// took 7.7 ms a hop; sleeping in the packet device at once, 0.83 ms (AF_XDP, both binaries
/// in the same guests, docs/performance.md).
pub fn spin_budget(d: Duration) -> Duration {
    if single_cpu() {
        Duration::ZERO
    } else {
        d
    }
}

/// How often a busy-polling thread first offers its CPU to the threads waiting for one
/// (`sched_yield`, [`Spinner`]). On a machine whose cores are all busy, a thread that spins
/// for a completion otherwise keeps its core for the whole spin (milliseconds), and whatever
/// waits for that core — the peer process, the kernel's softirq thread, the engine thread —
/// waits with it. `ferroce perf send-lat` 2 B between two processes on the 2-core host at
/// load 4–7, paired runs (docs/performance.md): without yields t_typical 4–75 µs (AF_XDP) and
/// 11–268 µs (UDP), p99 2–6 ms; with a yield every 3 µs AF_XDP 5.6–10.6 µs, UDP 15.8 µs, p99
/// 14–350 µs; both processes SCHED_FIFO (no competitor: the yield returns at once) AF_XDP
/// 3.5–5.3 µs against 3.9–5.7 µs, UDP 9.9–11.3 µs against 11.9 µs.
pub const SPIN_YIELD_EVERY: Duration = Duration::from_micros(3);

/// A yield that kept the thread off its CPU longer than this handed the CPU to a thread that
/// used its whole time slice (a compute-bound process, not a peer that answers in
/// microseconds): [`Spinner`] then yields half as often, down to once per [`SPIN_YIELD_MAX`].
/// With 2–6 CPU-bound processes on the 2-core host, a yield every 3 µs made every hop of a
/// `send-lat` ping-pong wait for their slices: t_typical 700–2,500 µs against 8.7–10.5 µs
/// without yields (paired, docs/performance.md).
pub const SPIN_YIELD_EXPENSIVE: Duration = Duration::from_micros(50);

/// The longest period between two yields of a [`Spinner`] (see [`SPIN_YIELD_EXPENSIVE`]).
pub const SPIN_YIELD_MAX: Duration = Duration::from_millis(1);

thread_local! {
    /// This thread's current yield period in nanoseconds ([`Spinner`]): it outlives each
    /// spin, so that what one wait learned about the machine holds for the next.
    static YIELD_PERIOD_NS: std::cell::Cell<u64> =
        const { std::cell::Cell::new(SPIN_YIELD_EVERY.as_nanos() as u64) };
}

/// The next yield period after a yield that kept the thread away for `away`: doubled (up to
/// [`SPIN_YIELD_MAX`]) when the yield was expensive, an eighth shorter (down to
/// [`SPIN_YIELD_EVERY`]) when it was cheap: under compute-bound load an occasional cheap yield
/// (the other thread's slice happened to end) must not bring back a yield per hop.
fn next_yield_period(period_ns: u64, away: Duration) -> u64 {
    let (min, max) = (
        SPIN_YIELD_EVERY.as_nanos() as u64,
        SPIN_YIELD_MAX.as_nanos() as u64,
    );
    if away > SPIN_YIELD_EXPENSIVE {
        period_ns.saturating_mul(2).min(max)
    } else {
        (period_ns - period_ns / 8).max(min)
    }
}

/// One busy-poll: [`Spinner::pause`] between two looks, a `sched_yield` now and then (a
/// system call that returns at once when nobody else wants the CPU): every
/// [`SPIN_YIELD_EVERY`] while yields come back quickly (the CPU went to a thread that needed
/// it briefly: the peer, softirq, the engine), less often, up to every [`SPIN_YIELD_MAX`],
/// while they cost whole time slices of compute-bound processes.
#[derive(Debug)]
pub struct Spinner {
    next_yield: std::time::Instant,
    /// The engine thread's spin: a yield every [`SPIN_YIELD_EVERY`], never backing off. The
    /// thread it yields to is usually the application's, itself a yielding spinner: a yield
    /// that waited for the other's (backed-off) period would make both back off to
    /// [`SPIN_YIELD_MAX`] per hop.
    fixed: bool,
}

impl Default for Spinner {
    fn default() -> Self {
        Spinner {
            next_yield: std::time::Instant::now() + Self::period(),
            fixed: false,
        }
    }
}

impl Spinner {
    /// A spin that starts now (its first yield is this thread's current period away).
    pub fn new() -> Self {
        Self::default()
    }

    /// The engine thread's spinner (a fixed period, see the field).
    pub fn fixed() -> Self {
        Spinner {
            next_yield: std::time::Instant::now() + SPIN_YIELD_EVERY,
            fixed: true,
        }
    }

    fn period() -> Duration {
        Duration::from_nanos(YIELD_PERIOD_NS.with(|p| p.get()))
    }

    /// Between two looks at what the spin waits for.
    pub fn pause(&mut self) {
        std::hint::spin_loop();
        let now = std::time::Instant::now();
        if now >= self.next_yield {
            if self.fixed {
                std::thread::yield_now();
                self.next_yield = std::time::Instant::now() + SPIN_YIELD_EVERY;
            } else {
                let back = yield_measured(now);
                self.next_yield = back + Self::period();
            }
        }
    }
}

thread_local! {
    /// [`empty_poll_yield`]: when this thread's run of empty `poll_cq` calls is due to yield
    /// (None: its last poll found a completion).
    static EMPTY_POLL_YIELD_AT: std::cell::Cell<Option<std::time::Instant>> =
        const { std::cell::Cell::new(None) };
}

/// An application that spins on `poll_cq` while a separate engine thread produces its
/// completions (every mode but [`PollMode::Inline`]) yields now and then, as a [`Spinner`]
/// does (same per-thread period): else, where the two share a core, the engine runs only
/// when the scheduler's tick preempts the spinner. Debian's `ib_send_lat` 2 B under
/// `FERROCE_POLL=busy` on the 2-core host (two processes, each a spinning application and
/// a busy engine thread): t_typical 4,001 µs, a tick per hop (docs/cabi.md).
fn empty_poll_yield(empty: bool) {
    if !empty {
        EMPTY_POLL_YIELD_AT.with(|c| c.set(None));
        return;
    }
    let now = std::time::Instant::now();
    match EMPTY_POLL_YIELD_AT.with(|c| c.get()) {
        None => EMPTY_POLL_YIELD_AT.with(|c| c.set(Some(now + Spinner::period()))),
        Some(at) if now >= at => {
            let back = yield_measured(now);
            EMPTY_POLL_YIELD_AT.with(|c| c.set(Some(back + Spinner::period())));
        }
        Some(_) => {}
    }
}

/// `sched_yield`, and this thread's yield period adjusted by what it cost
/// ([`next_yield_period`]); returns when the thread got its CPU back.
fn yield_measured(now: std::time::Instant) -> std::time::Instant {
    std::thread::yield_now();
    let back = std::time::Instant::now();
    YIELD_PERIOD_NS.with(|p| p.set(next_yield_period(p.get(), back - now)));
    back
}

/// Runtime options.
#[derive(Clone, Copy, Debug)]
pub struct NicOptions {
    /// How the engine waits when idle.
    pub poll: PollMode,
    /// Frames per receive/transmit batch.
    pub batch: usize,
}

impl Default for NicOptions {
    fn default() -> Self {
        NicOptions {
            poll: PollMode::Adaptive {
                // No spinning on one CPU: it would hold the CPU the application needs.
                spins: if single_cpu() { 0 } else { 2000 },
                max_sleep: Duration::from_micros(50),
            },
            batch: 64,
        }
    }
}

enum Doorbell {
    Send(QpNumber, SendWr),
    Recv(QpNumber, RecvWr),
    SrqRecv(Srq, RecvWr),
}

/// What the application side knows about an SRQ without taking the device lock.
struct SrqShadow {
    max_wr: AtomicU64,
    max_sge: u32,
    posted: AtomicU64,
    /// WQEs responders took from it (copied from the device by the engine).
    taken: AtomicU64,
}

/// What the application side knows about a QP without taking the device lock.
struct QpShadow {
    qp_type: QpType,
    pd: Pd,
    /// It has no receive queue of its own: attached to an SRQ (receives are posted there), or
    /// of XRC (an initiator receives nothing; a target takes its XRC SRQs' WQEs).
    no_rq: bool,
    cap: crate::verbs::QpCap,
    state: AtomicU8,
    sq_posted: AtomicU64,
    sq_retired: AtomicU64,
    rq_posted: AtomicU64,
    rq_retired: AtomicU64,
}

fn state_code(s: QpState) -> u8 {
    s.to_ibv() as u8
}

fn state_of(c: u8) -> QpState {
    QpState::from_ibv(u32::from(c)).unwrap_or(QpState::Err)
}

/// What a CQ's notification calls (see [`Nic::set_cq_notify`]).
pub type CqNotify = Arc<dyn Fn() + Send + Sync>;

/// What takes each asynchronous event off the device (see [`Nic::set_async_sink`]).
pub type AsyncSink = Arc<dyn Fn(AsyncEvent) + Send + Sync>;

struct CqShadow {
    q: SegQueue<WorkCompletion>,
    len: AtomicUsize,
    /// The CQ's depth (`ibv_resize_cq` changes it).
    depth: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
    /// Threads sleeping (or about to) on `cv`: the engine signals it only when there is one,
    /// since a `notify_all` is a system call even with nobody waiting (two per round trip of
    /// a ping-pong, each tens of µs in an emulated guest).
    waiters: AtomicUsize,
    /// Held by `poll_cq` while it takes completions, and by `destroy_qp` while it removes the
    /// destroyed QP's (the queue's order is kept: a poller never sees the queue half filtered).
    take: Mutex<()>,
    /// 0 = not armed, 1 = next completion, 2 = solicited only.
    armed: AtomicU8,
    /// Called with every notification (a completion channel signals its descriptor).
    channel: Mutex<Option<CqNotify>>,
    events: AtomicU64,
}

impl CqShadow {
    /// Sleep on `cv` until `done()` or `deadline`; returns `done()`'s last answer. The waiter
    /// count goes up before `done()` is first looked at, and the engine adds its completion
    /// (or event) before it reads the count ([`CqShadow::wake`]): either the engine sees this
    /// waiter and signals under the lock, or this thread sees the completion.
    fn wait_until(&self, deadline: std::time::Instant, done: &dyn Fn() -> bool) -> bool {
        let mut g = lock(&self.lock);
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let r = loop {
            if done() {
                break true;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                break false;
            }
            g = self
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        drop(g);
        r
    }

    /// Wake the threads in [`CqShadow::wait_until`], if any: call after the completion or
    /// event they wait for is visible.
    fn wake(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _g = lock(&self.lock);
            self.cv.notify_all();
        }
    }

    fn new(depth: usize) -> Arc<CqShadow> {
        Arc::new(CqShadow {
            q: SegQueue::new(),
            len: AtomicUsize::new(0),
            depth: AtomicUsize::new(depth),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            waiters: AtomicUsize::new(0),
            take: Mutex::new(()),
            armed: AtomicU8::new(0),
            channel: Mutex::new(None),
            events: AtomicU64::new(0),
        })
    }
}

struct Inner {
    dev: Mutex<Device>,
    doorbell: SegQueue<Doorbell>,
    qps: RwLock<HashMap<u32, Arc<QpShadow>>>,
    cqs: RwLock<Vec<Arc<CqShadow>>>,
    srqs: RwLock<HashMap<u32, Arc<SrqShadow>>>,
    /// Address handles and their PDs (a UD post checks its handle without the device lock).
    ahs: RwLock<HashMap<u32, Pd>>,
    /// The packet device's descriptor to sleep on (`PacketDevice::poll_fd`; -1: none), as
    /// of the last group change (a join may change it): the inline engine's background
    /// thread sleeps on it.
    pkt_fd: std::sync::atomic::AtomicI32,
    stop: AtomicBool,
    epoch: std::time::Instant,
    io_stats: Mutex<IoStats>,
    io_errors: AtomicU64,
    /// Rung by application threads when the engine sleeps (see `engine_loop`).
    wake: crate::io::event::EventFd,
    sleeping: AtomicBool,
    /// [`PollMode::Inline`]: the packet device, driven by application threads.
    inline: Option<Mutex<InlineEngine>>,
    /// [`PollMode::Inline`]: when an application thread last drove the engine (ns since
    /// `epoch`).
    last_app_drive: AtomicU64,
    /// When the engine last copied the packet device's counters into `io_stats` (ns since
    /// `epoch`); a request for a fresh copy; copies made so far.
    stats_at: AtomicU64,
    stats_req: AtomicBool,
    stats_gen: AtomicU64,
    /// Engine rounds whose receive found no frame waiting (see [`Nic::settle`]).
    quiet_rounds: AtomicU64,
    /// Called when asynchronous events were queued (see [`Nic::set_async_notify`]).
    async_notify: Mutex<Option<CqNotify>>,
    /// Takes every asynchronous event as the engine finds it (see [`Nic::set_async_sink`]).
    async_sink: Mutex<Option<AsyncSink>>,
    /// The multicast groups the packet device should receive (the device's attached
    /// groups), those it has joined, and whether the engine should compare them.
    groups_want: Mutex<Vec<std::net::IpAddr>>,
    groups_have: Mutex<Vec<std::net::IpAddr>>,
    groups_dirty: AtomicBool,
    /// The device's queued-event count the engine last saw.
    async_seen: AtomicU64,
    /// [`PollMode::Inline`]: nanoseconds a waiting application thread spins before it sleeps
    /// in the packet device (see [`Nic::set_wait_spin`]).
    wait_spin_ns: AtomicU64,
    /// [`PollMode::Inline`]: nanoseconds the background thread drives on after work before it
    /// sleeps (see [`Nic::set_background_spin`]).
    bg_spin_ns: AtomicU64,
}

impl Inner {
    /// The engine's clock: time since the NIC was opened.
    fn now(&self) -> Instant {
        Instant::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }
}

/// How often the engine refreshes the packet device's counters (see `engine_step`).
const STATS_PERIOD_NS: u64 = 10_000_000;

struct InlineEngine {
    pkt: Box<dyn PacketDevice>,
    opts: NicOptions,
    cq_list: Vec<Cq>,
    next_timer: Option<Instant>,
}

/// The device's receive scope as the UDP socket filter's (the two layers' own types: the
/// verbs know nothing of the packet devices).
impl From<crate::verbs::ReceiveScope> for crate::io::udp_filter::Scope {
    fn from(r: crate::verbs::ReceiveScope) -> Self {
        use crate::io::udp_filter::{QpRule, Scope};
        match r {
            crate::verbs::ReceiveScope::Exact(v) => Scope::Exact(
                v.into_iter()
                    .map(|(n, source)| QpRule {
                        qpn: n.get(),
                        source,
                    })
                    .collect(),
            ),
            crate::verbs::ReceiveScope::Range { lo, hi } => Scope::Range { lo, hi },
        }
    }
}

/// A running software RNIC.
pub struct Nic {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
    describe: String,
    /// The name and label `ferroce stat` shows (see [`Nic::set_name`], [`Nic::set_label`]).
    name: Arc<Mutex<Names>>,
    /// Its socket for `ferroce stat` / `ferroce res qp` ([`stat`]).
    publisher: Option<stat::Publisher>,
    /// The packet device's kernel-side receive filter, if it has one, with the device's
    /// [`Device::scope_gen`] it was last set for (see [`Nic::refilter`]).
    filter: Option<Mutex<(crate::io::udp_filter::SocketFilter, Option<u64>)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Nic {
    /// Start the engine thread over `pkt`.
    pub fn start<D: PacketDevice + 'static>(
        cfg: DeviceConfig,
        mut pkt: D,
        opts: NicOptions,
    ) -> std::io::Result<Nic> {
        let mut cfg = cfg;
        // No path MTU whose packets the device's frames cannot hold: such a QP would never
        // send (its frames wait for room forever) and never complete.
        let fit = crate::io::netdev::ib_mtu_for_frame(pkt.frame_capacity());
        if cfg.max_mtu > fit {
            tracing::warn!(
                frame_capacity = pkt.frame_capacity(),
                max_mtu = fit.bytes(),
                "packet device frames too small for path MTU {}: at most {} here",
                cfg.max_mtu.bytes(),
                fit.bytes()
            );
            cfg.max_mtu = fit;
        }
        cfg.port_mtu = cfg.port_mtu.min(fit);
        if pkt.medium() == crate::io::Medium::UdpSocket {
            // Its received frames carry the synthesised all-zero destination MAC.
            cfg.accept_zero_dst_mac = true;
        }
        let inner = Arc::new(Inner {
            dev: Mutex::new(Device::new(cfg)),
            doorbell: SegQueue::new(),
            qps: RwLock::new(HashMap::new()),
            cqs: RwLock::new(Vec::new()),
            srqs: RwLock::new(HashMap::new()),
            ahs: RwLock::new(HashMap::new()),
            pkt_fd: std::sync::atomic::AtomicI32::new(pkt.poll_fd().unwrap_or(-1)),
            stop: AtomicBool::new(false),
            epoch: std::time::Instant::now(),
            io_stats: Mutex::new(IoStats::default()),
            io_errors: AtomicU64::new(0),
            wake: crate::io::event::EventFd::new()?,
            sleeping: AtomicBool::new(false),
            inline: None,
            last_app_drive: AtomicU64::new(0),
            stats_at: AtomicU64::new(0),
            stats_req: AtomicBool::new(false),
            stats_gen: AtomicU64::new(0),
            quiet_rounds: AtomicU64::new(0),
            async_notify: Mutex::new(None),
            async_sink: Mutex::new(None),
            groups_want: Mutex::new(Vec::new()),
            groups_have: Mutex::new(Vec::new()),
            groups_dirty: AtomicBool::new(false),
            async_seen: AtomicU64::new(0),
            wait_spin_ns: AtomicU64::new(spin_budget(INLINE_WAIT_SPIN).as_nanos() as u64),
            bg_spin_ns: AtomicU64::new(spin_budget(INLINE_BACKGROUND_SPIN).as_nanos() as u64),
        });
        let describe = pkt.describe();
        let filter = pkt.rx_filter();
        tracing::info!(device = %describe, poll = ?opts.poll, batch = opts.batch, filter = filter.is_some(), "NIC starting");
        if opts.poll == PollMode::Inline {
            let mut inner = inner;
            if let Some(i) = Arc::get_mut(&mut inner) {
                i.inline = Some(Mutex::new(InlineEngine {
                    pkt: Box::new(pkt),
                    opts,
                    cq_list: Vec::new(),
                    next_timer: None,
                }));
            }
            let th = inner.clone();
            let thread = std::thread::Builder::new()
                .name("ferroce-nic-bg".into())
                .spawn(move || inline_background(&th))?;
            return Ok(Nic::with_publisher(inner, thread, describe).with_filter(filter));
        }
        let th = inner.clone();
        let thread = std::thread::Builder::new()
            .name("ferroce-nic".into())
            .spawn(move || engine_loop(&th, &mut pkt, opts))?;
        Ok(Nic::with_publisher(inner, thread, describe).with_filter(filter))
    }

    fn with_publisher(inner: Arc<Inner>, thread: JoinHandle<()>, describe: String) -> Nic {
        let name = Arc::new(Mutex::new(Names::default()));
        let (i, n, d) = (inner.clone(), name.clone(), describe.clone());
        // The thread inherits this thread's network namespace: the names and netns it
        // reports are those of the namespace the NIC was started in.
        let netns = stat::netns();
        let publisher = stat::Publisher::start(move || snapshot(&i, &n, &d, &netns));
        Nic {
            inner,
            thread: Some(thread),
            describe,
            name,
            publisher,
            filter: None,
        }
    }

    /// Keep the packet device's receive filter in step with the QPs (called with the device
    /// locked, after every verb that may change which frames they take, before it returns:
    /// a peer that learns of a QP from the application never meets a filter that predates
    /// it). A program the kernel refuses takes the filter off (every frame reaches the
    /// engine, as without one) until the next change, which tries again.
    fn refilter(&self, d: &Device) {
        use crate::io::udp_filter::{Scope, EXACT_MAX};
        let Some(f) = &self.filter else { return };
        let mut f = lock(f);
        let gen = d.scope_gen();
        if f.1 == Some(gen) {
            return;
        }
        match f.0.set(Scope::from(d.receive_scope(EXACT_MAX))) {
            Ok(()) => f.1 = Some(gen),
            Err(e) => {
                self.inner.io_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "UDP socket filter refused: removed, every datagram reaches the engine");
                let _ = f.0.clear();
                f.1 = Some(u64::MAX);
            }
        }
    }

    /// Start with `filter` as the packet device's receive filter.
    fn with_filter(mut self, filter: Option<crate::io::udp_filter::SocketFilter>) -> Nic {
        self.filter = filter.map(|f| Mutex::new((f, None)));
        let d = lock(&self.inner.dev);
        self.refilter(&d);
        drop(d);
        self
    }

    /// The device name `ferroce stat` and `ferroce res qp` show for this NIC (default:
    /// `ferroce_<interface>` of the interface holding its first GID, else `ferroce`).
    pub fn set_name(&self, name: &str) {
        lock(&self.name).name = Some(name.to_string());
    }

    /// What this process runs on the NIC, as `ferroce stat` shows it (for example
    /// `ferroce perf: RDMA_Write BW Test`).
    pub fn set_label(&self, label: &str) {
        lock(&self.name).label = label.to_string();
    }

    /// What `ferroce stat` and `ferroce res qp` see of this NIC now.
    pub fn stat(&self) -> stat::NicStat {
        snapshot(&self.inner, &self.name, &self.describe, &stat::netns())
    }

    /// The packet device's description.
    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// Run `f` with the device locked (control path).
    pub fn with_device<R>(&self, f: impl FnOnce(&mut Device) -> R) -> R {
        let mut d = lock(&self.inner.dev);
        let r = f(&mut d);
        self.refilter(&d);
        r
    }

    /// Serve `local` too, from now on (an address the interface gained): the packet device
    /// opens what it needs for it ([`PacketDevice::serve_address`]; the UDP backend's set, a
    /// socket), then the device's GID table takes it ([`Device::add_gid`]). Returns its GID
    /// index. Only where the application's threads drive the engine ([`PollMode::Inline`]):
    /// an engine thread of its own holds the packet device (`Unsupported`).
    pub fn serve_address(&self, local: std::net::IpAddr) -> std::io::Result<u8> {
        let Some(m) = &self.inner.inline else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "an engine thread of its own holds the packet device",
            ));
        };
        lock(m).pkt.serve_address(local)?;
        self.with_device(|d| d.add_gid(local)).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                "the GID table is full (256 entries)",
            )
        })
    }

    /// `ibv_query_device` (see [`Device::query_device`]).
    pub fn query_device(&self) -> crate::verbs::DeviceAttr {
        self.with_device(|d| d.query_device())
    }

    /// `ibv_alloc_pd` (see [`Device::alloc_pd`]).
    pub fn alloc_pd(&self) -> Result<Pd, VerbsError> {
        self.with_device(|d| d.alloc_pd())
    }

    /// `ibv_dealloc_pd` (see [`Device::dealloc_pd`]).
    pub fn dealloc_pd(&self, pd: Pd) -> Result<(), VerbsError> {
        self.with_device(|d| d.dealloc_pd(pd))
    }

    /// `ibv_reg_mr`: `len` bytes owned by the region (see [`Device::reg_mr`]).
    pub fn reg_mr(
        &self,
        pd: Pd,
        len: usize,
        access: crate::verbs::AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        self.with_device(|d| d.reg_mr(pd, len, access))
    }

    /// `ibv_reg_mr` on the application's own memory (see [`Device::reg_mr_app`]).
    pub fn reg_mr_app(
        &self,
        pd: Pd,
        mem: impl Into<crate::verbs::UserMemory>,
        iova: u64,
        access: crate::verbs::AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        self.with_device(|d| d.reg_mr_app(pd, mem, iova, access))
    }

    /// `ibv_rereg_mr` keeping the keys (see [`Device::rereg_mr_app`]).
    pub fn rereg_mr_app(
        &self,
        mr: &MemoryRegion,
        pd: Pd,
        mem: impl Into<crate::verbs::UserMemory>,
        iova: u64,
        access: crate::verbs::AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        self.with_device(|d| d.rereg_mr_app(mr, pd, mem, iova, access))
    }

    /// `ibv_dereg_mr` (see [`Device::dereg_mr`]).
    pub fn dereg_mr(&self, mr: &MemoryRegion) -> Result<(), VerbsError> {
        self.with_device(|d| d.dereg_mr(mr))
    }

    /// `ibv_alloc_mw` (see [`Device::alloc_mw`]).
    pub fn alloc_mw(
        &self,
        pd: Pd,
        kind: crate::verbs::MwType,
    ) -> Result<crate::verbs::MemoryWindow, VerbsError> {
        self.with_device(|d| d.alloc_mw(pd, kind))
    }

    /// `ibv_dealloc_mw` (see [`Device::dealloc_mw`]).
    pub fn dealloc_mw(&self, mw: &crate::verbs::MemoryWindow) -> Result<(), VerbsError> {
        self.with_device(|d| d.dealloc_mw(mw))
    }

    /// The registered region with local key `lkey`, if any (see [`Device::mr_by_lkey`]).
    pub fn mr_by_lkey(&self, lkey: crate::ib::mr::LKey) -> Option<MemoryRegion> {
        self.with_device(|d| d.mr_by_lkey(lkey))
    }

    /// `ibv_create_cq`, with its lock-free completion queue.
    pub fn create_cq(&self, depth: usize) -> Result<Cq, VerbsError> {
        // The shadow is put in place under the device lock (taken before the shadows' lock,
        // as the engine does), so the engine never sees the new CQ with the shadow of a
        // destroyed one that had its number.
        let mut dev = lock(&self.inner.dev);
        let cq = dev.create_cq(depth)?;
        let mut cqs = self.inner.cqs.write().unwrap_or_else(|e| e.into_inner());
        let i = cq.0 as usize;
        while cqs.len() <= i {
            cqs.push(CqShadow::new(0));
        }
        cqs[i] = CqShadow::new(depth);
        Ok(cq)
    }

    /// `ibv_resize_cq` (see [`Device::resize_cq`]): the CQ holds `depth` completions from now
    /// on; refused (`BadCap`, EINVAL) below one, above `max_cqe`, or below what it holds now.
    pub fn resize_cq(&self, cq: Cq, depth: usize) -> Result<(), VerbsError> {
        let mut dev = lock(&self.inner.dev);
        let cqs = self.inner.cqs.read().unwrap_or_else(|e| e.into_inner());
        let c = cqs.get(cq.0 as usize).ok_or(VerbsError::NoSuchCq)?;
        // Under the device lock: the engine moves no completion to the shadow meanwhile.
        dev.resize_cq(cq, depth, c.len.load(Ordering::Acquire))?;
        c.depth.store(depth, Ordering::Release);
        Ok(())
    }

    /// `ibv_destroy_cq` (see [`Device::destroy_cq`]); its completions not yet polled go
    /// with it.
    pub fn destroy_cq(&self, cq: Cq) -> Result<(), VerbsError> {
        let mut dev = lock(&self.inner.dev);
        dev.destroy_cq(cq)?;
        let mut cqs = self.inner.cqs.write().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = cqs.get_mut(cq.0 as usize) {
            *c = CqShadow::new(0);
        }
        Ok(())
    }

    /// `ibv_create_qp` (RC, UC or UD, with or without an SRQ), with the QP's lock-free shadow
    /// for posting.
    pub fn create_qp(&self, init: QpInitAttr) -> Result<QpNumber, VerbsError> {
        self.create_with(init, Device::create_qp)
    }

    /// QP1, the GSI (see [`Device::create_gsi_qp`]).
    pub fn create_gsi_qp(&self, init: QpInitAttr) -> Result<QpNumber, VerbsError> {
        self.create_with(init, Device::create_gsi_qp)
    }

    /// A QP made by `make` on the device, with its shadow holding what the device granted.
    fn create_with(
        &self,
        init: QpInitAttr,
        make: fn(&mut Device, QpInitAttr) -> Result<QpNumber, VerbsError>,
    ) -> Result<QpNumber, VerbsError> {
        let (qpn, cap) = self.with_device(|d| {
            let qpn = make(d, init)?;
            Ok::<_, VerbsError>((qpn, d.qp_cap(qpn)?))
        })?;
        self.add_shadow(qpn, QpInitAttr { cap, ..init });
        Ok(qpn)
    }

    /// What the QP was granted (`Device::qp_cap`), from its shadow (no device lock).
    pub fn qp_cap(&self, qpn: QpNumber) -> Result<crate::verbs::QpCap, VerbsError> {
        Ok(self.shadow(qpn)?.cap)
    }

    /// `ibv_destroy_qp`. The receives and sends still in the doorbell are applied first (and
    /// complete or flush with the QP as any posted before them), never to a later object.
    /// Then the QP's completions not polled yet are removed from its send and receive CQs
    /// (from the device's rings and from the queues `poll_cq` reads), as rdma-core's providers
    /// clean a destroyed QP out of its CQs: `poll_cq` never returns a completion of a
    /// destroyed QP, not even a flush produced after its last `poll_cq`.
    pub fn destroy_qp(&self, qpn: QpNumber) -> Result<(), VerbsError> {
        // A delayed ACK the QP holds leaves before the QP goes: the peer's last request was
        // executed, and without its ACK the peer would retry it until its retry count runs
        // out (a ping-pong whose side that received last destroys its QP and exits).
        let now = self.inner.now();
        if self.with_device(|d| d.release_held_ack(qpn, now)) {
            self.settle(Duration::from_millis(50));
        }
        let in_groups = {
            let mut dev = lock(&self.inner.dev);
            ring_doorbells(&self.inner, &mut dev);
            let cqs = [dev.send_cq_of(qpn), dev.recv_cq_of(qpn)];
            let g = dev.mcast_groups().len();
            dev.destroy_qp(qpn)?;
            self.refilter(&dev);
            // Under the device lock: the engine adds no completion meanwhile.
            purge_shadows(&self.inner, cqs, qpn);
            g != dev.mcast_groups().len()
        };
        self.inner
            .qps
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&qpn.get());
        if in_groups {
            self.sync_groups();
        }
        Ok(())
    }

    /// `ibv_attach_mcast` (see [`Device::attach_mcast`]); the packet device joins the group
    /// at the engine's next step (a join the packet device refuses is logged and counted in
    /// the I/O errors: the QP then receives nothing from the group).
    pub fn attach_mcast(&self, qpn: QpNumber, group: std::net::IpAddr) -> Result<(), VerbsError> {
        self.with_device(|d| d.attach_mcast(qpn, group))?;
        self.sync_groups();
        Ok(())
    }

    /// `ibv_detach_mcast` (see [`Device::detach_mcast`]); the packet device leaves a group
    /// no QP is attached to any more.
    pub fn detach_mcast(&self, qpn: QpNumber, group: std::net::IpAddr) -> Result<(), VerbsError> {
        self.with_device(|d| d.detach_mcast(qpn, group))?;
        self.sync_groups();
        Ok(())
    }

    /// Make the packet device's group memberships what the attached QPs want before
    /// returning (bounded): as `ibv_attach_mcast` on a kernel device, a datagram sent to the
    /// group once the call has returned is received. The engine's thread (or the inline
    /// engine) joins: wait until it has taken the change and finished joining.
    fn sync_groups(&self) {
        let want = self.with_device(|d| d.mcast_groups());
        *lock(&self.inner.groups_want) = want;
        self.inner.groups_dirty.store(true, Ordering::SeqCst);
        let t0 = std::time::Instant::now();
        loop {
            self.ring_engine();
            self.progress();
            if !self.inner.groups_dirty.load(Ordering::SeqCst) {
                // Taken: the step that took it holds `groups_have` while it joins.
                drop(lock(&self.inner.groups_have));
                return;
            }
            if t0.elapsed() >= Duration::from_millis(500) || self.inner.stop.load(Ordering::Acquire)
            {
                return;
            }
            std::thread::yield_now();
        }
    }

    /// `init.cap` is what the device granted (`Device::qp_cap`).
    fn add_shadow(&self, qpn: QpNumber, init: QpInitAttr) {
        let sh = Arc::new(QpShadow {
            qp_type: init.qp_type,
            pd: init.pd,
            // An XRC QP has no receive queue either: a target's receives are its XRC SRQs'
            // (the device counts their completions as the QP's retired receives, which
            // `post_recv`'s arithmetic must never see: found by the C entry point fuzzer).
            no_rq: init.srq.is_some() || init.qp_type.is_xrc(),
            cap: init.cap,
            state: AtomicU8::new(state_code(QpState::Reset)),
            sq_posted: AtomicU64::new(0),
            sq_retired: AtomicU64::new(0),
            rq_posted: AtomicU64::new(0),
            rq_retired: AtomicU64::new(0),
        });
        self.inner
            .qps
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(qpn.get(), sh);
    }

    fn shadow(&self, qpn: QpNumber) -> Result<Arc<QpShadow>, VerbsError> {
        self.inner
            .qps
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&qpn.get())
            .cloned()
            .ok_or(VerbsError::NoSuchQp(qpn))
    }

    fn refresh_state(&self, qpn: QpNumber, d: &Device) {
        if let (Ok(sh), Ok((st, _))) = (self.shadow(qpn), d.query_qp(qpn)) {
            sh.state.store(state_code(st), Ordering::Release);
        }
    }

    /// `ibv_modify_qp` (see [`Device::modify_qp`]).
    pub fn modify_qp(
        &self,
        qpn: QpNumber,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), VerbsError> {
        let mut d = lock(&self.inner.dev);
        ring_doorbells(&self.inner, &mut d);
        let r = d.modify_qp(qpn, attr, mask);
        self.refresh_state(qpn, &d);
        self.refilter(&d);
        // To RESET: its completions already handed to the CQs' shadows go too (the device
        // purged its own rings; see Device::modify_qp), under the device lock as in
        // destroy_qp.
        if r.is_ok() && mask.contains(QpAttrMask::STATE) && attr.qp_state == QpState::Reset {
            purge_shadows(&self.inner, [d.send_cq_of(qpn), d.recv_cq_of(qpn)], qpn);
        }
        r
    }

    /// RESET → INIT → RTR → RTS (see [`Device::connect_rc`]).
    pub fn connect_rc(
        &self,
        qpn: QpNumber,
        remote: &RemoteQp,
        p: &RcParams,
    ) -> Result<(), VerbsError> {
        let mut d = lock(&self.inner.dev);
        let r = d.connect_rc(qpn, remote, p);
        self.refresh_state(qpn, &d);
        self.refilter(&d);
        r
    }

    /// UC: RESET → INIT → RTR → RTS (see [`Device::connect_uc`]).
    pub fn connect_uc(
        &self,
        qpn: QpNumber,
        remote: &RemoteQp,
        p: &UcParams,
    ) -> Result<(), VerbsError> {
        let mut d = lock(&self.inner.dev);
        let r = d.connect_uc(qpn, remote, p);
        self.refresh_state(qpn, &d);
        self.refilter(&d);
        r
    }

    /// UD: RESET → INIT → RTR → RTS (see [`Device::bring_up_ud`]).
    pub fn bring_up_ud(&self, qpn: QpNumber, p: &UdParams) -> Result<(), VerbsError> {
        let mut d = lock(&self.inner.dev);
        let r = d.bring_up_ud(qpn, p);
        self.refresh_state(qpn, &d);
        self.refilter(&d);
        r
    }

    /// `ibv_query_qp`.
    pub fn query_qp(&self, qpn: QpNumber) -> Result<(QpState, QpAttr), VerbsError> {
        self.with_device(|d| d.query_qp(qpn))
    }

    // ---- shared receive queues ----------------------------------------------------------

    /// `ibv_create_srq` (see [`Device::create_srq`]), with its lock-free shadow for posting.
    pub fn create_srq(&self, pd: Pd, attr: SrqAttr) -> Result<Srq, VerbsError> {
        let srq = self.with_device(|d| d.create_srq(pd, attr))?;
        self.add_srq_shadow(srq, attr)
    }

    /// An XRC SRQ (see [`Device::create_xrc_srq`]), with its shadow.
    pub fn create_xrc_srq(
        &self,
        pd: Pd,
        attr: SrqAttr,
        xrcd: crate::verbs::Xrcd,
        cq: Cq,
    ) -> Result<Srq, VerbsError> {
        let srq = self.with_device(|d| d.create_xrc_srq(pd, attr, xrcd, cq))?;
        self.add_srq_shadow(srq, attr)
    }

    /// `ibv_open_xrcd` (see [`Device::alloc_xrcd`]).
    pub fn alloc_xrcd(&self) -> Result<crate::verbs::Xrcd, VerbsError> {
        self.with_device(Device::alloc_xrcd)
    }

    /// `ibv_close_xrcd` (see [`Device::dealloc_xrcd`]).
    pub fn dealloc_xrcd(&self, xrcd: crate::verbs::Xrcd) -> Result<(), VerbsError> {
        self.with_device(|d| d.dealloc_xrcd(xrcd))
    }

    fn add_srq_shadow(&self, srq: Srq, attr: SrqAttr) -> Result<Srq, VerbsError> {
        let max_sge = self.with_device(|d| d.query_srq(srq))?.max_sge;
        self.inner
            .srqs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                srq.number(),
                Arc::new(SrqShadow {
                    max_wr: AtomicU64::new(u64::from(attr.max_wr)),
                    max_sge,
                    posted: AtomicU64::new(0),
                    taken: AtomicU64::new(0),
                }),
            );
        Ok(srq)
    }

    /// `ibv_modify_srq` (see [`Device::modify_srq`]).
    pub fn modify_srq(
        &self,
        srq: Srq,
        attr: &SrqAttr,
        mask: SrqAttrMask,
    ) -> Result<(), VerbsError> {
        // Receives still in the doorbell count towards what the SRQ holds.
        self.drain_doorbells();
        self.with_device(|d| d.modify_srq(srq, attr, mask))?;
        if mask.contains(SrqAttrMask::MAX_WR) {
            if let Ok(sh) = self.srq_shadow(srq) {
                sh.max_wr.store(u64::from(attr.max_wr), Ordering::Release);
            }
        }
        Ok(())
    }

    /// `ibv_query_srq`.
    pub fn query_srq(&self, srq: Srq) -> Result<SrqAttr, VerbsError> {
        self.with_device(|d| d.query_srq(srq))
    }

    /// `ibv_destroy_srq` (EBUSY while QPs are attached). The receives still in the doorbell
    /// are applied first: left there, they went into the next SRQ given the same number (its
    /// shadow then counted more WQEs taken than posted: `posted - taken` overflowed in
    /// `post_srq_recv`, found by the C entry point fuzzer after 775,600 runs).
    pub fn destroy_srq(&self, srq: Srq) -> Result<(), VerbsError> {
        {
            let mut dev = lock(&self.inner.dev);
            ring_doorbells(&self.inner, &mut dev);
            dev.destroy_srq(srq)?;
        }
        self.inner
            .srqs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&srq.number());
        Ok(())
    }

    fn srq_shadow(&self, srq: Srq) -> Result<Arc<SrqShadow>, VerbsError> {
        self.inner
            .srqs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&srq.number())
            .cloned()
            .ok_or(VerbsError::NoSuchSrq)
    }

    /// `ibv_post_srq_recv`, without taking the device lock.
    pub fn post_srq_recv(&self, srq: Srq, wr: RecvWr) -> Result<(), VerbsError> {
        let sh = self.srq_shadow(srq)?;
        if wr.sg_list.len() > sh.max_sge as usize {
            return Err(VerbsError::TooManySge(wr.sg_list.len()));
        }
        let posted = sh.posted.load(Ordering::Relaxed);
        if posted - sh.taken.load(Ordering::Acquire) >= sh.max_wr.load(Ordering::Acquire) {
            return Err(VerbsError::QueueFull);
        }
        sh.posted.store(posted + 1, Ordering::Relaxed);
        self.inner.doorbell.push(Doorbell::SrqRecv(srq, wr));
        if self.inner.inline.is_none() {
            self.ring();
        }
        Ok(())
    }

    /// Apply the doorbells rung so far (under the device lock), so that a control verb sees
    /// every request posted before it.
    fn drain_doorbells(&self) {
        let mut dev = lock(&self.inner.dev);
        ring_doorbells(&self.inner, &mut dev);
    }

    // ---- address handles and events -------------------------------------------------------

    /// `ibv_create_ah` (see [`Device::create_ah`]).
    pub fn create_ah(&self, pd: Pd, av: &AddressVector) -> Result<Ah, VerbsError> {
        let ah = self.with_device(|d| d.create_ah(pd, av))?;
        self.inner
            .ahs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ah.index(), pd);
        Ok(ah)
    }

    /// `ibv_init_ah_from_wc` (see [`Device::init_ah_from_wc`]).
    pub fn init_ah_from_wc(
        &self,
        wc: &WorkCompletion,
        grh: &[u8],
    ) -> Result<AddressVector, VerbsError> {
        self.with_device(|d| d.init_ah_from_wc(wc, grh))
    }

    /// `ibv_create_ah_from_wc` (see [`Device::create_ah_from_wc`]).
    pub fn create_ah_from_wc(
        &self,
        pd: Pd,
        wc: &WorkCompletion,
        grh: &[u8],
    ) -> Result<Ah, VerbsError> {
        let av = self.init_ah_from_wc(wc, grh)?;
        self.create_ah(pd, &av)
    }

    /// `ibv_destroy_ah`.
    pub fn destroy_ah(&self, ah: Ah) -> Result<(), VerbsError> {
        self.with_device(|d| d.destroy_ah(ah))?;
        self.inner
            .ahs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ah.index());
        Ok(())
    }

    /// `ibv_get_async_event`: the oldest unread asynchronous event, waiting up to `timeout`
    /// for one.
    pub fn get_async_event(&self, timeout: Duration) -> Option<AsyncEvent> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            self.progress();
            if let Some(e) = self.with_device(|d| d.get_async_event()) {
                return Some(e);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Call `f` (on the engine's thread, briefly) whenever asynchronous events have been
    /// queued since the engine last looked, e.g. to make a descriptor readable for a program
    /// that `poll()`s it before `ibv_get_async_event`.
    pub fn set_async_notify(&self, f: Option<CqNotify>) {
        *lock(&self.inner.async_notify) = f;
    }

    /// Hand every asynchronous event to `f` (on the engine's thread, with the device held:
    /// `f` must not call into this `Nic`) instead of queueing it for
    /// [`Nic::get_async_event`], e.g. to route each event to the context that owns the
    /// object it names. Events already queued are handed over at the engine's next step.
    pub fn set_async_sink(&self, f: Option<AsyncSink>) {
        *lock(&self.inner.async_sink) = f;
        // The next step looks at the queue again.
        self.inner.async_seen.store(u64::MAX, Ordering::Relaxed);
    }

    /// Asynchronous events waiting to be read.
    pub fn async_events_pending(&self) -> usize {
        self.with_device(|d| d.async_events_pending())
    }

    /// This end of a QP, for the peer (see [`Device::local_end`]).
    pub fn local_end(&self, qpn: QpNumber, sgid_index: usize, psn: u32) -> Option<RemoteQp> {
        self.with_device(|d| d.local_end(qpn, sgid_index, psn))
    }

    /// `ibv_post_send`, without taking the device lock: the checks `ibv_post_send` makes
    /// (state, the request itself, room) against the QP's shadow.
    pub fn post_send(&self, qpn: QpNumber, wr: SendWr) -> Result<(), VerbsError> {
        let sh = self.shadow(qpn)?;
        let st = state_of(sh.state.load(Ordering::Acquire));
        if matches!(st, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(VerbsError::InvalidState(st));
        }
        crate::verbs::device::check_send_wr(&wr, &sh.cap)?;
        if !wr.op.allowed_on(sh.qp_type) {
            return Err(VerbsError::BadOpcode(sh.qp_type));
        }
        if sh.qp_type == QpType::Ud {
            let d = wr.ud.ok_or(VerbsError::NoUdDest)?;
            let ahs = self.inner.ahs.read().unwrap_or_else(|e| e.into_inner());
            if ahs.get(&d.ah.index()) != Some(&sh.pd) {
                return Err(VerbsError::NoSuchAh);
            }
        }
        let posted = sh.sq_posted.load(Ordering::Relaxed);
        if posted - sh.sq_retired.load(Ordering::Acquire) >= u64::from(sh.cap.max_send_wr) {
            return Err(VerbsError::QueueFull);
        }
        sh.sq_posted.store(posted + 1, Ordering::Relaxed);
        self.inner.doorbell.push(Doorbell::Send(qpn, wr));
        self.ring();
        Ok(())
    }

    /// `ibv_post_recv`, without taking the device lock.
    pub fn post_recv(&self, qpn: QpNumber, wr: RecvWr) -> Result<(), VerbsError> {
        let sh = self.shadow(qpn)?;
        let st = state_of(sh.state.load(Ordering::Acquire));
        if st == QpState::Reset {
            return Err(VerbsError::InvalidState(st));
        }
        if sh.no_rq {
            return Err(VerbsError::QpHasSrq);
        }
        if wr.sg_list.len() > sh.cap.max_recv_sge.max(1) as usize {
            return Err(VerbsError::TooManySge(wr.sg_list.len()));
        }
        let posted = sh.rq_posted.load(Ordering::Relaxed);
        if posted - sh.rq_retired.load(Ordering::Acquire) >= u64::from(sh.cap.max_recv_wr) {
            return Err(VerbsError::QueueFull);
        }
        sh.rq_posted.store(posted + 1, Ordering::Relaxed);
        self.inner.doorbell.push(Doorbell::Recv(qpn, wr));
        // An inline engine takes a receive with its next round (the application's next verb
        // call that drives it, or the background thread): posting one sends nothing, and
        // running a round here would only delay the application's next send.
        if self.inner.inline.is_none() {
            self.ring();
        }
        Ok(())
    }

    /// [`PollMode::Inline`]: run the engine now (receive, QPs, timers, transmit, completions)
    /// until it finds nothing more to do, at most a few rounds; returns the work done. A no-op
    /// (0) with an engine thread, or while another thread is driving the engine.
    pub fn progress(&self) -> usize {
        if self.inner.inline.is_none() {
            return 0;
        }
        self.inner.last_app_drive.store(
            self.inner.epoch.elapsed().as_nanos() as u64,
            Ordering::Relaxed,
        );
        inline_progress(&self.inner)
    }

    /// [`PollMode::Inline`]: how long `wait_cq` and `get_cq_event` busy-poll the engine before
    /// they sleep in the packet device. Default [`INLINE_WAIT_SPIN`], none on a one-CPU host
    /// ([`spin_budget`]).
    pub fn set_wait_spin(&self, d: Duration) {
        self.inner.wait_spin_ns.store(
            d.as_nanos().min(u128::from(u64::MAX)) as u64,
            Ordering::Relaxed,
        );
    }

    /// [`PollMode::Inline`]: how long the background thread, once it has taken over, drives
    /// the engine without sleeping after a round that did work. Default
    /// [`INLINE_BACKGROUND_SPIN`], none on a one-CPU host ([`spin_budget`]); zero sleeps in
    /// the packet device after every round.
    pub fn set_background_spin(&self, d: Duration) {
        self.inner.bg_spin_ns.store(
            d.as_nanos().min(u128::from(u64::MAX)) as u64,
            Ordering::Relaxed,
        );
    }

    /// [`PollMode::Inline`]: drive the engine until `ready()` or `deadline`, sleeping in the
    /// packet device (at most until the next timer) when there is nothing to do.
    fn inline_wait(&self, deadline: std::time::Instant, ready: &dyn Fn() -> bool) -> bool {
        let Some(m) = &self.inner.inline else {
            return ready();
        };
        let spin = Duration::from_nanos(self.inner.wait_spin_ns.load(Ordering::Relaxed));
        let mut idle_since = std::time::Instant::now();
        let mut spinner = Spinner::new();
        loop {
            if self.progress() > 0 {
                idle_since = std::time::Instant::now();
            }
            if ready() {
                return true;
            }
            let now = std::time::Instant::now();
            // A signal handler ran while this thread waited, and the caller wants to know
            // (`crate::io::event::watch_interrupts`): give up the wait.
            if now >= deadline || crate::io::event::interrupted() {
                return false;
            }
            // Spin briefly (the answer is usually microseconds away), then sleep in the
            // device until a frame arrives, the next timer or the deadline.
            if now.duration_since(idle_since) < spin {
                spinner.pause();
                continue;
            }
            let Ok(mut e) = m.try_lock() else {
                std::thread::yield_now();
                continue;
            };
            // The background thread may have held the engine since `ready()` was last
            // asked, and made what this thread waits for from a frame it took: the frame is
            // gone from the device, and a sleep there would last the whole slice.
            // Completions are made under the engine's lock, so with it held the answer holds.
            if ready() {
                return true;
            }
            let e = &mut *e;
            let at = self.inner.epoch.elapsed().as_nanos() as u64;
            let wait = until_timer(
                (deadline - now).min(Duration::from_millis(1)),
                e.next_timer,
                at,
            );
            // This thread drives the engine while it waits in the device: the background
            // thread is not to take over (and wait on the same device) before the wait ends.
            self.inner
                .last_app_drive
                .store(at.saturating_add(wait.as_nanos() as u64), Ordering::Relaxed);
            if e.pkt.wait_readable(Some(wait)).is_err() {
                self.inner.io_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Wake a sleeping engine thread.
    fn ring_engine(&self) {
        if self.inner.sleeping.load(Ordering::SeqCst) {
            self.inner.wake.signal();
        }
    }

    /// Wake the engine if it sleeps (a system call only then).
    fn ring(&self) {
        if self.inner.inline.is_some() {
            self.progress();
            return;
        }
        if self.inner.sleeping.load(Ordering::SeqCst) {
            self.inner.wake.signal();
        }
    }

    fn cq(&self, cq: Cq) -> Result<Arc<CqShadow>, VerbsError> {
        self.inner
            .cqs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(cq.0 as usize)
            .cloned()
            .ok_or(VerbsError::NoSuchCq)
    }

    /// `ibv_poll_cq`, without taking the device lock.
    pub fn poll_cq(
        &self,
        cq: Cq,
        out: &mut Vec<WorkCompletion>,
        max: usize,
    ) -> Result<usize, VerbsError> {
        let c = self.cq(cq)?;
        if self.inner.inline.is_some() && c.len.load(Ordering::Acquire) < max {
            self.progress();
        }
        let mut n = 0;
        let _take = lock(&c.take);
        while n < max {
            let Some(wc) = c.q.pop() else { break };
            c.len.fetch_sub(1, Ordering::AcqRel);
            out.push(wc);
            n += 1;
        }
        if self.inner.inline.is_none() {
            empty_poll_yield(n == 0);
        }
        Ok(n)
    }

    /// Block until the CQ holds a completion or `timeout` passes; true if one is there.
    pub fn wait_cq(&self, cq: Cq, timeout: Duration) -> Result<bool, VerbsError> {
        let c = self.cq(cq)?;
        let deadline = std::time::Instant::now() + timeout;
        if self.inner.inline.is_some() {
            return Ok(self.inline_wait(deadline, &|| c.len.load(Ordering::Acquire) > 0));
        }
        self.wait_cq_passive(cq, timeout)
    }

    /// Block until the CQ holds a completion or `timeout` passes, without driving the engine:
    /// for a service thread (the RDMA-CM's) that must not take the engine from the
    /// application. With [`PollMode::Inline`] the application's calls or, while it leaves the
    /// engine alone, the background thread produce the completion. [`Nic::wait_cq`] would
    /// sleep in the packet device holding the engine, so the application's posts would wait
    /// in the doorbell queue until a frame or a 1 ms timeout woke that thread (perftest's `-R`
    /// latency tests measured milliseconds per round trip).
    pub fn wait_cq_passive(&self, cq: Cq, timeout: Duration) -> Result<bool, VerbsError> {
        let c = self.cq(cq)?;
        let deadline = std::time::Instant::now() + timeout;
        Ok(c.wait_until(deadline, &|| c.len.load(Ordering::SeqCst) > 0))
    }

    /// `ibv_req_notify_cq`.
    pub fn req_notify_cq(&self, cq: Cq, mode: NotifyMode) -> Result<(), VerbsError> {
        let c = self.cq(cq)?;
        c.armed.store(
            if mode == NotifyMode::SolicitedOnly {
                2
            } else {
                1
            },
            Ordering::SeqCst,
        );
        // Ordered before the program's next poll of the queue (see the engine's read of
        // `armed` after it queues completions).
        std::sync::atomic::fence(Ordering::SeqCst);
        Ok(())
    }

    /// Bind the CQ to a completion channel: `f` runs (on the engine's thread, briefly) with
    /// every notification that fires, e.g. to make the channel's descriptor readable for a
    /// program that `poll()`s it before `get_cq_event`.
    pub fn set_cq_notify(&self, cq: Cq, f: Option<CqNotify>) -> Result<(), VerbsError> {
        *lock(&self.cq(cq)?.channel) = f;
        Ok(())
    }

    /// Notifications that fired and were not taken by `get_cq_event` yet.
    pub fn cq_events_pending(&self, cq: Cq) -> Result<u64, VerbsError> {
        Ok(self.cq(cq)?.events.load(Ordering::Acquire))
    }

    /// Whether the engine runs inline, in the application's calls ([`PollMode::Inline`]):
    /// then waits drive it, else an engine thread does.
    pub fn drives_inline(&self) -> bool {
        self.inner.inline.is_some()
    }

    /// `ibv_get_cq_event`: block until an armed notification fires or `timeout` passes.
    pub fn get_cq_event(&self, cq: Cq, timeout: Duration) -> Result<bool, VerbsError> {
        let c = self.cq(cq)?;
        let deadline = std::time::Instant::now() + timeout;
        let take = || {
            let e = c.events.load(Ordering::SeqCst);
            e > 0
                && c.events
                    .compare_exchange(e, e - 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
        };
        if self.inner.inline.is_some() {
            return Ok(self.inline_wait(deadline, &take));
        }
        Ok(c.wait_until(deadline, &take))
    }

    /// Block until any CQ of `cqs` holds a completion event or `timeout` passes; true if one
    /// does (the event is left for [`Nic::get_cq_event`] to take). For a completion channel
    /// with several CQs: waiting on each in turn would sleep on one while another's event
    /// waits.
    pub fn wait_cq_events(&self, cqs: &[Cq], timeout: Duration) -> Result<bool, VerbsError> {
        let shadows = cqs
            .iter()
            .map(|&c| self.cq(c))
            .collect::<Result<Vec<_>, _>>()?;
        let deadline = std::time::Instant::now() + timeout;
        let any = || shadows.iter().any(|c| c.events.load(Ordering::SeqCst) > 0);
        if self.inner.inline.is_some() {
            return Ok(self.inline_wait(deadline, &any));
        }
        // An engine thread makes the events: look again in short steps.
        while !any() {
            if std::time::Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(true)
    }

    /// Let every held (delayed) ACK go now and wait, at most `timeout`, until the engine has
    /// sent them: what a process that exits with its QPs open needs (the library's exit
    /// handler), since a peer whose last request was answered only by a held ACK would retry
    /// it until its retry count runs out. Returns how many QPs held one.
    pub fn release_held_acks(&self, timeout: Duration) -> usize {
        let now = self.inner.now();
        let held = self.with_device(|d| d.release_held_acks(now));
        if held > 0 {
            self.settle(timeout);
        }
        held
    }

    /// Wait until the engine has taken in every frame that was waiting in the packet device
    /// when this was called: until a whole engine round that began after the call found
    /// nothing to receive. `false` if that did not happen within `timeout` (frames kept
    /// arriving, or the engine is stopped).
    ///
    /// Unreliable transports need it: a UC or UD sender's completion says the packet left,
    /// not that the receiver has placed it, so a receiver told "done" out of band (perftest's
    /// final exchange) settles its NIC before it looks at the memory.
    pub fn settle(&self, timeout: Duration) -> bool {
        let quiet = || self.inner.quiet_rounds.load(Ordering::Acquire);
        // A round already running may have looked before the call and count after it: the
        // second quiet round from here is the first one wholly after the call.
        let want = quiet() + 2;
        let t0 = std::time::Instant::now();
        loop {
            if self.progress() == 0 && quiet() < want {
                self.ring_engine();
                std::thread::yield_now();
            }
            if quiet() >= want {
                return true;
            }
            if t0.elapsed() >= timeout || self.inner.stop.load(Ordering::Acquire) {
                return false;
            }
        }
    }

    /// Device counters, QP totals and the packet device's counters.
    pub fn counters(&self) -> (DeviceCounters, QpCounters, IoStats) {
        // Ask the engine for fresh packet-device counters and wait (briefly) for them.
        let gen = self.inner.stats_gen.load(Ordering::Acquire);
        self.inner.stats_req.store(true, Ordering::Release);
        let t0 = std::time::Instant::now();
        while self.inner.stats_gen.load(Ordering::Acquire) == gen
            && t0.elapsed() < Duration::from_millis(50)
        {
            if self.progress() == 0 {
                self.ring_engine();
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        let (d, q) = self.with_device(|d| d.counters());
        (d, q, *lock(&self.inner.io_stats))
    }

    /// Seconds since the NIC started, and every QP's congestion-control state now (see
    /// [`Device::cc_snapshot`]).
    #[allow(clippy::type_complexity)]
    pub fn cc_snapshot(&self) -> (f64, Vec<(QpNumber, u64, Option<f64>, u64, u64)>) {
        let el = self.inner.epoch.elapsed();
        let now = Instant::from_nanos(el.as_nanos() as u64);
        (el.as_secs_f64(), self.with_device(|d| d.cc_snapshot(now)))
    }

    /// A QP's counters.
    pub fn qp_counters(&self, qpn: QpNumber) -> Option<QpCounters> {
        self.with_device(|d| d.qp_counters(qpn))
    }

    /// Packet-device errors the engine has seen (and carried on after).
    pub fn io_errors(&self) -> u64 {
        self.inner.io_errors.load(Ordering::Relaxed)
    }

    /// Stop the engine thread and release the packet device.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.wake.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
            tracing::info!(
                device = %self.describe,
                io_errors = self.io_errors(),
                "NIC stopped"
            );
        }
        // After the engine (its last held ACKs out first): stop answering `ferroce stat`.
        self.publisher = None;
    }
}

impl Drop for Nic {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A NIC's name and label for [`stat`].
#[derive(Default)]
struct Names {
    name: Option<String>,
    label: String,
}

/// A [`stat::NicStat`] of the NIC now (the device lock held while the QPs are read).
fn snapshot(inner: &Inner, names: &Mutex<Names>, describe: &str, netns: &str) -> stat::NicStat {
    let (dc, qs, gid) = {
        let d = lock(&inner.dev);
        (
            d.counters().0,
            d.qp_status(),
            d.config().gids.first().copied(),
        )
    };
    let mut names = lock(names);
    let label = names.label.clone();
    let name = names
        .name
        .get_or_insert_with(|| {
            let nd = gid.and_then(|g| {
                crate::io::netdev::netdevs()
                    .into_iter()
                    .find(|n| n.gids.contains(&g))
            });
            nd.map_or_else(|| "ferroce".to_string(), |n| format!("ferroce_{}", n.name))
        })
        .clone();
    drop(names);
    let shadows = inner.qps.read().unwrap_or_else(|e| e.into_inner());
    let owned = |v: Vec<(&'static str, u64)>| v.into_iter().map(|(k, n)| (k.to_string(), n));
    stat::NicStat {
        pid: std::process::id(),
        comm: stat::comm(),
        label,
        netns: netns.to_string(),
        name,
        backend: describe.to_string(),
        uptime_s: inner.epoch.elapsed().as_secs_f64(),
        device: owned(dc.named()).collect(),
        io: owned(lock(&inner.io_stats).named()).collect(),
        qps: qs
            .into_iter()
            .map(|q| {
                let out = |sh: &QpShadow| {
                    let a = |x: &AtomicU64| x.load(Ordering::Acquire);
                    (
                        a(&sh.sq_posted).saturating_sub(a(&sh.sq_retired)),
                        a(&sh.rq_posted).saturating_sub(a(&sh.rq_retired)),
                    )
                };
                let (sq, rq) = shadows.get(&q.qpn.get()).map_or((0, 0), |sh| out(sh));
                stat::QpStat {
                    qpn: q.qpn.get(),
                    qp_type: q.qp_type.name().to_string(),
                    state: q.state.name().to_string(),
                    dest_qp: q.dest_qp,
                    next_psn: q.next_psn,
                    una_psn: q.una_psn,
                    expected_psn: q.expected_psn,
                    sq_outstanding: sq,
                    rq_outstanding: rq,
                    rate_bps: q.rate_bps,
                    counters: owned(q.counters.named()).collect(),
                }
            })
            .collect(),
    }
}

fn engine_loop(inner: &Inner, pkt: &mut dyn PacketDevice, opts: NicOptions) {
    tracing::debug!(device = %pkt.describe(), "engine thread running");
    let mut idle = 0u32;
    let mut spinner = Spinner::fixed();
    let mut cq_list: Vec<Cq> = Vec::new();
    while !inner.stop.load(Ordering::Acquire) {
        // One clock read per round (it was two: the clock was 16-26 % of an idle engine's
        // time), shared by the round's frames and timers and by the sleep below.
        let now = inner.now();
        let (work, next_timer, _) = engine_step(inner, pkt, opts, &mut cq_list, now);
        if work > 0 {
            idle = 0;
            continue;
        }
        match opts.poll {
            PollMode::Busy | PollMode::Inline => spinner.pause(),
            PollMode::Adaptive { spins, max_sleep } => {
                idle += 1;
                if idle <= spins {
                    spinner.pause();
                    continue;
                }
                let wait = until_timer(max_sleep, next_timer, now.as_nanos());
                // Announce the sleep, then look once more: a doorbell rung before the flag was
                // visible is seen here, one rung after it signals the eventfd (no lost wake-up).
                inner.sleeping.store(true, Ordering::SeqCst);
                if inner.doorbell.is_empty() && !inner.stop.load(Ordering::Acquire) {
                    let r = match pkt.poll_fd() {
                        Some(fd) => {
                            crate::io::event::poll_readable(&[fd, inner.wake.fd()], Some(wait))
                                .map(|_| ())
                        }
                        None => pkt.wait_readable(Some(wait.min(Duration::from_micros(50)))),
                    };
                    if r.is_err() {
                        inner.io_errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                inner.sleeping.store(false, Ordering::SeqCst);
                inner.wake.drain();
            }
        }
    }
    flush_held_acks(inner, || {
        let now = inner.now();
        engine_step(inner, pkt, opts, &mut cq_list, now).0
    });
    tracing::debug!(device = %pkt.describe(), stats = ?pkt.stats(), "engine thread stopping");
}
/// On the way out: let every held (delayed) ACK go and run the engine until it has sent
/// them (a few rounds at most). Without this a peer whose last request was answered only by
/// a held ACK retries it until its retry count runs out, though the request was executed.
fn flush_held_acks(inner: &Inner, mut step: impl FnMut() -> usize) {
    let now = inner.now();
    let held = lock(&inner.dev).release_held_acks(now);
    if held > 0 {
        tracing::debug!(held, "held ACKs released at shutdown");
        for _ in 0..8 {
            if step() == 0 {
                break;
            }
        }
    }
}

/// Join the multicast groups QPs are attached to and leave the others (see
/// [`Nic::attach_mcast`]).
fn sync_packet_groups(inner: &Inner, pkt: &mut dyn PacketDevice) {
    // Held while joining: a caller waiting in `Nic::sync_groups` that sees the change taken
    // waits here until the joins are done.
    let mut have = lock(&inner.groups_have);
    if !inner.groups_dirty.swap(false, Ordering::AcqRel) {
        return;
    }
    let want = lock(&inner.groups_want).clone();
    for &g in have.iter().filter(|g| !want.contains(g)) {
        if let Err(e) = pkt.join_group(g, false) {
            tracing::warn!(group = %g, error = %e, "multicast group not left");
        }
    }
    have.retain(|g| want.contains(g));
    for g in want {
        if have.contains(&g) {
            continue;
        }
        match pkt.join_group(g, true) {
            Ok(()) => have.push(g),
            Err(e) => {
                inner.io_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(group = %g, error = %e, "multicast group not joined");
            }
        }
    }
    inner
        .pkt_fd
        .store(pkt.poll_fd().unwrap_or(-1), Ordering::Release);
}

/// [`PollMode::Inline`]: up to four engine rounds, unless another thread is driving.
fn inline_progress(inner: &Inner) -> usize {
    inline_try_progress(inner).unwrap_or(0)
}

/// [`inline_progress`], or `None` when another thread holds the engine (it is driving it, or
/// waiting in the packet device with it).
fn inline_try_progress(inner: &Inner) -> Option<usize> {
    let m = inner.inline.as_ref()?;
    let Ok(mut e) = m.try_lock() else {
        return None;
    };
    let e = &mut *e;
    let mut total = 0;
    for _ in 0..4 {
        let now = inner.now();
        let (work, next, more) = engine_step(inner, &mut *e.pkt, e.opts, &mut e.cq_list, now);
        e.next_timer = next;
        total += work;
        if !more {
            break;
        }
    }
    Some(total)
}

/// [`PollMode::Inline`]'s background thread: asleep while the application drives the
/// engine; after [`INLINE_TAKEOVER`] without it, waits in the packet device's descriptor (or
/// sleeps briefly, without one) until frames arrive, the next timer or 1 ms, and drives.
fn inline_background(inner: &Inner) {
    // On one CPU this thread runs only when the application's thread does not, and every
    // wake-up preempts it: take over only after INLINE_TAKEOVER_ONE_CPU.
    let takeover_d = if single_cpu() {
        INLINE_TAKEOVER_ONE_CPU
    } else {
        INLINE_TAKEOVER
    };
    let takeover = takeover_d.as_nanos() as u64;
    // While the application keeps driving, look less and less often (up to every
    // INLINE_CHECK_MAX): on a machine whose cores all spin, each wake-up of this thread
    // preempts a spinning one, and that shows in the latency tail.
    let max_check = INLINE_CHECK_MAX.as_nanos() as u64;
    let mut check = takeover;
    let mut worked_at: Option<u64> = None;
    let mut spinner = Spinner::fixed();
    tracing::debug!("inline engine's background thread running");
    while !inner.stop.load(Ordering::Acquire) {
        let now = inner.epoch.elapsed().as_nanos() as u64;
        let since = now.saturating_sub(inner.last_app_drive.load(Ordering::Relaxed));
        if since < takeover {
            worked_at = None;
            std::thread::sleep(Duration::from_nanos((takeover - since).max(check)));
            check = (check * 2).min(max_check);
            continue;
        }
        check = takeover;
        // After a round that did work, drive on without sleeping (Nic::set_background_spin).
        let spin = inner.bg_spin_ns.load(Ordering::Relaxed);
        if worked_at.is_some_and(|t| now.saturating_sub(t) < spin) {
            spinner.pause();
        } else {
            worked_at = None;
            let next = inner
                .inline
                .as_ref()
                .and_then(|m| m.try_lock().ok().and_then(|e| e.next_timer));
            let wait = until_timer(Duration::from_millis(1), next, now);
            let fd = inner.pkt_fd.load(Ordering::Acquire);
            let r = match (fd >= 0).then_some(fd) {
                Some(fd) => {
                    crate::io::event::poll_readable(&[fd, inner.wake.fd()], Some(wait)).map(|_| ())
                }
                None => {
                    std::thread::sleep(wait.min(Duration::from_micros(50)));
                    Ok(())
                }
            };
            if r.is_err() {
                inner.io_errors.fetch_add(1, Ordering::Relaxed);
            }
            inner.wake.drain();
        }
        match inline_try_progress(inner) {
            // An application thread holds the engine: it drives it, or waits in the packet
            // device with it and takes the frame that woke this thread. Polling the device
            // again would return at once, the frame still there, until that thread runs: a
            // busy loop that, on a one-CPU host, keeps that very thread off the CPU (send-lat
            // in a one-vCPU guest: this thread ran 1.3 s of a 4 s run and every hop took
            // ~4 ms, a scheduler time slice).
            None => {
                worked_at = None;
                std::thread::sleep(takeover_d);
            }
            Some(0) => {}
            Some(_) => worked_at = Some(inner.epoch.elapsed().as_nanos() as u64),
        }
    }
    flush_held_acks(inner, || inline_progress(inner));
    tracing::debug!("inline engine's background thread stopping");
}

/// How long an idle engine may sleep: at most `cap`, and not past the next timer (`now` and
/// the timer in nanoseconds since the engine's epoch).
fn until_timer(cap: Duration, next_timer: Option<Instant>, now: u64) -> Duration {
    match next_timer {
        Some(t) => cap.min(Duration::from_nanos(t.as_nanos().saturating_sub(now))),
        None => cap,
    }
}

/// Frames a receive or transmit batch moved; a failed batch moved none and is counted in
/// `io_errors`.
fn batch_count(inner: &Inner, r: std::io::Result<usize>) -> usize {
    r.unwrap_or_else(|e| {
        tracing::debug!(error = %e, "packet batch failed");
        inner.io_errors.fetch_add(1, Ordering::Relaxed);
        0
    })
}

/// One engine round at `now` (read by the caller just before): doorbells, a receive batch,
/// timers, a transmit batch, QP state shadows and completions. Returns the work done, the next timer, and whether another round may
/// find more right away (doorbells rung meanwhile, or a full receive or transmit batch).
fn engine_step(
    inner: &Inner,
    pkt: &mut dyn PacketDevice,
    opts: NicOptions,
    cq_list: &mut Vec<Cq>,
    now: Instant,
) -> (usize, Option<Instant>, bool) {
    let mut work = 0usize;
    let mut more = false;
    let next_timer;
    if inner.groups_dirty.load(Ordering::Acquire) {
        sync_packet_groups(inner, pkt);
    }
    {
        let mut dev = lock(&inner.dev);
        work += ring_doorbells(inner, &mut dev);
        let n = batch_count(
            inner,
            pkt.recv_batch_checked(opts.batch, &mut |f, icrc| {
                // What the application posted before this frame came is the device's before
                // the frame is taken, as a NIC sees a receive once its doorbell is written:
                // a round preempted between its doorbells and its receives would otherwise
                // find no WQE for a datagram sent after the post (a UD receive dropped, an
                // RC request answered with RNR; rdma-core's test_rdmacm_async_udp_traffic,
                // 1 run in 12).
                if !inner.doorbell.is_empty() {
                    ring_doorbells(inner, &mut dev);
                }
                match icrc {
                    crate::io::IcrcCheck::Good => dev.handle_checked_frame(now, f),
                    crate::io::IcrcCheck::Unchecked => dev.handle_frame(now, f),
                }
            }),
        );
        if n == 0 {
            inner.quiet_rounds.fetch_add(1, Ordering::AcqRel);
        }
        work += n;
        more |= n >= opts.batch;
        if dev.poll_timeout().is_some_and(|t| t <= now) {
            dev.handle_timeout(now);
            work += 1;
        }
        let n = batch_count(
            inner,
            pkt.send_batch(opts.batch, &mut |buf| match dev.poll_transmit(now, buf) {
                Ok(n) => n,
                Err(e) => {
                    // The packet device's frames are smaller than a QP's path MTU needs: a
                    // configuration error. Nothing is lost; the frame waits.
                    if inner.io_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                        tracing::warn!(error = %e, "transmit buffer too small for a QP's path MTU");
                    }
                    None
                }
            }),
        );
        work += n;
        more |= n >= opts.batch;
        let qps = inner.qps.read().unwrap_or_else(|e| e.into_inner());
        dev.drain_touched(|qpn, st, sr, rr| {
            if let Some(sh) = qps.get(&qpn.get()) {
                sh.state.store(state_code(st), Ordering::Release);
                sh.sq_retired.store(sr, Ordering::Release);
                sh.rq_retired.store(rr, Ordering::Release);
            }
        });
        drop(qps);
        let srqs = inner.srqs.read().unwrap_or_else(|e| e.into_inner());
        for (&n, sh) in srqs.iter() {
            if let Some((_, taken)) = dev.srq_occupancy(Srq(n)) {
                sh.taken.store(taken, Ordering::Release);
            }
        }
        drop(srqs);
        cq_list.clear();
        cq_list.extend(dev.cq_ids());
        if !cq_list.is_empty() {
            let cqs = inner.cqs.read().unwrap_or_else(|e| e.into_inner());
            let mut tmp = Vec::new();
            for &cq in cq_list.iter() {
                let Some(c) = cqs.get(cq.0 as usize) else {
                    continue;
                };
                let room = c
                    .depth
                    .load(Ordering::Acquire)
                    .saturating_sub(c.len.load(Ordering::Acquire));
                tmp.clear();
                let _ = dev.poll_cq(cq, &mut tmp, room);
                if tmp.is_empty() {
                    continue;
                }
                let mut solicited = false;
                for wc in tmp.drain(..) {
                    solicited |= wc.solicited || wc.status != WcStatus::Success;
                    c.q.push(wc);
                    c.len.fetch_add(1, Ordering::AcqRel);
                }
                // Whether the CQ is armed is read after its completions are in the queue. A
                // program arms and then polls again before it waits (libibverbs' pattern,
                // rdma_get_recv_comp's): with the arm read first, an arm made between that
                // read and the push was missed while the program's second poll still found
                // the queue empty, and it waited for a notification that never came (the
                // completion had been counted as not armed for). Now either this read sees
                // the arm or the program's poll after arming sees the completions (SeqCst
                // fences on both sides, `req_notify_cq`'s); a notification may then come for
                // a completion the program already took, as libibverbs allows.
                std::sync::atomic::fence(Ordering::SeqCst);
                let fire = loop {
                    let a = c.armed.load(Ordering::SeqCst);
                    let want = match a {
                        1 => true,
                        2 => solicited,
                        _ => false,
                    };
                    if !want {
                        break false;
                    }
                    if c.armed
                        .compare_exchange(a, 0, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                    {
                        break true;
                    }
                };
                if fire {
                    c.events.fetch_add(1, Ordering::AcqRel);
                    if let Some(f) = lock(&c.channel).as_ref() {
                        f();
                    }
                }
                c.wake();
                work += 1;
            }
        }
        let q = dev.async_events_queued();
        if q != inner.async_seen.load(Ordering::Relaxed) {
            inner.async_seen.store(q, Ordering::Relaxed);
            if let Some(sink) = lock(&inner.async_sink).as_ref() {
                while let Some(e) = dev.get_async_event() {
                    sink(e);
                }
            }
            if let Some(f) = lock(&inner.async_notify).as_ref() {
                f();
            }
        }
        next_timer = dev.poll_timeout();
        // The packet device's counters cost a system call (the kernel's drop counters):
        // refresh them every STATS_PERIOD, or at once when `counters()` asks.
        let t = now.as_nanos();
        if inner.stats_req.swap(false, Ordering::AcqRel)
            || t.saturating_sub(inner.stats_at.load(Ordering::Relaxed)) >= STATS_PERIOD_NS
        {
            inner.stats_at.store(t, Ordering::Relaxed);
            *lock(&inner.io_stats) = pkt.stats();
            inner.stats_gen.fetch_add(1, Ordering::AcqRel);
        }
    }
    more |= !inner.doorbell.is_empty();
    (work, next_timer, more)
}

/// [`purge_shadow`] of the QP's send and receive CQs (once when they are one). The caller
/// holds the device lock, so the engine adds no completion meanwhile.
fn purge_shadows(inner: &Inner, cqs: [Option<Cq>; 2], qpn: QpNumber) {
    let shadows = inner.cqs.read().unwrap_or_else(|e| e.into_inner());
    for (i, cq) in cqs.iter().enumerate() {
        let Some(cq) = *cq else { continue };
        if i == 1 && cqs[0] == Some(cq) {
            continue;
        }
        if let Some(c) = shadows.get(cq.0 as usize) {
            purge_shadow(c, qpn);
        }
    }
}

/// Remove QP `qpn`'s completions from the queue `poll_cq` reads, the others kept in order.
/// Called with the device lock held (the engine adds nothing meanwhile).
fn purge_shadow(c: &CqShadow, qpn: QpNumber) {
    let _take = lock(&c.take);
    let mut kept = Vec::new();
    let mut gone = 0;
    while let Some(wc) = c.q.pop() {
        if wc.qp_num == qpn {
            gone += 1;
        } else {
            kept.push(wc);
        }
    }
    for wc in kept {
        c.q.push(wc);
    }
    c.len.fetch_sub(gone, Ordering::AcqRel);
}

/// Hand every queued doorbell to the device; returns how many.
fn ring_doorbells(inner: &Inner, dev: &mut Device) -> usize {
    let mut n = 0;
    while let Some(db) = inner.doorbell.pop() {
        n += 1;
        match db {
            Doorbell::Send(q, wr) => {
                let id = wr.wr_id;
                if dev.post_send(q, wr).is_err() {
                    // The shadow accepted it but the QP changed meanwhile.
                    push_error(inner, dev, q, id);
                }
            }
            Doorbell::Recv(q, wr) => {
                let _ = dev.post_recv(q, wr);
            }
            Doorbell::SrqRecv(s, wr) => {
                let _ = dev.post_srq_recv(s, wr);
            }
        }
    }
    n
}

/// A request the device refused after the shadow accepted it: report it as a completion.
fn push_error(inner: &Inner, dev: &Device, qpn: QpNumber, wr_id: u64) {
    let Some(cq) = dev.send_cq_of(qpn) else {
        return;
    };
    let cqs = inner.cqs.read().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = cqs.get(cq.0 as usize) {
        c.q.push(WorkCompletion {
            wr_id,
            status: WcStatus::LocQpOpErr,
            opcode: crate::verbs::WcOpcode::Send,
            byte_len: 0,
            imm_data: None,
            invalidated_rkey: None,
            qp_num: qpn,
            src_qp: QpNumber::new(0),
            wc_flags: crate::verbs::WcFlags::empty(),
            solicited: false,
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        });
        c.len.fetch_add(1, Ordering::AcqRel);
        // Wake a `wait_cq` sleeper, as for any other completion.
        c.wake();
    }
}

/// Convenience for tests and tools: a QP with a CQ of its own, created on a running NIC.
pub fn create_rc_qp(
    nic: &Nic,
    pd: Pd,
    cq: Cq,
    cap: crate::verbs::QpCap,
) -> Result<QpNumber, VerbsError> {
    nic.create_qp(QpInitAttr::new(pd, cq, cq, cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expensive yields (a compute-bound thread took the CPU for its slice) double the period
    /// up to SPIN_YIELD_MAX; cheap ones shorten it by an eighth, back down to SPIN_YIELD_EVERY.
    #[test]
    fn yields_back_off_while_they_cost_time_slices() {
        let min = SPIN_YIELD_EVERY.as_nanos() as u64;
        let max = SPIN_YIELD_MAX.as_nanos() as u64;
        let slice = Duration::from_millis(3);
        let cheap = Duration::from_micros(2);
        let mut p = min;
        let mut steps = 0;
        while p < max {
            p = next_yield_period(p, slice);
            steps += 1;
        }
        assert_eq!(p, max);
        assert_eq!(
            steps, 9,
            "3 µs doubles to the 1 ms cap in 9 expensive yields"
        );
        assert_eq!(next_yield_period(p, slice), max, "capped");
        // A yield exactly at the threshold is cheap.
        assert_eq!(next_yield_period(p, SPIN_YIELD_EXPENSIVE), max - max / 8);
        // One cheap yield among expensive ones does not undo the backoff.
        assert!(next_yield_period(next_yield_period(p, cheap), slice) == max);
        let mut q = p;
        let mut cheap_steps = 0;
        while q > min {
            q = next_yield_period(q, cheap);
            cheap_steps += 1;
        }
        assert_eq!(q, min, "cheap yields bring the period back to 3 µs");
        assert!((30..60).contains(&cheap_steps), "{cheap_steps}");
    }

    #[test]
    fn idle_waits_stop_at_the_next_timer() {
        let cap = Duration::from_millis(1);
        assert_eq!(until_timer(cap, None, 5_000), cap);
        let t = Instant::from_nanos(5_000 + 300_000);
        assert_eq!(until_timer(cap, Some(t), 5_000), Duration::from_micros(300));
        assert_eq!(
            until_timer(cap, Some(Instant::from_nanos(5_000 + 9_000_000)), 5_000),
            cap
        );
        // A timer already due: no sleep at all.
        assert_eq!(
            until_timer(cap, Some(Instant::from_nanos(1_000)), 5_000),
            Duration::ZERO
        );
    }
}
