//! perftest's `-R` ("rdma_cm QPs: ON, Data ex. method: rdma_cm") over ferroce's RDMA-CM
//! ([`crate::runtime::cm`]).
//!
//! What perftest does with `-R` (observed between two Debian perftest 6.06 processes over
//! rxe, and checked against its source for facts): no TCP at all. The client connects a
//! control RC QP with RDMA-CM to the server's port (default 18515); every message of the
//! exchange (version, page size, cache line, MTU, key messages, bandwidth reports) is one
//! SEND of exactly its size on that QP, received into a posted buffer; key messages are
//! `struct pingpong_dest` in binary (big-endian). After the MTU, an
//! all-zero key message each way; the client connects the test QP with a second REQ to the
//! same port (responder resources and initiator depth the outstanding reads for READ and
//! ATOMIC tests, 0 otherwise; retry count `--retry_count`, RNR retry 7); another all-zero
//! round; then the exchange continues as over TCP (without the closing `done`), and both
//! connections are disconnected (DREQ/DREP) at the end.

use crate::oob::perftest::{MsgLink, UdPeer};
use crate::oob::CmError;
use crate::runtime::cm::{
    ca_guid_of, CmEvent, CmId, CmService, ConnParam, EventChannel, EventType, PortSpace, Resolver,
    UDP_QKEY,
};
use crate::runtime::Nic;
use crate::verbs::{
    AccessFlags, Cq, MemoryRegion, QpCap, QpInitAttr, RecvWr, SendOp, SendWr, Sge, WcOpcode,
    WcStatus,
};
use crate::wire::{MacAddr, Psn, QpNumber};
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SLOT: usize = 64;
const RECV_SLOTS: usize = 2;
/// How often a client tries again when the server does not listen yet (perftest's
/// `retry_rdma_connect`: 10 times, 100 ms apart; the control connection as ferroce's TCP
/// connect: for 5 s).
const CONNECT_TRIES: u32 = 50;
/// Connection requests (and SIDR_REQs) a server keeps waiting for acceptance: perftest's client
/// sends those of all its test QPs (`-q`) at once.
const LISTEN_BACKLOG: usize = 64;

/// The control connection and the CM service behind it.
pub struct RdmaLink {
    nic: Arc<Nic>,
    ch: EventChannel,
    server: bool,
    dst: Option<SocketAddr>,
    ctrl: CmId,
    listener: Option<CmId>,
    /// `-c UD`: the server's listener for the test QP's SIDR_REQ (RDMA_PS_UDP, same port).
    ud_listener: Option<CmId>,
    /// The test QPs' ids, in the order they connected.
    data: Vec<CmId>,
    data_ud: bool,
    qp: QpNumber,
    cq: Cq,
    send_mr: MemoryRegion,
    recv_mr: MemoryRegion,
    pending: VecDeque<Vec<u8>>,
    /// The control connection's DISCONNECTED came: once `pending` is empty, every wait ends.
    closed: bool,
    stash: VecDeque<CmEvent>,
    // Last: dropped after the ids are disconnected.
    svc: CmService,
}

fn err(detail: impl Into<String>) -> CmError {
    CmError::Malformed {
        what: "rdma_cm",
        detail: detail.into(),
    }
}

/// Wait for the next event of `id` (others are kept for later), at most `timeout`.
fn next_event(
    ch: &EventChannel,
    stash: &mut VecDeque<CmEvent>,
    id: Option<&CmId>,
    timeout: Duration,
) -> Result<CmEvent, CmError> {
    if let Some(i) = stash
        .iter()
        .position(|e| id.is_none_or(|x| &e.id == x || e.listen_id.as_ref() == Some(x)))
    {
        return Ok(stash.remove(i).expect("found"));
    }
    let end = Instant::now() + timeout.min(Duration::from_secs(1 << 30));
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(CmError::Timeout(timeout, "rdma_cm event"));
        }
        let Some(e) = ch.get_cm_event(Some(left)) else {
            continue;
        };
        if id.is_none_or(|x| &e.id == x || e.listen_id.as_ref() == Some(x)) {
            return Ok(e);
        }
        stash.push_back(e);
    }
}

fn param(resources: u8, retry: u8) -> ConnParam<'static> {
    let mut p = ConnParam::new(QpNumber::new(0), Psn::new(0), &[]);
    p.responder_resources = resources;
    p.initiator_depth = resources;
    p.retry_count = retry;
    p.rnr_retry_count = 7;
    p
}

