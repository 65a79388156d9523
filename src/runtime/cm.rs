//! RDMA-CM over a running [`Nic`]: the driver of the sans-IO connection manager
//! ([`crate::cm::rdma::RdmaCm`]) and a public API in librdmacm's shape.
//!
//! # What the driver does
//!
//! [`CmService::start`] creates QP1 (the GSI: a UD QP with Q_Key 0x80010000) on the NIC with
//! 64 receive buffers (a 40-byte GRH slot and a 256-byte MAD each) and starts a thread that
//! waits on QP1's completion queue: every MAD received goes to the CM
//! (`RdmaCm::handle_mad`, with the sender's GID from the GRH slot and QPN from the
//! completion), every MAD the CM emits goes out on QP1 to the destination's QP1 (an address
//! handle per destination GID), and the CM's timers run at `poll_timeout` (the thread wakes at
//! least every 10 ms). Calls on a [`CmId`] run in the caller's thread under the service's
//! lock and send what they produce before returning. Address and route resolution are asked
//! of a [`Resolver`]: the kernel's routes and neighbours through rtnetlink
//! ([`KernelResolver`], `io::route`), or a fixed table ([`StaticResolver`], for the loopback
//! backend and tests).
//!
//! # The API (librdmacm's, call for call)
//!
//! | librdmacm | here |
//! |---|---|
//! | `rdma_create_event_channel`, `channel->fd` | [`CmService::create_event_channel`], [`EventChannel::fd`] |
//! | `rdma_create_id(channel, ctx, RDMA_PS_TCP/UDP)` | [`EventChannel::create_id`] |
//! | `rdma_bind_addr`, `rdma_resolve_addr`, `rdma_resolve_route` | [`CmId::bind_addr`], [`CmId::resolve_addr`], [`CmId::resolve_route`] |
//! | `rdma_create_qp`, `rdma_destroy_qp` | [`CmId::create_qp`], [`CmId::destroy_qp`] |
//! | `rdma_connect`, `rdma_listen`, `rdma_accept`, `rdma_reject` | [`CmId::connect`], [`CmId::listen`], [`CmId::accept`], [`CmId::reject`] |
//! | `rdma_establish` (ids without a QP) | [`CmId::establish`] |
//! | `rdma_disconnect`, `rdma_destroy_id` | [`CmId::disconnect`], [`CmId::destroy`] |
//! | `rdma_get_cm_event`, `rdma_ack_cm_event` | [`EventChannel::get_cm_event`], [`EventChannel::ack_cm_event`] |
//! | `struct rdma_conn_param` | [`ConnParam`] (`qp_num` and `starting_psn` are filled in for ids with a QP) |
//! | `struct rdma_cm_event` | [`CmEvent`]: `id`, `listen_id`, `event`, `status`, `param` (private data, the conn_param fields, UD's QPN and Q_Key) |
//!
//! As in librdmacm, an id with a QP ([`CmId::create_qp`]) has its QP moved through the states
//! by the CM: INIT when created (port 1, P_Key index 0, remote READ/WRITE/ATOMIC allowed; a UD
//! QP straight to RTS with Q_Key [`UDP_QKEY`]), RTR and RTS from the REP before the RTU
//! leaves (active side: CONNECT_RESPONSE is consumed, the application sees ESTABLISHED),
//! RTR and RTS from the REQ before the REP leaves (passive, in [`CmId::accept`]), ERROR in
//! [`CmId::disconnect`]. The starting PSN is random. Events of a connection request's new id
//! go to the listener's channel.

use super::Nic;
use crate::cm::rdma::{self as rdma, RdmaCm, RdmaCmError, Request};
use crate::cm::{CmConfig, MadAddr, QpParams, Transmit};
use crate::io::event::EventFd;
use crate::io::share::ServiceClaim;
use crate::keys::KeyGen;
use crate::time::Instant;
use crate::verbs::{
    AccessFlags, AddressVector, Ah, Cq, MemoryRegion, Mtu, Pd, QpAttr, QpAttrMask, QpCap,
    QpInitAttr, QpState, QpType, RcParams, RecvWr, RemoteQp, SendOp, SendWr, Sge, UdDest, UdParams,
    VerbsError, WcStatus, WorkCompletion,
};
use crate::wire::grh::{GrhSlot, GRH_LEN};
use crate::wire::mad::cm::PathMtu;
use crate::wire::mad::{Gid, MAD_LEN};
use crate::wire::{MacAddr, PKey, QpNumber};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

pub use crate::cm::rdma::{errno, ConnParam, EventType, IdState, QpKind, RdmaId, UDP_QKEY};
pub use crate::wire::mad::rdma_cm::PortSpace;

/// The Q_Key of QP1 (IBTA Vol. 1 §13.5.1).
pub const GSI_QKEY: u32 = 0x8001_0000;

/// QP1's receive buffers: Linux's MAD layer posts 512 (`ib_mad`'s `recv_queue_size`). A UD
/// packet that finds no receive buffer is dropped, and a connection whose REQ is dropped waits
/// for the CM's response timeout (~4 s) to send it again: with 64, Debian's `cmtime -c 200`
/// (200 REQs at once) took 9.7 s to connect its slowest connection.
const RECV_SLOTS: usize = 512;
/// QP1's send buffers (Linux's `send_queue_size`: 128); what does not fit waits in the
/// backlog.
const SEND_SLOTS: usize = 128;
/// Most address handles QP1 keeps (one per peer and traffic class). MADs come from any
/// address on the segment (a REJ answers each REQ): without a bound, a flood from forged
/// sources would fill the device's AH table, which the application's AHs share.
const QP1_AH_MAX: usize = 256;
/// One receive buffer: the GRH slot and a MAD.
const RECV_LEN: usize = GRH_LEN + MAD_LEN;
/// The longest the driver thread sleeps between looks at the CM's timers.
const MAX_SLEEP: Duration = Duration::from_millis(10);

/// Answers the questions of address and route resolution (what the kernel's `rdma_cm`
/// asks of its routing tables and neighbours). Errors are Linux errno values.
pub trait Resolver: Send + Sync {
    /// The local address (one of the device's GIDs) that reaches `dst`; `src` when the
    /// application gave one.
    fn local_addr(&self, src: Option<IpAddr>, dst: IpAddr) -> Result<IpAddr, i32>;
    /// The MAC address frames from `local` to `dst` go to (the next hop's).
    fn neighbour(&self, local: IpAddr, dst: IpAddr) -> Result<MacAddr, i32>;
}

/// Resolution through the kernel: `ip route get` (rtnetlink, `io::route`) for the source
/// address, the neighbour table (primed by a datagram when empty) for the MAC.
pub struct KernelResolver {
    /// The interface the device runs on.
    pub ifname: String,
    /// The device's GID table (its addresses).
    pub gids: Vec<IpAddr>,
    /// The UDP backend: the kernel builds the Ethernet header, no MAC is needed.
    pub udp: bool,
    /// The address the device runs with (the GID in use): the source for destinations of
    /// its family, before the kernel's route is asked.
    pub local: Option<IpAddr>,
}

