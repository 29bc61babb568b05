"""spec.py: a DUT's data file (lab/dut/<name>.toml): how the suites configure it differently, and what it lacks.

As in openconfig featureprofiles, a *deviation* may change how a device is configured, never
whether a check runs; an optional feature the device lacks is *not applicable*, and says where
the device's own documentation or source shows the absence. One file per DUT:

    product = "Linux IPVS, driven by keepalived"

    [[deviations]]
    what = "mh-fallback on every virtual service"
    why = "ipvsadm(8): without it a real at weight 0 refuses the flows it hashes to"

    [[not_applicable]]
    capability = "encap:ip4-gue1"
    reference = "net/netfilter/ipvs/ip_vs_xmit.c ipvs_gue_encap(): a GUE header always (variant 0)"
    variant = "ipvsadm"          # optional: holds only for that variant of the DUT

A DUT can do every graded capability (lab/dut/base.py GRADED) but those listed; the matrix links
each n/a cell to its entry's line (`lab/dut/ipvs.toml:23`).
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path

from lab.dut.base import GRADED, Capability
from lab.errors import UsageError

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


class DutSpecError(UsageError):
    """A DUT data file is invalid: the message reads `FILE: KEY must be EXPECTED but got VALUE`."""


@dataclass(frozen=True)
class Deviation:
    """Something configured or built differently from the DUT's defaults, and why."""

    what: str
    why: str


@dataclass(frozen=True)
class NotApplicable:
    """A capability the DUT lacks, where its documentation or source shows it, and the file line."""

    capability: str
    reference: str
    line: int
    variant: str = ""

    def applies_to(self, variant: str) -> bool:
        """Whether the entry holds for `variant` (an entry without a variant holds for all)."""
        return not self.variant or self.variant in variant.split()


@dataclass(frozen=True)
class DutSpec:
    """One DUT's data file, parsed and checked."""

    name: str
    path: Path
    product: str
    deviations: tuple[Deviation, ...]
    not_applicable: tuple[NotApplicable, ...]

    @classmethod
    @functools.cache
    def load(cls, name: str, directory: Path = HERE) -> DutSpec:
        """The spec of DUT `name` from `directory`/`name`.toml; DutSpecError naming the key otherwise."""
        path = directory / f"{name}.toml"
        try:
            text = path.read_text()
        except OSError as exc:
            raise DutSpecError(f"{path}: cannot read the data file of DUT {name!r}: {exc.strerror}") from exc
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise DutSpecError(f"{path}: not TOML: {exc}") from exc
        return cls(name=name, path=path, product=_text(data, "product", path),
                   deviations=tuple(_deviation(d, i, path) for i, d in enumerate(_tables(data, "deviations", path))),
                   not_applicable=_not_applicable(data, text, path))

    def capabilities(self, variant: str = "") -> frozenset[str]:
        """Every graded capability but those this DUT lacks (in `variant`)."""
        return frozenset(GRADED - {n.capability for n in self.not_applicable if n.applies_to(variant)})

    def reference(self, capability: str, variant: str = "") -> str:
        """`lab/dut/<name>.toml:LINE: reference` of the entry saying the DUT lacks `capability`; "" if none."""
        for entry in self.not_applicable:
            if entry.capability == capability and entry.applies_to(variant):
                return f"{self.where(entry.line)}: {entry.reference}"
        return ""

    def where(self, line: int) -> str:
        """`lab/dut/<name>.toml:LINE`, relative to the checkout."""
        shown = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{shown}:{line}"


def _text(table: dict[str, object], key: str, path: Path, where: str = "") -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value.strip():
        raise DutSpecError(f"{path}: {where}{key} must be a non-empty string but got {value!r}")
    return value.strip()


def _tables(data: dict[str, object], key: str, path: Path) -> list[dict[str, object]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise DutSpecError(f"{path}: {key} must be an array of tables ([[{key}]]) but got {value!r}")
    return value


def _deviation(table: dict[str, object], index: int, path: Path) -> Deviation:
    where = f"deviations[{index}]."
    return Deviation(what=_text(table, "what", path, where), why=_text(table, "why", path, where))


def _not_applicable(data: dict[str, object], text: str, path: Path) -> tuple[NotApplicable, ...]:
    """The entries with the line of each `[[not_applicable]]` header (the n/a cell links there)."""
    lines = [n for n, line in enumerate(text.splitlines(), start=1) if line.strip() == "[[not_applicable]]"]
    known = sorted(GRADED | set(Capability))
    out = []
    for index, table in enumerate(_tables(data, "not_applicable", path)):
        where = f"not_applicable[{index}]."
        capability = _text(table, "capability", path, where)
        if capability not in known:
            raise DutSpecError(f"{path}: {where}capability must be one of {', '.join(known)} but got {capability!r}")
        variant = table.get("variant", "")
        if not isinstance(variant, str):
            raise DutSpecError(f"{path}: {where}variant must be a string but got {variant!r}")
        out.append(NotApplicable(capability=capability, reference=_text(table, "reference", path, where),
                                 line=lines[index] if index < len(lines) else 0, variant=variant))
    return tuple(out)
