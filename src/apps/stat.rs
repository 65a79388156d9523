//! `ferroce stat` and `ferroce res qp`: the counters and the QPs of every running ferroce
//! device, whatever process runs it, as iproute2's `rdma statistic show` and `rdma resource
//! show qp` print a kernel RNIC's. The snapshots come from [`crate::runtime::stat`].

use crate::runtime::stat::{NicStat, QpStat};
use serde_json::{json, Map, Value};
use std::fmt::Write as _;

/// Why `ferroce stat` / `ferroce res qp` printed nothing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StatError {
    /// `-d NAME` matched no running device.
    #[error("no running ferroce device named {0} (`ferroce stat` lists them)")]
    NoSuchDevice(String),
}

/// Which snapshots to show: those of device `dev` (`ferroce_<interface>` or the interface's
/// name) and of process `pid`, when given.
pub fn select(
    all: Vec<NicStat>,
    dev: Option<&str>,
    pid: Option<u32>,
) -> Result<Vec<NicStat>, StatError> {
    let v: Vec<NicStat> = all
        .into_iter()
        .filter(|s| dev.is_none_or(|d| s.name == d || s.name == format!("ferroce_{d}")))
        .filter(|s| pid.is_none_or(|p| s.pid == p))
        .collect();
    match dev {
        Some(d) if v.is_empty() => Err(StatError::NoSuchDevice(d.to_string())),
        _ => Ok(v),
    }
}

