"""lab.procs: walk() sees a child with the argv, parent and namespace it has, its zombie only when asked
for, and nothing once it is reaped; an entry that vanishes or has a cut-short stat is skipped."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from lab import procs
from lab.harness import poll


def _seen(pid: int, **walk: bool) -> procs.Process | None:
    return next((p for p in procs.walk(**walk) if p.pid == pid), None)


def test_a_child_is_seen_live_then_as_a_zombie_then_not_at_all() -> None:
    name = f"procs-test-{secrets.token_hex(3)}"  # argv[0] of a sleep, so no other process has it
    child = subprocess.Popen([name, "30"], executable=shutil.which("sleep"))
    try:
        live = _seen(child.pid, netns=True)
        assert live is not None and live.argv == (name.encode(), b"30"), live
        assert live.ppid == os.getpid() and live.state in ("R", "S"), live
        assert live.netns == os.stat("/proc/self/ns/net").st_ino, live
        assert _seen(child.pid) == procs.Process(child.pid, os.getpid(), live.state, live.argv, None)

        child.kill()  # not reaped: Popen reaps only in wait()/poll(), which come below
        zombie = poll(5.0, lambda: _seen(child.pid, netns=True, zombies=True), "the killed child as a zombie",
                      until=lambda p: p is not None and p.state == "Z")
        assert zombie == procs.Process(child.pid, os.getpid(), "Z", (), None)
        assert _seen(child.pid) is None, "a zombie is not a live process"

        child.wait()
        assert _seen(child.pid, zombies=True) is None
    finally:
        child.kill()
        child.wait()


def test_entries_that_vanish_or_are_cut_short_are_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entries = {
        "100": (b"/bin/x\0-a\0", "100 (x) y) S 7 100 100 0"),  # a ')' in the command name
        "101": (None, None),  # gone between the listing and the read
        "102": (b"/bin/x\0", "102 (x"),  # stat cut short
        "103": (b"", "103 (kworker/0:1) I 2 0 0 0"),  # a kernel thread: no command line
        "self": (b"/bin/x\0", "104 (x) S 1"),
    }
    for pid, (cmdline, stat) in entries.items():
        (tmp_path / pid).mkdir()
        if cmdline is not None and stat is not None:
            (tmp_path / pid / "cmdline").write_bytes(cmdline)
            (tmp_path / pid / "stat").write_text(stat)
    monkeypatch.setattr(procs, "PROC", tmp_path)
    assert sorted(procs.walk(), key=lambda p: p.pid) == [
        procs.Process(100, 7, "S", (b"/bin/x", b"-a")),
        procs.Process(103, 2, "I", ()),
    ]
