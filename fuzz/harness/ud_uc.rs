//! The UD and UC receive paths under a hostile peer and network (issue 17): two devices on a
//! hand-carried link, each with four QPs — a UD QP and a UC QP on one shared receive queue,
//! a UD QP and a UC QP with their own receive queues (the UC ones connected to the peer's) —
//! driven by a byte string read as actions: sends from either side (UD and UC opcodes and a
//! few the transport must refuse; Q_Keys, destination QPNs, keys and addresses good or wild;
//! scatter/gather entries good, foreign or out of bounds), receives posted to the SRQ or a
//! QP's own queue, deliveries with loss, duplication and reordering, forged frames with a valid
//! ICRC (UD/UC/RC opcodes and the CNP, PSNs near the expected one or anywhere, good and wrong
//! Q_Keys and P_Keys, RETHs with any key, address and length, payloads up to beyond the MTU,
//! CE marks, a stranger's source address, unknown QPNs), frames with bytes changed, time
//! jumps, QPs moved to error, the SRQ limit armed.
//!
//! After every action:
//! - nothing panics;
//! - the regions no remote write may reach (remote read only, local only, another PD's
//!   region with every right) are byte-identical;
//! - every completion names a work request that was posted to that QP (or to the SRQ, for a
//!   QP attached to it) and has not completed yet; a receive's byte count fits its buffers;
//! - the CQ never overruns, no async event is lost, the drops counted are at most the frames
//!   received, `tx_frames` is the frames taken;
//! - no response to anything received: every frame a device sends is a packet of a message
//!   the consumer posted (at most `1 + len / MTU` per send) or a CNP, and the CNPs are at most
//!   the CE-marked frames it received (UD and UC answer nothing, IBTA 9.7, 9.8).
//!
//! At the end, with a perfect link: every posted send has completed, and if both UD QPs with
//! their own receive queues are still in RTS (and the receives the input left on B's are
//! large enough for the probe), a legitimate message from A reaches B's probe receive
//! byte-exact (after the receives posted before it are used up).
//!
//! Shared by `fuzz/fuzz_targets/ud_uc.rs` (cargo-fuzz) and `tests/ud_uc_fuzz.rs` (stable).

use ferroce::time::{Duration, Instant};
use ferroce::verbs::*;
use ferroce::wire::{
    BthRepr, DethRepr, Ecn, EthernetRepr, ExtRepr, FrameRepr, Headers, IpRepr, Ipv4Repr, MacAddr,
    Opcode, PKey, Psn, QKey, QpNumber, RKey, RethRepr, RoceRepr, UdpRepr,
};
use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};

include!("shared.rs");

const QKEY: u32 = 0x1111_1111;
const QDEPTH: u32 = 16;
const MTU: usize = 1024;
const REGION: usize = 8192;
const ATTACKER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 9);
const SEND_ID: u64 = 1 << 40;
const RECV_ID: u64 = 2 << 40;
const PROBE_ID: u64 = RECV_ID | 1 << 39;

/// The four QPs of a side: UD on the SRQ, UD with its own RQ, UC on the SRQ, UC with its own.
const UD_SRQ: usize = 0;
const UD_OWN: usize = 1;
const UC_SRQ: usize = 2;
const UC_OWN: usize = 3;

fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("UD_UC_TRACE").is_some())
}

struct Side {
    dev: Device,
    pd: Pd,
    cq: Cq,
    srq: Srq,
    qps: [QpNumber; 4],
    mac: MacAddr,
    ip: Ipv4Addr,
    /// Local write, remote write: receives and UC WRITEs land here.
    rw: MemoryRegion,
    /// Remote read only, no local write: nobody may write it.
    ro: MemoryRegion,
    /// Local write only, named by no work request.
    local: MemoryRegion,
    /// Another PD's region with every right: no QP of this side may touch it.
    other: MemoryRegion,
    images: [Vec<u8>; 3],
    ah: Option<Ah>,
    /// An address handle of another PD, and one destroyed: sends naming them are refused.
    bad_ahs: Vec<Ah>,
    other_pd: Pd,
    /// Posted sends, by id: the QP.
    sends: BTreeMap<u64, QpNumber>,
    /// Posted receives, by id: the QP (None: the SRQ) and the bytes the buffers hold.
    recvs: BTreeMap<u64, (Option<QpNumber>, u64)>,
    next: u64,
    taken: u64,
    /// Frames this side may send: `1 + len / MTU` for each send accepted.
    tx_bound: u64,
    /// Non-CNP frames taken, CNPs taken, CE-marked frames handed to the device.
    tx_data: u64,
    tx_cnps: u64,
    ce_in: u64,
    /// The last PSN seen towards each of this side's QPs (to aim forged PSNs).
    psn_seen: [u32; 4],
    probe_wc: Option<WorkCompletion>,
}

