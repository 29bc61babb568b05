"""traffic.py: a client that runs inside a lab node and reports, as JSON, who answered each request.

    python -m lab.nodes.traffic http --vip 198.51.100.100 --port 80 --count 30 --source 192.0.2.2 ...
    python -m lab.nodes.traffic udp  --vip 198.51.100.100 --port 9000 --count 30 --source ...

Each request is a new flow (a new TCP connection or a new UDP socket), taken in turn from each
source address, so flows spread over the reals; `--sport-base` fixes each request's source port,
so that a second run sends the same flows again. The lab's services put the real's node name in
every answer; the report lists, per request, the source, the answering node and any error (with
"stage": "bind" when the client could not even take its own port: no packet was sent).
Deadlines are per request; nothing sleeps.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from typing import Any


def http_once(vip: str, port: int, source: str, timeout: float, sport: int = 0) -> dict[str, Any]:
    """One HTTP/1.0 GET on a new connection; the client reads until the server closes, and only then
    closes its end, so the server is the one left in TIME-WAIT: the same source port can open the
    next flow at once (a rerun of the same flows)."""
    t0 = time.monotonic()
    family = socket.AF_INET6 if ":" in vip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((source, sport))
        except OSError as exc:  # the client's own port, not the path: the caller's failure
            return {"source": source, "sport": sport, "error": f"{type(exc).__name__}: {exc}", "stage": "bind"}
        sport = s.getsockname()[1]
        try:
            s.connect((vip, port))
            s.sendall(f"GET / HTTP/1.0\r\nHost: {vip}\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        except OSError as exc:
            return {"source": source, "sport": sport, "error": f"{type(exc).__name__}: {exc}"}
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1] if head.startswith(b"HTTP/") and head.count(b" ") >= 1 else b""
    if not status.isdigit():
        return {"source": source, "sport": sport, "error": f"not an HTTP answer: {data[:80]!r}"}
    return {"source": source, "sport": sport, "status": int(status), "node": _node(body.decode(errors="replace")),
            "seconds": round(time.monotonic() - t0, 4)}


def udp_once(vip: str, port: int, source: str, timeout: float, sport: int = 0) -> dict[str, Any]:
    family = socket.AF_INET6 if ":" in vip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((source, sport))
        sport = s.getsockname()[1]
        payload = f"ping {time.monotonic_ns()}".encode()
        t0 = time.monotonic()
        try:
            s.sendto(payload, (vip, port))
            data, peer = s.recvfrom(65535)
        except OSError as exc:
            return {"source": source, "sport": sport, "error": f"{type(exc).__name__}: {exc}"}
        text = data.decode(errors="replace")
        return {"source": source, "sport": sport, "node": _node(text), "peer": peer[0],
                "echoed": payload.decode() in text,
                "seconds": round(time.monotonic() - t0, 4)}


def _node(text: str) -> str:
    """The node name the lab's services put first in every answer ("real2: ...")."""
    first = text.strip().split(None, 1)[0] if text.strip() else ""
    return first.rstrip(":")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lab.nodes.traffic")
    ap.add_argument("kind", choices=("http", "udp"))
    ap.add_argument("--vip", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--count", type=int, default=10)
    ap.add_argument("--source", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--sport-base", type=int, default=0,
                    help="request i uses source port BASE + i (the same flows again on a rerun); 0: any")
    args = ap.parse_args(argv)
    sources = args.source or ["::" if ":" in args.vip else "0.0.0.0"]
    once = http_once if args.kind == "http" else udp_once
    results = [once(args.vip, args.port, sources[i % len(sources)], args.timeout,
                    args.sport_base + i if args.sport_base else 0) for i in range(args.count)]
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
