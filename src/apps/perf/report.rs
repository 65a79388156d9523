//! perftest's arithmetic and text: the bandwidth and latency figures computed from the post
//! and completion timestamps the way perftest 4.5-0.17 (internal version 6.06) computes them
//! (`print_report_bw`, `print_report_lat`, `print_report_lat_duration`), and every line it
//! prints around them (the test-information block, the address lines, the result lines, the
//! `--out_json` file), so that a script written for perftest's output reads ferroce's.
//!
//! The formats were read from perftest's sources and checked against the real tools' output
//! in the rxe guest (`tools/rxe-peer`): the printf conversions are restated here, including
//! C's `%#0Nx` (no `0x` for zero) and glibc's `-nan`.

use super::{Output, PerfConfig, Test, Verb};
use crate::oob::perftest::KeyMsg;
use serde::Serialize;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// perftest's `RESULT_LINE`.
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// One bandwidth result line (`struct bw_report_data`): in MB/s (2^20 bytes per second, as
/// perftest's "MB/sec" is) or Gb/s (10^9 bits) with `--report_gbits`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BwLine {
    /// Message size in bytes.
    pub bytes: u32,
    /// perftest's "#iterations": the iterations of every QP together.
    pub iterations: u64,
    /// Peak bandwidth (MB/s or Gb/s).
    pub bw_peak: f64,
    /// Average bandwidth (MB/s or Gb/s).
    pub bw_avg: f64,
    /// Message rate in millions per second.
    pub msg_rate_mpps: f64,
}

impl BwLine {
    /// The sum perftest prints for a bidirectional test (`print_full_bw_report` with both
    /// reports): this side's size and iterations, the sums of the rates.
    pub fn plus(&self, remote: &BwLine) -> BwLine {
        BwLine {
            bytes: self.bytes,
            iterations: self.iterations,
            bw_peak: self.bw_peak + remote.bw_peak,
            bw_avg: self.bw_avg + remote.bw_avg,
            msg_rate_mpps: self.msg_rate_mpps + remote.msg_rate_mpps,
        }
    }
}

/// One latency result line (`print_report_lat`), in µs (or cycles-free µs: ferroce measures
/// with the monotonic clock).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LatLine {
    /// Message size in bytes.
    pub bytes: u32,
    /// Iterations measured.
    pub iterations: u64,
    /// Smallest latency (µs).
    pub t_min: f64,
    /// Largest latency (µs).
    pub t_max: f64,
    /// Median latency (µs).
    pub t_typical: f64,
    /// Average latency (µs).
    pub t_avg: f64,
    /// Standard deviation (µs).
    pub t_stdev: f64,
    /// 99th percentile (µs).
    pub p99: f64,
    /// 99.9th percentile (µs).
    pub p999: f64,
}

/// A latency run measured for a time (`-D`): `print_report_lat_duration`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LatDurationLine {
    /// Message size in bytes.
    pub bytes: u32,
    /// Iterations completed.
    pub iterations: u64,
    /// Average latency (µs).
    pub t_avg: f64,
    /// Transactions per second.
    pub tps: f64,
}

/// The result of a run.
#[derive(Clone, Debug, Serialize)]
pub enum Report {
    /// A bandwidth test's lines.
    Bw(Vec<BwLine>),
    /// A latency test's lines.
    Lat(Vec<LatLine>),
    /// A latency test run for a time (`-D`).
    LatDuration(Vec<LatDurationLine>),
}

/// perftest's divisor for its bandwidth unit: MiB for "MB/sec", 125,000,000 bytes for Gb/s.
pub fn format_factor(gbits: bool) -> f64 {
    if gbits {
        125_000_000.0
    } else {
        f64::from(0x10_0000)
    }
}

/// The timestamps of a bandwidth run (`tposted` / `tcompleted`).
///
/// With peak measurement (perftest's default up to 20,000 iterations) every post and every
/// completion is stamped; without (`-N`, longer runs, the passive SEND side, `-D`) only the
/// start and the end.
#[derive(Debug)]
pub struct BwStamps {
    /// Only the start and the end are stamped.
    pub no_peak: bool,
    /// Post times (one, the start, with `no_peak`).
    pub posted: Vec<Option<Instant>>,
    /// Completion times (one, the end, with `no_peak`).
    pub completed: Vec<Option<Instant>>,
}

