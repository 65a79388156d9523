//! The UDP-socket backend's kernel-side filter (`ferroce::io::udp_filter`) on real sockets:
//! two NICs on loopback addresses of their own, port 4791, and a third socket playing a
//! sender that is not the peer. The kernel must drop what the filter names before it
//! reaches B's socket (B's backend never sees it, B's engine counts nothing of it), let
//! through everything B's QPs may take (the connection's traffic, UD from anyone, QP1,
//! the peer's own address), and follow the QPs as they come and go. The same datagrams
//! with the filter off are the control: they reach B's engine, which drops each itself.
//! Unprivileged (loopback addresses need no root).

mod common;
use common::{nic_rc_pair, ALL};
use ferroce::io::{UdpConfig, UdpDevice};
use ferroce::runtime::{Nic, NicOptions, PollMode};
use ferroce::verbs::*;
use ferroce::wire::{MacAddr, QpNumber};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

fn addr(net: u8, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 77, net, host)
}

fn nic(ip: Ipv4Addr, filter: bool) -> Nic {
    let mut c = UdpConfig::new(IpAddr::V4(ip));
    c.filter = filter;
    let dev = UdpDevice::open(&c).unwrap_or_else(|e| panic!("UDP {ip}:4791: {e}"));
    let cfg = DeviceConfig::new(MacAddr([2, 0, 0, 0, 0, ip.octets()[3]]), IpAddr::V4(ip));
    let poll = PollMode::Adaptive {
        spins: 100,
        max_sleep: Duration::from_micros(200),
    };
    Nic::start(cfg, dev, NicOptions { poll, batch: 64 }).unwrap()
}

/// A RoCE payload: a BTH (`opcode`, P_Key, TVer, DestQP, PSN 0), `extra` zero bytes and an
/// ICRC that is wrong on purpose (whatever passes the filter is then dropped by the engine's
/// ICRC check, which counts it: the test's way of seeing it arrive).
fn bth(opcode: u8, pkey: u16, tver: u8, qpn: u32, extra: usize) -> Vec<u8> {
    let mut p = vec![opcode, tver & 0xf];
    p.extend_from_slice(&pkey.to_be_bytes());
    p.push(0);
    p.extend_from_slice(&qpn.to_be_bytes()[1..]);
    p.extend_from_slice(&[0; 4]);
    p.extend(std::iter::repeat_n(0, extra));
    p.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    p
}

const RC_WRITE_ONLY: u8 = 0x0a;
const UD_SEND_ONLY: u8 = 0x64;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Seen {
    rx_frames: u64,
    malformed: u64,
    header: u64,
    unknown_qp: u64,
    address: u64,
    icrc: u64,
    /// B's backend's `rx_kernel_drops`: what B's kernel dropped at the socket.
    kernel: u64,
}

fn seen(n: &Nic) -> Seen {
    let (d, _, io) = n.counters();
    Seen {
        rx_frames: io.rx_frames,
        malformed: d.malformed_drops,
        header: d.header_drops,
        unknown_qp: d.unknown_qp_drops,
        address: d.address_drops,
        icrc: d.icrc_drops,
        kernel: io.rx_kernel_drops,
    }
}

fn delta(a: Seen, b: Seen) -> Seen {
    Seen {
        rx_frames: b.rx_frames - a.rx_frames,
        malformed: b.malformed - a.malformed,
        header: b.header - a.header,
        unknown_qp: b.unknown_qp - a.unknown_qp,
        address: b.address - a.address,
        icrc: b.icrc - a.icrc,
        kernel: b.kernel - a.kernel,
    }
}

