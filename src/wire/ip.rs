//! IPv4 and IPv6 headers as RoCE v2 uses them (UDP inside, no fragments, no IPv6 extension
//! headers), and the ECN field that congestion control reads and marks.

use super::{need, need_room, rd16, rd32, wr16, wr32, Error, Layer, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;
/// IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// IPv6 fixed header.
pub const IPV6_HEADER_LEN: usize = 40;

/// The two ECN bits (RFC 3168).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum Ecn {
    /// Not ECN-capable transport (00).
    #[default]
    NotEct,
    /// ECN-capable transport, ECT(1) (01).
    Ect1,
    /// ECN-capable transport, ECT(0) (10).
    Ect0,
    /// Congestion experienced (11).
    Ce,
}

impl Ecn {
    /// From the two low bits of `b`.
    pub const fn from_bits(b: u8) -> Self {
        match b & 3 {
            0 => Ecn::NotEct,
            1 => Ecn::Ect1,
            2 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }
    /// The two bits.
    pub const fn bits(self) -> u8 {
        match self {
            Ecn::NotEct => 0,
            Ecn::Ect1 => 1,
            Ecn::Ect0 => 2,
            Ecn::Ce => 3,
        }
    }
}

/// The owned form of an IPv4 header (protocol UDP, no options).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Differentiated services code point, 6 bits.
    pub dscp: u8,
    /// ECN bits.
    pub ecn: Ecn,
    /// Identification. Covered by the ICRC (rxe increments it per packet).
    pub ident: u16,
    /// Don't-fragment flag (RoCE v2 sets it).
    pub dont_frag: bool,
    /// Time to live.
    pub ttl: u8,
}

/// The owned form of an IPv6 header (next header UDP).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Ipv6Repr {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Differentiated services code point, 6 bits.
    pub dscp: u8,
    /// ECN bits.
    pub ecn: Ecn,
    /// 20-bit flow label.
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
}

/// Either IP version.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum IpRepr {
    /// IPv4.
    V4(Ipv4Repr),
    /// IPv6.
    V6(Ipv6Repr),
}

/// What parsing an IP header found besides the `Repr`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct IpParsed {
    /// Header length (IPv4 with options included).
    pub header_len: usize,
    /// Bytes of IP payload the length field declares.
    pub payload_len: usize,
    /// IPv4 header checksum correct (always true for IPv6).
    pub checksum_ok: bool,
}

/// The Internet checksum (RFC 1071) of `data`.
pub fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [b] = chunks.remainder() {
        sum += u32::from(*b) << 8;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl Ipv4Repr {
    /// Parse an IPv4 header carrying UDP from the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<(Self, IpParsed)> {
        need(Layer::Ipv4, buf, IPV4_HEADER_LEN)?;
        let ver = buf[0] >> 4;
        if ver != 4 {
            return Err(Error::BadIpVersion(ver));
        }
        let ihl = buf[0] & 0x0f;
        if ihl < 5 {
            return Err(Error::BadIhl(ihl));
        }
        let hlen = usize::from(ihl) * 4;
        need(Layer::Ipv4, buf, hlen)?;
        let total = usize::from(rd16(buf, 2));
        if total < hlen || total > buf.len() {
            return Err(Error::BadLength {
                layer: Layer::Ipv4,
                declared: total,
                actual: buf.len(),
            });
        }
        let frag = rd16(buf, 6);
        if frag & 0x3fff != 0 {
            return Err(Error::Fragmented);
        }
        if buf[9] != PROTO_UDP {
            return Err(Error::NotUdp(buf[9]));
        }
        let mut src = [0u8; 4];
        let mut dst = [0u8; 4];
        src.copy_from_slice(&buf[12..16]);
        dst.copy_from_slice(&buf[16..20]);
        let repr = Ipv4Repr {
            src: src.into(),
            dst: dst.into(),
            dscp: buf[1] >> 2,
            ecn: Ecn::from_bits(buf[1]),
            ident: rd16(buf, 4),
            dont_frag: frag & 0x4000 != 0,
            ttl: buf[8],
        };
        let checksum_ok = internet_checksum(&buf[..hlen]) == 0;
        Ok((
            repr,
            IpParsed {
                header_len: hlen,
                payload_len: total - hlen,
                checksum_ok,
            },
        ))
    }

    /// Bytes on the wire (20: no options).
    pub const fn buffer_len(&self) -> usize {
        IPV4_HEADER_LEN
    }

    /// Emit a 20-byte header for `payload_len` bytes of UDP, with a correct checksum.
    pub fn emit(&self, buf: &mut [u8], payload_len: usize) -> Result<()> {
        need_room(buf, IPV4_HEADER_LEN)?;
        let total = u16::try_from(IPV4_HEADER_LEN + payload_len)
            .map_err(|_| Error::FieldOverflow("IPv4 total length"))?;
        let b = &mut buf[..IPV4_HEADER_LEN];
        b[0] = 0x45;
        b[1] = (self.dscp << 2) | self.ecn.bits();
        wr16(b, 2, total);
        wr16(b, 4, self.ident);
        wr16(b, 6, if self.dont_frag { 0x4000 } else { 0 });
        b[8] = self.ttl;
        b[9] = PROTO_UDP;
        wr16(b, 10, 0);
        b[12..16].copy_from_slice(&self.src.octets());
        b[16..20].copy_from_slice(&self.dst.octets());
        let c = internet_checksum(b);
        wr16(b, 10, c);
        Ok(())
    }
}

