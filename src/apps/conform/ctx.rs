//! The context a test runs in: the scripted requester (send any [`Pkt`] at the PSN the
//! tester believes the peer expects), the response matcher (every packet the peer sends
//! back, waited for with a timeout), a minimal responder for the peer's own requests (so that
//! `ibv_rc_pingpong`'s echoes are acknowledged), the "is the QP still usable" probe, and the
//! running account of what the peer did, which becomes the report.

use super::frames::{Endpoints, Pkt};
use super::link::{Link, Rx};
use super::peer::{Control, PeerInfo, PeerTool, ReadBack, RecvCount};
use crate::wire::{CreditCode, NakCode, OpFlags, Opcode, Psn, Syndrome};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// A test's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    /// The peer did what the rule demands.
    Pass,
    /// It did not.
    Fail,
    /// The peer tool cannot be tested for this (its QP or memory does not allow it, or
    /// the test needs something the tool does not expose).
    NotApplicable,
    /// The test ran but cannot decide (what it must observe is not observable here, or
    /// the session could not be set up).
    Inconclusive,
}

impl Verdict {
    /// How the report writes it (`pass`, `fail`, `n/a`, `inconclusive`).
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::NotApplicable => "n/a",
            Verdict::Inconclusive => "inconclusive",
        }
    }
}

/// What a test found: its verdict, what the peer did, and why the verdict is what it is.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The verdict.
    pub verdict: Verdict,
    /// What the peer did (one line per observation).
    pub did: Vec<String>,
    /// The reasons for a fail or an inconclusive verdict.
    pub why: Vec<String>,
}

impl Outcome {
    /// Not applicable, because of `why`.
    pub fn not_applicable(why: impl std::fmt::Display) -> Outcome {
        Outcome {
            verdict: Verdict::NotApplicable,
            did: Vec::new(),
            why: vec![why.to_string()],
        }
    }
    /// Inconclusive, because of `why`.
    pub fn inconclusive(why: impl std::fmt::Display) -> Outcome {
        Outcome {
            verdict: Verdict::Inconclusive,
            did: Vec::new(),
            why: vec![why.to_string()],
        }
    }
}

/// The running account of one test.
#[derive(Default, Debug)]
pub struct Obs {
    did: Vec<String>,
    fails: Vec<String>,
    unsure: Vec<String>,
}

impl Obs {
    /// Nothing observed yet.
    pub fn new() -> Obs {
        Obs::default()
    }
    /// Something the peer did (or the tester sent), for the report.
    pub fn did(&mut self, s: impl std::fmt::Display) {
        self.did.push(s.to_string());
    }
    /// The peer broke the rule.
    pub fn fail(&mut self, s: impl std::fmt::Display) {
        let s = s.to_string();
        self.did.push(format!("FAIL: {s}"));
        self.fails.push(s);
    }
    /// The test cannot decide this part.
    pub fn unsure(&mut self, s: impl std::fmt::Display) {
        let s = s.to_string();
        self.did.push(format!("?: {s}"));
        self.unsure.push(s);
    }
    /// Whether a failure was recorded.
    pub fn failed(&self) -> bool {
        !self.fails.is_empty()
    }
    /// The outcome: fail if anything failed, else inconclusive if anything was unsure, else
    /// pass.
    pub fn done(self) -> Outcome {
        let verdict = if !self.fails.is_empty() {
            Verdict::Fail
        } else if !self.unsure.is_empty() {
            Verdict::Inconclusive
        } else {
            Verdict::Pass
        };
        let why = if self.fails.is_empty() {
            self.unsure
        } else {
            self.fails
        };
        Outcome {
            verdict,
            did: self.did,
            why,
        }
    }
}

/// A response from the peer's responder, classified.
#[derive(Clone, Debug)]
pub enum Resp {
    /// ACK, NAK or RNR NAK.
    Ack {
        /// Its PSN.
        psn: u32,
        /// Its AETH syndrome.
        syn: Syndrome,
        /// Its MSN.
        msn: u32,
    },
    /// An RDMA READ response packet.
    Read {
        /// FIRST, MIDDLE, LAST or ONLY.
        opcode: Opcode,
        /// Its PSN.
        psn: u32,
        /// Its AETH (syndrome, MSN), on FIRST, LAST and ONLY.
        aeth: Option<(Syndrome, u32)>,
        /// The data it carries.
        data: Vec<u8>,
    },
    /// An ATOMIC ACK.
    Atomic {
        /// Its PSN.
        psn: u32,
        /// Its AETH syndrome.
        syn: Syndrome,
        /// Its MSN.
        msn: u32,
        /// The original value of the target.
        orig: u64,
    },
    /// A congestion notification packet.
    Cnp,
    /// Anything else addressed to our QP.
    Other,
}

