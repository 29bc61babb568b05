"""FRR in lab nodes: per-node zebra, bfdd and bgpd (config, sockets, pid files under the lab's run directory).

Every node with `bgp_asn` runs its own zebra, bfdd and bgpd inside its namespace, with everything
they write under /run/l4lab/<lab>/frr/<node>/ (configs, vty sockets, the zebra API socket, the
bfdd control socket, pid files, logs), so nodes and labs never share a daemon or a socket. Two
nodes joined by a link peer over it with eBGP, one session per address family, each watched by
BFD (`[bgp]` timers of the topology). The router accepts every LB's VIP routes as one multipath
route (Linux ECMP; the topology sets the L4 hash policy).

An LB node's bgpd has `network VIP/32` (and /128) with `bgp network import-check`: it announces a
VIP only while that prefix is in the node's own routing table. The lab's health hook (`hook()`
below, one process per LB node) keeps a blackhole route for a VIP in the LB's table exactly while
its balancer instance is loaded, attached and has a live real for that VIP; removing the route is
the withdrawal. The XDP program sees VIP packets before routing, so the blackhole never carries
balanced traffic.

    vtysh_argv(lab, "router", "show ip bgp")   # what `l4lab exec router -- vtysh ...` runs
"""

from __future__ import annotations

import argparse
import errno
import json
import operator
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lab.errors import LabError
from lab.nsexec import nsenter_argv
from lab.poll import poll
from lab.services import log_tail, spawn_detached, starttime
from lab.state import Process, state_dir
from lab.topology import IpAddress, Node, Topology

FRR_BIN = Path("/usr/lib/frr")
DAEMONS = ("zebra", "bfdd", "bgpd")  # start order: the others talk to zebra
SETUP_HINT = "bash scripts/setup.sh --extra frr"
FRR_USER = "frr"  # Debian's FRR daemons drop to this user
BFD_PROFILE = "lab"
READY_TIMEOUT_S = 10.0
ESTABLISHED_TIMEOUT_S = 30.0
HOOK_INTERVAL_S = 0.05
_REPO_ROOT = Path(__file__).resolve().parent.parent


def missing() -> str | None:
    """None when FRR is installed here, else what is missing and how to get it (a skip reason)."""
    absent = [str(FRR_BIN / d) for d in DAEMONS if not (FRR_BIN / d).is_file()]
    if shutil.which("vtysh") is None:
        absent.append("vtysh")
    if absent:
        return f"FRR is not installed ({', '.join(absent)} missing): run `{SETUP_HINT}`"
    return None


def node_dir(lab: str, node: str) -> Path:
    """Where node `node` of lab `lab` keeps its FRR configs, sockets, pid files and logs."""
    return state_dir(lab) / "frr" / node


# ---- what each node says


def peers(topo: Topology, node: str) -> list[tuple[IpAddress, IpAddress, int]]:
    """(local address, peer address, peer ASN) of every BGP session of `node`, one per family and link."""
    asn = {n.name: n.bgp_asn for n in topo.bgp_nodes()}
    out: list[tuple[IpAddress, IpAddress, int]] = []
    for link in topo.links:
        for mine, theirs in ((link.a, link.b), (link.b, link.a)):
            peer_asn = asn.get(theirs.node)
            if mine.node != node or peer_asn is None:
                continue
            for version in (4, 6):
                local = [a.ip for a in mine.addresses if a.version == version]
                remote = [a.ip for a in theirs.addresses if a.version == version]
                if local and remote:
                    out.append((local[0], remote[0], peer_asn))
    return out


def router_id(topo: Topology, node: str) -> str:
    for ep in topo.endpoints_of(node):
        for addr in ep.addresses:
            if addr.version == 4:
                return str(addr.ip)
    raise LabError(f"BGP node '{node}' of topology '{topo.name}' has no IPv4 address for a router id")


