//! Base Transport Header (IBTA Vol. 1 §9.2, 12 bytes):
//!
//! ```text
//! byte 0   opcode
//! byte 1   SE(1) M(1) PadCnt(2) TVer(4)
//! 2..4     P_Key
//! byte 4   FECN(1) BECN(1) reserved(6)      <- masked to 0xFF for the ICRC
//! 5..8     DestQP (24)
//! byte 8   AckReq(1) reserved(7)
//! 9..12    PSN (24)
//! ```

use super::{
    need, need_room, rd16, rd24, wr16, wr24, Field, Layer, Opcode, PKey, Psn, QpNumber, Result,
};

mod field {
    use super::Field;
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PKEY: Field = 2..4;
    pub const ECN_RSVD: usize = 4;
    pub const DEST_QP: Field = 5..8;
    pub const ACK_RSVD: usize = 8;
    pub const PSN: Field = 9..12;
}

/// Length of the BTH.
pub const HEADER_LEN: usize = super::BTH_LEN;
/// Offset of the byte that holds FECN, BECN and six reserved bits (masked for the ICRC).
pub const ECN_BYTE: usize = field::ECN_RSVD;

/// A zero-copy view of a BTH at the start of a buffer.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap without checking the length (emit path only).
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }
    /// Wrap after checking that a whole BTH is present.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Packet { buffer };
        p.check_len()?;
        Ok(p)
    }
    /// Ok if the buffer holds a whole BTH.
    pub fn check_len(&self) -> Result<()> {
        need(Layer::Bth, self.buffer.as_ref(), HEADER_LEN)
    }
    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// The opcode (byte 0).
    pub fn opcode(&self) -> Opcode {
        Opcode(self.b()[field::OPCODE])
    }
    /// Solicited event (SE) bit.
    pub fn solicited(&self) -> bool {
        self.b()[field::FLAGS] & 0x80 != 0
    }
    /// Migration request (MigReq) bit.
    pub fn mig_req(&self) -> bool {
        self.b()[field::FLAGS] & 0x40 != 0
    }
    /// Pad count: bytes of pad before the ICRC (0..=3).
    pub fn pad_count(&self) -> u8 {
        (self.b()[field::FLAGS] >> 4) & 0x3
    }
    /// Transport header version (0).
    pub fn tver(&self) -> u8 {
        self.b()[field::FLAGS] & 0x0f
    }
    /// Partition key.
    pub fn pkey(&self) -> PKey {
        PKey(rd16(self.b(), field::PKEY.start))
    }
    /// Forward explicit congestion notification (FECN) bit.
    pub fn fecn(&self) -> bool {
        self.b()[field::ECN_RSVD] & 0x80 != 0
    }
    /// Backward explicit congestion notification (BECN) bit.
    pub fn becn(&self) -> bool {
        self.b()[field::ECN_RSVD] & 0x40 != 0
    }
    /// The six reserved bits of byte 4 (should be zero).
    pub fn resv6(&self) -> u8 {
        self.b()[field::ECN_RSVD] & 0x3f
    }
    /// Destination QP number (24 bits).
    pub fn dest_qp(&self) -> QpNumber {
        QpNumber::new(rd24(self.b(), field::DEST_QP.start))
    }
    /// Acknowledge request (AckReq) bit.
    pub fn ack_req(&self) -> bool {
        self.b()[field::ACK_RSVD] & 0x80 != 0
    }
    /// The seven reserved bits of byte 8 (should be zero).
    pub fn resv7(&self) -> u8 {
        self.b()[field::ACK_RSVD] & 0x7f
    }
    /// Packet sequence number (24 bits).
    pub fn psn(&self) -> Psn {
        Psn::new(rd24(self.b(), field::PSN.start))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Set the opcode.
    pub fn set_opcode(&mut self, op: Opcode) {
        self.bm()[field::OPCODE] = op.0;
    }
    /// Set FECN/BECN, leaving the reserved bits alone.
    pub fn set_fecn_becn(&mut self, fecn: bool, becn: bool) {
        let b = &mut self.bm()[field::ECN_RSVD];
        *b = (*b & 0x3f) | (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }
    /// Set the AckReq bit, leaving the reserved bits alone.
    pub fn set_ack_req(&mut self, v: bool) {
        let b = &mut self.bm()[field::ACK_RSVD];
        *b = (*b & 0x7f) | (u8::from(v) << 7);
    }
    /// Set the PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        wr24(self.bm(), field::PSN.start, psn.get());
    }
    /// Set the destination QP.
    pub fn set_dest_qp(&mut self, qp: QpNumber) {
        wr24(self.bm(), field::DEST_QP.start, qp.get());
    }
}

