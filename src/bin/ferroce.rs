//! The `ferroce` command-line tool.

use clap::{Parser, Subcommand};
use ferroce::apps::inspect::{self, Summary};
use ferroce::pcap::capture::{self, CaptureError};
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "ferroce",
    version,
    about = "A pure-Rust userspace RoCE v2 software RDMA NIC",
    after_help = "Logging: RUST_LOG=ferroce=debug (or trace, or per module: \
                  ferroce::io=debug,ferroce::runtime=trace) prints the library's events to \
                  standard error; off by default."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Decode every RoCE v2 packet of pcap/pcapng captures and validate ICRCs and lengths.
    ///
    /// Exit status: 0 when every RoCE packet is well formed with a good ICRC, 1 otherwise,
    /// 2 when a file cannot be read. When the reader of the output goes away
    /// (`ferroce inspect FILE | head`), it stops quietly with status 0.
    Inspect {
        /// Capture files (pcap or pcapng); `-` reads standard input. Default: the capture
        /// shipped in captures/.
        files: Vec<PathBuf>,
        /// One JSON object per RoCE packet, then one summary object per file.
        #[arg(long)]
        json: bool,
        /// Field-by-field dump of each packet.
        #[arg(short, long, conflicts_with = "json")]
        verbose: bool,
        /// Print only the summary line (and problem packets).
        #[arg(short, long, conflicts_with = "json")]
        quiet: bool,
    },
    /// Two ferroce devices in one process over the loopback backend: write-bw, read-bw and
    /// send-lat with perftest's exchange, the counters, and a capture checked by `inspect`.
    Demo {
        /// Where to write the capture. Default: ferroce-demo.pcap in the current directory,
        /// or ferroce-demo-2.pcap, -3, ... if it exists (an existing file is never replaced
        /// unless --overwrite).
        #[arg(long)]
        pcap: Option<PathBuf>,
        /// Replace the --pcap file if it exists.
        #[arg(long, requires = "pcap")]
        overwrite: bool,
        /// Record every frame of the bandwidth tests too (hundreds of MB); by default the
        /// capture keeps every frame of the latency test and the first 512 frames of each
        /// bandwidth test.
        #[arg(long)]
        full_capture: bool,
        /// Fewer iterations (for tests).
        #[arg(long)]
        quick: bool,
        /// Run across two network namespaces joined by a veth pair, over AF_XDP (root).
        #[arg(long)]
        netns: bool,
    },
    /// perftest's tests (write-bw, read-bw, send-bw, atomic-bw, write-lat, read-lat, send-lat,
    /// atomic-lat) with perftest's flags, against another ferroce or the real ib_* tools.
    /// Server without HOST. `ferroce perf TEST -h` lists the flags.
    Perf {
        /// write-bw | read-bw | send-bw | atomic-bw | write-lat | read-lat | send-lat | atomic-lat
        #[arg(value_parser = parse_test)]
        test: ferroce::apps::perf::Test,
        /// perftest's options and the server's address, as ib_write_bw takes them.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// rdma-core's ping-pong examples: RC as ibv_rc_pingpong (same flags, messages and
    /// output); --transport uc|ud|srq for ibv_uc_pingpong, ibv_ud_pingpong, ibv_srq_pingpong.
    /// `ferroce pingpong -h` lists the flags.
    Pingpong {
        /// The example's options and the server's address.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// librdmacm's rping over ferroce's RDMA-CM: -s | -c -a ADDR, -p -C -S -v -V -d -P -I
    /// (rping's flags, protocol, output and exit status), plus --backend, --ib-dev, --pcap.
    Rping {
        /// rping's options.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Run an unmodified RDMA application (linked against libibverbs) on ferroce: its
    /// libibverbs.so.1 is ferroce's (no RDMA device, no kernel module; with the UDP backend no
    /// root). `ferroce run -- ibv_rc_pingpong -g 0 HOST`.
    ///
    /// Exit status: the program's; 127 if it cannot be started, 1 if ferroce's library is
    /// missing.
    Run {
        /// The interface (`eth0` or `ferroce_eth0`). Default: the first non-loopback one with an
        /// address.
        #[arg(short = 'd', long = "ib-dev")]
        dev: Option<String>,
        /// Use only this address of the interface (two programs on one host bind two
        /// addresses; on lo with the UDP backend any 127.x.y.z, added to lo or not; without
        /// it, a second program on lo takes a free 127.0.0.N by itself).
        #[arg(long)]
        addr: Option<std::net::IpAddr>,
        /// Packet backend.
        #[arg(long, value_enum)]
        backend: Option<ferroce::io::backend::BackendKind>,
        /// Capture every frame into this pcap file.
        #[arg(long)]
        pcap: Option<PathBuf>,
        /// How the engine runs: inline (in the program's verbs calls), busy or adaptive (its
        /// own thread).
        #[arg(long, value_parser = ["inline", "busy", "adaptive"])]
        poll: Option<String>,
        /// The directory with ferroce's libibverbs.so.1 (default: cabi/ next to this binary,
        /// or $FERROCE_LIB_DIR).
        #[arg(long)]
        lib_dir: Option<PathBuf>,
        /// Give the program the device node UCX (and Open MPI's default pml ucx) insists on,
        /// /dev/infiniband/uverbs_ferroce, when the host has none: a private /dev in a mount
        /// namespace of its own (and a user namespace when not root), /dev/null bound there.
        #[arg(long)]
        dev_node: bool,
        /// The program and its arguments (after `--`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Make links named like perftest's and rdma-core's programs (ib_write_bw, ...,
    /// ibv_rc_pingpong) to this binary in DIR: invoked under those names, ferroce behaves as
    /// those programs.
    InstallLinks {
        /// Directory for the links (created if missing).
        dir: PathBuf,
        /// Replace files that already have those names.
        #[arg(long)]
        force: bool,
    },
    /// ferroce's devices (one per network interface, `ferroce_<interface>`), their port, GID
    /// table and the live counters of running ferroce processes (`ferroce stat`), in the shape of
    /// ibv_devinfo.
    Devinfo {
        /// Only this device: `ferroce_<interface>` (as printed) or the interface name.
        #[arg(short = 'd', long = "ib-dev")]
        dev: Option<String>,
        /// The port (only 1 exists; accepted for compatibility).
        #[arg(short = 'i', long = "ib-port", value_parser = clap::value_parser!(u8).range(1..=1))]
        _ib_port: Option<u8>,
        /// More port attributes (GID table length, physical state).
        #[arg(short, long)]
        verbose: bool,
        /// Print only the device names.
        #[arg(short, long, conflicts_with = "verbose")]
        list: bool,
    },
    /// The counters of every running ferroce device, whatever process runs it (perf,
    /// pingpong, conform --serve, a program on the library), as `rdma statistic show` prints
    /// a kernel RNIC's: per device its counters, its QPs' totals and its packet device's.
    Stat(StatArgs),
    /// Resources of the running ferroce devices, as `rdma resource show`: `ferroce res qp`.
    Res {
        #[command(subcommand)]
        cmd: ResCmd,
    },
    /// Simulations that need no network: `ferroce sim incast`.
    Sim {
        #[command(subcommand)]
        cmd: SimCmd,
    },
    /// A userspace L2 learning switch over AF_PACKET with a DCQCN congestion point: a
    /// bottleneck rate, a buffer (tail drop) and RED/ECN marking on every egress port (root).
    ///
    /// Runs until SIGINT/SIGTERM or --duration-s, then prints per-port counters.
    Switch(SwitchArgs),
    /// Plot DCQCN on real packets: the CSVs of `ferroce perf --cc-csv` (one per sender) and,
    /// optionally, the progress lines of `ferroce switch --stats-interval-s` as one PNG
    /// (rate and α per QP, the switch queue and each port's receive rate).
    CcPlot(CcPlotArgs),
    /// A RoCE v2 conformance tester for any implementation: takes the other side of a peer
    /// tool's out-of-band exchange (ibv_rc_pingpong, ib_*_bw, or `ferroce conform --serve`),
    /// then plays scripted packets and checks every response against the IBTA rule it names.
    ///
    /// Exit status: 0 when no test failed (passes, not applicable, inconclusive), 1 when a
    /// test failed, 2 on bad arguments or when the interface cannot be opened.
    Conform(ConformArgs),
    /// Write the golden captures (one packet of every opcode over IPv4, IPv6 and 802.1Q).
    Golden {
        /// Output directory.
        #[arg(long, default_value = "captures")]
        out: PathBuf,
    },
}

#[derive(clap::Args)]
struct ConformArgs {
    /// The peer's address (for the out-of-band exchange); with a `*-client` peer tool, the
    /// address to listen on (0.0.0.0: all) for the peer's perftest client.
    host: Option<String>,
    /// Network interface to test through.
    #[arg(short = 'd', long = "ib-dev")]
    dev: Option<String>,
    /// The peer tool's TCP port.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// What runs on the peer (as the server): ibv_rc_pingpong, ib_write_bw, ib_read_bw,
    /// ib_send_bw, ib_atomic_bw, or `ferroce conform --serve`; `perftest-*-client`: the peer
    /// runs `ib_*_bw -x N HOST` as the client (in a loop) and the tester, listening, tests
    /// its requester.
    #[arg(long, value_enum, default_value = "ferroce")]
    peer_tool: ferroce::apps::conform::peer::PeerTool,
    /// Run only the tests whose id contains PATTERN (`*` wildcards; repeat or separate with
    /// commas).
    #[arg(long, value_name = "PATTERN")]
    only: Vec<String>,
    /// List the tests, their rules and which peer tools they apply to.
    #[arg(long)]
    list: bool,
    /// Write TAP (version 13) to standard output instead of the table.
    #[arg(long, conflicts_with = "junit")]
    tap: bool,
    /// Also write JUnit XML to FILE.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// One capture per test (TEST-ID.pcap) in DIR.
    #[arg(long, value_name = "DIR")]
    pcap_dir: Option<PathBuf>,
    /// Packet backend (the UDP socket cannot send some packets; those tests are inconclusive).
    #[arg(long, value_enum, default_value = "packet")]
    backend: ferroce::io::backend::BackendKind,
    /// Local GID index (default: the first IPv4 GID).
    #[arg(short = 'x', long = "gid-index")]
    gid: Option<u8>,
    /// How long to wait for a response (and for silence), in milliseconds.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=600_000))]
    timeout_ms: u64,
    /// How long to keep trying to reach the peer for a new session (a tool run in a loop
    /// restarts between sessions), in seconds.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=3600))]
    patience_s: u64,
    /// Our first PSN (hexadecimal).
    #[arg(long, default_value = "c0ffee", value_parser = parse_hex_psn)]
    start_psn: u32,
    /// The path MTU to offer (default: the interface's).
    #[arg(short = 'm', long = "mtu", value_parser = parse_mtu)]
    mtu: Option<u32>,
    /// ibv_rc_pingpong's path MTU (its exchange does not carry it).
    #[arg(long, default_value_t = 1024, value_parser = parse_mtu)]
    peer_mtu: u32,
    /// Show the details of every test, not only of failed and inconclusive ones.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Be the ferroce peer instead (every test applies; memory and completions observable).
    #[arg(long)]
    serve: bool,
    /// With --serve: the notification point's CNP interval (0: send no CNPs).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=10_000_000))]
    cnp_interval_us: u64,
    /// With --serve: responder resources offered (max_dest_rd_atomic).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=64))]
    max_rd_atomic: u8,
    /// With --serve: the RNR NAK timer code (0..=31).
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u8).range(0..=31))]
    min_rnr_timer: u8,
    /// With --serve, TEST-ONLY: make the ferroce peer deliberately non-conformant (repeat
    /// or separate with commas): skip-rkey-check, dup-atomic-again, dup-read-ack, no-seq-nak,
    /// no-rnr-nak, cnp-every-ce, accept-bad-icrc, no-opseq-check, no-length-check,
    /// zero-credits, retry-seven-forever, recycle-rd-atomic. For testing conformance testers
    /// only.
    #[arg(long = "break", value_name = "NAME")]
    breaks: Vec<String>,
}

