//! The whole stack over real kernel interfaces: two [`Nic`]s on `tools/testbed` (prefix `ft`:
//! host A in netns `fta`, router R in `ftr`, host B in `ftb`; A = 10.61.1.2 and B = 10.61.2.2
//! on their `eth0`, routed through R), every RC operation between them with byte-exact
//! checks, for every packet backend (AF_XDP, AF_PACKET, kernel UDP socket), also with loss in
//! R, with duplication/reordering from the fault injector, with an in-process capture checked
//! by `ferroce inspect` and `tools/check-captures`, between two different backends, and with
//! garbage injected on the wire during a transfer.
//!
//! The tests (each backend: `af_xdp`, `af_packet`, `udp_socket`):
//! - `every_operation_*`: SEND, SEND with immediate, RDMA WRITE, WRITE with immediate and
//!   RDMA READ of 0, 1, 1023, 1025 bytes, 64 KiB and 1 MiB (path MTU 1024, the link's), and
//!   FETCH_ADD / CMP_SWAP (hits and misses), first one at a time, then 8 in flight; every
//!   destination compared byte for byte (guards around it untouched), every completion
//!   checked on both sides; A's device wrapped in a `PcapTap`, the capture then checked by
//!   `ferroce inspect` (exit 0, every ICRC good) and `tools/check-captures` (tshark and the
//!   independent checker agree). XDP-redirected frames never reach tcpdump on the interface,
//!   hence the in-process tap.
//! - `one_percent_loss_*`: the same, then 700 small operations one at a time and a 40 MB
//!   mixed stream, with R dropping 1 % of UDP 4791 both ways: data intact, atomics executed
//!   exactly once, retransmissions, ACK timeouts and sequence-error NAKs counted.
//! - `duplicates_and_reordering_*`: a `FaultInjector` on both receive sides (2 % duplicated,
//!   2 % held back behind 3 later frames, 0.2 % with a flipped bit): data intact, duplicate
//!   requests and responses counted, corrupted frames dropped.
//! - `af_xdp_interoperates_with_udp_socket`: AF_XDP on A (RoCE input drop on in A only,
//!   `tools/testbed input-drop on a`), a UDP socket on B (`input-drop off b`); every operation
//!   both ways.
//! - `garbage_during_transfer_*`: 200+ MB of 1 MiB WRITEs A → B while R injects runts, frames
//!   with a wrong ICRC, frames for an unknown QP, random-byte datagrams and non-RoCE frames
//!   towards B; the transfer is intact and B's drop counters match what was injected (see
//!   [`Injected`] for which bucket each kind must land in on which backend, and why).
//!
//! **Needs root** (namespaces, BPF, AF_XDP, AF_PACKET). Run as anything else, every test here
//! FAILS with a message saying so; none passes silently. Meant to run in release mode:
//! `sudo cargo test --release --test testbed_rc` (a debug build works but is much slower).
//!
//! # How a test is set up
//!
//! Each host is a thread that first enters its namespace ([`enter_netns`]), then looks up
//! `eth0`, opens the backend there (sockets, XDP programs and packet rings belong to the
//! namespace they are created in) and starts the [`Nic`], whose engine thread is spawned from
//! that thread and so inherits the namespace. The two host threads exchange their QP's
//! [`RemoteQp`] over channels (no TCP), resolve the next hop's MAC in their own namespace
//! (raw backends; the UDP backend lets the kernel do it) and connect. The NICs are then handed
//! to the test's own thread, which drives both through the verbs (they need no namespace).
//!
//! # The testbed's life
//!
//! Tests in this file run in parallel threads by default; they are serialised by a global
//! mutex (`SERIAL`). The testbed is brought up once per test process (`up --force`: a
//! leftover from an interrupted run is replaced), and each test then sets what it needs:
//! RoCE input drop in A/B on or off (raw backends need the kernel to ignore UDP 4791 — no
//! ICMP port unreachable; the UDP backend needs it delivered), loss in R off, neighbours in R
//! resolved. libtest has no end-of-run hook, so the first test to bring the testbed up also
//! starts a small *reaper* shell (its own process group, no stdio) that waits for this test
//! process to exit and then runs `tools/testbed down --prefix ft` — also when the process was
//! killed. A marker file (`/run/ferroce-testbed-ft.owner`, under `flock` on
//! `/run/ferroce-testbed-ft.lock`) names the process that owns the current testbed, so a
//! reaper of an earlier run never tears down the testbed of a later one.
//!
//! No assertion depends on wall-clock time; the only timeouts are hang guards (no progress
//! at all for [`HANG`]) that turn a stuck transfer into a failure with the counters printed.
//! The QPs' local ACK timeout is [`ACK_TIMEOUT`] (a protocol parameter; see there why it is
//! larger than perftest's). Rates are printed (`--nocapture`), never asserted.

mod common;

use common::net::{join, prime_neighbours, spawn_in_ns};

/// What these tests need root for.
const NEEDS: &str =
    "network namespaces, BPF, AF_XDP, AF_PACKET: CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_BPF, CAP_NET_RAW";
use ferroce::io::backend::{self, BackendKind};
use ferroce::io::netdev;
use ferroce::io::{
    AfPacketConfig, AfPacketDevice, FaultConfig, FaultInjector, IoStats, PacketDevice, PcapTap,
};
use ferroce::runtime::{Nic, NicOptions, PollMode};
use ferroce::verbs::*;
use ferroce::verbs::{DeviceCounters, QpCounters};
use ferroce::wire::{
    icrc, BthRepr, Ecn, EthernetRepr, ExtRepr, FrameRepr, IpRepr, Ipv4Repr, MacAddr, Opcode, Psn,
    QpNumber, RethRepr, RoceRepr, Syndrome, UdpRepr, ROCE_V2_PORT,
};
use std::collections::VecDeque;
use std::net::{Ipv4Addr, UdpSocket};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

const PREFIX: &str = "ft";
const NS_A: &str = "fta";
const NS_B: &str = "ftb";
const NS_R: &str = "ftr";
/// Host X: a third host on R's B side, off the A-B path (the hostile-peer tests' attacker).
const NS_X: &str = "ftx";
const A4: Ipv4Addr = Ipv4Addr::new(10, 61, 1, 2);
const B4: Ipv4Addr = Ipv4Addr::new(10, 61, 2, 2);
const RB4: Ipv4Addr = Ipv4Addr::new(10, 61, 2, 1);
const RB_MAC: MacAddr = MacAddr([0x02, 0xfe, 0x61, 0x02, 0x00, 0x01]);
const B_MAC: MacAddr = MacAddr([0x02, 0xfe, 0x61, 0x02, 0x00, 0x02]);
const X4: Ipv4Addr = Ipv4Addr::new(10, 61, 3, 2);
const RX_MAC: MacAddr = MacAddr([0x02, 0xfe, 0x61, 0x03, 0x00, 0x01]);
const X_MAC: MacAddr = MacAddr([0x02, 0xfe, 0x61, 0x03, 0x00, 0x02]);

/// No progress at all for this long fails the test (a hang guard, not a performance limit).
const HANG: Duration = Duration::from_secs(60);

/// The message sizes every operation is run with: empty, one byte, just under and just over
/// one packet at path MTU 1024, 64 KiB, 1 MiB.
const SIZES: [usize; 6] = [0, 1, 1023, 1025, 64 << 10, 1 << 20];

/// Each side's MR: `SLOTS` message slots (a message in flight owns one on each side), then
/// the 8-byte atomic target at `ATOMIC_OFF`.
const SLOTS: usize = 8;
const SLOT: usize = (1 << 20) + 4096;
/// Messages start this far into their slot: unaligned addresses on both sides.
const MISALIGN: usize = 5;
/// Bytes before and after every destination that must stay untouched.
const GUARD: usize = 64;
const SENTINEL: u8 = 0xa5;
const ATOMIC_OFF: usize = SLOTS * SLOT;
const MR_LEN: usize = ATOMIC_OFF + 4096;
/// The largest receive buffer (a slot minus the misalignment and the trailing guard).
const RECV_LEN: usize = SLOT - MISALIGN - GUARD;

const ALL_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

// ---- root, testbed ---------------------------------------------------------------------------

fn script() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/tools/testbed")
}

const LOCK_FILE: &str = "/run/ferroce-testbed-ft.lock";
const OWNER_FILE: &str = "/run/ferroce-testbed-ft.owner";

/// `tools/testbed --prefix ft ARGS...`; the combined output, or an error with it.
fn testbed(args: &[&str]) -> Result<String, String> {
    let out = Command::new(script())
        .arg("--prefix")
        .arg(PREFIX)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("tools/testbed {args:?} failed:\n{text}"))
    }
}

fn must_testbed(args: &[&str]) -> String {
    testbed(args).unwrap_or_else(|e| panic!("{e}"))
}

/// Bring the testbed up (replacing any leftover) as owned by this process, and start the
/// reaper that takes it down when this process is gone.
fn bring_up() -> Result<(), String> {
    let pid = std::process::id().to_string();
    let up = Command::new("sh")
        .arg("-c")
        .arg(
            r#"exec 9>"$FT_LOCK" && flock 9 && echo "$FT_PID" >"$FT_OWNER" &&
exec "$FT_TB" --prefix "$FT_PREFIX" up --force"#,
        )
        .env("FT_LOCK", LOCK_FILE)
        .env("FT_OWNER", OWNER_FILE)
        .env("FT_PID", &pid)
        .env("FT_TB", script())
        .env("FT_PREFIX", PREFIX)
        .output()
        .map_err(|e| format!("running sh: {e}"))?;
    if !up.status.success() {
        return Err(format!(
            "tools/testbed up failed (needs ip, nft, flock: tools/deps.sh net):\n{}{}",
            String::from_utf8_lossy(&up.stdout),
            String::from_utf8_lossy(&up.stderr)
        ));
    }
    Command::new("sh")
        .arg("-c")
        .arg(
            r#"while kill -0 "$FT_PID" 2>/dev/null; do sleep 0.2; done
exec 9>"$FT_LOCK"; flock 9
[ "$(cat "$FT_OWNER" 2>/dev/null)" = "$FT_PID" ] || exit 0
rm -f "$FT_OWNER"
exec "$FT_TB" --prefix "$FT_PREFIX" down"#,
        )
        .env("FT_LOCK", LOCK_FILE)
        .env("FT_OWNER", OWNER_FILE)
        .env("FT_PID", &pid)
        .env("FT_TB", script())
        .env("FT_PREFIX", PREFIX)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("starting the testbed reaper: {e}"))?;
    Ok(())
}

static SERIAL: Mutex<()> = Mutex::new(());
static UP: OnceLock<Result<(), String>> = OnceLock::new();

/// RoCE input drop (nft in the host's input hook) per host.
#[derive(Clone, Copy, Debug)]
struct InputDrop {
    a: bool,
    b: bool,
}

const RAW: InputDrop = InputDrop { a: true, b: true };
const SOCKETS: InputDrop = InputDrop { a: false, b: false };

/// The testbed, configured for one test, held for its duration (serialises the tests).
struct Bed {
    _serial: MutexGuard<'static, ()>,
}

impl Bed {
    /// The testbed for a flow over `kind`: the raw backends' inputs dropped in the kernel
    /// ([`RAW`]), the UDP-socket backend's not ([`SOCKETS`]).
    fn for_backend(kind: BackendKind) -> Bed {
        Bed::take(if kind == BackendKind::Udp {
            SOCKETS
        } else {
            RAW
        })
    }

    fn take(drop: InputDrop) -> Bed {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = UP.get_or_init(bring_up) {
            panic!("{e}");
        }
        if [NS_A, NS_B, NS_R, NS_X]
            .iter()
            .any(|n| !Path::new(&format!("/run/netns/{n}")).exists())
        {
            // Somebody took it down meanwhile: bring it up again (same owner).
            bring_up().unwrap_or_else(|e| panic!("{e}"));
        }
        must_testbed(&["loss", "0"]);
        for (host, on) in [("a", drop.a), ("b", drop.b)] {
            must_testbed(&["input-drop", if on { "on" } else { "off" }, host]);
        }
        // R resolves A and B (and A and B resolve R) before traffic, so that no frame waits
        // for ARP in R.
        prime_neighbours(
            &[(NS_A, B4.into()), (NS_B, A4.into())],
            NS_R,
            &[A4.into(), B4.into()],
            HANG,
        );
        Bed { _serial: serial }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        let _ = testbed(&["loss", "0"]);
    }
}

// ---- hosts -----------------------------------------------------------------------------------

/// What wraps a host's packet device.
enum Wrap {
    Plain,
    /// Record every frame sent and received in a pcap file.
    Pcap(PathBuf),
    /// Impair the receive side.
    Faults(FaultConfig),
}

struct Spec {
    ns: &'static str,
    kind: BackendKind,
    wrap: Wrap,
    /// The QP's first send PSN.
    psn: u32,
    /// `DeviceConfig::fast_recovery`.
    fast_recovery: bool,
    /// `DeviceConfig::selective_repeat`.
    selective_repeat: bool,
}

/// One side of the connection, driven from the test thread.
struct Host {
    nic: Nic,
    cq: Cq,
    qp: QpNumber,
    mr: MemoryRegion,
    kind: BackendKind,
}

impl Host {
    fn qp_counters(&self) -> QpCounters {
        self.nic.qp_counters(self.qp).expect("qp counters")
    }
    fn dev_counters(&self) -> DeviceCounters {
        self.nic.counters().0
    }
    fn io(&self) -> IoStats {
        self.nic.counters().2
    }
}

struct Pair {
    a: Host,
    b: Host,
}

impl Pair {
    fn describe(&self) -> String {
        format!("A {} / B {}", self.a.nic.describe(), self.b.nic.describe())
    }

    fn dump(&self) -> String {
        let (da, qa, ia) = self.a.nic.counters();
        let (db, qb, ib) = self.b.nic.counters();
        format!(
            "{}\nA device {da:?}\nA qp {qa:?}\nA io {ia:?} io_errors {}\n\
             B device {db:?}\nB qp {qb:?}\nB io {ib:?} io_errors {}\n\
             kernel UDP counters: A {}; B {}; R {}",
            self.describe(),
            self.a.nic.io_errors(),
            self.b.nic.io_errors(),
            kernel_udp_counters(NS_A),
            kernel_udp_counters(NS_B),
            kernel_udp_counters(NS_R),
        )
    }
}

/// The kernel's UDP counters in `ns` (`/proc/net/snmp`'s "Udp:" lines: InDatagrams,
/// NoPorts, InErrors, RcvbufErrors, ...), for failure messages: a datagram the kernel dropped
/// on its way to a UDP-socket backend shows here, not in ferroce's counters.
fn kernel_udp_counters(ns: &'static str) -> String {
    common::net::in_ns(ns, || {
        let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").unwrap_or_default();
        let mut udp = snmp.lines().filter(|l| l.starts_with("Udp: "));
        match (udp.next(), udp.next()) {
            (Some(names), Some(values)) => names
                .split_whitespace()
                .zip(values.split_whitespace())
                .skip(1)
                .filter(|(_, v)| *v != "0")
                .map(|(n, v)| format!("{n}={v}"))
                .collect::<Vec<_>>()
                .join(" "),
            _ => "unavailable".into(),
        }
    })
}

fn options() -> NicOptions {
    NicOptions {
        poll: PollMode::Adaptive {
            spins: 2000,
            max_sleep: Duration::from_millis(1),
        },
        batch: 64,
    }
}

