//! Unit tests of the engine's API rules and of the answers to messages for unknown or stale
//! connections. The scenarios with loss live in tests/cm_sim.rs.

use super::*;
use crate::sim::cm::{CmPair, Side};
use crate::time::Duration;
use crate::wire::Psn;

fn pair() -> CmPair<Cm> {
    let cfg = |g, s| {
        CmConfig {
            cm_response_timeout: 14,
            packet_lifetime: 10,
            max_cm_retries: 2,
            ..CmConfig::new(g)
        }
        .with_seed(s)
    };
    CmPair::new(
        Cm::new(cfg(0xa, 1)),
        Cm::new(cfg(0xb, 2)),
        3,
        CmPair::<Cm>::clean_link(),
    )
}

fn events(cm: &mut Cm) -> Vec<CmEvent> {
    std::iter::from_fn(|| cm.poll_event()).collect()
}

fn connect(p: &mut CmPair<Cm>, qpn: u32) -> CommId {
    let cp = ConnectParams::rc(
        0x42,
        p.addr_b,
        p.addr_a.gid,
        QpNumber::new(qpn),
        Psn::new(5),
    );
    let now = p.now;
    p.a.connect(now, &cp).unwrap()
}

/// Connect A to B's service 0x42 and establish; returns (A's id, B's id).
fn establish(p: &mut CmPair<Cm>, qpn: u32) -> (CommId, CommId) {
    let a = connect(p, qpn);
    p.run_for(Duration::from_micros(20));
    let b = match events(&mut p.b).as_slice() {
        [CmEvent::ReqReceived { id, .. }] => *id,
        e => panic!("{e:?}"),
    };
    let now = p.now;
    p.b.accept(
        now,
        b,
        &AcceptParams::new(QpNumber::new(0x900 + qpn), Psn::new(9)),
    )
    .unwrap();
    p.run_for(Duration::from_micros(20));
    let now = p.now;
    p.a.establish(now, a).unwrap();
    p.run_for(Duration::from_micros(20));
    assert_eq!(p.b.state(b), Some(CmState::Established));
    events(&mut p.a);
    events(&mut p.b);
    (a, b)
}

#[test]
fn api_misuse_is_a_typed_error() {
    let mut p = pair();
    let now = p.now;
    assert_eq!(p.b.listen(0x42, 4), Ok(ListenId(1)));
    assert_eq!(p.b.listen(0x42, 4), Err(CmError::AlreadyListening(0x42)));
    assert_eq!(p.b.unlisten(ListenId(9)), Err(CmError::NoSuchListener));
    let ghost = CommId(7);
    let acc = AcceptParams::new(QpNumber::new(1), Psn::new(1));
    assert_eq!(
        p.b.accept(now, ghost, &acc),
        Err(CmError::NoSuchConnection(ghost))
    );
    let a = connect(&mut p, 0x11);
    // The active side cannot accept, reject or disconnect a connection in ReqSent.
    assert_eq!(
        p.a.accept(now, a, &acc),
        Err(CmError::InvalidState(CmState::ReqSent))
    );
    assert_eq!(
        p.a.reject(now, a, RejReason::CONSUMER, &[], &[]),
        Err(CmError::InvalidState(CmState::ReqSent))
    );
    assert_eq!(
        p.a.disconnect(now, a, &[]),
        Err(CmError::InvalidState(CmState::ReqSent))
    );
    assert_eq!(
        p.a.establish(now, a),
        Err(CmError::InvalidState(CmState::ReqSent))
    );
    p.run_for(Duration::from_micros(20));
    let b = match events(&mut p.b).as_slice() {
        [CmEvent::ReqReceived { id, .. }] => *id,
        e => panic!("{e:?}"),
    };
    assert_eq!(
        p.b.reject(now, b, RejReason::CONSUMER, &[], &[0; 149]),
        Err(CmError::PrivateDataTooLong { len: 149, max: 148 })
    );
    assert_eq!(
        p.b.mra(now, b, 20, &[0; 223]),
        Err(CmError::PrivateDataTooLong { len: 223, max: 222 })
    );
    assert!(p.b.sidr_request(now, p.addr_a, 1, &[0; 217]).is_err());
}

