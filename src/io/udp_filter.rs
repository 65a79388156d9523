//! The UDP-socket backend's kernel-side filter: a classic BPF program on the socket
//! (`SO_ATTACH_FILTER`) that drops, before the kernel queues them, the datagrams the device
//! would drop anyway on its first checks — too short for a BTH and an ICRC, a transport
//! version other than 0, a P_Key outside the device's table, a destination QPN the device does
//! not have, or (for a connected QP) a source address other than the QP's peer. A dropped
//! datagram costs the kernel's receive and the filter; it never reaches the socket's queue, the
//! `recvmmsg` copy or the engine (docs/security.md: on this backend each hostile datagram cost
//! the engine thread 2–3 µs).
//!
//! **The filter accepts a superset of what the engine accepts**: every check it makes is one
//! the engine makes first too (`Device::handle_frame`, in the same order of silent drops), so
//! the peer sees the same thing with or without it (IBTA drops each of these silently). What
//! the engine checks after these (opcode sequence, PSN window, ICRC, R_Key, Q_Key…) stays with
//! the engine. Off by default (`UdpConfig::filter`, `FERROCE_UDP_FILTER=1`: the GSO caveat
//! below). The runtime re-programs the socket whenever the device's QPs or their peers
//! change ([`crate::runtime::Nic`]), before the verb that changed them returns.
//!
//! The program sees the datagram from the UDP header on (offset 0), the BTH at 8, and the IP
//! header through the kernel's network-header offset ([`cbpf::NET_OFF`]). With UDP GRO (or a
//! GSO datagram arriving whole, as on loopback) the kernel runs the filter once per coalesced
//! datagram, on its first segment: the segments share the 5-tuple, so a source check holds
//! for all of them, but one whose first segment names an unknown QPN is dropped whole. A
//! ferroce sender batches frames for several QPs into one GSO datagram, so at teardown the
//! frames of live QPs behind one for a QP just destroyed are lost, and a peer that has exited
//! does not retransmit them: the reason the filter is opt-in. A QP table larger than
//! [`EXACT_MAX`] is filtered by QPN range instead of one rule per QP.

use super::cbpf::{self, Insn};
use std::io;
use std::net::IpAddr;
use std::os::fd::AsFd;

/// Most QPs filtered one rule each; beyond, by QPN range ([`Scope::Range`]).
pub const EXACT_MAX: usize = 256;

/// Who may reach one QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpRule {
    /// The QP's number.
    pub qpn: u32,
    /// `Some`: only datagrams from this address (a connected QP's peer); `None`: any source
    /// (UD).
    pub source: Option<IpAddr>,
}

/// The QPs the filter lets through (besides QP1 and the multicast QPN, always).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// These QPs, each with its rule.
    Exact(Vec<QpRule>),
    /// Any QPN in `lo..=hi`, from any source.
    Range {
        /// The lowest QPN let through.
        lo: u32,
        /// The highest.
        hi: u32,
    },
}

/// A UDP device's sockets (one per address it serves), held to re-program their filter from
/// any thread (the kernel replaces a socket's filter atomically: each datagram meets the old
/// program or the new).
#[derive(Debug)]
pub struct SocketFilter {
    /// Each socket with whether it is IPv6.
    socks: Vec<(std::net::UdpSocket, bool)>,
    last: Option<Scope>,
}

impl SocketFilter {
    pub(crate) fn new(sock: std::net::UdpSocket, v6: bool) -> SocketFilter {
        SocketFilter {
            socks: vec![(sock, v6)],
            last: None,
        }
    }

    /// One filter over the sockets of all of `parts` (a device of several sockets).
    pub(crate) fn joined(parts: Vec<SocketFilter>) -> SocketFilter {
        SocketFilter {
            socks: parts.into_iter().flat_map(|p| p.socks).collect(),
            last: None,
        }
    }

