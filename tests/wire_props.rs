//! Property tests over the whole wire layer: every known opcode, over IPv4, IPv6 and 802.1Q.
//!
//! - emit → parse gives back the same `Repr` and payload;
//! - parse → emit gives back the same bytes;
//! - flipping any single bit the ICRC covers changes the ICRC (and the frame is rejected);
//!   flipping a masked bit (IPv4 TOS/TTL/checksum, IPv6 traffic class/flow label/hop limit,
//!   UDP checksum, BTH FECN/BECN/reserved) leaves the ICRC unchanged;
//! - etherparse, an independent parser, reads our outer headers the same way;
//! - parsing arbitrary or mutated bytes never panics.

use ferroce::wire::ext::{AtomicEthRepr, DethRepr, RethRepr};
use ferroce::wire::opcode::OpFlags;
use ferroce::wire::*;
use proptest::prelude::*;
use std::net::{Ipv4Addr, Ipv6Addr};

fn arb_opcode() -> impl Strategy<Value = Opcode> {
    let all: Vec<Opcode> = Opcode::all_known().collect();
    proptest::sample::select(all)
}

fn arb_ecn() -> impl Strategy<Value = Ecn> {
    prop_oneof![
        Just(Ecn::NotEct),
        Just(Ecn::Ect0),
        Just(Ecn::Ect1),
        Just(Ecn::Ce)
    ]
}

fn arb_ip() -> impl Strategy<Value = IpRepr> {
    let v4 = (
        any::<[u8; 4]>(),
        any::<[u8; 4]>(),
        0u8..64,
        arb_ecn(),
        any::<u16>(),
        any::<bool>(),
        any::<u8>(),
    )
        .prop_map(|(s, d, dscp, ecn, ident, df, ttl)| {
            IpRepr::V4(Ipv4Repr {
                src: Ipv4Addr::from(s),
                dst: Ipv4Addr::from(d),
                dscp,
                ecn,
                ident,
                dont_frag: df,
                ttl,
            })
        });
    let v6 = (
        any::<[u8; 16]>(),
        any::<[u8; 16]>(),
        0u8..64,
        arb_ecn(),
        0u32..1 << 20,
        any::<u8>(),
    )
        .prop_map(|(s, d, dscp, ecn, fl, hl)| {
            IpRepr::V6(Ipv6Repr {
                src: Ipv6Addr::from(s),
                dst: Ipv6Addr::from(d),
                dscp,
                ecn,
                flow_label: fl,
                hop_limit: hl,
            })
        });
    prop_oneof![v4, v6]
}

fn arb_eth() -> impl Strategy<Value = Option<EthernetRepr>> {
    let vlan = prop_oneof![
        Just(None),
        (0u8..8, any::<bool>(), 0u16..4096).prop_map(|(pcp, dei, vid)| Some(VlanTag {
            pcp,
            dei,
            vid
        }))
    ];
    prop_oneof![
        1 => Just(None),
        4 => (any::<[u8; 6]>(), any::<[u8; 6]>(), vlan).prop_map(|(d, s, vlan)| Some(EthernetRepr {
            dst: MacAddr(d),
            src: MacAddr(s),
            vlan,
            ethertype: 0,
        })),
    ]
}

fn arb_aeth() -> impl Strategy<Value = AethRepr> {
    (any::<u8>(), 0u32..1 << 24).prop_map(|(s, msn)| AethRepr {
        syndrome: Syndrome::from_byte(s),
        msn,
    })
}

