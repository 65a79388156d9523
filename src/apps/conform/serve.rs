//! The ferroce peer (`ferroce conform --serve`): a ferroce device that lets the tester see
//! everything — every test applies, memory and completions are observable — over a small
//! line protocol on TCP (one connection per session, each with its own QP):
//!
//! | request | answer |
//! | --- | --- |
//! | `hello` | `ok ferroce-conform/1 cnp_interval_us=N break=KNOBS` |
//! | `qp qpn=HEX psn=HEX gid=HEX32 mac=HEX12 rights=rwa recvs=N mtu=BYTES [retry_cnt=N rnr_retry=N timeout=N]` | `ok qpn= psn= gid= mtu= rkey= va= len= noread_rkey= ... max_dest_rd_atomic= min_rnr_timer= cnp_interval_us= retry_cnt= rnr_retry= timeout=` |
//! | `read va=HEX len=N` | `ok HEX` (N bytes of the peer's regions) |
//! | `recvs` / `sends` | `ok ok=N err=M` (receive / send completions so far; `sends` adds `first_err=STATUS`: RETRY_EXC_ERR, RNR_RETRY_EXC_ERR, WR_FLUSH_ERR, OTHER_ERR or none) |
//! | `post_send len=N` | `ok` (a signaled SEND of N bytes to the tester) |
//! | `state` | `ok state=RTS` (the QP's state: RESET INIT RTR RTS SQD SQE ERR) |
//! | `bye` | `ok` (the QP is moved to the error state) |
//!
//! Every malformed request gets `err ...`; a line longer than 4 KiB ends the connection.

use super::peer::{kv, Rights};
use crate::runtime::Nic;
use crate::verbs::{
    AccessFlags, Cq, MemoryRegion, Mtu, QpAttr, QpAttrMask, QpCap, QpState, RcParams, RecvWr,
    RemoteQp, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use crate::verbs::{MrError, VerbsError};
use crate::wire::{MacAddr, QpNumber};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Settings of the ferroce peer.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The device's CNP interval (reported to the tester; must match the device config).
    pub cnp_interval: Option<Duration>,
    /// Responder resources offered (max_dest_rd_atomic).
    pub max_dest_rd_atomic: u8,
    /// The RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// The largest path MTU (the link's).
    pub mtu: Mtu,
    /// Which GID index the QPs use.
    pub sgid_index: u8,
    /// Our GID (of `sgid_index`).
    pub gid: [u8; 16],
    /// The deliberate non-conformance knobs set on the device (reported in `hello`).
    pub knobs: String,
    /// Resolve the next hop's MAC address towards the tester through the kernel's routes and
    /// neighbours on this interface (the CLI sets it: a routed path needs the router's MAC);
    /// None, or when that fails: the `mac=` the tester sends.
    pub resolve_dev: Option<String>,
}

const MAIN_LEN: usize = 64 * 1024;
const SIDE_LEN: usize = 4096;
const RECV_LEN: u32 = 8192;

