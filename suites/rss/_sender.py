"""_sender.py: UDP flows to a VIP on request, each from its own source port, for per-flow RSS checks.

    python -m suites.rss._sender --vip 198.51.100.100 --port 9000

Reads one batch per line from stdin, `SPORT:COUNT SPORT:COUNT ...`, sends COUNT datagrams of each
flow (payload `l4lab-rss SPORT`, so a capture names the flow inside any encapsulation) and answers
`sent N` on stdout. A flow's socket stays open until stdin closes, so the real's replies find it
(a closed port would answer them with ICMP, and the LB would send that to the real's NIC too).
Runs in the client node, on a netns lab or over ssh.
"""

from __future__ import annotations

import argparse
import socket
import sys

PAYLOAD = b"l4lab-rss "


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m suites.rss._sender", description=__doc__.splitlines()[0])
    ap.add_argument("--vip", required=True)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args(argv)
    family = socket.AF_INET6 if ":" in args.vip else socket.AF_INET
    any_addr = "::" if family == socket.AF_INET6 else "0.0.0.0"
    sockets: dict[int, socket.socket] = {}
    try:
        for line in sys.stdin:
            sent = 0
            for word in line.split():
                sport, count = (int(v) for v in word.split(":"))
                if sport not in sockets:
                    sock = socket.socket(family, socket.SOCK_DGRAM)
                    sock.bind((any_addr, sport))
                    sockets[sport] = sock
                for _ in range(count):
                    sockets[sport].sendto(PAYLOAD + str(sport).encode(), (args.vip, args.port))
                    sent += 1
            print(f"sent {sent}", flush=True)
    finally:
        for sock in sockets.values():
            sock.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
