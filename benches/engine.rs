//! RC engine benchmarks: the cost of the sans-IO engine itself, per packet, with no simulator
//! and no link. Two [`Device`]s are joined back to back: every frame `a.poll_transmit` writes
//! into one reusable buffer goes straight into `b.handle_frame`, and back. Virtual time is
//! fixed (no timer ever fires; nothing is lost, so none needs to). Figures are read as ratios
//! (`tools/bench-report`): engine time per packet ÷ a `memcpy` of the same payload, and the
//! cost per packet at 10,000 QPs ÷ the cost at 1 QP. Never as absolute thresholds.
//!
//! Each iteration is one message (one packet at these sizes) and includes all the work of both
//! devices: `post_send` (the WR built as an application would, its one-entry scatter/gather
//! list inline: no allocation), the requester building the
//! frame (gather memcpy from the source MR, ICRC), the responder parsing it (ICRC verify, R_Key
//! check, memcpy into the destination MR), the ACK built, parsed and processed, and
//! `poll_cq`.
//!
//! - `engine/write_4k`: RDMA WRITE of 4 KiB at path MTU 4096, one QP, WRs posted in batches
//!   of 64 (only the last signaled), up to 512 WRs queued (the send queue stays fed; the
//!   256-packet go-back-N window is the limit). Frames are moved in bursts (all of A's, then
//!   all of B's), so the responder coalesces the ACKs of a burst.
//! - `engine/write_4k_10000qps`: the same with 10,000 connected QP pairs, each batch posted on
//!   the next QP round-robin (8 QPs active at a time, every QP used in turn).
//! - `engine/write_4k_b1`, `engine/write_4k_b1_10000qps`: the worst case for locality and
//!   ACKs: every WR signaled, frames moved in lockstep (each data packet is answered by its own
//!   ACK before the next leaves) and, at 10,000 QPs, consecutive packets on different QPs.
//! - `engine/send_64`: SEND of 64 B, batches of 64, receives pre-posted (512) and re-posted as
//!   their completions are polled.
//! - `engine/memcpy_4k`, `engine/memcpy_64`: copying the same payload between two `Vec<u8>`.
//!
//! Under `cargo bench`, before criterion runs, the bench
//! - prints per-QP memory (`Device::qp_memory` and the process RSS growth per QP when 10,000
//!   QPs are created and connected) into `target/criterion/engine_memory.json`;
//! - measures the report's ratios interleaved (10,000 QPs ÷ 1 QP, engine ÷ memcpy): ~10 ms
//!   chunks of the two sides alternate for 21 rounds and the median per-round ratio is kept
//!   (`target/criterion/engine_interleaved.json`). On a machine shared with other work this is
//!   much steadier than dividing two criterion figures taken seconds apart.
//!
//! `FERROCE_ENGINE_RATIO=NUM/DEN` measures only that interleaved ratio (as above) and prints it.
//!
//! `FERROCE_ENGINE_ONLY=CASE:N` runs N messages of one case and exits (no criterion), for a
//! profiler; instruction and cache-miss counts per packet that no other load disturbs:
//! `FERROCE_ENGINE_ONLY=write_4k:20000 valgrind --tool=callgrind --collect-atstart=no
//! --toggle-collect=engine::measured_run --cache-sim=yes target/release/deps/engine-<hash>`.

use criterion::{black_box, criterion_group, Criterion, Throughput};
use ferroce::time::Instant;
use ferroce::verbs::*;
use ferroce::wire::{MacAddr, QpNumber};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

const MSG_4K: usize = 4096;
const MSG_64: usize = 64;
/// Message slots in each MR (the source/destination address rotates over them).
const SLOTS: usize = 256;
/// Send queue depth (and most WRs queued at once per device).
const SQ_DEPTH: u32 = 512;
const BIG_QPS: usize = 10_000;

fn cap() -> QpCap {
    QpCap {
        max_send_wr: SQ_DEPTH,
        max_recv_wr: SQ_DEPTH,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 256,
    }
}

fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

fn device(i: u8) -> Device {
    device_cc(i, false)
}

/// Line rate of the congestion-control cases.
const LINE_BPS: u64 = 100_000_000_000;

fn device_cc(i: u8, dcqcn: bool) -> Device {
    let mut c = DeviceConfig::new(
        MacAddr([2, 0, 0, 0, 0, i]),
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, i)),
    )
    .with_seed(u64::from(i));
    if dcqcn {
        c.cc = ferroce::cc::CcConfig::Dcqcn(ferroce::cc::dcqcn::Params::paper());
        c.line_rate_bps = LINE_BPS;
    }
    Device::new(c)
}

