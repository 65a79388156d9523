//! The BTH opcode and the complete opcode table (IBTA Vol. 1 §9.2 table 38 and §9.3, the
//! Memory Placement Extensions for FLUSH/ATOMIC_WRITE, and Annex A17 for the RoCE v2 CNP).
//!
//! The top three bits of the opcode name the transport (RC, UC, RD, UD, CNP, XRC, vendor); the
//! low five bits name the operation. [`OPCODE_TABLE`] holds, for each of the 256 values, which
//! extension headers follow the BTH (and so at which offsets), the header length, and the
//! semantic flags the transport engines dispatch on.

use bitflags::bitflags;
use core::fmt;

/// A BTH opcode. Keeps every value, known or not: [`Opcode::info`] says which it is.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Opcode(pub u8);

/// The transport service an opcode belongs to (opcode bits 7:5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connection (0x00..0x1F).
    Rc,
    /// Unreliable Connection (0x20..0x3F).
    Uc,
    /// Reliable Datagram (0x40..0x5F).
    Rd,
    /// Unreliable Datagram (0x60..0x7F).
    Ud,
    /// 0x80..0x9F: RoCE v2 congestion notification (only 0x81 is defined).
    Cnp,
    /// Extended Reliable Connection (0xA0..0xBF).
    Xrc,
    /// 0xC0..0xFF: manufacturer specific.
    Vendor,
}

impl Transport {
    /// The short name used in opcode names (`RC_SEND_ONLY`).
    pub const fn prefix(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Rd => "RD",
            Transport::Ud => "UD",
            Transport::Cnp => "CNP",
            Transport::Xrc => "XRC",
            Transport::Vendor => "VENDOR",
        }
    }
}

/// Whether ferroce's wire layer handles an opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpStatus {
    /// RC, UC, UD, XRC and the CNP: parsed, emitted and executed.
    Supported,
    /// RD: headers decoded and shown, but no engine handles them.
    KnownUnsupported,
    /// Reserved or vendor-specific: the packet is malformed for us.
    Reserved,
}

bitflags! {
    /// Which extension headers follow the BTH. They appear on the wire in the order of the
    /// bits below (IBTA §9.2: RDETH, DETH, XRCETH, then the operation's own headers).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct Headers: u16 {
        /// Reliable Datagram ETH.
        const RDETH = 1 << 0;
        /// Datagram ETH.
        const DETH = 1 << 1;
        /// XRC ETH.
        const XRCETH = 1 << 2;
        /// FLUSH extended transport header (Memory Placement Extensions); precedes RETH.
        const FETH = 1 << 3;
        /// RDMA ETH.
        const RETH = 1 << 4;
        /// Atomic ETH.
        const ATOMIC_ETH = 1 << 5;
        /// ACK ETH.
        const AETH = 1 << 6;
        /// Atomic ACK ETH.
        const ATOMIC_ACK_ETH = 1 << 7;
        /// Immediate data.
        const IMM_DT = 1 << 8;
        /// Invalidate ETH.
        const IETH = 1 << 9;
        /// The 16 reserved bytes of a RoCE v2 CNP (Annex A17.9.3).
        const CNP_RSVD = 1 << 10;
    }
}

/// One extension header kind, with its size in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ext {
    /// RDETH, 4 bytes.
    Rdeth,
    /// DETH, 8 bytes.
    Deth,
    /// XRCETH, 4 bytes.
    Xrceth,
    /// FETH, 4 bytes.
    Feth,
    /// RETH, 16 bytes.
    Reth,
    /// AtomicETH, 28 bytes.
    AtomicEth,
    /// AETH, 4 bytes.
    Aeth,
    /// AtomicAckETH, 8 bytes.
    AtomicAckEth,
    /// ImmDt, 4 bytes.
    ImmDt,
    /// IETH, 4 bytes.
    Ieth,
    /// The CNP's 16 reserved bytes.
    CnpRsvd,
}

