"""corpus.py: the Katran's fixture corpus replayed result and its section."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reports.page import Cell, Section, Table, kind_section
from reports.payload import at_least, of_kind, rule

if TYPE_CHECKING:
    from reports.schema import Result


@dataclass(frozen=True)
class CorpusPayload:
    """Katran's fixture corpus replayed through our programs: what each case proved.

    Since issue 30 in five counts (byte_exact: transforms only; verdict_exact; same_real; deviations;
    not_applicable); files before it have verdict_and_real instead of the middle two, and byte_exact
    counted unchanged frames too."""

    cases: int = field(metadata=rule(at_least(1)))
    byte_exact: int = field(metadata=rule(at_least(0)))  # our transformed output is Katran's, byte for byte
    deviations: int = field(metadata=rule(at_least(0)))  # deliberately otherwise, pinned verdict and reason
    not_applicable: int = field(metadata=rule(at_least(0)))  # something l4lab does not do, and why
    verdict_and_real: int = field(default=0, metadata=rule(at_least(0)))  # before issue 30 only
    katrans_real: int = field(default=0, metadata=rule(at_least(0)))  # of same_real: Katran's own real
    verdict_exact: int = field(default=0, metadata=rule(at_least(0)))  # Katran's verdict, frame untouched
    same_real: int = field(default=0, metadata=rule(at_least(0)))  # Katran's encapsulation, its real or a live one

    def problems(self) -> Iterator[tuple[str, str]]:
        total = (self.byte_exact + self.verdict_and_real + self.verdict_exact + self.same_real + self.deviations
                 + self.not_applicable)
        if total != self.cases:
            yield "cases", f"must equal the counts' sum ({total}) but got {self.cases}"
        if self.katrans_real > self.verdict_and_real + self.same_real:
            yield "katrans_real", (f"must be ≤ same_real ({self.same_real + self.verdict_and_real}) but got "
                                   f"{self.katrans_real}")


@kind_section(
    "corpus",
    "Katran's fixture corpus",
    "Katran's own datapath fixtures replayed through our programs: what each case proved. "
    "Not applicable cases exercise a feature l4lab does not implement and are not run.",
)
def section(section: Section, results: list[Result]) -> bool:
    found = of_kind(results, CorpusPayload)
    if not found:
        return False
    result, p = max(found, key=lambda rp: rp[0].time)
    section.tables.append(
        Table(
            f"What the {p.cases} cases proved ({result.id})",
            ["byte-exact transforms", "verdict-exact", "same real", "of which Katran's real",
             "deliberate deviations", "not applicable"],
            [[Cell(str(v), "num") for v in (p.byte_exact, p.verdict_exact, p.same_real + p.verdict_and_real,
                                             p.katrans_real, p.deviations, p.not_applicable)]],
        )
    )
    return True