impl BwStamps {
    /// Room for `total` stamps of each kind (one with `no_peak`).
    pub fn new(no_peak: bool, total: usize) -> Self {
        let n = if no_peak { 1 } else { total.max(1) };
        BwStamps {
            no_peak,
            posted: vec![None; n],
            completed: vec![None; n],
        }
    }
    /// Stamp post `i` (ignored past the end).
    pub fn post(&mut self, i: usize) {
        if let Some(s) = self.posted.get_mut(i) {
            *s = Some(Instant::now());
        }
    }
    /// Stamp completion `i` (ignored past the end).
    pub fn complete(&mut self, i: usize) {
        if let Some(s) = self.completed.get_mut(i) {
            *s = Some(Instant::now());
        }
    }
    /// Stamp the start (without peak measurement).
    pub fn start(&mut self) {
        self.posted[0] = Some(Instant::now());
    }
    /// Stamp the end (without peak measurement).
    pub fn end(&mut self) {
        self.completed[0] = Some(Instant::now());
    }
}

/// `print_report_bw`'s arithmetic for `n` messages of `size` bytes in all (perftest's
/// `num_of_calculated_iters`), with CQ moderation `cq_mod` and post lists of `post_list`.
pub fn bw_line(
    st: &BwStamps,
    size: u32,
    n: u64,
    cq_mod: u32,
    post_list: u32,
    gbits: bool,
    sizes_factor: f64,
) -> BwLine {
    let secs = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
        (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    let nn = n as usize;
    let last = if st.no_peak { 0 } else { nn.saturating_sub(1) };
    let total = secs(
        st.posted.first().copied().flatten(),
        st.completed.get(last).copied().flatten(),
    );
    let tsize = f64::from(size) * sizes_factor;
    let ff = format_factor(gbits);
    let (bw_avg, msg_rate) = if total > 0.0 {
        (tsize * n as f64 / (total * ff), n as f64 / (total * 1e6))
    } else {
        (0.0, 0.0)
    };
    let mut bw_peak = 0.0;
    if !st.no_peak && nn > 0 {
        // The shortest time per message over every stretch from a post to a later
        // completion (the first post to the first completion to begin with; perftest's
        // unset stamp is 0, and its unsigned difference is huge).
        let mut opt = match (st.posted[0], st.completed[0]) {
            (Some(_), Some(_)) => secs(st.posted[0], st.completed[0]),
            _ => f64::INFINITY,
        };
        let cq_mod = cq_mod.max(1) as usize;
        let step = post_list.max(1) as usize;
        let mut consider = |i: usize, j: usize| {
            if let (Some(p), Some(c)) = (st.posted[i], st.completed[j]) {
                let t = c.saturating_duration_since(p).as_secs_f64() / (j - i + 1) as f64;
                if t < opt {
                    opt = t;
                }
            }
        };
        let mut i = 0;
        while i < nn {
            let mut j = (i + 1).div_ceil(cq_mod) * cq_mod - 1;
            while j < nn {
                consider(i, j);
                j += cq_mod;
            }
            if nn % cq_mod != 0 {
                consider(i, nn - 1);
            }
            i += step;
        }
        if opt > 0.0 && opt.is_finite() {
            bw_peak = tsize / (opt * ff);
        }
    }
    BwLine {
        bytes: size,
        iterations: n,
        bw_peak,
        bw_avg,
        msg_rate_mpps: msg_rate,
    }
}

/// A duration-mode bandwidth line: `n` messages counted in the sample window of `window`.
pub fn bw_line_window(size: u32, n: u64, window: Duration, gbits: bool) -> BwLine {
    let t = window.as_secs_f64();
    let (bw_avg, rate) = if t > 0.0 {
        (
            f64::from(size) * n as f64 / (t * format_factor(gbits)),
            n as f64 / (t * 1e6),
        )
    } else {
        (0.0, 0.0)
    };
    BwLine {
        bytes: size,
        iterations: n,
        bw_peak: 0.0,
        bw_avg,
        msg_rate_mpps: rate,
    }
}

/// C's `(int)x` on x86-64: truncation toward zero, and the "integer indefinite" value
/// (`INT_MIN`) when the result does not fit (NaN included).
fn c_int(x: f64) -> i32 {
    if x.is_nan() || !(-2_147_483_648.0..2_147_483_648.0).contains(&x) {
        i32::MIN
    } else {
        x.trunc() as i32
    }
}

/// `print_report_lat`: from the post timestamps of one latency run (one per iteration), the
/// `iters - 1` round trips between consecutive posts, divided by 2 for SEND and WRITE (a
/// round trip is two one-way latencies) and by 1 for READ and ATOMIC; sorted; the largest 2
/// dropped; the median (the mean of the two middle values for an even count), the mean, the
/// standard deviation (with perftest's integer truncations), the smallest, the largest kept,
/// and the 99 % / 99.9 % entries.
pub fn lat_line(posted: &[Instant], size: u32, iters: u64, verb: Verb) -> LatLine {
    let rtt = if matches!(verb, Verb::Read | Verb::Atomic) {
        1.0
    } else {
        2.0
    };
    let mut d: Vec<f64> = posted
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]).as_secs_f64() * 1e6 / rtt)
        .collect();
    d.sort_by(|a, b| a.total_cmp(b));
    let n = d.len().saturating_sub(2);
    let at = |i: usize| d.get(i).copied().unwrap_or(0.0);
    let median = if n == 0 {
        0.0
    } else if (n - 1) % 2 == 1 {
        (at(n / 2) + at(n / 2 - 1)) / 2.0
    } else {
        at(n / 2)
    };
    let sum: f64 = d[..n].iter().sum();
    let avg = if n > 0 { sum / n as f64 } else { 0.0 };
    let mut var_sum = 0.0f64;
    for &x in &d[..n] {
        let t = c_int(avg - x);
        let p = c_int(f64::from(t) * f64::from(t));
        var_sum += f64::from(p);
    }
    // A negative sum (an overflowed square) gives glibc's -nan, as on x86.
    let stdev = if var_sum < 0.0 {
        -f64::NAN
    } else {
        (var_sum / n as f64).sqrt()
    };
    let i99 = (n as f64 * 0.99).ceil() as usize;
    let i999 = (n as f64 * 0.999).ceil() as usize;
    LatLine {
        bytes: size,
        iterations: iters,
        t_min: at(0),
        t_max: at(n),
        t_typical: median,
        t_avg: avg,
        t_stdev: stdev,
        p99: at(i99),
        p999: at(i999),
    }
}

