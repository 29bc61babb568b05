"""Devices under test (DUTs): every L4 load balancer the conformance checks grade the same way, from outside.

One registry, `DUTS`, names them; `make_dut`, `capabilities_of`, `make_fleet`, `l4lab conform` and
pytest's `--dut` choices all read it. The interface is lab/dut/base.py; one module per DUT holds
its adapter (lab/dut/l4lab.py, ipvs.py, katran.py) and one data file its deviations and what it
lacks (lab/dut/<name>.toml); the pytest pieces are lab/dut/pytest_plugin.py.

Example::

    dut = make_dut("ipvs", lab, workdir)
    with dut:
        dut.configure("ip4-gue0")
        before = dut.forwarded()
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from lab.dut.base import Capability, Dut, HealthCheck, LabLike, LbLink, encap_capability
from lab.dut.fleet import Fleet
from lab.dut.ipvs import IpvsDut
from lab.dut.katran import KatranDut
from lab.dut.l4lab import L4labDut
from lab.errors import UsageError

DUTS: dict[str, type[Dut]] = {"l4lab": L4labDut, "ipvs": IpvsDut, "katran": KatranDut}
DUT_NAMES = tuple(DUTS)

__all__ = ["DUTS", "DUT_NAMES", "Capability", "Dut", "Fleet", "HealthCheck", "IpvsDut", "KatranDut",
           "L4labDut", "LabLike", "LbLink", "capabilities_of", "dut_class", "encap_capability", "make_dut",
           "make_fleet"]


def dut_class(name: str) -> type[Dut]:
    """The adapter class of DUT `name`; UsageError naming the choices otherwise."""
    try:
        return DUTS[name]
    except KeyError:
        raise UsageError(f"unknown DUT {name!r}: choose one of {', '.join(DUTS)}") from None


def capabilities_of(name: str, options: Mapping[str, str] | None = None) -> frozenset[str]:
    """What DUT `name` can do with `options`, without attaching it (applicability is decided up front)."""
    return dut_class(name).capabilities_for(options or {})


def make_dut(name: str, lab: LabLike, workdir: Path, options: Mapping[str, str] | None = None) -> Dut:
    """DUT `name` for `lab` (options: IPVS's `control` and `scheduler`, as --ipvs-control/--ipvs-scheduler)."""
    return dut_class(name)(lab, workdir, options)


def make_fleet(name: str, lab: LabLike, workdir: Path, options: Mapping[str, str] | None = None,
               count: int = 2) -> Fleet:
    """`count` instances of DUT `name` behind the router's ECMP (topology multi-lb)."""
    return dut_class(name).fleet(lab, workdir, options or {}, count)
