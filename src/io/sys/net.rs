//! Interfaces and network namespaces: name → index, how many receive queues an interface has,
//! and entering a named network namespace.
//!
//! All of these act in the network namespace **of the calling thread** (a socket or an
//! ioctl resolves interface names there). A socket keeps the namespace it was created in for
//! its whole life, whichever thread uses it later.

use super::cvt;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

/// The index of interface `name` in the calling thread's network namespace
/// (`if_nametoindex(3)`). `NotFound` if there is no such interface.
pub fn if_nametoindex(name: &str) -> io::Result<u32> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(['/', '\0']) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {name:?}"),
        ));
    }
    let c = CString::new(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        let e = io::Error::last_os_error();
        // glibc reports a missing interface as ENODEV.
        return Err(match e.raw_os_error() {
            Some(libc::ENODEV) | Some(libc::ENXIO) => io::Error::new(
                io::ErrorKind::NotFound,
                format!("interface '{name}' not found (in this network namespace)"),
            ),
            _ => e,
        });
    }
    Ok(idx)
}

/// A datagram socket for ioctls (`SIOCETHTOOL` needs some socket; which kind does not matter).
fn ioctl_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the returned descriptor is owned by the OwnedFd.
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` is a freshly created descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `struct ethtool_channels` (linux/ethtool.h).
#[repr(C)]
#[derive(Default)]
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

const ETHTOOL_GCHANNELS: u32 = 0x3c;

/// The number of receive queues `name` has now, from ethtool's channel counts
/// (`SIOCETHTOOL`/`ETHTOOL_GCHANNELS`): receive-only channels plus combined channels. A
/// veth reports `rx_count` = its real number of rx queues (1 unless created with
/// `numrxqueues`), a multi-queue NIC usually reports combined channels. Drivers without
/// `get_channels` have one queue as far as AF_XDP is concerned; for them this returns 1.
pub fn rx_queue_count(name: &str) -> io::Result<u32> {
    let mut ch = EthtoolChannels {
        cmd: ETHTOOL_GCHANNELS,
        ..Default::default()
    };
    // SAFETY: `EthtoolChannels` is `struct ethtool_channels` of the kernel's layout, with the
    // command ETHTOOL_GCHANNELS that answers in it.
    match unsafe { ethtool(name, &mut ch) } {
        Ok(()) => Ok((ch.rx_count + ch.combined_count).max(1)),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(1),
        Err(e) => Err(e),
    }
}

/// `SIOCETHTOOL` on interface `name` with the command structure `data` (its first field the
/// `ETHTOOL_*` command), which the kernel reads and answers in.
///
/// # Safety
/// `T` is the kernel's structure for the command in it (`#[repr(C)]`, the same layout), big
/// enough for everything that command writes.
unsafe fn ethtool<T>(name: &str, data: &mut T) -> io::Result<()> {
    if_nametoindex(name)?; // a clear NotFound first
    let sock = ioctl_socket()?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = (data as *mut T).cast();
    // SAFETY: SIOCETHTOOL reads the command from, and writes the answer to, `data` (the
    // caller's promise: the command's structure), which lives until the call returns; `ifr`
    // names the interface (NUL-terminated: the name is shorter than IFNAMSIZ, checked by
    // if_nametoindex, and the rest of the array is zero).
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut ifr) })?;
    Ok(())
}

/// `struct ethtool_cmd` (linux/ethtool.h), the legacy settings ioctl's answer: the link speed
/// in Mb/s is `speed | speed_hi << 16`.
#[repr(C)]
#[derive(Default)]
struct EthtoolCmd {
    cmd: u32,
    supported: u32,
    advertising: u32,
    speed: u16,
    duplex: u8,
    port: u8,
    phy_address: u8,
    transceiver: u8,
    autoneg: u8,
    mdio_support: u8,
    maxtxpkt: u32,
    maxrxpkt: u32,
    speed_hi: u16,
    eth_tp_mdix: u8,
    eth_tp_mdix_ctrl: u8,
    lp_advertising: u32,
    reserved: [u32; 2],
}

const ETHTOOL_GSET: u32 = 0x1;