#[derive(clap::Args)]
struct StatArgs {
    /// Only this device: `ferroce_<interface>` (as printed) or the interface name.
    #[arg(short = 'd', long = "dev")]
    dev: Option<String>,
    /// Only this process.
    #[arg(short = 'p', long)]
    pid: Option<u32>,
    /// JSON instead of text.
    #[arg(short = 'j', long)]
    json: bool,
}

#[derive(Subcommand)]
enum ResCmd {
    /// Every QP of every running ferroce device: state, PSNs, outstanding work requests,
    /// retries, timeouts, RNR retries and rate, one line each.
    Qp(StatArgs),
}

#[derive(Subcommand)]
enum SimCmd {
    /// N senders into one receiver through one switch port (virtual time, seeded): DCQCN
    /// or no congestion control, RED/ECN marking, optional PFC. Prints one summary line
    /// `utilization=… jain=… max_queue_kb=… drops=… cnps=… …` measured over the second half
    /// of the run, ending with `run_utilization=…` (the whole run, start-up included) and
    /// `steady=yes|no` (see docs/dcqcn.md); a run too short to be steady also says so on
    /// standard error.
    Incast(IncastArgs),
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
enum CcArg {
    Dcqcn,
    None,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
enum PresetArg {
    Paper,
    Connectx,
}

#[derive(clap::Args)]
struct IncastArgs {
    /// Number of senders.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    senders: u32,
    /// Congestion control.
    #[arg(long, value_enum, default_value = "dcqcn")]
    cc: CcArg,
    /// DCQCN parameters: the paper's or ConnectX firmware defaults (the NP interval follows:
    /// 50 µs or 4 µs, unless --np-interval-us is given).
    #[arg(long, value_enum, default_value = "paper")]
    preset: PresetArg,
    /// Override a DCQCN parameter (repeatable): KEY=VALUE with KEY one of g, initial_alpha,
    /// alpha_update (on-cnp|periodic), alpha_period_us, rate_increase_period_us, byte_counter,
    /// stages, rai_mbps, rhai_mbps, min_rate_mbps, min_dec_factor, clamp_target
    /// (always|after-timer-increase), rate_reduce_period_us, time_scale.
    #[arg(long = "dcqcn", value_name = "KEY=VALUE")]
    dcqcn: Vec<String>,
    /// Link rate of every port (Gb/s).
    #[arg(long, default_value_t = 100.0)]
    link_gbps: f64,
    /// Simulated time (ms). The summary's utilisation, fairness and queue are measured over
    /// the second half (the steady state); 100 ms leaves DCQCN time to recover from the
    /// initial incast at 100 Gb/s.
    #[arg(long, default_value_t = 100.0)]
    duration_ms: f64,
    /// Write the time series here as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Plot goodput, rate, α and queue against time to this PNG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Seed of the ECN marking decisions.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// RED Kmin (KB): no marking at or below.
    #[arg(long, default_value_t = 5.0)]
    kmin_kb: f64,
    /// RED Kmax (KB): every ECT packet marked above.
    #[arg(long, default_value_t = 200.0)]
    kmax_kb: f64,
    /// RED marking probability at Kmax.
    #[arg(long, default_value_t = 0.01)]
    pmax: f64,
    /// Switch buffer for the port (KB).
    #[arg(long, default_value_t = 12000.0)]
    buffer_kb: f64,
    /// Enable PFC (pause all senders at --xoff-kb, resume at --xon-kb).
    #[arg(long)]
    pfc: bool,
    /// PFC XOFF threshold (KB).
    #[arg(long, default_value_t = 1000.0)]
    xoff_kb: f64,
    /// PFC XON threshold (KB).
    #[arg(long, default_value_t = 900.0)]
    xon_kb: f64,
    /// Base round-trip time (µs).
    #[arg(long, default_value_t = 8.0)]
    rtt_us: f64,
    /// RoCE payload per packet (bytes); frames add 58 bytes of headers.
    #[arg(long, default_value_t = 4096)]
    mtu: u32,
    /// Minimum interval between CNPs per flow at the receiver (µs).
    #[arg(long)]
    np_interval_us: Option<f64>,
    /// Time-series resolution (µs).
    #[arg(long, default_value_t = 20.0)]
    sample_us: f64,
    /// Random extra delay of each frame to the switch, up to this (ns).
    #[arg(long, default_value_t = 64)]
    jitter_ns: u64,
    /// Start the last sender this late (ms) and report its convergence time
    /// (join_convergence_ms): when its goodput averaged over 5 ms first comes within 10 %
    /// of its fair share.
    #[arg(long)]
    join_ms: Option<f64>,
}

/// `ferroce stat` and `ferroce res qp`.
fn run_stat(a: &StatArgs, what: &str) -> ExitCode {
    use ferroce::apps::stat;
    let all = ferroce::runtime::stat::discover();
    let v = match stat::select(all, a.dev.as_deref(), a.pid) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("ferroce: {what}: {e}");
            return ExitCode::from(1);
        }
    };
    let text = match (what, a.json) {
        ("stat", false) => stat::stat_text(&v),
        ("stat", true) => format!("{}\n", stat::stat_json(&v)),
        (_, false) => stat::res_qp_text(&v),
        (_, true) => format!("{}\n", stat::res_qp_json(&v)),
    };
    if v.is_empty() && !a.json {
        let dirs: Vec<String> = ferroce::runtime::stat::run_dirs()
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        eprintln!(
            "ferroce: {what}: no running ferroce device (looked in {})",
            dirs.join(", ")
        );
    }
    let _ = io::stdout().write_all(text.as_bytes());
    ExitCode::SUCCESS
}

