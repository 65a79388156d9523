//! The IB CM state machine in the seeded simulator (src/sim/cm.rs): two CMs on a network with
//! a virtual clock; MADs lost on purpose (a filter) or at random (seeded loss, duplication,
//! reordering), with an "application" on each side that answers events the way rdma_cm does
//! (accept every REQ, send RTU on every REP, answer every DREQ).

use ferroce::cm::{
    AcceptParams, Cm, CmConfig, CmEvent, CmState, CommId, ConnectParams, DisconnectHow, QpParams,
    Waiting,
};
use ferroce::sim::cm::{CmPair, Side};
use ferroce::sim::LinkConfig;
use ferroce::time::{Duration, Instant};
use ferroce::wire::mad::cm::{CmMadRepr, CmMessage, MsgCode, RejReason, ReqRepr, SidrStatus};
use ferroce::wire::mad::{AttrId, MadHeaderRepr, MadStatus, Method, MgmtClass, MAD_LEN};
use ferroce::wire::{Psn, QpNumber};
use std::collections::HashMap;

const SERVICE: u64 = 0x0000_0000_0106_1c06;
const RETRIES: u8 = 3;

/// Short timeouts so that a run takes little virtual time: the peer answers within
/// 4.096 µs × 2^14 ≈ 67 ms, packets live 2^10 units ≈ 4 ms, 3 retries.
fn config(guid: u64, seed: u64) -> CmConfig {
    CmConfig {
        cm_response_timeout: 14,
        packet_lifetime: 10,
        max_cm_retries: RETRIES,
        ..CmConfig::new(guid)
    }
    .with_seed(seed)
}

/// How long one side waits for an answer in these tests.
fn wait() -> Duration {
    config(1, 1).response_wait(14)
}

/// The two CMs, the events they reported with their times, and what the applications do.
struct Test {
    p: CmPair<Cm>,
    events: HashMap<Side, Vec<(Instant, CmEvent)>>,
    /// Answer REQs (B's application); when false, REQs wait in the backlog.
    accept: bool,
    /// Delay before an application answers a REQ.
    accept_delay: Duration,
    pending_accepts: Vec<(Instant, Side, CommId)>,
    next_qpn: u32,
}

impl Test {
    fn new(seed: u64, link: LinkConfig) -> Self {
        let a = Cm::new(config(0xaaaa, seed));
        let mut b = Cm::new(config(0xbbbb, seed + 1));
        b.listen(SERVICE, 16).unwrap();
        Test {
            p: CmPair::new(a, b, seed, link),
            events: HashMap::new(),
            accept: true,
            accept_delay: Duration::ZERO,
            pending_accepts: Vec::new(),
            next_qpn: 0x100,
        }
    }

    fn clean() -> Self {
        Test::new(1, CmPair::<Cm>::clean_link())
    }

    fn connect_to(&mut self, service: u64) -> CommId {
        self.next_qpn += 1;
        let mut cp = ConnectParams::rc(
            service,
            self.p.addr_b,
            self.p.addr_a.gid,
            QpNumber::new(self.next_qpn),
            Psn::new(0x123456),
        );
        cp.private_data[..5].copy_from_slice(b"hello");
        let now = self.p.now;
        self.p.a.connect(now, &cp).unwrap()
    }

    fn connect(&mut self) -> CommId {
        self.connect_to(SERVICE)
    }

    /// Read both sides' events and answer them as rdma_cm would.
    fn pump(&mut self) {
        let now = self.p.now;
        for side in [Side::A, Side::B] {
            while let Some(e) = self.p.side(side).poll_event() {
                self.events.entry(side).or_default().push((now, e));
                match e {
                    CmEvent::ReqReceived { id, .. } if self.accept => {
                        self.pending_accepts
                            .push((now + self.accept_delay, side, id));
                    }
                    CmEvent::RepReceived { id, .. } => {
                        self.p.side(side).establish(now, id).unwrap();
                    }
                    CmEvent::DreqReceived { id, .. } => {
                        self.p.side(side).disconnect(now, id, &[]).unwrap();
                    }
                    _ => {}
                }
            }
        }
        let due: Vec<_> = self
            .pending_accepts
            .iter()
            .copied()
            .filter(|&(t, ..)| t <= now)
            .collect();
        self.pending_accepts.retain(|&(t, ..)| t > now);
        for (_, side, id) in due {
            self.next_qpn += 1;
            let mut a = AcceptParams::new(QpNumber::new(self.next_qpn), Psn::new(0xabcdef));
            a.private_data[..3].copy_from_slice(b"yes");
            // The active side may have given up meanwhile.
            let _ = self.p.side(side).accept(now, id, &a);
        }
    }

