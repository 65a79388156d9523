#!/usr/bin/env python3
"""UDP ping-pong latency baseline (standard library only).

server: echo every datagram back to its sender until idle for --idle seconds
        (or --max-seconds elapse).
client: send --count datagrams of --size bytes one at a time, wait for each
        echo, and print one machine-readable line:

  udp_rtt_us_p50=X udp_rtt_us_p99=Y udp_oneway_us_p50=X/2 udp_oneway_us_p99=Y/2
  udp_rtt_us_min=.. udp_rtt_us_max=.. udp_sent=N udp_recv=M

Each request carries a sequence number; stale or foreign replies are ignored,
a reply that does not come within --timeout counts as lost. --busy spins on a
non-blocking socket instead of sleeping in recv (lower, steadier latency at
the cost of a full core per side).
"""
import argparse
import math
import socket
import struct
import sys
import time

HDR = struct.Struct("!IQ")  # magic, sequence number
MAGIC = 0xFE770C3E


def family_of(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def recv_once(sock, bufsize, busy, deadline_ns):
    """Receive one datagram; None on timeout."""
    if not busy:
        remain = (deadline_ns - time.perf_counter_ns()) / 1e9
        if remain <= 0:
            return None, None
        sock.settimeout(remain)
        try:
            return sock.recvfrom(bufsize)
        except socket.timeout:
            return None, None
    while True:
        try:
            return sock.recvfrom(bufsize)
        except BlockingIOError:
            if time.perf_counter_ns() >= deadline_ns:
                return None, None


def server(args):
    sock = socket.socket(family_of(args.bind), socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.bind, args.port))
    if args.busy:
        sock.setblocking(False)
    print(f"udp_pingpong server on [{args.bind}]:{args.port}", file=sys.stderr, flush=True)
    start = time.perf_counter_ns()
    served = 0
    while True:
        now = time.perf_counter_ns()
        deadline = now + int(args.idle * 1e9)
        if args.max_seconds > 0:
            deadline = min(deadline, start + int(args.max_seconds * 1e9))
        data, peer = recv_once(sock, 65535, args.busy, deadline)
        if data is None:
            break
        sock.sendto(data, peer)
        served += 1
    print(f"udp_pingpong server done, echoed {served}", file=sys.stderr, flush=True)
    return 0


def percentile(sorted_vals, p):
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_vals:
        return 0.0
    k = max(0, min(len(sorted_vals) - 1, math.ceil(p / 100.0 * len(sorted_vals)) - 1))
    return sorted_vals[k]


def client(args):
    if args.size < HDR.size:
        print(f"--size must be >= {HDR.size}", file=sys.stderr)
        return 2
    sock = socket.socket(family_of(args.host), socket.SOCK_DGRAM)
    sock.connect((args.host, args.port))
    if args.busy:
        sock.setblocking(False)
    pad = b"\xa5" * (args.size - HDR.size)
    timeout_ns = int(args.timeout * 1e9)
    rtts = []
    sent = 0
    total = args.warmup + args.count
    for seq in range(total):
        msg = HDR.pack(MAGIC, seq) + pad
        t0 = time.perf_counter_ns()
        sock.send(msg)
        sent += 1
        deadline = t0 + timeout_ns
        while True:
            if args.busy:
                try:
                    data = sock.recv(65535)
                except BlockingIOError:
                    if time.perf_counter_ns() >= deadline:
                        data = None
                    else:
                        continue
                except ConnectionRefusedError:
                    data = None  # ICMP port unreachable: server not there
            else:
                remain = (deadline - time.perf_counter_ns()) / 1e9
                if remain <= 0:
                    data = None
                else:
                    sock.settimeout(remain)
                    try:
                        data = sock.recv(65535)
                    except socket.timeout:
                        data = None
                    except ConnectionRefusedError:
                        data = None
            t1 = time.perf_counter_ns()
            if data is None:
                break  # lost
            if len(data) >= HDR.size:
                magic, rseq = HDR.unpack_from(data)
                if magic == MAGIC and rseq == seq:
                    if seq >= args.warmup:
                        rtts.append((t1 - t0) / 1000.0)
                    break
            # stale/foreign reply: keep waiting for ours
        if args.interval > 0:
            time.sleep(args.interval)
    measured = total - args.warmup
    rtts.sort()
    if not rtts:
        print(f"udp_rtt_us_p50=0 udp_rtt_us_p99=0 udp_oneway_us_p50=0 udp_oneway_us_p99=0 "
              f"udp_sent={measured} udp_recv=0")
        print("udp_pingpong: no replies received", file=sys.stderr)
        return 1
    p50 = percentile(rtts, 50)
    p99 = percentile(rtts, 99)
    print(f"udp_rtt_us_p50={p50:.1f} udp_rtt_us_p99={p99:.1f} "
          f"udp_oneway_us_p50={p50 / 2:.1f} udp_oneway_us_p99={p99 / 2:.1f} "
          f"udp_rtt_us_min={rtts[0]:.1f} udp_rtt_us_max={rtts[-1]:.1f} "
          f"udp_sent={measured} udp_recv={len(rtts)}", flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description="UDP ping-pong latency baseline")
    sub = ap.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("server", help="echo datagrams back")
    s.add_argument("--bind", default="0.0.0.0", help="address to bind (default 0.0.0.0; use :: for IPv6)")
    s.add_argument("--port", type=int, default=7471)
    s.add_argument("--idle", type=float, default=10.0, help="exit after this many idle seconds")
    s.add_argument("--max-seconds", type=float, default=120.0, help="hard limit on run time (0 = none)")
    s.add_argument("--busy", action="store_true", help="spin instead of blocking")
    c = sub.add_parser("client", help="measure round trips")
    c.add_argument("--host", required=True)
    c.add_argument("--port", type=int, default=7471)
    c.add_argument("--count", type=int, default=1000)
    c.add_argument("--warmup", type=int, default=20)
    c.add_argument("--size", type=int, default=64, help="UDP payload bytes (>= 12)")
    c.add_argument("--timeout", type=float, default=1.0, help="seconds to wait for each reply")
    c.add_argument("--interval", type=float, default=0.0, help="pause between requests (s)")
    c.add_argument("--busy", action="store_true", help="spin instead of blocking")
    args = ap.parse_args()
    if args.mode == "server":
        return server(args)
    if args.count < 1 or args.warmup < 0 or args.size > 65507:
        print("need --count >= 1, --warmup >= 0, --size <= 65507", file=sys.stderr)
        return 2
    return client(args)


if __name__ == "__main__":
    sys.exit(main())