impl Resolver for KernelResolver {
    fn local_addr(&self, src: Option<IpAddr>, dst: IpAddr) -> Result<IpAddr, i32> {
        if let Some(s) = src {
            return if self.gids.contains(&s) {
                Ok(s)
            } else {
                Err(errno::EADDRNOTAVAIL)
            };
        }
        if let Some(l) = self.local.filter(|l| l.is_ipv4() == dst.is_ipv4()) {
            return Ok(l);
        }
        if self.gids.contains(&dst) {
            return Ok(dst);
        }
        let r = crate::io::route::route_get(dst).map_err(|e| match e {
            crate::io::route::RouteError::NoRoute { .. } => errno::ENETUNREACH,
            _ => errno::EHOSTUNREACH,
        })?;
        match r.prefsrc {
            Some(p) if self.gids.contains(&p) => Ok(p),
            _ => self
                .gids
                .iter()
                .find(|g| g.is_ipv4() == dst.is_ipv4() && !crate::io::netdev::is_link_local(**g))
                .copied()
                .ok_or(errno::EADDRNOTAVAIL),
        }
    }
    fn neighbour(&self, _local: IpAddr, dst: IpAddr) -> Result<MacAddr, i32> {
        if self.udp {
            return Ok(MacAddr::ZERO);
        }
        crate::io::netdev::resolve(dst, Some(&self.ifname), Duration::from_secs(2))
            .ok_or(errno::EHOSTUNREACH)
    }
}

/// A fixed table: each entry a local address, a peer address and the peer's MAC (the
/// loopback backend and tests, where no kernel routes exist).
#[derive(Clone, Debug, Default)]
pub struct StaticResolver {
    /// (local, peer, peer's MAC).
    pub entries: Vec<(IpAddr, IpAddr, MacAddr)>,
}

impl Resolver for StaticResolver {
    fn local_addr(&self, src: Option<IpAddr>, dst: IpAddr) -> Result<IpAddr, i32> {
        self.entries
            .iter()
            .find(|(l, p, _)| *p == dst && src.is_none_or(|s| s == *l))
            .map(|e| e.0)
            .ok_or(errno::EHOSTUNREACH)
    }
    fn neighbour(&self, local: IpAddr, dst: IpAddr) -> Result<MacAddr, i32> {
        self.entries
            .iter()
            .find(|(l, p, _)| *p == dst && *l == local)
            .map(|e| e.2)
            .ok_or(errno::EHOSTUNREACH)
    }
}

