"""The software bench's testbed: two namespaces (prefix `bnt-`), the veth between them, counters, a balancer.

A generator namespace whose veth leads into an LB namespace: the program on the LB veth (the
balancer, or a floor program) XDP_TXes each frame back, where a counting XDP program on the
generator side counts and drops it. run.py searches NDRs on it, katran_live.py and profile.py run
Katran's program and the perf-sampled loop on the same veth pair. Its link and addresses are the
model's (model.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from balancer.controller import Instance
from balancer.encaps import IP4_IPIP
from balancer.libbpf import BpfObject
from lab.bench.gen.base import Endpoints
from lab.bench.gen.xdplive import XdpLiveGenerator, percpu_total
from lab.bench.model import GEN_IF, GEN_MAC, LB_IF, LB_MAC, LINK_MTU, VIP4, VIP6, VIP_PORT, lb_config
from lab.errors import LabError
from lab.nsexec import entered, nsenter_argv
from lab.signals import deferred

OBJECT_DIR = Path(__file__).resolve().parents[2] / "build" / "bpf"
PREFIX = "bnt-"
# Idle veth ends in the generator namespace where the generator parks its programs (IMIX uses 3).
PARK_IFS = ("bnt-p0", "bnt-p1", "bnt-p2", "bnt-p3")
COMMAND_GRACE_S = 10.0  # an interrupted `ip` or `sysctl` finishes in milliseconds; past this it is killed


def _run(argv: Sequence[str], what: str) -> None:
    proc: subprocess.Popen[str] | None = None
    try:
        # Started with the interrupts held: one that landed inside Popen, after the fork, left
        # `ip netns add` running unwatched, and it made the netns after the teardown's delete.
        with deferred():
            proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with proc:
            _, err = proc.communicate()
    except BaseException:
        # An interrupt lets the command finish before the teardown undoes it: subprocess.run would
        # kill `ip netns add` mid-way and not reap it, so the netns could appear after its delete ran.
        if proc is not None:
            try:
                proc.wait(timeout=COMMAND_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise
    if proc.returncode != 0:
        raise LabError(f"cannot {what}: '{' '.join(argv)}' failed: {err.strip()}",
                       step=what, command=" ".join(argv), stderr=err)


def object_path(name: str) -> str:
    """A built BPF object under build/bpf, or a LabError naming `make bpf`."""
    path = OBJECT_DIR / name
    if not path.is_file():
        raise LabError(f"BPF object {path} does not exist; run `make bpf`")
    return str(path)


class Testbed:
    """The bench's two namespaces, the veth between them, the counters and the balancer instance."""

    def __init__(self, stack: ExitStack, cpus: int) -> None:
        self.stack = stack
        tag = f"{PREFIX}{os.getpid()}"
        self.gen_ns, self.lb_ns = f"{tag}-gen", f"{tag}-lb"
        self.instance_name = tag
        for ns in (self.gen_ns, self.lb_ns):
            # Registered first: a SIGTERM right after `ip netns add` returns would otherwise leak it.
            stack.callback(_delete_netns, ns)
            _run(["ip", "netns", "add", ns], f"create netns {ns}")
        queues = ["numtxqueues", str(cpus), "numrxqueues", str(cpus)]
        _run(["ip", "link", "add", "name", GEN_IF, "netns", self.gen_ns, "address", GEN_MAC,
              "mtu", str(LINK_MTU), *queues, "type", "veth", "peer", "name", LB_IF, "netns", self.lb_ns,
              "address", LB_MAC, "mtu", str(LINK_MTU), *queues], "create the bench veth pair")
        for a, b in zip(PARK_IFS[::2], PARK_IFS[1::2], strict=True):
            _run(["ip", "link", "add", "name", a, "netns", self.gen_ns, "type", "veth", "peer", "name", b,
                  "netns", self.gen_ns], "create the generator's parking veths")
        for ns, ifname in ((self.gen_ns, GEN_IF), (self.lb_ns, LB_IF)):
            # No IPv6 on the link: the stack's own ND/MLD frames would be counted as received.
            _run(_ns(ns, ["sysctl", "-qw", f"net.ipv6.conf.{ifname}.disable_ipv6=1"]), f"quiet {ifname}")
            _run(_ns(ns, ["ip", "link", "set", ifname, "up"]), f"bring {ifname} up")
        self.gen_counter = BpfObject(object_path("floor.o"))
        stack.callback(self.gen_counter.close)
        self.gen_counter.load()
        self.lb_floor = BpfObject(object_path("floor.o"))
        stack.callback(self.lb_floor.close)
        self.lb_floor.load()
        self._attach(self.gen_ns, GEN_IF, self.gen_counter.program("xdp_drop"))
        self._lb_link: Any = None
        self.instance: Any = None

    def _attach(self, ns: str, ifname: str, prog: Any) -> Any:
        with entered(ns):
            link = prog.attach_xdp(socket.if_nametoindex(ifname), "native", ifname)
        self.stack.callback(link.close)
        return link

    def load_balancer(self, obj: Path | None = None) -> None:
        """The balancer instance (build/bpf/balancer.o, or obj), loaded once."""
        if self.instance is None:
            self.stack.callback(self._unload)  # first, as for the namespaces: no window that leaks pins
            self.instance = Instance.load(self.instance_name, [], config=lb_config(IP4_IPIP),
                                          obj=str(obj) if obj else object_path("balancer.o"))

    def _unload(self) -> None:
        if self.instance is not None:
            self.instance.unload()

    def on_lb(self, what: str) -> None:
        """Put `what` on the LB veth: "balancer", "xdp_tx_swap" or "xdp_drop"."""
        if what == "balancer":
            self.load_balancer()
            prog = self.instance.dp.programs["balancer_xdp"]
        else:
            prog = self.lb_floor.program(what)
        self.on_lb_program(prog)

    def on_lb_program(self, prog: Any) -> None:
        """Put any loaded XDP program on the LB veth (e.g. Katran's, lab/bench/katran.py)."""
        if self._lb_link is not None:
            self._lb_link.close()
            self._lb_link = None
        self._lb_link = self._attach(self.lb_ns, LB_IF, prog)

    def gen_count(self) -> int:
        return _count(self.gen_counter)

    def lb_count(self) -> int:
        return _count(self.lb_floor)