impl Ext {
    /// All extension headers in wire order.
    pub const ALL: [Ext; 11] = [
        Ext::Rdeth,
        Ext::Deth,
        Ext::Xrceth,
        Ext::Feth,
        Ext::Reth,
        Ext::AtomicEth,
        Ext::Aeth,
        Ext::AtomicAckEth,
        Ext::ImmDt,
        Ext::Ieth,
        Ext::CnpRsvd,
    ];
    /// Size on the wire.
    pub const fn size(self) -> usize {
        match self {
            Ext::Rdeth | Ext::Xrceth | Ext::Feth | Ext::Aeth | Ext::ImmDt | Ext::Ieth => 4,
            Ext::Deth | Ext::AtomicAckEth => 8,
            Ext::Reth | Ext::CnpRsvd => 16,
            Ext::AtomicEth => 28,
        }
    }
    /// The presence bit.
    pub const fn flag(self) -> Headers {
        Headers::from_bits_truncate(1 << self as u16)
    }
    /// The matching error layer.
    pub const fn layer(self) -> super::Layer {
        use super::Layer as L;
        match self {
            Ext::Rdeth => L::Rdeth,
            Ext::Deth => L::Deth,
            Ext::Xrceth => L::Xrceth,
            Ext::Feth => L::Feth,
            Ext::Reth => L::Reth,
            Ext::AtomicEth => L::AtomicEth,
            Ext::Aeth => L::Aeth,
            Ext::AtomicAckEth => L::AtomicAckEth,
            Ext::ImmDt => L::ImmDt,
            Ext::Ieth => L::Ieth,
            Ext::CnpRsvd => L::CnpReserved,
        }
    }
}

bitflags! {
    /// Semantic flags of an opcode.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct OpFlags: u32 {
        /// Sent by a requester.
        const REQUEST = 1 << 0;
        /// Sent by a responder (ACK, read response, atomic ACK).
        const RESPONSE = 1 << 1;
        /// First packet of a message (also set on ONLY).
        const FIRST = 1 << 2;
        /// Middle packet of a message.
        const MIDDLE = 1 << 3;
        /// Last packet of a message (also set on ONLY).
        const LAST = 1 << 4;
        /// May carry payload bytes.
        const PAYLOAD = 1 << 5;
        /// Carries immediate data.
        const IMMEDIATE = 1 << 6;
        /// Carries an R_Key to invalidate.
        const INVALIDATE = 1 << 7;
        /// A SEND.
        const SEND = 1 << 8;
        /// An RDMA WRITE.
        const WRITE = 1 << 9;
        /// An RDMA READ (request or response).
        const READ = 1 << 10;
        /// An atomic (CMP_SWAP, FETCH_ADD or its acknowledgement).
        const ATOMIC = 1 << 11;
        /// A plain acknowledgement.
        const ACK = 1 << 12;
        /// A FLUSH.
        const FLUSH = 1 << 13;
        /// An ATOMIC WRITE.
        const ATOMIC_WRITE = 1 << 14;
        /// A RoCE v2 congestion notification packet.
        const CNP = 1 << 15;
        /// FIRST/MIDDLE packets: the payload is exactly one path MTU and carries no pad.
        const FULL_MTU = 1 << 16;
        /// The payload has a fixed size of 8 bytes (ATOMIC_WRITE).
        const FIXED8 = 1 << 17;
        /// RD RESYNC.
        const RESYNC = 1 << 18;
        /// Consumes a receive WQE at the responder (SENDs and WRITE with immediate).
        const CONSUMES_RWQE = 1 << 19;
    }
}

impl OpFlags {
    /// FIRST and LAST: a single-packet message.
    pub const ONLY: OpFlags = OpFlags::FIRST.union(OpFlags::LAST);
}

