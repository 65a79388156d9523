//! UD, UC, QP1 and shared receive queues over the simulator: two devices, frames carried by
//! the seeded network model, every assertion about what reaches the wire and what the
//! consumer sees.

mod common;

use common::{pattern, poll, sge};
use ferroce::sim::{Family, LinkConfig, Pair};
use ferroce::time::Duration;
use ferroce::verbs::*;
use ferroce::wire::{self, Opcode, QKey, QpNumber};

const QKEY: u32 = 0x1111_1111;

fn clean() -> LinkConfig {
    LinkConfig::new()
        .latency(Duration::from_micros(5))
        .bandwidth_bps(25_000_000_000)
}

fn cap(n: u32) -> QpCap {
    common::qp_cap(n, 2, 64)
}

/// A UD QP in RTS on `dev` with a region of `len` bytes.
struct UdEnd {
    pd: Pd,
    cq: Cq,
    qp: QpNumber,
    mr: MemoryRegion,
}

fn ud_end(dev: &mut Device, len: usize, srq: Option<Srq>, pd: Option<Pd>) -> UdEnd {
    let pd = pd.unwrap_or_else(|| dev.alloc_pd().unwrap());
    let cq = dev.create_cq(4096).unwrap();
    let mut init = QpInitAttr::new(pd, cq, cq, cap(256)).with_type(QpType::Ud);
    init.srq = srq;
    let qp = dev.create_qp(init).unwrap();
    dev.bring_up_ud(
        qp,
        &UdParams {
            qkey: QKEY,
            local_psn: 77,
        },
    )
    .unwrap();
    let mr = dev.reg_mr(pd, len, AccessFlags::LOCAL_WRITE).unwrap();
    UdEnd { pd, cq, qp, mr }
}

/// An address handle on `from` towards `to`'s first GID.
fn ah_to(from: &mut Device, pd: Pd, to: &Device) -> Ah {
    let av = AddressVector {
        dgid: to.gid(0).unwrap(),
        sgid_index: 0,
        hop_limit: 64,
        traffic_class: 0,
        flow_label: 0,
        dmac: Some(to.config().mac.0),
    };
    from.create_ah(pd, &av).unwrap()
}

fn ud_send(
    id: u64,
    mr: &MemoryRegion,
    off: usize,
    len: usize,
    ah: Ah,
    qpn: QpNumber,
    qkey: u32,
) -> SendWr {
    SendWr::new(id, SendOp::Send, vec![sge(mr, off, len)]).with_ud(UdDest {
        ah,
        remote_qpn: qpn,
        remote_qkey: qkey,
    })
}

fn recv(id: u64, mr: &MemoryRegion, off: usize, len: usize) -> RecvWr {
    RecvWr {
        wr_id: id,
        sg_list: vec![sge(mr, off, len)].into(),
    }
}

#[test]
fn ud_send_and_receive_with_the_grh_slot_and_an_answer_from_the_wc() {
    for family in [Family::V4, Family::V6] {
        let mut p = Pair::with_family(1, clean(), family);
        p.trace = Some(Vec::new());
        let a = ud_end(&mut p.a, 8192, None, None);
        let b = ud_end(&mut p.b, 8192, None, None);
        let data = pattern(1000, 3);
        a.mr.write(0, &data).unwrap();
        p.b.post_recv(b.qp, recv(1, &b.mr, 0, 40 + 1000)).unwrap();
        let ah = ah_to(&mut p.a, a.pd, &p.b);
        p.a.post_send(a.qp, ud_send(9, &a.mr, 0, 1000, ah, b.qp, QKEY))
            .unwrap();
        assert!(p.drive_for(Duration::from_millis(10)));
        // The send completed when it left; the receive carries the GRH slot and the payload.
        let wa = poll(&mut p.a, a.cq);
        assert_eq!(
            (wa.len(), wa[0].wr_id, wa[0].status),
            (1, 9, WcStatus::Success)
        );
        let wb = poll(&mut p.b, b.cq);
        assert_eq!(wb.len(), 1, "{family:?}");
        let wc = wb[0];
        assert_eq!(
            (wc.status, wc.opcode, wc.byte_len),
            (WcStatus::Success, WcOpcode::Recv, 1040)
        );
        assert_eq!(wc.src_qp, a.qp);
        assert!(wc.wc_flags.contains(WcFlags::GRH));
        assert_eq!(
            (wc.pkey_index, wc.slid, wc.sl, wc.dlid_path_bits),
            (0, 0, 0, 0)
        );
        let mut got = vec![0u8; 1040];
        b.mr.read(0, &mut got).unwrap();
        assert_eq!(&got[40..], &data[..]);
        // The slot holds the IP header of the frame that carried the message, as it was on
        // the wire: IPv4 in its last 20 bytes after 20 zeros, IPv6 in all 40.
        let trace = p.trace.take().unwrap();
        let frame = &trace.iter().find(|(_, from_a, _)| *from_a).unwrap().2;
        let parsed = wire::parse_frame(frame).unwrap();
        let ip_hdr = &frame[parsed.offsets.ip..parsed.offsets.udp];
        match family {
            Family::V4 => {
                assert_eq!(&got[..20], &[0u8; 20]);
                assert_eq!(&got[20..40], ip_hdr);
            }
            Family::V6 => assert_eq!(&got[..40], ip_hdr),
        }
        // On the wire: UD SEND_ONLY, DETH with our Q_Key and QPN, rxe's UD source port.
        let r = parsed.repr.roce;
        assert_eq!(r.bth.opcode, Opcode::UD_SEND_ONLY);
        assert_eq!(r.bth.psn.get(), 77);
        let deth = r.ext.deth.unwrap();
        assert_eq!((deth.qkey, deth.src_qp), (QKey(QKEY), a.qp));
        let sport = 0xc000 + ((a.qp.get().wrapping_mul(0x61c8_8647)) >> 18) as u16;
        assert_eq!(parsed.repr.udp.src_port, sport);
        // B answers A along an address handle made from the completion (ibv_create_ah_from_wc).
        let back = p.b.create_ah_from_wc(b.pd, &wc, &got[..40]).unwrap();
        let av = p.b.query_ah(back).unwrap();
        assert_eq!(av.dgid, p.a.gid(0).unwrap());
        assert_eq!(
            av.dmac,
            Some(p.a.config().mac.0),
            "the MAC A's frame came from"
        );
        b.mr.write(100, b"pong").unwrap();
        p.a.post_recv(a.qp, recv(2, &a.mr, 4096, 100)).unwrap();
        p.b.post_send(b.qp, ud_send(3, &b.mr, 100, 4, back, wc.src_qp, QKEY))
            .unwrap();
        assert!(p.drive_for(Duration::from_millis(10)));
        let wa = poll(&mut p.a, a.cq);
        assert_eq!((wa[0].wr_id, wa[0].byte_len, wa[0].src_qp), (2, 44, b.qp));
        let mut pong = [0u8; 4];
        a.mr.read(4096 + 40, &mut pong).unwrap();
        assert_eq!(&pong, b"pong");
    }
}