fn run_incast(a: IncastArgs) -> ExitCode {
    use ferroce::cc::{dcqcn::Params, CcConfig};
    use ferroce::sim::incast::{self, IncastConfig, Pfc};
    use ferroce::sim::Red;
    use ferroce::time::Duration;
    fn fail(msg: String) -> ExitCode {
        eprintln!("ferroce: sim incast: {msg}");
        ExitCode::from(2)
    }
    let us = |v: f64| Duration::from_nanos((v * 1e3).round() as u64);
    let kb = |v: f64| (v * 1000.0).round() as u64;
    let positive = [
        ("--link-gbps", a.link_gbps),
        ("--duration-ms", a.duration_ms),
        ("--sample-us", a.sample_us),
        ("--buffer-kb", a.buffer_kb),
        ("--rtt-us", a.rtt_us),
    ];
    for (name, v) in positive {
        if !v.is_finite() || v <= 0.0 {
            return fail(format!("{name} must be a positive number, not {v}"));
        }
    }
    let non_negative = [
        ("--kmin-kb", a.kmin_kb),
        ("--kmax-kb", a.kmax_kb),
        ("--xoff-kb", a.xoff_kb),
        ("--xon-kb", a.xon_kb),
        ("--np-interval-us", a.np_interval_us.unwrap_or(0.0)),
        ("--join-ms", a.join_ms.unwrap_or(0.0)),
    ];
    for (name, v) in non_negative {
        if !v.is_finite() || v < 0.0 {
            return fail(format!("{name} must be a number >= 0, not {v}"));
        }
    }
    if !(0.0..=1.0).contains(&a.pmax) {
        return fail(format!("--pmax must be in [0, 1], not {}", a.pmax));
    }
    if a.kmin_kb > a.kmax_kb {
        return fail("--kmin-kb must not exceed --kmax-kb".into());
    }
    if a.pfc && a.xon_kb > a.xoff_kb {
        return fail("--xon-kb must not exceed --xoff-kb".into());
    }
    if a.duration_ms > 60_000.0 {
        return fail("--duration-ms is limited to 60000".into());
    }
    // Upper bounds that keep the run finite and the integer conversions exact.
    let at_most = [
        ("--link-gbps", a.link_gbps, 10_000.0),
        ("--rtt-us", a.rtt_us, 1e6),
        ("--np-interval-us", a.np_interval_us.unwrap_or(0.0), 1e6),
        ("--buffer-kb", a.buffer_kb, 1e9),
        ("--kmin-kb", a.kmin_kb, 1e9),
        ("--kmax-kb", a.kmax_kb, 1e9),
        ("--xoff-kb", a.xoff_kb, 1e9),
        ("--xon-kb", a.xon_kb, 1e9),
    ];
    for (name, v, max) in at_most {
        if v > max {
            return fail(format!("{name} is limited to {max}, not {v}"));
        }
    }
    if a.sample_us > a.duration_ms * 1000.0 {
        return fail(format!(
            "--sample-us ({}) must not exceed the run (--duration-ms {} = {} us)",
            a.sample_us,
            a.duration_ms,
            a.duration_ms * 1000.0
        ));
    }
    if a.jitter_ns > 1_000_000_000 {
        return fail(format!(
            "--jitter-ns is limited to 1e9, not {}",
            a.jitter_ns
        ));
    }
    if !(64..=9000).contains(&a.mtu) {
        return fail(format!("--mtu must be in 64..=9000, not {}", a.mtu));
    }
    let link_bps = (a.link_gbps * 1e9).round() as u64;
    let mut cfg = IncastConfig::new(a.senders as usize, link_bps);
    cfg.frame_bytes = a.mtu as usize + 58;
    cfg.pacer_burst_bytes = 2 * cfg.frame_bytes as u64;
    cfg.duration = us(a.duration_ms * 1000.0);
    cfg.sample_interval = us(a.sample_us);
    cfg.rtt = us(a.rtt_us);
    cfg.seed = a.seed;
    cfg.jitter = Duration::from_nanos(a.jitter_ns);
    cfg.buffer_bytes = kb(a.buffer_kb);
    cfg.red = Some(Red::new(
        kb(a.kmin_kb) as usize,
        kb(a.kmax_kb) as usize,
        a.pmax,
    ));
    cfg.pfc = a.pfc.then(|| Pfc {
        xoff_bytes: kb(a.xoff_kb),
        xon_bytes: kb(a.xon_kb),
    });
    let (params, np) = match a.preset {
        PresetArg::Paper => (Params::paper(), 50.0),
        PresetArg::Connectx => (Params::connectx(), 4.0),
    };
    let params = match params.with_overrides(&a.dcqcn) {
        Ok(p) => p,
        Err(e) => return fail(format!("--dcqcn: {e}")),
    };
    cfg.cc = match a.cc {
        CcArg::Dcqcn => CcConfig::Dcqcn(params),
        CcArg::None => CcConfig::None,
    };
    cfg.np_interval = us(a.np_interval_us.unwrap_or(np));
    if let Some(j) = a.join_ms {
        if j >= a.duration_ms {
            return fail("--join-ms must be less than --duration-ms".into());
        }
        let mut starts = vec![Duration::ZERO; cfg.senders];
        starts[cfg.senders - 1] = us(j * 1000.0);
        cfg.starts = starts;
    }
    let result = match incast::run(&cfg) {
        Ok(r) => r,
        Err(e) => return fail(e.to_string()),
    };
    if let Some(path) = &a.csv {
        let r = File::create(path)
            .and_then(|f| ferroce::apps::incast_plot::write_csv(&result, BufWriter::new(f)));
        if let Err(e) = r {
            eprintln!("ferroce: sim incast: {}: {e}", path.display());
            return ExitCode::from(1);
        }
    }
    if let Some(path) = &a.plot {
        if let Err(e) = ferroce::apps::incast_plot::write_png(&result, path, 1200, 1400) {
            eprintln!("ferroce: sim incast: {}: {e}", path.display());
            return ExitCode::from(1);
        }
    }
    let mut line = result.summary().to_string();
    if a.join_ms.is_some() {
        let conv = result.convergence_time(cfg.senders - 1, Duration::from_millis(5), 0.1);
        match conv {
            Some(d) => line.push_str(&format!(
                " join_convergence_ms={:.3}",
                d.as_nanos() as f64 / 1e6
            )),
            None => line.push_str(" join_convergence_ms=never"),
        }
    }
    let st = ferroce::apps::incast::steadiness(&result);
    line.push_str(&format!(
        " run_utilization={:.4} steady={}",
        st.whole_run,
        if st.is_steady() { "yes" } else { "no" }
    ));
    println!("{line}");
    if !st.is_steady() {
        eprintln!(
            "ferroce: sim incast: note: not yet in a steady state: utilization {:.4} then {:.4} over the two halves of the window (the second half of the run); run longer (--duration-ms)",
            st.window_first_half, st.window_second_half
        );
    }
    ExitCode::SUCCESS
}

