//! Data patterns for checking payloads byte for byte against real peers.
//!
//! - [`fill`] / [`expected`]: ferroce's own pseudo-random pattern (splitmix64 of a seed and a
//!   message index), cheap enough to regenerate for every message of a test.
//! - [`GlibcRand`]: glibc's `srand()`/`rand()` (the TYPE_3 additive feedback generator of
//!   `random_r.c`). perftest fills every buffer it registers with `(char)rand()` after
//!   `srand(time(NULL))` (`create_single_mr` in `perftest_resources.c`; write_lat zeroes it
//!   instead), so the bytes of a perftest peer's memory are known once the second it started
//!   is known: [`find_glibc_seed`] finds it from the data.

use crate::rng::{mix64 as mix, GAMMA};

/// The page size whose first byte `ibv_rc_pingpong -c` checks (it must be 0).
pub const PINGPONG_PAGE: usize = 4096;

/// Fill `buf` with message `index` of the pattern of `seed`. With `zero_pages`, the first byte of
/// every 4 KiB page is 0 (what `ibv_rc_pingpong -c` checks on the server side).
pub fn fill(buf: &mut [u8], seed: u64, index: u64, zero_pages: bool) {
    let base = mix(seed ^ index.wrapping_mul(GAMMA));
    for (w, chunk) in buf.chunks_mut(8).enumerate() {
        let v = mix(base.wrapping_add((w as u64).wrapping_mul(GAMMA)));
        chunk.copy_from_slice(&v.to_le_bytes()[..chunk.len()]);
    }
    if zero_pages {
        for i in (0..buf.len()).step_by(PINGPONG_PAGE) {
            buf[i] = 0;
        }
    }
}

/// Message `index` of the pattern of `seed`, `len` bytes long.
pub fn expected(len: usize, seed: u64, index: u64, zero_pages: bool) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(&mut v, seed, index, zero_pages);
    v
}

/// The first difference between `got` and `want`: (offset, got byte, wanted byte), and the
/// number of differing bytes.
pub fn first_mismatch(got: &[u8], want: &[u8]) -> Option<(usize, u8, u8, usize)> {
    let n = got.iter().zip(want).filter(|(a, b)| a != b).count() + got.len().abs_diff(want.len());
    if n == 0 {
        return None;
    }
    let i = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    Some((
        i,
        got.get(i).copied().unwrap_or(0),
        want.get(i).copied().unwrap_or(0),
        n,
    ))
}

/// glibc's `rand()` after `srand(seed)` (TYPE_3: degree 31, separation 3), as `__srandom_r`
/// and `__random_r` compute it, restated as the lagged sequence it is: `x[0..31]` the seeded
/// state, `x[31..34] = x[0..3]`, then `x[n] = x[n-31] + x[n-3]` (mod 2^32); `srand` discards
/// 310 outputs, so output `k` is `x[k + 344] >> 1`.
#[derive(Clone)]
pub struct GlibcRand {
    /// The last 31 values of the sequence, the oldest at `i`.
    r: [u32; 31],
    i: usize,
}

/// A 31×31 matrix over Z/2^32: the linear map from one 31-value window of the sequence to a
/// later one.
#[derive(Clone)]
pub struct Jump(Vec<[u32; 31]>);

impl Jump {
    fn identity() -> Jump {
        let mut m = vec![[0u32; 31]; 31];
        for (i, row) in m.iter_mut().enumerate() {
            row[i] = 1;
        }
        Jump(m)
    }

    /// One step: window `(x[n-31], ..., x[n-1])` to `(x[n-30], ..., x[n])`.
    fn step() -> Jump {
        let mut m = vec![[0u32; 31]; 31];
        for (i, row) in m.iter_mut().enumerate().take(30) {
            row[i + 1] = 1;
        }
        m[30][0] = 1;
        m[30][28] = 1;
        Jump(m)
    }

    fn mul(&self, o: &Jump) -> Jump {
        let mut m = vec![[0u32; 31]; 31];
        for (i, row) in m.iter_mut().enumerate() {
            for (k, &a) in self.0[i].iter().enumerate() {
                if a == 0 {
                    continue;
                }
                for (j, v) in row.iter_mut().enumerate() {
                    *v = v.wrapping_add(a.wrapping_mul(o.0[k][j]));
                }
            }
        }
        Jump(m)
    }

    /// `n` steps at once (by repeated squaring).
    pub fn steps(mut n: u64) -> Jump {
        let mut acc = Jump::identity();
        let mut p = Jump::step();
        while n > 0 {
            if n & 1 == 1 {
                acc = acc.mul(&p);
            }
            p = p.mul(&p);
            n >>= 1;
        }
        acc
    }

    fn apply(&self, w: &[u32; 31]) -> [u32; 31] {
        let mut out = [0u32; 31];
        for (o, row) in out.iter_mut().zip(&self.0) {
            *o = row
                .iter()
                .zip(w)
                .fold(0u32, |s, (a, b)| s.wrapping_add(a.wrapping_mul(*b)));
        }
        out
    }
}

impl GlibcRand {
    /// The window `x[3..34]`, where the uniform recurrence starts.
    fn window34(seed: u32) -> [u32; 31] {
        let seed = if seed == 0 { 1 } else { seed };
        let mut x = [0u32; 34];
        x[0] = seed;
        // __srandom_r: word = 16807 * word % 2147483647 by Schrage's method, on a long int
        // that starts as the (unsigned) seed.
        let mut word = i64::from(seed);
        for v in x.iter_mut().take(31).skip(1) {
            let hi = word / 127_773;
            let lo = word % 127_773;
            word = 16_807 * lo - 2_836 * hi;
            if word < 0 {
                word += 2_147_483_647;
            }
            *v = word as u32;
        }
        x[31] = x[0];
        x[32] = x[1];
        x[33] = x[2];
        let mut w = [0u32; 31];
        w.copy_from_slice(&x[3..34]);
        w
    }

