"""rps.py: a TCP probe that tells, per connection, which CPU of the server's kernel received it.

    python -m lab.nodes.rps serve --bind VIP --port 8081 --count 48     (in a real)
    python -m lab.nodes.rps connect --vip VIP --port 8081 --count 48 --source A ...

The server prints "listening" once it accepts connections, then answers each connection's request
line with SO_INCOMING_CPU of the accepted socket (the CPU whose receive path delivered its latest
packet: the RPS target when RPS steers the real's link), and after --count connections prints a
JSON summary and exits. The client opens --count connections in turn from each --source and prints,
as JSON, each connection's source, source port and the CPU the server reported.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from typing import Any

SO_INCOMING_CPU = getattr(socket, "SO_INCOMING_CPU", 49)
DEADLINE_S = 30.0


def _family(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def serve(bind: str, port: int, count: int) -> int:
    with socket.socket(_family(bind), socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind, port))
        listener.listen(count)
        listener.settimeout(DEADLINE_S)
        print("listening", flush=True)
        seen: dict[int, int] = {}
        for _ in range(count):
            try:
                conn, _peer = listener.accept()
            except TimeoutError:
                sys.stderr.write(f"no connection within {DEADLINE_S} s after {sum(seen.values())} of {count}\n")
                return 1
            with conn:
                conn.settimeout(DEADLINE_S)
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(64)
                    if not chunk:
                        break
                    data += chunk
                cpu = conn.getsockopt(socket.SOL_SOCKET, SO_INCOMING_CPU)
                conn.sendall(f"{cpu}\n".encode())
                seen[cpu] = seen.get(cpu, 0) + 1
        print(json.dumps({"connections": count, "cpus": seen}), flush=True)
    return 0


def connect_once(vip: str, port: int, source: str) -> dict[str, Any]:
    with socket.socket(_family(vip), socket.SOCK_STREAM) as s:
        s.settimeout(5.0)
        try:
            s.bind((source, 0))
            sport = s.getsockname()[1]
            s.connect((vip, port))
            s.sendall(b"cpu?\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(64)
                if not chunk:
                    break
                data += chunk
            return {"source": source, "sport": sport, "cpu": int(data.strip())}
        except (OSError, ValueError) as exc:
            return {"source": source, "error": f"{type(exc).__name__}: {exc}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lab.nodes.rps")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--bind", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--count", type=int, required=True)
    c = sub.add_parser("connect")
    c.add_argument("--vip", required=True)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--count", type=int, required=True)
    c.add_argument("--source", action="append", default=[])
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        return serve(args.bind, args.port, args.count)
    sources = args.source or ["::" if ":" in args.vip else "0.0.0.0"]
    out = [connect_once(args.vip, args.port, sources[i % len(sources)]) for i in range(args.count)]
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
