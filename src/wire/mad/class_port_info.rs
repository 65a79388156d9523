//! ClassPortInfo (IBTA Vol. 1 §13.4.8.1, table 152): the attribute every management class
//! answers to describe itself; 72 bytes at the start of the attribute data.
//!
//! ```text
//! 0       BaseVersion            1       ClassVersion
//! 2..4    CapabilityMask
//! 4..8    CapabilityMask2 (27) | RespTimeValue (5)
//! 8..24   RedirectGID
//! 24..28  RedirectTC (8) | RedirectSL (4) | RedirectFL (20)
//! 28..30  RedirectLID            30..32  RedirectP_Key
//! 32..36  reserved (8) | RedirectQP (24)
//! 36..40  RedirectQ_Key
//! 40..56  TrapGID
//! 56..60  TrapTC (8) | TrapSL (4) | TrapFL (20)
//! 60..62  TrapLID                62..64  TrapP_Key
//! 64..68  TrapHL (8) | TrapQP (24)
//! 68..72  TrapQ_Key
//! ```

use super::{get_array, Bits, Gid, DATA_LEN};
use crate::wire::{need, Error, Layer, Result};

/// Bytes of the ClassPortInfo attribute.
pub const LEN: usize = 72;

mod field {
    use super::Bits;
    pub const BASE_VERSION: Bits = Bits::bytes(0, 1);
    pub const CLASS_VERSION: Bits = Bits::bytes(1, 1);
    pub const CAPABILITY_MASK: Bits = Bits::bytes(2, 2);
    pub const CAPABILITY_MASK2: Bits = Bits::new(4, 0, 27);
    pub const RESP_TIME_VALUE: Bits = Bits::new(7, 3, 5);
    pub const REDIRECT_GID: usize = 8;
    pub const REDIRECT_TC: Bits = Bits::bytes(24, 1);
    pub const REDIRECT_SL: Bits = Bits::new(25, 0, 4);
    pub const REDIRECT_FL: Bits = Bits::new(25, 4, 20);
    pub const REDIRECT_LID: Bits = Bits::bytes(28, 2);
    pub const REDIRECT_PKEY: Bits = Bits::bytes(30, 2);
    pub const REDIRECT_QP: Bits = Bits::new(33, 0, 24);
    pub const REDIRECT_QKEY: Bits = Bits::bytes(36, 4);
    pub const TRAP_GID: usize = 40;
    pub const TRAP_TC: Bits = Bits::bytes(56, 1);
    pub const TRAP_SL: Bits = Bits::new(57, 0, 4);
    pub const TRAP_FL: Bits = Bits::new(57, 4, 20);
    pub const TRAP_LID: Bits = Bits::bytes(60, 2);
    pub const TRAP_PKEY: Bits = Bits::bytes(62, 2);
    pub const TRAP_HL: Bits = Bits::bytes(64, 1);
    pub const TRAP_QP: Bits = Bits::new(65, 0, 24);
    pub const TRAP_QKEY: Bits = Bits::bytes(68, 4);
}

/// The owned form of ClassPortInfo. The reserved byte before RedirectQP and the 160 bytes
/// after the attribute are not modelled (emitted as zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ClassPortInfoRepr {
    /// The MAD base version (1).
    pub base_version: u8,
    /// The class version.
    pub class_version: u8,
    /// The class's capability mask.
    pub capability_mask: u16,
    /// 27 bits.
    pub capability_mask2: u32,
    /// 5 bits: the class's response time, 4.096 µs × 2^value.
    pub resp_time_value: u8,
    /// Redirection: the GID.
    pub redirect_gid: Gid,
    /// Redirection: the traffic class.
    pub redirect_tc: u8,
    /// 4 bits.
    pub redirect_sl: u8,
    /// 20 bits.
    pub redirect_fl: u32,
    /// Redirection: the LID.
    pub redirect_lid: u16,
    /// Redirection: the P_Key.
    pub redirect_pkey: u16,
    /// 24 bits.
    pub redirect_qp: u32,
    /// Redirection: the Q_Key.
    pub redirect_qkey: u32,
    /// Traps: the GID to send them to.
    pub trap_gid: Gid,
    /// Traps: the traffic class.
    pub trap_tc: u8,
    /// 4 bits.
    pub trap_sl: u8,
    /// 20 bits.
    pub trap_fl: u32,
    /// Traps: the LID.
    pub trap_lid: u16,
    /// Traps: the P_Key.
    pub trap_pkey: u16,
    /// Traps: the hop limit.
    pub trap_hl: u8,
    /// 24 bits.
    pub trap_qp: u32,
    /// Traps: the Q_Key.
    pub trap_qkey: u32,
}

