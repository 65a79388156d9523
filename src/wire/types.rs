//! Distinct newtypes for the identifiers that travel in transport headers, so that a QPN can
//! never be passed where an R_Key is expected.

use core::fmt;

/// A 24-bit queue pair number (BTH DestQP, DETH SrcQP).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct QpNumber(u32);

impl QpNumber {
    /// The mask of the 24 significant bits.
    pub const MASK: u32 = 0x00ff_ffff;
    /// QP1, the general services QP (connection management MADs).
    pub const GSI: QpNumber = QpNumber(1);

    /// A QPN from the low 24 bits of `v` (the high bits are discarded, as on the wire).
    pub const fn new(v: u32) -> Self {
        QpNumber(v & Self::MASK)
    }
    /// The QPN as an integer.
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Debug for QpNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QP 0x{:06x}", self.0)
    }
}
impl fmt::Display for QpNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:06x}", self.0)
    }
}

macro_rules! key_type {
    ($(#[$m:meta])* $name:ident, $int:ty, $w:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub $int);
        impl $name {
            /// The key as an integer.
            pub const fn get(self) -> $int {
                self.0
            }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "(0x{:0", $w, "x})"), self.0)
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!("0x{:0", $w, "x}"), self.0)
            }
        }
    };
}

key_type!(
    /// A remote key (RETH, AtomicETH, IETH): names a memory region to the responder.
    RKey, u32, "8"
);
key_type!(
    /// A queue key (DETH), used by UD QPs.
    QKey, u32, "8"
);
key_type!(
    /// A partition key (BTH). RoCE uses the default 0xFFFF.
    PKey, u16, "4"
);

impl PKey {
    /// The default full-membership partition key.
    pub const DEFAULT: PKey = PKey(0xffff);
}