/// Why an RDMA-CM call failed (librdmacm: -1 and errno).
#[derive(Debug, thiserror::Error)]
pub enum CmApiError {
    /// The connection manager refused the call.
    #[error(transparent)]
    Cm(#[from] RdmaCmError),
    /// A verb on the id's QP or on QP1 failed.
    #[error("verbs: {0}")]
    Verbs(#[from] VerbsError),
    /// The id has no QP, or already has one.
    #[error("{0}")]
    Qp(&'static str),
    /// The service has stopped.
    #[error("the CM service has stopped")]
    Stopped,
    /// Starting the service failed.
    #[error("starting the CM service: {0}")]
    Io(#[from] std::io::Error),
}

/// An event (`struct rdma_cm_event`).
#[derive(Clone)]
pub struct CmEvent {
    /// The id the event is about (CONNECT_REQUEST: the new id).
    pub id: CmId,
    /// CONNECT_REQUEST: the listening id.
    pub listen_id: Option<CmId>,
    /// The event type.
    pub event: EventType,
    /// 0, a negative errno, or for REJECTED the REJ reason (8: nothing listens; 28: the
    /// consumer rejected).
    pub status: i32,
    /// The rest (`param.conn` / `param.ud`): private data, responder resources, initiator
    /// depth, retry counts, the peer's QPN, UD's Q_Key, the QP attributes.
    pub param: rdma::Event,
}

impl CmEvent {
    /// The peer's private data (`param.conn.private_data`, `private_data_len`).
    pub fn private_data(&self) -> &[u8] {
        self.param.private_data()
    }
}

impl std::fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CmEvent({} id={} status={} private={})",
            self.event.as_str(),
            self.id.id.0,
            self.status,
            self.private_data().len()
        )
    }
}

struct ChannelShared {
    q: Mutex<VecDeque<CmEvent>>,
    cv: Condvar,
    fd: EventFd,
}

impl ChannelShared {
    fn push(&self, e: CmEvent) {
        // Signalled under the queue's lock: the counter is not zero exactly while events
        // wait, so the reader's drain (under the same lock, when the queue runs empty) never
        // finds it zero, and the descriptor may be made blocking (librdmacm's C channel).
        let mut q = lock(&self.q);
        q.push_back(e);
        self.fd.signal();
        drop(q);
        self.cv.notify_all();
    }
}

struct IdInfo {
    channel: Arc<ChannelShared>,
    qp: Option<QpNumber>,
    /// The next hop's MAC (active side: from route resolution; passive: from the device's
    /// neighbours or the resolver).
    mac: Option<MacAddr>,
}

struct Qp1 {
    qpn: QpNumber,
    cq: Cq,
    pd: Pd,
    recv: MemoryRegion,
    send: MemoryRegion,
    free_send: Vec<usize>,
    /// QP1's address handles, by destination and traffic class.
    ahs: HashMap<(Gid, u8), Ah>,
    /// MADs waiting for a free send buffer.
    backlog: VecDeque<Transmit>,
}

struct State {
    cm: RdmaCm,
    qp1: Qp1,
    ids: HashMap<RdmaId, IdInfo>,
    /// The local address MADs to a GID leave from (the address its connections use).
    local_for: HashMap<Gid, IpAddr>,
    keys: KeyGen,
    /// MADs received, MADs sent, MADs not sent (no address handle), receive errors.
    mads_in: u64,
    mads_out: u64,
    mads_unsent: u64,
    /// Times QP1's address handles were all destroyed at [`QP1_AH_MAX`], and MADs held back
    /// because the table was full while sends were on their way.
    ah_evictions: u64,
    ah_evictions_deferred: u64,
    /// The device's slot when it shares its address and port with other programs' devices
    /// (its block of QPNs, [`crate::verbs::DeviceConfig::qpn_block`]): each listening id
    /// then claims its service among them ([`ServiceClaim`]), held here until it is destroyed.
    share_slot: Option<u8>,
    claims: HashMap<RdmaId, ServiceClaim>,
}

struct Shared {
    nic: Arc<Nic>,
    st: Mutex<State>,
    stop: AtomicBool,
    epoch: std::time::Instant,
    resolver: Box<dyn Resolver>,
    port_mtu: Mtu,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long `rdma_listen` on a device that shares its port waits for a service another
/// program claims to come free ([`CmId::listen`]).
pub const CLAIM_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The connection manager of one [`Nic`]: QP1 and its driver thread.
pub struct CmService {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Counters of the service's QP1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Qp1Counters {
    /// MADs received on QP1.
    pub mads_in: u64,
    /// MADs sent on QP1.
    pub mads_out: u64,
    /// MADs the CM emitted that could not be sent (no address handle for the destination,
    /// or QP1's address handles full while other MADs were on their way).
    pub mads_unsent: u64,
    /// Times QP1's address handles reached their bound and were all destroyed.
    pub ah_evictions: u64,
    /// MADs held back because the bound was reached while other MADs were on their way.
    pub ah_evictions_deferred: u64,
    /// QP1's address handles now.
    pub ahs: usize,
}

impl CmService {
    /// Create QP1 on `nic` and start the driver thread. `cfg` is the IB CM's configuration
    /// (its CA GUID: [`ca_guid_of`] the port's MAC); `resolver` answers address and route
    /// resolution.
    pub fn start(
        nic: Arc<Nic>,
        cfg: CmConfig,
        resolver: Box<dyn Resolver>,
    ) -> Result<CmService, CmApiError> {
        let pd = nic.alloc_pd()?;
        let cq = nic.create_cq(RECV_SLOTS + SEND_SLOTS + 16)?;
        let cap = QpCap {
            max_send_wr: SEND_SLOTS as u32,
            max_recv_wr: RECV_SLOTS as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let mut init = QpInitAttr::new(pd, cq, cq, cap);
        init.qp_type = QpType::Ud;
        init.sq_sig_all = true;
        let qpn = nic.create_gsi_qp(init)?;
        nic.bring_up_ud(
            qpn,
            &UdParams {
                qkey: GSI_QKEY,
                local_psn: 0,
            },
        )?;
        let recv = nic.reg_mr(pd, RECV_SLOTS * RECV_LEN, AccessFlags::LOCAL_WRITE)?;
        let send = nic.reg_mr(pd, SEND_SLOTS * MAD_LEN, AccessFlags::LOCAL_WRITE)?;
        for i in 0..RECV_SLOTS {
            post_recv_slot(&nic, qpn, &recv, i)?;
        }
        let port_mtu = nic.with_device(|d| d.config().port_mtu);
        // A device numbering its QPs in a block shares its port (`crate::io::share`): its
        // communication IDs carry the same block, so that replies find it.
        let share_slot = nic.with_device(|d| d.config().qpn_block);
        let mut cfg = cfg;
        cfg.id_block = cfg.id_block.or(share_slot);
        let seed = cfg.seed;
        let shared = Arc::new(Shared {
            st: Mutex::new(State {
                cm: RdmaCm::new(cfg),
                qp1: Qp1 {
                    qpn,
                    cq,
                    pd,
                    recv,
                    send,
                    free_send: (0..SEND_SLOTS).rev().collect(),
                    ahs: HashMap::new(),
                    backlog: VecDeque::new(),
                },
                ids: HashMap::new(),
                local_for: HashMap::new(),
                keys: KeyGen::new(seed.map(|s| s ^ 0x7073_6e00)),
                mads_in: 0,
                mads_out: 0,
                mads_unsent: 0,
                ah_evictions: 0,
                share_slot,
                claims: HashMap::new(),
                ah_evictions_deferred: 0,
            }),
            nic,
            stop: AtomicBool::new(false),
            epoch: std::time::Instant::now(),
            resolver,
            port_mtu,
        });
        let th = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ferroce-cm".into())
            .spawn(move || driver(&th))?;
        Ok(CmService {
            shared,
            thread: Some(thread),
        })
    }

    /// `rdma_create_event_channel`.
    pub fn create_event_channel(&self) -> Result<EventChannel, CmApiError> {
        Ok(EventChannel {
            shared: self.shared.clone(),
            ch: Arc::new(ChannelShared {
                q: Mutex::new(VecDeque::new()),
                cv: Condvar::new(),
                fd: EventFd::new()?,
            }),
        })
    }

    /// The NIC.
    pub fn nic(&self) -> &Arc<Nic> {
        &self.shared.nic
    }

    /// The IB CM's counters (MADs dropped, duplicates, retries, ...).
    pub fn cm_counters(&self) -> crate::cm::CmCounters {
        *lock(&self.shared.st).cm.ib().counters()
    }

    /// QP1's counters.
    pub fn qp1_counters(&self) -> Qp1Counters {
        let st = lock(&self.shared.st);
        Qp1Counters {
            mads_in: st.mads_in,
            mads_out: st.mads_out,
            mads_unsent: st.mads_unsent,
            ah_evictions: st.ah_evictions,
            ah_evictions_deferred: st.ah_evictions_deferred,
            ahs: st.qp1.ahs.len(),
        }
    }

    /// What the kernel's RDMA-CM does when a process closes its descriptor (ucma's close; the
    /// kernel's CM outlives the process, this one does not): the MADs QP1 has received are
    /// handled first (a DREQ that came is answered, not crossed by one of ours), then every id
    /// is destroyed as [`CmId::destroy`] would, without touching its QP: an established
    /// connection sends DREQ, a connection whose DREQ came answers it with DREP, a request
    /// not accepted is rejected. Returns once QP1 has sent everything (its sends completed:
    /// the MADs are on the wire), true, or after `timeout`, false. The ids stop working
    /// (`NoSuchId`); QP1 keeps answering (a late DREQ gets its DREP) until the service stops.
    pub fn close_all(&self, timeout: Duration) -> bool {
        let sh = &self.shared;
        let deadline = std::time::Instant::now() + timeout;
        let cq = lock(&sh.st).qp1.cq;
        let mut wcs = Vec::with_capacity(64);
        sh.drain_qp1(cq, &mut wcs);
        {
            let mut st = lock(&sh.st);
            let now = sh.now();
            for id in st.cm.ids() {
                let _ = st.cm.destroy_id(now, id);
            }
            st.pump(sh, now);
        }
        loop {
            sh.drain_qp1(cq, &mut wcs);
            {
                let st = lock(&sh.st);
                if st.qp1.backlog.is_empty() && st.qp1.free_send.len() == SEND_SLOTS {
                    return true;
                }
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            let _ = sh
                .nic
                .wait_cq(cq, (deadline - now).min(Duration::from_millis(1)));
        }
    }

    /// Stop the driver thread (also on drop). Ids stop working; their QPs stay.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for CmService {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The CA GUID of a RoCE port: the EUI-64 of its MAC (as Linux derives a node GUID).
pub fn ca_guid_of(mac: MacAddr) -> u64 {
    u64::from_be_bytes(mac.eui64())
}

fn post_recv_slot(nic: &Nic, qpn: QpNumber, mr: &MemoryRegion, i: usize) -> Result<(), VerbsError> {
    nic.post_recv(
        qpn,
        RecvWr {
            wr_id: i as u64,
            sg_list: smallvec::smallvec![Sge {
                addr: mr.addr() + (i * RECV_LEN) as u64,
                length: RECV_LEN as u32,
                lkey: mr.lkey(),
            }],
        },
    )
}

/// Bit 63 of a QP1 work request ID: a send.
const SEND_BIT: u64 = 1 << 63;

fn driver(sh: &Arc<Shared>) {
    let cq = lock(&sh.st).qp1.cq;
    let mut wcs = Vec::with_capacity(64);
    while !sh.stop.load(Ordering::Acquire) {
        let wait = {
            let st = lock(&sh.st);
            match st.cm.poll_timeout() {
                Some(t) => {
                    let now = sh.now();
                    Duration::from_nanos(t.as_nanos().saturating_sub(now.as_nanos())).min(MAX_SLEEP)
                }
                None => MAX_SLEEP,
            }
        };
        if !wait.is_zero() {
            let _ = sh.nic.wait_cq_passive(cq, wait);
        }
        wcs.clear();
        let _ = sh.nic.poll_cq(cq, &mut wcs, 64);
        let mut st = lock(&sh.st);
        let now = sh.now();
        for wc in &wcs {
            st.on_completion(sh, now, wc);
        }
        if st.cm.poll_timeout().is_some_and(|t| t <= now) {
            st.cm.handle_timeout(now);
        }
        st.pump(sh, now);
    }
}

impl Shared {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Handle what QP1's completion queue holds now (as the driver thread does) and send
    /// what that produced.
    fn drain_qp1(self: &Arc<Self>, cq: Cq, wcs: &mut Vec<WorkCompletion>) {
        loop {
            wcs.clear();
            let _ = self.nic.poll_cq(cq, wcs, 64);
            let mut st = lock(&self.st);
            let now = self.now();
            for wc in wcs.iter() {
                st.on_completion(self, now, wc);
            }
            st.pump(self, now);
            if wcs.is_empty() {
                return;
            }
        }
    }

    fn path_mtu(&self) -> PathMtu {
        match self.port_mtu {
            Mtu::M256 => PathMtu::M256,
            Mtu::M512 => PathMtu::M512,
            Mtu::M1024 => PathMtu::M1024,
            Mtu::M2048 => PathMtu::M2048,
            Mtu::M4096 => PathMtu::M4096,
        }
    }
}

fn mtu_of(p: PathMtu) -> Mtu {
    p.bytes().and_then(Mtu::from_bytes).unwrap_or(Mtu::M1024)
}

impl State {
    fn on_completion(&mut self, sh: &Arc<Shared>, now: Instant, wc: &WorkCompletion) {
        if wc.wr_id & SEND_BIT != 0 {
            let slot = (wc.wr_id & !SEND_BIT) as usize;
            if slot < SEND_SLOTS && !self.qp1.free_send.contains(&slot) {
                self.qp1.free_send.push(slot);
            }
            if wc.status != WcStatus::Success {
                tracing::debug!(status = ?wc.status, "QP1 send failed");
            }
            return;
        }
        let slot = wc.wr_id as usize;
        if slot >= RECV_SLOTS {
            return;
        }
        if wc.status == WcStatus::Success {
            let mut buf = [0u8; RECV_LEN];
            let n = (wc.byte_len as usize).min(RECV_LEN);
            if self.qp1.recv.read(slot * RECV_LEN, &mut buf[..n]).is_ok() && n > GRH_LEN {
                let addrs = match GrhSlot::parse(&buf[..GRH_LEN]) {
                    Ok(GrhSlot::V4 { src, dst, .. }) => Some((IpAddr::V4(src), IpAddr::V4(dst))),
                    Ok(GrhSlot::V6 { src, dst, .. }) => Some((IpAddr::V6(src), IpAddr::V6(dst))),
                    Err(_) => None,
                };
                if let Some((ip, to)) = addrs {
                    // Answers to this peer leave from the address it sent to.
                    self.local_for.entry(Gid::from_ip(ip)).or_insert(to);
                    self.mads_in += 1;
                    let from = MadAddr {
                        gid: Gid::from_ip(ip),
                        qpn: wc.src_qp,
                        pkey: PKey::DEFAULT,
                    };
                    self.cm.handle_mad(now, from, &buf[GRH_LEN..n]);
                }
            }
        }
        if wc.status != WcStatus::WrFlushErr {
            let _ = post_recv_slot(&sh.nic, self.qp1.qpn, &self.qp1.recv, slot);
        }
    }

    /// Send what the CM emitted, answer its questions, apply the QP transitions its events
    /// call for and hand the events to their channels.
    fn pump(&mut self, sh: &Arc<Shared>, now: Instant) {
        for _ in 0..64 {
            let mut busy = false;
            while let Some(r) = self.cm.poll_request() {
                busy = true;
                self.answer(sh, now, r);
            }
            while let Some(e) = self.cm.poll_event() {
                busy = true;
                self.on_event(sh, now, e);
            }
            while let Some(t) = self.cm.poll_transmit(now) {
                busy = true;
                self.qp1.backlog.push_back(t);
            }
            self.flush(sh);
            if !busy {
                break;
            }
        }
    }

    fn flush(&mut self, sh: &Arc<Shared>) {
        while !self.qp1.backlog.is_empty() {
            let Some(slot) = self.qp1.free_send.pop() else {
                return;
            };
            let t = self.qp1.backlog.pop_front().expect("not empty");
            let Some(ah) = self.ah_for(sh, t.dest.gid, t.traffic_class) else {
                self.qp1.free_send.push(slot);
                self.mads_unsent += 1;
                tracing::debug!(dest = %t.dest, "no address handle for a MAD's destination");
                continue;
            };
            let _ = self.qp1.send.write(slot * MAD_LEN, &t.mad);
            let wr = SendWr {
                ud: Some(UdDest {
                    ah,
                    remote_qpn: t.dest.qpn,
                    remote_qkey: GSI_QKEY,
                }),
                ..SendWr::new(
                    SEND_BIT | slot as u64,
                    SendOp::Send,
                    vec![Sge {
                        addr: self.qp1.send.addr() + (slot * MAD_LEN) as u64,
                        length: MAD_LEN as u32,
                        lkey: self.qp1.send.lkey(),
                    }],
                )
            };
            match sh.nic.post_send(self.qp1.qpn, wr) {
                Ok(()) => self.mads_out += 1,
                Err(e) => {
                    self.qp1.free_send.push(slot);
                    self.mads_unsent += 1;
                    tracing::debug!(error = %e, "QP1 post_send");
                }
            }
        }
    }

    /// The address handle to `gid`'s QP1: made with the MAC an id learned for that peer, the
    /// device's neighbour entry, or the resolver's answer.
    fn ah_for(&mut self, sh: &Arc<Shared>, gid: Gid, traffic_class: u8) -> Option<Ah> {
        if let Some(ah) = self.qp1.ahs.get(&(gid, traffic_class)) {
            return Some(*ah);
        }
        if self.qp1.ahs.len() >= QP1_AH_MAX {
            // Full: start over once no other MAD is on its way (a posted send may still need
            // its AH), else this MAD is not sent now (the CM's retries send it again).
            if self.qp1.free_send.len() + 1 < SEND_SLOTS {
                self.ah_evictions_deferred += 1;
                return None;
            }
            for (_, ah) in self.qp1.ahs.drain() {
                let _ = sh.nic.destroy_ah(ah);
            }
            self.ah_evictions += 1;
        }
        let dst = gid.to_ip();
        let gids = sh.nic.with_device(|d| d.config().gids.clone());
        let local = self
            .local_for
            .get(&gid)
            .copied()
            .or_else(|| sh.resolver.local_addr(None, dst).ok())
            .filter(|l| gids.contains(l));
        let sgid_index = match local {
            Some(l) => gids.iter().position(|g| *g == l)?,
            None => gids.iter().position(|g| g.is_ipv4() == dst.is_ipv4())?,
        };
        let local = gids[sgid_index];
        let mut av = AddressVector {
            dgid: gid.0,
            sgid_index: sgid_index as u8,
            hop_limit: 64,
            traffic_class,
            flow_label: 0,
            dmac: None,
        };
        let ah = match sh.nic.create_ah(self.qp1.pd, &av) {
            Ok(ah) => ah,
            Err(_) => {
                av.dmac = Some(sh.resolver.neighbour(local, dst).ok()?.0);
                sh.nic.create_ah(self.qp1.pd, &av).ok()?
            }
        };
        self.qp1.ahs.insert((gid, traffic_class), ah);
        Some(ah)
    }

    fn answer(&mut self, sh: &Arc<Shared>, now: Instant, r: Request) {
        match r {
            Request::ResolveAddr { id, src, dst } => {
                let res = sh.resolver.local_addr(src, dst);
                let _ = self.cm.complete_addr(now, id, res);
            }
            Request::ResolveRoute { id, src, dst } => {
                self.local_for.insert(Gid::from_ip(dst), src);
                let res = sh.resolver.neighbour(src, dst).map(|mac| {
                    if let Some(i) = self.ids.get_mut(&id) {
                        i.mac = Some(mac);
                    }
                    rdma::Route::roce(src, dst, sh.path_mtu())
                });
                let _ = self.cm.complete_route(now, id, res);
            }
        }
    }

    fn on_event(&mut self, sh: &Arc<Shared>, now: Instant, e: rdma::Event) {
        if e.kind == EventType::ConnectRequest {
            let parent = e.listen_id.and_then(|l| self.ids.get(&l));
            let Some(ch) = parent.map(|p| p.channel.clone()) else {
                let _ = self.cm.reject(now, e.id, &[]);
                return;
            };
            self.ids.insert(
                e.id,
                IdInfo {
                    channel: ch,
                    qp: None,
                    mac: None,
                },
            );
            if let (Some(l), Some(p)) = (self.cm.local_addr(e.id), self.cm.peer_addr(e.id)) {
                self.local_for.insert(Gid::from_ip(p.ip()), l.ip());
            }
        }
        let Some(info) = self.ids.get(&e.id) else {
            return;
        };
        if e.kind == EventType::ConnectResponse {
            if let (Some(qpn), Some(p)) = (info.qp, e.qp) {
                // librdmacm's ucma_process_conn_resp: RTR, RTS, then RTU; the application
                // sees ESTABLISHED.
                let mac = info.mac;
                match self.apply_rtr_rts(sh, qpn, &p, mac) {
                    Ok(()) => {
                        let _ = self.cm.establish(now, e.id);
                    }
                    Err(err) => {
                        tracing::debug!(error = %err, "modify_qp from the REP failed");
                        let _ = self.cm.reject(now, e.id, &[]);
                        let mut ev = e;
                        ev.kind = EventType::ConnectError;
                        ev.status = -22;
                        self.deliver(sh, ev);
                    }
                }
                return;
            }
        }
        self.deliver(sh, e);
    }

    fn deliver(&self, sh: &Arc<Shared>, e: rdma::Event) {
        let Some(info) = self.ids.get(&e.id) else {
            return;
        };
        let ev = CmEvent {
            id: CmId::new(sh, e.id),
            listen_id: e.listen_id.map(|l| CmId::new(sh, l)),
            event: e.kind,
            status: e.status,
            param: e,
        };
        info.channel.push(ev);
    }

    /// RTR and RTS from what the REQ and REP say (`rdma_init_qp_attr` for RTR and RTS), with
    /// Linux's reading of the starting PSNs (see `rq_psn` below).
    fn apply_rtr_rts(
        &mut self,
        sh: &Arc<Shared>,
        qpn: QpNumber,
        p: &QpParams,
        mac: Option<MacAddr>,
    ) -> Result<(), CmApiError> {
        let local = p.local_gid.to_ip();
        let remote = p.remote_gid.to_ip();
        let gids = sh.nic.with_device(|d| d.config().gids.clone());
        let sgid_index = gids.iter().position(|g| *g == local).unwrap_or(0) as u8;
        let mac = match mac {
            Some(m) => Some(m),
            None => sh
                .nic
                .with_device(|d| d.neighbour(remote))
                .or_else(|| sh.resolver.neighbour(local, remote).ok()),
        };
        let params = RcParams {
            mtu: mtu_of(p.path_mtu).min(sh.port_mtu),
            sgid_index,
            // Linux's rdma_cm sets rq_psn to the starting PSN its own REQ/REP carried
            // (rdma_init_qp_attr: `rq_psn = id_priv->seq_num`) and sends from the peer's: the
            // starting PSN in a message is what its sender expects to receive. rxe↔rxe
            // captures show it (the active side's first SEND carries the REP's PSN).
            local_psn: p.rq_psn.get(),
            timeout: p.local_ack_timeout,
            retry_cnt: p.retry_count,
            rnr_retry: p.rnr_retry_count,
            min_rnr_timer: 12,
            max_rd_atomic: p.max_rd_atomic,
            max_dest_rd_atomic: p.max_dest_rd_atomic,
            traffic_class: p.traffic_class,
            ..RcParams::default()
        };
        let remote_end = RemoteQp {
            qpn: p.remote_qpn,
            gid: p.remote_gid.0,
            mac: mac.unwrap_or_default(),
            psn: p.sq_psn.get(),
        };
        let (mut rtr, mut rtr_mask) = params.rtr_attr(&remote_end);
        let (rts, mut rts_mask) = params.rts_attr();
        // An XRC half takes its own attributes (`ferroce::ib::attr`'s table): the initiator
        // none of the responder's, the target only the timeout and a send PSN at RTS.
        match sh.nic.with_device(|d| d.qp_type(qpn)) {
            Ok(QpType::XrcSend) => {
                rtr_mask.remove(QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER)
            }
            Ok(QpType::XrcRecv) => {
                rts_mask = QpAttrMask::STATE | QpAttrMask::TIMEOUT | QpAttrMask::SQ_PSN
            }
            _ => {}
        }
        // The rest of the path as the REQ carried it; without a neighbour entry the device
        // resolves the next hop itself.
        rtr.ah_attr.hop_limit = p.hop_limit;
        rtr.ah_attr.flow_label = p.flow_label;
        rtr.ah_attr.dmac = mac.map(|m| m.0);
        sh.nic.modify_qp(qpn, &rtr, rtr_mask)?;
        sh.nic.modify_qp(qpn, &rts, rts_mask)?;
        Ok(())
    }
}

/// An event channel (`struct rdma_event_channel`): the events of the ids created on it, and
/// a descriptor that is readable while events wait.
pub struct EventChannel {
    shared: Arc<Shared>,
    ch: Arc<ChannelShared>,
}

impl EventChannel {
    /// `channel->fd`: readable (poll/epoll) while events wait to be read.
    pub fn fd(&self) -> RawFd {
        self.ch.fd.fd()
    }

    /// `rdma_create_id`: a new id in port space `ps` (`PortSpace::TCP`: RC;
    /// `PortSpace::UDP`: UD over SIDR) whose events come to this channel.
    pub fn create_id(&self, ps: PortSpace) -> CmId {
        let mut st = lock(&self.shared.st);
        let id = st.cm.create_id(ps);
        st.ids.insert(
            id,
            IdInfo {
                channel: self.ch.clone(),
                qp: None,
                mac: None,
            },
        );
        CmId::new(&self.shared, id)
    }

    /// `rdma_get_cm_event`: the next event, waiting at most `timeout` (`None`: forever, as
    /// librdmacm's blocking channel). `None` when the time passed or the service stopped.
    pub fn get_cm_event(&self, timeout: Option<Duration>) -> Option<CmEvent> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        let mut q = lock(&self.ch.q);
        loop {
            if let Some(e) = q.pop_front() {
                if q.is_empty() {
                    self.ch.fd.drain();
                }
                return Some(e);
            }
            if self.shared.stop.load(Ordering::Acquire) {
                return None;
            }
            // Wake now and then to notice a stopped service.
            let step = match deadline {
                Some(d) => {
                    let now = std::time::Instant::now();
                    if now >= d {
                        return None;
                    }
                    (d - now).min(Duration::from_millis(100))
                }
                None => Duration::from_millis(100),
            };
            q = self
                .ch
                .cv
                .wait_timeout(q, step)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The next event if one waits (a non-blocking channel's `rdma_get_cm_event`).
    pub fn try_get_cm_event(&self) -> Option<CmEvent> {
        self.get_cm_event(Some(Duration::ZERO))
    }

    /// `rdma_ack_cm_event`: events are owned values, so acknowledging only drops it.
    pub fn ack_cm_event(&self, ev: CmEvent) {
        drop(ev);
    }
}

/// A CM id (`struct rdma_cm_id`): a handle, cheap to clone; [`CmId::destroy`] ends it.
#[derive(Clone)]
pub struct CmId {
    sh: Arc<Shared>,
    id: RdmaId,
}

impl PartialEq for CmId {
    fn eq(&self, o: &CmId) -> bool {
        self.id == o.id && Arc::ptr_eq(&self.sh, &o.sh)
    }
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CmId({})", self.id.0)
    }
}

impl CmId {
    fn new(sh: &Arc<Shared>, id: RdmaId) -> CmId {
        CmId { sh: sh.clone(), id }
    }

    /// Run `f` on the state, then send and deliver what it caused.
    fn call<R>(
        &self,
        f: impl FnOnce(&mut State, &Arc<Shared>, Instant) -> Result<R, CmApiError>,
    ) -> Result<R, CmApiError> {
        if self.sh.stop.load(Ordering::Acquire) {
            return Err(CmApiError::Stopped);
        }
        let mut st = lock(&self.sh.st);
        let now = self.sh.now();
        let r = f(&mut st, &self.sh, now);
        // What the call made due runs now (a request held for a listener that the call
        // created), not at the driver's next wake-up.
        if st.cm.poll_timeout().is_some_and(|t| t <= now) {
            st.cm.handle_timeout(now);
        }
        st.pump(&self.sh, now);
        r
    }

    /// The id's number.
    pub fn id(&self) -> RdmaId {
        self.id
    }

    /// Queue on the id's channel an event the RDMA-CM library makes itself, without a
    /// message on the wire (`MulticastJoin`: over RoCE a join is the local attach and the
    /// IP group membership). Fails with `NoSuchId` for an id already destroyed.
    pub fn post_event(&self, kind: EventType, status: i32) -> Result<(), CmApiError> {
        let ch = lock(&self.sh.st)
            .ids
            .get(&self.id)
            .map(|i| i.channel.clone())
            .ok_or(RdmaCmError::NoSuchId)?;
        ch.push(CmEvent {
            id: self.clone(),
            listen_id: None,
            event: kind,
            status,
            param: rdma::Event::new(self.id, kind, status),
        });
        Ok(())
    }

    /// `rdma_migrate_id`: the id's events go to `to` from now on, and those of its events
    /// still waiting on its old channel (a listener's CONNECT_REQUESTs included) move there
    /// too, in order, as the kernel's `ucma_migrate_id` moves them (with a waiting
    /// CONNECT_REQUEST, the id it made): an event is never lost nor read from the old channel
    /// after this returns. Fails with `Stopped` after the service
    /// stopped, and with `NoSuchId` for an id already destroyed or a channel of another
    /// service.
    pub fn migrate(&self, to: &EventChannel) -> Result<(), CmApiError> {
        if self.sh.stop.load(Ordering::Acquire) {
            return Err(CmApiError::Stopped);
        }
        if !Arc::ptr_eq(&self.sh, &to.shared) {
            return Err(RdmaCmError::NoSuchId.into());
        }
        let mut st = lock(&self.sh.st);
        let Some(info) = st.ids.get_mut(&self.id) else {
            return Err(RdmaCmError::NoSuchId.into());
        };
        let from = std::mem::replace(&mut info.channel, to.ch.clone());
        if Arc::ptr_eq(&from, &to.ch) {
            return Ok(());
        }
        let mine = |e: &CmEvent| {
            e.id.id == self.id || e.listen_id.as_ref().is_some_and(|l| l.id == self.id)
        };
        let moved: Vec<CmEvent> = {
            let mut q = lock(&from.q);
            let (moved, kept): (VecDeque<CmEvent>, VecDeque<CmEvent>) =
                q.drain(..).partition(|e| mine(e));
            *q = kept;
            // The counter is not zero while events wait (see `push`): drained only when the
            // last of them left (a blocking descriptor would wait on a zero counter).
            if q.is_empty() && !moved.is_empty() {
                from.fd.drain();
            }
            moved.into()
        };
        for e in moved {
            // The id a waiting CONNECT_REQUEST made has not reached the application yet: it
            // follows its listener to the new channel.
            if e.id.id != self.id {
                if let Some(i) = st.ids.get_mut(&e.id.id) {
                    i.channel = to.ch.clone();
                }
            }
            to.ch.push(e);
        }
        Ok(())
    }

    /// The id's state (`enum rdma_cm_state`).
    pub fn state(&self) -> Option<IdState> {
        lock(&self.sh.st).cm.state(self.id)
    }

    /// `rdma_get_local_addr`.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        lock(&self.sh.st).cm.local_addr(self.id)
    }

    /// `rdma_get_peer_addr`.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        lock(&self.sh.st).cm.peer_addr(self.id)
    }

    /// The resolved route (`id->route`).
    pub fn route(&self) -> Option<rdma::Route> {
        lock(&self.sh.st).cm.route(self.id)
    }

    /// The id's QP (`id->qp`).
    pub fn qp(&self) -> Option<QpNumber> {
        lock(&self.sh.st).ids.get(&self.id).and_then(|i| i.qp)
    }

    /// The NIC the id's QP lives on (`id->verbs`).
    pub fn nic(&self) -> &Arc<Nic> {
        &self.sh.nic
    }

    /// `rdma_set_option(RDMA_OPTION_ID_TOS)`: the traffic class of the id's route and
    /// connection ([`rdma::RdmaCm::set_tos`]).
    pub fn set_tos(&self, tos: u8) -> Result<(), CmApiError> {
        Ok(lock(&self.sh.st).cm.set_tos(self.id, tos)?)
    }

    /// `rdma_set_option(RDMA_OPTION_IB_PATH)`: the route the consumer gives
    /// ([`rdma::RdmaCm::set_route`]); the next hop's MAC comes from the kernel's neighbours, as
    /// for a resolved route. ROUTE_RESOLVED follows.
    pub fn set_route(&self, route: rdma::Route) -> Result<(), CmApiError> {
        let (src, dst) = (route.local_gid.to_ip(), route.remote_gid.to_ip());
        let mac = self.sh.resolver.neighbour(src, dst).ok();
        self.call(|st, _, _| {
            st.cm.set_route(self.id, route)?;
            if let Some(i) = st.ids.get_mut(&self.id) {
                i.mac = mac.or(i.mac);
            }
            st.local_for.insert(route.remote_gid, src);
            Ok(())
        })
    }

    /// `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)`: the connection QP's Local ACK Timeout
    /// exponent ([`rdma::RdmaCm::set_ack_timeout`]).
    pub fn set_ack_timeout(&self, t: u8) -> Result<(), CmApiError> {
        Ok(lock(&self.sh.st).cm.set_ack_timeout(self.id, t)?)
    }

    /// `rdma_bind_addr` (port 0: an ephemeral port; the unspecified address: every address).
    ///
    /// On a device that shares its address and port with other programs', a port given
    /// (not 0) is claimed among them first ([`CmId::claim_service`]): one another program has
    /// bound at the same address is refused (`AddrInUse`), as by the kernel, and a REQ for
    /// it that comes before `rdma_listen` reaches this program, whose CM holds it for its
    /// listener (perftest `-R` connects right after its exchange).
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<(), CmApiError> {
        let slot = lock(&self.sh.st).share_slot;
        let claim = match slot.filter(|_| addr.port() != 0) {
            Some(slot) => {
                let sid = self.call(|st, _, _| Ok(st.cm.service_for(self.id, addr.port())))?;
                match sid {
                    Some(sid) => Some(Self::claim_service(slot, addr, sid)?),
                    None => None,
                }
            }
            None => None,
        };
        self.call(|st, _, _| {
            st.cm.bind_addr(self.id, addr)?;
            if let Some(c) = claim {
                st.claims.insert(self.id, c);
            }
            Ok(())
        })
    }

    /// Claim service `sid` at `addr` among the programs sharing the port, waiting up to
    /// [`CLAIM_WAIT`] while another program holds it (it may still be exiting: qperf's server
    /// forks a process per test, each on the same port).
    fn claim_service(slot: u8, addr: SocketAddr, sid: u64) -> Result<ServiceClaim, CmApiError> {
        let until = std::time::Instant::now() + CLAIM_WAIT;
        loop {
            match ServiceClaim::take(slot, Some(addr.ip()), sid) {
                Ok(c) => return Ok(c),
                Err(e)
                    if e.kind() == std::io::ErrorKind::AddrInUse
                        && std::time::Instant::now() < until =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    return Err(CmApiError::Cm(RdmaCmError::AddrInUse(addr)))
                }
                Err(e) => return Err(CmApiError::Io(e)),
            }
        }
    }

    /// `rdma_resolve_addr`: ADDR_RESOLVED (or ADDR_ERROR) follows. A source with a port
    /// binds to it first.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), CmApiError> {
        self.call(|st, _, now| {
            if let Some(s) = src.filter(|s| s.port() != 0) {
                st.cm.bind_addr(self.id, s)?;
            }
            Ok(st
                .cm
                .resolve_addr(now, self.id, src.map(|s| s.ip()), dst, timeout)?)
        })
    }