#[test]
fn the_connection_table_is_bounded() {
    let mut p = pair();
    p.a = Cm::new(CmConfig {
        max_connections: 2,
        ..CmConfig::new(0xa)
    });
    connect(&mut p, 1);
    connect(&mut p, 2);
    let cp = ConnectParams::rc(1, p.addr_b, p.addr_a.gid, QpNumber::new(3), Psn::new(0));
    assert_eq!(
        p.a.connect(Instant::ZERO, &cp),
        Err(CmError::TooManyConnections(2))
    );
}

#[test]
fn unknown_dreq_gets_a_drep_and_unknown_rep_a_rej() {
    let mut p = pair();
    p.b.listen(0x42, 4).unwrap();
    let (a, _) = establish(&mut p, 0x11);
    // B forgets everything (a restart): A's DREQ is answered anyway, so A finishes at once.
    p.b = Cm::new(CmConfig::new(0xb));
    let now = p.now;
    p.a.disconnect(now, a, &[]).unwrap();
    p.run_for(Duration::from_micros(30));
    assert_eq!(p.sent_by(Side::B), ["REP", "DREP"]);
    assert_eq!(p.b.counters().unknown_id, 1);
    assert!(events(&mut p.a).contains(&CmEvent::Disconnected {
        id: a,
        how: DisconnectHow::DrepReceived
    }));
    // A REP for a connection A does not have: REJ (invalid communication ID).
    let rep = RepRepr {
        local_comm_id: 0x55,
        remote_comm_id: 0x66,
        ..RepRepr::default()
    };
    p.inject(
        Side::B,
        CmMadRepr::send(9, CmMessage::Rep(rep)).to_bytes().to_vec(),
    );
    p.run_for(Duration::from_micros(30));
    let last = p.trace.last().unwrap();
    assert_eq!(last.from, Side::A);
    let CmMessage::Rej(j) = last.mad.unwrap().msg else {
        panic!()
    };
    assert_eq!(
        (j.reason, j.remote_comm_id, j.message_rejected),
        (RejReason::INVALID_COMM_ID, 0x55, MsgCode::REP)
    );
}

#[test]
fn a_new_req_from_a_connected_qp_is_stale() {
    let mut p = pair();
    p.b.listen(0x42, 4).unwrap();
    let (_, b) = establish(&mut p, 0x11);
    // A restarts and connects again from the same QPN: B rejects the new REQ as stale and
    // takes the old connection down.
    p.a = Cm::new(CmConfig::new(0xa).with_seed(77));
    let a2 = connect(&mut p, 0x11);
    p.run_for(Duration::from_micros(30));
    assert!(matches!(
        events(&mut p.a).as_slice(),
        [CmEvent::Rejected { id, reason: RejReason::STALE_CONNECTION, .. }] if *id == a2
    ));
    assert_eq!(p.sent_by(Side::B), ["REP", "REJ", "DREQ"]);
    // The restarted A knows nothing of the old connection and answers its DREQ at once.
    assert_eq!(p.b.state(b), Some(CmState::TimeWait));
    // The consumer never saw the stale REQ; it sees its old connection go.
    assert_eq!(
        events(&mut p.b),
        [CmEvent::Disconnected {
            id: b,
            how: DisconnectHow::DrepReceived
        }]
    );
}

#[test]
fn mismatched_ids_and_sources_are_dropped() {
    let mut p = pair();
    p.b.listen(0x42, 4).unwrap();
    let (a, b) = establish(&mut p, 0x11);
    // A DREQ naming B's connection with the wrong sender ID, and one from another address.
    let dreq = |local| {
        CmMadRepr::send(
            1,
            CmMessage::Dreq(DreqRepr {
                local_comm_id: local,
                remote_comm_id: b.0,
                ..DreqRepr::default()
            }),
        )
        .to_bytes()
    };
    p.inject(Side::A, dreq(a.0 ^ 1).to_vec());
    p.run_for(Duration::from_micros(30));
    let now = p.now;
    p.b.handle_mad(now, MadAddr::gsi(Gid([9; 16])), &dreq(a.0));
    assert_eq!(p.b.counters().mismatched, 2);
    assert_eq!(p.b.state(b), Some(CmState::Established));
    assert!(events(&mut p.b).is_empty());
}

