//! `ferroce demo`: two ferroce devices in one process, joined by the in-memory loopback
//! backend (no root, no setup), run a short write-bw, read-bw and send-lat with perftest's
//! out-of-band exchange over 127.0.0.1, print perftest-style results and the counters, write
//! a capture and run `inspect` over it, then say what to do next.
//!
//! The capture keeps every frame of the latency test and the first [`BW_CAPTURE_FRAMES`]
//! frames of each bandwidth test (a few MB instead of the ~670 MB of every frame;
//! [`DemoOptions::full_capture`] keeps them all). It never replaces a file silently: the
//! default name, [`DEFAULT_CAPTURE`], moves on to the next free `ferroce-demo-N.pcap`, and an
//! explicit path that exists is refused unless [`DemoOptions::overwrite`] says otherwise.

use crate::apps::perf::{self, PerfConfig, PerfError, Report, Test};
use crate::io::{Loopback, PcapTap};
use crate::oob::perftest::{Role, Session};
use crate::pcap::capture::CaptureError;
use crate::runtime::{Nic, NicOptions, PollMode};
use crate::verbs::DeviceConfig;
use crate::verbs::Mtu;
use crate::wire::MacAddr;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};

/// What the demo measured.
pub struct DemoResult {
    /// Each test's results (the client's side).
    pub reports: Vec<(Test, Report)>,
    /// RoCE packets in the capture.
    pub capture_packets: u64,
    /// Whether `inspect` found every packet of the capture well formed with a good ICRC.
    pub capture_clean: bool,
    /// Where the capture went.
    pub capture_path: PathBuf,
    /// Its size in bytes.
    pub capture_bytes: u64,
}

/// How to run the demo.
#[derive(Clone, Debug, Default)]
pub struct DemoOptions {
    /// Where to write the capture; `None`: [`DEFAULT_CAPTURE`] in the current directory, or
    /// the next free `ferroce-demo-N.pcap` if it exists.
    pub pcap: Option<PathBuf>,
    /// Replace `pcap` if it exists (otherwise the demo refuses to start).
    pub overwrite: bool,
    /// Record every frame of the bandwidth tests too (hundreds of MB).
    pub full_capture: bool,
    /// Fewer iterations (500 instead of 5000).
    pub quick: bool,
}

