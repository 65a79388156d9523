//! The device this process sees and the NIC behind it.
//!
//! One `ibv_device` per process, named `ferroce_<interface>`: the interface `FERROCE_DEV`
//! names (with or without the `ferroce_` prefix), else the first non-loopback interface with
//! an address, else `lo`; `FERROCE_ADDR` one of its addresses to use alone (two processes on
//! one host then bind two addresses of the same interface). `FERROCE_BACKEND` picks the packet backend (`udp`, the default and
//! the one that needs no privilege; `packet`; `xdp`), `FERROCE_PCAP` a capture file. The NIC
//! starts with the first object made on the device (a PD, a CQ, or the first RDMA-CM call), not
//! when it opens, so a program that only queries the device opens it whatever the packet backend
//! needs (`ibv_devinfo` while another program holds the address's UDP port); it stops when the
//! last context closes.
//!
//! GID table: every address of the interface at the index Linux gives it on a RoCE v2 port
//! (see `ferroce::io::netdev`: IPv6 link-local first, then IPv4, then the other IPv6), so a
//! GID index means what it means on rxe on the same interface (`-x 1` / `-g 1` is the IPv4
//! address of an interface with a link-local one). Every entry is served: the raw backends
//! see every address, the UDP backend binds a socket per address (`ferroce::io::udp_set`; a
//! socket sends from one address only). An entry not served (`FERROCE_ADDR` serves that one
//! address alone; an address another program holds without sharing) is **empty**, as deleted
//! entries of a real device's table are: `ibv_query_gid` gives the zero GID (rdma-core's
//! behaviour for an empty entry), `ibv_query_gid_ex` `ENODATA`, `ibv_devinfo -v` skips them,
//! and an address vector naming one is refused (`EINVAL`).
//!
//! The UDP backend shares each address's port with the other programs of this user
//! (`ferroce::io::share`: each program's QPNs and CM IDs in a block of its own, frames passed
//! to the program they are for), as several programs share one kernel RoCE device;
//! `FERROCE_SHARE=0` keeps the port to this program alone.
//!
//! On `lo` the UDP backend also takes any IPv4 loopback address in `FERROCE_ADDR`, configured
//! or not (Linux delivers all of 127.0.0.0/8 locally, so the socket binds and sends from it):
//! two programs on one host, each on its own address, with no root to add one. Such an
//! address is shown in the table where Linux would put it once added: after the interface's
//! IPv4 addresses ([`shown_table`]).
//! Not sharing (`FERROCE_SHARE=0`) and without `FERROCE_ADDR`, a second program on `lo` finds
//! 127.0.0.1 held by the first when its NIC starts and serves a free 127.0.0.N in its place,
//! at its index ([`loopback_stand_in`]).

use ferroce::io::backend::{self, BackendKind};
use ferroce::io::netdev::{self, Netdev};
use ferroce::pcap::capture::CaptureError;
use ferroce::runtime::{Nic, NicOptions, PollMode};
use ferroce::verbs::{DeviceConfig, Mtu};
use ferroce::wire::MacAddr;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// The prefix of the device's name (`ferroce_eth0`), as ferroce's own tools name it.
pub const DEVICE_PREFIX: &str = "ferroce_";

/// Why the process has no device, or its NIC could not start: each names the environment
/// variable or the interface at fault, in one line (printed as `ferroce libibverbs: ...`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum DeviceError {
    /// `FERROCE_BACKEND` names no backend.
    #[error("FERROCE_BACKEND={0}: expected udp, packet or xdp")]
    BadBackend(String),
    /// `FERROCE_DEV` names no usable interface.
    #[error("FERROCE_DEV={name}: {source}")]
    Interface {
        /// The interface's name (without the `ferroce_` prefix).
        name: String,
        /// What looking it up said.
        source: std::io::Error,
    },
    /// No interface has an address (and `FERROCE_DEV` is not set).
    #[error("no network interface with an address")]
    NoInterface,
    /// The UDP port of the device's address is taken by another RoCE endpoint.
    #[error(
        "UDP port 4791 on {addr} is in use by another RoCE endpoint on this host (a ferroce program or rdma_rxe): give this program an address of its own with FERROCE_ADDR (`ferroce run --addr`; on lo any 127.x.y.z will do)"
    )]
    AddrInUse {
        /// The address.
        addr: IpAddr,
    },
    /// The chosen interface has no address.
    #[error("interface {0} has no address")]
    NoAddress(String),
    /// `FERROCE_ADDR` is not an IP address.
    #[error("FERROCE_ADDR={0}: not an IP address")]
    AddrNotIp(String),
    /// `FERROCE_ADDR` is not an address of the interface.
    #[error("FERROCE_ADDR={addr}: not an address of {interface}")]
    AddrNotOnInterface {
        /// The address given.
        addr: IpAddr,
        /// The interface.
        interface: String,
    },
    /// `FERROCE_POLL` names no mode.
    #[error("FERROCE_POLL={0}: expected inline, busy or adaptive")]
    BadPoll(String),
    /// `FERROCE_INLINE_SPIN_US` is not a number of microseconds up to 1,000,000.
    #[error("FERROCE_INLINE_SPIN_US={0}: expected 0 to 1000000 (microseconds)")]
    BadInlineSpin(String),
    /// `FERROCE_ACK_DELAY_US` is not a number of microseconds up to 1,000,000.
    #[error("FERROCE_ACK_DELAY_US={0}: expected 0 to 1000000 (microseconds)")]
    BadAckDelay(String),
    /// `FERROCE_SHARE` is not 0 or 1.
    #[error("FERROCE_SHARE={0}: expected 0 or 1")]
    BadShare(String),
    /// The packet backend did not open.
    #[error("{backend} backend on {interface}: {source}")]
    Backend {
        /// The backend's name.
        backend: &'static str,
        /// The interface.
        interface: String,
        /// The system's reason.
        source: std::io::Error,
    },
    /// `FERROCE_PCAP`'s file could not be created or written.
    #[error("FERROCE_PCAP={path}: {source}")]
    Pcap {
        /// The path given.
        path: String,
        /// The reason.
        source: CaptureError,
    },
    /// The NIC's engine did not start.
    #[error("starting the NIC: {0}")]
    Start(#[source] std::io::Error),
}

impl DeviceError {
    /// The errno `ibv_open_device` fails with: EINVAL for a setting that makes no sense, the
    /// system's own errno where there is one (EPERM for a backend that needs privilege),
    /// ENODEV otherwise.
    pub(crate) fn errno(&self) -> libc::c_int {
        match self {
            DeviceError::BadBackend(_)
            | DeviceError::AddrNotIp(_)
            | DeviceError::AddrNotOnInterface { .. }
            | DeviceError::BadPoll(_)
            | DeviceError::BadAckDelay(_)
            | DeviceError::BadShare(_)
            | DeviceError::BadInlineSpin(_) => libc::EINVAL,
            DeviceError::NoInterface | DeviceError::NoAddress(_) => libc::ENODEV,
            DeviceError::AddrInUse { .. } => libc::EADDRINUSE,
            DeviceError::Interface { source, .. }
            | DeviceError::Backend { source, .. }
            | DeviceError::Start(source) => source.raw_os_error().unwrap_or(libc::ENODEV),
            DeviceError::Pcap { source, .. } => match source {
                CaptureError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
                _ => libc::EIO,
            },
        }
    }
}

