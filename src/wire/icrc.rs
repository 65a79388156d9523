//! The RoCE v2 invariant CRC (IBTA Annex A17.3.3, "ICRC").
//!
//! CRC-32 (IEEE 802.3, the same function as zlib's `crc32` and `crc32fast`) over
//! `8 × 0xFF ‖ IP header ‖ UDP header ‖ BTH ‖ extension headers ‖ payload ‖ pad`, where the
//! fields a router may change are replaced by ones for the computation only:
//! IPv4 TOS, TTL and header checksum; IPv6 traffic class, flow label and hop limit; the UDP
//! checksum; and BTH byte 4 (FECN, BECN and six reserved bits). Length fields and the IPv4
//! identification are covered. The result goes on the wire least significant byte first.
//!
//! **No copy of the packet is made**: the masked IP, UDP and BTH headers (at most 80 bytes) are
//! assembled in a stack buffer and fed to the CRC in one call, then the rest of the packet is
//! fed straight from the caller's buffer, so the hardware-accelerated CRC runs over the
//! payload at full speed. The eight leading 0xFF bytes are folded into a constant seed.

use super::bth;
use crc32fast::Hasher;

/// CRC-32 of the eight 0xFF bytes that stand for the LRH (`zlib.crc32(b"\xff" * 8)`); the
/// CRC register after them holds its complement, 0xDEBB20E3, the value Linux rxe seeds with.
pub const SEED: u32 = 0x2144_df1c;
/// Length of the ICRC trailer.
pub const LEN: usize = 4;

const IPV4_MAX_HEADER: usize = 60;
const PREFIX_MAX: usize = IPV4_MAX_HEADER + 8 + bth::HEADER_LEN;

/// Copy `ip` into `out` with the variant fields set to ones; returns the bytes written.
fn mask_ip(ip: &[u8], out: &mut [u8]) -> usize {
    let n = ip.len().min(IPV4_MAX_HEADER).min(out.len());
    out[..n].copy_from_slice(&ip[..n]);
    match ip.first().map(|b| b >> 4) {
        Some(4) => {
            for i in [1usize, 8, 10, 11] {
                if i < n {
                    out[i] = 0xff;
                }
            }
        }
        Some(6) => {
            if n > 0 {
                out[0] |= 0x0f;
            }
            for i in [1usize, 2, 3, 7] {
                if i < n {
                    out[i] = 0xff;
                }
            }
        }
        _ => {}
    }
    n
}

/// The ICRC of a packet given as its IP header (with options), its UDP header and its
/// transport part from the BTH up to, not including, the ICRC trailer.
pub fn compute(ip_hdr: &[u8], udp_hdr: &[u8], transport: &[u8]) -> u32 {
    let mut pre = [0u8; PREFIX_MAX];
    let mut n = mask_ip(ip_hdr, &mut pre);
    let u = udp_hdr.len().min(8);
    pre[n..n + u].copy_from_slice(&udp_hdr[..u]);
    for b in pre[n + 6..n + u.max(6)].iter_mut() {
        *b = 0xff;
    }
    n += u;
    let t = transport.len().min(bth::HEADER_LEN);
    pre[n..n + t].copy_from_slice(&transport[..t]);
    if t > bth::ECN_BYTE {
        pre[n + bth::ECN_BYTE] = 0xff;
    }
    n += t;
    let mut h = Hasher::new_with_initial(SEED);
    h.update(&pre[..n]);
    h.update(&transport[t..]);
    h.finalize()
}

/// The ICRC stored at the end of `transport_with_icrc` (little-endian), if it is long enough.
pub fn stored(transport_with_icrc: &[u8]) -> Option<u32> {
    let n = transport_with_icrc.len();
    let b = transport_with_icrc.get(n.checked_sub(LEN)?..)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// The wire bytes of an ICRC value.
pub const fn to_wire(icrc: u32) -> [u8; 4] {
    icrc.to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(ip: &[u8], udp: &[u8], t: &[u8]) -> u32 {
        // The obvious definition: copy everything, mask, CRC the lot.
        let mut v = vec![0xffu8; 8];
        let mut ipm = ip.to_vec();
        if ip[0] >> 4 == 4 {
            ipm[1] = 0xff;
            ipm[8] = 0xff;
            ipm[10] = 0xff;
            ipm[11] = 0xff;
        } else {
            ipm[0] |= 0x0f;
            ipm[1] = 0xff;
            ipm[2] = 0xff;
            ipm[3] = 0xff;
            ipm[7] = 0xff;
        }
        v.extend_from_slice(&ipm);
        let mut u = udp.to_vec();
        u[6] = 0xff;
        u[7] = 0xff;
        v.extend_from_slice(&u);
        let mut tt = t.to_vec();
        tt[4] = 0xff;
        v.extend_from_slice(&tt);
        crc32fast::hash(&v)
    }

    #[test]
    fn seed_is_crc_of_eight_ff() {
        assert_eq!(crc32fast::hash(&[0xff; 8]), SEED);
        assert_eq!(!SEED, 0xdebb_20e3);
    }

    #[test]
    fn masked_stream_equals_copy_and_mask() {
        let ip4 = [
            0x45u8, 0x01, 0x00, 0x40, 0x04, 0x78, 0x40, 0x00, 0x40, 0x11, 0xb4, 0xd5, 0xc0, 0xa8,
            0x00, 0x07, 0xc0, 0xa8, 0x00, 0x07,
        ];
        let udp = [0xc0u8, 0x00, 0x12, 0xb7, 0x00, 0x2c, 0xac, 0xa2];
        let t: Vec<u8> = (0..200u8).collect();
        assert_eq!(compute(&ip4, &udp, &t), reference(&ip4, &udp, &t));
        let mut ip6 = [0u8; 40];
        ip6[0] = 0x6a;
        ip6[1] = 0xbc;
        ip6[6] = 17;
        ip6[7] = 9;
        assert_eq!(compute(&ip6, &udp, &t), reference(&ip6, &udp, &t));
    }

    #[test]
    fn short_inputs_do_not_panic() {
        let _ = compute(&[], &[], &[]);
        let _ = compute(&[0x45], &[1, 2, 3], &[0; 5]);
        let _ = compute(&[0x60; 3], &[0; 7], &[0; 3]);
        assert_eq!(stored(&[1, 2, 3]), None);
        assert_eq!(stored(&[9, 1, 2, 3, 4]), Some(0x0403_0201));
    }
}
