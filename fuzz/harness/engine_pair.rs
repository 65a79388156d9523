//! The engine fuzz harness (issue 17): two connected RC devices on a hand-carried link, with
//! memory regions registered and work posted, driven by a byte string read as a sequence of
//! actions: verbs calls on either side (sends of every kind with keys and addresses good,
//! bad or random; receives; dereg; moving a QP to error), deliveries with loss, duplication
//! and reordering, time jumps, and forged frames injected on either side (any RC opcode,
//! PSNs around the window, keys and addresses good or wild, AETH syndromes, CE marks, a
//! wrong source address, a wrong QPN), each a valid frame with a correct ICRC so that it
//! reaches the transport.
//!
//! After every action and at the end:
//! - nothing panics (the harness runs with overflow checks in the fuzz build);
//! - no byte changes in a region nobody may write: a region with remote read only (no local
//!   write), a region of another protection domain with every right, a local-write region
//!   no work request names, and any region once deregistered;
//! - every completion names a work request that was posted and has not completed yet;
//! - the CQs never overrun (they are deeper than the queues), no async event is lost;
//! - counters add up: the frames a device sent are the frames taken from it, the drops it
//!   counted are at most the frames it received;
//! - at the end, with the forging stopped and the link perfect, both devices settle within
//!   a bounded number of steps, every posted send has completed, and a QP still in RTS
//!   completes one more SEND (with success or an error: forged in-window packets can
//!   desynchronise a connection, which RoCE v2 cannot prevent, but never hang it).
//!
//! B's data region is registered on demand (`OnDemandMemory`: every access a system call),
//! A's is memory the device owns. Each side also lends a window of a region that grants no
//! remote right itself (A a type 2 memory window, B a type 1), bound at the start and bound
//! again or invalidated by the input; peers aim at the window with its current key, and no
//! byte of that region outside the window ever changes.
//!
//! Shared by `fuzz/fuzz_targets/engine_pair.rs` (cargo-fuzz) and `tests/engine_fuzz.rs`
//! (the corpus regressions and a seeded random run on stable).

use ferroce::time::{Duration, Instant};
use ferroce::verbs::*;
use ferroce::wire::{
    AethRepr, AtomicEthRepr, BthRepr, Ecn, EthernetRepr, ExtRepr, FrameRepr, Headers, IpRepr,
    Ipv4Repr, MacAddr, Opcode, PKey, Psn, QpNumber, RKey, RethRepr, RoceRepr, Syndrome, UdpRepr,
};
use std::collections::{BTreeSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr};

include!("shared.rs");

const START_PSN: u32 = 0xff_fff0; // near the wrap
const QDEPTH: u32 = 16;
const MTU: usize = 1024;
const REGION: usize = 8192;
const ATTACKER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 9);

const SEND_ID: u64 = 1 << 40;

/// `ENGINE_PAIR_TRACE=1`: print every action and frame (to replay a failing input).
fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("ENGINE_PAIR_TRACE").is_some())
}

fn show(f: &[u8]) -> String {
    match ferroce::wire::parse_frame(f) {
        Ok(p) => format!(
            "{} {}",
            p.repr.ip.src(),
            ferroce::wire::pretty::RoceLine(&p.repr.roce)
        ),
        Err(e) => format!("unparsable {e:?}"),
    }
}
const RECV_ID: u64 = 2 << 40;