/// Send `hostile` from `x`, then `markers` (each passes the filter and ends in B's ICRC
/// count), and wait until B counted the markers: loopback keeps one socket's datagrams in
/// order, so by then every hostile datagram was either dropped by B's kernel or counted.
fn probe(b: &Nic, x: &UdpSocket, to: SocketAddr, hostile: &[Vec<u8>], markers: &[Vec<u8>]) -> Seen {
    let before = seen(b);
    for d in hostile.iter().chain(markers) {
        x.send_to(d, to).unwrap();
    }
    let t0 = Instant::now();
    loop {
        let s = delta(before, seen(b));
        if s.icrc >= markers.len() as u64 {
            // Nothing more comes: read once more after the engine's next copy of the backend's
            // counters (every 10 ms), which may have been taken before the last datagrams.
            std::thread::sleep(Duration::from_millis(30));
            return delta(before, seen(b));
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "markers not seen by B: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A UD QP on `b`, ready to receive (Q_Key 0x1111).
fn ud_qp(b: &Nic) -> QpNumber {
    common::nic_ud_qp(b).0
}

fn case(net: u8, filter: bool) {
    let (ia, ib, ix) = (addr(net, 1), addr(net, 2), addr(net, 3));
    let (a, b) = (nic(ia, filter), nic(ib, filter));
    let (ea, eb) = nic_rc_pair(&a, &b, common::qp_cap(16, 1, 0), 64, 1 << 16, Mtu::M1024);
    let ud = ud_qp(&b);
    let x = UdpSocket::bind((ix, 0)).unwrap();
    // The peer's own address, another port: what a forger with A's address sends.
    let xa = UdpSocket::bind((ia, 0)).unwrap();
    let to = SocketAddr::new(IpAddr::V4(ib), 4791);
    let qb = eb.qp.get();
    let unknown = QpNumber::MASK - 7;
    let hostile = vec![
        bth(RC_WRITE_ONLY, 0xffff, 0, qb, 16), // B's RC QP, not from its peer
        bth(RC_WRITE_ONLY, 0xffff, 0, unknown, 16), // no such QP
        bth(RC_WRITE_ONLY, 0x8001, 0, qb, 16), // another partition
        bth(RC_WRITE_ONLY, 0xffff, 1, qb, 16), // TVer 1
        vec![0u8; 10],                         // shorter than a BTH and an ICRC
        bth(UD_SEND_ONLY, 0xffff, 0, ud.get() + 1000, 8), // no such QP
    ];
    let markers = vec![
        bth(UD_SEND_ONLY, 0xffff, 0, ud.get(), 8), // UD: from anyone
        bth(UD_SEND_ONLY, 0xffff, 0, ud.get(), 8),
    ];
    let s = probe(&b, &x, to, &hostile, &markers);
    if filter {
        assert_eq!(
            s,
            Seen {
                rx_frames: 2,
                icrc: 2,
                kernel: 6,
                ..Seen::default()
            },
            "with the filter only the two UD datagrams reach B"
        );
    } else {
        assert_eq!(
            s,
            Seen {
                rx_frames: 8,
                malformed: 1,
                header: 2,
                unknown_qp: 2,
                address: 1,
                icrc: 2,
                kernel: 0,
            },
            "without the filter B's engine drops each itself"
        );
    }
    // QP1 and the multicast QPN always pass (the engine decides: no QP1 here, so it counts
    // it as unknown); the peer's own address reaches B's RC QP (ICRC then drops it).
    let s = probe(
        &b,
        &xa,
        to,
        &[bth(UD_SEND_ONLY, 0xffff, 0, 1, 8)],
        &[bth(RC_WRITE_ONLY, 0xffff, 0, qb, 16)],
    );
    assert_eq!(
        (s.rx_frames, s.unknown_qp, s.icrc, s.kernel),
        (2, 1, 1, 0),
        "{s:?}"
    );
    // The connection itself works through the filter, both ways.
    write_and_wait(&a, &ea, &eb, 4096);
    write_and_wait(&b, &eb, &ea, 4096);
    // A QP made after the first ones is let through as soon as it is connected; a destroyed
    // one no longer.
    let (ea2, eb2) = nic_rc_pair(&a, &b, common::qp_cap(16, 1, 0), 64, 1 << 16, Mtu::M1024);
    write_and_wait(&a, &ea2, &eb2, 1024);
    let qb2 = eb2.qp.get();
    b.destroy_qp(eb2.qp).unwrap();
    let s = probe(
        &b,
        &xa,
        to,
        &[bth(RC_WRITE_ONLY, 0xffff, 0, qb2, 16)],
        &[bth(RC_WRITE_ONLY, 0xffff, 0, qb, 16)],
    );
    let want = if filter { (1, 0, 1) } else { (2, 1, 0) };
    assert_eq!(
        (s.rx_frames, s.unknown_qp, s.kernel),
        want,
        "destroyed QP: {s:?}"
    );
    let _ = ea2;
}

fn write_and_wait(n: &Nic, from: &common::NicEnd, to: &common::NicEnd, len: usize) {
    let op = SendOp::RdmaWrite {
        remote_addr: to.mr.addr(),
        rkey: to.mr.rkey(),
    };
    from.mr.write(0, &vec![0x5a; len]).unwrap();
    n.post_send(
        from.qp,
        SendWr::new(7, op, vec![common::sge(&from.mr, 0, len)]),
    )
    .unwrap();
    let mut wcs = Vec::new();
    while wcs.is_empty() {
        assert!(
            n.wait_cq(from.cq, Duration::from_secs(10)).unwrap(),
            "no completion"
        );
        n.poll_cq(from.cq, &mut wcs, 4).unwrap();
    }
    assert_eq!(wcs[0].status, WcStatus::Success, "{wcs:?}");
    let mut got = vec![0u8; len];
    to.mr.read(0, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0x5a));
    let _ = ALL;
}

#[test]
fn the_kernel_drops_what_no_qp_takes() {
    case(1, true);
}

#[test]
fn without_the_filter_the_engine_drops_the_same() {
    case(2, false);
}

/// A device serving two addresses (`UdpSet`, a socket each: what the drop-in library opens on
/// an interface with several) is filtered on both sockets: what no QP takes, sent to its
/// second address, is dropped by the kernel there too, and UD datagrams to that address
/// still reach the engine. (Before, a device of several sockets offered no filter at all.)
#[test]
fn the_filter_covers_every_socket_of_a_device_of_several_addresses() {
    let (ib, ib2, ix) = (addr(3, 2), addr(3, 4), addr(3, 3));
    let mut c = UdpConfig::new(IpAddr::V4(ib));
    c.filter = true;
    let locals = [IpAddr::V4(ib), IpAddr::V4(ib2)];
    let dev = ferroce::io::UdpSet::open(&c, &locals).unwrap_or_else(|e| panic!("{locals:?}: {e}"));
    let mut cfg = DeviceConfig::new(MacAddr([2, 0, 0, 0, 0, 2]), IpAddr::V4(ib));
    cfg.gids = locals.to_vec();
    let poll = PollMode::Adaptive {
        spins: 100,
        max_sleep: Duration::from_micros(200),
    };
    let b = Nic::start(cfg, dev, NicOptions { poll, batch: 64 }).unwrap();
    let ud = ud_qp(&b);
    let x = UdpSocket::bind((ix, 0)).unwrap();
    let unknown = QpNumber::MASK - 7;
    let hostile = vec![
        bth(RC_WRITE_ONLY, 0xffff, 0, unknown, 16),  // no such QP
        bth(RC_WRITE_ONLY, 0x8001, 0, ud.get(), 16), // another partition
        bth(UD_SEND_ONLY, 0xffff, 1, ud.get(), 8),   // TVer 1
        vec![0u8; 10],                               // shorter than a BTH and an ICRC
    ];
    let markers = vec![bth(UD_SEND_ONLY, 0xffff, 0, ud.get(), 8); 2];
    for to in [ib, ib2] {
        let s = probe(
            &b,
            &x,
            SocketAddr::new(IpAddr::V4(to), 4791),
            &hostile,
            &markers,
        );
        assert_eq!(
            s,
            Seen {
                rx_frames: 2,
                icrc: 2,
                kernel: 4,
                ..Seen::default()
            },
            "to {to}: only the two UD datagrams reach the engine"
        );
    }
}

/// An address the interface gains while the NIC runs (the drop-in library follows its
/// interface's addresses) is served by the UDP backend's set: `Nic::serve_address` binds a
/// socket for it and the GID table takes it at the next index, after which datagrams to it
/// reach the engine (and are not address drops); asking again keeps the index. A NIC whose
/// engine thread owns the packet device cannot (`Unsupported`).
#[test]
fn an_address_gained_while_running_gets_a_socket() {
    let (ib, extra, ix) = (addr(4, 2), addr(4, 9), addr(4, 3));
    let c = UdpConfig::new(IpAddr::V4(ib));
    let dev = ferroce::io::UdpSet::open(&c, &[IpAddr::V4(ib)]).unwrap();
    let cfg = DeviceConfig::new(MacAddr([2, 0, 0, 0, 0, 2]), IpAddr::V4(ib));
    let opts = NicOptions {
        poll: PollMode::Inline,
        batch: 64,
    };
    let b = Nic::start(cfg, dev, opts).unwrap();
    let ud = ud_qp(&b);
    let x = UdpSocket::bind((ix, 0)).unwrap();
    assert!(
        UdpSocket::bind((extra, 4791)).is_ok(),
        "{extra}:4791 is free before"
    );
    assert_eq!(b.serve_address(IpAddr::V4(extra)).unwrap(), 1);
    assert_eq!(b.serve_address(IpAddr::V4(extra)).unwrap(), 1);
    assert!(
        UdpSocket::bind((extra, 4791)).is_err(),
        "the NIC holds {extra}:4791"
    );
    let markers = vec![bth(UD_SEND_ONLY, 0xffff, 0, ud.get(), 8); 2];
    let s = probe(
        &b,
        &x,
        SocketAddr::new(IpAddr::V4(extra), 4791),
        &[],
        &markers,
    );
    assert_eq!((s.rx_frames, s.icrc, s.address), (2, 2, 0), "{s:?}");
    // An engine thread of its own: not from the application's thread.
    let a = nic(addr(4, 1), false);
    let e = a.serve_address(IpAddr::V4(addr(4, 8))).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::Unsupported);
}

// ---- the filter never drops what the engine takes (no sockets: the interpreter) -----------

mod superset {
    use ferroce::io::cbpf::{run_at, ACCEPT};
    use ferroce::io::udp_filter::{program, Scope, EXACT_MAX};
    use ferroce::time::Instant;
    use ferroce::verbs::*;
    use ferroce::wire::{MacAddr, QpNumber};
    use proptest::prelude::*;
    use std::net::{IpAddr, Ipv4Addr};

    const MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
    const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 5, 0, 2);
    const PEER1: Ipv4Addr = Ipv4Addr::new(10, 5, 0, 1);
    const PEER2: Ipv4Addr = Ipv4Addr::new(10, 5, 0, 3);
    const OTHER: Ipv4Addr = Ipv4Addr::new(10, 5, 0, 9);

    fn mapped(ip: Ipv4Addr) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&ip.octets());
        g
    }

    /// A device with QP1, an RC QP connected to PEER1, an RC QP left in INIT (no path), a
    /// UC QP connected to PEER2, a UD QP, and the number of a destroyed QP.
    fn device() -> (Device, Vec<u32>) {
        let mut d = Device::new(DeviceConfig::new(MAC, IpAddr::V4(LOCAL)));
        let pd = d.alloc_pd().unwrap();
        let cq = d.create_cq(64).unwrap();
        let cap = super::common::qp_cap(8, 1, 0);
        let init = |t| QpInitAttr::new(pd, cq, cq, cap).with_type(t);
        let gsi = d.create_gsi_qp(init(QpType::Ud)).unwrap();
        d.bring_up_ud(gsi, &UdParams::default()).unwrap();
        let remote = |ip, qpn| RemoteQp {
            qpn: QpNumber::new(qpn),
            gid: mapped(ip),
            mac: MacAddr([2, 0, 0, 0, 0, 1]),
            psn: 0,
        };
        let rc = d.create_qp(init(QpType::Rc)).unwrap();
        d.connect_rc(rc, &remote(PEER1, 0x100), &RcParams::default())
            .unwrap();
        let rc_init = d.create_qp(init(QpType::Rc)).unwrap();
        let (a, m) = RcParams::default().init_attr();
        d.modify_qp(rc_init, &a, m).unwrap();
        let uc = d.create_qp(init(QpType::Uc)).unwrap();
        d.connect_uc(uc, &remote(PEER2, 0x101), &UcParams::default())
            .unwrap();
        let ud = d.create_qp(init(QpType::Ud)).unwrap();
        d.bring_up_ud(ud, &UdParams::default()).unwrap();
        let gone = d.create_qp(init(QpType::Rc)).unwrap();
        d.destroy_qp(gone).unwrap();
        let qpns = [gsi, rc, rc_init, uc, ud, gone]
            .iter()
            .map(|q| q.get())
            .collect();
        (d, qpns)
    }

    /// The runtime's conversion, as `Nic` programs the socket with it.
    fn scope(d: &Device, exact_max: usize) -> Scope {
        Scope::from(d.receive_scope(exact_max))
    }

    /// An Ethernet + IPv4 + UDP 4791 frame from `src` to the device carrying `roce` (BTH
    /// onwards, ICRC included), as the UDP backend synthesises it and as the kernel had it.
    fn frame(src: Ipv4Addr, roce: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&MAC.0);
        f.extend_from_slice(&[2, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&[0x08, 0x00]);
        let total = (20 + 8 + roce.len()) as u16;
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0];
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ip.extend_from_slice(&src.octets());
        ip.extend_from_slice(&LOCAL.octets());
        let sum = ip
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum::<u32>();
        let sum = (sum & 0xffff) + (sum >> 16);
        let sum = !(((sum & 0xffff) + (sum >> 16)) as u16);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&0xc000u16.to_be_bytes());
        f.extend_from_slice(&4791u16.to_be_bytes());
        f.extend_from_slice(&((8 + roce.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(roce);
        f
    }

    fn early_drops(d: &Device) -> u64 {
        let (c, _) = d.counters();
        c.malformed_drops + c.not_roce + c.header_drops + c.unknown_qp_drops + c.address_drops
    }

    fn arb_case(qpns: Vec<u32>) -> impl Strategy<Value = (u32, u8, u8, u16, Ipv4Addr, Vec<u8>)> {
        let qpn = prop_oneof![
            4 => proptest::sample::select(qpns),
            1 => Just(1u32),
            1 => Just(0xff_ffffu32),
            1 => 0u32..0x20,
            1 => any::<u32>().prop_map(|q| q & 0xff_ffff),
        ];
        let opcode = prop_oneof![
            // RC SEND/WRITE ONLY, UC SEND ONLY, UD SEND ONLY, CNP, anything.
            proptest::sample::select(vec![0x04u8, 0x0a, 0x24, 0x64, 0x81, 0x11]),
            any::<u8>(),
        ];
        let byte1 = prop_oneof![3 => Just(0u8), 1 => any::<u8>()];
        let pkey = prop_oneof![2 => Just(0xffffu16), 1 => Just(0x7fff), 1 => any::<u16>()];
        let src = proptest::sample::select(vec![PEER1, PEER2, OTHER, LOCAL]);
        let rest = proptest::collection::vec(any::<u8>(), 0..64);
        (qpn, opcode, byte1, pkey, src, rest)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 5000, .. ProptestConfig::default() })]

        /// Whatever the engine takes past its address, header, QPN and source checks, the
        /// filter lets through, with one rule per QP and by QPN range alike.
        #[test]
        fn the_filter_never_drops_what_the_engine_takes(
            (qpn, opcode, byte1, pkey, src, rest) in arb_case(device().1),
            cut in proptest::option::of(0usize..80),
        ) {
            let (mut d, _) = device();
            let mut roce = vec![opcode, byte1];
            roce.extend_from_slice(&pkey.to_be_bytes());
            roce.push(0);
            roce.extend_from_slice(&qpn.to_be_bytes()[1..]);
            roce.extend_from_slice(&[0x80, 0, 0, 1]);
            roce.extend_from_slice(&rest);
            if let Some(n) = cut {
                roce.truncate(n);
            }
            let f = frame(src, &roce);
            let before = early_drops(&d);
            d.handle_frame(Instant::from_nanos(1), &f);
            let engine_dropped = early_drops(&d) > before;
            for exact_max in [EXACT_MAX, 0] {
                let p = program(&scope(&d, exact_max), false);
                let verdict = run_at(&p, &f[34..], Some(&f[14..]));
                prop_assert!(
                    verdict == ACCEPT || engine_dropped,
                    "filter (exact_max {}) dropped what the engine took: {:02x?}",
                    exact_max,
                    roce
                );
            }
        }
    }

    #[test]
    fn the_filter_drops_each_kind_the_engine_drops_first() {
        // The same device and frames the property uses: each of these the engine drops on an
        // early check, and so does the filter (so the property above is not vacuous).
        let (d, q) = device();
        let (rc, rc_init, gone) = (q[1], q[2], q[5]);
        let p = program(&scope(&d, EXACT_MAX), false);
        let bth = |qpn: u32, pkey: u16, tver: u8| {
            let mut r = vec![0x0a, tver];
            r.extend_from_slice(&pkey.to_be_bytes());
            r.push(0);
            r.extend_from_slice(&qpn.to_be_bytes()[1..]);
            r.extend_from_slice(&[0; 4 + 16 + 4]);
            r
        };
        for (what, src, roce) in [
            ("wrong source", OTHER, bth(rc, 0xffff, 0)),
            ("no path yet", PEER1, bth(rc_init, 0xffff, 0)),
            ("destroyed", PEER1, bth(gone, 0xffff, 0)),
            ("P_Key", PEER1, bth(rc, 0x1234, 0)),
            ("TVer", PEER1, bth(rc, 0xffff, 2)),
            ("runt", PEER1, bth(rc, 0xffff, 0)[..15].to_vec()),
        ] {
            let f = frame(src, &roce);
            assert_eq!(run_at(&p, &f[34..], Some(&f[14..])), 0, "{what}");
            let mut d2 = device().0;
            let before = early_drops(&d2);
            d2.handle_frame(Instant::from_nanos(1), &f);
            assert_eq!(
                early_drops(&d2),
                before + 1,
                "the engine drops it too: {what}"
            );
        }
        let ok = frame(PEER1, &bth(rc, 0xffff, 0));
        assert_eq!(run_at(&p, &ok[34..], Some(&ok[14..])), ACCEPT);
    }
}
