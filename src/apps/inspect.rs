//! `ferroce inspect`: decode every RoCE v2 packet of a capture, validate its ICRC and its
//! lengths, and summarise. Wireshark shows the ICRC but never checks it; this does.

use crate::pcap::capture::{linktype, CapturedFrame};
use crate::wire::packet::{decode_frame, decode_ip, ParsedFrame};
use crate::wire::{self, IpRepr, Opcode, ROCE_V2_PORT};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The ICRC verdict of one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IcrcVerdict {
    /// The ICRC on the wire is the one computed.
    Ok,
    /// It is not.
    Bad,
    /// The capture cut the packet short (snaplen) or it is malformed before the ICRC.
    Unverifiable,
}

/// What one frame turned out to be. Short-lived (one per frame, never stored), so the size
/// difference between variants is cheaper than a heap allocation per packet.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum Analysis<'a> {
    /// Not UDP port 4791: counted and skipped.
    NotRoce,
    /// A RoCE v2 packet that decoded.
    Roce(ParsedFrame<'a>),
    /// A RoCE v2 packet (UDP 4791) that did not decode; the opcode if the BTH was readable.
    Malformed {
        /// What is wrong.
        error: wire::Error,
        /// The BTH's opcode, if it was readable.
        opcode: Option<Opcode>,
    },
    /// The capture holds fewer bytes than the wire carried, so nothing can be verified.
    Truncated {
        /// The BTH's opcode, if it was captured.
        opcode: Option<Opcode>,
    },
}

/// Offset of the IP header for a link type, and whether the frame is Ethernet.
fn ip_offset(lt: u32, d: &[u8]) -> Option<(usize, bool)> {
    match lt {
        linktype::ETHERNET => Some((0, true)),
        linktype::RAW
        | linktype::RAW_OPENBSD
        | linktype::RAW_ALT
        | linktype::IPV4
        | linktype::IPV6 => Some((0, false)),
        linktype::LINUX_SLL => {
            let proto = u16::from_be_bytes([*d.get(14)?, *d.get(15)?]);
            matches!(proto, 0x0800 | 0x86dd).then_some((16, false))
        }
        linktype::LINUX_SLL2 => {
            let proto = u16::from_be_bytes([*d.first()?, *d.get(1)?]);
            matches!(proto, 0x0800 | 0x86dd).then_some((20, false))
        }
        _ => None,
    }
}

/// Whether the bytes at `ip` are IPv4/IPv6 + UDP to port 4791 (looked at without judging
/// anything else), and where the transport part starts.
fn roce_candidate(ip: &[u8]) -> Option<usize> {
    let (proto, l4) = match ip.first()? >> 4 {
        4 => {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            (*ip.get(9)?, ihl)
        }
        6 => (*ip.get(6)?, 40),
        _ => return None,
    };
    let dport = u16::from_be_bytes([*ip.get(l4 + 2)?, *ip.get(l4 + 3)?]);
    (proto == 17 && dport == ROCE_V2_PORT && l4 >= 20).then_some(l4 + 8)
}

/// Decode one captured frame.
pub fn analyse(f: &CapturedFrame) -> Analysis<'_> {
    let d = &f.data[..];
    let Some((off, is_eth)) = ip_offset(f.linktype, d) else {
        return Analysis::NotRoce;
    };
    let ip_start = if is_eth {
        match wire::EthernetRepr::parse(d) {
            Ok((e, n)) if matches!(e.ethertype, 0x0800 | 0x86dd) => n,
            _ => return Analysis::NotRoce,
        }
    } else {
        off
    };
    let Some(bth_off) = d.get(ip_start..).and_then(roce_candidate) else {
        return Analysis::NotRoce;
    };
    let opcode = d.get(ip_start + bth_off).map(|b| Opcode(*b));
    if (f.data.len() as u64) < u64::from(f.orig_len) {
        return Analysis::Truncated { opcode };
    }
    let r = if is_eth {
        decode_frame(d)
    } else {
        decode_ip(&d[off..])
    };
    match r {
        Ok(p) => Analysis::Roce(p),
        Err(error) => Analysis::Malformed { error, opcode },
    }
}