/// A received packet with its classification.
#[derive(Clone, Debug)]
pub struct Got {
    /// The packet.
    pub rx: Rx,
    /// What kind of response it is.
    pub resp: Resp,
}

impl Got {
    /// The packet in one line.
    pub fn line(&self) -> &str {
        &self.rx.line
    }
    /// Whether it is a NAK with `code`.
    pub fn is_nak(&self, code: NakCode) -> bool {
        matches!(self.resp, Resp::Ack { syn: Syndrome::Nak(c), .. } if c == code)
    }
    /// The PSN of a positive ACK.
    pub fn ack_psn(&self) -> Option<u32> {
        match self.resp {
            Resp::Ack {
                psn,
                syn: Syndrome::Ack(_),
                ..
            } => Some(psn),
            _ => None,
        }
    }
}

fn classify(rx: &Rx) -> Resp {
    let e = &rx.repr.ext;
    let psn = rx.psn();
    match rx.opcode() {
        Opcode::RC_ACK => match e.aeth {
            Some(a) => Resp::Ack {
                psn,
                syn: a.syndrome,
                msn: a.msn,
            },
            None => Resp::Other,
        },
        Opcode::RC_ATOMIC_ACK => match (e.aeth, e.atomic_ack) {
            (Some(a), Some(o)) => Resp::Atomic {
                psn,
                syn: a.syndrome,
                msn: a.msn,
                orig: o,
            },
            _ => Resp::Other,
        },
        op @ (Opcode::RC_READ_RESPONSE_FIRST
        | Opcode::RC_READ_RESPONSE_MIDDLE
        | Opcode::RC_READ_RESPONSE_LAST
        | Opcode::RC_READ_RESPONSE_ONLY) => Resp::Read {
            opcode: op,
            psn,
            aeth: e.aeth.map(|a| (a.syndrome, a.msn)),
            data: rx.payload.clone(),
        },
        Opcode::CNP => Resp::Cnp,
        _ => Resp::Other,
    }
}

fn is_request(op: Opcode) -> bool {
    op.transport() == crate::wire::Transport::Rc
        && (op.is(OpFlags::SEND)
            || op.is(OpFlags::WRITE)
            || op == Opcode::RC_READ_REQUEST
            || op == Opcode::RC_CMP_SWAP
            || op == Opcode::RC_FETCH_ADD)
}

/// Our minimal responder for the peer's requests (the peer's requester).
#[derive(Debug)]
pub struct PeerRequester {
    /// The PSN we expect next from the peer.
    pub epsn: u32,
    /// Messages of the peer we completed.
    pub msn: u32,
    /// Answer the peer's requests automatically (off: new ones are kept in `held`;
    /// duplicates of answered ones are still answered).
    pub auto_ack: bool,
    /// The peer's requests kept unanswered (`auto_ack` off).
    pub held: Vec<Rx>,
    /// Messages (SEND/WRITE) the peer completed towards us, counted once each.
    pub messages: u64,
    /// Request packets seen (duplicates included).
    pub packets: u64,
    /// The tester's memory for the peer's ATOMICs (eight bytes per address, 0 at first).
    pub mem: HashMap<u64, u64>,
    /// The responses to the peer's last READ/ATOMIC requests, by first PSN (a duplicate
    /// is answered with them again).
    pub replies: VecDeque<(u32, Vec<Pkt>)>,
    /// The path MTU the tester's READ responses are cut to.
    pub mtu: u32,
    /// When set, every request packet of the peer (answered or held) is kept here too.
    pub log: Option<Vec<Rx>>,
    nak_sent: bool,
}

impl PeerRequester {
    /// Expecting the peer's first request at `psn`.
    pub fn new(psn: u32) -> PeerRequester {
        PeerRequester {
            epsn: psn & Psn::MASK,
            msn: 0,
            auto_ack: true,
            held: Vec::new(),
            messages: 0,
            packets: 0,
            mem: HashMap::new(),
            replies: VecDeque::new(),
            mtu: 1024,
            log: None,
            nak_sent: false,
        }
    }
}

