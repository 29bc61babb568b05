"""TCP connections that carry their real's server id in Katran's option 183, for the server-id routing suite.

    python -m lab.nodes.tcp_sid_client --vip 198.51.100.100 --port 7007 --conns 24 --ids real1=101,real2=102

Runs inside the client node. It moves itself into a cgroup of its own (cgroup v2, removed at exit)
with bpf/tcp_sid_client.bpf.c attached as its sock_ops program, opens --conns connections to the
VIP's line echo, learns from the first answer which real holds each, and from then on the kernel
writes that real's id (from --ids; none for a real not listed) into every segment of the connection.
Then it speaks as lab.nodes.quic_echo's client does: {"event": "ready", "conns": [...]}, and on each
"round" line one more request per connection, {"event": "round", "answers": {index: node, "reset" or
"timeout"}}.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from balancer import objects
from balancer.datapath import verify_abi
from balancer.libbpf import BpfObject, lib
from lab.nodes.churn_client import answer_rounds
from lab.nodes.quic_echo import QuicClient

CGROUP2 = Path("/sys/fs/cgroup/unified")
BPF_CGROUP_SOCK_OPS = 3
ANSWER_TIMEOUT_S = 3.0


@contextlib.contextmanager
def own_cgroup(name: str) -> Iterator[int]:
    """A cgroup v2 of this process's own (its fd), left and removed on the way out."""
    root = CGROUP2 if (CGROUP2 / "cgroup.procs").exists() else Path("/sys/fs/cgroup")
    group = root / name
    group.mkdir()
    fd = os.open(group, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
        yield fd
    finally:
        (root / "cgroup.procs").write_text(f"{os.getpid()}\n")
        os.close(fd)
        group.rmdir()


@contextlib.contextmanager
def sid_option_writer(cgroup_fd: int) -> Iterator[object]:
    """bpf/tcp_sid_client.bpf.c loaded and attached to the cgroup; yields its sid_ports map."""
    path = objects.find("tcp_sid_client.o")
    verify_abi(path)
    obj = BpfObject(path)
    try:
        obj.load()
        prog = obj.program("tcp_sid_client")
        bpf = lib()
        bpf.bpf_prog_attach.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_uint]
        if bpf.bpf_prog_attach(prog.fd, cgroup_fd, BPF_CGROUP_SOCK_OPS, 0) < 0:
            raise OSError(ctypes.get_errno(), "attach the sock_ops program to the client's cgroup")
        try:
            yield obj.map("sid_ports")
        finally:
            bpf.bpf_prog_detach2.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
            bpf.bpf_prog_detach2(prog.fd, cgroup_fd, BPF_CGROUP_SOCK_OPS)
    finally:
        obj.close()


def _ask(sock: socket.socket, text: str) -> str:
    try:
        sock.sendall(text.encode() + b"\n")
        answer = sock.recv(4096)
    except TimeoutError:
        return "timeout"
    except OSError:
        return "reset"
    return answer.split(b" ", 1)[0].decode() if answer else "reset"


def run(vip: str, port: int, conns: int, ids: dict[str, int]) -> None:
    with own_cgroup(f"l4lab-sid-{os.getpid()}") as cgroup, sid_option_writer(cgroup) as ports:
        socks = []
        for _ in range(conns):
            s = socket.create_connection((vip, port), timeout=ANSWER_TIMEOUT_S)
            s.settimeout(ANSWER_TIMEOUT_S)
            socks.append(s)
        rows = []
        for i, s in enumerate(socks):
            node = _ask(s, "who")
            addr, local = s.getsockname()[:2]
            if node in ids:
                ports.update(local.to_bytes(4, "little"), ids[node].to_bytes(4, "little"))  # type: ignore[attr-defined]
            rows.append({"index": i, "addr": addr, "port": local, "node": node})
        print(json.dumps({"event": "ready", "conns": rows}), flush=True)
        answer_rounds(lambda: {i: _ask(s, "again") for i, s in enumerate(socks)})
        for s in socks:
            s.close()


class TcpSidClient(QuicClient):
    """The client above in a lab node (same channel as the QUIC client: `.ready`, `round()`)."""

    module = "lab.nodes.tcp_sid_client"
    role: tuple[str, ...] = ()
    what = "TCP server-id client"

    def close(self) -> None:
        """Stops the client; a cgroup that a client killed before its own cleanup left is removed (an
        empty cgroup: its only process is gone). nsenter execs the client, so its pid names it."""
        super().close()
        for root in (CGROUP2, Path("/sys/fs/cgroup")):
            with contextlib.suppress(FileNotFoundError):
                (root / f"l4lab-sid-{self.proc.pid}").rmdir()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.nodes.tcp_sid_client")
    ap.add_argument("--vip", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--conns", type=int, default=24)
    ap.add_argument("--ids", default="", help="node=id,... the server id of each real (none: no option)")
    args = ap.parse_args(argv)
    ids = {k: int(v) for k, v in (p.split("=") for p in args.ids.split(",") if p)}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the cgroup is left and removed on the way out
    run(args.vip, args.port, args.conns, ids)
    return 0


if __name__ == "__main__":
    sys.exit(main())
