//! 24-bit packet sequence numbers with wrap-around arithmetic (IBTA 9.7.1).
//!
//! PSNs live on a circle of 2^24 values. Comparisons are made on the signed 24-bit difference:
//! `b` is "after" `a` when `(b - a) mod 2^24` lies in the half circle `1 ..= 2^23 - 1`. The
//! responder treats the 2^23 PSNs before the expected one as duplicates (IBTA 9.7.5.1.1).

use core::fmt;

/// A 24-bit packet sequence number.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Mask of the significant bits.
    pub const MASK: u32 = 0x00ff_ffff;
    /// Number of distinct PSNs.
    pub const MODULUS: u32 = 1 << 24;
    /// Half of the circle: the duplicate window.
    pub const HALF: i32 = 1 << 23;

    /// A PSN from the low 24 bits of `v`.
    pub const fn new(v: u32) -> Self {
        Psn(v & Self::MASK)
    }
    /// The PSN as an integer in `0..2^24`.
    pub const fn get(self) -> u32 {
        self.0
    }
    /// `self + n` modulo 2^24.
    #[must_use]
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & Self::MASK)
    }
    /// `self - n` modulo 2^24.
    #[must_use]
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & Self::MASK)
    }
    /// The next PSN.
    #[must_use]
    pub const fn next(self) -> Psn {
        self.add(1)
    }
    /// The signed distance `self - other` on the 24-bit circle, in `-2^23 ..= 2^23 - 1`.
    pub const fn diff(self, other: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back: sign extension does
        // the wrap-around (the same trick as rxe's psn_compare, written out).
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }
    /// `self` comes strictly before `other`.
    pub const fn before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }
    /// `self` comes strictly after `other`.
    pub const fn after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }
    /// `self` is `other` or comes before it.
    pub const fn before_or_eq(self, other: Psn) -> bool {
        self.diff(other) <= 0
    }
    /// Forward distance from `from` to `self` (`0..2^24`), e.g. packets in flight.
    pub const fn distance_from(self, from: Psn) -> u32 {
        self.0.wrapping_sub(from.0) & Self::MASK
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({})", self.0)
    }
}
impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps_at_2_pow_24() {
        let top = Psn::new(0xff_ffff);
        assert_eq!(top.next(), Psn::new(0));
        assert!(top.before(Psn::new(0)));
        assert!(Psn::new(0).after(top));
        assert_eq!(Psn::new(0).diff(top), 1);
        assert_eq!(Psn::new(3).sub(5), Psn::new(0xff_fffe));
        assert_eq!(Psn::new(2).distance_from(Psn::new(0xff_fffe)), 4);
        assert_eq!(Psn::new(0x1234_5678).get(), 0x34_5678);
    }

    #[test]
    fn half_circle_boundary() {
        let a = Psn::new(0);
        // 2^23 - 1 ahead is "after"; exactly 2^23 ahead is read as 2^23 behind.
        assert!(Psn::new((1 << 23) - 1).after(a));
        assert_eq!(Psn::new(1 << 23).diff(a), -(1 << 23));
        assert!(Psn::new(1 << 23).before(a));
    }

    proptest! {
        #[test]
        fn diff_inverts_add(a in 0u32..1 << 24, n in 0u32..(1 << 23)) {
            let p = Psn::new(a);
            prop_assert_eq!(p.add(n).diff(p), n as i32);
            prop_assert_eq!(p.diff(p.add(n)), -(n as i32));
            prop_assert_eq!(p.add(n).sub(n), p);
            prop_assert_eq!(p.add(n).distance_from(p), n);
        }
    }
}
