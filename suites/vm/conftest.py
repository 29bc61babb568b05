"""Fixtures of the VM suite: a namespace holding a booted real-server VM's tap, and the client addresses.

Every test here needs root, qemu and Debian's cloud kernel; without them the suite skips and names
`bash scripts/setup.sh --extra vm`. Boot times are collected and printed in the terminal summary.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from _pytest.terminal import TerminalReporter
from pyroute2 import IPRoute, netns

from lab.nsexec import entered
from lab.vm import VmReal
from lab.vm_init.image import SETUP_HINT, ImageError, find_kernel, missing_tools

BOOT_TIMES = pytest.StashKey[list[tuple[str, float, float]]]()


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


@pytest.fixture(scope="module")
def vm_lab(request: pytest.FixtureRequest) -> Iterator[VmLab]:
    """A namespace `vmt-<random>` whose tap is the link of a booted real-server VM.

    Name: vm_lab
    Scope: module (one boot serves the module's tests)
    Depends: root, qemu, the cloud kernel unpacked in build/vm/kernel/ (skips otherwise)

        def test_x(vm_lab):
            with entered(vm_lab.netns):
                socket.create_connection((vm_lab.vm.addr, 80))
    """
    reason = vm_skip_reason()
    if reason:
        pytest.skip(reason)
    name = f"vmt-{secrets.token_hex(3)}"
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
            request.config.stash.setdefault(BOOT_TIMES, []).append(
                (lab.vm.name, lab.vm.boot_seconds, lab.vm.guest_uptime)
            )
            yield lab
    finally:
        netns.remove(name)


def pytest_terminal_summary(terminalreporter: TerminalReporter, config: pytest.Config) -> None:
    for name, wall, uptime in config.stash.get(BOOT_TIMES, []):
        terminalreporter.write_line(
            f"vm boot '{name}': {wall:.2f} s from qemu start to ready (guest uptime {uptime:.2f} s), TCG"
        )
