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
//!
//! **Recovering the IPv4 identification** ([`solve_ipv4_ident`], [`ident_from_delta`]): a
//! receiver behind a kernel UDP socket never sees the sender's IPv4 ID and flags, which the
//! ICRC covers. CRC-32 is affine over GF(2), so the 16 ID bits can be solved for from the
//! stored ICRC (32 equations, 16 unknowns, Gaussian elimination; the per-bit ICRC changes
//! come from the zlib `crc32_combine` x^(8n) mod P technique). The 16 equations left over
//! are the residual check: 16 bits of ICRC strength instead of 32 for packets accepted this
//! way. See `io::udp` for how the UDP-socket backend uses it.

use super::bth;
use crc32fast::Hasher;

/// CRC-32 of the eight 0xFF bytes that stand for the LRH (`zlib.crc32(b"\xff" * 8)`); the
/// CRC register after them holds its complement, 0xDEBB20E3, the value Linux rxe seeds with.
pub const SEED: u32 = 0x2144_df1c;
/// Length of the ICRC trailer.
pub const LEN: usize = 4;

const IPV4_MAX_HEADER: usize = 60;
const PREFIX_MAX: usize = IPV4_MAX_HEADER + 8 + bth::HEADER_LEN;

/// A CRC-32 state after the eight 0xFF bytes. Made once and cloned: making a `Hasher` asks
/// the CPU which instructions it has, every time (three feature checks per packet saved).
fn seeded() -> Hasher {
    static PROTO: std::sync::OnceLock<Hasher> = std::sync::OnceLock::new();
    PROTO.get_or_init(|| Hasher::new_with_initial(SEED)).clone()
}

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
    // An IPv4 header without options (nearly every packet) fits a buffer small enough to be
    // cleared inline; a longer one (IPv6, options) takes the largest.
    if ip_hdr.len() <= super::ip::IPV4_HEADER_LEN {
        compute_with::<{ super::ip::IPV4_HEADER_LEN + 8 + bth::HEADER_LEN }>(
            ip_hdr, udp_hdr, transport,
        )
    } else {
        compute_with::<PREFIX_MAX>(ip_hdr, udp_hdr, transport)
    }
}

/// [`compute`] with the masked headers assembled in an `N`-byte buffer (`N` at least the IP
/// header's length + 8 + the BTH's).
fn compute_with<const N: usize>(ip_hdr: &[u8], udp_hdr: &[u8], transport: &[u8]) -> u32 {
    let mut pre = [0u8; N];
    let mut n = mask_ip(ip_hdr, &mut pre);
    let u = udp_hdr.len().min(8).min(N - n);
    pre[n..n + u].copy_from_slice(&udp_hdr[..u]);
    for b in pre[n + 6.min(u)..n + u].iter_mut() {
        *b = 0xff;
    }
    n += u;
    let t = transport.len().min(bth::HEADER_LEN).min(N - n);
    pre[n..n + t].copy_from_slice(&transport[..t]);
    if t > bth::ECN_BYTE {
        pre[n + bth::ECN_BYTE] = 0xff;
    }
    n += t;
    let mut h = seeded();
    h.update(&pre[..n]);
    h.update(&transport[t..]);
    h.finalize()
}

