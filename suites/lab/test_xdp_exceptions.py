"""The XDP exception counter (lab/observe/xdp_exceptions.py) sees every xdp:xdp_exception the kernel raises, by program.

A fresh pair of namespaces `xet-<hex>-a` / `-b` joined by a veth (a-b <-> b-a), IPv6 off and no
addresses, so nothing but the test's frames crosses it; b-a runs an XDP program that aborts every
frame. Exactly FRAMES raw frames written into a-b must be counted as FRAMES ABORTED events of that
program on b-a, and of no other program.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from balancer.libbpf import BpfObject
from lab.errors import LabError
from lab.harness import poll, unique_name
from lab.nsexec import NETNS_DIR, entered
from lab.observe.xdp_exceptions import ABORT_PROGRAM, OBJECT, PROGRAM, XdpExceptions, xdp_prog_id

FRAMES = 37
DEADLINE_S = 5.0

pytestmark = pytest.mark.skipif(not OBJECT.is_file(), reason=f"{OBJECT} missing: run make bpf")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], capture_output=True, text=True, check=True)


@pytest.fixture
def aborting_veth() -> Iterator[tuple[str, str]]:
    """Name: aborting_veth. Scope: function. Depends: -.

    (netns of a-b, netns of b-a): a veth whose b-a end aborts every frame in native XDP; all removed after::

        def test_x(aborting_veth):
            a, b = aborting_veth
    """
    base = unique_name("xet")
    a, b = f"{base}-a", f"{base}-b"
    with ExitStack() as stack:
        for ns in (a, b):
            _ip("netns", "add", ns)
            stack.callback(lambda ns=ns: (NETNS_DIR / ns).exists() and _ip("netns", "del", ns))
            subprocess.run(["nsenter", f"--net={NETNS_DIR / ns}", "sysctl", "-q", "-w",
                            "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"],
                           check=True, capture_output=True)
        _ip("link", "add", "a-b", "netns", a, "type", "veth", "peer", "name", "b-a", "netns", b)
        obj = stack.enter_context(BpfObject(str(OBJECT)))
        obj.set_autoload(PROGRAM, False)
        obj.load()
        with entered(b):
            link = obj.program(ABORT_PROGRAM).attach_xdp(socket.if_nametoindex("b-a"), "native", "b-a")
        stack.callback(link.close)
        for ns, ifname in ((a, "a-b"), (b, "b-a")):
            _ip("-n", ns, "link", "set", ifname, "up")
        yield a, b


def test_counts_every_abort_of_one_program(aborting_veth: tuple[str, str]) -> None:
    a, b = aborting_veth
    prog_id = xdp_prog_id(b, "b-a")
    with entered(b):
        ifindex = socket.if_nametoindex("b-a")
    frame = bytes.fromhex("02 00 00 00 00 02 02 00 00 00 00 01 88 b5") + bytes(50)  # local experimental EtherType
    with XdpExceptions() as seen:
        assert seen.of_program(prog_id) == {}
        with entered(a):
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        try:
            sock.bind(("a-b", 0))
            for _ in range(FRAMES):
                sock.send(frame)
        finally:
            sock.close()
        poll(DEADLINE_S, lambda: seen.of_program(prog_id).get(("ABORTED", ifindex), 0),
             f"{FRAMES} aborted frames counted", until=lambda n: n >= FRAMES, check=False)
        assert seen.of_program(prog_id) == {("ABORTED", ifindex): FRAMES}, seen.counts()


def test_says_why_it_cannot_count(tmp_path: Path) -> None:
    missing = tmp_path / "xdp_exception.o"
    with pytest.raises(LabError, match=r"cannot count XDP exceptions: .*xdp_exception.o is missing; run `make bpf`"):
        XdpExceptions(missing).start()
