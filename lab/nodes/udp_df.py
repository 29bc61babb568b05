"""One UDP datagram with DF (IPv6: no fragmentation) to a VIP, and the path MTU the socket learns from it, as JSON.

    python -m lab.nodes.udp_df --vip 198.51.100.100 --port 9000 --size 1500

The datagram makes an IP packet of --size bytes. The socket forbids fragmentation, so when an
ICMP frag-needed / packet too big comes back the kernel lowers the socket's path MTU (IP_MTU /
IPV6_MTU), and sending the same datagram again fails with EMSGSIZE. The report gives the MTU
learnt (polled with a deadline) and the error of the second send.
"""

from __future__ import annotations

import argparse
import errno
import json
import socket
import sys
from typing import Any

from lab.poll import poll

# Linux socket options (include/uapi/linux/in.h, in6.h); older Pythons lack some names.
IP_MTU_DISCOVER = 10
IP_MTU = 14
IPV6_MTU_DISCOVER = 23
IPV6_MTU = 24
PMTUDISC_DO = 2


def probe(vip: str, port: int, size: int, wait_s: float) -> dict[str, Any]:
    v6 = ":" in vip
    fam = socket.AF_INET6 if v6 else socket.AF_INET
    level = socket.IPPROTO_IPV6 if v6 else socket.IPPROTO_IP
    mtu_opt = IPV6_MTU if v6 else IP_MTU
    payload = b"u" * (size - (40 if v6 else 20) - 8)
    with socket.socket(fam, socket.SOCK_DGRAM) as s:
        s.setsockopt(level, IPV6_MTU_DISCOVER if v6 else IP_MTU_DISCOVER, PMTUDISC_DO)
        s.connect((vip, port))
        before = s.getsockopt(level, mtu_opt)
        s.send(payload)
        learnt = poll(wait_s, lambda: s.getsockopt(level, mtu_opt), "a path MTU below the datagram",
                      until=lambda mtu: mtu < size, check=False, interval_s=0.01)
        try:
            s.send(payload)
            resend = "sent"
        except OSError as exc:
            resend = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return {"vip": vip, "size": size, "mtu_before": before, "mtu_learnt": learnt, "resend": resend}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.nodes.udp_df")
    ap.add_argument("--vip", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--size", type=int, default=1500, help="IP packet size in bytes")
    ap.add_argument("--wait", type=float, default=3.0, help="seconds to wait for the path MTU to drop")
    args = ap.parse_args(argv)
    json.dump(probe(args.vip, args.port, args.size, args.wait), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