/// `print_report_lat_duration`: the mean latency and transactions per second of `iters`
/// round trips in `window`.
pub fn lat_duration_line(size: u32, iters: u64, window: Duration, verb: Verb) -> LatDurationLine {
    let rtt = if matches!(verb, Verb::Read | Verb::Atomic) {
        1.0
    } else {
        2.0
    };
    let us = window.as_secs_f64() * 1e6;
    let it = iters.max(1) as f64;
    LatDurationLine {
        bytes: size,
        iterations: iters,
        t_avg: us / rtt / it,
        tps: if us > 0.0 {
            iters as f64 / (us / 1e6)
        } else {
            0.0
        },
    }
}

/// glibc's `%f` of a NaN or infinity (`-nan`, `nan`, `inf`, `-inf`); `None` for a finite value.
fn c_special(x: f64) -> Option<&'static str> {
    if x.is_nan() {
        Some(if x.is_sign_negative() { "-nan" } else { "nan" })
    } else if x.is_infinite() {
        Some(if x > 0.0 { "inf" } else { "-inf" })
    } else {
        None
    }
}

/// `%-W.Pf`.
fn f_left(x: f64, width: usize, prec: usize) -> String {
    match c_special(x) {
        Some(s) => format!("{s:<width$}"),
        None => format!("{x:<width$.prec$}"),
    }
}

/// C's `%#0Nx`: zero-padded to N characters with a `0x` prefix, except for zero, which C
/// prints without the prefix (`%#04x` of 0 is `0000`).
pub fn c_alt_hex(v: u64, width: usize) -> String {
    if v == 0 {
        format!("{:0width$}", 0)
    } else {
        format!("{v:#0width$x}")
    }
}

/// perftest's bandwidth line (`REPORT_FMT`, or `REPORT_FMT_EXT` below 0.1 Gb/s), without the
/// newline.
pub fn bw_text(l: &BwLine, gbits: bool) -> String {
    bw_text_as(l, gbits, l.bw_avg)
}