/// The READ response packets answering a READ of `len` bytes at `psn` (a pattern of the
/// address), cut to `mtu`; the AETH carries `msn`.
pub fn read_responses(psn: u32, va: u64, len: u32, mtu: u32, msn: u32) -> Vec<Pkt> {
    let mtu = mtu.max(256);
    let n = len.div_ceil(mtu).max(1);
    let aeth = |mut p: Pkt| {
        p.ext.aeth = Some(crate::wire::AethRepr {
            syndrome: Syndrome::Ack(CreditCode::from_count(64)),
            msn: msn & 0xff_ffff,
        });
        p
    };
    (0..n)
        .map(|k| {
            let off = k * mtu;
            let l = (len - off).min(mtu) as usize;
            let data: Vec<u8> = (0..l)
                .map(|i| (va.wrapping_add(u64::from(off) + i as u64) as u8) ^ 0xa5)
                .collect();
            let q = Psn::new(psn).add(k).get();
            let op = match (n, k) {
                (1, _) => Opcode::RC_READ_RESPONSE_ONLY,
                (_, 0) => Opcode::RC_READ_RESPONSE_FIRST,
                (_, k) if k == n - 1 => Opcode::RC_READ_RESPONSE_LAST,
                _ => Opcode::RC_READ_RESPONSE_MIDDLE,
            };
            let p = Pkt::new(op, q, &data);
            if op == Opcode::RC_READ_RESPONSE_MIDDLE {
                p
            } else {
                aeth(p)
            }
        })
        .collect()
}

/// The ATOMIC ACK carrying `orig` at `psn`.
pub fn atomic_ack(psn: u32, orig: u64, msn: u32) -> Pkt {
    let mut p = Pkt::ack_to_peer(psn, Syndrome::Ack(CreditCode::from_count(64)), msn);
    p.opcode = Opcode::RC_ATOMIC_ACK;
    p.ext.atomic_ack = Some(orig);
    p
}

/// The PSNs a request of the peer takes: a READ one per response packet, others one.
pub fn request_psns(rx: &Rx, mtu: u32) -> u32 {
    if rx.opcode() == Opcode::RC_READ_REQUEST {
        rx.repr
            .ext
            .reth
            .map_or(1, |r| r.dma_len.div_ceil(mtu.max(256)).max(1))
    } else {
        1
    }
}

impl PeerRequester {
    /// What the tester's responder answers to the peer's request `rx` (and its state after).
    pub fn respond(&mut self, rx: &Rx) -> Vec<Pkt> {
        let psn = rx.psn();
        let op = rx.opcode();
        let d = Psn::new(psn).diff(Psn::new(self.epsn));
        let ack =
            |p: u32, msn: u32| Pkt::ack_to_peer(p, Syndrome::Ack(CreditCode::from_count(64)), msn);
        if d == 0 {
            self.nak_sent = false;
            let n = request_psns(rx, self.mtu);
            self.epsn = Psn::new(self.epsn).add(n).get();
            let f = op.flags();
            if op == Opcode::RC_READ_REQUEST {
                self.msn = (self.msn + 1) & Psn::MASK;
                let (va, len) = rx.repr.ext.reth.map_or((0, 0), |r| (r.va, r.dma_len));
                let r = read_responses(psn, va, len, self.mtu, self.msn);
                self.remember(psn, r.clone());
                return r;
            }
            if op == Opcode::RC_CMP_SWAP || op == Opcode::RC_FETCH_ADD {
                self.msn = (self.msn + 1) & Psn::MASK;
                let Some(a) = rx.repr.ext.atomic_eth else {
                    return vec![ack(psn, self.msn)];
                };
                let cell = self.mem.entry(a.va).or_insert(0);
                let orig = *cell;
                *cell = if op == Opcode::RC_FETCH_ADD {
                    orig.wrapping_add(a.swap_add)
                } else if orig == a.compare {
                    a.swap_add
                } else {
                    orig
                };
                let r = vec![atomic_ack(psn, orig, self.msn)];
                self.remember(psn, r.clone());
                return r;
            }
            if f.contains(OpFlags::LAST) {
                self.msn = (self.msn + 1) & Psn::MASK;
                self.messages += 1;
            }
            if rx.repr.bth.ack_req || f.contains(OpFlags::LAST) {
                vec![ack(psn, self.msn)]
            } else {
                Vec::new()
            }
        } else if d < 0 {
            if let Some((_, r)) = self.replies.iter().find(|(q, _)| *q == psn) {
                return r.clone();
            }
            vec![ack(Psn::new(self.epsn).sub(1).get(), self.msn)]
        } else if !self.nak_sent {
            self.nak_sent = true;
            vec![Pkt::ack_to_peer(
                self.epsn,
                Syndrome::Nak(NakCode::PsnSequenceError),
                self.msn,
            )]
        } else {
            Vec::new()
        }
    }

