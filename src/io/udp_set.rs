//! Several addresses over the UDP-socket backend: one [`UdpDevice`] per address, as one
//! packet device.
//!
//! A kernel RoCE device serves every address of its interface: rxe on an interface with a
//! link-local IPv6 address and an IPv4 one answers at both, and `ibv_rc_pingpong -g 0`
//! (GID 0, the link-local address) is how its users are told to run it. A UDP socket is
//! bound to one address (the ICRC covers the source address, so a wildcard socket cannot say
//! which one a datagram left from), so a device serving several is a socket per address:
//! [`UdpSet`].
//!
//! **Transmit** goes out of the socket bound to the frame's source address. The first
//! address's frames are written by the engine straight into that device's buffers, as with a
//! lone [`UdpDevice`]; a frame from another address is copied aside and sent through its
//! own device at the end of the batch (its ICRC is recomputed there for the headers the
//! kernel writes, as every frame's is). A frame from an address the set does not hold is
//! dropped and counted (`tx_dropped`).
//!
//! **Receive** takes from each device in turn, the one started with rotating, so that a busy
//! address cannot keep another's frames waiting. [`PacketDevice::poll_fd`] is an epoll
//! descriptor over every socket ([`ReadySet`]): the engine sleeps on one descriptor as
//! before.

use super::event::ReadySet;
use super::{IcrcCheck, IoStats, Medium, PacketDevice, UdpConfig, UdpDevice};
use crate::wire::eth;
use std::io;
use std::net::IpAddr;
use std::time::Duration;

/// One packet device over several UDP sockets, one per local address (module docs).
pub struct UdpSet {
    /// The configuration each device was opened with (but for its address): an address
    /// served later ([`PacketDevice::serve_address`]) opens with it too.
    cfg: UdpConfig,
    devs: Vec<UdpDevice>,
    locals: Vec<IpAddr>,
    ready: ReadySet,
    /// Frames waiting for the device of their source address (index into `devs`, 1..),
    /// within one `send_batch`.
    aside: Vec<Vec<Vec<u8>>>,
    /// Buffers of sent frames, for the next batch's copies.
    spare: Vec<Vec<u8>>,
    /// Frames from an address the set does not hold.
    foreign: u64,
    /// The device the next receive starts with.
    next_rx: usize,
    /// Receives in a row that found nothing, per device ([`IDLE_AFTER`]).
    idle: Vec<u32>,
    /// Receive calls so far.
    rounds: u32,
}

/// A device whose last this many receives found nothing is idle: it is asked only every
/// [`IDLE_EVERY`]th receive, so that an address nobody talks to costs a busy engine one
/// `recvmmsg` in that many rounds rather than one each (measured on a veth pair with
/// Debian's `ib_send_lat`, asking it every round added about 1 µs of the 7–8).
const IDLE_AFTER: u32 = 64;
/// See [`IDLE_AFTER`]. A frame that comes to an idle address waits at most this many
/// receives (the engine's sleep ends at once: the set's descriptor is readable).
const IDLE_EVERY: u32 = 16;

/// The source address of an Ethernet frame carrying IPv4 or IPv6 (`None`: neither, or too
/// short), read from the header without checking it (the device that sends it checks).
fn source_of(frame: &[u8]) -> Option<IpAddr> {
    let ip = frame.get(eth::HEADER_LEN..)?;
    match u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]) {
        eth::ETHERTYPE_IPV4 => {
            let b: [u8; 4] = ip.get(12..16)?.try_into().ok()?;
            Some(IpAddr::from(b))
        }
        eth::ETHERTYPE_IPV6 => {
            let b: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
            Some(IpAddr::from(b))
        }
        _ => None,
    }
}

/// A device with `cfg` but bound to `local`.
fn open_at(cfg: &UdpConfig, local: IpAddr) -> io::Result<UdpDevice> {
    UdpDevice::open(&UdpConfig {
        local,
        ..cfg.clone()
    })
}

