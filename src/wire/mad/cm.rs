//! The communication management class (MgmtClass 0x07, ClassVersion 2; IBTA Vol. 1 §12.6):
//! the attribute data of every CM message, bit for bit.
//!
//! Offsets are bytes into the 232 bytes of attribute data after the common MAD header, and
//! bits count from the most significant bit of the byte, as in the IBTA tables (REQ table 99,
//! MRA 103, REJ 104, REP 106, RTU 107, DREQ 108, DREP 109, SIDR_REQ 111, SIDR_REP 112 in
//! release 1.4's numbering). Each message has a read-only zero-copy view (`Req<T>`, ...) and a
//! `Repr` (`ReqRepr`, ...) with `parse(data)` / `emit(data)`; [`CmMessage`] dispatches on the
//! attribute ID and [`CmMadRepr`] is a whole 256-byte CM MAD. LAP and APR (path migration) and
//! any unknown attribute are kept as [`CmMessage::Other`] with their data byte for byte.
//!
//! Reserved fields are not modelled: parse ignores them, emit writes zero.

use super::{code_type, DATA_LEN, HEADER_LEN, MAD_LEN};
use super::{get_array, AttrId, Bits, ClassPortInfoRepr, Gid, Mad, MadHeaderRepr, MgmtClass};
use crate::wire::{need, Error, Layer, PKey, Psn, QpNumber, Result};

/// The CM's class version (IBTA 1.2 and later).
pub const CLASS_VERSION: u8 = 2;

/// Private data bytes of each message (IBTA §12.6, the last field of each table).
pub mod private_len {
    /// ConnectRequest.
    pub const REQ: usize = 92;
    /// MsgRcptAck.
    pub const MRA: usize = 222;
    /// ConnectReject.
    pub const REJ: usize = 148;
    /// ConnectReply.
    pub const REP: usize = 196;
    /// ReadyToUse.
    pub const RTU: usize = 224;
    /// DisconnectRequest.
    pub const DREQ: usize = 220;
    /// DisconnectReply.
    pub const DREP: usize = 224;
    /// ServiceIDResReq.
    pub const SIDR_REQ: usize = 216;
    /// ServiceIDResReqResp.
    pub const SIDR_REP: usize = 136;
}

/// Bytes of Additional Reject Information in a REJ, and of Additional Information in a
/// SIDR_REP.
pub const ARI_LEN: usize = 72;

/// A value of a CM bit field: how it is read from and written to the field's bits.
pub trait FieldValue: Copy {
    /// From the field's bits.
    fn from_bits(v: u64) -> Self;
    /// To the field's bits (the caller cuts them to the width).
    fn to_bits(self) -> u64;
}

macro_rules! int_field {
    ($($t:ty),*) => {$(
        impl FieldValue for $t {
            fn from_bits(v: u64) -> Self { v as $t }
            fn to_bits(self) -> u64 { self as u64 }
        }
    )*};
}
int_field!(u8, u16, u32, u64);

impl FieldValue for bool {
    fn from_bits(v: u64) -> Self {
        v != 0
    }
    fn to_bits(self) -> u64 {
        u64::from(self)
    }
}
impl FieldValue for QpNumber {
    fn from_bits(v: u64) -> Self {
        QpNumber::new(v as u32)
    }
    fn to_bits(self) -> u64 {
        self.get().into()
    }
}
impl FieldValue for Psn {
    fn from_bits(v: u64) -> Self {
        Psn::new(v as u32)
    }
    fn to_bits(self) -> u64 {
        self.get().into()
    }
}
impl FieldValue for PKey {
    fn from_bits(v: u64) -> Self {
        PKey(v as u16)
    }
    fn to_bits(self) -> u64 {
        self.0.into()
    }
}

macro_rules! code_field {
    ($($t:ident($int:ty)),*) => {$(
        impl FieldValue for $t {
            fn from_bits(v: u64) -> Self { $t(v as $int) }
            fn to_bits(self) -> u64 { self.0 as u64 }
        }
    )*};
}

