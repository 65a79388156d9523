//! rtnetlink, just enough for XDP: attach or detach a program on an interface
//! (`RTM_SETLINK` with a nested `IFLA_XDP` attribute) and ask which programs are attached
//! (`RTM_GETLINK`).
//!
//! This is the classic way to attach XDP (what `ip link set dev X xdp ...` does). The
//! attachment belongs to the interface, not to a file descriptor: it stays until someone
//! detaches it, also after the process that made it exits. [`super::bpf::attach_xdp_link`]
//! is the alternative that ends with its descriptor.
//!
//! A socket keeps the network namespace it was created in: keep the [`RtNetlink`] that
//! attached a program to detach it later, whichever thread does that.
//!
//! Messages are built and parsed here in plain bytes; the kernel's extended ACK
//! (`NETLINK_EXT_ACK`) is turned on so that a refusal comes with the driver's reason (for
//! instance veth's "Peer MTU is too large to set XDP").

use super::cvt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

// linux/netlink.h, linux/rtnetlink.h, linux/if_link.h
const NETLINK_ROUTE: i32 = 0;
const SOL_NETLINK: i32 = 270;
const NETLINK_CAP_ACK: i32 = 10;
const NETLINK_EXT_ACK: i32 = 11;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSGERR_ATTR_MSG: u16 = 1;
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_SETLINK: u16 = 19;
const NLA_F_NESTED: u16 = 1 << 15;
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | (1 << 14));
const IFLA_EXT_MASK: u16 = 29;
const RTEXT_FILTER_SKIP_STATS: u32 = 1 << 3;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_FLAGS: u16 = 3;
const IFLA_XDP_PROG_ID: u16 = 4;
const IFLA_XDP_DRV_PROG_ID: u16 = 5;
const IFLA_XDP_SKB_PROG_ID: u16 = 6;
const IFLA_XDP_HW_PROG_ID: u16 = 7;
const IFLA_XDP_EXPECTED_FD: u16 = 8;

/// `XDP_FLAGS_UPDATE_IF_NOEXIST`: fail (EBUSY) instead of replacing an attached program.
pub const XDP_FLAGS_UPDATE_IF_NOEXIST: u32 = 1 << 0;
/// `XDP_FLAGS_SKB_MODE`: generic XDP, run by the core network stack on an sk_buff (works on
/// every interface; slower, AF_XDP copy mode only).
pub const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// `XDP_FLAGS_DRV_MODE`: native XDP, run by the driver before an sk_buff exists.
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
/// `XDP_FLAGS_REPLACE`: replace (or remove) only if the attached program is
/// `IFLA_XDP_EXPECTED_FD`'s.
pub const XDP_FLAGS_REPLACE: u32 = 1 << 4;

const NLMSG_HDRLEN: usize = 16;
const IFINFOMSG_LEN: usize = 16;

/// How a program is attached, from `IFLA_XDP_ATTACHED` (`XDP_ATTACHED_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum XdpAttached {
    #[default]
    None,
    Driver,
    Skb,
    Hardware,
    /// Programs in more than one mode at once.
    Multi,
    Unknown(u8),
}

/// The XDP state of one interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct XdpQuery {
    pub attached: XdpAttached,
    /// `IFLA_XDP_PROG_ID`: the program id when exactly one is attached.
    pub prog_id: u32,
    /// Per-mode program ids (0 = none in that mode).
    pub drv_prog_id: u32,
    pub skb_prog_id: u32,
    pub hw_prog_id: u32,
}

impl XdpQuery {
    /// The id of the driver- or generic-mode program, if any.
    pub fn any_prog_id(&self) -> Option<u32> {
        [self.drv_prog_id, self.skb_prog_id, self.prog_id]
            .into_iter()
            .find(|&id| id != 0)
    }
}

/// A netlink error: the errno and, if the kernel sent one, its extended-ACK message.
#[derive(Debug)]
pub struct NlError {
    pub errno: i32,
    pub message: Option<String>,
}

impl std::fmt::Display for NlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", io::Error::from_raw_os_error(self.errno))?;
        if let Some(m) = &self.message {
            write!(f, " (kernel says: {m})")?;
        }
        Ok(())
    }
}

impl std::error::Error for NlError {}

impl From<NlError> for io::Error {
    fn from(e: NlError) -> io::Error {
        if e.message.is_none() {
            io::Error::from_raw_os_error(e.errno)
        } else {
            io::Error::new(io::Error::from_raw_os_error(e.errno).kind(), e.to_string())
        }
    }
}

impl From<io::Error> for NlError {
    fn from(e: io::Error) -> NlError {
        NlError {
            errno: e.raw_os_error().unwrap_or(libc::EIO),
            message: None,
        }
    }
}

/// An rtnetlink socket (closed on drop).
#[derive(Debug)]
pub struct RtNetlink {
    fd: OwnedFd,
}

static SEQ: AtomicU32 = AtomicU32::new(1);

