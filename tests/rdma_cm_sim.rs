//! RDMA-CM (src/cm/rdma.rs) in the seeded simulator: two RdmaCm endpoints (A 10.0.0.1,
//! B 10.0.0.2) joined by the network, a driver that answers address and route resolution as
//! the kernel would, and librdmacm's call sequences: rping's (RC, TCP port space) and
//! perftest's UD -R (SIDR, UDP port space).

use ferroce::cm::rdma::{
    errno, ConnParam, Event, EventType, IdState, RdmaCm, RdmaCmError, RdmaId, Request, Route,
};
use ferroce::cm::CmConfig;
use ferroce::sim::cm::{CmPair, Side};
use ferroce::time::{Duration, Instant};
use ferroce::wire::mad::cm::{CmMadRepr, CmMessage, PathMtu};
use ferroce::wire::mad::rdma_cm::{HeaderRepr, PortSpace};
use ferroce::wire::{Psn, QpNumber};
use std::net::{IpAddr, SocketAddr};

const A_IP: &str = "10.0.0.1";
const B_IP: &str = "10.0.0.2";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}
fn sa(s: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip(s), port)
}

fn config(guid: u64, seed: u64) -> CmConfig {
    CmConfig {
        cm_response_timeout: 14,
        packet_lifetime: 10,
        max_cm_retries: 3,
        ..CmConfig::new(guid)
    }
    .with_seed(seed)
}

struct Test {
    p: CmPair<RdmaCm>,
    /// Answer resolution requests (false: leave them unanswered).
    answer: bool,
    flow_label: u32,
}

impl Test {
    fn new() -> Self {
        Self::with(RdmaCm::new(config(0xa, 1)), RdmaCm::new(config(0xb, 2)))
    }
    fn with(a: RdmaCm, b: RdmaCm) -> Self {
        Test {
            p: CmPair::new(a, b, 7, CmPair::<RdmaCm>::clean_link()),
            answer: true,
            flow_label: 0,
        }
    }

    /// The kernel's part: A reaches only B and B only A.
    fn serve(&mut self) {
        if !self.answer {
            return;
        }
        let now = self.p.now;
        for (side, me, peer) in [(Side::A, A_IP, B_IP), (Side::B, B_IP, A_IP)] {
            let fl = self.flow_label;
            let cm = self.p.side(side);
            while let Some(r) = cm.poll_request() {
                match r {
                    Request::ResolveAddr { id, dst, .. } => {
                        let res = if dst == ip(peer) {
                            Ok(ip(me))
                        } else {
                            Err(errno::EHOSTUNREACH)
                        };
                        // A request may be stale (its id timed out meanwhile): refused then.
                        let _ = cm.complete_addr(now, id, res);
                    }
                    Request::ResolveRoute { id, src, dst } => {
                        let mut r = Route::roce(src, dst, PathMtu::M1024);
                        r.flow_label = fl;
                        let _ = cm.complete_route(now, id, Ok(r));
                    }
                }
            }
        }
    }

    /// Step until `side` has an event (at most `limit` of virtual time).
    fn event(&mut self, side: Side, limit: Duration) -> Option<Event> {
        let end = self.p.now + limit;
        loop {
            self.serve();
            if let Some(e) = self.p.side(side).poll_event() {
                return Some(e);
            }
            if !self.p.step_until(end) {
                self.serve();
                return self.p.side(side).poll_event();
            }
        }
    }

    fn expect(&mut self, side: Side, kind: EventType) -> Event {
        let e = self
            .event(side, Duration::from_secs(600))
            .unwrap_or_else(|| panic!("{side:?}: no event, {kind:?} expected"));
        assert_eq!(e.kind, kind, "{side:?}: {e:?}");
        e
    }

    fn no_event(&mut self, side: Side) {
        let e = self.event(side, Duration::from_secs(600));
        assert!(e.is_none(), "{side:?}: {e:?}");
    }

    fn listener(&mut self, ps: PortSpace, addr: SocketAddr, backlog: usize) -> RdmaId {
        let b = &mut self.p.b;
        let l = b.create_id(ps);
        b.bind_addr(l, addr).unwrap();
        b.listen(l, backlog).unwrap();
        assert_eq!(b.state(l), Some(IdState::Listen));
        l
    }

