//! A fuzz harness for the rsocket receive path (issue 13/17): a hostile peer, written with plain
//! RDMA-CM and verbs calls, connects to a real rsocket of this library and then does whatever
//! the input says: connection data with any version, length, credits, SGL and buffer; RDMA
//! WRITEs with any immediate (data of any claimed length, credit grants, control messages,
//! opcodes rsockets do not know) at any offset of the rsocket's receive ring, or past it;
//! writes into the rsocket's target SGL (grants of any address, key and length); SENDs (which
//! rsockets never post buffers for); a disconnect. Between them the rsocket side reads, peeks,
//! sends, polls and shuts down, non-blocking; the listener's sizes (receive and send buffer,
//! queue depths, inline size) come from the input too.
//!
//! Checked: nothing crashes (the fuzz build runs with AddressSanitizer and overflow checks);
//! a request whose connection data is not rsocket version 1 with a target SGL is rejected,
//! any other is accepted; every byte `rrecv` returns (and every byte it peeks) is the byte the
//! peer put at that place of the ring, or one never written there — nothing from outside the
//! ring, nothing out of order; `rrecv` never returns more than the data messages the peer
//! claimed before it broke the protocol, and once it claimed more messages than its credits or
//! more bytes than the ring holds, and its good data is read, `rrecv` fails with EPROTO;
//! what the rsocket keeps stays bounded (messages ≤ its receive queue, bytes ≤ its ring); the
//! rsocket never writes into the peer's memory outside the space the peer granted; `rsend`
//! returns at most what it was given; each input ends with `rclose` and everything torn down.
//!
//! The device is this process's (`FERROCE_DEV=lo`): the harness refuses to run unless the only
//! interface it can see is `lo` (a network namespace of its own: `unshare -rn`).
//! Run by `fuzz/fuzz_targets/rsocket_rx.rs` (`tools/fuzz rsocket_rx RUNS [SECONDS]`) and, on
//! stable, by `cabi/tests/rsocket_fuzz.rs` (seeded inputs and the kept regressions).
#![allow(missing_docs)]

use super::*;
use crate::entry_fuzz::Input;
use crate::verbs::{ibv_create_cq, ibv_destroy_cq};
use std::cell::RefCell;

const PORT: u16 = 7491;
/// The peer's receive ring (what it may grant), its target SGL and its send buffer.
const PEER_RING: usize = 1 << 16;
const PEER_SEND: usize = 1 << 13;
const GUARD: u8 = 0x5c;
/// Receives the peer keeps posted.
const PEER_RQ: u32 = 128;
/// Actions per input at most.
const MAX_ACTIONS: usize = 64;

/// The byte the peer puts at offset `x` of the rsocket's ring (never zero, so that a byte
/// never written, zero, is told apart).
fn pat(x: u64) -> u8 {
    ((x.wrapping_mul(7).wrapping_add(x >> 9)) % 251) as u8 + 1
}

/// What every input shares: the listener and the peer's event channel.
struct Env {
    listener: c_int,
    ch: *mut rdma_event_channel,
}

thread_local! {
    static ENV: RefCell<Option<Env>> = const { RefCell::new(None) };
}

fn addr() -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: PORT.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be(),
        },
        sin_zero: [0; 8],
    }
}

fn env() -> Env {
    let others: Vec<String> = ferroce::io::netdev::netdevs()
        .into_iter()
        .map(|d| d.name)
        .filter(|n| n != "lo")
        .collect();
    assert!(
        others.is_empty(),
        "the rsocket harness needs a network namespace of its own with only lo \
         (unshare -rn; tools/fuzz does); interfaces seen: {others:?}"
    );
    std::env::set_var("FERROCE_DEV", "lo");
    let l = rsocket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0);
    assert!(l >= 0, "rsocket: {}", std::io::Error::last_os_error());
    let a = addr();
    // SAFETY: a sockaddr_in on the stack.
    let r = unsafe { rbind(l, &a as *const _ as *const sockaddr, 16) };
    assert_eq!(r, 0, "rbind: {}", std::io::Error::last_os_error());
    assert_eq!(rlisten(l, 8), 0, "rlisten");
    let ch = new_channel().expect("the peer's event channel");
    Env { listener: l, ch }
}

/// What one input did (for the stable test's depth check).
#[derive(Default, Debug, Clone, Copy)]
pub struct Stats {
    pub inputs: u64,
    pub rejected: u64,
    pub connected: u64,
    pub peer_writes: u64,
    pub peer_write_errors: u64,
    pub bytes_read: u64,
    pub eproto: u64,
    pub bytes_sent: u64,
    /// Bytes `riowrite` put straight into the peer's memory.
    pub bytes_iowritten: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.inputs += o.inputs;
        self.rejected += o.rejected;
        self.connected += o.connected;
        self.peer_writes += o.peer_writes;
        self.peer_write_errors += o.peer_write_errors;
        self.bytes_read += o.bytes_read;
        self.eproto += o.eproto;
        self.bytes_sent += o.bytes_sent;
        self.bytes_iowritten += o.bytes_iowritten;
    }
}

