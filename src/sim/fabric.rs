//! A star fabric for the real RC engine: N [`Device`]s attached to one simulated switch. Each
//! host's uplink into the switch and the switch's port to each host are [`Network`] links, so
//! a switch egress port is a queue with a rate, a buffer limit and RED/ECN marking — the
//! congestion point of a DCQCN experiment. The switch forwards by destination MAC.
//! Deterministic from a seed; the clock jumps to the next delivery or device deadline.

use super::net::{EndpointId, LinkConfig, Network};
use crate::time::{Duration, Instant};
use crate::verbs::{Device, DeviceConfig};
use crate::wire::MacAddr;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

/// N hosts and a switch.
pub struct Fabric {
    /// The hosts' devices (host `i` has [`host_mac`]`(i)` and [`host_ip`]`(i)`).
    pub hosts: Vec<Device>,
    /// The seeded network: a link each way between each host and the switch.
    pub net: Network,
    /// The virtual clock.
    pub now: Instant,
    switch: EndpointId,
    eps: Vec<EndpointId>,
    by_mac: HashMap<MacAddr, usize>,
    buf: Vec<u8>,
    /// Frames the switch could not forward (unknown destination MAC).
    pub unroutable: u64,
}

/// Host `i`'s MAC and IP address.
pub fn host_mac(i: usize) -> MacAddr {
    MacAddr([0x02, 0xfa, 0, 0, (i >> 8) as u8, i as u8])
}
/// Host `i`'s IPv4 address (10.200.x.y).
pub fn host_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 200, (i >> 8) as u8, i as u8 + 1))
}

impl Fabric {
    /// `n` hosts; `uplink` is every host→switch link; `port(i)` the switch→host-i link (the
    /// egress queue towards host i). `cfg(i)` may adjust each device's configuration.
    pub fn new(
        seed: u64,
        n: usize,
        uplink: LinkConfig,
        port: impl Fn(usize) -> LinkConfig,
        cfg: impl Fn(usize, &mut DeviceConfig),
    ) -> Fabric {
        let mut net = Network::new(seed);
        let switch = net.add_endpoint();
        let mut hosts = Vec::new();
        let mut eps = Vec::new();
        let mut by_mac = HashMap::new();
        for i in 0..n {
            let ep = net.add_endpoint();
            net.connect(ep, switch, uplink);
            net.connect(switch, ep, port(i));
            let mut c = DeviceConfig::new(host_mac(i), host_ip(i))
                .with_seed(seed ^ ((i as u64 + 1) * 0x9e37));
            cfg(i, &mut c);
            hosts.push(Device::new(c));
            eps.push(ep);
            by_mac.insert(host_mac(i), i);
        }
        Fabric {
            hosts,
            net,
            now: Instant::ZERO,
            switch,
            eps,
            by_mac,
            buf: vec![0u8; 16384],
            unroutable: 0,
        }
    }

    /// Endpoint ids: the switch, and host `i`.
    pub fn switch(&self) -> EndpointId {
        self.switch
    }
    /// Host `i`'s endpoint id on the network.
    pub fn endpoint(&self, i: usize) -> EndpointId {
        self.eps[i]
    }

    /// One step (see [`super::Pair::step`]). Returns false when nothing is left to do.
    pub fn step(&mut self) -> bool {
        let mut moved = false;
        for i in 0..self.hosts.len() {
            while let Some(n) = self.hosts[i]
                .poll_transmit(self.now, &mut self.buf)
                // The buffer (16 KiB) is larger than any frame (path MTU 4096 + 98 bytes).
                .expect("frame buffer too small")
            {
                self.net
                    .send(self.now, self.eps[i], self.switch, self.buf[..n].to_vec());
                moved = true;
            }
        }
        while let Some(d) = self.net.poll_deliver(self.now) {
            moved = true;
            if d.to == self.switch {
                let dst = (d.frame.len() >= 6)
                    .then(|| MacAddr(d.frame[..6].try_into().unwrap_or([0; 6])));
                match dst.and_then(|m| self.by_mac.get(&m)) {
                    Some(&j) => self.net.send(self.now, self.switch, self.eps[j], d.frame),
                    None => self.unroutable += 1,
                }
            } else if let Some(i) = self.eps.iter().position(|&e| e == d.to) {
                self.hosts[i].handle_frame(self.now, &d.frame);
            }
        }
        if moved {
            return true;
        }
        let next = std::iter::once(self.net.next_event())
            .chain(self.hosts.iter().map(|h| h.poll_timeout()))
            .flatten()
            .min();
        match next {
            None => false,
            Some(t) => {
                self.now = self.now.max(t);
                for h in &mut self.hosts {
                    h.handle_timeout(self.now);
                }
                true
            }
        }
    }

    /// Step until `limit` of virtual time has passed (or nothing is left).
    pub fn run_for(&mut self, limit: Duration) {
        let end = self.now + limit;
        while self.now < end && self.step() {}
    }

    /// Step until `done` holds or `limit` passes.
    pub fn run_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&mut Fabric) -> bool,
    ) -> bool {
        let end = self.now + limit;
        while self.now < end {
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
