//! The receive paths of the packet backends on hostile input (issue 17): what turns what the
//! kernel hands a backend into the Ethernet frames the engine parses.
//!
//! - **UDP socket backend** ([`UdpDevice::receive_datagrams`]): datagrams from any source with
//!   any payload, GRO segment size, destination, TOS and TTL, over IPv4 and IPv6, with and
//!   without the IPv4 identification solver; and the control-message parser on any bytes.
//!   Invariants: no panic; exactly the expected frames come out (one per segment whose source
//!   and destination are of the device's family, none for a truncated datagram), each with
//!   well-formed synthesised headers (zero MACs, the source's address and port, the device's
//!   port, lengths, a valid IPv4 header checksum) in front of exactly the segment's bytes;
//!   every other segment is counted as dropped. For datagrams a real sender made (an ICRC
//!   valid for some IPv4 ID and DF, GRO runs whose IDs count up or stay fixed), every frame's
//!   ICRC verifies; and every frame the backend hands up as ICRC-checked (the engine then
//!   skips its own pass) verifies, whatever the input.
//! - **AF_PACKET** ([`af_packet::walk_block`]): TPACKET_V3 blocks of any bytes, and
//!   well-formed blocks of plain, VLAN-stripped and UDP GSO super-frames with any
//!   `virtio_net_hdr`. Invariants: no panic, the walk never stalls; in a well-formed block
//!   every plain frame comes out unchanged (its tag put back) and every super-frame as its
//!   segments, each with the super-frame's headers, the segment's lengths, a valid IPv4
//!   checksum and exactly the segment's bytes.
//!
//! AF_XDP hands the frames of its ring up unchanged (a multi-buffer frame is concatenated
//! under a length bound): its untrusted input is the wire parser's (`wire_parse`).
//!
//! Shared by `fuzz/fuzz_targets/backend_rx.rs` (libFuzzer) and `tests/backend_fuzz.rs`
//! (stable: a seeded batch).

use ferroce::io::af_packet::{self, ring::build};
use ferroce::io::udp::{self, Datagram, UdpConfig, UdpDevice};
use ferroce::io::{IcrcCheck, IoStats, PacketDevice};
use ferroce::wire::icrc;
use ferroce::wire::ip::internet_checksum;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

#[path = "input.rs"]
mod input;
use input::Input;

/// What one input did (the stable test asserts the batch reaches every path).
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub udp_frames: usize,
    pub udp_dropped: u64,
    pub udp_verified: usize,
    /// Frames the backend handed up as ICRC-checked (each verified here).
    pub udp_icrc_good: usize,
    pub gro_segments: usize,
    pub ring_frames: usize,
    pub ring_segments: usize,
    pub ring_errors: u64,
}

pub fn run(data: &[u8]) -> Stats {
    let mut st = Stats::default();
    let mut inp = Input::new(data);
    let mode = inp.u8();
    match mode % 4 {
        0 | 1 => udp_case(&mut inp, mode % 2 == 1, false, &mut st),
        2 => udp_case(&mut inp, mode & 4 != 0, true, &mut st),
        _ => ring_case(&mut inp, &mut st),
    }
    st
}

fn v4(a: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, a))
}
fn v6(a: u8) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(a)))
}

/// The IP and UDP headers a sender (or the device's synthesis) puts in front of `len` bytes.
fn headers(src: SocketAddr, dst: IpAddr, dport: u16, len: usize, id: u16, df: bool) -> Vec<u8> {
    let udp_len = (8 + len) as u16;
    let mut h = Vec::new();
    match (src.ip(), dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            h.extend_from_slice(&[0x45, 0]);
            h.extend_from_slice(&(20 + udp_len).to_be_bytes());
            h.extend_from_slice(&id.to_be_bytes());
            h.extend_from_slice(&[if df { 0x40 } else { 0 }, 0, 64, 17, 0, 0]);
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            h.extend_from_slice(&[0x60, 0, 0, 0]);
            h.extend_from_slice(&udp_len.to_be_bytes());
            h.extend_from_slice(&[17, 64]);
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
        }
        _ => unreachable!("same family"),
    }
    h.extend_from_slice(&src.port().to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&udp_len.to_be_bytes());
    h.extend_from_slice(&[0, 0]);
    h
}