/// Extension headers with random contents for exactly the headers `op` carries.
fn arb_ext(op: Opcode) -> impl Strategy<Value = ExtRepr> {
    let h = op.headers();
    (
        (
            0u32..1 << 24,
            any::<u32>(),
            0u32..1 << 24,
            0u32..1 << 24,
            any::<u32>(),
        ),
        (any::<u64>(), any::<u32>(), any::<u32>()),
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()),
        arb_aeth(),
        (any::<u64>(), any::<u32>(), any::<u32>()),
    )
        .prop_map(
            move |(
                (ee, qkey, srcqp, srq, feth),
                (va, rkey, len),
                (ava, ark, sa, cmp),
                aeth,
                (orig, imm, iek),
            )| {
                use ferroce::wire::opcode::Headers as H;
                ExtRepr {
                    rdeth: h.contains(H::RDETH).then_some(ee),
                    deth: h.contains(H::DETH).then_some(DethRepr {
                        qkey: QKey(qkey),
                        src_qp: QpNumber::new(srcqp),
                    }),
                    xrceth: h.contains(H::XRCETH).then_some(srq),
                    feth: h.contains(H::FETH).then_some(feth),
                    reth: h.contains(H::RETH).then_some(RethRepr {
                        va,
                        rkey: RKey(rkey),
                        dma_len: len,
                    }),
                    atomic_eth: h.contains(H::ATOMIC_ETH).then_some(AtomicEthRepr {
                        va: ava,
                        rkey: RKey(ark),
                        swap_add: sa,
                        compare: cmp,
                    }),
                    aeth: h.contains(H::AETH).then_some(aeth),
                    atomic_ack: h.contains(H::ATOMIC_ACK_ETH).then_some(orig),
                    imm: h.contains(H::IMM_DT).then_some(imm),
                    ieth: h.contains(H::IETH).then_some(RKey(iek)),
                }
            },
        )
}

/// A payload length the opcode allows.
fn arb_payload(op: Opcode) -> BoxedStrategy<Vec<u8>> {
    let f = op.flags();
    if !f.contains(OpFlags::PAYLOAD) {
        Just(vec![]).boxed()
    } else if f.contains(OpFlags::FIXED8) {
        proptest::collection::vec(any::<u8>(), 8).boxed()
    } else if f.contains(OpFlags::FULL_MTU) {
        prop_oneof![
            proptest::sample::select(vec![256usize, 512, 1024, 2048, 4096]),
            (0usize..80).prop_map(|n| n * 4)
        ]
        .prop_flat_map(|n| proptest::collection::vec(any::<u8>(), n))
        .boxed()
    } else {
        proptest::collection::vec(any::<u8>(), 0..300).boxed()
    }
}

fn arb_frame() -> impl Strategy<Value = (FrameRepr, Vec<u8>)> {
    arb_opcode().prop_flat_map(|op| {
        let bth = (
            any::<bool>(),
            any::<bool>(),
            0u8..16,
            any::<u16>(),
            any::<bool>(),
            any::<bool>(),
            0u32..1 << 24,
            any::<bool>(),
            0u32..1 << 24,
        );
        (
            arb_eth(),
            arb_ip(),
            (any::<u16>(), any::<u16>()),
            bth,
            arb_ext(op),
            arb_payload(op),
        )
            .prop_map(
                move |(
                    eth,
                    ip,
                    (sport, csum),
                    (se, m, tver, pkey, fecn, becn, qp, a, psn),
                    ext,
                    payload,
                )| {
                    let bth = BthRepr {
                        opcode: op,
                        solicited: se,
                        mig_req: m,
                        pad_count: 0,
                        tver,
                        pkey: PKey(pkey),
                        fecn,
                        becn,
                        dest_qp: QpNumber::new(qp),
                        ack_req: a,
                        psn: Psn::new(psn),
                    };
                    let roce = RoceRepr::new(bth, ext, payload.len());
                    let udp = UdpRepr {
                        src_port: sport,
                        dst_port: ROCE_V2_PORT,
                        checksum: csum,
                    };
                    (FrameRepr { eth, ip, udp, roce }, payload)
                },
            )
    })
}

fn emit(f: &FrameRepr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; f.buffer_len()];
    let n = f.emit(&mut buf, payload).expect("emit of a valid Repr");
    assert_eq!(n, buf.len());
    buf
}