    /// A: resolve B's address and route.
    fn resolved(&mut self, ps: PortSpace, port: u16) -> RdmaId {
        self.resolved_with(ps, port, |_, _| {})
    }

    /// [`Test::resolved`], calling `between` on A's CM once the address is resolved and before
    /// the route is (where librdmacm programs set their id's options).
    fn resolved_with(
        &mut self,
        ps: PortSpace,
        port: u16,
        between: impl FnOnce(&mut RdmaCm, RdmaId),
    ) -> RdmaId {
        let now = self.p.now;
        let a = &mut self.p.a;
        let id = a.create_id(ps);
        a.resolve_addr(now, id, None, sa(B_IP, port), Duration::from_secs(2))
            .unwrap();
        assert_eq!(a.state(id), Some(IdState::AddrQuery));
        self.expect(Side::A, EventType::AddrResolved);
        assert_eq!(self.p.a.state(id), Some(IdState::AddrResolved));
        between(&mut self.p.a, id);
        let now = self.p.now;
        self.p
            .a
            .resolve_route(now, id, Duration::from_secs(2))
            .unwrap();
        self.expect(Side::A, EventType::RouteResolved);
        assert_eq!(self.p.a.state(id), Some(IdState::RouteResolved));
        id
    }
}

#[test]
fn rping_sequence_rc() {
    let mut t = Test::new();
    let l = t.listener(PortSpace::TCP, sa("0.0.0.0", 7174), 4);
    let a = t.resolved(PortSpace::TCP, 7174);
    let a_addr = t.p.a.local_addr(a).unwrap();
    assert_eq!(a_addr.ip(), ip(A_IP));
    assert!(
        (32768..=60999).contains(&a_addr.port()),
        "ephemeral port {a_addr}"
    );
    let now = t.p.now;
    let user = [0x5au8; 56];
    t.p.a
        .connect(
            now,
            a,
            &ConnParam::new(QpNumber::new(0x11), Psn::new(0x91d944), &user),
        )
        .unwrap();
    // B: CONNECT_REQUEST on a new id, the listener's child, with the application's data.
    let req = t.expect(Side::B, EventType::ConnectRequest);
    assert_eq!(req.listen_id, Some(l));
    assert_ne!(req.id, l);
    assert_eq!(req.private_data(), &user[..]);
    assert_eq!(req.qp_num, Some(QpNumber::new(0x11)));
    assert_eq!((req.responder_resources, req.initiator_depth), (1, 1));
    assert_eq!(t.p.b.peer_addr(req.id), Some(a_addr));
    assert_eq!(t.p.b.local_addr(req.id), Some(sa(B_IP, 7174)));
    // The REQ on the wire: service ID and header as rdma_cm builds them.
    let CmMessage::Req(q) = t.p.trace[0].mad.unwrap().msg else {
        panic!()
    };
    assert_eq!(q.service_id, 0x0000_0000_0106_1c06);
    let h = HeaderRepr::parse(&q.private_data).unwrap();
    assert_eq!(
        (h.src_ip, h.src_port, h.dst_ip),
        (ip(A_IP), a_addr.port(), ip(B_IP))
    );
    assert_eq!(&q.private_data[36..], &user[..]);

    let now = t.p.now;
    let qp_b =
        t.p.b
            .accept(
                now,
                req.id,
                &ConnParam::new(QpNumber::new(0x22), Psn::new(0x96d5be), b"ok"),
            )
            .unwrap()
            .unwrap();
    assert_eq!(qp_b.remote_qpn, QpNumber::new(0x11));
    assert_eq!(qp_b.rq_psn, Psn::new(0x91d944));
    // A: CONNECT_RESPONSE with what its QP needs; RTR/RTS; establish.
    let resp = t.expect(Side::A, EventType::ConnectResponse);
    let qp_a = resp.qp.unwrap();
    assert_eq!(qp_a.remote_qpn, QpNumber::new(0x22));
    assert_eq!(qp_a.rq_psn, Psn::new(0x96d5be));
    assert_eq!(&resp.private_data()[..2], b"ok");
    let now = t.p.now;
    t.p.a.establish(now, a).unwrap();
    assert_eq!(t.expect(Side::A, EventType::Established).qp, Some(qp_a));
    assert_eq!(t.expect(Side::B, EventType::Established).qp, Some(qp_b));
    assert_eq!(t.p.a.state(a), Some(IdState::Connect));

    // rping's end: the client disconnects; the server sees DISCONNECTED and disconnects too.
    let now = t.p.now;
    t.p.a.disconnect(now, a).unwrap();
    assert_eq!(t.p.a.state(a), Some(IdState::Disconnect));
    let d = t.expect(Side::B, EventType::Disconnected);
    assert_eq!(d.id, req.id);
    let now = t.p.now;
    t.p.b.disconnect(now, req.id).unwrap();
    t.expect(Side::A, EventType::Disconnected);
    t.expect(Side::A, EventType::TimewaitExit);
    t.expect(Side::B, EventType::TimewaitExit);
    t.no_event(Side::A);
    t.no_event(Side::B);
    assert_eq!(t.p.sent_by(Side::A), ["REQ", "RTU", "DREQ"]);
    assert_eq!(t.p.sent_by(Side::B), ["REP", "DREP"]);
    let now = t.p.now;
    t.p.a.destroy_id(now, a).unwrap();
    t.p.b.destroy_id(now, req.id).unwrap();
    t.p.b.destroy_id(now, l).unwrap();
    assert_eq!(t.p.a.id_count() + t.p.b.id_count(), 0);
    assert_eq!(
        t.p.a.ib().connection_count() + t.p.b.ib().connection_count(),
        0
    );
}

