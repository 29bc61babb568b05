"""corpus.py: where Katran's fixture corpus is — shared/conformance/katran beside the repository.

CI and developers have `shared/` next to the clone; L4LAB_KATRAN_CORPUS overrides the path.
A test that needs a corpus file asks `corpus_file`: without the file it skips, saying where it
looked, except under CI (the `CI` environment variable set), where a missing corpus fails: a CI
run must never report the corpus comparison as done when it was not.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KATRAN_CORPUS = Path(os.environ.get("L4LAB_KATRAN_CORPUS", REPO.parent / "shared" / "conformance" / "katran"))


def corpus_file(name: str) -> Path:
    """The corpus file `name`; skips the test when it is missing, fails instead when CI is set."""
    path = KATRAN_CORPUS / name
    if not path.exists():
        why = f"the Katran corpus file {path} is missing (set L4LAB_KATRAN_CORPUS to its directory)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI is set, so this fails instead of skipping")
        pytest.skip(why)
    return path
