//! The AF_XDP backend: [`XdpDevice`], a [`PacketDevice`] that receives RoCE v2 frames
//! straight from an interface's receive queue(s) into its own memory (UMEM) and transmits
//! from it, bypassing the kernel's IP and UDP stack.
//!
//! # What opening a device does
//!
//! 1. Resolves the interface in the calling thread's network namespace.
//! 2. Makes sure ferroce's XDP program runs on the interface: reuses the attachment of
//!    another `XdpDevice` of this process on the same interface, or adopts a ferroce program
//!    found attached (e.g. by another process), or creates an XSKMAP, loads the program
//!    ([`crate::io::ebpf::xsk_redirect_program`]) and attaches it. An interface running
//!    somebody else's XDP program is left alone (error).
//! 3. For each queue: creates an AF_XDP socket with its own UMEM
//!    ([`XdpOptions::frame_count`] frames of [`XdpOptions::frame_size`] bytes), binds it to
//!    (interface, queue), puts it in the XSKMAP at the queue's index, and gives half of the
//!    frames to the kernel on the fill ring (the other half is for transmit).
//!
//! The program redirects UDP port 4791 to the socket of the queue the frame arrived on and
//! passes everything else (ARP, ICMP, TCP, other UDP) to the kernel, which keeps working
//! normally on the interface.
//!
//! # Attachment: BPF link first, netlink as the fallback
//!
//! [`AttachMethod::Auto`] attaches with `BPF_LINK_CREATE` (attach type `BPF_XDP`, Linux ≥
//! 5.9): the program is attached for as long as the link's descriptor is open, so it goes
//! away when the device is dropped **and also when the process dies without dropping it**
//! (a crash or SIGKILL cannot leave the interface with a stale program). If links are not
//! available it uses netlink (`RTM_SETLINK` with `IFLA_XDP_FD`, `IFLA_XDP_FLAGS` with
//! `XDP_FLAGS_UPDATE_IF_NOEXIST`), which stays attached until detached: `Drop` detaches it
//! with `XDP_FLAGS_REPLACE` + `IFLA_XDP_EXPECTED_FD`, so only ferroce's own program is
//! removed. A program left behind by a crash in that mode is harmless (its XSKMAP is empty,
//! so it passes everything) and is adopted by the next `open`.
//!
//! [`XdpMode::Auto`] tries native (driver) mode, `XDP_FLAGS_DRV_MODE`, first and falls
//! back to generic (skb) mode, `XDP_FLAGS_SKB_MODE`. veth has native XDP (Linux ≥ 4.19).
//!
//! # Zero-copy
//!
//! [`ZeroCopy::Auto`] binds with `XDP_ZEROCOPY` in native mode and falls back to
//! `XDP_COPY` when the driver cannot (EOPNOTSUPP), as veth cannot: on veth AF_XDP is copy
//! mode only (the kernel copies each frame between its sk_buff/xdp_buff and the UMEM).
//!
//! # Queues
//!
//! An AF_XDP socket serves one receive queue. [`XdpDevice::open`] takes one queue,
//! [`XdpDevice::open_queues`] a list and [`XdpDevice::open_all_queues`] every queue the
//! interface has now (ethtool channel count: rx + combined). A veth has 1 receive queue
//! unless given more (`ethtool -L eth0 rx 2 tx 2`, up to `numrxqueues`); the sending peer's
//! transmit queue picks the receive queue. With several queues the device holds one socket
//! and one UMEM per queue, `recv_batch` takes frames from all of them (round robin), and
//! `send_batch` always transmits on the first queue, so that frames leave in the order they
//! were sent (RoCE reacts to reordering with NAKs). On a multi-queue NIC, open all queues,
//! or steer RoCE to one queue (`ethtool -N IF flow-type udp4 dst-port 4791 action Q`) and
//! open that one: a frame arriving on a queue without a socket goes to the kernel (the
//! program's `XDP_PASS` fallback), where the host's firewall should drop it.
//!
//! # Frame size and multi-buffer
//!
//! The kernel accepts UMEM chunks of at most one page (4096 bytes) unless the UMEM is in
//! huge pages, and keeps `XDP_PACKET_HEADROOM` (256 bytes) in front of every received frame:
//! one 4096-byte chunk holds a received frame of at most 3840 bytes. That is enough for RoCE
//! path MTU 1024 and 2048 (1082 / 2106-byte frames) but **not** for path MTU 4096 (a
//! 4096-byte payload makes a frame of 4154 bytes or more).
//!
//! Larger frames use multi-buffer AF_XDP (`XDP_USE_SG`, Linux >= 6.6), which
//! [`XdpOptions::max_frame`] (default 9216, jumbo frames) turns on when it exceeds
//! `frame_size - 256`: a received frame then spans several chunks (descriptors chained with
//! `XDP_PKT_CONTD`) and is gathered into one buffer for the `recv_batch` callback (frames
//! that fit one chunk are still handed over in place, without a copy); a transmitted frame
//! is written into a run of adjacent chunks reserved for it and posted as several
//! descriptors (no copy). The XDP program is then loaded with `BPF_F_XDP_HAS_FRAGS` so
//! that native mode also works on interfaces with an MTU above a page (veth refuses a
//! single-buffer program then). If the kernel refuses `XDP_USE_SG` (EINVAL, before 6.6), the
//! device falls back to single-buffer and [`XdpDevice::frame_capacity`] says 3840. Frames
//! larger than the capacity are dropped and counted in `rx_dropped`.

