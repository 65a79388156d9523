//! A fuzz harness for datagram rsockets (issues 13 and 17): a hostile peer sends a real
//! datagram rsocket of this library whatever the input says, on both of its ways in:
//! - side-channel datagrams from a plain UDP socket: well-formed data messages (the header
//!   naming any QPN and QP address), headers with a field broken (tag, version, length, op),
//!   raw bytes of any length;
//! - UD messages from a UD QP of its own to the socket's QPN (or another), with the socket's
//!   Q_Key or another: a `ds_header` naming the true source address and any port, one naming
//!   another address (a forged source), raw bytes.
//!
//! Between them the socket reads (non-blocking, any buffer size, `MSG_PEEK` too), sends back to
//! the peer (which its side-channel headers may have pointed at the peer's UD QP), and polls.
//!
//! Checked: nothing crashes (the fuzz build runs with AddressSanitizer and overflow checks);
//! every datagram `rrecvfrom` returns is one the peer sent as deliverable — a well-formed
//! side-channel data message (reported from the UDP socket's address) or a UD message to the
//! socket's QPN and Q_Key whose `ds_header` names the true source address (reported from the
//! address and port it names) — with its bytes, truncated to the buffer at most; a UD message
//! with a forged source, a broken header, another QPN or Q_Key is never returned; nothing is
//! returned twice (a peek aside); what the socket sends reaches the peer byte for byte, over
//! the side channel with rdma-core's header or over UD behind a `ds_header` naming the socket;
//! what the socket holds stays bounded (a drain after every input ends with `EAGAIN`).
//!
//! The device is this process's (`FERROCE_DEV=lo`): like the stream harness, it refuses to
//! run unless the only interface it can see is `lo` (a network namespace of its own).
//! Run by `fuzz/fuzz_targets/rsocket_dgram.rs` (`tools/fuzz rsocket_dgram RUNS [SECONDS]`) and,
//! on stable, by `cabi/tests/rsocket_fuzz.rs` (a seeded batch).
#![allow(missing_docs)]

use super::super::{rbind, rclose, rfcntl, rrecvfrom, rsendto, rsocket};
use super::*;
use crate::entry_fuzz::Input;
use std::cell::RefCell;
use std::collections::HashMap as Map;
use std::net::UdpSocket;

/// The socket under test, the peer's UDP socket and the peer's UD QP.
const SOCK_PORT: u16 = 7492;
const PEER_UDP_PORT: u16 = 7493;
const PEER_QP_PORT: u16 = 7494;
/// Actions per input at most.
const MAX_ACTIONS: usize = 64;
/// A payload's marker: the first four bytes, then a sequence number (so a datagram returned
/// names the one it came from).
const MARK: [u8; 4] = *b"FZDG";

fn lo(port: u16) -> SocketAddr {
    SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port)
}

/// What every input shares.
struct Env {
    sock: c_int,
    sock_qpn: u32,
    udp: UdpSocket,
    peer: Qp,
    /// The peer's address handle to 127.0.0.1.
    ah: *mut ibv_ah,
    seq: u32,
    /// Deliverable datagrams not yet returned: sequence number -> (source to report, bytes).
    sent: Map<u32, (SocketAddr, Vec<u8>)>,
    /// How each recent datagram was sent (for a failure's message).
    how: Map<u32, String>,
}

thread_local! {
    static ENV: RefCell<Option<Env>> = const { RefCell::new(None) };
}

/// What the inputs did (for the stable test's depth check).
#[derive(Default, Debug, Clone, Copy)]
pub struct Stats {
    pub inputs: u64,
    pub side_sent: u64,
    pub ud_sent: u64,
    pub delivered_side: u64,
    pub delivered_ud: u64,
    pub peeked: u64,
    pub truncated: u64,
    pub sent_back_side: u64,
    pub sent_back_ud: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.inputs += o.inputs;
        self.side_sent += o.side_sent;
        self.ud_sent += o.ud_sent;
        self.delivered_side += o.delivered_side;
        self.delivered_ud += o.delivered_ud;
        self.peeked += o.peeked;
        self.truncated += o.truncated;
        self.sent_back_side += o.sent_back_side;
        self.sent_back_ud += o.sent_back_ud;
    }
}

/// One datagram waiting on the peer's UDP socket, if any.
fn udp_recv(u: &UdpSocket) -> Option<Vec<u8>> {
    let mut b = vec![0u8; 4096];
    let n = u.recv(&mut b).ok()?;
    b.truncate(n);
    Some(b)
}