impl Ipv6Repr {
    /// Parse an IPv6 header whose next header is UDP.
    pub fn parse(buf: &[u8]) -> Result<(Self, IpParsed)> {
        need(Layer::Ipv6, buf, IPV6_HEADER_LEN)?;
        let ver = buf[0] >> 4;
        if ver != 6 {
            return Err(Error::BadIpVersion(ver));
        }
        let plen = usize::from(rd16(buf, 4));
        if IPV6_HEADER_LEN + plen > buf.len() {
            return Err(Error::BadLength {
                layer: Layer::Ipv6,
                declared: plen,
                actual: buf.len() - IPV6_HEADER_LEN,
            });
        }
        if buf[6] != PROTO_UDP {
            return Err(Error::NotUdp(buf[6]));
        }
        let w0 = rd32(buf, 0);
        let tc = ((w0 >> 20) & 0xff) as u8;
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        src.copy_from_slice(&buf[8..24]);
        dst.copy_from_slice(&buf[24..40]);
        let repr = Ipv6Repr {
            src: src.into(),
            dst: dst.into(),
            dscp: tc >> 2,
            ecn: Ecn::from_bits(tc),
            flow_label: w0 & 0x000f_ffff,
            hop_limit: buf[7],
        };
        Ok((
            repr,
            IpParsed {
                header_len: IPV6_HEADER_LEN,
                payload_len: plen,
                checksum_ok: true,
            },
        ))
    }

    /// Bytes on the wire (40).
    pub const fn buffer_len(&self) -> usize {
        IPV6_HEADER_LEN
    }

    /// Emit a 40-byte header for `payload_len` bytes of UDP.
    pub fn emit(&self, buf: &mut [u8], payload_len: usize) -> Result<()> {
        need_room(buf, IPV6_HEADER_LEN)?;
        let plen =
            u16::try_from(payload_len).map_err(|_| Error::FieldOverflow("IPv6 payload length"))?;
        let tc = u32::from((self.dscp << 2) | self.ecn.bits());
        wr32(
            buf,
            0,
            (6 << 28) | (tc << 20) | (self.flow_label & 0x000f_ffff),
        );
        wr16(buf, 4, plen);
        buf[6] = PROTO_UDP;
        buf[7] = self.hop_limit;
        buf[8..24].copy_from_slice(&self.src.octets());
        buf[24..40].copy_from_slice(&self.dst.octets());
        Ok(())
    }
}

impl IpRepr {
    /// Bytes on the wire.
    pub fn buffer_len(&self) -> usize {
        match self {
            IpRepr::V4(r) => r.buffer_len(),
            IpRepr::V6(r) => r.buffer_len(),
        }
    }
    /// Emit the header for `payload_len` bytes of UDP.
    pub fn emit(&self, buf: &mut [u8], payload_len: usize) -> Result<()> {
        match self {
            IpRepr::V4(r) => r.emit(buf, payload_len),
            IpRepr::V6(r) => r.emit(buf, payload_len),
        }
    }
    /// Source address.
    pub fn src(&self) -> IpAddr {
        match self {
            IpRepr::V4(r) => r.src.into(),
            IpRepr::V6(r) => r.src.into(),
        }
    }
    /// Destination address.
    pub fn dst(&self) -> IpAddr {
        match self {
            IpRepr::V4(r) => r.dst.into(),
            IpRepr::V6(r) => r.dst.into(),
        }
    }
    /// ECN bits.
    pub fn ecn(&self) -> Ecn {
        match self {
            IpRepr::V4(r) => r.ecn,
            IpRepr::V6(r) => r.ecn,
        }
    }
    /// Differentiated services code point.
    pub fn dscp(&self) -> u8 {
        match self {
            IpRepr::V4(r) => r.dscp,
            IpRepr::V6(r) => r.dscp,
        }
    }
    /// The ethertype that carries this version.
    pub fn ethertype(&self) -> u16 {
        match self {
            IpRepr::V4(_) => super::eth::ETHERTYPE_IPV4,
            IpRepr::V6(_) => super::eth::ETHERTYPE_IPV6,
        }
    }
}

