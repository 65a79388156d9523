//! The runtime with real threads: two NICs over the in-memory loopback device.

mod common;
use common::{nic_rc_pair, nic_rc_pair_with, ALL};
use ferroce::io::Loopback;
use ferroce::runtime::{Nic, NicOptions, PollMode};
use ferroce::verbs::*;
use ferroce::wire::{MacAddr, QpNumber};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

fn nic(i: u8, dev: Loopback, poll: PollMode) -> Nic {
    let cfg = DeviceConfig::new(
        MacAddr([2, 0, 0, 0, 0, i]),
        IpAddr::V4(Ipv4Addr::new(10, 9, 0, i)),
    );
    Nic::start(cfg, dev, NicOptions { poll, batch: 64 }).unwrap()
}

fn run(poll: PollMode) {
    run_with(poll, None)
}

/// `wait_spin`: [`Nic::set_wait_spin`] on both NICs.
fn run_with(poll: PollMode, wait_spin: Option<Duration>) {
    let (la, lb) = Loopback::pair(4096, 9000).unwrap();
    let (a, b) = (nic(1, la, poll), nic(2, lb, poll));
    if let Some(d) = wait_spin {
        a.set_wait_spin(d);
        b.set_wait_spin(d);
    }
    let cap = common::qp_cap(256, 2, 64);
    let (x, y) = nic_rc_pair(&a, &b, cap, 1024, 1 << 20, Mtu::M4096);
    let (ca, qa, ma) = (x.cq, x.qp, x.mr);
    let (cb, qb, mb) = (y.cq, y.qp, y.mr);
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    ma.write(0, &data).unwrap();
    // 200 WRITEs of 300 KB from another thread, posted as fast as the queue allows.
    let wr = |i: u64| common::write_wr(i, &ma, &mb, 300_000);
    let mut done = 0;
    let mut wcs = Vec::new();
    let mut next = 0u64;
    let t0 = std::time::Instant::now();
    while done < 200 {
        while next < 200 {
            match a.post_send(qa, wr(next)) {
                Ok(()) => next += 1,
                Err(VerbsError::QueueFull) => break,
                Err(e) => panic!("{e}"),
            }
        }
        a.wait_cq(ca, Duration::from_secs(10)).unwrap();
        wcs.clear();
        a.poll_cq(ca, &mut wcs, 64).unwrap();
        for w in &wcs {
            assert_eq!(w.status, WcStatus::Success);
            assert_eq!(w.wr_id, done);
            done += 1;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "stuck at {done}");
    }
    let mut got = vec![0u8; 300_000];
    mb.read(0, &mut got).unwrap();
    assert!(got == data);
    // A SEND with a solicited event wakes a waiter armed for solicited completions only.
    b.req_notify_cq(cb, NotifyMode::SolicitedOnly).unwrap();
    b.post_recv(
        qb,
        RecvWr {
            wr_id: 5,
            sg_list: vec![common::sge(&mb, 0, 64)].into(),
        },
    )
    .unwrap();
    a.post_send(
        qa,
        SendWr::new(6, SendOp::Send, vec![common::sge(&ma, 0, 10)])
            .with_flags(SendFlags::SIGNALED | SendFlags::SOLICITED),
    )
    .unwrap();
    assert!(
        b.get_cq_event(cb, Duration::from_secs(10)).unwrap(),
        "solicited event fired"
    );
    let mut v = Vec::new();
    b.poll_cq(cb, &mut v, 10).unwrap();
    assert_eq!(
        (v[0].wr_id, v[0].status, v[0].byte_len, v[0].solicited),
        (5, WcStatus::Success, 10, true)
    );
    let (_, qa_tot, io) = a.counters();
    assert!(qa_tot.tx_packets >= 200 * 74);
    assert!(io.tx_frames >= 200 * 74);
    a.shutdown();
    b.shutdown();
}

#[test]
fn busy_poll() {
    run(PollMode::Busy);
}

#[test]
fn adaptive_sleep() {
    run(PollMode::Adaptive {
        spins: 100,
        max_sleep: Duration::from_micros(100),
    });
}