fn push_attr(buf: &mut Vec<u8>, ty: u16, data: &[u8]) {
    let len = 4 + data.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(data);
    while buf.len() % 4 != 0 {
        buf.push(0);
    }
}

/// Iterate the attributes `(type without flags, payload)` in `buf`.
fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let ty = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            return None;
        }
        let data = &buf[4..len];
        let adv = ((len + 3) & !3).min(buf.len());
        buf = &buf[adv..];
        Some((ty, data))
    })
}

fn u32_of(d: &[u8]) -> u32 {
    d.get(..4)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .unwrap_or(0)
}

/// A request: nlmsghdr + ifinfomsg(index) + attributes.
fn link_request(ty: u16, flags: u16, seq: u32, ifindex: u32, attrs: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(NLMSG_HDRLEN + IFINFOMSG_LEN + attrs.len());
    let len = (NLMSG_HDRLEN + IFINFOMSG_LEN + attrs.len()) as u32;
    m.extend_from_slice(&len.to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid: 0 = to the kernel
                                              // struct ifinfomsg
    m.push(libc::AF_UNSPEC as u8); // ifi_family
    m.push(0); // pad
    m.extend_from_slice(&0u16.to_ne_bytes()); // ifi_type
    m.extend_from_slice(&(ifindex as i32).to_ne_bytes()); // ifi_index
    m.extend_from_slice(&0u32.to_ne_bytes()); // ifi_flags
    m.extend_from_slice(&0u32.to_ne_bytes()); // ifi_change
    m.extend_from_slice(attrs);
    m
}

/// One netlink message of a reply: (type, flags, seq, payload).
fn messages(mut buf: &[u8]) -> impl Iterator<Item = (u16, u16, u32, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32_of(buf) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return None;
        }
        let ty = u16::from_ne_bytes([buf[4], buf[5]]);
        let flags = u16::from_ne_bytes([buf[6], buf[7]]);
        let seq = u32_of(&buf[8..]);
        let payload = &buf[NLMSG_HDRLEN..len];
        buf = &buf[((len + 3) & !3).min(buf.len())..];
        Some((ty, flags, seq, payload))
    })
}

/// Decode an `NLMSG_ERROR` payload: `Ok(())` for an ACK (error 0), else the error with the
/// extended-ACK message if present.
fn decode_error(flags: u16, payload: &[u8]) -> Result<(), NlError> {
    let errno = -(u32_of(payload) as i32);
    if errno == 0 {
        return Ok(());
    }
    let mut message = None;
    if flags & NLM_F_ACK_TLVS != 0 {
        // struct nlmsgerr { int error; struct nlmsghdr msg; } + (capped: no original payload)
        // + TLVs. NETLINK_CAP_ACK is set, so the original message is not echoed.
        if let Some(tlvs) = payload.get(4 + NLMSG_HDRLEN..) {
            for (ty, d) in attrs(tlvs) {
                if ty == NLMSGERR_ATTR_MSG {
                    let end = d.iter().position(|&b| b == 0).unwrap_or(d.len());
                    message = Some(String::from_utf8_lossy(&d[..end]).into_owned());
                }
            }
        }
    }
    Err(NlError { errno, message })
}

