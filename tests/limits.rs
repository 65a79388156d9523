//! Device limits (issue 17, "Limits"): each limit `query_device` reports is enforced with a
//! typed error exactly at its boundary (the last object or size allowed works, the next is
//! refused), and freeing an object makes room again. Devices with small limits configured, so
//! that every boundary is reached quickly; the defaults are checked against what
//! `query_device` reports.

mod common;

use common::{poll, qp_cap, ALL};
use ferroce::sim::{LinkConfig, Pair};
use ferroce::time::Duration;
use ferroce::verbs::*;
use ferroce::wire::MacAddr;

fn small(tweak: impl Fn(&mut DeviceConfig)) -> Device {
    let mut c =
        DeviceConfig::new(MacAddr([2, 0, 0, 0, 0, 1]), "10.0.0.1".parse().unwrap()).with_seed(7);
    tweak(&mut c);
    Device::new(c)
}

#[test]
fn query_device_reports_the_limits_the_device_was_made_with() {
    let d = small(|_| {});
    let l = d.query_device();
    let c = d.config();
    assert_eq!(
        (l.max_qp, l.max_qp_wr, l.max_sge, l.max_cq, l.max_cqe),
        (c.max_qp, c.max_qp_wr, c.max_sge, c.max_cq, c.max_cqe)
    );
    assert_eq!(
        (l.max_mr, l.max_mr_size, l.max_pd, l.max_srq, l.max_ah),
        (c.max_mr, c.max_mr_size, c.max_pd, c.max_srq, c.max_ah)
    );
    assert_eq!(l.max_qp_rd_atom, u32::from(c.max_qp_rd_atom));
    assert_eq!(l.max_qp_init_rd_atom, u32::from(c.max_qp_rd_atom));
    assert_eq!(l.max_srq_wr, c.max_qp_wr);
    assert_eq!(l.max_msg_sz, 1 << 31, "IBTA: messages up to 2^31 bytes");
    assert_eq!(l.max_pkeys, 1);
    // Another configuration, other figures: nothing is a constant of query_device.
    let d = small(|c| {
        c.max_qp = 3;
        c.max_cq = 2;
        c.max_qp_rd_atom = 4;
    });
    let l = d.query_device();
    assert_eq!((l.max_qp, l.max_cq, l.max_qp_rd_atom), (3, 2, 4));
    assert_eq!(l.max_res_rd_atom, 12);
}

#[test]
fn protection_domains_up_to_max_pd_and_busy_while_in_use() {
    let mut d = small(|c| c.max_pd = 2);
    let a = d.alloc_pd().unwrap();
    let b = d.alloc_pd().unwrap();
    assert_ne!(a, b);
    assert!(matches!(
        d.alloc_pd(),
        Err(VerbsError::NoResources("max_pd"))
    ));
    let mr = d.reg_mr(a, 64, ALL).unwrap();
    let cq = d.create_cq(4).unwrap();
    let qp = d
        .create_qp(QpInitAttr::new(b, cq, cq, qp_cap(4, 1, 0)))
        .unwrap();
    assert!(matches!(d.dealloc_pd(a), Err(VerbsError::Busy(_))));
    assert!(matches!(d.dealloc_pd(b), Err(VerbsError::Busy(_))));
    d.dereg_mr(&mr).unwrap();
    d.destroy_qp(qp).unwrap();
    d.dealloc_pd(a).unwrap();
    assert!(matches!(d.dealloc_pd(a), Err(VerbsError::NoSuchPd)));
    // Room for one again; the freed PD's objects cannot be made on it.
    let c = d.alloc_pd().unwrap();
    assert!(matches!(d.reg_mr(a, 64, ALL), Err(VerbsError::NoSuchPd)));
    d.reg_mr(c, 64, ALL).unwrap();
}

#[test]
fn memory_regions_up_to_max_mr_and_max_mr_size() {
    let mut d = small(|c| {
        c.max_mr = 2;
        c.max_mr_size = 4096;
    });
    let pd = d.alloc_pd().unwrap();
    let a = d.reg_mr(pd, 4096, ALL).unwrap();
    assert!(matches!(
        d.reg_mr(pd, 4097, ALL),
        Err(VerbsError::BadCap(_))
    ));
    let _b = d.reg_mr(pd, 1, ALL).unwrap();
    assert!(matches!(
        d.reg_mr(pd, 64, ALL),
        Err(VerbsError::NoResources("max_mr"))
    ));
    d.dereg_mr(&a).unwrap();
    d.reg_mr(pd, 64, ALL).unwrap();
}