/// Totals over a capture.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Summary {
    /// The capture's name as shown.
    pub file: String,
    /// Frames in the capture.
    pub packets: u64,
    /// Frames to UDP port 4791.
    pub roce_packets: u64,
    /// Other frames (counted and skipped).
    pub non_roce: u64,
    /// RoCE packets with a good ICRC.
    pub icrc_ok: u64,
    /// RoCE packets with a bad ICRC.
    pub icrc_bad: u64,
    /// RoCE packets that did not decode.
    pub malformed: u64,
    /// RoCE packets cut short by the capture (unverifiable).
    pub truncated: u64,
    /// Opcode name → count, over decoded and malformed packets whose BTH was readable.
    pub opcodes: BTreeMap<String, u64>,
    /// The file ended in the middle of a record (the packets before it were inspected).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture_error: Option<String>,
}

impl Summary {
    /// True when every RoCE packet decoded and its ICRC verified.
    pub fn clean(&self) -> bool {
        self.icrc_bad == 0 && self.malformed == 0
    }

    /// Count one analysed frame.
    pub fn add(&mut self, a: &Analysis<'_>) {
        self.packets += 1;
        let op = match a {
            Analysis::NotRoce => {
                self.non_roce += 1;
                return;
            }
            Analysis::Roce(p) => {
                if p.icrc_ok() {
                    self.icrc_ok += 1;
                } else {
                    self.icrc_bad += 1;
                }
                Some(p.repr.roce.bth.opcode)
            }
            Analysis::Malformed { opcode, .. } => {
                self.malformed += 1;
                *opcode
            }
            Analysis::Truncated { opcode } => {
                self.truncated += 1;
                *opcode
            }
        };
        self.roce_packets += 1;
        if let Some(op) = op {
            *self.opcodes.entry(op.to_string()).or_default() += 1;
        }
    }

    /// The one-line text summary.
    pub fn line(&self) -> String {
        let mut ops: Vec<_> = self.opcodes.iter().collect();
        ops.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let ops: Vec<String> = ops.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        let mut s = format!(
            "{}: packets={} roce={} non_roce={} icrc_ok={} icrc_bad={} malformed={} truncated={} opcodes={{{}}}",
            self.file,
            self.packets,
            self.roce_packets,
            self.non_roce,
            self.icrc_ok,
            self.icrc_bad,
            self.malformed,
            self.truncated,
            ops.join(",")
        );
        if let Some(e) = &self.capture_error {
            let _ = write!(s, " capture_error=\"{e}\"");
        }
        s
    }
}

/// `HH:MM:SS.ffffff` (UTC) of a capture timestamp, as tcpdump prints it.
pub fn time_of_day(ts: std::time::Duration) -> String {
    let s = ts.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        s / 3600,
        (s / 60) % 60,
        s % 60,
        ts.subsec_micros()
    )
}

/// The tcpdump-style line for a RoCE frame (or `None` for a non-RoCE frame).
pub fn packet_line(f: &CapturedFrame, a: &Analysis<'_>) -> Option<String> {
    let head = format!("{:5} {}", f.index, time_of_day(f.ts));
    match a {
        Analysis::NotRoce => None,
        Analysis::Roce(p) => Some(format!("{head} {}", wire::pretty::FrameLine(p))),
        Analysis::Malformed { error, opcode } => Some(format!(
            "{head} {} MALFORMED: {error}",
            opcode.map_or_else(|| "?".to_string(), |o| o.to_string())
        )),
        Analysis::Truncated { opcode } => Some(format!(
            "{head} {} TRUNCATED (captured {} of {} bytes) icrc=unverifiable",
            opcode.map_or_else(|| "?".to_string(), |o| o.to_string()),
            f.data.len(),
            f.orig_len
        )),
    }
}