/// Read the ECN bits of the IP header at the start of `ip`.
pub fn read_ecn(ip: &[u8]) -> Option<Ecn> {
    match ip.first()? >> 4 {
        4 => ip.get(1).map(|b| Ecn::from_bits(*b)),
        6 if ip.len() >= 2 => Some(Ecn::from_bits(((ip[0] << 4) | (ip[1] >> 4)) & 3)),
        _ => None,
    }
}

/// Rewrite the ECN bits of the IP header at the start of `ip` in place (what a congestion
/// point does when it marks CE), fixing the IPv4 header checksum incrementally (RFC 1624).
/// The ICRC is unaffected: the ECN field is masked in its computation. Returns false if `ip`
/// is not a whole IPv4/IPv6 header.
pub fn set_ecn(ip: &mut [u8], ecn: Ecn) -> bool {
    match ip.first().map(|b| b >> 4) {
        Some(4) if ip.len() >= IPV4_HEADER_LEN => {
            let old = rd16(ip, 0);
            ip[1] = (ip[1] & 0xfc) | ecn.bits();
            let new = rd16(ip, 0);
            // HC' = ~(~HC + ~m + m')
            let hc = rd16(ip, 10);
            let mut sum = u32::from(!hc) + u32::from(!old) + u32::from(new);
            while sum >> 16 != 0 {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            wr16(ip, 10, !(sum as u16));
            true
        }
        Some(6) if ip.len() >= IPV6_HEADER_LEN => {
            // Traffic class spans bits 27..20 of the first word; ECN is its low two bits.
            ip[1] = (ip[1] & 0xcf) | (ecn.bits() << 4);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // IPv4 header of the ConnectX-4 Lx CNP frame in roce-facts.md.
    const CNP_IP: [u8; 20] = [
        0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11,
        0x01, 0x0a, 0x00, 0x12, 0x01,
    ];

    #[test]
    fn ipv4_known_header() {
        let mut buf = CNP_IP.to_vec();
        buf.extend_from_slice(&[0u8; 40]);
        let (r, p) = Ipv4Repr::parse(&buf).unwrap();
        assert_eq!(r.dscp, 48);
        assert_eq!(r.ecn, Ecn::Ect0);
        assert_eq!(r.ttl, 64);
        assert!(r.dont_frag);
        assert_eq!(r.ident, 0x718c);
        assert_eq!(r.src, Ipv4Addr::new(10, 0, 17, 1));
        assert_eq!(
            p,
            IpParsed {
                header_len: 20,
                payload_len: 40,
                checksum_ok: true
            }
        );
        let mut out = [0u8; 20];
        r.emit(&mut out, 40).unwrap();
        assert_eq!(out, CNP_IP);
    }

    #[test]
    fn ce_marking_keeps_checksum_valid() {
        let mut h = CNP_IP;
        assert!(set_ecn(&mut h, Ecn::Ce));
        assert_eq!(h[1], 0xc3);
        assert_eq!(internet_checksum(&h), 0);
        assert_eq!(read_ecn(&h), Some(Ecn::Ce));
        let r6 = Ipv6Repr {
            src: Ipv6Addr::LOCALHOST,
            dst: Ipv6Addr::LOCALHOST,
            dscp: 26,
            ecn: Ecn::Ect0,
            flow_label: 0xabcde,
            hop_limit: 64,
        };
        let mut b = [0u8; 40];
        r6.emit(&mut b, 0).unwrap();
        assert!(set_ecn(&mut b, Ecn::Ce));
        let (back, _) = Ipv6Repr::parse(&b).unwrap();
        assert_eq!(back, Ipv6Repr { ecn: Ecn::Ce, ..r6 });
    }

    #[test]
    fn rejects() {
        let mut h = CNP_IP;
        h[6] = 0x20; // MF
        let mut buf = h.to_vec();
        buf.extend_from_slice(&[0u8; 40]);
        assert_eq!(Ipv4Repr::parse(&buf).unwrap_err(), Error::Fragmented);
        let mut buf = CNP_IP.to_vec();
        assert!(matches!(
            Ipv4Repr::parse(&buf),
            Err(Error::BadLength { .. })
        ));
        buf.extend_from_slice(&[0u8; 40]);
        buf[9] = 6;
        assert_eq!(Ipv4Repr::parse(&buf).unwrap_err(), Error::NotUdp(6));
        buf[0] = 0x44;
        assert_eq!(Ipv4Repr::parse(&buf).unwrap_err(), Error::BadIhl(4));
        buf[0] = 0x65;
        assert_eq!(Ipv4Repr::parse(&buf).unwrap_err(), Error::BadIpVersion(6));
    }
}
