//! The `ferroce` command-line tool.

use clap::{Parser, Subcommand};
use ferroce::capture::{self, CaptureError};
use ferroce::inspect::{self, Summary};
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "ferroce",
    version,
    about = "A pure-Rust userspace RoCE v2 software RDMA NIC"
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
    /// 2 when a file cannot be read.
    Inspect {
        /// Capture files (pcap or pcapng). Default: the capture shipped in captures/.
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
        /// Where to write the capture.
        #[arg(long, default_value = "ferroce-demo.pcap")]
        pcap: PathBuf,
        /// Fewer iterations (for tests).
        #[arg(long)]
        quick: bool,
    },
    /// Write the golden captures (one packet of every opcode over IPv4, IPv6 and 802.1Q).
    Golden {
        /// Output directory.
        #[arg(long, default_value = "captures")]
        out: PathBuf,
    },
}

/// The capture `ferroce inspect` reads when given no file: shipped in the source tree and
/// embedded in the binary, so the command works from any directory.
const DEFAULT_CAPTURE: &[u8] = include_bytes!("../../captures/golden-ipv4.pcap");

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            let msg = e.to_string();
            let first = msg
                .lines()
                .next()
                .unwrap_or("invalid arguments")
                .trim_start_matches("error: ");
            eprintln!("ferroce: {first} (see ferroce --help)");
            return ExitCode::from(2);
        }
    };
    match cli.cmd {
        Cmd::Inspect {
            files,
            json,
            verbose,
            quiet,
        } => run_inspect(&files, json, verbose, quiet),
        Cmd::Golden { out } => run_golden(&out),
        Cmd::Demo { pcap, quick } => {
            let mut out = io::stdout();
            match ferroce::demo::run(&mut out, &pcap, quick) {
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
    for g in ferroce::golden::Golden::ALL {
        let path = out.join(g.file_name());
        let r = File::create(&path)
            .map_err(CaptureError::from)
            .and_then(|w| ferroce::golden::write(g, BufWriter::new(w)));
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
    for path in files {
        let reader: Box<dyn io::Read> = if embedded {
            Box::new(DEFAULT_CAPTURE)
        } else {
            match File::open(path) {
                Ok(f) => Box::new(BufReader::new(f)),
                Err(e) => {
                    let _ = out.flush();
                    eprintln!("ferroce: {}: {e}", path.display());
                    status = 2;
                    continue;
                }
            }
        };
        match inspect_one(&mut out, path, reader, json, verbose, quiet) {
            Ok(s) => {
                if !s.clean() && status == 0 {
                    status = 1;
                }
            }
            Err(e) => {
                let _ = out.flush();
                eprintln!("ferroce: {}: {e}", path.display());
                status = 2;
            }
        }
    }
    if out.flush().is_err() {
        return ExitCode::from(2);
    }
    ExitCode::from(status)
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