struct Side {
    dev: Device,
    qp: QpNumber,
    cq: Cq,
    mac: MacAddr,
    ip: Ipv4Addr,
    /// Remote read/write/atomic, local write: the data region.
    rw: MemoryRegion,
    /// Local write only: the receive region.
    recv: MemoryRegion,
    /// Remote read only, no local write: nobody may write it.
    ro: MemoryRegion,
    /// Local write only and named by no work request: nobody may write it.
    local: MemoryRegion,
    /// Another PD's region with every right: this QP may not touch it.
    other: MemoryRegion,
    /// Local write and MW_BIND only: a peer reaches it only through `mw`, bound to
    /// `[WIN_AT, WIN_AT + WIN_LEN)` of it; its bytes outside that range never change.
    win_mr: MemoryRegion,
    mw: MemoryWindow,
    win_img: Vec<u8>,
    /// Regions deregistered, with their bytes at that moment.
    frozen: Vec<(MemoryRegion, Vec<u8>)>,
    images: [Vec<u8>; 3],
    sends: BTreeSet<u64>,
    recvs: BTreeSet<u64>,
    next: u64,
    /// Frames taken from this device (for the counter check).
    taken: u64,
    /// The highest PSN seen from the peer, to aim forged PSNs near the window.
    peer_psn: u32,
}

fn side(i: u8, seed: u64) -> Side {
    let ip = Ipv4Addr::new(10, 0, 0, i);
    let mac = MacAddr([2, 0, 0, 0, 0, i]);
    let mut dev = Device::new(DeviceConfig::new(mac, IpAddr::V4(ip)).with_seed(seed));
    let pd = dev.alloc_pd().expect("pd");
    let other_pd = dev.alloc_pd().expect("pd");
    let cq = dev.create_cq(4 * QDEPTH as usize).expect("cq");
    let cap = QpCap {
        max_send_wr: QDEPTH,
        max_recv_wr: QDEPTH,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    };
    let qp = dev.create_qp(QpInitAttr::new(pd, cq, cq, cap)).expect("qp");
    let lw = AccessFlags::LOCAL_WRITE;
    let all =
        lw | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    // B's data region is registered on demand (its bytes reached through process_vm_*), A's
    // is the device's own: both memory paths under the same actions.
    let rw = if i == 2 {
        let mem = OnDemandMemory::allocate(REGION, 0x11);
        let iova = mem.addr();
        dev.reg_mr_app(pd, mem, iova, all)
            .expect("reg_mr on demand")
    } else {
        region(&mut dev, pd, all, 0x11)
    };
    let recv = region(&mut dev, pd, lw, 0x22);
    let ro = region(&mut dev, pd, AccessFlags::REMOTE_READ, 0x33);
    let local = region(&mut dev, pd, lw, 0x44);
    let other = region(&mut dev, other_pd, all, 0x55);
    let images = [ro.to_vec(), local.to_vec(), other.to_vec()];
    let win_mr = region(&mut dev, pd, lw | AccessFlags::MW_BIND, 0x66);
    let kind = if i == 1 { MwType::Type2 } else { MwType::Type1 };
    let mw = dev.alloc_mw(pd, kind).expect("alloc_mw");
    let win_img = win_mr.to_vec();
    Side {
        dev,
        qp,
        cq,
        mac,
        ip,
        rw,
        recv,
        ro,
        local,
        other,
        win_mr,
        mw,
        win_img,
        frozen: Vec::new(),
        images,
        sends: BTreeSet::new(),
        recvs: BTreeSet::new(),
        next: 0,
        taken: 0,
        peer_psn: START_PSN,
    }
}

fn connect(a: &mut Side, b: &mut Side, max_rd: u8) {
    let params = RcParams {
        mtu: Mtu::M1024,
        local_psn: START_PSN,
        timeout: 8,
        retry_cnt: 3,
        rnr_retry: 3,
        min_rnr_timer: 1,
        max_rd_atomic: max_rd,
        max_dest_rd_atomic: max_rd,
        ..RcParams::default()
    };
    let remote = |s: &Side| RemoteQp {
        psn: START_PSN,
        ..s.dev.local_end(s.qp, 0, 0).expect("gid 0")
    };
    let (ra, rb) = (remote(a), remote(b));
    for (x, peer) in [(&mut *a, rb), (&mut *b, ra)] {
        for (at, mask) in [params.init_attr(), params.rtr_attr(&peer)] {
            x.dev.modify_qp(x.qp, &at, mask).expect("init/rtr");
        }
        let (at, mask) = params.rts_attr();
        x.dev.modify_qp(x.qp, &at, mask).expect("rts");
    }
}