/// Everything the table knows about one opcode value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpInfo {
    /// Full name, e.g. `RC_RDMA_WRITE_FIRST` (names follow the IBTA's operation names).
    pub name: &'static str,
    /// The transport service (opcode bits 7:5).
    pub transport: Transport,
    /// Whether ferroce handles it, decodes it only, or treats it as reserved.
    pub status: OpStatus,
    /// The extension headers that follow the BTH.
    pub headers: Headers,
    /// What the packet means (request or response, its place in a message, the operation).
    pub flags: OpFlags,
    /// BTH plus extension headers, in bytes.
    pub header_len: u8,
}

impl OpInfo {
    /// Offset of an extension header from the start of the BTH, if the opcode carries it.
    pub const fn offset(&self, ext: Ext) -> Option<usize> {
        if !self.headers.contains(ext.flag()) {
            return None;
        }
        let mut off = super::BTH_LEN;
        let mut i = 0;
        while i < Ext::ALL.len() {
            let e = Ext::ALL[i];
            if e as u16 == ext as u16 {
                return Some(off);
            }
            if self.headers.contains(e.flag()) {
                off += e.size();
            }
            i += 1;
        }
        None
    }
    /// True for opcodes ferroce parses and emits.
    pub const fn is_supported(&self) -> bool {
        matches!(self.status, OpStatus::Supported)
    }
    /// True for reserved and vendor opcodes.
    pub const fn is_reserved(&self) -> bool {
        matches!(self.status, OpStatus::Reserved)
    }
}

/// The operation part of an opcode (low five bits), as in the RC column of IBTA table 38.
const fn base_op(op: u8) -> (Headers, OpFlags) {
    use Headers as H;
    use OpFlags as F;
    let req_send = F::REQUEST.union(F::SEND).union(F::PAYLOAD);
    let req_write = F::REQUEST.union(F::WRITE).union(F::PAYLOAD);
    let resp_read = F::RESPONSE.union(F::READ);
    match op {
        0x00 => (H::empty(), req_send.union(F::FIRST).union(F::FULL_MTU)),
        0x01 => (H::empty(), req_send.union(F::MIDDLE).union(F::FULL_MTU)),
        0x02 => (H::empty(), req_send.union(F::LAST).union(F::CONSUMES_RWQE)),
        0x03 => (
            H::IMM_DT,
            req_send
                .union(F::LAST)
                .union(F::IMMEDIATE)
                .union(F::CONSUMES_RWQE),
        ),
        0x04 => (H::empty(), req_send.union(F::ONLY).union(F::CONSUMES_RWQE)),
        0x05 => (
            H::IMM_DT,
            req_send
                .union(F::ONLY)
                .union(F::IMMEDIATE)
                .union(F::CONSUMES_RWQE),
        ),
        0x06 => (H::RETH, req_write.union(F::FIRST).union(F::FULL_MTU)),
        0x07 => (H::empty(), req_write.union(F::MIDDLE).union(F::FULL_MTU)),
        0x08 => (H::empty(), req_write.union(F::LAST)),
        0x09 => (
            H::IMM_DT,
            req_write
                .union(F::LAST)
                .union(F::IMMEDIATE)
                .union(F::CONSUMES_RWQE),
        ),
        0x0A => (H::RETH, req_write.union(F::ONLY)),
        0x0B => (
            H::RETH.union(H::IMM_DT),
            req_write
                .union(F::ONLY)
                .union(F::IMMEDIATE)
                .union(F::CONSUMES_RWQE),
        ),
        0x0C => (H::RETH, F::REQUEST.union(F::READ).union(F::ONLY)),
        0x0D => (
            H::AETH,
            resp_read
                .union(F::FIRST)
                .union(F::PAYLOAD)
                .union(F::FULL_MTU),
        ),
        0x0E => (
            H::empty(),
            resp_read
                .union(F::MIDDLE)
                .union(F::PAYLOAD)
                .union(F::FULL_MTU),
        ),
        0x0F => (H::AETH, resp_read.union(F::LAST).union(F::PAYLOAD)),
        0x10 => (H::AETH, resp_read.union(F::ONLY).union(F::PAYLOAD)),
        0x11 => (H::AETH, F::RESPONSE.union(F::ACK).union(F::ONLY)),
        0x12 => (
            H::AETH.union(H::ATOMIC_ACK_ETH),
            F::RESPONSE.union(F::ATOMIC).union(F::ONLY),
        ),
        0x13 | 0x14 => (H::ATOMIC_ETH, F::REQUEST.union(F::ATOMIC).union(F::ONLY)),
        0x15 => (H::empty(), F::REQUEST.union(F::RESYNC).union(F::ONLY)),
        0x16 => (
            H::IETH,
            req_send
                .union(F::LAST)
                .union(F::INVALIDATE)
                .union(F::CONSUMES_RWQE),
        ),
        0x17 => (
            H::IETH,
            req_send
                .union(F::ONLY)
                .union(F::INVALIDATE)
                .union(F::CONSUMES_RWQE),
        ),
        0x1C => (
            H::FETH.union(H::RETH),
            F::REQUEST.union(F::FLUSH).union(F::ONLY),
        ),
        0x1D => (
            H::RETH,
            F::REQUEST
                .union(F::ATOMIC_WRITE)
                .union(F::ONLY)
                .union(F::PAYLOAD)
                .union(F::FIXED8),
        ),
        _ => (H::empty(), F::empty()),
    }
}