impl ClassPortInfoRepr {
    /// Parse from attribute data (at least [`LEN`] bytes).
    pub fn parse(data: &[u8]) -> Result<Self> {
        need(Layer::MadAttribute, data, LEN)?;
        let d = data;
        Ok(ClassPortInfoRepr {
            base_version: field::BASE_VERSION.get(d) as u8,
            class_version: field::CLASS_VERSION.get(d) as u8,
            capability_mask: field::CAPABILITY_MASK.get(d) as u16,
            capability_mask2: field::CAPABILITY_MASK2.get(d) as u32,
            resp_time_value: field::RESP_TIME_VALUE.get(d) as u8,
            redirect_gid: Gid(get_array(d, field::REDIRECT_GID)),
            redirect_tc: field::REDIRECT_TC.get(d) as u8,
            redirect_sl: field::REDIRECT_SL.get(d) as u8,
            redirect_fl: field::REDIRECT_FL.get(d) as u32,
            redirect_lid: field::REDIRECT_LID.get(d) as u16,
            redirect_pkey: field::REDIRECT_PKEY.get(d) as u16,
            redirect_qp: field::REDIRECT_QP.get(d) as u32,
            redirect_qkey: field::REDIRECT_QKEY.get(d) as u32,
            trap_gid: Gid(get_array(d, field::TRAP_GID)),
            trap_tc: field::TRAP_TC.get(d) as u8,
            trap_sl: field::TRAP_SL.get(d) as u8,
            trap_fl: field::TRAP_FL.get(d) as u32,
            trap_lid: field::TRAP_LID.get(d) as u16,
            trap_pkey: field::TRAP_PKEY.get(d) as u16,
            trap_hl: field::TRAP_HL.get(d) as u8,
            trap_qp: field::TRAP_QP.get(d) as u32,
            trap_qkey: field::TRAP_QKEY.get(d) as u32,
        })
    }

    /// Write the attribute data: [`DATA_LEN`] bytes, everything after the attribute zero.
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        if data.len() < DATA_LEN {
            return Err(Error::BufferTooSmall {
                needed: DATA_LEN,
                had: data.len(),
            });
        }
        let d = &mut data[..DATA_LEN];
        d.fill(0);
        field::BASE_VERSION.set(d, self.base_version.into());
        field::CLASS_VERSION.set(d, self.class_version.into());
        field::CAPABILITY_MASK.set(d, self.capability_mask.into());
        field::CAPABILITY_MASK2.set(d, self.capability_mask2.into());
        field::RESP_TIME_VALUE.set(d, self.resp_time_value.into());
        d[field::REDIRECT_GID..field::REDIRECT_GID + 16].copy_from_slice(&self.redirect_gid.0);
        field::REDIRECT_TC.set(d, self.redirect_tc.into());
        field::REDIRECT_SL.set(d, self.redirect_sl.into());
        field::REDIRECT_FL.set(d, self.redirect_fl.into());
        field::REDIRECT_LID.set(d, self.redirect_lid.into());
        field::REDIRECT_PKEY.set(d, self.redirect_pkey.into());
        field::REDIRECT_QP.set(d, self.redirect_qp.into());
        field::REDIRECT_QKEY.set(d, self.redirect_qkey.into());
        d[field::TRAP_GID..field::TRAP_GID + 16].copy_from_slice(&self.trap_gid.0);
        field::TRAP_TC.set(d, self.trap_tc.into());
        field::TRAP_SL.set(d, self.trap_sl.into());
        field::TRAP_FL.set(d, self.trap_fl.into());
        field::TRAP_LID.set(d, self.trap_lid.into());
        field::TRAP_PKEY.set(d, self.trap_pkey.into());
        field::TRAP_HL.set(d, self.trap_hl.into());
        field::TRAP_QP.set(d, self.trap_qp.into());
        field::TRAP_QKEY.set(d, self.trap_qkey.into());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let r = ClassPortInfoRepr {
            base_version: 1,
            class_version: 2,
            capability_mask: 0x0100,
            capability_mask2: 0x7ff_ffff,
            resp_time_value: 18,
            redirect_gid: Gid([0xaa; 16]),
            redirect_tc: 0x12,
            redirect_sl: 0x3,
            redirect_fl: 0xabcde,
            redirect_lid: 0x1234,
            redirect_pkey: 0xffff,
            redirect_qp: 0x00c0de,
            redirect_qkey: 0x8001_0000,
            trap_gid: Gid([0xbb; 16]),
            trap_tc: 0x34,
            trap_sl: 0xf,
            trap_fl: 0x12345,
            trap_lid: 0x5678,
            trap_pkey: 0x7fff,
            trap_hl: 0x40,
            trap_qp: 0x000001,
            trap_qkey: 0x1111_1111,
        };
        let mut d = [0xeeu8; DATA_LEN];
        r.emit(&mut d).unwrap();
        assert_eq!(&d[0..8], &[1, 2, 0x01, 0x00, 0xff, 0xff, 0xff, 0xe0 | 18]);
        assert_eq!(&d[24..28], &[0x12, 0x3a, 0xbc, 0xde]);
        assert_eq!(
            &d[28..40],
            &[0x12, 0x34, 0xff, 0xff, 0, 0, 0xc0, 0xde, 0x80, 1, 0, 0]
        );
        assert_eq!(
            &d[56..72],
            &[
                0x34, 0xf1, 0x23, 0x45, 0x56, 0x78, 0x7f, 0xff, 0x40, 0, 0, 1, 0x11, 0x11, 0x11,
                0x11
            ]
        );
        assert!(d[LEN..].iter().all(|&b| b == 0));
        assert_eq!(ClassPortInfoRepr::parse(&d).unwrap(), r);
        assert!(ClassPortInfoRepr::parse(&d[..LEN - 1]).is_err());
        assert!(r.emit(&mut d[..DATA_LEN - 1]).is_err());
    }
}
