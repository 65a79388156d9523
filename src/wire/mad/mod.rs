//! Management datagrams (MADs, IBTA Vol. 1 §13.4): the 24-byte common header and the classes
//! ferroce speaks. A MAD travels as the whole payload of a UD SEND to QP1 (the GSI, Q_Key
//! 0x80010000) and is exactly [`MAD_LEN`] = 256 bytes:
//!
//! ```text
//! byte 0    BaseVersion (1)
//! byte 1    MgmtClass (0x07 = communication management)
//! byte 2    ClassVersion (2 for the CM)
//! byte 3    R(1) Method(7)            (the R bit is set in responses: GetResp = 0x81)
//! 4..6      Status
//! 6..8      ClassSpecific
//! 8..16     TransactionID
//! 16..18    AttributeID
//! 18..20    reserved
//! 20..24    AttributeModifier
//! 24..256   attribute data (232 bytes)
//! ```
//!
//! [`cm`] has the communication management attributes (REQ, REP, RTU, ...),
//! [`class_port_info`] the ClassPortInfo attribute every class has, and [`rdma_cm`] the
//! RDMA-CM conventions carried inside CM messages (service IDs, the private-data header).
//!
//! The module keeps the contract of [`crate::wire`]: parsing never panics on any bytes, emit
//! never allocates, and `parse` then `emit` reproduces the bytes of every MAD whose reserved
//! fields are zero (reserved fields are not modelled and are emitted as zero).

use super::{need, Error, Layer, Result};
use core::fmt;

pub mod class_port_info;
pub mod cm;
pub mod rdma_cm;

pub use class_port_info::ClassPortInfoRepr;
pub use cm::{CmMadRepr, CmMessage};

/// Bytes of a MAD on the wire (IBTA §13.4.1: every MAD carried by a GMP is 256 bytes).
pub const MAD_LEN: usize = 256;
/// Bytes of the common MAD header.
pub const HEADER_LEN: usize = 24;
/// Bytes of attribute data after the common header.
pub const DATA_LEN: usize = MAD_LEN - HEADER_LEN;
/// The only MAD base version (IBTA §13.4.2).
pub const BASE_VERSION: u8 = 1;
/// The Q_Key of QP1, the general services interface (IBTA §13.4.6.1).
pub const GSI_QKEY: u32 = 0x8001_0000;

/// A bit field of a MAD: `byte` offset, first bit counted from the most significant bit of
/// that byte (the IBTA's own numbering of its tables), and width in bits (at most 64 bits in
/// at most 8 bytes). Fields are big-endian.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bits {
    /// Offset of the first byte.
    pub byte: usize,
    /// First bit within that byte, 0 = most significant.
    pub bit: u32,
    /// Width in bits.
    pub width: u32,
}

impl Bits {
    /// A field.
    pub const fn new(byte: usize, bit: u32, width: u32) -> Self {
        Bits { byte, bit, width }
    }
    /// A whole-byte-aligned field of `bytes` bytes.
    pub const fn bytes(byte: usize, bytes: u32) -> Self {
        Bits {
            byte,
            bit: 0,
            width: bytes * 8,
        }
    }
    /// One past the last byte the field touches.
    pub const fn end(self) -> usize {
        self.byte + ((self.bit + self.width).div_ceil(8)) as usize
    }
    const fn mask(self) -> u64 {
        if self.width >= 64 {
            u64::MAX
        } else {
            (1u64 << self.width) - 1
        }
    }
    /// Read the field. The caller has checked that `b` holds `end()` bytes.
    pub fn get(self, b: &[u8]) -> u64 {
        let span = &b[self.byte..self.end()];
        let mut v: u64 = 0;
        for &x in span {
            v = (v << 8) | u64::from(x);
        }
        let total = span.len() as u32 * 8;
        (v >> (total - self.bit - self.width)) & self.mask()
    }
    /// Write the field (bits of `v` above the width are dropped), leaving the other bits of
    /// the bytes it shares alone. The caller has checked that `b` holds `end()` bytes.
    pub fn set(self, b: &mut [u8], v: u64) {
        let end = self.end();
        let n = end - self.byte;
        let mut cur: u64 = 0;
        for &x in &b[self.byte..end] {
            cur = (cur << 8) | u64::from(x);
        }
        let shift = n as u32 * 8 - self.bit - self.width;
        let m = self.mask() << shift;
        cur = (cur & !m) | ((v << shift) & m);
        for i in (0..n).rev() {
            b[self.byte + i] = cur as u8;
            cur >>= 8;
        }
    }
}

