//! The golden captures in `captures/`: one packet of every opcode ferroce knows, over IPv4,
//! IPv6 and 802.1Q-tagged IPv4, with field values chosen so that each packet differs from its
//! neighbours (QPN, PSN, keys) and a decoder that mixes fields up is caught. They are what
//! `tools/check-captures` compares with tshark and with the independent checker.
//!
//! RD RESYNC (0x55) is left out: it carries no operation a checker can show, and neither
//! tshark 4.0 nor the independent checker decodes it (both call it reserved).

use crate::pcap::capture::PcapSink;
use crate::wire::ext::{AtomicEthRepr, DethRepr, RethRepr};
use crate::wire::opcode::{Headers, OpFlags};
use crate::wire::{
    AethRepr, BthRepr, CreditCode, Ecn, EthernetRepr, ExtRepr, FrameRepr, IpRepr, Ipv4Repr,
    Ipv6Repr, MacAddr, NakCode, Opcode, PKey, Psn, QKey, QpNumber, RKey, RnrTimer, RoceRepr,
    Syndrome, UdpRepr, VlanTag, ROCE_V2_PORT,
};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

/// The framings the golden set is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// Ethernet, IPv4.
    Ipv4,
    /// Ethernet, IPv6.
    Ipv6,
    /// Ethernet with an 802.1Q tag, IPv4.
    VlanIpv4,
}

/// One golden capture file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Golden {
    /// The framing of every packet.
    pub framing: Framing,
    /// RD opcodes only (a file of their own: tshark 4.0 mis-dissects RD, see the README).
    pub rd: bool,
}

impl Golden {
    /// Every golden file.
    pub const ALL: [Golden; 5] = [
        Golden {
            framing: Framing::Ipv4,
            rd: false,
        },
        Golden {
            framing: Framing::Ipv6,
            rd: false,
        },
        Golden {
            framing: Framing::VlanIpv4,
            rd: false,
        },
        Golden {
            framing: Framing::Ipv4,
            rd: true,
        },
        Golden {
            framing: Framing::Ipv6,
            rd: true,
        },
    ];
    /// File name inside `captures/`.
    pub fn file_name(self) -> &'static str {
        match (self.framing, self.rd) {
            (Framing::Ipv4, false) => "golden-ipv4.pcap",
            (Framing::Ipv6, false) => "golden-ipv6.pcap",
            (Framing::VlanIpv4, false) => "golden-vlan-ipv4.pcap",
            (Framing::Ipv4, true) => "golden-rd-ipv4.pcap",
            (Framing::Ipv6, true) => "golden-rd-ipv6.pcap",
            (Framing::VlanIpv4, true) => "golden-rd-vlan-ipv4.pcap",
        }
    }
    /// The opcodes in this file: every known opcode but RD RESYNC, split RD / not RD.
    pub fn opcodes(self) -> Vec<Opcode> {
        Opcode::all_known()
            .filter(|o| !o.is(OpFlags::RESYNC))
            .filter(|o| (o.transport() == crate::wire::Transport::Rd) == self.rd)
            .collect()
    }
}

