//! Splitting a UDP segmentation-offload super-frame back into the datagrams it stands for.
//!
//! A UDP socket with `UDP_SEGMENT` (ferroce's UDP backend, QUIC stacks…) hands the kernel one
//! super-datagram of equal-sized segments. Where it leaves the machine, the kernel (or the
//! NIC) cuts it into datagrams; but on a host-internal path (veth, a bridge) it travels whole,
//! and a packet socket on the receiving interface sees one Ethernet frame holding all the
//! segments behind one set of headers. With `PACKET_VNET_HDR` the kernel says so
//! (`gso_type` UDP_L4, `gso_size`), and [`split`] produces exactly the frames the kernel's
//! own segmentation (`__udp_gso_segment` + `inet_gso_segment`) would have put on the wire:
//! the same Ethernet, IP and UDP headers with the segment's lengths, IPv4 identification
//! `id + i` for segment `i`, a fresh IPv4 header checksum; UDP checksum 0 (the super-frame
//! carries only a partial one; the RoCE ICRC masks the field). Nothing is trusted: a frame
//! that does not parse as Ethernet / IPv4 or IPv6 / UDP is an error, never a panic.

use crate::wire::eth::{self, EthernetRepr};
use crate::wire::ip::{internet_checksum, PROTO_UDP};

const UDP: usize = 8;

/// Why a super-frame cannot be split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitError {
    /// Not Ethernet + IPv4 (without fragmentation) or IPv6 (without extension headers) + UDP,
    /// or cut short.
    NotUdp,
    /// A segment size of 0.
    NoSegmentSize,
}

/// A super-frame and where its segments are.
#[derive(Clone, Copy, Debug)]
pub struct Split<'a> {
    frame: &'a [u8],
    /// Offset of the IP header, of the UDP header, of the first segment.
    ip: usize,
    udp: usize,
    payload: usize,
    v6: bool,
    seg: usize,
    count: usize,
    base_id: u16,
}

/// Locate the segments of `frame` (an Ethernet frame, a VLAN tag in it allowed) cut every
/// `gso_size` payload bytes.
pub fn split(frame: &[u8], gso_size: u16) -> Result<Split<'_>, SplitError> {
    if gso_size == 0 {
        return Err(SplitError::NoSegmentSize);
    }
    let (e, ip) = EthernetRepr::parse(frame).map_err(|_| SplitError::NotUdp)?;
    let h = frame.get(ip..).ok_or(SplitError::NotUdp)?;
    let (udp, v6, base_id) = match e.ethertype {
        eth::ETHERTYPE_IPV4 => {
            let b0 = *h.first().ok_or(SplitError::NotUdp)?;
            let ihl = usize::from(b0 & 0x0f) * 4;
            if b0 >> 4 != 4 || ihl < 20 || h.len() < ihl {
                return Err(SplitError::NotUdp);
            }
            // Neither a fragment nor more fragments: MF (0x20) and the offset bits clear.
            if h[9] != PROTO_UDP || h[6] & 0x3f != 0 || h[7] != 0 {
                return Err(SplitError::NotUdp);
            }
            (ip + ihl, false, u16::from_be_bytes([h[4], h[5]]))
        }
        eth::ETHERTYPE_IPV6 => {
            if h.len() < 40 || h[0] >> 4 != 6 || h[6] != PROTO_UDP {
                return Err(SplitError::NotUdp);
            }
            (ip + 40, true, 0)
        }
        _ => return Err(SplitError::NotUdp),
    };
    let payload = udp + UDP;
    if frame.len() < payload {
        return Err(SplitError::NotUdp);
    }
    let seg = usize::from(gso_size);
    let count = (frame.len() - payload).div_ceil(seg).max(1);
    Ok(Split {
        frame,
        ip,
        udp,
        payload,
        v6,
        seg,
        count,
        base_id,
    })
}

impl Split<'_> {
    /// How many datagrams the super-frame holds.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Write datagram `i` (`< count()`) as a whole Ethernet frame into `out` (cleared
    /// first), with `vlan` (TCI, TPID) inserted after the MAC addresses if given (a tag the
    /// kernel moved into the frame's metadata).
    pub fn write(&self, i: usize, vlan: Option<(u16, u16)>, out: &mut Vec<u8>) {
        let start = (self.payload + i * self.seg).min(self.frame.len());
        let end = (start + self.seg).min(self.frame.len());
        let seg_len = end - start;
        out.clear();
        let tag = if let Some((tci, tpid)) = vlan {
            out.extend_from_slice(&self.frame[..12]);
            out.extend_from_slice(&tpid.to_be_bytes());
            out.extend_from_slice(&tci.to_be_bytes());
            out.extend_from_slice(&self.frame[12..self.payload]);
            4
        } else {
            out.extend_from_slice(&self.frame[..self.payload]);
            0
        };
        out.extend_from_slice(&self.frame[start..end]);
        let (ip, udp) = (self.ip + tag, self.udp + tag);
        let udp_len = (UDP + seg_len) as u16;
        if self.v6 {
            out[ip + 4..ip + 6].copy_from_slice(&udp_len.to_be_bytes());
        } else {
            let ihl = udp - ip;
            let total = (ihl + UDP + seg_len) as u16;
            out[ip + 2..ip + 4].copy_from_slice(&total.to_be_bytes());
            let id = self.base_id.wrapping_add(i as u16);
            out[ip + 4..ip + 6].copy_from_slice(&id.to_be_bytes());
            out[ip + 10..ip + 12].copy_from_slice(&[0, 0]);
            let c = internet_checksum(&out[ip..udp]);
            out[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
        }
        out[udp + 4..udp + 6].copy_from_slice(&udp_len.to_be_bytes());
        out[udp + 6..udp + 8].copy_from_slice(&[0, 0]);
    }
}

