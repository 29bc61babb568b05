"""The real-server VM's boot image: Debian's cloud kernel plus an initramfs assembled from host packages.

The kernel and its modules come from build/vm/kernel/VERSION/, where `scripts/setup.sh --extra vm`
unpacks the downloaded package (nothing is installed into the host's /boot or /lib/modules).

The initramfs holds static busybox with its applets, iproute2's `ip` as /usr/sbin/ip and ethtool
as /bin/ethtool with their ELF interpreter and shared libraries (busybox `ip` has no `fou`; init.sh
calls iproute2's by path),
the kernel modules for virtio-net, IPIP, FOU/GUE and the IPv6 tunnels in dependency order, the
UDP echo helper (`udp_echo.c`, built static here) and `init.sh` as /init. Images are cached
under ``build/vm/`` keyed by every input's version, so a new kernel, busybox, iproute2 or init
script rebuilds the image and nothing else does; older images are removed.

Example::

    image = build_image()
    print(image.kernel, image.initrd, image.kernel_version)
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lab.errors import LabError

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[2]
DEFAULT_CACHE_DIR = REPO_ROOT / "build" / "vm"
KERNEL_ROOT = DEFAULT_CACHE_DIR / "kernel"  # setup.sh unpacks linux-image-*-cloud-amd64 here
SETUP_HINT = "bash scripts/setup.sh --extra vm"

# Modules the VM loads (with their dependencies, resolved from modules.dep).
WANTED_MODULES = ("virtio_pci", "virtio_net", "ipip", "fou", "ip6_tunnel", "fou6", "sit")
# Bump when the layout of the image changes in a way the inputs' versions do not show.
LAYOUT_VERSION = "1"
BUSYBOX = Path("/usr/bin/busybox")
IPROUTE2_IP = Path("/usr/bin/ip")
ETHTOOL = Path("/usr/sbin/ethtool")  # channels, rxhash, RSS key and table, per-queue counters


class ImageError(LabError):
    """The VM boot image cannot be found or built; the message names the input and the fix."""


@dataclass(frozen=True)
class KernelInfo:
    """One installed Debian cloud kernel: its version, image and module tree."""

    version: str
    vmlinuz: Path
    modules: Path


@dataclass(frozen=True)
class BootImage:
    """A kernel and the initramfs built for it, ready for `qemu -kernel … -initrd …`."""

    kernel: Path
    initrd: Path
    kernel_version: str


def _version_key(version: str) -> list[int | str]:
    return [int(p) if p.isdigit() else p for p in re.split(r"[.-]", version)]


def find_kernel(kernel_root: Path | None = None) -> KernelInfo:
    """The newest Debian cloud kernel unpacked under `kernel_root` (``build/vm/kernel/VERSION/``,
    where `scripts/setup.sh --extra vm` puts the downloaded package) whose modules.dep exists.

    The host's /boot and /lib/modules are never read: the VM's kernel is not installed on the host.
    """
    root = kernel_root if kernel_root is not None else KERNEL_ROOT
    found: list[KernelInfo] = []
    for vmlinuz in root.glob("*/boot/vmlinuz-*-cloud-amd64"):
        version = vmlinuz.name.removeprefix("vmlinuz-")
        modules = vmlinuz.parent.parent / "lib" / "modules" / version
        if (modules / "modules.dep").is_file():
            found.append(KernelInfo(version, vmlinuz, modules))
    if not found:
        raise ImageError(
            f"no Debian cloud kernel for the VM: {root}/<version>/boot/vmlinuz-*-cloud-amd64 with "
            f"lib/modules/<version>/modules.dep is missing; run `{SETUP_HINT}` (it unpacks the "
            "kernel package there and installs nothing into /boot)"
        )
    return max(found, key=lambda k: _version_key(k.version))


def missing_tools() -> list[str]:
    """Host programs the VM needs that are not installed (empty when the VM can run)."""
    wanted = ["qemu-system-x86_64", "cpio", "gcc", "nsenter"]
    missing = [t for t in wanted if shutil.which(t) is None]
    missing += [str(p) for p in (BUSYBOX, IPROUTE2_IP, ETHTOOL) if not p.is_file()]
    return missing


def module_load_order(modules_dir: Path, wanted: tuple[str, ...] = WANTED_MODULES) -> list[str]:
    """Paths (relative to `modules_dir`) of `wanted` and their dependencies, dependencies first.

    Modules built into the kernel (listed in modules.builtin) need no loading and are skipped.
    """
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (modules_dir / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
        by_name[_module_name(path)] = path
    builtin = {
        _module_name(p) for p in (modules_dir / "modules.builtin").read_text().split() if p
    }
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        for dep in deps.get(path, []):
            visit(dep)
        order.append(path)

    for name in wanted:
        if name in builtin:
            continue
        if name not in by_name:
            raise ImageError(
                f"kernel module '{name}' is neither built in nor in {modules_dir}/modules.dep; "
                f"the VM needs a kernel with it (unpack the cloud kernel package again: `{SETUP_HINT}`)"
            )
        visit(by_name[name])
    return order


def _module_name(path: str) -> str:
    base = os.path.basename(path)
    return base.split(".ko", 1)[0].replace("-", "_")


def _package_version(package: str) -> str:
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True, check=False
    )
    if out.returncode != 0 or not out.stdout:
        raise ImageError(f"package '{package}' is not installed; run `{SETUP_HINT}`")
    return out.stdout


def shared_libraries(binary: Path) -> list[Path]:
    """The ELF interpreter and every library `ldd` names for `binary` (absolute paths)."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise ImageError(f"cannot list the libraries of {binary}: ldd said {out.stderr.strip()!r}")
    libs: list[Path] = []
    for line in out.stdout.splitlines():
        match = re.search(r"(/\S+)\s+\(0x", line)
        if match:
            libs.append(Path(match.group(1)))
    return libs