/// Why the demo could not run (one line for the user).
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The capture file given exists and `overwrite` is not set.
    #[error("{} exists; not replacing it (give another --pcap, or add --overwrite)", .0.display())]
    CaptureExists(PathBuf),
    /// Every default capture name is taken.
    #[error("{DEFAULT_CAPTURE} and ferroce-demo-2.pcap .. ferroce-demo-999.pcap all exist here; give --pcap FILE")]
    NoFreeName,
    /// A file could not be created or opened.
    #[error("{}: {err}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        err: std::io::Error,
    },
    /// The `ip` command could not be run.
    #[error("running ip: {0} (install iproute2)")]
    NoIpCommand(#[source] std::io::Error),
    /// An `ip` command failed.
    #[error("ip {args}: {stderr}")]
    Ip {
        /// Its arguments.
        args: String,
        /// What it said.
        stderr: String,
    },
    /// Setting up a device, a namespace or a socket failed.
    #[error("{what}: {err}")]
    Setup {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        err: std::io::Error,
    },
    /// The namespace's interface has no IPv4 address.
    #[error("{0} has no IPv4 address")]
    NoIpv4(String),
    /// One side of a test failed.
    #[error("{test}: {side}: {err}")]
    Test {
        /// The test's title.
        test: &'static str,
        /// `client` or `server`.
        side: &'static str,
        /// Why.
        #[source]
        err: Box<DemoError>,
    },
    /// The test itself failed.
    #[error(transparent)]
    Perf(#[from] PerfError),
    /// The server ended before it listened.
    #[error("the server thread ended before it listened")]
    NoServer,
    /// A thread panicked.
    #[error("{0} thread panicked")]
    Panicked(&'static str),
    /// The capture could not be written or read back.
    #[error("the capture: {0}")]
    Capture(#[from] CaptureError),
    /// Writing the output failed.
    #[error("{0}")]
    Write(#[from] std::io::Error),
}

impl DemoError {
    fn setup(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DemoError {
        let what = what.into();
        move |err| DemoError::Setup { what, err }
    }
}

/// The capture's name when none is given.
pub const DEFAULT_CAPTURE: &str = "ferroce-demo.pcap";

/// Frames of each bandwidth test kept in the capture by default (device A's, both
/// directions): with 64 KiB messages at MTU 4096, about the first 30 messages.
pub const BW_CAPTURE_FRAMES: u64 = 512;

/// Create the capture file without replacing anything unasked: the path and, when the default
/// name was taken, a sentence saying which name was used instead.
fn create_capture(o: &DemoOptions) -> Result<(std::fs::File, PathBuf, Option<String>), DemoError> {
    use std::fs::OpenOptions;
    use std::io::ErrorKind;
    if let Some(p) = &o.pcap {
        let r = if o.overwrite {
            std::fs::File::create(p)
        } else {
            OpenOptions::new().write(true).create_new(true).open(p)
        };
        return match r {
            Ok(f) => Ok((f, p.clone(), None)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                Err(DemoError::CaptureExists(p.clone()))
            }
            Err(err) => Err(DemoError::File {
                path: p.clone(),
                err,
            }),
        };
    }
    for n in 1..=999u32 {
        let p = if n == 1 {
            PathBuf::from(DEFAULT_CAPTURE)
        } else {
            PathBuf::from(format!("ferroce-demo-{n}.pcap"))
        };
        match OpenOptions::new().write(true).create_new(true).open(&p) {
            Ok(f) => {
                let note = (n > 1).then(|| {
                    format!(
                        "{DEFAULT_CAPTURE} exists (left as it is): this run's capture goes to {}",
                        p.display()
                    )
                });
                return Ok((f, p, note));
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(err) => return Err(DemoError::File { path: p, err }),
        }
    }
    Err(DemoError::NoFreeName)
}

/// The capture's budget and what each test left in it.
struct Capture {
    budget: crate::io::PcapBudget,
    full: bool,
    /// Per test: frames recorded, frames left out.
    per_test: Vec<(Test, u64, u64)>,
}

impl Capture {
    fn new(full: bool) -> Self {
        Capture {
            budget: crate::io::PcapBudget::new(None),
            full,
            per_test: Vec::new(),
        }
    }
    fn start(&self, test: Test) {
        self.budget
            .reset((test.is_bw() && !self.full).then_some(BW_CAPTURE_FRAMES));
    }
    fn end(&mut self, test: Test) {
        let (kept, left) = self.budget.counts();
        self.per_test.push((test, kept, left));
    }
}

const MAC_A: MacAddr = MacAddr([0x02, 0xfe, 0, 0, 0, 1]);
const MAC_B: MacAddr = MacAddr([0x02, 0xfe, 0, 0, 0, 2]);

fn ip(i: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, i))
}

/// One capture file written by several taps in turn (the demo's two phases).
#[derive(Clone)]
struct SharedFile(std::sync::Arc<std::sync::Mutex<std::io::BufWriter<std::fs::File>>>);

impl Write for SharedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).flush()
    }
}

/// Drops the first `skip` bytes written: a second tap's pcap file header (24 bytes), so that
/// its frames continue the first tap's file.
struct SkipHeader<W> {
    w: W,
    skip: usize,
}

impl<W: Write> Write for SkipHeader<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.skip.min(buf.len());
        self.skip -= k;
        if k == buf.len() {
            return Ok(k);
        }
        Ok(k + self.w.write(&buf[k..])?)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }
}

/// Length of a pcap file header.
const PCAP_HEADER_LEN: usize = 24;