/// Whether `ip`, not an address of the interface, may still be the UDP backend's own: an IPv4
/// loopback address on the loopback interface (one with an IPv4 loopback address), which Linux
/// delivers locally whether configured or not.
fn loopback_extra(backend: BackendKind, interface: &[IpAddr], ip: IpAddr) -> bool {
    let v4_loopback = |a: &IpAddr| a.is_ipv4() && a.is_loopback();
    backend == BackendKind::Udp && v4_loopback(&ip) && interface.iter().any(v4_loopback)
}

/// The GID table applications see: the interface's addresses in Linux's order, those the
/// device does not serve (`served`) empty; `extra`, an address the device serves that the
/// interface does not have ([`loopback_extra`]), where Linux would list it once added: after
/// the last IPv4 address.
fn shown_table(
    interface: &[IpAddr],
    served: &[IpAddr],
    extra: Option<IpAddr>,
) -> Vec<Option<IpAddr>> {
    let mut t: Vec<Option<IpAddr>> = interface
        .iter()
        .map(|g| served.contains(g).then_some(*g))
        .collect();
    if let Some(ip) = extra {
        let at = interface
            .iter()
            .rposition(|g| g.is_ipv4())
            .map_or(interface.len(), |i| i + 1);
        t.insert(at, Some(ip));
    }
    t
}

/// The addresses that may stand in for a held loopback address `held`, in the order they are
/// tried: 127.0.0.2 … 127.0.0.254 (Linux delivers all of 127.0.0.0/8 locally, so a socket
/// binds and sends from one without its being added), but none of `interface`'s own (shown
/// at their own indexes: a stand-in among them would be shown twice).
fn stand_ins(held: IpAddr, interface: &[IpAddr]) -> impl Iterator<Item = IpAddr> + '_ {
    (2..=254u8)
        .map(|n| IpAddr::from([127, 0, 0, n]))
        .filter(move |ip| *ip != held && !interface.contains(ip))
}

/// Two programs on one host's loopback without `FERROCE_ADDR`, as on one rxe device: when
/// `held`, the loopback address the device would serve, is held by another program, the device
/// serves the first stand-in ([`stand_ins`]) that is free instead and shows it at `held`'s GID
/// index, so that the GID index the program is given (`-g 0`, `-x 0`) means the address it
/// serves. The programs exchange their GIDs (out of band, or in RDMA-CM's messages) and reach
/// each other. `None` when `held` is free, or every stand-in is taken too. This is the preview
/// before the NIC starts; starting it decides by binding ([`Port::settle_by`]).
fn loopback_stand_in(
    held: IpAddr,
    interface: &[IpAddr],
    is_free: impl Fn(IpAddr) -> bool,
) -> Option<IpAddr> {
    if is_free(held) {
        return None;
    }
    stand_ins(held, interface).find(|ip| is_free(*ip))
}

/// Whether UDP port 4791 of `ip` is free now (binding it works).
fn port_free(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind((ip, ferroce::wire::ROCE_V2_PORT)).is_ok()
}

/// The addresses a port serves and the GID table it shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Served {
    /// The addresses the device serves: the engine's GID table, indexed by the engine's
    /// `sgid_index`. Entries are only ever added, so an index keeps its meaning.
    pub gids: Vec<IpAddr>,
    /// The GID table applications see, in Linux's numbering: an entry the device does not
    /// serve is `None` (empty). Application indexes are translated to the engine's with
    /// [`Port::engine_index`] and back with [`Port::shown_index`].
    pub table: Vec<Option<IpAddr>>,
    /// Every address of the port at the index Linux gives it, served or not (rxe's table on
    /// the same interface); `None`: a deleted entry, which the next address added takes.
    slots: Vec<Option<IpAddr>>,
    /// An address shown that is not the interface's (a loopback address from `FERROCE_ADDR`,
    /// or a stand-in): kept whatever the interface does.
    pinned: Option<IpAddr>,
    /// The interface's address a stand-in is shown in place of.
    hidden: Option<IpAddr>,
    /// The port's default GID, the link-local address derived from its MAC: the kernel keeps
    /// it while the interface exists, whatever its IPv6 addresses do (rxe in the guest: after
    /// `ip link set eth0 down` and `up`, which remove and re-add the link-local address, index
    /// 0 held it throughout and only the removed global address raised an event).
    default: Option<IpAddr>,
    /// Every address of the interface is served (a raw backend without `FERROCE_ADDR`): one
    /// the interface gains is served too.
    serves_all: bool,
}

impl Served {
    /// `interface`'s addresses in Linux's order, `gids` served, `extra` shown where Linux would
    /// put it once added ([`shown_table`]).
    fn new(
        interface: &[IpAddr],
        gids: Vec<IpAddr>,
        extra: Option<IpAddr>,
        serves_all: bool,
    ) -> Served {
        let mut sv = Served {
            slots: shown_table(interface, interface, extra),
            gids,
            table: Vec::new(),
            pinned: extra,
            hidden: None,
            default: None,
            serves_all,
        };
        sv.mask();
        sv
    }

    /// `interface`'s table with `held` served as `b` (a loopback stand-in) at its index.
    fn standing_in(interface: &[IpAddr], held: IpAddr, b: IpAddr) -> Served {
        let mut sv = Served {
            slots: interface
                .iter()
                .map(|g| Some(if *g == held { b } else { *g }))
                .collect(),
            gids: vec![b],
            table: Vec::new(),
            pinned: Some(b),
            hidden: Some(held),
            default: None,
            serves_all: false,
        };
        sv.mask();
        sv
    }

    /// Keep the default GID of an interface with MAC `mac` ([`Served::default`]).
    fn keeping_default(mut self, mac: MacAddr) -> Served {
        if mac != MacAddr::ZERO {
            let mut b = [0u8; 16];
            b[..2].copy_from_slice(&[0xfe, 0x80]);
            b[8..].copy_from_slice(&mac.eui64());
            self.default = Some(IpAddr::from(b));
        }
        self
    }

    /// Serve only the addresses of `held` (those the backend could open): the others'
    /// entries show empty, as any address the device does not serve.
    fn keep(&mut self, held: &[IpAddr]) {
        self.gids.retain(|g| held.contains(g));
        self.mask();
    }

    fn mask(&mut self) {
        self.table = self
            .slots
            .iter()
            .map(|s| s.filter(|ip| self.gids.contains(ip)))
            .collect();
    }