def _cache_key(kernel: KernelInfo) -> str:
    digest = hashlib.sha256()
    parts = [
        LAYOUT_VERSION,
        kernel.version,
        str(kernel.vmlinuz.stat().st_mtime_ns),
        _package_version("busybox-static"),
        _package_version("iproute2"),
        _package_version("ethtool"),
        ",".join(WANTED_MODULES),
        (HERE / "init.sh").read_text(),
        (HERE / "control.sh").read_text(),
        (HERE / "udp_echo.c").read_text(),
    ]
    for part in parts:
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def build_image(cache_dir: Path = DEFAULT_CACHE_DIR) -> BootImage:
    """The boot image for the newest cloud kernel, built into `cache_dir` unless already there."""
    missing = missing_tools()
    if missing:
        raise ImageError(f"the VM needs {', '.join(missing)} on this machine; run `{SETUP_HINT}`")
    kernel = find_kernel()
    initrd = cache_dir / f"initramfs-{kernel.version}-{_cache_key(kernel)}.cpio"
    if not initrd.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="stage-", dir=cache_dir) as stage:
            _assemble(Path(stage) / "root", kernel)
            partial = Path(stage) / "initramfs.cpio"
            _pack(Path(stage) / "root", partial)
            # Rename is atomic: a concurrent builder either sees no file or a whole one.
            os.replace(partial, initrd)
        _prune(cache_dir, keep=initrd)
    return BootImage(kernel=kernel.vmlinuz, initrd=initrd, kernel_version=kernel.version)


def _prune(cache_dir: Path, keep: Path) -> None:
    """Remove images built from older inputs (a running qemu has already read its initrd)."""
    for old in cache_dir.glob("initramfs-*.cpio"):
        if old != keep:
            old.unlink(missing_ok=True)


def _copy(src: Path, root: Path, dest: Path | None = None) -> None:
    """Copy the file `src` (following links) to `root`/`dest`, by default at its own path."""
    target = root / (dest or src).relative_to("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src.resolve(), target)


def populate(root: Path, kernel: KernelInfo, binaries: dict[Path, Path], modules: tuple[str, ...],
             init: Path) -> None:
    """What every VM's initramfs holds: busybox and its applets, `binaries` ({host file: path in the
    image}) with their libraries, `modules` with their dependencies (and their load order in
    /etc/l4lab/modules), `init` as /init, and control.sh beside it."""
    for d in ("bin", "dev", "proc", "sys", "etc/l4lab", "lib/modules", "tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    _copy(BUSYBOX, root, Path("/bin/busybox"))
    applets = subprocess.run(
        [str(BUSYBOX), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    for applet in applets:
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")
    for binary, dest in binaries.items():
        _copy(binary, root, dest)
        for lib in shared_libraries(binary):
            _copy(lib, root)
    order = module_load_order(kernel.modules, modules)
    for rel in order:
        _copy(kernel.modules / rel, root, Path("/lib/modules") / rel)
    (root / "etc/l4lab/modules").write_text("".join(f"{rel}\n" for rel in order))
    shutil.copy2(init, root / "init")
    shutil.copy2(HERE / "control.sh", root / "etc/l4lab/control.sh")
    (root / "init").chmod(0o755)


def _assemble(root: Path, kernel: KernelInfo) -> None:
    populate(root, kernel, {IPROUTE2_IP: Path("/usr/sbin/ip"), ETHTOOL: Path("/bin/ethtool")}, WANTED_MODULES,
             HERE / "init.sh")
    echo = root / "bin" / "udp_echo"
    gcc = subprocess.run(
        ["gcc", "-static", "-O2", "-Wall", "-o", str(echo), str(HERE / "udp_echo.c")],
        capture_output=True, text=True, check=False,
    )
    if gcc.returncode != 0:
        raise ImageError(
            f"cannot build udp_echo for the VM: gcc said {gcc.stderr.strip()!r}; "
            "static linking needs libc6-dev"
        )


def _pack(root: Path, out: Path) -> None:
    """Write `root` as an uncompressed newc cpio (TCG unpacks it faster than a compressed one)."""
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    with out.open("wb") as sink:
        proc = subprocess.run(
            ["cpio", "--quiet", "-o", "-H", "newc", "-R", "0:0"],
            input="\n".join(names).encode(), stdout=sink, stderr=subprocess.PIPE,
            cwd=root, check=False,
        )
    if proc.returncode != 0:
        raise ImageError(f"cpio failed packing {root}: {proc.stderr.decode().strip()}")