/// Run the demo, writing the human-readable output to `out` and the capture to `pcap`.
///
/// Two phases, each with its own pair of devices over a fresh loopback pair, as `ferroce perf`
/// would run them: the bandwidth tests with an engine thread per device (it pipelines), the
/// latency test with the test threads driving the engines (`PollMode::Inline`) and a 20 µs
/// delayed ACK. Device A's frames of both phases go to the one capture.
pub fn run(out: &mut dyn Write, o: &DemoOptions) -> Result<DemoResult, DemoError> {
    let (f, pcap, note) = create_capture(o)?;
    if let Some(n) = note {
        writeln!(out, "{n}")?;
    }
    let quick = o.quick;
    let mut cap = Capture::new(o.full_capture);
    let file = SharedFile(std::sync::Arc::new(std::sync::Mutex::new(
        std::io::BufWriter::new(f),
    )));
    // Bandwidth: the engines sleep when idle (woken by packets or doorbells) so that the test
    // threads can spin on this machine's cores.
    let threads = NicOptions {
        poll: PollMode::Adaptive {
            spins: 200,
            max_sleep: std::time::Duration::from_millis(1),
        },
        batch: 64,
    };
    let inline = NicOptions {
        poll: PollMode::Inline,
        batch: 64,
    };
    let resolve = |addr: IpAddr| {
        if addr == ip(1) {
            Some(MAC_A)
        } else if addr == ip(2) {
            Some(MAC_B)
        } else {
            None
        }
    };
    let phases: [(&[Test], NicOptions, Option<std::time::Duration>); 2] = [
        (&[Test::WriteBw, Test::ReadBw], threads, None),
        (
            &[Test::SendLat],
            inline,
            Some(std::time::Duration::from_micros(20)),
        ),
    ];
    let mut reports = Vec::new();
    // A: tx, rx, retransmits, seq NAKs, RNR NAKs, ACKs received, ICRC drops; B: tx, rx,
    // duplicates, ACKs sent; A's loopback device: frames sent, received.
    let mut c = [0u64; 13];
    for (k, (tests, opts, ack_delay)) in phases.into_iter().enumerate() {
        let (la, lb) = Loopback::pair(8192, 9000).map_err(DemoError::setup("loopback pair"))?;
        let skip = if k == 0 { 0 } else { PCAP_HEADER_LEN };
        let tap = PcapTap::with_budget(
            la,
            SkipHeader {
                w: file.clone(),
                skip,
            },
            cap.budget.clone(),
        )?;
        let mut ca = DeviceConfig::new(MAC_A, ip(1));
        let mut cb = DeviceConfig::new(MAC_B, ip(2));
        ca.ack_delay = ack_delay;
        cb.ack_delay = ack_delay;
        let a = Nic::start(ca, tap, opts).map_err(DemoError::setup("starting device A"))?;
        let b = Nic::start(cb, lb, opts).map_err(DemoError::setup("starting device B"))?;
        if k == 0 {
            writeln!(out, "ferroce demo: two devices (10.0.0.1 {} and 10.0.0.2 {}) over the in-memory loopback backend", a.describe(), b.describe())?;
        }
        reports.extend(run_tests(
            out,
            (&a, &b),
            &resolve,
            quick,
            None,
            tests,
            &mut cap,
        )?);
        let (da, qa, ia) = a.counters();
        let (_, qb, _) = b.counters();
        for (x, v) in c.iter_mut().zip([
            qa.tx_packets,
            qa.rx_packets,
            qa.retransmits,
            qa.seq_naks_rcvd,
            qa.rnr_naks_rcvd,
            qa.acks_rcvd,
            da.icrc_drops,
            qb.tx_packets,
            qb.rx_packets,
            qb.duplicates,
            qb.acks_sent,
            ia.tx_frames,
            ia.rx_frames,
        ]) {
            *x += v;
        }
        a.shutdown();
        b.shutdown();
    }
    rule(out)?;
    file.clone().flush()?;
    writeln!(
        out,
        "counters A: tx_packets={} rx_packets={} retransmits={} seq_naks={} rnr_naks={} acks_rcvd={} icrc_drops={} | B: tx_packets={} rx_packets={} duplicates={} acks_sent={}",
        c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10]
    )?;
    writeln!(
        out,
        "loopback device A: {} frames sent, {} received",
        c[11], c[12]
    )?;
    check_capture(out, &pcap, reports, &cap)
}

