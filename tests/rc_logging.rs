//! The RC engine's tracing events: QP state changes, NAKs sent and received, retries, RNR waits
//! and CQ overruns are logged (at debug or warn level) when a subscriber listens.

mod common;
use common::*;
use ferroce::sim::Pair;
use ferroce::time::Duration;
use ferroce::verbs::*;
use std::sync::{Arc, Mutex};

/// A writer that keeps everything the subscriber formats.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logged(f: impl FnOnce()) -> String {
    let log = Log::default();
    let w = log.clone();
    let sub = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || w.clone())
        .finish();
    tracing::subscriber::with_default(sub, f);
    let bytes = log.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

#[test]
fn rnr_naks_retries_and_state_changes_are_logged() {
    let out = logged(|| {
        // A SEND to a QP with no receive posted: RNR NAKs, waits, retries, then
        // RNR_RETRY_EXC_ERR and the error state.
        let mut p = Pair::new(5, lossy(0.0));
        let (a, b) = (end(&mut p.a, 4096), end(&mut p.b, 4096));
        let params = RcParams {
            rnr_retry: 1,
            min_rnr_timer: 1,
            ..RcParams::default()
        };
        connect(&mut p, &a, &b, &params, 10, 20);
        let wr = SendWr::new(1, SendOp::Send, vec![sge(&a.mr, 0, 64)]);
        p.a.post_send(a.qp, wr).unwrap();
        p.drive_for(Duration::from_millis(10));
        let wcs = poll(&mut p.a, a.cq);
        assert_eq!(wcs[0].status, WcStatus::RnrRetryExcErr);
    });
    for what in [
        "QP state",
        "from=RESET to=INIT",
        "to=RTS",
        "NAK sent",
        "NAK received",
        "RNR wait",
        "requester: retry",
        "RNR retries exhausted",
        "to=ERR",
    ] {
        assert!(out.contains(what), "no {what:?} in the log:\n{out}");
    }
}

#[test]
fn a_cq_overrun_is_logged() {
    let out = logged(|| {
        let mut p = Pair::new(6, Default::default());
        let a = end(&mut p.a, 4096);
        let pd = p.b.alloc_pd().unwrap();
        let cq = p.b.create_cq(1).unwrap();
        let qp = p.b.create_qp(QpInitAttr::new(pd, cq, cq, cap())).unwrap();
        let mr = p.b.reg_mr(pd, 4096, ALL).unwrap();
        p.connect(a.qp, qp, &RcParams::default(), 1, 2).unwrap();
        for i in 0..2 {
            p.b.post_recv(
                qp,
                RecvWr {
                    wr_id: i,
                    sg_list: vec![sge(&mr, 0, 64)].into(),
                },
            )
            .unwrap();
            let wr = SendWr::new(i, SendOp::Send, vec![sge(&a.mr, 0, 64)]);
            p.a.post_send(a.qp, wr).unwrap();
        }
        p.drive_for(Duration::from_millis(10));
        assert_eq!(p.b.counters().0.cq_overruns, 1);
    });
    assert!(out.contains("CQ overrun"), "{out}");
}