/// perftest -R's sequence (the CI failure: REJ 8, then perftest crashed in its retry): A
/// connects to B's service (the exchange connection), B destroys its listener, the two
/// exchange data, and A connects to the same service again before B listens again. B
/// holds that REQ for a listener instead of rejecting it, and takes it when the listener
/// comes; a REQ retransmitted for the first connection after the listener went is a
/// duplicate, not a REQ for a service nobody serves.
#[test]
fn a_connected_peer_s_req_waits_for_the_next_listener() {
    let mut p = pair();
    let l = p.b.listen(0x42, 4).unwrap();
    let (_, b1) = establish(&mut p, 0x11);
    p.b.unlisten(l).unwrap();
    // The first connection's REQ once more (a late retransmission): a duplicate.
    let req1 = p
        .trace
        .iter()
        .find(|e| e.name() == "REQ")
        .and_then(|e| e.mad)
        .unwrap();
    p.inject(Side::A, req1.to_bytes().to_vec());
    p.run_for(Duration::from_micros(30));
    assert_eq!(p.count(Side::B, "REJ"), 0);
    assert_eq!(p.b.counters().duplicates, 1);
    assert_eq!(p.b.state(b1), Some(CmState::Established));
    // The second connection's REQ comes before B listens again: no REJ, held.
    let a2 = connect(&mut p, 0x12);
    p.run_for(Duration::from_millis(10));
    assert_eq!(p.count(Side::B, "REJ"), 0, "{:?}", p.sent_by(Side::B));
    assert_eq!(p.b.counters().held_for_listener, 1);
    assert!(events(&mut p.a).is_empty());
    assert!(events(&mut p.b).is_empty());
    // B listens: the REQ is taken as if it had just come, and the connection is made with
    // the REQ A sent once (no retransmission).
    let l2 = p.b.listen(0x42, 4).unwrap();
    p.run_for(Duration::from_micros(30));
    let b2 = match events(&mut p.b).as_slice() {
        [CmEvent::ReqReceived { id, listen, .. }] if *listen == l2 => *id,
        e => panic!("{e:?}"),
    };
    let now = p.now;
    p.b.accept(
        now,
        b2,
        &AcceptParams::new(QpNumber::new(0x912), Psn::new(9)),
    )
    .unwrap();
    p.run_for(Duration::from_micros(30));
    assert!(matches!(
        events(&mut p.a).as_slice(),
        [CmEvent::RepReceived { id, .. }] if *id == a2
    ));
    let now = p.now;
    p.a.establish(now, a2).unwrap();
    p.run_for(Duration::from_micros(30));
    assert_eq!(p.b.state(b2), Some(CmState::Established));
    assert_eq!(p.count(Side::A, "REQ"), 2);
    assert_eq!(p.b.counters().no_listener, 0);
}

/// A held REQ that no listener comes for is rejected (Invalid Service ID) when its grace
/// ends: within the time the REQ gives B to answer, so A never sent it again.
#[test]
fn a_held_req_is_rejected_when_no_listener_comes() {
    let mut p = pair();
    let l = p.b.listen(0x42, 4).unwrap();
    establish(&mut p, 0x11);
    p.b.unlisten(l).unwrap();
    let start = p.now;
    let a2 = connect(&mut p, 0x12);
    // The grace: the REQ's Remote CM Response Timeout (14: 67 ms) here, below 2 s.
    let grace = iba_time(14);
    p.run_for(grace - Duration::from_millis(1));
    assert_eq!(p.count(Side::B, "REJ"), 0);
    p.run_for(Duration::from_millis(2));
    let rej = p.trace.iter().find(|e| e.name() == "REJ").unwrap();
    assert!(rej.at >= start + grace, "REJ at {:?}", rej.at);
    assert!(matches!(
        events(&mut p.a).as_slice(),
        [CmEvent::Rejected { id, reason: RejReason::INVALID_SERVICE_ID, .. }] if *id == a2
    ));
    assert_eq!(p.count(Side::A, "REQ"), 2, "one REQ for each connection");
    assert_eq!(p.b.counters().no_listener, 1);
    assert!(events(&mut p.b).is_empty());
}

