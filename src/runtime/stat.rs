//! Introspection of running NICs, as iproute2's `rdma statistic` and `rdma resource` give it
//! for kernel RNICs: every [`Nic`](super::Nic) answers on a unix socket of its own
//! (`<run dir>/<pid>-<n>.sock`) with a snapshot of its device counters, its packet device's
//! counters and every QP (state, PSNs, outstanding work requests, retries, rate, counters).
//! `ferroce stat` and `ferroce res qp` find the sockets ([`discover`]) and print them.
//!
//! - **Where**: `$FERROCE_RUN_DIR` if set; otherwise `/run/ferroce` for root, else
//!   `$XDG_RUNTIME_DIR/ferroce`, else `/tmp/ferroce-<uid>` (made mode 0700: PSNs and QPNs are
//!   for the owner only; a directory owned by another user, or a link, is not used).
//!   [`discover`] looks in all of them.
//! - **Cost**: a thread per NIC blocked in `accept`; the device lock is taken only while a
//!   snapshot is taken, when someone asks. `FERROCE_STAT=off` turns publishing off.
//! - **Format** (what the socket answers; [`NicStat::to_text`], [`NicStat::parse`]): a first
//!   line `ferroce-stat 1`, then `key value` lines (`pid`, `comm`, `label`, `netns`, `name`,
//!   `backend`, `uptime_s`), `device NAME VALUE` and `io NAME VALUE` lines, and one line per
//!   QP: `qp QPN key=value ...` (type, state, PSNs, outstanding WQEs, rate, then its counters).

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The first line of a snapshot.
const MAGIC: &str = "ferroce-stat 1";

/// One QP of a running NIC.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct QpStat {
    /// Its number.
    pub qpn: u32,
    /// `RC`, `UC` or `UD`.
    pub qp_type: String,
    /// `RESET`, `INIT`, `RTR`, `RTS`, `SQD`, `SQE` or `ERR`.
    pub state: String,
    /// The peer's QPN (0 for UD).
    pub dest_qp: u32,
    /// The PSN of the next new request packet.
    pub next_psn: u32,
    /// The oldest PSN not yet acknowledged (RC).
    pub una_psn: u32,
    /// The PSN the responder expects.
    pub expected_psn: u32,
    /// Send work requests posted and not yet completed.
    pub sq_outstanding: u64,
    /// Receive work requests posted and not yet completed.
    pub rq_outstanding: u64,
    /// Its sending rate under congestion control (the line rate without it), bits/s.
    pub rate_bps: u64,
    /// Its counters (`retransmits`, `timeouts`, `rnr_naks_rcvd`, ...), by name.
    pub counters: Vec<(String, u64)>,
}

impl QpStat {
    /// A counter by name (0 if absent).
    pub fn counter(&self, name: &str) -> u64 {
        find(&self.counters, name)
    }
}

/// What a running NIC publishes.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct NicStat {
    /// The process.
    pub pid: u32,
    /// The process's command name (`/proc/PID/comm`).
    pub comm: String,
    /// What the process says it runs (`ferroce perf: RDMA_Write BW Test`; see
    /// [`Nic::set_label`](super::Nic::set_label)), or empty.
    pub label: String,
    /// The network namespace the NIC was started in (`net:[inode]`).
    pub netns: String,
    /// The device's name (`ferroce_<interface>`, or what [`Nic::set_name`](super::Nic::set_name)
    /// set).
    pub name: String,
    /// The packet device ([`Nic::describe`](super::Nic::describe)).
    pub backend: String,
    /// Seconds since the NIC started.
    pub uptime_s: f64,
    /// The device's counters (`rx_frames`, `icrc_drops`, ...), by name.
    pub device: Vec<(String, u64)>,
    /// The packet device's counters, by name.
    pub io: Vec<(String, u64)>,
    /// Its QPs, by QPN.
    pub qps: Vec<QpStat>,
}

fn find(v: &[(String, u64)], name: &str) -> u64 {
    v.iter().find(|(k, _)| k == name).map_or(0, |(_, n)| *n)
}

/// Why a snapshot did not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StatParseError {
    /// The first line is not `ferroce-stat 1`.
    #[error("not a ferroce-stat 1 snapshot")]
    Magic,
    /// A line that does not fit the format.
    #[error("line {line}: {text:?} does not parse")]
    Line {
        /// Its number (1-based).
        line: usize,
        /// The line.
        text: String,
    },
}

impl NicStat {
    /// A device counter by name (0 if absent).
    pub fn device_counter(&self, name: &str) -> u64 {
        find(&self.device, name)
    }