fn hex32(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// Why a request is refused (the text after `err `).
#[derive(Debug, thiserror::Error)]
enum RequestError {
    #[error("missing {0}=")]
    Missing(String),
    #[error("bad {key}={value}")]
    Bad { key: String, value: String },
    #[error("bad gid=")]
    BadGid,
    #[error("{key}= above {max}")]
    Above { key: String, max: u64 },
    #[error("this connection already has a QP")]
    HasQp,
    #[error("no QP yet")]
    NoQp,
    #[error("len too large")]
    TooLong,
    #[error("no region holds that range")]
    NoRegion,
    #[error("empty request")]
    Empty,
    #[error("unknown request {0:?}")]
    Unknown(String),
    #[error("{0}")]
    Verbs(#[from] VerbsError),
    #[error("{0}")]
    Mr(#[from] MrError),
}

fn num(
    m: &std::collections::HashMap<String, String>,
    k: &str,
    radix: u32,
) -> Result<u64, RequestError> {
    let v = m.get(k).ok_or_else(|| RequestError::Missing(k.into()))?;
    u64::from_str_radix(v.trim_start_matches("0x"), radix).map_err(|_| RequestError::Bad {
        key: k.into(),
        value: v.clone(),
    })
}

/// A work completion status as the `sends` answer names it (the verbs enum's names).
fn status_word(s: WcStatus) -> &'static str {
    match s {
        WcStatus::Success => "SUCCESS",
        WcStatus::RetryExcErr => "RETRY_EXC_ERR",
        WcStatus::RnrRetryExcErr => "RNR_RETRY_EXC_ERR",
        WcStatus::WrFlushErr => "WR_FLUSH_ERR",
        _ => "OTHER_ERR",
    }
}

/// One control connection's QP and regions.
struct Conn<'a> {
    nic: &'a Nic,
    o: &'a ServeOptions,
    qpn: Option<QpNumber>,
    cq: Option<Cq>,
    mrs: Vec<MemoryRegion>,
    send_mr: Option<MemoryRegion>,
    recv_ok: u64,
    recv_err: u64,
    send_ok: u64,
    send_err: u64,
    send_status: Option<WcStatus>,
}

impl Conn<'_> {
    fn poll(&mut self) {
        let Some(cq) = self.cq else { return };
        let mut wcs = Vec::new();
        loop {
            wcs.clear();
            if self.nic.poll_cq(cq, &mut wcs, 64).is_err() || wcs.is_empty() {
                break;
            }
            for wc in &wcs {
                let ok = wc.status == WcStatus::Success;
                match wc.opcode {
                    WcOpcode::Recv | WcOpcode::RecvRdmaWithImm if ok => self.recv_ok += 1,
                    WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => self.recv_err += 1,
                    _ if wc.wr_id >= 1 << 32 => {
                        if ok {
                            self.recv_ok += 1
                        } else {
                            self.recv_err += 1
                        }
                    }
                    _ if ok => self.send_ok += 1,
                    _ => {
                        self.send_err += 1;
                        self.send_status.get_or_insert(wc.status);
                    }
                }
            }
        }
    }

    fn qp(
        &mut self,
        m: &std::collections::HashMap<String, String>,
    ) -> Result<String, RequestError> {
        if self.qpn.is_some() {
            return Err(RequestError::HasQp);
        }
        let their_qpn = num(m, "qpn", 16)? as u32 & 0xff_ffff;
        let their_psn = num(m, "psn", 16)? as u32 & 0xff_ffff;
        let gid: [u8; 16] = m
            .get("gid")
            .and_then(|g| unhex(g))
            .and_then(|v| v.try_into().ok())
            .ok_or(RequestError::BadGid)?;
        let mac = m
            .get("mac")
            .and_then(|g| unhex(g))
            .and_then(|v| <[u8; 6]>::try_from(v).ok())
            .map(MacAddr)
            .unwrap_or(MacAddr::ZERO);
        let mac = self
            .o
            .resolve_dev
            .as_deref()
            .and_then(|dev| {
                crate::io::netdev::resolve(
                    super::frames::ip_of_gid(gid),
                    Some(dev),
                    Duration::from_secs(2),
                )
            })
            .unwrap_or(mac);
        let rights = Rights::parse(m.get("rights").map(String::as_str).unwrap_or("rwa"));
        let recvs = num(m, "recvs", 10).unwrap_or(64).min(1024) as u32;
        let mtu = m
            .get("mtu")
            .and_then(|v| v.parse::<u32>().ok())
            .and_then(Mtu::from_bytes)
            .map(|x| {
                if x.bytes() > self.o.mtu.bytes() {
                    self.o.mtu
                } else {
                    x
                }
            })
            .unwrap_or(self.o.mtu);
        // The requester's retry settings (defaults: ibv_rc_pingpong's).
        let small = |k: &str, max: u64, dflt: u8| -> Result<u8, RequestError> {
            match m.get(k) {
                None => Ok(dflt),
                Some(_) => {
                    let v = num(m, k, 10)?;
                    if v > max {
                        Err(RequestError::Above { key: k.into(), max })
                    } else {
                        Ok(v as u8)
                    }
                }
            }
        };
        let retry_cnt = small("retry_cnt", 7, 7)?;
        let rnr_retry = small("rnr_retry", 7, 7)?;
        let timeout = small("timeout", 31, 14)?;
        let nic = self.nic;
        let pd = nic.alloc_pd()?;
        let cq = nic.create_cq(4096)?;
        let cap = QpCap {
            max_send_wr: 64,
            max_recv_wr: recvs.max(1),
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qpn = crate::runtime::create_rc_qp(nic, pd, cq, cap)?;
        let all = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_ATOMIC;
        let main = nic.reg_mr(pd, MAIN_LEN, all)?;
        main.with_bytes_mut(|b| {
            for (i, x) in b.iter_mut().enumerate() {
                *x = (i as u8).wrapping_mul(7).wrapping_add(3);
            }
        });
        let noread = nic.reg_mr(pd, SIDE_LEN, all - AccessFlags::REMOTE_READ)?;
        let nowrite = nic.reg_mr(pd, SIDE_LEN, all - AccessFlags::REMOTE_WRITE)?;
        let noatomic = nic.reg_mr(pd, SIDE_LEN, all - AccessFlags::REMOTE_ATOMIC)?;
        let recv_mr = nic.reg_mr(
            pd,
            RECV_LEN as usize * recvs.max(1) as usize,
            AccessFlags::LOCAL_WRITE,
        )?;
        let send_mr = nic.reg_mr(pd, SIDE_LEN, AccessFlags::LOCAL_WRITE)?;
        send_mr.fill(0x5e);
        let mut access = AccessFlags::LOCAL_WRITE;
        if rights.read {
            access |= AccessFlags::REMOTE_READ;
        }
        if rights.write {
            access |= AccessFlags::REMOTE_WRITE;
        }
        if rights.atomic {
            access |= AccessFlags::REMOTE_ATOMIC;
        }
        let psn = (their_qpn.wrapping_mul(2_654_435_761) ^ 0x3a_5a5a) & 0xff_ffff;
        let p = RcParams {
            mtu,
            access,
            sgid_index: self.o.sgid_index,
            local_psn: psn,
            timeout,
            retry_cnt,
            rnr_retry,
            min_rnr_timer: self.o.min_rnr_timer,
            max_rd_atomic: 4,
            max_dest_rd_atomic: self.o.max_dest_rd_atomic,
            traffic_class: 0,
        };
        nic.connect_rc(
            qpn,
            &RemoteQp {
                qpn: QpNumber::new(their_qpn),
                gid,
                mac,
                psn: their_psn,
            },
            &p,
        )?;
        for i in 0..recvs {
            nic.post_recv(
                qpn,
                RecvWr {
                    wr_id: (1u64 << 32) | u64::from(i),
                    sg_list: smallvec::smallvec![Sge {
                        addr: recv_mr.addr() + u64::from(i * RECV_LEN),
                        length: RECV_LEN,
                        lkey: recv_mr.lkey(),
                    }],
                },
            )?;
        }
        let region = |p: &str, mr: &MemoryRegion| {
            format!(
                "{p}rkey={:x} {p}va={:x} {p}len={:x}",
                mr.rkey().0,
                mr.addr(),
                mr.len()
            )
        };
        let answer = format!(
            "qpn={:x} psn={psn:x} gid={} mtu={} {} {} {} {} max_dest_rd_atomic={} min_rnr_timer={} cnp_interval_us={} retry_cnt={retry_cnt} rnr_retry={rnr_retry} timeout={timeout}",
            qpn.get(),
            hex32(&self.o.gid),
            mtu.bytes(),
            region("", &main),
            region("noread_", &noread),
            region("nowrite_", &nowrite),
            region("noatomic_", &noatomic),
            self.o.max_dest_rd_atomic,
            self.o.min_rnr_timer,
            self.o.cnp_interval.map(|d| d.as_micros()).unwrap_or(0)
        );
        self.qpn = Some(qpn);
        self.cq = Some(cq);
        self.mrs = vec![main, noread, nowrite, noatomic, recv_mr];
        self.send_mr = Some(send_mr);
        Ok(answer)
    }

    fn handle(&mut self, line: &str) -> Result<String, RequestError> {
        let mut words = line.split_whitespace();
        let cmd = words.next().unwrap_or("");
        let m = kv(line);
        match cmd {
            "hello" => Ok(format!(
                "ferroce-conform/1 cnp_interval_us={} break={}",
                self.o.cnp_interval.map(|d| d.as_micros()).unwrap_or(0),
                if self.o.knobs.is_empty() {
                    "none"
                } else {
                    &self.o.knobs
                }
            )),
            "qp" => self.qp(&m),
            "read" => {
                let va = num(&m, "va", 16)?;
                let len = num(&m, "len", 10)? as usize;
                if len > 1 << 20 {
                    return Err(RequestError::TooLong);
                }
                let mr = self
                    .mrs
                    .iter()
                    .find(|r| va >= r.addr() && va + len as u64 <= r.addr() + r.len() as u64)
                    .ok_or(RequestError::NoRegion)?;
                let mut buf = vec![0u8; len];
                mr.read((va - mr.addr()) as usize, &mut buf)?;
                Ok(hex32(&buf))
            }
            "recvs" => {
                self.poll();
                Ok(format!("ok={} err={}", self.recv_ok, self.recv_err))
            }
            "sends" => {
                self.poll();
                Ok(format!(
                    "ok={} err={} first_err={}",
                    self.send_ok,
                    self.send_err,
                    self.send_status.map(status_word).unwrap_or("none")
                ))
            }
            "post_send" => {
                let len = num(&m, "len", 10)?.min(SIDE_LEN as u64) as u32;
                let (qpn, mr) = self
                    .qpn
                    .zip(self.send_mr.as_ref())
                    .ok_or(RequestError::NoQp)?;
                self.nic.post_send(
                    qpn,
                    SendWr::new(
                        7,
                        SendOp::Send,
                        vec![Sge {
                            addr: mr.addr(),
                            length: len,
                            lkey: mr.lkey(),
                        }],
                    ),
                )?;
                Ok(String::new())
            }
            "state" => {
                let qpn = self.qpn.ok_or(RequestError::NoQp)?;
                let (st, _) = self.nic.query_qp(qpn)?;
                let s = match st {
                    QpState::Reset => "RESET",
                    QpState::Init => "INIT",
                    QpState::Rtr => "RTR",
                    QpState::Rts => "RTS",
                    QpState::Sqd => "SQD",
                    QpState::Sqe => "SQE",
                    QpState::Err => "ERR",
                };
                Ok(format!("state={s}"))
            }
            "bye" => {
                self.end();
                Ok(String::new())
            }
            "" => Err(RequestError::Empty),
            c => Err(RequestError::Unknown(c.into())),
        }
    }

    fn end(&mut self) {
        if let Some(qpn) = self.qpn.take() {
            let a = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            let _ = self.nic.modify_qp(qpn, &a, QpAttrMask::STATE);
        }
    }
}

/// Serve one control connection until it closes.
pub fn serve_conn(nic: &Nic, o: &ServeOptions, s: TcpStream, stop: &AtomicBool) {
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let Ok(w) = s.try_clone() else { return };
    let mut w = w;
    let mut r = BufReader::new(s);
    let mut conn = Conn {
        nic,
        o,
        qpn: None,
        cq: None,
        mrs: Vec::new(),
        send_mr: None,
        recv_ok: 0,
        recv_err: 0,
        send_ok: 0,
        send_err: 0,
        send_status: None,
    };
    let mut line = String::new();
    loop {
        if line.ends_with('\n') {
            line.clear();
        }
        let room = 4096u64.saturating_sub(line.len() as u64);
        match std::io::Read::take(&mut r, room).read_line(&mut line) {
            Ok(0) if room == 0 => {
                let _ = writeln!(w, "err request too long");
                break;
            }
            Ok(0) => break,
            Ok(_) if !line.ends_with('\n') && line.len() >= 4096 => {
                let _ = writeln!(w, "err request too long");
                break;
            }
            Ok(_) if !line.ends_with('\n') => continue,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                continue;
            }
            Err(_) => break,
        }
        let answer = match conn.handle(line.trim()) {
            Ok(a) if a.is_empty() => "ok".to_string(),
            Ok(a) => format!("ok {a}"),
            Err(e) => format!("err {e}"),
        };
        if writeln!(w, "{answer}").is_err() {
            break;
        }
        if line.trim() == "bye" {
            break;
        }
    }
    conn.end();
}

/// Accept control connections until `stop` is set (checked between connections), each in
/// its own thread.
pub fn serve(nic: &Nic, o: &ServeOptions, l: TcpListener, stop: &AtomicBool) {
    let _ = l.set_nonblocking(true);
    std::thread::scope(|sc| {
        while !stop.load(Ordering::Relaxed) {
            match l.accept() {
                Ok((s, _)) => {
                    let _ = s.set_nonblocking(false);
                    sc.spawn(move || serve_conn(nic, o, s, stop));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
}
