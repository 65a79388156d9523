//! The IB CM state machine (`src/cm/ib.rs`) under a hostile network (issue 17): two CMs, A
//! (active) and B (listening), connect, establish, disconnect and resolve service IDs over a
//! lossy, duplicating link while arbitrary MADs arrive at either side, from the peer's address
//! or a stranger's: raw bytes, and real MADs of the run with bytes changed (valid headers with
//! wrong IDs, states, lengths, private data). The consumer calls the API with known and
//! unknown IDs.
//!
//! Invariants after every action: no panic; every MAD given to a CM is counted
//! (`mads_received`); one received MAD makes at most 2 MADs to send (no amplification); the
//! connection table, the transmit queue and the event queue stay within the configured bounds.
//! At the end, with the link clean, injection stopped and the consumer answering every event:
//! every connection either reaches a resting state or goes away when time runs; no connection
//! waits on the network with no timer armed.
//!
//! Shared by `fuzz/fuzz_targets/cm_mad.rs` (libFuzzer) and `tests/cm_fuzz.rs` (stable).

use ferroce::cm::{
    AcceptParams, Cm, CmConfig, CmEvent, CmState, CommId, ConnectParams, MadAddr, Transmit,
};
use ferroce::time::{Duration, Instant};
use ferroce::wire::mad::cm::{RejReason, SidrStatus};
use ferroce::wire::mad::{Gid, MAD_LEN};
use ferroce::wire::{Psn, QpNumber};
use std::collections::VecDeque;

#[path = "input.rs"]
mod input;
use input::Input;

/// What one input did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub actions: usize,
    pub injected: usize,
    pub delivered: usize,
    pub established: u64,
    pub rejected_or_timed_out: usize,
}

const MAX_CONN: usize = 16;
const MAX_TX: usize = 64;
const MAX_EV: usize = 64;

fn cfg(guid: u64, seed: u64) -> CmConfig {
    CmConfig {
        cm_response_timeout: 10,
        packet_lifetime: 8,
        max_cm_retries: 3,
        timewait: Some(Duration::from_millis(5)),
        max_connections: MAX_CONN,
        max_tx_queue: MAX_TX,
        max_events: MAX_EV,
        ..CmConfig::new(guid)
    }
    .with_seed(seed)
}

fn addr(last: u8) -> MadAddr {
    let mut g = [0u8; 16];
    g[..2].copy_from_slice(&[0xfe, 0x80]);
    g[15] = last;
    MadAddr::gsi(Gid(g))
}

struct World {
    now: Instant,
    a: Cm,
    b: Cm,
    addr_a: MadAddr,
    addr_b: MadAddr,
    stranger: MadAddr,
    to_a: VecDeque<[u8; MAD_LEN]>,
    to_b: VecDeque<[u8; MAD_LEN]>,
    /// MADs seen on the link, to mutate.
    seen: Vec<[u8; MAD_LEN]>,
    ids_a: Vec<CommId>,
    ids_b: Vec<CommId>,
    sidr_b: Vec<ferroce::cm::SidrId>,
    st: Stats,
}

impl World {
    fn cm(&mut self, to_b: bool) -> &mut Cm {
        if to_b {
            &mut self.b
        } else {
            &mut self.a
        }
    }

    /// Give one MAD to a CM and check what it did.
    fn give(&mut self, to_b: bool, src: MadAddr, mad: &[u8]) {
        let now = self.now;
        let cm = self.cm(to_b);
        let (recv0, sent0) = (cm.counters().mads_received, cm.counters().mads_sent);
        cm.handle_mad(now, src, mad);
        let c = cm.counters();
        assert_eq!(c.mads_received, recv0 + 1, "every MAD is counted");
        assert!(
            c.mads_sent - sent0 <= 2,
            "one MAD made {} to send",
            c.mads_sent - sent0
        );
        self.pump();
    }

