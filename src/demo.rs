//! `ferroce demo`: two ferroce devices in one process, joined by the in-memory loopback
//! backend (no root, no setup), run a short write-bw, read-bw and send-lat with perftest's
//! out-of-band exchange over 127.0.0.1, print perftest-style results and the counters, write
//! a capture of every frame and run `inspect` over it.

use crate::cm::perftest::{Role, Session};
use crate::io::{Loopback, PcapTap};
use crate::nic::{Nic, NicOptions, PollMode};
use crate::perf::{self, PerfConfig, Report, Test};
use crate::rc::state::Mtu;
use crate::verbs::DeviceConfig;
use crate::wire::MacAddr;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;

/// What the demo measured.
pub struct DemoResult {
    pub reports: Vec<(Test, Report)>,
    pub capture_packets: u64,
    pub capture_clean: bool,
}

const MAC_A: MacAddr = MacAddr([0x02, 0xfe, 0, 0, 0, 1]);
const MAC_B: MacAddr = MacAddr([0x02, 0xfe, 0, 0, 0, 2]);

fn ip(i: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, i))
}

/// Run the demo, writing the human-readable output to `out` and the capture to `pcap`.
pub fn run(
    out: &mut dyn Write,
    pcap: &Path,
    quick: bool,
) -> Result<DemoResult, Box<dyn std::error::Error>> {
    let (la, lb) = Loopback::pair(8192, 9000)?;
    let file = std::io::BufWriter::new(std::fs::File::create(pcap)?);
    let tap = PcapTap::new(la, file)?;
    // Two engines and two test threads share this machine's cores: the engines sleep when
    // idle (woken by packets or doorbells) so that the test threads can spin.
    let opts = NicOptions {
        poll: PollMode::Adaptive {
            spins: 200,
            max_sleep: std::time::Duration::from_millis(1),
        },
        batch: 64,
    };
    let a = Nic::start(DeviceConfig::new(MAC_A, ip(1)), tap, opts)?;
    let b = Nic::start(DeviceConfig::new(MAC_B, ip(2)), lb, opts)?;
    let resolve = |addr: IpAddr| {
        if addr == ip(1) {
            Some(MAC_A)
        } else if addr == ip(2) {
            Some(MAC_B)
        } else {
            None
        }
    };
    let tests: [(Test, u32, u64); 3] = if quick {
        [
            (Test::WriteBw, 65536, 500),
            (Test::ReadBw, 65536, 500),
            (Test::SendLat, 2, 500),
        ]
    } else {
        [
            (Test::WriteBw, 65536, 5000),
            (Test::ReadBw, 65536, 5000),
            (Test::SendLat, 2, 5000),
        ]
    };
    writeln!(out, "ferroce demo: two devices (10.0.0.1 {} and 10.0.0.2 {}) over the in-memory loopback backend", a.describe(), b.describe())?;
    let mut reports = Vec::new();
    for (test, size, iters) in tests {
        let cfg = PerfConfig {
            test,
            size,
            iters,
            mtu: Mtu::M4096,
            report_gbits: true,
            progress: false,
            ..PerfConfig::default()
        };
        let l = TcpListener::bind("127.0.0.1:0")?;
        let port = l.local_addr()?.port();
        let (server, client) = std::thread::scope(|s| {
            let srv = s.spawn(|| -> Result<Report, String> {
                let (st, _) = l.accept().map_err(|e| e.to_string())?;
                let mut ses = Session::new(st, Role::Server, cfg.timeout);
                perf::run(&b, &cfg, &mut ses, &resolve)
                    .map(|r| r.0)
                    .map_err(|e| e.to_string())
            });
            let cli = (|| -> Result<Report, String> {
                let st = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
                let mut ses = Session::new(st, Role::Client, cfg.timeout);
                perf::run(&a, &cfg, &mut ses, &resolve)
                    .map(|r| r.0)
                    .map_err(|e| e.to_string())
            })();
            (
                srv.join()
                    .unwrap_or_else(|_| Err("server thread panicked".into())),
                cli,
            )
        });
        let client = client.map_err(|e| format!("{}: client: {e}", test.title()))?;
        server.map_err(|e| format!("{}: server: {e}", test.title()))?;
        writeln!(out, "---------------------------------------------------------------------------------------")?;
        writeln!(
            out,
            "                    {}  (ferroce <-> ferroce, loopback backend, MTU 4096)",
            test.title()
        )?;
        writeln!(out, "{}", perf::header(&cfg))?;
        for line in perf::lines(&client) {
            writeln!(out, "{line}")?;
        }
        reports.push((test, client));
    }
    writeln!(
        out,
        "---------------------------------------------------------------------------------------"
    )?;
    let (da, qa, ia) = a.counters();
    let (_, qb, _) = b.counters();
    writeln!(
        out,
        "counters A: tx_packets={} rx_packets={} retransmits={} seq_naks={} rnr_naks={} acks_rcvd={} icrc_drops={} | B: tx_packets={} rx_packets={} duplicates={} acks_sent={}",
        qa.tx_packets, qa.rx_packets, qa.retransmits, qa.seq_naks_rcvd, qa.rnr_naks_rcvd, qa.acks_rcvd, da.icrc_drops, qb.tx_packets, qb.rx_packets, qb.duplicates, qb.acks_sent
    )?;
    writeln!(
        out,
        "loopback device A: {} frames sent, {} received",
        ia.tx_frames, ia.rx_frames
    )?;
    a.shutdown();
    b.shutdown();
    // The capture: run inspect over it.
    let f = std::fs::File::open(pcap)?;
    let mut sum = crate::inspect::Summary {
        file: pcap.display().to_string(),
        ..Default::default()
    };
    for fr in crate::capture::open(std::io::BufReader::new(f))? {
        let fr = fr?;
        sum.add(&crate::inspect::analyse(&fr));
    }
    writeln!(
        out,
        "capture {} (every frame A sent and received), checked by ferroce inspect:",
        pcap.display()
    )?;
    writeln!(out, "{}", sum.line())?;
    Ok(DemoResult {
        reports,
        capture_packets: sum.roce_packets,
        capture_clean: sum.clean() && sum.roce_packets > 0,
    })
}
