"""The rig of test_daemon.py: a private netns world in which `lbctl run` is started, fed client
packets and watched (see test_daemon.py's docstring for its shape); the real servers it runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

from pyroute2 import NetNS, netns
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether

from balancer import controller
from balancer.controller import Instance
from balancer.datapath import Datapath
from lab.harness import poll, unique_name

REPO = Path(__file__).resolve().parents[2]
OBJ = REPO / "build" / "bpf" / "balancer.o"
PY = sys.executable
VIP = "198.51.100.100"
TCP_VIP = f"{VIP}:80/tcp"
UDP_VIP = f"{VIP}:9000/udp"
REALS = ["192.0.2.2", "192.0.2.3"]
EXTRA_REAL = "192.0.2.4"
INTERVAL, TIMEOUT, RISE, FALL = 0.2, 0.15, 2, 2
# A deadline for what takes a few probe intervals (a drain, a restore, a log line): generous, as the
# CPUs are shared. Claims about how fast rest on counts of probes, read from the daemon's log.
SETTLE_S = 30.0
METRICS_PORT = 9100
QUIET_INTERVAL = 3.0  # probes this far apart leave windows in which no packet crosses lb0

T = TypeVar("T")

# A real server: HTTP/1.0 200 on TCP port 80 and UDP echo on 9000, bound to one address.
# SIGUSR1 makes it sick: HTTP answers 5NN, NN counting its sick answers (501, 502, ...), and UDP goes
# unanswered. SIGUSR2 makes it recover: 2NN counting its answers since (201, 202, ...), UDP echoed.
# A probe's outcome detail names the status, and the daemon logs the detail of the probe that turned
# a real down or up, so the log says exactly which probe in a row did it.
SERVER = r"""
import selectors, signal, socket, sys
addr = sys.argv[1]
mode = {"base": 0, "n": 0}  # base 0: always 200; 500: sick; 200: recovering (numbered answers)
signal.signal(signal.SIGUSR1, lambda *_: mode.update(base=500, n=0))
signal.signal(signal.SIGUSR2, lambda *_: mode.update(base=200, n=0))
sel = selectors.DefaultSelector()
t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind((addr, 80)); t.listen(128); sel.register(t, selectors.EVENT_READ)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((addr, 9000))
sel.register(u, selectors.EVENT_READ)
print("ready", flush=True)
while True:
    for key, _ in sel.select():
        if key.fileobj is u:
            data, peer = u.recvfrom(2048)
            if mode["base"] != 500:
                u.sendto(data, peer)
            continue
        c, _ = t.accept(); c.settimeout(1.0)
        try:
            if c.recv(4096).startswith(b"GET"):
                status = 200
                if mode["base"]:
                    mode["n"] = min(mode["n"] + 1, 99)
                    status = mode["base"] + mode["n"]
                c.sendall(b"HTTP/1.0 %d X\r\nContent-Length: 3\r\n\r\nok\n" % status)
        except OSError:
            pass
        c.close()