    /// Let through what `scope` names (nothing is done when it is the scope already set), on
    /// every socket, each with the program of its family. A socket that refuses it leaves
    /// the others as they are now and the error is returned (the caller clears them all).
    pub fn set(&mut self, scope: Scope) -> io::Result<()> {
        if self.last.as_ref() == Some(&scope) {
            return Ok(());
        }
        self.last = None;
        for (sock, v6) in &self.socks {
            let prog = program(&scope, *v6);
            super::sys::sockutil::attach_filter(sock.as_fd(), &prog)?;
        }
        self.last = Some(scope);
        Ok(())
    }

    /// Take the program off every socket (`SO_DETACH_FILTER`): every datagram to the port is
    /// queued again. (A socket with no program answers `ENOENT`: nothing to take off.)
    pub fn clear(&mut self) -> io::Result<()> {
        let mut failed = None;
        for (sock, _) in &self.socks {
            let r = super::sys::sockutil::set_int(
                sock.as_fd(),
                libc::SOL_SOCKET,
                libc::SO_DETACH_FILTER,
                0,
            );
            if let Err(e) = r {
                if e.raw_os_error() != Some(libc::ENOENT) {
                    failed = failed.or(Some(e));
                }
            }
        }
        self.last = None;
        failed.map_or(Ok(()), Err)
    }
}

const UDP: u32 = 8;
/// The shortest RoCE packet the engine parses: a BTH and an ICRC.
const MIN_PAYLOAD: u32 = 12 + 4;
const GSI_QPN: u32 = 1;
const MULTICAST_QPN: u32 = 0xff_ffff;

/// The program for `scope` on a socket of the given family (`v6`: the IP header is IPv6).
/// Rules whose source is of the other family are left out (the engine drops their datagrams:
/// an address of the other family never equals the source). Never fails: a scope that would
/// not assemble (it cannot, within [`EXACT_MAX`] rules) gives a program that accepts
/// everything, as no filter.
pub fn program(scope: &Scope, v6: bool) -> Vec<Insn> {
    build(scope, v6).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "UDP socket filter not built: every datagram reaches the engine");
        vec![Insn {
            code: cbpf::RET | cbpf::K,
            jt: 0,
            jf: 0,
            k: cbpf::ACCEPT,
        }]
    })
}