/// Test fixtures, shared with the device's tests.
#[cfg(test)]
pub(crate) mod fixture {
    use crate::wire::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// The frames the kernel would put on the wire for segments of `sizes` bytes of RoCE
    /// payload from an IPv4 or IPv6 sender (IDs `base + i`), and the super-frame they come
    /// from (one header, ID `base`, the segments' UDP payloads one after the other).
    pub(crate) fn frames(v6: bool, base: u16, sizes: &[usize]) -> (Vec<Vec<u8>>, Vec<u8>) {
        let mut out = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let ip = if v6 {
                IpRepr::V6(Ipv6Repr {
                    src: Ipv6Addr::new(0xfd61, 2, 0, 0, 0, 0, 0, 2),
                    dst: Ipv6Addr::new(0xfd61, 1, 0, 0, 0, 0, 0, 2),
                    dscp: 0,
                    ecn: Ecn::NotEct,
                    flow_label: 7,
                    hop_limit: 63,
                })
            } else {
                IpRepr::V4(Ipv4Repr {
                    src: Ipv4Addr::new(10, 61, 2, 2),
                    dst: Ipv4Addr::new(10, 61, 1, 2),
                    dscp: 0,
                    ecn: Ecn::NotEct,
                    ident: base.wrapping_add(i as u16),
                    dont_frag: true,
                    ttl: 63,
                })
            };
            let f = FrameRepr {
                eth: Some(EthernetRepr {
                    dst: MacAddr([2, 0, 0, 0, 0, 1]),
                    src: MacAddr([2, 0, 0, 0, 0, 2]),
                    vlan: None,
                    ethertype: 0,
                }),
                ip,
                udp: UdpRepr {
                    src_port: 4791,
                    dst_port: ROCE_V2_PORT,
                    checksum: 0,
                },
                roce: RoceRepr::new(
                    BthRepr::new(
                        Opcode::RC_WRITE_MIDDLE,
                        QpNumber::new(9),
                        Psn::new(i as u32),
                    ),
                    ExtRepr::default(),
                    n,
                ),
            };
            let mut b = vec![0u8; f.buffer_len()];
            let data: Vec<u8> = (0..n).map(|k| (k * 3 + i) as u8).collect();
            f.emit(&mut b, &data).unwrap();
            out.push(b);
        }
        let hdr = 14 + if v6 { 40 } else { 20 } + 8;
        let mut sup = out[0][..hdr].to_vec();
        for f in &out {
            sup.extend_from_slice(&f[hdr..]);
        }
        (out, sup)
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::frames;
    use super::*;
    use crate::wire::*;

    #[test]
    fn split_gives_the_frames_the_kernel_would_send() {
        for v6 in [false, true] {
            // Equal segments, the last shorter; the ID wraps.
            let (want, sup) = frames(v6, 0xfffe, &[1000, 1000, 1000, 200]);
            let seg = (want[0].len() - (14 + if v6 { 40 } else { 20 } + 8)) as u16;
            let s = split(&sup, seg).unwrap();
            assert_eq!(s.count(), 4);
            let mut out = Vec::new();
            for (i, w) in want.iter().enumerate() {
                s.write(i, None, &mut out);
                assert_eq!(&out, w, "v6={v6} segment {i}");
                assert!(parse_frame(&out).is_ok(), "ICRC verifies");
            }
            // A tag the kernel stripped goes back in.
            s.write(1, Some((0x0064, 0x8100)), &mut out);
            let p = parse_frame(&out).unwrap();
            assert_eq!(p.repr.eth.unwrap().vlan.map(|v| v.vid), Some(100));
            assert_eq!(p.repr.roce.bth.psn, Psn::new(1));
        }
    }

    #[test]
    fn bad_super_frames_are_errors_not_panics() {
        let (_, sup) = frames(false, 0, &[100, 100]);
        assert_eq!(split(&sup, 0).unwrap_err(), SplitError::NoSegmentSize);
        for n in 0..42 {
            assert_eq!(
                split(&sup[..n], 100).unwrap_err(),
                SplitError::NotUdp,
                "{n}"
            );
        }
        let mut frag = sup.clone();
        frag[14 + 6] |= 0x20; // MF
        assert_eq!(split(&frag, 100).unwrap_err(), SplitError::NotUdp);
        let mut tcp = sup.clone();
        tcp[14 + 9] = 6;
        assert_eq!(split(&tcp, 100).unwrap_err(), SplitError::NotUdp);
        // Headers only: one empty datagram, no panic.
        let s = split(&sup[..42], 100).unwrap();
        assert_eq!(s.count(), 1);
        let mut out = Vec::new();
        s.write(0, None, &mut out);
        assert_eq!(out.len(), 42);
        // A segment size larger than the payload: one datagram.
        assert_eq!(split(&sup, 60000).unwrap().count(), 1);
    }
}