#[derive(clap::Args)]
struct CcPlotArgs {
    /// A CSV written by `ferroce perf --cc-csv` (repeat for several senders).
    #[arg(long = "csv", required = true)]
    csvs: Vec<PathBuf>,
    /// The output of `ferroce switch --stats-interval-s` (queues and per-port rates).
    #[arg(long = "switch-log")]
    switch_log: Option<PathBuf>,
    /// The PNG to write.
    #[arg(long)]
    out: PathBuf,
}

#[derive(clap::Args)]
struct SwitchArgs {
    /// An interface to switch between (repeat: at least two).
    #[arg(long = "port", value_name = "IFACE", required = true)]
    ports: Vec<String>,
    /// Enter this network namespace (/run/netns/NAME) first.
    #[arg(long)]
    netns: Option<String>,
    /// Bottleneck rate of every egress port (Gb/s, counting 24 bytes of Ethernet overhead per
    /// frame); 0: unlimited.
    #[arg(long = "rate-gbps", default_value_t = 0.0)]
    rate_gbps: f64,
    /// Buffer of every egress queue (KB, tail drop).
    #[arg(long = "buffer-kb", default_value_t = 1000.0)]
    buffer_kb: f64,
    /// RED: no ECN marking at or below this backlog (KB). Needs --kmax-kb.
    #[arg(long = "kmin-kb", requires = "kmax_kb")]
    kmin_kb: Option<f64>,
    /// RED: every ECT frame marked above this backlog (KB). Needs --kmin-kb.
    #[arg(long = "kmax-kb", requires = "kmin_kb")]
    kmax_kb: Option<f64>,
    /// RED: marking probability at Kmax.
    #[arg(long, default_value_t = 0.01)]
    pmax: f64,
    /// Seed of the marking decisions.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stop after this many seconds.
    #[arg(long = "duration-s")]
    duration_s: Option<f64>,
    /// Record the traffic of --pcap-port (both directions, after marking) to this file.
    #[arg(long, requires = "pcap_port")]
    pcap: Option<PathBuf>,
    /// The port --pcap records.
    #[arg(long = "pcap-port", value_name = "IFACE", requires = "pcap")]
    pcap_port: Option<String>,
    /// Stop recording after this many frames.
    #[arg(long = "pcap-max-frames")]
    pcap_max_frames: Option<u64>,
    /// Write the final counters as JSON to this file (- for standard output).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Busy-poll (one core at 100 %) instead of sleeping when idle.
    #[arg(long)]
    busy: bool,
    /// Print a progress line this often (seconds).
    #[arg(long = "stats-interval-s")]
    stats_interval_s: Option<f64>,
    /// Receive through a TPACKET_V3 ring (no copy, but up to 1 ms of batching delay)
    /// instead of recvmmsg.
    #[arg(long = "rx-ring")]
    rx_ring: bool,
}