    /// Run until nothing is left to do or `d` of virtual time has passed.
    fn run(&mut self, d: Duration) {
        let limit = self.p.now + d;
        loop {
            self.pump();
            let next = self.pending_accepts.iter().map(|&(t, ..)| t).min();
            let progressed = self.p.step_until(next.map_or(limit, |n| n.min(limit)));
            if !progressed {
                match next {
                    Some(n) if n <= limit => self.p.now = self.p.now.max(n),
                    _ => break,
                }
            }
        }
        self.pump();
    }

    fn run_long(&mut self) {
        self.run(Duration::from_secs(3600));
    }

    fn events(&self, side: Side) -> Vec<CmEvent> {
        self.events
            .get(&side)
            .map(|v| v.iter().map(|(_, e)| *e).collect())
            .unwrap_or_default()
    }

    fn count(&self, side: Side, f: impl Fn(&CmEvent) -> bool) -> usize {
        self.events(side).iter().filter(|e| f(e)).count()
    }

    fn first_time(&self, side: Side, f: impl Fn(&CmEvent) -> bool) -> Option<Instant> {
        self.events
            .get(&side)?
            .iter()
            .find(|(_, e)| f(e))
            .map(|(t, _)| *t)
    }

    fn established(&self, side: Side) -> Vec<QpParams> {
        self.events(side)
            .into_iter()
            .filter_map(|e| match e {
                CmEvent::Established { qp, .. } => Some(qp),
                _ => None,
            })
            .collect()
    }

    /// Both sides established exactly one connection with matching QP parameters.
    fn assert_one_connection(&self) {
        let (a, b) = (self.established(Side::A), self.established(Side::B));
        assert_eq!((a.len(), b.len()), (1, 1), "A {a:?} B {b:?}");
        let (a, b) = (a[0], b[0]);
        assert_eq!(a.remote_qpn, b.local_qpn);
        assert_eq!(b.remote_qpn, a.local_qpn);
        assert_eq!(a.sq_psn, b.rq_psn);
        assert_eq!(b.sq_psn, a.rq_psn);
        assert_eq!(a.max_rd_atomic, b.max_dest_rd_atomic);
        assert_eq!(b.max_rd_atomic, a.max_dest_rd_atomic);
        assert_eq!((a.local_gid, a.remote_gid), (b.remote_gid, b.local_gid));
        assert_eq!(a.path_mtu, b.path_mtu);
        assert_eq!(
            self.count(Side::B, |e| matches!(e, CmEvent::ReqReceived { .. })),
            1,
            "one REQ reached the consumer"
        );
    }

    fn drop_first(&mut self, from: Side, name: &'static str, n: usize) {
        let mut left = n;
        self.p.set_filter(move |s, m| {
            if s == from && m.msg.short_name() == name && left > 0 {
                left -= 1;
                true
            } else {
                false
            }
        });
    }

    fn drop_all(&mut self, from: Side, name: &'static str) {
        self.drop_first(from, name, usize::MAX);
    }
}

fn is_established(e: &CmEvent) -> bool {
    matches!(e, CmEvent::Established { .. })
}

