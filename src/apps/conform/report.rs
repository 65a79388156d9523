//! The report: a human table, TAP (version 13) or JUnit XML.

use super::ctx::{Outcome, Verdict};
use super::peer::PeerTool;
use std::fmt::Write as _;
use std::path::PathBuf;

/// One test's result with everything the report shows.
#[derive(Clone, Debug)]
pub struct TestResult {
    /// The test's id.
    pub id: &'static str,
    /// Its group's name.
    pub group: &'static str,
    /// Its title.
    pub title: &'static str,
    /// The IBTA rule it checks.
    pub rule: &'static str,
    /// The rule in our words.
    pub summary: &'static str,
    /// What the peer must do.
    pub must: &'static str,
    /// How it is observed.
    pub observes: &'static str,
    /// What happened.
    pub outcome: Outcome,
    /// The test's capture, if one was written.
    pub capture: Option<PathBuf>,
    /// How long it took (seconds).
    pub secs: f64,
}

/// The whole run.
#[derive(Clone, Debug)]
pub struct Report {
    /// The peer tool tested.
    pub tool: PeerTool,
    /// Lines about the peer and the tester (one per session opened, at most a few).
    pub about: Vec<String>,
    /// One per test, in catalogue order.
    pub results: Vec<TestResult>,
}

