"""The HTML report: results files in, one self-contained page out (inline SVG charts, no external resource).

    l4lab report [--results DIR] [--out FILE]          # the lead's CLI calls main(argv)
    l4lab report --compare A B [--out FILE]             # two runs side by side with the change
    python -m reports.render --results DIR --out FILE

The page reads only results files (reports.schema); each kind's section is built by its module
(reports/bench.py, rss.py, ...) from the blocks in reports/page.py, and this module lays out the
page. It opens with the encapsulation modes at a glance (the newest demo run), then one section per
kind that has results, then the runs (latest per machine and generator) and a trend per figure over
commits; the kinds without results are left out
and listed last, each with the command that measures it (FILLED_BY). Charts are inline SVG
drawn by matplotlib (reports/charts.py) whose every mark has a <title> (hover value), readable without
JavaScript; every chart and table links its data as CSV and JSON (data: URLs). The Jinja2 template only lays them out.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import jinja2

from reports import bench, churn, conformance, corpus, demo, failover, fuzz, history, pmtu, rss, side_by_side
from reports.page import Cell, Section, Table, distinct, short_commit
from reports.payload import of_kind
from reports.schema import Result, ResultsError, load_results, parse_result, results_dir

__all__ = ["DEFAULT_OUT", "NO_RESULTS", "compare_html", "main", "render", "render_html"]

DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "index.html"
NO_RESULTS = "no results of this kind"
# The command that fills each section, for the list of sections a report leaves out.
FILLED_BY = {
    "summary": "make demo", "demo": "make demo", "bench": "make bench", "versus": "l4lab bench --katran",
    "rss": "make demo", "pmtu": "make demo", "churn": "l4lab conform", "failover": "l4lab conform",
    "conformance": "l4lab conform", "duts": "l4lab conform --dut ipvs", "corpus": "make test", "fuzz": "make soak",
    "history": "make demo",
}
_TEMPLATES = Path(__file__).resolve().parent / "templates"


def _select(results: list[Result], spec: str) -> list[Result]:
    """The results of one run named by ``spec``: a commit (prefix of at least 4 hex digits), a results
    file, or a results directory."""
    path = Path(spec)
    if path.is_dir():
        return load_results(path)
    if path.is_file():
        return [parse_result(json.loads(path.read_text(encoding="utf-8")), path)]
    if re.fullmatch(r"[0-9a-f]{4,40}", spec):
        chosen = [r for r in results if r.commit.startswith(spec)]
        if chosen:
            return chosen
        raise ResultsError("<compare>", spec, "no result has a commit starting with it; see the runs in the report")
    raise ResultsError("<compare>", spec, "is neither a commit (4+ hex digits), a results file nor a directory")


def compare_html(results: list[Result], a: str, b: str, now: datetime | None = None) -> str:
    """A page with runs ``a`` and ``b`` side by side: every figure either has, and the change."""
    left, right = _select(results, a), _select(results, b)

    def latest(chosen: list[Result]) -> dict[str, float | str]:
        out: dict[str, tuple[datetime, float | str]] = {}
        for r in chosen:
            for name, value in history.figures(r).items():
                key = f"{name} — {r.machine.hostname}"
                if key not in out or r.time >= out[key][0]:
                    out[key] = (r.time, value)
        return {k: v for k, (_, v) in out.items()}

    fa, fb = latest(left), latest(right)
    rows = []
    for name in sorted(set(fa) | set(fb)):
        va, vb = fa.get(name), fb.get(name)
        if isinstance(va, float | int) and isinstance(vb, float | int):
            change = "same" if va == vb else f"{(vb - va) / va * 100:+.1f} %" if va else "from 0"
            css = "num" if va == vb else "num changed"
        else:
            change = "same" if va == vb else "differs" if va is not None and vb is not None else "only in one"
            css = "" if va == vb else "changed"
        rows.append([Cell(name, "key"), Cell("–" if va is None else f"{va:.4g}" if isinstance(va, float) else str(va)),
                     Cell("–" if vb is None else f"{vb:.4g}" if isinstance(vb, float) else str(vb)), Cell(change, css)])
    section = Section("compare", f"Compare {a} with {b}",
                      f"A: {len(left)} results ({_describe_runs(left)}). B: {len(right)} results "
                      f"({_describe_runs(right)}). Each figure is the newest of its side; change is B against A.")
    section.tables.append(Table(f"Figures of {a} (A) and {b} (B)", ["figure — machine", "A", "B", "change"], rows))
    section.empty = not rows
    return _page([section], left + right, source=f"{a} vs {b}", now=now, title="l4lab comparison")


def _describe_runs(chosen: list[Result]) -> str:
    commits = distinct([short_commit(r.commit) for r in chosen])
    return "commits " + ", ".join(commits[:3]) + (" …" if len(commits) > 3 else "") if commits else "none"


def _nics(results: list[Result]) -> list[str]:
    out = []
    for r, p in of_kind(results, bench.BenchPayload):
        if p.nic is not None:
            speed = f", {p.nic.speed_mbps / 1000:g} Gb/s" if p.nic.speed_mbps else ""
            out.append(f"{p.nic.model}, driver {p.nic.driver}{speed} ({r.machine.hostname}, {p.generator})")
    return distinct(out)


def _page(sections: list[Section], results: list[Result], source: str, now: datetime | None, title: str) -> str:
    times = sorted(r.time for r in results)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    template = env.get_template("report.html.j2")
    return template.render(
        title=title,
        sections=sections,
        machines=distinct(
            [f"{r.machine.hostname} (kernel {r.machine.kernel}, {r.machine.cpus} CPUs)" for r in results]
        ),
        commits=distinct([r.commit for r in results]),
        generators=distinct([p.generator for _, p in of_kind(results, bench.BenchPayload)]),
        nics=_nics(results),
        first=times[0].astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if times else "",
        last=times[-1].astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if times else "",
        generated=(now or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC"),
        count=len(results),
        synthetic=sum(1 for r in results if r.synthetic),
        source=source,
        no_results=NO_RESULTS,
    )


def render_html(results: list[Result], source: str = "", now: datetime | None = None) -> str:
    """The report page for ``results`` (possibly none) as one HTML string."""
    matrix = conformance.duts_section(results)
    sections = [
        *([matrix] if not matrix.empty else []),
        demo.summary_section(results),
        demo.section(results),
        bench.section(results),
        *([versus] if not (versus := side_by_side.section(results)).empty else []),
        rss.section(results),
        pmtu.section(results),
        churn.section(results),
        failover.section(results),
        conformance.section(results),
        corpus.section(results),
        fuzz.section(results),
        history.section(results),
    ]
    return _page(_left_out(sections), results, source, now, "l4lab report")


def _left_out(sections: list[Section]) -> list[Section]:
    """The sections with data, then one listing those without and the command that fills each."""
    empty = [s for s in sections if s.empty]
    if not empty:
        return sections
    rows = [[Cell(s.title), Cell(FILLED_BY.get(s.id, "make test"))] for s in empty]
    missing = Section("missing", "Not in this report",
                      "Kinds of results these results files hold none of, and the command that measures each.",
                      tables=[Table("sections left out", ["section", "measured by"], rows)])
    return [s for s in sections if not s.empty] + [missing]


def _write(target: Path, page: str) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(target)
    return target


def render(results_directory: str | Path | None = None, out: str | Path | None = None) -> Path:
    """Render the results in ``results_directory`` into ``out``; returns the path written.

    Raises ResultsError for a missing directory or an invalid results file.
    """
    source = results_dir(results_directory)
    results = load_results(source)
    return _write(Path(out) if out is not None else DEFAULT_OUT, render_html(results, source=str(source)))


def main(argv: Sequence[str] | None = None) -> int:
    """``l4lab report``: 0 on success, 2 for bad results or arguments, 1 if the page cannot be written."""
    parser = argparse.ArgumentParser(
        prog="l4lab report", description="Render the results into one HTML page."
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="results directory (default: $L4LAB_RESULTS or results/ at the repository top)",
    )
    parser.add_argument("--out", type=Path, default=None, help=f"HTML file to write (default: {DEFAULT_OUT})")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"),
                        help="two runs side by side: each a commit (prefix), a results file or a results directory "
                             "(default out: compare.html beside the report)")
    args = parser.parse_args(argv)
    try:
        if args.compare:
            results = load_results(args.results)
            page = compare_html(results, *args.compare)
            path = _write(args.out or DEFAULT_OUT.with_name("compare.html"), page)
        else:
            path = render(args.results, args.out)
    except ResultsError as e:
        print(f"l4lab report: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"l4lab report: cannot write the report to {e.filename}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