#[test]
fn ud_qkeys_mtu_and_bad_input() {
    let mut p = Pair::new(2, clean());
    let mut cfg = p.a.config().clone();
    cfg.port_mtu = Mtu::M1024;
    p.a = Device::new(cfg);
    let a = ud_end(&mut p.a, 8192, None, None);
    let b = ud_end(&mut p.b, 8192, None, None);
    let ah = ah_to(&mut p.a, a.pd, &p.b);
    for i in 0..4 {
        p.b.post_recv(b.qp, recv(i, &b.mr, i as usize * 1100, 1100))
            .unwrap();
    }
    // A wrong Q_Key is dropped and counted; a controlled one (high bit) sends A's own.
    p.a.post_send(a.qp, ud_send(1, &a.mr, 0, 10, ah, b.qp, 0x2222_2222))
        .unwrap();
    p.a.post_send(a.qp, ud_send(2, &a.mr, 0, 10, ah, b.qp, 0x8000_0000))
        .unwrap();
    assert!(p.drive_for(Duration::from_millis(10)));
    let wb = poll(&mut p.b, b.cq);
    assert_eq!(wb.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0]);
    assert_eq!(p.b.qp_counters(b.qp).unwrap().qkey_drops, 1);
    // Beyond the port MTU (1024 on A): a local length error, SQE, what follows is flushed.
    p.a.post_send(a.qp, ud_send(3, &a.mr, 0, 1025, ah, b.qp, QKEY))
        .unwrap();
    p.a.post_send(a.qp, ud_send(4, &a.mr, 0, 8, ah, b.qp, QKEY))
        .unwrap();
    assert!(p.drive_for(Duration::from_millis(10)));
    let wa = poll(&mut p.a, a.cq);
    let st: Vec<_> = wa.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        st,
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::LocLenErr),
            (4, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(p.a.query_qp(a.qp).unwrap().0, QpState::Sqe);
    // Posting in SQE flushes; SQE -> RTS recovers.
    p.a.post_send(a.qp, ud_send(5, &a.mr, 0, 8, ah, b.qp, QKEY))
        .unwrap();
    assert_eq!(poll(&mut p.a, a.cq)[0].status, WcStatus::WrFlushErr);
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    p.a.modify_qp(a.qp, &rts, QpAttrMask::STATE).unwrap();
    p.a.post_send(a.qp, ud_send(6, &a.mr, 0, 8, ah, b.qp, QKEY))
        .unwrap();
    assert!(p.drive_for(Duration::from_millis(10)));
    assert_eq!(poll(&mut p.a, a.cq)[0].status, WcStatus::Success);
    assert_eq!(poll(&mut p.b, b.cq)[0].wr_id, 1);
    // What a UD QP does not carry is refused at post time, as ibv_post_send does.
    let write = SendWr::new(
        7,
        SendOp::RdmaWrite {
            remote_addr: 0,
            rkey: wire::RKey(1),
        },
        vec![sge(&a.mr, 0, 8)],
    );
    assert_eq!(
        p.a.post_send(a.qp, write),
        Err(VerbsError::BadOpcode(QpType::Ud))
    );
    let no_dest = SendWr::new(8, SendOp::Send, vec![sge(&a.mr, 0, 8)]);
    assert_eq!(p.a.post_send(a.qp, no_dest), Err(VerbsError::NoUdDest));
    p.a.destroy_ah(ah).unwrap();
    assert_eq!(
        p.a.post_send(a.qp, ud_send(9, &a.mr, 0, 8, ah, b.qp, QKEY)),
        Err(VerbsError::NoSuchAh)
    );
    // An address handle of another PD is not ours to use.
    let other_pd = p.a.alloc_pd().unwrap();
    let ah2 = ah_to(&mut p.a, other_pd, &p.b);
    assert_eq!(
        p.a.post_send(a.qp, ud_send(10, &a.mr, 0, 8, ah2, b.qp, QKEY)),
        Err(VerbsError::NoSuchAh)
    );
}

#[test]
fn ud_without_a_receive_wqe_drops_silently() {
    let mut p = Pair::new(3, clean());
    let a = ud_end(&mut p.a, 4096, None, None);
    let b = ud_end(&mut p.b, 4096, None, None);
    let ah = ah_to(&mut p.a, a.pd, &p.b);
    for i in 0..3 {
        p.a.post_send(a.qp, ud_send(i, &a.mr, 0, 100, ah, b.qp, QKEY))
            .unwrap();
    }
    assert!(p.drive_for(Duration::from_millis(10)));
    assert_eq!(
        poll(&mut p.a, a.cq).len(),
        3,
        "UD sends complete without the receiver"
    );
    assert!(poll(&mut p.b, b.cq).is_empty());
    assert_eq!(p.b.qp_counters(b.qp).unwrap().no_wqe_drops, 3);
    assert_eq!(p.b.query_qp(b.qp).unwrap().0, QpState::Rts);
}

