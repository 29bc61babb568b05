"""The LB VM's boot image: the real VM's busybox root (image.py) plus Python and l4lab's balancer.

The kernel unpacks two cpio archives one after the other (they are concatenated):

- the base, cached under build/vm/ and keyed by its inputs' versions (kernel, Debian packages, the
  venv's packages, the init script): busybox, iproute2's ip and bridge, ethtool and tcpdump; this machine's
  Python (its interpreter, standard library without tests and tools, lib-dynload and the libraries
  those link); numpy, pyroute2 and prometheus_client from the checkout's venv (what `balancer` imports);
  libbpf and the libraries it links; the modules for virtio-net, bonding, 802.1Q, veth and the bridge;
  lb_init.sh as /init;
- the checkout's own part, `balancer/` and `build/{bpf,lib}` (balancer.o, pass.o) under /opt/l4lab, made again whenever
  they change (a second or so): the VM runs the code of the tree that boots it, as the Vagrant LB
  runs the synced folder's (lab/remote/provision/lb.sh), with the same `lbctl`.

Example::

    image = build_lb_image()
    print(image.initrd)   # build/vm/lb-<kernel>-<base key>-<tree key>.cpio
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from lab.remote.vm_init import image as vmimage

LB_MODULES = ("virtio_pci", "virtio_net", "bonding", "8021q", "veth", "bridge")
TCPDUMP = Path("/usr/bin/tcpdump")
BRIDGE = Path("/usr/sbin/bridge")  # iproute2's: the switch's VLANs
LAYOUT_VERSION = "1"  # with this file's and image.py's own text in the base's key
# What `balancer` imports besides the standard library (every module of it imported, sys.modules read).
SITE_PACKAGES = ("numpy", "numpy.libs", "pyroute2", "prometheus_client")
# Parts of a package or of the standard library the balancer never runs: tests, tools, compilers (pyroute2
# imports sqlite3).
SKIPPED = ("test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "distutils",
           "unittest", "f2py", "_pyinstaller", "site-packages", "dist-packages", "config-3.*", "*.pyi",
           "*.a", "*.h", "_simd.*", "_dbm.*", "_gdbm.*", "_tkinter.*", "_curses*", "readline.*",
           "_ssl.*", "_hashlib.*")
PACKAGES = ("busybox-static", "iproute2", "ethtool", "tcpdump", "libbpf1", "libpython3.11-stdlib", "python3.11")
SITE = Path("/opt/l4lab/site")  # where the venv's packages go in the image (PYTHONPATH, lb_init.sh)
TREE = Path("/opt/l4lab")       # where the checkout's balancer/ and build/ go


def _venv_site() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _libbpf() -> Path:
    for d in (Path("/usr/lib/x86_64-linux-gnu"), Path("/lib/x86_64-linux-gnu"), Path("/usr/lib64"), Path("/usr/lib")):
        if (d / "libbpf.so.1").exists():
            return (d / "libbpf.so.1").resolve()
    raise vmimage.ImageError(f"libbpf.so.1 is not installed on this machine; run `{vmimage.SETUP_HINT}`")


def missing() -> list[str]:
    """Host files the LB image needs that are not there (empty when it can be built)."""
    out = vmimage.missing_tools() + ([str(TCPDUMP)] if not TCPDUMP.is_file() else [])
    out += [f"{_venv_site()}/{p}" for p in SITE_PACKAGES if not (_venv_site() / p).is_dir()]
    return out


def _digest(parts: list[str]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def _base_key(kernel: vmimage.KernelInfo) -> str:
    versions = [vmimage._package_version(p) for p in PACKAGES]
    dist = sorted(p.name for p in _venv_site().glob("*.dist-info") if p.name.split("-")[0] in
                  {"numpy", "pyroute2", "prometheus_client"})
    return _digest([LAYOUT_VERSION, kernel.version, str(kernel.vmlinuz.stat().st_mtime_ns), sys.version,
                    *versions, *dist, Path(__file__).read_text(), (vmimage.HERE / "image.py").read_text(),
                    (vmimage.HERE / "lb_init.sh").read_text(), (vmimage.HERE / "control.sh").read_text()])


def _tree_files() -> list[Path]:
    """The checkout's files the VM runs: the balancer package, the built objects (the balancer, and the
    XDP_PASS the switch's ends run) and the native library."""
    repo = vmimage.REPO_ROOT
    files = sorted((repo / "balancer").rglob("*.py")) + sorted((repo / "balancer").rglob("*.toml"))
    files += [repo / "build" / "bpf" / name for name in ("balancer.o", "pass.o")]
    files += sorted((repo / "build" / "lib").glob("*.so"))
    return files


