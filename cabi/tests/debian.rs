//! Debian's own RDMA programs (rdma-core's ibverbs-utils, perftest), unmodified, on ferroce's
//! libibverbs.so.1: two processes in an unprivileged network namespace, each on its own
//! loopback address over the UDP backend. No RDMA device, no kernel module, no root.

mod common;
use common::*;

fn ready(t: &str, progs: &[&str]) -> bool {
    can_unshare(t)
        && progs
            .iter()
            .all(|p| have(which(p), t, &format!("{p} (ibverbs-utils / perftest)")))
}

#[test]
fn ibv_devices_and_ibv_devinfo_show_the_device() {
    let t = "ibv_devices_and_ibv_devinfo_show_the_device";
    if !ready(t, &["ibv_devices", "ibv_devinfo"]) {
        return;
    }
    let out = in_netns("export LD_LIBRARY_PATH=$LIB\nibv_devices && ibv_devinfo -v");
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{s}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(s.contains("ferroce_lo"), "{s}");
    for want in [
        "hca_id:\tferroce_lo",
        "state:\t\t\tPORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "::ffff:127.0.0.1",
        "RoCE v2",
    ] {
        assert!(s.contains(want), "no {want:?} in:\n{s}");
    }
}

fn assert_pair(t: &str, (s, c, st): (String, String, String), iters: &str) {
    assert_eq!(
        st, "server=0 client=0",
        "{t}\n--- server\n{s}\n--- client\n{c}"
    );
    for (who, o) in [("server", &s), ("client", &c)] {
        assert!(o.contains(iters), "{t}: {who} printed no {iters:?}:\n{o}");
        assert!(!o.contains("ferroce libibverbs:"), "{t}: {who}:\n{o}");
    }
}

#[test]
fn rdma_core_pingpong_examples_both_ends() {
    let t = "rdma_core_pingpong_examples_both_ends";
    let progs = [
        "ibv_rc_pingpong",
        "ibv_uc_pingpong",
        "ibv_ud_pingpong",
        "ibv_srq_pingpong",
    ];
    if !ready(t, &progs) {
        return;
    }
    for p in progs {
        let cmd = format!("{p} -g 0 -n 200");
        assert_pair(p, pair(&cmd, &cmd), "200 iters in");
    }
    // Events instead of polling (-e: completion channel, ibv_req_notify_cq, ibv_get_cq_event)
    // and a size over several packets.
    let cmd = "ibv_rc_pingpong -g 0 -n 100 -e -s 10000 -m 1024";
    assert_pair("rc -e", pair(cmd, cmd), "100 iters in");
}

#[test]
fn perftest_both_ends() {
    let t = "perftest_both_ends";
    let progs = [
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
        "ib_atomic_bw",
        "ib_send_lat",
        "ib_write_lat",
    ];
    if !ready(t, &progs) {
        return;
    }
    // (program, options, the iterations perftest reports: -n per QP, summed over -q QPs)
    for (p, extra, n) in [
        ("ib_write_bw", "-n 500", "500"),
        ("ib_read_bw", "-n 500", "500"),
        ("ib_send_bw", "-n 500", "500"),
        ("ib_atomic_bw", "-n 500", "500"),
        ("ib_write_bw", "-n 100 -q 2 -s 8192", "200"),
        ("ib_send_lat", "-n 500", "500"),
        ("ib_write_lat", "-n 500", "500"),
    ] {
        let cmd = format!("{p} -d ferroce_lo -x 0 {extra}");
        let (s, c, st) = pair(&cmd, &cmd);
        assert_eq!(
            st, "server=0 client=0",
            "{cmd}\n--- server\n{s}\n--- client\n{c}"
        );
        // The result line: the size and the iterations, as perftest prints them.
        let line = c
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(n))
            .unwrap_or_else(|| panic!("{cmd}: no result line with {n} iterations:\n{c}"));
        assert!(
            line.split_whitespace().count() >= 4,
            "{cmd}: result line {line:?}"
        );
    }
}

#[test]
fn rdma_core_example_against_ferroces_own_pingpong() {
    let t = "rdma_core_example_against_ferroces_own_pingpong";
    if !ready(t, &["ibv_rc_pingpong"]) {
        return;
    }
    // Server: ferroce's native pingpong (GID 0 = 127.0.0.1); client: Debian's binary on
    // ferroce's library.
    let (s, c, st) = pair(
        "env -u LD_LIBRARY_PATH $F pingpong --ib-dev lo --backend udp -g 0 -n 100",
        "ibv_rc_pingpong -g 0 -n 100",
    );
    assert_eq!(st, "server=0 client=0", "--- server\n{s}\n--- client\n{c}");
    assert!(
        s.contains("100 iters in") && c.contains("100 iters in"),
        "{s}\n{c}"
    );
}

#[test]
fn a_c_program_built_against_rdma_core_runs_under_ferroce_run() {
    let t = "a_c_program_built_against_rdma_core_runs_under_ferroce_run";
    if !have(
        which("cc") && std::path::Path::new("/usr/include/infiniband/verbs.h").exists(),
        t,
        "a C compiler and libibverbs-dev",
    ) || !can_unshare(t)
    {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferroce-cex-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("loopback_write");
    let pcap = dir.join("run.pcap");
    let st = std::process::Command::new("cc")
        .arg("-O2")
        .arg("-o")
        .arg(&exe)
        .arg(repo().join("examples/c/loopback_write.c"))
        .arg("-libverbs")
        .status()
        .unwrap();
    assert!(st.success(), "cc -libverbs examples/c/loopback_write.c");
    let out = in_netns(&format!(
        "timeout 30 $F run -d lo --pcap {} -- {}",
        pcap.display(),
        exe.display()
    ));
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "post_send in RESET: Invalid argument",
        "completion channel: descriptor readable, event for the CQ",
        "RDMA WRITE 8192 bytes: success, data identical",
        "SGE outside every MR: local protection error",
        "CQ overrun: async event CQ error for the CQ",
        "ok",
    ] {
        assert!(so.contains(want), "no {want:?} in:\n{so}");
    }
    // The frames it exchanged are RoCE v2 that tshark and the independent checker accept.
    if which("tshark") {
        let chk = std::process::Command::new(repo().join("tools/check-captures"))
            .arg(&pcap)
            .output()
            .unwrap();
        assert!(
            chk.status.success(),
            "{}{}",
            String::from_utf8_lossy(&chk.stdout),
            String::from_utf8_lossy(&chk.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