#[test]
fn connect_and_disconnect() {
    let mut t = Test::clean();
    let id = t.connect();
    t.run(Duration::from_millis(10));
    t.assert_one_connection();
    assert_eq!(t.p.sent_by(Side::A), ["REQ", "RTU"]);
    assert_eq!(t.p.sent_by(Side::B), ["REP"]);
    // What the applications exchanged and what the QPs need.
    let ev = t.events(Side::B);
    let CmEvent::ReqReceived { req, src, .. } = ev[0] else {
        panic!("{ev:?}")
    };
    assert_eq!(&req.private_data[..5], b"hello");
    assert_eq!(src, t.p.addr_a);
    let CmEvent::RepReceived { rep, qp, .. } = t.events(Side::A)[0] else {
        panic!()
    };
    assert_eq!(&rep.private_data[..3], b"yes");
    assert_eq!(qp.retry_count, 7);
    assert_eq!(qp.rnr_retry_count, 7);
    assert_eq!(qp.sq_psn, Psn::new(0x123456));
    assert_eq!(qp.rq_psn, Psn::new(0xabcdef));
    assert!(
        qp.local_ack_timeout >= 11,
        "covers 2 packet lifetimes + ACK delay"
    );
    assert_eq!(t.p.a.state(id), Some(CmState::Established));

    let now = t.p.now;
    t.p.a.disconnect(now, id, b"bye").unwrap();
    t.run(Duration::from_millis(1));
    assert_eq!(t.p.count(Side::A, "DREQ"), 1);
    assert_eq!(t.p.count(Side::B, "DREP"), 1);
    let dreq = t.events(Side::B);
    assert!(
        matches!(dreq.last(), Some(CmEvent::DreqReceived { private_data, .. }) if &private_data[..3] == b"bye")
    );
    assert!(matches!(
        t.events(Side::A).last(),
        Some(CmEvent::Disconnected {
            how: DisconnectHow::DrepReceived,
            ..
        })
    ));
    assert_eq!(t.p.a.state(id), Some(CmState::TimeWait));
    // TimeWait ends on both sides; nothing is left.
    t.run_long();
    for s in [Side::A, Side::B] {
        assert_eq!(t.count(s, |e| matches!(e, CmEvent::TimeWaitExit { .. })), 1);
        assert_eq!(t.p.side(s).connection_count(), 0);
        assert_eq!(t.p.side(s).poll_timeout(), None);
    }
    assert_eq!(t.p.b.counters().duplicates, 0);
}

#[test]
fn req_lost_once_is_retried() {
    let mut t = Test::clean();
    t.drop_first(Side::A, "REQ", 1);
    t.connect();
    t.run(wait() * 3);
    t.assert_one_connection();
    assert_eq!(t.p.count(Side::A, "REQ"), 2);
    let est = t.first_time(Side::A, is_established).unwrap();
    assert!(
        est >= Instant::ZERO + wait(),
        "the retry waited the response time"
    );
    assert!(est < Instant::ZERO + wait() * 2);
    assert_eq!(t.p.a.counters().retransmissions, 1);
}

#[test]
fn req_lost_beyond_the_retry_count_times_out() {
    let mut t = Test::clean();
    t.drop_all(Side::A, "REQ");
    let id = t.connect();
    t.run_long();
    assert_eq!(t.p.count(Side::A, "REQ"), usize::from(RETRIES) + 1);
    assert_eq!(
        t.events(Side::A),
        [CmEvent::TimedOut {
            id,
            waiting: Waiting::Rep
        }]
    );
    let at = t.first_time(Side::A, |_| true).unwrap();
    assert_eq!(at, Instant::ZERO + wait() * (u32::from(RETRIES) + 1));
    // The REJ (Timeout) that follows finds no connection at B: counted, nothing else.
    assert_eq!(t.p.count(Side::A, "REJ"), 1);
    assert_eq!(t.p.b.counters().unknown_id, 1);
    assert!(t.events(Side::B).is_empty());
    assert_eq!(t.p.a.connection_count() + t.p.b.connection_count(), 0);
}

#[test]
fn rep_lost_once_is_retried() {
    let mut t = Test::clean();
    t.drop_first(Side::B, "REP", 1);
    t.connect();
    t.run(wait() * 3);
    t.assert_one_connection();
    assert_eq!(t.p.count(Side::B, "REP"), 2);
}

#[test]
fn rep_lost_beyond_the_retry_count_fails_on_both_sides() {
    let mut t = Test::clean();
    t.drop_all(Side::B, "REP");
    let id = t.connect();
    t.run_long();
    assert!(t.established(Side::A).is_empty() && t.established(Side::B).is_empty());
    // The active side started first and gives up first: REJ (Timeout) to B.
    assert_eq!(
        t.events(Side::A).last(),
        Some(&CmEvent::TimedOut {
            id,
            waiting: Waiting::Rep
        })
    );
    assert!(matches!(
        t.events(Side::B).last(),
        Some(CmEvent::Rejected {
            reason: RejReason::TIMEOUT,
            ..
        })
    ));
    assert_eq!(
        t.count(Side::B, |e| matches!(e, CmEvent::ReqReceived { .. })),
        1
    );
    assert!(t.p.count(Side::B, "REP") > usize::from(RETRIES));
    assert_eq!(t.p.a.connection_count() + t.p.b.connection_count(), 0);
}