/// The REQ ferroce sends for rping's connection, byte for byte against the one Linux sent
/// (captures/rxe-reference/rping.pcap frame 14, the same addresses, port, QPN, PSN, CA GUID,
/// flow label and a packet lifetime giving the same ACK timeout): equal except the
/// transaction ID and the communication ID, which are random by design.
#[test]
fn the_req_is_linuxs_req() {
    let linux = hex(concat!(
        "0107020300000000000000029b59a9ca0010000000000000caa9599b000000000000000001061c06",
        "505400fffe77000c00000000000000000000110100000001000000a091d944a7ffff37f0ffffffff",
        "00000000000000000000ffff0a4d000c00000000000000000000ffff0a4d000b6715800000400098",
        "00000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000040b86e0000000000000000000000000a4d000c0000000000000000000000000a4d000b"
    ));
    let cfg = CmConfig {
        packet_lifetime: 17,
        ..CmConfig::new(0x5054_00ff_fe77_000c)
    }
    .with_seed(3);
    let mut cm = RdmaCm::new(cfg);
    let now = Instant::ZERO;
    let id = cm.create_id(PortSpace::TCP);
    cm.bind_addr(id, sa("10.77.0.12", 0xb86e)).unwrap();
    cm.resolve_addr(
        now,
        id,
        None,
        sa("10.77.0.11", 7174),
        Duration::from_secs(1),
    )
    .unwrap();
    assert!(matches!(
        cm.poll_request(),
        Some(Request::ResolveAddr { .. })
    ));
    cm.complete_addr(now, id, Ok(ip("10.77.0.12"))).unwrap();
    cm.resolve_route(now, id, Duration::from_secs(1)).unwrap();
    let mut route = Route::roce(ip("10.77.0.12"), ip("10.77.0.11"), PathMtu::M1024);
    route.flow_label = 0x67158;
    cm.poll_request();
    cm.complete_route(now, id, Ok(route)).unwrap();
    cm.connect(
        now,
        id,
        &ConnParam::new(QpNumber::new(0x11), Psn::new(0x91d944), &[]),
    )
    .unwrap();
    let ours = cm.poll_transmit(now).unwrap();
    assert_eq!(ours.dest.gid.to_string(), "10.77.0.11");
    let mine = ours.mad;
    let differ: Vec<usize> = (0..256).filter(|&i| mine[i] != linux[i]).collect();
    assert!(
        differ
            .iter()
            .all(|&i| (8..16).contains(&i) || (24..28).contains(&i)),
        "bytes {differ:?} differ"
    );
    // The random fields are random: not Linux's.
    assert!(differ.iter().any(|&i| (24..28).contains(&i)));
}

