"""UDP requests to a VIP sent inside GUE to an LB address, as a chained LB or a tunnelled health check sends them.

    python -m lab.nodes.tunnel_client --lb 198.51.100.2 --gue-port 6080 --vip 198.51.100.100 --port 9000 --count 20

Runs inside the client node. For each request it binds a UDP socket of its own (the inner flow's
source port), builds the inner IP/UDP packet from the node's own address to the VIP, sends it as the
payload of an ordinary UDP datagram to the LB's address and GUE port (GUE variant 1: the inner IP
packet right after UDP), and waits for the answer, which comes straight from the real (direct server
return) to the inner source port. Prints {"answers": [node or "timeout", ...]}.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import Sequence

from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6

TIMEOUT_S = 2.0


def request(lb: str, gue_port: int, vip: str, port: int, index: int) -> str:
    family = socket.AF_INET6 if ":" in vip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((vip, port))  # no packet: the kernel picks the node's source address for the VIP
        source = probe.getsockname()[0]
    with socket.socket(family, socket.SOCK_DGRAM) as inner_sock, \
            socket.socket(socket.AF_INET6 if ":" in lb else socket.AF_INET, socket.SOCK_DGRAM) as outer:
        inner_sock.bind((source, 0))
        inner_sock.settimeout(TIMEOUT_S)
        sport = inner_sock.getsockname()[1]
        ip = IPv6(src=source, dst=vip) if family == socket.AF_INET6 else IP(src=source, dst=vip)
        outer.sendto(bytes(ip / UDP(sport=sport, dport=port) / f"tunnelled {index}".encode()), (lb, gue_port))
        try:
            answer = inner_sock.recv(2048)
        except TimeoutError:
            return "timeout"
        return answer.split(b" ", 1)[0].decode()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.nodes.tunnel_client")
    ap.add_argument("--lb", required=True, help="the LB address whose tunnels it decapsulates")
    ap.add_argument("--gue-port", type=int, required=True)
    ap.add_argument("--vip", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--count", type=int, default=20)
    args = ap.parse_args(argv)
    answers = [request(args.lb, args.gue_port, args.vip, args.port, i) for i in range(args.count)]
    print(json.dumps({"answers": answers}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
