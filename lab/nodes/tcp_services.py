"""TCP services the PMTU and churn suites run on the reals (a byte sink and a line echo), and their launcher.

Both bind every VIP address given (the VIP sits on the real's lo), name the real in every answer,
and serve any number of connections from one thread with a selector:

    sink    reads until the client shuts its side down, then answers b"<node> <bytes read>\\n"
    echo    answers each line b"<line>" with b"<node> <line>"; connections live until the client closes

    python -m lab.nodes.tcp_services sink --node real1 --bind 198.51.100.100:5001

The process prints "ready" once every socket listens. `Services` starts one per node through
nsenter (or over ssh on a --target lab, where the server also ends when its standard input closes:
a remote process outlives a killed ssh otherwise), waits for each "ready" with a deadline, and
ends them all when the `with` block exits.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from lab.errors import LabError
from lab.nsexec import nsenter_argv
from lab.state import netns_name

READY_TIMEOUT_S = 10.0
_REPO = Path(__file__).resolve().parent.parent.parent


# ---- the server (runs inside a real)


def _listen(spec: str) -> socket.socket:
    host, _, port = spec.rpartition(":")
    host = host.strip("[]")
    fam = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    sock = socket.socket(fam, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


class _Conn:
    """One accepted connection: bytes read so far and the partial line not yet answered."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.count = 0
        self.pending = b""


def serve(kind: str, node: str, binds: Sequence[str], until_eof: bool = False) -> None:
    """Serve `kind` ("sink" or "echo") on every ADDR:PORT in binds until SIGTERM (or stdin's end)."""
    sel = selectors.DefaultSelector()
    for spec in binds:
        sel.register(_listen(spec), selectors.EVENT_READ, None)
    if until_eof:
        sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
    prefix = f"{node} ".encode()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        for key, _ in sel.select():
            if key.data == "stdin":
                if not sys.stdin.readline():
                    return
                continue
            if key.data is None:
                listener: socket.socket = key.fileobj  # type: ignore[assignment]
                with contextlib.suppress(BlockingIOError):
                    sock, _peer = listener.accept()
                    sock.setblocking(True)  # answers are small: a blocking send never waits long
                    sel.register(sock, selectors.EVENT_READ, _Conn(sock))
                continue
            conn: _Conn = key.data
            try:
                data = conn.sock.recv(262144)
            except OSError:
                data = b""
                conn.count = -1  # reset by the peer: nothing to answer
            if data:
                conn.count += len(data)
                if kind == "echo":
                    conn.pending += data
                    *lines, conn.pending = conn.pending.split(b"\n")
                    with contextlib.suppress(OSError):
                        conn.sock.sendall(b"".join(prefix + line + b"\n" for line in lines))
                continue
            sel.unregister(conn.sock)
            if kind == "sink" and conn.count >= 0:
                with contextlib.suppress(OSError):
                    conn.sock.sendall(prefix + f"{conn.count}\n".encode())
            conn.sock.close()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.nodes.tcp_services")
    ap.add_argument("kind", choices=("sink", "echo"))
    ap.add_argument("--node", required=True)
    ap.add_argument("--bind", action="append", required=True, metavar="ADDR:PORT")
    ap.add_argument("--cpu", type=int, help="pin the process to this CPU")
    ap.add_argument("--until-eof", action="store_true", help="also end when standard input closes")
    args = ap.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(args.kind, args.node, args.bind, args.until_eof)
    return 0


# ---- the launcher (runs in the test)


class Services:
    """One `kind` server per node of a lab, bound to `binds`; ready on entry, stopped on exit."""

    def __init__(self, lab: str | Any, nodes: Sequence[str], kind: str, binds: Sequence[str],
                 cpu: int | None = None, module: str = "lab.nodes.tcp_services",
                 node_args: dict[str, list[str]] | None = None) -> None:
        """`lab` is a netns lab's name, or a lab.harness.Lab (netns or --target). `module` is the node
        program (another that takes KIND --node N --bind B... and prints "ready", such as
        lab.nodes.quic_echo), `node_args` more arguments for some nodes."""
        self.module = module
        self.node_args = node_args or {}
        self.lab = lab
        self.remote = not isinstance(lab, str) and lab.target is not None
        self.cpu = cpu
        self.nodes = list(nodes)
        self.kind = kind
        self.binds = list(binds)
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def __enter__(self) -> Services:
        try:
            for node in self.nodes:
                args = [self.kind, "--node", node, *[a for b in self.binds for a in ("--bind", b)]]
                args += ["--cpu", str(self.cpu)] if self.cpu is not None else []
                args += ["--until-eof"] if self.remote else []
                args += self.node_args.get(node, [])
                if isinstance(self.lab, str):
                    full = nsenter_argv(netns_name(self.lab, node), [sys.executable, "-m", self.module, *args])
                else:
                    full = self.lab.python_argv(node, self.module, *args)
                self.procs[node] = subprocess.Popen(
                    full, cwd=_REPO, text=True, stdin=subprocess.PIPE if self.remote else subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for node, proc in self.procs.items():
                self._wait_ready(node, proc)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, node: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if sel.select(deadline - time.monotonic()):
                line = proc.stdout.readline()
                if line.strip() == "ready":
                    return
                if not line:
                    break
        stderr = ""
        if proc.poll() is not None and proc.stderr is not None:
            stderr = proc.stderr.read()[-1000:]
        where = netns_name(self.lab, node) if isinstance(self.lab, str) else self.lab.where(node)
        raise LabError(f"the {self.kind} service on {node} ({where}) did not say "
                       f"'ready' within {READY_TIMEOUT_S:g} s (exit {proc.poll()}): {stderr or 'no stderr'}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.stdin is not None:  # a remote server ends when its input closes
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        for proc in self.procs.values():
            if self.remote:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        self.procs.clear()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(main())
