//! The operation matrix over the seeded lossy simulator: each operation × path MTU
//! {256, 1024, 4096} × size {0, 1, MTU−1, MTU, MTU+1, 1 MiB} × loss {0, 1 %, 10 %}, with 1 %
//! duplication, 1 % reordering and jitter on. Every byte of every destination buffer is
//! verified (and the guard bytes around it untouched), and every completion is checked.

mod common;
use common::*;
use ferroce::sim::Pair;
use ferroce::time::Duration;
use ferroce::verbs::*;

const MTUS: [Mtu; 3] = [Mtu::M256, Mtu::M1024, Mtu::M4096];
const LOSSES: [f64; 3] = [0.0, 0.01, 0.10];
const MIB: usize = 1 << 20;
const GUARD: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Send,
    SendImm,
    SendInv,
    Write,
    WriteImm,
    Read,
    InlineSend,
    FetchAdd,
    CmpSwap,
}

fn sizes(mtu: Mtu) -> Vec<usize> {
    let m = mtu.bytes() as usize;
    vec![0, 1, m - 1, m, m + 1, MIB]
}

/// Run one case; returns (retransmits, frames) for reporting.
fn run(op: Op, mtu: Mtu, len: usize, loss: f64) -> (u64, u64) {
    let seed = (op as u64) << 40
        ^ (mtu.bytes() as u64) << 20
        ^ (len as u64)
        ^ ((loss * 1000.0) as u64) << 50;
    let mut p = Pair::new(seed, lossy(loss));
    let a = end(&mut p.a, MIB + 4 * GUARD);
    let b = end(&mut p.b, MIB + 4 * GUARD);
    connect(
        &mut p,
        &a,
        &b,
        &RcParams {
            mtu,
            ..RcParams::default()
        },
        0xff_ff00,
        0x12_3456,
    );
    let src = pattern(len, seed);
    let guard_byte = 0xee;
    a.mr.fill(guard_byte);
    b.mr.fill(guard_byte);
    let case = format!("{op:?} mtu={} len={len} loss={loss}", mtu.bytes());
    let (send_op, on_a) = match op {
        Op::Send | Op::SendImm | Op::SendInv | Op::InlineSend => {
            b.mr.write(GUARD, &vec![guard_byte; len]).unwrap();
            p.b.post_recv(
                b.qp,
                RecvWr {
                    wr_id: 77,
                    sg_list: vec![sge(&b.mr, GUARD, len + 16)].into(),
                },
            )
            .unwrap();
            a.mr.write(GUARD, &src).unwrap();
            let o = match op {
                Op::SendImm => SendOp::SendWithImm { imm: 0x1234_5678 },
                Op::SendInv => {
                    // A second MR on B whose rkey the SEND invalidates.
                    let extra = p.b.reg_mr(b.pd, 4096, ALL).unwrap();
                    let k = extra.rkey();
                    std::mem::forget(extra);
                    SendOp::SendWithInv { invalidate_rkey: k }
                }
                _ => SendOp::Send,
            };
            (o, true)
        }
        Op::Write | Op::WriteImm => {
            a.mr.write(GUARD, &src).unwrap();
            if op == Op::WriteImm {
                p.b.post_recv(
                    b.qp,
                    RecvWr {
                        wr_id: 78,
                        sg_list: vec![].into(),
                    },
                )
                .unwrap();
            }
            let ra = b.mr.addr() + GUARD as u64;
            let o = if op == Op::Write {
                SendOp::RdmaWrite {
                    remote_addr: ra,
                    rkey: b.mr.rkey(),
                }
            } else {
                SendOp::RdmaWriteWithImm {
                    remote_addr: ra,
                    rkey: b.mr.rkey(),
                    imm: 0xfeed_beef,
                }
            };
            (o, true)
        }
        Op::Read => {
            b.mr.write(GUARD, &src).unwrap();
            (
                SendOp::RdmaRead {
                    remote_addr: b.mr.addr() + GUARD as u64,
                    rkey: b.mr.rkey(),
                },
                false,
            )
        }
        Op::FetchAdd | Op::CmpSwap => {
            b.mr.write(GUARD, &41u64.to_ne_bytes()).unwrap();
            let ra = b.mr.addr() + GUARD as u64;
            let o = if op == Op::FetchAdd {
                SendOp::AtomicFetchAdd {
                    remote_addr: ra,
                    rkey: b.mr.rkey(),
                    add: 1,
                }
            } else {
                SendOp::AtomicCmpSwp {
                    remote_addr: ra,
                    rkey: b.mr.rkey(),
                    compare: 41,
                    swap: 0xdead,
                }
            };
            (o, false)
        }
    };
    let _ = on_a;
    let local_len = if matches!(op, Op::FetchAdd | Op::CmpSwap) {
        8
    } else {
        len
    };
    let mut flags = SendFlags::SIGNALED;
    if op == Op::InlineSend {
        flags |= SendFlags::INLINE;
    }
    p.a.post_send(
        a.qp,
        SendWr::new(1, send_op, vec![sge(&a.mr, GUARD, local_len)]).with_flags(flags),
    )
    .unwrap();
    let done = p.drive_until(Duration::from_secs(120), |p| p.a.cq_len(a.cq) >= 1);
    assert!(done, "{case}: no completion within 120 s of virtual time");
    // Let the responder's last ACKs and any stragglers settle.
    p.drive_for(Duration::from_secs(1));
    let wa = poll(&mut p.a, a.cq);
    let wb = poll(&mut p.b, b.cq);
    assert_eq!(wa.len(), 1, "{case}: {wa:?}");
    assert_eq!(wa[0].status, WcStatus::Success, "{case}: {wa:?}");
    assert_eq!(wa[0].wr_id, 1);
    let bm = b.mr.to_vec();
    let am = a.mr.to_vec();
    let check_dst = |mem: &[u8], what: &str| {
        assert!(
            mem[GUARD..GUARD + len] == src[..],
            "{case}: {what} destination bytes differ"
        );
        assert!(
            mem[..GUARD].iter().all(|&x| x == guard_byte),
            "{case}: {what} guard before touched"
        );
        assert!(
            mem[GUARD + len..GUARD + len + GUARD]
                .iter()
                .all(|&x| x == guard_byte),
            "{case}: {what} guard after touched"
        );
    };
    match op {
        Op::Send | Op::SendImm | Op::SendInv | Op::InlineSend => {
            assert_eq!(wa[0].opcode, WcOpcode::Send);
            assert_eq!(wb.len(), 1, "{case}: {wb:?}");
            let w = wb[0];
            assert_eq!(
                (w.wr_id, w.status, w.opcode, w.byte_len as usize),
                (77, WcStatus::Success, WcOpcode::Recv, len),
                "{case}"
            );
            assert_eq!(
                w.imm_data,
                (op == Op::SendImm).then_some(0x1234_5678),
                "{case}"
            );
            assert_eq!(
                w.wc_flags.contains(WcFlags::WITH_INV),
                op == Op::SendInv,
                "{case}"
            );
            assert_eq!(w.src_qp, a.qp);
            check_dst(&bm, "B");
        }
        Op::Write | Op::WriteImm => {
            assert_eq!(wa[0].opcode, WcOpcode::RdmaWrite);
            if op == Op::WriteImm {
                assert_eq!(wb.len(), 1, "{case}: {wb:?}");
                let w = wb[0];
                assert_eq!(
                    (w.wr_id, w.status, w.opcode, w.byte_len as usize),
                    (78, WcStatus::Success, WcOpcode::RecvRdmaWithImm, len),
                    "{case}"
                );
                assert_eq!(w.imm_data, Some(0xfeed_beef));
            } else {
                assert!(wb.is_empty(), "{case}: {wb:?}");
            }
            check_dst(&bm, "B");
        }
        Op::Read => {
            assert_eq!(
                (wa[0].opcode, wa[0].byte_len as usize),
                (WcOpcode::RdmaRead, len),
                "{case}"
            );
            assert!(wb.is_empty());
            check_dst(&am, "A");
        }
        Op::FetchAdd | Op::CmpSwap => {
            let want_b = if op == Op::FetchAdd { 42 } else { 0xdead };
            assert_eq!(
                u64::from_ne_bytes(bm[GUARD..GUARD + 8].try_into().unwrap()),
                want_b,
                "{case}: executed exactly once"
            );
            assert_eq!(
                u64::from_ne_bytes(am[GUARD..GUARD + 8].try_into().unwrap()),
                41,
                "{case}: original value returned"
            );
        }
    }
    let (_, ca) = p.a.counters();
    let (_, cb) = p.b.counters();
    if loss >= 0.1 && len == MIB {
        assert!(
            ca.retransmits + cb.retransmits > 0,
            "{case}: 10 % loss without a retransmission?"
        );
    }
    (ca.retransmits + cb.retransmits, p.frames)
}