fn side(i: u8, seed: u64) -> Side {
    let ip = Ipv4Addr::new(10, 0, 0, i);
    let mac = MacAddr([2, 0, 0, 0, 0, i]);
    let mut cfg = DeviceConfig::new(mac, IpAddr::V4(ip)).with_seed(seed);
    cfg.port_mtu = Mtu::M1024;
    let mut dev = Device::new(cfg);
    let pd = dev.alloc_pd().expect("pd");
    let other_pd = dev.alloc_pd().expect("pd");
    let cq = dev.create_cq(1024).expect("cq");
    let srq = dev
        .create_srq(
            pd,
            SrqAttr {
                max_wr: 2 * QDEPTH,
                max_sge: 2,
                srq_limit: 0,
            },
        )
        .expect("srq");
    let cap = QpCap {
        max_send_wr: QDEPTH,
        max_recv_wr: QDEPTH,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    };
    let mut mk = |t: QpType, on_srq: bool| {
        let mut init = QpInitAttr::new(pd, cq, cq, cap).with_type(t);
        if on_srq {
            init = init.with_srq(srq);
        }
        dev.create_qp(init).expect("qp")
    };
    let qps = [
        mk(QpType::Ud, true),
        mk(QpType::Ud, false),
        mk(QpType::Uc, true),
        mk(QpType::Uc, false),
    ];
    for q in [qps[UD_SRQ], qps[UD_OWN]] {
        dev.bring_up_ud(
            q,
            &UdParams {
                qkey: QKEY,
                local_psn: 0xff_fff0,
            },
        )
        .expect("ud rts");
    }
    let lw = AccessFlags::LOCAL_WRITE;
    let all =
        lw | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    let rw = region(&mut dev, pd, lw | AccessFlags::REMOTE_WRITE, 0x11);
    let ro = region(&mut dev, pd, AccessFlags::REMOTE_READ, 0x33);
    let local = region(&mut dev, pd, lw, 0x44);
    let other = region(&mut dev, other_pd, all, 0x55);
    let images = [ro.to_vec(), local.to_vec(), other.to_vec()];
    Side {
        dev,
        pd,
        cq,
        srq,
        qps,
        mac,
        ip,
        rw,
        ro,
        local,
        other,
        images,
        ah: None,
        bad_ahs: Vec::new(),
        other_pd,
        sends: BTreeMap::new(),
        recvs: BTreeMap::new(),
        next: 0,
        taken: 0,
        tx_bound: 0,
        tx_data: 0,
        tx_cnps: 0,
        ce_in: 0,
        psn_seen: [0xff_fff0; 4],
        probe_wc: None,
    }
}

fn connect(a: &mut Side, b: &mut Side) {
    let av = |y: &Side| AddressVector {
        dgid: y.dev.gid(0).expect("gid"),
        sgid_index: 0,
        hop_limit: 64,
        traffic_class: 0,
        flow_label: 0,
        dmac: Some(y.mac.0),
    };
    let (to_b, to_a) = (av(b), av(a));
    for (x, v) in [(&mut *a, to_b), (&mut *b, to_a)] {
        x.ah = Some(x.dev.create_ah(x.pd, &v).expect("ah"));
        let foreign = x.dev.create_ah(x.other_pd, &v).expect("ah");
        let gone = x.dev.create_ah(x.pd, &v).expect("ah");
        x.dev.destroy_ah(gone).expect("destroy_ah");
        x.bad_ahs = vec![foreign, gone];
    }
    for q in [UC_SRQ, UC_OWN] {
        let ra = a.dev.local_end(a.qps[q], 0, 0xff_fff0).expect("end");
        let rb = b.dev.local_end(b.qps[q], 0, 0xff_fff0).expect("end");
        let p = UcParams {
            mtu: Mtu::M1024,
            local_psn: 0xff_fff0,
            ..UcParams::default()
        };
        a.dev.connect_uc(a.qps[q], &rb, &p).expect("uc a");
        b.dev.connect_uc(b.qps[q], &ra, &p).expect("uc b");
    }
}

