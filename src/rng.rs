//! The crate's one pseudo-random generator, [`SplitMix64`].
//!
//! SplitMix64 (Steele, Lea and Flood, 2014) is tiny, fast and seedable, and every run of the
//! simulator, the fault injector and the switch is a pure function of its seed. It is **not**
//! cryptographic: the values a peer must not guess (memory keys, PSNs, CM identifiers) are
//! drawn through [`crate::keys::KeyGen`] only, a ChaCha12 generator keyed from the OS.
//!
//! A leaf module: it imports nothing of the crate.

/// The SplitMix64 increment (the golden ratio in 64 bits).
pub(crate) const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// The SplitMix64 output function.
#[inline]
pub(crate) const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform `f64` in `[0, 1)` from the top 53 bits of `x`.
#[inline]
pub(crate) fn unit_f64(x: u64) -> f64 {
    (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A value in `0..n` from `x` (Lemire's multiply-shift; the bias is below `n / 2^64`).
#[inline]
pub(crate) fn scale(x: u64, n: u64) -> u64 {
    ((u128::from(x) * u128::from(n)) >> 64) as u64
}

/// True with probability `p` given a uniform `x`. `p <= 0` (or NaN) never, `p >= 1` always.
#[inline]
pub(crate) fn hit(x: u64, p: f64) -> bool {
    p > 0.0 && (p >= 1.0 || unit_f64(x) < p)
}

/// SplitMix64 (Steele, Lea and Flood, 2014): a tiny, fast, seedable PRNG whose every seed,
/// zero included, gives a full-period stream. Not cryptographic. The network simulator uses
/// it counter-style (see [`crate::sim::net`]); tests and workloads can use it directly to draw
/// reproducible sizes, gaps and payloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose stream is fixed by `seed`.
    pub const fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix64(self.state)
    }

    /// A uniform value in `[0, 1)` with 53 bits of precision.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        unit_f64(self.next_u64())
    }

    /// A uniform value in `0..n` (0 when `n` is 0).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        scale(self.next_u64(), n)
    }

    /// True with probability `p` (clamped to `[0, 1]`; NaN counts as 0).
    #[inline]
    pub fn chance(&mut self, p: f64) -> bool {
        hit(self.next_u64(), p)
    }

    /// Fill `buf` with random bytes.
    pub fn fill_bytes(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let r = self.next_u64().to_le_bytes();
            let n = rest.len();
            rest.copy_from_slice(&r[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_known_answers() {
        // Reference outputs of splitmix64.c (Vigna) for seeds 0 and 1234567.
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(r.next_u64(), 0x06c4_5d18_8009_454f);
        let mut r = SplitMix64::new(1_234_567);
        assert_eq!(r.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(r.next_u64(), 3_203_168_211_198_807_973);
        assert_eq!(r.next_u64(), 9_817_491_932_198_370_423);
    }
}