/// The host thread's work: open the backend in `spec.ns`, start the NIC, exchange QP
/// information over the channels, connect.
fn host(
    spec: Spec,
    to_peer: mpsc::Sender<RemoteQp>,
    from_peer: mpsc::Receiver<RemoteQp>,
) -> Result<Host, String> {
    let dev = netdev::netdev("eth0").map_err(|e| format!("{}: eth0: {e}", spec.ns))?;
    assert_eq!(
        dev.mac,
        if spec.ns == NS_A {
            MacAddr([0x02, 0xfe, 0x61, 0x01, 0x00, 0x02])
        } else {
            B_MAC
        },
        "{}: netdev() must describe the namespace's own eth0",
        spec.ns
    );
    let gid_index = ferroce::apps::tool::pick_gid(&dev, None).map_err(|e| e.to_string())?;
    let local = dev.gids[usize::from(gid_index)];
    let mtu = netdev::ib_mtu_for(dev.mtu.unwrap_or(1500));
    if dev.mtu != Some(1500) || mtu != Mtu::M1024 {
        return Err(format!(
            "{}: eth0 MTU {:?} (path MTU {}), the testbed's veths have 1500 (path MTU 1024)",
            spec.ns,
            dev.mtu,
            mtu.bytes()
        ));
    }
    let pkt = backend::open(spec.kind, &dev, local)
        .map_err(|e| format!("{}: {} backend: {e}", spec.ns, spec.kind.name()))?;
    let mut cfg = DeviceConfig::new(dev.mac, local);
    cfg.gids = dev.gids.clone();
    cfg.fast_recovery = spec.fast_recovery;
    cfg.selective_repeat = spec.selective_repeat;
    let nic = match spec.wrap {
        Wrap::Plain => Nic::start(cfg, pkt, options()),
        Wrap::Pcap(path) => {
            let f = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let tap = PcapTap::new(pkt, std::io::BufWriter::new(f)).map_err(|e| e.to_string())?;
            Nic::start(cfg, tap, options())
        }
        Wrap::Faults(c) => Nic::start(cfg, FaultInjector::new(pkt, c), options()),
    }
    .map_err(|e| format!("{}: starting the NIC: {e}", spec.ns))?;
    let pd = nic.alloc_pd().unwrap();
    let cq = nic.create_cq(4096).map_err(|e| e.to_string())?;
    let cap = common::qp_cap(64, 4, 64);
    let qp = ferroce::runtime::create_rc_qp(&nic, pd, cq, cap).map_err(|e| e.to_string())?;
    let mr = nic
        .reg_mr(pd, MR_LEN, ALL_ACCESS)
        .map_err(|e| e.to_string())?;
    let me = nic
        .local_end(qp, usize::from(gid_index), spec.psn)
        .ok_or("local_end")?;
    to_peer.send(me).map_err(|_| "peer thread gone")?;
    let peer = from_peer
        .recv_timeout(HANG)
        .map_err(|_| format!("{}: no QP information from the peer", spec.ns))?;
    let peer_ip = ip_of_gid(peer.gid);
    let mac = if spec.kind == BackendKind::Udp {
        MacAddr::ZERO // the kernel resolves the next hop and writes the Ethernet header
    } else {
        netdev::resolve(peer_ip, Some("eth0"), Duration::from_secs(5)).ok_or_else(|| {
            format!(
                "{}: cannot resolve the next hop towards {peer_ip} (ARP through R)",
                spec.ns
            )
        })?
    };
    nic.connect_rc(
        qp,
        &RemoteQp { mac, ..peer },
        &RcParams {
            mtu,
            sgid_index: gid_index,
            local_psn: spec.psn,
            timeout: ACK_TIMEOUT,
            ..RcParams::default()
        },
    )
    .map_err(|e| format!("{}: connect_rc: {e}", spec.ns))?;
    Ok(Host {
        nic,
        cq,
        qp,
        mr,
        kind: spec.kind,
    })
}

/// Two hosts, each created in its own namespace thread, connected to each other.
fn connect(a: Spec, b: Spec) -> Pair {
    let (a_tx, b_rx) = mpsc::channel();
    let (b_tx, a_rx) = mpsc::channel();
    let ha = spawn_in_ns(a.ns, move || host(a, a_tx, a_rx));
    let hb = spawn_in_ns(b.ns, move || host(b, b_tx, b_rx));
    let (ra, rb) = (join(ha), join(hb));
    match (ra, rb) {
        (Ok(a), Ok(b)) => Pair { a, b },
        (ra, rb) => panic!(
            "setting up the hosts failed: A: {:?}; B: {:?}",
            ra.err(),
            rb.err()
        ),
    }
}

fn plain(ns: &'static str, kind: BackendKind, psn: u32) -> Spec {
    Spec {
        ns,
        kind,
        wrap: Wrap::Plain,
        psn,
        fast_recovery: false,
        selective_repeat: false,
    }
}

/// The local ACK timeout: 4.096 µs × 2^16 ≈ 268 ms, so 7 retries give up after about 2 s
/// without progress. perftest's 14 (67 ms, about 0.5 s in all) is too little on a loaded
/// 2-core CI machine, where an engine thread was seen not to run for 200 ms: with 1 % loss
/// that alone ended a QP in RETRY_EXC_ERR now and then.
const ACK_TIMEOUT: u8 = 16;

/// A's first PSN is close to 2^24: the PSN wraps during every test.
const PSN_A: u32 = 0xff_fff0;
const PSN_B: u32 = 0x12_3456;

// ---- data ------------------------------------------------------------------------------------

/// A pattern that differs per `seed` (xorshift64*, 8 bytes per step).
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        v.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    v.truncate(len);
    v
}

fn slot_off(slot: usize) -> usize {
    slot * SLOT + MISALIGN
}

/// Scatter/gather entries for `len` bytes at `off` of `mr`: none for an empty message, two
/// (split at an odd point) for longer ones, so that gathering and scattering cross SGEs.
fn sgl(mr: &MemoryRegion, off: usize, len: usize) -> Vec<Sge> {
    let sge = |o: usize, l: usize| Sge {
        addr: mr.addr() + o as u64,
        length: l as u32,
        lkey: mr.lkey(),
    };
    match len {
        0 => vec![],
        1 => vec![sge(off, 1)],
        _ => {
            let cut = (len / 3) | 1;
            vec![sge(off, cut), sge(off + cut, len - cut)]
        }
    }
}

/// Fill the guards around `[off, off + len)`: `MISALIGN` bytes before (to the slot start)
/// and `GUARD` after.
fn set_guards(mr: &MemoryRegion, off: usize, len: usize) {
    mr.write(off - MISALIGN, &[SENTINEL; MISALIGN]).unwrap();
    mr.write(off + len, &[SENTINEL; GUARD]).unwrap();
}

/// `[off, off + len)` holds `want` and the guards are untouched.
fn check_bytes(mr: &MemoryRegion, off: usize, want: &[u8], what: &str) {
    let len = want.len();
    mr.with_bytes(|b| {
        let got = &b[off..off + len];
        if got != want {
            let i = got.iter().zip(want).position(|(x, y)| x != y).unwrap_or(0);
            panic!(
                "{what}: {len}-byte message differs from byte {i} on (got {:02x?}, want {:02x?})",
                &got[i..(i + 16).min(len)],
                &want[i..(i + 16).min(len)]
            );
        }
        assert!(
            b[off - MISALIGN..off].iter().all(|&x| x == SENTINEL),
            "{what}: bytes before the destination were written"
        );
        assert!(
            b[off + len..off + len + GUARD]
                .iter()
                .all(|&x| x == SENTINEL),
            "{what}: bytes after the {len}-byte destination were written"
        );
    });
}

// ---- the operation stream --------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    FetchAdd,
    CmpSwap,
}

const DATA_OPS: [Op; 5] = [Op::Send, Op::SendImm, Op::Write, Op::WriteImm, Op::Read];

/// A message in flight.
struct Msg {
    id: u64,
    op: Op,
    len: usize,
    slot: usize,
    data: Vec<u8>,
    imm: u32,
    /// The value an atomic must return.
    orig: u64,
    a_done: bool,
    b_needed: bool,
    b_done: bool,
}

/// What a stream did.
#[derive(Debug, Default, Clone, Copy)]
struct StreamStats {
    messages: u64,
    bytes: u64,
    secs: f64,
}

/// Run messages A → B with at most `window` in flight (1: one at a time), each checked byte
/// for byte at its destination (and the guards around it), each completion checked (status,
/// opcode, byte_len, immediate data, QP numbers) in order, on both sides. `next(i)` gives
/// message `i`, `None` ends the stream. Atomics run against one 8-byte target on B, whose
/// value the test models: every returned value and the final value must match (exactly-once
/// execution, also when requests are retransmitted or duplicated).
fn run_stream(
    p: &Pair,
    window: usize,
    seed: u64,
    next: &mut dyn FnMut(u64) -> Option<(Op, usize)>,
) -> StreamStats {
    assert!((1..=SLOTS).contains(&window));
    let (a, b) = (&p.a, &p.b);
    let mut model: u64 = 0x0123_4567_89ab_cdef ^ seed;
    b.mr.write(ATOMIC_OFF, &model.to_ne_bytes()).unwrap();
    let mut inflight: VecDeque<Msg> = VecDeque::new();
    let mut b_queue: VecDeque<u64> = VecDeque::new();
    let mut wcs = Vec::new();
    let mut stats = StreamStats::default();
    let mut i = 0u64;
    let mut ended = false;
    let mut cmpswaps = 0u64;
    let t0 = Instant::now();
    let mut last_progress = Instant::now();
    loop {
        // Post while the window allows.
        while !ended && inflight.len() < window {
            let Some((op, len)) = next(i) else {
                ended = true;
                break;
            };
            let id = (seed << 32) | i;
            let slot = (i as usize) % SLOTS;
            let off = slot_off(slot);
            let imm = (id as u32) ^ 0x5a5a_0000;
            let mut m = Msg {
                id,
                op,
                len,
                slot,
                data: Vec::new(),
                imm,
                orig: 0,
                a_done: false,
                b_needed: matches!(op, Op::Send | Op::SendImm | Op::WriteImm),
                b_done: false,
            };
            let remote = |o: usize| b.mr.addr() + o as u64;
            let wr_op = match op {
                Op::Send | Op::SendImm | Op::Write | Op::WriteImm => {
                    assert!(len <= RECV_LEN);
                    m.data = pattern(len, id);
                    a.mr.write(off, &m.data).unwrap();
                    set_guards(&b.mr, off, len);
                    match op {
                        Op::Send | Op::SendImm => {
                            // The receive buffer is bigger than the message (two SGEs).
                            b.nic
                                .post_recv(
                                    b.qp,
                                    RecvWr {
                                        wr_id: id,
                                        sg_list: sgl(&b.mr, off, RECV_LEN).into(),
                                    },
                                )
                                .unwrap_or_else(|e| panic!("post_recv: {e}"));
                        }
                        Op::WriteImm => {
                            b.nic
                                .post_recv(
                                    b.qp,
                                    RecvWr {
                                        wr_id: id,
                                        sg_list: vec![].into(),
                                    },
                                )
                                .unwrap_or_else(|e| panic!("post_recv: {e}"));
                        }
                        _ => {}
                    }
                    match op {
                        Op::Send => SendOp::Send,
                        Op::SendImm => SendOp::SendWithImm { imm },
                        Op::Write => SendOp::RdmaWrite {
                            remote_addr: remote(off),
                            rkey: b.mr.rkey(),
                        },
                        _ => SendOp::RdmaWriteWithImm {
                            remote_addr: remote(off),
                            rkey: b.mr.rkey(),
                            imm,
                        },
                    }
                }
                Op::Read => {
                    m.data = pattern(len, id);
                    b.mr.write(off, &m.data).unwrap();
                    set_guards(&a.mr, off, len);
                    SendOp::RdmaRead {
                        remote_addr: remote(off),
                        rkey: b.mr.rkey(),
                    }
                }
                Op::FetchAdd => {
                    let add = u64::from_le_bytes(pattern(8, id).try_into().unwrap());
                    m.orig = model;
                    model = model.wrapping_add(add);
                    set_guards(&a.mr, off, 8);
                    SendOp::AtomicFetchAdd {
                        remote_addr: remote(ATOMIC_OFF),
                        rkey: b.mr.rkey(),
                        add,
                    }
                }
                Op::CmpSwap => {
                    let swap = u64::from_le_bytes(pattern(8, id).try_into().unwrap());
                    // Every other compare fails (and must leave the target alone).
                    let hit = cmpswaps % 2 == 0;
                    cmpswaps += 1;
                    let compare = if hit {
                        model
                    } else {
                        model ^ 0x8000_0000_0000_0001
                    };
                    m.orig = model;
                    if hit {
                        model = swap;
                    }
                    set_guards(&a.mr, off, 8);
                    SendOp::AtomicCmpSwp {
                        remote_addr: remote(ATOMIC_OFF),
                        rkey: b.mr.rkey(),
                        compare,
                        swap,
                    }
                }
            };
            let local = match op {
                Op::FetchAdd | Op::CmpSwap => vec![Sge {
                    addr: a.mr.addr() + off as u64,
                    length: 8,
                    lkey: a.mr.lkey(),
                }],
                _ => sgl(&a.mr, off, len),
            };
            a.nic
                .post_send(a.qp, SendWr::new(id, wr_op, local))
                .unwrap_or_else(|e| panic!("post_send {op:?} {len}: {e}"));
            if m.b_needed {
                b_queue.push_back(id);
            }
            inflight.push_back(m);
            i += 1;
        }
        if ended && inflight.is_empty() {
            break;
        }
        // Completions.
        a.nic.wait_cq(a.cq, Duration::from_millis(2)).unwrap();
        let mut progress = false;
        wcs.clear();
        a.nic.poll_cq(a.cq, &mut wcs, 64).unwrap();
        for wc in wcs.drain(..) {
            progress = true;
            let m = inflight
                .iter_mut()
                .find(|m| !m.a_done)
                .unwrap_or_else(|| panic!("A: completion with nothing outstanding: {wc:?}"));
            let what = format!("A: {:?} of {} bytes (message {:#x})", m.op, m.len, m.id);
            assert_eq!(wc.wr_id, m.id, "{what}: completions out of order: {wc:?}");
            assert_eq!(wc.status, WcStatus::Success, "{what}: {wc:?}\n{}", p.dump());
            let (opcode, byte_len) = match m.op {
                Op::Send | Op::SendImm => (WcOpcode::Send, m.len),
                Op::Write | Op::WriteImm => (WcOpcode::RdmaWrite, m.len),
                Op::Read => (WcOpcode::RdmaRead, m.len),
                Op::FetchAdd => (WcOpcode::FetchAdd, 8),
                Op::CmpSwap => (WcOpcode::CompSwap, 8),
            };
            assert_eq!(
                (wc.opcode, wc.byte_len as usize, wc.qp_num, wc.imm_data),
                (opcode, byte_len, a.qp, None),
                "{what}: {wc:?}"
            );
            let off = slot_off(m.slot);
            match m.op {
                Op::Write | Op::WriteImm => check_bytes(&b.mr, off, &m.data, &what),
                Op::Read => check_bytes(&a.mr, off, &m.data, &what),
                Op::FetchAdd | Op::CmpSwap => {
                    check_bytes(&a.mr, off, &m.orig.to_ne_bytes(), &what);
                }
                Op::Send | Op::SendImm => {}
            }
            m.a_done = true;
        }
        wcs.clear();
        b.nic.poll_cq(b.cq, &mut wcs, 64).unwrap();
        for wc in wcs.drain(..) {
            progress = true;
            let id = b_queue
                .pop_front()
                .unwrap_or_else(|| panic!("B: unexpected completion {wc:?}\n{}", p.dump()));
            let m = inflight
                .iter_mut()
                .find(|m| m.id == id)
                .expect("message of a B completion");
            let what = format!("B: {:?} of {} bytes (message {:#x})", m.op, m.len, m.id);
            assert_eq!(wc.wr_id, id, "{what}: completions out of order: {wc:?}");
            assert_eq!(wc.status, WcStatus::Success, "{what}: {wc:?}\n{}", p.dump());
            let (opcode, imm) = match m.op {
                Op::Send => (WcOpcode::Recv, None),
                Op::SendImm => (WcOpcode::Recv, Some(m.imm)),
                _ => (WcOpcode::RecvRdmaWithImm, Some(m.imm)),
            };
            assert_eq!(
                (
                    wc.opcode,
                    wc.byte_len as usize,
                    wc.imm_data,
                    wc.wc_flags.contains(WcFlags::WITH_IMM),
                    wc.qp_num,
                    wc.src_qp
                ),
                (opcode, m.len, imm, imm.is_some(), b.qp, a.qp),
                "{what}: {wc:?}"
            );
            check_bytes(&b.mr, slot_off(m.slot), &m.data, &what);
            m.b_done = true;
        }
        while inflight
            .front()
            .is_some_and(|m| m.a_done && (!m.b_needed || m.b_done))
        {
            let m = inflight.pop_front().unwrap();
            stats.messages += 1;
            stats.bytes += m.len as u64;
        }
        if progress {
            last_progress = Instant::now();
        } else {
            assert!(
                last_progress.elapsed() < HANG,
                "no completion for {HANG:?}; outstanding {:?}\n{}",
                inflight
                    .iter()
                    .map(|m| (m.op, m.len, m.a_done, m.b_done))
                    .collect::<Vec<_>>(),
                p.dump()
            );
        }
    }
    let mut v = [0u8; 8];
    b.mr.read(ATOMIC_OFF, &mut v).unwrap();
    assert_eq!(
        u64::from_ne_bytes(v),
        model,
        "the atomic target after the stream (every atomic executed exactly once)"
    );
    stats.secs = t0.elapsed().as_secs_f64();
    stats
}