/// Run one input.
pub fn run(data: &[u8]) {
    run_stats(data);
}

/// Memory the peer registers (freed after its MR).
struct Mem {
    buf: Box<[u8]>,
    mr: *mut ibv_mr,
}

/// The peer: an id with a QP, its CQ and memory.
struct Peer {
    id: *mut rdma_cm_id,
    cq: *mut ibv_cq,
    ring: Mem,
    tsgl: Mem,
    send: Mem,
    /// Its QP failed (an error completion): nothing more goes out.
    broken: bool,
}

impl Peer {
    fn poll(&mut self) -> Vec<ibv_wc> {
        let mut out = Vec::new();
        // SAFETY: an all-zero ibv_wc is valid.
        let mut wcs: [ibv_wc; 16] = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: the peer's live CQ; room for 16 completions.
            let n = unsafe {
                let f = (*(*self.cq).context).ops.poll_cq.expect("poll_cq");
                f(self.cq, 16, wcs.as_mut_ptr())
            };
            assert!(n >= 0, "poll_cq: {n}");
            out.extend_from_slice(&wcs[..n as usize]);
            let reposts = wcs[..n as usize]
                .iter()
                .filter(|w| w.wr_id & RECV_FLAG != 0 && w.status == 0)
                .count();
            for _ in 0..reposts {
                self.post_recv();
            }
            if (n as usize) < 16 {
                return out;
            }
        }
    }

    /// `n` bytes (at most its send buffer) as they land at offset `off` of the rsocket's
    /// ring, in the send buffer: the SGE that sends them (none for 0 bytes).
    fn ring_bytes(&mut self, off: u64, n: u64) -> Option<ibv_sge> {
        let n = n.min(PEER_SEND as u64);
        for i in 0..n {
            self.send.buf[i as usize] = pat(off + i);
        }
        self.send_sge(n as u32)
    }

    /// The SGE of the first `len` bytes of the send buffer (none for 0 bytes).
    fn send_sge(&self, len: u32) -> Option<ibv_sge> {
        // SAFETY: the live MR of the send buffer.
        let lkey = unsafe { (*self.send.mr).lkey };
        (len > 0).then_some(ibv_sge {
            addr: self.send.buf.as_ptr() as u64,
            length: len,
            lkey,
        })
    }

    fn post_recv(&self) {
        let mut wr = ibv_recv_wr {
            wr_id: RECV_FLAG,
            next: null_mut(),
            sg_list: null_mut(),
            num_sge: 0,
        };
        let mut bad = null_mut();
        // SAFETY: the peer's live QP; the request is valid for the call.
        unsafe {
            let qp = (*self.id).qp;
            let f = (*(*qp).context).ops.post_recv.expect("post_recv");
            f(qp, &mut wr, &mut bad);
        }
    }

    /// Posts one signalled request and waits for its completion: Some(ok), or None when it
    /// did not complete in time (the peer is then broken too).
    fn post(
        &mut self,
        opcode: c_int,
        imm: u32,
        sge: Option<ibv_sge>,
        addr: u64,
        rkey: u32,
    ) -> Option<bool> {
        if self.broken {
            return Some(false);
        }
        let mut sges = sge.into_iter().collect::<Vec<_>>();
        // SAFETY: an all-zero work request is a valid starting point.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = 0x5e5d;
        wr.sg_list = if sges.is_empty() {
            null_mut()
        } else {
            sges.as_mut_ptr()
        };
        wr.num_sge = sges.len() as c_int;
        wr.opcode = opcode;
        wr.send_flags = 2; // SIGNALED
        wr.imm_data = imm.to_be();
        wr.wr.rdma = wr_rdma {
            remote_addr: addr,
            rkey,
        };
        let mut bad = null_mut();
        // SAFETY: the peer's live QP; the request and its SGE are valid for the call.
        let r = unsafe {
            let qp = (*self.id).qp;
            let f = (*(*qp).context).ops.post_send.expect("post_send");
            f(qp, &mut wr, &mut bad)
        };
        if r != 0 {
            self.fail();
            return Some(false);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            for wc in self.poll() {
                if wc.wr_id == 0x5e5d {
                    if trace() && wc.status != 0 {
                        eprintln!("peer: opcode {opcode} failed: status {}", wc.status);
                    }
                    if wc.status != 0 {
                        self.fail();
                    }
                    return Some(wc.status == 0);
                }
            }
            std::thread::yield_now();
        }
        if trace() {
            eprintln!("peer: opcode {opcode} did not complete in time");
        }
        self.fail();
        None
    }

    /// The peer's QP failed: it disconnects, as a program whose QP failed does (otherwise
    /// the rsocket's sends to it retry until their retry count is exceeded: seconds per input).
    fn fail(&mut self) {
        if !self.broken {
            self.broken = true;
            // SAFETY: the peer's id.
            unsafe { rdma_disconnect(self.id) };
        }
    }
}

