//! A burst of WRITEs completes without the clock moving: the engine must not need time to pass
//! to keep sending (found by the engine benchmark, which runs at a fixed instant).

mod common;
use common::*;
use ferroce::time::Instant;
use ferroce::verbs::*;

#[test]
fn a_burst_completes_at_one_instant() {
    let mut p = ferroce::sim::Pair::new(1, Default::default());
    let a = end(&mut p.a, 1 << 20);
    let b = end(&mut p.b, 1 << 20);
    connect(
        &mut p,
        &a,
        &b,
        &RcParams {
            mtu: Mtu::M4096,
            ..RcParams::default()
        },
        1,
        2,
    );
    for i in 0..64 {
        let f = if i == 63 {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        };
        p.a.post_send(
            a.qp,
            SendWr::new(
                i,
                SendOp::RdmaWrite {
                    remote_addr: b.mr.addr(),
                    rkey: b.mr.rkey(),
                },
                vec![sge(&a.mr, 0, 4096)],
            )
            .with_flags(f),
        )
        .unwrap();
    }
    let now = Instant::from_micros(1);
    let mut buf = vec![0u8; 9000];
    for _ in 0..1000 {
        let mut moved = false;
        while let Some(n) = p.a.poll_transmit(now, &mut buf).unwrap() {
            p.b.handle_frame(now, &buf[..n]);
            moved = true;
        }
        while let Some(n) = p.b.poll_transmit(now, &mut buf).unwrap() {
            p.a.handle_frame(now, &buf[..n]);
            moved = true;
        }
        if !moved {
            break;
        }
    }
    let w = poll(&mut p.a, a.cq);
    assert_eq!(w.len(), 1, "{:?}", p.a.qp_counters(a.qp));
    assert_eq!(w[0].status, WcStatus::Success);
}
