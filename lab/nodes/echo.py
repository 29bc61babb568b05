"""echo.py: exactly N ICMP / ICMPv6 echo requests to one address, each awaited, over a raw socket (no ping binary).

    python -m lab.nodes.echo --count 3 198.51.100.100

Prints, as JSON, how many requests were sent and how many got their reply within the deadline.
Needs root (a raw socket). The kernel fills the ICMPv6 checksum; the ICMP one is computed here.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import struct
import sys
import time

from lab.checksum import inet_checksum

ICMP_ECHO_REQUEST, ICMP_ECHO_REPLY = 8, 0
ICMPV6_ECHO_REQUEST, ICMPV6_ECHO_REPLY = 128, 129


def echo(target: str, count: int, deadline_s: float) -> dict[str, int]:
    v6 = ":" in target
    family, proto = (socket.AF_INET6, socket.IPPROTO_ICMPV6) if v6 else (socket.AF_INET, socket.IPPROTO_ICMP)
    request, reply = (ICMPV6_ECHO_REQUEST, ICMPV6_ECHO_REPLY) if v6 else (ICMP_ECHO_REQUEST, ICMP_ECHO_REPLY)
    ident = os.getpid() & 0xFFFF
    answered = 0
    with socket.socket(family, socket.SOCK_RAW, proto) as s:
        for seq in range(count):
            body = b"l4lab stats echo"
            header = struct.pack("!BBHHH", request, 0, 0, ident, seq)
            csum = 0 if v6 else inet_checksum(header + body)
            s.sendto(struct.pack("!BBHHH", request, 0, csum, ident, seq) + body, (target, 0))
            end = time.monotonic() + deadline_s
            while (left := end - time.monotonic()) > 0:
                ready, _, _ = select.select([s], [], [], left)
                if not ready:
                    break
                data = s.recv(2048)
                icmp = data if v6 else data[(data[0] & 0x0F) * 4:]  # IPv4 raw sockets include the IP header
                if len(icmp) >= 8:
                    typ, _, _, rid, rseq = struct.unpack("!BBHHH", icmp[:8])
                    if typ == reply and rid == ident and rseq == seq:
                        answered += 1
                        break
    return {"sent": count, "answered": answered}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lab.nodes.echo")
    ap.add_argument("target")
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--deadline", type=float, default=2.0, help="seconds to wait for each reply")
    args = ap.parse_args(argv)
    json.dump(echo(args.target, args.count, args.deadline), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
