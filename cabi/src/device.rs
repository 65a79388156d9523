//! The device this process sees and the NIC behind it.
//!
//! One `ibv_device` per process, named `ferroce_<interface>`: the interface `FERROCE_DEV`
//! names (with or without the `ferroce_` prefix), else the first non-loopback interface with
//! an address, else `lo`; `FERROCE_ADDR` one of its addresses to use alone (two processes on
//! one host then bind two addresses of the same interface). `FERROCE_BACKEND` picks the packet backend (`udp`, the default and
//! the one that needs no privilege; `packet`; `xdp`), `FERROCE_PCAP` a capture file. The NIC
//! starts with the first `ibv_open_device` and stops when the last context closes.
//!
//! GID table: with the UDP backend the single address the socket binds (the interface's first
//! IPv4 address, else its first address): a socket sends from one address only. With the raw
//! backends, every address of the interface in Linux's RoCE order (see
//! `ferroce::io::netdev`), as rxe shows them.

use ferroce::io::backend::{self, BackendKind};
use ferroce::io::netdev::{self, Netdev};
use ferroce::runtime::{Nic, NicOptions, PollMode};
use ferroce::verbs::{DeviceConfig, Mtu};
use ferroce::wire::MacAddr;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// The prefix of the device's name (`ferroce_eth0`), as ferroce's own tools name it.
pub const DEVICE_PREFIX: &str = "ferroce_";

/// The port the device has, from the environment.
pub(crate) struct Port {
    pub netdev: Netdev,
    pub backend: BackendKind,
    /// The GID table this device shows.
    pub gids: Vec<IpAddr>,
    pub mtu: Mtu,
}

impl Port {
    /// From the environment; `Err` with a one-line reason.
    pub fn from_env() -> Result<Port, String> {
        let backend = match std::env::var("FERROCE_BACKEND").ok().as_deref() {
            None | Some("") | Some("udp") => BackendKind::Udp,
            Some("packet") => BackendKind::Packet,
            Some("xdp") => BackendKind::Xdp,
            Some(o) => return Err(format!("FERROCE_BACKEND={o}: expected udp, packet or xdp")),
        };
        let netdev = match std::env::var("FERROCE_DEV").ok().filter(|s| !s.is_empty()) {
            Some(n) => {
                let n = n.strip_prefix(DEVICE_PREFIX).unwrap_or(&n).to_string();
                netdev::netdev(&n).map_err(|e| format!("FERROCE_DEV={n}: {e}"))?
            }
            None => {
                let all = netdev::netdevs();
                all.iter()
                    .find(|d| d.name != "lo" && !d.gids.is_empty())
                    .or_else(|| all.iter().find(|d| !d.gids.is_empty()))
                    .cloned()
                    .ok_or("no network interface with an address")?
            }
        };
        if netdev.gids.is_empty() {
            return Err(format!("interface {} has no address", netdev.name));
        }
        // FERROCE_ADDR: the one address to use (the UDP backend binds it); it must be one of
        // the interface's.
        let only: Option<IpAddr> =
            match std::env::var("FERROCE_ADDR").ok().filter(|s| !s.is_empty()) {
                Some(a) => {
                    let ip: IpAddr = a
                        .parse()
                        .map_err(|_| format!("FERROCE_ADDR={a}: not an IP address"))?;
                    if !netdev.gids.contains(&ip) {
                        return Err(format!(
                            "FERROCE_ADDR={a}: not an address of {}",
                            netdev.name
                        ));
                    }
                    Some(ip)
                }
                None => None,
            };
        let gids = match (backend, only) {
            (_, Some(ip)) => vec![ip],
            (BackendKind::Udp, None) => {
                let a = netdev
                    .gids
                    .iter()
                    .find(|a| a.is_ipv4())
                    .unwrap_or(&netdev.gids[0]);
                vec![*a]
            }
            (_, None) => netdev.gids.clone(),
        };
        let mtu = netdev::ib_mtu_for(netdev.mtu.unwrap_or(1500));
        Ok(Port {
            netdev,
            backend,
            gids,
            mtu,
        })
    }

