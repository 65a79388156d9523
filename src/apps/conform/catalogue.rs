//! The catalogue: every test, the IBTA rule it checks (section, and the compliance statement
//! where a public source gives its number), what the peer must do, how each peer tool lets
//! the tester observe it, and the script itself.
//!
//! Rule numbers: chapter 9 sections of IBTA Vol. 1; `CA17-n` statements are the RoCEv2
//! annex's (A17); `C9-n` numbers are given where the annex or Linux rxe's source comments
//! name them. The rule summaries are ours. Which numbers were checked against which public
//! source, and which are not checked: docs/conformance.md ("The rule citations").

use super::ctx::{Ctx, Got, Obs, Outcome, Resp, Verdict};
use super::frames::Pkt;
use super::link::Rx;
use super::peer::{PeerTool, ReadBack, RecvCount, Region, RetrySettings, Rights, SessionReq};
use crate::wire::{Ecn, NakCode, Opcode, Psn, Syndrome};
use std::time::{Duration, Instant};

/// A test group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Group {
    /// PSN checks: duplicates, sequence errors, wrap-around.
    Psn,
    /// The opcode sequence of multi-packet messages.
    OpSeq,
    /// Payload lengths against the path MTU and the message.
    Length,
    /// R_Keys, bounds and access rights.
    Keys,
    /// Receive WQEs and READ/atomic responder resources.
    Resources,
    /// Packets the peer must drop silently.
    Drops,
    /// ACKs and their coalescing.
    Acks,
    /// ECN marks and CNPs.
    Ecn,
    /// BTH and outer header fields.
    Headers,
}

impl Group {
    /// The short name that prefixes test ids (`psn`, `opseq`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Group::Psn => "psn",
            Group::OpSeq => "opseq",
            Group::Length => "len",
            Group::Keys => "key",
            Group::Resources => "res",
            Group::Drops => "drop",
            Group::Acks => "ack",
            Group::Ecn => "ecn",
            Group::Headers => "hdr",
        }
    }
}

/// What the tester itself can do (the backend).
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    /// Frames go out as built (AF_PACKET, AF_XDP, loopback); false for the UDP socket,
    /// which rewrites IP/UDP and the ICRC.
    pub raw: bool,
}

/// One test.
pub struct TestDef {
    /// Unique id (`group.name`), as `--only` selects it.
    pub id: &'static str,
    /// Its group.
    pub group: Group,
    /// One line saying what is sent.
    pub title: &'static str,
    /// "IBTA Vol 1 §9.7.5.1.1, C9-110" and the like.
    pub rule: &'static str,
    /// The rule in our words.
    pub summary: &'static str,
    /// What the peer must do.
    pub must: &'static str,
    /// How it is observed, per tool.
    pub observes: &'static str,
    /// Ok if the test applies to this peer tool (and session), Err(reason) if not.
    pub applies: fn(&Profile, &Caps) -> Result<(), Inapplicable>,
    /// What the session must be (fresh, start PSN, the ferroce peer's QP settings).
    pub session: SessionReq,
    /// The test script.
    pub run: fn(&mut Ctx) -> Outcome,
}

/// What a peer tool allows, known before connecting (see the table in `peer.rs`).
#[derive(Clone, Copy, Debug)]
pub struct Profile {
    /// The peer tool.
    pub tool: PeerTool,
    /// The remote access rights of its QP.
    pub qp: Rights,
    /// Rights behind the announced R_Key (None: no R_Key).
    pub mr: Option<Rights>,
    /// It announces regions that each lack one right (the ferroce peer).
    pub lacking: bool,
    /// It posts receive WQEs.
    pub recvs: bool,
    /// Its requester sends us messages.
    pub requester: bool,
    /// How its memory can be read back.
    pub readback: ReadBack,
    /// How its receive completions can be counted.
    pub recv_count: RecvCount,
    /// Its requester's retry settings, where the tool fixes them (or the ferroce peer
    /// takes them from the session request).
    pub retry: Option<RetrySettings>,
}

impl Profile {
    /// The profile of `tool` for a session asked for with `req`.
    pub fn of(tool: PeerTool, req: &SessionReq) -> Profile {
        let r = |read, write, atomic| Rights {
            read,
            write,
            atomic,
        };
        match tool {
            PeerTool::Pingpong => Profile {
                tool,
                qp: Rights::NONE,
                mr: None,
                lacking: false,
                recvs: true,
                requester: true,
                readback: ReadBack::None,
                recv_count: RecvCount::Echo,
                retry: Some(RetrySettings::PINGPONG),
            },
            PeerTool::PerftestWrite => Profile {
                tool,
                qp: r(false, true, false),
                mr: Some(r(false, true, false)),
                lacking: false,
                recvs: false,
                requester: false,
                readback: ReadBack::None,
                recv_count: RecvCount::None,
                retry: None,
            },
            PeerTool::PerftestRead => Profile {
                tool,
                qp: r(true, false, false),
                mr: Some(r(true, false, false)),
                lacking: false,
                recvs: false,
                requester: false,
                readback: ReadBack::Read,
                recv_count: RecvCount::None,
                retry: None,
            },
            PeerTool::PerftestAtomic => Profile {
                tool,
                qp: r(false, false, true),
                mr: Some(r(false, false, true)),
                lacking: false,
                recvs: false,
                requester: false,
                readback: ReadBack::Atomic,
                recv_count: RecvCount::None,
                retry: None,
            },
            PeerTool::PerftestSend => Profile {
                tool,
                qp: r(false, true, false),
                mr: Some(Rights::NONE),
                lacking: false,
                recvs: true,
                requester: false,
                readback: ReadBack::None,
                recv_count: RecvCount::None,
                retry: None,
            },
            PeerTool::PerftestWriteClient
            | PeerTool::PerftestSendClient
            | PeerTool::PerftestReadClient
            | PeerTool::PerftestAtomicClient => Profile {
                tool,
                qp: Rights::NONE,
                mr: None,
                lacking: false,
                recvs: false,
                requester: true,
                readback: ReadBack::None,
                recv_count: RecvCount::None,
                retry: Some(RetrySettings::PERFTEST),
            },
            PeerTool::Ferroce => Profile {
                tool,
                qp: req.qp_rights.unwrap_or(Rights::ALL),
                mr: Some(Rights::ALL),
                lacking: true,
                recvs: req.recvs.unwrap_or(64) > 0,
                requester: true,
                readback: ReadBack::Control,
                recv_count: RecvCount::Control,
                retry: Some(req.retry.unwrap_or(RetrySettings::PINGPONG)),
            },
        }
    }
    fn can_write(&self) -> bool {
        self.qp.write && self.mr.is_some_and(|m| m.write)
    }
    fn can_read(&self) -> bool {
        self.qp.read && self.mr.is_some_and(|m| m.read)
    }
    fn can_atomic(&self) -> bool {
        self.qp.atomic && self.mr.is_some_and(|m| m.atomic)
    }
    /// Some request executes on this QP (the probe).
    fn any_op(&self) -> bool {
        self.recvs || self.can_write() || self.can_read() || self.can_atomic()
    }
}

// ---------------------------------------------------------------------------------------
// applicability