    /// `rdma_resolve_route`: ROUTE_RESOLVED (or ROUTE_ERROR) follows; the next hop's MAC
    /// comes from the kernel's neighbours.
    pub fn resolve_route(&self, timeout: Duration) -> Result<(), CmApiError> {
        self.call(|st, _, now| Ok(st.cm.resolve_route(now, self.id, timeout)?))
    }

    /// `rdma_create_qp`: a QP of the id's transport (RC for `PortSpace::TCP`, UD for
    /// `PortSpace::UDP`; `init.qp_type` is set accordingly), moved to INIT (RC) or RTS (UD,
    /// Q_Key [`UDP_QKEY`]).
    pub fn create_qp(&self, mut init: QpInitAttr) -> Result<QpNumber, CmApiError> {
        self.call(|st, sh, _| {
            let info = st.ids.get(&self.id).ok_or(RdmaCmError::NoSuchId)?;
            if info.qp.is_some() {
                return Err(CmApiError::Qp("the id has a QP already"));
            }
            let ud = st
                .cm
                .state(self.id)
                .is_some_and(|_| st.cm.kind(self.id) == Some(QpKind::Ud));
            init.qp_type = if ud { QpType::Ud } else { QpType::Rc };
            let qpn = sh.nic.create_qp(init)?;
            let r = if ud {
                let psn = st.keys.psn();
                sh.nic.bring_up_ud(
                    qpn,
                    &UdParams {
                        qkey: UDP_QKEY,
                        local_psn: psn,
                    },
                )
            } else {
                let a = QpAttr {
                    qp_state: QpState::Init,
                    pkey_index: 0,
                    port_num: 1,
                    qp_access_flags: AccessFlags::LOCAL_WRITE
                        | AccessFlags::REMOTE_WRITE
                        | AccessFlags::REMOTE_READ
                        | AccessFlags::REMOTE_ATOMIC,
                    ..QpAttr::default()
                };
                use QpAttrMask as M;
                sh.nic.modify_qp(
                    qpn,
                    &a,
                    M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
                )
            };
            if let Err(e) = r {
                let _ = sh.nic.destroy_qp(qpn);
                return Err(e.into());
            }
            if let Some(i) = st.ids.get_mut(&self.id) {
                i.qp = Some(qpn);
            }
            Ok(qpn)
        })
    }