/// Every data operation at every size, then both atomics a few times.
fn each_operation() -> Vec<(Op, usize)> {
    let mut v = Vec::new();
    for &len in &SIZES {
        for op in DATA_OPS {
            v.push((op, len));
        }
    }
    for _ in 0..4 {
        v.push((Op::FetchAdd, 8));
        v.push((Op::CmpSwap, 8));
    }
    v
}

fn list(v: &[(Op, usize)]) -> impl FnMut(u64) -> Option<(Op, usize)> + '_ {
    move |i| v.get(i as usize).copied()
}

/// A mixed stream of every operation over assorted sizes until `bytes` were moved.
fn mixed(bytes: u64) -> impl FnMut(u64) -> Option<(Op, usize)> {
    const LENS: [usize; 8] = [1, 1023, 1025, 4097, 65536, 262_147, 1 << 20, 7];
    const OPS: [Op; 7] = [
        Op::Write,
        Op::Send,
        Op::Read,
        Op::WriteImm,
        Op::FetchAdd,
        Op::SendImm,
        Op::CmpSwap,
    ];
    let mut total = 0u64;
    move |i| {
        if total >= bytes {
            return None;
        }
        let op = OPS[(i as usize) % OPS.len()];
        let len = match op {
            Op::FetchAdd | Op::CmpSwap => 8,
            _ => LENS[(i as usize / OPS.len() + i as usize) % LENS.len()],
        };
        total += len as u64;
        Some((op, len))
    }
}

/// Every operation one at a time, then pipelined 8 deep; returns the stats of both.
fn all_operations(p: &Pair, seed: u64) -> (StreamStats, StreamStats) {
    let ops = each_operation();
    let one = run_stream(p, 1, seed, &mut list(&ops));
    let piped = run_stream(p, SLOTS, seed + 1, &mut list(&ops));
    assert_eq!(one.messages, ops.len() as u64);
    assert_eq!(piped.messages, ops.len() as u64);
    (one, piped)
}

fn report(label: &str, p: &Pair, s: &[(&str, StreamStats)]) {
    for (what, st) in s {
        println!(
            "{label}: {what}: {} messages, {:.1} MB in {:.2} s ({:.0} Mbit/s)",
            st.messages,
            st.bytes as f64 / 1e6,
            st.secs,
            st.bytes as f64 * 8.0 / st.secs.max(1e-9) / 1e6
        );
    }
    println!("{label}: {}", p.dump());
}

/// The device drop counters of a host are all zero (a clean run).
/// The frames the device's drop counters (malformed, ICRC, unknown QP, header, address)
/// counted since `before`.
fn device_drops_since(d: &DeviceCounters, before: &DeviceCounters) -> u64 {
    (d.malformed_drops - before.malformed_drops)
        + (d.icrc_drops - before.icrc_drops)
        + (d.unknown_qp_drops - before.unknown_qp_drops)
        + (d.header_drops - before.header_drops)
        + (d.address_drops - before.address_drops)
}

/// When B's backend dropped frames before its engine saw them (which ones is unknown): of the
/// `injected` frames, those in no counter (`injected - counted`) are no more than it dropped.
fn assert_missing_within_ring_drops(
    injected: u64,
    counted: u64,
    ring_drops: u64,
    detail: impl Fn() -> String,
) {
    assert!(
        injected - counted <= ring_drops,
        "{} injected frames in no counter, but B's backend dropped only {ring_drops}\n{}",
        injected - counted,
        detail()
    );
}

fn assert_no_drops(h: &Host, who: &str) {
    let d = h.dev_counters();
    assert_eq!(
        (
            d.icrc_drops,
            d.malformed_drops,
            d.not_roce,
            d.unknown_qp_drops,
            d.address_drops,
            d.header_drops,
            d.cq_overruns
        ),
        (0, 0, 0, 0, 0, 0, 0),
        "{who} ({:?}) dropped frames on a clean network: {d:?}",
        h.kind
    );
}

// ---- 1 + 4: every operation, per backend, with a capture of A's device -----------------------

fn capture_path(kind: BackendKind) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("testbed_rc-{}.pcap", kind.name()))
}

/// `ferroce inspect` and `tools/check-captures` on a capture.
/// Check a capture with `ferroce inspect` (every RoCE packet well formed, ICRC good, none cut
/// short) and tshark (`tools/check-captures`); returns the number of RoCE packets.
fn check_capture(path: &Path, min_packets: u64) -> u64 {
    let bin = env!("CARGO_BIN_EXE_ferroce");
    let out = Command::new(bin)
        .args(["inspect", "-q"])
        .arg(path)
        .output()
        .expect("run ferroce inspect");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("ferroce inspect -q {}: {}", path.display(), text.trim());
    assert_eq!(out.status.code(), Some(0), "ferroce inspect: {text}");
    let field = |name: &str| -> u64 {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name}= in {text}"))
    };
    assert_eq!(field("icrc_bad"), 0, "{text}");
    assert_eq!(field("malformed"), 0, "{text}");
    assert_eq!(field("truncated"), 0, "{text}");
    assert!(field("roce") >= min_packets, "{text}");
    assert_eq!(field("roce"), field("icrc_ok"), "{text}");
    let roce = field("roce");
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tools/check-captures"))
        .arg("--ferroce")
        .arg(bin)
        .arg(path)
        .output()
        .expect("run tools/check-captures");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("tools/check-captures {}:\n{}", path.display(), text.trim());
    assert!(
        out.status.success(),
        "tools/check-captures (tshark: tools/deps.sh wire) failed:\n{text}"
    );
    roce
}

fn every_operation_with_capture(kind: BackendKind) {
    let _bed = Bed::for_backend(kind);
    let cap = capture_path(kind);
    let _ = std::fs::remove_file(&cap);
    let p = connect(
        Spec {
            ns: NS_A,
            kind,
            wrap: Wrap::Pcap(cap.clone()),
            psn: PSN_A,
            fast_recovery: false,
            selective_repeat: false,
        },
        plain(NS_B, kind, PSN_B),
    );
    let (one, piped) = all_operations(&p, 0x100);
    report(
        kind.name(),
        &p,
        &[("one at a time", one), ("pipelined", piped)],
    );
    assert_no_drops(&p.a, "A");
    assert_no_drops(&p.b, "B");
    let tx = p.a.qp_counters().tx_packets;
    // Dropping the NICs stops the engines and flushes the capture.
    drop(p);
    check_capture(&cap, tx);
}

/// `tcpdump` in R on one interface, writing a pcap until dropped (SIGINT: it flushes).
struct RouterCapture {
    child: std::process::Child,
    path: PathBuf,
    log: Option<thread::JoinHandle<String>>,
}

impl RouterCapture {
    fn start(ifname: &str) -> RouterCapture {
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("testbed_rc-router-{ifname}.pcap"));
        let _ = std::fs::remove_file(&path);
        let mut child = Command::new("ip")
            .args([
                "netns",
                "exec",
                NS_R,
                "tcpdump",
                "--immediate-mode",
                "-B",
                "131072",
                "-Q",
                "out",
                "-i",
                ifname,
                "-U",
                "-s",
                "0",
                "-w",
            ])
            .arg(&path)
            .args(["udp", "port", "4791"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tcpdump (tools/deps.sh net)");
        // tcpdump says "listening on" once its socket is capturing.
        let mut err = child.stderr.take().expect("tcpdump stderr");
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !String::from_utf8_lossy(&seen).contains("listening on") {
            assert!(Instant::now() < deadline, "tcpdump did not start: {seen:?}");
            let mut b = [0u8; 256];
            match std::io::Read::read(&mut err, &mut b) {
                Ok(0) => panic!("tcpdump exited: {}", String::from_utf8_lossy(&seen)),
                Ok(n) => seen.extend_from_slice(&b[..n]),
                Err(e) => panic!("tcpdump stderr: {e}"),
            }
        }
        // Keep reading its stderr (its closing summary must not meet a closed pipe).
        let log = thread::spawn(move || {
            let mut rest = String::new();
            let _ = std::io::Read::read_to_string(&mut err, &mut rest);
            String::from_utf8_lossy(&seen).into_owned() + &rest
        });
        RouterCapture {
            child,
            path,
            log: Some(log),
        }
    }

    /// Stop the capture and return its file.
    fn finish(mut self) -> PathBuf {
        self.stop();
        self.path.clone()
    }

    fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        if let Some(log) = self.log.take() {
            println!(
                "tcpdump ({}): {}",
                self.path.display(),
                log.join().unwrap_or_default().trim()
            );
        }
    }
}

impl Drop for RouterCapture {
    fn drop(&mut self) {
        self.stop();
    }
}

/// UDP segmentation in R's egress devices, off for the life of the value (the testbed is
/// shared by the tests: restored on drop).
struct RouterSegmentation;

impl RouterSegmentation {
    fn set(on: bool) {
        for dev in ["ra", "rb"] {
            let st = Command::new("ip")
                .args(["netns", "exec", NS_R, "ethtool", "-K", dev])
                .args(["tx-udp-segmentation", if on { "on" } else { "off" }])
                .status()
                .expect("ethtool (tools/deps.sh net)");
            assert!(st.success(), "ethtool -K {dev} tx-udp-segmentation");
        }
    }
    fn off() -> RouterSegmentation {
        Self::set(false);
        RouterSegmentation
    }
}

impl Drop for RouterSegmentation {
    fn drop(&mut self) {
        Self::set(true);
    }
}

/// Every RC operation between two UDP-socket backends with segmentation offload on both
/// ends, captured three ways: by A's pcap tap (the engine's frames: one per packet), and by
/// tcpdump in R on both egress devices, where R's kernel cuts every GSO super-datagram into
/// the datagrams of the wire (UDP segmentation turned off there). Every ICRC verifies in the
/// router's captures under the IPv4 IDs the kernel gave the segments, and R forwarded exactly
/// as many frames each way as the backends sent.
#[test]
fn udp_socket_gso_on_the_wire() {
    require_root!("testbed_rc", NEEDS);
    let _bed = Bed::take(SOCKETS);
    let _seg = RouterSegmentation::off();
    let to_b = RouterCapture::start("rb");
    let to_a = RouterCapture::start("ra");
    let tap = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("testbed_rc-udp-gso-tap.pcap");
    let _ = std::fs::remove_file(&tap);
    let p = connect(
        Spec {
            ns: NS_A,
            kind: BackendKind::Udp,
            wrap: Wrap::Pcap(tap.clone()),
            psn: PSN_A,
            fast_recovery: false,
            selective_repeat: false,
        },
        plain(NS_B, BackendKind::Udp, PSN_B),
    );
    let (one, piped) = all_operations(&p, 0x100);
    report(
        "udp gso",
        &p,
        &[("one at a time", one), ("pipelined", piped)],
    );
    assert_no_drops(&p.a, "A");
    assert_no_drops(&p.b, "B");
    let (ia, ib) = (p.a.io(), p.b.io());
    // Both ends sent runs as GSO messages: A its WRITE/SEND payloads, B its READ responses.
    assert!(ia.tx_offloaded > 0 && ib.tx_offloaded > 0, "{}", p.dump());
    drop(p);
    // Let the last frames cross R before the captures stop.
    thread::sleep(Duration::from_millis(300));
    let (to_b, to_a) = (to_b.finish(), to_a.finish());
    let tapped = check_capture(&tap, ia.tx_frames);
    assert_eq!(
        tapped,
        ia.tx_frames + ia.rx_frames,
        "the tap: one frame per packet"
    );
    assert_eq!(check_capture(&to_b, 1), ia.tx_frames, "A -> B through R");
    assert_eq!(check_capture(&to_a, 1), ib.tx_frames, "B -> A through R");
}

#[test]
fn every_operation_af_xdp() {
    require_root!("testbed_rc", NEEDS);
    every_operation_with_capture(BackendKind::Xdp);
}

#[test]
fn every_operation_af_packet() {
    require_root!("testbed_rc", NEEDS);
    every_operation_with_capture(BackendKind::Packet);
}

#[test]
fn every_operation_udp_socket() {
    require_root!("testbed_rc", NEEDS);
    every_operation_with_capture(BackendKind::Udp);
}

// ---- 2: 1 % loss in R ------------------------------------------------------------------------

fn one_percent_loss(kind: BackendKind, fast_recovery: bool) {
    one_percent_loss_with(kind, fast_recovery, false)
}