use super::ebpf::{self, MAP_NAME, PROGRAM_NAME};
use super::sys::bpf::{self, LinkFd, MapFd, ProgFd};
use super::sys::event::poll_readable;
use super::sys::netlink::{
    RtNetlink, XdpAttached, XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE, XDP_FLAGS_UPDATE_IF_NOEXIST,
};
use super::sys::xsk::{
    bind_flags, XdpDesc, XskConfig, XskError, XskSocket, XskStats, XDP_PACKET_HEADROOM,
    XDP_PKT_CONTD,
};
use super::sys::{if_nametoindex, netns_id, rx_queue_count};
use super::{IoStats, PacketDevice};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Where the XDP program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum XdpMode {
    /// Native if the driver supports it, else generic.
    #[default]
    Auto,
    /// Native (driver) mode, `XDP_FLAGS_DRV_MODE`; fails if the driver has no XDP support.
    Native,
    /// Generic (skb) mode, `XDP_FLAGS_SKB_MODE`: works on any interface, slower.
    Generic,
}

/// Whether the socket uses zero-copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ZeroCopy {
    /// Zero-copy where the driver can, else copy.
    #[default]
    Auto,
    /// Zero-copy or fail.
    Yes,
    /// Copy mode.
    No,
}

/// How the program is attached (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AttachMethod {
    /// A BPF link if the kernel has them, else netlink.
    #[default]
    Auto,
    /// `BPF_LINK_CREATE`: detached when the link is closed (also on process death).
    Link,
    /// `RTM_SETLINK`/`IFLA_XDP`: detached by `Drop`.
    Netlink,
}

/// Options of [`XdpDevice::open`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XdpOptions {
    /// Native or generic XDP.
    pub mode: XdpMode,
    /// Zero-copy or copy mode.
    pub zero_copy: ZeroCopy,
    /// How the program is attached (BPF link or netlink).
    pub attach: AttachMethod,
    /// Bytes per UMEM frame: 2048 or 4096 (power of two, at most the page size).
    pub frame_size: u32,
    /// UMEM frames per queue; half receive, half transmit. A power of two ≥ 2.
    pub frame_count: u32,
    /// Slots of each of the four rings (a power of two). At most `frame_count / 2` are used.
    pub ring_size: u32,
    /// Bind with `XDP_USE_NEED_WAKEUP` (the kernel says when a syscall is needed).
    pub need_wakeup: bool,
    /// The largest frame to send and receive. Above `frame_size - 256` (3840) this needs
    /// multi-buffer (`XDP_USE_SG`); see the module documentation. Each transmit buffer is
    /// `ceil(max_frame / frame_size)` adjacent frames.
    pub max_frame: u32,
}

impl Default for XdpOptions {
    fn default() -> Self {
        XdpOptions {
            mode: XdpMode::Auto,
            zero_copy: ZeroCopy::Auto,
            attach: AttachMethod::Auto,
            frame_size: 4096,
            frame_count: 4096,
            ring_size: 2048,
            need_wakeup: true,
            max_frame: 9216,
        }
    }
}

/// Slots in the XSKMAP: queue indices 0..256 can have a socket.
pub const XSKMAP_ENTRIES: u32 = 256;

/// The mode the program actually runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActiveMode {
    /// In the driver.
    Native,
    /// In the kernel's generic path (after the socket buffer is built).
    Generic,
}

impl ActiveMode {
    fn flag(self) -> u32 {
        match self {
            ActiveMode::Native => XDP_FLAGS_DRV_MODE,
            ActiveMode::Generic => XDP_FLAGS_SKB_MODE,
        }
    }
    /// `native` or `generic`.
    pub fn as_str(self) -> &'static str {
        match self {
            ActiveMode::Native => "native",
            ActiveMode::Generic => "generic",
        }
    }
}

/// How the program in use got onto the interface.
#[derive(Debug)]
enum Hook {
    /// Ours, through a BPF link: closing it (dropping the field) detaches.
    Link { _link: LinkFd },
    /// Ours, through netlink: detached explicitly on drop (with the socket of the namespace
    /// it was attached in).
    Netlink(RtNetlink),
    /// Somebody else's ferroce program, found attached: left as found.
    Adopted,
}

/// ferroce's XDP program on one interface, shared by every device of this process using
/// that interface. Dropping the last reference detaches it (unless adopted).
#[derive(Debug)]
struct Attachment {
    netns: (u64, u64),
    ifindex: u32,
    ifname: String,
    map: MapFd,
    prog: ProgFd,
    mode: ActiveMode,
    hook: Hook,
}

impl Attachment {
    fn method(&self) -> &'static str {
        match self.hook {
            Hook::Link { .. } => "bpf_link",
            Hook::Netlink(_) => "netlink",
            Hook::Adopted => "adopted",
        }
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        tracing::info!(
            ifname = %self.ifname,
            method = self.method(),
            "XDP program {}",
            if matches!(self.hook, Hook::Adopted) { "left attached (adopted)" } else { "detached" }
        );
        match &self.hook {
            // Closing the link (dropping the LinkFd right after this) detaches the program.
            Hook::Link { .. } | Hook::Adopted => {}
            Hook::Netlink(nl) => {
                // Remove the program only if it is still ours (XDP_FLAGS_REPLACE with our fd
                // as the expected one); a failure leaves a harmless program that passes all.
                let _ = nl.set_xdp(
                    self.ifindex,
                    -1,
                    self.mode.flag(),
                    Some(self.prog.as_raw_fd()),
                );
            }
        }
    }
}

/// Live attachments of this process, by (network namespace, interface index).
static ATTACHMENTS: Mutex<Vec<Weak<Attachment>>> = Mutex::new(Vec::new());

/// A privilege problem: EPERM, or an error that lost its errno on the way but kept the kind
/// (EACCES is not one: the BPF verifier uses it for rejected programs).
fn is_perm(e: &io::Error) -> bool {
    match e.raw_os_error() {
        Some(errno) => errno == libc::EPERM,
        None => e.kind() == io::ErrorKind::PermissionDenied,
    }
}

/// Add context to an error; a permission error says what is needed.
fn ctx(e: io::Error, what: impl std::fmt::Display) -> io::Error {
    if is_perm(&e) {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "AF_XDP needs root / CAP_NET_ADMIN+CAP_BPF (+CAP_NET_RAW for the socket): {what}: {e}"
            ),
        )
    } else {
        io::Error::new(e.kind(), format!("{what}: {e}"))
    }
}

