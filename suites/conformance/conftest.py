"""Conformance against a device under test (DUT): the `dut` fixture, `needs` marker and the matrix record.

    @pytest.mark.needs(Capability.CONSISTENT_HASHING)
    def test_x(dut, dut_encap):
        dut.configure(dut_encap)

`--dut NAME` (l4lab by default; lab/dut/__init__.py lists the others) chooses what the tests that take
`dut` grade. Every test here declares the capabilities it needs; a test that drives l4lab's own
controller (the `balancer` fixture) names in `needs` the ability only l4lab offers it (owner
query, counters per reason, ...). Whether a test applies is decided before its fixtures run, from
what the DUT declares (lab/dut.capabilities_of): where the DUT lacks one of its `needs` (or its
encap) it ends as "not applicable: <capability>" — a skip with that reason, recorded as such in
the matrix, never a pass. Against a foreign DUT, a test that neither takes `dut` nor names a
capability that DUT lacks stops the collection: it would grade l4lab under the DUT's name.

A test that fails against a foreign DUT is a *finding* about that DUT: it is recorded with the
DUT's own evidence (its counters and tables) and shown as an expected failure, so that the suite
goes on; against l4lab a failure stays a failure. Every outcome is written as a conformance result
(reports/schema.py) carrying the DUT's name, which `l4lab conform` gathers into the matrix.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from balancer.encaps import SAME_FAMILY, EncapCase, by_id
from lab.dut import Dut, capabilities_of, encap_capability, make_dut
from reports.schema import ConformanceFigure, ConformancePayload, Kind, case_id, write_result

NOT_APPLICABLE = "not applicable: "
HERE = Path(__file__).resolve().parent
_DUT = pytest.StashKey[Dut]()
_DUT_NAME = pytest.StashKey[str]()
_NOT_APPLICABLE = pytest.StashKey[str]()
_FIGURES = pytest.StashKey[list[ConformanceFigure]]()
_T0 = pytest.StashKey[float]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs(*capabilities): the DUT capabilities a test needs (lab/dut/__init__.py)")


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
    """Decide every conformance test's applicability to the DUT up front, from what it declares."""
    name = config.getoption("--dut")
    capabilities = capabilities_of(name, config.getoption("--ipvs-scheduler"))
    unfit: list[str] = []
    for item in items:
        if not item.path.is_relative_to(HERE):
            continue
        item.stash[_DUT_NAME] = name
        if not any(True for _ in item.iter_markers("needs")) and "dut" not in item.fixturenames:
            unfit.append(f"{item.nodeid}: no needs marker")
            continue
        missing = [c for c in needs_of(item) if c not in capabilities]
        if missing:
            item.stash[_NOT_APPLICABLE] = NOT_APPLICABLE + missing[0]
        elif name != "l4lab" and "dut" not in item.fixturenames:
            unfit.append(f"{item.nodeid}: drives l4lab's controller, yet needs nothing {name} lacks")
    if unfit:
        raise pytest.UsageError("conformance tests must declare what they need (suites/conformance/conftest.py): "
                                + "; ".join(unfit[:5]))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Not applicable before any fixture runs (no lab is built, no VM booted, for a test that cannot apply)."""
    if _DUT_NAME in item.stash:
        item.stash[_T0] = time.monotonic()
    reason = item.stash.get(_NOT_APPLICABLE, None)
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def dut(request: pytest.FixtureRequest, lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dut]:
    """Name: dut. Scope: module. Depends: lab.

    The DUT named by --dut, attached to the module's lab (unconfigured: tests call configure)::

        def test_x(dut, dut_encap):
            dut.configure(dut_encap)
            print(dut.forwarded())
    """
    name = request.config.getoption("--dut")
    device = make_dut(name, lab, tmp_path_factory.mktemp(f"dut-{name}"),
                      ipvs_scheduler=request.config.getoption("--ipvs-scheduler"))
    with device:
        yield device


@pytest.fixture
def dut_figures(request: pytest.FixtureRequest) -> list[ConformanceFigure]:
    """Name: dut_figures. Scope: function. Depends: nothing.

    Figures the test measured and asserted; they go into its conformance result beside the DUT's::

        def test_x(dut, dut_encap, dut_figures):
            dut_figures.append(ConformanceFigure("collateral", 0.0, "%"))
    """
    figures: list[ConformanceFigure] = []
    request.node.stash[_FIGURES] = figures
    return figures


@pytest.fixture(params=SAME_FAMILY)
def dut_encap(request: pytest.FixtureRequest, dut: Dut) -> EncapCase:
    """Name: dut_encap. Scope: function. Depends: dut.

    Each encap id in turn; "not applicable" where the DUT cannot encapsulate so::

        def test_x(dut, dut_encap):
            dut.configure(dut_encap)
    """
    encap_id = by_id(request.param)
    missing = dut.missing([encap_capability(encap_id)])
    if missing:
        pytest.skip(NOT_APPLICABLE + missing[0])
    return encap_id


@pytest.fixture(autouse=True)
def _needs(request: pytest.FixtureRequest) -> None:
    """A test that takes `dut` is not applicable where the attached DUT lacks what it needs (decided
    up front already from what the DUT declares; this checks the attached one); its DUT is kept
    for the evidence of a failure."""
    if "dut" not in request.fixturenames:
        return
    device: Dut = request.getfixturevalue("dut")
    request.node.stash[_DUT] = device
    missing = device.missing(needs_of(request.node))
    if missing:
        pytest.skip(NOT_APPLICABLE + missing[0])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    name = item.stash.get(_DUT_NAME, None)
    device = item.stash.get(_DUT, None)
    if name is None or rep.when not in ("setup", "call"):
        return rep
    if rep.when == "setup" and not rep.skipped:
        return rep
    encap_id = _encap_param(item)
    if encap_id not in SAME_FAMILY:
        encap_id = None
    detail = ""
    if rep.skipped:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        reason = reason.removeprefix("Skipped: ")
        outcome = "not-applicable" if reason.startswith(NOT_APPLICABLE) else "skip"
        detail = reason
    elif rep.failed:
        outcome = "fail"
        detail = rep.longreprtext[-1500:]
        if device is not None:
            detail += f"\n--- {device.name} says ---\n{device.evidence()[:2500]}"
        if name != "l4lab":
            # A finding about a foreign DUT: recorded with its evidence, shown as an expected failure.
            rep.outcome = "skipped"
            rep.wasxfail = f"finding about {name}: {_first_line(rep.longreprtext)}"
    else:
        outcome = "pass"
    t0 = item.stash.get(_T0, time.monotonic())
    test = _row_name(item)
    figures = item.stash.get(_FIGURES, []) if outcome == "pass" else []
    payload = ConformancePayload(test=test, encap=encap_id, outcome=outcome, dut=name,  # type: ignore[arg-type]
                                 detail=detail, duration_s=round(max(0.0, time.monotonic() - t0), 3),
                                 figures=list(figures))
    write_result(Kind.CONFORMANCE, case_id(getattr(item, "originalname", item.name), encap_id, *_more(item), name),
                 payload)
    return rep


def _row_name(item: pytest.Item) -> str:
    """The matrix row of `item`: its function, with its parameters other than the encap
    (`test_encap_on_the_wire[flow]`), so that each variant keeps its own row."""
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
