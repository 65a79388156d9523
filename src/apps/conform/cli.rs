//! What `ferroce conform` does with its arguments: open the interface and the backend, run
//! the catalogue (or serve as the ferroce peer), write the reports.

use super::catalogue::Caps;
use super::link::Link;
use super::peer::PeerTool;
use super::report;
use super::serve::{self, ServeOptions};
use super::{Options, Setup};
use crate::apps::tool::ToolError;
use crate::io::backend::{self, BackendKind};
use crate::io::netdev;
use crate::rc::deviations::{Deviations, BREAKS};
use crate::runtime::{Nic, NicOptions, PollMode};
use crate::verbs::{DeviceConfig, Mtu};
use crate::wire::MacAddr;
use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `ferroce conform` arguments, parsed.
#[derive(Clone, Debug)]
pub struct ConformRun {
    /// The peer's address.
    pub host: Option<String>,
    /// The interface to test through.
    pub dev: Option<String>,
    /// The peer tool's TCP port.
    pub port: u16,
    /// What runs on the peer.
    pub tool: PeerTool,
    /// Run only the tests whose id matches.
    pub only: Vec<String>,
    /// List the tests instead of running them.
    pub list: bool,
    /// Write TAP instead of the table.
    pub tap: bool,
    /// Also write JUnit XML here.
    pub junit: Option<PathBuf>,
    /// One capture per test in this directory.
    pub pcap_dir: Option<PathBuf>,
    /// The packet backend.
    pub backend: BackendKind,
    /// Our GID index (default: the first IPv4 GID).
    pub gid_index: Option<u8>,
    /// How long to wait for a response (and for silence).
    pub timeout: Duration,
    /// How long to keep trying to reach the peer for a new session.
    pub patience: Duration,
    /// Our first PSN.
    pub start_psn: u32,
    /// The path MTU to offer (default: the interface's).
    pub mtu: Option<u32>,
    /// `ibv_rc_pingpong`'s path MTU.
    pub peer_mtu: u32,
    /// Details of every test, not only of failed and inconclusive ones.
    pub verbose: bool,
    /// Be the ferroce peer instead.
    pub serve: bool,
    /// With `serve`: the CNP interval (µs; 0: no CNPs).
    pub cnp_interval_us: u64,
    /// With `serve`: the QP's max_rd_atomic and max_dest_rd_atomic.
    pub max_rd_atomic: u8,
    /// With `serve`: the QP's min_rnr_timer.
    pub min_rnr_timer: u8,
    /// With `serve`: deliberate deviations to set on the device (test-only; names from
    /// [`crate::rc::deviations::BREAKS`]).
    pub breaks: Vec<String>,
}