#[test]
fn qp1_exchanges_mads_with_the_gsi_qkey() {
    let mut p = Pair::new(4, clean());
    let gsi = |dev: &mut Device| {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(64).unwrap();
        let init = QpInitAttr::new(pd, cq, cq, cap(16)).with_type(QpType::Ud);
        let qp = dev.create_gsi_qp(init).unwrap();
        assert_eq!(qp, QpNumber::GSI);
        assert!(matches!(dev.create_gsi_qp(init), Err(VerbsError::Busy(_))));
        // Whatever Q_Key the bring-up names, QP1's is 0x80010000.
        dev.bring_up_ud(qp, &UdParams::default()).unwrap();
        assert_eq!(dev.query_qp(qp).unwrap().1.qkey, 0x8001_0000);
        let mr = dev.reg_mr(pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
        UdEnd { pd, cq, qp, mr }
    };
    let a = gsi(&mut p.a);
    let b = gsi(&mut p.b);
    p.trace = Some(Vec::new());
    let mad = pattern(256, 11);
    a.mr.write(0, &mad).unwrap();
    p.b.post_recv(b.qp, recv(1, &b.mr, 0, 296)).unwrap();
    let ah = ah_to(&mut p.a, a.pd, &p.b);
    // A MAD goes to QP1 with the GSI Q_Key (a controlled one: the QP's own is sent).
    p.a.post_send(
        a.qp,
        ud_send(1, &a.mr, 0, 256, ah, QpNumber::GSI, 0x8001_0000),
    )
    .unwrap();
    assert!(p.drive_for(Duration::from_millis(10)));
    let wb = poll(&mut p.b, b.cq);
    assert_eq!(
        (wb[0].status, wb[0].byte_len, wb[0].src_qp),
        (WcStatus::Success, 296, QpNumber::GSI)
    );
    let mut got = vec![0u8; 256];
    b.mr.read(40, &mut got).unwrap();
    assert_eq!(got, mad);
    // From UDP port 55410, as rxe's QP1 sends (captures/rxe-reference).
    let trace = p.trace.take().unwrap();
    let f = wire::parse_frame(&trace[0].2).unwrap();
    assert_eq!(f.repr.udp.src_port, 55410);
    assert_eq!(f.repr.roce.bth.pkey, wire::PKey::DEFAULT);
}

/// A UC connection between A and B at path MTU 256.
fn uc_pair(seed: u64, link: LinkConfig) -> (Pair, common::End, common::End) {
    let mut p = Pair::new(seed, link);
    let mk = |dev: &mut Device| {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(1 << 14).unwrap();
        let qp = dev
            .create_qp(QpInitAttr::new(pd, cq, cq, cap(1024)).with_type(QpType::Uc))
            .unwrap();
        let mr = dev
            .reg_mr(
                pd,
                1 << 20,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
        common::End { pd, cq, qp, mr }
    };
    let a = mk(&mut p.a);
    let b = mk(&mut p.b);
    let ra = p.a.local_end(a.qp, 0, 5000).unwrap();
    let rb = p.b.local_end(b.qp, 0, 0xff_fff0).unwrap();
    let params = |psn| UcParams {
        mtu: Mtu::M256,
        local_psn: psn,
        ..UcParams::default()
    };
    p.a.connect_uc(a.qp, &rb, &params(5000)).unwrap();
    p.b.connect_uc(b.qp, &ra, &params(0xff_fff0)).unwrap();
    (p, a, b)
}

#[test]
fn uc_send_and_write_with_immediate_without_acks() {
    let (mut p, a, b) = uc_pair(5, clean());
    p.trace = Some(Vec::new());
    let data = pattern(1000, 5);
    a.mr.write(0, &data).unwrap();
    p.b.post_recv(b.qp, recv(1, &b.mr, 0, 2000)).unwrap();
    p.b.post_recv(b.qp, recv(2, &b.mr, 0, 16)).unwrap();
    p.a.post_send(
        a.qp,
        SendWr::new(
            10,
            SendOp::SendWithImm { imm: 0xabc },
            vec![sge(&a.mr, 0, 1000)],
        ),
    )
    .unwrap();
    let w = SendOp::RdmaWriteWithImm {
        remote_addr: b.mr.addr() + 65536,
        rkey: b.mr.rkey(),
        imm: 0xdef,
    };
    p.a.post_send(a.qp, SendWr::new(11, w, vec![sge(&a.mr, 0, 600)]))
        .unwrap();
    assert!(p.drive_for(Duration::from_millis(10)));
    let wa = poll(&mut p.a, a.cq);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(10, WcStatus::Success), (11, WcStatus::Success)]
    );
    let wb = poll(&mut p.b, b.cq);
    assert_eq!(
        wb.iter()
            .map(|w| (w.wr_id, w.opcode, w.byte_len, w.imm_data))
            .collect::<Vec<_>>(),
        [
            (1, WcOpcode::Recv, 1000, Some(0xabc)),
            (2, WcOpcode::RecvRdmaWithImm, 600, Some(0xdef))
        ]
    );
    let mut got = vec![0u8; 1000];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(got, data);
    b.mr.read(65536, &mut got[..600]).unwrap();
    assert_eq!(&got[..600], &data[..600]);
    // The wire: UC opcodes only, no AckReq, no packet from B at all, PSNs across the wrap.
    let t = common::decoded_trace(&p);
    assert!(
        t.iter().all(|(_, from_a, ..)| *from_a),
        "UC is never acknowledged"
    );
    let ops: Vec<(u8, u32, bool)> = t
        .iter()
        .map(|(_, _, r, _)| (r.bth.opcode.0, r.bth.psn.get(), r.bth.ack_req))
        .collect();
    assert_eq!(
        ops,
        [
            (0x20, 5000, false),
            (0x21, 5001, false),
            (0x21, 5002, false),
            (0x23, 5003, false),
            (0x26, 5004, false),
            (0x27, 5005, false),
            (0x29, 5006, false)
        ]
    );
    // Nothing UC does not carry.
    let read = SendWr::new(
        12,
        SendOp::RdmaRead {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        vec![sge(&a.mr, 0, 8)],
    );
    assert_eq!(
        p.a.post_send(a.qp, read),
        Err(VerbsError::BadOpcode(QpType::Uc))
    );
}

#[test]
fn uc_under_loss_delivers_whole_messages_or_nothing() {
    let link = common::lossy(0.05);
    let (mut p, a, b) = uc_pair(6, link);
    let n = 200usize;
    for i in 0..n {
        let len = 1 + (i * 37) % 1500;
        a.mr.write(i * 2048, &pattern(len, i as u64)).unwrap();
    }
    for i in 0..n {
        p.b.post_recv(b.qp, recv(i as u64, &b.mr, i * 2048, 2048))
            .unwrap();
    }
    for i in 0..n {
        let len = 1 + (i * 37) % 1500;
        p.a.post_send(
            a.qp,
            SendWr::new(
                i as u64,
                SendOp::SendWithImm { imm: i as u32 },
                vec![sge(&a.mr, i * 2048, len)],
            ),
        )
        .unwrap();
        // Let the sends spread out so that losses hit single messages.
        p.drive_for(Duration::from_micros(20));
    }
    assert!(p.drive_for(Duration::from_millis(50)));
    let wa = poll(&mut p.a, a.cq);
    assert_eq!(wa.len(), n, "every UC send completes at the sender");
    let wb = poll(&mut p.b, b.cq);
    assert!(
        !wb.is_empty() && wb.len() < n,
        "5 % loss: some, not all ({})",
        wb.len()
    );
    let mut last = None;
    for wc in &wb {
        assert_eq!(wc.status, WcStatus::Success);
        // The immediate names the message; its WQE may be an earlier one (a WQE whose message
        // was lost takes the next one).
        let i = wc.imm_data.unwrap() as usize;
        assert!(last.is_none_or(|l| i > l), "in order, never twice");
        last = Some(i);
        let len = 1 + (i * 37) % 1500;
        assert_eq!(wc.byte_len as usize, len);
        let mut got = vec![0u8; len];
        b.mr.read(wc.wr_id as usize * 2048, &mut got).unwrap();
        assert_eq!(got, pattern(len, i as u64), "message {i} whole and correct");
    }
    let c = p.b.qp_counters(b.qp).unwrap();
    assert!(c.out_of_sequence > 0);
    assert_eq!(p.b.query_qp(b.qp).unwrap().0, QpState::Rts);
}

#[test]
fn rc_qps_share_an_srq_with_rnr_and_the_limit_event() {
    let mut p = Pair::new(7, clean());
    // B: three RC QPs on one SRQ; A: three RC QPs.
    let pd_b = p.b.alloc_pd().unwrap();
    let cq_b = p.b.create_cq(1024).unwrap();
    let srq =
        p.b.create_srq(
            pd_b,
            SrqAttr {
                max_wr: 64,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let mr_b = p.b.reg_mr(pd_b, 1 << 16, AccessFlags::LOCAL_WRITE).unwrap();
    let pd_a = p.a.alloc_pd().unwrap();
    let cq_a = p.a.create_cq(1024).unwrap();
    let mr_a = p.a.reg_mr(pd_a, 1 << 16, AccessFlags::LOCAL_WRITE).unwrap();
    let params = RcParams {
        min_rnr_timer: 1,
        ..RcParams::default()
    };
    let mut pairs = Vec::new();
    for i in 0..3 {
        let qa =
            p.a.create_qp(QpInitAttr::new(pd_a, cq_a, cq_a, cap(64)))
                .unwrap();
        let qb =
            p.b.create_qp(QpInitAttr::new(pd_b, cq_b, cq_b, cap(64)).with_srq(srq))
                .unwrap();
        p.connect(qa, qb, &params, 100 * i, 1000 * i).unwrap();
        pairs.push((qa, qb));
    }
    assert_eq!(
        p.b.post_recv(pairs[0].1, recv(0, &mr_b, 0, 64)),
        Err(VerbsError::QpHasSrq)
    );
    assert!(matches!(p.b.destroy_srq(srq), Err(VerbsError::Busy(_))));
    // The SRQ is empty: each first SEND is RNR-NAKed; posting 6 WQEs lets them through.
    for (i, (qa, _)) in pairs.iter().enumerate() {
        mr_a.write(i * 64, &[i as u8 + 1; 64]).unwrap();
        p.a.post_send(
            *qa,
            SendWr::new(i as u64, SendOp::Send, vec![sge(&mr_a, i * 64, 64)]),
        )
        .unwrap();
    }
    p.drive_for(Duration::from_micros(200));
    let rnr: u64 = pairs
        .iter()
        .map(|(_, qb)| p.b.qp_counters(*qb).unwrap().rnr_naks_sent)
        .sum();
    assert!(rnr >= 3, "an empty SRQ answers with RNR NAKs ({rnr})");
    for k in 0..6 {
        p.b.post_srq_recv(srq, recv(100 + k, &mr_b, k as usize * 64, 64))
            .unwrap();
    }
    // Armed at 4: fires when a take leaves fewer than 4 (6 -> 3 after three messages).
    p.b.modify_srq(
        srq,
        &SrqAttr {
            srq_limit: 4,
            ..SrqAttr::default()
        },
        SrqAttrMask::LIMIT,
    )
    .unwrap();
    // (The senders' local ACK timers, 67 ms, stay armed after the last RNR retry: drive until
    // the receives are there rather than until nothing is left.)
    assert!(p.drive_until(Duration::from_millis(50), |p| p.b.cq_len(cq_b) == 3));
    let wb = poll(&mut p.b, cq_b);
    assert_eq!(wb.len(), 3);
    // Each message landed in one SRQ WQE, in the order the SRQ gave them out; the QP tells
    // which connection it came on.
    let mut ids: Vec<u64> = wb.iter().map(|w| w.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [100, 101, 102]);
    for wc in &wb {
        let i = pairs.iter().position(|(_, qb)| *qb == wc.qp_num).unwrap();
        let mut got = [0u8; 64];
        mr_b.read((wc.wr_id - 100) as usize * 64, &mut got).unwrap();
        assert_eq!(got, [i as u8 + 1; 64]);
    }
    assert_eq!(
        p.b.get_async_event(),
        Some(AsyncEvent::SrqLimitReached(srq))
    );
    assert_eq!(p.b.get_async_event(), None);
    assert_eq!(
        p.b.query_srq(srq).unwrap().srq_limit,
        0,
        "disarmed once fired"
    );
    // A QP leaving for ERR reports its last WQE; the SRQ keeps its WQEs for the others.
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    p.b.modify_qp(pairs[0].1, &err, QpAttrMask::STATE).unwrap();
    assert_eq!(
        p.b.get_async_event(),
        Some(AsyncEvent::QpLastWqeReached(pairs[0].1))
    );
    assert_eq!(p.b.srq_occupancy(srq).unwrap().0, 3);
    p.a.post_send(
        pairs[1].0,
        SendWr::new(9, SendOp::Send, vec![sge(&mr_a, 0, 64)]),
    )
    .unwrap();
    assert!(p.drive_until(Duration::from_millis(10), |p| p.b.cq_len(cq_b) == 1));
    assert_eq!(poll(&mut p.b, cq_b)[0].wr_id, 103);
    for (_, qb) in &pairs {
        p.b.destroy_qp(*qb).unwrap();
    }
    p.b.destroy_srq(srq).unwrap();
    assert_eq!(p.b.query_srq(srq), Err(VerbsError::NoSuchSrq));
}

#[test]
fn ud_qps_on_an_srq_drop_when_it_is_empty() {
    let mut p = Pair::new(8, clean());
    let pd = p.b.alloc_pd().unwrap();
    let srq =
        p.b.create_srq(
            pd,
            SrqAttr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let b1 = ud_end(&mut p.b, 8192, Some(srq), Some(pd));
    let b2 = ud_end(&mut p.b, 8192, Some(srq), Some(pd));
    let a = ud_end(&mut p.a, 8192, None, None);
    let ah = ah_to(&mut p.a, a.pd, &p.b);
    p.a.post_send(a.qp, ud_send(1, &a.mr, 0, 10, ah, b1.qp, QKEY))
        .unwrap();
    assert!(p.drive_for(Duration::from_millis(5)));
    assert_eq!(p.b.qp_counters(b1.qp).unwrap().no_wqe_drops, 1);
    for k in 0..2 {
        p.b.post_srq_recv(srq, recv(k, &b1.mr, k as usize * 100, 100))
            .unwrap();
    }
    p.a.post_send(a.qp, ud_send(2, &a.mr, 0, 10, ah, b2.qp, QKEY))
        .unwrap();
    p.a.post_send(a.qp, ud_send(3, &a.mr, 0, 10, ah, b1.qp, QKEY))
        .unwrap();
    assert!(p.drive_for(Duration::from_millis(5)));
    let got: Vec<(u64, QpNumber)> = poll(&mut p.b, b1.cq)
        .iter()
        .chain(poll(&mut p.b, b2.cq).iter())
        .map(|w| (w.wr_id, w.qp_num))
        .collect();
    assert_eq!(got, [(1, b1.qp), (0, b2.qp)]);
}

#[test]
fn modify_qp_follows_each_transport_s_table() {
    let mut dev = Device::new(DeviceConfig::new(
        wire::MacAddr([2, 0, 0, 0, 0, 1]),
        "10.0.0.1".parse().unwrap(),
    ));
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(8).unwrap();
    let ud = dev
        .create_qp(QpInitAttr::new(pd, cq, cq, cap(4)).with_type(QpType::Ud))
        .unwrap();
    let uc = dev
        .create_qp(QpInitAttr::new(pd, cq, cq, cap(4)).with_type(QpType::Uc))
        .unwrap();
    // UD: INIT needs a Q_Key, not access flags; RTR needs nothing; no address vector ever.
    let (init, m) = RcParams::default().init_attr();
    assert!(matches!(
        dev.modify_qp(ud, &init, m),
        Err(VerbsError::Modify(ModifyQpError::MissingAttributes { .. }))
    ));
    let (init, m) = UdParams::default().init_attr();
    dev.modify_qp(ud, &init, m).unwrap();
    let (rtr, m) = UdParams::default().rtr_attr();
    dev.modify_qp(ud, &rtr, m).unwrap();
    assert_eq!(dev.query_qp(ud).unwrap().0, QpState::Rtr);
    // UC: RTR without responder resources or RNR timer.
    let (init, m) = UcParams::default().init_attr();
    dev.modify_qp(uc, &init, m).unwrap();
    let remote = RemoteQp {
        qpn: QpNumber::new(0x99),
        gid: dev.gid(0).unwrap(),
        mac: wire::MacAddr([2, 0, 0, 0, 0, 2]),
        psn: 1,
    };
    let (mut rtr, m) = RcParams::default().rtr_attr(&remote);
    assert!(matches!(
        dev.modify_qp(uc, &rtr, m),
        Err(VerbsError::Modify(
            ModifyQpError::UnexpectedAttributes { .. }
        ))
    ));
    let (r, m) = UcParams::default().rtr_attr(&remote);
    dev.modify_qp(uc, &r, m).unwrap();
    // The P_Key table has one entry.
    rtr.qp_state = QpState::Rtr;
    rtr.pkey_index = 1;
    assert!(dev.modify_qp(uc, &rtr, QpAttrMask::PKEY_INDEX).is_err());
}

/// UD over a network that loses, duplicates and reorders, for several seeds: every message
/// that arrives is whole and correct (its length, its bytes, the GRH slot naming the sender),
/// never more than the port MTU, and arrives no more often than copies of its packet reached
/// B; what the network lost is simply absent (UD has no retransmission), the QPs stay in RTS.
/// A 25 Gb/s link with 5 µs latency and 3 µs jitter that loses `loss` of the frames,
/// duplicates 5 % and reorders 10 % by up to 20 µs.
fn hostile(loss: f64) -> LinkConfig {
    LinkConfig::new()
        .latency(Duration::from_micros(5))
        .jitter(Duration::from_micros(3))
        .bandwidth_bps(25_000_000_000)
        .loss(loss)
        .duplicate(0.05)
        .reorder(0.1, Duration::from_micros(20))
}

/// Drive the pair until idle: every one of A's `n` requests completes successfully at the
/// sender (neither UD nor UC waits for the peer), and the network did lose, duplicate and
/// reorder A's frames. Returns what it did to them.
fn sent_through_hostile(p: &mut Pair, cq: Cq, n: usize) -> ferroce::sim::LinkStats {
    assert!(p.drive_for(Duration::from_millis(20)));
    let wa = poll(&mut p.a, cq);
    assert_eq!(wa.len(), n, "every request completes at the sender");
    assert!(wa.iter().all(|w| w.status == WcStatus::Success));
    let (ea, eb) = p.endpoints();
    let st = p.net.stats(ea, eb);
    assert!(
        st.duplicated > 0 && st.dropped_loss > 0 && st.reordered > 0,
        "{st:?}"
    );
    st
}

/// A message delivered more than once only for copies the network made (`seen`: deliveries
/// per message), and both QPs still in RTS.
fn repeats_only_for_copies(
    p: &Pair,
    seed: u64,
    seen: &std::collections::HashMap<usize, usize>,
    st: &ferroce::sim::LinkStats,
    qa: QpNumber,
    qb: QpNumber,
) {
    let again: usize = seen.values().map(|&c| c - 1).sum();
    assert!(
        again as u64 <= st.duplicated,
        "seed {seed}: {again} repeated deliveries, {} copies made",
        st.duplicated
    );
    assert_eq!(p.a.query_qp(qa).unwrap().0, QpState::Rts);
    assert_eq!(p.b.query_qp(qb).unwrap().0, QpState::Rts);
}

#[test]
fn ud_under_loss_duplication_and_reordering_delivers_whole_messages_or_nothing() {
    for seed in [11u64, 12, 13, 14] {
        let mut p = Pair::new(seed, hostile(0.05));
        p.trace = Some(Vec::new());
        let a = ud_end(&mut p.a, 1 << 20, None, None);
        let b = ud_end(&mut p.b, 1 << 20, None, None);
        let ah = ah_to(&mut p.a, a.pd, &p.b);
        let mtu = 4096usize; // the simulator's port MTU (DeviceConfig's default)
        let n = 120usize;
        let len_of = |i: usize| 1 + (i * 997) % mtu; // up to the MTU, never beyond
        for i in 0..n {
            a.mr.write(i * 4096, &pattern(len_of(i), seed * 1000 + i as u64))
                .unwrap();
        }
        // More receives than messages: duplicates may take some.
        for j in 0..2 * n {
            p.b.post_recv(b.qp, recv(j as u64, &b.mr, j * 4200 % (1 << 20), 40 + mtu))
                .unwrap();
        }
        for i in 0..n {
            let mut wr = ud_send(i as u64, &a.mr, i * 4096, len_of(i), ah, b.qp, QKEY);
            wr.op = SendOp::SendWithImm { imm: i as u32 };
            p.a.post_send(a.qp, wr).unwrap();
            p.drive_for(Duration::from_micros(3));
        }
        // What the network did to A's frames: delivered to B (copies included), duplicated.
        let st = sent_through_hostile(&mut p, a.cq, n);
        let wb = poll(&mut p.b, b.cq);
        assert!(
            !wb.is_empty() && wb.len() as u64 <= st.delivered,
            "seed {seed}: {} deliveries of {} frames",
            wb.len(),
            st.delivered
        );
        let mut seen = std::collections::HashMap::<usize, usize>::new();
        for wc in &wb {
            assert_eq!(wc.status, WcStatus::Success, "seed {seed}");
            let i = wc.imm_data.unwrap() as usize;
            assert!(i < n);
            *seen.entry(i).or_default() += 1;
            let len = len_of(i);
            assert_eq!(wc.byte_len as usize, 40 + len, "seed {seed} message {i}");
            assert!(wc.byte_len as usize <= 40 + mtu);
            assert_eq!(wc.src_qp, a.qp);
            let off = wc.wr_id as usize * 4200 % (1 << 20);
            let mut got = vec![0u8; 40 + len];
            b.mr.read(off, &mut got).unwrap();
            assert_eq!(
                &got[40..],
                &pattern(len, seed * 1000 + i as u64)[..],
                "seed {seed}: message {i} whole and correct"
            );
            match wire::grh::GrhSlot::parse(&got[..40]).unwrap() {
                wire::grh::GrhSlot::V4 { src, .. } => {
                    assert_eq!(std::net::IpAddr::V4(src), ip_of_gid(p.a.gid(0).unwrap()))
                }
                other => panic!("{other:?}"),
            }
        }
        // Some lost; a message delivered again only for a copy the network made.
        assert!(seen.len() < n, "seed {seed}: 5 % loss lost nothing");
        repeats_only_for_copies(&p, seed, &seen, &st, a.qp, b.qp);
    }
}

/// UC over a network that loses, duplicates and reorders, for several seeds, with SENDs and
/// WRITEs with immediate of up to six packets each (MTU 256): a message that completes at B is
/// whole and correct (its length and every byte, in the receive buffer or at its WRITE target);
/// a message completes again only for a copy of its packets the network made (UC has no
/// duplicate detection beyond the PSN, IBTA vol 1 §9.8: a FIRST/ONLY after a gap starts a new
/// message); what was lost is absent, never a fragment announced; both QPs stay in RTS.
#[test]
fn uc_under_loss_duplication_and_reordering_delivers_whole_messages_or_nothing() {
    for seed in [21u64, 22, 23, 24] {
        let (mut p, a, b) = uc_pair(seed, hostile(0.03));
        let n = 150usize;
        let len_of = |i: usize| 1 + (i * 331) % 1500;
        let data = |i: usize| pattern(len_of(i), seed * 1000 + i as u64);
        let is_write = |i: usize| i % 3 == 2;
        // A's messages at i*2048; B's 2n receive buffers at j*2048, WRITE targets from 640 KiB.
        for i in 0..n {
            a.mr.write(i * 2048, &data(i)).unwrap();
        }
        for j in 0..2 * n {
            p.b.post_recv(b.qp, recv(j as u64, &b.mr, j * 2048, 2048))
                .unwrap();
        }
        let target = |i: usize| (640 << 10) + i * 2048;
        for i in 0..n {
            let op = if is_write(i) {
                SendOp::RdmaWriteWithImm {
                    remote_addr: b.mr.addr() + target(i) as u64,
                    rkey: b.mr.rkey(),
                    imm: i as u32,
                }
            } else {
                SendOp::SendWithImm { imm: i as u32 }
            };
            p.a.post_send(
                a.qp,
                SendWr::new(i as u64, op, vec![sge(&a.mr, i * 2048, len_of(i))]),
            )
            .unwrap();
            p.drive_for(Duration::from_micros(5));
        }
        let st = sent_through_hostile(&mut p, a.cq, n);
        let wb = poll(&mut p.b, b.cq);
        let mut seen = std::collections::HashMap::<usize, usize>::new();
        for wc in &wb {
            assert_eq!(wc.status, WcStatus::Success, "seed {seed}");
            let i = wc.imm_data.unwrap() as usize;
            assert!(i < n, "seed {seed}: immediate {i}");
            *seen.entry(i).or_default() += 1;
            assert_eq!(wc.byte_len as usize, len_of(i), "seed {seed} message {i}");
            let mut got = vec![0u8; len_of(i)];
            if is_write(i) {
                assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
                b.mr.read(target(i), &mut got).unwrap();
            } else {
                assert_eq!(wc.opcode, WcOpcode::Recv);
                b.mr.read(wc.wr_id as usize * 2048, &mut got).unwrap();
            }
            assert_eq!(got, data(i), "seed {seed}: message {i} whole and correct");
        }
        assert!(seen.len() < n, "seed {seed}: loss lost nothing");
        // (Every reordered packet ends a message in UC, and a late FIRST/ONLY the one after it:
        // how many get through depends on the seed; that some do is what this checks.)
        assert!(!seen.is_empty(), "seed {seed}: nothing delivered");
        let c = p.b.qp_counters(b.qp).unwrap();
        assert!(c.out_of_sequence > 0, "seed {seed}");
        repeats_only_for_copies(&p, seed, &seen, &st, a.qp, b.qp);
    }
}

/// UD multicast (`ibv_attach_mcast`): a SEND to a group's GID with destination QPN 0xFFFFFF
/// reaches every UD QP attached to the group, and no other; after `detach_mcast` the
/// detached QP receives nothing more; a group nobody attached to is dropped and counted; an
/// RC QP or a unicast address cannot be attached.
#[test]
fn ud_multicast_reaches_every_attached_qp_and_only_those() {
    let mut p = Pair::with_family(3, clean(), Family::V4);
    let a = ud_end(&mut p.a, 8192, None, None);
    let b1 = ud_end(&mut p.b, 8192, None, None);
    let b2 = ud_end(&mut p.b, 8192, None, Some(b1.pd));
    let b3 = ud_end(&mut p.b, 8192, None, Some(b1.pd));
    let group: std::net::IpAddr = "239.1.2.3".parse().unwrap();
    let other: std::net::IpAddr = "239.9.9.9".parse().unwrap();
    p.b.attach_mcast(b1.qp, group).unwrap();
    p.b.attach_mcast(b2.qp, group).unwrap();
    p.b.attach_mcast(b2.qp, group).unwrap(); // twice is once
    assert_eq!(p.b.mcast_groups(), vec![group]);
    // Refused: a unicast address, an RC QP.
    assert!(p
        .b
        .attach_mcast(b3.qp, "10.0.0.1".parse().unwrap())
        .is_err());
    let rc_cq = p.b.create_cq(16).unwrap();
    let rc =
        p.b.create_qp(QpInitAttr::new(b1.pd, rc_cq, rc_cq, cap(4)))
            .unwrap();
    assert!(p.b.attach_mcast(rc, group).is_err());
    for end in [&b1, &b2, &b3] {
        for i in 0..2 {
            p.b.post_recv(end.qp, recv(i, &end.mr, 1024 * i as usize, 40 + 100))
                .unwrap();
        }
    }
    let mac = [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03];
    let ah_for = |dev: &mut Device, ip: std::net::IpAddr| {
        let av = AddressVector {
            dgid: gid_of(ip),
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            dmac: Some(mac),
        };
        dev.create_ah(a.pd, &av).unwrap()
    };
    let ah = ah_for(&mut p.a, group);
    let all = QpNumber::new(0xff_ffff);
    a.mr.write(0, &pattern(100, 5)).unwrap();
    p.a.post_send(a.qp, ud_send(1, &a.mr, 0, 100, ah, all, QKEY))
        .unwrap();
    assert!(p.drive_for(Duration::from_millis(10)));
    let got = |p: &mut Pair, e: &UdEnd| poll(&mut p.b, e.cq).len();
    assert_eq!(
        (got(&mut p, &b1), got(&mut p, &b2), got(&mut p, &b3)),
        (1, 1, 0)
    );
    let mut m = vec![0u8; 100];
    b2.mr.read(40, &mut m).unwrap();
    assert_eq!(m, pattern(100, 5));
    // Detached: b1 hears nothing more, b2 still does.
    p.b.detach_mcast(b1.qp, group).unwrap();
    assert!(p.b.detach_mcast(b1.qp, group).is_err());
    p.a.post_send(a.qp, ud_send(2, &a.mr, 0, 100, ah, all, QKEY))
        .unwrap();
    assert!(p.drive_for(Duration::from_millis(10)));
    assert_eq!(
        (got(&mut p, &b1), got(&mut p, &b2), got(&mut p, &b3)),
        (0, 1, 0)
    );
    // A group nobody here joined: dropped, counted.
    let before = p.b.counters().0.address_drops;
    let ah2 = ah_for(&mut p.a, other);
    p.a.post_send(a.qp, ud_send(3, &a.mr, 0, 100, ah2, all, QKEY))
        .unwrap();
    assert!(p.drive_for(Duration::from_millis(10)));
    assert_eq!(got(&mut p, &b2), 0);
    assert_eq!(p.b.counters().0.address_drops, before + 1);
    // Destroying the last attached QP leaves the group.
    p.b.destroy_qp(b2.qp).unwrap();
    assert!(p.b.mcast_groups().is_empty());
}

/// An address the device's interface gains (the drop-in library's GID table follows the
/// interface): before `add_gid`, a datagram to it is not the device's (counted
/// `address_drops`, as every frame to a foreign address); after, it is received, and the new
/// entry keeps the next index without moving the others.
#[test]
fn an_address_added_to_the_device_is_served() {
    let mut p = Pair::new(1, clean());
    let a = ud_end(&mut p.a, 8192, None, None);
    let b = ud_end(&mut p.b, 8192, None, None);
    let extra: std::net::IpAddr = "10.0.0.99".parse().unwrap();
    let first = p.b.gid(0);
    let av = AddressVector {
        dgid: gid_of(extra),
        sgid_index: 0,
        hop_limit: 64,
        traffic_class: 0,
        flow_label: 0,
        dmac: Some(p.b.config().mac.0),
    };
    let ah = p.a.create_ah(a.pd, &av).unwrap();
    p.b.post_recv(b.qp, recv(1, &b.mr, 0, 40 + 100)).unwrap();
    let drops = p.b.counters().0.address_drops;
    p.a.post_send(a.qp, ud_send(1, &a.mr, 0, 100, ah, b.qp, QKEY))
        .unwrap();
    assert!(p.drive_for(Duration::from_millis(10)));
    assert!(poll(&mut p.b, b.cq).is_empty());
    assert_eq!(p.b.counters().0.address_drops, drops + 1);
    assert_eq!(p.b.add_gid(extra), Some(1));
    assert_eq!(
        p.b.add_gid(extra),
        Some(1),
        "an address already served keeps its index"
    );
    assert_eq!((p.b.gid(0), p.b.gid(1)), (first, Some(gid_of(extra))));
    p.a.post_send(a.qp, ud_send(2, &a.mr, 0, 100, ah, b.qp, QKEY))
        .unwrap();
    assert!(p.drive_for(Duration::from_millis(10)));
    let w = poll(&mut p.b, b.cq);
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].status, WcStatus::Success);
    assert_eq!(p.b.counters().0.address_drops, drops + 1);
}

/// Memory windows on UC (IBTA Vol. 1 §10.6.7.2 lets UC QPs bind them): a type 2 window bound
/// through B's UC QP takes A's WRITE into exactly its bytes of a region that grants nothing
/// itself; a WRITE past it, and one after a local invalidate, are dropped (UC has no NAK) and
/// write nothing; the bind and the invalidate complete in queue order.
#[test]
fn uc_writes_through_a_memory_window_and_not_past_it_or_after_invalidation() {
    let (mut p, a, b) = uc_pair(9, clean());
    let wmr =
        p.b.reg_mr(
            b.pd,
            1 << 16,
            AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
        )
        .unwrap();
    let mw = p.b.alloc_mw(b.pd, MwType::Type2).unwrap();
    let key = mw.next_rkey();
    let info = MwBindInfo {
        mr: Some(wmr.lkey()),
        addr: wmr.addr() + 4096,
        length: 4096,
        access: AccessFlags::REMOTE_WRITE,
        zero_based: false,
    };
    let bind = SendOp::BindMw {
        mw: mw.index(),
        kind: mw.kind(),
        rkey: key,
        info,
    };
    p.b.post_send(b.qp, SendWr::new(20, bind, SgList::new()))
        .unwrap();
    assert!(p.drive_for(Duration::from_millis(5)));
    let wb = poll(&mut p.b, b.cq);
    assert_eq!(
        wb.iter()
            .map(|w| (w.wr_id, w.opcode, w.status))
            .collect::<Vec<_>>(),
        [(20, WcOpcode::BindMw, WcStatus::Success)]
    );
    let data = pattern(3000, 9);
    a.mr.write(0, &data).unwrap();
    let write = |at: u64, rkey| SendOp::RdmaWrite {
        remote_addr: wmr.addr() + at,
        rkey,
    };
    p.a.post_send(
        a.qp,
        SendWr::new(1, write(5000, key), vec![sge(&a.mr, 0, 3000)]),
    )
    .unwrap();
    // 2 bytes past the window's end.
    p.a.post_send(
        a.qp,
        SendWr::new(2, write(8190, key), vec![sge(&a.mr, 0, 4)]),
    )
    .unwrap();
    assert!(p.drive_for(Duration::from_millis(5)));
    let mut got = vec![0u8; 3000];
    wmr.read(5000, &mut got).unwrap();
    assert_eq!(got, data, "the WRITE through the window");
    let mut edge = [0u8; 4];
    wmr.read(8190, &mut edge).unwrap();
    assert_eq!(edge, [0; 4], "a WRITE past the window wrote");
    let inv = SendOp::LocalInv { rkey: key };
    p.b.post_send(b.qp, SendWr::new(21, inv, SgList::new()))
        .unwrap();
    assert!(p.drive_for(Duration::from_millis(5)));
    assert_eq!(
        poll(&mut p.b, b.cq).last().map(|w| (w.opcode, w.status)),
        Some((WcOpcode::LocalInv, WcStatus::Success))
    );
    p.a.post_send(
        a.qp,
        SendWr::new(3, write(4096, key), vec![sge(&a.mr, 0, 16)]),
    )
    .unwrap();
    assert!(p.drive_for(Duration::from_millis(5)));
    let mut head = [0u8; 16];
    wmr.read(4096, &mut head).unwrap();
    assert_eq!(head, [0; 16], "a WRITE after the invalidation wrote");
    assert!(poll(&mut p.a, a.cq)
        .iter()
        .all(|w| w.status == WcStatus::Success));
}

// ---- XRC ---------------------------------------------------------------------------------

/// An XRC target QP on B in domain `xrcd` and an XRC initiator on A, connected with the
/// attributes (and masks) `ibv_xsrq_pingpong` gives each half; A's QP uses `pd_a`/`cq_a`.
fn xrc_connect(p: &mut Pair, pd_a: Pd, cq_a: Cq, xrcd: Xrcd) -> (QpNumber, QpNumber) {
    use QpAttrMask as M;
    let tgt = p.b.create_qp(QpInitAttr::xrc_recv(xrcd)).unwrap();
    let ini =
        p.a.create_qp(QpInitAttr::new(pd_a, cq_a, cq_a, cap(64)).with_type(QpType::XrcSend))
            .unwrap();
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: common::ALL,
        ..QpAttr::default()
    };
    let m_init = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
    p.b.modify_qp(tgt, &init, m_init).unwrap();
    p.a.modify_qp(ini, &init, m_init).unwrap();
    let rtr = |dest: QpNumber, gid: [u8; 16], mac: [u8; 6], psn: u32| QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: Mtu::M1024,
        dest_qp_num: dest.get(),
        rq_psn: psn,
        max_dest_rd_atomic: 16,
        min_rnr_timer: 12,
        ah_attr: AddressVector {
            dgid: gid,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            dmac: Some(mac),
        },
        ..QpAttr::default()
    };
    let path = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    let (ga, ma) = (p.a.gid(0).unwrap(), p.a.config().mac.0);
    let (gb, mb) = (p.b.gid(0).unwrap(), p.b.config().mac.0);
    // The target is a responder: its RTR takes the responder's resources and RNR timer; the
    // initiator's refuses them (it has no responder).
    p.b.modify_qp(
        tgt,
        &rtr(ini, ga, ma, 300),
        path | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
    )
    .unwrap();
    assert!(p
        .a
        .modify_qp(ini, &rtr(tgt, gb, mb, 0), path | M::MIN_RNR_TIMER)
        .is_err());
    p.a.modify_qp(ini, &rtr(tgt, gb, mb, 0), path).unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 300,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 16,
        ..QpAttr::default()
    };
    // The target's RTS takes only the timeout and a send PSN; the initiator's the requester's.
    assert!(p
        .b
        .modify_qp(tgt, &rts, M::STATE | M::TIMEOUT | M::SQ_PSN | M::RETRY_CNT)
        .is_err());
    p.b.modify_qp(tgt, &rts, M::STATE | M::TIMEOUT | M::SQ_PSN)
        .unwrap();
    p.a.modify_qp(
        ini,
        &rts,
        M::STATE | M::TIMEOUT | M::SQ_PSN | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
    (ini, tgt)
}