/// A peer without an established connection here is rejected at once, as Linux does (a
/// REQ to a port where nothing listens: one round trip), and so is everyone with a zero
/// grace; a SIDR_REQ from a connected peer waits for the listener like a REQ.
#[test]
fn only_connected_peers_wait_for_a_listener() {
    let mut p = pair();
    connect(&mut p, 0x11);
    p.run_for(Duration::from_micros(30));
    assert_eq!(p.sent_by(Side::B), ["REJ"]);
    assert_eq!(p.b.counters().held_for_listener, 0);
    // Connected, but B's grace is zero: at once too.
    let mut p = pair();
    p.b = Cm::new(CmConfig {
        listen_grace: Duration::ZERO,
        ..*p.b.config()
    });
    let l = p.b.listen(0x42, 4).unwrap();
    establish(&mut p, 0x11);
    p.b.unlisten(l).unwrap();
    connect(&mut p, 0x12);
    p.run_for(Duration::from_micros(30));
    assert_eq!(p.count(Side::B, "REJ"), 1);
    // SIDR (perftest -c UD -R): held, then served by the new listener.
    let mut p = pair();
    let l = p.b.listen(0x42, 4).unwrap();
    establish(&mut p, 0x11);
    p.b.unlisten(l).unwrap();
    let (now, dest) = (p.now, p.addr_b);
    let s = p.a.sidr_request(now, dest, 0x77, &[]).unwrap();
    p.run_for(Duration::from_millis(5));
    assert_eq!(p.count(Side::B, "SIDR_REP"), 0);
    let l2 = p.b.listen(0x77, 4).unwrap();
    p.run_for(Duration::from_micros(30));
    let sb = match events(&mut p.b).as_slice() {
        [CmEvent::SidrReqReceived { id, listen, .. }] if *listen == l2 => *id,
        e => panic!("{e:?}"),
    };
    let now = p.now;
    p.b.sidr_reply(
        now,
        sb,
        SidrStatus::SUCCESS,
        QpNumber::new(0x55),
        0x1111_2222,
        &[],
    )
    .unwrap();
    p.run_for(Duration::from_micros(30));
    assert!(matches!(
        events(&mut p.a).as_slice(),
        [CmEvent::SidrRepReceived { id, rep }] if *id == s && rep.status == SidrStatus::SUCCESS
    ));
    assert_eq!(p.count(Side::A, "SIDR_REQ"), 1);
}

/// qperf's server binds its port, sends the port to its client over TCP and only then
/// listens: a REQ that comes in between, from a peer with no connection here, finds the
/// service reserved and waits for the listener (no REJ, no retransmission); once the
/// reservation is given back, such a REQ is rejected at once again.
#[test]
fn a_req_for_a_reserved_service_waits_for_its_listener() {
    let mut p = pair();
    p.b.reserve(0x42);
    let a = connect(&mut p, 0x11);
    p.run_for(Duration::from_millis(10));
    assert_eq!(p.count(Side::B, "REJ"), 0, "{:?}", p.sent_by(Side::B));
    assert_eq!(p.b.counters().held_for_listener, 1);
    let l = p.b.listen(0x42, 4).unwrap();
    p.run_for(Duration::from_micros(30));
    let b = match events(&mut p.b).as_slice() {
        [CmEvent::ReqReceived { id, listen, .. }] if *listen == l => *id,
        e => panic!("{e:?}"),
    };
    let now = p.now;
    p.b.accept(
        now,
        b,
        &AcceptParams::new(QpNumber::new(0x911), Psn::new(9)),
    )
    .unwrap();
    p.run_for(Duration::from_micros(30));
    assert!(matches!(
        events(&mut p.a).as_slice(),
        [CmEvent::RepReceived { id, .. }] if *id == a
    ));
    assert_eq!(p.count(Side::A, "REQ"), 1);
    assert_eq!(p.b.counters().no_listener, 0);
    // Reserved twice, given back twice: a REQ for another service that nobody reserved is
    // answered at once, and so is one for 0x43 once its reservations are gone.
    let mut p = pair();
    p.b.reserve(0x43);
    p.b.reserve(0x43);
    p.b.release(0x43);
    let cp = |sid| {
        ConnectParams::rc(
            sid,
            p.addr_b,
            p.addr_a.gid,
            QpNumber::new(0x12),
            Psn::new(5),
        )
    };
    let (c43, c44) = (cp(0x43), cp(0x44));
    let now = p.now;
    p.a.connect(now, &c44).unwrap();
    p.run_for(Duration::from_micros(30));
    assert_eq!(p.count(Side::B, "REJ"), 1);
    let now = p.now;
    p.a.connect(now, &c43).unwrap();
    p.run_for(Duration::from_micros(30));
    assert_eq!(p.count(Side::B, "REJ"), 1, "0x43 still reserved once");
    p.b.release(0x43);
    let mut c = c43;
    c.local_qpn = QpNumber::new(0x13);
    let now = p.now;
    p.a.connect(now, &c).unwrap();
    p.run_for(Duration::from_micros(30));
    assert_eq!(p.count(Side::B, "REJ"), 2);
    assert_eq!(p.b.counters().held_for_listener, 1);
}