#[test]
fn rtu_lost_once_is_answered_again() {
    let mut t = Test::clean();
    t.drop_first(Side::A, "RTU", 1);
    t.connect();
    t.run(wait() * 3);
    t.assert_one_connection();
    // B sent the REP again; A, established, answered that duplicate with RTU again.
    assert_eq!(t.p.count(Side::B, "REP"), 2);
    assert_eq!(t.p.count(Side::A, "RTU"), 2);
    assert_eq!(t.p.a.counters().duplicates, 1);
}

#[test]
fn rtu_lost_beyond_the_retry_count_fails_the_passive_side() {
    let mut t = Test::clean();
    t.drop_all(Side::A, "RTU");
    let id = t.connect();
    t.run_long();
    assert_eq!(t.established(Side::A).len(), 1, "A sent RTU: established");
    assert!(t.established(Side::B).is_empty());
    assert!(matches!(
        t.events(Side::B).last(),
        Some(CmEvent::TimedOut {
            waiting: Waiting::Rtu,
            ..
        })
    ));
    assert_eq!(t.p.count(Side::B, "REP"), usize::from(RETRIES) + 1);
    // B's REJ (Timeout) takes A's connection down too.
    assert!(t.events(Side::A).iter().any(|e| matches!(
        e,
        CmEvent::Rejected {
            reason: RejReason::TIMEOUT,
            message: MsgCode::REP,
            ..
        }
    )));
    assert!(t.events(Side::A).contains(&CmEvent::TimeWaitExit { id }));
    assert_eq!(t.p.a.connection_count() + t.p.b.connection_count(), 0);
}

fn established_pair(t: &mut Test) -> (CommId, CommId) {
    let id = t.connect();
    t.run(Duration::from_millis(10));
    t.assert_one_connection();
    let b = match t.events(Side::B)[0] {
        CmEvent::ReqReceived { id, .. } => id,
        ref e => panic!("{e:?}"),
    };
    (id, b)
}

#[test]
fn dreq_lost_once_is_retried() {
    let mut t = Test::clean();
    let (a, _) = established_pair(&mut t);
    t.drop_first(Side::A, "DREQ", 1);
    let now = t.p.now;
    t.p.a.disconnect(now, a, &[]).unwrap();
    t.run(wait() * 3);
    assert_eq!(t.p.count(Side::A, "DREQ"), 2);
    assert_eq!(
        t.count(Side::B, |e| matches!(e, CmEvent::DreqReceived { .. })),
        1
    );
    assert!(t.events(Side::A).iter().any(|e| matches!(
        e,
        CmEvent::Disconnected {
            how: DisconnectHow::DrepReceived,
            ..
        }
    )));
}

#[test]
fn dreq_lost_beyond_the_retry_count_ends_in_timewait() {
    let mut t = Test::clean();
    let (a, b) = established_pair(&mut t);
    t.drop_all(Side::A, "DREQ");
    let now = t.p.now;
    t.p.a.disconnect(now, a, &[]).unwrap();
    // Past the last DREQ's wait, before TimeWait (2^11 units ≈ 8.4 ms) is over.
    t.run(wait() * (u32::from(RETRIES) + 1) + Duration::from_millis(1));
    assert_eq!(t.p.count(Side::A, "DREQ"), usize::from(RETRIES) + 1);
    assert!(t.events(Side::A).contains(&CmEvent::Disconnected {
        id: a,
        how: DisconnectHow::DreqTimeout
    }));
    assert_eq!(t.p.a.state(a), Some(CmState::TimeWait));
    // B never heard: still established (a half-open connection, as the IBTA has it).
    assert_eq!(t.p.b.state(b), Some(CmState::Established));
    t.run_long();
    assert_eq!(t.p.a.connection_count(), 0);
}

#[test]
fn drep_lost_is_answered_again() {
    let mut t = Test::clean();
    let (a, _) = established_pair(&mut t);
    t.drop_first(Side::B, "DREP", 1);
    let now = t.p.now;
    t.p.a.disconnect(now, a, &[]).unwrap();
    t.run(wait() * 3);
    assert_eq!(t.p.count(Side::A, "DREQ"), 2);
    assert_eq!(
        t.p.count(Side::B, "DREP"),
        2,
        "B in TimeWait answers the repeated DREQ"
    );
    assert_eq!(
        t.count(Side::B, |e| matches!(e, CmEvent::DreqReceived { .. })),
        1
    );
}

