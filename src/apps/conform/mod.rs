//! `ferroce conform`: a RoCE v2 conformance tester for any implementation.
//!
//! The tester takes the client side of a peer tool's ordinary out-of-band exchange
//! (`ibv_rc_pingpong`, perftest's `ib_*_bw`, or the ferroce peer `ferroce conform --serve`),
//! learns the peer's QPN, PSN, R_Key, buffer and MTU from it, and then, instead of the
//! tool's traffic, plays scripted packet sequences through a raw packet backend and checks
//! every response against the IBTA rule it names ([`catalogue`]). Each test ends by checking
//! that the QP is still usable, or in the error state the rule demands.
//!
//! Layout: [`frames`] builds any packet (separate from the production engine on purpose),
//! [`link`] moves frames and captures them per test, [`peer`] speaks the exchanges,
//! [`ctx`] is the requester/matcher a test script uses, [`catalogue`] holds the tests,
//! [`report`] writes the table, TAP or JUnit, [`serve`] is the ferroce peer.
//!
//! Sessions: a test runs on a session (one exchange, one QP on the peer). A session is
//! reused while its QP is usable; a test that puts the QP in the error state (or loses
//! track of its PSN) ends it, and the next test opens a new one, so the peer tool must be
//! restarted between sessions (run it in a loop). The ferroce peer gives every test a new
//! QP over one control connection per test.

pub mod catalogue;
pub mod cli;
pub mod ctx;
pub mod frames;
pub mod link;
pub mod peer;
pub mod report;
pub mod serve;

use catalogue::{Caps, Profile, TestDef};
use ctx::{Ctx, Obs, Outcome, PeerRequester, Probe, SessionState, Verdict};
use frames::{gid_of, Endpoints, Pkt};
use link::Link;
use peer::{Ours, PeerError, PeerTool, Session};
use report::{Report, TestResult};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::verbs::Mtu;
use crate::wire::{MacAddr, Psn};

/// Options of a run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The peer's address for the out-of-band exchange.
    pub host: String,
    /// The peer tool's TCP port.
    pub port: u16,
    /// What runs on the peer.
    pub tool: PeerTool,
    /// Run only the tests whose id matches one of these (`*` wildcards; a plain word
    /// matches as a substring).
    pub only: Vec<String>,
    /// How long to wait for a response, and for silence.
    pub timeout: Duration,
    /// How long to keep trying to reach the peer for a new session (a tool run in a loop
    /// needs a moment to restart).
    pub patience: Duration,
    /// One capture per test here.
    pub pcap_dir: Option<PathBuf>,
    /// Our starting PSN for ordinary sessions.
    pub start_psn: u32,
    /// The MTU we offer (perftest takes the smaller of both).
    pub mtu: Mtu,
    /// `ibv_rc_pingpong`'s path MTU (its exchange does not carry it; its default is 1024).
    pub peer_mtu: u32,
    /// The base of our QP numbers (one per session).
    pub qpn_base: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            host: String::new(),
            port: crate::oob::perftest::PORT,
            tool: PeerTool::Ferroce,
            only: Vec::new(),
            timeout: Duration::from_millis(500),
            patience: Duration::from_secs(20),
            pcap_dir: None,
            start_psn: 0x00c0_ffee & 0xff_ffff,
            mtu: Mtu::M1024,
            peer_mtu: 1024,
            qpn_base: 0x00c0_f000,
        }
    }
}

/// The tester's side: its link, addresses and how to find the peer's MAC.
pub struct Setup {
    /// The packet path to the peer.
    pub link: Link,
    /// Our MAC address.
    pub our_mac: MacAddr,
    /// Our IP address (our GID).
    pub our_ip: IpAddr,
    /// The next hop's MAC address for a peer address.
    pub resolve: Box<dyn Fn(IpAddr) -> Option<MacAddr>>,
    /// What our backend can send.
    pub caps: Caps,
}

/// Whether `id` is selected by the patterns (all when there are none).
pub fn selected(id: &str, only: &[String]) -> bool {
    only.is_empty() || only.iter().any(|p| glob(p, id))
}

