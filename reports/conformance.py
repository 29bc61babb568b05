"""conformance.py: the DUT matrix of one `l4lab conform` run: cells, per-DUT counts, text, JSON, changes, HTML.

    matrix = Matrix.of(load_results(run_dir))
    print(matrix.text())
    for dut in matrix.duts:
        print(matrix.summary(dut).line(dut))  # conform: ipvs pass 30 applicable 34 findings 4 errors 0 na 6

Rows are the checks (the tests that grade a DUT) × encap; columns the DUTs. Every cell is one of
four verdicts (lab/dut/verdict.py): pass, finding, n/a (with the reference from the DUT's data
file) or error; a row with no result for a DUT is an error of that DUT ("not run"). Only the results
of one run count: the newest run's (`run` of each result), never an older run's rows. A column
reads `pass P / applicable A (findings F, errors E, n/a N)`, where the applicable cells are all but
the n/a ones. Results written before the four verdicts read `fail` as finding and `skip` as error.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reports.schema import ConformancePayload, Result, of_kind

if TYPE_CHECKING:
    from reports.render import Section

VERDICTS = ("pass", "finding", "not-applicable", "error")
_OLD = {"fail": "finding", "skip": "error"}
ENCAP_PREFIX = "encap:"


@dataclass(frozen=True)
class Cell:
    """One check × encap × DUT verdict, with what stands behind it."""

    verdict: str
    detail: str = ""
    reference: str = ""
    build: str = ""
    figures: tuple[tuple[str, float, str], ...] = ()
    duration_s: float = 0.0

    @property
    def capability(self) -> str:
        """The capability an n/a cell names ("" otherwise)."""
        if self.verdict != "not-applicable":
            return ""
        return self.detail.removeprefix("not applicable: ").split()[0] if self.detail else ""

    @property
    def where(self) -> str:
        """The data file line an n/a cell links to (`lab/dut/ipvs.toml:29`), from its reference."""
        return self.reference.split(": ", 1)[0] if self.reference else ""

    @property
    def label(self) -> str:
        if self.verdict == "not-applicable":
            return f"n/a {self.where or '(no reference)'}"
        return self.verdict

    @property
    def headline(self) -> str:
        """The first line of the evidence: pytest's `E` line, else the detail's first line."""
        lines = self.detail.strip().splitlines()
        first = next((ln[1:].strip() for ln in lines if ln.startswith("E ")), lines[0] if lines else "")
        return first[:200]


NOT_RUN = Cell("error", "not run: the DUT's run wrote no result for this check")


@dataclass(frozen=True)
class Summary:
    """A DUT's column, counted."""

    passed: int
    findings: int
    errors: int
    na: int

    @property
    def applicable(self) -> int:
        return self.passed + self.findings + self.errors

    def line(self, dut: str) -> str:
        return (f"conform: {dut} pass {self.passed} applicable {self.applicable} findings {self.findings} "
                f"errors {self.errors} na {self.na}")

    @property
    def column(self) -> str:
        return (f"pass {self.passed} / applicable {self.applicable} (findings {self.findings}, "
                f"errors {self.errors}, n/a {self.na})")


@dataclass
class Matrix:
    """The checks of one conform run against its DUTs."""

    run: str
    duts: list[str]
    rows: dict[tuple[str, str], dict[str, Cell]] = field(default_factory=dict)
    builds: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, results: Iterable[Result], run: str | None = None) -> Matrix:
        """The matrix of run `run` (default: the newest run among the results)."""
        found = [(r, p) for r, p in of_kind(list(results), ConformancePayload) if p.run]
        if run is None:
            run = max((p.run for _, p in found), default="")
        chosen = sorted(((r, p) for r, p in found if p.run == run), key=lambda rp: rp[0].time)
        duts = sorted({p.dut for _, p in chosen}, key=lambda d: (d != "l4lab", d))
        matrix = cls(run=run, duts=duts)
        for _, p in chosen:
            matrix.rows.setdefault((p.test, p.encap or "-"), {})[p.dut] = cell_of(p)
            if p.build and p.build not in matrix.builds.setdefault(p.dut, []):
                matrix.builds[p.dut].append(p.build)
        matrix.rows = dict(sorted(matrix.rows.items()))
        return matrix

    def cell(self, row: tuple[str, str], dut: str) -> Cell:
        return self.rows[row].get(dut, NOT_RUN)

    def cells(self, dut: str) -> list[tuple[tuple[str, str], Cell]]:
        return [(row, self.cell(row, dut)) for row in self.rows]

    def summary(self, dut: str) -> Summary:
        verdicts = [c.verdict for _, c in self.cells(dut)]
        return Summary(verdicts.count("pass"), verdicts.count("finding"), verdicts.count("error"),
                       verdicts.count("not-applicable"))

    def na_share(self, dut: str) -> tuple[int, int]:
        """(n/a cells, cells) of a column, leaving aside the encaps the DUT does not have at all."""
        lacking = {c.capability for _, c in self.cells(dut) if c.capability.startswith(ENCAP_PREFIX)}
        kept = [c for (_, encap), c in self.cells(dut) if f"{ENCAP_PREFIX}{encap}" not in lacking]
        return sum(1 for c in kept if c.verdict == "not-applicable"), len(kept)

    def unreferenced(self) -> list[str]:
        """n/a cells that cite no reference (a DUT's data file must give one)."""
        return [f"{dut} {test}[{encap}]" for (test, encap), cells in self.rows.items()
                for dut, c in cells.items() if c.verdict == "not-applicable" and not c.reference]

    def text(self) -> str:
        """The matrix as a text table, a count per column, then every finding and error's first line."""
        width = max([len(t) for t, _ in self.rows] + [5])
        cols = {d: max([len(c.label) for _, c in self.cells(d)] + [len(d)]) for d in self.duts}
        head = f"{'check':<{width}}  {'encap':<11}" + "".join(f"  {d:<{cols[d]}}" for d in self.duts)
        lines = [head, "-" * len(head)]
        notes: list[str] = []
        for (test, encap), _cells in self.rows.items():
            row = f"{test:<{width}}  {encap:<11}"
            for dut in self.duts:
                cell = self.cell((test, encap), dut)
                row += f"  {cell.label:<{cols[dut]}}"
                if cell.verdict in ("finding", "error"):
                    notes.append(f"  {cell.verdict} {dut} {test}[{encap}]: {cell.headline}")
            lines.append(row.rstrip())
        lines += ["", "columns:"] + [f"  {d}: {self.summary(d).column}" for d in self.duts]
        if notes:
            lines += ["", "findings and errors (each result's detail holds the evidence):", *notes]
        return "\n".join(lines)

    def report(self, dut: str) -> dict[str, Any]:
        """A DUT's machine-readable report: its build, counts and every check with verdict, evidence, reference."""
        s = self.summary(dut)
        return {
            "dut": dut, "run": self.run, "build": self.builds.get(dut, []),
            "summary": {"pass": s.passed, "applicable": s.applicable, "findings": s.findings, "errors": s.errors,
                        "not_applicable": s.na},
            "checks": [{"check": test, "encap": None if encap == "-" else encap, "verdict": c.verdict,
                        "evidence": c.detail, "reference": c.reference, "build": c.build,
                        "duration_s": c.duration_s,
                        "figures": [{"name": n, "value": v, "unit": u} for n, v, u in c.figures]}
                       for (test, encap), c in self.cells(dut)],
        }


