"""The conformance matrix of `l4lab conform`: cells from results, findings for foreign DUTs only.

The DUT runs themselves are suites/conformance/test_dut.py (l4lab in the default run, IPVS in
`make test`'s `l4lab conform --dut ipvs`); here the matrix is built from results written by the
real schema code, so a wrong label or a lost cell fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from balancer.encaps import SAME_FAMILY
from lab.dut import Capability, IpvsDut, L4labDut, conform, encap_capability
from reports.schema import ConformancePayload, Kind, case_id, load_results, write_result

REPO = conform.REPO


def _write(tmp: Path, test: str, encap: str, dut: str, outcome: str, detail: str = "") -> None:
    payload = ConformancePayload(test=test, encap=encap, outcome=outcome, dut=dut, detail=detail,  # type: ignore[arg-type]
                                 duration_s=0.1)
    write_result(Kind.CONFORMANCE, case_id(test, encap, dut), payload, tmp)


def test_matrix_marks_foreign_failures_as_findings_and_names_missing_capabilities(tmp_path: Path) -> None:
    _write(tmp_path, "test_inner", "ip4-ipip", "l4lab", "pass")
    _write(tmp_path, "test_inner", "ip4-ipip", "ipvs", "fail", "E   AssertionError: ttl 63 -> 62\n--- ipvs says ---")
    _write(tmp_path, "test_inner", "ip4-gue1", "l4lab", "fail", "E   AssertionError: broken")
    _write(tmp_path, "test_inner", "ip4-gue1", "ipvs", "not-applicable", "not applicable: encap:ip4-gue1")
    matrix = conform.build_matrix(load_results(tmp_path))

    assert matrix[("test_inner", "ip4-ipip")]["l4lab"].label == "pass"
    assert matrix[("test_inner", "ip4-ipip")]["ipvs"].label == "finding"
    assert matrix[("test_inner", "ip4-gue1")]["l4lab"].label == "fail"
    assert matrix[("test_inner", "ip4-gue1")]["ipvs"].label == "n/a: encap:ip4-gue1"
    text = conform.render_matrix(matrix, ["l4lab", "ipvs"])
    assert "ipvs test_inner[ip4-ipip]: AssertionError: ttl 63 -> 62" in text
    assert "l4lab test_inner[ip4-gue1]: AssertionError: broken" in text


def test_a_dut_missing_from_a_row_reads_not_run(tmp_path: Path) -> None:
    _write(tmp_path, "test_dsr", "ip4-ipip", "l4lab", "pass")
    text = conform.render_matrix(conform.build_matrix(load_results(tmp_path)), ["l4lab", "ipvs"])
    row = next(line for line in text.splitlines() if line.startswith("test_dsr"))
    assert row.split()[2:] == ["pass", "not", "run"]


def test_capabilities_follow_what_each_dut_can_do(tmp_path: Path) -> None:
    l4lab = L4labDut(lab=None, workdir=tmp_path)  # type: ignore[arg-type]
    assert not l4lab.missing([encap_capability(e) for e in SAME_FAMILY])
    mh = IpvsDut(lab=None, workdir=tmp_path)  # type: ignore[arg-type]
    assert mh.missing([encap_capability("ip4-gue1")]) == ["encap:ip4-gue1"]  # IPVS's GUE is variant 0
    assert not mh.missing([Capability.CONSISTENT_HASHING, Capability.WEIGHTS])
    rr = IpvsDut(lab=None, workdir=tmp_path, scheduler="rr", flags=())  # type: ignore[arg-type]
    assert rr.missing([Capability.CONSISTENT_HASHING, Capability.WEIGHTS]) == \
        [Capability.CONSISTENT_HASHING, Capability.WEIGHTS]
    assert Capability.COUNTERS_PER_REASON in mh.missing([Capability.COUNTERS_PER_REASON])


def test_conform_refuses_a_path_without_the_suites(tmp_path: Path) -> None:
    from lab.errors import UsageError

    with pytest.raises(UsageError, match="cannot find the conformance tests"):
        conform.main(["--tests", "no/such/tests.py", "--results", str(tmp_path)])


def test_the_report_opens_with_the_dut_matrix_and_the_figures_side_by_side(tmp_path: Path) -> None:
    from reports import render
    from reports.schema import ConformanceFigure

    for dut, mtu in (("l4lab", 1480.0), ("ipvs", 1480.0)):
        payload = ConformancePayload(test="test_upload", encap="ip4-ipip", outcome="pass", dut=dut,  # type: ignore[arg-type]
                                     duration_s=0.1, figures=[ConformanceFigure("learnt MTU", mtu, "bytes")])
        write_result(Kind.CONFORMANCE, case_id("test_upload", "ip4-ipip", dut), payload, tmp_path)
    _write(tmp_path, "test_inner", "ip4-ipip", "ipvs", "fail", "E   AssertionError: ttl 63 -> 62")
    _write(tmp_path, "test_inner", "ip4-ipip", "l4lab", "pass")
    page = render.render_html(load_results(tmp_path))
    sections = page.split("<section ")[1:]
    assert sections[0].startswith('id="duts"'), "the DUT matrix is not the first section"
    matrix = sections[0]
    assert "finding" in matrix and "ttl 63 -&gt; 62" in matrix
    assert "learnt MTU (bytes)" in matrix and matrix.count(">1480<") == 2


def test_without_a_foreign_dut_the_report_has_no_dut_matrix(tmp_path: Path) -> None:
    from reports import render

    _write(tmp_path, "test_inner", "ip4-ipip", "l4lab", "pass")
    assert 'id="duts"' not in render.render_html(load_results(tmp_path))


def test_a_foreign_column_holds_only_pass_finding_with_evidence_or_not_applicable(tmp_path: Path) -> None:
    _write(tmp_path, "test_ok", "ip4-ipip", "ipvs", "pass")
    _write(tmp_path, "test_found", "ip4-ipip", "ipvs", "fail", "E   AssertionError: x\n--- ipvs says ---\nTCP 1")
    _write(tmp_path, "test_bare", "ip4-ipip", "ipvs", "fail", "E   AssertionError: no evidence")
    _write(tmp_path, "test_na", "ip4-ipip", "ipvs", "not-applicable", "not applicable: owner-query")
    _write(tmp_path, "test_na_blank", "ip4-ipip", "ipvs", "not-applicable", "not applicable: ")
    _write(tmp_path, "test_skipped", "ip4-ipip", "ipvs", "skip", "tshark is missing")
    _write(tmp_path, "test_l4lab_only", "ip4-ipip", "l4lab", "pass")
    problems = conform.column_problems(conform.build_matrix(load_results(tmp_path)), "ipvs")
    assert sorted(problems) == sorted([
        "ipvs test_bare[ip4-ipip]: a finding without ipvs's evidence",
        "ipvs test_na_blank[ip4-ipip]: not applicable, naming no capability",
        "ipvs test_skipped[ip4-ipip]: skip: tshark is missing",
        "ipvs test_l4lab_only[ip4-ipip]: not run",
    ])


def test_every_conformance_test_l4lab_alone_can_run_is_not_applicable_with_its_capability(tmp_path: Path) -> None:
    """The real conformance suites under IPVS, less the modules that attach it (test_dut.py,
    test_dsr.py: `make test`'s `l4lab conform --dut ipvs` runs those): every other test must be
    decided not applicable up front (no lab is built) and written so, naming the capability."""
    dut = "ipvs"
    here = REPO / "suites" / "conformance"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(here), "--dut", dut, "-q", "-p", "no:cacheprovider",
         "--ignore", str(here / "test_dut.py"), "--ignore", str(here / "test_dsr.py")],
        cwd=REPO, env=os.environ | {"L4LAB_RESULTS": str(tmp_path)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    collected = int(done.stdout.strip().splitlines()[-1].split()[0])
    results = load_results(tmp_path)
    assert len(results) == collected > 40, f"{len(results)} results for {collected} tests: {done.stdout[-1000:]}"
    matrix = conform.build_matrix(results)
    assert not conform.column_problems(matrix, dut)
    capabilities = {c.detail.removeprefix("not applicable: ") for cells in matrix.values() for c in cells.values()}
    assert all(c.outcome == "not-applicable" for cells in matrix.values() for c in cells.values())
    assert {Capability.OWNER_QUERY, Capability.COUNTERS_PER_REASON, Capability.MULTI_LB} <= capabilities


def test_every_conformance_test_declares_what_katran_lacks_or_takes_the_dut() -> None:
    """A test that would grade l4lab under another DUT's name (it does not take `dut` and needs
    nothing that DUT lacks) stops the collection (suites/conformance/conftest.py): Katran's must pass."""
    done = subprocess.run([sys.executable, "-m", "pytest", str(REPO / "suites" / "conformance"), "--dut", "katran",
                           "--collect-only", "-q", "-p", "no:cacheprovider"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
