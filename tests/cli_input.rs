//! Bad input on the command line, class by class: every mistake a user can make gets a clear
//! message naming what is wrong and a non-zero exit status, never a panic. Usage errors are
//! clap's whole message (what is missing or invalid, the valid values, the usage line) with
//! clap's status 2; errors found while running are one line `ferroce: ...`.

use std::io::{BufRead, BufReader};
mod common;

use common::cli::ferroce;
use std::process::{Command, Stdio};

/// A usage error: status 2, clap's message on stderr containing every `needles`, nothing on
/// stdout, no panic.
fn usage_error(args: &[&str], needles: &[&str]) {
    let (code, out, err) = ferroce(args);
    assert_eq!(code, 2, "{args:?}: {err}");
    assert!(out.is_empty(), "{args:?}: {out}");
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: no {n:?} in\n{err}");
    }
}

/// A run-time error: non-zero status, one line `ferroce: ...` containing every `needles`.
fn one_line_error(args: &[&str], needles: &[&str]) {
    let (code, _, err) = ferroce(args);
    assert!(code != 0 && code != 101, "{args:?}: status {code}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("ferroce: "), "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: no {n:?} in {err}");
    }
}

#[test]
fn a_missing_argument_is_named_with_the_usage() {
    usage_error(
        &["perf", "write-bw"],
        &[
            "required arguments were not provided",
            "--ib-dev <DEV>",
            "Usage: ferroce perf",
        ],
    );
    usage_error(&["sim", "incast"], &["--senders <SENDERS>"]);
    usage_error(&["cc-plot", "--out", "x.png"], &["--csv <CSVS>"]);
}

#[test]
fn an_invalid_choice_lists_the_valid_values() {
    usage_error(
        &["perf", "write-bw", "-d", "lo", "--backend", "foo"],
        &["'foo'", "--backend", "[possible values: xdp, packet, udp]"],
    );
    usage_error(
        &["sim", "incast", "--senders", "2", "--cc", "reno"],
        &["[possible values: dcqcn, none]"],
    );
    usage_error(&["perf", "frobnicate-bw", "-d", "lo"], &["unknown test"]);
    usage_error(&["frobnicate"], &["unrecognized subcommand 'frobnicate'"]);
}

#[test]
fn an_address_that_is_not_one_is_not_a_name_lookup() {
    for args in [
        &[
            "perf",
            "write-bw",
            "999.1.1.1",
            "-d",
            "lo",
            "--backend",
            "udp",
        ][..],
        &["pingpong", "999.1.1.1", "-d", "lo"][..],
        &["perf", "write-bw", "10.0.0", "-d", "lo"][..],
    ] {
        usage_error(args, &["not a valid IPv4 address"]);
        let (_, _, err) = ferroce(args);
        assert!(!err.contains("lookup"), "{err}");
    }
    usage_error(
        &["perf", "write-bw", "fe80::1::2", "-d", "lo"],
        &["not a valid IPv6 address"],
    );
    usage_error(
        &["perf", "write-bw", "10.0.0.1:18515", "-d", "lo"],
        &["give the port with -p/--port"],
    );
    usage_error(
        &["pingpong", "no such host", "-d", "lo"],
        &["not a valid host name or address"],
    );
}