def _count(obj: Any) -> int:
    return percpu_total(obj.map("fl_count").lookup_percpu(b"\0" * 4))


def _ns(ns: str, argv: list[str]) -> list[str]:
    return nsenter_argv(ns, argv)


def _delete_netns(ns: str) -> None:
    done = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True, check=False)
    if done.returncode != 0 and "No such file" not in done.stderr:
        raise LabError(f"cannot delete netns {ns}: {done.stderr.strip()}", step="teardown")


def live_generator(bed: Testbed, sink: Callable[[], int]) -> XdpLiveGenerator:
    """The live-frames generator on the testbed's generator veth, its frames counted by `sink`."""
    ep = Endpoints(src_mac=GEN_MAC, dst_mac=LB_MAC, dst4=VIP4, dst6=VIP6, dport=VIP_PORT)
    return XdpLiveGenerator(bed.gen_ns, GEN_IF, ep, sink, park_ifnames=PARK_IFS,
                            object_path=object_path("trafficgen.o"))


def check_environment() -> None:
    """Raise LabError naming what is missing: root, bpffs, the built objects."""
    if os.geteuid() != 0:
        raise LabError("l4lab bench needs root (it creates namespaces and loads BPF programs); "
                       "run it with sudo")
    if not os.path.ismount("/sys/fs/bpf"):
        raise LabError("bpffs is not mounted on /sys/fs/bpf; run `make deps` "
                       "or `mount -t bpf bpf /sys/fs/bpf`")
    for name in ("balancer.o", "floor.o", "trafficgen.o"):
        object_path(name)


@contextmanager
def testbed() -> Iterator[Testbed]:
    """The bench testbed, removed on the way out even when a measurement fails."""
    with ExitStack() as stack:
        yield Testbed(stack, max(1, len(os.sched_getaffinity(0))))

