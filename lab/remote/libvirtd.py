"""libvirt for the Vagrant lab: its daemons, run by l4lab where no init system does, and the driver it can use.

On a machine whose init system runs libvirtd (systemd), nothing here starts anything: `start`
finds the daemon answering and leaves it alone (and cannot hide a broken /dev/kvm from it: see
_without_broken_kvm). In CI and in containers nothing runs libvirtd, so
`start` runs `virtlogd` and `libvirtd` as daemons with their pid files under RUN_DIR, and `stop`
stops exactly those (never a daemon it did not start).

`driver()` answers what vagrant-libvirt's `driver` option must be: "kvm" only when a KVM guest
really boots here. On this kind of machine /dev/kvm opens, creates VMs and even runs a few
real-mode instructions, yet qemu's guests never print a line (with `-cpu host` qemu aborts on an
MSR write): so the probe boots a Linux kernel in qemu with KVM and wants its banner on the serial
console within PROBE_SECONDS. Otherwise "qemu" (TCG). The answer is kept in RUN_DIR (it does not
change until the machine reboots).

    python -m lab.remote.libvirtd start|stop|status|driver
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lab.errors import LabError
from lab.poll import poll
from lab.remote.vagrantbox import BOOT_ROOT

RUN_DIR = Path("/run/l4lab-vg")
URI = "qemu:///system"
DAEMONS = ("virtlogd", "libvirtd")  # in start order
PROBE_SECONDS = 5.0

QEMU = "qemu-system-x86_64"


def _kernels() -> list[Path]:
    """Linux kernels the probe can boot: the local box's, then the machine's own."""
    return [*sorted(BOOT_ROOT.glob("l4lab-vg-*/vmlinuz")), *sorted(Path("/boot").glob("vmlinuz-*"))]


def _kvm_probe(deadline: float = PROBE_SECONDS) -> str:
    """Boot a kernel in qemu with KVM until it prints its banner; return "" when it did, else why not."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "/dev/kvm is missing or not accessible"
    if shutil.which(QEMU) is None:
        return f"{QEMU} is missing"
    kernels = _kernels()
    if not kernels:
        return "no Linux kernel to probe KVM with (/boot/vmlinuz-* or the local box's)"
    argv = [QEMU, "-accel", "kvm", "-m", "128", "-display", "none", "-monitor", "none", "-no-reboot",
            "-serial", "stdio", "-kernel", str(kernels[0]), "-append", "console=ttyS0 earlyprintk=ttyS0 panic=-1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    seen = b""
    until = time.monotonic() + deadline
    try:
        while b"Linux version" not in seen:
            left = until - time.monotonic()
            if left <= 0:
                return (f"a KVM guest printed nothing within {deadline:g} s (/dev/kvm opens but runs no guest: "
                        "a nested host)")
            ready, _, _ = select.select([proc.stdout], [], [], left)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    tail = seen.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
                    return f"qemu with KVM exited {proc.wait()}: {tail[0]}"
                seen += chunk
        return ""
    finally:
        proc.kill()
        proc.wait()


def kvm_unusable() -> str:
    """Why KVM cannot run a guest here ("" when it can), probed once per boot in a child with a deadline."""
    cached = RUN_DIR / "kvm"
    if cached.exists():
        return cached.read_text().strip()
    why = _kvm_probe()
    try:
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        cached.write_text(why + "\n")
    except OSError:
        pass  # not root: probe again next time
    return why


def driver() -> str:
    """vagrant-libvirt's `driver`: "kvm" when KVM runs guests here, else "qemu" (TCG); $L4LAB_LIBVIRT_DRIVER wins."""
    forced = os.environ.get("L4LAB_LIBVIRT_DRIVER")
    if forced:
        return forced
    return "qemu" if kvm_unusable() else "kvm"


def answering() -> bool:
    """Whether a libvirtd answers on the system URI."""
    if shutil.which("virsh") is None:
        return False
    done = subprocess.run(["virsh", "-c", URI, "uri"], capture_output=True, text=True, timeout=30, check=False)
    return done.returncode == 0


def _pid(name: str) -> int | None:
    try:
        pid = int((RUN_DIR / f"{name}.pid").read_text().strip())
        os.kill(pid, 0)
        return pid
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None


@dataclass(frozen=True)
class Started:
    """What `start` did: which daemons it started (empty when a libvirtd was already answering)."""

    ours: tuple[str, ...]


def _without_broken_kvm(argv: list[str]) -> list[str]:
    """argv, run where /dev/kvm is an inaccessible empty file when KVM runs no guest here.

    libvirt 9.0 re-probes qemu's capabilities (a qemu run, seconds under load) on every API call
    when its probe could enable KVM (as root, /dev/kvm opens) but /dev/kvm is not accessible to the
    qemu user (measured here: "KVM was enabled when probing ..., but it is not available now" on
    every define and start). In a private mount namespace the daemon sees no usable KVM at all, so
    its cached capabilities stay valid. libvirt cannot carry that file mount into the mount
    namespace it makes per domain ("Unable to move ... mount to /dev/kvm"), so the same namespace
    shows the daemon a qemu.conf that adds `namespaces = []` to the system's."""
    if not os.path.exists("/dev/kvm") or not kvm_unusable():
        return argv
    hidden = RUN_DIR / "kvm-hidden"
    hidden.touch(mode=0o600)
    system_conf = Path("/etc/libvirt/qemu.conf")
    conf = RUN_DIR / "qemu.conf"
    conf.write_text((system_conf.read_text() if system_conf.exists() else "")
                    + "\n# l4lab (lab/remote/libvirtd.py): /dev/kvm is hidden from this daemon; no per-domain /dev\n"
                    + "namespaces = [ ]\n")
    script = (f'mount --bind "{hidden}" /dev/kvm && mount --bind "{conf}" "{system_conf}" && exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", *argv]


def start(deadline: float = 60.0) -> Started:
    """Make libvirtd answer on qemu:///system, starting virtlogd and libvirtd when nothing else runs them."""
    if answering():
        return Started(tuple(d for d in DAEMONS if _pid(d) is not None))
    for binary in DAEMONS:
        if shutil.which(binary) is None:
            raise LabError(f"{binary} not found: apt-get install libvirt-daemon-system "
                           "(scripts/setup.sh --extra vagrant)")
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    ours = []
    for name in DAEMONS:
        if _pid(name) is None:
            argv = [name, "--daemon", "--pid-file", str(RUN_DIR / f"{name}.pid")]
            if name == "libvirtd":
                argv = _without_broken_kvm(argv)
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
            if done.returncode != 0:
                raise LabError(f"cannot start {name}: {done.stderr.strip()}", command=name, stderr=done.stderr)
        ours.append(name)
    if not poll(deadline, answering, f"libvirtd answering on {URI}", check=False, interval_s=0.5):
        raise LabError(f"libvirtd started but does not answer on {URI} within {deadline:g} s")
    return Started(tuple(ours))


def running_domains() -> list[str]:
    """The libvirt domains running now (any lab's: the daemons serve every lab of this machine)."""
    done = subprocess.run(["virsh", "-c", URI, "-q", "list", "--name"], capture_output=True, text=True,
                          check=False, timeout=60)
    return [name for name in done.stdout.split() if name]


def stop(deadline: float = 60.0) -> list[str]:
    """Stop the daemons `start` started (by their pid files); return their names. Nothing stops while
    a domain runs: another lab (a smoke beside `make test-vagrant`) still needs the daemons; they
    stay (said on stderr) until a `stop` after the last domain is gone."""
    if _pid("libvirtd") is not None and answering():
        busy = running_domains()
        if busy:
            print(f"lab.remote.libvirtd: left running for {', '.join(busy)}", file=sys.stderr)
            return []
    stopped = []
    for name in reversed(DAEMONS):
        pid = _pid(name)
        if pid is None:
            continue
        os.kill(pid, signal.SIGTERM)
        if poll(deadline, lambda: _pid(name), f"{name} gone", until=lambda p: p is None,  # noqa: B023
                check=False, interval_s=0.2) is not None:
            raise LabError(f"{name} (pid {pid}) did not exit within {deadline:g} s of SIGTERM")
        (RUN_DIR / f"{name}.pid").unlink(missing_ok=True)
        stopped.append(name)
    return stopped


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.remote.libvirtd", description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("start", "stop", "status", "driver"))
    args = p.parse_args(argv)
    try:
        if args.action == "driver":
            why = kvm_unusable()
            print(f"{driver()}{f' ({why})' if why else ''}")
        elif args.action == "start":
            started = start()
            print(f"libvirtd answers on {URI}" + (f"; started {', '.join(started.ours)}" if started.ours else ""))
        elif args.action == "stop":
            print(f"stopped {', '.join(stop()) or 'nothing (no daemon of ours was running)'}")
        else:
            print(f"libvirtd {'answers' if answering() else 'does not answer'} on {URI}; ours: "
                  f"{', '.join(d for d in DAEMONS if _pid(d) is not None) or 'none'}")
    except LabError as exc:
        print(f"lab.remote.libvirtd: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
