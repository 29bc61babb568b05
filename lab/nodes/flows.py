"""flows.py: one UDP datagram from each of N source ports to a VIP, so N distinct 5-tuples cross the LB.

    python -m lab.nodes.flows --vip 198.51.100.100 --port 9000 --flows 12000 [--first-port 20000]

Ports first-port .. first-port+N-1 are bound explicitly (a port in use is skipped and counted);
prints {"sent": n, "skipped": k} as JSON. Runs in the client node, on a netns lab or over ssh.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys

MAX_PORT = 65535


def send_flows(vip: str, port: int, flows: int, first_port: int, payload: bytes = b"l4lab-flow") -> tuple[int, int]:
    family = socket.AF_INET6 if ":" in vip else socket.AF_INET
    sent = skipped = 0
    src_port = first_port
    while sent < flows and src_port <= MAX_PORT:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            try:
                sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", src_port))
            except OSError:
                skipped += 1
            else:
                sock.sendto(payload, (vip, port))
                sent += 1
        src_port += 1
    return sent, skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.nodes.flows", description=__doc__.splitlines()[0])
    ap.add_argument("--vip", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--flows", type=int, required=True)
    ap.add_argument("--first-port", type=int, default=20000)
    args = ap.parse_args(argv)
    if not 1 <= args.flows <= MAX_PORT - args.first_port + 1:
        print(f"--flows must be 1..{MAX_PORT - args.first_port + 1} from port {args.first_port}", file=sys.stderr)
        return 2
    sent, skipped = send_flows(args.vip, args.port, args.flows, args.first_port)
    print(json.dumps({"sent": sent, "skipped": skipped}))
    return 0 if sent == args.flows else 1


if __name__ == "__main__":
    raise SystemExit(main())
