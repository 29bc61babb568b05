"""control.py: the daemon's control socket, through which `lbctl` hands a write to the `lbctl run` owning an instance.

While `lbctl run` owns an instance (the lock of balancer/preflight.py), it listens on a Unix stream
socket beside that lock, ``<state root>/<instance>.sock`` (its owner only: root). A
command that finds the instance owned connects, sends one request as a JSON line and reads one
answer line::

    {"verb": "upgrade", "object": "/opt/l4lab/balancer.o"}
    {"ok": true, "exit": 0, "message": "replaced the program behind 1 link(s) with ..."}

Verbs: ``describe`` (who owns the instance: pid, config file, object), ``upgrade`` (swap the program
behind the links for ``object``), ``reload`` (read the config file again and apply it, as SIGHUP does,
but answered). The daemon carries each request out on its event loop, between health applies and
reloads, so a handed-over write never interleaves with another, and logs it as it answers it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from balancer.errors import HostError

__all__ = ["Request", "Server", "VERBS", "request", "socket_path"]

VERBS = ("describe", "upgrade", "reload")
MAX_REQUEST = 65536
READ_TIMEOUT_S = 5.0
# An upgrade verifies and loads a whole program (a second here, much longer under a loaded VM).
ANSWER_TIMEOUT_S = 300.0


def socket_path(state_root: str, name: str) -> Path:
    return Path(state_root) / f"{name}.sock"


@dataclass
class Request:
    """One request from a client, carried out by the daemon's event loop, which calls `answer`."""

    verb: str
    args: dict[str, Any]
    peer_pid: int = 0
    _answer: dict[str, Any] = field(default_factory=dict)
    _done: threading.Event = field(default_factory=threading.Event)

    def answer(self, ok: bool, message: str, exit_code: int | None = None, **extra: Any) -> None:
        self._answer = {"ok": ok, "exit": 0 if ok else (exit_code or 1), "message": message, **extra}
        self._done.set()

    def wait(self, timeout: float) -> dict[str, Any]:
        if not self._done.wait(timeout):
            return {"ok": False, "exit": 1,
                    "message": f"the daemon did not carry out '{self.verb}' within {timeout:g} s; see its log"}
        return self._answer


class Server:
    """The listening socket and its threads; `handle` queues a Request for the daemon's loop."""

    def __init__(self, path: Path, handle: Callable[[Request], None]) -> None:
        self.path = path
        self.handle = handle
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and listen. Called only by the lock's holder, so a socket file left there is stale."""
        self.path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o077)
        try:
            sock.bind(str(self.path))
        except OSError as exc:
            sock.close()
            raise HostError(f"cannot listen on the control socket {self.path}: {exc.strerror}; "
                            "check that its folder is writable (RuntimeDirectory=lbctl under systemd)") from exc
        finally:
            os.umask(old)
        sock.listen(8)
        self._sock = sock
        self._thread = threading.Thread(target=self._accept, name="lbctl-control", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
            self.path.unlink(missing_ok=True)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _accept(self) -> None:
        while self._sock is not None:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed by stop()
                return
            threading.Thread(target=self._serve, args=(conn,), name="lbctl-control-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                answer = self._carry_out(conn)
            except (OSError, ValueError) as exc:
                answer = {"ok": False, "exit": 2, "message": f"bad request on {self.path}: {exc}"}
            with contextlib.suppress(OSError):  # the client gave up: nothing to tell
                conn.sendall(json.dumps(answer).encode() + b"\n")

    def _carry_out(self, conn: socket.socket) -> dict[str, Any]:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        pid, uid = int.from_bytes(creds[0:4], "little"), int.from_bytes(creds[4:8], "little")
        if uid not in (0, os.geteuid()):
            return {"ok": False, "exit": 1, "message": f"uid {uid} may not control this instance; run as root"}
        conn.settimeout(READ_TIMEOUT_S)
        data = _read_line(conn)
        req = json.loads(data)
        if not isinstance(req, dict) or req.get("verb") not in VERBS:
            raise ValueError(f"expected {{\"verb\": one of {', '.join(VERBS)}, ...}} but got {data[:200]!r}")
        request = Request(req["verb"], {k: v for k, v in req.items() if k != "verb"}, pid)
        self.handle(request)
        return request.wait(ANSWER_TIMEOUT_S)


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST:
            raise ValueError(f"a request longer than {MAX_REQUEST} bytes")
    return data


def request(path: Path, verb: str, timeout: float = ANSWER_TIMEOUT_S + 10, **args: Any) -> dict[str, Any]:
    """Send one request to the daemon listening on `path` and return its answer (ok, exit, message, ...)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall(json.dumps({"verb": verb, **args}).encode() + b"\n")
            data = _read_line(sock)
    except (OSError, ValueError) as exc:
        raise HostError(f"cannot reach the daemon's control socket {path}: {exc}; is `lbctl run` "
                        "for this instance running (`systemctl status lbctl`)?") from exc
    try:
        answer: dict[str, Any] = json.loads(data)
    except ValueError as exc:
        raise HostError(f"the daemon answered {data[:200]!r} on {path}, not a JSON line: {exc}") from exc
    return answer
