"""The VM kernel comes from build/vm/kernel/VERSION/ (the unpacked package), never the host's /boot."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.remote.vm_init.image import KERNEL_ROOT, SETUP_HINT, ImageError, find_kernel, module_load_order


def _unpacked(root: Path, version: str, *, depmod: bool = True) -> Path:
    """The layout `dpkg-deb -x` + `depmod -b` leaves for linux-image-VERSION."""
    tree = root / version
    (tree / "boot").mkdir(parents=True)
    (tree / "boot" / f"vmlinuz-{version}").write_bytes(b"kernel")
    modules = tree / "lib" / "modules" / version
    (modules / "kernel" / "net").mkdir(parents=True)
    (modules / "modules.builtin").write_text("kernel/net/ipv4/udp_tunnel.ko\n")
    if depmod:
        (modules / "modules.dep").write_text("kernel/net/ipip.ko: kernel/net/tunnel4.ko\nkernel/net/tunnel4.ko:\n")
    return tree


def test_the_newest_unpacked_kernel_with_modules_dep_is_chosen(tmp_path: Path) -> None:
    _unpacked(tmp_path, "6.1.0-9-cloud-amd64")
    newest = _unpacked(tmp_path, "6.1.0-57-cloud-amd64")
    _unpacked(tmp_path, "6.1.0-60-cloud-amd64", depmod=False)  # not depmod'ed: not usable
    kernel = find_kernel(tmp_path)
    assert kernel.version == "6.1.0-57-cloud-amd64"
    assert kernel.vmlinuz == newest / "boot" / "vmlinuz-6.1.0-57-cloud-amd64"
    assert kernel.modules == newest / "lib" / "modules" / "6.1.0-57-cloud-amd64"
    assert module_load_order(kernel.modules, ("ipip",)) == ["kernel/net/tunnel4.ko", "kernel/net/ipip.ko"]


def test_no_unpacked_kernel_names_the_place_and_the_setup_command(tmp_path: Path) -> None:
    with pytest.raises(ImageError) as err:
        find_kernel(tmp_path)
    assert str(err.value) == (
        f"no Debian cloud kernel for the VM: {tmp_path}/<version>/boot/vmlinuz-*-cloud-amd64 with "
        f"lib/modules/<version>/modules.dep is missing; run `{SETUP_HINT}` (it unpacks the kernel package "
        "there and installs nothing into /boot)")


def test_the_default_kernel_is_the_unpacked_one() -> None:
    try:
        kernel = find_kernel()
    except ImageError as exc:
        pytest.skip(str(exc))
    assert kernel.vmlinuz.is_relative_to(KERNEL_ROOT) and kernel.modules.is_relative_to(KERNEL_ROOT)
    assert (kernel.modules / "modules.dep").stat().st_size > 0
