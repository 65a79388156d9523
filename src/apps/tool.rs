//! The command-line tools' logic (`ferroce perf`, `ferroce pingpong`), kept in the library so
//! that it is tested like the rest; `src/bin/ferroce.rs` only parses arguments.

use crate::apps::cc_csv;
use crate::apps::perf::{self, PerfConfig, Report};
use crate::io::backend::{self, BackendKind};
use crate::io::netdev::{self, Netdev};
use crate::io::{IoStats, PcapTap};
use crate::oob::perftest::{Role, Session, PORT};
use crate::runtime::{Nic, NicOptions, PollMode};
use crate::verbs::{gid_of, DeviceConfig};
use crate::verbs::{DeviceCounters, QpCounters};
use crate::wire::MacAddr;
use std::io::Write;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

/// How the NIC runtime polls (see [`PollMode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Poll {
    /// An engine thread that spins, then sleeps.
    #[default]
    Adaptive,
    /// An engine thread that never sleeps.
    Busy,
    /// The application's thread drives the engine ([`PollMode::Inline`]).
    Inline,
}

/// Options of `ferroce perf` beyond the test parameters.
#[derive(Clone, Debug)]
pub struct PerfRun {
    pub cfg: PerfConfig,
    /// Server when `None`.
    pub host: Option<String>,
    pub port: u16,
    pub dev: String,
    pub backend: BackendKind,
    /// GID index (`-x`); `None`: the first IPv4 GID.
    pub gid_index: Option<u8>,
    pub pcap: Option<PathBuf>,
    pub poll: Poll,
    pub json: bool,
    /// Congestion control of our QPs (DCQCN reaction point) and the notification point's
    /// CNP interval (None: send no CNPs).
    pub cc: crate::cc::CcConfig,
    pub cnp_interval: Option<Duration>,
    /// Delayed ACK (see [`DeviceConfig::ack_delay`]).
    pub ack_delay: Option<Duration>,
    /// The port's line rate for DCQCN (bits/s).
    pub line_rate_bps: u64,
    /// Write every QP's rate, α, CNPs handled and CE marks received as CSV here, sampled
    /// every `cc_sample` during the test.
    pub cc_csv: Option<PathBuf>,
    pub cc_sample: Duration,
}

/// The GID index to use: the given one, or the first IPv4 entry.
pub fn pick_gid(dev: &Netdev, want: Option<u8>) -> Result<u8, String> {
    match want {
        Some(i) if usize::from(i) < dev.gids.len() => Ok(i),
        Some(i) => Err(format!(
            "GID index {i} not in {}'s table ({} entries)",
            dev.name,
            dev.gids.len()
        )),
        None => dev
            .gids
            .iter()
            .position(|g| g.is_ipv4())
            .or(if dev.gids.is_empty() { None } else { Some(0) })
            .map(|i| i as u8)
            .ok_or_else(|| format!("{} has no IP address", dev.name)),
    }
}