/// A command-line value out of its range (one line for the user; clap prints the value
/// parsers' ones after "invalid value ... for ...").
#[derive(Debug, thiserror::Error)]
enum ArgError {
    #[error("{flag}: {v} is negative")]
    Negative { flag: &'static str, v: f64 },
    #[error("{flag}: {v} is not a usable number of seconds")]
    Seconds { flag: &'static str, v: f64 },
    #[error("--rate-gbps must be 0 (unlimited) to 10000, not {0}")]
    RateGbps(f64),
    #[error("--buffer-kb must be greater than 0 and at most 1e9, not {0}")]
    BufferKb(f64),
    #[error("{flag} must be 0 to 1e9, not {v}")]
    Threshold { flag: &'static str, v: f64 },
    #[error("--kmin-kb ({lo}) must not exceed --kmax-kb ({hi})")]
    Thresholds { lo: f64, hi: f64 },
    #[error("--pmax must be in [0, 1], not {0}")]
    Pmax(f64),
    #[error("unknown test {0:?} (write-bw, read-bw, send-bw, atomic-bw, write-lat, read-lat, send-lat, atomic-lat)")]
    Test(String),
    #[error("{0:?} is not a number")]
    NotANumber(String),
    #[error("MTU {0} is not one of 256, 512, 1024, 2048, 4096")]
    Mtu(u32),
    #[error("{0:?} is not a hexadecimal PSN")]
    NotHexPsn(String),
    #[error("PSN {0} is wider than 24 bits")]
    WidePsn(String),
}

/// A CLI duration in seconds: finite, not negative, representable.
fn seconds(flag: &'static str, v: f64) -> Result<std::time::Duration, ArgError> {
    if v < 0.0 {
        return Err(ArgError::Negative { flag, v });
    }
    std::time::Duration::try_from_secs_f64(v).map_err(|_| ArgError::Seconds { flag, v })
}

/// The numbers of `ferroce switch`, checked before any port is opened.
fn check_switch_args(a: &SwitchArgs) -> Result<(), ArgError> {
    if !a.rate_gbps.is_finite() || !(0.0..=10_000.0).contains(&a.rate_gbps) {
        return Err(ArgError::RateGbps(a.rate_gbps));
    }
    if !a.buffer_kb.is_finite() || a.buffer_kb <= 0.0 || a.buffer_kb > 1e9 {
        return Err(ArgError::BufferKb(a.buffer_kb));
    }
    for (flag, v) in [("--kmin-kb", a.kmin_kb), ("--kmax-kb", a.kmax_kb)] {
        if let Some(v) = v {
            if !v.is_finite() || !(0.0..=1e9).contains(&v) {
                return Err(ArgError::Threshold { flag, v });
            }
        }
    }
    if let (Some(lo), Some(hi)) = (a.kmin_kb, a.kmax_kb) {
        if lo > hi {
            return Err(ArgError::Thresholds { lo, hi });
        }
    }
    if !(0.0..=1.0).contains(&a.pmax) {
        return Err(ArgError::Pmax(a.pmax));
    }
    Ok(())
}

fn run_switch(a: SwitchArgs) -> ExitCode {
    use ferroce::apps::switch::{self, PcapConfig, QueueConfig, SwitchConfig, SwitchPoll};
    if let Err(e) = check_switch_args(&a) {
        eprintln!("ferroce: switch: {e}");
        return ExitCode::from(2);
    }
    let kb = |v: f64| (v.max(0.0) * 1000.0).round() as usize;
    let secs = |flag: &'static str, v: Option<f64>| match v.map(|v| seconds(flag, v)).transpose() {
        Ok(d) => Ok(d),
        Err(e) => {
            eprintln!("ferroce: switch: {e}");
            Err(ExitCode::from(2))
        }
    };
    let (duration, stats_interval) = match (
        secs("--duration-s", a.duration_s),
        secs("--stats-interval-s", a.stats_interval_s),
    ) {
        (Ok(d), Ok(s)) => (d, s),
        (Err(c), _) | (_, Err(c)) => return c,
    };
    let mut cfg = SwitchConfig::new(a.ports);
    cfg.netns = a.netns;
    cfg.queue = QueueConfig {
        rate_bps: (a.rate_gbps > 0.0).then_some((a.rate_gbps * 1e9) as u64),
        buffer_bytes: kb(a.buffer_kb),
        red: match (a.kmin_kb, a.kmax_kb) {
            (Some(lo), Some(hi)) => Some(ferroce::sim::Red::new(kb(lo), kb(hi), a.pmax)),
            _ => None,
        },
        seed: a.seed,
    };
    cfg.duration = duration;
    cfg.pcap = match (a.pcap, a.pcap_port) {
        (Some(path), Some(port)) => Some(PcapConfig {
            path,
            port,
            max_frames: a.pcap_max_frames,
        }),
        _ => None,
    };
    cfg.json = a.json;
    cfg.poll = if a.busy {
        SwitchPoll::Busy
    } else {
        SwitchPoll::Adaptive { spins: 2000 }
    };
    cfg.stats_interval = stats_interval;
    cfg.rx_ring = a.rx_ring;
    match switch::run(&cfg, &mut io::stdout()) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferroce: switch: {e}");
            ExitCode::from(1)
        }
    }
}

fn parse_test(s: &str) -> Result<ferroce::apps::perf::Test, ArgError> {
    ferroce::apps::perf::Test::from_name(s).ok_or_else(|| ArgError::Test(s.into()))
}