fn kv(v: &[(String, u64)]) -> String {
    v.iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn map(v: &[(String, u64)]) -> Value {
    Value::Object(
        v.iter()
            .map(|(k, n)| (k.clone(), Value::from(*n)))
            .collect::<Map<_, _>>(),
    )
}

/// The sum of the QPs' counters (the device's QP totals).
pub fn qp_totals(s: &NicStat) -> Vec<(String, u64)> {
    let mut t: Vec<(String, u64)> = Vec::new();
    for q in &s.qps {
        for (k, n) in &q.counters {
            match t.iter_mut().find(|(tk, _)| tk == k) {
                Some(e) => e.1 += n,
                None => t.push((k.clone(), *n)),
            }
        }
    }
    t
}

/// `ferroce stat`: per device, a `link` line naming it and its process, then its device, QP
/// total and packet-device counters.
pub fn stat_text(v: &[NicStat]) -> String {
    let mut s = String::new();
    for n in v {
        let _ = writeln!(
            s,
            "link {}/1 pid {} comm {}{} backend {} uptime {:.1}s qps {}",
            n.name,
            n.pid,
            n.comm,
            label(n),
            n.backend,
            n.uptime_s,
            n.qps.len()
        );
        let _ = writeln!(s, "    device: {}", kv(&n.device));
        let _ = writeln!(s, "    qp totals: {}", kv(&qp_totals(n)));
        let _ = writeln!(s, "    io: {}", kv(&n.io));
    }
    s
}

fn label(n: &NicStat) -> String {
    if n.label.is_empty() {
        String::new()
    } else {
        format!(" ({})", n.label)
    }
}

/// `ferroce stat --json`: one object per device.
pub fn stat_json(v: &[NicStat]) -> Value {
    Value::Array(
        v.iter()
            .map(|n| {
                json!({ "name": n.name, "pid": n.pid, "comm": n.comm, "label": n.label,
                    "netns": n.netns, "backend": n.backend, "uptime_s": n.uptime_s,
                    "qps": n.qps.len(), "device": map(&n.device), "qp_totals": map(&qp_totals(n)),
                    "io": map(&n.io) })
            })
            .collect(),
    )
}

fn gbps(bps: u64) -> String {
    format!("{:.2}Gb/s", bps as f64 / 1e9)
}

/// `ferroce res qp`: one line per QP, `rdma resource show qp`'s fields first (link, lqpn,
/// rqpn, type, state, sq-psn, rq-psn) and ferroce's after them (the oldest unacknowledged
/// PSN, outstanding work requests, retries, timeouts, RNR retries, rate), then the process.
pub fn res_qp_text(v: &[NicStat]) -> String {
    let mut s = String::new();
    for n in v {
        for q in &n.qps {
            let _ = writeln!(
                s,
                "link {}/1 lqpn {} rqpn {} type {} state {} sq-psn {} rq-psn {} una-psn {} \
                 sq-wqes {} rq-wqes {} retries {} timeouts {} rnr-retries {} rate {} pid {} \
                 comm {}",
                n.name,
                q.qpn,
                q.dest_qp,
                q.qp_type,
                q.state,
                q.next_psn,
                q.expected_psn,
                q.una_psn,
                q.sq_outstanding,
                q.rq_outstanding,
                q.counter("retransmits"),
                q.counter("timeouts"),
                q.counter("rnr_naks_rcvd"),
                gbps(q.rate_bps),
                n.pid,
                n.comm
            );
        }
    }
    s
}

fn qp_json(n: &NicStat, q: &QpStat) -> Value {
    json!({ "name": n.name, "pid": n.pid, "comm": n.comm, "netns": n.netns, "lqpn": q.qpn,
        "rqpn": q.dest_qp, "type": q.qp_type, "state": q.state, "sq_psn": q.next_psn,
        "rq_psn": q.expected_psn, "una_psn": q.una_psn, "sq_outstanding": q.sq_outstanding,
        "rq_outstanding": q.rq_outstanding, "retries": q.counter("retransmits"),
        "timeouts": q.counter("timeouts"), "rnr_retries": q.counter("rnr_naks_rcvd"),
        "rate_bps": q.rate_bps, "counters": map(&q.counters) })
}

/// `ferroce res qp --json`: one object per QP.
pub fn res_qp_json(v: &[NicStat]) -> Value {
    Value::Array(
        v.iter()
            .flat_map(|n| n.qps.iter().map(move |q| qp_json(n, q)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nic(pid: u32, name: &str) -> NicStat {
        NicStat {
            pid,
            comm: "ferroce".into(),
            name: name.into(),
            backend: "loopback".into(),
            qps: vec![
                QpStat {
                    qpn: 17,
                    qp_type: "RC".into(),
                    state: "RTS".into(),
                    rate_bps: 25_000_000_000,
                    counters: vec![("retransmits".into(), 3), ("timeouts".into(), 1)],
                    ..QpStat::default()
                },
                QpStat {
                    qpn: 18,
                    counters: vec![("retransmits".into(), 4)],
                    ..QpStat::default()
                },
            ],
            ..NicStat::default()
        }
    }

    #[test]
    fn selection_by_device_and_process() {
        let all = vec![nic(1, "ferroce_lo"), nic(2, "ferroce_eth0")];
        assert_eq!(select(all.clone(), Some("lo"), None).unwrap()[0].pid, 1);
        assert_eq!(
            select(all.clone(), Some("ferroce_eth0"), None).unwrap()[0].pid,
            2
        );
        assert_eq!(select(all.clone(), None, Some(2)).unwrap().len(), 1);
        assert_eq!(
            select(all, Some("eth9"), None),
            Err(StatError::NoSuchDevice("eth9".into()))
        );
    }

    #[test]
    fn totals_and_lines() {
        let n = nic(7, "ferroce_lo");
        assert_eq!(
            qp_totals(&n),
            vec![("retransmits".into(), 7), ("timeouts".into(), 1)]
        );
        let t = res_qp_text(std::slice::from_ref(&n));
        assert!(
            t.starts_with("link ferroce_lo/1 lqpn 17 rqpn 0 type RC state RTS "),
            "{t}"
        );
        assert!(
            t.contains(" retries 3 timeouts 1 rnr-retries 0 rate 25.00Gb/s pid 7 "),
            "{t}"
        );
        assert_eq!(res_qp_json(std::slice::from_ref(&n))[1]["retries"], 4);
        assert_eq!(stat_json(&[n])[0]["qp_totals"]["retransmits"], 7);
    }
}
