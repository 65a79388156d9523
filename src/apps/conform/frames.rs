//! The tester's own packet builder: any header field, any PSN, any opcode, a pad count that
//! disagrees with the payload, a bad ICRC, a CE mark, a wrong P_Key, QPN or address. It is
//! separate from the production engine on purpose: it must be able to say what ferroce's
//! engine would never say. The layers are written with `src/wire`'s `Repr`s; the transport
//! part is assembled by hand (BTH, extension headers, the raw bytes after them) so that
//! malformed combinations can be expressed, and the ICRC is computed over what was written.

use crate::wire::{
    self, bth, icrc, packet::pad_for, AethRepr, AtomicEthRepr, BthRepr, Ecn, EthernetRepr, ExtRepr,
    IpRepr, Ipv4Repr, Ipv6Repr, MacAddr, Opcode, PKey, Psn, QpNumber, RKey, RethRepr, Syndrome,
    UdpRepr,
};
use std::net::IpAddr;

/// The addresses of both ends, as the exchange and the interface gave them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoints {
    /// Our MAC address.
    pub our_mac: MacAddr,
    /// The peer's (or its next hop's) MAC address.
    pub peer_mac: MacAddr,
    /// Our IP address.
    pub our_ip: IpAddr,
    /// The peer's IP address.
    pub peer_ip: IpAddr,
    /// The UDP source port of our packets (constant per connection, as A17.3.2.1 advises).
    pub sport: u16,
    /// Our QPN (the peer sends its responses there).
    pub our_qpn: u32,
    /// The peer's QPN.
    pub peer_qpn: u32,
}

/// One packet to send, every field settable. Built with the constructors below and adjusted
/// with the `with_*` methods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pkt {
    /// BTH opcode.
    pub opcode: Opcode,
    /// PSN.
    pub psn: u32,
    /// AckReq bit.
    pub ack_req: bool,
    /// Solicited event bit.
    pub solicited: bool,
    /// Partition key.
    pub pkey: u16,
    /// Transport header version.
    pub tver: u8,
    /// BECN bit.
    pub becn: bool,
    /// FECN bit.
    pub fecn: bool,
    /// `None`: the peer's QPN (requests to its responder and responses to its requester alike).
    pub dest_qp: Option<u32>,
    /// The extension headers (they must match the opcode unless a test breaks it on purpose).
    pub ext: ExtRepr,
    /// Every byte between the extension headers and the ICRC: payload and pad.
    pub data: Vec<u8>,
    /// The BTH pad count as written (normally the pad at the end of `data`).
    pub pad_count: u8,
    /// The IP header's ECN bits.
    pub ecn: Ecn,
    /// Override the IP source / destination (spoofing tests).
    pub src_ip: Option<IpAddr>,
    /// Override the IP destination.
    pub dst_ip: Option<IpAddr>,
    /// Send the ICRC with every bit inverted.
    pub bad_icrc: bool,
    /// Override the UDP source port.
    pub sport: Option<u16>,
    /// Override the UDP length field by this many bytes (positive or negative).
    pub udp_len_delta: i32,
}

impl Pkt {
    /// A packet of `opcode` with `payload` padded to a multiple of four and the pad count set.
    pub fn new(opcode: Opcode, psn: u32, payload: &[u8]) -> Pkt {
        let pad = pad_for(payload.len());
        let mut data = payload.to_vec();
        data.resize(payload.len() + usize::from(pad), 0);
        Pkt {
            opcode,
            psn: psn & Psn::MASK,
            ack_req: false,
            solicited: false,
            pkey: 0xffff,
            tver: 0,
            becn: false,
            fecn: false,
            dest_qp: None,
            ext: ExtRepr::default(),
            data,
            pad_count: pad,
            ecn: Ecn::Ect0,
            src_ip: None,
            dst_ip: None,
            bad_icrc: false,
            sport: None,
            udp_len_delta: 0,
        }
    }

    /// SEND ONLY with AckReq.
    pub fn send_only(psn: u32, payload: &[u8]) -> Pkt {
        Pkt::new(Opcode::RC_SEND_ONLY, psn, payload).ack()
    }

    /// RDMA WRITE ONLY with AckReq; the RETH length is the payload length.
    pub fn write_only(psn: u32, va: u64, rkey: u32, payload: &[u8]) -> Pkt {
        Pkt::new(Opcode::RC_WRITE_ONLY, psn, payload)
            .reth(va, rkey, payload.len() as u32)
            .ack()
    }

    /// RDMA READ request (AckReq set, as requesters send it).
    pub fn read(psn: u32, va: u64, rkey: u32, len: u32) -> Pkt {
        Pkt::new(Opcode::RC_READ_REQUEST, psn, &[])
            .reth(va, rkey, len)
            .ack()
    }

    /// FETCH_AND_ADD.
    pub fn fetch_add(psn: u32, va: u64, rkey: u32, add: u64) -> Pkt {
        let mut p = Pkt::new(Opcode::RC_FETCH_ADD, psn, &[]).ack();
        p.ext.atomic_eth = Some(AtomicEthRepr {
            va,
            rkey: RKey(rkey),
            swap_add: add,
            compare: 0,
        });
        p
    }

