//! The shared port's receive paths on hostile input (`ferroce::io::share`, issue 17): two
//! devices sharing 127.0.0.1 and one UDP port, each a slot of its own, fed with UDP datagrams
//! of any payload from the network and with Unix datagrams of any bytes on a slot's socket
//! (what another program of the user may send), and with well-formed batches.
//!
//! Invariants: no panic, nothing waits for ever (every call returns; what was sent is all
//! received within a bounded number of rounds). Every UDP datagram of at least a BTH comes out
//! as exactly one frame, at one of the two devices; one whose destination QPN is in a slot's
//! block (not QP1, not multicast) at that slot's device, whichever socket the kernel picked.
//! A well-formed batch on a slot's socket comes out at that device as exactly its frames, in
//! order, each with the ICRC mark it carried; any other bytes come out as the records before
//! the first malformed one, the rest counted refused (one per datagram), never as more.
//!
//! Shared by `fuzz/fuzz_targets/share_rx.rs` (libFuzzer) and `tests/share_fuzz.rs` (stable: a
//! seeded batch).

use ferroce::io::share::{ShareStats, Shared, Slot};
use ferroce::io::udp::{UdpConfig, UdpDevice};
use ferroce::io::{IcrcCheck, PacketDevice};
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Mutex;
use std::time::Duration;

#[path = "input.rs"]
mod input;
use input::Input;

const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// What one input did (the stable test asserts the batch reaches every path).
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub udp_datagrams: usize,
    pub udp_to_a_block: usize,
    pub batches: usize,
    pub batch_frames: usize,
    pub raw_datagrams: usize,
    pub refused: u64,
    pub forwarded: u64,
}

struct Rig {
    a: Shared<UdpDevice>,
    b: Shared<UdpDevice>,
    na: u8,
    nb: u8,
    a_name: Vec<u8>,
    port: u16,
    udp: UdpSocket,
    unix: UnixDatagram,
}

/// One rig per process (its devices' slots are the process's only ones, so a frame for any
/// other block goes to a slot nobody holds), its inputs one at a time.
static RIG: Mutex<Option<Rig>> = Mutex::new(None);

fn rig() -> Rig {
    let (sa, sb) = (Slot::take().unwrap(), Slot::take().unwrap());
    let (na, nb) = (sa.number(), sb.number());
    let a_name = sa.name();
    let dev = |port| {
        let mut c = UdpConfig::new(LO);
        c.port = port;
        c.reuse_port = true;
        // Plain datagrams only: one frame per datagram.
        c.gro = false;
        c.gso = false;
        UdpDevice::open(&c).unwrap()
    };
    let da = dev(0);
    let port = da.local_addr().port();
    let db = dev(port);
    Rig {
        // CM requests nobody claims are held 100 µs, not half a second (the path is the same).
        a: Shared::new(da, sa, &[LO])
            .unwrap()
            .with_hold(Duration::from_micros(100)),
        b: Shared::new(db, sb, &[LO])
            .unwrap()
            .with_hold(Duration::from_micros(100)),
        na,
        nb,
        a_name,
        port,
        udp: UdpSocket::bind((LO, 0)).unwrap(),
        unix: UnixDatagram::unbound().unwrap(),
    }
}

/// A received frame: which device, its bytes, its ICRC mark.
type Got = (usize, Vec<u8>, IcrcCheck);

/// Receive at both devices until `want` frames came or nothing more comes.
fn drain(r: &mut Rig, want: usize) -> Vec<Got> {
    drain_for(r, want, None)
}

/// [`drain`], or until `want` frames came or `until` passed when given (a CM request for a
/// service nobody claims is held half a second before it is handed up).
fn drain_for(r: &mut Rig, want: usize, until: Option<std::time::Instant>) -> Vec<Got> {
    let mut got = Vec::new();
    let mut idle = 0;
    while idle < 3 || until.is_some_and(|u| got.len() < want && std::time::Instant::now() < u) {
        let before = got.len();
        for (k, d) in [&mut r.a, &mut r.b].into_iter().enumerate() {
            if got.len() < want {
                let _ = d.wait_readable(Some(Duration::from_millis(2)));
            }
            d.recv_batch_checked(64, &mut |fr, c| got.push((k, fr.to_vec(), c)))
                .unwrap();
        }
        idle = if got.len() == before { idle + 1 } else { 0 };
    }
    got
}

