//! The AF_PACKET and UDP-socket backends on a real (namespaced) network: `tools/testbed` with
//! prefix `fp` (namespaces fpa, fpr, fpb: A — R — B, routed).
//!
//! **Needs root** (network namespaces, raw sockets). Run as anything else, every test here
//! FAILS with a message saying so: they never pass silently. The tests share one testbed name
//! and are serialised by a lock; each brings the testbed up (`up --force`) and tears it down
//! in a `Drop` guard, also when it fails.
//!
//! Throughput lines (`frames/s`) are printed, not asserted: run with `--nocapture` to see
//! them.

mod common;

use common::net::{prime_neighbours, spawn_in_ns};
use ferroce::io::af_packet::AfPacketRx;

/// What these tests need root for.
const NEEDS: &str = "network namespaces, AF_PACKET: CAP_SYS_ADMIN, CAP_NET_RAW";
use ferroce::io::{AfPacketConfig, AfPacketDevice, AfPacketTx, Medium, PacketDevice};
use ferroce::io::{UdpConfig, UdpDevice};
use ferroce::wire::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::process::Command;
use std::sync::mpsc;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

const PREFIX: &str = "fp";
const A_MAC: MacAddr = MacAddr([0x02, 0xfe, 0x61, 0x01, 0x00, 0x02]);
const RA_MAC: MacAddr = MacAddr([0x02, 0xfe, 0x61, 0x01, 0x00, 0x01]);
const RB_MAC: MacAddr = MacAddr([0x02, 0xfe, 0x61, 0x02, 0x00, 0x01]);
const B_MAC: MacAddr = MacAddr([0x02, 0xfe, 0x61, 0x02, 0x00, 0x02]);
const A4: Ipv4Addr = Ipv4Addr::new(10, 61, 1, 2);
const B4: Ipv4Addr = Ipv4Addr::new(10, 61, 2, 2);

fn a6() -> Ipv6Addr {
    "fd61:1::2".parse().unwrap()
}
fn b6() -> Ipv6Addr {
    "fd61:2::2".parse().unwrap()
}

static LOCK: Mutex<()> = Mutex::new(());

/// The testbed, up for the life of the value.
struct Testbed {
    _lock: std::sync::MutexGuard<'static, ()>,
}

fn testbed_cmd(args: &[&str]) -> std::process::Output {
    let tb = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/testbed");
    Command::new(tb)
        .arg("--prefix")
        .arg(PREFIX)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {tb}: {e}"))
}