#[test]
fn a_region_the_allocator_cannot_serve_is_an_error_not_an_abort() {
    // 2^46 bytes (64 TiB) is within the default max_mr_size (2^47): the allocator decides.
    // Under the kernel's overcommit heuristics it refuses, and so must reg_mr; with
    // overcommit always on, the lazily zeroed region may exist. Either way the process lives.
    let mut d = small(|_| {});
    let pd = d.alloc_pd().unwrap();
    match d.reg_mr(pd, 1 << 46, ALL) {
        Ok(mr) => d.dereg_mr(&mr).unwrap(),
        Err(e) => assert!(matches!(e, VerbsError::NoResources(_)), "{e}"),
    }
    let too_long = d.query_device().max_mr_size + 1;
    assert!(matches!(
        d.reg_mr(pd, too_long as usize, ALL),
        Err(VerbsError::BadCap(_))
    ));
}

#[test]
fn completion_queues_up_to_max_cq_and_max_cqe_numbers_reused() {
    let mut d = small(|c| {
        c.max_cq = 2;
        c.max_cqe = 16;
    });
    assert!(matches!(d.create_cq(0), Err(VerbsError::BadCap(_))));
    assert!(matches!(d.create_cq(17), Err(VerbsError::BadCap(_))));
    let a = d.create_cq(16).unwrap();
    let b = d.create_cq(1).unwrap();
    assert!(matches!(
        d.create_cq(1),
        Err(VerbsError::NoResources("max_cq"))
    ));
    let pd = d.alloc_pd().unwrap();
    let qp = d
        .create_qp(QpInitAttr::new(pd, a, b, qp_cap(4, 1, 0)))
        .unwrap();
    assert!(matches!(d.destroy_cq(a), Err(VerbsError::Busy(_))));
    assert!(matches!(d.destroy_cq(b), Err(VerbsError::Busy(_))));
    d.destroy_qp(qp).unwrap();
    d.destroy_cq(a).unwrap();
    assert!(matches!(d.destroy_cq(a), Err(VerbsError::NoSuchCq)));
    // The freed number is used again, with the new depth.
    let c = d.create_cq(8).unwrap();
    assert_eq!(c, a);
    assert!(matches!(
        d.create_cq(1),
        Err(VerbsError::NoResources("max_cq"))
    ));
}

#[test]
fn queue_pairs_up_to_max_qp_and_their_capabilities_up_to_the_device_limits() {
    let mut d = small(|c| {
        c.max_qp = 3;
        c.max_qp_wr = 8;
        c.max_sge = 2;
        c.max_inline = 64;
    });
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(64).unwrap();
    let init = |c: QpCap| QpInitAttr::new(pd, cq, cq, c);
    for bad in [qp_cap(9, 1, 0), qp_cap(8, 3, 0), qp_cap(8, 2, 65)] {
        assert!(
            matches!(d.create_qp(init(bad)), Err(VerbsError::BadCap(_))),
            "{bad:?}"
        );
    }
    let q1 = d.create_qp(init(qp_cap(8, 2, 64))).unwrap();
    d.create_qp(init(qp_cap(1, 1, 0))).unwrap();
    d.create_qp(init(qp_cap(1, 1, 0)).with_type(QpType::Ud))
        .unwrap();
    assert!(matches!(
        d.create_qp(init(qp_cap(1, 1, 0))),
        Err(VerbsError::NoResources("max_qp"))
    ));
    d.destroy_qp(q1).unwrap();
    d.create_qp(init(qp_cap(1, 1, 0)).with_type(QpType::Uc))
        .unwrap();
}

#[test]
fn srqs_and_address_handles_up_to_their_limits() {
    let mut d = small(|c| {
        c.max_srq = 1;
        c.max_ah = 2;
        c.max_qp_wr = 8;
        c.max_sge = 2;
    });
    let pd = d.alloc_pd().unwrap();
    let attr = |wr, sge| SrqAttr {
        max_wr: wr,
        max_sge: sge,
        srq_limit: 0,
    };
    assert!(matches!(
        d.create_srq(pd, attr(9, 1)),
        Err(VerbsError::BadCap(_))
    ));
    assert!(matches!(
        d.create_srq(pd, attr(8, 3)),
        Err(VerbsError::BadCap(_))
    ));
    let s = d.create_srq(pd, attr(8, 2)).unwrap();
    assert!(matches!(
        d.create_srq(pd, attr(1, 1)),
        Err(VerbsError::NoResources("max_srq"))
    ));
    d.destroy_srq(s).unwrap();
    d.create_srq(pd, attr(1, 1)).unwrap();

    let av = |i: u8| AddressVector {
        dgid: gid_of(format!("10.0.0.{i}").parse().unwrap()),
        dmac: Some([2, 0, 0, 0, 0, i]),
        ..AddressVector::default()
    };
    let a = d.create_ah(pd, &av(2)).unwrap();
    d.create_ah(pd, &av(3)).unwrap();
    assert!(matches!(
        d.create_ah(pd, &av(4)),
        Err(VerbsError::NoResources("max_ah"))
    ));
    d.destroy_ah(a).unwrap();
    d.create_ah(pd, &av(4)).unwrap();
}

