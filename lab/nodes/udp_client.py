"""UDP flows that keep their source ports and ask a VIP's UDP echo who answers, maybe in Katran's stable-routing header.

    python -m lab.nodes.udp_client --vip 198.51.100.100 --port 9000 --conns 24
    python -m lab.nodes.udp_client --vip 198.51.100.100 --port 9000 --stable-routing --ids real1=101,real2=102

Runs inside the client node. It opens --conns UDP sockets connected to the VIP (one flow each, the
same 5-tuple for its whole life), sends one datagram on each and learns from the echo's answer
("<node> " + the datagram, lab/services.py) which real holds it. With --stable-routing every datagram
starts with Katran's stable-routing header (type 0x52, the server id in bytes 1..3, 8 bytes): id 0
on the first (the ring decides), then the id --ids gives the real that answered it (0 for a real not
listed), as a UDP service that hands its id to its clients would have them send. It speaks as
lab.nodes.quic_echo's client does: {"event": "ready", "conns": [{index, addr, port, node}]}, and on
each "round" line one more datagram per flow, {"event": "round", "answers": {index: node or
"timeout" or the error}}; any other line, or the input's end, closes them. With --cpu it pins itself
to one CPU, as lab.nodes.churn_client does (veth runs XDP on the sender's CPU; sessions are per CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import sys
import time
from collections.abc import Sequence

from lab.nodes.churn_client import answer_rounds
from lab.nodes.quic_echo import QuicClient

STABLE_RT_TYPE = 0x52  # Katran's STABLE_ROUTING_HEADER
STABLE_RT_LEN = 8
ANSWER_TIMEOUT_S = 3.0


def stable_header(server_id: int) -> bytes:
    """Katran's stable-routing header: type 0x52, the 24-bit server id in bytes 1..3 (its QUIC
    connection-id v2 layout), padded to 8 bytes."""
    return bytes([STABLE_RT_TYPE]) + server_id.to_bytes(3, "big") + bytes(STABLE_RT_LEN - 4)


def ask_all(socks: Sequence[socket.socket], payloads: Sequence[bytes], timeout: float = ANSWER_TIMEOUT_S) -> list[str]:
    """One datagram out on each socket, and the node that answered each (or "timeout", or the error)."""
    answers = ["timeout"] * len(socks)
    with selectors.DefaultSelector() as sel:
        for i, (sock, payload) in enumerate(zip(socks, payloads, strict=True)):
            try:
                sock.send(payload)
            except OSError as exc:
                answers[i] = f"error: {exc}"
                continue
            sel.register(sock, selectors.EVENT_READ, i)
        deadline = time.monotonic() + timeout
        while sel.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                ready, i = socks[key.data], key.data
                try:
                    answers[i] = ready.recv(65535).split(b" ", 1)[0].decode(errors="replace")
                except OSError as exc:  # an ICMP error came back (no listener, no route)
                    answers[i] = f"error: {exc}"
                sel.unregister(ready)
    return answers


def run(vip: str, port: int, conns: int, stable: bool, ids: dict[str, int]) -> None:
    family = socket.AF_INET6 if ":" in vip else socket.AF_INET
    socks = []
    try:
        for _ in range(conns):
            sock = socket.socket(family, socket.SOCK_DGRAM)
            socks.append(sock)
            sock.connect((vip, port))
        first = ask_all(socks, [(stable_header(0) if stable else b"") + b"who" for _ in socks])
        rows = [{"index": i, "addr": s.getsockname()[0], "port": s.getsockname()[1], "node": first[i]}
                for i, s in enumerate(socks)]
        print(json.dumps({"event": "ready", "conns": rows}), flush=True)
        again = [(stable_header(ids.get(node, 0)) if stable else b"") + b"again" for node in first]
        answer_rounds(lambda: dict(enumerate(ask_all(socks, again))))
    finally:
        for sock in socks:
            sock.close()


class UdpClient(QuicClient):
    """The client above in a lab node (the QUIC client's channel: `.ready`, `round()`)."""

    module = "lab.nodes.udp_client"
    role: tuple[str, ...] = ()
    what = "UDP client"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.nodes.udp_client")
    ap.add_argument("--vip", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--conns", type=int, default=24)
    ap.add_argument("--stable-routing", action="store_true", help="Katran's stable-routing header on every datagram")
    ap.add_argument("--ids", default="", help="node=id,... the server id of each real, for the header")
    ap.add_argument("--cpu", type=int, help="pin the process to this CPU (the LB's sessions are per CPU)")
    args = ap.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    ids = {k: int(v) for k, v in (p.split("=") for p in args.ids.split(",") if p)}
    run(args.vip, args.port, args.conns, args.stable_routing, ids)
    return 0


if __name__ == "__main__":
    sys.exit(main())