/// [`bw_text`] choosing the format by `own_avg`: perftest decides it from this side's own
/// average before it adds the peer's (`-b`).
pub fn bw_text_as(l: &BwLine, gbits: bool, own_avg: f64) -> String {
    if gbits && own_avg < 0.1 {
        format!(
            " {:<7}    {}           {}            {}            {}",
            l.bytes,
            l.iterations,
            f_left(l.bw_peak, 7, 6),
            f_left(l.bw_avg, 7, 6),
            f_left(l.msg_rate_mpps, 7, 6)
        )
    } else {
        format!(
            " {:<7}    {:<10}       {}            {}\t\t   {}",
            l.bytes,
            l.iterations,
            f_left(l.bw_peak, 7, 2),
            f_left(l.bw_avg, 7, 2),
            f_left(l.msg_rate_mpps, 7, 6)
        )
    }
}

/// perftest's latency line (`REPORT_FMT_LAT`), without the newline.
pub fn lat_text(l: &LatLine) -> String {
    format!(
        " {:<7} {}          {}        {}      {}  \t       {}     \t{}\t\t{} \t\t{}",
        l.bytes,
        l.iterations,
        f_left(l.t_min, 7, 2),
        f_left(l.t_max, 7, 2),
        f_left(l.t_typical, 7, 2),
        f_left(l.t_avg, 7, 2),
        f_left(l.t_stdev, 7, 2),
        f_left(l.p99, 7, 2),
        f_left(l.p999, 7, 2)
    )
}

/// perftest's duration-mode latency line (`REPORT_FMT_LAT_DUR`).
pub fn lat_duration_text(l: &LatDurationLine) -> String {
    format!(
        " {:<7}       {}            {}        {}",
        l.bytes,
        l.iterations,
        f_left(l.t_avg, 7, 2),
        f_left(l.tps, 7, 2)
    )
}

/// The column header of the results (`RESULT_FMT`, `RESULT_FMT_G`, `RESULT_FMT_LAT`,
/// `RESULT_FMT_LAT_DUR`).
pub fn result_header(cfg: &PerfConfig) -> &'static str {
    if cfg.test.is_bw() {
        if cfg.report_gbits {
            " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
        } else {
            " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
        }
    } else if cfg.duration.is_some() {
        " #bytes        #iterations       t_avg[usec]    tps average"
    } else {
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
    }
}

/// What the test-information block says about this side.
#[derive(Clone, Debug)]
pub struct TestInfo {
    /// The device name as the user gave it (perftest prints its `-d`).
    pub device: String,
    /// The path MTU in bytes.
    pub mtu: u32,
    /// The GID index (`-x`).
    pub gid_index: u8,
    /// perftest's "client" machine (the sender in bandwidth tests), or `-b`: the header shows
    /// the TX depth.
    pub sender: bool,
    /// perftest's "server" machine, or `-b`: a SEND test's header shows the RX depth.
    pub receiver: bool,
    /// The outstanding READ/ATOMIC requests this side offers.
    pub out_reads: u16,
}