/// How frames move between the two devices.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Drive {
    /// All of A's frames, then all of B's (ACKs of a burst coalesce at the responder).
    Burst,
    /// One frame of A, then everything B answers, then the next frame of A.
    Lockstep,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Write,
    Send,
}

#[derive(Clone, Copy, Debug)]
struct Shape {
    op: Op,
    msg: usize,
    nqps: usize,
    /// WRs per post batch (the last one signaled).
    batch: usize,
    drive: Drive,
    /// DCQCN on (paced at the 100 Gb/s line rate) and virtual time advancing at line rate.
    cc: Option<bool>,
}

/// Two devices with `nqps` connected RC QP pairs, A → B traffic.
struct Rig {
    shape: Shape,
    a: Device,
    b: Device,
    cq_a: Cq,
    cq_b: Cq,
    qa: Vec<QpNumber>,
    qb: Vec<QpNumber>,
    mr_a: MemoryRegion,
    mr_b: MemoryRegion,
    now: Instant,
    buf: Vec<u8>,
    wcs: Vec<WorkCompletion>,
    /// WRs posted on A and not yet known complete.
    outstanding: usize,
    /// Next QP (round-robin) and next message slot.
    rr: usize,
    slot: usize,
    frames: u64,
}

impl Rig {
    fn new(shape: Shape) -> Rig {
        let dcqcn = shape.cc == Some(true);
        let mut a = device_cc(1, dcqcn);
        let mut b = device_cc(2, dcqcn);
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let cq_a = a.create_cq(1 << 16).unwrap();
        let cq_b = b.create_cq(1 << 16).unwrap();
        let mr_a = a.reg_mr(pa, SLOTS * shape.msg, all_access()).unwrap();
        let mr_b = b.reg_mr(pb, SLOTS * shape.msg, all_access()).unwrap();
        // A recognisable pattern in the source, to check it arrives.
        let pat: Vec<u8> = (0..mr_a.len())
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
            .collect();
        mr_a.write(0, &pat).unwrap();
        let init = |pd, cq| QpInitAttr::new(pd, cq, cq, cap());
        let params = RcParams {
            mtu: Mtu::M4096,
            ..RcParams::default()
        };
        let (mut qa, mut qb) = (Vec::new(), Vec::new());
        for i in 0..shape.nqps {
            let x = a.create_qp(init(pa, cq_a)).unwrap();
            let y = b.create_qp(init(pb, cq_b)).unwrap();
            let psn = (i as u32).wrapping_mul(7919) & 0xff_ffff;
            let ra = a.local_end(x, 0, psn).unwrap();
            let rb = b.local_end(y, 0, psn ^ 0x5555).unwrap();
            a.connect_rc(
                x,
                &rb,
                &RcParams {
                    local_psn: psn,
                    ..params
                },
            )
            .unwrap();
            b.connect_rc(
                y,
                &ra,
                &RcParams {
                    local_psn: psn ^ 0x5555,
                    ..params
                },
            )
            .unwrap();
            qa.push(x);
            qb.push(y);
        }
        let mut r = Rig {
            shape,
            a,
            b,
            cq_a,
            cq_b,
            qa,
            qb,
            mr_a,
            mr_b,
            now: Instant::from_micros(1),
            buf: vec![0u8; 16384],
            wcs: Vec::with_capacity(1024),
            outstanding: 0,
            rr: 0,
            slot: 0,
            frames: 0,
        };
        if shape.op == Op::Send {
            for qi in 0..shape.nqps {
                for _ in 0..SQ_DEPTH {
                    r.post_recv(qi);
                }
            }
        }
        r
    }

    fn sge(mr: &MemoryRegion, slot: usize, len: usize) -> Sge {
        Sge {
            addr: mr.addr() + (slot * len) as u64,
            length: len as u32,
            lkey: mr.lkey(),
        }
    }

    fn post_recv(&mut self, qi: usize) {
        let s = self.slot % SLOTS;
        self.slot += 1;
        let wr = RecvWr {
            wr_id: qi as u64,
            sg_list: Self::sge(&self.mr_b, s, self.shape.msg).into(),
        };
        self.b.post_recv(self.qb[qi], wr).unwrap();
    }