    /// Give the id a QP the application created (librdmacm's "self-created QP", as perftest
    /// and `rping -q` do): an RC QP in RESET is moved to INIT as [`create_qp`](Self::create_qp)
    /// does; one already in INIT is taken as it is. From then on the CM moves it as it moves
    /// its own. A UD QP (an id of `PortSpace::UDP`) is brought to RTS as `create_qp` brings
    /// its own: from RESET with Q_Key [`UDP_QKEY`], from INIT with the Q_Key it has (give it
    /// `UDP_QKEY`: that is what the SIDR_REP announces); one at RTS is taken as it is.
    /// [`detach_qp`](Self::detach_qp) gives it back.
    pub fn attach_qp(&self, qpn: QpNumber) -> Result<(), CmApiError> {
        self.call(|st, sh, _| {
            let info = st.ids.get(&self.id).ok_or(RdmaCmError::NoSuchId)?;
            if info.qp.is_some() {
                return Err(CmApiError::Qp("the id has a QP already"));
            }
            let (state, _) = sh.nic.query_qp(qpn)?;
            if st.cm.kind(self.id) == Some(QpKind::Ud) {
                let p = UdParams {
                    qkey: UDP_QKEY,
                    local_psn: st.keys.psn(),
                };
                match state {
                    QpState::Reset => sh.nic.bring_up_ud(qpn, &p)?,
                    QpState::Init => {
                        for (a, mask) in [p.rtr_attr(), p.rts_attr()] {
                            sh.nic.modify_qp(qpn, &a, mask)?;
                        }
                    }
                    QpState::Rts => {}
                    _ => return Err(CmApiError::Qp("the UD QP is neither RESET, INIT nor RTS")),
                }
                if let Some(i) = st.ids.get_mut(&self.id) {
                    i.qp = Some(qpn);
                }
                return Ok(());
            }
            match state {
                QpState::Reset => {
                    use QpAttrMask as M;
                    let a = QpAttr {
                        qp_state: QpState::Init,
                        pkey_index: 0,
                        port_num: 1,
                        qp_access_flags: AccessFlags::LOCAL_WRITE
                            | AccessFlags::REMOTE_WRITE
                            | AccessFlags::REMOTE_READ
                            | AccessFlags::REMOTE_ATOMIC,
                        ..QpAttr::default()
                    };
                    sh.nic.modify_qp(
                        qpn,
                        &a,
                        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
                    )?;
                }
                QpState::Init => {}
                _ => return Err(CmApiError::Qp("the QP is past INIT")),
            }
            if let Some(i) = st.ids.get_mut(&self.id) {
                i.qp = Some(qpn);
            }
            Ok(())
        })
    }