/// An (rkey, address) aimed by the input at one of the peer's regions (mostly the one it
/// may use, inside it), or anywhere.
fn remote_target(peer: &Side, inp: &mut Input) -> (RKey, u64) {
    let (rkey, addr) = target_in(inp, |k| match k {
        0..=9 => Some(&peer.rw),
        10 => Some(&peer.win_mr),
        11 => Some(&peer.ro),
        12 => Some(&peer.local),
        13 => Some(&peer.other),
        14 => Some(&peer.recv),
        _ => None,
    });
    // The window region is aimed at through the window's current key.
    if rkey == peer.win_mr.rkey() {
        (peer.mw.rkey(), addr)
    } else {
        (rkey, addr)
    }
}

/// Where in `win_mr` the window lies.
const WIN_AT: u64 = 1024;
const WIN_LEN: u64 = REGION as u64 / 4;

/// Bind the window again (its next key, or a wild one) or invalidate it locally.
fn window_op(s: &mut Side, inp: &mut Input) {
    let k = inp.u8();
    let rkey = match k % 4 {
        0 => RKey(inp.u32()),
        _ => s.mw.next_rkey(),
    };
    let op = if k & 0x10 != 0 {
        SendOp::LocalInv {
            rkey: if k & 0x20 != 0 { s.mw.rkey() } else { rkey },
        }
    } else {
        let all = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        SendOp::BindMw {
            mw: s.mw.index(),
            kind: s.mw.kind(),
            rkey,
            info: MwBindInfo {
                mr: Some(s.win_mr.lkey()),
                addr: s.win_mr.addr() + WIN_AT,
                length: if k & 0x40 != 0 { 0 } else { WIN_LEN },
                access: AccessFlags::from_bits_truncate(u32::from(k >> 5)) & all,
                zero_based: false,
            },
        }
    };
    let id = SEND_ID | s.next;
    s.next += 1;
    let r = s.dev.post_send(s.qp, SendWr::new(id, op, Vec::new()));
    if trace() {
        eprintln!("  window {op:?} -> {r:?}");
    }
    if r.is_ok() {
        s.sends.insert(id);
    }
}

/// A scatter/gather entry: mostly inside the data or receive region, sometimes naming a
/// region the QP may not write, a wild key or a range beyond the region.
fn sge(s: &Side, inp: &mut Input) -> Sge {
    let len = |inp: &mut Input| match inp.u8() % 8 {
        0 => 0,
        1 => 8,
        2..=4 => u32::from(inp.u16()) % 3000,
        5 => MTU as u32,
        _ => 2 * MTU as u32 + 1,
    };
    sge_in(inp, &s.rw, len, |k| match k {
        0..=5 => &s.rw,
        6..=11 => &s.recv,
        12 => &s.ro,
        _ => &s.other,
    })
}