    /// Move what the CMs send onto the link, take their events, check the bounds.
    fn pump(&mut self) {
        let now = self.now;
        for to_b in [false, true] {
            let peer = if to_b { self.addr_b } else { self.addr_a };
            let cm = if to_b { &mut self.a } else { &mut self.b };
            assert!(cm.connection_count() <= MAX_CONN, "connection table bound");
            let mut n = 0;
            while let Some(Transmit { dest, mad, .. }) = cm.poll_transmit(now) {
                n += 1;
                assert!(n <= MAX_TX, "transmit queue bound");
                if self.seen.len() < 64 {
                    self.seen.push(mad);
                }
                if dest.gid == peer.gid {
                    let q = if to_b { &mut self.to_b } else { &mut self.to_a };
                    if q.len() < 256 {
                        q.push_back(mad);
                    }
                }
                // To the stranger (answers to injected MADs): gone.
            }
            let mut k = 0;
            while let Some(e) = cm.poll_event() {
                k += 1;
                assert!(k <= MAX_EV, "event queue bound");
                let ids = if to_b {
                    &mut self.ids_a
                } else {
                    &mut self.ids_b
                };
                match e {
                    CmEvent::ReqReceived { id, .. }
                    | CmEvent::RepReceived { id, .. }
                    | CmEvent::DreqReceived { id, .. }
                        if ids.len() < 64 =>
                    {
                        ids.push(id)
                    }
                    CmEvent::Rejected { .. } | CmEvent::TimedOut { .. } => {
                        self.st.rejected_or_timed_out += 1
                    }
                    CmEvent::SidrReqReceived { id, .. } if self.sidr_b.len() < 64 => {
                        self.sidr_b.push(id)
                    }
                    _ => {}
                }
            }
        }
    }

    fn deliver(&mut self, to_b: bool, lose: bool, dup: bool) {
        let q = if to_b { &mut self.to_b } else { &mut self.to_a };
        let Some(m) = q.pop_front() else { return };
        if lose {
            return;
        }
        let src = if to_b { self.addr_a } else { self.addr_b };
        self.st.delivered += 1;
        self.give(to_b, src, &m);
        if dup {
            self.give(to_b, src, &m);
        }
    }

    fn connect(&mut self, service: u64, qpn: u32) {
        let cp = ConnectParams::rc(
            service,
            self.addr_b,
            self.addr_a.gid,
            QpNumber::new(qpn & 0xff_ffff),
            Psn::new(qpn & 0xff_ffff),
        );
        if let Ok(id) = self.a.connect(self.now, &cp) {
            if self.ids_a.len() < 64 {
                self.ids_a.push(id);
            }
        }
        self.pump();
    }

    /// The consumer answers every event it holds (accept REQs, establish REPs, answer
    /// DREQs): what a well-behaved application does.
    fn consumer_answers(&mut self) {
        let now = self.now;
        for id in self.ids_b.clone() {
            match self.b.state(id) {
                Some(CmState::ReqRcvd | CmState::MraReqSent) => {
                    let _ = self.b.accept(
                        now,
                        id,
                        &AcceptParams::new(QpNumber::new(0x900), Psn::new(1)),
                    );
                }
                Some(CmState::DreqRcvd) => {
                    let _ = self.b.disconnect(now, id, &[]);
                }
                _ => {}
            }
        }
        for id in self.ids_a.clone() {
            match self.a.state(id) {
                Some(CmState::RepRcvd | CmState::MraRepSent) => {
                    let _ = self.a.establish(now, id);
                }
                Some(CmState::DreqRcvd) => {
                    let _ = self.a.disconnect(now, id, &[]);
                }
                _ => {}
            }
        }
        self.pump();
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        let now = self.now;
        self.a.handle_timeout(now);
        self.b.handle_timeout(now);
        self.pump();
    }
}

