//! Known-answer tests with two independent frames (roce-facts.md; both published in scapy's
//! RoCE tests, the first captured from a Mellanox ConnectX-4 Lx). Nothing here was produced
//! by ferroce: parse, verify the ICRC, and re-emit byte-identical.

mod common;
use common::hex;
use ferroce::wire::{self, packet, Ecn, IpRepr, Opcode, Psn, QpNumber};

/// ConnectX-4 Lx CNP, full Ethernet frame.
const CNP: &str = "e41d2dab2bc2 7cfe90643b32 0800 \
    45c2003c718c400040119161 0a001101 0a001201 \
    0000 12b7 0028 0000 \
    81 00 ffff 40 000118 00 000000 \
    00000000000000000000000000000000 \
    82fd002a";

/// UC SEND_ONLY, from the IPv4 header to the ICRC.
const UC_SEND: &str = "45010040047840004011b4d5c0a80007c0a80007 c00012b7002caca2 \
    2460ffff000000d300cf1710 4630818be28935d90e9a95505401be885e500000 78f353f3";

#[test]
fn connectx4_cnp_parses_verifies_and_reemits() {
    let frame = hex(CNP);
    let p = wire::parse_frame(&frame).expect("CNP parses with a good ICRC");
    assert_eq!(
        p.icrc_computed, 0x2a00_fd82,
        "ICRC bytes on the wire are 82 fd 00 2a"
    );
    assert_eq!(&frame[frame.len() - 4..], &[0x82, 0xfd, 0x00, 0x2a]);
    let r = p.repr;
    assert_eq!(r.roce.bth.opcode, Opcode::CNP);
    assert!(r.roce.bth.becn);
    assert!(!r.roce.bth.fecn);
    assert_eq!(r.roce.bth.psn, Psn::new(0));
    assert_eq!(r.roce.bth.dest_qp, QpNumber::new(0x118));
    assert_eq!(
        r.roce.payload_len, 0,
        "the 16 reserved bytes belong to the CNP header"
    );
    assert_eq!(r.udp.src_port, 0);
    assert_eq!(r.udp.checksum, 0);
    match r.ip {
        IpRepr::V4(v4) => {
            assert_eq!(v4.dscp, 48);
            assert_eq!(v4.ecn, Ecn::Ect0);
        }
        IpRepr::V6(_) => panic!("IPv4 expected"),
    }
    assert!(p.ip_checksum_ok);
    let mut out = vec![0u8; r.buffer_len()];
    assert_eq!(r.emit(&mut out, p.payload).unwrap(), frame.len());
    assert_eq!(out, frame, "re-emitted CNP is byte-identical");
}

#[test]
fn uc_send_only_parses_verifies_and_reemits() {
    let pkt = hex(UC_SEND);
    let p = packet::parse_ip(&pkt).expect("UC SEND_ONLY parses with a good ICRC");
    assert_eq!(&pkt[pkt.len() - 4..], &[0x78, 0xf3, 0x53, 0xf3]);
    assert_eq!(
        p.icrc_computed,
        u32::from_le_bytes([0x78, 0xf3, 0x53, 0xf3])
    );
    let r = p.repr;
    assert_eq!(r.roce.bth.opcode, Opcode::UC_SEND_ONLY);
    assert_eq!(r.roce.bth.pad_count, 2);
    assert!(r.roce.bth.mig_req);
    assert_eq!(r.roce.payload_len, 18);
    assert_eq!(
        r.udp.checksum, 0xaca2,
        "non-zero UDP checksum kept (and masked in the ICRC)"
    );
    assert_eq!(p.payload, &hex("4630818be28935d90e9a95505401be885e50")[..]);
    let mut out = vec![0u8; r.buffer_len()];
    r.emit(&mut out, p.payload).unwrap();
    assert_eq!(out, pkt, "re-emitted UC SEND_ONLY is byte-identical");
}

#[test]
fn uc_send_only_udp_checksum_is_a_real_checksum() {
    // An independent cross-check of our UDP checksum routine on a frame we did not make.
    let pkt = hex(UC_SEND);
    let p = packet::parse_ip(&pkt).unwrap();
    let c = wire::udp::checksum(p.repr.ip.src(), p.repr.ip.dst(), &pkt[20..]);
    assert_eq!(c, 0xaca2);
}

#[test]
fn a_flipped_bit_in_each_known_frame_fails_the_icrc() {
    let frame = hex(CNP);
    let mut bad = frame.clone();
    bad[14 + 20 + 8 + 11] ^= 1; // a PSN bit
    assert!(matches!(
        wire::parse_frame(&bad),
        Err(wire::Error::BadIcrc { .. })
    ));
    let pkt = hex(UC_SEND);
    let mut bad = pkt.clone();
    bad[45] ^= 0x80; // a payload bit
    assert!(matches!(
        packet::parse_ip(&bad),
        Err(wire::Error::BadIcrc { .. })
    ));
}