/// Find ferroce's program and XSKMAP in what `ifindex` runs, or create and attach them.
fn attachment(ifname: &str, ifindex: u32, opts: &XdpOptions) -> io::Result<Arc<Attachment>> {
    let netns = netns_id().map_err(|e| ctx(e, "reading /proc/thread-self/ns/net"))?;
    let mut reg = ATTACHMENTS.lock().unwrap_or_else(|p| p.into_inner());
    reg.retain(|w| w.strong_count() > 0);
    if let Some(a) = reg
        .iter()
        .filter_map(Weak::upgrade)
        .find(|a| a.netns == netns && a.ifindex == ifindex)
    {
        return Ok(a);
    }
    let nl = RtNetlink::open().map_err(|e| ctx(e, "netlink socket"))?;
    let q = nl
        .query_xdp(ifindex)
        .map_err(|e| ctx(e.into(), format!("querying XDP state of {ifname}")))?;
    let a = if let Some(id) = q.any_prog_id() {
        adopt(ifname, ifindex, netns, id, q.attached).inspect_err(|e| {
            tracing::warn!(ifname, prog_id = id, error = %e, "XDP: not adopting the attached program");
        })?
    } else {
        attach_new(ifname, ifindex, netns, nl, opts)?
    };
    tracing::info!(
        ifname,
        ifindex,
        mode = a.mode.as_str(),
        method = a.method(),
        "XDP program attached"
    );
    let a = Arc::new(a);
    reg.push(Arc::downgrade(&a));
    Ok(a)
}

/// Use a ferroce program some other process (or an earlier crash) attached.
fn adopt(
    ifname: &str,
    ifindex: u32,
    netns: (u64, u64),
    id: u32,
    attached: XdpAttached,
) -> io::Result<Attachment> {
    let prog = bpf::prog_fd_by_id(id).map_err(|e| ctx(e, format!("opening XDP program {id}")))?;
    let info = prog
        .info()
        .map_err(|e| ctx(e, format!("reading XDP program {id}")))?;
    if info.name != PROGRAM_NAME {
        let kind = match attached {
            XdpAttached::Skb => "xdpgeneric",
            XdpAttached::Driver => "xdpdrv",
            _ => "xdp",
        };
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{ifname} already runs an XDP program (id {id}, name '{}'); ferroce does not \
                 replace it (remove it with: ip link set dev {ifname} {kind} off)",
                info.name
            ),
        ));
    }
    for mid in info.map_ids {
        let map = bpf::map_fd_by_id(mid).map_err(|e| ctx(e, format!("opening map {mid}")))?;
        let mi = map
            .info()
            .map_err(|e| ctx(e, format!("reading map {mid}")))?;
        if mi.map_type == bpf::MAP_TYPE_XSKMAP {
            let mode = if attached == XdpAttached::Skb {
                ActiveMode::Generic
            } else {
                ActiveMode::Native
            };
            return Ok(Attachment {
                netns,
                ifindex,
                ifname: ifname.to_string(),
                map,
                prog,
                mode,
                hook: Hook::Adopted,
            });
        }
    }
    Err(io::Error::other(format!(
        "{ifname} runs a program named {PROGRAM_NAME} (id {id}) without an XSKMAP"
    )))
}

/// Load ferroce's program and attach it, trying the modes and methods `opts` allows.
fn attach_new(
    ifname: &str,
    ifindex: u32,
    netns: (u64, u64),
    nl: RtNetlink,
    opts: &XdpOptions,
) -> io::Result<Attachment> {
    let map = bpf::create_xskmap(MAP_NAME, XSKMAP_ENTRIES)
        .map_err(|e| ctx(e, "creating the XSKMAP (BPF_MAP_CREATE)"))?;
    let insns: Vec<[u8; 8]> = ebpf::xsk_redirect_program(map.as_raw_fd())
        .into_iter()
        .map(|i| i.to_bytes())
        .collect();
    // For multi-buffer, frags-aware (Linux >= 5.18): the program reads only the headers,
    // which are always in the first buffer. An older kernel rejects the flag (EINVAL): load
    // without it.
    let load = |flags| bpf::load_xdp_program(&insns, PROGRAM_NAME, c"GPL", flags);
    let prog = match wants_multi_buffer(opts) {
        false => load(0),
        true => match load(bpf::F_XDP_HAS_FRAGS) {
            Err(e) if e.error.raw_os_error() == Some(libc::EINVAL) => load(0),
            r => r,
        },
    }
    .map_err(|e| ctx(e.into(), "loading the XDP program"))?;

    let modes: &[ActiveMode] = match opts.mode {
        XdpMode::Auto => &[ActiveMode::Native, ActiveMode::Generic],
        XdpMode::Native => &[ActiveMode::Native],
        XdpMode::Generic => &[ActiveMode::Generic],
    };
    let methods = match opts.attach {
        AttachMethod::Auto => vec![AttachMethod::Link, AttachMethod::Netlink],
        m => vec![m],
    };
    let mut tried = Vec::new();
    let mut nl = Some(nl);
    for &mode in modes {
        for &method in &methods {
            let r: io::Result<Hook> = match method {
                AttachMethod::Link => bpf::attach_xdp_link(&prog, ifindex, mode.flag())
                    .map(|l| Hook::Link { _link: l }),
                _ => {
                    let sock = match nl.take() {
                        Some(s) => s,
                        None => RtNetlink::open()?,
                    };
                    match sock.set_xdp(
                        ifindex,
                        prog.as_raw_fd(),
                        mode.flag() | XDP_FLAGS_UPDATE_IF_NOEXIST,
                        None,
                    ) {
                        Ok(()) => Ok(Hook::Netlink(sock)),
                        Err(e) => {
                            nl = Some(sock);
                            Err(e.into())
                        }
                    }
                }
            };
            match r {
                Ok(hook) => {
                    return Ok(Attachment {
                        netns,
                        ifindex,
                        ifname: ifname.to_string(),
                        map,
                        prog,
                        mode,
                        hook,
                    })
                }
                Err(e) => {
                    let method_name = if method == AttachMethod::Link {
                        "bpf_link"
                    } else {
                        "netlink"
                    };
                    // Permission problems and a program that appeared meanwhile are final.
                    if is_perm(&e)
                        || e.raw_os_error() == Some(libc::EBUSY)
                        || e.raw_os_error() == Some(libc::EEXIST)
                    {
                        return Err(ctx(
                            e,
                            format!(
                                "attaching XDP to {ifname} ({} mode, {method_name})",
                                mode.as_str()
                            ),
                        ));
                    }
                    tracing::debug!(ifname, mode = mode.as_str(), method = method_name, error = %e, "XDP attach attempt failed");
                    tried.push(format!("{} mode via {method_name}: {e}", mode.as_str()));
                }
            }
        }
    }
    Err(io::Error::other(format!(
        "could not attach the XDP program to {ifname}: {}",
        tried.join("; ")
    )))
}