/// The three tests, server on `b`, client on `a`. With `ns`, the control connection's sockets
/// are made in the namespaces (B listens on 10.99.0.2, A connects to it).
fn run_tests(
    out: &mut dyn Write,
    (a, b): (&Nic, &Nic),
    resolve: &(dyn Fn(IpAddr) -> Option<MacAddr> + Sync),
    quick: bool,
    ns: Option<(&[String; 2], u8)>,
    tests: &[Test],
    cap: &mut Capture,
) -> Result<Vec<(Test, Report)>, DemoError> {
    // Across namespaces: the namespace names and the GID index of the IPv4 address.
    let (ns, gid_index) = match ns {
        Some((n, g)) => (Some(n), g),
        None => (None, 0),
    };
    let iters = if quick { 500 } else { 5000 };
    let mut reports = Vec::new();
    for &test in tests {
        let size = if test.is_bw() { 65536 } else { 2 };
        let cfg = PerfConfig {
            test,
            size,
            iters,
            mtu: Mtu::M4096,
            report_gbits: true,
            progress: false,
            gid_index,
            ..PerfConfig::default()
        };
        let cfg = &cfg;
        cap.start(test);
        let (server, client) = std::thread::scope(|s| {
            let (ptx, prx) = std::sync::mpsc::channel::<Result<u16, DemoError>>();
            let srv = s.spawn(move || -> Result<Report, DemoError> {
                if let Some(ns) = ns {
                    crate::io::enter_netns(&ns[1])
                        .map_err(DemoError::setup(format!("entering {}", ns[1])))?;
                }
                let host = if ns.is_some() {
                    "10.99.0.2"
                } else {
                    "127.0.0.1"
                };
                let what = format!("listening on {host}");
                let l = match TcpListener::bind((host, 0)) {
                    Ok(l) => l,
                    Err(e) => {
                        // The client learns it from the server's result.
                        let _ = ptx.send(Err(DemoError::NoServer));
                        return Err(DemoError::setup(what)(e));
                    }
                };
                let _ = ptx.send(
                    l.local_addr()
                        .map(|a| a.port())
                        .map_err(DemoError::setup(what)),
                );
                let (st, _) = l.accept().map_err(DemoError::setup("accept"))?;
                let mut ses = Session::new(st, Role::Server, cfg.timeout);
                Ok(perf::run(b, cfg, &mut ses, resolve)?.0)
            });
            let cli = s
                .spawn(move || -> Result<Report, DemoError> {
                    let port = prx.recv().map_err(|_| DemoError::NoServer)??;
                    if let Some(ns) = ns {
                        crate::io::enter_netns(&ns[0])
                            .map_err(DemoError::setup(format!("entering {}", ns[0])))?;
                    }
                    let host = if ns.is_some() {
                        "10.99.0.2"
                    } else {
                        "127.0.0.1"
                    };
                    let st = TcpStream::connect((host, port))
                        .map_err(DemoError::setup(format!("connecting to {host}:{port}")))?;
                    let mut ses = Session::new(st, Role::Client, cfg.timeout);
                    Ok(perf::run(a, cfg, &mut ses, resolve)?.0)
                })
                .join()
                .unwrap_or(Err(DemoError::Panicked("client")));
            (
                srv.join().unwrap_or(Err(DemoError::Panicked("server"))),
                cli,
            )
        });
        cap.end(test);
        let side = |side: &'static str| {
            move |e: DemoError| DemoError::Test {
                test: test.title(),
                side,
                err: Box::new(e),
            }
        };
        let client = match (client, server) {
            (Ok(c), Ok(_)) => c,
            // The server's own error says why it never listened.
            (Err(DemoError::NoServer), Err(e)) | (Ok(_), Err(e)) => return Err(side("server")(e)),
            (Err(e), _) => return Err(side("client")(e)),
        };
        writeln!(out, "---------------------------------------------------------------------------------------")?;
        writeln!(
            out,
            "                    {}  (ferroce <-> ferroce, MTU 4096)",
            test.title()
        )?;
        writeln!(out, "{}", perf::header(cfg))?;
        for line in perf::lines(&client) {
            writeln!(out, "{line}")?;
        }
        reports.push((test, client));
    }
    Ok(reports)
}

fn rule(out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "---------------------------------------------------------------------------------------"
    )
}

