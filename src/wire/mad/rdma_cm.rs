//! RDMA-CM's conventions on top of the IB CM (the IBTA's "IP-based connection management"
//! annex, A11, as Linux's rdma_cm implements it): service IDs built from a port space and a
//! port, and the 36-byte header RDMA-CM puts in front of the application's private data in a
//! REQ and a SIDR_REQ.
//!
//! ```text
//! service ID = (port space << 16) + port        e.g. TCP port 7174 → 0x0000_0000_0106_1c06
//!
//! private-data header (REQ bytes 140..176, SIDR_REQ bytes 16..52):
//! 0       version (major 4 bits | minor 4 bits; 0x00)
//! 1       IP version (4 bits: 4 or 6) | reserved (4)
//! 2..4    source port (the active side's port)
//! 4..20   source IP address      (IPv4: 12 zero bytes, then the address)
//! 20..36  destination IP address
//! ```

use super::cm::private_len;
use super::code_type;
use crate::wire::{need, Error, Layer, Result};
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

code_type!(
    /// An RDMA-CM port space (`enum rdma_port_space`): the upper bits of a service ID.
    PortSpace(u16), "4" {
        /// IPoIB (connected mode's service IDs).
        IPOIB = 0x0002 => "IPoIB",
        /// Reliable connections, TCP-like (`RDMA_PS_TCP`).
        TCP = 0x0106 => "TCP",
        /// Unreliable datagrams, UDP-like (`RDMA_PS_UDP`): resolved with SIDR.
        UDP = 0x0111 => "UDP",
        /// Native InfiniBand addressing (`RDMA_PS_IB`).
        IB = 0x013f => "IB",
    }
);

/// The service IDs of RDMA-CM's port spaces: `0x0000_0000_01ss_pppp`-shaped, with the top 32
/// bits zero.
pub mod service_id {
    use super::PortSpace;

    /// The service ID of `port` in `space`.
    pub const fn of(space: PortSpace, port: u16) -> u64 {
        ((space.0 as u64) << 16) + port as u64
    }
    /// The port space and port of an RDMA-CM service ID, `None` if the ID is not one of the
    /// four port spaces' (IB CM services of other software).
    pub fn split(id: u64) -> Option<(PortSpace, u16)> {
        if id >> 32 != 0 {
            return None;
        }
        let space = PortSpace((id >> 16) as u16);
        space.name().map(|_| (space, id as u16))
    }
}

/// Bytes of the RDMA-CM private-data header.
pub const HEADER_LEN: usize = 36;
/// The header's version byte (major 0, minor 0).
pub const VERSION: u8 = 0x00;
/// Application private data left in a REQ after the header (92 − 36).
pub const REQ_USER_PRIVATE_LEN: usize = private_len::REQ - HEADER_LEN;
/// Application private data left in a SIDR_REQ after the header (216 − 36).
pub const SIDR_REQ_USER_PRIVATE_LEN: usize = private_len::SIDR_REQ - HEADER_LEN;

mod field {
    pub const VERSION: usize = 0;
    pub const IP_VERSION: usize = 1;
    pub const PORT: usize = 2;
    pub const SRC: usize = 4;
    pub const DST: usize = 20;
}

/// A zero-copy view of the RDMA-CM header at the start of a REQ's private data.
#[derive(Debug, Clone, Copy)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Wrap after checking that the 36 bytes are present.
    pub fn new_checked(buffer: T) -> Result<Self> {
        need(Layer::MadAttribute, buffer.as_ref(), HEADER_LEN)?;
        Ok(Header { buffer })
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// The version byte (major in the high nibble).
    pub fn version(&self) -> u8 {
        self.b()[field::VERSION]
    }
    /// The IP version nibble (4 or 6 when well formed).
    pub fn ip_version(&self) -> u8 {
        self.b()[field::IP_VERSION] >> 4
    }
    /// The low nibble after the IP version (reserved).
    pub fn reserved(&self) -> u8 {
        self.b()[field::IP_VERSION] & 0x0f
    }
    /// The active side's port.
    pub fn src_port(&self) -> u16 {
        u16::from_be_bytes([self.b()[field::PORT], self.b()[field::PORT + 1]])
    }
    /// The 16 source address bytes as they are.
    pub fn src_raw(&self) -> [u8; 16] {
        super::get_array(self.b(), field::SRC)
    }
    /// The 16 destination address bytes as they are.
    pub fn dst_raw(&self) -> [u8; 16] {
        super::get_array(self.b(), field::DST)
    }
}

/// The owned form of the RDMA-CM header: the addresses of the connection as the active side
/// sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeaderRepr {
    /// The active side's address and port.
    pub src_ip: IpAddr,
    /// The active side's port.
    pub src_port: u16,
    /// The address the active side connects to.
    pub dst_ip: IpAddr,
}

