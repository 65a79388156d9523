//! Multicast on the UDP-socket backend, on real sockets: `attach_mcast` returns only once the
//! backend's socket for the group has joined it, as `ibv_attach_mcast` on a kernel device,
//! so a datagram sent to the group right after the call is received; and a group's datagram
//! wakes a sleeping engine (the device's descriptor covers its group sockets: before, the
//! engine noticed one only at its next periodic wake-up, never with none). Before 2026-12-07 the
//! join waited for the engine's next round: a sender that went first lost its datagram (the
//! socket did not exist yet), which rdma-core's multicast RDMA-CM tests hit in 4 runs of 20.
//! Unprivileged (loopback addresses need no root; the group stays on `lo`).

mod common;
use ferroce::io::{UdpConfig, UdpDevice};
use ferroce::runtime::{Nic, NicOptions, PollMode};
use ferroce::verbs::*;
use ferroce::wire::MacAddr;
use ferroce::wire::QpNumber;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

/// A NIC on `ip`'s UDP socket whose engine thread, idle, sleeps until its descriptor or a
/// doorbell wakes it: what joins must not be left to its next round, and a group's datagram
/// must wake it.
fn nic(ip: Ipv4Addr, inline: bool) -> Nic {
    let dev = UdpDevice::open(&UdpConfig::new(IpAddr::V4(ip)))
        .unwrap_or_else(|e| panic!("UDP {ip}:4791: {e}"));
    let mut cfg = DeviceConfig::new(MacAddr([2, 0, 0, 0, 0, ip.octets()[3]]), IpAddr::V4(ip));
    // The UDP device's frames hold a 1,500-byte MTU's worth by default.
    cfg.port_mtu = Mtu::M1024;
    let poll = if inline {
        PollMode::Inline
    } else {
        PollMode::Adaptive {
            spins: 0,
            // No periodic wake-up at all: only the device's descriptor and the doorbell wake it.
            max_sleep: Duration::from_secs(3600),
        }
    };
    Nic::start(cfg, dev, NicOptions { poll, batch: 64 }).unwrap()
}

/// A UD QP (Q_Key 0x1111), its PD and CQ, and a region.
fn ud_end(n: &Nic) -> (QpNumber, Pd, Cq, MemoryRegion) {
    let (qp, pd, cq) = common::nic_ud_qp(n);
    let mr = n.reg_mr(pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    (qp, pd, cq, mr)
}

fn wait_wc(n: &Nic, cq: Cq, what: &str) -> WorkCompletion {
    let mut out = Vec::new();
    let t0 = Instant::now();
    while out.is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{what}: no completion"
        );
        n.wait_cq(cq, Duration::from_millis(10)).unwrap();
        n.poll_cq(cq, &mut out, 1).unwrap();
    }
    out[0]
}

#[test]
fn a_datagram_sent_right_after_attach_mcast_is_received() {
    attach_then_send(1, false);
}

/// The same with B's engine inline (the C library's default): the application's waits drive
/// it, its background thread sleeps on the device's descriptor as of the last join.
#[test]
fn a_datagram_sent_right_after_attach_mcast_is_received_inline() {
    attach_then_send(3, true);
}

fn attach_then_send(net: u8, inline: bool) {
    let (ia, ib) = (
        Ipv4Addr::new(127, 78, net, 2),
        Ipv4Addr::new(127, 78, net, 1),
    );
    let (a, b) = (nic(ia, false), nic(ib, inline));
    let (qa, pda, cqa, mra) = ud_end(&a);
    let (qb, _, cqb, mrb) = ud_end(&b);
    mra.write(0, b"to the group").unwrap();
    let pid = std::process::id();
    for k in 0..200u8 {
        // A group of this process and round: nothing else on the host sends to it.
        let group = Ipv4Addr::new(239, 78 + net, (pid >> 8) as u8, (pid as u8).wrapping_add(k));
        let o = group.octets();
        let ah = a
            .create_ah(
                pda,
                &AddressVector {
                    dgid: ferroce::wire::mad::Gid::from_ip(IpAddr::V4(group)).0,
                    sgid_index: 0,
                    hop_limit: 1,
                    traffic_class: 0,
                    flow_label: 0,
                    dmac: Some([0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]),
                },
            )
            .unwrap();
        b.post_recv(
            qb,
            RecvWr {
                wr_id: u64::from(k),
                sg_list: common::sge(&mrb, 0, 40 + 64).into(),
            },
        )
        .unwrap();
        b.attach_mcast(qb, IpAddr::V4(group)).unwrap();
        // At once: no wait for B's engine.
        let wr = SendWr::new(u64::from(k), SendOp::Send, vec![common::sge(&mra, 0, 12)])
            .with_flags(SendFlags::SIGNALED)
            .with_ud(UdDest {
                ah,
                remote_qpn: QpNumber::new(0xff_ffff),
                remote_qkey: 0x1111,
            });
        a.post_send(qa, wr).unwrap();
        assert_eq!(wait_wc(&a, cqa, "A's send").status, WcStatus::Success);
        let wc = wait_wc(&b, cqb, &format!("round {k}: B's receive from {group}"));
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len, wc.src_qp),
            (u64::from(k), WcStatus::Success, 40 + 12, qa)
        );
        let mut got = [0u8; 12];
        mrb.read(40, &mut got).unwrap();
        assert_eq!(&got, b"to the group");
        b.detach_mcast(qb, IpAddr::V4(group)).unwrap();
    }
}
