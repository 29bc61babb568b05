"""What a running lab is made of, persisted as JSON in /run/l4lab/<lab>/state.json.

The undo journal lists every resource the build created, in creation order, written the moment
each one exists: `l4lab down` in another process (or after `l4lab up` was killed) replays it in
reverse and removes exactly that lab. Addresses, routes and sysctls live inside a node's
namespace and go with it, so they have no journal entry.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lab.errors import LabNotFoundError, UsageError

RUN_DIR = Path("/run/l4lab")
BPF_DIR = Path("/sys/fs/bpf/l4lab")
DEFAULT_LAB = "l4lab"
LAB_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,23}$")

# Journal kinds, in the order a build creates them.
UNDO_KINDS = ("state-dir", "netns", "veth", "pin-dir", "pin", "process", "balancer")


def check_name(lab: str) -> str:
    if not LAB_NAME_RE.match(lab):
        raise UsageError(
            f"lab name '{lab}' is invalid: use 1..24 lower-case letters, digits and '-', "
            "starting with a letter"
        )
    return lab


def netns_name(lab: str, node: str) -> str:
    return f"{lab}-{node}"


def state_dir(lab: str) -> Path:
    return RUN_DIR / lab


def pin_dir(lab: str) -> Path:
    return BPF_DIR / lab


@dataclass
class Undo:
    """One journal entry: a resource and what identifies it for removal."""

    kind: str  # one of UNDO_KINDS
    target: str  # a path, a netns name, an interface name or a pid
    netns: str | None = None  # veth: the namespace that holds it
    starttime: int | None = None  # process: /proc/<pid>/stat start time, guards against pid reuse


@dataclass
class Program:
    """A BPF program attached in the lab, pinned so that it outlives `l4lab up`."""

    node: str
    ifname: str
    hook: str  # "xdp" or "tc-ingress"
    object: str
    program: str
    pin: str


@dataclass
class Process:
    """A background process of the lab (a node's services, a VM and its supervisor, an FRR daemon)."""

    node: str
    pid: int
    starttime: int
    argv: list[str]
    log: str


@dataclass
class LabState:
    """A lab's name, topology, journal and what status reports."""

    name: str
    topology: str
    topology_path: str
    created: float
    complete: bool = False
    undo: list[Undo] = field(default_factory=list)
    programs: list[Program] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    vm_boot_seconds: dict[str, float] = field(default_factory=dict)  # VM real -> qemu start to ready
    vm_guest_uptime: dict[str, float] = field(default_factory=dict)  # VM real -> its uptime when ready
    bgp_established_seconds: float | None = None  # FRR start to every BGP session Established
    builder_pid: int = 0  # the process that built it (0: a state file written before this field)
    builder_start: int | None = None  # its /proc start time: a later process with its pid is not it

    @property
    def path(self) -> Path:
        return state_dir(self.name) / "state.json"

    def save(self) -> None:
        """Write the state atomically (a reader never sees half a file)."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, self.path)

    @classmethod
    def load(cls, lab: str) -> LabState:
        path = state_dir(lab) / "state.json"
        try:
            raw: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise LabNotFoundError(
                f"no lab named '{lab}' is up ({path} does not exist); start one with `l4lab up`"
            ) from exc
        except json.JSONDecodeError as exc:
            raise LabNotFoundError(f"lab '{lab}' has a damaged state file {path}: {exc}") from exc
        return cls(
            name=raw["name"],
            topology=raw["topology"],
            topology_path=raw["topology_path"],
            created=raw["created"],
            complete=raw["complete"],
            undo=[Undo(**u) for u in raw["undo"]],
            programs=[Program(**p) for p in raw["programs"]],
            processes=[Process(**p) for p in raw["processes"]],
            vm_boot_seconds=raw.get("vm_boot_seconds", {}),
            vm_guest_uptime=raw.get("vm_guest_uptime", {}),
            bgp_established_seconds=raw.get("bgp_established_seconds"),
            builder_pid=raw.get("builder_pid", 0),
            builder_start=raw.get("builder_start"),
        )


def running() -> list[str]:
    """Names of the labs that have state under /run/l4lab."""
    if not RUN_DIR.is_dir():
        return []
    return sorted(p.name for p in RUN_DIR.iterdir() if (p / "state.json").exists())
