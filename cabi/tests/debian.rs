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

/// Build `examples/c/NAME.c` with `libs` into a directory of its own, when a C compiler and
/// `header` (from `dev_pkg`) are there and the test can make a namespace: `Some((dir, exe))`;
/// otherwise the reason is printed and the test skips.
fn build_c_example(
    t: &str,
    name: &str,
    header: &str,
    dev_pkg: &str,
    libs: &[&str],
) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    if !have(
        which("cc") && std::path::Path::new(header).exists(),
        t,
        &format!("a C compiler and {dev_pkg}"),
    ) || !can_unshare(t)
    {
        return None;
    }
    // Per test: two tests may build the same program at once.
    let dir = std::env::temp_dir().join(format!("ferroce-c-{t}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(name);
    let st = std::process::Command::new("cc")
        .arg("-O2")
        .arg("-o")
        .arg(&exe)
        .arg(repo().join(format!("examples/c/{name}.c")))
        .args(libs)
        .status()
        .unwrap();
    assert!(st.success(), "cc examples/c/{name}.c {}", libs.join(" "));
    Some((dir, exe))
}

/// `pcap` passes tools/check-captures (inspect, tshark and the independent checker agree it
/// is clean RoCE v2), when tshark is installed.
fn check_capture(pcap: &std::path::Path) {
    if !which("tshark") {
        return;
    }
    let chk = std::process::Command::new(repo().join("tools/check-captures"))
        .arg(pcap)
        .output()
        .unwrap();
    assert!(
        chk.status.success(),
        "{}{}",
        String::from_utf8_lossy(&chk.stdout),
        String::from_utf8_lossy(&chk.stderr)
    );
}

/// [`build_c_example`] for a program of examples/c/ that uses librdmacm (and libibverbs).
fn build_cm_example(t: &str, name: &str) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    build_c_example(
        t,
        name,
        "/usr/include/rdma/rdma_cma.h",
        "librdmacm-dev",
        &["-lrdmacm", "-libverbs"],
    )
}

/// [`build_c_example`] for a program of examples/c/ that uses libibverbs alone.
fn build_verbs_example(t: &str, name: &str) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    build_c_example(
        t,
        name,
        "/usr/include/infiniband/verbs.h",
        "libibverbs-dev",
        &["-libverbs"],
    )
}

/// `out` (the `who` side's output) holds each of `wants`; `all` is printed otherwise.
fn assert_says(who: &str, out: &str, wants: &[&str], all: &str) {
    for want in wants {
        assert!(out.contains(want), "{who}: no {want:?}\n{all}");
    }
}

/// Build `examples/c/NAME.c` against libibverbs, run it under `ferroce run -d lo` in a
/// namespace, and check that it succeeds and prints each of `wants`.
fn run_verbs_example(t: &str, name: &str, wants: &[&str]) {
    let Some((dir, exe)) = build_verbs_example(t, name) else {
        return;
    };
    let out = in_netns(&format!("timeout 30 $F run -d lo -- {}", exe.display()));
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in wants {
        assert!(so.contains(want), "{t}: no {want:?} in:\n{so}");
    }
    let _ = std::fs::remove_dir_all(&dir);
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
        // ibv_query_device_ex's extended attributes.
        "completion timestamp_mask:\t\t\t0xffffffffffffffff",
        "hca_core_clock:\t\t\t1000000kHZ",
    ] {
        assert!(s.contains(want), "no {want:?} in:\n{s}");
    }
}