/// The owned form of a BTH. Reserved bits are not modelled: they are emitted as zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// The opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request.
    pub mig_req: bool,
    /// Pad count (0..=3).
    pub pad_count: u8,
    /// Transport header version.
    pub tver: u8,
    /// Partition key.
    pub pkey: PKey,
    /// Forward ECN.
    pub fecn: bool,
    /// Backward ECN.
    pub becn: bool,
    /// Destination QP.
    pub dest_qp: QpNumber,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// A BTH with RoCE defaults (P_Key 0xFFFF, TVer 0, no flags).
    pub fn new(opcode: Opcode, dest_qp: QpNumber, psn: Psn) -> Self {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Parse from the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let p = Packet::new_checked(buf)?;
        Ok(BthRepr {
            opcode: p.opcode(),
            solicited: p.solicited(),
            mig_req: p.mig_req(),
            pad_count: p.pad_count(),
            tver: p.tver(),
            pkey: p.pkey(),
            fecn: p.fecn(),
            becn: p.becn(),
            dest_qp: p.dest_qp(),
            ack_req: p.ack_req(),
            psn: p.psn(),
        })
    }

    /// Bytes needed to emit.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write into the start of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        need_room(buf, HEADER_LEN)?;
        buf[field::OPCODE] = self.opcode.0;
        buf[field::FLAGS] = (u8::from(self.solicited) << 7)
            | (u8::from(self.mig_req) << 6)
            | ((self.pad_count & 3) << 4)
            | (self.tver & 0x0f);
        wr16(buf, field::PKEY.start, self.pkey.0);
        buf[field::ECN_RSVD] = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6);
        wr24(buf, field::DEST_QP.start, self.dest_qp.get());
        buf[field::ACK_RSVD] = u8::from(self.ack_req) << 7;
        wr24(buf, field::PSN.start, self.psn.get());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The BTH of the UC SEND_ONLY known-answer frame in roce-facts.md (scapy's RoCE test).
    const UC_BTH: [u8; 12] = [
        0x24, 0x60, 0xff, 0xff, 0x00, 0x00, 0x00, 0xd3, 0x00, 0xcf, 0x17, 0x10,
    ];

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&UC_BTH[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::UC_SEND_ONLY);
        assert!(!p.solicited());
        assert!(p.mig_req());
        assert_eq!(p.pad_count(), 2);
        assert_eq!(p.tver(), 0);
        assert_eq!(p.pkey(), PKey::DEFAULT);
        assert_eq!(p.dest_qp(), QpNumber::new(0xd3));
        assert!(!p.ack_req());
        assert_eq!(p.psn(), Psn::new(0xcf1710));
    }

    #[test]
    fn round_trip() {
        let r = BthRepr::parse(&UC_BTH).unwrap();
        let mut out = [0u8; 12];
        r.emit(&mut out).unwrap();
        assert_eq!(out, UC_BTH);
    }

    #[test]
    fn short_buffers_are_errors() {
        for n in 0..12 {
            assert!(BthRepr::parse(&UC_BTH[..n]).is_err());
            let mut out = vec![0u8; n];
            assert!(BthRepr::parse(&UC_BTH).unwrap().emit(&mut out).is_err());
        }
    }
}
