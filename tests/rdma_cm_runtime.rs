//! RDMA-CM over the runtime (src/runtime/cm.rs): two NICs with real threads over the in-memory
//! loopback backend, each with its CM service on QP1. librdmacm's call sequences: connect,
//! exchange data on the QPs the CM set up, disconnect; REJECTED when nothing listens;
//! a consumer reject carrying private data.

mod common;
use ferroce::cm::CmConfig;
use ferroce::io::Loopback;
use ferroce::runtime::cm::{
    ca_guid_of, CmEvent, CmId, CmService, ConnParam, EventChannel, EventType, PortSpace,
    StaticResolver,
};
use ferroce::runtime::{Nic, NicOptions, PollMode};
use ferroce::verbs::*;
use ferroce::wire::{MacAddr, Psn, QpNumber};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

const T: Option<Duration> = Some(Duration::from_secs(10));

fn mac(i: u8) -> MacAddr {
    MacAddr([2, 0, 0, 0, 0, i])
}
fn ip(i: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 9, 0, i))
}

struct Side {
    svc: CmService,
    ch: EventChannel,
    nic: Arc<Nic>,
}

fn side(i: u8, dev: Loopback) -> Side {
    let nic = Arc::new(
        Nic::start(
            DeviceConfig::new(mac(i), ip(i)),
            dev,
            NicOptions {
                poll: PollMode::Adaptive {
                    spins: 100,
                    max_sleep: Duration::from_micros(200),
                },
                batch: 64,
            },
        )
        .unwrap(),
    );
    let peer = 3 - i;
    let res = StaticResolver {
        entries: vec![(ip(i), ip(peer), mac(peer))],
    };
    let cfg = CmConfig {
        timewait: Some(ferroce::time::Duration::from_millis(50)),
        ..CmConfig::new(ca_guid_of(mac(i)))
    };
    let svc = CmService::start(nic.clone(), cfg, Box::new(res)).unwrap();
    let ch = svc.create_event_channel().unwrap();
    Side { svc, ch, nic }
}

fn pair() -> (Side, Side) {
    let (la, lb) = Loopback::pair(4096, 9000).unwrap();
    (side(1, la), side(2, lb))
}

fn expect(ch: &EventChannel, kind: EventType) -> CmEvent {
    let e = ch
        .get_cm_event(T)
        .unwrap_or_else(|| panic!("no event, {kind:?} expected"));
    assert_eq!(e.event, kind, "{e:?}");
    e
}

/// Resolve `c`'s address and route to B's `port`, each event on `ch` in turn.
fn resolve(ch: &EventChannel, c: &CmId, port: u16) {
    c.resolve_addr(None, SocketAddr::new(ip(2), port), Duration::from_secs(2))
        .unwrap();
    expect(ch, EventType::AddrResolved);
    c.resolve_route(Duration::from_secs(2)).unwrap();
    expect(ch, EventType::RouteResolved);
}

fn cap() -> QpCap {
    common::qp_cap(16, 1, 0)
}

fn qp_init(nic: &Nic) -> (QpInitAttr, Pd, Cq) {
    let pd = nic.alloc_pd().unwrap();
    let cq = nic.create_cq(64).unwrap();
    (QpInitAttr::new(pd, cq, cq, cap()), pd, cq)
}

fn param(private: &[u8]) -> ConnParam<'_> {
    ConnParam::new(QpNumber::new(0), Psn::new(0), private)
}

fn wait_wc(nic: &Nic, cq: Cq) -> WorkCompletion {
    let mut v = Vec::new();
    for _ in 0..1000 {
        nic.poll_cq(cq, &mut v, 1).unwrap();
        if let Some(wc) = v.pop() {
            return wc;
        }
        nic.wait_cq(cq, Duration::from_millis(10)).unwrap();
    }
    panic!("no completion");
}