fn hex(s: &str) -> [u8; 256] {
    let mut b = [0u8; 256];
    for (i, c) in s.as_bytes().chunks(2).enumerate() {
        b[i] = u8::from_str_radix(std::str::from_utf8(c).unwrap(), 16).unwrap();
    }
    b
}

#[test]
fn nothing_listening_is_rejected_promptly_with_status_8() {
    let mut t = Test::new();
    let a = t.resolved(PortSpace::TCP, 7999);
    let start = t.p.now;
    let now = t.p.now;
    t.p.a
        .connect(now, a, &ConnParam::new(QpNumber::new(1), Psn::new(1), &[]))
        .unwrap();
    let e = t.expect(Side::A, EventType::Rejected);
    assert_eq!(
        e.status, 8,
        "what rping prints: RDMA_CM_EVENT_REJECTED, error 8"
    );
    assert_eq!(t.p.now - start, Duration::from_micros(20), "one round trip");
    assert_eq!(t.p.a.state(a), Some(IdState::Idle));
    t.no_event(Side::B);
}

#[test]
fn a_listener_on_another_address_does_not_take_the_request() {
    let mut t = Test::new();
    t.listener(PortSpace::TCP, sa("10.0.0.3", 7174), 4);
    let a = t.resolved(PortSpace::TCP, 7174);
    let now = t.p.now;
    t.p.a
        .connect(now, a, &ConnParam::new(QpNumber::new(1), Psn::new(1), &[]))
        .unwrap();
    // The service ID is listened on (the IB CM takes the REQ), but not for 10.0.0.2.
    assert_eq!(t.expect(Side::A, EventType::Rejected).status, 28);
    t.no_event(Side::B);
}

#[test]
fn consumer_reject_with_private_data() {
    let mut t = Test::new();
    t.listener(PortSpace::TCP, sa(B_IP, 7174), 4);
    let a = t.resolved(PortSpace::TCP, 7174);
    let now = t.p.now;
    t.p.a
        .connect(now, a, &ConnParam::new(QpNumber::new(1), Psn::new(1), &[]))
        .unwrap();
    let req = t.expect(Side::B, EventType::ConnectRequest);
    let now = t.p.now;
    t.p.b.reject(now, req.id, b"busy").unwrap();
    let e = t.expect(Side::A, EventType::Rejected);
    assert_eq!(e.status, 28);
    assert_eq!(&e.private_data()[..4], b"busy");
    assert_eq!(e.private_data_len, 148);
}

#[test]
fn no_answer_is_unreachable_with_etimedout() {
    let mut t = Test::new();
    t.listener(PortSpace::TCP, sa(B_IP, 7174), 4);
    t.p.set_filter(|s, m| s == Side::A && m.msg.short_name() == "REQ");
    let a = t.resolved(PortSpace::TCP, 7174);
    let now = t.p.now;
    t.p.a
        .connect(now, a, &ConnParam::new(QpNumber::new(1), Psn::new(1), &[]))
        .unwrap();
    let e = t.expect(Side::A, EventType::Unreachable);
    assert_eq!(e.status, -errno::ETIMEDOUT);
    assert_eq!(t.p.count(Side::A, "REQ"), 4);
}