/// The ICRC of a packet in a buffer the caller may write to: the variant fields are set to
/// ones in place, the CRC runs over the contiguous bytes `[ip, end)` in one call (the fast
/// path of `crc32fast`, so masking costs next to nothing), and the fields are restored before
/// returning. `ip`, `udp`, `bth` are the offsets of the IP, UDP and BTH headers; `end` is where
/// the ICRC starts. The buffer is unchanged afterwards. Offsets that do not fit the buffer
/// fall back to [`compute`].
pub fn compute_in_place(buf: &mut [u8], ip: usize, udp: usize, bth_at: usize, end: usize) -> u32 {
    let ok = ip < udp && udp + 8 <= bth_at && bth_at + bth::HEADER_LEN <= end && end <= buf.len();
    if !ok {
        let (a, b, c) = (
            buf.get(ip..udp.min(buf.len())).unwrap_or(&[]),
            buf.get(udp..bth_at.min(buf.len())).unwrap_or(&[]),
            buf.get(bth_at..end.min(buf.len())).unwrap_or(&[]),
        );
        return compute(a, b, c);
    }
    // Positions of the variant bytes.
    let v4 = buf[ip] >> 4 == 4;
    let mut pos = [0usize; 9];
    let mut n = 0;
    let mut add = |p: usize| {
        pos[n] = p;
        n += 1;
    };
    if v4 {
        for o in [1, 8, 10, 11] {
            add(ip + o);
        }
    } else {
        for o in [1, 2, 3, 7] {
            add(ip + o);
        }
    }
    add(udp + 6);
    add(udp + 7);
    add(bth_at + bth::ECN_BYTE);
    let mut saved = [0u8; 9];
    for i in 0..n {
        saved[i] = buf[pos[i]];
        buf[pos[i]] = 0xff;
    }
    // IPv6: the low nibble of byte 0 is the top of the traffic class.
    let b0 = buf[ip];
    if !v4 {
        buf[ip] |= 0x0f;
    }
    let mut h = seeded();
    h.update(&buf[ip..end]);
    let crc = h.finalize();
    buf[ip] = b0;
    for i in 0..n {
        buf[pos[i]] = saved[i];
    }
    crc
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

// ---------------------------------------------------------------------------------------------
// Recovering the IPv4 identification from the ICRC
// ---------------------------------------------------------------------------------------------
//
// A kernel UDP socket hands the receiver the UDP payload and the addresses, never the sender's
// IPv4 identification or flags, yet the ICRC covers both. CRC-32 is affine over GF(2): for two
// messages of the same length, `crc(M ⊕ E) = crc(M) ⊕ A(E)` where `A` is linear (the CRC with a
// zero initial register and no final inversion). Flipping ID bit `i` therefore changes the
// ICRC by a constant `L_i` that depends only on how many bytes follow the ID field, and for an
// unknown ID `x`:
//
//     stored ⊕ ICRC(header with ID = g) = Σ_i (x ⊕ g)_i · L_i
//
// 32 equations in 16 unknowns. `L_i` is the raw CRC of the two ID bytes with only bit `i` set,
// advanced over the trailing bytes by multiplying with x^(8·bytes_after) mod P — the zlib
// "crc32_combine" technique, O(log n) instead of CRCing a zero-filled message. The sixteen
// `L_i` are always linearly independent (a nonzero polynomial of degree < 16 times a power of
// x is never divisible by P), so Gaussian elimination gives the unique candidate, and the
// remaining 16 equations are a check: a random (corrupted) packet passes with probability
// 2^-16. A packet accepted this way is protected by 16 bits of CRC, not 32.

/// The CRC-32 (IEEE 802.3) polynomial, bit-reflected.
const POLY: u32 = 0xedb8_8320;

/// a(x)·b(x) mod P(x), both in the reflected representation (bit 31 is x^0).
const fn multmodp(a: u32, mut b: u32) -> u32 {
    if a == 0 {
        return 0;
    }
    let mut m: u32 = 1 << 31;
    let mut p = 0u32;
    loop {
        if a & m != 0 {
            p ^= b;
            if a & (m - 1) == 0 {
                break;
            }
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    p
}

/// `X2N[k]` = x^(2^k) mod P.
const X2N: [u32; 32] = {
    let mut t = [0u32; 32];
    t[0] = 1 << 30; // x^1
    let mut k = 1;
    while k < 32 {
        t[k] = multmodp(t[k - 1], t[k - 1]);
        k += 1;
    }
    t
};

/// x^(8·n) mod P: the operator that advances a CRC register over `n` zero bytes.
fn x8n(n: usize) -> u32 {
    let mut p: u32 = 1 << 31; // x^0
    let mut n = n as u64;
    let mut k = 3; // x^8 = x^(2^3)
    while n != 0 {
        if n & 1 != 0 {
            p = multmodp(X2N[k & 31], p);
        }
        n >>= 1;
        k += 1;
    }
    p
}

/// The CRC register after `bytes`, from a zero register, without final inversion (bit by
/// bit: the definition the fast form is tested against).
#[cfg(test)]
fn raw_crc(bytes: &[u8]) -> u32 {
    let mut c = 0u32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
        }
    }
    c
}

/// [`raw_crc`] through `crc32fast` (hardware CRC where the CPU has it): with the zlib
/// convention `crc(init, m) = !update(!init, m)`, an initial value of all ones starts the
/// register at zero, and inverting the result undoes the final inversion.
fn raw_crc_fast(bytes: &[u8]) -> u32 {
    let mut h = Hasher::new_with_initial(u32::MAX);
    h.update(bytes);
    !h.finalize()
}

/// How the CRC-32 (and so the ICRC) of a message changes when `pattern` is XORed into it at a
/// position followed by `bytes_after` more bytes of the message: `crc(M ⊕ E) = crc(M) ⊕ this`.
pub fn flip_delta(pattern: &[u8], bytes_after: usize) -> u32 {
    Shift::new(bytes_after).delta(pattern)
}

/// [`flip_delta`] for one fixed `bytes_after`, with the x^(8·bytes_after) operator computed
/// once: for patching many packets of the same length (each delta then costs one short CRC
/// and one GF(2) multiplication, no pass over the packet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shift {
    bytes_after: usize,
    op: u32,
}

