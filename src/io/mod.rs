//! Packet I/O: one trait for every way ferroce moves frames ([`PacketDevice`]), the backends
//! (AF_XDP, AF_PACKET, a kernel UDP socket, an in-memory loopback) and wrappers that work over
//! any of them (a pcap tap, a fault injector).
//!
//! The trait is shaped for AF_XDP's UMEM: **the device owns the buffers**. Receive hands the
//! caller each frame in place for the length of a callback; transmit lends the caller a
//! device buffer to write a frame into. Both work in batches, so one system call (or one ring
//! doorbell) moves many frames.
//!
//! All `unsafe` code of the crate lives in the private module `sys` (ring mmaps, `bpf(2)`,
//! netlink, `setsockopt`, eventfd, `poll(2)`, `setns(2)`, signals); what the layers above need
//! of it is re-exported here, safe: [`enter_netns`], [`netns_id`], [`if_nametoindex`], the
//! [`event`] module and [`stop_on_sigint_sigterm`].

pub mod af_packet;
pub mod backend;
pub mod cbpf;
pub mod ebpf;
pub mod fault;
pub mod loopback;
pub mod netdev;
pub mod pcap;
pub mod route;
pub mod share;
mod sys;
pub mod udp;
pub mod udp_filter;
pub mod udp_set;
pub mod xdp;

use std::io;
use std::net::IpAddr;
use std::time::Duration;

pub use af_packet::{AfPacketConfig, AfPacketDevice, AfPacketTx};
pub use fault::{FaultConfig, FaultInjector};
pub use loopback::Loopback;
pub use pcap::{PcapBudget, PcapTap};
pub use udp::{UdpConfig, UdpDevice};
pub use udp_set::UdpSet;
pub use xdp::{AttachMethod, XdpDevice, XdpMode, XdpOptions, XdpProgram, ZeroCopy};

pub use sys::ns::{private_dev_node, verbs_node, VERBS_DEV_NAME};
pub use sys::signal::{stop_on_sigint_sigterm, stop_requested};
pub use sys::{enter_netns, if_nametoindex, netns_id};

/// Sleeping until a descriptor is readable, and waking a sleeper: an eventfd counter and the
/// one `poll(2)` wrapper of the crate.
pub mod event {
    pub use super::sys::event::{
        interrupted, poll_readable, poll_readable_precise, watch_interrupts, EventFd, ReadySet,
        TimerFd,
    };
}

/// What a device carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Medium {
    /// Whole Ethernet frames (AF_XDP, AF_PACKET, loopback).
    Ethernet,
    /// The kernel builds and strips Ethernet, IP and UDP (UDP socket). The device still takes
    /// and gives whole Ethernet frames at this interface, synthesising the outer headers.
    UdpSocket,
}

/// Counters every backend keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct IoStats {
    /// Frames received and handed up.
    pub rx_frames: u64,
    /// Bytes of those frames.
    pub rx_bytes: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// Frames the backend could not deliver up (no buffer, ring full, filtered late).
    pub rx_dropped: u64,
    /// Frames the backend could not send (ring full, send error).
    pub tx_dropped: u64,
    /// Frames that went to the kernel inside a segmentation-offload message (UDP GSO: a run
    /// of frames, one system call's worth of stack traversal).
    pub tx_offloaded: u64,
    /// Frames that arrived inside a coalesced datagram or super-frame (UDP GRO, a GSO
    /// super-frame split by AF_PACKET).
    pub rx_coalesced: u64,
    /// Datagrams the kernel dropped at the device's socket before the backend could read
    /// them: refused by its receive filter (the UDP socket's, [`udp_filter`]) or a full
    /// receive buffer (the socket's own drop count, `SO_MEMINFO`). Only the UDP-socket
    /// backend keeps it (AF_PACKET counts its ring's kernel drops in `rx_dropped`).
    pub rx_kernel_drops: u64,
}

crate::ib::counters::counter_fields!(IoStats {
    rx_frames,
    rx_bytes,
    tx_frames,
    tx_bytes,
    rx_dropped,
    tx_dropped,
    tx_offloaded,
    rx_coalesced,
    rx_kernel_drops,
});

/// What a device already knows of a received frame's ICRC ([`PacketDevice::recv_batch_checked`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IcrcCheck {
    /// Not checked: the engine checks it.
    Unchecked,
    /// The device computed the ICRC over exactly the bytes it hands up (headers included) and
    /// it matched the one the frame carries: the engine need not compute it again.
    Good,
}