/// Resolve address and route of a new id of port space `ps` towards `dst`, then connect it
/// with `qpn` attached; tries again while the server rejects (it may not listen yet).
/// Returns the id and its ESTABLISHED event.
fn client_connect(
    ch: &EventChannel,
    stash: &mut VecDeque<CmEvent>,
    ps: PortSpace,
    dst: SocketAddr,
    qpn: QpNumber,
    p: &ConnParam<'_>,
    timeout: Duration,
) -> Result<(CmId, CmEvent), CmError> {
    let mut last = String::new();
    for _ in 0..CONNECT_TRIES {
        let id = ch.create_id(ps);
        let step =
            |r: Result<(), crate::runtime::cm::CmApiError>| r.map_err(|e| err(e.to_string()));
        step(id.resolve_addr(None, dst, Duration::from_secs(2)))?;
        let e = next_event(ch, stash, Some(&id), timeout)?;
        if e.event != EventType::AddrResolved {
            let _ = id.destroy();
            return Err(err(format!("{} (status {})", e.event.as_str(), e.status)));
        }
        step(id.resolve_route(Duration::from_secs(2)))?;
        let e = next_event(ch, stash, Some(&id), timeout)?;
        if e.event != EventType::RouteResolved {
            let _ = id.destroy();
            return Err(err(format!("{} (status {})", e.event.as_str(), e.status)));
        }
        step(id.attach_qp(qpn))?;
        step(id.connect(p))?;
        let e = next_event(ch, stash, Some(&id), timeout)?;
        match e.event {
            EventType::Established => return Ok((id, e)),
            EventType::Rejected | EventType::Unreachable => {
                last = format!("{} (status {})", e.event.as_str(), e.status);
                id.detach_qp();
                let _ = id.destroy();
                std::thread::sleep(Duration::from_millis(100));
            }
            k => {
                id.detach_qp();
                let _ = id.destroy();
                return Err(err(format!("{} (status {})", k.as_str(), e.status)));
            }
        }
    }
    Err(err(format!("could not connect: {last}")))
}