    /// Post `k` WRs on the next QP; the last is signaled and carries `k` as its wr_id.
    fn post_batch(&mut self, k: usize) {
        let qi = self.rr;
        self.rr = (self.rr + 1) % self.shape.nqps;
        let len = self.shape.msg;
        for j in 0..k {
            let s = self.slot % SLOTS;
            self.slot += 1;
            let op = match self.shape.op {
                Op::Write => SendOp::RdmaWrite {
                    remote_addr: self.mr_b.addr() + (s * len) as u64,
                    rkey: self.mr_b.rkey(),
                },
                Op::Send => SendOp::Send,
            };
            let last = j + 1 == k;
            let wr = SendWr {
                wr_id: if last { k as u64 } else { 0 },
                op,
                sg_list: Self::sge(&self.mr_a, s, len).into(),
                flags: if last {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::empty()
                },
                ud: None,
                xrc_srqn: 0,
            };
            self.a.post_send(self.qa[qi], wr).unwrap();
        }
        self.outstanding += k;
    }

    /// Move frames until neither device has one to send; returns how many moved.
    fn pump(&mut self) -> u64 {
        let now = self.now;
        let mut moved = 0;
        match self.shape.drive {
            Drive::Burst => {
                while let Some(n) = self.a.poll_transmit(now, &mut self.buf).unwrap() {
                    self.b.handle_frame(now, &self.buf[..n]);
                    moved += 1;
                }
                while let Some(n) = self.b.poll_transmit(now, &mut self.buf).unwrap() {
                    self.a.handle_frame(now, &self.buf[..n]);
                    moved += 1;
                }
            }
            Drive::Lockstep => {
                while let Some(n) = self.a.poll_transmit(now, &mut self.buf).unwrap() {
                    self.b.handle_frame(now, &self.buf[..n]);
                    moved += 1;
                    while let Some(n) = self.b.poll_transmit(now, &mut self.buf).unwrap() {
                        self.a.handle_frame(now, &self.buf[..n]);
                        moved += 1;
                    }
                }
            }
        }
        self.frames += moved;
        moved
    }

    /// Complete `n` messages, keeping up to `SQ_DEPTH` WRs posted on A.
    fn run(&mut self, n: u64) {
        let mut posted = 0u64;
        let mut done = 0u64;
        let batch = self.shape.batch;
        while done < n {
            while posted < n && self.outstanding + batch <= SQ_DEPTH as usize {
                let k = batch.min((n - posted) as usize);
                self.post_batch(k);
                posted += k as u64;
            }
            let moved = self.pump();
            if self.shape.cc.is_some() {
                // Time passes at the line rate for the frames moved (4 KiB frames: ~336 ns at
                // 100 Gb/s), so the pacer runs on every packet without holding any back.
                let ns = moved * (MSG_4K as u64 + 100) * 8 * 1_000_000_000 / LINE_BPS;
                self.now += ferroce::time::Duration::from_nanos(ns.max(1));
                if moved == 0 {
                    // Held back by the pacer: sleep until it allows the next packet.
                    if let Some(t) = [self.a.poll_timeout(), self.b.poll_timeout()]
                        .into_iter()
                        .flatten()
                        .min()
                    {
                        self.now = self.now.max(t);
                    }
                }
                self.a.handle_timeout(self.now);
                self.b.handle_timeout(self.now);
            }
            self.wcs.clear();
            self.a
                .poll_cq(self.cq_a, &mut self.wcs, usize::MAX)
                .unwrap();
            let mut progress = false;
            for wc in &self.wcs {
                debug_assert_eq!(wc.status, WcStatus::Success);
                done += wc.wr_id;
                self.outstanding -= wc.wr_id as usize;
                progress = true;
            }
            if self.shape.op == Op::Send {
                self.wcs.clear();
                self.b
                    .poll_cq(self.cq_b, &mut self.wcs, usize::MAX)
                    .unwrap();
                for i in 0..self.wcs.len() {
                    let qi = self.wcs[i].wr_id as usize;
                    self.post_recv(qi);
                }
            }
            assert!(
                moved > 0 || progress || self.shape.cc.is_some(),
                "stalled: {:?} / {:?}",
                self.a.counters(),
                self.b.counters()
            );
        }
    }