    /// The device's name.
    pub fn name(&self) -> String {
        format!("{DEVICE_PREFIX}{}", self.netdev.name)
    }

    /// The node GUID, EUI-64 from the MAC as Linux derives it for RoCE devices (network order
    /// bytes).
    pub fn guid(&self) -> [u8; 8] {
        let m = self.netdev.mac.0;
        [m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]]
    }

    /// The MAC of a peer's IP (zero for the UDP backend: the kernel builds the Ethernet
    /// header).
    pub fn resolve(&self, ip: IpAddr) -> Option<MacAddr> {
        if self.backend == BackendKind::Udp {
            return Some(MacAddr::ZERO);
        }
        netdev::resolve(ip, Some(&self.netdev.name), Duration::from_secs(2))
    }
}

/// What every open context of the process shares: the port and the running NIC.
pub(crate) struct Shared {
    pub port: Port,
    pub nic: Arc<Nic>,
    /// The `async_fd` of every open context: made readable when asynchronous events are
    /// queued.
    pub async_fds: Arc<Mutex<Vec<libc::c_int>>>,
}

static SHARED: Mutex<Option<Weak<Shared>>> = Mutex::new(None);

/// The running NIC, started now if no context holds it.
pub(crate) fn shared() -> Result<Arc<Shared>, String> {
    let mut g = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = g.as_ref().and_then(Weak::upgrade) {
        return Ok(s);
    }
    let port = Port::from_env()?;
    let local = port.gids[0];
    let pkt = backend::open_with(port.backend, &port.netdev, local, true).map_err(|e| {
        format!(
            "{} backend on {}: {e}",
            port.backend.name(),
            port.netdev.name
        )
    })?;
    let mut cfg = DeviceConfig::new(port.netdev.mac, local);
    cfg.gids = port.gids.clone();
    cfg.port_mtu = port.mtu;
    // FERROCE_POLL: how the engine runs (inline, the default: in the application's own verbs
    // calls with a background thread for the rest; busy: its own thread spinning; adaptive:
    // its own thread, sleeping when idle).
    let poll = match std::env::var("FERROCE_POLL").ok().as_deref() {
        None | Some("") | Some("inline") => PollMode::Inline,
        Some("busy") => PollMode::Busy,
        Some("adaptive") => NicOptions::default().poll,
        Some(o) => {
            return Err(format!(
                "FERROCE_POLL={o}: expected inline, busy or adaptive"
            ))
        }
    };
    let opts = NicOptions { poll, batch: 64 };
    let nic = match std::env::var_os("FERROCE_PCAP").filter(|p| !p.is_empty()) {
        Some(p) => {
            let f = std::fs::File::create(&p)
                .map_err(|e| format!("FERROCE_PCAP={}: {e}", p.to_string_lossy()))?;
            // Unbuffered: an application that exits without closing the device loses no frame.
            let tap =
                ferroce::io::PcapTap::new(pkt, f).map_err(|e| format!("FERROCE_PCAP: {e}"))?;
            Nic::start(cfg, tap, opts)
        }
        None => Nic::start(cfg, pkt, opts),
    }
    .map_err(|e| format!("starting the NIC: {e}"))?;
    let async_fds: Arc<Mutex<Vec<libc::c_int>>> = Arc::default();
    let fds = async_fds.clone();
    nic.set_async_notify(Some(Arc::new(move || {
        for &fd in fds.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let one: u64 = 1;
            // SAFETY: an 8-byte write from a local to a context's eventfd, which stays open
            // while it is in the list (ibv_close_device takes it out before closing it).
            unsafe { libc::write(fd, &one as *const u64 as *const libc::c_void, 8) };
        }
    })));
    let s = Arc::new(Shared {
        port,
        nic: Arc::new(nic),
        async_fds,
    });
    *g = Some(Arc::downgrade(&s));
    Ok(s)
}