/// Defines a newtype over an integer that keeps every value, with named constants and a name
/// for the known ones.
macro_rules! code_type {
    ($(#[$m:meta])* $name:ident($int:ty), $fmtw:literal { $($(#[$cm:meta])* $c:ident = $v:literal => $s:literal,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub $int);
        impl $name {
            $($(#[$cm])* pub const $c: $name = $name($v);)*
            /// The name of a known value, `None` for an unknown one.
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($v => Some($s),)*
                    _ => None,
                }
            }
        }
        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                match self.name() {
                    Some(n) => f.write_str(n),
                    None => write!(f, concat!(stringify!($name), "(0x{:0", $fmtw, "x})"), self.0),
                }
            }
        }
        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                match self.name() {
                    Some(n) => f.write_str(n),
                    None => write!(f, concat!("0x{:0", $fmtw, "x}"), self.0),
                }
            }
        }
    };
}
pub(crate) use code_type;

code_type!(
    /// A management class (IBTA §13.4.4, table 148).
    MgmtClass(u8), "2" {
        /// Subnet management, LID routed.
        SUBN_LID_ROUTED = 0x01 => "SubnLidRouted",
        /// Subnet administration.
        SUBN_ADM = 0x03 => "SubnAdm",
        /// Performance management.
        PERF = 0x04 => "Perf",
        /// Baseboard management.
        BM = 0x05 => "BM",
        /// Device management.
        DEV_MGT = 0x06 => "DevMgt",
        /// Communication management (IBTA ch. 12): REQ, REP, RTU, DREQ, ...
        CM = 0x07 => "CM",
        /// SNMP tunnelling.
        SNMP = 0x08 => "SNMP",
        /// Subnet management, directed route.
        SUBN_DIRECTED_ROUTE = 0x81 => "SubnDirectedRoute",
    }
);

code_type!(
    /// A MAD method (IBTA §13.4.5, table 149), with the response bit (0x80) included.
    Method(u8), "2" {
        /// Get: request an attribute.
        GET = 0x01 => "Get",
        /// Set: write an attribute.
        SET = 0x02 => "Set",
        /// Send: a datagram that needs no response MAD (every CM message).
        SEND = 0x03 => "Send",
        /// Trap: an unsolicited notice.
        TRAP = 0x05 => "Trap",
        /// Report: forward a notice.
        REPORT = 0x06 => "Report",
        /// TrapRepress.
        TRAP_REPRESS = 0x07 => "TrapRepress",
        /// GetResp: the answer to Get and Set.
        GET_RESP = 0x81 => "GetResp",
        /// ReportResp.
        REPORT_RESP = 0x86 => "ReportResp",
    }
);

impl Method {
    /// The response bit (R).
    pub const RESPONSE: u8 = 0x80;
    /// Whether this method is a response (R bit set).
    pub const fn is_response(self) -> bool {
        self.0 & Self::RESPONSE != 0
    }
}

code_type!(
    /// An attribute ID. The meaning depends on the class; the constants are the common ones
    /// and the communication management class's (IBTA §12.6 table 99, §13.4.8).
    AttrId(u16), "4" {
        /// ClassPortInfo (every class).
        CLASS_PORT_INFO = 0x0001 => "ClassPortInfo",
        /// CM: ConnectRequest.
        CM_REQ = 0x0010 => "ConnectRequest",
        /// CM: MsgRcptAck.
        CM_MRA = 0x0011 => "MsgRcptAck",
        /// CM: ConnectReject.
        CM_REJ = 0x0012 => "ConnectReject",
        /// CM: ConnectReply.
        CM_REP = 0x0013 => "ConnectReply",
        /// CM: ReadyToUse.
        CM_RTU = 0x0014 => "ReadyToUse",
        /// CM: DisconnectRequest.
        CM_DREQ = 0x0015 => "DisconnectRequest",
        /// CM: DisconnectReply.
        CM_DREP = 0x0016 => "DisconnectReply",
        /// CM: ServiceIDResReq.
        CM_SIDR_REQ = 0x0017 => "ServiceIDResReq",
        /// CM: ServiceIDResReqResp.
        CM_SIDR_REP = 0x0018 => "ServiceIDResReqResp",
        /// CM: LoadAlternatePath.
        CM_LAP = 0x0019 => "LoadAlternatePath",
        /// CM: AlternatePathResponse.
        CM_APR = 0x001a => "AlternatePathResponse",
    }
);