pub fn run(data: &[u8]) -> Stats {
    let mut inp = Input::new(data);
    let seed = u64::from(inp.u8());
    let mut w = World {
        now: Instant::ZERO,
        a: Cm::new(cfg(0xa, seed)),
        b: Cm::new(cfg(0xb, seed + 1)),
        addr_a: addr(1),
        addr_b: addr(2),
        stranger: addr(66),
        to_a: VecDeque::new(),
        to_b: VecDeque::new(),
        seen: Vec::new(),
        ids_a: Vec::new(),
        ids_b: Vec::new(),
        sidr_b: Vec::new(),
        st: Stats::default(),
    };
    let listen = w.b.listen(0x42, 4).expect("listen");
    let mut listening = true;
    while !inp.empty() && w.st.actions < 300 {
        w.st.actions += 1;
        let op = inp.u8();
        match op % 12 {
            0 => {
                let service = if op & 0x80 != 0 { 0x43 } else { 0x42 };
                let qpn = inp.u32();
                w.connect(service, qpn);
            }
            1 | 2 => {
                let f = inp.u8();
                w.deliver(op % 12 == 2, f % 8 == 0, f % 8 == 1);
            }
            3 => {
                // Raw bytes, of any length around 256.
                let len = match inp.u8() % 4 {
                    0 => usize::from(inp.u8()),
                    _ => MAD_LEN,
                };
                let m: Vec<u8> = (0..len).map(|_| inp.u8()).collect();
                let to_b = op & 0x10 != 0;
                let src = if op & 0x20 != 0 {
                    w.stranger
                } else if to_b {
                    w.addr_a
                } else {
                    w.addr_b
                };
                w.st.injected += 1;
                w.give(to_b, src, &m);
            }
            4 | 5 => {
                // A real MAD of the run with a few bytes changed (or none: a replay).
                if w.seen.is_empty() {
                    continue;
                }
                let mut m = w.seen[usize::from(inp.u8()) % w.seen.len()];
                for _ in 0..inp.u8() % 5 {
                    let at = usize::from(inp.u8()) % MAD_LEN;
                    m[at] = inp.u8();
                }
                let to_b = op & 0x10 != 0;
                let src = if op & 0x20 != 0 {
                    w.stranger
                } else if to_b {
                    w.addr_a
                } else {
                    w.addr_b
                };
                w.st.injected += 1;
                w.give(to_b, src, &m);
            }
            6 => {
                // B's consumer on a known or a made-up ID.
                let id = match w.ids_b.len() {
                    0 => CommId(inp.u32()),
                    n => w.ids_b[usize::from(inp.u8()) % n],
                };
                let now = w.now;
                let pd: Vec<u8> = (0..usize::from(inp.u8() % 200)).map(|_| inp.u8()).collect();
                let _ = match inp.u8() % 5 {
                    0 => {
                        w.b.accept(
                            now,
                            id,
                            &AcceptParams::new(QpNumber::new(0x900), Psn::new(1)),
                        )
                        .map(drop)
                    }
                    1 => {
                        w.b.reject(now, id, RejReason::CONSUMER, &pd[..pd.len().min(80)], &pd)
                    }
                    2 => w.b.mra(now, id, inp.u8(), &pd),
                    3 => w.b.disconnect(now, id, &pd),
                    _ => w.b.destroy(now, id),
                };
                w.pump();
            }
            7 => {
                let id = match w.ids_a.len() {
                    0 => CommId(inp.u32()),
                    n => w.ids_a[usize::from(inp.u8()) % n],
                };
                let now = w.now;
                let _ = match inp.u8() % 4 {
                    0 => w.a.establish(now, id),
                    1 => w.a.disconnect(now, id, &[]),
                    2 => w.a.mra(now, id, inp.u8(), &[]),
                    _ => w.a.destroy(now, id),
                };
                w.pump();
            }
            8 => {
                let shift = inp.u8() % 40;
                w.advance(Duration::from_nanos(1u64 << shift));
            }
            9 => {
                let now = w.now;
                let dest = w.addr_b;
                let _ =
                    w.a.sidr_request(now, dest, if op & 0x80 != 0 { 0x43 } else { 0x42 }, &[]);
                w.pump();
            }
            10 => {
                if let Some(&id) = w.sidr_b.get(usize::from(inp.u8()) % w.sidr_b.len().max(1)) {
                    let now = w.now;
                    let _ = w.b.sidr_reply(
                        now,
                        id,
                        SidrStatus::SUCCESS,
                        QpNumber::new(0x77),
                        0x1234,
                        &[],
                    );
                    w.pump();
                }
            }
            _ => {
                if listening {
                    let _ = w.b.unlisten(listen);
                } else {
                    let _ = w.b.listen(0x42, usize::from(inp.u8() % 6));
                }
                listening = !listening;
                w.pump();
            }
        }
    }
    // Settle: a clean link, no injection, a consumer that answers, time running.
    for _ in 0..20_000 {
        while !w.to_a.is_empty() || !w.to_b.is_empty() {
            w.deliver(true, false, false);
            w.deliver(false, false, false);
        }
        w.consumer_answers();
        if !w.to_a.is_empty() || !w.to_b.is_empty() {
            continue;
        }
        let next = [w.a.poll_timeout(), w.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        match next {
            Some(t) => {
                w.advance(t.saturating_duration_since(w.now));
            }
            None => break,
        }
    }
    for (side, cm, ids) in [("A", &w.a, &w.ids_a), ("B", &w.b, &w.ids_b)] {
        let armed = cm.poll_timeout().is_some();
        for &id in ids {
            match cm.state(id) {
                None | Some(CmState::Established) => {}
                Some(s) => assert!(
                    armed,
                    "{side}: connection {id:?} in {s:?} after settling, no timer armed"
                ),
            }
        }
        assert!(
            cm.poll_timeout().is_none(),
            "{side}: timers still armed after settling"
        );
    }
    w.st.established = w.a.counters().established + w.b.counters().established;
    w.st
}