#[test]
fn duplicate_req_is_answered_without_a_second_connection() {
    let mut t = Test::clean();
    t.accept = false;
    t.connect();
    t.run(Duration::from_millis(1));
    let req = t.p.trace[0];
    assert_eq!(req.name(), "REQ");
    let req_bytes = req.mad.unwrap().to_bytes().to_vec();
    // 1. The consumer has not answered: the duplicate gets an MRA.
    t.p.inject(Side::A, req_bytes.clone());
    t.run(Duration::from_millis(1));
    assert_eq!(t.p.sent_by(Side::B), ["MRA"]);
    assert!(t
        .events(Side::A)
        .iter()
        .any(|e| matches!(e, CmEvent::MraReceived { .. })));
    // 2. Again: the MRA again.
    t.p.inject(Side::A, req_bytes.clone());
    t.run(Duration::from_millis(1));
    assert_eq!(t.p.sent_by(Side::B), ["MRA", "MRA"]);
    // 3. Accepted: a duplicate now gets the REP again (A sees two REPs and connects once).
    let id = match t.events(Side::B)[0] {
        CmEvent::ReqReceived { id, .. } => id,
        ref e => panic!("{e:?}"),
    };
    let now = t.p.now;
    t.p.b
        .accept(
            now,
            id,
            &AcceptParams::new(QpNumber::new(0x77), Psn::new(1)),
        )
        .unwrap();
    t.p.inject(Side::A, req_bytes.clone());
    t.run(Duration::from_millis(1));
    assert_eq!(t.p.sent_by(Side::B), ["MRA", "MRA", "REP", "REP"]);
    // A got two REPs: the first was answered with RTU, the second (established) with RTU
    // again, which B counts as a duplicate.
    assert_eq!(t.p.sent_by(Side::A), ["REQ", "RTU", "RTU"]);
    // 4. Established: a late duplicate changes nothing.
    t.p.inject(Side::A, req_bytes);
    t.run(Duration::from_millis(1));
    t.assert_one_connection();
    assert_eq!(t.p.b.connection_count(), 1);
    assert_eq!(t.p.b.counters().duplicates, 5, "4 REQs and an RTU");
    assert_eq!(t.p.sent_by(Side::B), ["MRA", "MRA", "REP", "REP"]);
}

#[test]
fn rej_for_an_unknown_service_id_arrives_promptly() {
    let mut t = Test::clean();
    let id = t.connect_to(0x0106_1f3f);
    t.run(wait() * 10);
    let ev = t.events(Side::A);
    assert_eq!(ev.len(), 1, "{ev:?}");
    let CmEvent::Rejected {
        id: rid,
        reason,
        message,
        ..
    } = ev[0]
    else {
        panic!("{ev:?}")
    };
    assert_eq!(
        (rid, reason, message),
        (id, RejReason::INVALID_SERVICE_ID, MsgCode::REQ)
    );
    // One round trip (2 × 10 µs), not a timeout.
    let at = t.first_time(Side::A, |_| true).unwrap();
    assert_eq!(at, Instant::from_micros(20));
    assert_eq!(t.p.count(Side::A, "REQ"), 1);
    assert_eq!(t.p.b.counters().no_listener, 1);
    assert_eq!(t.p.a.connection_count() + t.p.b.connection_count(), 0);
}

#[test]
fn consumer_reject_carries_private_data() {
    let mut t = Test::clean();
    t.accept = false;
    let id = t.connect();
    t.run(Duration::from_millis(1));
    let bid = match t.events(Side::B)[0] {
        CmEvent::ReqReceived { id, .. } => id,
        ref e => panic!("{e:?}"),
    };
    let now = t.p.now;
    t.p.b
        .reject(now, bid, RejReason::CONSUMER, &[], b"go away")
        .unwrap();
    t.run(Duration::from_millis(1));
    let CmEvent::Rejected {
        id: rid,
        reason,
        private_data,
        ..
    } = t.events(Side::A)[0]
    else {
        panic!()
    };
    assert_eq!((rid, reason), (id, RejReason::CONSUMER));
    assert_eq!(&private_data[..7], b"go away");
    assert_eq!(t.p.b.pending(ferroce::cm::ListenId(1)), Some(0));
}

