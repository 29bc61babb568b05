"""A real's services (HTTP answering its node name, UDP echo prefixed with it) as background processes.

`start()` launches `python -m lab.services` inside the node's namespace in its own session, so it
outlives `l4lab up`; `wait_ready()` polls for the ready file it writes once every socket is bound;
`stop()` ends it (checking the pid still names the same process). The server binds each VIP address
itself, so that UDP replies leave from the VIP (direct server return).

    HTTP     GET / on a VIP answers 200 with the body "<node>\\n"
    UDP      a datagram to a VIP port comes back as b"<node> " + the datagram
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import http.server
import ipaddress
import operator
import os
import signal
import socket
import socketserver
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from lab.errors import LabError
from lab.nsexec import nsenter_argv
from lab.poll import poll
from lab.state import Process

READY_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
_REPO_ROOT = Path(__file__).resolve().parent.parent


# ---- the server (runs inside a node)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET


def _split(spec: str) -> tuple[str, int]:
    host, _, port = spec.rpartition(":")
    return host.strip("[]"), int(port)


def _http_server(node: str, host: str, port: int) -> socketserver.BaseServer:
    body = f"{node}\n".encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the stdlib's name)
            """No per-request log line: the lab's logs keep only errors."""

    class Server(http.server.ThreadingHTTPServer):
        address_family = _family(host)
        daemon_threads = True
        request_queue_size = 512

        def server_bind(self) -> None:
            # HTTPServer.server_bind resolves the bound address (reverse DNS): seconds in a netns.
            socketserver.TCPServer.server_bind(self)
            self.server_name, self.server_port = host, port

    return Server((host, port), Handler)


def _udp_echo(node: str, host: str, port: int) -> socket.socket:
    sock = socket.socket(_family(host), socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def _echo_forever(node: str, sock: socket.socket) -> None:
    prefix = f"{node} ".encode()
    while True:
        data, peer = sock.recvfrom(65535)
        sock.sendto(prefix + data, peer)


def serve(node: str, http_specs: Sequence[str], udp_specs: Sequence[str], ready_file: Path) -> None:
    """Bind every socket, write `ready_file`, then serve until terminated."""
    workers: list[threading.Thread] = []
    for spec in http_specs:
        server = _http_server(node, *_split(spec))
        workers.append(threading.Thread(target=server.serve_forever, daemon=True))
    for spec in udp_specs:
        sock = _udp_echo(node, *_split(spec))
        workers.append(threading.Thread(target=_echo_forever, args=(node, sock), daemon=True))
    for worker in workers:
        worker.start()
    tmp = ready_file.with_suffix(".tmp")
    tmp.write_text(f"{os.getpid()}\n")
    os.replace(tmp, ready_file)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.services", description="serve a real's VIPs")
    parser.add_argument("--lab", required=True, help="the lab this process belongs to (for finding it)")
    parser.add_argument("--node", required=True)
    parser.add_argument("--http", action="append", default=[], metavar="ADDR:PORT")
    parser.add_argument("--udp-echo", action="append", default=[], metavar="ADDR:PORT")
    parser.add_argument("--ready-file", required=True, type=Path)
    args = parser.parse_args(argv)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    serve(args.node, args.http, args.udp_echo, args.ready_file)
    return 0


# ---- the launcher (runs in `l4lab up` / `l4lab down`)


def start(lab: str, netns: str, node: str, binds: Sequence[tuple[str, str, int]], run_dir: Path) -> Process:
    """Start the services of `node`: `binds` lists (service, address, port)."""
    ready = run_dir / f"{node}.ready"
    log = run_dir / f"{node}.log"
    argv = [sys.executable, "-m", "lab.services", "--lab", lab, "--node", node, "--ready-file", str(ready)]
    for service, address, port in binds:
        host = f"[{address}]" if ":" in address else address
        argv += [f"--{service}", f"{host}:{port}"]
    return spawn_detached(nsenter_argv(netns, argv), node=node, log=log, what=f"the services of {node}", argv=argv)


def spawn_detached(full: Sequence[str], *, node: str, log: Path, what: str, argv: Sequence[str] | None = None
                   ) -> Process:
    """Start `full` in its own session (it outlives `l4lab up`), stdout and stderr to `log`.

    The repository is put on PYTHONPATH so `python -m lab....` works from anywhere; `argv` (default
    `full`) is what the lab's state records for the process.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO_ROOT), env.get("PYTHONPATH")]))
    try:
        pid = os.posix_spawn(
            full[0],
            list(full),
            env,
            setsid=True,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
                (os.POSIX_SPAWN_DUP2, 1, 2),
            ],
        )
    except OSError as exc:
        raise LabError(f"cannot start {what}: {exc}", command=" ".join(full)) from exc
    return Process(node=node, pid=pid, starttime=starttime(pid) or 0, argv=list(argv or full), log=str(log))


def wait_ready(processes: Sequence[Process], run_dir: Path, timeout: float = READY_TIMEOUT_S) -> None:
    """Poll until every process has written its ready file; raise naming the first that died or hung."""
    waiting = list(processes)

    def still_waiting() -> list[Process]:
        for proc in list(waiting):
            if (run_dir / f"{proc.node}.ready").exists():
                waiting.remove(proc)
            elif not _alive(proc.pid):
                tail = _tail(proc.log)
                raise LabError(
                    f"the services of {proc.node} exited before they were ready: {tail}",
                    command=" ".join(proc.argv),
                    stderr=tail,
                )
        return waiting

    if poll(timeout, still_waiting, "every ready file", until=operator.not_, check=False, interval_s=0.005):
        names = ", ".join(p.node for p in waiting)
        raise LabError(f"the services of {names} were not ready within {timeout:g} s; see {waiting[0].log}")


def stop(proc: Process, timeout: float = STOP_TIMEOUT_S) -> None:
    """End `proc` (SIGTERM, then SIGKILL at the deadline); a process already gone is fine."""
    if starttime(proc.pid) != proc.starttime:
        _reap(proc.pid)
        return  # gone, or the pid now names another process
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            return
        if not poll(timeout, lambda: _alive(proc.pid), f"pid {proc.pid} gone", until=operator.not_, check=False,
                    interval_s=0.002):
            return
    raise LabError(f"the services of {proc.node} (pid {proc.pid}) survived SIGKILL for {timeout:g} s")


def log_tail(log: str) -> str:
    """The last three lines of a lab process's log, for error messages."""
    try:
        lines = Path(log).read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return "(no log)"
    return " | ".join(lines[-3:]) if lines else "(empty log)"


def starttime(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks), or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rpartition(")")[2].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):  # not our child: its parent (or init) reaps it
        os.waitpid(pid, os.WNOHANG)


def _alive(pid: int) -> bool:
    _reap(pid)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _tail(log: str) -> str:
    try:
        lines = Path(log).read_text().strip().splitlines()
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return "(no log)"
        raise
    return " | ".join(lines[-3:]) if lines else "(empty log)"


if __name__ == "__main__":
    sys.exit(main())
