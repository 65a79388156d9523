//! `--verify`: every byte that crosses the wire checked against what the sender had.
//!
//! perftest fills each buffer it registers with `(char)rand()` after `srand(time(NULL))`, so a
//! perftest peer's memory is known once the second it started is known
//! ([`crate::apps::pattern::find_glibc_seed`]); a ferroce sender sends message `q` of its own
//! pattern on QP `q`. Messages of at most half a cycle buffer walk through it in steps of
//! `INC(size)`, locally and remotely in step, so the bytes of message `k` are those at slot
//! `k mod (cycle / INC)` of the sender's send half.
//!
//! - read_bw (client): each READ is read into its own slot and compared when it completes;
//! - atomic_bw (client): every result proves its ATOMIC ran exactly once (see [`AtomicCheck`]);
//! - send_bw (receiver): each receive lands in its own slot and is compared when it completes;
//! - write_bw (passive side, and both sides of `-b`): every slot the peer wrote, after the run.

use super::ctx::{inc, Endpoint};
use super::{Connection, PerfConfig, PerfError, Verb};
use crate::apps::pattern;
use crate::oob::perftest::Role;
use serde::Serialize;

/// What was checked, for the report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct VerifyReport {
    /// Messages whose every byte was compared.
    pub messages: u64,
    /// Bytes compared.
    pub bytes: u64,
    /// What the bytes were compared with.
    pub against: String,
}

/// How many cycle-buffer slots messages of `size` use (1 when they do not walk).
fn slots(ep: &Endpoint<'_>, size: u32) -> usize {
    if size as usize <= ep.cycle / 2 {
        (ep.cycle / inc(size as usize, ep.line)).max(1)
    } else {
        1
    }
}

/// The sender's bytes of message `k` of QP `q`: its send half starts at `q * B` of its buffer.
fn sender_offset(ep: &Endpoint<'_>, q: usize, k: u64, size: u32) -> usize {
    let s = (k % slots(ep, size) as u64) as usize;
    q * ep.bsize + s * inc(size as usize, ep.line)
}

/// A ferroce sender (`--verify`): message `q` of the pattern in every slot QP `q` sends from.
pub fn fill_sender(ep: &Endpoint<'_>, cfg: &PerfConfig, size: u32) -> Result<(), PerfError> {
    let step = inc(size as usize, ep.line);
    for q in 0..ep.nq() {
        let p = pattern::expected(size as usize, cfg.verify_seed, q as u64, false);
        for s in 0..slots(ep, size) {
            ep.write_send_half(q, s * step, &p)?;
        }
    }
    Ok(())
}

/// The peer's stream: found from the first message, then every message compared.
#[derive(Default)]
enum Source {
    #[default]
    Unknown,
    /// A ferroce sender's pattern (message q on QP q).
    Ferroce,
    /// perftest's buffer after `srand(seed)`.
    Glibc(u32),
}

/// The source of `got` (a message from the sender's offset `stream_off`), from its byte
/// `skip` on (those before are not the sender's fill).
fn find_source_from(
    cfg: &PerfConfig,
    got: &[u8],
    skip: usize,
    q: usize,
    stream_off: usize,
    what: &str,
) -> Result<Source, PerfError> {
    if got[skip..] == pattern::expected(got.len(), cfg.verify_seed, q as u64, false)[skip..] {
        return Ok(Source::Ferroce);
    }
    let (got, stream_off) = (&got[skip..], stream_off + skip);
    let now = pattern::unix_now();
    pattern::find_glibc_seed(got, stream_off, now, 900, 300)
        .map(Source::Glibc)
        .ok_or_else(|| {
            PerfError::Verify(format!(
                "{what} is neither ferroce's pattern (seed {:#x}, message {q}) nor perftest's srand(time)/rand() fill at offset {stream_off} for any second within 900 s before to 300 s after now (first bytes {:02x?})",
                cfg.verify_seed,
                &got[..got.len().min(8)]
            ))
        })
}

fn find_source(
    cfg: &PerfConfig,
    got: &[u8],
    q: usize,
    stream_off: usize,
    what: &str,
) -> Result<Source, PerfError> {
    find_source_from(cfg, got, 0, q, stream_off, what)
}

