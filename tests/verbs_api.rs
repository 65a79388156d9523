//! Verbs behaviour at the API: limits, SQD, modify errors, keys, deregistration.

mod common;
use common::*;
use ferroce::sim::Pair;
use ferroce::time::Duration;
use ferroce::verbs::ModifyQpError;
use ferroce::verbs::*;

fn pair() -> (Pair, End, End) {
    let mut p = Pair::new(3, lossy(0.0));
    let a = end(&mut p.a, 1 << 20);
    let b = end(&mut p.b, 1 << 20);
    connect(&mut p, &a, &b, &RcParams::default(), 100, 200);
    (p, a, b)
}

#[test]
fn messages_longer_than_2_pow_31_are_refused() {
    let (mut p, a, _) = pair();
    let s = |len| Sge {
        addr: a.mr.addr(),
        length: len,
        lkey: a.mr.lkey(),
    };
    let wr = SendWr::new(1, SendOp::Send, vec![s(1 << 30), s(1 << 30), s(1)]);
    assert_eq!(
        p.a.post_send(a.qp, wr),
        Err(VerbsError::MessageTooLong((1 << 31) + 1))
    );
    // Exactly 2^31 is allowed (the local protection error for the SGE outside the MR comes as
    // a completion, as libibverbs reports it).
    let wr = SendWr::new(2, SendOp::Send, vec![s(1 << 30), s(1 << 30)]);
    assert_eq!(p.a.post_send(a.qp, wr), Ok(()));
    p.drive_for(Duration::from_millis(10));
    let w = poll(&mut p.a, a.cq);
    assert_eq!((w[0].wr_id, w[0].status), (2, WcStatus::LocProtErr));
}

#[test]
fn sqd_stops_new_requests_and_rts_resumes_them() {
    let (mut p, a, b) = pair();
    let wr = |i| {
        SendWr::new(
            i,
            SendOp::RdmaWrite {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey(),
            },
            vec![sge(&a.mr, 0, 5000)],
        )
    };
    p.a.post_send(a.qp, wr(1)).unwrap();
    p.drive_for(Duration::from_millis(5));
    assert_eq!(poll(&mut p.a, a.cq).len(), 1);
    p.a.modify_qp(
        a.qp,
        &QpAttr {
            qp_state: QpState::Sqd,
            ..Default::default()
        },
        QpAttrMask::STATE,
    )
    .unwrap();
    p.a.post_send(a.qp, wr(2)).unwrap();
    p.drive_for(Duration::from_millis(5));
    assert!(
        poll(&mut p.a, a.cq).is_empty(),
        "SQD: the new request must not start"
    );
    p.a.modify_qp(
        a.qp,
        &QpAttr {
            qp_state: QpState::Rts,
            ..Default::default()
        },
        QpAttrMask::STATE,
    )
    .unwrap();
    p.drive_for(Duration::from_millis(5));
    let w = poll(&mut p.a, a.cq);
    assert_eq!((w[0].wr_id, w[0].status), (2, WcStatus::Success));
}

#[test]
fn modify_errors_come_back_typed() {
    let (mut p, a, _) = pair();
    // RTS -> INIT is not a transition ibv_modify_qp allows.
    let e =
        p.a.modify_qp(
            a.qp,
            &QpAttr {
                qp_state: QpState::Init,
                ..Default::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            VerbsError::Modify(ModifyQpError::IllegalTransition { .. })
        ),
        "{e}"
    );
    // A fresh QP: RESET -> INIT without its required attributes.
    let pd = p.a.alloc_pd().unwrap();
    let cq = p.a.create_cq(16).unwrap();
    let q = p.a.create_qp(QpInitAttr::new(pd, cq, cq, cap())).unwrap();
    let e =
        p.a.modify_qp(
            q,
            &QpAttr {
                qp_state: QpState::Init,
                ..Default::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            VerbsError::Modify(ModifyQpError::MissingAttributes { .. })
        ),
        "{e}"
    );
    // post_send before RTS is refused synchronously.
    let wr = SendWr::new(1, SendOp::Send, vec![]);
    assert_eq!(
        p.a.post_send(q, wr),
        Err(VerbsError::InvalidState(QpState::Reset))
    );
}

