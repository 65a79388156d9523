//! ACK Extended Transport Header (IBTA Vol. 1 §9.3.5, 4 bytes): an 8-bit syndrome and the
//! 24-bit message sequence number (MSN).
//!
//! Syndrome bits 6:5 select ACK (00), RNR NAK (01), reserved (10) or NAK (11); bits 4:0 are
//! the credit code (ACK), the RNR timer code (RNR NAK) or the NAK code. Bit 7 is reserved.

use super::{need, need_room, rd24, wr24, Layer, Result};
use core::fmt;

/// Length of the AETH.
pub const HEADER_LEN: usize = 4;

/// An AETH credit code (IBTA table 44): the number of receive WQEs the responder has.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct CreditCode(u8);

/// Receive WQE counts for credit codes 0..=30 (IBTA §9.7.7.2, table 44).
const CREDITS: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

impl CreditCode {
    /// Code 0x1F: the responder does not track end-to-end credits.
    pub const UNLIMITED: CreditCode = CreditCode(0x1f);

    /// A code from its five bits.
    pub const fn new(code: u8) -> Self {
        CreditCode(code & 0x1f)
    }
    /// The five bits.
    pub const fn code(self) -> u8 {
        self.0
    }
    /// Receive WQEs this code stands for; `None` for 0x1F (credits not tracked).
    pub fn credits(self) -> Option<u32> {
        CREDITS.get(self.0 as usize).copied()
    }
    /// The largest code whose count does not exceed `n` available receive WQEs.
    pub fn from_count(n: u32) -> Self {
        let idx = CREDITS.partition_point(|&c| c <= n);
        CreditCode(idx.saturating_sub(1) as u8)
    }
}

/// An RNR NAK timer code (IBTA table 45): how long the requester waits before retrying.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RnrTimer(u8);

/// RNR timer values in microseconds, codes 0..=31 (IBTA table 45; code 0 is the longest).
const RNR_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

impl RnrTimer {
    /// A timer from its five bits.
    pub const fn new(code: u8) -> Self {
        RnrTimer(code & 0x1f)
    }
    /// The five bits.
    pub const fn code(self) -> u8 {
        self.0
    }
    /// The wait in microseconds (exact, from the IBTA table).
    pub const fn as_micros(self) -> u32 {
        RNR_US[self.0 as usize]
    }
    /// The wait as a duration.
    pub fn duration(self) -> core::time::Duration {
        core::time::Duration::from_micros(u64::from(self.as_micros()))
    }
    /// The shortest timer code whose wait is at least `us` microseconds (code 0 if none is).
    pub fn at_least_micros(us: u32) -> Self {
        (1..32u8)
            .map(RnrTimer)
            .find(|t| t.as_micros() >= us)
            .unwrap_or(RnrTimer(0))
    }
}

/// The NAK codes (IBTA table 43).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum NakCode {
    /// 0: PSN sequence error (the requester retries from the NAK's PSN).
    PsnSequenceError,
    /// 1: invalid request.
    InvalidRequest,
    /// 2: remote access error (R_Key, bounds or access rights).
    RemoteAccessError,
    /// 3: remote operational error.
    RemoteOperationalError,
    /// 4: invalid RD request.
    InvalidRdRequest,
    /// 5..=31: reserved.
    Reserved(u8),
}

impl NakCode {
    /// From the 5-bit NAK code of a syndrome (higher bits ignored).
    pub const fn from_code(c: u8) -> Self {
        match c & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Reserved(c),
        }
    }
    /// The 5-bit NAK code.
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c & 0x1f,
        }
    }
}

/// The AETH syndrome, decoded.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Syndrome {
    /// ACK, with the end-to-end credit count.
    Ack(CreditCode),
    /// RNR NAK, with the timer the requester must wait.
    RnrNak(RnrTimer),
    /// NAK, with its code.
    Nak(NakCode),
    /// Bit 7 set or type 10: reserved. The whole byte is kept.
    Reserved(u8),
}

