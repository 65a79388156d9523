//! Ethernet II with an optional 802.1Q tag.

use super::{need, need_room, rd16, wr16, Layer, Result};
use core::fmt;

/// Ethertype of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// Ethertype of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// Ethertype of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// Ethertype of an 802.1Q tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// Ethernet header without a tag.
pub const HEADER_LEN: usize = 14;
/// Length of an 802.1Q tag.
pub const VLAN_LEN: usize = 4;

/// A 48-bit MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    /// 00:00:00:00:00:00 (unknown; the UDP backend lets the kernel fill it in).
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// The Ethernet address frames to IP multicast group `ip` go to: IPv4 01:00:5e and the
    /// group's low 23 bits (RFC 1112 6.4), IPv6 33:33 and its low 32 bits (RFC 2464 7). `None`
    /// for an address that is not multicast (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn for_ip_multicast(ip: core::net::IpAddr) -> Option<MacAddr> {
        match ip.to_canonical() {
            core::net::IpAddr::V4(a) if a.is_multicast() => {
                let o = a.octets();
                Some(MacAddr([0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]))
            }
            core::net::IpAddr::V6(a) if a.is_multicast() => {
                let o = a.octets();
                Some(MacAddr([0x33, 0x33, o[12], o[13], o[14], o[15]]))
            }
            _ => None,
        }
    }

    /// The modified EUI-64 interface identifier of this MAC (RFC 4291 appendix A: the
    /// universal/local bit flipped, ff:fe in the middle): Linux's node GUID of a RoCE device
    /// and the low half of its link-local address.
    pub const fn eui64(self) -> [u8; 8] {
        let m = self.0;
        [m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]]
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl core::str::FromStr for MacAddr {
    type Err = &'static str;
    fn from_str(s: &str) -> core::result::Result<Self, Self::Err> {
        let mut m = [0u8; 6];
        let mut parts = s.split(':');
        for b in &mut m {
            let p = parts.next().ok_or("MAC address needs six octets")?;
            if p.is_empty() || p.len() > 2 {
                return Err("bad MAC address octet");
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| "bad MAC address octet")?;
        }
        if parts.next().is_some() {
            return Err("MAC address has more than six octets");
        }
        Ok(MacAddr(m))
    }
}

/// An 802.1Q tag control field.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct VlanTag {
    /// Priority code point (802.1p), 3 bits.
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier, 12 bits.
    pub vid: u16,
}

/// The owned form of an Ethernet header.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct EthernetRepr {
    /// Destination MAC address.
    pub dst: MacAddr,
    /// Source MAC address.
    pub src: MacAddr,
    /// The 802.1Q tag, if any.
    pub vlan: Option<VlanTag>,
    /// The ethertype of the payload (after the tag, if any).
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Parse; returns the header and its length (14 or 18).
    pub fn parse(buf: &[u8]) -> Result<(Self, usize)> {
        need(Layer::Ethernet, buf, HEADER_LEN)?;
        let mut dst = [0u8; 6];
        let mut src = [0u8; 6];
        dst.copy_from_slice(&buf[0..6]);
        src.copy_from_slice(&buf[6..12]);
        let et = rd16(buf, 12);
        if et == ETHERTYPE_VLAN {
            need(Layer::Vlan, buf, HEADER_LEN + VLAN_LEN)?;
            let tci = rd16(buf, 14);
            let vlan = VlanTag {
                pcp: (tci >> 13) as u8,
                dei: tci & 0x1000 != 0,
                vid: tci & 0x0fff,
            };
            let ethertype = rd16(buf, 16);
            Ok((
                EthernetRepr {
                    dst: MacAddr(dst),
                    src: MacAddr(src),
                    vlan: Some(vlan),
                    ethertype,
                },
                18,
            ))
        } else {
            Ok((
                EthernetRepr {
                    dst: MacAddr(dst),
                    src: MacAddr(src),
                    vlan: None,
                    ethertype: et,
                },
                14,
            ))
        }
    }

    /// Bytes on the wire: 14, or 18 with a VLAN tag.
    pub const fn buffer_len(&self) -> usize {
        if self.vlan.is_some() {
            HEADER_LEN + VLAN_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Write the header to the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let n = self.buffer_len();
        need_room(buf, n)?;
        buf[0..6].copy_from_slice(&self.dst.0);
        buf[6..12].copy_from_slice(&self.src.0);
        match self.vlan {
            Some(v) => {
                wr16(buf, 12, ETHERTYPE_VLAN);
                let tci =
                    (u16::from(v.pcp & 7) << 13) | (u16::from(v.dei) << 12) | (v.vid & 0x0fff);
                wr16(buf, 14, tci);
                wr16(buf, 16, self.ethertype);
            }
            None => wr16(buf, 12, self.ethertype),
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eui64_of_a_mac() {
        // rxe's node GUID for 52:54:00:77:00:1f in the tools/rxe-peer guest:
        // `node_guid: 5054:00ff:fe77:001f`, link-local fe80::5054:ff:fe77:1f.
        let m = MacAddr([0x52, 0x54, 0x00, 0x77, 0x00, 0x1f]);
        assert_eq!(m.eui64(), [0x50, 0x54, 0x00, 0xff, 0xfe, 0x77, 0x00, 0x1f]);
    }

    #[test]
    fn ip_multicast_macs() {
        let m = |s: &str| MacAddr::for_ip_multicast(s.parse().unwrap()).map(|m| m.to_string());
        assert_eq!(m("239.255.129.7").as_deref(), Some("01:00:5e:7f:81:07"));
        assert_eq!(m("224.0.0.251").as_deref(), Some("01:00:5e:00:00:fb"));
        assert_eq!(m("::ffff:239.1.2.3").as_deref(), Some("01:00:5e:01:02:03"));
        assert_eq!(m("ff12::1:ff00:42").as_deref(), Some("33:33:ff:00:00:42"));
        assert_eq!(m("10.0.0.1"), None);
        assert_eq!(m("fd00::1"), None);
    }

    #[test]
    fn vlan_round_trip() {
        let r = EthernetRepr {
            dst: MacAddr([1, 2, 3, 4, 5, 6]),
            src: MacAddr([7, 8, 9, 10, 11, 12]),
            vlan: Some(VlanTag {
                pcp: 6,
                dei: true,
                vid: 0xabc,
            }),
            ethertype: ETHERTYPE_IPV6,
        };
        let mut b = [0u8; 18];
        assert_eq!(r.emit(&mut b).unwrap(), 18);
        assert_eq!(&b[12..18], &[0x81, 0x00, 0xda, 0xbc, 0x86, 0xdd]);
        assert_eq!(EthernetRepr::parse(&b).unwrap(), (r, 18));
        assert!(EthernetRepr::parse(&b[..17]).is_err());
    }

    #[test]
    fn mac_parse() {
        assert_eq!("e4:1d:2d:ab:2b:c2".parse::<MacAddr>().unwrap().0[5], 0xc2);
        assert!("e4:1d:2d:ab:2b".parse::<MacAddr>().is_err());
        assert!("e4:1d:2d:ab:2b:c2:00".parse::<MacAddr>().is_err());
        assert!("zz:1d:2d:ab:2b:c2".parse::<MacAddr>().is_err());
    }
}