/// An (rkey, address) in one of the peer's regions, or anywhere.
fn remote_target(peer: &Side, inp: &mut Input) -> (RKey, u64) {
    target_in(inp, |k| match k {
        0..=9 => Some(&peer.rw),
        10 => Some(&peer.ro),
        11 => Some(&peer.local),
        12 | 13 => Some(&peer.other),
        _ => None,
    })
}

/// A scatter/gather entry: mostly inside the data region, sometimes a region the consumer
/// may not write, a wild key or a range beyond the region.
fn sge(s: &Side, inp: &mut Input) -> Sge {
    let len = |inp: &mut Input| match inp.u8() % 8 {
        0 => 0,
        1 => 40,
        2..=4 => u32::from(inp.u16()) % 3000,
        5 => MTU as u32,
        6 => MTU as u32 + 40,
        _ => 2 * MTU as u32 + 1,
    };
    sge_in(inp, &s.rw, len, |k| match k {
        0..=10 => &s.rw,
        11 | 12 => &s.ro,
        _ => &s.other,
    })
}

fn post_send(s: &mut Side, peer: &Side, inp: &mut Input) {
    let which = usize::from(inp.u8() % 4);
    let qp = s.qps[which];
    let kind = inp.u8();
    let (rkey, addr) = remote_target(peer, inp);
    let op = match kind % 8 {
        0..=2 => SendOp::Send,
        3 => SendOp::SendWithImm { imm: inp.u32() },
        4 => SendOp::RdmaWrite {
            remote_addr: addr,
            rkey,
        },
        5 => SendOp::RdmaWriteWithImm {
            remote_addr: addr,
            rkey,
            imm: inp.u32(),
        },
        // Not UD or UC operations: refused at posting or completed in error.
        6 => SendOp::RdmaRead {
            remote_addr: addr,
            rkey,
        },
        _ => SendOp::AtomicFetchAdd {
            remote_addr: addr & !7,
            rkey,
            add: inp.u64(),
        },
    };
    let n = inp.u8() % 3;
    let sg: Vec<Sge> = (0..n).map(|_| sge(s, inp)).collect();
    let len: u64 = sg.iter().map(|e| u64::from(e.length)).sum();
    let mut flags = SendFlags::SIGNALED;
    if kind & 0x80 != 0 {
        flags |= SendFlags::SOLICITED;
    }
    let id = SEND_ID | s.next;
    s.next += 1;
    let mut wr = SendWr::new(id, op, sg).with_flags(flags);
    if which <= UD_OWN {
        let f = inp.u8();
        wr = wr.with_ud(UdDest {
            ah: if f & 0x80 != 0 {
                s.bad_ahs[usize::from(f >> 6) % 2]
            } else {
                s.ah.expect("ah")
            },
            remote_qpn: match f % 4 {
                0 => QpNumber::new(inp.u32() & QpNumber::MASK),
                k => peer.qps[usize::from(k) % 2],
            },
            remote_qkey: if f & 0x40 != 0 { inp.u32() } else { QKEY },
        });
    }
    let r = s.dev.post_send(qp, wr.clone());
    if trace() {
        eprintln!("  post_send on {qp:?} {wr:?} -> {r:?}");
    }
    if r.is_ok() {
        s.sends.insert(id, qp);
        s.tx_bound += 1 + len / MTU as u64;
    }
}