#[test]
fn address_and_route_errors() {
    let mut t = Test::new();
    let now = t.p.now;
    let id = t.p.a.create_id(PortSpace::TCP);
    // No route to 10.9.9.9: ADDR_ERROR with -EHOSTUNREACH; the id can try again.
    t.p.a
        .resolve_addr(now, id, None, sa("10.9.9.9", 1), Duration::from_secs(1))
        .unwrap();
    assert_eq!(
        t.expect(Side::A, EventType::AddrError).status,
        -errno::EHOSTUNREACH
    );
    assert_eq!(t.p.a.state(id), Some(IdState::Idle));
    // The kernel never answers: ADDR_ERROR with -ETIMEDOUT at the timeout.
    t.answer = false;
    let now = t.p.now;
    t.p.a
        .resolve_addr(now, id, None, sa(B_IP, 1), Duration::from_millis(500))
        .unwrap();
    let e = t.expect(Side::A, EventType::AddrError);
    assert_eq!(e.status, -errno::ETIMEDOUT);
    assert_eq!(t.p.now - now, Duration::from_millis(500));
    // A late answer is refused.
    assert!(t.p.a.complete_addr(t.p.now, id, Ok(ip(A_IP))).is_err());
    // Route resolution that never comes back.
    t.answer = true;
    let now = t.p.now;
    t.p.a
        .resolve_addr(now, id, None, sa(B_IP, 1), Duration::from_secs(1))
        .unwrap();
    t.expect(Side::A, EventType::AddrResolved);
    t.answer = false;
    let now = t.p.now;
    t.p.a
        .resolve_route(now, id, Duration::from_millis(300))
        .unwrap();
    assert_eq!(
        t.expect(Side::A, EventType::RouteError).status,
        -errno::ETIMEDOUT
    );
    assert_eq!(t.p.a.state(id), Some(IdState::AddrResolved));
}

#[test]
fn api_rules() {
    let mut t = Test::new();
    let b = &mut t.p.b;
    let l = b.create_id(PortSpace::TCP);
    assert_eq!(
        b.listen(l, 1),
        Err(RdmaCmError::InvalidState(IdState::Idle))
    );
    b.bind_addr(l, sa(B_IP, 7174)).unwrap();
    let l2 = b.create_id(PortSpace::TCP);
    assert_eq!(
        b.bind_addr(l2, sa("0.0.0.0", 7174)),
        Err(RdmaCmError::AddrInUse(sa("0.0.0.0", 7174)))
    );
    // Another port space has its own ports.
    let u = b.create_id(PortSpace::UDP);
    b.bind_addr(u, sa(B_IP, 7174)).unwrap();
    let now = t.p.now;
    let a = t.p.a.create_id(PortSpace::TCP);
    let cp = ConnParam::new(QpNumber::new(1), Psn::new(1), &[]);
    assert_eq!(
        t.p.a.connect(now, a, &cp),
        Err(RdmaCmError::InvalidState(IdState::Idle))
    );
    let a = t.resolved(PortSpace::TCP, 7174);
    let too_long = [0u8; 57];
    let cp = ConnParam::new(QpNumber::new(1), Psn::new(1), &too_long);
    assert_eq!(
        t.p.a.connect(now, a, &cp),
        Err(RdmaCmError::PrivateDataTooLong { len: 57, max: 56 })
    );
    assert_eq!(
        t.p.a.resolve_addr(
            now,
            a,
            Some(ip("fd00::1")),
            sa(B_IP, 1),
            Duration::from_secs(1)
        ),
        Err(RdmaCmError::InvalidState(IdState::RouteResolved))
    );
    let v6 = t.p.a.create_id(PortSpace::TCP);
    assert_eq!(
        t.p.a.resolve_addr(
            now,
            v6,
            Some(ip("fd00::1")),
            sa(B_IP, 1),
            Duration::from_secs(1)
        ),
        Err(RdmaCmError::FamilyMismatch)
    );
}

