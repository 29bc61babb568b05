"""The local Vagrant box: Debian 12 for libvirt, built from Debian's packages, cached under build/ and added to Vagrant.

`l4lab vagrant-box` makes the box that `L4LAB_BOX=local vagrant up` boots, for machines that cannot
reach Vagrant Cloud. The steps, cached under build/vagrant-box/ (bootstrap-K1 for step 1, KEY for the box; each key
hashes every input of what it caches):

1. mmdebstrap (minbase) of Debian 12 with Debian's cloud kernel, sshd, sudo, rsync (the synced
   folder), and what provisioning needs so that no machine runs apt: iproute2, ethtool, tcpdump;
   python3 with Debian's numpy and pyroute2 (lab/remote/provision/box.sh makes /opt/l4lab/venv from
   them), libbpf1 for the controller, make. No compiler: the host's build/bpf and build/lib reach
   the machines through the synced folder, and the LB's `make bpf` finds them up to date (the
   compiler and its libraries were two thirds of the box);
2. lab/remote/provision/box.sh inside that root: the `vagrant` user with Vagrant's insecure public key and
   passwordless sudo, DHCP on the management NIC only, no documentation;
3. the root becomes an ext4 file system image (`mkfs.ext4 -d`, no loop device, no mount) and then
   box.img (qcow2), packed with metadata.json and a Vagrantfile into a libvirt box;
4. `vagrant box add` under the name BOX_NAME, after removing an older build of it (and its cached
   libvirt volume).

The box boots systemd, or with `init=/usr/local/sbin/l4lab-init` on the kernel command line (`l4lab
vagrant-plan --box-init light`, L4LAB_BOX_INIT=light) box.sh's light init: file systems, the sysctl.d
defaults, DHCP on the management NIC and sshd, nothing else; same root, kernel and provisioning, and
a machine reaches ssh in about half the time under TCG (65 s against 132 s, one machine at load 14).
The smoke (suites/lab/test_vagrant.py) boots it; `make test-vagrant` boots systemd.

The disk has no boot loader: libvirt boots the box's kernel and initrd directly (qemu -kernel).
They are installed beside libvirt's own boot files (/var/lib/libvirt/boot/l4lab-vg-KEY/, which
qemu's unprivileged user can read) and the box's Vagrantfile names them.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path

from lab.errors import LabError, UsageError

REPO = Path(__file__).resolve().parent.parent.parent
BOX_NAME = "l4lab/debian12"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
DISK_GIB = 6
BUILDER_VERSION = 3  # bump when the steps below change what they produce
PACKAGES = (
    "linux-image-cloud-amd64", "initramfs-tools", "systemd-sysv", "dbus", "udev", "kmod",
    "openssh-server", "sudo", "rsync", "netbase", "iproute2", "ethtool", "tcpdump", "iputils-ping",
    "procps", "curl", "python3", "python3-numpy", "python3-pyroute2", "libbpf1", "make",
)
# no_timer_check: under TCG on loaded CPUs the kernel's early check that the timer interrupt reaches the
# IO-APIC fails now and then ("IO-APIC + timer doesn't work!", a panic 0.1 s into the boot: one of six
# machines of `make test-vagrant` died so); the check proves nothing about a virtual machine's timer.
CMDLINE = "root=/dev/vda rw console=ttyS0 net.ifnames=0 biosdevname=0 no_timer_check quiet"
# The light init (box.sh writes it): file systems, DHCP on the management NIC and sshd, no systemd; a
# machine is reachable in about half the time under TCG. `l4lab vagrant-plan --box-init light` boots it.
LIGHT_INIT = "/usr/local/sbin/l4lab-init"
INITS = ("systemd", "light")
BOOT_ROOT = Path("/var/lib/libvirt/boot")
BOX_SCRIPT = REPO / "lab" / "remote" / "provision" / "box.sh"
TOOLS = {"mmdebstrap": "mmdebstrap", "mkfs.ext4": "e2fsprogs", "qemu-img": "qemu-utils", "vagrant": "vagrant",
         "virsh": "libvirt-clients"}


def cmdline(init: str = "systemd") -> str:
    """The kernel command line of the box's machines booting `init` (one of INITS)."""
    if init not in INITS:
        raise UsageError(f"unknown box init '{init}' (known: {', '.join(INITS)})")
    return CMDLINE if init == "systemd" else f"{CMDLINE} init={LIGHT_INIT}"


