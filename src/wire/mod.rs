//! The RoCE v2 wire format: zero-copy header views, owned `Repr` parse/emit pairs, the opcode
//! table, 24-bit PSN arithmetic and the ICRC.
//!
//! # The contract of this module (read before changing anything here)
//!
//! 1. **Parsing never panics, whatever the bytes.** Every `*::new_checked(buf)` and every
//!    `*Repr::parse(..)` checks the length of its buffer first and returns a typed [`Error`]
//!    when it is short or inconsistent. Once `new_checked` (or `check_len`) has returned `Ok`,
//!    no getter of that view indexes out of bounds. The same holds for [`parse_frame`] and
//!    [`parse_roce`], which are the entry points the receive path uses; the fuzz targets in
//!    `fuzz/` and the proptests over arbitrary bytes exercise exactly this promise.
//! 2. **Emitting never allocates.** `*Repr::emit(buf, ..)` writes into a caller-provided buffer.
//!    It returns [`Error::BufferTooSmall`] if the buffer is shorter than `Repr::buffer_len()` and
//!    never panics for any `Repr` value; setters on a view never panic once `check_len` is `Ok`.
//! 3. **`new_unchecked` views trust the caller.** They exist for the emit path, where the caller
//!    has just sized the buffer; their getters may panic on a short buffer.
//! 4. **Round trips.** For every well-formed packet built from a `Repr`: `emit` then `parse`
//!    gives back the same `Repr`, and `parse` then `emit` gives back the same bytes. Fields the
//!    `Repr` does not model are documented on the `Repr` (reserved bits and pad bytes are
//!    emitted as zero; IPv4 options are skipped on parse and not re-emitted).
//! 5. **The ICRC is verified without copying the packet** (see [`icrc`]): masked header bytes are
//!    fed to the CRC from a small stack buffer and the payload straight from the frame.
//!    Under `cfg(fuzzing)` a bad ICRC is accepted so that fuzzers reach the deeper layers.
//!
//! Layers and sizes follow the IBTA specification Vol. 1 ch. 9 (transport headers) and its
//! Annex A17 (RoCE v2 framing and ICRC rules).

use core::fmt;
use core::ops::Range;

pub mod aeth;
pub mod bth;
pub mod eth;
pub mod ext;
pub mod grh;
pub mod icrc;
pub mod ip;
pub mod mad;
pub mod opcode;
pub mod packet;
pub mod pretty;
pub mod psn;
pub mod types;
pub mod udp;

pub use aeth::{AethRepr, CreditCode, NakCode, RnrTimer, Syndrome};
pub use bth::BthRepr;
pub use eth::{EthernetRepr, MacAddr, VlanTag};
pub use ext::{AtomicEthRepr, DethRepr, ExtRepr, RethRepr};
pub use ip::{Ecn, IpRepr, Ipv4Repr, Ipv6Repr};
pub use opcode::{Headers, OpFlags, OpInfo, OpStatus, Opcode, Transport};
pub use packet::{parse_frame, parse_roce, FrameRepr, ParsedFrame, ParsedRoce, RoceRepr};
pub use psn::Psn;
pub use types::{PKey, QKey, QpNumber, RKey};
pub use udp::UdpRepr;

/// A byte range of a header field.
pub(crate) type Field = Range<usize>;

/// The UDP destination port of RoCE v2 (IANA assignment, IBTA Annex A17.2.3).
pub const ROCE_V2_PORT: u16 = 4791;

/// Which header a length or consistency error refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    /// Ethernet II header.
    Ethernet,
    /// 802.1Q VLAN tag.
    Vlan,
    /// IPv4 header.
    Ipv4,
    /// IPv6 header.
    Ipv6,
    /// UDP header.
    Udp,
    /// Base Transport Header.
    Bth,
    /// Reliable Datagram Extended Transport Header.
    Rdeth,
    /// Datagram Extended Transport Header.
    Deth,
    /// XRC Extended Transport Header.
    Xrceth,
    /// FLUSH Extended Transport Header.
    Feth,
    /// RDMA Extended Transport Header.
    Reth,
    /// Atomic Extended Transport Header.
    AtomicEth,
    /// ACK Extended Transport Header.
    Aeth,
    /// Atomic ACK Extended Transport Header.
    AtomicAckEth,
    /// Immediate data.
    ImmDt,
    /// Invalidate Extended Transport Header.
    Ieth,
    /// The 16 reserved bytes of a RoCE v2 CNP.
    CnpReserved,
    /// The payload (and its pad).
    Payload,
    /// The invariant CRC trailer.
    Icrc,
    /// The common MAD header (QP1 payloads).
    Mad,
    /// A MAD's attribute data (a CM message, ClassPortInfo, the RDMA-CM header).
    MadAttribute,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Layer::Ethernet => "Ethernet",
            Layer::Vlan => "802.1Q",
            Layer::Ipv4 => "IPv4",
            Layer::Ipv6 => "IPv6",
            Layer::Udp => "UDP",
            Layer::Bth => "BTH",
            Layer::Rdeth => "RDETH",
            Layer::Deth => "DETH",
            Layer::Xrceth => "XRCETH",
            Layer::Feth => "FETH",
            Layer::Reth => "RETH",
            Layer::AtomicEth => "AtomicETH",
            Layer::Aeth => "AETH",
            Layer::AtomicAckEth => "AtomicAckETH",
            Layer::ImmDt => "ImmDt",
            Layer::Ieth => "IETH",
            Layer::CnpReserved => "CNP reserved",
            Layer::Payload => "payload",
            Layer::Icrc => "ICRC",
            Layer::Mad => "MAD header",
            Layer::MadAttribute => "MAD attribute",
        };
        f.write_str(s)
    }
}

