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