    /// Forget the id's QP without destroying it (the application keeps it).
    pub fn detach_qp(&self) -> Option<QpNumber> {
        lock(&self.sh.st)
            .ids
            .get_mut(&self.id)
            .and_then(|i| i.qp.take())
    }

    /// `rdma_destroy_qp`.
    pub fn destroy_qp(&self) -> Result<(), CmApiError> {
        self.call(|st, sh, _| {
            let qpn = st
                .ids
                .get_mut(&self.id)
                .and_then(|i| i.qp.take())
                .ok_or(CmApiError::Qp("the id has no QP"))?;
            Ok(sh.nic.destroy_qp(qpn)?)
        })
    }

    /// `rdma_connect`: REQ (or SIDR_REQ) with `p`'s private data. For an id with a QP, its
    /// number and a random starting PSN replace `p.qp_num` and `p.starting_psn`, and the
    /// answer is ESTABLISHED (the QP at RTS); without one, CONNECT_RESPONSE (then
    /// [`establish`](Self::establish)).
    pub fn connect(&self, p: &ConnParam<'_>) -> Result<(), CmApiError> {
        self.call(|st, sh, now| {
            let mut p = *p;
            if let Some(qpn) = st.ids.get(&self.id).and_then(|i| i.qp) {
                p.qp_num = qpn;
                p.starting_psn = crate::wire::Psn::new(st.keys.psn());
                p.xrc = sh.nic.with_device(|d| d.qp_type(qpn)) == Ok(QpType::XrcSend);
            }
            Ok(st.cm.connect(now, self.id, &p)?)
        })
    }