impl Shift {
    /// The operator for a pattern followed by `bytes_after` bytes of the message.
    pub fn new(bytes_after: usize) -> Shift {
        Shift {
            bytes_after,
            op: x8n(bytes_after),
        }
    }

    /// The `bytes_after` this operator was made for.
    pub fn bytes_after(&self) -> usize {
        self.bytes_after
    }

    /// The CRC change of XORing `pattern` into the message, its last byte followed by
    /// `bytes_after` bytes.
    pub fn delta(&self, pattern: &[u8]) -> u32 {
        multmodp(self.op, raw_crc_fast(pattern))
    }
}

/// The linear algebra of one IPv4 identification position, precomputed for one packet length:
/// the ICRC change of every ID bit (`L_i`, see above), the elimination basis that inverts
/// them, and the change of flipping DF. [`ident_from_delta`] builds one per call; a receiver
/// that sees the same lengths again keeps them (the UDP backend does), and then checking an
/// ID candidate against a mismatching ICRC costs a few XORs instead of another CRC pass.
#[derive(Clone, Debug)]
pub struct IdentSolver {
    bytes_after: usize,
    bits: [u32; 16],
    /// Row-echelon basis indexed by pivot (highest set bit): (vector, which ID bits make it).
    basis: [(u32, u16); 32],
    df: u32,
}

impl IdentSolver {
    /// For an ID field followed by `bytes_after_ident` bytes of the ICRC message (see
    /// [`ipv4_ident_bytes_after`]).
    pub fn new(bytes_after_ident: usize) -> IdentSolver {
        let shift = Shift::new(bytes_after_ident);
        let mut bits = [0u32; 16];
        let mut basis = [(0u32, 0u16); 32];
        for (i, slot) in bits.iter_mut().enumerate() {
            let bit = 1u16 << i;
            let mut v = shift.delta(&bit.to_be_bytes());
            *slot = v;
            let mut combo = bit;
            while v != 0 {
                let p = 31 - v.leading_zeros() as usize;
                if basis[p].0 == 0 {
                    basis[p] = (v, combo);
                    break;
                }
                v ^= basis[p].0;
                combo ^= basis[p].1;
            }
        }
        // DF is bit 0x40 of header byte 6, right after the ID (bytes 4 and 5): one byte
        // fewer follows it.
        let df = flip_delta(&[0x40], bytes_after_ident.saturating_sub(1));
        IdentSolver {
            bytes_after: bytes_after_ident,
            bits,
            basis,
            df,
        }
    }

    /// The `bytes_after_ident` this solver was made for.
    pub fn bytes_after(&self) -> usize {
        self.bytes_after
    }

    /// The ICRC change of XORing `x` into the identification.
    pub fn delta(&self, x: u16) -> u32 {
        let mut d = 0;
        for (i, l) in self.bits.iter().enumerate() {
            if x >> i & 1 != 0 {
                d ^= l;
            }
        }
        d
    }

    /// The ICRC change of flipping DF (IPv4 header byte 6, bit 0x40).
    pub fn df_delta(&self) -> u32 {
        self.df
    }

    /// The ID change `x` with `delta(x) == delta`, or `None` when there is none (the packet
    /// differs elsewhere). `Some(0)` for `delta == 0`.
    pub fn solve(&self, delta: u32) -> Option<u16> {
        let mut d = delta;
        let mut x = 0u16;
        while d != 0 {
            let p = 31 - d.leading_zeros() as usize;
            let (v, combo) = self.basis[p];
            if v == 0 {
                return None; // delta is outside the span of the ID bits: inconsistent
            }
            d ^= v;
            x ^= combo;
        }
        Some(x)
    }
}

/// Bytes of the ICRC message that follow the IPv4 identification field (IP header bytes 4..6),
/// for an IP header of `ip_hdr_len` bytes (options included) and a transport part of
/// `transport_len` bytes without the ICRC.
pub const fn ipv4_ident_bytes_after(ip_hdr_len: usize, transport_len: usize) -> usize {
    ip_hdr_len - 6 + 8 + transport_len
}

