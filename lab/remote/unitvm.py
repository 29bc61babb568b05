"""unitvm.py: a qemu VM booting systemd, where the lbctl unit runs as a user installs it (suites/vm/test_unit.py).

The root file system is the local Vagrant box's mmdebstrap of Debian 12 (lab/remote/vagrantbox.py,
stage 1: systemd, python3, libbpf1, iproute2, curl and Debian's cloud kernel), copied once into an
ext4 image cached under build/unit-vm/KEY/ with one addition, l4lab-control.service: a shell loop on
the second serial port that runs a test's commands (lab/remote/vm.py guest_run) and says L4LAB-READY
on the console once it listens. The VM boots that image with its writes going to a throwaway overlay
(qemu's snapshot mode), and a second disk holding what the VM, which has no network but the lab's,
cannot download: the wheel of this checkout (`pip wheel .`, the BPF objects inside), the wheels of its
dependencies (downloaded once, checked against the hashes of requirements.lock) and of pip (Debian's
python3-pip-whl), packaging/, and the files the test adds.

    image = root_image()                                   # minutes the first time, then cached
    data = data_disk(tmp / "data", {"lb.toml": text})      # seconds
    with UnitVm("unit", netns="lab-router", addr="198.51.100.42", prefix=29,
                gateway="198.51.100.41", image=image, data=data) as vm:
        vm.run(["systemctl", "start", "lbctl"])
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from lab.errors import LabError
from lab.remote import vagrantbox
from lab.remote.vm import READY_MARK, VmReal
from lab.remote.vm_init.image import BootImage

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "build" / "unit-vm"
ROOT_GIB = 4
PIP_WHEELS = Path("/usr/share/python-wheels")  # Debian's python3-pip-whl, what venv's ensurepip installs
DEPENDENCIES = ("numpy", "pyroute2", "prometheus-client")  # pyproject.toml's [project] dependencies
MOUNT = "/mnt/l4lab"
# Under TCG on two shared CPUs systemd takes tens of seconds to reach multi-user.target.
BOOT_TIMEOUT_S = 400.0

CONTROL = f"""#!/bin/bash
# l4lab-control: the test's command channel on ttyS1 (lab/remote/unitvm.py), one request line
# "ID COMMAND LINE" at a time, answered "L4LAB-BEGIN ID", the output, "L4LAB-DONE ID STATUS".
exec 3<>/dev/ttyS1
stty -F /dev/ttyS1 raw -echo
printf '\\n%s name=unit uptime=%s\\n' {READY_MARK} "$(cut -d' ' -f1 /proc/uptime)" >/dev/ttyS0
while IFS= read -r req <&3; do
	id=${{req%% *}}
	{{ echo "L4LAB-BEGIN $id"; bash -c "${{req#* }}" </dev/null 2>&1; echo "L4LAB-DONE $id $?"; }} >&3
done
"""
UNIT = f"""[Unit]
Description=l4lab test control channel on ttyS1
After=local-fs.target
RequiresMountsFor={MOUNT}

[Service]
ExecStart=/usr/local/sbin/l4lab-control
Restart=always

[Install]
WantedBy=multi-user.target
"""
FSTAB = f"/dev/vda\t/\text4\tdefaults,noatime\t0\t1\n/dev/vdb\t{MOUNT}\text4\tro,nofail\t0\t2\n"


@dataclass(frozen=True)
class RootImage:
    """The cached root file system image and the kernel and initramfs it boots with."""

    disk: Path
    boot: BootImage


def _key(base: Path) -> str:
    h = hashlib.sha256()
    for part in (str(base), CONTROL, UNIT, FSTAB, str(ROOT_GIB), "no getty"):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def root_image(mirror: str = vagrantbox.MIRROR) -> RootImage:
    """The root image, built (the bootstrap included, when not cached) under build/unit-vm/KEY/."""
    base = vagrantbox._bootstrap(mirror)  # noqa: SLF001 - the box's stage 1, cached by vagrantbox
    work = CACHE / _key(base)
    disk = work / "root.img"
    if not disk.exists():
        _build_root(base, work)
    kernel = sorted(work.glob("vmlinuz-*"))
    if not kernel:
        raise LabError(f"no kernel in {work}: remove the folder and build again")
    version = kernel[-1].name.removeprefix("vmlinuz-")
    return RootImage(disk, BootImage(kernel[-1], work / f"initrd.img-{version}", version))


def _build_root(base: Path, work: Path) -> None:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    root = work / "root"
    _run(["cp", "-a", "--reflink=auto", str(base), str(root)], "copy the bootstrapped root")
    (root / "usr/local/sbin/l4lab-control").write_text(CONTROL)
    (root / "usr/local/sbin/l4lab-control").chmod(0o755)
    (root / "etc/systemd/system/l4lab-control.service").write_text(UNIT)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / "l4lab-control.service").symlink_to("/etc/systemd/system/l4lab-control.service")
    for getty in ("serial-getty@ttyS0.service", "getty@tty1.service"):  # no logins: the console says READY
        (root / "etc/systemd/system" / getty).symlink_to("/dev/null")
    (root / "etc/fstab").write_text(FSTAB)
    (root / "etc/hostname").write_text("l4lab-unit\n")
    (root / "etc/machine-id").write_text("")  # made at boot
    (root / MOUNT.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for kind in ("vmlinuz-*", "initrd.img-*"):
        for f in (root / "boot").glob(kind):
            shutil.copy(f, work / f.name)
    partial = work / "root.img.partial"
    _run(["mkfs.ext4", "-q", "-F", "-L", "l4lab-unit", "-d", str(root), str(partial), f"{ROOT_GIB}G"],
         "make the unit VM's root file system")
    shutil.rmtree(root)
    partial.rename(work / "root.img")


def dependency_wheels() -> Path:
    """The wheels of the package's dependencies, as requirements.lock pins and hashes them (cached)."""
    lock = (REPO / "requirements.lock").read_text()
    blocks = [b for b in re.split(r"\n(?=\S)", lock) if b.split("==")[0].strip() in DEPENDENCIES]
    if len(blocks) != len(DEPENDENCIES):
        raise LabError(f"requirements.lock pins {len(blocks)} of {', '.join(DEPENDENCIES)}: run make lock")
    text = "\n".join(blocks) + "\n"
    folder = CACHE / f"wheels-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    if not (folder / "done").exists():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "requirements.txt").write_text(text)
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--require-hashes",
              "-r", str(folder / "requirements.txt"), "-d", str(folder)], "download the dependencies' wheels")
        (folder / "done").touch()
    return folder