fn reg(pd: *mut ibv_pd, len: usize, access: c_int) -> Mem {
    let mut buf = vec![GUARD; len].into_boxed_slice();
    // SAFETY: the buffer lives in `Mem` and outlives its MR (deregistered first).
    let mr = unsafe { ibv_reg_mr(pd, buf.as_mut_ptr() as *mut c_void, len, access) };
    assert!(!mr.is_null(), "ibv_reg_mr");
    Mem { buf, mr }
}

/// The bounded things of the rsocket `fd`: (queued messages, unread bytes, queue, ring).
fn kept(fd: c_int) -> Option<(usize, u64, u32, u32)> {
    let rs = lookup(fd)?;
    let g = lock(&rs.st);
    Some((g.rmsg.len(), g.unread, g.rq_size, g.rbuf_size))
}

/// The error the rsocket `fd` recorded (0: none).
fn recorded_error(fd: c_int) -> c_int {
    lookup(fd).map_or(0, |rs| lock(&rs.st).err)
}

pub fn run_stats(data: &[u8]) -> Stats {
    ENV.with(|e| {
        let mut e = e.borrow_mut();
        let env = e.get_or_insert_with(env);
        one(env, &mut Input { d: data, i: 0 })
    })
}

fn set_int(fd: c_int, level: c_int, name: c_int, v: c_int) {
    // SAFETY: an int on the stack.
    unsafe { rsetsockopt(fd, level, name, &v as *const c_int as *const c_void, 4) };
}

fn drain(ch: *mut rdma_event_channel) {
    while next_event(ch, None).is_ok() {}
}