fn one_percent_loss_with(kind: BackendKind, fast_recovery: bool, selective_repeat: bool) {
    let _bed = Bed::for_backend(kind);
    let spec = |ns, psn| Spec {
        fast_recovery,
        selective_repeat,
        ..plain(ns, kind, psn)
    };
    let p = connect(spec(NS_A, PSN_A), spec(NS_B, PSN_B));
    must_testbed(&["loss", "1"]);
    let (one, piped) = all_operations(&p, 0x200);
    // Small messages one at a time: a lost request, response or ACK can only be recovered by
    // the requester's timeout (nothing comes after it). ~2 % of them lose a packet, so 700
    // of them time out about 14 times; none at all has a probability of about 1e-6.
    let small = [
        (Op::Write, 64),
        (Op::Send, 64),
        (Op::Read, 64),
        (Op::FetchAdd, 8),
        (Op::WriteImm, 64),
        (Op::CmpSwap, 8),
    ];
    let serial = run_stream(&p, 1, 0x202, &mut |i| {
        (i < 700).then(|| small[(i as usize) % small.len()])
    });
    // Tens of MB pipelined: sequence-error NAKs and go-back-N.
    let bulk = run_stream(&p, SLOTS, 0x203, &mut mixed(40 << 20));
    let stats = must_testbed(&[
        "exec",
        "r",
        "nft",
        "list",
        "table",
        "inet",
        "ferroce_router",
    ]);
    must_testbed(&["loss", "0"]);
    report(
        &format!(
            "{} 1% loss{}",
            kind.name(),
            match (fast_recovery, selective_repeat) {
                (_, true) => ", selective repeat",
                (true, false) => ", fast recovery",
                _ => "",
            }
        ),
        &p,
        &[
            ("each operation", one),
            ("each operation, pipelined", piped),
            ("700 small one at a time", serial),
            ("mixed bulk", bulk),
        ],
    );
    let r_drops = stats
        .split("counter packets ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    println!("R dropped {r_drops} RoCE packets");
    assert!(r_drops > 0, "R's loss rule dropped nothing:\n{stats}");
    let (qa, qb) = (p.a.qp_counters(), p.b.qp_counters());
    assert!(qa.retransmits > 0, "A retransmitted nothing: {qa:?}");
    if selective_repeat {
        assert!(
            qb.reordered_kept > 0 && qa.sr_resends > 0,
            "no selective repeat: A {qa:?} B {qb:?}"
        );
    }
    if fast_recovery || selective_repeat {
        // A lost tail (the last ACK of a message one at a time) is found by a probe.
        assert!(qa.probes > 0, "A never probed: {qa:?}");
    } else {
        assert!(qa.timeouts > 0, "A never timed out: {qa:?}");
    }
    assert!(
        qa.seq_naks_rcvd > 0 && qb.seq_naks_sent > 0,
        "no sequence-error NAK: A {qa:?} B {qb:?}"
    );
    assert!(
        qb.duplicates > 0 || qa.dup_responses > 0,
        "lost ACKs must make B see duplicates: A {qa:?} B {qb:?}"
    );
    assert_no_drops(&p.a, "A");
    assert_no_drops(&p.b, "B");
}

#[test]
fn one_percent_loss_af_xdp() {
    require_root!("testbed_rc", NEEDS);
    one_percent_loss(BackendKind::Xdp, false);
}

#[test]
fn one_percent_loss_fast_recovery_af_xdp() {
    require_root!("testbed_rc", NEEDS);
    one_percent_loss(BackendKind::Xdp, true);
}

#[test]
fn one_percent_loss_fast_recovery_udp_socket() {
    require_root!("testbed_rc", NEEDS);
    one_percent_loss(BackendKind::Udp, true);
}

#[test]
fn one_percent_loss_selective_repeat_af_xdp() {
    require_root!("testbed_rc", NEEDS);
    one_percent_loss_with(BackendKind::Xdp, false, true);
}

#[test]
fn one_percent_loss_selective_repeat_udp_socket() {
    require_root!("testbed_rc", NEEDS);
    one_percent_loss_with(BackendKind::Udp, false, true);
}

#[test]
fn one_percent_loss_af_packet() {
    require_root!("testbed_rc", NEEDS);
    one_percent_loss(BackendKind::Packet, false);
}

#[test]
fn one_percent_loss_udp_socket() {
    require_root!("testbed_rc", NEEDS);
    one_percent_loss(BackendKind::Udp, false);
}

// ---- 3: duplication and reordering from the fault injector -------------------------------------

fn duplicates_and_reordering(kind: BackendKind) {
    let _bed = Bed::for_backend(kind);
    // Both receive sides impaired: B sees duplicated/reordered requests, A duplicated and
    // reordered ACKs and READ/atomic responses. A few frames are corrupted too (one bit the
    // ICRC covers), which the receiver must count and drop.
    let faults = |seed| FaultConfig {
        duplicate: 0.02,
        reorder: 0.02,
        reorder_depth: 3,
        corrupt: 0.002,
        seed,
        ..FaultConfig::default()
    };
    let p = connect(
        Spec {
            ns: NS_A,
            kind,
            wrap: Wrap::Faults(faults(0xa)),
            psn: PSN_A,
            fast_recovery: false,
            selective_repeat: false,
        },
        Spec {
            ns: NS_B,
            kind,
            wrap: Wrap::Faults(faults(0xb)),
            psn: PSN_B,
            fast_recovery: false,
            selective_repeat: false,
        },
    );
    let (one, piped) = all_operations(&p, 0x300);
    let bulk = run_stream(&p, SLOTS, 0x303, &mut mixed(24 << 20));
    report(
        &format!("{} dup+reorder", kind.name()),
        &p,
        &[
            ("each operation", one),
            ("each operation, pipelined", piped),
            ("mixed bulk", bulk),
        ],
    );
    let (qa, qb) = (p.a.qp_counters(), p.b.qp_counters());
    assert!(qb.duplicates > 0, "B saw no duplicate request: {qb:?}");
    assert!(qa.dup_responses > 0, "A saw no duplicate response: {qa:?}");
    let (da, db) = (p.a.dev_counters(), p.b.dev_counters());
    assert!(
        da.icrc_drops > 0 && db.icrc_drops > 0,
        "corrupted frames must be dropped on the ICRC: A {da:?} B {db:?}"
    );
    // A flipped bit lands anywhere from the BTH to the ICRC. The device's checks run before
    // the ICRC (193c932), so the frame is counted at the first check it fails: the BTH's
    // opcode or pad count (malformed), its TVer or P_Key (header), its destination QPN (no
    // such QP), else the ICRC. The IP and Ethernet headers are not touched, so nothing may
    // be dropped on the address, and nothing may be dropped that is not RoCE.
    for d in [da, db] {
        assert_eq!(
            (d.not_roce, d.address_drops, d.cq_overruns),
            (0, 0, 0),
            "{d:?}"
        );
    }
}

#[test]
fn duplicates_and_reordering_af_xdp() {
    require_root!("testbed_rc", NEEDS);
    duplicates_and_reordering(BackendKind::Xdp);
}

#[test]
fn duplicates_and_reordering_af_packet() {
    require_root!("testbed_rc", NEEDS);
    duplicates_and_reordering(BackendKind::Packet);
}

#[test]
fn duplicates_and_reordering_udp_socket() {
    require_root!("testbed_rc", NEEDS);
    duplicates_and_reordering(BackendKind::Udp);
}

// ---- 5: AF_XDP on A, UDP socket on B ---------------------------------------------------------

#[test]
fn af_xdp_interoperates_with_udp_socket() {
    require_root!("testbed_rc", NEEDS);
    // A's kernel must ignore RoCE (its XDP socket owns it); B's must deliver it to the socket.
    let _bed = Bed::take(InputDrop { a: true, b: false });
    let p = connect(
        plain(NS_A, BackendKind::Xdp, PSN_A),
        plain(NS_B, BackendKind::Udp, PSN_B),
    );
    let (one, piped) = all_operations(&p, 0x500);
    let bulk = run_stream(&p, SLOTS, 0x503, &mut mixed(16 << 20));
    report(
        "xdp A / udp B",
        &p,
        &[
            ("each operation", one),
            ("each operation, pipelined", piped),
            ("mixed bulk", bulk),
        ],
    );
    assert_no_drops(&p.a, "A");
    assert_no_drops(&p.b, "B");
    // And the other way round: B requests, A responds (B's frames are the kernel's).
    let q = Pair { a: p.b, b: p.a };
    let (one, piped) = all_operations(&q, 0x510);
    report(
        "udp B -> xdp A",
        &q,
        &[
            ("each operation", one),
            ("each operation, pipelined", piped),
        ],
    );
    assert_no_drops(&q.a, "B");
    assert_no_drops(&q.b, "A");
}

// ---- 6: garbage on the wire during a transfer ------------------------------------------------

/// What the injector sent, by the bucket B must count it in.
#[derive(Debug, Default, Clone, Copy)]
struct Injected {
    /// UDP 4791 frames whose IP/UDP lengths are consistent but whose transport part is cut
    /// short (0..16 bytes: no whole BTH + ICRC): malformed everywhere.
    runts: u64,
    /// Frames cut short without fixing the IP/UDP lengths: the raw backends hand them up
    /// (malformed), B's kernel drops them before any socket (IP length > frame).
    lying_runts: u64,
    /// Well-formed requests to B's QP with a wrong ICRC.
    bad_icrc: u64,
    /// Well-formed requests with a valid ICRC to a QPN B does not have.
    unknown_qp: u64,
    /// Random-byte UDP datagrams to B:4791 from R's kernel whose transport part does not
    /// parse (malformed) / parses (then the ICRC fails).
    random_malformed: u64,
    random_parseable: u64,
    /// Not UDP 4791 (other UDP port, another ethertype, a frame shorter than an IPv4
    /// header): filtered before the engine by XDP/BPF, or by B's kernel.
    filtered: u64,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// A frame from R (rb) to B, as R's kernel would route it: RoCE v2 over IPv4 with ID 0 and
/// DF (what B's UDP backend guesses for a new source), a valid ICRC.
fn frame_to_b(
    dst_qp: QpNumber,
    psn: u32,
    opcode: Opcode,
    ext: ExtRepr,
    payload: &[u8],
    dport: u16,
) -> Vec<u8> {
    let mut bth = BthRepr::new(opcode, dst_qp, Psn::new(psn));
    bth.ack_req = true;
    let mut b = forged_to_b(RB4, Ecn::NotEct, bth, ext, payload);
    if dport != ROCE_V2_PORT {
        b[14 + 20 + 2..14 + 20 + 4].copy_from_slice(&dport.to_be_bytes());
    }
    b
}

/// A RoCE v2 frame on `rb` to B with any IPv4 source (R can claim A's address: it routes
/// between them), ECN field and BTH, and a valid ICRC.
fn forged_to_b(src: Ipv4Addr, ecn: Ecn, bth: BthRepr, ext: ExtRepr, payload: &[u8]) -> Vec<u8> {
    let f = FrameRepr {
        eth: Some(EthernetRepr {
            dst: B_MAC,
            src: RB_MAC,
            vlan: None,
            ethertype: 0,
        }),
        ip: IpRepr::V4(Ipv4Repr {
            src,
            dst: B4,
            dscp: 0,
            ecn,
            ident: 0,
            dont_frag: true,
            ttl: 64,
        }),
        udp: UdpRepr {
            src_port: 0xc0de,
            dst_port: ROCE_V2_PORT,
            checksum: 0,
        },
        roce: RoceRepr::new(bth, ext, payload.len()),
    };
    let mut b = vec![0u8; f.buffer_len()];
    let n = f.emit(&mut b, payload).expect("emit");
    b.truncate(n);
    b
}

/// Send one raw frame on R's `rb` (retrying while the TX ring is full).
fn send_raw(dev: &mut AfPacketDevice, f: &[u8]) {
    let mut sent = false;
    let t0 = Instant::now();
    while !sent {
        dev.send_batch(1, &mut |buf| {
            if sent {
                return None;
            }
            buf[..f.len()].copy_from_slice(f);
            sent = true;
            Some(f.len())
        })
        .expect("send on rb");
        assert!(t0.elapsed() < HANG, "cannot send on rb");
    }
}

/// Cut `f` (eth + IPv4 + UDP + transport) to `k` bytes of transport, fixing the lengths and
/// the IPv4 checksum.
fn runt(f: &[u8], k: usize) -> Vec<u8> {
    let mut r = f[..14 + 20 + 8 + k].to_vec();
    r[16..18].copy_from_slice(&((20 + 8 + k) as u16).to_be_bytes());
    r[24..26].fill(0);
    let c = ferroce::wire::ip::internet_checksum(&r[14..34]);
    r[24..26].copy_from_slice(&c.to_be_bytes());
    r[38..40].copy_from_slice(&((8 + k) as u16).to_be_bytes());
    r
}

/// The bits a frame with a wrong ICRC has flipped in its trailer (see `inject` for why these).
const ICRC_FLIP: [u8; 4] = [0xde, 0xad, 0xbe, 0xef];

/// The injector, in R: raw frames on `rb` (straight to B) with a third packet device, and
/// random datagrams from an ordinary UDP socket. Paced (13 frames every 3 ms), a trickle next
/// to the transfer.
fn inject(b_qp: QpNumber, b_addr: u64, b_rkey: ferroce::wire::RKey, stop: &AtomicBool) -> Injected {
    let mut n = Injected::default();
    let mut dev = AfPacketDevice::open(&AfPacketConfig::new("rb")).expect("AF_PACKET on rb in R");
    let sock = UdpSocket::bind("0.0.0.0:0").expect("udp socket in R");
    let mut rng = Rng(0x6a7b);
    let send = send_raw;
    // A WRITE to B's QP and MR in A's name (R routes between them): it passes every check
    // B's device makes before the ICRC, so a wrong ICRC is what drops it.
    let write_only = |psn: u32, payload: &[u8]| {
        let mut bth = BthRepr::new(Opcode::RC_WRITE_ONLY, b_qp, Psn::new(psn));
        bth.ack_req = true;
        let ext = ExtRepr {
            reth: Some(RethRepr {
                va: b_addr,
                rkey: b_rkey,
                dma_len: payload.len() as u32,
            }),
            ..ExtRepr::default()
        };
        forged_to_b(A4, Ecn::NotEct, bth, ext, payload)
    };
    // The wrong ICRC: `ICRC_FLIP` in the trailer. Check that B's UDP backend cannot
    // mistake it for an unknown IPv4 identification (its solver would "repair" a delta in the
    // span of the ID bits, with or without DF flipped): a deterministic precondition.
    let bad_len = 256usize;
    {
        let f = write_only(1, &pattern(bad_len, 1));
        let t = &f[42..];
        let mut g = t.to_vec();
        let k = g.len() - 4;
        for (x, y) in g[k..].iter_mut().zip(ICRC_FLIP) {
            *x ^= y;
        }
        let d = icrc::stored(t).unwrap() ^ icrc::stored(&g).unwrap();
        let after = icrc::ipv4_ident_bytes_after(20, k);
        assert!(
            icrc::ident_from_delta(d, after).is_none()
                && icrc::ident_from_delta(d ^ icrc::ipv4_df_delta(20, k), after).is_none(),
            "choose another ICRC_FLIP: the UDP backend's ID solver would accept it"
        );
    }
    let mut round = 0u32;
    while round < 40 && !stop.load(Ordering::Acquire) {
        round += 1;
        // Runts: 0..16 bytes of transport.
        let whole = frame_to_b(
            b_qp,
            round,
            Opcode::RC_SEND_ONLY,
            ExtRepr::default(),
            &[],
            ROCE_V2_PORT,
        );
        send(&mut dev, &runt(&whole, (round as usize) % 16));
        n.runts += 1;
        // A frame cut in the middle with the lengths left as they were.
        let long = frame_to_b(
            b_qp,
            round,
            Opcode::RC_SEND_ONLY,
            ExtRepr::default(),
            &pattern(512, u64::from(round)),
            ROCE_V2_PORT,
        );
        send(&mut dev, &long[..60 + (round as usize % 7) * 13]);
        n.lying_runts += 1;
        // A wrong ICRC on an otherwise valid WRITE to B's QP and MR.
        let mut f = write_only(round * 7, &pattern(bad_len, u64::from(round)));
        let k = f.len() - 4;
        for (x, y) in f[k..].iter_mut().zip(ICRC_FLIP) {
            *x ^= y;
        }
        send(&mut dev, &f);
        n.bad_icrc += 1;
        // Valid, to a QP B does not have.
        let f = frame_to_b(
            QpNumber::new(b_qp.get() + 0x1000),
            round,
            Opcode::RC_SEND_ONLY,
            ExtRepr::default(),
            &pattern(100, u64::from(round)),
            ROCE_V2_PORT,
        );
        send(&mut dev, &f);
        n.unknown_qp += 1;
        // Random datagrams from R's own stack.
        for _ in 0..5 {
            let len = 1 + (rng.next() % 300) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            sock.send_to(&bytes, (B4, ROCE_V2_PORT)).expect("udp send");
            if RoceRepr::parse(&bytes).is_ok() {
                n.random_parseable += 1;
            } else {
                n.random_malformed += 1;
            }
        }
        // Not RoCE v2: another UDP port, another ethertype, a frame too short for IPv4.
        let f = frame_to_b(
            b_qp,
            round,
            Opcode::RC_SEND_ONLY,
            ExtRepr::default(),
            &[1, 2, 3, 4],
            4792,
        );
        send(&mut dev, &f);
        let mut f = pattern(80, u64::from(round));
        f[..6].copy_from_slice(&B_MAC.0);
        f[6..12].copy_from_slice(&RB_MAC.0);
        f[12..14].copy_from_slice(&[0x88, 0xb5]);
        send(&mut dev, &f);
        let mut f = whole[..24].to_vec();
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        send(&mut dev, &f);
        n.filtered += 3;
        thread::sleep(Duration::from_millis(3));
    }
    n
}

fn garbage_during_transfer(kind: BackendKind) {
    let _bed = Bed::for_backend(kind);
    let p = connect(plain(NS_A, kind, PSN_A), plain(NS_B, kind, PSN_B));
    let before = p.b.dev_counters();
    let io_before = p.b.io();
    let overflow_before = b_udp_counter("RcvbufErrors");
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let (b_qp, b_addr, b_rkey) = (p.b.qp, p.b.mr.addr(), p.b.mr.rkey());
    let injector = {
        let (stop, started, done) = (stop.clone(), started.clone(), done.clone());
        spawn_in_ns(NS_R, move || {
            // Start once the transfer is under way.
            while started.load(Ordering::Acquire) < 4 && !stop.load(Ordering::Acquire) {
                thread::sleep(Duration::from_millis(1));
            }
            let n = inject(b_qp, b_addr, b_rkey, &stop);
            done.store(true, Ordering::Release);
            n
        })
    };
    // 1 MiB WRITEs, 8 in flight, at least 200 of them and until the injector is done (and
    // 8 more after that, so that everything it sent has reached B before the transfer ends).
    let mut after_done = None;
    let st = run_stream(&p, SLOTS, 0x600, &mut |i| {
        started.store(i, Ordering::Release);
        if done.load(Ordering::Acquire) && after_done.is_none() {
            after_done = Some(i);
        }
        let enough = i >= 200 && after_done.is_some_and(|d| i >= d + 8);
        (!enough).then_some((Op::Write, 1 << 20))
    });
    stop.store(true, Ordering::Release);
    let n = join(injector);
    let want_malformed = n.runts
        + n.random_malformed
        + if kind == BackendKind::Udp {
            0
        } else {
            n.lying_runts
        };
    // Wait until B has counted everything (it has: the transfer ran on after the injector was
    // done; this only guards against a slow engine), then compare exactly.
    let t0 = Instant::now();
    let got = loop {
        let d = p.b.dev_counters();
        // Those B's UDP socket filter dropped (`udp_filter`) never reach the engine.
        let kernel = p.b.io().rx_kernel_drops - io_before.rx_kernel_drops;
        let seen = device_drops_since(&d, &before) + kernel;
        if seen >= want_malformed + n.bad_icrc + n.random_parseable + n.unknown_qp
            || t0.elapsed() > Duration::from_secs(5)
        {
            break d;
        }
        thread::sleep(Duration::from_millis(10));
    };
    report(
        &format!("{} garbage", kind.name()),
        &p,
        &[("1 MiB WRITEs during the injection", st)],
    );
    println!("injected: {n:?}");
    let delta = |a: u64, b: u64| a - b;
    let malformed = delta(got.malformed_drops, before.malformed_drops);
    let icrc_drops = delta(got.icrc_drops, before.icrc_drops);
    let unknown = delta(got.unknown_qp_drops, before.unknown_qp_drops);
    let header = delta(got.header_drops, before.header_drops);
    let address = delta(got.address_drops, before.address_drops);
    assert_eq!(
        got.not_roce, 0,
        "nothing but UDP 4791 reaches the engine: {got:?}"
    );
    assert_eq!(got.cq_overruns, 0);
    let want_icrc = n.bad_icrc + n.random_parseable;
    let raw = kind != BackendKind::Udp;
    // Frames B's backend lost before the engine saw them (AF_XDP: RX ring full; AF_PACKET: no
    // free block in the ring -- with 16 blocks retired after 1 ms each, an engine thread that
    // does not run for more than ~16 ms on a loaded machine loses even a trickle of frames).
    let ring_drops = p.b.io().rx_dropped - io_before.rx_dropped;
    // The UDP socket: what its kernel-side filter refused (the runts, the unknown QPNs, most
    // random datagrams: `udp_filter`) is in the socket's kernel drop count with any buffer
    // overflow; the overflows (`RcvbufErrors`) are losses like a full ring's.
    let overflow = b_udp_counter("RcvbufErrors") - overflow_before;
    let kernel = p.b.io().rx_kernel_drops - io_before.rx_kernel_drops;
    let filtered = kernel.saturating_sub(overflow);
    let ring_drops = ring_drops + if raw { 0 } else { overflow };
    println!("B's kernel filtered {filtered} (socket drops {kernel}, buffer overflows {overflow})");
    if raw {
        assert_eq!(kernel, 0, "a raw backend keeps no socket drop count");
    }
    if ring_drops == 0 && !raw && filtered > 0 {
        // Everything injected reached B's socket: each is counted once, by the filter or by
        // the engine; runts and unknown QPNs are the filter's, the wrong ICRCs (in A's name,
        // to B's QP) the engine's.
        assert!(
            filtered >= n.runts + n.unknown_qp,
            "filtered {filtered}: {n:?}"
        );
        assert!(icrc_drops >= n.bad_icrc, "icrc_drops: {got:?}");
        assert_eq!(
            malformed + icrc_drops + unknown + header + address + filtered,
            want_malformed + want_icrc + n.unknown_qp,
            "every injected datagram counted once: {got:?}, {n:?}"
        );
    } else if ring_drops == 0 {
        // Everything injected reached the engine: exact counts.
        assert_eq!(malformed, want_malformed, "malformed_drops: {got:?}");
        // The wrong-ICRC WRITEs (in A's name) pass every check before the ICRC and the frames
        // to a QP B does not have carry a valid ICRC: both counts are exact lower bounds. A random datagram
        // that parses is counted at the first check it fails (the device's checks run before
        // the ICRC): its TVer/P_Key (header), R's own source address (address), its QPN, or
        // the ICRC. On the UDP backend, which solves for the unknown IPv4 ID, it may also be
        // "repaired" into a valid-ICRC packet that then fails one of those checks.
        assert!(unknown >= n.unknown_qp, "unknown_qp_drops: {got:?}");
        assert!(icrc_drops >= n.bad_icrc, "icrc_drops: {got:?}");
        assert_eq!(
            icrc_drops + header + address + (unknown - n.unknown_qp),
            want_icrc,
            "{got:?}"
        );
    } else {
        // Which frames were lost is unknown: no bucket may hold more than was injected for
        // it, and all of them together miss no more than the backend dropped.
        println!(
            "note: B's backend dropped {ring_drops} frames before the engine: drop counts \
             checked as bounds"
        );
        assert!(malformed <= want_malformed, "malformed_drops: {got:?}");
        assert!(
            icrc_drops + header + address + unknown <= want_icrc + n.unknown_qp,
            "{got:?}"
        );
        if raw {
            assert!(icrc_drops <= want_icrc, "icrc_drops: {got:?}");
            assert!(
                unknown <= n.unknown_qp + n.random_parseable,
                "unknown_qp_drops: {got:?}"
            );
        }
        let counted = malformed + icrc_drops + unknown + header + address + filtered;
        let want = want_malformed + want_icrc + n.unknown_qp;
        assert_missing_within_ring_drops(want, counted, ring_drops, || format!("{got:?}"));
    }
    assert!(st.messages >= 200);
    assert_no_drops(&p.a, "A");
}

#[test]
fn garbage_during_transfer_af_xdp() {
    require_root!("testbed_rc", NEEDS);
    garbage_during_transfer(BackendKind::Xdp);
}

#[test]
fn garbage_during_transfer_af_packet() {
    require_root!("testbed_rc", NEEDS);
    garbage_during_transfer(BackendKind::Packet);
}

#[test]
fn garbage_during_transfer_udp_socket() {
    require_root!("testbed_rc", NEEDS);
    garbage_during_transfer(BackendKind::Udp);
}

/// Issue 17, "a peer that ACKs PSNs never sent": the transfer runs from the host in B's
/// namespace (the requester, PSNs from `PSN_B`) to the one in A's, and R injects on `rb`, in A's
/// name, ACKs for PSNs the requester has not sent and never will in this test (4,000,000 and
/// more ahead of its first PSN, always inside the 2^23 window ahead of its next one): a
/// requester takes an ACK only for an outstanding PSN (IBTA 9.7.5.1.3's "ghost" ACKs are
/// silently dropped). Each one is counted in `ghost_acks`, exactly; nothing completes early
/// or out of order, every WRITE lands byte for byte (run_stream checks every completion and
/// destination), and both QPs stay in RTS.
fn forged_acks_of_psns_never_sent(kind: BackendKind) {
    const AHEAD: u32 = 4_000_000;
    let _bed = Bed::for_backend(kind);
    // `p.a` (the requester) lives in B's namespace, `p.b` in A's.
    let p = connect(plain(NS_B, kind, PSN_B), plain(NS_A, kind, PSN_A));
    let q0 = p.a.qp_counters();
    let io_before = p.a.io();
    let victim = p.a.qp;
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let injector = {
        let (stop, started, done) = (stop.clone(), started.clone(), done.clone());
        spawn_in_ns(NS_R, move || {
            while started.load(Ordering::Acquire) < 4 && !stop.load(Ordering::Acquire) {
                thread::sleep(Duration::from_millis(1));
            }
            let mut dev =
                AfPacketDevice::open(&AfPacketConfig::new("rb")).expect("AF_PACKET on rb in R");
            let mut sent = 0u64;
            while sent < 400 && !stop.load(Ordering::Acquire) {
                let psn = PSN_B.wrapping_add(AHEAD + (sent as u32 % 1000)) & 0xff_ffff;
                let syndrome = if sent % 2 == 0 {
                    Syndrome::Ack(ferroce::wire::CreditCode::new(31))
                } else {
                    Syndrome::Ack(ferroce::wire::CreditCode::new(0))
                };
                let ext = ExtRepr {
                    aeth: Some(ferroce::wire::AethRepr {
                        syndrome,
                        msn: 0xff_fff0 + (sent as u32 % 16),
                    }),
                    ..ExtRepr::default()
                };
                let bth = BthRepr::new(Opcode::RC_ACK, victim, Psn::new(psn));
                send_raw(&mut dev, &forged_to_b(A4, Ecn::NotEct, bth, ext, &[]));
                sent += 1;
                thread::sleep(Duration::from_millis(1));
            }
            done.store(true, Ordering::Release);
            sent
        })
    };
    // 1 MiB WRITEs, 8 in flight, until the injector is done and 8 more after that.
    let mut after_done = None;
    let st = run_stream(&p, SLOTS, 0x700, &mut |i| {
        started.store(i, Ordering::Release);
        if done.load(Ordering::Acquire) && after_done.is_none() {
            after_done = Some(i);
        }
        let enough = i >= 32 && after_done.is_some_and(|d| i >= d + 8);
        (!enough).then_some((Op::Write, 1 << 20))
    });
    stop.store(true, Ordering::Release);
    let sent = join(injector);
    // Every forged ACK was sent before the last 8 MiB of the stream; this only guards against
    // a slow engine (a hang guard, not a limit).
    // A frame the requester's backend dropped (its ring full: counted in `rx_dropped`) may
    // have been one of them: they are then exact up to those drops.
    let io0 = io_before.rx_dropped;
    let lost = || p.a.io().rx_dropped - io0;
    let t0 = Instant::now();
    while p.a.qp_counters().ghost_acks - q0.ghost_acks + lost() < sent && t0.elapsed() < HANG {
        thread::sleep(Duration::from_millis(10));
    }
    let q = qp_delta(&p.a.qp_counters(), &q0);
    let get = |k: &str| q.iter().find(|(n, _)| *n == k).unwrap().1;
    report(
        &format!("{} forged ACKs", kind.name()),
        &p,
        &[("1 MiB WRITEs during the forged ACKs", st)],
    );
    println!("forged ACKs sent: {sent}");
    assert!(sent > 0, "the injector sent nothing");
    assert!(
        u64::from(AHEAD) > get("tx_packets") + 1000,
        "the transfer reached the forged PSNs: the test's premise is gone"
    );
    let ghosts = get("ghost_acks");
    assert!(
        ghosts <= sent && ghosts + lost() >= sent,
        "every forged ACK counted as an ACK of a PSN never sent: {ghosts} of {sent}, {} \
         frames dropped by the requester's backend\n{}",
        lost(),
        p.dump()
    );
    assert_eq!(get("dup_responses"), 0, "{}", p.dump());
    for (who, h) in [("requester", &p.a), ("responder", &p.b)] {
        let (state, _) = h.nic.query_qp(h.qp).unwrap();
        assert_eq!(
            state,
            QpState::Rts,
            "the {who}'s QP after the forged ACKs\n{}",
            p.dump()
        );
    }
}

#[test]
fn forged_acks_of_psns_never_sent_af_packet() {
    require_root!("testbed_rc", NEEDS);
    forged_acks_of_psns_never_sent(BackendKind::Packet);
}

#[test]
fn forged_acks_of_psns_never_sent_udp_socket() {
    require_root!("testbed_rc", NEEDS);
    forged_acks_of_psns_never_sent(BackendKind::Udp);
}

// ---- 7: a hostile peer floods B during a transfer --------------------------------------------

/// The kinds of hostile frame, in the order of [`Flood::sent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hostile {
    /// UDP 4791 frames with 0..16 bytes of transport: `malformed_drops`.
    Runt,
    /// A WRITE to B's QP and region from A's address with a wrong ICRC: `icrc_drops`.
    BadIcrc,
    /// Valid frames to a QPN B does not have: `unknown_qp_drops`.
    UnknownQp,
    /// From A's address to B's QP at the expected PSN with B's real R_Key, every check passing
    /// but the P_Key: `header_drops`.
    BadPkey,
    /// To B's QP from X's own address (not the QP's peer): a CE-marked WRITE into the protected
    /// bytes with B's real R_Key, a READ of 2^31 bytes, an RNR NAK: `address_drops`, no CNP.
    WrongSource,
    /// From A's address with PSNs B passed long ago (replays): a WRITE and a FETCH_ADD into the
    /// protected bytes and a READ of 2^31 bytes, all with B's real R_Key: `duplicates`,
    /// re-ACKed or ignored, never executed, no READ or ATOMIC response.
    Replayed,
    /// From A's address: NAKs for PSNs B never sent: `ghost_acks`.
    ForgedNak,
    /// UD SENDs to B's UD QP with a wrong Q_Key: `qkey_drops`.
    WrongQkey,
    /// UD SENDs with the right Q_Key to the UD QP, which has no receive posted:
    /// `no_wqe_drops`.
    NoWqe,
    /// CNPs from A's address to B's RC QP (a CNP flood): taken by B's reaction point
    /// (`cnps_handled`), never answered; B sends only ACKs, which are not paced.
    Cnp,
}

const HOSTILE_KINDS: usize = 10;

/// What the backends did in one phase: A's frames sent (in GSO messages), B's frames
/// received (inside GRO datagrams or super-frames) and dropped.
#[derive(Debug, Clone, Copy)]
#[allow(dead_code)] // read through Debug
struct PhaseIo {
    a_tx: u64,
    a_tx_offloaded: u64,
    b_rx: u64,
    b_rx_coalesced: u64,
    b_rx_dropped: u64,
    /// CPU time of this process's threads in the phase (`cpu_by_thread`), and the phase's
    /// length: the machine has 2 cores, so the engines' share is what the attacker leaves.
    cpu_ms_engines: u64,
    cpu_ms_attacker: u64,
    cpu_ms_other: u64,
    wall_ms: u64,
}

/// CPU time (ns, from `/proc/self/task/*/schedstat`) of this process's threads so far:
/// `[engines ("ferroce-nic"), the attacker (X's thread, with the kernel's forwarding and
/// socket work done in its context), everything else]`. Threads that ended are not counted.
fn cpu_by_thread() -> [u64; 3] {
    let mut t = [0u64; 3];
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return t;
    };
    for e in dir.flatten() {
        let p = e.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        let ns = std::fs::read_to_string(p.join("schedstat"))
            .ok()
            .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
            .unwrap_or(0u64);
        let k = match comm.trim() {
            "ferroce-nic" => 0,
            NS_X => 1,
            _ => 2,
        };
        t[k] += ns;
    }
    t
}