fn parse_mtu(s: &str) -> Result<u32, ArgError> {
    let v: u32 = s.parse().map_err(|_| ArgError::NotANumber(s.into()))?;
    ferroce::verbs::Mtu::from_bytes(v)
        .map(|_| v)
        .ok_or(ArgError::Mtu(v))
}

/// A perftest test with perftest's command line (`ferroce perf TEST ...` or `ib_write_bw ...`).
/// `dev_required`: ferroce's own command wants `-d`.
fn run_perftest(
    test: ferroce::apps::perf::Test,
    program: &str,
    dev_required: bool,
    args: Vec<std::ffi::OsString>,
) -> ExitCode {
    use ferroce::apps::perf::args::{self, ArgsError, Parsed};
    let label = program.strip_prefix("ferroce ").unwrap_or(program);
    let inv = match args::parse_as(test, program, dev_required, args) {
        Ok(Parsed::Run(i)) => i,
        Ok(Parsed::Help(t)) | Ok(Parsed::Version(t)) => {
            println!("{}", t.trim_end());
            return ExitCode::SUCCESS;
        }
        Err(ArgsError::Clap(e)) => {
            let _ = e.print();
            return usage_exit(e.exit_code(), dev_required);
        }
        Err(e @ ArgsError::Value { .. }) => {
            eprintln!("error: {e}\n\nFor more information, try '-h'.");
            return usage_exit(2, dev_required);
        }
        Err(e) => {
            eprintln!("ferroce: {label}: {e}");
            return usage_exit(2, dev_required);
        }
    };
    match ferroce::apps::tool::run_perf(&inv, &mut io::stdout(), &mut io::stderr()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferroce: {label}: {e}");
            ExitCode::from(1)
        }
    }
}

/// The exit status of a command-line error: ferroce's own commands exit 2 (clap's usage
/// status); under a perftest or rdma-core program name (`dev_required` false) ferroce exits 1,
/// as those programs do (`return 1` after usage in rdma-core's examples, `FAILURE` in
/// perftest), so scripts that test for their status see the same value. A status of 0 (help,
/// version) stays 0.
fn usage_exit(code: i32, dev_required: bool) -> ExitCode {
    match code {
        0 => ExitCode::SUCCESS,
        _ if !dev_required => ExitCode::from(1),
        c => ExitCode::from(u8::try_from(c).unwrap_or(2)),
    }
}

/// rdma-core's ping-pong with its command line (`ferroce pingpong ...` or `ibv_rc_pingpong`).
fn run_rping(args: Vec<std::ffi::OsString>) -> ExitCode {
    use ferroce::apps::rping;
    let args: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let (mut out, mut err) = (io::stdout(), io::stderr());
    let code = match rping::parse(&args, &mut out, &mut err) {
        Ok(a) => rping::run(&a, &mut out, &mut err),
        Err(code) => code,
    };
    let _ = out.flush();
    ExitCode::from(code as u8)
}

fn run_pingpong(
    example: ferroce::apps::pingpong::Example,
    program: &str,
    dev_required: bool,
    args: Vec<std::ffi::OsString>,
) -> ExitCode {
    use ferroce::apps::pingpong::{self, Parsed};
    let run = match pingpong::parse_as(example, program, dev_required, args) {
        Ok(Parsed::Run(r)) => r,
        Ok(Parsed::Help(t)) => {
            print!("{t}");
            return ExitCode::SUCCESS;
        }
        Err(pingpong::ArgsError::Clap(e)) => {
            let _ = e.print();
            return usage_exit(e.exit_code(), dev_required);
        }
        Err(e) => {
            eprintln!("error: {e}\n\nFor more information, try '-h'.");
            return usage_exit(2, dev_required);
        }
    };
    match pingpong::run_pingpong(&run, &mut io::stdout()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let label = program.strip_prefix("ferroce ").unwrap_or(program);
            eprintln!("ferroce: {label}: {e}");
            ExitCode::from(1)
        }
    }
}