/// Why a test does not apply to a peer tool (the reason its verdict `n/a` shows). Each
/// variant holding a `&str` names the peer program ([`PeerTool::program`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Inapplicable {
    /// Nothing at all executes on the peer's QP.
    #[error("no request executes on this peer's QP")]
    NoRequest,
    /// The packet needs a raw backend.
    #[error("the UDP-socket backend cannot send this packet (it rewrites IP/UDP and the ICRC): use --backend packet or xdp")]
    NeedsRaw,
    /// The peer allows no RDMA WRITE.
    #[error("{tool} allows no RDMA WRITE (QP rights {qp}, R_Key rights {mr})")]
    NoWrite {
        /// The peer program.
        tool: &'static str,
        /// Its QP's rights (`rwa` letters).
        qp: String,
        /// Its R_Key's rights, or `none`.
        mr: String,
    },
    /// The peer allows no RDMA READ.
    #[error("{0} allows no RDMA READ")]
    NoRead(&'static str),
    /// The peer allows no atomics.
    #[error("{0} allows no atomics")]
    NoAtomic(&'static str),
    /// The peer posts no receive WQEs.
    #[error("{0} posts no receives")]
    NoRecvs(&'static str),
    /// The peer takes no message of more than one packet.
    #[error("{0} takes no multi-packet message (no receives posted, no RDMA WRITE)")]
    NoMultiPacket(&'static str),
    /// The peer's requester sends nothing.
    #[error("{0} sends no requests to the tester")]
    NoRequester(&'static str),
    /// The peer's retry settings are not known.
    #[error("{0}'s retry settings are not known to the tester")]
    RetryUnknown(&'static str),
    /// The peer retries RNR NAKs without end.
    #[error("{0} sets rnr_retry 7 (without end): see ack.rnr-retry-infinite")]
    RnrInfinite(&'static str),
    /// The peer's RNR retries end.
    #[error("{0} sets an rnr_retry below 7")]
    RnrFinite(&'static str),
    /// What was written cannot be read back.
    #[error("written memory cannot be read back with {0} (its buffer has no remote read right)")]
    NoReadBack(&'static str),
    /// The peer's receive completions cannot be counted.
    #[error("{0} does not show its receive completions to the peer")]
    NoRecvCount(&'static str),
    /// The peer's QP has the right whose absence the test needs.
    #[error("{tool}'s QP allows {what}")]
    QpAllows {
        /// The peer program.
        tool: &'static str,
        /// The operation.
        what: &'static str,
    },
    /// The peer's QP lacks a right the test needs.
    #[error("{tool}'s QP does not enable {what}")]
    QpLacks {
        /// The peer program.
        tool: &'static str,
        /// The operation.
        what: &'static str,
    },
    /// The peer announces no R_Key lacking a right its QP has.
    #[error("{tool} has no R_Key lacking {what} on a QP that enables it")]
    NoKeyLacking {
        /// The peer program.
        tool: &'static str,
        /// The right (`write`, `read`, `atomic`).
        what: &'static str,
    },
    /// The peer keeps receives posted.
    #[error("{0} keeps receives posted (an RNR NAK cannot be provoked)")]
    KeepsRecvs(&'static str),
    /// A perftest client role: only the peer's requester is tested.
    #[error("{0} is the client here: only its requester is tested (run the tool as the server for the responder tests)")]
    ClientRole(&'static str),
    /// The test needs several of the peer's requests outstanding at once.
    #[error("{0}'s requester has one message outstanding at a time")]
    NoWindow(&'static str),
    /// The test needs the peer's requester to send RDMA READs (or ATOMICs).
    #[error("{0}'s requester sends no {1}")]
    RequesterSendsNo(&'static str, &'static str),
    /// The test's RNR NAK or ACK cannot answer the peer's READ/ATOMIC requests.
    #[error("{0}'s requester sends READ/ATOMIC requests (an ACK or RNR NAK does not answer them)")]
    RequesterReads(&'static str),
}

/// The tests that apply in the perftest client roles (the peer as requester only).
pub const CLIENT_TESTS: &[&str] = &[
    "ack.ghost-ack",
    "ack.retry-exhausted",
    "ack.nak-retry-exhausted",
    "ack.rnr-retry-infinite",
    "ack.nak-resend-from-psn",
    "ack.coalesced-to-requester",
    "ack.read-response-gap",
    "res.requester-rd-atomic",
];

/// Whether test `t` applies to the peer tool and session `p` (its own rule, and the client
/// roles' restriction to [`CLIENT_TESTS`]).
pub fn check_applies(t: &TestDef, p: &Profile, c: &Caps) -> Result<(), Inapplicable> {
    if p.tool.is_client() && !CLIENT_TESTS.contains(&t.id) {
        return Err(Inapplicable::ClientRole(p.tool.program()));
    }
    (t.applies)(p, c)
}

fn always(p: &Profile, _: &Caps) -> Result<(), Inapplicable> {
    if p.any_op() {
        Ok(())
    } else {
        Err(Inapplicable::NoRequest)
    }
}
fn need_raw(p: &Profile, c: &Caps) -> Result<(), Inapplicable> {
    always(p, c)?;
    if c.raw {
        Ok(())
    } else {
        Err(Inapplicable::NeedsRaw)
    }
}
/// `Ok` when `ok`, else the reason `why` gives for the peer program.
fn need(ok: bool, p: &Profile, why: fn(&'static str) -> Inapplicable) -> Result<(), Inapplicable> {
    if ok {
        Ok(())
    } else {
        Err(why(p.tool.program()))
    }
}
fn need_write(p: &Profile, _: &Caps) -> Result<(), Inapplicable> {
    if p.can_write() {
        Ok(())
    } else {
        Err(Inapplicable::NoWrite {
            tool: p.tool.program(),
            qp: p.qp.letters(),
            mr: p.mr.map(|m| m.letters()).unwrap_or_else(|| "none".into()),
        })
    }
}
fn need_read(p: &Profile, _: &Caps) -> Result<(), Inapplicable> {
    need(p.can_read(), p, Inapplicable::NoRead)
}
fn need_atomic(p: &Profile, _: &Caps) -> Result<(), Inapplicable> {
    need(p.can_atomic(), p, Inapplicable::NoAtomic)
}
fn need_recvs(p: &Profile, _: &Caps) -> Result<(), Inapplicable> {
    need(p.recvs, p, Inapplicable::NoRecvs)
}
fn need_multi(p: &Profile, _: &Caps) -> Result<(), Inapplicable> {
    need(p.recvs || p.can_write(), p, Inapplicable::NoMultiPacket)
}
fn need_send_or_write(p: &Profile, _: &Caps) -> Result<(), Inapplicable> {
    need_multi(p, &Caps { raw: true })
}
fn need_requester(p: &Profile, _: &Caps) -> Result<(), Inapplicable> {
    need(p.requester, p, Inapplicable::NoRequester)
}
fn need_requester_retry(p: &Profile, c: &Caps) -> Result<(), Inapplicable> {
    need_requester(p, c)?;
    need(p.retry.is_some(), p, Inapplicable::RetryUnknown)
}
fn need_requester_rnr_finite(p: &Profile, c: &Caps) -> Result<(), Inapplicable> {
    need_requester_retry(p, c)?;
    let finite = p.retry.is_some_and(|r| r.rnr_retry < 7);
    need(finite, p, Inapplicable::RnrInfinite)
}
fn need_requester_rnr_infinite(p: &Profile, c: &Caps) -> Result<(), Inapplicable> {
    need_requester_retry(p, c)?;
    need(
        !matches!(
            p.tool,
            PeerTool::PerftestReadClient | PeerTool::PerftestAtomicClient
        ),
        p,
        Inapplicable::RequesterReads,
    )?;
    let infinite = p.retry.is_some_and(|r| r.rnr_retry == 7);
    need(infinite, p, Inapplicable::RnrFinite)
}
/// Several of the peer's requests outstanding at once: the ferroce peer (on request) and the
/// perftest clients (their send queue depth).
fn need_window(p: &Profile, c: &Caps) -> Result<(), Inapplicable> {
    need_requester(p, c)?;
    need(
        p.tool == PeerTool::Ferroce || p.tool.is_client(),
        p,
        Inapplicable::NoWindow,
    )?;
    need(
        !matches!(
            p.tool,
            PeerTool::PerftestReadClient | PeerTool::PerftestAtomicClient
        ),
        p,
        Inapplicable::RequesterReads,
    )
}
fn need_read_requester(p: &Profile, _: &Caps) -> Result<(), Inapplicable> {
    if p.tool == PeerTool::PerftestReadClient {
        Ok(())
    } else {
        Err(Inapplicable::RequesterSendsNo(
            p.tool.program(),
            "RDMA READs (ib_read_bw as the client does)",
        ))
    }
}
fn need_rd_atomic_requester(p: &Profile, _: &Caps) -> Result<(), Inapplicable> {
    if matches!(
        p.tool,
        PeerTool::PerftestReadClient | PeerTool::PerftestAtomicClient
    ) {
        Ok(())
    } else {
        Err(Inapplicable::RequesterSendsNo(
            p.tool.program(),
            "READ/ATOMIC requests (ib_read_bw or ib_atomic_bw as the client do)",
        ))
    }
}
fn need_write_readback(p: &Profile, c: &Caps) -> Result<(), Inapplicable> {
    need_write(p, c)?;
    let none = p.readback == ReadBack::None || (p.readback == ReadBack::Read && !p.can_read());
    need(!none, p, Inapplicable::NoReadBack)
}
fn need_recv_count(p: &Profile, c: &Caps) -> Result<(), Inapplicable> {
    need_recvs(p, c)?;
    need(
        p.recv_count != RecvCount::None,
        p,
        Inapplicable::NoRecvCount,
    )
}
fn need_qp_lacks(
    p: &Profile,
    right: fn(&Rights) -> bool,
    what: &'static str,
) -> Result<(), Inapplicable> {
    if !p.any_op() {
        return Err(Inapplicable::NoRequest);
    }
    if right(&p.qp) {
        Err(Inapplicable::QpAllows {
            tool: p.tool.program(),
            what,
        })
    } else {
        Ok(())
    }
}
fn need_no_recvs(p: &Profile, _: &Caps) -> Result<(), Inapplicable> {
    if p.recvs {
        Err(Inapplicable::KeepsRecvs(p.tool.program()))
    } else if !p.any_op() {
        Err(Inapplicable::NoRequest)
    } else {
        Ok(())
    }
}
// ---------------------------------------------------------------------------------------
// building blocks

/// The valid request this peer takes (the probe's operation) at `psn`.
fn valid(c: &Ctx, psn: u32) -> Option<Pkt> {
    c.probe_pkt(psn).map(|(p, _)| p)
}

fn no_valid() -> Outcome {
    Outcome::inconclusive("no request this peer's QP accepts")
}

/// A multi-packet message kind the peer takes: SEND (receives posted) or WRITE.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    Write,
}

fn kind(c: &Ctx) -> Option<Kind> {
    let i = c.info;
    if i.recvs.is_some_and(|n| n > 0) || i.tool == PeerTool::PerftestSend {
        Some(Kind::Send)
    } else if i.qp_rights.write && i.region.is_some_and(|r| r.rights.write) {
        Some(Kind::Write)
    } else {
        None
    }
}

/// FIRST/MIDDLE/LAST/ONLY of `k`; the RETH of a WRITE FIRST/ONLY names `total` bytes.
fn part(c: &Ctx, k: Kind, which: &str, psn: u32, len: usize, total: u32) -> Pkt {
    let data = vec![0xc3u8; len];
    let r = c.info.region.unwrap_or(Region {
        rkey: 0,
        va: 0,
        len: 0,
        rights: Rights::NONE,
    });
    let op = match (k, which) {
        (Kind::Send, "first") => Opcode::RC_SEND_FIRST,
        (Kind::Send, "middle") => Opcode::RC_SEND_MIDDLE,
        (Kind::Send, "last") => Opcode::RC_SEND_LAST,
        (Kind::Send, _) => Opcode::RC_SEND_ONLY,
        (Kind::Write, "first") => Opcode::RC_WRITE_FIRST,
        (Kind::Write, "middle") => Opcode::RC_WRITE_MIDDLE,
        (Kind::Write, "last") => Opcode::RC_WRITE_LAST,
        (Kind::Write, _) => Opcode::RC_WRITE_ONLY,
    };
    let p = Pkt::new(op, psn, &data);
    if op == Opcode::RC_WRITE_FIRST || op == Opcode::RC_WRITE_ONLY {
        p.reth(r.va, r.rkey, total)
    } else {
        p
    }
}

fn mtu(c: &Ctx) -> usize {
    c.info.mtu as usize
}

/// Responses that are NAKs (any code) or RNR NAKs.
fn naks(got: &[Got]) -> Vec<&Got> {
    got.iter()
        .filter(|g| {
            matches!(
                g.resp,
                Resp::Ack {
                    syn: Syndrome::Nak(_) | Syndrome::RnrNak(_),
                    ..
                }
            )
        })
        .collect()
}

/// The highest PSN positively acknowledged (ACK, ATOMIC ACK or READ response) among `got`,
/// relative to `base`.
fn acked_upto(got: &[Got], base: u32) -> Option<i32> {
    got.iter()
        .filter_map(|g| match &g.resp {
            Resp::Ack {
                psn,
                syn: Syndrome::Ack(_),
                ..
            }
            | Resp::Atomic { psn, .. }
            | Resp::Read { psn, .. } => Some(Psn::new(*psn).diff(Psn::new(base))),
            _ => None,
        })
        .max()
}

/// Send `pkts`; the peer must answer with exactly one NAK `code` at `at` (and nothing
/// negative before it); then its QP must be in the error state.
fn fatal(c: &mut Ctx, o: &mut Obs, pkts: Vec<Pkt>, at: u32, code: NakCode) {
    c.send(o, &pkts);
    let got = c.until(|g| {
        g.iter()
            .any(|g| matches!(g.resp, Resp::Ack { psn, syn: Syndrome::Nak(_) | Syndrome::RnrNak(_), .. } if psn == at))
    });
    c.note_all(o, &got);
    judge_nak(c, o, &got, at, code);
    // The NAKed request consumed nothing: the probe goes to the same PSN.
    c.st.next_psn = at;
    c.end_error_state(o);
}

/// Exactly one NAK, of `code`, at `at`; nothing executed at or after `at`.
fn judge_nak(c: &Ctx, o: &mut Obs, got: &[Got], at: u32, code: NakCode) {
    let n = naks(got);
    let want = Syndrome::Nak(code);
    match n.as_slice() {
        [] => {
            if let Some(d) = acked_upto(got, at).filter(|&d| d >= 0) {
                o.fail(format!(
                    "the request was executed (acknowledged up to PSN {:#08x}) instead of NAKed with {want}",
                    Psn::new(at).add(d as u32).get()
                ));
            } else {
                o.fail(format!(
                    "no {want} for PSN {at:#08x} within {} ms",
                    c.wait.max(c.timeout).as_millis()
                ));
            }
        }
        [g] => match g.resp {
            Resp::Ack { psn, syn, .. } if syn == want && psn == at => {
                o.did(format!("{want} for PSN {at:#08x}, as required"))
            }
            Resp::Ack { psn, syn, .. } => o.fail(format!(
                "answered {syn} for PSN {psn:#08x}; the rule demands {want} for PSN {at:#08x}"
            )),
            _ => {}
        },
        many => o.fail(format!(
            "{} NAKs where exactly one {want} is required",
            many.len()
        )),
    }
    if let Some(d) = acked_upto(got, at).filter(|&d| d >= 0) {
        if !n.is_empty() {
            o.fail(format!(
                "PSN {:#08x} was also acknowledged",
                Psn::new(at).add(d as u32).get()
            ));
        }
    }
}

/// The packet at `p` must leave no trace: no response, and the peer still expects `p`
/// (a valid request at `p + 1` gets a PSN sequence error NAK naming `p`); then the QP works.
fn silent_drop(c: &mut Ctx, o: &mut Obs, bad: Pkt) {
    let p = bad.psn;
    c.send(o, &[bad]);
    let got = c.listen(c.timeout);
    if got.is_empty() {
        o.did(format!("no response within {} ms", c.timeout.as_millis()));
    } else {
        c.note_all(o, &got);
        o.fail("the peer answered a packet it must drop silently");
    }
    not_consumed(c, o, p);
    c.end_usable(o);
}

/// Show that PSN `p` was not consumed: a valid request at `p + 1` must draw a PSN sequence
/// error NAK for `p`.
fn not_consumed(c: &mut Ctx, o: &mut Obs, p: u32) {
    let Some(next) = valid(c, Psn::new(p).next().get()) else {
        return;
    };
    c.send(o, &[next]);
    let got = c.until(|g| {
        g.iter().any(|g| {
            matches!(
                g.resp,
                Resp::Ack { .. } | Resp::Read { .. } | Resp::Atomic { .. }
            )
        })
    });
    c.note_all(o, &got);
    let seq = got.iter().find(|g| g.is_nak(NakCode::PsnSequenceError));
    match seq.map(|g| &g.resp) {
        Some(Resp::Ack { psn, .. }) if *psn == p => o.did(format!(
            "a request at PSN {:#08x} drew a sequence error NAK for {p:#08x}: the dropped packet consumed nothing",
            Psn::new(p).next().get()
        )),
        Some(Resp::Ack { psn, .. }) => {
            o.fail(format!(
                "the peer now expects PSN {psn:#08x}, not {p:#08x}"
            ));
            c.st.dead = true;
        }
        _ if acked_upto(&got, Psn::new(p).next().get()) == Some(0) => {
            o.fail(format!(
                "a request at PSN {:#08x} was executed: the packet at {p:#08x} that had to be dropped was acted on",
                Psn::new(p).next().get()
            ));
            c.st.next_psn = Psn::new(p).add(2).get();
        }
        _ => o.unsure(format!(
            "no sequence error NAK for a request at PSN {:#08x}: cannot tell whether PSN {p:#08x} was consumed",
            Psn::new(p).next().get()
        )),
    }
}

/// The peer's MSN as last seen.
fn msn(c: &Ctx) -> Option<u32> {
    c.st.msn
}

fn ack_at(got: &[Got], psn: u32) -> Option<&Got> {
    got.iter().find(|g| g.ack_psn() == Some(psn))
}

/// Send one valid request at the expected PSN and require its ACK (or READ/ATOMIC answer);
/// returns the MSN it carried.
fn one_valid(c: &mut Ctx, o: &mut Obs) -> Option<u32> {
    let p = c.psn();
    let pkt = valid(c, p)?;
    c.send(o, &[pkt]);
    let got = c.answer(p, 1);
    c.note_all(o, &got);
    let m = got.iter().find_map(|g| match g.resp {
        Resp::Ack {
            psn,
            syn: Syndrome::Ack(_),
            msn,
        } if psn == p => Some(msn),
        Resp::Atomic { psn, msn, .. } if psn == p => Some(msn),
        Resp::Read {
            psn,
            aeth: Some((_, msn)),
            ..
        } if psn == p => Some(msn),
        _ => None,
    });
    if m.is_some() {
        c.take(1);
    } else {
        o.fail(format!(
            "a valid request at PSN {p:#08x} was not acknowledged"
        ));
        c.st.dead = true;
    }
    m
}

// ---------------------------------------------------------------------------------------
// PSN

fn t_in_order(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let p = c.psn();
    let Some(_) = valid(c, p) else {
        return no_valid();
    };
    let pkts: Vec<Pkt> = (0..4)
        .map(|i| valid(c, Psn::new(p).add(i).get()).unwrap_or_else(|| Pkt::send_only(0, b"")))
        .collect();
    c.send(&mut o, &pkts);
    let last = Psn::new(p).add(3).get();
    let got = c.answer(last, 1);
    c.note_all(&mut o, &got);
    if !naks(&got).is_empty() {
        o.fail("in-order requests drew a NAK");
    }
    match acked_upto(&got, p) {
        Some(3) => o.did("all four in-order requests acknowledged"),
        Some(d) => o.fail(format!(
            "acknowledged only up to PSN {:#08x}",
            Psn::new(p).add(d.max(0) as u32).get()
        )),
        None => o.fail("no acknowledgement"),
    }
    if !o.failed() {
        c.take(4);
    } else {
        c.end_unknown();
        return o.done();
    }
    c.end_usable(&mut o);
    o.done()
}

/// A duplicate of the single-packet request `pkt` (already executed at its PSN).
fn dup_reacked(c: &mut Ctx, pkt: Pkt) -> Outcome {
    let mut o = Obs::new();
    let p = pkt.psn;
    c.send(&mut o, std::slice::from_ref(&pkt));
    let got = c.answer(p, 1);
    c.note_all(&mut o, &got);
    let Some(m0) = ack_at(&got, p).and_then(|g| match g.resp {
        Resp::Ack { msn, .. } => Some(msn),
        _ => None,
    }) else {
        o.fail(format!(
            "the original request at PSN {p:#08x} was not acknowledged"
        ));
        c.end_unknown();
        return o.done();
    };
    c.take(1);
    o.did("now the same packet again (a duplicate):");
    c.send(&mut o, &[pkt]);
    let got = c.until(|g| g.iter().any(|g| matches!(g.resp, Resp::Ack { .. })));
    c.note_all(&mut o, &got);
    match got.iter().find_map(|g| match g.resp {
        Resp::Ack { psn, syn, msn } => Some((psn, syn, msn)),
        _ => None,
    }) {
        Some((q, Syndrome::Ack(_), m)) => {
            let d = Psn::new(q).diff(Psn::new(p));
            if d < 0 {
                o.fail(format!(
                    "re-ACK for PSN {q:#08x}, which does not cover the duplicate's PSN {p:#08x}"
                ));
            } else if d > 0 {
                o.fail(format!("re-ACK for PSN {q:#08x}, beyond anything received"));
            } else {
                o.did(format!("re-ACKed with PSN {q:#08x}"));
            }
            if m != m0 {
                o.fail(format!(
                    "the re-ACK carries MSN {m}, not {m0}: the duplicate was counted as a new message"
                ));
            } else {
                o.did(format!("MSN unchanged ({m})"));
            }
        }
        Some((_, s, _)) => o.fail(format!("answered the duplicate with {s}")),
        None => {
            o.fail("the duplicate was not acknowledged again (the requester would retry for ever)")
        }
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_dup_send_reacked(c: &mut Ctx) -> Outcome {
    let p = c.psn();
    dup_reacked(c, Pkt::send_only(p, b"duplicate send!!"))
}

fn t_dup_write_reacked(c: &mut Ctx) -> Outcome {
    let p = c.psn();
    let Some(r) = c.region() else {
        return no_valid();
    };
    dup_reacked(c, Pkt::write_only(p, r.va, r.rkey, &[0x11; 16]))
}

fn t_dup_write_not_executed(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(r) = c.region() else {
        return no_valid();
    };
    let p = c.psn();
    let a = Pkt::write_only(p, r.va, r.rkey, &[0xaa; 16]);
    let b = Pkt::write_only(Psn::new(p).next().get(), r.va, r.rkey, &[0xbb; 16]);
    c.send(&mut o, &[a.clone(), b]);
    let got = c.answer(Psn::new(p).next().get(), 1);
    c.note_all(&mut o, &got);
    if acked_upto(&got, p) != Some(1) {
        o.fail("the two WRITEs were not both acknowledged");
        c.end_unknown();
        return o.done();
    }
    c.take(2);
    o.did("now the first WRITE again (a duplicate, its data 0xaa over the second's 0xbb):");
    c.send(&mut o, &[a]);
    let got = c.until(|g| !g.is_empty());
    c.note_all(&mut o, &got);
    match c.read_back(&mut o, r.va, 16) {
        Some(m) if m == [0xbb; 16] => {
            o.did("memory still holds the second WRITE's data: the duplicate was not executed")
        }
        Some(m) if m == [0xaa; 16] => {
            o.fail("memory holds the duplicate's data again: the duplicate WRITE was executed")
        }
        Some(m) => o.fail(format!("memory holds {m:02x?}")),
        None => o.unsure("the memory could not be read back"),
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_dup_send_not_executed(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(n0) = c.recv_count(&mut o) else {
        return Outcome::inconclusive("receive completions are not observable");
    };
    o.did(format!("receive completions before: {n0}"));
    let p = c.psn();
    let s = Pkt::send_only(p, b"exactly once....");
    c.send(&mut o, std::slice::from_ref(&s));
    let got = c.answer(p, 1);
    c.note_all(&mut o, &got);
    if ack_at(&got, p).is_none() {
        o.fail("the SEND was not acknowledged");
        c.end_unknown();
        return o.done();
    }
    c.take(1);
    c.send(&mut o, &[s]);
    let got = c.until(|g| !g.is_empty());
    c.note_all(&mut o, &got);
    match c.recv_count(&mut o) {
        Some(n) if n == n0 + 1 => o.did(format!(
            "receive completions after: {n} (one message, one completion)"
        )),
        Some(n) => o.fail(format!(
            "receive completions after: {n}, expected {} (the duplicate SEND was delivered again)",
            n0 + 1
        )),
        None => o.unsure("receive completions could not be counted"),
    }
    c.end_usable(&mut o);
    o.done()
}

/// What is missing from a READ's responses.
#[derive(Debug, thiserror::Error)]
enum ReadGap {
    #[error("PSN {psn:#08x} came as {got}, expected {want}")]
    Opcode { psn: u32, got: Opcode, want: Opcode },
    #[error("no READ response for PSN {0:#08x}")]
    Missing(u32),
}

fn read_all(got: &[Got], first: u32, npkts: u32) -> Result<Vec<u8>, ReadGap> {
    let mut out = Vec::new();
    for k in 0..npkts {
        let psn = Psn::new(first).add(k).get();
        let want = match (k == 0, k + 1 == npkts) {
            (true, true) => Opcode::RC_READ_RESPONSE_ONLY,
            (true, false) => Opcode::RC_READ_RESPONSE_FIRST,
            (false, true) => Opcode::RC_READ_RESPONSE_LAST,
            _ => Opcode::RC_READ_RESPONSE_MIDDLE,
        };
        match got.iter().find_map(|g| match &g.resp {
            Resp::Read {
                psn: q,
                opcode,
                data,
                ..
            } if *q == psn => Some((*opcode, data)),
            _ => None,
        }) {
            Some((op, d)) if op == want => out.extend_from_slice(d),
            Some((got, _)) => return Err(ReadGap::Opcode { psn, got, want }),
            None => return Err(ReadGap::Missing(psn)),
        }
    }
    Ok(out)
}

fn t_dup_read_replayed(c: &mut Ctx) -> Outcome {
    read_replay(c, false)
}

fn t_dup_read_middle(c: &mut Ctx) -> Outcome {
    read_replay(c, true)
}

fn read_replay(c: &mut Ctx, middle: bool) -> Outcome {
    let mut o = Obs::new();
    let Some(r) = c.region() else {
        return no_valid();
    };
    let m = mtu(c);
    let npkts = ((r.len as usize) / m).clamp(1, 3) as u32;
    if middle && npkts < 2 {
        return Outcome::inconclusive("the peer's buffer is shorter than two path MTUs");
    }
    let len = npkts * m as u32;
    let p = c.psn();
    c.send(&mut o, &[Pkt::read(p, r.va, r.rkey, len)]);
    let got = c.answer(p, npkts);
    c.note_all(&mut o, &got);
    let data = match read_all(&got, p, npkts) {
        Ok(d) => d,
        Err(e) => {
            o.fail(format!("the original READ: {e}"));
            c.end_unknown();
            return o.done();
        }
    };
    c.take(npkts);
    let (dpsn, dva, dlen, dn, want) = if middle {
        (
            Psn::new(p).next().get(),
            r.va + m as u64,
            len - m as u32,
            npkts - 1,
            data[m..].to_vec(),
        )
    } else {
        (p, r.va, len, npkts, data.clone())
    };
    o.did(format!(
        "now the READ again as a duplicate from PSN {dpsn:#08x} ({dlen} bytes at {dva:#x}):"
    ));
    c.send(&mut o, &[Pkt::read(dpsn, dva, r.rkey, dlen)]);
    let got = c.answer(dpsn, dn);
    c.note_all(&mut o, &got);
    match read_all(&got, dpsn, dn) {
        Ok(d) if d == want => o.did(format!(
            "the responses were sent again from PSN {dpsn:#08x} with the same {dlen} bytes"
        )),
        Ok(_) => o.fail("the replayed READ responses carry different data"),
        Err(e) => o.fail(format!(
            "the duplicate READ was not executed again from its PSN: {e}"
        )),
    }
    if !naks(&got).is_empty() {
        o.fail("the duplicate READ drew a NAK");
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_dup_atomic(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(r) = c.region() else {
        return no_valid();
    };
    let va = r.va + 64;
    let p = c.psn();
    let fa = Pkt::fetch_add(p, va, r.rkey, 1);
    c.send(&mut o, std::slice::from_ref(&fa));
    let got = c.answer(p, 1);
    c.note_all(&mut o, &got);
    let orig = |got: &[Got], psn: u32| {
        got.iter().find_map(|g| match g.resp {
            Resp::Atomic {
                psn: q,
                orig,
                syn: Syndrome::Ack(_),
                ..
            } if q == psn => Some(orig),
            _ => None,
        })
    };
    let Some(x) = orig(&got, p) else {
        o.fail("the FETCH_AND_ADD was not answered");
        c.end_unknown();
        return o.done();
    };
    c.take(1);
    o.did(format!(
        "original value {x:#x}; now the same FETCH_AND_ADD again (a duplicate):"
    ));
    c.send(&mut o, &[fa]);
    let got = c.answer(p, 1);
    c.note_all(&mut o, &got);
    match orig(&got, p) {
        Some(v) if v == x => o.did("the duplicate returned the saved original value"),
        Some(v) => o.fail(format!(
            "the duplicate returned {v:#x}, not the saved {x:#x}: it was executed again"
        )),
        None => o.fail("the duplicate ATOMIC was not answered"),
    }
    let q = c.psn();
    c.send(&mut o, &[Pkt::fetch_add(q, va, r.rkey, 0)]);
    let got = c.answer(q, 1);
    c.note_all(&mut o, &got);
    match orig(&got, q) {
        Some(v) if v == x.wrapping_add(1) => {
            c.take(1);
            o.did(format!("the value is now {v:#x}: added once"))
        }
        Some(v) => {
            c.take(1);
            o.fail(format!(
                "the value is now {v:#x}, expected {:#x}: the add was not executed exactly once",
                x.wrapping_add(1)
            ))
        }
        None => {
            o.fail("the follow-up FETCH_AND_ADD was not answered");
            c.end_unknown();
            return o.done();
        }
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_out_of_sequence(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let p = c.psn();
    let mk = |c: &Ctx, i: u32| valid(c, Psn::new(p).add(i).get());
    let Some(_) = mk(c, 0) else { return no_valid() };
    let ahead: Vec<Pkt> = (1..4).filter_map(|i| mk(c, i)).collect();
    o.did(format!("PSN {p:#08x} skipped:"));
    c.send(&mut o, &ahead);
    let got = c.listen(c.timeout);
    c.note_all(&mut o, &got);
    let n = naks(&got);
    let seq: Vec<_> = n
        .iter()
        .filter(|g| g.is_nak(NakCode::PsnSequenceError))
        .collect();
    match (seq.len(), n.len()) {
        (1, 1) => match seq[0].resp {
            Resp::Ack { psn, .. } if psn == p => o.did("exactly one PSN sequence error NAK, for the expected PSN"),
            Resp::Ack { psn, .. } => o.fail(format!("the sequence error NAK names PSN {psn:#08x}, not the expected {p:#08x}")),
            _ => {}
        },
        (0, 0) => o.fail("no PSN sequence error NAK"),
        (s, t) => o.fail(format!(
            "{s} sequence error NAKs and {} other NAKs where exactly one sequence error NAK is required",
            t - s
        )),
    }
    if acked_upto(&got, p).is_some_and(|d| d >= 0) {
        o.fail("requests after the gap were executed");
    }
    o.did("now the missing PSN and the rest again:");
    let all: Vec<Pkt> = (0..4).filter_map(|i| mk(c, i)).collect();
    c.send(&mut o, &all);
    let got = c.answer(Psn::new(p).add(3).get(), 1);
    c.note_all(&mut o, &got);
    if acked_upto(&got, p) == Some(3) && naks(&got).is_empty() {
        c.take(4);
        o.did("all four acknowledged once the expected PSN arrived");
    } else {
        o.fail("the requests were not all acknowledged after the gap was filled");
        c.end_unknown();
        return o.done();
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_dup_while_nak(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(m0) = one_valid(c, &mut o) else {
        c.end_unknown();
        return o.done();
    };
    let old = Psn::new(c.psn()).sub(1).get();
    let p = c.psn();
    let Some(ahead) = valid(c, Psn::new(p).next().get()) else {
        return no_valid();
    };
    c.send(&mut o, &[ahead]);
    let got = c.until(|g| !g.is_empty());
    c.note_all(&mut o, &got);
    if !got.iter().any(|g| g.is_nak(NakCode::PsnSequenceError)) {
        o.unsure(
            "no sequence error NAK for the gap (see psn.out-of-sequence); cannot test the rest",
        );
        c.end_unknown();
        return o.done();
    }
    o.did("in the NAK state now; a duplicate of the last executed request:");
    let Some(dup) = valid(c, old) else {
        return no_valid();
    };
    c.send(&mut o, &[dup]);
    let got = c.until(|g| !g.is_empty());
    c.note_all(&mut o, &got);
    match got.iter().find_map(|g| match g.resp {
        Resp::Ack { psn, syn, msn } => Some((psn, syn, msn)),
        Resp::Atomic { psn, msn, syn, .. } => Some((psn, syn, msn)),
        Resp::Read { psn, .. } => Some((psn, Syndrome::Ack(crate::wire::CreditCode::UNLIMITED), m0)),
        _ => None,
    }) {
        Some((q, Syndrome::Ack(_), m)) if q == old && m == m0 => o.did("the duplicate was answered while the sequence error stood"),
        Some((q, Syndrome::Ack(_), m)) => o.fail(format!("the duplicate was answered for PSN {q:#08x} with MSN {m} (expected PSN {old:#08x}, MSN {m0})")),
        Some((_, s, _)) => o.fail(format!("the duplicate drew {s}")),
        None => o.fail("the duplicate was not answered while the sequence error stood"),
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_wrap(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let p = c.psn();
    o.did(format!(
        "session started at PSN {p:#08x}, {} PSNs before the wrap",
        0x100_0000 - p
    ));
    let pkts: Vec<Pkt> = (0..6)
        .filter_map(|i| valid(c, Psn::new(p).add(i).get()))
        .collect();
    if pkts.len() != 6 {
        return no_valid();
    }
    c.send(&mut o, &pkts);
    let last = Psn::new(p).add(5).get();
    let got = c.answer(last, 1);
    c.note_all(&mut o, &got);
    match acked_upto(&got, p) {
        Some(5) if naks(&got).is_empty() => o.did(format!(
            "acknowledged across the wrap up to PSN {last:#08x}"
        )),
        Some(d) => {
            o.fail(format!(
                "acknowledged only up to PSN {:#08x}",
                Psn::new(p).add(d.max(0) as u32).get()
            ));
            c.end_unknown();
            return o.done();
        }
        None => {
            o.fail("no acknowledgement across the wrap");
            c.end_unknown();
            return o.done();
        }
    }
    c.take(6);
    // PSN 0xffffff again: a duplicate now, not a request from the future.
    let ff = 0xff_ffff;
    if let Some(d) = valid(c, ff).filter(|_| kind(c).is_some()) {
        o.did("PSN 0xffffff again (a duplicate across the wrap):");
        c.send(&mut o, &[d]);
        let got = c.until(|g| !g.is_empty());
        c.note_all(&mut o, &got);
        if got.iter().any(|g| g.is_nak(NakCode::PsnSequenceError)) {
            o.fail("PSN 0xffffff after the wrap was taken as out of sequence, not as a duplicate");
        } else if got.iter().any(|g| {
            matches!(
                g.resp,
                Resp::Ack {
                    syn: Syndrome::Ack(_),
                    ..
                }
            )
        }) {
            o.did("treated as a duplicate (re-ACKed)");
        } else {
            o.fail("the duplicate across the wrap was not acknowledged");
        }
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_far_ahead(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let p = c.psn();
    let far = Psn::new(p).add(0x40_0000).get();
    let Some(pkt) = valid(c, far) else {
        return no_valid();
    };
    c.send(&mut o, &[pkt]);
    let got = c.until(|g| !g.is_empty());
    c.note_all(&mut o, &got);
    let n = naks(&got);
    match n.as_slice() {
        [g] if g.is_nak(NakCode::PsnSequenceError) => match g.resp {
            Resp::Ack { psn, .. } if psn == p => {
                o.did("one PSN sequence error NAK naming the expected PSN")
            }
            Resp::Ack { psn, .. } => o.fail(format!("the NAK names PSN {psn:#08x}, not {p:#08x}")),
            _ => {}
        },
        [] if got.is_empty() => o.fail("no PSN sequence error NAK for a PSN 2^22 ahead"),
        [] => o.fail("a request 2^22 PSNs ahead was answered as if valid"),
        _ => o.fail("NAKs other than exactly one sequence error"),
    }
    o.did("then the expected PSN:");
    c.end_usable(&mut o);
    o.done()
}

fn t_stale_dup(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(m0) = one_valid(c, &mut o) else {
        c.end_unknown();
        return o.done();
    };
    let n0 = if c.info.recv_count != RecvCount::None && kind(c) == Some(Kind::Send) {
        c.recv_count(&mut o)
    } else {
        None
    };
    let p = c.psn();
    let old = Psn::new(p).sub(0x40_0000).get();
    let Some(pkt) = valid(c, old) else {
        return no_valid();
    };
    o.did("a request 2^22 PSNs behind (in the duplicate region, never sent):");
    c.send(&mut o, &[pkt]);
    let got = c.listen(c.timeout);
    c.note_all(&mut o, &got);
    for g in &got {
        match g.resp {
            Resp::Ack {
                syn: Syndrome::Ack(_),
                msn,
                ..
            } if msn == m0 => o.did("re-ACKed as a duplicate without counting a message"),
            Resp::Ack {
                syn: Syndrome::Ack(_),
                msn,
                ..
            } => o.fail(format!(
                "acknowledged with MSN {msn} (was {m0}): it was executed"
            )),
            Resp::Ack { syn, .. } => o.fail(format!("a duplicate drew {syn}")),
            Resp::Read { .. } | Resp::Atomic { .. } => {
                o.fail("a READ/ATOMIC response for a PSN never requested")
            }
            _ => {}
        }
    }
    if let Some(n0) = n0 {
        match c.recv_count(&mut o) {
            Some(n) if n == n0 => o.did("no receive completed"),
            Some(n) => o.fail(format!("{} receive(s) completed for it", n - n0)),
            None => {}
        }
    }
    c.end_usable(&mut o);
    if let (Some(m), true) = (msn(c), !o.failed()) {
        if m != (m0 + 1) & 0xff_ffff {
            o.fail(format!(
                "after the probe the MSN is {m}, expected {}",
                (m0 + 1) & 0xff_ffff
            ));
        }
    }
    o.done()
}

// ---------------------------------------------------------------------------------------
// opcode sequence

fn t_missing_first(c: &mut Ctx, k: Kind, which: &str) -> Outcome {
    let mut o = Obs::new();
    let p = c.psn();
    let m = mtu(c);
    let len = if which == "middle" { m } else { 8 };
    let pkt = part(c, k, which, p, len, 0).ack();
    fatal(c, &mut o, vec![pkt], p, NakCode::InvalidRequest);
    o.done()
}

fn t_send_middle_first(c: &mut Ctx) -> Outcome {
    t_missing_first(c, Kind::Send, "middle")
}
fn t_send_last_first(c: &mut Ctx) -> Outcome {
    t_missing_first(c, Kind::Send, "last")
}
fn t_write_middle_first(c: &mut Ctx) -> Outcome {
    t_missing_first(c, Kind::Write, "middle")
}

/// FIRST at `p`, then `second` at `p + 1`: the second must draw an invalid request NAK.
fn t_inside(c: &mut Ctx, second: fn(&Ctx, Kind, u32, usize) -> Pkt) -> Outcome {
    let mut o = Obs::new();
    let Some(k) = kind(c) else { return no_valid() };
    let p = c.psn();
    let m = mtu(c);
    let first = part(c, k, "first", p, m, (3 * m) as u32);
    c.send(&mut o, &[first]);
    let got = c.listen(c.timeout / 4);
    c.note_all(&mut o, &got);
    if !naks(&got).is_empty() {
        o.unsure("the FIRST packet itself was NAKed");
        c.end_unknown();
        return o.done();
    }
    c.take(1);
    let q = Psn::new(p).next().get();
    let pkt = second(c, k, q, m).ack();
    fatal(c, &mut o, vec![pkt], q, NakCode::InvalidRequest);
    o.done()
}

fn t_first_in_message(c: &mut Ctx) -> Outcome {
    t_inside(c, |c, k, q, m| part(c, k, "first", q, m, (3 * m) as u32))
}
fn t_only_in_message(c: &mut Ctx) -> Outcome {
    t_inside(c, |c, k, q, _| part(c, k, "only", q, 8, 8))
}
fn t_write_in_send(c: &mut Ctx) -> Outcome {
    if kind(c) != Some(Kind::Send) {
        return Outcome::not_applicable("needs a SEND in progress (receives posted)");
    }
    t_inside(c, |c, _, q, m| part(c, Kind::Write, "middle", q, m, 0))
}
fn t_read_in_message(c: &mut Ctx) -> Outcome {
    t_inside(c, |c, _, q, _| {
        let r = c.info.region.map(|r| (r.va, r.rkey)).unwrap_or((0, 0));
        Pkt::read(q, r.0, r.1, 8)
    })
}

// ---------------------------------------------------------------------------------------
// lengths

fn t_reth_longer(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(r) = c.region() else {
        return no_valid();
    };
    let p = c.psn();
    let pkt = Pkt::write_only(p, r.va, r.rkey, &[7; 32]).reth(r.va, r.rkey, 64);
    fatal(c, &mut o, vec![pkt], p, NakCode::InvalidRequest);
    o.done()
}

fn t_reth_shorter(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(r) = c.region() else {
        return no_valid();
    };
    let p = c.psn();
    let pkt = Pkt::write_only(p, r.va, r.rkey, &[7; 32]).reth(r.va, r.rkey, 16);
    fatal(c, &mut o, vec![pkt], p, NakCode::InvalidRequest);
    o.done()
}

fn t_write_total_short(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let p = c.psn();
    let m = mtu(c);
    let first = part(c, Kind::Write, "first", p, m, (3 * m) as u32);
    c.send(&mut o, &[first]);
    let got = c.listen(c.timeout / 4);
    c.note_all(&mut o, &got);
    if !naks(&got).is_empty() {
        o.unsure("the WRITE FIRST itself was NAKed");
        c.end_unknown();
        return o.done();
    }
    c.take(1);
    let q = Psn::new(p).next().get();
    let last = part(c, Kind::Write, "last", q, m, 0).ack();
    o.did("the LAST packet ends the message one MTU short of the RETH's length:");
    fatal(c, &mut o, vec![last], q, NakCode::InvalidRequest);
    o.done()
}

fn t_above_mtu(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(k) = kind(c) else { return no_valid() };
    let p = c.psn();
    let n = mtu(c) + 4;
    let pkt = part(c, k, "only", p, n, n as u32).ack();
    fatal(c, &mut o, vec![pkt], p, NakCode::InvalidRequest);
    o.done()
}

fn t_first_short(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(k) = kind(c) else { return no_valid() };
    let p = c.psn();
    let m = mtu(c);
    let pkt = part(c, k, "first", p, m / 2, (2 * m) as u32).ack();
    fatal(c, &mut o, vec![pkt], p, NakCode::InvalidRequest);
    o.done()
}

fn t_middle_short(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(k) = kind(c) else { return no_valid() };
    let p = c.psn();
    let m = mtu(c);
    c.send(&mut o, &[part(c, k, "first", p, m, (3 * m) as u32)]);
    let got = c.listen(c.timeout / 4);
    c.note_all(&mut o, &got);
    if !naks(&got).is_empty() {
        o.unsure("the FIRST packet itself was NAKed");
        c.end_unknown();
        return o.done();
    }
    c.take(1);
    let q = Psn::new(p).next().get();
    let pkt = part(c, k, "middle", q, m - 4, 0).ack();
    fatal(c, &mut o, vec![pkt], q, NakCode::InvalidRequest);
    o.done()
}

fn t_pad_mismatch(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(r) = c.region() else {
        return no_valid();
    };
    let p = c.psn();
    // Eight bytes with pad count 3: the payload is 5 bytes, the RETH says 8.
    let pkt = Pkt::write_only(p, r.va, r.rkey, &[9; 8]).pad(3);
    fatal(c, &mut o, vec![pkt], p, NakCode::InvalidRequest);
    o.done()
}

fn t_zero_write(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let p = c.psn();
    let pkt = Pkt::write_only(p, 0, 0xdead_beef, &[]);
    o.did("R_Key 0xdeadbeef and VA 0: a zero-length WRITE names no memory");
    c.send(&mut o, &[pkt]);
    let got = c.answer(p, 1);
    c.note_all(&mut o, &got);
    match ack_at(&got, p) {
        Some(_) if naks(&got).is_empty() => {
            c.take(1);
            o.did("acknowledged without an R_Key check")
        }
        _ => {
            o.fail("a zero-length WRITE with an arbitrary R_Key was not simply acknowledged");
            c.end_unknown();
            return o.done();
        }
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_zero_read(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let p = c.psn();
    c.send(&mut o, &[Pkt::read(p, 0, 0xdead_beef, 0)]);
    o.did("R_Key 0xdeadbeef and VA 0: a zero-length READ names no memory");
    let got = c.answer(p, 1);
    c.note_all(&mut o, &got);
    let ok = got.iter().any(|g| {
        matches!(&g.resp, Resp::Read { psn, opcode, data, .. }
            if *psn == p && *opcode == Opcode::RC_READ_RESPONSE_ONLY && data.is_empty())
    });
    if ok && naks(&got).is_empty() {
        c.take(1);
        o.did("answered with one empty READ RESPONSE ONLY");
    } else {
        o.fail("a zero-length READ was not answered with one empty READ RESPONSE ONLY");
        c.end_unknown();
        return o.done();
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_read_too_long(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(r) = c.region() else {
        return no_valid();
    };
    let p = c.psn();
    let pkt = Pkt::read(p, r.va, r.rkey, 0x8000_0001);
    fatal(c, &mut o, vec![pkt], p, NakCode::InvalidRequest);
    o.done()
}

// ---------------------------------------------------------------------------------------
// keys and rights

fn bad_rkey(r: Region) -> u32 {
    // Flip bits in both the index and the key byte of the announced key.
    r.rkey ^ 0x5a5a_5a5a
}

fn t_rkey_write(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(r) = c.region() else {
        return no_valid();
    };
    let p = c.psn();
    let pkt = Pkt::write_only(p, r.va, bad_rkey(r), &[1; 8]);
    fatal(c, &mut o, vec![pkt], p, NakCode::RemoteAccessError);
    o.done()
}
fn t_rkey_read(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(r) = c.region() else {
        return no_valid();
    };
    let p = c.psn();
    fatal(
        c,
        &mut o,
        vec![Pkt::read(p, r.va, bad_rkey(r), 8)],
        p,
        NakCode::RemoteAccessError,
    );
    o.done()
}
fn t_rkey_atomic(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(r) = c.region() else {
        return no_valid();
    };
    let p = c.psn();
    fatal(
        c,
        &mut o,
        vec![Pkt::fetch_add(p, r.va, bad_rkey(r), 1)],
        p,
        NakCode::RemoteAccessError,
    );
    o.done()
}

/// A request with `va`/`len` outside the region, through the operation `op`.
fn oob(c: &mut Ctx, op: &str, va: fn(Region) -> u64, len: u32) -> Outcome {
    let mut o = Obs::new();
    let Some(r) = c.region() else {
        return no_valid();
    };
    let p = c.psn();
    let a = va(r);
    let pkt = match op {
        "write" => Pkt::write_only(p, a, r.rkey, &vec![2u8; len as usize]),
        "read" => Pkt::read(p, a, r.rkey, len),
        _ => Pkt::fetch_add(p, a, r.rkey, 1),
    };
    fatal(c, &mut o, vec![pkt], p, NakCode::RemoteAccessError);
    o.done()
}

fn t_oob_write(c: &mut Ctx) -> Outcome {
    if c.info.tool == PeerTool::Ferroce {
        // Straddles the start of the region (the ferroce peer gives the region's start).
        oob(c, "write", |r| r.va.wrapping_sub(8), 16)
    } else {
        // perftest gives an address inside its buffer (after the first QP's part), not the
        // region's start: only an address far beyond it is certainly outside.
        oob(c, "write", |r| r.va.wrapping_add(1 << 40), 16)
    }
}
fn t_oob_read(c: &mut Ctx) -> Outcome {
    // Far beyond its end.
    oob(c, "read", |r| r.va.wrapping_add(1 << 40), 8)
}
fn t_oob_atomic(c: &mut Ctx) -> Outcome {
    oob(c, "atomic", |r| r.va.wrapping_add(1 << 40), 8)
}
fn t_va_overflow(c: &mut Ctx) -> Outcome {
    let op = if c.info.qp_rights.read && c.region().is_some_and(|r| r.rights.read) {
        "read"
    } else {
        "write"
    };
    oob(c, op, |_| 0xffff_ffff_ffff_fff0, 64)
}

/// An operation through a key that lacks its right (the QP allows the operation).
fn lacking(c: &mut Ctx, which: usize, op: &str) -> Outcome {
    let mut o = Obs::new();
    let r = match (c.info.lacking, which) {
        (Some(l), _) => l[which],
        // ib_send_bw: its buffer's R_Key has no remote rights at all.
        (None, _) => match c.region() {
            Some(r) => r,
            None => return no_valid(),
        },
    };
    let p = c.psn();
    let pkt = match op {
        "write" => Pkt::write_only(p, r.va, r.rkey, &[3; 8]),
        "read" => Pkt::read(p, r.va, r.rkey, 8),
        _ => Pkt::fetch_add(p, r.va, r.rkey, 1),
    };
    o.did(format!(
        "R_Key {:#010x} lacks the remote {op} right",
        r.rkey
    ));
    fatal(c, &mut o, vec![pkt], p, NakCode::RemoteAccessError);
    o.done()
}
fn t_no_read_right(c: &mut Ctx) -> Outcome {
    lacking(c, 0, "read")
}
fn t_no_write_right(c: &mut Ctx) -> Outcome {
    lacking(c, 1, "write")
}
fn t_no_atomic_right(c: &mut Ctx) -> Outcome {
    lacking(c, 2, "atomic")
}

/// An operation the QP is not enabled for.
fn qp_disabled(c: &mut Ctx, op: &str) -> Outcome {
    let mut o = Obs::new();
    let (va, rkey) = c
        .region()
        .map(|r| (r.va, r.rkey))
        .unwrap_or((0x1000, 0x1234));
    let p = c.psn();
    let pkt = match op {
        "write" => Pkt::write_only(p, va, rkey, &[4; 8]),
        "read" => Pkt::read(p, va, rkey, 8),
        _ => Pkt::fetch_add(p, va, rkey, 1),
    };
    o.did(format!("the QP's access flags do not enable remote {op}"));
    fatal(c, &mut o, vec![pkt], p, NakCode::InvalidRequest);
    o.done()
}
fn t_qp_no_write(c: &mut Ctx) -> Outcome {
    qp_disabled(c, "write")
}
fn t_qp_no_read(c: &mut Ctx) -> Outcome {
    qp_disabled(c, "read")
}
fn t_qp_no_atomic(c: &mut Ctx) -> Outcome {
    qp_disabled(c, "atomic")
}

fn t_misaligned_atomic(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(r) = c.region() else {
        return no_valid();
    };
    let p = c.psn();
    fatal(
        c,
        &mut o,
        vec![Pkt::fetch_add(p, r.va + 4, r.rkey, 1)],
        p,
        NakCode::InvalidRequest,
    );
    o.done()
}

// ---------------------------------------------------------------------------------------
// resources

fn t_rnr(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let p = c.psn();
    c.send(&mut o, &[Pkt::send_only(p, b"nobody receives")]);
    let got = c.answer(p, 1);
    c.note_all(&mut o, &got);
    let want = c.info.min_rnr_timer;
    match got.iter().find_map(|g| match g.resp {
        Resp::Ack { psn, syn, .. } => Some((psn, syn)),
        _ => None,
    }) {
        Some((q, Syndrome::RnrNak(t))) if q == p && t.code() == want => o.did(format!(
            "RNR NAK for PSN {p:#08x} with timer code {want} ({} us), the negotiated min_rnr_timer",
            t.as_micros()
        )),
        Some((q, Syndrome::RnrNak(t))) if q == p => o.fail(format!(
            "RNR NAK with timer code {}, not the negotiated {want}",
            t.code()
        )),
        Some((q, s)) => o.fail(format!(
            "answered {s} for PSN {q:#08x}, not an RNR NAK for {p:#08x}"
        )),
        None => o.fail("no RNR NAK for a SEND with no receive posted"),
    }
    // RNR is not an error: the PSN is still expected and the QP works.
    c.end_usable(&mut o);
    o.done()
}

/// How many times `too_many` sends its burst before it gives up on reaching the limit.
const TOO_MANY_ATTEMPTS: u32 = 8;

/// The MSN a response carries (READ response with an AETH, ATOMIC ACK, ACK).
fn resp_msn(g: &Got) -> Option<u32> {
    match g.resp {
        Resp::Read {
            aeth: Some((_, m)), ..
        }
        | Resp::Atomic { msn: m, .. }
        | Resp::Ack { msn: m, .. } => Some(m),
        _ => None,
    }
}

/// The responder-resource limit (IBTA 9.9.3, class C: "too many RDMA READ or ATOMIC
/// requests", more requests received and not yet answered than the connection allows).
///
/// Whether the peer ever holds more than `max_dest_rd_atomic` unanswered requests depends on
/// its scheduling, not only on what the tester sends: a responder that has sent the answer
/// to request 0 before it takes request N has only N-1 unanswered, and executing request N
/// is then right. So one burst of N+1 decides only when it reached the limit:
/// - a NAK INV_REQ for request N: the peer was at the limit and refused (pass);
/// - request N executed, and the first response carries the MSN of the last (the peer had
///   taken all N+1 requests, the N+1st counted as a message, before it sent the answer to
///   the first: N+1 received and unanswered at once): fail, with that proof;
/// - request N executed, the first response sent before the last was taken (a lower MSN,
///   or one the peer fixes when it executes): the limit was not reached. The QP is still
///   fine; the burst is sent again, up to `TOO_MANY_ATTEMPTS` times, then inconclusive.
fn too_many(c: &mut Ctx, atomic: bool) -> Outcome {
    let mut o = Obs::new();
    let Some(r) = c.region() else {
        return no_valid();
    };
    let n = c.info.max_dest_rd_atomic;
    if n > 256 {
        return Outcome::inconclusive(format!(
            "the peer offers {n} responder resources; too many to exhaust"
        ));
    }
    let what = if atomic { "FETCH_AND_ADD" } else { "READ" };
    let mut under = Vec::new();
    for attempt in 1..=TOO_MANY_ATTEMPTS {
        let p = c.psn();
        let m_before = c.st.msn;
        let pkts: Vec<Pkt> = (0..=n)
            .map(|i| {
                let q = Psn::new(p).add(i).get();
                let va = r.va + 8 * u64::from(i % 8);
                if atomic {
                    Pkt::fetch_add(q, va, r.rkey, 0)
                } else {
                    Pkt::read(q, va, r.rkey, 8)
                }
            })
            .collect();
        if attempt == 1 {
            o.did(format!(
                "{} {what} requests back to back; the peer offers max_dest_rd_atomic {n}",
                n + 1
            ));
            c.send(&mut o, &pkts);
        } else {
            // The sends of a repeated burst are not listed again; the capture has them.
            let mut quiet = Obs::new();
            c.send(&mut quiet, &pkts);
            for u in quiet.done().why {
                o.unsure(u);
            }
        }
        if c.io_error.is_some() {
            return o.done();
        }
        let excess = Psn::new(p).add(n).get();
        let got = c.until(|g| {
            g.iter().any(|g| match g.resp {
                Resp::Ack { psn, .. } | Resp::Atomic { psn, .. } | Resp::Read { psn, .. } => {
                    psn == excess || g.is_nak(NakCode::InvalidRequest)
                }
                _ => false,
            })
        });
        let answer = |q: u32| {
            got.iter().find(|g| {
                matches!(g.resp, Resp::Atomic { psn, syn: Syndrome::Ack(_), .. }
                    | Resp::Read { psn, .. } if psn == q)
            })
        };
        let nak = got.iter().find(|g| g.is_nak(NakCode::InvalidRequest));
        let decided = nak.is_some() || answer(excess).is_none() || attempt == TOO_MANY_ATTEMPTS;
        let (first, last) = (
            answer(p).and_then(resp_msn),
            answer(excess).and_then(resp_msn),
        );
        let held = first.is_some() && first == last && last != m_before;
        if decided || held {
            if attempt > 1 {
                o.did(format!(
                    "burst {attempt} of {TOO_MANY_ATTEMPTS}, PSN {p:#08x}.."
                ));
            }
            let shown: Vec<Got> = got.iter().take(4).cloned().collect();
            c.note_all(&mut o, &shown);
            if got.len() > 4 {
                o.did(format!("... {} responses in all", got.len()));
            }
        }
        match nak.map(|g| &g.resp) {
            Some(Resp::Ack { psn, .. }) if *psn == excess => o.did(format!(
                "invalid request NAK for the request beyond the limit (PSN {excess:#08x})"
            )),
            Some(Resp::Ack { psn, .. }) => o.fail(format!(
                "invalid request NAK for PSN {psn:#08x}, not for the excess request at {excess:#08x}"
            )),
            _ if held => o.fail(format!(
                "all {} requests were executed: the one beyond the negotiated {n} was not refused, although the peer had taken it before it answered the first (the first response carries MSN {}, that of the last)",
                n + 1,
                first.unwrap_or_default()
            )),
            _ if answer(excess).is_some() => {
                under.push(format!(
                    "burst {attempt}: MSN {} in the first response, {} in the last",
                    first.map_or("none".into(), |m| m.to_string()),
                    last.map_or("none".into(), |m| m.to_string())
                ));
                c.st.next_psn = Psn::new(excess).next().get();
                if attempt < TOO_MANY_ATTEMPTS {
                    continue;
                }
                o.did(format!("the bursts' MSNs: {}", under.join("; ")));
                o.unsure(format!(
                    "the peer executed all {} requests in each of {TOO_MANY_ATTEMPTS} bursts, and in none do its responses show that it held more than {n} unanswered (the first response's MSN below the last's: it answered the first before it took the last, or it fixes the MSN at execution): the test cannot tell whether the limit was reached",
                    n + 1
                ));
                c.end_usable(&mut o);
                return o.done();
            }
            _ => o.fail("neither executed nor refused the request beyond the limit"),
        }
        for i in 0..n {
            if answer(Psn::new(p).add(i).get()).is_none() {
                o.unsure(format!("request {i} within the limit was not answered"));
                break;
            }
        }
        if !under.is_empty() {
            o.did(format!(
                "earlier bursts did not reach the limit ({})",
                under.join("; ")
            ));
        }
        c.st.next_psn = excess;
        c.end_error_state(&mut o);
        return o.done();
    }
    o.done()
}
fn t_too_many_reads(c: &mut Ctx) -> Outcome {
    too_many(c, false)
}
fn t_too_many_atomics(c: &mut Ctx) -> Outcome {
    too_many(c, true)
}

// ---------------------------------------------------------------------------------------
// silent drops

fn drop_with(c: &mut Ctx, f: fn(&Ctx, Pkt) -> Pkt) -> Outcome {
    let mut o = Obs::new();
    let p = c.psn();
    let Some(v) = valid(c, p) else {
        return no_valid();
    };
    let bad = f(c, v);
    silent_drop(c, &mut o, bad);
    o.done()
}

fn t_bad_icrc(c: &mut Ctx) -> Outcome {
    drop_with(c, |_, p| p.corrupt_icrc())
}
fn t_unknown_qpn(c: &mut Ctx) -> Outcome {
    drop_with(c, |c, p| p.to_qp(c.info.qpn ^ 0x00a5_5a00))
}
fn t_qp0(c: &mut Ctx) -> Outcome {
    drop_with(c, |_, p| p.to_qp(0))
}
fn t_wrong_pkey(c: &mut Ctx) -> Outcome {
    drop_with(c, |_, p| p.pkey(0x8123))
}
fn t_wrong_dst_ip(c: &mut Ctx) -> Outcome {
    drop_with(c, |c, mut p| {
        p.dst_ip = Some(other_ip(c.ep.peer_ip));
        p
    })
}
fn t_wrong_src_ip(c: &mut Ctx) -> Outcome {
    drop_with(c, |c, mut p| {
        p.src_ip = Some(other_ip(c.ep.our_ip));
        p
    })
}
fn t_uc_opcode(c: &mut Ctx) -> Outcome {
    drop_with(c, |_, p| {
        let mut q = Pkt::new(Opcode::UC_SEND_ONLY, p.psn, b"a UC SEND to an RC QP").ack();
        q.dest_qp = p.dest_qp;
        q
    })
}
fn t_bad_tver(c: &mut Ctx) -> Outcome {
    drop_with(c, |_, mut p| {
        p.tver = 1;
        p
    })
}

/// An address in the same subnet that is not `a` (its last bit flipped, then more).
fn other_ip(a: std::net::IpAddr) -> std::net::IpAddr {
    match a {
        std::net::IpAddr::V4(v) => {
            let mut o = v.octets();
            o[3] ^= 0x80;
            if o[3] == 0 || o[3] == 255 {
                o[3] ^= 0x41;
            }
            std::net::IpAddr::V4(o.into())
        }
        std::net::IpAddr::V6(v) => {
            let mut o = v.octets();
            o[15] ^= 0x80;
            std::net::IpAddr::V6(o.into())
        }
    }
}

// ---------------------------------------------------------------------------------------
// ACKs

fn t_ackreq(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let p = c.psn();
    let Some(v) = valid(c, p) else {
        return no_valid();
    };
    if v.opcode == Opcode::RC_READ_REQUEST || v.opcode == Opcode::RC_FETCH_ADD {
        return Outcome::not_applicable("READ and ATOMIC requests are answered by their responses");
    }
    c.send(&mut o, &[v]);
    let got = c.answer(p, 1);
    c.note_all(&mut o, &got);
    if ack_at(&got, p).is_some() {
        c.take(1);
        o.did("acknowledged");
    } else {
        o.fail(format!("no ACK for PSN {p:#08x} though AckReq was set"));
        c.end_unknown();
        return o.done();
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_ackreq_mid(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(k) = kind(c) else { return no_valid() };
    let p = c.psn();
    let m = mtu(c);
    let m0 = msn(c);
    c.send(&mut o, &[part(c, k, "first", p, m, (2 * m) as u32).ack()]);
    let got = c.answer(p, 1);
    c.note_all(&mut o, &got);
    let first = got.iter().find_map(|g| match g.resp {
        Resp::Ack {
            psn,
            syn: Syndrome::Ack(_),
            msn,
        } if psn == p => Some(msn),
        _ => None,
    });
    let Some(mf) = first else {
        o.fail("a FIRST packet with AckReq set was not acknowledged");
        c.end_unknown();
        return o.done();
    };
    c.take(1);
    if m0.is_some_and(|x| x != mf) {
        o.fail(format!(
            "the ACK of an unfinished message carries MSN {mf} (was {}): no message completed",
            m0.unwrap_or(0)
        ));
    }
    let q = Psn::new(p).next().get();
    c.send(&mut o, &[part(c, k, "last", q, m, 0).ack()]);
    let got = c.answer(q, 1);
    c.note_all(&mut o, &got);
    match got.iter().find_map(|g| match g.resp {
        Resp::Ack {
            psn,
            syn: Syndrome::Ack(_),
            msn,
        } if psn == q => Some(msn),
        _ => None,
    }) {
        Some(ml) if ml == (mf + 1) & 0xff_ffff => {
            c.take(1);
            o.did(format!(
                "MSN {mf} after the FIRST, {ml} after the LAST: one message"
            ))
        }
        Some(ml) => {
            c.take(1);
            o.fail(format!(
                "MSN {ml} after the LAST, expected {}",
                (mf + 1) & 0xff_ffff
            ))
        }
        None => {
            o.fail("the LAST packet was not acknowledged");
            c.end_unknown();
            return o.done();
        }
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_coalesced(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(m0) = one_valid(c, &mut o) else {
        c.end_unknown();
        return o.done();
    };
    let p = c.psn();
    let n = 8u32;
    let mut pkts = Vec::new();
    for i in 0..n {
        let Some(v) = valid(c, Psn::new(p).add(i).get()) else {
            return no_valid();
        };
        if v.opcode == Opcode::RC_READ_REQUEST || v.opcode == Opcode::RC_FETCH_ADD {
            return Outcome::not_applicable("READ and ATOMIC requests are answered one by one");
        }
        pkts.push(if i + 1 == n { v } else { v.no_ack() });
    }
    o.did("eight requests, AckReq only on the last:");
    c.send(&mut o, &pkts);
    let last = Psn::new(p).add(n - 1).get();
    let got = c.answer(last, 1);
    c.note_all(&mut o, &got);
    let mut prev = -1i32;
    for g in &got {
        if let Resp::Ack { psn, syn, msn } = g.resp {
            let d = Psn::new(psn).diff(Psn::new(p));
            if !syn.is_ack() {
                o.fail(format!("{syn} among the ACKs"));
            } else if !(0..n as i32).contains(&d) {
                o.fail(format!("ACK for PSN {psn:#08x}, outside the requests sent"));
            } else if d < prev {
                o.fail("ACK PSNs went backwards");
            } else {
                // An ACK for PSN p+d says d+1 messages completed.
                let want = (m0 + 1 + d as u32) & 0xff_ffff;
                if msn != want {
                    o.fail(format!(
                        "ACK for PSN {psn:#08x} carries MSN {msn}, expected {want}"
                    ));
                }
                prev = d;
            }
        }
    }
    if prev == n as i32 - 1 {
        c.take(n);
        o.did("the last ACK covers every PSN, MSN counting each message once");
    } else {
        o.fail("the ACKs do not cover the last PSN");
        c.end_unknown();
        return o.done();
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_credits(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let p = c.psn();
    c.send(&mut o, &[Pkt::send_only(p, b"credit check....")]);
    let got = c.answer(p, 1);
    c.note_all(&mut o, &got);
    let Some(g) = ack_at(&got, p) else {
        o.fail("the SEND was not acknowledged");
        c.end_unknown();
        return o.done();
    };
    c.take(1);
    if let Resp::Ack {
        syn: Syndrome::Ack(cc),
        ..
    } = g.resp
    {
        match (cc.credits(), c.info.recvs) {
            (None, _) => o.unsure(
                "the ACK says credits are not tracked (11111b); with its own receive queue (no SRQ) the peer could report them; this test does not decide whether it must",
            ),
            (Some(0), Some(n)) if n > 1 => o.fail(format!(
                "the ACK advertises 0 credits though {} receive(s) were posted and one was consumed",
                n
            )),
            (Some(k), Some(n)) if k > n => o.fail(format!(
                "the ACK advertises {k} credits but only {n} receives were posted"
            )),
            (Some(k), _) => o.did(format!("{k} credits advertised, consistent with the posted receives")),
        }
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_ghost_ack(c: &mut Ctx) -> Outcome {
    if c.tool().is_client() {
        return t_ghost_ack_client(c);
    }
    let mut o = Obs::new();
    c.st.peer.auto_ack = false;
    let before = c.st.peer.packets;
    // Make the peer send us a message.
    let sent0 = match c.control.as_mut() {
        Some(ctl) => {
            if let Err(e) = ctl.post_send(32) {
                return Outcome::inconclusive(e);
            }
            o.did("asked the ferroce peer to SEND 32 bytes");
            ctl.send_completions().map(|x| x.0).unwrap_or(0)
        }
        None => {
            // ibv_rc_pingpong answers every message with one.
            let p = c.psn();
            c.send(&mut o, &[Pkt::send_only(p, b"please answer...")]);
            let got = c.answer(p, 1);
            c.note_all(&mut o, &got);
            if ack_at(&got, p).is_none() {
                c.release_held();
                o.fail("our SEND was not acknowledged");
                c.end_unknown();
                return o.done();
            }
            c.take(1);
            0
        }
    };
    // The message is a response the test needs: waited for up to the response wait.
    let t0 = Instant::now();
    let patience = c.wait.max(c.timeout * 2);
    while c.st.peer.packets == before && t0.elapsed() < patience {
        let _ = c.collect(c.timeout / 10, Duration::ZERO, |_| false);
    }
    let Some(first) = c.st.peer.held.first().cloned() else {
        c.release_held();
        return Outcome::inconclusive("the peer sent nothing to acknowledge");
    };
    let q = first.psn();
    o.did(format!("the peer's request: {}", first.line));
    let ghost_psn = Psn::new(q).add(16).get();
    let msn = c.st.peer.msn;
    c.send(
        &mut o,
        &[Pkt::ack_to_peer(
            ghost_psn,
            Syndrome::Ack(crate::wire::CreditCode::from_count(64)),
            (msn + 17) & 0xff_ffff,
        )],
    );
    o.did("a ghost ACK for a PSN the peer never sent; the peer must ignore it");
    // Give the peer time to act on it; a conformant peer completes nothing.
    let _ = c.listen(c.timeout);
    let wrongly = match c.control.as_mut() {
        Some(ctl) => match ctl.send_completions() {
            Ok((ok, err)) => Some((
                ok > sent0 || err > 0,
                format!("{ok} completed, {err} with errors"),
            )),
            Err(e) => {
                o.unsure(e);
                None
            }
        },
        None => {
            // pingpong: a second SEND from the peer (next PSN) would mean it completed the
            // first on the ghost ACK; we also gave it a new receive above, so it is waiting
            // only for its send completion.
            let next = Psn::new(q).add(1).get();
            let early = c.st.peer.held.iter().any(|r| {
                let d = Psn::new(r.psn()).diff(Psn::new(next));
                d >= 0
                    && r.opcode().is(crate::wire::OpFlags::SEND)
                    && (r.opcode().is(crate::wire::OpFlags::FIRST))
            });
            Some((
                early,
                if early {
                    "the peer started its next message".into()
                } else {
                    "the peer only retransmitted (or waited)".into()
                },
            ))
        }
    };
    if let Some((bad, what)) = wrongly {
        if bad {
            o.fail(format!("the peer acted on the ghost ACK: {what}"));
        } else {
            o.did(format!("ghost ACK ignored: {what}"));
        }
    }
    o.did("now the real acknowledgement:");
    c.release_held();
    let _ = c.listen(c.timeout / 2);
    if c.control.is_some() {
        match send_completed(c, sent0) {
            Ok((ok, 0)) if ok > sent0 => o.did("the peer's SEND completed after the real ACK"),
            Ok((ok, err)) => o.fail(format!(
                "after the real ACK: {ok} sends completed, {err} with errors"
            )),
            Err(e) => o.unsure(e),
        }
    }
    c.end_usable(&mut o);
    o.done()
}

/// The ferroce peer's send completions (successful, with errors), asked again until more
/// than `sent0` succeeded or one failed, or the response wait passed: a completion the rule
/// requires is waited for as a response is, never judged on one look.
fn send_completed(c: &mut Ctx, sent0: u64) -> Result<(u64, u64), String> {
    let t0 = Instant::now();
    loop {
        let Some(ctl) = c.control.as_mut() else {
            return Err("no control channel".into());
        };
        let (ok, err) = ctl.send_completions().map_err(|e| e.to_string())?;
        if ok > sent0 || err > 0 || t0.elapsed() >= c.wait.max(c.timeout) {
            return Ok((ok, err));
        }
        let _ = c.listen(c.timeout / 10);
    }
}

fn t_unsolicited(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let q = c.st.peer.epsn;
    let before = Psn::new(q).sub(1).get();
    let m = c.st.peer.msn;
    let cc = Syndrome::Ack(crate::wire::CreditCode::from_count(64));
    o.did("ACK, sequence error NAK and invalid request NAK for PSNs the peer has nothing outstanding at:");
    c.send(
        &mut o,
        &[
            Pkt::ack_to_peer(before, cc, m),
            Pkt::ack_to_peer(
                Psn::new(q).add(100).get(),
                Syndrome::Nak(NakCode::PsnSequenceError),
                m,
            ),
            Pkt::ack_to_peer(
                Psn::new(q).add(200).get(),
                Syndrome::Nak(NakCode::InvalidRequest),
                m,
            ),
        ],
    );
    let got = c.listen(c.timeout);
    let reqs = c.st.peer.packets;
    c.note_all(&mut o, &got);
    if let Some(ctl) = c.control.as_mut() {
        match ctl.send_completions() {
            Ok((_, 0)) => o.did("no send completion with an error"),
            Ok((_, e)) => o.fail(format!("{e} send completion(s) with an error")),
            Err(e) => o.unsure(e),
        }
        match ctl.state() {
            Ok(s) if s == "RTS" => o.did("the peer's QP is still in RTS"),
            Ok(s) => o.fail(format!("the peer's QP moved to {s}")),
            Err(e) => o.unsure(e),
        }
    }
    let _ = reqs;
    c.end_usable(&mut o);
    o.done()
}

// ---------------------------------------------------------------------------------------
// the peer's requester: retry limits

/// Make the peer's requester send us one message with our automatic ACKs off (the ferroce
/// peer on request; `ibv_rc_pingpong` answers our SEND with its own). Returns the PSN of
/// its first packet, or the outcome when it sends nothing.
fn provoke_send(c: &mut Ctx, o: &mut Obs) -> Result<u32, Outcome> {
    c.st.peer.auto_ack = false;
    c.st.peer.held.clear();
    let client = c.tool().is_client();
    match c.control.as_mut() {
        Some(ctl) => {
            ctl.post_send(32).map_err(Outcome::inconclusive)?;
            o.did("asked the ferroce peer to SEND 32 bytes");
        }
        None if client => {
            o.did("withholding the answers to the perftest client's next requests");
        }
        None => {
            let p = c.psn();
            c.send(o, &[Pkt::send_only(p, b"please answer...")]);
            let got = c.answer(p, 1);
            c.note_all(o, &got);
            if ack_at(&got, p).is_none() {
                c.release_held();
                c.end_unknown();
                return Err(Outcome::inconclusive(
                    "our SEND (to draw the peer's own SEND) was not acknowledged",
                ));
            }
            c.take(1);
        }
    }
    // A request the tester asked for (or drew) is waited for as a response is: up to the
    // response wait, ending as soon as it is there.
    let t0 = Instant::now();
    let patience = c.wait.max(c.timeout * 2);
    while c.st.peer.held.is_empty() && t0.elapsed() < patience && c.io_error.is_none() {
        let _ = c.collect(c.timeout / 10, Duration::ZERO, |_| false);
    }
    match c.st.peer.held.first() {
        Some(r) => {
            o.did(format!("the peer's request: {}", r.line));
            Ok(r.psn())
        }
        None => {
            c.release_held();
            c.end_unknown();
            Err(Outcome::inconclusive(
                "the peer sent no request to the tester",
            ))
        }
    }
}

/// Count the peer's transmissions of its request at `q` (the first and every retry), sending
/// `answer(n)` back after the n-th, until more than `limit` were seen or none came for
/// `quiet`. The verdicts rest on this count, not on when the retries came. With the ferroce
/// peer the count ends on the peer's word, not on a quiet window: while it reports its SEND
/// not completed it is still retrying (a starved process can be slower than `quiet` between
/// two transmissions), and the count goes on for up to four response waits more; once it
/// reports the SEND completed, every transmission has left it, and the count takes in
/// those still on their way (one more `timeout` of listening) before it ends.
fn count_transmissions(
    c: &mut Ctx,
    q: u32,
    limit: u32,
    quiet: Duration,
    mut answer: impl FnMut(u32) -> Option<Pkt>,
) -> u32 {
    let mut seen = 0usize;
    let mut n = 0u32;
    let mut last = Instant::now();
    let mut next_ask = Instant::now();
    let mut drain_until: Option<Instant> = None;
    loop {
        let mut out = Vec::new();
        while seen < c.st.peer.held.len() {
            if c.st.peer.held[seen].psn() == q {
                n += 1;
                last = Instant::now();
                out.extend(answer(n));
            }
            seen += 1;
        }
        if !out.is_empty() {
            c.send(&mut Obs::new(), &out);
        }
        if n > limit || c.io_error.is_some() {
            return n;
        }
        if let Some(end) = drain_until {
            if Instant::now() >= end {
                return n;
            }
        } else if last.elapsed() >= quiet {
            if c.control.is_none() || last.elapsed() >= quiet + c.wait * 4 {
                return n;
            }
            if Instant::now() >= next_ask {
                next_ask = Instant::now() + Duration::from_millis(50);
                let still_trying = c
                    .control
                    .as_mut()
                    .is_some_and(|ctl| ctl.first_send_error().is_ok_and(|e| e == "none"));
                if !still_trying {
                    drain_until = Some(Instant::now() + c.timeout);
                }
            }
        }
        // Short waits: an answer held back longer than the peer's local ACK timeout would
        // draw a timeout retry on top of the one it answers.
        let _ = c.collect(Duration::from_millis(1), Duration::ZERO, |_| false);
    }
}

/// How long without a retry means the peer stopped retrying on its local ACK timeout:
/// twice the tester's timeout or eight ACK timeouts, plus one (generous: it only ends the
/// count; a starved tester must not miss a late retry).
fn retry_quiet(c: &Ctx, r: &RetrySettings) -> Duration {
    let ack = r.ack_timeout().unwrap_or(c.timeout);
    (c.timeout * 2).max(ack * 8) + ack
}

/// How long without a retry means the peer stopped answering our NAKs with retries (it
/// resends at once, or after the NAK's short RNR timer): twice the tester's timeout.
fn nak_quiet(c: &Ctx) -> Duration {
    c.timeout * 2
}

/// After the peer gave up: it must complete the WR with `status` (ferroce peer) and its QP
/// must be in the error state.
fn end_gave_up(c: &mut Ctx, o: &mut Obs, status: &str) {
    if let Some(ctl) = c.control.as_mut() {
        match ctl.first_send_error() {
            Ok(s) if s == status => o.did(format!("the peer's SEND completed with {s}")),
            Ok(s) => o.fail(format!("the peer's SEND completed with {s}, not {status}")),
            Err(e) => o.unsure(e),
        }
    }
    c.st.peer.held.clear();
    c.st.peer.auto_ack = true;
    c.end_error_state(o);
}

fn t_retry_exhausted(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(r) = c.info.retry else {
        return Outcome::inconclusive("the peer's retry settings are unknown");
    };
    let q = match provoke_send(c, &mut o) {
        Ok(q) => q,
        Err(out) => return out,
    };
    let limit = u32::from(r.retry_cnt) + 1;
    o.did(format!(
        "withholding every ACK: retry_cnt {} allows {limit} transmissions of PSN {q:#08x} (local ACK timeout code {})",
        r.retry_cnt, r.timeout
    ));
    let n = count_transmissions(c, q, limit, retry_quiet(c, &r), |_| None);
    if n > limit {
        o.fail(format!(
            "PSN {q:#08x} sent {n} times and still going: more than 1 + retry_cnt ({limit}); a retry count of 7 is seven retries (only an RNR retry count of 7 means without end)"
        ));
        c.release_held();
        c.end_unknown();
        return o.done();
    }
    if n < limit {
        o.fail(format!(
            "PSN {q:#08x} sent {n} times, then nothing: fewer than 1 + retry_cnt ({limit})"
        ));
    } else {
        o.did(format!(
            "PSN {q:#08x} sent {n} times (the first and retry_cnt {} retries), then nothing",
            r.retry_cnt
        ));
    }
    end_gave_up(c, &mut o, "RETRY_EXC_ERR");
    o.done()
}

fn t_nak_retry_exhausted(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(r) = c.info.retry else {
        return Outcome::inconclusive("the peer's retry settings are unknown");
    };
    let q = match provoke_send(c, &mut o) {
        Ok(q) => q,
        Err(out) => return out,
    };
    let limit = u32::from(r.retry_cnt) + 1;
    let msn = c.st.peer.msn;
    o.did(format!(
        "answering every transmission of PSN {q:#08x} with NAK PSN sequence error at {q:#08x}: retry_cnt {} allows {limit}",
        r.retry_cnt
    ));
    let nak = Pkt::ack_to_peer(q, Syndrome::Nak(NakCode::PsnSequenceError), msn);
    let n = count_transmissions(c, q, limit, nak_quiet(c), |_| Some(nak.clone()));
    if n > limit {
        o.fail(format!(
            "PSN {q:#08x} sent {n} times and still going: more than 1 + retry_cnt ({limit})"
        ));
        c.release_held();
        c.end_unknown();
        return o.done();
    }
    if n < limit {
        o.fail(format!(
            "PSN {q:#08x} sent {n} times, then nothing: fewer than 1 + retry_cnt ({limit})"
        ));
    } else {
        o.did(format!("PSN {q:#08x} sent {n} times, then nothing"));
    }
    end_gave_up(c, &mut o, "RETRY_EXC_ERR");
    o.done()
}

/// The RNR NAK timer code the tester answers with (1: 0.01 ms, the shortest).
const RNR_CODE: u8 = 1;

fn rnr_nak(q: u32, msn: u32) -> Pkt {
    Pkt::ack_to_peer(
        q,
        Syndrome::RnrNak(crate::wire::RnrTimer::new(RNR_CODE)),
        msn,
    )
}

fn t_rnr_retry_exhausted(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(r) = c.info.retry else {
        return Outcome::inconclusive("the peer's retry settings are unknown");
    };
    if r.rnr_retry == 7 {
        return Outcome::not_applicable("the peer's rnr_retry is 7 (without end)");
    }
    let q = match provoke_send(c, &mut o) {
        Ok(q) => q,
        Err(out) => return out,
    };
    let limit = u32::from(r.rnr_retry) + 1;
    let msn = c.st.peer.msn;
    o.did(format!(
        "answering every transmission of PSN {q:#08x} with an RNR NAK (timer code {RNR_CODE}): rnr_retry {} allows {limit}",
        r.rnr_retry
    ));
    let n = count_transmissions(c, q, limit, nak_quiet(c), |_| Some(rnr_nak(q, msn)));
    if n > limit {
        o.fail(format!(
            "PSN {q:#08x} sent {n} times and still going: more than 1 + rnr_retry ({limit})"
        ));
        c.release_held();
        c.end_unknown();
        return o.done();
    }
    if n < limit {
        o.fail(format!(
            "PSN {q:#08x} sent {n} times, then nothing: fewer than 1 + rnr_retry ({limit})"
        ));
    } else {
        o.did(format!("PSN {q:#08x} sent {n} times, then nothing"));
    }
    end_gave_up(c, &mut o, "RNR_RETRY_EXC_ERR");
    o.done()
}

/// RNR NAKs the tester sends before it lets a peer with rnr_retry 7 through.
const RNR_MANY: u32 = 12;

fn t_rnr_retry_infinite(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    if c.info.retry.is_none() {
        return Outcome::inconclusive("the peer's retry settings are unknown");
    }
    let q = match provoke_send(c, &mut o) {
        Ok(q) => q,
        Err(out) => return out,
    };
    let msn = c.st.peer.msn;
    o.did(format!(
        "answering the first {RNR_MANY} transmissions of PSN {q:#08x} with RNR NAKs (timer code {RNR_CODE}); rnr_retry 7 means retry without end"
    ));
    let n = count_transmissions(c, q, RNR_MANY, nak_quiet(c), |k| {
        (k <= RNR_MANY).then(|| rnr_nak(q, msn))
    });
    if n <= RNR_MANY {
        o.fail(format!(
            "PSN {q:#08x} sent {n} times, then nothing after {} RNR NAKs: rnr_retry 7 must retry without end",
            n
        ));
        if let Some(ctl) = c.control.as_mut() {
            if let Ok(s) = ctl.first_send_error() {
                o.did(format!("the peer's first send error: {s}"));
            }
        }
        c.release_held();
        c.end_unknown();
        return o.done();
    }
    o.did(format!(
        "PSN {q:#08x} sent again after {RNR_MANY} RNR NAKs; now acknowledged"
    ));
    c.release_held();
    let _ = c.listen(c.timeout / 2);
    if c.control.is_some() {
        match send_completed(c, 0) {
            Ok((ok, 0)) if ok > 0 => o.did("the peer's SEND completed successfully"),
            Ok((ok, err)) => o.fail(format!(
                "after the ACK: {ok} sends completed, {err} with errors"
            )),
            Err(e) => o.unsure(e),
        }
    }
    c.end_usable(&mut o);
    o.done()
}

// ---------------------------------------------------------------------------------------
// the peer's requester: a window of requests (the perftest clients, the ferroce peer)

/// Hold the peer's next requests unanswered until at least `min_msgs` messages (and every
/// packet the peer sends with them) are held: the ferroce peer is asked for four SENDs of
/// two packets each, a perftest client sends by itself. Returns the held packets' first
/// transmissions in PSN order.
fn hold_window(c: &mut Ctx, o: &mut Obs, min_msgs: usize) -> Result<Vec<Rx>, Outcome> {
    c.st.peer.auto_ack = false;
    c.st.peer.held.clear();
    if let Some(ctl) = c.control.as_mut() {
        let len = 2 * c.info.mtu as usize;
        for _ in 0..4 {
            ctl.post_send(len).map_err(Outcome::inconclusive)?;
        }
        o.did(format!(
            "asked the ferroce peer for four SENDs of {len} bytes (two packets each)"
        ));
    } else {
        o.did("withholding the answers to the peer's next requests");
    }
    let t0 = Instant::now();
    let msgs = |h: &[Rx]| h.iter().filter(|r| starts_message(r)).count();
    while msgs(&c.st.peer.held) < min_msgs
        && t0.elapsed() < c.wait.max(c.timeout)
        && c.io_error.is_none()
    {
        let _ = c.collect(c.timeout / 20, Duration::ZERO, |_| false);
    }
    // Let the rest of the window arrive (well within the peer's local ACK timeout).
    let _ = c.collect(c.timeout / 10, Duration::ZERO, |_| false);
    let w = first_sends(&c.st.peer.held);
    if msgs(&w) < min_msgs {
        c.release_held();
        c.end_unknown();
        return Err(Outcome::inconclusive(format!(
            "the peer sent {} message(s) to the tester, {min_msgs} needed",
            msgs(&w)
        )));
    }
    let last = w.last().map_or(0, |r| r.psn());
    o.did(format!(
        "holding {} request packet(s) of {} message(s), PSN {:#08x} to {last:#08x}",
        w.len(),
        msgs(&w),
        w[0].psn()
    ));
    Ok(w)
}

/// Whether a request packet starts a message (FIRST or ONLY; READ and ATOMIC requests).
fn starts_message(r: &Rx) -> bool {
    let op = r.opcode();
    let f = op.flags();
    f.contains(crate::wire::OpFlags::FIRST)
        || f.contains(crate::wire::OpFlags::ONLY)
        || op == Opcode::RC_READ_REQUEST
        || op == Opcode::RC_CMP_SWAP
        || op == Opcode::RC_FETCH_ADD
}

/// The first transmission of each PSN among `held`, in the order they came.
fn first_sends(held: &[Rx]) -> Vec<Rx> {
    let mut seen = std::collections::HashSet::new();
    held.iter()
        .filter(|r| seen.insert(r.psn()))
        .cloned()
        .collect()
}

/// Take the held requests before `p` as executed (the tester's responder state moves past
/// them, nothing is sent); the others stay held.
fn accept_before(c: &mut Ctx, p: u32) {
    let held = std::mem::take(&mut c.st.peer.held);
    let mut keep = Vec::new();
    for r in held {
        if Psn::new(r.psn()).diff(Psn::new(p)) < 0 {
            let _ = c.st.peer.respond(&r);
        } else {
            keep.push(r);
        }
    }
    c.st.peer.held = keep;
}

/// Collect for up to `d` (or until `enough` says so), returning the packets the peer sent
/// after the first `from` held ones.
fn held_after(c: &mut Ctx, from: usize, d: Duration, enough: impl Fn(&[Rx]) -> bool) -> Vec<Rx> {
    let t0 = Instant::now();
    while t0.elapsed() < d && c.io_error.is_none() {
        if enough(c.st.peer.held.get(from..).unwrap_or(&[])) {
            let _ = c.collect(c.timeout / 20, Duration::ZERO, |_| false);
            break;
        }
        let _ = c.collect(c.timeout / 20, Duration::ZERO, |_| false);
    }
    c.st.peer.held.get(from..).unwrap_or(&[]).to_vec()
}

fn t_ghost_ack_client(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let w = match hold_window(c, &mut o, 1) {
        Ok(w) => w,
        Err(out) => return out,
    };
    let q = w[0].psn();
    let top = w.last().map_or(q, |r| r.psn());
    // Far ahead of anything the peer sent (inside the half of the PSN space ahead of it).
    let ghost = Psn::new(top).add(0x10_0000).get();
    let n0 = c.st.peer.held.len();
    let msn = c.st.peer.msn;
    c.send(
        &mut o,
        &[Pkt::ack_to_peer(
            ghost,
            Syndrome::Ack(crate::wire::CreditCode::from_count(64)),
            (msn + 1000) & 0xff_ffff,
        )],
    );
    o.did(format!(
        "a ghost ACK at PSN {ghost:#08x}, beyond every PSN the peer sent; its requests stay unanswered, so it must send PSN {q:#08x} again on its local ACK timeout"
    ));
    let r = c.info.retry.unwrap_or(RetrySettings::PERFTEST);
    let after = held_after(c, n0, retry_quiet(c, &r), |a| {
        a.iter().any(|x| x.psn() == q)
    });
    let beyond = after
        .iter()
        .find(|x| Psn::new(x.psn()).diff(Psn::new(top)) > 0 && x.psn() != q);
    if after.iter().any(|x| x.psn() == q) {
        o.did(format!(
            "PSN {q:#08x} sent again: the ghost ACK completed nothing"
        ));
    } else if let Some(b) = beyond {
        o.fail(format!(
            "PSN {q:#08x} never sent again, new requests instead ({}): the peer took the ghost ACK as acknowledging its requests",
            b.line
        ));
    } else {
        o.fail(format!(
            "PSN {q:#08x} never sent again within {} ms with no answer: the ghost ACK stopped the peer's retries",
            retry_quiet(c, &r).as_millis()
        ));
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_nak_resend_from_psn(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let w = match hold_window(c, &mut o, 2) {
        Ok(w) => w,
        Err(out) => return out,
    };
    let q = w[0].psn();
    let top = w.last().map_or(q, |r| r.psn());
    let Some(p) = w.iter().skip(1).find(|r| starts_message(r)).map(Rx::psn) else {
        c.release_held();
        c.end_unknown();
        return Outcome::inconclusive("no second message among the held requests");
    };
    accept_before(c, p);
    let msn = c.st.peer.msn;
    // Everything the peer sends from now on (a resent request before `p` is a duplicate the
    // tester answers again, so it is not held: the log keeps it).
    c.st.peer.log = Some(Vec::new());
    c.send(
        &mut o,
        &[Pkt::ack_to_peer(
            p,
            Syndrome::Nak(NakCode::PsnSequenceError),
            msn,
        )],
    );
    o.did(format!(
        "a sequence error NAK at PSN {p:#08x} (the second message): the requests before it are acknowledged by it, the peer must resend from {p:#08x}"
    ));
    let resent = |x: &Rx| {
        Psn::new(x.psn()).diff(Psn::new(q)) >= 0 && Psn::new(x.psn()).diff(Psn::new(top)) <= 0
    };
    let t0 = Instant::now();
    let d = c.wait.max(c.timeout);
    while t0.elapsed() < d
        && c.io_error.is_none()
        && !c.st.peer.log.as_ref().is_some_and(|l| l.iter().any(resent))
    {
        let _ = c.collect(c.timeout / 20, Duration::ZERO, |_| false);
    }
    // A little longer, for the rest of the resent window.
    let _ = c.collect(c.timeout / 10, Duration::ZERO, |_| false);
    let after = c.st.peer.log.take().unwrap_or_default();
    let again: Vec<&Rx> = after.iter().filter(|x| resent(x)).collect();
    match again.first() {
        None => o.fail(format!(
            "nothing sent again within {} ms of the NAK",
            d.as_millis()
        )),
        Some(f) if f.psn() == p => o.did(format!("resent from PSN {p:#08x}: {}", f.line)),
        Some(f) => o.fail(format!(
            "the first packet sent again is PSN {:#08x}, not the NAK's {p:#08x}: {}",
            f.psn(),
            f.line
        )),
    }
    if let Some(e) = again
        .iter()
        .find(|x| Psn::new(x.psn()).diff(Psn::new(p)) < 0)
    {
        o.fail(format!(
            "PSN {:#08x} sent again though the NAK at {p:#08x} acknowledged it",
            e.psn()
        ));
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_coalesced_to_requester(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let w = match hold_window(c, &mut o, 2) {
        Ok(w) => w,
        Err(out) => return out,
    };
    let q = w[0].psn();
    // The last packet that ends a message, after at least one other message.
    let ends = |r: &Rx| {
        let f = r.opcode().flags();
        f.contains(crate::wire::OpFlags::LAST) || f.contains(crate::wire::OpFlags::ONLY)
    };
    let Some(h) = w
        .iter()
        .rev()
        .find(|r| ends(r) && Psn::new(r.psn()).diff(Psn::new(q)) > 0)
        .map(Rx::psn)
    else {
        c.release_held();
        c.end_unknown();
        return Outcome::inconclusive("no second complete message among the held requests");
    };
    let covered = w
        .iter()
        .filter(|r| starts_message(r) && Psn::new(r.psn()).diff(Psn::new(h)) <= 0)
        .count();
    accept_before(c, Psn::new(h).next().get());
    let n0 = c.st.peer.held.len();
    let msn = c.st.peer.msn;
    c.send(
        &mut o,
        &[Pkt::ack_to_peer(
            h,
            Syndrome::Ack(crate::wire::CreditCode::from_count(64)),
            msn,
        )],
    );
    o.did(format!(
        "one ACK at PSN {h:#08x} covering {covered} messages from PSN {q:#08x}; nothing before it may be sent again"
    ));
    // Answer everything after it as it comes (held requests beyond the ACK would run the
    // peer out of retries), keeping a log of what the peer sends.
    c.st.peer.log = Some(Vec::new());
    c.release_held();
    let r = c.info.retry.unwrap_or(RetrySettings::PERFTEST);
    let quiet = retry_quiet(c, &r);
    let bad = |x: &Rx| {
        Psn::new(x.psn()).diff(Psn::new(q)) >= 0 && Psn::new(x.psn()).diff(Psn::new(h)) <= 0
    };
    let t0 = Instant::now();
    while t0.elapsed() < quiet
        && c.io_error.is_none()
        && !c.st.peer.log.as_ref().is_some_and(|l| l.iter().any(bad))
    {
        let _ = c.collect(c.timeout / 20, Duration::ZERO, |_| false);
    }
    let log = c.st.peer.log.take().unwrap_or_default();
    let _ = n0;
    match log.iter().find(|x| bad(x)) {
        Some(x) => o.fail(format!(
            "PSN {:#08x} sent again after the ACK at {h:#08x} covered it: {}",
            x.psn(),
            x.line
        )),
        None => o.did(format!(
            "nothing up to PSN {h:#08x} sent again within {} ms ({} later request packets answered)",
            quiet.as_millis(),
            log.len()
        )),
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_read_response_gap(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let w = match hold_window(c, &mut o, 2) {
        Ok(w) => w,
        Err(out) => return out,
    };
    let reads: Vec<&Rx> = w
        .iter()
        .filter(|r| r.opcode() == Opcode::RC_READ_REQUEST)
        .collect();
    if reads.len() < 2 {
        c.release_held();
        c.end_unknown();
        return Outcome::inconclusive("fewer than two READ requests held");
    }
    let (r1, r2) = (reads[0].clone(), reads[1].clone());
    let (q1, q2) = (r1.psn(), r2.psn());
    let (va, len) = r2.repr.ext.reth.map_or((0, 0), |r| (r.va, r.dma_len));
    let n0 = c.st.peer.held.len();
    let msn = (c.st.peer.msn + 2) & 0xff_ffff;
    let resp = super::ctx::read_responses(q2, va, len, c.info.mtu, msn);
    c.send(&mut o, &resp);
    o.did(format!(
        "answered only the second READ (PSN {q2:#08x}); the first (PSN {q1:#08x}) got no response, so the peer must not complete it and must send it again"
    ));
    let r = c.info.retry.unwrap_or(RetrySettings::PERFTEST);
    let quiet = retry_quiet(c, &r);
    // A request beyond the held window: the peer went on instead of going back to the
    // first READ (a requester that goes back resends from it before anything new). The
    // wait ends there too, and the new requests are answered (end_usable): held any longer
    // they would run the peer out of retries, and a peer gone away decides nothing.
    let top = w.last().map_or(q2, |x| x.psn());
    let beyond = |x: &Rx| Psn::new(x.psn()).diff(Psn::new(top)) > 0;
    let after = held_after(c, n0, quiet, |a| {
        a.iter().any(|x| x.psn() == q1 || beyond(x))
    });
    let again = after.iter().position(|x| x.psn() == q1);
    let new = after.iter().position(beyond);
    match (again, new) {
        (Some(i), b) if b.is_none_or(|b| i < b) => {
            o.did(format!("READ at PSN {q1:#08x} sent again: {}", after[i].line));
        }
        (None, None) => o.fail(format!(
            "READ at PSN {q1:#08x} not sent again within {} ms: the peer took the later READ's response as completing it",
            quiet.as_millis()
        )),
        (_, b) => o.fail(format!(
            "a new request instead of the READ at PSN {q1:#08x} again ({}): the peer took the later READ's response as completing it",
            b.map_or("", |b| after[b].line.as_str())
        )),
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_requester_rd_atomic(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let Some(limit) = c.info.our_rd_atomic else {
        return Outcome::inconclusive("the tester announced no READ/ATOMIC limit");
    };
    let w = match hold_window(c, &mut o, 1) {
        Ok(w) => w,
        Err(out) => return out,
    };
    // Give the peer a full timeout to send whatever else it would.
    let _ = c.listen(c.timeout);
    let all = first_sends(&c.st.peer.held);
    let n = all
        .iter()
        .filter(|r| {
            matches!(
                r.opcode(),
                Opcode::RC_READ_REQUEST | Opcode::RC_CMP_SWAP | Opcode::RC_FETCH_ADD
            )
        })
        .count();
    let _ = w;
    if n as u32 > limit {
        o.fail(format!(
            "{n} READ/ATOMIC requests outstanding at once; the tester announced {limit} (out_reads, the peer's max_rd_atomic)"
        ));
    } else {
        o.did(format!(
            "{n} READ/ATOMIC request(s) outstanding with none answered: within the {limit} announced"
        ));
    }
    c.end_usable(&mut o);
    o.done()
}

// ---------------------------------------------------------------------------------------
// ECN

fn t_ce_executed(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let p = c.psn();
    let Some(v) = valid(c, p) else {
        return no_valid();
    };
    c.send(&mut o, &[v.ecn(Ecn::Ce)]);
    let got = c.answer(p, 1);
    c.note_all(&mut o, &got);
    if acked_upto(&got, p) == Some(0) {
        c.take(1);
        o.did("the CE-marked request was executed normally");
    } else {
        o.fail("a CE-marked request was not executed (CE is a mark, not a drop)");
        c.end_unknown();
        return o.done();
    }
    c.end_usable(&mut o);
    o.done()
}

/// Whether the peer does RoCEv2 congestion management: it says so, or it marks its packets
/// ECN-capable (CA17-5: a peer without it sends ECN 00).
fn rcm(c: &Ctx) -> Option<String> {
    if let Some(i) = c.info.cnp_interval {
        Some(format!(
            "the peer announces a CNP interval of {} us",
            i.as_micros()
        ))
    } else if c.st.peer_ect {
        Some("the peer marks its packets ECN-capable".into())
    } else {
        None
    }
}

fn cnp_window(c: &mut Ctx, o: &mut Obs, k: u32) -> (Vec<crate::apps::conform::link::Rx>, Duration) {
    let p = c.psn();
    let pkts: Vec<Pkt> = (0..k)
        .filter_map(|i| valid(c, Psn::new(p).add(i).get()).map(|v| v.ecn(Ecn::Ce)))
        .collect();
    let t0 = Instant::now();
    c.send(o, &pkts);
    let span = t0.elapsed();
    let last = Psn::new(p).add(k - 1).get();
    c.cnps.clear();
    let got = c.answer(last, 1);
    let _ = c.listen(c.timeout / 2);
    let shown: Vec<Got> = got.iter().take(3).cloned().collect();
    c.note_all(o, &shown);
    if acked_upto(&got, p) == Some(k as i32 - 1) {
        c.take(k);
    } else {
        o.fail("the CE-marked requests were not all executed");
        c.st.dead = true;
    }
    (c.cnps.clone(), span)
}

fn t_cnp_generated(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let (cnps, _) = cnp_window(c, &mut o, 1);
    match (cnps.first(), rcm(c)) {
        (Some(x), _) => o.did(format!("CNP: {}", x.line)),
        (None, Some(why)) => o.fail(format!(
            "no CNP for a CE-marked packet, though {why} (CA17-44)"
        )),
        (None, None) => {
            return Outcome {
                verdict: Verdict::NotApplicable,
                did: vec!["no CNP; the peer's packets carry ECN 00".into()],
                why: vec!["the peer does not implement RoCEv2 congestion management (its packets carry ECN 00: CA17-5); CNPs are optional (A17.9.3)".into()],
            }
        }
    }
    if !c.st.dead {
        c.end_usable(&mut o);
    }
    o.done()
}

fn t_cnp_format(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let (cnps, _) = cnp_window(c, &mut o, 1);
    let Some(x) = cnps.first() else {
        return match rcm(c) {
            Some(_) => Outcome::inconclusive("no CNP to examine (see ecn.cnp-generated)"),
            None => {
                Outcome::not_applicable("the peer sends no CNPs (no RoCEv2 congestion management)")
            }
        };
    };
    o.did(format!("CNP: {}", x.line));
    let b = &x.repr.bth;
    let raw = &x.raw;
    let reserved = raw.get(x.bth_at + 12..x.bth_at + 28);
    let checks: [(bool, String); 7] = [
        (
            b.opcode == Opcode::CNP,
            format!("opcode {:#04x}", b.opcode.0),
        ),
        (
            b.dest_qp.get() == c.ep.our_qpn,
            format!("DestQP {} (ours is {:#08x})", b.dest_qp, c.ep.our_qpn),
        ),
        (b.psn.get() == 0, format!("PSN {}", b.psn)),
        (
            b.pkey.0 == 0xffff,
            format!("P_Key {:#06x} (the marked packet's was 0xffff)", b.pkey.0),
        ),
        (!b.solicited && !b.mig_req, "SE/M set".to_string()),
        (
            reserved.is_some_and(|r| r.iter().all(|&v| v == 0)) && x.payload.is_empty(),
            "the 16 reserved bytes are not zero / extra payload".into(),
        ),
        (x.icrc_ok, "bad ICRC".into()),
    ];
    for (ok, what) in checks {
        if !ok {
            o.fail(format!("CNP field wrong: {what}"));
        }
    }
    if b.becn {
        o.did("BECN set (as ConnectX sends it)");
    } else {
        o.fail(
            "BECN not set (ConnectX sets it; the ferroce reaction point relies on the opcode only)",
        );
    }
    if !o.failed() {
        o.did("opcode 0x81, our QPN, PSN 0, P_Key of the marked packet, 16 zero bytes, good ICRC");
    }
    if !c.st.dead {
        c.end_usable(&mut o);
    }
    o.done()
}

fn t_cnp_rate(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let k = 16u32;
    let (cnps, span) = cnp_window(c, &mut o, k);
    let Some(iv) = c.info.cnp_interval else {
        return match (cnps.len(), rcm(c)) {
            (0, None) => Outcome::not_applicable("the peer sends no CNPs (no RoCEv2 congestion management)"),
            (n, _) => Outcome::inconclusive(format!(
                "{n} CNPs for {k} CE-marked packets; the peer's CNP interval is unknown (no bound to check)"
            )),
        };
    };
    // At most one CNP per interval, over the time the marked packets took to arrive
    // (bounded by our send span plus the interval: one may straddle each end).
    let allowed = 1 + (span.as_nanos() / iv.as_nanos().max(1)) as usize + 1;
    o.did(format!(
        "{} CNP(s) for {k} CE-marked packets sent within {} us; interval {} us allows at most {allowed}",
        cnps.len(),
        span.as_micros(),
        iv.as_micros()
    ));
    if cnps.is_empty() {
        o.fail("no CNP at all");
    } else if cnps.len() > allowed {
        o.fail("more CNPs than one per interval");
    }
    if !c.st.dead {
        c.end_usable(&mut o);
    }
    o.done()
}

// ---------------------------------------------------------------------------------------
// header fields

fn t_fecn_becn(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let p = c.psn();
    let Some(mut v) = valid(c, p) else {
        return no_valid();
    };
    v.fecn = true;
    v.becn = true;
    c.send(&mut o, &[v]);
    let got = c.answer(p, 1);
    c.note_all(&mut o, &got);
    if acked_upto(&got, p) == Some(0) {
        c.take(1);
        o.did("executed; FECN/BECN ignored");
    } else {
        o.fail("a request with FECN and BECN set was not executed");
        c.end_unknown();
        return o.done();
    }
    c.end_usable(&mut o);
    o.done()
}

fn t_sport(c: &mut Ctx) -> Outcome {
    let mut o = Obs::new();
    let p = c.psn();
    let Some(mut v) = valid(c, p) else {
        return no_valid();
    };
    v.sport = Some(c.ep.sport ^ 0x2a5a);
    c.send(&mut o, &[v]);
    let got = c.answer(p, 1);
    c.note_all(&mut o, &got);
    if acked_upto(&got, p) == Some(0) {
        c.take(1);
        o.did("executed: the UDP source port is flow entropy, not an address");
    } else {
        o.fail("a request from another UDP source port was not executed");
        c.end_unknown();
        return o.done();
    }
    c.end_usable(&mut o);
    o.done()
}

// ---------------------------------------------------------------------------------------
// the catalogue

const FRESH: SessionReq = SessionReq {
    start_psn: None,
    qp_rights: None,
    recvs: None,
    fresh: false,
    retry: None,
};

/// The ferroce peer's retry settings for the timeout and sequence-NAK retry tests: retry_cnt
/// 7 as ibv_rc_pingpong's, a 16.8 ms local ACK timeout (code 12).
const RETRY_TIMEOUT: Option<RetrySettings> = Some(RetrySettings {
    retry_cnt: 7,
    rnr_retry: 7,
    timeout: 12,
});
/// The ferroce peer's retry settings for the tests that answer every transmission with a
/// NAK: a local ACK timeout of 1.07 s (code 18), so that no timeout retry comes between a
/// transmission and the tester's answer, however slowly the tester runs.
const RETRY_NAK: Option<RetrySettings> = Some(RetrySettings {
    retry_cnt: 7,
    rnr_retry: 7,
    timeout: 18,
});
/// As [`RETRY_NAK`], with rnr_retry 3 for the finite RNR retry test.
const RETRY_RNR3: Option<RetrySettings> = Some(RetrySettings {
    retry_cnt: 7,
    rnr_retry: 3,
    timeout: 18,
});

const fn rights(read: bool, write: bool, atomic: bool) -> Option<Rights> {
    Some(Rights {
        read,
        write,
        atomic,
    })
}

macro_rules! t {
    ($id:literal, $g:ident, $title:literal, $rule:literal, $sum:literal, $must:literal, $obs:literal, $app:expr, $ses:expr, $run:expr) => {
        TestDef {
            id: $id,
            group: Group::$g,
            title: $title,
            rule: $rule,
            summary: $sum,
            must: $must,
            observes: $obs,
            applies: $app,
            session: $ses,
            run: $run,
        }
    };
}

/// Every test, in the order they run.
pub fn catalogue() -> Vec<TestDef> {
    vec![
        // PSN
        t!("psn.in-order", Psn, "requests in PSN order are executed",
           "IBTA Vol 1 §9.7.5.1.1",
           "A request whose PSN is the expected PSN is executed and the expected PSN advances by one (by the number of response packets for a READ).",
           "acknowledge four consecutive requests",
           "ACKs (or READ/ATOMIC responses) on the wire, every tool",
           always, FRESH, t_in_order),
        t!("psn.dup-send-reacked", Psn, "a duplicate SEND is acknowledged again",
           "IBTA Vol 1 §9.7.5.1.1, C9-105",
           "A duplicate SEND or RDMA WRITE (PSN before the expected one) is acknowledged again, with an ACK covering its PSN; the MSN does not advance.",
           "re-ACK the duplicate, MSN unchanged",
           "the re-ACK's PSN and MSN, every tool with receives posted",
           need_recvs, FRESH, t_dup_send_reacked),
        t!("psn.dup-write-reacked", Psn, "a duplicate RDMA WRITE is acknowledged again",
           "IBTA Vol 1 §9.7.5.1.1, C9-105",
           "As for SEND: a duplicate WRITE is acknowledged again and not counted as a new message.",
           "re-ACK the duplicate, MSN unchanged",
           "the re-ACK's PSN and MSN (ib_write_bw, ferroce)",
           need_write, FRESH, t_dup_write_reacked),
        t!("psn.dup-send-not-executed", Psn, "a duplicate SEND is not delivered again",
           "IBTA Vol 1 §9.7.5.1.1, C9-105",
           "A duplicate SEND must not consume a second receive WQE or complete a second receive.",
           "complete exactly one receive for a SEND and its duplicate",
           "pingpong: the number of echoes (one per completed receive); ferroce: the receive completions; ib_send_bw does not show them",
           need_recv_count, FRESH, t_dup_send_not_executed),
        t!("psn.dup-write-not-executed", Psn, "a duplicate RDMA WRITE does not write again",
           "IBTA Vol 1 §9.7.5.1.1, C9-105",
           "A duplicate WRITE must not touch memory again: a later WRITE to the same address stays.",
           "leave the second WRITE's data in place after a duplicate of the first",
           "the memory read back (ferroce: control channel); ib_write_bw's buffer cannot be read remotely",
           need_write_readback, FRESH, t_dup_write_not_executed),
        t!("psn.dup-read-replayed", Psn, "a duplicate RDMA READ is executed again",
           "IBTA Vol 1 §9.7.5.1.1, C9-110",
           "A duplicate READ is answered again from its PSN with the data the region holds, in PSN order.",
           "send the READ responses again, same PSNs, same data",
           "READ responses on the wire (ib_read_bw, ferroce)",
           need_read, FRESH, t_dup_read_replayed),
        t!("psn.dup-read-middle", Psn, "a duplicate READ from a middle PSN restarts there",
           "IBTA Vol 1 §9.7.5.1.1, C9-110",
           "A duplicate READ whose PSN falls inside an earlier READ's responses, with the RETH moved on accordingly, is answered from that PSN.",
           "send READ responses starting at the duplicate's PSN with the data from its VA",
           "READ responses on the wire (ib_read_bw, ferroce)",
           need_read, FRESH, t_dup_read_middle),
        t!("psn.dup-atomic-replayed", Psn, "a duplicate ATOMIC returns the saved result",
           "IBTA Vol 1 §9.7.5.1.1, §9.4.5",
           "An atomic is executed once; its duplicate is answered with the original value saved in the responder resource, not executed again.",
           "return the same original value to the duplicate and add only once",
           "ATOMIC ACK values (ib_atomic_bw, ferroce)",
           need_atomic, FRESH, t_dup_atomic),
        t!("psn.out-of-sequence", Psn, "a PSN gap draws exactly one sequence error NAK",
           "IBTA Vol 1 §9.7.5.1.1, §9.9.3 (class B)",
           "A request after a gap draws one PSN sequence error NAK naming the expected PSN; further out-of-sequence requests are dropped silently until the expected PSN arrives.",
           "send one NAK PSN_SEQ_ERR for the expected PSN, execute nothing until it arrives",
           "NAKs on the wire, every tool",
           always, FRESH, t_out_of_sequence),
        t!("psn.dup-while-nak", Psn, "duplicates are still answered after a sequence error NAK",
           "IBTA Vol 1 §9.7.5.1.1",
           "While waiting for the expected PSN after a sequence error NAK, the responder keeps answering duplicates.",
           "re-ACK a duplicate while the sequence error stands",
           "ACKs on the wire, every tool",
           always, FRESH, t_dup_while_nak),
        t!("psn.wrap", Psn, "PSNs wrap from 2^24-1 to 0",
           "IBTA Vol 1 §9.7.5.1.1",
           "PSNs are 24 bits and compare modulo 2^24: the request after 0xffffff is 0, and 0xffffff afterwards is a duplicate.",
           "execute requests across the wrap; treat the PSN before it as a duplicate",
           "ACKs on the wire (a fresh session starting at PSN 0xfffffd), every tool",
           always, SessionReq { start_psn: Some(0xff_fffd), fresh: true, ..FRESH }, t_wrap),
        t!("psn.far-ahead", Psn, "a PSN far outside the window",
           "IBTA Vol 1 §9.7.5.1.1",
           "A PSN that is neither expected nor a duplicate (2^22 ahead) is out of sequence: one sequence error NAK, nothing executed.",
           "NAK PSN_SEQ_ERR naming the expected PSN; stay usable",
           "NAKs on the wire, every tool",
           always, FRESH, t_far_ahead),
        t!("psn.stale-duplicate", Psn, "a PSN deep in the duplicate region",
           "IBTA Vol 1 §9.7.5.1.1",
           "A PSN up to 2^23 behind the expected one is a duplicate, even if never seen: it is re-ACKed (or ignored), never executed, never NAKed.",
           "not execute it; no NAK",
           "MSN of any re-ACK, receive completions where observable, every tool with SEND or WRITE",
           need_send_or_write, FRESH, t_stale_dup),
        // opcode sequence
        t!("opseq.send-middle-first", OpSeq, "SEND MIDDLE without a FIRST",
           "IBTA Vol 1 §9.7.5.1.2, §9.9.3 (class C)",
           "A MIDDLE or LAST packet with no message in progress is an invalid request: NAK, then the QP enters the error state.",
           "NAK INV_REQ for its PSN, then drop everything (error state)",
           "the NAK and a silent probe, every tool",
           always, FRESH, t_send_middle_first),
        t!("opseq.send-last-first", OpSeq, "SEND LAST without a FIRST",
           "IBTA Vol 1 §9.7.5.1.2, §9.9.3 (class C)",
           "As above, for a LAST packet.",
           "NAK INV_REQ, error state",
           "the NAK and a silent probe, every tool",
           always, FRESH, t_send_last_first),
        t!("opseq.write-middle-first", OpSeq, "RDMA WRITE MIDDLE without a FIRST",
           "IBTA Vol 1 §9.7.5.1.2, §9.9.3 (class C)",
           "As above, for a WRITE MIDDLE (the sequence check comes before the operation's validity).",
           "NAK INV_REQ, error state",
           "the NAK and a silent probe, every tool",
           always, FRESH, t_write_middle_first),
        t!("opseq.first-in-message", OpSeq, "FIRST inside a message",
           "IBTA Vol 1 §9.7.5.1.2, §9.9.3 (class C)",
           "While a multi-packet message is in progress only MIDDLE or LAST of the same kind may follow; a new FIRST is an invalid request.",
           "NAK INV_REQ for the second FIRST, error state",
           "the NAK and a silent probe (SEND where receives are posted, else WRITE)",
           need_multi, FRESH, t_first_in_message),
        t!("opseq.only-in-message", OpSeq, "ONLY inside a message",
           "IBTA Vol 1 §9.7.5.1.2, §9.9.3 (class C)",
           "An ONLY packet inside a message in progress is an invalid request.",
           "NAK INV_REQ, error state",
           "the NAK and a silent probe (SEND or WRITE)",
           need_multi, FRESH, t_only_in_message),
        t!("opseq.write-in-send", OpSeq, "WRITE MIDDLE inside a SEND",
           "IBTA Vol 1 §9.7.5.1.2, §9.9.3 (class C)",
           "A packet of another operation inside a message in progress is an invalid request.",
           "NAK INV_REQ, error state",
           "the NAK and a silent probe (peers with receives posted)",
           need_recvs, FRESH, t_write_in_send),
        t!("opseq.read-in-message", OpSeq, "READ request inside a message",
           "IBTA Vol 1 §9.7.5.1.2, §9.9.3 (class C)",
           "A new request (here an RDMA READ) cannot start before the message in progress ends.",
           "NAK INV_REQ, error state",
           "the NAK and a silent probe (SEND or WRITE)",
           need_multi, FRESH, t_read_in_message),
        // lengths
        t!("len.reth-longer", Length, "RETH length larger than the payload",
           "IBTA Vol 1 §9.7.5.1.4, §9.9.3 (class C)",
           "The payload of a WRITE ONLY must equal the RETH DMA length; a mismatch is an invalid request.",
           "NAK INV_REQ, error state",
           "the NAK and a silent probe (WRITE)",
           need_write, FRESH, t_reth_longer),
        t!("len.reth-shorter", Length, "RETH length smaller than the payload",
           "IBTA Vol 1 §9.7.5.1.4, §9.9.3 (class C)",
           "As above, with more payload than the RETH announces.",
           "NAK INV_REQ, error state",
           "the NAK and a silent probe (WRITE)",
           need_write, FRESH, t_reth_shorter),
        t!("len.write-total-short", Length, "a multi-packet WRITE ending short of its length",
           "IBTA Vol 1 §9.7.5.1.4, §9.9.3 (class C)",
           "The packets of a WRITE must add up to the RETH DMA length: a LAST that ends early is an invalid request.",
           "NAK INV_REQ for the LAST, error state",
           "the NAK and a silent probe (WRITE)",
           need_write, FRESH, t_write_total_short),
        t!("len.above-mtu", Length, "a payload above the path MTU",
           "IBTA Vol 1 §9.7.5.1.4, C9-92",
           "No request packet may carry more than the path MTU of payload.",
           "NAK INV_REQ, error state",
           "the NAK and a silent probe (SEND or WRITE)",
           need_multi, FRESH, t_above_mtu),
        t!("len.first-short", Length, "a FIRST packet shorter than the MTU",
           "IBTA Vol 1 §9.7.5.1.4, C9-92",
           "FIRST and MIDDLE packets carry exactly one path MTU of payload.",
           "NAK INV_REQ, error state",
           "the NAK and a silent probe (SEND or WRITE)",
           need_multi, FRESH, t_first_short),
        t!("len.middle-short", Length, "a MIDDLE packet shorter than the MTU",
           "IBTA Vol 1 §9.7.5.1.4, C9-92",
           "As above, for a MIDDLE packet.",
           "NAK INV_REQ, error state",
           "the NAK and a silent probe (SEND or WRITE)",
           need_multi, FRESH, t_middle_short),
        t!("len.pad-mismatch", Length, "a pad count that makes the payload disagree with the RETH",
           "IBTA Vol 1 §9.2 (PadCnt), §9.7.5.1.4",
           "The payload is what is left after the pad bytes the BTH names; eight bytes with pad count 3 are a five-byte payload, which does not match an eight-byte RETH.",
           "NAK INV_REQ, error state",
           "the NAK and a silent probe (WRITE)",
           need_write, FRESH, t_pad_mismatch),
        t!("len.zero-write", Length, "a zero-length RDMA WRITE",
           "IBTA Vol 1 §9.7.5.1.7, C9-88",
           "A zero-length RDMA WRITE accesses no memory: its R_Key and VA are not checked, and it is acknowledged.",
           "ACK it whatever its R_Key",
           "the ACK (QPs with RDMA WRITE enabled)",
           |p, c| if p.qp.write { always(p, c) } else { Err(Inapplicable::QpLacks { tool: p.tool.program(), what: "RDMA WRITE" }) },
           FRESH, t_zero_write),
        t!("len.zero-read", Length, "a zero-length RDMA READ",
           "IBTA Vol 1 §9.7.5.1.7, C9-88",
           "A zero-length RDMA READ accesses no memory and is answered with one READ RESPONSE ONLY with no payload.",
           "one empty READ RESPONSE ONLY",
           "the response (QPs with RDMA READ enabled)",
           |p, c| if p.qp.read { always(p, c) } else { Err(Inapplicable::QpLacks { tool: p.tool.program(), what: "RDMA READ" }) },
           FRESH, t_zero_read),
        t!("len.read-too-long", Length, "an RDMA READ longer than 2^31 bytes",
           "IBTA Vol 1 §9.7.5.1.4, C9-94",
           "A DMA length above 2^31 is an invalid request.",
           "NAK INV_REQ, error state",
           "the NAK and a silent probe (READ)",
           need_read, FRESH, t_read_too_long),
        // keys and rights
        t!("key.invalid-rkey-write", Keys, "RDMA WRITE with an invalid R_Key",
           "IBTA Vol 1 §9.7.5.1.7, §10.6.3, §9.9.3 (class C)",
           "An R_Key that names no region is a remote access error: NAK, error state.",
           "NAK REM_ACCESS_ERR, error state",
           "the NAK and a silent probe (WRITE)",
           need_write, FRESH, t_rkey_write),
        t!("key.invalid-rkey-read", Keys, "RDMA READ with an invalid R_Key",
           "IBTA Vol 1 §9.7.5.1.7, §10.6.3, §9.9.3 (class C)",
           "As above, for a READ.",
           "NAK REM_ACCESS_ERR, error state",
           "the NAK and a silent probe (READ)",
           need_read, FRESH, t_rkey_read),
        t!("key.invalid-rkey-atomic", Keys, "ATOMIC with an invalid R_Key",
           "IBTA Vol 1 §9.7.5.1.7, §10.6.3, §9.9.3 (class C)",
           "As above, for an atomic.",
           "NAK REM_ACCESS_ERR, error state",
           "the NAK and a silent probe (ATOMIC)",
           need_atomic, FRESH, t_rkey_atomic),
        t!("key.out-of-bounds-write", Keys, "RDMA WRITE outside the region",
           "IBTA Vol 1 §9.7.5.1.7, §10.6.3",
           "Every byte of the access must lie inside the region the R_Key names.",
           "NAK REM_ACCESS_ERR, error state",
           "the NAK and a silent probe (WRITE)",
           need_write, FRESH, t_oob_write),
        t!("key.out-of-bounds-read", Keys, "RDMA READ beyond the region",
           "IBTA Vol 1 §9.7.5.1.7, §10.6.3",
           "As above, for a READ 2^40 bytes past the region.",
           "NAK REM_ACCESS_ERR, error state",
           "the NAK and a silent probe (READ)",
           need_read, FRESH, t_oob_read),
        t!("key.out-of-bounds-atomic", Keys, "ATOMIC beyond the region",
           "IBTA Vol 1 §9.7.5.1.7, §10.6.3",
           "As above, for an atomic.",
           "NAK REM_ACCESS_ERR, error state",
           "the NAK and a silent probe (ATOMIC)",
           need_atomic, FRESH, t_oob_atomic),
        t!("key.va-overflow", Keys, "VA + length wrapping past 2^64",
           "IBTA Vol 1 §9.7.5.1.7, §10.6.3",
           "An access whose end wraps around the 64-bit address space is outside every region.",
           "NAK REM_ACCESS_ERR, error state",
           "the NAK and a silent probe (READ or WRITE)",
           |p, c| need_read(p, c).or_else(|_| need_write(p, c)), FRESH, t_va_overflow),
        t!("key.no-write-right", Keys, "RDMA WRITE through an R_Key without remote write",
           "IBTA Vol 1 §10.6.3, §9.7.5.1.7",
           "The region must grant the operation's remote right; the QP allowing it is not enough.",
           "NAK REM_ACCESS_ERR, error state",
           "the NAK and a silent probe (ib_send_bw: its buffer has no remote rights while its QP enables WRITE; ferroce: a key without write)",
           |p, _| if p.qp.write && (p.lacking || p.mr.is_some_and(|m| !m.write)) { Ok(()) } else { Err(Inapplicable::NoKeyLacking { tool: p.tool.program(), what: "write" }) },
           SessionReq { qp_rights: rights(true, true, true), ..FRESH }, t_no_write_right),
        t!("key.no-read-right", Keys, "RDMA READ through an R_Key without remote read",
           "IBTA Vol 1 §10.6.3, §9.7.5.1.7",
           "As above, for READ.",
           "NAK REM_ACCESS_ERR, error state",
           "the NAK and a silent probe (ferroce: a key without read)",
           |p, _| if p.qp.read && p.lacking { Ok(()) } else { Err(Inapplicable::NoKeyLacking { tool: p.tool.program(), what: "read" }) },
           FRESH, t_no_read_right),
        t!("key.no-atomic-right", Keys, "ATOMIC through an R_Key without remote atomic",
           "IBTA Vol 1 §10.6.3, §9.7.5.1.7",
           "As above, for atomics.",
           "NAK REM_ACCESS_ERR, error state",
           "the NAK and a silent probe (ferroce: a key without atomic)",
           |p, _| if p.qp.atomic && p.lacking { Ok(()) } else { Err(Inapplicable::NoKeyLacking { tool: p.tool.program(), what: "atomic" }) },
           FRESH, t_no_atomic_right),
        t!("key.qp-write-disabled", Keys, "RDMA WRITE to a QP that does not enable it",
           "IBTA Vol 1 §9.7.5.1.3, §9.9.3 (class C)",
           "An operation the QP's access flags do not enable is an invalid request.",
           "NAK INV_REQ, error state",
           "the NAK and a silent probe (pingpong, ib_read_bw, ib_atomic_bw; ferroce with a read/atomic-only QP)",
           |p, _| need_qp_lacks(p, |r| r.write, "RDMA WRITE"),
           SessionReq { qp_rights: rights(true, false, true), ..FRESH }, t_qp_no_write),
        t!("key.qp-read-disabled", Keys, "RDMA READ to a QP that does not enable it",
           "IBTA Vol 1 §9.7.5.1.3, §9.9.3 (class C)",
           "As above, for READ.",
           "NAK INV_REQ, error state",
           "the NAK and a silent probe",
           |p, _| need_qp_lacks(p, |r| r.read, "RDMA READ"),
           SessionReq { qp_rights: rights(false, true, true), ..FRESH }, t_qp_no_read),
        t!("key.qp-atomic-disabled", Keys, "ATOMIC to a QP that does not enable it",
           "IBTA Vol 1 §9.7.5.1.3, §9.9.3 (class C)",
           "As above, for atomics.",
           "NAK INV_REQ, error state",
           "the NAK and a silent probe",
           |p, _| need_qp_lacks(p, |r| r.atomic, "atomics"),
           SessionReq { qp_rights: rights(true, true, false), ..FRESH }, t_qp_no_atomic),
        t!("key.misaligned-atomic", Keys, "an ATOMIC at an address not 8-byte aligned",
           "IBTA Vol 1 §9.4.5, §9.9.3 (class C)",
           "Atomics operate on naturally aligned 64-bit words; a misaligned VA is an invalid request.",
           "NAK INV_REQ, error state",
           "the NAK and a silent probe (ATOMIC)",
           need_atomic, FRESH, t_misaligned_atomic),
        // resources
        t!("res.rnr-nak", Resources, "a SEND with no receive posted",
           "IBTA Vol 1 §9.7.5.1.5, §9.9.3 (class B)",
           "A SEND that finds no receive WQE gets an RNR NAK carrying the QP's minimum RNR timer; the QP stays usable and still expects that PSN.",
           "RNR NAK for the SEND's PSN with the negotiated timer; stay usable",
           "the RNR NAK (tools with no receives: ib_write_bw, ib_read_bw, ib_atomic_bw; ferroce with none posted)",
           need_no_recvs, SessionReq { recvs: Some(0), fresh: true, ..FRESH }, t_rnr),
        t!("res.too-many-reads", Resources, "more outstanding READs than negotiated",
           "IBTA Vol 1 §9.7.5.1.5, §9.9.3 (class C)",
           "A requester may have at most the responder's max_dest_rd_atomic READ/ATOMIC requests outstanding; a responder with no resource left for another is to refuse it with an invalid request NAK.",
           "NAK INV_REQ for the request beyond the limit, error state",
           "READ responses and the NAK (ib_read_bw, ferroce)",
           need_read, FRESH, t_too_many_reads),
        t!("res.too-many-atomics", Resources, "more outstanding ATOMICs than negotiated",
           "IBTA Vol 1 §9.7.5.1.5, §9.9.3 (class C)",
           "As above, for atomics.",
           "NAK INV_REQ for the request beyond the limit, error state",
           "ATOMIC ACKs and the NAK (ib_atomic_bw, ferroce)",
           need_atomic, FRESH, t_too_many_atomics),
        // silent drops
        t!("res.requester-rd-atomic", Resources, "the peer's requester keeps within the responder's READ/ATOMIC resources",
           "IBTA Vol 1 §9.9.3 (class C), max_rd_atomic",
           "A requester has at most its max_rd_atomic READ/ATOMIC requests outstanding, set from what the responder takes (perftest: the out_reads the other side announces).",
           "never have more READ/ATOMIC requests outstanding than the tester announced",
           "the unanswered READ/ATOMIC requests on the wire (ib_read_bw, ib_atomic_bw as the client)",
           need_rd_atomic_requester, FRESH, t_requester_rd_atomic),
        t!("drop.bad-icrc", Drops, "a bad ICRC",
           "IBTA Annex A17.3.3, CA17-22, CA17-24",
           "A packet whose ICRC does not check is silently dropped: no response, no effect.",
           "no response; the PSN is still expected; stay usable",
           "silence, then a sequence error NAK for the next PSN (the dropped PSN was not consumed), every tool",
           need_raw, FRESH, t_bad_icrc),
        t!("drop.unknown-qpn", Drops, "a destination QP that does not exist",
           "IBTA Vol 1 §9.6.1 (QP check)",
           "A packet for a QP number the port does not have is silently dropped.",
           "no response; the connection unaffected",
           "silence, then the PSN check, every tool",
           always, FRESH, t_unknown_qpn),
        t!("drop.qp0", Drops, "destination QP 0",
           "IBTA Annex A17.6, CA17-33",
           "RoCEv2 ports have no QP0: packets for it are silently dropped.",
           "no response; the connection unaffected",
           "silence, then the PSN check, every tool",
           always, FRESH, t_qp0),
        t!("drop.wrong-pkey", Drops, "a P_Key that does not match",
           "IBTA Vol 1 §9.6.1 (P_Key check), Annex A17.4.7",
           "A BTH P_Key that matches no partition of the QP (here 0x8123 against the default 0xffff) is silently dropped.",
           "no response; the connection unaffected",
           "silence, then the PSN check, every tool",
           always, FRESH, t_wrong_pkey),
        t!("drop.wrong-dest-ip", Drops, "a destination address that is not the port's",
           "IBTA Vol 1 §9.6.1.2.3, Annex A17.4.4.2",
           "A packet whose destination GID (the IP destination) is not one of the port's is silently dropped, even if it reaches the port's MAC address.",
           "no response; the connection unaffected",
           "silence, then the PSN check, every tool (raw backends only)",
           need_raw, FRESH, t_wrong_dst_ip),
        t!("drop.wrong-source-ip", Drops, "a source address that is not the connected peer's",
           "IBTA Vol 1 §9.6.1.2.3, Annex A17.4.4.2",
           "A connected QP takes packets only from the address it is connected to.",
           "no response; the connection unaffected",
           "silence, then the PSN check, every tool (raw backends only)",
           need_raw, FRESH, t_wrong_src_ip),
        t!("drop.uc-opcode", Drops, "a UC opcode to an RC QP",
           "IBTA Vol 1 §9.6.1 (transport check)",
           "A packet whose opcode is of another transport than the destination QP's is silently dropped.",
           "no response; the connection unaffected",
           "silence, then the PSN check, every tool",
           always, FRESH, t_uc_opcode),
        t!("drop.bad-tver", Drops, "a transport header version other than 0",
           "IBTA Vol 1 §9.6.1 (TVer check)",
           "Packets with a BTH TVer this port does not implement are silently dropped.",
           "no response; the connection unaffected",
           "silence, then the PSN check, every tool",
           always, FRESH, t_bad_tver),
        // ACKs
        t!("ack.ackreq", Acks, "AckReq is honoured",
           "IBTA Vol 1 §9.7.5.2, §9.2 (AckReq)",
           "A request packet with AckReq set must be acknowledged (by an ACK for it or a later PSN).",
           "ACK the request",
           "the ACK, tools with SEND or WRITE",
           need_send_or_write, FRESH, t_ackreq),
        t!("ack.ackreq-mid-message", Acks, "AckReq on a FIRST packet; MSN per message",
           "IBTA Vol 1 §9.7.5.2, §9.7.6.1 (MSN)",
           "AckReq on a packet inside a message is honoured with an ACK that leaves the MSN unchanged; the MSN advances when the message ends.",
           "ACK the FIRST (same MSN) and the LAST (MSN + 1)",
           "ACK PSNs and MSNs (SEND or WRITE)",
           need_multi, FRESH, t_ackreq_mid),
        t!("ack.coalesced", Acks, "coalesced ACKs cover every PSN",
           "IBTA Vol 1 §9.7.5.2, §9.7.6.1",
           "A responder may acknowledge several requests with one ACK; every ACK it sends covers PSNs actually received, in order, with the MSN counting the messages completed.",
           "ACKs within the range, never going back, MSN consistent, the last PSN covered",
           "ACKs on the wire (SEND or WRITE)",
           need_send_or_write, FRESH, t_coalesced),
        t!("ack.credits", Acks, "AETH credit count",
           "IBTA Vol 1 §9.7.7.2",
           "The AETH of an ACK carries the number of receive WQEs available (a table code) or 11111b when credits are not tracked.",
           "report credits consistent with the posted receives",
           "the ACK's credit field (tools with receives posted)",
           need_recvs, FRESH, t_credits),
        t!("ack.ghost-ack", Acks, "an ACK for a PSN the peer never sent is ignored",
           "IBTA Vol 1 §9.7.6.1 (ACK validation)",
           "A requester ignores an ACK whose PSN is not that of an outstanding request (a ghost ACK); it completes nothing on it.",
           "complete nothing on the ghost ACK; complete on the real one",
           "pingpong: it starts its next message only once its SEND completes; ferroce: its send completions; perftest clients: the first request sent again on the ACK timeout (a ghost beyond everything sent)",
           need_requester, FRESH, t_ghost_ack),
        t!("ack.unsolicited", Acks, "ACKs and NAKs with nothing outstanding are ignored",
           "IBTA Vol 1 §9.7.6.1",
           "A requester with nothing outstanding ignores ACKs and NAKs (even fatal NAK codes) that arrive for it.",
           "ignore them; the QP stays usable",
           "the probe afterwards; ferroce: send completions and QP state",
           always, FRESH, t_unsolicited),
        // the peer's requester: retry limits
        t!("ack.nak-resend-from-psn", Acks, "the peer's requester resends from a sequence error NAK's PSN",
           "IBTA Vol 1 §9.7.5.2.3 (NAK: PSN seq. error)",
           "A PSN sequence error NAK acknowledges every SEND/WRITE before its PSN; the requester resends starting with the request at the NAK's PSN, and none before it (a READ or ATOMIC before it is not completed by it: see ack.read-response-gap).",
           "send the requests from the NAK's PSN again, nothing earlier",
           "the peer's retransmissions on the wire (perftest WRITE/SEND clients, the ferroce peer)",
           need_window, FRESH, t_nak_resend_from_psn),
        t!("ack.coalesced-to-requester", Acks, "one ACK completes every earlier request of the peer",
           "IBTA Vol 1 §9.7.6.1 (coalesced ACKs)",
           "An ACK acknowledges the request at its PSN and every earlier one (ACKs may be coalesced); the requester completes them all and sends none of them again.",
           "send nothing up to the ACK's PSN again",
           "the peer's retransmissions on the wire (perftest WRITE/SEND clients, the ferroce peer)",
           need_window, FRESH, t_coalesced_to_requester),
        t!("ack.read-response-gap", Acks, "a later READ's response does not complete an earlier READ",
           "IBTA Vol 1 §9.7.5.2 (implied NAK)",
           "A READ completes only on its own response packets; a response for a later READ while an earlier one is unanswered means the earlier responses were lost, and the requester sends the earlier READ again.",
           "send the unanswered earlier READ again",
           "the peer's retransmissions on the wire (ib_read_bw as the client)",
           need_read_requester, FRESH, t_read_response_gap),
        t!("ack.retry-exhausted", Acks, "the peer's requester stops after retry_cnt retries (ACK timeout)",
           "IBTA Vol 1 §9.7.6.1.3; §10.7.3.1 (an error completes even an unsignaled WR)",
           "A requester whose request stays unacknowledged retransmits it after each local ACK timeout at most retry_cnt times (7 is seven: only rnr_retry 7 means without end), then completes the WR with RETRY_EXC_ERR and moves the QP to the error state.",
           "exactly 1 + retry_cnt transmissions, then RETRY_EXC_ERR and the error state",
           "the count of its transmissions (pingpong: retry_cnt 7 from its source; ferroce: retry_cnt 7, timeout code 12), a silent probe; ferroce: the completion status and QP state",
           need_requester_retry, SessionReq { retry: RETRY_TIMEOUT, ..FRESH }, t_retry_exhausted),
        t!("ack.nak-retry-exhausted", Acks, "the peer's requester stops after retry_cnt retries (sequence-error NAKs)",
           "IBTA Vol 1 §9.7.5.2.3, §9.7.6.1.3",
           "A PSN sequence error NAK makes the requester resend from the NAK's PSN; each such retry spends one of retry_cnt, then RETRY_EXC_ERR and the error state.",
           "exactly 1 + retry_cnt transmissions, then RETRY_EXC_ERR and the error state",
           "the count of its transmissions (ferroce: retry_cnt 7, timeout code 18 so that no timeout retry interferes), a silent probe; ferroce: the completion status and QP state",
           need_requester_retry, SessionReq { retry: RETRY_NAK, ..FRESH }, t_nak_retry_exhausted),
        t!("ack.rnr-retry-exhausted", Acks, "the peer's requester stops after rnr_retry RNR retries",
           "IBTA Vol 1 §9.7.5.2.8, §9.7.6.1.3 (RNR_RETRY_EXC_ERR)",
           "After an RNR NAK the requester waits the NAK's timer and resends; with rnr_retry below 7 it does so at most rnr_retry times, then completes the WR with RNR_RETRY_EXC_ERR and moves the QP to the error state.",
           "exactly 1 + rnr_retry transmissions, then RNR_RETRY_EXC_ERR and the error state",
           "the count of its transmissions (ferroce: rnr_retry 3; tools whose rnr_retry is 7 are not applicable), a silent probe, the completion status and QP state",
           need_requester_rnr_finite, SessionReq { retry: RETRY_RNR3, ..FRESH }, t_rnr_retry_exhausted),
        t!("ack.rnr-retry-infinite", Acks, "rnr_retry 7: the peer's requester retries RNR NAKs without end",
           "IBTA Vol 1 §9.7.5.2.8",
           "An RNR retry count of 7 means retry without end: after any number of RNR NAKs the requester resends, and completes normally once acknowledged.",
           "a transmission after each of 12 RNR NAKs; success once acknowledged",
           "the count of its transmissions (pingpong and ferroce: rnr_retry 7), the probe; ferroce: the completion",
           need_requester_rnr_infinite, SessionReq { retry: RETRY_NAK, ..FRESH }, t_rnr_retry_infinite),
        // ECN
        t!("ecn.ce-executed", Ecn, "a CE-marked request is executed",
           "IBTA Annex A17.9.3",
           "CE is a congestion mark, not an error: the request is executed as usual.",
           "execute and acknowledge it",
           "the ACK, every tool (raw backends or the UDP socket's TOS)",
           always, FRESH, t_ce_executed),
        t!("ecn.cnp-generated", Ecn, "a CE-marked packet draws a CNP",
           "IBTA Annex A17.9.3, CA17-44",
           "A port that implements RoCEv2 congestion management answers a valid CE-marked packet with a CNP to its source (it may send one for several).",
           "send a CNP to our QP",
           "CNPs on the wire; not applicable to peers without congestion management (ECN 00 on their packets, CA17-5)",
           always, FRESH, t_cnp_generated),
        t!("ecn.cnp-format", Ecn, "the CNP's format",
           "IBTA Annex A17.9.3 (Figure 6)",
           "A CNP: opcode 0x81, DestQP the QP it is for, PSN 0, SE and M 0, the marked packet's P_Key, 16 reserved zero bytes; ConnectX also sets BECN.",
           "a CNP in that format",
           "the CNP's bytes",
           always, FRESH, t_cnp_format),
        t!("ecn.cnp-rate", Ecn, "at most one CNP per interval",
           "IBTA Annex A17.9.3, CA17-44; DCQCN notification point",
           "The notification point sends at most one CNP per QP per its CNP interval, however many marked packets arrive.",
           "no more CNPs than the burst spans intervals",
           "CNPs for 16 CE-marked packets sent back to back, against the interval the peer announces",
           always, FRESH, t_cnp_rate),
        // header fields
        t!("hdr.fecn-becn-ignored", Headers, "FECN and BECN are ignored",
           "IBTA Annex A17.4.8, CA17-29",
           "RoCEv2 ports ignore the BTH FECN/BECN bits (InfiniBand congestion control is not used).",
           "execute the request as usual",
           "the ACK, every tool",
           always, FRESH, t_fecn_becn),
        t!("hdr.udp-source-port", Headers, "any UDP source port is accepted",
           "IBTA Annex A17.3.2.1, A17.9.4",
           "The UDP source port is flow entropy for ECMP, not part of the connection's address.",
           "execute the request as usual",
           "the ACK, every tool",
           always, FRESH, t_sport),
    ]
}

/// The ids of every test that `f` on the tool's profile makes applicable (for docs/tests).
pub fn applicable(tool: PeerTool, caps: &Caps) -> Vec<&'static str> {
    catalogue()
        .into_iter()
        .filter(|t| check_applies(t, &Profile::of(tool, &t.session), caps).is_ok())
        .map(|t| t.id)
        .collect()
}