/// The verifier's (or the kernel's) refusal of a program [`XdpProgram::load`] was given,
/// with the verifier log.
pub use super::sys::bpf::ProgLoadError;

/// An XDP program loaded into the kernel (`BPF_PROG_LOAD`), e.g. one assembled with
/// [`ebpf`], which can be attached to an interface so that it outlives this process.
///
/// [`XdpDevice`] loads and attaches ferroce's own program by itself and removes it when the
/// last device of the interface closes. This type is for the other cases: attaching
/// ferroce's program ahead of time, by a privileged step, for later devices to adopt (an
/// [`XdpDevice`] finding a program named [`PROGRAM_NAME`] uses it and leaves it attached), or
/// loading any other program. Dropping it closes the descriptors; an attached program stays.
#[derive(Debug)]
pub struct XdpProgram {
    prog: ProgFd,
    /// The XSKMAP of ferroce's program (kept open while the program is held here).
    _map: Option<MapFd>,
}

impl XdpProgram {
    /// Load `insns` as an XDP program named `name` (the kernel keeps 15 bytes), GPL licensed.
    /// Needs CAP_BPF (or root).
    ///
    /// # Errors
    /// The verifier's rejection with its log in [`ProgLoadError::log`], or a privilege error.
    pub fn load(insns: &[ebpf::Insn], name: &str) -> Result<XdpProgram, ProgLoadError> {
        let raw: Vec<[u8; 8]> = insns.iter().map(|i| i.to_bytes()).collect();
        let prog = bpf::load_xdp_program(&raw, name, c"GPL", 0)?;
        Ok(XdpProgram { prog, _map: None })
    }

    /// ferroce's redirect program ([`ebpf::xsk_redirect_program`]) with a new, empty XSKMAP
    /// named [`MAP_NAME`], loaded under `name` (normally [`PROGRAM_NAME`]; any other name makes
    /// it a program [`XdpDevice::open`] will not adopt).
    pub fn ferroce_redirect(name: &str) -> io::Result<XdpProgram> {
        let map = bpf::create_xskmap(MAP_NAME, XSKMAP_ENTRIES)
            .map_err(|e| ctx(e, "creating the XSKMAP (BPF_MAP_CREATE)"))?;
        let insns = ebpf::xsk_redirect_program(map.as_raw_fd());
        let mut p =
            Self::load(&insns, name).map_err(|e| ctx(e.into(), "loading the XDP program"))?;
        p._map = Some(map);
        Ok(p)
    }

    /// The program's kernel id (as `ip link` and `bpftool` show it).
    pub fn id(&self) -> io::Result<u32> {
        Ok(self.prog.info()?.id)
    }

    /// Attach the program to `ifname` (in the calling thread's network namespace) with netlink
    /// (`IFLA_XDP`), in native or generic mode ([`XdpMode::Auto`]: native), only if the
    /// interface runs no XDP program. Unlike a BPF link, this attachment outlives the
    /// program's descriptors and the process: it stays until
    /// `ip link set dev IFNAME xdpgeneric off` (or `xdpdrv off`). Needs CAP_NET_ADMIN.
    pub fn attach_netlink(&self, ifname: &str, mode: XdpMode) -> io::Result<()> {
        let ifindex = if_nametoindex(ifname)?;
        let flag = match mode {
            XdpMode::Generic => ActiveMode::Generic.flag(),
            XdpMode::Auto | XdpMode::Native => ActiveMode::Native.flag(),
        };
        let nl = RtNetlink::open().map_err(|e| ctx(e, "netlink socket"))?;
        nl.set_xdp(
            ifindex,
            self.prog.as_raw_fd(),
            flag | XDP_FLAGS_UPDATE_IF_NOEXIST,
            None,
        )
        .map_err(|e| ctx(e.into(), format!("attaching XDP to {ifname}")))?;
        tracing::info!(ifname, mode = ?mode, "XDP program attached with netlink (left attached)");
        Ok(())
    }
}