/// What the flood sent, by what B must do with each.
#[derive(Debug, Default, Clone, Copy)]
struct Flood {
    /// Frames queued on X's TX ring, by [`Hostile`] kind.
    sent: [u64; HOSTILE_KINDS],
    /// Frames X's kernel refused (counted in `sent`, never on the wire).
    tx_dropped: u64,
}

impl Flood {
    fn get(&self, k: Hostile) -> u64 {
        self.sent[k as usize]
    }
    fn frames(&self) -> u64 {
        self.sent.iter().sum()
    }
}

/// What the attacker knows about B (all of it visible on the wire to anyone on path).
#[derive(Clone, Copy)]
struct Victim {
    qp: QpNumber,
    ud_qp: QpNumber,
    addr: u64,
    rkey: ferroce::wire::RKey,
}

/// The bytes of B's region (after the atomic target) that no legitimate operation touches
/// and every forged WRITE and ATOMIC aims at.
const PROT_OFF: usize = ATOMIC_OFF + 1024;
const PROT_LEN: usize = 2048;
const UD_QKEY: u32 = 0x1717_0017;

/// The flood's rate: off, paced to a number of frames per second, or as fast as X goes.
const FLOOD_OFF: u64 = 0;
const FLOOD_MAX: u64 = u64::MAX;