#[test]
fn simultaneous_disconnect() {
    let mut t = Test::clean();
    let (a, b) = established_pair(&mut t);
    let now = t.p.now;
    t.p.a.disconnect(now, a, &[]).unwrap();
    t.p.b.disconnect(now, b, &[]).unwrap();
    t.run(Duration::from_millis(1));
    for (s, id) in [(Side::A, a), (Side::B, b)] {
        assert_eq!(t.p.count(s, "DREQ"), 1);
        assert_eq!(t.p.count(s, "DREP"), 1);
        assert!(t.events(s).contains(&CmEvent::Disconnected {
            id,
            how: DisconnectHow::Simultaneous
        }));
        assert_eq!(t.count(s, |e| matches!(e, CmEvent::DreqReceived { .. })), 0);
        assert_eq!(t.p.side(s).state(id), Some(CmState::TimeWait));
    }
    t.run_long();
    assert_eq!(t.p.a.connection_count() + t.p.b.connection_count(), 0);
}

#[test]
fn req_flood_is_bounded_by_the_backlog() {
    let mut t = Test::clean();
    let mut b = Cm::new(config(0xbbbb, 9));
    let listen = b.listen(SERVICE, 8).unwrap();
    t.p.b = b;
    // The application takes 2 ms per connection request.
    t.accept_delay = Duration::from_millis(2);
    let n = 100;
    for _ in 0..n {
        t.connect();
    }
    let limit = t.p.now + Duration::from_secs(60);
    let mut most = 0;
    while t.p.now < limit {
        t.pump();
        most = most.max(t.p.b.pending(listen).unwrap());
        let next = t.pending_accepts.iter().map(|&(t, ..)| t).min();
        if !t.p.step_until(next.map_or(limit, |x| x.min(limit))) {
            match next {
                Some(x) => t.p.now = t.p.now.max(x),
                None => break,
            }
        }
    }
    t.pump();
    // Never more than the backlog waits for the application; the REQs beyond it are
    // dropped (as Linux does) and their senders' retries come back later: each of the four
    // rounds (the REQ and its 3 retries) lets one backlog's worth in.
    assert_eq!(most, 8, "the backlog filled and held");
    let c = *t.p.b.counters();
    assert!(c.backlog_drops > 0);
    assert_eq!(c.rej_sent, 0, "nothing is rejected");
    let est = |s| t.count(s, is_established);
    let timed_out = t.count(Side::A, |e| matches!(e, CmEvent::TimedOut { .. }));
    assert_eq!(est(Side::A), est(Side::B));
    assert_eq!(est(Side::A), 8 * (usize::from(RETRIES) + 1));
    assert_eq!(
        est(Side::A) + timed_out,
        n,
        "every REQ ends one way or the other"
    );
    assert_eq!(t.p.b.connection_count(), est(Side::B));
    assert_eq!(
        t.count(Side::B, |e| matches!(e, CmEvent::ReqReceived { .. })),
        est(Side::B)
    );
}

#[test]
fn malformed_and_truncated_mads_are_counted_and_dropped() {
    let mut t = Test::clean();
    let valid = CmMadRepr::send(
        0x77,
        CmMessage::Req(ReqRepr {
            local_comm_id: 0x1234_5678,
            service_id: SERVICE,
            local_ca_guid: 0xaaaa,
            local_qpn: QpNumber::new(0x11),
            max_cm_retries: 3,
            ..ReqRepr::default()
        }),
    );
    let bytes = valid.to_bytes();
    let mut inject = |b: Vec<u8>| t.p.inject(Side::A, b);
    inject(bytes[..MAD_LEN - 1].to_vec()); // truncated
    inject(bytes[..24].to_vec()); // header only
    inject(vec![]); // empty
    let mut long = bytes.to_vec();
    long.push(0);
    inject(long); // too long
    let mut v = bytes;
    v[0] = 2; // base version
    inject(v.to_vec());
    let mut v = bytes;
    v[2] = 1; // class version
    inject(v.to_vec());
    let mut v = bytes;
    v[1] = 0x04; // performance management class
    inject(v.to_vec());
    let mut v = bytes;
    v[24..28].fill(0); // REQ with local comm ID 0
    inject(v.to_vec());
    let mut v = bytes;
    v[16..18].copy_from_slice(&0x0019u16.to_be_bytes()); // LAP: not served
    inject(v.to_vec());
    let mut v = bytes;
    v[3] = 0x06; // method Report
    inject(v.to_vec());
    // Messages for connections that do not exist.
    for msg in ["RTU", "DREP", "MRA", "REJ"] {
        let mut m = valid;
        m.msg = match msg {
            "RTU" => CmMessage::Rtu(ferroce::wire::mad::cm::RtuRepr {
                local_comm_id: 5,
                remote_comm_id: 6,
                ..Default::default()
            }),
            "DREP" => CmMessage::Drep(ferroce::wire::mad::cm::DrepRepr {
                local_comm_id: 5,
                remote_comm_id: 6,
                ..Default::default()
            }),
            "MRA" => CmMessage::Mra(ferroce::wire::mad::cm::MraRepr {
                local_comm_id: 5,
                remote_comm_id: 6,
                ..Default::default()
            }),
            _ => CmMessage::Rej(ferroce::wire::mad::cm::RejRepr {
                local_comm_id: 5,
                remote_comm_id: 6,
                ..Default::default()
            }),
        };
        t.p.inject(Side::A, m.to_bytes().to_vec());
    }
    t.run(Duration::from_millis(1));
    let c = *t.p.b.counters();
    assert_eq!(c.mads_received, 14);
    assert_eq!(c.truncated, 3);
    assert_eq!(c.malformed, 2, "too long; comm ID 0");
    assert_eq!(c.bad_version, 2);
    assert_eq!(c.wrong_class, 1);
    assert_eq!(c.unsupported, 2, "LAP; Report");
    assert_eq!(c.unknown_id, 4);
    assert_eq!(c.rej_received, 1);
    assert!(t.events(Side::B).is_empty());
    assert_eq!(t.p.b.connection_count(), 0);
    assert!(t.p.sent_by(Side::B).is_empty(), "nothing is answered");
}