fn post_recv(s: &mut Side, inp: &mut Input) {
    let to = inp.u8();
    let n = inp.u8() % 3;
    let sg: Vec<Sge> = (0..n).map(|_| sge(s, inp)).collect();
    let cap: u64 = sg.iter().map(|e| u64::from(e.length)).sum();
    let id = RECV_ID | s.next;
    s.next += 1;
    let wr = RecvWr {
        wr_id: id,
        sg_list: sg.into(),
    };
    let (r, on) = match to % 4 {
        0 | 1 => (s.dev.post_srq_recv(s.srq, wr), None),
        2 => (s.dev.post_recv(s.qps[UD_OWN], wr), Some(s.qps[UD_OWN])),
        // (posting to a QP attached to the SRQ is refused)
        _ => {
            let q = s.qps[if to & 4 != 0 { UC_SRQ } else { UC_OWN }];
            (s.dev.post_recv(q, wr), Some(q))
        }
    };
    if r.is_ok() {
        s.recvs.insert(id, (on, cap));
    }
}

/// Opcodes a forged frame may carry: UC and UD ones, the CNP, some RC ones, reserved ones.
const OPS: [u8; 24] = [
    0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2a, 0x2b, 0x64, 0x65, 0x64, 0x65,
    0x24, 0x81, 0x04, 0x06, 0x0a, 0x0c, 0x11, 0x2c,
];