    /// COMPARE_AND_SWAP.
    pub fn cmp_swap(psn: u32, va: u64, rkey: u32, compare: u64, swap: u64) -> Pkt {
        let mut p = Pkt::new(Opcode::RC_CMP_SWAP, psn, &[]).ack();
        p.ext.atomic_eth = Some(AtomicEthRepr {
            va,
            rkey: RKey(rkey),
            swap_add: swap,
            compare,
        });
        p
    }

    /// An ACK (or NAK) we send to the peer's requester.
    pub fn ack_to_peer(psn: u32, syndrome: Syndrome, msn: u32) -> Pkt {
        let mut p = Pkt::new(Opcode::RC_ACK, psn, &[]);
        p.ext.aeth = Some(AethRepr {
            syndrome,
            msn: msn & 0xff_ffff,
        });
        p
    }

    /// Add a RETH.
    pub fn reth(mut self, va: u64, rkey: u32, len: u32) -> Pkt {
        self.ext.reth = Some(RethRepr {
            va,
            rkey: RKey(rkey),
            dma_len: len,
        });
        self
    }
    /// Set AckReq.
    pub fn ack(mut self) -> Pkt {
        self.ack_req = true;
        self
    }
    /// Clear AckReq.
    pub fn no_ack(mut self) -> Pkt {
        self.ack_req = false;
        self
    }
    /// Set the ECN bits.
    pub fn ecn(mut self, e: Ecn) -> Pkt {
        self.ecn = e;
        self
    }
    /// Address another QP.
    pub fn to_qp(mut self, qpn: u32) -> Pkt {
        self.dest_qp = Some(qpn & QpNumber::MASK);
        self
    }
    /// Set the partition key.
    pub fn pkey(mut self, k: u16) -> Pkt {
        self.pkey = k;
        self
    }
    /// Write `n` (0..=3) as the pad count.
    pub fn pad(mut self, n: u8) -> Pkt {
        self.pad_count = n & 3;
        self
    }
    /// Send a wrong ICRC.
    pub fn corrupt_icrc(mut self) -> Pkt {
        self.bad_icrc = true;
        self
    }

    /// The payload length the receiver should derive (data minus the pad count).
    pub fn payload_len(&self) -> usize {
        self.data.len().saturating_sub(usize::from(self.pad_count))
    }

    /// A one-line description for reports (the transport part as `ferroce inspect` shows it,
    /// plus what is unusual about the packet).
    pub fn describe(&self, ep: &Endpoints) -> String {
        let r = wire::RoceRepr {
            bth: self.bth(ep),
            ext: self.ext,
            payload_len: self.payload_len(),
        };
        let mut s = format!("{}", wire::pretty::RoceLine(&r));
        if self.ecn == Ecn::Ce {
            s.push_str(" ecn=CE");
        }
        if self.bad_icrc {
            s.push_str(" icrc=BAD");
        }
        if let Some(a) = self.src_ip {
            s.push_str(&format!(" ip.src={a}"));
        }
        if let Some(a) = self.dst_ip {
            s.push_str(&format!(" ip.dst={a}"));
        }
        if self.tver != 0 {
            s.push_str(&format!(" tver={}", self.tver));
        }
        if usize::from(self.pad_count) != usize::from(pad_for(self.payload_len()))
            || self.data.len() % 4 != 0
        {
            s.push_str(&format!(" (data+pad {} bytes)", self.data.len()));
        }
        s
    }

    fn bth(&self, ep: &Endpoints) -> BthRepr {
        BthRepr {
            opcode: self.opcode,
            solicited: self.solicited,
            mig_req: false,
            pad_count: self.pad_count,
            tver: self.tver,
            pkey: PKey(self.pkey),
            fecn: self.fecn,
            becn: self.becn,
            dest_qp: QpNumber::new(self.dest_qp.unwrap_or(ep.peer_qpn)),
            ack_req: self.ack_req,
            psn: Psn::new(self.psn),
        }
    }