/// Which operation codes each transport defines.
const fn op_valid(t: Transport, op: u8) -> bool {
    match t {
        Transport::Rc => matches!(op, 0x00..=0x14 | 0x16 | 0x17 | 0x1C | 0x1D),
        Transport::Uc => op <= 0x0B,
        // RD: every RC operation up to FETCH_ADD plus RESYNC (0x15).
        Transport::Rd => op <= 0x15,
        Transport::Ud => matches!(op, 0x04 | 0x05),
        Transport::Xrc => matches!(op, 0x00..=0x14 | 0x16 | 0x17),
        Transport::Cnp => op == 0x01,
        Transport::Vendor => false,
    }
}

const fn transport_of(code: u8) -> Transport {
    match code >> 5 {
        0 => Transport::Rc,
        1 => Transport::Uc,
        2 => Transport::Rd,
        3 => Transport::Ud,
        4 => Transport::Cnp,
        5 => Transport::Xrc,
        _ => Transport::Vendor,
    }
}

macro_rules! op_names {
    ($p:literal) => {
        [
            concat!($p, "_SEND_FIRST"),
            concat!($p, "_SEND_MIDDLE"),
            concat!($p, "_SEND_LAST"),
            concat!($p, "_SEND_LAST_WITH_IMMEDIATE"),
            concat!($p, "_SEND_ONLY"),
            concat!($p, "_SEND_ONLY_WITH_IMMEDIATE"),
            concat!($p, "_RDMA_WRITE_FIRST"),
            concat!($p, "_RDMA_WRITE_MIDDLE"),
            concat!($p, "_RDMA_WRITE_LAST"),
            concat!($p, "_RDMA_WRITE_LAST_WITH_IMMEDIATE"),
            concat!($p, "_RDMA_WRITE_ONLY"),
            concat!($p, "_RDMA_WRITE_ONLY_WITH_IMMEDIATE"),
            concat!($p, "_RDMA_READ_REQUEST"),
            concat!($p, "_RDMA_READ_RESPONSE_FIRST"),
            concat!($p, "_RDMA_READ_RESPONSE_MIDDLE"),
            concat!($p, "_RDMA_READ_RESPONSE_LAST"),
            concat!($p, "_RDMA_READ_RESPONSE_ONLY"),
            concat!($p, "_ACKNOWLEDGE"),
            concat!($p, "_ATOMIC_ACKNOWLEDGE"),
            concat!($p, "_COMPARE_SWAP"),
            concat!($p, "_FETCH_ADD"),
            concat!($p, "_RESYNC"),
            concat!($p, "_SEND_LAST_WITH_INVALIDATE"),
            concat!($p, "_SEND_ONLY_WITH_INVALIDATE"),
            "RESERVED",
            "RESERVED",
            "RESERVED",
            "RESERVED",
            concat!($p, "_FLUSH"),
            concat!($p, "_ATOMIC_WRITE"),
            "RESERVED",
            "RESERVED",
        ]
    };
}

