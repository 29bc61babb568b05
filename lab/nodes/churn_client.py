"""Long-lived TCP connections to a VIP's line echo plus a stream of new ones, with each one's fate, for the churn suite.

    python -m lab.nodes.churn_client --vip 198.51.100.100 --port 7007 --conns 200

Runs inside the client node. It opens --conns connections, learns from the first echo which real
serves each, and prints one JSON line {"event": "ready", "conns": [{index, addr, port, node}...]}
(addr and port: the connection's own end, so a test can ask the LB which real its ring gives it).
From then on, every --interval seconds it sends a numbered line on every connection still alive;
a connection fails as "reset" (ECONNRESET, EPIPE or EOF) or "timeout" (no answer within --timeout).
A second thread opens a new connection every --new-every seconds, sends one line and records who answered.

Commands on stdin: "mark NAME" records the moment (answered {"event": "marked"}); "tick" sends a
request on every connection now (answered {"event": "ticked"}; for idle connections: a long --interval); "stop [S]"
keeps going S more seconds (the observation window), then waits out the requests in flight and prints
the report {"event": "report", "conns": [...], "new": [...], "marks": {...}} and exits. Times are
seconds since the start. With --cpu the process pins itself to one CPU, as a NIC's RSS keeps a
flow on one CPU (veth runs XDP on the sender's CPU, and the LB's session tables are per CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import select
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from lab.errors import LabError
from lab.nsexec import nsenter_argv
from lab.state import netns_name

_REPO = Path(__file__).resolve().parent.parent.parent
_T0 = time.monotonic()


def _now() -> float:
    return round(time.monotonic() - _T0, 3)


# ---- the client (runs inside the client node)


@dataclass
class Conn:
    """One long-lived connection: its real, its outstanding request and its fate."""

    index: int
    sock: socket.socket
    port: int = 0
    addr: str = ""              # the client's own address (the flow's source)
    node: str = ""
    seq: int = 0
    sent_at: float | None = None
    buf: bytes = b""
    ok: int = 0
    status: str = "ok"          # ok, reset, timeout, moved
    failed_at: float | None = None
    last_ok_at: float | None = None
    nodes: set[str] = field(default_factory=set)

    def report(self) -> dict[str, Any]:
        return {"index": self.index, "addr": self.addr, "port": self.port, "node": self.node,
                "status": self.status, "answers": self.ok,
                "failed_at": self.failed_at, "last_ok_at": self.last_ok_at, "nodes": sorted(self.nodes)}


def _family(vip: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in vip else socket.AF_INET


def _ask(sock: socket.socket, line: bytes, timeout: float) -> str:
    """Send one line and return the node named in the answer (blocking, with a timeout)."""
    sock.settimeout(timeout)
    sock.sendall(line)
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionResetError(errno.ECONNRESET, "closed by the peer")
        data += chunk
    return data.decode(errors="replace").split(" ", 1)[0]


class Client:
    def __init__(self, vip: str, port: int, conns: int, interval: float, timeout: float, new_every: float) -> None:
        self.vip, self.port = vip, port
        self.count, self.interval, self.timeout, self.new_every = conns, interval, timeout, new_every
        self.conns: list[Conn] = []
        self.new: list[dict[str, Any]] = []
        self.marks: dict[str, float] = {}
        self.stopping = threading.Event()
        self.stop_at = float("inf")
        self.sel = selectors.DefaultSelector()

    def open_all(self) -> None:
        for i in range(self.count):
            sock = socket.create_connection((self.vip, self.port), timeout=self.timeout)
            node = _ask(sock, b"hello\n", self.timeout)
            sock.setblocking(False)
            local = sock.getsockname()
            conn = Conn(i, sock, port=local[1], addr=local[0], node=node, nodes={node})
            self.conns.append(conn)
            self.sel.register(sock, selectors.EVENT_READ, conn)

    def _fail(self, conn: Conn, status: str) -> None:
        conn.status, conn.failed_at = status, _now()
        self.sel.unregister(conn.sock)
        conn.sock.close()

    def _on_readable(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except OSError as exc:
            self._fail(conn, "reset" if exc.errno in (errno.ECONNRESET, errno.EPIPE) else f"error {exc.errno}")
            return
        if not data:
            self._fail(conn, "reset")
            return
        conn.buf += data
        while b"\n" in conn.buf:
            line, conn.buf = conn.buf.split(b"\n", 1)
            node = line.decode(errors="replace").split(" ", 1)[0]
            conn.nodes.add(node)
            conn.ok += 1
            conn.sent_at = None
            conn.last_ok_at = _now()
            if node != conn.node:
                conn.status = "moved"

    def _tick_timeouts(self) -> None:
        now = time.monotonic()
        for conn in self.conns:
            if conn.failed_at is None and conn.sent_at is not None and now - conn.sent_at >= self.timeout:
                self._fail(conn, "timeout")

    def _tick(self) -> None:
        self._tick_timeouts()
        now = time.monotonic()
        for conn in self.conns:
            if conn.failed_at is not None or conn.sent_at is not None:
                continue
            conn.seq += 1
            try:
                conn.sock.send(f"{conn.seq}\n".encode())
                conn.sent_at = now
            except OSError as exc:
                self._fail(conn, "reset" if exc.errno in (errno.ECONNRESET, errno.EPIPE) else f"error {exc.errno}")

    def _new_flows(self) -> None:
        while not self.stopping.wait(self.new_every):
            t = _now()
            try:
                with socket.create_connection((self.vip, self.port), timeout=self.timeout) as sock:
                    self.new.append({"t": t, "node": _ask(sock, b"new\n", self.timeout)})
            except OSError as exc:
                self.new.append({"t": t, "error": f"{type(exc).__name__}: {exc}"})

    def _command(self) -> None:
        line = sys.stdin.readline()
        word, _, arg = line.strip().partition(" ")
        if not line or word == "stop":
            self.stop_at = min(self.stop_at, time.monotonic() + float(arg or 0))
        elif word == "mark":
            self.marks[arg] = _now()
            _emit({"event": "marked", "name": arg, "t": self.marks[arg]})
        elif word == "tick":
            self._tick()
            _emit({"event": "ticked", "t": _now()})

    def run(self) -> None:
        newer = threading.Thread(target=self._new_flows, daemon=True)
        newer.start()
        next_tick = time.monotonic()
        while time.monotonic() < self.stop_at:
            if time.monotonic() >= next_tick:
                self._tick()
                next_tick += self.interval
            wait = min(max(0.0, next_tick - time.monotonic()), 0.1)  # stdin is read between waits
            for key, _ in self.sel.select(wait):
                self._on_readable(key.data)
            if self.stop_at == float("inf") and select.select([sys.stdin], [], [], 0)[0]:
                self._command()
        self.stopping.set()
        newer.join(timeout=self.timeout + 1)
        # Give every outstanding request its full timeout before judging it.
        pending = [c for c in self.conns if c.failed_at is None and c.sent_at is not None]
        while pending:
            deadline = max(c.sent_at or 0.0 for c in pending) + self.timeout
            for key, _ in self.sel.select(max(0.0, deadline - time.monotonic())):
                self._on_readable(key.data)
            self._tick_timeouts()
            pending = [c for c in pending if c.failed_at is None and c.sent_at is not None]
        _emit({"event": "report", "conns": [c.report() for c in self.conns], "new": self.new, "marks": self.marks})
        for conn in self.conns:
            if conn.failed_at is None:
                conn.sock.close()


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def answer_rounds(ask: Callable[[], Mapping[int, str]]) -> None:
    """The round channel of the clients that speak as lab.nodes.quic_echo's does: each "round" line on
    stdin is answered {"event": "round", "answers": ask()}; any other line, or the input's end, ends it."""
    for line in sys.stdin:
        if line.strip() != "round":
            return
        _emit({"event": "round", "answers": dict(ask())})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.nodes.churn_client")
    ap.add_argument("--vip", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--conns", type=int, default=200)
    ap.add_argument("--interval", type=float, default=0.25, help="seconds between requests on a connection")
    ap.add_argument("--timeout", type=float, default=2.0, help="seconds an answer may take")
    ap.add_argument("--new-every", type=float, default=0.05, help="seconds between new connections")
    ap.add_argument("--cpu", type=int, help="pin the process to this CPU")
    args = ap.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    client = Client(args.vip, args.port, args.conns, args.interval, args.timeout, args.new_every)
    client.open_all()
    _emit({"event": "ready", "t": _now(), "conns": [{"index": c.index, "addr": c.addr, "port": c.port, "node": c.node}
                                                    for c in client.conns]})
    client.run()
    return 0


# ---- the launcher (runs in the test)


class ChurnClient:
    """The client above, running in a lab node; `mark()` and `stop()` talk to it over its stdin.

    `module` and `role` name another node program that speaks the same JSON lines (lab.nodes.quic_echo's
    client); `_read` and `_send` are its channel."""

    module: str = "lab.nodes.churn_client"
    role: tuple[str, ...] = ()
    what: str = "churn client"

    def __init__(self, lab: str | Any, node: str, vip: str, port: int, *args: str, ready_timeout: float = 30.0) -> None:
        """`lab` is a netns lab's name, or a lab.harness.Lab (netns or --target; over ssh the
        client ends when its input closes, as it does here)."""
        module_args = [*self.role, "--vip", vip, "--port", str(port), *args]
        if isinstance(lab, str):
            full = nsenter_argv(netns_name(lab, node), [sys.executable, "-m", self.module, *module_args])
            self.where = f"the {self.what} in {netns_name(lab, node)}"
        else:
            full = lab.python_argv(node, self.module, *module_args)
            self.where = f"the {self.what} in {lab.where(node)}"
        self.proc = subprocess.Popen(full, cwd=_REPO, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            self.ready = self._read("ready", ready_timeout)
        except BaseException:
            self.close()
            raise

    def _read(self, event: str, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
                line = self.proc.stdout.readline()
                if not line:
                    break
                msg: dict[str, Any] = json.loads(line)
                if msg.get("event") == event:
                    return msg
        stderr = ""
        if self.proc.poll() is not None and self.proc.stderr is not None:
            stderr = self.proc.stderr.read()[-2000:]
        raise LabError(f"{self.where} did not report '{event}' within {timeout:g} s "
                       f"(exit {self.proc.poll()}): {stderr or 'no stderr'}")

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def mark(self, name: str) -> float:
        self._send(f"mark {name}")
        return float(self._read("marked", 10)["t"])

    def tick(self) -> None:
        """A request on every live connection now (the client's --interval may be long: idle connections)."""
        self._send("tick")
        self._read("ticked", 10)

    def stop(self, after: float = 0.0, timeout: float = 20.0) -> dict[str, Any]:
        """Let the client run `after` more seconds (its observation window), then take its report."""
        self._send(f"stop {after}")
        report = self._read("report", after + timeout)
        self.close()
        return report

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):  # input's end stops the client (also a remote one)
                self.proc.stdin.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> ChurnClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(main())