/// Parse with the framing `f` was emitted with (Ethernet or raw IP).
fn parse<'a>(f: &FrameRepr, bytes: &'a [u8]) -> Result<ParsedFrame<'a>> {
    if f.eth.is_some() {
        packet::parse_frame(bytes)
    } else {
        packet::parse_ip(bytes)
    }
}

/// Which bit positions of the frame the ICRC masks (true) or covers (false); None = outside
/// the ICRC (Ethernet header, ICRC itself).
fn coverage(p: &ParsedFrame<'_>, bit: usize) -> Option<bool> {
    let o = p.offsets;
    let byte = bit / 8;
    let b = 7 - (bit % 8); // bit index within the byte, 7 = MSB
    if byte < o.ip || byte >= o.icrc {
        return None;
    }
    let masked = if byte < o.udp {
        let i = byte - o.ip;
        match p.repr.ip {
            IpRepr::V4(_) => matches!(i, 1 | 8 | 10 | 11),
            // version(4) tclass(8) flow(20): byte 0 low nibble, bytes 1..4, hop limit (7).
            IpRepr::V6(_) => (i == 0 && b < 4) || matches!(i, 1..=3 | 7),
        }
    } else if byte < o.bth {
        byte - o.udp >= 6
    } else {
        byte - o.bth == 4
    };
    Some(masked)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

    #[test]
    fn emit_then_parse_is_identity((f, payload) in arb_frame()) {
        let bytes = emit(&f, &payload);
        let p = parse(&f, &bytes).expect("our own frame parses and its ICRC verifies");
        let mut expect = f;
        if let Some(e) = expect.eth.as_mut() {
            e.ethertype = f.ip.ethertype();
        }
        prop_assert_eq!(p.repr, expect);
        prop_assert_eq!(p.payload, &payload[..]);
        prop_assert!(p.ip_checksum_ok);
    }

    #[test]
    fn parse_then_emit_is_identity((f, payload) in arb_frame()) {
        let bytes = emit(&f, &payload);
        let p = parse(&f, &bytes).unwrap();
        let mut again = vec![0u8; p.repr.buffer_len()];
        p.repr.emit(&mut again, p.payload).unwrap();
        prop_assert_eq!(again, bytes);
    }

    #[test]
    fn single_bit_flips((f, payload) in arb_frame(), pick in any::<proptest::sample::Index>()) {
        let bytes = emit(&f, &payload);
        let p = parse(&f, &bytes).unwrap();
        let o = p.offsets;
        let bit = o.ip * 8 + pick.index((o.icrc - o.ip) * 8);
        let covered = !coverage(&p, bit).unwrap();
        let mut flipped = bytes.clone();
        flipped[bit / 8] ^= 0x80 >> (bit % 8);
        let crc = icrc::compute(&flipped[o.ip..o.udp], &flipped[o.udp..o.bth], &flipped[o.bth..o.icrc]);
        if covered {
            prop_assert_ne!(crc, p.icrc_stored, "covered bit {} must change the ICRC", bit);
            prop_assert!(parse(&f, &flipped).is_err(), "a frame with a covered bit flipped must be rejected");
        } else {
            prop_assert_eq!(crc, p.icrc_stored, "masked bit {} must not change the ICRC", bit);
        }
    }

    #[test]
    fn masked_fields_named_in_the_spec_do_not_matter((f, payload) in arb_frame(), ttl in any::<u8>(), tos in any::<u8>(), csum in any::<u16>(), b4 in any::<u8>()) {
        let bytes = emit(&f, &payload);
        let p = parse(&f, &bytes).unwrap();
        let o = p.offsets;
        let mut m = bytes.clone();
        match p.repr.ip {
            IpRepr::V4(_) => { m[o.ip + 1] = tos; m[o.ip + 8] = ttl; m[o.ip + 10] ^= 0x5a; }
            IpRepr::V6(_) => { m[o.ip + 1] = tos; m[o.ip + 7] = ttl; m[o.ip + 3] ^= 0xff; }
        }
        m[o.udp + 6..o.udp + 8].copy_from_slice(&csum.to_be_bytes());
        m[o.bth + 4] = b4; // FECN, BECN, reserved
        let crc = icrc::compute(&m[o.ip..o.udp], &m[o.udp..o.bth], &m[o.bth..o.icrc]);
        prop_assert_eq!(crc, p.icrc_stored);
    }

    #[test]
    fn etherparse_agrees_on_outer_headers((f, payload) in arb_frame()) {
        let bytes = emit(&f, &payload);
        let sliced = if f.eth.is_some() {
            etherparse::SlicedPacket::from_ethernet(&bytes)
        } else {
            etherparse::SlicedPacket::from_ip(&bytes)
        }.expect("etherparse reads our frame");
        match (sliced.net, f.ip) {
            (Some(etherparse::NetSlice::Ipv4(s)), IpRepr::V4(r)) => {
                prop_assert_eq!(s.header().source_addr(), r.src);
                prop_assert_eq!(s.header().destination_addr(), r.dst);
                prop_assert_eq!(s.header().ttl(), r.ttl);
                prop_assert_eq!(s.header().identification(), r.ident);
                prop_assert_eq!(s.header().dont_fragment(), r.dont_frag);
                prop_assert!(s.header().to_header().header_checksum == s.header().to_header().calc_header_checksum());
            }
            (Some(etherparse::NetSlice::Ipv6(s)), IpRepr::V6(r)) => {
                prop_assert_eq!(s.header().source_addr(), r.src);
                prop_assert_eq!(s.header().destination_addr(), r.dst);
                prop_assert_eq!(s.header().hop_limit(), r.hop_limit);
                prop_assert_eq!(s.header().flow_label().value(), r.flow_label);
            }
            (n, _) => prop_assert!(false, "etherparse saw {:?}", n.is_some()),
        }
        match sliced.transport {
            Some(etherparse::TransportSlice::Udp(u)) => {
                prop_assert_eq!(u.source_port(), f.udp.src_port);
                prop_assert_eq!(u.destination_port(), ROCE_V2_PORT);
                prop_assert_eq!(u.length() as usize, 8 + f.roce.buffer_len());
            }
            _ => prop_assert!(false, "etherparse found no UDP"),
        }
        if let Some(e) = f.eth {
            if let Some(v) = e.vlan {
                match sliced.vlan {
                    Some(etherparse::VlanSlice::SingleVlan(s)) => prop_assert_eq!(s.vlan_identifier().value(), v.vid),
                    _ => prop_assert!(false, "etherparse found no VLAN tag"),
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 20000, .. ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = packet::decode_frame(&bytes);
        let _ = packet::decode_ip(&bytes);
        let _ = packet::parse_roce(&bytes[..bytes.len().min(20)], &bytes[..bytes.len().min(8)], &bytes);
        let _ = RoceRepr::parse(&bytes);
    }

    #[test]
    fn mutated_valid_frames_never_panic((f, payload) in arb_frame(), muts in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..6), cut in any::<proptest::sample::Index>()) {
        let mut bytes = emit(&f, &payload);
        for (i, v) in muts {
            let at = i.index(bytes.len());
            bytes[at] = v;
        }
        let keep = cut.index(bytes.len() + 1);
        bytes.truncate(keep.max(bytes.len() / 2));
        if let Ok(p) = packet::decode_frame(&bytes) {
            // Whatever decodes must be internally consistent and re-emittable.
            prop_assert!(p.offsets.end <= bytes.len());
            let mut out = vec![0u8; p.repr.buffer_len()];
            prop_assert!(p.repr.emit(&mut out, p.payload).is_ok());
        }
        let _ = packet::decode_ip(&bytes);
    }
}

#[test]
fn every_known_opcode_round_trips_on_all_three_framings() {
    // A deterministic sweep on top of the random cases: each opcode × {IPv4, IPv6, VLAN+IPv6}.
    for op in Opcode::all_known() {
        for framing in 0..3 {
            let ip = if framing == 0 {
                IpRepr::V4(Ipv4Repr {
                    src: Ipv4Addr::new(10, 0, 0, 1),
                    dst: Ipv4Addr::new(10, 0, 0, 2),
                    dscp: 26,
                    ecn: Ecn::Ect0,
                    ident: 7,
                    dont_frag: true,
                    ttl: 64,
                })
            } else {
                IpRepr::V6(Ipv6Repr {
                    src: "fd00::1".parse().unwrap(),
                    dst: "fd00::2".parse().unwrap(),
                    dscp: 0,
                    ecn: Ecn::NotEct,
                    flow_label: 0x12345,
                    hop_limit: 64,
                })
            };
            let vlan = (framing == 2).then_some(VlanTag {
                pcp: 3,
                dei: false,
                vid: 100,
            });
            let eth = EthernetRepr {
                dst: MacAddr([2, 0, 0, 0, 0, 2]),
                src: MacAddr([2, 0, 0, 0, 0, 1]),
                vlan,
                ethertype: 0,
            };
            let len = if op.flags().contains(OpFlags::FIXED8) {
                8
            } else if op.flags().contains(OpFlags::FULL_MTU) {
                256
            } else if op.flags().contains(OpFlags::PAYLOAD) {
                13
            } else {
                0
            };
            let payload: Vec<u8> = (0..len as u8).collect();
            let mut ext = ExtRepr::default();
            use ferroce::wire::opcode::Headers as H;
            let h = op.headers();
            if h.contains(H::RDETH) {
                ext.rdeth = Some(5);
            }
            if h.contains(H::DETH) {
                ext.deth = Some(DethRepr {
                    qkey: QKey(0x1111_1111),
                    src_qp: QpNumber::new(0x11),
                });
            }
            if h.contains(H::XRCETH) {
                ext.xrceth = Some(9);
            }
            if h.contains(H::FETH) {
                ext.feth = Some(1);
            }
            if h.contains(H::RETH) {
                ext.reth = Some(RethRepr {
                    va: 0x1000,
                    rkey: RKey(0xabc),
                    dma_len: 4096,
                });
            }
            if h.contains(H::ATOMIC_ETH) {
                ext.atomic_eth = Some(AtomicEthRepr {
                    va: 8,
                    rkey: RKey(1),
                    swap_add: 2,
                    compare: 3,
                });
            }
            if h.contains(H::AETH) {
                ext.aeth = Some(AethRepr {
                    syndrome: Syndrome::Ack(CreditCode::UNLIMITED),
                    msn: 1,
                });
            }
            if h.contains(H::ATOMIC_ACK_ETH) {
                ext.atomic_ack = Some(42);
            }
            if h.contains(H::IMM_DT) {
                ext.imm = Some(0xfeed);
            }
            if h.contains(H::IETH) {
                ext.ieth = Some(RKey(0x77));
            }
            let roce = RoceRepr::new(
                BthRepr::new(op, QpNumber::new(0x12), Psn::new(0xff_fff0)),
                ext,
                payload.len(),
            );
            let f = FrameRepr {
                eth: Some(eth),
                ip,
                udp: UdpRepr {
                    src_port: 0xc000,
                    dst_port: ROCE_V2_PORT,
                    checksum: 0,
                },
                roce,
            };
            let bytes = emit(&f, &payload);
            let p = packet::parse_frame(&bytes).unwrap_or_else(|e| panic!("{op}: {e}"));
            assert_eq!(p.repr.roce, roce, "{op}");
            assert_eq!(p.payload, &payload[..]);
        }
    }
}