impl Report {
    /// How many tests got verdict `v`.
    pub fn count(&self, v: Verdict) -> usize {
        self.results
            .iter()
            .filter(|r| r.outcome.verdict == v)
            .count()
    }
    /// "66 tests: 40 pass, 2 fail, 20 n/a, 4 inconclusive".
    pub fn summary(&self) -> String {
        format!(
            "{} tests against {}: {} pass, {} fail, {} not applicable, {} inconclusive",
            self.results.len(),
            self.tool.program(),
            self.count(Verdict::Pass),
            self.count(Verdict::Fail),
            self.count(Verdict::NotApplicable),
            self.count(Verdict::Inconclusive)
        )
    }
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// The human table: one line per test, then the details of every failed or inconclusive one.
pub fn table(r: &Report, verbose: bool) -> String {
    let mut s = String::new();
    for a in &r.about {
        let _ = writeln!(s, "# {a}");
    }
    let w = r
        .results
        .iter()
        .map(|t| t.id.len())
        .max()
        .unwrap_or(10)
        .max(4);
    let _ = writeln!(
        s,
        "{:<w$}  {:<12}  {:<32}  WHAT THE PEER DID",
        "TEST", "VERDICT", "RULE"
    );
    for t in &r.results {
        let o = &t.outcome;
        let what = match o.verdict {
            Verdict::Pass => o.did.last().cloned().unwrap_or_default(),
            _ => o.why.first().cloned().unwrap_or_default(),
        };
        let _ = writeln!(
            s,
            "{:<w$}  {:<12}  {:<32}  {}",
            t.id,
            o.verdict.word(),
            t.rule.chars().take(32).collect::<String>(),
            one_line(&what)
        );
    }
    for t in &r.results {
        let o = &t.outcome;
        if !verbose && !matches!(o.verdict, Verdict::Fail | Verdict::Inconclusive) {
            continue;
        }
        let _ = writeln!(s, "\n== {} ({}): {}", t.id, o.verdict.word(), t.title);
        let _ = writeln!(s, "   rule:     {} — {}", t.rule, t.summary);
        let _ = writeln!(s, "   must:     {}", t.must);
        let _ = writeln!(s, "   observed: {}", t.observes);
        for d in &o.did {
            let _ = writeln!(s, "   | {}", one_line(d));
        }
        for w in &o.why {
            let _ = writeln!(s, "   => {}", one_line(w));
        }
        if let Some(c) = &t.capture {
            let _ = writeln!(s, "   capture:  {}", c.display());
        }
    }
    let _ = writeln!(s, "\n{}", r.summary());
    s
}

/// TAP version 13 (not applicable and inconclusive tests are `# SKIP`).
pub fn tap(r: &Report) -> String {
    let mut s = String::from("TAP version 13\n");
    let _ = writeln!(s, "1..{}", r.results.len());
    for (i, t) in r.results.iter().enumerate() {
        let o = &t.outcome;
        let why = one_line(&o.why.join("; "));
        match o.verdict {
            Verdict::Pass => {
                let _ = writeln!(s, "ok {} - {} # {}", i + 1, t.id, t.rule);
            }
            Verdict::Fail => {
                let _ = writeln!(s, "not ok {} - {} # {}", i + 1, t.id, t.rule);
            }
            Verdict::NotApplicable => {
                let _ = writeln!(s, "ok {} - {} # SKIP not applicable: {why}", i + 1, t.id);
            }
            Verdict::Inconclusive => {
                let _ = writeln!(s, "ok {} - {} # SKIP inconclusive: {why}", i + 1, t.id);
            }
        }
        if matches!(o.verdict, Verdict::Fail | Verdict::Inconclusive) {
            let _ = writeln!(s, "  ---\n  message: {:?}", why);
            let _ = writeln!(s, "  must: {:?}", t.must);
            let _ = writeln!(s, "  did:");
            for d in &o.did {
                let _ = writeln!(s, "    - {:?}", one_line(d));
            }
            if let Some(c) = &t.capture {
                let _ = writeln!(s, "  capture: {:?}", c.display().to_string());
            }
            let _ = writeln!(s, "  ...");
        }
    }
    s
}

fn xml(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// JUnit XML (not applicable and inconclusive tests are `<skipped>`).
pub fn junit(r: &Report) -> String {
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let time: f64 = r.results.iter().map(|t| t.secs).sum();
    let skipped = r.count(Verdict::NotApplicable) + r.count(Verdict::Inconclusive);
    let _ = writeln!(
        s,
        "<testsuites name=\"ferroce-conform\" tests=\"{}\" failures=\"{}\" skipped=\"{skipped}\" time=\"{time:.3}\">",
        r.results.len(),
        r.count(Verdict::Fail)
    );
    let _ = writeln!(
        s,
        "  <testsuite name=\"ferroce-conform.{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{skipped}\" time=\"{time:.3}\">",
        r.tool.name(),
        r.results.len(),
        r.count(Verdict::Fail)
    );
    if !r.about.is_empty() {
        let _ = writeln!(s, "    <properties>");
        for (i, a) in r.about.iter().enumerate() {
            let _ = writeln!(s, "      <property name=\"peer{i}\" value=\"{}\"/>", xml(a));
        }
        let _ = writeln!(s, "    </properties>");
    }
    for t in &r.results {
        let o = &t.outcome;
        let _ = write!(
            s,
            "    <testcase classname=\"{}.{}\" name=\"{}\" time=\"{:.3}\">",
            r.tool.name(),
            t.group,
            xml(t.id),
            t.secs
        );
        let why = xml(&one_line(&o.why.join("; ")));
        match o.verdict {
            Verdict::Pass => {}
            Verdict::Fail => {
                let _ = write!(
                    s,
                    "\n      <failure message=\"{why}\" type=\"{}\">",
                    xml(t.rule)
                );
                for d in &o.did {
                    let _ = write!(s, "\n{}", xml(d));
                }
                let _ = write!(s, "</failure>");
            }
            Verdict::NotApplicable => {
                let _ = write!(s, "\n      <skipped message=\"not applicable: {why}\"/>");
            }
            Verdict::Inconclusive => {
                let _ = write!(s, "\n      <skipped message=\"inconclusive: {why}\"/>");
            }
        }
        let mut out = format!("{} — {}\nmust: {}\n", t.rule, t.summary, t.must);
        for d in &o.did {
            out.push_str(d);
            out.push('\n');
        }
        if let Some(c) = &t.capture {
            let _ = writeln!(out, "capture: {}", c.display());
        }
        let _ = write!(s, "\n      <system-out>{}</system-out>", xml(&out));
        let _ = writeln!(s, "\n    </testcase>");
    }
    let _ = writeln!(s, "  </testsuite>\n</testsuites>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::conform::ctx::Outcome;

    fn rep() -> Report {
        let mk = |id, v, why: &str| TestResult {
            id,
            group: "psn",
            title: "t",
            rule: "IBTA Vol 1 §9.7.5.1.1",
            summary: "s",
            must: "m",
            observes: "o",
            outcome: Outcome {
                verdict: v,
                did: vec!["sent <x> & \"y\"".into()],
                why: if why.is_empty() {
                    vec![]
                } else {
                    vec![why.into()]
                },
            },
            capture: None,
            secs: 0.25,
        };
        Report {
            tool: PeerTool::Pingpong,
            about: vec!["peer <1>".into()],
            results: vec![
                mk("a.pass", Verdict::Pass, ""),
                mk("b.fail", Verdict::Fail, "no NAK"),
                mk("c.na", Verdict::NotApplicable, "no R_Key"),
                mk("d.inc", Verdict::Inconclusive, "cannot see"),
            ],
        }
    }

    #[test]
    fn tap_has_a_plan_and_one_line_per_test() {
        let t = tap(&rep());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "TAP version 13");
        assert_eq!(lines[1], "1..4");
        assert!(t.contains("ok 1 - a.pass"));
        assert!(t.contains("not ok 2 - b.fail"));
        assert!(t.contains("ok 3 - c.na # SKIP not applicable: no R_Key"));
        assert!(t.contains("ok 4 - d.inc # SKIP inconclusive: cannot see"));
    }

    #[test]
    fn junit_counts_and_escapes() {
        let j = junit(&rep());
        assert!(j.contains("tests=\"4\" failures=\"1\" skipped=\"2\""));
        assert!(j.contains("<failure message=\"no NAK\""));
        assert!(j.contains("&lt;x&gt; &amp; &quot;y&quot;"));
        assert!(!j.contains("<x>"));
        assert_eq!(j.matches("<testcase ").count(), 4);
        assert_eq!(j.matches("</testcase>").count(), 4);
    }

    #[test]
    fn the_table_ends_with_the_counts() {
        let t = table(&rep(), false);
        assert!(t
            .trim_end()
            .ends_with("1 pass, 1 fail, 1 not applicable, 1 inconclusive"));
        assert!(t.contains("== b.fail (fail)"));
        assert!(!t.contains("== a.pass"));
    }
}
