"""rss_sender.py: UDP flows to a VIP on request, each from its own source port, for per-flow RSS checks.

    python -m lab.nodes.rss_sender --vip 198.51.100.100 --port 9000

Reads one batch per line from stdin, `SPORT:COUNT SPORT:COUNT ...`, sends COUNT datagrams of each
flow (payload `l4lab-rss SPORT`, so a capture names the flow inside any encapsulation), waits up to
REPLY_WAIT_S for the real's echo of each (an echo means the real's NIC has counted the datagram)
and answers `sent N replied M` on stdout. A flow's socket stays open until stdin closes, so late
replies find it (a closed port would answer them with ICMP, and the LB would send that to the
real's NIC too).
Runs in the client node, on a netns lab or over ssh.
"""

from __future__ import annotations

import argparse
import select
import socket
import sys
import time

PAYLOAD = b"l4lab-rss "
REPLY_WAIT_S = 3.0


def await_replies(sockets: list[socket.socket], expected: int, timeout: float) -> int:
    """Read replies on `sockets` until `expected` arrived or `timeout` passed; returns how many did."""
    got = 0
    deadline = time.monotonic() + timeout
    while got < expected:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select(sockets, [], [], left)
        for sock in ready:
            while True:
                try:
                    sock.recv(2048, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
                got += 1
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.nodes.rss_sender", description=__doc__.splitlines()[0])
    ap.add_argument("--vip", required=True)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args(argv)
    family = socket.AF_INET6 if ":" in args.vip else socket.AF_INET
    any_addr = "::" if family == socket.AF_INET6 else "0.0.0.0"
    sockets: dict[int, socket.socket] = {}
    try:
        for line in sys.stdin:
            sent = 0
            used: list[socket.socket] = []
            for word in line.split():
                sport, count = (int(v) for v in word.split(":"))
                if sport not in sockets:
                    sock = socket.socket(family, socket.SOCK_DGRAM)
                    sock.bind((any_addr, sport))
                    sockets[sport] = sock
                used.append(sockets[sport])
                for _ in range(count):
                    sockets[sport].sendto(PAYLOAD + str(sport).encode(), (args.vip, args.port))
                    sent += 1
            replied = await_replies(used, sent, REPLY_WAIT_S)
            print(f"sent {sent} replied {replied}", flush=True)
    finally:
        for sock in sockets.values():
            sock.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
