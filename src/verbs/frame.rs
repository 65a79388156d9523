//! Framing: the outer headers (Ethernet, IPv4 or IPv6, UDP) of a QP's packet, from the QP's
//! resolved path and the kind of packet. The QP decides what to send (its transport part);
//! this module decides how it travels, as smoltcp's interface frames what a socket sends.

use crate::ib::path::Path;
use crate::ib::tx::TxKind;
use crate::ib::WcStatus;
use crate::wire::{
    self, eth, ip, udp, EthernetRepr, IpRepr, Ipv4Repr, Ipv6Repr, RoceRepr, UdpRepr, ROCE_V2_PORT,
};
use std::net::{IpAddr, Ipv6Addr};

/// Extension headers of the largest size any RC packet carries (AtomicETH, 28 bytes; a
/// WRITE's RETH and ImmDt are 20).
const MAX_EXT_LEN: usize = 28;

/// Why a frame could not be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameError {
    /// The payload could not be read (the memory behind a request is gone).
    Payload(WcStatus),
    /// The wire layer refused the headers (an internal error: the QP built them).
    Wire(wire::Error),
}

/// Writes frames for the QPs of one device.
#[derive(Debug)]
pub(crate) struct Framer {
    /// The IPv4 identification of the last frame.
    ip_id: u16,
    /// Compute the UDP checksum of IPv6 frames.
    ipv6_udp_checksum: bool,
    /// Data packets are ECN-capable (ECT(0)): congestion control is on.
    ect_data: bool,
}

impl Framer {
    pub(crate) fn new(ipv6_udp_checksum: bool, ect_data: bool) -> Framer {
        Framer {
            ip_id: 0,
            ipv6_udp_checksum,
            ect_data,
        }
    }

    /// The most bytes a frame with an IPv6 (or IPv4) header and at most `mtu` bytes of payload
    /// can take.
    pub(crate) fn max_frame_len_for(ipv6: bool, mtu: u32) -> usize {
        let ip = if ipv6 {
            ip::IPV6_HEADER_LEN
        } else {
            ip::IPV4_HEADER_LEN
        };
        eth::HEADER_LEN
            + ip
            + udp::HEADER_LEN
            + wire::bth::HEADER_LEN
            + MAX_EXT_LEN
            + mtu as usize
            + wire::icrc::LEN
    }

    /// Write the frame of the transport part `roce` (of `kind`) along `path` into `buf`;
    /// `payload` fills the payload bytes. Returns the frame's length.
    ///
    /// The marking: CNPs as a ConnectX sends them (roce-facts.md: DSCP 48, ECT(0), UDP source
    /// port 0); data ECN-capable when congestion control is on; everything else with the
    /// path's traffic class.
    pub(crate) fn emit(
        &mut self,
        buf: &mut [u8],
        path: &Path,
        kind: TxKind,
        roce: &RoceRepr,
        payload: impl FnOnce(&mut [u8]) -> Result<(), WcStatus>,
    ) -> Result<usize, FrameError> {
        let (dscp, ecn, sport) = match kind {
            TxKind::Cnp => (48, wire::Ecn::Ect0, 0),
            TxKind::Data if self.ect_data => (path.dscp, wire::Ecn::Ect0, path.udp_sport),
            _ => (path.dscp, path.ecn, path.udp_sport),
        };
        let ip = match (path.src_ip, path.dst_ip) {
            (IpAddr::V4(s), IpAddr::V4(t)) => {
                self.ip_id = self.ip_id.wrapping_add(1);
                IpRepr::V4(Ipv4Repr {
                    src: s,
                    dst: t,
                    dscp,
                    ecn,
                    ident: self.ip_id,
                    dont_frag: true,
                    ttl: path.hop_limit,
                })
            }
            (s, t) => IpRepr::V6(Ipv6Repr {
                src: v6(s),
                dst: v6(t),
                dscp,
                ecn,
                flow_label: path.flow_label,
                hop_limit: path.hop_limit,
            }),
        };
        let eth = EthernetRepr {
            dst: path.dst_mac,
            src: path.src_mac,
            vlan: None,
            ethertype: 0,
        };
        let udp = UdpRepr {
            src_port: sport,
            dst_port: ROCE_V2_PORT,
            checksum: 0,
        };
        let mut failed = None;
        // The parts by reference: the transport part is not moved into a `FrameRepr`.
        let n = wire::packet::emit_frame_with(buf, Some(eth), &ip, &udp, roce, |dst| {
            payload(dst).map_err(|status| {
                failed = Some(status);
                wire::Error::FieldOverflow("payload")
            })
        })
        .map_err(|e| match failed {
            Some(status) => FrameError::Payload(status),
            None => FrameError::Wire(e),
        })?;
        if let IpRepr::V6(_) = ip {
            if self.ipv6_udp_checksum {
                let at = eth::HEADER_LEN + ip::IPV6_HEADER_LEN;
                wire::udp::fill_checksum(path.src_ip, path.dst_ip, &mut buf[at..n]);
            }
        }
        Ok(n)
    }
}

fn v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(v) => v.to_ipv6_mapped(),
        IpAddr::V6(v) => v,
    }
}
