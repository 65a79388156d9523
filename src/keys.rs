//! Unpredictable identifiers for the protocol layers: communication IDs and transaction IDs
//! of the connection manager (and any other key a layer below `verbs` needs).
//!
//! A [`KeyGen`] is SplitMix64 (the same generator `verbs::Device` uses for memory keys) seeded
//! from the operating system's per-process random source, or from a fixed seed for
//! reproducible tests and simulations. It is not cryptographic: it makes identifiers that a
//! peer cannot guess from the ones it has seen by counting, which is what the IBTA asks of
//! communication IDs (a stale or forged message must not match a new connection by luck).

/// A generator of 32- and 64-bit keys.
#[derive(Clone, Debug)]
pub struct KeyGen(u64);

impl KeyGen {
    /// A generator with a fixed seed (`Some`) or an unpredictable one (`None`).
    pub fn new(seed: Option<u64>) -> Self {
        KeyGen(seed.unwrap_or_else(os_seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// A non-zero 32-bit key for which `taken` is false (zero means "none" in CM messages).
    pub fn fresh_u32(&mut self, mut taken: impl FnMut(u32) -> bool) -> u32 {
        loop {
            let k = self.next_u32();
            if k != 0 && !taken(k) {
                return k;
            }
        }
    }
}

/// A seed from the OS: std's `RandomState` is keyed from the OS random source per process.
fn os_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_is_reproducible_and_unseeded_differs() {
        let (mut a, mut b) = (KeyGen::new(Some(7)), KeyGen::new(Some(7)));
        assert_eq!(a.next_u64(), b.next_u64());
        let mut c = KeyGen::new(None);
        let mut d = KeyGen::new(None);
        // Two unseeded generators in one process start from different OS-keyed states.
        assert_ne!((c.next_u64(), c.next_u64()), (d.next_u64(), d.next_u64()));
    }

    #[test]
    fn fresh_keys_are_never_zero_nor_taken_nor_sequential() {
        let mut g = KeyGen::new(Some(1));
        let mut seen = std::collections::HashSet::new();
        let mut prev = 0u32;
        let mut sequential = 0;
        for _ in 0..10_000 {
            let k = g.fresh_u32(|k| seen.contains(&k));
            assert_ne!(k, 0);
            assert!(seen.insert(k));
            sequential += usize::from(k.wrapping_sub(prev) == 1);
            prev = k;
        }
        assert_eq!(sequential, 0);
    }
}