#[test]
fn ud_over_sidr_like_perftest() {
    let mut t = Test::new();
    let l = t.listener(PortSpace::UDP, sa("0.0.0.0", 18515), 4);
    let a = t.resolved(PortSpace::UDP, 18515);
    let now = t.p.now;
    t.p.a
        .connect(
            now,
            a,
            &ConnParam::new(QpNumber::new(0x16), Psn::new(0), b"ud hello"),
        )
        .unwrap();
    let req = t.expect(Side::B, EventType::ConnectRequest);
    assert_eq!(req.listen_id, Some(l));
    assert_eq!(&req.private_data()[..8], b"ud hello");
    assert_eq!(req.private_data_len, 180);
    let now = t.p.now;
    assert_eq!(
        t.p.b
            .accept(
                now,
                req.id,
                &ConnParam::new(QpNumber::new(0x15), Psn::new(0), &[])
            )
            .unwrap(),
        None
    );
    let e = t.expect(Side::A, EventType::Established);
    assert_eq!(
        (e.qp_num, e.qkey),
        (Some(QpNumber::new(0x15)), Some(0x0123_4567))
    );
    assert_eq!(t.p.sent_by(Side::A), ["SIDR_REQ"]);
    assert_eq!(t.p.sent_by(Side::B), ["SIDR_REP"]);
    let CmMessage::SidrReq(q) = t.p.trace[0].mad.unwrap().msg else {
        panic!()
    };
    assert_eq!(q.service_id, 0x0000_0000_0111_4853);
    // Rejected by the application: UNREACHABLE with the SIDR status (2).
    let a2 = t.resolved(PortSpace::UDP, 18515);
    let now = t.p.now;
    t.p.a
        .connect(
            now,
            a2,
            &ConnParam::new(QpNumber::new(0x17), Psn::new(0), &[]),
        )
        .unwrap();
    let req = t.expect(Side::B, EventType::ConnectRequest);
    let now = t.p.now;
    t.p.b.reject(now, req.id, &[]).unwrap();
    assert_eq!(t.expect(Side::A, EventType::Unreachable).status, 2);
    // Nothing listens: status 1.
    let a3 = t.resolved(PortSpace::UDP, 1);
    let now = t.p.now;
    t.p.a
        .connect(
            now,
            a3,
            &ConnParam::new(QpNumber::new(0x18), Psn::new(0), &[]),
        )
        .unwrap();
    assert_eq!(t.expect(Side::A, EventType::Unreachable).status, 1);
}

#[test]
fn the_backlog_bounds_unanswered_requests() {
    let mut t = Test::new();
    let l = t.listener(PortSpace::TCP, sa(B_IP, 7174), 2);
    let mut ids = Vec::new();
    for q in 0..5 {
        let a = t.resolved(PortSpace::TCP, 7174);
        let now = t.p.now;
        t.p.a
            .connect(
                now,
                a,
                &ConnParam::new(QpNumber::new(0x40 + q), Psn::new(1), &[]),
            )
            .unwrap();
        ids.push(a);
    }
    // Within one REQ timeout, only two requests reach B's application.
    let mut reqs = Vec::new();
    while let Some(e) = t.event(Side::B, Duration::from_millis(50)) {
        assert_eq!(e.kind, EventType::ConnectRequest);
        assert_eq!(e.listen_id, Some(l));
        reqs.push(e.id);
    }
    assert_eq!(reqs.len(), 2);
    assert_eq!(t.p.b.ib().counters().backlog_drops, 3);
    // Accepting frees the backlog: the retried REQs come in.
    let now = t.p.now;
    for (k, r) in reqs.iter().enumerate() {
        t.p.b
            .accept(
                now,
                *r,
                &ConnParam::new(QpNumber::new(0x80 + k as u32), Psn::new(2), &[]),
            )
            .unwrap();
    }
    let e = t.expect(Side::B, EventType::ConnectRequest);
    assert!(!reqs.contains(&e.id));
}

#[test]
fn simultaneous_disconnect_reports_each_event_once() {
    let mut t = Test::new();
    t.listener(PortSpace::TCP, sa(B_IP, 7174), 4);
    let a = t.resolved(PortSpace::TCP, 7174);
    let now = t.p.now;
    t.p.a
        .connect(now, a, &ConnParam::new(QpNumber::new(1), Psn::new(1), &[]))
        .unwrap();
    let req = t.expect(Side::B, EventType::ConnectRequest);
    let now = t.p.now;
    t.p.b
        .accept(
            now,
            req.id,
            &ConnParam::new(QpNumber::new(2), Psn::new(2), &[]),
        )
        .unwrap();
    t.expect(Side::A, EventType::ConnectResponse);
    let now = t.p.now;
    t.p.a.establish(now, a).unwrap();
    t.expect(Side::A, EventType::Established);
    t.expect(Side::B, EventType::Established);
    let now = t.p.now;
    t.p.a.disconnect(now, a).unwrap();
    t.p.b.disconnect(now, req.id).unwrap();
    for s in [Side::A, Side::B] {
        t.expect(s, EventType::Disconnected);
        t.expect(s, EventType::TimewaitExit);
        t.no_event(s);
    }
}

