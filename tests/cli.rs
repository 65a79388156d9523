//! The `ferroce` binary as a user runs it: exit statuses and one-line errors.

mod common;

use common::cli::ferroce;
use std::process::Command;

fn root(p: &str) -> String {
    format!("{}/{p}", env!("CARGO_MANIFEST_DIR"))
}

/// Run a command to its end (`args[0]` the program).
fn sh(args: &[&str]) -> std::process::Output {
    Command::new(args[0]).args(&args[1..]).output().unwrap()
}

/// `tools/testbed up` with `prefix` (hosts `{prefix}a`, `{prefix}b`, router `{prefix}r`);
/// panics with the script's error if it fails.
fn testbed_up(prefix: &str) {
    let up = sh(&[
        &root("tools/testbed"),
        "up",
        "--prefix",
        prefix,
        "--drop-roce-input",
    ]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
}

fn testbed_down(prefix: &str) {
    let _ = sh(&[&root("tools/testbed"), "down", "--prefix", prefix]);
}

/// `ip netns exec NS ferroce perf TEST [HOST] -d eth0 --backend xdp`, to add to and spawn.
fn perf_in(ns: &str, test: &str, host: Option<&str>) -> Command {
    let mut c = Command::new("ip");
    c.args([
        "netns",
        "exec",
        ns,
        env!("CARGO_BIN_EXE_ferroce"),
        "perf",
        test,
    ]);
    if let Some(h) = host {
        c.arg(h);
    }
    c.args(["-d", "eth0", "--backend", "xdp"]);
    c
}

#[test]
fn inspect_default_capture_is_clean() {
    let (code, out, _) = ferroce(&["inspect"]);
    assert_eq!(code, 0);
    assert!(out.contains("icrc_ok=63 icrc_bad=0 malformed=0"), "{out}");
    assert!(out
        .lines()
        .any(|l| l.contains("RC_RDMA_WRITE_FIRST") && l.contains("reth[")));
}

#[test]
fn inspect_flags_bad_icrcs_with_exit_status_1() {
    let (code, out, _) = ferroce(&["inspect", &root("tests/oracle/fixtures/negative.pcap")]);
    assert_eq!(code, 1);
    assert!(
        out.contains("icrc_bad=2") && out.contains("malformed=2") && out.contains("truncated=1"),
        "{out}"
    );
    assert!(
        out.contains("icrc=BAD(wire=df7cc43b calc=de7cc43b)"),
        "{out}"
    );
    assert!(out.contains("stored big-endian"), "{out}");
}

#[test]
fn inspect_json_is_one_object_per_line() {
    let (code, out, _) = ferroce(&["inspect", "--json", &root("captures/golden-ipv6.pcap")]);
    assert_eq!(code, 0);
    let objs: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(objs.len(), 64);
    assert_eq!(objs[63]["kind"], "summary");
    assert_eq!(objs[63]["icrc_ok"], 63);
    assert_eq!(objs[0]["op"], "RC_SEND_FIRST");
    assert!(objs[..63].iter().all(|o| o["icrc"] == "ok"));
}

#[test]
fn inspect_verbose_dumps_fields() {
    let (code, out, _) = ferroce(&["inspect", "-v", &root("captures/golden-ipv4.pcap")]);
    assert_eq!(code, 0);
    assert!(out.contains("      RETH       va=0x"), "{out}");
    assert!(out.contains("      AETH       syndrome=0x"), "{out}");
    assert!(out.contains("      ICRC       wire="), "{out}");
}

#[test]
fn not_a_capture_is_a_one_line_error() {
    let (code, out, err) = ferroce(&["inspect", &root("Cargo.toml")]);
    assert_eq!(code, 2);
    assert!(out.is_empty(), "{out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("not a pcap or pcapng capture"), "{err}");
}

#[test]
fn missing_file_is_a_one_line_error() {
    let (code, _, err) = ferroce(&["inspect", "/nonexistent/x.pcap"]);
    assert_eq!(code, 2);
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn bad_flag_gets_claps_whole_message() {
    for (args, what) in [
        (&["inspect", "--bogus"][..], "unexpected argument '--bogus'"),
        (&["frobnicate"][..], "unrecognized subcommand 'frobnicate'"),
        (
            &["inspect", "--json", "--verbose"][..],
            "cannot be used with",
        ),
    ] {
        let (code, out, err) = ferroce(args);
        assert_eq!(code, 2, "{args:?}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(
            err.starts_with("error: ") && err.contains(what),
            "{args:?}: {err}"
        );
        assert!(err.contains("try '--help'"), "{args:?}: {err}");
    }
}

/// The demo tests run one at a time: each demo keeps both cores busy, and several at once
/// (with a debug build on a loaded 2-core machine) starve the engines for long enough to time
/// READs out.
static DEMO: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn demo_runs_and_its_capture_is_clean() {
    let _one = DEMO.lock().unwrap_or_else(|e| e.into_inner());
    let pcap = std::env::temp_dir().join(format!("ferroce-demo-test-{}.pcap", std::process::id()));
    let _ = std::fs::remove_file(&pcap);
    let (code, out, err) = ferroce(&["demo", "--quick", "--pcap", pcap.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}\n{err}");
    for t in [
        "RDMA_Write BW Test",
        "RDMA_Read BW Test",
        "Send Latency Test",
    ] {
        assert!(out.contains(t), "{out}");
    }
    assert!(out.contains("icrc_bad=0 malformed=0"), "{out}");
    // Its path and size, what it keeps, and the next steps.
    let size = std::fs::metadata(&pcap).unwrap().len();
    assert!(
        out.contains(&format!("capture: {}", pcap.display()))
            && out.contains(&format!("({size} bytes)")),
        "{out}"
    );
    assert!(out.contains("write-bw: the first 512 of "), "{out}");
    assert!(out.contains("read-bw: the first 512 of "), "{out}");
    assert!(out.contains("send-lat: all "), "{out}");
    assert!(
        out.contains(&format!("wireshark {}", pcap.display())),
        "{out}"
    );
    assert!(
        out.contains(&format!("ferroce inspect {}", pcap.display())),
        "{out}"
    );
    assert!(
        out.contains("ferroce perf write-bw ADDRESS_OF_B -d IFACE"),
        "{out}"
    );
    // And the capture passes inspect on its own: every frame of send-lat (500 SENDs each
    // way), at most 512 frames of each bandwidth test.
    let (code, json, _) = ferroce(&["inspect", "--json", pcap.to_str().unwrap()]);
    assert_eq!(code, 0, "{json}");
    let ops: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|o: &serde_json::Value| o["kind"] != "summary")
        .collect();
    let count = |f: &dyn Fn(&str) -> bool| {
        ops.iter()
            .filter(|o| f(o["op"].as_str().unwrap_or("")))
            .count()
    };
    assert_eq!(count(&|o| o == "RC_SEND_ONLY"), 1000);
    let writes = count(&|o| o.starts_with("RC_RDMA_WRITE"));
    let reads = count(&|o| o.starts_with("RC_RDMA_READ"));
    assert!(writes > 0 && writes <= 512, "{writes}");
    assert!(reads > 0 && reads <= 512, "{reads}");
    let _ = std::fs::remove_file(pcap);
}

#[test]
fn demo_never_replaces_a_capture_unasked() {
    let _one = DEMO.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("ferroce-demo-names-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let demo = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_ferroce"))
            .arg("demo")
            .arg("--quick")
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    // The default name, then the next free one; the first file is left as it was.
    let (code, out, err) = demo(&[]);
    assert_eq!(code, 0, "{out}{err}");
    let first = std::fs::read(dir.join("ferroce-demo.pcap")).unwrap();
    assert!(out.contains("ferroce-demo.pcap ("), "{out}");
    let (code, out, err) = demo(&[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("ferroce-demo.pcap exists (left as it is): this run's capture goes to ferroce-demo-2.pcap\n"),
        "{out}"
    );
    assert!(dir.join("ferroce-demo-2.pcap").exists());
    assert_eq!(std::fs::read(dir.join("ferroce-demo.pcap")).unwrap(), first);
    // An explicit path that exists is refused, untouched, unless --overwrite.
    let (code, out, err) = demo(&["--pcap", "ferroce-demo.pcap"]);
    assert_ne!(code, 0);
    assert!(out.is_empty(), "{out}");
    assert_eq!(
        err,
        "ferroce: demo: ferroce-demo.pcap exists; not replacing it (give another --pcap, or add --overwrite)\n"
    );
    assert_eq!(std::fs::read(dir.join("ferroce-demo.pcap")).unwrap(), first);
    let (code, out, err) = demo(&["--pcap", "ferroce-demo.pcap", "--overwrite"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_ne!(std::fs::read(dir.join("ferroce-demo.pcap")).unwrap(), first);
    assert!(!dir.join("ferroce-demo-3.pcap").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn demo_across_namespaces_over_af_xdp() {
    require_root!("cli", "network namespaces, AF_XDP");
    let pcap = std::env::temp_dir().join(format!("ferroce-demo-netns-{}.pcap", std::process::id()));
    let (code, out, err) = ferroce(&[
        "demo",
        "--netns",
        "--quick",
        "--pcap",
        pcap.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("af_xdp("), "{out}");
    assert!(out.contains("icrc_bad=0 malformed=0"), "{out}");
    let left = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&left.stdout)
        .contains(&format!("ferroce-demo-a{}", std::process::id() % 100_000)));
    let _ = std::fs::remove_file(pcap);
}

#[test]
fn devinfo_shows_the_counters_of_a_running_perf_in_its_namespace_only() {
    require_root!("cli", "the testbed's network namespaces, AF_XDP");
    let p = "dv";
    testbed_up(p);
    let bin = env!("CARGO_BIN_EXE_ferroce");
    let perf = |ns: &str, host: Option<&str>| {
        perf_in(ns, "write-bw", host)
            .args(["-D", "3", "-s", "4096"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut server = perf("dvb", None);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut client = perf("dva", Some("10.61.2.2"));
    std::thread::sleep(std::time::Duration::from_millis(2000));
    let devinfo = |ns: &str| {
        String::from_utf8_lossy(
            &sh(&["ip", "netns", "exec", ns, bin, "devinfo", "-d", "eth0"]).stdout,
        )
        .into_owned()
    };
    let during_a = devinfo("dva");
    let during_r = sh(&["ip", "netns", "exec", "dvr", bin, "devinfo"]);
    let (c_ok, s_ok) = (client.wait().unwrap(), server.wait().unwrap());
    let after_a = devinfo("dva");
    testbed_down(p);
    assert!(c_ok.success() && s_ok.success());
    // While it runs: the client's counters, with packets sent, in A's namespace only.
    let line = during_a
        .lines()
        .find(|l| l.contains("counters:") && l.contains("RDMA_Write BW Test"))
        .unwrap_or_else(|| panic!("no live counters in\n{during_a}"));
    // `ip netns exec` execs ferroce: the same pid.
    assert!(line.contains(&format!("pid {} (", client.id())), "{line}");
    let tx: u64 = during_a
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("tx_packets="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(tx > 0, "{during_a}");
    let r = String::from_utf8_lossy(&during_r.stdout);
    assert!(
        !r.contains("RDMA_Write BW Test"),
        "R sees A's counters:\n{r}"
    );
    // After it ended: nothing left behind.
    assert!(
        after_a.contains("no ferroce process running on eth0"),
        "{after_a}"
    );
}

#[test]
fn unusable_durations_are_one_line_errors() {
    for args in [
        &["perf", "write-bw", "-d", "lo", "--cc-sample-ms", "nan"][..],
        &["perf", "write-bw", "-d", "lo", "--cc-sample-ms", "1e300"][..],
        &[
            "switch",
            "--port",
            "a",
            "--port",
            "b",
            "--duration-s",
            "1e300",
        ][..],
        &[
            "switch",
            "--port",
            "a",
            "--port",
            "b",
            "--stats-interval-s",
            "nan",
        ][..],
        &["switch", "--port", "a", "--port", "b", "--duration-s=-1"][..],
    ] {
        let (code, out, err) = ferroce(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("ferroce: "), "{args:?}: {err}");
    }
}

#[test]
fn latency_tests_over_the_testbed_send_the_reply_before_the_delayed_ack() {
    require_root!("cli", "the testbed's network namespaces, AF_XDP");
    let p = "dl";
    testbed_up(p);
    let bin = env!("CARGO_BIN_EXE_ferroce");
    let dir = std::env::temp_dir();
    let mut failures = Vec::new();
    let mut captures = Vec::new();
    for test in ["send-lat", "write-lat", "read-lat"] {
        let pcap = dir.join(format!("ferroce-lat-{}-{test}.pcap", std::process::id()));
        let perf = |ns: &str, host: Option<&str>, pcap: Option<&std::path::Path>| {
            let mut c = perf_in(ns, test, host);
            // A held ACK waits at most --ack-delay-us for an answer to ride ahead of it.
            // The default (20 us) is shorter than a scheduler slice on a loaded 2-core CI
            // machine; 5 ms makes what is checked below the engine's ordering rule (answer
            // first, then the held ACK) rather than a race against the clock. An engine that
            // sent the ACK at once would still fail: every answer would follow its ACK.
            c.args(["-n", "300", "-s", "2", "--ack-delay-us", "5000"]);
            if let Some(f) = pcap {
                c.arg("--pcap").arg(f);
            }
            c.stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let server = perf("dlb", None, Some(&pcap));
        std::thread::sleep(std::time::Duration::from_millis(500));
        let client = perf("dla", Some("10.61.2.2"), None);
        let (c, s) = (
            client.wait_with_output().unwrap(),
            server.wait_with_output().unwrap(),
        );
        if !c.status.success() || !s.status.success() {
            failures.push(format!(
                "{test}: client {}\n{}\nserver {}\n{}",
                c.status,
                String::from_utf8_lossy(&c.stderr),
                s.status,
                String::from_utf8_lossy(&s.stderr)
            ));
        }
        captures.push((test, pcap));
    }
    testbed_down(p);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for (test, pcap) in captures {
        // B's capture, in order: (sent by B, opcode name).
        let j = sh(&[bin, "inspect", "--json", pcap.to_str().unwrap()]);
        let _ = std::fs::remove_file(&pcap);
        let text = String::from_utf8_lossy(&j.stdout).into_owned();
        let frames: Vec<(bool, String)> = text
            .lines()
            .filter_map(|l| {
                let i = l.find("\"op\":\"")? + 6;
                let op = l[i..].split('"').next()?.to_string();
                Some((l.contains("\"src\":\"10.61.2.2\""), op))
            })
            .collect();
        assert!(text.contains("\"icrc\":\"ok\"") && !text.contains("\"icrc\":\"bad\""));
        let sent: Vec<&str> = frames
            .iter()
            .filter(|(b, _)| *b)
            .map(|(_, o)| o.as_str())
            .collect();
        if test == "read-lat" {
            // The responder answers READs with READ responses, no ACKs at all.
            assert_eq!(sent.len(), 300, "{sent:?}");
            assert!(
                sent.iter().all(|o| *o == "RC_RDMA_READ_RESPONSE_ONLY"),
                "{sent:?}"
            );
            continue;
        }
        const ACK: &str = "RC_ACKNOWLEDGE";
        let requests = sent.iter().filter(|o| **o != ACK).count();
        let acks = sent.iter().filter(|o| **o == ACK).count();
        assert_eq!(requests, 300, "{test}: {sent:?}");
        assert_eq!(acks, 300, "{test}: one ACK per request of A: {sent:?}");
        // After each request of A, what B sent next: its answer (the ACK held behind it)
        // or the ACK (the delay ran out first, as it may when a scheduler slice intervenes).
        let mut reply_first = 0;
        for (k, (by_b, op)) in frames.iter().enumerate() {
            if *by_b || op == ACK {
                continue;
            }
            if let Some((_, next)) = frames[k + 1..].iter().find(|(b, _)| *b) {
                reply_first += usize::from(next != ACK);
            }
        }
        assert!(
            reply_first >= 280,
            "{test}: only {reply_first} of 300 answers left before the ACK: {frames:?}"
        );
    }
}

#[test]
fn inspect_reads_standard_input() {
    let file = root("captures/golden-ipv6.pcap");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ferroce"))
            .args(args)
            .stdin(std::fs::File::open(&file).unwrap())
            .output()
            .unwrap()
    };
    let o = run(&["inspect", "-"]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(text.lines().count(), 64, "{text}");
    assert!(text.lines().last().is_some_and(|l| l
        .starts_with("(standard input): packets=63 roce=63")
        && l.contains("icrc_ok=63")));
    // The same packets as from the file.
    let (_, from_file, _) = ferroce(&["inspect", &file]);
    let body = |t: &str| t.lines().take(63).map(String::from).collect::<Vec<_>>();
    assert_eq!(body(&text), body(&from_file));
    // Standard input cannot be read twice.
    let o = run(&["inspect", "-", "-"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
}

#[test]
fn inspect_stops_quietly_when_its_reader_goes_away() {
    use std::io::BufRead;
    // ~360 KB of output, far more than a pipe holds: writes go on after the reader left.
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .args(["inspect", &root("captures/rxe-reference/atomic_bw.pcap")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The reader (as `head -1` would) is dropped here.
    assert!(first.contains("RC_FETCH_ADD"), "{first}");
    let o = c.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.is_empty(), "{err}");
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn devinfo_port_state_follows_the_interface() {
    require_root!(
        "cli",
        "a network namespace with its loopback and a veth pair"
    );
    let ns = format!("fdv{}", std::process::id() % 100_000);
    let ip = |args: &[&str]| {
        let o = sh(&[&["ip", "-n", &ns][..], args].concat());
        assert!(
            o.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let added = sh(&["ip", "netns", "add", &ns]);
    assert!(
        added.status.success(),
        "ip netns add (needs root): {}",
        String::from_utf8_lossy(&added.stderr)
    );
    // The namespace goes with the test, also when a step below fails (two were left behind).
    struct DelNs(String);
    impl Drop for DelNs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &self.0])
                .status();
        }
    }
    let _del = DelNs(ns.clone());
    let devinfo = |dev: &str| {
        let o = sh(&[
            "ip",
            "netns",
            "exec",
            &ns,
            env!("CARGO_BIN_EXE_ferroce"),
            "devinfo",
            "-v",
            "-d",
            dev,
        ]);
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let state = |text: &str| -> String {
        text.lines()
            .filter(|l| l.contains("state:") || l.contains("netdev:"))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    ip(&["link", "add", "v0", "type", "veth", "peer", "name", "v1"]);
    let down = devinfo("ferroce_lo"); // a new namespace's loopback is down; the hca_id
    ip(&["link", "set", "lo", "up"]);
    let up = devinfo("lo"); // the interface name
    ip(&["link", "set", "v0", "up"]); // its peer v1 stays down: no carrier
    let no_carrier = devinfo("ferroce_v0");
    ip(&["link", "set", "v1", "up"]);
    let both_up = devinfo("v0");
    for (text, port, phys, link) in [
        (&down, "PORT_DOWN (1)", "DISABLED (3)", "down)"),
        (&up, "PORT_ACTIVE (4)", "LINK_UP (5)", "up)"),
        (
            &no_carrier,
            "PORT_DOWN (1)",
            "POLLING (2)", // rxe_query_port: up without its link
            "up, no carrier)",
        ),
        (&both_up, "PORT_ACTIVE (4)", "LINK_UP (5)", "up)"),
    ] {
        let s = state(text);
        assert!(s.contains(&format!("state: {port}")), "{s}\n{text}");
        assert!(s.contains(&format!("phys_state: {phys}")), "{s}");
        assert!(s.ends_with(link), "{s}");
    }
    assert!(down.starts_with("hca_id:\tferroce_lo\n"), "{down}");
}

#[test]
fn devinfo_names_its_devices_and_lists_them() {
    let (code, list, _) = ferroce(&["devinfo", "-l"]);
    assert_eq!(code, 0);
    let names: Vec<&str> = list.lines().skip(1).map(str::trim).collect();
    assert!(list.starts_with(&format!("{} HCA", names.len())), "{list}");
    assert!(names.contains(&"ferroce_lo"), "{list}");
    // -d takes the name it prints and the interface's, with the same result.
    let (c1, by_hca, _) = ferroce(&["devinfo", "-d", "ferroce_lo"]);
    let (c2, by_if, _) = ferroce(&["devinfo", "-d", "lo"]);
    assert_eq!((c1, c2), (0, 0));
    assert_eq!(by_hca, by_if);
    assert!(by_hca.starts_with("hca_id:\tferroce_lo\n"), "{by_hca}");
    // Loopback is up and running.
    assert!(
        by_hca.contains("\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n"),
        "{by_hca}"
    );
}