def configs(topo: Topology, node: Node) -> dict[str, str]:
    """The config file of each daemon of `node`, and of vtysh: {name: text} for <name>.conf."""
    assert node.bgp_asn is not None
    bfd = topo.bgp
    sessions = peers(topo, node.name)
    bgp = [
        f"router bgp {node.bgp_asn}",
        f" bgp router-id {router_id(topo, node.name)}",
        " no bgp ebgp-requires-policy",
        " no bgp default ipv4-unicast",
        " bgp network import-check",
        " timers bgp 3 9",
    ]
    for _, peer, asn in sessions:
        bgp += [
            f" neighbor {peer} remote-as {asn}",
            f" neighbor {peer} timers connect 1",
            f" neighbor {peer} advertisement-interval 0",
            f" neighbor {peer} bfd profile {BFD_PROFILE}",
        ]
    for version, family in ((4, "ipv4"), (6, "ipv6")):
        bgp.append(f" address-family {family} unicast")
        bgp += [f"  neighbor {peer} activate" for _, peer, _ in sessions if peer.version == version]
        if node.role == "lb":
            bgp += [
                f"  network {v.address}/{v.address.max_prefixlen}"
                for v in topo.vips
                if v.address.version == version
            ]
        else:
            bgp.append("  maximum-paths 16")
        bgp.append(" exit-address-family")
    return {
        # vtysh's own file (vtysh --config_dir): per-daemon files, no integrated frr.conf.
        "vtysh": "no service integrated-vtysh-config\n",
        "zebra": f"hostname {node.name}\n",
        "bfdd": "\n".join(
            [
                f"hostname {node.name}",
                "bfd",
                f" profile {BFD_PROFILE}",
                f"  receive-interval {bfd.bfd_interval_ms}",
                f"  transmit-interval {bfd.bfd_interval_ms}",
                f"  detect-multiplier {bfd.bfd_multiplier}",
                " exit",
                "exit",
                "",
            ]
        ),
        "bgpd": "\n".join([f"hostname {node.name}", *bgp, ""]),
    }


# ---- running the daemons


def daemon_argv(lab: str, node: str, daemon: str) -> list[str]:
    """The command line of one daemon: every path under node_dir, no TCP vty (it runs as user frr)."""
    d = node_dir(lab, node)
    argv = [
        str(FRR_BIN / daemon),
        "--config_file", str(d / f"{daemon}.conf"),
        "--pid_file", str(d / f"{daemon}.pid"),
        "--vty_socket", str(d),
        "--socket", str(d / "zserv.api"),
        "--vty_port", "0",
        "--limit-fds", "1024",
        "--log", f"file:{d / f'{daemon}.log'}",
    ]  # fmt: skip
    if daemon == "bfdd":
        argv += ["--bfdctl", str(d / "bfdd.sock")]
    return argv


def write_configs(lab: str, topo: Topology, node: Node) -> Path:
    """Create node_dir, owned by the user the daemons drop to, and write their configs; returns it."""
    d = node_dir(lab, node.name)
    d.mkdir(parents=True)
    try:
        owner = pwd.getpwnam(FRR_USER)
    except KeyError as exc:
        raise LabError(f"user '{FRR_USER}' does not exist: is FRR installed? run `{SETUP_HINT}`") from exc
    os.chown(d, owner.pw_uid, owner.pw_gid)
    for daemon, text in configs(topo, node).items():
        path = d / f"{daemon}.conf"
        path.write_text(text)
        os.chown(path, owner.pw_uid, owner.pw_gid)
    return d


def spawn(netns: str, node: str, argv: Sequence[str], log: Path) -> Process:
    """Start `argv` inside `netns` in its own session (it outlives `l4lab up`), output to `log`."""
    return spawn_detached(nsenter_argv(netns, argv), node=node, log=log, what=f"{argv[0]} of {node}", argv=argv)


def start_daemon(lab: str, netns: str, node: str, daemon: str) -> Process:
    d = node_dir(lab, node)
    return spawn(netns, node, daemon_argv(lab, node, daemon), d / f"{daemon}.out")


def wait_daemon(lab: str, proc: Process, daemon: str, timeout: float = READY_TIMEOUT_S) -> None:
    """Poll until the daemon's vty socket exists (it has read its config); raise if it died or hung."""
    sock = node_dir(lab, proc.node) / f"{daemon}.vty"

    def ready() -> bool:
        if sock.exists():
            return True
        if starttime(proc.pid) != proc.starttime:
            raise LabError(
                f"{daemon} of {proc.node} exited before it was ready: {log_tail(proc.log)}",
                command=" ".join(proc.argv),
                stderr=log_tail(proc.log),
            )
        return False

    if not poll(timeout, ready, f"{daemon}'s vty socket", check=False, interval_s=0.01):
        raise LabError(f"{daemon} of {proc.node} made no vty socket {sock} within {timeout:g} s; see {proc.log}")