#[test]
fn read_and_atomic_depths_up_to_max_qp_rd_atom() {
    for (rd, dest) in [(5u8, 4u8), (4, 5)] {
        let mut p = Pair::configured(3, LinkConfig::new(), ferroce::sim::Family::V4, |c| {
            c.max_qp_rd_atom = 4
        });
        let a = common::end(&mut p.a, 64);
        let b = common::end(&mut p.b, 64);
        let params = RcParams {
            max_rd_atomic: rd,
            max_dest_rd_atomic: dest,
            ..RcParams::default()
        };
        let e = p.connect(a.qp, b.qp, &params, 1, 2).unwrap_err();
        assert!(
            matches!(
                e,
                VerbsError::Modify(ModifyQpError::InvalidValue { value: 5, .. })
            ),
            "{e}"
        );
    }
    // The boundary itself works: 4 READs outstanding at once, all answered.
    let mut p = Pair::configured(3, LinkConfig::new(), ferroce::sim::Family::V4, |c| {
        c.max_qp_rd_atom = 4
    });
    let a = common::end(&mut p.a, 64);
    let b = common::end(&mut p.b, 64);
    let params = RcParams {
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        ..RcParams::default()
    };
    p.connect(a.qp, b.qp, &params, 1, 2).unwrap();
    b.mr.write(0, &[7u8; 64]).unwrap();
    for i in 0..4u64 {
        let wr = SendWr::new(
            i,
            SendOp::RdmaRead {
                remote_addr: b.mr.addr() + i * 16,
                rkey: b.mr.rkey(),
            },
            vec![common::sge(&a.mr, i as usize * 16, 16)],
        )
        .with_flags(SendFlags::SIGNALED);
        p.a.post_send(a.qp, wr).unwrap();
    }
    p.drive_for(Duration::from_millis(50));
    let wcs = poll(&mut p.a, a.cq);
    assert_eq!(wcs.len(), 4);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let mut got = [0u8; 64];
    a.mr.read(0, &mut got).unwrap();
    assert_eq!(got, [7u8; 64]);
}

#[test]
fn work_requests_up_to_the_queue_sge_inline_and_message_limits() {
    let mut p = Pair::new(5, LinkConfig::new());
    let pd = p.a.alloc_pd().unwrap();
    let cq = p.a.create_cq(64).unwrap();
    let qa =
        p.a.create_qp(QpInitAttr::new(pd, cq, cq, qp_cap(4, 2, 16)))
            .unwrap();
    let mr = p.a.reg_mr(pd, 64, ALL).unwrap();
    let b = common::end(&mut p.b, 64);
    p.connect(qa, b.qp, &RcParams::default(), 1, 2).unwrap();
    let write = |sg: Vec<Sge>, flags: SendFlags| {
        SendWr::new(
            0,
            SendOp::RdmaWrite {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey(),
            },
            sg,
        )
        .with_flags(flags)
    };
    let s = |len: u32| Sge {
        addr: mr.addr(),
        length: len,
        lkey: mr.lkey(),
    };
    // Scatter/gather entries: the QP's max_send_sge (2) and no more.
    assert!(matches!(
        p.a.post_send(qa, write(vec![s(1), s(1), s(1)], SendFlags::empty())),
        Err(VerbsError::TooManySge(3))
    ));
    // Inline: 16 bytes asked, 32 granted (the room of max_send_sge 2 entries, as rxe grants
    // it), and no more.
    let granted = p.a.query_qp(qa).unwrap().1.cap.max_inline_data;
    assert_eq!(granted, 32);
    assert!(matches!(
        p.a.post_send(qa, write(vec![s(33)], SendFlags::INLINE)),
        Err(VerbsError::InlineTooLarge(33))
    ));
    // A message of 2^31 + 1 bytes is refused at once; 2^31 is a valid length (the request
    // then fails on its local key range, as a completion).
    assert!(matches!(
        p.a.post_send(qa, write(vec![s(1 << 31), s(1)], SendFlags::empty())),
        Err(VerbsError::MessageTooLong(_))
    ));
    // Queue: max_send_wr (4) outstanding, the fifth refused until one completes.
    p.a.post_send(qa, write(vec![s(1 << 31)], SendFlags::SIGNALED))
        .unwrap();
    for _ in 0..2 {
        p.a.post_send(qa, write(vec![s(16), s(16)], SendFlags::SIGNALED))
            .unwrap();
    }
    p.a.post_send(
        qa,
        write(vec![s(16)], SendFlags::INLINE | SendFlags::SIGNALED),
    )
    .unwrap();
    assert!(matches!(
        p.a.post_send(qa, write(vec![s(8)], SendFlags::SIGNALED)),
        Err(VerbsError::QueueFull)
    ));
    p.drive_for(Duration::from_millis(50));
    // The 2^31-byte WRITE fails on its key range, the QP goes to the error state and the
    // three behind it are flushed: four completions for four requests.
    let wcs = poll(&mut p.a, cq);
    assert_eq!(wcs.len(), 4, "{wcs:?}");
    assert_eq!(wcs[0].status, WcStatus::LocProtErr, "{wcs:?}");
    assert!(
        wcs[1..].iter().all(|w| w.status == WcStatus::WrFlushErr),
        "{wcs:?}"
    );
}