code_type!(
    /// A REJ reason (IBTA §12.6.7.2, table 105). Unknown values are kept.
    RejReason(u16), "4" {
        /// No QP available.
        NO_QP = 1 => "no QP available",
        /// No EEC available.
        NO_EEC = 2 => "no EEC available",
        /// No resources available.
        NO_RESOURCES = 3 => "no resources available",
        /// The sender timed out waiting for a response.
        TIMEOUT = 4 => "timeout",
        /// Unsupported request.
        UNSUPPORTED = 5 => "unsupported request",
        /// Invalid communication ID.
        INVALID_COMM_ID = 6 => "invalid communication ID",
        /// Invalid communication instance.
        INVALID_COMM_INSTANCE = 7 => "invalid communication instance",
        /// Nothing listens on the REQ's service ID.
        INVALID_SERVICE_ID = 8 => "invalid service ID",
        /// Invalid transport service type.
        INVALID_TRANSPORT_TYPE = 9 => "invalid transport service type",
        /// Stale connection.
        STALE_CONNECTION = 10 => "stale connection",
        /// RDC does not exist.
        RDC_NOT_EXIST = 11 => "RDC does not exist",
        /// Primary remote port GID rejected.
        INVALID_GID = 12 => "primary remote port GID rejected",
        /// Primary remote port LID rejected.
        INVALID_LID = 13 => "primary remote port LID rejected",
        /// Invalid primary SL.
        INVALID_SL = 14 => "invalid primary SL",
        /// Invalid primary traffic class.
        INVALID_TRAFFIC_CLASS = 15 => "invalid primary traffic class",
        /// Invalid primary hop limit.
        INVALID_HOP_LIMIT = 16 => "invalid primary hop limit",
        /// Invalid primary packet rate.
        INVALID_PACKET_RATE = 17 => "invalid primary packet rate",
        /// Alternate remote port GID rejected.
        INVALID_ALT_GID = 18 => "alternate remote port GID rejected",
        /// Alternate remote port LID rejected.
        INVALID_ALT_LID = 19 => "alternate remote port LID rejected",
        /// Invalid alternate SL.
        INVALID_ALT_SL = 20 => "invalid alternate SL",
        /// Invalid alternate traffic class.
        INVALID_ALT_TRAFFIC_CLASS = 21 => "invalid alternate traffic class",
        /// Invalid alternate hop limit.
        INVALID_ALT_HOP_LIMIT = 22 => "invalid alternate hop limit",
        /// Invalid alternate packet rate.
        INVALID_ALT_PACKET_RATE = 23 => "invalid alternate packet rate",
        /// Port and CM redirection.
        PORT_CM_REDIRECT = 24 => "port and CM redirection",
        /// Port redirection.
        PORT_REDIRECT = 25 => "port redirection",
        /// Invalid path MTU.
        INVALID_MTU = 26 => "invalid path MTU",
        /// Insufficient responder resources.
        INSUFFICIENT_RESP_RESOURCES = 27 => "insufficient responder resources",
        /// The consumer (application) rejected; the private data says why.
        CONSUMER = 28 => "consumer reject",
        /// RNR retry count reject.
        INVALID_RNR_RETRY = 29 => "RNR retry count reject",
        /// Duplicate local communication ID.
        DUPLICATE_LOCAL_COMM_ID = 30 => "duplicate local communication ID",
        /// Unsupported class version.
        INVALID_CLASS_VERSION = 31 => "unsupported class version",
        /// Invalid primary flow label.
        INVALID_FLOW_LABEL = 32 => "invalid primary flow label",
        /// Invalid alternate flow label.
        INVALID_ALT_FLOW_LABEL = 33 => "invalid alternate flow label",
        /// Vendor option not supported.
        VENDOR_OPTION_NOT_SUPPORTED = 35 => "vendor option not supported",
    }
);

code_type!(
    /// The status of a SIDR_REP (IBTA §12.11.2, table 113). Unknown values are kept.
    SidrStatus(u8), "2" {
        /// The QPN and Q_Key are valid.
        SUCCESS = 0 => "success",
        /// Nothing serves the service ID.
        UNSUPPORTED = 1 => "service ID not supported",
        /// The service provider rejected the request.
        REJECT = 2 => "rejected",
        /// No QP available.
        NO_QP = 3 => "no QP available",
        /// Redirect.
        REDIRECT = 4 => "redirect",
        /// Unsupported class version.
        UNSUPPORTED_VERSION = 5 => "unsupported class version",
    }
);

code_type!(
    /// A path MTU code (IBTA §9.7.7 / `enum ibv_mtu`): the 4-bit field of REQ.
    PathMtu(u8), "1" {
        /// 256.
        M256 = 1 => "256",
        /// 512.
        M512 = 2 => "512",
        /// 1024.
        M1024 = 3 => "1024",
        /// 2048.
        M2048 = 4 => "2048",
        /// 4096.
        M4096 = 5 => "4096",
    }
);

impl PathMtu {
    /// The payload bytes, `None` for a reserved code.
    pub fn bytes(self) -> Option<u32> {
        (1..=5).contains(&self.0).then(|| 128u32 << self.0)
    }
}

code_type!(
    /// The 2-bit Transport Service Type of a REQ.
    TransportType(u8), "1" {
        /// Reliable connection.
        RC = 0 => "RC",
        /// Unreliable connection.
        UC = 1 => "UC",
        /// Reliable datagram.
        RD = 2 => "RD",
        /// See the Extended Transport Type field (XRC: 1).
        EXTENDED = 3 => "extended",
    }
);

