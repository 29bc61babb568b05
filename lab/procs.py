"""procs.py: the processes on this machine, one snapshot each, read from /proc by one walker.

The lab and its tests find their processes by command line (a lab's qemus, FRR daemons of a run
directory, node services inside a namespace); a process that ends while it is read is skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Process:
    """One process as /proc showed it. argv is the command line split on NUL (empty for kernel threads
    and zombies); state the letter of /proc/PID/stat (Z: exited, not yet reaped); netns the inode of
    its network namespace, None unless walk() was asked for it (and for a zombie, which has none)."""

    pid: int
    ppid: int
    state: str
    argv: tuple[bytes, ...]
    netns: int | None = None


def walk(*, netns: bool = False, zombies: bool = False) -> Iterator[Process]:
    """Every live process, and with zombies=True also those that have exited but are not reaped yet.
    netns=True also reads each one's network namespace (one more stat per process)::

        qemus = [p.pid for p in procs.walk() if p.argv and p.argv[0].endswith(b"qemu-system-x86_64")]
    """
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = entry.joinpath("cmdline").read_bytes().split(b"\0")
            if argv[-1] == b"":  # the NUL that ends the last argument
                argv.pop()
            # Read after the command line, so one that exited meanwhile shows as the zombie it now is.
            state, ppid = entry.joinpath("stat").read_text().rpartition(")")[2].split()[:2]
            inode = os.stat(entry / "ns" / "net").st_ino if netns and state != "Z" else None
            process = Process(int(entry.name), int(ppid), state, tuple(argv), inode)
        except (OSError, ValueError):  # gone meanwhile (ESRCH, ENOENT) or its stat cut short
            continue
        if zombies or state != "Z":
            yield process
