#!/usr/bin/env bash
# shellcheck disable=SC2015  # "check && ok || complain" is intended throughout
# tools/tests/testbed-selftest.sh — end-to-end check of tools/testbed and
# tools/baseline. Needs root. Uses its own namespace prefix (default "frst")
# so it never disturbs a developer's running "fr" testbed; all traffic stays
# inside those namespaces.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: tools/tests/testbed-selftest.sh [--prefix P] [--skip-deps]

Installs the 'net' tool group (tools/deps.sh net), brings the testbed up and
checks routing (TTL 63 via R, IPv4+IPv6), 'loss', 'ecn', 'input-drop', 'rate',
argument validation, both baselines, and teardown. Prints "N passed, M failed"
and exits non-zero if any check failed. Default prefix: frst.
EOF
}

TOOLS="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
PREFIX="${FERROCE_SELFTEST_PREFIX:-frst}"
SKIP_DEPS=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --prefix) [[ $# -ge 2 ]] || { echo "selftest: --prefix needs a value" >&2; exit 2; }
                  PREFIX="$2"; shift 2 ;;
        --skip-deps) SKIP_DEPS=1; shift ;;
        *) echo "selftest: unknown argument '$1' (-h for help)" >&2; exit 2 ;;
    esac
done
[[ $EUID -eq 0 ]] || { echo "selftest: must run as root" >&2; exit 1; }

TB() { "$TOOLS/testbed" --prefix "$PREFIX" "$@"; }
BL() { "$TOOLS/baseline" --prefix "$PREFIX" "$@"; }
PY="${PYTHON:-python3}"
A4=10.61.1.2; B4=10.61.2.2; R4=10.61.1.1
B6=fd61:2::2

WORK="$(mktemp -d /tmp/ferroce-selftest.XXXXXX)"
BG_PIDS=()
cleanup() {
    local p
    for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    TB down >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

PASS=0 FAIL=0
ok()   { PASS=$((PASS + 1)); echo "ok   - $1"; }
fail() { FAIL=$((FAIL + 1)); echo "FAIL - $1${2:+: $2}"; }
# check NAME CMD...: pass if CMD exits 0.
check() {
    local name="$1"; shift
    local out
    if out="$("$@" 2>&1)"; then ok "$name"; else fail "$name" "$(tail -n 3 <<<"$out" | tr '\n' ' ')"; fi
}
# check_rc NAME RC CMD...: pass if CMD exits with RC.
check_rc() {
    local name="$1" want="$2"; shift 2
    local rc=0
    "$@" >/dev/null 2>&1 || rc=$?
    if [[ $rc -eq $want ]]; then ok "$name"; else fail "$name" "exit $rc, want $want"; fi
}

# --- helpers -----------------------------------------------------------------
# ping_ttl NS DST WANT: one ping, succeed if the reply shows ttl/hlim WANT.
ping_ttl() {
    local out
    out="$(TB exec "$1" ping -c1 -W2 "$2" 2>&1)" || { echo "$out"; return 1; }
    grep -qE "(ttl|hlim)=$3( |$)" <<<"$out" || { echo "$out"; return 1; }
}

# udp_send DST [N]: N (default 3) datagrams from A to DST:4791.
udp_send() {
    TB exec a "$PY" -c '
import socket, sys
dst, n = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET, socket.SOCK_DGRAM)
for i in range(n):
    s.sendto(b"ferroce-selftest-%d" % i, (dst, 4791))
' "$1" "${2:-3}"
}

# udp_delivered DST: how many of 3 datagrams sent from A reach a UDP socket
# bound to DST:4791 in B (prints the count).
udp_delivered() {
    local dst="$1" f="$WORK/recv.$RANDOM" pid
    TB exec b "$PY" -c '
import socket, sys, time
dst = sys.argv[1]
s = socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET, socket.SOCK_DGRAM)
s.bind((dst, 4791))
print("ready", flush=True)
s.settimeout(1.5)
n = 0
try:
    while True:
        s.recv(2048); n += 1
except socket.timeout:
    pass
print(n, flush=True)
' "$dst" >"$f" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do grep -q ready "$f" 2>/dev/null && break; sleep 0.05; done
    udp_send "$dst" 3
    wait "$pid" || true
    tail -n 1 "$f"
}

# capture_one DST: tcpdump -v in B of one datagram sent from A to DST:4791.
capture_one() {
    local dst="$1" out="$WORK/td.$RANDOM" pid
    TB exec b timeout 6 tcpdump -l -n -v -c 1 -i eth0 "udp dst port 4791" \
        >"$out" 2>"$out.err" &
    pid=$!
    for _ in $(seq 1 100); do grep -q "listening on" "$out.err" 2>/dev/null && break; sleep 0.05; done
    udp_send "$dst" 1
    wait "$pid" || true
    cat "$out"
}