    /// The whole Ethernet frame. `ident` is the IPv4 identification to use.
    pub fn frame(&self, ep: &Endpoints, ident: u16) -> Result<Vec<u8>, wire::Error> {
        // Transport: BTH, extension headers, data, ICRC.
        let hlen = bth::HEADER_LEN + ExtRepr::buffer_len(self.opcode);
        let tlen = hlen + self.data.len() + icrc::LEN;
        let mut t = vec![0u8; tlen];
        self.bth(ep).emit(&mut t)?;
        self.ext.emit(self.opcode, &mut t[bth::HEADER_LEN..])?;
        t[hlen..hlen + self.data.len()].copy_from_slice(&self.data);
        let src = self.src_ip.unwrap_or(ep.our_ip);
        let dst = self.dst_ip.unwrap_or(ep.peer_ip);
        let ip = match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => IpRepr::V4(Ipv4Repr {
                src: s,
                dst: d,
                dscp: 0,
                ecn: self.ecn,
                ident,
                dont_frag: true,
                ttl: 64,
            }),
            (IpAddr::V6(s), IpAddr::V6(d)) => IpRepr::V6(Ipv6Repr {
                src: s,
                dst: d,
                dscp: 0,
                ecn: self.ecn,
                flow_label: 0,
                hop_limit: 64,
            }),
            _ => return Err(wire::Error::BadIpVersion(0)),
        };
        let eth = EthernetRepr {
            dst: ep.peer_mac,
            src: ep.our_mac,
            vlan: None,
            ethertype: ip.ethertype(),
        };
        let udp_payload = tlen;
        let mut f = vec![0u8; eth.buffer_len() + ip.buffer_len() + wire::udp::HEADER_LEN + tlen];
        let mut off = eth.emit(&mut f)?;
        let ip_at = off;
        ip.emit(&mut f[off..], wire::udp::HEADER_LEN + udp_payload)?;
        off += ip.buffer_len();
        let udp_at = off;
        UdpRepr {
            src_port: self.sport.unwrap_or(ep.sport),
            dst_port: wire::ROCE_V2_PORT,
            checksum: 0,
        }
        .emit(&mut f[off..], udp_payload)?;
        off += wire::udp::HEADER_LEN;
        let crc = icrc::compute(&f[ip_at..udp_at], &f[udp_at..off], &t[..tlen - icrc::LEN]);
        let crc = if self.bad_icrc { !crc } else { crc };
        t[tlen - icrc::LEN..].copy_from_slice(&icrc::to_wire(crc));
        f[off..].copy_from_slice(&t);
        if self.udp_len_delta != 0 {
            let l = u16::from_be_bytes([f[udp_at + 4], f[udp_at + 5]]);
            let n = (i32::from(l) + self.udp_len_delta).clamp(0, 0xffff) as u16;
            f[udp_at + 4..udp_at + 6].copy_from_slice(&n.to_be_bytes());
        }
        Ok(f)
    }
}

/// A GID as an IP address (IPv4-mapped GIDs become IPv4).
pub fn ip_of_gid(gid: [u8; 16]) -> IpAddr {
    let a = std::net::Ipv6Addr::from(gid);
    match a.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(a),
    }
}

/// The GID of an IP address.
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ep() -> Endpoints {
        Endpoints {
            our_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            peer_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            our_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            peer_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
            sport: 0xc123,
            our_qpn: 0x11,
            peer_qpn: 0x22,
        }
    }

    #[test]
    fn a_well_formed_packet_parses_back_with_a_good_icrc() {
        let p = Pkt::write_only(0xfffffe, 0x1000, 0xabcd, b"hello");
        let f = p.frame(&ep(), 7).unwrap();
        let d = wire::packet::parse_frame(&f).unwrap();
        assert_eq!(d.repr.roce.bth.opcode, Opcode::RC_WRITE_ONLY);
        assert_eq!(d.repr.roce.bth.psn.get(), 0xfffffe);
        assert_eq!(d.repr.roce.bth.dest_qp.get(), 0x22);
        assert_eq!(d.repr.roce.bth.pad_count, 3);
        assert_eq!(d.payload, b"hello");
        assert_eq!(d.repr.roce.ext.reth.unwrap().dma_len, 5);
    }

    #[test]
    fn malformed_variants_are_expressible() {
        let e = ep();
        let bad = Pkt::send_only(1, b"abcd")
            .corrupt_icrc()
            .frame(&e, 0)
            .unwrap();
        assert!(matches!(
            wire::packet::parse_frame(&bad),
            Err(wire::Error::BadIcrc { .. })
        ));
        // Pad count 3 on 8 bytes: the receiver sees a 5-byte payload.
        let p = Pkt::write_only(1, 0, 1, &[1; 8]).pad(3);
        let f = p.frame(&e, 0).unwrap();
        let d = wire::packet::decode_frame(&f).unwrap();
        assert_eq!(d.repr.roce.payload_len, 5);
        assert!(d.icrc_ok());
        // Payload plus pad not a whole number of words: our own parser rejects it.
        let mut q = Pkt::send_only(1, &[1; 5]);
        q.data.truncate(5);
        q.pad_count = 0;
        assert!(wire::packet::decode_frame(&q.frame(&e, 0).unwrap()).is_err());
        let ce = Pkt::send_only(1, b"x").ecn(Ecn::Ce).frame(&e, 0).unwrap();
        let d = wire::packet::parse_frame(&ce).unwrap();
        assert_eq!(d.repr.ip.ecn(), Ecn::Ce);
    }

    #[test]
    fn gid_round_trip() {
        let a: IpAddr = "10.77.0.2".parse().unwrap();
        assert_eq!(ip_of_gid(gid_of(a)), a);
        let b: IpAddr = "fd77::2".parse().unwrap();
        assert_eq!(ip_of_gid(gid_of(b)), b);
    }
}
