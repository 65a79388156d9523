//! The AF_XDP backend for real, on the testbed: A (netns `fxa`) sends RoCE frames through
//! the router R (`fxr`) to B (`fxb`); an `XdpDevice` on each end's `eth0`.
//!
//! Needs root (namespaces, BPF, AF_XDP). Without root this test **fails** (it never passes
//! silently): the CI runs it as root. It uses the testbed prefix `fx` only, brings it up
//! with `tools/testbed up --prefix fx --drop-roce-input` and tears it down when done (also
//! on failure).
//!
//! Checked:
//! - the program attaches (native mode on veth with a BPF link; generic mode and netlink
//!   attachment in a second round), the kernel's own run of it classifies frames right;
//! - ICMP (IPv4 and IPv6), ARP/neighbour discovery, TCP and non-RoCE UDP keep working while
//!   it is attached, and a kernel-sent UDP datagram to port 4791 lands in B's socket;
//! - RoCE frames of many sizes (IPv4 and IPv6) arrive at B byte for byte as R forwards them
//!   (only MACs, TTL/hop limit and the IPv4 checksum changed; ICRC still valid), none of them
//!   reaching B's kernel (its nft drop counter stays 0);
//! - zero-copy is refused on veth with a clear error; a verifier rejection comes with the log;
//! - with 2 queues on B's veth, `open_all_queues` receives on both;
//! - with MTU 4200, RoCE path-MTU-4096 frames cross (multi-buffer AF_XDP), native and generic;
//! - a ferroce program another process attached is adopted and left attached; a foreign
//!   XDP program is refused, not replaced;
//! - after the devices are dropped no XDP program is left on either interface.
//!
//! It prints the throughput A→B for 1024-byte-payload frames (not asserted).

mod common;

use common::net::{in_ns, must, Testbed};

/// What these tests need root for.
const NEEDS: &str =
    "network namespaces, BPF, AF_XDP: CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_BPF, CAP_NET_RAW";
use ferroce::io::ebpf::{self, action};
use ferroce::io::{
    AttachMethod, PacketDevice, XdpDevice, XdpMode, XdpOptions, XdpProgram, ZeroCopy,
};
use ferroce::wire::{
    parse_frame, BthRepr, Ecn, EthernetRepr, ExtRepr, FrameRepr, IpRepr, Ipv4Repr, Ipv6Repr,
    MacAddr, Opcode, PKey, Psn, QpNumber, RoceRepr, UdpRepr, VlanTag,
};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const PREFIX: &str = "fx";
const A_MAC: [u8; 6] = [0x02, 0xfe, 0x61, 0x01, 0x00, 0x02];
const RA_MAC: [u8; 6] = [0x02, 0xfe, 0x61, 0x01, 0x00, 0x01];
const RB_MAC: [u8; 6] = [0x02, 0xfe, 0x61, 0x02, 0x00, 0x01];
const B_MAC: [u8; 6] = [0x02, 0xfe, 0x61, 0x02, 0x00, 0x02];
const A_V4: Ipv4Addr = Ipv4Addr::new(10, 61, 1, 2);
const B_V4: Ipv4Addr = Ipv4Addr::new(10, 61, 2, 2);
const A_V6: Ipv6Addr = Ipv6Addr::new(0xfd61, 1, 0, 0, 0, 0, 0, 2);
const B_V6: Ipv6Addr = Ipv6Addr::new(0xfd61, 2, 0, 0, 0, 0, 0, 2);

/// The testbed (`common::net::Testbed`) with RoCE dropped at A's and B's input hooks.
fn testbed() -> Testbed {
    let tb = Testbed::up(PREFIX, &["--drop-roce-input"]);
    for ns in ["fxa", "fxr", "fxb"] {
        assert!(
            std::path::Path::new(&format!("/run/netns/{ns}")).exists(),
            "namespace {ns} missing after tools/testbed up"
        );
    }
    tb
}

fn open(ns: &'static str, all: bool, opts: XdpOptions) -> XdpDevice {
    in_ns(ns, move || {
        if all {
            XdpDevice::open_all_queues("eth0", opts)
        } else {
            XdpDevice::open("eth0", 0, opts)
        }
    })
    .unwrap_or_else(|e| panic!("XdpDevice::open in {ns}: {e}"))
}