/// A forged frame for `to` as if from `from` (or a stranger), with a valid ICRC.
fn forge(to: &Side, from: &Side, inp: &mut Input) -> Option<Vec<u8>> {
    let k = inp.u8();
    let opcode = Opcode(OPS[usize::from(k) % OPS.len()]);
    if opcode.info().is_reserved() {
        return None;
    }
    let flags = inp.u8();
    let target = usize::from(inp.u8() % 4);
    let dest_qp = match flags & 0xc0 {
        0x40 => QpNumber::new(inp.u32() & QpNumber::MASK),
        0x80 => QpNumber::new(u32::from(inp.u8() % 4)),
        _ => to.qps[target],
    };
    let psn = match flags % 4 {
        0 | 1 => Psn::new(to.psn_seen[target])
            .add(u32::from(inp.u8() % 8))
            .sub(2),
        2 => Psn::new(to.psn_seen[target]).add(u32::from(inp.u16())),
        _ => Psn::new(inp.u32()),
    };
    let mut bth = BthRepr::new(opcode, dest_qp, psn);
    bth.ack_req = flags & 0x20 != 0;
    bth.solicited = flags & 0x10 != 0;
    if flags & 0x08 != 0 && inp.u8() % 4 == 0 {
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
    if h.contains(Headers::IMM_DT) {
        ext.imm = Some(inp.u32());
    }
    if h.contains(Headers::DETH) {
        let q = inp.u8();
        ext.deth = Some(DethRepr {
            qkey: QKey(match q % 4 {
                0 => inp.u32(),
                1 => 0x8000_0000 | inp.u32(),
                _ => QKEY,
            }),
            src_qp: if q & 0x80 != 0 {
                QpNumber::new(inp.u32() & QpNumber::MASK)
            } else {
                from.qps[usize::from(q >> 5) % 2]
            },
        });
    }
    if h.intersects(Headers::AETH | Headers::ATOMIC_ETH | Headers::ATOMIC_ACK_ETH | Headers::IETH)
        || h.intersects(Headers::RDETH | Headers::XRCETH | Headers::FETH)
    {
        return None;
    }
    let payload_len = match inp.u8() % 7 {
        0 => 0,
        1 => MTU,
        2 => MTU + 4,
        3 => 8,
        4 => 40,
        _ => usize::from(inp.u16()) % (MTU + 64),
    };
    let src = if flags & 0x04 != 0 && inp.u8() % 2 == 0 {
        ATTACKER
    } else {
        from.ip
    };
    let payload: Vec<u8> = (0..payload_len).map(|i| i as u8 ^ k).collect();
    forged_frame(to, from, src, flags & 0x02 != 0, k, bth, ext, &payload)
}

/// Hand a frame to a side's device, counting CE marks (IPv4 without a tag: the TOS byte).
fn give(s: &mut Side, now: Instant, f: &[u8]) {
    if f.len() > 15 && f[12..14] == [0x08, 0x00] && f[15] & 3 == 3 {
        s.ce_in += 1;
    }
    if let Ok(p) = ferroce::wire::parse_frame(f) {
        let r = &p.repr.roce.bth;
        if let Some(i) = s.qps.iter().position(|q| *q == r.dest_qp) {
            if !matches!(p.repr.ip, IpRepr::V4(ref v) if v.src == ATTACKER) {
                s.psn_seen[i] = r.psn.get();
            }
        }
    }
    s.dev.handle_frame(now, f);
}

/// `Link::pull`'s hook: count the frame as a CNP or as data.
fn sent(s: &mut Side, f: &[u8]) {
    match ferroce::wire::parse_frame(f) {
        Ok(p) if p.repr.roce.bth.opcode == Opcode::CNP => s.tx_cnps += 1,
        _ => s.tx_data += 1,
    }
}

/// `Link::deliver`'s hook: nothing (`give` notes what reaches the device).
fn seen(_: &mut Side, _: &[u8], _: bool, _: u8) {}

impl Link {
    fn timers(&mut self, a: &mut Side, b: &mut Side) {
        a.dev.handle_timeout(self.now);
        b.dev.handle_timeout(self.now);
    }
}

fn check(s: &mut Side, who: &str, st: &mut Stats) {
    let mut wcs = Vec::new();
    s.dev.poll_cq(s.cq, &mut wcs, 1 << 16).expect("poll_cq");
    for wc in wcs {
        if trace() {
            eprintln!("  {who} completion {wc:?}");
        }
        if wc.status == WcStatus::Success {
            st.ok_completions += 1;
        } else {
            st.err_completions += 1;
        }
        if wc.wr_id & SEND_ID != 0 {
            let qp = s.sends.remove(&wc.wr_id);
            assert_eq!(
                qp,
                Some(wc.qp_num),
                "{who}: a send completion for a WR not posted to that QP (or twice): {wc:?}"
            );
            continue;
        }
        let Some((on, cap)) = s.recvs.remove(&wc.wr_id) else {
            panic!("{who}: a receive completion for a WR not posted (or twice): {wc:?}");
        };
        match on {
            Some(q) => assert_eq!(q, wc.qp_num, "{who}: a receive on the wrong QP: {wc:?}"),
            None => assert!(
                [s.qps[UD_SRQ], s.qps[UC_SRQ]].contains(&wc.qp_num),
                "{who}: an SRQ receive on a QP not attached to it: {wc:?}"
            ),
        }
        if wc.wr_id == PROBE_ID {
            s.probe_wc = Some(wc);
        }
        if wc.status == WcStatus::Success {
            st.received += 1;
            // (a WRITE with immediate reports the bytes it wrote, not into the buffers)
            assert!(
                wc.opcode == WcOpcode::RecvRdmaWithImm || u64::from(wc.byte_len) <= cap,
                "{who}: {} bytes received into {cap}: {wc:?}",
                wc.byte_len
            );
        }
    }
    assert!(
        s.tx_data <= s.tx_bound,
        "{who}: {} frames sent for messages worth at most {}: an answer to a UD/UC packet",
        s.tx_data,
        s.tx_bound
    );
    assert!(
        s.tx_cnps <= s.ce_in,
        "{who}: {} CNPs for {} CE-marked frames",
        s.tx_cnps,
        s.ce_in
    );
    check_device(s, who);
}

fn state(s: &Side, q: usize) -> QpState {
    s.dev.query_qp(s.qps[q]).expect("the QP exists").0
}

/// What a run did (for the stable test's depth check).
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub actions: u64,
    pub forged: u64,
    pub mutated: u64,
    pub posted: u64,
    pub received: u64,
    pub ok_completions: u64,
    pub err_completions: u64,
    pub probes: u64,
}