/// A segment as a real sender makes it: BTH … from the input, the ICRC for its headers.
fn valid_segment(inp: &mut Input, len: usize, hdr: &[u8], ihl: usize) -> Vec<u8> {
    let mut t = inp.bytes(len - icrc::LEN);
    let c = icrc::compute(&hdr[..ihl], &hdr[ihl..ihl + 8], &t);
    t.extend_from_slice(&icrc::to_wire(c));
    t
}

struct Want {
    payload: Vec<u8>,
    src: SocketAddr,
    dst: IpAddr,
    valid: bool,
}

fn udp_case(inp: &mut Input, valid_mode: bool, six: bool, st: &mut Stats) {
    let flags = inp.u8();
    let local = if six {
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    };
    let mut cfg = UdpConfig::new(local);
    cfg.port = 0;
    cfg.batch = 1 + usize::from(flags % 8);
    cfg.solve_ident = flags & 0x10 == 0;
    cfg.gro = flags & 0x20 == 0;
    cfg.gso = false;
    let Ok(mut dev) = UdpDevice::open(&cfg) else {
        return; // no IPv6 loopback here
    };
    let port = dev.local_addr().port();
    let room = dev.receive_room();
    let gro = dev.gro();
    // The control-message parser on any bytes (what the kernel wrote is trusted, but its
    // parser must hold on anything).
    let n = usize::from(inp.u8() % 64);
    let _ = udp::parse_control(&inp.bytes(n));

    let count = 1 + usize::from(inp.u8() % 8);
    let mut bufs = Vec::new();
    let mut wants = Vec::new();
    let mut segments = 0u64;
    for k in 0..count {
        let sel = inp.u8();
        let fam6 = if sel & 0x80 != 0 { !six } else { six }; // mostly the device's family
        let a = inp.u8() % 4;
        let src_ip = if fam6 { v6(a + 1) } else { v4(a + 1) };
        let src = (sel & 0x40 == 0).then(|| SocketAddr::new(src_ip, inp.u16()));
        let dst = match sel % 4 {
            0 => None,
            1 => Some(local),
            2 => Some(if six { v6(200) } else { v4(200) }),
            _ => Some(if six { v4(200) } else { v6(200) }),
        };
        let tclass = (sel & 0x20 != 0).then(|| inp.u8());
        let ttl = (sel & 0x10 != 0).then(|| inp.u8());
        let gsel = inp.u8();
        let gro_segment = match gsel % 4 {
            0 => None,
            1 => Some(inp.u16()),
            _ => Some(16 + u16::from(inp.u8()) * 4),
        };
        // Without the solver only predicted IDs verify: a real sender's segment is checked with it on.
        let valid = valid_mode && cfg.solve_ident && gsel & 0x80 == 0;
        let len = if gsel & 0x40 != 0 && !valid && k == 0 {
            room + 1 + usize::from(inp.u8()) // truncated
        } else if let (true, Some(g)) = (valid, gro_segment) {
            usize::from(g) * usize::from(1 + inp.u8() % 6) + usize::from(inp.u8())
        } else {
            usize::from(inp.u16() % 3000)
        };
        let seg = match gro_segment {
            Some(g) if g > 0 && gro && usize::from(g) < len => usize::from(g),
            _ => len.max(1),
        };
        let truncated = len > room;
        let same_family = |ip: IpAddr| ip.is_ipv6() == six;
        let dst_ip = dst.unwrap_or(local);
        let delivered = !truncated
            && src.is_some_and(|s| same_family(s.ip()))
            && same_family(dst_ip)
            && k < cfg.batch;
        let mut payload = Vec::with_capacity(len);
        let mut off = 0;
        let base_id = inp.u16();
        let fixed = inp.u8() & 1 == 1;
        let df = fixed || inp.u8() & 1 == 1;
        let mut i = 0u16;
        loop {
            let l = seg.min(len - off);
            // What an IP datagram of the device's family can carry after its headers.
            let fits = |l: usize| l + 8 + if six { 0 } else { 20 } <= 65_535;
            let part = match src {
                Some(s) if valid && delivered && l >= icrc::LEN + 12 && fits(l) => {
                    let id = if fixed {
                        base_id
                    } else {
                        base_id.wrapping_add(i)
                    };
                    let h = headers(s, dst_ip, port, l, id, df);
                    valid_segment(inp, l, &h, h.len() - 8)
                }
                _ => inp.bytes(l),
            };
            if k < cfg.batch && !truncated {
                segments += 1;
                // A segment longer than its IP datagram can say (65,527 bytes after IPv6's
                // header, 65,507 after IPv4's) cannot be framed: dropped and counted (no
                // kernel delivers such a datagram).
                if delivered && fits(part.len()) {
                    wants.push(Want {
                        valid: valid && part.len() >= icrc::LEN + 12,
                        payload: part.clone(),
                        src: src.expect("delivered"),
                        dst: dst_ip,
                    });
                }
            }
            payload.extend_from_slice(&part);
            off += l;
            i = i.wrapping_add(1);
            if off >= len {
                break;
            }
        }
        if truncated && k < cfg.batch {
            segments += 1; // one drop for the whole datagram
        }
        bufs.push((src, dst, tclass, ttl, gro_segment, payload));
    }
    let datagrams: Vec<Datagram> = bufs
        .iter()
        .map(|(src, dst, tclass, ttl, gro_segment, data)| Datagram {
            src: *src,
            dst: *dst,
            tclass: *tclass,
            ttl: *ttl,
            gro_segment: *gro_segment,
            data,
        })
        .collect();
    let max = 1 + usize::from(inp.u8() % 8);
    let before = dev.stats();
    let mut frames: Vec<Vec<u8>> = Vec::new();
    let mut good: Vec<bool> = Vec::new();
    let n = dev.receive_datagrams(&datagrams, max, &mut |f, icrc| {
        frames.push(f.to_vec());
        good.push(icrc == IcrcCheck::Good);
    });
    let after = dev.stats();
    assert_eq!(n, frames.len());
    let dropped = after.rx_dropped - before.rx_dropped;
    assert_eq!(
        frames.len() as u64 + dropped,
        segments,
        "every segment handed up or counted as dropped"
    );
    assert_eq!(frames.len(), wants.len(), "frames handed up");
    for ((f, w), &good) in frames.iter().zip(&wants).zip(&good) {
        check_udp_frame(f, w, port);
        if good {
            // The backend said the engine need not check the ICRC: it must verify.
            check_icrc(f);
            st.udp_icrc_good += 1;
        }
        if w.valid {
            st.udp_verified += 1;
        }
    }
    st.udp_frames += frames.len();
    st.udp_dropped += dropped;
    st.gro_segments += (after.rx_coalesced - before.rx_coalesced) as usize;
}