/// rping's sequence, client on A, server on B; a SEND each way and an RDMA READ over the QPs
/// the CM connected; then the client disconnects and both see DISCONNECTED and TIMEWAIT_EXIT.
#[test]
fn connect_exchange_disconnect() {
    let (a, b) = pair();
    let l = b.ch.create_id(PortSpace::TCP);
    l.bind_addr(SocketAddr::new(ip(2), 7174)).unwrap();
    l.listen(4).unwrap();

    let c = a.ch.create_id(PortSpace::TCP);
    c.resolve_addr(None, SocketAddr::new(ip(2), 7174), Duration::from_secs(2))
        .unwrap();
    expect(&a.ch, EventType::AddrResolved);
    assert_eq!(c.local_addr().unwrap().ip(), ip(1));
    c.resolve_route(Duration::from_secs(2)).unwrap();
    expect(&a.ch, EventType::RouteResolved);
    let (ia, pda, cqa) = qp_init(&a.nic);
    let qa = c.create_qp(ia).unwrap();
    assert_eq!(a.nic.query_qp(qa).unwrap().0, QpState::Init);
    c.connect(&param(b"hello from A")).unwrap();

    let req = expect(&b.ch, EventType::ConnectRequest);
    assert_eq!(req.private_data()[..12], *b"hello from A");
    assert_eq!(req.listen_id.as_ref(), Some(&l));
    assert_eq!(req.param.qp_num, Some(qa));
    let s = req.id.clone();
    assert_eq!(s.peer_addr().unwrap().ip(), ip(1));
    assert_eq!(
        s.peer_addr().unwrap().port(),
        c.local_addr().unwrap().port()
    );
    let (ib, pdb, cqb) = qp_init(&b.nic);
    let qb = s.create_qp(ib).unwrap();
    s.accept(&param(b"welcome")).unwrap();
    assert_eq!(b.nic.query_qp(qb).unwrap().0, QpState::Rts);

    let est = expect(&a.ch, EventType::Established);
    assert_eq!(est.param.qp_num, Some(qb));
    // The REP's private data comes with ESTABLISHED on the active side, as the kernel's
    // RDMA-CM reports it for an id with a QP (rsockets read the peer's buffers there); the
    // REP carries 196 bytes, the rest zero.
    assert_eq!(est.private_data()[..7], *b"welcome");
    assert_eq!(est.private_data().len(), 196);
    assert!(est.private_data()[7..].iter().all(|&b| b == 0));
    let (st, attr) = a.nic.query_qp(qa).unwrap();
    assert_eq!(st, QpState::Rts);
    assert_eq!(attr.dest_qp_num, qb.get());
    assert!(expect(&b.ch, EventType::Established)
        .private_data()
        .iter()
        .all(|&b| b == 0));
    let (_, battr) = b.nic.query_qp(qb).unwrap();
    assert_eq!(battr.dest_qp_num, qa.get());
    assert_eq!(
        battr.rq_psn, attr.sq_psn,
        "B receives from A's starting PSN"
    );
    assert_eq!(attr.rq_psn, battr.sq_psn);

    // Data over the connection: B posts a receive, A SENDs; then A READs B's buffer.
    let mra = a.nic.reg_mr(pda, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mrb = b
        .nic
        .reg_mr(
            pdb,
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    mra.write(0, b"ping over rdma_cm").unwrap();
    mrb.write(2048, b"server buffer").unwrap();
    b.nic
        .post_recv(
            qb,
            RecvWr {
                wr_id: 7,
                sg_list: vec![common::sge(&mrb, 0, 64)].into(),
            },
        )
        .unwrap();
    a.nic
        .post_send(
            qa,
            SendWr::new(1, SendOp::Send, vec![common::sge(&mra, 0, 17)]),
        )
        .unwrap();
    let wc = wait_wc(&b.nic, cqb);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (7, WcStatus::Success, 17)
    );
    let mut got = [0u8; 17];
    mrb.read(0, &mut got).unwrap();
    assert_eq!(&got, b"ping over rdma_cm");
    assert_eq!(wait_wc(&a.nic, cqa).status, WcStatus::Success);
    a.nic
        .post_send(
            qa,
            SendWr::new(
                2,
                SendOp::RdmaRead {
                    remote_addr: mrb.addr() + 2048,
                    rkey: mrb.rkey(),
                },
                vec![common::sge(&mra, 1024, 13)],
            ),
        )
        .unwrap();
    let wc = wait_wc(&a.nic, cqa);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
    let mut got = [0u8; 13];
    mra.read(1024, &mut got).unwrap();
    assert_eq!(&got, b"server buffer");

    c.disconnect().unwrap();
    assert_eq!(a.nic.query_qp(qa).unwrap().0, QpState::Err);
    expect(&b.ch, EventType::Disconnected);
    s.disconnect().unwrap();
    expect(&a.ch, EventType::Disconnected);
    expect(&a.ch, EventType::TimewaitExit);
    expect(&b.ch, EventType::TimewaitExit);
    let ma = a.svc.qp1_counters();
    let mb = b.svc.qp1_counters();
    // REQ, RTU, DREQ from A; REP, DREP from B.
    assert_eq!((ma.mads_out, mb.mads_in), (3, 3), "{ma:?} {mb:?}");
    assert_eq!((mb.mads_out, ma.mads_in), (2, 2), "{ma:?} {mb:?}");
    c.destroy().unwrap();
    s.destroy().unwrap();
    l.destroy().unwrap();
}

/// 300 connections requested at once, as Debian's `cmtime` does: every REQ finds a receive
/// buffer on the passive side's QP1 (none dropped, so none waits ~4 s for its retransmission)
/// and all 300 are established. With 64 receive buffers on QP1 the burst overflowed them:
/// `cmtime -c 200` took 9.7 s to connect its slowest connection.
#[test]
fn a_burst_of_connection_requests_is_not_dropped() {
    const N: usize = 300;
    let (a, b) = pair();
    let l = b.ch.create_id(PortSpace::TCP);
    l.bind_addr(SocketAddr::new(ip(2), 7471)).unwrap();
    l.listen(N).unwrap();
    let (pda, cqa) = (a.nic.alloc_pd().unwrap(), a.nic.create_cq(64).unwrap());
    let (pdb, cqb) = (b.nic.alloc_pd().unwrap(), b.nic.create_cq(64).unwrap());
    let ids: Vec<_> = (0..N)
        .map(|_| {
            let c = a.ch.create_id(PortSpace::TCP);
            resolve(&a.ch, &c, 7471);
            c.create_qp(QpInitAttr::new(pda, cqa, cqa, cap())).unwrap();
            c
        })
        .collect();
    // All REQs leave back to back; the server answers none until the last is posted.
    for c in &ids {
        c.connect(&param(&[])).unwrap();
    }
    // The server accepts each request as it comes; its ESTABLISHED events (the RTUs) come
    // between the later requests.
    let (mut accepted, mut established) = (Vec::new(), 0);
    while accepted.len() < N || established < N {
        let e = b.ch.get_cm_event(T).expect("a request or ESTABLISHED");
        match e.event {
            EventType::ConnectRequest => {
                e.id.create_qp(QpInitAttr::new(pdb, cqb, cqb, cap()))
                    .unwrap();
                e.id.accept(&param(&[])).unwrap();
                accepted.push(e.id.clone());
            }
            EventType::Established => established += 1,
            _ => panic!("{e:?}"),
        }
    }
    for _ in 0..N {
        expect(&a.ch, EventType::Established);
    }
    for (who, s) in [("client", &a), ("server", &b)] {
        let gsi = s.nic.qp_counters(QpNumber::GSI).unwrap();
        assert_eq!(gsi.no_wqe_drops, 0, "{who}: MADs dropped on QP1: {gsi:?}");
        let cm = s.svc.cm_counters();
        assert_eq!(
            (cm.retransmissions, cm.duplicates, cm.rej_sent),
            (0, 0, 0),
            "{who}: {cm:?}"
        );
    }
    // REQ and RTU from each connection, nothing else.
    assert_eq!(b.svc.qp1_counters().mads_in as usize, 2 * N);
}

/// A REQ to a port where nothing listens: REJECTED with reason 8 (invalid service ID),
/// promptly (one round trip, not a timeout).
#[test]
fn nothing_listens_rejected() {
    let (a, b) = pair();
    let c = a.ch.create_id(PortSpace::TCP);
    resolve(&a.ch, &c, 9999);
    let (ia, _, _) = qp_init(&a.nic);
    c.create_qp(ia).unwrap();
    c.connect(&param(&[])).unwrap();
    // Far below the REQ timeout (rdma_cm's 4.3 s response timeout plus lifetimes).
    let e =
        a.ch.get_cm_event(Some(Duration::from_secs(2)))
            .expect("an answer before any REQ timeout");
    assert_eq!(e.event, EventType::Rejected);
    assert_eq!(e.status, 8, "REJ reason: invalid service ID");
    assert!(b.ch.try_get_cm_event().is_none());
    assert_eq!(b.svc.cm_counters().established, 0);
}

/// The server's application rejects with private data: the client sees REJECTED, reason 28
/// (consumer reject), with those bytes.
#[test]
fn consumer_reject_with_private_data() {
    let (a, b) = pair();
    let l = b.ch.create_id(PortSpace::TCP);
    l.bind_addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 20000))
        .unwrap();
    l.listen(1).unwrap();
    let c = a.ch.create_id(PortSpace::TCP);
    resolve(&a.ch, &c, 20000);
    c.connect(&param(b"may I?")).unwrap();
    let req = expect(&b.ch, EventType::ConnectRequest);
    req.id.reject(b"no, sorry").unwrap();
    let e = expect(&a.ch, EventType::Rejected);
    assert_eq!(e.status, 28, "REJ reason: consumer reject");
    assert_eq!(&e.private_data()[..9], b"no, sorry");
}