impl Stats {
    // The stable test (tests/ud_uc_fuzz.rs) sums its inputs' statistics; the fuzz target,
    // which includes this file too, does not.
    #[allow(dead_code)]
    pub fn add(&mut self, o: &Stats) {
        self.actions += o.actions;
        self.forged += o.forged;
        self.mutated += o.mutated;
        self.posted += o.posted;
        self.received += o.received;
        self.ok_completions += o.ok_completions;
        self.err_completions += o.err_completions;
        self.probes += o.probes;
    }
}

pub fn run(data: &[u8]) {
    run_stats(data);
}

pub fn run_stats(data: &[u8]) -> Stats {
    let mut st = Stats::default();
    let mut inp = Input::new(data);
    let seed = u64::from(inp.u8());
    let mut a = side(1, seed ^ 0xa);
    let mut b = side(2, seed ^ 0xb);
    connect(&mut a, &mut b);
    let mut link = Link::new();
    while !inp.done() && st.actions < 512 {
        st.actions += 1;
        let act = inp.u8();
        let on_a = act & 1 == 0;
        let (x, y) = if on_a {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        if trace() {
            eprintln!(
                "t={:?} action {} on {}",
                link.now,
                (act >> 1) % 10,
                if on_a { "A" } else { "B" }
            );
        }
        match (act >> 1) % 10 {
            0 | 1 => post_send(x, y, &mut inp),
            2 | 3 => post_recv(x, &mut inp),
            4 | 5 => {
                if let Some(f) = forge(x, y, &mut inp) {
                    if trace() {
                        eprintln!(
                            "  forged {:?}",
                            ferroce::wire::parse_frame(&f).map(|p| p.repr.roce)
                        );
                    }
                    give(x, link.now, &f);
                    st.forged += 1;
                }
            }
            6 => {
                let n = 1 + inp.u8() % 8;
                let how = inp.u8();
                link.pull(&mut a, &mut b);
                for i in 0..n {
                    link.deliver(&mut a, &mut b, on_a, how.rotate_left(u32::from(i)) | 4);
                    link.deliver(&mut a, &mut b, !on_a, how.rotate_left(u32::from(i) + 3));
                }
            }
            7 => {
                link.now += Duration::from_micros(u64::from(inp.u16()) * 16);
                link.timers(&mut a, &mut b);
            }
            8 => match inp.u8() % 8 {
                0 => {
                    let q = x.qps[usize::from(inp.u8() % 4)];
                    let at = QpAttr {
                        qp_state: QpState::Err,
                        ..QpAttr::default()
                    };
                    let _ = x.dev.modify_qp(q, &at, QpAttrMask::STATE);
                }
                1 => {
                    let at = SrqAttr {
                        max_wr: 0,
                        max_sge: 0,
                        srq_limit: u32::from(inp.u8() % 8),
                    };
                    let _ = x.dev.modify_srq(x.srq, &at, SrqAttrMask::LIMIT);
                }
                _ => {
                    // A forged frame with bytes changed after its ICRC was computed (the
                    // ECN bits, which the ICRC does not cover, among them), or cut short.
                    if let Some(mut f) = forge(x, y, &mut inp) {
                        for _ in 0..1 + inp.u8() % 4 {
                            let i = usize::from(inp.u16()) % f.len();
                            f[i] ^= inp.u8() | 1;
                        }
                        if inp.u8() % 4 == 0 {
                            let n = usize::from(inp.u16()) % f.len();
                            f.truncate(n);
                        }
                        give(x, link.now, &f);
                        st.mutated += 1;
                    }
                }
            },
            _ => link.pull(&mut a, &mut b),
        }
        check(&mut a, "A", &mut st);
        check(&mut b, "B", &mut st);
    }
    st.posted = a.next + b.next;
    // The end: a perfect link until nothing moves.
    settle(&mut link, &mut a, &mut b, &mut st);
    for (s, who) in [(&a, "A"), (&b, "B")] {
        assert!(
            s.sends.is_empty(),
            "{who}: sends never completed: {:?}; QP states {:?}; next timer {:?}",
            s.sends,
            (0..4).map(|q| state(s, q)).collect::<Vec<_>>(),
            s.dev.poll_timeout()
        );
    }
    // B's own-queue UD QP still receives a legitimate message byte-exact once the receives
    // posted before the probe are used up (each probe message takes one).
    // (A receive too small for the probe's 240 bytes stays at the head of its queue and the
    // messages that do not fit are dropped, by design: src/ud/qp.rs.)
    let fits = b
        .recvs
        .values()
        .all(|r| r.0 != Some(b.qps[UD_OWN]) || r.1 >= 240);
    if fits && state(&a, UD_OWN) == QpState::Rts && state(&b, UD_OWN) == QpState::Rts {
        probe(&mut link, &mut a, &mut b, &mut st);
    }
    st
}

fn settle(link: &mut Link, a: &mut Side, b: &mut Side, st: &mut Stats) {
    for _ in 0..64 {
        link.pull(a, b);
        check(a, "A", st);
        check(b, "B", st);
        if link.ab.is_empty() && link.ba.is_empty() {
            break;
        }
        while let Some(f) = link.ab.pop_front() {
            give(b, link.now, &f);
        }
        while let Some(f) = link.ba.pop_front() {
            give(a, link.now, &f);
        }
        link.now += Duration::from_micros(100);
        link.timers(a, b);
        check(a, "A", st);
        check(b, "B", st);
    }
    assert!(
        link.ab.is_empty() && link.ba.is_empty(),
        "frames still flowing after 64 rounds of a perfect link"
    );
}

fn probe(link: &mut Link, a: &mut Side, b: &mut Side, st: &mut Stats) {
    st.probes += 1;
    let data: Vec<u8> = (0..200u32).map(|i| (i * 7 + 3) as u8).collect();
    a.rw.write(0, &data).expect("write");
    let at = REGION - 512;
    let mut probe_in = false;
    for _ in 0..=QDEPTH + 1 {
        if !probe_in {
            // Refused while the queue is full of the input's receives; each message takes one.
            let rs = Sge {
                addr: b.rw.addr() + at as u64,
                length: 40 + 200,
                lkey: b.rw.lkey(),
            };
            let wr = RecvWr {
                wr_id: PROBE_ID,
                sg_list: vec![rs].into(),
            };
            if b.dev.post_recv(b.qps[UD_OWN], wr).is_ok() {
                b.recvs.insert(PROBE_ID, (Some(b.qps[UD_OWN]), 240));
                probe_in = true;
            }
        }
        let id = SEND_ID | a.next;
        a.next += 1;
        let wr = SendWr::new(
            id,
            SendOp::Send,
            vec![Sge {
                addr: a.rw.addr(),
                length: 200,
                lkey: a.rw.lkey(),
            }],
        )
        .with_flags(SendFlags::SIGNALED)
        .with_ud(UdDest {
            ah: a.ah.expect("ah"),
            remote_qpn: b.qps[UD_OWN],
            remote_qkey: QKEY,
        });
        a.dev
            .post_send(a.qps[UD_OWN], wr)
            .expect("the probe send is accepted");
        a.sends.insert(id, a.qps[UD_OWN]);
        a.tx_bound += 1;
        settle(link, a, b, st);
        // A receive the input posted with a bad buffer ends the QP (a local error, then
        // the queue flushed): the probe then proves nothing.
        if state(a, UD_OWN) != QpState::Rts || state(b, UD_OWN) != QpState::Rts {
            return;
        }
        if probe_in && !b.recvs.contains_key(&PROBE_ID) {
            break;
        }
    }
    assert!(
        probe_in && !b.recvs.contains_key(&PROBE_ID),
        "the probe receive never completed (posted: {probe_in}); B's UD QP {:?}, A's {:?}, B's receives {:?}",
        b.dev.qp_counters(b.qps[UD_OWN]),
        a.dev.qp_counters(a.qps[UD_OWN]),
        b.recvs
    );
    let wc = b.probe_wc.expect("the probe's completion");
    assert_eq!(
        (wc.status, wc.byte_len),
        (WcStatus::Success, 240),
        "the probe: {wc:?}"
    );
    let mut got = vec![0u8; 200];
    b.rw.read(at + 40, &mut got).expect("read");
    assert_eq!(got, data, "the probe message arrived changed");
}