/// The UDP backend serves every address of its interface with Linux's numbering, as rxe:
/// on a veth end with an IPv6 link-local address and an IPv4 one, `ibv_devinfo -v` lists the
/// link-local address at GID 0 and the IPv4 address at GID 1 (rxe's table on the guest's eth0
/// in `tools/rxe-peer`); Debian's `ibv_rc_pingpong` runs between two such interfaces with
/// `-g 0` (RoCE v2 over the link-local addresses: what rxe's users are told to run) and with
/// `-g 1` (IPv4), the server's capture of the `-g 0` run all IPv6 between the two link-local
/// addresses, clean in inspect and tshark; ends given GIDs of different families are
/// refused where the QP is given the peer's (`Failed to modify QP to RTR`), nothing sent
/// from the wrong address. Before, the UDP backend served the IPv4 address only: entry 0 was
/// empty and a server given `-g 0` failed to reach RTR.
#[test]
fn the_udp_backend_serves_every_address_with_linux_numbering() {
    let t = "the_udp_backend_serves_every_address_with_linux_numbering";
    if !ready(t, &["ibv_devinfo", "ibv_rc_pingpong", "ss", "tshark"]) {
        return;
    }
    let out = in_netns(
        "d=$(mktemp -d) && cd \"$d\" || exit 96
ip link add va type veth peer name vb && ip link set va up && ip link set vb up || exit 99
ip addr add 10.9.2.1/24 dev va && ip addr add 10.9.2.2/24 dev vb || exit 98
# both link-local addresses out of DAD (the table lists the interface's addresses)
i=0
while ip -6 addr show dev va | grep -q tentative || ip -6 addr show dev vb | grep -q tentative \\
    || ! ip -6 addr show dev va scope link | grep -q fe80 \\
    || ! ip -6 addr show dev vb scope link | grep -q fe80; do
    i=$((i+1)); [ $i -gt 100 ] && exit 97; sleep 0.1
done
export LD_LIBRARY_PATH=$LIB
echo '--- devinfo'; FERROCE_DEV=va ibv_devinfo -v | grep 'GID\\['
echo '--- va'; ip -6 addr show dev va scope link | awk '/inet6/ { sub(\"/.*\", \"\", $2); print $2 }'
echo '--- vb'; ip -6 addr show dev vb scope link | awk '/inet6/ { sub(\"/.*\", \"\", $2); print $2 }'
for p in '0 0' '1 1' '0 1'; do
  set -- $p
  echo \"--- g$1$2\"
  FERROCE_PCAP=s$1$2.pcap FERROCE_DEV=va timeout 30 ibv_rc_pingpong -g $1 -n 100 > s.log 2>&1 &
  i=0; while [ $i -lt 400 ] && [ -z \"$(ss -Hltn)\" ]; do sleep 0.05; i=$((i+1)); done
  FERROCE_DEV=vb timeout 30 ibv_rc_pingpong -g $2 -n 100 10.9.2.1 > c.log 2>&1
  c=$?; wait $!; echo \"server=$? client=$c\"; cat s.log c.log
  i=0; while [ $i -lt 100 ] && ss -Hltn | grep -q .; do sleep 0.05; i=$((i+1)); done
done
echo '--- tshark'
tshark -r s00.pcap -T fields -e ipv6.src -e ipv6.dst -e udp.dstport 2>/dev/null | sort -u
echo '--- expert'
tshark -r s00.pcap -q -z expert,warn 2>/dev/null | grep -E '^(Warn|Error)' || true
echo '--- inspect'
\"$F\" inspect s00.pcap | tail -1
cd / && rm -rf \"$d\"",
    );
    let o = String::from_utf8_lossy(&out.stdout).into_owned();
    let all = format!("{o}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{all}");
    let va = lines_of(&o, "va");
    let vb = lines_of(&o, "vb");
    assert_eq!((va.len(), vb.len()), (1, 1), "{all}");
    let (va, vb) = (&va[0], &vb[0]);
    assert_eq!(
        lines_of(&o, "devinfo"),
        [
            format!("GID[ 0]: {va}, RoCE v2"),
            "GID[ 1]: ::ffff:10.9.2.1, RoCE v2".to_string(),
        ],
        "{all}"
    );
    let g00 = lines_of(&o, "g00");
    assert_eq!(g00[0], "server=0 client=0", "{all}");
    assert_eq!(
        g00.iter().filter(|l| l.contains("100 iters in")).count(),
        2,
        "{all}"
    );
    // each end's local and remote GIDs: the two link-local addresses
    for (who, local, remote) in [("server", va, vb), ("client", vb, va)] {
        let l = format!("GID {local}");
        let r = format!("GID {remote}");
        assert!(
            g00.iter()
                .any(|x| x.contains("local address") && x.ends_with(&l))
                && g00
                    .iter()
                    .any(|x| x.contains("remote address") && x.ends_with(&r)),
            "{who}: {all}"
        );
    }
    let g11 = lines_of(&o, "g11");
    assert_eq!(g11[0], "server=0 client=0", "{all}");
    assert!(
        g11.iter().any(|l| l.ends_with("GID ::ffff:10.9.2.1")),
        "{all}"
    );
    assert_eq!(
        g11.iter().filter(|l| l.contains("100 iters in")).count(),
        2,
        "{all}"
    );
    let g01 = lines_of(&o, "g01");
    // exit 1: the programs' own failure, not a signal (128+) or timeout's 124
    assert_eq!(g01[0], "server=1 client=1", "{all}");
    assert!(
        g01.iter().any(|l| l == "Failed to modify QP to RTR"),
        "{all}"
    );
    let mut both = vec![format!("{va} {vb} 4791"), format!("{vb} {va} 4791")];
    both.sort();
    assert_eq!(lines_of(&o, "tshark"), both, "{all}");
    assert!(lines_of(&o, "expert").is_empty(), "{all}");
    let inspect = lines_of(&o, "inspect");
    assert!(
        inspect.len() == 1 && inspect[0].contains("icrc_bad=0 malformed=0 truncated=0"),
        "{all}"
    );
}

/// An address the interface still tests for duplicates when the device starts (IPv6's
/// "tentative" state, a second or more after the interface comes up: a program started with
/// its container meets it) is served all the same (bound with `IP_FREEBIND`), as rxe lists
/// it: Debian's `ibv_rc_pingpong -g 0` server starts while its link-local address is
/// tentative (duplicate address detection made to last 3 s), and once it is not, a client
/// reaches it over the link-local addresses. Before, that address's socket was refused
/// (`EADDRNOTAVAIL`), left out for the program's life, and the server's GID 0 was empty.
#[test]
fn a_tentative_address_is_served() {
    let t = "a_tentative_address_is_served";
    if !ready(t, &["ibv_rc_pingpong", "ss"]) {
        return;
    }
    let out = in_netns(
        "d=$(mktemp -d) && cd \"$d\" || exit 96
ip link add va type veth peer name vb || exit 99
echo 3 > /proc/sys/net/ipv6/conf/va/dad_transmits || exit 95
ip addr add 10.9.4.1/24 dev va && ip addr add 10.9.4.2/24 dev vb || exit 98
ip link set va up && ip link set vb up || exit 99
i=0; while [ $i -lt 100 ] && ! ip -6 addr show dev va scope link | grep -q fe80; do sleep 0.02; i=$((i+1)); done
export LD_LIBRARY_PATH=$LIB
echo \"--- at start\"; ip -6 addr show dev va scope link | grep -c tentative
FERROCE_DEV=va timeout 30 ibv_rc_pingpong -g 0 -n 100 > s.log 2>&1 &
i=0; while [ $i -lt 400 ] && [ -z \"$(ss -Hltn)\" ]; do sleep 0.02; i=$((i+1)); done
echo \"--- listening\"; ip -6 addr show dev va scope link | grep -c tentative
i=0; while [ $i -lt 200 ] && ip -6 addr show | grep -q tentative; do sleep 0.05; i=$((i+1)); done
echo \"--- run\"
FERROCE_DEV=vb timeout 30 ibv_rc_pingpong -g 0 -n 100 10.9.4.1 > c.log 2>&1
c=$?; wait $!; echo \"server=$? client=$c\"; cat s.log c.log
cd / && rm -rf \"$d\"",
    );
    let o = String::from_utf8_lossy(&out.stdout).into_owned();
    let all = format!("{o}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{all}");
    // the server made its objects (and bound its sockets) while the address was tentative
    assert_eq!(lines_of(&o, "at start"), ["1"], "{all}");
    assert_eq!(lines_of(&o, "listening"), ["1"], "{all}");
    let run = lines_of(&o, "run");
    assert_eq!(run[0], "server=0 client=0", "{all}");
    assert_eq!(
        run.iter().filter(|l| l.contains("100 iters in")).count(),
        2,
        "{all}"
    );
    assert!(
        run.iter()
            .all(|l| !l.contains(" GID ") || l.contains("GID fe80::")),
        "{all}"
    );
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
        let cmd = format!("{p} -g $G -n 200");
        assert_pair(p, pair(&cmd, &cmd), "200 iters in");
    }
    // The new post-send API (-N: ibv_create_qp_ex with send ops, ibv_wr_*).
    let cmd = "ibv_rc_pingpong -g $G -n 200 -N";
    assert_pair("rc -N", pair(cmd, cmd), "200 iters in");
    // Events instead of polling (-e: completion channel, ibv_req_notify_cq, ibv_get_cq_event)
    // and a size over several packets.
    let cmd = "ibv_rc_pingpong -g $G -n 100 -e -s 10000 -m 1024";
    assert_pair("rc -e", pair(cmd, cmd), "100 iters in");
    // Completion timestamps (-t: ibv_query_device_ex's timestamp mask, ibv_create_cq_ex with
    // IBV_WC_EX_WITH_COMPLETION_TIMESTAMP, ibv_wc_read_completion_ts).
    let cmd = "ibv_rc_pingpong -g $G -n 100 -t";
    let r = pair(cmd, cmd);
    for (who, o) in [("server", &r.0), ("client", &r.1)] {
        assert!(
            o.contains("Average receive completion clock cycles = "),
            "rc -t: {who}:\n{o}"
        );
    }
    assert_pair("rc -t", r, "100 iters in");
}

/// rdma-core's XRC example, unmodified: `ibv_xsrq_pingpong` with one server and three clients,
/// each on its own address. Every program opens an XRC domain through a file, makes an XRC
/// SRQ (`ibv_create_srq_ex`), a target QP per peer (`ibv_create_qp_ex` with the domain) and
/// an initiator QP per peer, exchanges SRQ numbers and sends to the peer's SRQ, the sends
/// spread over its initiators. The server's capture holds XRC requests (XRCETH naming the
/// clients' SRQs) and XRC ACKs both ways, and is clean in inspect, tshark and the checker.
/// Then one client again with completion events and on-demand paging (`-e -o`).
#[test]
fn rdma_core_xsrq_pingpong_three_clients() {
    let t = "rdma_core_xsrq_pingpong_three_clients";
    if !ready(t, &["ibv_xsrq_pingpong", "ss"]) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferroce-{t}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display();
    let script = format!(
        "for k in 3 4; do ip addr add 127.0.0.$k/8 dev lo || exit 98; done\n\
         export LD_LIBRARY_PATH=$LIB\n\
         FERROCE_PCAP={d}/s.pcap FERROCE_ADDR=127.0.0.1 timeout 60 ibv_xsrq_pingpong -g 0 -c 3 -n 50 -s 3000 -m 1024 > {d}/s 2>&1 & s=$!\n\
         i=0; while [ $i -lt 400 ] && [ -z \"$(ss -Hltn)\" ]; do sleep 0.05; i=$((i+1)); done\n\
         for k in 2 3 4; do FERROCE_ADDR=127.0.0.$k timeout 60 ibv_xsrq_pingpong -g $((k-1)) -n 50 -s 3000 -m 1024 127.0.0.1 > {d}/c$k 2>&1 & eval c$k=$!; done\n\
         wait $c2; a=$?; wait $c3; b=$?; wait $c4; c=$?; wait $s; echo \"runs $? $a $b $c\"\n\
         \"$F\" inspect --json {d}/s.pcap | grep -o '\"op\":\"[A-Z_]*\"' | sort | uniq -c | sed 's/^ */op /'\n"
    );
    let o = in_netns(&script);
    let so = String::from_utf8_lossy(&o.stdout).to_string();
    let outs: Vec<String> = ["s", "c2", "c3", "c4"]
        .iter()
        .map(|f| std::fs::read_to_string(dir.join(f)).unwrap_or_default())
        .collect();
    let all = format!(
        "{so}{}\n{}",
        String::from_utf8_lossy(&o.stderr),
        outs.join("\n---\n")
    );
    assert!(so.contains("runs 0 0 0 0"), "{all}");
    for out in &outs {
        assert!(out.trim_end().ends_with("success"), "{all}");
        assert!(!out.contains("ferroce libibverbs:"), "{all}");
    }
    // Three peers, each with its own target and initiator QP at the server.
    assert_eq!(outs[0].matches("remote: LID").count(), 3, "{all}");
    let ops: Vec<&str> = so
        .lines()
        .filter(|l| l.starts_with("op "))
        .map(|l| l.rsplit('"').nth(1).unwrap_or(""))
        .collect();
    for want in [
        "XRC_SEND_FIRST",
        "XRC_SEND_MIDDLE",
        "XRC_SEND_LAST",
        "XRC_ACKNOWLEDGE",
    ] {
        assert!(ops.contains(&want), "{want}: {so}");
    }
    assert!(ops.iter().all(|o| o.starts_with("XRC_")), "{so}");
    check_capture(&dir.join("s.pcap"));
    let _ = std::fs::remove_dir_all(&dir);
    let cmd = "ibv_xsrq_pingpong -g $G -n 50 -e -o -s 10000";
    let (s, c, st) = pair(cmd, cmd);
    assert_eq!(st, "server=0 client=0", "{s}\n---\n{c}");
    assert!(
        s.trim_end().ends_with("success") && c.trim_end().ends_with("success"),
        "{s}\n---\n{c}"
    );
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
        "ib_read_lat",
        "ib_atomic_lat",
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
        // Completion events (send and receive CQs on one channel), RC and UD.
        ("ib_send_lat", "-n 500 -e", "500"),
        ("ib_send_lat", "-n 500 -e -c UD", "500"),
        ("ib_write_lat", "-n 500", "500"),
        ("ib_read_lat", "-n 500", "500"),
        ("ib_atomic_lat", "-n 500", "500"),
    ] {
        let cmd = format!("{p} -d ferroce_lo -x $G {extra}");
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

/// On-demand paging (`IBV_ACCESS_ON_DEMAND`) as Debian's perftest uses it (`--odp`: it asks
/// `ibv_query_device_ex` for the ODP capabilities of the transport and the verb, refuses to run
/// without them, and registers its buffers on demand): WRITE, READ and SEND bandwidth, SEND
/// over UD, and the three latency tests, both ends on the library.
#[test]
fn perftest_with_on_demand_paging_both_ends() {
    let t = "perftest_with_on_demand_paging_both_ends";
    let progs = [
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
        "ib_send_lat",
        "ib_write_lat",
        "ib_read_lat",
    ];
    if !ready(t, &progs) {
        return;
    }
    for (p, extra) in [
        ("ib_write_bw", "-n 300"),
        ("ib_read_bw", "-n 300"),
        ("ib_send_bw", "-n 300"),
        ("ib_send_bw", "-n 300 -c UD"),
        ("ib_send_lat", "-n 300"),
        ("ib_write_lat", "-n 300"),
        ("ib_read_lat", "-n 300"),
    ] {
        let cmd = format!("{p} -d ferroce_lo -x $G --odp {extra}");
        let (s, c, st) = pair(&cmd, &cmd);
        assert_eq!(
            st, "server=0 client=0",
            "{cmd}\n--- server\n{s}\n--- client\n{c}"
        );
        assert!(
            c.lines()
                .any(|l| l.split_whitespace().nth(1) == Some("300")),
            "{cmd}: no result line with 300 iterations:\n{c}"
        );
    }
}

/// examples/c/reg_mr_checks.c: memory `ibv_reg_mr` cannot pin is refused with `EFAULT`, as
/// the kernel's pinning refuses it on any rdma-core provider, instead of being registered and
/// faulting the engine at the first access: a range with a hole, read-only memory with a
/// write right, `PROT_NONE`; a range over two adjacent writable mappings is accepted, and
/// `ibv_rereg_mr` onto a hole fails with `IBV_REREG_MR_ERR_CMD`, the region unchanged.
#[test]
fn reg_mr_refuses_memory_it_cannot_pin() {
    run_verbs_example(
        "reg_mr_refuses_memory_it_cannot_pin",
        "reg_mr_checks",
        &[
            "a range with an unmapped page: Bad address",
            "the same on demand: registered",
            "its first page alone: registered",
            "read-only memory, no write rights: registered",
            "read-only memory with local write: Bad address",
            "read-only memory with remote write: Bad address",
            "PROT_NONE memory: Bad address",
            "two adjacent writable mappings: registered",
            "rereg onto an unmapped page: -4 Bad address, region unchanged",
            "ok",
        ],
    );
}

/// examples/c/mw.c: memory windows as libibverbs offers them — type 1 bound with
/// `ibv_bind_mw`, type 2 with `IBV_WR_BIND_MW`, over a region that grants no remote right
/// itself; WRITE and READ through a window land at its place in the region; one byte past it,
/// the region's own key, an unbound or invalidated window (`IBV_WR_LOCAL_INV`, a peer's SEND
/// with invalidate, `ibv_dealloc_mw`) are remote access errors; bad binds complete
/// `IBV_WC_MW_BIND_ERR`. The same program on rxe in the guest prints the same lines but two
/// (docs/cabi.md: rxe bounds a window's accesses by its region, and leaves `IBV_WC_WITH_INV`
/// clear).
#[test]
fn memory_windows_bound_used_and_invalidated_as_on_rdma_core() {
    run_verbs_example(
        "memory_windows_bound_used_and_invalidated_as_on_rdma_core",
        "mw",
        &[
            "caps: MEM_WINDOW 1 MEM_WINDOW_TYPE_2B 1, max_mw > 0",
            "type 1 bind: success, opcode BIND_MW, key ibv_inc_rkey of the last",
            "WRITE through the type 1 window: success, data identical",
            "READ through the type 1 window: success, data identical",
            "WRITE one byte past the window: remote access error",
            "WRITE with the region's own R_Key: remote access error",
            "type 1 unbound: bind success, WRITE remote access error",
            "ibv_bind_mw of a type 2 window: Invalid argument",
            "type 2 bind: success, opcode BIND_MW",
            "WRITE through the type 2 window: success, data identical",
            "LOCAL_INV: success, opcode LOCAL_INV",
            "WRITE after LOCAL_INV: remote access error",
            "type 2 bound again: success; a second bind while bound: memory management operation error",
            "SEND with invalidate: receive success, WITH_INV 1, key the window's",
            "WRITE after the peer invalidated it: remote access error",
            "ibv_dealloc_pd with windows: Device or resource busy",
            "ibv_dealloc_mw of a bound window: 0, WRITE after it: remote access error",
            "bind to a region without MW_BIND: memory management operation error",
            "ibv_alloc_mw of type 3: Invalid argument",
            "ok",
        ],
    );
}

/// examples/c/parent_domain.c: thread domains and parent domains — a parent domain stands
/// for its PD for regions, an extended CQ (`IBV_CQ_INIT_ATTR_MASK_PD`) and QPs, a WRITE
/// between two of its QPs lands; bad attributes are refused; teardown in mlx5's order (the
/// parent domain before its PD and thread domain, its QPs before it: EBUSY otherwise).
#[test]
fn parent_and_thread_domains_stand_for_their_pd_and_keep_mlx5s_order() {
    run_verbs_example(
        "parent_and_thread_domains_stand_for_their_pd_and_keep_mlx5s_order",
        "parent_domain",
        &[
            "ibv_alloc_td: made",
            "ibv_alloc_parent_domain: made",
            "a parent domain of a parent domain: Invalid argument",
            "unknown comp_mask bits: Invalid argument",
            "allocators without a function: Invalid argument",
            "ibv_create_cq_ex with a plain PD as parent_domain: Invalid argument",
            "ibv_create_cq_ex with the parent domain: made",
            "ibv_reg_mr on the parent domain: made",
            "ibv_create_qp on the parent domain: made",
            "WRITE between QPs of the parent domain: success, data identical",
            "ibv_dealloc_pd of the parent domain with QPs on it: Device or resource busy",
            "ibv_dealloc_pd of the PD under a parent domain: Device or resource busy",
            "ibv_dealloc_td named by a parent domain: Device or resource busy",
            "ibv_dealloc_pd of the parent domain with a CQ made with it: Device or resource busy",
            "then: parent domain 0, thread domain 0, PD 0",
            "ok",
        ],
    );
}

/// examples/c/device_memory.c: device memory (memory the library owns) — allocation limits,
/// copies in 4-byte units, a zero-based region over it that a peer's WRITE and READ and a
/// local SEND reach by offset, `ibv_rereg_mr` refused, `ibv_free_dm` EBUSY under a region.
#[test]
fn device_memory_is_copied_in_units_and_reached_through_a_zero_based_region() {
    run_verbs_example(
        "device_memory_is_copied_in_units_and_reached_through_a_zero_based_region",
        "device_memory",
        &[
            "max_dm_size: >= 4096",
            "ibv_alloc_dm of 0 bytes: Invalid argument",
            "ibv_alloc_dm past max_dm_size: Invalid argument",
            "ibv_alloc_dm with an unknown comp_mask: Invalid argument",
            "ibv_alloc_dm of 4096 bytes: made",
            "copy in and out: 0 0, data identical",
            "copy at offset 2: Invalid argument; of 6 bytes: Invalid argument; past the end: Invalid argument",
            "ibv_reg_dm_mr without ZERO_BASED: Invalid argument",
            "ibv_reg_dm_mr past the memory: Invalid argument",
            "ibv_reg_dm_mr: made, address (nil)",
            "WRITE into device memory at offset 1024: success, data identical",
            "READ from device memory at offset 8: success, data identical",
            "SEND from device memory: success, receive success, data identical",
            "ibv_rereg_mr of it: -4",
            "ibv_free_dm with a region over it: Device or resource busy",
            "then ibv_free_dm: 0",
            "ok",
        ],
    );
}

/// examples/c/odp.c: regions registered on demand and the implicit region (the whole address
/// space): pages missing at registration, mapped after it, or unmapped, as an RNIC with ODP
/// meets them (remote and local access errors, never a crash); `ibv_advise_mr`; the
/// capabilities `ibv_query_device_ex` reports.
#[test]
fn on_demand_paging_regions_follow_the_programs_mappings() {
    run_verbs_example(
        "on_demand_paging_regions_follow_the_programs_mappings",
        "odp",
        &[
            "odp caps: general 0x3 rc 0x3f uc 0x27 ud 0x23",
            "reg_mr ON_DEMAND over an unmapped page: registered",
            "WRITE to the mapped part: success, data identical",
            "WRITE to the unmapped page: remote access error",
            "WRITE to the page mapped after registration: success, data identical",
            "ibv_advise_mr: on demand 0, pinned No such file or directory",
            "reg_mr implicit: registered",
            "WRITE through the implicit region into memory malloc'ed after it: success, data identical",
            "READ through the implicit region: success, data identical",
            "WRITE from a stack buffer by the implicit L_Key: success, data identical",
            "ATOMIC fetch-and-add through the implicit region: success, old 40, now 42",
            "WRITE gathered from an unmapped address: local protection error",
            "reg_mr ON_DEMAND at NULL for 4096 bytes: Invalid argument",
            "ok",
        ],
    );
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
        "ibv_rc_pingpong -g $G -n 100",
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
    let Some((dir, exe)) = build_verbs_example(t, "loopback_write") else {
        return;
    };
    let pcap = dir.join("run.pcap");
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
        "CQ overrun: async_fd readable, async event CQ error for the CQ",
        "ok",
    ] {
        assert!(so.contains(want), "no {want:?} in:\n{so}");
    }
    // The frames it exchanged are RoCE v2 that tshark and the independent checker accept.
    check_capture(&pcap);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One process opens the device twice (examples/c/two_contexts.c): each context with its own
/// PD, CQ and QP, a WRITE and a SEND between them, each context's CQ error event on that
/// context's async_fd only, and the second context still working after the first is closed.
#[test]
fn two_contexts_in_one_process() {
    run_verbs_example(
        "two_contexts_in_one_process",
        "two_contexts",
        &[
            "WRITE context 1 -> context 2: data identical",
            "SEND context 2 -> context 1: data identical",
            "CQ overrun in context 1: IBV_EVENT_CQ_ERR on context 1 only",
            "CQ overrun in context 2: IBV_EVENT_CQ_ERR on context 2",
            "context 1 closed: WRITE within context 2: data identical",
            "ok",
        ],
    );
}

/// ibv_destroy_cq gives the engine's CQ back (examples/c/cq_limit.c): exactly max_cq CQs,
/// EBUSY for a CQ a QP completes into, one destroyed at the limit makes room for exactly one,
/// and after every CQ is destroyed max_cq again; a depth past max_cqe and a completion vector
/// the device does not have are EINVAL (the kernel's checks; rdma-core's tests/test_cq.py).
#[test]
fn destroy_cq_frees_the_engines_cq_at_the_max_cq_boundary() {
    run_verbs_example(
        "destroy_cq_frees_the_engines_cq_at_the_max_cq_boundary",
        "cq_limit",
        &[
            "CQ of max_cqe + 1 entries: NULL Invalid argument",
            "CQ on completion vector num_comp_vectors (1): NULL Invalid argument",
            "CQ on completion vector -1: NULL Invalid argument",
            "max_cq 65536: 65536 CQs created, the next refused: Cannot allocate memory",
            "destroy_cq of a CQ a QP completes into: Device or resource busy, the CQ still polls",
            "at the limit: destroyed one, created one again (it polls), the next refused",
            "every CQ destroyed: 65536 created again",
            "ok",
        ],
    );
}

/// rping's lines of ping data (`ping data: rdma-ping-N: …`), without the prefix the server
/// adds.
fn ping_lines(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| {
            l.strip_prefix("server ping data: ")
                .or_else(|| l.strip_prefix("ping data: "))
        })
        .map(str::to_string)
        .collect()
}

/// rping's data check: `n` lines `rdma-ping-K: ` then `size - 1` characters of its rotating
/// pattern starting at 'A' + K, identical on both ends.
fn assert_rping(t: &str, (s, c, st): (String, String, String), n: usize) {
    assert_eq!(
        st, "server=0 client=0",
        "{t}\n--- server\n{s}\n--- client\n{c}"
    );
    let (sl, cl) = (ping_lines(&s), ping_lines(&c));
    assert_eq!(sl.len(), n, "{t}: server lines\n{s}");
    assert_eq!(sl, cl, "{t}: the server saw other data than the client");
    for (k, l) in cl.iter().enumerate() {
        let head = format!("rdma-ping-{k}: ");
        assert!(l.starts_with(&head), "{t}: {l}");
        assert_eq!(l.len(), 99, "{t}: {l}");
        assert_eq!(l.as_bytes()[head.len()], b'A' + (k % 58) as u8, "{t}: {l}");
    }
}

#[test]
fn rping_both_ends_on_ferroces_librdmacm() {
    let t = "rping_both_ends_on_ferroces_librdmacm";
    if !ready(t, &["rping"]) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferroce-cabi-rping-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("server.pcap");
    let r = pair_when(
        Ready::CmListen,
        &format!(
            "env FERROCE_PCAP={} rping -s -v -S 100 -C 10 -a 127.0.0.1",
            pcap.display()
        ),
        "rping -c -v -S 100 -C 10 -a",
    );
    assert_rping(t, r, 10);
    // -q: the programs create their QPs themselves and move them with rdma_init_qp_attr
    // (INIT, RTR from the REQ or REP, RTS) and rdma_establish.
    let r = pair_when(
        Ready::CmListen,
        "rping -s -q -v -S 100 -C 10 -a 127.0.0.1",
        "rping -c -q -v -S 100 -C 10 -a",
    );
    assert_rping("rping -q", r, 10);
    // The RDMA-CM MADs (REQ, REP, RTU, DREQ, DREP) and the data are RoCE v2 that inspect,
    // tshark and the independent checker accept.
    check_capture(&pcap);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rping_against_ferroces_own_rping_both_roles() {
    let t = "rping_against_ferroces_own_rping_both_roles";
    if !ready(t, &["rping"]) {
        return;
    }
    let native = "env -u LD_LIBRARY_PATH $F rping --ib-dev lo --backend udp";
    let r = pair_when(
        Ready::Udp,
        &format!("{native} -s -v -S 100 -C 10 -a 127.0.0.1"),
        "rping -c -v -S 100 -C 10 -a",
    );
    assert_rping("native server, Debian's rping client", r, 10);
    let r = pair_when(
        Ready::CmListen,
        "rping -s -v -S 100 -C 10 -a 127.0.0.1",
        &format!("{native} -c -v -S 100 -C 10 -I 127.0.0.2 -a"),
    );
    assert_rping("Debian's rping server, native client", r, 10);
}

/// `ferroce rping -s -P` serves its clients in parallel, a thread per connection as rping's
/// persistent server does: three Debian rping clients on ferroce's librdmacm, each on its own
/// interface (a veth end: its own MAC, hence its own CA GUID; on one interface the three
/// processes' first QPNs and CA GUIDs would be equal and the server's CM would rightly take
/// the second REQ for a stale connection of the first). The first client's standard output
/// is a pipe nobody reads until the other two are done: once it fills (2000 lines of ping
/// data are more than the pipe and stdio's buffer hold) that client stops between two pings
/// with its connection up (its library keeps acknowledging), so the other two can only
/// finish if the server serves them while the first connection is open. A server serving one
/// connection after another fails this (the two time out after 20 s), whatever the timing.
#[test]
fn rping_persistent_server_serves_three_clients_at_once() {
    let t = "rping_persistent_server_serves_three_clients_at_once";
    if !ready(t, &["rping"]) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferroce-cabi-rping-p-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let client = |k: u32, n: u32, size: u32, tmo: u32| {
        format!(
            "LD_LIBRARY_PATH=$LIB FERROCE_DEV=c{k} FERROCE_ADDR=10.9.0.{k} timeout {tmo} \
             rping -c -v -V -C {n} -S {size} -I 10.9.0.{k} -a 127.0.0.1"
        )
    };
    let script = format!(
        "D={d}
         for k in 1 2 3; do ip link add c$k type veth peer name p$k && ip link set c$k up && \
           ip link set p$k up && ip addr add 10.9.0.$k/32 dev c$k || exit 99; done
         env -u LD_LIBRARY_PATH timeout 90 $F rping --ib-dev lo --backend udp -s -P -v -S 102 \
           -a 127.0.0.1 >$D/s.out 2>$D/s.err & S=$!
         i=0; while [ $i -lt 400 ] && [ -z \"$(ss -Huan)\" ]; do sleep 0.05; i=$((i+1)); done
         {{ {c1} 2>$D/c1.err; echo $? >$D/c1.rc; }} | \
           {{ while [ ! -e $D/go ]; do sleep 0.05; done; cat >$D/c1.out; }} & P=$!
         i=0; while [ $i -lt 400 ] && ! grep -q . $D/s.out; do sleep 0.05; i=$((i+1)); done
         {c2} >$D/c2.out 2>$D/c2.err & C2=$!
         {c3} >$D/c3.out 2>$D/c3.err & C3=$!
         wait $C2; echo $? >$D/c2.rc; wait $C3; echo $? >$D/c3.rc
         touch $D/go; wait $P
         kill $S; wait $S",
        d = dir.display(),
        c1 = client(1, 2000, 100, 60),
        c2 = client(2, 10, 101, 20),
        c3 = client(3, 10, 102, 20),
    );
    let out = in_netns(&script);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let server = read("s.out");
    let why = format!(
        "{}\n--- server\n{}\n{}\n--- clients\n{}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        read("s.err"),
        server.lines().take(5).collect::<Vec<_>>().join("\n"),
        read("c1.err"),
        read("c2.err"),
        read("c3.err")
    );
    let server_lines = ping_lines(&server);
    for (k, n, size) in [(1, 2000, 100), (2, 10, 101), (3, 10, 102)] {
        assert_eq!(read(&format!("c{k}.rc")).trim(), "0", "client {k}: {why}");
        let cl = ping_lines(&read(&format!("c{k}.out")));
        assert_eq!(cl.len(), n, "client {k}: {why}");
        for (p, l) in cl.iter().enumerate() {
            let head = format!("rdma-ping-{p}: ");
            assert!(l.starts_with(&head), "client {k}: {l}");
            assert_eq!(l.len(), size - 1, "client {k}: {l}");
            assert_eq!(l.as_bytes()[head.len()], b'A' + (p % 58) as u8, "{l}");
        }
        // What the server READ from this client (its lines are the only ones of this length)
        // is what the client got back, in order.
        let sl: Vec<&String> = server_lines
            .iter()
            .filter(|l| l.len() == size - 1)
            .collect();
        assert_eq!(sl, cl.iter().collect::<Vec<_>>(), "client {k}");
    }
    assert_eq!(server_lines.len(), 2020, "{why}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The result line of a perftest run: the size, then `n` iterations.
fn result_line<'a>(what: &str, out: &'a str, n: &str) -> &'a str {
    out.lines()
        .find(|l| l.split_whitespace().nth(1) == Some(n))
        .unwrap_or_else(|| panic!("{what}: no result line with {n} iterations:\n{out}"))
}

#[test]
fn perftest_over_rdma_cm_both_ends() {
    let t = "perftest_over_rdma_cm_both_ends";
    let progs = [
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
        "ib_send_lat",
        "ib_write_lat",
    ];
    if !ready(t, &progs) {
        return;
    }
    for p in progs {
        let cmd = format!("{p} -R -d ferroce_lo -n 300");
        let (s, c, st) = pair_when(Ready::CmListen, &cmd, &cmd);
        assert_eq!(
            st, "server=0 client=0",
            "{cmd}\n--- server\n{s}\n--- client\n{c}"
        );
        for (who, o) in [("server", &s), ("client", &c)] {
            assert!(o.contains("Data ex. method : rdma_cm"), "{cmd}: {who}\n{o}");
        }
        result_line(&cmd, &c, "300");
    }
}

/// perftest's `-T` (RDMA_OPTION_ID_TOS) and `-u` (the QP timeout; RDMA_OPTION_ID_ACK_TIMEOUT
/// over `-R`) on both ends: every packet of the test connection, the WRITEs one way and the
/// ACKs the other, leaves with the TOS byte the option set (DSCP 24 for TOS 96), in the
/// client's capture read by tshark, and so do the connection's REQ, REP and RTU. Before, the
/// library accepted both options and applied neither (TOS 0 on the wire).
#[test]
fn perftest_tos_over_rdma_cm_reaches_the_wire() {
    let t = "perftest_tos_over_rdma_cm_reaches_the_wire";
    if !ready(t, &["ib_write_bw"]) || !have(which("tshark"), t, "tshark") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferroce-cabi-tos-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("client.pcap");
    let cmd = "ib_write_bw -R -d ferroce_lo -n 200 -T 96 -u 16";
    let (s, c, st) = pair_when(
        Ready::CmListen,
        cmd,
        &format!("env FERROCE_PCAP={} {cmd}", pcap.display()),
    );
    let all = format!("{cmd}\n--- server\n{s}\n--- client\n{c}");
    assert_eq!(st, "server=0 client=0", "{all}");
    result_line(cmd, &c, "200");
    let out = std::process::Command::new("tshark")
        .arg("-r")
        .arg(&pcap)
        .args([
            "-T",
            "fields",
            "-e",
            "ip.src",
            "-e",
            "ip.dsfield.dscp",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.mad.attributeid",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // The test connection's WRITEs (opcodes 6, 7, 8) and their ACKs (17); perftest's own
    // exchange connection (SENDs, opcode 4, and their ACKs) is made without -T.
    let writes: Vec<&str> = text
        .lines()
        .filter(|l| matches!(l.split('\t').nth(2), Some("6" | "7" | "8")))
        .collect();
    assert!(writes.len() >= 200, "{} WRITE packets\n{all}", writes.len());
    for l in &writes {
        assert_eq!(l.split('\t').nth(1), Some("24"), "a WRITE: {l}");
    }
    let acks_tos = text
        .lines()
        .filter(|l| l.starts_with("127.0.0.1\t") && l.split('\t').nth(2) == Some("17"))
        .filter(|l| l.split('\t').nth(1) == Some("24"))
        .count();
    assert!(acks_tos > 0, "no ACK from the server with DSCP 24:\n{text}");
    // The test connection's CM MADs carry it too, as Linux's CM sends them with the path's
    // traffic class: the client's REQ and RTU, the server's REP (the exchange connection's
    // with 0).
    for (from, attr, what) in [
        ("127.0.0.2", "0x0010", "REQ"),
        ("127.0.0.1", "0x0013", "REP"),
        ("127.0.0.2", "0x0014", "RTU"),
    ] {
        let tos: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{from}\t")) && l.ends_with(&format!("\t{attr}")))
            .filter_map(|l| l.split('\t').nth(1))
            .collect();
        assert!(
            tos.contains(&"24"),
            "no {what} with DSCP 24 ({tos:?}):\n{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn perftest_over_rdma_cm_against_ferroce_perf_both_roles() {
    let t = "perftest_over_rdma_cm_against_ferroce_perf_both_roles";
    if !ready(t, &["ib_write_bw"]) {
        return;
    }
    // ferroce perf's UDP backend binds the address of its GID index (-x 1: 127.0.0.2).
    let native = "env -u LD_LIBRARY_PATH $F perf write-bw -R -n 300 --ib-dev lo --backend udp";
    let debian = "ib_write_bw -R -d ferroce_lo -n 300";
    let native_client = format!("{native} -x 1");
    // (ferroce perf's server listens right after its UDP socket opens.)
    for (ready, server, client, what) in [
        (
            Ready::Udp,
            native,
            debian,
            "ferroce perf server, Debian's ib_write_bw client",
        ),
        (
            Ready::CmListen,
            debian,
            native_client.as_str(),
            "Debian's ib_write_bw server, ferroce perf client",
        ),
    ] {
        let (s, c, st) = pair_when(ready, server, client);
        assert_eq!(
            st, "server=0 client=0",
            "{what}\n--- server\n{s}\n--- client\n{c}"
        );
        result_line(what, &c, "300");
        result_line(what, &s, "300");
    }
}

/// perftest `-z`: the exchange over an RDMA-CM connected control QP (as with `-R`), the test
/// QPs created and connected by hand from the exchanged key messages (no REQ for them):
/// "rdma_cm QPs : OFF", "Data ex. method : rdma_cm" on both sides. ferroce as server checks
/// the data perftest wrote or sent (`--verify`).
#[test]
fn perftest_exchange_over_rdma_cm_against_ferroce_perf_both_roles() {
    let t = "perftest_exchange_over_rdma_cm_against_ferroce_perf_both_roles";
    if !ready(t, &["ib_write_bw", "ib_send_bw", "ib_read_lat"]) {
        return;
    }
    for (test, verify) in [
        ("write_bw", " --verify"),
        ("send_bw", " --verify"),
        ("read_lat", ""),
    ] {
        let native = format!(
            "env -u LD_LIBRARY_PATH $F perf {} -z -n 300 --ib-dev lo --backend udp",
            test.replace('_', "-")
        );
        let debian = format!("ib_{test} -z -d ferroce_lo -n 300");
        let native_server = format!("{native}{verify}");
        let native_client = format!("{native} -x 1");
        for (ready, server, client, what) in [
            (
                Ready::Udp,
                native_server.as_str(),
                debian.as_str(),
                "ferroce perf server, Debian's client",
            ),
            (
                Ready::CmListen,
                debian.as_str(),
                native_client.as_str(),
                "Debian's server, ferroce perf client",
            ),
        ] {
            let what = format!("{test} -z: {what}");
            let (s, c, st) = pair_when(ready, server, client);
            assert_eq!(
                st, "server=0 client=0",
                "{what}\n--- server\n{s}\n--- client\n{c}"
            );
            for (who, o) in [("server", &s), ("client", &c)] {
                assert!(
                    o.contains("Data ex. method : rdma_cm") && o.contains("rdma_cm QPs\t : OFF"),
                    "{what}: {who}\n{o}"
                );
            }
            result_line(&what, &c, "300");
            if !verify.is_empty() && server.starts_with("env") {
                assert!(s.contains(" verify: ok: "), "{what}\n{s}");
            }
        }
    }
}

#[test]
fn perftest_ud_over_sidr_with_several_qps_against_ferroce_perf_both_roles() {
    let t = "perftest_ud_over_sidr_with_several_qps_against_ferroce_perf_both_roles";
    if !ready(t, &["ib_send_bw"]) {
        return;
    }
    // `-c UD -R -q N`: one SIDR exchange per test QP. perftest's client resolves and connects
    // its N ids at once; with -b each SIDR_REP is followed by the client's QPN in a SEND with
    // immediate from that QP, which perftest's server takes before the next request.
    for (q, extra) in [("2", ""), ("3", " -b")] {
        let native = format!(
            "env -u LD_LIBRARY_PATH $F perf send-bw -c UD -R -q {q}{extra} -n 300 --ib-dev lo --backend udp"
        );
        let debian = format!("ib_send_bw -c UD -R -q {q}{extra} -d ferroce_lo -n 300");
        let native_client = format!("{native} -x 1");
        let iters = (300 * q.parse::<u32>().unwrap()).to_string();
        for (ready, server, client, what) in [
            (
                Ready::Udp,
                native.as_str(),
                debian.as_str(),
                "ferroce perf server, Debian's ib_send_bw client",
            ),
            (
                Ready::CmListen,
                debian.as_str(),
                native_client.as_str(),
                "Debian's ib_send_bw server, ferroce perf client",
            ),
        ] {
            let (s, c, st) = pair_when(ready, server, client);
            let what = format!("-q {q}{extra}: {what}");
            assert_eq!(
                st, "server=0 client=0",
                "{what}\n--- server\n{s}\n--- client\n{c}"
            );
            for (who, o) in [("server", &s), ("client", &c)] {
                assert!(
                    o.contains("Data ex. method : rdma_cm"),
                    "{what}: {who}\n{o}"
                );
                // Every test QP has its peer: q remote addresses, q different QPNs.
                let mut qpns: Vec<&str> = o
                    .lines()
                    .filter(|l| l.contains("remote address:"))
                    .filter_map(|l| l.split("QPN ").nth(1))
                    .filter_map(|r| r.split_whitespace().next())
                    .collect();
                qpns.sort_unstable();
                qpns.dedup();
                assert_eq!(qpns.len().to_string(), q, "{what}: {who}\n{o}");
            }
            result_line(&what, &c, &iters);
            result_line(&what, &s, &iters);
        }
    }
}

/// A signal during a blocking `ibv_get_cq_event`, as with rdma-core's `read()` of the channel:
/// a handler without `SA_RESTART` interrupts it (-1, EINTR), one with `SA_RESTART` runs and
/// the wait goes on to the event (`examples/c/cq_event_signal.c`).
#[test]
fn a_signal_interrupts_ibv_get_cq_event_unless_sa_restart() {
    run_verbs_example(
        "a_signal_interrupts_ibv_get_cq_event_unless_sa_restart",
        "cq_event_signal",
        &[
            "without SA_RESTART: ibv_get_cq_event -1, Interrupted system call",
            "with SA_RESTART: the handler ran, the wait returned the completion event",
            "ok",
        ],
    );
}

/// A child of fork(2) and its parent's device (examples/c/fork_close.c): the parent's QP is
/// not the child's to destroy (EINVAL), the inherited context closes at once (it hung,
/// waiting for engine threads that are the parent's), a device of the child's own works, and
/// the parent's QPs go on working.
#[test]
fn a_forked_child_closes_what_it_inherited_and_the_parent_goes_on() {
    run_verbs_example(
        "a_forked_child_closes_what_it_inherited_and_the_parent_goes_on",
        "fork_close",
        &[
            "parent: RDMA WRITE before the fork",
            "child: ibv_destroy_qp on the parent's QP: Invalid argument",
            "child closed what it inherited (ibv_close_device 0)",
            "child: RDMA WRITE on a device of its own",
            "parent's device still works after the child closed its copy",
            "ok",
        ],
    );
}

#[test]
fn the_extended_verbs_and_inline_data_in_a_c_program() {
    run_verbs_example(
        "the_extended_verbs_and_inline_data_in_a_c_program",
        "ex_verbs",
        &[
            "extended CQ and ibv_wr_*: RDMA WRITE 4080 bytes, data identical",
            "ATOMIC WRITE: ibv_wr_atomic_write and IBV_WR_ATOMIC_WRITE stored their 8 bytes",
            "inline data from unregistered memory, overwritten after the post: as posted",
            "ibv_query_device_ex: hca_core_clock 1000000 kHz",
            "completion timestamps: 7 in order, within the clock's readings",
            "QP with IBV_QP_EX_WITH_TSO: NULL Operation not supported",
            "QP with empty creation flags and TSO header: made",
            "QP with IBV_QP_CREATE_SCATTER_FCS: NULL Operation not supported",
            "ok",
        ],
    );
}

#[test]
fn rdmacm_utils_examples_both_ends() {
    let t = "rdmacm_utils_examples_both_ends";
    if !ready(
        t,
        &[
            "udaddy",
            "ucmatose",
            "rdma_server",
            "rdma_client",
            "ib_send_bw",
        ],
    ) {
        return;
    }
    // UD over SIDR (udaddy), RC with several connections and data (ucmatose), perftest's UD -R.
    for (server, client) in [
        ("udaddy -b 127.0.0.1", "udaddy -b 127.0.0.2 -s"),
        ("ucmatose -b 127.0.0.1", "ucmatose -b 127.0.0.2 -s"),
    ] {
        let (s, c, st) = pair_when(Ready::CmListen, server, client);
        assert_eq!(
            st, "server=0 client=0",
            "{server}\n--- server\n{s}\n--- client\n{c}"
        );
        for (who, o) in [("server", &s), ("client", &c)] {
            assert!(
                o.contains("data transfers complete") && o.contains("return status 0"),
                "{server}: {who}\n{o}"
            );
        }
    }
    // The synchronous endpoint API (rdma_create_ep, rdma_get_request, rdma_post_send with
    // IBV_SEND_INLINE from unregistered memory, rdma_get_recv_comp on the CQs librdmacm makes).
    let (s, c, st) = pair_when(
        Ready::CmListen,
        "rdma_server -s 127.0.0.1",
        "rdma_client -s",
    );
    assert_eq!(
        st, "server=0 client=0",
        "rdma_server\n--- server\n{s}\n--- client\n{c}"
    );
    assert!(s.contains("rdma_server: end 0"), "{s}");
    assert!(c.contains("rdma_client: end 0"), "{c}");
    // rdma_xclient's RC mode: a QP created with max_inline_data 0 posts a 16-byte SEND with
    // IBV_SEND_INLINE and lkey 0 — it works because providers grant inline data the room of
    // the send SGEs (rxe: max_send_sge × 16), and so does ferroce.
    let (s, c, st) = pair_when(Ready::CmListen, "rdma_xserver", "rdma_xclient -s");
    assert_eq!(
        st, "server=0 client=0",
        "rdma_xserver\n--- server\n{s}\n--- client\n{c}"
    );
    assert!(s.contains("rdma_xserver: end 0"), "{s}");
    assert!(c.contains("rdma_xclient: end 0"), "{c}");
    let cmd = "ib_send_bw -R -c UD -d ferroce_lo -n 300";
    let (s, c, st) = pair_when(Ready::CmListen, cmd, cmd);
    assert_eq!(
        st, "server=0 client=0",
        "{cmd}\n--- server\n{s}\n--- client\n{c}"
    );
    result_line(cmd, &c, "300");
}

/// rdmacm-utils' `rdma_xserver`/`rdma_xclient` in XRC mode. Not in CI's run: in one CI run
/// (2026-12-07) the server hung until its 30 s timeout after the client had finished with
/// success; 32 runs by hand (two of them with two busy loops beside) passed and the cause was
/// not found. Run it with `--ignored`.
#[test]
#[ignore = "one server hang in CI, cause not found (docs/cabi.md, XRC); run with --ignored"]
fn rdma_xserver_xclient_xrc_mode() {
    let t = "rdma_xserver_xclient_xrc_mode";
    if !ready(t, &["rdma_xserver", "rdma_xclient"]) {
        return;
    }
    // Its XRC mode (-c x): ids of RDMA_PS_IB with XRC QP types; the server's request id gets
    // a target QP in librdmacm's XRC domain and an XRC SRQ (rdma_create_srq) whose number
    // rides in the accept's private data; the client's initiator sends to that SRQ (the
    // number read from `id->event`, the ESTABLISHED event the synchronous connect keeps) and
    // the server's rdma_get_recv_comp takes the receive from the SRQ's CQ.
    // The initiator's REQ says XRC (Transport Service Type 3, Extended Transport Type 1), as
    // Linux's CM writes it; tshark reads the client's capture.
    let pcap = std::env::temp_dir().join(format!("ferroce-xclient-{}.pcap", std::process::id()));
    let client = format!("env FERROCE_PCAP={} rdma_xclient -c x -s", pcap.display());
    let (s, c, st) = pair_when(Ready::CmListen, "stdbuf -o0 rdma_xserver -c x", &client);
    assert_eq!(
        st, "server=0 client=0",
        "rdma_xserver -c x\n--- server\n{s}\n--- client\n{c}"
    );
    assert!(s.contains("rdma_xserver: end 0"), "{s}");
    assert!(c.contains("rdma_xclient: end 0"), "{c}");
    if which("tshark") {
        let o = std::process::Command::new("tshark")
            .args([
                "-r",
                &pcap.to_string_lossy(),
                "-Y",
                "infiniband.cm.req",
                "-T",
                "fields",
            ])
            .args([
                "-e",
                "infiniband.cm.req.transpsvctype",
                "-e",
                "infiniband.cm.req.ext_transport",
            ])
            .output()
            .unwrap();
        let f = String::from_utf8_lossy(&o.stdout);
        assert_eq!(f.trim(), "0x03\t0x01", "the XRC REQ's transport fields");
        check_capture(&pcap);
    }
    let _ = std::fs::remove_file(&pcap);
}

/// examples/c/rereg_mr.c: the libibverbs calls of rdma-core 44 no other example makes.
/// `ibv_rereg_mr` gives a region remote write (a WRITE then lands) and moves its translation
/// (a WRITE lands in the new buffer, one to the old address gets a remote access error); a
/// change of rights keeps the keys and a change of PD gives new ones (what rdma-core's own
/// `tests/test_mr.py` expects of a provider: it keeps using the R_Key it had); a receive posted
/// before its region lost local write fails when reached (local protection error; its sender:
/// remote operation error, the responses `test_mr.py` expects after a PD change);
/// the arguments libibverbs refuses itself fail with `IBV_REREG_MR_ERR_INPUT`; the GID table
/// in one call equals the entries one by one; fork needs no preparation; dma-buf memory and
/// imported objects are refused with `EOPNOTSUPP`.
#[test]
fn rereg_mr_and_the_other_calls_of_rdma_core_44() {
    let t = "rereg_mr_and_the_other_calls_of_rdma_core_44";
    let Some((dir, exe)) = build_verbs_example(t, "rereg_mr") else {
        return;
    };
    let out = in_netns(&format!("timeout 30 $F run -d lo -- {}", exe.display()));
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{so}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_says(
        "rereg_mr",
        &so,
        &[
            "rereg unknown flag: -1 Invalid argument",
            "rereg translation to NULL: -1 Invalid argument",
            "rereg rights without CHANGE_ACCESS: -1 Invalid argument",
            "WRITE after rereg CHANGE_ACCESS: success, data identical",
            "rereg translation: addr moved, length 4096",
            "WRITE to the new range: success, data identical, old buffer untouched",
            "WRITE to the old range: remote access error",
            "keys after rereg CHANGE_ACCESS: kept",
            "keys after rereg CHANGE_PD: changed",
            "receive after its region lost local write: local protection error; its sender: remote operation error",
            "equal to the",
            "ibv_is_fork_initialized: 2",
            "ibv_reg_dmabuf_mr: NULL Operation not supported",
            "ibv_import_pd: NULL Operation not supported",
            "ok",
        ],
        &so,
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The rate conversions (`ibv_rate_to_mult`, `mult_to_ibv_rate`, `ibv_rate_to_mbps`,
/// `mbps_to_ibv_rate`) give what rdma-core's own library gives, for every enum value, every
/// multiple up to 500 and a list of data rates: the same program run on each library.
#[test]
fn rate_conversions_answer_as_rdma_core() {
    let t = "rate_conversions_answer_as_rdma_core";
    let real = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libibverbs.so.1");
    if !have(real.exists(), t, "Debian's libibverbs.so.1 (libibverbs1)") {
        return;
    }
    let Some((dir, exe)) = build_verbs_example(t, "rereg_mr") else {
        return;
    };
    let run = |lib: Option<&std::path::Path>| {
        let mut c = std::process::Command::new(&exe);
        c.arg("rates").env_remove("LD_LIBRARY_PATH");
        if let Some(l) = lib {
            c.env("LD_LIBRARY_PATH", l);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let (theirs, ours) = (run(None), run(Some(&common::lib_dir())));
    assert!(theirs.lines().count() > 500, "{theirs}");
    assert!(theirs.contains("rate 3: mult 4 mbps 10000"), "{theirs}");
    for (a, b) in theirs.lines().zip(ours.lines()) {
        assert_eq!(a, b, "rdma-core, then ferroce");
    }
    assert_eq!(theirs.lines().count(), ours.lines().count());
    let _ = std::fs::remove_dir_all(&dir);
}

/// examples/c/cm_bind.c: which addresses an id binds (the device's: on the device; the
/// wildcard and another loopback address: on no device; another interface's: `ENODEV`; a
/// foreign one: `EADDRNOTAVAIL`) and `rdma_getaddrinfo` from hints alone, the behaviour
/// libfabric's verbs provider builds on. The expected lines are what the same program printed
/// on Debian 12's kernel RDMA-CM and librdmacm with rxe (tools/rxe-peer guest, 2026-12-06).
/// `ENODEV` was shown there later (2026-12-07) with Debian's `rping -s -a` on an address added
/// to `lo`, which has no RDMA device: "rdma_bind_addr: No such device" (and "Cannot assign
/// requested address" for 10.98.0.1 and fd99::1, on no interface); the same `rping` lines are
/// asserted here (an IPv6 address on d0, so that glibc's getaddrinfo takes an IPv6 one, as
/// the guest's had its link-local address).
#[test]
fn rdma_bind_addr_and_getaddrinfo_from_hints() {
    let t = "rdma_bind_addr_and_getaddrinfo_from_hints";
    let Some((dir, exe)) = build_cm_example(t, "cm_bind") else {
        return;
    };
    let o = in_netns(&format!(
        "ip link add d0 type veth peer name d1 && ip link set d0 up \
           && ip addr add 10.7.0.9/24 dev d0 || exit 98\n\
         ip -6 addr add fd07::9/64 dev d0 nodad || exit 98\n\
         LD_LIBRARY_PATH=$LIB FERROCE_ADDR=127.0.0.1 timeout 30 {} 127.0.0.1 127.0.0.2 \
           10.7.0.9 192.0.2.1 2>&1\n\
         st=$?\n\
         for a in 10.7.0.9 192.0.2.1 fd99::1; do LD_LIBRARY_PATH=$LIB FERROCE_ADDR=127.0.0.1 \
           timeout 10 rping -s -a $a -C 1 2>&1 | sed \"s/^/rping $a: /\"; done\n\
         exit $st",
        exe.display()
    ));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_says(
        "cm_bind",
        &out,
        &[
            "bind the device's address (127.0.0.1): bound, on the device, the device's PD",
            "bind the wildcard (0.0.0.0): bound, on no device, no PD",
            "bind another loopback address (127.0.0.2): bound, on no device, no PD",
            "bind another interface's address (10.7.0.9): No such device, on no device, no PD",
            "bind a foreign address (192.0.2.1): Cannot assign requested address, on no device, no PD",
            "rdma_getaddrinfo from hints alone: family 0, port space 262, destination the \
             hints', source the hints'",
            "rdma_getaddrinfo with nothing: Invalid argument",
            "ok",
            "rping 10.7.0.9: rdma_bind_addr: No such device",
            "rping 192.0.2.1: rdma_bind_addr: Cannot assign requested address",
            "rping fd99::1: rdma_bind_addr: Cannot assign requested address",
        ],
        &out,
    );
    assert!(o.status.success(), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A script's start for programs that skip `lo` (libfabric looks for its devices among the
/// host's other interfaces): a veth interface `d0` with 10.7.0.1 and 10.7.0.2, ferroce's
/// device on it, and `$G1`/`$G2`: the GID index of each address as `ibv_devinfo -v` shows it.
const VETH_TWO_ADDRESSES: &str = "\
    ip link add d0 type veth peer name d1 && ip link set d1 up && ip link set d0 up \
      && ip addr add 10.7.0.1/24 dev d0 && ip addr add 10.7.0.2/24 dev d0 || exit 98\n\
    export LD_LIBRARY_PATH=$LIB FERROCE_DEV=d0\n\
    gid() { FERROCE_ADDR=$1 ibv_devinfo -v | sed -n \"s/.*GID\\[ *\\([0-9]*\\)\\]:.*:$1,.*/\\1/p\"; }\n\
    export G1=$(gid 10.7.0.1) G2=$(gid 10.7.0.2)\n";

/// libfabric's `fi_pingpong` (Debian's libfabric-bin) on its verbs provider: the connected
/// endpoint type (`-e msg`: RDMA-CM and RC QPs), the reliable datagram one built on it
/// (`-e rdm`, `ofi_rxm`, what MPI libraries use), every message size from 64 B to 1 MiB, and
/// the unreliable datagram one (`-e dgram`: UD QPs, messages up to the MTU), each message's
/// bytes checked (`-c`). libfabric looks for its devices among the host's interface addresses
/// and skips `lo`, so the two programs run on the two addresses of a veth interface. For UD
/// libfabric names its endpoint by the GID at `FI_VERBS_GID_IDX` (default 0: the IPv6
/// link-local entry, which a device given one address with `FERROCE_ADDR` does not serve), so
/// each side is given the index of its own address, read from `ibv_devinfo -v`. It needed what libfabric 1.17 imports
/// (`ibv_is_fork_initialized`, `ibv_reg_dmabuf_mr`), `rdma_getaddrinfo` from the hints'
/// addresses alone, an id bound to the loopback address left without a device (libfabric then
/// advertises the device's own addresses, not 127.0.0.1), and 0xff depths in
/// `rdma_connect`/`rdma_accept` read as "the most allowed", as librdmacm reads them.
#[test]
fn libfabric_fi_pingpong_over_verbs_msg_rdm_and_dgram_both_ends() {
    let t = "libfabric_fi_pingpong_over_verbs_msg_rdm_and_dgram_both_ends";
    if !ready(t, &["fi_pingpong", "ibv_devinfo"]) {
        return;
    }
    let o = in_netns(&format!(
        "{VETH_TWO_ADDRESSES}\
         p=47600\n\
         for e in msg rdm dgram; do\n\
           p=$((p+1))\n\
           FI_VERBS_GID_IDX=$G1 FERROCE_ADDR=10.7.0.1 timeout 60 fi_pingpong -p verbs -e $e \
             -I 50 -c -B $p > /dev/null 2>&1 &\n\
           s=$!\n\
           i=0; while [ $i -lt 400 ] && ! ss -Hltn | grep -q \":$p \"; do sleep 0.05; i=$((i+1)); done\n\
           FI_VERBS_GID_IDX=$G2 FERROCE_ADDR=10.7.0.2 timeout 60 fi_pingpong -p verbs -e $e \
             -I 50 -c -P $p 10.7.0.1 2>&1\n\
           echo \"client $e=$?\"\n\
           wait $s; echo \"server $e=$?\"\n\
         done"
    ));
    let out = String::from_utf8_lossy(&o.stdout);
    for e in ["msg", "rdm", "dgram"] {
        assert!(out.contains(&format!("client {e}=0")), "{out}");
        assert!(out.contains(&format!("server {e}=0")), "{out}");
    }
    // Each endpoint type's table: every size sent and acknowledged 50 times (UD: up to the
    // MTU, 1 KiB on this veth).
    for (size, tables) in [
        ("64", 3),
        ("256", 3),
        ("1k", 3),
        ("4k", 2),
        ("64k", 2),
        ("1m", 2),
    ] {
        let rows = out
            .lines()
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() >= 3 && f[0] == size && f[1] == "50" && f[2] == "=50"
            })
            .count();
        assert_eq!(rows, tables, "{size}\n{out}");
    }
}

/// libfabric's UD endpoints with its default GID index (`FI_VERBS_GID_IDX` unset: 0, the
/// IPv6 link-local entry), as on rxe: two programs on the two ends of a veth pair, each
/// device serving its interface's addresses, `fi_pingpong -e dgram` with every message
/// checked, and the server's capture all UD SENDs between the two link-local addresses.
/// Until the UDP backend served every address (2026-12-07) entry 0 was empty and libfabric
/// refused the peer's name ("Invalid address") unless each side was given its IPv4 index.
#[test]
fn libfabric_ud_with_its_default_gid_index_over_link_local_addresses() {
    let t = "libfabric_ud_with_its_default_gid_index_over_link_local_addresses";
    if !ready(t, &["fi_pingpong", "tshark", "ss"]) {
        return;
    }
    let o = in_netns(
        "d=$(mktemp -d) && cd \"$d\" || exit 96
ip link add va type veth peer name vb && ip link set va up && ip link set vb up || exit 99
ip addr add 10.9.3.1/24 dev va && ip addr add 10.9.3.2/24 dev vb || exit 98
i=0
while ip -6 addr show | grep -q tentative || ! ip -6 addr show dev va scope link | grep -q fe80 \\
    || ! ip -6 addr show dev vb scope link | grep -q fe80; do
    i=$((i+1)); [ $i -gt 100 ] && exit 97; sleep 0.1
done
export LD_LIBRARY_PATH=$LIB
unset FI_VERBS_GID_IDX
FERROCE_PCAP=s.pcap FERROCE_DEV=va timeout 60 fi_pingpong -p verbs -e dgram -I 50 -c -B 47711 > s.log 2>&1 &
s=$!
i=0; while [ $i -lt 400 ] && ! ss -Hltn | grep -q ':47711 '; do sleep 0.05; i=$((i+1)); done
FERROCE_DEV=vb timeout 60 fi_pingpong -p verbs -e dgram -I 50 -c -P 47711 10.9.3.1 2>&1
echo \"client=$?\"
wait $s; echo \"server=$?\"
echo '--- va'; ip -6 addr show dev va scope link | awk '/inet6/ { sub(\"/.*\", \"\", $2); print $2 }'
echo '--- vb'; ip -6 addr show dev vb scope link | awk '/inet6/ { sub(\"/.*\", \"\", $2); print $2 }'
echo '--- capture'
tshark -r s.pcap -T fields -e ip.src -e ipv6.src -e ipv6.dst -e infiniband.bth.opcode 2>/dev/null | sort -u
cd / && rm -rf \"$d\"",
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let all = format!("{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{all}");
    assert!(
        out.contains("client=0") && out.contains("server=0"),
        "{all}"
    );
    // every size up to the MTU sent and acknowledged 50 times
    for size in ["64", "256", "1k"] {
        assert!(
            out.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() >= 3 && f[0] == size && f[1] == "50" && f[2] == "=50"
            }),
            "{size}: {all}"
        );
    }
    let (va, vb) = (lines_of(&out, "va"), lines_of(&out, "vb"));
    assert_eq!((va.len(), vb.len()), (1, 1), "{all}");
    // UD SEND only (opcode 100), no IPv4, both ways between the link-local addresses
    let mut want = vec![
        format!("{} {} 100", va[0], vb[0]),
        format!("{} {} 100", vb[0], va[0]),
    ];
    want.sort();
    assert_eq!(lines_of(&out, "capture"), want, "{all}");
}

/// `DIR/rank.sh`, what mpirun starts for each rank: rank r takes the address 10.7.0.(r+1)
/// (VETH_TWO_ADDRESSES), names its GID entry ($G1, $G2) in `gid_var` (the MPI transport's
/// own variable), captures into `DIR/rankR.pcap`, and executes `exe`.
fn mpi_rank_script(
    dir: &std::path::Path,
    exe: &std::path::Path,
    gid_var: &str,
) -> std::path::PathBuf {
    let wrap = dir.join("rank.sh");
    std::fs::write(
        &wrap,
        format!(
            "#!/bin/sh\n\
             r=$OMPI_COMM_WORLD_RANK\n\
             if [ $r = 0 ]; then g=$G1; else g=$G2; fi\n\
             export FERROCE_ADDR=10.7.0.$((r + 1)) FERROCE_PCAP={dir}/rank$r.pcap {gid_var}=$g\n\
             exec {exe}\n",
            dir = dir.display(),
            exe = exe.display()
        ),
    )
    .unwrap();
    wrap
}

/// Both ranks of examples/c/mpi_ring.c said the ring and the allreduce were right, and each
/// rank's capture (`DIR/rankN.pcap`) holds its RoCE traffic (1 MiB each way: over a thousand
/// frames) and passes tools/check-captures; then the directory goes.
fn mpi_ranks_ok(out: &str, dir: &std::path::Path, all: &str) {
    for r in 0..2 {
        assert!(
            out.contains(&format!("rank {r} of 2: ring ok, allreduce 3")),
            "{all}"
        );
        let pcap = dir.join(format!("rank{r}.pcap"));
        assert!(
            std::fs::metadata(&pcap).map(|m| m.len()).unwrap_or(0) > 1_000_000,
            "{}: no RoCE traffic captured\n{all}",
            pcap.display()
        );
        check_capture(&pcap);
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// examples/c/mpi_ring.c built with Open MPI's headers and library (libopenmpi-dev), as
/// [`build_c_example`].
fn build_mpi_ring(t: &str) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    build_c_example(
        t,
        "mpi_ring",
        "/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h",
        "libopenmpi-dev",
        &[
            "-I/usr/lib/x86_64-linux-gnu/openmpi/include",
            "-I/usr/lib/x86_64-linux-gnu/openmpi/include/openmpi",
            "-L/usr/lib/x86_64-linux-gnu/openmpi/lib",
            "-lmpi",
        ],
    )
}

/// Open MPI (Debian's openmpi-bin 4.1) over ferroce, through libfabric's verbs provider
/// (`--mca pml cm --mca mtl ofi`, provider `verbs;ofi_rxm`): examples/c/mpi_ring.c, two
/// ranks on the two addresses of a veth interface, sends 1 B to 1 MiB around the ring, every
/// byte checked, then an allreduce. Each rank's capture holds its RoCE traffic (the large
/// messages as RDMA READ responses) and passes tools/check-captures; the transport is forced,
/// so a rank that could not open ferroce's device would fail instead of falling back to
/// shared memory or TCP.
#[test]
fn open_mpi_over_libfabric_verbs_on_ferroce() {
    let t = "open_mpi_over_libfabric_verbs_on_ferroce";
    if !ready(t, &["mpirun", "ibv_devinfo"]) {
        return;
    }
    let Some((dir, exe)) = build_mpi_ring(t) else {
        return;
    };
    let wrap = mpi_rank_script(&dir, &exe, "FI_VERBS_GID_IDX");
    let o = in_netns(&format!(
        "{VETH_TWO_ADDRESSES}\
         timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml cm \
           --mca mtl ofi --mca mtl_ofi_provider_include 'verbs;ofi_rxm' \
           -x LD_LIBRARY_PATH -x FERROCE_DEV -x G1 -x G2 sh {} 2>&1\n\
         echo \"mpirun=$?\"",
        wrap.display()
    ));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("mpirun=0"),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    mpi_ranks_ok(&out, &dir, &out);
}

/// `ferroce run --dev-node` as an unprivileged user (this test drops to `nobody` when it runs
/// as root): the program sees `/dev/infiniband/uverbs_ferroce` as a character device it can
/// open, every entry of the real `/dev` still there and usable (`/dev/null` opened with
/// `O_CREAT`, as a shell's `>` does), its own user id; the host's `/dev` is unchanged.
#[test]
fn ferroce_run_dev_node_needs_no_privilege() {
    let t = "ferroce_run_dev_node_needs_no_privilege";
    if !can_unshare(t) {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let (prog, pre): (&str, &[&str]) = if root {
        (
            "setpriv",
            &["--reuid=65534", "--regid=65534", "--clear-groups"],
        )
    } else {
        ("env", &[])
    };
    let host_has = std::path::Path::new("/dev/infiniband/uverbs_ferroce").exists();
    let host_count = std::fs::read_dir("/dev").unwrap().count();
    let o = std::process::Command::new(prog)
        .args(pre)
        .arg(ferroce_bin())
        .args(["run", "--dev-node", "--", "sh", "-c"])
        .arg(
            "test -c /dev/infiniband/uverbs_ferroce && test -r /dev/infiniband/uverbs_ferroce \
             && test -w /dev/infiniband/uverbs_ferroce && echo node-ok; \
             echo x > /dev/null && echo null-ok; test -e /dev/zero && echo zero-ok; \
             echo uid=$(id -u); ls /dev | wc -l",
        )
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let all = format!("{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{all}");
    for want in ["node-ok", "null-ok", "zero-ok"] {
        assert!(out.contains(want), "no {want}:\n{all}");
    }
    let uid = if root {
        65534
    } else {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() }
    };
    assert!(out.contains(&format!("uid={uid}")), "{all}");
    // The private /dev: the host's entries, plus /dev/infiniband if the host has none.
    let n: usize = out.lines().last().unwrap().trim().parse().unwrap();
    let extra = usize::from(!std::path::Path::new("/dev/infiniband").exists());
    assert!(
        n >= host_count + extra - 2 && n <= host_count + extra + 2,
        "{n} vs {host_count}\n{all}"
    );
    assert_eq!(
        std::path::Path::new("/dev/infiniband/uverbs_ferroce").exists(),
        host_has,
        "the host's /dev changed"
    );
}

/// UCX (Debian's libucx0 and ucx-utils 1.13) and Open MPI over it, on ferroce. UCX takes a
/// verbs device only if `/dev/infiniband/<dev_name>` is a character device the program may
/// open (`uverbs_ferroce` here; a kernel driver makes it, ferroce has none): `ferroce run
/// --dev-node` gives the program one in a mount namespace of its own (a private `/dev`, the
/// real `/dev/null` bound at `/dev/infiniband/uverbs_ferroce`; this test runs in an
/// unprivileged user namespace). `ferroce run` also turns off the destination-GID check of
/// UCX's UD transport, which without the kernel's sysfs GID type takes RoCE v2's GRH for
/// RoCE v1's and drops every datagram.
///
/// - `ucx_info -d` lists `rc_verbs` and `ud_verbs` on `ferroce_lo:1`;
/// - `ucx_perftest` at the transport level between 127.0.0.1 and 127.0.0.2 (real RoCE on `lo`):
///   RDMA WRITE 64 KiB (`put_bw`, zero-copy, 32 outstanding), READ 64 KiB (`get`), fetch-and-add, compare-and-swap,
///   active messages over RC (SEND, copied) and over UD;
/// - Open MPI's default point-to-point layer, UCX (`--mca pml ucx`, transports forced to
///   `rc_verbs,ud_verbs,self`: no shared memory or TCP to fall back on), runs
///   examples/c/mpi_ring.c between two ranks on two addresses of a veth interface, every byte
///   checked, then an allreduce; each rank's capture passes tools/check-captures.
#[test]
fn ucx_and_open_mpi_over_ucx_on_ferroce() {
    let t = "ucx_and_open_mpi_over_ucx_on_ferroce";
    if !ready(t, &["ucx_info", "ucx_perftest", "mpirun", "ibv_devinfo"]) {
        return;
    }
    let Some((dir, exe)) = build_mpi_ring(t) else {
        return;
    };
    let wrap = mpi_rank_script(&dir, &exe, "UCX_IB_GID_INDEX");
    let d = dir.display();
    let script = format!(
        "[ -e /dev/infiniband/uverbs_ferroce ] && echo 'the host has the node already'\n\
         FERROCE_DEV=lo $F run --dev-node -- ucx_info -d | grep -E 'Transport: (rc|ud)_verbs|Device: ferroce' | sort -u | sed 's/^/info: /'\n\
         for x in 'rc_verbs put_bw -D zcopy -s 65536 -O 32' 'rc_verbs get -D zcopy -s 65536' 'rc_verbs fadd' \
                  'rc_verbs cswap' 'rc_verbs am_bw -D bcopy -s 2048' 'ud_verbs am_lat'; do\n\
           set -- $x; tl=$1; shift\n\
           FERROCE_DEV=lo FERROCE_ADDR=127.0.0.1 timeout 60 $F run --dev-node -- ucx_perftest -d ferroce_lo:1 -x $tl > {d}/s.out 2>&1 &\n\
           i=0; while [ $i -lt 400 ] && [ -z \"$(ss -Hltn)\" ]; do sleep 0.05; i=$((i+1)); done\n\
           FERROCE_DEV=lo FERROCE_ADDR=127.0.0.2 UCX_IB_GID_INDEX=1 timeout 60 $F run --dev-node -- \
             ucx_perftest 127.0.0.1 -d ferroce_lo:1 -x $tl -n 500 -t \"$@\" > {d}/c.out 2>&1; cs=$?\n\
           wait $!; echo \"perftest $x: server=$? client=$cs $(grep -c '^Final:' {d}/c.out)\"\n\
           [ $cs = 0 ] || cat {d}/s.out {d}/c.out\n\
         done\n\
         {VETH_TWO_ADDRESSES}\
         timeout 120 $F run --dev-node -- mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ucx \
           -x UCX_TLS=rc_verbs,ud_verbs,self -x UCX_NET_DEVICES=ferroce_d0:1 sh {w} 2>&1\n\
         echo \"mpirun=$?\"\n",
        w = wrap.display()
    );
    let o = in_netns(&script);
    let out = String::from_utf8_lossy(&o.stdout);
    let all = format!("{out}{}", String::from_utf8_lossy(&o.stderr));
    for want in [
        "info: #      Transport: rc_verbs",
        "info: #      Transport: ud_verbs",
        "info: #         Device: ferroce_lo:1",
    ] {
        assert!(out.contains(want), "no {want:?}:\n{all}");
    }
    let runs: Vec<&str> = out.lines().filter(|l| l.starts_with("perftest ")).collect();
    assert_eq!(runs.len(), 6, "{all}");
    for l in runs {
        assert!(l.ends_with("server=0 client=0 1"), "{l}\n{all}");
    }
    assert!(out.contains("mpirun=0"), "{all}");
    mpi_ranks_ok(&out, &dir, &all);
}

/// Debian's `qperf` (package qperf), its RC tests over RDMA-CM (`-cm1`; without it qperf
/// addresses the peer by LID, which RoCE has not: its QPs fail RTR there, on rxe too). Its
/// server forks a process per test and ends each test from `SIGALRM`, which must interrupt
/// the server's `ibv_get_cq_event` (EINTR, as rdma-core's `read()` of the channel; before, the
/// server missed its results deadline, 2 runs of 6 of `rc_bw`); the client asks for the next
/// test as soon as one ends, so the next server process must wait for the last one to let
/// the address's UDP port go; and each server process binds its port, sends it to the client
/// and only then listens, so a REQ that comes in between must wait for the listener (before,
/// it was rejected: "Event rejected" in 2 runs of 3 of `rc_rdma_read_bw rc_rdma_read_lat`
/// twice then `rc_bw`).
#[test]
fn qperf_rc_tests_over_rdma_cm_both_ends() {
    let t = "qperf_rc_tests_over_rdma_cm_both_ends";
    if !ready(t, &["qperf"]) {
        return;
    }
    let tests = [
        ("rc_bw", "bw"),
        ("rc_lat", "latency"),
        ("rc_rdma_write_bw", "bw"),
        ("rc_rdma_write_lat", "latency"),
        ("rc_bw", "bw"),
        ("rc_rdma_read_bw", "bw"),
        ("rc_rdma_read_lat", "latency"),
        ("rc_bi_bw", "bw"),
        ("ver_rc_compare_swap", "msg_rate"),
        ("ver_rc_fetch_add", "msg_rate"),
        ("rc_rdma_write_poll_lat", "latency"),
        ("rc_lat", "latency"),
    ];
    let names: Vec<&str> = tests.iter().map(|(n, _)| *n).collect();
    let o = in_netns(&format!(
        "export LD_LIBRARY_PATH=$LIB\n\
         FERROCE_ADDR=127.0.0.1 timeout 120 qperf > /dev/null 2>&1 &\n\
         s=$!\n\
         i=0; while [ $i -lt 400 ] && [ -z \"$(ss -Hltn)\" ]; do sleep 0.05; i=$((i+1)); done\n\
         FERROCE_ADDR=127.0.0.2 timeout 100 qperf -cm1 -t 1 127.0.0.1 {} 2>&1\n\
         echo \"client=$?\"\n\
         kill $s",
        names.join(" ")
    ));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("client=0"), "{out}");
    // Each test's name, then its figure: `rc_bw:` followed by `    bw  =  2.3 GB/sec`.
    let lines: Vec<&str> = out.lines().collect();
    let mut at = 0;
    for (name, figure) in tests {
        let i = lines[at..]
            .iter()
            .position(|l| l.trim() == format!("{name}:"))
            .unwrap_or_else(|| panic!("no {name} result:\n{out}"))
            + at;
        let l = lines.get(i + 1).copied().unwrap_or("");
        assert!(
            l.split('=').next().map(str::trim) == Some(figure),
            "{name}: {l:?} is not its {figure}:\n{out}"
        );
        at = i + 1;
    }
}

/// Debian's `cmtime`: 300 connections requested, accepted, established and disconnected at
/// once (its server serves until it is killed). Every REQ of the burst must find a receive
/// buffer on QP1 (`tests/rdma_cm_runtime.rs` `a_burst_of_connection_requests_is_not_dropped`
/// counts the drops).
#[test]
fn cmtime_connects_and_disconnects_300_connections() {
    let t = "cmtime_connects_and_disconnects_300_connections";
    if !ready(t, &["cmtime"]) {
        return;
    }
    let o = in_netns(
        "export LD_LIBRARY_PATH=$LIB\n\
         L=$(mktemp -u)\n\
         FERROCE_LISTENING=$L FERROCE_ADDR=127.0.0.1 timeout 120 cmtime -b 127.0.0.1 -c 300 \
           > /dev/null 2>&1 &\n\
         s=$!\n\
         i=0; while [ $i -lt 400 ] && ! [ -e $L ]; do sleep 0.05; i=$((i+1)); done\n\
         FERROCE_ADDR=127.0.0.2 timeout 60 cmtime -s 127.0.0.1 -c 300 2>&1\n\
         echo \"client=$?\"\n\
         kill $s; rm -f $L",
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("client=0"), "{out}");
    for step in ["connect", "disconnect", "destroy"] {
        assert!(
            out.lines()
                .any(|l| l.split(':').next().map(str::trim) == Some(step)),
            "cmtime printed no {step} line:\n{out}"
        );
    }
}

#[test]
fn perftest_read_and_atomic_over_rdma_cm_both_ends() {
    let t = "perftest_read_and_atomic_over_rdma_cm_both_ends";
    let progs = ["ib_read_lat", "ib_atomic_lat", "ib_atomic_bw"];
    if !ready(t, &progs) {
        return;
    }
    // RDMA READ and ATOMIC over QPs the RDMA-CM connected: the responder resources and
    // initiator depth come from the REQ/REP, not from perftest's own exchange.
    for p in progs {
        let cmd = format!("{p} -R -d ferroce_lo -n 300");
        let (s, c, st) = pair_when(Ready::CmListen, &cmd, &cmd);
        assert_eq!(
            st, "server=0 client=0",
            "{cmd}\n--- server\n{s}\n--- client\n{c}"
        );
        for (who, o) in [("server", &s), ("client", &c)] {
            assert!(o.contains("Data ex. method : rdma_cm"), "{cmd}: {who}\n{o}");
        }
        result_line(&cmd, &c, "300");
    }
}

/// Debian's perftest clients, unmodified on ferroce's libibverbs.so.1 (127.0.0.2), against
/// `ferroce conform` in the client roles (listening on 127.0.0.1, UDP backend): every test
/// that applies to the role passes, every other one is n/a (the retry tests count the
/// client's transmissions: retry_cnt 7 is eight, then the error state).
#[test]
fn perftest_clients_against_ferroce_conform() {
    let t = "perftest_clients_against_ferroce_conform";
    let progs = ["ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_atomic_bw"];
    if !ready(t, &progs) {
        return;
    }
    for (verb, size, applicable) in [
        ("write", "-s 64", 6),
        ("send", "-s 64", 6),
        ("read", "-s 64", 5),
        ("atomic", "", 4),
    ] {
        // The client in a loop (each session ends it with a fatal NAK), the tester in front.
        let script = format!(
            "rm -f stop\n\
             ( while [ ! -e stop ]; do FERROCE_ADDR=127.0.0.2 LD_LIBRARY_PATH=$LIB timeout 20 \
             ib_{verb}_bw -d ferroce_lo -x 1 -F {size} --run_infinitely 127.0.0.1 >/dev/null 2>&1; \
             sleep 0.2; done ) &\n\
             timeout 200 $F conform 127.0.0.1 -d lo --backend udp -x 0 --peer-tool perftest-{verb}-client \
             --timeout-ms 300 --patience-s 10\n\
             echo \"conform=$?\"\n\
             touch stop\n\
             wait"
        );
        let dir = std::env::temp_dir().join(format!("ferroce-{t}-{verb}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = in_netns(&format!("cd {}\n{script}", dir.display()));
        let _ = std::fs::remove_dir_all(&dir);
        let o = String::from_utf8_lossy(&out.stdout);
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(o.contains("conform=0"), "{verb}:\n{o}\n{e}");
        // "N tests against ib_write_bw HOST: 6 pass, 0 fail, 69 not applicable, 0 inconclusive"
        let pass = format!(": {applicable} pass, 0 fail, ");
        assert!(
            o.lines()
                .any(|l| l.contains(&pass) && l.ends_with(" not applicable, 0 inconclusive")),
            "{verb}: no summary with {pass:?} and 0 inconclusive in\n{o}\n{e}"
        );
    }
}

/// `rdma_migrate_id` (examples/c/cm_migrate.c, two processes on ferroce's librdmacm): a
/// listener's waiting CONNECT_REQUEST moves with it to another channel (the old one is
/// empty), the accepted id's events follow, a connected id moves back; a client made
/// synchronous by a NULL channel connects with one blocking `rdma_connect`.
#[test]
fn rdma_migrate_id_in_a_c_program_both_ends() {
    let t = "rdma_migrate_id_in_a_c_program_both_ends";
    let Some((dir, exe)) = build_cm_example(t, "cm_migrate") else {
        return;
    };
    let (s, c, status) = pair_when(
        Ready::CmListen,
        &format!("{} -s", exe.display()),
        &format!("{} -c", exe.display()),
    );
    let all = format!("{t}\n--- server\n{s}\n--- client\n{c}\n{status}");
    assert_eq!(status, "server=0 client=0", "{all}");
    assert_says(
        "server",
        &s,
        &[
            "waiting CONNECT_REQUEST moved: channel 1 empty",
            "CONNECT_REQUEST on channel 2",
            "ESTABLISHED on channel 2",
            "DISCONNECTED on channel 1",
            "ok",
        ],
        &all,
    );
    assert_says(
        "client",
        &c,
        &[
            "synchronous on a channel of its own",
            "rdma_connect returned established",
            "ok",
        ],
        &all,
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether valgrind is there for `t` (the reason is printed when it is not).
fn have_valgrind(t: &str) -> bool {
    have(
        which("valgrind"),
        t,
        "valgrind (the check that nothing reads freed memory)",
    )
}

/// Run the example `exe ARGS` under `ferroce run -d lo` in a namespace of its own (under
/// valgrind, any read of freed memory failing it, when `valgrind`), and check that it
/// succeeds and prints each of `wants`.
fn run_example(t: &str, exe: &std::path::Path, args: &str, valgrind: bool, wants: &[&str]) {
    run_example_env(t, "", exe, args, valgrind, wants)
}

/// [`run_example`] with `env` (`NAME=VALUE …`) for `ferroce run`.
fn run_example_env(
    t: &str,
    env: &str,
    exe: &std::path::Path,
    args: &str,
    valgrind: bool,
    wants: &[&str],
) {
    let tool = if valgrind {
        "valgrind -q --error-exitcode=9"
    } else {
        ""
    };
    let out = in_netns(&format!(
        "{env} timeout 120 $F run -d lo -- {tool} {} {args}",
        exe.display()
    ));
    let so = String::from_utf8_lossy(&out.stdout);
    let all = format!(
        "{t} (valgrind: {valgrind}): {}\n{so}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{all}");
    assert_says(t, &so, wants, &all);
}

/// The end of a program like rping (examples/c/cm_teardown.c): an event on an id whose QP the
/// program destroyed with `ibv_destroy_qp` touches no freed QP, `rdma_destroy_id` waits
/// until the event another thread holds is acknowledged, and `rdma_destroy_event_channel`
/// while that thread waits in `rdma_get_cm_event` leaves it waiting, with nothing freed under
/// it, while the main thread reuses the heap and returns; a destroyed id and a destroyed
/// channel (destroyed again, read, given to `rdma_create_id`) are refused with `EINVAL`
/// (before, the second destroy of a channel freed it twice: Debian's `ib_write_bw -R -T 96`
/// client died of SIGSEGV after a REJ against rxe, in perftest's retry path, 2026-12-05). Before, the library freed the
/// channel under the waiting thread (which read it again within 100 ms) and freed the id
/// at once, and updated the state of the id's QP on every event: rping's client died of SIGSEGV
/// after its last ping on a loaded machine (2 of 9 runs under load); this program failed every
/// run (its id check), and valgrind showed the freed QP and the freed channel being read.
#[test]
fn destroying_an_id_and_a_channel_while_another_thread_uses_them() {
    let t = "destroying_an_id_and_a_channel_while_another_thread_uses_them";
    let Some((dir, exe)) = build_cm_example(t, "cm_teardown") else {
        return;
    };
    // Three plain runs, then one under valgrind: the plain runs alone do not always crash on
    // what they read after it was freed.
    let valgrind = have_valgrind(t);
    for round in 0..if valgrind { 4 } else { 3 } {
        run_example(
            t,
            &exe,
            "127.0.0.1",
            round == 3,
            &[
                "ROUTE_RESOLVED after ibv_destroy_qp of the id's QP",
                "a destroyed id: EINVAL",
                "a destroyed channel: EINVAL",
                "thread: RDMA_CM_EVENT_ADDR_RESOLVED",
                "rdma_destroy_id waited for the acknowledgement",
                "channel destroyed while the thread waits on it",
                "ok",
            ],
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A completion thread waiting in `ibv_get_cq_event` while the main thread destroys the CQ
/// and then the channel, and returns (examples/c/cq_teardown.c): the channel refuses to go
/// while the CQ is bound (EBUSY), the waiting thread is never handed the destroyed CQ, and
/// nothing it reads is freed under it. Under valgrind when it is there; before, valgrind
/// showed the thread reading the freed channel every 10 ms.
#[test]
fn destroying_a_cq_and_its_channel_while_a_thread_waits_on_it() {
    let t = "destroying_a_cq_and_its_channel_while_a_thread_waits_on_it";
    let Some((dir, exe)) = build_c_example(
        t,
        "cq_teardown",
        "/usr/include/infiniband/verbs.h",
        "libibverbs-dev",
        &["-libverbs", "-lpthread"],
    ) else {
        return;
    };
    run_example(
        t,
        &exe,
        "",
        have_valgrind(t),
        &[
            "ibv_destroy_cq waited for the acknowledgement",
            "CQ destroyed while the thread waits",
            "channel destroyed while the thread waits on it",
            "ok",
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `rdma_create_srq_ex` (examples/c/cm_srq.c), as librdmacm: no type in the mask is
/// EINVAL, an XRC SRQ EOPNOTSUPP (no XRC here) leaving the id without one, a basic SRQ gets
/// the id's PD (made for it) and becomes `id->srq`, and the id's QP receives through it; run
/// under valgrind when it is there. Before, every call was EOPNOTSUPP.
#[test]
fn rdma_create_srq_ex_on_an_id() {
    let t = "rdma_create_srq_ex_on_an_id";
    let Some((dir, exe)) = build_cm_example(t, "cm_srq") else {
        return;
    };
    run_example(
        t,
        &exe,
        "127.0.0.1",
        have_valgrind(t),
        &[
            "no type: EINVAL",
            "XRC: EOPNOTSUPP",
            "basic SRQ on the id, its PD, max_wr 16",
            "the QP receives through the id's SRQ",
            "ok",
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Both ends of a connection in children forked from a process that used the device first
/// (examples/c/cm_fork.c), as rdma-core's RDMA-CM tests run under Python's multiprocessing:
/// each child makes its own device and CM (a child has none of its parent's threads), the
/// server takes the client's SEND, and the parent's id, PD and region are still its own
/// afterwards. Before, a child took its parent's device and CM, whose engine and CM threads
/// it did not have: rdma-core's suite, run whole, failed 7 of its RDMA-CM tests (REJECTED
/// instead of ESTABLISHED), which passed when run alone.
#[test]
fn rdma_cm_ends_in_children_of_a_process_that_used_the_device() {
    let t = "rdma_cm_ends_in_children_of_a_process_that_used_the_device";
    let Some((dir, exe)) = build_cm_example(t, "cm_fork") else {
        return;
    };
    run_example(
        t,
        &exe,
        "127.0.0.1 7490",
        false,
        &[
            "parent: device in use",
            "server: received \"hello from the client\" (status 0)",
            "client: sent (status 0)",
            "server exit 0, client exit 0",
            "ok",
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `RDMA_OPTION_IB_PATH` (examples/c/cm_ib_path.c), as the kernel's RDMA-CM: EINVAL before
/// the address is resolved, for a length that is no multiple of `struct ibv_path_data`, for
/// an array without a primary bidirectional GMP path, and once the route is resolved;
/// otherwise that path is the id's route (its traffic class, hop limit, flow label and MTU in
/// `route.path_rec`), ROUTE_RESOLVED follows, and the id connects over it: every CM MAD of
/// the connection leaves with the path's traffic class (0x28: DSCP 10, tshark). Under
/// valgrind when it is there. Before, the option was ENOSYS.
#[test]
fn rdma_option_ib_path_gives_the_route() {
    let t = "rdma_option_ib_path_gives_the_route";
    let Some((dir, exe)) = build_cm_example(t, "cm_ib_path") else {
        return;
    };
    let pcap = dir.join("ib_path.pcap");
    run_example_env(
        t,
        &format!("FERROCE_PCAP={}", pcap.display()),
        &exe,
        "127.0.0.1",
        have_valgrind(t),
        &[
            "before the address is resolved: EINVAL",
            "a length not a multiple of struct ibv_path_data: EINVAL",
            "no primary bidirectional path: EINVAL",
            "ROUTE_RESOLVED with the path's traffic class, hop limit, flow label and MTU",
            "the route already resolved: EINVAL",
            "connected over the given route",
            "ok",
        ],
    );
    if have(which("tshark"), t, "tshark (the DSCP of the MADs)") {
        let out = std::process::Command::new("tshark")
            .arg("-r")
            .arg(&pcap)
            .args([
                "-Y",
                "infiniband.mad",
                "-T",
                "fields",
                "-e",
                "ip.dsfield.dscp",
                "-e",
                "infiniband.mad.attributeid",
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let attrs: Vec<&str> = text.lines().collect();
        for m in ["0x0010", "0x0013", "0x0014", "0x0015", "0x0016"] {
            assert!(
                attrs.contains(&format!("10\t{m}").as_str()),
                "no CM attribute {m} with DSCP 10:\n{text}"
            );
        }
        assert!(
            attrs.iter().all(|l| l.starts_with("10\t")),
            "a MAD without DSCP 10:\n{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A process's RDMA-CM connections are cleaned up at its exit as the kernel's ucma does at
/// close (examples/c/cm_exit.c): the server returns from main with one connection whose DREQ
/// came unanswered and one still established (or, `-x`, right after its own `rdma_disconnect`
/// of A while the client's DREQ for B is on its way). The client must see both DISCONNECTED
/// and its capture must hold exactly one DREQ of its own: its DREQ was answered (DREP) or
/// crossed by the server's, never retried (with `-x`, none when the server's DREQ came first:
/// the client answers it with a DREP instead; seen about one round in 50 under load). Before, the server's library disconnected only
/// established ids at exit: the client retried its DREQ until the harness killed it (10 of
/// 10 pairs in each mode), as perftest's `-R` clients did about one run in two.
#[test]
fn rdma_cm_connections_are_cleaned_up_at_exit() {
    let t = "rdma_cm_connections_are_cleaned_up_at_exit";
    let Some((dir, exe)) = build_cm_example(t, "cm_exit") else {
        return;
    };
    let pcap = dir.join("client.pcap");
    for round in 0..10 {
        let mode = if round % 2 == 0 { "" } else { " -x" };
        let _ = std::fs::remove_file(&pcap);
        let (s, c, status) = pair_when(
            Ready::CmListen,
            &format!("{} -s{mode}", exe.display()),
            &format!("env FERROCE_PCAP={} {} -c", pcap.display(), exe.display()),
        );
        let all = format!("{t} round {round}{mode}\n--- server\n{s}\n--- client\n{c}\n{status}");
        assert_eq!(status, "server=0 client=0", "{all}");
        assert_says(
            "client",
            &c,
            &[
                "client: DISCONNECTED on A",
                "client: DISCONNECTED on B",
                "ok",
            ],
            &all,
        );
        let out = std::process::Command::new(ferroce_bin())
            .arg("inspect")
            .arg(&pcap)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let from_client = |what: &str| {
            text.lines()
                .filter(|l| {
                    l.contains("127.0.0.2.") && l.contains(" > 127.0.0.1.") && l.contains(what)
                })
                .count()
        };
        let (dreqs, dreps) = (from_client("cm[DREQ"), from_client("cm[DREP"));
        if mode.is_empty() || dreqs != 0 {
            assert_eq!(
                dreqs, 1,
                "the client's DREQs (1: answered, no retry)\n{all}\n{text}"
            );
        } else {
            // -x: the server's DREQ for B (sent at its exit) reached the client before the
            // client's rdma_disconnect(B), which then answers it with a DREP and sends no
            // DREQ of its own, as rdma_disconnect does on a connection whose DREQ came.
            assert!(
                dreps >= 1,
                "no DREQ and no DREP from the client\n{all}\n{text}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A delayed ACK leaves at exit (examples/c/cm_exit.c `-a`): the server returns from main
/// right after its receive completed, QP and connection up, with the ACK for the client's
/// SEND held back (`FERROCE_ACK_DELAY_US=1000000`: a second, so the exit always comes
/// first). The client's send must complete with success: the library's exit handler lets
/// held ACKs go before the process is gone, as a NIC that outlives the process would send
/// them. Without it the client's SEND ended in a retry-exceeded error.
#[test]
fn a_held_ack_leaves_when_the_process_exits() {
    let t = "a_held_ack_leaves_when_the_process_exits";
    let Some((dir, exe)) = build_cm_example(t, "cm_exit") else {
        return;
    };
    let (s, c, status) = pair_when(
        Ready::CmListen,
        &format!("env FERROCE_ACK_DELAY_US=1000000 {} -s -a", exe.display()),
        &format!("{} -c -a", exe.display()),
    );
    let all = format!("{t}\n--- server\n{s}\n--- client\n{c}\n{status}");
    assert_eq!(status, "server=0 client=0", "{all}");
    assert!(
        s.contains("exiting with the QP and the connection up"),
        "{all}"
    );
    assert_says(
        "client",
        &c,
        &[
            "client: send completion success",
            "client: DISCONNECTED",
            "ok",
        ],
        &all,
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// UD multicast over librdmacm: Debian's `mckey` receiver and sender, both on this library.
/// Each joins 239.1.1.1 (`rdma_join_multicast`: the QP attached to the group's GID, the UDP
/// backend's socket for the group with `IP_ADD_MEMBERSHIP`, MULTICAST_JOIN with the group's
/// address handle and QPN 0xFFFFFF); the sender sends 10 messages to the group once the
/// receiver's group socket exists, and the receiver ends only after it received all 10.
#[test]
fn mckey_multicast_sender_and_receiver() {
    let t = "mckey_multicast_sender_and_receiver";
    if !ready(t, &["mckey", "ss"]) {
        return;
    }
    let out = in_netns(
        "ip link set lo multicast on && ip route add 224.0.0.0/4 dev lo || exit 98
d=$(mktemp -d) && cd \"$d\" || exit 97
FERROCE_ADDR=127.0.0.2 timeout 30 $F run -d lo --addr 127.0.0.2 -- \\
    mckey -m 239.1.1.1 -b 127.0.0.2 -C 10 > recv.log 2>&1 &
r=$!
i=0
until ss -Huan | grep -q '239.1.1.1:4791'; do
    i=$((i+1)); [ $i -gt 300 ] && break; sleep 0.1
done
FERROCE_ADDR=127.0.0.1 timeout 30 $F run -d lo --addr 127.0.0.1 -- \\
    mckey -m 239.1.1.1 -b 127.0.0.1 -s -C 10 > send.log 2>&1
s=$?
wait $r
echo \"status sender=$s receiver=$?\"
echo '--- receiver'; cat recv.log; echo '--- sender'; cat send.log; cd / && rm -rf \"$d\"",
    );
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(
        o.contains("status sender=0 receiver=0"),
        "{o}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_mckey_both_halves(&o);
}

/// Debian's `mckey` receiver and sender over the AF_PACKET backend (raw Ethernet frames), each
/// on one end of a veth pair in an unprivileged namespace (CAP_NET_RAW there). The receiver's
/// interface becomes a member of 239.1.1.1 (the kernel lists the group and its MAC
/// 01:00:5e:01:01:01 on it: the raw device joins through a kernel socket, so a NIC's filter
/// and IGMP snooping switches let the group's frames in), the sender's frames go to that MAC
/// (derived from the group's address: there is no neighbour to ask) and the receiver takes
/// all 10 messages. Failed before the raw backends handled multicast: the sender's address
/// handle found no MAC for the group (ibv_create_ah: EHOSTUNREACH) and the receiver's
/// interface joined nothing.
#[test]
fn mckey_multicast_over_the_af_packet_backend() {
    let t = "mckey_multicast_over_the_af_packet_backend";
    if !ready(t, &["mckey", "tshark"]) {
        return;
    }
    let out = in_netns(
        "ip link add va type veth peer name vb && ip link set va up && ip link set vb up || exit 99
ip addr add 10.9.1.1/24 dev va && ip addr add 10.9.1.2/24 dev vb || exit 98
d=$(mktemp -d) && cd \"$d\" || exit 97
timeout 30 $F run -d vb --backend packet --pcap recv.pcap -- \\
    mckey -m 239.1.1.1 -b 10.9.1.2 -C 10 > recv.log 2>&1 &
r=$!
i=0
until ip maddr show dev vb | grep -q 239.1.1.1; do
    i=$((i+1)); [ $i -gt 300 ] && break; sleep 0.1
done
echo '--- membership'; ip maddr show dev vb
timeout 30 $F run -d va --backend packet -- \\
    mckey -m 239.1.1.1 -b 10.9.1.1 -s -C 10 > send.log 2>&1
s=$?
wait $r
echo \"status sender=$s receiver=$?\"
echo '--- after'; ip maddr show dev vb
echo '--- frames'; tshark -r recv.pcap -Y 'udp.dstport == 4791' -T fields -e eth.dst -e ip.dst -e infiniband.bth.destqp 2>/dev/null | sort | uniq -c
echo '--- receiver'; cat recv.log; echo '--- sender'; cat send.log; cd / && rm -rf \"$d\"",
    );
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(
        o.contains("status sender=0 receiver=0"),
        "{o}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let section = |name: &str| {
        o.split(&format!("--- {name}\n"))
            .nth(1)
            .and_then(|s| s.split("\n--- ").next())
            .unwrap_or("")
            .to_string()
    };
    // joined while the receiver ran, left when it ended
    let m = section("membership");
    assert!(
        m.contains("01:00:5e:01:01:01") && m.contains("inet  239.1.1.1"),
        "{o}"
    );
    assert!(!section("after").contains("239.1.1.1"), "{o}");
    // the 10 messages, to the group's MAC and address, destination QP 0xffffff
    let f = section("frames");
    let lines: Vec<&str> = f.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{o}");
    let w: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        w,
        ["10", "01:00:5e:01:01:01", "239.1.1.1", "0xffffff"],
        "{o}"
    );
    assert_mckey_both_halves(&o);
}

/// mckey's receiver and sender output (the receiver's first, then `--- sender`): the receiver
/// waited for data, and each side joined 239.1.1.1, completed its transfers and ended with
/// status 0.
fn assert_mckey_both_halves(o: &str) {
    let (recv, send) = o.split_once("--- sender").unwrap_or((o, ""));
    assert!(recv.contains("receiving data transfers"), "{o}");
    for half in [recv, send] {
        assert!(
            half.contains("joined dgid: ::ffff:239.1.1.1")
                && half.contains("data transfers complete")
                && half.contains("return status 0"),
            "{o}"
        );
    }
}

/// rsockets (librdmacm's stream sockets over RDMA, rdma-core's rsocket protocol): Debian's
/// `rstream` and `riostream` at both ends, every byte checked (`-T v`), in their default
/// non-blocking mode, with blocking calls, and through `rpoll`; 1 byte to 1 MiB transfers,
/// more than one receive-buffer grant per transfer at the large sizes; riostream's
/// `riomap`/`riowrite`.
#[test]
fn rstream_and_riostream_both_ends_on_ferroces_rsockets() {
    let t = "rstream_and_riostream_both_ends_on_ferroces_rsockets";
    if !ready(t, &["rstream", "riostream"]) {
        return;
    }
    for (prog, opts) in [
        ("rstream", "-S 65536 -C 300 -T v"),
        ("rstream", "-S 1 -C 2000 -T v"),
        ("rstream", "-S 4096 -C 500 -T b -T v"),
        ("rstream", "-S 1048576 -C 30 -T a -T v"),
        ("rstream", "-S 3000 -C 300 -T a -T b -T v"),
        // riomap at both ends, riowrite into the peer's mapped buffer, a byte polled in memory
        ("riostream", "-S 65536 -C 100 -T v"),
        ("riostream", "-S 1048576 -C 10 -T a -T v"),
        ("riostream", "-S 100 -C 50 -T b -T v"),
    ] {
        let (s, c, st) = pair_when(
            Ready::CmListen,
            &format!("{prog} -b 127.0.0.1 {opts}"),
            &format!("{prog} {opts} -s"),
        );
        let all = format!("{prog} {opts}\n--- server\n{s}\n--- client\n{c}\n{st}");
        assert_eq!(st, "server=0 client=0", "{all}");
        // One result line each: the transfers (and the check of every byte) passed.
        for o in [&s, &c] {
            assert_eq!(
                o.lines().filter(|l| l.starts_with("custom ")).count(),
                1,
                "{all}"
            );
        }
    }
}

/// Two programs on one host with no second address and no root: on `lo` the UDP backend takes
/// any 127.x.y.z in `FERROCE_ADDR` (Linux delivers all of 127.0.0.0/8 locally).
/// `ibv_devinfo -v` on 127.0.0.9 (never added to `lo`) lists it at GID index 1, where Linux
/// would put it once added; `ib_write_bw -x 1` from there reaches a server on 127.0.0.1, and
/// so does `rping` over RDMA-CM. While rping's server holds 127.0.0.1, a second program that
/// does not share the port (`FERROCE_SHARE=0`) and makes objects on the same address is
/// refused at its first with a message that names `FERROCE_ADDR`, and one that only queries
/// the device (`ibv_devinfo -v`) is not.
#[test]
fn two_programs_on_one_host_without_a_second_address() {
    let t = "two_programs_on_one_host_without_a_second_address";
    if !ready(t, &["ib_write_bw", "ibv_devinfo", "rping"]) {
        return;
    }
    let script = "export LD_LIBRARY_PATH=$LIB\n\
        d=$(mktemp -d)\n\
        ip -4 addr show dev lo | grep -c inet | sed 's/^/ipv4 addresses on lo: /'\n\
        timeout 30 ib_write_bw -d ferroce_lo -x 0 -n 200 > $d/server 2>&1 &\n\
        s=$!\n\
        i=0; while [ $i -lt 400 ] && [ -z \"$(ss -Hltn)\" ]; do sleep 0.05; i=$((i+1)); done\n\
        echo '--- devinfo'; FERROCE_ADDR=127.0.0.9 timeout 30 ibv_devinfo -v | grep 'GID\\['\n\
        echo '--- client'; FERROCE_ADDR=127.0.0.9 timeout 30 ib_write_bw -d ferroce_lo -x 1 -n 200 \
          127.0.0.1 2>&1; echo \"client=$?\"\n\
        wait $s; echo \"server=$?\"; echo '--- server'; cat $d/server\n\
        FERROCE_LISTENING=$d/listening timeout 30 rping -s -a 127.0.0.1 -C 3 > $d/rping 2>&1 &\n\
        s=$!\n\
        i=0; while [ $i -lt 400 ] && ! [ -e $d/listening ]; do sleep 0.05; i=$((i+1)); done\n\
        echo '--- same address'; export FERROCE_ADDR=127.0.0.1 FERROCE_SHARE=0\n\
        timeout 30 ibv_rc_pingpong -d ferroce_lo -g 0 -p 18999 127.0.0.1 \
          2>&1 | grep -v '^ferroce libibverbs' | sed 's/^/pingpong: /'; \
          timeout 30 ibv_rc_pingpong -d ferroce_lo -g 0 -p 18999 127.0.0.1 2>&1 \
          | grep 'ferroce libibverbs'\n\
        echo '--- query on the held address'; timeout 30 ibv_devinfo -v 2>&1; echo \"query=$?\"\n\
        unset FERROCE_ADDR FERROCE_SHARE\n\
        echo '--- rping'; FERROCE_ADDR=127.0.0.9 timeout 30 rping -c -a 127.0.0.1 -C 3 -v 2>&1; \
        echo \"rping client=$?\"; wait $s; echo \"rping server=$?\"; rm -rf $d";
    let out = in_netns_lo("ip link set lo up || exit 99", script);
    let o = output_text(&out);
    // the namespace's lo has 127.0.0.1 alone
    assert!(o.contains("ipv4 addresses on lo: 1"), "{o}");
    // rping's server holds 127.0.0.1 here: a second program making objects on it is refused
    // at its first (ibv_rc_pingpong: "Couldn't allocate PD") with a message naming
    // FERROCE_ADDR ...
    let same = o.split("--- same address").nth(1).unwrap_or("");
    assert!(
        same.lines().any(|l| l == "pingpong: Couldn't allocate PD"),
        "{o}"
    );
    assert!(
        same.lines().any(|l| l.starts_with("ferroce libibverbs: ")
            && l.contains("is in use")
            && l.contains("FERROCE_ADDR")
            && l.contains("127.0.0.1")),
        "{o}"
    );
    // ... while a program that only queries the device opens it, as it would a kernel
    // device's: ibv_devinfo on the held address lists it and exits 0.
    let query = o
        .split("--- query on the held address")
        .nth(1)
        .unwrap_or("");
    let query = query.split("--- rping").next().unwrap_or("");
    assert!(query.lines().any(|l| l == "query=0"), "{o}");
    assert!(
        query
            .lines()
            .any(|l| l.contains("GID[  0]:") && l.contains("::ffff:127.0.0.1")),
        "{o}"
    );
    assert!(query.lines().any(|l| l.contains("PORT_ACTIVE")), "{o}");
    assert!(!query.contains("ferroce libibverbs"), "{o}");
    let gids = o.split("--- devinfo").nth(1).unwrap_or("");
    assert!(
        gids.lines()
            .any(|l| l.contains("GID[  1]:") && l.contains("::ffff:127.0.0.9")),
        "{o}"
    );
    for want in ["client=0", "server=0", "rping client=0", "rping server=0"] {
        assert!(o.lines().any(|l| l == want), "{want}:\n{o}");
    }
    let section = |from: &str, to: &str| {
        let rest = o.split(from).nth(1).unwrap_or("");
        rest.split(to).next().unwrap_or("").to_string()
    };
    result_line("the client", &section("--- client", "client="), "200");
    result_line("the server", &section("--- server", "--- rping"), "200");
    assert_eq!(o.matches("ping data: rdma-ping-").count(), 3, "{o}");
}

/// Two programs on one host's loopback with no address given, as two programs on one rxe
/// device. Sharing (the default, `ferroce::io::share`): both serve 127.0.0.1, each with its
/// own QPN block, so the commands a user runs against rxe work unchanged and a client
/// connecting to 127.0.0.1 reaches whichever program listens: `ibv_rc_pingpong -g 0` both ends
/// (both GIDs ::ffff:127.0.0.1), `ib_write_bw -x 0` both ends, and `rping` over RDMA-CM;
/// `ibv_devinfo -v` while the first holds 127.0.0.1 shows it at index 0. Not sharing
/// (`FERROCE_SHARE=0`): the second finds 127.0.0.1's UDP port held by the first and serves
/// 127.0.0.2 in its stead, shown at the same GID index (the client's GID ::ffff:127.0.0.2),
/// and the same commands work.
#[test]
fn two_programs_on_loopback_without_setting_an_address() {
    let t = "two_programs_on_loopback_without_setting_an_address";
    if !ready(
        t,
        &["ibv_rc_pingpong", "ib_write_bw", "ibv_devinfo", "rping"],
    ) {
        return;
    }
    for (share, second) in [("1", "127.0.0.1"), ("0", "127.0.0.2")] {
        let script = format!(
            "export LD_LIBRARY_PATH=$LIB FERROCE_SHARE={share}\n\
            d=$(mktemp -d)\n\
            tcp() {{ i=0; while [ $i -lt 400 ] && [ -z \"$(ss -Hltn)\" ]; do sleep 0.05; i=$((i+1)); done; }}\n\
            timeout 30 ibv_rc_pingpong -g 0 -n 100 > $d/pps 2>&1 & s=$!\n\
            tcp\n\
            echo '--- devinfo'; timeout 30 ibv_devinfo -v 2>&1 | grep -E 'GID\\[|ferroce'\n\
            echo '--- pp client'; timeout 30 ibv_rc_pingpong -g 0 -n 100 127.0.0.1 2>&1; echo \"ppc=$?\"\n\
            wait $s; echo \"pps=$?\"; echo '--- pp server'; cat $d/pps\n\
            timeout 30 ib_write_bw -x 0 -n 200 > $d/bws 2>&1 & s=$!\n\
            tcp\n\
            echo '--- bw client'; timeout 30 ib_write_bw -x 0 -n 200 127.0.0.1 2>&1; echo \"bwc=$?\"\n\
            wait $s; echo \"bws=$?\"; echo '--- bw server'; cat $d/bws\n\
            FERROCE_LISTENING=$d/l timeout 30 rping -s -a 127.0.0.1 -C 3 > $d/rps 2>&1 & s=$!\n\
            i=0; while [ $i -lt 400 ] && ! [ -e $d/l ]; do sleep 0.05; i=$((i+1)); done\n\
            echo '--- rping'; timeout 30 rping -c -a 127.0.0.1 -C 3 -v 2>&1; echo \"rpc=$?\"\n\
            wait $s; echo \"rps=$?\"; cat $d/rps; rm -rf $d"
        );
        let out = in_netns_lo("ip link set lo up || exit 99", &script);
        let o = format!("FERROCE_SHARE={share}\n{}", output_text(&out));
        let section = |from: &str, to: &str| {
            let rest = o.split(from).nth(1).unwrap_or("");
            rest.split(to).next().unwrap_or("").to_string()
        };
        let devinfo = section("--- devinfo", "--- pp client");
        assert!(
            devinfo
                .lines()
                .any(|l| l.contains("GID[  0]:") && l.contains(&format!("::ffff:{second}"))),
            "{o}"
        );
        if share == "0" {
            assert!(!devinfo.contains("127.0.0.1"), "{o}");
        }
        // each told the other its GID: the client's is the address it serves
        let client = section("--- pp client", "ppc=");
        assert!(
            client.lines().any(|l| l.contains("local address")
                && l.contains(&format!("GID ::ffff:{second}"))),
            "{o}"
        );
        assert!(
            client
                .lines()
                .any(|l| l.contains("remote address") && l.contains("GID ::ffff:127.0.0.1")),
            "{o}"
        );
        assert!(client.contains("100 iters in"), "{o}");
        for want in ["ppc=0", "pps=0", "bwc=0", "bws=0", "rpc=0", "rps=0"] {
            assert!(o.lines().any(|l| l == want), "{want}:\n{o}");
        }
        result_line("the client", &section("--- bw client", "bwc="), "200");
        result_line("the server", &section("--- bw server", "--- rping"), "200");
        assert_eq!(o.matches("ping data: rdma-ping-").count(), 3, "{o}");
        assert!(!o.contains("ferroce libibverbs"), "{o}");
    }
}

/// rdmacm-utils' `rcopy` (a file copy over rsockets: the client maps the file and sends it,
/// the server writes what it receives): four files of 1 byte to 24 MiB + 3 bytes of random
/// data copied one after another to one server, each compared byte for byte with its source.
/// The server serves clients until it is stopped, so the script runs it by hand.
#[test]
fn rcopy_copies_files_byte_for_byte_over_ferroces_rsockets() {
    let t = "rcopy_copies_files_byte_for_byte_over_ferroces_rsockets";
    if !ready(t, &["rcopy", "cmp"]) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferroce-cabi-rcopy-{}", std::process::id()));
    let srv = dir.join("server");
    std::fs::create_dir_all(&srv).unwrap();
    let sizes = [1usize, 4095, 1 << 20 | 7, (24 << 20) + 3];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for (i, &n) in sizes.iter().enumerate() {
        let mut data = Vec::with_capacity(n);
        while data.len() < n {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            data.extend_from_slice(&seed.to_le_bytes());
        }
        data.truncate(n);
        std::fs::write(dir.join(format!("src{i}")), &data).unwrap();
    }
    let copies: String = (0..sizes.len())
        .map(|i| {
            format!(
                "FERROCE_ADDR=127.0.0.2 timeout 30 rcopy {d}/src{i} 127.0.0.1:copy{i} \
                 > {d}/client{i}.out 2>&1; echo \"client{i}=$?\"\n",
                d = dir.display()
            )
        })
        .collect();
    let script = format!(
        "export LD_LIBRARY_PATH=$LIB\n\
         cd {srv} && FERROCE_LISTENING={d}/listening FERROCE_ADDR=127.0.0.1 timeout 60 rcopy \
         > {d}/server.out 2>&1 &\n\
         s=$!\n\
         i=0; while [ $i -lt 400 ] && ! [ -e {d}/listening ]; do sleep 0.05; i=$((i+1)); done\n\
         {copies}\
         kill $s; wait $s\n\
         for i in {list}; do cmp {d}/src$i {srv}/copy$i && echo same$i; done",
        srv = srv.display(),
        d = dir.display(),
        list = (0..sizes.len())
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(" "),
    );
    let out = in_netns(&script);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let mut all = format!(
        "{text}{}\n--- server\n{}",
        String::from_utf8_lossy(&out.stderr),
        read("server.out")
    );
    for i in 0..sizes.len() {
        all += &format!("--- client {i}\n{}", read(&format!("client{i}.out")));
    }
    for (i, n) in sizes.iter().enumerate() {
        assert!(text.contains(&format!("client{i}=0")), "copy {i}:\n{all}");
        assert!(
            read(&format!("client{i}.out")).contains(&format!("{n} bytes in ")),
            "copy {i}:\n{all}"
        );
        assert!(
            text.contains(&format!("same{i}")),
            "copy {i} differs:\n{all}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Build `examples/c/NAME.c` against librdmacm's rsocket header, run it as `NAME -s` and
/// `NAME -c SERVER` in the test's namespace, and check that both succeed and print what is
/// wanted.
fn rsocket_c_pair(t: &str, name: &str, server_wants: &[&str], client_wants: &[&str]) {
    let Some((dir, exe)) = build_c_example(
        t,
        name,
        "/usr/include/rdma/rsocket.h",
        "librdmacm-dev",
        &["-lrdmacm", "-libverbs"],
    ) else {
        return;
    };
    let (s, c, status) = pair_when(
        Ready::CmListen,
        &format!("{} -s", exe.display()),
        &format!("{} -c", exe.display()),
    );
    let all = format!("{t}\n--- server\n{s}\n--- client\n{c}\n{status}");
    assert_eq!(status, "server=0 client=0", "{all}");
    assert_says("server", &s, server_wants, &all);
    assert_says("client", &c, client_wants, &all);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The rsocket calls a TCP program makes (examples/c/rsocket_echo.c): messages of 1 byte to
/// 200 KiB echoed and checked, `MSG_PEEK`, `rpoll` on an rsocket with an ordinary pipe,
/// `rgetpeername`, a half-close read as EOF by the peer, the peer's close read as EOF, EBADF
/// after `rclose`, and a `SOCK_SEQPACKET` rsocket refused with EOPNOTSUPP; the client's
/// connects are non-blocking (`EINPROGRESS`, `EAGAIN` from a read meanwhile, `POLLOUT` once
/// made; one to a port nobody listens on `POLLERR` with `SO_ERROR` `ECONNREFUSED`).
#[test]
fn rsockets_in_a_c_program_both_ends() {
    rsocket_c_pair(
        "rsockets_in_a_c_program_both_ends",
        "rsocket_echo",
        &[
            "accepted from 127.0.0.2",
            "rpoll: rsocket readable, pipe not",
            "EOF after 1644069 bytes",
            "ok",
        ],
        &[
            "non-blocking connect to a closed port: EINPROGRESS, then POLLERR, ECONNREFUSED",
            "non-blocking connect: EINPROGRESS, then POLLOUT",
            "connected to 127.0.0.1:7471",
            "echoed 1644069 bytes",
            "EOF from the server",
            "ok",
        ],
    );
}

/// Datagram rsockets in a C program (examples/c/rsocket_dgram.c): an unbound client's
/// datagrams of 1 to 2040 bytes echoed and checked, the source rrecvfrom reports being the
/// server's address and port, 2041 bytes refused (EMSGSIZE), MSG_PEEK, truncation, EAGAIN,
/// rpoll, rconnect then rsend/rrecv, rlisten refused, a burst whose every arriving datagram
/// the server checks, EBADF after rclose; foreign and malformed datagrams on the server's
/// UDP side channel ignored, a well-formed one answered with rdma-core's control message as
/// a plain UDP socket reads it. The server's capture is clean RoCE v2 (the UD messages with
/// rdma-core's `ds_header` in front of the data).
#[test]
fn datagram_rsockets_in_a_c_program_both_ends() {
    let t = "datagram_rsockets_in_a_c_program_both_ends";
    let Some((dir, exe)) = build_c_example(
        t,
        "rsocket_dgram",
        "/usr/include/rdma/rsocket.h",
        "librdmacm-dev",
        &["-lrdmacm", "-libverbs"],
    ) else {
        return;
    };
    let pcap = dir.join("server.pcap");
    let e = exe.display();
    let o = in_netns(&format!(
        "export LD_LIBRARY_PATH=$LIB\n\
         S=$(mktemp)\n\
         FERROCE_DEBUG=1 FERROCE_PCAP={p} FERROCE_ADDR=127.0.0.1 timeout 90 {e} -s 127.0.0.1 > $S 2>&1 &\n\
         s=$!\n\
         i=0; while [ $i -lt 200 ] && ! grep -q bound $S; do sleep 0.05; i=$((i+1)); done\n\
         FERROCE_ADDR=127.0.0.2 timeout 90 {e} -c 127.0.0.1 2>&1\n\
         echo client=$?\n\
         wait $s; echo server=$?\n\
         echo '--- server'; cat $S",
        p = pcap.display()
    ));
    let o = output_text(&o);
    for want in [
        "side channel: control answer, QPN 0x",
        "echoed 13 sizes, 1 to 2040 bytes",
        "bound to 127.0.0.2 with a port",
        "2041 bytes: EMSGSIZE",
        "non-blocking rrecv: EAGAIN",
        "MSG_PEEK then read: same datagram",
        "truncated to 10 bytes, rest discarded",
        "rpoll with a pipe and rselect: socket readable, pipe not",
        "connected: rsend/rrecv echoed",
        "client=0",
        "server=0",
        ", bad 0",
    ] {
        assert!(o.contains(want), "{t}: no {want:?} in\n{o}");
    }
    assert_eq!(o.matches("\nok\n").count(), 2, "{t}: both ends say ok\n{o}");
    // UD may drop (a full receive queue), never corrupt: some of the burst arrived, intact.
    let burst = o
        .lines()
        .find_map(|l| l.strip_prefix("burst of 300: "))
        .unwrap_or_else(|| panic!("{t}: no burst line\n{o}"));
    assert!(burst.ends_with(" 0 corrupt"), "{t}: {burst}\n{o}");
    // The five malformed side-channel datagrams were counted as dropped (FERROCE_DEBUG says
    // so when the socket closes).
    let dropped = o
        .lines()
        .find_map(|l| {
            l.strip_prefix("ferroce librdmacm: datagram rsocket ")?
                .split_once(": ")?
                .1
                .split_once(" datagrams dropped")
        })
        .and_then(|(n, _)| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{t}: no count of dropped datagrams\n{o}"));
    assert!(dropped >= 5, "{t}: {dropped} dropped\n{o}");
    check_capture(&pcap);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Debian's `udpong` (rdmacm-utils) at both ends on ferroce's datagram rsockets: latency
/// (echo) tests of 64 to 1,536 bytes in its non-blocking, blocking, `rpoll` and
/// blocking-`rpoll` modes, and bandwidth tests (the count printed is what the server
/// received: UD may drop, so it is only checked to be non-zero). Every run must print its
/// result line. rdma-core's own datagram rsockets do not run on RoCE (rxe: `rconnect`
/// fails), so this is the only pairing there is.
///
/// udpong resends a request unanswered after 1 ms, and an answer that comes later stays in
/// flight for good (each stale echo it reads makes it send again); with an 8-bit sequence
/// number, a stale echo can end a test early, which it then skips without a word. On a
/// loaded 2-core machine (the suite runs alongside) replies sometimes take longer than 1 ms,
/// so runs are short and a run without its result line is tried again (up to three times).
/// udpong's whole default run (180,000 exchanges) passes on a quiet machine (docs/cabi.md)
/// and degrades under load as described.
#[test]
fn udpong_both_ends_on_ferroces_datagram_rsockets() {
    let t = "udpong_both_ends_on_ferroces_datagram_rsockets";
    if !ready(t, &["udpong"]) {
        return;
    }
    let runs = [
        "-C 500 -S 64 -T e",
        "-C 500 -S 1000 -T e",
        "-C 500 -S 1536 -T e",
        "-C 500 -S 100 -T e -T b",
        "-C 500 -S 1000 -T e -T a",
        "-C 500 -S 500 -T e -T a -T b",
        "-C 20000 -S 64",
        "-C 5000 -S 1500 -T b",
        "-C 5000 -S 768 -T a",
    ];
    udpong_runs(t, "", "", "127.0.0.1", "127.0.0.2", &runs);
}

/// Runs `udpong -s SERVER RUN` from `client` for each of `runs` against one `udpong -b
/// SERVER` (started with `server_env`) after the shell lines `setup`, each run tried again
/// (up to three times) when udpong skips its result line, and checks that every run ends
/// well with its result line and a non-zero transfer count. The output.
fn udpong_runs(
    t: &str,
    setup: &str,
    server_env: &str,
    server: &str,
    client: &str,
    runs: &[&str],
) -> String {
    let o = in_netns(&format!(
        "{setup}\n\
         export LD_LIBRARY_PATH=$LIB\n\
         S=$(mktemp); D=$(mktemp)\n\
         {server_env} FERROCE_ADDR={server} timeout 600 udpong -b {server} > $S 2>&1 &\n\
         s=$!\n\
         sleep 0.5\n\
         run() {{\n\
           for try in 1 2 3; do\n\
             FERROCE_ADDR={client} timeout 60 udpong -s {server} \"$@\" > $D 2>&1; rc=$?\n\
             [ $rc = 0 ] && grep -q '^custom ' $D && break\n\
             echo \"=== try $try of udpong $*: status $rc\"; sed 's/^/try| /' $D\n\
           done\n\
           echo \"=== udpong $*\"; cat $D; echo client=$rc\n\
         }}\n\
         {}\n\
         kill $s; wait $s",
        runs.iter()
            .map(|r| format!("run {r}"))
            .collect::<Vec<_>>()
            .join("\n")
    ));
    let o = output_text(&o);
    assert_eq!(o.matches("client=0").count(), runs.len(), "{t}\n{o}");
    let results: Vec<&str> = o.lines().filter(|l| l.starts_with("custom ")).collect();
    assert_eq!(results.len(), runs.len(), "{t}\n{o}");
    for l in &results {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(f.len(), 7, "{t}: {l}\n{o}");
        // xfers (e.g. "1k", "19k", "4k"): never 0.
        assert!(!f[2].starts_with('0'), "{t}: {l}\n{o}");
    }
    o
}

/// `udpong` at both ends over IPv6 (two addresses of a ULA prefix on `lo`; the GIDs are the
/// addresses themselves), the server capturing: datagram rsockets over RoCE v2 on IPv6, and
/// a capture of the UDP socket backend over IPv6 that tshark finds clean (the backend
/// synthesises the headers of what it receives; the capture fills in their UDP checksum).
#[test]
fn udpong_over_ipv6_with_a_clean_capture() {
    let t = "udpong_over_ipv6_with_a_clean_capture";
    if !ready(t, &["udpong"]) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferroce-{t}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("server.pcap");
    let o = udpong_runs(
        t,
        "ip -6 addr add fd00::1/128 dev lo nodad && ip -6 addr add fd00::2/128 dev lo nodad || exit 98",
        &format!("FERROCE_PCAP={}", pcap.display()),
        "fd00::1",
        "fd00::2",
        &["-C 500 -S 100 -T e", "-C 1000 -S 1000"],
    );
    // At least the echoes of the first run, both ways.
    let frames = std::fs::metadata(&pcap).map_or(0, |m| m.len()) / 100;
    assert!(frames >= 1000, "{t}: capture of {frames}00 bytes\n{o}");
    check_capture(&pcap);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An rsocket whose peer is killed (examples/c/rsocket_keepalive.c): a process killed with
/// SIGKILL cannot disconnect (rdma-core's kernel would send its DREQ; a library cannot), so
/// the server's blocked read can only learn of it from keepalives. With `SO_KEEPALIVE` and
/// `TCP_KEEPIDLE` 1 s (read back as set) the unacknowledged keepalive fails the connection
/// and the read returns -1; the script's 60 s timeout would end a read that waited on.
#[test]
fn rsocket_keepalive_ends_a_read_from_a_killed_peer() {
    let t = "rsocket_keepalive_ends_a_read_from_a_killed_peer";
    let Some((dir, exe)) = build_cm_example(t, "rsocket_keepalive") else {
        return;
    };
    let e = exe.display();
    let o = in_netns(&format!(
        "export LD_LIBRARY_PATH=$LIB\n\
         L=$(mktemp -u); S=$(mktemp)\n\
         FERROCE_LISTENING=$L FERROCE_ADDR=127.0.0.1 timeout 60 {e} -s 127.0.0.1 1 > $S 2>&1 &\n\
         s=$!\n\
         i=0; while [ $i -lt 400 ] && ! [ -e $L ]; do sleep 0.05; i=$((i+1)); done\n\
         FERROCE_ADDR=127.0.0.2 {e} -c 127.0.0.1 > /dev/null 2>&1 &\n\
         c=$!\n\
         i=0; while [ $i -lt 400 ] && ! grep -q 'got hello' $S; do sleep 0.05; i=$((i+1)); done\n\
         kill -9 $c\n\
         wait $s; echo \"server=$?\"\n\
         cat $S; rm -f $L $S"
    ));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_says(
        "server",
        &out,
        &[
            "SO_KEEPALIVE 1, TCP_KEEPIDLE 1",
            "got hello",
            "read after the peer died: -1",
            "server=0",
        ],
        &out,
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Peers that break the rsocket protocol (examples/c/rsocket_hostile.c, plain librdmacm and
/// verbs on the attacking side): connection data of another version and too short are
/// rejected and the server's blocking `raccept` passes over them; a connected peer that
/// claims a 16 MiB message in a 256 KiB ring makes `rrecv` fail with EPROTO (before, the
/// claim was believed and stale ring bytes returned as data), and the server's close
/// disconnects it. A fourth writes "hello" and disconnects with a DREQ only (no rsocket
/// disconnect message, as when the peer's process dies): the server's blocking `rrecv`
/// returns "hello", then the end of the stream (before 2026-12-06 it waited forever: the
/// DREQ went unread). A fifth withholds its RTU until the server says it accepted: the
/// server's non-blocking `raccept` hands the socket out before the connection is established
/// (before, it waited for the RTU, so both sides waited until the server's 20 s gave up), and
/// the socket reads the end of the stream once the peer establishes and leaves.
#[test]
fn rsockets_refuse_peers_that_break_the_protocol() {
    rsocket_c_pair(
        "rsockets_refuse_peers_that_break_the_protocol",
        "rsocket_hostile",
        &[
            "accepted the third peer",
            "rrecv: EPROTO",
            "accepted the fourth peer",
            "rrecv: hello, then the end of the stream",
            "accepted the fifth peer before its RTU",
            "rrecv: the fifth peer's end of the stream",
            "ok",
        ],
        &[
            "version 2: rejected",
            "8 bytes: rejected",
            "claimed 16 MiB",
            "disconnected by the server",
            "fourth peer: wrote hello, disconnected without the rsocket message",
            "fifth peer: REP received, RTU withheld",
            "fifth peer: accepted before its RTU, then established and left",
            "ok",
        ],
    );
}

/// Unmodified TCP programs over RDMA: iperf3 at both ends with rdma-core's own socket
/// preload library (Debian's `librspreload.so`, which turns a program's TCP sockets into
/// rsockets) on this library's rsockets: the control and the data connection are RC QPs, and
/// the 20 MiB the client sends reach the server.
#[test]
fn iperf3_over_rdma_cores_socket_preload_on_ferroces_rsockets() {
    let t = "iperf3_over_rdma_cores_socket_preload_on_ferroces_rsockets";
    let preload = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so";
    if !ready(t, &["iperf3"])
        || !have(
            std::path::Path::new(preload).exists(),
            t,
            "rdma-core's librspreload.so (librdmacm1)",
        )
    {
        return;
    }
    // The server's capture: the preload falls back to kernel TCP when an rsocket cannot be
    // made or connected, so the bytes must be seen going over RoCE.
    let dir = std::env::temp_dir().join(format!("ferroce-{t}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("server.pcap");
    let (s, c, st) = pair_when(
        Ready::CmListen,
        &format!(
            "env LD_PRELOAD={preload} FERROCE_PCAP={} iperf3 -s -B 127.0.0.1 -1",
            pcap.display()
        ),
        &format!("env LD_PRELOAD={preload} iperf3 -n 20M -c"),
    );
    let all = format!("{t}\n--- server\n{s}\n--- client\n{c}\n{st}");
    assert_eq!(st, "server=0 client=0", "{all}");
    let captured = std::fs::metadata(&pcap).map(|m| m.len()).unwrap_or(0);
    assert!(
        captured > 20 << 20,
        "the server's RoCE capture holds {captured} bytes: the 20 MiB did not go over RDMA\n{all}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    // The client wrote all 20 MiB. iperf3's server closes its data socket when the client's
    // TEST_END comes over the control connection, without reading what is still queued
    // (iperf_handle_message_server); over rsockets, whose send returns once the data is
    // posted, up to a receive ring (128 KiB) can be unread then: 1 run in 10 of this test
    // beside the other rsocket tests, on the code before and after 2026-12-06, showed 19.9.
    // So the server's count may be short by that much, no more.
    assert!(
        c.lines()
            .any(|l| l.contains("20.0 MBytes") && l.trim_end().ends_with("sender")),
        "client: no sender line with 20.0 MBytes\n{all}"
    );
    for (who, o) in [("server", &s), ("client", &c)] {
        let got = o
            .lines()
            .filter(|l| l.trim_end().ends_with("receiver"))
            .find_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                let i = w.iter().position(|x| *x == "MBytes")?;
                w.get(i.checked_sub(1)?)?.parse::<f64>().ok()
            });
        assert!(
            got.is_some_and(|mb| (19.8..=20.0).contains(&mb)),
            "{who}: the receiver line gives {got:?} MBytes, not 19.8-20.0\n{all}"
        );
    }
}

/// The lines of section `name` of a script's output (after its `--- NAME` line, up to the next
/// `--- `), each with its whitespace runs made one space, blank lines left out.
fn lines_of(o: &str, name: &str) -> Vec<String> {
    o.split(&format!("--- {name}\n"))
        .nth(1)
        .unwrap_or("")
        .split("--- ")
        .next()
        .unwrap_or("")
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect()
}

/// Runs `script` in a network namespace of its own with a veth pair, va (10.9.0.1/24) and vb,
/// both up and va's link up, and a shell function `lower_up` that waits (bounded) until va has
/// its link again. Its output, then its errors.
fn with_veth_pair(script: &str) -> String {
    let setup = "ip link set lo up || exit 99\n\
        ip link add va type veth peer name vb && ip addr add 10.9.0.1/24 dev va \
          && ip link set va up && ip link set vb up || exit 99\n\
        lower_up() { i=0; while [ $i -lt 100 ] && ! ip link show va | grep -q LOWER_UP; do \
          sleep 0.05; i=$((i+1)); done; }\n\
        lower_up";
    output_text(&in_netns_lo(setup, script))
}

/// The GID table follows the interface's addresses as rxe's does (checked in the
/// `tools/rxe-peer` guest, Debian's `ibv_devinfo -v` and `ibv_asyncwatch` on rxe0 over eth0 with
/// its link-local and IPv4 addresses at 0 and 1: `ip addr add 10.77.0.99/24` gave
/// `GID[2] ::ffff:10.77.0.99` and one `IBV_EVENT_GID_CHANGE (18), port 1`; its removal emptied
/// index 2 with one more; `ip -6 addr add fd77::99/64` then took index 2 with one more, the
/// others unmoved; `ip link set eth0 down` and `up` then raised one more, for the global
/// address the kernel removed, with PORT_ERR and PORT_ACTIVE, the link-local default GID staying
/// at index 0). The same steps on a veth with a device that serves every address
/// (`FERROCE_BACKEND=packet`; only the table is looked at, no packet is sent): the same
/// indexes and the same events, on a context that holds no object.
#[test]
fn the_gid_table_and_its_events_follow_the_interface_addresses() {
    let t = "the_gid_table_and_its_events_follow_the_interface_addresses";
    if !ready(t, &["ibv_devinfo", "ibv_asyncwatch", "stdbuf"]) {
        return;
    }
    let script = "export LD_LIBRARY_PATH=$LIB FERROCE_DEV=va FERROCE_BACKEND=packet\n\
        i=0; while [ $i -lt 100 ] && ! ip -6 addr show dev va scope link | grep -q fe80; do \
          sleep 0.05; i=$((i+1)); done\n\
        g() { echo \"--- $1\"; ibv_devinfo -v | grep 'GID\\['; }\n\
        A=$(mktemp); timeout 20 stdbuf -oL ibv_asyncwatch > $A 2>&1 & a=$!\n\
        i=0; while [ $i -lt 100 ] && ! grep -q 'async event FD' $A; do sleep 0.05; i=$((i+1)); done\n\
        ev() { i=0; while [ $i -lt 100 ] && [ $(grep -c GID_CHANGE $A) -lt $1 ]; do sleep 0.05; i=$((i+1)); done; }\n\
        g start\n\
        ip addr add 10.9.0.99/24 dev va; ev 1; g added\n\
        ip addr del 10.9.0.99/24 dev va; ev 2; g deleted\n\
        ip -6 addr add fd77::99/64 dev va nodad; ev 3; g v6\n\
        ip link set va down; ev 4; ip link set va up; lower_up\n\
        i=0; while [ $i -lt 100 ] && ! grep -q PORT_ACTIVE $A; do sleep 0.05; i=$((i+1)); done\n\
        i=0; while [ $i -lt 100 ] && ! ip -6 addr show dev va scope link | grep -q fe80; do \
          sleep 0.05; i=$((i+1)); done\n\
        g flap\n\
        sleep 0.3; kill $a; wait $a; echo '--- asyncwatch'; cat $A; rm -f $A";
    let o = with_veth_pair(script);
    let section = |name: &str| lines_of(&o, name);
    let start = section("start");
    assert_eq!(start.len(), 2, "{o}");
    assert!(start[0].starts_with("GID[ 0]: fe80::"), "{o}");
    assert_eq!(start[1], "GID[ 1]: ::ffff:10.9.0.1, RoCE v2", "{o}");
    let with = |extra: &str| {
        let mut v = start.clone();
        v.push(format!("GID[ 2]: {extra}, RoCE v2"));
        v
    };
    assert_eq!(section("added"), with("::ffff:10.9.0.99"), "{o}");
    assert_eq!(section("deleted"), start, "{o}");
    assert_eq!(section("v6"), with("fd77::99"), "{o}");
    // down and up: the global IPv6 address is gone; the link-local one, the default GID,
    // stayed at index 0 throughout
    assert_eq!(section("flap"), start, "{o}");
    let events: Vec<String> = section("asyncwatch")
        .into_iter()
        .filter(|l| l.contains("event_type"))
        .collect();
    let count = |e: &str| events.iter().filter(|l| l.contains(e)).count();
    assert_eq!(count("IBV_EVENT_GID_CHANGE (18), port 1"), 4, "{o}");
    assert_eq!(count("IBV_EVENT_PORT_ERR (10), port 1"), 1, "{o}");
    assert_eq!(count("IBV_EVENT_PORT_ACTIVE (9), port 1"), 1, "{o}");
    assert_eq!(events.len(), 6, "{o}");
}

/// An address the interface gains while a program runs is served from then on, as on a
/// kernel RoCE device: Debian's `rping` server listening on the wildcard address, its NIC
/// running (UDP backend, a socket per address), gets a socket for 10.9.0.99 once it is added
/// to its interface, and a client on the other veth end pings it there. Before, the UDP
/// backend served only the addresses bound at the NIC's start: the client's REQ to the new
/// address met no socket.
#[test]
fn an_address_gained_while_a_server_runs_is_served() {
    let t = "an_address_gained_while_a_server_runs_is_served";
    if !ready(t, &["rping", "ss"]) {
        return;
    }
    let script = "ip addr add 10.9.0.2/24 dev vb || exit 98\n\
        export LD_LIBRARY_PATH=$LIB\n\
        L=$(mktemp -u)\n\
        FERROCE_LISTENING=$L FERROCE_DEV=va timeout 30 rping -s -a 0.0.0.0 -C 3 -v > $L.s 2>&1 &\n\
        i=0; while [ $i -lt 200 ] && [ ! -s $L ]; do sleep 0.05; i=$((i+1)); done\n\
        echo '--- before'; ss -Huan | awk '{print $4}' | grep '^10\\.' | sort\n\
        ip addr add 10.9.0.99/24 dev va\n\
        i=0; while [ $i -lt 200 ] && ! ss -Huan | grep -q '10.9.0.99:4791'; do sleep 0.05; i=$((i+1)); done\n\
        echo '--- after'; ss -Huan | awk '{print $4}' | grep '^10\\.' | sort\n\
        FERROCE_DEV=vb timeout 20 rping -c -a 10.9.0.99 -C 3 -v > $L.c 2>&1\n\
        c=$?; wait $!; echo '--- result'; echo \"server=$? client=$c\"\n\
        echo '--- server'; cat $L.s; echo '--- client'; cat $L.c; rm -f $L $L.s $L.c";
    let o = with_veth_pair(script);
    assert_eq!(lines_of(&o, "before"), ["10.9.0.1:4791"], "{o}");
    assert_eq!(
        lines_of(&o, "after"),
        ["10.9.0.1:4791", "10.9.0.99:4791"],
        "{o}"
    );
    assert_eq!(lines_of(&o, "result"), ["server=0 client=0"], "{o}");
    for side in ["server", "client"] {
        let pings = lines_of(&o, side)
            .iter()
            .filter(|l| l.contains("ping data: rdma-ping-"))
            .count();
        assert_eq!(pings, 3, "{side}: {o}");
    }
}

/// The port's width and speed come from its interface's Ethernet speed as rxe's do (the table in
/// `PortRate::for_ethernet`, read from rxe in the tools/rxe-peer guest at each speed): Debian's
/// `ibv_devinfo -v` on a veth (10 Gb/s) shows 1X FDR10, on loopback (no speed) 1X SDR, and on a
/// tap whose speed `ethtool -s` sets and then changes, the rate of each speed at once.
#[test]
fn port_rate_follows_the_interface_speed() {
    let t = "port_rate_follows_the_interface_speed";
    if !ready(t, &["ibv_devinfo", "ethtool"]) {
        return;
    }
    let script = "export LD_LIBRARY_PATH=$LIB\n\
        r() { echo \"--- $1\"; FERROCE_DEV=$2 ibv_devinfo -v | grep -E '^[[:space:]]*active_(width|speed):'; }\n\
        ip tuntap add dev t0 mode tap && ip addr add 10.9.1.1/24 dev t0 && ip link set t0 up || exit 99\n\
        r veth va; r lo lo\n\
        for sp in 25000 40000 100000 20000; do\n\
          ethtool -s t0 speed $sp duplex full autoneg off || exit 98; r $sp t0; done";
    let o = with_veth_pair(script);
    let rate = |name: &str| lines_of(&o, name);
    let want = |w: &str, s: &str| vec![format!("active_width: {w}"), format!("active_speed: {s}")];
    // rxe's answers (Debian 12, kernel 6.1) for 10, 1 (no speed), 25, 40, 100 and 20 Gb/s.
    for (name, w, s) in [
        ("veth", "1X (1)", "10.0 Gbps (8)"),
        ("lo", "1X (1)", "2.5 Gbps (1)"),
        ("25000", "1X (1)", "25.0 Gbps (32)"),
        ("40000", "4X (2)", "10.0 Gbps (8)"),
        ("100000", "4X (2)", "25.0 Gbps (32)"),
        ("20000", "4X (2)", "5.0 Gbps (2)"),
    ] {
        assert_eq!(rate(name), want(w, s), "{name}: {o}");
    }
}

/// The port follows its interface as rxe's does (`rxe_query_port`, checked against rxe in the
/// `tools/rxe-peer` guest: `ip link set eth0 down` there gave PORT_DOWN/DISABLED and
/// `ibv_asyncwatch` one `IBV_EVENT_PORT_ERR (10), port 1`, and back up PORT_ACTIVE/LINK_UP and
/// one `IBV_EVENT_PORT_ACTIVE (9), port 1`): on a veth whose peer goes down (no carrier)
/// `ibv_devinfo -v` shows PORT_DOWN and POLLING, with the interface itself down DISABLED,
/// and Debian's `ibv_asyncwatch` gets one PORT_ERR when the port leaves the active state and
/// one PORT_ACTIVE when it comes back, on a context that holds no object (the device opened
/// only to watch).
#[test]
fn port_state_and_events_follow_the_interface() {
    let t = "port_state_and_events_follow_the_interface";
    if !ready(t, &["ibv_devinfo", "ibv_asyncwatch", "stdbuf"]) {
        return;
    }
    let script = "export LD_LIBRARY_PATH=$LIB FERROCE_DEV=va\n\
        st() { echo \"--- $1\"; ibv_devinfo -v | grep -E '^[[:space:]]*(state|phys_state):'; }\n\
        st start\n\
        A=$(mktemp); timeout 20 stdbuf -oL ibv_asyncwatch > $A 2>&1 & a=$!\n\
        i=0; while [ $i -lt 100 ] && ! grep -q 'async event FD' $A; do sleep 0.05; i=$((i+1)); done\n\
        ip link set vb down; sleep 0.3; st 'peer down'\n\
        ip link set va down; sleep 0.3; st 'both down'\n\
        ip link set va up; ip link set vb up; lower_up\n\
        i=0; while [ $i -lt 100 ] && ! grep -q PORT_ACTIVE $A; do sleep 0.05; i=$((i+1)); done\n\
        st 'up again'\n\
        kill $a; wait $a; echo '--- asyncwatch'; cat $A; rm -f $A";
    let o = with_veth_pair(script);
    let section = |name: &str| lines_of(&o, name);
    let want =
        |state: &str, phys: &str| vec![format!("state: {state}"), format!("phys_state: {phys}")];
    assert_eq!(
        section("start"),
        want("PORT_ACTIVE (4)", "LINK_UP (5)"),
        "{o}"
    );
    assert_eq!(
        section("peer down"),
        want("PORT_DOWN (1)", "POLLING (2)"),
        "{o}"
    );
    assert_eq!(
        section("both down"),
        want("PORT_DOWN (1)", "DISABLED (3)"),
        "{o}"
    );
    assert_eq!(
        section("up again"),
        want("PORT_ACTIVE (4)", "LINK_UP (5)"),
        "{o}"
    );
    let events: Vec<String> = section("asyncwatch")
        .into_iter()
        .filter(|l| l.starts_with("event_type"))
        .collect();
    assert_eq!(
        events,
        [
            "event_type IBV_EVENT_PORT_ERR (10), port 1",
            "event_type IBV_EVENT_PORT_ACTIVE (9), port 1"
        ],
        "{o}"
    );
}

/// examples/c/port_events_fork.c: a child of fork(2) whose parent had opened and closed the
/// device just before gets its port events too (the link watcher is a thread, and a child has
/// none of its parent's; it used to believe the parent's still ran and got no event).
#[test]
fn a_forked_child_gets_port_events() {
    let t = "a_forked_child_gets_port_events";
    let Some((dir, exe)) = build_verbs_example(t, "port_events_fork") else {
        return;
    };
    let script = format!(
        "O=$(mktemp); timeout 30 $F run -d va -- {} > $O 2>&1 & p=$!\n\
         i=0; while [ $i -lt 200 ] && ! grep -q 'child ready' $O; do sleep 0.05; i=$((i+1)); done\n\
         ip link set vb down\n\
         wait $p; echo \"rc=$?\"; cat $O; rm -f $O",
        exe.display()
    );
    let o = with_veth_pair(&script);
    assert!(o.lines().any(|l| l == "rc=0"), "{o}");
    assert!(
        o.lines()
            .any(|l| l == "child event: IBV_EVENT_PORT_ERR, port 1"),
        "{o}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Several programs on one address, as several programs on one kernel RoCE device: with the
/// UDP backend each binds the address's port 4791 with `SO_REUSEPORT` and a slot of its own
/// (`ferroce::io::share`: its QPNs in its slot's block), and frames the kernel hands to the
/// wrong program's socket are passed on to the right one. Debian's `ibv_rc_pingpong` server on
/// the veth's 10.9.0.1 holds the address throughout; an `ib_write_bw` server and its client on
/// the same address run a 2-second test meanwhile (three programs on 10.9.0.1, three sockets
/// on its port); then an `ibv_rc_pingpong` client from the other end's 10.9.0.2 reaches the
/// first server. Both pairs complete, and the three programs' QPNs are in three blocks. With
/// `FERROCE_SHARE=0` a program on the held address is refused as before (one RoCE endpoint per
/// address). Before, the second program on an address was refused at its first object
/// (`EADDRINUSE`).
#[test]
fn several_programs_share_one_address_as_on_one_kernel_device() {
    let t = "several_programs_share_one_address_as_on_one_kernel_device";
    if !ready(t, &["ibv_rc_pingpong", "ib_write_bw", "ss"]) {
        return;
    }
    let script = "ip addr add 10.9.0.2/24 dev vb || exit 98\n\
        export LD_LIBRARY_PATH=$LIB\n\
        L=$(mktemp -u)\n\
        tcp() { i=0; while [ $i -lt 200 ] && ! ss -Hltn | grep -q \":$1 \"; do sleep 0.05; i=$((i+1)); done; }\n\
        n() { ss -Huan | grep -c '10\\.9\\.0\\.1:4791'; }\n\
        FERROCE_DEV=va timeout 60 ibv_rc_pingpong -g 1 -p 18515 -n 500 > $L.ps 2>&1 & ps=$!\n\
        tcp 18515\n\
        FERROCE_SHARE=0 FERROCE_DEV=va timeout 20 ibv_rc_pingpong -g 1 -p 18517 -n 5 > $L.x 2>&1; x=$?\n\
        FERROCE_DEV=va timeout 60 ib_write_bw -x 1 -p 18516 -D 2 > $L.bs 2>&1 & bs=$!\n\
        tcp 18516\n\
        FERROCE_DEV=va timeout 60 ib_write_bw -x 1 -p 18516 -D 2 10.9.0.1 > $L.bc 2>&1 & bc=$!\n\
        i=0; while [ $i -lt 200 ] && [ $(n) -lt 3 ]; do sleep 0.02; i=$((i+1)); done\n\
        echo '--- sockets'; n\n\
        wait $bs; c=$?; wait $bc; d=$?\n\
        FERROCE_DEV=vb timeout 60 ibv_rc_pingpong -g 1 -p 18515 -n 500 10.9.0.1 > $L.pc 2>&1; b=$?\n\
        wait $ps; a=$?\n\
        echo '--- result'; echo \"$a $b $c $d $x\"\n\
        echo '--- refused'; cat $L.x\n\
        for f in ps pc bs bc; do echo \"--- $f\"; cat $L.$f; done; rm -f $L.*";
    let o = with_veth_pair(script);
    assert_eq!(lines_of(&o, "sockets"), ["3"], "{o}");
    let r = lines_of(&o, "result");
    assert!(r.len() == 1 && r[0].starts_with("0 0 0 0 "), "{o}");
    assert_ne!(r[0], "0 0 0 0 0", "the unshared program ran: {o}");
    assert!(
        lines_of(&o, "refused")
            .iter()
            .any(|l| l.contains("UDP port 4791 on 10.9.0.1 is in use")),
        "{o}"
    );
    for side in ["ps", "pc"] {
        assert!(
            lines_of(&o, side)
                .iter()
                .any(|l| l.contains("500 iters in")),
            "{side}: {o}"
        );
    }
    for side in ["bs", "bc"] {
        assert!(
            lines_of(&o, side).iter().any(|l| l.starts_with("65536 ")),
            "{side}: {o}"
        );
    }
    // The QPN of each of the three programs on 10.9.0.1 (its "local address" line): one
    // block each.
    let qpn = |side: &str| -> Option<u32> {
        lines_of(&o, side).iter().find_map(|l| {
            let l = l.strip_prefix("local address:")?;
            let at = l.find("QPN ")? + 4;
            let v = l[at..].split([',', ' ']).next()?;
            u32::from_str_radix(v.trim_start_matches("0x"), 16).ok()
        })
    };
    let blocks: std::collections::BTreeSet<u32> = ["ps", "bs", "bc"]
        .iter()
        .map(|s| qpn(s).unwrap_or_else(|| panic!("no QPN of {s}: {o}")) >> 16)
        .collect();
    assert_eq!(blocks.len(), 3, "{o}");
}

/// RDMA-CM programs on one shared address, as on one kernel RoCE device: a CM message to QP1
/// (each program has its own) goes to the program it is for — a REQ to the one that listens
/// on its service, a reply to the one whose communication ID it names
/// (`ferroce::io::share`). Debian's `rping`: a server on 10.9.0.1:7001 and its client on
/// the same address, a server on the wildcard address's port 7002 and its client from the
/// other end's 10.9.0.2, all at once; a second server on 10.9.0.1:7001 is refused at
/// `rdma_bind_addr` (`EADDRINUSE`, as by the kernel), and a client to a port nobody
/// listens on is rejected (REJ reason 8, invalid service ID) — not left to time out. Before
/// the CM messages were routed, the REP and the RTU reached whichever program the kernel's
/// hash chose.
#[test]
fn rdma_cm_programs_share_one_address() {
    let t = "rdma_cm_programs_share_one_address";
    if !ready(t, &["rping", "ss"]) {
        return;
    }
    let script = "ip addr add 10.9.0.2/24 dev vb || exit 98\n\
        export LD_LIBRARY_PATH=$LIB FERROCE_DEV=va\n\
        L=$(mktemp -u)\n\
        up() { i=0; while [ $i -lt 200 ] && [ ! -s $1 ]; do sleep 0.05; i=$((i+1)); done; }\n\
        FERROCE_LISTENING=$L.l1 timeout 30 rping -s -a 10.9.0.1 -p 7001 -C 5 -v > $L.s1 2>&1 & s1=$!\n\
        FERROCE_LISTENING=$L.l2 timeout 30 rping -s -a 0.0.0.0 -p 7002 -C 5 -v > $L.s2 2>&1 & s2=$!\n\
        up $L.l1; up $L.l2\n\
        timeout 20 rping -s -a 10.9.0.1 -p 7001 -C 1 > $L.dup 2>&1; dup=$?\n\
        timeout 20 rping -c -a 10.9.0.1 -p 7009 -C 1 -v > $L.none 2>&1; none=$?\n\
        timeout 30 rping -c -a 10.9.0.1 -p 7001 -C 5 -v > $L.c1 2>&1 & c1=$!\n\
        FERROCE_DEV=vb timeout 30 rping -c -a 10.9.0.1 -p 7002 -C 5 -v > $L.c2 2>&1; c2=$?\n\
        wait $c1; c1=$?; wait $s1; s1=$?; wait $s2; s2=$?\n\
        echo '--- result'; echo \"$s1 $c1 $s2 $c2 $dup $none\"\n\
        for f in s1 c1 s2 c2 dup none; do echo \"--- $f\"; cat $L.$f; done; rm -f $L.*";
    let o = with_veth_pair(script);
    let r = lines_of(&o, "result");
    assert!(r.len() == 1 && r[0].starts_with("0 0 0 0 "), "{o}");
    assert_ne!(r[0], "0 0 0 0 0 0", "{o}");
    for side in ["s1", "c1", "s2", "c2"] {
        let pings = lines_of(&o, side)
            .iter()
            .filter(|l| l.contains("ping data: rdma-ping-"))
            .count();
        assert_eq!(pings, 5, "{side}: {o}");
    }
    assert!(
        lines_of(&o, "dup")
            .iter()
            .any(|l| l.contains("rdma_bind_addr") && l.contains("Address already in use")),
        "{o}"
    );
    assert!(
        lines_of(&o, "none")
            .iter()
            .any(|l| l.contains("RDMA_CM_EVENT_REJECTED, error 8")),
        "{o}"
    );
}

/// Three Debian `rping` clients at once, all on one shared address (127.0.0.2), against
/// ferroce's own persistent server (`ferroce rping -s -P` on 127.0.0.1): every client
/// completes its pings. The three present one CA GUID (the interface's MAC) to the server's
/// CM; sharing numbers each program's QPs in a block of its own, so their (CA GUID, QPN) pairs
/// differ. Before, each program's first QP was 0x11 and the server's CM took the second and
/// third REQs for stale connections of the first (REJ reason 10: seen in 3 of 3 runs with
/// `FERROCE_SHARE=0` and an address each).
#[test]
fn three_rping_clients_on_one_address_reach_one_server() {
    let t = "three_rping_clients_on_one_address_reach_one_server";
    if !ready(t, &["rping", "ss"]) {
        return;
    }
    let script = "export FERROCE_DEV=lo\n\
        L=$(mktemp -u)\n\
        env -u LD_LIBRARY_PATH timeout 60 $F rping --ib-dev lo --backend udp -s -P -v \
          -a 127.0.0.1 > $L.s 2>&1 & S=$!\n\
        i=0; while [ $i -lt 400 ] && [ -z \"$(ss -Huan)\" ]; do sleep 0.05; i=$((i+1)); done\n\
        for k in 1 2 3; do LD_LIBRARY_PATH=$LIB FERROCE_ADDR=127.0.0.2 timeout 30 \
          rping -c -v -C 20 -a 127.0.0.1 > $L.c$k 2>&1 & eval C$k=\\$!; done\n\
        wait $C1; r1=$?; wait $C2; r2=$?; wait $C3; r3=$?\n\
        kill $S; wait $S\n\
        echo '--- result'; echo \"$r1 $r2 $r3\"\n\
        for k in 1 2 3; do echo \"--- c$k\"; cat $L.c$k; done; rm -f $L.*";
    let o = output_text(&in_netns(script));
    assert_eq!(lines_of(&o, "result"), ["0 0 0"], "{o}");
    for k in 1..=3 {
        let pings = lines_of(&o, &format!("c{k}"))
            .iter()
            .filter(|l| l.contains("ping data: rdma-ping-"))
            .count();
        assert_eq!(pings, 20, "client {k}: {o}");
    }
}

/// A program sharing an address that is killed takes nothing down with it: on a veth's
/// 10.9.0.1, an `ib_write_bw` pair runs a 3-second test while an `ibv_rc_pingpong` server on
/// the same address (the first program: slot 0) is killed with SIGKILL; the pair finishes,
/// and a new pingpong pair on the address (one of them taking the dead program's slot) then
/// runs to the end.
#[test]
fn a_killed_program_leaves_the_others_on_its_address_running() {
    let t = "a_killed_program_leaves_the_others_on_its_address_running";
    if !ready(t, &["ibv_rc_pingpong", "ib_write_bw", "ss"]) {
        return;
    }
    let script = "export LD_LIBRARY_PATH=$LIB FERROCE_DEV=va\n\
        L=$(mktemp -u)\n\
        tcp() { i=0; while [ $i -lt 200 ] && ! ss -Hltn | grep -q \":$1 \"; do sleep 0.05; i=$((i+1)); done; }\n\
        n() { ss -Huan | grep -c '10\\.9\\.0\\.1:4791'; }\n\
        ibv_rc_pingpong -g 1 -p 18515 > $L.victim 2>&1 & v=$!\n\
        tcp 18515\n\
        timeout 60 ib_write_bw -x 1 -p 18516 -D 3 > $L.bs 2>&1 & bs=$!\n\
        tcp 18516\n\
        timeout 60 ib_write_bw -x 1 -p 18516 -D 3 10.9.0.1 > $L.bc 2>&1 & bc=$!\n\
        i=0; while [ $i -lt 200 ] && [ $(n) -lt 3 ]; do sleep 0.02; i=$((i+1)); done\n\
        echo '--- before'; n\n\
        sleep 1; kill -9 $v; wait $v\n\
        echo '--- after'; n\n\
        wait $bs; c=$?; wait $bc; d=$?\n\
        timeout 30 ibv_rc_pingpong -g 1 -p 18517 -n 300 > $L.ps 2>&1 & ps=$!\n\
        tcp 18517\n\
        timeout 30 ibv_rc_pingpong -g 1 -p 18517 -n 300 10.9.0.1 > $L.pc 2>&1; b=$?\n\
        wait $ps; a=$?\n\
        echo '--- result'; echo \"$c $d $a $b\"\n\
        for f in bs bc ps pc; do echo \"--- $f\"; cat $L.$f; done; rm -f $L.*";
    let o = with_veth_pair(script);
    assert_eq!(lines_of(&o, "before"), ["3"], "{o}");
    assert_eq!(lines_of(&o, "after"), ["2"], "{o}");
    assert_eq!(lines_of(&o, "result"), ["0 0 0 0"], "{o}");
    for side in ["bs", "bc"] {
        assert!(
            lines_of(&o, side).iter().any(|l| l.starts_with("65536 ")),
            "{side}: {o}"
        );
    }
    for side in ["ps", "pc"] {
        assert!(
            lines_of(&o, side)
                .iter()
                .any(|l| l.contains("300 iters in")),
            "{side}: {o}"
        );
    }
    // One of the new pair took the killed program's slot: its QPNs are block 0's again.
    let local_qpn = |side: &str| -> Option<u32> {
        lines_of(&o, side).iter().find_map(|l| {
            let l = l.strip_prefix("local address:")?;
            let at = l.find("QPN ")? + 4;
            u32::from_str_radix(
                l[at..].split([',', ' ']).next()?.trim_start_matches("0x"),
                16,
            )
            .ok()
        })
    };
    let blocks: Vec<u32> = ["ps", "pc"]
        .iter()
        .map(|s| local_qpn(s).unwrap_or_else(|| panic!("no QPN of {s}: {o}")) >> 16)
        .collect();
    assert!(blocks.contains(&0), "{blocks:?}: {o}");
}

/// perftest `-R` with its server on an address another program shares: the client connects
/// its test QP right after the exchange, perhaps before the server listens for it again. The
/// server claims its port at `rdma_bind_addr` and listens again only after; a REQ that comes
/// before its claim is held by whichever program the kernel's hash gave it to until the
/// claimant appears (`ferroce::io::share`), then reaches the server's CM. An idle
/// `ibv_rc_pingpong` server holds 10.9.0.1 first; `ib_write_bw -R` server and client run four
/// times, the client from 10.9.0.2, .3, .4 and .5 (four flows: the kernel's hash sends some of
/// them to the idle program's socket). Every run completes, and every REQ on the client's
/// capture (`FERROCE_PCAP`, counted by tshark) is on the server's.
#[test]
fn perftest_rdma_cm_server_on_a_shared_address() {
    let t = "perftest_rdma_cm_server_on_a_shared_address";
    if !ready(t, &["ibv_rc_pingpong", "ib_write_bw", "ss", "tshark"]) {
        return;
    }
    let script = "for k in 2 3 4 5; do ip addr add 10.9.0.$k/24 dev vb || exit 98; done\n\
        export LD_LIBRARY_PATH=$LIB\n\
        L=$(mktemp -u)\n\
        tcp() { i=0; while [ $i -lt 200 ] && ! ss -Hltn | grep -q \":$1 \"; do sleep 0.05; i=$((i+1)); done; }\n\
        FERROCE_DEV=va timeout 120 ibv_rc_pingpong -g 1 -p 18600 > $L.idle 2>&1 & idle=$!\n\
        tcp 18600\n\
        echo '--- runs'\n\
        for k in 2 3 4 5; do\n\
          FERROCE_LISTENING=$L.l$k FERROCE_PCAP=$L.q$k FERROCE_DEV=va timeout 30 ib_write_bw -R -x 1 -n 500 > $L.s$k 2>&1 & s=$!\n\
          i=0; while [ $i -lt 200 ] && [ ! -s $L.l$k ]; do sleep 0.05; i=$((i+1)); done\n\
          FERROCE_PCAP=$L.p$k FERROCE_DEV=vb FERROCE_ADDR=10.9.0.$k timeout 30 ib_write_bw -R -x 1 -n 500 10.9.0.1 > $L.c$k 2>&1; c=$?\n\
          wait $s; echo \"$k $? $c $(awk '$1 == 65536 {print $2}' $L.c$k) reqs $(tshark -r $L.p$k -Y 'infiniband.mad.attributeid == 0x0010' 2>/dev/null | wc -l) $(tshark -r $L.q$k -Y 'infiniband.mad.attributeid == 0x0010' 2>/dev/null | wc -l)\"\n\
        done\n\
        kill $idle; wait $idle\n\
        for k in 2 3 4 5; do echo \"--- c$k\"; tail -5 $L.c$k; echo \"--- s$k\"; tail -5 $L.s$k; done; rm -f $L.*";
    let o = with_veth_pair(script);
    // Each run: both ends exit 0, 500 iterations, and every REQ the client sent (at least two:
    // the exchange's connection and the test QP's) reached the server's CM — its capture, which
    // records what the idle program forwarded to it, holds as many. Before the REQs were held
    // for their claimant, one that reached the idle program was dropped there (it runs no CM)
    // and sent again after the CM's response timeout: the client's capture had one more than
    // the server's. A REQ the client sends again because a loaded machine answered late reaches
    // the server too, and is no failure.
    let runs = lines_of(&o, "runs");
    assert_eq!(runs.len(), 4, "{o}");
    for (k, run) in (2..=5).zip(&runs) {
        let f: Vec<&str> = run.split_whitespace().collect();
        let k = k.to_string();
        assert_eq!(f[..5], [k.as_str(), "0", "0", "500", "reqs"], "{run}: {o}");
        let sent: usize = f[5].parse().unwrap_or_else(|_| panic!("{run}: {o}"));
        let got: usize = f.get(6).and_then(|n| n.parse().ok()).unwrap_or(0);
        // Both connections' REQs reached the server. A copy the client's CM sent again while
        // the idle program held the first takes its place there (the server gets one); until
        // the hold lasted the REQ's response timeout, a REQ held past 2 s went to the idle
        // program and was lost (once under CI load, 2026-12-07: client 3, server 2).
        assert!(sent >= 2 && got >= 2 && got <= sent, "{run}: {o}");
    }
}