/// A packet device.
pub trait PacketDevice: Send {
    /// Receive up to `max` frames. `f` is called once per frame with the frame in the device's
    /// own buffer, valid only during the call. Returns the number of frames received; never
    /// blocks.
    fn recv_batch(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize>;

    /// [`Self::recv_batch`], saying with each frame what the device knows of its ICRC. A
    /// device that computes it anyway (the UDP socket recovers the IPv4 identification from
    /// it) saves the engine a second pass over the frame; a wrapper that may change frames
    /// (the fault injector) must not pass a verdict on. By default: every frame unchecked.
    fn recv_batch_checked(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], IcrcCheck),
    ) -> io::Result<usize> {
        self.recv_batch(max, &mut |fr| f(fr, IcrcCheck::Unchecked))
    }

    /// Send up to `max` frames. `fill` is called with a device buffer of [`Self::frame_capacity`]
    /// bytes and returns the length of the frame it wrote there, or `None` when it has no more
    /// frames. Returns the number of frames sent; never blocks (a full ring ends the batch).
    fn send_batch(
        &mut self,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> io::Result<usize>;

    /// Wait until a frame may be readable or `timeout` passes (`None`: wait indefinitely).
    /// Spurious wake-ups are allowed.
    fn wait_readable(&mut self, timeout: Option<Duration>) -> io::Result<()>;

    /// The largest frame the device can send or receive, in bytes.
    fn frame_capacity(&self) -> usize;

    /// What a frame is on this device (whole Ethernet frames by default).
    fn medium(&self) -> Medium {
        Medium::Ethernet
    }

    /// The device's counters.
    fn stats(&self) -> IoStats;

    /// A short name for logs and `devinfo` (e.g. `af_xdp(veth0 q0, copy)`).
    fn describe(&self) -> String;

    /// A descriptor that becomes readable when frames may be waiting, so that the runtime
    /// can sleep on it together with its doorbell (`None`: use [`Self::wait_readable`]). It
    /// may change when [`Self::join_group`] joins (the UDP device's then covers its group
    /// sockets too): whoever holds it looks again after a join.
    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// A handle that programs the kernel-side receive filter of a device whose kernel can
    /// drop, before queueing, what the engine would drop on its first checks (the UDP socket:
    /// [`udp_filter`]); `None` for the others. The runtime keeps it in step with the QPs.
    fn rx_filter(&self) -> Option<udp_filter::SocketFilter> {
        None
    }

    /// Whether received frames carry UDP checksum 0 in place of the one that was on the wire:
    /// a device that synthesises the headers of what its kernel socket received (the UDP
    /// socket, which has checked the real checksum). A capture then fills it in, since an
    /// IPv6 datagram with checksum 0 is not valid (RFC 8200 §8.1).
    fn rx_udp_checksum_synthesised(&self) -> bool {
        false
    }

    /// Receive (`join`) or stop receiving the frames sent to the IP multicast `group`, as the
    /// kernel's socket layer does with `IP_ADD_MEMBERSHIP` / `IPV6_JOIN_GROUP`. Devices that
    /// cannot: `Unsupported`. A group's frames must wake a sleeper on [`Self::poll_fd`] (as
    /// it reads after the call).
    fn join_group(&mut self, group: IpAddr, join: bool) -> io::Result<()> {
        let _ = (group, join);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this packet device does not join multicast groups",
        ))
    }

    /// Serve `local` too, from now on (an address the interface gained): frames from it
    /// leave, and frames to it arrive. Only a device that binds per address needs it (the
    /// UDP backend's [`UdpSet`]); the others see every address already or cannot.
    fn serve_address(&mut self, local: IpAddr) -> io::Result<()> {
        let _ = local;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this packet device cannot add an address",
        ))
    }
}

impl<D: PacketDevice + ?Sized> PacketDevice for Box<D> {
    fn recv_batch(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        (**self).recv_batch(max, f)
    }
    fn recv_batch_checked(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], IcrcCheck),
    ) -> io::Result<usize> {
        (**self).recv_batch_checked(max, f)
    }
    fn send_batch(
        &mut self,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> io::Result<usize> {
        (**self).send_batch(max, fill)
    }
    fn wait_readable(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        (**self).wait_readable(timeout)
    }
    fn frame_capacity(&self) -> usize {
        (**self).frame_capacity()
    }
    fn medium(&self) -> Medium {
        (**self).medium()
    }
    fn stats(&self) -> IoStats {
        (**self).stats()
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        (**self).poll_fd()
    }
    fn rx_filter(&self) -> Option<udp_filter::SocketFilter> {
        (**self).rx_filter()
    }
    fn rx_udp_checksum_synthesised(&self) -> bool {
        (**self).rx_udp_checksum_synthesised()
    }
    fn join_group(&mut self, group: IpAddr, join: bool) -> io::Result<()> {
        (**self).join_group(group, join)
    }
    fn serve_address(&mut self, local: IpAddr) -> io::Result<()> {
        (**self).serve_address(local)
    }
}

/// The IP multicast groups a raw packet device (AF_PACKET, AF_XDP) is a member of on its
/// interface, one kernel socket each ([`sys::udp::group_member`]): while a group is joined
/// the interface's receive filter takes the group's MAC (01:00:5e:… for IPv4, 33:33:… for
/// IPv6) and the kernel answers IGMP / MLD queries for it, so switches and NICs deliver the
/// group's frames to the device. Leaving closes the socket.
#[derive(Debug)]
pub(crate) struct GroupMemberships {
    ifindex: u32,
    groups: Vec<(IpAddr, std::net::UdpSocket)>,
}

impl GroupMemberships {
    pub(crate) fn new(ifindex: u32) -> GroupMemberships {
        GroupMemberships {
            ifindex,
            groups: Vec::new(),
        }
    }

    /// [`PacketDevice::join_group`] for a raw device on this interface.
    pub(crate) fn join_group(&mut self, group: IpAddr, join: bool) -> io::Result<()> {
        let group = group.to_canonical();
        let ifindex = self.ifindex;
        update_groups(&mut self.groups, group, join, || {
            if !group.is_multicast() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{group} is not an IP multicast group"),
                ));
            }
            sys::udp::group_member(group, ifindex)
        })
    }
}

/// The join/leave bookkeeping of a device's per-group sockets: leaving drops the group's
/// socket (closing it leaves the group), joining a group already joined does nothing, and a
/// new group gets the socket `open` makes (its error, if any, is the join's).
pub(crate) fn update_groups<S>(
    groups: &mut Vec<(IpAddr, S)>,
    group: IpAddr,
    join: bool,
    open: impl FnOnce() -> io::Result<S>,
) -> io::Result<()> {
    let at = groups.iter().position(|(g, _)| *g == group);
    match (join, at) {
        (false, Some(i)) => {
            groups.remove(i);
        }
        (true, None) => {
            let sock = open()?;
            groups.push((group, sock));
        }
        (false, None) | (true, Some(_)) => {}
    }
    Ok(())
}
