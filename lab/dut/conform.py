"""`l4lab conform`: the same conformance checks against each device under test, as one matrix.

    l4lab conform --dut l4lab --dut ipvs        # prints the matrix, writes results and the report

For every DUT the conformance suites (suites/conformance unless --tests says otherwise) run in
their own pytest process with `--dut NAME`; each test writes one conformance result carrying the
DUT (suites/conformance/conftest.py), and a test that needs what the DUT lacks is decided "not
applicable" before any lab is built. The matrix is built from those results only: a cell is
`pass`, `fail` (l4lab), `finding` (a foreign DUT failed: the evidence is in the result),
`n/a: <capability>` or `skip: <why>`. A foreign DUT's column must hold nothing but pass, finding
with its evidence, and n/a naming a capability (`column_problems`). Exit 0 when every DUT's run
completed, l4lab failed nothing and every foreign column is so; 1 otherwise (a foreign DUT's
findings do not fail the run, they are its grade).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from lab.dut import DUT_NAMES
from lab.errors import UsageError
from reports.schema import ConformancePayload, Kind, Result, load_results, results_dir

REPO = Path(__file__).resolve().parent.parent.parent
DEFAULT_TESTS = "suites/conformance"


@dataclass(frozen=True)
class Cell:
    """One test × encap × DUT outcome as the matrix shows it, with the detail behind it."""

    outcome: str
    detail: str

    @property
    def label(self) -> str:
        if self.outcome == "not-applicable":
            return "n/a: " + self.detail.removeprefix("not applicable: ")
        if self.outcome == "skip":
            return "skip: " + self.detail
        return self.outcome


def cell_of(payload: ConformancePayload) -> Cell:
    """The matrix cell of one result: a foreign DUT's failure is a finding about that DUT."""
    outcome: str = payload.outcome
    if outcome == "fail" and payload.dut != "l4lab":
        outcome = "finding"
    return Cell(outcome, payload.detail)


def build_matrix(results: Sequence[Result]) -> dict[tuple[str, str], dict[str, Cell]]:
    """{(test, encap): {dut: cell}} from conformance results (the newest per test, encap and DUT)."""
    matrix: dict[tuple[str, str], dict[str, Cell]] = {}
    for result in sorted(results, key=lambda r: r.time):
        payload = result.payload
        if result.kind is not Kind.CONFORMANCE or not isinstance(payload, ConformancePayload):
            continue
        matrix.setdefault((payload.test, payload.encap or "-"), {})[payload.dut] = cell_of(payload)
    return dict(sorted(matrix.items()))


def column_problems(matrix: dict[tuple[str, str], dict[str, Cell]], dut: str) -> list[str]:
    """What is wrong with a foreign DUT's column: a cell not run, skipped, a finding without the
    DUT's evidence or a "not applicable" that names no capability. Empty: the column is sound."""
    problems = []
    for (test, encap), cells in matrix.items():
        cell = cells.get(dut)
        where = f"{dut} {test}[{encap}]"
        if cell is None:
            problems.append(f"{where}: not run")
        elif cell.outcome == "finding" and f"--- {dut} says ---" not in cell.detail:
            problems.append(f"{where}: a finding without {dut}'s evidence")
        elif cell.outcome == "not-applicable" and not cell.detail.removeprefix("not applicable: ").strip():
            problems.append(f"{where}: not applicable, naming no capability")
        elif cell.outcome not in ("pass", "finding", "not-applicable"):
            problems.append(f"{where}: {cell.label}")
    return problems


def render_matrix(matrix: dict[tuple[str, str], dict[str, Cell]], duts: Sequence[str]) -> str:
    """The matrix as a text table, then each finding and failure with the first line of its evidence."""
    width = max([len(t) for t, _ in matrix] + [4])
    head = f"{'test':<{width}}  {'encap':<11}" + "".join(f"  {d:<22}" for d in duts)
    lines = [head, "-" * len(head)]
    notes: list[str] = []
    for (test, encap), cells in matrix.items():
        row = f"{test:<{width}}  {encap:<11}"
        for dut in duts:
            cell = cells.get(dut)
            row += f"  {(cell.label if cell else 'not run')[:22]:<22}"
            if cell is not None and cell.outcome in ("fail", "finding"):
                first = next((ln[1:].strip() for ln in cell.detail.splitlines() if ln.startswith("E ")),
                             cell.detail.strip().splitlines()[0] if cell.detail.strip() else "")
                notes.append(f"{dut} {test}[{encap}]: {first[:160]}")
        lines.append(row)
    if notes:
        lines += ["", "findings and failures (the evidence is in each result's detail):"]
        lines += [f"  {n}" for n in notes]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="l4lab conform", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--dut", action="append", choices=DUT_NAMES,
                    help="a device under test (repeat for several; default l4lab)")
    ap.add_argument("--tests", default=DEFAULT_TESTS, help=f"pytest path of the checks (default {DEFAULT_TESTS})")
    ap.add_argument("-k", dest="keyword", help="only the tests pytest -k selects")
    ap.add_argument("--results", help="results directory (default $L4LAB_RESULTS or results/)")
    ap.add_argument("--out", help="where to write the HTML report (default reports/out/index.html)")
    ap.add_argument("--no-report", action="store_true", help="print the matrix only")
    args = ap.parse_args(argv)
    duts = args.dut or ["l4lab"]
    tests = REPO / args.tests
    if not tests.exists():
        raise UsageError(f"cannot find the conformance tests {tests}: l4lab conform runs from a checkout "
                         "of the project (its suites/ folder)")
    main_dir = results_dir(args.results)
    run_dir = main_dir / "conform" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir.mkdir(parents=True, exist_ok=True)
    codes: dict[str, int] = {}
    for dut in duts:
        print(f"conform: {dut}: running {args.tests}", flush=True)
        cmd = [sys.executable, "-m", "pytest", str(tests), "--dut", dut, "-q", "-rsx", "-p", "no:cacheprovider"]
        if args.keyword:
            cmd += ["-k", args.keyword]
        codes[dut] = subprocess.run(cmd, cwd=REPO, env=os.environ | {"L4LAB_RESULTS": str(run_dir)},
                                    check=False).returncode
    results = load_results(run_dir) if any(run_dir.glob("*.json")) else []
    matrix = build_matrix(results)
    print()
    print(render_matrix(matrix, duts) if matrix else "no conformance results were written")
    for path in run_dir.glob("*.json"):
        shutil.copy2(path, main_dir / path.name)
    broken = {d: c for d, c in codes.items() if c != 0}
    l4lab_failed = any(c.get("l4lab") and c["l4lab"].outcome == "fail" for c in matrix.values())
    unsound = [p for d in duts if d != "l4lab" for p in column_problems(matrix, d)]
    if unsound:
        print(f"\nconform: {len(unsound)} cells of a foreign DUT are neither pass, finding with evidence nor "
              "not applicable with a capability:", file=sys.stderr)
        for problem in unsound[:20]:
            print(f"  {problem}", file=sys.stderr)
    if not args.no_report:
        from reports import render

        render_args = ["--results", str(main_dir)] + (["--out", args.out] if args.out else [])
        render.main(render_args)
    print(f"\nresults: {run_dir}")
    if broken:
        print("conform: the run of " + ", ".join(f"{d} (pytest exit {c})" for d, c in broken.items())
              + " did not complete cleanly; see its output above", file=sys.stderr)
    return 1 if broken or l4lab_failed or unsound or not matrix else 0
