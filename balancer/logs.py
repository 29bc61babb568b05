"""logs.py: structured logs, one JSON object per line on stderr (ts, level, event, then the fields).

    {"ts": "2026-12-02T13:20:01.123Z", "level": "info", "event": "real_down",
     "vip": "198.51.100.100:80/tcp", "real": "203.0.113.18", "detail": "connection refused"}

Lines are written whole under a lock, so threads (probes, the metrics server) never interleave.
Field values that JSON cannot hold are written as their ``str()``.

When the stream is the journal (systemd's JOURNAL_STREAM names its device and inode), each line
starts with the syslog priority of its level (``<3>`` error, ``<4>`` warning, ``<6>`` info, ``<7>``
debug), which journald strips and records, so ``journalctl -u lbctl -p warning`` filters by level
and ``journalctl -u lbctl -o cat`` still shows the bare JSON.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from datetime import UTC, datetime
from typing import Literal, TextIO

Level = Literal["debug", "info", "warning", "error"]
PRIORITY: dict[str, int] = {"debug": 7, "info": 6, "warning": 4, "error": 3}  # syslog(3) levels

__all__ = ["PRIORITY", "Level", "Logger", "is_journal"]


def is_journal(stream: TextIO, journal_stream: str | None = None) -> bool:
    """Whether `stream` is the journald stream systemd connected (JOURNAL_STREAM is "DEV:INODE")."""
    value = os.environ.get("JOURNAL_STREAM", "") if journal_stream is None else journal_stream
    try:
        dev, ino = (int(part) for part in value.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):  # unset, malformed, or a stream without a descriptor
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


class Logger:
    """Writes one JSON object per event to a text stream (stderr unless told otherwise)."""

    def __init__(self, stream: TextIO | None = None, journal: bool | None = None) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._journal = journal if journal is not None else is_journal(stream if stream is not None else sys.stderr)

    def log(self, level: Level, event: str, **fields: object) -> None:
        if level not in PRIORITY:
            raise ValueError(f"log level '{level}' of event '{event}' is not one of {', '.join(PRIORITY)}")
        now = datetime.now(UTC)
        record: dict[str, object] = {
            "ts": now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z",
            "level": level,
            "event": event,
        }
        for key, value in fields.items():
            if key in record:
                raise ValueError(f"log field '{key}' of event '{event}' would overwrite a standard key; "
                                 "rename the field")
            record[key] = value
        line = json.dumps(record, default=str, separators=(",", ":"))
        if self._journal:
            line = f"<{PRIORITY[level]}>{line}"
        stream = self._stream if self._stream is not None else sys.stderr
        with self._lock:
            stream.write(line + "\n")
            stream.flush()

    def debug(self, event: str, **fields: object) -> None:
        self.log("debug", event, **fields)

    def info(self, event: str, **fields: object) -> None:
        self.log("info", event, **fields)

    def warning(self, event: str, **fields: object) -> None:
        self.log("warning", event, **fields)

    def error(self, event: str, **fields: object) -> None:
        self.log("error", event, **fields)