def hook_argv(lab: str, instance: str, node: str, interface: str, vips: Sequence[IpAddress], ready: Path) -> list[str]:
    argv = [sys.executable, "-m", "lab.frr", "hook", "--lab", lab, "--node", node, "--instance", instance,
            "--interface", interface, "--ready-file", str(ready)]  # fmt: skip
    for vip in vips:
        argv += ["--vip", str(vip)]
    return argv


def start_hook(lab: str, netns: str, topo: Topology, node: str, interface: str) -> Process:
    """The health hook of LB node `node` (balancer instance `<lab>-<node>`, as lbctl is run in the lab)."""
    d = node_dir(lab, node)
    vips = [v.address for v in topo.vips]
    return spawn(netns, node, hook_argv(lab, f"{lab}-{node}", node, interface, vips, d / "hook.ready"),
                 d / "hook.log")


def wait_hook(lab: str, proc: Process, timeout: float = READY_TIMEOUT_S) -> None:
    ready_file = node_dir(lab, proc.node) / "hook.ready"

    def ready() -> bool:
        if ready_file.exists():
            return True
        if starttime(proc.pid) != proc.starttime:
            raise LabError(f"the health hook of {proc.node} exited before it was ready: {log_tail(proc.log)}",
                           command=" ".join(proc.argv))
        return False

    if not poll(timeout, ready, "the health hook's ready file", check=False, interval_s=0.01):
        raise LabError(f"the health hook of {proc.node} was not ready within {timeout:g} s; see {proc.log}")


# ---- asking the daemons


def vtysh_argv(lab: str, node: str, *commands: str) -> list[str]:
    """vtysh talking to node `node`'s daemons, running `commands` (none: interactive)."""
    d = str(node_dir(lab, node))
    argv = ["vtysh", "--vty_socket", d, "--config_dir", d]
    for command in commands:
        argv += ["-c", command]
    return argv


def exec_argv(lab: str, node: str, command: Sequence[str]) -> list[str]:
    """`command` as `l4lab exec` should run it: vtysh is pointed at the node's own daemons and directory.

    (`--config_dir`: a `write memory` there writes the node's files, never /etc/frr.)
    """
    if command and os.path.basename(command[0]) == "vtysh" and node_dir(lab, node).is_dir():
        d = str(node_dir(lab, node))
        return [command[0], "--vty_socket", d, "--config_dir", d, *command[1:]]
    return list(command)


def vtysh(lab: str, node: str, *commands: str, timeout: float = 10.0) -> str:
    """Run vtysh commands against node `node`; their output, or LabError naming the command."""
    argv = vtysh_argv(lab, node, *commands)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"vtysh on {node} did not answer within {timeout:g} s", command=" ".join(argv)) from exc
    if done.returncode != 0:
        raise LabError(
            f"vtysh on {node} failed with exit code {done.returncode}: {(done.stderr or done.stdout).strip()}; "
            f"are its daemons running (see {node_dir(lab, node)})?",
            command=" ".join(argv),
            stderr=done.stderr,
        )
    return done.stdout


def neighbor_states(lab: str, node: str) -> dict[str, str]:
    """{peer address: BGP state} of node `node`."""
    raw: dict[str, Any] = json.loads(vtysh(lab, node, "show bgp neighbors json") or "{}")
    return {peer: str(body.get("bgpState")) for peer, body in raw.items() if isinstance(body, dict)}


def wait_established(lab: str, topo: Topology, timeout: float = ESTABLISHED_TIMEOUT_S) -> float:
    """Poll until every BGP session of the lab is Established; the seconds it took."""
    started = time.monotonic()

    def pending() -> list[str]:
        out = []
        for node in topo.bgp_nodes():
            states = neighbor_states(lab, node.name)
            for _, peer, _ in peers(topo, node.name):
                state = states.get(str(peer), "absent")
                if state != "Established":
                    out.append(f"{node.name}->{peer} {state}")
        return out

    left = poll(timeout, pending, "every BGP session Established", until=operator.not_, check=False)
    if left:
        raise LabError(f"BGP sessions not Established within {timeout:g} s: {', '.join(left[:4])}; "
                       f"see the logs under {state_dir(lab) / 'frr'}")
    return time.monotonic() - started