#[test]
fn rping_over_ipv6_carries_ipv6_addresses() {
    let a6 = "fd77::12";
    let b6 = "fd77::11";
    let mut t = Test::new();
    t.p.addr_a = ferroce::cm::MadAddr::gsi(ferroce::wire::mad::Gid::from_ip(ip(a6)));
    t.p.addr_b = ferroce::cm::MadAddr::gsi(ferroce::wire::mad::Gid::from_ip(ip(b6)));
    let b = &mut t.p.b;
    let l = b.create_id(PortSpace::TCP);
    b.bind_addr(l, sa("::", 7174)).unwrap();
    b.listen(l, 1).unwrap();
    let now = t.p.now;
    let a = t.p.a.create_id(PortSpace::TCP);
    t.p.a
        .resolve_addr(now, a, None, sa(b6, 7174), Duration::from_secs(1))
        .unwrap();
    let Some(Request::ResolveAddr { id, .. }) = t.p.a.poll_request() else {
        panic!()
    };
    t.p.a.complete_addr(now, id, Ok(ip(a6))).unwrap();
    t.p.a.resolve_route(now, a, Duration::from_secs(1)).unwrap();
    t.p.a.poll_request();
    t.p.a
        .complete_route(now, a, Ok(Route::roce(ip(a6), ip(b6), PathMtu::M1024)))
        .unwrap();
    t.p.a
        .connect(
            now,
            a,
            &ConnParam::new(QpNumber::new(0x12), Psn::new(1), &[]),
        )
        .unwrap();
    let req = t.expect(Side::B, EventType::ConnectRequest);
    assert_eq!(t.p.b.peer_addr(req.id).unwrap().ip(), ip(a6));
    let m: CmMadRepr = t.p.trace[0].mad.unwrap();
    let CmMessage::Req(q) = m.msg else { panic!() };
    assert_eq!(q.primary.local_gid.to_string(), a6);
    let h = HeaderRepr::parse(&q.private_data).unwrap();
    assert_eq!((h.src_ip, h.dst_ip), (ip(a6), ip(b6)));
    assert_eq!(q.private_data[1] >> 4, 6);
}

/// `rdma_set_option` RDMA_OPTION_ID_TOS and _ACK_TIMEOUT, as Linux applies them: the active
/// side's TOS (set between address and route resolution, as perftest's `-T` does) becomes the
/// route's traffic class, the REQ's path carries it, and both QPs get it (the passive side from
/// the REQ); a TOS on the listener overrides what the REQ says for the accepted QP. The ACK
/// timeout replaces the computed Local ACK Timeout of the side that set it, and only that one.
#[test]
fn tos_and_ack_timeout_options_reach_the_route_the_req_and_both_qps() {
    for (a_tos, listener_tos) in [
        (Some(96u8), None),
        (None, Some(0x48u8)),
        (Some(96), Some(0x48)),
    ] {
        let mut t = Test::new();
        let l = t.listener(PortSpace::TCP, sa("0.0.0.0", 7175), 4);
        if let Some(x) = listener_tos {
            t.p.b.set_tos(l, x).unwrap();
        }
        let a = t.resolved_with(PortSpace::TCP, 7175, |cm, a| {
            if let Some(x) = a_tos {
                cm.set_tos(a, x).unwrap();
            }
            cm.set_ack_timeout(a, 19).unwrap();
        });
        let a_tc = a_tos.unwrap_or(0);
        assert_eq!(t.p.a.route(a).unwrap().traffic_class, a_tc);
        let now = t.p.now;
        t.p.a
            .connect(
                now,
                a,
                &ConnParam::new(QpNumber::new(0x11), Psn::new(1), &[]),
            )
            .unwrap();
        let req = t.expect(Side::B, EventType::ConnectRequest);
        let CmMessage::Req(q) = t.p.trace[0].mad.unwrap().msg else {
            panic!()
        };
        assert_eq!(q.primary.traffic_class, a_tc, "the REQ's path");
        let now = t.p.now;
        let qp_b =
            t.p.b
                .accept(
                    now,
                    req.id,
                    &ConnParam::new(QpNumber::new(0x22), Psn::new(2), &[]),
                )
                .unwrap()
                .unwrap();
        assert_eq!(
            qp_b.traffic_class,
            listener_tos.unwrap_or(a_tc),
            "the passive QP: the listener's TOS, else the REQ's"
        );
        let resp = t.expect(Side::A, EventType::ConnectResponse);
        let qp_a = resp.qp.unwrap();
        assert_eq!(qp_a.traffic_class, a_tc, "the active QP");
        assert_eq!(qp_a.local_ack_timeout, 19, "A's option");
        assert_ne!(qp_b.local_ack_timeout, 19, "B set none: the computed one");
    }
    // Options of an id that does not exist: an error, as for every call.
    let mut t = Test::new();
    assert_eq!(t.p.a.set_tos(RdmaId(4242), 1), Err(RdmaCmError::NoSuchId));
    assert_eq!(
        t.p.a.set_ack_timeout(RdmaId(4242), 1),
        Err(RdmaCmError::NoSuchId)
    );
}