#[test]
fn xrc_sends_land_in_the_srq_they_name_and_rdma_uses_its_pd() {
    let mut p = Pair::new(7, clean());
    p.trace = Some(Vec::new());
    let pd_a = p.a.alloc_pd().unwrap();
    let cq_a = p.a.create_cq(256).unwrap();
    let mr_a = p.a.reg_mr(pd_a, 16384, common::ALL).unwrap();
    let xrcd = p.b.alloc_xrcd().unwrap();
    let pd_b = p.b.alloc_pd().unwrap();
    let (cq1, cq2) = (p.b.create_cq(64).unwrap(), p.b.create_cq(64).unwrap());
    let attr = SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 0,
    };
    let srq1 = p.b.create_xrc_srq(pd_b, attr, xrcd, cq1).unwrap();
    let srq2 = p.b.create_xrc_srq(pd_b, attr, xrcd, cq2).unwrap();
    assert_eq!(p.b.srq_xrcd(srq1), Some(xrcd));
    let mr_b = p.b.reg_mr(pd_b, 16384, common::ALL).unwrap();
    let (ini, tgt) = xrc_connect(&mut p, pd_a, cq_a, xrcd);
    // Neither half has a receive queue, and the target no send queue.
    assert!(p.a.post_recv(ini, recv(1, &mr_a, 0, 64)).is_err());
    assert!(p.b.post_recv(tgt, recv(1, &mr_b, 0, 64)).is_err());
    assert!(p
        .b
        .post_send(tgt, SendWr::new(1, SendOp::Send, vec![sge(&mr_b, 0, 8)]))
        .is_err());
    p.b.post_srq_recv(srq1, recv(11, &mr_b, 0, 4096)).unwrap();
    p.b.post_srq_recv(srq2, recv(22, &mr_b, 4096, 4096))
        .unwrap();
    let data = pattern(3000, 9);
    mr_a.write(0, &data).unwrap();
    mr_a.write(8192, &pattern(100, 4)).unwrap();
    // A three-packet SEND to SRQ 2, then a SEND to SRQ 1: each lands in its own SRQ's WQE and
    // completes on that SRQ's CQ, named by the target QP and the initiator.
    let send = |id, off, len, srqn: Srq| {
        SendWr::new(id, SendOp::Send, vec![sge(&mr_a, off, len)]).with_xrc_srqn(srqn.number())
    };
    p.a.post_send(ini, send(1, 0, 3000, srq2)).unwrap();
    p.a.post_send(ini, send(2, 8192, 100, srq1)).unwrap();
    // A WRITE and a READ of B's region (its PD is the SRQ's), a FETCH_ADD.
    let (rkey, va) = (mr_b.rkey(), mr_b.addr());
    let mut w = SendWr::new(
        3,
        SendOp::RdmaWrite {
            remote_addr: va + 10000,
            rkey,
        },
        vec![sge(&mr_a, 0, 2000)],
    )
    .with_xrc_srqn(srq1.number());
    w.flags |= SendFlags::SIGNALED;
    p.a.post_send(ini, w).unwrap();
    let r = SendWr::new(
        4,
        SendOp::RdmaRead {
            remote_addr: va + 10000,
            rkey,
        },
        vec![sge(&mr_a, 12000, 2000)],
    )
    .with_xrc_srqn(srq1.number());
    p.a.post_send(ini, r).unwrap();
    mr_b.write(15000, &5u64.to_ne_bytes()).unwrap();
    let fa = SendWr::new(
        5,
        SendOp::AtomicFetchAdd {
            remote_addr: va + 15000,
            rkey,
            add: 7,
        },
        vec![sge(&mr_a, 15000, 8)],
    )
    .with_xrc_srqn(srq2.number());
    p.a.post_send(ini, fa).unwrap();
    // (RC's timers keep ticking: driven for a while, not to idleness.)
    p.drive_for(Duration::from_millis(20));
    let wa = poll(&mut p.a, cq_a);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (1..=5).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    let (w1, w2) = (poll(&mut p.b, cq1), poll(&mut p.b, cq2));
    assert_eq!((w1.len(), w2.len()), (1, 1), "{w1:?} {w2:?}");
    assert_eq!(
        (w2[0].wr_id, w2[0].byte_len, w2[0].opcode),
        (22, 3000, WcOpcode::Recv)
    );
    assert_eq!((w1[0].wr_id, w1[0].byte_len), (11, 100));
    for w in [w1[0], w2[0]] {
        assert_eq!(
            (w.status, w.qp_num, w.src_qp),
            (WcStatus::Success, tgt, ini)
        );
    }
    let mut got = vec![0u8; 3000];
    mr_b.read(4096, &mut got).unwrap();
    assert_eq!(got, data);
    let mut got = vec![0u8; 2000];
    mr_b.read(10000, &mut got).unwrap();
    assert_eq!(got, data[..2000]);
    mr_a.read(12000, &mut got).unwrap();
    assert_eq!(got, data[..2000]);
    let mut orig = [0u8; 8];
    mr_a.read(15000, &mut orig).unwrap();
    mr_b.read(15000, &mut got[..8]).unwrap();
    assert_eq!(
        (u64::from_ne_bytes(orig), &got[..8]),
        (5, &12u64.to_ne_bytes()[..])
    );
    // On the wire: XRC opcodes both ways; every request carries the XRCETH of its WR's SRQ,
    // no response does.
    let trace = common::decoded_trace(&p);
    let mut reqs = Vec::new();
    for (_, from_a, r, _) in &trace {
        assert_eq!(r.bth.opcode.transport(), wire::Transport::Xrc, "{r:?}");
        assert_eq!(*from_a, r.ext.xrceth.is_some(), "{r:?}");
        if *from_a {
            reqs.push((r.bth.opcode.name(), r.ext.xrceth.unwrap()));
        }
    }
    let (s1, s2) = (srq1.number(), srq2.number());
    assert_eq!(
        reqs,
        [
            ("XRC_SEND_FIRST", s2),
            ("XRC_SEND_MIDDLE", s2),
            ("XRC_SEND_LAST", s2),
            ("XRC_SEND_ONLY", s1),
            ("XRC_RDMA_WRITE_FIRST", s1),
            ("XRC_RDMA_WRITE_LAST", s1),
            ("XRC_RDMA_READ_REQUEST", s1),
            ("XRC_FETCH_ADD", s2),
        ]
    );
    assert!(trace
        .iter()
        .any(|(_, a, r, _)| !*a && r.bth.opcode.name() == "XRC_ACKNOWLEDGE"));
    // A SEND to each SRQ, left unpolled at B.
    p.b.post_srq_recv(srq1, recv(12, &mr_b, 0, 64)).unwrap();
    p.b.post_srq_recv(srq2, recv(23, &mr_b, 64, 64)).unwrap();
    p.a.post_send(ini, send(6, 0, 10, srq1)).unwrap();
    p.a.post_send(ini, send(7, 0, 20, srq2)).unwrap();
    p.drive_for(Duration::from_millis(20));
    let wa = poll(&mut p.a, cq_a);
    assert_eq!(wa.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [6, 7]);
    // The domain stays while its SRQs and target QPs do; an XRC SRQ's CQ while the SRQ does;
    // the SRQs' PD while they do (the target has no PD, nor CQ).
    assert!(matches!(p.b.dealloc_xrcd(xrcd), Err(VerbsError::Busy(_))));
    assert!(matches!(p.b.destroy_cq(cq1), Err(VerbsError::Busy(_))));
    assert!(matches!(p.b.dealloc_pd(pd_b), Err(VerbsError::Busy(_))));
    p.b.destroy_qp(tgt).unwrap();
    // What the target received stays in its XRC SRQs' CQs, both of them, not only the last
    // message's (their WQEs were spent; mlx5 cleans no CQ for an XRC target either).
    let (w1, w2) = (poll(&mut p.b, cq1), poll(&mut p.b, cq2));
    assert_eq!(
        (
            w1.iter()
                .map(|w| (w.wr_id, w.byte_len, w.qp_num))
                .collect::<Vec<_>>(),
            w2.iter()
                .map(|w| (w.wr_id, w.byte_len, w.qp_num))
                .collect::<Vec<_>>()
        ),
        (vec![(12, 10, tgt)], vec![(23, 20, tgt)])
    );
    assert!(matches!(p.b.dealloc_xrcd(xrcd), Err(VerbsError::Busy(_))));
    p.b.destroy_srq(srq1).unwrap();
    p.b.destroy_srq(srq2).unwrap();
    p.b.destroy_cq(cq1).unwrap();
    p.b.dealloc_xrcd(xrcd).unwrap();
    assert_eq!(p.b.dealloc_xrcd(xrcd), Err(VerbsError::NoSuchXrcd));
}