fn against(src: &Source, cfg: &PerfConfig, whose: &str) -> String {
    match src {
        Source::Ferroce => format!(
            "ferroce's pattern (seed {:#x}, message q on QP q)",
            cfg.verify_seed
        ),
        Source::Glibc(s) => {
            format!("{whose} as perftest fills it: glibc srand({s}) then (char)rand() per byte")
        }
        Source::Unknown => String::new(),
    }
}

fn compare(got: &[u8], want: &[u8], what: impl Fn() -> String) -> Result<(), PerfError> {
    match pattern::first_mismatch(got, want) {
        None => Ok(()),
        Some((at, g, w, n)) => Err(PerfError::Verify(format!(
            "{}: {n} of {} bytes differ, the first at byte {at}: got {g:#04x}, expected {w:#04x}",
            what(),
            got.len()
        ))),
    }
}

fn expected(src: &Source, cfg: &PerfConfig, q: usize, off: usize, len: usize) -> Vec<u8> {
    match src {
        Source::Glibc(seed) => pattern::glibc_bytes(*seed, off, len),
        _ => pattern::expected(len, cfg.verify_seed, q as u64, false),
    }
}

/// read_bw's check: READ `i` of QP `q` read the peer's advertised half at slot `i`.
pub struct ReadCheck {
    src: Source,
    tmp: Vec<u8>,
    pub report: VerifyReport,
}

impl ReadCheck {
    pub fn new(_nq: usize) -> Self {
        ReadCheck {
            src: Source::Unknown,
            tmp: Vec::new(),
            report: VerifyReport::default(),
        }
    }

    pub fn check(
        &mut self,
        ep: &Endpoint<'_>,
        cfg: &PerfConfig,
        q: usize,
        i: u64,
        size: u32,
    ) -> Result<(), PerfError> {
        let Some(vbuf) = &ep.vbuf else {
            return Ok(());
        };
        let len = size as usize;
        self.tmp.resize(len, 0);
        vbuf.read(ep.vslot(q, i), &mut self.tmp)
            .map_err(|e| PerfError::Verify(e.to_string()))?;
        // The peer advertised (qps + q) * B; the READ walked s slots past it.
        let s = (i % slots(ep, size) as u64) as usize;
        let off = (ep.nq() + q) * ep.bsize + s * inc(len, ep.line);
        if matches!(self.src, Source::Unknown) {
            self.src = match find_source(cfg, &self.tmp, q, off, &format!("READ {i} of QP {q}"))? {
                Source::Ferroce => {
                    return Err(PerfError::Verify(
                        "the peer's memory holds ferroce's send pattern, not a perftest buffer"
                            .into(),
                    ))
                }
                s => s,
            };
            self.report.against = against(&self.src, cfg, "the peer's buffer");
        }
        let want = expected(&self.src, cfg, q, off, len);
        compare(&self.tmp, &want, || format!("READ {i} of QP {q}"))?;
        self.report.messages += 1;
        self.report.bytes += len as u64;
        Ok(())
    }
}

/// atomic_bw's check (`verify`): every ATOMIC gets its own result slot and is signaled, all go
/// to the advertised address, and the original values they return must tell that each ran
/// exactly once, in order:
/// - FETCH_AND_ADD (add 1): result i is result 0 + i;
/// - CMP_AND_SWAP: operation 0 compares with 0 and swaps in 0 (it only reads), then
///   operation i compares with `c(i-1)` and swaps in `c(i)` (`c(0)` = result 0,
///   `c(k) = c(0) + k * K`), so each must succeed and return `c(i-1)`; a swap done twice or
///   not at all breaks the chain;
/// - result 0, the peer's memory before the test, must be perftest's `(char)rand()` fill
///   after `srand(time(NULL))` at the advertised address.
pub struct AtomicCheck {
    base: Vec<Option<u64>>,
    seed: Option<u32>,
    pub report: VerifyReport,
}

const CAS_STEP: u64 = 0x9e37_79b9_7f4a_7c15;