/// The application's threads drive the engine; B is passive until its `get_cq_event`, so the
/// background thread must take over for it (ACKs for 200 WRITEs).
#[test]
fn inline_engine() {
    run(PollMode::Inline);
}

/// The same without any busy-polling in `wait_cq` and `get_cq_event` (what a one-CPU host
/// gets): each wait sleeps in the packet device at once, and the background thread must not
/// take the engine from a thread asleep there.
#[test]
fn inline_engine_without_spinning() {
    run_with(PollMode::Inline, Some(Duration::ZERO));
}

#[test]
fn post_errors_are_synchronous() {
    let (la, _lb) = Loopback::pair(16, 9000).unwrap();
    let a = nic(1, la, PollMode::Busy);
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(16).unwrap();
    let cap = common::qp_cap(2, 1, 16);
    let q = ferroce::runtime::create_rc_qp(&a, pd, cq, cap).unwrap();
    let mr = a.reg_mr(pd, 4096, ALL).unwrap();
    let s = common::sge(&mr, 0, 8);
    // RESET: refused.
    assert!(matches!(
        a.post_send(q, SendWr::new(1, SendOp::Send, vec![s])),
        Err(VerbsError::InvalidState(QpState::Reset))
    ));
    assert!(matches!(
        a.post_recv(
            q,
            RecvWr {
                wr_id: 1,
                sg_list: vec![s].into()
            }
        ),
        Err(VerbsError::InvalidState(QpState::Reset))
    ));
    a.modify_qp(
        q,
        &QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: ALL,
            ..Default::default()
        },
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    assert!(a
        .post_recv(
            q,
            RecvWr {
                wr_id: 1,
                sg_list: vec![s].into()
            }
        )
        .is_ok());
    assert!(a
        .post_recv(
            q,
            RecvWr {
                wr_id: 2,
                sg_list: vec![s].into()
            }
        )
        .is_ok());
    assert!(matches!(
        a.post_recv(
            q,
            RecvWr {
                wr_id: 3,
                sg_list: vec![s].into()
            }
        ),
        Err(VerbsError::QueueFull)
    ));
    assert!(matches!(
        a.post_recv(
            q,
            RecvWr {
                wr_id: 3,
                sg_list: vec![s, s].into()
            }
        ),
        Err(VerbsError::TooManySge(2))
    ));
}

/// B holds the ACK of A's one WRITE (a delayed ACK far longer than the test) and then shuts
/// down: the shutdown lets the held ACK go, so A's WRITE completes successfully without a
/// single retransmission. Without the release, A would retry a request B had executed until
/// its retry count ran out (seen as `transport retry counter exceeded` at the end of a
/// write-lat test whose server exited first); here, with A's ACK timeout (code 24, ~69 s)
/// longer than the test, its WRITE would never complete. (With the default 67 ms timeout, a
/// loaded machine that delays the test thread between B's receipt and B's shutdown made A
/// retransmit, or even give up, before the release: the test failed under load.)
fn held_ack_leaves_at_shutdown(poll: PollMode) {
    held_ack_leaves(poll, false)
}

/// As [`held_ack_leaves_at_shutdown`], but B destroys its QP instead of shutting down (a
/// ping-pong whose side that received last destroys its QP before it exits: rdma-core's
/// examples do). Before, the held ACK went with the QP and A retried its WRITE (here, with
/// the ~69 s ACK timeout, it never completed within the test).
fn held_ack_leaves_when_its_qp_is_destroyed(poll: PollMode) {
    held_ack_leaves(poll, true)
}

