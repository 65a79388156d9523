//! Shared helpers of the integration tests: the RC tests over the simulator (here) and the
//! tests that run as root in network namespaces ([`net`]).
#![allow(dead_code)]

pub mod cli;
pub mod net;

use ferroce::sim::{LinkConfig, Pair};
use ferroce::time::Duration;
use ferroce::verbs::*;
use ferroce::wire::QpNumber;

/// One side's verbs objects.
pub struct End {
    pub pd: Pd,
    pub cq: Cq,
    pub qp: QpNumber,
    pub mr: MemoryRegion,
}

pub const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// One end of an RC connection on a running NIC ([`nic_rc_pair`]).
pub struct NicEnd {
    pub cq: Cq,
    pub qp: QpNumber,
    pub mr: MemoryRegion,
}

/// An RC QP on each of two running NICs, connected at path MTU `mtu` with starting PSNs 100
/// (A) and 200 (B): each with a PD of its own, one CQ of `cq_depth` for both queues, and a
/// region of `mr_len` bytes with every right.
pub fn nic_rc_pair(
    a: &ferroce::runtime::Nic,
    b: &ferroce::runtime::Nic,
    cap: QpCap,
    cq_depth: usize,
    mr_len: usize,
    mtu: Mtu,
) -> (NicEnd, NicEnd) {
    let params = RcParams {
        mtu,
        ..Default::default()
    };
    nic_rc_pair_with(a, b, cap, cq_depth, mr_len, &params)
}

/// A UD QP on a running NIC, in RTS with Q_Key 0x1111 (four WRs of one SGE each way), with
/// its PD and its CQ (16 deep, both queues).
pub fn nic_ud_qp(n: &ferroce::runtime::Nic) -> (QpNumber, Pd, Cq) {
    let pd = n.alloc_pd().unwrap();
    let cq = n.create_cq(16).unwrap();
    let qp = n
        .create_qp(QpInitAttr::new(pd, cq, cq, qp_cap(4, 1, 0)).with_type(QpType::Ud))
        .unwrap();
    n.bring_up_ud(
        qp,
        &UdParams {
            qkey: 0x1111,
            local_psn: 0,
        },
    )
    .unwrap();
    (qp, pd, cq)
}

/// [`nic_rc_pair`] with both QPs connected with `params` (but the starting PSNs 100 and 200).
pub fn nic_rc_pair_with(
    a: &ferroce::runtime::Nic,
    b: &ferroce::runtime::Nic,
    cap: QpCap,
    cq_depth: usize,
    mr_len: usize,
    params: &RcParams,
) -> (NicEnd, NicEnd) {
    let side = |n: &ferroce::runtime::Nic| {
        let pd = n.alloc_pd().unwrap();
        let cq = n.create_cq(cq_depth).unwrap();
        let qp = ferroce::runtime::create_rc_qp(n, pd, cq, cap).unwrap();
        let mr = n.reg_mr(pd, mr_len, ALL).unwrap();
        NicEnd { cq, qp, mr }
    };
    let (x, y) = (side(a), side(b));
    let (ea, eb) = (
        a.local_end(x.qp, 0, 100).unwrap(),
        b.local_end(y.qp, 0, 200).unwrap(),
    );
    let params = |psn| RcParams {
        local_psn: psn,
        ..*params
    };
    a.connect_rc(x.qp, &eb, &params(100)).unwrap();
    b.connect_rc(y.qp, &ea, &params(200)).unwrap();
    (x, y)
}

pub fn cap() -> QpCap {
    qp_cap(512, 4, 256)
}

/// Queue sizes: `wr` work requests and `sge` scatter/gather entries on both queues, `inline`
/// bytes of inline data.
pub fn qp_cap(wr: u32, sge: u32, inline: u32) -> QpCap {
    QpCap {
        max_send_wr: wr,
        max_recv_wr: wr,
        max_send_sge: sge,
        max_recv_sge: sge,
        max_inline_data: inline,
    }
}

/// An RDMA WRITE `id` of the first `len` bytes of `local` to the start of `remote`.
pub fn write_wr(id: u64, local: &MemoryRegion, remote: &MemoryRegion, len: u32) -> SendWr {
    rdma_wr(id, true, local, remote, len)
}

/// An RDMA READ `id` of the first `len` bytes of `remote` into the start of `local`.
pub fn read_wr(id: u64, local: &MemoryRegion, remote: &MemoryRegion, len: u32) -> SendWr {
    rdma_wr(id, false, local, remote, len)
}