/// The Status field of the common header (IBTA §13.4.7, table 150): bit 0 busy, bit 1
/// redirect, bits 2–4 the invalid-field code, bits 8–15 class specific.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
pub struct MadStatus(pub u16);

impl MadStatus {
    /// Success.
    pub const OK: MadStatus = MadStatus(0);
    /// Busy: the request was discarded, try again.
    pub const BUSY: MadStatus = MadStatus(0x0001);
    /// Redirection required (see ClassPortInfo).
    pub const REDIRECT: MadStatus = MadStatus(0x0002);
    /// Invalid field: base or class version not supported.
    pub const BAD_VERSION: MadStatus = MadStatus(1 << 2);
    /// Invalid field: method not supported.
    pub const UNSUPPORTED_METHOD: MadStatus = MadStatus(2 << 2);
    /// Invalid field: method/attribute combination not supported.
    pub const UNSUPPORTED_METHOD_ATTR: MadStatus = MadStatus(3 << 2);
    /// Invalid field: an attribute or attribute modifier value is invalid.
    pub const INVALID_ATTR_VALUE: MadStatus = MadStatus(7 << 2);

    /// The 3-bit invalid-field code (0: none).
    pub const fn invalid_field(self) -> u8 {
        ((self.0 >> 2) & 0x7) as u8
    }
    /// The class-specific bits 8–15.
    pub const fn class_specific(self) -> u8 {
        (self.0 >> 8) as u8
    }
}

impl fmt::Display for MadStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:04x}", self.0)
    }
}

mod field {
    use super::Bits;
    pub const BASE_VERSION: Bits = Bits::bytes(0, 1);
    pub const MGMT_CLASS: Bits = Bits::bytes(1, 1);
    pub const CLASS_VERSION: Bits = Bits::bytes(2, 1);
    pub const METHOD: Bits = Bits::bytes(3, 1);
    pub const STATUS: Bits = Bits::bytes(4, 2);
    pub const CLASS_SPECIFIC: Bits = Bits::bytes(6, 2);
    pub const TID: Bits = Bits::bytes(8, 8);
    pub const ATTR_ID: Bits = Bits::bytes(16, 2);
    pub const RESERVED: Bits = Bits::bytes(18, 2);
    pub const ATTR_MOD: Bits = Bits::bytes(20, 4);
}

/// A zero-copy view of a MAD: the common header and the attribute data after it.
#[derive(Debug, Clone, Copy)]
pub struct Mad<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Mad<T> {
    /// Wrap without checking the length (emit path only).
    pub const fn new_unchecked(buffer: T) -> Self {
        Mad { buffer }
    }
    /// Wrap after checking that the common header is present.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let m = Mad { buffer };
        m.check_len()?;
        Ok(m)
    }
    /// Ok if the buffer holds the common header.
    pub fn check_len(&self) -> Result<()> {
        need(Layer::Mad, self.buffer.as_ref(), HEADER_LEN)
    }
    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// BaseVersion (1).
    pub fn base_version(&self) -> u8 {
        field::BASE_VERSION.get(self.b()) as u8
    }
    /// MgmtClass.
    pub fn mgmt_class(&self) -> MgmtClass {
        MgmtClass(field::MGMT_CLASS.get(self.b()) as u8)
    }
    /// ClassVersion.
    pub fn class_version(&self) -> u8 {
        field::CLASS_VERSION.get(self.b()) as u8
    }
    /// Method, response bit included.
    pub fn method(&self) -> Method {
        Method(field::METHOD.get(self.b()) as u8)
    }
    /// Status.
    pub fn status(&self) -> MadStatus {
        MadStatus(field::STATUS.get(self.b()) as u16)
    }
    /// ClassSpecific.
    pub fn class_specific(&self) -> u16 {
        field::CLASS_SPECIFIC.get(self.b()) as u16
    }
    /// TransactionID.
    pub fn transaction_id(&self) -> u64 {
        field::TID.get(self.b())
    }
    /// AttributeID.
    pub fn attr_id(&self) -> AttrId {
        AttrId(field::ATTR_ID.get(self.b()) as u16)
    }
    /// The two reserved bytes after the AttributeID (should be zero).
    pub fn reserved(&self) -> u16 {
        field::RESERVED.get(self.b()) as u16
    }
    /// AttributeModifier.
    pub fn attr_mod(&self) -> u32 {
        field::ATTR_MOD.get(self.b()) as u32
    }
    /// The attribute data: the bytes after the header, at most [`DATA_LEN`] of them.
    pub fn data(&self) -> &[u8] {
        let b = self.b();
        &b[HEADER_LEN..b.len().min(MAD_LEN)]
    }
}