/// One receive queue: an AF_XDP socket, its UMEM and the bookkeeping of its frames.
///
/// UMEM layout: frames `0..rx_frames` circulate between the fill and rx rings; after them
/// come the transmit slots, each `slot_frames` adjacent frames (one frame unless
/// multi-buffer), which circulate between `tx_free`, the tx ring and the completion ring.
struct Queue {
    id: u32,
    sock: XskSocket,
    /// Base addresses of the transmit slots that are free (owned by us, on no ring).
    tx_free: Vec<u64>,
    /// Offset of the first transmit slot.
    tx_base: u64,
    /// Frames per transmit slot.
    slot_frames: u32,
    /// Per transmit slot: descriptors posted and not yet completed.
    slot_pending: Vec<u8>,
    /// Received frames the fill ring had no room for yet (normally empty).
    fill_backlog: Vec<u64>,
    /// Multi-buffer frames are gathered here.
    scratch: Vec<u8>,
    /// The largest frame handled (see `XdpOptions::max_frame`).
    max_frame: u32,
    multi_buffer: bool,
    copy_mode: bool,
    /// Descriptors one copy-mode `sendto` may carry (see `XskSocket::set_tx_budget`).
    tx_budget: u32,
    /// `sendto` calls made to transmit (copy mode: the kernel's transmit runs in them).
    tx_kicks: u64,
    /// Frames delivered from this queue.
    rx_frames: u64,
    /// Received frames not delivered: descriptors outside the UMEM (never expected) or a
    /// frame larger than `max_frame`.
    rx_dropped: u64,
    /// Frames the device dropped at transmit (EBUSY from the kick), or that `fill` made
    /// empty or larger than the capacity.
    tx_dropped: u64,
}

impl Queue {
    /// Return transmitted frames from the completion ring; a slot is free again when all
    /// of its descriptors are back.
    fn reclaim(&mut self) {
        let n = self.sock.comp.peek(self.sock.comp.size());
        let fs = u64::from(self.sock.umem.frame_size());
        let slot_bytes = fs * u64::from(self.slot_frames);
        for i in 0..n {
            let addr = self.sock.comp.read(i);
            let Some(off) = addr.checked_sub(self.tx_base) else {
                continue; // not a transmit frame: the kernel never does this
            };
            let slot = (off / slot_bytes) as usize;
            if let Some(p) = self.slot_pending.get_mut(slot) {
                *p = p.saturating_sub(1);
                if *p == 0 {
                    self.tx_free.push(self.tx_base + slot as u64 * slot_bytes);
                }
            }
        }
        self.sock.comp.release(n);
    }

    /// Make the kernel transmit what is on the tx ring.
    ///
    /// Copy mode transmits inside `sendto`, at most a budget of descriptors per call
    /// (EAGAIN when more remain, or when the completion ring is full), so it is called until
    /// the ring is drained, reclaiming completions in between. Zero-copy drivers transmit
    /// asynchronously: one wake-up, and only if the kernel asked for it.
    fn kick(&mut self) -> io::Result<()> {
        if !self.copy_mode {
            if self.sock.tx.needs_wakeup()
                || self.sock.bind_flags() & bind_flags::USE_NEED_WAKEUP == 0
            {
                self.tx_kicks += 1;
                match self.sock.kick_tx() {
                    Ok(()) => {}
                    Err(e) if transient(&e) => {}
                    Err(e) => return Err(ctx(e, "AF_XDP tx kick")),
                }
            }
            return Ok(());
        }
        for _ in 0..1024 {
            self.tx_kicks += 1;
            match self.sock.kick_tx() {
                Ok(()) => {}
                // One frame was dropped by the device (NET_XMIT_DROP); go on with the rest.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => self.tx_dropped += 1,
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
                Err(e) if transient(&e) => break,
                Err(e) => return Err(ctx(e, "AF_XDP tx kick")),
            }
            self.reclaim();
            if self.sock.tx.outstanding() == 0 {
                break;
            }
        }
        Ok(())
    }

    /// Give frame `base` back to the kernel: into the fill ring reservation (slot `filled`
    /// of `reserved`) or, if that is used up, the backlog.
    fn recycle(&mut self, addr: u64, filled: &mut u32, reserved: u32) {
        if usize::try_from(addr).is_ok_and(|a| a < self.sock.umem.len()) {
            let base = self.sock.umem.frame_base(addr);
            if *filled < reserved {
                self.sock.fill.write(*filled, base);
                *filled += 1;
            } else {
                self.fill_backlog.push(base);
            }
        }
    }