def _tree_key() -> str:
    h = hashlib.sha256()
    for f in _tree_files():
        h.update(str(f.relative_to(vmimage.REPO_ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _copytree(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(*SKIPPED), symlinks=True, dirs_exist_ok=True)


def _assemble_base(root: Path, kernel: vmimage.KernelInfo) -> None:
    python = Path(sys.executable).resolve()
    binaries = {vmimage.IPROUTE2_IP: Path("/usr/sbin/ip"), BRIDGE: Path("/usr/sbin/bridge"),
                vmimage.ETHTOOL: Path("/bin/ethtool"), TCPDUMP: Path("/usr/bin/tcpdump"),
                python: Path("/usr/bin/python3"), _libbpf(): _libbpf()}
    vmimage.populate(root, kernel, binaries, LB_MODULES, vmimage.HERE / "lb_init.sh")
    stdlib = _stdlib()
    _copytree(stdlib, root / stdlib.relative_to("/"))
    site = root / SITE.relative_to("/")
    for name in SITE_PACKAGES:
        _copytree(_venv_site() / name, site / name)
    for ext in sorted([*(root / stdlib.relative_to("/") / "lib-dynload").glob("*.so"), *site.rglob("*.so")]):
        for lib in vmimage.shared_libraries(ext):
            if not lib.is_relative_to(root):  # numpy.libs come along as files of the tree
                vmimage._copy(lib, root)
    _compile(site)


def _compile(path: Path) -> None:
    """Byte-compile what the image imports: TCG runs the compiler slowly, and the root is read-only to it."""
    done = subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(path)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise vmimage.ImageError(f"cannot byte-compile {path} for the LB VM: {done.stdout[-500:]}{done.stderr[-500:]}")


def _assemble_tree(root: Path) -> None:
    for f in _tree_files():
        dest = root / TREE.relative_to("/") / f.relative_to(vmimage.REPO_ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest)
    _compile(root / TREE.relative_to("/") / "balancer")


def _archive(cache_dir: Path, name: str, assemble: object) -> Path:
    """cache_dir/name, built by assemble(root) into a staging root and packed, unless it exists."""
    out = cache_dir / name
    if out.is_file():
        return out
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stage-lb-", dir=cache_dir) as stage:
        root = Path(stage) / "root"
        root.mkdir()
        assemble(root)  # type: ignore[operator]
        partial = Path(stage) / "out.cpio"
        vmimage._pack(root, partial)
        os.replace(partial, out)  # atomic: a concurrent builder sees no file or a whole one
    return out


def build_lb_image(cache_dir: Path = vmimage.DEFAULT_CACHE_DIR) -> vmimage.BootImage:
    """The LB VM's kernel and initramfs (base + tree, concatenated), built into cache_dir unless there."""
    lacking = missing()
    if lacking:
        raise vmimage.ImageError(f"the LB VM needs {', '.join(lacking)} on this machine; run `{vmimage.SETUP_HINT}` "
                                 "and `make deps` (the venv)")
    kernel = vmimage.find_kernel()
    base_key, tree_key = _base_key(kernel), _tree_key()
    initrd = cache_dir / f"lb-{kernel.version}-{base_key}-{tree_key}.cpio"
    if initrd.is_file():
        return vmimage.BootImage(kernel=kernel.vmlinuz, initrd=initrd, kernel_version=kernel.version)
    cache_dir.mkdir(parents=True, exist_ok=True)
    # One builder at a time (make test's two streams both boot LB VMs): the steps below delete the
    # tree archive and older images, which a second builder might be reading. The other waits, then
    # finds the image.
    with open(cache_dir / ".lb-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not initrd.is_file():
            _build_lb_image(cache_dir, kernel, initrd, base_key, tree_key)
    return vmimage.BootImage(kernel=kernel.vmlinuz, initrd=initrd, kernel_version=kernel.version)


def _build_lb_image(cache_dir: Path, kernel: vmimage.KernelInfo, initrd: Path, base_key: str, tree_key: str) -> None:
    """Base and tree archives, concatenated into `initrd`; older images removed (the caller holds the lock)."""
    base = _archive(cache_dir, f"lb-base-{kernel.version}-{base_key}.cpio", lambda r: _assemble_base(r, kernel))
    tree = _archive(cache_dir, f"lb-tree-{tree_key}.cpio", _assemble_tree)
    with tempfile.NamedTemporaryFile(dir=cache_dir, prefix=".lb-", delete=False) as out:
        for part in (base, tree):
            with part.open("rb") as f:
                shutil.copyfileobj(f, out)
    os.replace(out.name, initrd)
    tree.unlink()
    for old in cache_dir.glob("lb-*.cpio"):  # older images and bases (a running qemu has read its initrd)
        if old not in (initrd, base):
            old.unlink(missing_ok=True)