impl HeaderRepr {
    /// Parse the header at the start of `private_data`. Fails (with a length error naming
    /// the header) on a version other than 0, an IP version other than 4 or 6, and on IPv4
    /// addresses whose 12 leading bytes are not zero: what Linux's rdma_cm would refuse.
    pub fn parse(private_data: &[u8]) -> Result<Self> {
        let h = Header::new_checked(private_data)?;
        let bad = Error::BadLength {
            layer: Layer::MadAttribute,
            declared: HEADER_LEN,
            actual: private_data.len(),
        };
        if h.version() != VERSION {
            return Err(bad);
        }
        let (src_ip, dst_ip) = match h.ip_version() {
            4 => {
                let (s, d) = (h.src_raw(), h.dst_raw());
                if s[..12].iter().chain(&d[..12]).any(|&b| b != 0) {
                    return Err(bad);
                }
                (
                    IpAddr::V4(Ipv4Addr::new(s[12], s[13], s[14], s[15])),
                    IpAddr::V4(Ipv4Addr::new(d[12], d[13], d[14], d[15])),
                )
            }
            6 => (
                IpAddr::V6(Ipv6Addr::from(h.src_raw())),
                IpAddr::V6(Ipv6Addr::from(h.dst_raw())),
            ),
            _ => return Err(bad),
        };
        Ok(HeaderRepr {
            src_ip,
            src_port: h.src_port(),
            dst_ip,
        })
    }

    /// Bytes needed to emit.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the header into the start of `buf`. Both addresses must be of one family.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if buf.len() < HEADER_LEN {
            return Err(Error::BufferTooSmall {
                needed: HEADER_LEN,
                had: buf.len(),
            });
        }
        let b = &mut buf[..HEADER_LEN];
        b.fill(0);
        b[field::VERSION] = VERSION;
        b[field::PORT..field::PORT + 2].copy_from_slice(&self.src_port.to_be_bytes());
        match (self.src_ip, self.dst_ip) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                b[field::IP_VERSION] = 4 << 4;
                b[field::SRC + 12..field::SRC + 16].copy_from_slice(&s.octets());
                b[field::DST + 12..field::DST + 16].copy_from_slice(&d.octets());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                b[field::IP_VERSION] = 6 << 4;
                b[field::SRC..field::SRC + 16].copy_from_slice(&s.octets());
                b[field::DST..field::DST + 16].copy_from_slice(&d.octets());
            }
            _ => {
                return Err(Error::FieldOverflow(
                    "RDMA-CM header: mixed address families",
                ))
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids() {
        // rping's default port 7174 in the TCP port space, as seen in every rping REQ.
        assert_eq!(service_id::of(PortSpace::TCP, 7174), 0x0000_0000_0106_1c06);
        assert_eq!(service_id::of(PortSpace::UDP, 18515), 0x0000_0000_0111_4853);
        assert_eq!(service_id::of(PortSpace::IB, 1), 0x013f_0001);
        assert_eq!(service_id::of(PortSpace::IPOIB, 2), 0x0002_0002);
        assert_eq!(
            service_id::split(0x0000_0000_0106_1c06),
            Some((PortSpace::TCP, 7174))
        );
        assert_eq!(service_id::split(0x0000_0000_0107_1c06), None);
        assert_eq!(service_id::split(0x0000_0001_0106_1c06), None);
    }

    #[test]
    fn header_round_trips_and_rejects() {
        let h = HeaderRepr {
            src_ip: "10.77.0.12".parse().unwrap(),
            src_port: 0xb86e,
            dst_ip: "10.77.0.11".parse().unwrap(),
        };
        let mut b = [0xffu8; HEADER_LEN];
        h.emit(&mut b).unwrap();
        assert_eq!(&b[..4], &[0x00, 0x40, 0xb8, 0x6e]);
        assert_eq!(&b[16..20], &[10, 77, 0, 12]);
        assert_eq!(&b[32..36], &[10, 77, 0, 11]);
        assert_eq!(HeaderRepr::parse(&b).unwrap(), h);
        let mut v = b;
        v[0] = 0x10;
        assert!(HeaderRepr::parse(&v).is_err());
        let mut v = b;
        v[1] = 0x50;
        assert!(HeaderRepr::parse(&v).is_err());
        let mut v = b;
        v[5] = 1;
        assert!(HeaderRepr::parse(&v).is_err());
        assert!(HeaderRepr::parse(&b[..35]).is_err());
        let mixed = HeaderRepr {
            dst_ip: "fd77::11".parse().unwrap(),
            ..h
        };
        assert!(mixed.emit(&mut b).is_err());
        let v6 = HeaderRepr {
            src_ip: "fd77::12".parse().unwrap(),
            src_port: 1,
            dst_ip: "fd77::11".parse().unwrap(),
        };
        v6.emit(&mut b).unwrap();
        assert_eq!(b[1], 0x60);
        assert_eq!(HeaderRepr::parse(&b).unwrap(), v6);
    }
}
