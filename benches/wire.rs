//! Wire-layer benchmarks. Each figure is a pair run side by side in one process; the README
//! reports the ratios (`tools/bench-report`), never absolute thresholds.
//!
//! - `icrc/<size>/{ferroce_icrc,ferroce_icrc_in_place,crc32fast_raw}`: ICRC verification
//!   (masked headers fed from a stack buffer, payload in place; or the variant fields masked in
//!   place in a writable buffer and restored) vs. a plain CRC-32 over the same bytes.
//! - `parse/<size>/{parse_verify,decode_only}`: full Ethernet→ICRC parse of one frame.
//! - `outer/{ferroce_views,etherparse}`: parsing Ethernet+IPv4+UDP with our views vs etherparse.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferroce::wire::*;
use std::net::Ipv4Addr;

fn frame(payload_len: usize) -> Vec<u8> {
    let payload: Vec<u8> = (0..payload_len).map(|i| i as u8).collect();
    let roce = RoceRepr::new(
        BthRepr::new(Opcode::RC_SEND_ONLY, QpNumber::new(0x11), Psn::new(1)),
        ExtRepr::default(),
        payload_len,
    );
    let f = FrameRepr {
        eth: Some(EthernetRepr {
            dst: MacAddr([2, 0, 0, 0, 0, 2]),
            src: MacAddr([2, 0, 0, 0, 0, 1]),
            vlan: None,
            ethertype: 0,
        }),
        ip: IpRepr::V4(Ipv4Repr {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            dscp: 0,
            ecn: Ecn::Ect0,
            ident: 1,
            dont_frag: true,
            ttl: 64,
        }),
        udp: UdpRepr {
            src_port: 0xc000,
            dst_port: ROCE_V2_PORT,
            checksum: 0,
        },
        roce,
    };
    let mut buf = vec![0u8; f.buffer_len()];
    f.emit(&mut buf, &payload).unwrap();
    buf
}

const SIZES: [usize; 3] = [64, 1024, 4096];

fn icrc(c: &mut Criterion) {
    let mut g = c.benchmark_group("icrc");
    for size in SIZES {
        let f = frame(size);
        let p = packet::parse_frame(&f).unwrap();
        let o = p.offsets;
        // The bytes the ICRC covers (IP header through pad), as one slice.
        g.throughput(Throughput::Bytes((o.icrc - o.ip) as u64));
        g.bench_with_input(
            BenchmarkId::new(format!("{size}"), "ferroce_icrc"),
            &f,
            |b, f| {
                b.iter(|| {
                    let f = black_box(&f[..]);
                    let c = icrc::compute(&f[o.ip..o.udp], &f[o.udp..o.bth], &f[o.bth..o.icrc]);
                    black_box(c == p.icrc_stored)
                })
            },
        );
        let mut fm = f.clone();
        g.bench_function(
            BenchmarkId::new(format!("{size}"), "ferroce_icrc_in_place"),
            |b| {
                b.iter(|| {
                    let c = icrc::compute_in_place(black_box(&mut fm), o.ip, o.udp, o.bth, o.icrc);
                    black_box(c == p.icrc_stored)
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new(format!("{size}"), "crc32fast_raw"),
            &f,
            |b, f| {
                b.iter(|| {
                    let f = black_box(&f[..]);
                    black_box(crc32fast::hash(&f[o.ip..o.icrc]) == p.icrc_stored)
                })
            },
        );
    }
    g.finish();
}

fn parse(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse");
    for size in [64usize, 4096] {
        let f = frame(size);
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(
            BenchmarkId::new(format!("{size}"), "parse_verify"),
            &f,
            |b, f| {
                b.iter(|| black_box(packet::parse_frame(black_box(f)).unwrap().repr.roce.bth.psn))
            },
        );
        g.bench_with_input(
            BenchmarkId::new(format!("{size}"), "decode_only"),
            &f,
            |b, f| {
                b.iter(|| {
                    // decode_frame computes the ICRC too; this measures the header work alone.
                    let (e, n) = EthernetRepr::parse(black_box(f)).unwrap();
                    let (ip, pi) = Ipv4Repr::parse(&f[n..]).unwrap();
                    let (u, _) = UdpRepr::parse(&f[n + pi.header_len..]).unwrap();
                    let (r, _) = RoceRepr::parse(&f[n + pi.header_len + 8..]).unwrap();
                    black_box((e, ip, u, r))
                })
            },
        );
    }
    g.finish();
}

fn outer(c: &mut Criterion) {
    let mut g = c.benchmark_group("outer");
    let f = frame(64);
    g.throughput(Throughput::Elements(1));
    g.bench_function("ferroce_views", |b| {
        b.iter(|| {
            let f = black_box(&f[..]);
            let (e, n) = EthernetRepr::parse(f).unwrap();
            let (ip, pi) = Ipv4Repr::parse(&f[n..]).unwrap();
            let (u, _) = UdpRepr::parse(&f[n + pi.header_len..]).unwrap();
            black_box((e.ethertype, ip.src, u.dst_port))
        })
    });
    g.bench_function("etherparse", |b| {
        b.iter(|| {
            let s = etherparse::SlicedPacket::from_ethernet(black_box(&f[..])).unwrap();
            let src = match &s.net {
                Some(etherparse::NetSlice::Ipv4(v4)) => v4.header().source_addr(),
                _ => unreachable!(),
            };
            let dport = match &s.transport {
                Some(etherparse::TransportSlice::Udp(u)) => u.destination_port(),
                _ => unreachable!(),
            };
            black_box((src, dport))
        })
    });
    g.finish();
}

criterion_group!(benches, icrc, parse, outer);
criterion_main!(benches);
