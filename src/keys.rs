//! The one place the library draws what a peer must not guess: memory keys (L_Key, R_Key) and
//! the virtual addresses of memory regions (`verbs::Device`), communication and transaction IDs
//! (the connection manager), initial PSNs.
//!
//! A [`KeyGen`] is a [`SplitMix64`] stream seeded from the operating system's per-process
//! random source, or from a fixed seed for reproducible tests and simulations. It is not
//! cryptographic: it makes identifiers that a peer cannot guess from the ones it has seen by
//! counting, which is what the IBTA asks of communication IDs (a stale or forged message must
//! not match a new connection by luck), but a peer that sees a few outputs (keys travel in
//! packets) could predict the next. Every such draw goes through this type, so that replacing
//! the generator by a cryptographic one is a change here alone.

use crate::rng::SplitMix64;

/// A generator of keys and identifiers.
#[derive(Clone, Debug)]
pub struct KeyGen(SplitMix64);

impl KeyGen {
    /// A generator with a fixed seed (`Some`) or an unpredictable one (`None`).
    pub fn new(seed: Option<u64>) -> Self {
        KeyGen(SplitMix64::new(seed.unwrap_or_else(os_seed)))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A non-zero memory key for which `taken` is false: bits 16..48 of a draw (the bits
    /// `verbs::Device` has always used, so a seeded device keeps its keys).
    pub fn mr_key(&mut self, mut taken: impl FnMut(u32) -> bool) -> u32 {
        loop {
            let k = (self.next_u64() >> 16) as u32;
            if k != 0 && !taken(k) {
                return k;
            }
        }
    }

    /// A random 24-bit packet sequence number.
    pub fn psn(&mut self) -> u32 {
        (self.next_u64() >> 40) as u32
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
    fn draws_come_from_the_seeded_stream() {
        // SplitMix64's reference outputs for seed 0 (see rng.rs), in the bits each draw uses.
        let mut k = KeyGen::new(Some(0));
        assert_eq!(
            k.mr_key(|_| false),
            (0xe220_a839_7b1d_cdaf_u64 >> 16) as u32
        );
        assert_eq!(k.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(k.psn(), 0x0006_c45d);
    }

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