#[test]
fn an_xrc_request_for_an_srq_outside_the_targets_domain_is_an_invalid_request() {
    // Three wrong SRQs: one of another XRC domain, an ordinary SRQ, a number with no SRQ.
    for case in 0..3 {
        let mut p = Pair::new(8, clean());
        let pd_a = p.a.alloc_pd().unwrap();
        let cq_a = p.a.create_cq(64).unwrap();
        let mr_a = p.a.reg_mr(pd_a, 4096, common::ALL).unwrap();
        let (xrcd, other) = (p.b.alloc_xrcd().unwrap(), p.b.alloc_xrcd().unwrap());
        let pd_b = p.b.alloc_pd().unwrap();
        let cq_b = p.b.create_cq(64).unwrap();
        let attr = SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        };
        let good = p.b.create_xrc_srq(pd_b, attr, xrcd, cq_b).unwrap();
        let wrong = match case {
            0 => {
                p.b.create_xrc_srq(pd_b, attr, other, cq_b)
                    .unwrap()
                    .number()
            }
            1 => p.b.create_srq(pd_b, attr).unwrap().number(),
            _ => 0x00_1234,
        };
        let mr_b = p.b.reg_mr(pd_b, 4096, common::ALL).unwrap();
        p.b.post_srq_recv(good, recv(1, &mr_b, 0, 64)).unwrap();
        let (ini, tgt) = xrc_connect(&mut p, pd_a, cq_a, xrcd);
        let wr = SendWr::new(7, SendOp::Send, vec![sge(&mr_a, 0, 16)]).with_xrc_srqn(wrong);
        p.a.post_send(ini, wr).unwrap();
        p.drive_for(Duration::from_millis(20));
        let wa = poll(&mut p.a, cq_a);
        assert_eq!(wa[0].status, WcStatus::RemInvReqErr, "case {case}: {wa:?}");
        assert_eq!(p.b.query_qp(tgt).unwrap().0, QpState::Err, "case {case}");
        // Nothing was taken from the good SRQ, nothing completed on B.
        assert_eq!(p.b.srq_occupancy(good), Some((1, 0)), "case {case}");
        assert!(poll(&mut p.b, cq_b).is_empty(), "case {case}");
    }
}

