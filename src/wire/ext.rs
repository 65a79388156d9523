//! Extension transport headers (IBTA Vol. 1 §9.3) and [`ExtRepr`], the set of them that
//! follows one BTH, parsed and emitted according to the opcode table.
//!
//! ```text
//! RETH       16  VA(64) R_Key(32) DMA length(32)
//! AtomicETH  28  VA(64) R_Key(32) swap/add data(64) compare data(64)
//! AtomicAck   8  original remote data(64)
//! AETH        4  see aeth.rs
//! ImmDt       4  immediate data(32)
//! IETH        4  R_Key to invalidate(32)
//! DETH        8  Q_Key(32) reserved(8) source QP(24)
//! RDETH       4  reserved(8) EE context(24)
//! XRCETH      4  reserved(8) XRC SRQ(24)
//! FETH        4  FLUSH type and placement (Memory Placement Extensions)
//! CNP        16  reserved, zero (RoCE v2 Annex A17.9.3)
//! ```

use super::opcode::{Ext, Headers};
use super::{
    need, need_room, rd24, rd32, rd64, wr24, wr32, wr64, AethRepr, Error, Opcode, QKey, QpNumber,
    RKey, Result,
};

/// RDMA Extended Transport Header.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct RethRepr {
    /// Virtual address of the remote buffer.
    pub va: u64,
    /// Remote key of the memory region.
    pub rkey: RKey,
    /// Length of the whole message (DMA length).
    pub dma_len: u32,
}

/// Atomic Extended Transport Header.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct AtomicEthRepr {
    /// Virtual address of the 8-byte remote operand.
    pub va: u64,
    /// Remote key of the memory region.
    pub rkey: RKey,
    /// Swap value (CMP_SWAP) or addend (FETCH_ADD).
    pub swap_add: u64,
    /// Compare value (CMP_SWAP only).
    pub compare: u64,
}

/// Datagram Extended Transport Header.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: QKey,
    /// Source QP number.
    pub src_qp: QpNumber,
}

/// All extension headers that may follow a BTH; each is present exactly when the opcode's
/// table entry says so. The CNP's 16 reserved bytes have no fields: they are emitted as zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct ExtRepr {
    /// RDETH EE context (RD only).
    pub rdeth: Option<u32>,
    /// DETH (UD, RD).
    pub deth: Option<DethRepr>,
    /// XRCETH XRC SRQ number (XRC requests only).
    pub xrceth: Option<u32>,
    /// FETH raw word (FLUSH only).
    pub feth: Option<u32>,
    /// RETH (RDMA WRITE and READ requests).
    pub reth: Option<RethRepr>,
    /// AtomicETH (atomic requests).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AETH (acknowledgements and read responses).
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH original data.
    pub atomic_ack: Option<u64>,
    /// Immediate data, as the 32-bit big-endian number on the wire.
    pub imm: Option<u32>,
    /// IETH: the R_Key to invalidate.
    pub ieth: Option<RKey>,
}

impl ExtRepr {
    /// Which headers are present.
    pub fn headers(&self) -> Headers {
        let mut h = Headers::empty();
        h.set(Headers::RDETH, self.rdeth.is_some());
        h.set(Headers::DETH, self.deth.is_some());
        h.set(Headers::XRCETH, self.xrceth.is_some());
        h.set(Headers::FETH, self.feth.is_some());
        h.set(Headers::RETH, self.reth.is_some());
        h.set(Headers::ATOMIC_ETH, self.atomic_eth.is_some());
        h.set(Headers::AETH, self.aeth.is_some());
        h.set(Headers::ATOMIC_ACK_ETH, self.atomic_ack.is_some());
        h.set(Headers::IMM_DT, self.imm.is_some());
        h.set(Headers::IETH, self.ieth.is_some());
        h
    }

    /// Whether these headers are exactly the ones `opcode` carries.
    pub fn matches(&self, opcode: Opcode) -> bool {
        self.headers() == opcode.headers().difference(Headers::CNP_RSVD)
    }

    /// Parse the extension headers of `opcode` from `buf`, which starts right after the BTH.
    /// Returns the headers and their total length.
    pub fn parse(opcode: Opcode, buf: &[u8]) -> Result<(ExtRepr, usize)> {
        let mut r = ExtRepr::default();
        let n = r.parse_into(opcode, buf)?;
        Ok((r, n))
    }

    /// [`parse`](Self::parse) into `self` (which must be empty, as `ExtRepr::default()`), so
    /// a caller that holds the headers inside a larger value does not move them into it.
    /// Returns the headers' total length.
    pub(crate) fn parse_into(&mut self, opcode: Opcode, buf: &[u8]) -> Result<usize> {
        let info = opcode.info();
        let r = self;
        let mut off = 0usize;
        for ext in Ext::ALL {
            if !info.headers.contains(ext.flag()) {
                continue;
            }
            let n = ext.size();
            need(ext.layer(), buf.get(off..).unwrap_or(&[]), n)?;
            let h = &buf[off..off + n];
            match ext {
                Ext::Rdeth => r.rdeth = Some(rd24(h, 1)),
                Ext::Deth => {
                    r.deth = Some(DethRepr {
                        qkey: QKey(rd32(h, 0)),
                        src_qp: QpNumber::new(rd24(h, 5)),
                    })
                }
                Ext::Xrceth => r.xrceth = Some(rd24(h, 1)),
                Ext::Feth => r.feth = Some(rd32(h, 0)),
                Ext::Reth => {
                    r.reth = Some(RethRepr {
                        va: rd64(h, 0),
                        rkey: RKey(rd32(h, 8)),
                        dma_len: rd32(h, 12),
                    })
                }
                Ext::AtomicEth => {
                    r.atomic_eth = Some(AtomicEthRepr {
                        va: rd64(h, 0),
                        rkey: RKey(rd32(h, 8)),
                        swap_add: rd64(h, 12),
                        compare: rd64(h, 20),
                    })
                }
                Ext::Aeth => r.aeth = Some(AethRepr::parse(h)?),
                Ext::AtomicAckEth => r.atomic_ack = Some(rd64(h, 0)),
                Ext::ImmDt => r.imm = Some(rd32(h, 0)),
                Ext::Ieth => r.ieth = Some(RKey(rd32(h, 0))),
                Ext::CnpRsvd => {}
            }
            off += n;
        }
        Ok(off)
    }

