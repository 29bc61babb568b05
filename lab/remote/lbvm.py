"""An LB node in a qemu (TCG) VM: Debian's cloud kernel, whose bonding and 802.1Q this machine's kernel lacks.

The VM boots the LB image (lab/remote/vm_init/lb_image.py: Python, libbpf and this checkout's
`balancer`) with lb_init.sh as /init: its uplink is a bond of two links carrying an 802.1Q VLAN, and the
switch at the bond's other end (a VLAN-aware bridge and the partner bond, in the VM's namespace "sw")
hands the VLAN untagged to the VM's one NIC, whose tap is in the router's namespace with the router's
addresses on it. l4lab's balancer is loaded in the VM with `lbctl`, over the control channel
(`run`), on the bond: XDP on a bond runs on each of its links and sends through the bond.

The links can be cut (`set_link`: both ends down, as a pulled cable) and the uplink rebuilt in another
bond mode (`uplink`: the balancer unloaded first, a bond does not change mode under XDP).

Example::

    with LbVm("lb", netns="lab-router", addr="198.51.100.2", prefix=28, gateway="198.51.100.1",
              bond="802.3ad", vlan=100) as vm:
        vm.lbctl("--instance", "lb", "status")
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import shlex
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from balancer import config as cfg
from lab.poll import poll
from lab.remote import vmnodes
from lab.remote.vm import VmError, VmReal
from lab.remote.vm_init.lb_image import build_lb_image

if TYPE_CHECKING:
    from balancer.config import Config

Run = Callable[..., subprocess.CompletedProcess[str]]  # run(argv, timeout=...) in one VM

BOND_MODES = ("active-backup", "802.3ad", "balance-xor")
LINKS = ("a", "b")  # link a: lb0a (the LB's end) - sw0a (the switch's end); link b likewise
LBCTL = ("python3", "-m", "balancer.cli")  # in the VM (lb_init.sh sets PYTHONPATH)
IP = "/usr/sbin/ip"  # iproute2's, by path: the VM's busybox sh runs its own `ip` applet before any PATH lookup


class LbVm(VmReal):
    """The LB VM. Parameters as VmReal's (`netns` holds the tap, `gateway` goes on it), and the uplink:
    `bond` (one of BOND_MODES), `vlan` (1..4094), `ifname` (the bond's name, where XDP attaches)."""

    def __init__(self, name: str, netns: str, addr: str, prefix: int, gateway: str | None, *, bond: str,
                 vlan: int, ifname: str = "bond0", **kwargs: Any) -> None:
        if bond not in BOND_MODES:
            raise ValueError(f"LbVm bond must be one of {', '.join(BOND_MODES)} but got {bond!r}")
        if not 1 <= vlan <= 4094:
            raise ValueError(f"LbVm vlan must be 1..4094 but got {vlan}")
        kwargs.setdefault("memory_mb", 512)  # the image (Python and numpy) unpacks into RAM
        kwargs.setdefault("boot_timeout", 180.0)
        super().__init__(name, netns, addr, prefix, gateway, vips=[], gue_ports=[], fou_ports=[], **kwargs)
        self.bond, self.vlan, self.ifname = bond, vlan, ifname

    def start(self) -> None:
        if self.image is None:
            self.image = build_lb_image(self.cache_dir)
        super().start()

    def kernel_cmdline(self) -> str:
        return " ".join([*self.network_words(), f"l4lab.bond={self.bond}", f"l4lab.vlan={self.vlan}",
                         f"l4lab.ifname={self.ifname}"])


def in_lab(lab: str, node: str) -> Run:
    """`run` for VM node `node` of a running lab (lab.remote.vmnodes.run, bound to the node)."""
    return functools.partial(vmnodes.run, lab, node)


def load_balancer(run: Run, instance: str, config: Config) -> None:
    """`lbctl load` in the VM with `config` (written to /etc/l4lab/INSTANCE.toml there): its interfaces
    are the VM's (the bond)."""

    path = f"/etc/l4lab/{instance}.toml"
    write_file(run, path, cfg.dump(config))
    sh(run, shlex.join([*LBCTL, "--instance", instance, "load", "--config", path]),
       f"load the balancer (lbctl instance {instance})", timeout=300.0)


def sh(run: Run, command: str, what: str, timeout: float = 60.0) -> str:
    """Run one shell command line in a VM through `run` (VmReal.run, or vmnodes.run bound to a node);
    VmError naming `what` on failure."""
    done: subprocess.CompletedProcess[str] = run(["sh", "-c", command], timeout=timeout)
    if done.returncode != 0:
        raise VmError(f"cannot {what} in the LB VM: `{command}` exited {done.returncode}: {done.stdout.strip()[-800:]}",
                      step=what, command=command, stderr=done.stdout)
    return done.stdout


def write_file(run: Run, path: str, text: str) -> None:
    """Write `text` to `path` in the VM (the control channel carries one line: base64 of the text)."""
    data = base64.b64encode(text.encode()).decode()
    sh(run, f"mkdir -p $(dirname {shlex.quote(path)}) && echo {data} | base64 -d > {shlex.quote(path)}",
       f"write {path}")


def read_file(run: Run, path: str) -> bytes:
    """The bytes of `path` in the VM."""
    return base64.b64decode(sh(run, f"base64 {shlex.quote(path)}", f"read {path}"))


def set_link(run: Run, link: str, up: bool) -> None:
    """Take link `link` (one of LINKS) down at both ends, as a pulled cable, or up again."""
    state = "up" if up else "down"
    sh(run, f"{IP} -n sw link set sw0{link} {state} && {IP} link set lb0{link} {state}", f"set link {link} {state}")


def settled(run: Run, mode: str, deadline_s: float = 30.0) -> None:
    """Wait until both bonds carry traffic as `mode` does with both links up (after a link came back)."""
    done = poll(deadline_s, lambda: run(["/init", "settled", mode], timeout=30.0), f"the {mode} bonds settled",
                until=lambda d: d.returncode == 0, check=False, interval_s=0.2)
    if done.returncode != 0:
        state = sh(run, "cat /proc/net/bonding/*", "read the bonds")
        raise VmError(f"the LB VM's {mode} bonds did not take both links within {deadline_s:g} s: {state[-1500:]}",
                      step="settle")


def uplink(run: Run, mode: str) -> None:
    """Build the uplink again in bond mode `mode` and wait until both bonds carry traffic (unload first)."""
    if mode not in BOND_MODES:
        raise ValueError(f"bond mode must be one of {', '.join(BOND_MODES)} but got {mode!r}")
    sh(run, f"/init uplink {mode}", f"build the uplink as {mode}", timeout=90.0)


def link_packets(run: Run, names: Sequence[str], netns: str = "") -> dict[str, tuple[int, int]]:
    """{interface: (rx packets, tx packets)} of the VM's interfaces `names` in namespace `netns` ("" the VM's own)."""
    where = f"-n {netns} " if netns else ""
    links = json.loads(sh(run, f"{IP} {where}-j -s link show", "read the interface counters"))
    got = {link["ifname"]: (int(link["stats64"]["rx"]["packets"]), int(link["stats64"]["tx"]["packets"]))
           for link in links if link["ifname"] in names}
    missing = sorted(set(names) - set(got))
    if missing:
        raise VmError(f"the LB VM has no interface {', '.join(missing)} in namespace {netns or 'root'}",
                      step="counters")
    return got


@contextlib.contextmanager
def capture(run: Run, ifname: str, local: Path, netns: str = "sw") -> Iterator[Callable[[], bytes]]:
    """tcpdump on `ifname` of the VM's namespace `netns` (LACP left out) while the block runs; the pcap
    is then copied to `local` (the control channel carries it as base64). The block gets a function
    that reads the pcap so far: tcpdump under TCG lags, and what it has not read when it stops is lost,
    so a caller waits until it has caught up with what it expects."""
    remote = f"/tmp/{local.name}"
    sh(run, f"{IP} netns exec {netns} tcpdump -Z root -U -n -s 2048 -i {ifname} -w {remote} not ether proto 0x8809 "
            f">{remote}.log 2>&1 & echo $! >{remote}.pid", f"start tcpdump on {ifname}")
    said = poll(20.0, lambda: sh(run, f"cat {remote}.log", "read tcpdump's output"),
                f"tcpdump listening on {ifname} in the LB VM", until=lambda out: "listening on" in out,
                check=False, interval_s=0.2)
    if "listening on" not in said:
        raise VmError(f"tcpdump on {ifname} in the LB VM did not start within 20 s: {said.strip()[-500:]}",
                      step="capture")
    try:
        yield lambda: read_file(run, remote)
    finally:
        sh(run, f"pid=$(cat {remote}.pid); kill -INT $pid; i=0; while kill -0 $pid 2>/dev/null && [ $i -lt 100 ]; "
                "do i=$((i + 1)); sleep 0.1; done; ! kill -0 $pid 2>/dev/null", f"stop tcpdump on {ifname}")
        local.write_bytes(read_file(run, remote))