    fn recv(&mut self, max: u32, f: &mut dyn FnMut(&[u8]), st: &mut IoStats) -> u32 {
        // Frames that did not fit on the fill ring last time go first.
        if !self.fill_backlog.is_empty() {
            let k = self.sock.fill.reserve(self.fill_backlog.len() as u32);
            for i in 0..k {
                let a = self.fill_backlog.pop().unwrap_or_default();
                self.sock.fill.write(i, a);
            }
            self.sock.fill.submit(k);
        }
        // All ready descriptors: a multi-buffer frame takes several.
        let avail = self.sock.rx.peek(self.sock.rx.size());
        if avail == 0 {
            return 0;
        }
        let reserved = self.sock.fill.reserve(avail);
        let mut filled = 0;
        let mut used = 0; // descriptors of complete frames handled
        let mut frames = 0;
        let frame_size = self.sock.umem.frame_size();
        'frames: while frames < max && used < avail {
            let first = self.sock.rx.read(used);
            // The frame's last descriptor is the first one without XDP_PKT_CONTD.
            let mut last = used;
            while self.sock.rx.read(last).options & XDP_PKT_CONTD != 0 {
                last += 1;
                if last == avail {
                    break 'frames; // the rest of this frame is not posted yet
                }
            }
            if last == used {
                match self.sock.umem.bytes(first.addr, first.len) {
                    Some(frame) if first.len <= frame_size => {
                        st.rx_frames += 1;
                        st.rx_bytes += u64::from(first.len);
                        f(frame);
                    }
                    _ => self.rx_dropped += 1,
                }
            } else {
                self.scratch.clear();
                let mut ok = true;
                for j in used..=last {
                    let d = self.sock.rx.read(j);
                    match self.sock.umem.bytes(d.addr, d.len) {
                        Some(part)
                            if self.scratch.len() + part.len() <= self.max_frame as usize =>
                        {
                            self.scratch.extend_from_slice(part)
                        }
                        _ => ok = false,
                    }
                }
                if ok {
                    st.rx_frames += 1;
                    st.rx_bytes += self.scratch.len() as u64;
                    f(&self.scratch);
                } else {
                    self.rx_dropped += 1;
                }
            }
            for j in used..=last {
                let addr = self.sock.rx.read(j).addr;
                self.recycle(addr, &mut filled, reserved);
            }
            used = last + 1;
            frames += 1;
        }
        self.rx_frames += u64::from(frames);
        // The frames were read (and `f` is done with them): hand the descriptors back, then
        // the frames to the kernel for new frames.
        self.sock.rx.release(used);
        self.sock.fill.submit(filled);
        if self.sock.fill.needs_wakeup() {
            self.sock.wake_rx();
        }
        frames
    }

    /// Up to `max` frames from `fill` onto the tx ring; returns (fill calls that produced a
    /// frame, frames posted, bytes posted).
    fn send(
        &mut self,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> (usize, u64, u64) {
        self.reclaim();
        let per = self.slot_frames as usize; // worst-case descriptors per frame
        let want = max
            .min(self.tx_free.len())
            .saturating_mul(per)
            .min(u32::MAX as usize) as u32;
        let k = self.sock.tx.reserve(want);
        let fs = self.sock.umem.frame_size();
        let slot_bytes = u64::from(fs) * u64::from(self.slot_frames);
        let (mut calls, mut frames, mut bytes) = (0usize, 0u64, 0u64);
        let mut posted = 0u32;
        while calls < max && k - posted >= self.slot_frames {
            let Some(&addr) = self.tx_free.last() else {
                break;
            };
            let Some(buf) = self.sock.umem.bytes_mut(addr, self.max_frame) else {
                break;
            };
            let Some(len) = fill(buf) else { break };
            calls += 1;
            if len == 0 || len > self.max_frame as usize {
                self.tx_dropped += 1;
                continue;
            }
            self.tx_free.pop();
            let len = len as u32;
            let descs = len.div_ceil(fs);
            for j in 0..descs {
                let part = (len - j * fs).min(fs);
                self.sock.tx.write(
                    posted + j,
                    XdpDesc {
                        addr: addr + u64::from(j * fs),
                        len: part,
                        options: if j + 1 < descs { XDP_PKT_CONTD } else { 0 },
                    },
                );
            }
            let slot = ((addr - self.tx_base) / slot_bytes) as usize;
            self.slot_pending[slot] = descs as u8;
            posted += descs;
            frames += 1;
            bytes += u64::from(len);
        }
        self.sock.tx.submit(posted);
        (calls, frames, bytes)
    }
}

fn transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAGAIN) | Some(libc::EBUSY) | Some(libc::ENOBUFS) | Some(libc::ENETDOWN)
    )
}

/// An AF_XDP device on one or more receive queues of an interface. See the module
/// documentation.
pub struct XdpDevice {
    // Field order is drop order: the sockets close (leaving the XSKMAP) before the program
    // is detached.
    queues: Vec<Queue>,
    attach: Arc<Attachment>,
    zero_copy: bool,
    next_rx: usize,
    stats: IoStats,
    /// IP multicast groups joined on the interface.
    groups: super::GroupMemberships,
}

impl XdpDevice {
    /// Open queue `queue` of `ifname` (in the calling thread's network namespace; use
    /// [`crate::io::enter_netns`] in a dedicated thread for another one). Needs root
    /// (CAP_NET_ADMIN, CAP_BPF, CAP_NET_RAW).
    pub fn open(ifname: &str, queue: u32, opts: XdpOptions) -> io::Result<XdpDevice> {
        Self::open_queues(ifname, &[queue], opts)
    }

    /// Open every receive queue `ifname` has now (the channel count ethtool reports).
    pub fn open_all_queues(ifname: &str, opts: XdpOptions) -> io::Result<XdpDevice> {
        let n = rx_queue_count(ifname)
            .map_err(|e| ctx(e, format!("counting the queues of {ifname}")))?;
        let qs: Vec<u32> = (0..n).collect();
        Self::open_queues(ifname, &qs, opts)
    }

    /// Open the given receive queues of `ifname`.
    pub fn open_queues(ifname: &str, queues: &[u32], opts: XdpOptions) -> io::Result<XdpDevice> {
        validate(&opts, queues)?;
        let ifindex = if_nametoindex(ifname)?;
        let attach = attachment(ifname, ifindex, &opts)?;
        let mut dev = XdpDevice {
            queues: Vec::with_capacity(queues.len()),
            attach,
            zero_copy: false,
            next_rx: 0,
            stats: IoStats::default(),
            groups: super::GroupMemberships::new(ifindex),
        };
        for &q in queues {
            let queue = open_queue(&dev.attach, q, &opts)?;
            dev.zero_copy = !queue.copy_mode;
            dev.queues.push(queue);
        }
        tracing::info!(ifname, queues = ?queues, zero_copy = dev.zero_copy, "AF_XDP device open");
        Ok(dev)
    }

    /// Native or generic XDP.
    pub fn mode(&self) -> ActiveMode {
        self.attach.mode
    }

    /// Whether the sockets run in zero-copy mode (as the kernel reports it).
    pub fn is_zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// Whether the sockets are multi-buffer (`XDP_USE_SG`): frames above one UMEM frame.
    pub fn is_multi_buffer(&self) -> bool {
        self.queues.iter().all(|q| q.multi_buffer)
    }