/// Over the runtime (engine thread, in-memory loopback): a destroyed CQ's number goes to the
/// next CQ made, which starts empty and receives its QP's completions; a CQ a QP completes
/// into cannot be destroyed.
#[test]
fn a_nic_reuses_a_destroyed_cq_and_the_new_one_works() {
    use ferroce::io::Loopback;
    use ferroce::runtime::{Nic, NicOptions, PollMode};
    let (la, lb) = Loopback::pair(4096, 9000).unwrap();
    let nic = |i: u8, dev| {
        let cfg = DeviceConfig::new(
            MacAddr([2, 0, 0, 0, 0, i]),
            format!("10.9.1.{i}").parse().unwrap(),
        );
        let opts = NicOptions {
            poll: PollMode::Adaptive {
                spins: 100,
                max_sleep: std::time::Duration::from_millis(1),
            },
            batch: 64,
        };
        Nic::start(cfg, dev, opts).unwrap()
    };
    let (a, b) = (nic(1, la), nic(2, lb));
    let old = a.create_cq(4).unwrap();
    a.destroy_cq(old).unwrap();
    let (x, y) = common::nic_rc_pair(&a, &b, common::cap(), 64, 4096, Mtu::M1024);
    assert_eq!(x.cq, old, "the freed CQ number is used again");
    assert!(matches!(a.destroy_cq(x.cq), Err(VerbsError::Busy(_))));
    x.mr.write(0, b"limits").unwrap();
    let wr = SendWr::new(
        9,
        SendOp::RdmaWrite {
            remote_addr: y.mr.addr(),
            rkey: y.mr.rkey(),
        },
        vec![common::sge(&x.mr, 0, 6)],
    )
    .with_flags(SendFlags::SIGNALED);
    a.post_send(x.qp, wr).unwrap();
    let mut wcs = Vec::new();
    let t0 = std::time::Instant::now();
    while wcs.is_empty() && t0.elapsed() < std::time::Duration::from_secs(10) {
        a.wait_cq(x.cq, std::time::Duration::from_millis(100))
            .unwrap();
        a.poll_cq(x.cq, &mut wcs, 8).unwrap();
    }
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!((wcs[0].wr_id, wcs[0].status), (9, WcStatus::Success));
    let mut got = [0u8; 6];
    y.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"limits");
    a.destroy_qp(x.qp).unwrap();
    a.destroy_cq(x.cq).unwrap();
}

/// A device with a block of QPNs (what a program sharing its address and port gets,
/// `ferroce::io::share`): every QPN in the block, `query_device` reports the block's room as
/// `max_qp`, the next QP past it is refused, and a destroyed QP's number is handed out again.
#[test]
fn a_block_of_qpns_numbers_every_qp_and_bounds_max_qp() {
    let mut d = small(|c| {
        c.qpn_block = Some(0xa5);
        c.max_qp_wr = 1;
        c.max_sge = 1;
    });
    assert_eq!(
        d.query_device().max_qp,
        ferroce::verbs::limits::QPN_BLOCK_QPS
    );
    assert_eq!(ferroce::verbs::limits::QPN_BLOCK_QPS, 0xffff - 0x10);
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(4).unwrap();
    let init = || QpInitAttr::new(pd, cq, cq, qp_cap(1, 1, 0)).with_type(QpType::Ud);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..ferroce::verbs::limits::QPN_BLOCK_QPS {
        let q = d.create_qp(init()).unwrap().get();
        assert!((0xa5_0011..=0xa5_ffff).contains(&q), "{q:#x}");
        assert!(seen.insert(q));
    }
    assert!(matches!(
        d.create_qp(init()),
        Err(VerbsError::NoResources(_))
    ));
    d.destroy_qp(ferroce::wire::QpNumber::new(0xa5_1234))
        .unwrap();
    assert_eq!(d.create_qp(init()).unwrap().get(), 0xa5_1234);
    // Without a block: the first QPN as ever, and the whole 24-bit space's room.
    let mut e = small(|_| {});
    assert_eq!(e.query_device().max_qp, e.config().max_qp);
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(4).unwrap();
    let q = e
        .create_qp(QpInitAttr::new(pd, cq, cq, qp_cap(1, 1, 0)))
        .unwrap();
    assert_eq!(q.get(), 0x11);
}