impl RdmaLink {
    /// Connect the control QP: as the client to `host:port`, or as the server on `port`
    /// (every address). `mac` is the port's MAC (the CA GUID), `resolver` answers address
    /// and route resolution. With `ud` (`-c UD`) the server also listens in the UDP port
    /// space for the test QP's SIDR_REQ.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        nic: &Arc<Nic>,
        mac: MacAddr,
        resolver: Box<dyn Resolver>,
        host: Option<SocketAddr>,
        port: u16,
        retry_count: u8,
        timeout: Duration,
        ud: bool,
    ) -> Result<RdmaLink, CmError> {
        let svc = CmService::start(
            nic.clone(),
            crate::cm::CmConfig::new(ca_guid_of(mac)),
            resolver,
        )
        .map_err(|e| err(e.to_string()))?;
        let ch = svc.create_event_channel().map_err(|e| err(e.to_string()))?;
        let mut stash = VecDeque::new();
        let v = |e: crate::verbs::VerbsError| err(e.to_string());
        let pd = nic.alloc_pd().map_err(v)?;
        let cq = nic.create_cq(16).map_err(v)?;
        let cap = QpCap {
            max_send_wr: 4,
            max_recv_wr: RECV_SLOTS as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = nic.create_qp(QpInitAttr::new(pd, cq, cq, cap)).map_err(v)?;
        let send_mr = nic.reg_mr(pd, SLOT, AccessFlags::LOCAL_WRITE).map_err(v)?;
        let recv_mr = nic
            .reg_mr(pd, SLOT * RECV_SLOTS, AccessFlags::LOCAL_WRITE)
            .map_err(v)?;
        let p = param(0, retry_count);
        let mut ud_listener = None;
        let (ctrl, listener) = match host {
            Some(dst) => {
                let (id, _) =
                    client_connect(&ch, &mut stash, PortSpace::TCP, dst, qp, &p, timeout)?;
                (id, None)
            }
            None => {
                if ud {
                    // Listening from the start: the client's SIDR_REQ may come as soon as
                    // the zero round before it is over.
                    let u = ch.create_id(PortSpace::UDP);
                    u.bind_addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port))
                        .map_err(|e| err(e.to_string()))?;
                    u.listen(LISTEN_BACKLOG).map_err(|e| err(e.to_string()))?;
                    ud_listener = Some(u);
                }
                let l = ch.create_id(PortSpace::TCP);
                l.bind_addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port))
                    .map_err(|e| err(e.to_string()))?;
                // The control connection, then one per test QP (perftest's client sends the
                // test QPs' REQs together).
                l.listen(LISTEN_BACKLOG).map_err(|e| err(e.to_string()))?;
                let e = next_event(&ch, &mut stash, Some(&l), Duration::MAX)?;
                if e.event != EventType::ConnectRequest {
                    return Err(err(format!("{} while listening", e.event.as_str())));
                }
                let id = e.id.clone();
                id.attach_qp(qp).map_err(|e| err(e.to_string()))?;
                (id, Some(l))
            }
        };
        let link = RdmaLink {
            nic: nic.clone(),
            ch,
            server: host.is_none(),
            dst: host,
            ctrl,
            listener,
            ud_listener,
            data: Vec::new(),
            data_ud: false,
            qp,
            cq,
            send_mr,
            recv_mr,
            pending: VecDeque::new(),
            closed: false,
            stash,
            svc,
        };
        let mut link = link;
        // Receives before the connection can carry anything.
        for i in 0..RECV_SLOTS {
            link.post_recv(i).map_err(v)?;
        }
        if link.server {
            link.ctrl
                .accept(&p)
                .map_err(|e| err(format!("rdma_accept: {e}")))?;
            let ctrl = link.ctrl.clone();
            let e = next_event(&link.ch, &mut link.stash, Some(&ctrl), timeout)?;
            if e.event != EventType::Established {
                return Err(err(format!("{} (status {})", e.event.as_str(), e.status)));
            }
        }
        Ok(link)
    }

    fn post_recv(&self, slot: usize) -> Result<(), crate::verbs::VerbsError> {
        self.nic.post_recv(
            self.qp,
            RecvWr {
                wr_id: slot as u64,
                sg_list: smallvec::smallvec![Sge {
                    addr: self.recv_mr.addr() + (slot * SLOT) as u64,
                    length: SLOT as u32,
                    lkey: self.recv_mr.lkey(),
                }],
            },
        )
    }

    /// Take completions: receives become pending messages; returns whether the send with
    /// `send_id` completed (an error status is an error).
    fn drain(&mut self, wait: Duration) -> Result<bool, CmError> {
        let mut wcs = Vec::new();
        let _ = self.nic.poll_cq(self.cq, &mut wcs, 8);
        if wcs.is_empty() && !wait.is_zero() {
            let _ = self.nic.wait_cq(self.cq, wait);
            let _ = self.nic.poll_cq(self.cq, &mut wcs, 8);
        }
        let mut sent = false;
        for wc in wcs {
            if wc.status != WcStatus::Success {
                return Err(err(format!("control QP completion: {}", wc.status)));
            }
            match wc.opcode {
                WcOpcode::Recv => {
                    let slot = wc.wr_id as usize % RECV_SLOTS;
                    let n = (wc.byte_len as usize).min(SLOT);
                    let mut b = vec![0u8; n];
                    let _ = self.recv_mr.read(slot * SLOT, &mut b);
                    self.pending.push_back(b);
                    self.post_recv(slot).map_err(|e| err(e.to_string()))?;
                }
                _ => sent = true,
            }
        }
        Ok(sent)
    }
}