/// The channel's descriptor is readable while an event waits, and not after it is read.
#[test]
fn channel_fd_is_readable_with_events() {
    use ferroce::io::event::poll_readable;
    let (a, _b) = pair();
    let c = a.ch.create_id(PortSpace::TCP);
    let fd = a.ch.fd();
    let readable = |t| poll_readable(&[fd], Some(t)).unwrap();
    assert!(!readable(Duration::from_millis(1)));
    c.resolve_addr(None, SocketAddr::new(ip(2), 1), Duration::from_secs(2))
        .unwrap();
    assert!(readable(Duration::from_secs(5)));
    expect(&a.ch, EventType::AddrResolved);
    assert!(!readable(Duration::from_millis(1)));
}

/// UD over SIDR, as perftest's `-c UD -R` does it: the client attaches a UD QP it made
/// itself (RESET), the server one made by the CM; SIDR_REQ with private data, SIDR_REP with
/// the server's QPN and RDMA-CM's UD Q_Key (0x01234567, `RDMA_UDP_QKEY` in
/// <rdma/rdma_cma.h>); a SEND with immediate data goes from the client's QP to the server's
/// with what ESTABLISHED said. A SIDR_REQ to a port where nothing listens: UNREACHABLE,
/// promptly.
#[test]
fn ud_over_sidr() {
    let (a, b) = pair();
    let l = b.ch.create_id(PortSpace::UDP);
    l.bind_addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 18515))
        .unwrap();
    l.listen(4).unwrap();

    let c = a.ch.create_id(PortSpace::UDP);
    resolve(&a.ch, &c, 18515);
    let (mut ia, pda, cqa) = qp_init(&a.nic);
    ia.qp_type = QpType::Ud;
    let qa = a.nic.create_qp(ia).unwrap();
    c.attach_qp(qa).unwrap();
    let (st, attr) = a.nic.query_qp(qa).unwrap();
    assert_eq!((st, attr.qkey), (QpState::Rts, 0x0123_4567));
    c.connect(&param(b"ud please")).unwrap();

    let req = expect(&b.ch, EventType::ConnectRequest);
    assert_eq!(req.private_data()[..9], *b"ud please");
    assert_eq!(req.listen_id.as_ref(), Some(&l));
    let s = req.id.clone();
    assert_eq!(s.peer_addr().unwrap().ip(), ip(1));
    let (ib, pdb, cqb) = qp_init(&b.nic);
    let qb = s.create_qp(ib).unwrap();
    let (st, battr) = b.nic.query_qp(qb).unwrap();
    assert_eq!((st, battr.qkey), (QpState::Rts, 0x0123_4567));
    let mrb = b.nic.reg_mr(pdb, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    b.nic
        .post_recv(
            qb,
            RecvWr {
                wr_id: 5,
                sg_list: vec![Sge {
                    addr: mrb.addr(),
                    length: 40 + 64,
                    lkey: mrb.lkey(),
                }]
                .into(),
            },
        )
        .unwrap();
    s.accept(&param(b"ok")).unwrap();

    let est = expect(&a.ch, EventType::Established);
    assert_eq!(est.param.qp_num, Some(qb));
    assert_eq!(est.param.qkey, Some(0x0123_4567));
    assert_eq!(est.private_data()[..2], *b"ok");
    assert!(
        b.ch.try_get_cm_event().is_none(),
        "no ESTABLISHED on the passive side of SIDR"
    );

    let mra = a.nic.reg_mr(pda, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    mra.write(0, b"datagram").unwrap();
    let ah = a
        .nic
        .create_ah(
            pda,
            &AddressVector {
                dgid: ferroce::wire::mad::Gid::from_ip(ip(2)).0,
                sgid_index: 0,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0,
                dmac: Some(mac(2).0),
            },
        )
        .unwrap();
    let wr = SendWr::new(
        9,
        SendOp::SendWithImm { imm: qa.get() },
        vec![common::sge(&mra, 0, 8)],
    )
    .with_ud(UdDest {
        ah,
        remote_qpn: est.param.qp_num.unwrap(),
        remote_qkey: est.param.qkey.unwrap(),
    });
    a.nic.post_send(qa, wr).unwrap();
    assert_eq!(wait_wc(&a.nic, cqa).status, WcStatus::Success);
    let wc = wait_wc(&b.nic, cqb);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len, wc.src_qp, wc.imm_data),
        (5, WcStatus::Success, 40 + 8, qa, Some(qa.get()))
    );
    let mut got = [0u8; 8];
    mrb.read(40, &mut got).unwrap();
    assert_eq!(&got, b"datagram");

    // Nothing listens on this UDP port: the SIDR_REP says so at once.
    let c2 = a.ch.create_id(PortSpace::UDP);
    resolve(&a.ch, &c2, 18516);
    c2.connect(&param(&[])).unwrap();
    let e =
        a.ch.get_cm_event(Some(Duration::from_secs(2)))
            .expect("an answer before the SIDR timeout");
    assert_eq!(e.event, EventType::Unreachable);
    assert_ne!(e.status, 0);
    c.detach_qp();
    c.destroy().unwrap();
    s.destroy().unwrap();
    l.destroy().unwrap();
}