#[test]
fn passive_side_gives_up_on_a_consumer_that_never_answers() {
    let mut p = pair();
    let l = p.b.listen(0x42, 4).unwrap();
    connect(&mut p, 0x11);
    // Nobody answers B's events; A retries (auto-MRA stretches its wait) and B expires the
    // request after the active side's whole patience.
    p.run_for(Duration::from_secs(600));
    let ev = events(&mut p.b);
    assert!(
        matches!(
            ev.last(),
            Some(CmEvent::TimedOut {
                waiting: Waiting::Consumer,
                ..
            })
        ),
        "{ev:?}"
    );
    assert_eq!(p.b.pending(l), Some(0));
    assert_eq!(p.b.connection_count(), 0);
    assert!(matches!(
        events(&mut p.a).last(),
        Some(CmEvent::Rejected {
            reason: RejReason::TIMEOUT,
            ..
        })
    ));
}

#[test]
fn timers_are_one_per_object_and_cleared() {
    let mut p = pair();
    p.b.listen(0x42, 4).unwrap();
    let (a, _) = establish(&mut p, 0x11);
    assert_eq!(
        p.a.poll_timeout(),
        None,
        "an established connection has no timer"
    );
    let now = p.now;
    p.a.disconnect(now, a, &[]).unwrap();
    assert_eq!(p.a.timers.len(), 1);
    // Nobody answers B's DreqReceived: after the peer's patience B answers by itself.
    p.run_for(Duration::from_secs(10));
    assert_eq!(p.sent_by(Side::B), ["REP", "DREP"]);
    assert!(p.a.timers.is_empty() && p.b.timers.is_empty());
    assert_eq!(p.a.connection_count() + p.b.connection_count(), 0);
}

/// The state table: every state of each side × every message the peer can send, with the
/// state after it, what is sent back and what the consumer is told. The expected table is
/// written from the IBTA's state diagrams (§12.9.8) and the choices documented in `ib.rs`
/// (automatic MRA on duplicates, REJ for REQs to stale connections), not from the code.
mod table {
    use super::*;

    const PEER: u32 = 0x7777_0001;
    const PEER_GUID: u64 = 0x0202;
    const MSGS_ACTIVE: [&str; 7] = ["MRA(REQ)", "MRA(REP)", "REJ", "REP", "RTU", "DREQ", "DREP"];
    const MSGS_PASSIVE: [&str; 8] = [
        "REQ", "MRA(REQ)", "MRA(REP)", "REJ", "REP", "RTU", "DREQ", "DREP",
    ];

    fn peer() -> MadAddr {
        MadAddr::gsi(Gid::from_ip("10.0.0.9".parse().unwrap()))
    }

    fn cm() -> Cm {
        Cm::new(CmConfig::new(0x0101).with_seed(5))
    }

    fn req() -> ReqRepr {
        ReqRepr {
            local_comm_id: PEER,
            service_id: 0x42,
            local_ca_guid: PEER_GUID,
            local_qpn: QpNumber::new(0x33),
            max_cm_retries: 3,
            remote_cm_response_timeout: 14,
            local_cm_response_timeout: 14,
            ..ReqRepr::default()
        }
    }

    fn msg(name: &str, me: u32) -> CmMessage {
        let (l, r) = (PEER, me);
        match name {
            "REQ" => CmMessage::Req(req()),
            "MRA(REQ)" | "MRA(REP)" => CmMessage::Mra(MraRepr {
                local_comm_id: l,
                remote_comm_id: r,
                message_mraed: if name == "MRA(REQ)" {
                    MsgCode::REQ
                } else {
                    MsgCode::REP
                },
                service_timeout: 20,
                ..MraRepr::default()
            }),
            "REJ" => CmMessage::Rej(RejRepr {
                local_comm_id: l,
                remote_comm_id: r,
                reason: RejReason::CONSUMER,
                ..RejRepr::default()
            }),
            "REP" => CmMessage::Rep(RepRepr {
                local_comm_id: l,
                remote_comm_id: r,
                local_qpn: QpNumber::new(0x33),
                local_ca_guid: PEER_GUID,
                ..RepRepr::default()
            }),
            "RTU" => CmMessage::Rtu(RtuRepr {
                local_comm_id: l,
                remote_comm_id: r,
                ..RtuRepr::default()
            }),
            "DREQ" => CmMessage::Dreq(DreqRepr {
                local_comm_id: l,
                remote_comm_id: r,
                ..DreqRepr::default()
            }),
            "DREP" => CmMessage::Drep(DrepRepr {
                local_comm_id: l,
                remote_comm_id: r,
                ..DrepRepr::default()
            }),
            _ => unreachable!(),
        }
    }