fn held_ack_leaves(poll: PollMode, destroy_qp: bool) {
    let (la, lb) = Loopback::pair(4096, 9000).unwrap();
    let a = nic(1, la, poll);
    let mut cfg_b = DeviceConfig::new(
        MacAddr([2, 0, 0, 0, 0, 2]),
        IpAddr::V4(Ipv4Addr::new(10, 9, 0, 2)),
    );
    cfg_b.ack_delay = Some(ferroce::time::Duration::from_secs(30));
    let b = Nic::start(cfg_b, lb, NicOptions { poll, batch: 64 }).unwrap();
    let cap = common::qp_cap(16, 1, 0);
    let params = RcParams {
        mtu: Mtu::M1024,
        timeout: 24,
        ..Default::default()
    };
    let (x, y) = nic_rc_pair_with(&a, &b, cap, 16, 4096, &params);
    let (ca, qa, ma) = (x.cq, x.qp, x.mr);
    let (qb, mb) = (y.qp, y.mr);
    ma.write(0, &[0x5a; 64]).unwrap();
    a.post_send(qa, common::write_wr(1, &ma, &mb, 64)).unwrap();
    // Wait until B has executed the WRITE (its ACK is then held), then stop B.
    let t0 = std::time::Instant::now();
    let mut got = [0u8; 64];
    while got != [0x5a; 64] {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "WRITE never arrived"
        );
        std::thread::sleep(Duration::from_millis(1));
        mb.read(0, &mut got).unwrap();
    }
    assert_eq!(
        b.qp_counters(qb).map(|c| c.tx_packets),
        Some(0),
        "B sent nothing before shutting down: its ACK is held"
    );
    if destroy_qp {
        b.destroy_qp(qb).unwrap();
    } else {
        b.shutdown();
    }
    let mut wcs = Vec::new();
    while wcs.is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "A's WRITE never completed"
        );
        a.wait_cq(ca, Duration::from_millis(100)).unwrap();
        a.poll_cq(ca, &mut wcs, 4).unwrap();
    }
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    let qa_counters = a.qp_counters(qa).unwrap();
    assert_eq!(qa_counters.retransmits, 0, "{qa_counters:?}");
    a.shutdown();
}

#[test]
fn held_ack_leaves_at_shutdown_engine_thread() {
    held_ack_leaves_at_shutdown(PollMode::Busy);
}

#[test]
fn held_ack_leaves_at_shutdown_inline() {
    held_ack_leaves_at_shutdown(PollMode::Inline);
}

#[test]
fn held_ack_leaves_when_its_qp_is_destroyed_engine_thread() {
    held_ack_leaves_when_its_qp_is_destroyed(PollMode::Busy);
}

#[test]
fn held_ack_leaves_when_its_qp_is_destroyed_inline() {
    held_ack_leaves_when_its_qp_is_destroyed(PollMode::Inline);
}

/// A receive still in the doorbell when its SRQ is destroyed goes with that SRQ, never into
/// the next SRQ given the same number (inline engine: the doorbell waits for the next call
/// that drives the engine). Before: the new SRQ held the old one's receive, its shadow counted
/// more WQEs taken than posted, and `post_srq_recv` overflowed (the C entry point fuzzer).
#[test]
fn a_destroyed_srqs_pending_receive_never_reaches_its_successor() {
    let (la, _lb) = Loopback::pair(16, 9000).unwrap();
    let a = nic(1, la, PollMode::Inline);
    let pd = a.alloc_pd().unwrap();
    let mr = a.reg_mr(pd, 4096, ALL).unwrap();
    let attr = SrqAttr {
        max_wr: 4,
        max_sge: 1,
        srq_limit: 0,
    };
    let old = a.create_srq(pd, attr).unwrap();
    a.post_srq_recv(
        old,
        RecvWr {
            wr_id: 7,
            sg_list: vec![common::sge(&mr, 0, 64)].into(),
        },
    )
    .unwrap();
    a.destroy_srq(old).unwrap();
    let new = a.create_srq(pd, attr).unwrap();
    assert_eq!(
        new.number(),
        old.number(),
        "the number is reused (the case at issue)"
    );
    a.progress();
    assert_eq!(
        a.with_device(|d| d.srq_occupancy(new)),
        Some((0, 0)),
        "the new SRQ holds a receive nobody posted to it"
    );
}

/// Two RC QPs on one CQ of depth 64, with a 4 KiB region, on a device of its own.
fn two_qps_one_cq(poll: PollMode) -> (Nic, Cq, MemoryRegion, QpNumber, QpNumber) {
    let (la, _lb) = Loopback::pair(16, 9000).unwrap();
    let a = nic(1, la, poll);
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(64).unwrap();
    let mr = a.reg_mr(pd, 4096, ALL).unwrap();
    let cap = common::qp_cap(8, 1, 16);
    let x = ferroce::runtime::create_rc_qp(&a, pd, cq, cap).unwrap();
    let y = ferroce::runtime::create_rc_qp(&a, pd, cq, cap).unwrap();
    (a, cq, mr, x, y)
}