    /// `"bpf_link"`, `"netlink"` or `"adopted"` (a ferroce program found attached).
    pub fn attach_method(&self) -> &'static str {
        self.attach.method()
    }

    /// The queues this device serves.
    pub fn queue_ids(&self) -> Vec<u32> {
        self.queues.iter().map(|q| q.id).collect()
    }

    /// Frames received so far on each queue: `(queue id, frames)`.
    pub fn rx_frames_per_queue(&self) -> Vec<(u32, u64)> {
        self.queues.iter().map(|q| (q.id, q.rx_frames)).collect()
    }

    /// The kernel id of the XDP program (as `ip link` and `bpftool` show it).
    pub fn program_id(&self) -> io::Result<u32> {
        Ok(self.attach.prog.info()?.id)
    }

    /// `sendto` calls made to transmit, summed over the queues (copy mode: each carries
    /// up to the transmit budget of frames through the kernel).
    pub fn tx_kicks(&self) -> u64 {
        self.queues.iter().map(|q| q.tx_kicks).sum()
    }

    /// Descriptors one copy-mode `sendto` may carry (32 where the kernel has no
    /// `XDP_MAX_TX_SKB_BUDGET`).
    pub fn tx_budget(&self) -> u32 {
        self.queues.first().map_or(32, |q| q.tx_budget)
    }

    /// The kernel's socket counters, summed over the queues.
    pub fn kernel_stats(&self) -> io::Result<XskStats> {
        let mut t = XskStats::default();
        for q in &self.queues {
            let s = q.sock.stats()?;
            t.rx_dropped += s.rx_dropped;
            t.rx_invalid_descs += s.rx_invalid_descs;
            t.tx_invalid_descs += s.tx_invalid_descs;
            t.rx_ring_full += s.rx_ring_full;
            t.rx_fill_ring_empty_descs += s.rx_fill_ring_empty_descs;
            t.tx_ring_empty_descs += s.tx_ring_empty_descs;
        }
        Ok(t)
    }

    /// Run the attached XDP program on `frame` in the kernel (`BPF_PROG_TEST_RUN`, as if it
    /// arrived on queue 0) and return its verdict ([`ebpf::action`]): `REDIRECT` for what
    /// this device would receive (if it serves queue 0), `PASS` for what the kernel gets.
    /// A diagnostic; nothing is received or sent.
    pub fn program_verdict(&self, frame: &[u8]) -> io::Result<u32> {
        self.attach
            .prog
            .test_run(frame)
            .map_err(|e| ctx(e, "BPF_PROG_TEST_RUN"))
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        self.queues.iter().map(|q| q.sock.fd()).collect()
    }
}

/// Frames larger than one UMEM frame can hold on receive are wanted.
fn wants_multi_buffer(opts: &XdpOptions) -> bool {
    opts.max_frame > opts.frame_size - XDP_PACKET_HEADROOM
}

fn validate(opts: &XdpOptions, queues: &[u32]) -> io::Result<()> {
    let bad = |m: String| Err(io::Error::new(io::ErrorKind::InvalidInput, m));
    if queues.is_empty() {
        return bad("no queue to open".into());
    }
    if let Some(q) = queues.iter().find(|&&q| q >= XSKMAP_ENTRIES) {
        return bad(format!(
            "queue {q} is beyond the XSKMAP ({XSKMAP_ENTRIES} entries)"
        ));
    }
    if !matches!(opts.frame_size, 2048 | 4096) {
        return bad(format!(
            "frame_size {} must be 2048 or 4096",
            opts.frame_size
        ));
    }
    if opts.frame_count < 2 || !opts.frame_count.is_power_of_two() {
        return bad(format!(
            "frame_count {} must be a power of two >= 2",
            opts.frame_count
        ));
    }
    if opts.ring_size == 0 || !opts.ring_size.is_power_of_two() {
        return bad(format!(
            "ring_size {} must be a power of two",
            opts.ring_size
        ));
    }
    Ok(())
}

fn open_queue(attach: &Attachment, q: u32, opts: &XdpOptions) -> io::Result<Queue> {
    let cfg = XskConfig {
        frame_size: opts.frame_size,
        frame_count: opts.frame_count,
        fill_size: opts.ring_size,
        comp_size: opts.ring_size,
        rx_size: opts.ring_size,
        tx_size: opts.ring_size,
    };
    let wake = if opts.need_wakeup {
        bind_flags::USE_NEED_WAKEUP
    } else {
        0
    };
    let name = &attach.ifname;
    let fs = opts.frame_size;
    let want_sg = wants_multi_buffer(opts);
    let open = |flags: u16| {
        let attempt = |sg: u16| {
            XskSocket::open(attach.ifindex, q, &cfg, flags | wake | sg)
                .map_err(|e: XskError| (e.error.raw_os_error(), io::Error::from(e)))
        };
        if !want_sg {
            return attempt(0);
        }
        match attempt(bind_flags::USE_SG) {
            // Before Linux 6.6 the kernel does not know XDP_USE_SG: single-buffer then.
            Err((Some(libc::EINVAL), _)) => attempt(0),
            r => r,
        }
    };
    let sock = match (opts.zero_copy, attach.mode) {
        (ZeroCopy::No, _) | (ZeroCopy::Auto, ActiveMode::Generic) => open(bind_flags::COPY),
        (ZeroCopy::Yes, _) => open(bind_flags::ZEROCOPY),
        (ZeroCopy::Auto, ActiveMode::Native) => match open(bind_flags::ZEROCOPY) {
            Ok(s) => Ok(s),
            // The driver cannot do zero-copy (EOPNOTSUPP), or not in this configuration.
            Err((Some(libc::EOPNOTSUPP) | Some(libc::EINVAL), _)) => open(bind_flags::COPY),
            Err(e) => Err(e),
        },
    }
    .map_err(|(errno, e)| {
        if opts.zero_copy == ZeroCopy::Yes && errno == Some(libc::EOPNOTSUPP) {
            io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{name} q{q}: the driver does not support AF_XDP zero-copy ({e})"),
            )
        } else {
            ctx(e, format!("{name} q{q}"))
        }
    })?;
    let multi_buffer = sock.bind_flags() & bind_flags::USE_SG != 0;
    let copy_mode = !sock.is_zero_copy().map_err(|e| ctx(e, "XDP_OPTIONS"))?;
    // Copy mode transmits inside sendto, 32 descriptors a call by default: let one call
    // take the whole ring where the kernel allows it (6.17+), so a batch is one kick.
    let tx_budget = if copy_mode && sock.set_tx_budget(opts.ring_size).is_ok() {
        opts.ring_size
    } else {
        32
    };
    tracing::debug!(ifname = %name, queue = q, zero_copy = !copy_mode, multi_buffer, tx_budget, "AF_XDP socket bound");

    // Into the XSKMAP at the queue's index: from now on the program redirects here.
    attach
        .map
        .update_u32(q, sock.fd().as_raw_fd() as u32, bpf::ANY)
        .map_err(|e| ctx(e, format!("adding the socket of {name} q{q} to the XSKMAP")))?;

    // Half of the frames to the fill ring (receive), the rest for transmit slots; each side
    // at most a ring's worth of descriptors (more could never be in flight).
    let max_frame = if multi_buffer {
        opts.max_frame
    } else {
        opts.max_frame.min(fs - XDP_PACKET_HEADROOM)
    };
    let slot_frames = max_frame.div_ceil(fs).max(1);
    let rx_frames = (opts.frame_count / 2).min(opts.ring_size);
    let tx_slots = ((opts.frame_count - rx_frames) / slot_frames).min(opts.ring_size / slot_frames);
    if tx_slots == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "frame_count/ring_size too small for max_frame {}",
                opts.max_frame
            ),
        ));
    }
    let fs64 = u64::from(fs);
    let tx_base = u64::from(rx_frames) * fs64;
    let slot_bytes = u64::from(slot_frames) * fs64;
    let mut queue = Queue {
        id: q,
        sock,
        tx_free: (0..u64::from(tx_slots))
            .rev()
            .map(|i| tx_base + i * slot_bytes)
            .collect(),
        tx_base,
        slot_frames,
        slot_pending: vec![0; tx_slots as usize],
        fill_backlog: Vec::new(),
        scratch: Vec::new(),
        max_frame,
        multi_buffer,
        copy_mode,
        tx_budget,
        rx_frames: 0,
        rx_dropped: 0,
        tx_dropped: 0,
        tx_kicks: 0,
    };
    let k = queue.sock.fill.reserve(rx_frames);
    for i in 0..k {
        queue.sock.fill.write(i, u64::from(i) * fs64);
    }
    queue.sock.fill.submit(k);
    Ok(queue)
}