expect_count() {   # expect_count WANT DST
    local got; got="$(udp_delivered "$2")"
    [[ "$got" == "$1" ]] || { echo "delivered '$got', want $1"; return 1; }
}
expect_none()   { expect_count 0 "$1"; }
expect_all()    { expect_count 3 "$1"; }

expect_ce_v4() {
    local o; o="$(capture_one "$B4")"
    grep -qE 'tos 0x3,CE|ECN CE' <<<"$o" || { echo "no CE in: $o"; return 1; }
}
expect_ce_v6() {
    local o; o="$(capture_one "$B6")"
    grep -qE 'class 0x0?3[,)]' <<<"$o" || { echo "no CE in: $o"; return 1; }
}
expect_no_ce_v4() {
    local o; o="$(capture_one "$B4")"
    grep -q 'tos 0x0,' <<<"$o" || { echo "unexpected TOS in: $o"; return 1; }
}
expect_seen_by_tcpdump() {
    local o; o="$(capture_one "$1")"
    grep -q '\.4791: UDP' <<<"$o" || { echo "tcpdump saw nothing: $o"; return 1; }
}

ns_present() { [[ -e "/run/netns/${PREFIX}$1" ]]; }
all_ns_present() { ns_present a && ns_present r && ns_present b && ns_present x; }
no_ns_present() { ! ns_present a && ! ns_present r && ! ns_present b && ! ns_present x; }

# value_gt0 LINE KEY: KEY=number in LINE and number > 0.
value_gt0() {
    local v
    v="$(grep -oE "(^| )$2=[0-9.]+" <<<"$1" | head -n1 | cut -d= -f2)"
    [[ -n "$v" ]] && awk -v v="$v" 'BEGIN { exit !(v > 0) }' || { echo "$2='$v' in: $1"; return 1; }
}

# --- run -----------------------------------------------------------------------
echo "# ferroce testbed selftest (prefix $PREFIX, $(nft --version 2>/dev/null || echo 'nft missing'))"

if (( SKIP_DEPS )); then
    echo "# skipping tools/deps.sh net"
else
    check "deps.sh net installs/has the net tools" "$TOOLS/deps.sh" net
fi

TB down >/dev/null 2>&1 || true
check "testbed up" TB up
check "namespaces ${PREFIX}a ${PREFIX}r ${PREFIX}b ${PREFIX}x exist" all_ns_present
check_rc "second 'up' refuses (exit 1)" 1 TB up

check "ping A->R IPv4 ttl=64 (direct)" ping_ttl a "$R4" 64
check "ping A->B IPv4 ttl=63 (routed via R)" ping_ttl a "$B4" 63
check "ping A->B IPv6 hop limit 63 (routed via R)" ping_ttl a "$B6" 63
check "ping B->A IPv4 ttl=63" ping_ttl b "$A4" 63
check "ping X->B IPv4 ttl=63 (X routed via R, off the A-B path)" ping_ttl x "$B4" 63

check "UDP 4791 A->B IPv4 delivered (no loss rule)" expect_all "$B4"
check "loss 100" TB loss 100
check "loss 100: UDP 4791 IPv4 datagrams do not arrive" expect_none "$B4"
check "loss 100: UDP 4791 IPv6 datagrams do not arrive" expect_none "$B6"
check "loss 100: ping A->B still works" ping_ttl a "$B4" 63
check "loss 0" TB loss 0
check "loss 0: UDP 4791 IPv4 delivered again" expect_all "$B4"
check "loss 0: UDP 4791 IPv6 delivered again" expect_all "$B6"
no_router_table() { ! ip netns exec "${PREFIX}r" nft list table inet ferroce_router >/dev/null 2>&1; }
check "loss 0: router table removed" no_router_table

check "ecn 100" TB ecn 100
check "ecn 100: IPv4 datagram arrives with CE (tos 0x3)" expect_ce_v4
check "ecn 100: IPv6 datagram arrives with CE (class 0x03)" expect_ce_v6
check "ecn 0" TB ecn 0
check "ecn 0: IPv4 datagram arrives Not-ECT (tos 0x0)" expect_no_ce_v4

