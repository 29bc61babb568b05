"""_record.py: a conformance result written for every run of a test body, pass or fail, with its duration.

    with recorded("test_encap_on_the_wire", "ip4-gue1", "flow"):
        ...assertions...

writes ``conformance.test_encap_on_the_wire+ip4-gue1-flow.json`` (reports/schema.py) whether the
body passes, fails or skips; the exception, if any, propagates unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import pytest

from reports.schema import ConformancePayload, Kind, case_id, write_result


@contextmanager
def recorded(test: str, encap: str, *more: str) -> Iterator[None]:
    """Time the body and write its conformance result (pass, or fail when it raises)."""
    t0 = time.monotonic()
    outcome: Literal["pass", "fail", "skip"] = "fail"
    try:
        yield
        outcome = "pass"
    except pytest.skip.Exception:
        outcome = "skip"
        raise
    finally:
        payload = ConformancePayload(test=test, encap=encap, outcome=outcome,  # type: ignore[arg-type]
                                     duration_s=round(time.monotonic() - t0, 3))
        write_result(Kind.CONFORMANCE, case_id(test, encap, *more), payload)