/// The flood's controls, shared between the test and X's thread.
#[derive(Default)]
struct FloodCtl {
    /// Frames per second ([`FLOOD_OFF`], a rate, or [`FLOOD_MAX`]).
    rate: AtomicU64,
    quit: AtomicBool,
    /// Frames queued so far (read per phase for the measured rate).
    sent: AtomicU64,
}

/// Stops X's flood when dropped: when the test ends, and when it panics midway (the flood
/// went on into the next tests' phases on the same testbed before).
struct FloodQuit(Arc<FloodCtl>);

impl Drop for FloodQuit {
    fn drop(&mut self) {
        self.0.quit.store(true, Ordering::Release);
    }
}

/// Rounds of hostile frames prepared before the flood starts (so that sending one is a copy
/// into the TX ring, not a frame synthesis with its ICRC).
const POOL_ROUNDS: u32 = 1024;

/// `f` as host X sends it: to R's `rx` (R routes it to B like any other host's frame).
fn via_x(mut f: Vec<u8>) -> Vec<u8> {
    f[..6].copy_from_slice(&RX_MAC.0);
    f[6..12].copy_from_slice(&X_MAC.0);
    f
}

/// The flood's frames, `POOL_ROUNDS` rounds of 14, each with its kind.
fn flood_pool(v: Victim) -> Vec<(Hostile, Vec<u8>)> {
    use Hostile::*;
    let prot = v.addr + PROT_OFF as u64;
    let bth = |op: Opcode, qp: QpNumber, psn: u32| {
        let mut b = BthRepr::new(op, qp, Psn::new(psn & 0xff_ffff));
        b.ack_req = true;
        b
    };
    let reth = |va: u64, rkey, dma_len| ExtRepr {
        reth: Some(RethRepr { va, rkey, dma_len }),
        ..ExtRepr::default()
    };
    let nak = |s: Syndrome| ExtRepr {
        aeth: Some(ferroce::wire::AethRepr {
            syndrome: s,
            msn: 0,
        }),
        ..ExtRepr::default()
    };
    let ud = |qkey: u32| ExtRepr {
        deth: Some(ferroce::wire::DethRepr {
            qkey: ferroce::wire::QKey(qkey),
            src_qp: QpNumber::new(0x77),
        }),
        ..ExtRepr::default()
    };
    let junk = pattern(256, 0x17);
    let mut pool = Vec::with_capacity(POOL_ROUNDS as usize * 14);
    let mut push = |k: Hostile, f: Vec<u8>| pool.push((k, via_x(f)));
    for round in 0..POOL_ROUNDS {
        // PSNs B's responder passed long ago (A starts at PSN_A and moves on by far less
        // than 2^20 packets in this test): duplicates, the half window behind.
        let old = PSN_A.wrapping_sub(0x10_0000 + round);
        let send_only = forged_to_b(
            A4,
            Ecn::NotEct,
            bth(Opcode::RC_SEND_ONLY, v.qp, round),
            ExtRepr::default(),
            &[],
        );
        push(Runt, runt(&send_only, (round as usize) % 16));
        // The same length as `inject`'s wrong-ICRC WRITE, whose flip it checks against the
        // UDP backend's identification solver.
        let mut f = forged_to_b(
            A4,
            Ecn::NotEct,
            bth(Opcode::RC_WRITE_ONLY, v.qp, PSN_A.wrapping_add(round)),
            reth(prot, v.rkey, 256),
            &junk,
        );
        let k = f.len() - 4;
        for (x, y) in f[k..].iter_mut().zip(ICRC_FLIP) {
            *x ^= y;
        }
        push(BadIcrc, f);
        push(
            UnknownQp,
            forged_to_b(
                A4,
                Ecn::NotEct,
                bth(
                    Opcode::RC_SEND_ONLY,
                    QpNumber::new(v.qp.get() + 0x1000 + round % 64),
                    round,
                ),
                ExtRepr::default(),
                &junk[..64],
            ),
        );
        let mut b = bth(Opcode::RC_WRITE_ONLY, v.qp, PSN_A.wrapping_add(round));
        b.pkey = ferroce::wire::PKey(0x1234);
        push(
            BadPkey,
            forged_to_b(A4, Ecn::NotEct, b, reth(prot, v.rkey, 256), &junk),
        );
        push(
            WrongSource,
            forged_to_b(
                X4,
                Ecn::Ce,
                bth(Opcode::RC_WRITE_ONLY, v.qp, PSN_A.wrapping_add(round)),
                reth(prot, v.rkey, 256),
                &junk,
            ),
        );
        push(
            WrongSource,
            forged_to_b(
                X4,
                Ecn::NotEct,
                bth(Opcode::RC_READ_REQUEST, v.qp, PSN_A.wrapping_add(round)),
                reth(v.addr, v.rkey, 0x8000_0000),
                &[],
            ),
        );
        push(
            WrongSource,
            forged_to_b(
                X4,
                Ecn::NotEct,
                bth(Opcode::RC_ACK, v.qp, PSN_B),
                nak(Syndrome::RnrNak(ferroce::wire::RnrTimer::new(0x3f))),
                &[],
            ),
        );
        push(
            Replayed,
            forged_to_b(
                A4,
                Ecn::NotEct,
                bth(Opcode::RC_WRITE_ONLY, v.qp, old),
                reth(prot, v.rkey, 256),
                &junk,
            ),
        );
        push(
            Replayed,
            forged_to_b(
                A4,
                Ecn::NotEct,
                bth(Opcode::RC_READ_REQUEST, v.qp, old.wrapping_sub(1)),
                reth(v.addr, v.rkey, 0x8000_0000),
                &[],
            ),
        );
        push(
            Replayed,
            forged_to_b(
                A4,
                Ecn::NotEct,
                bth(Opcode::RC_FETCH_ADD, v.qp, old.wrapping_sub(2)),
                ExtRepr {
                    atomic_eth: Some(ferroce::wire::AtomicEthRepr {
                        va: prot,
                        rkey: v.rkey,
                        swap_add: 1,
                        compare: 0,
                    }),
                    ..ExtRepr::default()
                },
                &[],
            ),
        );
        push(
            ForgedNak,
            forged_to_b(
                A4,
                Ecn::NotEct,
                bth(Opcode::RC_ACK, v.qp, PSN_B.wrapping_add(100 + round % 1000)),
                nak(Syndrome::Nak(ferroce::wire::NakCode::RemoteAccessError)),
                &[],
            ),
        );
        push(
            WrongQkey,
            forged_to_b(
                X4,
                Ecn::NotEct,
                bth(Opcode::UD_SEND_ONLY, v.ud_qp, round),
                ud(UD_QKEY ^ 0x0100),
                &junk,
            ),
        );
        push(
            NoWqe,
            forged_to_b(
                X4,
                Ecn::NotEct,
                bth(Opcode::UD_SEND_ONLY, v.ud_qp, round),
                ud(UD_QKEY),
                &junk,
            ),
        );
        push(
            Cnp,
            forged_to_b(
                A4,
                Ecn::NotEct,
                BthRepr::new(Opcode::CNP, v.qp, Psn::new(0)),
                ExtRepr::default(),
                &[],
            ),
        );
    }
    // `FERROCE_FLOOD_KINDS=WrongSource,UnknownQp` (say): only those kinds, for measuring
    // what each costs; every count below still holds (kinds not sent expect nothing).
    if let Ok(only) = std::env::var("FERROCE_FLOOD_KINDS") {
        pool.retain(|(k, _)| only.split(',').any(|s| s.trim() == format!("{k:?}")));
        assert!(!pool.is_empty(), "FERROCE_FLOOD_KINDS={only}: no such kind");
    }
    pool
}

/// The flood, in X: the prepared frames round after round on X's `eth0` (to R, which routes
/// them to B), up to 64 per system call (the AF_PACKET TX ring, one doorbell per batch), at
/// `ctl.rate` frames per second or as fast as X goes, until `ctl.quit`.
fn flood(pool: &[(Hostile, Vec<u8>)], ctl: &FloodCtl) -> Flood {
    const BATCH: usize = 64;
    let mut n = Flood::default();
    let mut dev =
        AfPacketDevice::open(&AfPacketConfig::new("eth0")).expect("AF_PACKET on eth0 in X");
    let mut i = 0usize;
    let mut sent = 0u64;
    // (start, rate, frames sent at start) of the current paced stretch.
    let mut pace: Option<(Instant, u64, u64)> = None;
    while !ctl.quit.load(Ordering::Acquire) {
        let rate = ctl.rate.load(Ordering::Acquire);
        if rate == FLOOD_OFF {
            pace = None;
            thread::sleep(Duration::from_micros(200));
            continue;
        }
        let mut want = BATCH;
        if rate != FLOOD_MAX {
            let (t0, r, s0) = *pace.get_or_insert((Instant::now(), rate, sent));
            if r != rate {
                pace = None;
                continue;
            }
            let due = (t0.elapsed().as_secs_f64() * rate as f64) as u64;
            if due <= sent - s0 {
                thread::sleep(Duration::from_micros(500));
                continue;
            }
            want = ((due - (sent - s0)) as usize).min(BATCH);
        } else {
            pace = None;
        }
        let mut queued = 0u64;
        dev.send_batch(want, &mut |buf| {
            let (k, f) = &pool[i];
            buf[..f.len()].copy_from_slice(f);
            n.sent[*k as usize] += 1;
            i = (i + 1) % pool.len();
            queued += 1;
            Some(f.len())
        })
        .expect("send on X's eth0");
        sent += queued;
        ctl.sent.store(sent, Ordering::Release);
        if queued == 0 {
            thread::yield_now();
        }
    }
    n.tx_dropped = dev.stats().tx_dropped;
    n
}

/// This process's resident set (VmRSS), in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|l| l.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .expect("VmRSS in /proc/self/status")
}

/// The QP counters `after - before`, field by field.
fn qp_delta(after: &QpCounters, before: &QpCounters) -> Vec<(&'static str, u64)> {
    after
        .named()
        .into_iter()
        .zip(before.named())
        .map(|((k, a), (_, b))| (k, a - b))
        .collect()
}

