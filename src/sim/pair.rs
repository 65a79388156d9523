//! A deterministic harness: two [`Device`]s joined by a simulated link, driven on a virtual
//! clock that jumps to the next deadline (a network delivery or a device timer), in the manner
//! of quinn-proto's test `Pair`.

use super::net::{EndpointId, LinkConfig, Network};
use crate::time::{Duration, Instant};
use crate::verbs::{AvError, Device, DeviceConfig, RcParams, VerbsError};
use crate::wire::{MacAddr, QpNumber};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Two devices, A and B, and the network between them.
pub struct Pair {
    /// Device A (10.0.0.1 or fd00::1, MAC 02:00:00:00:00:01).
    pub a: Device,
    /// Device B (10.0.0.2 or fd00::2, MAC 02:00:00:00:00:02).
    pub b: Device,
    /// The simulated network between them.
    pub net: Network,
    /// The virtual clock.
    pub now: Instant,
    ea: EndpointId,
    eb: EndpointId,
    buf: Vec<u8>,
    /// Frames handed to the network.
    pub frames: u64,
    /// Optional record of every frame delivered: (time, from A?, bytes).
    pub trace: Option<Vec<(Instant, bool, Vec<u8>)>>,
}

/// Addressing of the pair: IPv4 (10.0.0.1, 10.0.0.2) or IPv6 (fd00::1, fd00::2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// 10.0.0.1 and 10.0.0.2.
    V4,
    /// fd00::1 and fd00::2.
    V6,
}

impl Pair {
    /// A pair over IPv4 with the same link in both directions.
    pub fn new(seed: u64, link: LinkConfig) -> Self {
        Self::with_family(seed, link, Family::V4)
    }

    /// A pair of `family` addresses with the same link in both directions; `seed` fixes the
    /// network's randomness and (derived) each device's keys.
    pub fn with_family(seed: u64, link: LinkConfig, family: Family) -> Self {
        Self::configured(seed, link, family, |_| {})
    }

    /// As [`Pair::with_family`], with `tweak` applied to both devices' configurations (e.g.
    /// `DeviceConfig::fast_recovery`) before they are made.
    pub fn configured(
        seed: u64,
        link: LinkConfig,
        family: Family,
        tweak: impl Fn(&mut DeviceConfig),
    ) -> Self {
        let ip = |i: u8| match family {
            Family::V4 => IpAddr::V4(Ipv4Addr::new(10, 0, 0, i)),
            Family::V6 => IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(i))),
        };
        let mk = |i: u8, s: u64| {
            let mut c = DeviceConfig::new(MacAddr([2, 0, 0, 0, 0, i]), ip(i)).with_seed(s);
            tweak(&mut c);
            Device::new(c)
        };
        Self::from_devices(seed, link, mk(1, seed ^ 0xa), mk(2, seed ^ 0xb))
    }

    /// A pair of devices you configured yourself.
    pub fn from_devices(seed: u64, link: LinkConfig, a: Device, b: Device) -> Self {
        let mut net = Network::new(seed);
        let ea = net.add_endpoint();
        let eb = net.add_endpoint();
        net.connect_both(ea, eb, link);
        Pair {
            a,
            b,
            net,
            now: Instant::ZERO,
            ea,
            eb,
            buf: vec![0u8; 16384],
            frames: 0,
            trace: None,
        }
    }

    /// Connect QP `qa` on A and QP `qb` on B with `params`, A starting its sends at PSN
    /// `psn_a` and B at `psn_b` (each end's `local_psn` is replaced by its own).
    pub fn connect(
        &mut self,
        qa: QpNumber,
        qb: QpNumber,
        params: &RcParams,
        psn_a: u32,
        psn_b: u32,
    ) -> Result<(), VerbsError> {
        let missing = VerbsError::BadAddressVector(AvError::NoSuchGid(params.sgid_index));
        let sgid = usize::from(params.sgid_index);
        let ra = self.a.local_end(qa, sgid, psn_a).ok_or(missing)?;
        let rb = self.b.local_end(qb, sgid, psn_b).ok_or(missing)?;
        let pa = RcParams {
            local_psn: psn_a,
            ..*params
        };
        let pb = RcParams {
            local_psn: psn_b,
            ..*params
        };
        self.a.connect_rc(qa, &rb, &pa)?;
        self.b.connect_rc(qb, &ra, &pb)
    }

    /// Change the link conditions in both directions.
    pub fn set_link(&mut self, link: LinkConfig) {
        for (x, y) in [(self.ea, self.eb), (self.eb, self.ea)] {
            if let Some(l) = self.net.link_mut(x, y) {
                *l = link;
            }
        }
    }

    /// Endpoint ids (A, B) for network statistics.
    pub fn endpoints(&self) -> (EndpointId, EndpointId) {
        (self.ea, self.eb)
    }

    /// One step: hand every frame the devices have to the network, deliver every frame that
    /// is due; if nothing moved, jump the clock to the next deadline. Returns false when
    /// nothing is left to do at all.
    pub fn step(&mut self) -> bool {
        let mut moved = false;
        while let Some(n) = self
            .a
            .poll_transmit(self.now, &mut self.buf)
            // The buffer (16 KiB) is larger than any frame (path MTU 4096 + 98 bytes).
            .expect("frame buffer too small")
        {
            self.net
                .send(self.now, self.ea, self.eb, self.buf[..n].to_vec());
            self.frames += 1;
            moved = true;
        }
        while let Some(n) = self
            .b
            .poll_transmit(self.now, &mut self.buf)
            // The buffer (16 KiB) is larger than any frame (path MTU 4096 + 98 bytes).
            .expect("frame buffer too small")
        {
            self.net
                .send(self.now, self.eb, self.ea, self.buf[..n].to_vec());
            self.frames += 1;
            moved = true;
        }
        while let Some(d) = self.net.poll_deliver(self.now) {
            let to_a = d.to == self.ea;
            if let Some(t) = self.trace.as_mut() {
                t.push((self.now, !to_a, d.frame.clone()));
            }
            if to_a {
                self.a.handle_frame(self.now, &d.frame);
            } else {
                self.b.handle_frame(self.now, &d.frame);
            }
            moved = true;
        }
        if moved {
            return true;
        }
        let next = [
            self.net.next_event(),
            self.a.poll_timeout(),
            self.b.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        match next {
            None => false,
            Some(t) => {
                self.now = self.now.max(t);
                self.a.handle_timeout(self.now);
                self.b.handle_timeout(self.now);
                true
            }
        }
    }

    /// Step until nothing is left or `limit` of virtual time has passed. Returns false if
    /// the limit was hit.
    pub fn drive_for(&mut self, limit: Duration) -> bool {
        let end = self.now + limit;
        while self.now <= end {
            if !self.step() {
                return true;
            }
        }
        false
    }

    /// Step until `done(self)` holds or `limit` of virtual time passes.
    pub fn drive_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&mut Pair) -> bool,
    ) -> bool {
        let end = self.now + limit;
        while self.now <= end {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        false
    }
}
