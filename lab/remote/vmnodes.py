"""VM nodes of a topology: a supervisor process per VM node that boots its VM and stops it on SIGTERM.

A node of kind "vm" is a `lab.remote.vm.VmReal` (an LB with an `uplink`: a `lab.remote.lbvm.LbVm`, its
balancer loaded by the builder over the control channel) whose tap is the other end of its one link: the tap lives
in that netns node (normally the router) and carries the router's addresses on the link, the VM's
eth0 the node's own. The builder starts `python -m lab.remote.vmnodes` per VM node, outside any namespace
and in its own session, so the VM outlives `l4lab up`; the supervisor boots the VM, writes a ready
file (JSON: boot time, qemu's pid) and waits for SIGTERM, then kills qemu and removes the tap. The
builder journals both the supervisor and qemu, so `l4lab down` removes the VM even if the
supervisor was killed. A VM whose node has `nic = {queues, rss = true}` gets a multiqueue NIC, and
its supervisor proves RSS on (lab.remote.vm.VmReal.prove_rss) before it reports ready; `run()` runs a
command in a lab's VM over its control channel (also for `Lab.run` in the suites).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lab.errors import LabError
from lab.poll import poll
from lab.remote.vm_init.image import SETUP_HINT, ImageError, find_kernel, missing_tools
from lab.services import log_tail, spawn_detached, starttime
from lab.state import Process, state_dir
from lab.topology import Node, Topology

if TYPE_CHECKING:
    from lab.remote.vm import VmReal

READY_TIMEOUT_S = 240.0  # the first boot may build the initramfs from Debian packages
_REPO_ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class Ready:
    """What a supervisor reports once its VM is up."""

    boot_seconds: float
    guest_uptime: float
    qemu_pid: int
    qemu_starttime: int
    qemu_argv: list[str]
    serial_log: str
    control: str = ""  # the VM's control socket (lab.remote.vm.guest_run)
    rss_proof: dict[str, object] | None = None  # what the boot-time RSS proof observed


def missing(lb: bool = False) -> str | None:
    """None when VM reals (and with `lb` an LB VM) can boot here, else what is missing and how to get it
    (a skip reason)."""
    from lab.remote.vm_init.lb_image import missing as lb_missing  # the LB image builder: only with an LB VM

    tools = missing_tools() + (lb_missing() if lb else [])
    if tools:
        return f"VM reals need {', '.join(tools)}: run `{SETUP_HINT}`"
    try:
        find_kernel()
    except ImageError as exc:
        return str(exc)
    return None


def supervisor_argv(lab: str, netns: str, topo: Topology, node: Node, ready: Path) -> list[str]:
    """The supervisor's command line for VM node `node`, derived from its link and the VIPs (a real's) or
    its uplink (an LB's)."""
    vm_ep, tap_ep = topo.vm_link(node.name)
    argv = [sys.executable, "-m", "lab.remote.vmnodes", "--lab", lab, "--node", node.name, "--netns", netns,
            "--tap", tap_ep.ifname, "--ready-file", str(ready)]  # fmt: skip
    for version, (addr_flag, gw_flag) in ((4, ("--addr", "--gateway")), (6, ("--addr6", "--gateway6"))):
        mine = [a for a in vm_ep.addresses if a.version == version]
        theirs = [a for a in tap_ep.addresses if a.version == version]
        if mine:
            argv += [addr_flag, str(mine[0]), gw_flag, str(theirs[0].ip)]
    if node.uplink is not None:
        return argv + ["--bond", node.uplink.bond, "--vlan", str(node.uplink.vlan), "--ifname", vm_ep.ifname]
    assert node.decap is not None
    argv += ["--gue-port", str(node.decap.gue_port)]
    for vip in topo.vips:
        argv += ["--vip", str(vip.address)]
    if node.nic.queues > 1:
        argv += ["--queues", str(node.nic.queues)]
    if node.nic.rss:
        argv += ["--rss"]
    ports = {p.service: p.port for v in topo.vips for p in v.ports}
    if "http" in ports:
        argv += ["--http-port", str(ports["http"])]
    if "udp-echo" in ports:
        argv += ["--udp-echo-port", str(ports["udp-echo"])]
    return argv


def start(lab: str, netns: str, topo: Topology, node: Node, run_dir: Path) -> Process:
    """Start the supervisor of VM node `node` (its tap goes into `netns`); returns at once."""
    ready = run_dir / f"{node.name}.ready"
    log = run_dir / f"{node.name}.log"
    argv = supervisor_argv(lab, netns, topo, node, ready)
    return spawn_detached(argv, node=node.name, log=log, what=f"the VM supervisor of {node.name}")


def wait_ready(proc: Process, run_dir: Path, timeout: float = READY_TIMEOUT_S) -> Ready:
    """Poll for the supervisor's ready file; raise with the end of its log if it exits first."""
    path = run_dir / f"{proc.node}.ready"

    def ready() -> bool:
        if path.exists():
            return True
        if starttime(proc.pid) != proc.starttime:
            tail = log_tail(proc.log)
            raise LabError(f"VM real {proc.node} did not boot: {tail}", command=" ".join(proc.argv), stderr=tail)
        return False

    if not poll(timeout, ready, f"VM real {proc.node}'s ready file", check=False):
        raise LabError(f"VM real {proc.node} was not ready within {timeout:g} s; see {proc.log}")
    return Ready(**json.loads(path.read_text()))


def ready_of(lab: str, node: str) -> Ready:
    """The ready record of a running lab's VM node; LabError if it has none (not a VM, or not up)."""
    path = state_dir(lab) / f"{node}.ready"
    if not path.is_file():
        raise LabError(f"lab '{lab}' has no running VM node '{node}' ({path} is missing); is the lab up?")
    return Ready(**json.loads(path.read_text()))


def run(lab: str, node: str, argv: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run argv in VM node `node` of lab `lab` (its output and stderr together in stdout)."""
    from lab.remote.vm import guest_run  # numpy and the Toeplitz model: only a VM node's commands load them

    return guest_run(Path(ready_of(lab, node).control), argv, timeout=timeout)


def qemu_process(node: str, ready: Ready) -> Process:
    """The VM's qemu as a journaled lab process (so that `down` ends it even without its supervisor)."""
    return Process(node=node, pid=ready.qemu_pid, starttime=ready.qemu_starttime, argv=ready.qemu_argv,
                   log=ready.serial_log)


class _Stop(Exception):
    """SIGTERM or SIGINT arrived: stop the VM (also in the middle of its boot)."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signal.Signals(signum).name)


def _vm_of(args: argparse.Namespace) -> VmReal:
    """The VM the supervisor's arguments describe: an LB (--bond) or a real."""
    # numpy and the Toeplitz model: only a VM node's supervisor loads them
    from lab.remote.lbvm import LbVm
    from lab.remote.vm import VmReal

    addr, prefix = args.addr.split("/")
    addr6, prefix6 = args.addr6.split("/") if args.addr6 else (None, "64")
    if args.bond:
        return LbVm(args.node, args.netns, addr=addr, prefix=int(prefix), gateway=args.gateway, bond=args.bond,
                    vlan=args.vlan, ifname=args.ifname, addr6=addr6, prefix6=int(prefix6), gateway6=args.gateway6,
                    tap=args.tap, keep_logs=False)
    return VmReal(
        args.node, args.netns, addr=addr, prefix=int(prefix), gateway=args.gateway, vips=args.vip,
        gue_ports=[args.gue_port], addr6=addr6, prefix6=int(prefix6), gateway6=args.gateway6, tap=args.tap,
        http_port=args.http_port, udp_echo_port=args.udp_echo_port, keep_logs=False,
        queues=args.queues, rss=args.rss,
    )  # fmt: skip


def supervise(args: argparse.Namespace) -> None:
    """Boot the VM, write the ready file, wait for SIGTERM/SIGINT, stop the VM (also mid-boot)."""
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    vm = _vm_of(args)
    try:
        vm.start()  # undoes itself on any exception, _Stop included
        proof = vm.prove_rss() if vm.rss else None
        process = vm._process
        assert process is not None and vm.boot_seconds is not None and vm.guest_uptime is not None
        ready = Ready(
            boot_seconds=vm.boot_seconds,
            guest_uptime=vm.guest_uptime,
            qemu_pid=process.pid,
            qemu_starttime=starttime(process.pid) or 0,
            qemu_argv=[str(a) for a in process.args],  # type: ignore[union-attr]
            serial_log=str(vm.serial_log),
            control=str(vm.control_socket),
            rss_proof=proof,
        )
        tmp = args.ready_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(ready.__dict__))
        os.replace(tmp, args.ready_file)
        print(f"VM {args.node} ready in {vm.boot_seconds:.2f} s (qemu pid {process.pid})", flush=True)
        if proof is not None:
            print(f"VM {args.node}: RSS proven on: {json.dumps(proof)}", flush=True)
        while True:
            signal.pause()
    except _Stop as stop:
        print(f"VM {args.node}: {stop} received, stopping", flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        vm.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.remote.vmnodes", description="supervise one VM node of a lab")
    parser.add_argument("--lab", required=True, help="the lab this process belongs to (for finding it)")
    parser.add_argument("--node", required=True)
    parser.add_argument("--netns", required=True, help="the namespace that holds the VM's tap")
    parser.add_argument("--tap", required=True)
    parser.add_argument("--addr", required=True, metavar="ADDR/PREFIX")
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--addr6", metavar="ADDR/PREFIX")
    parser.add_argument("--gateway6")
    parser.add_argument("--vip", action="append", default=[])
    parser.add_argument("--gue-port", type=int, default=6080)
    parser.add_argument("--http-port", type=int, default=80)
    parser.add_argument("--udp-echo-port", type=int, default=9000)
    parser.add_argument("--queues", type=int, default=1, help="NIC queues (and vCPUs)")
    parser.add_argument("--rss", action="store_true", help="switch qemu's RSS on and prove it before ready")
    parser.add_argument("--bond", help="an LB VM: its uplink's bond mode (lab.remote.lbvm.BOND_MODES)")
    parser.add_argument("--vlan", type=int, default=100, help="an LB VM: the VLAN its uplink carries")
    parser.add_argument("--ifname", default="bond0", help="an LB VM: the bond's name, where XDP attaches")
    parser.add_argument("--ready-file", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        supervise(args)
    except LabError as exc:
        print(f"VM {args.node}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