impl Testbed {
    fn up(extra: &[&str]) -> Testbed {
        let lock = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let mut args = vec!["up", "--force"];
        args.extend_from_slice(extra);
        let out = testbed_cmd(&args);
        assert!(
            out.status.success(),
            "tools/testbed up failed (needs ip, nft: tools/deps.sh net):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let tb = Testbed { _lock: lock };
        // R resolves A and B (v4 and v6), so that no frame of a burst waits for ARP/ND.
        prime_neighbours(
            &[
                (&host_ns('a'), IpAddr::V4(B4)),
                (&host_ns('a'), IpAddr::V6(b6())),
                (&host_ns('b'), IpAddr::V4(A4)),
                (&host_ns('b'), IpAddr::V6(a6())),
            ],
            &host_ns('r'),
            &[A4.into(), B4.into(), a6().into(), b6().into()],
            Duration::from_secs(10),
        );
        tb
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let out = testbed_cmd(&["down"]);
        if !out.status.success() {
            eprintln!(
                "warning: tools/testbed down failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// The namespace of host `a`, `b` or `r` (the router).
fn host_ns(host: char) -> String {
    format!("{PREFIX}{host}")
}

fn payload_for(psn: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (psn as u8).wrapping_mul(31) ^ (i as u8) ^ (i >> 8) as u8)
        .collect()
}

#[derive(Clone, Copy)]
struct Spec {
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: IpAddr,
    dst: IpAddr,
    ident: u16,
    df: bool,
    sport: u16,
    dport: u16,
    psn: u32,
    len: usize,
    vlan: Option<VlanTag>,
    udp_checksum: bool,
}

impl Spec {
    fn v4(src_mac: MacAddr, dst_mac: MacAddr, src: Ipv4Addr, dst: Ipv4Addr) -> Spec {
        Spec {
            src_mac,
            dst_mac,
            src: src.into(),
            dst: dst.into(),
            ident: 0,
            df: true,
            sport: 0xc000,
            dport: ROCE_V2_PORT,
            psn: 0,
            len: 64,
            vlan: None,
            udp_checksum: false,
        }
    }
    fn v6(src_mac: MacAddr, dst_mac: MacAddr, src: Ipv6Addr, dst: Ipv6Addr) -> Spec {
        Spec {
            src: src.into(),
            dst: dst.into(),
            ..Spec::v4(src_mac, dst_mac, A4, B4)
        }
    }

    fn build(&self) -> Vec<u8> {
        let ip = match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => IpRepr::V4(Ipv4Repr {
                src: s,
                dst: d,
                dscp: 26,
                ecn: Ecn::Ect0,
                ident: self.ident,
                dont_frag: self.df,
                ttl: 64,
            }),
            (IpAddr::V6(s), IpAddr::V6(d)) => IpRepr::V6(Ipv6Repr {
                src: s,
                dst: d,
                dscp: 26,
                ecn: Ecn::Ect0,
                flow_label: 0xbeef,
                hop_limit: 64,
            }),
            _ => unreachable!(),
        };
        let f = FrameRepr {
            eth: Some(EthernetRepr {
                dst: self.dst_mac,
                src: self.src_mac,
                vlan: self.vlan,
                ethertype: 0,
            }),
            ip,
            udp: UdpRepr {
                src_port: self.sport,
                dst_port: self.dport,
                checksum: 0,
            },
            roce: RoceRepr::new(
                BthRepr::new(
                    Opcode::RC_SEND_ONLY,
                    QpNumber::new(0x11),
                    Psn::new(self.psn),
                ),
                ExtRepr::default(),
                self.len,
            ),
        };
        let mut b = vec![0u8; f.buffer_len()];
        f.emit(&mut b, &payload_for(self.psn, self.len)).unwrap();
        if self.udp_checksum {
            let off = if self.vlan.is_some() { 18 } else { 14 };
            let u = off + f.ip.buffer_len();
            ferroce::wire::udp::fill_checksum(self.src, self.dst, &mut b[u..]);
        }
        b
    }
}

fn send_all(dev: &mut dyn PacketDevice, frames: &[Vec<u8>]) {
    let mut i = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while i < frames.len() {
        assert!(
            Instant::now() < deadline,
            "send stalled at {i}/{}",
            frames.len()
        );
        let n = dev
            .send_batch(frames.len() - i, &mut |buf| {
                let f = frames.get(i)?;
                buf[..f.len()].copy_from_slice(f);
                i += 1;
                Some(f.len())
            })
            .unwrap();
        if n == 0 {
            thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Receive until `want` frames arrived or `timeout`, then linger `linger` for extras.
fn collect(
    dev: &mut dyn PacketDevice,
    want: usize,
    timeout: Duration,
    linger: Duration,
) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let deadline = Instant::now() + timeout;
    while out.len() < want && Instant::now() < deadline {
        dev.wait_readable(Some(Duration::from_millis(20))).unwrap();
        dev.recv_batch(64, &mut |f| out.push(f.to_vec())).unwrap();
    }
    let end = Instant::now() + linger;
    while Instant::now() < end {
        dev.wait_readable(Some(Duration::from_millis(10))).unwrap();
        dev.recv_batch(64, &mut |f| out.push(f.to_vec())).unwrap();
    }
    out
}

type Opener = fn() -> Box<dyn PacketDevice>;

/// Open a receiver in `rx_host`, signal, run `send` in `tx_host`, collect `want` frames.
fn exchange(
    rx_host: char,
    open_rx: Opener,
    tx_host: char,
    open_tx: Opener,
    frames: Vec<Vec<u8>>,
    want: usize,
) -> (Vec<Vec<u8>>, Box<dyn PacketDevice>) {
    let (ready_tx, ready_rx) = mpsc::channel();
    let rx = spawn_in_ns(&host_ns(rx_host), move || {
        let mut dev = open_rx();
        ready_tx.send(()).unwrap();
        let got = collect(
            &mut *dev,
            want,
            Duration::from_secs(5),
            Duration::from_millis(300),
        );
        (got, dev)
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("receiver did not come up");
    let tx = spawn_in_ns(&host_ns(tx_host), move || {
        let mut dev = open_tx();
        send_all(&mut *dev, &frames);
        dev
    });
    let txdev = tx.join().unwrap();
    let (got, _rxdev) = rx.join().unwrap();
    (got, txdev)
}

fn afp(ifname: &'static str, tx: AfPacketTx) -> Box<dyn PacketDevice> {
    let mut c = AfPacketConfig::new(ifname);
    c.tx = tx;
    Box::new(AfPacketDevice::open(&c).unwrap_or_else(|e| panic!("AF_PACKET on {ifname}: {e}")))
}

fn udp(local: IpAddr) -> Box<dyn PacketDevice> {
    let d = UdpDevice::open(&UdpConfig::new(local)).unwrap_or_else(|e| panic!("UDP {local}: {e}"));
    assert_eq!(d.medium(), Medium::UdpSocket);
    Box::new(d)
}

const RING: AfPacketTx = AfPacketTx::Ring { slots: 256 };
const MMSG: AfPacketTx = AfPacketTx::Sendmmsg { batch: 64 };

/// Check a frame B received from A through R: ICRC good, forwarded (TTL 63, MACs of the
/// B side), payload as sent. Returns the PSN.
fn check_forwarded(f: &[u8], v6: bool) -> u32 {
    let p = parse_frame(f).unwrap_or_else(|e| panic!("bad frame at B: {e}: {f:02x?}"));
    let eth = p.repr.eth.unwrap();
    assert_eq!((eth.src, eth.dst), (RB_MAC, B_MAC));
    match p.repr.ip {
        IpRepr::V4(r) => {
            assert!(!v6);
            assert_eq!((r.src, r.dst, r.ttl), (A4, B4, 63));
        }
        IpRepr::V6(r) => {
            assert!(v6);
            assert_eq!((r.src, r.dst, r.hop_limit), (a6(), b6(), 63));
        }
    }
    let psn = p.repr.roce.bth.psn.get();
    assert_eq!(p.payload, payload_for(psn, p.payload.len()).as_slice());
    psn
}

#[test]
fn af_packet_a_to_b_through_r_with_filter() {
    require_root!("packet_backends", NEEDS);
    let _tb = Testbed::up(&["--drop-roce-input"]);
    for tx_mode in [MMSG, RING] {
        for v6 in [false, true] {
            let base = if v6 {
                Spec::v6(A_MAC, RA_MAC, a6(), b6())
            } else {
                Spec::v4(A_MAC, RA_MAC, A4, B4)
            };
            let n = 300u32;
            let mut frames = Vec::new();
            for i in 0..n {
                let len = 1 + (i as usize * 37) % 1400;
                frames.push(
                    Spec {
                        psn: i,
                        len,
                        ident: i as u16,
                        sport: 0xc000 | i as u16,
                        ..base
                    }
                    .build(),
                );
                // Decoys: UDP to other ports, which the filter must keep out of B's ring.
                if i % 3 == 0 {
                    for dport in [4790u16, 4792, 53] {
                        frames.push(
                            Spec {
                                psn: 0xabc,
                                dport,
                                len: 16,
                                ..base
                            }
                            .build(),
                        );
                    }
                }
            }
            let open_tx: Opener = if tx_mode == RING {
                || afp("eth0", RING)
            } else {
                || afp("eth0", MMSG)
            };
            let (got, txdev) =
                exchange('b', || afp("eth0", MMSG), 'a', open_tx, frames, n as usize);
            let mut psns: Vec<u32> = got.iter().map(|f| check_forwarded(f, v6)).collect();
            psns.sort_unstable();
            assert_eq!(
                psns,
                (0..n).collect::<Vec<_>>(),
                "{} v6={v6}: every RoCE frame exactly once, no decoy",
                txdev.describe()
            );
            let mut txdev = txdev;
            let st = txdev.stats();
            assert_eq!(st.tx_frames, u64::from(n) + 300, "{st:?}");
            // PACKET_IGNORE_OUTGOING: frames other senders on A transmit (here the kernel's
            // UDP stack, to port 4791, which the filter would pass) do not reach A's ring.
            // (A socket never sees its own transmissions anyway.) Nothing comes back from B:
            // its input drop means no ICMP either.
            let dst = if v6 { IpAddr::V6(b6()) } else { IpAddr::V4(B4) };
            spawn_in_ns(&host_ns('a'), move || {
                let bind: IpAddr = if dst.is_ipv6() {
                    a6().into()
                } else {
                    A4.into()
                };
                let s = UdpSocket::bind((bind, 0)).unwrap();
                for _ in 0..20 {
                    s.send_to(&[0u8; 40], (dst, ROCE_V2_PORT)).unwrap();
                }
            })
            .join()
            .unwrap();
            let echoed = collect(
                &mut *txdev,
                1,
                Duration::from_millis(50),
                Duration::from_millis(10),
            );
            assert!(
                echoed.is_empty(),
                "A's ring received {} frames other senders on A transmitted",
                echoed.len()
            );
            eprintln!(
                "af_packet {} v6={v6}: {} RoCE frames A->B intact, 300 decoys filtered",
                txdev.describe(),
                n
            );
        }
    }
}

#[test]
fn af_packet_reinserts_a_stripped_vlan_tag() {
    require_root!("packet_backends", NEEDS);
    // A sends 802.1Q-tagged frames straight to R's `ra`; the kernel strips the tag into the
    // packet metadata before the packet tap (and the filter) sees the frame, and the device
    // must put it back.
    let _tb = Testbed::up(&["--drop-roce-input"]);
    let mut frames = Vec::new();
    for i in 0..50u32 {
        frames.push(
            Spec {
                psn: i,
                len: 100 + i as usize,
                vlan: Some(VlanTag {
                    pcp: 3,
                    dei: false,
                    vid: 5,
                }),
                ..Spec::v4(A_MAC, RA_MAC, A4, B4)
            }
            .build(),
        );
    }
    let sent = frames.clone();
    let (got, _) = exchange(
        'r',
        || afp("ra", MMSG),
        'a',
        || afp("eth0", MMSG),
        frames,
        50,
    );
    assert_eq!(got.len(), 50);
    for f in &got {
        let p = parse_frame(f).unwrap();
        let v = p.repr.eth.unwrap().vlan.expect("tag re-inserted");
        assert_eq!((v.pcp, v.vid), (3, 5));
        assert!(sent.contains(f), "frame not byte-identical to one sent");
    }
}

fn udp_case(v6: bool) {
    let (la, lb): (IpAddr, IpAddr) = if v6 {
        (a6().into(), b6().into())
    } else {
        (A4.into(), B4.into())
    };
    // The engine's frames: its own MACs, idents and source ports, which the kernel replaces.
    let base = if v6 {
        Spec::v6(A_MAC, RA_MAC, a6(), b6())
    } else {
        Spec::v4(A_MAC, RA_MAC, A4, B4)
    };
    let n = 400u32;
    let sizes: Vec<usize> = (0..n as usize).map(|i| (i * 53) % 1400).collect();
    let frames: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            Spec {
                psn: i,
                len: sizes[i as usize],
                ident: 0x5000 + i as u16,
                sport: 0xd000 + i as u16,
                ..base
            }
            .build()
        })
        .collect();
    let open_rx: Opener = if v6 {
        || udp(b6().into())
    } else {
        || udp(B4.into())
    };
    let open_tx: Opener = if v6 {
        || udp(a6().into())
    } else {
        || udp(A4.into())
    };
    let (got, txdev) = exchange('b', open_rx, 'a', open_tx, frames, n as usize);
    assert_eq!(txdev.stats().tx_frames, u64::from(n));
    let mut psns = Vec::new();
    for f in &got {
        let p = parse_frame(f).unwrap_or_else(|e| panic!("synthesised frame: {e}"));
        assert_eq!(p.repr.ip.src(), la);
        assert_eq!(p.repr.ip.dst(), lb);
        // ECN and DSCP came through IP_RECVTOS / IPV6_RECVTCLASS.
        assert_eq!(p.repr.ip.ecn(), Ecn::Ect0);
        assert_eq!(p.repr.ip.dscp(), 26);
        assert_eq!(p.repr.udp.src_port, ROCE_V2_PORT);
        let psn = p.repr.roce.bth.psn.get();
        if let IpRepr::V4(r) = p.repr.ip {
            // The ID the kernel gave it: 0 for a single datagram, the segment index in a GSO
            // run (the frame verified under it: parse_frame checked the ICRC).
            let want = run_ids(&sizes)[psn as usize];
            assert_eq!((r.ident, r.dont_frag, r.ttl), (want, true, 63), "psn {psn}");
        }
        assert_eq!(p.payload, payload_for(psn, p.payload.len()).as_slice());
        psns.push(psn);
    }
    psns.sort_unstable();
    assert_eq!(psns, (0..n).collect::<Vec<_>>());
    eprintln!("udp v6={v6}: {n} frames A->B, all synthesised frames verify");
}

/// The IPv4 IDs the UDP backend's kernel gives frames with RoCE payloads of `sizes` bytes
/// sent in batches of 64: with segmentation offload, a run of equal-sized datagrams (the
/// last may be shorter) to one destination is one GSO message whose segment i gets ID i
/// (see `io::udp`); a lone datagram gets ID 0.
fn run_ids(sizes: &[usize]) -> Vec<u16> {
    let udp_payload = |n: usize| 12 + n.div_ceil(4) * 4 + 4;
    let mut ids = vec![0u16; sizes.len()];
    for start in (0..sizes.len()).step_by(64) {
        let end = (start + 64).min(sizes.len());
        let mut i = start;
        while i < end {
            let seg = udp_payload(sizes[i]);
            let mut j = i + 1;
            while j < end && udp_payload(sizes[j]) <= seg {
                j += 1;
                if udp_payload(sizes[j - 1]) < seg {
                    break;
                }
            }
            for (k, id) in ids[i..j].iter_mut().enumerate() {
                *id = k as u16;
            }
            i = j;
        }
    }
    ids
}

#[test]
fn udp_socket_a_to_b_ipv4_and_ipv6() {
    require_root!("packet_backends", NEEDS);
    let _tb = Testbed::up(&[]);
    udp_case(false);
    udp_case(true);
}

#[test]
fn af_packet_to_udp_socket_solves_the_ident() {
    require_root!("packet_backends", NEEDS);
    let _tb = Testbed::up(&[]);
    for v6 in [false, true] {
        let base = if v6 {
            Spec::v6(A_MAC, RA_MAC, a6(), b6())
        } else {
            Spec::v4(A_MAC, RA_MAC, A4, B4)
        };
        let n = 300u32;
        let corrupt = [7u32, 100, 250];
        let mut frames = Vec::new();
        for i in 0..n {
            let mut f = Spec {
                psn: i,
                len: 32 + (i as usize * 11) % 1000,
                // rxe-like counting IDs with jumps, DF set and clear.
                ident: 0x1234u16.wrapping_add((i as u16).wrapping_mul(if i % 50 == 0 {
                    97
                } else {
                    1
                })),
                df: i % 10 != 9,
                // IPv4: zero UDP checksum (as rxe sends). IPv6: half of them zero too, which
                // the receiving socket only accepts with UDP_NO_CHECK6_RX.
                udp_checksum: v6 && i % 2 == 0,
                ..base
            }
            .build();
            if corrupt.contains(&i) {
                // Flip a payload byte after the ICRC was computed (UDP checksum 0 for IPv4, so
                // the kernel delivers it; for IPv6 refresh the checksum so it is delivered).
                let n = f.len();
                f[n - 10] ^= 0x5a;
                if v6 && i % 2 == 0 {
                    let u = 14 + 40;
                    ferroce::wire::udp::fill_checksum(base.src, base.dst, &mut f[u..]);
                }
            }
            frames.push(f);
        }
        let expect = frames.clone();
        let (tx_rx, rx_rx) = mpsc::channel();
        // Receive with a concrete UdpDevice to read its ident statistics.
        let rx = spawn_in_ns(&host_ns('b'), move || {
            let local: IpAddr = if v6 { b6().into() } else { B4.into() };
            let mut dev = UdpDevice::open(&UdpConfig::new(local)).unwrap();
            tx_rx.send(()).unwrap();
            let got = collect(
                &mut dev,
                n as usize,
                Duration::from_secs(5),
                Duration::from_millis(200),
            );
            (got, dev.ident_stats())
        });
        rx_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        spawn_in_ns(&host_ns('a'), move || {
            send_all(&mut *afp("eth0", MMSG), &frames)
        })
        .join()
        .unwrap();
        let (got, ids) = rx.join().unwrap();
        assert_eq!(got.len(), n as usize, "every datagram delivered (v6={v6})");
        let mut bad = 0;
        for f in &got {
            match parse_frame(f) {
                Ok(p) => {
                    let psn = p.repr.roce.bth.psn.get();
                    assert!(!corrupt.contains(&psn));
                    // The synthesised header carries the sender's real ID and DF.
                    let sent = decode_frame_ip(&expect[psn as usize]);
                    assert_eq!(ip_id_df(&p.repr.ip), sent, "psn {psn}");
                    assert_eq!(p.payload, payload_for(psn, p.payload.len()).as_slice());
                }
                Err(Error::BadIcrc { .. }) => bad += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(
            bad,
            corrupt.len(),
            "exactly the corrupted frames fail the ICRC"
        );
        if v6 {
            assert_eq!(ids, Default::default());
        } else {
            assert_eq!(ids.unsolved, corrupt.len() as u64, "{ids:?}");
            assert_eq!(ids.guessed + ids.solved, u64::from(n) - 3, "{ids:?}");
            assert!(ids.solved_df_flipped > 0, "{ids:?}");
            assert!(
                ids.guessed > ids.solved,
                "last+1 guess should mostly hit: {ids:?}"
            );
        }
        eprintln!("af_packet A -> udp B v6={v6}: {n} frames, {ids:?}");
    }
}

fn decode_frame_ip(f: &[u8]) -> Option<(u16, bool)> {
    ip_id_df(&ferroce::wire::packet::decode_frame(f).unwrap().repr.ip)
}

fn ip_id_df(ip: &IpRepr) -> Option<(u16, bool)> {
    match ip {
        IpRepr::V4(r) => Some((r.ident, r.dont_frag)),
        IpRepr::V6(_) => None,
    }
}

/// Run `cmd args` in namespace `<prefix><host>`; panics with its output if it fails.
fn ns_cmd(host: char, cmd: &str, args: &[&str]) {
    let out = Command::new("ip")
        .args(["netns", "exec", &format!("{PREFIX}{host}"), cmd])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ip netns exec {cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} in {PREFIX}{host}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn udp_socket_to_af_packet_has_a_valid_icrc_on_the_wire() {
    require_root!("packet_backends", NEEDS);
    // What the UDP backend's kernel puts on the wire, captured with AF_PACKET at the peer:
    // every ICRC must verify under the headers the kernel wrote, IPv4 IDs being those of
    // the kernel's segmentation (segment i of a GSO run: ID i; a lone datagram: 0) with DF —
    // the prediction the ICRC correction rests on. Twice: as veth delivers it by default (a
    // GSO run arrives at A as one super-frame, which the AF_PACKET device splits with
    // PACKET_VNET_HDR, in both receive modes), and with UDP segmentation turned off on R's
    // egress towards A (R's kernel cuts the runs into datagrams: its IDs on a real wire).
    let _tb = Testbed::up(&[]);
    let rx_modes: [(&str, Opener); 2] = [
        ("ring", || afp("eth0", MMSG)),
        ("recvmmsg", || {
            let mut c = AfPacketConfig::new("eth0");
            c.rx = AfPacketRx::Recvmmsg { batch: 64 };
            c.tx = MMSG;
            Box::new(AfPacketDevice::open(&c).expect("AF_PACKET recvmmsg"))
        }),
    ];
    for (path, r_segments) in [("whole to A", false), ("segmented by R", true)] {
        if r_segments {
            ns_cmd('r', "ethtool", &["-K", "ra", "tx-udp-segmentation", "off"]);
        }
        for (mode, open_rx) in rx_modes {
            for v6 in [false, true] {
                udp_to_af_packet(v6, open_rx, &format!("{path}, {mode}"));
            }
        }
    }
}

fn udp_to_af_packet(v6: bool, open_rx: Opener, label: &str) {
    let base = if v6 {
        Spec::v6(B_MAC, RB_MAC, b6(), a6())
    } else {
        Spec::v4(B_MAC, RB_MAC, B4, A4)
    };
    let n = 200u32;
    // Growing sizes with wraps (lone datagrams and runs of two), then a run of 60 equal ones.
    let sizes: Vec<usize> = (0..n as usize)
        .map(|i| if i < 140 { (i * 29) % 1300 } else { 777 })
        .collect();
    let frames: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            Spec {
                psn: i,
                len: sizes[i as usize],
                ident: 0x7777,
                df: false,
                sport: 0xe000,
                ..base
            }
            .build()
        })
        .collect();
    let open_tx: Opener = if v6 {
        || udp(b6().into())
    } else {
        || udp(B4.into())
    };
    let (got, _) = exchange('a', open_rx, 'b', open_tx, frames, n as usize);
    assert_eq!(got.len(), n as usize, "v6={v6} {label}");
    let ids = run_ids(&sizes);
    let mut psns = Vec::new();
    for f in &got {
        let p = parse_frame(f).unwrap_or_else(|e| panic!("kernel-sent frame ({label}): {e}"));
        assert_eq!(p.repr.udp.src_port, ROCE_V2_PORT);
        let psn = p.repr.roce.bth.psn.get();
        match p.repr.ip {
            IpRepr::V4(r) => {
                let want = ids[psn as usize];
                assert_eq!(
                    (r.ident, r.dont_frag, r.ttl),
                    (want, true, 63),
                    "psn {psn} ({label}): {r:?}"
                );
                assert_eq!((r.dscp, r.ecn), (26, Ecn::Ect0));
            }
            IpRepr::V6(r) => {
                assert_eq!(r.hop_limit, 63);
                assert_eq!((r.dscp, r.ecn), (26, Ecn::Ect0));
            }
        }
        assert_eq!(p.payload, payload_for(psn, p.payload.len()).as_slice());
        psns.push(psn);
    }
    psns.sort_unstable();
    assert_eq!(psns, (0..n).collect::<Vec<_>>());
    assert!(
        ids.iter().any(|&i| i > 1),
        "the run of equal sizes was one GSO message"
    );
    eprintln!("udp B -> af_packet A v6={v6} ({label}): {n} kernel-built frames, ICRC valid");
}

/// Send `secs` worth of one 1024-byte-payload frame from A, count at B. Printed, not asserted.
fn rate(label: &str, open_rx: Opener, open_tx: Opener, frame: Vec<u8>, secs: f64) {
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let rx = spawn_in_ns(&host_ns('b'), move || {
        let mut dev = open_rx();
        ready_tx.send(()).unwrap();
        let mut n = 0u64;
        let mut first = None;
        let mut last = Instant::now();
        let mut done = false;
        let mut idle_since: Option<Instant> = None;
        let give_up = Instant::now() + Duration::from_secs(30);
        while Instant::now() < give_up {
            dev.wait_readable(Some(Duration::from_millis(5))).unwrap();
            let k = dev.recv_batch(256, &mut |_| {}).unwrap();
            done = done || done_rx.try_recv().is_ok();
            if k > 0 {
                first.get_or_insert_with(Instant::now);
                last = Instant::now();
                n += k as u64;
                idle_since = None;
            } else if done {
                let t = *idle_since.get_or_insert_with(Instant::now);
                if t.elapsed() > Duration::from_millis(200) {
                    break;
                }
            }
        }
        let dt = first.map_or(0.0, |f| (last - f).as_secs_f64());
        (n, dt, dev.stats())
    });
    ready_rx.recv().unwrap();
    let tx = spawn_in_ns(&host_ns('a'), move || {
        let mut dev = open_tx();
        let start = Instant::now();
        let mut sent = 0u64;
        while start.elapsed().as_secs_f64() < secs {
            let k = dev
                .send_batch(32, &mut |buf| {
                    buf[..frame.len()].copy_from_slice(&frame);
                    Some(frame.len())
                })
                .unwrap();
            sent += k as u64;
            if k == 0 {
                thread::yield_now();
            }
        }
        (
            sent,
            start.elapsed().as_secs_f64(),
            dev.stats(),
            dev.describe(),
        )
    });
    let (sent, tdt, tst, desc) = tx.join().unwrap();
    let _ = done_tx.send(());
    let (got, rdt, rst) = rx.join().unwrap();
    println!(
        "RATE {label:<34} tx {:>9.0} frames/s ({sent} in {tdt:.2}s, tx_dropped {}) | rx {:>9.0} frames/s ({got} received, {:.1}% lost, rx_dropped {}) [{desc}]",
        sent as f64 / tdt,
        tst.tx_dropped,
        if rdt > 0.0 { got as f64 / rdt } else { 0.0 },
        100.0 * (1.0 - got as f64 / (sent.max(1)) as f64),
        rst.rx_dropped,
    );
}

/// Transmit-only rate of an AF_PACKET TX mode: frames go to a MAC nobody has, so R drops them
/// on arrival and the sender's time is (almost) all its own TX path. Printed, not asserted.
fn tx_only_rate(open_tx: Opener, secs: f64) -> (f64, String) {
    spawn_in_ns(&host_ns('a'), move || {
        let mut dev = open_tx();
        let frame = Spec {
            len: 1024,
            ..Spec::v4(A_MAC, MacAddr([0x02, 0, 0, 0, 0, 0x99]), A4, B4)
        }
        .build();
        let start = Instant::now();
        let mut sent = 0u64;
        while start.elapsed().as_secs_f64() < secs {
            let k = dev
                .send_batch(64, &mut |buf| {
                    buf[..frame.len()].copy_from_slice(&frame);
                    Some(frame.len())
                })
                .unwrap();
            sent += k as u64;
            if k == 0 {
                thread::yield_now();
            }
        }
        (sent as f64 / start.elapsed().as_secs_f64(), dev.describe())
    })
    .join()
    .unwrap()
}

#[test]
fn throughput_1024_byte_payload_frames() {
    require_root!("packet_backends", NEEDS);
    let _tb = Testbed::up(&["--drop-roce-input"]);
    let secs = 1.5;
    let v4 = Spec {
        len: 1024,
        ..Spec::v4(A_MAC, RA_MAC, A4, B4)
    }
    .build();
    let v6 = Spec {
        len: 1024,
        ..Spec::v6(A_MAC, RA_MAC, a6(), b6())
    }
    .build();
    println!(
        "frame sizes: IPv4 {} bytes, IPv6 {} bytes (1024-byte RoCE payload)",
        v4.len(),
        v6.len()
    );
    for round in 0..3 {
        for (open, name) in [
            ((|| afp("eth0", MMSG)) as Opener, "sendmmsg x64"),
            ((|| afp("eth0", RING)) as Opener, "tx ring 256"),
        ] {
            let (r, _) = tx_only_rate(open, 1.0);
            println!("TXONLY round {round} af_packet {name:<13} {r:>9.0} frames/s");
        }
    }
    rate(
        "af_packet tx=sendmmsg -> af_packet",
        || afp("eth0", MMSG),
        || afp("eth0", MMSG),
        v4.clone(),
        secs,
    );
    rate(
        "af_packet tx=ring -> af_packet",
        || afp("eth0", MMSG),
        || afp("eth0", RING),
        v4.clone(),
        secs,
    );
    // UDP sockets need the RoCE port open at B's input.
    let out = testbed_cmd(&["input-drop", "off"]);
    assert!(out.status.success());
    rate(
        "udp v4 -> udp v4",
        || udp(B4.into()),
        || udp(A4.into()),
        v4.clone(),
        secs,
    );
    rate(
        "udp v6 -> udp v6",
        || udp(b6().into()),
        || udp(a6().into()),
        v6,
        secs,
    );
    rate(
        "af_packet -> udp v4 (ident guess)",
        || udp(B4.into()),
        || afp("eth0", MMSG),
        v4,
        secs,
    );
}

/// Full-speed stream of distinct frames (every frame a different PSN and payload) from A,
/// each checked at B: ICRC, payload. A TX mechanism that let user space reuse a buffer the
/// kernel still references would show up here as corrupt frames.
fn stress(open_tx: Opener, frames_total: u32) -> (u64, u64, u64, String) {
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let rx = spawn_in_ns(&host_ns('b'), move || {
        let mut dev = afp("eth0", MMSG);
        ready_tx.send(()).unwrap();
        let (mut ok, mut bad) = (0u64, 0u64);
        let mut done = false;
        let mut idle_since: Option<Instant> = None;
        let give_up = Instant::now() + Duration::from_secs(60);
        while Instant::now() < give_up {
            dev.wait_readable(Some(Duration::from_millis(5))).unwrap();
            let k = dev
                .recv_batch(256, &mut |f| {
                    let good = parse_frame(f).is_ok_and(|p| {
                        p.payload == payload_for(p.repr.roce.bth.psn.get(), p.payload.len())
                    });
                    if good {
                        ok += 1;
                    } else {
                        bad += 1;
                    }
                })
                .unwrap();
            done = done || done_rx.try_recv().is_ok();
            if k > 0 {
                idle_since = None;
            } else if done {
                let t = *idle_since.get_or_insert_with(Instant::now);
                if t.elapsed() > Duration::from_millis(300) {
                    break;
                }
            }
        }
        (ok, bad)
    });
    ready_rx.recv().unwrap();
    let tx = spawn_in_ns(&host_ns('a'), move || {
        let mut dev = open_tx();
        let mut psn = 0u32;
        let base = Spec {
            len: 1024,
            ..Spec::v4(A_MAC, RA_MAC, A4, B4)
        };
        while psn < frames_total {
            let k = dev
                .send_batch(256, &mut |buf| {
                    if psn >= frames_total {
                        return None;
                    }
                    let f = Spec { psn, ..base }.build();
                    psn += 1;
                    buf[..f.len()].copy_from_slice(&f);
                    Some(f.len())
                })
                .unwrap();
            if k == 0 {
                thread::yield_now();
            }
        }
        (dev.stats().tx_frames, dev.describe())
    });
    let (sent, desc) = tx.join().unwrap();
    let _ = done_tx.send(());
    let (ok, bad) = rx.join().unwrap();
    (sent, ok, bad, desc)
}

#[test]
fn af_packet_full_speed_distinct_frames_arrive_intact() {
    require_root!("packet_backends", NEEDS);
    let _tb = Testbed::up(&["--drop-roce-input"]);
    for (open, name) in [
        ((|| afp("eth0", MMSG)) as Opener, "sendmmsg"),
        ((|| afp("eth0", RING)) as Opener, "tx ring"),
    ] {
        let (sent, ok, bad, desc) = stress(
            open,
            std::env::var("FP_STRESS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(100_000),
        );
        println!(
            "STRESS {name:<9} sent {sent}, intact {ok}, corrupt {bad}, lost {} [{desc}]",
            sent.saturating_sub(ok + bad)
        );
        assert_eq!(bad, 0, "{name}: corrupt frames at B");
    }
}