fn glob(p: &str, s: &str) -> bool {
    if !p.contains('*') {
        return s.contains(p);
    }
    // Simple '*' wildcard match.
    let parts: Vec<&str> = p.split('*').collect();
    let mut at = 0;
    for (i, part) in parts.iter().enumerate() {
        if part.is_empty() {
            continue;
        }
        if i == 0 {
            if !s.starts_with(part) {
                return false;
            }
            at = part.len();
        } else if let Some(k) = s[at..].find(part) {
            at += k + part.len();
        } else {
            return false;
        }
    }
    parts.last().is_some_and(|l| l.is_empty() || s.ends_with(l))
}

/// The catalogue as a listing (id, rule, what the peer must do, applicability per tool).
pub fn listing(caps: &Caps) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let tools = PeerTool::ALL;
    let _ = writeln!(
        s,
        "{:<28} {:<44} {}",
        "TEST",
        "RULE",
        tools
            .iter()
            .map(|t| short(*t))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let cat = catalogue::catalogue();
    for t in &cat {
        let marks: Vec<String> = tools
            .iter()
            .map(|tool| {
                let ok = catalogue::check_applies(t, &Profile::of(*tool, &t.session), caps).is_ok();
                format!(
                    "{:<width$}",
                    if ok { "x" } else { "-" },
                    width = short(*tool).len()
                )
            })
            .collect();
        let _ = writeln!(s, "{:<28} {:<44} {}", t.id, t.rule, marks.join(" "));
    }
    let _ = writeln!(
        s,
        "\n{} tests; x = applicable to the peer tool ({})",
        cat.len(),
        tools
            .iter()
            .map(|t| format!("{}={}", short(*t), t.program()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    s
}

fn short(t: PeerTool) -> &'static str {
    match t {
        PeerTool::Pingpong => "pp",
        PeerTool::PerftestWrite => "wr",
        PeerTool::PerftestRead => "rd",
        PeerTool::PerftestSend => "sd",
        PeerTool::PerftestAtomic => "at",
        PeerTool::Ferroce => "fe",
        PeerTool::PerftestWriteClient => "wc",
        PeerTool::PerftestSendClient => "sc",
        PeerTool::PerftestReadClient => "rc",
        PeerTool::PerftestAtomicClient => "ac",
    }
}

struct Live {
    ses: Box<dyn Session>,
    st: SessionState,
    ep: Endpoints,
}

/// The UDP source port of one of our QPs (constant per connection).
fn sport(qpn: u32) -> u16 {
    0xc000 | ((qpn.wrapping_mul(0x61c8_8647) >> 18) as u16 & 0x3fff)
}

/// End a session: the tool's closing steps; a tool that can only be stopped by an error
/// gets an invalid request (a SEND MIDDLE with no message in progress), so that it exits
/// and a looping peer starts the next instance.
fn close(live: Live, setup: &mut Setup, timeout: Duration) {
    let Live { mut ses, st, ep } = live;
    if ses.info().end_by_error && !st.dead {
        let p = Pkt::new(crate::wire::Opcode::RC_SEND_MIDDLE, st.next_psn, &[0; 64]);
        let id = setup.link.next_ident();
        if let Ok(f) = p.frame(&ep, id) {
            let _ = setup.link.send(&[f]);
        }
        // Let its NAK (and the tool's exit) happen before the next connection.
        let _ = setup.link.recv(timeout.min(Duration::from_millis(200)));
    }
    let _ = ses.finish(timeout.max(Duration::from_secs(2)));
}

fn open(
    o: &Options,
    setup: &mut Setup,
    addr: SocketAddr,
    t: &TestDef,
    n: u32,
) -> Result<(Live, String), PeerError> {
    let qpn = (o.qpn_base + n) & 0xff_ffff;
    let psn = t.session.start_psn.unwrap_or(o.start_psn) & Psn::MASK;
    let ours = Ours {
        qpn,
        psn,
        gid: gid_of(setup.our_ip),
        mac: setup.our_mac,
        mtu: o.mtu,
    };
    let ses = peer::open(
        o.tool,
        addr,
        &ours,
        &t.session,
        o.peer_mtu,
        o.timeout.max(Duration::from_secs(5)),
        o.patience,
    )?;
    let info = ses.info().clone();
    let peer_ip = info.ip();
    if peer_ip.is_ipv4() != setup.our_ip.is_ipv4() {
        return Err(PeerError::IpVersion {
            peer: peer_ip,
            ours: setup.our_ip,
        });
    }
    let mut mac = None;
    for _ in 0..3 {
        mac = (setup.resolve)(peer_ip);
        if mac.is_some() {
            break;
        }
    }
    let peer_mac = mac.ok_or(PeerError::NoMac(peer_ip))?;
    let ep = Endpoints {
        our_mac: setup.our_mac,
        peer_mac,
        our_ip: setup.our_ip,
        peer_ip,
        sport: sport(qpn),
        our_qpn: qpn,
        peer_qpn: info.qpn,
    };
    let mut peer = PeerRequester::new(info.psn);
    peer.mtu = info.mtu;
    let st = SessionState {
        next_psn: psn,
        msn: None,
        peer,
        peer_ect: false,
        dead: false,
    };
    Ok((Live { ses, st, ep }, info.about.clone()))
}

/// Run the selected tests; `progress` sees each result as it is decided.
pub fn run(o: &Options, setup: &mut Setup, progress: &mut dyn FnMut(&TestResult)) -> Report {
    let mut report = Report {
        tool: o.tool,
        about: vec![format!(
            "tester: {} on {}",
            setup.our_ip,
            setup.link.describe()
        )],
        results: Vec::new(),
    };
    let addr = (o.host.as_str(), o.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next());
    let mut live: Option<Live> = None;
    let mut sessions = 0u32;
    // After two sessions in a row fail to open, the peer is taken as unreachable.
    let mut open_failures = 0u32;
    let mut last_err = String::new();
    for t in catalogue::catalogue() {
        if !selected(t.id, &o.only) {
            continue;
        }
        let t0 = Instant::now();
        let prof = Profile::of(o.tool, &t.session);
        let mut capture = None;
        let outcome = if let Err(why) = catalogue::check_applies(&t, &prof, &setup.caps) {
            Outcome::not_applicable(why)
        } else if let Some(addr) = addr {
            let fresh = live.as_ref().is_none_or(|l| l.st.dead)
                || t.session.fresh
                || o.tool == PeerTool::Ferroce
                || o.tool.is_client();
            if fresh {
                if let Some(l) = live.take() {
                    close(l, setup, o.timeout);
                }
            }
            if live.is_none() && open_failures < 2 {
                match open(o, setup, addr, &t, sessions) {
                    Ok((l, about)) => {
                        sessions += 1;
                        if report.about.len() < 4 {
                            report.about.push(about);
                        }
                        live = Some(l);
                    }
                    Err(e) => {
                        open_failures += 1;
                        last_err = e.to_string();
                    }
                }
            }
            match live.as_mut() {
                None => Outcome::inconclusive(format!("no session with the peer: {last_err}")),
                Some(l) => {
                    let new = l.st.msn.is_none();
                    if let Some(dir) = &o.pcap_dir {
                        let p = dir.join(format!("{}.pcap", t.id));
                        if setup.link.start_capture(&p).is_ok() {
                            capture = Some(p);
                        }
                    }
                    let out = run_one(&t, l, setup, o);
                    setup.link.stop_capture();
                    // A new session whose peer answers nothing counts as a failure to open
                    // one: after two in a row the peer is given up on.
                    if l.st.msn.is_some() {
                        open_failures = 0;
                    } else if new && out.verdict == Verdict::Inconclusive {
                        open_failures += 1;
                        last_err = out.why.first().cloned().unwrap_or_default();
                    }
                    out
                }
            }
        } else {
            Outcome::inconclusive(format!("cannot resolve {}:{}", o.host, o.port))
        };
        let r = TestResult {
            id: t.id,
            group: t.group.name(),
            title: t.title,
            rule: t.rule,
            summary: t.summary,
            must: t.must,
            observes: t.observes,
            outcome,
            capture,
            secs: t0.elapsed().as_secs_f64(),
        };
        progress(&r);
        report.results.push(r);
    }
    if let Some(l) = live.take() {
        close(l, setup, o.timeout);
    }
    report
}

/// How long a test waits at most for a response the rule requires: ten response timeouts,
/// within the patience (silence is still judged over one timeout).
pub fn response_wait(o: &Options) -> Duration {
    o.timeout.max(o.patience.min(o.timeout.saturating_mul(10)))
}

/// One test on a live session: a fresh session is first checked with a probe (a peer that
/// answers nothing at all makes every verdict meaningless).
fn run_one(t: &TestDef, l: &mut Live, setup: &mut Setup, o: &Options) -> Outcome {
    let Live { ses, st, ep } = l;
    let info = ses.info().clone();
    let control = ses.control();
    let mut c = Ctx::new(&mut setup.link, *ep, &info, control, st, o.timeout);
    c.wait = response_wait(o);
    if c.st.msn.is_none() && info.tool.is_client() {
        // The peer's requester must be sending before anything can be judged.
        if let Err(why) = c.requester_goes_on() {
            c.st.dead = true;
            return Outcome::inconclusive(format!(
                "{why} (wrong address, MTU or GID index? is the client's iteration count too small: -n, --run_infinitely?)"
            ));
        }
        c.st.msn = Some(0);
    }
    if c.st.msn.is_none() {
        let mut pre = Obs::new();
        match c.probe(&mut pre) {
            Probe::Usable(_) => {}
            other => {
                c.st.dead = true;
                let why = match other {
                    Probe::Silent => format!(
                        "the peer does not answer a valid request at all within {} ms (wrong address, MTU or GID index? a UDP socket of the host's kernel on port 4791?)",
                        response_wait(o).as_millis()
                    ),
                    Probe::Nak(s, p, l) => format!("the peer refuses a valid request at PSN {p:#08x} ({s}): {l}"),
                    Probe::Unexpected(l) => format!("unexpected answer to a valid request: {l}"),
                    Probe::Usable(_) => String::new(),
                };
                return Outcome::inconclusive(why);
            }
        }
    }
    let mut out = (t.run)(&mut c);
    if let Some(e) = c.io_error.take() {
        c.st.dead = true;
        out.verdict = Verdict::Inconclusive;
        out.why.insert(0, format!("the packet link failed: {e}"));
    }
    drop(c);
    if !ses.alive() {
        st.dead = true;
        if out.verdict != Verdict::Pass {
            out.verdict = Verdict::Inconclusive;
            out.why.insert(
                0,
                "the peer closed the out-of-band connection during the test (it went away)".into(),
            );
        }
    }
    out
}

/// Exit status for a report: 1 if any test failed.
pub fn exit_code(r: &Report) -> i32 {
    i32::from(r.count(Verdict::Fail) > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_select_by_substring_and_wildcard() {
        let only = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(selected("psn.wrap", &[]));
        assert!(selected("psn.wrap", &only(&["wrap"])));
        assert!(selected("psn.dup-read-middle", &only(&["psn.dup-*"])));
        assert!(!selected("key.va-overflow", &only(&["psn.*"])));
        assert!(selected("key.va-overflow", &only(&["psn.*", "*overflow"])));
        assert!(!selected("key.va-overflow", &only(&["*read"])));
        assert!(selected("psn.dup-read-replayed", &only(&["*read*"])));
    }

    #[test]
    fn the_catalogue_has_unique_ids_and_every_rule_named() {
        let c = catalogue::catalogue();
        assert!(c.len() >= 40);
        let mut ids: Vec<_> = c.iter().map(|t| t.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), c.len());
        for t in &c {
            assert!(t.rule.starts_with("IBTA"), "{}", t.id);
            assert!(t.id.starts_with(t.group.name()), "{}", t.id);
            assert!(!t.must.is_empty() && !t.summary.is_empty() && !t.observes.is_empty());
        }
        // Every test applies to the ferroce peer, but those of READ/ATOMIC requesters (the
        // ferroce peer's requester sends SENDs), which apply to a perftest client role.
        let caps = Caps { raw: true };
        for t in &c {
            let on = |tool| catalogue::check_applies(t, &Profile::of(tool, &t.session), &caps);
            assert!(
                on(PeerTool::Ferroce).is_ok()
                    || (catalogue::CLIENT_TESTS.contains(&t.id)
                        && on(PeerTool::PerftestReadClient).is_ok()),
                "{}",
                t.id
            );
        }
        // The client roles run exactly the requester tests.
        for id in catalogue::CLIENT_TESTS {
            assert!(c.iter().any(|t| t.id == *id), "{id}");
        }
    }
}