/// `ctx_print_test_info`: the block perftest prints before the exchange of addresses.
pub fn test_info(cfg: &PerfConfig, info: &TestInfo) -> String {
    let mut s = String::new();
    let verb = cfg.test.verb();
    let _ = writeln!(s, "{RESULT_LINE}");
    let mut title = format!("                    {} ", verb.perftest_name());
    if verb == Verb::Atomic {
        title.push_str(if cfg.cmp_swap {
            "CMP_AND_SWAP "
        } else {
            "FETCH_AND_ADD "
        });
    }
    if cfg.test.is_bw() {
        if cfg.duplex {
            title.push_str("Bidirectional ");
        }
        if cfg.post_list > 1 {
            title.push_str("Post List ");
        }
        title.push_str("BW ");
    } else {
        title.push_str("Latency ");
    }
    title.push_str("Test");
    let _ = writeln!(s, "{title}");
    if cfg.use_event {
        let _ = writeln!(s, " Test with events. Using {}_comp0", info.device);
    }
    let _ = writeln!(
        s,
        " Dual-port       : OFF\t\tDevice         : {}",
        info.device
    );
    let _ = writeln!(s, " Number of qps   : {}\t\tTransport type : IB", cfg.qps);
    let _ = writeln!(
        s,
        " Connection type : {}\t\tUsing SRQ      : {}",
        cfg.connection.name(),
        if cfg.use_srq { "ON" } else { "OFF" }
    );
    // ferroce has no PCIe (perftest built without relaxed-ordering support prints this), and
    // it posts with ibv_post_send, not the ibv_wr_* API.
    let _ = writeln!(s, " PCIe relax order: Unsupported");
    let _ = writeln!(s, " ibv_wr* API     : OFF");
    if info.sender {
        let _ = writeln!(s, " TX depth        : {}", cfg.tx_depth);
    }
    if cfg.post_list > 1 {
        let _ = writeln!(s, " Post List       : {}", cfg.post_list);
    }
    if cfg.recv_post_list > 1 {
        let _ = writeln!(s, " Recv Post List  : {}", cfg.recv_post_list);
    }
    if verb == Verb::Send && info.receiver {
        let _ = writeln!(s, " RX depth        : {}", cfg.rx_depth);
    }
    if cfg.test.is_bw() {
        let _ = writeln!(s, " CQ Moderation   : {}", cfg.cq_mod);
    }
    let _ = writeln!(s, " Mtu             : {}[B]", info.mtu);
    let _ = writeln!(s, " Link type       : Ethernet");
    let _ = writeln!(s, " GID index       : {}", info.gid_index);
    if matches!(verb, Verb::Read | Verb::Atomic) {
        let _ = writeln!(s, " Outstand reads  : {}", info.out_reads);
    } else {
        let _ = writeln!(s, " Max inline data : {}[B]", cfg.inline_size);
    }
    if cfg.rdma_cm {
        let _ = writeln!(s, " rdma_cm QPs\t : ON");
        let _ = writeln!(s, " Data ex. method : rdma_cm");
    } else if cfg.exchange_rdma_cm {
        let _ = writeln!(s, " rdma_cm QPs\t : OFF");
        let _ = writeln!(s, " Data ex. method : rdma_cm");
    } else {
        let _ = writeln!(s, " rdma_cm QPs\t : OFF");
        let _ = writeln!(s, " Data ex. method : Ethernet");
    }
    let _ = write!(s, "{RESULT_LINE}");
    s
}

/// `ctx_print_pingpong_data`: one QP's address line and GID line (`side` is "local" or
/// "remote"). READ tests add the outstanding reads, READ and WRITE tests the R_Key and
/// address.
pub fn address_text(side: &str, k: &KeyMsg, verb: Verb) -> String {
    let mut s = format!(
        " {side} address: LID {} QPN {} PSN {}",
        c_alt_hex(u64::from(k.lid), 4),
        c_alt_hex(u64::from(k.qpn), 6),
        c_alt_hex(u64::from(k.psn), 6)
    );
    if verb == Verb::Read {
        s.push_str(&format!(" OUT {}", c_alt_hex(u64::from(k.out_reads), 4)));
    }
    if matches!(verb, Verb::Read | Verb::Write) {
        s.push_str(&format!(
            " RKey {} VAddr {}",
            c_alt_hex(u64::from(k.rkey), 8),
            c_alt_hex(k.vaddr, 16)
        ));
    }
    let gid: Vec<String> = k.gid.iter().map(|b| format!("{b:02}")).collect();
    s.push_str(&format!("\n GID: {}", gid.join(":")));
    s
}

/// The `--out_json` file for a bandwidth line, as perftest writes it (its own brace-and-comma
/// text, not strict JSON).
pub fn json_bw(cfg: &PerfConfig, info: &TestInfo, l: &BwLine, own_avg: f64) -> String {
    let mut s = String::from("{\n");
    s.push_str(&json_test_info(cfg, info));
    s.push_str("results: {\n");
    let inc = own_avg < 0.1 && cfg.report_gbits;
    match cfg.output {
        Output::Bandwidth => {
            let _ = writeln!(s, "bw_avg: {:.6},", l.bw_avg);
        }
        Output::MessageRate => {
            let _ = writeln!(s, "msgRate_avg: {:.6},", l.msg_rate_mpps);
        }
        _ => {
            let p = if inc { 6 } else { 2 };
            let _ = write!(
                s,
                "MsgSize: {},\nn_iterations: {},\nBW_peak: {:.p$},\nBW_average: {:.p$},\nMsgRate: {:.6},\n",
                l.bytes, l.iterations, l.bw_peak, l.bw_avg, l.msg_rate_mpps
            );
        }
    }
    s.push_str("},\n}\n");
    s
}