/// `ip -n NS link show eth0`.
fn link_show(ns: &str) -> String {
    must(&["ip", "-n", ns, "link", "show", "eth0"])
}

/// Take whatever generic-mode XDP program is on `ns`'s eth0 off.
fn detach_generic(ns: &str) {
    must(&[
        "ip",
        "-n",
        ns,
        "link",
        "set",
        "dev",
        "eth0",
        "xdpgeneric",
        "off",
    ]);
}

fn assert_no_xdp(ns: &str) {
    let s = link_show(ns);
    assert!(
        !s.contains("xdp") && !s.contains("prog/"),
        "an XDP program is still attached in {ns}:\n{s}"
    );
}

/// Packets counted by B's (or A's) nft rule dropping UDP 4791 at the input hook.
fn roce_input_drops(ns: &str) -> u64 {
    let s = must(&[
        "ip",
        "netns",
        "exec",
        ns,
        "nft",
        "list",
        "table",
        "inet",
        "ferroce_host",
    ]);
    s.split("counter packets ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no counter in:\n{s}"))
}

/// RoCE frame number `i` from A to B (through R): RC SEND ONLY to QP 0x11 with PSN `i` and
/// `payload_len` bytes of a pattern depending on `i`.
fn roce_frame(i: u32, v6: bool, payload_len: usize, vlan: bool) -> Vec<u8> {
    let payload: Vec<u8> = (0..payload_len)
        .map(|k| (k as u32).wrapping_mul(7).wrapping_add(i) as u8)
        .collect();
    let mut bth = BthRepr::new(Opcode::RC_SEND_ONLY, QpNumber::new(0x11), Psn::new(i));
    bth.pkey = PKey::DEFAULT;
    bth.ack_req = true;
    let ip = if v6 {
        IpRepr::V6(Ipv6Repr {
            src: A_V6,
            dst: B_V6,
            dscp: 26,
            ecn: Ecn::Ect0,
            flow_label: i & 0xfffff,
            hop_limit: 64,
        })
    } else {
        IpRepr::V4(Ipv4Repr {
            src: A_V4,
            dst: B_V4,
            dscp: 26,
            ecn: Ecn::Ect0,
            ident: i as u16,
            dont_frag: true,
            ttl: 64,
        })
    };
    let f = FrameRepr {
        eth: Some(EthernetRepr {
            dst: MacAddr(RA_MAC),
            src: MacAddr(A_MAC),
            vlan: vlan.then_some(VlanTag {
                pcp: 3,
                dei: false,
                vid: 61,
            }),
            ethertype: 0,
        }),
        ip,
        udp: UdpRepr {
            src_port: 0xc000 | (i as u16 & 0x3fff),
            dst_port: 4791,
            checksum: 0,
        },
        roce: RoceRepr::new(bth, ExtRepr::default(), payload.len()),
    };
    let mut buf = vec![0u8; f.buffer_len()];
    let n = f.emit(&mut buf, &payload).expect("emit");
    buf.truncate(n);
    if v6 {
        // IPv6 UDP needs a checksum (RFC 8200); R does not check it, but be proper.
        let udp_at = 14 + if vlan { 4 } else { 0 } + 40;
        ferroce::wire::udp::fill_checksum(A_V6.into(), B_V6.into(), &mut buf[udp_at..]);
    }
    buf
}