    /// A first run: check that the payload arrived and nothing went wrong, print ACKs/packet.
    fn warm_and_check(&mut self, name: &str) {
        let n = 4 * SQ_DEPTH as u64;
        let frames0 = self.frames;
        self.run(n);
        let (da, qa) = self.a.counters();
        let (_db, qb) = self.b.counters();
        assert_eq!(qa.retransmits, 0, "{name}: retransmissions");
        assert_eq!(qb.rnr_naks_sent + qb.seq_naks_sent + qb.err_naks_sent, 0);
        assert_eq!(da.icrc_drops + da.malformed_drops, 0);
        if self.shape.op == Op::Write {
            // Every slot was written from the same slot of A.
            assert_eq!(self.mr_a.to_vec(), self.mr_b.to_vec(), "{name}: payload");
        } else {
            let got = self.mr_b.to_vec();
            assert!(got.iter().any(|&x| x != 0), "{name}: nothing received");
        }
        let frames = self.frames - frames0;
        eprintln!(
            "{name}: {} QPs, batch {}, {:?}: {:.3} ACKs per data packet, data checked",
            self.shape.nqps,
            self.shape.batch,
            self.shape.drive,
            (frames - n) as f64 / n as f64
        );
    }
}

// ---- memory per QP ----------------------------------------------------------------------------

/// Resident set size in bytes (`/proc/self/statm`, field 2, in 4 KiB pages on x86-64 Linux).
fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn memory_report() {
    // RSS growth while 10,000 QPs are created and connected in one device (first, while the
    // heap is fresh, so freed memory is not reused and hidden).
    let before = rss_bytes();
    let mut d = device(1);
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(1 << 16).unwrap();
    let peer = device(2);
    let mut qps = Vec::with_capacity(BIG_QPS);
    for i in 0..BIG_QPS {
        let q = d.create_qp(QpInitAttr::new(pd, cq, cq, cap())).unwrap();
        let remote = peer
            .local_end(QpNumber::new(0x1000 + i as u32), 0, 0)
            .unwrap();
        d.connect_rc(q, &remote, &RcParams::default()).unwrap();
        qps.push(q);
    }
    let after = rss_bytes();
    let fresh = d.qp_memory(qps[0]).unwrap();
    let rss_per_qp = match (before, after) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / BIG_QPS as f64),
        _ => None,
    };
    drop(qps);
    drop(d);

    // The same QP after it has carried traffic with a full send queue (its queues grown).
    let mut r = Rig::new(Shape {
        op: Op::Write,
        msg: MSG_4K,
        nqps: 1,
        batch: 64,
        drive: Drive::Burst,
        cc: None,
    });
    r.run(4 * u64::from(SQ_DEPTH));
    let used_a = r.a.qp_memory(r.qa[0]).unwrap();
    let used_b = r.b.qp_memory(r.qb[0]).unwrap();
    let mut s = Rig::new(Shape {
        op: Op::Send,
        msg: MSG_64,
        nqps: 1,
        batch: 64,
        drive: Drive::Burst,
        cc: None,
    });
    s.run(4 * u64::from(SQ_DEPTH));
    let used_recv = s.b.qp_memory(s.qb[0]).unwrap();

    let rss = rss_per_qp.map_or("n/a".to_string(), |v| format!("{v:.0}"));
    eprintln!(
        "per-QP memory (caps: {SQ_DEPTH} send WRs, {SQ_DEPTH} recv WRs, 4 SGEs): \
         qp_memory connected, idle = {fresh} B; after WRITE traffic: requester {used_a} B, \
         responder {used_b} B; SEND responder with {SQ_DEPTH} receives posted {used_recv} B; \
         RSS growth creating+connecting {BIG_QPS} QPs = {rss} B/QP"
    );
    // By-value structs the per-packet path moves around (see the hot-spot notes).
    eprintln!(
        "struct sizes: ParsedFrame {} B, FrameRepr {} B, RoceRepr {} B, ExtRepr {} B, \
         WorkCompletion {} B, SendWr {} B",
        std::mem::size_of::<ferroce::wire::packet::ParsedFrame<'static>>(),
        std::mem::size_of::<ferroce::wire::FrameRepr>(),
        std::mem::size_of::<ferroce::wire::RoceRepr>(),
        std::mem::size_of::<ferroce::wire::ExtRepr>(),
        std::mem::size_of::<WorkCompletion>(),
        std::mem::size_of::<SendWr>(),
    );
    let json = format!(
        "{{\"qps\": {BIG_QPS}, \"qp_memory_idle\": {fresh}, \"qp_memory_requester_busy\": \
         {used_a}, \"qp_memory_responder_busy\": {used_b}, \"qp_memory_recv_posted\": \
         {used_recv}, \"rss_per_qp\": {}}}\n",
        rss_per_qp.map_or("null".to_string(), |v| format!("{v:.1}"))
    );
    write_result("engine_memory.json", &json);
}