/// Run `ferroce perf`. Output goes to `out`; the error is a one-line message.
pub fn run_perf(o: &PerfRun, out: &mut dyn Write) -> Result<(), String> {
    let dev = netdev::netdev(&o.dev).map_err(|e| e.to_string())?;
    let gid_index = pick_gid(&dev, o.gid_index)?;
    let local = dev.gids[usize::from(gid_index)];
    let mut cfg = o.cfg.clone();
    cfg.gid_index = gid_index;
    let link_mtu = netdev::ib_mtu_for(dev.mtu.unwrap_or(1500));
    if cfg.mtu.bytes() > link_mtu.bytes() {
        cfg.mtu = link_mtu;
    }
    // Latency tests (and the inline engine) receive without batching delays: AF_PACKET's
    // TPACKET_V3 block timer would hold each frame ~1 ms.
    let low_latency = o.poll == Poll::Inline || !o.cfg.test.is_bw();
    let pkt = backend::open_with(o.backend, &dev, local, low_latency)
        .map_err(|e| format!("{} backend on {}: {e}", o.backend.name(), dev.name))?;
    let mut dcfg = DeviceConfig::new(dev.mac, local);
    dcfg.gids = dev.gids.clone();
    dcfg.cc = o.cc.clone();
    dcfg.cnp_interval = o.cnp_interval;
    dcfg.ack_delay = o.ack_delay;
    dcfg.line_rate_bps = o.line_rate_bps;
    let opts = NicOptions {
        poll: match o.poll {
            Poll::Busy => PollMode::Busy,
            Poll::Inline => PollMode::Inline,
            Poll::Adaptive => PollMode::Adaptive {
                spins: 2000,
                max_sleep: Duration::from_millis(1),
            },
        },
        batch: 64,
    };
    let nic = match &o.pcap {
        Some(p) => {
            let f = std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?;
            let tap = PcapTap::new(pkt, std::io::BufWriter::new(f)).map_err(|e| e.to_string())?;
            Nic::start(dcfg, tap, opts)
        }
        None => Nic::start(dcfg, pkt, opts),
    }
    .map_err(|e| format!("starting the NIC: {e}"))?;
    let udp = o.backend == BackendKind::Udp;
    let ifname = dev.name.clone();
    let resolve = move |ip: IpAddr| -> Option<MacAddr> {
        if udp {
            Some(MacAddr::ZERO) // the kernel resolves and builds the Ethernet header
        } else {
            netdev::resolve(ip, Some(&ifname), Duration::from_secs(2))
        }
    };
    let stream = match &o.host {
        None => {
            let l = TcpListener::bind(("::", o.port))
                .or_else(|_| TcpListener::bind(("0.0.0.0", o.port)))
                .map_err(|e| format!("listen on port {}: {e}", o.port))?;
            writeln!(out, "\n************************************\n* Waiting for client to connect... *\n************************************").ok();
            l.accept().map_err(|e| e.to_string())?.0
        }
        Some(h) => {
            let addr = crate::apps::addr::resolve_host(h, o.port)?;
            let mut last = None;
            let mut s = None;
            for _ in 0..50 {
                match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                    Ok(c) => {
                        s = Some(c);
                        break;
                    }
                    Err(e) => {
                        last = Some(e);
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
            s.ok_or_else(|| {
                format!(
                    "connect to {addr}: {}",
                    last.map(|e| e.to_string()).unwrap_or_default()
                )
            })?
        }
    };
    let role = if o.host.is_some() {
        Role::Client
    } else {
        Role::Server
    };
    let mut ses = Session::new(stream, role, cfg.timeout);
    let sampling = std::sync::atomic::AtomicBool::new(o.cc_csv.is_some());
    let mut samples: Vec<String> = Vec::new();
    let publishing = std::sync::atomic::AtomicBool::new(true);
    let stats_path =
        std::path::Path::new(STATS_DIR).join(format!("{}-{}.json", dev.name, std::process::id()));
    let what = format!("ferroce perf: {}", cfg.test.title());
    let res = std::thread::scope(|sc| {
        // Publish the counters for `ferroce devinfo` (best effort: skipped where /run is not
        // writable).
        let publisher = sc.spawn(|| {
            let ok = std::fs::create_dir_all(STATS_DIR).is_ok();
            while ok && publishing.load(std::sync::atomic::Ordering::Relaxed) {
                if publish_stats(&nic, &stats_path, &dev.name, &what).is_err() {
                    break;
                }
                for _ in 0..20 {
                    if !publishing.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            let _ = std::fs::remove_file(&stats_path);
        });
        let sampler = o.cc_csv.as_ref().map(|_| {
            sc.spawn(|| {
                let mut rows = Vec::new();
                while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                    let (_, v) = nic.cc_snapshot();
                    let t = unix_now();
                    for (q, rate, alpha, cnps, ce) in v {
                        rows.push(cc_csv::row(t, q.get(), rate, alpha, cnps, ce));
                    }
                    std::thread::sleep(o.cc_sample);
                }
                rows
            })
        });
        let r = perf::run(&nic, &cfg, &mut ses, &resolve);
        sampling.store(false, std::sync::atomic::Ordering::Relaxed);
        publishing.store(false, std::sync::atomic::Ordering::Relaxed);
        let _ = publisher.join();
        if let Some(h) = sampler {
            samples = h.join().unwrap_or_default();
        }
        r
    });
    if let Some(p) = &o.cc_csv {
        let mut text = format!("{}\n", cc_csv::HEADER);
        for r in &samples {
            text.push_str(r);
            text.push('\n');
        }
        std::fs::write(p, text).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let (report, ours, theirs, verify) = match res {
        Ok(r) => r,
        Err(e) => {
            // The counters say what the engine saw before the failure.
            let (dc, qc, io) = nic.counters();
            writeln!(out, "{}", counters_line(&dc, &qc, &io)).ok();
            nic.shutdown();
            return Err(e.to_string());
        }
    };
    let (dc, qc, io) = nic.counters();
    if o.json {
        let v = serde_json::json!({ "test": format!("{:?}", cfg.test), "backend": o.backend.name(), "device": nic.describe(),
            "mtu": cfg.mtu.bytes(), "report": report, "verify": verify, "device_counters": dc, "qp_counters": qc, "io": io });
        writeln!(out, "{v}").ok();
    } else {
        let bar = "---------------------------------------------------------------------------------------";
        writeln!(out, "{bar}\n                    {}\n Device         : {} ({})\n Number of qps   : {}\t\tTransport type : IB\n Connection type : RC\t\tUsing SRQ      : OFF\n TX depth        : {}\n Mtu             : {}[B]\n Link type       : Ethernet\n GID index       : {gid_index}\n Data ex. method : Ethernet\n{bar}",
            if cfg.cmp_swap && cfg.test == perf::Test::AtomicBw { "Atomic CMP_AND_SWAP BW Test" } else { cfg.test.title() }, dev.name, nic.describe(), ours.len(), cfg.tx_depth, cfg.mtu.bytes()).ok();
        for l in perf::address_lines(&ours, &theirs) {
            writeln!(out, "{l}").ok();
        }
        writeln!(out, "{bar}\n{}", perf::header(&cfg)).ok();
        for l in perf::lines(&report) {
            writeln!(out, "{l}").ok();
        }
        writeln!(out, "{bar}").ok();
        if cfg.verify {
            match &verify {
                Some(v) => writeln!(out, " verify: ok: {} messages, {} bytes compared byte for byte with {}", v.messages, v.bytes, v.against).ok(),
                None if role == Role::Client && matches!(cfg.test, perf::Test::WriteBw | perf::Test::SendBw) => writeln!(out, " verify: sent pattern seed={:#x} (message q of QP q; check the payloads in a capture)", cfg.verify_seed).ok(),
                None => writeln!(out, " verify: nothing to check in this role").ok(),
            };
        }
        writeln!(
            out,
            "{} ce_rcvd={} cnps_sent={} cnps_handled={} cc={}",
            counters_line(&dc, &qc, &io),
            qc.ce_rcvd,
            qc.cnps_sent,
            qc.cnps_handled,
            o.cc.name()
        )
        .ok();
    }
    let empty = matches!(&report, Report::Bw(v) if v.is_empty())
        || matches!(&report, Report::Lat(v) if v.is_empty() && role == Role::Client);
    nic.shutdown();
    if empty {
        return Err("no results".into());
    }
    Ok(())
}

/// The live counters of the `ferroce perf` processes running on `dev` in this namespace, as
/// `ferroce devinfo` prints them below the device (one `counters:` line per process, then its
/// QP, device and I/O counters), or a line saying there is none.
pub(crate) fn live_counter_lines(dev: &str) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let live = live_counters(dev);
    if live.is_empty() {
        let _ = writeln!(s, "\t\t\tcounters:\t\tno ferroce process running on {dev}");
    }
    for j in live {
        let age = unix_now() - j["updated_unix"].as_f64().unwrap_or(0.0);
        let _ = writeln!(
            s,
            "\t\t\tcounters:\t\tpid {} ({}, {}, {age:.1} s ago)",
            j["pid"],
            j["tool"].as_str().unwrap_or("?"),
            j["backend"].as_str().unwrap_or("?")
        );
        for key in ["qp_counters", "device_counters", "io"] {
            if let Some(m) = j[key].as_object() {
                let kv: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let _ = writeln!(s, "\t\t\t  {key}: {}", kv.join(" "));
            }
        }
    }
    s
}

/// perf's ` counters:` line (the part printed after a failure too; see `tools/interop-rxe`).
fn counters_line(dc: &DeviceCounters, qc: &QpCounters, io: &IoStats) -> String {
    format!(" counters: tx_packets={} rx_packets={} retransmits={} timeouts={} seq_naks_sent={} seq_naks_rcvd={} rnr_naks_sent={} rnr_naks_rcvd={} duplicates={} icrc_drops={} malformed_drops={} unknown_qp_drops={} io_tx={} io_rx={} io_tx_dropped={} io_rx_dropped={} io_tx_offloaded={} io_rx_coalesced={}",
        qc.tx_packets, qc.rx_packets, qc.retransmits, qc.timeouts, qc.seq_naks_sent, qc.seq_naks_rcvd, qc.rnr_naks_sent, qc.rnr_naks_rcvd, qc.duplicates, dc.icrc_drops, dc.malformed_drops, dc.unknown_qp_drops, io.tx_frames, io.rx_frames, io.tx_dropped, io.rx_dropped, io.tx_offloaded, io.rx_coalesced)
}

/// Where running `ferroce perf` processes publish their counters (one JSON file per process,
/// `<netdev>-<pid>.json`, rewritten every second, removed at exit): `ferroce devinfo` shows
/// them, like `rdma stat` shows a kernel RNIC's.
pub const STATS_DIR: &str = "/run/ferroce";

/// This process's network namespace (`net:[inode]`): interface names repeat across
/// namespaces, so devinfo shows only the counters of processes in its own.
fn netns_id() -> String {
    std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn publish_stats(nic: &Nic, path: &std::path::Path, dev: &str, what: &str) -> std::io::Result<()> {
    let (dc, qc, io) = nic.counters();
    let v = serde_json::json!({ "pid": std::process::id(), "netns": netns_id(), "dev": dev,
        "tool": what, "backend": nic.describe(), "updated_unix": unix_now(),
        "device_counters": dc, "qp_counters": qc, "io": io });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, v.to_string())?;
    std::fs::rename(&tmp, path)
}

/// The counters published by running ferroce processes on `dev` in this namespace.
fn live_counters(dev: &str) -> Vec<serde_json::Value> {
    let mine = netns_id();
    let Ok(rd) = std::fs::read_dir(STATS_DIR) else {
        return Vec::new();
    };
    let mut v: Vec<serde_json::Value> = rd
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .filter(|j| j["dev"] == dev && j["netns"] == mine.as_str())
        .filter(|j| {
            j["pid"]
                .as_u64()
                .is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
        })
        .collect();
    v.sort_by_key(|j| j["pid"].as_u64());
    v
}

/// The perftest port.
pub const DEFAULT_PORT: u16 = PORT;

/// Options of `ferroce pingpong` (the flags of `ibv_rc_pingpong`).
#[derive(Clone, Debug)]
pub struct PingpongRun {
    pub host: Option<String>,
    pub port: u16,
    pub dev: String,
    pub backend: BackendKind,
    /// `-g`: GID index (default: the first IPv4 GID).
    pub gid_index: Option<u8>,
    /// `-m`
    pub mtu: crate::verbs::Mtu,
    /// `-s`
    pub size: u32,
    /// `-r`
    pub rx_depth: u32,
    /// `-n`
    pub iters: u64,
    /// `-l`: service level (carried for compatibility; RoCE maps it to the traffic class).
    pub sl: u8,
    /// `-e`: sleep on completion events instead of busy polling.
    pub events: bool,
    /// `-c`: validate received buffers.
    pub validate: bool,
    /// Check every byte of every echo (see `ferroce pingpong --verify`).
    pub verify: bool,
    pub verify_seed: u64,
    pub pcap: Option<PathBuf>,
    pub timeout: Duration,
}

const PAGE: usize = 4096;
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

/// Run `ferroce pingpong`, compatible on the wire and in its output with `ibv_rc_pingpong`.
pub fn run_pingpong(o: &PingpongRun, out: &mut dyn Write) -> Result<(), String> {
    use crate::oob::pingpong::{self as pp, Dest};
    use crate::verbs::{AccessFlags, QpCap};
    use crate::verbs::{RcParams, RecvWr, RemoteQp, SendOp, SendWr, Sge, WcStatus};
    use crate::wire::QpNumber;
    let dev = netdev::netdev(&o.dev).map_err(|e| e.to_string())?;
    let gid_index = pick_gid(&dev, o.gid_index)?;
    let local = dev.gids[usize::from(gid_index)];
    // Ping-pong is a latency test: the application's thread drives the engine (no thread
    // hand-off), and AF_PACKET receives without the ring's batching delay.
    let pkt = backend::open_with(o.backend, &dev, local, true)
        .map_err(|e| format!("{} backend on {}: {e}", o.backend.name(), dev.name))?;
    let mut dcfg = DeviceConfig::new(dev.mac, local);
    dcfg.gids = dev.gids.clone();
    let opts = NicOptions {
        poll: PollMode::Inline,
        batch: 64,
    };
    let nic = match &o.pcap {
        Some(p) => {
            let f = std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?;
            Nic::start(
                dcfg,
                PcapTap::new(pkt, std::io::BufWriter::new(f)).map_err(|e| e.to_string())?,
                opts,
            )
        }
        None => Nic::start(dcfg, pkt, opts),
    }
    .map_err(|e| e.to_string())?;
    let size = o.size as usize;
    let pd = nic.alloc_pd();
    let cq = nic
        .create_cq(o.rx_depth as usize + 1)
        .map_err(|e| e.to_string())?;
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: o.rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = crate::runtime::create_rc_qp(&nic, pd, cq, cap).map_err(|e| e.to_string())?;
    // As rc_pingpong: the QP goes to INIT at creation, so that the receives can be posted
    // before the exchange.
    crate::apps::perf::qp_to_init(&nic, qp, AccessFlags::empty())
        .map_err(|e| format!("Failed to modify QP to INIT: {e}"))?;
    let mr = nic
        .reg_mr(pd, size.max(1), AccessFlags::LOCAL_WRITE)
        .map_err(|e| e.to_string())?;
    // As rc_pingpong: the buffer is filled with 0x7b; with -c the first byte of each page is
    // set to `page index % sizeof(char)`, which is 0, and checked on every receive.
    mr.fill(0x7b);
    if o.validate {
        for i in (0..size).step_by(PAGE) {
            mr.write(i, &[0]).map_err(|e| e.to_string())?;
        }
    }
    let psn = ((std::process::id().wrapping_mul(2_654_435_761)) ^ 0x5a5a5a) & 0xff_ffff;
    let gid = gid_of(local);
    let ours = Dest {
        lid: 0,
        qpn: qp.get(),
        psn,
        gid,
    };
    let ifname = dev.name.clone();
    let udp = o.backend == BackendKind::Udp;
    let connect = |t: &Dest| -> Result<(), String> {
        let ip = crate::verbs::ip_of_gid(t.gid);
        let mac = if udp {
            Some(MacAddr::ZERO)
        } else {
            netdev::resolve(ip, Some(&ifname), Duration::from_secs(2))
        };
        let mac = mac.ok_or_else(|| format!("cannot resolve the MAC address of {ip}"))?;
        let p = RcParams {
            mtu: o.mtu,
            access: AccessFlags::empty(),
            sgid_index: gid_index,
            local_psn: psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            traffic_class: 0,
        };
        nic.connect_rc(
            qp,
            &RemoteQp {
                qpn: QpNumber::new(t.qpn),
                gid: t.gid,
                mac,
                psn: t.psn,
            },
            &p,
        )
        .map_err(|e| format!("Failed to modify QP: {e}"))
    };
    let mut posted_recv = 0u32;
    for _ in 0..o.rx_depth {
        nic.post_recv(
            qp,
            RecvWr {
                wr_id: RECV_WRID,
                sg_list: vec![Sge {
                    addr: mr.addr(),
                    length: o.size,
                    lkey: mr.lkey(),
                }],
            },
        )
        .map_err(|e| format!("Couldn't post receive: {e}"))?;
        posted_recv += 1;
    }
    let fmt_dest = |d: &Dest| {
        format!(
            "LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            d.lid,
            d.qpn,
            d.psn,
            crate::verbs::ip_of_gid(d.gid)
        )
    };
    writeln!(out, "  local address:  {}", fmt_dest(&ours)).ok();
    let theirs = match &o.host {
        None => {
            let l = TcpListener::bind(("::", o.port))
                .or_else(|_| TcpListener::bind(("0.0.0.0", o.port)))
                .map_err(|e| format!("Couldn't listen to port {}: {e}", o.port))?;
            let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
            let theirs = pp::server_exchange(&mut s, &ours, o.timeout, |t| {
                connect(t).map_err(|e| crate::oob::CmError::Malformed {
                    what: "connection",
                    detail: e,
                })
            })
            .map_err(|e| format!("Couldn't get remote LID: {e}"))?;
            pp::wait_done(&mut s, o.timeout).map_err(|e| e.to_string())?;
            theirs
        }
        Some(h) => {
            let addr = crate::apps::addr::resolve_host(h, o.port)?;
            let mut s = None;
            for _ in 0..50 {
                if let Ok(c) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                    s = Some(c);
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let mut s = s.ok_or_else(|| format!("Couldn't connect to {h}:{}", o.port))?;
            let theirs = pp::client_exchange(&mut s, &ours, o.timeout)
                .map_err(|e| format!("Couldn't get remote LID: {e}"))?;
            pp::send_done(&mut s).map_err(|e| e.to_string())?;
            connect(&theirs)?;
            theirs
        }
    };
    writeln!(out, "  remote address: {}", fmt_dest(&theirs)).ok();
    let send = |nic: &Nic| {
        nic.post_send(
            qp,
            SendWr::new(
                SEND_WRID,
                SendOp::Send,
                vec![Sge {
                    addr: mr.addr(),
                    length: o.size,
                    lkey: mr.lkey(),
                }],
            ),
        )
    };
    // --verify: message k that we send is pattern k; the peer echoes it, so receive k (client)
    // or k+1 (server: receive 0 is the client's initial buffer) must equal it.
    let mut verified = 0u64;
    let mut sent_msgs = 0u64;
    let initial: Vec<u8> = {
        let mut v = vec![0x7bu8; size];
        if o.validate {
            for i in (0..size).step_by(PAGE) {
                v[i] = 0;
            }
        }
        v
    };
    let fill_next = |k: u64| -> Result<(), String> {
        if o.verify {
            let p = crate::apps::pattern::expected(size, o.verify_seed, k, true);
            mr.write(0, &p).map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    let check_echo = |r: u64| -> Result<(), String> {
        let (want, what) = if o.host.is_none() && r == 0 {
            (
                initial.clone(),
                "the client's first message (ibv_rc_pingpong's initial buffer)".to_string(),
            )
        } else {
            let k = if o.host.is_none() { r - 1 } else { r };
            (
                crate::apps::pattern::expected(size, o.verify_seed, k, true),
                format!("the echo of our message {k}"),
            )
        };
        let got = mr.to_vec();
        match crate::apps::pattern::first_mismatch(&got[..size], &want) {
            None => Ok(()),
            Some((at, g, w, n)) => Err(format!(
                "verify: receive {r}, {what}: {n} of {size} bytes differ, the first at byte {at}: got {g:#04x}, expected {w:#04x}"
            )),
        }
    };
    let mut pending = RECV_WRID;
    let t0 = std::time::Instant::now();
    if o.host.is_some() {
        fill_next(sent_msgs)?;
        sent_msgs += 1;
        send(&nic).map_err(|e| format!("Couldn't post send: {e}"))?;
        pending |= SEND_WRID;
    }
    let (mut rcnt, mut scnt) = (0u64, 0u64);
    let mut wcs = Vec::new();
    let mut last = std::time::Instant::now();
    while rcnt < o.iters || scnt < o.iters {
        wcs.clear();
        if o.events {
            nic.wait_cq(cq, Duration::from_millis(100))
                .map_err(|e| e.to_string())?;
        }
        nic.poll_cq(cq, &mut wcs, 2).map_err(|e| e.to_string())?;
        if wcs.is_empty() {
            let idle = last.elapsed();
            if idle > o.timeout {
                return Err(format!(
                    "no completion for {:?} (received {rcnt}, sent {scnt})",
                    o.timeout
                ));
            }
            // Busy-poll as rc_pingpong does, but only briefly: a thread that spins for ever
            // starves the engine when cores are scarce (see perf::SPIN_BEFORE_SLEEP).
            if idle < Duration::from_micros(50) {
                std::hint::spin_loop();
            } else {
                nic.wait_cq(cq, Duration::from_millis(1))
                    .map_err(|e| e.to_string())?;
            }
            continue;
        }
        last = std::time::Instant::now();
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "Failed status {} ({}) for wr_id {}",
                    wc.status, wc.status as u32, wc.wr_id
                ));
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    posted_recv -= 1;
                    if posted_recv <= 1 {
                        while posted_recv < o.rx_depth {
                            nic.post_recv(
                                qp,
                                RecvWr {
                                    wr_id: RECV_WRID,
                                    sg_list: vec![Sge {
                                        addr: mr.addr(),
                                        length: o.size,
                                        lkey: mr.lkey(),
                                    }],
                                },
                            )
                            .map_err(|e| format!("Couldn't post receive: {e}"))?;
                            posted_recv += 1;
                        }
                    }
                    if o.verify {
                        check_echo(rcnt)?;
                        verified += 1;
                    }
                    if o.validate {
                        for i in (0..size).step_by(PAGE) {
                            let mut b = [0u8];
                            mr.read(i, &mut b).map_err(|e| e.to_string())?;
                            if b[0] != 0 {
                                return Err(format!(
                                    "invalid data in page {} of received buffer",
                                    i / PAGE
                                ));
                            }
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending &= !wc.wr_id;
            if scnt < o.iters && pending == 0 {
                fill_next(sent_msgs)?;
                sent_msgs += 1;
                send(&nic).map_err(|e| format!("Couldn't post send: {e}"))?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let usec = t0.elapsed().as_micros().max(1) as f64;
    let bytes = o.size as u64 * o.iters * 2;
    writeln!(
        out,
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    )
    .ok();
    writeln!(
        out,
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        o.iters,
        usec / 1e6,
        usec / o.iters as f64
    )
    .ok();
    if o.verify {
        writeln!(
            out,
            "verify: ok: {verified} received messages of {size} bytes equal what was expected byte for byte (pattern seed {:#x})",
            o.verify_seed
        )
        .ok();
    }
    // Let the last ACKs leave before the engine stops.
    std::thread::sleep(Duration::from_millis(50));
    nic.shutdown();
    Ok(())
}
