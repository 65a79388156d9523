//! The only place in the crate where `unsafe` is allowed: thin, documented wrappers around
//! the system interfaces the packet backends need (sockets, `setsockopt`, ring `mmap`s,
//! `bpf(2)`, netlink). Everything above this module is safe Rust.
//!
//! - [`bpf`]: `bpf(2)` (maps, program load with the verifier log, BPF links, test runs).
//! - [`netlink`]: rtnetlink `RTM_SETLINK`/`RTM_GETLINK` for `IFLA_XDP` (attach, detach, query).
//! - [`xsk`]: the AF_XDP socket, its UMEM and its four rings.
//! - [`net`]: interface names and indices, queue counts (ethtool), network namespaces.
//! - [`event`]: eventfd and poll, for sleeping engine threads.
//! - [`signal`]: SIGINT/SIGTERM as a flag (clean exit of long-running tools).
//! - [`unix`]: abstract-named Unix datagram sockets with their senders' credentials.
//! - [`ns`]: a private `/dev` with a device node (user and mount namespaces), for
//!   `ferroce run --dev-node`.
//!
//! Every raw file descriptor is held in a [`std::os::fd::OwnedFd`] (or a newtype around one),
//! so that it is closed exactly once, on drop.
#![allow(unsafe_code)]

pub mod bpf;
pub mod net;
pub mod netlink;
pub mod ns;
pub mod packet;
pub mod signal;
pub mod sockutil;
pub mod udp;
pub mod unix;
pub mod xsk;

pub use net::{enter_netns, if_mtu, if_nametoindex, if_speed, netns_id, rx_queue_count};

use std::io;

/// `Err(last OS error)` if `ret` is -1, else `Ok(ret)`. For libc calls that return -1 and set
/// `errno`.
fn cvt<T: PartialEq + From<i8>>(ret: T) -> io::Result<T> {
    if ret == T::from(-1) {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub mod event;
