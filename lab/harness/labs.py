"""labs.py: a running lab as one handle, whether namespaces on this machine or hosts reached over SSH.

`Lab` is the protocol tests are written against: run, python, capture, mac, ifname and write mean
the same on both kinds. `NetnsLab` is a lab `lab.netns` built here; `TargetLab` is a lab already
built on Vagrant VMs or bare metal (`--target FILE`, lab/remote/target.py). `LabBalancer` is l4lab's
controller (lbctl) loaded in a lab node, the same on both.
"""

from __future__ import annotations

import json
import subprocess
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from balancer.encaps import by_id
from lab.errors import CommandError
from lab.nsexec import nsenter_argv
from lab.observe.capture import Capture
from lab.remote import vmnodes
from lab.remote.target import RemoteCapture

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from balancer.config import Config
    from lab.observe.trace import Tracer
    from lab.remote.target import Target
    from lab.topology import Topology

REPO = Path(__file__).resolve().parents[2]  # the checkout the lab's commands run from


@runtime_checkable
class Lab(Protocol):
    """A running lab: its name, topology and how to run things in its nodes."""

    kept: bool
    tracer: Tracer | None  # lab.observe.trace.Tracer while the module runs, when BCC is available
    results: dict[str, Any]

    @property
    def name(self) -> str:
        """The lab's name (a netns lab's namespaces are `<name>-<node>`)."""

    @property
    def topology(self) -> Topology:
        """The topology it was built as."""

    @property
    def target(self) -> Target | None:
        """The target file's hosts for a lab reached over SSH; None for namespaces here."""

    def netns(self, node: str) -> str:
        """The node's namespace (fails on a target: its nodes are hosts)."""

    def where(self, node: str) -> str:
        """The node as messages name it."""

    def argv(self, node: str, argv: list[str] | tuple[str, ...]) -> list[str]:
        """The local command line that runs argv in node."""

    def run(self, node: str, argv: list[str] | tuple[str, ...], *, check: bool = True, timeout: float = 60.0,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run argv in node from the repository's top; with check, fail naming the node and the output."""

    def python_command(self, node: str, module: str, *args: str) -> list[str]:
        """`python -m module args` as the node runs it."""

    def python(self, node: str, module: str, *args: str, check: bool = True,
               timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run `python -m module args` in node."""

    def python_argv(self, node: str, module: str, *args: str) -> list[str]:
        """The local command line that runs `python -m module args` in node (for a long-lived Popen)."""

    def ifname(self, node: str, ifname: str) -> str:
        """The node's name for the topology's interface `ifname` (a target may rename it)."""

    def mac(self, node: str, ifname: str) -> str:
        """The MAC address of the node's interface (the topology's name for it)."""

    def capture(self, node: str, ifname: str, path: Path, snaplen: int = 512) -> AbstractContextManager[Any]:
        """tcpdump on the node's interface into the local pcap `path` (a context manager)."""

    def write(self, node: str, path: str, text: str) -> None:
        """Write a file the node's commands can read."""

    def node_path(self, local: Path, name: str) -> str:
        """Where the node reads a file the test keeps at `local` (name: its file name on a remote host)."""

    def link_overrides(self, node: str) -> dict[str, str]:
        """balancer_config arguments this lab needs for the LB in `node` (a target's names and MACs)."""


def _checked(done: subprocess.CompletedProcess[str], argv: list[str] | tuple[str, ...], where: str,
             check: bool) -> subprocess.CompletedProcess[str]:
    if check and done.returncode != 0:
        raise CommandError(f"{' '.join(argv)} in {where} exited {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()[-2000:]}", command=" ".join(argv),
                           stderr=done.stderr or done.stdout)
    return done


@dataclass
class _Common(ABC):
    """What both kinds of lab do the same way, given argv(), where() and python_command()."""

    @abstractmethod
    def argv(self, node: str, argv: list[str] | tuple[str, ...]) -> list[str]:
        """The command line that runs argv in the node (nsenter here, ssh on a target)."""

    @abstractmethod
    def where(self, node: str) -> str:
        """The node named for messages."""

    @abstractmethod
    def python_command(self, node: str, module: str, *args: str) -> list[str]:
        """`python -m module args` with the interpreter and checkout the node runs."""

    def run(self, node: str, argv: list[str] | tuple[str, ...], *, check: bool = True, timeout: float = 60.0,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(self.argv(node, argv), capture_output=True, text=True,
                              timeout=timeout, cwd=REPO, check=False, input=input)
        return _checked(done, argv, self.where(node), check)

    def python(self, node: str, module: str, *args: str, check: bool = True,
               timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return self.run(node, self.python_command(node, module, *args), check=check, timeout=timeout)

    def python_argv(self, node: str, module: str, *args: str) -> list[str]:
        return self.argv(node, self.python_command(node, module, *args))


@dataclass
class NetnsLab(_Common):
    """A lab of network namespaces on this machine (lab.netns), node `n` living in `<name>-<n>`."""

    name: str
    topology: Topology
    kept: bool = False
    tracer: Tracer | None = None
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def target(self) -> None:
        return None

    def netns(self, node: str) -> str:
        return f"{self.name}-{node}"

    def where(self, node: str) -> str:
        return self.netns(node)

    def argv(self, node: str, argv: list[str] | tuple[str, ...]) -> list[str]:
        return nsenter_argv(self.netns(node), list(argv))

    def run(self, node: str, argv: list[str] | tuple[str, ...], *, check: bool = True, timeout: float = 60.0,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """nsenter keeps /sys/fs/bpf visible; a VM node runs argv over its control channel (its stderr
        comes back in stdout)."""
        if self.topology.node(node).kind == "vm" and input is None:
            return _checked(vmnodes.run(self.name, node, argv, timeout=timeout), argv, self.where(node), check)
        return super().run(node, argv, check=check, timeout=timeout, input=input)

    def python_command(self, node: str, module: str, *args: str) -> list[str]:
        """This interpreter; in a VM node (an LB VM: lab/remote/lbvm.py), the VM's own."""
        if self.topology.node(node).kind == "vm":
            return ["python3", "-m", module, *args]
        return [sys.executable, "-m", module, *args]

    def ifname(self, node: str, ifname: str) -> str:
        return ifname

    def mac(self, node: str, ifname: str) -> str:
        from lab.lbconf import peer_mac  # lab.lbconf brings numpy and pyroute2; every pytest run imports this module

        if self.topology.node(node).kind == "vm":
            return self.run(node, ["cat", f"/sys/class/net/{ifname}/address"]).stdout.strip()
        return peer_mac(self.name, node, ifname)

    def capture(self, node: str, ifname: str, path: Path, snaplen: int = 512) -> AbstractContextManager[Any]:
        return Capture(self.name, node, ifname, path, snaplen=snaplen)

    def write(self, node: str, path: str, text: str) -> None:
        """The file here; in a VM node, at the same path in the VM."""
        if self.topology.node(node).kind == "vm":
            from lab.remote.lbvm import in_lab, write_file  # numpy and pyroute2 (the LB VM): only a lab with an LB VM

            write_file(in_lab(self.name, node), path, text)
            return
        Path(path).write_text(text)

    def node_path(self, local: Path, name: str) -> str:
        return str(local)

    def link_overrides(self, node: str) -> dict[str, str]:
        return {}


@dataclass
class TargetLab(_Common):
    """A lab already built on other hosts (Vagrant VMs, bare metal), each node reached over SSH."""

    hosts: Target
    kept: bool = False
    tracer: Tracer | None = None
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.hosts.name

    @property
    def topology(self) -> Topology:
        return self.hosts.topology

    @property
    def target(self) -> Target:
        return self.hosts

    def netns(self, node: str) -> str:
        raise AssertionError(f"node '{node}' of target {self.hosts.name} is a host, not a namespace here: "
                             "a test that enters namespaces must not be marked hardware")

    def where(self, node: str) -> str:
        return f"{node} ({self.hosts.node(node).ssh})"

    def argv(self, node: str, argv: list[str] | tuple[str, ...]) -> list[str]:
        return list(self.hosts.ssh_argv(node, argv))

    def python_command(self, node: str, module: str, *args: str) -> list[str]:
        return list(self.hosts.python_argv(node, module, *args))

    def ifname(self, node: str, ifname: str) -> str:
        return self.hosts.node(node).ifname(ifname)

    def mac(self, node: str, ifname: str) -> str:
        return str(self.hosts.mac(node, ifname))

    def capture(self, node: str, ifname: str, path: Path, snaplen: int = 512) -> AbstractContextManager[Any]:
        """On a node that says capture = false (a hardware router), the test is skipped."""
        import pytest


        if node not in self.hosts.nodes or not self.hosts.node(node).capture:
            pytest.skip(f"this test captures on {node}'s {ifname}, which target {self.hosts.name} "
                        f"cannot (no [nodes.{node}] or capture = false)")
        return RemoteCapture(self.hosts, node, ifname, path, snaplen=snaplen)

    def write(self, node: str, path: str, text: str) -> None:
        self.hosts.write(node, path, text)

    def node_path(self, local: Path, name: str) -> str:
        return f"/tmp/{name}"

    def link_overrides(self, node: str) -> dict[str, str]:
        from lab.lbconf import lb_link  # lab.lbconf brings numpy and pyroute2; every pytest run imports this module

        lb_if, peer, peer_if = lb_link(self.topology, node)
        return {"ifname": self.ifname(node, lb_if), "nexthop_mac": self.mac(peer, peer_if)}


@dataclass
class LabBalancer:
    """l4lab's balancer loaded in a lab's LB node through lbctl, configured for one encap id."""

    lab: Lab
    node: str
    encap_id: str
    config_path: Path

    @property
    def instance(self) -> str:
        return f"{self.lab.name}-{self.node}"

    def lbctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.lab.python(self.node, "balancer.cli", "--instance", self.instance, *args, check=check)

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.lbctl("stats", "--json").stdout)
        return result

    @property
    def config_file(self) -> str:
        """Where the node reads its config: the test's tmp path here, /tmp on a target host."""
        return self.lab.node_path(self.config_path, f"{self.instance}-{self.encap_id}.toml")

    def write_config(self, config: Config) -> None:
        from balancer import config as cfg  # the config parser brings numpy; every pytest run imports this module

        text = cfg.dump(config)
        self.config_path.write_text(text)
        self.lab.write(self.node, self.config_file, text)

    def apply(self, config: Config) -> None:
        self.write_config(config)
        self.lbctl("apply", self.config_file)

    def config_for(self, encap_id: str | None = None, **kwargs: Any) -> Config:
        # lab.lbconf brings numpy and pyroute2; every pytest run imports this module
        from lab.lbconf import balancer_config

        case = by_id(encap_id or self.encap_id)
        fam, mode = case.vip_family, case.config_name
        for key, value in self.lab.link_overrides(self.node).items():
            kwargs.setdefault(key, value)
        return balancer_config(self.lab.topology, self.lab.name, encaps={fam: mode}, lb=self.node, **kwargs)

    @property
    def family(self) -> int:
        return by_id(self.encap_id).vip_family

    def load(self, mode: str = "native") -> None:
        """Write the encap's config and load lbctl on the node's link to its peer."""
        from lab.lbconf import lb_link  # lab.lbconf brings numpy and pyroute2; every pytest run imports this module

        self.write_config(self.config_for())
        ifname = self.lab.ifname(self.node, lb_link(self.lab.topology, self.node)[0])
        self.lbctl("load", "--interface", ifname, "--mode", mode, "--config", self.config_file)
