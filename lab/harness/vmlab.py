"""vmlab.py: a namespace whose tap is the link of a booted real-server VM, and why it cannot run here.

Every VM test needs root, qemu and Debian's cloud kernel; without them it skips and names
`bash scripts/setup.sh --extra vm`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from pyroute2 import IPRoute, netns

from lab.harness import names
from lab.nsexec import entered
from lab.remote.vm import VmReal
from lab.remote.vm_init.image import SETUP_HINT, ImageError, find_kernel, missing_tools


@dataclass(frozen=True)
class VmLab:
    """The VM, the namespace that is its router and client, and the addresses of both sides."""

    netns: str
    vm: VmReal
    client4: str
    client6: str
    vip4: str
    vip6: str
    router4: str
    router6: str


def vm_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the VM suite needs root (tap devices and network namespaces)"
    missing = missing_tools()
    if missing:
        return f"the VM suite needs {', '.join(missing)}: run `{SETUP_HINT}`"
    try:
        find_kernel()
    except ImageError as exc:
        return str(exc)
    return None


@contextlib.contextmanager
def booted_vm_lab() -> Iterator[VmLab]:
    """A namespace `vmt-<random>` holding the tap of a booted VM; all of it removed afterwards."""
    name = names.unique_name(names.VM)
    netns.create(name)
    try:
        lab = VmLab(
            netns=name,
            vm=VmReal(
                "real1", name, addr="192.0.2.10", prefix=24, gateway="192.0.2.1",
                vips=["203.0.113.10", "2001:db8:ff::10"], gue_ports=[6080], fou_ports=[6081],
                addr6="2001:db8:1::10", prefix6=64, gateway6="2001:db8:1::1",
            ),
            client4="198.51.100.7", client6="2001:db8:c::7",
            vip4="203.0.113.10", vip6="2001:db8:ff::10",
            router4="192.0.2.1", router6="2001:db8:1::1",
        )
        with entered(name), IPRoute() as ipr:
            (lo,) = ipr.link_lookup(ifname="lo")
            ipr.link("set", index=lo, state="up")
            ipr.addr("add", index=lo, address=lab.client4, prefixlen=32)
            ipr.addr("add", index=lo, address=lab.client6, prefixlen=128)
            for conf in ("all", "default"):
                with open(f"/proc/sys/net/ipv4/conf/{conf}/rp_filter", "w") as f:
                    f.write("0")
        with lab.vm:
            assert lab.vm.boot_seconds is not None and lab.vm.guest_uptime is not None
            yield lab
    finally:
        netns.remove(name)