    /// The interface's addresses are now `now`: the entries of those it lost are deleted and
    /// those it gained take the first deleted entry, else a new one at the end, as the kernel
    /// keeps a RoCE port's table (rxe in the tools/rxe-peer guest: an IPv4 address added went
    /// to index 2, and after its removal an IPv6 one added took index 2 again; the others kept
    /// theirs). Returns how many entries changed (one `IBV_EVENT_GID_CHANGE` each, as rxe
    /// raises) and the addresses newly served, which the engine must serve too.
    pub fn follow(&mut self, now: &[IpAddr]) -> (usize, Vec<IpAddr>) {
        let mut changes = 0;
        for slot in &mut self.slots {
            if let Some(ip) = *slot {
                if !now.contains(&ip) && Some(ip) != self.pinned && Some(ip) != self.default {
                    *slot = None;
                    changes += 1;
                }
            }
        }
        let mut added = Vec::new();
        for ip in now {
            if Some(*ip) == self.hidden || self.slots.contains(&Some(*ip)) {
                continue;
            }
            match self.slots.iter().position(Option::is_none) {
                Some(i) => self.slots[i] = Some(*ip),
                None => self.slots.push(Some(*ip)),
            }
            changes += 1;
            // At most 256 served addresses: the engine's `sgid_index` is a byte.
            if self.serves_all && !self.gids.contains(ip) && self.gids.len() < 256 {
                self.gids.push(*ip);
                added.push(*ip);
            }
        }
        self.mask();
        (changes, added)
    }
}

/// The port the device has, from the environment.
pub(crate) struct Port {
    pub netdev: Netdev,
    pub backend: BackendKind,
    pub mtu: Mtu,
    /// What the port serves: set when the port is made, or, for a loopback address another
    /// program may hold ([`Port::stand_in_for`]), when the NIC starts ([`Port::settle_by`]);
    /// then following the interface's addresses ([`Port::follow`]).
    served: std::sync::RwLock<Option<Served>>,
    /// The loopback address this port serves unless another program holds it by the time the
    /// NIC starts (the UDP backend on lo without `FERROCE_ADDR`; [`loopback_stand_in`]).
    stand_in_for: Option<IpAddr>,
    /// The UDP backend shares its addresses' port with other programs of this user
    /// ([`ferroce::io::share`]; `FERROCE_SHARE`, on by default; off, a second program on lo
    /// gets a loopback stand-in of its own instead).
    pub share: bool,
}

impl Port {
    /// From the environment; `Err` says which setting or interface is at fault.
    pub fn from_env() -> Result<Port, DeviceError> {
        let backend = match std::env::var("FERROCE_BACKEND").ok().as_deref() {
            None | Some("") | Some("udp") => BackendKind::Udp,
            Some("packet") => BackendKind::Packet,
            Some("xdp") => BackendKind::Xdp,
            Some(o) => return Err(DeviceError::BadBackend(o.to_string())),
        };
        let netdev = match std::env::var("FERROCE_DEV").ok().filter(|s| !s.is_empty()) {
            Some(n) => {
                let n = n.strip_prefix(DEVICE_PREFIX).unwrap_or(&n).to_string();
                netdev::netdev(&n).map_err(|source| DeviceError::Interface { name: n, source })?
            }
            None => {
                let all = netdev::netdevs();
                all.iter()
                    .find(|d| d.name != "lo" && !d.gids.is_empty())
                    .or_else(|| all.iter().find(|d| !d.gids.is_empty()))
                    .cloned()
                    .ok_or(DeviceError::NoInterface)?
            }
        };
        if netdev.gids.is_empty() {
            return Err(DeviceError::NoAddress(netdev.name.clone()));
        }
        // FERROCE_ADDR: the one address to use (the UDP backend binds it); it must be one of
        // the interface's.
        let only: Option<IpAddr> =
            match std::env::var("FERROCE_ADDR").ok().filter(|s| !s.is_empty()) {
                Some(a) => {
                    let ip: IpAddr = a.parse().map_err(|_| DeviceError::AddrNotIp(a))?;
                    if !netdev.gids.contains(&ip) && !loopback_extra(backend, &netdev.gids, ip) {
                        return Err(DeviceError::AddrNotOnInterface {
                            addr: ip,
                            interface: netdev.name.clone(),
                        });
                    }
                    Some(ip)
                }
                None => None,
            };
        // The UDP backend's first address: the first IPv4 one (most traffic leaves from it,
        // and its socket takes the engine's frames without a copy).
        let udp_first = *netdev
            .gids
            .iter()
            .find(|a| a.is_ipv4())
            .unwrap_or(&netdev.gids[0]);
        // FERROCE_SHARE: the UDP backend shares its addresses' port with other programs of
        // this user (io::share; on by default).
        let share_env = share_setting(std::env::var("FERROCE_SHARE").ok().as_deref())?;
        // Not sharing, on lo without FERROCE_ADDR: an address another program holds is stood
        // in for by a free 127.0.0.N, decided when the NIC starts.
        let stand_in_for = match (backend, only) {
            (BackendKind::Udp, None) if !share_env => {
                Some(udp_first).filter(|a| a.is_ipv4() && a.is_loopback())
            }
            _ => None,
        };
        // The UDP backend without FERROCE_ADDR: a socket per address of the interface, as a
        // kernel RoCE device serves them all, but for a loopback IPv4 address with a stand-in
        // (not sharing: a second program on lo serves a 127.0.0.N of its own).
        let gids = match (backend, only) {
            (_, Some(ip)) => vec![ip],
            (BackendKind::Udp, None) if stand_in_for.is_some() => vec![udp_first],
            (BackendKind::Udp, None) => std::iter::once(udp_first)
                .chain(netdev.gids.iter().copied().filter(|g| *g != udp_first))
                .take(256)
                .collect(),
            (_, None) => netdev.gids.clone(),
        };
        let share = share_env && backend == BackendKind::Udp;
        let mtu = netdev::ib_mtu_for(netdev.mtu.unwrap_or(1500));
        let extra = only.filter(|ip| !netdev.gids.contains(ip));
        // Every address of the interface, and one it gains: a raw backend sees them all, the
        // UDP backend's set binds a socket for a gained one (not on lo: one address there).
        let serves_all = only.is_none() && stand_in_for.is_none();
        let served = std::sync::RwLock::new(stand_in_for.is_none().then(|| {
            Served::new(&netdev.gids, gids, extra, serves_all).keeping_default(netdev.mac)
        }));
        Ok(Port {
            netdev,
            backend,
            mtu,
            served,
            stand_in_for,
            share,
        })
    }