/// The records of a batch before the first malformed one, and whether one was.
fn records(d: &[u8]) -> (Vec<(Vec<u8>, IcrcCheck)>, bool) {
    let mut out = Vec::new();
    let mut r = d;
    while !r.is_empty() {
        let len = if r.len() >= 3 {
            usize::from(u16::from_be_bytes([r[0], r[1]]))
        } else {
            0
        };
        if len == 0 || r.len() < 3 + len {
            return (out, true);
        }
        let c = if r[2] == 1 {
            IcrcCheck::Good
        } else {
            IcrcCheck::Unchecked
        };
        out.push((r[3..3 + len].to_vec(), c));
        r = &r[3 + len..];
    }
    (out, false)
}

fn stats_sum(r: &Rig) -> ShareStats {
    let (a, b) = (r.a.share_stats(), r.b.share_stats());
    ShareStats {
        forwarded: a.forwarded + b.forwarded,
        refused: a.refused + b.refused,
        ..a
    }
}

pub fn run(data: &[u8]) -> Stats {
    let mut g = RIG.lock().unwrap_or_else(|e| e.into_inner());
    let r = g.get_or_insert_with(rig);
    one(r, data)
}

fn one(r: &mut Rig, data: &[u8]) -> Stats {
    let mut st = Stats::default();
    let mut inp = Input::new(data);
    let before = stats_sum(r);
    let mut n = 0;
    while !inp.empty() && n < 16 {
        n += 1;
        let op = inp.u8();
        let len = usize::from(inp.u8()) * 4 + usize::from(op >> 4);
        match op % 3 {
            // A UDP datagram to the shared port; the top bits of its QPN pick a block: a's,
            // b's, a slot nobody holds, or as the input says.
            0 => {
                let mut p = inp.bytes(len.max(12));
                p.resize(len.max(12), 0);
                match (op >> 2) % 4 {
                    0 => p[5] = r.na,
                    1 => p[5] = r.nb,
                    2 => p[5] = 0xfe,
                    _ => {}
                }
                let qpn = u32::from_be_bytes([0, p[5], p[6], p[7]]);
                // A REQ or SIDR_REQ to QP1 (UD SEND_ONLY, CM class): held for its claimant.
                let m = 12 + 8;
                let cm_req = p[0] == 0x64
                    && qpn == 1
                    && p.get(m + 1) == Some(&7)
                    && matches!(p.get(m + 16..m + 18), Some([0, 0x10] | [0, 0x17]));
                r.udp.send_to(&p, (LO, r.port)).unwrap();
                let until = cm_req.then(|| std::time::Instant::now() + Duration::from_secs(2));
                let got = drain_for(r, 1, until);
                assert_eq!(got.len(), 1, "datagram {p:02x?}: {} frames", got.len());
                let (k, fr, _) = &got[0];
                assert_eq!(&fr[fr.len() - p.len()..], &p[..], "the datagram's bytes");
                if qpn > 1 && qpn != 0xff_ffff {
                    let block = (qpn >> 16) as u8;
                    if block == r.na {
                        assert_eq!(*k, 0, "QPN {qpn:#x} is a's");
                        st.udp_to_a_block += 1;
                    } else if block == r.nb {
                        assert_eq!(*k, 1, "QPN {qpn:#x} is b's");
                    }
                }
                st.udp_datagrams += 1;
            }
            // A well-formed batch on a's socket.
            1 => {
                let mut batch = Vec::new();
                let mut want = Vec::new();
                for i in 0..(op >> 2) % 5 + 1 {
                    let f = inp.bytes(len % 300 + 1);
                    let c = u8::from(i % 2 == 0);
                    batch.extend_from_slice(&(f.len() as u16).to_be_bytes());
                    batch.push(c);
                    batch.extend_from_slice(&f);
                    want.push((
                        0,
                        f,
                        if c == 1 {
                            IcrcCheck::Good
                        } else {
                            IcrcCheck::Unchecked
                        },
                    ));
                }
                send_unix(r, &batch);
                let got = drain(r, want.len());
                assert_eq!(got, want, "a well-formed batch");
                st.batches += 1;
                st.batch_frames += want.len();
            }
            // Any bytes on a's socket.
            _ => {
                let d = inp.bytes(len);
                let (recs, bad) = records(&d);
                send_unix(r, &d);
                let got = drain(r, recs.len());
                let want: Vec<Got> = recs.into_iter().map(|(f, c)| (0, f, c)).collect();
                assert_eq!(got, want, "the records of {d:02x?}");
                let refused = stats_sum(r).refused;
                assert_eq!(refused - before.refused - st.refused, u64::from(bad));
                st.refused += u64::from(bad);
                st.raw_datagrams += 1;
            }
        }
    }
    st.forwarded = stats_sum(r).forwarded - before.forwarded;
    st
}

fn send_unix(r: &Rig, d: &[u8]) {
    let to = SocketAddr::from_abstract_name(&r.a_name).unwrap();
    let n = r.unix.send_to_addr(d, &to).unwrap();
    assert_eq!(n, d.len());
}