/// The link speed of interface `name` in Mb/s as its driver reports it (`SIOCETHTOOL`/
/// `ETHTOOL_GSET`, what `ethtool NAME` shows as "Speed"; no privilege needed): `Ok(None)` when
/// the driver has no speed to give (no link settings at all, as loopback, or
/// `SPEED_UNKNOWN`, as a virtio NIC not told one).
pub fn if_speed(name: &str) -> io::Result<Option<u32>> {
    let mut cmd = EthtoolCmd {
        cmd: ETHTOOL_GSET,
        ..Default::default()
    };
    // SAFETY: `EthtoolCmd` is `struct ethtool_cmd` of the kernel's layout, with the command
    // ETHTOOL_GSET that answers in it.
    match unsafe { ethtool(name, &mut cmd) } {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => return Ok(None),
        Err(e) => return Err(e),
    }
    let mbps = u32::from(cmd.speed) | u32::from(cmd.speed_hi) << 16;
    // SPEED_UNKNOWN is -1; 0 is no driver's speed either.
    Ok(Some(mbps).filter(|&m| m != u32::MAX && m != 0))
}

/// The MTU of interface `name` in the calling thread's network namespace (`SIOCGIFMTU`).
///
/// Not `/sys/class/net/NAME/mtu`: sysfs shows the namespace it was mounted in, not the
/// calling thread's, so a thread that entered another namespace would read the MTU of a
/// same-named interface of the host (or find none).
pub fn if_mtu(name: &str) -> io::Result<u32> {
    if_nametoindex(name)?; // validates the name (length, characters) and gives a clear NotFound
    let sock = ioctl_socket()?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: SIOCGIFMTU reads the NUL-terminated name from `ifr` (shorter than IFNAMSIZ, the
    // rest of the array is zero) and writes the MTU into its union; `ifr` lives until the call
    // returns.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU, &mut ifr) })?;
    // SAFETY: after a successful SIOCGIFMTU the union holds `ifru_mtu`.
    let mtu = unsafe { ifr.ifr_ifru.ifru_mtu };
    u32::try_from(mtu).map_err(|_| io::Error::other(format!("{name}: negative MTU {mtu}")))
}

/// Move the **calling thread** into the network namespace `name`, i.e. the one
/// `ip netns add NAME` created and bind-mounted at `/run/netns/NAME` (`/var/run/netns` is the
/// same directory on Debian). Uses `setns(fd, CLONE_NEWNET)`.
///
/// Only this thread changes namespace; the rest of the process stays where it was. Call it
/// first thing in a thread dedicated to that namespace: sockets, interface indices and BPF
/// links created by the thread afterwards belong to `name`. Needs CAP_SYS_ADMIN.
pub fn enter_netns(name: &str) -> io::Result<()> {
    if name.is_empty() || name.contains(['/', '\0']) || name == "." || name == ".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad network namespace name {name:?}"),
        ));
    }
    let path = format!("/run/netns/{name}");
    let f = File::open(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("network namespace '{name}': cannot open {path}: {e}"),
        )
    })?;
    // SAFETY: setns(2) on a descriptor we own for the duration of the call.
    cvt(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("setns into network namespace '{name}': {e} (needs CAP_SYS_ADMIN)"),
        )
    })?;
    Ok(())
}

/// An identifier of the calling thread's network namespace: the (device, inode) pair of
/// `/proc/thread-self/ns/net`, equal for two threads exactly when they share the namespace.
pub fn netns_id() -> io::Result<(u64, u64)> {
    let m = std::fs::metadata("/proc/thread-self/ns/net")?;
    Ok((m.dev(), m.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_of_loopback_and_of_a_missing_interface() {
        // Every network namespace has `lo`; Linux gives it 65536 (older kernels 16436).
        let mtu = if_mtu("lo").expect("lo");
        assert!(mtu >= 1280, "lo has MTU {mtu}");
        let e = if_mtu("nosuch0").expect_err("no such interface");
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        assert!(if_mtu("bad/name").is_err());
    }

    #[test]
    fn ethtool_answers_for_loopback_and_a_missing_interface() {
        // lo has neither channels nor link settings: one queue, no speed.
        assert_eq!(rx_queue_count("lo").unwrap(), 1);
        assert_eq!(if_speed("lo").unwrap(), None);
        for e in [
            rx_queue_count("nosuch0").unwrap_err(),
            if_speed("nosuch0").unwrap_err(),
        ] {
            assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        }
    }
}