fn post_send(s: &mut Side, peer: &Side, inp: &mut Input) {
    let kind = inp.u8();
    let (rkey, addr) = remote_target(peer, inp);
    let op = match kind % 10 {
        0 | 1 => SendOp::Send,
        2 => SendOp::SendWithImm { imm: inp.u32() },
        3 => SendOp::SendWithInv {
            invalidate_rkey: rkey,
        },
        4 | 5 => SendOp::RdmaWrite {
            remote_addr: addr,
            rkey,
        },
        6 => SendOp::RdmaRead {
            remote_addr: addr,
            rkey,
        },
        7 => SendOp::AtomicCmpSwp {
            remote_addr: addr & !7,
            rkey,
            compare: inp.u64(),
            swap: inp.u64(),
        },
        8 => SendOp::AtomicFetchAdd {
            remote_addr: addr & !7,
            rkey,
            add: inp.u64(),
        },
        // Mostly aligned; sometimes not (an invalid request at the responder).
        _ => SendOp::AtomicWrite {
            remote_addr: if kind & 0x20 != 0 { addr } else { addr & !7 },
            rkey,
            value: inp.u64().to_ne_bytes(),
        },
    };
    let n = inp.u8() % 3;
    let sg: Vec<Sge> = (0..n).map(|_| sge(s, inp)).collect();
    let mut flags = SendFlags::SIGNALED;
    if kind & 0x80 != 0 {
        flags |= SendFlags::FENCE;
    }
    if kind & 0x40 != 0 {
        flags |= SendFlags::SOLICITED;
    }
    let id = SEND_ID | s.next;
    s.next += 1;
    let wr = SendWr::new(id, op, sg).with_flags(flags);
    let r = s.dev.post_send(s.qp, wr.clone());
    if trace() {
        eprintln!("  post_send {wr:?} -> {r:?}");
    }
    if r.is_ok() {
        s.sends.insert(id);
    }
}

fn post_recv(s: &mut Side, inp: &mut Input) {
    let n = inp.u8() % 3;
    let sg: Vec<Sge> = (0..n).map(|_| sge(s, inp)).collect();
    let id = RECV_ID | s.next;
    s.next += 1;
    if s.dev
        .post_recv(
            s.qp,
            RecvWr {
                wr_id: id,
                sg_list: sg.into(),
            },
        )
        .is_ok()
    {
        s.recvs.insert(id);
    }
}

/// The opcodes a forged RC frame may carry (the RC ones, the CNP, and a few of other
/// transports that must be refused).
const OPS: [u8; 32] = [
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    0x10, 0x11, 0x12, 0x13, 0x14, 0x16, 0x17, 0x1c, 0x1d, 0x81, 0x24, 0x20, 0x64, 0x11, 0x10, 0x04,
];

/// Build a forged frame for `to` as if from `from` (or an attacker), with a valid ICRC.
fn forge(to: &Side, from: &Side, inp: &mut Input) -> Option<Vec<u8>> {
    let k = inp.u8();
    let opcode = Opcode(OPS[usize::from(k) % OPS.len()]);
    let info = opcode.info();
    if info.is_reserved() {
        return None;
    }
    let flags = inp.u8();
    let psn = match flags % 4 {
        // around the PSN the peer sends next / the one we expect
        0 | 1 => Psn::new(to.peer_psn).add(u32::from(inp.u8())).sub(16),
        2 => Psn::new(START_PSN).add(u32::from(inp.u16())),
        _ => Psn::new(inp.u32()),
    };
    let dest_qp = if flags & 0x40 != 0 {
        QpNumber::new(inp.u32() & QpNumber::MASK)
    } else {
        to.qp
    };
    let mut bth = BthRepr::new(opcode, dest_qp, psn);
    bth.ack_req = flags & 0x20 != 0;
    bth.solicited = flags & 0x10 != 0;
    if flags & 0x80 != 0 && flags & 0x08 != 0 {
        bth.pkey = PKey(inp.u16());
    }
    let h = opcode.headers();
    let mut ext = ExtRepr::default();
    if h.contains(Headers::RETH) {
        let (rkey, va) = remote_target(to, inp);
        let dma_len = match inp.u8() % 6 {
            0 => 0,
            1 => u32::from(inp.u16()),
            2 => MTU as u32,
            3 => 0x8000_0000,
            4 => u32::MAX,
            _ => u32::from(inp.u8()) * 64,
        };
        ext.reth = Some(RethRepr { va, rkey, dma_len });
    }
    if h.contains(Headers::ATOMIC_ETH) {
        let (rkey, va) = remote_target(to, inp);
        ext.atomic_eth = Some(AtomicEthRepr {
            va,
            rkey,
            swap_add: inp.u64(),
            compare: inp.u64(),
        });
    }
    if h.contains(Headers::AETH) {
        ext.aeth = Some(AethRepr {
            syndrome: Syndrome::from_byte(inp.u8()),
            msn: inp.u32() & 0xff_ffff,
        });
    }
    if h.contains(Headers::ATOMIC_ACK_ETH) {
        ext.atomic_ack = Some(inp.u64());
    }
    if h.contains(Headers::IMM_DT) {
        ext.imm = Some(inp.u32());
    }
    if h.contains(Headers::IETH) {
        let (rkey, _) = remote_target(to, inp);
        ext.ieth = Some(rkey);
    }
    if h.contains(Headers::DETH) {
        ext.deth = Some(ferroce::wire::DethRepr {
            qkey: ferroce::wire::QKey(inp.u32()),
            src_qp: QpNumber::new(inp.u32() & QpNumber::MASK),
        });
    }
    if h.intersects(Headers::RDETH | Headers::XRCETH | Headers::FETH) {
        return None;
    }
    let payload_len = match inp.u8() % 6 {
        0 => 0,
        1 => MTU,
        2 => MTU + 4,
        3 => 8,
        _ => usize::from(inp.u16()) % (MTU + 64),
    };
    let src_ip = if flags & 0x04 != 0 && flags & 0x80 != 0 {
        ATTACKER
    } else {
        from.ip
    };
    let payload = vec![0xee; payload_len];
    forged_frame(to, from, src_ip, flags & 0x02 != 0, k, bth, ext, &payload)
}

