//! One-line, tcpdump-style rendering of RoCE packets, used by `ferroce inspect`, by traces and
//! by the snapshot tests.

use super::packet::{ParsedFrame, RoceRepr};
use super::IpRepr;
use core::fmt;

/// The transport part in one line: opcode, QPN, PSN, flags and every extension header field.
pub struct RoceLine<'a>(pub &'a RoceRepr);

impl fmt::Display for RoceLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.0;
        let b = &r.bth;
        write!(f, "{} qp={} psn={}", b.opcode, b.dest_qp, b.psn)?;
        if b.ack_req {
            f.write_str(" A")?;
        }
        if b.solicited {
            f.write_str(" SE")?;
        }
        if b.mig_req {
            f.write_str(" M")?;
        }
        if b.fecn {
            f.write_str(" FECN")?;
        }
        if b.becn {
            f.write_str(" BECN")?;
        }
        if b.pkey.0 != 0xffff {
            write!(f, " pkey={}", b.pkey)?;
        }
        let e = &r.ext;
        if let Some(v) = e.rdeth {
            write!(f, " rdeth[ee=0x{v:06x}]")?;
        }
        if let Some(d) = e.deth {
            write!(f, " deth[qkey={} srcqp={}]", d.qkey, d.src_qp)?;
        }
        if let Some(v) = e.xrceth {
            write!(f, " xrceth[srq=0x{v:06x}]")?;
        }
        if let Some(v) = e.feth {
            write!(f, " feth[0x{v:08x}]")?;
        }
        if let Some(x) = e.reth {
            write!(
                f,
                " reth[va=0x{:x} rkey={} len={}]",
                x.va, x.rkey, x.dma_len
            )?;
        }
        if let Some(x) = e.atomic_eth {
            write!(
                f,
                " atomic[va=0x{:x} rkey={} swap_add=0x{:x} cmp=0x{:x}]",
                x.va, x.rkey, x.swap_add, x.compare
            )?;
        }
        if let Some(x) = e.aeth {
            write!(f, " aeth[{} msn={}]", x.syndrome, x.msn)?;
        }
        if let Some(x) = e.atomic_ack {
            write!(f, " atomic_ack[orig=0x{x:x}]")?;
        }
        if let Some(x) = e.imm {
            write!(f, " imm=0x{x:08x}")?;
        }
        if let Some(x) = e.ieth {
            write!(f, " ieth[rkey={x}]")?;
        }
        write!(f, " len={}", r.payload_len)?;
        if b.pad_count != 0 {
            write!(f, " pad={}", b.pad_count)?;
        }
        Ok(())
    }
}

/// A whole frame in one line: addresses, ports, ECN, the transport line and the ICRC verdict.
pub struct FrameLine<'a, 'b>(pub &'a ParsedFrame<'b>);

impl fmt::Display for FrameLine<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.0;
        let r = &p.repr;
        let (src, dst) = (r.ip.src(), r.ip.dst());
        match r.ip {
            IpRepr::V4(_) => write!(f, "{}.{} > {}.{}", src, r.udp.src_port, dst, r.udp.dst_port)?,
            IpRepr::V6(_) => write!(
                f,
                "[{}].{} > [{}].{}",
                src, r.udp.src_port, dst, r.udp.dst_port
            )?,
        }
        if let Some(v) = r.eth.and_then(|e| e.vlan) {
            write!(f, " vlan={} pcp={}", v.vid, v.pcp)?;
        }
        let ecn = r.ip.ecn();
        if ecn != super::Ecn::NotEct {
            write!(f, " ecn={ecn:?}")?;
        }
        write!(f, ": {}", RoceLine(&r.roce))?;
        if p.icrc_ok() {
            f.write_str(" icrc=ok")
        } else {
            // Shown in wire byte order, as tshark and the IBTA examples show it.
            let (wire, calc) = (p.icrc_stored.swap_bytes(), p.icrc_computed.swap_bytes());
            write!(f, " icrc=BAD(wire={wire:08x} calc={calc:08x}")?;
            if p.icrc_stored.swap_bytes() == p.icrc_computed {
                f.write_str(", stored big-endian")?;
            }
            f.write_str(")")
        }
    }
}
