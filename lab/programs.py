"""The lab's BPF programs (XDP_PASS on the LB's peer veth, decap on the reals), attached in a node and pinned.

Attaching happens with this thread inside the node's namespace (an ifindex resolves in the caller's
namespace); each BPF link is pinned under /sys/fs/bpf/l4lab/<lab>/<node>/ so the program outlives
`l4lab up`, and removing the pins detaches it. `attach_*` return every path they pinned so that the
builder journals exactly those.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable, Sequence
from pathlib import Path

from balancer import objects
from lab.errors import LabError
from lab.nsexec import entered
from lab.state import Program
from lab.topology import Decap, XdpProgram

OBJECT_DIR = Path(__file__).resolve().parent.parent / "build" / "bpf"
BPFFS = Path("/sys/fs/bpf")
DECAP_OBJECT = "decap.o"
DECAP_TC = "decap_tc"
DECAP_XDP = "decap_xdp"


# Called with ("pin" or "pin-dir", path) for every path pinned, the moment it exists.
Journal = Callable[[str, str], None]


def require_bpffs() -> None:
    if not os.path.ismount(BPFFS):
        raise LabError(f"bpffs is not mounted on {BPFFS}; run `make deps` or `mount -t bpf bpf {BPFFS}`")


def object_path(name: str) -> Path:
    """The BPF object `name`, found like lbctl's (balancer/objects.py: $L4LAB_BUILD_DIR, the package, build/)."""
    path = objects.locate(name)
    if path is None:
        raise LabError(
            f"BPF object {OBJECT_DIR / name} does not exist; run `make bpf` (or bring the lab up with --no-bpf)"
        )
    return path


def _journal_new(directory: Path, before: set[Path], journal: Journal) -> None:
    """Journal the paths created under `directory` since `before`, parents before children."""
    for path in sorted(directory.rglob("*")):
        if path not in before:
            journal("pin-dir" if path.is_dir() else "pin", str(path))


def attach_xdp(
    netns: str, ifname: str, xdp: XdpProgram, node_dir: Path, node: str, journal: Journal
) -> Program:
    """Load `xdp.object`, attach `xdp.program` to `ifname` inside `netns` and pin the link."""
    from balancer.libbpf import BpfObject  # libbpf: only when a node gets a program

    path = object_path(xdp.object)
    pin = node_dir / f"xdp_{ifname}"
    with BpfObject(str(path)) as obj:
        obj.load()
        prog = obj.program(xdp.program)
        with entered(netns):
            index = socket.if_nametoindex(ifname)
            link = prog.attach_xdp(index, xdp.mode, ifname)
        try:
            link.pin(str(pin))
            journal("pin", str(pin))
        finally:
            link.close()
    return Program(node, ifname, f"xdp-{xdp.mode}", str(path), xdp.program, str(pin))


def attach_decap(
    netns: str,
    decap: Decap,
    local: Sequence[ipaddress.IPv4Address | ipaddress.IPv6Address],
    node_dir: Path,
    node: str,
    journal: Journal,
) -> Program:
    """Load the decap object told the real's own addresses, attach it to `decap.ifname`, pin maps and link."""
    from balancer.decap import Decap as DecapProgram  # libbpf: only when a real gets the decap program

    path = object_path(DECAP_OBJECT)
    pins = node_dir / "decap"
    before = set(node_dir.rglob("*"))
    prog = DecapProgram.load(str(path))
    try:
        for addr in local:
            prog.add_local(str(addr))
        with entered(netns):
            if decap.attach == "tc":
                prog.attach_tc(decap.ifname)
            else:
                prog.attach_xdp(decap.ifname)
        try:
            prog.pin(str(pins))
        finally:
            _journal_new(node_dir, before, journal)
    finally:
        prog.close()
    hook = "tc-ingress" if decap.attach == "tc" else "xdp-native"
    name = DECAP_TC if decap.attach == "tc" else DECAP_XDP
    return Program(node, decap.ifname, hook, str(path), name, str(pins))
