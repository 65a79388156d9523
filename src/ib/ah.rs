//! Address handles (`ibv_create_ah`, `ibv_create_ah_from_wc`, `ibv_destroy_ah`): where a UD
//! send goes. An address handle is an address vector resolved once into the outer headers of
//! the packets sent along it (MACs, IP addresses, traffic class, hop limit); the UDP source
//! port is the sending QP's (see `ib::path::rxe_ud_udp_sport`).
//!
//! [`ah_attr_from_wc`] is `ibv_init_ah_from_wc`: the address vector that answers a received
//! UD message, read from the work completion and the GRH slot of its receive buffer the way
//! rdma-core reads them (see [`crate::wire::grh`]).

use super::attr::AddressVector;
use super::mr::Pd;
use super::path::{gid_of, Path};
use super::wc::{WcFlags, WorkCompletion};
use crate::wire::grh::GrhSlot;
use std::net::IpAddr;

/// An address handle.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Ah(pub(crate) u32);

impl Ah {
    /// The handle's number on its device.
    pub fn index(self) -> u32 {
        self.0
    }
}

/// An address handle as the device keeps it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AhEntry {
    /// Its protection domain: only QPs of the same PD may send along it.
    pub pd: Pd,
    /// The address vector it was created from (`dmac` resolved).
    pub av: AddressVector,
    /// The outer headers, resolved (the UDP source port is set per sending QP).
    pub path: Path,
}

/// Why [`ah_attr_from_wc`] cannot make an address vector (what makes
/// `ibv_init_ah_from_wc` fail).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AhFromWcError {
    /// The completion has no GRH (`IBV_WC_GRH` not set): on RoCE every UD receive has one.
    #[error("the work completion carries no GRH")]
    NoGrh,
    /// The GRH slot is neither an IPv4 nor an IPv6 header (EPROTONOSUPPORT).
    #[error("the GRH slot holds neither an IPv4 nor an IPv6 header")]
    BadGrh,
    /// The GRH names a RoCE v1 / InfiniBand packet, which ferroce does not send.
    #[error("the GRH is not that of a RoCE v2 packet")]
    NotRoceV2,
    /// The packet was sent to a multicast address.
    #[error("the packet was sent to a multicast address")]
    Multicast,
    /// The packet was sent to an address that is not in the GID table.
    #[error("the packet's destination {0} is not in the GID table")]
    UnknownGid(IpAddr),
}