/// Why `ferroce conform` could not run (one line for the user).
#[derive(Debug, thiserror::Error)]
pub enum ConformError {
    /// `--break` names no deviation.
    #[error("--break {name}: unknown; one of {}", BREAKS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "))]
    UnknownBreak {
        /// The name given.
        name: String,
    },
    /// `--break` without `--serve`.
    #[error("--break makes the ferroce peer non-conformant: it needs --serve")]
    BreakNeedsServe,
    /// No `-d`.
    #[error("-d/--ib-dev IF is required (the interface to test through)")]
    NoDevice,
    /// The interface cannot be opened.
    #[error("{dev}: {err}")]
    Netdev {
        /// The interface.
        dev: String,
        /// Why.
        #[source]
        err: std::io::Error,
    },
    /// `--mtu` is not an IB MTU.
    #[error("MTU {0} is not one of 256, 512, 1024, 2048, 4096")]
    Mtu(u32),
    /// No peer address.
    #[error("the peer's address is required (ferroce conform HOST -d IF)")]
    NoHost,
    /// An empty `--only` pattern.
    #[error("--only: empty pattern")]
    EmptyPattern,
    /// `--only` selects nothing.
    #[error("--only {0:?} selects no test (see --list)")]
    NothingSelected(String),
    /// Choosing the GID, opening the backend, a file or a socket failed.
    #[error(transparent)]
    Tool(#[from] ToolError),
    /// The NIC did not start.
    #[error("starting the NIC: {0}")]
    Nic(#[source] std::io::Error),
    /// Standard output failed.
    #[error("{0}")]
    Write(#[from] std::io::Error),
}

/// The device deviations named by `breaks` (`--break`).
pub fn deviations(breaks: &[String]) -> Result<Deviations, ConformError> {
    let mut d = Deviations::default();
    for b in breaks {
        if !d.set(b) {
            return Err(ConformError::UnknownBreak { name: b.clone() });
        }
    }
    Ok(d)
}

fn io_error(what: String, err: std::io::Error) -> ConformError {
    ConformError::Tool(ToolError::Io { what, err })
}

fn backend_error(o: &ConformRun, dev: &netdev::Netdev, err: std::io::Error) -> ConformError {
    ConformError::Tool(ToolError::Backend {
        kind: o.backend.name(),
        dev: dev.name.clone(),
        err,
    })
}

/// Run it; returns the exit status (0 all passed, 1 a test failed).
pub fn run(o: &ConformRun, out: &mut dyn Write, err: &mut dyn Write) -> Result<u8, ConformError> {
    let raw = o.backend != BackendKind::Udp;
    if o.list {
        write!(out, "{}", super::listing(&Caps { raw }))?;
        return Ok(0);
    }
    let devs = deviations(&o.breaks)?;
    if devs.any() && !o.serve {
        return Err(ConformError::BreakNeedsServe);
    }
    let dev_name = o.dev.as_deref().ok_or(ConformError::NoDevice)?;
    let dev = netdev::netdev(dev_name).map_err(|err| ConformError::Netdev {
        dev: dev_name.into(),
        err,
    })?;
    let gid_index = crate::apps::tool::pick_gid(&dev, o.gid_index)?;
    let local = dev.gids[usize::from(gid_index)];
    let link_mtu = netdev::ib_mtu_for(dev.mtu.unwrap_or(1500));
    let mtu = match o.mtu {
        Some(m) => Mtu::from_bytes(m).ok_or(ConformError::Mtu(m))?,
        None => link_mtu,
    };
    if o.serve {
        return serve_cli(o, &dev, gid_index, local, mtu, out);
    }
    let host = o.host.clone().ok_or(ConformError::NoHost)?;
    if o.only.iter().any(String::is_empty) {
        return Err(ConformError::EmptyPattern);
    }
    let total = super::catalogue::catalogue()
        .iter()
        .filter(|t| super::selected(t.id, &o.only))
        .count();
    if total == 0 {
        return Err(ConformError::NothingSelected(o.only.join(",")));
    }
    if let Some(d) = &o.pcap_dir {
        std::fs::create_dir_all(d)
            .map_err(|e| io_error(format!("--pcap-dir {}", d.display()), e))?;
    }
    let pkt =
        backend::open_with(o.backend, &dev, local, true).map_err(|e| backend_error(o, &dev, e))?;
    // A raw backend leaves the kernel's UDP stack to see the peer's packets too: keep it
    // from answering them with ICMP port unreachable (best effort; an nftables drop rule
    // does the same, see tools/rxe-peer net-up --drop-roce-input).
    let _guard = if raw {
        std::net::UdpSocket::bind((local, crate::wire::ROCE_V2_PORT)).ok()
    } else {
        None
    };
    let ifname = dev.name.clone();
    let udp = o.backend == BackendKind::Udp;
    let resolve: Box<dyn Fn(IpAddr) -> Option<MacAddr>> = Box::new(move |ip| {
        if udp {
            Some(MacAddr::ZERO)
        } else {
            netdev::resolve(ip, Some(&ifname), Duration::from_secs(2))
        }
    });
    let mut setup = Setup {
        link: Link::new(pkt, local, raw),
        our_mac: dev.mac,
        our_ip: local,
        resolve,
        caps: Caps { raw },
    };
    let opts = Options {
        host,
        port: o.port,
        tool: o.tool,
        only: o.only.clone(),
        timeout: o.timeout,
        patience: o.patience,
        pcap_dir: o.pcap_dir.clone(),
        start_psn: o.start_psn & 0xff_ffff,
        mtu,
        peer_mtu: o.peer_mtu,
        ..Options::default()
    };
    let mut k = 0;
    let rep = super::run(&opts, &mut setup, &mut |r| {
        k += 1;
        let _ = writeln!(
            err,
            "[{k:>2}/{total}] {:<28} {:<12} {:.1} s",
            r.id,
            r.outcome.verdict.word(),
            r.secs
        );
    });
    if let Some(j) = &o.junit {
        std::fs::write(j, report::junit(&rep))
            .map_err(|e| io_error(format!("--junit {}", j.display()), e))?;
    }
    let text = if o.tap {
        report::tap(&rep)
    } else {
        report::table(&rep, o.verbose)
    };
    out.write_all(text.as_bytes())?;
    Ok(super::exit_code(&rep) as u8)
}

fn serve_cli(
    o: &ConformRun,
    dev: &netdev::Netdev,
    gid_index: u8,
    local: IpAddr,
    mtu: Mtu,
    out: &mut dyn Write,
) -> Result<u8, ConformError> {
    let pkt =
        backend::open_with(o.backend, dev, local, true).map_err(|e| backend_error(o, dev, e))?;
    let mut cfg = DeviceConfig::new(dev.mac, local);
    cfg.gids = dev.gids.clone();
    let cnp = (o.cnp_interval_us > 0).then(|| Duration::from_micros(o.cnp_interval_us));
    cfg.cnp_interval = cnp;
    cfg.deviations = deviations(&o.breaks)?;
    let nic = Nic::start(
        cfg,
        pkt,
        NicOptions {
            poll: PollMode::Adaptive {
                spins: 2000,
                max_sleep: Duration::from_millis(1),
            },
            batch: 64,
        },
    )
    .map_err(ConformError::Nic)?;
    let l = crate::oob::listen(None, o.port)
        .map_err(|e| io_error(format!("listen on port {}", o.port), e))?;
    let so = ServeOptions {
        cnp_interval: cnp,
        max_dest_rd_atomic: o.max_rd_atomic,
        min_rnr_timer: o.min_rnr_timer,
        mtu,
        sgid_index: gid_index,
        gid: super::frames::gid_of(local),
        knobs: o.breaks.join(","),
        resolve_dev: Some(dev.name.clone()),
    };
    writeln!(
        out,
        "ferroce conform peer on {} ({}), GID {local}, control port {}, knobs: {}",
        dev.name,
        nic.describe(),
        o.port,
        if so.knobs.is_empty() {
            "none"
        } else {
            &so.knobs
        }
    )?;
    let _ = out.flush();
    let stop = crate::io::stop_on_sigint_sigterm()
        .map_err(|e| io_error("installing the signal handlers".into(), e))?;
    serve::serve(&nic, &so, l, stop);
    nic.shutdown();
    Ok(0)
}