/// Bytes of the ICRC message that follow IPv4 header byte 6 (the one holding DF).
pub const fn ipv4_flags_bytes_after(ip_hdr_len: usize, transport_len: usize) -> usize {
    ip_hdr_len - 7 + 8 + transport_len
}

/// The ICRC change of setting or clearing DF (bit 0x40 of IPv4 header byte 6).
pub fn ipv4_df_delta(ip_hdr_len: usize, transport_len: usize) -> u32 {
    flip_delta(&[0x40], ipv4_flags_bytes_after(ip_hdr_len, transport_len))
}

/// The 16-bit change `x` of the IPv4 identification that changes the ICRC by exactly `delta`
/// (`bytes_after_ident` from [`ipv4_ident_bytes_after`]), or `None` when no ID change can
/// (then the packet differs elsewhere: it is corrupt, or another field is wrong). `Some(0)`
/// for `delta == 0`.
pub fn ident_from_delta(delta: u32, bytes_after_ident: usize) -> Option<u16> {
    if delta == 0 {
        return Some(0);
    }
    IdentSolver::new(bytes_after_ident).solve(delta)
}

/// Solve for the IPv4 identification of a RoCE v2 packet whose ICRC is `stored`: `ip_hdr` is
/// the IPv4 header as the receiver believes it (its ID field is ignored, every other field,
/// flags included, must be the sender's), `udp_hdr` the UDP header and `transport` the BTH up
/// to, not including, the ICRC. Returns the ID under which the packet verifies, or `None` if
/// there is none (a corrupted packet, or a wrong guess of another covered field such as DF).
///
/// An answer is only as strong as the 16 check bits left over: a random corrupted packet gets
/// `Some` with probability 2^-16. Costs one ICRC pass plus a few hundred word operations.
pub fn solve_ipv4_ident(
    ip_hdr: &[u8],
    udp_hdr: &[u8],
    transport: &[u8],
    stored: u32,
) -> Option<u16> {
    let n = ip_hdr.len();
    if !(20..=IPV4_MAX_HEADER).contains(&n) || ip_hdr[0] >> 4 != 4 || udp_hdr.len() != 8 {
        return None;
    }
    let mut h = [0u8; IPV4_MAX_HEADER];
    h[..n].copy_from_slice(ip_hdr);
    h[4] = 0;
    h[5] = 0;
    let c0 = compute(&h[..n], udp_hdr, transport);
    ident_from_delta(stored ^ c0, ipv4_ident_bytes_after(n, transport.len()))
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
    fn in_place_equals_segmented_and_restores_the_buffer() {
        let mut v4 = vec![0u8; 14];
        v4.extend_from_slice(&[
            0x45, 0x01, 0x00, 0x40, 0x04, 0x78, 0x40, 0x00, 0x40, 0x11, 0xb4, 0xd5, 0xc0, 0xa8, 0,
            7, 0xc0, 0xa8, 0, 7,
        ]);
        v4.extend_from_slice(&[0xc0, 0x00, 0x12, 0xb7, 0x00, 0x2c, 0xac, 0xa2]);
        v4.extend((0..300u32).map(|i| (i * 13) as u8));
        let end = v4.len();
        let before = v4.clone();
        let seg = compute(&v4[14..34], &v4[34..42], &v4[42..end]);
        assert_eq!(compute_in_place(&mut v4, 14, 34, 42, end), seg);
        assert_eq!(v4, before);
        let mut v6 = vec![0u8; 40];
        v6[0] = 0x6a;
        v6[1] = 0xbc;
        v6[6] = 17;
        v6.extend_from_slice(&[0xc0, 0x00, 0x12, 0xb7, 0x00, 0x2c, 0xac, 0xa2]);
        v6.extend((0..100u32).map(|i| i as u8));
        let end = v6.len();
        let before = v6.clone();
        let seg = compute(&v6[..40], &v6[40..48], &v6[48..end]);
        assert_eq!(compute_in_place(&mut v6, 0, 40, 48, end), seg);
        assert_eq!(v6, before);
        // Nonsense offsets fall back without panicking.
        let _ = compute_in_place(&mut v6, 50, 10, 5, 1000);
    }

    #[test]
    fn short_inputs_do_not_panic() {
        let _ = compute(&[], &[], &[]);
        let _ = compute(&[0x45], &[1, 2, 3], &[0; 5]);
        let _ = compute(&[0x60; 3], &[0; 7], &[0; 3]);
        assert_eq!(stored(&[1, 2, 3]), None);
        assert_eq!(stored(&[9, 1, 2, 3, 4]), Some(0x0403_0201));
    }

    /// A small deterministic generator (the tests must not depend on a seed file or the clock).
    struct Rng(crate::rng::SplitMix64);
    impl Rng {
        fn new(seed: u64) -> Rng {
            Rng(crate::rng::SplitMix64::new(seed))
        }
        fn next(&mut self) -> u64 {
            self.0.next_u64()
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    /// A random IPv4 RoCE packet: (IP header with options, UDP header, transport w/o ICRC).
    fn random_v4(r: &mut Rng) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let ihl = 5 + r.below(11);
        let t_len = 12 + r.below(1200);
        let mut ip = r.bytes(ihl * 4);
        ip[0] = 0x40 | ihl as u8;
        let total = (ihl * 4 + 8 + t_len + LEN) as u16;
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ip[6] = if r.below(2) == 0 { 0x40 } else { 0 };
        ip[7] = 0;
        ip[9] = 17;
        let mut udp = r.bytes(8);
        udp[2..4].copy_from_slice(&4791u16.to_be_bytes());
        udp[4..6].copy_from_slice(&((8 + t_len + LEN) as u16).to_be_bytes());
        (ip, udp, r.bytes(t_len))
    }

    #[test]
    fn gf2_helpers_match_brute_force() {
        assert_eq!(x8n(0), 1 << 31);
        // Appending n zero bytes to a message = multiplying its register by x^(8n).
        let mut r = Rng::new(1);
        for _ in 0..200 {
            let n = r.below(3000);
            let ml = 1 + r.below(40);
            let m = r.bytes(ml);
            let mut z = m.clone();
            z.resize(m.len() + n, 0);
            assert_eq!(raw_crc(&z), multmodp(x8n(n), raw_crc(&m)));
        }
        // flip_delta predicts the CRC change of XORing a pattern anywhere in a message.
        for _ in 0..200 {
            let len = 4 + r.below(2000);
            let m = r.bytes(len);
            let plen = 1 + r.below(4);
            let at = r.below(len - plen + 1);
            let pat = r.bytes(plen);
            let mut m2 = m.clone();
            for (i, b) in pat.iter().enumerate() {
                m2[at + i] ^= b;
            }
            let d = crc32fast::hash(&m) ^ crc32fast::hash(&m2);
            assert_eq!(d, flip_delta(&pat, len - at - plen));
        }
    }

    #[test]
    fn fast_raw_crc_and_cached_solver_agree_with_the_slow_forms() {
        let mut r = Rng::new(7);
        for _ in 0..300 {
            let k = r.below(100);
            let m = r.bytes(k);
            assert_eq!(raw_crc_fast(&m), raw_crc(&m));
            let n = r.below(70_000);
            let k = 1 + r.below(48);
            let pat = r.bytes(k);
            assert_eq!(Shift::new(n).delta(&pat), multmodp(x8n(n), raw_crc(&pat)));
        }
        for _ in 0..50 {
            let t_len = 12 + r.below(9000);
            let after = ipv4_ident_bytes_after(20, t_len);
            let s = IdentSolver::new(after);
            assert_eq!(s.bytes_after(), after);
            assert_eq!(s.df_delta(), ipv4_df_delta(20, t_len));
            for _ in 0..20 {
                let x = r.next() as u16;
                assert_eq!(s.delta(x), flip_delta(&x.to_be_bytes(), after));
                assert_eq!(s.solve(s.delta(x)), Some(x));
            }
        }
    }

    #[test]
    fn solver_recovers_random_idents() {
        let mut r = Rng::new(2);
        for case in 0..3000 {
            let (mut ip, udp, t) = random_v4(&mut r);
            let id = if case == 0 { 0 } else { r.next() as u16 };
            ip[4..6].copy_from_slice(&id.to_be_bytes());
            let stored = compute(&ip, &udp, &t);
            // The receiver's header has some other ID in that field: it must not matter.
            let mut guess = ip.clone();
            guess[4..6].copy_from_slice(&(r.next() as u16).to_be_bytes());
            assert_eq!(
                solve_ipv4_ident(&guess, &udp, &t, stored),
                Some(id),
                "case {case}"
            );
            // The low-level form: delta from a guessed-ID ICRC, solution XOR guess.
            let g = u16::from_be_bytes([guess[4], guess[5]]);
            let cg = compute(&guess, &udp, &t);
            let x = ident_from_delta(stored ^ cg, ipv4_ident_bytes_after(ip.len(), t.len()));
            assert_eq!(x.map(|x| x ^ g), Some(id));
            // With the DF bit guessed wrong there is (almost surely) no solution, and the DF
            // delta turns the wrong guess into the right one without another CRC pass.
            let mut wrong = guess.clone();
            wrong[6] ^= 0x40;
            let cw = compute(&wrong, &udp, &t);
            assert_eq!(cw ^ cg, ipv4_df_delta(ip.len(), t.len()));
        }
    }

    #[test]
    fn solver_rejects_corruption_with_16_bits_of_strength() {
        let mut r = Rng::new(3);
        let cases = 40_000;
        let mut accepted = 0;
        let mut df_accepted = 0;
        for _ in 0..cases {
            let (mut ip, udp, mut t) = random_v4(&mut r);
            ip[4..6].copy_from_slice(&(r.next() as u16).to_be_bytes());
            let stored = compute(&ip, &udp, &t);
            // Corrupt 1..=3 distinct random bytes of the IP addresses or the transport (never
            // BTH byte 4: it is masked, so changing it is not corruption as far as the ICRC
            // goes). Position p < 8 is IP byte 12 + p, else transport byte p - 8 (skipping 4).
            let k = 1 + r.below(3);
            let mut picked: Vec<usize> = Vec::new();
            while picked.len() < k {
                let p = r.below(8 + t.len() - 1);
                if !picked.contains(&p) {
                    picked.push(p);
                }
            }
            for p in picked {
                let flip = 1 + r.below(255) as u8;
                if p < 8 {
                    ip[12 + p] ^= flip;
                } else {
                    let i = p - 8;
                    t[if i >= bth::ECN_BYTE { i + 1 } else { i }] ^= flip;
                }
            }
            if solve_ipv4_ident(&ip, &udp, &t, stored).is_some() {
                accepted += 1;
            }
            // A correct header with the wrong DF guess is just another wrong packet.
            let (mut ip2, udp2, t2) = random_v4(&mut r);
            let stored2 = compute(&ip2, &udp2, &t2);
            ip2[6] ^= 0x40;
            if solve_ipv4_ident(&ip2, &udp2, &t2, stored2).is_some() {
                df_accepted += 1;
            }
        }
        // Expected cases · 2^-16 ≈ 0.6 each; anything above a handful means the solver is not
        // checking the 16 redundant equations.
        eprintln!("ident solver: {accepted}/{cases} corrupted packets accepted, {df_accepted}/{cases} wrong-DF accepted");
        assert!(
            accepted <= 6,
            "{accepted} of {cases} corrupted packets solved"
        );
        assert!(
            df_accepted <= 6,
            "{df_accepted} of {cases} wrong-DF packets solved"
        );
    }

    #[test]
    fn solver_input_checks() {
        let udp = [0u8; 8];
        assert_eq!(solve_ipv4_ident(&[0x45; 19], &udp, &[0; 12], 0), None);
        assert_eq!(solve_ipv4_ident(&[0x65; 20], &udp, &[0; 12], 0), None);
        assert_eq!(solve_ipv4_ident(&[0x45; 20], &udp[..7], &[0; 12], 0), None);
        assert_eq!(ident_from_delta(0, 100), Some(0));
    }

    proptest::proptest! {
        #[test]
        fn solver_recovers_any_ident(
            id in proptest::num::u16::ANY,
            df in proptest::bool::ANY,
            t in proptest::collection::vec(proptest::num::u8::ANY, 12..600),
            src in proptest::num::u32::ANY,
            dst in proptest::num::u32::ANY,
        ) {
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&((20 + 8 + t.len() + LEN) as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&id.to_be_bytes());
            ip[6] = if df { 0x40 } else { 0 };
            ip[8] = 64;
            ip[9] = 17;
            ip[12..16].copy_from_slice(&src.to_be_bytes());
            ip[16..20].copy_from_slice(&dst.to_be_bytes());
            let mut udp = [0u8; 8];
            udp[0..2].copy_from_slice(&0xc000u16.to_be_bytes());
            udp[2..4].copy_from_slice(&4791u16.to_be_bytes());
            udp[4..6].copy_from_slice(&((8 + t.len() + LEN) as u16).to_be_bytes());
            let stored = compute(&ip, &udp, &t);
            let mut rx = ip;
            rx[4] = 0;
            rx[5] = 0;
            proptest::prop_assert_eq!(solve_ipv4_ident(&rx, &udp, &t, stored), Some(id));
        }
    }
}