/// `ibv_init_ah_from_wc`: the address vector to answer the sender of the UD message that
/// completed as `wc`, whose receive buffer started with `grh` (its 40-byte slot), on a port
/// with GID table `gids`. As rdma-core: the destination GID is the packet's source, the source
/// GID index that of the address it was sent to, hop limit and traffic class as received
/// (IPv4: TTL and TOS), the flow label from the slot's first word (0 for IPv4). The
/// destination MAC is left to the device (`dmac: None`).
pub fn ah_attr_from_wc(
    wc: &WorkCompletion,
    grh: &[u8],
    gids: &[IpAddr],
) -> Result<AddressVector, AhFromWcError> {
    if !wc.wc_flags.contains(WcFlags::GRH) {
        return Err(AhFromWcError::NoGrh);
    }
    let slot = GrhSlot::parse(grh).map_err(|_| AhFromWcError::BadGrh)?;
    let flow_label = grh.get(..4).map_or(0, |w| {
        u32::from_be_bytes([w[0], w[1], w[2], w[3]]) & 0xf_ffff
    });
    let (src, dst, hop_limit, traffic_class): (IpAddr, IpAddr, u8, u8) = match slot {
        GrhSlot::V4 { src, dst, tos, ttl } => {
            if dst.is_multicast() {
                return Err(AhFromWcError::Multicast);
            }
            (src.into(), dst.into(), ttl, tos)
        }
        GrhSlot::V6 {
            src,
            dst,
            tclass,
            hop_limit,
            ..
        } => {
            if !slot.is_roce_v2() {
                return Err(AhFromWcError::NotRoceV2);
            }
            if dst.octets()[0] == 0xff {
                return Err(AhFromWcError::Multicast);
            }
            // An IPv4-mapped address in an IPv6 header is still that IPv4 address's GID.
            let norm = |a: std::net::Ipv6Addr| IpAddr::V6(a).to_canonical();
            (norm(src), norm(dst), hop_limit, tclass)
        }
    };
    let sgid_index = gids
        .iter()
        .position(|g| gid_of(*g) == gid_of(dst))
        .and_then(|i| u8::try_from(i).ok())
        .ok_or(AhFromWcError::UnknownGid(dst))?;
    Ok(AddressVector {
        dgid: gid_of(src),
        sgid_index,
        hop_limit,
        traffic_class,
        flow_label,
        dmac: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::grh::slot_from_ip_header;
    use crate::wire::ip::internet_checksum;
    use crate::wire::QpNumber;

    fn wc(flags: WcFlags) -> WorkCompletion {
        WorkCompletion {
            wr_id: 1,
            status: super::super::wc::WcStatus::Success,
            opcode: super::super::wc::WcOpcode::Recv,
            byte_len: 40 + 8,
            imm_data: None,
            invalidated_rkey: None,
            qp_num: QpNumber::new(0x12),
            src_qp: QpNumber::new(0x11),
            wc_flags: flags,
            solicited: false,
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        }
    }

    #[test]
    fn answers_an_ipv4_sender_as_rdma_core_does() {
        let mut h = [
            0x45, 0x02, 0x00, 0x3c, 0x00, 0x07, 0x40, 0x00, 0x40, 0x11, 0, 0, 10, 77, 0, 12, 10,
            77, 0, 2,
        ];
        let c = internet_checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        let slot = slot_from_ip_header(&h).unwrap();
        let gids: Vec<IpAddr> = vec![
            "fe80::1".parse().unwrap(),
            "10.77.0.2".parse().unwrap(),
            "fd77::2".parse().unwrap(),
        ];
        let av = ah_attr_from_wc(&wc(WcFlags::GRH), &slot, &gids).unwrap();
        assert_eq!(av.dgid, gid_of("10.77.0.12".parse().unwrap()));
        assert_eq!(av.sgid_index, 1);
        assert_eq!((av.hop_limit, av.traffic_class, av.flow_label), (64, 2, 0));
        assert_eq!(av.dmac, None);
        // Without the GRH flag, or to an address we do not have: refused.
        assert_eq!(
            ah_attr_from_wc(&wc(WcFlags::empty()), &slot, &gids),
            Err(AhFromWcError::NoGrh)
        );
        assert_eq!(
            ah_attr_from_wc(&wc(WcFlags::GRH), &slot, &gids[..1]),
            Err(AhFromWcError::UnknownGid("10.77.0.2".parse().unwrap()))
        );
        assert_eq!(
            ah_attr_from_wc(&wc(WcFlags::GRH), &[0u8; 40], &gids),
            Err(AhFromWcError::BadGrh)
        );
    }

    #[test]
    fn answers_an_ipv6_sender() {
        let mut h = [0u8; 40];
        h[..4].copy_from_slice(&((6u32 << 28) | (0x10 << 20) | 0xabcde).to_be_bytes());
        h[6] = 17;
        h[7] = 3;
        h[8..24].copy_from_slice(&"fd77::12".parse::<std::net::Ipv6Addr>().unwrap().octets());
        h[24..40].copy_from_slice(&"fd77::2".parse::<std::net::Ipv6Addr>().unwrap().octets());
        let gids: Vec<IpAddr> = vec!["10.77.0.2".parse().unwrap(), "fd77::2".parse().unwrap()];
        let av = ah_attr_from_wc(&wc(WcFlags::GRH), &h, &gids).unwrap();
        assert_eq!(av.dgid, gid_of("fd77::12".parse().unwrap()));
        assert_eq!(
            (av.sgid_index, av.hop_limit, av.traffic_class, av.flow_label),
            (1, 3, 0x10, 0xabcde)
        );
        h[6] = 0x1b;
        assert_eq!(
            ah_attr_from_wc(&wc(WcFlags::GRH), &h, &gids),
            Err(AhFromWcError::NotRoceV2)
        );
    }
}