def cell_of(p: ConformancePayload) -> Cell:
    verdict = _OLD.get(p.outcome, p.outcome)
    return Cell(verdict, p.detail, p.reference, p.build, tuple((f.name, f.value, f.unit) for f in p.figures),
                p.duration_s)


def changes(old: Matrix, new: Matrix) -> list[str]:
    """Every cell whose verdict differs between two runs (a row or DUT only one run has included)."""
    out = []
    duts = list(dict.fromkeys(old.duts + new.duts))
    for row in sorted(set(old.rows) | set(new.rows)):
        for dut in duts:
            was = old.rows.get(row, {}).get(dut)
            now = new.rows.get(row, {}).get(dut)
            if (was.verdict if was else None) != (now.verdict if now else None):
                test, encap = row
                shown = [c.label if c else "absent" for c in (was, now)]
                out.append(f"{dut} {test}[{encap}]: {shown[0]} -> {shown[1]}")
    return out


_CSS = {"pass": "pass", "finding": "warn", "not-applicable": "skip", "error": "fail"}


def section(results: Sequence[Result]) -> Section:
    """The HTML section of the newest conform run's matrix (empty when no run has a foreign DUT)."""
    from reports.render import Cell as Html
    from reports.render import Section, Table

    matrix = Matrix.of(results)
    section = Section("duts", "Devices under test",
                      f"The same checks against each load balancer, from one `l4lab conform` run ({matrix.run}). "
                      "A finding is the DUT's behaviour contradicting the check, with its evidence; n/a cites "
                      "the line of the DUT's data file (lab/dut/<dut>.toml) that says where its own documentation "
                      "or source shows the absence; an error is ours. Hover a cell for its evidence.")
    if not any(d != "l4lab" for d in matrix.duts):
        section.empty = True
        return section
    rows = []
    for (test, encap), _ in matrix.rows.items():
        cells = [Html(test, "key"), Html(encap, "key")]
        for dut in matrix.duts:
            c = matrix.cell((test, encap), dut)
            hint = c.reference if c.verdict == "not-applicable" else c.detail[:1500]
            cells.append(Html(c.label, _CSS[c.verdict], hint))
        rows.append(cells)
    rows.append([Html("column", "key"), Html("", "key")] + [Html(matrix.summary(d).column, "key") for d in matrix.duts])
    section.tables.append(Table("Verdict per check, encap and DUT", ["check", "encap", *matrix.duts], rows))
    figure_rows = []
    names = sorted({(t, e, n, u) for (t, e), cells in matrix.rows.items() for c in cells.values()
                    for n, _, u in c.figures})
    for test, encap, name, unit in names:
        cells = [Html(test, "key"), Html(encap, "key"), Html(name + (f" ({unit})" if unit else ""), "key")]
        for dut in matrix.duts:
            value = next((v for n, v, _ in matrix.cell((test, encap), dut).figures if n == name), None)
            cells.append(Html("–" if value is None else f"{value:g}", "" if value is not None else "missing"))
        figure_rows.append(cells)
    if figure_rows:
        section.tables.append(Table("Figures each DUT's checks measured and asserted",
                                    ["check", "encap", "figure", *matrix.duts], figure_rows))
    section.notes += [f"{d}: {matrix.summary(d).column}; build: {'; '.join(matrix.builds.get(d, [])) or '?'}"
                      for d in matrix.duts]
    section.notes.append("Throughput is compared only between DUTs on the same substrate: l4lab and Katran "
                         "run in XDP on the lab's veth; IPVS runs in a TCG-emulated VM, so its speed is not "
                         "comparable and is not shown.")
    return section