# ---- the health hook (runs inside an LB node)


class Health:
    """Whether balancer instance `instance` can serve each VIP: loaded, attached, a live real for it.

    The instance's state file is parsed again only when its text changes (the hook asks 20 times a second).
    """

    def __init__(self, instance: str, interface: str, vips: Sequence[str]) -> None:
        self.instance = instance
        self.interface = interface
        self.vips = set(vips)
        self._seen: str | None = None  # the state file's text when _live was computed
        self._live: set[str] = set()

    def healthy_vips(self) -> set[str]:
        # numpy, libbpf: only the health hook inside an LB node reads the instance
        from balancer.controller import Instance

        try:
            text = Instance.state_path(self.instance).read_text()
        except FileNotFoundError:
            return set()
        # Attached: lbctl pins the BPF link of every interface; an XDP link cannot be detached
        # behind its back (`ip link set xdp off` refuses), so the pin is the attachment.
        if not Path(Instance.pin_dir(self.instance), f"link_{self.interface}").exists():
            return set()
        if text != self._seen:
            self._live = self._live_vips(text)
            self._seen = text
        return set(self._live)

    def _live_vips(self, text: str) -> set[str]:
        from balancer import config as cfg  # the config parser: only the health hook inside an LB node needs it

        # numpy, libbpf: only the health hook inside an LB node reads the instance
        from balancer.controller import State

        state = State.from_json(text)
        if not state.config:
            return set()
        conf = cfg.loads(state.config, f"state of instance '{self.instance}'")
        return {
            str(v.address)
            for v in conf.vips
            if str(v.address) in self.vips
            and any(str(r.address) not in state.down.get(v.name, []) for r in v.reals)
        }


def _set_blackhole(address: str, present: bool) -> None:
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    plen = 128 if family == socket.AF_INET6 else 32
    with IPRoute() as ipr:
        try:
            ipr.route("add" if present else "del", family=family, dst=f"{address}/{plen}", type="blackhole")
        except NetlinkError as exc:
            if exc.code not in (errno.EEXIST, errno.ESRCH):  # already as wanted
                raise


def hook(instance: str, interface: str, vips: Sequence[str], ready: Path) -> None:
    """Keep a blackhole route for each VIP exactly while the balancer can serve it; log every change."""
    health = Health(instance, interface, vips)
    announced: set[str] = set()
    for vip in vips:
        _set_blackhole(vip, False)
    first = True
    stop = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not stop:
        try:
            healthy = health.healthy_vips()
        except Exception as exc:  # noqa: BLE001 - a half-written or broken instance counts as unhealthy
            print(f"{time.time():.3f} instance {instance} unreadable, treated as unhealthy: {exc}", flush=True)
            healthy = set()
        for vip in sorted(healthy - announced):
            _set_blackhole(vip, True)
            print(f"{time.time():.3f} announce {vip}", flush=True)
        for vip in sorted(announced - healthy):
            _set_blackhole(vip, False)
            print(f"{time.time():.3f} withdraw {vip}", flush=True)
        announced = healthy
        if first:
            tmp = ready.with_suffix(".tmp")
            tmp.write_text(f"{os.getpid()}\n")
            os.replace(tmp, ready)
            first = False
        time.sleep(HOOK_INTERVAL_S)  # the hook's polling period, not synchronisation
    for vip in sorted(announced):  # no hook, no health: nothing is announced
        _set_blackhole(vip, False)
        print(f"{time.time():.3f} withdraw {vip} (hook stopped)", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.frr", description="FRR helpers of the lab")
    sub = parser.add_subparsers(dest="verb", required=True)
    h = sub.add_parser("hook", help="announce the VIPs while the LB's balancer is healthy")
    h.add_argument("--lab", required=True, help="the lab this process belongs to (for finding it)")
    h.add_argument("--node", required=True)
    h.add_argument("--instance", required=True, help="the lbctl instance name")
    h.add_argument("--interface", required=True, help="the interface the balancer must be attached to")
    h.add_argument("--vip", action="append", default=[], required=True)
    h.add_argument("--ready-file", required=True, type=Path)
    args = parser.parse_args(argv)
    hook(args.instance, args.interface, args.vip, args.ready_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