fn rdma_wr(id: u64, write: bool, local: &MemoryRegion, remote: &MemoryRegion, len: u32) -> SendWr {
    let (remote_addr, rkey) = (remote.addr(), remote.rkey());
    let op = if write {
        SendOp::RdmaWrite { remote_addr, rkey }
    } else {
        SendOp::RdmaRead { remote_addr, rkey }
    };
    SendWr::new(id, op, vec![sge(local, 0, len as usize)])
}

pub fn end(dev: &mut Device, mr_len: usize) -> End {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1 << 16).unwrap();
    let qp = dev.create_qp(QpInitAttr::new(pd, cq, cq, cap())).unwrap();
    let mr = dev.reg_mr(pd, mr_len, ALL).unwrap();
    End { pd, cq, qp, mr }
}

/// A lossy link: `loss`, with 1 % duplication, 1 % reordering (by 30 µs), jitter.
pub fn lossy(loss: f64) -> LinkConfig {
    LinkConfig::new()
        .latency(Duration::from_micros(5))
        .jitter(Duration::from_micros(2))
        .bandwidth_bps(25_000_000_000)
        .loss(loss)
        .duplicate(0.01)
        .reorder(0.01, Duration::from_micros(30))
}

/// Connect QPs `x` (on A) and `y` (on B) with the given parameters.
pub fn connect(p: &mut Pair, x: &End, y: &End, params: &RcParams, psn_a: u32, psn_b: u32) {
    connect_qps(p, x.qp, y.qp, params, psn_a, psn_b);
}

/// Connect QP `qa` on A and QP `qb` on B (starting send PSNs `psn_a` and `psn_b`).
pub fn connect_qps(
    p: &mut Pair,
    qa: QpNumber,
    qb: QpNumber,
    params: &RcParams,
    psn_a: u32,
    psn_b: u32,
) {
    p.connect(qa, qb, params, psn_a, psn_b).unwrap();
}

/// A RoCE v2 frame from device `from` to device `to` (their first addresses, IPv4; ECN not
/// ECT, UDP source port 0xc000) carrying `roce` and `payload` with a valid ICRC: what the peer,
/// or someone forging its packets, puts on the wire.
pub fn frame_between(
    from: &Device,
    to: &Device,
    roce: ferroce::wire::RoceRepr,
    payload: &[u8],
) -> Vec<u8> {
    use ferroce::wire::{EthernetRepr, FrameRepr, IpRepr, Ipv4Repr, UdpRepr};
    let (std::net::IpAddr::V4(src), std::net::IpAddr::V4(dst)) =
        (from.config().gids[0], to.config().gids[0])
    else {
        panic!("frame_between: IPv4 devices only");
    };
    let f = FrameRepr {
        eth: Some(EthernetRepr {
            dst: to.config().mac,
            src: from.config().mac,
            vlan: None,
            ethertype: 0x0800,
        }),
        ip: IpRepr::V4(Ipv4Repr {
            src,
            dst,
            dscp: 0,
            ecn: ferroce::wire::Ecn::NotEct,
            ident: 0,
            dont_frag: true,
            ttl: 64,
        }),
        udp: UdpRepr {
            src_port: 0xc000,
            dst_port: ferroce::wire::ROCE_V2_PORT,
            checksum: 0,
        },
        roce,
    };
    let mut buf = vec![0u8; f.buffer_len()];
    f.emit(&mut buf, payload).unwrap();
    buf
}

pub fn poll(dev: &mut Device, cq: Cq) -> Vec<WorkCompletion> {
    let mut v = Vec::new();
    dev.poll_cq(cq, &mut v, usize::MAX).unwrap();
    v
}

/// A deterministic pattern that differs per `seed` and never repeats within 2^20 bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The bytes of a hex dump (every character that is not a hex digit is skipped).
pub fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

pub fn sge(mr: &MemoryRegion, off: usize, len: usize) -> Sge {
    Sge {
        addr: mr.addr() + off as u64,
        length: len as u32,
        lkey: mr.lkey(),
    }
}

/// One delivered frame of a [`Pair::trace`], decoded: (time, from A?, transport headers,
/// payload length).
pub type TracedPacket = (ferroce::time::Instant, bool, ferroce::wire::RoceRepr, usize);

/// The frames the pair's trace recorded (`p.trace = Some(vec![])` before driving), decoded
/// with [`ferroce::wire::parse_frame`]; frames that do not parse (corrupted) are left out.
pub fn decoded_trace(p: &Pair) -> Vec<TracedPacket> {
    p.trace
        .as_ref()
        .expect("trace not enabled")
        .iter()
        .filter_map(|(t, from_a, f)| {
            let x = ferroce::wire::parse_frame(f).ok()?;
            Some((*t, *from_a, x.repr.roce, x.payload.len()))
        })
        .collect()
}
