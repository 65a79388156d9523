//! One-line, tcpdump-style rendering of RoCE packets, used by `ferroce inspect`, by traces and
//! by the snapshot tests. A UD packet to QP1 also shows its MAD ([`MadLine`]): class, method,
//! attribute, transaction ID and, for CM messages, the communication IDs, QPN, starting PSN,
//! service ID and the RDMA-CM header's addresses.

use super::mad::cm::{CmMadRepr, CmMessage};
use super::mad::rdma_cm::{self, HeaderRepr};
use super::mad::{Mad, MAD_LEN};
use super::packet::{ParsedFrame, RoceRepr};
use super::{IpRepr, Opcode, QpNumber};
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
        if let Some(mad) = gsi_mad(&r.roce, p.payload) {
            write!(f, " {}", MadLine(mad))?;
        }
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

/// The MAD of a UD SEND to QP1 (the GSI), if this packet is one: its payload, which should be
/// exactly [`MAD_LEN`] bytes.
pub fn gsi_mad<'a>(r: &RoceRepr, payload: &'a [u8]) -> Option<&'a [u8]> {
    (r.bth.opcode == Opcode::UD_SEND_ONLY && r.bth.dest_qp == QpNumber::GSI).then_some(payload)
}

/// A MAD in one line: `mad[CLASS METHOD ATTRIBUTE tid=...]`, then for a CM message its fields
/// (`cm[REQ lcid=... sid=... qpn=... psn=... ...]`) and for a REQ or SIDR_REQ with an RDMA-CM
/// header `rdma_cm[TCP:7174 10.77.0.12:47214 > 10.77.0.11]`. A MAD that is cut short or does
/// not parse says so (`mad[truncated: 200 of 256 bytes]`).
pub struct MadLine<'a>(pub &'a [u8]);

impl fmt::Display for MadLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        let Ok(m) = Mad::new_checked(b) else {
            return write!(f, "mad[truncated: {} of {MAD_LEN} bytes]", b.len());
        };
        write!(f, "mad[{} {} ", m.mgmt_class(), m.method())?;
        // Attribute names are per class: the CM's, and ClassPortInfo which every class has.
        let attr = m.attr_id();
        if m.mgmt_class() == super::mad::MgmtClass::CM
            || attr == super::mad::AttrId::CLASS_PORT_INFO
        {
            write!(f, "{attr}")?;
        } else {
            write!(f, "attr=0x{:04x}", attr.0)?;
        }
        write!(f, " tid=0x{:016x}", m.transaction_id())?;
        if m.base_version() != 1 {
            write!(f, " base_version={}", m.base_version())?;
        }
        if m.status().0 != 0 {
            write!(f, " status={}", m.status())?;
        }
        if m.attr_mod() != 0 {
            write!(f, " attr_mod=0x{:08x}", m.attr_mod())?;
        }
        if b.len() != MAD_LEN {
            write!(f, " len={}", b.len())?;
        }
        f.write_str("]")?;
        if m.mgmt_class() != super::mad::MgmtClass::CM {
            return Ok(());
        }
        match CmMadRepr::parse(b) {
            Ok(c) => write!(f, " {}", CmLine(&c.msg)),
            Err(e) => write!(f, " cm[malformed: {e}]"),
        }
    }
}

/// The fields of a CM message that identify the connection: `cm[REQ lcid=... ...]`.
pub struct CmLine<'a>(pub &'a CmMessage);