    /// What the port serves now: once the NIC has started, what it serves; before, what it
    /// would serve if it started now (a loopback address held by another program is shown
    /// with its stand-in, [`loopback_stand_in`], without waiting for it to come free).
    pub fn served(&self) -> Served {
        if let Some(sv) = self
            .served
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            return sv.clone();
        }
        // (A port without a stand-in is served from the start.)
        let a = self.stand_in_for.unwrap_or(self.netdev.gids[0]);
        match loopback_stand_in(a, &self.netdev.gids, port_free) {
            Some(b) => Served::standing_in(&self.netdev.gids, a, b),
            None => self.plain(a),
        }
    }

    /// Start serving: open the packet backend on the port's address with `open` and settle
    /// what the port serves, for good. A loopback address another program holds (after
    /// waiting up to [`ADDR_IN_USE_WAIT`] for it, [`open_waiting`]) is stood in for by the
    /// first of [`stand_ins`] that `open` binds: the bind decides, so two programs starting at
    /// once cannot both take one address. An error leaves the port unsettled (the next start
    /// tries again).
    ///
    /// `open` is given the addresses to serve, the first required, and returns what it opened
    /// with the addresses it serves (a UDP socket per address: one that does not bind is
    /// left out of the table, [`Served::keep`]).
    pub fn settle_by<T>(
        &self,
        mut open: impl FnMut(&[IpAddr]) -> std::io::Result<(T, Vec<IpAddr>)>,
    ) -> std::io::Result<(T, Served)> {
        let settled = self
            .served
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(sv) = settled {
            let (t, held) = open_waiting(|| open(&sv.gids))?;
            let mut g = self.served.write().unwrap_or_else(|e| e.into_inner());
            let sv = g.get_or_insert(sv);
            sv.keep(&held);
            return Ok((t, sv.clone()));
        }
        // (A port without a stand-in is served from the start.)
        let a = self.stand_in_for.unwrap_or(self.netdev.gids[0]);
        let in_use = |e: &std::io::Error| e.kind() == std::io::ErrorKind::AddrInUse;
        let (t, sv) = match open_waiting(|| open(&[a])) {
            Ok((t, _)) => (t, self.plain(a)),
            Err(e) if in_use(&e) => {
                let mut found = None;
                for b in stand_ins(a, &self.netdev.gids) {
                    match open(&[b]) {
                        Ok((t, _)) => {
                            found = Some((t, Served::standing_in(&self.netdev.gids, a, b)));
                            break;
                        }
                        Err(e) if in_use(&e) => continue,
                        Err(e) => return Err(e),
                    }
                }
                found.ok_or(e)?
            }
            Err(e) => return Err(e),
        };
        let mut g = self.served.write().unwrap_or_else(|e| e.into_inner());
        Ok((t, g.get_or_insert(sv).clone()))
    }

    /// The interface's addresses are now `now` ([`Served::follow`]); `None` while the port is
    /// not settled (a stand-in's port before its NIC starts: it shows the addresses it had).
    pub fn follow(&self, now: &[IpAddr]) -> Option<(usize, Vec<IpAddr>)> {
        let mut g = self.served.write().unwrap_or_else(|e| e.into_inner());
        g.as_mut().map(|sv| sv.follow(now))
    }

    /// Stop showing `ip` as served (an address gained that the backend could not serve).
    pub fn unserve(&self, ip: IpAddr) {
        let mut g = self.served.write().unwrap_or_else(|e| e.into_inner());
        if let Some(sv) = g.as_mut() {
            sv.gids.retain(|g| *g != ip);
            sv.mask();
        }
    }

    /// What the port shows serving `a` itself.
    fn plain(&self, a: IpAddr) -> Served {
        Served::new(&self.netdev.gids, vec![a], None, false).keeping_default(self.netdev.mac)
    }

    /// The engine's GID table ([`Served::gids`]).
    pub fn gids(&self) -> Vec<IpAddr> {
        self.served().gids.clone()
    }

    /// Entry `index` of the table applications see: `None` past its end, `Some(None)` for an
    /// empty entry.
    pub fn shown_gid(&self, index: usize) -> Option<Option<IpAddr>> {
        self.served().table.get(index).copied()
    }

    /// The engine's index of the application's GID index (`None`: past the table's end or an
    /// empty entry).
    pub fn engine_index(&self, shown: u8) -> Option<u8> {
        let sv = self.served();
        let ip = (*sv.table.get(usize::from(shown))?)?;
        sv.gids.iter().position(|g| *g == ip).map(|i| i as u8)
    }

    /// The application's GID index of the engine's (0 if the engine's is unknown, which
    /// cannot happen: every served address is in the table).
    pub fn shown_index(&self, engine: u8) -> u8 {
        let sv = self.served();
        sv.gids
            .get(usize::from(engine))
            .and_then(|ip| sv.table.iter().position(|g| *g == Some(*ip)))
            .map_or(0, |i| i as u8)
    }

    /// The application's GID index of a served address.
    pub fn shown_of(&self, ip: IpAddr) -> Option<u8> {
        self.served()
            .table
            .iter()
            .position(|g| *g == Some(ip))
            .map(|i| i as u8)
    }

    /// The device's name.
    pub fn name(&self) -> String {
        format!("{DEVICE_PREFIX}{}", self.netdev.name)
    }

    /// The node GUID, EUI-64 from the MAC as Linux derives it for RoCE devices (network order
    /// bytes).
    pub fn guid(&self) -> [u8; 8] {
        self.netdev.mac.eui64()
    }

    /// The MAC of a peer's IP (zero for the UDP backend: the kernel builds the Ethernet
    /// header); a multicast group's is derived from its address (no neighbour to ask).
    pub fn resolve(&self, ip: IpAddr) -> Option<MacAddr> {
        if self.backend == BackendKind::Udp {
            return Some(MacAddr::ZERO);
        }
        if let Some(m) = MacAddr::for_ip_multicast(ip) {
            return Some(m);
        }
        netdev::resolve(ip, Some(&self.netdev.name), Duration::from_secs(2))
    }
}

/// What every open context of the process shares: the port and its NIC, which starts with
/// the first object made on it ([`Shared::nic`]), not when the device opens: a program that
/// only queries the device (`ibv_devinfo` while a server holds the address's UDP port, or a
/// raw backend without the privilege it needs) opens it as it would a kernel device's.
pub(crate) struct Shared {
    pub port: Port,
    /// The engine's configuration (`ibv_query_device` answers from its limits).
    cfg: DeviceConfig,
    opts: NicOptions,
    bg_spin: Option<Duration>,
    /// The NIC, once started; `start` serialises starting it.
    nic: OnceLock<Arc<Nic>>,
    start: Mutex<()>,
    /// Every open context, with the asynchronous events routed to it.
    pub contexts: Arc<crate::verbs::Contexts>,
    /// Whether the port was active when last looked at (the link watcher's).
    link_active: AtomicBool,
    /// The process that set it up: a child of fork(2) inherits its parent's device, whose
    /// engine threads it has not, and sets up its own (as a child opens its own contexts on
    /// rdma-core's libibverbs; the parent's are not for it to use).
    pid: u32,
}