/// The frame's ICRC, over its headers as handed up, matches the one it carries.
fn check_icrc(f: &[u8]) {
    let ihl = if f[12..14] == [0x08, 0x00] { 20 } else { 40 };
    let (ip, rest) = f[14..].split_at(ihl);
    let (udp, t) = rest.split_at(8);
    assert!(t.len() >= icrc::LEN, "a verified frame has an ICRC");
    let n = t.len() - icrc::LEN;
    assert_eq!(
        icrc::compute(ip, udp, &t[..n]),
        icrc::stored(t).unwrap(),
        "a frame the backend passed as ICRC-checked verifies"
    );
}

fn check_udp_frame(f: &[u8], w: &Want, port: u16) {
    assert!(f[..12].iter().all(|&b| b == 0), "zero MACs");
    let ihl = match w.src.ip() {
        IpAddr::V4(_) => {
            assert_eq!(&f[12..14], &[0x08, 0x00]);
            20
        }
        IpAddr::V6(_) => {
            assert_eq!(&f[12..14], &[0x86, 0xdd]);
            40
        }
    };
    assert_eq!(f.len(), 14 + ihl + 8 + w.payload.len(), "frame length");
    let ip = &f[14..14 + ihl];
    let udp = &f[14 + ihl..14 + ihl + 8];
    let t = &f[14 + ihl + 8..];
    let udp_len = (8 + w.payload.len()) as u16;
    match (w.src.ip(), w.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            assert_eq!(ip[0], 0x45);
            assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 20 + udp_len);
            assert_eq!(ip[9], 17);
            assert_eq!(&ip[12..16], &s.octets());
            assert_eq!(&ip[16..20], &d.octets());
            assert_eq!(internet_checksum(ip), 0, "IPv4 header checksum");
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            assert_eq!(ip[0] >> 4, 6);
            assert_eq!(u16::from_be_bytes([ip[4], ip[5]]), udp_len);
            assert_eq!(ip[6], 17);
            assert_eq!(&ip[8..24], &s.octets());
            assert_eq!(&ip[24..40], &d.octets());
        }
        _ => panic!("a frame of another family was handed up"),
    }
    assert_eq!(u16::from_be_bytes([udp[0], udp[1]]), w.src.port());
    assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), port);
    assert_eq!(u16::from_be_bytes([udp[4], udp[5]]), udp_len);
    assert_eq!(t, &w.payload[..], "the segment's bytes, unchanged");
    if w.valid {
        let n = t.len() - icrc::LEN;
        assert_eq!(
            icrc::compute(ip, udp, &t[..n]),
            icrc::stored(t).unwrap(),
            "a datagram a real sender made verifies"
        );
    }
}