/// Frame `i` of the golden set: `(frame repr, payload)`.
pub fn frame(framing: Framing, i: usize, op: Opcode) -> (FrameRepr, Vec<u8>) {
    let n = i as u32;
    let f = op.flags();
    let len = if f.contains(OpFlags::FIXED8) {
        8
    } else if f.contains(OpFlags::FULL_MTU) {
        256
    } else if f.contains(OpFlags::PAYLOAD) {
        // 1..=61 bytes: every pad count appears.
        1 + (i * 7) % 61
    } else {
        0
    };
    let payload: Vec<u8> = (0..len)
        .map(|k| (k as u8).wrapping_mul(31).wrapping_add(n as u8))
        .collect();
    let h = op.headers();
    let syndromes = [
        Syndrome::Ack(CreditCode::new((n % 31) as u8)),
        Syndrome::Ack(CreditCode::UNLIMITED),
        Syndrome::RnrNak(RnrTimer::new(14)),
        Syndrome::Nak(NakCode::PsnSequenceError),
        Syndrome::Nak(NakCode::RemoteAccessError),
    ];
    let ext = ExtRepr {
        rdeth: h.contains(Headers::RDETH).then_some(0x000100 + n),
        deth: h.contains(Headers::DETH).then_some(DethRepr {
            qkey: QKey(0x1111_1111 + n),
            src_qp: QpNumber::new(0x100 + n),
        }),
        xrceth: h.contains(Headers::XRCETH).then_some(0x000200 + n),
        feth: h.contains(Headers::FETH).then_some(0x0000_0101),
        reth: h.contains(Headers::RETH).then_some(RethRepr {
            va: 0x0000_7f00_0000_0000 + u64::from(n) * 0x1000,
            rkey: RKey(0x1000_0000 + n),
            dma_len: if f.contains(OpFlags::FIXED8) {
                8
            } else {
                4096 + n
            },
        }),
        atomic_eth: h.contains(Headers::ATOMIC_ETH).then_some(AtomicEthRepr {
            va: 0x0000_7f00_0000_0008 + u64::from(n) * 8,
            rkey: RKey(0x2000_0000 + n),
            swap_add: 0x0102_0304_0506_0708 + u64::from(n),
            compare: 0x1122_3344_5566_7788,
        }),
        aeth: h.contains(Headers::AETH).then_some(AethRepr {
            syndrome: syndromes[i % syndromes.len()],
            msn: 0x10 + n,
        }),
        atomic_ack: h
            .contains(Headers::ATOMIC_ACK_ETH)
            .then_some(0xdead_beef_0000_0000 + u64::from(n)),
        imm: h.contains(Headers::IMM_DT).then_some(0xc0de_0000 + n),
        ieth: h.contains(Headers::IETH).then_some(RKey(0x3000_0000 + n)),
    };
    let mut bth = BthRepr::new(
        op,
        QpNumber::new(0x11 + n * 0x101),
        Psn::new(0xff_fff0u32.wrapping_add(n * 3)),
    );
    bth.ack_req = f.contains(OpFlags::LAST) && f.contains(OpFlags::REQUEST);
    bth.solicited = f.contains(OpFlags::IMMEDIATE);
    if op == Opcode::CNP {
        // As a ConnectX sends it (roce-facts.md): BECN set, PSN 0.
        bth.becn = true;
        bth.psn = Psn::new(0);
    }
    bth.pkey = PKey::DEFAULT;
    let roce = RoceRepr::new(bth, ext, payload.len());
    let ip = match framing {
        Framing::Ipv4 | Framing::VlanIpv4 => IpRepr::V4(Ipv4Repr {
            src: Ipv4Addr::new(10, 61, 1, 2),
            dst: Ipv4Addr::new(10, 61, 2, 2),
            dscp: if op == Opcode::CNP { 48 } else { 26 },
            ecn: Ecn::Ect0,
            ident: n as u16,
            dont_frag: true,
            ttl: 64,
        }),
        Framing::Ipv6 => IpRepr::V6(Ipv6Repr {
            src: Ipv6Addr::new(0xfd61, 1, 0, 0, 0, 0, 0, 2),
            dst: Ipv6Addr::new(0xfd61, 2, 0, 0, 0, 0, 0, 2),
            dscp: 26,
            ecn: Ecn::Ect0,
            flow_label: 0x1_0000 + n,
            hop_limit: 64,
        }),
    };
    let eth = EthernetRepr {
        dst: MacAddr([0x02, 0xfe, 0x61, 0x02, 0x00, 0x02]),
        src: MacAddr([0x02, 0xfe, 0x61, 0x01, 0x00, 0x02]),
        vlan: (framing == Framing::VlanIpv4).then_some(VlanTag {
            pcp: 3,
            dei: false,
            vid: 61,
        }),
        ethertype: 0,
    };
    let udp = UdpRepr {
        src_port: 0xc000 | (n as u16 & 0x3fff),
        dst_port: ROCE_V2_PORT,
        checksum: 0,
    };
    (
        FrameRepr {
            eth: Some(eth),
            ip,
            udp,
            roce,
        },
        payload,
    )
}

/// Write golden capture `g` into `w`. Returns the number of frames.
pub fn write<W: std::io::Write>(
    g: Golden,
    w: W,
) -> Result<usize, crate::pcap::capture::CaptureError> {
    let mut sink = PcapSink::new(w)?;
    let ops = g.opcodes();
    for (i, &op) in ops.iter().enumerate() {
        let (f, payload) = frame(g.framing, i, op);
        let mut buf = vec![0u8; f.buffer_len()];
        f.emit(&mut buf, &payload)
            .map_err(|e| crate::pcap::capture::CaptureError::Corrupt(e.to_string()))?;
        if let IpRepr::V6(_) = f.ip {
            // RFC 8200 §8.1: IPv6 UDP needs a real checksum (rxe sends 0, which tshark flags).
            let udp_at = f.eth.map_or(0, |e| e.buffer_len()) + f.ip.buffer_len();
            crate::wire::udp::fill_checksum(f.ip.src(), f.ip.dst(), &mut buf[udp_at..]);
        }
        // Fixed timestamps so that the files are reproducible byte for byte.
        sink.write(
            Duration::from_micros(1_767_225_600_000_000 + i as u64 * 10),
            &buf,
        )?;
    }
    sink.into_inner().flush()?;
    Ok(ops.len())
}
