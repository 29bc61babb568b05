"""VmReal's life cycle: a VM that cannot become ready raises a VmError naming the step, and leaves nothing.

Nothing left means: no qemu process for the VM's tap, no tap in the namespace, no run directory.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyroute2 import IPRoute, netns

from lab import procs
from lab.harness import unique_name
from lab.harness.vmlab import vm_skip_reason
from lab.nsexec import entered
from lab.remote.vm import VmError, VmReal


@pytest.fixture
def vm_netns() -> Iterator[str]:
    """An empty namespace `vmt-<random>`, removed after the test.

    Name: vm_netns
    Scope: function
    Depends: root, qemu, the cloud kernel unpacked in build/vm/kernel/ (skips otherwise)

        def test_x(vm_netns):
            with VmReal("r", vm_netns, "192.0.2.10", 24, "192.0.2.1", []) as vm: ...
    """
    reason = vm_skip_reason()
    if reason:
        pytest.skip(reason)
    name = unique_name("vmt")
    netns.create(name)
    try:
        yield name
    finally:
        netns.remove(name)


def qemu_pids_for(tap: str) -> list[int]:
    """Processes whose command line opens the tap `tap` (qemu started for it)."""
    return [p.pid for p in procs.walk() if any(f"ifname={tap},".encode() in a for a in p.argv)]


def assert_nothing_left(vm: VmReal, ns: str) -> None:
    assert qemu_pids_for(vm.tap) == []
    with entered(ns), IPRoute() as ipr:
        assert ipr.link_lookup(ifname=vm.tap) == []
    assert vm.run_dir is not None and not vm.run_dir.exists()


def test_setup_failure_in_the_vm_names_the_step_and_cleans_up(vm_netns: str) -> None:
    tap = unique_name("vmt", 4, sep="")
    # The gateway is outside eth0's subnet, so the VM's `ip route add default via` fails.
    vm = VmReal("bad-gw", vm_netns, "192.0.2.10", 24, "198.51.100.1", ["203.0.113.10"],
                tap=tap, tap_address=False)
    with pytest.raises(VmError) as caught:
        vm.start()
    assert caught.value.step == "init"
    assert "step=route" in str(caught.value) and "198.51.100.1" in str(caught.value)
    assert_nothing_left(vm, vm_netns)


def test_boot_deadline_raises_and_cleans_up(vm_netns: str) -> None:
    vm = VmReal("slow", vm_netns, "192.0.2.10", 24, "192.0.2.1", ["203.0.113.10"],
                tap=unique_name("vmt", 4, sep=""), boot_timeout=0.3)
    with pytest.raises(VmError, match=r"not ready after 0.3 s .*raise boot_timeout") as caught:
        vm.start()
    assert caught.value.step == "boot"
    assert_nothing_left(vm, vm_netns)


def test_missing_namespace_is_named() -> None:
    reason = vm_skip_reason()
    if reason:
        pytest.skip(reason)
    missing = unique_name("vmt-gone")
    vm = VmReal("orphan", missing, "192.0.2.10", 24, "192.0.2.1", [])
    with pytest.raises(VmError, match=f"network namespace '{missing}' does not exist"):
        vm.start()