/// Write a result file next to criterion's (`$CRITERION_HOME`, else `target/criterion`).
fn write_result(file: &str, contents: &str) {
    let dir = std::env::var_os("CRITERION_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR")
                .map(|t| std::path::PathBuf::from(t).join("criterion"))
        })
        .unwrap_or_else(|| std::path::PathBuf::from("target/criterion"));
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::write(dir.join(file), contents);
    }
}

// ---- the benchmarks ---------------------------------------------------------------------------

const CASES: &[(&str, Shape)] = &[
    (
        "write_4k",
        Shape {
            op: Op::Write,
            msg: MSG_4K,
            nqps: 1,
            batch: 64,
            drive: Drive::Burst,
            cc: None,
        },
    ),
    (
        "write_4k_10000qps",
        Shape {
            op: Op::Write,
            msg: MSG_4K,
            nqps: BIG_QPS,
            batch: 64,
            drive: Drive::Burst,
            cc: None,
        },
    ),
    (
        "write_4k_b1",
        Shape {
            op: Op::Write,
            msg: MSG_4K,
            nqps: 1,
            batch: 1,
            drive: Drive::Lockstep,
            cc: None,
        },
    ),
    (
        "write_4k_b1_10000qps",
        Shape {
            op: Op::Write,
            msg: MSG_4K,
            nqps: BIG_QPS,
            batch: 1,
            drive: Drive::Lockstep,
            cc: None,
        },
    ),
    (
        "write_4k_cc_off",
        Shape {
            op: Op::Write,
            msg: MSG_4K,
            nqps: 1,
            batch: 64,
            drive: Drive::Burst,
            cc: Some(false),
        },
    ),
    (
        "write_4k_cc_dcqcn",
        Shape {
            op: Op::Write,
            msg: MSG_4K,
            nqps: 1,
            batch: 64,
            drive: Drive::Burst,
            cc: Some(true),
        },
    ),
    (
        "send_64",
        Shape {
            op: Op::Send,
            msg: MSG_64,
            nqps: 1,
            batch: 64,
            drive: Drive::Burst,
            cc: None,
        },
    ),
];

fn shape(name: &str) -> Shape {
    CASES.iter().find(|c| c.0 == name).map(|c| c.1).unwrap()
}