fn one(env: &Env, inp: &mut Input) -> Stats {
    let t0 = Instant::now();
    let mut st = Stats {
        inputs: 1,
        ..Stats::default()
    };
    // The listener's sizes for this connection: each rdma-core's default unless its bit of
    // `sizes` is set, then from the input.
    let sizes = if inp.u8() % 4 == 0 { inp.u8() } else { 0 };
    let mut size = |bit: u8, default: u32, wild: fn(&mut Input) -> c_int| {
        if sizes & bit != 0 {
            wild(inp)
        } else {
            default as c_int
        }
    };
    let rcvbuf = size(1, DEF_MEM / 2, |i| {
        [0, 1, 100, 2048, 4096, 8192, 16384, 65536][(i.u8() % 8) as usize]
    });
    let rq = size(2, DEF_RQ, |i| i32::from(i.u8()));
    let sndbuf = size(4, DEF_MEM / 2, |i| i32::from(i.u16()));
    let sq = size(8, DEF_SQ, |i| i32::from(i.u8()));
    let inline = size(16, DEF_INLINE, |i| i32::from(i.u8()));
    // An iomap area (riowrite's targets, written by the peer): none, as rdma-core's default.
    let iomap = size(32, 0, |i| i32::from(i.u8() % 9));
    for (level, name, v) in [
        (libc::SOL_SOCKET, libc::SO_RCVBUF, rcvbuf),
        (libc::SOL_SOCKET, libc::SO_SNDBUF, sndbuf),
        (SOL_RDMA, RDMA_RQSIZE, rq),
        (SOL_RDMA, RDMA_SQSIZE, sq),
        (SOL_RDMA, RDMA_INLINE, inline),
        (SOL_RDMA, RDMA_IOMAPSIZE, iomap),
    ] {
        set_int(env.listener, level, name, v);
    }
    if trace() {
        eprintln!("rcvbuf {rcvbuf} sndbuf {sndbuf} rq {rq} sq {sq} inline {inline} iomap {iomap}");
    }

    // The peer's endpoint.
    let mut id = null_mut();
    let a = addr();
    // SAFETY: this library's calls with live objects; out parameters are locals.
    unsafe {
        assert_eq!(rdma_create_id(env.ch, &mut id, null_mut(), RDMA_PS_TCP), 0);
        assert_eq!(
            rdma_resolve_addr(id, null_mut(), &a as *const _ as *mut sockaddr, 2000),
            0
        );
    }
    wait_event(env.ch, EV_ADDR_RESOLVED).expect("address resolved");
    // SAFETY: the id above.
    assert_eq!(unsafe { rdma_resolve_route(id, 2000) }, 0);
    wait_event(env.ch, EV_ROUTE_RESOLVED).expect("route resolved");
    // SAFETY: the id's device; objects freed at the end of this input.
    let (pd, cq) = unsafe {
        let pd = ibv_alloc_pd((*id).verbs);
        assert!(!pd.is_null());
        let cq = ibv_create_cq((*id).verbs, 512, null_mut(), null_mut(), 0);
        assert!(!cq.is_null());
        (pd, cq)
    };
    let mut qa = ibv_qp_init_attr {
        qp_context: null_mut(),
        send_cq: cq,
        recv_cq: cq,
        srq: null_mut(),
        cap: ibv_qp_cap {
            max_send_wr: 16,
            max_recv_wr: PEER_RQ,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: IBV_QPT_RC,
        sq_sig_all: 0,
    };
    // SAFETY: the id, its PD and a creation block on the stack.
    let r = unsafe { rdma_create_qp(id, pd, &mut qa) };
    assert_eq!(r, 0, "rdma_create_qp");
    let mut peer = Peer {
        id,
        cq,
        ring: reg(pd, PEER_RING, ACCESS_WRITE),
        tsgl: reg(pd, SGE_LEN * SGL_SIZE as usize, ACCESS_WRITE),
        send: reg(pd, PEER_SEND, 1),
        broken: false,
    };
    for _ in 0..PEER_RQ {
        peer.post_recv();
    }
    // SAFETY: the live MRs.
    let (ring_addr, ring_key, tsgl_addr, tsgl_key) = unsafe {
        (
            (*peer.ring.mr).addr as u64,
            (*peer.ring.mr).rkey,
            (*peer.tsgl.mr).addr as u64,
            (*peer.tsgl.mr).rkey,
        )
    };
    // The space the rsocket may write into: the first half of the ring (the connection
    // data's buffer), then what the peer grants.
    let mut granted: Vec<(u64, u64)> = Vec::new();
    let mut cd = ConnData {
        flags: 0,
        credits: PEER_RQ as u16,
        iomap_scale: 0,
        target_sgl: (tsgl_addr, tsgl_key, SGL_SIZE),
        data_buf: (ring_addr, ring_key, (PEER_RING / 2) as u32),
    };
    let corrupt = if inp.u8() % 4 == 0 { inp.u8() } else { 0 };
    if corrupt & 1 != 0 {
        cd.credits = inp.u16();
    }
    if corrupt & 2 != 0 {
        cd.target_sgl.2 = u32::from(inp.u8() % 4);
    }
    if corrupt & 4 != 0 {
        cd.data_buf = (
            ring_addr.wrapping_add(u64::from(inp.u16())),
            if inp.u8() & 1 != 0 {
                inp.u32()
            } else {
                ring_key
            },
            inp.u32() % (PEER_RING as u32 + 4096),
        );
    }
    if corrupt & 8 != 0 {
        cd.flags = inp.u8();
        cd.iomap_scale = inp.u8();
    }
    let mut pdata = cd.emit().to_vec();
    if corrupt & 16 != 0 {
        pdata[0] = inp.u8();
    }
    if corrupt & 32 != 0 {
        pdata.truncate(inp.u8() as usize % (CONN_DATA_LEN + 1));
    }
    // What the rsocket sees: the REQ carries 56 bytes of private data for RDMA-CM, what the
    // peer gave padded with zeros.
    let mut seen = pdata.clone();
    seen.resize(56, 0);
    let acceptable = ConnData::parse(&seen).is_some();
    if acceptable && cd.data_buf.1 == ring_key {
        granted.push((cd.data_buf.0, u64::from(cd.data_buf.2)));
    }
    let mut p = rdma_conn_param {
        private_data: pdata.as_ptr() as *const c_void,
        private_data_len: pdata.len() as u8,
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 1,
        retry_count: 7,
        // No retry after an RNR NAK: a flood past the rsocket's receives fails the peer's
        // write at once (this one thread would otherwise wait for the rsocket to post more,
        // which it does only when this thread calls it).
        rnr_retry_count: 0,
        srq: 0,
        qp_num: 0,
    };
    // SAFETY: the id and a parameter block on the stack.
    assert_eq!(unsafe { rdma_connect(id, &mut p) }, 0, "rdma_connect");

    // The rsocket side takes the request (or rejects it).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut fd = -1;
    let mut rejected = false;
    let mut est: Option<Ev> = None;
    while Instant::now() < deadline {
        // SAFETY: no address wanted.
        let r = unsafe { raccept(env.listener, null_mut(), null_mut()) };
        if r >= 0 {
            fd = r;
        }
        match next_event(env.ch, None) {
            Ok(e) if e.kind == EV_REJECTED => {
                rejected = true;
                break;
            }
            Ok(e) if e.kind == EV_ESTABLISHED => est = Some(e),
            Ok(e) => panic!("peer event {} (status {})", e.kind, e.status),
            Err(_) => {}
        }
        if fd >= 0 && est.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    if !acceptable {
        assert!(
            rejected && fd < 0,
            "connection data {pdata:02x?} is not rsocket's, yet it was not rejected"
        );
        st.rejected = 1;
    } else {
        assert!(
            !rejected && fd >= 0 && est.is_some(),
            "connection data {pdata:02x?} was refused (rejected {rejected}, fd {fd})"
        );
        st.connected = 1;
        let srv = ConnData::parse(&est.as_ref().expect("established").pdata)
            .expect("the rsocket's REP carries its connection data");
        actions(inp, &mut peer, fd, &srv, &mut st, &mut granted);
    }

    if trace() {
        eprintln!("connected and acted in {:?}", t0.elapsed());
    }
    // Tear down: the rsocket, then the peer.
    if fd >= 0 {
        assert_eq!(rclose(fd), 0, "rclose");
    }
    // SAFETY: the peer's objects, freed in dependency order once the events are acked.
    unsafe {
        rdma_disconnect(id);
        drain(env.ch);
        // A rejected connection's REJECTED may come after the deadline check above.
        rdma_destroy_qp(id);
        rdma_destroy_id(id);
        drain(env.ch);
        ibv_destroy_cq(cq);
        for m in [&peer.ring, &peer.tsgl, &peer.send] {
            ibv_dereg_mr(m.mr);
        }
        ibv_dealloc_pd(pd);
    }
    if trace() {
        eprintln!("torn down at {:?}", t0.elapsed());
    }
    // The rsocket never wrote the peer's memory outside the space it was granted.
    for (i, &b) in peer.ring.buf.iter().enumerate() {
        if b == GUARD {
            continue;
        }
        let at = ring_addr + i as u64;
        assert!(
            granted.iter().any(|&(a, l)| at >= a && at < a + l),
            "the rsocket wrote byte {i} of the peer's ring, never granted ({granted:x?})"
        );
    }
    st
}

/// What the peer sent that reaches the rsocket's reader, in order, until the rsocket takes it
/// in.
enum Msg {
    /// A data message claiming this many bytes.
    Data(u64),
    /// A shutdown or disconnect message: what follows is not for the reader.
    Shut,
}

/// The data model of the rsocket's receive side, as the peer drove it. The rsocket takes in
/// what arrived lazily (as rdma-core's: when a read finds nothing taken in, on rpoll, when a
/// send waits), and checks a message against its credits and ring when it takes it in; the
/// model does the same at the same points, so it knows exactly what the rsocket holds, until
/// something it cannot follow exactly happens (`inexact`): then it is an upper bound.
struct Model {
    /// Sent, not taken in yet.
    pending: std::collections::VecDeque<Msg>,
    /// Taken in, not read: the lengths, as the rsocket queues them, and their bytes.
    q: std::collections::VecDeque<u64>,
    bytes: u64,
    /// Bytes the rsocket may hand out in all (exact while `!inexact`).
    good: u64,
    /// A message broke the protocol (past the credits or the ring): later data is not read,
    /// and once what came before is read, reads fail with EPROTO.
    violated: bool,
    /// A shutdown or disconnect message was taken in.
    shut: bool,
    /// The model is an upper bound from here.
    inexact: bool,
    /// Bytes read so far (the ring offset of the next byte is this modulo the ring size).
    read: u64,
    rq: usize,
    ring: u64,
}

impl Model {
    /// The rsocket takes in what arrived.
    fn take_in(&mut self) {
        while let Some(msg) = self.pending.pop_front() {
            match msg {
                Msg::Data(_) if self.violated || self.shut => {}
                Msg::Data(c) => {
                    if self.q.len() >= self.rq || self.bytes + c > self.ring {
                        self.violated = true;
                        continue;
                    }
                    self.q.push_back(c);
                    self.bytes += c;
                    self.good += c;
                    // An empty message is consumed or not depending on how much a read
                    // asks: not followed exactly.
                    if c == 0 {
                        self.set_inexact();
                    }
                }
                Msg::Shut => self.shut = true,
            }
        }
    }

    /// Something the model cannot follow exactly happened (a failed write, a disconnect, a
    /// SEND, a shutdown, a failed write of the rsocket's own): every claim still pending may
    /// yet be handed out.
    fn set_inexact(&mut self) {
        self.inexact = true;
        for msg in self.pending.drain(..) {
            if let Msg::Data(c) = msg {
                self.good += c;
            }
        }
    }

    /// A data message the peer sent.
    fn sent(&mut self, claim: u64) {
        if self.inexact {
            self.good += claim;
        } else {
            self.pending.push_back(Msg::Data(claim));
        }
    }

    /// What a read of `want` bytes takes from what was taken in: whole messages in order,
    /// the last one perhaps in part (its rest stays first in the queue).
    fn take(&mut self, want: u64, peek: bool) -> u64 {
        let mut done = 0;
        let mut q = self.q.clone();
        while done < want {
            let Some(&avail) = q.front() else { break };
            let n = avail.min(want - done);
            done += n;
            if n == avail {
                q.pop_front();
            } else {
                q[0] = avail - n;
                break;
            }
        }
        if !peek {
            self.q = q;
            self.bytes -= done;
        }
        done
    }
}

/// `RSOCKET_RX_TRACE=1`: say what each action did (for replaying a kept input).
fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("RSOCKET_RX_TRACE").is_some())
}