/// A legitimate RC flow A → B (1 MiB WRITEs, 8 in flight, every byte checked) runs in phases
/// alternately undisturbed and under a flood from host X (`flood`: off the A-B path, on its
/// own link to R, claiming A's address where it forges) of malformed, corrupted,
/// misaddressed, forged and replayed packets aimed at B's RC QP, region and a UD QP of B's,
/// at a stated rate ([`flood_rate`]) and as fast as X goes. Asserted: the flow completes
/// byte-exact; every hostile packet lands in the drop counter IBTA and `docs/security.md`
/// assign it (exactly when no frame was lost on the way or by B's backend, else as bounds) and gets no answer but the re-ACK a duplicate is owed; the protected bytes and the
/// atomic target are untouched; no NAK, CNP, READ or ATOMIC replay from B; both QPs still in
/// RTS; the process's resident memory after the flood within `RSS_SLACK` of before it.
/// Printed (never asserted): the flow's throughput in each phase, the attacker's measured
/// rate and the ratio flooded / undisturbed of each flooded phase to the mean of the
/// undisturbed ones next to it.
fn hostile_peer(kind: BackendKind) {
    /// Resident memory the flood may leave behind (allocator slack), in KiB: a leak of even
    /// 64 bytes per hostile frame would exceed it.
    const RSS_SLACK: u64 = 16 << 10;
    const PHASE_WRITES: u64 = 48;
    const PAIRS: usize = 3;
    let _bed = Bed::for_backend(kind);
    let p = connect(plain(NS_A, kind, PSN_A), plain(NS_B, kind, PSN_B));
    // B's UD QP (own PD and CQ), never given a receive.
    let ud_pd = p.b.nic.alloc_pd().unwrap();
    let ud_cq = p.b.nic.create_cq(64).unwrap();
    let ud_qp = p
        .b
        .nic
        .create_qp(
            QpInitAttr::new(ud_pd, ud_cq, ud_cq, common::qp_cap(16, 1, 0)).with_type(QpType::Ud),
        )
        .unwrap();
    p.b.nic
        .bring_up_ud(
            ud_qp,
            &UdParams {
                qkey: UD_QKEY,
                local_psn: 1,
            },
        )
        .unwrap();
    let guard = pattern(PROT_LEN, 0x5afe);
    p.b.mr.write(PROT_OFF, &guard).unwrap();
    let v = Victim {
        qp: p.b.qp,
        ud_qp,
        addr: p.b.mr.addr(),
        rkey: p.b.mr.rkey(),
    };
    let pool = flood_pool(v);
    let ctl = Arc::new(FloodCtl::default());
    // `FERROCE_FLOOD_PIN=1`: the attacker on a CPU of its own, as a host of its own would be —
    // every thread of this process (A's and B's engines, the flow) on CPU 0, X's thread (and
    // the kernel work its sends drive: R's forwarding, B's kernel receive) on CPU 1; the
    // undisturbed phases run pinned the same way.
    let pin = std::env::var("FERROCE_FLOOD_PIN").is_ok_and(|v| v == "1");
    if pin {
        taskset(&["-a", "-p", "-c", "0", &std::process::id().to_string()]);
        println!("pinned: A, B and the flow on CPU 0, X on CPU 1");
    }
    let flooder = {
        let ctl = ctl.clone();
        spawn_in_ns(NS_X, move || {
            if pin {
                let me = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
                let tid = me.file_name().unwrap().to_string_lossy().into_owned();
                taskset(&["-p", "-c", "1", &tid]);
            }
            flood(&pool, &ctl)
        })
    };
    let _quit = FloodQuit(ctl.clone());
    let max = flood_max(kind);
    // R counts what it forwards from X to B (what the attacker put on B's link).
    let nft = |cmd: &str| must_testbed(&["exec", "r", "nft", cmd]);
    let _ = testbed(&["exec", "r", "nft", "delete table inet ft_attack"]);
    nft("add table inet ft_attack");
    nft("add chain inet ft_attack fromx { type filter hook forward priority -10 ; }");
    nft(r#"add rule inet ft_attack fromx iifname "rx" oifname "rb" counter"#);
    let stated = flood_rate();
    let writes = |n: u64| move |i: u64| (i < n).then_some((Op::Write, 1 << 20));
    let mut seed = 0x700;
    // One phase: the flow at `rate` of the flood; its statistics and the attacker's measured
    // frames per second over the phase.
    let mut phase = |rate: u64, n: u64| {
        let s0 = ctl.sent.load(Ordering::Acquire);
        let (a0, b0) = (p.a.io(), p.b.io());
        let cpu0 = cpu_by_thread();
        let t0 = Instant::now();
        ctl.rate.store(rate, Ordering::Release);
        seed += 1;
        let st = run_stream(&p, SLOTS, seed, &mut writes(n));
        ctl.rate.store(FLOOD_OFF, Ordering::Release);
        let fps = (ctl.sent.load(Ordering::Acquire) - s0) as f64 / t0.elapsed().as_secs_f64();
        let (a1, b1) = (p.a.io(), p.b.io());
        let cpu1 = cpu_by_thread();
        assert_eq!(st.messages, n);
        // What the backends did in the phase (GSO/GRO and drops explain the UDP backend's
        // figures).
        let io = PhaseIo {
            a_tx: a1.tx_frames - a0.tx_frames,
            a_tx_offloaded: a1.tx_offloaded - a0.tx_offloaded,
            b_rx: b1.rx_frames - b0.rx_frames,
            b_rx_coalesced: b1.rx_coalesced - b0.rx_coalesced,
            b_rx_dropped: b1.rx_dropped - b0.rx_dropped,
            cpu_ms_engines: (cpu1[0] - cpu0[0]) / 1_000_000,
            cpu_ms_attacker: (cpu1[1] - cpu0[1]) / 1_000_000,
            cpu_ms_other: (cpu1[2] - cpu0[2]) / 1_000_000,
            wall_ms: t0.elapsed().as_millis() as u64,
        };
        (st, fps, io)
    };
    // The counters from before the first hostile frame; the resident memory after a warm-up
    // of both paths (the flooder's TX ring, B's rings and queues).
    let before = p.b.dev_counters();
    let qb_before = p.b.qp_counters();
    let qa_before = p.a.qp_counters();
    let ud_before = p.b.nic.qp_counters(ud_qp).unwrap();
    let io_before = p.b.io();
    let links_before = path_drops();
    phase(FLOOD_OFF, 16);
    phase(stated, 16);
    phase(max, 16);
    phase(FLOOD_OFF, 16);
    let rss_before = rss_kib();
    // U (S U M U) x PAIRS: each flooded phase — at the stated rate (S) or as fast as X goes
    // (M) — between two undisturbed ones; the last undisturbed phase also carries everything
    // the flood sent to B before the counts are read.
    let (st, _, io) = phase(FLOOD_OFF, PHASE_WRITES);
    let mut undisturbed = vec![(st, io)];
    let mut flooded = Vec::new();
    for _ in 0..PAIRS {
        for rate in [stated, max] {
            let (st, fps, io) = phase(rate, PHASE_WRITES);
            flooded.push((rate, st, fps, io));
            let (st, _, io) = phase(FLOOD_OFF, PHASE_WRITES);
            undisturbed.push((st, io));
        }
    }
    ctl.quit.store(true, Ordering::Release);
    let n = join(flooder);
    let rate = |s: &StreamStats| s.bytes as f64 * 8.0 / s.secs.max(1e-9) / 1e6;
    // Everything sent before the last undisturbed phase has reached B; give a slow engine
    // thread its time to count (a hang guard, not a measurement).
    let want_total = n.frames();
    let t0 = Instant::now();
    let got = loop {
        let d = p.b.dev_counters();
        let qb = p.b.qp_counters();
        let ud = p.b.nic.qp_counters(ud_qp).unwrap();
        let seen = device_drops_since(&d, &before)
            + (qb.duplicates - qb_before.duplicates)
            + (qb.ghost_acks - qb_before.ghost_acks)
            + (ud.qkey_drops - ud_before.qkey_drops)
            + (ud.no_wqe_drops - ud_before.no_wqe_drops)
            + (qb.cnps_handled - qb_before.cnps_handled);
        let lost = p.b.io().rx_dropped - io_before.rx_dropped;
        // What B's kernel dropped (the UDP socket's filter, its buffer) never comes.
        let (path, filtered) = path_drops();
        let kernel = path - links_before.0 + filtered - links_before.1;
        if seen + lost + kernel >= want_total || t0.elapsed() > Duration::from_secs(5) {
            break d;
        }
        thread::sleep(Duration::from_millis(10));
    };
    let rss_after = rss_kib();
    let forwarded = nft("list chain inet ft_attack fromx")
        .split("packets ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse::<u64>().ok())
        .expect("R's forward counter");
    let _ = testbed(&["exec", "r", "nft", "delete table inet ft_attack"]);
    let (links_now, filtered_now) = path_drops();
    let links = links_now - links_before.0;
    // Hostile datagrams B's kernel dropped on the UDP socket's filter (`udp_filter`): the
    // runts, unknown QPNs, wrong P_Keys and wrong sources, which then never reach B's engine.
    let filtered = filtered_now - links_before.1;
    // Hostile frames that never reached B's backend: refused by X's kernel, not forwarded by
    // R, dropped by the veth towards B.
    let path_lost = n.tx_dropped + (want_total - n.tx_dropped).saturating_sub(forwarded) + links;
    let qb = qp_delta(&p.b.qp_counters(), &qb_before);
    let qa = qp_delta(&p.a.qp_counters(), &qa_before);
    let ud = qp_delta(&p.b.nic.qp_counters(ud_qp).unwrap(), &ud_before);
    let get = |v: &[(&str, u64)], k: &str| v.iter().find(|(n, _)| *n == k).unwrap().1;
    let ring_drops = p.b.io().rx_dropped - io_before.rx_dropped;
    let label = format!("{} hostile peer", kind.name());
    let mut by_rate: Vec<(String, Vec<f64>)> = Vec::new();
    for (i, (r, st, fps, io)) in flooded.iter().enumerate() {
        let ratio = rate(st) / ((rate(&undisturbed[i].0) + rate(&undisturbed[i + 1].0)) / 2.0);
        let what = if *r == FLOOD_MAX {
            "max".to_string()
        } else {
            format!("{r}/s")
        };
        println!(
            "{label}: undisturbed {:.0} / flooded ({what}: measured {fps:.0} frames/s) {:.0} / \
             undisturbed {:.0} Mbit/s: ratio {ratio:.3}",
            rate(&undisturbed[i].0),
            rate(st),
            rate(&undisturbed[i + 1].0)
        );
        println!(
            "{label}:   backends: undisturbed {:?} / flooded {io:?} / undisturbed {:?}",
            undisturbed[i].1,
            undisturbed[i + 1].1
        );
        match by_rate.iter_mut().find(|(w, _)| *w == what) {
            Some((_, v)) => v.push(ratio),
            None => by_rate.push((what, vec![ratio])),
        }
    }
    for (what, v) in &by_rate {
        println!("{label}: ratios at {what}: {v:.3?}");
    }
    println!(
        "{label}: flood {n:?}: {} frames, R forwarded {forwarded}, lost on the way {path_lost}; \
         B's backend dropped {ring_drops}; RSS {rss_before} -> {rss_after} KiB",
        n.frames(),
    );
    println!(
        "{label}: B's RC QP: {:?}",
        qb.iter().filter(|(_, v)| *v != 0).collect::<Vec<_>>()
    );
    println!(
        "{label}: B's UD QP: {:?}",
        ud.iter().filter(|(_, v)| *v != 0).collect::<Vec<_>>()
    );
    println!("{label}: {}", p.dump());
    // Nothing the flood aimed at was touched.
    let mut now = vec![0u8; PROT_LEN];
    p.b.mr.read(PROT_OFF, &mut now).unwrap();
    assert!(now == guard, "the protected bytes of B's region changed");
    // Only the answers IBTA allows: duplicates re-ACKed (or ignored), nothing else.
    for k in [
        "err_naks_sent",
        "rnr_naks_sent",
        "read_replays",
        "atomic_replays",
        "dup_refused",
        "mr_gone",
        "cnps_sent",
        "resp_queue_drops",
        "recv_completions",
    ] {
        assert_eq!(get(&qb, k), 0, "B's RC QP: {k}\n{}", p.dump());
    }
    assert_eq!(get(&ud, "tx_packets"), 0, "B's UD QP answered");
    assert_eq!(get(&ud, "recv_completions"), 0, "B's UD QP");
    assert_eq!(get(&qa, "err_naks_rcvd"), 0, "A's QP");
    assert_eq!(got.cq_overruns, 0);
    for (who, h) in [("A", &p.a), ("B", &p.b)] {
        let (state, _) = h.nic.query_qp(h.qp).unwrap();
        assert_eq!(state, QpState::Rts, "{who}'s RC QP after the flood");
    }
    use Hostile::*;
    let buckets = [
        (
            "malformed_drops",
            got.malformed_drops - before.malformed_drops,
            n.get(Runt),
        ),
        (
            "icrc_drops",
            got.icrc_drops - before.icrc_drops,
            n.get(BadIcrc),
        ),
        (
            "unknown_qp_drops",
            got.unknown_qp_drops - before.unknown_qp_drops,
            n.get(UnknownQp),
        ),
        (
            "header_drops",
            got.header_drops - before.header_drops,
            n.get(BadPkey),
        ),
        (
            "address_drops",
            got.address_drops - before.address_drops,
            n.get(WrongSource),
        ),
        ("duplicates", get(&qb, "duplicates"), n.get(Replayed)),
        ("ghost_acks", get(&qb, "ghost_acks"), n.get(ForgedNak)),
        ("qkey_drops", get(&ud, "qkey_drops"), n.get(WrongQkey)),
        ("no_wqe_drops", get(&ud, "no_wqe_drops"), n.get(NoWqe)),
        ("cnps_handled", get(&qb, "cnps_handled"), n.get(Cnp)),
    ];
    let ring_drops = ring_drops + path_lost;
    // The kinds the UDP socket's filter takes: with it, B's engine counts none of them and
    // the kernel's filter count is their sum.
    let filterable = [Runt, UnknownQp, BadPkey, WrongSource];
    let by_filter: u64 = filterable.iter().map(|&k| n.get(k)).sum();
    let buckets = buckets.map(|(k, have, want)| {
        let filtered_kind = [
            "malformed_drops",
            "unknown_qp_drops",
            "header_drops",
            "address_drops",
        ]
        .contains(&k);
        (
            k,
            have,
            if filtered > 0 && filtered_kind {
                0
            } else {
                want
            },
        )
    });
    println!("{label}: B's kernel filtered {filtered} (runts, unknown QPNs, P_Keys, sources sent: {by_filter})");
    if kind != BackendKind::Udp {
        assert_eq!(filtered, 0, "a filter count without the UDP socket");
    }
    if ring_drops == 0 {
        if filtered > 0 {
            assert_eq!(
                filtered,
                by_filter,
                "B's kernel filtered: flood {n:?}\n{}",
                p.dump()
            );
        }
        for (k, have, want) in buckets {
            assert_eq!(have, want, "{k}: flood {n:?}\n{}", p.dump());
        }
        assert_eq!(get(&qb, "seq_naks_sent"), 0, "no frame lost, no gap");
    } else {
        // Which frames B's ring lost is unknown (legitimate ones too: their retransmission is
        // the flow's business): no bucket above what was sent to it, and the frames missing
        // from all of them together no more than the ring lost.
        println!(
            "note: {ring_drops} frames lost on the way or by B's backend: counts checked as bounds"
        );
        assert!(
            filtered <= by_filter,
            "filtered {filtered} > {by_filter} sent"
        );
        let mut counted = filtered;
        for (k, have, want) in buckets {
            assert!(
                have <= want,
                "{k}: {have} > {want} sent: flood {n:?}\n{}",
                p.dump()
            );
            counted += have;
        }
        assert_missing_within_ring_drops(want_total, counted, ring_drops, || p.dump());
    }
    assert!(n.frames() > 0, "the flood sent nothing");
    assert!(
        rss_after <= rss_before + RSS_SLACK,
        "resident memory grew from {rss_before} to {rss_after} KiB over {} hostile frames",
        n.frames()
    );
    assert_no_drops(&p.a, "A");
}

#[test]
fn hostile_peer_af_packet() {
    require_root!("testbed_rc", NEEDS);
    hostile_peer(BackendKind::Packet);
}

#[test]
fn hostile_peer_udp_socket() {
    require_root!("testbed_rc", NEEDS);
    hostile_peer(BackendKind::Udp);
}

/// One of B's kernel UDP counters (`/proc/net/snmp` in B's namespace: `InErrors`,
/// `RcvbufErrors`, …).
fn b_udp_counter(name: &str) -> u64 {
    let snmp = Command::new("ip")
        .args([
            "netns",
            "exec",
            &format!("{PREFIX}b"),
            "cat",
            "/proc/net/snmp",
        ])
        .output()
        .expect("ip netns exec");
    let snmp = String::from_utf8_lossy(&snmp.stdout).into_owned();
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp: "));
    let (names, values) = (udp.next().unwrap_or(""), udp.next().unwrap_or(""));
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(k, _)| *k == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("Udp {name} in B's /proc/net/snmp: {snmp}"))
}

/// `taskset ARGS`, which must succeed.
fn taskset(args: &[&str]) {
    let out = Command::new("taskset")
        .args(args)
        .output()
        .expect("taskset (util-linux)");
    assert!(out.status.success(), "taskset {args:?}: {out:?}");
}

/// The flood's "maximum" phases: as fast as X goes on AF_PACKET; on the UDP-socket backend
/// at most `FERROCE_FLOOD_MAX` frames per second (default 100,000; 0: no cap). There one
/// socket queue serves every QP, and a flood faster than B's engine empties it drops A's
/// datagrams in B's kernel with the flood's: on a quiet host (2026-12-06) X uncapped made B's
/// kernel drop 15.7 M of 16.5 M datagrams (`RcvbufErrors`) and A's 1 MiB WRITE ran out of
/// retries (`RETRY_EXC_ERR`) in 3 runs of 3, and so did a cap of 300,000/s — a denial of
/// service no receiver on a shared socket can refuse, not a fault in what this test checks.
/// At 100,000/s: passed, flow ratios 0.14–0.28.
fn flood_max(kind: BackendKind) -> u64 {
    // An unoptimised build's engine takes a small fraction of the frames an optimised one
    // does: at the attacker's full rate over AF_PACKET, B's ring stayed full and the flow's
    // packets were lost until its retries ran out (RETRY_EXC_ERR, 3 runs of 3 as root in a
    // debug build). The isolation measured here is the optimised engine's (CI tests
    // --release); a debug build floods at the UDP socket's default cap instead.
    if cfg!(debug_assertions) && std::env::var_os("FERROCE_FLOOD_MAX").is_none() {
        println!("debug build: the flood's maximum is 100,000 frames/s (FERROCE_FLOOD_MAX)");
        return 100_000;
    }
    if kind != BackendKind::Udp {
        return FLOOD_MAX;
    }
    match std::env::var("FERROCE_FLOOD_MAX")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(0) => FLOOD_MAX,
        Some(r) => r,
        None => 100_000,
    }
}

