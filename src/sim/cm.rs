//! A two-endpoint harness for the connection managers: two CMs (IB CM [`crate::cm::Cm`] or
//! RDMA-CM) joined by the seeded [`Network`], a virtual clock, and a trace of every MAD. The
//! network's loss, duplication, reordering and corruption apply to MADs as to any frame;
//! [`CmPair::set_filter`] drops chosen MADs ("the first REQ", "every DREQ").
//!
//! Driving: [`CmPair::step`] moves time to the next delivery or timer, delivers and runs
//! timers; tests read each side's events between steps and answer them, like an application.

use super::net::{EndpointId, LinkConfig, Network};
use crate::cm::rdma::RdmaCm;
use crate::cm::{Cm, MadAddr, Transmit};
use crate::time::{Duration, Instant};
use crate::wire::mad::cm::CmMadRepr;
use crate::wire::mad::Gid;

/// What the harness needs of a connection manager.
pub trait MadEndpoint {
    /// A MAD arrived from `src`.
    fn handle_mad(&mut self, now: Instant, src: MadAddr, bytes: &[u8]);
    /// The next MAD to send.
    fn poll_transmit(&mut self, now: Instant) -> Option<Transmit>;
    /// The next timer.
    fn poll_timeout(&self) -> Option<Instant>;
    /// Run the timers due at `now`.
    fn handle_timeout(&mut self, now: Instant);
}

impl MadEndpoint for Cm {
    fn handle_mad(&mut self, now: Instant, src: MadAddr, bytes: &[u8]) {
        Cm::handle_mad(self, now, src, bytes)
    }
    fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        Cm::poll_transmit(self, now)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Cm::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Instant) {
        Cm::handle_timeout(self, now)
    }
}

impl MadEndpoint for RdmaCm {
    fn handle_mad(&mut self, now: Instant, src: MadAddr, bytes: &[u8]) {
        RdmaCm::handle_mad(self, now, src, bytes)
    }
    fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        RdmaCm::poll_transmit(self, now)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        RdmaCm::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Instant) {
        RdmaCm::handle_timeout(self, now)
    }
}

/// One of the two endpoints.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Side {
    /// The first endpoint (`CmPair::a`).
    A,
    /// The second endpoint (`CmPair::b`).
    B,
}

impl Side {
    /// The other side.
    pub fn other(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
}

/// What happened to one MAD.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Fate {
    /// Handed to the network (which may still lose, duplicate or corrupt it).
    Sent,
    /// Dropped by the filter.
    Filtered,
}

/// A MAD in the trace: when, from which side, what (`None` if it does not parse), its fate.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TraceEntry {
    /// When it was sent.
    pub at: Instant,
    /// Who sent it.
    pub from: Side,
    /// The CM message, if it parses.
    pub mad: Option<CmMadRepr>,
    /// What happened to it.
    pub fate: Fate,
}

impl TraceEntry {
    /// The message's short name (`REQ`, `REP`, ...) or `?`.
    pub fn name(&self) -> &'static str {
        self.mad.map_or("?", |m| m.msg.short_name())
    }
}

type Filter = Box<dyn FnMut(Side, &CmMadRepr) -> bool>;

/// Two connection managers on a seeded network.
pub struct CmPair<E: MadEndpoint> {
    /// Endpoint A.
    pub a: E,
    /// Endpoint B.
    pub b: E,
    /// A's address (as B sees it).
    pub addr_a: MadAddr,
    /// B's address (as A sees it).
    pub addr_b: MadAddr,
    /// The seeded network between them.
    pub net: Network,
    ep_a: EndpointId,
    ep_b: EndpointId,
    /// The virtual clock.
    pub now: Instant,
    /// Every MAD either side sent, in order.
    pub trace: Vec<TraceEntry>,
    filter: Option<Filter>,
}