"""

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000


def in_netns(ns: str, fn: Callable[[], T]) -> T:
    """Run fn in a thread that has entered netns ns (sockets it makes stay in that netns)."""
    box: dict[str, Any] = {}

    def body() -> None:
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {ns}")
        finally:
            os.close(fd)
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    th = threading.Thread(target=body)
    th.start()
    th.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


class World:
    """The two namespaces, the real servers and the daemons of one test; everything undone at close."""

    def __init__(self, stack: ExitStack, tmp: Path) -> None:
        self.stack = stack
        self.tmp = tmp
        self.instance = unique_name("dmt")
        self.id = self.instance.removeprefix("dmt-")
        self.lb = f"dmt-{self.id}-lb"
        self.rl = f"dmt-{self.id}-rl"
        self.servers: dict[str, subprocess.Popen[str]] = {}
        for ns in (self.lb, self.rl):
            netns.create(ns)
            stack.callback(_remove_netns, ns)
        with NetNS(self.lb) as ipr:
            ipr.link("add", ifname="lb0", kind="veth", peer={"ifname": "rl0", "net_ns_fd": self.rl})
            idx = ipr.link_lookup(ifname="lb0")[0]
            ipr.addr("add", index=idx, address="192.0.2.1", prefixlen=24)
            ipr.link("set", index=idx, state="up")
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
            self.lb_mac = ipr.get_links(idx)[0].get_attr("IFLA_ADDRESS")
        with NetNS(self.rl) as ipr:
            idx = ipr.link_lookup(ifname="rl0")[0]
            for addr in (*REALS, EXTRA_REAL):
                ipr.addr("add", index=idx, address=addr, prefixlen=24)
            ipr.link("set", index=idx, state="up")
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
            self.rl_mac = ipr.get_links(idx)[0].get_attr("IFLA_ADDRESS")
        self.state_root = tmp / "state"
        stack.callback(self._unload)
        self.log_path = tmp / "daemon.log"
        self.daemon: subprocess.Popen[bytes] | None = None

    # -- servers --------------------------------------------------------------------------------

    def start_server(self, addr: str) -> None:
        proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{self.rl}", PY, "-c", SERVER, addr],
                                stdout=subprocess.PIPE, text=True)
        self.stack.callback(_kill, proc)
        self.servers[addr] = proc
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the server prints "ready" once bound, or exits
        assert line.strip() == "ready", f"real server on {addr} did not start: {line!r}"

    def kill_server(self, addr: str) -> None:
        _kill(self.servers.pop(addr))

    def sicken_server(self, addr: str) -> None:
        """From now on the server answers health checks 501, 502, ... and no UDP."""
        self.servers[addr].send_signal(signal.SIGUSR1)

    def heal_server(self, addr: str) -> None:
        """From now on the server answers health checks 201, 202, ... and echoes UDP again."""
        self.servers[addr].send_signal(signal.SIGUSR2)

    # -- daemon ---------------------------------------------------------------------------------

    def write_config(self, reals: list[str], *, extra: str = "", name: str = "lb.toml",
                     interval: float = INTERVAL, tcp_encap: str = "ipip") -> Path:
        reals_toml = ", ".join(f'{{ address = "{a}" }}' for a in reals)
        hc = f"interval_s = {interval}\ntimeout_s = {TIMEOUT}\nrise = {RISE}\nfall = {FALL}\n"
        text = f"""
[datapath]
interfaces = ["lb0"]
ring_size = 251
max_vips = 8
max_reals = 16
lru_size = 1024
fallback_size = 256

[encap]
nexthop = "{REALS[0]}"  # nexthop_mac = "auto": the MAC is rl0's, found through the kernel

[metrics]
listen = "127.0.0.1:{METRICS_PORT}"

[[vips]]
address = "{VIP}"
port = 80
proto = "tcp"
encap = "{tcp_encap}"
reals = [{reals_toml}]

[vips.healthcheck]
type = "http"
path = "/health"
{hc}{extra}
[[vips]]
address = "{VIP}"
port = 9000
proto = "udp"
encap = "gue1"
reals = [{reals_toml}]

