"""Conformance against a device under test (DUT): the `dut` fixture, `needs` marker and the matrix record.

    @pytest.mark.needs(Capability.CONSISTENT_HASHING)
    def test_x(dut, dut_encap):
        dut.configure(dut_encap)

`--dut NAME` (l4lab by default; lab/dut.py lists the others) chooses what the tests that take
`dut` grade. A test whose `needs` (or whose encap) the DUT lacks ends as "not applicable:
<capability>" — a skip with that reason, recorded as such in the matrix, never a pass. A test that
fails against a foreign DUT is a *finding* about that DUT: it is recorded with the DUT's own
evidence (its counters and tables) and shown as an expected failure, so that the suite goes on;
against l4lab a failure stays a failure. Every outcome is written as a conformance result
(reports/schema.py) carrying the DUT's name, which `l4lab conform` gathers into the matrix.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from balancer.encaps import SAME_FAMILY, EncapCase, by_id
from lab.dut import Dut, encap_capability, make_dut
from reports.schema import ConformanceFigure, ConformancePayload, Kind, case_id, write_result

NOT_APPLICABLE = "not applicable: "
_DUT = pytest.StashKey[Dut]()
_FIGURES = pytest.StashKey[list[ConformanceFigure]]()
_T0 = pytest.StashKey[float]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs(*capabilities): the DUT capabilities a test needs (lab/dut.py)")


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
    """Tests that take `dut` are not applicable where it lacks what their `needs` marker names;
    tests that drive l4lab's controller directly (the `balancer` fixture) apply to l4lab only."""
    if "dut" not in request.fixturenames:
        name = request.config.getoption("--dut")
        if name != "l4lab":
            pytest.skip(f"{NOT_APPLICABLE}{name}: this test drives l4lab's own controller (lbctl), "
                        "not the DUT interface")
        return
    device: Dut = request.getfixturevalue("dut")
    request.node.stash[_DUT] = device
    request.node.stash[_T0] = time.monotonic()
    wanted = [str(c) for m in request.node.iter_markers("needs") for c in m.args]
    missing = device.missing(wanted)
    if missing:
        pytest.skip(NOT_APPLICABLE + missing[0])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    device = item.stash.get(_DUT, None)
    if device is None or rep.when not in ("setup", "call"):
        return rep
    if rep.when == "setup" and not rep.skipped:
        return rep
    callspec = getattr(item, "callspec", None)
    encap_id = callspec.params.get("dut_encap") if callspec is not None else None
    detail = ""
    if rep.skipped:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        reason = reason.removeprefix("Skipped: ")
        outcome = "not-applicable" if reason.startswith(NOT_APPLICABLE) else "skip"
        detail = reason
    elif rep.failed:
        outcome = "fail"
        detail = f"{rep.longreprtext[-1500:]}\n--- {device.name} says ---\n{device.evidence()[:2500]}"
        if device.name != "l4lab":
            # A finding about a foreign DUT: recorded with its evidence, shown as an expected failure.
            rep.outcome = "skipped"
            rep.wasxfail = f"finding about {device.name}: {_first_line(rep.longreprtext)}"
    else:
        outcome = "pass"
    t0 = item.stash.get(_T0, time.monotonic())
    test = getattr(item, "originalname", item.name)
    figures = item.stash.get(_FIGURES, []) if outcome == "pass" else []
    payload = ConformancePayload(test=test, encap=encap_id, outcome=outcome, dut=device.name,  # type: ignore[arg-type]
                                 detail=detail, duration_s=round(max(0.0, time.monotonic() - t0), 3),
                                 figures=list(figures))
    write_result(Kind.CONFORMANCE, case_id(test, encap_id, device.name), payload)
    return rep


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("E "):
            return line[1:].strip()[:200]
    return text.strip().splitlines()[-1][:200] if text.strip() else "failed"
