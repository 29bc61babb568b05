"""logs.py: structured logs, one JSON object per line on stderr (ts, level, event, then the fields).

    {"ts": "2026-12-02T13:20:01.123Z", "level": "info", "event": "real_down",
     "vip": "198.51.100.100:80/tcp", "real": "203.0.113.18", "detail": "connection refused"}

Lines are written whole under a lock, so threads (probes, the metrics server) never interleave.
Field values that JSON cannot hold are written as their ``str()``.
"""

from __future__ import annotations

import json
import sys
import threading
from datetime import UTC, datetime
from typing import Literal, TextIO

Level = Literal["debug", "info", "warning", "error"]

__all__ = ["Level", "Logger"]


class Logger:
    """Writes one JSON object per event to a text stream (stderr unless told otherwise)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def log(self, level: Level, event: str, **fields: object) -> None:
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