/// [`two_qps_one_cq`] with both QPs in ERR and two receives each flushed: x's 1 and y's 10
/// already handed to the queue `poll_cq` reads (none polled), x's 2 and y's 11 posted after.
fn two_qps_flushing(poll: PollMode) -> (Nic, Cq, MemoryRegion, QpNumber, QpNumber) {
    let (a, cq, mr, x, y) = two_qps_one_cq(poll);
    move_qp(&a, x, QpState::Init);
    move_qp(&a, y, QpState::Init);
    recv64(&a, &mr, x, 1);
    recv64(&a, &mr, y, 10);
    move_qp(&a, x, QpState::Err);
    move_qp(&a, y, QpState::Err);
    for _ in 0..50 {
        a.progress();
        std::thread::yield_now();
    }
    recv64(&a, &mr, x, 2);
    recv64(&a, &mr, y, 11);
    (a, cq, mr, x, y)
}

/// Move QP `q` to `qp_state` (INIT with its port, P_Key index and rights).
fn move_qp(a: &Nic, q: QpNumber, qp_state: QpState) {
    let mask = if qp_state == QpState::Init {
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS
    } else {
        QpAttrMask::STATE
    };
    let attr = QpAttr {
        qp_state,
        port_num: 1,
        qp_access_flags: ALL,
        ..Default::default()
    };
    a.modify_qp(q, &attr, mask).unwrap();
}

/// Post a 64-byte receive at the start of `mr` to QP `q`.
fn recv64(a: &Nic, mr: &MemoryRegion, q: QpNumber, wr_id: u64) {
    a.post_recv(
        q,
        RecvWr {
            wr_id,
            sg_list: vec![common::sge(mr, 0, 64)].into(),
        },
    )
    .unwrap();
}

/// Poll `cq` until the engine has nothing left to deliver (counted rounds, no clock) and at
/// least `want` completions came (or a bound of rounds passed): their work request IDs and
/// statuses.
fn drain_cq(a: &Nic, cq: Cq, want: usize) -> Vec<(u64, WcStatus)> {
    let mut got = Vec::new();
    let mut quiet = 0;
    while quiet < 200 || got.len() < want && quiet < 200_000 {
        let mut v = Vec::new();
        a.progress();
        if a.poll_cq(cq, &mut v, 16).unwrap() == 0 {
            quiet += 1;
            std::thread::yield_now();
        } else {
            quiet = 0;
        }
        got.extend(v.iter().map(|w| (w.wr_id, w.status)));
    }
    got
}

/// No completion of a destroyed QP is ever polled: not one already in the queue `poll_cq`
/// reads, not one the device's ring still holds, not the flush of a receive still in the
/// doorbell when the QP is destroyed (applied to the QP in the error state first), while the
/// completions of another QP on the same CQ stay, in order. Before: the destroyed QP's
/// flushes reached the CQ after `destroy_qp` (found by the C entry point fuzzer; rdma-core's
/// providers clean a destroyed QP out of its CQs).
#[test]
fn a_destroyed_qps_completions_are_never_polled() {
    for poll in [PollMode::Inline, PollMode::Busy] {
        let (a, cq, mr, x, y) = two_qps_flushing(poll);
        recv64(&a, &mr, x, 3);
        a.destroy_qp(x).unwrap();
        let got: Vec<u64> = drain_cq(&a, cq, 2).into_iter().map(|(id, _)| id).collect();
        assert_eq!(
            got,
            vec![10, 11],
            "{poll:?}: the destroyed QP's completions were polled, or the other QP's lost"
        );
        a.destroy_qp(y).unwrap();
    }
}