    /// The generator after glibc's `srand(seed)`.
    pub fn new(seed: u32) -> GlibcRand {
        let mut g = GlibcRand {
            r: Self::window34(seed),
            i: 0,
        };
        g.skip(310);
        g
    }

    /// The generator after `srand(seed)` with `jump = Jump::steps(310 + k)`: its next output
    /// is output `k`. One matrix-vector product instead of `k` steps.
    pub fn at(seed: u32, jump: &Jump) -> GlibcRand {
        GlibcRand {
            r: jump.apply(&Self::window34(seed)),
            i: 0,
        }
    }

    /// The next `rand()` value (31 bits).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u32 {
        let v = self.r[self.i].wrapping_add(self.r[(self.i + 28) % 31]);
        self.r[self.i] = v;
        self.i = (self.i + 1) % 31;
        v >> 1
    }

    /// The next `(char)rand()`.
    pub fn next_byte(&mut self) -> u8 {
        self.next() as u8
    }

    /// Skip `n` values.
    pub fn skip(&mut self, n: usize) {
        for _ in 0..n {
            self.next();
        }
    }
}

/// `len` bytes of perftest's buffer fill after `srand(seed)`, starting at byte `offset`.
pub fn glibc_bytes(seed: u32, offset: usize, len: usize) -> Vec<u8> {
    let mut g = GlibcRand::at(seed, &Jump::steps(310 + offset as u64));
    (0..len).map(|_| g.next_byte()).collect()
}

/// Find the `srand(time(NULL))` seed for which bytes `offset..offset + data.len()` of the
/// `(char)rand()` stream equal `data`: seeds from `around - behind` to `around + ahead` are
/// tried, nearest to `around` first. Only the first 16 bytes decide; the caller compares the
/// rest.
pub fn find_glibc_seed(
    data: &[u8],
    offset: usize,
    around: u64,
    behind: u64,
    ahead: u64,
) -> Option<u32> {
    let probe = &data[..data.len().min(16)];
    if probe.is_empty() {
        return None;
    }
    let jump = Jump::steps(310 + offset as u64);
    let matches = |seed: u64| {
        let mut g = GlibcRand::at(seed as u32, &jump);
        probe.iter().all(|&b| g.next_byte() == b)
    };
    (0..=behind.max(ahead))
        .flat_map(|d| {
            let before = (d <= behind).then(|| around.checked_sub(d)).flatten();
            let after = (d > 0 && d <= ahead)
                .then(|| around.checked_add(d))
                .flatten();
            before.into_iter().chain(after)
        })
        .find(|&s| matches(s))
        .map(|s| s as u32)
}

/// Seconds since the Unix epoch now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_rand_known_answers() {
        // glibc: srand(1) (the default seed) gives 1804289383, 846930886, 1681692777, ...
        let mut g = GlibcRand::new(1);
        assert_eq!(
            [g.next(), g.next(), g.next(), g.next()],
            [1804289383, 846930886, 1681692777, 1714636915]
        );
        // srand(0) is srand(1).
        assert_eq!(GlibcRand::new(0).next(), 1804289383);
        // srand(42): 71876166, 708592740, 1483128881 (glibc 2.36).
        let mut g = GlibcRand::new(42);
        assert_eq!(
            [g.next(), g.next(), g.next()],
            [71876166, 708592740, 1483128881]
        );
    }

    #[test]
    fn glibc_rand_matches_the_host_libc() {
        // python3: ctypes.CDLL("libc.so.6").srand(1700000123); [rand() for _ in range(3)]
        let mut g = GlibcRand::new(1_700_000_123);
        assert_eq!(
            [g.next(), g.next(), g.next()],
            [463539148, 1303292453, 568767143]
        );
    }

    #[test]
    fn jumps_equal_steps() {
        for k in [0u64, 1, 2, 30, 31, 100, 4096, 65_537] {
            let mut a = GlibcRand::new(12345);
            a.skip(k as usize);
            let mut b = GlibcRand::at(12345, &Jump::steps(310 + k));
            for _ in 0..40 {
                assert_eq!(a.next(), b.next(), "offset {k}");
            }
        }
    }

    #[test]
    fn seeds_are_found_from_an_offset() {
        let data = glibc_bytes(1_700_000_123, 8192, 64);
        assert_eq!(
            find_glibc_seed(&data, 8192, 1_700_000_100, 10, 30),
            Some(1_700_000_123)
        );
        assert_eq!(find_glibc_seed(&data, 8192, 1_700_000_100, 10, 10), None);
    }

    #[test]
    fn patterns_differ_per_message_and_keep_page_zeros() {
        let a = expected(10_000, 7, 0, true);
        let b = expected(10_000, 7, 1, true);
        assert_ne!(a, b);
        assert_eq!((a[0], a[4096], a[8192]), (0, 0, 0));
        assert_eq!(first_mismatch(&a, &a), None);
        let mut c = a.clone();
        c[5000] ^= 1;
        assert_eq!(first_mismatch(&c, &a), Some((5000, c[5000], a[5000], 1)));
    }
}