/// Forged XRC requests from the initiator's address, with a valid ICRC, reach the target QP
/// of domain X: SENDs, WRITEs, READs and atomics of every kind, PSNs around the expected one,
/// an XRCETH naming X's SRQ, domain Y's SRQ, an ordinary SRQ or any number, keys and addresses
/// of Y's region (whose PD is only Y's SRQ's) or anything. Whatever the target does with them
/// (execute within X's SRQ's PD, NAK, enter the error state), nothing reaches Y: no WQE taken
/// from Y's SRQ, no completion on Y's CQ, not a byte of Y's region or of its receive buffers
/// changed. (The domain is the isolation XRC gives between the applications sharing a node.)
#[test]
fn forged_xrc_requests_never_reach_another_domain() {
    use ferroce::rng::SplitMix64;
    use ferroce::wire::{AtomicEthRepr, BthRepr, ExtRepr, Psn, RKey, RethRepr, RoceRepr};
    for seed in 0..8u64 {
        let mut p = Pair::new(40 + seed, clean());
        let pd_a = p.a.alloc_pd().unwrap();
        let cq_a = p.a.create_cq(256).unwrap();
        let attr = SrqAttr {
            max_wr: 64,
            max_sge: 1,
            srq_limit: 0,
        };
        let (x, y) = (p.b.alloc_xrcd().unwrap(), p.b.alloc_xrcd().unwrap());
        let (pd_x, pd_y) = (p.b.alloc_pd().unwrap(), p.b.alloc_pd().unwrap());
        let (cq_x, cq_y) = (p.b.create_cq(256).unwrap(), p.b.create_cq(256).unwrap());
        let srq_x = p.b.create_xrc_srq(pd_x, attr, x, cq_x).unwrap();
        let srq_y = p.b.create_xrc_srq(pd_y, attr, y, cq_y).unwrap();
        let plain = p.b.create_srq(pd_y, attr).unwrap();
        let mr_x = p.b.reg_mr(pd_x, 8192, common::ALL).unwrap();
        let mr_y = p.b.reg_mr(pd_y, 8192, common::ALL).unwrap();
        let fill = pattern(8192, seed);
        mr_y.write(0, &fill).unwrap();
        for i in 0..32 {
            p.b.post_srq_recv(srq_x, recv(i, &mr_x, 0, 4096)).unwrap();
            p.b.post_srq_recv(srq_y, recv(i, &mr_y, 0, 4096)).unwrap();
            p.b.post_srq_recv(plain, recv(i, &mr_y, 4096, 4096))
                .unwrap();
        }
        let (_ini, tgt) = xrc_connect(&mut p, pd_a, cq_a, x);
        let mut rng = SplitMix64::new(seed);
        let mut next_psn = 300u32; // the target's rq_psn (xrc_connect)
        for _ in 0..600 {
            let r = rng.next_u64();
            let op = [
                0x00u8, 0x01, 0x02, 0x04, 0x05, 0x06, 0x08, 0x0a, 0x0b, 0x0c, 0x13, 0x14, 0x17,
            ][(r % 13) as usize];
            let srqn = match (r >> 8) % 5 {
                0 => srq_x.number(),
                1 | 2 => srq_y.number(),
                3 => plain.number(),
                _ => (r >> 32) as u32 & 0xff_ffff,
            };
            let (va, rkey) = match (r >> 12) % 3 {
                0 => (mr_y.addr() + (r >> 40) % 8192, mr_y.rkey()),
                1 => (mr_x.addr() + (r >> 40) % 8192, mr_x.rkey()),
                _ => (r >> 20, RKey((r >> 3) as u32)),
            };
            let psn = match (r >> 16) % 4 {
                0 | 1 => next_psn,
                2 => next_psn.wrapping_add((r >> 24) as u32 % 8).wrapping_sub(4),
                _ => (r >> 28) as u32,
            } & 0xff_ffff;
            let mut bth = BthRepr::new(Opcode(0xA0 | op), tgt, Psn::new(psn));
            bth.ack_req = true;
            let mut ext = ExtRepr {
                xrceth: Some(srqn),
                ..ExtRepr::default()
            };
            let h = bth.opcode.headers();
            let len = (r >> 50) as usize % 1100;
            if h.contains(wire::Headers::RETH) {
                ext.reth = Some(RethRepr {
                    va,
                    rkey,
                    dma_len: len as u32,
                });
            }
            if h.contains(wire::Headers::ATOMIC_ETH) {
                ext.atomic_eth = Some(AtomicEthRepr {
                    va: va & !7,
                    rkey,
                    swap_add: r,
                    compare: r >> 1,
                });
            }
            if h.contains(wire::Headers::IMM_DT) {
                ext.imm = Some(r as u32);
            }
            if h.contains(wire::Headers::IETH) {
                ext.ieth = Some(mr_y.rkey());
            }
            let payload = if bth.opcode.is(wire::OpFlags::PAYLOAD) {
                vec![0xEE; len.min(1024)]
            } else {
                Vec::new()
            };
            let roce = RoceRepr::new(bth, ext, payload.len());
            let mut probe = vec![0u8; roce.buffer_len()];
            if roce.emit(&mut probe, &payload).is_err() {
                continue; // a combination the wire layer refuses to emit: not a packet
            }
            let buf = common::frame_between(&p.a, &p.b, roce, &payload);
            p.b.handle_frame(p.now, &buf);
            if psn == next_psn {
                next_psn = (next_psn + 1) & 0xff_ffff;
            }
            p.drive_for(Duration::from_micros(50));
        }
        p.drive_for(Duration::from_millis(5));
        let mut got = vec![0u8; 8192];
        mr_y.read(0, &mut got).unwrap();
        assert!(got == fill, "seed {seed}: domain Y's region changed");
        assert_eq!(
            p.b.srq_occupancy(srq_y).map(|o| o.1),
            Some(0),
            "seed {seed}"
        );
        assert_eq!(
            p.b.srq_occupancy(plain).map(|o| o.1),
            Some(0),
            "seed {seed}"
        );
        assert!(poll(&mut p.b, cq_y).is_empty(), "seed {seed}");
        // The target did take some of them (the test reaches past the XRC checks).
        let took = p.b.srq_occupancy(srq_x).map_or(0, |o| o.1);
        let st = p.b.query_qp(tgt).unwrap().0;
        assert!(took > 0 || st == QpState::Err, "seed {seed}: {took} {st:?}");
    }
}
