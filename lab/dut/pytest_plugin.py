"""The DUT's pytest pieces: --dut and its options, the `needs` marker, the `dut` fixtures and the verdicts.

    @pytest.mark.needs(Capability.CONSISTENT_HASHING)
    def test_x(dut, dut_encap):
        dut.configure(dut_encap)

A *check* is a test that takes `dut` or `dut_fleet`: it grades the DUT named by `--dut` from the
outside and is a row of `l4lab conform`'s matrix. Whether it applies is decided before any
fixture runs, from what the DUT declares (lab/dut/spec.py): where the DUT lacks one of its
`needs` (or its encap) it is "not applicable: <capability>", with the DUT data file's reference;
no lab is built, no VM booted. Other tests with a `needs` marker are l4lab's extras: they drive
l4lab's own controller and internals, run only against l4lab, and are no row of the matrix
(under a foreign DUT they are deselected, not n/a). `--conform` runs the checks alone.

Every check's outcome is one of four verdicts (lab/dut/verdict.py) and is written as a
conformance result (reports/schema.py) with the DUT's name, build, evidence and reference, and the
conform run it belongs to ($L4LAB_CONFORM_RUN). A finding about a foreign DUT is shown as an
expected failure, so that the suite goes on; an error fails the run, whichever the DUT.
Loaded by lab.pytest_plugin.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from balancer.encaps import SAME_FAMILY, EncapCase, by_id
from lab.dut import DUTS, Dut, Fleet, capabilities_of, dut_class, encap_capability, make_dut, make_fleet
from lab.dut.fleet import evidence_limit
from lab.dut.verdict import NOT_APPLICABLE, Verdict, combine, failure_verdict, skip_verdict
from reports.schema import ConformanceFigure, ConformancePayload, Kind, case_id, write_result

RUN_ENV = "L4LAB_CONFORM_RUN"
CHECK_FIXTURES = ("dut", "dut_fleet")
_DEVICE = pytest.StashKey[Any]()
_NOT_APPLICABLE = pytest.StashKey[str]()
_FIGURES = pytest.StashKey[list[ConformanceFigure]]()
_PHASES = pytest.StashKey[dict[str, tuple[Verdict, str]]]()
_T0 = pytest.StashKey[float]()
_EVIDENCE = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dut", "devices under test (lab/dut)")
    group.addoption("--dut", choices=tuple(DUTS), default=os.environ.get("L4LAB_DUT") or "l4lab",
                    help="the load balancer the conformance checks grade (lab/dut/__init__.py): l4lab (default), "
                         "ipvs (Linux IPVS in a qemu VM) or katran (built from $L4LAB_KATRAN_SRC); default $L4LAB_DUT")
    group.addoption("--ipvs-control", choices=("keepalived", "ipvsadm"),
                    default=os.environ.get("L4LAB_IPVS_CONTROL") or "keepalived",
                    help="what drives IPVS for --dut ipvs: keepalived (default, as deployed) or ipvsadm alone; "
                         "default $L4LAB_IPVS_CONTROL")
    group.addoption("--ipvs-scheduler", default=os.environ.get("L4LAB_IPVS_SCHEDULER") or "mh:mh-port,mh-fallback",
                    help="IPVS scheduler and its flags for --dut ipvs: SCHEDULER[:FLAG,...], e.g. "
                         "mh:mh-port,mh-fallback (default), sh:sh-port, rr; default $L4LAB_IPVS_SCHEDULER")
    group.addoption("--conform", action="store_true",
                    help="run only the checks (the tests that take `dut` or `dut_fleet`), as `l4lab conform` does")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs(*capabilities): the DUT capabilities a test needs (lab/dut/base.py)")
    config.addinivalue_line("markers", "l4lab_only(why): takes the DUT, yet runs beside l4lab only and is no "
                                       "row of the matrix (a figure of another program on l4lab's lab)")


def dut_options(config: pytest.Config) -> dict[str, str]:
    """The DUT options the command line gives (IPVS's control plane and scheduler)."""
    return {"control": str(config.getoption("--ipvs-control")), "scheduler": str(config.getoption("--ipvs-scheduler"))}


def is_check(item: pytest.Item) -> bool:
    """A check grades the DUT from outside: it takes `dut` or `dut_fleet` (a row of the matrix),
    unless it says it runs beside l4lab only (`l4lab_only`)."""
    return (any(f in getattr(item, "fixturenames", ()) for f in CHECK_FIXTURES)
            and item.get_closest_marker("l4lab_only") is None)


def graded(item: pytest.Item) -> bool:
    """Whether `item` writes a conformance result: a check, or one of l4lab's extras (`needs`, no DUT)."""
    return is_check(item) or item.get_closest_marker("needs") is not None


def _encap_param(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    value = callspec.params.get("dut_encap", callspec.params.get("encap"))
    return str(value) if value is not None else None


def needs_of(item: pytest.Item) -> list[str]:
    """The capabilities `item` needs: its `needs` markers, then its encap's."""
    wanted = [str(c) for m in item.iter_markers("needs") for c in m.args]
    encap_id = _encap_param(item)
    if encap_id is not None and encap_id in SAME_FAMILY:
        wanted.append(encap_capability(encap_id))
    return wanted


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Checks: decide applicability up front. Extras (a `needs` marker, no DUT): l4lab's alone."""
    name = str(config.getoption("--dut"))
    capabilities = capabilities_of(name, dut_options(config))
    keep, dropped = [], []
    for item in items:
        if is_check(item):
            missing = [c for c in needs_of(item) if c not in capabilities]
            if missing:
                item.stash[_NOT_APPLICABLE] = NOT_APPLICABLE + missing[0]
            keep.append(item)
        elif config.getoption("--conform") or (name != "l4lab" and (item.get_closest_marker("needs")
                                                                     or item.get_closest_marker("l4lab_only"))):
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Not applicable before any fixture runs (no lab is built, no VM booted, for a check that cannot apply)."""
    if graded(item):
        item.stash[_T0] = time.monotonic()
        item.stash[_PHASES] = {}
    reason = item.stash.get(_NOT_APPLICABLE, None)
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def dut(request: pytest.FixtureRequest, lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dut]:
    """Name: dut. Scope: module. Depends: lab.

    The DUT named by --dut, attached to the module's lab (unconfigured: checks call configure)::

        def test_x(dut, dut_encap):
            dut.configure(dut_encap)
            print(dut.forwarded())
    """
    name = str(request.config.getoption("--dut"))
    device = make_dut(name, lab, tmp_path_factory.mktemp(f"dut-{name}"), dut_options(request.config))
    with device:
        yield device


@pytest.fixture(scope="module")
def dut_fleet(request: pytest.FixtureRequest, lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Name: dut_fleet. Scope: module. Depends: lab (topology multi-lb).

    Two instances of the DUT named by --dut behind the router's ECMP (lab/dut/fleet.py)::

        def test_x(dut_fleet):
            dut_fleet.configure("ip4-ipip")
            dut_fleet.withdraw(0)
    """
    name = str(request.config.getoption("--dut"))
    fleet = make_fleet(name, lab, tmp_path_factory.mktemp(f"fleet-{name}"), dut_options(request.config))
    with fleet:
        yield fleet


@pytest.fixture
def dut_figures(request: pytest.FixtureRequest) -> list[ConformanceFigure]:
    """Name: dut_figures. Scope: function. Depends: nothing.

    Figures the check measured and asserted; they go into its conformance result::

        def test_x(dut, dut_encap, dut_figures):
            dut_figures.append(ConformanceFigure("collateral", 0.0, "%"))
    """
    figures: list[ConformanceFigure] = []
    request.node.stash[_FIGURES] = figures
    return figures


@pytest.fixture(params=SAME_FAMILY)
def dut_encap(request: pytest.FixtureRequest) -> EncapCase:
    """Name: dut_encap. Scope: function. Depends: nothing (the encap's applicability is decided up front).

    Each encap id in turn; `@pytest.mark.parametrize("dut_encap", [IP4_IPIP], indirect=True)` picks some::

        def test_x(dut, dut_encap):
            dut.configure(dut_encap)
    """
    return by_id(request.param)


@pytest.fixture(autouse=True)
def _needs(request: pytest.FixtureRequest) -> None:
    """The check's DUT is told what the check needs (it may build for it) and kept for the evidence."""
    for fixture in CHECK_FIXTURES:
        if fixture in request.fixturenames:
            device = request.getfixturevalue(fixture)
            request.node.stash[_DEVICE] = device
            for member in getattr(device, "members", [device]):
                member.wanted = frozenset(needs_of(request.node))


def _phase(item: pytest.Item, call: pytest.CallInfo[None], rep: pytest.TestReport) -> tuple[Verdict, str]:
    """The verdict of one phase and what it says."""
    if rep.skipped:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        reason = reason.removeprefix("Skipped: ")
        if not is_check(item) and not reason.startswith(NOT_APPLICABLE):
            return "skip", f"did not run: {reason}"  # type: ignore[return-value]  # an extra: no verdict of a DUT
        return skip_verdict(reason), reason if reason.startswith(NOT_APPLICABLE) else f"did not run: {reason}"
    if not rep.failed:
        return "pass", ""
    excinfo = call.excinfo
    verdict: Verdict = "error"
    if rep.when == "call" and excinfo is not None:
        verdict = failure_verdict(excinfo.value, (Path(str(e.path)) for e in excinfo.traceback), item.path.parent)
    return verdict, rep.longreprtext[-1500:]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    phases = item.stash.get(_PHASES, None)
    if phases is None:
        return rep
    verdict, text = _phase(item, call, rep)
    phases[rep.when] = (verdict, text)
    device = item.stash.get(_DEVICE, None)
    if verdict in ("finding", "error") and device is not None and _EVIDENCE not in item.stash:
        item.stash[_EVIDENCE] = _evidence(device)  # now: a module's last check sees its DUT stopped at teardown
    name = str(item.config.getoption("--dut")) if is_check(item) else "l4lab"
    if verdict == "finding" and name != "l4lab":
        # A finding about a foreign DUT is its grade, not a failure of the run: an expected failure.
        rep.outcome = "skipped"
        rep.wasxfail = f"finding about {name}: {_first_line(rep.longreprtext)}"
    if rep.when == "teardown":
        _write(item, name, phases)
    return rep


def _write(item: pytest.Item, name: str, phases: dict[str, tuple[Verdict, str]]) -> None:
    """The check's conformance result, from its phases."""
    verdict = combine(*(phases[p][0] if p in phases else None for p in ("setup", "call", "teardown")))
    if "call" not in phases and verdict == "pass":
        verdict = "error"  # set up, never called: cannot happen, never a pass
    detail = "\n".join(text for _, text in phases.values() if text)
    device = item.stash.get(_DEVICE, None)
    if verdict in ("finding", "error") and device is not None:
        said = item.stash[_EVIDENCE] if _EVIDENCE in item.stash else _evidence(device)
        detail += f"\n--- {name} says ---\n{said[:evidence_limit(device)]}"
    encap_id = _encap_param(item)
    if encap_id not in SAME_FAMILY:
        encap_id = None
    options = dut_options(item.config)
    cls = dut_class(name)
    reference = ""
    if verdict == "not-applicable":
        capability = detail.removeprefix(NOT_APPLICABLE).split()[0] if detail else ""
        reference = cls.spec().reference(capability, cls.variant(options))
    build = _build(device) if device is not None else cls.spec().product
    t0 = item.stash.get(_T0, time.monotonic())
    figures = item.stash.get(_FIGURES, []) if verdict == "pass" else []
    payload = ConformancePayload(test=_row_name(item), encap=encap_id, outcome=verdict, dut=name,  # type: ignore[arg-type]
                                 detail=detail, duration_s=round(max(0.0, time.monotonic() - t0), 3),
                                 figures=list(figures), run=os.environ.get(RUN_ENV, ""), reference=reference,
                                 build=build)
    write_result(Kind.CONFORMANCE, case_id(getattr(item, "originalname", item.name), encap_id, *_more(item), name),
                 payload)


def _evidence(device: Any) -> str:
    try:
        return str(device.evidence())
    except Exception as exc:  # noqa: BLE001 - evidence is best effort, never a second failure
        return f"the DUT's evidence could not be read: {exc}"


def _build(device: Any) -> str:
    member = getattr(device, "members", [device])[0]
    try:
        return str(member.build_info())
    except Exception as exc:  # noqa: BLE001 - as _evidence
        return f"unknown ({exc})"


def _row_name(item: pytest.Item) -> str:
    """The matrix row of `item`: its function, with its parameters other than the encap
    (`test_restart[crash]`), so that each variant keeps its own row."""
    test = str(getattr(item, "originalname", item.name))
    more = _more(item)
    return f"{test}[{'-'.join(more)}]" if more else test


def _more(item: pytest.Item) -> list[str]:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return []
    return [str(v) for k, v in callspec.params.items() if k not in ("dut_encap", "encap")]


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("E "):
            return line[1:].strip()[:200]
    return text.strip().splitlines()[-1][:200] if text.strip() else "failed"
