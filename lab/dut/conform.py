"""`l4lab conform`: the same checks against each device under test, one matrix from one run.

    l4lab conform --dut l4lab --dut ipvs --dut katran     # the matrix, one JSON report per DUT, the HTML
    l4lab conform --compare OLD NEW                       # the cells that changed between two runs

For every DUT the checks (suites/conformance's tests that take `dut` or `dut_fleet`; l4lab's
extras are no part of it) run in a pytest process of their own with `--dut NAME --conform`, all
writing into one run directory (results/conform/<run>/); every check is one of four verdicts
(pass, finding, n/a with its reference, error: lab/dut/verdict.py). The matrix is built from that
run's results only (reports/conformance.py). Written: the run's results (also copied into the
results directory), reports/out/conformance/<dut>.json per DUT beside the HTML report, which shows
the matrix first. The last lines are one per DUT:

    conform: <dut> pass <P> applicable <A> findings <F> errors <E> na <N>

Exit 0 when no DUT has an error (a failed command, a run that did not complete, a check without a
result), l4lab has no finding and every n/a cites a reference; 1 otherwise. A foreign DUT's
findings do not fail the run: they are its grade.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from lab.dut import DUTS, dut_class
from lab.errors import UsageError
from lab.signals import run_forwarding
from reports.conformance import Matrix, changes
from reports.schema import ResultsError, load_results, results_dir

REPO = Path(__file__).resolve().parent.parent.parent
DEFAULT_TESTS = "suites/conformance"
RUN_ENV = "L4LAB_CONFORM_RUN"
TEARDOWN_GRACE_S = 300.0  # an interrupted run removes its labs and VMs (a VM's shutdown under TCG) within this


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="l4lab conform", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--dut", action="append", choices=tuple(DUTS),
                    help="a device under test (repeat for several; default l4lab)")
    ap.add_argument("--tests", default=DEFAULT_TESTS, help=f"pytest path of the checks (default {DEFAULT_TESTS})")
    ap.add_argument("-k", dest="keyword", help="only the checks pytest -k selects")
    ap.add_argument("--ipvs-control", choices=("keepalived", "ipvsadm"), help="what drives IPVS (default keepalived)")
    ap.add_argument("--ipvs-scheduler", help="IPVS scheduler and flags (default mh:mh-port,mh-fallback)")
    ap.add_argument("--results", help="results directory (default $L4LAB_RESULTS or results/)")
    ap.add_argument("--out", help="where to write the HTML report (default reports/out/index.html)")
    ap.add_argument("--no-report", action="store_true", help="no HTML report (the JSON reports are written)")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"),
                    help="the cells that changed between two runs (run directories, results/conform/<run>)")
    return ap


def _pytest(args: argparse.Namespace, dut: str, run_dir: Path, run: str) -> int:
    cmd = [sys.executable, "-m", "pytest", str(REPO / args.tests), "--dut", dut, "--conform", "-q", "-rsx",
           "-p", "no:cacheprovider"]
    for option in ("ipvs_control", "ipvs_scheduler"):
        if getattr(args, option):
            cmd += [f"--{option.replace('_', '-')}", getattr(args, option)]
    if args.keyword:
        cmd += ["-k", args.keyword]
    print(f"conform: {dut}: running {args.tests}", flush=True)
    env = os.environ | {"L4LAB_RESULTS": str(run_dir), RUN_ENV: run}
    return run_forwarding(cmd, grace_s=TEARDOWN_GRACE_S, cwd=REPO, env=env)


def _load(run_dir: Path, run: str | None = None) -> Matrix:
    results = load_results(run_dir) if any(run_dir.glob("*.json")) else []
    return Matrix.of(results, run)


def _json_reports(matrix: Matrix, out_dir: Path) -> list[Path]:
    """reports/out/conformance/<dut>.json: the DUT's build, deviations, counts and every check."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for dut in matrix.duts:
        spec = dut_class(dut).spec()
        report = matrix.report(dut) | {
            "product": spec.product,
            "deviations": [{"what": d.what, "why": d.why} for d in spec.deviations],
            "data_file": spec.where(1).rsplit(":", 1)[0],
        }
        path = out_dir / f"{dut}.json"
        path.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
        written.append(path)
    return written


def _run_errors(matrix: Matrix, dut: str, code: int) -> str:
    """Why a DUT's run failed beyond its cells ("" when it did not): a pytest session that did not
    complete, or one that failed with no failing check to show for it (BPF pins left behind)."""
    s = matrix.summary(dut)
    if not matrix.rows or dut not in matrix.duts:
        return f"its run wrote no result (pytest exit {code}); see its output above"
    if code not in (0, 1) or (code == 1 and not s.errors and not (dut == "l4lab" and s.findings)):
        return f"pytest exited {code} without a failing check: see its output above (BPF pins left behind?)"
    return ""


def _problems(matrix: Matrix, duts: Sequence[str], run_errors: dict[str, str]) -> list[str]:
    """Why the run must exit 1: errors, l4lab findings, n/a without reference, runs that did not finish."""
    out = [f"{dut}: {why}" for dut, why in run_errors.items() if why]
    for dut in duts:
        s = matrix.summary(dut)
        if s.errors:
            out.append(f"{dut}: {s.errors} errors (ours, not the DUT's: a command, a tool or the lab failed)")
        if dut == "l4lab" and s.findings:
            out.append(f"l4lab: {s.findings} findings (l4lab contradicts its own checks)")
    out += [f"{cell}: n/a without a reference" for cell in matrix.unreferenced()]
    return out


def _compare(old: str, new: str) -> int:
    try:
        before, after = _load(Path(old)), _load(Path(new))
    except ResultsError as exc:
        raise UsageError(f"l4lab conform --compare: {exc}") from exc
    if not before.rows or not after.rows:
        raise UsageError(f"l4lab conform --compare: {old if not before.rows else new} holds no conform run's results")
    changed = changes(before, after)
    print(f"conform: {len(changed)} cells changed from run {before.run} to run {after.run}")
    for line in changed:
        print(f"  {line}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.compare:
        return _compare(*args.compare)
    duts = args.dut or ["l4lab"]
    tests = REPO / args.tests
    if not tests.exists():
        raise UsageError(f"cannot find the conformance tests {tests}: l4lab conform runs from a checkout "
                         "of the project (its suites/ folder)")
    main_dir = results_dir(args.results)
    run = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir = main_dir / "conform" / run
    run_dir.mkdir(parents=True, exist_ok=True)
    codes = {dut: _pytest(args, dut, run_dir, run) for dut in duts}
    matrix = _load(run_dir, run)
    print()
    print(matrix.text() if matrix.rows else "no conformance results were written")
    for path in run_dir.glob("*.json"):
        shutil.copy2(path, main_dir / path.name)
    out = Path(args.out) if args.out else REPO / "reports" / "out" / "index.html"
    for path in _json_reports(matrix, out.parent / "conformance"):
        print(f"wrote {path}")
    if not args.no_report:
        from reports import render  # jinja2, the report extra: only when a report is written

        render.main(["--results", str(main_dir), "--out", str(out)])
    run_errors = {dut: _run_errors(matrix, dut, codes[dut]) for dut in duts}
    problems = _problems(matrix, duts, run_errors)
    print(f"\nresults: {run_dir}")
    for problem in problems:
        print(f"conform: {problem}", file=sys.stderr)
    sys.stderr.flush()
    for dut in duts:  # last, one line per DUT; a run that failed beyond its cells is one error more
        s = matrix.summary(dut)
        print(dataclasses.replace(s, errors=s.errors + bool(run_errors[dut])).line(dut))
    return 1 if problems else 0