impl Drop for Shared {
    /// A parent's device closed in a child of fork(2): its engine is the parent's (the
    /// threads it would stop and wait for are not in this process, its sockets are shared),
    /// so it is left as it is, unused, in the child's memory.
    fn drop(&mut self) {
        if self.inherited() {
            if let Some(n) = self.nic.take() {
                std::mem::forget(n);
            }
        }
    }
}

static SHARED: Mutex<Option<Weak<Shared>>> = Mutex::new(None);

/// The process's device, set up now (not started: [`Shared::nic`]) if no context holds it.
/// Every setting is checked here, so that a bad one fails `ibv_open_device`.
pub(crate) fn shared() -> Result<Arc<Shared>, DeviceError> {
    let mut g = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = g.as_ref().and_then(Weak::upgrade) {
        if s.pid == std::process::id() {
            return Ok(s);
        }
        // A parent's: it stays, unused, in this child's memory.
        std::mem::forget(s);
    }
    let port = Port::from_env()?;
    // The GID table is set when the NIC starts ([`Port::settle_by`]); until then the
    // interface's first address holds its place (no port is probed for it here).
    let mut cfg = DeviceConfig::new(port.netdev.mac, port.netdev.gids[0]);
    cfg.port_mtu = port.mtu;
    // FERROCE_POLL: how the engine runs (inline, the default: in the application's own verbs
    // calls with a background thread for the rest; busy: its own thread spinning; adaptive:
    // its own thread, sleeping when idle).
    let poll = match std::env::var("FERROCE_POLL").ok().as_deref() {
        None | Some("") | Some("inline") => PollMode::Inline,
        Some("busy") => PollMode::Busy,
        Some("adaptive") => NicOptions::default().poll,
        Some(o) => return Err(DeviceError::BadPoll(o.to_string())),
    };
    // FERROCE_ACK_DELAY_US: how long a responder holds a lone ACK so that it leaves with the
    // QP's next request instead of before it (DeviceConfig::ack_delay; 0: at once).
    cfg.ack_delay = ack_delay(std::env::var("FERROCE_ACK_DELAY_US").ok().as_deref())?;
    // FERROCE_INLINE_SPIN_US: how long the inline engine's background thread drives on after
    // work before it sleeps (Nic::set_background_spin; 0: sleep at once).
    let bg_spin = inline_spin(std::env::var("FERROCE_INLINE_SPIN_US").ok().as_deref())?;
    // A port that shares its address numbers its QPs in a block (which one is decided when
    // the NIC starts: its slot), and reports the block's room as max_qp from the start.
    if port.share {
        cfg.qpn_block = Some(0);
    }
    let s = Arc::new(Shared {
        link_active: AtomicBool::new(link_active(&port)),
        port,
        cfg,
        opts: NicOptions { poll, batch: 64 },
        bg_spin,
        nic: OnceLock::new(),
        start: Mutex::new(()),
        contexts: Arc::default(),
        pid: std::process::id(),
    });
    *g = Some(Arc::downgrade(&s));
    // One watcher per process, started with the first device and ended when none is open
    // (both decided under SHARED's lock, so a device opened as it ends starts the next). A
    // child of fork(2) has none of its parent's threads: it starts its own.
    static AT_FORK: std::sync::Once = std::sync::Once::new();
    // SAFETY: pthread_atfork(3) with a child handler that lives as long as the process and
    // only stores to an atomic (async-signal-safe, as a handler run after fork must be).
    AT_FORK.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(link_watcher_gone));
    });
    if !LINK_WATCHER.swap(true, Ordering::SeqCst)
        && std::thread::Builder::new()
            .name("ferroce-link".into())
            .spawn(watch_link)
            .is_err()
    {
        // No thread: the port has no events (its state is still read fresh by every
        // ibv_query_port).
        LINK_WATCHER.store(false, Ordering::SeqCst);
    }
    Ok(s)
}

/// Whether the link watcher ([`watch_link`]) runs.
static LINK_WATCHER: AtomicBool = AtomicBool::new(false);

/// In a child of fork(2): the parent's link watcher is not there.
extern "C" fn link_watcher_gone() {
    LINK_WATCHER.store(false, Ordering::SeqCst);
}

/// How often the link watcher looks whether a device is still open when no link changes.
const LINK_WATCH_TICK: Duration = Duration::from_millis(500);

/// Whether the port of `port` is active now (its interface up with its link).
fn link_active(port: &Port) -> bool {
    netdev::port_link(&port.netdev.name) == netdev::PortState::Active
}

/// The device's port events, as the kernel raises them for rxe: `IBV_EVENT_PORT_ERR` on every
/// open context when the interface goes down or loses its link, `IBV_EVENT_PORT_ACTIVE` when it
/// comes back. Runs until no device is open (it holds the device only while it looks).
fn watch_link() {
    let mut watch = netdev::LinkWatch::new().ok();
    loop {
        let changed = match watch.as_mut() {
            Some(w) => w.wait(LINK_WATCH_TICK).unwrap_or_else(|_| {
                // The socket failed: look at the state on every tick from now on.
                watch = None;
                true
            }),
            None => {
                std::thread::sleep(LINK_WATCH_TICK);
                true
            }
        };
        let s = {
            let g = SHARED.lock().unwrap_or_else(|e| e.into_inner());
            match g.as_ref().and_then(Weak::upgrade) {
                Some(s) => s,
                None => {
                    LINK_WATCHER.store(false, Ordering::SeqCst);
                    return;
                }
            }
        };
        if !changed {
            continue;
        }
        let now = link_active(&s.port);
        if s.link_active.swap(now, Ordering::SeqCst) != now {
            let e = if now {
                ferroce::ib::AsyncEvent::PortActive(1)
            } else {
                ferroce::ib::AsyncEvent::PortErr(1)
            };
            crate::verbs::broadcast_async_event(&s.contexts, e);
        }
        follow_addresses(&s);
    }
}

/// The GID table follows the interface's addresses ([`Served::follow`]), as a kernel RoCE
/// port's does: an address gained is served at once where the device serves every address
/// (the engine's table grows), and every entry added or deleted raises
/// `IBV_EVENT_GID_CHANGE` on every open context, as rxe raises it.
fn follow_addresses(s: &Shared) {
    let Ok(d) = netdev::netdev(&s.port.netdev.name) else {
        return; // gone: its port is down (above); its table stays as it was
    };
    // Under the start lock: a NIC starting now takes the table as it is after this.
    let _g = s.start.lock().unwrap_or_else(|e| e.into_inner());
    let Some((changes, added)) = s.port.follow(&d.gids) else {
        return;
    };
    if let Some(nic) = s.started() {
        for ip in added {
            if s.port.backend == BackendKind::Udp {
                // A socket for it first; one that cannot be had leaves the entry empty.
                if let Err(e) = nic.serve_address(ip) {
                    crate::verbs::warn(&format!("{ip} not served: {e}"));
                    s.port.unserve(ip);
                }
            } else {
                nic.with_device(|dev| dev.add_gid(ip));
            }
        }
    }
    for _ in 0..changes {
        crate::verbs::broadcast_async_event(&s.contexts, ferroce::ib::AsyncEvent::GidChange(1));
    }
}

