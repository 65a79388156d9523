#!/usr/bin/env bash
# tools/deps.sh — idempotent installer for ferroce's host tooling (Debian 12).
#
# Installs only the Debian packages that are missing, for the selected groups.
# `apt-get update` is run only when an install is needed and the first attempt
# fails (e.g. empty or stale package lists); then the install is retried once.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: tools/deps.sh [GROUP...]      (default: all)

Groups:
  wire   tshark python3                       (packet decoding / wire checks)
  net    iproute2 nftables iperf3 tcpdump ethtool iputils-ping netcat-openbsd
                                              (tools/testbed, tools/baseline)
  bench  sockperf iperf3                      (tools/bench-testbed's C baselines)
  rdma   ibverbs-utils perftest rdmacm-utils qperf libfabric-bin openmpi-bin
         libopenmpi-dev libibverbs-dev librdmacm-dev valgrind ucx-utils
                                              (Debian's RDMA programs and headers, run on
                                              ferroce's libibverbs.so.1: cabi/tests; valgrind
                                              checks C programs' memory use on the library)
  vm     qemu-system-x86 busybox-static cpio kmod binutils xz-utils zstd xxd
         tcpdump ethtool                      (VM-based tests)
  all    every group above

Prints one line per group. Exits non-zero if an install fails. Needs root.
EOF
}

declare -A GROUP_PKGS=(
    [wire]="tshark python3"
    [net]="iproute2 nftables iperf3 tcpdump ethtool iputils-ping netcat-openbsd"
    [bench]="sockperf iperf3"
    [vm]="qemu-system-x86 busybox-static cpio kmod binutils xz-utils zstd xxd tcpdump ethtool"
    [rdma]="ibverbs-utils perftest rdmacm-utils qperf libfabric-bin openmpi-bin libopenmpi-dev libibverbs-dev librdmacm-dev binutils valgrind ucx-utils"
)
ALL_GROUPS=(wire net bench vm rdma)

die() { echo "deps.sh: $*" >&2; exit 1; }

is_installed() {
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

export DEBIAN_FRONTEND=noninteractive
APT_INSTALL=(apt-get install -y -q --no-install-recommends
             -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)

preseed() {
    # Never prompt: no setuid dumpcap for wireshark-common, and no iperf3
    # system daemon (it would hold port 5201, which tools/baseline uses).
    debconf-set-selections <<'SEL'
wireshark-common wireshark-common/install-setuid boolean false
iperf3 iperf3/start_daemon boolean false
SEL
}

UPDATED=0
apt_install() {
    local log
    log="$(mktemp)"
    if "${APT_INSTALL[@]}" "$@" >"$log" 2>&1; then
        rm -f "$log"; return 0
    fi
    if [[ $UPDATED -eq 0 ]]; then
        UPDATED=1
        if ! apt-get update -q >>"$log" 2>&1; then
            cat "$log" >&2; rm -f "$log"; return 1
        fi
        if "${APT_INSTALL[@]}" "$@" >>"$log" 2>&1; then
            rm -f "$log"; return 0
        fi
    fi
    tail -n 30 "$log" >&2
    rm -f "$log"
    return 1
}

# --- arguments ---------------------------------------------------------------
groups=()
for arg in "$@"; do
    case "$arg" in
        -h|--help) usage; exit 0 ;;
        all) groups+=("${ALL_GROUPS[@]}") ;;
        wire|net|bench|vm|rdma) groups+=("$arg") ;;
        *) echo "deps.sh: unknown group '$arg' (expected wire|net|bench|vm|rdma|all; -h for help)" >&2; exit 2 ;;
    esac
done
[[ ${#groups[@]} -gt 0 ]] || groups=("${ALL_GROUPS[@]}")

[[ $EUID -eq 0 ]] || die "must run as root (apt-get install)"
command -v apt-get >/dev/null || die "apt-get not found (Debian/Ubuntu only)"

# De-duplicate groups while keeping order.
declare -A seen=()
uniq_groups=()
for g in "${groups[@]}"; do
    [[ -n "${seen[$g]:-}" ]] && continue
    seen[$g]=1; uniq_groups+=("$g")
done

rc=0
for g in "${uniq_groups[@]}"; do
    missing=()
    for p in ${GROUP_PKGS[$g]}; do
        is_installed "$p" || missing+=("$p")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        echo "deps[$g]: already present"
        continue
    fi
    preseed
    if apt_install "${missing[@]}"; then
        echo "deps[$g]: installed ${missing[*]}"
    else
        echo "deps[$g]: FAILED to install ${missing[*]}" >&2
        rc=1
    fi
done
exit $rc
