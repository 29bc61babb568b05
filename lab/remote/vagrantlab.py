"""The Vagrant lab on libvirt, driven from here: up, target file, hardware suites, destroy, nothing left behind.

`make test-vagrant` runs `python -m lab.remote.vagrantlab test`: libvirtd (lab/remote/libvirtd.py) and the local
box (lab/remote/vagrantbox.py) first, then `vagrant up` of the topology, `l4lab target --vagrant`, the
balancer lb.sh loaded is unloaded (each test loads its own), `pytest suites/conformance --target`,
`vagrant destroy -f`, and a check that no libvirt domain, network or volume and no qemu process
named `l4lab-vg-<topology>-` remains. Vagrant's state and logs go to build/vagrant/<topology>/.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lab import procs
from lab.errors import LabError
from lab.remote import libvirtd, target, vagrantbox
from lab.remote import target as targets
from lab.remote.vagrant import LIBVIRT_PREFIX

REPO = Path(__file__).resolve().parent.parent.parent


def state_dir(lab: str) -> Path:
    return REPO / "build" / "vagrant" / lab


def env(topology: str, lab: str | None = None, box: str = "local", init: str = "systemd") -> dict[str, str]:
    """The environment of every vagrant command for lab `lab` (default: the topology's name); `init` the
    local box's init (systemd, or light: see lab/remote/vagrantbox.py)."""
    l4lab = Path(sys.executable).with_name("l4lab")
    lab = lab or topology
    return {
        **os.environ,
        "L4LAB_TOPOLOGY": topology,
        "L4LAB_VAGRANT_NAME": lab,
        "L4LAB_BOX": box,
        "L4LAB_BOX_INIT": init,
        "VAGRANT_DEFAULT_PROVIDER": "libvirt",
        "VAGRANT_DOTFILE_PATH": str(state_dir(lab) / "dot"),
        "VAGRANT_NO_COLOR": "1",
        **({"L4LAB": str(l4lab)} if l4lab.exists() else {}),
    }


def vagrant(args: Sequence[str], environ: Mapping[str, str], log: Path, timeout: float) -> None:
    """Run `vagrant ARGS` from the repository, appending its output to `log` with each line's second since
    the start (where a slow `vagrant up` spends its time); raise LabError with its tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log, "ab") as out:
        out.write(f"\n$ vagrant {' '.join(args)}   (started {time.strftime('%H:%M:%S')})\n".encode())
        out.flush()
        proc = subprocess.Popen(["vagrant", *args], cwd=REPO, env=dict(environ), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        assert proc.stdout is not None
        expired = threading.Event()

        def expire() -> None:  # the whole group: vagrant's ssh and rsync children hold the pipe too
            expired.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, expire)
        timer.start()
        try:
            for line in proc.stdout:
                out.write(f"[{time.monotonic() - start:6.1f}] ".encode() + line)
                out.flush()
            returncode = proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                expire()
                proc.wait()
        out.write(f"[{time.monotonic() - start:6.1f}] exit {returncode}\n".encode())
    if expired.is_set():
        raise LabError(f"`vagrant {' '.join(args)}` did not finish within {timeout:g} s; see {log}")
    if returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        raise LabError(f"`vagrant {' '.join(args)}` exited {returncode}; see {log}:\n" + "\n".join(tail),
                       command=f"vagrant {' '.join(args)}")


def _names(argv: Sequence[str]) -> list[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=60)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def leftovers(lab: str) -> list[str]:
    """Every libvirt domain and volume and every qemu process of lab `lab`, and the management
    network when no l4lab Vagrant lab is left to use it."""
    prefix = f"{LIBVIRT_PREFIX}{lab}-"
    domains = _names(["virsh", "-q", "list", "--all", "--name"])
    found = [f"domain {d}" for d in domains if d.startswith(prefix)]
    if not any(d.startswith(LIBVIRT_PREFIX) for d in domains):
        found += [f"network {n}" for n in _names(["virsh", "-q", "net-list", "--all", "--name"])
                  if n.startswith(LIBVIRT_PREFIX)]
    found += [f"volume {v}" for v in _names(["virsh", "-q", "vol-list", "default"]) if v.startswith(prefix)]
    found += [f"qemu process {p.pid}" for p in procs.walk()
              if p.argv and p.argv[0].endswith(b"qemu-system-x86_64")
              and any(arg.startswith(f"guest={prefix}".encode()) for arg in p.argv)]
    return found


@dataclass
class Timings:
    """Seconds per phase, in order."""

    phases: dict[str, float] = field(default_factory=dict)

    def mark(self, phase: str, since: float) -> float:
        self.phases[phase] = time.monotonic() - since
        print(f"vagrant-lab: {phase} took {self.phases[phase]:.0f} s", file=sys.stderr, flush=True)
        return time.monotonic()


def unload_provisioned(target_file: Path) -> None:
    """Unload the balancer lb.sh loaded on every LB host: the suites load their own, one per test."""
    tgt = targets.load(target_file)
    for node in tgt.topology.nodes_with_role("lb"):
        tgt.run(node.name, tgt.python_argv(node.name, "balancer.cli", "unload"), check=False, timeout=120)


def run_suites(topology: str, pytest_args: Sequence[str], keep: bool = False, init: str = "light") -> int:
    """The whole round trip; returns pytest's exit status (LabError when a lab step fails)."""
    log = state_dir(topology) / "vagrant.log"
    environ = env(topology, init=init)
    t = Timings()
    start = time.monotonic()
    started = libvirtd.start()
    try:
        now = t.mark("libvirtd", start)
        vagrantbox.ensure()
        now = t.mark("box", now)
        status = 1
        try:
            try:
                vagrant(["up", "--no-tty"], environ, log, timeout=3600)
            except LabError:
                now = t.mark("vagrant up (failed)", now)
                raise
            now = t.mark("vagrant up", now)
            path = target.for_vagrant(topology, state_dir(topology) / "target", env=environ)
            unload_provisioned(path)
            status = subprocess.run([sys.executable, "-m", "pytest", "suites/conformance", "--target", str(path),
                                     *pytest_args], cwd=REPO, check=False).returncode
            now = t.mark("hardware suites", now)
        finally:
            if not keep:
                vagrant(["destroy", "-f"], environ, log, timeout=900)
                now = t.mark("vagrant destroy", now)
                left = leftovers(topology)
                if left:
                    raise LabError(f"`vagrant destroy -f` left {', '.join(left)}")
        return status
    finally:
        if not keep and started.ours:
            libvirtd.stop()
        t.mark("total", start)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.remote.vagrantlab", description=__doc__.splitlines()[0],
                                epilog="more pytest arguments follow --, e.g. -- -k ip4-ipip")
    p.add_argument("action", choices=("test",))
    p.add_argument("--topology", default="default")
    p.add_argument("--keep", action="store_true", help="leave the machines and libvirtd running afterwards")
    # systemd's services time out under TCG on two loaded CPUs (six machines: journald and networkd
    # failed on one, which never answered ssh); the light init has nothing that times out.
    p.add_argument("--box-init", choices=("light", "systemd"), default="light",
                   help="the local box's init (default light: file systems, DHCP, sshd; systemd boots the box's own)")
    argv = list(sys.argv[1:] if argv is None else argv)
    # pytest's arguments follow `--` (argparse would take its options for ours or refuse them)
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    try:
        return run_suites(args.topology, pytest_args, args.keep, args.box_init)
    except LabError as exc:
        print(f"vagrant-lab: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
