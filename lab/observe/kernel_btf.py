"""The running kernel's own type information (/sys/kernel/btf/vmlinux): member offsets and enum names.

The tracer reads kernel structures (an skb's device, a device's namespace) by offset; taking the
offsets from the running kernel's BTF, rather than from C headers of another kernel version, keeps
those reads right on any kernel. `bpftool -j btf dump` does the parsing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from lab.errors import LabError

VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")
_TRANSPARENT = ("TYPEDEF", "CONST", "VOLATILE", "RESTRICT", "TYPE_TAG")


@dataclass(frozen=True)
class Field:
    """Where a member sits in its struct: its byte offset and the BTF id of its (resolved) type."""

    offset: int
    type_id: int


class KernelBtf:
    """The kernel's BTF types, looked up by name; loaded once, on first use."""

    def __init__(self, path: Path = VMLINUX_BTF) -> None:
        self.path = path

    @cached_property
    def _types(self) -> dict[int, dict[str, Any]]:
        bpftool = shutil.which("bpftool")
        if bpftool is None:
            raise LabError("cannot read the kernel's BTF: bpftool not found; run `bash scripts/setup.sh`")
        if not self.path.exists():
            raise LabError(
                f"cannot read the kernel's BTF: {self.path} does not exist; "
                "the kernel needs CONFIG_DEBUG_INFO_BTF=y"
            )
        done = subprocess.run(
            [bpftool, "-j", "btf", "dump", "file", str(self.path)],
            capture_output=True, text=True, check=False, timeout=60,
        )
        if done.returncode != 0:
            raise LabError(
                f"bpftool cannot dump {self.path}: {done.stderr.strip()}",
                command=f"bpftool -j btf dump file {self.path}",
                stderr=done.stderr,
            )
        return {t["id"]: t for t in json.loads(done.stdout)["types"]}

    @cached_property
    def _by_name(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for tid, t in self._types.items():
            out.setdefault((t["kind"], t.get("name", "")), tid)
        return out

    def _named(self, kind: str, name: str) -> dict[str, Any]:
        tid = self._by_name.get((kind, name))
        if tid is None:
            raise LabError(f"the kernel's BTF ({self.path}) has no {kind.lower()} '{name}'")
        return self._types[tid]

    def _resolve(self, type_id: int) -> dict[str, Any]:
        t = self._types[type_id]
        while t["kind"] in _TRANSPARENT:
            t = self._types[t["type_id"]]
        return t

    def _find(self, t: dict[str, Any], member: str, base: int) -> Field | None:
        for m in t.get("members", ()):
            offset = base + m["bits_offset"] // 8
            if m["name"] == member:
                return Field(offset, m["type_id"])
            if m["name"] == "(anon)":
                inner = self._resolve(m["type_id"])
                if inner["kind"] in ("STRUCT", "UNION"):
                    found = self._find(inner, member, offset)
                    if found is not None:
                        return found
        return None

    def offset(self, struct: str, path: str) -> int:
        """Byte offset of `path` ("nd_net.net", "ns.inum") in `struct` (anonymous members looked into)."""
        t = self._named("STRUCT", struct)
        total = 0
        where = f"struct {struct}"
        for part in path.split("."):
            found = self._find(t, part, 0)
            if found is None:
                raise LabError(f"the kernel's BTF has no member '{part}' in {where}; cannot trace on this kernel")
            total += found.offset
            t = self._resolve(found.type_id)
            where = f"{where}.{part}"
        return total

    def enum(self, name: str) -> dict[int, str]:
        """{value: name} of the kernel enum `name`."""
        t = self._named("ENUM", name)
        return {int(v["val"]): v["name"] for v in t["values"]}