impl RtNetlink {
    /// `socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE)` with extended ACKs on, in the calling
    /// thread's network namespace.
    pub fn open() -> io::Result<RtNetlink> {
        // SAFETY: plain socket(2); the descriptor is owned by the OwnedFd below.
        let fd = cvt(unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                NETLINK_ROUTE,
            )
        })?;
        // SAFETY: `fd` was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let one: libc::c_int = 1;
        for opt in [NETLINK_EXT_ACK, NETLINK_CAP_ACK] {
            // SAFETY: setsockopt reads sizeof(int) bytes from `one`. Failure is harmless
            // (older kernels): errors then come without a message.
            unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    SOL_NETLINK,
                    opt,
                    &one as *const libc::c_int as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
        Ok(RtNetlink { fd })
    }

    fn send(&self, msg: &[u8]) -> io::Result<()> {
        // SAFETY: a zeroed sockaddr_nl with the family set addresses the kernel.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: msg is readable for its length; sa is a valid sockaddr_nl.
        let r = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                &sa as *const libc::sockaddr_nl as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn recv<'a>(&self, buf: &'a mut [u8]) -> io::Result<&'a [u8]> {
        loop {
            // SAFETY: buf is writable for its length.
            let r =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            return Ok(&buf[..r as usize]);
        }
    }

    /// Send `msg` (sequence number `seq`) and wait for its reply; `on_msg` sees every
    /// non-error message of that sequence. Ends at the ACK (`NLMSG_ERROR` 0), an error, or
    /// `NLMSG_DONE`.
    fn transact(
        &self,
        msg: &[u8],
        seq: u32,
        mut on_msg: impl FnMut(u16, &[u8]),
        want_ack: bool,
    ) -> Result<(), NlError> {
        self.send(msg)?;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let got = self.recv(&mut buf)?;
            let mut done = false;
            for (ty, flags, s, payload) in messages(got) {
                if s != seq {
                    continue; // a late answer to something else
                }
                match ty {
                    NLMSG_ERROR => {
                        decode_error(flags, payload)?;
                        return Ok(());
                    }
                    NLMSG_DONE => done = true,
                    _ => {
                        on_msg(ty, payload);
                        if !want_ack {
                            done = true;
                        }
                    }
                }
            }
            if done {
                return Ok(());
            }
        }
    }

    /// Attach (`fd` ≥ 0) or detach (`fd` = -1) an XDP program on `ifindex` with `flags`
    /// (`XDP_FLAGS_*`). With `expected_fd`, `XDP_FLAGS_REPLACE` is added and the kernel acts
    /// only if the program attached now is that one (how a detach avoids removing somebody
    /// else's program).
    pub fn set_xdp(
        &self,
        ifindex: u32,
        fd: i32,
        flags: u32,
        expected_fd: Option<i32>,
    ) -> Result<(), NlError> {
        let mut inner = Vec::new();
        push_attr(&mut inner, IFLA_XDP_FD, &fd.to_ne_bytes());
        let mut flags = flags;
        if let Some(e) = expected_fd {
            flags |= XDP_FLAGS_REPLACE;
            push_attr(&mut inner, IFLA_XDP_EXPECTED_FD, &e.to_ne_bytes());
        }
        push_attr(&mut inner, IFLA_XDP_FLAGS, &flags.to_ne_bytes());
        let mut a = Vec::new();
        push_attr(&mut a, IFLA_XDP | NLA_F_NESTED, &inner);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let msg = link_request(RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK, seq, ifindex, &a);
        self.transact(&msg, seq, |_, _| {}, true)
    }

    /// Which XDP programs `ifindex` runs.
    pub fn query_xdp(&self, ifindex: u32) -> Result<XdpQuery, NlError> {
        let mut a = Vec::new();
        push_attr(
            &mut a,
            IFLA_EXT_MASK,
            &RTEXT_FILTER_SKIP_STATS.to_ne_bytes(),
        );
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let msg = link_request(RTM_GETLINK, NLM_F_REQUEST, seq, ifindex, &a);
        let mut q = XdpQuery::default();
        self.transact(
            &msg,
            seq,
            |ty, payload| {
                if ty != RTM_NEWLINK || payload.len() < IFINFOMSG_LEN {
                    return;
                }
                for (t, d) in attrs(&payload[IFINFOMSG_LEN..]) {
                    if t != IFLA_XDP {
                        continue;
                    }
                    for (t, d) in attrs(d) {
                        match t {
                            IFLA_XDP_ATTACHED => {
                                q.attached = match d.first().copied().unwrap_or(0) {
                                    0 => XdpAttached::None,
                                    1 => XdpAttached::Driver,
                                    2 => XdpAttached::Skb,
                                    3 => XdpAttached::Hardware,
                                    4 => XdpAttached::Multi,
                                    x => XdpAttached::Unknown(x),
                                }
                            }
                            IFLA_XDP_PROG_ID => q.prog_id = u32_of(d),
                            IFLA_XDP_DRV_PROG_ID => q.drv_prog_id = u32_of(d),
                            IFLA_XDP_SKB_PROG_ID => q.skb_prog_id = u32_of(d),
                            IFLA_XDP_HW_PROG_ID => q.hw_prog_id = u32_of(d),
                            _ => {}
                        }
                    }
                }
            },
            false,
        )?;
        // With a single program the kernel sends only IFLA_XDP_PROG_ID; file it by mode.
        match q.attached {
            XdpAttached::Driver if q.drv_prog_id == 0 => q.drv_prog_id = q.prog_id,
            XdpAttached::Skb if q.skb_prog_id == 0 => q.skb_prog_id = q.prog_id,
            XdpAttached::Hardware if q.hw_prog_id == 0 => q.hw_prog_id = q.prog_id,
            _ => {}
        }
        Ok(q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_padded_and_parsed_back() {
        let mut b = Vec::new();
        push_attr(&mut b, 1, &[7]);
        push_attr(&mut b, 2 | NLA_F_NESTED, &5u32.to_ne_bytes());
        assert_eq!(b.len(), 8 + 8);
        let v: Vec<_> = attrs(&b).collect();
        assert_eq!(v, vec![(1, &[7u8][..]), (2, &5u32.to_ne_bytes()[..])]);
    }

    #[test]
    fn error_with_ext_ack_message() {
        let mut p = Vec::new();
        p.extend_from_slice(&(-libc::EINVAL).to_ne_bytes());
        p.extend_from_slice(&[0u8; NLMSG_HDRLEN]);
        push_attr(&mut p, NLMSGERR_ATTR_MSG, b"Peer MTU is too large\0");
        let e = decode_error(NLM_F_ACK_TLVS, &p).unwrap_err();
        assert_eq!(e.errno, libc::EINVAL);
        assert_eq!(e.message.as_deref(), Some("Peer MTU is too large"));
        assert!(decode_error(0, &0i32.to_ne_bytes()).is_ok());
    }
}