    fn remember(&mut self, psn: u32, r: Vec<Pkt>) {
        if self.replies.len() >= 64 {
            self.replies.pop_front();
        }
        self.replies.push_back((psn, r));
    }
}

/// What the probe found.
#[derive(Clone, Debug)]
pub enum Probe {
    /// The expected response arrived.
    Usable(String),
    /// Nothing came back within the timeout.
    Silent,
    /// A NAK (and its line).
    Nak(Syndrome, u32, String),
    /// Something else came back.
    Unexpected(String),
}

/// The state a session keeps between tests.
#[derive(Debug)]
pub struct SessionState {
    /// The PSN the peer's responder expects next (as far as the tester knows).
    pub next_psn: u32,
    /// The MSN of the last ACK seen.
    pub msn: Option<u32>,
    /// Our responder for the peer's requests.
    pub peer: PeerRequester,
    /// Any of the peer's packets carried ECT(0)/ECT(1) (it does congestion management).
    pub peer_ect: bool,
    /// Gave up on the session (error state or lost track of the PSN).
    pub dead: bool,
}

/// Everything a test works with.
pub struct Ctx<'a> {
    /// The packet path.
    pub link: &'a mut Link,
    /// Both ends' addresses and QPs.
    pub ep: Endpoints,
    /// What the exchange told us about the peer.
    pub info: &'a PeerInfo,
    /// The ferroce peer's control channel, if it is the peer.
    pub control: Option<&'a mut Control>,
    /// The session's state.
    pub st: &'a mut SessionState,
    /// How long to listen for silence (a response the rule forbids), and the window the
    /// tests' own timing uses.
    pub timeout: Duration,
    /// How long to wait at most for a response the rule requires (`until`, `answer`,
    /// `probe`): at least `timeout`. A wait ends as soon as the response is there, so a
    /// longer cap costs nothing against a peer that answers; it only keeps a slow or
    /// starved peer (a guest VM, a loaded machine) from being judged silent.
    pub wait: Duration,
    /// Packets received but not yet consumed by the test.
    backlog: VecDeque<Got>,
    /// CNPs seen during the test.
    pub cnps: Vec<Rx>,
    /// The link failed: the test cannot go on.
    pub io_error: Option<String>,
}