fn build(scope: &Scope, v6: bool) -> Result<Vec<Insn>, cbpf::AsmError> {
    use cbpf::*;
    use Target::{Label as L, Next as N, Skip as S};
    let mut a = Asm::new();
    a.op(LD | W | LEN, 0);
    a.jmp(JGE, UDP + MIN_PAYLOAD, N, L("drop"));
    a.op(LD | B | ABS, UDP + 1); // SE, M, pad count, TVer
    a.jmp(JSET, 0x0f, L("drop"), N);
    a.op(LD | H | ABS, UDP + 2); // P_Key: the table's one entry, 0xFFFF, either membership
    a.op(ALU | AND | K, 0x7fff);
    a.jmp(JEQ, 0x7fff, N, L("drop"));
    a.op(LD | W | ABS, UDP + 4); // reserved byte and DestQP
    a.op(ALU | AND | K, 0x00ff_ffff);
    a.jmp(JEQ, MULTICAST_QPN, L("accept"), N);
    a.jmp(JEQ, GSI_QPN, L("accept"), L("qps"));
    a.label("accept");
    a.op(RET | K, ACCEPT);
    a.label("drop");
    a.op(RET | K, 0);
    a.label("qps");
    match scope {
        Scope::Range { lo, hi } => {
            a.jmp(JGE, *lo, N, S(2));
            a.jmp(JGT, *hi, S(1), N);
            a.op(RET | K, ACCEPT);
            a.op(RET | K, 0);
        }
        Scope::Exact(rules) => {
            // A holds the DestQP through the chain: a block that loads anything returns.
            for r in rules {
                let words: Vec<u32> = match r.source {
                    None => Vec::new(),
                    Some(IpAddr::V4(ip)) if !v6 => vec![u32::from(ip)],
                    Some(IpAddr::V6(ip)) if v6 => ip
                        .octets()
                        .chunks_exact(4)
                        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                    Some(_) => continue,
                };
                if words.is_empty() {
                    a.jmp(JEQ, r.qpn, N, S(1));
                    a.op(RET | K, ACCEPT);
                    continue;
                }
                // jeq qpn; (ld word; jeq word)×n; ret ACCEPT; ret 0
                let n = words.len() as u8;
                a.jmp(JEQ, r.qpn, N, S(2 * n + 2));
                let src = if v6 { 8 } else { 12 };
                for (i, w) in words.iter().enumerate() {
                    a.op(LD | W | ABS, NET_OFF + src + 4 * i as u32);
                    // To the final `ret 0`: past the remaining pairs and the `ret ACCEPT`.
                    let rest = 2 * (n - 1 - i as u8) + 1;
                    a.jmp(JEQ, *w, N, S(rest));
                }
                a.op(RET | K, ACCEPT);
                a.op(RET | K, 0);
            }
            a.op(RET | K, 0);
        }
    }
    a.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::cbpf::run_at;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// A UDP datagram (header and RoCE payload) to `qpn` with `pkey` and `tver`, and the IP
    /// header it came in (only the source matters).
    fn dgram(qpn: u32, pkey: u16, tver: u8, len: usize) -> Vec<u8> {
        let mut d = vec![0u8; 8 + len];
        d[2..4].copy_from_slice(&4791u16.to_be_bytes());
        if len >= 12 {
            d[8] = 0x0a; // RC RDMA WRITE ONLY
            d[9] = tver & 0xf;
            d[10..12].copy_from_slice(&pkey.to_be_bytes());
            d[13..16].copy_from_slice(&qpn.to_be_bytes()[1..]);
        }
        d
    }
    fn ip4(src: Ipv4Addr) -> Vec<u8> {
        let mut h = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0];
        h.extend_from_slice(&src.octets());
        h.extend_from_slice(&[10, 0, 0, 2]);
        h
    }
    fn ip6(src: Ipv6Addr) -> Vec<u8> {
        let mut h = vec![0x60, 0, 0, 0, 0, 0, 17, 64];
        h.extend_from_slice(&src.octets());
        h.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        h
    }

    const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const OTHER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 9);

    fn rules() -> Scope {
        Scope::Exact(vec![
            QpRule {
                qpn: 0x11,
                source: Some(PEER.into()),
            },
            QpRule {
                qpn: 0x12,
                source: None,
            },
            QpRule {
                qpn: 0x13,
                source: Some(OTHER.into()),
            },
            // Of the other family: left out.
            QpRule {
                qpn: 0x14,
                source: Some(Ipv6Addr::LOCALHOST.into()),
            },
        ])
    }

    #[test]
    fn exact_rules_check_qpn_and_source() {
        let p = program(&rules(), false);
        let ok = |qpn, src| run_at(&p, &dgram(qpn, 0xffff, 0, 40), Some(&ip4(src))) == cbpf::ACCEPT;
        assert!(ok(0x11, PEER));
        assert!(!ok(0x11, OTHER), "a connected QP from another source");
        assert!(ok(0x12, OTHER) && ok(0x12, PEER), "UD: any source");
        assert!(ok(0x13, OTHER) && !ok(0x13, PEER));
        assert!(!ok(0x14, PEER), "a rule of the other family");
        assert!(!ok(0x15, PEER) && !ok(0x10, PEER), "unknown QPNs");
        assert!(
            ok(1, OTHER) && ok(0xff_ffff, OTHER),
            "QP1 and multicast: any source"
        );
        // The reserved byte before DestQP is not part of the QPN.
        let mut d = dgram(0x11, 0xffff, 0, 40);
        d[12] = 0xff;
        assert_eq!(run_at(&p, &d, Some(&ip4(PEER))), cbpf::ACCEPT);
    }

    #[test]
    fn header_checks_and_lengths() {
        let p = program(&rules(), false);
        let ip = ip4(PEER);
        let v = |d: &[u8]| run_at(&p, d, Some(&ip));
        assert_eq!(v(&dgram(0x11, 0xffff, 0, 16)), cbpf::ACCEPT);
        assert_eq!(
            v(&dgram(0x11, 0x7fff, 0, 16)),
            cbpf::ACCEPT,
            "limited member"
        );
        assert_eq!(v(&dgram(0x11, 0x8001, 0, 16)), 0, "another partition");
        assert_eq!(v(&dgram(0x11, 0xffff, 1, 16)), 0, "TVer 1");
        for n in 0..16 {
            assert_eq!(v(&dgram(0x11, 0xffff, 0, n)), 0, "{n} bytes of payload");
        }
        // SE, M and the pad count are not the transport version.
        let mut d = dgram(0x11, 0xffff, 0, 16);
        d[9] = 0xf0;
        assert_eq!(v(&d), cbpf::ACCEPT);
    }

    #[test]
    fn ipv6_sources() {
        let peer: Ipv6Addr = "fd00::1".parse().unwrap();
        let near: Ipv6Addr = "fd00::2".parse().unwrap();
        let far: Ipv6Addr = "fe00::1".parse().unwrap();
        let s = Scope::Exact(vec![
            QpRule {
                qpn: 0x20,
                source: Some(peer.into()),
            },
            QpRule {
                qpn: 0x21,
                source: Some(PEER.into()),
            },
            QpRule {
                qpn: 0x22,
                source: None,
            },
        ]);
        let p = program(&s, true);
        let ok = |qpn, src| run_at(&p, &dgram(qpn, 0xffff, 0, 40), Some(&ip6(src))) == cbpf::ACCEPT;
        assert!(ok(0x20, peer));
        assert!(
            !ok(0x20, near) && !ok(0x20, far),
            "each of the four words is checked"
        );
        for i in 0..16 {
            let mut o = peer.octets();
            o[i] ^= 1;
            assert!(!ok(0x20, Ipv6Addr::from(o)), "byte {i}");
        }
        assert!(!ok(0x21, peer), "an IPv4 rule on an IPv6 socket");
        assert!(ok(0x22, far));
    }

    #[test]
    fn range_and_the_largest_exact_table() {
        let p = program(
            &Scope::Range {
                lo: 0x11,
                hi: 0x400,
            },
            false,
        );
        let ok = |qpn| run_at(&p, &dgram(qpn, 0xffff, 0, 40), Some(&ip4(OTHER))) == cbpf::ACCEPT;
        assert!(ok(0x11) && ok(0x400) && ok(0x200) && ok(1) && ok(0xff_ffff));
        assert!(!ok(0x10) && !ok(0x401) && !ok(0x2));
        // EXACT_MAX rules of the longest kind (IPv6 sources) assemble within the kernel's limit.
        let rules: Vec<QpRule> = (0..EXACT_MAX as u32)
            .map(|i| QpRule {
                qpn: 0x11 + i,
                source: Some(IpAddr::V6(Ipv6Addr::from(
                    0xfd00_u128 << 112 | u128::from(i),
                ))),
            })
            .collect();
        let s = Scope::Exact(rules.clone());
        let b = build(&s, true).expect("assembles");
        assert!(b.len() <= cbpf::MAX_INSNS);
        for r in &rules {
            let Some(IpAddr::V6(src)) = r.source else {
                unreachable!()
            };
            assert_eq!(
                run_at(&b, &dgram(r.qpn, 0xffff, 0, 40), Some(&ip6(src))),
                cbpf::ACCEPT
            );
            assert_eq!(
                run_at(
                    &b,
                    &dgram(r.qpn, 0xffff, 0, 40),
                    Some(&ip6(Ipv6Addr::LOCALHOST))
                ),
                0
            );
        }
    }
}