impl Drop for XdpDevice {
    fn drop(&mut self) {
        // Take the sockets out of the XSKMAP before closing them (closing alone also removes
        // them; this makes the order explicit). The program itself goes with the last
        // reference to the attachment.
        for q in &self.queues {
            let _ = self.attach.map.delete_u32(q.id);
        }
        tracing::info!(ifname = %self.attach.ifname, queues = self.queues.len(), stats = ?self.stats, "AF_XDP device closed");
    }
}

impl PacketDevice for XdpDevice {
    fn recv_batch(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let nq = self.queues.len();
        let mut n = 0usize;
        for k in 0..nq {
            if n >= max {
                break;
            }
            let qi = (self.next_rx + k) % nq;
            let want = (max - n).min(u32::MAX as usize) as u32;
            n += self.queues[qi].recv(want, f, &mut self.stats) as usize;
        }
        self.next_rx = (self.next_rx + 1) % nq;
        Ok(n)
    }

    fn send_batch(
        &mut self,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> io::Result<usize> {
        // Always the first queue: frames leave in the order they were given.
        let q = &mut self.queues[0];
        let (n, frames, bytes) = q.send(max, fill);
        self.stats.tx_frames += frames;
        self.stats.tx_bytes += bytes;
        if frames > 0 || q.sock.tx.outstanding() > 0 {
            q.kick()?;
        }
        Ok(n)
    }

    fn wait_readable(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        if self.queues.iter_mut().any(|q| q.sock.rx.available(1) > 0) {
            return Ok(());
        }
        poll_readable(&self.fds(), timeout).map_err(|e| ctx(e, "poll"))?;
        Ok(())
    }

    /// One queue: its socket, so the runtime sleeps on it together with its doorbell. Several
    /// queues: `None` (the runtime then uses `wait_readable`, which polls them all).
    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        (self.queues.len() == 1).then(|| self.queues[0].sock.fd().as_raw_fd())
    }

    /// [`XdpOptions::max_frame`] with multi-buffer; without, what fits one UMEM frame on
    /// receive: `frame_size` minus the kernel's 256-byte headroom (3840 for 4096).
    fn frame_capacity(&self) -> usize {
        self.queues[0].max_frame as usize
    }

    /// Local counters plus the kernel's: `rx_dropped` adds the socket's dropped frames (too
    /// big, rx ring full), `tx_dropped` the invalid tx descriptors and device drops.
    fn stats(&self) -> IoStats {
        let mut s = self.stats;
        for q in &self.queues {
            s.rx_dropped += q.rx_dropped;
            s.tx_dropped += q.tx_dropped;
        }
        if let Ok(k) = self.kernel_stats() {
            s.rx_dropped += k.rx_dropped + k.rx_ring_full;
            s.tx_dropped += k.tx_invalid_descs;
        }
        s
    }

    /// A member of the group on the interface ([`super::GroupMemberships`]); the XDP program
    /// redirects its RoCE frames (UDP 4791) to the sockets like any others.
    fn join_group(&mut self, group: std::net::IpAddr, join: bool) -> io::Result<()> {
        self.groups.join_group(group, join)
    }

    fn describe(&self) -> String {
        let qs: Vec<String> = self.queues.iter().map(|q| q.id.to_string()).collect();
        format!(
            "af_xdp({} q{}, {}, {})",
            self.attach.ifname,
            qs.join(","),
            self.attach.mode.as_str(),
            if self.zero_copy {
                "zero-copy".to_string()
            } else {
                format!("copy, tx budget {}", self.tx_budget())
            }
        )
    }
}