/// The `--verbose` field-by-field dump of a decoded frame.
pub fn verbose_dump(p: &ParsedFrame<'_>) -> String {
    let mut s = String::new();
    let r = &p.repr;
    if let Some(e) = r.eth {
        let _ = write!(s, "      Ethernet   dst={} src={}", e.dst, e.src);
        if let Some(v) = e.vlan {
            let _ = write!(s, " vlan={} pcp={} dei={}", v.vid, v.pcp, u8::from(v.dei));
        }
        let _ = writeln!(s, " type=0x{:04x}", e.ethertype);
    }
    match r.ip {
        IpRepr::V4(v) => {
            let _ = writeln!(
                s,
                "      IPv4       src={} dst={} dscp={} ecn={:?} id=0x{:04x} df={} ttl={} checksum={}",
                v.src,
                v.dst,
                v.dscp,
                v.ecn,
                v.ident,
                u8::from(v.dont_frag),
                v.ttl,
                if p.ip_checksum_ok { "ok" } else { "BAD" }
            );
        }
        IpRepr::V6(v) => {
            let _ = writeln!(
                s,
                "      IPv6       src={} dst={} dscp={} ecn={:?} flow=0x{:05x} hlim={}",
                v.src, v.dst, v.dscp, v.ecn, v.flow_label, v.hop_limit
            );
        }
    }
    let u = r.udp;
    let _ = writeln!(
        s,
        "      UDP        sport={} dport={} len={} checksum=0x{:04x}",
        u.src_port,
        u.dst_port,
        8 + r.roce.buffer_len(),
        u.checksum
    );
    let b = r.roce.bth;
    let _ = writeln!(
        s,
        "      BTH        opcode=0x{:02x} ({}) se={} m={} pad={} tver={} pkey={} fecn={} becn={} dqpn={} ackreq={} psn={}",
        b.opcode.0,
        b.opcode,
        u8::from(b.solicited),
        u8::from(b.mig_req),
        b.pad_count,
        b.tver,
        b.pkey,
        u8::from(b.fecn),
        u8::from(b.becn),
        b.dest_qp,
        u8::from(b.ack_req),
        b.psn
    );
    let e = r.roce.ext;
    if let Some(x) = e.rdeth {
        let _ = writeln!(s, "      RDETH      ee_context=0x{x:06x}");
    }
    if let Some(x) = e.deth {
        let _ = writeln!(s, "      DETH       qkey={} srcqp={}", x.qkey, x.src_qp);
    }
    if let Some(x) = e.xrceth {
        let _ = writeln!(s, "      XRCETH     srq=0x{x:06x}");
    }
    if let Some(x) = e.feth {
        let _ = writeln!(s, "      FETH       0x{x:08x}");
    }
    if let Some(x) = e.reth {
        let _ = writeln!(
            s,
            "      RETH       va=0x{:016x} rkey={} dmalen={}",
            x.va, x.rkey, x.dma_len
        );
    }
    if let Some(x) = e.atomic_eth {
        let _ = writeln!(
            s,
            "      AtomicETH  va=0x{:016x} rkey={} swap_add=0x{:016x} compare=0x{:016x}",
            x.va, x.rkey, x.swap_add, x.compare
        );
    }
    if let Some(x) = e.aeth {
        let _ = writeln!(
            s,
            "      AETH       syndrome=0x{:02x} ({}) msn={}",
            x.syndrome.to_byte(),
            x.syndrome,
            x.msn
        );
    }
    if let Some(x) = e.atomic_ack {
        let _ = writeln!(s, "      AtomicAck  orig=0x{x:016x}");
    }
    if let Some(x) = e.imm {
        let _ = writeln!(s, "      ImmDt      0x{x:08x}");
    }
    if let Some(x) = e.ieth {
        let _ = writeln!(s, "      IETH       rkey={x}");
    }
    let shown: Vec<String> = p
        .payload
        .iter()
        .take(32)
        .map(|b| format!("{b:02x}"))
        .collect();
    let _ = writeln!(
        s,
        "      payload    {} bytes{}{}{}",
        p.payload.len(),
        if shown.is_empty() { "" } else { ": " },
        shown.join(" "),
        if p.payload.len() > 32 { " ..." } else { "" }
    );
    if let Some(mad) = wire::pretty::gsi_mad(&r.roce, p.payload) {
        let _ = writeln!(s, "      MAD        {}", wire::pretty::MadLine(mad));
    }
    let _ = writeln!(
        s,
        "      ICRC       wire={:08x} calc={:08x} {} (wire byte order)",
        p.icrc_stored.swap_bytes(),
        p.icrc_computed.swap_bytes(),
        if p.icrc_ok() { "ok" } else { "BAD" }
    );
    s
}