/// `ferroce install-links DIR`.
fn install_links(dir: &Path, force: bool) -> ExitCode {
    match ferroce::apps::links::install(dir, force) {
        Ok(made) => {
            for l in made {
                println!("{}", l.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ferroce: install-links: {e}");
            ExitCode::from(1)
        }
    }
}

/// Invoked under a perftest or rdma-core program name (a link to this binary): behave as it.
fn as_program() -> Option<ExitCode> {
    let mut argv = std::env::args_os();
    let argv0 = argv.next()?;
    let name = Path::new(&argv0).file_name()?.to_str()?.to_string();
    if let Some(t) = ferroce::apps::perf::args::test_of_program(&name) {
        return Some(run_perftest(t, &name, false, argv.collect()));
    }
    if let Some(e) = ferroce::apps::pingpong::Example::of_program(&name) {
        return Some(run_pingpong(e, &name, false, argv.collect()));
    }
    if name == "rping" {
        return Some(run_rping(argv.collect()));
    }
    None
}

/// The capture `ferroce inspect` reads when given no file: shipped in the source tree and
/// embedded in the binary, so the command works from any directory.
const DEFAULT_CAPTURE: &[u8] = include_bytes!("../../captures/golden-ipv4.pcap");

fn main() -> ExitCode {
    if let Some(code) = as_program() {
        return code;
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // clap's whole message (what is wrong, the valid values, the usage line) on
            // stderr, help and version on stdout; clap's exit status (2 for a usage error).
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    if let Err(e) = ferroce::apps::logging::init_from_env() {
        eprintln!("ferroce: {e}");
        return ExitCode::from(2);
    }
    match cli.cmd {
        Cmd::Inspect {
            files,
            json,
            verbose,
            quiet,
        } => run_inspect(&files, json, verbose, quiet),
        Cmd::Golden { out } => run_golden(&out),
        Cmd::Sim {
            cmd: SimCmd::Incast(a),
        } => run_incast(a),
        Cmd::Perf { test, args } => {
            run_perftest(test, &format!("ferroce perf {}", test.name()), true, args)
        }
        Cmd::Pingpong { args } => run_pingpong(
            ferroce::apps::pingpong::Example::Rc,
            "ferroce pingpong",
            true,
            args,
        ),
        Cmd::Rping { args } => run_rping(args),
        Cmd::InstallLinks { dir, force } => install_links(&dir, force),
        Cmd::Run {
            dev,
            addr,
            backend,
            pcap,
            poll,
            lib_dir,
            dev_node,
            command,
        } => {
            use ferroce::apps::run;
            let o = run::RunOptions {
                dev,
                addr,
                backend: backend.map(|b| b.name().to_string()),
                pcap,
                poll,
                lib_dir,
                dev_node,
                command,
            };
            let e = run::exec(&o);
            eprintln!("ferroce: run: {e}");
            match e {
                run::RunError::Exec(..) => ExitCode::from(127),
                _ => ExitCode::from(1),
            }
        }
        Cmd::Conform(a) => run_conform(a),
        Cmd::Switch(a) => run_switch(a),
        Cmd::CcPlot(a) => match cc_plot(&a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ferroce: cc-plot: {e}");
                ExitCode::from(2)
            }
        },
        Cmd::Stat(a) => run_stat(&a, "stat"),
        Cmd::Res { cmd: ResCmd::Qp(a) } => run_stat(&a, "res qp"),
        Cmd::Devinfo {
            dev, verbose, list, ..
        } => {
            let o = ferroce::apps::devinfo::DevinfoOptions { dev, verbose, list };
            match ferroce::apps::devinfo::run(&o, &mut io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("ferroce: devinfo: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Cmd::Demo {
            pcap,
            overwrite,
            full_capture,
            quick,
            netns,
        } => {
            let mut out = io::stdout();
            let o = ferroce::apps::demo::DemoOptions {
                pcap,
                overwrite,
                full_capture,
                quick,
            };
            let r = if netns {
                ferroce::apps::demo::run_netns(&mut out, &o)
            } else {
                ferroce::apps::demo::run(&mut out, &o)
            };
            match r {
                Ok(r) if r.capture_clean => ExitCode::SUCCESS,
                Ok(_) => {
                    eprintln!("ferroce: demo: the capture has bad or malformed packets");
                    ExitCode::from(1)
                }
                Err(e) => {
                    eprintln!("ferroce: demo: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

fn run_golden(out: &Path) -> ExitCode {
    if let Err(e) = std::fs::create_dir_all(out) {
        eprintln!("ferroce: cannot create {}: {e}", out.display());
        return ExitCode::from(2);
    }
    for g in ferroce::pcap::golden::Golden::ALL {
        let path = out.join(g.file_name());
        let r = File::create(&path)
            .map_err(CaptureError::from)
            .and_then(|w| ferroce::pcap::golden::write(g, BufWriter::new(w)));
        match r {
            Ok(n) => println!("{}: {n} packets", path.display()),
            Err(e) => {
                eprintln!("ferroce: {}: {e}", path.display());
                return ExitCode::from(2);
            }
        }
    }
    ExitCode::SUCCESS
}

fn run_inspect(files: &[PathBuf], json: bool, verbose: bool, quiet: bool) -> ExitCode {
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut status = 0u8;
    let default = [PathBuf::from("(embedded) captures/golden-ipv4.pcap")];
    let (files, embedded) = if files.is_empty() {
        (&default[..], true)
    } else {
        (files, false)
    };
    if files.iter().filter(|p| p.as_os_str() == "-").count() > 1 {
        eprintln!("ferroce: inspect: standard input (-) can be read only once");
        return ExitCode::from(2);
    }
    // The reader of our output went away (`ferroce inspect FILE | head`): stop quietly, as
    // other Unix tools do when their output pipe closes.
    let closed = |e: &io::Error| e.kind() == io::ErrorKind::BrokenPipe;
    for path in files {
        let (reader, name): (Box<dyn io::Read>, &Path) = if embedded {
            (Box::new(DEFAULT_CAPTURE), path)
        } else if path.as_os_str() == "-" {
            (
                Box::new(BufReader::new(io::stdin().lock())),
                Path::new("(standard input)"),
            )
        } else {
            match File::open(path) {
                Ok(f) => (Box::new(BufReader::new(f)), path),
                Err(e) => {
                    if let Err(e) = out.flush() {
                        if closed(&e) {
                            return ExitCode::SUCCESS;
                        }
                    }
                    eprintln!("ferroce: {}: {e}", path.display());
                    status = 2;
                    continue;
                }
            }
        };
        match inspect_one(&mut out, name, reader, json, verbose, quiet) {
            Ok(s) => {
                if !s.clean() && status == 0 {
                    status = 1;
                }
            }
            Err(CaptureError::Io(e)) if closed(&e) => return ExitCode::SUCCESS,
            Err(e) => {
                if let Err(e) = out.flush() {
                    if closed(&e) {
                        return ExitCode::SUCCESS;
                    }
                }
                eprintln!("ferroce: {}: {e}", name.display());
                status = 2;
            }
        }
    }
    match out.flush() {
        Ok(()) => ExitCode::from(status),
        Err(e) if closed(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferroce: inspect: writing the output: {e}");
            ExitCode::from(2)
        }
    }
}

fn inspect_one(
    out: &mut impl Write,
    path: &Path,
    reader: Box<dyn io::Read>,
    json: bool,
    verbose: bool,
    quiet: bool,
) -> Result<Summary, CaptureError> {
    let mut rd = capture::open(reader)?;
    let mut sum = Summary {
        file: path.display().to_string(),
        ..Default::default()
    };
    while let Some(item) = rd.next_frame() {
        let frame = match item {
            Ok(f) => f,
            Err(e) => {
                sum.capture_error = Some(e.to_string());
                break;
            }
        };
        let a = inspect::analyse(&frame);
        sum.add(&a);
        let problem = matches!(a, inspect::Analysis::Malformed { .. })
            || matches!(&a, inspect::Analysis::Roce(p) if !p.icrc_ok());
        if json {
            if let Some(rec) = inspect::packet_record(&frame, &a) {
                serde_json::to_writer(&mut *out, &rec).map_err(io::Error::from)?;
                writeln!(out)?;
            }
        } else if !quiet || problem {
            if let Some(line) = inspect::packet_line(&frame, &a) {
                writeln!(out, "{line}")?;
                if verbose {
                    if let inspect::Analysis::Roce(p) = &a {
                        write!(out, "{}", inspect::verbose_dump(p))?;
                    }
                }
            }
        }
    }
    if json {
        let mut v = serde_json::to_value(&sum).map_err(io::Error::from)?;
        v["kind"] = "summary".into();
        serde_json::to_writer(&mut *out, &v).map_err(io::Error::from)?;
        writeln!(out)?;
    } else {
        writeln!(out, "{}", sum.line())?;
    }
    Ok(sum)
}

/// Why `ferroce cc-plot` drew nothing.
#[derive(Debug, thiserror::Error)]
enum PlotError {
    #[error("{}: {err}", path.display())]
    File { path: PathBuf, err: io::Error },
    #[error("{}: not a `ferroce perf --cc-csv` file", .0.display())]
    NotCcCsv(PathBuf),
    #[error("{}: line {line}: malformed", path.display())]
    Malformed { path: PathBuf, line: usize },
    #[error("no samples")]
    NoSamples,
}

fn file_error(path: &Path) -> impl FnOnce(io::Error) -> PlotError + '_ {
    |err| PlotError::File {
        path: path.to_path_buf(),
        err,
    }
}

/// `ferroce cc-plot`: see [`CcPlotArgs`].
fn cc_plot(a: &CcPlotArgs) -> Result<(), PlotError> {
    use ferroce::apps::incast_plot::{write_panels_png, Panel};
    type Pts = Vec<(f64, f64)>;
    type Series = Vec<(String, Pts)>;
    let (mut rate, mut alpha): (Series, Series) = (Vec::new(), Vec::new());
    let mut t0 = f64::INFINITY;
    let mut t1 = 0f64;
    for (i, p) in a.csvs.iter().enumerate() {
        let text = std::fs::read_to_string(p).map_err(file_error(p))?;
        let mut lines = text.lines();
        if lines.next() != Some(ferroce::apps::cc_csv::HEADER) {
            return Err(PlotError::NotCcCsv(p.clone()));
        }
        let mut per_qp: std::collections::BTreeMap<String, (Pts, Pts)> = Default::default();
        for (n, l) in lines.enumerate() {
            let f: Vec<&str> = l.split(',').collect();
            let bad = || PlotError::Malformed {
                path: p.clone(),
                line: n + 2,
            };
            if f.len() != 6 {
                return Err(bad());
            }
            let t: f64 = f[0].parse().map_err(|_| bad())?;
            let r: f64 = f[2].parse().map_err(|_| bad())?;
            if !t.is_finite() || !r.is_finite() {
                return Err(bad());
            }
            t0 = t0.min(t);
            t1 = t1.max(t);
            let e = per_qp.entry(f[1].to_string()).or_default();
            e.0.push((t, r / 1e6));
            if let Ok(al) = f[3]
                .parse::<f64>()
                .map(|a| if a.is_finite() { a } else { 0.0 })
            {
                e.1.push((t, al));
            }
        }
        for (q, (r, al)) in per_qp {
            let name = format!("sender {} qp {q}", i + 1);
            rate.push((name.clone(), r));
            if !al.is_empty() {
                alpha.push((name, al));
            }
        }
    }
    let (mut queue, mut rx): (Series, Series) = (Vec::new(), Vec::new());
    if let Some(p) = &a.switch_log {
        let text = std::fs::read_to_string(p).map_err(file_error(p))?;
        let list = |l: &str, key: &str| -> Option<Vec<f64>> {
            let i = l.find(key)? + key.len();
            let j = l[i..].find(']')? + i;
            l[i..j].split_whitespace().map(|x| x.parse().ok()).collect()
        };
        for l in text.lines() {
            let (Some(q), Some(r), Some(t)) = (
                list(l, "queues ["),
                list(l, "rx_mbps ["),
                l.rsplit("unix ")
                    .next()
                    .and_then(|x| x.trim().parse::<f64>().ok()),
            ) else {
                continue;
            };
            if !l.contains("unix ") {
                continue;
            }
            if !t.is_finite() || q.iter().chain(&r).any(|v| !v.is_finite()) {
                continue;
            }
            t0 = t0.min(t);
            t1 = t1.max(t);
            for (k, v) in q.iter().enumerate() {
                if queue.len() <= k {
                    queue.push((format!("port {}", k + 1), Vec::new()));
                }
                queue[k].1.push((t, *v));
            }
            for (k, v) in r.iter().enumerate() {
                if rx.len() <= k {
                    rx.push((format!("port {}", k + 1), Vec::new()));
                }
                rx[k].1.push((t, *v));
            }
        }
    }
    if !t0.is_finite() {
        return Err(PlotError::NoSamples);
    }
    let shift = |s: Series| -> Series {
        s.into_iter()
            .map(|(n, pts)| (n, pts.into_iter().map(|(t, v)| (t - t0, v)).collect()))
            .collect()
    };
    let mut panels = vec![Panel {
        title: "DCQCN sending rate R_C per QP".into(),
        y_desc: "Mb/s".into(),
        series: shift(rate),
    }];
    if !alpha.is_empty() {
        panels.push(Panel {
            title: "alpha per QP".into(),
            y_desc: "alpha".into(),
            series: shift(alpha),
        });
    }
    if !rx.is_empty() {
        panels.push(Panel {
            title: "received by the switch per port (a sender's port: its rate)".into(),
            y_desc: "Mb/s".into(),
            series: shift(rx),
        });
        panels.push(Panel {
            title: "switch egress queue per port (ports in --port order)".into(),
            y_desc: "KB".into(),
            series: shift(queue),
        });
    }
    let h = 260 * panels.len() as u32;
    write_panels_png(&a.out, 1000, h, "time (s)", t1 - t0, &panels).map_err(file_error(&a.out))
}

fn run_conform(a: ConformArgs) -> ExitCode {
    let run = ferroce::apps::conform::cli::ConformRun {
        host: a.host,
        dev: a.dev,
        port: a.port,
        tool: a.peer_tool,
        only: a
            .only
            .iter()
            .flat_map(|s| s.split(','))
            .map(|s| s.trim().to_string())
            .collect(),
        list: a.list,
        tap: a.tap,
        junit: a.junit,
        pcap_dir: a.pcap_dir,
        backend: a.backend,
        gid_index: a.gid,
        timeout: std::time::Duration::from_millis(a.timeout_ms),
        patience: std::time::Duration::from_secs(a.patience_s),
        start_psn: a.start_psn,
        mtu: a.mtu,
        peer_mtu: a.peer_mtu,
        verbose: a.verbose,
        serve: a.serve,
        cnp_interval_us: a.cnp_interval_us,
        max_rd_atomic: a.max_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        breaks: a
            .breaks
            .iter()
            .flat_map(|s| s.split(','))
            .map(|s| s.trim().to_string())
            .collect(),
    };
    match ferroce::apps::conform::cli::run(&run, &mut io::stdout(), &mut io::stderr()) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("ferroce: conform: {e}");
            ExitCode::from(2)
        }
    }
}

fn parse_hex_psn(s: &str) -> Result<u32, ArgError> {
    let v = u32::from_str_radix(s.trim_start_matches("0x"), 16)
        .map_err(|_| ArgError::NotHexPsn(s.into()))?;
    if v > 0xff_ffff {
        return Err(ArgError::WidePsn(s.into()));
    }
    Ok(v)
}