    fn feed(cm: &mut Cm, name: &str, me: u32) {
        let b = CmMadRepr::send(9, msg(name, me)).to_bytes();
        cm.handle_mad(Instant::ZERO, peer(), &b);
    }

    fn drain(cm: &mut Cm) {
        while cm.poll_transmit(Instant::ZERO).is_some() {}
        while cm.poll_event().is_some() {}
    }

    /// An active-side CM in `state`, and its connection.
    fn active(state: CmState) -> (Cm, u32) {
        let mut cm = cm();
        let cp = ConnectParams::rc(
            0x42,
            peer(),
            Gid::default(),
            QpNumber::new(0x11),
            Psn::new(1),
        );
        let id = cm.connect(Instant::ZERO, &cp).unwrap().0;
        let steps: &[&str] = match state {
            CmState::ReqSent => &[],
            CmState::MraReqRcvd => &["MRA(REQ)"],
            CmState::RepRcvd => &["REP"],
            CmState::MraRepSent => &["REP", "mra"],
            CmState::Established => &["REP", "establish"],
            CmState::DreqSent => &["REP", "establish", "disconnect"],
            CmState::DreqRcvd => &["REP", "establish", "DREQ"],
            CmState::TimeWait => &["REP", "establish", "disconnect", "DREP"],
            s => panic!("{s:?} is not an active-side state"),
        };
        run(&mut cm, id, steps);
        assert_eq!(cm.state(CommId(id)), Some(state));
        (cm, id)
    }

    /// A passive-side CM in `state`, and its connection.
    fn passive(state: CmState) -> (Cm, u32) {
        let mut cm = cm();
        cm.listen(0x42, 4).unwrap();
        feed(&mut cm, "REQ", 0);
        let Some(CmEvent::ReqReceived { id, .. }) = cm.poll_event() else {
            panic!()
        };
        let steps: &[&str] = match state {
            CmState::ReqRcvd => &[],
            CmState::MraReqSent => &["mra"],
            CmState::RepSent => &["accept"],
            CmState::MraRepRcvd => &["accept", "MRA(REP)"],
            CmState::Established => &["accept", "RTU"],
            CmState::DreqSent => &["accept", "RTU", "disconnect"],
            CmState::DreqRcvd => &["accept", "RTU", "DREQ"],
            CmState::TimeWait => &["accept", "RTU", "disconnect", "DREP"],
            s => panic!("{s:?} is not a passive-side state"),
        };
        run(&mut cm, id.0, steps);
        assert_eq!(cm.state(id), Some(state));
        (cm, id.0)
    }

    fn run(cm: &mut Cm, id: u32, steps: &[&str]) {
        let (t, c) = (Instant::ZERO, CommId(id));
        for s in steps {
            match *s {
                "mra" => cm.mra(t, c, 20, &[]).unwrap(),
                "establish" => cm.establish(t, c).unwrap(),
                "disconnect" => cm.disconnect(t, c, &[]).unwrap(),
                "accept" => {
                    cm.accept(t, c, &AcceptParams::new(QpNumber::new(0x44), Psn::new(2)))
                        .unwrap();
                }
                m => feed(cm, m, id),
            }
        }
        drain(cm);
    }