check "input-drop on" TB input-drop on
check "input-drop on: UDP socket in B gets nothing" expect_none "$B4"
check "input-drop on: tcpdump (AF_PACKET) in B still sees it" expect_seen_by_tcpdump "$B4"
check "input-drop off" TB input-drop off
check "input-drop off: UDP socket in B receives again" expect_all "$B4"
check "input-drop on a (A only)" TB input-drop on a
check "input-drop on a: UDP socket in B still receives" expect_all "$B4"
has_host_drop() { ip netns exec "${PREFIX}$1" nft list table inet ferroce_host >/dev/null 2>&1; }
check "input-drop on a: the rule is in A" has_host_drop a
check "input-drop on b (now both)" TB input-drop on b
check "input-drop on b: UDP socket in B gets nothing" expect_none "$B4"
check "input-drop off a (B keeps its rule)" TB input-drop off a
no_host_drop_a() { ! has_host_drop a; }
check "input-drop off a: A has no rule" no_host_drop_a
check "input-drop off a: B still drops" expect_none "$B4"
check "input-drop off" TB input-drop off
check_rc "bad input: input-drop on c -> exit 2" 2 TB input-drop on c

check_rc "bad input: loss 101 -> exit 2" 2 TB loss 101
check_rc "bad input: loss abc -> exit 2" 2 TB loss abc
check_rc "bad input: ecn -5 -> exit 2" 2 TB ecn -5
check_rc "bad input: rate x -> exit 2" 2 TB rate x
check_rc "bad input: rate 10 --dev eth0 -> exit 2" 2 TB rate 10 --dev eth0
check_rc "bad input: exec z true -> exit 2" 2 TB exec z true
check_rc "bad input: up --mtu 10 -> exit 2" 2 TB up --mtu 10
check_rc "bad input: unknown command -> exit 2" 2 TB frobnicate
check_rc "bad input: baseline tcp-bw --seconds 0 -> exit 2" 2 BL tcp-bw --seconds 0
check_rc "bad input: baseline udp-pingpong --size 1 -> exit 2" 2 BL udp-pingpong --size 1
check_rc "bad input: baseline udp-rate --size 13 -> exit 2" 2 BL udp-rate --size 13
check_rc "bad input: baseline sockperf-pp --count 5 -> exit 2" 2 BL sockperf-pp --count 5

out="$(BL tcp-bw --seconds 2 2>&1 || true)"
echo "# ${out//$'\n'/ }"
check "baseline tcp-bw --seconds 2: tcp_bw_gbps > 0" value_gt0 "$out" tcp_bw_gbps

check "rate 50 (tbf on R/rb)" TB rate 50
out="$(BL tcp-bw --seconds 2 2>&1 || true)"
echo "# with rate 50: ${out//$'\n'/ }"
rate_capped() {
    value_gt0 "$1" tcp_bw_gbps || return 1
    local v; v="$(grep -oE 'tcp_bw_gbps=[0-9.]+' <<<"$1" | cut -d= -f2)"
    awk -v v="$v" 'BEGIN { exit !(v < 0.06) }' || { echo "tcp_bw_gbps=$v not capped at 50 Mbit/s"; return 1; }
}
check "rate 50: TCP throughput capped below 60 Mbit/s" rate_capped "$out"
check "rate 0 (bottleneck removed)" TB rate 0
no_tbf() { ! ip netns exec "${PREFIX}r" tc qdisc show dev rb | grep -q tbf; }
check "rate 0: no tbf left on R/rb" no_tbf

out="$(BL udp-pingpong --count 200 2>&1 || true)"
echo "# ${out//$'\n'/ }"
check "baseline udp-pingpong --count 200: udp_rtt_us_p50 > 0" value_gt0 "$out" udp_rtt_us_p50
check "baseline udp-pingpong --count 200: udp_rtt_us_p99 > 0" value_gt0 "$out" udp_rtt_us_p99
check "baseline udp-pingpong --count 200: udp_oneway_us_p50 > 0" value_gt0 "$out" udp_oneway_us_p50

out="$(BL udp-rate --seconds 1 2>&1 || true)"
echo "# ${out//$'\n'/ }"
check "baseline udp-rate --seconds 1: udp_recv_pps > 0" value_gt0 "$out" udp_recv_pps
if command -v sockperf >/dev/null; then
    out="$(BL sockperf-pp --seconds 1 2>&1 || true)"
    echo "# ${out//$'\n'/ }"
    check "baseline sockperf-pp --seconds 1: sockperf_oneway_us_p50 > 0" value_gt0 "$out" sockperf_oneway_us_p50
else
    echo "# sockperf not installed (tools/deps.sh bench): sockperf-pp not checked"
fi

check "status runs" TB status
check "testbed down" TB down
check "namespaces gone after down" no_ns_present
check "down again is a no-op (exit 0)" TB down

out="$(BL udp-pingpong --count 50 --up 2>&1 || true)"
echo "# --up: ${out//$'\n'/ }"
check "baseline --up brings the testbed up for the run" value_gt0 "$out" udp_rtt_us_p50
check "baseline --up takes it down afterwards" no_ns_present

echo "$PASS passed, $FAIL failed"
(( FAIL == 0 ))