code_type!(
    /// The 2-bit "message MRAed" / "message rejected" code of MRA and REJ.
    MsgCode(u8), "1" {
        /// The REQ.
        REQ = 0 => "REQ",
        /// The REP.
        REP = 1 => "REP",
        /// MRA: the LAP; REJ: no message (any other).
        OTHER = 2 => "other",
    }
);

code_field!(
    RejReason(u16),
    SidrStatus(u8),
    PathMtu(u8),
    TransportType(u8),
    MsgCode(u8)
);

/// Defines a CM attribute: its field table, a read-only view with a getter per field, and a
/// `Repr` with a field per field, parse and emit.
macro_rules! cm_attr {
    (
        $(#[$vm:meta])* view $View:ident;
        $(#[$rm:meta])* repr $Repr:ident;
        fields { $( $(#[$fm:meta])* $f:ident: $fty:ty = $bits:expr; )* }
        arrays { $( $(#[$am:meta])* $a:ident: $aty:ident[$n:expr] = $at:expr; )* }
        paths { $( $(#[$pm:meta])* $p:ident = $pat:expr; )* }
    ) => {
        $(#[$vm])*
        #[derive(Debug, Clone, Copy)]
        pub struct $View<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $View<T> {
            /// Wrap attribute data after checking that all of it ([`DATA_LEN`] bytes) is
            /// present.
            pub fn new_checked(buffer: T) -> Result<Self> {
                need(Layer::MadAttribute, buffer.as_ref(), DATA_LEN)?;
                Ok($View { buffer })
            }
            /// The wrapped buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
            $(
                $(#[$fm])*
                pub fn $f(&self) -> $fty {
                    <$fty as FieldValue>::from_bits($bits.get(self.buffer.as_ref()))
                }
            )*
            $(
                $(#[$am])*
                pub fn $a(&self) -> &[u8] {
                    &self.buffer.as_ref()[$at..$at + $n]
                }
            )*
            $(
                $(#[$pm])*
                pub fn $p(&self) -> PathRepr {
                    PathRepr::parse_at(self.buffer.as_ref(), $pat)
                }
            )*
        }

        $(#[$rm])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $Repr {
            $( $(#[$fm])* pub $f: $fty, )*
            $( $(#[$am])* pub $a: array_ty!($aty, $n), )*
            $( $(#[$pm])* pub $p: PathRepr, )*
        }

        impl Default for $Repr {
            fn default() -> Self {
                $Repr {
                    $( $f: <$fty as FieldValue>::from_bits(0), )*
                    $( $a: array_default!($aty, $n), )*
                    $( $p: PathRepr::default(), )*
                }
            }
        }

        impl $Repr {
            /// Parse from attribute data ([`DATA_LEN`] bytes).
            pub fn parse(data: &[u8]) -> Result<Self> {
                let v = $View::new_checked(data)?;
                Ok($Repr {
                    $( $f: v.$f(), )*
                    $( $a: array_get!($aty, $n, data, $at), )*
                    $( $p: v.$p(), )*
                })
            }

            /// Bytes needed to emit the attribute data.
            pub const fn buffer_len(&self) -> usize {
                DATA_LEN
            }

            /// Write the attribute data ([`DATA_LEN`] bytes; reserved bits zero).
            pub fn emit(&self, data: &mut [u8]) -> Result<()> {
                if data.len() < DATA_LEN {
                    return Err(Error::BufferTooSmall { needed: DATA_LEN, had: data.len() });
                }
                let d = &mut data[..DATA_LEN];
                d.fill(0);
                $( $bits.set(d, FieldValue::to_bits(self.$f)); )*
                $( d[$at..$at + $n].copy_from_slice(array_bytes!($aty, self.$a)); )*
                $( self.$p.emit_at(d, $pat); )*
                Ok(())
            }
        }
    };
}

macro_rules! array_ty {
    (bytes, $n:expr) => {
        [u8; $n]
    };
    (gid, $n:expr) => {
        Gid
    };
}
macro_rules! array_default {
    (bytes, $n:expr) => {
        [0u8; $n]
    };
    (gid, $n:expr) => {
        Gid::default()
    };
}
macro_rules! array_get {
    (bytes, $n:expr, $d:expr, $at:expr) => {
        get_array::<{ $n }>($d, $at)
    };
    (gid, $n:expr, $d:expr, $at:expr) => {
        Gid(get_array::<16>($d, $at))
    };
}
macro_rules! array_bytes {
    (bytes, $e:expr) => {
        &$e[..]
    };
    (gid, $e:expr) => {
        &$e.0[..]
    };
}

/// A path as a REQ carries it (primary at byte 52, alternate at byte 96; 44 bytes): the port
/// addresses and the GRH and link parameters of one path.
///
/// ```text
/// 0..2    local port LID          2..4    remote port LID
/// 4..20   local port GID          20..36  remote port GID
/// 36..40  flow label (20) | reserved (6) | packet rate (6)
/// 40      traffic class           41      hop limit
/// 42      SL (4) | subnet local (1) | reserved (3)
/// 43      local ACK timeout (5) | reserved (3)   (alternate: SAP supported at bit 5)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathRepr {
    /// The local port's LID (0xFFFF on RoCE).
    pub local_lid: u16,
    /// The remote port's LID (0xFFFF on RoCE).
    pub remote_lid: u16,
    /// The local port's GID.
    pub local_gid: Gid,
    /// The remote port's GID.
    pub remote_gid: Gid,
    /// 20 bits.
    pub flow_label: u32,
    /// 6 bits (IBTA static rate code).
    pub packet_rate: u8,
    /// The GRH traffic class.
    pub traffic_class: u8,
    /// The GRH hop limit.
    pub hop_limit: u8,
    /// 4 bits.
    pub sl: u8,
    /// The path stays within the subnet.
    pub subnet_local: bool,
    /// 5 bits: 4.096 µs × 2^value.
    pub local_ack_timeout: u8,
}

/// Bytes of a path in a REQ.
pub const PATH_LEN: usize = 44;

mod path {
    use super::Bits;
    pub const LOCAL_LID: Bits = Bits::bytes(0, 2);
    pub const REMOTE_LID: Bits = Bits::bytes(2, 2);
    pub const LOCAL_GID: usize = 4;
    pub const REMOTE_GID: usize = 20;
    pub const FLOW_LABEL: Bits = Bits::new(36, 0, 20);
    pub const PACKET_RATE: Bits = Bits::new(39, 2, 6);
    pub const TRAFFIC_CLASS: Bits = Bits::bytes(40, 1);
    pub const HOP_LIMIT: Bits = Bits::bytes(41, 1);
    pub const SL: Bits = Bits::new(42, 0, 4);
    pub const SUBNET_LOCAL: Bits = Bits::new(42, 4, 1);
    pub const LOCAL_ACK_TIMEOUT: Bits = Bits::new(43, 0, 5);
}

impl Bits {
    /// The same field `base` bytes further on.
    const fn at(self, base: usize) -> Bits {
        Bits::new(base + self.byte, self.bit, self.width)
    }
}

impl PathRepr {
    /// Read the path at byte `base` of `d` (which holds `base + PATH_LEN` bytes).
    fn parse_at(d: &[u8], base: usize) -> Self {
        PathRepr {
            local_lid: path::LOCAL_LID.at(base).get(d) as u16,
            remote_lid: path::REMOTE_LID.at(base).get(d) as u16,
            local_gid: Gid(get_array(d, base + path::LOCAL_GID)),
            remote_gid: Gid(get_array(d, base + path::REMOTE_GID)),
            flow_label: path::FLOW_LABEL.at(base).get(d) as u32,
            packet_rate: path::PACKET_RATE.at(base).get(d) as u8,
            traffic_class: path::TRAFFIC_CLASS.at(base).get(d) as u8,
            hop_limit: path::HOP_LIMIT.at(base).get(d) as u8,
            sl: path::SL.at(base).get(d) as u8,
            subnet_local: path::SUBNET_LOCAL.at(base).get(d) != 0,
            local_ack_timeout: path::LOCAL_ACK_TIMEOUT.at(base).get(d) as u8,
        }
    }
    fn emit_at(&self, d: &mut [u8], base: usize) {
        path::LOCAL_LID.at(base).set(d, self.local_lid.into());
        path::REMOTE_LID.at(base).set(d, self.remote_lid.into());
        d[base + path::LOCAL_GID..base + path::LOCAL_GID + 16].copy_from_slice(&self.local_gid.0);
        d[base + path::REMOTE_GID..base + path::REMOTE_GID + 16]
            .copy_from_slice(&self.remote_gid.0);
        path::FLOW_LABEL.at(base).set(d, self.flow_label.into());
        path::PACKET_RATE.at(base).set(d, self.packet_rate.into());
        path::TRAFFIC_CLASS
            .at(base)
            .set(d, self.traffic_class.into());
        path::HOP_LIMIT.at(base).set(d, self.hop_limit.into());
        path::SL.at(base).set(d, self.sl.into());
        path::SUBNET_LOCAL.at(base).set(d, self.subnet_local.into());
        path::LOCAL_ACK_TIMEOUT
            .at(base)
            .set(d, self.local_ack_timeout.into());
    }
}

cm_attr! {
    /// ConnectRequest (REQ): the active side asks for a connection to a service.
    view Req;
    /// The owned form of a REQ.
    repr ReqRepr;
    fields {
        /// The sender's communication ID.
        local_comm_id: u32 = Bits::bytes(0, 4);
        /// 24 bits (byte 4 is reserved).
        vendor_id: u32 = Bits::new(5, 0, 24);
        /// The service ID.
        service_id: u64 = Bits::bytes(8, 8);
        /// The sender's CA GUID.
        local_ca_guid: u64 = Bits::bytes(16, 8);
        /// The sender's Q_Key (UD/RD; 0 for RC).
        local_qkey: u32 = Bits::bytes(28, 4);
        /// The sender's QPN.
        local_qpn: QpNumber = Bits::new(32, 0, 24);
        /// RDMA READ / atomic requests the sender accepts as responder (its
        /// max_dest_rd_atomic).
        responder_resources: u8 = Bits::bytes(35, 1);
        /// The sender's EE context (RD; 0 otherwise).
        local_eecn: u32 = Bits::new(36, 0, 24);
        /// RDMA READ / atomic requests the sender will have outstanding (its max_rd_atomic).
        initiator_depth: u8 = Bits::bytes(39, 1);
        /// The receiver's EE context (RD; 0 otherwise).
        remote_eecn: u32 = Bits::new(40, 0, 24);
        /// 5 bits: how long the sender waits for the passive side's answer (4.096 µs ×
        /// 2^value).
        remote_cm_response_timeout: u8 = Bits::new(43, 0, 5);
        /// The transport service type.
        transport: TransportType = Bits::new(43, 5, 2);
        /// End-to-end flow control (credits) in use.
        e2e_flow_control: bool = Bits::new(43, 7, 1);
        /// The sender's starting PSN.
        starting_psn: Psn = Bits::new(44, 0, 24);
        /// 5 bits: how long the sender takes to answer (4.096 µs × 2^value).
        local_cm_response_timeout: u8 = Bits::new(47, 0, 5);
        /// 3 bits: the receiver's QP transport retry count.
        retry_count: u8 = Bits::new(47, 5, 3);
        /// The partition key.
        pkey: PKey = Bits::bytes(48, 2);
        /// The path MTU.
        path_mtu: PathMtu = Bits::new(50, 0, 4);
        /// RD: an RDC exists.
        rdc_exists: bool = Bits::new(50, 4, 1);
        /// 3 bits: the receiver's QP RNR retry count.
        rnr_retry_count: u8 = Bits::new(50, 5, 3);
        /// 4 bits: how many times the sender retries a CM message.
        max_cm_retries: u8 = Bits::new(51, 0, 4);
        /// The sender's QP uses an SRQ.
        srq: bool = Bits::new(51, 4, 1);
        /// 3 bits.
        ext_transport: u8 = Bits::new(51, 5, 3);
        /// The alternate path supports SAP (IBTA 1.4).
        sap_supported: bool = Bits::new(139, 5, 1);
    }
    arrays {
        /// The private data.
        private_data: bytes[private_len::REQ] = 140;
    }
    paths {
        /// The primary path (bytes 52..96).
        primary = 52;
        /// The alternate path (bytes 96..140; all zero when there is none).
        alternate = 96;
    }
}

cm_attr! {
    /// MsgRcptAck (MRA): "your message arrived; I need more time to answer".
    view Mra;
    /// The owned form of an MRA.
    repr MraRepr;
    fields {
        /// The sender's communication ID.
        local_comm_id: u32 = Bits::bytes(0, 4);
        /// The receiver's communication ID (0 when the sender does not know it).
        remote_comm_id: u32 = Bits::bytes(4, 4);
        /// Which message the MRA acknowledges.
        message_mraed: MsgCode = Bits::new(8, 0, 2);
        /// 5 bits: the extra time the sender needs (4.096 µs × 2^value).
        service_timeout: u8 = Bits::new(9, 0, 5);
    }
    arrays {
        /// The private data.
        private_data: bytes[private_len::MRA] = 10;
    }
    paths {}
}

cm_attr! {
    /// ConnectReject (REJ).
    view Rej;
    /// The owned form of a REJ.
    repr RejRepr;
    fields {
        /// The sender's communication ID.
        local_comm_id: u32 = Bits::bytes(0, 4);
        /// The receiver's communication ID (0 when the sender does not know it).
        remote_comm_id: u32 = Bits::bytes(4, 4);
        /// Which message is rejected.
        message_rejected: MsgCode = Bits::new(8, 0, 2);
        /// 7 bits: the bytes of `ari` that mean something.
        reject_info_len: u8 = Bits::new(9, 0, 7);
        /// The reason.
        reason: RejReason = Bits::bytes(10, 2);
    }
    arrays {
        /// Additional Reject Information.
        ari: bytes[ARI_LEN] = 12;
        /// The private data.
        private_data: bytes[private_len::REJ] = 84;
    }
    paths {}
}

cm_attr! {
    /// ConnectReply (REP): the passive side accepts.
    view Rep;
    /// The owned form of a REP.
    repr RepRepr;
    fields {
        /// The sender's communication ID.
        local_comm_id: u32 = Bits::bytes(0, 4);
        /// The receiver's communication ID (0 when the sender does not know it).
        remote_comm_id: u32 = Bits::bytes(4, 4);
        /// The sender's Q_Key (UD/RD; 0 for RC).
        local_qkey: u32 = Bits::bytes(8, 4);
        /// The sender's QPN.
        local_qpn: QpNumber = Bits::new(12, 0, 24);
        /// Vendor ID bits 23..16.
        vendor_id_h: u8 = Bits::bytes(15, 1);
        /// The sender's EE context (RD; 0 otherwise).
        local_eecn: u32 = Bits::new(16, 0, 24);
        /// Vendor ID bits 15..8.
        vendor_id_m: u8 = Bits::bytes(19, 1);
        /// The sender's starting PSN.
        starting_psn: Psn = Bits::new(20, 0, 24);
        /// Vendor ID bits 7..0.
        vendor_id_l: u8 = Bits::bytes(23, 1);
        /// RDMA READs / atomics the sender accepts as responder.
        responder_resources: u8 = Bits::bytes(24, 1);
        /// RDMA READs / atomics the sender keeps outstanding.
        initiator_depth: u8 = Bits::bytes(25, 1);
        /// 5 bits.
        target_ack_delay: u8 = Bits::new(26, 0, 5);
        /// 2 bits.
        failover_accepted: u8 = Bits::new(26, 5, 2);
        /// End-to-end flow control (credits) in use.
        e2e_flow_control: bool = Bits::new(26, 7, 1);
        /// 3 bits: the receiver's (active side's) QP RNR retry count.
        rnr_retry_count: u8 = Bits::new(27, 0, 3);
        /// The sender's QP uses an SRQ.
        srq: bool = Bits::new(27, 3, 1);
        /// The sender's CA GUID.
        local_ca_guid: u64 = Bits::bytes(28, 8);
    }
    arrays {
        /// The private data.
        private_data: bytes[private_len::REP] = 36;
    }
    paths {}
}

cm_attr! {
    /// ReadyToUse (RTU): the active side's QP is ready; the connection is established.
    view Rtu;
    /// The owned form of an RTU.
    repr RtuRepr;
    fields {
        /// The sender's communication ID.
        local_comm_id: u32 = Bits::bytes(0, 4);
        /// The receiver's communication ID (0 when the sender does not know it).
        remote_comm_id: u32 = Bits::bytes(4, 4);
    }
    arrays {
        /// The private data.
        private_data: bytes[private_len::RTU] = 8;
    }
    paths {}
}

cm_attr! {
    /// DisconnectRequest (DREQ).
    view Dreq;
    /// The owned form of a DREQ.
    repr DreqRepr;
    fields {
        /// The sender's communication ID.
        local_comm_id: u32 = Bits::bytes(0, 4);
        /// The receiver's communication ID (0 when the sender does not know it).
        remote_comm_id: u32 = Bits::bytes(4, 4);
        /// The receiver's QPN (or EECN).
        remote_qpn: QpNumber = Bits::new(8, 0, 24);
    }
    arrays {
        /// The private data.
        private_data: bytes[private_len::DREQ] = 12;
    }
    paths {}
}

cm_attr! {
    /// DisconnectReply (DREP).
    view Drep;
    /// The owned form of a DREP.
    repr DrepRepr;
    fields {
        /// The sender's communication ID.
        local_comm_id: u32 = Bits::bytes(0, 4);
        /// The receiver's communication ID (0 when the sender does not know it).
        remote_comm_id: u32 = Bits::bytes(4, 4);
    }
    arrays {
        /// The private data.
        private_data: bytes[private_len::DREP] = 8;
    }
    paths {}
}

cm_attr! {
    /// ServiceIDResReq (SIDR_REQ): which UD QP serves this service ID?
    view SidrReq;
    /// The owned form of a SIDR_REQ.
    repr SidrReqRepr;
    fields {
        /// The requester's ID of this resolution.
        request_id: u32 = Bits::bytes(0, 4);
        /// The partition key.
        pkey: PKey = Bits::bytes(4, 2);
        /// The service ID.
        service_id: u64 = Bits::bytes(8, 8);
    }
    arrays {
        /// The private data.
        private_data: bytes[private_len::SIDR_REQ] = 16;
    }
    paths {}
}

cm_attr! {
    /// ServiceIDResReqResp (SIDR_REP).
    view SidrRep;
    /// The owned form of a SIDR_REP.
    repr SidrRepRepr;
    fields {
        /// The requester's ID of this resolution.
        request_id: u32 = Bits::bytes(0, 4);
        /// The status.
        status: SidrStatus = Bits::bytes(4, 1);
        /// Bytes of `additional_info` that mean something.
        additional_info_len: u8 = Bits::bytes(5, 1);
        /// Vendor ID bits 23..8.
        vendor_id_h: u16 = Bits::bytes(6, 2);
        /// The QPN that serves the service.
        qpn: QpNumber = Bits::new(8, 0, 24);
        /// Vendor ID bits 7..0.
        vendor_id_l: u8 = Bits::bytes(11, 1);
        /// The service ID.
        service_id: u64 = Bits::bytes(12, 8);
        /// The Q_Key to use.
        qkey: u32 = Bits::bytes(20, 4);
    }
    arrays {
        /// Additional information (redirection).
        additional_info: bytes[ARI_LEN] = 24;
        /// The private data.
        private_data: bytes[private_len::SIDR_REP] = 96;
    }
    paths {}
}

/// The attribute data of a CM MAD, by attribute ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::large_enum_variant)]
pub enum CmMessage {
    /// ConnectRequest.
    Req(ReqRepr),
    /// MsgRcptAck.
    Mra(MraRepr),
    /// ConnectReject.
    Rej(RejRepr),
    /// ConnectReply.
    Rep(RepRepr),
    /// ReadyToUse.
    Rtu(RtuRepr),
    /// DisconnectRequest.
    Dreq(DreqRepr),
    /// DisconnectReply.
    Drep(DrepRepr),
    /// ServiceIDResReq.
    SidrReq(SidrReqRepr),
    /// ServiceIDResReqResp.
    SidrRep(SidrRepRepr),
    /// ClassPortInfo.
    ClassPortInfo(ClassPortInfoRepr),
    /// LAP, APR or an unknown attribute: the data as it came.
    Other {
        /// The attribute ID.
        attr_id: AttrId,
        /// The attribute data as received.
        data: [u8; DATA_LEN],
    },
}

impl CmMessage {
    /// Parse the attribute data `data` of attribute `attr_id`.
    pub fn parse(attr_id: AttrId, data: &[u8]) -> Result<Self> {
        Ok(match attr_id {
            AttrId::CM_REQ => CmMessage::Req(ReqRepr::parse(data)?),
            AttrId::CM_MRA => CmMessage::Mra(MraRepr::parse(data)?),
            AttrId::CM_REJ => CmMessage::Rej(RejRepr::parse(data)?),
            AttrId::CM_REP => CmMessage::Rep(RepRepr::parse(data)?),
            AttrId::CM_RTU => CmMessage::Rtu(RtuRepr::parse(data)?),
            AttrId::CM_DREQ => CmMessage::Dreq(DreqRepr::parse(data)?),
            AttrId::CM_DREP => CmMessage::Drep(DrepRepr::parse(data)?),
            AttrId::CM_SIDR_REQ => CmMessage::SidrReq(SidrReqRepr::parse(data)?),
            AttrId::CM_SIDR_REP => CmMessage::SidrRep(SidrRepRepr::parse(data)?),
            AttrId::CLASS_PORT_INFO => {
                need(Layer::MadAttribute, data, DATA_LEN)?;
                CmMessage::ClassPortInfo(ClassPortInfoRepr::parse(data)?)
            }
            _ => {
                need(Layer::MadAttribute, data, DATA_LEN)?;
                CmMessage::Other {
                    attr_id,
                    data: get_array(data, 0),
                }
            }
        })
    }

    /// The attribute ID this message travels under.
    pub fn attr_id(&self) -> AttrId {
        match self {
            CmMessage::Req(_) => AttrId::CM_REQ,
            CmMessage::Mra(_) => AttrId::CM_MRA,
            CmMessage::Rej(_) => AttrId::CM_REJ,
            CmMessage::Rep(_) => AttrId::CM_REP,
            CmMessage::Rtu(_) => AttrId::CM_RTU,
            CmMessage::Dreq(_) => AttrId::CM_DREQ,
            CmMessage::Drep(_) => AttrId::CM_DREP,
            CmMessage::SidrReq(_) => AttrId::CM_SIDR_REQ,
            CmMessage::SidrRep(_) => AttrId::CM_SIDR_REP,
            CmMessage::ClassPortInfo(_) => AttrId::CLASS_PORT_INFO,
            CmMessage::Other { attr_id, .. } => *attr_id,
        }
    }

    /// Write the attribute data ([`DATA_LEN`] bytes).
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        match self {
            CmMessage::Req(r) => r.emit(data),
            CmMessage::Mra(r) => r.emit(data),
            CmMessage::Rej(r) => r.emit(data),
            CmMessage::Rep(r) => r.emit(data),
            CmMessage::Rtu(r) => r.emit(data),
            CmMessage::Dreq(r) => r.emit(data),
            CmMessage::Drep(r) => r.emit(data),
            CmMessage::SidrReq(r) => r.emit(data),
            CmMessage::SidrRep(r) => r.emit(data),
            CmMessage::ClassPortInfo(r) => r.emit(data),
            CmMessage::Other { data: d, .. } => {
                if data.len() < DATA_LEN {
                    return Err(Error::BufferTooSmall {
                        needed: DATA_LEN,
                        had: data.len(),
                    });
                }
                data[..DATA_LEN].copy_from_slice(d);
                Ok(())
            }
        }
    }

    /// The short name of the message (`REQ`, `REP`, ...).
    pub fn short_name(&self) -> &'static str {
        match self {
            CmMessage::Req(_) => "REQ",
            CmMessage::Mra(_) => "MRA",
            CmMessage::Rej(_) => "REJ",
            CmMessage::Rep(_) => "REP",
            CmMessage::Rtu(_) => "RTU",
            CmMessage::Dreq(_) => "DREQ",
            CmMessage::Drep(_) => "DREP",
            CmMessage::SidrReq(_) => "SIDR_REQ",
            CmMessage::SidrRep(_) => "SIDR_REP",
            CmMessage::ClassPortInfo(_) => "ClassPortInfo",
            CmMessage::Other { attr_id, .. } => match *attr_id {
                AttrId::CM_LAP => "LAP",
                AttrId::CM_APR => "APR",
                _ => "attribute",
            },
        }
    }

    /// The sender's and receiver's communication IDs `(local, remote)` of a connection
    /// message, as the sender wrote them (REQ: remote is 0; SIDR: the request ID twice).
    pub fn comm_ids(&self) -> Option<(u32, u32)> {
        Some(match self {
            CmMessage::Req(r) => (r.local_comm_id, 0),
            CmMessage::Mra(r) => (r.local_comm_id, r.remote_comm_id),
            CmMessage::Rej(r) => (r.local_comm_id, r.remote_comm_id),
            CmMessage::Rep(r) => (r.local_comm_id, r.remote_comm_id),
            CmMessage::Rtu(r) => (r.local_comm_id, r.remote_comm_id),
            CmMessage::Dreq(r) => (r.local_comm_id, r.remote_comm_id),
            CmMessage::Drep(r) => (r.local_comm_id, r.remote_comm_id),
            CmMessage::SidrReq(r) => (r.request_id, r.request_id),
            CmMessage::SidrRep(r) => (r.request_id, r.request_id),
            CmMessage::ClassPortInfo(_) | CmMessage::Other { .. } => return None,
        })
    }
}

/// A whole CM MAD: the common header and the message.
///
/// `parse` accepts any base and class version (the CM engine judges them) but only the CM
/// class. `emit` writes the header's attribute ID from the message, so the two never disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMadRepr {
    /// The common MAD header.
    pub header: MadHeaderRepr,
    /// The message.
    pub msg: CmMessage,
}

impl CmMadRepr {
    /// A CM `Send` MAD (base version 1, class version 2) carrying `msg`.
    pub fn send(transaction_id: u64, msg: CmMessage) -> Self {
        CmMadRepr {
            header: MadHeaderRepr::new(
                MgmtClass::CM,
                CLASS_VERSION,
                super::Method::SEND,
                msg.attr_id(),
                transaction_id,
            ),
            msg,
        }
    }

    /// Parse a MAD (at least [`MAD_LEN`] bytes; bytes after the MAD are ignored).
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let header = MadHeaderRepr::parse(buf)?;
        if header.mgmt_class != MgmtClass::CM {
            return Err(Error::MadClass(header.mgmt_class.0));
        }
        let m = Mad::new_unchecked(buf);
        let msg = CmMessage::parse(header.attr_id, m.data())?;
        Ok(CmMadRepr { header, msg })
    }

    /// Bytes needed to emit.
    pub const fn buffer_len(&self) -> usize {
        MAD_LEN
    }

    /// Write the MAD into the first [`MAD_LEN`] bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if buf.len() < MAD_LEN {
            return Err(Error::BufferTooSmall {
                needed: MAD_LEN,
                had: buf.len(),
            });
        }
        let header = MadHeaderRepr {
            attr_id: self.msg.attr_id(),
            ..self.header
        };
        header.emit(buf)?;
        self.msg.emit(&mut buf[HEADER_LEN..MAD_LEN])
    }

    /// The MAD as an owned 256-byte array.
    pub fn to_bytes(&self) -> [u8; MAD_LEN] {
        let mut b = [0u8; MAD_LEN];
        // Cannot fail: the buffer has exactly MAD_LEN bytes.
        let _ = self.emit(&mut b);
        b
    }
}

#[cfg(test)]
mod tests;