/// The machine-readable record of one RoCE frame (`--json`).
#[derive(Debug, Serialize)]
pub struct PacketRecord {
    /// `packet`.
    pub kind: &'static str,
    /// 1-based position in the capture.
    pub index: usize,
    /// Seconds since the Unix epoch.
    pub ts: f64,
    /// Source IP address.
    pub src: Option<String>,
    /// Destination IP address.
    pub dst: Option<String>,
    /// UDP source port.
    pub sport: Option<u16>,
    /// ECN bits (`NotEct`, `Ect0`, `Ect1`, `Ce`).
    pub ecn: Option<String>,
    /// BTH opcode, as a number.
    pub opcode: Option<u8>,
    /// Its name (`RC_SEND_ONLY`).
    pub op: Option<String>,
    /// Destination QP.
    pub qpn: Option<u32>,
    /// PSN.
    pub psn: Option<u32>,
    /// AckReq bit.
    pub ack_req: Option<bool>,
    /// Solicited event bit.
    pub se: Option<bool>,
    /// MigReq bit.
    pub mig_req: Option<bool>,
    /// Pad count.
    pub pad: Option<u8>,
    /// Partition key.
    pub pkey: Option<u16>,
    /// FECN bit.
    pub fecn: Option<bool>,
    /// BECN bit.
    pub becn: Option<bool>,
    /// The extension headers' fields, by header name (`reth`, `aeth`, ...).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub ext: BTreeMap<&'static str, serde_json::Value>,
    /// Payload bytes (without the pad).
    pub payload_len: Option<usize>,
    /// A UD packet to QP1: its MAD (see [`mad_json`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mad: Option<serde_json::Value>,
    /// The ICRC verdict.
    pub icrc: IcrcVerdict,
    /// The ICRC on the wire (hex).
    pub icrc_wire: Option<String>,
    /// The ICRC computed (hex).
    pub icrc_calc: Option<String>,
    /// Why the packet is malformed, if it is.
    pub error: Option<String>,
}

/// Build the JSON record for a RoCE frame (or `None` for a non-RoCE frame).
pub fn packet_record(f: &CapturedFrame, a: &Analysis<'_>) -> Option<PacketRecord> {
    use serde_json::json;
    let mut rec = PacketRecord {
        kind: "packet",
        index: f.index,
        ts: f.ts.as_secs_f64(),
        src: None,
        dst: None,
        sport: None,
        ecn: None,
        opcode: None,
        op: None,
        qpn: None,
        psn: None,
        ack_req: None,
        se: None,
        mig_req: None,
        pad: None,
        pkey: None,
        fecn: None,
        becn: None,
        ext: BTreeMap::new(),
        payload_len: None,
        mad: None,
        icrc: IcrcVerdict::Unverifiable,
        icrc_wire: None,
        icrc_calc: None,
        error: None,
    };
    match a {
        Analysis::NotRoce => return None,
        Analysis::Malformed { error, opcode } => {
            rec.opcode = opcode.map(|o| o.0);
            rec.op = opcode.map(|o| o.to_string());
            rec.error = Some(error.to_string());
        }
        Analysis::Truncated { opcode } => {
            rec.opcode = opcode.map(|o| o.0);
            rec.op = opcode.map(|o| o.to_string());
            rec.error = Some("truncated by the capture".into());
        }
        Analysis::Roce(p) => {
            let r = &p.repr;
            let b = r.roce.bth;
            rec.src = Some(r.ip.src().to_string());
            rec.dst = Some(r.ip.dst().to_string());
            rec.sport = Some(r.udp.src_port);
            rec.ecn = Some(format!("{:?}", r.ip.ecn()).to_lowercase());
            rec.opcode = Some(b.opcode.0);
            rec.op = Some(b.opcode.to_string());
            rec.qpn = Some(b.dest_qp.get());
            rec.psn = Some(b.psn.get());
            rec.ack_req = Some(b.ack_req);
            rec.se = Some(b.solicited);
            rec.mig_req = Some(b.mig_req);
            rec.pad = Some(b.pad_count);
            rec.pkey = Some(b.pkey.0);
            rec.fecn = Some(b.fecn);
            rec.becn = Some(b.becn);
            let e = r.roce.ext;
            if let Some(x) = e.rdeth {
                rec.ext.insert("rdeth", json!({ "ee_context": x }));
            }
            if let Some(x) = e.deth {
                rec.ext.insert(
                    "deth",
                    json!({ "qkey": x.qkey.0, "src_qp": x.src_qp.get() }),
                );
            }
            if let Some(x) = e.xrceth {
                rec.ext.insert("xrceth", json!({ "srq": x }));
            }
            if let Some(x) = e.feth {
                rec.ext.insert("feth", json!(x));
            }
            if let Some(x) = e.reth {
                rec.ext.insert(
                    "reth",
                    json!({ "va": x.va, "rkey": x.rkey.0, "dma_len": x.dma_len }),
                );
            }
            if let Some(x) = e.atomic_eth {
                rec.ext.insert(
                    "atomic_eth",
                    json!({ "va": x.va, "rkey": x.rkey.0, "swap_add": x.swap_add, "compare": x.compare }),
                );
            }
            if let Some(x) = e.aeth {
                rec.ext.insert(
                    "aeth",
                    json!({ "syndrome": x.syndrome.to_byte(), "meaning": x.syndrome.to_string(), "msn": x.msn }),
                );
            }
            if let Some(x) = e.atomic_ack {
                rec.ext.insert("atomic_ack", json!({ "orig": x }));
            }
            if let Some(x) = e.imm {
                rec.ext.insert("imm", json!(x));
            }
            if let Some(x) = e.ieth {
                rec.ext.insert("ieth", json!({ "rkey": x.0 }));
            }
            rec.payload_len = Some(r.roce.payload_len);
            rec.mad = wire::pretty::gsi_mad(&r.roce, p.payload).map(mad_json);
            rec.icrc = if p.icrc_ok() {
                IcrcVerdict::Ok
            } else {
                IcrcVerdict::Bad
            };
            // Wire byte order (the four bytes as they appear in the frame).
            rec.icrc_wire = Some(format!("{:08x}", p.icrc_stored.swap_bytes()));
            rec.icrc_calc = Some(format!("{:08x}", p.icrc_computed.swap_bytes()));
        }
    }
    Some(rec)
}