#[test]
fn class_port_info_is_answered_and_other_gets_are_refused() {
    let mut t = Test::clean();
    let get = |attr: AttrId| {
        CmMadRepr {
            header: MadHeaderRepr::new(MgmtClass::CM, 2, Method::GET, attr, 0x5555),
            msg: CmMessage::Other {
                attr_id: attr,
                data: [0; 232],
            },
        }
        .to_bytes()
        .to_vec()
    };
    t.p.inject(Side::A, get(AttrId::CLASS_PORT_INFO));
    t.p.inject(Side::A, get(AttrId::CM_REQ));
    let mut old = get(AttrId::CLASS_PORT_INFO);
    old[2] = 1;
    t.p.inject(Side::A, old);
    t.run(Duration::from_millis(1));
    let answers: Vec<CmMadRepr> = t.p.trace.iter().filter_map(|e| e.mad).collect();
    assert_eq!(answers.len(), 3);
    let h = answers[0].header;
    assert_eq!(
        (h.method, h.status, h.transaction_id),
        (Method::GET_RESP, MadStatus::OK, 0x5555)
    );
    let CmMessage::ClassPortInfo(cpi) = answers[0].msg else {
        panic!()
    };
    assert_eq!(
        (cpi.base_version, cpi.class_version, cpi.resp_time_value),
        (1, 2, 14)
    );
    assert_eq!(answers[1].header.status, MadStatus::UNSUPPORTED_METHOD_ATTR);
    assert_eq!(answers[2].header.status, MadStatus::BAD_VERSION);
}

#[test]
fn slow_consumer_gets_an_mra_and_the_active_side_waits() {
    let mut t = Test::clean();
    // B's application answers after 1.5 response times: A's first REQ timer fires.
    t.accept_delay = wait() + wait() / 2;
    t.connect();
    t.run(wait() * 4);
    t.assert_one_connection();
    assert_eq!(t.p.count(Side::A, "REQ"), 2);
    assert_eq!(t.p.count(Side::B, "MRA"), 1);
    assert!(t.events(Side::A).iter().any(|e| matches!(
        e,
        CmEvent::MraReceived {
            service_timeout: 24,
            ..
        }
    )));
}