fn matrix(op: Op) {
    let mut total = (0, 0);
    for mtu in MTUS {
        for len in sizes(mtu) {
            for loss in LOSSES {
                let r = run(op, mtu, len, loss);
                total.0 += r.0;
                total.1 += r.1;
            }
        }
    }
    eprintln!(
        "{op:?}: {} cases, {} frames, {} retransmissions",
        18 * 3,
        total.1,
        total.0
    );
}

#[test]
fn send() {
    matrix(Op::Send);
}
#[test]
fn send_with_imm() {
    matrix(Op::SendImm);
}
#[test]
fn send_with_inv() {
    matrix(Op::SendInv);
}
#[test]
fn write() {
    matrix(Op::Write);
}
#[test]
fn write_with_imm() {
    matrix(Op::WriteImm);
}
#[test]
fn read() {
    matrix(Op::Read);
}
#[test]
fn inline_send() {
    // Inline data is limited to max_inline_data (256 here): sizes 0, 1, 255, 256.
    for mtu in MTUS {
        for len in [0, 1, 255, 256] {
            for loss in LOSSES {
                run(Op::InlineSend, mtu, len, loss);
            }
        }
    }
}
#[test]
fn atomics() {
    for op in [Op::FetchAdd, Op::CmpSwap] {
        for mtu in MTUS {
            for loss in LOSSES {
                run(op, mtu, 8, loss);
            }
        }
    }
}