    /// The text the socket answers.
    pub fn to_text(&self) -> String {
        use std::fmt::Write as _;
        let one = |s: &str| s.replace(['\n', '\r'], " ");
        let mut t = String::new();
        let _ = writeln!(t, "{MAGIC}");
        let _ = writeln!(t, "pid {}", self.pid);
        let _ = writeln!(t, "comm {}", one(&self.comm));
        let _ = writeln!(t, "label {}", one(&self.label));
        let _ = writeln!(t, "netns {}", one(&self.netns));
        let _ = writeln!(t, "name {}", one(&self.name));
        let _ = writeln!(t, "backend {}", one(&self.backend));
        let _ = writeln!(t, "uptime_s {:.3}", self.uptime_s);
        for (k, v) in &self.device {
            let _ = writeln!(t, "device {k} {v}");
        }
        for (k, v) in &self.io {
            let _ = writeln!(t, "io {k} {v}");
        }
        for q in &self.qps {
            let _ = write!(
                t,
                "qp {} type={} state={} dest_qp={} next_psn={} una_psn={} expected_psn={} \
                 sq_outstanding={} rq_outstanding={} rate_bps={}",
                q.qpn,
                q.qp_type,
                q.state,
                q.dest_qp,
                q.next_psn,
                q.una_psn,
                q.expected_psn,
                q.sq_outstanding,
                q.rq_outstanding,
                q.rate_bps
            );
            for (k, v) in &q.counters {
                let _ = write!(t, " {k}={v}");
            }
            t.push('\n');
        }
        t
    }

    /// Parse what [`Self::to_text`] wrote.
    pub fn parse(text: &str) -> Result<NicStat, StatParseError> {
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err(StatParseError::Magic);
        }
        let mut s = NicStat::default();
        for (i, l) in lines.enumerate() {
            let bad = || StatParseError::Line {
                line: i + 2,
                text: l.to_string(),
            };
            let (key, rest) = l.split_once(' ').unwrap_or((l, ""));
            let pair = |rest: &str| -> Option<(String, u64)> {
                let (k, v) = rest.split_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            };
            match key {
                "pid" => s.pid = rest.parse().map_err(|_| bad())?,
                "comm" => s.comm = rest.to_string(),
                "label" => s.label = rest.to_string(),
                "netns" => s.netns = rest.to_string(),
                "name" => s.name = rest.to_string(),
                "backend" => s.backend = rest.to_string(),
                "uptime_s" => s.uptime_s = rest.parse().map_err(|_| bad())?,
                "device" => s.device.push(pair(rest).ok_or_else(bad)?),
                "io" => s.io.push(pair(rest).ok_or_else(bad)?),
                "qp" => s.qps.push(parse_qp(rest).ok_or_else(bad)?),
                "" => {}
                // Newer keys are skipped: an older `ferroce stat` still reads the rest.
                _ => {}
            }
        }
        Ok(s)
    }
}

fn parse_qp(rest: &str) -> Option<QpStat> {
    let mut it = rest.split(' ');
    let mut q = QpStat {
        qpn: it.next()?.parse().ok()?,
        ..QpStat::default()
    };
    for kv in it {
        let (k, v) = kv.split_once('=')?;
        let n = || v.parse::<u64>().ok();
        let n32 = || v.parse::<u32>().ok();
        match k {
            "type" => q.qp_type = v.to_string(),
            "state" => q.state = v.to_string(),
            "dest_qp" => q.dest_qp = n32()?,
            "next_psn" => q.next_psn = n32()?,
            "una_psn" => q.una_psn = n32()?,
            "expected_psn" => q.expected_psn = n32()?,
            "sq_outstanding" => q.sq_outstanding = n()?,
            "rq_outstanding" => q.rq_outstanding = n()?,
            "rate_bps" => q.rate_bps = n()?,
            _ => q.counters.push((k.to_string(), n()?)),
        }
    }
    Some(q)
}

fn euid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// The directory this process publishes in (see the module documentation).
pub fn run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FERROCE_RUN_DIR") {
        return PathBuf::from(d);
    }
    let uid = euid();
    if uid == Some(0) {
        return PathBuf::from("/run/ferroce");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(x) if !x.is_empty() => Path::new(&x).join("ferroce"),
        _ => PathBuf::from(format!("/tmp/ferroce-{}", uid.unwrap_or(0))),
    }
}

/// Every directory [`discover`] looks in: `$FERROCE_RUN_DIR` alone if set, else
/// `/run/ferroce`, `$XDG_RUNTIME_DIR/ferroce` and `/tmp/ferroce-<uid>`.
pub fn run_dirs() -> Vec<PathBuf> {
    if let Some(d) = std::env::var_os("FERROCE_RUN_DIR") {
        return vec![PathBuf::from(d)];
    }
    let mut v = vec![PathBuf::from("/run/ferroce")];
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        v.push(Path::new(&x).join("ferroce"));
    }
    v.push(PathBuf::from(format!(
        "/tmp/ferroce-{}",
        euid().unwrap_or(0)
    )));
    v.dedup();
    v
}

