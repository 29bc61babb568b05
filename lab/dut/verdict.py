"""verdict.py: the four verdicts of a conformance check, and which one a test's outcome is.

    pass            the check held
    finding         the DUT's behaviour contradicts the check: an AssertionError raised by the check's
                    own code (its module's directory), with the DUT's evidence
    not-applicable  the DUT lacks an optional feature the check needs, citing its reference
    error           anything else: a lab or adapter command that failed, a timeout of our own tool, a
                    fixture (the lab, the DUT's build or boot) that failed, a check that could not run

A `poll()` that times out raises an AssertionError from lab/poll.py on behalf of its caller, so
that frame is skipped: the caller's place decides. An AssertionError raised in the harness (lab/)
is an error: only the check may judge the DUT.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

Verdict = Literal["pass", "finding", "not-applicable", "error"]
VERDICTS: tuple[Verdict, ...] = ("pass", "finding", "not-applicable", "error")
NOT_APPLICABLE = "not applicable: "
POLL = Path(__file__).resolve().parents[1] / "poll.py"


def failure_verdict(exception: BaseException, frames: Iterable[Path], check_dir: Path) -> Verdict:
    """The verdict of a check that raised `exception`, given the files of its traceback's frames
    (outermost first) and the directory of the check's own code."""
    if not isinstance(exception, AssertionError):
        return "error"
    own = [f for f in frames if f.resolve() != POLL]
    if own and own[-1].resolve().is_relative_to(check_dir.resolve()):
        return "finding"
    return "error"


def skip_verdict(reason: str) -> Verdict:
    """A check skipped because the DUT lacks what it needs is not applicable; any other skip means
    the check could not run (a missing tool): an error, never a pass."""
    return "not-applicable" if reason.startswith(NOT_APPLICABLE) else "error"


def combine(*verdicts: Verdict | None) -> Verdict:
    """The verdict of a whole test from its phases (setup, call, teardown): the first phase that
    did not pass decides, and a teardown that failed after the call turns its verdict into an error."""
    seen = [v for v in verdicts if v is not None]
    if not seen:
        return "error"
    decided: Verdict = next((v for v in seen if v != "pass"), "pass")
    if len(seen) == 3 and seen[2] == "error" and decided != "error":
        return "error"
    return decided