impl UdpSet {
    /// Open one device per address of `locals` (the first is the one most traffic is expected
    /// from: its frames are not copied), each with `cfg` but for its address. Every address
    /// must open: see [`UdpSet::open_available`] for a set of whichever do.
    pub fn open(cfg: &UdpConfig, locals: &[IpAddr]) -> io::Result<UdpSet> {
        let devs = locals
            .iter()
            .map(|a| open_at(cfg, *a))
            .collect::<io::Result<Vec<_>>>()?;
        UdpSet::of(cfg, devs)
    }

    /// Open the first address's device (an error if it cannot be), then as many of the others
    /// as open: an address taken by another program or gone (or, without
    /// [`UdpConfig::freebind`], still tentative) is left out and logged. Returns the set and
    /// the addresses it holds, in the order given.
    pub fn open_available(cfg: &UdpConfig, locals: &[IpAddr]) -> io::Result<(UdpSet, Vec<IpAddr>)> {
        let Some((first, rest)) = locals.split_first() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a UDP device set needs at least one address",
            ));
        };
        let mut devs = vec![open_at(cfg, *first)?];
        for a in rest {
            match open_at(cfg, *a) {
                Ok(d) => devs.push(d),
                Err(e) => {
                    tracing::warn!(addr = %a, error = %e, "address not served: its UDP socket did not open")
                }
            }
        }
        let set = UdpSet::of(cfg, devs)?;
        let held = set.locals.clone();
        Ok((set, held))
    }

    fn of(cfg: &UdpConfig, devs: Vec<UdpDevice>) -> io::Result<UdpSet> {
        if devs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a UDP device set needs at least one address",
            ));
        }
        let fds: Vec<_> = devs.iter().filter_map(|d| d.poll_fd()).collect();
        let ready = ReadySet::new(&fds)?;
        let idle = vec![0; devs.len()];
        Ok(UdpSet {
            cfg: cfg.clone(),
            locals: devs.iter().map(|d| d.local_addr().ip()).collect(),
            aside: devs.iter().map(|_| Vec::new()).collect(),
            devs,
            ready,
            spare: Vec::new(),
            foreign: 0,
            next_rx: 0,
            idle,
            rounds: 0,
        })
    }

    /// The addresses served, in the set's order.
    pub fn locals(&self) -> &[IpAddr] {
        &self.locals
    }

    /// The one device of a set of one address; the set itself otherwise.
    pub fn into_single(mut self) -> Result<UdpDevice, Box<UdpSet>> {
        if self.devs.len() == 1 {
            return Ok(self.devs.remove(0));
        }
        Err(Box::new(self))
    }

    /// The device of each address, in the set's order.
    pub fn devices(&self) -> &[UdpDevice] {
        &self.devs
    }
}

impl PacketDevice for UdpSet {
    fn recv_batch(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        self.recv_batch_checked(max, &mut |fr, _| f(fr))
    }