#[test]
fn keys_are_unpredictable_and_never_sequential() {
    let mut d = Device::new(DeviceConfig::new(
        ferroce::wire::MacAddr([2, 0, 0, 0, 0, 9]),
        "10.0.0.9".parse().unwrap(),
    ));
    let pd = d.alloc_pd().unwrap();
    let mrs: Vec<_> = (0..200).map(|_| d.reg_mr(pd, 64, ALL).unwrap()).collect();
    let mut keys: Vec<u32> = mrs.iter().flat_map(|m| [m.lkey().0, m.rkey().0]).collect();
    let n = keys.len();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), n, "every key distinct");
    assert!(mrs
        .iter()
        .all(|m| m.lkey().0 != m.rkey().0 && m.rkey().0 != 0));
    // Consecutive registrations do not give consecutive (or evenly spaced) keys.
    let steps: std::collections::HashSet<i64> = mrs
        .windows(2)
        .map(|w| i64::from(w[1].rkey().0) - i64::from(w[0].rkey().0))
        .collect();
    assert!(
        steps.len() > 190,
        "rkeys look sequential: {} distinct steps",
        steps.len()
    );
    // Two devices without a seed draw different keys.
    let mut e = Device::new(DeviceConfig::new(
        ferroce::wire::MacAddr([2, 0, 0, 0, 0, 9]),
        "10.0.0.9".parse().unwrap(),
    ));
    let pd = e.alloc_pd().unwrap();
    assert_ne!(e.reg_mr(pd, 64, ALL).unwrap().rkey(), mrs[0].rkey());
}

#[test]
fn deregistered_region_refuses_remote_access() {
    let (mut p, a, b) = pair();
    p.b.dereg_mr(&b.mr).unwrap();
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        vec![sge(&a.mr, 0, 8)],
    );
    p.a.post_send(a.qp, wr).unwrap();
    p.drive_for(Duration::from_millis(10));
    let w = poll(&mut p.a, a.cq);
    assert_eq!(w[0].status, WcStatus::RemAccessErr);
    assert!(!b.mr.rkey_valid());
}

#[test]
fn a_short_transmit_buffer_is_the_callers_error_and_loses_nothing() {
    // Default RcParams: path MTU 1024 over IPv4, so a frame may take 14 + 20 + 8 + 12 + 28
    // (the largest extension headers) + 1024 + 4 = 1110 bytes.
    let (mut p, a, b) = pair();
    let wr = SendWr::new(
        7,
        SendOp::RdmaWrite {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        vec![sge(&a.mr, 0, 1024)],
    );
    p.a.post_send(a.qp, wr).unwrap();
    let now = p.now;
    let mut small = vec![0u8; 1109];
    assert_eq!(
        p.a.poll_transmit(now, &mut small),
        Err(TransmitError::BufferTooSmall {
            needed: 1110,
            had: 1109
        })
    );
    assert_eq!(p.a.max_frame_len(), 1110);
    // Nothing was taken from the QP: it is still sending, and the WRITE goes with the next
    // call that has room for it, then completes.
    assert_eq!(p.a.query_qp(a.qp).unwrap().0, QpState::Rts);
    let mut big = vec![0u8; 1110];
    let n =
        p.a.poll_transmit(now, &mut big)
            .unwrap()
            .expect("the WRITE");
    assert_eq!(n, 14 + 20 + 8 + 12 + 16 + 1024 + 4);
    p.b.handle_frame(now, &big[..n]);
    p.drive_for(Duration::from_millis(10));
    let w = poll(&mut p.a, a.cq);
    assert_eq!((w[0].wr_id, w[0].status), (7, WcStatus::Success));
    assert_eq!(p.a.qp_counters(a.qp).unwrap().retransmits, 0);
}