    /// `rdma_establish` (after CONNECT_RESPONSE on an id without a QP): RTU.
    pub fn establish(&self) -> Result<(), CmApiError> {
        self.call(|st, _, now| Ok(st.cm.establish(now, self.id)?))
    }

    /// `rdma_listen`: CONNECT_REQUEST events with new ids follow; at most `backlog` wait for
    /// accept or reject (more are rejected).
    ///
    /// On a device that shares its address and port with other programs', the service of an
    /// id not claimed at its bind (bound to port 0: an ephemeral port) is claimed among them
    /// first ([`CmId::bind_addr`]).
    pub fn listen(&self, backlog: usize) -> Result<(), CmApiError> {
        let service = {
            let st = lock(&self.sh.st);
            if st.claims.contains_key(&self.id) {
                None
            } else {
                st.share_slot.zip(st.cm.service_of(self.id))
            }
        };
        // Claimed outside the lock (the wait must not hold up the CM's thread).
        let claim = match service {
            Some((slot, (addr, sid))) => Some(Self::claim_service(slot, addr, sid)?),
            None => None,
        };
        self.call(|st, _, _| {
            st.cm.listen(self.id, backlog)?;
            if let Some(c) = claim {
                st.claims.insert(self.id, c);
            }
            Ok(())
        })
    }