/// The owned form of the common MAD header. The two reserved bytes are not modelled (emitted
/// as zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadHeaderRepr {
    /// The MAD base version (1).
    pub base_version: u8,
    /// The management class.
    pub mgmt_class: MgmtClass,
    /// The class version.
    pub class_version: u8,
    /// The method (with the response bit).
    pub method: Method,
    /// The status.
    pub status: MadStatus,
    /// The class-specific field.
    pub class_specific: u16,
    /// The transaction ID.
    pub transaction_id: u64,
    /// The attribute ID.
    pub attr_id: AttrId,
    /// The attribute modifier.
    pub attr_mod: u32,
}

impl MadHeaderRepr {
    /// A request header of `class` (base version 1, status 0, modifier 0).
    pub fn new(
        mgmt_class: MgmtClass,
        class_version: u8,
        method: Method,
        attr_id: AttrId,
        transaction_id: u64,
    ) -> Self {
        MadHeaderRepr {
            base_version: BASE_VERSION,
            mgmt_class,
            class_version,
            method,
            status: MadStatus::OK,
            class_specific: 0,
            transaction_id,
            attr_id,
            attr_mod: 0,
        }
    }

    /// Parse the header at the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let m = Mad::new_checked(buf)?;
        Ok(MadHeaderRepr {
            base_version: m.base_version(),
            mgmt_class: m.mgmt_class(),
            class_version: m.class_version(),
            method: m.method(),
            status: m.status(),
            class_specific: m.class_specific(),
            transaction_id: m.transaction_id(),
            attr_id: m.attr_id(),
            attr_mod: m.attr_mod(),
        })
    }

    /// Bytes needed to emit.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write into the start of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if buf.len() < HEADER_LEN {
            return Err(Error::BufferTooSmall {
                needed: HEADER_LEN,
                had: buf.len(),
            });
        }
        field::BASE_VERSION.set(buf, self.base_version.into());
        field::MGMT_CLASS.set(buf, self.mgmt_class.0.into());
        field::CLASS_VERSION.set(buf, self.class_version.into());
        field::METHOD.set(buf, self.method.0.into());
        field::STATUS.set(buf, self.status.0.into());
        field::CLASS_SPECIFIC.set(buf, self.class_specific.into());
        field::TID.set(buf, self.transaction_id);
        field::ATTR_ID.set(buf, self.attr_id.0.into());
        field::RESERVED.set(buf, 0);
        field::ATTR_MOD.set(buf, self.attr_mod.into());
        Ok(())
    }

    /// The header of the response to this request: the same transaction, the response bit
    /// set on the method (Get → GetResp), `status`.
    pub fn response(&self, status: MadStatus) -> Self {
        MadHeaderRepr {
            method: Method(self.method.0 | Method::RESPONSE),
            status,
            ..*self
        }
    }
}

/// A 128-bit global identifier (a port GID; on RoCE v2 an IPv6 address or an IPv4-mapped
/// IPv4 address). Shown as an IP address.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID of an IP address (IPv4-mapped `::ffff:a.b.c.d` for IPv4, as Linux numbers them).
    pub fn from_ip(ip: core::net::IpAddr) -> Self {
        match ip {
            core::net::IpAddr::V4(a) => Gid(a.to_ipv6_mapped().octets()),
            core::net::IpAddr::V6(a) => Gid(a.octets()),
        }
    }
    /// The IP address of the GID (IPv4 for an IPv4-mapped GID).
    pub fn to_ip(self) -> core::net::IpAddr {
        let a = core::net::Ipv6Addr::from(self.0);
        match a.to_ipv4_mapped() {
            Some(v4) => core::net::IpAddr::V4(v4),
            None => core::net::IpAddr::V6(a),
        }
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({})", self.to_ip())
    }
}
impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_ip())
    }
}