def data_disk(folder: Path, files: dict[str, str]) -> Path:
    """An ext4 image of folder, filled with wheels/ (this checkout's and its dependencies'), pip's wheel,
    packaging/ and `files` (name: text); the VM mounts it read-only at MOUNT."""
    wheels = folder / "wheels"
    wheels.mkdir(parents=True)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
          str(REPO)], "build the wheel of this checkout (pip wheel .)")
    for whl in dependency_wheels().glob("*.whl"):
        shutil.copy(whl, wheels / whl.name)
    pips = sorted(PIP_WHEELS.glob("pip-*.whl"))
    if not pips:
        raise LabError(f"no pip wheel in {PIP_WHEELS}: apt-get install python3-pip-whl")
    shutil.copy(pips[-1], folder / "pip.whl")
    shutil.copytree(REPO / "packaging", folder / "packaging")
    for name, text in files.items():
        (folder / name).write_text(text)
    image = folder.with_suffix(".img")
    size_mib = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) // 2**20 + 64
    _run(["mkfs.ext4", "-q", "-F", "-L", "l4lab-data", "-d", str(folder), str(image), f"{size_mib}M"],
         "make the unit VM's data disk")
    return image


class UnitVm(VmReal):
    """A VmReal that boots the systemd root image (snapshot mode) with the data disk beside it."""

    def __init__(self, name: str, netns: str, addr: str, prefix: int, gateway: str, *, image: RootImage,
                 data: Path, memory_mb: int = 768, keep_logs: bool = False) -> None:
        super().__init__(name, netns, addr, prefix, gateway, vips=[], image=image.boot, memory_mb=memory_mb,
                         boot_timeout=BOOT_TIMEOUT_S, keep_logs=keep_logs, cache_dir=CACHE)
        self.root_disk = image.disk
        self.data_disk = data

    def kernel_cmdline(self) -> str:
        return vagrantbox.CMDLINE

    def qemu_command(self, image: BootImage) -> list[str]:
        argv = super().qemu_command(image)
        # Native XDP on virtio-net needs the host to leave receive offloads (GRO_HW, checksums) off.
        nic = argv.index("-device", argv.index("-netdev")) + 1
        argv[nic] += ",guest_csum=off,guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off"
        return [*argv,
                "-drive", f"file={self.root_disk},format=raw,if=virtio,snapshot=on",
                "-drive", f"file={self.data_disk},format=raw,if=virtio,readonly=on"]

    def sh(self, command: str, timeout: float = 120.0, check: bool = True) -> str:
        """Run a shell command line in the guest; its output (stderr folded in). LabError if it fails."""
        done = self.run(["sh", "-c", command], timeout=timeout)
        if check and done.returncode != 0:
            raise LabError(f"`{command}` in the unit VM exited {done.returncode}: {done.stdout.strip()[-1500:]}",
                           command=command, stderr=done.stdout)
        return str(done.stdout)


def _run(argv: list[str], what: str, timeout: float = 1800) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise LabError(f"cannot {what}: {' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-1500:]}",
                       step=what, command=" ".join(argv), stderr=done.stderr)