const RC_NAMES: [&str; 32] = op_names!("RC");
const UC_NAMES: [&str; 32] = op_names!("UC");
const RD_NAMES: [&str; 32] = op_names!("RD");
const UD_NAMES: [&str; 32] = op_names!("UD");
const XRC_NAMES: [&str; 32] = op_names!("XRC");

const fn build_info(code: u8) -> OpInfo {
    let t = transport_of(code);
    let op = code & 0x1f;
    let reserved = OpInfo {
        name: "RESERVED",
        transport: t,
        status: OpStatus::Reserved,
        headers: Headers::empty(),
        flags: OpFlags::empty(),
        header_len: super::BTH_LEN as u8,
    };
    if !op_valid(t, op) {
        return reserved;
    }
    if let Transport::Cnp = t {
        return OpInfo {
            name: "CNP",
            transport: t,
            status: OpStatus::Supported,
            headers: Headers::CNP_RSVD,
            flags: OpFlags::CNP.union(OpFlags::ONLY),
            header_len: (super::BTH_LEN + 16) as u8,
        };
    }
    let (mut headers, flags) = base_op(op);
    let (name, status) = match t {
        Transport::Rc => (RC_NAMES[op as usize], OpStatus::Supported),
        Transport::Uc => (UC_NAMES[op as usize], OpStatus::Supported),
        Transport::Ud => {
            headers = headers.union(Headers::DETH);
            (UD_NAMES[op as usize], OpStatus::Supported)
        }
        Transport::Rd => {
            headers = headers.union(Headers::RDETH);
            if flags.contains(OpFlags::REQUEST) {
                headers = headers.union(Headers::DETH);
            }
            (RD_NAMES[op as usize], OpStatus::KnownUnsupported)
        }
        Transport::Xrc => {
            if flags.contains(OpFlags::REQUEST) {
                headers = headers.union(Headers::XRCETH);
            }
            (XRC_NAMES[op as usize], OpStatus::Supported)
        }
        Transport::Cnp | Transport::Vendor => return reserved,
    };
    let mut len = super::BTH_LEN;
    let mut i = 0;
    while i < Ext::ALL.len() {
        if headers.contains(Ext::ALL[i].flag()) {
            len += Ext::ALL[i].size();
        }
        i += 1;
    }
    OpInfo {
        name,
        transport: t,
        status,
        headers,
        flags,
        header_len: len as u8,
    }
}

const fn build_table() -> [OpInfo; 256] {
    let mut t = [build_info(0); 256];
    let mut i = 0;
    while i < 256 {
        t[i] = build_info(i as u8);
        i += 1;
    }
    t
}

/// The opcode table, indexed by the opcode byte.
pub static OPCODE_TABLE: [OpInfo; 256] = build_table();