/// The `--out_json` file for a latency line.
pub fn json_lat(cfg: &PerfConfig, info: &TestInfo, l: &LatLine) -> String {
    let mut s = String::from("{\n");
    s.push_str(&json_test_info(cfg, info));
    s.push_str("results: {\n");
    if cfg.output == Output::Latency {
        let _ = writeln!(s, "avg_lat: {:.6},", l.t_avg);
    } else {
        let _ = write!(
            s,
            "MsgSize: {},\nn_iterations: {},\nt_min: {:.2},\nt_max: {:.2},\nt_typical: {:.2},\nt_avg: {:.2},\nt_stdev: {:.2},\npercentile_99: {:.2},\npercentile_99.9: {:.2},\n",
            l.bytes, l.iterations, l.t_min, l.t_max, l.t_typical, l.t_avg, l.t_stdev, l.p99, l.p999
        );
    }
    s.push_str("},\n}\n");
    s
}

/// The `--out_json` file for a duration-mode latency line.
pub fn json_lat_duration(cfg: &PerfConfig, info: &TestInfo, l: &LatDurationLine) -> String {
    let mut s = String::from("{\n");
    s.push_str(&json_test_info(cfg, info));
    s.push_str("results: {\n");
    if cfg.output == Output::Latency {
        let _ = writeln!(s, "t_avg: {:.6}", l.t_avg);
    } else {
        let _ = write!(
            s,
            "MsgSize: {},\nn_iterations: {},\nt_avg: {:.2},\ntps_average: {:.2},\n",
            l.bytes, l.iterations, l.t_avg, l.tps
        );
    }
    s.push_str("},\n}\n");
    s
}

/// `write_test_info_to_file`.
fn json_test_info(cfg: &PerfConfig, info: &TestInfo) -> String {
    let mut s = String::from("test_info: {\n");
    let verb = cfg.test.verb();
    let mut t = format!("test: {}_", verb.perftest_name());
    if verb == Verb::Atomic {
        t.push_str(if cfg.cmp_swap {
            "CMP_AND_SWAP_"
        } else {
            "FETCH_AND_ADD_"
        });
    }
    if cfg.test.is_bw() {
        if cfg.duplex {
            t.push_str("Bidirectional_");
        }
        if cfg.post_list > 1 {
            t.push_str("Post_List_");
        }
        t.push_str("BW_");
    } else {
        t.push_str("Latency_");
    }
    t.push_str("Test,");
    let _ = writeln!(s, "{t}");
    if cfg.use_event {
        let _ = writeln!(s, "Test with events: Using_{}_comp0,", info.device);
    }
    let _ = writeln!(s, "Dual_port: OFF,\nDevice: \"{}\",", info.device);
    let _ = writeln!(s, "Number_of_qps: {},\nTransport_type: IB,", cfg.qps);
    let _ = writeln!(
        s,
        "Connection_type: {},\nUsing_SRQ: {},",
        cfg.connection.name(),
        if cfg.use_srq { "ON" } else { "OFF" }
    );
    let _ = writeln!(s, " PCIe_relax_order: Unsupported,");
    let _ = writeln!(s, "ibv_wr_API: OFF,");
    if info.sender {
        let _ = writeln!(s, "TX_depth : {},", cfg.tx_depth);
    }
    if cfg.post_list > 1 {
        let _ = writeln!(s, "Post_List: {},", cfg.post_list);
    }
    if cfg.recv_post_list > 1 {
        let _ = writeln!(s, "Recv_Post_List: {},", cfg.recv_post_list);
    }
    if verb == Verb::Send && info.receiver {
        let _ = writeln!(s, "RX_depth: {},", cfg.rx_depth);
    }
    if cfg.test.is_bw() {
        let _ = writeln!(s, "CQ_Moderation: {},", cfg.cq_mod);
    }
    let _ = writeln!(s, "Mtu: {},\nLink_type: Ethernet,", info.mtu);
    let _ = writeln!(s, "GID_index: {},", info.gid_index);
    if matches!(verb, Verb::Read | Verb::Atomic) {
        let _ = writeln!(s, "Outstand_reads: {},", info.out_reads);
    } else {
        let _ = writeln!(s, "Max_inline_data: {},", cfg.inline_size);
    }
    if cfg.rdma_cm {
        let _ = writeln!(s, "rdma_cm_QPs: ON,\nData_ex_method: rdma_cm,");
    } else if cfg.exchange_rdma_cm {
        let _ = writeln!(s, "rdma_cm_QPs: OFF,\nData_ex_method: rdma_cm,");
    } else {
        let _ = writeln!(s, "rdma_cm_QPs: OFF,\nData_ex_method: Ethernet,");
    }
    s.push_str("},\n");
    s
}