/// The snapshots of every running NIC that answers (this user's, or everyone's for root), by
/// process and name. A socket whose process is gone is removed.
pub fn discover() -> Vec<NicStat> {
    let mut v = Vec::new();
    for dir in run_dirs() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_none_or(|x| x != "sock") {
                continue;
            }
            match query(&p) {
                Ok(s) => v.push(s),
                Err(_) => {
                    // A process that died without removing its socket.
                    let pid = p
                        .file_stem()
                        .and_then(|s| s.to_str())
                        .and_then(|s| s.split('-').next())
                        .and_then(|s| s.parse::<u32>().ok());
                    if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
                        let _ = std::fs::remove_file(&p);
                    }
                }
            }
        }
    }
    v.sort_by(|a, b| (a.pid, &a.name).cmp(&(b.pid, &b.name)));
    v
}

/// Ask one socket for its snapshot.
pub fn query(path: &Path) -> std::io::Result<NicStat> {
    let mut c = UnixStream::connect(path)?;
    c.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut t = String::new();
    c.read_to_string(&mut t)?;
    NicStat::parse(&t).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The socket of one NIC and its thread; stopped and removed on drop.
pub(crate) struct Publisher {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// This process's NICs so far (the `<n>` of the socket names).
static SEQ: AtomicU32 = AtomicU32::new(0);

impl Publisher {
    /// Listen on a new socket in [`run_dir`] and answer every connection with `snapshot()`.
    /// `None` when publishing is off (`FERROCE_STAT=off`) or the directory cannot be used.
    pub(crate) fn start(snapshot: impl Fn() -> NicStat + Send + 'static) -> Option<Publisher> {
        if std::env::var("FERROCE_STAT").is_ok_and(|v| v == "off" || v == "0") {
            return None;
        }
        let dir = run_dir();
        let made = !dir.exists();
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::debug!(dir = %dir.display(), error = %e, "stat directory not usable");
            return None;
        }
        if made && euid() != Some(0) {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        }
        // A directory someone else made (a shared /tmp) is not ours to publish PSNs in.
        let owner = std::fs::symlink_metadata(&dir).map(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.uid(), m.is_dir())
        });
        if !matches!(owner, Ok((uid, true)) if Some(uid) == euid() || uid == 0) {
            tracing::debug!(dir = %dir.display(), "stat directory not owned by this user");
            return None;
        }
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{}-{n}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let l = match UnixListener::bind(&path) {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "stat socket not usable");
                return None;
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ferroce-stat".into())
            .spawn(move || serve(&l, &st, snapshot))
            .ok()?;
        Some(Publisher {
            path,
            stop,
            thread: Some(thread),
        })
    }
}

fn serve(l: &UnixListener, stop: &AtomicBool, snapshot: impl Fn() -> NicStat) {
    for c in l.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let Ok(mut c) = c else {
            continue;
        };
        let _ = c.set_write_timeout(Some(Duration::from_secs(2)));
        let _ = c.write_all(snapshot().to_text().as_bytes());
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the thread out of `accept`.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The network namespace of the calling thread (`net:[inode]`).
pub(crate) fn netns() -> String {
    std::fs::read_link("/proc/thread-self/ns/net")
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// This process's command name.
pub(crate) fn comm() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips() {
        let s = NicStat {
            pid: 42,
            comm: "ferroce".into(),
            label: "ferroce perf: RDMA_Write BW Test".into(),
            netns: "net:[4026531840]".into(),
            name: "ferroce_lo".into(),
            backend: "udp(127.0.0.1:4791, batch 64)".into(),
            uptime_s: 1.5,
            device: vec![("rx_frames".into(), 7), ("icrc_drops".into(), 1)],
            io: vec![("tx_frames".into(), 9)],
            qps: vec![QpStat {
                qpn: 17,
                qp_type: "RC".into(),
                state: "RTS".into(),
                dest_qp: 18,
                next_psn: 100,
                una_psn: 98,
                expected_psn: 5,
                sq_outstanding: 2,
                rq_outstanding: 3,
                rate_bps: 100_000_000_000,
                counters: vec![("retransmits".into(), 4)],
            }],
        };
        let t = s.to_text();
        assert!(t.starts_with("ferroce-stat 1\npid 42\n"));
        assert_eq!(NicStat::parse(&t), Ok(s));
        assert_eq!(NicStat::parse("hello\n"), Err(StatParseError::Magic));
        assert!(matches!(
            NicStat::parse("ferroce-stat 1\nqp x\n"),
            Err(StatParseError::Line { line: 2, .. })
        ));
    }
}