[vips.healthcheck]
type = "udp"
{hc}"""
        path = self.tmp / name
        path.write_text(text)
        return path

    def env(self) -> dict[str, str]:
        return dict(os.environ, LBCTL_STATE_ROOT=str(self.state_root), PYTHONPATH=str(REPO))

    def start_daemon(self, config: Path, env_extra: dict[str, str] | None = None) -> int:
        """Start the daemon; returns the log line index from which its own lines start."""
        mark = len(self.logs())
        env = self.env() | (env_extra or {})
        with open(self.log_path, "ab") as log:
            self.daemon = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{self.lb}", PY, "-m", "balancer.cli", "--instance",
                 self.instance, "run", "--config", str(config), "--object", str(OBJ)],
                cwd=REPO, env=env, stderr=log, stdout=log)
        self.stack.callback(_kill, self.daemon)
        return mark

    def wait_running(self, mark: int, timeout: float = 20.0) -> dict[str, Any]:
        return self.wait_event("running", mark, timeout)

    def logs(self) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        lines = self.log_path.read_text().splitlines()
        out = []
        for line in lines:
            rec = json.loads(line)  # every line the daemon writes is one JSON object
            assert {"ts", "level", "event"} <= set(rec), line
            out.append(rec)
        return out

    def wait_event(self, event: str, mark: int = 0, timeout: float = 10.0,
                   match: Callable[[dict[str, Any]], bool] = lambda _r: True) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            exited = self.daemon is not None and self.daemon.poll() is not None
            rec = next((r for r in self.logs()[mark:] if r["event"] == event and match(r)), None)
            if rec is None and exited:
                assert self.daemon is not None
                raise AssertionError(f"daemon exited with {self.daemon.returncode} before '{event}':\n"
                                     + self.log_path.read_text()[-3000:])
            return rec
        return poll(timeout, found, f"log event '{event}'")

    # -- datapath views -------------------------------------------------------------------------

    def ring_ids(self, vip: str) -> set[int]:
        inst = Instance.open(self.instance)
        try:
            return set(inst.dp.ring(inst.state.vip_nums[vip])) - {0}
        finally:
            inst.close()

    def real_id(self, addr: str) -> int:
        inst = Instance.open(self.instance)
        try:
            return inst.state.real_ids[addr]
        finally:
            inst.close()

    def stats(self) -> dict[str, Any]:
        inst = Instance.open(self.instance)
        try:
            return inst.stats()
        finally:
            inst.close()

    def lbctl_stats(self) -> dict[str, Any]:
        """`lbctl stats --json` as an operator runs it: its own process, in the LB netns."""
        done = subprocess.run(["nsenter", f"--net=/run/netns/{self.lb}", PY, "-m", "balancer.cli",
                               "--instance", self.instance, "stats", "--json"],
                              cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"lbctl stats --json exited {done.returncode}: {done.stderr}"
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    def prog_id(self) -> int:
        out = subprocess.run(["bpftool", "link", "show", "pinned",
                              f"{Instance.pin_dir(self.instance)}/link_lb0", "-j"],
                             check=True, capture_output=True, text=True).stdout
        return int(json.loads(out)["prog_id"])

    def scrape(self, path: str = "/metrics") -> tuple[int, str, str]:
        def get() -> tuple[int, str, str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}{path}", timeout=5) as r:
                    return r.status, r.headers["Content-Type"], r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.headers["Content-Type"], e.read().decode()
        return in_netns(self.lb, get)

    def send_ack(self, sport: int, client: str = "203.0.113.7") -> None:
        frame = bytes(Ether(dst=self.lb_mac, src=self.rl_mac) / IP(src=client, dst=VIP) /
                      TCP(sport=sport, dport=80, flags="A", seq=1, ack=1) / b"x")

        def send() -> None:
            # Session tables are per CPU and veth runs XDP on the sender's CPU: pin the sender, as
            # RSS keeps a flow on one queue on a real NIC.
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
            with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
                s.bind(("rl0", 0))
                s.send(frame)
        in_netns(self.rl, send)

    def flow_real(self, sport: int) -> str:
        """Send one ACK of flow sport and return the real the balancer counted it for."""
        before = {a: c["packets"] for a, c in self.stats()["reals"].items()}
        self.send_ack(sport)

        def moved() -> str | None:
            after = self.stats()["reals"]
            hit = [a for a, c in after.items() if c["packets"] > before.get(a, 0)]
            return hit[0] if hit else None
        return poll(5.0, moved, f"the balancer counting flow {sport} for a real")

    def _unload(self) -> None:
        saved = controller.STATE_ROOT
        controller.STATE_ROOT = str(self.state_root)
        try:
            if Instance.state_path(self.instance).exists() and \
                    Path(Instance.pin_dir(self.instance), "lb_vips").exists():
                Instance.open(self.instance).unload()
            Datapath.unpin(Instance.pin_dir(self.instance))
            Instance.state_path(self.instance).unlink(missing_ok=True)
            Path("/run/lbctl", f"{self.instance}.json").unlink(missing_ok=True)
        finally:
            controller.STATE_ROOT = saved


def _kill(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _remove_netns(ns: str) -> None:
    with contextlib.suppress(FileNotFoundError):  # already gone
        netns.remove(ns)
