//! The classic BPF program attached to the packet socket (`SO_ATTACH_FILTER`), so that the
//! receive ring only ever sees RoCE v2: UDP destination port 4791 over
//!
//! - IPv4 with any valid header length (IHL 5..15; the UDP header is found with the
//!   `ldx 4*([k]&0xf)` "MSH" load), not a non-first fragment (those carry no UDP header);
//! - IPv6 whose next header is UDP (no extension headers — RoCE v2 uses none);
//!
//! each either untagged or inside one 802.1Q tag (present in the frame only when the driver
//! does not strip it; a stripped tag is invisible to the filter and the frame looks untagged).
//! Everything else returns 0 (drop). An accepted frame is kept whole (return `0xFFFF_FFFF`).
//!
//! The program is assembled with [`crate::io::cbpf`]'s labels; its reference interpreter
//! ([`run`]) tests the filter without a kernel.

use crate::io::cbpf::*;
pub use crate::io::cbpf::{run, Insn, ACCEPT};
use crate::wire::ROCE_V2_PORT;

/// The RoCE v2 filter program (see the module documentation).
pub fn roce_v2() -> Vec<Insn> {
    use Target::{Label as L, Next as N};
    let port = u32::from(ROCE_V2_PORT);
    let mut a = Asm::new();
    a.op(LD | H | ABS, 12);
    a.jmp(JEQ, 0x8100, L("vlan"), N);
    // Two copies of the IP part: `l` is the offset of the IP header.
    for (l, v4, v6, pfx) in [(14u32, "v4", "v6", ""), (18u32, "qv4", "qv6", "q")] {
        if pfx == "q" {
            a.label("vlan");
            a.op(LD | H | ABS, 16);
        }
        a.jmp(JEQ, 0x0800, L(v4), N);
        a.jmp(JEQ, 0x86dd, L(v6), L("drop"));
        a.label(v4);
        a.op(LD | B | ABS, l + 9); // protocol
        a.jmp(JEQ, 17, N, L("drop"));
        a.op(LD | H | ABS, l + 6); // flags + fragment offset
        a.jmp(JSET, 0x1fff, L("drop"), N);
        a.op(LDX | B | MSH, l); // X = 4 * IHL
        a.op(MISC | TXA, 0);
        a.jmp(JGE, 20, N, L("drop"));
        a.op(LD | H | IND, l + 2); // UDP destination port at l + X + 2
        a.jmp(JEQ, port, L("accept"), L("drop"));
        a.label(v6);
        a.op(LD | B | ABS, l + 6); // next header
        a.jmp(JEQ, 17, N, L("drop"));
        a.op(LD | H | ABS, l + 40 + 2);
        a.jmp(JEQ, port, L("accept"), L("drop"));
    }
    a.label("accept");
    a.op(RET | K, ACCEPT);
    a.label("drop");
    a.op(RET | K, 0);
    a.finish().expect("the RoCE v2 filter assembles")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn frame(v6: bool, vlan: bool, dport: u16) -> Vec<u8> {
        let ip = if v6 {
            IpRepr::V6(Ipv6Repr {
                src: Ipv6Addr::LOCALHOST,
                dst: Ipv6Addr::LOCALHOST,
                dscp: 0,
                ecn: Ecn::NotEct,
                flow_label: 0,
                hop_limit: 64,
            })
        } else {
            IpRepr::V4(Ipv4Repr {
                src: Ipv4Addr::LOCALHOST,
                dst: Ipv4Addr::LOCALHOST,
                dscp: 0,
                ecn: Ecn::NotEct,
                ident: 1,
                dont_frag: true,
                ttl: 64,
            })
        };
        let f = FrameRepr {
            eth: Some(EthernetRepr {
                dst: MacAddr([2; 6]),
                src: MacAddr([4; 6]),
                vlan: vlan.then_some(VlanTag {
                    pcp: 3,
                    dei: false,
                    vid: 5,
                }),
                ethertype: 0,
            }),
            ip,
            udp: UdpRepr {
                src_port: 0xc000,
                dst_port: ROCE_V2_PORT,
                checksum: 0,
            },
            roce: RoceRepr::new(
                BthRepr::new(Opcode::RC_SEND_ONLY, QpNumber::new(0x11), Psn::new(1)),
                ExtRepr::default(),
                8,
            ),
        };
        let mut b = vec![0u8; f.buffer_len()];
        f.emit(&mut b, &[7; 8]).unwrap();
        // Rewrite the destination port after the fact for the negative cases.
        let l = if vlan { 18 } else { 14 };
        let u = l + if v6 { 40 } else { 20 };
        b[u + 2..u + 4].copy_from_slice(&dport.to_be_bytes());
        b
    }

    #[test]
    fn accepts_roce_v2_in_every_framing() {
        let p = roce_v2();
        for v6 in [false, true] {
            for vlan in [false, true] {
                assert_eq!(
                    run(&p, &frame(v6, vlan, 4791)),
                    ACCEPT,
                    "v6 {v6} vlan {vlan}"
                );
                for port in [4790u16, 4792, 53, 0, 0x12b7 << 1] {
                    assert_eq!(run(&p, &frame(v6, vlan, port)), 0, "port {port}");
                }
            }
        }
    }

    #[test]
    fn ipv4_options_fragments_and_junk() {
        let p = roce_v2();
        // IHL 6: insert 4 bytes of options (NOP NOP NOP EOL) and move the rest along.
        let f = frame(false, false, 4791);
        let mut o = f[..34].to_vec();
        o[14] = 0x46;
        o.extend_from_slice(&[1, 1, 1, 0]);
        o.extend_from_slice(&f[34..]);
        assert_eq!(run(&p, &o), ACCEPT);
        // The port at the IHL-5 position must not be what is checked.
        let mut o2 = o.clone();
        o2[38 + 2..38 + 4].copy_from_slice(&4790u16.to_be_bytes());
        assert_eq!(run(&p, &o2), 0);
        // IHL below 5 is malformed.
        let mut bad = f.clone();
        bad[14] = 0x44;
        assert_eq!(run(&p, &bad), 0);
        // A non-first fragment carries no UDP header; a first fragment (MF) does.
        let mut frag = f.clone();
        frag[14 + 6] = 0x00;
        frag[14 + 7] = 0x10;
        assert_eq!(run(&p, &frag), 0);
        let mut first = f.clone();
        first[14 + 6] = 0x20;
        assert_eq!(run(&p, &first), ACCEPT);
        // TCP to 4791, ARP, IPv6 with a hop-by-hop header, short frames.
        let mut tcp = f.clone();
        tcp[14 + 9] = 6;
        assert_eq!(run(&p, &tcp), 0);
        let mut arp = f.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(run(&p, &arp), 0);
        let mut hbh = frame(true, false, 4791);
        hbh[14 + 6] = 0;
        assert_eq!(run(&p, &hbh), 0);
        // Cut before the end of the destination port: dropped (the kernel's loads fail the
        // same way). A frame cut after it is accepted: the filter does not judge lengths.
        for n in 0..14 + 20 + 4 {
            assert_eq!(run(&p, &f[..n]), 0, "truncated to {n}");
        }
        assert_eq!(run(&p, &f[..14 + 20 + 4]), ACCEPT);
        // A double tag (QinQ inside 802.1Q) is not looked into.
        let q = frame(false, true, 4791);
        let mut qq = q[..16].to_vec();
        qq.extend_from_slice(&[0x81, 0x00, 0x00, 0x07]);
        qq.extend_from_slice(&q[16..]);
        assert_eq!(run(&p, &qq), 0);
    }

    #[test]
    fn program_is_well_formed() {
        let p = roce_v2();
        assert!(p.len() < 64);
        for (pc, i) in p.iter().enumerate() {
            if i.code & 0x07 == JMP {
                assert!(pc + 1 + usize::from(i.jt.max(i.jf)) < p.len());
            }
        }
        assert_eq!(p.last().unwrap().code, RET | K);
    }
}