/// What `sent` looks like after R forwarded it to B.
fn forwarded(sent: &[u8]) -> Vec<u8> {
    let mut f = sent.to_vec();
    f[0..6].copy_from_slice(&B_MAC);
    f[6..12].copy_from_slice(&RB_MAC);
    match u16::from_be_bytes([f[12], f[13]]) {
        0x0800 => {
            f[14 + 8] -= 1; // TTL
            f[14 + 10..14 + 12].fill(0);
            let c = ferroce::wire::ip::internet_checksum(&f[14..34]);
            f[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
        }
        0x86dd => f[14 + 7] -= 1, // hop limit
        e => panic!("ethertype {e:#x}"),
    }
    f
}

/// Send `frames` from `a`, all of them, in batches.
fn send_all(a: &mut XdpDevice, frames: &[Vec<u8>]) {
    let mut next = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while next < frames.len() {
        assert!(Instant::now() < deadline, "could not send all frames");
        let n = a
            .send_batch(32, &mut |buf| {
                let f = frames.get(next)?;
                buf[..f.len()].copy_from_slice(f);
                next += 1;
                Some(f.len())
            })
            .expect("send_batch");
        if n == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Receive until `want` frames arrived or `timeout` passed.
fn recv_frames(b: &mut XdpDevice, want: usize, timeout: Duration) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let deadline = Instant::now() + timeout;
    while got.len() < want && Instant::now() < deadline {
        b.wait_readable(Some(Duration::from_millis(20)))
            .expect("wait_readable");
        b.recv_batch(64, &mut |f| got.push(f.to_vec()))
            .expect("recv_batch");
    }
    got
}

/// Send RoCE frames A→B and check each arrives as R forwards it.
fn check_roce_delivery(a: &mut XdpDevice, b: &mut XdpDevice, count: u32, max_payload: usize) {
    let frames: Vec<Vec<u8>> = (0..count)
        .map(|i| {
            // Payload sizes 0..=max (every pad count, and the maximum every 8th frame), IPv4
            // and IPv6 alternating in runs.
            let len = if i % 8 == 0 {
                max_payload
            } else {
                ((i as usize) * 37) % (max_payload + 1)
            };
            roce_frame(i, (i / 3) % 2 == 1, len, false)
        })
        .collect();
    send_all(a, &frames);
    let got = recv_frames(b, frames.len(), Duration::from_secs(5));
    assert_eq!(
        got.len(),
        frames.len(),
        "B received {} of {} RoCE frames (A stats {:?}, B stats {:?}, B kernel {:?})",
        got.len(),
        frames.len(),
        a.stats(),
        b.stats(),
        b.kernel_stats()
    );
    let mut seen = vec![false; frames.len()];
    for g in &got {
        let p = parse_frame(g).unwrap_or_else(|e| panic!("B got a bad frame ({e}): {g:02x?}"));
        assert_eq!(p.icrc_stored, p.icrc_computed, "ICRC");
        let i = p.repr.roce.bth.psn.get() as usize;
        assert!(!seen[i], "PSN {i} twice");
        seen[i] = true;
        assert_eq!(g, &forwarded(&frames[i]), "frame {i} changed on the way");
    }
}

/// Copy mode: a batch of 256 frames goes through the kernel in as few `sendto` calls as the
/// transmit budget allows — one, on kernels with `XDP_MAX_TX_SKB_BUDGET` (6.17+), where
/// the device sets it to the ring size; 256 / 32 otherwise — and every frame arrives.
fn check_one_kick_per_batch(a: &mut XdpDevice, b: &mut XdpDevice) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release
        .split(['.', '-'])
        .map(|x| x.parse::<u32>().unwrap_or(0));
    let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
    if (major, minor) >= (6, 17) {
        assert!(
            a.tx_budget() >= 256,
            "budget {} on {release}",
            a.tx_budget()
        );
    }
    let frames: Vec<Vec<u8>> = (0..256)
        .map(|i| roce_frame(10_000 + i, false, 512, false))
        .collect();
    let kicks = a.tx_kicks();
    let mut next = 0;
    let n = a
        .send_batch(256, &mut |buf| {
            let f = frames.get(next)?;
            buf[..f.len()].copy_from_slice(f);
            next += 1;
            Some(f.len())
        })
        .expect("send_batch");
    assert_eq!(n, 256);
    let used = a.tx_kicks() - kicks;
    let got = recv_frames(b, 256, Duration::from_secs(5));
    assert_eq!(got.len(), 256);
    println!(
        "256 frames in {used} sendto calls (tx budget {})",
        a.tx_budget()
    );
    // (A completion ring that fills up costs one more call.)
    assert!(
        used <= 256u64.div_ceil(u64::from(a.tx_budget())) + 1,
        "{used} kicks for 256 frames with budget {}",
        a.tx_budget()
    );
}

/// Ping, neighbour resolution, TCP and UDP that is not RoCE, with the programs attached.
fn check_other_traffic_still_works() {
    // Forget all neighbours, so that ARP and NDP must run (through the XDP programs) again.
    for (ns, dev) in [
        ("fxa", "eth0"),
        ("fxr", "ra"),
        ("fxr", "rb"),
        ("fxb", "eth0"),
    ] {
        must(&["ip", "-n", ns, "neigh", "flush", "dev", dev]);
    }
    let ping = must(&[
        "ip",
        "netns",
        "exec",
        "fxa",
        "ping",
        "-c",
        "3",
        "-i",
        "0.2",
        "-W",
        "2",
        "10.61.2.2",
    ]);
    assert!(ping.contains(" 0% packet loss"), "ping A→B:\n{ping}");
    let ping6 = must(&[
        "ip",
        "netns",
        "exec",
        "fxa",
        "ping",
        "-6",
        "-c",
        "3",
        "-i",
        "0.2",
        "-W",
        "2",
        "fd61:2::2",
    ]);
    assert!(ping6.contains(" 0% packet loss"), "ping -6 A→B:\n{ping6}");
    // The kernels answered ARP and NDP while the programs were attached.
    let r_neigh = must(&["ip", "-n", "fxr", "neigh", "show", "dev", "rb"]);
    assert!(
        r_neigh.contains("10.61.2.2 lladdr 02:fe:61:02:00:02")
            && r_neigh.contains("fd61:2::2 lladdr 02:fe:61:02:00:02"),
        "R did not resolve B:\n{r_neigh}"
    );
    let a_neigh = must(&["ip", "-n", "fxa", "neigh", "show", "dev", "eth0"]);
    assert!(
        a_neigh.contains("10.61.1.1 lladdr 02:fe:61:01:00:01"),
        "A did not resolve R:\n{a_neigh}"
    );

    // UDP to another port and TCP reach B's kernel.
    let (udp, tcp) = in_ns("fxb", || {
        let u = UdpSocket::bind("10.61.2.2:9999").expect("udp bind in fxb");
        u.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let t = TcpListener::bind("10.61.2.2:9998").expect("tcp bind in fxb");
        (u, t)
    });
    let server = std::thread::spawn(move || {
        let (mut s, _) = tcp.accept().expect("tcp accept");
        let mut b = [0u8; 5];
        std::io::Read::read_exact(&mut s, &mut b).expect("tcp read");
        std::io::Write::write_all(&mut s, &b).expect("tcp write");
    });
    in_ns("fxa", || {
        let u = UdpSocket::bind("0.0.0.0:0").unwrap();
        u.send_to(b"not roce", "10.61.2.2:9999").unwrap();
        let addr: SocketAddr = "10.61.2.2:9998".parse().unwrap();
        let mut s =
            TcpStream::connect_timeout(&addr, Duration::from_secs(3)).expect("tcp connect A→B");
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        std::io::Write::write_all(&mut s, b"hello").unwrap();
        let mut b = [0u8; 5];
        std::io::Read::read_exact(&mut s, &mut b).expect("tcp echo");
        assert_eq!(&b, b"hello");
    });
    server.join().unwrap();
    let mut buf = [0u8; 64];
    let (n, from) = udp
        .recv_from(&mut buf)
        .expect("UDP 9999 did not reach B's kernel");
    assert_eq!(&buf[..n], b"not roce");
    assert_eq!(from.ip(), std::net::IpAddr::V4(A_V4));
}

/// A datagram A's kernel sends to UDP 4791 is taken by B's program into B's socket.
fn check_kernel_udp_4791_lands_in_the_socket(b: &mut XdpDevice) {
    in_ns("fxa", || {
        let u = UdpSocket::bind("0.0.0.0:0").unwrap();
        u.send_to(b"kernel-sent roce port", "10.61.2.2:4791")
            .unwrap();
    });
    let got = recv_frames(b, 1, Duration::from_secs(3));
    assert_eq!(
        got.len(),
        1,
        "the kernel-sent UDP 4791 datagram did not reach B's socket"
    );
    assert!(got[0].ends_with(b"kernel-sent roce port"));
}

/// The kernel runs the attached program (BPF_PROG_TEST_RUN) on sample frames.
fn check_kernel_verdicts(a: &XdpDevice) {
    let v4 = roce_frame(1, false, 64, false);
    let v6 = roce_frame(2, true, 64, false);
    let vlan = roce_frame(3, false, 64, true);
    let vlan6 = roce_frame(4, true, 64, true);
    let mut opts = v4.clone(); // IPv4 with 8 bytes of options (IHL 7)
    opts[14] = 0x47;
    opts.splice(34..34, [1u8; 8]);
    let mut arp = v4.clone();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    let mut other_udp = v4.clone();
    other_udp[36..38].copy_from_slice(&4792u16.to_be_bytes());
    let mut tcp = v4.clone();
    tcp[23] = 6;
    let mut v6ext = v6.clone();
    v6ext[20] = 0;
    for (what, f, want) in [
        ("ipv4", &v4, action::REDIRECT),
        ("ipv6", &v6, action::REDIRECT),
        ("vlan ipv4", &vlan, action::REDIRECT),
        ("vlan ipv6", &vlan6, action::REDIRECT),
        ("ipv4 options", &opts, action::REDIRECT),
        ("arp", &arp, action::PASS),
        ("udp 4792", &other_udp, action::PASS),
        ("tcp", &tcp, action::PASS),
        ("ipv6 ext header", &v6ext, action::PASS),
        ("truncated", &v4[..40].to_vec(), action::PASS),
    ] {
        assert_eq!(a.program_verdict(f).expect("test run"), want, "{what}");
    }
}

/// Frames per second A→B for `secs` seconds; prints, does not assert.
fn throughput(a: XdpDevice, b: XdpDevice, secs: f64) -> (XdpDevice, XdpDevice) {
    let frame = roce_frame(7, false, 1024, false);
    let done = AtomicBool::new(false);
    let (a, b, sent, recvd, elapsed) = std::thread::scope(|s| {
        let rx = s.spawn(|| {
            let mut b = b;
            let mut n = 0u64;
            let mut idle_since = None;
            loop {
                let k = b.recv_batch(256, &mut |_| {}).expect("recv") as u64;
                n += k;
                if k == 0 {
                    if done.load(Ordering::Acquire) {
                        let t = *idle_since.get_or_insert_with(Instant::now);
                        if t.elapsed() > Duration::from_millis(300) {
                            break;
                        }
                    }
                    b.wait_readable(Some(Duration::from_millis(5))).unwrap();
                } else {
                    idle_since = None;
                }
            }
            (b, n)
        });
        let mut a = a;
        let start = Instant::now();
        let mut sent = 0u64;
        while start.elapsed().as_secs_f64() < secs {
            sent += a
                .send_batch(64, &mut |buf| {
                    buf[..frame.len()].copy_from_slice(&frame);
                    Some(frame.len())
                })
                .expect("send") as u64;
        }
        let elapsed = start.elapsed().as_secs_f64();
        done.store(true, Ordering::Release);
        let (b, recvd) = rx.join().unwrap();
        (a, b, sent, recvd, elapsed)
    });
    println!(
        "throughput A→B ({}, {} B frames = 1024 B payload): sent {:.0} frames/s, received \
         {:.0} frames/s ({:.0} Mbit/s), {} of {} frames lost; A {:?}; B {:?}",
        a.describe(),
        frame.len(),
        sent as f64 / elapsed,
        recvd as f64 / elapsed,
        recvd as f64 * frame.len() as f64 * 8.0 / elapsed / 1e6,
        sent.saturating_sub(recvd),
        sent,
        a.stats(),
        b.kernel_stats().unwrap_or_default(),
    );
    (a, b)
}

#[test]
fn af_xdp_between_two_namespaces() {
    require_root!("xdp_backend", NEEDS);
    let tb = testbed();

    // Errors are clear.
    let e = in_ns("fxa", || {
        XdpDevice::open("nosuch0", 0, XdpOptions::default())
    })
    .err()
    .expect("opening a missing interface fails");
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("not found"), "{e}");

    // Zero-copy on veth: refused, and the program attached for the attempt is gone again.
    let zc = XdpOptions {
        zero_copy: ZeroCopy::Yes,
        ..XdpOptions::default()
    };
    let e = in_ns("fxa", move || XdpDevice::open("eth0", 0, zc))
        .err()
        .expect("zero-copy on veth should fail");
    println!("zero-copy on veth: {e}");
    assert!(e.to_string().contains("zero-copy"), "{e}");
    assert_no_xdp("fxa");

    // Round 1: defaults on A (native + BPF link on veth), netlink attachment on B.
    let mut b = open(
        "fxb",
        true,
        XdpOptions {
            attach: AttachMethod::Netlink,
            ..XdpOptions::default()
        },
    );
    let mut a = open("fxa", false, XdpOptions::default());
    println!(
        "A: {} via {}, program id {}; B: {} via {}",
        a.describe(),
        a.attach_method(),
        a.program_id().unwrap(),
        b.describe(),
        b.attach_method()
    );
    assert_eq!(
        a.describe(),
        format!("af_xdp(eth0 q0, native, copy, tx budget {})", a.tx_budget())
    );
    assert_eq!(a.attach_method(), "bpf_link");
    assert_eq!(b.attach_method(), "netlink");
    assert!(
        b.describe().starts_with("af_xdp(eth0 q0"),
        "{}",
        b.describe()
    );
    assert_eq!(a.frame_capacity(), 9216);
    assert!(a.is_multi_buffer());
    let shown = link_show("fxa");
    assert!(
        shown.contains("xdp"),
        "no XDP program visible on A:\n{shown}"
    );
    let shown = link_show("fxb");
    assert!(
        shown.contains("xdp"),
        "no XDP program visible on B:\n{shown}"
    );

    check_kernel_verdicts(&a);
    check_other_traffic_still_works();
    check_roce_delivery(&mut a, &mut b, 300, 1024);
    check_one_kick_per_batch(&mut a, &mut b);
    check_kernel_udp_4791_lands_in_the_socket(&mut b);
    assert_eq!(
        roce_input_drops("fxb"),
        0,
        "RoCE frames reached B's kernel instead of the AF_XDP socket"
    );
    let (a, b) = throughput(a, b, 2.0);

    drop(a);
    drop(b);
    assert_no_xdp("fxa");
    assert_no_xdp("fxb");

    // Round 2: generic mode, the other attachment method on each side.
    let generic = |attach| XdpOptions {
        mode: XdpMode::Generic,
        attach,
        ..XdpOptions::default()
    };
    let mut a = open("fxa", false, generic(AttachMethod::Netlink));
    let mut b = open("fxb", true, generic(AttachMethod::Link));
    println!(
        "round 2: A {} via {}, B {} via {}",
        a.describe(),
        a.attach_method(),
        b.describe(),
        b.attach_method()
    );
    assert_eq!(
        a.describe(),
        format!(
            "af_xdp(eth0 q0, generic, copy, tx budget {})",
            a.tx_budget()
        )
    );
    assert!(
        link_show("fxa").contains("xdpgeneric"),
        "{}",
        link_show("fxa")
    );
    check_roce_delivery(&mut a, &mut b, 60, 1024);
    let (a, b) = throughput(a, b, 1.0);
    drop(a);
    drop(b);
    assert_no_xdp("fxa");
    assert_no_xdp("fxb");

    // Multiple queues: B's veth (and R's peer) get 2 channels; R spreads the flows (one UDP
    // source port per frame) over both, and `open_all_queues` serves both.
    must(&[
        "ip", "netns", "exec", "fxb", "ethtool", "-L", "eth0", "rx", "2", "tx", "2",
    ]);
    must(&[
        "ip", "netns", "exec", "fxr", "ethtool", "-L", "rb", "rx", "2", "tx", "2",
    ]);
    let mut a = open("fxa", false, XdpOptions::default());
    let mut b = open("fxb", true, XdpOptions::default());
    println!("multi-queue: B {}", b.describe());
    assert_eq!(
        b.describe(),
        format!(
            "af_xdp(eth0 q0,1, native, copy, tx budget {})",
            b.tx_budget()
        )
    );
    check_roce_delivery(&mut a, &mut b, 200, 1024);
    let per_queue = b.rx_frames_per_queue();
    println!("multi-queue: frames per B queue {per_queue:?}");
    assert!(
        per_queue.iter().all(|&(_, n)| n > 0),
        "a queue received nothing: {per_queue:?}"
    );
    drop(a);
    drop(b);
    assert_no_xdp("fxa");
    assert_no_xdp("fxb");

    // Round 3: MTU 4200 and RoCE path MTU 4096 (4154/4174-byte frames): multi-buffer
    // (XDP_USE_SG), native and generic.
    must(&[
        &tb.script,
        "up",
        "--prefix",
        PREFIX,
        "--drop-roce-input",
        "--mtu",
        "4200",
        "--force",
    ]);
    for mode in [XdpMode::Auto, XdpMode::Generic] {
        let opts = XdpOptions {
            mode,
            ..XdpOptions::default()
        };
        let mut a = open("fxa", false, opts);
        let mut b = open("fxb", true, opts);
        println!(
            "round 3 (mtu 4200): A {} multi-buffer {}, capacity {}; B {}",
            a.describe(),
            a.is_multi_buffer(),
            a.frame_capacity(),
            b.describe()
        );
        assert!(a.is_multi_buffer() && b.is_multi_buffer());
        assert_eq!(a.frame_capacity(), 9216);
        // ARP/NDP for the new namespaces first.
        must(&[
            "ip",
            "netns",
            "exec",
            "fxa",
            "ping",
            "-c",
            "1",
            "-W",
            "2",
            "10.61.2.2",
        ]);
        must(&[
            "ip",
            "netns",
            "exec",
            "fxa",
            "ping",
            "-6",
            "-c",
            "1",
            "-W",
            "2",
            "fd61:2::2",
        ]);
        check_roce_delivery(&mut a, &mut b, 120, 4096);
        assert_eq!(roce_input_drops("fxb"), 0);
    }
    assert_no_xdp("fxa");
    assert_no_xdp("fxb");

    // Round 4: a ferroce program somebody else attached (with netlink: it outlives its
    // descriptors, as after a crash) is adopted, used, and left attached; a foreign program
    // is refused.
    let attach_as = |name: &'static str| {
        in_ns("fxa", move || {
            let prog = XdpProgram::ferroce_redirect(name).unwrap();
            prog.attach_netlink("eth0", XdpMode::Generic).unwrap();
            // The program's and the map's descriptors are closed here; the attachment stays.
        })
    };
    attach_as(ebpf::PROGRAM_NAME);
    let mut a = open("fxa", false, XdpOptions::default());
    let mut b = open("fxb", true, XdpOptions::default());
    assert_eq!(a.attach_method(), "adopted");
    assert_eq!(
        a.describe(),
        format!(
            "af_xdp(eth0 q0, generic, copy, tx budget {})",
            a.tx_budget()
        )
    );
    check_roce_delivery(&mut a, &mut b, 40, 4096);
    drop(a);
    drop(b);
    assert!(
        link_show("fxa").contains("xdpgeneric"),
        "the adopted program should stay attached:\n{}",
        link_show("fxa")
    );
    detach_generic("fxa");
    assert_no_xdp("fxa");
    assert_no_xdp("fxb");
    attach_as("somebody_else");
    let e = in_ns("fxa", || XdpDevice::open("eth0", 0, XdpOptions::default()))
        .err()
        .expect("a foreign XDP program must not be replaced");
    println!("foreign program: {e}");
    assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
    assert!(e.to_string().contains("somebody_else"), "{e}");
    assert!(
        link_show("fxa").contains("xdpgeneric"),
        "foreign program removed"
    );
    detach_generic("fxa");
    assert_no_xdp("fxa");
    drop(tb);
}

#[test]
fn a_rejected_program_comes_with_the_verifier_log() {
    require_root!("xdp_backend", NEEDS);
    // `exit` without setting R0: the verifier refuses ("R0 !read_ok").
    let exit = [ebpf::Insn {
        code: 0x95,
        ..Default::default()
    }];
    let e = XdpProgram::load(&exit, "ferroce_bad")
        .expect_err("the verifier accepts an exit without R0");
    println!("{e}");
    assert!(e.log.contains("R0"), "verifier log: {}", e.log);
    assert!(std::io::Error::from(e).to_string().contains("verifier log"));
}