/// `rdma_migrate_id`: a listener's CONNECT_REQUEST already waiting on its channel moves to the
/// new channel with it (none is left on the old one, whose descriptor is no longer readable),
/// the connection's later events come to the new channel, and the client's id, migrated
/// before it connects, gets ESTABLISHED on its new channel. Migrating a destroyed id fails.
#[test]
fn migrate_id_moves_waiting_and_later_events() {
    use ferroce::io::event::poll_readable;
    let (a, b) = pair();
    let l = b.ch.create_id(PortSpace::TCP);
    l.bind_addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 20001))
        .unwrap();
    l.listen(1).unwrap();
    let c = a.ch.create_id(PortSpace::TCP);
    resolve(&a.ch, &c, 20001);
    let a2 = a.svc.create_event_channel().unwrap();
    c.migrate(&a2).unwrap();
    let (ia, _, _) = qp_init(&a.nic);
    c.create_qp(ia).unwrap();
    c.connect(&param(b"hello")).unwrap();

    // The request waits on b's first channel; then the listener moves.
    assert!(poll_readable(&[b.ch.fd()], Some(Duration::from_secs(5))).unwrap());
    let b2 = b.svc.create_event_channel().unwrap();
    l.migrate(&b2).unwrap();
    assert!(b.ch.try_get_cm_event().is_none(), "left on the old channel");
    assert!(!poll_readable(&[b.ch.fd()], Some(Duration::from_millis(1))).unwrap());
    let req = expect(&b2, EventType::ConnectRequest);
    assert_eq!(req.listen_id.as_ref(), Some(&l));
    assert_eq!(&req.private_data()[..5], b"hello");
    let (ib, _, _) = qp_init(&b.nic);
    req.id.create_qp(ib).unwrap();
    req.id.accept(&param(&[])).unwrap();
    // The accepted id's ESTABLISHED follows its listener; the client's comes to a2.
    expect(&b2, EventType::Established);
    expect(&a2, EventType::Established);
    assert!(a.ch.try_get_cm_event().is_none());
    assert!(b.ch.try_get_cm_event().is_none());

    c.disconnect().unwrap();
    expect(&b2, EventType::Disconnected);
    req.id.disconnect().unwrap();
    expect(&a2, EventType::Disconnected);
    expect(&a2, EventType::TimewaitExit);
    expect(&b2, EventType::TimewaitExit);
    assert!(a.ch.try_get_cm_event().is_none());
    assert!(b.ch.try_get_cm_event().is_none());
    let gone = l.clone();
    l.destroy().unwrap();
    assert!(gone.migrate(&b.ch).is_err());
}