/// `Nic::wait_cq_events` (a completion channel with several CQs, as perftest's send and
/// receive CQs): a wait on a CQ that gets nothing and one that gets a SEND's completion ends
/// with the event (left for `get_cq_event` to take); a wait on the idle CQ alone times out.
fn wait_on_any_of_several_cqs(poll: PollMode) {
    let (la, lb) = Loopback::pair(4096, 9000).unwrap();
    let (a, b) = (nic(1, la, poll), nic(2, lb, poll));
    let (x, y) = nic_rc_pair(&a, &b, common::qp_cap(16, 2, 64), 64, 4096, Mtu::M1024);
    let idle = b.create_cq(16).unwrap();
    b.req_notify_cq(idle, NotifyMode::NextCompletion).unwrap();
    b.req_notify_cq(y.cq, NotifyMode::NextCompletion).unwrap();
    assert!(!b
        .wait_cq_events(&[idle, y.cq], Duration::from_millis(20))
        .unwrap());
    b.post_recv(
        y.qp,
        RecvWr {
            wr_id: 9,
            sg_list: vec![common::sge(&y.mr, 0, 64)].into(),
        },
    )
    .unwrap();
    a.post_send(
        x.qp,
        SendWr::new(1, SendOp::Send, vec![common::sge(&x.mr, 0, 8)])
            .with_flags(SendFlags::SIGNALED),
    )
    .unwrap();
    assert!(b
        .wait_cq_events(&[idle, y.cq], Duration::from_secs(10))
        .unwrap());
    assert!(
        b.get_cq_event(y.cq, Duration::ZERO).unwrap(),
        "the event is left"
    );
    assert!(!b.get_cq_event(idle, Duration::ZERO).unwrap());
    assert!(!b
        .wait_cq_events(&[idle], Duration::from_millis(20))
        .unwrap());
    a.shutdown();
    b.shutdown();
}

#[test]
fn wait_on_any_of_several_cqs_inline() {
    wait_on_any_of_several_cqs(PollMode::Inline);
}

#[test]
fn wait_on_any_of_several_cqs_busy() {
    wait_on_any_of_several_cqs(PollMode::Busy);
}

/// A QP moved to RESET leaves no completion behind in its CQ (its flushes from the error
/// state, already in the queue `poll_cq` reads or still in the device's ring), while another
/// QP's on the same CQ stay, in order; the reset QP then completes what it is given anew. As
/// rdma-core's mlx4/mlx5 providers clean a reset QP out of its CQs, and as rdma-core's
/// `tests/test_mr.py` relies on when it restates QPs after an error (RESET → RTS, then traffic
/// whose first completion must be its own). Before: the stale flushes were polled first.
#[test]
fn a_reset_qps_old_completions_are_never_polled() {
    for poll in [PollMode::Inline, PollMode::Busy] {
        let (a, cq, mr, x, _y) = two_qps_flushing(poll);
        move_qp(&a, x, QpState::Reset);
        let flushed = WcStatus::WrFlushErr;
        assert_eq!(
            drain_cq(&a, cq, 2),
            vec![(10, flushed), (11, flushed)],
            "{poll:?}: the reset QP's flushes were polled, or the other QP's lost"
        );
        // Restated, the QP completes its new work (its own flush in ERR again: no stale one
        // before it).
        move_qp(&a, x, QpState::Init);
        recv64(&a, &mr, x, 3);
        move_qp(&a, x, QpState::Err);
        assert_eq!(drain_cq(&a, cq, 1), vec![(3, flushed)], "{poll:?}");
    }
}