/// The latency test's value for `--output latency` (perftest prints the mean).
pub fn output_lat(l: &LatLine) -> String {
    format!("{:.6}", l.t_avg)
}

/// The bandwidth test's value for `--output bandwidth|message_rate`.
pub fn output_bw(cfg: &PerfConfig, l: &BwLine) -> String {
    if cfg.output == Output::MessageRate {
        format!("{:.6}", l.msg_rate_mpps)
    } else {
        format!("{:.6}", l.bw_avg)
    }
}

/// Whether a test family prints this line (used by `lines`, the short form of the results).
pub fn lines(r: &Report, gbits: bool) -> Vec<String> {
    match r {
        Report::Bw(v) => v.iter().map(|l| bw_text(l, gbits)).collect(),
        Report::Lat(v) => v.iter().map(lat_text).collect(),
        Report::LatDuration(v) => v.iter().map(lat_duration_text).collect(),
    }
}

/// The test a result header belongs to (for the demo's short table).
pub fn header_for(test: Test, gbits: bool) -> &'static str {
    let cfg = PerfConfig {
        test,
        report_gbits: gbits,
        ..PerfConfig::default()
    };
    result_header(&cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_alt_hex_matches_printf() {
        // From perftest's output on rxe: LID 0 as %#04x, QPN 0x11 as %#06x, a 24-bit PSN,
        // an R_Key as %#08x, an address as %#016llx.
        assert_eq!(c_alt_hex(0, 4), "0000");
        assert_eq!(c_alt_hex(0x11, 6), "0x0011");
        assert_eq!(c_alt_hex(0x1e3e, 6), "0x1e3e");
        assert_eq!(c_alt_hex(0xc02b58, 6), "0xc02b58");
        assert_eq!(c_alt_hex(0x2a4, 8), "0x0002a4");
        assert_eq!(c_alt_hex(0x29e1b184, 8), "0x29e1b184");
        assert_eq!(c_alt_hex(0x7fe637a07000, 16), "0x007fe637a07000");
    }

    #[test]
    fn result_lines_match_perftest_output() {
        // Lines printed by perftest 4.5-0.17 in the rxe guest (tools/rxe-peer).
        let l = BwLine {
            bytes: 65536,
            iterations: 50,
            bw_peak: 0.24,
            bw_avg: 0.18,
            msg_rate_mpps: 0.000349,
        };
        assert_eq!(
            bw_text(&l, true),
            " 65536      50               0.24               0.18   \t\t   0.000349"
        );
        let l = BwLine {
            bytes: 4096,
            iterations: 80,
            bw_peak: 9.99,
            bw_avg: 6.85,
            msg_rate_mpps: 0.001754,
        };
        assert_eq!(
            bw_text(&l, false),
            " 4096       80               9.99               6.85   \t\t   0.001754"
        );
        let l = LatLine {
            bytes: 32,
            iterations: 5,
            t_min: 456.11,
            t_max: 1389.79,
            t_typical: 717.30,
            t_avg: 717.30,
            t_stdev: 261.0,
            p99: 1389.79,
            p999: 1389.79,
        };
        assert_eq!(
            lat_text(&l),
            " 32      5          456.11         1389.79      717.30   \t       717.30      \t261.00 \t\t1389.79 \t\t1389.79"
        );
    }

    #[test]
    fn latency_statistics_follow_perftest() {
        // 7 posts, 6 round trips of 10, 20, ..., 60 us (one-way 5..30): the largest two are
        // dropped, 4 remain (5, 10, 15, 20): median (10 + 15) / 2, max = the largest kept + 1
        // (perftest prints delta[measure_cnt], the first dropped one), 99 % likewise.
        let t0 = Instant::now();
        let mut posted = vec![t0];
        let mut t = t0;
        for k in 1..=6u64 {
            t += Duration::from_micros(10 * k);
            posted.push(t);
        }
        let l = lat_line(&posted, 2, 7, Verb::Send);
        assert!((l.t_min - 5.0).abs() < 1e-6);
        assert!((l.t_typical - 12.5).abs() < 1e-6);
        assert!((l.t_avg - 12.5).abs() < 1e-6);
        assert!((l.t_max - 25.0).abs() < 1e-6);
        assert!((l.p99 - 25.0).abs() < 1e-6);
        // stdev with integer truncation: deviations (int)(12.5 - x) = 7, 2, -2, -7
        assert!((l.t_stdev - (106.0f64 / 4.0).sqrt()).abs() < 1e-9);
    }

    #[test]
    fn huge_latency_deviation_prints_minus_nan_as_perftest_does() {
        // perftest squares an int: a deviation past 46,340 us overflows and the standard
        // deviation comes out as -nan (seen on rxe: "-nan" for 8 MiB write_lat -a).
        let t0 = Instant::now();
        let posted = [
            t0,
            t0 + Duration::from_millis(10),
            t0 + Duration::from_millis(400),
            t0 + Duration::from_millis(1400),
            t0 + Duration::from_millis(1500),
            t0 + Duration::from_millis(1600),
        ];
        let l = lat_line(&posted, 2, 6, Verb::Read);
        assert!(l.t_stdev.is_nan());
        assert!(f_left(l.t_stdev, 7, 2).starts_with("-nan"));
    }

    #[test]
    fn bandwidth_units_are_mib_and_gigabits() {
        let mut st = BwStamps::new(true, 1);
        let t0 = Instant::now();
        st.posted[0] = Some(t0);
        st.completed[0] = Some(t0 + Duration::from_secs(1));
        let l = bw_line(&st, 1 << 20, 100, 1, 1, false, 1.0);
        assert!((l.bw_avg - 100.0).abs() < 1e-9, "{}", l.bw_avg);
        assert_eq!(l.bw_peak, 0.0);
        let g = bw_line(&st, 1 << 20, 100, 1, 1, true, 1.0);
        assert!((g.bw_avg - 100.0 * 1048576.0 * 8.0 / 1e9).abs() < 1e-9);
        assert!((l.msg_rate_mpps - 100e-6).abs() < 1e-12);
    }

    #[test]
    fn peak_with_moderated_completions() {
        // 4 messages, a completion for every second (cq_mod 2): stamps at 1 and 3 only.
        let t0 = Instant::now();
        let ms = |m: u64| Some(t0 + Duration::from_millis(m));
        let st = BwStamps {
            no_peak: false,
            posted: vec![ms(0), ms(1), ms(2), ms(3)],
            completed: vec![None, ms(11), None, ms(20)],
        };
        let l = bw_line(&st, 1 << 20, 4, 2, 1, false, 1.0);
        // stretches: 0..1 11/2, 0..3 20/4, 1..3 19/3, 2..3 18/2, 3..3 17: best 5 ms
        assert!((l.bw_peak - 1.0 / 0.005).abs() < 1e-6, "{}", l.bw_peak);
    }

    #[test]
    fn peak_is_the_best_stretch() {
        // 4 messages, one completion per message: posts at 0,1,2,3 ms, completions at
        // 10, 11, 12, 13 ms; the best stretch is all four: 13 ms / 4.
        let t0 = Instant::now();
        let ms = |m: u64| Some(t0 + Duration::from_millis(m));
        let st = BwStamps {
            no_peak: false,
            posted: vec![ms(0), ms(1), ms(2), ms(3)],
            completed: vec![ms(10), ms(11), ms(12), ms(13)],
        };
        let l = bw_line(&st, 1 << 20, 4, 1, 1, false, 1.0);
        assert!((l.bw_peak - 1.0 / 0.00325).abs() < 1e-6, "{}", l.bw_peak);
        assert!((l.bw_avg - 4.0 / 0.013).abs() < 1e-6);
    }
}
