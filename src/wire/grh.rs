//! The 40-byte GRH slot at the start of every UD receive buffer.
//!
//! On InfiniBand a UD receive buffer starts with the packet's Global Route Header (40 bytes,
//! IBTA Vol. 1 §8.3). RoCE v2 has no GRH on the wire: the IP header takes its place, and verbs
//! providers put that header in the slot instead, as Linux rxe does: the IPv6 header fills
//! the 40 bytes (its layout is the GRH's), an IPv4 header (20 bytes, without options) sits in
//! the *last* 20 bytes after 20 zero bytes. rdma-core tells the two apart as
//! `get_grh_header_version()` does — the version nibble of byte 0, and for a 6 there, whether
//! bytes 20..40 are an IPv4 header with a correct checksum — and [`GrhSlot::parse`] reads a
//! slot the same way (what `ibv_init_ah_from_wc` needs to answer the sender).

use super::ip::{internet_checksum, IPV4_HEADER_LEN, IPV6_HEADER_LEN, PROTO_UDP};
use super::{Error, Layer, Result};
use std::net::{Ipv4Addr, Ipv6Addr};

/// Bytes of the slot.
pub const GRH_LEN: usize = 40;

/// Where an IPv4 header sits in the slot.
pub const IPV4_OFFSET: usize = GRH_LEN - IPV4_HEADER_LEN;

/// The slot for a packet whose IP header starts `ip` (the received bytes, from the version
/// byte on; anything after the header is ignored).
///
/// IPv4: 20 zero bytes, then the first 20 bytes of the header as received. A header whose
/// checksum does not verify (one a socket backend synthesised without it) gets its checksum
/// filled in, so that the slot reads as IPv4 (a received header always verifies: the kernel
/// drops others). IPv6: the 40-byte header.
pub fn slot_from_ip_header(ip: &[u8]) -> Result<[u8; GRH_LEN]> {
    let mut slot = [0u8; GRH_LEN];
    match ip.first().map(|b| b >> 4) {
        Some(4) => {
            let h = ip.get(..IPV4_HEADER_LEN).ok_or(Error::Truncated {
                layer: Layer::Ipv4,
                needed: IPV4_HEADER_LEN,
                had: ip.len(),
            })?;
            let v4 = &mut slot[IPV4_OFFSET..];
            v4.copy_from_slice(h);
            if internet_checksum(v4) != 0 {
                v4[10..12].fill(0);
                let c = internet_checksum(v4);
                v4[10..12].copy_from_slice(&c.to_be_bytes());
            }
            Ok(slot)
        }
        Some(6) => {
            let h = ip.get(..IPV6_HEADER_LEN).ok_or(Error::Truncated {
                layer: Layer::Ipv6,
                needed: IPV6_HEADER_LEN,
                had: ip.len(),
            })?;
            slot.copy_from_slice(h);
            Ok(slot)
        }
        Some(v) => Err(Error::BadIpVersion(v)),
        None => Err(Error::Truncated {
            layer: Layer::Ipv4,
            needed: IPV4_HEADER_LEN,
            had: 0,
        }),
    }
}

/// What a GRH slot says, read as rdma-core reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GrhSlot {
    /// An IPv4 header in bytes 20..40.
    V4 {
        /// The sender's address.
        src: Ipv4Addr,
        /// The address the packet was sent to (one of ours).
        dst: Ipv4Addr,
        /// The TOS byte (DSCP and ECN).
        tos: u8,
        /// The TTL as received.
        ttl: u8,
    },
    /// An IPv6 header (a GRH).
    V6 {
        /// The sender's address (the GRH SGID).
        src: Ipv6Addr,
        /// The address the packet was sent to (the GRH DGID).
        dst: Ipv6Addr,
        /// Traffic class.
        tclass: u8,
        /// Flow label, 20 bits.
        flow_label: u32,
        /// Hop limit as received.
        hop_limit: u8,
        /// Next header: 17 (UDP) for RoCE v2, 0x1b for RoCE v1 / InfiniBand.
        next_header: u8,
    },
}

