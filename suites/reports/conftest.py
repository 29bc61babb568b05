"""Fixtures of the report tests: a synthetic results directory and the report rendered from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from reports.render import render
from reports.sample import write_sample


@pytest.fixture
def sample_results(tmp_path: Path) -> Path:
    """A directory holding the complete synthetic sample (every kind).

    Name: sample_results
    Scope: function (a fresh tmp directory, removed by pytest's tmp_path retention)
    Depends: tmp_path

        def test_x(sample_results):
            results = load_results(sample_results)
            assert results
    """
    directory = tmp_path / "results"
    write_sample(directory)
    return directory


@pytest.fixture
def sample_report(sample_results: Path, tmp_path: Path) -> Path:
    """The HTML report rendered from ``sample_results`` into the test's tmp directory.

    Name: sample_report
    Scope: function
    Depends: sample_results, tmp_path

        def test_x(sample_report):
            html = sample_report.read_text()
            assert "<section" in html
    """
    return render(sample_results, tmp_path / "out" / "index.html")