def insecure_key() -> Path:
    """Vagrant's well-known insecure public key, as the vagrant package ships it."""
    done = subprocess.run(["dpkg", "-L", "vagrant"], capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():
        if line.endswith("/keys/vagrant.pub"):
            return Path(line)
    raise LabError("Vagrant's insecure public key (keys/vagrant.pub of the vagrant package) was not found: "
                   "apt-get install vagrant")


def cache_key(mirror: str = MIRROR) -> str:
    """A digest of every input of the box: change one and the box is rebuilt."""
    h = hashlib.sha256()
    for part in (str(BUILDER_VERSION), SUITE, mirror, " ".join(PACKAGES), str(DISK_GIB), CMDLINE,
                 BOX_SCRIPT.read_text(), insecure_key().read_text()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def vagrant_home() -> Path:
    return Path(os.environ.get("VAGRANT_HOME", Path.home() / ".vagrant.d"))


def boot_dir(key: str) -> Path:
    return BOOT_ROOT / f"l4lab-vg-{key}"


def _box_dir() -> Path:
    return vagrant_home() / "boxes" / BOX_NAME.replace("/", "-VAGRANTSLASH-") / "0" / "libvirt"


def added_key() -> str | None:
    """The key of the box Vagrant holds under BOX_NAME, or None when it holds none (or a foreign one)."""
    try:
        return (_box_dir() / "l4lab-box.key").read_text().strip()
    except FileNotFoundError:
        return None


def _run(argv: Sequence[str], what: str, *, log: Path | None = None, timeout: float = 3600) -> None:
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    try:
        # Not from the repository: vagrant would make .vagrant/ beside its Vagrantfile.
        done = subprocess.run(list(argv), stdout=out, stderr=subprocess.PIPE, timeout=timeout, check=False,
                              cwd=vagrant_home().parent if vagrant_home().parent.is_dir() else "/")
    finally:
        if log:
            out.close()  # type: ignore[union-attr]
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()[-1500:]
        raise LabError(f"cannot {what}: '{' '.join(argv)}' exited {done.returncode}: {err}"
                       + (f" (log: {log})" if log else ""), step=what, command=" ".join(argv), stderr=err)


def _say(text: str) -> None:
    print(f"vagrant-box: {text}", file=sys.stderr, flush=True)


def check_tools() -> None:
    if os.geteuid() != 0:
        raise UsageError("l4lab vagrant-box must run as root (mmdebstrap, chroot, libvirt's boot folder)")
    missing = sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None})
    if missing:
        raise LabError(f"missing {', '.join(missing)}: run scripts/setup.sh --extra vagrant "
                       f"(apt-get install {' '.join(missing)})")


def _bootstrap_key(mirror: str) -> str:
    h = hashlib.sha256("\0".join((str(BUILDER_VERSION), SUITE, mirror, " ".join(PACKAGES))).encode())
    return h.hexdigest()[:16]


def _bootstrap(mirror: str) -> Path:
    """Stage 1: the bootstrapped root (cached on its own: box.sh changes do not download again)."""
    work = REPO / "build" / "vagrant-box" / f"bootstrap-{_bootstrap_key(mirror)}"
    root, done = work / "root", work / "root.done"
    if done.exists():
        return root
    if root.exists():
        shutil.rmtree(root)
    work.mkdir(parents=True, exist_ok=True)
    _say(f"mmdebstrap {SUITE} from {mirror} into {root} (a minute or two; log {work / 'build.log'})")
    # mmdebstrap, not debootstrap: apt's parallel fetch and one dpkg run, a third less time
    # (docs/architecture.md, "the box's root"). Its apt reads none of the host's apt.conf.d: a mirror
    # serving a dated snapshot, as the host's apt is told, would fail the Release file's Valid-Until.
    # In a private mount namespace, as stage 2: killed mid-run, its /proc, /sys and /dev mounts inside
    # the root go with it instead of staying under build/ (where a later rmtree would walk into them).
    _run(["unshare", "--mount", "--propagation", "private", "--fork",
          "mmdebstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", "--dpkgopt=force-unsafe-io",
          "--aptopt=Acquire::Check-Valid-Until \"false\"", SUITE, str(root), mirror],
         "mmdebstrap the box's root", log=work / "build.log")
    done.touch()
    return root