impl AtomicCheck {
    pub fn new(nq: usize) -> Self {
        AtomicCheck {
            base: vec![None; nq],
            seed: None,
            report: VerifyReport::default(),
        }
    }

    pub fn chain(base: u64, k: u64) -> u64 {
        base.wrapping_add(k.wrapping_mul(CAS_STEP))
    }

    /// QP `q`'s first result, once it is known.
    pub fn base(&self, q: usize) -> Option<u64> {
        self.base.get(q).copied().flatten()
    }

    pub fn check(
        &mut self,
        ep: &Endpoint<'_>,
        cfg: &PerfConfig,
        q: usize,
        i: u64,
    ) -> Result<(), PerfError> {
        let Some(vbuf) = &ep.vbuf else {
            return Ok(());
        };
        let mut b = [0u8; 8];
        vbuf.read(ep.vslot(q, i), &mut b)
            .map_err(|e| PerfError::Verify(e.to_string()))?;
        // The original value arrives in host byte order: the bytes of the peer's memory.
        let r = u64::from_ne_bytes(b);
        if i == 0 {
            let stream_off = (ep.nq() + q) * ep.bsize;
            let seed = match self.seed {
                Some(s) => s,
                None => {
                    let now = pattern::unix_now();
                    let s = pattern::find_glibc_seed(&b, stream_off, now, 900, 300).ok_or_else(|| {
                        PerfError::Verify(format!(
                            "QP {q}: the peer's memory before the first ATOMIC ({b:02x?}) is not perftest's srand(time)/rand() fill at offset {stream_off} for any second within 900 s before to 300 s after now"
                        ))
                    })?;
                    self.seed = Some(s);
                    s
                }
            };
            let want = pattern::glibc_bytes(seed, stream_off, 8);
            if want != b {
                return Err(PerfError::Verify(format!(
                    "QP {q}: first ATOMIC returned {b:02x?}, the peer's buffer holds {want:02x?}"
                )));
            }
            if let Some(x) = self.base.get_mut(q) {
                *x = Some(r);
            }
            self.report.against = format!(
                "exactly-once {} results, the first equal to the peer's buffer as perftest fills it (glibc srand({seed}), from byte {stream_off})",
                if cfg.cmp_swap { "CMP_AND_SWAP chain" } else { "FETCH_AND_ADD +1" }
            );
        } else {
            let base = self.base(q).ok_or_else(|| {
                PerfError::Verify(format!("QP {q}: ATOMIC {i} completed before ATOMIC 0"))
            })?;
            let want = if cfg.cmp_swap {
                Self::chain(base, i - 1)
            } else {
                base.wrapping_add(i)
            };
            if r != want {
                return Err(PerfError::Verify(format!(
                    "QP {q}: ATOMIC {i} returned {r:#018x}, expected {want:#018x} (an operation ran twice, not at all, or out of order)"
                )));
            }
        }
        self.report.messages += 1;
        self.report.bytes += 8;
        Ok(())
    }
}

/// send_bw's receiver check: receive `k` of QP `q` is message `k` of the peer's QP `q`.
pub struct SendCheck {
    enabled: bool,
    /// Bytes at the start of each QP's send buffer the peer overwrote before the run.
    peer_prefix: usize,
    src: Source,
    tmp: Vec<u8>,
    report: VerifyReport,
}

/// perftest's server with `-c UD -R` that sends too (`-b`) receives the client's UD
/// connection parameters (a 4-byte SEND with immediate) at the start of its buffer, GRH slot
/// first (`rdma_cm_request_ud_connection_parameters`: the receive's address is
/// `ctx->buf[i]` for the i-th connection, so with `-q N` the start of every QP's buffer), and
/// later sends from there: those bytes of its messages are the GRH and our message, not
/// its fill (seen in captures of perftest 4.5-0.17 against rxe: 20 zero bytes, the IPv4
/// header, 4 bytes, then the fill).
pub const UD_RDMA_CM_PREFIX: usize = 40 + 4;