    fn outcome(mut cm: Cm, id: u32, m: &str) -> String {
        feed(&mut cm, m, id);
        let state = cm
            .state(CommId(id))
            .map_or("gone".to_string(), |s| format!("{s:?}"));
        let sent: Vec<&str> = std::iter::from_fn(|| cm.poll_transmit(Instant::ZERO))
            .map(|t| CmMadRepr::parse(&t.mad).unwrap().msg.short_name())
            .collect();
        let events: Vec<String> = std::iter::from_fn(|| cm.poll_event())
            .map(|e| {
                format!("{e:?}")
                    .split([' ', '{'])
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect();
        format!("{state} {sent:?} {events:?}")
    }

    fn check(rows: &[(CmState, [&str; 8])], msgs: &[&str], make: impl Fn(CmState) -> (Cm, u32)) {
        let mut wrong = Vec::new();
        for (state, expect) in rows {
            for (m, want) in msgs.iter().zip(expect) {
                let (cm, id) = make(*state);
                let got = outcome(cm, id, m);
                if got != *want {
                    wrong.push(format!("{state:?} + {m}: want {want}, got {got}"));
                }
            }
        }
        assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
    }

    #[test]
    fn active_side() {
        use CmState::*;
        // MRA(REQ), MRA(REP), REJ, REP, RTU, DREQ, DREP (the 8th column is unused).
        #[rustfmt::skip]
        let rows: [(CmState, [&str; 8]); 8] = [
            (ReqSent, ["MraReqRcvd [] [\"MraReceived\"]", "ReqSent [] []", "gone [] [\"Rejected\"]",
                "RepRcvd [] [\"RepReceived\"]", "ReqSent [] []", "ReqSent [] []", "ReqSent [] []", ""]),
            (MraReqRcvd, ["MraReqRcvd [] [\"MraReceived\"]", "MraReqRcvd [] []", "gone [] [\"Rejected\"]",
                "RepRcvd [] [\"RepReceived\"]", "MraReqRcvd [] []", "MraReqRcvd [] []", "MraReqRcvd [] []", ""]),
            (RepRcvd, ["RepRcvd [] []", "RepRcvd [] []", "gone [] [\"Rejected\"]",
                "MraRepSent [\"MRA\"] []", "RepRcvd [] []", "RepRcvd [] []", "RepRcvd [] []", ""]),
            (MraRepSent, ["MraRepSent [] []", "MraRepSent [] []", "gone [] [\"Rejected\"]",
                "MraRepSent [\"MRA\"] []", "MraRepSent [] []", "MraRepSent [] []", "MraRepSent [] []", ""]),
            (Established, ["Established [] []", "Established [] []", "TimeWait [] [\"Rejected\"]",
                "Established [\"RTU\"] []", "Established [] []", "DreqRcvd [] [\"DreqReceived\"]",
                "Established [] []", ""]),
            (DreqSent, ["DreqSent [] []", "DreqSent [] []", "TimeWait [] [\"Rejected\"]",
                "DreqSent [] []", "DreqSent [] []", "TimeWait [\"DREP\"] [\"Disconnected\"]",
                "TimeWait [] [\"Disconnected\"]", ""]),
            (DreqRcvd, ["DreqRcvd [] []", "DreqRcvd [] []", "TimeWait [] [\"Rejected\"]",
                "DreqRcvd [] []", "DreqRcvd [] []", "DreqRcvd [] []", "DreqRcvd [] []", ""]),
            (TimeWait, ["TimeWait [] []", "TimeWait [] []", "TimeWait [] []", "TimeWait [] []",
                "TimeWait [] []", "TimeWait [\"DREP\"] []", "TimeWait [] []", ""]),
        ];
        check(&rows, &MSGS_ACTIVE, active);
    }

    #[test]
    fn passive_side() {
        use CmState::*;
        // REQ (a duplicate), MRA(REQ), MRA(REP), REJ, REP, RTU, DREQ, DREP.
        #[rustfmt::skip]
        let rows: [(CmState, [&str; 8]); 8] = [
            (ReqRcvd, ["MraReqSent [\"MRA\"] []", "ReqRcvd [] []", "ReqRcvd [] []", "gone [] [\"Rejected\"]",
                "ReqRcvd [] []", "ReqRcvd [] []", "ReqRcvd [] []", "ReqRcvd [] []"]),
            (MraReqSent, ["MraReqSent [\"MRA\"] []", "MraReqSent [] []", "MraReqSent [] []",
                "gone [] [\"Rejected\"]", "MraReqSent [] []", "MraReqSent [] []", "MraReqSent [] []",
                "MraReqSent [] []"]),
            (RepSent, ["RepSent [\"REP\"] []", "RepSent [] []", "MraRepRcvd [] []", "gone [] [\"Rejected\"]",
                "RepSent [] []", "Established [] [\"Established\"]", "DreqRcvd [] [\"DreqReceived\"]",
                "RepSent [] []"]),
            (MraRepRcvd, ["MraRepRcvd [\"REP\"] []", "MraRepRcvd [] []", "MraRepRcvd [] []",
                "gone [] [\"Rejected\"]", "MraRepRcvd [] []", "Established [] [\"Established\"]",
                "DreqRcvd [] [\"DreqReceived\"]", "MraRepRcvd [] []"]),
            (Established, ["Established [] []", "Established [] []", "Established [] []",
                "TimeWait [] [\"Rejected\"]", "Established [] []", "Established [] []",
                "DreqRcvd [] [\"DreqReceived\"]", "Established [] []"]),
            (DreqSent, ["DreqSent [] []", "DreqSent [] []", "DreqSent [] []", "TimeWait [] [\"Rejected\"]",
                "DreqSent [] []", "DreqSent [] []", "TimeWait [\"DREP\"] [\"Disconnected\"]",
                "TimeWait [] [\"Disconnected\"]"]),
            (DreqRcvd, ["DreqRcvd [] []", "DreqRcvd [] []", "DreqRcvd [] []", "TimeWait [] [\"Rejected\"]",
                "DreqRcvd [] []", "DreqRcvd [] []", "DreqRcvd [] []", "DreqRcvd [] []"]),
            (TimeWait, ["TimeWait [\"REJ\"] []", "TimeWait [] []", "TimeWait [] []", "TimeWait [] []",
                "TimeWait [] []", "TimeWait [] []", "TimeWait [\"DREP\"] []", "TimeWait [] []"]),
        ];
        check(&rows, &MSGS_PASSIVE, passive);
    }
}

/// Found by the CM fuzz target (issue 17): a consumer answering a SIDR_REQ after it stopped
/// listening on the service made `sidr_reply` panic ("a pending request has a service ID").
/// The answer carries the request's service ID.
#[test]
fn a_sidr_reply_after_unlisten_is_answered_not_a_panic() {
    let mut p = pair();
    let listen = p.b.listen(0x42, 4).unwrap();
    let now = p.now;
    let dest = p.addr_b;
    p.a.sidr_request(now, dest, 0x42, &[]).unwrap();
    p.run_for(Duration::from_micros(20));
    let id = match events(&mut p.b).as_slice() {
        [CmEvent::SidrReqReceived { id, .. }] => *id,
        e => panic!("{e:?}"),
    };
    p.b.unlisten(listen).unwrap();
    let now = p.now;
    p.b.sidr_reply(
        now,
        id,
        SidrStatus::SUCCESS,
        QpNumber::new(0x77),
        0x1234,
        &[],
    )
    .unwrap();
    p.run_for(Duration::from_micros(20));
    match events(&mut p.a).as_slice() {
        [CmEvent::SidrRepReceived { rep, .. }] => {
            assert_eq!(rep.service_id, 0x42);
            assert_eq!(rep.qpn, QpNumber::new(0x77));
        }
        e => panic!("{e:?}"),
    }
}

/// A CM with a block of IDs (a device sharing its port, `crate::io::share`) makes every
/// Local Communication ID and SIDR Request ID with the block as its top byte, each fresh;
/// block 0 never makes ID 0; without a block the IDs spread over all 32 bits.
#[test]
fn ids_of_a_block_carry_it_in_their_top_byte() {
    let mut keys = KeyGen::new(Some(3));
    let mut seen = std::collections::HashSet::new();
    for _ in 0..2000 {
        let id = fresh_id(&mut keys, Some(0xab), |k| seen.contains(&k));
        assert_eq!(id >> 24, 0xab);
        assert!(seen.insert(id));
    }
    for _ in 0..2000 {
        assert_ne!(fresh_id(&mut keys, Some(0), |_| false), 0);
    }
    let tops: std::collections::HashSet<u32> = (0..2000)
        .map(|_| fresh_id(&mut keys, None, |_| false) >> 24)
        .collect();
    assert!(tops.len() > 200, "{}", tops.len());
    // Through the CM: a REQ's Local Communication ID.
    let mut cfg = CmConfig::new(1);
    cfg.id_block = Some(0x42);
    let mut p = pair();
    p.a = Cm::new(cfg.with_seed(9));
    let cp = ConnectParams::rc(1, p.addr_b, p.addr_a.gid, QpNumber::new(3), Psn::new(0));
    let id = p.a.connect(Instant::ZERO, &cp).unwrap();
    assert_eq!(id.0 >> 24, 0x42);
}