impl Shared {
    /// The device's limits (`ibv_query_device`), whether or not the NIC runs.
    pub fn limits(&self) -> ferroce::verbs::DeviceAttr {
        self.cfg.limits()
    }

    /// The NIC if it runs (in this process: a parent's, inherited through fork(2), is not
    /// this process's to drive; [`Shared::nic`]).
    pub fn started(&self) -> Option<&Arc<Nic>> {
        self.nic.get().filter(|_| !self.inherited())
    }

    /// Whether this is a parent's device that a child of fork(2) inherited: its engine's
    /// threads did not come along, and its sockets are the parent's too.
    fn inherited(&self) -> bool {
        self.pid != std::process::id()
    }

    /// The port's (active, max) MTU: the interface's, or once the NIC has started what its
    /// packet device's frames allow ([`ferroce::runtime::Nic::start`] may lower both).
    pub fn port_mtus(&self) -> (Mtu, Mtu) {
        let max = Mtu::M4096.min(self.port.mtu);
        match self.started() {
            Some(n) => n.with_device(|d| {
                let c = d.config();
                (c.port_mtu, max.min(c.max_mtu))
            }),
            None => (self.port.mtu, max),
        }
    }

    /// The running NIC, started now if it is not yet (the packet backend opens here: the UDP
    /// backend binds its address's port). A failure is printed once per call as
    /// `ferroce libibverbs: ...` and given as its errno; the next call tries again.
    ///
    /// In a child of fork(2) the parent's device refuses (EINVAL, said once): driving its
    /// engine there would read the parent's datagrams off the shared socket and send for
    /// the parent's QPs; the child opens a device of its own (a new `ibv_open_device`), and
    /// may close what it inherited ([`Drop`] leaves the parent's engine alone).
    pub fn nic(&self) -> Result<&Arc<Nic>, libc::c_int> {
        if self.inherited() {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                crate::verbs::warn(
                    "an object of the parent's device used in a child of fork(2): refused \
                     (EINVAL); the child opens a device of its own",
                )
            });
            return Err(libc::EINVAL);
        }
        if let Some(n) = self.nic.get() {
            return Ok(n);
        }
        let _g = self.start.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = self.nic.get() {
            return Ok(n);
        }
        match self.start_nic() {
            Ok(n) => Ok(self.nic.get_or_init(|| n)),
            Err(e) => {
                crate::verbs::warn(&e.to_string());
                Err(e.errno())
            }
        }
    }

    fn start_nic(&self) -> Result<Arc<Nic>, DeviceError> {
        let port = &self.port;
        // Sharing the port: a slot first (it decides the QPNs), then sockets that let others
        // of this user bind the port too.
        let slot = port
            .share
            .then(|| {
                ferroce::io::share::Slot::take()
                    .map_err(|e| crate::verbs::warn(&format!("not sharing the UDP port: {e}")))
                    .ok()
            })
            .flatten();
        let reuse = slot.is_some();
        let (pkt, served) = port
            .settle_by(|ips| backend::open_serving(port.backend, &port.netdev, ips, true, reuse))
            .map_err(|source| {
                if port.backend == BackendKind::Udp
                    && source.kind() == std::io::ErrorKind::AddrInUse
                {
                    return DeviceError::AddrInUse {
                        addr: port.gids()[0],
                    };
                }
                DeviceError::Backend {
                    backend: port.backend.name(),
                    interface: port.netdev.name.clone(),
                    source,
                }
            })?;
        let mut cfg = self.cfg.clone();
        cfg.gids = served.gids.clone();
        let pkt: Box<dyn ferroce::io::PacketDevice> = match slot {
            Some(slot) => {
                cfg.qpn_block = Some(slot.number());
                Box::new(
                    ferroce::io::share::Shared::new(pkt, slot, &served.gids).map_err(|source| {
                        DeviceError::Backend {
                            backend: port.backend.name(),
                            interface: port.netdev.name.clone(),
                            source,
                        }
                    })?,
                )
            }
            None => {
                cfg.qpn_block = None;
                pkt
            }
        };
        let opts = self.opts;
        let nic = match std::env::var_os("FERROCE_PCAP").filter(|p| !p.is_empty()) {
            Some(p) => {
                // `%p` in the name: this process's ID (the processes of one program each write
                // their own file, as a forking server's or an MPI job's would otherwise
                // overwrite one another's).
                let p = match p.to_str() {
                    Some(s) if s.contains("%p") => {
                        std::ffi::OsString::from(s.replace("%p", &std::process::id().to_string()))
                    }
                    _ => p,
                };
                let pcap_err = |source: CaptureError| DeviceError::Pcap {
                    path: p.to_string_lossy().into_owned(),
                    source,
                };
                let f = std::fs::File::create(&p).map_err(|e| pcap_err(e.into()))?;
                // Unbuffered: an application that exits without closing the device loses no
                // frame.
                let tap = ferroce::io::PcapTap::new(pkt, f).map_err(pcap_err)?;
                Nic::start(cfg, tap, opts)
            }
            None => Nic::start(cfg, pkt, opts),
        }
        .map_err(DeviceError::Start)?;
        if let Some(d) = self.bg_spin {
            nic.set_background_spin(d);
        }
        let ctxs = self.contexts.clone();
        nic.set_async_sink(Some(Arc::new(move |e| {
            crate::verbs::route_async_event(&ctxs, e)
        })));
        static AT_EXIT: std::sync::Once = std::sync::Once::new();
        // SAFETY: atexit(3) with a function that lives as long as the process.
        AT_EXIT.call_once(|| unsafe {
            libc::atexit(release_acks_at_exit);
        });
        Ok(Arc::new(nic))
    }
}

/// At exit with the device open (perftest and most programs never close it): the ACKs the
/// engine holds back ([`DEFAULT_ACK_DELAY_US`]) leave before the process is gone, as they would
/// from a NIC that outlives it; otherwise a peer whose last request was answered only by a
/// held ACK retries it until its retry count runs out. Bounded (50 ms; normally one engine
/// round).
extern "C" fn release_acks_at_exit() {
    let s = SHARED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(Weak::upgrade);
    if let Some(n) = s.as_ref().and_then(|s| s.started()) {
        n.release_held_acks(Duration::from_millis(50));
    }
}

/// A count of microseconds from the environment, at most one second: `None` when unset or
/// empty, `bad` (with the text) when it is not a whole number in `0..=1_000_000`.
fn env_micros(v: Option<&str>, bad: fn(String) -> DeviceError) -> Result<Option<u64>, DeviceError> {
    match v {
        None | Some("") => Ok(None),
        Some(s) => match s.parse::<u64>() {
            Ok(n) if n <= 1_000_000 => Ok(Some(n)),
            _ => Err(bad(s.to_string())),
        },
    }
}