/// `ibv_resize_cq`: a CQ grows and shrinks, never below the completions it holds (those in the
/// device's ring and those already handed to the queue `poll_cq` reads), never to 0 or past
/// `max_cqe` (each refusal leaves it as it was), and after growing it takes completions up to
/// its new depth. rdma-core's tests/test_cq.py `test_resize_cq` asks the same of a provider
/// (rxe's `rxe_cq_chk_attr` refuses a depth below the CQ's count).
#[test]
fn a_cq_resizes_but_never_below_what_it_holds() {
    for poll in [PollMode::Inline, PollMode::Busy] {
        let (la, _lb) = Loopback::pair(16, 9000).unwrap();
        let a = nic(1, la, poll);
        let pd = a.alloc_pd().unwrap();
        let cq = a.create_cq(4).unwrap();
        let mr = a.reg_mr(pd, 4096, ALL).unwrap();
        let x = ferroce::runtime::create_rc_qp(&a, pd, cq, common::qp_cap(8, 1, 16)).unwrap();
        move_qp(&a, x, QpState::Init);
        for wr_id in 0..3 {
            recv64(&a, &mr, x, wr_id);
        }
        let max_cqe = a.query_device().max_cqe as usize;
        assert!(a.resize_cq(cq, 0).is_err(), "{poll:?}: depth 0");
        assert!(
            a.resize_cq(cq, max_cqe + 1).is_err(),
            "{poll:?}: past max_cqe"
        );
        assert!(a.resize_cq(cq, 1).is_ok(), "{poll:?}: empty, shrunk to 1");
        a.resize_cq(cq, 3).unwrap();
        // Three flushes (the QP in ERR) fill it.
        move_qp(&a, x, QpState::Err);
        for _ in 0..200 {
            a.progress();
            std::thread::yield_now();
        }
        assert!(
            a.resize_cq(cq, 2).is_err(),
            "{poll:?}: shrunk below the 3 completions it holds"
        );
        a.resize_cq(cq, 8).unwrap();
        // Grown, it takes three more (receives posted in ERR are flushed at once): six held,
        // past its first depth.
        for wr_id in 3..6 {
            recv64(&a, &mr, x, wr_id);
        }
        let got: Vec<u64> = drain_cq(&a, cq, 6).into_iter().map(|(id, _)| id).collect();
        assert_eq!(
            got,
            (0..6).collect::<Vec<_>>(),
            "{poll:?}: every receive completed, in order"
        );
    }
}

/// A device whose frames hold 2200 bytes carries a 2048-byte payload with every header
/// (2150 bytes at most) but not a 4096-byte one: the NIC says so in its port's MTUs, refuses
/// to give a QP path MTU 4096 (before, such a QP took it, never sent a packet and never
/// completed), and a QP at 2048 moves data.
#[test]
fn a_path_mtu_the_device_frames_cannot_hold_is_refused() {
    let (la, lb) = Loopback::pair(4096, 2200).unwrap();
    let (a, b) = (nic(1, la, PollMode::Inline), nic(2, lb, PollMode::Inline));
    for n in [&a, &b] {
        let c = n.with_device(|d| (d.config().port_mtu, d.config().max_mtu));
        assert_eq!(c, (Mtu::M2048, Mtu::M2048));
    }
    let cap = common::qp_cap(64, 2, 64);
    let side = |n: &Nic| {
        let pd = n.alloc_pd().unwrap();
        let cq = n.create_cq(64).unwrap();
        ferroce::runtime::create_rc_qp(n, pd, cq, cap).unwrap()
    };
    let (qa, qb) = (side(&a), side(&b));
    let eb = b.local_end(qb, 0, 7).unwrap();
    let big = RcParams {
        mtu: Mtu::M4096,
        ..Default::default()
    };
    match a.connect_rc(qa, &eb, &big) {
        Err(VerbsError::Modify(ModifyQpError::InvalidValue { attr, value })) => {
            assert_eq!((attr, value), ("path_mtu", 4096));
        }
        other => panic!("path MTU 4096 on 2200-byte frames: {other:?}"),
    }
    // The largest that fits works: 100 KB written in 2048-byte packets.
    let (x, y) = nic_rc_pair(&a, &b, cap, 64, 1 << 17, Mtu::M2048);
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    x.mr.write(0, &data).unwrap();
    a.post_send(x.qp, common::write_wr(1, &x.mr, &y.mr, 100_000))
        .unwrap();
    assert!(a.wait_cq(x.cq, Duration::from_secs(10)).unwrap());
    let mut wcs = Vec::new();
    a.poll_cq(x.cq, &mut wcs, 4).unwrap();
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    let mut got = vec![0u8; 100_000];
    y.mr.read(0, &mut got).unwrap();
    assert!(got == data);
    a.shutdown();
    b.shutdown();
}