/// REQs from 1,000 forged source addresses (raw frames on the loopback, each a valid RoCE v2
/// UD SEND to QP1 with a CM REQ for a service nobody listens on): B's CM answers each with a
/// REJ, which needs an address handle per source. QP1 keeps at most 256 of them (starting
/// over when full and no MAD is on its way), so a flood from forged sources never fills the
/// device's AH table, which the application's address handles share. Before, QP1 kept one
/// per source, forever.
#[test]
fn qp1_address_handles_stay_bounded_under_forged_sources() {
    use ferroce::io::PacketDevice;
    use ferroce::wire::mad::cm::{CmMadRepr, CmMessage, ReqRepr};
    use ferroce::wire::mad::GSI_QKEY;
    use ferroce::wire::{
        BthRepr, DethRepr, Ecn, EthernetRepr, ExtRepr, FrameRepr, IpRepr, Ipv4Repr, Opcode, QKey,
        RoceRepr, UdpRepr, ROCE_V2_PORT,
    };
    let (mut la, lb) = Loopback::pair(4096, 9000).unwrap();
    let b = side(2, lb);
    let n = 1_000u32;
    let mut sent = 0u32;
    for i in 0..n {
        let src = Ipv4Addr::new(10, 77, (i >> 8) as u8, i as u8);
        let req = ReqRepr {
            local_comm_id: i + 1,
            service_id: 0x0000_0000_0106_0000 | 4242,
            ..ReqRepr::default()
        };
        let mad = CmMadRepr::send(u64::from(i) + 1, CmMessage::Req(req)).to_bytes();
        let f = FrameRepr {
            eth: Some(EthernetRepr {
                dst: mac(2),
                src: MacAddr([2, 0x77, 0, 0, (i >> 8) as u8, i as u8]),
                vlan: None,
                ethertype: 0,
            }),
            ip: IpRepr::V4(Ipv4Repr {
                src,
                dst: Ipv4Addr::new(10, 9, 0, 2),
                dscp: 0,
                ecn: Ecn::NotEct,
                ident: 0,
                dont_frag: true,
                ttl: 64,
            }),
            udp: UdpRepr {
                src_port: 0xc0de,
                dst_port: ROCE_V2_PORT,
                checksum: 0,
            },
            roce: RoceRepr::new(
                BthRepr::new(Opcode::UD_SEND_ONLY, QpNumber::GSI, Psn::new(i)),
                ExtRepr {
                    deth: Some(DethRepr {
                        qkey: QKey(GSI_QKEY),
                        src_qp: QpNumber::GSI,
                    }),
                    ..ExtRepr::default()
                },
                mad.len(),
            ),
        };
        let mut buf = vec![0u8; f.buffer_len()];
        let len = f.emit(&mut buf, &mad).unwrap();
        // One at a time, paced, so that QP1's 64 receive buffers keep up.
        let t0 = std::time::Instant::now();
        loop {
            let mut once = Some(&buf[..len]);
            let k = la
                .send_batch(1, &mut |out: &mut [u8]| {
                    once.take().map(|fr| {
                        out[..fr.len()].copy_from_slice(fr);
                        fr.len()
                    })
                })
                .unwrap();
            if k == 1 {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "loopback ring full");
            std::thread::sleep(Duration::from_micros(200));
        }
        sent += 1;
        // Drain what B sends back (its REJs) so its ring never fills, and keep at most 32
        // REQs ahead of what B took in, so that QP1's 64 receive buffers never run out
        // however fast B's engine is (a debug build is ~5x slower than release).
        let t1 = std::time::Instant::now();
        loop {
            let _ = la.recv_batch(64, &mut |_| {});
            let behind = u64::from(sent).saturating_sub(b.svc.qp1_counters().mads_in);
            if behind <= 32 || t1.elapsed() > Duration::from_secs(2) {
                break;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    // Until B has answered what it received (or 10 s).
    let t0 = std::time::Instant::now();
    let mut rejs = 0usize;
    loop {
        let _ = la.recv_batch(64, &mut |_| rejs += 1);
        let c = b.svc.qp1_counters();
        if c.mads_in >= u64::from(sent) || t0.elapsed() > Duration::from_secs(10) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    let _ = la.recv_batch(4096, &mut |_| rejs += 1);
    let c = b.svc.qp1_counters();
    assert!(
        c.mads_in > 900,
        "B received {} of {sent} REQs: {c:?}",
        c.mads_in
    );
    assert!(c.ahs <= 256, "QP1 holds {} address handles: {c:?}", c.ahs);
    assert!(c.ah_evictions >= 3, "{c:?}");
    // It still answers: REJs went out for most of the sources.
    assert!(c.mads_out > 700, "{c:?} ({rejs} frames back)");
    // And the application can still make its own address handles.
    let pd = b.nic.alloc_pd().unwrap();
    let av = AddressVector {
        dgid: ferroce::wire::mad::Gid::from_ip(ip(1)).0,
        sgid_index: 0,
        hop_limit: 64,
        traffic_class: 0,
        flow_label: 0,
        dmac: Some(mac(1).0),
    };
    b.nic.create_ah(pd, &av).unwrap();
}