/// How long opening the device waits for the UDP port of its address to come free
/// ([`open_waiting`]).
pub const ADDR_IN_USE_WAIT: Duration = Duration::from_secs(1);

/// Open with `open`, trying again for up to [`ADDR_IN_USE_WAIT`] while the address is in use:
/// one RoCE endpoint per address and host, and the program before this one on the address may
/// still be exiting. qperf's server forks a process per test, and the client asks for the next
/// test as soon as the last one's results are in; the next process found the port still held
/// by the last one (its connection closing) and the client's REQ reached the old process.
fn open_waiting<T>(mut open: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let until = std::time::Instant::now() + ADDR_IN_USE_WAIT;
    loop {
        match open() {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < until =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            r => return r,
        }
    }
}

/// `FERROCE_SHARE`: unset, empty or `1` shares the UDP port (the default), `0` does not.
fn share_setting(v: Option<&str>) -> Result<bool, DeviceError> {
    match v {
        None | Some("") | Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(o) => Err(DeviceError::BadShare(o.to_string())),
    }
}

/// `FERROCE_INLINE_SPIN_US`: unset or empty is the runtime's default (None), else that many
/// microseconds (0: the background thread sleeps after every round).
fn inline_spin(v: Option<&str>) -> Result<Option<std::time::Duration>, DeviceError> {
    Ok(env_micros(v, DeviceError::BadInlineSpin)?.map(std::time::Duration::from_micros))
}

/// The default hold of a lone ACK ([`ack_delay`]): 20 µs, what `ferroce perf`'s latency tests
/// use: a ping-pong's answer leaves without a separate ACK before it (`ib_send_lat`: 2,000
/// SENDs each way made 1,868 ACKs each way without it, 25–48 with it; docs/cabi.md). A held
/// ACK leaves when its QP is destroyed and at exit ([`release_acks_at_exit`]).
/// `FERROCE_ACK_DELAY_US=0` sends every ACK at once.
pub const DEFAULT_ACK_DELAY_US: u64 = 20;