/// Copy a fixed-size byte field out of `b` (the caller checked the length).
pub(crate) fn get_array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_read_and_write_msb_first() {
        let mut b = [0u8; 8];
        // A 5-bit field in the high bits of byte 1, then a 3-bit field below it.
        Bits::new(1, 0, 5).set(&mut b, 0x14);
        Bits::new(1, 5, 3).set(&mut b, 0x7);
        assert_eq!(b[1], 0b1010_0111);
        assert_eq!(Bits::new(1, 0, 5).get(&b), 0x14);
        assert_eq!(Bits::new(1, 5, 3).get(&b), 0x7);
        // A 20-bit field spanning three bytes, then a 6-bit field ending a 32-bit word.
        Bits::new(4, 0, 20).set(&mut b, 0x67158);
        Bits::new(7, 2, 6).set(&mut b, 0x27);
        assert_eq!(&b[4..8], &[0x67, 0x15, 0x80, 0x27]);
        assert_eq!(Bits::new(4, 0, 20).get(&b), 0x67158);
        // Values wider than the field are cut to it and never touch the neighbours.
        Bits::new(7, 2, 6).set(&mut b, 0xff);
        assert_eq!(b[7], 0x3f);
        assert_eq!(b[6], 0x80);
        // A 64-bit field.
        let mut c = [0u8; 9];
        Bits::bytes(1, 8).set(&mut c, 0x0102_0304_0506_0708);
        assert_eq!(c, [0, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(Bits::bytes(1, 8).get(&c), 0x0102_0304_0506_0708);
        assert_eq!(Bits::new(0, 0, 24).end(), 3);
        assert_eq!(Bits::new(43, 5, 2).end(), 44);
    }

    #[test]
    fn header_round_trip_and_short_buffers() {
        let h = MadHeaderRepr::new(
            MgmtClass::CM,
            2,
            Method::SEND,
            AttrId::CM_REQ,
            0x0000_0002_9b59_a9ca,
        );
        let mut buf = [0u8; HEADER_LEN];
        h.emit(&mut buf).unwrap();
        assert_eq!(
            buf,
            [
                1, 7, 2, 3, 0, 0, 0, 0, 0, 0, 0, 2, 0x9b, 0x59, 0xa9, 0xca, 0, 0x10, 0, 0, 0, 0, 0,
                0
            ]
        );
        assert_eq!(MadHeaderRepr::parse(&buf).unwrap(), h);
        for n in 0..HEADER_LEN {
            assert!(MadHeaderRepr::parse(&buf[..n]).is_err());
            assert!(h.emit(&mut buf[..n]).is_err());
        }
        let r = h.response(MadStatus::UNSUPPORTED_METHOD_ATTR);
        assert!(r.method.is_response());
        assert_eq!(r.method, Method(0x83));
        assert_eq!(r.status.invalid_field(), 3);
    }

    #[test]
    fn codes_keep_unknown_values() {
        assert_eq!(AttrId(0x0013).to_string(), "ConnectReply");
        assert_eq!(AttrId(0x00ff).to_string(), "0x00ff");
        assert_eq!(AttrId(0x00ff).name(), None);
        assert_eq!(format!("{:?}", MgmtClass(0x42)), "MgmtClass(0x42)");
        assert_eq!(Method::GET_RESP.to_string(), "GetResp");
    }

    #[test]
    fn gid_shows_as_ip() {
        let g = Gid::from_ip("10.77.0.12".parse().unwrap());
        assert_eq!(g.0[10..], [0xff, 0xff, 10, 77, 0, 12]);
        assert_eq!(g.to_string(), "10.77.0.12");
        assert_eq!(
            Gid::from_ip("fd77::11".parse().unwrap()).to_string(),
            "fd77::11"
        );
    }
}