/// Space of the peer's ring it names to the rsocket (in its target SGL or an iomap entry):
/// (offset in the ring, length, key), mostly inside the ring with its key, sometimes any
/// length or key; recorded in `granted` when the key is the ring's.
fn grant(
    inp: &mut Input,
    peer_ring: u64,
    peer_ring_key: u32,
    granted: &mut Vec<(u64, u64)>,
) -> (u64, u64, u32) {
    let goff = u64::from(inp.u16()) % PEER_RING as u64;
    let glen = match inp.u8() % 4 {
        0..=2 => (PEER_RING as u64 - goff).min(u64::from(inp.u16())),
        _ => u64::from(inp.u32()),
    };
    let key = if inp.u8() % 8 == 0 {
        inp.u32()
    } else {
        peer_ring_key
    };
    if key == peer_ring_key {
        granted.push((peer_ring + goff, glen));
    }
    (goff, glen, key)
}

/// rpoll with no wait: the rsocket takes in what arrived.
fn rpoll_now(fd: c_int) {
    let mut p = pollfd {
        fd,
        events: libc::POLLIN | libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one pollfd on the stack.
    let r = unsafe { ferroce_rpoll(&mut p, 1, 0) };
    assert!((0..=1).contains(&r), "rpoll: {r}");
}

fn actions(
    inp: &mut Input,
    peer: &mut Peer,
    fd: c_int,
    srv: &ConnData,
    st: &mut Stats,
    granted: &mut Vec<(u64, u64)>,
) {
    let (_, _, rq_size, ring) = kept(fd).expect("the accepted rsocket");
    let ring = u64::from(ring);
    let (ring_base, ring_key) = (srv.data_buf.0, srv.data_buf.1);
    let (tsgl_base, tsgl_key, tsgl_n) = srv.target_sgl;
    // SAFETY: the live MRs.
    let (peer_ring, peer_ring_key) = unsafe { ((*peer.ring.mr).addr as u64, (*peer.ring.mr).rkey) };
    let mut m = Model {
        pending: std::collections::VecDeque::new(),
        q: std::collections::VecDeque::new(),
        bytes: 0,
        good: 0,
        violated: false,
        shut: false,
        inexact: false,
        read: 0,
        rq: rq_size as usize,
        ring,
    };
    // Where the next well-behaved write goes.
    let mut next_off = 0u64;
    // The offsets of the iomap entries the peer wrote.
    let mut announced: Vec<u64> = Vec::new();
    let mut out = vec![0u8; 1 << 16];
    for _ in 0..MAX_ACTIONS {
        if inp.done() {
            break;
        }
        if trace() {
            let k = kept(fd);
            eprintln!(
                "model good {} read {} pending {} q {:?} violated {} shut {} inexact {}; \
                 rsocket (msgs, unread, rq, ring) {k:?}",
                m.good,
                m.read,
                m.pending.len(),
                m.q,
                m.violated,
                m.shut,
                m.inexact
            );
        }
        let action = inp.u8() % 32;
        if trace() {
            eprintln!("action {action}");
        }
        match action {
            // A data message (or one with any immediate) into the ring.
            0..=9 => {
                let len = match inp.u8() % 4 {
                    0..=2 => u64::from(inp.u16() % 512).max(1),
                    _ => u64::from(inp.u16() % 4096),
                };
                let off = match inp.u8() % 4 {
                    // As a sender would: on from the last write, from the start when the
                    // message does not fit before the end.
                    0..=2 if next_off + len > ring => 0,
                    0..=2 => next_off,
                    _ => u64::from(inp.u32()) % (ring + 8192),
                };
                let imm = match inp.u8() % 6 {
                    0..=3 => msg(OP_DATA, len as u32),
                    4 => msg(OP_DATA, inp.u32() & 0x1fff_ffff),
                    _ => inp.u32(),
                };
                let n = len.min(PEER_SEND as u64);
                let sge = peer.ring_bytes(off, n);
                st.peer_writes += 1;
                let was_broken = peer.broken;
                let r = peer.post(
                    IBV_WR_RDMA_WRITE_WITH_IMM,
                    imm,
                    sge,
                    ring_base.wrapping_add(off),
                    ring_key,
                );
                if r == Some(true) {
                    next_off = (off + n) % ring.max(1);
                    match imm >> 29 {
                        OP_DATA => m.sent(u64::from(imm & 0x1fff_ffff)),
                        OP_CTRL
                            if !m.inexact
                                && matches!(imm & 0x1fff_ffff, CTRL_DISCONNECT | CTRL_SHUTDOWN) =>
                        {
                            m.pending.push_back(Msg::Shut)
                        }
                        _ => {}
                    }
                } else {
                    st.peer_write_errors += u64::from(!was_broken);
                    m.set_inexact();
                    // A write that failed or did not complete in time may still have been
                    // carried out at the rsocket (a lost or late acknowledgement): its claim
                    // stays in the bound.
                    if imm >> 29 == OP_DATA {
                        m.good += u64::from(imm & 0x1fff_ffff);
                    }
                }
            }
            // Bytes into the ring without a message.
            10 | 11 => {
                let len = u64::from(inp.u16()) % PEER_SEND as u64;
                let off = u64::from(inp.u32()) % (ring + 1024);
                let sge = peer.ring_bytes(off, len);
                if peer.post(
                    IBV_WR_RDMA_WRITE,
                    0,
                    sge,
                    ring_base.wrapping_add(off),
                    ring_key,
                ) != Some(true)
                {
                    m.set_inexact();
                }
            }
            // A grant: an SGE into the rsocket's target SGL, then a credit message.
            12..=14 => {
                let entry = match inp.u8() % 8 {
                    0 => u64::from(inp.u8() % 4),
                    _ => u64::from(inp.u8()) % u64::from(tsgl_n.clamp(1, 2)),
                };
                let (goff, glen, key) = grant(inp, peer_ring, peer_ring_key, granted);
                let mut sge = [0u8; SGE_LEN];
                sge[..8].copy_from_slice(&(peer_ring + goff).to_ne_bytes());
                sge[8..12].copy_from_slice(&key.to_ne_bytes());
                sge[12..16].copy_from_slice(&(glen as u32).to_ne_bytes());
                peer.send.buf[..SGE_LEN].copy_from_slice(&sge);
                let ok = peer.post(
                    IBV_WR_RDMA_WRITE,
                    0,
                    peer.send_sge(SGE_LEN as u32),
                    tsgl_base.wrapping_add(entry * SGE_LEN as u64),
                    tsgl_key,
                ) == Some(true);
                let credits = match inp.u8() % 4 {
                    0..=2 => u32::from(inp.u8()),
                    _ => inp.u32() & 0x1fff_ffff,
                };
                if !ok
                    || peer.post(IBV_WR_RDMA_WRITE_WITH_IMM, msg(OP_SGL, credits), None, 0, 0)
                        != Some(true)
                {
                    m.set_inexact();
                }
            }
            // A SEND: rsockets post no buffers for one.
            15 => {
                let len = u32::from(inp.u8());
                let sge = peer.send_sge(len);
                peer.post(2, 0, sge, 0, 0);
                m.set_inexact();
            }
            // The rsocket reads (or peeks).
            16..=21 => {
                let want = (inp.u16() as usize % out.len()).max(1);
                let peek = inp.u8() % 4 == 0;
                let flags = libc::MSG_DONTWAIT | if peek { libc::MSG_PEEK } else { 0 };
                // A read that finds nothing taken in takes in what arrived.
                if m.q.is_empty() {
                    m.take_in();
                }
                let exact = !m.inexact;
                let expect = m.take(want as u64, true);
                // SAFETY: `out` holds `want` bytes.
                let r = unsafe { rrecv(fd, out.as_mut_ptr() as *mut c_void, want, flags) };
                let err = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                if exact {
                    // Exactly what the queued messages give; when none: EPROTO after a
                    // violation, the end of the stream after the peer's shutdown, EAGAIN
                    // otherwise (EIO: a write of the rsocket's own failed, the peer having
                    // granted space it cannot write).
                    let ok = if expect > 0 {
                        r == expect as isize
                    } else if m.violated {
                        r < 0 && (err == libc::EPROTO || err == libc::EIO)
                    } else if m.shut {
                        r == 0
                    } else {
                        r < 0 && (err == libc::EAGAIN || err == libc::EIO)
                    };
                    assert!(
                        ok,
                        "rrecv of {want} (peek {peek}) returned {r} (errno {err}); the model: \
                         {expect} bytes queued, violated {}, shut {}",
                        m.violated, m.shut
                    );
                }
                if r > 0 {
                    let n = r as u64;
                    assert!(r as usize <= want, "rrecv returned {r} for {want} bytes");
                    assert!(
                        m.read + n <= m.good,
                        "rrecv returned {} bytes in all, the peer's good messages held {}",
                        m.read + n,
                        m.good
                    );
                    for (i, &b) in out[..r as usize].iter().enumerate() {
                        let at = (m.read + i as u64) % ring;
                        assert!(
                            b == pat(at) || b == 0,
                            "byte {} read at ring offset {at}: {b:#x}, the peer wrote {:#x} \
                             there",
                            m.read + i as u64,
                            pat(at)
                        );
                    }
                    if !peek {
                        m.read += n;
                        st.bytes_read += n;
                        if exact {
                            m.take(n, false);
                        }
                    }
                } else if r < 0 {
                    assert!(err != 0, "rrecv failed without an errno");
                    if err == libc::EIO {
                        m.set_inexact();
                    }
                    if err == libc::EPROTO {
                        st.eproto += 1;
                    }
                }
            }
            // The rsocket sends (and perhaps takes in what arrived while it waits: the
            // model cannot tell, so it makes the rsocket take it in now).
            22..=25 => {
                let len = (inp.u16() as usize % out.len()).max(1);
                for (i, b) in out[..len].iter_mut().enumerate() {
                    *b = i as u8;
                }
                // SAFETY: `out` holds `len` bytes.
                let r =
                    unsafe { rsend(fd, out.as_ptr() as *const c_void, len, libc::MSG_DONTWAIT) };
                assert!(r <= len as isize, "rsend returned {r} for {len}");
                if r > 0 {
                    st.bytes_sent += r as u64;
                }
                rpoll_now(fd);
                m.take_in();
                peer.poll();
            }
            // rpoll: the rsocket takes in what arrived.
            26..=28 => {
                rpoll_now(fd);
                m.take_in();
            }
            // An entry of the rsocket's iomap area (where its riowrite may write): any slot,
            // past the area too, any offset, address, key and length; then the IOMAP_SGL
            // message that announces it.
            30 => {
                let n_maps = if srv.flags & CONN_FLAG_IOMAP != 0 {
                    u64::from(scale_to_value(srv.iomap_scale))
                } else {
                    0
                };
                let idx = match inp.u8() % 8 {
                    0 => u64::from(inp.u8() % 16),
                    _ => u64::from(inp.u8()) % n_maps.max(1),
                };
                let offset = u64::from(inp.u16());
                let (goff, glen, key) = grant(inp, peer_ring, peer_ring_key, granted);
                announced.push(offset);
                let b = &mut peer.send.buf[..IOMAP_LEN];
                b[..8].copy_from_slice(&offset.to_ne_bytes());
                b[8..16].copy_from_slice(&(peer_ring + goff).to_ne_bytes());
                b[16..20].copy_from_slice(&key.to_ne_bytes());
                b[20..24].copy_from_slice(&(glen as u32).to_ne_bytes());
                let ok = peer.post(
                    IBV_WR_RDMA_WRITE,
                    0,
                    peer.send_sge(IOMAP_LEN as u32),
                    tsgl_base
                        .wrapping_add((SGE_LEN * SGL_SIZE as usize) as u64)
                        .wrapping_add(idx * IOMAP_LEN as u64),
                    tsgl_key,
                ) == Some(true);
                if !ok
                    || peer.post(
                        IBV_WR_RDMA_WRITE_WITH_IMM,
                        msg(OP_IOMAP_SGL, idx as u32),
                        None,
                        0,
                        0,
                    ) != Some(true)
                {
                    m.set_inexact();
                }
            }
            // riowrite: straight into the peer's memory, where its iomap entries say.
            31 => {
                let len = (inp.u16() as usize % 8192).max(1);
                // Mostly at or just after an offset the peer announced.
                let offset = match (inp.u8() % 4, announced.len()) {
                    (0, _) | (_, 0) => u64::from(inp.u16()),
                    (_, k) => announced[inp.u8() as usize % k] + u64::from(inp.u8()),
                };
                // SAFETY: `out` holds `len` bytes.
                let r = unsafe {
                    riowrite(
                        fd,
                        out.as_ptr() as *const c_void,
                        len,
                        offset as libc::off_t,
                        libc::MSG_DONTWAIT,
                    )
                };
                if trace() {
                    let e = std::io::Error::last_os_error();
                    let maps: Vec<_> = lookup(fd)
                        .map(|rs| {
                            let g = lock(&rs.st);
                            (0..g.target_iomap_size as usize)
                                .map(|i| g.target_iomap(i))
                                .collect()
                        })
                        .unwrap_or_default();
                    eprintln!(
                        "riowrite {len} at {offset}: {r} ({e}); announced {announced:?}; \
                         the rsocket's entries {maps:x?}"
                    );
                }
                assert!(
                    r == usize::MAX || r <= len,
                    "riowrite returned {r} for {len}"
                );
                if r != usize::MAX {
                    st.bytes_iowritten += r as u64;
                }
                rpoll_now(fd);
                m.take_in();
                peer.poll();
            }
            // The end: a shutdown of the rsocket, or the peer disconnects.
            _ => {
                if inp.u8() % 2 == 0 {
                    let how =
                        [libc::SHUT_RD, libc::SHUT_WR, libc::SHUT_RDWR][inp.u8() as usize % 3];
                    rshutdown(fd, how);
                } else {
                    peer.fail();
                }
                m.set_inexact();
            }
        }
        // A write of the rsocket's own failed (it wrote where the peer granted, and the
        // grant was bad): the connection failed, in the middle of what the model follows.
        if recorded_error(fd) == libc::EIO {
            m.set_inexact();
        }
        let (msgs, unread, rq, rb) = kept(fd).expect("the rsocket");
        assert!(
            msgs <= rq as usize && unread <= u64::from(rb),
            "the rsocket keeps {msgs} messages and {unread} bytes (queue {rq}, ring {rb})"
        );
        if !m.inexact {
            assert!(
                msgs == m.q.len() && unread == m.bytes,
                "the rsocket holds {msgs} messages, {unread} bytes; the model {} and {}",
                m.q.len(),
                m.bytes
            );
        }
    }
}