#[test]
fn sidr_resolution() {
    let mut t = Test::clean();
    // No listener: SIDR_REP with status "not supported", at once.
    let now = t.p.now;
    let id =
        t.p.a
            .sidr_request(now, t.p.addr_b, 0x0111_4853, b"pd")
            .unwrap();
    t.run(Duration::from_millis(1));
    let CmEvent::SidrRepReceived { id: rid, rep } = t.events(Side::A)[0] else {
        panic!()
    };
    assert_eq!((rid, rep.status), (id, SidrStatus::UNSUPPORTED));

    // A listener that answers; the first SIDR_REQ and the first SIDR_REP are lost.
    let l = t.p.b.listen(0x0111_4853, 4).unwrap();
    t.drop_first(Side::A, "SIDR_REQ", 1);
    let now = t.p.now;
    let id =
        t.p.a
            .sidr_request(now, t.p.addr_b, 0x0111_4853, b"pd")
            .unwrap();
    t.run(wait() * 2);
    let (bid, req) = match t.events(Side::B).last() {
        Some(CmEvent::SidrReqReceived {
            id, listen, req, ..
        }) if *listen == l => (*id, *req),
        e => panic!("{e:?}"),
    };
    assert_eq!(&req.private_data[..2], b"pd");
    t.drop_first(Side::B, "SIDR_REP", 1);
    let now = t.p.now;
    t.p.b
        .sidr_reply(
            now,
            bid,
            SidrStatus::SUCCESS,
            QpNumber::new(0x15),
            0x0123_4567,
            &[],
        )
        .unwrap();
    t.run(wait() * 3);
    let reps: Vec<_> = t
        .events(Side::A)
        .into_iter()
        .filter_map(|e| match e {
            CmEvent::SidrRepReceived { id: i, rep } if i == id => Some(rep),
            _ => None,
        })
        .collect();
    assert_eq!(reps.len(), 1);
    assert_eq!(
        (reps[0].qpn, reps[0].qkey),
        (QpNumber::new(0x15), 0x0123_4567)
    );
    // The retried SIDR_REQ was answered from the stored answer, not the consumer.
    assert_eq!(
        t.count(Side::B, |e| matches!(e, CmEvent::SidrReqReceived { .. })),
        1
    );
    assert_eq!(t.p.count(Side::B, "SIDR_REP"), 3);

    // Every SIDR_REQ lost: time out after the retries.
    t.drop_all(Side::A, "SIDR_REQ");
    let now = t.p.now;
    let id =
        t.p.a
            .sidr_request(now, t.p.addr_b, 0x0111_4853, &[])
            .unwrap();
    t.run_long();
    assert_eq!(
        t.events(Side::A).last(),
        Some(&CmEvent::SidrTimedOut { id })
    );
}

/// Random loss, duplication and reordering: every attempt ends with one connection on both
/// sides or none, never two; every connection comes down; nothing is left after TimeWait.
#[test]
fn lossy_duplicating_network_never_makes_two_connections() {
    let (mut connected, mut retried, mut duplicated) = (0, 0, 0);
    for seed in 0..40u64 {
        let link = CmPair::<Cm>::clean_link()
            .loss(0.2)
            .duplicate(0.2)
            .reorder(0.2, Duration::from_micros(300))
            .jitter(Duration::from_micros(50));
        let mut t = Test::new(seed, link);
        let id = t.connect();
        t.run(wait() * 40);
        let (ea, eb) = (t.established(Side::A).len(), t.established(Side::B).len());
        assert!(ea <= 1 && eb <= 1, "seed {seed}");
        assert!(
            t.count(Side::B, |e| matches!(e, CmEvent::ReqReceived { .. })) <= 1,
            "seed {seed}"
        );
        if ea == 1 && t.p.a.state(id) == Some(CmState::Established) {
            let now = t.p.now;
            t.p.a.disconnect(now, id, &[]).unwrap();
        }
        t.run_long();
        // Every DREQ lost leaves B established (half open): its application ends it.
        if let Some(CmEvent::ReqReceived { id: bid, .. }) = t.events(Side::B).first().copied() {
            if t.p.b.state(bid) == Some(CmState::Established) {
                let now = t.p.now;
                t.p.b.disconnect(now, bid, &[]).unwrap();
                t.run_long();
            }
        }
        if ea == 1 && eb == 1 {
            t.assert_one_connection();
        }
        assert_eq!(
            t.p.a.connection_count() + t.p.b.connection_count(),
            0,
            "seed {seed}: {:?} / {:?}",
            t.events(Side::A),
            t.events(Side::B)
        );
        connected += usize::from(ea == 1 && eb == 1);
        retried +=
            usize::from(t.p.a.counters().retransmissions + t.p.b.counters().retransmissions > 0);
        duplicated += usize::from(t.p.a.counters().duplicates + t.p.b.counters().duplicates > 0);
    }
    // The runs are not vacuous: most connect, many needed retries or saw duplicates.
    assert!(connected >= 35, "{connected} of 40 connected");
    assert!(
        retried >= 10 && duplicated >= 10,
        "{retried} retried, {duplicated} duplicated"
    );
}