    /// `rdma_accept` a CONNECT_REQUEST's id: with a QP, it goes to RTR and RTS from the
    /// REQ before the REP leaves (its number and a random starting PSN replace `p`'s);
    /// ESTABLISHED follows when the RTU arrives. UD: SIDR_REP with the QP and `p.qkey`.
    pub fn accept(&self, p: &ConnParam<'_>) -> Result<(), CmApiError> {
        self.call(|st, sh, now| {
            let mut p = *p;
            let qp = st.ids.get(&self.id).and_then(|i| i.qp);
            if let Some(qpn) = qp {
                p.qp_num = qpn;
                p.starting_psn = crate::wire::Psn::new(st.keys.psn());
            }
            let params = st.cm.accept(now, self.id, &p)?;
            if let (Some(qpn), Some(params)) = (qp, params) {
                if let Err(e) = st.apply_rtr_rts(sh, qpn, &params, None) {
                    let _ = st.cm.reject(now, self.id, &[]);
                    return Err(e);
                }
            }
            Ok(())
        })
    }

    /// `rdma_reject` a CONNECT_REQUEST's id, with private data (REJ reason 28, consumer
    /// reject; SIDR: status "rejected").
    pub fn reject(&self, private_data: &[u8]) -> Result<(), CmApiError> {
        self.call(|st, _, now| Ok(st.cm.reject(now, self.id, private_data)?))
    }

    /// `rdma_disconnect`: the QP to ERROR, then DREQ (or DREP when the peer's DREQ came
    /// first). DISCONNECTED follows, then TIMEWAIT_EXIT.
    pub fn disconnect(&self) -> Result<(), CmApiError> {
        self.call(|st, sh, now| {
            if let Some(qpn) = st.ids.get(&self.id).and_then(|i| i.qp) {
                let a = QpAttr {
                    qp_state: QpState::Err,
                    ..QpAttr::default()
                };
                let _ = sh.nic.modify_qp(qpn, &a, QpAttrMask::STATE);
            }
            Ok(st.cm.disconnect(now, self.id)?)
        })
    }

    /// `rdma_destroy_id`: what the connection's state needs (reject, disconnect) and the id
    /// is gone. Its QP, if still there, is destroyed too.
    pub fn destroy(self) -> Result<(), CmApiError> {
        self.call(|st, sh, now| {
            st.claims.remove(&self.id);
            if let Some(i) = st.ids.remove(&self.id) {
                if let Some(qpn) = i.qp {
                    let _ = sh.nic.destroy_qp(qpn);
                }
            }
            Ok(st.cm.destroy_id(now, self.id)?)
        })
    }
}