impl<'a> Ctx<'a> {
    /// A context for one test.
    pub fn new(
        link: &'a mut Link,
        ep: Endpoints,
        info: &'a PeerInfo,
        control: Option<&'a mut Control>,
        st: &'a mut SessionState,
        timeout: Duration,
    ) -> Ctx<'a> {
        Ctx {
            link,
            ep,
            info,
            control,
            st,
            timeout,
            wait: timeout,
            backlog: VecDeque::new(),
            cnps: Vec::new(),
            io_error: None,
        }
    }

    /// The peer tool.
    pub fn tool(&self) -> PeerTool {
        self.info.tool
    }

    /// The PSN the peer expects next; `take(n)` reserves `n` PSNs.
    pub fn psn(&self) -> u32 {
        self.st.next_psn
    }
    /// Reserve `n` PSNs; returns the first.
    pub fn take(&mut self, n: u32) -> u32 {
        let p = self.st.next_psn;
        self.st.next_psn = Psn::new(p).add(n).get();
        p
    }

    /// A region to read/write/atomic against (the announced one).
    pub fn region(&self) -> Option<super::peer::Region> {
        self.info.region
    }

    /// Send packets back to back.
    pub fn send(&mut self, o: &mut Obs, pkts: &[Pkt]) {
        let mut frames = Vec::with_capacity(pkts.len());
        for p in pkts {
            let id = self.link.next_ident();
            match p.frame(&self.ep, id) {
                Ok(f) => frames.push(f),
                Err(e) => {
                    o.unsure(format!("the tester could not build {:?}: {e}", p.opcode));
                    return;
                }
            }
            o.did(format!("sent {}", p.describe(&self.ep)));
        }
        if let Err(e) = self.link.send(&frames) {
            self.io_error = Some(e.to_string());
            o.unsure(format!("sending failed: {e}"));
        }
    }

    /// Receive for up to `d`, handling the peer's requests and queueing everything else.
    /// Returns as soon as something was queued (or `d` passed).
    fn pump(&mut self, d: Duration) {
        if self.io_error.is_some() {
            std::thread::sleep(d.min(Duration::from_millis(10)));
            return;
        }
        let rxs = match self.link.recv(d) {
            Ok(v) => v,
            Err(e) => {
                self.io_error = Some(e.to_string());
                return;
            }
        };
        for rx in rxs {
            if rx.src != self.ep.peer_ip {
                continue;
            }
            if rx.ecn == crate::wire::Ecn::Ect0 || rx.ecn == crate::wire::Ecn::Ect1 {
                self.st.peer_ect = true;
            }
            if rx.repr.bth.dest_qp.get() != self.ep.our_qpn {
                self.backlog.push_back(Got {
                    resp: Resp::Other,
                    rx,
                });
                continue;
            }
            if is_request(rx.opcode()) {
                self.peer_request(rx);
                continue;
            }
            let resp = classify(&rx);
            if let Resp::Cnp = resp {
                self.cnps.push(rx.clone());
            }
            self.backlog.push_back(Got { rx, resp });
        }
    }

    /// The minimal responder: acknowledge the peer's requests in order, answer its READs
    /// with a pattern and its ATOMICs against the tester's memory, replay the answers to
    /// duplicates, and NAK the first request after a gap.
    fn peer_request(&mut self, rx: Rx) {
        let pr = &mut self.st.peer;
        pr.packets += 1;
        if let Some(l) = pr.log.as_mut() {
            l.push(rx.clone());
        }
        // A duplicate of a request already answered is answered again even while the test
        // holds the new ones (a requester may resend what it has not seen acknowledged yet).
        let dup = Psn::new(rx.psn()).diff(Psn::new(pr.epsn)) < 0;
        if !pr.auto_ack && !dup {
            pr.held.push(rx);
            return;
        }
        let pkts = pr.respond(&rx);
        if pkts.is_empty() {
            return;
        }
        let mut frames = Vec::with_capacity(pkts.len());
        for p in &pkts {
            let id = self.link.next_ident();
            if let Ok(f) = p.frame(&self.ep, id) {
                frames.push(f);
            }
        }
        if let Err(e) = self.link.send(&frames) {
            self.io_error = Some(e.to_string());
        }
    }

    /// Acknowledge the peer's held requests now (after a test held them).
    pub fn release_held(&mut self) {
        self.st.peer.auto_ack = true;
        let held = std::mem::take(&mut self.st.peer.held);
        for rx in held {
            self.peer_request(rx);
        }
    }

    /// Wait until `done` says the responses so far are enough, or `timeout` passes; then
    /// keep listening for `linger` more (to catch extra responses). Returns every response
    /// received (CNPs excluded unless `with_cnps`).
    pub fn collect(
        &mut self,
        timeout: Duration,
        linger: Duration,
        mut done: impl FnMut(&[Got]) -> bool,
    ) -> Vec<Got> {
        let mut got: Vec<Got> = Vec::new();
        let t0 = Instant::now();
        let mut deadline = t0 + timeout;
        let mut satisfied = false;
        loop {
            while let Some(g) = self.backlog.pop_front() {
                if let Resp::Cnp = g.resp {
                    continue;
                }
                got.push(g);
            }
            if !satisfied && done(&got) {
                satisfied = true;
                deadline = Instant::now() + linger;
            }
            let now = Instant::now();
            if now >= deadline || self.io_error.is_some() {
                break;
            }
            self.pump(deadline - now);
        }
        for g in &got {
            if let Resp::Ack { msn, .. } | Resp::Atomic { msn, .. } = g.resp {
                self.st.msn = Some(msn);
            }
            if let Resp::Read {
                aeth: Some((_, msn)),
                ..
            } = g.resp
            {
                self.st.msn = Some(msn);
            }
        }
        got
    }

    /// Everything that arrives within the whole `d` (for "no response" checks).
    pub fn listen(&mut self, d: Duration) -> Vec<Got> {
        self.collect(d, Duration::ZERO, |_| false)
    }

    /// The usual wait for a response: up to `wait`, then a short linger.
    pub fn until(&mut self, done: impl FnMut(&[Got]) -> bool) -> Vec<Got> {
        self.until_within(self.wait.max(self.timeout), done)
    }

    /// As [`Ctx::until`], waiting at most `d`.
    fn until_within(&mut self, d: Duration, done: impl FnMut(&[Got]) -> bool) -> Vec<Got> {
        let linger = (self.timeout / 5).min(Duration::from_millis(200));
        self.collect(d, linger, done)
    }

    /// Record every response in the observations.
    pub fn note_all(&self, o: &mut Obs, got: &[Got]) {
        if got.is_empty() {
            o.did("no response");
        }
        for g in got {
            o.did(format!("got {}", g.line()));
        }
    }

    /// The probe request for this peer tool at the expected PSN: SEND where receives are
    /// posted, else WRITE, READ or FETCH_AND_ADD as the QP and R_Key allow.
    pub fn probe_pkt(&self, psn: u32) -> Option<(Pkt, &'static str)> {
        let i = self.info;
        if i.recvs.is_some_and(|n| n > 0) || i.tool == PeerTool::PerftestSend {
            return Some((Pkt::send_only(psn, b"ferroce conform!"), "SEND"));
        }
        let r = i.region?;
        if i.qp_rights.write && r.rights.write {
            Some((Pkt::write_only(psn, r.va, r.rkey, &[0x5a; 8]), "WRITE"))
        } else if i.qp_rights.read && r.rights.read {
            Some((Pkt::read(psn, r.va, r.rkey, 8), "READ"))
        } else if i.qp_rights.atomic && r.rights.atomic {
            Some((Pkt::fetch_add(psn, r.va, r.rkey, 0), "FETCH_ADD"))
        } else {
            None
        }
    }

    /// Send a valid request at the expected PSN and wait for its response (up to `wait`).
    pub fn probe(&mut self, o: &mut Obs) -> Probe {
        self.probe_within(o, self.wait.max(self.timeout))
    }

    /// As [`Ctx::probe`], waiting at most `d` (`timeout` where silence is the rule).
    fn probe_within(&mut self, o: &mut Obs, d: Duration) -> Probe {
        let psn = self.psn();
        let Some((p, what)) = self.probe_pkt(psn) else {
            return Probe::Unexpected("no request this peer's QP accepts".into());
        };
        self.send(o, &[p]);
        // A sequence error NAK naming this PSN is never its answer (see below): wait on.
        let got = self.until_within(d, |g| {
            g.iter().any(|g| match &g.resp {
                Resp::Ack {
                    syn: Syndrome::Nak(NakCode::PsnSequenceError),
                    psn: q,
                    ..
                } if *q == psn => false,
                Resp::Ack { psn: q, .. } | Resp::Atomic { psn: q, .. } => *q == psn,
                Resp::Read { psn: q, .. } => *q == psn,
                _ => false,
            })
        });
        self.note_all(o, &got);
        // Its answer; a NAK naming this very PSN that came before it is a late one for an
        // earlier request (a sequence error NAK names the PSN expected then), not the answer.
        let at = |g: &&Got| match &g.resp {
            Resp::Ack { psn: q, .. } | Resp::Atomic { psn: q, .. } | Resp::Read { psn: q, .. } => {
                *q == psn
            }
            _ => false,
        };
        let positive = |g: &&Got| match &g.resp {
            Resp::Ack { syn, .. } | Resp::Atomic { syn, .. } => syn.is_ack(),
            Resp::Read { .. } => true,
            _ => false,
        };
        let mine = got
            .iter()
            .find(|g| at(g) && positive(g))
            .or_else(|| got.iter().find(at));
        match mine.map(|g| (&g.resp, g.line().to_string())) {
            Some((
                Resp::Ack {
                    syn: Syndrome::Ack(_),
                    ..
                },
                l,
            ))
            | Some((
                Resp::Atomic {
                    syn: Syndrome::Ack(_),
                    ..
                },
                l,
            ))
            | Some((Resp::Read { .. }, l)) => {
                self.take(1);
                Probe::Usable(format!("{what} at PSN {psn:#08x} answered: {l}"))
            }
            Some((Resp::Ack { syn, psn, .. }, l)) => Probe::Nak(*syn, *psn, l),
            Some((_, l)) => Probe::Unexpected(l),
            None => match got.iter().find_map(|g| match g.resp {
                Resp::Ack {
                    syn: s @ (Syndrome::Nak(_) | Syndrome::RnrNak(_)),
                    psn,
                    ..
                } => Some(Probe::Nak(s, psn, g.line().to_string())),
                _ => None,
            }) {
                Some(p) => p,
                None if got.is_empty() => Probe::Silent,
                None => Probe::Unexpected(got[0].line().to_string()),
            },
        }
    }

    /// The perftest client roles: the peer's requester goes on (the tester answers its held
    /// requests, then a request it has not sent before must arrive within `wait`).
    pub fn requester_goes_on(&mut self) -> Result<String, String> {
        self.release_held();
        let e0 = self.st.peer.epsn;
        let t0 = Instant::now();
        while self.st.peer.epsn == e0 && t0.elapsed() < self.wait.max(self.timeout) {
            if self.io_error.is_some() {
                return Err("the packet link failed".into());
            }
            let _ = self.collect(self.timeout / 10, Duration::ZERO, |_| false);
            self.release_held();
        }
        if self.st.peer.epsn == e0 {
            Err(format!(
                "the peer's requester sent no new request at PSN {e0:#08x} within {} ms",
                self.wait.max(self.timeout).as_millis()
            ))
        } else {
            Ok(format!(
                "the peer's requester goes on: requests up to PSN {:#08x} answered",
                Psn::new(self.st.peer.epsn).sub(1).get()
            ))
        }
    }

    /// End of a test whose rule leaves the QP working: it must answer a valid request.
    pub fn end_usable(&mut self, o: &mut Obs) {
        if self.io_error.is_some() {
            return;
        }
        if self.info.tool.is_client() {
            match self.requester_goes_on() {
                Ok(s) => o.did(s),
                Err(s) => {
                    self.st.dead = true;
                    o.fail(s);
                }
            }
            return;
        }
        match self.probe(o) {
            Probe::Usable(s) => o.did(format!("QP still usable: {s}")),
            Probe::Silent => {
                self.st.dead = true;
                o.fail("the QP no longer answers a valid request (probe got no response)");
            }
            Probe::Nak(Syndrome::Nak(NakCode::PsnSequenceError), e, _) => {
                self.st.dead = true;
                o.fail(format!(
                    "the peer expects PSN {e:#08x}, not {:#08x}: it acted on a packet it should not have (or lost one it should have acted on)",
                    self.psn()
                ));
            }
            Probe::Nak(s, _, l) => {
                self.st.dead = true;
                o.fail(format!("the QP refuses a valid request ({s}): {l}"));
            }
            Probe::Unexpected(l) => {
                self.st.dead = true;
                o.fail(format!("unexpected answer to the probe: {l}"));
            }
        }
    }

    /// End of a test whose rule puts the QP in the error state: a valid request must get no
    /// answer (and the ferroce peer must report the error state).
    pub fn end_error_state(&mut self, o: &mut Obs) {
        self.st.dead = true;
        if self.io_error.is_some() {
            return;
        }
        if self.info.tool.is_client() {
            // The requester of a QP in the error state sends nothing more.
            let seen = self.st.peer.packets;
            let _ = self.listen(self.timeout);
            let more = self.st.peer.packets - seen;
            if more == 0 {
                o.did(format!(
                    "the peer's requester sent nothing more within {} ms (its QP is in the error state)",
                    self.timeout.as_millis()
                ));
            } else {
                o.fail(format!(
                    "the peer's requester sent {more} more request packet(s) after giving up (its QP must be in the error state)"
                ));
            }
            self.st.peer.held.clear();
            return;
        }
        match self.probe_within(o, self.timeout) {
            Probe::Silent => o.did("QP in the error state: a valid request got no response"),
            Probe::Usable(s) => o.fail(format!(
                "the QP still executes requests after the fatal NAK (it must move to the error state): {s}"
            )),
            Probe::Nak(s, _, l) => o.fail(format!(
                "the QP still answers after the fatal NAK ({s}) instead of being in the error state: {l}"
            )),
            Probe::Unexpected(l) => o.fail(format!("unexpected answer to the probe: {l}")),
        }
        if let Some(c) = self.control.as_mut() {
            match c.state() {
                Ok(s) if s == "ERR" => o.did("the ferroce peer reports its QP in state ERR"),
                Ok(s) => o.fail(format!(
                    "the ferroce peer reports its QP in state {s}, not ERR"
                )),
                Err(e) => o.unsure(e),
            }
        }
    }

    /// After a test the QP either errs or not, depending on what the peer did; the session
    /// cannot be trusted for the next test either way.
    pub fn end_unknown(&mut self) {
        self.st.dead = true;
    }

    /// Wait for the single response to the request at `psn` (an ACK/NAK, ATOMIC ACK or the
    /// READ response packets covering `npkts`), lingering briefly for extras.
    pub fn answer(&mut self, psn: u32, npkts: u32) -> Vec<Got> {
        let last = Psn::new(psn).add(npkts.max(1) - 1).get();
        self.until(|g| {
            g.iter().any(|g| match &g.resp {
                Resp::Ack { psn: q, syn, .. } => *q == last || (!syn.is_ack() && *q == psn),
                Resp::Atomic { psn: q, .. } => *q == psn,
                Resp::Read { psn: q, opcode, .. } => {
                    *q == last
                        && (*opcode == Opcode::RC_READ_RESPONSE_LAST
                            || *opcode == Opcode::RC_READ_RESPONSE_ONLY)
                }
                _ => false,
            })
        })
    }

    /// Read `len` bytes of the peer's memory at `va` the way this tool allows.
    pub fn read_back(&mut self, o: &mut Obs, va: u64, len: usize) -> Option<Vec<u8>> {
        match self.info.readback {
            ReadBack::Control => match self.control.as_mut().map(|c| c.read_mem(va, len)) {
                Some(Ok(v)) => Some(v),
                Some(Err(e)) => {
                    o.unsure(e);
                    None
                }
                None => None,
            },
            ReadBack::Read => {
                let r = self.info.region?;
                let psn = self.psn();
                let npkts = (len as u32).div_ceil(self.info.mtu).max(1);
                self.send(o, &[Pkt::read(psn, va, r.rkey, len as u32)]);
                let got = self.answer(psn, npkts);
                let mut data = Vec::new();
                let mut ok = false;
                for g in &got {
                    if let Resp::Read {
                        data: d, opcode, ..
                    } = &g.resp
                    {
                        data.extend_from_slice(d);
                        ok |= *opcode == Opcode::RC_READ_RESPONSE_LAST
                            || *opcode == Opcode::RC_READ_RESPONSE_ONLY;
                    }
                }
                if ok && data.len() == len {
                    self.take(npkts);
                    o.did(format!("read back {len} bytes at {va:#x} with RDMA READ"));
                    Some(data)
                } else {
                    self.note_all(o, &got);
                    o.unsure("reading the memory back failed");
                    self.st.dead = true;
                    None
                }
            }
            ReadBack::Atomic => {
                let r = self.info.region?;
                let mut out = Vec::new();
                for k in 0..len.div_ceil(8) {
                    let psn = self.psn();
                    let a = va + 8 * k as u64;
                    self.send(o, &[Pkt::fetch_add(psn, a, r.rkey, 0)]);
                    let got = self.answer(psn, 1);
                    match got.iter().find_map(|g| match g.resp {
                        Resp::Atomic {
                            psn: q,
                            orig,
                            syn: Syndrome::Ack(_),
                            ..
                        } if q == psn => Some(orig),
                        _ => None,
                    }) {
                        Some(v) => {
                            self.take(1);
                            out.extend_from_slice(&v.to_ne_bytes());
                        }
                        None => {
                            self.note_all(o, &got);
                            o.unsure("reading the memory back with FETCH_AND_ADD 0 failed");
                            self.st.dead = true;
                            return None;
                        }
                    }
                }
                out.truncate(len);
                Some(out)
            }
            ReadBack::None => None,
        }
    }

    /// Receive completions (successful, failed) as the tool lets us count them.
    pub fn recv_count(&mut self, o: &mut Obs) -> Option<u64> {
        match self.info.recv_count {
            RecvCount::Control => match self.control.as_mut()?.recv_completions() {
                Ok((n, _)) => Some(n),
                Err(e) => {
                    o.unsure(e);
                    None
                }
            },
            RecvCount::Echo => {
                // Every completed receive is answered by one SEND once the previous one is
                // acknowledged: wait for the echoes to settle.
                let mut last = self.st.peer.messages;
                let t0 = Instant::now();
                let mut quiet_since = Instant::now();
                while t0.elapsed() < self.timeout * 4 {
                    let _ = self.collect(self.timeout / 4, Duration::ZERO, |_| false);
                    if self.st.peer.messages != last {
                        last = self.st.peer.messages;
                        quiet_since = Instant::now();
                    } else if quiet_since.elapsed() >= self.timeout {
                        break;
                    }
                }
                Some(last)
            }
            RecvCount::None => None,
        }
    }

    /// Put back packets a test does not want to consume (they stay for the next wait).
    pub fn unread(&mut self, g: Vec<Got>) {
        for x in g.into_iter().rev() {
            self.backlog.push_front(x);
        }
    }
}