fn psn_of(frame: &[u8]) -> Option<u32> {
    ferroce::wire::parse_frame(frame)
        .ok()
        .map(|p| p.repr.roce.bth.psn.get())
}

/// `Link::pull`'s hook: nothing to note about a frame a device sent.
fn sent(_: &mut Side, _: &[u8]) {}

/// `Link::deliver`'s hook: trace the frame and note its PSN (delivered or not) to aim
/// forged PSNs near the window.
fn seen(to: &mut Side, f: &[u8], to_b: bool, how: u8) {
    if trace() {
        eprintln!(
            "  {} {} {}",
            ["lose", "dup", "reorder", "deliver"][usize::from((how % 8).min(3))],
            if to_b { "->B" } else { "->A" },
            show(f)
        );
    }
    if let Some(p) = psn_of(f) {
        to.peer_psn = p;
    }
}

fn give(to: &mut Side, now: Instant, f: &[u8]) {
    to.dev.handle_frame(now, f);
}

impl Link {
    fn advance(&mut self, a: &mut Side, b: &mut Side, d: Duration) {
        self.now += d;
        a.dev.handle_timeout(self.now);
        b.dev.handle_timeout(self.now);
    }

    /// Jump to the next deadline of either device; false if there is none.
    fn next_timer(&mut self, a: &mut Side, b: &mut Side) -> bool {
        let next = [a.dev.poll_timeout(), b.dev.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        match next {
            None => false,
            Some(t) => {
                self.now = t.max(self.now + Duration::from_nanos(1));
                if trace() {
                    eprintln!("  timer at {:?}", self.now);
                }
                a.dev.handle_timeout(self.now);
                b.dev.handle_timeout(self.now);
                true
            }
        }
    }
}

fn check(s: &mut Side, who: &str) {
    check_n(s, who);
}

fn check_n(s: &mut Side, who: &str) -> (u64, u64) {
    let mut n = (0, 0);
    let mut wcs = Vec::new();
    s.dev.poll_cq(s.cq, &mut wcs, 1 << 16).expect("poll_cq");
    for wc in wcs {
        if trace() {
            eprintln!("  {who} completion {wc:?}");
        }
        if wc.status == WcStatus::Success {
            n.0 += 1;
        } else {
            n.1 += 1;
        }
        let set = if wc.wr_id & SEND_ID != 0 {
            &mut s.sends
        } else {
            &mut s.recvs
        };
        assert!(
            set.remove(&wc.wr_id),
            "{who}: a completion for no outstanding work request: {wc:?}"
        );
        assert_eq!(wc.qp_num, s.qp, "{who}: completion of another QP");
    }
    for (mr, img) in &s.frozen {
        assert!(
            mr.with_bytes(|b| b == &img[..]),
            "{who}: a deregistered region was written: {mr:?}"
        );
    }
    let (w0, w1) = (WIN_AT as usize, (WIN_AT + WIN_LEN) as usize);
    assert!(
        s.win_mr
            .with_bytes(|b| b[..w0] == s.win_img[..w0] && b[w1..] == s.win_img[w1..]),
        "{who}: bytes outside the memory window were written"
    );
    check_device(s, who);
    n
}

fn state(s: &Side) -> QpState {
    s.dev.query_qp(s.qp).expect("the QP exists").0
}

/// Drive with a perfect link until nothing moves and no timer is set; false if that takes
/// more than `limit` rounds.
fn settle(link: &mut Link, a: &mut Side, b: &mut Side, limit: usize) -> bool {
    for _ in 0..limit {
        link.pull(a, b);
        if link.ab.is_empty() && link.ba.is_empty() {
            if !link.next_timer(a, b) {
                check(a, "A");
                check(b, "B");
                return true;
            }
            continue;
        }
        while !link.ab.is_empty() || !link.ba.is_empty() {
            if !link.ab.is_empty() {
                link.deliver(a, b, true, 7);
            }
            if !link.ba.is_empty() {
                link.deliver(a, b, false, 7);
            }
        }
        check(a, "A");
        check(b, "B");
    }
    false
}

/// What one input did (to judge how deep a batch of inputs reaches).
#[derive(Default, Debug, Clone, Copy)]
pub struct Stats {
    pub actions: u64,
    pub forged: u64,
    pub posted: u64,
    pub ok_completions: u64,
    pub err_completions: u64,
    pub ended_in_rts: u64,
    pub probes: u64,
}

/// Run one input.
pub fn run(data: &[u8]) {
    run_stats(data);
}

/// Run one input; what it did.
pub fn run_stats(data: &[u8]) -> Stats {
    let mut st = Stats::default();
    let mut inp = Input::new(data);
    let seed = u64::from(inp.u8());
    let max_rd = 1 + inp.u8() % 4;
    let mut a = side(1, seed ^ 0xa);
    let mut b = side(2, seed ^ 0xb);
    connect(&mut a, &mut b, max_rd);
    let mut link = Link::new();
    for s in [&mut a, &mut b] {
        let all = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        let op = SendOp::BindMw {
            mw: s.mw.index(),
            kind: s.mw.kind(),
            rkey: s.mw.next_rkey(),
            info: MwBindInfo {
                mr: Some(s.win_mr.lkey()),
                addr: s.win_mr.addr() + WIN_AT,
                length: WIN_LEN,
                access: all,
                zero_based: false,
            },
        };
        let id = SEND_ID | s.next;
        s.next += 1;
        s.dev
            .post_send(s.qp, SendWr::new(id, op, Vec::new()))
            .expect("a QP in RTS takes a bind");
        s.sends.insert(id);
    }
    link.pull(&mut a, &mut b);
    let mut actions = 0u64;
    while !inp.done() && actions < 512 {
        actions += 1;
        let act = inp.u8();
        let on_a = act & 1 == 0;
        if trace() {
            eprintln!(
                "t={:?} action {} on {} (A {:?}, B {:?})",
                link.now,
                (act >> 1) % 12,
                if on_a { "A" } else { "B" },
                state(&a),
                state(&b)
            );
        }
        let (x, y) = if on_a {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        match (act >> 1) % 12 {
            0 | 1 => post_send(x, y, &mut inp),
            2 | 4 => post_recv(x, &mut inp),
            3 => {
                if let Some(f) = forge(x, y, &mut inp) {
                    if trace() {
                        eprintln!("  forged to {}: {}", if on_a { "A" } else { "B" }, show(&f));
                    }
                    x.dev.handle_frame(link.now, &f);
                    st.forged += 1;
                }
            }
            5..=7 => {
                let n = 1 + inp.u8() % 8;
                let how = inp.u8();
                link.pull(&mut a, &mut b);
                for i in 0..n {
                    link.deliver(&mut a, &mut b, on_a, how.rotate_left(u32::from(i)) | 4);
                    link.deliver(&mut a, &mut b, !on_a, how.rotate_left(u32::from(i) + 3));
                }
            }
            8 => {
                let us = u64::from(inp.u16()) * 16;
                link.advance(&mut a, &mut b, Duration::from_micros(us));
            }
            9 => {
                let c = inp.u8() % 4;
                if c == 1 {
                    window_op(x, &mut inp);
                } else if c == 0 {
                    // deregister the data region (once), then it must never change again
                    let x = if on_a { &mut a } else { &mut b };
                    if x.frozen.is_empty() && x.dev.dereg_mr(&x.rw).is_ok() {
                        let img = x.rw.to_vec();
                        x.frozen.push((x.rw.clone(), img));
                    }
                } else {
                    link.next_timer(&mut a, &mut b);
                }
            }
            10 => {
                if inp.u8() % 8 == 0 {
                    let at = QpAttr {
                        qp_state: QpState::Err,
                        ..QpAttr::default()
                    };
                    let _ = x.dev.modify_qp(x.qp, &at, QpAttrMask::STATE);
                }
            }
            _ => {
                link.pull(&mut a, &mut b);
            }
        }
        for (s, w) in [(&mut a, "A"), (&mut b, "B")] {
            let (ok, err) = check_n(s, w);
            st.ok_completions += ok;
            st.err_completions += err;
        }
    }
    st.actions = actions;
    st.posted = a.next + b.next;
    // The end: no more forging, a perfect link.
    assert!(
        settle(&mut link, &mut a, &mut b, 20_000),
        "the pair did not settle"
    );
    for (s, who) in [(&a, "A"), (&b, "B")] {
        assert!(
            s.sends.is_empty(),
            "{who}: sends never completed ({} left), QP in {:?}; {:?}; next timer {:?}",
            s.sends.len(),
            state(s),
            s.dev.qp_status(),
            s.dev.poll_timeout()
        );
    }
    // One more SEND from A to B where both still run: it completes, one way or the other.
    st.ended_in_rts = u64::from(state(&a) == QpState::Rts) + u64::from(state(&b) == QpState::Rts);
    if state(&a) == QpState::Rts && state(&b) == QpState::Rts && a.frozen.is_empty() {
        st.probes += 1;
        let id = RECV_ID | b.next;
        b.next += 1;
        let rs = Sge {
            addr: b.recv.addr(),
            length: 64,
            lkey: b.recv.lkey(),
        };
        if b.dev
            .post_recv(
                b.qp,
                RecvWr {
                    wr_id: id,
                    sg_list: vec![rs].into(),
                },
            )
            .is_ok()
        {
            b.recvs.insert(id);
        }
        let ss = Sge {
            addr: a.rw.addr(),
            length: 64,
            lkey: a.rw.lkey(),
        };
        let id = SEND_ID | a.next;
        a.next += 1;
        a.dev
            .post_send(a.qp, SendWr::new(id, SendOp::Send, vec![ss]))
            .expect("a QP in RTS takes a SEND");
        a.sends.insert(id);
        assert!(
            settle(&mut link, &mut a, &mut b, 20_000),
            "the probe did not settle"
        );
        assert!(
            a.sends.is_empty(),
            "the probe SEND never completed; A in {:?}, B in {:?}",
            state(&a),
            state(&b)
        );
    }
    st
}