/// `FERROCE_ACK_DELAY_US`: unset or empty is [`DEFAULT_ACK_DELAY_US`], 0 is no hold.
fn ack_delay(v: Option<&str>) -> Result<Option<ferroce::time::Duration>, DeviceError> {
    let us = env_micros(v, DeviceError::BadAckDelay)?.unwrap_or(DEFAULT_ACK_DELAY_US);
    Ok((us > 0).then(|| ferroce::time::Duration::from_micros(us)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_unconfigured_loopback_address_is_shown_after_the_ipv4_entries() {
        // lo as Linux numbers it: 127.0.0.1, then ::1.
        let lo = [ip("127.0.0.1"), ip("::1")];
        assert_eq!(
            shown_table(&lo, &[ip("127.0.0.9")], Some(ip("127.0.0.9"))),
            vec![None, Some(ip("127.0.0.9")), None]
        );
        // what `ip addr add 127.0.0.2/8 dev lo` gives, for comparison: the same index
        let lo2 = [ip("127.0.0.1"), ip("127.0.0.2"), ip("::1")];
        assert_eq!(
            shown_table(&lo2, &[ip("127.0.0.2")], None),
            vec![None, Some(ip("127.0.0.2")), None]
        );
        // the interface's own address, served: no extra entry
        assert_eq!(
            shown_table(&lo, &[ip("127.0.0.1")], None),
            vec![Some(ip("127.0.0.1")), None]
        );
    }

    #[test]
    fn a_held_loopback_address_is_stood_in_for_by_the_first_free_one() {
        let one = ip("127.0.0.1");
        let free_but = |taken: &'static [&'static str]| {
            move |a: IpAddr| !taken.contains(&a.to_string().as_str())
        };
        // free: no stand-in
        let lo = [one, ip("::1")];
        assert_eq!(loopback_stand_in(one, &lo, free_but(&[])), None);
        // held: the first free 127.0.0.N, N ≥ 2
        assert_eq!(
            loopback_stand_in(one, &lo, free_but(&["127.0.0.1", "127.0.0.2"])),
            Some(ip("127.0.0.3"))
        );
        assert_eq!(
            loopback_stand_in(one, &lo, free_but(&["127.0.0.1"])),
            Some(ip("127.0.0.2"))
        );
        // every one taken: none (starting the NIC reports the address in use)
        assert_eq!(loopback_stand_in(one, &lo, |_| false), None);
        assert_eq!(stand_ins(one, &lo).count(), 253);
        assert_eq!(
            stand_ins(ip("127.0.0.2"), &lo).next(),
            Some(ip("127.0.0.3"))
        );
        // an address lo has is shown at its own index: never a stand-in
        let lo2 = [one, ip("127.0.0.2"), ip("::1")];
        assert_eq!(
            loopback_stand_in(one, &lo2, free_but(&["127.0.0.1"])),
            Some(ip("127.0.0.3"))
        );
        // shown at the held address's index
        let mut sv = Served::standing_in(&lo, one, ip("127.0.0.2"));
        assert_eq!(sv.gids, vec![ip("127.0.0.2")]);
        assert_eq!(sv.table, vec![Some(ip("127.0.0.2")), None]);
        // the stand-in stays while lo keeps or loses its addresses; 127.0.0.1 is not re-added
        assert_eq!(sv.follow(&lo), (0, vec![]));
        assert_eq!(sv.follow(&[ip("::1")]), (0, vec![]));
        assert_eq!(sv.table, vec![Some(ip("127.0.0.2")), None]);
    }

    /// The table keeps its indexes as a kernel RoCE port's does (rxe in the tools/rxe-peer
    /// guest: an address added takes the first deleted entry, else the next index).
    #[test]
    fn the_table_follows_the_interface_as_rxes_does() {
        let ll = ip("fe80::1");
        let v4 = ip("10.77.0.31");
        let iface = [ll, v4];
        // a raw backend: every address served, the new ones too
        let mut all = Served::new(&iface, iface.to_vec(), None, true);
        assert_eq!(all.table, vec![Some(ll), Some(v4)]);
        let extra = ip("10.77.0.99");
        assert_eq!(all.follow(&[ll, v4, extra]), (1, vec![extra]));
        assert_eq!(all.table, vec![Some(ll), Some(v4), Some(extra)]);
        assert_eq!(all.follow(&iface), (1, vec![]));
        assert_eq!(all.table, vec![Some(ll), Some(v4), None]);
        let v6 = ip("fd77::99");
        assert_eq!(all.follow(&[ll, v4, v6]), (1, vec![v6]));
        assert_eq!(all.table, vec![Some(ll), Some(v4), Some(v6)]);
        // engine indexes only ever grow: the deleted address keeps its own
        assert_eq!(all.gids, vec![ll, v4, extra, v6]);
        // a link-local address other than the default GID: gone and back, index 0 again (the
        // first deleted entry)
        assert_eq!(all.follow(&[v4, v6]), (1, vec![]));
        assert_eq!(all.follow(&[ll, v4, v6]), (1, vec![]));
        assert_eq!(all.table, vec![Some(ll), Some(v4), Some(v6)]);
        // the default GID (the MAC's link-local address) stays when the link goes down and
        // its IPv6 addresses with it: only the global one's entry changes, as on rxe
        let mac = MacAddr([0x52, 0x54, 0x00, 0x77, 0x00, 0x1f]);
        let dflt = ip("fe80::5054:ff:fe77:1f");
        let mut port =
            Served::new(&[dflt, v4, v6], vec![dflt, v4, v6], None, true).keeping_default(mac);
        assert_eq!(port.follow(&[v4]), (1, vec![]));
        assert_eq!(port.table, vec![Some(dflt), Some(v4), None]);
        assert_eq!(port.follow(&[dflt, v4]), (0, vec![]));
        // the UDP backend: one address served; the others' entries change but show empty
        let mut one = Served::new(&iface, vec![v4], None, false);
        assert_eq!(one.table, vec![None, Some(v4)]);
        assert_eq!(one.follow(&[ll, v4, extra]), (1, vec![]));
        assert_eq!(one.table, vec![None, Some(v4), None]);
        assert_eq!(one.gids, vec![v4]);
        // its own address removed: its entry deleted (an AV naming it is refused)
        assert_eq!(one.follow(&[ll, extra]), (1, vec![]));
        assert_eq!(one.table, vec![None, None, None]);
        // a loopback address from FERROCE_ADDR that lo does not have stays
        let lo = [ip("127.0.0.1"), ip("::1")];
        let nine = ip("127.0.0.9");
        let mut pinned = Served::new(&lo, vec![nine], Some(nine), false);
        assert_eq!(pinned.table, vec![None, Some(nine), None]);
        assert_eq!(pinned.follow(&lo), (0, vec![]));
        assert_eq!(pinned.table, vec![None, Some(nine), None]);
    }

    #[test]
    fn only_the_udp_backend_on_loopback_takes_an_unconfigured_loopback_address() {
        let lo = [ip("127.0.0.1"), ip("::1")];
        let eth = [ip("fe80::1"), ip("10.0.0.2")];
        assert!(loopback_extra(BackendKind::Udp, &lo, ip("127.0.0.9")));
        assert!(loopback_extra(BackendKind::Udp, &lo, ip("127.255.0.1")));
        // raw backends serve the interface's frames: only its own addresses
        assert!(!loopback_extra(BackendKind::Packet, &lo, ip("127.0.0.9")));
        assert!(!loopback_extra(BackendKind::Xdp, &lo, ip("127.0.0.9")));
        // not a loopback address, or not the loopback interface
        assert!(!loopback_extra(BackendKind::Udp, &lo, ip("10.0.0.9")));
        assert!(!loopback_extra(BackendKind::Udp, &lo, ip("::2")));
        assert!(!loopback_extra(BackendKind::Udp, &eth, ip("127.0.0.9")));
    }

    #[test]
    fn inline_spin_from_the_environment() {
        assert_eq!(inline_spin(None).unwrap(), None);
        assert_eq!(inline_spin(Some("")).unwrap(), None);
        assert_eq!(
            inline_spin(Some("0")).unwrap(),
            Some(std::time::Duration::ZERO)
        );
        assert_eq!(
            inline_spin(Some("250")).unwrap(),
            Some(std::time::Duration::from_micros(250))
        );
        for bad in ["-1", "x", "1000001", "1.5"] {
            let e = inline_spin(Some(bad)).unwrap_err();
            assert_eq!(e.errno(), libc::EINVAL);
            assert!(e.to_string().starts_with("FERROCE_INLINE_SPIN_US="), "{e}");
        }
    }

    #[test]
    fn ack_delay_from_the_environment() {
        assert!(ack_delay(Some("0")).unwrap().is_none());
        assert_eq!(
            ack_delay(Some("20")).unwrap(),
            Some(ferroce::time::Duration::from_micros(20))
        );
        // unset and empty: the default (20 µs)
        let d = Some(ferroce::time::Duration::from_micros(DEFAULT_ACK_DELAY_US));
        assert_eq!(ack_delay(None).unwrap(), d);
        assert_eq!(ack_delay(Some("")).unwrap(), d);
        for bad in ["-1", "x", "1000001"] {
            let e = ack_delay(Some(bad)).unwrap_err();
            assert_eq!(e.errno(), libc::EINVAL);
            assert!(e.to_string().starts_with("FERROCE_ACK_DELAY_US="), "{e}");
        }
    }

    #[test]
    fn share_from_the_environment() {
        for (v, want) in [
            (None, true),
            (Some(""), true),
            (Some("1"), true),
            (Some("0"), false),
        ] {
            assert_eq!(share_setting(v).unwrap(), want, "{v:?}");
        }
        for bad in ["yes", "2", " 1"] {
            let e = share_setting(Some(bad)).unwrap_err();
            assert_eq!(e.errno(), libc::EINVAL);
            assert_eq!(
                e.to_string(),
                format!("FERROCE_SHARE={bad}: expected 0 or 1")
            );
        }
    }

    #[test]
    fn each_device_error_names_its_cause_and_maps_to_an_errno() {
        let e = DeviceError::BadPoll("fast".into());
        assert_eq!(e.errno(), libc::EINVAL);
        assert_eq!(
            e.to_string(),
            "FERROCE_POLL=fast: expected inline, busy or adaptive"
        );
        let e = DeviceError::AddrInUse {
            addr: "127.0.0.1".parse().unwrap(),
        };
        assert_eq!(e.errno(), libc::EADDRINUSE);
        assert!(
            e.to_string()
                .starts_with("UDP port 4791 on 127.0.0.1 is in use")
                && e.to_string().contains("FERROCE_ADDR"),
            "{e}"
        );
        let e = DeviceError::AddrNotOnInterface {
            addr: "10.0.0.9".parse().unwrap(),
            interface: "eth0".into(),
        };
        assert_eq!(e.errno(), libc::EINVAL);
        assert_eq!(
            e.to_string(),
            "FERROCE_ADDR=10.0.0.9: not an address of eth0"
        );
        assert_eq!(DeviceError::NoInterface.errno(), libc::ENODEV);
        // The system's own errno goes through: an XDP backend without privilege is EPERM.
        let e = DeviceError::Backend {
            backend: "xdp",
            interface: "eth0".into(),
            source: std::io::Error::from_raw_os_error(libc::EPERM),
        };
        assert_eq!(e.errno(), libc::EPERM);
        assert!(e.to_string().starts_with("xdp backend on eth0: "), "{e}");
        // Without one (an error made from a message), ENODEV.
        let e = DeviceError::Start(std::io::Error::other("no engine thread"));
        assert_eq!(e.errno(), libc::ENODEV);
        let e = DeviceError::Pcap {
            path: "/nonexistent/x.pcap".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOENT).into(),
        };
        assert_eq!(e.errno(), libc::ENOENT);
    }
}
