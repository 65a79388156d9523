//! The command-line tools' logic (`ferroce perf` and perftest's programs, the counters
//! `ferroce devinfo` shows), kept in the library so that it is tested like the rest;
//! `src/bin/ferroce.rs` only parses arguments.

use crate::apps::cc_csv;
use crate::apps::perf::args::{Invocation, PollArg};
use crate::apps::perf::{self, PerfError, Printer, Report, RunOutput};
use crate::io::backend::{self, BackendKind};
use crate::io::netdev::{self, Netdev};
use crate::io::{IoStats, PcapTap};
use crate::oob::perftest::{Role, Session, PORT};
use crate::runtime::{Nic, NicOptions, PollMode};
use crate::verbs::{DeviceConfig, DeviceCounters, Mtu, QpCounters};
use crate::wire::MacAddr;
use std::io::Write;
use std::net::{IpAddr, TcpStream};
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

/// Why a tool run failed (one line for the user).
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// `-d` names no interface.
    #[error("IB device {0:?} not found (ferroce's devices are network interfaces: -d eth0, or -d ferroce_eth0 as devinfo names it)")]
    NoDevice(String),
    /// No `-d` and no interface to default to.
    #[error("No IB devices found (no network interface other than lo has an IP address; name one with -d or FERROCE_DEV)")]
    NoDefaultDevice,
    /// The GID index asked for is not in the table.
    #[error("GID index {index} not in {dev}'s table ({len} entries)")]
    GidIndex {
        /// The index asked for.
        index: u8,
        /// The interface.
        dev: String,
        /// Entries in its GID table.
        len: usize,
    },
    /// The interface has no address to use as a GID.
    #[error("{0} has no IP address")]
    NoAddress(String),
    /// The packet backend could not be opened.
    #[error("{kind} backend on {dev}: {err}")]
    Backend {
        /// `xdp`, `packet` or `udp`.
        kind: &'static str,
        /// The interface.
        dev: String,
        /// Why.
        #[source]
        err: std::io::Error,
    },
    /// A file or socket operation failed.
    #[error("{what}: {err}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        err: std::io::Error,
    },
    /// The test itself failed.
    #[error(transparent)]
    Perf(#[from] PerfError),
    /// The out-of-band exchange failed.
    #[error(transparent)]
    Cm(#[from] crate::oob::CmError),
    /// A verb failed.
    #[error("verbs: {0}")]
    Verbs(#[from] crate::verbs::VerbsError),
    /// The test ended without a result.
    #[error("no results")]
    NoResults,
    /// The host could not be resolved (see [`crate::apps::addr`]).
    #[error(transparent)]
    Host(#[from] crate::apps::addr::HostError),
}

impl ToolError {
    fn io(what: impl Into<String>, err: std::io::Error) -> Self {
        ToolError::Io {
            what: what.into(),
            err,
        }
    }
}

/// The GID index to use: the given one, or the first IPv4 entry (the first IPv6 one with
/// `ipv6`), as perftest's `get_best_gid_index` picks it; index 0 when there is no such entry.
pub fn pick_gid(dev: &Netdev, want: Option<u8>) -> Result<u8, ToolError> {
    pick_gid_family(dev, want, false)
}

/// [`pick_gid`] with perftest's `--ipv6`.
pub fn pick_gid_family(dev: &Netdev, want: Option<u8>, ipv6: bool) -> Result<u8, ToolError> {
    match want {
        Some(i) if usize::from(i) < dev.gids.len() => Ok(i),
        Some(i) => Err(ToolError::GidIndex {
            index: i,
            dev: dev.name.clone(),
            len: dev.gids.len(),
        }),
        None => dev
            .gids
            .iter()
            .position(|g| g.is_ipv4() != ipv6)
            .or(if dev.gids.is_empty() { None } else { Some(0) })
            .map(|i| i as u8)
            .ok_or_else(|| ToolError::NoAddress(dev.name.clone())),
    }
}

/// The device `-d` names: a network interface, or `ferroce_<interface>` (devinfo's name).
/// Without `-d`: `$FERROCE_DEV`, else the first interface other than `lo` with an address, as
/// perftest takes the first device.
pub fn find_device(name: Option<&str>) -> Result<Netdev, ToolError> {
    let by_name = |n: &str| {
        netdev::netdev(n)
            .or_else(|e| match n.strip_prefix("ferroce_") {
                Some(m) => netdev::netdev(m),
                None => Err(e),
            })
            .map_err(|_| ToolError::NoDevice(n.to_string()))
    };
    match name {
        Some(n) => by_name(n),
        None => match std::env::var("FERROCE_DEV") {
            Ok(n) if !n.is_empty() => by_name(&n),
            _ => netdev::netdevs()
                .into_iter()
                .find(|d| d.name != "lo" && !d.gids.is_empty())
                .ok_or(ToolError::NoDefaultDevice),
        },
    }
}

/// perftest's `set_mtu`: `-m` (0: the port's active MTU) against the port. Returns the MTU
/// and what perftest prints about the choice (on standard output and standard error).
pub fn choose_mtu(user: i64, active: Mtu) -> (Mtu, Option<String>, Option<String>) {
    if user == 0 {
        return (active, None, None);
    }
    match u32::try_from(user).ok().and_then(Mtu::from_bytes) {
        Some(m) if m.bytes() > active.bytes() => (
            active,
            Some(format!(
                "Requested mtu is higher than active mtu \nChanging to active mtu - {}",
                active.to_ibv()
            )),
            None,
        ),
        Some(m) => (m, None, None),
        None => (
            active,
            None,
            Some(format!(
                " Invalid MTU - {user} \n Please choose mtu from {{256,512,1024,2048,4096}}\n Will run with the port active mtu - {}",
                active.to_ibv()
            )),
        ),
    }
}

/// Run a perftest test as `inv` says. Output goes to `out` (perftest's standard output) and
/// `err` (its standard error).
pub fn run_perf(
    inv: &Invocation,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), ToolError> {
    let wr = |e: std::io::Error| ToolError::io("writing the output", e);
    for n in &inv.notices {
        if !inv.json {
            writeln!(out, "{n}").map_err(wr)?;
        }
    }
    for w in &inv.warnings {
        writeln!(err, "{w}").map_err(wr)?;
    }
    inv.cfg.check_supported()?;
    let dev = find_device(inv.dev.as_deref())?;
    let gid_index = pick_gid_family(&dev, inv.gid_index, inv.ipv6)?;
    let local = dev.gids[usize::from(gid_index)];
    let mut cfg = inv.cfg.clone();
    cfg.gid_index = gid_index;
    let latency = !cfg.test.is_bw();
    let server = inv.host.is_none();
    let poll = match (inv.busy, inv.poll) {
        (true, _) | (_, PollArg::Busy) => Poll::Busy,
        (_, PollArg::Inline) => Poll::Inline,
        // read-lat's and atomic-lat's server has no application loop (the NIC answers the
        // requests alone): a busy-polling engine thread, as a NIC would answer them; on a
        // one-CPU host the inline engine's background thread, which sleeps in the packet
        // device (a spinning thread there holds the CPU the requests' way in needs).
        (_, PollArg::Auto)
            if server
                && matches!(cfg.test, perf::Test::ReadLat | perf::Test::AtomicLat)
                && !crate::runtime::single_cpu() =>
        {
            Poll::Busy
        }
        (_, PollArg::Auto) if latency => Poll::Inline,
        _ => Poll::Adaptive,
    };
    let ack_delay_us = inv.ack_delay_us.unwrap_or(if latency { 20 } else { 0 });
    // Latency tests (and the inline engine) receive without batching delays: AF_PACKET's
    // TPACKET_V3 block timer would hold each frame ~1 ms.
    let low_latency = poll == Poll::Inline || latency;
    let pkt = backend::open_with(inv.backend, &dev, local, low_latency).map_err(|e| {
        ToolError::Backend {
            kind: inv.backend.name(),
            dev: dev.name.clone(),
            err: e,
        }
    })?;
    // The port's active MTU: what the interface's MTU allows, and what the packet device's
    // frames hold (the NIC takes no larger path MTU: `DeviceConfig::max_mtu`).
    let active = netdev::ib_mtu_for(dev.mtu.unwrap_or(1500))
        .min(netdev::ib_mtu_for_frame(pkt.frame_capacity()));
    let (mtu, note, warn) = choose_mtu(inv.mtu, active);
    cfg.mtu = mtu;
    if let Some(n) = note {
        writeln!(out, "{n}").map_err(wr)?;
    }
    if let Some(w) = warn {
        writeln!(err, "{w}").map_err(wr)?;
    }
    let mut dcfg = DeviceConfig::new(dev.mac, local);
    dcfg.gids = dev.gids.clone();
    if cfg.exchange_rdma_cm {
        // RDMA-CM takes the path MTU from the port (and QP1 sends at it): the port's MTU
        // must fit the interface's frames.
        dcfg.port_mtu = mtu;
    }
    dcfg.cc = inv.cc.clone();
    dcfg.cnp_interval =
        (inv.cnp_interval_us > 0).then(|| crate::time::Duration::from_micros(inv.cnp_interval_us));
    dcfg.ack_delay = (ack_delay_us > 0).then(|| crate::time::Duration::from_micros(ack_delay_us));
    dcfg.fast_recovery = inv.fast_recovery;
    dcfg.selective_repeat = inv.selective_repeat;
    if let Some(n) = inv.max_inflight {
        dcfg.max_inflight = n;
    }
    dcfg.line_rate_bps = (inv.line_gbps.max(0.001) * 1e9) as u64;
    // perftest's largest inline size (its -I limit).
    dcfg.max_inline = dcfg.max_inline.max(912);
    let opts = NicOptions {
        poll: match poll {
            Poll::Busy => PollMode::Busy,
            Poll::Inline => PollMode::Inline,
            Poll::Adaptive => PollMode::Adaptive {
                // On one CPU the engine thread's spinning would keep the test's thread (and
                // the kernel's receive path) off it: sleep at once.
                spins: if crate::runtime::single_cpu() {
                    0
                } else {
                    2000
                },
                max_sleep: Duration::from_millis(1),
            },
        },
        batch: 64,
    };
    let nic = match &inv.pcap {
        Some(p) => {
            let f =
                std::fs::File::create(p).map_err(|e| ToolError::io(p.display().to_string(), e))?;
            let tap = PcapTap::new(pkt, std::io::BufWriter::new(f))
                .map_err(|e| ToolError::io(p.display().to_string(), std::io::Error::other(e)))?;
            Nic::start(dcfg, tap, opts)
        }
        None => Nic::start(dcfg, pkt, opts),
    }
    .map_err(|e| ToolError::io("starting the NIC", e))?;
    let nic = std::sync::Arc::new(nic);
    let udp = inv.backend == BackendKind::Udp;
    let ifname = dev.name.clone();
    let resolve = move |ip: IpAddr| -> Option<MacAddr> {
        if udp {
            Some(MacAddr::ZERO) // the kernel resolves and builds the Ethernet header
        } else {
            netdev::resolve(ip, Some(&ifname), Duration::from_secs(2))
        }
    };
    let r = perf_session(inv, &cfg, &dev, &nic, &resolve, out);
    // The counters say what the engine saw, also before a failure.
    let (dc, qc, io) = nic.counters();
    let res = match r {
        Ok(o) => o,
        Err(e) => {
            if !inv.json {
                writeln!(out, "{}", counters_line(&dc, &qc, &io)).ok();
            }
            if let Ok(n) = std::sync::Arc::try_unwrap(nic) {
                n.shutdown();
            }
            return Err(e);
        }
    };
    if inv.json {
        let v = serde_json::json!({ "test": format!("{:?}", cfg.test), "backend": inv.backend.name(), "device": nic.describe(),
            "mtu": res.mtu.bytes(), "report": res.report, "verify": res.verify, "device_counters": dc, "qp_counters": qc, "io": io });
        writeln!(out, "{v}").map_err(wr)?;
    } else {
        if cfg.verify {
            let line = match &res.verify {
                Some(v) => format!(
                    " verify: ok: {} messages, {} bytes compared byte for byte with {}",
                    v.messages, v.bytes, v.against
                ),
                None if matches!(cfg.test, perf::Test::WriteBw | perf::Test::SendBw)
                    && (cfg.duplex || inv.host.is_some() != cfg.reversed) =>
                {
                    format!(" verify: sent pattern seed={:#x} (message q of QP q; check the payloads in a capture)", cfg.verify_seed)
                }
                None => " verify: nothing to check in this role".to_string(),
            };
            writeln!(out, "{line}").map_err(wr)?;
        }
        writeln!(out, " ferroce: {} on {}", nic.describe(), dev.name).map_err(wr)?;
        writeln!(
            out,
            "{} ce_rcvd={} cnps_sent={} cnps_handled={} cc={}",
            counters_line(&dc, &qc, &io),
            qc.ce_rcvd,
            qc.cnps_sent,
            qc.cnps_handled,
            inv.cc.name()
        )
        .map_err(wr)?;
    }
    if inv.wait_destroy > 0 {
        std::thread::sleep(Duration::from_secs(u64::from(inv.wait_destroy)));
    }
    let empty = match &res.report {
        Report::Bw(v) => v.is_empty(),
        Report::Lat(v) => v.is_empty() && inv.host.is_some(),
        Report::LatDuration(v) => v.is_empty() && inv.host.is_some(),
    };
    if let Ok(n) = std::sync::Arc::try_unwrap(nic) {
        n.shutdown();
    }
    if empty && !matches!(cfg.test, perf::Test::ReadLat | perf::Test::AtomicLat) {
        return Err(ToolError::NoResults);
    }
    Ok(())
}

/// The control connection, the test, and the threads that sample counters while it runs.
fn perf_session(
    inv: &Invocation,
    cfg: &perf::PerfConfig,
    dev: &Netdev,
    nic: &std::sync::Arc<Nic>,
    resolve: &dyn Fn(IpAddr) -> Option<MacAddr>,
    out: &mut dyn Write,
) -> Result<RunOutput, ToolError> {
    let role = if inv.host.is_some() {
        Role::Client
    } else {
        Role::Server
    };
    let banner = |out: &mut dyn Write| {
        if !inv.json && cfg.output == perf::Output::Full {
            writeln!(out, "\n************************************\n* Waiting for client to connect... *\n************************************").ok();
            out.flush().ok();
        }
    };
    let mut ses = if cfg.exchange_rdma_cm {
        // perftest -R and -z: the exchange over an RDMA-CM connected QP, no TCP.
        let host = match &inv.host {
            Some(h) => Some(crate::apps::addr::resolve_host(h, inv.port).map_err(ToolError::Host)?),
            None => {
                banner(out);
                None
            }
        };
        let resolver = crate::runtime::cm::KernelResolver {
            ifname: dev.name.clone(),
            gids: dev.gids.clone(),
            udp: inv.backend == BackendKind::Udp,
            local: Some(dev.gids[usize::from(cfg.gid_index)]),
        };
        let link = crate::apps::perf::rdma_cm::RdmaLink::open(
            nic,
            dev.mac,
            Box::new(resolver),
            host,
            inv.port,
            cfg.retry_count,
            cfg.timeout,
            cfg.rdma_cm && cfg.connection == perf::Connection::Ud,
        )?;
        Session::new_rdma(Box::new(link), role, cfg.timeout)
    } else {
        match &inv.host {
            None => {
                let l = crate::oob::listen(inv.bind, inv.port).map_err(|e| {
                    ToolError::io(format!("Couldn't listen to port {}", inv.port), e)
                })?;
                banner(out);
                // The first client that sends a valid version message; one that stalls or
                // sends garbage is dropped (also later in the handshake), never the run.
                let mut acc = crate::oob::perftest::acceptor(l, cfg.timeout);
                let s = crate::oob::perftest::accept_client(&mut acc).map_err(|e| {
                    ToolError::io("accept() failed", std::io::Error::other(e.to_string()))
                })?;
                Session::new(s, role, cfg.timeout).with_acceptor(acc)
            }
            Some(h) => Session::new(connect(h, inv.port)?, role, cfg.timeout),
        }
    };
    let sampling = std::sync::atomic::AtomicBool::new(inv.cc_csv.is_some());
    let mut samples: Vec<String> = Vec::new();
    // What `ferroce stat` and `ferroce devinfo` show of this NIC.
    nic.set_name(&format!("ferroce_{}", dev.name));
    nic.set_label(&format!("ferroce perf: {}", cfg.test.title()));
    let mut sink = std::io::sink();
    let mut pr = Printer {
        out: if inv.json { &mut sink } else { out },
        device: inv.dev.clone().unwrap_or_else(|| dev.name.clone()),
    };
    let res = std::thread::scope(|sc| {
        let sampler = inv.cc_csv.as_ref().map(|_| {
            sc.spawn(|| {
                let mut rows = Vec::new();
                while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                    let (_, v) = nic.cc_snapshot();
                    let t = unix_now();
                    for (q, rate, alpha, cnps, ce) in v {
                        rows.push(cc_csv::row(t, q.get(), rate, alpha, cnps, ce));
                    }
                    std::thread::sleep(inv.cc_sample);
                }
                rows
            })
        });
        let r = perf::run_with(nic, cfg, &mut ses, resolve, &mut pr);
        sampling.store(false, std::sync::atomic::Ordering::Relaxed);
        if let Some(h) = sampler {
            samples = h.join().unwrap_or_default();
        }
        r
    });
    if let Some(p) = &inv.cc_csv {
        let mut text = format!("{}\n", cc_csv::HEADER);
        for r in &samples {
            text.push_str(r);
            text.push('\n');
        }
        std::fs::write(p, text).map_err(|e| ToolError::io(p.display().to_string(), e))?;
    }
    Ok(res?)
}

/// Connect to a server, retrying for a few seconds (it may not listen yet).
pub fn connect(host: &str, port: u16) -> Result<TcpStream, ToolError> {
    let addr = crate::apps::addr::resolve_host(host, port).map_err(ToolError::Host)?;
    let mut last = None;
    for _ in 0..50 {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(c) => return Ok(c),
            Err(e) => {
                last = Some(e);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    Err(ToolError::io(
        format!("Couldn't connect to {host}:{port}"),
        last.unwrap_or_else(|| std::io::Error::other("no attempt")),
    ))
}

/// The live counters of the ferroce processes running on `dev` in this namespace, as
/// `ferroce devinfo` prints them below the device (one `counters:` line per NIC, then its
/// QP totals, device and I/O counters), or a line saying there is none. From the NICs' own
/// sockets ([`crate::runtime::stat`]), as `ferroce stat` finds them.
pub(crate) fn live_counter_lines(dev: &str) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let mine = crate::runtime::stat::discover();
    let name = format!("ferroce_{dev}");
    let netns = netns_id();
    let live: Vec<_> = mine
        .iter()
        .filter(|n| n.name == name && n.netns == netns)
        .collect();
    if live.is_empty() {
        let _ = writeln!(s, "\t\t\tcounters:\t\tno ferroce process running on {dev}");
    }
    let kv = |v: &[(String, u64)]| -> String {
        let w: Vec<String> = v.iter().map(|(k, n)| format!("{k}={n}")).collect();
        w.join(" ")
    };
    for n in live {
        let what = if n.label.is_empty() {
            &n.comm
        } else {
            &n.label
        };
        let _ = writeln!(
            s,
            "\t\t\tcounters:\t\tpid {} ({what}, {}, up {:.1} s)",
            n.pid, n.backend, n.uptime_s
        );
        let totals = crate::apps::stat::qp_totals(n);
        for (key, v) in [
            ("qp_counters", &totals),
            ("device_counters", &n.device),
            ("io", &n.io),
        ] {
            let _ = writeln!(s, "\t\t\t  {key}: {}", kv(v));
        }
    }
    s
}

/// perf's ` counters:` line (the part printed after a failure too; see `tools/interop-rxe`).
fn counters_line(dc: &DeviceCounters, qc: &QpCounters, io: &IoStats) -> String {
    format!(" counters: tx_packets={} rx_packets={} retransmits={} timeouts={} probes={} seq_naks_sent={} seq_naks_rcvd={} rnr_naks_sent={} rnr_naks_rcvd={} duplicates={} icrc_drops={} malformed_drops={} unknown_qp_drops={} io_tx={} io_rx={} io_tx_dropped={} io_rx_dropped={} io_tx_offloaded={} io_rx_coalesced={}",
        qc.tx_packets, qc.rx_packets, qc.retransmits, qc.timeouts, qc.probes, qc.seq_naks_sent, qc.seq_naks_rcvd, qc.rnr_naks_sent, qc.rnr_naks_rcvd, qc.duplicates, dc.icrc_drops, dc.malformed_drops, dc.unknown_qp_drops, io.tx_frames, io.rx_frames, io.tx_dropped, io.rx_dropped, io.tx_offloaded, io.rx_coalesced)
}

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

/// The perftest port.
pub const DEFAULT_PORT: u16 = PORT;