#[allow(missing_docs)]
impl Opcode {
    pub const RC_SEND_FIRST: Opcode = Opcode(0x00);
    pub const RC_SEND_MIDDLE: Opcode = Opcode(0x01);
    pub const RC_SEND_LAST: Opcode = Opcode(0x02);
    pub const RC_SEND_LAST_IMM: Opcode = Opcode(0x03);
    pub const RC_SEND_ONLY: Opcode = Opcode(0x04);
    pub const RC_SEND_ONLY_IMM: Opcode = Opcode(0x05);
    pub const RC_WRITE_FIRST: Opcode = Opcode(0x06);
    pub const RC_WRITE_MIDDLE: Opcode = Opcode(0x07);
    pub const RC_WRITE_LAST: Opcode = Opcode(0x08);
    pub const RC_WRITE_LAST_IMM: Opcode = Opcode(0x09);
    pub const RC_WRITE_ONLY: Opcode = Opcode(0x0A);
    pub const RC_WRITE_ONLY_IMM: Opcode = Opcode(0x0B);
    pub const RC_READ_REQUEST: Opcode = Opcode(0x0C);
    pub const RC_READ_RESPONSE_FIRST: Opcode = Opcode(0x0D);
    pub const RC_READ_RESPONSE_MIDDLE: Opcode = Opcode(0x0E);
    pub const RC_READ_RESPONSE_LAST: Opcode = Opcode(0x0F);
    pub const RC_READ_RESPONSE_ONLY: Opcode = Opcode(0x10);
    pub const RC_ACK: Opcode = Opcode(0x11);
    pub const RC_ATOMIC_ACK: Opcode = Opcode(0x12);
    pub const RC_CMP_SWAP: Opcode = Opcode(0x13);
    pub const RC_FETCH_ADD: Opcode = Opcode(0x14);
    pub const RC_SEND_LAST_INV: Opcode = Opcode(0x16);
    pub const RC_SEND_ONLY_INV: Opcode = Opcode(0x17);
    pub const RC_FLUSH: Opcode = Opcode(0x1C);
    pub const RC_ATOMIC_WRITE: Opcode = Opcode(0x1D);
    pub const UC_SEND_ONLY: Opcode = Opcode(0x24);
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    pub const UD_SEND_ONLY_IMM: Opcode = Opcode(0x65);
    pub const CNP: Opcode = Opcode(0x81);