impl MsgLink for RdmaLink {
    fn send(&mut self, msg: &[u8]) -> Result<(), CmError> {
        if msg.len() > SLOT {
            return Err(err(format!("a {}-byte message", msg.len())));
        }
        let _ = self.send_mr.write(0, msg);
        let wr = SendWr::new(
            1,
            SendOp::Send,
            vec![Sge {
                addr: self.send_mr.addr(),
                length: msg.len() as u32,
                lkey: self.send_mr.lkey(),
            }],
        );
        self.nic
            .post_send(self.qp, wr)
            .map_err(|e| err(e.to_string()))?;
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            if self.drain(Duration::from_millis(5))? {
                return Ok(());
            }
        }
        Err(CmError::Timeout(Duration::from_secs(30), "SEND completion"))
    }

    fn recv(
        &mut self,
        len: usize,
        what: &'static str,
        timeout: Duration,
    ) -> Result<Vec<u8>, CmError> {
        let end = Instant::now() + timeout.min(Duration::from_secs(1 << 30));
        loop {
            if let Some(m) = self.pending.pop_front() {
                if m.len() != len {
                    return Err(CmError::Malformed {
                        what,
                        detail: format!("{} bytes, expected {len}", m.len()),
                    });
                }
                return Ok(m);
            }
            if self.closed {
                return Err(CmError::Closed(what));
            }
            if Instant::now() >= end {
                return Err(CmError::Timeout(timeout, what));
            }
            // A peer that went away: its DISCONNECTED ends the wait, but only after what it
            // sent before disconnecting: its last message (perftest's server sends one and
            // disconnects at once) may still be in the CQ, ahead of the flushes.
            while let Some(e) = self.ch.try_get_cm_event() {
                if e.event == EventType::Disconnected && e.id == self.ctrl {
                    self.closed = true;
                    for _ in 0..=RECV_SLOTS {
                        if self.drain(Duration::ZERO).is_err() {
                            break;
                        }
                    }
                    break;
                }
                self.stash.push_back(e);
            }
            if self.closed {
                continue;
            }
            self.drain(Duration::from_millis(5))?;
        }
    }

    fn connect_qp(
        &mut self,
        qpn: QpNumber,
        resources: u8,
        retry_count: u8,
        timeout: Duration,
    ) -> Result<(), CmError> {
        let p = param(resources, retry_count);
        if let Some(dst) = self.dst {
            let (id, _) = client_connect(
                &self.ch,
                &mut self.stash,
                PortSpace::TCP,
                dst,
                qpn,
                &p,
                timeout,
            )?;
            self.data.push(id);
            return Ok(());
        }
        let l = self.listener.clone().ok_or_else(|| err("no listener"))?;
        let e = next_event(&self.ch, &mut self.stash, Some(&l), timeout)?;
        if e.event != EventType::ConnectRequest {
            return Err(err(format!("{} while listening", e.event.as_str())));
        }
        let id = e.id.clone();
        id.attach_qp(qpn).map_err(|e| err(e.to_string()))?;
        id.accept(&p)
            .map_err(|e| err(format!("rdma_accept: {e}")))?;
        let e = next_event(&self.ch, &mut self.stash, Some(&id), timeout)?;
        if e.event != EventType::Established {
            return Err(err(format!("{} (status {})", e.event.as_str(), e.status)));
        }
        self.data.push(id);
        Ok(())
    }

    fn connect_ud(&mut self, qpn: QpNumber, timeout: Duration) -> Result<Option<UdPeer>, CmError> {
        // perftest's conn_param for UD: retry and RNR retry `--retry_count`, no reads; the
        // private data of a SIDR_REQ is RDMA-CM's header alone.
        let mut p = param(0, 7);
        p.qkey = UDP_QKEY;
        self.data_ud = true;
        if let Some(dst) = self.dst {
            let (id, e) = client_connect(
                &self.ch,
                &mut self.stash,
                PortSpace::UDP,
                dst,
                qpn,
                &p,
                timeout,
            )?;
            self.data.push(id);
            let (Some(qpn), Some(qkey)) = (e.param.qp_num, e.param.qkey) else {
                return Err(err("ESTABLISHED of a UD id without the peer's QP"));
            };
            return Ok(Some(UdPeer {
                qpn,
                qkey,
                ip: dst.ip(),
            }));
        }
        let l = self
            .ud_listener
            .clone()
            .ok_or_else(|| err("no UD listener"))?;
        let e = next_event(&self.ch, &mut self.stash, Some(&l), timeout)?;
        if e.event != EventType::ConnectRequest {
            return Err(err(format!("{} while listening", e.event.as_str())));
        }
        let id = e.id.clone();
        id.attach_qp(qpn).map_err(|e| err(e.to_string()))?;
        id.accept(&p)
            .map_err(|e| err(format!("rdma_accept: {e}")))?;
        self.data.push(id);
        Ok(None)
    }
}

impl Drop for RdmaLink {
    fn drop(&mut self) {
        // The test QP belongs to the test: only the CM's side of it is ended here (UD: no
        // DREQ, as perftest's rdma_cm_disconnect_nodes skips UD).
        for d in std::mem::take(&mut self.data) {
            d.detach_qp();
            if self.data_ud {
                let _ = d.destroy();
            } else {
                let _ = d.disconnect();
            }
        }
        if let Some(u) = self.ud_listener.take() {
            let _ = u.destroy();
        }
        let _ = self.ctrl.disconnect();
        // Let the DREQs leave and their DREPs come.
        std::thread::sleep(Duration::from_millis(100));
        let _ = &self.svc;
    }
}