impl<E: MadEndpoint> CmPair<E> {
    /// `a` at 10.0.0.1 and `b` at 10.0.0.2 (as IPv4-mapped GIDs), both links with `link`.
    pub fn new(a: E, b: E, seed: u64, link: LinkConfig) -> Self {
        let mut net = Network::new(seed);
        let (ep_a, ep_b) = (net.add_endpoint(), net.add_endpoint());
        net.connect_both(ep_a, ep_b, link);
        CmPair {
            a,
            b,
            addr_a: MadAddr::gsi(Gid::from_ip("10.0.0.1".parse().expect("literal"))),
            addr_b: MadAddr::gsi(Gid::from_ip("10.0.0.2".parse().expect("literal"))),
            net,
            ep_a,
            ep_b,
            now: Instant::ZERO,
            trace: Vec::new(),
            filter: None,
        }
    }

    /// A link with 10 µs of latency and nothing else.
    pub fn clean_link() -> LinkConfig {
        LinkConfig::new().latency(Duration::from_micros(10))
    }

    /// Drop every MAD for which `f(sender, mad)` is true (MADs that do not parse are never
    /// filtered).
    pub fn set_filter(&mut self, f: impl FnMut(Side, &CmMadRepr) -> bool + 'static) {
        self.filter = Some(Box::new(f));
    }

    /// Remove the filter.
    pub fn clear_filter(&mut self) {
        self.filter = None;
    }

    /// The endpoint on `side`.
    pub fn side(&mut self, side: Side) -> &mut E {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// Inject raw bytes as if `from` had sent them (delivered after the link's latency).
    pub fn inject(&mut self, from: Side, bytes: Vec<u8>) {
        let (f, t) = self.eps(from);
        self.net.send(self.now, f, t, bytes);
    }

    fn eps(&self, from: Side) -> (EndpointId, EndpointId) {
        match from {
            Side::A => (self.ep_a, self.ep_b),
            Side::B => (self.ep_b, self.ep_a),
        }
    }

    fn flush(&mut self) {
        let now = self.now;
        for side in [Side::A, Side::B] {
            while let Some(t) = self.side(side).poll_transmit(now) {
                let mad = CmMadRepr::parse(&t.mad).ok();
                let drop = match (&mut self.filter, &mad) {
                    (Some(f), Some(m)) => f(side, m),
                    _ => false,
                };
                self.trace.push(TraceEntry {
                    at: self.now,
                    from: side,
                    mad,
                    fate: if drop { Fate::Filtered } else { Fate::Sent },
                });
                if !drop {
                    let (f, to) = self.eps(side);
                    self.net.send(self.now, f, to, t.mad.to_vec());
                }
            }
        }
    }

    /// When something happens next (a delivery or a timer), after sending what is queued.
    pub fn next_event(&mut self) -> Option<Instant> {
        self.flush();
        [
            self.net.next_event(),
            self.a.poll_timeout(),
            self.b.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Send what is queued, move the clock to the next event (never past `limit`), deliver
    /// what arrived and run the timers due. Returns false when nothing is left to happen
    /// before `limit`.
    pub fn step_until(&mut self, limit: Instant) -> bool {
        let Some(t) = self.next_event() else {
            return false;
        };
        if t > limit {
            self.now = self.now.max(limit);
            return false;
        }
        self.now = self.now.max(t);
        while let Some(d) = self.net.poll_deliver(self.now) {
            let (to, src) = if d.to == self.ep_a {
                (Side::A, self.addr_b)
            } else {
                (Side::B, self.addr_a)
            };
            let now = self.now;
            self.side(to).handle_mad(now, src, &d.frame);
        }
        let now = self.now;
        self.a.handle_timeout(now);
        self.b.handle_timeout(now);
        self.flush();
        true
    }

    /// One step with no limit.
    pub fn step(&mut self) -> bool {
        self.step_until(Instant::from_nanos(u64::MAX))
    }

    /// Step until nothing happens before `now + d`, then set the clock there.
    pub fn run_for(&mut self, d: Duration) {
        let limit = self.now + d;
        while self.step_until(limit) {}
        self.now = self.now.max(limit);
    }

    /// The names of the MADs `from` sent (filtered ones included), in order.
    pub fn sent_by(&self, from: Side) -> Vec<&'static str> {
        self.trace
            .iter()
            .filter(|e| e.from == from)
            .map(|e| e.name())
            .collect()
    }

    /// How many `name` MADs `from` sent.
    pub fn count(&self, from: Side, name: &str) -> usize {
        self.trace
            .iter()
            .filter(|e| e.from == from && e.name() == name)
            .count()
    }
}