def _root(work: Path, mirror: str) -> Path:
    """Stage 2: a copy of the bootstrapped root configured by lab/remote/provision/box.sh."""
    base = _bootstrap(mirror)
    root = work / "root"
    if root.exists():
        shutil.rmtree(root)
    _run(["cp", "-a", "--reflink=auto", str(base), str(root)], "copy the bootstrapped root")
    shutil.copy(insecure_key(), root / "tmp" / "vagrant.pub")
    shutil.copy(BOX_SCRIPT, root / "tmp" / "box.sh")
    # A private mount namespace: /proc and /dev go away with the process, whatever happens.
    script = (f"mount -t proc proc {root}/proc && mount --bind /dev {root}/dev && "
              f"chroot {root} /bin/bash /tmp/box.sh --pubkey /tmp/vagrant.pub")
    _run(["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", script],
         "configure the box's root (lab/remote/provision/box.sh)", log=work / "build.log")
    for leftover in ("vagrant.pub", "box.sh"):
        (root / "tmp" / leftover).unlink()
    return root


def _kernel(root: Path) -> tuple[Path, Path]:
    kernels = sorted((root / "boot").glob("vmlinuz-*"))
    if not kernels:
        raise LabError(f"no kernel in {root}/boot: did linux-image-cloud-amd64 install?")
    version = kernels[-1].name.removeprefix("vmlinuz-")
    initrd = root / "boot" / f"initrd.img-{version}"
    if not initrd.exists():
        raise LabError(f"no initrd for kernel {version} in {root}/boot: did initramfs-tools install?")
    return kernels[-1], initrd


def box_vagrantfile(key: str) -> str:
    """The box's own Vagrantfile: libvirt boots the box's kernel directly (the disk has no boot loader)."""
    boot = boot_dir(key)
    return "\n".join([
        "# The l4lab local box (l4lab vagrant-box): the disk has no boot loader, libvirt boots this kernel.",
        'Vagrant.configure("2") do |config|',
        '  config.vm.provider "libvirt" do |lv|',
        f'    lv.kernel = "{boot}/vmlinuz"',
        f'    lv.initrd = "{boot}/initrd.img"',
        f'    lv.cmd_line = "{CMDLINE}"',
        "  end",
        "end",
        "",
    ])


def build(key: str, mirror: str = MIRROR) -> Path:
    """The box file of `key`, built unless build/vagrant-box/KEY/l4lab.box exists."""
    work = REPO / "build" / "vagrant-box" / key
    box = work / "l4lab.box"
    if box.exists():
        return box
    work.mkdir(parents=True, exist_ok=True)
    root = _root(work, mirror)
    raw, img = work / "disk.raw", work / "box.img"
    _say(f"making the {DISK_GIB} GiB ext4 disk and box.img")
    raw.unlink(missing_ok=True)
    _run(["mkfs.ext4", "-q", "-F", "-L", "l4lab-root", "-d", str(root), str(raw), f"{DISK_GIB}G"],
         "make the box's file system", log=work / "build.log")
    _run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(img)], "convert the disk to qcow2",
         log=work / "build.log")
    raw.unlink()
    kernel, initrd = _kernel(root)
    files = {
        "metadata.json": json.dumps({"provider": "libvirt", "format": "qcow2", "virtual_size": DISK_GIB}) + "\n",
        "Vagrantfile": box_vagrantfile(key),
        "l4lab-box.key": key + "\n",
    }
    for name, text in files.items():
        (work / name).write_text(text)
    shutil.copy(kernel, work / "vmlinuz")
    shutil.copy(initrd, work / "initrd.img")
    partial = work / "l4lab.box.partial"
    with tarfile.open(partial, "w") as tar:
        for name in ("box.img", *files, "vmlinuz", "initrd.img"):
            tar.add(work / name, arcname=name)
    img.unlink()
    partial.rename(box)
    shutil.rmtree(root)
    return box