impl Syndrome {
    /// Decode a syndrome byte. `Syndrome::from_byte(b).to_byte() == b` for every `b`.
    pub const fn from_byte(b: u8) -> Self {
        if b & 0x80 != 0 {
            return Syndrome::Reserved(b);
        }
        match (b >> 5) & 3 {
            0 => Syndrome::Ack(CreditCode::new(b)),
            1 => Syndrome::RnrNak(RnrTimer::new(b)),
            3 => Syndrome::Nak(NakCode::from_code(b)),
            _ => Syndrome::Reserved(b),
        }
    }
    /// Encode.
    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack(c) => c.code(),
            Syndrome::RnrNak(t) => 0x20 | t.code(),
            Syndrome::Nak(n) => 0x60 | n.code(),
            Syndrome::Reserved(b) => b,
        }
    }
    /// Whether this is an ACK (not an RNR NAK, NAK or reserved value).
    pub const fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack(_))
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Syndrome::Ack(c) => match c.credits() {
                Some(n) => write!(f, "ACK credits={n}"),
                None => write!(f, "ACK credits=untracked"),
            },
            Syndrome::RnrNak(t) => write!(f, "RNR_NAK timer={}us", t.as_micros()),
            Syndrome::Nak(NakCode::PsnSequenceError) => f.write_str("NAK PSN_SEQ_ERR"),
            Syndrome::Nak(NakCode::InvalidRequest) => f.write_str("NAK INV_REQ"),
            Syndrome::Nak(NakCode::RemoteAccessError) => f.write_str("NAK REM_ACCESS_ERR"),
            Syndrome::Nak(NakCode::RemoteOperationalError) => f.write_str("NAK REM_OP_ERR"),
            Syndrome::Nak(NakCode::InvalidRdRequest) => f.write_str("NAK INV_RD_REQ"),
            Syndrome::Nak(NakCode::Reserved(c)) => write!(f, "NAK reserved({c})"),
            Syndrome::Reserved(b) => write!(f, "reserved(0x{b:02x})"),
        }
    }
}

/// The owned form of an AETH.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct AethRepr {
    /// What the AETH says: ACK, RNR NAK or NAK.
    pub syndrome: Syndrome,
    /// 24-bit message sequence number.
    pub msn: u32,
}

impl AethRepr {
    /// Parse the 4 bytes at the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        need(Layer::Aeth, buf, HEADER_LEN)?;
        Ok(AethRepr {
            syndrome: Syndrome::from_byte(buf[0]),
            msn: rd24(buf, 1),
        })
    }
    /// Bytes on the wire (4).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Write the AETH to the start of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        need_room(buf, HEADER_LEN)?;
        buf[0] = self.syndrome.to_byte();
        wr24(buf, 1, self.msn & 0x00ff_ffff);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndrome_byte_round_trips_for_all_values() {
        for b in 0..=255u8 {
            assert_eq!(Syndrome::from_byte(b).to_byte(), b);
        }
    }

    #[test]
    fn nak_codes_match_roce_facts() {
        assert_eq!(
            Syndrome::from_byte(0x60),
            Syndrome::Nak(NakCode::PsnSequenceError)
        );
        assert_eq!(
            Syndrome::from_byte(0x61),
            Syndrome::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            Syndrome::from_byte(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(
            Syndrome::from_byte(0x63),
            Syndrome::Nak(NakCode::RemoteOperationalError)
        );
        assert_eq!(
            Syndrome::from_byte(0x64),
            Syndrome::Nak(NakCode::InvalidRdRequest)
        );
        assert_eq!(
            Syndrome::from_byte(0x1f),
            Syndrome::Ack(CreditCode::UNLIMITED)
        );
        assert_eq!(Syndrome::from_byte(0x40), Syndrome::Reserved(0x40));
    }

    #[test]
    fn rnr_timer_table_exact() {
        // Every entry of the RNR timer table, in ms as written in roce-facts.md (IBTA table 45).
        let ms = [
            655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64, 0.96,
            1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96, 61.44, 81.92,
            122.88, 163.84, 245.76, 327.68, 491.52,
        ];
        for (code, &m) in ms.iter().enumerate() {
            let us = (m * 1000.0f64).round() as u32;
            assert_eq!(RnrTimer::new(code as u8).as_micros(), us, "code {code}");
        }
        assert_eq!(RnrTimer::at_least_micros(100).code(), 7);
        assert_eq!(RnrTimer::at_least_micros(1_000_000).code(), 0);
    }

    #[test]
    fn credit_table() {
        assert_eq!(CreditCode::new(0).credits(), Some(0));
        assert_eq!(CreditCode::new(5).credits(), Some(6));
        assert_eq!(CreditCode::new(30).credits(), Some(32768));
        assert_eq!(CreditCode::UNLIMITED.credits(), None);
        assert_eq!(CreditCode::from_count(0).code(), 0);
        assert_eq!(CreditCode::from_count(5).code(), 4);
        assert_eq!(CreditCode::from_count(7).code(), 5);
        assert_eq!(CreditCode::from_count(1_000_000).code(), 30);
    }

    #[test]
    fn aeth_round_trip() {
        let bytes = [0x61, 0x12, 0x34, 0x56];
        let r = AethRepr::parse(&bytes).unwrap();
        assert_eq!(r.syndrome, Syndrome::Nak(NakCode::InvalidRequest));
        assert_eq!(r.msn, 0x123456);
        let mut out = [0u8; 4];
        r.emit(&mut out).unwrap();
        assert_eq!(out, bytes);
        assert!(AethRepr::parse(&bytes[..3]).is_err());
    }
}