impl GrhSlot {
    /// Read a slot (its first 40 bytes): IPv6 if byte 0's version nibble is 6 and bytes 20..40
    /// are not an IPv4 header with a valid checksum; IPv4 if the version nibble at byte 20 is
    /// 4 (and, for a 6 at byte 0, the IHL is 5 and the checksum verifies); anything else is
    /// not a RoCE v2 slot.
    pub fn parse(slot: &[u8]) -> Result<GrhSlot> {
        let s = slot.get(..GRH_LEN).ok_or(Error::Truncated {
            layer: Layer::Ipv6,
            needed: GRH_LEN,
            had: slot.len(),
        })?;
        let v4 = &s[IPV4_OFFSET..];
        let as_v4 = || GrhSlot::V4 {
            src: Ipv4Addr::new(v4[12], v4[13], v4[14], v4[15]),
            dst: Ipv4Addr::new(v4[16], v4[17], v4[18], v4[19]),
            tos: v4[1],
            ttl: v4[8],
        };
        if s[0] >> 4 != 6 {
            return if v4[0] >> 4 == 4 {
                Ok(as_v4())
            } else {
                Err(Error::BadIpVersion(s[0] >> 4))
            };
        }
        if v4[0] & 0x0f == 5 && internet_checksum(v4) == 0 {
            return Ok(as_v4());
        }
        let w0 = u32::from_be_bytes([s[0], s[1], s[2], s[3]]);
        let mut src = [0u8; 16];
        let mut dst = [0u8; 16];
        src.copy_from_slice(&s[8..24]);
        dst.copy_from_slice(&s[24..40]);
        Ok(GrhSlot::V6 {
            src: Ipv6Addr::from(src),
            dst: Ipv6Addr::from(dst),
            tclass: (w0 >> 20) as u8,
            flow_label: w0 & 0xf_ffff,
            hop_limit: s[7],
            next_header: s[6],
        })
    }

    /// Whether the slot is that of a RoCE v2 packet (IPv4, or IPv6 with next header UDP).
    pub fn is_roce_v2(&self) -> bool {
        match self {
            GrhSlot::V4 { .. } => true,
            GrhSlot::V6 { next_header, .. } => *next_header == PROTO_UDP,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4 header as Linux rxe sent it (NOTES.md: DSCP 0, DF, TTL 64, protocol UDP),
    /// written out by hand: 10.77.0.12 -> 10.77.0.11, total length 1084, ID 0x1234.
    fn rxe_v4_header() -> [u8; 20] {
        let mut h = [
            0x45, 0x00, 0x04, 0x3c, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 10, 77, 0, 12,
            10, 77, 0, 11,
        ];
        let c = internet_checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h
    }

    #[test]
    fn ipv4_sits_in_the_last_20_bytes_after_zeros() {
        let h = rxe_v4_header();
        let slot = slot_from_ip_header(&h).unwrap();
        assert_eq!(slot[..20], [0u8; 20]);
        assert_eq!(slot[20..], h);
        assert_eq!(
            GrhSlot::parse(&slot).unwrap(),
            GrhSlot::V4 {
                src: Ipv4Addr::new(10, 77, 0, 12),
                dst: Ipv4Addr::new(10, 77, 0, 11),
                tos: 0,
                ttl: 64
            }
        );
    }

    #[test]
    fn a_header_without_its_checksum_gets_one() {
        let mut h = rxe_v4_header();
        let want = h;
        h[10..12].fill(0);
        let slot = slot_from_ip_header(&h).unwrap();
        assert_eq!(slot[20..], want);
    }

    #[test]
    fn ipv6_fills_the_slot() {
        let mut h = [0u8; 40];
        // version 6, traffic class 0x28, flow label 0x12345; payload length; UDP; hop 64.
        h[..4].copy_from_slice(&((6u32 << 28) | (0x28 << 20) | 0x12345).to_be_bytes());
        h[4..6].copy_from_slice(&100u16.to_be_bytes());
        h[6] = 17;
        h[7] = 64;
        h[8..24].copy_from_slice(&"fd77::12".parse::<Ipv6Addr>().unwrap().octets());
        h[24..40].copy_from_slice(&"fd77::2".parse::<Ipv6Addr>().unwrap().octets());
        let slot = slot_from_ip_header(&h).unwrap();
        assert_eq!(slot, h);
        let p = GrhSlot::parse(&slot).unwrap();
        assert_eq!(
            p,
            GrhSlot::V6 {
                src: "fd77::12".parse().unwrap(),
                dst: "fd77::2".parse().unwrap(),
                tclass: 0x28,
                flow_label: 0x12345,
                hop_limit: 64,
                next_header: 17
            }
        );
        assert!(p.is_roce_v2());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(slot_from_ip_header(&[]).is_err());
        assert!(slot_from_ip_header(&[0x45; 10]).is_err());
        assert!(slot_from_ip_header(&[0x60; 39]).is_err());
        assert!(slot_from_ip_header(&[0x15; 60]).is_err());
        assert!(GrhSlot::parse(&[0u8; 39]).is_err());
        // Neither version: rdma-core's EPROTONOSUPPORT.
        assert!(GrhSlot::parse(&[0u8; 40]).is_err());
        for b in 0..=255u8 {
            let _ = GrhSlot::parse(&[b; 40]);
        }
    }
}