/// Everything that can be wrong with a packet or an emit request. Small and `Copy`: the receive
/// path counts these, it does not allocate for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer ends before the header does.
    #[error("truncated {layer}: need {needed} bytes, have {had}")]
    Truncated {
        /// The header that is cut short.
        layer: Layer,
        /// Bytes it needs.
        needed: usize,
        /// Bytes the buffer has.
        had: usize,
    },
    /// A length field disagrees with the bytes present or with another length field.
    #[error("{layer} length field says {declared} bytes, {actual} available")]
    BadLength {
        /// The header whose length field is wrong.
        layer: Layer,
        /// The length it declares.
        declared: usize,
        /// The length actually available.
        actual: usize,
    },
    /// The ICRC trailer does not match the computed one.
    #[error("bad ICRC: expected {expected:08x}, found {found:08x}")]
    BadIcrc {
        /// The ICRC computed over the packet.
        expected: u32,
        /// The ICRC in the packet's trailer.
        found: u32,
    },
    /// A reserved or vendor opcode.
    #[error("unknown opcode 0x{0:02x}")]
    UnknownOpcode(u8),
    /// A known opcode this path does not handle (RD, XRC, or an opcode not valid on the QP).
    #[error("unsupported opcode {0}")]
    UnsupportedOpcode(Opcode),
    /// The pad count is larger than the payload, or payload + pad is not a multiple of 4.
    #[error("pad count {pad} inconsistent with {data} bytes of payload+pad")]
    BadPadCount {
        /// The BTH's pad count.
        pad: u8,
        /// Bytes of payload and pad.
        data: usize,
    },
    /// The opcode forbids or fixes the payload size and the packet disagrees.
    #[error("{opcode} may not carry {len} bytes of payload")]
    BadPayloadLength {
        /// The packet's opcode.
        opcode: Opcode,
        /// Its payload length.
        len: usize,
    },
    /// A FIRST or MIDDLE packet carries a pad.
    #[error("{opcode} must not carry a pad (pad count {pad})")]
    PadOnNonLast {
        /// The FIRST or MIDDLE opcode.
        opcode: Opcode,
        /// The pad count it carries.
        pad: u8,
    },
    /// The UDP destination port is not 4791.
    #[error("not RoCE v2: UDP destination port {0}")]
    NotRoceV2Port(u16),
    /// The IP version nibble is neither 4 nor 6 (or disagrees with the ethertype).
    #[error("bad IP version {0}")]
    BadIpVersion(u8),
    /// The IP payload is not UDP (IPv6 extension headers included).
    #[error("not UDP: IP protocol/next header {0}")]
    NotUdp(u8),
    /// The Ethernet frame carries neither IPv4 nor IPv6.
    #[error("not IP: ethertype 0x{0:04x}")]
    NotIp(u16),
    /// An IPv4 fragment: RoCE v2 packets must not be fragmented.
    #[error("IPv4 fragment carrying RoCE v2")]
    Fragmented,
    /// The IPv4 header length field is below 5 words.
    #[error("bad IPv4 header length {0} words")]
    BadIhl(u8),
    /// The extension headers given to an emit do not match the opcode's layout.
    #[error("extension headers do not match opcode {0}")]
    HeaderMismatch(Opcode),
    /// A value does not fit its field (e.g. a payload longer than UDP can carry).
    #[error("{0} does not fit its field")]
    FieldOverflow(&'static str),
    /// A MAD of another management class than the parser reads (e.g. not CM).
    #[error("MAD class 0x{0:02x} is not the expected class")]
    MadClass(u8),
    /// The output buffer is shorter than `buffer_len()`.
    #[error("emit buffer too small: need {needed} bytes, have {had}")]
    BufferTooSmall {
        /// Bytes the emit needs.
        needed: usize,
        /// Bytes the buffer has.
        had: usize,
    },
}

/// Result type of this module.
pub type Result<T> = core::result::Result<T, Error>;

/// Check that `buf` holds at least `needed` bytes of `layer`.
#[inline]
pub(crate) fn need(layer: Layer, buf: &[u8], needed: usize) -> Result<()> {
    if buf.len() < needed {
        Err(Error::Truncated {
            layer,
            needed,
            had: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// Check that an emit buffer holds at least `needed` bytes ([`Error::BufferTooSmall`] if not).
#[inline]
pub(crate) fn need_room(buf: &[u8], needed: usize) -> Result<()> {
    if buf.len() < needed {
        Err(Error::BufferTooSmall {
            needed,
            had: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// Length of the Base Transport Header (IBTA 9.2): here, not in [`bth`], so that the opcode
/// table can size headers without importing the BTH module that imports it.
pub(crate) const BTH_LEN: usize = 12;

#[inline]
pub(crate) fn rd16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
#[inline]
pub(crate) fn rd24(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}
#[inline]
pub(crate) fn rd32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
#[inline]
pub(crate) fn rd64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}
#[inline]
pub(crate) fn wr16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
#[inline]
pub(crate) fn wr24(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}
#[inline]
pub(crate) fn wr32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
#[inline]
pub(crate) fn wr64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