/// The flood's stated rate, frames per second (`FERROCE_FLOOD_RATE`, default 20,000: some
/// 50 Mbit/s of these frames, a host's worth of junk on a 1 Gbit/s segment).
fn flood_rate() -> u64 {
    std::env::var("FERROCE_FLOOD_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&r| r != FLOOD_OFF && r != FLOOD_MAX)
        .unwrap_or(20_000)
}

/// Frames dropped so far on the way from X to B's backend that the hosts' counters would
/// not see — R's `rx` receive drops, R's `rb` transmit drops (the veth to B), B's `eth0`
/// receive drops, B's kernel UDP receive-buffer and checksum errors — and, apart, the
/// datagrams B's UDP socket filter dropped (the rest of B's `Udp InErrors`).
fn path_drops() -> (u64, u64) {
    let stat = |host: &str, dev: &str, dir: &str| -> u64 {
        let ns = format!("{PREFIX}{host}");
        let path = format!("/sys/class/net/{dev}/statistics/{dir}_dropped");
        let out = Command::new("ip")
            .args(["netns", "exec", &ns, "cat", &path])
            .output()
            .expect("ip netns exec");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{ns} {path}: {out:?}"))
    };
    let udp = b_udp_counter;
    // InErrors counts the buffer and checksum errors too, and the filter's drops.
    let (in_errors, rcvbuf, csum) = (udp("InErrors"), udp("RcvbufErrors"), udp("InCsumErrors"));
    let lost = rcvbuf + csum;
    (
        stat("r", "rx", "rx") + stat("r", "rb", "tx") + stat("b", "eth0", "rx") + lost,
        in_errors.saturating_sub(lost),
    )
}

// ---- 8: soak ---------------------------------------------------------------------------------

/// `FERROCE_SOAK_SECS` (default 600) of mixed traffic A → B — every operation at assorted
/// sizes, 8 in flight, every byte and every atomic result checked — with R dropping 1 % of
/// UDP 4791 both ways and both receive sides duplicating and reordering 1 % of frames. Rounds
/// of 64 MB until the time is up. Asserted: no stall (`run_stream`'s hang guard: no completion
/// for a minute fails), every message byte-exact and successful, every atomic executed once,
/// no drop counter but the ones loss explains (none: lost frames never arrive), both QPs in
/// RTS at the end, retransmissions and duplicates seen (the impairments were real), and the
/// process's resident memory at the end within 16 MiB of after the first round. Ignored by
/// default (ten minutes): `cargo test --release --test testbed_rc soak -- --ignored
/// --nocapture`.
#[test]
#[ignore]
fn soak_mixed_with_loss_af_packet() {
    require_root!("testbed_rc", NEEDS);
    const RSS_SLACK: u64 = 16 << 10;
    let secs: u64 = std::env::var("FERROCE_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let kind = BackendKind::Packet;
    let _bed = Bed::take(RAW);
    let faults = |seed| FaultConfig {
        duplicate: 0.01,
        reorder: 0.01,
        reorder_depth: 3,
        seed,
        ..FaultConfig::default()
    };
    let spec = |ns, psn, seed| Spec {
        wrap: Wrap::Faults(faults(seed)),
        ..plain(ns, kind, psn)
    };
    let p = connect(spec(NS_A, PSN_A, 0x5a), spec(NS_B, PSN_B, 0x5b));
    must_testbed(&["loss", "1"]);
    let t0 = Instant::now();
    let mut total = StreamStats::default();
    let mut rounds = 0u64;
    let mut rss_first = 0;
    while rounds == 0 || t0.elapsed() < Duration::from_secs(secs) {
        let st = run_stream(&p, SLOTS, 0x800 + rounds, &mut mixed(64 << 20));
        rounds += 1;
        total.messages += st.messages;
        total.bytes += st.bytes;
        total.secs += st.secs;
        if rounds == 1 {
            rss_first = rss_kib();
        }
        println!(
            "soak: round {rounds} at {:.0} s: {} messages, {:.1} MB, RSS {} KiB",
            t0.elapsed().as_secs_f64(),
            st.messages,
            st.bytes as f64 / 1e6,
            rss_kib()
        );
    }
    let rss_end = rss_kib();
    must_testbed(&["loss", "0"]);
    report(
        &format!("{} soak, {rounds} rounds", kind.name()),
        &p,
        &[("mixed, 1% loss, 1% dup, 1% reorder", total)],
    );
    println!("soak: RSS after round 1 {rss_first} KiB, at the end {rss_end} KiB");
    for (who, h) in [("A", &p.a), ("B", &p.b)] {
        let (state, _) = h.nic.query_qp(h.qp).unwrap();
        assert_eq!(state, QpState::Rts, "{who}'s QP after the soak");
    }
    assert_no_drops(&p.a, "A");
    assert_no_drops(&p.b, "B");
    let (qa, qb) = (p.a.qp_counters(), p.b.qp_counters());
    assert!(
        qa.retransmits > 0,
        "no retransmission under 1 % loss: {qa:?}"
    );
    assert!(qb.duplicates > 0, "B saw no duplicate: {qb:?}");
    assert_eq!(qb.resp_queue_drops, 0, "{qb:?}");
    assert!(
        rss_end <= rss_first + RSS_SLACK,
        "resident memory grew from {rss_first} to {rss_end} KiB over {rounds} rounds"
    );
}

// ---- 8: a peer that never ACKs -----------------------------------------------------------------

/// A peer that never acknowledges: R drops everything B sends to A (B receives and answers,
/// none of its answers arrive). A's two outstanding WRITEs (one packet each) are sent once;
/// each ACK timeout resends only the oldest outstanding WQE (the requester's recovery rule),
/// `retry_cnt` (7) times, and no more: the first completes with `RetryExcErr`, the second is
/// flushed, A's QP is in the error state. Counted, not timed: A's timeouts, retransmissions
/// and packets sent are exactly what the retry limit allows, B saw every copy (each one after
/// the first a duplicate) and R dropped every one of B's answers.
fn a_peer_that_never_acks(kind: BackendKind) {
    const RETRY_CNT: u64 = 7; // RcParams::default
    const WRS: u64 = 2;
    let _bed = Bed::for_backend(kind);
    let p = connect(plain(NS_A, kind, PSN_A), plain(NS_B, kind, PSN_B));
    let nft = |cmd: &str| must_testbed(&["exec", "r", "nft", cmd]);
    let _ = testbed(&["exec", "r", "nft", "delete table inet ft_silent"]);
    nft("add table inet ft_silent");
    nft("add chain inet ft_silent b2a { type filter hook forward priority -10 ; }");
    nft(r#"add rule inet ft_silent b2a iifname "rb" oifname "ra" udp dport 4791 counter drop"#);
    let (qa0, qb0) = (p.a.qp_counters(), p.b.qp_counters());
    for id in 0..WRS {
        let off = (id as usize) * 4096;
        let wr = SendWr::new(
            id,
            SendOp::RdmaWrite {
                remote_addr: p.b.mr.addr() + off as u64,
                rkey: p.b.mr.rkey(),
            },
            sgl(&p.a.mr, off, 256),
        );
        p.a.nic.post_send(p.a.qp, wr).unwrap();
    }
    // Both completions (the retries take (RETRY_CNT + 1) ACK timeouts; HANG is a guard).
    let t0 = Instant::now();
    let mut wcs = Vec::new();
    while (wcs.len() as u64) < WRS && t0.elapsed() < HANG {
        p.a.nic.wait_cq(p.a.cq, Duration::from_millis(50)).unwrap();
        p.a.nic.poll_cq(p.a.cq, &mut wcs, 16).unwrap();
    }
    let dropped = nft("list chain inet ft_silent b2a")
        .split("packets ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|t| t.parse::<u64>().ok())
        .expect("R's drop counter");
    let _ = testbed(&["exec", "r", "nft", "delete table inet ft_silent"]);
    let qa = qp_delta(&p.a.qp_counters(), &qa0);
    let qb = qp_delta(&p.b.qp_counters(), &qb0);
    let get = |v: &[(&str, u64)], k: &str| v.iter().find(|(n, _)| *n == k).unwrap().1;
    println!(
        "{} never-ACKing peer: A {:?}; B {:?}; R dropped {dropped} of B's packets; {wcs:?}",
        kind.name(),
        qa.iter().filter(|(_, v)| *v != 0).collect::<Vec<_>>(),
        qb.iter().filter(|(_, v)| *v != 0).collect::<Vec<_>>(),
    );
    let status: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        status,
        vec![(0, WcStatus::RetryExcErr), (1, WcStatus::WrFlushErr)],
        "{}",
        p.dump()
    );
    let (state, _) = p.a.nic.query_qp(p.a.qp).unwrap();
    assert_eq!(state, QpState::Err, "A's QP after the retries ran out");
    let sends = WRS + RETRY_CNT;
    assert_eq!(get(&qa, "timeouts"), RETRY_CNT + 1, "A's ACK timeouts");
    assert_eq!(get(&qa, "retransmits"), RETRY_CNT, "A's retransmissions");
    assert_eq!(
        get(&qa, "tx_packets"),
        sends,
        "A's packets: the retry limit bounds them"
    );
    assert_eq!(get(&qa, "rx_packets"), 0, "nothing from B reached A");
    assert_eq!(get(&qb, "rx_packets"), sends, "B saw every copy");
    assert_eq!(
        get(&qb, "duplicates"),
        RETRY_CNT,
        "every copy after the first"
    );
    assert_eq!(
        dropped,
        get(&qb, "tx_packets"),
        "R dropped each of B's answers"
    );
}

#[test]
fn a_peer_that_never_acks_af_packet() {
    require_root!("testbed_rc", NEEDS);
    a_peer_that_never_acks(BackendKind::Packet);
}

#[test]
fn a_peer_that_never_acks_udp_socket() {
    require_root!("testbed_rc", NEEDS);
    a_peer_that_never_acks(BackendKind::Udp);
}

// ---- 9: a peer that answers RNR for ever ---------------------------------------------------

/// An RNR storm: B's receive queue stays empty, so every SEND attempt gets an RNR NAK. With
/// the default `rnr_retry` 7 ("retry for ever", IBTA 9.7.5.2.8) A's SEND is resent after each
/// RNR wait, without end; after `STORM` RNR NAKs B posts a receive and the SEND completes.
/// Counted, not timed: every packet A sent after the first answered an RNR NAK or an ACK
/// timeout (one retransmission per wait, nothing else: the cost per QP is one packet per RNR
/// wait), B sent nothing but acknowledgements, the SEND completes once with its bytes, both
/// QPs stay in RTS.
fn an_rnr_storm(kind: BackendKind) {
    const STORM: u64 = 20;
    const LEN: usize = 256;
    let _bed = Bed::for_backend(kind);
    let p = connect(plain(NS_A, kind, PSN_A), plain(NS_B, kind, PSN_B));
    let data = pattern(LEN, 0x9999);
    p.a.mr.write(0, &data).unwrap();
    let (qa0, qb0) = (p.a.qp_counters(), p.b.qp_counters());
    p.a.nic
        .post_send(p.a.qp, SendWr::new(7, SendOp::Send, sgl(&p.a.mr, 0, LEN)))
        .unwrap();
    // The storm runs until A has taken STORM RNR NAKs (HANG is a guard).
    let t0 = Instant::now();
    while p.a.qp_counters().rnr_naks_rcvd - qa0.rnr_naks_rcvd < STORM && t0.elapsed() < HANG {
        thread::sleep(Duration::from_millis(2));
    }
    let recv_off = 64 << 10;
    p.b.nic
        .post_recv(
            p.b.qp,
            RecvWr {
                wr_id: 9,
                sg_list: sgl(&p.b.mr, recv_off, LEN).into(),
            },
        )
        .unwrap();
    let mut wcs = Vec::new();
    while wcs.is_empty() && t0.elapsed() < HANG {
        p.a.nic.wait_cq(p.a.cq, Duration::from_millis(50)).unwrap();
        p.a.nic.poll_cq(p.a.cq, &mut wcs, 16).unwrap();
    }
    let mut bwcs = Vec::new();
    while bwcs.is_empty() && t0.elapsed() < HANG {
        p.b.nic.wait_cq(p.b.cq, Duration::from_millis(50)).unwrap();
        p.b.nic.poll_cq(p.b.cq, &mut bwcs, 16).unwrap();
    }
    let qa = qp_delta(&p.a.qp_counters(), &qa0);
    let qb = qp_delta(&p.b.qp_counters(), &qb0);
    let get = |v: &[(&str, u64)], k: &str| v.iter().find(|(n, _)| *n == k).unwrap().1;
    println!(
        "{} RNR storm: A {:?}; B {:?}",
        kind.name(),
        qa.iter().filter(|(_, v)| *v != 0).collect::<Vec<_>>(),
        qb.iter().filter(|(_, v)| *v != 0).collect::<Vec<_>>(),
    );
    let status: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(status, vec![(7, WcStatus::Success)], "{}", p.dump());
    let bstatus: Vec<_> = bwcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(bstatus, vec![(9, WcStatus::Success)], "B's receive");
    let mut got = vec![0u8; LEN];
    p.b.mr.read(recv_off, &mut got).unwrap();
    assert!(got == data, "the SEND's bytes");
    for (who, h) in [("A", &p.a), ("B", &p.b)] {
        let (state, _) = h.nic.query_qp(h.qp).unwrap();
        assert_eq!(state, QpState::Rts, "{who}'s QP after the storm");
    }
    let rnr = get(&qa, "rnr_naks_rcvd");
    assert!(rnr >= STORM, "A took {rnr} RNR NAKs");
    assert!(
        rnr <= get(&qb, "rnr_naks_sent"),
        "A took more RNR NAKs than B sent"
    );
    assert_eq!(
        get(&qa, "retransmits"),
        rnr + get(&qa, "timeouts"),
        "one resend per RNR NAK or ACK timeout, no more"
    );
    assert_eq!(
        get(&qa, "tx_packets"),
        1 + get(&qa, "retransmits"),
        "A's packets"
    );
    assert_eq!(
        get(&qb, "tx_packets"),
        get(&qb, "acks_sent"),
        "B sent only acknowledgements"
    );
    assert_eq!(get(&qb, "recv_completions"), 1);
}

#[test]
fn an_rnr_storm_af_packet() {
    require_root!("testbed_rc", NEEDS);
    an_rnr_storm(BackendKind::Packet);
}

/// Ignored from 2026-12-04 to 12-05 after 1 run of 11 failed on the shared machine (A sent 25
/// packets, B's UDP backend received 18, nothing counted, A ended in `RetryExcErr`); on main
/// of 2026-12-05 it passed 24 of 24 (12 quiet, 12 under four CPU-bound loops), so it runs
/// again. A failure now prints the kernel's UDP counters of A, B and R with ferroce's
/// (`Pair::dump`): a datagram the kernel dropped shows there.
#[test]
fn an_rnr_storm_udp_socket() {
    require_root!("testbed_rc", NEEDS);
    an_rnr_storm(BackendKind::Udp);
}