/// `RDMA_OPTION_IB_PATH` (`RdmaCm::set_route`): refused before the address is resolved and
/// once a route is; otherwise the route given is the id's (an id's TOS still overrides its
/// traffic class), ROUTE_RESOLVED follows with no resolution asked of the driver, and the
/// REQ carries the route.
#[test]
fn a_given_route_replaces_route_resolution() {
    let mut t = Test::new();
    t.listener(PortSpace::TCP, sa("0.0.0.0", 7176), 4);
    let a = t.p.a.create_id(PortSpace::TCP);
    let mut r = Route::roce(ip(A_IP), ip(B_IP), PathMtu::M2048);
    r.traffic_class = 0x28;
    r.flow_label = 0x12345;
    r.hop_limit = 17;
    assert!(matches!(
        t.p.a.set_route(a, r),
        Err(RdmaCmError::InvalidState(IdState::Idle))
    ));
    let now = t.p.now;
    t.p.a
        .resolve_addr(now, a, None, sa(B_IP, 7176), Duration::from_secs(2))
        .unwrap();
    t.expect(Side::A, EventType::AddrResolved);
    t.p.a.set_route(a, r).unwrap();
    assert!(t.p.a.poll_request().is_none(), "no route resolution asked");
    assert_eq!(t.expect(Side::A, EventType::RouteResolved).id, a);
    assert_eq!(t.p.a.route(a), Some(r));
    assert!(matches!(
        t.p.a.set_route(a, r),
        Err(RdmaCmError::InvalidState(IdState::RouteResolved))
    ));
    let now = t.p.now;
    t.p.a
        .connect(
            now,
            a,
            &ConnParam::new(QpNumber::new(0x11), Psn::new(1), &[]),
        )
        .unwrap();
    t.expect(Side::B, EventType::ConnectRequest);
    let CmMessage::Req(q) = t.p.trace[0].mad.unwrap().msg else {
        panic!()
    };
    assert_eq!(
        (
            q.primary.traffic_class,
            q.primary.flow_label,
            q.primary.hop_limit,
            q.path_mtu
        ),
        (0x28, 0x12345, 17, PathMtu::M2048)
    );
    // With a TOS on the id, the TOS wins over the path's traffic class.
    let mut t = Test::new();
    let a = t.p.a.create_id(PortSpace::TCP);
    let now = t.p.now;
    t.p.a
        .resolve_addr(now, a, None, sa(B_IP, 7176), Duration::from_secs(2))
        .unwrap();
    t.expect(Side::A, EventType::AddrResolved);
    t.p.a.set_tos(a, 0x60).unwrap();
    t.p.a.set_route(a, r).unwrap();
    assert_eq!(t.p.a.route(a).unwrap().traffic_class, 0x60);
}