    fn recv_batch_checked(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], IcrcCheck),
    ) -> io::Result<usize> {
        let k = self.devs.len();
        let start = self.next_rx % k;
        self.next_rx = self.next_rx.wrapping_add(1);
        self.rounds = self.rounds.wrapping_add(1);
        let every = k == 1 || self.rounds % IDLE_EVERY == 0;
        let mut n = 0;
        let mut failed = None;
        for i in (0..k).map(|j| (start + j) % k) {
            if n >= max {
                break;
            }
            if self.idle[i] >= IDLE_AFTER && !every {
                continue;
            }
            match self.devs[i].recv_batch_checked(max - n, f) {
                Ok(0) => self.idle[i] = self.idle[i].saturating_add(1),
                Ok(got) => {
                    n += got;
                    self.idle[i] = 0;
                }
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        match failed {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
    }

    fn send_batch(
        &mut self,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>,
    ) -> io::Result<usize> {
        let (first, others) = self.devs.split_at_mut(1);
        let locals = &self.locals;
        let aside = &mut self.aside;
        let spare = &mut self.spare;
        let mut pulled = 0;
        let mut foreign = 0;
        // The first address's frames go into its device's own buffers; the others' are set
        // aside on the way.
        let r = first[0].send_batch(max, &mut |buf| loop {
            if pulled >= max {
                return None;
            }
            let n = fill(buf)?;
            pulled += 1;
            let frame = &buf[..n.min(buf.len())];
            match source_of(frame).map(|s| locals.iter().position(|l| *l == s)) {
                // not IP (the device counts it as dropped) or the first address's
                None | Some(Some(0)) => return Some(n),
                Some(Some(i)) => {
                    let mut v = spare.pop().unwrap_or_default();
                    v.clear();
                    v.extend_from_slice(frame);
                    aside[i].push(v);
                }
                Some(None) => foreign += 1,
            }
        });
        self.foreign += foreign;
        let mut failed = r.err();
        for (i, dev) in others.iter_mut().enumerate() {
            let waiting = &mut aside[i + 1];
            if waiting.is_empty() {
                continue;
            }
            let mut next = 0;
            let r = dev.send_batch(waiting.len(), &mut |buf| {
                let v = waiting.get(next)?;
                let n = v.len().min(buf.len());
                buf[..n].copy_from_slice(&v[..n]);
                next += 1;
                Some(n)
            });
            if let Err(e) = r {
                failed = failed.or(Some(e));
            }
            spare.append(waiting);
        }
        // Keep a bounded stock of buffers: one batch's worth.
        spare.truncate(64);
        match failed {
            Some(e) if pulled == 0 => Err(e),
            _ => Ok(pulled),
        }
    }

    fn wait_readable(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        super::event::poll_readable(&[self.ready.fd()], timeout).map(drop)
    }

    fn frame_capacity(&self) -> usize {
        self.devs
            .iter()
            .map(|d| d.frame_capacity())
            .min()
            .unwrap_or(0)
    }

    fn medium(&self) -> Medium {
        Medium::UdpSocket
    }

    fn stats(&self) -> IoStats {
        let mut s = IoStats::default();
        for d in &self.devs {
            let t = d.stats();
            s.rx_frames += t.rx_frames;
            s.rx_bytes += t.rx_bytes;
            s.tx_frames += t.tx_frames;
            s.tx_bytes += t.tx_bytes;
            s.rx_dropped += t.rx_dropped;
            s.tx_dropped += t.tx_dropped;
            s.tx_offloaded += t.tx_offloaded;
            s.rx_coalesced += t.rx_coalesced;
            s.rx_kernel_drops += t.rx_kernel_drops;
        }
        s.tx_dropped += self.foreign;
        s
    }

    fn describe(&self) -> String {
        let each: Vec<String> = self.devs.iter().map(|d| d.describe()).collect();
        format!("udp-set[{}]", each.join(", "))
    }

    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.ready.fd())
    }

    /// The kernel-side filter over every socket of the set (when each device offers one:
    /// [`UdpConfig::filter`]).
    fn rx_filter(&self) -> Option<crate::io::udp_filter::SocketFilter> {
        let parts = self
            .devs
            .iter()
            .map(|d| d.rx_filter())
            .collect::<Option<Vec<_>>>()?;
        Some(crate::io::udp_filter::SocketFilter::joined(parts))
    }

    fn rx_udp_checksum_synthesised(&self) -> bool {
        true
    }

    /// A socket for `local` joins the set (none is needed for an address it holds). The
    /// socket is bound as the others (with `IP_FREEBIND` where they are: an address just
    /// added is tentative for a while if it is IPv6). It is not under the kernel-side filter
    /// (the runtime programs the sockets it was given at start).
    fn serve_address(&mut self, local: IpAddr) -> io::Result<()> {
        if self.locals.contains(&local) {
            return Ok(());
        }
        let d = open_at(
            &UdpConfig {
                filter: false,
                ..self.cfg.clone()
            },
            local,
        )?;
        if let Some(fd) = d.poll_fd() {
            self.ready.add(fd)?;
        }
        tracing::info!(%local, "UDP device set serves another address");
        self.devs.push(d);
        self.locals.push(local);
        self.aside.push(Vec::new());
        self.idle.push(0);
        Ok(())
    }

    /// Joined through the first device of the group's address family.
    fn join_group(&mut self, group: IpAddr, join: bool) -> io::Result<()> {
        let Some(i) = self
            .locals
            .iter()
            .position(|l| l.is_ipv6() == group.to_canonical().is_ipv6())
        else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{group}: no address of its family is served"),
            ));
        };
        self.devs[i].join_group(group, join)?;
        // A device that joined sleeps on a descriptor over its group sockets too: watch it.
        match self.devs[i].poll_fd() {
            Some(fd) if join => self.ready.watch(fd),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// A RoCE SEND frame from `src` to `dst`:`dport` with `payload` bytes of `psn`'s pattern.
    fn frame(src: IpAddr, dst: IpAddr, dport: u16, psn: u32, payload: usize) -> Vec<u8> {
        let mut f = crate::io::udp::tests::frame_with(src, dst, 0, 0xc000, psn, payload);
        crate::io::udp::tests::to_port(&mut f, src, dport);
        f
    }

    fn set(locals: &[IpAddr]) -> Option<UdpSet> {
        let mut c = UdpConfig::new(locals[0]);
        c.port = 0;
        match UdpSet::open(&c, locals) {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("no {locals:?} on loopback here ({e}); skipping");
                None
            }
        }
    }

    /// A set of no address is refused (its send and receive paths index its first device).
    #[test]
    fn a_set_of_no_address_is_refused() {
        let c = UdpConfig::new(IpAddr::V4(Ipv4Addr::LOCALHOST));
        for e in [
            UdpSet::open(&c, &[]).err(),
            UdpSet::open_available(&c, &[]).err(),
        ] {
            assert_eq!(e.map(|e| e.kind()), Some(io::ErrorKind::InvalidInput));
        }
    }

    #[test]
    fn source_of_reads_either_family_and_refuses_short_frames() {
        let v4: IpAddr = Ipv4Addr::new(10, 1, 2, 3).into();
        let v6: IpAddr = "fe80::1".parse().unwrap();
        let f4 = frame(v4, Ipv4Addr::new(10, 1, 2, 4).into(), 4791, 1, 8);
        let f6 = frame(v6, "fe80::2".parse().unwrap(), 4791, 1, 8);
        assert_eq!(source_of(&f4), Some(v4));
        assert_eq!(source_of(&f6), Some(v6));
        for n in 0..f6.len() {
            let _ = source_of(&f6[..n]);
        }
        assert_eq!(source_of(&f4[..eth::HEADER_LEN + 15]), None);
        let mut arp = f4.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(source_of(&arp), None);
    }

    /// Two sets of two addresses each (IPv4 and IPv6 loopback, ephemeral ports) over the
    /// kernel: one batch mixing both sources and one foreign source leaves from the right
    /// sockets (each frame arrives from its source address to the destination's socket, byte
    /// for byte, its ICRC good), the foreign frame is counted, and the receiving set's one
    /// descriptor wakes for a datagram on its second socket alone.
    #[test]
    fn each_frame_leaves_from_its_source_addresss_socket() {
        let v4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
        let (Some(mut a), Some(mut b)) = (set(&[v4, v6]), set(&[v4, v6])) else {
            return;
        };
        assert_eq!(a.locals(), &[v4, v6]);
        let port = |s: &UdpSet, i: usize| s.devices()[i].local_addr().port();
        let (b4, b6) = (port(&b, 0), port(&b, 1));
        // The second socket alone first: the set's descriptor is readable.
        let only6 = frame(v6, v6, b6, 99, 10);
        let mut sent = false;
        a.send_batch(8, &mut |buf| {
            if sent {
                return None;
            }
            sent = true;
            buf[..only6.len()].copy_from_slice(&only6);
            Some(only6.len())
        })
        .unwrap();
        assert!(
            super::super::event::poll_readable(
                &[b.poll_fd().unwrap()],
                Some(Duration::from_secs(5))
            )
            .unwrap(),
            "the set's descriptor did not wake for its IPv6 socket"
        );
        let mut got: Vec<Vec<u8>> = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while got.is_empty() && std::time::Instant::now() < deadline {
            b.recv_batch(8, &mut |f| got.push(f.to_vec())).unwrap();
        }
        assert_eq!(got.len(), 1);
        assert_eq!(source_of(&got[0]), Some(v6));
        // A mixed batch: IPv4, IPv6 and one foreign source.
        let foreign: IpAddr = Ipv4Addr::new(192, 0, 2, 1).into();
        let frames: Vec<Vec<u8>> = (0..12u32)
            .map(|i| match i % 3 {
                0 => frame(v4, v4, b4, i, 100 + i as usize),
                1 => frame(v6, v6, b6, i, 100 + i as usize),
                _ if i == 5 => frame(foreign, v4, b4, i, 1),
                _ => frame(v4, v4, b4, i, 100 + i as usize),
            })
            .collect();
        let mut k = 0;
        let n = a
            .send_batch(64, &mut |buf| {
                let f = frames.get(k)?;
                buf[..f.len()].copy_from_slice(f);
                k += 1;
                Some(f.len())
            })
            .unwrap();
        assert_eq!(n, 12);
        assert_eq!(a.stats().tx_frames, 1 + 11);
        assert_eq!(a.stats().tx_dropped, 1);
        got.clear();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while got.len() < 11 && std::time::Instant::now() < deadline {
            b.wait_readable(Some(Duration::from_millis(50))).unwrap();
            b.recv_batch(64, &mut |f| got.push(f.to_vec())).unwrap();
        }
        assert_eq!(got.len(), 11);
        let mut psns: Vec<u32> = Vec::new();
        for f in &got {
            let v6f = source_of(f).unwrap().is_ipv6();
            let iph = if v6f { 40 } else { 20 };
            let (ip, rest) = f[eth::HEADER_LEN..].split_at(iph);
            let (udp, t) = rest.split_at(8);
            let r = parse_roce(ip, udp, t).unwrap();
            let psn = r.repr.bth.psn.get();
            let want = frames[psn as usize].clone();
            assert_eq!(source_of(&want).unwrap().is_ipv6(), v6f, "PSN {psn}");
            assert_eq!(r.payload.len(), 100 + psn as usize);
            assert!(r
                .payload
                .iter()
                .enumerate()
                .all(|(i, b)| *b == (i as u8) ^ (psn as u8).wrapping_mul(7)));
            psns.push(psn);
        }
        psns.sort_unstable();
        assert_eq!(psns, vec![0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]);
        assert_eq!(b.stats().rx_frames, 12);
        // Both addresses idle now: a frame to either still comes within IDLE_EVERY receives.
        for _ in 0..2 * IDLE_AFTER {
            b.recv_batch(64, &mut |_| {}).unwrap();
        }
        for (src, dport) in [(v6, b6), (v4, b4)] {
            let f = frame(src, src, dport, 7, 20);
            let mut once = Some(f);
            a.send_batch(8, &mut |buf| {
                let f = once.take()?;
                buf[..f.len()].copy_from_slice(&f);
                Some(f.len())
            })
            .unwrap();
            assert!(super::super::event::poll_readable(
                &[b.poll_fd().unwrap()],
                Some(Duration::from_secs(5))
            )
            .unwrap());
            let mut calls = 0;
            let mut got = 0;
            while got == 0 && calls < IDLE_EVERY {
                calls += 1;
                got = b.recv_batch(64, &mut |_| {}).unwrap();
            }
            assert_eq!(got, 1, "{src}: nothing in {calls} receives");
        }
    }
}