impl SendCheck {
    /// The receiver's check; `tcp_role` says whether the peer is perftest's server.
    pub fn new(cfg: &PerfConfig, tcp_role: Role) -> Self {
        let peer_prefix =
            if cfg.connection == Connection::Ud && cfg.rdma_cm && tcp_role == Role::Client {
                UD_RDMA_CM_PREFIX
            } else {
                0
            };
        SendCheck {
            enabled: cfg.verify && cfg.test.verb() == Verb::Send,
            peer_prefix,
            src: Source::Unknown,
            tmp: Vec::new(),
            report: VerifyReport::default(),
        }
    }

    pub fn check(
        &mut self,
        ep: &Endpoint<'_>,
        cfg: &PerfConfig,
        q: usize,
        k: u64,
        slot: usize,
        size: u32,
    ) -> Result<(), PerfError> {
        let (true, Some(vbuf)) = (self.enabled, &ep.vbuf) else {
            return Ok(());
        };
        let len = size as usize;
        self.tmp.resize(len, 0);
        vbuf.read(slot * ep.vstride + ep.grh, &mut self.tmp)
            .map_err(|e| PerfError::Verify(e.to_string()))?;
        let off = sender_offset(ep, q, k, size);
        // What the peer overwrote is not compared (see UD_RDMA_CM_PREFIX).
        // (the prefix is at the start of each QP's buffer: the offset within QP q's)
        let in_qp = off.saturating_sub(q * ep.bsize);
        let skip = self.peer_prefix.saturating_sub(in_qp).min(len);
        if skip == len {
            return Ok(());
        }
        if matches!(self.src, Source::Unknown) {
            self.src = find_source_from(
                cfg,
                &self.tmp,
                skip,
                q,
                off,
                &format!("message {k} of QP {q}"),
            )?;
            self.report.against = against(&self.src, cfg, "the peer's send buffer");
            if self.peer_prefix > 0 {
                self.report.against += &format!(
                    " (its first {} bytes, where perftest received our UD connection parameters, not compared)",
                    self.peer_prefix
                );
            }
        }
        let want = expected(&self.src, cfg, q, off, len);
        compare(&self.tmp[skip..], &want[skip..], || {
            format!("message {k} received on QP {q}")
        })?;
        self.report.messages += 1;
        self.report.bytes += (len - skip) as u64;
        Ok(())
    }

    /// The report, if anything was checked.
    pub fn finish(self) -> Option<VerifyReport> {
        (self.report.messages > 0).then_some(self.report)
    }
}

/// write_bw's passive check, after the run: every slot of each QP's advertised half the peer
/// wrote holds the bytes of the sender's matching slot.
///
/// With `-a` each size overwrites the last from the start: what is left is the largest message
/// (8 MiB), and that is what is checked.
pub fn passive_write(ep: &Endpoint<'_>, cfg: &PerfConfig) -> Result<VerifyReport, PerfError> {
    // The active side's "done" says its writes left, and over UC nothing says they arrived:
    // take in what is already waiting before looking.
    if !ep.nic.settle(std::time::Duration::from_secs(2)) {
        tracing::debug!("the NIC kept receiving for 2 s before the write check");
    }
    let size = *cfg.sizes().last().unwrap_or(&cfg.size);
    let len = size as usize;
    let n = (slots(ep, size) as u64).min(cfg.iters.max(1)) as usize;
    let step = inc(len, ep.line);
    let mut rep = VerifyReport::default();
    let mut src = Source::Unknown;
    let mut got = vec![0u8; len];
    for q in 0..ep.nq() {
        for s in 0..n {
            ep.read_advertised(q, s * step, &mut got)?;
            let off = sender_offset(ep, q, s as u64, size);
            if matches!(src, Source::Unknown) {
                src = find_source(cfg, &got, q, off, &format!("slot {s} of QP {q}"))?;
                rep.against = against(&src, cfg, "the peer's send buffer");
            }
            let want = expected(&src, cfg, q, off, len);
            compare(&got, &want, || {
                format!("QP {q}, slot {s} of the written area")
            })?;
            rep.messages += 1;
            rep.bytes += len as u64;
        }
    }
    Ok(rep)
}