    /// The XRC opcode of the same operation (an RC opcode's low five bits under XRC's
    /// prefix, 101b).
    pub const fn to_xrc(self) -> Opcode {
        Opcode(0xA0 | (self.0 & 0x1F))
    }
    /// The RC opcode of the same operation (XRC's operations are RC's, IBTA Vol. 1 §9.2).
    pub const fn to_rc(self) -> Opcode {
        Opcode(self.0 & 0x1F)
    }
    /// The table entry.
    pub fn info(self) -> &'static OpInfo {
        &OPCODE_TABLE[self.0 as usize]
    }
    /// The opcode's name (`RESERVED` for reserved and vendor values).
    pub fn name(self) -> &'static str {
        self.info().name
    }
    /// The transport (opcode bits 7:5).
    pub fn transport(self) -> Transport {
        self.info().transport
    }
    /// The semantic flags.
    pub fn flags(self) -> OpFlags {
        self.info().flags
    }
    /// The extension headers that follow the BTH.
    pub fn headers(self) -> Headers {
        self.info().headers
    }
    /// Shorthand for `flags().contains(f)`.
    pub fn is(self, f: OpFlags) -> bool {
        self.info().flags.contains(f)
    }
    /// Every opcode the table defines (supported and known-unsupported).
    pub fn all_known() -> impl Iterator<Item = Opcode> {
        (0..=255u8).map(Opcode).filter(|o| !o.info().is_reserved())
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(0x{:02x})", self.name(), self.0)
    }
}
impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.info().is_reserved() {
            write!(f, "RESERVED_0x{:02x}", self.0)
        } else {
            f.write_str(self.name())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rc_layouts_match_ibta_table() {
        // (opcode, header length, extension headers) from IBTA Vol. 1 table 38 / roce-facts.md.
        let rc: &[(u8, usize, Headers)] = &[
            (0x00, 12, Headers::empty()),
            (0x03, 16, Headers::IMM_DT),
            (0x06, 28, Headers::RETH),
            (0x0B, 32, Headers::RETH.union(Headers::IMM_DT)),
            (0x0C, 28, Headers::RETH),
            (0x0D, 16, Headers::AETH),
            (0x0E, 12, Headers::empty()),
            (0x11, 16, Headers::AETH),
            (0x12, 24, Headers::AETH.union(Headers::ATOMIC_ACK_ETH)),
            (0x13, 40, Headers::ATOMIC_ETH),
            (0x17, 16, Headers::IETH),
            (0x1C, 32, Headers::FETH.union(Headers::RETH)),
            (0x1D, 28, Headers::RETH),
            (0x81, 28, Headers::CNP_RSVD),
            (0x64, 20, Headers::DETH),
            (0x65, 24, Headers::DETH.union(Headers::IMM_DT)),
        ];
        for &(code, len, hdrs) in rc {
            let i = Opcode(code).info();
            assert_eq!(i.header_len as usize, len, "{}", i.name);
            assert_eq!(i.headers, hdrs, "{}", i.name);
        }
    }

    #[test]
    fn offsets_follow_wire_order() {
        let i = Opcode::RC_WRITE_ONLY_IMM.info();
        assert_eq!(i.offset(Ext::Reth), Some(12));
        assert_eq!(i.offset(Ext::ImmDt), Some(28));
        assert_eq!(i.offset(Ext::Aeth), None);
        let i = Opcode::RC_ATOMIC_ACK.info();
        assert_eq!(i.offset(Ext::Aeth), Some(12));
        assert_eq!(i.offset(Ext::AtomicAckEth), Some(16));
        let i = Opcode::RC_FLUSH.info();
        assert_eq!(i.offset(Ext::Feth), Some(12));
        assert_eq!(i.offset(Ext::Reth), Some(16));
        // RD request: RDETH, DETH, then RETH.
        let i = Opcode(0x4A).info();
        assert_eq!(i.name, "RD_RDMA_WRITE_ONLY");
        assert_eq!(i.offset(Ext::Rdeth), Some(12));
        assert_eq!(i.offset(Ext::Deth), Some(16));
        assert_eq!(i.offset(Ext::Reth), Some(24));
        // XRC request: XRCETH before the operation's headers; XRC responses carry none.
        let i = Opcode(0xAC).info();
        assert_eq!(i.name, "XRC_RDMA_READ_REQUEST");
        assert_eq!(i.offset(Ext::Xrceth), Some(12));
        assert_eq!(i.offset(Ext::Reth), Some(16));
        assert_eq!(Opcode(0xB1).headers(), Headers::AETH);
    }

    #[test]
    fn transports_and_counts() {
        let count = |t: Transport| Opcode::all_known().filter(|o| o.transport() == t).count();
        assert_eq!(count(Transport::Rc), 25);
        assert_eq!(count(Transport::Uc), 12);
        assert_eq!(count(Transport::Rd), 22);
        assert_eq!(count(Transport::Ud), 2);
        assert_eq!(count(Transport::Xrc), 23);
        assert_eq!(count(Transport::Cnp), 1);
        assert!(Opcode(0x80).info().is_reserved());
        assert!(Opcode(0x18).info().is_reserved());
        assert!(Opcode(0xC0).info().is_reserved());
        assert!(Opcode(0x2C).info().is_reserved(), "UC has no READ");
        assert_eq!(Opcode(0x44).info().status, OpStatus::KnownUnsupported);
        assert_eq!(Opcode::CNP.to_string(), "CNP");
        assert_eq!(Opcode(0x1e).to_string(), "RESERVED_0x1e");
    }

    #[test]
    fn semantic_flags() {
        assert!(Opcode::RC_SEND_ONLY.is(OpFlags::ONLY));
        assert!(Opcode::RC_READ_RESPONSE_MIDDLE.is(OpFlags::MIDDLE | OpFlags::RESPONSE));
        assert!(!Opcode::RC_READ_RESPONSE_MIDDLE
            .headers()
            .contains(Headers::AETH));
        assert!(Opcode::RC_WRITE_LAST_IMM.is(OpFlags::CONSUMES_RWQE | OpFlags::IMMEDIATE));
        assert!(!Opcode::RC_WRITE_LAST.is(OpFlags::CONSUMES_RWQE));
        assert!(Opcode::RC_READ_REQUEST.is(OpFlags::REQUEST | OpFlags::READ));
        assert!(!Opcode::RC_READ_REQUEST.is(OpFlags::PAYLOAD));
        assert!(Opcode(0x2B).is(OpFlags::WRITE | OpFlags::IMMEDIATE));
    }
}