/// The JSON of a MAD (the payload of a UD packet to QP1): the common header, and for a CM
/// message its fields (`cm`) with the RDMA-CM header of a REQ or SIDR_REQ (`rdma_cm`). Numbers
/// are numbers (the 64-bit transaction and service IDs too); a MAD that does not parse has an
/// `error`.
pub fn mad_json(b: &[u8]) -> serde_json::Value {
    use crate::wire::mad::cm::{CmMadRepr, CmMessage};
    use crate::wire::mad::rdma_cm::{service_id, HeaderRepr};
    use crate::wire::mad::{Mad, MgmtClass};
    use serde_json::json;
    let Ok(m) = Mad::new_checked(b) else {
        return json!({ "len": b.len(), "error": "truncated" });
    };
    let mut v = json!({
        "len": b.len(),
        "base_version": m.base_version(),
        "class": m.mgmt_class().0,
        "class_name": m.mgmt_class().name(),
        "class_version": m.class_version(),
        "method": m.method().0,
        "method_name": m.method().name(),
        "status": m.status().0,
        "class_specific": m.class_specific(),
        "tid": m.transaction_id(),
        "attr_id": m.attr_id().0,
        "attr_mod": m.attr_mod(),
    });
    if m.mgmt_class() != MgmtClass::CM {
        return v;
    }
    v["attr_name"] = json!(m.attr_id().name());
    let msg = match CmMadRepr::parse(b) {
        Ok(c) => c.msg,
        Err(e) => {
            v["error"] = json!(e.to_string());
            return v;
        }
    };
    let (cm, header) = match msg {
        CmMessage::Req(q) => {
            let p = q.primary;
            (
                json!({
                    "msg": "REQ", "local_comm_id": q.local_comm_id, "service_id": q.service_id,
                    "local_ca_guid": q.local_ca_guid, "local_qkey": q.local_qkey,
                    "local_qpn": q.local_qpn.get(), "starting_psn": q.starting_psn.get(),
                    "responder_resources": q.responder_resources,
                    "initiator_depth": q.initiator_depth,
                    "remote_cm_response_timeout": q.remote_cm_response_timeout,
                    "local_cm_response_timeout": q.local_cm_response_timeout,
                    "transport": q.transport.0, "retry_count": q.retry_count,
                    "rnr_retry_count": q.rnr_retry_count, "max_cm_retries": q.max_cm_retries,
                    "pkey": q.pkey.0, "path_mtu": q.path_mtu.0, "srq": q.srq,
                    "primary": {
                        "local_lid": p.local_lid, "remote_lid": p.remote_lid,
                        "local_gid": p.local_gid.to_string(), "remote_gid": p.remote_gid.to_string(),
                        "flow_label": p.flow_label, "packet_rate": p.packet_rate,
                        "traffic_class": p.traffic_class, "hop_limit": p.hop_limit, "sl": p.sl,
                        "local_ack_timeout": p.local_ack_timeout,
                    },
                }),
                Some((q.service_id, q.private_data.to_vec())),
            )
        }
        CmMessage::Rep(r) => (
            json!({
                "msg": "REP", "local_comm_id": r.local_comm_id, "remote_comm_id": r.remote_comm_id,
                "local_qkey": r.local_qkey, "local_qpn": r.local_qpn.get(),
                "starting_psn": r.starting_psn.get(), "responder_resources": r.responder_resources,
                "initiator_depth": r.initiator_depth, "target_ack_delay": r.target_ack_delay,
                "rnr_retry_count": r.rnr_retry_count, "srq": r.srq,
                "local_ca_guid": r.local_ca_guid,
            }),
            None,
        ),
        CmMessage::Rtu(t) => (
            json!({ "msg": "RTU", "local_comm_id": t.local_comm_id, "remote_comm_id": t.remote_comm_id }),
            None,
        ),
        CmMessage::Dreq(d) => (
            json!({ "msg": "DREQ", "local_comm_id": d.local_comm_id, "remote_comm_id": d.remote_comm_id,
                    "remote_qpn": d.remote_qpn.get() }),
            None,
        ),
        CmMessage::Drep(d) => (
            json!({ "msg": "DREP", "local_comm_id": d.local_comm_id, "remote_comm_id": d.remote_comm_id }),
            None,
        ),
        CmMessage::Rej(j) => (
            json!({ "msg": "REJ", "local_comm_id": j.local_comm_id, "remote_comm_id": j.remote_comm_id,
                    "message_rejected": j.message_rejected.0, "reject_info_len": j.reject_info_len,
                    "reason": j.reason.0, "reason_name": j.reason.name() }),
            None,
        ),
        CmMessage::Mra(a) => (
            json!({ "msg": "MRA", "local_comm_id": a.local_comm_id, "remote_comm_id": a.remote_comm_id,
                    "message_mraed": a.message_mraed.0, "service_timeout": a.service_timeout }),
            None,
        ),
        CmMessage::SidrReq(q) => (
            json!({ "msg": "SIDR_REQ", "request_id": q.request_id, "pkey": q.pkey.0,
                    "service_id": q.service_id }),
            Some((q.service_id, q.private_data.to_vec())),
        ),
        CmMessage::SidrRep(r) => (
            json!({ "msg": "SIDR_REP", "request_id": r.request_id, "status": r.status.0,
                    "qpn": r.qpn.get(), "qkey": r.qkey, "service_id": r.service_id }),
            None,
        ),
        CmMessage::ClassPortInfo(c) => (
            json!({ "msg": "ClassPortInfo", "base_version": c.base_version,
                    "class_version": c.class_version, "capability_mask": c.capability_mask,
                    "resp_time_value": c.resp_time_value }),
            None,
        ),
        CmMessage::Other { attr_id, .. } => (json!({ "msg": "other", "attr_id": attr_id.0 }), None),
    };
    v["cm"] = cm;
    if let Some((sid, pd)) = header {
        if let (Some((ps, port)), Ok(h)) = (service_id::split(sid), HeaderRepr::parse(&pd)) {
            v["rdma_cm"] = json!({
                "port_space": ps.name(), "port": port,
                "ip_version": if h.src_ip.is_ipv4() { 4 } else { 6 },
                "src_ip": h.src_ip.to_string(), "src_port": h.src_port,
                "dst_ip": h.dst_ip.to_string(),
            });
        }
    }
    v
}
