"""The daemon's log lines: one JSON object each with ts, level and event; syslog priorities for journald."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from balancer.logs import PRIORITY, Logger, is_journal


def _dev_ino(path: Path) -> str:
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}"


def test_every_line_carries_its_level(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with path.open("w") as stream:
        log = Logger(stream, journal=False)
        log.debug("probe", real="192.0.2.2")
        log.info("applied", writes=3)
        log.warning("real_down", real="192.0.2.2")
        log.error("reload_failed", error="bad key")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["level"], r["event"]) for r in records] == [
        ("debug", "probe"), ("info", "applied"), ("warning", "real_down"), ("error", "reload_failed")]
    assert all(list(r)[:3] == ["ts", "level", "event"] for r in records)


def test_an_unknown_level_or_a_standard_key_as_field_is_refused(tmp_path: Path) -> None:
    with (tmp_path / "log").open("w") as stream:
        log = Logger(stream, journal=False)
        with pytest.raises(ValueError, match="log level 'notice' of event 'x' is not one of debug, info"):
            log.log("notice", "x")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="log field 'ts' of event 'x' would overwrite a standard key"):
            log.info("x", ts="mine")
    assert (tmp_path / "log").read_text() == ""


def test_on_the_journal_stream_lines_start_with_the_syslog_priority(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    journal, other = tmp_path / "journal", tmp_path / "other"
    journal.touch()
    other.touch()
    monkeypatch.setenv("JOURNAL_STREAM", _dev_ino(journal))
    with journal.open("a") as j, other.open("a") as o:
        assert is_journal(j) and not is_journal(o)
        for stream in (j, o):
            log = Logger(stream)
            log.warning("real_down", real="192.0.2.2")
            log.info("applied")
    lines = journal.read_text().splitlines()
    assert [line[:3] for line in lines] == [f"<{PRIORITY['warning']}>", f"<{PRIORITY['info']}>"] == ["<4>", "<6>"]
    assert json.loads(lines[0][3:])["level"] == "warning"
    assert [json.loads(line)["level"] for line in other.read_text().splitlines()] == ["warning", "info"]
    with journal.open() as j:
        assert not is_journal(j, "not-a-dev-ino")