/// Run inspect over the capture, say what it holds and what to do next.
fn check_capture(
    out: &mut dyn Write,
    pcap: &Path,
    reports: Vec<(Test, Report)>,
    cap: &Capture,
) -> Result<DemoResult, DemoError> {
    let f = std::fs::File::open(pcap).map_err(|err| DemoError::File {
        path: pcap.to_path_buf(),
        err,
    })?;
    let bytes = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut sum = crate::apps::inspect::Summary {
        file: pcap.display().to_string(),
        ..Default::default()
    };
    for fr in crate::pcap::capture::open(std::io::BufReader::new(f))? {
        let fr = fr?;
        sum.add(&crate::apps::inspect::analyse(&fr));
    }
    let shown = std::fs::canonicalize(pcap).unwrap_or_else(|_| pcap.to_path_buf());
    writeln!(
        out,
        "capture: {} ({}, {} frames that device A sent and received)",
        shown.display(),
        human_bytes(bytes),
        cap.per_test.iter().map(|t| t.1).sum::<u64>()
    )?;
    let parts: Vec<String> = cap
        .per_test
        .iter()
        .map(|&(t, kept, left)| {
            if left == 0 {
                format!("{}: all {kept} frames", test_name(t))
            } else {
                format!(
                    "{}: the first {kept} of {} frames",
                    test_name(t),
                    kept + left
                )
            }
        })
        .collect();
    let more = if cap.full {
        ""
    } else {
        " (--full-capture keeps every frame)"
    };
    writeln!(out, "  {}{more}", parts.join("; "))?;
    writeln!(out, "checked by ferroce inspect: {}", sum.line())?;
    let p = pcap.display();
    writeln!(out, "next:")?;
    writeln!(
        out,
        "  wireshark {p}            decodes RoCE v2 (UDP 4791) as InfiniBand; shows the ICRC, does not check it"
    )?;
    writeln!(
        out,
        "  ferroce inspect {p}      one line per packet, every ICRC checked (-v: every field)"
    )?;
    writeln!(
        out,
        "  the same test across two hosts (or against perftest's ib_write_bw on either side):"
    )?;
    writeln!(
        out,
        "    host B: ferroce perf write-bw -d IFACE --backend udp          (xdp or packet with root)"
    )?;
    writeln!(
        out,
        "    host A: ferroce perf write-bw ADDRESS_OF_B -d IFACE --backend udp --pcap a.pcap"
    )?;
    Ok(DemoResult {
        reports,
        capture_packets: sum.roce_packets,
        capture_clean: sum.clean() && sum.roce_packets > 0,
        capture_path: pcap.to_path_buf(),
        capture_bytes: bytes,
    })
}

/// The command-line name of a test (`write-bw`).
fn test_name(t: Test) -> &'static str {
    match t {
        Test::WriteBw => "write-bw",
        Test::ReadBw => "read-bw",
        Test::SendBw => "send-bw",
        Test::AtomicBw => "atomic-bw",
        Test::SendLat => "send-lat",
        Test::WriteLat => "write-lat",
        Test::ReadLat => "read-lat",
        Test::AtomicLat => "atomic-lat",
    }
}

/// `1234567` → `1.2 MB (1234567 bytes)`.
fn human_bytes(b: u64) -> String {
    let (v, unit) = match b {
        0..=9_999 => return format!("{b} bytes"),
        10_000..=999_999 => (b as f64 / 1e3, "kB"),
        _ => (b as f64 / 1e6, "MB"),
    };
    format!("{v:.1} {unit} ({b} bytes)")
}

/// Two network namespaces joined by a veth pair, removed on drop.
struct NetnsPair {
    names: [String; 2],
}

fn run_ip(args: &[&str]) -> Result<(), DemoError> {
    let o = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(DemoError::NoIpCommand)?;
    if o.status.success() {
        Ok(())
    } else {
        Err(DemoError::Ip {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&o.stderr).trim().to_string(),
        })
    }
}

impl NetnsPair {
    fn new() -> Result<NetnsPair, DemoError> {
        let tag = std::process::id() % 100_000;
        let names = [
            format!("ferroce-demo-a{tag}"),
            format!("ferroce-demo-b{tag}"),
        ];
        let me = NetnsPair {
            names: names.clone(),
        };
        for n in &names {
            run_ip(&["netns", "add", n])?;
            run_ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
        run_ip(&[
            "link", "add", "fdemo0", "netns", &names[0], "type", "veth", "peer", "name", "fdemo1",
            "netns", &names[1],
        ])?;
        for (i, n) in names.iter().enumerate() {
            let dev = format!("fdemo{i}");
            let mac = format!("02:fe:de:00:00:0{}", i + 1);
            run_ip(&[
                "-n", n, "link", "set", &dev, "address", &mac, "mtu", "9000", "up",
            ])?;
            run_ip(&[
                "-n",
                n,
                "addr",
                "add",
                &format!("10.99.0.{}/24", i + 1),
                "dev",
                &dev,
            ])?;
        }
        Ok(me)
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = run_ip(&["netns", "del", n]);
        }
    }
}

