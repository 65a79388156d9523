#!/usr/bin/env bash
# rxe-peer-selftest.sh: proves tools/rxe-peer works on this machine (root, apt reachable for setup).
#
#   setup -> net-up -> one guest boot -> ibv_rc_pingpong A<->B over IPv4 (GID 1)
#   -> ib_write_bw A<->B with a capture and hw counters -> MTU 9000 guest (active MTU 4096, nft rule)
#   -> ibv_rc_pingpong A<->B over the IPv6 global GID, captured -> down
#
# Prints one PASS/FAIL line per check with its wall time, then "N passed, M failed"; exits 1 if
# anything failed. Captures, guest outputs and counters stay in $RXE_SELFTEST_DIR
# (default /tmp/rxe-peer-selftest). It owns the rxe-peer network: it tears everything down at the end
# (and kills guests other users of rxe-peer have running).
set -uo pipefail
PEER=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/rxe-peer
OUT=${RXE_SELFTEST_DIR:-/tmp/rxe-peer-selftest}
A4=10.77.0.11 B4=10.77.0.12 M4=10.77.0.13 T4=10.77.0.10
A6=fd77::11 B6=fd77::12 M6=fd77::13
[ "$(id -u)" = 0 ] || { echo "rxe-peer-selftest: must run as root" >&2; exit 2; }
rm -rf "$OUT"; mkdir -p "$OUT"
trap '"$PEER" down > "$OUT/down-trap.log" 2>&1' EXIT

passed=0 failed=0
note() { echo "    $*"; }
check() {   # check NAME FUNCTION: run it, time it, count it
  local name=$1 t0 t1 rc
  t0=$(date +%s.%N)
  "$2" > "$OUT/$name.log" 2>&1; rc=$?
  t1=$(date +%s.%N)
  local wall; wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
  if [ $rc = 0 ]; then passed=$((passed+1)); echo "PASS $name (${wall} s)"
  else failed=$((failed+1)); echo "FAIL $name (${wall} s, status $rc; log $OUT/$name.log)"; tail -15 "$OUT/$name.log" | sed 's/^/    | /'; fi
  grep '^NOTE ' "$OUT/$name.log" | sed 's/^NOTE /    /'
  return 0
}
expect() { grep -Eq -- "$1" "$2" || { echo "expected /$1/ in $2"; return 1; }; }

# server on guest A in the background, client on guest B (retries until A listens), both must exit 0
pair() {   # pair TAG "A boot args" "A command" "B boot args" "B command"
  local tag=$1 h ra rb
  # shellcheck disable=SC2086
  h=$("$PEER" boot A $2 --timeout 120 --rundir "$OUT/runs/$tag-A" --background --counters "$OUT/$tag.A.counters" -- "$3") || return 1
  # shellcheck disable=SC2086
  "$PEER" boot B $4 --timeout 120 --rundir "$OUT/runs/$tag-B" --counters "$OUT/$tag.B.counters" -- "$5" > "$OUT/$tag.B.out" 2>&1; rb=$?
  "$PEER" wait "$h" > "$OUT/$tag.A.out" 2>&1; ra=$?
  echo "server A status $ra, client B status $rb"
  cat "$OUT/runs/$tag-A/timing" "$OUT/runs/$tag-B/timing"
  [ $ra = 0 ] && [ $rb = 0 ]
}

t_setup() { "$PEER" setup; }

t_net_up() {
  "$PEER" net-up || return 1
  ip netns exec rxehost ping -c 1 -W 2 10.77.0.1 && ip netns exec rxehost ping -6 -c 1 -W 2 fd77::1
}

t_boot() {
  "$PEER" boot T --ip $T4/24 --rundir "$OUT/runs/boot" -- 'cat /sys/class/infiniband/rxe0/ports/1/state; rdma link' \
    > "$OUT/boot.out" || return 1
  cat "$OUT/boot.out" "$OUT/runs/boot/timing"
  expect 'ACTIVE' "$OUT/boot.out" || return 1
  echo "NOTE boot: $(cat "$OUT/runs/boot/timing")"
}

t_rc_pingpong_ipv4() {
  pair rc4 "--ip $A4/24" "ibv_rc_pingpong -d rxe0 -g 1 -n 100" \
           "--ip $B4/24" "rxe-retry 10 1 ibv_rc_pingpong -d rxe0 -g 1 -n 100 $A4" || return 1
  expect '100 iters in' "$OUT/rc4.A.out" && expect '100 iters in' "$OUT/rc4.B.out" &&
    expect 'GID ::ffff:10.77.0.11' "$OUT/rc4.B.out"
}

