"""Fixtures of the report tests: a synthetic results directory and the report rendered from it."""

from __future__ import annotations

from collections.abc import Iterator
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


@pytest.fixture(scope="session")
def sample_report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The HTML report rendered from the complete synthetic sample (what ``sample_results`` holds).

    Name: sample_report
    Scope: session (rendered once: the tests only read the page; one that changed it would fail the
           session's teardown rather than show the others another page)
    Depends: tmp_path_factory

        def test_x(sample_report):
            html = sample_report.read_text()
            assert "<section" in html
    """
    base = tmp_path_factory.mktemp("sample-report")
    write_sample(base / "results")
    page = render(base / "results", base / "out" / "index.html")
    rendered = page.read_bytes()
    yield page
    assert page.read_bytes() == rendered, f"a test changed the shared sample report {page}"