/// An Ethernet + IPv4/IPv6 + UDP super-frame: headers from the input, `len` bytes of
/// payload.
fn super_frame(inp: &mut Input, six: bool, len: usize) -> Vec<u8> {
    let mut f = inp.bytes(12);
    f.extend_from_slice(if six { &[0x86, 0xdd] } else { &[0x08, 0x00] });
    let src = SocketAddr::new(if six { v6(1) } else { v4(1) }, inp.u16());
    let dst = if six { v6(2) } else { v4(2) };
    let id = inp.u16();
    f.extend_from_slice(&headers(src, dst, 4791, len, id, true));
    f.extend(inp.bytes(len));
    f
}

fn ring_case(inp: &mut Input, st: &mut Stats) {
    let flags = inp.u8();
    let vnet = flags & 1 != 0;
    let batch = 1 + usize::from(flags >> 1 & 7);
    let mut stats = IoStats::default();
    if flags & 0x80 != 0 {
        // Any bytes as a block.
        let len = usize::from(inp.u16() % 9000);
        let blk = inp.bytes(len);
        let mut n = 0;
        let r = af_packet::walk_block(&blk, vnet, batch, &mut stats, &mut |f| {
            assert!(f.len() >= 14);
            n += 1;
        });
        let (frames, errors) = r.expect("the ring walk stalled on a block");
        assert_eq!(frames, n);
        assert_eq!(stats.rx_frames as usize, n);
        st.ring_frames += n;
        st.ring_errors += errors;
        return;
    }
    // A well-formed block: plain frames, VLAN-stripped ones, super-frames with a vnet header.
    let count = 1 + usize::from(inp.u8() % 6);
    struct F {
        data: Vec<u8>,
        vlan: Option<u16>,
        vnet: Option<(u8, u16)>,
    }
    let mut fs = Vec::new();
    for _ in 0..count {
        let sel = inp.u8();
        let vlan = (sel & 1 != 0).then(|| inp.u16());
        let (data, vh) = if sel & 2 != 0 {
            let six = sel & 4 != 0;
            let len = usize::from(inp.u16() % 4000);
            let size = match sel >> 3 & 3 {
                0 => inp.u16(),
                _ => 1 + u16::from(inp.u8()) * 8,
            };
            let gso_type = if sel & 0x20 != 0 { inp.u8() } else { 5 };
            (super_frame(inp, six, len), Some((gso_type, size)))
        } else {
            let len = 14 + usize::from(inp.u16() % 1600);
            (inp.bytes(len), None)
        };
        fs.push(F {
            data,
            vlan,
            vnet: vh,
        });
        if inp.empty() {
            break;
        }
    }
    let list: Vec<(&[u8], Option<u16>)> = fs.iter().map(|f| (&f.data[..], f.vlan)).collect();
    let size: usize = 48
        + fs.iter()
            .map(|f| (82 + f.data.len() + 7) & !7)
            .sum::<usize>();
    let mut blk = build::block(size.next_multiple_of(8), &list);
    let offs = build::frame_offsets(&blk);
    for (f, &o) in fs.iter().zip(&offs) {
        let at = o + usize::from(build::MAC_OFF) - 10;
        let mut h = [0u8; 10];
        if let Some((t, s)) = f.vnet {
            h[1] = t;
            h[4..6].copy_from_slice(&s.to_ne_bytes());
        }
        blk[at..at + 10].copy_from_slice(&h);
    }
    let mut got: Vec<Vec<u8>> = Vec::new();
    let r = af_packet::walk_block(&blk, vnet, batch, &mut stats, &mut |f| got.push(f.to_vec()));
    let (frames, errors) = r.expect("the ring walk stalled on a well-formed block");
    assert_eq!(errors, 0, "a well-formed block has no ring errors");
    assert_eq!(frames, got.len());
    // What each frame must become.
    let mut it = got.iter();
    for f in &fs {
        let tagged = |d: &[u8]| -> Vec<u8> {
            match f.vlan {
                Some(tci) => {
                    let mut v = d[..12].to_vec();
                    v.extend_from_slice(&0x8100u16.to_be_bytes());
                    v.extend_from_slice(&tci.to_be_bytes());
                    v.extend_from_slice(&d[12..]);
                    v
                }
                None => d.to_vec(),
            }
        };
        match f.vnet.filter(|&(t, _)| vnet && t & 0x7f != 0) {
            None => {
                assert_eq!(
                    it.next().expect("a plain frame comes out"),
                    &tagged(&f.data)
                );
                st.ring_frames += 1;
            }
            Some((t, size)) => {
                if t & 0x7f != 5 || size == 0 {
                    continue; // not UDP segmentation: dropped (counted)
                }
                let six = f.data[12] == 0x86;
                let hdr = 14 + if six { 40 } else { 20 } + 8;
                let pay = &f.data[hdr..];
                let size = usize::from(size);
                let n = pay.len().div_ceil(size).max(1);
                for i in 0..n {
                    let s = &pay[(i * size).min(pay.len())..((i + 1) * size).min(pay.len())];
                    let out = it.next().expect("a segment comes out");
                    let tag = if f.vlan.is_some() { 4 } else { 0 };
                    assert_eq!(out.len(), tag + hdr + s.len(), "segment length");
                    assert_eq!(&out[tag + hdr..], s, "the segment's bytes");
                    assert_eq!(&out[..12], &f.data[..12]);
                    let ip = &out[tag + 14..tag + hdr - 8];
                    let udp = &out[tag + hdr - 8..tag + hdr];
                    assert_eq!(u16::from_be_bytes([udp[4], udp[5]]) as usize, 8 + s.len());
                    if !six {
                        assert_eq!(internet_checksum(ip), 0, "IPv4 header checksum");
                        let id = u16::from_be_bytes([f.data[18], f.data[19]]);
                        assert_eq!(
                            u16::from_be_bytes([ip[4], ip[5]]),
                            id.wrapping_add(i as u16)
                        );
                    }
                    st.ring_segments += 1;
                }
            }
        }
    }
    assert!(it.next().is_none(), "no extra frames");
    st.ring_errors += errors;
}