/// `ferroce demo --netns`: the same tests between two network namespaces joined by a veth pair
/// (MTU 9000, path MTU 4096), each side an AF_XDP device. Needs root.
pub fn run_netns(out: &mut dyn Write, o: &DemoOptions) -> Result<DemoResult, DemoError> {
    use crate::io::netdev;
    use crate::io::xdp::{XdpDevice, XdpOptions};
    let (file, pcap, note) = create_capture(o)?;
    if let Some(n) = note {
        writeln!(out, "{n}")?;
    }
    let mut cap = Capture::new(o.full_capture);
    let ns = NetnsPair::new()?;
    let (tx_a, rx_a) = std::sync::mpsc::channel::<Result<Nic, DemoError>>();
    let (tx_b, rx_b) = std::sync::mpsc::channel::<Result<Nic, DemoError>>();
    // Each NIC is created by a thread that entered its namespace (its engine thread inherits it).
    let start = |i: usize,
                 name: String,
                 tx: std::sync::mpsc::Sender<Result<Nic, DemoError>>,
                 pcap: Option<(std::fs::File, crate::io::PcapBudget)>|
     -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let r = (|| -> Result<Nic, DemoError> {
                crate::io::enter_netns(&name)
                    .map_err(DemoError::setup(format!("entering {name}")))?;
                let ifname = format!("fdemo{i}");
                let dev = netdev::netdev(&ifname).map_err(DemoError::setup(ifname.clone()))?;
                let x = XdpDevice::open_all_queues(&dev.name, XdpOptions::default())
                    .map_err(DemoError::setup(format!("AF_XDP on {ifname}")))?;
                let mut cfg = DeviceConfig::new(
                    dev.mac,
                    dev.gids
                        .iter()
                        .copied()
                        .find(|g| g.is_ipv4())
                        .ok_or_else(|| DemoError::NoIpv4(ifname.clone()))?,
                );
                cfg.gids = dev.gids.clone();
                let opts = NicOptions {
                    poll: PollMode::Adaptive {
                        spins: 200,
                        max_sleep: std::time::Duration::from_millis(1),
                    },
                    batch: 64,
                };
                match pcap {
                    Some((f, budget)) => {
                        let tap = PcapTap::with_budget(x, std::io::BufWriter::new(f), budget)?;
                        Nic::start(cfg, tap, opts)
                    }
                    None => Nic::start(cfg, x, opts),
                }
                .map_err(DemoError::setup(format!("starting the device on {ifname}")))
            })();
            let _ = tx.send(r);
        })
    };
    start(
        0,
        ns.names[0].clone(),
        tx_a,
        Some((file, cap.budget.clone())),
    )
    .join()
    .map_err(|_| DemoError::Panicked("device A's"))?;
    start(1, ns.names[1].clone(), tx_b, None)
        .join()
        .map_err(|_| DemoError::Panicked("device B's"))?;
    let a = rx_a
        .recv()
        .map_err(|_| DemoError::Panicked("device A's"))??;
    let b = rx_b
        .recv()
        .map_err(|_| DemoError::Panicked("device B's"))??;
    let mac = |i: u8| MacAddr([0x02, 0xfe, 0xde, 0, 0, i]);
    let resolve = |addr: IpAddr| match addr {
        IpAddr::V4(v) if v == Ipv4Addr::new(10, 99, 0, 1) => Some(mac(1)),
        IpAddr::V4(v) if v == Ipv4Addr::new(10, 99, 0, 2) => Some(mac(2)),
        _ => None,
    };
    writeln!(
        out,
        "ferroce demo --netns: namespaces {} and {} joined by a veth pair (MTU 9000); {} and {}",
        ns.names[0],
        ns.names[1],
        a.describe(),
        b.describe()
    )?;
    // GID 0 is the IPv6 link-local address there (Linux's order); 1 is the IPv4 one.
    let gid = a
        .with_device(|d| d.config().gids.iter().position(|g| g.is_ipv4()))
        .unwrap_or(0) as u8;
    let reports = run_tests(
        out,
        (&a, &b),
        &resolve,
        o.quick,
        Some((&ns.names, gid)),
        &[Test::WriteBw, Test::ReadBw, Test::SendLat],
        &mut cap,
    )?;
    rule(out)?;
    let (_, qa, _) = a.counters();
    writeln!(
        out,
        "counters A: tx_packets={} rx_packets={} retransmits={} timeouts={}",
        qa.tx_packets, qa.rx_packets, qa.retransmits, qa.timeouts
    )?;
    a.shutdown();
    b.shutdown();
    check_capture(out, &pcap, reports, &cap)
}