fn env() -> Env {
    let others: Vec<String> = ferroce::io::netdev::netdevs()
        .into_iter()
        .map(|d| d.name)
        .filter(|n| n != "lo")
        .collect();
    assert!(
        others.is_empty(),
        "the datagram rsocket harness needs a network namespace of its own with only lo \
         (unshare -rn; tools/fuzz does); interfaces seen: {others:?}"
    );
    std::env::set_var("FERROCE_DEV", "lo");
    let sock = rsocket(libc::AF_INET, libc::SOCK_DGRAM, 0);
    assert!(sock >= 0, "rsocket: {}", std::io::Error::last_os_error());
    // SAFETY: zeroed storage is valid; written by to_sockaddr.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let l = to_sockaddr(&mut ss, lo(SOCK_PORT));
    // SAFETY: a local address.
    let r = unsafe { rbind(sock, &ss as *const _ as *const sockaddr, l) };
    assert_eq!(r, 0, "rbind: {}", std::io::Error::last_os_error());
    assert_eq!(
        rfcntl(sock, libc::F_SETFL, libc::O_NONBLOCK as libc::c_long),
        0
    );
    let udp = UdpSocket::bind(lo(PEER_UDP_PORT)).expect("the peer's UDP socket");
    udp.set_nonblocking(true)
        .expect("a non-blocking UDP socket");
    let mut inline = 64;
    let peer = Qp::create(lo(PEER_QP_PORT), 64, 64, &mut inline).expect("the peer's UD QP");
    let ah = peer.ah_to(Ipv4Addr::LOCALHOST.into());
    assert!(!ah.is_null(), "the peer's address handle");
    // Learn the socket's QPN: a well-formed data message on the side channel is answered
    // with a control message carrying it (and points the socket at the peer's QP).
    let mut m = udp_header(OP_DATA, peer.qpn, &Ipv4Addr::LOCALHOST.into());
    m.extend_from_slice(b"hello");
    let _ = udp.send_to(&m, lo(SOCK_PORT));
    let mut e = Env {
        sock,
        sock_qpn: 0,
        udp,
        peer,
        ah,
        seq: 0,
        sent: Map::new(),
        how: Map::new(),
    };
    let until = Instant::now() + Duration::from_secs(10);
    let mut b = [0u8; 64];
    while e.sock_qpn == 0 && Instant::now() < until {
        // The socket reads its side channel from its own calls.
        let _ = recv(&e, &mut b, 0);
        while let Some(d) = udp_recv(&e.udp) {
            if let Some((OP_CTRL, qpn, _, _)) = parse_udp_header(&d, true) {
                e.sock_qpn = qpn;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_ne!(
        e.sock_qpn, 0,
        "the socket never answered on its side channel"
    );
    // The "hello" (not a payload of the checked kind) goes unchecked.
    while recv(&e, &mut b, 0).is_ok() {}
    e
}

/// `rrecvfrom` on the socket, non-blocking: Ok((bytes, source)) or the errno.
fn recv(e: &Env, buf: &mut [u8], flags: c_int) -> Result<(usize, SocketAddr), c_int> {
    // SAFETY: zeroed storage is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut l = size_of::<libc::sockaddr_storage>() as socklen_t;
    // SAFETY: a buffer of its length; an address buffer of its length.
    let n = unsafe {
        rrecvfrom(
            e.sock,
            buf.as_mut_ptr() as *mut c_void,
            buf.len(),
            flags | libc::MSG_DONTWAIT,
            &mut ss as *mut _ as *mut sockaddr,
            &mut l,
        )
    };
    if n < 0 {
        return Err(errno_or(libc::EIO));
    }
    // SAFETY: storage rrecvfrom wrote (a sockaddr_storage holds any address).
    let src = unsafe { from_sockaddr(&ss as *const _ as *const sockaddr) };
    let src = src.expect("rrecvfrom's source");
    Ok((n as usize, src))
}

/// The sequence number a payload carries.
fn seq_of(b: &[u8]) -> Option<u32> {
    (b.len() >= 8 && b[..4] == MARK).then(|| u32::from_le_bytes(b[4..8].try_into().unwrap()))
}

/// A payload of `len` bytes (at least the marker and the number) for sequence number `seq`.
fn payload(seq: u32, len: usize) -> Vec<u8> {
    let mut p = MARK.to_vec();
    p.extend_from_slice(&seq.to_le_bytes());
    p.extend((8..len.max(8)).map(|i| (i as u32 ^ seq.wrapping_mul(31)) as u8));
    p
}

/// One read, checked against what the peer sent.
fn read_one(e: &mut Env, st: &mut Stats, size: usize, peek: bool) -> bool {
    let mut buf = vec![0u8; size.max(1)];
    let flags = if peek { libc::MSG_PEEK } else { 0 };
    let (n, src) = match recv(e, &mut buf, flags) {
        Ok(r) => r,
        Err(libc::EAGAIN) => return false,
        Err(err) => panic!("rrecvfrom: errno {err}"),
    };
    let got = &buf[..n];
    // Buffers hold at least the marker and the number: every deliverable datagram names itself.
    let seq = seq_of(got).unwrap_or_else(|| {
        panic!("rrecvfrom returned {n} bytes {got:?} from {src}: not a datagram the peer sent")
    });
    let Some((want_src, want)) = e.sent.get(&seq) else {
        panic!(
            "rrecvfrom returned datagram {seq} from {src}: never sent as deliverable (or \
             returned before); it was sent {:?}",
            e.how.get(&seq)
        );
    };
    assert_eq!(src, *want_src, "datagram {seq}: the source reported");
    assert!(
        n <= want.len(),
        "datagram {seq}: {n} bytes of {}",
        want.len()
    );
    assert_eq!(got, &want[..n], "datagram {seq}: the bytes");
    if n < want.len() {
        st.truncated += 1;
    }
    if peek {
        st.peeked += 1;
    } else {
        if *want_src == lo(PEER_UDP_PORT) {
            st.delivered_side += 1;
        } else {
            st.delivered_ud += 1;
        }
        e.sent.remove(&seq);
    }
    true
}

/// Reads until `EAGAIN` (bounded: the socket holds at most its queues' worth).
fn drain(e: &mut Env, st: &mut Stats) {
    for _ in 0..10_000 {
        if !read_one(e, st, SLOT, false) {
            return;
        }
    }
    panic!("the socket still had datagrams after 10,000 reads");
}

/// Posts `b` from the peer's UD QP to QPN `qpn` with `qkey`; takes the peer's completions.
fn ud_send(e: &mut Env, qpn: u32, qkey: u32, b: &[u8]) -> bool {
    reap_peer(e, &mut Stats::default(), None);
    let q = &mut e.peer;
    let Some(slot) = q.free.pop() else {
        return false;
    };
    let Some(sb) = q.sbuf.as_ref() else {
        return false;
    };
    let n = b.len().min(SLOT);
    // SAFETY: slot < sq: a SLOT-byte buffer no posted send uses; n <= SLOT bytes copied.
    let p = unsafe { sb.ptr.add(slot as usize * SLOT) };
    // SAFETY: as above.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), p, n) };
    let mut sge = ibv_sge {
        addr: p as u64,
        length: n as u32,
        lkey: sb.lkey(),
    };
    let mut wr = ibv_send_wr {
        wr_id: u64::from(slot),
        next: null_mut(),
        sg_list: &mut sge,
        num_sge: 1,
        opcode: 2, // IBV_WR_SEND
        send_flags: 0,
        imm_data: 0,
        wr: wr_union {
            ud: wr_ud {
                ah: e.ah,
                remote_qpn: qpn,
                remote_qkey: qkey,
            },
        },
        remote_srqn: 0,
        bind_mw: crate::abi::ibv_send_wr_bind_mw::NONE,
    };
    // SAFETY: the peer's live QP; the request and its SGE are valid for the call.
    if unsafe { post_send_on(q.qp, &mut wr) }.is_err() {
        q.free.push(slot);
        return false;
    }
    true
}

/// Takes the peer's completions: send buffers freed, received messages (what the socket sent
/// over UD) checked against `expect` when given, receives posted again.
fn reap_peer(e: &mut Env, st: &mut Stats, mut expect: Option<&[u8]>) {
    const B: usize = 16;
    loop {
        // SAFETY: an all-zero ibv_wc is valid.
        let mut wcs: [ibv_wc; B] = unsafe { std::mem::zeroed() };
        // SAFETY: the peer's live CQ.
        let n = unsafe { poll_cq_into(e.peer.cq, &mut wcs) };
        for wc in &wcs[..n] {
            if wc.wr_id & RECV_FLAG == 0 {
                e.peer.free.push(wc.wr_id as u32);
                continue;
            }
            let slot = (wc.wr_id & !RECV_FLAG) as u32;
            if wc.status == 0 {
                let rb = e.peer.rbuf.as_ref().expect("the peer's receive buffers");
                let len = (wc.byte_len as usize).min(RSLOT);
                // SAFETY: slot < rq: a receive buffer of RSLOT bytes the engine finished.
                let got =
                    unsafe { std::slice::from_raw_parts(rb.ptr.add(slot as usize * RSLOT), len) };
                let msg = got.get(GRH_LEN..).unwrap_or(&[]);
                let (src, hl) = parse_ds_header(msg).expect("the socket's ds_header");
                assert_eq!(src, lo(SOCK_PORT), "the socket's ds_header names it");
                if let Some(want) = expect.take() {
                    assert_eq!(&msg[hl..], want, "what the socket sent over UD");
                    st.sent_back_ud += 1;
                }
            }
            let _ = e.peer.post_recv(slot);
        }
        if n < B {
            return;
        }
    }
}

/// Run one input.
pub fn run(data: &[u8]) {
    run_stats(data);
}

/// Run one input; what it did.
pub fn run_stats(data: &[u8]) -> Stats {
    ENV.with(|cell| {
        let mut g = cell.borrow_mut();
        let e = g.get_or_insert_with(env);
        let mut st = Stats {
            inputs: 1,
            ..Stats::default()
        };
        let mut inp = Input { d: data, i: 0 };
        for _ in 0..MAX_ACTIONS {
            if inp.done() {
                break;
            }
            act(e, &mut st, &mut inp);
        }
        // Let what is in flight land, then read everything: the socket keeps nothing.
        std::thread::sleep(Duration::from_micros(300));
        drain(e, &mut st);
        reap_peer(e, &mut st, None);
        // What was sent and not returned was dropped (UD, a full queue) or is still on its
        // way (a late one may come in the next input's reads): forget only the old.
        if e.sent.len() > 8192 || e.how.len() > 8192 {
            let keep = e.seq.saturating_sub(4096);
            e.sent.retain(|&k, _| k >= keep);
            e.how.retain(|&k, _| k >= keep);
        }
        while udp_recv(&e.udp).is_some() {}
        st
    })
}

fn act(e: &mut Env, st: &mut Stats, inp: &mut Input<'_>) {
    match inp.u8() % 8 {
        // A side-channel datagram.
        0 | 1 => {
            let kind = inp.u8() % 4;
            let len = usize::from(inp.u16()) % 2100;
            e.seq += 1;
            let p = payload(e.seq, len);
            let mut h = udp_header(
                if kind == 3 { inp.u8() } else { OP_DATA },
                if inp.u8() % 4 == 0 {
                    inp.u32()
                } else {
                    e.peer.qpn
                },
                &Ipv4Addr::LOCALHOST.into(),
            );
            match kind {
                // well-formed: deliverable, reported from the UDP socket's address
                0 => {
                    e.sent.insert(e.seq, (lo(PEER_UDP_PORT), p.clone()));
                }
                // a field broken: the tag, the version or the length
                1 => {
                    let at = [0usize, 4, 6][usize::from(inp.u8()) % 3];
                    h[at] ^= inp.u8() | 1;
                }
                // raw bytes instead of a header (never the tag: that would be a header)
                2 => {
                    h = (0..usize::from(inp.u8()) % 40).map(|_| inp.u8()).collect();
                    if let Some(b) = h.first_mut() {
                        *b &= 0x7f;
                    }
                }
                // another op: never data
                _ => {
                    if h[5] == OP_DATA {
                        h[5] = OP_CTRL;
                    }
                }
            }
            e.how.insert(
                e.seq,
                format!("on the side channel, kind {kind}, header {h:02x?}"),
            );
            h.extend_from_slice(&p);
            let _ = e.udp.send_to(&h, lo(SOCK_PORT));
            st.side_sent += 1;
        }
        // A UD message from the peer's QP.
        2 | 3 => {
            let kind = inp.u8() % 4;
            let len = usize::from(inp.u16()) % 1100;
            let port = if inp.u8() % 2 == 0 {
                PEER_QP_PORT
            } else {
                inp.u16()
            };
            let (qpn, qkey) = match inp.u8() % 8 {
                // any QPN but the peer's own (it would read its own message back)
                0 => match inp.u32() & 0xff_ffff {
                    q if q == e.peer.qpn => (0xff_fff0, RDMA_UDP_QKEY),
                    q => (q, RDMA_UDP_QKEY),
                },
                1 => (e.sock_qpn, inp.u32()),
                _ => (e.sock_qpn, RDMA_UDP_QKEY),
            };
            e.seq += 1;
            let p = payload(e.seq, len);
            let claimed = match kind {
                // the true source address, any port
                0 | 1 => lo(port),
                // a forged source: another address
                2 => SocketAddr::new(
                    Ipv4Addr::new(10, inp.u8(), inp.u8(), inp.u8().max(1)).into(),
                    port,
                ),
                _ => lo(port),
            };
            let mut m = if kind == 3 {
                // raw bytes (never version 4 or 6 first: that could be a ds_header)
                let mut r: Vec<u8> = (0..usize::from(inp.u8()) % 30).map(|_| inp.u8()).collect();
                if let Some(b) = r.first_mut() {
                    if *b == 4 || *b == 6 {
                        *b = 0;
                    }
                }
                r
            } else {
                ds_header(&claimed)
            };
            // A Q_Key with its high bit set in a send request means the sending QP's own
            // (IBTA 10.2.5), which is the socket's here.
            let wire_qkey = if qkey & 0x8000_0000 != 0 {
                RDMA_UDP_QKEY
            } else {
                qkey
            };
            let deliverable = kind < 2
                && qpn == e.sock_qpn
                && wire_qkey == RDMA_UDP_QKEY
                && m.len() + p.len() <= SLOT;
            m.extend_from_slice(&p);
            e.how.insert(
                e.seq,
                format!(
                    "over UD, kind {kind}, to QPN {qpn:#x} (the socket's {:#x}), Q_Key {qkey:#x}, \
                     {} bytes, claiming {claimed}",
                    e.sock_qpn,
                    m.len()
                ),
            );
            if ud_send(e, qpn, qkey, &m) {
                st.ud_sent += 1;
                if deliverable {
                    e.sent.insert(e.seq, (claimed, p));
                }
            }
        }
        // The socket reads.
        4 | 5 => {
            let size = 8 + usize::from(inp.u16()) % 2200;
            let peek = inp.u8() % 4 == 0;
            read_one(e, st, size, peek);
        }
        // The socket sends to the peer's UDP address: over UD when a well-formed side-channel
        // header pointed it at the peer's QP, else over the side channel.
        6 => {
            let len = 1 + usize::from(inp.u16()) % 1200;
            e.seq += 1;
            let p = payload(e.seq, len);
            // SAFETY: zeroed storage is valid; written by to_sockaddr.
            let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let l = to_sockaddr(&mut ss, lo(PEER_UDP_PORT));
            // SAFETY: a payload and an address of the harness's.
            let n = unsafe {
                rsendto(
                    e.sock,
                    p.as_ptr() as *const c_void,
                    p.len(),
                    libc::MSG_DONTWAIT,
                    &ss as *const _ as *const sockaddr,
                    l,
                )
            };
            if n < 0 {
                return;
            }
            assert_eq!(
                n as usize,
                p.len(),
                "rsendto returned {n} for {} bytes",
                p.len()
            );
            e.how
                .insert(e.seq, "by the socket to the peer's UDP address".into());
            // A side-channel header that named the socket's own QPN (the side channel is as
            // trusting as UDP) sends it back to the socket itself, from its own address.
            e.sent.insert(e.seq, (lo(SOCK_PORT), p.clone()));
            // It arrives on one of the two ways.
            let until = Instant::now() + Duration::from_millis(20);
            loop {
                if let Some(d) = udp_recv(&e.udp) {
                    if let Some((OP_DATA, _, hl, _)) = parse_udp_header(&d, true) {
                        if seq_of(&d[hl..]) == Some(e.seq) {
                            e.sent.remove(&e.seq);
                            assert_eq!(
                                &d[hl..],
                                &p[..],
                                "what the socket sent on its side channel"
                            );
                            st.sent_back_side += 1;
                            return;
                        }
                    }
                    continue;
                }
                let before = st.sent_back_ud;
                reap_peer(e, st, Some(&p));
                if st.sent_back_ud > before {
                    e.sent.remove(&e.seq);
                    return;
                }
                if Instant::now() >= until {
                    return;
                }
                // The socket's sends go out from its own calls.
                let mut b = [0u8; 1];
                let _ = recv(e, &mut b, libc::MSG_PEEK);
            }
        }
        // The socket polls.
        _ => {
            let mut f = pollfd {
                fd: e.sock,
                events: libc::POLLIN | libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: one pollfd on the stack.
            let r = unsafe { super::super::ferroce_rpoll(&mut f, 1, 0) };
            assert!((0..=1).contains(&r), "rpoll: {r}");
            assert_eq!(
                f.revents & !(libc::POLLIN | libc::POLLOUT),
                0,
                "rpoll: events {:#x}",
                f.revents
            );
        }
    }
}

/// Closes the socket (a process that runs inputs exits with it open otherwise).
pub fn close() {
    ENV.with(|cell| {
        if let Some(e) = cell.borrow_mut().take() {
            rclose(e.sock);
        }
    });
}