t_write_bw_capture() {
  "$PEER" capture start "$OUT/write_bw.pcap" || return 1
  pair wbw "--ip $A4/24" "ib_write_bw -d rxe0 -x 1 -F -s 4096 -n 50" \
           "--ip $B4/24" "rxe-retry 10 1 ib_write_bw -d rxe0 -x 1 -F -s 4096 -n 50 $A4"; local rc=$?
  "$PEER" capture stop | tee "$OUT/write_bw.capture"
  [ $rc = 0 ] || return 1
  expect '^ 4096 +50 ' "$OUT/wbw.B.out" || return 1
  expect '== rxe-peer counters rxe0/1 ==' "$OUT/wbw.B.out" || return 1
  local roce sent
  roce=$(tcpdump -nr "$OUT/write_bw.pcap" 'udp dst port 4791' 2>/dev/null | wc -l)
  sent=$(awk '$1=="sent_pkts"{print $2}' "$OUT/wbw.B.counters")
  echo "NOTE write_bw: $roce RoCE packets captured, client sent_pkts=$sent, $(cat "$OUT/write_bw.capture" | sed 's/^.*: //')"
  [ "$roce" -ge 200 ] && [ "${sent:-0}" -ge 200 ] && expect ' 0 packets dropped by kernel' "$OUT/write_bw.capture"
}

t_mtu9000() {
  "$PEER" net-down && "$PEER" net-up --mtu 9000 --drop-roce-input || return 1
  ip netns exec rxehost nft list ruleset | tee "$OUT/nft.txt"
  expect 'udp dport 4791 drop' "$OUT/nft.txt" || return 1
  "$PEER" boot M --ip $M4/24 --ip6 $M6/64 --rundir "$OUT/runs/mtu9000" -- \
    "ibv_devinfo -d rxe0; ip link show eth0; ping -c 2 -s 8000 10.77.0.2 && ping -6 -c 2 -s 8000 fd77::2" \
    > "$OUT/mtu9000.out" || return 1
  cat "$OUT/mtu9000.out"
  expect 'active_mtu:[[:space:]]+4096' "$OUT/mtu9000.out" && expect 'mtu 9000' "$OUT/mtu9000.out" || return 1
  # back to the default network, without the nft rule
  "$PEER" net-down && "$PEER" net-up || return 1
  ! ip netns exec rxehost nft list ruleset | grep -q 4791
}

t_rc_pingpong_ipv6() {
  "$PEER" capture start "$OUT/rc_pingpong_ipv6.pcap" || return 1
  # the pingpongs' TCP exchange goes to A's IPv4 address; RoCE uses the IPv6 global GID
  pair rc6 "--ip $A4/24 --ip6 $A6/64" 'ibv_devinfo -v -d rxe0 | grep GID; echo "RXE_GID_V6=$RXE_GID_V6"; ibv_rc_pingpong -d rxe0 -g $RXE_GID_V6 -n 100' \
           "--ip $B4/24 --ip6 $B6/64" "rxe-retry 10 1 ibv_rc_pingpong -d rxe0 -g \$RXE_GID_V6 -n 100 $A4"; local rc=$?
  "$PEER" capture stop | tee "$OUT/rc_pingpong_ipv6.capture"
  [ $rc = 0 ] || return 1
  expect '100 iters in' "$OUT/rc6.A.out" && expect 'GID fd77::12' "$OUT/rc6.A.out" || return 1
  local idx v6 v4
  idx=$(sed -n 's/^RXE_GID_V6=//p' "$OUT/rc6.A.out")
  v6=$(tcpdump -nr "$OUT/rc_pingpong_ipv6.pcap" 'ip6 and udp dst port 4791' 2>/dev/null | wc -l)
  v4=$(tcpdump -nr "$OUT/rc_pingpong_ipv6.pcap" 'ip and udp dst port 4791' 2>/dev/null | wc -l)
  echo "NOTE ipv6: GID index of fd77::11 = $idx; $(grep 'GID\[' "$OUT/rc6.A.out" | tr -s '\t ' ' ' | paste -sd';')"
  echo "NOTE ipv6: RoCE packets captured: $v6 over IPv6, $v4 over IPv4"
  [ -n "$idx" ] && [ "$v6" -ge 200 ] && [ "$v4" = 0 ]
}

t_down() {
  "$PEER" down || return 1
  ip netns list | grep -Eq '^(rxenet|rxehost)( |$)' && { echo "namespaces left"; return 1; }
  pgrep -af 'qemu-system-x86_64.*mount_tag=host' && { echo "QEMU left"; return 1; }
  return 0
}

check setup t_setup
check net-up t_net_up
check boot t_boot
check rc_pingpong_ipv4 t_rc_pingpong_ipv4
check write_bw_capture t_write_bw_capture
check mtu9000 t_mtu9000
check rc_pingpong_ipv6 t_rc_pingpong_ipv6
check down t_down
echo "$passed passed, $failed failed"
[ $failed = 0 ]