#[test]
fn a_host_name_that_does_not_resolve_says_so() {
    // RFC 6761: names under .invalid never resolve.
    for cmd in ["perf", "pingpong"] {
        let mut args = vec![cmd];
        if cmd == "perf" {
            args.push("write-bw");
        }
        args.extend(["nosuch.invalid", "-d", "lo", "--backend", "udp"]);
        let (code, _, err) = ferroce(&args);
        assert!(code != 0 && code != 101, "{args:?}: {err}");
        let last = err.lines().last().unwrap_or_default();
        // Either the name did not resolve or (another process holds UDP 4791 on 127.0.0.1)
        // the backend said why it could not open; never a panic.
        assert!(
            last.contains("cannot resolve host name \"nosuch.invalid\"")
                || last.contains("is in use"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn bad_numbers_are_refused_before_anything_runs() {
    let perf = ["perf", "write-bw", "-d", "lo", "--backend", "udp"];
    for (flag, v) in [
        ("-s", "0"),
        ("-s", "abc"),
        ("-s", "99999999999"),
        ("-n", "0"),
        ("-n", "-5"),
        ("-D", "0"),
        ("-q", "0"),
        ("-t", "0"),
        ("-p", "0"),
        ("-p", "70000"),
        ("-u", "32"),
        ("--timeout", "0"),
        ("--line-gbps", "nan"),
        ("--line-gbps", "0"),
        ("--cc-time-scale", "inf"),
        ("--cc-time-scale", "-1"),
        ("--ack-delay-us", "2000000"),
    ] {
        let arg = format!("{flag}={v}");
        let mut args = perf.to_vec();
        args.push(&arg);
        let (code, _, err) = ferroce(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(&format!("'{v}'")), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // (perftest takes -m 1500 with a warning and runs at the port's MTU; ibv_rc_pingpong
    // takes -r 1 and -n 0: those are accepted, see src/apps/perf/args.rs and pingpong.rs.)
    for (flag, v) in [("-m", "100"), ("-p", "70000"), ("--timeout", "0")] {
        let arg = format!("{flag}={v}");
        usage_error(&["pingpong", "-d", "lo", &arg], &[&format!("'{v}'")]);
    }
    for (flag, v, what) in [
        ("--link-gbps", "1e300", "--link-gbps is limited"),
        (
            "--link-gbps",
            "nan",
            "--link-gbps must be a positive number",
        ),
        ("--rtt-us", "1e300", "--rtt-us is limited"),
        ("--sample-us", "1e300", "--sample-us"),
        ("--kmax-kb", "1e300", "--kmax-kb is limited"),
        ("--buffer-kb", "-1", "--buffer-kb must be a positive number"),
        ("--pmax", "2", "--pmax must be in [0, 1]"),
        ("--duration-ms", "1e9", "--duration-ms is limited"),
    ] {
        let arg = format!("{flag}={v}");
        one_line_error(&["sim", "incast", "--senders", "2", &arg], &[what]);
    }
    // The switch's numbers are checked before any port is opened (these ports do not exist).
    for (flag, v, what) in [
        ("--rate-gbps", "nan", "--rate-gbps"),
        ("--rate-gbps", "-1", "--rate-gbps"),
        ("--buffer-kb", "inf", "--buffer-kb"),
        ("--pmax", "-1", "--pmax"),
        ("--kmin-kb", "1e300", "--kmin-kb"),
    ] {
        let arg = format!("{flag}={v}");
        let mut args = vec!["switch", "--port", "nosuch0", "--port", "nosuch1", &arg];
        if flag == "--kmin-kb" {
            args.push("--kmax-kb=10");
        }
        one_line_error(&args, &[what]);
    }
}

#[test]
fn a_missing_or_unwritable_file_is_named() {
    let missing = "/nonexistent-dir/x";
    one_line_error(&["inspect", missing], &[missing]);
    one_line_error(&["inspect", "/"], &["/: Is a directory"]);
    one_line_error(
        &["cc-plot", "--csv", missing, "--out", "/tmp/never.png"],
        &[missing],
    );
    for (flag, file) in [
        ("--csv", "/nonexistent-dir/x.csv"),
        ("--plot", "/nonexistent-dir/x.png"),
    ] {
        one_line_error(
            &[
                "sim",
                "incast",
                "--senders",
                "2",
                "--duration-ms",
                "1",
                flag,
                file,
            ],
            &[file, "No such file or directory"],
        );
    }
    one_line_error(
        &["demo", "--quick", "--pcap", "/nonexistent-dir/d.pcap"],
        &["/nonexistent-dir/d.pcap", "No such file or directory"],
    );
}

#[test]
fn an_unknown_device_is_named() {
    one_line_error(&["perf", "write-bw", "-d", "nosuch0"], &["\"nosuch0\""]);
    one_line_error(&["pingpong", "-d", "nosuch0"], &["\"nosuch0\""]);
    one_line_error(&["devinfo", "-d", "nosuch0"], &["nosuch0"]);
    one_line_error(
        &[
            "perf",
            "write-bw",
            "-d",
            "lo",
            "--backend",
            "udp",
            "-x",
            "60",
        ],
        &["GID index 60"],
    );
}

/// `perf -d lo --backend udp` opens the UDP backend on loopback (whose MTU, 65536, is above
/// a datagram's); a second endpoint on the same address is told why it cannot have port 4791.
#[test]
fn the_udp_backend_opens_on_loopback() {
    let spawn = |port: &str| {
        Command::new(env!("CARGO_BIN_EXE_ferroce"))
            .args([
                "perf",
                "write-bw",
                "-d",
                "lo",
                "--backend",
                "udp",
                "-p",
                port,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Wait for "Waiting for client" (the backend is open) or the end of the process.
    let outcome = |c: &mut std::process::Child| -> (bool, String) {
        let out = BufReader::new(c.stdout.take().unwrap());
        let waiting = out
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("Waiting for client to connect"));
        if waiting {
            let _ = c.kill();
        }
        let _ = c.wait();
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(c.stderr.as_mut().unwrap(), &mut err);
        (waiting, err)
    };
    let mut first = spawn("18711");
    let first_out = {
        let out = BufReader::new(first.stdout.take().unwrap());
        let mut lines = out.lines().map_while(Result::ok);
        lines.any(|l| l.contains("Waiting for client to connect"))
    };
    // While the first holds the port (or failed), a second one.
    let mut second = spawn("18712");
    let (second_waiting, second_err) = outcome(&mut second);
    let _ = first.kill();
    let _ = first.wait();
    let mut first_err = String::new();
    let _ = std::io::Read::read_to_string(first.stderr.as_mut().unwrap(), &mut first_err);
    for e in [&first_err, &second_err] {
        assert!(!e.contains("UdpConfig") && !e.contains("panicked"), "{e}");
    }
    // At most one endpoint per address; the one refused says why in one line.
    assert!(!(first_out && second_waiting));
    if !first_out {
        assert!(
            first_err.contains("UDP port 4791 on 127.0.0.1 is in use"),
            "{first_err}"
        );
    }
    assert!(
        second_err.contains("UDP port 4791 on 127.0.0.1 is in use"),
        "{second_err}"
    );
    assert_eq!(second_err.lines().count(), 1, "{second_err}");
}
