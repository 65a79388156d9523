//! UDP header (RFC 768). RoCE v2 uses destination port 4791; the source port carries flow
//! entropy. A zero checksum is allowed over IPv4 and is what Linux rxe sends.

use super::{need, need_room, rd16, wr16, Error, Layer, Result};
use std::net::IpAddr;

/// Length of the UDP header.
pub const HEADER_LEN: usize = 8;
/// Offset of the checksum (masked for the ICRC).
pub const CHECKSUM: core::ops::Range<usize> = 6..8;

/// The owned form of a UDP header. The checksum is kept as the 16-bit value on the wire and
/// emitted as given (0 = none, as rxe does); [`fill_checksum`] computes a real one after the
/// rest of the datagram has been written.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct UdpRepr {
    /// Source port (RoCE v2 uses it for flow entropy).
    pub src_port: u16,
    /// Destination port (4791 for RoCE v2).
    pub dst_port: u16,
    /// Checksum as on the wire (0: none).
    pub checksum: u16,
}

impl UdpRepr {
    /// Parse; returns the header and the datagram length from the length field.
    pub fn parse(buf: &[u8]) -> Result<(Self, usize)> {
        need(Layer::Udp, buf, HEADER_LEN)?;
        let len = usize::from(rd16(buf, 4));
        if len < HEADER_LEN || len > buf.len() {
            return Err(Error::BadLength {
                layer: Layer::Udp,
                declared: len,
                actual: buf.len(),
            });
        }
        Ok((
            UdpRepr {
                src_port: rd16(buf, 0),
                dst_port: rd16(buf, 2),
                checksum: rd16(buf, 6),
            },
            len,
        ))
    }

    /// Bytes on the wire (8).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the header for `payload_len` bytes of payload (the checksum as given).
    pub fn emit(&self, buf: &mut [u8], payload_len: usize) -> Result<()> {
        need_room(buf, HEADER_LEN)?;
        let len = u16::try_from(HEADER_LEN + payload_len)
            .map_err(|_| Error::FieldOverflow("UDP length"))?;
        wr16(buf, 0, self.src_port);
        wr16(buf, 2, self.dst_port);
        wr16(buf, 4, len);
        wr16(buf, 6, self.checksum);
        Ok(())
    }
}

/// The UDP checksum of `datagram` (header with any checksum value, plus payload) between
/// `src` and `dst`, per RFC 768 / RFC 8200 §8.1 (0 is sent as 0xFFFF).
pub fn checksum(src: IpAddr, dst: IpAddr, datagram: &[u8]) -> u16 {
    let mut sum = 0u32;
    fn words(sum: &mut u32, b: &[u8]) {
        let mut it = b.chunks_exact(2);
        for c in &mut it {
            *sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
        }
        if let [x] = it.remainder() {
            *sum += u32::from(*x) << 8;
        }
    }
    let mut add = |b: &[u8]| words(&mut sum, b);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            add(&s.octets());
            add(&d.octets());
        }
        (s, d) => {
            let s6 = match s {
                IpAddr::V4(a) => a.to_ipv6_mapped(),
                IpAddr::V6(a) => a,
            };
            let d6 = match d {
                IpAddr::V4(a) => a.to_ipv6_mapped(),
                IpAddr::V6(a) => a,
            };
            add(&s6.octets());
            add(&d6.octets());
        }
    }
    if datagram.len() >= HEADER_LEN {
        add(&datagram[..6]);
        add(&datagram[HEADER_LEN..]);
    } else {
        add(datagram);
    }
    let len = datagram.len() as u32;
    sum += (len >> 16) + (len & 0xffff) + u32::from(super::ip::PROTO_UDP);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    match !(sum as u16) {
        0 => 0xffff,
        c => c,
    }
}

/// Compute and store the checksum of a complete datagram in place.
pub fn fill_checksum(src: IpAddr, dst: IpAddr, datagram: &mut [u8]) {
    if datagram.len() >= HEADER_LEN {
        let c = checksum(src, dst, datagram);
        wr16(datagram, 6, c);
    }
}
