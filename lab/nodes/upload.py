"""A bulk TCP upload to a VIP that reports, as JSON, whether it completed or stalled (a PMTU blackhole).

    python -m lab.nodes.upload --vip 198.51.100.100 --port 5001 --bytes 2000000 --stall 5

The send buffer is kept small so that bytes accepted by send() track bytes the receiver has
acknowledged: when nothing more is accepted for --stall seconds the upload is reported as stalled
and the connection is reset, so the run always ends within about (stall + handshake) seconds.
A completed upload ends with the sink's answer "<node> <bytes read>", which must count every byte.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import sys
import time
from typing import Any

SNDBUF = 32768
CHUNK = 16384


def upload(vip: str, port: int, total: int, stall_s: float) -> dict[str, Any]:
    fam = socket.AF_INET6 if ":" in vip else socket.AF_INET
    sock = socket.socket(fam, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
    out: dict[str, Any] = {"vip": vip, "port": port, "bytes": total}
    t0 = time.monotonic()
    try:
        sock.settimeout(stall_s)
        sock.connect((vip, port))
        sock.setblocking(False)
        sent, last_progress = 0, time.monotonic()
        block = b"x" * CHUNK
        while sent < total:
            _, writable, _ = select.select([], [sock], [], max(0.0, last_progress + stall_s - time.monotonic()))
            if writable:
                n = sock.send(block[: min(CHUNK, total - sent)])
                if n > 0:
                    sent += n
                    last_progress = time.monotonic()
            if time.monotonic() - last_progress >= stall_s:
                return out | _stalled(sock, sent, t0, "sending")
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while not answer.endswith(b"\n"):
            readable, _, _ = select.select([sock], [], [], max(0.0, last_progress + stall_s - time.monotonic()))
            if not readable:
                return out | _stalled(sock, sent, t0, "waiting for the sink's count")
            data = sock.recv(4096)
            if not data:
                break
            answer += data
            last_progress = time.monotonic()
        node, _, count = answer.decode(errors="replace").strip().partition(" ")
        return out | {"completed": count == str(total), "node": node, "received": int(count or -1),
                      "seconds": round(time.monotonic() - t0, 3), "sent": sent}
    except OSError as exc:
        return out | {"completed": False, "error": f"{type(exc).__name__}: {exc}",
                      "seconds": round(time.monotonic() - t0, 3)}
    finally:
        sock.close()


def _stalled(sock: socket.socket, sent: int, t0: float, phase: str) -> dict[str, Any]:
    # Reset rather than linger: the blackholed connection must not outlive the report.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return {"completed": False, "stalled": phase, "sent": sent, "seconds": round(time.monotonic() - t0, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.nodes.upload")
    ap.add_argument("--vip", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--bytes", type=int, default=2_000_000)
    ap.add_argument("--stall", type=float, default=5.0, help="seconds without progress that mean stalled")
    args = ap.parse_args(argv)
    json.dump(upload(args.vip, args.port, args.bytes, args.stall), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