def _volume_names() -> list[str]:
    """The libvirt volumes vagrant-libvirt made from this box (its cached copy of box.img)."""
    done = subprocess.run(["virsh", "-q", "vol-list", "default"], capture_output=True, text=True, check=False)
    prefix = BOX_NAME.replace("/", "-VAGRANTSLASH-") + "_vagrant_box_image_"
    return [line.split()[0] for line in done.stdout.splitlines() if line.split() and line.split()[0].startswith(prefix)]


def remove() -> None:
    """Remove the box from Vagrant, its cached libvirt volume and its boot files (never other boxes)."""
    if (vagrant_home() / "boxes" / BOX_NAME.replace("/", "-VAGRANTSLASH-")).exists():
        _run(["vagrant", "box", "remove", "--force", "--all", BOX_NAME], f"remove the box {BOX_NAME}")
    for vol in _volume_names():
        _run(["virsh", "-q", "vol-delete", "--pool", "default", vol], f"delete the libvirt volume {vol}")
    for old in BOOT_ROOT.glob("l4lab-vg-*"):
        shutil.rmtree(old)


def add(box: Path, key: str) -> None:
    """Replace any older build of the box in Vagrant and libvirt by `box`, and install its boot files."""
    remove()
    boot = boot_dir(key)
    boot.mkdir(mode=0o755, parents=True)
    for name in ("vmlinuz", "initrd.img"):
        shutil.copy(box.parent / name, boot / name)
        os.chmod(boot / name, 0o644)
    _run(["vagrant", "box", "add", "--force", "--name", BOX_NAME, str(box)], f"add the box {box}")


def ensure(mirror: str = MIRROR, rebuild: bool = False) -> str:
    """Build (when not cached) and add (when Vagrant holds another build) the box; return its key."""
    check_tools()
    key = cache_key(mirror)
    if rebuild:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(REPO / "build" / "vagrant-box" / key)
    start = time.monotonic()
    if not rebuild and added_key() == key and (boot_dir(key) / "vmlinuz").exists():
        # Vagrant holds the build of these very inputs (a second clone, or build/ cleaned): nothing to do.
        _say(f"{BOX_NAME} is box {key}, already added to Vagrant; use it with L4LAB_BOX=local vagrant up")
        return key
    box = build(key, mirror)
    if added_key() != key or not (boot_dir(key) / "vmlinuz").exists():
        _say(f"adding {box} to Vagrant as {BOX_NAME}")
        add(box, key)
    _say(f"{BOX_NAME} is box {key} ({box.stat().st_size / 2**20:.0f} MiB, {time.monotonic() - start:.0f} s); "
         f"use it with L4LAB_BOX=local vagrant up")
    return key


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="l4lab vagrant-box",
                                description="build the local Debian 12 libvirt box and add it to Vagrant")
    p.add_argument("--mirror", default=os.environ.get("L4LAB_BOX_MIRROR", MIRROR),
                   help=f"the Debian mirror mmdebstrap uses (default $L4LAB_BOX_MIRROR or {MIRROR})")
    p.add_argument("--rebuild", action="store_true", help="build again even when the cached box matches")
    p.add_argument("--remove", action="store_true", help="remove the box from Vagrant and libvirt instead")
    p.add_argument("--print-key", action="store_true", help="print the box's cache key and exit")
    args = p.parse_args(argv)
    if args.print_key:
        print(cache_key(args.mirror))
        return 0
    if args.remove:
        check_tools()
        remove()
        return 0
    ensure(args.mirror, args.rebuild)
    return 0