impl fmt::Display for CmLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(f, "cm[{}", m.short_name())?;
        let header = match m {
            CmMessage::Req(q) => {
                write!(
                    f,
                    " lcid=0x{:08x} sid=0x{:016x} qpn={} psn=0x{:06x} mtu={} rr={} id={} retry={} rnr={} timeout={} gid={}>{}",
                    q.local_comm_id,
                    q.service_id,
                    q.local_qpn,
                    q.starting_psn.get(),
                    q.path_mtu,
                    q.responder_resources,
                    q.initiator_depth,
                    q.retry_count,
                    q.rnr_retry_count,
                    q.primary.local_ack_timeout,
                    q.primary.local_gid,
                    q.primary.remote_gid
                )?;
                Some((q.service_id, &q.private_data[..]))
            }
            CmMessage::Rep(p) => {
                write!(
                    f,
                    " lcid=0x{:08x} rcid=0x{:08x} qpn={} psn=0x{:06x} rr={} id={} rnr={}",
                    p.local_comm_id,
                    p.remote_comm_id,
                    p.local_qpn,
                    p.starting_psn.get(),
                    p.responder_resources,
                    p.initiator_depth,
                    p.rnr_retry_count
                )?;
                None
            }
            CmMessage::Rtu(t) => {
                write!(
                    f,
                    " lcid=0x{:08x} rcid=0x{:08x}",
                    t.local_comm_id, t.remote_comm_id
                )?;
                None
            }
            CmMessage::Drep(t) => {
                write!(
                    f,
                    " lcid=0x{:08x} rcid=0x{:08x}",
                    t.local_comm_id, t.remote_comm_id
                )?;
                None
            }
            CmMessage::Dreq(d) => {
                write!(
                    f,
                    " lcid=0x{:08x} rcid=0x{:08x} qpn={}",
                    d.local_comm_id, d.remote_comm_id, d.remote_qpn
                )?;
                None
            }
            CmMessage::Rej(j) => {
                write!(
                    f,
                    " lcid=0x{:08x} rcid=0x{:08x} msg={} reason={} ({})",
                    j.local_comm_id, j.remote_comm_id, j.message_rejected, j.reason.0, j.reason
                )?;
                None
            }
            CmMessage::Mra(a) => {
                write!(
                    f,
                    " lcid=0x{:08x} rcid=0x{:08x} msg={} timeout={}",
                    a.local_comm_id, a.remote_comm_id, a.message_mraed, a.service_timeout
                )?;
                None
            }
            CmMessage::SidrReq(q) => {
                write!(
                    f,
                    " reqid=0x{:08x} sid=0x{:016x}",
                    q.request_id, q.service_id
                )?;
                Some((q.service_id, &q.private_data[..]))
            }
            CmMessage::SidrRep(p) => {
                write!(
                    f,
                    " reqid=0x{:08x} status={} ({}) qpn={} qkey=0x{:08x} sid=0x{:016x}",
                    p.request_id, p.status.0, p.status, p.qpn, p.qkey, p.service_id
                )?;
                None
            }
            CmMessage::ClassPortInfo(c) => {
                write!(
                    f,
                    " class_version={} resp_time={}",
                    c.class_version, c.resp_time_value
                )?;
                None
            }
            CmMessage::Other { .. } => None,
        };
        f.write_str("]")?;
        if let Some((sid, pd)) = header {
            if let (Some((ps, port)), Ok(h)) =
                (rdma_cm::service_id::split(sid), HeaderRepr::parse(pd))
            {
                write!(f, " rdma_cm[{ps}:{port} ")?;
                match h.src_ip {
                    core::net::IpAddr::V4(a) => write!(f, "{a}:{}", h.src_port)?,
                    core::net::IpAddr::V6(a) => write!(f, "[{a}]:{}", h.src_port)?,
                }
                write!(f, " > {}]", h.dst_ip)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::mad::cm::{RejReason, RejRepr};

    #[test]
    fn mad_lines() {
        let rej = CmMadRepr::send(
            0x0000_0002_c2c1_a2d0,
            CmMessage::Rej(RejRepr {
                remote_comm_id: 0xd0a2_c1c2,
                reason: RejReason::INVALID_SERVICE_ID,
                ..RejRepr::default()
            }),
        )
        .to_bytes();
        assert_eq!(
            MadLine(&rej).to_string(),
            "mad[CM Send ConnectReject tid=0x00000002c2c1a2d0] \
             cm[REJ lcid=0x00000000 rcid=0xd0a2c1c2 msg=REQ reason=8 (invalid service ID)]"
        );
        assert_eq!(
            MadLine(&rej[..20]).to_string(),
            "mad[truncated: 20 of 256 bytes]"
        );
        assert_eq!(
            MadLine(&rej[..100]).to_string(),
            "mad[CM Send ConnectReject tid=0x00000002c2c1a2d0 len=100] \
             cm[malformed: truncated MAD attribute: need 232 bytes, have 76]"
        );
        let mut perf = rej;
        perf[1] = 0x04;
        perf[3] = 0x81;
        assert_eq!(
            MadLine(&perf).to_string(),
            "mad[Perf GetResp attr=0x0012 tid=0x00000002c2c1a2d0]"
        );
    }
}