    /// Total length of the headers `opcode` carries (not counting the BTH).
    pub fn buffer_len(opcode: Opcode) -> usize {
        opcode.info().header_len as usize - super::BTH_LEN
    }

    /// Emit the headers of `opcode` into the start of `buf`. Fails with
    /// [`Error::HeaderMismatch`] if the headers present are not the opcode's.
    pub fn emit(&self, opcode: Opcode, buf: &mut [u8]) -> Result<usize> {
        if !self.matches(opcode) {
            return Err(Error::HeaderMismatch(opcode));
        }
        let total = Self::buffer_len(opcode);
        need_room(buf, total)?;
        let mut off = 0usize;
        for ext in Ext::ALL {
            if !opcode.headers().contains(ext.flag()) {
                continue;
            }
            let n = ext.size();
            let h = &mut buf[off..off + n];
            match ext {
                Ext::Rdeth => {
                    h[0] = 0;
                    wr24(h, 1, self.rdeth.unwrap_or(0) & 0xff_ffff);
                }
                Ext::Deth => {
                    let d = self.deth.unwrap_or_default();
                    wr32(h, 0, d.qkey.0);
                    h[4] = 0;
                    wr24(h, 5, d.src_qp.get());
                }
                Ext::Xrceth => {
                    h[0] = 0;
                    wr24(h, 1, self.xrceth.unwrap_or(0) & 0xff_ffff);
                }
                Ext::Feth => wr32(h, 0, self.feth.unwrap_or(0)),
                Ext::Reth => {
                    let r = self.reth.unwrap_or_default();
                    wr64(h, 0, r.va);
                    wr32(h, 8, r.rkey.0);
                    wr32(h, 12, r.dma_len);
                }
                Ext::AtomicEth => {
                    let a = self.atomic_eth.unwrap_or_default();
                    wr64(h, 0, a.va);
                    wr32(h, 8, a.rkey.0);
                    wr64(h, 12, a.swap_add);
                    wr64(h, 20, a.compare);
                }
                Ext::Aeth => {
                    if let Some(a) = self.aeth {
                        a.emit(h)?;
                    }
                }
                Ext::AtomicAckEth => wr64(h, 0, self.atomic_ack.unwrap_or(0)),
                Ext::ImmDt => wr32(h, 0, self.imm.unwrap_or(0)),
                Ext::Ieth => wr32(h, 0, self.ieth.unwrap_or_default().0),
                Ext::CnpRsvd => h.fill(0),
            }
            off += n;
        }
        Ok(off)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{NakCode, Syndrome};

    #[test]
    fn reth_imm_layout() {
        let mut buf = [0u8; 20];
        let ext = ExtRepr {
            reth: Some(RethRepr {
                va: 0x0000_7f7e_494c_2000,
                rkey: RKey(0x2f0),
                dma_len: 65536,
            }),
            imm: Some(0xdead_beef),
            ..Default::default()
        };
        assert_eq!(ext.emit(Opcode::RC_WRITE_ONLY_IMM, &mut buf).unwrap(), 20);
        assert_eq!(
            buf,
            [
                0x00, 0x00, 0x7f, 0x7e, 0x49, 0x4c, 0x20, 0x00, 0x00, 0x00, 0x02, 0xf0, 0x00, 0x01,
                0x00, 0x00, 0xde, 0xad, 0xbe, 0xef
            ]
        );
        let (back, n) = ExtRepr::parse(Opcode::RC_WRITE_ONLY_IMM, &buf).unwrap();
        assert_eq!(n, 20);
        assert_eq!(back, ext);
    }

    #[test]
    fn mismatched_headers_rejected() {
        let mut buf = [0u8; 64];
        let ext = ExtRepr {
            imm: Some(1),
            ..Default::default()
        };
        assert_eq!(
            ext.emit(Opcode::RC_WRITE_ONLY, &mut buf),
            Err(Error::HeaderMismatch(Opcode::RC_WRITE_ONLY))
        );
        let ack = ExtRepr {
            aeth: Some(AethRepr {
                syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                msn: 7,
            }),
            ..Default::default()
        };
        assert!(ack.matches(Opcode::RC_ACK));
        assert!(!ack.matches(Opcode::RC_ATOMIC_ACK));
        assert!(ExtRepr::default().matches(Opcode::CNP));
    }

    #[test]
    fn truncated_extension_is_typed() {
        let buf = [0u8; 27];
        assert!(matches!(
            ExtRepr::parse(Opcode::RC_CMP_SWAP, &buf),
            Err(Error::Truncated {
                layer: crate::wire::Layer::AtomicEth,
                needed: 28,
                had: 27
            })
        ));
    }
}