fn engine(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(1));

    let src4k = vec![0x5au8; MSG_4K];
    let mut dst4k = vec![0u8; MSG_4K];
    g.bench_function("memcpy_4k", |b| {
        b.iter(|| {
            dst4k.copy_from_slice(black_box(&src4k));
            black_box(&mut dst4k);
        })
    });
    let src64 = vec![0x5au8; MSG_64];
    let mut dst64 = vec![0u8; MSG_64];
    g.bench_function("memcpy_64", |b| {
        b.iter(|| {
            dst64.copy_from_slice(black_box(&src64));
            black_box(&mut dst64);
        })
    });

    for &(name, shape) in CASES {
        // Built on first use, so a filtered-out case costs nothing.
        let mut rig: Option<Rig> = None;
        g.bench_function(name, |b| {
            let r = rig.get_or_insert_with(|| {
                let mut r = Rig::new(shape);
                r.warm_and_check(name);
                r
            });
            b.iter_custom(|iters| {
                let t = std::time::Instant::now();
                r.run(iters);
                t.elapsed()
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1));
    targets = engine
}

// ---- interleaved ratios ----------------------------------------------------------------------

/// Something timed per item: an engine rig (per message) or a memcpy baseline (per copy).
enum Work {
    Rig(Box<Rig>),
    Memcpy(Vec<u8>, Vec<u8>),
}

impl Work {
    fn new(name: &str) -> Work {
        match name {
            "memcpy_4k" => Work::Memcpy(vec![0x5a; MSG_4K], vec![0; MSG_4K]),
            "memcpy_64" => Work::Memcpy(vec![0x5a; MSG_64], vec![0; MSG_64]),
            _ => {
                let mut r = Rig::new(shape(name));
                r.run(4 * u64::from(SQ_DEPTH));
                Work::Rig(Box::new(r))
            }
        }
    }

    fn ns_per_item(&mut self, n: u64) -> f64 {
        let t = std::time::Instant::now();
        match self {
            Work::Rig(r) => r.run(n),
            Work::Memcpy(src, dst) => {
                for _ in 0..n {
                    dst.copy_from_slice(black_box(src));
                    black_box(&mut *dst);
                }
            }
        }
        t.elapsed().as_nanos() as f64 / n as f64
    }

    /// Items for a chunk of about `target` nanoseconds.
    fn chunk(&mut self, target: f64) -> u64 {
        let probe = self.ns_per_item(1000);
        ((target / probe) as u64).max(1000)
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The ratios the report quotes, measured interleaved: chunks of ~10 ms of each side
/// alternate (ABBA order), so load from other processes on a shared machine hits both sides
/// alike; the median of the per-round ratios is reported with its range. Criterion's
/// sequential figures are still the per-benchmark absolute times.
fn interleaved_ratios(only: Option<(&str, &str)>) {
    const ROUNDS: usize = 21;
    const PAIRS: [(&str, &str); 4] = [
        ("write_4k_10000qps", "write_4k"),
        ("write_4k_b1_10000qps", "write_4k_b1"),
        ("write_4k", "memcpy_4k"),
        ("send_64", "memcpy_64"),
    ];
    let pairs = match only {
        Some(p) => vec![p],
        None => PAIRS.to_vec(),
    };
    let mut json = Vec::new();
    for (num, den) in pairs {
        let (mut a, mut b) = (Work::new(num), Work::new(den));
        let (na, nb) = (a.chunk(1e7), b.chunk(1e7));
        let (mut ta, mut tb, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let (x, y) = if round % 2 == 0 {
                let x = a.ns_per_item(na);
                (x, b.ns_per_item(nb))
            } else {
                let y = b.ns_per_item(nb);
                (a.ns_per_item(na), y)
            };
            ta.push(x);
            tb.push(y);
            ratios.push(x / y);
        }
        let (ma, mb, mr) = (median(&mut ta), median(&mut tb), median(&mut ratios));
        let (lo, hi) = (ratios[0], ratios[ROUNDS - 1]);
        eprintln!(
            "interleaved: {num} / {den} = {mr:.2} (range {lo:.2}..{hi:.2} over {ROUNDS} \
             rounds; medians {ma:.1} ns / {mb:.1} ns)"
        );
        json.push(format!(
            "{{\"num\": \"{num}\", \"den\": \"{den}\", \"ratio\": {mr:.4}, \"lo\": {lo:.4}, \
             \"hi\": {hi:.4}, \"num_ns\": {ma:.2}, \"den_ns\": {mb:.2}}}"
        ));
    }
    if only.is_some() {
        return;
    }
    write_result(
        "engine_interleaved.json",
        &format!(
            "{{\"rounds\": {ROUNDS}, \"pairs\": [{}]}}\n",
            json.join(", ")
        ),
    );
}

/// Run `n` messages of one case, for a profiler (see `main`).
#[inline(never)]
fn measured_run(r: &mut Rig, n: u64) {
    r.run(n);
}

fn main() {
    // `FERROCE_ENGINE_ONLY=CASE:N`: build CASE, warm it, run N messages in `measured_run` and
    // exit, without criterion: for `valgrind --tool=callgrind --collect-atstart=no
    // --toggle-collect=engine::measured_run` (instruction and cache-miss counts per packet
    // that do not depend on other load on the machine) or `perf record`.
    // `FERROCE_ENGINE_RATIO=NUM/DEN` (e.g. `write_4k_b1_10000qps/write_4k_b1`): only that
    // interleaved ratio, printed (no criterion, no JSON): a before/after pair in minutes.
    if let Ok(spec) = std::env::var("FERROCE_ENGINE_RATIO") {
        let (num, den) = spec.split_once('/').expect("FERROCE_ENGINE_RATIO=NUM/DEN");
        interleaved_ratios(Some((num, den)));
        return;
    }
    if let Ok(spec) = std::env::var("FERROCE_ENGINE_ONLY") {
        let (name, n) = spec.split_once(':').unwrap_or((&spec, "100000"));
        let n: u64 = n.parse().expect("FERROCE_ENGINE_ONLY=CASE:N");
        let mut r = Rig::new(shape(name));
        r.warm_and_check(name);
        let t = std::time::Instant::now();
        measured_run(&mut r, n);
        eprintln!(
            "{name}: {n} messages, {:.1} ns/message",
            t.elapsed().as_nanos() as f64 / n as f64
        );
        return;
    }
    // Only under `cargo bench` (criterion gets `--bench`), not when it tests, lists or profiles.
    let args: Vec<String> = std::env::args().collect();
    let has = |f: &str| args.iter().any(|a| a == f);
    if has("--bench") && !has("--test") && !has("--list") && !has("--profile-time") {
        memory_report();
        interleaved_ratios(None);
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
