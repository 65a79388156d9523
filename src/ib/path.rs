//! The resolved path of a connected QP: everything the outer (Ethernet, IP, UDP) headers of
//! its packets need, computed once when the address vector is set.

use super::attr::AddressVector;
use crate::wire::{Ecn, MacAddr};
use std::net::{IpAddr, Ipv6Addr};

/// Why an address vector does not give a path (`ibv_modify_qp` to RTR, `ibv_create_ah`:
/// EINVAL).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AvError {
    /// The source GID index is not in the device's GID table.
    #[error("sgid_index {0} not in the GID table")]
    NoSuchGid(u8),
    /// The source and destination GIDs are of different IP versions.
    #[error("source and destination GIDs of different IP versions")]
    MixedIpVersions,
    /// No destination MAC: neither given nor learned from the destination's frames.
    #[error("destination MAC not resolved")]
    NoDestinationMac,
    /// A flow label wider than its 20 bits.
    #[error("flow label {0:#x} wider than 20 bits")]
    FlowLabelTooWide(u32),
}

/// The resolved path of a connected QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Path {
    pub src_mac: MacAddr,
    pub dst_mac: MacAddr,
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
    pub udp_sport: u16,
    pub dscp: u8,
    pub ecn: Ecn,
    pub hop_limit: u8,
    pub flow_label: u32,
}

impl Path {
    /// Resolve address vector `av` of local QP `lqpn` towards remote QP `dqpn` on a port with
    /// MAC `mac` and GID table `gids`. Errors name what is wrong with the address vector.
    pub(crate) fn resolve(
        av: &AddressVector,
        gids: &[IpAddr],
        mac: MacAddr,
        lqpn: u32,
        dqpn: u32,
    ) -> Result<Path, AvError> {
        let src_ip = *gids
            .get(usize::from(av.sgid_index))
            .ok_or(AvError::NoSuchGid(av.sgid_index))?;
        let dst_ip = ip_of_gid(av.dgid);
        if src_ip.is_ipv4() != dst_ip.is_ipv4() {
            return Err(AvError::MixedIpVersions);
        }
        let dmac = av.dmac.ok_or(AvError::NoDestinationMac)?;
        Ok(Path {
            src_mac: mac,
            dst_mac: MacAddr(dmac),
            src_ip,
            dst_ip,
            udp_sport: rxe_udp_sport(av.flow_label, lqpn, dqpn),
            dscp: av.traffic_class >> 2,
            ecn: Ecn::from_bits(av.traffic_class),
            hop_limit: if av.hop_limit <= 1 { 64 } else { av.hop_limit },
            flow_label: av.flow_label,
        })
    }
}

/// The GID of an IP address (IPv4-mapped for IPv4, as Linux numbers RoCE v2 GIDs).
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The IP address of a GID (an IPv4-mapped GID gives the IPv4 address).
pub fn ip_of_gid(gid: [u8; 16]) -> IpAddr {
    let a = Ipv6Addr::from(gid);
    match a.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(a),
    }
}

/// The UDP source port Linux rxe uses for a connected QP (flow label 0 → hash of the QPNs).
pub(crate) fn rxe_udp_sport(flow_label: u32, lqpn: u32, rqpn: u32) -> u16 {
    let fl = if flow_label != 0 {
        flow_label & 0xfffff
    } else {
        let v = u64::from(lqpn) * u64::from(rqpn);
        ((v ^ (v >> 20) ^ (v >> 40)) & 0xfffff) as u32
    };
    (0xc000 | ((fl & 0x3fff) ^ (fl >> 14))) as u16
}

/// The UDP source port Linux rxe gives a UD QP (and QP1): a 14-bit multiplicative hash of the
/// QPN (`hash_32(qpn, 14)`, the golden-ratio multiplier 0x61C88647) above 0xC000, whatever
/// the destination. Known answers from rxe captures: QP1 sends from 55410 (every CM MAD of
/// `captures/rxe-reference`), QP 0x11 from 57236 (shared/rxe-vm/NOTES.md).
pub(crate) fn rxe_ud_udp_sport(qpn: u32) -> u16 {
    0xc000 + (qpn.wrapping_mul(0x61c8_8647) >> 18) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rxe_source_ports() {
        // shared/rxe-vm/NOTES.md: RC 0x11<->0x11 49441, 0x11->0xaa 52042; UD 0x11 57236;
        // QP1 55410 in every capture of CM MADs.
        assert_eq!(rxe_udp_sport(0, 0x11, 0x11), 49441);
        assert_eq!(rxe_udp_sport(0, 0x11, 0xaa), 52042);
        assert_eq!(rxe_ud_udp_sport(0x11), 57236);
        assert_eq!(rxe_ud_udp_sport(1), 55410);
    }

    #[test]
    fn an_address_vector_without_a_path_says_why() {
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let v6: IpAddr = "fd00::1".parse().unwrap();
        let mac = MacAddr([2, 0, 0, 0, 0, 1]);
        let av = AddressVector {
            dgid: gid_of("10.0.0.2".parse().unwrap()),
            sgid_index: 0,
            dmac: Some([2, 0, 0, 0, 0, 2]),
            ..AddressVector::default()
        };
        assert!(Path::resolve(&av, &[v4], mac, 1, 2).is_ok());
        let bad = AddressVector {
            sgid_index: 1,
            ..av
        };
        assert_eq!(
            Path::resolve(&bad, &[v4], mac, 1, 2),
            Err(AvError::NoSuchGid(1))
        );
        assert_eq!(
            Path::resolve(&av, &[v6], mac, 1, 2),
            Err(AvError::MixedIpVersions)
        );
        let bad = AddressVector { dmac: None, ..av };
        assert_eq!(
            Path::resolve(&bad, &[v4], mac, 1, 2),
            Err(AvError::NoDestinationMac)
        );
        assert_eq!(
            AvError::NoSuchGid(3).to_string(),
            "sgid_index 3 not in the GID table"
        );
    }
}
